/* store_sqlite.c — the embedded SQLite backend: WAL, synchronous=FULL, writers
 * serialized by BEGIN IMMEDIATE, parameters bound by their $N names.
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

static int sq_script(void *h, const char *sql)
{
	return map_err(sqlite3_exec(h, sql, NULL, NULL, NULL));
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
	if (sqlite3_get_autocommit(h))
		writer_release();
	return r;
}

static void sq_rollback(void *h)
{
	if (!sqlite3_get_autocommit(h))
		sqlite3_exec(h, "ROLLBACK", NULL, NULL, NULL);
	writer_release();
}

static int sq_exec(void *h, const char *sql, int n, const char *const *params, struct cp_rows **out,
                   long *changes)
{
	sqlite3 *db = h;
	sqlite3_stmt *stmt = NULL;
	struct cp_rows *rows = NULL;
	bool autowrite = false;
	int r, rc, cap = 0;
	rc = sqlite3_prepare_v2(db, sql, -1, &stmt, NULL);
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
	sqlite3_finalize(stmt);
	if (autowrite)
		writer_release();
	return r;
}

static void sq_close(void *h)
{
	sqlite3_close(h);
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
	r = sq_script(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;");
	if (r < 0)
		goto out;
	*h = db;
	*ops = &sqlite_ops;
	db = NULL;
out:
	if (db != NULL)
		sqlite3_close(db);
	return r;
}
