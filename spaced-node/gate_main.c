/*
 * gate_main.c — the gate's state and its loop (gate.h): the runtime records
 * in memory and on disk, the verification keys, the status document, and
 * the start of the gate with its two children, node-api and the executor.
 */
#include "log.h"
#include "executor.h"
#include "gate.h"
#include "net.h"
#include "pool.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spaced_error.h"
#include "keyring.h"
#include "nameidx.h"
#include "vcache.h"

void gate_streams_free(struct mgr *m);

void gate_log(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	spaced_vlog("sbx-manager", fmt, ap);
	va_end(ap);
}

void gate_quit(struct mgr *m, const char *why)
{
	if (!m->quit)
		gate_log("level=info event=stopping reason=\"%s\"", why);
	m->quit = true;
	uv_stop(m->loop);
}

/* ---- records in memory ---- */

/* recs are found by their sandbox's name through an index (nameidx.h):
 * every request's lookup is one probe or a few, not a walk of every record
 * the worker holds (live sandboxes and the tombstones of the last minutes). */

static const char *rec_name(const void *ctx, uint32_t pos)
{
	const struct mgr *m = ctx;
	return m->recs[pos].r.id.sandbox;
}

static struct mgr_rec *rec_find(struct mgr *m, const char *sandbox)
{
	int64_t pos = spaced_nameidx_get(&m->rec_index, sandbox);
	return pos >= 0 ? &m->recs[pos] : NULL;
}

const struct mgr_rec *mgr_rec_find(struct mgr *m, const char *sandbox)
{
	return rec_find(m, sandbox);
}

/* Takes the record of sandbox out: the last record takes its place (the
 * order of records means nothing). */
static void rec_remove(struct mgr *m, const char *sandbox)
{
	int64_t pos = spaced_nameidx_get(&m->rec_index, sandbox);
	if (pos < 0)
		return;
	spaced_nameidx_del(&m->rec_index, sandbox);
	size_t last = m->nrecs - 1;
	if ((size_t)pos != last) {
		spaced_nameidx_put(&m->rec_index, m->recs[last].r.id.sandbox, (uint32_t)pos);
		m->recs[pos] = m->recs[last];
	}
	m->nrecs = last;
}

/* A record that only refuses: destroyed, or stopped with no execution (its
 * sandbox moved away) while another worker serves it. An ended one is not
 * (its end reaches the control plane only while the link's channel is up,
 * and processes of its execution may be left): it stays until a new
 * generation or a destroy replaces it. */
static bool is_tombstone(const struct mgr_rec *rec)
{
	if (rec->r.active)
		return false;
	return strcmp(rec->state, MGR_ST_DESTROYED) == 0 ||
	       (strcmp(rec->state, MGR_ST_STOPPED) == 0 && rec->pid == 0 && rec->host_pid == 0);
}

/* Since when rec is a tombstone: kept from the record it replaces (prev,
 * NULL for none) when that was one of the same generation, now when it just
 * became one, 0 when it is none. */
static uint64_t tomb_since(const struct mgr_rec *rec, const struct mgr_rec *prev)
{
	bool same = prev && prev->tomb_mono && prev->r.id.generation == rec->r.id.generation;
	if (!is_tombstone(rec))
		return 0;
	return same ? prev->tomb_mono : spaced_mono_ns();
}

static int rec_put_mem(struct mgr *m, const struct mgr_rec *rec)
{
	struct mgr_rec *cur = rec_find(m, rec->r.id.sandbox);
	if (cur) {
		uint64_t since = tomb_since(rec, cur);
		*cur = *rec;
		cur->tomb_mono = since;
		return 0;
	}
	if (m->nrecs == m->caprecs) {
		size_t nc = m->caprecs ? m->caprecs * 2 : 16;
		struct mgr_rec *n = nc < UINT32_MAX / 4 ? realloc(m->recs, nc * sizeof *n) : NULL;
		if (!n)
			return SPACED_ENOMEM;
		m->recs = n;
		m->caprecs = nc;
	}
	if (spaced_nameidx_reserve(&m->rec_index, m->nrecs + 1, m->nrecs) < 0)
		return SPACED_ENOMEM;
	m->recs[m->nrecs] = *rec;
	m->recs[m->nrecs].tomb_mono = tomb_since(rec, NULL);
	spaced_nameidx_put(&m->rec_index, rec->r.id.sandbox, (uint32_t)m->nrecs);
	m->nrecs++;
	return 0;
}

/* A tombstone is kept while a capability issued before it became one may
 * still be valid (SPACED_CAP_LIFETIME + SPACED_CAP_SKEW): it refuses them
 * with REFRESH_ROUTE. Kept longer, it only costs: every sandbox a worker ever
 * hosted would stay in its memory (every lookup walks them) and on its disk,
 * and a tenant creating and deleting sandboxes in a loop — or moving them
 * away and deleting them elsewhere — would grow both without bound. So
 * --forget-after seconds after it became one (default: the capabilities'
 * lifetime and skew, and a minute), with no control operation of its own in
 * flight and no process of its execution left, it is forgotten: its row, its
 * gateway's record directory, its log, its place in memory. A capability that
 * names it later is refused as naming an unknown sandbox (R4 holds either
 * way); its ID is never issued again, and the highest generation it had stays
 * in the store (mgr_store_forget): an install of that generation or an older
 * one is refused as one that does not run here, never started again (I2).
 * The stored acknowledgements are pruned on the same tick: the last
 * --acks-kept are kept (the control plane re-sends what it has not seen
 * acknowledged, from its oldest such message: a repeat older than that is
 * answered ack-pruned without effect). */
static bool forgettable(struct mgr *m, const struct mgr_rec *r, uint64_t now, uint64_t after)
{
	return r->tomb_mono != 0 && now - r->tomb_mono >= after && !gate_ctl_busy(m, r->r.id.sandbox) &&
	       !mgr_exec_alive(r);
}

/* The tombstones being forgotten, by name and the epoch each had when
 * chosen (the writer deletes their rows; memory follows once that is on
 * disk, for those still the same tombstone). */
struct forgetting {
	size_t n;
	char (*names)[SPACED_NAME_MAX];
	uint64_t *epochs;
	const char **ptrs;
};

static void forgetting_free(struct forgetting *f)
{
	if (!f)
		return;
	free(f->names);
	free(f->epochs);
	free(f->ptrs);
	free(f);
}

static int forget_on_writer(struct mgr_store *st, void *arg)
{
	struct forgetting *f = arg;
	return mgr_store_forget(st, f->ptrs, f->n);
}

static void on_forgotten(struct mgr *m, void *ctx, int e)
{
	struct forgetting *f = ctx;
	size_t gone = 0;
	if (e < 0)
		gate_log("level=warn event=forget-failed records=%zu", f->n);
	for (size_t k = 0; e == 0 && k < f->n; k++) {
		struct mgr_rec *r = rec_find(m, f->names[k]);
		if (!r || r->r.active || r->r.epoch != f->epochs[k])
			continue; /* changed since: its new row was written after */
		char path[4300];
		snprintf(path, sizeof path, "%s/log/%s.log", m->cfg->state_dir, r->r.id.sandbox);
		unlink(path);
		gate_gw_forget(m, r->r.id.sandbox);
		rec_remove(m, f->names[k]);
		gone++;
	}
	if (gone > 0)
		gate_log("level=info event=forgotten records=%zu", gone);
	forgetting_free(f);
}

static void on_pruned(struct mgr *m, void *ctx, int e)
{
	(void)m;
	(void)ctx;
	if (e < 0)
		gate_log("level=warn event=acks-prune-failed");
}

static int prune_on_writer(struct mgr_store *st, void *arg)
{
	return mgr_store_prune_acks(st, (uint64_t)(uintptr_t)arg);
}

static void forget_tombstones(struct mgr *m)
{
	uint64_t now = spaced_mono_ns(), after = (uint64_t)m->cfg->forget_after_s * 1000000000ull;
	/* the last --acks-kept, and every one from the oldest operation still
	 * running on (its acknowledgement is stored when it ends) */
	uint64_t keep = (uint64_t)m->cfg->acks_kept, last = mgr_store_last_seq(m->store),
	         low = gate_ctl_lowest_pending_seq(m);
	if (low && low <= last && last - low + 1 > keep)
		keep = last - low + 1;
	uint64_t to = mgr_store_prune_horizon(m->store, keep);
	if (to > 0) {
		/* a repeat of a seq at or below it is answered ack-pruned from now
		 * on, when its acknowledgement is not found (never applied again) */
		mgr_store_note_pruned(m->store, to);
		gate_commit_call(m, prune_on_writer, (void *)(uintptr_t)to, on_pruned, NULL);
	}
	size_t n = 0;
	for (size_t i = 0; i < m->nrecs; i++)
		n += forgettable(m, &m->recs[i], now, after);
	if (n == 0)
		return;
	struct forgetting *f = calloc(1, sizeof *f);
	if (!f || !(f->names = calloc(n, sizeof *f->names)) || !(f->epochs = calloc(n, sizeof *f->epochs)) ||
	    !(f->ptrs = calloc(n, sizeof *f->ptrs))) {
		forgetting_free(f);
		return;
	}
	for (size_t i = 0; i < m->nrecs && f->n < n; i++) {
		if (!forgettable(m, &m->recs[i], now, after))
			continue;
		snprintf(f->names[f->n], sizeof f->names[f->n], "%s", m->recs[i].r.id.sandbox);
		f->epochs[f->n] = m->recs[i].r.epoch;
		f->ptrs[f->n] = f->names[f->n];
		f->n++;
	}
	gate_commit_call(m, forget_on_writer, f, on_forgotten, f);
}

static int load_cb(void *arg, const struct mgr_rec *rec)
{
	struct mgr *m = arg;
	mgr_store_use_epoch(m->store, rec->r.epoch);
	gate_gw_publish(m, rec);
	return rec_put_mem(m, rec) < 0;
}

const char *mgr_worker_id(const struct mgr *m)
{
	return m->cfg->worker_id;
}
const char *mgr_state_dir(const struct mgr *m)
{
	return m->cfg->state_dir;
}
const struct mgr_config *mgr_cfg(const struct mgr *m)
{
	return m->cfg;
}
struct mgr_store *mgr_store_of(struct mgr *m)
{
	return m->store;
}

struct installing {
	struct mgr_rec rec;
	bool handoff;
	gate_written_fn done;
	void *ctx;
};

static void on_rec_written(struct mgr *m, void *ctx, int e)
{
	struct installing *in = ctx;
	if (!in->rec.r.active) {
		if (e < 0)
			gate_quit(m, "a tombstone could not be written");
	} else if (e == 0 && (e = mgr_rec_apply(m, &in->rec, in->handoff)) < 0) {
		/* on disk, acknowledged there, yet not in memory (out of memory):
		 * the gate starts again from the records on disk rather than
		 * refuse an identity its acknowledgement says is installed */
		gate_quit(m, "a record on disk could not be taken in memory");
	}
	if (in->done)
		in->done(m, in->ctx, e);
	free(in);
}

void mgr_rec_install(struct mgr *m, const struct mgr_rec *rec, bool handoff, uint64_t seq, const char *ack_line,
                     gate_written_fn done, void *ctx)
{
	struct installing *in = malloc(sizeof *in);
	if (!in) {
		if (done)
			done(m, ctx, SPACED_ENOMEM);
		return;
	}
	in->rec = *rec;
	in->handoff = handoff;
	in->done = done;
	in->ctx = ctx;
	if (!rec->r.active) {
		/* A tombstone admits nothing: it refuses from now on (R4), before its
		 * fsync; the acknowledgement still waits for the disk. Should the
		 * write fail, the gate starts again from the records on disk, and the
		 * control plane sends the unacknowledged deactivation again. */
		int e = rec_put_mem(m, rec);
		if (e < 0) {
			free(in);
			if (done)
				done(m, ctx, e);
			return;
		}
		gate_streams_on_install(m, rec, handoff);
		gate_gw_publish(m, rec); /* the gateway's streams end now too (S1) */
		gate_watch_update(m, rec);
		mgr_store_use_epoch(m->store, rec->r.epoch);
	}
	gate_commit_write(m, rec, seq, ack_line, on_rec_written, in);
}

int mgr_rec_apply(struct mgr *m, const struct mgr_rec *rec, bool handoff)
{
	int e;
	mgr_store_use_epoch(m->store, rec->r.epoch);
	e = rec_put_mem(m, rec);
	if (e < 0)
		return e;
	gate_streams_on_install(m, rec, handoff);
	gate_gw_publish(m, rec); /* the execution's ServicePort gateway compares with it (R5) */
	gate_watch_update(m, rec); /* its end, should it die under the record */
	return 0;
}

int mgr_keys_install(struct mgr *m, const char *bundle_json, size_t len, uint64_t *version)
{
	char path[4096], tmp[4096];
	int e = spaced_keyring_install_bundle(m->kr, bundle_json, len);
	if (e < 0)
		return e;
	spaced_vcache_flush(m->vc);
	*version = spaced_keyring_version(m->kr);
	/* kept for restarts: write, fsync, rename, fsync the directory */
	snprintf(path, sizeof path, "%s/keys.json", m->cfg->state_dir);
	snprintf(tmp, sizeof tmp, "%s/keys.json.tmp", m->cfg->state_dir);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return SPACED_EIO;
	e = spaced_io_write_full(fd, bundle_json, len);
	if (e == 0 && fsync(fd) < 0)
		e = SPACED_EIO;
	close(fd);
	if (e == 0 && rename(tmp, path) < 0)
		e = SPACED_EIO;
	if (e == 0) {
		int dfd = open(m->cfg->state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) {
			fsync(dfd);
			close(dfd);
		}
	}
	return e;
}

json_t *mgr_status_json(struct mgr *m)
{
	json_t *o = json_object();
	json_t *recs = json_array();
	struct spaced_vcache_stats vs;
	spaced_vcache_stats(m->vc, &vs);
	for (size_t i = 0; i < m->nrecs; i++) {
		const struct mgr_rec *r = &m->recs[i];
		json_t *ro = json_object();
		char text[SPACED_IDENTITY_TEXT_MAX];
		spaced_identity_encode(&r->r.id, text, sizeof text);
		json_object_set_new(ro, "identity", spaced_identity_to_json(&r->r.id));
		json_object_set_new(ro, "text", json_string(text));
		json_object_set_new(ro, "epoch", json_integer((json_int_t)r->r.epoch));
		json_object_set_new(ro, "active", json_boolean(r->r.active));
		json_object_set_new(ro, "state", json_string(r->state));
		json_object_set_new(ro, "pid", json_integer(r->pid));
		json_object_set_new(ro, "host_pid", json_integer(r->host_pid));
		json_object_set_new(ro, "resources", spaced_resources_to_json(&r->res));
		json_object_set_new(ro, "uid_base", json_integer(r->uid_base));
		json_object_set_new(ro, "template", json_string(r->tmpl));
		json_object_set_new(ro, "tenant", json_string(r->tenant));
		json_object_set_new(ro, "pooled", json_boolean(r->exec_name[0] != 0));
		json_array_append_new(recs, ro);
	}
	json_object_set_new(o, "worker", json_string(m->cfg->worker_id));
	json_object_set_new(o, "mode", json_string(m->cfg->launch_bin && m->cfg->host_bin ? "substrate" : "development"));
	/* what this worker offers (the link registers it with the control plane) */
	json_object_set_new(o, "substrates", mgr_vm_offered(m->cfg) ? json_pack("[s,s]", "process", "qemu")
	                                                           : json_pack("[s]", "process"));
	json_object_set_new(o, "last_seq", json_integer((json_int_t)mgr_store_last_seq(m->store)));
	/* the installs applied tentative and not said durable (the hello
	 * carries them; at most as many as the control plane reads) */
	json_t *tent = gate_commit_tentative_list(m);
	if (tent)
		json_object_set_new(o, "tentative", tent);
	json_object_set_new(o, "keys_version", json_integer((json_int_t)spaced_keyring_version(m->kr)));
	json_object_set_new(o, "keys", json_integer((json_int_t)spaced_keyring_count(m->kr)));
	json_object_set_new(o, "manager_pid", json_integer(getpid()));
	json_object_set_new(o, "api_pid", json_integer(m->cfg->api_pid));
	json_object_set_new(o, "executor_pid", json_integer(m->cfg->exe_pid));
	json_object_update(o, gate_streams_status(m));
	json_object_set_new(o, "pool", pool_status(m));
	json_object_set_new(o, "jobs", json_integer((json_int_t)gate_jobs_in_flight(m)));
	json_object_set_new(o, "operations", json_integer((json_int_t)gate_ctl_pending(m)));
	json_object_set_new(o, "requests", json_integer((json_int_t)m->n_req));
	json_object_set_new(o, "allowed", json_integer((json_int_t)m->n_allow));
	json_object_set_new(o, "refused", json_integer((json_int_t)m->n_refuse));
	json_object_set_new(o, "cancelled", json_integer((json_int_t)m->n_cancel));
	json_object_set_new(o, "cut", json_integer((json_int_t)m->n_cut));
	json_object_set_new(o, "verify_compare_ns", json_integer((json_int_t)m->vc_ns));
	json_object_set_new(o, "vcache_hits", json_integer((json_int_t)vs.hits));
	json_object_set_new(o, "vcache_misses", json_integer((json_int_t)vs.misses));
	json_object_set_new(o, "records", recs);
	/* development executions take no limits: they report none */
	if (m->cfg->launch_bin)
		json_object_set_new(o, "limits",
		                    json_pack("{s:o,s:o,s:{s:I,s:I,s:f}}", "default",
		                              spaced_resources_to_json(&m->cfg->limits_default), "max",
		                              spaced_resources_to_json(&m->cfg->limits_max), "allocatable", "memory_bytes",
		                              (json_int_t)m->cfg->alloc.memory_bytes, "pids", (json_int_t)m->cfg->alloc.pids,
		                              "memory_overcommit", m->cfg->mem_overcommit));
	json_object_set_new(o, "uid_range", json_pack("{s:I,s:I}", "first", (json_int_t)m->cfg->uid_first, "count",
	                                              (json_int_t)m->cfg->uid_slots));
	return o;
}

/* ---- the loop ---- */

/* pasta and spaced-netd serve every execution's egress and DNS: one that
 * died (a crash, an OOM kill, a bug a tenant's traffic reached) is started
 * again within 5 s, not at the next execution start (which could be hours
 * away: every sandbox of the worker without a network meanwhile) */
static bool net_reviving;
/* one that keeps dying (or cannot start) is started again after 5 s, then
 * 10, 20 .. 320 s while it does: the tick (seconds) before which it is not */
static uint64_t net_revive_backoff_s, net_revive_not_before;

static void on_net_revived(struct mgr *m, uintptr_t ctx, int status, const char *msg, json_t *result, int fd)
{
	(void)ctx;
	if (fd >= 0)
		close(fd);
	net_reviving = false;
	const char *what = json_string_value(json_object_get(result, "started"));
	if (status < 0 || (what && *what)) {
		net_revive_backoff_s = net_revive_backoff_s ? (net_revive_backoff_s < 320 ? net_revive_backoff_s * 2 : 320) : 5;
		net_revive_not_before = m->ticks + net_revive_backoff_s;
	}
	if (status < 0)
		gate_log("level=error event=net-revive-failed next_in_s=%llu reason=\"%s\"", (unsigned long long)net_revive_backoff_s,
		         msg && *msg ? msg : spaced_strerror(status));
	else if (what && *what)
		gate_log("level=warn event=net-revived started=%s reason=\"it was not running\"", what);
}

static void on_tick(uv_timer_t *t)
{
	struct mgr *m = t->data;
	gate_streams_tick(m);
	gate_fence_tick(m);
	gate_audit_flush(false);
	if (++m->ticks % 5 == 0) {
		forget_tombstones(m);
		if (!net_reviving && !m->quit && net_needs_revive(m->cfg)) {
			if (m->ticks >= net_revive_not_before)
				net_reviving = gate_job(m, "net-revive", json_object(), on_net_revived, 0) != 0;
		} else if (!net_reviving && m->ticks >= net_revive_not_before + 60) {
			net_revive_backoff_s = 0; /* a minute running: the next death is started again at once */
		}
	}
}

static void on_signal(uv_signal_t *s, int sig)
{
	struct mgr *m = s->data;
	(void)sig;
	gate_quit(m, "signal");
}

static int load_keys(struct mgr *m)
{
	char path[4096];
	int e;
	snprintf(path, sizeof path, "%s/keys.json", m->cfg->state_dir);
	if (access(path, F_OK) == 0 && (e = spaced_keyring_load_file(m->kr, path)) < 0)
		gate_log("level=warn event=stored-keys-refused reason=\"%s\"", spaced_strerror(e));
	if (!m->cfg->keys_path)
		return 0;
	FILE *f = fopen(m->cfg->keys_path, "r");
	char *buf = malloc(SPACED_KEYRING_BUNDLE_MAX + 1);
	size_t n = (f && buf) ? fread(buf, 1, SPACED_KEYRING_BUNDLE_MAX + 1, f) : 0;
	uint64_t ver;
	if (f)
		fclose(f);
	e = (!f || !buf || n > SPACED_KEYRING_BUNDLE_MAX) ? SPACED_EIO : mgr_keys_install(m, buf, n, &ver);
	free(buf);
	if (e < 0 && e != SPACED_ESTALE) {
		gate_log("level=error event=keys-refused path=%s reason=\"%s\"", m->cfg->keys_path, spaced_strerror(e));
		return e;
	}
	return 0;
}

int mgr_run(const struct mgr_config *cfg)
{
	struct mgr m;
	uv_loop_t loop;
	int e, rc = 1;

	memset(&m, 0, sizeof m);
	m.cfg = cfg;
	m.loop = &loop;
	m.api_fd = m.exe_fd = m.admin_fd = -1;
	spaced_nameidx_init(&m.rec_index, rec_name, &m);
	if (uv_loop_init(&loop) < 0)
		return 1;
	signal(SIGPIPE, SIG_IGN);
	/* the heap's free top is kept (up to 4 MiB) instead of given back at
	 * each free of a message's buffers: every install had the heap trimmed
	 * and grown again (brk twice) */
	mallopt(M_MMAP_THRESHOLD, 128 * 1024);
	mallopt(M_TRIM_THRESHOLD, 4 << 20);
	if ((e = mgr_store_open(cfg->state_dir, &m.store)) < 0) {
		gate_log("level=error event=records-unreadable reason=\"%s\"", spaced_strerror(e));
		goto out;
	}
	if ((e = spaced_keyring_new(&m.kr)) < 0 || (e = spaced_vcache_new(&m.vc, 4096)) < 0 || load_keys(&m) < 0)
		goto out;
	if ((e = mgr_store_foreach(m.store, load_cb, &m)) < 0)
		goto out;
	if ((e = gate_commit_start(&m)) < 0) {
		gate_log("level=error event=records-unwritable reason=\"%s\"", spaced_strerror(e));
		goto out;
	}
	if (gate_audit_open(&m) < 0) {
		gate_log("level=error event=audit-log-unwritable dir=%s", cfg->state_dir);
		goto out;
	}
	if (gate_jobs_start(&m, cfg->exe_fd) < 0 || gate_streams_start(&m, cfg->api_fd) < 0)
		goto out;
	if (gate_admin_start(&m) < 0) {
		gate_log("level=error event=admin-socket-failed");
		goto out;
	}
	gate_fence_init(&m);
	uv_timer_init(&loop, &m.tick);
	m.tick.data = &m;
	uv_timer_start(&m.tick, on_tick, 1000, 1000);
	uv_signal_init(&loop, &m.sigterm);
	uv_signal_init(&loop, &m.sigint);
	m.sigterm.data = m.sigint.data = &m;
	uv_signal_start(&m.sigterm, on_signal, SIGTERM);
	uv_signal_start(&m.sigint, on_signal, SIGINT);
	/* what launchers killed with SIGKILL left behind (frozen tasks), then the
	 * executions the records say run */
	gate_job(&m, "reap", json_object(), NULL, 0);
	gate_ctl_recover(&m);
	pool_start(&m);
	gate_log("level=info event=serving worker=%s records=%zu last_seq=%llu", cfg->worker_id, m.nrecs,
	         (unsigned long long)mgr_store_last_seq(m.store));
	uv_run(&loop, UV_RUN_DEFAULT);
	rc = 0;
	gate_audit_flush(true); /* what is held back is written before the gate goes */
out:
	pool_stop(&m);
	gate_streams_stop(&m);
	gate_admin_stop(&m);
	gate_jobs_stop(&m);
	gate_watch_stop(&m);
	gate_commit_stop(&m); /* what is queued is written */
	gate_fence_stop(&m);
	if (m.tick.data) {
		uv_timer_stop(&m.tick);
		uv_close((uv_handle_t *)&m.tick, NULL);
		uv_signal_stop(&m.sigterm);
		uv_signal_stop(&m.sigint);
		uv_close((uv_handle_t *)&m.sigterm, NULL);
		uv_close((uv_handle_t *)&m.sigint, NULL);
	}
	uv_run(&loop, UV_RUN_DEFAULT); /* the close callbacks */
	gate_streams_free(&m);
	uv_loop_close(&loop);
	free(m.recs);
	spaced_nameidx_free(&m.rec_index);
	spaced_vcache_free(m.vc);
	spaced_keyring_free(m.kr);
	mgr_store_close(m.store);
	return rc;
}
