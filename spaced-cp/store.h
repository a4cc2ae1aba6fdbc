/*
 * store.h — the control plane's storage interface: one small SQL surface over
 * two backends, SQLite (embedded default, WAL, synchronous=FULL) and
 * PostgreSQL (libpq, shared by several control-plane replicas). Callers write
 * one SQL text for both: parameters are $1…$N, passed as text (NULL for SQL
 * NULL), results come back as text. Integers travel in decimal.
 *
 * A handle is used by one thread at a time; every thread opens its own.
 * SQLite: transactions and writes outside one run on one connection the
 * process's handles of a database share, one thread at a time (its page
 * cache then stays valid from one write to the next: store_sqlite.c).
 */
#ifndef SPACED_CP_STORE_H
#define SPACED_CP_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cp_store;

/* Result rows of a statement: v[r * ncols + c] is the text of one cell, NULL for SQL NULL. */
struct cp_rows {
	int nrows, ncols;
	char **v;
};

/* Opens the store named by url: "sqlite:PATH" (created when missing) or
 * "postgresql://…" / "postgres://…". Creates the schema when missing.
 * Returns 0, SPACED_EINVAL (unknown form) or SPACED_EIO. */
int cp_store_open(const char *url, struct cp_store **out);

/* The counts placement and the quotas read instead of summing sandboxes
 * (per worker, its live sandboxes' count, memory and task limits; per
 * tenant, its sandboxes not deleted, their memory, disk and task limits) and
 * the triggers that keep them, made when missing, then counted again from the
 * sandboxes with every writer held off. SQLite: worker_usage and
 * tenant_usage, written by each transaction that changes a sandbox.
 * PostgreSQL: the same tables, and the changes appended beside them
 * (worker_usage_delta, tenant_usage_delta) until cp_store_usage_fold adds
 * them in. Once per start of the control plane, before it serves. A sandbox
 * counts for its worker while live (CP_LIVE), for its tenant while not
 * deleted. Returns 0 or SPACED_EIO/SPACED_EBUSY. */
int cp_store_usage_setup(struct cp_store *st);
/* PostgreSQL: adds the committed changes into the counts, in one
 * transaction (a reader sees them before or after, never twice); skipped
 * while another replica does it. Nothing on SQLite. 0 or SPACED_EIO. */
int cp_store_usage_fold(struct cp_store *st);
#define CP_LIVE(R)                                                                                            \
	"(" R ".deleted = 0 AND " R ".worker IS NOT NULL AND " R                                              \
	".state IN ('starting','running','paused','moving'))"
/* (worker, sandboxes, memory_bytes, pids): a table name or a subquery
 * (PostgreSQL: the counts with the changes not yet folded in) */
const char *cp_store_worker_usage(const struct cp_store *st);
/* (tenant, sandboxes, memory_bytes, disk_bytes, pids): the same */
const char *cp_store_tenant_usage(const struct cp_store *st);

/* Closes; accepts NULL. */
void cp_store_close(struct cp_store *st);

/* "sqlite" or "postgresql". */
const char *cp_store_kind(const struct cp_store *st);

/* Starts a write transaction that serializes against other writers: BEGIN
 * IMMEDIATE on SQLite (waits for the write lock), BEGIN on PostgreSQL (row
 * locks are then taken by UPDATE … statements). Returns 0, SPACED_EBUSY or SPACED_EIO. */
int cp_store_begin(struct cp_store *st);

/* Writes that a crash may lose without harm, because a replay or the
 * recovery of an operation rebuilds them (an ack, which the worker repeats
 * for its seq; the state an acknowledged install leads to), are committed
 * without waiting for the disk while on: SQLite synchronous=NORMAL (WAL: a
 * crash of the process loses nothing, one of the machine the last such
 * commits), PostgreSQL synchronous_commit=off. Never for a generation.
 * SQLite: such a write (on 1) goes ahead of the writers waiting for their
 * turn; with on 2 it commits so but waits its turn (a transaction made
 * durable by cp_store_sync_log before anything depends on it). */
int cp_store_relaxed(struct cp_store *st, int on);

/* The commits made so far, relaxed ones too, made durable: SQLite's log
 * (its -wal file) synced to the disk, the same as a commit with
 * synchronous=FULL had done (a commit after a relaxed one is durable only
 * with every one before it: the log is written in order). 0, SPACED_EIO,
 * or SPACED_EINVAL (PostgreSQL: a relaxed commit there is not waited for
 * this way; the caller commits with the disk instead). */
int cp_store_sync_log(struct cp_store *st);

/* Commits (0 or SPACED_EIO/SPACED_EBUSY; on error the transaction is rolled back). */
int cp_store_commit(struct cp_store *st);

/* Rolls back; harmless outside a transaction. */
void cp_store_rollback(struct cp_store *st);

/* Runs one statement with n text parameters. When out is not NULL it receives
 * the result rows (free with cp_rows_free), also for INSERT/UPDATE … RETURNING.
 * When changes is not NULL it receives the number of rows written.
 * Returns 0, SPACED_EEXIST (unique constraint), SPACED_EBUSY (lock timeout) or SPACED_EIO. */
int cp_store_exec(struct cp_store *st, const char *sql, int n, const char *const *params,
                  struct cp_rows **out, long *changes);

/* Prepares in st the statements other handles of this process ran and st
 * has not prepared yet (SQLite: each connection prepares its own, and a
 * thread would otherwise prepare a request's statements in that request's
 * time the first time it serves one of its kind); for an idle thread.
 * Returns how many it prepared (0 on PostgreSQL). */
int cp_store_warm(struct cp_store *st);

/* Grows each time a handle of this process runs a statement no handle ran
 * before: a handle last warmed at an older value has some to prepare. */
uint64_t cp_store_statements_seen(void);

/* Frees rows; accepts NULL. */
void cp_rows_free(struct cp_rows *r);

/* The cell at (r, c), or NULL when out of range or SQL NULL. */
const char *cp_rows_get(const struct cp_rows *rows, int r, int c);

/* The cell at (r, c) as an integer, def when absent. */
int64_t cp_rows_i64(const struct cp_rows *rows, int r, int c, int64_t def);

/* Formats v in decimal into buf (room for 24 bytes) and returns buf. */
const char *cp_i64(char buf[24], int64_t v);

/* Convenience: cp_store_exec with a literal parameter list. */
#define CP_Q(st, out, changes, sql, ...)                                                     \
	cp_store_exec((st), (sql), (int)(sizeof((const char *const[]){__VA_ARGS__}) / sizeof(char *)), \
	              (const char *const[]){__VA_ARGS__}, (out), (changes))
#define CP_Q0(st, out, changes, sql) cp_store_exec((st), (sql), 0, NULL, (out), (changes))

/* store_sqlite.c: this thread's next writes are relaxed ones (cp_store_relaxed). */
void cp_store_sqlite_relaxed(int on);
/* store_sqlite.c: cp_store_sync_log for a SQLite handle. */
int cp_store_sqlite_sync_log(void *h);
/* store_sqlite.c: the log syncs of cp_store_sync_log so far, and their time. */
void cp_store_sqlite_log_syncs(uint64_t *n, uint64_t *ns);
/* store_sqlite.c: cp_store_warm and cp_store_statements_seen for a SQLite handle. */
int cp_store_sqlite_warm(void *h);
uint64_t cp_store_sqlite_seen(void);
/* store_sqlite.c: statements prepared in this process so far, while serving
 * requests and by idle threads (cp_store_warm). */
void cp_store_sqlite_prepared(uint64_t *in_requests, uint64_t *idle);
/* store_sqlite.c: the steps SQLite's virtual machine took for every
 * statement of this process so far (the rows statements visit, and more):
 * what the store's work costs, whatever the machine's speed. */
uint64_t cp_store_sqlite_vm_steps(void);

/* Backend entry points (store_sqlite.c, store_pg.c). */
struct cp_store_ops {
	const char *kind;
	int (*begin)(void *h);
	int (*commit)(void *h);
	void (*rollback)(void *h);
	int (*exec)(void *h, const char *sql, int n, const char *const *params, struct cp_rows **out,
	            long *changes);
	int (*script)(void *h, const char *sql);
	void (*close)(void *h);
};
int cp_store_sqlite_open(const char *path, void **h, const struct cp_store_ops **ops);
int cp_store_pg_open(const char *conninfo, void **h, const struct cp_store_ops **ops);

/* Rows helper for backends: a new result with nrows x ncols NULL cells. */
struct cp_rows *cp_rows_new(int nrows, int ncols);

#endif
