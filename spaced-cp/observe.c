/* observe.c — the control plane's metrics and audit log (see observe.h). */
#include "observe.h"
#include "channel.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cp.h"
#include "log.h"
#include "ratelimit.h"
#include "util.h"

/* Endpoints as counted: the first that matches method and path shape. */
enum ep { EP_CREATE, EP_ROUTE, EP_MOVE, EP_PAUSE, EP_RESUME, EP_SNAPSHOT, EP_DELETE, EP_TIMEOUT, EP_SANDBOX_READ,
          EP_WORKERS, EP_JOIN, EP_REGISTER, EP_HEARTBEAT, EP_QUOTA, EP_ADMIN, EP_OTHER, EP__COUNT };
static const char *const ep_names[EP__COUNT] = {
	"create", "route", "move", "pause", "resume", "snapshot", "delete", "timeout", "sandbox_read",
	"workers", "join", "register", "heartbeat", "quota", "admin", "other"};
/* status classes: 2xx 3xx 4xx 5xx (and 1xx counted as 2xx) */
#define CLASSES 4
static const char *const class_names[CLASSES] = {"2xx", "3xx", "4xx", "5xx"};
#define BUCKETS 13
static const double bounds[BUCKETS - 1] = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};

static struct {
	_Atomic uint64_t n[EP__COUNT][CLASSES];
	_Atomic uint64_t hist[EP__COUNT][BUCKETS];
	_Atomic uint64_t sum_us[EP__COUNT];
	_Atomic uint64_t count[EP__COUNT];
	_Atomic uint64_t unauthorized;
	_Atomic uint64_t audit_suppressed; /* refusals' audit lines held back */
	_Atomic uint64_t rate_limited;     /* creates and policy updates past their tenant's rate */
} M;

void cp_observe_rate_limited(void)
{
	atomic_fetch_add(&M.rate_limited, 1);
}

static int audit_fd = -1;
static pthread_mutex_t audit_mu = PTHREAD_MUTEX_INITIALIZER;

static enum ep classify(const char *method, const char *path)
{
	bool get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0, del = strcmp(method, "DELETE") == 0;
	char p[256];
	size_t pl = strcspn(path, "?"); /* the path without its query */
	pl = pl < sizeof p ? pl : sizeof p - 1;
	memcpy(p, path, pl);
	p[pl] = '\0';
	const char *seg[6] = {0};
	int n = 0;
	for (char *save = NULL, *t = strtok_r(p, "/", &save); t && n < 6; t = strtok_r(NULL, "/", &save))
		seg[n++] = t;
	if (n < 2 || strcmp(seg[0], "v1") != 0)
		return EP_OTHER;
	if (strcmp(seg[1], "sandboxes") == 0) {
		if (n == 2)
			return post ? EP_CREATE : EP_SANDBOX_READ;
		if (n == 3)
			return del ? EP_DELETE : EP_SANDBOX_READ;
		static const struct {
			const char *name;
			enum ep ep;
		} acts[] = {{"route", EP_ROUTE},   {"move", EP_MOVE},         {"pause", EP_PAUSE},
		            {"resume", EP_RESUME}, {"snapshot", EP_SNAPSHOT}, {"timeout", EP_TIMEOUT}};
		for (size_t i = 0; n == 4 && post && i < sizeof acts / sizeof acts[0]; i++)
			if (strcmp(seg[3], acts[i].name) == 0)
				return acts[i].ep;
		return get ? EP_SANDBOX_READ : EP_OTHER;
	}
	if (strcmp(seg[1], "workers") == 0) {
		if (n == 2)
			return post ? EP_REGISTER : EP_WORKERS;
		if (n == 3 && strcmp(seg[2], "join") == 0)
			return EP_JOIN;
		if (n == 4 && strcmp(seg[3], "heartbeat") == 0)
			return EP_HEARTBEAT;
		return EP_WORKERS;
	}
	if (strcmp(seg[1], "quota") == 0)
		return EP_QUOTA;
	if (strcmp(seg[1], "admin") == 0)
		return EP_ADMIN;
	return EP_OTHER;
}

int cp_audit_open(const char *state_dir)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/audit.log", state_dir);
	audit_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	return audit_fd < 0 ? -1 : 0;
}

static void audit(json_t *e)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	char when[40];
	size_t k = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(when + k, sizeof when - k, ".%03ldZ", ts.tv_nsec / 1000000);
	json_t *line = json_pack("{s:s}", "time", when);
	json_object_update(line, e);
	json_decref(e);
	char *text = json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(line);
	if (!text)
		return;
	size_t len = strlen(text);
	text[len] = '\n';
	pthread_mutex_lock(&audit_mu);
	if (audit_fd >= 0 && write(audit_fd, text, len + 1) != (ssize_t)(len + 1))
		spaced_log("spaced-cp", "level=error event=audit-write-failed");
	pthread_mutex_unlock(&audit_mu);
	free(text);
}

void cp_audit_admin(const char *command, const char *subject, int ok)
{
	audit(json_pack("{s:s,s:s,s:s,s:b}", "event", "admin", "command", command, "subject", subject ? subject : "",
	                "ok", ok));
}

/* A caller's refusals held back past its rate: one line, each reason's count
 * (DESIGN §5: every DENY in the audit log with its caller and reason). */
static void refusals_summary(void *ctx, const char *caller, const struct spaced_ratelimit_held *held, size_t n)
{
	(void)ctx;
	json_t *e = spaced_ratelimit_summary_json(caller, held, n);
	if (e)
		audit(e);
}

/* A tenant's routes held back past its rate: one route-summary line. */
static void routes_summary(void *ctx, const char *caller, const struct spaced_ratelimit_held *held, size_t n)
{
	(void)ctx;
	json_t *e = spaced_ratelimit_summary_json(caller, held, n);
	if (e) {
		json_object_set_new(e, "event", json_string("route-summary"));
		audit(e);
	}
}

static pthread_mutex_t refusals_mu = PTHREAD_MUTEX_INITIALIZER;
static struct spaced_ratelimit *refusals;
static struct spaced_ratelimit *routes; /* route lines, per tenant (under refusals_mu too) */

/* Whether the audit line of one more route of tenant may be written: a
 * route changes nothing, but names who got a capability for what, so
 * routes are audited like refusals, at a rate per tenant (a client
 * looping on routes wrote 0.9 MB a second of them); past it they are
 * counted and summarized per tenant. */
static bool route_allowed(const char *tenant)
{
	char key[SPACED_CALLER_KEY_MAX];
	/* no colon: a caller key is read as address:port (ratelimit.h) */
	snprintf(key, sizeof key, "tenant/%s", tenant && tenant[0] ? tenant : "-");
	pthread_mutex_lock(&refusals_mu);
	if (!routes && (routes = spaced_ratelimit_audit_deny()))
		spaced_ratelimit_on_summary(routes, routes_summary, NULL);
	bool ok = !routes || spaced_ratelimit_take(routes, key, "route", spaced_mono_ns());
	if (!ok)
		atomic_fetch_add(&M.audit_suppressed, 1);
	pthread_mutex_unlock(&refusals_mu);
	return ok;
}

/* Whether the audit line of one more refused request of caller may be
 * written (ratelimit.h: a flood of 401s cannot fill the control plane's
 * disk); when not, it is counted by reason and written in its caller's
 * summary (cp_observe_flush). */
static bool refusal_allowed(const char *caller, const char *reason)
{
	pthread_mutex_lock(&refusals_mu);
	if (!refusals && (refusals = spaced_ratelimit_audit_deny()))
		spaced_ratelimit_on_summary(refusals, refusals_summary, NULL);
	bool ok = !refusals || spaced_ratelimit_take(refusals, caller, reason, spaced_mono_ns());
	if (!ok)
		atomic_fetch_add(&M.audit_suppressed, 1);
	pthread_mutex_unlock(&refusals_mu);
	return ok;
}

void cp_observe_flush(bool all)
{
	pthread_mutex_lock(&refusals_mu);
	spaced_ratelimit_flush(refusals, spaced_mono_ns(), all);
	spaced_ratelimit_flush(routes, spaced_mono_ns(), all);
	pthread_mutex_unlock(&refusals_mu);
}

void cp_observe_request(const struct cp_req *rq, const char *tenant, uint64_t ns)
{
	enum ep ep = classify(rq->method, rq->path);
	int cls = rq->status >= 500 ? 3 : rq->status >= 400 ? 2 : rq->status >= 300 ? 1 : 0;
	atomic_fetch_add(&M.n[ep][cls], 1);
	atomic_fetch_add(&M.count[ep], 1);
	atomic_fetch_add(&M.sum_us[ep], ns / 1000);
	double s = (double)ns / 1e9;
	int b = 0;
	while (b < BUCKETS - 1 && s > bounds[b])
		b++;
	atomic_fetch_add(&M.hist[ep][b], 1);
	bool changed = strcmp(rq->method, "GET") != 0 && rq->status >= 200 && rq->status < 300;
	if (rq->status == 401)
		atomic_fetch_add(&M.unauthorized, 1);
	if (!changed && rq->status != 401 && rq->status != 403)
		return;
	if (!changed && !refusal_allowed(rq->peer, rq->status == 401 ? "unauthorized" : "forbidden"))
		return; /* a flood of refusals past its caller's rate: counted, summarized */
	if (changed && ep == EP_ROUTE && !route_allowed(tenant))
		return; /* likewise a tenant's routes */
	char path[sizeof rq->path];
	snprintf(path, sizeof path, "%s", rq->path);
	path[strcspn(path, "?")] = '\0';
	json_t *e = json_pack("{s:s,s:s,s:s,s:i,s:s,s:s}", "event",
	                      rq->status == 401 ? "unauthorized" : rq->status == 403 ? "forbidden" : ep_names[ep],
	                      "method", rq->method, "path", path, "status", rq->status, "caller", rq->peer, "request_id",
	                      rq->request_id);
	if (tenant && tenant[0])
		json_object_set_new(e, "tenant", json_string(tenant));
	if (changed && rq->resp) {
		/* what the answer names: the sandbox, its generation and worker */
		json_error_t jerr;
		json_t *a = json_loads(rq->resp, 0, &jerr);
		json_t *id = json_object_get(a, "id"), *gen = json_object_get(a, "generation"),
		       *w = json_object_get(a, "worker");
		if (json_is_string(id))
			json_object_set(e, "sandbox", id);
		if (json_is_integer(gen))
			json_object_set(e, "generation", gen);
		if (json_is_string(w))
			json_object_set(e, "worker", w);
		json_decref(a);
	}
	audit(e);
}

static void put(char **buf, size_t *len, size_t *cap, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void put(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	if (n <= 0)
		return;
	if ((size_t)n >= sizeof line)
		n = sizeof line - 1;
	if (*len + (size_t)n + 1 > *cap) {
		size_t nc = (*cap ? *cap * 2 : 65536) + (size_t)n;
		char *nb = realloc(*buf, nc);
		if (!nb)
			return;
		*buf = nb;
		*cap = nc;
	}
	memcpy(*buf + *len, line, (size_t)n);
	*len += (size_t)n;
	(*buf)[*len] = '\0';
}

#define PUT(...) put(&buf, &len, &cap, __VA_ARGS__)

char *cp_metrics_text(struct cp *cp, struct cp_store *st)
{
	(void)cp;
	char *buf = NULL;
	size_t len = 0, cap = 0;
	PUT("# HELP spaced_cp_requests_total API requests answered, by endpoint and status class.\n"
	    "# TYPE spaced_cp_requests_total counter\n");
	for (int e = 0; e < EP__COUNT; e++)
		for (int c = 0; c < CLASSES; c++)
			if (atomic_load(&M.n[e][c]))
				PUT("spaced_cp_requests_total{endpoint=\"%s\",status=\"%s\"} %llu\n", ep_names[e], class_names[c],
				    (unsigned long long)atomic_load(&M.n[e][c]));
	PUT("# HELP spaced_cp_request_seconds Time to answer an API request, by endpoint (create, route, move: "
	    "the lifecycle as clients see it).\n# TYPE spaced_cp_request_seconds histogram\n");
	for (int e = 0; e < EP__COUNT; e++) {
		uint64_t total = atomic_load(&M.count[e]);
		if (!total)
			continue;
		uint64_t cum = 0;
		for (int b = 0; b < BUCKETS - 1; b++) {
			cum += atomic_load(&M.hist[e][b]);
			PUT("spaced_cp_request_seconds_bucket{endpoint=\"%s\",le=\"%g\"} %llu\n", ep_names[e], bounds[b],
			    (unsigned long long)cum);
		}
		PUT("spaced_cp_request_seconds_bucket{endpoint=\"%s\",le=\"+Inf\"} %llu\n", ep_names[e],
		    (unsigned long long)total);
		PUT("spaced_cp_request_seconds_sum{endpoint=\"%s\"} %.6f\n", ep_names[e],
		    (double)atomic_load(&M.sum_us[e]) / 1e6);
		PUT("spaced_cp_request_seconds_count{endpoint=\"%s\"} %llu\n", ep_names[e], (unsigned long long)total);
	}
	uint64_t prep_req = 0, prep_idle = 0;
	cp_store_sqlite_prepared(&prep_req, &prep_idle);
	PUT("# HELP spaced_cp_sql_prepared_total SQL statements prepared (SQLite: each request thread keeps its "
	    "own), while serving a request or by an idle thread ahead of need.\n"
	    "# TYPE spaced_cp_sql_prepared_total counter\n"
	    "spaced_cp_sql_prepared_total{when=\"request\"} %llu\nspaced_cp_sql_prepared_total{when=\"idle\"} %llu\n",
	    (unsigned long long)prep_req, (unsigned long long)prep_idle);
	PUT("# HELP spaced_cp_sql_vm_steps_total Steps of SQLite's virtual machine over every statement the "
	    "control plane ran (SQLite only): its store's work, which grows with the rows statements visit.\n"
	    "# TYPE spaced_cp_sql_vm_steps_total counter\nspaced_cp_sql_vm_steps_total %llu\n",
	    (unsigned long long)cp_store_sqlite_vm_steps());
	uint64_t syncs = 0, sync_ns = 0, tsent = 0, tlost = 0;
	cp_store_sqlite_log_syncs(&syncs, &sync_ns);
	cp_chan_tentative_counts(&tsent, &tlost);
	PUT("# HELP spaced_cp_log_syncs_total Syncs of the store's log by the control plane itself (SQLite: once "
	    "at start, then after each batch of creates, which commits without the disk and is made durable while "
	    "its installs are on their way).\n"
	    "# TYPE spaced_cp_log_syncs_total counter\nspaced_cp_log_syncs_total %llu\n"
	    "# HELP spaced_cp_log_sync_seconds_total Time those syncs took.\n"
	    "# TYPE spaced_cp_log_sync_seconds_total counter\nspaced_cp_log_sync_seconds_total %.6f\n",
	    (unsigned long long)syncs, (double)sync_ns / 1e9);
	PUT("# HELP spaced_cp_tentative_installs_total Installs sent before their commit was durable, and those "
	    "a worker's hello reported that the store had lost (a crash of its machine; their sandboxes destroyed).\n"
	    "# TYPE spaced_cp_tentative_installs_total counter\n"
	    "spaced_cp_tentative_installs_total{outcome=\"sent\"} %llu\n"
	    "spaced_cp_tentative_installs_total{outcome=\"lost\"} %llu\n",
	    (unsigned long long)tsent, (unsigned long long)tlost);
	PUT("# HELP spaced_cp_unauthorized_total Requests refused for their key (401).\n"
	    "# TYPE spaced_cp_unauthorized_total counter\nspaced_cp_unauthorized_total %llu\n",
	    (unsigned long long)atomic_load(&M.unauthorized));
	PUT("# HELP spaced_cp_audit_suppressed_total Refusals whose audit line was held back (a caller past its rate).\n"
	    "# TYPE spaced_cp_audit_suppressed_total counter\nspaced_cp_audit_suppressed_total %llu\n",
	    (unsigned long long)atomic_load(&M.audit_suppressed));
	PUT("# HELP spaced_cp_rate_limited_total Creates and network policy updates refused (429) for their tenant's "
	    "rate (--create-rate).\n"
	    "# TYPE spaced_cp_rate_limited_total counter\nspaced_cp_rate_limited_total %llu\n",
	    (unsigned long long)atomic_load(&M.rate_limited));
	struct cp_rows *rows = NULL;
	PUT("# HELP spaced_cp_sandboxes Sandboxes in the store, by state.\n# TYPE spaced_cp_sandboxes gauge\n");
	if (CP_Q0(st, &rows, NULL, "SELECT state, COUNT(*) FROM sandboxes WHERE deleted = 0 GROUP BY state") == 0)
		for (int i = 0; i < rows->nrows; i++)
			PUT("spaced_cp_sandboxes{state=\"%s\"} %lld\n", cp_rows_get(rows, i, 0),
			    (long long)cp_rows_i64(rows, i, 1, 0));
	cp_rows_free(rows);
	rows = NULL;
	PUT("# HELP spaced_cp_worker_connected Whether a worker's control channel is open (1) or not (0).\n"
	    "# TYPE spaced_cp_worker_connected gauge\n");
	PUT("# HELP spaced_cp_worker_unacked Control messages sent to a worker and not yet acknowledged.\n"
	    "# TYPE spaced_cp_worker_unacked gauge\n");
	if (CP_Q0(st, &rows, NULL,
	         "SELECT w.id, w.channel_until, "
	         "(SELECT COUNT(*) FROM outbox o WHERE o.worker = w.id AND o.acked = 0) FROM workers w ORDER BY w.id") == 0)
		for (int i = 0; i < rows->nrows; i++) {
			PUT("spaced_cp_worker_connected{worker=\"%s\"} %d\n", cp_rows_get(rows, i, 0),
			    cp_worker_live(cp_rows_get(rows, i, 0), cp_rows_i64(rows, i, 1, 0), spaced_now()) ? 1 : 0);
			PUT("spaced_cp_worker_unacked{worker=\"%s\"} %lld\n", cp_rows_get(rows, i, 0),
			    (long long)cp_rows_i64(rows, i, 2, 0));
		}
	cp_rows_free(rows);
	if (!buf)
		buf = strdup("");
	return buf;
}
