/*
 * mgr_store.c — the worker's runtime records in SQLite: WAL journal,
 * synchronous=FULL, so a committed transaction survives kill -9 of any spaced
 * process (and power loss). A trigger refuses any update that moves a
 * sandbox's generation or epoch backwards.
 */
#include "mgr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "spaced_error.h"

/* The statements every install runs, prepared once and reset after each use. */
enum { ST_PUT, ST_ACK, ST_ACK_GET, ST_META, ST_GONE, ST_TENT, ST_TENT_DEL, ST_N };

struct mgr_store {
	sqlite3 *db;
	sqlite3_stmt *stmt[ST_N];
	uint64_t next_epoch;
	uint64_t last_seq;
	uint64_t acks_pruned_to; /* acknowledgements at or below it may be gone */
	uint64_t tentative_kept_to; /* the tentative notes at or below it are deleted (this connection's) */
};

static const char schema[] =
	"PRAGMA journal_mode=WAL;"
	"PRAGMA synchronous=FULL;"
	"CREATE TABLE IF NOT EXISTS records ("
	" sandbox TEXT PRIMARY KEY, generation INTEGER NOT NULL, worker TEXT NOT NULL,"
	" substrate TEXT NOT NULL, activation TEXT NOT NULL, pod_uid TEXT NOT NULL,"
	" epoch INTEGER NOT NULL, active INTEGER NOT NULL, state TEXT NOT NULL,"
	" pid INTEGER NOT NULL, pid_start INTEGER NOT NULL,"
	" host_pid INTEGER NOT NULL DEFAULT 0, host_start INTEGER NOT NULL DEFAULT 0,"
	" uid_base INTEGER NOT NULL DEFAULT 0, cpu_milli INTEGER NOT NULL DEFAULT 0,"
	" memory_bytes INTEGER NOT NULL DEFAULT 0, pids INTEGER NOT NULL DEFAULT 0,"
	" disk_bytes INTEGER NOT NULL DEFAULT 0);"
	"CREATE TRIGGER IF NOT EXISTS records_forward BEFORE UPDATE ON records"
	" WHEN NEW.generation < OLD.generation OR NEW.epoch < OLD.epoch"
	" BEGIN SELECT RAISE(ABORT, 'identity going backwards'); END;"
	"CREATE TABLE IF NOT EXISTS acks (seq INTEGER PRIMARY KEY, line TEXT NOT NULL);"
	"CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL);"
	/* forgotten records: the highest generation each had (never started again) */
	"CREATE TABLE IF NOT EXISTS gone (sandbox TEXT PRIMARY KEY, generation INTEGER NOT NULL);"
	/* installs applied that were sent tentative, until said durable
	 * (docs/control-messages.md "Tentative installs") */
	"CREATE TABLE IF NOT EXISTS tentative (seq INTEGER PRIMARY KEY, sandbox TEXT NOT NULL, activation TEXT NOT NULL);";

/* Columns added since the first schema: a store made before them gains them
 * (0: no limits recorded, no uid range). */
static const struct {
	const char *name, *type;
} added_columns[] = {
	{"uid_base", "INTEGER NOT NULL DEFAULT 0"},     {"cpu_milli", "INTEGER NOT NULL DEFAULT 0"},
	{"memory_bytes", "INTEGER NOT NULL DEFAULT 0"}, {"pids", "INTEGER NOT NULL DEFAULT 0"},
	{"disk_bytes", "INTEGER NOT NULL DEFAULT 0"},
	/* the template an execution runs on, and where it came from (issue 13) */
	{"template", "TEXT NOT NULL DEFAULT ''"},       {"template_url", "TEXT NOT NULL DEFAULT ''"},
	/* a claimed pooled execution's directory, the sandbox's settings (issue 13) */
	{"exec_name", "TEXT NOT NULL DEFAULT ''"},      {"config", "TEXT NOT NULL DEFAULT ''"},
	/* whose sandbox it is: a worker's streams are shared between tenants */
	{"tenant", "TEXT NOT NULL DEFAULT ''"},
};

static int add_missing_columns(sqlite3 *db)
{
	for (size_t i = 0; i < sizeof added_columns / sizeof added_columns[0]; i++) {
		char sql[160];
		sqlite3_stmt *s = NULL;
		snprintf(sql, sizeof sql, "SELECT %s FROM records LIMIT 0", added_columns[i].name);
		if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK) {
			sqlite3_finalize(s);
			continue;
		}
		snprintf(sql, sizeof sql, "ALTER TABLE records ADD COLUMN %s %s", added_columns[i].name,
		         added_columns[i].type);
		if (sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK)
			return SPACED_EIO;
	}
	return 0;
}

static int meta_get(sqlite3 *db, const char *k, int64_t *out)
{
	sqlite3_stmt *s = NULL;
	int e = SPACED_ENOENT;
	if (sqlite3_prepare_v2(db, "SELECT v FROM meta WHERE k=?1", -1, &s, NULL) != SQLITE_OK)
		return SPACED_EIO;
	sqlite3_bind_text(s, 1, k, -1, SQLITE_STATIC);
	int rc = sqlite3_step(s);
	if (rc == SQLITE_ROW) {
		*out = sqlite3_column_int64(s, 0);
		e = 0;
	} else if (rc != SQLITE_DONE) {
		e = SPACED_EIO;
	}
	sqlite3_finalize(s);
	return e;
}

/* Statement which of st (sql), prepared the first time; NULL on error. */
static sqlite3_stmt *stmt_of(struct mgr_store *st, int which, const char *sql)
{
	if (!st->stmt[which] &&
	    sqlite3_prepare_v3(st->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st->stmt[which], NULL) != SQLITE_OK)
		return NULL;
	return st->stmt[which];
}

/* Runs the bound statement s once; 0, SPACED_ESTALE (a constraint) or SPACED_EIO. */
static int stmt_run(sqlite3_stmt *s)
{
	int rc = sqlite3_step(s);
	sqlite3_reset(s);
	sqlite3_clear_bindings(s);
	return rc == SQLITE_DONE ? 0 : rc == SQLITE_CONSTRAINT ? SPACED_ESTALE : SPACED_EIO;
}

static int meta_set(struct mgr_store *st, const char *k, int64_t v)
{
	sqlite3_stmt *s = stmt_of(st, ST_META, "INSERT INTO meta(k,v) VALUES(?1,?2) ON CONFLICT(k) DO UPDATE SET v=?2");
	if (!s)
		return SPACED_EIO;
	sqlite3_bind_text(s, 1, k, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 2, v);
	int e = stmt_run(s);
	return e == SPACED_ESTALE ? SPACED_EIO : e;
}

int mgr_store_open(const char *dir, struct mgr_store **out)
{
	char path[4096];
	struct mgr_store *st = NULL;
	int e = SPACED_EIO;
	int64_t v;

	if (snprintf(path, sizeof path, "%s/records.db", dir) >= (int)sizeof path)
		return SPACED_EINVAL;
	st = calloc(1, sizeof *st);
	if (!st)
		return SPACED_ENOMEM;
	if (sqlite3_open_v2(path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
	                    NULL) != SQLITE_OK)
		goto out;
	sqlite3_busy_timeout(st->db, 5000);
	if (sqlite3_exec(st->db, schema, NULL, NULL, NULL) != SQLITE_OK || add_missing_columns(st->db) < 0)
		goto out;
	st->next_epoch = 1;
	if (meta_get(st->db, "next_epoch", &v) == 0 && v > 0)
		st->next_epoch = (uint64_t)v;
	if (meta_get(st->db, "last_seq", &v) == 0 && v > 0)
		st->last_seq = (uint64_t)v;
	if (meta_get(st->db, "acks_pruned_to", &v) == 0 && v > 0)
		st->acks_pruned_to = (uint64_t)v;
	e = 0;
out:
	if (e < 0) {
		mgr_store_close(st);
		return e;
	}
	*out = st;
	return 0;
}

void mgr_store_close(struct mgr_store *st)
{
	if (!st)
		return;
	for (int i = 0; i < ST_N; i++)
		sqlite3_finalize(st->stmt[i]);
	sqlite3_close(st->db);
	free(st);
}

uint64_t mgr_store_peek_epoch(struct mgr_store *st)
{
	return st->next_epoch;
}

void mgr_store_use_epoch(struct mgr_store *st, uint64_t epoch)
{
	if (epoch >= st->next_epoch)
		st->next_epoch = epoch + 1;
}

uint64_t mgr_store_last_seq(struct mgr_store *st)
{
	return st->last_seq;
}

void mgr_store_note_seq(struct mgr_store *st, uint64_t seq)
{
	if (seq > st->last_seq)
		st->last_seq = seq;
}

void mgr_store_note_pruned(struct mgr_store *st, uint64_t to)
{
	if (to > st->acks_pruned_to)
		st->acks_pruned_to = to;
}

static int put_rec(struct mgr_store *st, const struct mgr_rec *rec)
{
	static const char sql[] =
		"INSERT INTO records(sandbox,generation,worker,substrate,activation,pod_uid,epoch,active,"
		"state,pid,pid_start,host_pid,host_start,uid_base,cpu_milli,memory_bytes,pids,disk_bytes,"
		"template,template_url,exec_name,config,tenant) "
		"VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21,?22,?23) "
		"ON CONFLICT(sandbox) DO UPDATE SET generation=?2,worker=?3,substrate=?4,activation=?5,"
		"pod_uid=?6,epoch=?7,active=?8,state=?9,pid=?10,pid_start=?11,host_pid=?12,host_start=?13,"
		"uid_base=?14,cpu_milli=?15,memory_bytes=?16,pids=?17,disk_bytes=?18,template=?19,template_url=?20,exec_name=?21,config=?22,tenant=?23";
	const struct spaced_identity *id = &rec->r.id;
	sqlite3_stmt *s = stmt_of(st, ST_PUT, sql);
	if (!s)
		return SPACED_EIO;
	sqlite3_bind_text(s, 1, id->sandbox, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 2, (sqlite3_int64)id->generation);
	sqlite3_bind_text(s, 3, id->worker, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 4, id->substrate, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 5, id->activation, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 6, id->pod_uid, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 7, (sqlite3_int64)rec->r.epoch);
	sqlite3_bind_int(s, 8, rec->r.active ? 1 : 0);
	sqlite3_bind_text(s, 9, rec->state, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 10, rec->pid);
	sqlite3_bind_int64(s, 11, (sqlite3_int64)rec->pid_start);
	sqlite3_bind_int64(s, 12, rec->host_pid);
	sqlite3_bind_int64(s, 13, (sqlite3_int64)rec->host_start);
	sqlite3_bind_int64(s, 14, (sqlite3_int64)rec->uid_base);
	sqlite3_bind_int64(s, 15, (sqlite3_int64)rec->res.cpu_milli);
	sqlite3_bind_int64(s, 16, (sqlite3_int64)rec->res.memory_bytes);
	sqlite3_bind_int64(s, 17, (sqlite3_int64)rec->res.pids);
	sqlite3_bind_int64(s, 18, (sqlite3_int64)rec->res.disk_bytes);
	sqlite3_bind_text(s, 19, rec->tmpl, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 20, rec->tmpl_url, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 21, rec->exec_name, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 22, rec->config, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 23, rec->tenant, -1, SQLITE_STATIC);
	return stmt_run(s);
}

/* Notes that seq was applied tentative (t) in the transaction under way. */
static int put_tentative(struct mgr_store *st, uint64_t seq, const struct spaced_identity *t)
{
	sqlite3_stmt *s = stmt_of(st, ST_TENT, "INSERT OR REPLACE INTO tentative(seq,sandbox,activation) VALUES(?1,?2,?3)");
	if (!s)
		return SPACED_EIO;
	sqlite3_bind_int64(s, 1, (sqlite3_int64)seq);
	sqlite3_bind_text(s, 2, t->sandbox, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 3, t->activation, -1, SQLITE_STATIC);
	return stmt_run(s) < 0 ? SPACED_EIO : 0;
}

int mgr_store_commit_many(struct mgr_store *st, const struct mgr_rec *const *recs, const uint64_t *seqs,
                          const char *const *acks, const struct spaced_identity *const *tents, size_t n,
                          uint64_t durable_through)
{
	int e = 0;
	if (sqlite3_exec(st->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
		return SPACED_EIO;
	uint64_t next = st->next_epoch, last = st->last_seq;
	for (size_t i = 0; i < n && e == 0; i++) {
		const struct mgr_rec *rec = recs[i];
		uint64_t seq = seqs[i];
		const char *ack_line = acks[i];
		if (rec && rec->r.epoch >= next)
			next = rec->r.epoch + 1; /* an epoch handed out is never handed out again */
		if (rec)
			e = put_rec(st, rec);
		if (e == 0 && seq > 0) {
			sqlite3_stmt *s = stmt_of(st, ST_ACK, "INSERT OR REPLACE INTO acks(seq,line) VALUES(?1,?2)");
			if (!s) {
				e = SPACED_EIO;
			} else {
				sqlite3_bind_int64(s, 1, (sqlite3_int64)seq);
				sqlite3_bind_text(s, 2, ack_line ? ack_line : "", -1, SQLITE_STATIC);
				e = stmt_run(s) < 0 ? SPACED_EIO : 0;
			}
			if (e == 0 && tents && tents[i] && seq > durable_through)
				e = put_tentative(st, seq, tents[i]);
			if (e == 0 && seq > last) {
				e = meta_set(st, "last_seq", (int64_t)seq);
				last = seq;
			}
		}
	}
	if (e == 0)
		e = meta_set(st, "next_epoch", (int64_t)next);
	if (e == 0 && durable_through > st->tentative_kept_to) {
		/* said durable since: forgotten with this transaction (no wait
		 * of its own for the disk: one lost comes back in a hello, and is
		 * said durable again) */
		sqlite3_stmt *s = stmt_of(st, ST_TENT_DEL, "DELETE FROM tentative WHERE seq <= ?1");
		if (!s) {
			e = SPACED_EIO;
		} else {
			sqlite3_bind_int64(s, 1, (sqlite3_int64)durable_through);
			e = stmt_run(s) < 0 ? SPACED_EIO : 0;
		}
	}
	if (e == 0 && sqlite3_exec(st->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
		e = SPACED_EIO;
	if (e < 0) {
		sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
		return e;
	}
	st->last_seq = last;
	st->next_epoch = next;
	if (durable_through > st->tentative_kept_to)
		st->tentative_kept_to = durable_through;
	return 0;
}

json_t *mgr_store_tentative(struct mgr_store *st, uint64_t after, size_t max)
{
	sqlite3_stmt *s = NULL;
	json_t *a = json_array();
	if (a == NULL || sqlite3_prepare_v2(st->db,
	                                    "SELECT seq, sandbox, activation FROM tentative WHERE seq > ?1 ORDER BY seq "
	                                    "LIMIT ?2",
	                                    -1, &s, NULL) != SQLITE_OK) {
		json_decref(a);
		return NULL;
	}
	sqlite3_bind_int64(s, 1, (sqlite3_int64)after);
	sqlite3_bind_int64(s, 2, (sqlite3_int64)max);
	int rc;
	while ((rc = sqlite3_step(s)) == SQLITE_ROW)
		json_array_append_new(a, json_pack("{s:I,s:s,s:s}", "seq", (json_int_t)sqlite3_column_int64(s, 0), "sandbox",
		                                   (const char *)sqlite3_column_text(s, 1), "activation",
		                                   (const char *)sqlite3_column_text(s, 2)));
	sqlite3_finalize(s);
	if (rc != SQLITE_DONE) {
		json_decref(a);
		return NULL;
	}
	return a;
}

int mgr_store_forget(struct mgr_store *st, const char *const *sandboxes, size_t n)
{
	sqlite3_stmt *s = NULL, *g = NULL;
	int e = 0;
	if (sqlite3_exec(st->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
		return SPACED_EIO;
	/* the generation first (the row it comes from is still there), then the row */
	if (sqlite3_prepare_v2(st->db,
	                       "INSERT INTO gone(sandbox,generation) SELECT sandbox,generation FROM records "
	                       "WHERE sandbox=?1 AND active=0 AND state IN ('" MGR_ST_DESTROYED "','" MGR_ST_STOPPED "') "
	                       "ON CONFLICT(sandbox) DO UPDATE SET generation=MAX(generation,excluded.generation)",
	                       -1, &g, NULL) != SQLITE_OK ||
	    sqlite3_prepare_v2(st->db,
	                       "DELETE FROM records WHERE sandbox=?1 AND active=0 AND state IN ('" MGR_ST_DESTROYED
	                       "','" MGR_ST_STOPPED "')",
	                       -1, &s, NULL) != SQLITE_OK)
		e = SPACED_EIO;
	for (size_t i = 0; i < n && e == 0; i++) {
		sqlite3_reset(g);
		sqlite3_bind_text(g, 1, sandboxes[i], -1, SQLITE_STATIC);
		sqlite3_reset(s);
		sqlite3_bind_text(s, 1, sandboxes[i], -1, SQLITE_STATIC);
		if (sqlite3_step(g) != SQLITE_DONE || sqlite3_step(s) != SQLITE_DONE)
			e = SPACED_EIO;
	}
	sqlite3_finalize(g);
	sqlite3_finalize(s);
	if (e == 0 && sqlite3_exec(st->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
		e = SPACED_EIO;
	if (e < 0)
		sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
	return e;
}

uint64_t mgr_store_prune_horizon(struct mgr_store *st, uint64_t keep)
{
	/* in steps of a sixteenth of what is kept: not a transaction (and a wait
	 * for the disk) for every few messages */
	uint64_t step = keep / 16 > 1 ? keep / 16 : 1;
	if (st->last_seq <= keep || st->last_seq - keep < st->acks_pruned_to + step)
		return 0;
	return st->last_seq - keep;
}

int mgr_store_prune_acks(struct mgr_store *st, uint64_t to)
{
	if (to <= st->acks_pruned_to)
		return 0;
	sqlite3_stmt *s = NULL;
	int e = 0;
	if (sqlite3_exec(st->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
		return SPACED_EIO;
	if (sqlite3_prepare_v2(st->db, "DELETE FROM acks WHERE seq<=?1", -1, &s, NULL) != SQLITE_OK)
		e = SPACED_EIO;
	if (e == 0) {
		sqlite3_bind_int64(s, 1, (sqlite3_int64)to);
		if (sqlite3_step(s) != SQLITE_DONE)
			e = SPACED_EIO;
	}
	sqlite3_finalize(s);
	if (e == 0)
		e = meta_set(st, "acks_pruned_to", (int64_t)to);
	if (e == 0 && sqlite3_exec(st->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
		e = SPACED_EIO;
	if (e < 0) {
		sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
		return e;
	}
	st->acks_pruned_to = to;
	return 0;
}

int mgr_store_gone_generation(struct mgr_store *st, const char *sandbox, uint64_t *generation)
{
	/* asked by every install of a sandbox the worker has no record of: kept prepared */
	sqlite3_stmt *s = stmt_of(st, ST_GONE, "SELECT generation FROM gone WHERE sandbox=?1");
	if (!s)
		return SPACED_EIO;
	sqlite3_bind_text(s, 1, sandbox, -1, SQLITE_STATIC);
	int rc = sqlite3_step(s), e = rc == SQLITE_ROW ? 0 : rc == SQLITE_DONE ? SPACED_ENOENT : SPACED_EIO;
	if (e == 0)
		*generation = (uint64_t)sqlite3_column_int64(s, 0);
	sqlite3_reset(s);
	sqlite3_clear_bindings(s);
	return e;
}

uint64_t mgr_store_acks_pruned_to(struct mgr_store *st)
{
	return st->acks_pruned_to;
}

int mgr_store_ack(struct mgr_store *st, uint64_t seq, char **line)
{
	/* asked by every message the gate has not applied yet: kept prepared */
	sqlite3_stmt *s = stmt_of(st, ST_ACK_GET, "SELECT line FROM acks WHERE seq=?1");
	int e = SPACED_ENOENT;
	if (!s)
		return SPACED_EIO;
	sqlite3_bind_int64(s, 1, (sqlite3_int64)seq);
	int rc = sqlite3_step(s);
	if (rc == SQLITE_ROW) {
		const char *t = (const char *)sqlite3_column_text(s, 0);
		char *d = strdup(t ? t : "");
		e = d ? 0 : SPACED_ENOMEM;
		if (d)
			*line = d;
	} else if (rc != SQLITE_DONE) {
		e = SPACED_EIO;
	}
	sqlite3_reset(s);
	sqlite3_clear_bindings(s);
	return e;
}

int mgr_store_refuse_ack_of(struct mgr_store *st, uint64_t epoch, const char *code, const char *error)
{
	sqlite3_stmt *s = NULL;
	if (sqlite3_prepare_v2(st->db,
	                       "UPDATE acks SET line = json_object('ack', seq, 'ok', json('false'), 'error', ?2, 'code', ?3) "
	                       "WHERE json_valid(line) AND json_extract(line, '$.ok') = 1 "
	                       "AND json_extract(line, '$.result.epoch') = ?1",
	                       -1, &s, NULL) != SQLITE_OK)
		return SPACED_EIO;
	sqlite3_bind_int64(s, 1, (sqlite3_int64)epoch);
	sqlite3_bind_text(s, 2, error, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 3, code, -1, SQLITE_STATIC);
	int e = sqlite3_step(s) == SQLITE_DONE ? 0 : SPACED_EIO;
	sqlite3_finalize(s);
	return e;
}

int mgr_store_acks_of_epochs(struct mgr_store *st, void (*cb)(void *arg, uint64_t seq, uint64_t epoch, int gateway),
                             void *arg)
{
	sqlite3_stmt *s = NULL;
	int rc;
	if (sqlite3_prepare_v2(st->db,
	                       "SELECT seq, json_extract(line, '$.result.epoch'), "
	                       "COALESCE(json_extract(line, '$.result.gateway'), 0) FROM acks "
	                       "WHERE json_valid(line) AND json_extract(line, '$.ok') = 1 "
	                       "AND json_type(line, '$.result.epoch') = 'integer'",
	                       -1, &s, NULL) != SQLITE_OK)
		return SPACED_EIO;
	while ((rc = sqlite3_step(s)) == SQLITE_ROW)
		cb(arg, (uint64_t)sqlite3_column_int64(s, 0), (uint64_t)sqlite3_column_int64(s, 1), sqlite3_column_int(s, 2));
	sqlite3_finalize(s);
	return rc == SQLITE_DONE ? 0 : SPACED_EIO;
}

int mgr_store_ack_set_gateway(struct mgr_store *st, uint64_t seq, int gateway_port)
{
	sqlite3_stmt *s = NULL;
	if (sqlite3_prepare_v2(st->db,
	                       gateway_port > 0 ? "UPDATE acks SET line = json_set(line, '$.result.gateway', ?2) WHERE seq = ?1"
	                                        : "UPDATE acks SET line = json_remove(line, '$.result.gateway') WHERE seq = ?1",
	                       -1, &s, NULL) != SQLITE_OK)
		return SPACED_EIO;
	sqlite3_bind_int64(s, 1, (sqlite3_int64)seq);
	if (gateway_port > 0)
		sqlite3_bind_int(s, 2, gateway_port);
	int e = sqlite3_step(s) == SQLITE_DONE ? 0 : SPACED_EIO;
	sqlite3_finalize(s);
	return e;
}

static void col_text(sqlite3_stmt *s, int i, char *out, size_t outsz)
{
	const char *t = (const char *)sqlite3_column_text(s, i);
	snprintf(out, outsz, "%s", t ? t : "");
}

int mgr_store_foreach(struct mgr_store *st, int (*cb)(void *arg, const struct mgr_rec *rec),
                      void *arg)
{
	sqlite3_stmt *s = NULL;
	int e = 0, rc;
	if (sqlite3_prepare_v2(st->db,
	                       "SELECT sandbox,generation,worker,substrate,activation,pod_uid,epoch,active,"
	                       "state,pid,pid_start,host_pid,host_start,uid_base,cpu_milli,memory_bytes,pids,"
	                       "disk_bytes,template,template_url,exec_name,config,tenant FROM records ORDER BY sandbox",
	                       -1, &s, NULL) != SQLITE_OK)
		return SPACED_EIO;
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		struct mgr_rec r;
		memset(&r, 0, sizeof r);
		col_text(s, 0, r.r.id.sandbox, sizeof r.r.id.sandbox);
		r.r.id.generation = (uint64_t)sqlite3_column_int64(s, 1);
		col_text(s, 2, r.r.id.worker, sizeof r.r.id.worker);
		col_text(s, 3, r.r.id.substrate, sizeof r.r.id.substrate);
		col_text(s, 4, r.r.id.activation, sizeof r.r.id.activation);
		col_text(s, 5, r.r.id.pod_uid, sizeof r.r.id.pod_uid);
		r.r.epoch = (uint64_t)sqlite3_column_int64(s, 6);
		r.r.active = sqlite3_column_int(s, 7) != 0;
		col_text(s, 8, r.state, sizeof r.state);
		r.pid = sqlite3_column_int64(s, 9);
		r.pid_start = (uint64_t)sqlite3_column_int64(s, 10);
		r.host_pid = sqlite3_column_int64(s, 11);
		r.host_start = (uint64_t)sqlite3_column_int64(s, 12);
		r.uid_base = (uint32_t)sqlite3_column_int64(s, 13);
		r.res.cpu_milli = (uint32_t)sqlite3_column_int64(s, 14);
		r.res.memory_bytes = (uint64_t)sqlite3_column_int64(s, 15);
		r.res.pids = (uint64_t)sqlite3_column_int64(s, 16);
		r.res.disk_bytes = (uint64_t)sqlite3_column_int64(s, 17);
		col_text(s, 18, r.tmpl, sizeof r.tmpl);
		col_text(s, 19, r.tmpl_url, sizeof r.tmpl_url);
		col_text(s, 20, r.exec_name, sizeof r.exec_name);
		col_text(s, 21, r.config, sizeof r.config);
		col_text(s, 22, r.tenant, sizeof r.tenant);
		if (cb(arg, &r))
			break;
	}
	if (rc != SQLITE_ROW && rc != SQLITE_DONE)
		e = SPACED_EIO;
	sqlite3_finalize(s);
	return e;
}

int mgr_store_meta_get(struct mgr_store *st, const char *key, int64_t *out)
{
	return meta_get(st->db, key, out);
}

int mgr_store_meta_set(struct mgr_store *st, const char *key, int64_t v)
{
	return meta_set(st, key, v);
}
