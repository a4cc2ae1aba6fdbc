/* store.c — backend dispatch, the schema, and result helpers of the control plane's store. */
#include "store.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spaced_error.h"

struct cp_store {
	void *h;
	const struct cp_store_ops *ops;
};

/* One schema for both backends: TEXT and BIGINT only, times in Unix seconds. */
static const char schema[] =
	"CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT);"
	"CREATE TABLE IF NOT EXISTS tenants (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, created BIGINT NOT NULL);"
	"CREATE TABLE IF NOT EXISTS api_keys (key_id TEXT PRIMARY KEY, hash TEXT NOT NULL, role TEXT NOT NULL,"
	" tenant TEXT, created BIGINT NOT NULL);"
	"CREATE TABLE IF NOT EXISTS workers (id TEXT PRIMARY KEY, url TEXT NOT NULL, capacity BIGINT NOT NULL,"
	" substrates TEXT NOT NULL, enroll_key TEXT NOT NULL, next_seq BIGINT NOT NULL, last_seen BIGINT NOT NULL,"
	" acked_seq BIGINT NOT NULL DEFAULT 0, channel_until BIGINT NOT NULL DEFAULT 0, channel_replica TEXT, created BIGINT NOT NULL);"
	"CREATE TABLE IF NOT EXISTS sandboxes (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, state TEXT NOT NULL,"
	" generation BIGINT NOT NULL, worker TEXT, substrate TEXT NOT NULL, activation TEXT NOT NULL,"
	" spec TEXT NOT NULL, snapshot TEXT, op TEXT, op_until BIGINT NOT NULL DEFAULT 0, last_error TEXT,"
	" created BIGINT NOT NULL, last_active BIGINT NOT NULL, idle_timeout BIGINT NOT NULL,"
	" max_lifetime BIGINT NOT NULL, deleted BIGINT NOT NULL DEFAULT 0, install_seq BIGINT NOT NULL DEFAULT 0,"
	" snapshot_hash TEXT, snapshot_bytes BIGINT NOT NULL DEFAULT 0);"
	"CREATE INDEX IF NOT EXISTS sandboxes_tenant ON sandboxes (tenant, deleted);"
	"CREATE INDEX IF NOT EXISTS sandboxes_worker ON sandboxes (worker, deleted);"
	"CREATE TABLE IF NOT EXISTS outbox (worker TEXT NOT NULL, seq BIGINT NOT NULL, type TEXT NOT NULL,"
	" body TEXT NOT NULL, created BIGINT NOT NULL, acked BIGINT NOT NULL DEFAULT 0, ok BIGINT,"
	" result TEXT, PRIMARY KEY (worker, seq));"
	"CREATE TABLE IF NOT EXISTS signing_keys (kid TEXT PRIMARY KEY, pub TEXT NOT NULL, not_before BIGINT NOT NULL,"
	" not_after BIGINT NOT NULL, active_from BIGINT NOT NULL DEFAULT 0, created BIGINT NOT NULL);"
	"CREATE TABLE IF NOT EXISTS generations (sandbox TEXT NOT NULL, generation BIGINT NOT NULL,"
	" worker TEXT NOT NULL, activation TEXT NOT NULL, created BIGINT NOT NULL, PRIMARY KEY (sandbox, generation));"
	/* templates (docs/templates.md): a tenant's names for content-hashed trees
	 * held in the store (STATE/store/templates/HASH.tar) */
	"CREATE TABLE IF NOT EXISTS templates (tenant TEXT NOT NULL, name TEXT NOT NULL, hash TEXT NOT NULL,"
	" bytes BIGINT NOT NULL, entries BIGINT NOT NULL, config TEXT, source TEXT NOT NULL, created BIGINT NOT NULL,"
	" PRIMARY KEY (tenant, name));"
	/* template builds: each step's result, keyed by its parent and the step */
	"CREATE TABLE IF NOT EXISTS build_steps (tenant TEXT NOT NULL, parent TEXT NOT NULL, step TEXT NOT NULL,"
	" hash TEXT NOT NULL, config TEXT, created BIGINT NOT NULL, PRIMARY KEY (tenant, parent, step));"
	/* a tenant's rates shared by the replicas of one PostgreSQL store
	 * (api.c rate_allows): each kind's next theoretical arrival, in Unix
	 * microseconds */
	"CREATE TABLE IF NOT EXISTS rate_buckets (k TEXT PRIMARY KEY, tat BIGINT NOT NULL);";

/* Columns added after the first schema, in the order they came. */
static const struct {
	const char *table, *column, *type;
} added[] = {
	{"sandboxes", "snapshot_hash", "TEXT"},
	{"sandboxes", "snapshot_bytes", "BIGINT NOT NULL DEFAULT 0"},
	/* the limits a sandbox runs under (the placed worker's defaults filled in) */
	{"sandboxes", "cpu_milli", "BIGINT NOT NULL DEFAULT 0"},
	{"sandboxes", "memory_bytes", "BIGINT NOT NULL DEFAULT 0"},
	{"sandboxes", "pids", "BIGINT NOT NULL DEFAULT 0"},
	{"sandboxes", "disk_bytes", "BIGINT NOT NULL DEFAULT 0"},
	/* a worker's resource defaults and maxima (JSON), from its hello */
	{"workers", "limits", "TEXT"},
	/* a tenant's quotas (-1: the control plane's default); quota_seq is
	 * bumped by every create, which takes the tenant's row lock */
	{"tenants", "max_sandboxes", "BIGINT NOT NULL DEFAULT -1"},
	{"tenants", "max_memory", "BIGINT NOT NULL DEFAULT -1"},
	{"tenants", "max_disk", "BIGINT NOT NULL DEFAULT -1"},
	{"tenants", "quota_seq", "BIGINT NOT NULL DEFAULT 0"},
	{"tenants", "max_templates", "BIGINT NOT NULL DEFAULT -1"},
	/* the sum of its sandboxes' task limits a tenant may hold (-1: the default) */
	{"tenants", "max_pids", "BIGINT NOT NULL DEFAULT -1"},
	/* the highest seq whose outbox row was removed (cp_deleted_sweep) */
	{"workers", "outbox_pruned_to", "BIGINT NOT NULL DEFAULT 0"},
	/* next_seq before the last start of the control plane moved it on by
	 * CP_SEQ_JUMP (channel.h cp_chan_seq_restart; 0: never moved) */
	{"workers", "seq_jumped", "BIGINT NOT NULL DEFAULT 0"},
	/* the highest seq a hello listed as tentative that the store had lost,
	 * settled (its sandbox's destroy queued: channel.c chan_hello_tentative) */
	{"workers", "seq_settled", "BIGINT NOT NULL DEFAULT 0"},
	/* when a key stops being valid (0: never) and when a join token was used */
	{"api_keys", "expires", "BIGINT NOT NULL DEFAULT 0"},
	{"api_keys", "used", "BIGINT NOT NULL DEFAULT 0"},
	/* the template a sandbox runs on (its hash; NULL: the worker's own /usr and /etc) */
	{"sandboxes", "template_hash", "TEXT"},
	/* a build step's tree's archive bytes (counted in its tenant's templates quota) */
	{"build_steps", "bytes", "BIGINT NOT NULL DEFAULT 0"},
	/* paused by the idle timeout (an auto-resume sandbox is resumed by its next route) */
	{"sandboxes", "idle_paused", "BIGINT NOT NULL DEFAULT 0"},
	/* where the serving execution's ServicePort gateway listens on its worker (0: none) */
	{"sandboxes", "gateway", "BIGINT NOT NULL DEFAULT 0"},
	/* restarts of a failed sandbox by its restart policy, counted since restarts_since */
	{"sandboxes", "restarts", "BIGINT NOT NULL DEFAULT 0"},
	{"sandboxes", "restarts_since", "BIGINT NOT NULL DEFAULT 0"},
	/* the sandbox a message is about (NULL: none, e.g. keys): an earlier
	 * execution's worker confirms it stopped by acknowledging them */
	{"outbox", "sandbox", "TEXT"},
	/* when an operator declared the worker lost (0: not), until its next hello */
	{"workers", "lost", "BIGINT NOT NULL DEFAULT 0"},
	/* the seconds without the control plane after which the worker fences
	 * itself (its hello's fence_after; 0: it never does) */
	{"workers", "fence_after", "BIGINT NOT NULL DEFAULT 0"},
	/* the create's Idempotency-Key (NULL: none): a retry with it gets the same sandbox */
	{"sandboxes", "idem_key", "TEXT"},
	/* the highest seq whose outbox row's body was compacted (cp_outbox_compact) */
	{"workers", "outbox_compacted_to", "BIGINT NOT NULL DEFAULT 0"},
};

/* Indexes over columns of `added`, made once every column exists. A
 * deleted sandbox's row is kept a week (--retain-deleted): what runs per
 * second (the reaper's timeouts) and per scrape (the count by state) reads
 * the live rows through this index, never every row kept (a create reads
 * worker_usage on SQLite, below). */
static const char indexes[] =
	"CREATE INDEX IF NOT EXISTS sandboxes_live ON sandboxes (worker, state, memory_bytes, pids) WHERE deleted = 0;"
	/* a sandbox's messages (ops.c unconfirmed_worker), and each worker's
	 * first one not acknowledged (cp_outbox_compact, cp_deleted_sweep) */
	"DROP INDEX IF EXISTS outbox_unacked;" /* an earlier version's, superseded by outbox_sandbox */
	"CREATE INDEX IF NOT EXISTS outbox_sandbox ON outbox (sandbox, worker);"
	"CREATE INDEX IF NOT EXISTS outbox_unacked_seq ON outbox (worker, seq) WHERE acked = 0;"
	"CREATE UNIQUE INDEX IF NOT EXISTS sandboxes_idem ON sandboxes (tenant, idem_key) WHERE idem_key IS NOT NULL;"
	/* whether anything names a tree (templates.c tree_pinned), asked under
	 * the store's archive lock at every template delete and sweep */
	"CREATE INDEX IF NOT EXISTS templates_hash ON templates (hash);"
	"CREATE INDEX IF NOT EXISTS build_steps_hash ON build_steps (hash);"
	"CREATE INDEX IF NOT EXISTS sandboxes_template ON sandboxes (template_hash) WHERE deleted = 0;";

/* Runs a script of CREATE ... IF NOT EXISTS up to three times: two replicas
 * creating the schema at once may collide on PostgreSQL's catalog, and the
 * loser then finds everything made. */
static int script_tries(struct cp_store *st, const char *sql)
{
	int r = 0;
	for (int i = 0; i < 3; i++)
		if ((r = st->ops->script(st->h, sql)) == 0)
			break;
	return r;
}

int cp_store_open(const char *url, struct cp_store **out)
{
	int r;
	struct cp_store *st = calloc(1, sizeof *st);
	if (st == NULL)
		return SPACED_ENOMEM;
	if (strncmp(url, "sqlite:", 7) == 0)
		r = cp_store_sqlite_open(url + 7, &st->h, &st->ops);
	else if (strncmp(url, "postgresql://", 13) == 0 || strncmp(url, "postgres://", 11) == 0)
		r = cp_store_pg_open(url, &st->h, &st->ops);
	else
		r = SPACED_EINVAL;
	if (r < 0)
		goto out;
	if ((r = script_tries(st, schema)) < 0)
		goto out;
	/* a store created before a column existed gains it */
	for (size_t i = 0; i < sizeof added / sizeof added[0]; i++) {
		char probe[160], alter[256];
		snprintf(probe, sizeof probe, "SELECT %s FROM %s LIMIT 0", added[i].column, added[i].table);
		if (st->ops->script(st->h, probe) == 0)
			continue;
		snprintf(alter, sizeof alter, "ALTER TABLE %s ADD COLUMN %s %s", added[i].table, added[i].column,
		         added[i].type);
		st->ops->script(st->h, alter);
		if ((r = st->ops->script(st->h, probe)) < 0)
			goto out;
	}
	if ((r = script_tries(st, indexes)) < 0)
		goto out;
	*out = st;
	st = NULL;
out:
	if (st != NULL) {
		if (st->ops != NULL)
			st->ops->close(st->h);
		free(st);
	}
	return r;
}

/* ---- what placement reads per worker, and a quota per tenant (SQLite) ----
 * The live sandboxes' count and sums per worker (worker_usage), kept by
 * triggers on sandboxes in the transaction that changes a row: a create
 * reads one row per worker, where summing the live rows cost it a pass over
 * every live sandbox of the fleet (11 ms at 20,000). A row counts while it
 * is not deleted, has a worker and is in one of placement's states; a change
 * that leaves it counted on the same worker with the same limits (starting
 * to running) writes nothing. The same per tenant (tenant_usage: every
 * sandbox not deleted counts, as the quotas count them), which a create
 * reads under the store's write lock: summing a tenant's rows there made
 * each create of a tenant holding thousands of sandboxes hold up every
 * other tenant's. PostgreSQL keeps the same tables otherwise (below). */
#define USAGE_COUNTED(R) CP_LIVE(R)
#define USAGE_SAME                                                                                            \
	"(" USAGE_COUNTED("OLD") " AND " USAGE_COUNTED("NEW") " AND OLD.worker = NEW.worker AND "                  \
	"OLD.memory_bytes = NEW.memory_bytes AND OLD.pids = NEW.pids)"
#define USAGE_ADD(R)                                                                                          \
	"INSERT INTO worker_usage (worker, sandboxes, memory_bytes, pids) VALUES (" R ".worker, 1, " R         \
	".memory_bytes, " R ".pids) ON CONFLICT (worker) DO UPDATE SET sandboxes = worker_usage.sandboxes + 1, " \
	"memory_bytes = worker_usage.memory_bytes + excluded.memory_bytes, pids = worker_usage.pids + "           \
	"excluded.pids;"
#define USAGE_SUB(R)                                                                                          \
	"UPDATE worker_usage SET sandboxes = sandboxes - 1, memory_bytes = memory_bytes - " R                  \
	".memory_bytes, pids = pids - " R ".pids WHERE worker = " R ".worker;"
#define USAGE_COLUMNS "worker, state, deleted, memory_bytes, pids"
#define TUSAGE_COUNTED(R) "(" R ".deleted = 0)"
#define TUSAGE_SAME                                                                                           \
	"(OLD.deleted = 0 AND NEW.deleted = 0 AND OLD.tenant = NEW.tenant AND OLD.memory_bytes = NEW.memory_bytes " \
	"AND OLD.disk_bytes = NEW.disk_bytes AND OLD.pids = NEW.pids)"
#define TUSAGE_ADD(R)                                                                                         \
	"INSERT INTO tenant_usage (tenant, sandboxes, memory_bytes, disk_bytes, pids) VALUES (" R ".tenant, 1, " R \
	".memory_bytes, " R ".disk_bytes, " R ".pids) ON CONFLICT (tenant) DO UPDATE SET sandboxes = "             \
	"tenant_usage.sandboxes + 1, memory_bytes = tenant_usage.memory_bytes + excluded.memory_bytes, "         \
	"disk_bytes = tenant_usage.disk_bytes + excluded.disk_bytes, pids = tenant_usage.pids + excluded.pids;"
#define TUSAGE_SUB(R)                                                                                         \
	"UPDATE tenant_usage SET sandboxes = sandboxes - 1, memory_bytes = memory_bytes - " R                  \
	".memory_bytes, disk_bytes = disk_bytes - " R ".disk_bytes, pids = pids - " R ".pids WHERE tenant = " R  \
	".tenant;"
#define TUSAGE_COLUMNS "tenant, deleted, memory_bytes, disk_bytes, pids"

/* one B-tree each (WITHOUT ROWID): the pages a create's commit writes */
static const char usage_table[] =
	"CREATE TABLE IF NOT EXISTS worker_usage (worker TEXT PRIMARY KEY, sandboxes BIGINT NOT NULL,"
	" memory_bytes BIGINT NOT NULL, pids BIGINT NOT NULL) WITHOUT ROWID;"
	"CREATE TABLE IF NOT EXISTS tenant_usage (tenant TEXT PRIMARY KEY, sandboxes BIGINT NOT NULL,"
	" memory_bytes BIGINT NOT NULL, disk_bytes BIGINT NOT NULL, pids BIGINT NOT NULL) WITHOUT ROWID;";

/* The four triggers that keep one of them: a row counted on insert, no
 * longer on delete, and on an update of COLUMNS, out of its old count and
 * into its new one unless both are the same (SAME). */
#define USAGE_TRIGGERS(NAME, COUNTED, SAME, ADD, SUB, COLUMNS)                                                \
	"CREATE TRIGGER IF NOT EXISTS " NAME "_insert AFTER INSERT ON sandboxes WHEN " COUNTED("NEW") " BEGIN "  \
	ADD("NEW") " END;"                                                                                     \
	"CREATE TRIGGER IF NOT EXISTS " NAME "_delete AFTER DELETE ON sandboxes WHEN " COUNTED("OLD") " BEGIN "  \
	SUB("OLD") " END;"                                                                                     \
	"CREATE TRIGGER IF NOT EXISTS " NAME "_leave AFTER UPDATE OF " COLUMNS " ON sandboxes WHEN "             \
	COUNTED("OLD") " AND NOT " SAME " BEGIN " SUB("OLD") " END;"                                             \
	"CREATE TRIGGER IF NOT EXISTS " NAME "_enter AFTER UPDATE OF " COLUMNS " ON sandboxes WHEN "             \
	COUNTED("NEW") " AND NOT " SAME " BEGIN " ADD("NEW") " END;"

static const char usage_sqlite[] =
	USAGE_TRIGGERS("sandboxes_usage", USAGE_COUNTED, USAGE_SAME, USAGE_ADD, USAGE_SUB, USAGE_COLUMNS);
static const char tusage_sqlite[] =
	USAGE_TRIGGERS("sandboxes_tusage", TUSAGE_COUNTED, TUSAGE_SAME, TUSAGE_ADD, TUSAGE_SUB, TUSAGE_COLUMNS);

/* Counted again from the rows, with every writer of sandboxes held off. */
static const char usage_recount[] =
	"DELETE FROM worker_usage;"
	"INSERT INTO worker_usage (worker, sandboxes, memory_bytes, pids) SELECT worker, COUNT(*),"
	" SUM(memory_bytes), SUM(pids) FROM sandboxes s WHERE " USAGE_COUNTED("s") " GROUP BY worker;"
	"DELETE FROM tenant_usage;"
	"INSERT INTO tenant_usage (tenant, sandboxes, memory_bytes, disk_bytes, pids) SELECT tenant, COUNT(*),"
	" SUM(memory_bytes), SUM(disk_bytes), SUM(pids) FROM sandboxes s WHERE " TUSAGE_COUNTED("s")
	" GROUP BY tenant;";

/* ---- the same on PostgreSQL: counters, and changes appended beside them ----
 * Counter rows that every create, move and delete updated would be locked
 * until each transaction commits, a batch of creates taking its tenants'
 * and their workers' rows in its own order: two replicas' transactions could
 * wait for each other. So a change appends its deltas (a row each in
 * worker_usage_delta and tenant_usage_delta, by one trigger: nothing is
 * locked but the new rows), readers add the deltas to the counters in one
 * statement (one snapshot), and the reaper folds the committed deltas into
 * the counters about once a second (cp_store_usage_fold: one replica at a
 * time, under an advisory lock). A create reads a handful of rows where it
 * summed every live sandbox (a create 13 -> 64 ms at 20,000: make bench-cp-scale, see
 * docs/control-plane.md). */
#define USAGE_FOLD_LOCK "7239915201"

static const char usage_table_pg[] =
	"CREATE TABLE IF NOT EXISTS worker_usage (worker TEXT PRIMARY KEY, sandboxes BIGINT NOT NULL,"
	" memory_bytes BIGINT NOT NULL, pids BIGINT NOT NULL);"
	"CREATE TABLE IF NOT EXISTS tenant_usage (tenant TEXT PRIMARY KEY, sandboxes BIGINT NOT NULL,"
	" memory_bytes BIGINT NOT NULL, disk_bytes BIGINT NOT NULL, pids BIGINT NOT NULL);"
	"CREATE TABLE IF NOT EXISTS worker_usage_delta (id BIGSERIAL PRIMARY KEY, worker TEXT NOT NULL,"
	" sandboxes BIGINT NOT NULL, memory_bytes BIGINT NOT NULL, pids BIGINT NOT NULL);"
	"CREATE TABLE IF NOT EXISTS tenant_usage_delta (id BIGSERIAL PRIMARY KEY, tenant TEXT NOT NULL,"
	" sandboxes BIGINT NOT NULL, memory_bytes BIGINT NOT NULL, disk_bytes BIGINT NOT NULL, pids BIGINT NOT NULL);"
	"CREATE INDEX IF NOT EXISTS tenant_usage_delta_tenant ON tenant_usage_delta (tenant);";

#define PG_WDELTA(R, S)                                                                                       \
	"INSERT INTO worker_usage_delta (worker, sandboxes, memory_bytes, pids) VALUES (" R ".worker, " S "1, " S \
	"COALESCE(" R ".memory_bytes, 0), " S "COALESCE(" R ".pids, 0));"
#define PG_TDELTA(R, S)                                                                                       \
	"INSERT INTO tenant_usage_delta (tenant, sandboxes, memory_bytes, disk_bytes, pids) VALUES (" R          \
	".tenant, " S "1, " S "COALESCE(" R ".memory_bytes, 0), " S "COALESCE(" R ".disk_bytes, 0), " S            \
	"COALESCE(" R ".pids, 0));"
/* as the SQLite triggers: out of the old count and into the new one, unless
 * the change leaves the row counted the same (SAME) */
static const char usage_pg[] =
	"CREATE OR REPLACE FUNCTION spaced_usage_delta() RETURNS trigger LANGUAGE plpgsql AS $f$ "
	"DECLARE same BOOLEAN := false; tsame BOOLEAN := false; "
	"BEGIN "
	"IF TG_OP = 'UPDATE' THEN same := COALESCE(" USAGE_SAME ", false); tsame := COALESCE(" TUSAGE_SAME
	", false); END IF; "
	"IF TG_OP <> 'INSERT' THEN "
	"IF NOT same AND COALESCE(" USAGE_COUNTED("OLD") ", false) THEN " PG_WDELTA("OLD", "-") " END IF; "
	"IF NOT tsame AND COALESCE(" TUSAGE_COUNTED("OLD") ", false) THEN " PG_TDELTA("OLD", "-") " END IF; "
	"END IF; "
	"IF TG_OP <> 'DELETE' THEN "
	"IF NOT same AND COALESCE(" USAGE_COUNTED("NEW") ", false) THEN " PG_WDELTA("NEW", "") " END IF; "
	"IF NOT tsame AND COALESCE(" TUSAGE_COUNTED("NEW") ", false) THEN " PG_TDELTA("NEW", "") " END IF; "
	"END IF; "
	"RETURN NULL; "
	"END $f$;"
	"CREATE OR REPLACE TRIGGER sandboxes_usage AFTER INSERT OR DELETE OR UPDATE OF tenant, worker, state, deleted,"
	" memory_bytes, disk_bytes, pids ON sandboxes FOR EACH ROW EXECUTE FUNCTION spaced_usage_delta();";

/* Counted again from the rows: every writer of sandboxes held off by the
 * table's lock, a fold by the advisory lock. */
static const char usage_recount_pg[] =
	"LOCK TABLE sandboxes IN SHARE ROW EXCLUSIVE MODE;"
	"SELECT pg_advisory_xact_lock(" USAGE_FOLD_LOCK ");"
	"DELETE FROM worker_usage_delta; DELETE FROM tenant_usage_delta;";

static const char usage_fold_pg[] =
	"WITH d AS (DELETE FROM worker_usage_delta RETURNING worker, sandboxes, memory_bytes, pids) "
	"INSERT INTO worker_usage (worker, sandboxes, memory_bytes, pids) SELECT worker, SUM(sandboxes),"
	" SUM(memory_bytes), SUM(pids) FROM d GROUP BY worker ORDER BY worker ON CONFLICT (worker) DO UPDATE SET "
	"sandboxes = worker_usage.sandboxes + excluded.sandboxes, memory_bytes = worker_usage.memory_bytes + "
	"excluded.memory_bytes, pids = worker_usage.pids + excluded.pids;"
	"WITH d AS (DELETE FROM tenant_usage_delta RETURNING tenant, sandboxes, memory_bytes, disk_bytes, pids) "
	"INSERT INTO tenant_usage (tenant, sandboxes, memory_bytes, disk_bytes, pids) SELECT tenant, SUM(sandboxes),"
	" SUM(memory_bytes), SUM(disk_bytes), SUM(pids) FROM d GROUP BY tenant ORDER BY tenant ON CONFLICT (tenant) "
	"DO UPDATE SET sandboxes = tenant_usage.sandboxes + excluded.sandboxes, memory_bytes = "
	"tenant_usage.memory_bytes + excluded.memory_bytes, disk_bytes = tenant_usage.disk_bytes + "
	"excluded.disk_bytes, pids = tenant_usage.pids + excluded.pids;";

static bool is_sqlite(const struct cp_store *st)
{
	return strcmp(st->ops->kind, "sqlite") == 0;
}

const char *cp_store_worker_usage(const struct cp_store *st)
{
	return is_sqlite(st) ? "worker_usage"
	                     : "(SELECT worker, SUM(sandboxes) AS sandboxes, SUM(memory_bytes) AS memory_bytes, "
	                       "SUM(pids) AS pids FROM (SELECT worker, sandboxes, memory_bytes, pids FROM worker_usage "
	                       "UNION ALL SELECT worker, sandboxes, memory_bytes, pids FROM worker_usage_delta) wu "
	                       "GROUP BY worker)";
}

const char *cp_store_tenant_usage(const struct cp_store *st)
{
	return is_sqlite(st) ? "tenant_usage"
	                     : "(SELECT tenant, SUM(sandboxes) AS sandboxes, SUM(memory_bytes) AS memory_bytes, "
	                       "SUM(disk_bytes) AS disk_bytes, SUM(pids) AS pids FROM (SELECT tenant, sandboxes, "
	                       "memory_bytes, disk_bytes, pids FROM tenant_usage UNION ALL SELECT tenant, sandboxes, "
	                       "memory_bytes, disk_bytes, pids FROM tenant_usage_delta) tu GROUP BY tenant)";
}

int cp_store_usage_setup(struct cp_store *st)
{
	bool lite = is_sqlite(st);
	int r = script_tries(st, lite ? usage_table : usage_table_pg);
	if (r == 0 && lite && (r = script_tries(st, usage_sqlite)) == 0)
		r = script_tries(st, tusage_sqlite);
	if (r == 0 && !lite)
		r = script_tries(st, usage_pg);
	/* SQLite: BEGIN IMMEDIATE, every other writer waits meanwhile */
	if (r == 0 && (r = cp_store_begin(st)) == 0 &&
	    ((!lite && (r = st->ops->script(st->h, usage_recount_pg)) < 0) ||
	     (r = st->ops->script(st->h, usage_recount)) < 0 || (r = cp_store_commit(st)) < 0))
		cp_store_rollback(st);
	return r;
}

int cp_store_usage_fold(struct cp_store *st)
{
	if (is_sqlite(st))
		return 0;
	struct cp_rows *got = NULL;
	int r = cp_store_begin(st);
	if (r < 0)
		return r;
	/* another replica folding now: its fold takes these too */
	if ((r = cp_store_exec(st, "SELECT pg_try_advisory_xact_lock(" USAGE_FOLD_LOCK ")", 0, NULL, &got, NULL)) == 0 &&
	    got->nrows == 1 && strcmp(cp_rows_get(got, 0, 0), "t") == 0)
		r = st->ops->script(st->h, usage_fold_pg);
	cp_rows_free(got);
	if (r == 0)
		r = cp_store_commit(st);
	if (r < 0)
		cp_store_rollback(st);
	return r;
}

void cp_store_close(struct cp_store *st)
{
	if (st == NULL)
		return;
	st->ops->close(st->h);
	free(st);
}

const char *cp_store_kind(const struct cp_store *st)
{
	return st->ops->kind;
}

int cp_store_relaxed(struct cp_store *st, int on)
{
	if (strcmp(st->ops->kind, "sqlite") == 0) {
		cp_store_sqlite_relaxed(on); /* the writer commits so (store_sqlite.c) */
		return 0;
	}
	return st->ops->script(st->h, on ? "SET synchronous_commit = off" : "SET synchronous_commit = on");
}

int cp_store_sync_log(struct cp_store *st)
{
	return strcmp(st->ops->kind, "sqlite") == 0 ? cp_store_sqlite_sync_log(st->h) : SPACED_EINVAL;
}

int cp_store_warm(struct cp_store *st)
{
	return strcmp(st->ops->kind, "sqlite") == 0 ? cp_store_sqlite_warm(st->h) : 0;
}

uint64_t cp_store_statements_seen(void)
{
	return cp_store_sqlite_seen();
}

int cp_store_begin(struct cp_store *st)
{
	return st->ops->begin(st->h);
}

int cp_store_commit(struct cp_store *st)
{
	int r = st->ops->commit(st->h);
	if (r < 0)
		st->ops->rollback(st->h);
	return r;
}

void cp_store_rollback(struct cp_store *st)
{
	st->ops->rollback(st->h);
}

int cp_store_exec(struct cp_store *st, const char *sql, int n, const char *const *params,
                  struct cp_rows **out, long *changes)
{
	return st->ops->exec(st->h, sql, n, params, out, changes);
}

struct cp_rows *cp_rows_new(int nrows, int ncols)
{
	struct cp_rows *r = calloc(1, sizeof *r);
	if (r == NULL)
		return NULL;
	r->nrows = nrows;
	r->ncols = ncols;
	if (nrows > 0 && ncols > 0) {
		r->v = calloc((size_t)nrows * (size_t)ncols, sizeof(char *));
		if (r->v == NULL) {
			free(r);
			return NULL;
		}
	}
	return r;
}

void cp_rows_free(struct cp_rows *r)
{
	if (r == NULL)
		return;
	if (r->v != NULL)
		for (long i = 0; i < (long)r->nrows * r->ncols; i++)
			free(r->v[i]);
	free(r->v);
	free(r);
}

const char *cp_rows_get(const struct cp_rows *rows, int r, int c)
{
	if (rows == NULL || r < 0 || c < 0 || r >= rows->nrows || c >= rows->ncols)
		return NULL;
	return rows->v[r * rows->ncols + c];
}

int64_t cp_rows_i64(const struct cp_rows *rows, int r, int c, int64_t def)
{
	const char *s = cp_rows_get(rows, r, c);
	if (s == NULL)
		return def;
	char *end;
	long long v = strtoll(s, &end, 10);
	return (*s == 0 || *end != 0) ? def : (int64_t)v;
}

const char *cp_i64(char buf[24], int64_t v)
{
	snprintf(buf, 24, "%" PRId64, v);
	return buf;
}
