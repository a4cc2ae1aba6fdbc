/*
 * mgr_admin.c — the worker side of the control messages
 * (docs/control-messages.md): keys, install, deactivate, pause, thaw,
 * snapshot, destroy, plus the local `status` query. Messages are applied in
 * seq order, at most once; the acknowledgement is written in the same SQLite
 * transaction as the record it describes, so an acknowledged install is on
 * disk, and a repeated seq gets the stored acknowledgement again.
 */
#include "mgr.h"
#include "node.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

struct outcome {
	json_t *result; /* on success (owned) */
	const char *error, *code;
	char errbuf[256];
};

static int fail(struct outcome *o, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int fail(struct outcome *o, const char *code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(o->errbuf, sizeof o->errbuf, fmt, ap);
	va_end(ap);
	o->error = o->errbuf;
	o->code = code;
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

/* Commits rec with the ack of seq. */
static int commit(struct mgr *m, const struct mgr_rec *rec, bool handoff, uint64_t seq,
                  struct outcome *o, char **line)
{
	char *l = ack_line(seq, o);
	if (!l)
		return fail(o, "io", "out of memory");
	int e = mgr_rec_install(m, rec, handoff, seq, l);
	if (e < 0) {
		free(l);
		json_decref(o->result);
		o->result = NULL;
		return fail(o, e == SPACED_ESTALE ? "backwards" : "io", "cannot write the record: %s",
		            spaced_strerror(e));
	}
	*line = l;
	return 0;
}

static int do_install(struct mgr *m, json_t *msg, uint64_t seq, struct outcome *o, char **line)
{
	static const char *const allowed[] = {"seq", "type", "identity", "handoff", "spec", NULL};
	struct spaced_identity id;
	json_t *jh = json_object_get(msg, "handoff");
	json_t *spec = json_object_get(msg, "spec");
	const char *snapshot = NULL, *snapshot_hash = NULL;

	if (only_members(msg, allowed) < 0)
		return fail(o, "bad-message", "unknown member");
	if (get_identity(msg, &id, o) < 0)
		return -1;
	if (jh && !json_is_boolean(jh))
		return fail(o, "bad-message", "handoff must be a boolean");
	bool handoff = jh && json_is_true(jh);
	struct spaced_resources res = {0, 0, 0, 0};
	if (spec && !json_is_null(spec)) {
		json_t *snap = json_is_object(spec) ? json_object_get(spec, "snapshot") : NULL;
		char err[160];
		if (!json_is_object(spec))
			return fail(o, "bad-message", "spec must be an object");
		if (spaced_resources_from_json(json_object_get(spec, "resources"), &res, err, sizeof err) < 0)
			return fail(o, "bad-message", "spec.resources: %s", err);
		/* a spec stored before resources were an object of their own */
		json_t *lm = json_object_get(spec, "memory_bytes"), *lp = json_object_get(spec, "pids");
		if (res.memory_bytes == 0 && json_is_integer(lm) && json_integer_value(lm) > 0)
			res.memory_bytes = (uint64_t)json_integer_value(lm);
		if (res.pids == 0 && json_is_integer(lp) && json_integer_value(lp) > 0)
			res.pids = (uint64_t)json_integer_value(lp);
		if (snap && !json_is_null(snap)) {
			if (!json_is_string(snap) || json_string_value(snap)[0] != '/')
				return fail(o, "bad-message", "spec.snapshot must be an absolute path");
			snapshot = json_string_value(snap);
		}
		json_t *sh = json_object_get(spec, "snapshot_hash");
		if (sh && !json_is_null(sh)) {
			if (!json_is_string(sh))
				return fail(o, "bad-message", "spec.snapshot_hash must be a string");
			snapshot_hash = json_string_value(sh);
		}
	}
	if (strcmp(id.worker, mgr_worker_id(m)) != 0)
		return fail(o, "wrong-worker", "identity names worker %s, this is %s", id.worker,
		            mgr_worker_id(m));
	if (strcmp(id.substrate, "process") != 0)
		return fail(o, "unsupported-substrate", "substrate %s is not served here", id.substrate);
	/* development executions (no launcher) are plain processes: no limit can
	 * hold there, so none is accepted */
	if (!mgr_cfg(m)->launch_bin) {
		if (res.cpu_milli || res.memory_bytes || res.pids || res.disk_bytes)
			return fail(o, "limits-unsupported", "development executions cannot be held to limits");
	} else {
		/* what the install leaves out, the worker's defaults fill in; what it
		 * asks above the worker's maxima is refused, never silently lowered */
		spaced_resources_default(&res, &mgr_cfg(m)->limits_default);
	}
	const char *over = spaced_resources_exceeds(&res, &mgr_cfg(m)->limits_max);
	if (over)
		return fail(o, "limit-exceeded", "%s is above this worker's maximum", over);

	const struct mgr_rec *cur = mgr_rec_find(m, id.sandbox);
	struct mgr_rec rec;
	memset(&rec, 0, sizeof rec);
	if (cur && id.generation < cur->r.id.generation)
		return fail(o, "backwards", "generation %llu is older than the installed %llu",
		            (unsigned long long)id.generation, (unsigned long long)cur->r.id.generation);
	if (cur && id.generation == cur->r.id.generation && !cur->r.active)
		return fail(o, "deactivated", "generation %llu left this worker",
		            (unsigned long long)id.generation);
	bool same_gen = cur && id.generation == cur->r.id.generation;
	if (handoff) {
		/* S3: an ownership change on an unchanged resident */
		if (!cur || !cur->r.active || !spaced_identity_equal(&cur->r.id, &id))
			return fail(o, "identity-mismatch", "a handoff keeps the installed identity");
		rec = *cur;
		o->result = json_pack("{s:I,s:b}", "epoch", (json_int_t)rec.r.epoch, "handoff", 1);
		return commit(m, &rec, true, seq, o, line);
	}
	if (cur && cur->r.active && spaced_identity_equal(&cur->r.id, &id)) {
		rec = *cur; /* the same identity again: nothing changes */
		o->result = json_pack("{s:I}", "epoch", (json_int_t)rec.r.epoch);
		return commit(m, &rec, true, seq, o, line);
	}
	rec.r.id = id;
	rec.r.active = true;
	rec.r.epoch = mgr_store_peek_epoch(mgr_store_of(m));
	rec.res = res;
	snprintf(rec.state, sizeof rec.state, "%s", MGR_ST_RUNNING);
	if (same_gen) {
		/* activation (or placement) change of the running execution: it keeps
		 * running, with the limits and the uid range it has */
		rec.pid = cur->pid;
		rec.pid_start = cur->pid_start;
		rec.host_pid = cur->host_pid;
		rec.host_start = cur->host_start;
		rec.res = cur->res;
		rec.uid_base = cur->uid_base;
		snprintf(rec.state, sizeof rec.state, "%s", cur->state);
		o->result = json_pack("{s:I}", "epoch", (json_int_t)rec.r.epoch);
		return commit(m, &rec, false, seq, o, line);
	}
	/* A snapshot is copied out of the store it names into a private copy and
	 * checked against the hash the source worker reported: nothing starts from
	 * an unverified snapshot, and nothing here has changed yet when it fails. */
	char staged[4096] = "";
	if (snapshot) {
		int e = mgr_exec_stage_snapshot(mgr_cfg(m), id.sandbox, snapshot, snapshot_hash, staged,
		                                sizeof staged);
		if (e == SPACED_EIDENTITY)
			return fail(o, "snapshot-mismatch", "the snapshot at %s %s", snapshot,
			            snapshot_hash ? "does not match its hash" : "comes without a hash");
		if (e < 0)
			return fail(o, e == SPACED_ENOENT ? "snapshot-missing" : "io", "cannot fetch the snapshot: %s",
			            spaced_strerror(e));
	}
	/* A new generation: R3 holds from this commit on, before the start. */
	if (cur) {
		struct mgr_rec old = *cur;
		snprintf(rec.state, sizeof rec.state, "%s", MGR_ST_STOPPED);
		int e = mgr_rec_install(m, &rec, false, 0, NULL);
		if (e < 0) {
			mgr_exec_unstage(staged);
			return fail(o, e == SPACED_ESTALE ? "backwards" : "io", "cannot write the record: %s",
			            spaced_strerror(e));
		}
		mgr_exec_stop(mgr_cfg(m), &old);
	}
	int e = 0;
	if (mgr_cfg(m)->launch_bin) {
		/* a uid range no execution alive on this host holds (the old one of
		 * this sandbox has just stopped) */
		e = mgr_uid_alloc(m, &rec.uid_base);
		if (e < 0) {
			mgr_exec_unstage(staged);
			snprintf(rec.state, sizeof rec.state, "%s", MGR_ST_STOPPED);
			fail(o, "no-uid-range", "every uid range of this worker is in use");
			char *l = ack_line(seq, o);
			mgr_rec_install(m, &rec, false, seq, l);
			*line = l;
			return -1;
		}
	}
	e = mgr_exec_start(mgr_cfg(m), &rec, staged[0] ? staged : NULL);
	mgr_exec_unstage(staged);
	if (e < 0) {
		snprintf(rec.state, sizeof rec.state, "%s", MGR_ST_STOPPED);
		rec.pid = 0;
		fail(o, "launch-failed", "cannot start the execution: %s", spaced_strerror(e));
		char *l = ack_line(seq, o);
		mgr_rec_install(m, &rec, false, seq, l);
		*line = l;
		return -1;
	}
	snprintf(rec.state, sizeof rec.state, "%s", MGR_ST_RUNNING);
	o->result = json_pack("{s:I,s:I}", "epoch", (json_int_t)rec.r.epoch, "pid", (json_int_t)rec.pid);
	return commit(m, &rec, cur != NULL, seq, o, line);
}

static int do_deactivate(struct mgr *m, json_t *msg, uint64_t seq, struct outcome *o, char **line)
{
	static const char *const allowed[] = {"seq", "type", "identity", "keep_paused", NULL};
	struct spaced_identity id;
	json_t *jk = json_object_get(msg, "keep_paused");
	if (only_members(msg, allowed) < 0)
		return fail(o, "bad-message", "unknown member");
	if (get_identity(msg, &id, o) < 0)
		return -1;
	if (jk && !json_is_boolean(jk))
		return fail(o, "bad-message", "keep_paused must be a boolean");
	bool keep = jk && json_is_true(jk);
	if (strcmp(id.worker, mgr_worker_id(m)) != 0)
		return fail(o, "wrong-worker", "identity names worker %s", id.worker);
	const struct mgr_rec *cur = mgr_rec_find(m, id.sandbox);
	if (cur && id.generation < cur->r.id.generation) {
		o->result = json_pack("{s:I,s:b}", "epoch", (json_int_t)cur->r.epoch, "superseded", 1);
		struct mgr_rec same = *cur;
		return commit(m, &same, true, seq, o, line);
	}
	struct mgr_rec rec;
	memset(&rec, 0, sizeof rec);
	if (cur)
		rec = *cur;
	rec.r.id = id;
	rec.r.active = false;
	rec.r.epoch = mgr_store_peek_epoch(mgr_store_of(m));
	bool same_exec = cur && cur->r.id.generation == id.generation && cur->pid > 0;
	if (same_exec && keep) {
		mgr_exec_pause(mgr_cfg(m), &rec, true);
		snprintf(rec.state, sizeof rec.state, "%s", MGR_ST_KEPT);
	} else {
		snprintf(rec.state, sizeof rec.state, "%s", MGR_ST_STOPPED);
	}
	o->result = json_pack("{s:I,s:s}", "epoch", (json_int_t)rec.r.epoch, "state", rec.state);
	if (!same_exec || keep) {
		if (!same_exec) {
			rec.pid = 0;
			rec.pid_start = 0;
			rec.host_pid = 0;
			rec.host_start = 0;
		}
		return commit(m, &rec, false, seq, o, line);
	}
	/* tombstone first (R3 at once), then stop */
	struct mgr_rec running = rec;
	rec.pid = 0;
	rec.pid_start = 0;
	rec.host_pid = 0;
	rec.host_start = 0;
	int e = commit(m, &rec, false, seq, o, line);
	mgr_exec_stop(mgr_cfg(m), &running);
	return e;
}

static int do_pause_thaw(struct mgr *m, json_t *msg, uint64_t seq, bool pause, struct outcome *o,
                         char **line)
{
	static const char *const allowed[] = {"seq", "type", "identity", NULL};
	struct spaced_identity id;
	if (only_members(msg, allowed) < 0)
		return fail(o, "bad-message", "unknown member");
	if (get_identity(msg, &id, o) < 0)
		return -1;
	const struct mgr_rec *cur = mgr_rec_find(m, id.sandbox);
	if (!cur)
		return fail(o, "unknown-sandbox", "no record of %s", id.sandbox);
	if (!cur->r.active || !spaced_identity_equal(&cur->r.id, &id))
		return fail(o, "identity-mismatch", "not the serving execution");
	struct mgr_rec rec = *cur;
	if (mgr_exec_pause(mgr_cfg(m), &rec, pause) < 0)
		return fail(o, "bad-state", "the execution is not running");
	snprintf(rec.state, sizeof rec.state, "%s", pause ? MGR_ST_PAUSED : MGR_ST_RUNNING);
	o->result = json_pack("{s:s}", "state", rec.state);
	return commit(m, &rec, true, seq, o, line);
}

static int do_snapshot(struct mgr *m, json_t *msg, uint64_t seq, struct outcome *o, char **line)
{
	static const char *const allowed[] = {"seq", "type", "identity", "path", NULL};
	struct spaced_identity id;
	json_t *jp = json_object_get(msg, "path");
	if (only_members(msg, allowed) < 0)
		return fail(o, "bad-message", "unknown member");
	if (get_identity(msg, &id, o) < 0)
		return -1;
	if (!json_is_string(jp))
		return fail(o, "bad-message", "path missing");
	const struct mgr_rec *cur = mgr_rec_find(m, id.sandbox);
	if (!cur || !spaced_identity_equal(&cur->r.id, &id))
		return fail(o, "identity-mismatch", "not this worker's execution");
	if (strcmp(cur->state, MGR_ST_PAUSED) != 0 && strcmp(cur->state, MGR_ST_KEPT) != 0)
		return fail(o, "bad-state", "the execution is %s, not paused", cur->state);
	uint64_t bytes = 0;
	int e = mgr_exec_snapshot(mgr_cfg(m), cur, json_string_value(jp), &bytes);
	if (e < 0)
		return fail(o, "io", "snapshot failed: %s", spaced_strerror(e));
	char hex[MGR_HASH_HEX];
	if ((e = mgr_snapshot_hash(json_string_value(jp), hex, &bytes)) < 0)
		return fail(o, "io", "cannot hash the snapshot: %s", spaced_strerror(e));
	o->result = json_pack("{s:s,s:I,s:s}", "path", json_string_value(jp), "bytes", (json_int_t)bytes, "hash",
	                      hex);
	struct mgr_rec same = *cur;
	return commit(m, &same, true, seq, o, line);
}

static int do_destroy(struct mgr *m, json_t *msg, uint64_t seq, struct outcome *o, char **line)
{
	static const char *const allowed[] = {"seq", "type", "sandbox", NULL};
	json_t *js = json_object_get(msg, "sandbox");
	if (only_members(msg, allowed) < 0)
		return fail(o, "bad-message", "unknown member");
	if (!json_is_string(js) || !spaced_name_valid(json_string_value(js), json_string_length(js)))
		return fail(o, "bad-message", "sandbox missing or invalid");
	const struct mgr_rec *cur = mgr_rec_find(m, json_string_value(js));
	if (!cur) {
		o->result = json_object();
		return 0;
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
	int e = commit(m, &rec, false, seq, o, line);
	if (e == 0) {
		mgr_exec_stop(mgr_cfg(m), &running);
		mgr_exec_remove(mgr_cfg(m), rec.r.id.sandbox);
	}
	return e;
}

static int do_keys(struct mgr *m, json_t *msg, uint64_t seq, struct outcome *o, char **line)
{
	static const char *const allowed[] = {"seq", "type", "bundle", NULL};
	(void)seq;
	(void)line;
	json_t *b = json_object_get(msg, "bundle");
	if (only_members(msg, allowed) < 0 || !json_is_object(b))
		return fail(o, "bad-message", "bundle missing");
	char *s = json_dumps(b, JSON_COMPACT);
	if (!s)
		return fail(o, "io", "out of memory");
	uint64_t ver = 0;
	int e = mgr_keys_install(m, s, strlen(s), &ver);
	free(s);
	if (e == SPACED_ESTALE)
		return fail(o, "stale", "bundle version is lower than the installed one");
	if (e < 0)
		return fail(o, "bad-bundle", "bundle refused: %s", spaced_strerror(e));
	o->result = json_pack("{s:I}", "version", (json_int_t)ver);
	return 0;
}

typedef int (*handler_fn)(struct mgr *m, json_t *msg, uint64_t seq, struct outcome *o, char **line);

static int do_pause(struct mgr *m, json_t *msg, uint64_t seq, struct outcome *o, char **line)
{
	return do_pause_thaw(m, msg, seq, true, o, line);
}
static int do_thaw(struct mgr *m, json_t *msg, uint64_t seq, struct outcome *o, char **line)
{
	return do_pause_thaw(m, msg, seq, false, o, line);
}

static const struct {
	const char *type;
	handler_fn fn;
} table[] = {
	{"keys", do_keys},       {"install", do_install}, {"deactivate", do_deactivate},
	{"pause", do_pause},     {"thaw", do_thaw},       {"snapshot", do_snapshot},
	{"destroy", do_destroy},
};

int mgr_admin_handle(struct mgr *m, const char *text, size_t len, char **reply)
{
	json_error_t jerr;
	struct outcome o;
	uint64_t seq = 0;
	char *line = NULL;

	memset(&o, 0, sizeof o);
	json_t *msg = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!msg || !json_is_object(msg)) {
		fail(&o, "bad-message", "not a JSON object");
		goto out;
	}
	json_t *jt = json_object_get(msg, "type");
	json_t *js = json_object_get(msg, "seq");
	if (!json_is_string(jt)) {
		fail(&o, "bad-message", "type missing");
		goto out;
	}
	if (strcmp(json_string_value(jt), "status") == 0) {
		o.result = mgr_status_json(m);
		goto out;
	}
	uint64_t last = mgr_store_last_seq(mgr_store_of(m));
	if (js) {
		if (!json_is_integer(js) || json_integer_value(js) < 1) {
			fail(&o, "bad-message", "seq must be a positive integer");
			goto out;
		}
		seq = (uint64_t)json_integer_value(js);
		if (seq <= last) {
			/* at most once: the stored acknowledgement, without effect */
			if (mgr_store_ack(mgr_store_of(m), seq, &line) == 0) {
				*reply = line;
				json_decref(msg);
				return 0;
			}
			fail(&o, "unknown-seq", "seq %llu was not applied here", (unsigned long long)seq);
			seq = 0;
			goto out;
		}
	} else {
		seq = last + 1; /* local callers may leave the numbering to the worker */
	}
	handler_fn fn = NULL;
	for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
		if (strcmp(table[i].type, json_string_value(jt)) == 0)
			fn = table[i].fn;
	if (!fn) {
		fail(&o, "unknown-type", "unknown message type");
		seq = 0;
		goto out;
	}
	fn(m, msg, seq, &o, &line);
	if (line) {
		*reply = line;
		json_decref(o.result);
		json_decref(msg);
		return o.error ? -1 : 0;
	}
	/* not yet durable (an error before any record change, or keys): store the ack alone */
	line = ack_line(seq, &o);
	if (line && mgr_store_commit(mgr_store_of(m), NULL, seq, line) < 0) {
		free(line);
		line = NULL;
		json_decref(o.result);
		o.result = NULL;
		fail(&o, "io", "cannot write the acknowledgement");
		seq = 0;
	}
	if (line) {
		*reply = line;
		json_decref(o.result);
		json_decref(msg);
		return o.error ? -1 : 0;
	}
out:
	*reply = ack_line(seq, &o);
	json_decref(o.result);
	json_decref(msg);
	return o.error ? -1 : 0;
}
