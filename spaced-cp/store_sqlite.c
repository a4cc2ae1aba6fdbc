/* store_sqlite.c — the embedded SQLite backend: WAL, synchronous=FULL, writers
 * serialized by BEGIN IMMEDIATE, parameters bound by their $N names.
 *
 * Each handle keeps its prepared statements (SQ_CACHE of them, the least
 * recently used one replaced): the control plane runs the same few dozen
 * statements over and over, and preparing one (parsing, planning) cost as
 * much as running it. A statement is reset after every use, so none holds
 * a read transaction open between calls. The texts of the statements run
 * are also kept for the whole process, and an idle thread prepares in its
 * handle the most used ones it lacks (cp_store_warm): a burst
 * of requests then finds every thread's statements prepared, where each
 * thread used to prepare all of a request's statements in that request's
 * time the first time it served one of its kind (≈ 40 % of the control
 * plane's CPU in a burst of creates). The statements of the transactions
 * themselves (BEGIN IMMEDIATE, COMMIT) are prepared with the handle.
 *
 * The writers of this process also queue on one mutex before they take
 * SQLite's write lock: SQLite's own wait for a busy lock sleeps and polls
 * (1, 2, 5 … up to 100 ms), so fifty threads writing at once would wait for
 * each other's sleeps, not for each other's work. Other processes (admin
 * commands) still meet the busy timeout. A connection is used by one thread
 * at a time (store.h): opened without SQLite's own per-call mutex.
 *
 * The writer: whoever holds that queue's turn runs its statements, reads
 * included, on one connection per database, shared by every handle of the
 * process that opened the same path (struct sq's writer). SQLite drops a
 * connection's whole page cache when it finds that another connection wrote
 * since it last read; with each thread writing on its own connection, every
 * transaction (a create's, its acknowledgement's) found its pages dropped
 * and read each again from the kernel. Writes on one connection leave its
 * cache valid from one transaction to the next. Reads outside a transaction
 * stay on the thread's own handle, many at once.
 *
 * The checkpoint: SQLite copies its log into the database once the log
 * holds 1000 pages, in the commit that crossed them (about 1.5 ms here, two
 * syncs), with the writers' turn held, so one create in about fifty waited
 * for it and so did every writer queued behind. Each writer's commits
 * instead wake a thread of its own, which checkpoints on a connection of its
 * own (PASSIVE: it waits for no reader or writer) while they go on; a
 * commit still copies the log itself once it holds 2000 pages (a stream of
 * commits the thread cannot catch up with: on_wal_commit). */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "spaced_error.h"
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

/* The statements of the transactions themselves, prepared with each handle.
 * Not the synchronous pragmas: SQLite applies PRAGMA synchronous while it
 * prepares the statement, so running a prepared one again changes nothing
 * (relaxed writes then waited for the disk). */
static const char *const txn_sql[] = {"BEGIN IMMEDIATE", "COMMIT"};
#define TXN_N (sizeof txn_sql / sizeof txn_sql[0])

/* A handle: the connection and its statements (one thread at a time). */
struct sq {
	sqlite3 *db;
	sqlite3_stmt *txn[TXN_N]; /* txn_sql's, NULL where it did not prepare */
	struct sq_cached cache[SQ_CACHE];
	uint64_t tick;
	uint64_t warm_at; /* the value of seen_count it was last warmed at */
	struct sq *writer; /* the writer connection of its database (NULL: this is one) */
	/* a writer only: its path, the handles sharing it, the next writer of
	 * another path, and whether it commits without waiting for the disk now */
	char *path;
	char *wal_path; /* its log's file, as SQLite names it (cp_store_sqlite_sync_log) */
	int users;
	struct sq *next_writer;
	bool synchronous_normal;
	struct ckpt *ckpt; /* its checkpointer, or NULL (SQLite's own then) */
};

static struct sq *conn_now(struct sq *q);
static void ckpt_stop(struct ckpt *c);

/* The statements handles of this process ran (the first SEEN_MAX), with how
 * many handles prepared each: an idle handle prepares the SEEN_WARM most
 * prepared ones (cp_store_warm), the rest of its cache left to its own
 * requests. */
#define SEEN_MAX (2 * SQ_CACHE)
#define SEEN_WARM (3 * SQ_CACHE / 4)
static struct {
	pthread_mutex_t mu;
	char *sql[SEEN_MAX];
	uint64_t hash[SEEN_MAX];
	unsigned count[SEEN_MAX];
	size_t n;
} seen = {.mu = PTHREAD_MUTEX_INITIALIZER};
static atomic_uint_fast64_t seen_count;
/* statements prepared while serving a request, and by idle threads */
static atomic_uint_fast64_t prepared_request, prepared_idle;
/* the virtual machine's steps of every statement run through sq_exec */
static atomic_uint_fast64_t vm_steps;

static uint64_t sql_hash(const char *sql)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (const unsigned char *c = (const unsigned char *)sql; *c; c++)
		h = (h ^ *c) * 1099511628211ull;
	return h;
}

/* Notes sql among the statements this process runs, once. */
static void seen_add(const char *sql, uint64_t h)
{
	pthread_mutex_lock(&seen.mu);
	bool known = false;
	for (size_t i = 0; i < seen.n && !known; i++)
		if (seen.hash[i] == h && strcmp(seen.sql[i], sql) == 0) {
			seen.count[i]++;
			known = true;
		}
	char *copy = known || seen.n == SEEN_MAX ? NULL : strdup(sql);
	if (copy) {
		seen.sql[seen.n] = copy;
		seen.count[seen.n] = 1;
		seen.hash[seen.n++] = h;
		atomic_fetch_add(&seen_count, 1);
	}
	pthread_mutex_unlock(&seen.mu);
}

/* The statements seen to write (their sql_hash, the first WRITES_MAX): a
 * write outside a transaction goes to the writer without being prepared on
 * the thread's own handle first to find out (a hash shared with a read only
 * sends that read to the writer too). */
#define WRITES_MAX 256
static struct {
	pthread_mutex_t mu;
	uint64_t hash[WRITES_MAX];
	size_t n;
} writes = {.mu = PTHREAD_MUTEX_INITIALIZER};

static bool write_known(uint64_t h)
{
	bool known = false;
	pthread_mutex_lock(&writes.mu);
	for (size_t i = 0; i < writes.n && !known; i++)
		known = writes.hash[i] == h;
	pthread_mutex_unlock(&writes.mu);
	return known;
}

static void write_note(uint64_t h)
{
	if (write_known(h))
		return;
	pthread_mutex_lock(&writes.mu);
	if (writes.n < WRITES_MAX)
		writes.hash[writes.n++] = h;
	pthread_mutex_unlock(&writes.mu);
}

/* sql's statement (h: its sql_hash) in q's cache, marked used; NULL when
 * q has not prepared it. */
static sqlite3_stmt *stmt_cached(struct sq *q, const char *sql, uint64_t h)
{
	for (size_t i = 0; i < SQ_CACHE; i++) {
		struct sq_cached *c = &q->cache[i];
		if (c->stmt && c->hash == h && strcmp(sqlite3_sql(c->stmt), sql) == 0) {
			c->used = ++q->tick;
			return c->stmt;
		}
	}
	return NULL;
}

/* stmt_get; idle: for cp_store_warm (counted apart). */
static int stmt_get_as(struct sq *q, const char *sql, bool share, bool idle, sqlite3_stmt **out)
{
	uint64_t h = sql_hash(sql);
	if ((*out = stmt_cached(q, sql, h)) != NULL)
		return SQLITE_OK;
	struct sq_cached *victim = &q->cache[0];
	for (size_t i = 1; i < SQ_CACHE; i++) {
		struct sq_cached *c = &q->cache[i];
		if (!victim->stmt)
			break;
		if (!c->stmt || c->used < victim->used)
			victim = c;
	}
	sqlite3_stmt *st = NULL;
	int rc = sqlite3_prepare_v3(q->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL);
	if (rc != SQLITE_OK)
		return rc;
	atomic_fetch_add(idle ? &prepared_idle : &prepared_request, 1);
	if (victim->stmt)
		sqlite3_finalize(victim->stmt);
	*victim = (struct sq_cached){.stmt = st, .hash = h, .used = ++q->tick};
	*out = st;
	if (!sqlite3_stmt_readonly(st))
		write_note(h);
	else if (share)
		seen_add(sql, h);
	return SQLITE_OK;
}

/* The prepared statement of sql, from the cache or prepared now (and kept;
 * with share and when it only reads, noted for the other handles:
 * cp_store_warm; writes run on the writer, whose cache keeps them). */
static int stmt_get(struct sq *q, const char *sql, bool share, sqlite3_stmt **out)
{
	return stmt_get_as(q, sql, share, false, out);
}

/* A script: those every transaction runs (txn_sql) run prepared, others
 * through sqlite3_exec. */
static int sq_script(void *h, const char *sql)
{
	struct sq *q = conn_now(h);
	sqlite3_stmt *st = NULL;
	for (size_t i = 0; i < TXN_N && !st; i++)
		if (strcmp(sql, txn_sql[i]) == 0)
			st = q->txn[i];
	if (st == NULL)
		return map_err(sqlite3_exec(q->db, sql, NULL, NULL, NULL));
	int rc;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW)
		;
	sqlite3_reset(st);
	return map_err(rc);
}

int cp_store_sqlite_warm(void *h)
{
	struct sq *q = h;
	uint64_t now = atomic_load(&seen_count);
	if (q->warm_at == now)
		return 0;
	char *todo[SEEN_WARM];
	size_t n = 0;
	bool taken[SEEN_MAX] = {false};
	pthread_mutex_lock(&seen.mu);
	for (size_t round = 0; round < SEEN_WARM && round < seen.n; round++) {
		size_t best = SEEN_MAX; /* the most prepared one not taken yet */
		for (size_t i = 0; i < seen.n; i++)
			if (!taken[i] && (best == SEEN_MAX || seen.count[i] > seen.count[best]))
				best = i;
		taken[best] = true;
		bool have = false;
		for (size_t k = 0; k < SQ_CACHE && !have; k++)
			have = q->cache[k].stmt && q->cache[k].hash == seen.hash[best] &&
			       strcmp(sqlite3_sql(q->cache[k].stmt), seen.sql[best]) == 0;
		if (!have)
			todo[n++] = seen.sql[best]; /* kept for the process's life */
	}
	pthread_mutex_unlock(&seen.mu);
	int made = 0;
	for (size_t i = 0; i < n; i++) {
		sqlite3_stmt *st;
		made += stmt_get_as(q, todo[i], false, true, &st) == SQLITE_OK;
	}
	q->warm_at = now;
	return made;
}

uint64_t cp_store_sqlite_seen(void)
{
	return atomic_load(&seen_count);
}

uint64_t cp_store_sqlite_vm_steps(void)
{
	return atomic_load(&vm_steps);
}

void cp_store_sqlite_prepared(uint64_t *in_requests, uint64_t *idle)
{
	*in_requests = atomic_load(&prepared_request);
	*idle = atomic_load(&prepared_idle);
}

/* The writers' queue. Relaxed writes (cp_store_relaxed: one short
 * statement or a small batch that does not wait for the disk) go before the
 * transactions that do: a call that got its ack waits for no create's fsync. */
static pthread_mutex_t wmu = PTHREAD_MUTEX_INITIALIZER;
static bool wheld;
/* The writers waiting, in two queues (relaxed ones first), each woken alone
 * when its turn comes: the writer that releases hands over to the next one
 * (fifty waiting writers woken at every release made ≈ 2,500 wake-ups of a
 * burst of creates, each going back to sleep but one). */
struct wwait {
	struct wwait *next;
	pthread_cond_t cv;
	bool granted;
};
static struct wwait *wq[2], **wq_tail[2] = {&wq[0], &wq[1]}; /* [1]: relaxed */
static __thread bool holds_writer; /* a handle is used by one thread at a time */
static __thread bool relaxed, relaxed_first; /* commits without the disk; ahead of the queue */

static void writer_take(void)
{
	pthread_mutex_lock(&wmu);
	int high = relaxed_first ? 1 : 0;
	/* a relaxed writer goes before the waiting transactions, others queue */
	if (!wheld && wq[1] == NULL && (high || wq[0] == NULL)) {
		wheld = true;
	} else {
		struct wwait w = {.next = NULL};
		pthread_cond_init(&w.cv, NULL);
		*wq_tail[high] = &w;
		wq_tail[high] = &w.next;
		while (!w.granted)
			pthread_cond_wait(&w.cv, &wmu);
		pthread_cond_destroy(&w.cv);
	}
	pthread_mutex_unlock(&wmu);
	holds_writer = true;
}

static void writer_release(void)
{
	if (!holds_writer)
		return;
	holds_writer = false;
	pthread_mutex_lock(&wmu);
	int q = wq[1] ? 1 : wq[0] ? 0 : -1;
	if (q < 0) {
		wheld = false;
	} else {
		/* handed over: wheld stays true */
		struct wwait *w = wq[q];
		wq[q] = w->next;
		if (wq[q] == NULL)
			wq_tail[q] = &wq[q];
		w->granted = true;
		pthread_cond_signal(&w->cv);
	}
	pthread_mutex_unlock(&wmu);
}

void cp_store_sqlite_relaxed(int on)
{
	relaxed = on != 0;
	relaxed_first = on == 1;
}

/* The writers of the databases this process opened, one per path (each
 * used only by the thread that holds the writers' turn). */
static pthread_mutex_t writers_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sq *writers;

/* The handle whose connection runs q's statements now: its database's
 * writer while this thread holds the writers' turn, else q. */
static struct sq *conn_now(struct sq *q)
{
	return holds_writer && q->writer ? q->writer : q;
}

/* Once the turn is taken, before its transaction (SQLite refuses the pragma
 * inside one): the writer commits as this thread asked (cp_store_relaxed:
 * synchronous=NORMAL, else FULL). 0, or SPACED_EIO when SQLite refuses
 * (the write then does not run: a write meant to wait for the disk never
 * commits without). */
static int writer_mode(struct sq *w)
{
	if (w->synchronous_normal == relaxed || !sqlite3_get_autocommit(w->db))
		return 0;
	int rc = sqlite3_exec(w->db, relaxed ? "PRAGMA synchronous=NORMAL" : "PRAGMA synchronous=FULL", NULL, NULL,
	                      NULL);
	if (rc != SQLITE_OK)
		return map_err(rc);
	w->synchronous_normal = relaxed;
	return 0;
}

static int sq_begin(void *h)
{
	if (!holds_writer)
		writer_take();
	struct sq *w = conn_now(h);
	int r = writer_mode(w);
	if (r == 0)
		r = sq_script(w, "BEGIN IMMEDIATE");
	if (r < 0)
		writer_release();
	return r;
}

static int sq_commit(void *h)
{
	struct sq *w = conn_now(h);
	int r = sq_script(w, "COMMIT");
	if (sqlite3_get_autocommit(w->db))
		writer_release();
	return r;
}

static void sq_rollback(void *h)
{
	sqlite3 *db = conn_now(h)->db;
	if (!sqlite3_get_autocommit(db))
		sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
	writer_release();
}

static int sq_exec(void *h, const char *sql, int n, const char *const *params, struct cp_rows **out,
                   long *changes)
{
	struct sq *q = conn_now(h);
	sqlite3 *db;
	sqlite3_stmt *stmt = NULL;
	struct cp_rows *rows = NULL;
	bool autowrite = false;
	int r, rc, cap = 0;
	/* a write of its own (outside a transaction) queues like a transaction
	 * and runs on the writer: at once when this handle has not prepared it
	 * and it is known to write (the writes' list is looked at only then:
	 * not for every read), else once its statement says so */
	uint64_t hash = sql_hash(sql);
	if (!holds_writer && q->writer && stmt_cached(q, sql, hash) == NULL && write_known(hash)) {
		autowrite = true;
		writer_take();
		q = conn_now(h);
		if ((r = writer_mode(q)) < 0)
			goto out;
	}
	rc = stmt_get(q, sql, q->writer != NULL, &stmt);
	if (rc != SQLITE_OK) {
		r = map_err(rc);
		goto out;
	}
	if (!holds_writer && sqlite3_get_autocommit(q->db) && !sqlite3_stmt_readonly(stmt)) {
		autowrite = true;
		writer_take();
		q = conn_now(h);
		stmt = NULL;
		if ((r = writer_mode(q)) < 0)
			goto out;
		if ((rc = stmt_get(q, sql, false, &stmt)) != SQLITE_OK) {
			r = map_err(rc);
			goto out;
		}
	}
	db = q->db;
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
		atomic_fetch_add(&vm_steps, (uint64_t)sqlite3_stmt_status(stmt, SQLITE_STMTSTATUS_VM_STEP, 1));
		sqlite3_reset(stmt);
		sqlite3_clear_bindings(stmt);
	}
	if (autowrite)
		writer_release();
	return r;
}

/* A connection and its statements, gone. */
static void conn_free(struct sq *q)
{
	for (size_t i = 0; i < SQ_CACHE; i++)
		if (q->cache[i].stmt)
			sqlite3_finalize(q->cache[i].stmt);
	for (size_t i = 0; i < TXN_N; i++)
		sqlite3_finalize(q->txn[i]);
	sqlite3_close(q->db);
	free(q->path);
	free(q->wal_path);
	free(q);
}

/* A handle, and its database's writer with the last handle sharing it. */
static void sq_close(void *h)
{
	struct sq *q = h, *w = q->writer;
	conn_free(q);
	if (w == NULL)
		return;
	pthread_mutex_lock(&writers_mu);
	if (--w->users == 0) {
		struct sq **p = &writers;
		while (*p != w)
			p = &(*p)->next_writer;
		*p = w->next_writer;
		ckpt_stop(w->ckpt);
		conn_free(w);
	}
	pthread_mutex_unlock(&writers_mu);
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

/* One connection to path with its transactions' statements prepared. */
static int conn_open(const char *path, struct sq **out)
{
	sqlite3 *db = NULL;
	int r;
	if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
	                    NULL) != SQLITE_OK) {
		r = SPACED_EIO;
		goto out;
	}
	sqlite3_busy_timeout(db, 10000);
	/* temp_store=MEMORY: a savepoint's journal (each create of a group has
	 * one) and sorts stay in memory; in a file they created, wrote and
	 * unlinked a file under /var/tmp in every create's transaction */
	r = map_err(sqlite3_exec(db,
	                         "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON; "
	                         "PRAGMA temp_store=MEMORY;",
	                         NULL, NULL, NULL));
	if (r < 0)
		goto out;
	struct sq *q = calloc(1, sizeof *q);
	if (q == NULL) {
		r = SPACED_ENOMEM;
		goto out;
	}
	q->db = db;
	for (size_t i = 0; i < TXN_N; i++)
		if (sqlite3_prepare_v3(db, txn_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &q->txn[i], NULL) != SQLITE_OK)
			q->txn[i] = NULL; /* run through sqlite3_exec instead */
	*out = q;
	db = NULL;
out:
	if (db != NULL)
		sqlite3_close(db);
	return r;
}

/* A writer's checkpointer: its thread, and its own connection. */
#define CKPT_FRAMES 1000 /* SQLite's own threshold (wal_autocheckpoint) */
struct ckpt {
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;  /* broadcast: a copy wanted, one over, the end */
	bool want, stop;
	bool running;       /* the thread is copying */
	struct sq *conn;
};

static void *ckpt_main(void *arg)
{
	struct ckpt *c = arg;
	pthread_mutex_lock(&c->mu);
	for (;;) {
		while (!c->want && !c->stop)
			pthread_cond_wait(&c->cv, &c->mu);
		if (c->stop)
			break;
		c->want = false;
		c->running = true;
		pthread_mutex_unlock(&c->mu);
		int log = 0, done = 0;
		sqlite3_wal_checkpoint_v2(c->conn->db, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
		pthread_mutex_lock(&c->mu);
		c->running = false;
		pthread_cond_broadcast(&c->cv);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

/* SQLite's hook after each commit of a writer (in the committing thread,
 * the writers' turn held): past CKPT_FRAMES in the log, its checkpointer is
 * woken. Past CKPT_FRAMES_MAX the checkpointer fell behind a stream of
 * commits: the log is reused from its start only once all of it was copied
 * with no commit in between, which a thread copying beside the commits may
 * never see, and the log would grow without end. That commit copies it
 * itself then, as SQLite's own checkpoint did, the writers' turn held so
 * that no commit comes in between: once the thread's copy, if one runs, is
 * over (SQLite lets one checkpoint run at a time and does not wait for it),
 * and with the thread kept from starting another meanwhile. */
#define CKPT_FRAMES_MAX (2 * CKPT_FRAMES)
static int on_wal_commit(void *arg, sqlite3 *db, const char *name, int frames)
{
	struct ckpt *c = arg;
	if (frames < CKPT_FRAMES)
		return SQLITE_OK;
	pthread_mutex_lock(&c->mu);
	if (frames >= CKPT_FRAMES_MAX) {
		while (c->running)
			pthread_cond_wait(&c->cv, &c->mu);
		c->want = false;
		int log = 0, done = 0;
		sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
	} else {
		c->want = true;
		pthread_cond_broadcast(&c->cv);
	}
	pthread_mutex_unlock(&c->mu);
	return SQLITE_OK;
}

/* w's checkpointer, started; on failure w keeps SQLite's own checkpoints. */
static void ckpt_start(struct sq *w, const char *path)
{
	struct ckpt *c = calloc(1, sizeof *c);
	if (c == NULL || conn_open(path, &c->conn) < 0) {
		free(c);
		return;
	}
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	if (pthread_create(&c->thread, NULL, ckpt_main, c) != 0) {
		conn_free(c->conn);
		pthread_mutex_destroy(&c->mu);
		pthread_cond_destroy(&c->cv);
		free(c);
		return;
	}
	w->ckpt = c;
	sqlite3_wal_hook(w->db, on_wal_commit, c); /* in place of wal_autocheckpoint's */
}

/* The checkpointer of a writer being closed: its thread ended, its
 * connection closed. */
static void ckpt_stop(struct ckpt *c)
{
	if (c == NULL)
		return;
	pthread_mutex_lock(&c->mu);
	c->stop = true;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	pthread_join(c->thread, NULL);
	conn_free(c->conn);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cv);
	free(c);
}

static _Atomic uint64_t log_syncs, log_sync_ns;

void cp_store_sqlite_log_syncs(uint64_t *n, uint64_t *ns)
{
	*n = atomic_load(&log_syncs);
	*ns = atomic_load(&log_sync_ns);
}

int cp_store_sqlite_sync_log(void *h)
{
	struct sq *q = h, *w = q->writer ? q->writer : q;
	if (w->wal_path == NULL)
		return SPACED_EINVAL;
	/* any descriptor of the file: the kernel writes the file's pages, not
	 * the descriptor's (SQLite's own is used by the writer meanwhile) */
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int fd = open(w->wal_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return SPACED_EIO; /* the log is there while a connection is open (WAL mode) */
	int r = fdatasync(fd) == 0 ? 0 : SPACED_EIO;
	close(fd);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	atomic_fetch_add(&log_syncs, 1);
	atomic_fetch_add(&log_sync_ns, (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec)));
	return r;
}

int cp_store_sqlite_open(const char *path, void **h, const struct cp_store_ops **ops)
{
	struct sq *q = NULL, *w;
	int r = conn_open(path, &q);
	if (r < 0)
		return r;
	pthread_mutex_lock(&writers_mu);
	for (w = writers; w && strcmp(w->path, path) != 0; w = w->next_writer)
		;
	if (w == NULL && (r = conn_open(path, &w)) == 0) {
		const char *main_file = sqlite3_db_filename(w->db, "main");
		const char *wal = main_file ? sqlite3_filename_wal(main_file) : NULL;
		if ((w->path = strdup(path)) == NULL || wal == NULL || (w->wal_path = strdup(wal)) == NULL) {
			conn_free(w);
			w = NULL;
			r = SPACED_ENOMEM;
		} else {
			w->next_writer = writers;
			writers = w;
			ckpt_start(w, path);
		}
	}
	if (w != NULL) {
		w->users++;
		q->writer = w;
	}
	pthread_mutex_unlock(&writers_mu);
	if (r < 0) {
		conn_free(q);
		return r;
	}
	*h = q;
	*ops = &sqlite_ops;
	return 0;
}
