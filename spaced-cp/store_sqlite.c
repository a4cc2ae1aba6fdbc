/* store_sqlite.c — the embedded SQLite backend: WAL, synchronous=FULL, writers
 * serialized by BEGIN IMMEDIATE, parameters bound by their $N names.
 *
 * Each handle keeps its prepared statements (SQ_CACHE of them, the least
 * recently used one replaced): the control plane runs the same few dozen
 * statements over and over, and preparing one (parsing, planning) cost as
 * much as running it. A statement is reset after every use, so none holds
 * a read transaction open between calls.
 *
 * The writers of this process also queue on one mutex before they take
 * SQLite's write lock: SQLite's own wait for a busy lock sleeps and polls
 * (1, 2, 5 … up to 100 ms), so fifty threads writing at once would wait for
 * each other's sleeps, not for each other's work. Other processes (admin
 * commands) still meet the busy timeout. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "error.h"
#include "store.h"

static int map_err(int rc)
{
	switch (rc & 0xff) {
	case SQLITE_OK:
	case SQLITE_DONE:
	case SQLITE_ROW:
		return 0;
	case SQLITE_BUSY:
	case SQLITE_LOCKED:
		return SPACED_EBUSY;
	case SQLITE_CONSTRAINT:
		return SPACED_EEXIST;
	case SQLITE_NOMEM:
		return SPACED_ENOMEM;
	default:
		return SPACED_EIO;
	}
}

#define SQ_CACHE 64

struct sq_cached {
	sqlite3_stmt *stmt; /* NULL: a free slot */
	uint64_t hash, used;
};

/* A handle: the connection and its statements (one thread at a time). */
struct sq {
	sqlite3 *db;
	struct sq_cached cache[SQ_CACHE];
	uint64_t tick;
};

static uint64_t sql_hash(const char *sql)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (const unsigned char *c = (const unsigned char *)sql; *c; c++)
		h = (h ^ *c) * 1099511628211ull;
	return h;
}

/* The prepared statement of sql, from the cache or prepared now (and kept). */
static int stmt_get(struct sq *q, const char *sql, sqlite3_stmt **out)
{
	uint64_t h = sql_hash(sql);
	struct sq_cached *victim = &q->cache[0];
	for (size_t i = 0; i < SQ_CACHE; i++) {
		struct sq_cached *c = &q->cache[i];
		if (c->stmt && c->hash == h && strcmp(sqlite3_sql(c->stmt), sql) == 0) {
			c->used = ++q->tick;
			*out = c->stmt;
			return SQLITE_OK;
		}
		if (!c->stmt || (victim->stmt && c->used < victim->used))
			victim = c;
	}
	sqlite3_stmt *st = NULL;
	int rc = sqlite3_prepare_v3(q->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL);
	if (rc != SQLITE_OK)
		return rc;
	if (victim->stmt)
		sqlite3_finalize(victim->stmt);
	*victim = (struct sq_cached){.stmt = st, .hash = h, .used = ++q->tick};
	*out = st;
	return SQLITE_OK;
}

static int sq_script(void *h, const char *sql)
{
	return map_err(sqlite3_exec(((struct sq *)h)->db, sql, NULL, NULL, NULL));
}

/* The writers' queue. Relaxed writes (cp_store_relaxed: one short
 * statement or a small batch that does not wait for the disk) go before the
 * transactions that do: a call that got its ack waits for no create's fsync. */
static pthread_mutex_t wmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wcv = PTHREAD_COND_INITIALIZER;
static bool wheld;
static int whigh;                  /* relaxed writers waiting */
static __thread bool holds_writer; /* a handle is used by one thread at a time */
static __thread bool relaxed;

static void writer_take(void)
{
	pthread_mutex_lock(&wmu);
	bool high = relaxed;
	if (high)
		whigh++;
	while (wheld || (!high && whigh > 0))
		pthread_cond_wait(&wcv, &wmu);
	if (high)
		whigh--;
	wheld = true;
	pthread_mutex_unlock(&wmu);
	holds_writer = true;
}

static void writer_release(void)
{
	if (holds_writer) {
		holds_writer = false;
		pthread_mutex_lock(&wmu);
		wheld = false;
		pthread_cond_broadcast(&wcv);
		pthread_mutex_unlock(&wmu);
	}
}

void cp_store_sqlite_relaxed(int on)
{
	relaxed = on != 0;
}

static int sq_begin(void *h)
{
	if (!holds_writer)
		writer_take();
	int r = sq_script(h, "BEGIN IMMEDIATE");
	if (r < 0)
		writer_release();
	return r;
}

static int sq_commit(void *h)
{
	int r = sq_script(h, "COMMIT");
	if (sqlite3_get_autocommit(((struct sq *)h)->db))
		writer_release();
	return r;
}

static void sq_rollback(void *h)
{
	sqlite3 *db = ((struct sq *)h)->db;
	if (!sqlite3_get_autocommit(db))
		sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
	writer_release();
}

static int sq_exec(void *h, const char *sql, int n, const char *const *params, struct cp_rows **out,
                   long *changes)
{
	struct sq *q = h;
	sqlite3 *db = q->db;
	sqlite3_stmt *stmt = NULL;
	struct cp_rows *rows = NULL;
	bool autowrite = false;
	int r, rc, cap = 0;
	rc = stmt_get(q, sql, &stmt);
	if (rc != SQLITE_OK) {
		r = map_err(rc);
		goto out;
	}
	for (int i = 0; i < n; i++) {
		char name[16];
		snprintf(name, sizeof name, "$%d", i + 1);
		int idx = sqlite3_bind_parameter_index(stmt, name);
		if (idx == 0)
			continue; /* parameter unused by this statement */
		rc = params[i] == NULL ? sqlite3_bind_null(stmt, idx)
		                       : sqlite3_bind_text(stmt, idx, params[i], -1, SQLITE_TRANSIENT);
		if (rc != SQLITE_OK) {
			r = map_err(rc);
			goto out;
		}
	}
	/* a write of its own (outside a transaction) queues like a transaction */
	autowrite = !holds_writer && sqlite3_get_autocommit(db) && !sqlite3_stmt_readonly(stmt);
	if (autowrite)
		writer_take();
	int ncols = sqlite3_column_count(stmt);
	rows = cp_rows_new(0, ncols);
	if (rows == NULL) {
		r = SPACED_ENOMEM;
		goto out;
	}
	while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
		if (rows->nrows == cap) {
			int ncap = cap ? cap * 2 : 8;
			char **nv = realloc(rows->v, (size_t)ncap * (size_t)(ncols ? ncols : 1) * sizeof(char *));
			if (nv == NULL) {
				r = SPACED_ENOMEM;
				goto out;
			}
			rows->v = nv;
			cap = ncap;
		}
		for (int c = 0; c < ncols; c++) {
			const unsigned char *t = sqlite3_column_text(stmt, c);
			char *copy = NULL;
			if (t != NULL && (copy = strdup((const char *)t)) == NULL) {
				for (int k = 0; k < c; k++)
					free(rows->v[rows->nrows * ncols + k]);
				r = SPACED_ENOMEM;
				goto out;
			}
			rows->v[rows->nrows * ncols + c] = copy;
		}
		rows->nrows++;
	}
	if (rc != SQLITE_DONE) {
		r = map_err(rc);
		goto out;
	}
	if (changes != NULL)
		*changes = sqlite3_changes(db);
	if (out != NULL) {
		*out = rows;
		rows = NULL;
	}
	r = 0;
out:
	cp_rows_free(rows);
	if (stmt) {
		sqlite3_reset(stmt);
		sqlite3_clear_bindings(stmt);
	}
	if (autowrite)
		writer_release();
	return r;
}

static void sq_close(void *h)
{
	struct sq *q = h;
	for (size_t i = 0; i < SQ_CACHE; i++)
		if (q->cache[i].stmt)
			sqlite3_finalize(q->cache[i].stmt);
	sqlite3_close(q->db);
	free(q);
}

static const struct cp_store_ops sqlite_ops = {
	.kind = "sqlite",
	.begin = sq_begin,
	.commit = sq_commit,
	.rollback = sq_rollback,
	.exec = sq_exec,
	.script = sq_script,
	.close = sq_close,
};

int cp_store_sqlite_open(const char *path, void **h, const struct cp_store_ops **ops)
{
	sqlite3 *db = NULL;
	int r;
	if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
	                    NULL) != SQLITE_OK) {
		r = SPACED_EIO;
		goto out;
	}
	sqlite3_busy_timeout(db, 10000);
	r = map_err(sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;", NULL,
	                         NULL, NULL));
	if (r < 0)
		goto out;
	struct sq *q = calloc(1, sizeof *q);
	if (q == NULL) {
		r = SPACED_ENOMEM;
		goto out;
	}
	q->db = db;
	*h = q;
	*ops = &sqlite_ops;
	db = NULL;
out:
	if (db != NULL)
		sqlite3_close(db);
	return r;
}
