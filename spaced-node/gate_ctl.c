/*
 * gate_ctl.c — the worker side of the control messages
 * (docs/control-messages.md): keys, install, deactivate, pause, thaw,
 * snapshot, destroy, plus the local `status` query.
 *
 * Each message is an operation. What it changes in the records is written at
 * once (the acknowledgement in the same SQLite transaction as the record it
 * describes, so an acknowledged install is on disk); what takes time — staging
 * a snapshot, starting, stopping, pausing, snapshotting — is a job for the
 * executor, and the operation goes on when the job's completion arrives. The
 * loop meanwhile serves everything else: one slow execution delays nothing
 * but the operations of its own sandbox.
 *
 * Operations of one sandbox run one after the other, in the order their
 * messages came; operations of different sandboxes run side by side. A
 * deactivation is acknowledged as soon as its tombstone is on disk (R3 holds
 * from then on); the stop follows. Each seq is applied at most once: a seq
 * whose acknowledgement is stored gets it again without effect; a seq in
 * progress gets its acknowledgement when it is done (to whoever asked last).
 */
#include "gate.h"
#include "pool.h"

#include <signal.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spaced_error.h"
#include "pidref.h"
#include "treehash.h"

enum ctl_kind { K_KEYS = 1, K_INSTALL, K_DEACTIVATE, K_PAUSE, K_THAW, K_SNAPSHOT, K_DESTROY, K_RECOVER, K_NET, K_ENDED };

struct outcome {
	json_t *result; /* on success (owned) */
	const char *error, *code;
	char errbuf[256];
};

struct ctl_op;
/* What an operation does once its write is on disk (or failed: e < 0, the
 * failure already replied). */
typedef void (*op_next_fn)(struct mgr *m, struct ctl_op *op, int e);

struct ctl_op {
	struct ctl_op *next; /* in its queue */
	struct ctl_queue *q;
	enum ctl_kind kind;
	uint64_t seq;        /* 0: an internal operation (recovery), nothing acknowledged */
	json_t *msg;
	gate_reply_fn reply;
	uintptr_t reply_ctx;
	bool replied;
	bool accounted;      /* counted, timed and audited (once, at its outcome) */
	uint64_t t0;         /* when it arrived (monotonic ns) */
	int step;
	struct outcome o;
	/* the job that just completed */
	int job_status;
	char job_msg[512];
	json_t *job_result;
	/* its write in progress (op_commit, op_done_no_record) */
	char *written_line; /* the acknowledgement being written */
	bool writing_rec;
	op_next_fn written_next;
	/* working state */
	struct spaced_identity id;
	bool handoff, keep, had_cur, claimed, same_exec;
	bool admitted;       /* an install counted in the worker's capacity (admit) */
	/* a claimed pooled execution's record, written while its claim goes on
	 * (install_start): CW_WRITING until on disk, then CW_WRITTEN with the
	 * write's status, until both are in (claim_joined) */
	enum { CW_NONE, CW_WRITING, CW_WRITTEN } claim_write;
	bool claim_back;   /* the claim came back while the record was being written */
	int claim_status;  /* the write's */
	int claim_gateway; /* the gateway port its acknowledgement names (0: none) */
	bool claim_cut;    /* recovery: the gate stopped before this record's claim ended */
	struct spaced_resources res;
	char tmpl[65], tmpl_url[512]; /* spec.template: its hash and where to fetch it */
	char config[MGR_CONFIG_MAX];  /* the guest's settings: spec.template.config and spec.env */
	char tenant[SPACED_NAME_MAX]; /* spec.tenant: whose sandbox it is ("" when not given) */
	char snapshot[4096], snapshot_hash[80], staged[4096], path[4096];
	struct mgr_rec rec, old;
};

struct ctl_queue {
	struct ctl_queue *next;
	char sandbox[SPACED_NAME_MAX]; /* "" for messages of no sandbox (keys) */
	struct ctl_op *head, *tail;
};

static void op_run(struct mgr *m, struct ctl_op *op);
static void op_enqueue(struct mgr *m, struct ctl_op *op, const char *sandbox);

static int fail(struct outcome *o, const char *code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct outcome *o, const char *code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(o->errbuf, sizeof o->errbuf, fmt, ap);
	va_end(ap);
	o->error = o->errbuf;
	o->code = code;
	json_decref(o->result);
	o->result = NULL;
	return -1;
}

static char *ack_line(uint64_t seq, const struct outcome *o)
{
	json_t *a = json_object();
	if (seq)
		json_object_set_new(a, "ack", json_integer((json_int_t)seq));
	if (o->error) {
		json_object_set_new(a, "ok", json_false());
		json_object_set_new(a, "error", json_string(o->error));
		json_object_set_new(a, "code", json_string(o->code));
	} else {
		json_object_set_new(a, "ok", json_true());
		json_object_set_new(a, "result", o->result ? json_incref(o->result) : json_object());
	}
	char *s = json_dumps(a, JSON_COMPACT);
	json_decref(a);
	return s;
}

/* ---- queues ---- */

static struct ctl_queue *queue_of(struct mgr *m, const char *sandbox, bool create)
{
	for (struct ctl_queue *q = m->ctlq; q; q = q->next)
		if (strcmp(q->sandbox, sandbox) == 0)
			return q;
	if (!create)
		return NULL;
	struct ctl_queue *q = calloc(1, sizeof *q);
	if (!q)
		return NULL;
	snprintf(q->sandbox, sizeof q->sandbox, "%s", sandbox);
	q->next = m->ctlq;
	m->ctlq = q;
	return q;
}

static struct ctl_op *op_with_seq(struct mgr *m, uint64_t seq)
{
	for (struct ctl_queue *q = m->ctlq; q; q = q->next)
		for (struct ctl_op *op = q->head; op; op = op->next)
			if (op->seq == seq)
				return op;
	return NULL;
}

static uint64_t highest_pending_seq(struct mgr *m)
{
	uint64_t hi = 0;
	for (struct ctl_queue *q = m->ctlq; q; q = q->next)
		for (struct ctl_op *op = q->head; op; op = op->next)
			if (op->seq > hi)
				hi = op->seq;
	return hi;
}

uint64_t gate_ctl_lowest_pending_seq(const struct mgr *m)
{
	uint64_t lo = 0;
	for (const struct ctl_queue *q = m->ctlq; q; q = q->next)
		for (const struct ctl_op *op = q->head; op; op = op->next)
			if (op->seq && (lo == 0 || op->seq < lo))
				lo = op->seq;
	return lo;
}

bool gate_ctl_recovering(const struct mgr *m, const char *sandbox)
{
	for (const struct ctl_queue *q = m->ctlq; q; q = q->next)
		if (strcmp(q->sandbox, sandbox) == 0)
			for (const struct ctl_op *op = q->head; op; op = op->next)
				if (op->kind == K_RECOVER)
					return true;
	return false;
}

size_t gate_ctl_pending(const struct mgr *m)
{
	size_t n = 0;
	for (const struct ctl_queue *q = m->ctlq; q; q = q->next)
		for (const struct ctl_op *op = q->head; op; op = op->next)
			n++;
	return n;
}

static void op_free(struct ctl_op *op)
{
	json_decref(op->msg);
	json_decref(op->o.result);
	json_decref(op->job_result);
	free(op->written_line);
	free(op);
}

const char *gate_ctl_kind_name(unsigned k)
{
	static const char *const names[GATE_CTL_KINDS] = {"",        "keys",    "install", "deactivate",
	                                                  "pause",   "thaw",    "snapshot", "destroy",
	                                                  "recover", "net",     "ended"};
	return k >= K_KEYS && k < GATE_CTL_KINDS ? names[k] : "?";
}

static const char *kind_name(enum ctl_kind k)
{
	return gate_ctl_kind_name((unsigned)k);
}

/* At an operation's outcome: its time from arrival into the histogram of
 * its kind, and a line in the audit log. */
static void op_account(struct mgr *m, struct ctl_op *op)
{
	if (op->accounted)
		return;
	op->accounted = true;
	gate_metrics_ctl(m, (unsigned)op->kind, spaced_mono_ns() - op->t0, op->o.error == NULL);
	json_t *e = json_pack("{s:s,s:I,s:b}", "event", kind_name(op->kind), "seq", (json_int_t)op->seq, "ok",
	                      op->o.error == NULL);
	if (op->id.sandbox[0]) {
		char text[SPACED_IDENTITY_TEXT_MAX];
		spaced_identity_encode(&op->id, text, sizeof text);
		json_object_set_new(e, "identity", json_string(text));
	} else if (op->q && op->q->sandbox[0]) {
		json_object_set_new(e, "sandbox", json_string(op->q->sandbox));
	}
	if (op->o.error)
		json_object_set_new(e, "error", json_string(op->o.code ? op->o.code : op->o.error));
	gate_audit(m, e);
}

static void op_reply(struct mgr *m, struct ctl_op *op, const char *line)
{
	op_account(m, op);
	if (op->replied || !op->reply)
		return;
	op->replied = true;
	op->reply(m, op->reply_ctx, line);
}

/* The operation is over: the next one of its sandbox starts. */
static void op_finish(struct mgr *m, struct ctl_op *op)
{
	struct ctl_queue *q = op->q;
	q->head = op->next;
	if (!q->head)
		q->tail = NULL;
	op_account(m, op);
	bool recovered = op->kind == K_RECOVER;
	op_free(op);
	if (recovered && !gate_ctl_recovering(m, q->sandbox))
		gate_streams_recovered(m, q->sandbox);
	if (q->head) {
		op_run(m, q->head);
	} else {
		for (struct ctl_queue **pp = &m->ctlq; *pp; pp = &(*pp)->next)
			if (*pp == q) {
				*pp = q->next;
				break;
			}
		free(q);
	}
}

/* The end of most operations: once its write is on disk, it is over. */
static void op_then_finish(struct mgr *m, struct ctl_op *op, int e)
{
	(void)e;
	op_finish(m, op);
}

/* op's write is on disk (e 0) or failed: its reply, then what follows. */
static void op_written(struct mgr *m, void *ctx, int e)
{
	struct ctl_op *op = ctx;
	char *line = op->written_line;
	op->written_line = NULL;
	if (e < 0) {
		free(line);
		if (op->writing_rec)
			fail(&op->o, e == SPACED_ESTALE ? "backwards" : "io", "cannot write the record: %s",
			     spaced_strerror(e));
		else
			fail(&op->o, "io", "cannot write the acknowledgement");
		line = ack_line(0, &op->o);
	}
	op_reply(m, op, line);
	free(line);
	op->written_next(m, op, e);
}

/* Ends op with its outcome as it is: an error (or a result without a record
 * change) is stored as the acknowledgement alone, then replied. */
static void op_done_no_record(struct mgr *m, struct ctl_op *op)
{
	char *line = ack_line(op->seq, &op->o);
	if (!line || !op->seq) {
		op_reply(m, op, line);
		free(line);
		op_finish(m, op);
		return;
	}
	op->written_line = line;
	op->writing_rec = false;
	op->written_next = op_then_finish;
	gate_commit_write(m, NULL, op->seq, line, op_written, op);
}

/* Writes rec with the acknowledgement of the operation (mgr_rec_install),
 * replies once it is on disk — with that failure if it failed — and goes on
 * with next. */
static void op_commit(struct mgr *m, struct ctl_op *op, const struct mgr_rec *rec, bool handoff, op_next_fn next)
{
	char *line = ack_line(op->seq, &op->o);
	if (!line) {
		fail(&op->o, "io", "out of memory");
		op_reply(m, op, NULL);
		next(m, op, SPACED_ENOMEM);
		return;
	}
	op->written_line = line;
	op->writing_rec = true;
	op->written_next = next;
	mgr_rec_install(m, rec, handoff, op->seq, line, op_written, op);
}

/* ---- jobs of an operation ---- */

static void on_op_job(struct mgr *m, uintptr_t ctx, int status, const char *msg, json_t *result, int fd)
{
	struct ctl_op *op = (struct ctl_op *)ctx;
	if (fd >= 0)
		close(fd);
	op->job_status = status;
	snprintf(op->job_msg, sizeof op->job_msg, "%s", msg ? msg : "");
	json_decref(op->job_result);
	op->job_result = json_incref(result);
	op->step++;
	op_run(m, op);
}

/* Sends a job for op; its completion runs the operation's next step. */
static bool op_job(struct mgr *m, struct ctl_op *op, const char *kind, json_t *args)
{
	if (gate_job(m, kind, args, on_op_job, (uintptr_t)op))
		return true;
	op->job_status = SPACED_ENOMEM;
	snprintf(op->job_msg, sizeof op->job_msg, "the job could not be queued");
	return false;
}

/* A job nobody waits for (its sandbox's next operation may already run). */
static void on_background_job(struct mgr *m, uintptr_t ctx, int status, const char *msg, json_t *result, int fd)
{
	(void)m;
	(void)result;
	if (fd >= 0)
		close(fd);
	if (status < 0)
		gate_log("level=warn event=job-failed job=%s reason=\"%s\"", (const char *)ctx, msg);
}

/* The templates of live executions: never evicted from the cache. */
static json_t *used_templates(struct mgr *m)
{
	json_t *a = json_array();
	for (size_t i = 0; i < m->nrecs; i++) {
		const struct mgr_rec *r = &m->recs[i];
		if (r->tmpl[0] && (r->pid != 0 || r->host_pid != 0 || r->r.active))
			json_array_append_new(a, json_string(r->tmpl));
	}
	return a;
}

static json_t *used_ranges(struct mgr *m)
{
	json_t *a = json_array();
	for (size_t i = 0; i < m->nrecs; i++) {
		const struct mgr_rec *r = &m->recs[i];
		if (r->uid_base != 0 && (r->pid != 0 || r->host_pid != 0))
			json_array_append_new(a, json_integer(r->uid_base));
	}
	pool_used_ranges(m, a);
	return a;
}

/* ---- the operations ---- */

static int only_members(json_t *msg, const char *const *allowed)
{
	const char *k;
	json_t *v;
	json_object_foreach(msg, k, v) {
		bool ok = false;
		for (const char *const *a = allowed; *a; a++)
			ok = ok || strcmp(*a, k) == 0;
		if (!ok)
			return -1;
	}
	return 0;
}

static int get_identity(json_t *msg, struct spaced_identity *id, struct outcome *o)
{
	if (spaced_identity_from_json(id, json_object_get(msg, "identity")) < 0)
		return fail(o, "bad-message", "identity missing or invalid");
	return 0;
}

/* spec.template: null (the worker's own /usr and /etc) or {"name", "hash",
 * "url", "config"}: the template is fetched from url and must have hash. */
static int template_parse(json_t *t, struct ctl_op *op, struct outcome *o)
{
	op->tmpl[0] = op->tmpl_url[0] = 0;
	if (!t || json_is_null(t))
		return 0;
	json_t *h = json_object_get(t, "hash"), *u = json_object_get(t, "url");
	if (!json_is_object(t) || !json_is_string(h) || !spaced_treehash_hex_valid(json_string_value(h)))
		return fail(o, "bad-message", "spec.template must name a template by its hash");
	if (u && (!json_is_string(u) || json_string_length(u) >= sizeof op->tmpl_url ||
	          strncmp(json_string_value(u), "http", 4) != 0))
		return fail(o, "bad-message", "spec.template.url must be an http URL");
	snprintf(op->tmpl, sizeof op->tmpl, "%s", json_string_value(h));
	snprintf(op->tmpl_url, sizeof op->tmpl_url, "%s", u ? json_string_value(u) : "");
	return 0;
}

/* The guest's settings: the template's config (ENV, WORKDIR, USER) under the
 * create's env. */
static int config_parse(json_t *spec, struct ctl_op *op, struct outcome *o)
{
	json_t *tc = json_object_get(json_object_get(spec, "template"), "config");
	json_t *env = json_object_get(spec, "env"), *te = json_object_get(tc, "env"), *v;
	op->config[0] = 0;
	if (!json_is_object(tc) && !json_is_object(env))
		return 0;
	json_t *c = json_object(), *e = json_object();
	size_t i;
	const char *k;
	if (json_is_array(te)) {
		json_array_foreach(te, i, v) {
			const char *s = json_string_value(v), *eq = s ? strchr(s, '=') : NULL;
			if (eq && eq != s && eq - s < 256) {
				char key[256];
				snprintf(key, sizeof key, "%.*s", (int)(eq - s), s);
				json_object_set_new(e, key, json_string(eq + 1));
			}
		}
	} else if (json_is_object(te)) {
		json_object_foreach(te, k, v) {
			if (json_is_string(v))
				json_object_set(e, k, v);
		}
	}
	if (env && !json_is_object(env)) {
		json_decref(c);
		json_decref(e);
		return fail(o, "bad-message", "spec.env must be an object");
	}
	json_object_foreach(env, k, v) {
		if (json_is_string(v))
			json_object_set(e, k, v);
	}
	json_object_set_new(c, "env", e);
	json_t *wd = json_object_get(tc, "workdir"), *user = json_object_get(tc, "user");
	if (json_is_string(wd))
		json_object_set(c, "workdir", wd);
	if (json_is_string(user))
		json_object_set(c, "user", user);
	char *t = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(c);
	if (!t || strlen(t) >= sizeof op->config) {
		free(t);
		return fail(o, "config-too-large", "the sandbox's environment is larger than %zu bytes", sizeof op->config);
	}
	memcpy(op->config, t, strlen(t) + 1);
	free(t);
	return 0;
}

/* What the execution of r may still write to its disk: its limit less what
 * its image holds (its whole limit when the image is not found: a VM's). */
static uint64_t disk_left(const struct mgr_config *c, const struct mgr_rec *r)
{
	char dir[4096], img[4200];
	struct stat st;
	if (r->res.disk_bytes == 0 || mgr_exec_dir(c, r, dir, sizeof dir) < 0)
		return r->res.disk_bytes;
	snprintf(img, sizeof img, "%s/disk.img", dir);
	if (stat(img, &st) < 0)
		return r->res.disk_bytes;
	uint64_t used = (uint64_t)st.st_blocks * 512u;
	return used < r->res.disk_bytes ? r->res.disk_bytes - used : 0;
}

/* The worker's capacity: the limits of the executions its records hold and
 * of the installs admitted and not yet done, other sandboxes' all (op's own
 * sandbox is replaced), with op's added, stay within it; else op is refused
 * `no-capacity`. Tasks within mgr_config.alloc exactly (a sandbox's limit is
 * then its own whatever the others do: another sandbox's fork bomb never
 * takes its tasks), memory within alloc times mem_overcommit, and what the
 * executions may still write to their sparse disks (each limit less what its
 * image holds) within disk_overcommit times what the state directory's
 * filesystem — the one of the records, logs and template cache — has free
 * beyond disk_reserve. The stat and statfs read what the kernel holds in
 * memory (each image is held open by its loop device): no disk I/O in the
 * gate's loop. */
static int admit(struct mgr *m, struct ctl_op *op)
{
	const struct mgr_config *c = mgr_cfg(m);
	bool check_disk = op->res.disk_bytes > 0 && c->disk_overcommit > 0;
	uint64_t mem = op->res.memory_bytes, pids = op->res.pids, disk = op->res.disk_bytes;
	for (size_t i = 0; i < m->nrecs; i++) {
		const struct mgr_rec *r = &m->recs[i];
		if ((r->pid != 0 || r->host_pid != 0) && strcmp(r->r.id.sandbox, op->id.sandbox) != 0) {
			mem += r->res.memory_bytes;
			pids += r->res.pids;
			disk += check_disk ? disk_left(c, r) : 0;
		}
	}
	for (const struct ctl_queue *q = m->ctlq; q; q = q->next)
		for (const struct ctl_op *x = q->head; x; x = x->next)
			if (x != op && x->kind == K_INSTALL && x->admitted && strcmp(x->id.sandbox, op->id.sandbox) != 0) {
				mem += x->res.memory_bytes;
				pids += x->res.pids;
				disk += x->res.disk_bytes;
			}
	if (c->alloc.pids > 0 && pids > c->alloc.pids)
		return fail(&op->o, "no-capacity", "this worker's sandboxes would have %llu tasks, above the %llu it holds",
		            (unsigned long long)pids, (unsigned long long)c->alloc.pids);
	double mem_bound = (double)c->alloc.memory_bytes * (c->mem_overcommit > 0 ? c->mem_overcommit : 1.0);
	if (c->alloc.memory_bytes > 0 && (double)mem > mem_bound)
		return fail(&op->o, "no-capacity", "this worker's sandboxes would have %llu MiB of memory, above the %llu MiB it holds",
		            (unsigned long long)(mem >> 20), (unsigned long long)((uint64_t)mem_bound >> 20));
	struct statvfs sv;
	if (check_disk && statvfs(c->state_dir, &sv) == 0) {
		uint64_t size = (uint64_t)sv.f_blocks * sv.f_frsize, avail = (uint64_t)sv.f_bavail * sv.f_frsize;
		uint64_t reserve = c->disk_reserve ? c->disk_reserve : size / 20 > (2ull << 30) ? size / 20 : 2ull << 30;
		uint64_t beyond = avail > reserve ? avail - reserve : 0;
		if ((double)disk > (double)beyond * c->disk_overcommit)
			return fail(&op->o, "no-capacity",
			            "this worker's sandboxes could write %llu MiB more to its disk, which has %llu MiB free beyond "
			            "its reserve of %llu MiB (--disk-overcommit %.1f)",
			            (unsigned long long)(disk >> 20), (unsigned long long)(beyond >> 20),
			            (unsigned long long)(reserve >> 20), c->disk_overcommit);
	}
	op->admitted = true;
	return 0;
}

/* Checks an install and fills op; -1 with op->o set when it is refused. */
static int install_parse(struct mgr *m, struct ctl_op *op)
{
	static const char *const allowed[] = {"seq", "type", "identity", "handoff", "spec", "tentative", NULL};
	json_t *msg = op->msg, *jh = json_object_get(msg, "handoff"), *spec = json_object_get(msg, "spec");
	struct outcome *o = &op->o;
	if (only_members(msg, allowed) < 0)
		return fail(o, "bad-message", "unknown member");
	if (get_identity(msg, &op->id, o) < 0)
		return -1;
	if (jh && !json_is_boolean(jh))
		return fail(o, "bad-message", "handoff must be a boolean");
	op->handoff = jh && json_is_true(jh);
	memset(&op->res, 0, sizeof op->res);
	if (spec && !json_is_null(spec)) {
		char err[160];
		if (!json_is_object(spec))
			return fail(o, "bad-message", "spec must be an object");
		if (spaced_resources_from_json(json_object_get(spec, "resources"), &op->res, err, sizeof err) < 0)
			return fail(o, "bad-message", "spec.resources: %s", err);
		/* a spec stored before resources were an object of their own */
		json_t *lm = json_object_get(spec, "memory_bytes"), *lp = json_object_get(spec, "pids");
		if (op->res.memory_bytes == 0 && json_is_integer(lm) && json_integer_value(lm) > 0)
			op->res.memory_bytes = (uint64_t)json_integer_value(lm);
		if (op->res.pids == 0 && json_is_integer(lp) && json_integer_value(lp) > 0)
			op->res.pids = (uint64_t)json_integer_value(lp);
		if (template_parse(json_object_get(spec, "template"), op, o) < 0 || config_parse(spec, op, o) < 0)
			return -1;
		json_t *tn = json_object_get(spec, "tenant");
		if (tn && !json_is_null(tn)) {
			if (!json_is_string(tn) || !spaced_name_valid(json_string_value(tn), json_string_length(tn)))
				return fail(o, "bad-message", "spec.tenant must be a name");
			snprintf(op->tenant, sizeof op->tenant, "%s", json_string_value(tn));
		}
		json_t *snap = json_object_get(spec, "snapshot"), *sh = json_object_get(spec, "snapshot_hash");
		if (snap && !json_is_null(snap)) {
			if (!json_is_string(snap) || json_string_length(snap) >= sizeof op->snapshot ||
			    (json_string_value(snap)[0] != '/' && strncmp(json_string_value(snap), "http", 4) != 0))
				return fail(o, "bad-message", "spec.snapshot must be an absolute path or an http URL");
			snprintf(op->snapshot, sizeof op->snapshot, "%s", json_string_value(snap));
		}
		if (sh && !json_is_null(sh)) {
			if (!json_is_string(sh) || json_string_length(sh) >= sizeof op->snapshot_hash)
				return fail(o, "bad-message", "spec.snapshot_hash must be a string");
			snprintf(op->snapshot_hash, sizeof op->snapshot_hash, "%s", json_string_value(sh));
		}
	}
	if (strcmp(op->id.worker, mgr_worker_id(m)) != 0)
		return fail(o, "wrong-worker", "identity names worker %s, this is %s", op->id.worker, mgr_worker_id(m));
	if (strcmp(op->id.substrate, "process") != 0 &&
	    !(strcmp(op->id.substrate, "qemu") == 0 && mgr_vm_offered(mgr_cfg(m))))
		return fail(o, "unsupported-substrate", "substrate %s is not served here", op->id.substrate);
	/* development executions (no launcher) are plain processes: no limit can
	 * hold there, so none is accepted */
	if (!mgr_cfg(m)->launch_bin) {
		if (op->res.cpu_milli || op->res.memory_bytes || op->res.pids || op->res.disk_bytes)
			return fail(o, "limits-unsupported", "development executions cannot be held to limits");
		if (op->tmpl[0])
			return fail(o, "template-unsupported", "development executions run on the worker's own files");
	} else {
		/* what the install leaves out, the worker's defaults fill in; what it
		 * asks above the worker's maxima is refused, never silently lowered */
		spaced_resources_default(&op->res, &mgr_cfg(m)->limits_default);
		const char *over = spaced_resources_exceeds(&op->res, &mgr_cfg(m)->limits_max);
		if (over)
			return fail(o, "limit-exceeded", "%s is above this worker's maximum", over);
		return admit(m, op);
	}
	return 0;
}

/* The executor's start of op->rec, cold (from its snapshot when staged). */
/* The egress policy an install starts under (docs/network.md), or NULL. */
static json_t *op_network(const struct ctl_op *op)
{
	json_t *net = json_object_get(json_object_get(op->msg, "spec"), "network");
	return json_is_object(net) ? net : NULL;
}

static bool start_job(struct mgr *m, struct ctl_op *op)
{
	json_t *args = json_pack("{s:o,s:s?,s:o,s:o}", "rec", mgr_rec_to_json(&op->rec), "snapshot",
	                         op->staged[0] ? op->staged : NULL, "used", used_ranges(m), "templates",
	                         used_templates(m));
	if (args && op_network(op))
		json_object_set(args, "network", op_network(op));
	return op_job(m, op, "start", args);
}

/* An install's new execution is on disk and in memory — or its record could
 * not be written (a full or failing disk, the store's lock held past its
 * timeout, a generation going backwards): then nothing names the execution
 * just started or claimed, no request reaches it and no admission counts it,
 * so it is stopped (its uid range, memory and disk come back). The reply
 * carried no acknowledgement: the control plane sends the install again. */
static void install_written(struct mgr *m, struct ctl_op *op, int e)
{
	if (e == 0)
		gate_log("level=info event=installed sandbox=%s generation=%llu pooled=%d ms=%.2f", op->id.sandbox,
		         (unsigned long long)op->id.generation, op->rec.exec_name[0] != 0,
		         (double)(spaced_mono_ns() - op->t0) / 1e6);
	else {
		gate_log("level=warn event=install-unwritten sandbox=%s generation=%llu reason=\"%s\"", op->id.sandbox,
		         (unsigned long long)op->id.generation, spaced_strerror(e));
		gate_job(m, "stop", json_pack("{s:o}", "rec", mgr_rec_to_json(&op->rec)), on_background_job,
		         (uintptr_t)"stop");
	}
	op_finish(m, op);
}

/* An install's result for an execution that keeps running: its record's
 * epoch and its ServicePort gateway's port (the control plane's URLs). */
static json_t *epoch_result(struct mgr *m, const struct mgr_rec *rec)
{
	int port = 0;
	json_t *r = json_pack("{s:I}", "epoch", (json_int_t)rec->r.epoch);
	if (r && mgr_pool_gateway_port(m->cfg, rec, &port) == 0 && port > 0)
		json_object_set_new(r, "gateway", json_integer(port));
	return r;
}

static void run_install(struct mgr *m, struct ctl_op *op);

/* A fresh execution's result, in op's outcome: its record's epoch, its
 * launcher's pid and its ServicePort gateway's port (gw, a JSON integer;
 * NULL or 0: none) for the control plane's URLs; false when out of memory. */
static bool started_result(struct ctl_op *op, json_t *gw)
{
	json_decref(op->o.result);
	op->o.result = json_pack("{s:I,s:I}", "epoch", (json_int_t)op->rec.r.epoch, "pid", (json_int_t)op->rec.pid);
	if (op->o.result && json_is_integer(gw) && json_integer_value(gw) > 0)
		json_object_set(op->o.result, "gateway", gw);
	return op->o.result != NULL;
}

/* The record of a claimed pooled execution is on disk (e 0) or could not be
 * written; the claim goes on or came back meanwhile. */
static void claim_written(struct mgr *m, void *ctx, int e)
{
	struct ctl_op *op = ctx;
	op->claim_write = CW_WRITTEN;
	op->claim_status = e;
	if (op->claim_back)
		run_install(m, op);
}

/* A claimed pooled execution's record is what it will be once claimed: its
 * processes, uid range and gateway come from the pool. So it is written
 * while the claim goes on (the wait for the disk and the claim's trip
 * through the executor, launcher, guest, bridge and gateway overlap), and
 * applied — it admits requests — and acknowledged only once both are done
 * (claim_joined). Should the gate stop in between, the record names an
 * execution that may not have taken its identity: at the next start it
 * ends (run_recover), and the install sent again is refused. */
static void claim_write_start(struct mgr *m, struct ctl_op *op, int gateway)
{
	snprintf(op->rec.state, sizeof op->rec.state, "%s", MGR_ST_RUNNING);
	json_t *gw = json_integer(gateway);
	char *line = started_result(op, gw) ? ack_line(op->seq, &op->o) : NULL;
	json_decref(gw);
	if (!line) {
		json_decref(op->o.result);
		op->o.result = NULL;
		return; /* written after the claim, as a started execution's is */
	}
	op->claim_write = CW_WRITING;
	op->claim_back = false;
	op->claim_gateway = gateway;
	op->written_line = line;
	op->writing_rec = true;
	gate_commit_write(m, &op->rec, op->seq, line, claim_written, op); /* applied by claim_joined */
}

/* The claim and its record's write are both in: true when the install is
 * over (acknowledged, or refused because its record could not be written);
 * false when the claim failed (or its gateway is not the one written), and
 * the install goes on as after any claim, writing what is so. */
static bool claim_joined(struct mgr *m, struct ctl_op *op)
{
	json_t *gw = json_object_get(op->job_result, "gateway");
	int claimed_gw = json_is_integer(gw) ? (int)json_integer_value(gw) : 0;
	op->claim_write = CW_NONE;
	op->claim_back = false;
	if (op->job_status < 0 || claimed_gw != op->claim_gateway) {
		free(op->written_line);
		op->written_line = NULL;
		json_decref(op->o.result);
		op->o.result = NULL;
		return false;
	}
	int e = op->claim_status;
	if (e == 0 && (e = mgr_rec_apply(m, &op->rec, op->had_cur)) < 0)
		gate_quit(m, "a record on disk could not be taken in memory"); /* as on_rec_written */
	op->written_next = install_written;
	op_written(m, op, e);
	return true;
}

/* Step 1's end: a fresh execution comes from the warm pool when one of its
 * template and limits is ready — only the claim is left to do (the pool
 * holds process executions; a VM starts from its own booted template,
 * mgr_vm.c), its record written meanwhile — or is started (step 2); a job
 * that cannot be queued goes on at once as its failure (step 3). */
static void install_start(struct mgr *m, struct ctl_op *op)
{
	op->step = 2;
	int gateway = 0;
	if (!op->staged[0] && !mgr_vm_is(&op->rec) && pool_take(m, &op->rec, &gateway)) {
		op->claimed = true;
		/* on a template, after a check of the cached tree (in a child) */
		if (op_job(m, op, op->rec.tmpl[0] ? "claim-checked" : "claim",
		           json_pack("{s:o,s:O?}", "rec", mgr_rec_to_json(&op->rec), "network", op_network(op)))) {
			claim_write_start(m, op, gateway);
			return;
		}
	} else if (start_job(m, op)) {
		return;
	}
	op->step = 3;
	run_install(m, op);
}

/* The new generation's record (stopped, before its start) is on disk: the
 * old generation's execution stops, the new one starts. */
static void install_stopped_written(struct mgr *m, void *ctx, int e)
{
	struct ctl_op *op = ctx;
	if (e < 0) {
		if (op->staged[0])
			gate_job(m, "unstage", json_pack("{s:s}", "staged", op->staged), on_background_job,
			         (uintptr_t)"unstage");
		fail(&op->o, e == SPACED_ESTALE ? "backwards" : "io", "cannot write the record: %s", spaced_strerror(e));
		op_done_no_record(m, op);
		return;
	}
	if (op->old.pid || op->old.host_pid)
		gate_job(m, "stop", json_pack("{s:o}", "rec", mgr_rec_to_json(&op->old)), on_background_job,
		         (uintptr_t)"stop");
	install_start(m, op);
}

static void run_install(struct mgr *m, struct ctl_op *op)
{
	const struct mgr_rec *cur = mgr_rec_find(m, op->id.sandbox);
	struct outcome *o = &op->o;
	switch (op->step) {
	case 0: {
		if (install_parse(m, op) < 0)
			goto refused;
		if (gate_fenced(m)) {
			/* cut off from the control plane: what it sent before or
			 * during the cut (replayed now) may be stale — the sandbox
			 * may run elsewhere by now; nothing starts or wakes until
			 * the fence lifts (refused: nothing was started) */
			fail(o, "fenced", "the worker lost its control plane; nothing starts here until it is back");
			goto refused;
		}
		cur = mgr_rec_find(m, op->id.sandbox);
		uint64_t gone = 0;
		if (!cur && mgr_store_gone_generation(mgr_store_of(m), op->id.sandbox, &gone) == 0 &&
		    op->id.generation <= gone) {
			/* its record was forgotten here (a tombstone): that generation
			 * is never started again (I2) */
			fail(o, "not-running", "generation %llu does not run here (forgotten at %llu): a start is a new generation",
			     (unsigned long long)op->id.generation, (unsigned long long)gone);
			goto refused;
		}
		if (cur && op->id.generation < cur->r.id.generation) {
			fail(o, "backwards", "generation %llu is older than the installed %llu",
			     (unsigned long long)op->id.generation, (unsigned long long)cur->r.id.generation);
			goto refused;
		}
		if (cur && op->id.generation == cur->r.id.generation && !cur->r.active) {
			if (!op->handoff && strcmp(cur->state, MGR_ST_KEPT) == 0 && mgr_exec_alive(cur)) {
				/* the same execution, deactivated and kept frozen by a move
				 * that did not finish: active again under a new activation
				 * (not a start, so not a new generation, I2), thawed before
				 * its record admits anything */
				op->rec = *cur;
				op->rec.r.id = op->id;
				snprintf(op->rec.state, sizeof op->rec.state, "%s", MGR_ST_RUNNING);
				op->step = 4;
				if (op_job(m, op, "activate", json_pack("{s:o,s:b}", "rec", mgr_rec_to_json(&op->rec), "thaw", 1)))
					return;
				fail(o, "io", "%s", op->job_msg);
				goto refused;
			}
			fail(o, "deactivated", "generation %llu left this worker", (unsigned long long)op->id.generation);
			goto refused;
		}
		if (op->handoff) {
			/* S3: an ownership change on an unchanged resident */
			if (!cur || !cur->r.active || !spaced_identity_equal(&cur->r.id, &op->id)) {
				fail(o, "identity-mismatch", "a handoff keeps the installed identity");
				goto refused;
			}
			op->rec = *cur;
			o->result = json_pack("{s:I,s:b}", "epoch", (json_int_t)op->rec.r.epoch, "handoff", 1);
			op_commit(m, op, &op->rec, true, op_then_finish);
			return;
		}
		if (cur && cur->r.active && spaced_identity_equal(&cur->r.id, &op->id)) {
			op->rec = *cur; /* the same identity again: nothing changes */
			o->result = json_pack("{s:I}", "epoch", (json_int_t)op->rec.r.epoch);
			op_commit(m, op, &op->rec, true, op_then_finish);
			return;
		}
		memset(&op->rec, 0, sizeof op->rec);
		op->rec.r.id = op->id;
		op->rec.r.active = true;
		op->rec.r.epoch = mgr_store_peek_epoch(mgr_store_of(m));
		op->rec.res = op->res;
		memcpy(op->rec.tmpl, op->tmpl, sizeof op->rec.tmpl);
		memcpy(op->rec.tmpl_url, op->tmpl_url, sizeof op->rec.tmpl_url);
		memcpy(op->rec.config, op->config, sizeof op->rec.config);
		memcpy(op->rec.tenant, op->tenant, sizeof op->rec.tenant);
		snprintf(op->rec.state, sizeof op->rec.state, "%s", MGR_ST_RUNNING);
		if (cur && op->id.generation == cur->r.id.generation) {
			/* activation (or placement) change of the running execution: it
			 * keeps running, with the limits and the uid range it has, and
			 * takes its new identity (guest and bridge) before the record
			 * admits it. One that does not run is not started under its
			 * generation (I2): only a new generation can start it. */
			if (!mgr_exec_alive(cur)) {
				fail(o, "not-running", "generation %llu does not run here: a start is a new generation",
				     (unsigned long long)op->id.generation);
				goto refused;
			}
			op->rec.pid = cur->pid;
			op->rec.pid_start = cur->pid_start;
			op->rec.host_pid = cur->host_pid;
			op->rec.host_start = cur->host_start;
			op->rec.res = cur->res;
			op->rec.uid_base = cur->uid_base;
			memcpy(op->rec.tmpl, cur->tmpl, sizeof op->rec.tmpl);
			memcpy(op->rec.tmpl_url, cur->tmpl_url, sizeof op->rec.tmpl_url);
			memcpy(op->rec.config, cur->config, sizeof op->rec.config);
			memcpy(op->rec.exec_name, cur->exec_name, sizeof op->rec.exec_name);
			snprintf(op->rec.state, sizeof op->rec.state, "%s", cur->state);
			op->step = 4;
			if (op_job(m, op, "activate", json_pack("{s:o,s:b}", "rec", mgr_rec_to_json(&op->rec), "thaw", 0)))
				return;
			fail(o, "io", "%s", op->job_msg);
			goto refused;
		}
		if (op->snapshot[0]) {
			/* A snapshot is copied out of the store it names into a private
			 * copy and checked against the hash the source worker reported:
			 * nothing starts from an unverified snapshot, and nothing here
			 * has changed yet when it fails. */
			json_t *args = json_pack("{s:s,s:s,s:s?,s:s}", "sandbox", op->id.sandbox, "src", op->snapshot, "hash",
			                         op->snapshot_hash[0] ? op->snapshot_hash : NULL, "tenant", op->tenant);
			if (op_job(m, op, "stage", args))
				return;
			/* not queued: job_status says so, and step 1 refuses */
		}
		op->step = 1;
	}
		__attribute__((fallthrough));
	case 1: {
		if (op->snapshot[0]) {
			if (op->job_status == SPACED_EIDENTITY) {
				fail(o, "snapshot-mismatch", "the snapshot at %s %s", op->snapshot,
				     op->snapshot_hash[0] ? "does not match its hash" : "comes without a hash");
				goto refused;
			}
			if (op->job_status < 0) {
				fail(o, op->job_status == SPACED_ENOENT ? "snapshot-missing" : "io", "cannot fetch the snapshot: %s",
				     spaced_strerror(op->job_status));
				goto refused;
			}
			const char *st = json_string_value(json_object_get(op->job_result, "staged"));
			snprintf(op->staged, sizeof op->staged, "%s", st ? st : "");
		}
		/* A new generation: R3 holds from this commit on, before the start. */
		cur = mgr_rec_find(m, op->id.sandbox);
		if (cur) {
			op->had_cur = true;
			op->old = *cur;
			snprintf(op->rec.state, sizeof op->rec.state, "%s", MGR_ST_STOPPED);
			mgr_rec_install(m, &op->rec, false, 0, NULL, install_stopped_written, op);
			return;
		}
		install_start(m, op);
		return;
	}
	case 2:
	case 3: {
		if (op->claim_write == CW_WRITING) {
			op->claim_back = true; /* claim_written goes on */
			return;
		}
		if (op->claim_write == CW_WRITTEN && claim_joined(m, op))
			return;
		if (op->claimed && op->job_status < 0) {
			/* the pooled execution was gone or refused: one started for it */
			gate_log("level=warn event=pool-claim-failed sandbox=%s reason=\"%s\"", op->id.sandbox, op->job_msg);
			/* whatever is left of it goes: it never serves anyone; when its
			 * template changed under the pool, every pooled one on it goes */
			gate_job(m, "stop", json_pack("{s:o}", "rec", mgr_rec_to_json(&op->rec)), on_background_job,
			         (uintptr_t)"stop");
			if (op->job_status == SPACED_EIDENTITY && op->rec.tmpl[0])
				pool_drain_template(m, op->rec.tmpl);
			op->claimed = false;
			op->rec.pid = op->rec.pid_start = 0;
			op->rec.host_pid = 0;
			op->rec.host_start = 0;
			op->rec.uid_base = 0;
			op->rec.exec_name[0] = 0;
			op->step = 2;
			if (start_job(m, op))
				return;
			op->step = 3;
		}
		if (op->staged[0])
			gate_job(m, "unstage", json_pack("{s:s}", "staged", op->staged), on_background_job,
			         (uintptr_t)"unstage");
		struct mgr_rec started;
		if (op->job_status < 0 || mgr_rec_from_json(json_object_get(op->job_result, "rec"), &started) < 0) {
			snprintf(op->rec.state, sizeof op->rec.state, "%s", MGR_ST_STOPPED);
			op->rec.pid = op->rec.pid_start = 0;
			op->rec.host_pid = 0;
			op->rec.host_start = 0;
			if (op->job_status == SPACED_EBUSY)
				fail(o, "no-uid-range", "every uid range of this worker is in use");
			else
				fail(o, "launch-failed", "cannot start the execution: %s",
				     op->job_msg[0] ? op->job_msg : spaced_strerror(op->job_status));
			op_commit(m, op, &op->rec, false, op_then_finish);
			return;
		}
		op->rec.pid = started.pid;
		op->rec.pid_start = started.pid_start;
		op->rec.host_pid = started.host_pid;
		op->rec.host_start = started.host_start;
		op->rec.uid_base = started.uid_base;
		snprintf(op->rec.state, sizeof op->rec.state, "%s", MGR_ST_RUNNING);
		started_result(op, json_object_get(op->job_result, "gateway"));
		/* written with the other writes queued meanwhile (gate_commit.c):
		 * one wait for the disk for all of them */
		op_commit(m, op, &op->rec, op->had_cur, install_written);
		return;
	}
	case 5: { /* step 0's activation change: the execution took its new identity */
		struct mgr_rec got;
		if (op->job_status < 0 || mgr_rec_from_json(json_object_get(op->job_result, "rec"), &got) < 0) {
			fail(o, "not-running", "the execution did not take its new activation: %s",
			     op->job_msg[0] ? op->job_msg : spaced_strerror(op->job_status));
			goto refused;
		}
		op->rec.host_pid = got.host_pid;
		op->rec.host_start = got.host_start;
		op->rec.r.active = true;
		op->rec.r.epoch = mgr_store_peek_epoch(mgr_store_of(m));
		o->result = epoch_result(m, &op->rec);
		op_commit(m, op, &op->rec, false, op_then_finish);
		return;
	}
	}
refused:
	op_done_no_record(m, op);
}

/* The tombstone is on disk: the execution it ended is paused (kept) or
 * stopped; the operation is over when that is done. */
static void deactivate_written(struct mgr *m, struct ctl_op *op, int e)
{
	if (e < 0 || !op->same_exec) {
		op_finish(m, op);
		return;
	}
	op->step = 1;
	bool queued = op->keep
	                  ? op_job(m, op, "pause", json_pack("{s:o,s:b}", "rec", mgr_rec_to_json(&op->rec), "pause", 1))
	                  : op_job(m, op, "stop", json_pack("{s:o}", "rec", mgr_rec_to_json(&op->old)));
	if (!queued)
		op_finish(m, op);
}

static void run_deactivate(struct mgr *m, struct ctl_op *op)
{
	static const char *const allowed[] = {"seq", "type", "identity", "keep_paused", NULL};
	struct outcome *o = &op->o;
	if (op->step > 0) {
		/* the stop or the freeze that followed the acknowledgement */
		if (op->job_status < 0)
			gate_log("level=warn event=deactivate-job sandbox=%s reason=\"%s\"", op->id.sandbox, op->job_msg);
		op_finish(m, op);
		return;
	}
	json_t *jk = json_object_get(op->msg, "keep_paused");
	if (only_members(op->msg, allowed) < 0) {
		fail(o, "bad-message", "unknown member");
		goto refused;
	}
	if (get_identity(op->msg, &op->id, o) < 0)
		goto refused;
	if (jk && !json_is_boolean(jk)) {
		fail(o, "bad-message", "keep_paused must be a boolean");
		goto refused;
	}
	op->keep = jk && json_is_true(jk);
	if (strcmp(op->id.worker, mgr_worker_id(m)) != 0) {
		fail(o, "wrong-worker", "identity names worker %s", op->id.worker);
		goto refused;
	}
	const struct mgr_rec *cur = mgr_rec_find(m, op->id.sandbox);
	if (cur && op->id.generation < cur->r.id.generation) {
		o->result = json_pack("{s:I,s:b}", "epoch", (json_int_t)cur->r.epoch, "superseded", 1);
		struct mgr_rec same = *cur;
		op_commit(m, op, &same, true, op_then_finish);
		return;
	}
	struct mgr_rec rec;
	memset(&rec, 0, sizeof rec);
	if (cur)
		rec = *cur;
	rec.r.id = op->id;
	rec.r.active = false;
	rec.r.epoch = mgr_store_peek_epoch(mgr_store_of(m));
	/* an execution that ended under its record is no longer there to keep */
	bool same_exec = cur && cur->r.id.generation == op->id.generation && cur->pid > 0 &&
	                 strcmp(cur->state, MGR_ST_ENDED) != 0;
	struct mgr_rec running = rec;
	snprintf(rec.state, sizeof rec.state, "%s", same_exec && op->keep ? MGR_ST_KEPT : MGR_ST_STOPPED);
	if (!same_exec || !op->keep) {
		rec.pid = 0;
		rec.pid_start = 0;
		rec.host_pid = 0;
		rec.host_start = 0;
	}
	o->result = json_pack("{s:I,s:s}", "epoch", (json_int_t)rec.r.epoch, "state", rec.state);
	/* the tombstone first (it refuses at once) and acknowledged once on
	 * disk: R3 holds from here */
	op->rec = rec;
	op->old = running;
	op->same_exec = same_exec;
	op_commit(m, op, &rec, false, deactivate_written);
	return;
refused:
	op_done_no_record(m, op);
}

static void run_pause_thaw(struct mgr *m, struct ctl_op *op)
{
	static const char *const allowed[] = {"seq", "type", "identity", NULL};
	struct outcome *o = &op->o;
	bool pause = op->kind == K_PAUSE;
	if (op->step == 0) {
		if (only_members(op->msg, allowed) < 0) {
			fail(o, "bad-message", "unknown member");
			goto refused;
		}
		if (get_identity(op->msg, &op->id, o) < 0)
			goto refused;
		if (!pause && gate_fenced(m)) {
			fail(o, "fenced", "the worker lost its control plane; nothing wakes here until it is back");
			goto refused;
		}
		const struct mgr_rec *cur = mgr_rec_find(m, op->id.sandbox);
		if (!cur) {
			fail(o, "unknown-sandbox", "no record of %s", op->id.sandbox);
			goto refused;
		}
		if (!cur->r.active || !spaced_identity_equal(&cur->r.id, &op->id)) {
			fail(o, "identity-mismatch", "not the serving execution");
			goto refused;
		}
		op->rec = *cur;
		if (!mgr_exec_alive(&op->rec)) {
			fail(o, "bad-state", "the execution is not running");
			goto refused;
		}
		op->step = 1;
		if (op_job(m, op, "pause", json_pack("{s:o,s:b}", "rec", mgr_rec_to_json(&op->rec), "pause", pause)))
			return;
	}
	if (op->job_status < 0) {
		fail(o, "bad-state", "the execution is not running");
		goto refused;
	}
	/* the record is as step 0 read it: operations of one sandbox run one
	 * after the other */
	snprintf(op->rec.state, sizeof op->rec.state, "%s", pause ? MGR_ST_PAUSED : MGR_ST_RUNNING);
	op->rec.paused_mono = pause ? spaced_mono_ns() : 0;
	o->result = json_pack("{s:s}", "state", op->rec.state);
	op_commit(m, op, &op->rec, true, op_then_finish);
	return;
refused:
	op_done_no_record(m, op);
}

static void run_snapshot(struct mgr *m, struct ctl_op *op)
{
	static const char *const allowed[] = {"seq", "type", "identity", "path", "url", NULL};
	struct outcome *o = &op->o;
	if (op->step == 0) {
		/* a path both workers read (a shared store), or the store's URL
		 * that the snapshot's archive is uploaded to */
		json_t *jp = json_object_get(op->msg, "path"), *ju = json_object_get(op->msg, "url");
		bool url = ju != NULL;
		if (url && jp) {
			fail(o, "bad-message", "a path or a url, not both");
			goto refused;
		}
		if (url) {
			jp = ju;
			if (!json_is_string(ju) || strncmp(json_string_value(ju), "http", 4) != 0) {
				fail(o, "bad-message", "url must be an http URL");
				goto refused;
			}
		}
		if (only_members(op->msg, allowed) < 0) {
			fail(o, "bad-message", "unknown member");
			goto refused;
		}
		if (get_identity(op->msg, &op->id, o) < 0)
			goto refused;
		if (!json_is_string(jp) || json_string_length(jp) >= sizeof op->path) {
			fail(o, "bad-message", "path missing");
			goto refused;
		}
		snprintf(op->path, sizeof op->path, "%s", json_string_value(jp));
		const struct mgr_rec *cur = mgr_rec_find(m, op->id.sandbox);
		if (!cur || !spaced_identity_equal(&cur->r.id, &op->id)) {
			fail(o, "identity-mismatch", "not this worker's execution");
			goto refused;
		}
		if (strcmp(cur->state, MGR_ST_PAUSED) != 0 && strcmp(cur->state, MGR_ST_KEPT) != 0) {
			fail(o, "bad-state", "the execution is %s, not paused", cur->state);
			goto refused;
		}
		op->rec = *cur;
		op->step = 1;
		if (op_job(m, op, "snapshot",
		           json_pack("{s:o,s:s}", "rec", mgr_rec_to_json(&op->rec), url ? "url" : "path", op->path)))
			return;
	}
	if (op->job_status < 0) {
		fail(o, "io", "%s", op->job_msg[0] ? op->job_msg : spaced_strerror(op->job_status));
		goto refused;
	}
	o->result = json_incref(op->job_result);
	op_commit(m, op, &op->rec, true, op_then_finish);
	return;
refused:
	op_done_no_record(m, op);
}

/* The destroyed tombstone is on disk: its execution stops. */
static void destroy_written(struct mgr *m, struct ctl_op *op, int e)
{
	if (e < 0) {
		op_finish(m, op);
		return;
	}
	op->step = 1; /* the stop's completion makes it 2 */
	if (!op_job(m, op, "stop", json_pack("{s:o}", "rec", mgr_rec_to_json(&op->old))))
		op_finish(m, op);
}

static void run_destroy(struct mgr *m, struct ctl_op *op)
{
	static const char *const allowed[] = {"seq", "type", "sandbox", NULL};
	struct outcome *o = &op->o;
	if (op->step == 2) {
		/* stopped: its files go too */
		if (op_job(m, op, "remove", json_pack("{s:s}", "sandbox", op->rec.r.id.sandbox)))
			return;
		op->step = 3;
	}
	if (op->step >= 3) {
		op_finish(m, op);
		return;
	}
	json_t *js = json_object_get(op->msg, "sandbox");
	if (only_members(op->msg, allowed) < 0) {
		fail(o, "bad-message", "unknown member");
		goto refused;
	}
	if (!json_is_string(js) || !spaced_name_valid(json_string_value(js), json_string_length(js))) {
		fail(o, "bad-message", "sandbox missing or invalid");
		goto refused;
	}
	const struct mgr_rec *cur = mgr_rec_find(m, json_string_value(js));
	if (!cur) {
		o->result = json_object();
		goto refused; /* nothing to destroy: the acknowledgement alone */
	}
	struct mgr_rec rec = *cur, running = *cur;
	rec.r.active = false;
	rec.r.epoch = mgr_store_peek_epoch(mgr_store_of(m));
	rec.pid = 0;
	rec.pid_start = 0;
	rec.host_pid = 0;
	rec.host_start = 0;
	snprintf(rec.state, sizeof rec.state, "%s", MGR_ST_DESTROYED);
	o->result = json_pack("{s:I}", "epoch", (json_int_t)rec.r.epoch);
	op->rec = rec;
	op->old = running;
	op_commit(m, op, &rec, false, destroy_written);
	return;
refused:
	op_done_no_record(m, op);
}

static void run_keys(struct mgr *m, struct ctl_op *op)
{
	static const char *const allowed[] = {"seq", "type", "bundle", NULL};
	struct outcome *o = &op->o;
	json_t *b = json_object_get(op->msg, "bundle");
	if (only_members(op->msg, allowed) < 0 || !json_is_object(b)) {
		fail(o, "bad-message", "bundle missing");
	} else {
		char *s = json_dumps(b, JSON_COMPACT);
		uint64_t ver = 0;
		int e = s ? mgr_keys_install(m, s, strlen(s), &ver) : SPACED_ENOMEM;
		free(s);
		if (e == SPACED_ESTALE)
			fail(o, "stale", "bundle version is lower than the installed one");
		else if (e < 0)
			fail(o, "bad-bundle", "bundle refused: %s", spaced_strerror(e));
		else
			o->result = json_pack("{s:I}", "version", (json_int_t)ver);
	}
	op_done_no_record(m, op);
}

/* After a restart of sbx-manager: an execution whose processes run gets a
 * bridge that admits this executor; one recorded as running whose processes
 * are gone is started again (its files are kept in development mode; in
 * substrate mode a generation starts from nothing but its snapshot). */
/* The execution of cur died under it (why says how it was found): the
 * record becomes a tombstone in state "ended" under a new epoch — requests
 * and streams of it get REFRESH_ROUTE from now on (R3, S1) — its bridge ends,
 * what is left of it is reaped (the executor's "reap"), and the control
 * plane is told, which marks the sandbox failed; only it can start another
 * generation (I2). The launcher's pid stays in the record: its uid range is
 * not handed out again before a new install replaces it. */
struct ending {
	struct mgr_rec rec;
	char why[128];
};

static void ended_written(struct mgr *m, void *ctx, int e)
{
	struct ending *end = ctx;
	if (e == 0) {
		const struct mgr_rec *rec = &end->rec;
		gate_log("level=warn event=execution-ended sandbox=%s generation=%llu pid=%lld reason=\"%s\"",
		         rec->r.id.sandbox, (unsigned long long)rec->r.id.generation, (long long)rec->pid, end->why);
		gate_admin_ended(m, rec, end->why);
		/* what its launcher could not clean up: its cgroups, and in them the
		 * tasks of a paused execution, which stay frozen (holding their
		 * memory, their mount namespace and so the loop device of its disk)
		 * until thawed and killed */
		gate_job(m, "reap", json_object(), NULL, 0);
	}
	free(end);
}

static void end_execution(struct mgr *m, const struct mgr_rec *cur, const char *why)
{
	struct mgr_rec rec = *cur;
	rec.r.active = false;
	rec.r.epoch = mgr_store_peek_epoch(mgr_store_of(m));
	snprintf(rec.state, sizeof rec.state, "%s", MGR_ST_ENDED);
	if (rec.host_pid > 0)
		(void)spaced_pid_signal_expected((pid_t)rec.host_pid, rec.host_start, SIGKILL);
	rec.host_pid = 0;
	rec.host_start = 0;
	struct ending *end = malloc(sizeof *end);
	if (!end)
		return;
	end->rec = rec;
	snprintf(end->why, sizeof end->why, "%s", why);
	/* the tombstone refuses at once; the rest once it is on disk */
	mgr_rec_install(m, &rec, false, 0, NULL, ended_written, end);
}

bool gate_rec_serving(const struct mgr_rec *r)
{
	return r->r.active && (strcmp(r->state, MGR_ST_RUNNING) == 0 || strcmp(r->state, MGR_ST_PAUSED) == 0);
}

/* `ended` (internal, from gate_watch.c): the launcher op->rec names ended. */
static void run_ended(struct mgr *m, struct ctl_op *op)
{
	const struct mgr_rec *cur = mgr_rec_find(m, op->id.sandbox);
	/* the launcher's pid and start time pin the execution (an activation
	 * change keeps it; a new generation has another) */
	if (cur && gate_rec_serving(cur) && cur->pid == op->rec.pid && cur->pid_start == op->rec.pid_start)
		end_execution(m, cur, "its launcher ended while its record says it runs");
	op_finish(m, op);
}

/* An operation of the gate's own (no seq, nothing acknowledged) on the record
 * of sandbox, or NULL when there is none; queued by the caller. */
static struct ctl_op *internal_op(struct mgr *m, const char *sandbox, enum ctl_kind kind)
{
	const struct mgr_rec *r = mgr_rec_find(m, sandbox);
	struct ctl_op *op = r ? calloc(1, sizeof *op) : NULL;
	if (!op)
		return NULL;
	op->kind = kind;
	op->t0 = spaced_mono_ns();
	op->id = r->r.id;
	return op;
}

void gate_ctl_ended(struct mgr *m, const char *sandbox, int64_t pid, uint64_t start)
{
	struct ctl_op *op = internal_op(m, sandbox, K_ENDED);
	if (!op)
		return;
	op->rec.pid = pid;
	op->rec.pid_start = start;
	op_enqueue(m, op, sandbox);
}

/* At the gate's start: an execution still running gets a new bridge; one
 * that died while no gate watched it ended (end_execution): it is not
 * started again under its generation (I2). */
static void recovered_written(struct mgr *m, void *ctx, int e)
{
	(void)e;
	op_finish(m, ctx);
}

static void run_recover(struct mgr *m, struct ctl_op *op)
{
	if (op->step == 0) {
		const struct mgr_rec *cur = mgr_rec_find(m, op->id.sandbox);
		if (!cur) {
			op_finish(m, op);
			return;
		}
		op->rec = *cur;
		op->step = 1;
		if (op->claim_cut && gate_rec_serving(cur) && mgr_exec_alive(cur)) {
			/* written while its claim went on (claim_write_start), and the
			 * gate stopped before the claim ended: the execution may never
			 * have taken its identity, and never serves it */
			gate_job(m, "stop", json_pack("{s:o}", "rec", mgr_rec_to_json(cur)), on_background_job,
			         (uintptr_t)"stop");
			end_execution(m, cur, "its claim did not finish before the worker stopped");
			op_finish(m, op);
			return;
		}
		if (mgr_exec_alive(&op->rec)) {
			if (!m->cfg->launch_bin || !m->cfg->host_bin) {
				op_finish(m, op); /* development mode: no bridge */
				return;
			}
			if (!op_job(m, op, "rebridge", json_pack("{s:o}", "rec", mgr_rec_to_json(&op->rec))))
				op_finish(m, op);
			return;
		}
		if (gate_rec_serving(cur))
			end_execution(m, cur, "found ended when the worker started");
		op_finish(m, op);
		return;
	}
	struct mgr_rec got;
	const struct mgr_rec *cur = mgr_rec_find(m, op->id.sandbox);
	if (op->job_status == 0 && mgr_rec_from_json(json_object_get(op->job_result, "rec"), &got) == 0 && cur &&
	    cur->r.epoch == op->rec.r.epoch) {
		struct mgr_rec rec = *cur;
		rec.host_pid = got.host_pid;
		rec.host_start = got.host_start;
		mgr_rec_install(m, &rec, true, 0, NULL, recovered_written, op);
		return;
	}
	gate_log("level=warn event=recovery-failed sandbox=%s reason=\"%s\"", op->id.sandbox, op->job_msg);
	op_finish(m, op);
}

/* `net`: the sandbox's egress policy changes live (docs/network.md). The
 * executor stores it and, when this worker runs the sandbox, applies it to
 * the execution's filter before the acknowledgement. */
static void run_net(struct mgr *m, struct ctl_op *op)
{
	static const char *const allowed[] = {"seq", "type", "sandbox", "network", NULL};
	struct outcome *o = &op->o;
	json_t *js = json_object_get(op->msg, "sandbox"), *jn = json_object_get(op->msg, "network");
	if (op->step == 0) {
		if (only_members(op->msg, allowed) < 0 || !json_is_string(js) ||
		    !spaced_name_valid(json_string_value(js), json_string_length(js)) || !json_is_object(jn)) {
			fail(o, "bad-message", "a net message names a sandbox and its network");
			goto refused;
		}
		json_t *args = json_pack("{s:O,s:O}", "sandbox", js, "network", jn);
		const struct mgr_rec *cur = mgr_rec_find(m, json_string_value(js));
		if (args && cur && cur->r.active && cur->pid > 0)
			json_object_set_new(args, "rec", mgr_rec_to_json(cur));
		op->step = 1;
		if (op_job(m, op, "net", args))
			return;
	}
	if (op->job_status < 0) {
		fail(o, op->job_status == SPACED_EINVAL ? "bad-policy" : "io", "%s",
		     op->job_msg[0] ? op->job_msg : spaced_strerror(op->job_status));
		goto refused;
	}
	o->result = json_incref(op->job_result);
refused:
	op_done_no_record(m, op);
}

static void op_run(struct mgr *m, struct ctl_op *op)
{
	switch (op->kind) {
	case K_KEYS: run_keys(m, op); return;
	case K_INSTALL: run_install(m, op); return;
	case K_DEACTIVATE: run_deactivate(m, op); return;
	case K_PAUSE:
	case K_THAW: run_pause_thaw(m, op); return;
	case K_SNAPSHOT: run_snapshot(m, op); return;
	case K_DESTROY: run_destroy(m, op); return;
	case K_RECOVER: run_recover(m, op); return;
	case K_NET: run_net(m, op); return;
	case K_ENDED: run_ended(m, op); return;
	}
}

/* Queues op behind the operations of its sandbox; runs it when it is first. */
static void op_enqueue(struct mgr *m, struct ctl_op *op, const char *sandbox)
{
	struct ctl_queue *q = queue_of(m, sandbox, true);
	if (!q) {
		fail(&op->o, "io", "out of memory");
		char *line = ack_line(0, &op->o);
		if (op->reply)
			op->reply(m, op->reply_ctx, line);
		free(line);
		op_free(op);
		return;
	}
	op->q = q;
	if (q->tail)
		q->tail->next = op;
	else
		q->head = op;
	q->tail = op;
	if (q->head == op)
		op_run(m, op);
}

/* ---- entry points ---- */

static const struct {
	const char *type;
	enum ctl_kind kind;
} types[] = {
	{"keys", K_KEYS},         {"install", K_INSTALL}, {"deactivate", K_DEACTIVATE}, {"pause", K_PAUSE},
	{"thaw", K_THAW},         {"snapshot", K_SNAPSHOT}, {"destroy", K_DESTROY},
	{"net", K_NET},
};

static void reply_now(struct mgr *m, gate_reply_fn reply, uintptr_t ctx, uint64_t seq, struct outcome *o)
{
	char *line = ack_line(seq, o);
	reply(m, ctx, line);
	free(line);
	json_decref(o->result);
}

void gate_ctl_submit(struct mgr *m, const char *text, size_t len, gate_reply_fn reply, uintptr_t ctx)
{
	json_error_t jerr;
	struct outcome o;
	memset(&o, 0, sizeof o);
	json_t *msg = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	json_t *jt = json_object_get(msg, "type"), *js = json_object_get(msg, "seq");
	if (!msg || !json_is_object(msg)) {
		fail(&o, "bad-message", "not a JSON object");
		goto now;
	}
	if (!json_is_string(jt)) {
		fail(&o, "bad-message", "type missing");
		goto now;
	}
	if (strcmp(json_string_value(jt), "status") == 0) {
		o.result = mgr_status_json(m);
		goto now;
	}
	if (strcmp(json_string_value(jt), "durable") == 0) {
		/* the control plane's commits through seq N are on its disk (no
		 * acknowledgement: it is no control message of a seq) */
		json_t *th = json_object_get(msg, "through");
		if (json_is_integer(th) && json_integer_value(th) > 0)
			gate_commit_durable(m, (uint64_t)json_integer_value(th));
		else
			gate_log("level=warn event=bad-message reason=\"durable without a positive through\"");
		reply(m, ctx, NULL);
		json_decref(msg);
		return;
	}
	if (strcmp(json_string_value(jt), "lease") == 0 || strcmp(json_string_value(jt), "unfence") == 0) {
		const char *why = NULL;
		if ((o.result = gate_fence_admin(m, msg, &why)) == NULL)
			fail(&o, "bad-message", "%s", why);
		goto now;
	}
	enum ctl_kind kind = 0;
	for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
		if (strcmp(types[i].type, json_string_value(jt)) == 0)
			kind = types[i].kind;
	if (!kind) {
		fail(&o, "unknown-type", "unknown message type");
		goto now;
	}
	uint64_t seq;
	if (js) {
		if (!json_is_integer(js) || json_integer_value(js) < 1) {
			fail(&o, "bad-message", "seq must be a positive integer");
			goto now;
		}
		seq = (uint64_t)json_integer_value(js);
		/* still in progress: its acknowledgement goes to the latest asker.
		 * Looked at first: a claimed execution's acknowledgement is stored
		 * before its claim ends (claim_write_start), and is not one yet */
		struct ctl_op *inflight = op_with_seq(m, seq);
		if (inflight && !inflight->replied) {
			gate_log("level=info event=sent-again-in-progress seq=%llu", (unsigned long long)seq);
			/* one acknowledgement, to the latest asker: the earlier one's
			 * request ends without one */
			if (inflight->reply)
				inflight->reply(m, inflight->reply_ctx, NULL);
			inflight->reply = reply;
			inflight->reply_ctx = ctx;
			json_decref(msg);
			return;
		}
		/* at most once: a stored acknowledgement again, without effect */
		char *line = NULL;
		if (mgr_store_ack(mgr_store_of(m), seq, &line) == 0) {
			reply(m, ctx, line);
			free(line);
			json_decref(msg);
			return;
		}
		if (inflight) { /* replied, and its acknowledgement not stored: asked again later */
			reply(m, ctx, NULL);
			json_decref(msg);
			return;
		}
		/* applied so long ago that its acknowledgement was pruned: never
		 * applied twice, answered as such */
		if (seq <= mgr_store_acks_pruned_to(mgr_store_of(m))) {
			fail(&o, "ack-pruned", "seq %llu was applied long ago; its acknowledgement is no longer kept",
			     (unsigned long long)seq);
			reply_now(m, reply, ctx, seq, &o);
			json_decref(msg);
			return;
		}
	} else {
		/* local callers may leave the numbering to the worker */
		uint64_t hi = highest_pending_seq(m), last = mgr_store_last_seq(mgr_store_of(m));
		seq = (hi > last ? hi : last) + 1;
	}
	struct ctl_op *op = calloc(1, sizeof *op);
	if (!op) {
		fail(&o, "io", "out of memory");
		goto now;
	}
	op->kind = kind;
	op->seq = seq;
	op->t0 = spaced_mono_ns();
	op->msg = msg;
	op->reply = reply;
	op->reply_ctx = ctx;
	/* the sandbox a message is about orders it among the others */
	const char *sandbox = "";
	if ((kind == K_DESTROY || kind == K_NET) && json_is_string(json_object_get(msg, "sandbox")))
		sandbox = json_string_value(json_object_get(msg, "sandbox"));
	else if (kind != K_KEYS) {
		json_t *sb = json_object_get(json_object_get(msg, "identity"), "sandbox");
		if (json_is_string(sb))
			sandbox = json_string_value(sb);
	}
	char key[SPACED_NAME_MAX];
	snprintf(key, sizeof key, "%s", spaced_name_valid(sandbox, strlen(sandbox)) ? sandbox : "");
	/* an install sent before the control plane's commit was durable: its
	 * acknowledgement is noted so until said durable (gate_commit.c) */
	json_t *tv = json_object_get(msg, "tentative");
	struct spaced_identity tid;
	if (kind == K_INSTALL && json_is_true(tv) && get_identity(msg, &tid, &o) == 0 &&
	    gate_commit_tentative(m, seq, &tid) < 0) {
		fail(&o, "io", "out of memory");
		op_free(op); /* msg with it */
		reply_now(m, reply, ctx, seq, &o);
		return;
	}
	json_decref(o.result);
	memset(&o, 0, sizeof o);
	op_enqueue(m, op, key);
	return;
now:
	reply_now(m, reply, ctx, 0, &o);
	json_decref(msg);
}

void gate_ctl_forget_requester(struct mgr *m, uintptr_t ctx)
{
	for (struct ctl_queue *q = m->ctlq; q; q = q->next)
		for (struct ctl_op *op = q->head; op; op = op->next)
			if (op->reply_ctx == ctx && !op->replied)
				op->reply = NULL;
}

bool gate_ctl_busy(struct mgr *m, const char *sandbox)
{
	for (struct ctl_queue *q = m->ctlq; q; q = q->next)
		if (q->head && strcmp(q->sandbox, sandbox) == 0)
			return true;
	return false;
}

static void recover_one(struct mgr *m, const char *sandbox, bool claim_cut)
{
	struct ctl_op *op = internal_op(m, sandbox, K_RECOVER);
	if (!op)
		return;
	op->claim_cut = claim_cut;
	op_enqueue(m, op, sandbox);
}

/* A claim that had to start its gateway again wrote its record and
 * acknowledgement first with the pooled gateway's port, then again with the
 * new one (claim_joined): a gate stopped in between left the first. The
 * control plane has not had it (the reply follows the second write) and
 * gets, for the install sent again, the port the execution's gateway listens
 * on now: each stored acknowledgement of a serving record is made to name it
 * (one pass over the acknowledgements; the records' gateways read once). */
struct gw_fix {
	struct mgr *m;
	const int *port; /* per record: its gateway's port now, -1 when not serving */
	struct gw_fixed {
		uint64_t seq;
		int port;
	} *v;
	size_t n, cap;
	bool nomem;
};

static void gw_fix_one(void *arg, uint64_t seq, uint64_t epoch, int gateway)
{
	struct gw_fix *f = arg;
	for (size_t i = 0; i < f->m->nrecs; i++) {
		if (f->m->recs[i].r.epoch != epoch)
			continue;
		if (f->port[i] < 0 || f->port[i] == gateway)
			return;
		if (f->n == f->cap) {
			size_t nc = f->cap ? f->cap * 2 : 16;
			struct gw_fixed *nv = realloc(f->v, nc * sizeof *nv);
			if (!nv) {
				f->nomem = true;
				return;
			}
			f->v = nv;
			f->cap = nc;
		}
		f->v[f->n++] = (struct gw_fixed){seq, f->port[i]};
		return;
	}
}

static void ack_gateways_fix(struct mgr *m, const int *port)
{
	struct gw_fix f = {.m = m, .port = port};
	if (mgr_store_acks_of_epochs(mgr_store_of(m), gw_fix_one, &f) == 0)
		for (size_t k = 0; k < f.n; k++)
			if (mgr_store_ack_set_gateway(mgr_store_of(m), f.v[k].seq, f.v[k].port) == 0)
				gate_log("level=warn event=ack-gateway-corrected seq=%llu gateway=%d", (unsigned long long)f.v[k].seq,
				         f.v[k].port);
	if (f.nomem)
		gate_log("level=warn event=ack-gateway-unchecked reason=\"out of memory\"");
	free(f.v);
}

void gate_ctl_recover(struct mgr *m)
{
	int *port = calloc(m->nrecs ? m->nrecs : 1, sizeof *port);
	for (size_t i = 0; i < m->nrecs; i++) {
		const struct mgr_rec *r = &m->recs[i];
		/* written while its claim went on (claim_write_start), the gate
		 * stopped before the claim ended, or the claim failed and the
		 * pooled execution was stopped before another one's record was
		 * written: the execution never serves (run_recover ends it), so its
		 * install, sent again, is refused — before any message is read. An
		 * acknowledgement the control plane had already is never asked for
		 * again: refusing it changes nothing. */
		bool serving = gate_rec_serving(r), unfinished = serving && mgr_pool_claim_unfinished(m->cfg, r),
		     gone = serving && !unfinished && strncmp(r->exec_name, "pool/", 5) == 0 && !mgr_exec_alive(r);
		bool cut = unfinished || gone;
		if (port && (!serving || cut || mgr_pool_gateway_port(m->cfg, r, &port[i]) < 0))
			port[i] = -1;
		if (cut && mgr_store_refuse_ack_of(mgr_store_of(m), r->r.epoch, "not-running",
		                                   unfinished ? "its execution did not take its identity before the worker stopped"
		                                              : "its execution ended while the worker was stopped") < 0)
			gate_log("level=warn event=ack-unrefused sandbox=%s", r->r.id.sandbox);
		bool live = strcmp(r->state, MGR_ST_RUNNING) == 0 || strcmp(r->state, MGR_ST_PAUSED) == 0 ||
		            strcmp(r->state, MGR_ST_KEPT) == 0;
		if (live && r->pid != 0)
			recover_one(m, r->r.id.sandbox, unfinished); /* a gone one ends as any found dead */
	}
	if (port)
		ack_gateways_fix(m, port);
	free(port);
}
