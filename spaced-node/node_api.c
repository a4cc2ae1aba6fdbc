/*
 * node_api.c — node-api: the network-facing process of spaced-node.
 *
 * One libuv loop: the HTTP/1.1 and WebSocket server (libspaced/httpsrv.h:
 * strict parsing, per-client connection budgets, header and body deadlines)
 * and the link to the gate. node-api never decides who may do what: each
 * request becomes a REQ frame (the capability travels with it) and node-api
 * only relays what the gate answers — ACCEPT, REFUSE (401/403/409), OUT,
 * CANCEL, FAIL. Flow control (node.h): node-api credits a stream's output to
 * the gate as its client takes it, and stops reading a client whose input the
 * gate has not credited back, so no client makes it hold more than a window
 * per stream. Wire forms: docs/node-api.md.
 */
#include "links.h"
#include "node.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/rand.h>
#include <sodium.h>
#include <uv.h>

#include "spaced_error.h"
#include "httpsrv.h"
#include "util.h"
#include "ratelimit.h"
#include "tls.h"
#include "ws.h"

#define API_BUCKETS 1024
/* What one request may make node-api hold for it: an exec body being read,
 * a JSON answer being collected (stdout and stderr, a listing's entries). */
#define HOLD_MAX (16u << 20)
/* Below this a request may always grow, whatever the budget says. */
#define HOLD_FREE (64u * 1024u)
/* What one entry of a listing or of a process list costs in memory, beyond
 * its path or name (a JSON object of five members). */
#define ITEM_COST 384u
#define WS_MSG_MAX (64 * 1024)
#define LOW_WATER (64u * 1024u)

#define OWNER_BUCKETS 256

/* Whose share of the budget a request's bytes and a connection's queued
 * answers count in (hold): the tenant the gate named at ACCEPT ("t:TENANT",
 * or "s:SANDBOX" for an install that named none). Before ACCEPT a request
 * counts in no owner but in the unverified class (A.unverified). */
struct owner {
	struct owner *next;
	size_t held;   /* its requests' held bytes */
	size_t queued; /* answers queued on connections whose account it is */
	unsigned refs; /* requests and connections counting in it */
	char name[SPACED_NAME_MAX + 2];
};

struct wsmsg {
	struct wsmsg *next;
	bool text;
	size_t len;
	size_t credit; /* output bytes of the gate's this message carries */
	uint8_t data[];
};

struct areq {
	struct areq *hnext; /* id bucket chain */
	uint32_t id;
	struct spaced_httpconn *c; /* NULL once the client is gone */
	struct node_req req;
	bool sent_req;   /* REQ went to the gate */
	bool accepted;   /* the gate accepted it (ACCEPT seen) */
	bool ended;      /* the gate ended this id (END seen) */
	bool is_ws;
	bool is_metrics; /* a scrape on the metrics listener: the text collects in body */
	bool input_paused;
	bool stdin_ended; /* a WebSocket exec or terminal's client sent `d` */
	char ident[SPACED_IDENTITY_TEXT_MAX];
	struct owner *own; /* from ACCEPT; NULL before: the unverified class */
	struct owner *from; /* before ACCEPT, while it holds bytes: its client's address ("a:KEY") */
	char request_id[NODE_REQUEST_ID_MAX]; /* the client's X-Request-Id, or one made here */
	char peer[64];                        /* the client's address */
	size_t held;             /* bytes counted against the budget (hold) */
	uint64_t credit_pending; /* output the client took, not yet credited */
	uint64_t in_unacked;     /* input sent to the gate, not yet credited back */
	/* HTTP answer */
	bool headers_sent, final_seen;
	bool busy;               /* refused by the budget: the answer says when to retry */
	char *auth;              /* the Authorization of an exec whose body is being read */
	struct spaced_buf body;  /* a buffered exec body */
	struct spaced_buf so, se;
	json_t *items;
	/* output waiting for the client's queue to run low (stream and WebSocket) */
	struct wsmsg *q_head, *q_tail;
	size_t q_bytes;
	bool close_pending;
	int close_code;
	char close_reason[124];
};

static struct {
	uv_loop_t loop;
	struct spaced_httpsrv *srv, *metrics;
	int mgr_fd;
	uv_poll_t mgr_poll;
	int mgr_events;
	struct spaced_buf mgr_out, mgr_in;
	size_t mgr_in_off; /* mgr_in's bytes before it are handled */
	size_t mgr_out_off;
	uv_check_t mgr_check; /* writes what a turn queued for the gate at its end */
	uv_idle_t mgr_idle;
	bool mgr_flush_due, mgr_flush_due_credit_pass;
	uint32_t credit_due[256]; /* requests whose credit goes at the end of the turn */
	size_t ncredit_due;
	struct areq *bucket[API_BUCKETS];
	uint32_t next_id;
	uv_signal_t sigterm, sigint;
	bool quit;
	size_t held;        /* every request's held bytes */
	size_t unverified;  /* of those, requests' not yet accepted (exec bodies) */
	struct owner *owners[OWNER_BUCKETS];
	uint64_t budget;    /* node_api_config.answer_memory */
	uint64_t held_refused; /* requests refused 503 by the budget */
	uint64_t in_unacked;   /* every stream's input sent to the gate, not yet credited back */
} A;

static void mgr_update_poll(void);
static void pump(struct areq *r);

static void quit(void)
{
	if (A.quit)
		return;
	A.quit = true;
	uv_stop(&A.loop);
}

/* ---- request table ---- */

static struct areq *areq_find(uint32_t id)
{
	for (struct areq *r = A.bucket[id % API_BUCKETS]; r; r = r->hnext)
		if (r->id == id)
			return r;
	return NULL;
}

static struct areq *areq_new(struct spaced_httpconn *c)
{
	struct areq *r = calloc(1, sizeof *r);
	if (!r)
		return NULL;
	do {
		r->id = ++A.next_id;
	} while (r->id == 0 || areq_find(r->id));
	r->c = c;
	spaced_buf_init(&r->body, NODE_BODY_MAX);
	spaced_buf_init(&r->so, HOLD_MAX);
	spaced_buf_init(&r->se, HOLD_MAX);
	spaced_buf_init(&r->req.payload, 0);
	r->hnext = A.bucket[r->id % API_BUCKETS];
	A.bucket[r->id % API_BUCKETS] = r;
	spaced_httpconn_set_user(c, r);
	return r;
}

static void q_drop(struct areq *r)
{
	while (r->q_head) {
		struct wsmsg *m = r->q_head;
		r->q_head = m->next;
		free(m);
	}
	r->q_tail = NULL;
	r->q_bytes = 0;
}

static void in_acked(struct areq *r, uint64_t bytes)
{
	if (bytes > r->in_unacked)
		bytes = r->in_unacked;
	r->in_unacked -= bytes;
	A.in_unacked -= bytes;
}

/* ---- owners (whose share: hold) ---- */

static unsigned owner_bucket(const char *name)
{
	return spaced_fnv1a(name) % OWNER_BUCKETS;
}

/* The owner named name with one more reference, made when new; NULL when
 * out of memory. */
static struct owner *owner_get(const char *name)
{
	struct owner **b = &A.owners[owner_bucket(name)];
	for (struct owner *o = *b; o; o = o->next)
		if (strcmp(o->name, name) == 0) {
			o->refs++;
			return o;
		}
	struct owner *o = calloc(1, sizeof *o);
	if (!o)
		return NULL;
	snprintf(o->name, sizeof o->name, "%s", name);
	o->refs = 1;
	o->next = *b;
	*b = o;
	return o;
}

/* One reference less; freed at none (nothing counts in it any more). */
static void owner_put(struct owner *o)
{
	if (--o->refs > 0)
		return;
	for (struct owner **pp = &A.owners[owner_bucket(o->name)]; *pp; pp = &(*pp)->next)
		if (*pp == o) {
			*pp = o->next;
			break;
		}
	free(o);
}

/* r's answers count in o from now on: its held bytes move there from the
 * unverified class, and so does its connection's queued output (which
 * counts in the owner of the latest request accepted on it). */
static void owner_assign(struct areq *r, struct owner *o)
{
	if (!o)
		return;
	if (r->own) {
		owner_put(o);
		return;
	}
	r->own = o;
	A.unverified -= r->held;
	o->held += r->held;
	if (r->from) {
		r->from->held -= r->held;
		owner_put(r->from);
		r->from = NULL;
	}
	if (!r->c)
		return;
	size_t *acct = spaced_httpconn_account(r->c);
	if (acct == &o->queued)
		return;
	o->refs++;
	spaced_httpconn_set_account(r->c, &o->queued);
	if (acct)
		owner_put((struct owner *)((char *)acct - offsetof(struct owner, queued)));
}

/* The connection is gone: its queued output counts in no owner any more. */
static void owner_conn_gone(struct spaced_httpconn *c)
{
	size_t *acct = spaced_httpconn_account(c);
	if (!acct)
		return;
	spaced_httpconn_set_account(c, NULL);
	owner_put((struct owner *)((char *)acct - offsetof(struct owner, queued)));
}

static void areq_free(struct areq *r)
{
	in_acked(r, r->in_unacked);
	struct areq **pp = &A.bucket[r->id % API_BUCKETS];
	while (*pp && *pp != r)
		pp = &(*pp)->hnext;
	if (*pp)
		*pp = r->hnext;
	node_req_clear(&r->req);
	spaced_buf_free(&r->body);
	spaced_buf_free(&r->so);
	spaced_buf_free(&r->se);
	json_decref(r->items);
	q_drop(r);
	free(r->auth);
	A.held -= r->held;
	if (r->own) {
		r->own->held -= r->held;
		owner_put(r->own);
	} else {
		A.unverified -= r->held;
	}
	if (r->from) {
		r->from->held -= r->held;
		owner_put(r->from);
	}
	free(r);
}

/* ---- memory held for requests ----
 * Beyond its streams' windows (node.h: NODE_WINDOW), node-api buffers for a
 * request only an exec body being read and a JSON answer being collected;
 * those bytes, and every answer's bytes its client has not yet taken
 * (spaced_httpsrv_queued: a client that takes none for --stall-timeout is
 * closed), count against one budget (--answer-memory). Past the budget a
 * request that would hold more than HOLD_FREE is refused 503 rather than
 * grow, so one tenant's big answers cannot take the worker's memory, and
 * small answers still go through: node-api holds at most the budget, plus
 * HOLD_FREE per request, plus one frame. */
static size_t held_total(void)
{
	return A.held + (A.srv ? spaced_httpsrv_queued(A.srv) : 0);
}

/* Whether n more bytes for r would pass what it may hold: the budget; for
 * a request whose capability the gate has not accepted yet, a quarter of it
 * for all such (exec bodies being read), shared fairly between client
 * addresses; for an accepted one, its owner's fair share (spaced_fair_share:
 * past half of the budget in use a tenant holding an eighth gets no more,
 * past three quarters one holding a 128th), so one tenant's unread answers
 * leave the others theirs. */
static bool over_budget(const struct areq *r, size_t n)
{
	size_t total = held_total();
	if (total + n > A.budget)
		return true;
	if (!r->own)
		return A.unverified + n > A.budget / 4 ||
		       spaced_fair_share(A.unverified, A.budget / 4, r->from ? r->from->held : 0, HOLD_FREE) != 0;
	return spaced_fair_share(total, A.budget, r->own->held + r->own->queued, HOLD_FREE) != 0;
}

/* The owner that r's bytes count in before ACCEPT: its client's address
 * (an IPv6 /64 is one, spaced_caller_key); NULL when out of memory. */
static struct owner *owner_from(struct areq *r)
{
	if (!r->from) {
		char key[SPACED_CALLER_KEY_MAX], name[SPACED_CALLER_KEY_MAX + 2];
		spaced_caller_key(r->peer, key);
		snprintf(name, sizeof name, "a:%s", key);
		r->from = owner_get(name);
	}
	return r->from;
}

/* Counts n more bytes for r: 0, SPACED_ETOOBIG past HOLD_MAX for it,
 * SPACED_EBUSY past what it may hold (over_budget). */
static int hold(struct areq *r, size_t n)
{
	if (r->held + n > HOLD_MAX)
		return SPACED_ETOOBIG;
	if (!r->own && !owner_from(r))
		return SPACED_EBUSY;
	if (r->held + n > HOLD_FREE && over_budget(r, n)) {
		A.held_refused++;
		return SPACED_EBUSY;
	}
	r->held += n;
	A.held += n;
	if (r->own) {
		r->own->held += n;
	} else {
		A.unverified += n;
		r->from->held += n;
	}
	return 0;
}

/* ---- to the gate ---- */

/* Frames for the gate are written at the end of the loop's turn (the check
 * phase; the idle handle keeps the loop from sleeping first): a turn's REQ,
 * input and credits wake the gate once. */
static void credit(struct areq *r, size_t n, bool flush);

static void mgr_flush_due(uv_check_t *h)
{
	(void)h;
	if (!A.mgr_flush_due)
		return;
	A.mgr_flush_due = false;
	uv_idle_stop(&A.mgr_idle);
	/* credits asked for during the turn, unless their stream ended meanwhile */
	A.mgr_flush_due_credit_pass = true;
	for (size_t i = 0; i < A.ncredit_due; i++) {
		struct areq *r = areq_find(A.credit_due[i]);
		if (r)
			credit(r, 0, true);
	}
	A.mgr_flush_due_credit_pass = false;
	A.ncredit_due = 0;
	mgr_update_poll();
}

static void mgr_idle(uv_idle_t *h)
{
	(void)h;
	mgr_flush_due(NULL);
}

static void mgr_due(void)
{
	if (!A.mgr_flush_due) {
		A.mgr_flush_due = true;
		uv_idle_start(&A.mgr_idle, mgr_idle);
	}
}

static int mgr_send(uint16_t type, uint16_t flags, uint32_t id, const struct spaced_buf *b)
{
	int e = spaced_frame_append(&A.mgr_out, type, flags, id, b ? b->data : NULL, b ? b->len : 0);
	if (e < 0)
		return e;
	mgr_due();
	return 0;
}

static void mgr_send_close(struct areq *r)
{
	if (r->sent_req && !r->ended)
		mgr_send(NODE_MSG_CLOSE, 0, r->id, NULL);
	r->ended = true;
}

/* Tells the gate how much of the stream's output the client has taken
 * (batched; at once when nothing is left to write). */
static void credit(struct areq *r, size_t n, bool flush)
{
	r->credit_pending += n;
	if (r->credit_pending == 0 || r->ended || (!flush && r->credit_pending < NODE_CREDIT_BATCH))
		return;
	if (flush && r->credit_pending < NODE_CREDIT_BATCH && !A.mgr_flush_due_credit_pass) {
		/* at the end of the turn: a RESULT read with the data ends the
		 * stream, and no credit is needed at all */
		for (size_t i = 0; i < A.ncredit_due; i++)
			if (A.credit_due[i] == r->id)
				return;
		if (A.ncredit_due < sizeof A.credit_due / sizeof A.credit_due[0]) {
			A.credit_due[A.ncredit_due++] = r->id;
			mgr_due();
			return;
		}
	}
	struct spaced_buf b;
	spaced_buf_init(&b, 32);
	if (spaced_field_put_u64(&b, r->credit_pending) == 0)
		mgr_send(NODE_MSG_CREDIT, 0, r->id, &b);
	spaced_buf_free(&b);
	r->credit_pending = 0;
}

static void input_flow(struct areq *r)
{
	/* node.h: past the budget of all windows a stream gets the small one;
	 * one paused by it has that much on its way, so its own credit wakes it */
	bool pause = r->in_unacked >= (A.in_unacked >= NODE_WINDOWS_BUDGET ? NODE_WINDOW_SMALL : NODE_WINDOW);
	if (r->c && pause != r->input_paused) {
		r->input_paused = pause;
		spaced_httpconn_read(r->c, !pause);
	}
}

static int mgr_send_in(struct areq *r, uint16_t in, const void *p, size_t n, bool end)
{
	r->in_unacked += n;
	A.in_unacked += n;
	input_flow(r);
	/* the fields' heads, then the data straight into the link's buffer */
	struct spaced_buf b;
	spaced_buf_init(&b, 32);
	int e = spaced_field_put_u64(&b, in);
	if (e == 0)
		e = spaced_field_put_bytes_head(&b, n);
	if (e == 0 && b.len + n > NODE_MSG_MAX)
		e = SPACED_ETOOBIG;
	if (e == 0)
		e = spaced_frame_append2(&A.mgr_out, NODE_MSG_IN, end ? SPACED_FRAME_F_END : 0, r->id, b.data, b.len, p, n);
	spaced_buf_free(&b);
	if (e == 0)
		mgr_due();
	return e;
}

/* Sends data in chunks of at most SPACED_FRAME_CHUNK. */
static int mgr_send_in_chunks(struct areq *r, uint16_t in, const uint8_t *p, size_t n, bool end)
{
	do {
		size_t k = n > SPACED_FRAME_CHUNK ? SPACED_FRAME_CHUNK : n;
		int e = mgr_send_in(r, in, p, k, end && k == n);
		if (e < 0)
			return e;
		p += k;
		n -= k;
	} while (n > 0);
	return 0;
}

static int mgr_send_req(struct areq *r, const char *tok, size_t toklen)
{
	struct spaced_buf b;
	spaced_buf_init(&b, NODE_MSG_MAX);
	int e = spaced_field_put_strn(&b, tok, toklen);
	if (e == 0)
		e = spaced_field_put_str(&b, r->req.sandbox);
	if (e == 0)
		e = spaced_field_put_u64(&b, r->req.guest_type);
	if (e == 0)
		e = spaced_field_put_bytes(&b, r->req.payload.data, r->req.payload.len);
	if (e == 0)
		e = spaced_field_put_u64(&b, r->req.port);
	if (e == 0)
		e = spaced_field_put_str(&b, r->req.protocol);
	if (e == 0)
		e = spaced_field_put_str(&b, r->request_id);
	if (e == 0)
		e = spaced_field_put_str(&b, r->peer);
	if (e == 0)
		e = mgr_send(NODE_MSG_REQ, 0, r->id, &b);
	spaced_buf_free(&b);
	if (e == 0)
		r->sent_req = true;
	return e;
}

/* ---- HTTP answers ---- */

static void http_send_headers(struct areq *r, int status, const char *ctype, int64_t length)
{
	char extra[SPACED_IDENTITY_TEXT_MAX + 160];
	int n = snprintf(extra, sizeof extra, "cache-control: no-store\r\nx-request-id: %s\r\n", r->request_id);
	/* every answer an execution served carries its identity; refusals never */
	if (r->ident[0] && status != 401 && status != 403 && status != 409)
		n += snprintf(extra + n, sizeof extra - (size_t)n, "x-spaced-identity: %s\r\n", r->ident);
	if (r->busy && (size_t)n < sizeof extra)
		snprintf(extra + n, sizeof extra - (size_t)n, "retry-after: 1\r\n");
	spaced_httpconn_respond(r->c, status, ctype, length, extra);
	r->headers_sent = true;
}

static void http_busy(struct areq *r);

/* A whole JSON answer: the request is over for node-api. */
static void http_json(struct areq *r, int status, json_t *doc)
{
	/* the text is made once, at its size (json_dumps would grow a buffer
	 * to twice that and copy it again) */
	size_t n = doc ? json_dumpb(doc, NULL, 0, JSON_COMPACT) : 0;
	char *s = n ? malloc(n) : NULL;
	if (s && json_dumpb(doc, s, n, JSON_COMPACT) != n) {
		free(s);
		s = NULL;
	}
	if (!s)
		n = 0;
	json_decref(doc);
	if (!r->c) {
		free(s);
		return;
	}
	if (r->headers_sent) {
		spaced_httpconn_abort(r->c); /* a streamed answer cut short */
		free(s);
		return;
	}
	if (!r->busy && n > HOLD_FREE && over_budget(r, n)) {
		/* the answer's text would pass the budget (its escapes can make it
		 * six times what was collected): refused like a collection */
		free(s);
		A.held_refused++;
		http_busy(r);
		return;
	}
	http_send_headers(r, status, "application/json", (int64_t)n + 1);
	if (s)
		spaced_httpconn_write(r->c, s, n);
	spaced_httpconn_write(r->c, "\n", 1);
	free(s);
	struct spaced_httpconn *c = r->c;
	r->c = NULL;
	spaced_httpconn_set_user(c, NULL);
	mgr_send_close(r);
	areq_free(r);
	spaced_httpconn_end(c);
}

static void http_error(struct areq *r, int status, const char *code, const char *msg)
{
	http_json(r, status, json_pack("{s:s,s:s}", "error", msg, "code", code));
}

/* 503: the answer would pass node-api's budget (hold). */
static void http_busy(struct areq *r)
{
	r->busy = true;
	http_error(r, 503, "SPACED_EBUSY",
	           "the worker holds as many answers as it may, in all or for this tenant: retry, or stream the output "
	           "(exec over WebSocket, GET files)");
}

static void refuse_doc(struct areq *r, enum spaced_verdict v, enum spaced_reason why, const char *sandbox)
{
	json_t *doc = json_pack("{s:s,s:s}", "outcome", spaced_verdict_name(v), "reason", spaced_reason_name(why));
	if (v == SPACED_REFRESH_ROUTE)
		json_object_set_new(doc, "sandbox", json_string(sandbox));
	http_json(r, node_refusal_status(v, why), doc);
}

/* Whether the JSON text of p[0..n) stays within twice n (and 256 bytes):
 * a control byte costs six ("\u0001"), a newline, a tab, a quote or a
 * backslash two. */
static bool text_compact(const uint8_t *p, size_t n)
{
	size_t extra = 0;
	for (size_t i = 0; i < n; i++)
		if (p[i] == '\n' || p[i] == '\t' || p[i] == '\r' || p[i] == '\b' || p[i] == '\f' || p[i] == '"' ||
		    p[i] == '\\')
			extra += 1;
		else if (p[i] < 0x20)
			extra += 5;
	return extra <= n + 256;
}

/* A JSON string member holding bytes: text when valid UTF-8 whose JSON text
 * is at most twice its size, else base64. */
static void set_bytes(json_t *o, const char *key, const struct spaced_buf *b)
{
	const uint8_t *p = b->data ? b->data : (const uint8_t *)"";
	json_t *s = text_compact(p, b->len) ? json_stringn((const char *)p, b->len) : NULL;
	if (s) {
		json_object_set_new(o, key, s);
		return;
	}
	size_t n = spaced_b64url_encoded_len(b->len);
	char *enc = malloc(n + 1);
	char k[64];
	if (!enc)
		return;
	spaced_b64url_encode(enc, b->data, b->len);
	snprintf(k, sizeof k, "%s_b64url", key);
	json_object_set_new(o, k, json_string(enc));
	free(enc);
}

static const char *ftype_name(uint64_t t)
{
	switch (t) {
	case SPACED_GUEST_FT_FILE:
		return "file";
	case SPACED_GUEST_FT_DIR:
		return "dir";
	case SPACED_GUEST_FT_SYMLINK:
		return "symlink";
	default:
		return "other";
	}
}

static int read_stat(struct spaced_field_reader *rd, json_t *o)
{
	uint64_t type, size, mode;
	int64_t mtime;
	if (spaced_field_get_u64(rd, &type) < 0 || spaced_field_get_u64(rd, &size) < 0 ||
	    spaced_field_get_u64(rd, &mode) < 0 || spaced_field_get_i64(rd, &mtime) < 0)
		return SPACED_EPROTO;
	json_object_set_new(o, "type", json_string(ftype_name(type)));
	json_object_set_new(o, "size", json_integer((json_int_t)size));
	json_object_set_new(o, "mode", json_integer((json_int_t)mode));
	json_object_set_new(o, "mtime", json_integer(mtime));
	return 0;
}

/* Frames before the RESULT of a JSON answer. */
static int http_collect(struct areq *r, uint16_t type, const uint8_t *p, size_t n)
{
	struct spaced_field_reader rd;
	int e;
	if (!r->items)
		r->items = json_array();
	switch (type) {
	case SPACED_GUEST_OUT_STDOUT:
		return (e = hold(r, n)) < 0 ? e : spaced_buf_append(&r->so, p, n);
	case SPACED_GUEST_OUT_STDERR:
		return (e = hold(r, n)) < 0 ? e : spaced_buf_append(&r->se, p, n);
	case SPACED_GUEST_OUT_STARTED:
		return 0;
	case SPACED_GUEST_OUT_ENTRIES:
		spaced_field_reader_init(&rd, p, n);
		while (spaced_field_more(&rd)) {
			const char *path;
			size_t pl;
			json_t *o = json_object();
			if (spaced_field_get_str(&rd, &path, &pl) < 0 || read_stat(&rd, o) < 0) {
				json_decref(o);
				return SPACED_EPROTO;
			}
			if ((e = hold(r, ITEM_COST + pl)) < 0) {
				json_decref(o);
				return e;
			}
			json_object_set_new(o, "path", json_stringn(path, pl));
			json_array_append_new(r->items, o);
		}
		return spaced_field_end(&rd);
	case SPACED_GUEST_OUT_PROCS:
		spaced_field_reader_init(&rd, p, n);
		while (spaced_field_more(&rd)) {
			uint64_t proc, pid, running;
			int64_t code, sig;
			const char *a0;
			size_t al;
			if (spaced_field_get_u64(&rd, &proc) < 0 || spaced_field_get_u64(&rd, &pid) < 0 ||
			    spaced_field_get_u64(&rd, &running) < 0 || spaced_field_get_i64(&rd, &code) < 0 ||
			    spaced_field_get_i64(&rd, &sig) < 0 || spaced_field_get_str(&rd, &a0, &al) < 0)
				return SPACED_EPROTO;
			if ((e = hold(r, ITEM_COST + al)) < 0)
				return e;
			json_t *o = json_pack("{s:I,s:I,s:b,s:I,s:I}", "proc", (json_int_t)proc, "pid", (json_int_t)pid,
			                      "running", running != 0, "exit_code", (json_int_t)code, "signal", (json_int_t)sig);
			json_object_set_new(o, "argv0", json_stringn(a0, al));
			json_array_append_new(r->items, o);
		}
		return spaced_field_end(&rd);
	default:
		return SPACED_EPROTO;
	}
}

/* The RESULT of a JSON answer. */
static void http_result(struct areq *r, const uint8_t *p, size_t n)
{
	struct spaced_field_reader rd;
	int64_t status;
	const char *msg, *ident;
	size_t ml, il;
	spaced_field_reader_init(&rd, p, n);
	if (spaced_field_get_i64(&rd, &status) < 0 || spaced_field_get_str(&rd, &msg, &ml) < 0 ||
	    spaced_field_get_str(&rd, &ident, &il) < 0 || status > 0) {
		http_error(r, 502, "SPACED_EPROTO", "malformed answer from the execution");
		return;
	}
	if (status < 0) {
		json_t *doc = json_pack("{s:s,s:s%}", "code", spaced_errname((int)status), "error", msg, ml);
		http_json(r, node_error_status((int)status), doc ? doc : json_object());
		return;
	}
	json_t *doc = json_object();
	int e = 0;
	switch (r->req.guest_type) {
	case NODE_USAGE: {
		/* the gate's own answer: one JSON object */
		const char *text;
		size_t tl;
		json_error_t jerr;
		json_t *u = spaced_field_get_str(&rd, &text, &tl) == 0 ? json_loadb(text, tl, JSON_REJECT_DUPLICATES, &jerr)
		                                                        : NULL;
		if (!json_is_object(u) || json_object_update(doc, u) < 0)
			e = SPACED_EPROTO;
		json_decref(u);
		break;
	}
	case SPACED_GUEST_FS_STAT:
		e = read_stat(&rd, doc);
		break;
	case SPACED_GUEST_FS_LIST:
		json_object_set(doc, "entries", r->items ? r->items : json_array());
		break;
	case SPACED_GUEST_PROC_LIST:
		json_object_set(doc, "procs", r->items ? r->items : json_array());
		break;
	case SPACED_GUEST_EXEC:
	case SPACED_GUEST_PROC_ATTACH:
		if (r->req.exec_flags & SPACED_GUEST_EXEC_BACKGROUND) {
			uint64_t proc, pid;
			if (spaced_field_get_u64(&rd, &proc) < 0 || spaced_field_get_u64(&rd, &pid) < 0) {
				e = SPACED_EPROTO;
				break;
			}
			json_object_set_new(doc, "proc", json_integer((json_int_t)proc));
			json_object_set_new(doc, "pid", json_integer((json_int_t)pid));
		} else {
			int64_t code, sig;
			uint64_t to;
			if (spaced_field_get_i64(&rd, &code) < 0 || spaced_field_get_i64(&rd, &sig) < 0 ||
			    spaced_field_get_u64(&rd, &to) < 0) {
				e = SPACED_EPROTO;
				break;
			}
			json_object_set_new(doc, "exit_code", json_integer(code));
			json_object_set_new(doc, "signal", json_integer(sig));
			json_object_set_new(doc, "timed_out", json_boolean(to != 0));
			set_bytes(doc, "stdout", &r->so);
			set_bytes(doc, "stderr", &r->se);
			/* the strings hold copies: the collected bytes go before the text is made */
			spaced_buf_free(&r->so);
			spaced_buf_free(&r->se);
		}
		break;
	default:
		break;
	}
	if (e < 0) {
		json_decref(doc);
		http_error(r, 502, "SPACED_EPROTO", "malformed answer from the execution");
		return;
	}
	json_object_set_new(doc, "ok", json_true());
	http_json(r, 200, doc);
}

/* ---- output through the client's queue: streamed bodies and WebSocket ---- */

/* Output of a stream for its client: prefix (0: none) then p[0..n), cr
 * bytes of the gate's window. Sent at once while nothing waits and the
 * client's queue is low; else queued (one copy either way). */
static void q_push_pre(struct areq *r, bool text, uint8_t prefix, const void *p, size_t n, size_t cr)
{
	if (r->close_pending || !r->c) {
		credit(r, cr, true); /* dropped: taken as far as the gate is concerned */
		return;
	}
	size_t pl = prefix ? 1 : 0;
	if (!r->q_head && spaced_httpconn_queued(r->c) <= LOW_WATER) {
		int e = r->is_ws ? spaced_httpconn_ws_send2(r->c, text ? SPACED_WS_TEXT : SPACED_WS_BINARY, &prefix, pl,
		                                            p, n)
		                 : spaced_httpconn_write(r->c, p, n);
		if (e == 0) {
			r->credit_pending += cr;
			pump(r);
			return;
		}
	}
	struct wsmsg *m = malloc(sizeof *m + pl + n);
	if (!m) {
		r->close_pending = true;
		r->close_code = 1011;
		snprintf(r->close_reason, sizeof r->close_reason, "out of memory");
		pump(r);
		return;
	}
	m->next = NULL;
	m->text = text;
	m->len = pl + n;
	m->credit = cr;
	if (pl)
		m->data[0] = prefix;
	if (n)
		memcpy(m->data + pl, p, n);
	if (r->q_tail)
		r->q_tail->next = m;
	else
		r->q_head = m;
	r->q_tail = m;
	r->q_bytes += m->len;
	pump(r);
}

static void q_push(struct areq *r, bool text, const void *p, size_t n, size_t cr)
{
	q_push_pre(r, text, 0, p, n, cr);
}

static void q_json(struct areq *r, json_t *doc)
{
	char *s = json_dumps(doc, JSON_COMPACT);
	json_decref(doc);
	if (s)
		q_push(r, true, s, strlen(s), 0);
	free(s);
}

static void ws_close(struct areq *r, int code, bool drop_output, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void ws_close(struct areq *r, int code, bool drop_output, const char *fmt, ...)
{
	va_list ap;
	if (r->close_pending)
		return;
	if (drop_output)
		q_drop(r); /* S1: output stops at once */
	r->close_pending = true;
	r->close_code = code;
	va_start(ap, fmt);
	vsnprintf(r->close_reason, sizeof r->close_reason, fmt, ap);
	va_end(ap);
	pump(r);
}

/* Moves queued output to the client while its own queue is low; credits the
 * gate for what it took. */
static void pump(struct areq *r)
{
	struct spaced_httpconn *c = r->c;
	if (!c)
		return;
	while (r->q_head && spaced_httpconn_queued(c) <= LOW_WATER) {
		struct wsmsg *m = r->q_head;
		r->q_head = m->next;
		if (!r->q_head)
			r->q_tail = NULL;
		r->q_bytes -= m->len;
		int e = r->is_ws ? spaced_httpconn_ws_send(c, m->text ? SPACED_WS_TEXT : SPACED_WS_BINARY, m->data, m->len)
		                 : spaced_httpconn_write(c, m->data, m->len);
		r->credit_pending += m->credit;
		free(m);
		if (e < 0)
			break;
	}
	if (!r->q_head) {
		if (spaced_httpconn_queued(c) <= LOW_WATER)
			credit(r, 0, true);
		if (r->is_ws && r->close_pending) {
			r->c = NULL;
			spaced_httpconn_set_user(c, NULL);
			mgr_send_close(r);
			int code = r->close_code;
			char reason[124];
			snprintf(reason, sizeof reason, "%s", r->close_reason);
			areq_free(r);
			spaced_httpconn_ws_close(c, (unsigned)code, reason);
			return;
		}
		if (!r->is_ws && r->final_seen) {
			/* a streamed body is complete */
			r->c = NULL;
			spaced_httpconn_set_user(c, NULL);
			mgr_send_close(r);
			areq_free(r);
			spaced_httpconn_end(c);
			return;
		}
	} else if (spaced_httpconn_queued(c) <= LOW_WATER) {
		credit(r, 0, false);
	}
}

static int ws_refusal_code(enum spaced_verdict v, enum spaced_reason why)
{
	return 4000 + node_refusal_status(v, why);
}

static void ws_out(struct areq *r, uint16_t type, const uint8_t *p, size_t n)
{
	struct spaced_field_reader rd;
	switch (type) {
	case SPACED_GUEST_OUT_STDOUT:
	case SPACED_GUEST_OUT_STDERR:
		if (r->req.answer == NODE_ANS_WS_PORT) {
			q_push(r, false, p, n, n);
		} else {
			q_push_pre(r, false, type == SPACED_GUEST_OUT_STDOUT ? 'o' : 'e', p, n, n);
		}
		return;
	case SPACED_GUEST_OUT_EVENT: {
		static const char *const kinds[] = {"", "create", "modify", "delete", "move", "overflow"};
		uint64_t kind;
		const char *a, *b;
		size_t al, bl;
		spaced_field_reader_init(&rd, p, n);
		if (spaced_field_get_u64(&rd, &kind) < 0 || spaced_field_get_str(&rd, &a, &al) < 0 ||
		    spaced_field_get_str(&rd, &b, &bl) < 0 || kind == 0 || kind > 5) {
			credit(r, n, false);
			return;
		}
		json_t *doc = json_pack("{s:s,s:s%}", "event", kinds[kind], "path", a, al);
		if (kind == SPACED_GUEST_EV_MOVE)
			json_object_set_new(doc, "path2", json_stringn(b, bl));
		char *s = json_dumps(doc, JSON_COMPACT);
		json_decref(doc);
		if (s)
			q_push(r, true, s, strlen(s), n);
		else
			credit(r, n, true);
		free(s);
		return;
	}
	case SPACED_GUEST_OUT_RESULT: {
		int64_t status, code = 0, sig = 0;
		const char *msg, *ident;
		size_t ml, il;
		spaced_field_reader_init(&rd, p, n);
		if (spaced_field_get_i64(&rd, &status) < 0 || spaced_field_get_str(&rd, &msg, &ml) < 0 ||
		    spaced_field_get_str(&rd, &ident, &il) < 0) {
			ws_close(r, 1011, false, "backend protocol error");
			return;
		}
		if (status < 0) {
			ws_close(r, 1011, false, "error:%s", spaced_errname((int)status));
			return;
		}
		if ((r->req.answer == NODE_ANS_WS_TERM || r->req.answer == NODE_ANS_WS_EXEC) &&
		    spaced_field_get_i64(&rd, &code) == 0 && spaced_field_get_i64(&rd, &sig) == 0)
			q_json(r, json_pack("{s:{s:I,s:I}}", "exit", "code", (json_int_t)code, "signal", (json_int_t)sig));
		ws_close(r, 1000, false, "end");
		return;
	}
	default:
		credit(r, n, false);
		return;
	}
}

/* ---- frames from the gate ---- */

static int on_accept(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	(void)ctx;
	struct spaced_field_reader rd;
	uint64_t epoch;
	char ident[SPACED_IDENTITY_TEXT_MAX], owner[SPACED_NAME_MAX + 2] = "";
	spaced_field_reader_init(&rd, p, n);
	spaced_field_get_strbuf(&rd, ident, sizeof ident);
	spaced_field_get_u64(&rd, &epoch);
	spaced_field_get_strbuf(&rd, owner, sizeof owner);
	if (spaced_field_end(&rd) < 0 || (h->flags & SPACED_FRAME_F_END) || owner[0] == 0)
		return SPACED_EPROTO;
	struct areq *r = areq_find(h->id);
	if (!r || r->ended)
		return 0;
	memcpy(r->ident, ident, sizeof ident);
	owner_assign(r, owner_get(owner));
	r->accepted = true;
	if (r->is_ws)
		q_json(r, json_pack("{s:s,s:s,s:I}", "outcome", "ALLOW", "identity", ident, "epoch", (json_int_t)epoch));
	return 0;
}

static int on_refuse(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	(void)ctx;
	struct spaced_field_reader rd;
	uint64_t v, why;
	char sandbox[SPACED_NAME_MAX];
	spaced_field_reader_init(&rd, p, n);
	spaced_field_get_u64(&rd, &v);
	spaced_field_get_u64(&rd, &why);
	spaced_field_get_strbuf(&rd, sandbox, sizeof sandbox);
	if (spaced_field_end(&rd) < 0 || v > SPACED_DENY || v == SPACED_ALLOW || why >= SPACED_REASON__COUNT ||
	    !(h->flags & SPACED_FRAME_F_END))
		return SPACED_EPROTO;
	struct areq *r = areq_find(h->id);
	if (!r || r->ended)
		return 0;
	r->ended = true;
	if (!r->c)
		return 0;
	if (r->is_ws) {
		const char *label = v == SPACED_REFRESH_ROUTE ? "refresh-route" : "deny";
		/* CANCEL: the lease ended — output stops at once; REFUSE: the open was refused */
		ws_close(r, ws_refusal_code((enum spaced_verdict)v, (enum spaced_reason)why), true, "%s:%s", label,
		         spaced_reason_name((enum spaced_reason)why));
	} else {
		refuse_doc(r, (enum spaced_verdict)v, (enum spaced_reason)why, sandbox);
	}
	return 0;
}

static int on_out(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	(void)ctx;
	struct spaced_field_reader rd;
	uint64_t type;
	const uint8_t *data;
	size_t dl;
	int e;
	spaced_field_reader_init(&rd, p, n);
	spaced_field_get_u64(&rd, &type);
	spaced_field_get_bytes(&rd, &data, &dl);
	if (spaced_field_end(&rd) < 0 || type < SPACED_GUEST_OUT_RESULT || type > SPACED_GUEST_OUT_PROCS)
		return SPACED_EPROTO;
	bool end = h->flags & SPACED_FRAME_F_END;
	if ((type == SPACED_GUEST_OUT_RESULT) != end)
		return SPACED_EPROTO;
	struct areq *r = areq_find(h->id);
	if (!r || r->ended)
		return 0;
	if (end)
		r->ended = true;
	if (!r->c)
		return 0;
	if (r->is_ws) {
		ws_out(r, (uint16_t)type, data, dl);
		return 0;
	}
	if (r->req.answer == NODE_ANS_STREAM) {
		if (type == SPACED_GUEST_OUT_DATA) {
			if (!r->headers_sent)
				http_send_headers(r, 200, "application/octet-stream", -1);
			q_push(r, false, data, dl, dl);
			return 0;
		}
		if (type == SPACED_GUEST_OUT_RESULT) {
			struct spaced_field_reader x;
			int64_t status = -1;
			spaced_field_reader_init(&x, data, dl);
			spaced_field_get_i64(&x, &status);
			if (status == 0) {
				if (!r->headers_sent)
					http_send_headers(r, 200, "application/octet-stream", -1);
				r->final_seen = true;
				pump(r);
			} else if (!r->headers_sent) {
				http_result(r, data, dl);
			} else {
				struct spaced_httpconn *c = r->c;
				r->c = NULL;
				spaced_httpconn_set_user(c, NULL);
				areq_free(r);
				spaced_httpconn_abort(c); /* cut short: no final chunk */
			}
			return 0;
		}
		credit(r, dl, false);
		return 0;
	}
	/* a JSON answer is built whole (its own bounds apply): taken at once */
	credit(r, dl, false);
	if (type == SPACED_GUEST_OUT_RESULT) {
		http_result(r, data, dl);
	} else if ((e = http_collect(r, (uint16_t)type, data, dl)) < 0) {
		r->ended = true;
		mgr_send(NODE_MSG_CLOSE, 0, r->id, NULL);
		if (e == SPACED_EBUSY)
			http_busy(r);
		else if (e == SPACED_ETOOBIG)
			http_error(r, 413, "SPACED_ETOOBIG",
			           "the answer passes 16 MiB: stream it (exec over WebSocket, GET files) or list less deep");
		else
			http_error(r, 502, "SPACED_EPROTO", "malformed answer from the execution");
	}
	return 0;
}

static int on_fail(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	(void)ctx;
	struct spaced_field_reader rd;
	int64_t err;
	char msg[256];
	spaced_field_reader_init(&rd, p, n);
	spaced_field_get_i64(&rd, &err);
	spaced_field_get_strbuf(&rd, msg, sizeof msg);
	if (spaced_field_end(&rd) < 0 || !(h->flags & SPACED_FRAME_F_END))
		return SPACED_EPROTO;
	struct areq *r = areq_find(h->id);
	if (!r || r->ended)
		return 0;
	r->ended = true;
	if (!r->c)
		return 0;
	if (r->is_ws)
		ws_close(r, 1011, false, "error:%s", spaced_errname((int)err));
	else
		http_error(r, err == SPACED_EBUSY ? 503 : err == SPACED_ETIMEDOUT ? 504 : 502, spaced_errname((int)err), msg);
	return 0;
}

static int on_gcredit(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	(void)ctx;
	struct spaced_field_reader rd;
	uint64_t bytes;
	spaced_field_reader_init(&rd, p, n);
	spaced_field_get_u64(&rd, &bytes);
	if (spaced_field_end(&rd) < 0 || (h->flags & SPACED_FRAME_F_END))
		return SPACED_EPROTO;
	struct areq *r = areq_find(h->id);
	if (!r)
		return 0;
	in_acked(r, bytes);
	input_flow(r);
	return 0;
}

static int on_metrics_text(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	(void)ctx;
	struct spaced_field_reader rd;
	const uint8_t *data;
	size_t dl;
	spaced_field_reader_init(&rd, p, n);
	spaced_field_get_bytes(&rd, &data, &dl);
	if (spaced_field_end(&rd) < 0)
		return SPACED_EPROTO;
	struct areq *r = areq_find(h->id);
	if (!r || !r->is_metrics)
		return SPACED_EPROTO;
	if (spaced_buf_append(&r->body, data, dl) < 0)
		r->body.len = 0;
	if (!(h->flags & SPACED_FRAME_F_END))
		return 0;
	r->ended = true;
	/* node-api's own figures after the gate's */
	char own[640];
	int ol = snprintf(own, sizeof own,
	                  "# HELP spaced_node_api_held_bytes Bytes node-api holds for exec bodies, JSON answers being "
	                  "collected and answers clients have not taken (--answer-memory bounds them).\n"
	                  "# TYPE spaced_node_api_held_bytes gauge\nspaced_node_api_held_bytes %zu\n"
	                  "# HELP spaced_node_api_busy_total Requests refused 503 because their answer would pass "
	                  "--answer-memory.\n# TYPE spaced_node_api_busy_total counter\nspaced_node_api_busy_total %llu\n",
	                  held_total(), (unsigned long long)A.held_refused);
	if (r->body.len && ol > 0 && (size_t)ol < sizeof own && spaced_buf_append(&r->body, own, (size_t)ol) < 0)
		r->body.len = 0;
	if (r->c) {
		struct spaced_httpconn *c = r->c;
		spaced_httpconn_reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", r->body.data, r->body.len,
		                      "cache-control: no-store\r\n");
		r->c = NULL;
		spaced_httpconn_set_user(c, NULL);
	}
	areq_free(r);
	return 0;
}

/* What node-api takes from the gate: each type with its handler, once
 * links.c's table has passed its bounds, flags and the state of its id; the
 * handlers check the payload. */
static const struct spaced_frame_handler mgr_table[] = {
	{NODE_MSG_ACCEPT, on_accept}, {NODE_MSG_REFUSE, on_refuse}, {NODE_MSG_OUT, on_out},
	{NODE_MSG_CANCEL, on_refuse}, {NODE_MSG_FAIL, on_fail},     {NODE_MSG_GCREDIT, on_gcredit},
	{NODE_MSG_METRICS_TEXT, on_metrics_text},
};

/* The state of request id as links.c's table names it. */
static unsigned areq_link_state(uint32_t id)
{
	const struct areq *r = areq_find(id);
	if (!r)
		return LINK_ID_FREE;
	if (r->ended)
		return LINK_ID_ENDED;
	if (!r->sent_req)
		return 0; /* the gate has not heard of it: nothing is expected */
	return r->accepted ? LINK_ID_OPEN : LINK_ID_OPENING;
}

static void mgr_readable(void)
{
	/* up to a few frames a read; what is left of a frame stays where it is
	 * until the room after it runs short (moving each partial frame to the
	 * front copied a stream's output once more) */
	const size_t chunk = 4 * NODE_MSG_MAX;
	for (int round = 0; round < 16; round++) {
		if (A.mgr_in_off > 0 && A.mgr_in.cap - A.mgr_in.len < chunk + 1) {
			memmove(A.mgr_in.data, A.mgr_in.data + A.mgr_in_off, A.mgr_in.len - A.mgr_in_off);
			A.mgr_in.len -= A.mgr_in_off;
			A.mgr_in_off = 0;
		}
		/* read straight into the input buffer, after what waits there */
		if (spaced_buf_reserve(&A.mgr_in, chunk) < 0) {
			quit();
			return;
		}
		ssize_t n = read(A.mgr_fd, A.mgr_in.data + A.mgr_in.len, chunk);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			break;
		if (n <= 0) {
			quit();
			return;
		}
		A.mgr_in.len += (size_t)n;
		A.mgr_in.data[A.mgr_in.len] = 0;
		size_t off = A.mgr_in_off;
		for (;;) {
			struct spaced_frame_hdr h;
			const uint8_t *pl;
			size_t used;
			int e = spaced_frame_parse(A.mgr_in.data + off, A.mgr_in.len - off, NODE_MSG_MAX, &h, &pl, &used);
			if (e == 0 && used == 0)
				break;
			enum link_verdict v = LINK_BAD;
			if (e == 0) {
				v = link_check(LINK_API, &h, areq_link_state(h.id));
				if (v == LINK_HANDLE)
					e = spaced_frame_dispatch(mgr_table, sizeof mgr_table / sizeof mgr_table[0], NULL, &h, pl,
					                          h.len);
				else if (v == LINK_BAD)
					e = SPACED_EPROTO;
			}
			if (e < 0) {
				fprintf(stderr, "node-api: protocol error from the gate (%s for request %u)\n",
				        link_msg_name(h.type), h.id);
				quit();
				return;
			}
			off += used;
		}
		A.mgr_in_off = off;
		if (off == A.mgr_in.len)
			A.mgr_in.len = A.mgr_in_off = 0;
		if ((size_t)n < chunk)
			break;
	}
}

static void mgr_writable(void)
{
	while (A.mgr_out_off < A.mgr_out.len) {
		ssize_t n = write(A.mgr_fd, A.mgr_out.data + A.mgr_out_off, A.mgr_out.len - A.mgr_out_off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			break;
		if (n <= 0) {
			quit();
			return;
		}
		A.mgr_out_off += (size_t)n;
	}
	if (A.mgr_out_off == A.mgr_out.len) {
		A.mgr_out.len = 0;
		A.mgr_out_off = 0;
	} else if (A.mgr_out_off > (1u << 20)) {
		memmove(A.mgr_out.data, A.mgr_out.data + A.mgr_out_off, A.mgr_out.len - A.mgr_out_off);
		A.mgr_out.len -= A.mgr_out_off;
		A.mgr_out_off = 0;
	}
}

static void on_mgr(uv_poll_t *h, int status, int events)
{
	(void)h;
	if (status < 0) {
		quit();
		return;
	}
	if (events & UV_WRITABLE)
		mgr_writable();
	if (events & (UV_READABLE | UV_DISCONNECT))
		mgr_readable();
	mgr_update_poll();
}

static void mgr_update_poll(void)
{
	if (A.quit)
		return;
	if (A.mgr_out_off < A.mgr_out.len)
		mgr_writable(); /* most frames go at once */
	int ev = UV_READABLE | (A.mgr_out_off < A.mgr_out.len ? UV_WRITABLE : 0);
	if (ev != A.mgr_events) {
		A.mgr_events = ev;
		uv_poll_start(&A.mgr_poll, ev, on_mgr);
	}
}

/* ---- requests ---- */

static int method_of(const char *m, enum node_method *out)
{
	static const struct {
		const char *name;
		enum node_method m;
	} map[] = {{"GET", NODE_GET}, {"PUT", NODE_PUT}, {"POST", NODE_POST}, {"DELETE", NODE_DELETE}};
	for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
		if (strcmp(m, map[i].name) == 0) {
			*out = map[i].m;
			return 0;
		}
	return SPACED_EINVAL;
}

/* Parses the request into r->req; answers errors itself (false then). */
/* The request's id: the client's X-Request-Id when it is 1-64 of
 * [A-Za-z0-9._-], else 16 random hex digits; and the client's address. */
static void request_identity(struct areq *r, const struct spaced_http_req *hreq)
{
	const char *id = spaced_http_field(hreq, "x-request-id");
	size_t n = id ? strlen(id) : 0;
	if (id && n > 0 && n < sizeof r->request_id && spaced_name_valid(id, n)) {
		memcpy(r->request_id, id, n + 1);
	} else {
		/* drawn from a pool filled 512 ids at a time (not a system call a request) */
		static uint8_t pool[4096];
		static size_t left;
		if (left < 8) {
			randombytes_buf(pool, sizeof pool);
			left = sizeof pool;
		}
		left -= 8;
		sodium_bin2hex(r->request_id, sizeof r->request_id, pool + left, 8);
	}
	snprintf(r->peer, sizeof r->peer, "%s", spaced_httpconn_peer(r->c));
}

static bool intake(struct areq *r, const struct spaced_http_req *hreq, bool ws)
{
	enum node_method method;
	request_identity(r, hreq);
	char path[1024];
	const char *q = strchr(hreq->target, '?');
	size_t pl = q ? (size_t)(q - hreq->target) : strlen(hreq->target);
	if (pl >= sizeof path) {
		if (ws)
			ws_close(r, 4414, false, "path too long");
		else
			http_error(r, 414, "SPACED_ETOOBIG", "path too long");
		return false;
	}
	memcpy(path, hreq->target, pl);
	path[pl] = '\0';
	if (method_of(hreq->method, &method) < 0) {
		if (ws)
			ws_close(r, 4405, false, "bad method");
		else
			http_error(r, 405, "SPACED_EINVAL", "method not allowed");
		return false;
	}
	char *store = malloc(NODE_QUERY_MAX);
	struct node_query query;
	int e = store ? 0 : SPACED_ENOMEM;
	if (e == 0 && q && node_query_split(q + 1, strlen(q + 1), store, NODE_QUERY_MAX, &query) < 0)
		e = SPACED_ETOOBIG;
	if (e == 0 && !q)
		memset(&query, 0, sizeof query);
	if (e < 0) {
		free(store);
		if (ws)
			ws_close(r, 4400, false, "bad query");
		else
			http_error(r, e == SPACED_ENOMEM ? 500 : 400, spaced_errname(e), "bad query");
		return false;
	}
	e = node_req_parse(&r->req, method, path, &query, ws);
	free(store);
	if (e < 0) {
		int st = e == SPACED_ENOENT ? 404 : e == SPACED_EINVAL ? 405 : e == SPACED_ENOMEM ? 500 : 400;
		if (ws)
			ws_close(r, 4000 + st, false, "%s", spaced_errname(e));
		else
			http_error(r, st, spaced_errname(e), st == 404 ? "no such endpoint" : "bad request");
		return false;
	}
	return true;
}

static bool send_req_with_auth(struct areq *r, const struct spaced_http_req *hreq)
{
	const char *auth = spaced_http_field(hreq, "authorization");
	const char *tok;
	size_t toklen;
	if (!auth || node_bearer(auth, strlen(auth), &tok, &toklen) < 0) {
		/* no capability at all: the same answer as a malformed one (C5) */
		r->ended = true;
		if (r->is_ws)
			ws_close(r, 4401, false, "deny:malformed");
		else
			refuse_doc(r, SPACED_DENY, SPACED_REASON_MALFORMED, r->req.sandbox);
		return false;
	}
	if (mgr_send_req(r, tok, toklen) < 0) {
		r->ended = true;
		if (r->is_ws)
			ws_close(r, 1011, false, "error:SPACED_EBUSY");
		else
			http_error(r, 503, "SPACED_EBUSY", "worker busy");
		return false;
	}
	return true;
}

static void on_request(struct spaced_httpconn *c, const struct spaced_http_req *hreq)
{
	struct areq *r = areq_new(c);
	if (!r) {
		spaced_httpconn_reply(c, 503, "application/json", "{\"error\":\"busy\"}\n", 17, NULL);
		return;
	}
	if (hreq->websocket) {
		r->is_ws = true;
		/* the stream's outcome (ALLOW, or a 44xx close) follows the upgrade */
		if (spaced_httpconn_ws_accept(c, NULL) < 0) {
			spaced_httpconn_set_user(c, NULL);
			areq_free(r);
			spaced_httpconn_abort(c);
			return;
		}
		if (intake(r, hreq, true))
			send_req_with_auth(r, hreq);
		return;
	}
	if (!intake(r, hreq, false))
		return;
	if (r->req.body == NODE_BODY_NONE && hreq->body != SPACED_HTTP_BODY_NONE) {
		http_error(r, 400, "SPACED_EINVAL", "this endpoint takes no body");
		return;
	}
	if (r->req.body == NODE_BODY_EXEC) {
		/* the REQ goes once the JSON body is whole */
		const char *a = spaced_http_field(hreq, "authorization");
		if (hreq->body == SPACED_HTTP_BODY_NONE) {
			http_error(r, 400, "SPACED_EFORMAT", "an exec needs its JSON body");
			return;
		}
		if (hreq->body == SPACED_HTTP_BODY_LENGTH && hreq->content_length > NODE_BODY_MAX) {
			http_error(r, 413, "SPACED_ETOOBIG", "exec body too large");
			return;
		}
		spaced_httpconn_body_max(c, NODE_BODY_MAX);
		r->auth = a ? strdup(a) : NULL;
		if (!r->auth) {
			r->ended = true;
			refuse_doc(r, SPACED_DENY, SPACED_REASON_MALFORMED, r->req.sandbox);
		}
		return;
	}
	if (r->req.body == NODE_BODY_STREAM)
		spaced_httpconn_body_max(c, UINT64_MAX >> 2); /* a file of any size, under flow control */
	if (!send_req_with_auth(r, hreq))
		return;
	if (r->req.body == NODE_BODY_STREAM && hreq->body == SPACED_HTTP_BODY_NONE)
		mgr_send_in(r, SPACED_GUEST_IN_DATA, NULL, 0, true); /* an empty file */
}

static void exec_body_done(struct areq *r)
{
	void *keep = NULL;
	const char *in = NULL, *tok;
	size_t inlen = 0, toklen;
	int e = node_req_exec_body(&r->req, (const char *)(r->body.data ? r->body.data : (const uint8_t *)""), r->body.len,
	                           &keep, &in, &inlen);
	if (e < 0) {
		http_error(r, 400, spaced_errname(e), "bad exec body");
		return;
	}
	if (!r->auth || node_bearer(r->auth, strlen(r->auth), &tok, &toklen) < 0) {
		json_decref(keep);
		r->ended = true;
		refuse_doc(r, SPACED_DENY, SPACED_REASON_MALFORMED, r->req.sandbox);
		return;
	}
	int sent = mgr_send_req(r, tok, toklen);
	if (sent < 0) {
		json_decref(keep);
		r->ended = true;
		http_error(r, 503, "SPACED_EBUSY", "worker busy");
		return;
	}
	if (r->req.exec_flags & SPACED_GUEST_EXEC_STDIN)
		mgr_send_in_chunks(r, SPACED_GUEST_IN_STDIN, (const uint8_t *)in, inlen, true);
	json_decref(keep);
}

static void on_body(struct spaced_httpconn *c, const uint8_t *p, size_t n)
{
	struct areq *r = spaced_httpconn_user(c);
	if (!r || r->ended)
		return; /* refused or failed already: the rest of the body is dropped */
	if (r->req.body == NODE_BODY_EXEC) {
		int e = r->body.len + n > r->body.max ? SPACED_ETOOBIG : hold(r, n);
		if (e == 0)
			e = spaced_buf_append(&r->body, p, n);
		if (e < 0) {
			r->ended = true;
			if (e == SPACED_EBUSY)
				http_busy(r);
			else
				http_error(r, 413, "SPACED_ETOOBIG", "exec body too large");
		}
		return;
	}
	if (r->req.body == NODE_BODY_STREAM)
		mgr_send_in_chunks(r, SPACED_GUEST_IN_DATA, p, n, false);
}

static void on_body_end(struct spaced_httpconn *c)
{
	struct areq *r = spaced_httpconn_user(c);
	if (!r || r->ended)
		return;
	if (r->req.body == NODE_BODY_EXEC)
		exec_body_done(r);
	else if (r->req.body == NODE_BODY_STREAM)
		mgr_send_in(r, SPACED_GUEST_IN_DATA, NULL, 0, true);
}

/* One complete client message on a WebSocket. */
static void on_ws_message(struct spaced_httpconn *c, bool text, const uint8_t *p, size_t n)
{
	struct areq *r = spaced_httpconn_user(c);
	(void)text;
	if (!r || r->ended || r->close_pending)
		return; /* the stream's input stopped */
	if (n > WS_MSG_MAX) {
		mgr_send_close(r);
		ws_close(r, 1009, true, "message too big");
		return;
	}
	if (r->req.answer == NODE_ANS_WS_PORT) {
		mgr_send_in_chunks(r, SPACED_GUEST_IN_STDIN, p, n, false);
		return;
	}
	bool term = r->req.answer == NODE_ANS_WS_TERM, exec = r->req.answer == NODE_ANS_WS_EXEC;
	if ((term || exec) && n >= 1 && (p[0] == 'i' || p[0] == 'd') && r->stdin_ended) {
		/* the client said its input ended: more of it is a broken client */
		mgr_send_close(r);
		ws_close(r, 1008, true, "input after its end");
		return;
	}
	if ((term || exec) && n >= 1 && p[0] == 'i') {
		mgr_send_in_chunks(r, SPACED_GUEST_IN_STDIN, p + 1, n - 1, false);
		return;
	}
	if ((term || exec) && n == 1 && p[0] == 'd') {
		r->stdin_ended = true;
		mgr_send_in(r, SPACED_GUEST_IN_STDIN, NULL, 0, true);
		return;
	}
	if (exec && n >= 2 && n < 8 && p[0] == 's') {
		char tmp[8];
		unsigned sig;
		char extra;
		memcpy(tmp, p + 1, n - 1);
		tmp[n - 1] = '\0';
		if (sscanf(tmp, "%u%c", &sig, &extra) == 1 && sig >= 1 && sig <= 64) {
			struct spaced_buf b;
			spaced_buf_init(&b, 32);
			spaced_field_put_i64(&b, (int64_t)sig);
			mgr_send_in(r, SPACED_GUEST_IN_SIGNAL, b.data, b.len, false);
			spaced_buf_free(&b);
			return;
		}
	}
	if (term && n >= 4 && n < 32 && p[0] == 'r') {
		char tmp[32];
		unsigned rows, cols;
		char extra;
		memcpy(tmp, p + 1, n - 1);
		tmp[n - 1] = '\0';
		if (sscanf(tmp, "%u %u%c", &rows, &cols, &extra) == 2 && rows && cols && rows <= 1000 && cols <= 1000) {
			struct spaced_buf b;
			spaced_buf_init(&b, 64);
			spaced_field_put_u64(&b, rows);
			spaced_field_put_u64(&b, cols);
			mgr_send_in(r, SPACED_GUEST_IN_RESIZE, b.data, b.len, false);
			spaced_buf_free(&b);
			return;
		}
	}
	mgr_send_close(r);
	ws_close(r, 1003, true, "bad message");
}

static void on_drain(struct spaced_httpconn *c)
{
	struct areq *r = spaced_httpconn_user(c);
	if (r)
		pump(r);
}

static void on_conn_close(struct spaced_httpconn *c)
{
	owner_conn_gone(c);
	struct areq *r = spaced_httpconn_user(c);
	if (!r)
		return;
	r->c = NULL;
	mgr_send_close(r);
	areq_free(r);
}

/* The metrics listener: GET /metrics only, answered from the gate. */
static void on_metrics_request(struct spaced_httpconn *c, const struct spaced_http_req *hreq)
{
	if (strcmp(hreq->method, "GET") != 0 || strcmp(hreq->target, "/metrics") != 0 || hreq->websocket) {
		spaced_httpconn_reply(c, 404, "text/plain", "not found\n", 10, NULL);
		return;
	}
	struct areq *r = areq_new(c);
	if (!r) {
		spaced_httpconn_reply(c, 503, "text/plain", "busy\n", 5, NULL);
		return;
	}
	r->is_metrics = true;
	spaced_buf_free(&r->body);
	spaced_buf_init(&r->body, 16u << 20);
	if (mgr_send(NODE_MSG_METRICS, 0, r->id, NULL) < 0) {
		spaced_httpconn_set_user(c, NULL);
		areq_free(r);
		spaced_httpconn_reply(c, 503, "text/plain", "busy\n", 5, NULL);
		return;
	}
	r->sent_req = true;
}

static const struct spaced_httpsrv_ops metrics_ops = {
	.on_request = on_metrics_request,
	.on_close = on_conn_close,
};

static const struct spaced_httpsrv_ops ops = {
	.on_request = on_request,
	.on_body = on_body,
	.on_body_end = on_body_end,
	.on_ws_message = on_ws_message,
	.on_drain = on_drain,
	.on_close = on_conn_close,
};

static void on_signal(uv_signal_t *s, int sig)
{
	(void)s;
	(void)sig;
	quit();
}

int node_api_run(const struct node_api_config *cfg)
{
	int rc = 1;
	signal(SIGPIPE, SIG_IGN);
	if (uv_loop_init(&A.loop) < 0)
		return 1;
	A.mgr_fd = cfg->mgr_fd;
	A.budget = cfg->answer_memory ? cfg->answer_memory : NODE_ANSWER_MEMORY;
	/* big buffers (answers, bodies) in mappings of their own, given back
	 * to the system when freed: what the budget counts is what node-api
	 * holds, not a heap that only grows */
	mallopt(M_MMAP_THRESHOLD, 128 * 1024);
	mallopt(M_TRIM_THRESHOLD, 32 << 20);
	fcntl(A.mgr_fd, F_SETFL, fcntl(A.mgr_fd, F_GETFL) | O_NONBLOCK);
	spaced_buf_init(&A.mgr_out, 256u << 20);
	spaced_buf_init(&A.mgr_in, 8 * NODE_MSG_MAX); /* mgr_readable: a read of four frames after what is left */
	/* TLS: the certificate and key are read now, before the confinement
	 * (no files after it); OpenSSL's random generator is seeded now too */
	SSL_CTX *tls = NULL;
	if (cfg->tls_cert) {
		char terr[600];
		if (spaced_tls_server_ctx(cfg->tls_cert, cfg->tls_key, cfg->tls_client_ca, true, &tls, terr, sizeof terr) < 0) {
			fprintf(stderr, "node-api: %s\n", terr);
			goto out;
		}
		unsigned char seed[16];
		if (RAND_bytes(seed, sizeof seed) != 1)
			goto out;
	}
	struct spaced_httpsrv_config hc;
	spaced_httpsrv_defaults(&hc);
	hc.tls = tls;
	hc.host = cfg->listen_host;
	hc.port = cfg->listen_port;
	hc.max_conns_per_ip = 128;
	hc.ws_message_max = WS_MSG_MAX;
	hc.low_water = LOW_WATER;
	hc.sndbuf = hc.rcvbuf = (int)(cfg->socket_buffer ? cfg->socket_buffer : NODE_SOCKET_BUFFER);
	hc.send_timeout_ms = cfg->stall_timeout_ms > 0 ? (unsigned)cfg->stall_timeout_ms : hc.send_timeout_ms;
	hc.ops = &ops;
	if (spaced_httpsrv_start(&A.loop, &hc, &A.srv) < 0) {
		fprintf(stderr, "node-api: cannot listen on %s:%d\n", cfg->listen_host, cfg->listen_port);
		goto out;
	}
	if (uv_poll_init(&A.loop, &A.mgr_poll, A.mgr_fd) < 0)
		goto out;
	A.mgr_events = 0;
	uv_check_init(&A.loop, &A.mgr_check);
	uv_idle_init(&A.loop, &A.mgr_idle);
	uv_check_start(&A.mgr_check, mgr_flush_due);
	mgr_update_poll();
	uv_signal_init(&A.loop, &A.sigterm);
	uv_signal_init(&A.loop, &A.sigint);
	uv_signal_start(&A.sigterm, on_signal, SIGTERM);
	uv_signal_start(&A.sigint, on_signal, SIGINT);
	if (cfg->metrics_host) {
		struct spaced_httpsrv_config mcfg;
		spaced_httpsrv_defaults(&mcfg);
		mcfg.host = cfg->metrics_host;
		mcfg.port = cfg->metrics_port;
		mcfg.max_conns = 64;
		mcfg.max_conns_per_ip = 16;
		mcfg.body_max = 0;
		mcfg.tls = tls;
		mcfg.ops = &metrics_ops;
		if (spaced_httpsrv_start(&A.loop, &mcfg, &A.metrics) < 0) {
			fprintf(stderr, "node-api: cannot listen on %s:%d for metrics\n", cfg->metrics_host, cfg->metrics_port);
			goto out;
		}
		if (cfg->metrics_port_file) {
			char tmp[4200];
			snprintf(tmp, sizeof tmp, "%s.tmp", cfg->metrics_port_file);
			FILE *f = fopen(tmp, "w");
			if (!f || fprintf(f, "%d\n", spaced_httpsrv_port(A.metrics)) < 0 || fclose(f) != 0 ||
			    rename(tmp, cfg->metrics_port_file) < 0) {
				fprintf(stderr, "node-api: cannot write %s\n", cfg->metrics_port_file);
				goto out;
			}
		}
	}
	int port = spaced_httpsrv_port(A.srv);
	if (cfg->port_file) {
		char tmp[4200];
		snprintf(tmp, sizeof tmp, "%s.tmp", cfg->port_file);
		FILE *f = fopen(tmp, "w");
		if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0 || rename(tmp, cfg->port_file) < 0) {
			fprintf(stderr, "node-api: cannot write %s\n", cfg->port_file);
			goto out;
		}
	}
	if (sodium_init() < 0) /* request ids: its random source is opened before the confinement */
		goto out;
	/* From here on: no privileges, no new files, no new connections out. */
	int e = node_api_confine(cfg->drop_privileges);
	if (e < 0) {
		fprintf(stderr, "node-api: cannot confine itself: %s\n", spaced_strerror(e));
		goto out;
	}
	uv_run(&A.loop, UV_RUN_DEFAULT);
	rc = 0;
out:
	/* the process ends here: the kernel closes what is left */
	return rc;
}
