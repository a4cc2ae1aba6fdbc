/*
 * api.c — the HTTP/JSON API (docs/cp-api.yaml): routing, authentication and
 * the answer of each endpoint. Runs on a request thread with its own store.
 * A tenant only ever sees its own sandboxes: another tenant's sandbox and a
 * missing one get the same 404 body.
 */
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <sodium.h>

#include "channel.h"
#include "cp.h"
#include "spaced_error.h"
#include "identity.h"
#include "observe.h"
#include "ratelimit.h"

json_t *cp_sandbox_list(struct cp_store *st, const char *tenant);

static void answer(struct cp_req *rq, int status, json_t *body)
{
	rq->status = status;
	rq->resp = body ? json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
	if (rq->resp == NULL)
		rq->resp = strdup("{}");
	json_decref(body);
}

static void bad_request(struct cp_req *rq, const char *why)
{
	answer(rq, 400, cp_error("bad-request", why));
}

/* The bucket of key in the store (rate_buckets), shared by every replica of
 * it: a cell-rate check (GCRA) in one statement — one more at now is allowed
 * when the next theoretical arrival is at most (burst - 1) intervals ahead
 * of now, and it moves one interval on. The replicas' clocks count (within
 * the few seconds cp.h allows them); a replica whose clock is behind only
 * allows less. 1 allowed, 0 not, < 0 the store's error. */
static int rate_take_shared(struct cp_store *st, const char *key, unsigned rate, unsigned burst)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	int64_t now = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000, t = 1000000 / (int64_t)rate;
	char b_now[24], b_t[24], b_tol[24];
	struct cp_rows *rows = NULL;
	int r = CP_Q(st, &rows, NULL,
	             "INSERT INTO rate_buckets (k, tat) VALUES ($1, CAST($2 AS BIGINT) + CAST($3 AS BIGINT)) "
	             "ON CONFLICT (k) DO UPDATE SET tat = (CASE WHEN rate_buckets.tat > CAST($2 AS BIGINT) "
	             "THEN rate_buckets.tat ELSE CAST($2 AS BIGINT) END) + CAST($3 AS BIGINT) "
	             "WHERE rate_buckets.tat - CAST($2 AS BIGINT) <= CAST($4 AS BIGINT) RETURNING tat",
	             key, cp_i64(b_now, now), cp_i64(b_t, t), cp_i64(b_tol, t * (int64_t)(burst - 1)));
	int ok = r < 0 ? r : rows != NULL && rows->nrows > 0;
	cp_rows_free(rows);
	return ok;
}

/* Whether tenant's rate of what ("create": a sandbox; "network": a policy
 * update; "lifecycle": a pause, snapshot, resume or move; "route": a route,
 * at CP_ROUTE_RATE_TIMES the rate) lets it have one more now (cp.h
 * CP_CREATE_RATE); when not, answers rq 429 rate-limited with Retry-After. A
 * token bucket per tenant and kind, CP_CREATE_BURST_S seconds' worth deep.
 * On a PostgreSQL store, which several replicas may share, creates, policy
 * updates and lifecycle operations count in the store (rate_take_shared):
 * the rate is the tenant's, whichever replicas it reaches. Routes, and
 * everything on SQLite, count in this process, kept for the last 4096
 * tenants seen (one not among them starts full): a route is read-mostly and
 * ten times as frequent, and routes from N replicas make at most N times
 * the route rate. A store that fails to answer counts here too. */
static bool rate_allows(const struct cp *cp, struct cp_store *st, struct cp_req *rq, const char *tenant,
                        const char *what)
{
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	static struct spaced_ratelimit *buckets, *route_buckets;
	char key[SPACED_CALLER_KEY_MAX], m[200];
	if (cp->create_rate == 0)
		return true;
	bool route = strcmp(what, "route") == 0;
	unsigned rate = cp->create_rate * (route ? CP_ROUTE_RATE_TIMES : 1);
	struct spaced_ratelimit **b = route ? &route_buckets : &buckets;
	/* no colon: a caller key is read as address:port (ratelimit.h); a
	 * tenant ID is "ten-" and 16 hex digits */
	snprintf(key, sizeof key, "%.7s/%.55s", what, tenant);
	int shared = !route && strcmp(cp_store_kind(st), "postgresql") == 0
	                 ? rate_take_shared(st, key, rate, rate * CP_CREATE_BURST_S)
	                 : -1;
	bool ok = shared == 1;
	if (shared < 0) {
		pthread_mutex_lock(&mu);
		if (*b == NULL)
			*b = spaced_ratelimit_new(rate, rate * CP_CREATE_BURST_S, UINT_MAX, UINT_MAX, 4096);
		ok = *b == NULL || spaced_ratelimit_take(*b, key, what, spaced_mono_ns());
		pthread_mutex_unlock(&mu);
	}
	if (ok)
		return true;
	cp_observe_rate_limited();
	snprintf(m, sizeof m, "this tenant makes at most %u %s a second (%u at once); try again in a second", rate,
	         strcmp(what, "create") == 0    ? "creates"
	         : strcmp(what, "network") == 0 ? "network policy updates"
	         : route                        ? "routes"
	                                        : "pauses, snapshots, resumes and moves",
	         rate * CP_CREATE_BURST_S);
	rq->retry_after = 1;
	answer(rq, 429, json_pack("{s:s,s:s,s:i}", "error", "rate-limited", "message", m, "retry_after", 1));
	return false;
}

/* Splits "/v1/a/b/c" into up to n segments; returns the count or -1 (empty
 * segments and paths not starting with '/' included). */
static int split_path(char *path, char **seg, int n)
{
	int k = 0;
	char *q = strchr(path, '?');
	if (q != NULL)
		*q = 0;
	if (path[0] != '/')
		return -1;
	for (char *p = path + 1; *p;) {
		if (k == n)
			return -1;
		seg[k++] = p;
		char *e = strchr(p, '/');
		if (e == NULL)
			break;
		*e = 0;
		p = e + 1;
	}
	for (int i = 0; i < k; i++)
		if (seg[i][0] == 0)
			return -1;
	return k;
}

static const char *bearer(const struct cp_req *rq)
{
	if (strncmp(rq->auth, "Bearer ", 7) != 0)
		return NULL;
	return rq->auth + 7;
}

static int auth(struct cp_store *st, struct cp_req *rq, enum cp_role role, char tenant[SPACED_NAME_MAX],
                char key_id[SPACED_NAME_MAX])
{
	const char *k = bearer(rq);
	int r = k ? cp_key_check(st, k, role, tenant, key_id) : SPACED_EPERM;
	if (r == 0 && tenant != NULL)
		snprintf(rq->tenant, sizeof rq->tenant, "%s", tenant);
	if (r == SPACED_EPERM) {
		answer(rq, 401, cp_error("unauthorized", "a valid API key is required (Authorization: Bearer …)"));
		return -1;
	}
	if (r < 0) {
		answer(rq, 503, cp_error("store", spaced_strerror(r)));
		return -1;
	}
	return 0;
}

int cp_worker_cert_check(const struct cp *cp, struct cp_req *rq, const char *worker)
{
	if (!cp->mtls)
		return 0;
	if (rq->peer_cert[0] == 0) {
		answer(rq, 401, cp_error("unauthorized", "the worker endpoints need a client certificate (mutual TLS) "
		                                         "signed by the workers' CA"));
		return -1;
	}
	if (worker != NULL && strcmp(rq->peer_cert, worker) != 0) {
		answer(rq, 403, cp_error("forbidden", "the client certificate names another worker"));
		return -1;
	}
	return 0;
}

static void workers_list(struct cp_store *st, struct cp_req *rq)
{
	struct cp_rows *rows = NULL;
	json_t *arr = json_array();
	int64_t now = spaced_now();
	char sql[1024]; /* each worker's live sandboxes: store.h cp_store_worker_usage */
	snprintf(sql, sizeof sql,
	         "SELECT w.id, w.url, w.capacity, w.substrates, w.last_seen, w.next_seq, w.acked_seq, w.channel_until, "
	         "COALESCE(u.sandboxes, 0), w.limits FROM workers w LEFT JOIN %s u ON u.worker = w.id ORDER BY w.id",
	         cp_store_worker_usage(st));
	if (arr == NULL || CP_Q0(st, &rows, NULL, sql) < 0) {
		json_decref(arr);
		answer(rq, 503, cp_error("store", "store unavailable"));
		return;
	}
	for (int i = 0; i < rows->nrows; i++) {
		json_t *subs = json_array();
		char buf[CP_SUBSTRATES_MAX * SPACED_NAME_MAX], seen[21] = "";
		snprintf(buf, sizeof buf, "%s", cp_rows_get(rows, i, 3) ? cp_rows_get(rows, i, 3) : "");
		for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
			json_array_append_new(subs, json_string(t));
		spaced_time_format(cp_rows_i64(rows, i, 4, 0), seen);
		/* live = connected: its control channel is open on a replica (cp.h
		 * CP_CHAN_UNTIL_S), this one's known without the store */
		bool live = cp_worker_live(cp_rows_get(rows, i, 0), cp_rows_i64(rows, i, 7, 0), now);
		json_array_append_new(
		    arr, json_pack("{s:s,s:s,s:s,s:I,s:I,s:o,s:s,s:I,s:I}", "id", cp_rows_get(rows, i, 0), "url",
		                   cp_rows_get(rows, i, 1), "state", live ? "live" : "down",
		                   "capacity", (json_int_t)cp_rows_i64(rows, i, 2, 0), "sandboxes",
		                   (json_int_t)cp_rows_i64(rows, i, 8, 0), "substrates", subs, "last_seen", seen,
		                   "last_seq", (json_int_t)cp_rows_i64(rows, i, 5, 0), "acked_seq",
		                   (json_int_t)cp_rows_i64(rows, i, 6, 0)));
		json_t *wj = json_array_get(arr, json_array_size(arr) - 1);
		json_object_set_new(wj, "connected", json_boolean(live));
		struct cp_worker_limits lim;
		cp_limits_from_text(cp_rows_get(rows, i, 9), &lim);
		if (lim.has)
			json_object_set_new(wj, "limits", cp_limits_json(&lim));
	}
	cp_rows_free(rows);
	answer(rq, 200, json_pack("{s:o}", "workers", arr));
}

/* Writes a worker's registration (its row: URL, capacity, substrates,
 * limits) inside the caller's transaction; a new worker's first message is
 * the verification-key bundle. key_id names the worker key it speaks with. */
static int worker_upsert(struct cp_store *st, const struct cp_worker_reg *w, const char *key_id)
{
	struct cp_rows *ex = NULL;
	char cap[24], now[24];
	long ch = 0;
	int r = CP_Q(st, &ex, NULL, "SELECT 1 FROM workers WHERE id = $1", w->id);
	if (r < 0)
		return r;
	char *lt = w->limits.has ? cp_limits_text(&w->limits) : NULL;
	if (ex->nrows == 0) {
		r = CP_Q(st, NULL, &ch,
		         "INSERT INTO workers (id, url, capacity, substrates, enroll_key, next_seq, last_seen, created, limits) "
		         "VALUES ($1, $2, $3, $4, $5, 0, $6, $6, $7)",
		         w->id, w->url, cp_i64(cap, w->capacity), w->substrates, key_id, cp_i64(now, spaced_now()), lt);
		if (r == 0)
			r = cp_push_bundle(st, w->id);
	} else {
		r = CP_Q(st, NULL, &ch,
		         "UPDATE workers SET url = $2, capacity = $3, substrates = $4, last_seen = CASE WHEN last_seen < CAST($5 AS BIGINT) "
		         "THEN CAST($5 AS BIGINT) ELSE last_seen END, enroll_key = $6, "
		         "limits = COALESCE($7, limits) WHERE id = $1",
		         w->id, w->url, cp_i64(cap, w->capacity), w->substrates, cp_i64(now, spaced_now()), key_id, lt);
	}
	free(lt);
	cp_rows_free(ex);
	return r;
}

static json_t *worker_answer(const char *id)
{
	char chan[128];
	snprintf(chan, sizeof chan, "/v1/workers/%s/channel", id);
	return json_pack("{s:s,s:s}", "id", id, "channel", chan);
}

/* POST /v1/workers/join with a join token: the token bound to this worker
 * ID is spent, any earlier worker key of the ID stops working, and the
 * answer carries the worker's new key (shown once). */
static void worker_join(struct cp *cp, struct cp_store *st, struct cp_req *rq, const char *bound, const char *token_id)
{
	struct cp_worker_reg w;
	char err[160], now[24];
	char *wkey = NULL;
	long ch = 0;
	int r;
	if (cp_parse_worker((const char *)rq->body.data, rq->body.len, &w, err, sizeof err) < 0) {
		bad_request(rq, err);
		return;
	}
	if (strcmp(w.id, bound) != 0) {
		answer(rq, 403, cp_error("forbidden", "this join token is for another worker ID"));
		return;
	}
	if ((r = cp_store_begin(st)) < 0)
		goto fail;
	/* single use: of two joins with one token, one spends it */
	if ((r = CP_Q(st, NULL, &ch, "UPDATE api_keys SET used = $2 WHERE key_id = $1 AND used = 0", token_id,
	              cp_i64(now, spaced_now()))) < 0)
		goto fail;
	if (ch != 1) {
		cp_store_rollback(st);
		answer(rq, 401, cp_error("unauthorized", "this join token has been used"));
		return;
	}
	if ((r = CP_Q(st, NULL, NULL, "DELETE FROM api_keys WHERE role = 'worker' AND tenant = $1", w.id)) < 0 ||
	    (r = cp_key_create(st, CP_ROLE_WORKER, w.id, 0, &wkey)) < 0)
		goto fail;
	char kid[17];
	memcpy(kid, wkey + 4, 16);
	kid[16] = 0;
	if ((r = worker_upsert(st, &w, kid)) < 0 || (r = cp_store_commit(st)) < 0)
		goto fail;
	cp_wake(cp);
	json_t *a = worker_answer(w.id);
	json_object_set_new(a, "worker_key", json_string(wkey));
	answer(rq, 200, a);
	sodium_memzero(wkey, strlen(wkey));
	free(wkey);
	return;
fail:
	cp_store_rollback(st);
	if (wkey) {
		sodium_memzero(wkey, strlen(wkey));
		free(wkey);
	}
	answer(rq, 503, cp_error("store", spaced_strerror(r)));
}

/* POST /v1/workers with a worker key: that worker (and only it) updates its
 * URL, capacity, substrates and limits. */
static void worker_register(struct cp *cp, struct cp_store *st, struct cp_req *rq, const char *owner,
                            const char *key_id)
{
	struct cp_worker_reg w;
	char err[160];
	int r;
	if (cp_parse_worker((const char *)rq->body.data, rq->body.len, &w, err, sizeof err) < 0) {
		bad_request(rq, err);
		return;
	}
	if (strcmp(w.id, owner) != 0) {
		answer(rq, 403, cp_error("forbidden", "a worker key speaks only for its own worker"));
		return;
	}
	if ((r = cp_store_begin(st)) < 0 || (r = worker_upsert(st, &w, key_id)) < 0 || (r = cp_store_commit(st)) < 0) {
		cp_store_rollback(st);
		answer(rq, 503, cp_error("store", spaced_strerror(r)));
		return;
	}
	cp_wake(cp);
	answer(rq, 200, worker_answer(w.id));
}

static void worker_heartbeat(struct cp_store *st, struct cp_req *rq, const char *id, const char *owner)
{
	char now[24];
	long ch = 0;
	if (strcmp(id, owner) != 0) {
		answer(rq, 403, cp_error("forbidden", "a worker key speaks only for its own worker"));
		return;
	}
	int r = CP_Q(st, NULL, &ch, "UPDATE workers SET last_seen = CASE WHEN last_seen < CAST($2 AS BIGINT) THEN CAST($2 AS BIGINT) "
	                                    "ELSE last_seen END WHERE id = $1", id, cp_i64(now, spaced_now()));
	if (r < 0)
		answer(rq, 503, cp_error("store", spaced_strerror(r)));
	else if (ch == 0)
		answer(rq, 404, cp_error("not-found", "no such worker"));
	else
		answer(rq, 200, json_pack("{s:s}", "id", id));
}

static int hexval(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* GET /v1/sandboxes?meta=K=V&meta=K2=V2: keeps the sandboxes whose metadata
 * holds every pair (values percent-decoded; '+' is a space). */
static int meta_filter(const char *target, json_t *list, char *err, size_t errsz)
{
	const char *q = strchr(target, '?');
	struct {
		char k[64], v[257];
	} want[16];
	int nw = 0;
	for (const char *p = q ? q + 1 : NULL; p && *p;) {
		size_t l = strcspn(p, "&");
		if (l > 5 && strncmp(p, "meta=", 5) == 0) {
			char dec[600];
			size_t dl = 0;
			for (size_t i = 5; i < l && dl + 1 < sizeof dec; i++) {
				if (p[i] == '%' && i + 2 < l && hexval(p[i + 1]) >= 0 && hexval(p[i + 2]) >= 0) {
					dec[dl++] = (char)(hexval(p[i + 1]) * 16 + hexval(p[i + 2]));
					i += 2;
				} else {
					dec[dl++] = p[i] == '+' ? ' ' : p[i];
				}
			}
			if (nw == 16 || cp_parse_meta_pair(dec, dl, want[nw].k, want[nw].v) < 0) {
				snprintf(err, errsz, "meta filters are K=V, at most 16");
				return -1;
			}
			nw++;
		}
		p += l;
		if (*p == '&')
			p++;
	}
	for (size_t i = json_array_size(list); i-- > 0;) {
		json_t *md = json_object_get(json_array_get(list, i), "metadata");
		bool keep = true;
		for (int w = 0; w < nw && keep; w++) {
			const char *v = json_string_value(json_object_get(md, want[w].k));
			keep = v && strcmp(v, want[w].v) == 0;
		}
		if (!keep)
			json_array_remove(list, i);
	}
	return 0;
}

void cp_api_handle(struct cp *cp, struct cp_store *st, struct cp_req *rq)
{
	char path[sizeof rq->path], tenant[SPACED_NAME_MAX], key_id[SPACED_NAME_MAX], owner[SPACED_NAME_MAX], err[160];
	char *seg[6];
	snprintf(path, sizeof path, "%s", rq->path);
	int n = split_path(path, seg, 6);
	int get = strcmp(rq->method, "GET") == 0, post = strcmp(rq->method, "POST") == 0,
	    del = strcmp(rq->method, "DELETE") == 0;
	const char *body = (const char *)rq->body.data;
	size_t blen = rq->body.len;
	json_t *out = NULL;

	if (n < 2 || strcmp(seg[0], "v1") != 0) {
		answer(rq, 404, cp_error("not-found", "no such endpoint"));
		return;
	}
	if (n == 2 && strcmp(seg[1], "keys") == 0 && get) {
		json_t *b = cp_bundle(st);
		answer(rq, b ? 200 : 503, b ? b : cp_error("store", "store unavailable"));
		return;
	}
	if (n == 2 && strcmp(seg[1], "healthz") == 0 && get) {
		answer(rq, 200, json_pack("{s:s,s:s}", "status", "ok", "store", cp_store_kind(st)));
		return;
	}
	if (strcmp(seg[1], "workers") == 0) {
		if (n == 2 && get) {
			if (auth(st, rq, CP_ROLE_TENANT, tenant, NULL) < 0)
				return;
			workers_list(st, rq);
			return;
		}
		/* a worker speaks for itself with its worker key (its join token
		 * to begin with) and, with mTLS, a client certificate naming it */
		if (n == 2 && post) {
			if (cp_worker_cert_check(cp, rq, NULL) < 0 || auth(st, rq, CP_ROLE_WORKER, owner, key_id) < 0 ||
			    cp_worker_cert_check(cp, rq, owner) < 0)
				return;
			worker_register(cp, st, rq, owner, key_id);
			return;
		}
		if (n == 3 && post && strcmp(seg[2], "join") == 0) {
			if (cp_worker_cert_check(cp, rq, NULL) < 0 || auth(st, rq, CP_ROLE_JOIN, owner, key_id) < 0 ||
			    cp_worker_cert_check(cp, rq, owner) < 0)
				return;
			worker_join(cp, st, rq, owner, key_id);
			return;
		}
		if (n == 4 && post && strcmp(seg[3], "heartbeat") == 0) {
			if (cp_worker_cert_check(cp, rq, seg[2]) < 0 || auth(st, rq, CP_ROLE_WORKER, owner, NULL) < 0)
				return;
			worker_heartbeat(st, rq, seg[2], owner);
			return;
		}
		answer(rq, n > 4 || n < 2 ? 404 : 405, cp_error(n > 4 ? "not-found" : "method-not-allowed", "no such endpoint"));
		return;
	}
	if (n == 3 && strcmp(seg[1], "admin") == 0 && strcmp(seg[2], "rotate-keys") == 0 && post) {
		if (auth(st, rq, CP_ROLE_ADMIN, NULL, NULL) < 0)
			return;
		int r = cp_keys_rotate(cp, st, &out);
		if (r == 0)
			answer(rq, 200, out);
		else if (out != NULL)
			answer(rq, 504, out);
		else
			answer(rq, 500, cp_error("rotation", spaced_strerror(r)));
		return;
	}
	if (n == 2 && strcmp(seg[1], "quota") == 0 && get) {
		if (auth(st, rq, CP_ROLE_TENANT, tenant, NULL) < 0)
			return;
		struct cp_quota limit, used;
		int r = cp_quota_usage(cp, st, tenant, 0, &limit, &used);
		if (r < 0) {
			answer(rq, 503, cp_error("store", spaced_strerror(r)));
			return;
		}
		(void)cp_templates_held(st, tenant, &used.templates);
		answer(rq, 200,
		       json_pack("{s:{s:I,s:I,s:I,s:I,s:I},s:{s:I,s:I,s:I,s:I,s:I}}", "quota", "sandboxes",
		                 (json_int_t)limit.sandboxes, "memory_bytes", (json_int_t)limit.memory, "disk_bytes",
		                 (json_int_t)limit.disk, "templates_bytes", (json_int_t)limit.templates, "pids",
		                 (json_int_t)limit.pids, "used", "sandboxes", (json_int_t)used.sandboxes, "memory_bytes",
		                 (json_int_t)used.memory, "disk_bytes", (json_int_t)used.disk, "templates_bytes",
		                 (json_int_t)used.templates, "pids", (json_int_t)used.pids));
		return;
	}
	if (strcmp(seg[1], "templates") == 0 || strcmp(seg[1], "store") == 0 || strcmp(seg[1], "builds") == 0) {
		if (auth(st, rq, CP_ROLE_TENANT, tenant, NULL) < 0)
			return;
		int status;
		if (strcmp(seg[1], "builds") == 0)
			status = cp_builds_api(cp, st, tenant, rq->method, seg, n, body, blen, &out);
		else if (n == 3 && post && cp_template_name_valid(seg[2]))
			status = cp_template_name(cp, st, tenant, seg[2], body, blen, &out);
		else
			status = cp_templates_api(cp, st, tenant, rq->method, seg, n, &out);
		answer(rq, status, out);
		return;
	}
	if (strcmp(seg[1], "sandboxes") != 0 || n > 4) {
		answer(rq, 404, cp_error("not-found", "no such endpoint"));
		return;
	}
	if (auth(st, rq, CP_ROLE_TENANT, tenant, NULL) < 0)
		return;
	if (n == 2 && post) {
		struct cp_create_req c;
		if (rq->idem_bad) {
			bad_request(rq, "Idempotency-Key: 1-64 characters of [A-Za-z0-9._:-]");
			return;
		}
		if (cp_parse_create(body, blen, &c, err, sizeof err) < 0) {
			bad_request(rq, err);
			return;
		}
		/* a replay of a create already made makes nothing: never held by the rate */
		int status = rq->idem_key[0] ? cp_create_replayed(cp, st, tenant, rq->idem_key, &out) : 0;
		if (status != 0) {
			answer(rq, status, out);
			return;
		}
		if (!rate_allows(cp, st, rq, tenant, "create"))
			return;
		memcpy(c.idem_key, rq->idem_key, sizeof c.idem_key);
		status = cp_op_create(cp, st, tenant, &c, &out);
		answer(rq, status, out);
		return;
	}
	if (n == 2 && get) {
		json_t *l = cp_sandbox_list(st, tenant);
		if (l && meta_filter(rq->path, l, err, sizeof err) < 0) {
			json_decref(l);
			bad_request(rq, err);
			return;
		}
		answer(rq, l ? 200 : 503, l ? json_pack("{s:o}", "sandboxes", l) : cp_error("store", "store unavailable"));
		return;
	}
	if (n == 2) {
		answer(rq, 405, cp_error("method-not-allowed", "use GET or POST"));
		return;
	}
	const char *id = seg[2];
	if (!spaced_name_valid(id, strlen(id))) {
		answer(rq, 404, cp_error("not-found", "no such sandbox"));
		return;
	}
	if (n == 3 && get) {
		json_t *s = cp_sandbox_json(st, tenant, id);
		answer(rq, s ? 200 : 404, s ? s : cp_error("not-found", "no such sandbox"));
		return;
	}
	if (n == 3 && del) {
		int status = cp_op_simple(cp, st, tenant, id, "delete", NULL, &out);
		answer(rq, status, out);
		return;
	}
	if (n == 4 && post) {
		const char *op = seg[3];
		char worker[SPACED_NAME_MAX] = "";
		if (strcmp(op, "timeout") == 0) {
			int64_t secs = 0;
			if (cp_parse_timeout(body, blen, &secs, err, sizeof err) < 0) {
				bad_request(rq, err);
				return;
			}
			int status = cp_op_timeout(st, tenant, id, secs, &out);
			answer(rq, status, out);
			return;
		}
		if (strcmp(op, "route") == 0) {
			struct cp_route_req rt;
			if (cp_parse_route(body, blen, &rt, err, sizeof err) < 0) {
				bad_request(rq, err);
				return;
			}
			if (!rate_allows(cp, st, rq, tenant, "route"))
				return;
			int status = cp_op_route(cp, st, tenant, id, &rt, &out);
			answer(rq, status, out);
			return;
		}
		if (strcmp(op, "network") == 0) {
			char *net = malloc(CP_NETWORK_MAX);
			if (net == NULL || cp_parse_network(body, blen, net, err, sizeof err) < 0) {
				free(net);
				bad_request(rq, net ? err : "out of memory");
				return;
			}
			if (!rate_allows(cp, st, rq, tenant, "network")) {
				free(net);
				return;
			}
			int status = cp_op_network(cp, st, tenant, id, net, &out);
			free(net);
			answer(rq, status, out);
			return;
		}
		if (strcmp(op, "pause") == 0 || strcmp(op, "snapshot") == 0) {
			if (cp_parse_target(body, blen, "_", worker, err, sizeof err) < 0) {
				bad_request(rq, err);
				return;
			}
		} else if (strcmp(op, "resume") == 0 || strcmp(op, "move") == 0) {
			if (cp_parse_target(body, blen, strcmp(op, "move") == 0 ? "to" : "worker", worker, err, sizeof err) < 0) {
				bad_request(rq, err);
				return;
			}
		} else {
			answer(rq, 404, cp_error("not-found", "no such endpoint"));
			return;
		}
		if (!rate_allows(cp, st, rq, tenant, "lifecycle"))
			return;
		int status = cp_op_simple(cp, st, tenant, id, op, worker, &out);
		answer(rq, status, out);
		return;
	}
	answer(rq, 405, cp_error("method-not-allowed", "method not allowed here"));
}
