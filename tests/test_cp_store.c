/*
 * test-cp-store — the control plane's SQLite store (spaced-cp/store_sqlite.c):
 * the handles of one database share one writer connection, on which every
 * transaction and every write outside one runs, one thread at a time; reads
 * outside a transaction stay on the thread's own handle. A relaxed write
 * (cp_store_relaxed) leaves the writer committing without waiting for the
 * disk only for itself: the next write that is not relaxed waits again. The
 * writer's log is copied into the database by a thread of its own, not by
 * the commits.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "store.h"

static char dir[64], url[128];

static void setup(void)
{
	snprintf(dir, sizeof dir, "/tmp/test-cp-store-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(url, sizeof url, "sqlite:%s/cp.db", dir);
}

static void teardown(void)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	cr_assert_eq(system(cmd), 0);
}

static struct cp_store *open_store(void)
{
	struct cp_store *st = NULL;
	cr_assert_eq(cp_store_open(url, &st), 0);
	return st;
}

/* The one integer a query answers, or -1 when it fails. */
static long long one(struct cp_store *st, const char *sql)
{
	struct cp_rows *rows = NULL;
	long long v = -1;
	if (CP_Q0(st, &rows, NULL, sql) == 0 && rows->nrows == 1)
		v = cp_rows_i64(rows, 0, 0, -1);
	cp_rows_free(rows);
	return v;
}

TestSuite(cp_store, .init = setup, .fini = teardown);

/* A temporary table lives on the connection that made it: made in a
 * transaction of one handle, it is found by a transaction of another and by
 * a write of a third outside any (the same writer connection: a statement
 * seen to write goes there without being prepared on the thread's own
 * connection, which has no such table), and not by a read outside a
 * transaction (its own connection). */
Test(cp_store, writes_of_every_handle_run_on_one_connection)
{
	struct cp_store *a = open_store(), *b = open_store(), *w = open_store();
	cr_assert_eq(cp_store_begin(a), 0);
	cr_assert_eq(CP_Q0(a, NULL, NULL, "CREATE TEMP TABLE probe (x INTEGER)"), 0);
	cr_assert_eq(CP_Q0(a, NULL, NULL, "INSERT INTO probe VALUES (7)"), 0);
	cr_assert_eq(cp_store_commit(a), 0);
	cr_assert_eq(CP_Q0(w, NULL, NULL, "INSERT INTO probe VALUES (7)"), 0);
	cr_assert_eq(cp_store_begin(b), 0);
	cr_assert_eq(one(b, "SELECT sum(x) FROM probe"), 14);
	cr_assert_eq(cp_store_commit(b), 0);
	/* outside a transaction b reads on its own connection: no such table */
	cr_assert_eq(one(b, "SELECT sum(x) FROM probe"), -1);
	cp_store_close(a);
	cp_store_close(b);
	cp_store_close(w);
	/* the last handle closed the writer: a new one has no such table */
	struct cp_store *c = open_store();
	cr_assert_eq(cp_store_begin(c), 0);
	cr_assert_eq(one(c, "SELECT count(*) FROM probe"), -1);
	cp_store_rollback(c);
	cp_store_close(c);
}

/* synchronous as a transaction of the writer sees it: 2 FULL, 1 NORMAL
 * (a prepared PRAGMA answers what held when it was prepared, and the store
 * keeps its statements prepared: each reading is a text of its own) */
static long long txn_synchronous(struct cp_store *st)
{
	static int n;
	char sql[64];
	snprintf(sql, sizeof sql, "PRAGMA synchronous /* %d */", ++n);
	cr_assert_eq(cp_store_begin(st), 0);
	long long v = one(st, sql);
	cr_assert_eq(cp_store_commit(st), 0);
	return v;
}

Test(cp_store, a_relaxed_write_relaxes_only_itself)
{
	struct cp_store *a = open_store(), *b = open_store();
	cr_assert_eq(txn_synchronous(a), 2);
	cp_store_relaxed(a, 1);
	cr_assert_eq(txn_synchronous(a), 1);
	cr_assert_eq(CP_Q0(a, NULL, NULL, "CREATE TABLE IF NOT EXISTS t (x INTEGER)"), 0);
	cp_store_relaxed(a, 0);
	/* the next write, of this handle or another, waits for the disk again */
	cr_assert_eq(txn_synchronous(b), 2);
	cp_store_relaxed(a, 1);
	cr_assert_eq(CP_Q0(a, NULL, NULL, "INSERT INTO t VALUES (1)"), 0);
	cp_store_relaxed(a, 0);
	cr_assert_eq(txn_synchronous(a), 2);
	cp_store_close(a);
	cp_store_close(b);
}

/* Eight threads, each with its own handle: transactions of several
 * statements, writes of their own and reads outside any, at once. Every
 * row is there, each transaction's rows together. */
#define THREADS 8
#define ROUNDS 60
static void *worker(void *arg)
{
	long id = (long)arg;
	struct cp_store *st = NULL;
	if (cp_store_open(url, &st) < 0)
		return (void *)1;
	long bad = 0;
	for (int i = 0; i < ROUNDS && !bad; i++) {
		char k[32], v[32];
		snprintf(k, sizeof k, "%ld", id);
		snprintf(v, sizeof v, "%d", i);
		if (i % 3 == 0) {
			bad += CP_Q(st, NULL, NULL, "INSERT INTO rows_t (k, v) VALUES ($1, $2)", k, v) != 0;
		} else {
			bad += cp_store_begin(st) != 0;
			bad += CP_Q(st, NULL, NULL, "INSERT INTO rows_t (k, v) VALUES ($1, $2)", k, v) != 0;
			bad += CP_Q(st, NULL, NULL, "INSERT INTO rows_t (k, v) VALUES ($1, $2)", k, v) != 0;
			bad += cp_store_commit(st) != 0;
		}
		/* a read outside a transaction: this thread's rows, always in pairs
		 * but for the single ones */
		struct cp_rows *rows = NULL;
		bad += CP_Q(st, &rows, NULL, "SELECT count(*) FROM rows_t WHERE k = $1", k) != 0;
		cp_rows_free(rows);
	}
	cp_store_close(st);
	return (void *)bad;
}

Test(cp_store, threads_writing_and_reading_at_once)
{
	struct cp_store *st = open_store();
	cr_assert_eq(CP_Q0(st, NULL, NULL, "CREATE TABLE rows_t (k TEXT, v INTEGER)"), 0);
	pthread_t t[THREADS];
	for (long i = 0; i < THREADS; i++)
		cr_assert_eq(pthread_create(&t[i], NULL, worker, (void *)i), 0);
	for (int i = 0; i < THREADS; i++) {
		void *r;
		pthread_join(t[i], &r);
		cr_assert_eq((long)r, 0, "thread %d failed", i);
	}
	/* per thread: 20 single rows, 40 transactions of two */
	cr_assert_eq(one(st, "SELECT count(*) FROM rows_t"), THREADS * (ROUNDS / 3 + 2 * (ROUNDS - ROUNDS / 3)));
	cr_assert_eq(one(st, "SELECT count(*) FROM (SELECT k, v FROM rows_t GROUP BY k, v HAVING count(*) = 2)"),
	             THREADS * (ROUNDS - ROUNDS / 3));
	cp_store_close(st);
}

static long long file_size(const char *name)
{
	char p[128];
	struct stat sb;
	snprintf(p, sizeof p, "%s/%s", dir, name);
	return stat(p, &sb) == 0 ? (long long)sb.st_size : -1;
}

/* commits of a row of 3000 bytes each (a page of their own: each commit
 * writes three to the log, with the tree's root and the database's first
 * page), relaxed */
static void commit_pages(struct cp_store *st, int n)
{
	char v[3000];
	memset(v, 'x', sizeof v - 1);
	v[sizeof v - 1] = 0;
	cp_store_relaxed(st, 1);
	for (int i = 0; i < n; i++)
		cr_assert_eq(CP_Q(st, NULL, NULL, "INSERT INTO pages VALUES ($1)", v), 0);
	cp_store_relaxed(st, 0);
}

/* The log is copied into the database by the writer's checkpointer, not by
 * the commits: 500 commits, about 1500 pages of log (past the 1000 that wake
 * it, under the 2000 at which a commit copies it itself), and the database
 * holds them within seconds; with the thread kept from waking, it stays one
 * page. */
Test(cp_store, the_checkpointer_copies_the_log)
{
	struct cp_store *st = open_store();
	cr_assert_eq(CP_Q0(st, NULL, NULL, "CREATE TABLE pages (v TEXT)"), 0);
	commit_pages(st, 500);
	long long db = 0;
	for (int k = 0; k < 200 && (db = file_size("cp.db")) < 400LL * 4096; k++)
		usleep(50 * 1000);
	cr_assert_geq(db, 400LL * 4096, "the database holds %lld bytes: its log was not copied in", db);
	cp_store_close(st);
}

/* A stream of commits with no pause (the checkpointer copying beside it
 * never sees all of the log copied with no commit in between, so the log
 * would never be reused from its start): 6000 commits leave a log of at most
 * about 2000 pages (8 MiB), where it grew to 75 MB without the commits'
 * own copy past that mark. */
Test(cp_store, a_stream_of_commits_leaves_the_log_bounded)
{
	struct cp_store *st = open_store();
	cr_assert_eq(CP_Q0(st, NULL, NULL, "CREATE TABLE pages (v TEXT)"), 0);
	commit_pages(st, 6000);
	long long wal = file_size("cp.db-wal");
	cr_assert_lt(wal, 10LL << 20, "the log grew to %lld bytes", wal);
	cr_assert_eq(one(st, "SELECT count(*) FROM pages"), 6000);
	cp_store_close(st);
}
