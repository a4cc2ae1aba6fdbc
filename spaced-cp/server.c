/*
 * server.c — the libwebsockets side of spaced-cp: the HTTP server that hands
 * each request to the request-thread pool and writes the answer, and the
 * worker control channels (docs/control-messages.md): hello, replay of what a
 * worker missed, one message per text frame in seq order, acks recorded in the
 * outbox. Everything here runs on the service thread; other threads only
 * queue work and call cp_wake().
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libwebsockets.h>

#include "cp.h"
#include "error.h"
#include "identity.h"

struct chan {
	struct chan *next;
	struct lws *wsi;
	char worker[SPACED_NAME_MAX];
	int hello, closing, ping_due;
	int64_t sent_seq;
	uint64_t last_rx, last_ping; /* monotonic ns */
	struct spaced_buf rx;
};

#define CHAN_PING_NS (20ull * 1000000000ull) /* ping a channel quiet for 20 s */
#define CHAN_DEAD_NS (60ull * 1000000000ull) /* drop it after a minute without a word or pong */

struct pss {
	struct cp_req *req; /* HTTP: the request being answered */
	struct chan *ch;    /* WebSocket: the channel */
};

static struct chan *chans;
static struct cp *the_cp;
static lws_sorted_usec_list_t tick_sul;
static uint64_t ticks;

void cp_wake(struct cp *cp)
{
	if (cp->ctx != NULL)
		lws_cancel_service(cp->ctx);
}

void cp_req_release(struct cp *cp, struct cp_req *rq)
{
	pthread_mutex_lock(&cp->mu);
	int last = --rq->refs == 0;
	pthread_mutex_unlock(&cp->mu);
	if (!last)
		return;
	spaced_buf_free(&rq->body);
	free(rq->resp);
	free(rq);
}

static void inflight_remove(struct cp *cp, struct cp_req *rq)
{
	for (struct cp_req **p = &cp->inflight; *p; p = &(*p)->next_inflight)
		if (*p == rq) {
			*p = rq->next_inflight;
			break;
		}
}

/* Queues rq for a request thread. */
static void dispatch(struct cp *cp, struct cp_req *rq)
{
	if (rq->dispatched)
		return; /* once: a body after a GET/DELETE is ignored */
	rq->dispatched = 1;
	if (strcmp(rq->method, "GET") == 0) {
		/* reads never wait for a worker: answered here at once, never queued
		 * behind lifecycle calls that wait for acks */
		cp_api_handle(cp, cp->lws_st, rq);
		pthread_mutex_lock(&cp->mu);
		rq->done = 1;
		rq->notified = 1;
		pthread_mutex_unlock(&cp->mu);
		lws_callback_on_writable(rq->wsi);
		return;
	}
	/* a lifecycle call may wait for several worker acks: no libwebsockets
	 * pending timeout on this connection until the answer is written */
	lws_set_timeout(rq->wsi, NO_PENDING_TIMEOUT, 0);
	pthread_mutex_lock(&cp->mu);
	rq->refs++;
	rq->next_job = NULL;
	if (cp->jobs_tail)
		cp->jobs_tail->next_job = rq;
	else
		cp->jobs_head = rq;
	cp->jobs_tail = rq;
	pthread_cond_signal(&cp->jobs_cv);
	pthread_mutex_unlock(&cp->mu);
}

/* Answers at once from the service thread (405, 413, 414 …). */
static void answer_now(struct cp *cp, struct cp_req *rq, int status, const char *code, const char *msg)
{
	char buf[256];
	snprintf(buf, sizeof buf, "{\"error\":\"%s\",\"message\":\"%s\"}", code, msg);
	pthread_mutex_lock(&cp->mu);
	rq->status = status;
	rq->resp = strdup(buf);
	rq->done = 1;
	rq->notified = 1;
	pthread_mutex_unlock(&cp->mu);
	lws_callback_on_writable(rq->wsi);
}

static void *request_thread(void *arg)
{
	struct cp *cp = arg;
	struct cp_store *st = NULL;
	int r = cp_store_open(cp->db_url, &st);
	if (r < 0)
		fprintf(stderr, "spaced-cp: request thread cannot open the store: %s\n", spaced_strerror(r));
	for (;;) {
		pthread_mutex_lock(&cp->mu);
		while (cp->jobs_head == NULL && !cp->stopping)
			pthread_cond_wait(&cp->jobs_cv, &cp->mu);
		if (cp->stopping) {
			pthread_mutex_unlock(&cp->mu);
			break;
		}
		struct cp_req *rq = cp->jobs_head;
		cp->jobs_head = rq->next_job;
		if (cp->jobs_head == NULL)
			cp->jobs_tail = NULL;
		pthread_mutex_unlock(&cp->mu);
		if (st == NULL) {
			rq->status = 503;
			rq->resp = strdup("{\"error\":\"store\",\"message\":\"store unavailable\"}");
		} else {
			cp_api_handle(cp, st, rq);
		}
		pthread_mutex_lock(&cp->mu);
		rq->done = 1;
		pthread_mutex_unlock(&cp->mu);
		cp_wake(cp);
		cp_req_release(cp, rq);
	}
	cp_store_close(st);
	return NULL;
}

static int write_answer(struct lws *wsi, struct cp_req *rq)
{
	uint8_t hdr[LWS_PRE + 1024], *start = &hdr[LWS_PRE], *p = start, *end = &hdr[sizeof hdr - 1];
	size_t len = rq->resp ? strlen(rq->resp) : 0;
	if (lws_add_http_common_headers(wsi, (unsigned int)rq->status, "application/json", len, &p, end) ||
	    lws_add_http_header_by_name(wsi, (const unsigned char *)"cache-control:",
	                                (const unsigned char *)"no-store", 8, &p, end) ||
	    lws_finalize_write_http_header(wsi, start, &p, end))
		return -1;
	if (len == 0)
		return 0;
	uint8_t *body = malloc(LWS_PRE + len);
	if (body == NULL)
		return -1;
	memcpy(body + LWS_PRE, rq->resp, len);
	int n = lws_write(wsi, body + LWS_PRE, len, LWS_WRITE_HTTP_FINAL);
	free(body);
	return n < (int)len ? -1 : 0;
}

/* ---- control channel ---- */

static int chan_worker_from_uri(struct lws *wsi, char worker[SPACED_NAME_MAX])
{
	char uri[256];
	static const char pre[] = "/v1/workers/", suf[] = "/channel";
	int n = lws_hdr_copy(wsi, uri, sizeof uri, WSI_TOKEN_GET_URI);
	if (n <= 0 || (size_t)n <= sizeof pre + sizeof suf - 2 || strncmp(uri, pre, sizeof pre - 1) != 0 ||
	    strcmp(uri + n - (sizeof suf - 1), suf) != 0)
		return -1;
	size_t l = (size_t)n - (sizeof pre - 1) - (sizeof suf - 1);
	if (!spaced_name_valid(uri + sizeof pre - 1, l))
		return -1;
	memcpy(worker, uri + sizeof pre - 1, l);
	worker[l] = 0;
	return 0;
}

static int chan_authorized(struct cp *cp, struct lws *wsi, const char *worker)
{
	char auth[512];
	int n = lws_hdr_copy(wsi, auth, sizeof auth, WSI_TOKEN_HTTP_AUTHORIZATION);
	return n > 7 && strncmp(auth, "Bearer ", 7) == 0 && cp_worker_auth(cp->lws_st, auth + 7, worker) == 0;
}

/* An open channel is a heartbeat; channel_until tells every replica which
 * workers are connected right now (key rotation waits for those). */
static void chan_seen(struct cp *cp, const struct chan *ch)
{
	char now[24], until[24];
	int64_t t = spaced_now();
	CP_Q(cp->lws_st, NULL, NULL,
	     "UPDATE workers SET last_seen = $2, channel_until = $3, channel_replica = $4 WHERE id = $1", ch->worker,
	     cp_i64(now, t), cp_i64(until, t + 10), cp->replica_id);
}

static int chan_hello(struct cp *cp, struct chan *ch, const struct cp_chan_msg *m)
{
	struct cp_rows *rows = NULL;
	char cap[24];
	if (strcmp(m->worker, ch->worker) != 0)
		return -1;
	/* Replay from the first message after last_seq, and re-send anything not yet
	 * acknowledged at or below it: the worker acks those again without effect. */
	int64_t from = m->last_seq;
	/* A worker that has applied more than this store ever sent knows a history
	 * the store lost: it would take new messages for old ones. Fail closed. */
	if (CP_Q(cp->lws_st, &rows, NULL, "SELECT next_seq FROM workers WHERE id = $1", ch->worker) < 0 ||
	    m->last_seq > cp_rows_i64(rows, 0, 0, 0)) {
		lwsl_user("channel %s: hello last_seq=%lld is ahead of the control plane (%lld): refused\n", ch->worker,
		          (long long)m->last_seq, (long long)cp_rows_i64(rows, 0, 0, 0));
		cp_rows_free(rows);
		return -1;
	}
	cp_rows_free(rows);
	rows = NULL;
	if (CP_Q(cp->lws_st, &rows, NULL, "SELECT MIN(seq) FROM outbox WHERE worker = $1 AND acked = 0", ch->worker) == 0) {
		int64_t unacked = cp_rows_i64(rows, 0, 0, -1);
		if (unacked > 0 && unacked - 1 < from)
			from = unacked - 1;
	}
	cp_rows_free(rows);
	ch->sent_seq = from;
	ch->hello = 1;
	chan_seen(cp, ch);
	if (m->has_capacity)
		CP_Q(cp->lws_st, NULL, NULL, "UPDATE workers SET capacity = $2 WHERE id = $1", ch->worker,
		     cp_i64(cap, m->capacity));
	if (m->has_substrates)
		CP_Q(cp->lws_st, NULL, NULL, "UPDATE workers SET substrates = $2 WHERE id = $1", ch->worker, m->substrates);
	if (m->limits.has) {
		char *lt = cp_limits_text(&m->limits);
		if (lt != NULL)
			CP_Q(cp->lws_st, NULL, NULL, "UPDATE workers SET limits = $2 WHERE id = $1", ch->worker, lt);
		free(lt);
	}
	lwsl_user("channel %s: hello last_seq=%lld, replay from %lld\n", ch->worker, (long long)m->last_seq,
	          (long long)from);
	lws_callback_on_writable(ch->wsi);
	return 0;
}

static int chan_send_next(struct cp *cp, struct chan *ch)
{
	struct cp_rows *rows = NULL;
	char sb[24];
	int r = CP_Q(cp->lws_st, &rows, NULL,
	             "SELECT seq, body FROM outbox WHERE worker = $1 AND seq > $2 ORDER BY seq LIMIT 1", ch->worker,
	             cp_i64(sb, ch->sent_seq));
	if (r < 0 || rows->nrows == 0) {
		cp_rows_free(rows);
		return 0;
	}
	const char *body = cp_rows_get(rows, 0, 1);
	size_t len = strlen(body);
	uint8_t *buf = malloc(LWS_PRE + len);
	if (buf == NULL) {
		cp_rows_free(rows);
		return 0;
	}
	memcpy(buf + LWS_PRE, body, len);
	int n = lws_write(ch->wsi, buf + LWS_PRE, len, LWS_WRITE_TEXT);
	free(buf);
	if (n < (int)len) {
		cp_rows_free(rows);
		return -1;
	}
	ch->sent_seq = cp_rows_i64(rows, 0, 0, ch->sent_seq);
	cp_rows_free(rows);
	lws_callback_on_writable(ch->wsi); /* maybe more */
	return 0;
}

static void tick(lws_sorted_usec_list_t *sul)
{
	struct cp *cp = the_cp;
	ticks++;
	uint64_t mono = spaced_mono_ns();
	for (struct chan *ch = chans; ch; ch = ch->next) {
		if (mono - ch->last_rx > CHAN_DEAD_NS) {
			lwsl_user("channel %s: silent for a minute, closing\n", ch->worker);
			ch->closing = 1;
			ch->hello = 0;
			lws_callback_on_writable(ch->wsi);
			continue;
		}
		if (mono - ch->last_rx > CHAN_PING_NS && mono - ch->last_ping > CHAN_PING_NS)
			ch->ping_due = 1;
		if (!ch->hello && !ch->ping_due)
			continue;
		lws_callback_on_writable(ch->wsi);
		if (ticks % 20 == 0)
			chan_seen(cp, ch);
	}
	lws_sul_schedule(cp->ctx, 0, sul, tick, 100 * LWS_US_PER_MS);
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len)
{
	struct cp *cp = the_cp;
	struct pss *pss = user;
	struct cp_req *rq;
	struct chan *ch;

	switch (reason) {
	case LWS_CALLBACK_HTTP: {
		static const struct { enum lws_token_indexes tok; const char *name; } methods[] = {
			{WSI_TOKEN_GET_URI, "GET"}, {WSI_TOKEN_POST_URI, "POST"}, {WSI_TOKEN_DELETE_URI, "DELETE"}};
		rq = calloc(1, sizeof *rq);
		if (rq == NULL)
			return -1;
		rq->refs = 1;
		rq->wsi = wsi;
		spaced_buf_init(&rq->body, CP_BODY_MAX);
		pss->req = rq;
		pthread_mutex_lock(&cp->mu);
		rq->next_inflight = cp->inflight;
		cp->inflight = rq;
		pthread_mutex_unlock(&cp->mu);
		int found = 0;
		for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
			if (lws_hdr_total_length(wsi, methods[i].tok) > 0) {
				found = 1;
				strcpy(rq->method, methods[i].name);
				if (lws_hdr_copy(wsi, rq->path, sizeof rq->path, methods[i].tok) < 0) {
					answer_now(cp, rq, 414, "uri-too-long", "the request URI is too long");
					return 0;
				}
				/* the query too (GET /v1/sandboxes?meta=K=V): its fragments, '&'-joined */
				char arg[256];
				for (int k = 0; lws_hdr_copy_fragment(wsi, arg, sizeof arg, WSI_TOKEN_HTTP_URI_ARGS, k) > 0; k++) {
					size_t pl = strlen(rq->path);
					if (pl + strlen(arg) + 2 >= sizeof rq->path)
						break;
					rq->path[pl] = k ? '&' : '?';
					memcpy(rq->path + pl + 1, arg, strlen(arg) + 1);
				}
			}
		if (!found) {
			answer_now(cp, rq, 405, "method-not-allowed", "GET, POST or DELETE");
			return 0;
		}
		if (lws_hdr_total_length(wsi, WSI_TOKEN_HTTP_AUTHORIZATION) < (int)sizeof rq->auth)
			lws_hdr_copy(wsi, rq->auth, sizeof rq->auth, WSI_TOKEN_HTTP_AUTHORIZATION);
		if (strcmp(rq->method, "POST") == 0) {
			char cl[32] = "";
			lws_hdr_copy(wsi, cl, sizeof cl, WSI_TOKEN_HTTP_CONTENT_LENGTH);
			long n = cl[0] ? strtol(cl, NULL, 10) : 0;
			if (n > CP_BODY_MAX || n < 0) {
				answer_now(cp, rq, 413, "too-large", "request body too large");
				return 0;
			}
			if (n > 0)
				return 0; /* the body follows */
		}
		dispatch(cp, rq);
		return 0;
	}
	case LWS_CALLBACK_HTTP_BODY:
		rq = pss->req;
		if (rq == NULL || rq->dispatched || rq->notified)
			return 0;
		if (spaced_buf_append(&rq->body, in, len) < 0)
			answer_now(cp, rq, 413, "too-large", "request body too large");
		return 0;
	case LWS_CALLBACK_HTTP_BODY_COMPLETION:
		rq = pss->req;
		if (rq != NULL && !rq->notified)
			dispatch(cp, rq);
		return 0;
	case LWS_CALLBACK_HTTP_WRITEABLE: {
		rq = pss->req;
		if (rq == NULL)
			return 0;
		pthread_mutex_lock(&cp->mu);
		int done = rq->done;
		if (done) {
			inflight_remove(cp, rq);
			rq->wsi = NULL;
		}
		pthread_mutex_unlock(&cp->mu);
		if (!done)
			return 0;
		pss->req = NULL;
		int r = write_answer(wsi, rq);
		cp_req_release(cp, rq);
		if (r < 0 || lws_http_transaction_completed(wsi))
			return -1;
		return 0;
	}
	case LWS_CALLBACK_CLOSED_HTTP:
	case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
		rq = pss ? pss->req : NULL;
		if (rq != NULL) {
			pss->req = NULL;
			pthread_mutex_lock(&cp->mu);
			inflight_remove(cp, rq);
			rq->wsi = NULL;
			pthread_mutex_unlock(&cp->mu);
			cp_req_release(cp, rq);
		}
		return 0;
	case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
		pthread_mutex_lock(&cp->mu);
		for (rq = cp->inflight; rq; rq = rq->next_inflight)
			if (rq->done && !rq->notified && rq->wsi != NULL) {
				rq->notified = 1;
				lws_callback_on_writable(rq->wsi);
			}
		pthread_mutex_unlock(&cp->mu);
		for (ch = chans; ch; ch = ch->next)
			if (ch->hello)
				lws_callback_on_writable(ch->wsi);
		return 0;

	/* ---- control channel ---- */
	case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION: {
		char worker[SPACED_NAME_MAX];
		if (chan_worker_from_uri(wsi, worker) < 0 || !chan_authorized(cp, wsi, worker))
			return 1; /* refuse the upgrade */
		return 0;
	}
	case LWS_CALLBACK_ESTABLISHED:
		ch = calloc(1, sizeof *ch);
		if (ch == NULL)
			return -1;
		if (chan_worker_from_uri(wsi, ch->worker) < 0) {
			free(ch);
			return -1;
		}
		ch->wsi = wsi;
		ch->last_rx = ch->last_ping = spaced_mono_ns();
		spaced_buf_init(&ch->rx, CP_BODY_MAX);
		/* one channel per worker: a new one replaces the old */
		for (struct chan *o = chans; o; o = o->next)
			if (strcmp(o->worker, ch->worker) == 0) {
				o->closing = 1;
				o->hello = 0;
				lws_callback_on_writable(o->wsi);
			}
		ch->next = chans;
		chans = ch;
		pss->ch = ch;
		return 0;
	case LWS_CALLBACK_RECEIVE: {
		ch = pss->ch;
		if (ch == NULL || ch->closing)
			return -1;
		ch->last_rx = spaced_mono_ns();
		if (spaced_buf_append(&ch->rx, in, len) < 0)
			return -1; /* oversized message: drop this connection */
		if (!lws_is_final_fragment(wsi))
			return 0;
		struct cp_chan_msg m;
		int r = cp_parse_chan((const char *)ch->rx.data, ch->rx.len, &m);
		spaced_buf_free(&ch->rx);
		spaced_buf_init(&ch->rx, CP_BODY_MAX);
		if (r < 0) {
			lwsl_user("channel %s: malformed message, closing\n", ch->worker);
			return -1;
		}
		if (m.kind == CP_CHAN_HELLO)
			r = chan_hello(cp, ch, &m);
		else if (!ch->hello)
			r = -1;
		else
			r = cp_record_ack(cp, cp->lws_st, ch->worker, &m) < 0 ? 0 : 0;
		free(m.result);
		return r < 0 ? -1 : 0;
	}
	case LWS_CALLBACK_RECEIVE_PONG:
		if (pss->ch != NULL)
			pss->ch->last_rx = spaced_mono_ns();
		return 0;
	case LWS_CALLBACK_SERVER_WRITEABLE:
		ch = pss->ch;
		if (ch == NULL || ch->closing)
			return -1;
		if (ch->ping_due) {
			uint8_t ping[LWS_PRE + 4] = {0};
			memcpy(ping + LWS_PRE, "spcd", 4); /* a payload: some peers ignore empty pings */
			ch->ping_due = 0;
			ch->last_ping = spaced_mono_ns();
			if (lws_write(wsi, ping + LWS_PRE, 4, LWS_WRITE_PING) < 0)
				return -1;
			lws_callback_on_writable(wsi);
			return 0;
		}
		if (!ch->hello)
			return 0;
		return chan_send_next(cp, ch);
	case LWS_CALLBACK_CLOSED:
		ch = pss->ch;
		if (ch == NULL)
			return 0;
		pss->ch = NULL;
		for (struct chan **p = &chans; *p; p = &(*p)->next)
			if (*p == ch) {
				*p = ch->next;
				break;
			}
		int others = 0;
		for (struct chan *o = chans; o; o = o->next)
			others += strcmp(o->worker, ch->worker) == 0;
		if (!others)
			CP_Q(cp->lws_st, NULL, NULL, "UPDATE workers SET channel_until = 0 WHERE id = $1", ch->worker);
		spaced_buf_free(&ch->rx);
		free(ch);
		return 0;
	default:
		return 0;
	}
}

static const struct lws_protocols protocols[] = {
	{"http", callback, sizeof(struct pss), CP_BODY_MAX, 0, NULL, 0},
	{"spaced-control", callback, sizeof(struct pss), CP_BODY_MAX, 0, NULL, 0},
	{NULL, NULL, 0, 0, 0, NULL, 0},
};

static void on_signal(int sig)
{
	(void)sig;
	if (the_cp != NULL) {
		the_cp->stopping = 1;
		if (the_cp->ctx != NULL)
			lws_cancel_service(the_cp->ctx);
	}
}

int cp_server_run(struct cp *cp)
{
	struct lws_context_creation_info info;
	pthread_t *threads = NULL;
	int r = 0, started = 0;
	char portfile[1024];
	the_cp = cp;
	memset(&info, 0, sizeof info);
	info.port = cp->port;
	info.iface = cp->listen_host;
	info.protocols = protocols;
	info.max_http_header_data = 4096;
	info.options = strchr(cp->listen_host, ':') ? 0 : LWS_SERVER_OPTION_DISABLE_IPV6;
	info.user = cp;
	lws_set_log_level(LLL_ERR | LLL_USER, NULL);
	cp->ctx = lws_create_context(&info);
	if (cp->ctx == NULL) {
		fprintf(stderr, "spaced-cp: cannot listen on %s:%d\n", cp->listen_host, cp->port);
		return SPACED_EIO;
	}
	struct lws_vhost *vh = lws_get_vhost_by_name(cp->ctx, "default");
	int port = vh ? lws_get_vhost_listen_port(vh) : cp->port;
	snprintf(portfile, sizeof portfile, "%s/cp.port", cp->state_dir);
	FILE *f = fopen(portfile, "w");
	if (f != NULL) {
		fprintf(f, "%d\n", port);
		fclose(f);
	}
	printf("spaced-cp: listening on http://%s:%d (store: %s)\n", cp->listen_host, port, cp_store_kind(cp->lws_st));
	fflush(stdout);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	signal(SIGPIPE, SIG_IGN);
	threads = calloc((size_t)cp->nthreads, sizeof *threads);
	if (threads == NULL) {
		r = SPACED_ENOMEM;
		goto out;
	}
	for (; started < cp->nthreads; started++)
		if (pthread_create(&threads[started], NULL, request_thread, cp) != 0)
			break;
	lws_sul_schedule(cp->ctx, 0, &tick_sul, tick, 100 * LWS_US_PER_MS);
	while (!cp->stopping)
		if (lws_service(cp->ctx, 0) < 0)
			break;
out:
	pthread_mutex_lock(&cp->mu);
	cp->stopping = 1;
	pthread_cond_broadcast(&cp->jobs_cv);
	pthread_cond_broadcast(&cp->ack_cv);
	pthread_mutex_unlock(&cp->mu);
	for (int i = 0; i < started; i++)
		pthread_join(threads[i], NULL);
	free(threads);
	lws_context_destroy(cp->ctx);
	cp->ctx = NULL;
	return r;
}
