/*
 * server.c — spaced-cp's network side: one libuv loop on the main thread
 * runs libspaced's strict HTTP/1.1 + WebSocket server (httpsrv.h: strict
 * parsing, bodies of either framing decoded, connection budgets in all and
 * per client address, head / body / idle deadlines) and the worker control
 * channels (channel.c). Every API request goes to a request thread, which
 * answers it with its own store handle and posts it back (uv_async); the loop
 * writes the answer. Reads (GET) and channel authorizations have a pool of
 * their own, so they never wait behind lifecycle calls that wait for acks.
 *
 * Each pool serves the API keys in turn (the key ID of the request's
 * Authorization: "spk_<id>_…"; everything else is one more key, ""): the
 * next request taken is the oldest of the key served least recently, and a
 * key never holds more than all but an eighth of the lifecycle threads
 * (at least one is left): a tenant whose creates wait for a worker that does
 * not answer (each holds its thread up to --ack-timeout) leaves the others'
 * lifecycle calls a thread, instead of queueing them behind all of its own.
 */
#include <netdb.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>

#include <sodium.h>
#include <uv.h>

#include "channel.h"
#include "cp.h"
#include "spaced_error.h"
#include "httpsrv.h"
#include "log.h"
#include "observe.h"

#define READ_THREADS 2      /* the pool for reads and channel authorizations */
#define HEAD_MAX 8192       /* request line + header fields (431 past it) */
#define FIELDS_MAX 64       /* header fields (431 past it) */

/* The requests of one API key in a pool, and how many of them its threads hold. */
struct group {
	struct group *next;
	char key[17];
	struct cp_req *head, *tail;
	int running;
	uint64_t turn; /* when it was last served: the least recent goes first */
};

/* A queue of requests (one group per key) and the threads that take from it. */
struct pool {
	struct group *groups;
	uint64_t turns;
	int per_key_max; /* threads one key may hold at once */
	pthread_cond_t cv;
	pthread_t *threads;
	int nthreads, started;
	bool inited;
};

/* What the loop knows of one client connection. */
struct peer {
	struct cp_req *rq;  /* the request being read or answered */
	struct cp_chan *ch; /* the control channel, once upgraded */
};

static struct {
	struct cp *cp;
	uv_loop_t loop;
	uv_async_t wake;        /* answers are back, or the outbox has new rows */
	uv_timer_t tick;        /* channels: pings, liveness, outbox poll */
	uv_signal_t sigterm, sigint;
	struct spaced_httpsrv *srv;
	struct spaced_httpsrv *msrv;   /* the metrics listener, or NULL */
	pthread_mutex_t mu;     /* guards the pools' queues, done and wake_ready */
	struct pool writes;     /* every request but reads */
	struct pool reads;      /* GET and channel authorizations */
	struct cp_req *done_head, *done_tail; /* answered, for the loop */
	bool wake_ready;        /* the async handle may be signalled */
	atomic_int outbox_new;  /* cp_wake was called since the last pump */
	uint64_t warm_told;     /* cp_store_statements_seen when idle threads were last woken */
} S = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Frees a request and what it owns; accepts NULL. */
static void req_free(struct cp_req *rq)
{
	if (rq == NULL)
		return;
	spaced_buf_free(&rq->body);
	free(rq->resp);
	free(rq);
}

void cp_wake(struct cp *cp)
{
	(void)cp;
	atomic_store(&S.outbox_new, 1);
	pthread_mutex_lock(&S.mu);
	if (S.wake_ready)
		uv_async_send(&S.wake);
	pthread_mutex_unlock(&S.mu);
}

/* ---- request threads ---- */

/* key's group in pool, made when it has none; NULL when out of memory. Under S.mu. */
static struct group *group_of(struct pool *pool, const char *key)
{
	for (struct group *g = pool->groups; g; g = g->next)
		if (strcmp(g->key, key) == 0)
			return g;
	struct group *g = calloc(1, sizeof *g);
	if (g) {
		snprintf(g->key, sizeof g->key, "%s", key);
		g->turn = ++pool->turns; /* a new key waits behind those already waiting */
		g->next = pool->groups;
		pool->groups = g;
	}
	return g;
}

/* The next request to serve (taken off its queue, counted as running), or
 * NULL when none may run now. Under S.mu. */
static struct cp_req *take(struct pool *pool)
{
	struct group *best = NULL;
	for (struct group *g = pool->groups; g; g = g->next)
		if (g->head && g->running < pool->per_key_max && (!best || g->turn < best->turn))
			best = g;
	if (!best)
		return NULL;
	struct cp_req *rq = best->head;
	best->head = rq->next_job;
	if (!best->head)
		best->tail = NULL;
	best->running++;
	best->turn = ++pool->turns;
	return rq;
}

/* rq's thread is done with it: its key's count goes down, and a group left
 * with nothing is freed. Under S.mu. */
static void release(struct pool *pool, const struct cp_req *rq)
{
	for (struct group **pp = &pool->groups; *pp; pp = &(*pp)->next) {
		struct group *g = *pp;
		if (strcmp(g->key, rq->fair_key) != 0)
			continue;
		if (g->running > 0)
			g->running--;
		if (!g->head && g->running == 0) {
			*pp = g->next;
			free(g);
		} else if (g->head) {
			pthread_cond_signal(&pool->cv); /* it may run one more now */
		}
		return;
	}
}

/* Hands rq's answer to the loop. Under S.mu. */
static void post_done(struct cp_req *rq)
{
	rq->next_job = NULL;
	if (S.done_tail)
		S.done_tail->next_job = rq;
	else
		S.done_head = rq;
	S.done_tail = rq;
	if (S.wake_ready)
		uv_async_send(&S.wake);
}

/* The key ID of "Bearer spk_<16 hex>_…" into key, else "". */
static void fair_key_of(const char *auth, char key[17])
{
	const char *p = strncasecmp(auth, "Bearer ", 7) == 0 ? auth + 7 : auth;
	key[0] = '\0';
	if (strncmp(p, "spk_", 4) != 0)
		return;
	for (int i = 0; i < 16; i++)
		if (!((p[4 + i] >= '0' && p[4 + i] <= '9') || (p[4 + i] >= 'a' && p[4 + i] <= 'f')))
			return;
	if (p[20] != '_')
		return;
	memcpy(key, p + 4, 16);
	key[16] = '\0';
}

/* A request thread: takes requests from its pool's queue, answers each with
 * its own store handle, posts it to the done list and wakes the loop; ends
 * when cp->stopping is set (what is still queued is freed by pool_stop). */
static void *request_thread(void *arg)
{
	struct pool *pool = arg;
	struct cp *cp = S.cp;
	struct cp_store *st = NULL;
	int r = cp_store_open(cp->db_url, &st);
	if (r < 0)
		spaced_log("spaced-cp", "level=error event=store-unavailable reason=\"%s\"", spaced_strerror(r));
	uint64_t warm_at = 0;
	for (;;) {
		pthread_mutex_lock(&S.mu);
		struct cp_req *rq = NULL;
		bool warm = false;
		while (!cp->stopping && (rq = take(pool)) == NULL &&
		       !(warm = st != NULL && warm_at != cp_store_statements_seen()))
			pthread_cond_wait(&pool->cv, &S.mu);
		if (cp->stopping) {
			if (rq)
				release(pool, rq);
			pthread_mutex_unlock(&S.mu);
			break;
		}
		pthread_mutex_unlock(&S.mu);
		if (rq == NULL && warm) {
			/* idle: what other threads prepared, before a burst needs it */
			warm_at = cp_store_statements_seen();
			cp_store_warm(st);
			continue;
		}
		if (st == NULL) {
			rq->status = 503;
			rq->resp = strdup("{\"error\":\"store\",\"message\":\"store unavailable\"}");
		} else if (rq->kind == CP_JOB_CHANNEL) {
			/* with mTLS, the client certificate naming this worker first */
			if (cp_worker_cert_check(cp, rq, rq->worker) == 0) {
				int ok = cp_chan_authorized(st, rq->auth, rq->worker);
				rq->status = ok ? 101 : 401;
				if (!ok)
					rq->resp = strdup("{\"error\":\"unauthorized\",\"message\":\"the channel needs the "
					                  "worker's own worker key\"}");
			}
		} else if (rq->kind == CP_JOB_METRICS) {
			rq->status = 200;
			rq->resp = cp_metrics_text(cp, st);
		} else {
			uint64_t t0 = spaced_mono_ns();
			cp_api_handle(cp, st, rq);
			cp_observe_request(rq, rq->tenant, spaced_mono_ns() - t0);
		}
		pthread_mutex_lock(&S.mu);
		release(pool, rq);
		post_done(rq);
		uint64_t seen = cp_store_statements_seen();
		if (seen != S.warm_told) {
			/* new statements: the idle threads prepare them now */
			S.warm_told = seen;
			pthread_cond_broadcast(&S.writes.cv);
			pthread_cond_broadcast(&S.reads.cv);
		}
		pthread_mutex_unlock(&S.mu);
	}
	cp_store_close(st);
	return NULL;
}

/* Hands rq to the request threads (loop thread). */
static void dispatch(struct cp_req *rq)
{
	struct pool *pool = rq->kind == CP_JOB_CHANNEL || strcmp(rq->method, "GET") == 0 ? &S.reads : &S.writes;
	rq->queued = 1;
	rq->next_job = NULL;
	fair_key_of(rq->auth, rq->fair_key);
	pthread_mutex_lock(&S.mu);
	struct group *g = group_of(pool, rq->fair_key);
	if (!g) {
		rq->status = 503;
		rq->resp = strdup("{\"error\":\"busy\",\"message\":\"out of memory\"}");
		post_done(rq);
		pthread_mutex_unlock(&S.mu);
		return;
	}
	if (g->tail)
		g->tail->next_job = rq;
	else
		g->head = rq;
	g->tail = rq;
	pthread_cond_signal(&pool->cv);
	pthread_mutex_unlock(&S.mu);
}

/* Starts n threads on pool. Returns 0 (at least one started), SPACED_ENOMEM
 * or SPACED_ESYS. */
static int pool_start(struct pool *pool, int n, int per_key_max)
{
	pthread_cond_init(&pool->cv, NULL);
	pool->inited = true;
	pool->threads = calloc((size_t)n, sizeof *pool->threads);
	if (pool->threads == NULL)
		return SPACED_ENOMEM;
	pool->nthreads = n;
	pool->per_key_max = per_key_max;
	for (; pool->started < n; pool->started++)
		if (pthread_create(&pool->threads[pool->started], NULL, request_thread, pool) != 0)
			return pool->started > 0 ? 0 : SPACED_ESYS;
	return 0;
}

/* Joins the threads (cp->stopping is set) and frees what was never taken. */
static void pool_stop(struct pool *pool)
{
	if (!pool->inited)
		return;
	pthread_mutex_lock(&S.mu);
	pthread_cond_broadcast(&pool->cv);
	pthread_mutex_unlock(&S.mu);
	for (int i = 0; i < pool->started; i++)
		pthread_join(pool->threads[i], NULL);
	free(pool->threads);
	pool->threads = NULL;
	for (struct group *g = pool->groups, *gn; g; g = gn) {
		gn = g->next;
		for (struct cp_req *rq = g->head, *next; rq; rq = next) {
			next = rq->next_job;
			req_free(rq);
		}
		free(g);
	}
	pool->groups = NULL;
	pthread_cond_destroy(&pool->cv);
}

/* ---- answers (loop thread) ---- */

/* The body of an answer the HTTP layer gives by itself, in the API's error
 * form (docs/cp-api.yaml): {"error": code, "message": text}. */
static size_t refusal_body(int status, const char *code, char *buf, size_t cap)
{
	static const struct {
		int status;
		const char *error, *message;
	} tab[] = {
		{400, "bad-request", "malformed HTTP request"},
		{408, "request-timeout", "the request did not arrive in time"},
		{413, "too-large", "request body too large"},
		{414, "uri-too-long", "the request URI is too long"},
		{417, "expectation-failed", "only Expect: 100-continue is understood"},
		{431, "headers-too-large", "request header fields too large"},
		{501, "not-implemented", "only the chunked transfer coding is understood"},
		{505, "http-version", "only HTTP/1.0 and HTTP/1.1 are served"},
	};
	const char *error = "http-error", *message = "request refused";
	(void)code;
	for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
		if (tab[i].status == status) {
			error = tab[i].error;
			message = tab[i].message;
		}
	int n = snprintf(buf, cap, "{\"error\":\"%s\",\"message\":\"%s\"}", error, message);
	return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap;
}

/* Writes a JSON answer on c (which may be gone afterwards). */
static void reply(struct spaced_httpconn *c, int status, const char *json)
{
	size_t len = json ? strlen(json) : 0;
	spaced_httpconn_reply(c, status, "application/json", json ? json : "", len, "cache-control: no-store\r\n");
}

/* An answer that came back from a request thread, with its request id. */
static void reply_rq(struct spaced_httpconn *c, const struct cp_req *rq)
{
	char hdr[200], ra[40] = "";
	if (rq->retry_after > 0)
		snprintf(ra, sizeof ra, "retry-after: %d\r\n", rq->retry_after);
	snprintf(hdr, sizeof hdr, "cache-control: no-store\r\nx-request-id: %s\r\n%s", rq->request_id, ra);
	const char *body = rq->resp ? rq->resp : "";
	spaced_httpconn_reply(c, rq->status,
	                      rq->kind == CP_JOB_METRICS ? "text/plain; version=0.0.4; charset=utf-8" : "application/json",
	                      body, strlen(body), hdr);
}

/* The request's id and its client's address. */
static void request_identity(struct spaced_httpconn *c, const struct spaced_http_req *req, struct cp_req *rq)
{
	snprintf(rq->peer, sizeof rq->peer, "%s", spaced_httpconn_peer(c));
	const char *id = spaced_http_field(req, "x-request-id");
	if (id && strlen(id) < sizeof rq->request_id && spaced_name_valid(id, strlen(id))) {
		snprintf(rq->request_id, sizeof rq->request_id, "%s", id);
	} else {
		uint8_t rnd[8];
		randombytes_buf(rnd, sizeof rnd);
		sodium_bin2hex(rq->request_id, sizeof rq->request_id, rnd, sizeof rnd);
	}
}

/* Answers the connection's current request at once (405, 414 …); the
 * request, not yet queued, is forgotten. */
static void answer_now(struct spaced_httpconn *c, struct peer *pe, int status, const char *code, const char *msg)
{
	char buf[256];
	if (pe != NULL && pe->rq != NULL && !pe->rq->queued) {
		req_free(pe->rq);
		pe->rq = NULL;
	}
	snprintf(buf, sizeof buf, "{\"error\":\"%s\",\"message\":\"%s\"}", code, msg);
	reply(c, status, buf);
}

/* A request thread's answer is back: write it, or open the channel. */
static void deliver(struct cp_req *rq)
{
	struct spaced_httpconn *c = rq->conn;
	rq->queued = 0;
	if (c == NULL) {
		req_free(rq); /* the client went away meanwhile */
		return;
	}
	struct peer *pe = spaced_httpconn_user(c);
	if (pe->rq == rq)
		pe->rq = NULL; /* before the answer: it may start the next request */
	if (rq->kind == CP_JOB_CHANNEL && rq->status == 101) {
		pe->ch = cp_chan_open(c, rq->worker);
		if (pe->ch == NULL || spaced_httpconn_ws_accept(c, NULL) < 0)
			spaced_httpconn_abort(c);
	} else {
		reply_rq(c, rq);
	}
	req_free(rq);
}

/* The loop's wake-up: writes every answer that came back, then, when
 * cp_wake was called, sends the channels what the outbox holds. */
static void on_wake(uv_async_t *h)
{
	(void)h;
	pthread_mutex_lock(&S.mu);
	struct cp_req *rq = S.done_head;
	S.done_head = S.done_tail = NULL;
	pthread_mutex_unlock(&S.mu);
	while (rq != NULL) {
		struct cp_req *next = rq->next_job;
		deliver(rq);
		rq = next;
	}
	if (atomic_exchange(&S.outbox_new, 0))
		cp_chan_pump_all();
}

/* ---- httpsrv callbacks (loop thread) ---- */

/* A valid request head: a method we serve becomes a cp_req, queued at once
 * or once its body is read; a WebSocket upgrade of the channel path is
 * queued for authorization. */
static void on_request(struct spaced_httpconn *c, const struct spaced_http_req *req)
{
	struct peer *pe = spaced_httpconn_user(c);
	if (pe == NULL) {
		if ((pe = calloc(1, sizeof *pe)) == NULL) {
			answer_now(c, NULL, 503, "busy", "out of memory");
			return;
		}
		spaced_httpconn_set_user(c, pe);
	}
	if (S.cp->stopping) {
		answer_now(c, pe, 503, "stopping", "the control plane is stopping");
		return;
	}
	if (strcmp(req->method, "GET") != 0 && strcmp(req->method, "POST") != 0 && strcmp(req->method, "DELETE") != 0) {
		answer_now(c, pe, 405, "method-not-allowed", "GET, POST or DELETE");
		return;
	}
	struct cp_req *rq = calloc(1, sizeof *rq);
	if (rq == NULL) {
		answer_now(c, pe, 503, "busy", "out of memory");
		return;
	}
	rq->conn = c;
	rq->kind = CP_JOB_API;
	request_identity(c, req, rq);
	snprintf(rq->method, sizeof rq->method, "%s", req->method);
	spaced_buf_init(&rq->body, CP_BODY_MAX);
	pe->rq = rq;
	if (strlen(req->target) >= sizeof rq->path) {
		answer_now(c, pe, 414, "uri-too-long", "the request URI is too long");
		return;
	}
	memcpy(rq->path, req->target, strlen(req->target) + 1);
	const char *cn = spaced_httpconn_peer_cert(c);
	if (cn != NULL && strlen(cn) < sizeof rq->peer_cert)
		memcpy(rq->peer_cert, cn, strlen(cn) + 1);
	const char *ik = spaced_http_field(req, "idempotency-key");
	if (ik != NULL) {
		size_t kl = strlen(ik);
		rq->idem_bad = kl == 0 || kl >= sizeof rq->idem_key ||
		               strspn(ik, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-") != kl;
		if (!rq->idem_bad)
			memcpy(rq->idem_key, ik, kl + 1);
	}
	const char *auth = spaced_http_field(req, "authorization");
	if (auth != NULL && strlen(auth) < sizeof rq->auth)
		memcpy(rq->auth, auth, strlen(auth) + 1); /* longer: no key of ours, so 401 */
	if (req->websocket) {
		/* the only WebSocket here is a worker's control channel; the
		 * upgrade is answered once a request thread checked the key */
		if (cp_chan_path(rq->path, rq->worker) < 0) {
			answer_now(c, pe, 404, "not-found", "no WebSocket endpoint here");
			return;
		}
		rq->kind = CP_JOB_CHANNEL;
		dispatch(rq);
		return;
	}
	/* Any other Upgrade (h2c included) is not taken: the answer is HTTP/1.1. */
	if (req->body == SPACED_HTTP_BODY_NONE)
		dispatch(rq);
	/* else the body (Content-Length or chunked, decoded by httpsrv, at most
	 * CP_BODY_MAX: 413 past it) comes first */
}

/* Decoded body bytes (either framing) of the current request. */
static void on_body(struct spaced_httpconn *c, const uint8_t *p, size_t n)
{
	struct peer *pe = spaced_httpconn_user(c);
	if (pe == NULL || pe->rq == NULL || pe->rq->queued)
		return;
	if (spaced_buf_append(&pe->rq->body, p, n) < 0)
		answer_now(c, pe, 413, "too-large", "request body too large");
}

/* The whole body is read: the request goes to a request thread. */
static void on_body_end(struct spaced_httpconn *c)
{
	struct peer *pe = spaced_httpconn_user(c);
	if (pe != NULL && pe->rq != NULL && !pe->rq->queued)
		dispatch(pe->rq);
}

/* A whole message on a channel. */
static void on_ws_message(struct spaced_httpconn *c, bool text, const uint8_t *p, size_t n)
{
	struct peer *pe = spaced_httpconn_user(c);
	if (pe != NULL && pe->ch != NULL)
		cp_chan_message(pe->ch, text, p, n);
}

/* A ping or pong on a channel: the worker is there. */
static void on_ws_control(struct spaced_httpconn *c, uint8_t opcode, const uint8_t *p, size_t n)
{
	struct peer *pe = spaced_httpconn_user(c);
	(void)opcode;
	(void)p;
	(void)n;
	if (pe != NULL && pe->ch != NULL)
		cp_chan_heard(pe->ch);
}

/* A channel's output ran low: more of the outbox. */
static void on_drain(struct spaced_httpconn *c)
{
	struct peer *pe = spaced_httpconn_user(c);
	if (pe != NULL && pe->ch != NULL)
		cp_chan_drain(pe->ch);
}

/* The connection is gone: its request is dropped (or left to its request
 * thread, then dropped), its channel closed. */
static void on_close(struct spaced_httpconn *c)
{
	struct peer *pe = spaced_httpconn_user(c);
	if (pe == NULL)
		return;
	spaced_httpconn_set_user(c, NULL);
	if (pe->rq != NULL) {
		if (pe->rq->queued)
			pe->rq->conn = NULL; /* a request thread has it: freed when it comes back */
		else
			req_free(pe->rq);
	}
	if (pe->ch != NULL)
		cp_chan_closed(pe->ch);
	free(pe);
}

/* The metrics listener: GET /metrics only, answered by a read thread. */
static void on_metrics_request(struct spaced_httpconn *c, const struct spaced_http_req *req)
{
	struct peer *pe = spaced_httpconn_user(c);
	if (pe == NULL) {
		if ((pe = calloc(1, sizeof *pe)) == NULL) {
			answer_now(c, NULL, 503, "busy", "out of memory");
			return;
		}
		spaced_httpconn_set_user(c, pe);
	}
	if (strcmp(req->method, "GET") != 0 || strcmp(req->target, "/metrics") != 0 || req->websocket) {
		answer_now(c, pe, 404, "not-found", "only GET /metrics here");
		return;
	}
	struct cp_req *rq = calloc(1, sizeof *rq);
	if (rq == NULL) {
		answer_now(c, pe, 503, "busy", "out of memory");
		return;
	}
	rq->conn = c;
	rq->kind = CP_JOB_METRICS;
	request_identity(c, req, rq);
	snprintf(rq->method, sizeof rq->method, "GET");
	snprintf(rq->path, sizeof rq->path, "/metrics");
	spaced_buf_init(&rq->body, 0);
	pe->rq = rq;
	dispatch(rq);
}

static const struct spaced_httpsrv_ops metrics_ops = {
	.on_request = on_metrics_request,
	.on_close = on_close,
};

static const struct spaced_httpsrv_ops ops = {
	.on_request = on_request,
	.on_body = on_body,
	.on_body_end = on_body_end,
	.on_ws_message = on_ws_message,
	.on_drain = on_drain,
	.on_close = on_close,
	.on_ws_control = on_ws_control,
};

/* Every 100 ms: the channels' pings, silence, outbox poll and liveness. */
static void on_tick(uv_timer_t *t)
{
	(void)t;
	cp_chan_tick();
}

/* SIGTERM / SIGINT: leave the loop; cp_server_run then closes everything. */
static void on_signal(uv_signal_t *h, int sig)
{
	(void)sig;
	S.cp->stopping = 1;
	uv_stop(h->loop);
}

/* ---- start and stop ---- */

/* The numeric address of host ("127.0.0.1", "::1", "[::1]", a name) into
 * out; 0 or SPACED_EINVAL. */
static int listen_address(const char *host, char out[INET6_ADDRSTRLEN + 1])
{
	char h[256];
	size_t n = strlen(host);
	if (n >= 2 && host[0] == '[' && host[n - 1] == ']') {
		host++;
		n -= 2;
	}
	if (n == 0 || n >= sizeof h)
		return SPACED_EINVAL;
	memcpy(h, host, n);
	h[n] = 0;
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
	if (getaddrinfo(h, NULL, &hints, &ai) != 0 || ai == NULL)
		return SPACED_EINVAL;
	int r = getnameinfo(ai->ai_addr, ai->ai_addrlen, out, INET6_ADDRSTRLEN + 1, NULL, 0, NI_NUMERICHOST);
	freeaddrinfo(ai);
	return r == 0 ? 0 : SPACED_EINVAL;
}

/* Raises the open-file limit to its hard limit and returns how many client
 * connections fit in it next to the store handles, the signer and the loop. */
static unsigned conns_that_fit(const struct cp *cp)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 1000;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
		getrlimit(RLIMIT_NOFILE, &rl);
	}
	rlim_t reserve = 64 + 8 * (rlim_t)(cp->nthreads + READ_THREADS + 2);
	if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > reserve + 1000000)
		return 1000000;
	return rl.rlim_cur > reserve + 16 ? (unsigned)(rl.rlim_cur - reserve) : 16;
}

/* Writes the port to STATE/cp.port (through a rename: never seen half written). */
static void write_port_file(const struct cp *cp, int port)
{
	char path[1100], tmp[1110];
	snprintf(path, sizeof path, "%s/cp.port", cp->state_dir);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (f == NULL)
		return;
	int ok = fprintf(f, "%d\n", port) > 0;
	if (fclose(f) != 0 || !ok || rename(tmp, path) < 0)
		fprintf(stderr, "spaced-cp: cannot write %s\n", path);
}

int cp_server_run(struct cp *cp)
{
	char host[INET6_ADDRSTRLEN + 1];
	struct spaced_httpsrv_config hc;
	int r;
	S.cp = cp;
	signal(SIGPIPE, SIG_IGN);
	if ((r = listen_address(cp->listen_host, host)) < 0) {
		fprintf(stderr, "spaced-cp: cannot listen on %s: not an address\n", cp->listen_host);
		return r;
	}
	if (uv_loop_init(&S.loop) < 0)
		return SPACED_ESYS;
	cp_chan_init(cp);
	spaced_httpsrv_defaults(&hc);
	hc.host = host;
	hc.port = cp->port;
	hc.limits.head_max = HEAD_MAX;
	hc.limits.target_max = sizeof ((struct cp_req *)0)->path - 1;
	hc.limits.fields_max = FIELDS_MAX;
	hc.body_max = CP_BODY_MAX;
	unsigned fit = conns_that_fit(cp);
	hc.max_conns = (unsigned)cp->max_conns < fit ? (unsigned)cp->max_conns : fit;
	if (hc.max_conns < (unsigned)cp->max_conns)
		spaced_log("spaced-cp", "level=warn event=connections-capped max_conns=%u reason=\"the open-file limit\"",
		           hc.max_conns);
	hc.max_conns_per_ip = (unsigned)cp->max_conns_per_ip;
	hc.head_timeout_ms = (unsigned)cp->head_timeout_ms;
	hc.body_timeout_ms = (unsigned)cp->head_timeout_ms;
	hc.ws_message_max = CP_BODY_MAX;
	hc.low_water = CP_CHAN_LOW_WATER;
	hc.refusal_body = refusal_body;
	hc.tls = cp->tls;
	hc.ops = &ops;
	if ((r = spaced_httpsrv_start(&S.loop, &hc, &S.srv)) < 0) {
		fprintf(stderr, "spaced-cp: cannot listen on %s:%d: %s\n", cp->listen_host, cp->port, spaced_strerror(r));
		uv_loop_close(&S.loop);
		return r;
	}
	uv_async_init(&S.loop, &S.wake, on_wake);
	uv_timer_init(&S.loop, &S.tick);
	uv_timer_start(&S.tick, on_tick, 100, 100);
	uv_signal_init(&S.loop, &S.sigterm);
	uv_signal_init(&S.loop, &S.sigint);
	uv_signal_start(&S.sigterm, on_signal, SIGTERM);
	uv_signal_start(&S.sigint, on_signal, SIGINT);
	pthread_mutex_lock(&S.mu);
	S.wake_ready = true;
	pthread_mutex_unlock(&S.mu);
	if (cp->metrics_host[0]) {
		char mhost[INET6_ADDRSTRLEN + 1];
		struct spaced_httpsrv_config mc;
		spaced_httpsrv_defaults(&mc);
		mc.max_conns = 64;
		mc.max_conns_per_ip = 16;
		mc.body_max = 0;
		mc.tls = cp->tls; /* the listener's TLS, its certificate */
		mc.ops = &metrics_ops;
		mc.port = cp->metrics_port;
		if ((r = listen_address(cp->metrics_host, mhost)) < 0 ||
		    (mc.host = mhost, r = spaced_httpsrv_start(&S.loop, &mc, &S.msrv)) < 0) {
			fprintf(stderr, "spaced-cp: cannot listen on %s:%d for metrics\n", cp->metrics_host, cp->metrics_port);
			spaced_httpsrv_stop(S.srv);
			uv_run(&S.loop, UV_RUN_NOWAIT);
			return r;
		}
		char path[4200];
		snprintf(path, sizeof path, "%s/metrics.port", cp->state_dir);
		FILE *f = fopen(path, "w");
		if (f) {
			fprintf(f, "%d\n", spaced_httpsrv_port(S.msrv));
			fclose(f);
		}
	}
	int port = spaced_httpsrv_port(S.srv);
	write_port_file(cp, port);
	spaced_log("spaced-cp", "level=info event=listening url=%s://%s:%d store=%s%s", cp->tls ? "https" : "http",
	           cp->listen_host, port, cp_store_kind(cp->loop_st),
	           cp->mtls ? " worker_endpoints=client-certificate" : "");
	/* lifecycle calls: one key leaves others an eighth of the threads (at least one) */
	int keep = cp->nthreads / 8 > 1 ? cp->nthreads / 8 : 1;
	if ((r = pool_start(&S.writes, cp->nthreads, cp->nthreads > keep ? cp->nthreads - keep : 1)) == 0 &&
	    (r = pool_start(&S.reads, READ_THREADS, READ_THREADS)) == 0)
		uv_run(&S.loop, UV_RUN_DEFAULT);

	/* stopping: no new connections or requests, every connection closed
	 * (channels mark their workers not connected), the threads finish what
	 * they hold, then the handles close */
	cp->stopping = 1;
	spaced_httpsrv_stop(S.srv);
	if (S.msrv)
		spaced_httpsrv_stop(S.msrv);
	uv_timer_stop(&S.tick);
	cp_acks_wake_all(cp);
	pool_stop(&S.writes);
	pool_stop(&S.reads);
	pthread_mutex_lock(&S.mu);
	S.wake_ready = false;
	struct cp_req *rq = S.done_head;
	S.done_head = S.done_tail = NULL;
	pthread_mutex_unlock(&S.mu);
	while (rq != NULL) {
		struct cp_req *next = rq->next_job;
		req_free(rq);
		rq = next;
	}
	uv_close((uv_handle_t *)&S.wake, NULL);
	uv_close((uv_handle_t *)&S.tick, NULL);
	uv_close((uv_handle_t *)&S.sigterm, NULL);
	uv_close((uv_handle_t *)&S.sigint, NULL);
	uv_run(&S.loop, UV_RUN_DEFAULT);
	uv_loop_close(&S.loop);
	cp_chan_stop();
	return r;
}
