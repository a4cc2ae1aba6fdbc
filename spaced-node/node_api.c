/*
 * node_api.c — node-api: the network-facing half of spaced-node.
 *
 * libwebsockets on its own poll loop serves HTTP/1.1 and WebSocket; the
 * socketpair to sbx-manager is adopted into the same loop as a raw
 * descriptor. node-api never decides who may do what: each request becomes a
 * REQ frame (the capability travels with it) and node-api only relays what
 * the manager answers — ACCEPT, REFUSE (401/403/409), OUT, CANCEL, FAIL.
 * Writes to the manager are queued and written when the socket is writable,
 * so node-api never blocks; uploads pause (rx flow control) while that queue
 * is long. Wire forms: docs/node-api.md.
 */
#include "node.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <libwebsockets.h>

#include "error.h"

#define API_BUCKETS 1024
#define CLIENT_OUT_MAX (64u << 20)
#define WS_MSG_MAX (64 * 1024)
#define WRITE_CHUNK (16 * 1024)

struct wsmsg {
	struct wsmsg *next;
	bool text;
	size_t len;
	size_t credit; /* output bytes of the gate's this message carries (flow control) */
	uint8_t data[];
};

enum areq_state { AR_WAIT, AR_ACCEPTED, AR_DONE };

struct areq {
	struct areq *hnext;   /* id bucket chain */
	uint32_t id;
	struct lws *wsi;      /* NULL once the client is gone */
	struct node_req req;
	bool sent_req;        /* REQ went to the manager */
	bool ended;           /* the manager ended this id (END seen) */
	bool rx_paused;
	bool is_ws;
	char ident[SPACED_IDENTITY_TEXT_MAX];
	/* flow control (node.h): output taken by the client not yet credited
	 * to the gate, input sent to the gate not yet credited back */
	uint64_t credit_pending;
	uint64_t in_unacked;
	/* HTTP answer */
	int status;
	bool headers_sent, final_ready, abort, chunked;
	const char *ctype;
	struct spaced_buf out; /* body bytes not yet written */
	size_t out_off;
	/* exec body */
	struct spaced_buf body;
	/* answer builders */
	struct spaced_buf so, se;
	json_t *items;
	/* WebSocket */
	struct wsmsg *wq_head, *wq_tail;
	size_t wq_bytes;
	bool close_pending;
	int close_code;
	char close_reason[124];
	struct spaced_buf wrx; /* a message being received */
};

struct pss {
	struct areq *r;
};

static struct {
	struct lws_context *ctx;
	struct lws *mgr_wsi;
	int mgr_fd;
	struct spaced_buf mgr_out, mgr_in;
	size_t mgr_out_off;
	struct areq *bucket[API_BUCKETS];
	uint32_t next_id;
	volatile sig_atomic_t quit;
	int exit_code;
} A;

static void on_term(int sig)
{
	(void)sig;
	A.quit = 1;
	if (A.ctx)
		lws_cancel_service(A.ctx);
}

/* ---- request table ---- */

static struct areq *areq_find(uint32_t id)
{
	for (struct areq *r = A.bucket[id % API_BUCKETS]; r; r = r->hnext)
		if (r->id == id)
			return r;
	return NULL;
}

static struct areq *areq_new(struct lws *wsi)
{
	struct areq *r = calloc(1, sizeof *r);
	if (!r)
		return NULL;
	do {
		r->id = ++A.next_id;
	} while (r->id == 0 || areq_find(r->id));
	r->wsi = wsi;
	spaced_buf_init(&r->out, CLIENT_OUT_MAX);
	spaced_buf_init(&r->body, NODE_BODY_MAX);
	spaced_buf_init(&r->so, CLIENT_OUT_MAX / 4);
	spaced_buf_init(&r->se, CLIENT_OUT_MAX / 4);
	spaced_buf_init(&r->wrx, WS_MSG_MAX);
	spaced_buf_init(&r->req.payload, 0);
	r->status = 200;
	r->hnext = A.bucket[r->id % API_BUCKETS];
	A.bucket[r->id % API_BUCKETS] = r;
	return r;
}

static void areq_free(struct areq *r)
{
	struct areq **pp = &A.bucket[r->id % API_BUCKETS];
	while (*pp && *pp != r)
		pp = &(*pp)->hnext;
	if (*pp)
		*pp = r->hnext;
	node_req_clear(&r->req);
	spaced_buf_free(&r->out);
	spaced_buf_free(&r->body);
	spaced_buf_free(&r->so);
	spaced_buf_free(&r->se);
	spaced_buf_free(&r->wrx);
	json_decref(r->items);
	while (r->wq_head) {
		struct wsmsg *m = r->wq_head;
		r->wq_head = m->next;
		free(m);
	}
	free(r);
}

/* ---- to the manager ---- */

static int mgr_send(uint16_t type, uint16_t flags, uint32_t id, const struct spaced_buf *b)
{
	int e = spaced_frame_append(&A.mgr_out, type, flags, id, b ? b->data : NULL, b ? b->len : 0);
	if (e < 0)
		return e;
	if (A.mgr_wsi)
		lws_callback_on_writable(A.mgr_wsi);
	return 0;
}

/* Tells the gate how much of the stream's output the client has taken;
 * batched, and at once when nothing is left to write. */
static void credit(struct areq *r, size_t n, bool flush)
{
	r->credit_pending += n;
	if (r->credit_pending == 0 || r->ended || (!flush && r->credit_pending < 32768))
		return;
	struct spaced_buf b;
	spaced_buf_init(&b, 32);
	if (spaced_field_put_u64(&b, r->credit_pending) == 0)
		mgr_send(NODE_MSG_CREDIT, 0, r->id, &b);
	spaced_buf_free(&b);
	r->credit_pending = 0;
}

static void mgr_send_close(struct areq *r)
{
	if (r->sent_req && !r->ended)
		mgr_send(NODE_MSG_CLOSE, 0, r->id, NULL);
	r->ended = true;
}

static void pause_input(struct areq *r)
{
	if (!r->rx_paused && r->wsi && r->in_unacked >= NODE_WINDOW) {
		r->rx_paused = true;
		lws_rx_flow_control(r->wsi, 0);
	}
}

static int mgr_send_in(struct areq *r, uint16_t in, const void *p, size_t n, bool end)
{
	r->in_unacked += n;
	pause_input(r);
	struct spaced_buf b;
	spaced_buf_init(&b, NODE_MSG_MAX);
	int e = spaced_field_put_u64(&b, in);
	if (e == 0)
		e = spaced_field_put_bytes(&b, p, n);
	if (e == 0)
		e = mgr_send(NODE_MSG_IN, end ? SPACED_FRAME_F_END : 0, r->id, &b);
	spaced_buf_free(&b);
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
		e = mgr_send(NODE_MSG_REQ, 0, r->id, &b);
	spaced_buf_free(&b);
	if (e == 0)
		r->sent_req = true;
	return e;
}

/* ---- HTTP answers ---- */

static void http_json(struct areq *r, int status, json_t *doc)
{
	char *s = json_dumps(doc, JSON_COMPACT);
	json_decref(doc);
	r->status = status;
	r->ctype = "application/json";
	r->out.len = 0;
	r->out_off = 0;
	if (!s || spaced_buf_puts(&r->out, s) < 0 || spaced_buf_puts(&r->out, "\n") < 0)
		r->abort = true;
	free(s);
	r->final_ready = true;
	if (r->wsi)
		lws_callback_on_writable(r->wsi);
}

static void http_error(struct areq *r, int status, const char *code, const char *msg)
{
	http_json(r, status, json_pack("{s:s,s:s}", "error", msg, "code", code));
}

static void refuse_doc(struct areq *r, enum spaced_verdict v, enum spaced_reason why,
                       const char *sandbox)
{
	json_t *doc = json_pack("{s:s,s:s}", "outcome", spaced_verdict_name(v), "reason",
	                        spaced_reason_name(why));
	if (v == SPACED_REFRESH_ROUTE)
		json_object_set_new(doc, "sandbox", json_string(sandbox));
	http_json(r, node_refusal_status(v, why), doc);
}

/* A JSON string member holding bytes: text when valid UTF-8, else base64. */
static void set_bytes(json_t *o, const char *key, const struct spaced_buf *b)
{
	json_t *s = json_stringn((const char *)(b->data ? b->data : (const uint8_t *)""), b->len);
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
	if (!r->items)
		r->items = json_array();
	switch (type) {
	case SPACED_GUEST_OUT_STDOUT:
		return spaced_buf_append(&r->so, p, n);
	case SPACED_GUEST_OUT_STDERR:
		return spaced_buf_append(&r->se, p, n);
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
			json_t *o = json_pack("{s:I,s:I,s:b,s:I,s:I}", "proc", (json_int_t)proc, "pid",
			                      (json_int_t)pid, "running", running != 0, "exit_code",
			                      (json_int_t)code, "signal", (json_int_t)sig);
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
		/* the manager's own answer: one JSON object */
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

/* ---- WebSocket answers ---- */

static void ws_queue_credit(struct areq *r, bool text, const void *p, size_t n, size_t cr)
{
	if (r->close_pending) {
		credit(r, cr, true); /* dropped: taken as far as the gate is concerned */
		return;
	}
	struct wsmsg *m = malloc(sizeof *m + n);
	if (!m) {
		r->close_pending = true;
		r->close_code = LWS_CLOSE_STATUS_UNEXPECTED_CONDITION;
		snprintf(r->close_reason, sizeof r->close_reason, "out of memory");
	} else {
		m->next = NULL;
		m->text = text;
		m->len = n;
		m->credit = cr;
		if (n)
			memcpy(m->data, p, n);
		if (r->wq_tail)
			r->wq_tail->next = m;
		else
			r->wq_head = m;
		r->wq_tail = m;
		r->wq_bytes += n;
		if (r->wq_bytes > CLIENT_OUT_MAX + NODE_WINDOW) {
			r->close_pending = true;
			r->close_code = LWS_CLOSE_STATUS_POLICY_VIOLATION;
			snprintf(r->close_reason, sizeof r->close_reason, "client too slow");
		}
	}
	if (r->wsi)
		lws_callback_on_writable(r->wsi);
}

static void ws_queue(struct areq *r, bool text, const void *p, size_t n)
{
	ws_queue_credit(r, text, p, n, 0);
}

static void ws_queue_json(struct areq *r, json_t *doc)
{
	char *s = json_dumps(doc, JSON_COMPACT);
	json_decref(doc);
	if (s)
		ws_queue(r, true, s, strlen(s));
	free(s);
}

static void ws_close(struct areq *r, int code, bool drop_output, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void ws_close(struct areq *r, int code, bool drop_output, const char *fmt, ...)
{
	va_list ap;
	if (r->close_pending)
		return;
	if (drop_output) {
		while (r->wq_head) {
			struct wsmsg *m = r->wq_head;
			r->wq_head = m->next;
			free(m);
		}
		r->wq_tail = NULL;
		r->wq_bytes = 0;
	}
	r->close_pending = true;
	r->close_code = code;
	va_start(ap, fmt);
	vsnprintf(r->close_reason, sizeof r->close_reason, fmt, ap);
	va_end(ap);
	if (r->wsi)
		lws_callback_on_writable(r->wsi);
}

static int ws_refusal_code(enum spaced_verdict v, enum spaced_reason why)
{
	return 4000 + node_refusal_status(v, why);
}

static void ws_out(struct areq *r, uint16_t type, const uint8_t *p, size_t n, bool end)
{
	struct spaced_field_reader rd;
	switch (type) {
	case SPACED_GUEST_OUT_STDOUT:
	case SPACED_GUEST_OUT_STDERR:
		if (r->req.answer == NODE_ANS_WS_PORT) {
			ws_queue_credit(r, false, p, n, n);
		} else {
			uint8_t *m = malloc(n + 1);
			if (!m)
				return;
			m[0] = type == SPACED_GUEST_OUT_STDOUT ? 'o' : 'e';
			memcpy(m + 1, p, n);
			ws_queue_credit(r, false, m, n + 1, n);
			free(m);
		}
		return;
	case SPACED_GUEST_OUT_EVENT: {
		static const char *const kinds[] = {"", "create", "modify", "delete", "move", "overflow"};
		uint64_t kind;
		const char *a, *b;
		size_t al, bl;
		spaced_field_reader_init(&rd, p, n);
		if (spaced_field_get_u64(&rd, &kind) < 0 || spaced_field_get_str(&rd, &a, &al) < 0 ||
		    spaced_field_get_str(&rd, &b, &bl) < 0 || kind == 0 || kind > 5)
			return;
		json_t *doc = json_pack("{s:s,s:s%}", "event", kinds[kind], "path", a, al);
		if (kind == SPACED_GUEST_EV_MOVE)
			json_object_set_new(doc, "path2", json_stringn(b, bl));
		char *s = json_dumps(doc, JSON_COMPACT);
		json_decref(doc);
		if (s)
			ws_queue_credit(r, true, s, strlen(s), n);
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
			ws_close(r, LWS_CLOSE_STATUS_UNEXPECTED_CONDITION, false, "backend protocol error");
			return;
		}
		if (status < 0) {
			ws_close(r, LWS_CLOSE_STATUS_UNEXPECTED_CONDITION, false, "error:%s", spaced_errname((int)status));
			return;
		}
		if (r->req.answer == NODE_ANS_WS_TERM && spaced_field_get_i64(&rd, &code) == 0 &&
		    spaced_field_get_i64(&rd, &sig) == 0)
			ws_queue_json(r, json_pack("{s:{s:I,s:I}}", "exit", "code", (json_int_t)code, "signal",
			                           (json_int_t)sig));
		ws_close(r, LWS_CLOSE_STATUS_NORMAL, false, "end");
		return;
	}
	default:
		(void)end;
		return;
	}
}

/* ---- frames from the manager ---- */

static int on_accept(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	(void)ctx;
	struct spaced_field_reader rd;
	uint64_t epoch;
	char ident[SPACED_IDENTITY_TEXT_MAX];
	spaced_field_reader_init(&rd, p, n);
	spaced_field_get_strbuf(&rd, ident, sizeof ident);
	spaced_field_get_u64(&rd, &epoch);
	if (spaced_field_end(&rd) < 0 || (h->flags & SPACED_FRAME_F_END))
		return SPACED_EPROTO;
	struct areq *r = areq_find(h->id);
	if (!r || r->ended)
		return 0;
	memcpy(r->ident, ident, sizeof ident);
	if (r->is_ws)
		ws_queue_json(r, json_pack("{s:s,s:s,s:I}", "outcome", "ALLOW", "identity", ident, "epoch",
		                           (json_int_t)epoch));
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
	if (r->is_ws) {
		const char *label = v == SPACED_REFRESH_ROUTE ? "refresh-route" : "deny";
		/* CANCEL: the lease ended — output stops at once; REFUSE: the open was refused */
		ws_close(r, ws_refusal_code((enum spaced_verdict)v, (enum spaced_reason)why), true, "%s:%s",
		         label, spaced_reason_name((enum spaced_reason)why));
	} else if (r->headers_sent) {
		r->abort = true; /* a streamed answer cut off: the client sees it incomplete */
		if (r->wsi)
			lws_callback_on_writable(r->wsi);
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
	if (!r->wsi)
		return 0;
	if (r->is_ws) {
		ws_out(r, (uint16_t)type, data, dl, end);
		return 0;
	}
	if (r->req.answer == NODE_ANS_STREAM) {
		if (type == SPACED_GUEST_OUT_DATA) {
			/* credited as it is written to the client (http_writable) */
			if (spaced_buf_append(&r->out, data, dl) < 0)
				r->abort = true;
			r->ctype = "application/octet-stream";
			lws_callback_on_writable(r->wsi);
			return 0;
		}
		if (type == SPACED_GUEST_OUT_RESULT) {
			struct spaced_field_reader x;
			int64_t status = -1;
			spaced_field_reader_init(&x, data, dl);
			spaced_field_get_i64(&x, &status);
			if (status == 0) {
				r->ctype = "application/octet-stream";
				r->final_ready = true;
				lws_callback_on_writable(r->wsi);
			} else if (!r->headers_sent) {
				http_result(r, data, dl);
			} else {
				r->abort = true;
				lws_callback_on_writable(r->wsi);
			}
			return 0;
		}
		return 0;
	}
	/* a JSON answer is built whole (its own bounds apply): taken at once */
	credit(r, dl, false);
	if (type == SPACED_GUEST_OUT_RESULT)
		http_result(r, data, dl);
	else if (http_collect(r, (uint16_t)type, data, dl) < 0) {
		r->ended = true;
		mgr_send(NODE_MSG_CLOSE, 0, r->id, NULL);
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
	if (r->is_ws) {
		ws_close(r, LWS_CLOSE_STATUS_UNEXPECTED_CONDITION, false, "error:%s", spaced_errname((int)err));
	} else if (r->headers_sent) {
		r->abort = true;
		if (r->wsi)
			lws_callback_on_writable(r->wsi);
	} else {
		http_error(r, err == SPACED_EBUSY ? 503 : 502, spaced_errname((int)err), msg);
	}
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
	r->in_unacked = bytes > r->in_unacked ? 0 : r->in_unacked - bytes;
	if (r->rx_paused && r->in_unacked < NODE_WINDOW && r->wsi) {
		r->rx_paused = false;
		lws_rx_flow_control(r->wsi, 1);
	}
	return 0;
}

static const struct spaced_frame_handler mgr_table[] = {
	{NODE_MSG_GCREDIT, on_gcredit},
	{NODE_MSG_ACCEPT, on_accept},
	{NODE_MSG_REFUSE, on_refuse},
	{NODE_MSG_OUT, on_out},
	{NODE_MSG_CANCEL, on_refuse},
	{NODE_MSG_FAIL, on_fail},
};

static void mgr_readable(void)
{
	uint8_t tmp[65536];
	for (;;) {
		ssize_t n = read(A.mgr_fd, tmp, sizeof tmp);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			break;
		if (n <= 0 || spaced_buf_append(&A.mgr_in, tmp, (size_t)n) < 0) {
			A.quit = 1;
			return;
		}
		size_t off = 0;
		for (;;) {
			struct spaced_frame_hdr h;
			const uint8_t *pl;
			size_t used;
			int e = spaced_frame_parse(A.mgr_in.data + off, A.mgr_in.len - off, NODE_MSG_MAX, &h, &pl,
			                           &used);
			if (e == 0 && used == 0)
				break;
			if (e == 0)
				e = spaced_frame_dispatch(mgr_table, sizeof mgr_table / sizeof mgr_table[0], NULL, &h,
				                          pl, h.len);
			if (e < 0) {
				lwsl_err("node-api: protocol error from sbx-manager\n");
				A.quit = 1;
				return;
			}
			off += used;
		}
		memmove(A.mgr_in.data, A.mgr_in.data + off, A.mgr_in.len - off);
		A.mgr_in.len -= off;
		if ((size_t)n < sizeof tmp)
			break;
	}
}

static int mgr_writable(void)
{
	while (A.mgr_out_off < A.mgr_out.len) {
		ssize_t n = write(A.mgr_fd, A.mgr_out.data + A.mgr_out_off, A.mgr_out.len - A.mgr_out_off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			break;
		if (n <= 0) {
			A.quit = 1;
			return -1;
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
	/* what is left is asked for again by the service loop: a request made
	 * inside a raw descriptor's own writeable callback may be dropped */
	return 0;
}

/* ---- request intake ---- */

static int get_method(struct lws *wsi, enum node_method *m, enum lws_token_indexes *tok)
{
	static const struct {
		enum lws_token_indexes t;
		enum node_method m;
	} map[] = {
		{WSI_TOKEN_GET_URI, NODE_GET},
		{WSI_TOKEN_POST_URI, NODE_POST},
		{WSI_TOKEN_PUT_URI, NODE_PUT},
		{WSI_TOKEN_DELETE_URI, NODE_DELETE},
	};
	for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
		if (lws_hdr_total_length(wsi, map[i].t) > 0) {
			*m = map[i].m;
			*tok = map[i].t;
			return 0;
		}
	}
	return SPACED_EINVAL;
}

/* Collects the query fragments (lws has decoded them) into q. */
static int get_query(struct lws *wsi, char *store, size_t storesz, struct node_query *q)
{
	size_t used = 0;
	memset(q, 0, sizeof *q);
	for (int i = 0;; i++) {
		if (used >= storesz)
			return SPACED_ETOOBIG;
		int n = lws_hdr_copy_fragment(wsi, store + used, (int)(storesz - used), WSI_TOKEN_HTTP_URI_ARGS, i);
		if (n < 0) {
			if (lws_hdr_fragment_length(wsi, WSI_TOKEN_HTTP_URI_ARGS, i) > 0)
				return SPACED_ETOOBIG;
			break;
		}
		if (q->n == NODE_QUERY_FRAGS)
			return SPACED_ETOOBIG;
		q->frag[q->n++] = store + used;
		used += (size_t)n + 1;
	}
	return 0;
}

/* Parses the request on wsi into r->req and sends the REQ (unless the body
 * must be read first). Answers errors itself. */
static void intake(struct areq *r, struct lws *wsi, const char *path, bool ws)
{
	enum node_method method;
	enum lws_token_indexes mtok;
	char *store = malloc(NODE_QUERY_MAX);
	struct node_query q;
	int e;

	if (!store) {
		http_error(r, 500, "SPACED_ENOMEM", "out of memory");
		return;
	}
	if (get_method(wsi, &method, &mtok) < 0) {
		if (ws)
			ws_close(r, 4405, false, "bad method");
		else
			http_error(r, 405, "SPACED_EINVAL", "method not allowed");
		goto out;
	}
	if (get_query(wsi, store, NODE_QUERY_MAX, &q) < 0) {
		if (ws)
			ws_close(r, 4400, false, "bad query");
		else
			http_error(r, 414, "SPACED_ETOOBIG", "query too long");
		goto out;
	}
	e = node_req_parse(&r->req, method, path, &q, ws);
	if (e < 0) {
		int st = e == SPACED_ENOENT ? 404 : e == SPACED_EINVAL ? 405 : e == SPACED_ENOMEM ? 500 : 400;
		if (ws)
			ws_close(r, 4000 + st, false, "%s", spaced_errname(e));
		else
			http_error(r, st, spaced_errname(e), st == 404 ? "no such endpoint" : "bad request");
		goto out;
	}
out:
	free(store);
}

static int send_req_with_auth(struct areq *r, struct lws *wsi)
{
	char auth[NODE_TOKEN_MAX + 64];
	const char *tok;
	size_t toklen;
	int n = lws_hdr_copy(wsi, auth, sizeof auth, WSI_TOKEN_HTTP_AUTHORIZATION);
	if (n <= 0 || node_bearer(auth, (size_t)n, &tok, &toklen) < 0) {
		/* no capability at all: the same answer as a malformed one (C5) */
		r->ended = true;
		if (r->is_ws)
			ws_close(r, 4401, false, "deny:malformed");
		else
			refuse_doc(r, SPACED_DENY, SPACED_REASON_MALFORMED, r->req.sandbox);
		return -1;
	}
	if (mgr_send_req(r, tok, toklen) < 0) {
		r->ended = true;
		http_error(r, 503, "SPACED_EBUSY", "worker busy");
		return -1;
	}
	return 0;
}

/* Sends a buffered exec body once complete. */
static void exec_body_done(struct areq *r)
{
	void *keep = NULL;
	const char *in = NULL;
	size_t inlen = 0;
	int e = node_req_exec_body(&r->req, (const char *)(r->body.data ? r->body.data : (const uint8_t *)""),
	                           r->body.len, &keep, &in, &inlen);
	if (e < 0) {
		http_error(r, 400, spaced_errname(e), "bad exec body");
		return;
	}
	if (send_req_with_auth(r, r->wsi) == 0 && (r->req.exec_flags & SPACED_GUEST_EXEC_STDIN))
		mgr_send_in_chunks(r, SPACED_GUEST_IN_STDIN, (const uint8_t *)in, inlen, true);
	json_decref(keep);
}

/* ---- writing to the client ---- */

static int http_writable(struct areq *r, struct lws *wsi)
{
	uint8_t buf[LWS_PRE + WRITE_CHUNK + 32];
	if (r->abort)
		return -1;
	if (!r->headers_sent) {
		if (!r->final_ready && r->out.len == 0)
			return 0;
		uint8_t *start = buf + LWS_PRE, *p = start, *end = buf + sizeof buf - 1;
		/* the length is known once the whole answer is here; a file still
		 * arriving goes out chunked, so a cut-off stream is visible as such */
		r->chunked = !r->final_ready;
		const char *ct = r->ctype ? r->ctype : "application/json";
		if (lws_add_http_header_status(wsi, (unsigned int)r->status, &p, end) ||
		    lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CONTENT_TYPE, (const unsigned char *)ct,
		                                 (int)strlen(ct), &p, end))
			return -1;
		if (r->chunked) {
			if (lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING,
			                                 (const unsigned char *)"chunked", 7, &p, end))
				return -1;
		} else if (lws_add_http_header_content_length(wsi, (lws_filepos_t)r->out.len, &p, end)) {
			return -1;
		}
		if (r->ident[0] && r->status != 401 && r->status != 403 && r->status != 409 &&
		    lws_add_http_header_by_name(wsi, (const unsigned char *)"x-spaced-identity:",
		                                (const unsigned char *)r->ident, (int)strlen(r->ident), &p, end))
			return -1;
		if (lws_add_http_header_by_name(wsi, (const unsigned char *)"cache-control:",
		                                (const unsigned char *)"no-store", 8, &p, end))
			return -1;
		if (lws_finalize_write_http_header(wsi, start, &p, end))
			return -1;
		r->headers_sent = true;
		lws_callback_on_writable(wsi);
		return 0;
	}
	size_t left = r->out.len - r->out_off;
	size_t k = left > WRITE_CHUNK ? WRITE_CHUNK : left;
	bool last = r->final_ready && k == left;
	if (k == 0 && !last)
		return 0;
	uint8_t *w = buf + LWS_PRE;
	size_t n = 0;
	if (r->chunked && k) {
		n = (size_t)snprintf((char *)w, 16, "%zx\r\n", k);
	}
	if (k)
		memcpy(w + n, r->out.data + r->out_off, k);
	n += k;
	if (r->chunked && k) {
		memcpy(w + n, "\r\n", 2);
		n += 2;
	}
	if (r->chunked && last) {
		memcpy(w + n, "0\r\n\r\n", 5);
		n += 5;
	}
	if (lws_write(wsi, w, n, last ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP) != (int)n)
		return -1;
	r->out_off += k;
	if (r->out_off == r->out.len) {
		r->out.len = 0;
		r->out_off = 0;
	}
	if (r->req.answer == NODE_ANS_STREAM)
		credit(r, k, r->out.len == 0);
	if (last) {
		r->final_ready = false;
		struct pss *pss = lws_wsi_user(wsi);
		if (pss)
			pss->r = NULL;
		r->wsi = NULL;
		mgr_send_close(r);
		areq_free(r);
		if (lws_http_transaction_completed(wsi))
			return -1;
		return 0;
	}
	if (r->out_off < r->out.len || r->final_ready)
		lws_callback_on_writable(wsi);
	return 0;
}

static int ws_writable(struct areq *r, struct lws *wsi)
{
	if (r->wq_head) {
		struct wsmsg *m = r->wq_head;
		uint8_t *buf = malloc(LWS_PRE + m->len + 1);
		if (!buf)
			return -1;
		memcpy(buf + LWS_PRE, m->data, m->len);
		int n = lws_write(wsi, buf + LWS_PRE, m->len, m->text ? LWS_WRITE_TEXT : LWS_WRITE_BINARY);
		free(buf);
		if (n < (int)m->len)
			return -1;
		r->wq_head = m->next;
		if (!r->wq_head)
			r->wq_tail = NULL;
		r->wq_bytes -= m->len;
		credit(r, m->credit, r->wq_head == NULL);
		free(m);
		if (r->wq_head || r->close_pending)
			lws_callback_on_writable(wsi);
		return 0;
	}
	if (r->close_pending) {
		lws_close_reason(wsi, (enum lws_close_status)r->close_code, (unsigned char *)r->close_reason,
		                 strlen(r->close_reason));
		return -1;
	}
	return 0;
}

/* One complete client message on a WebSocket. */
static void ws_message(struct areq *r, const uint8_t *p, size_t n)
{
	if (r->ended || r->close_pending)
		return; /* the stream's input stopped */
	if (r->req.answer == NODE_ANS_WS_PORT) {
		mgr_send_in_chunks(r, SPACED_GUEST_IN_STDIN, p, n, false);
		return;
	}
	if (r->req.answer == NODE_ANS_WS_TERM && n >= 1 && p[0] == 'i') {
		mgr_send_in_chunks(r, SPACED_GUEST_IN_STDIN, p + 1, n - 1, false);
		return;
	}
	if (r->req.answer == NODE_ANS_WS_TERM && n == 1 && p[0] == 'd') {
		mgr_send_in(r, SPACED_GUEST_IN_STDIN, NULL, 0, true);
		return;
	}
	if (r->req.answer == NODE_ANS_WS_TERM && n >= 4 && n < 32 && p[0] == 'r') {
		char tmp[32];
		unsigned rows, cols;
		char extra;
		memcpy(tmp, p + 1, n - 1);
		tmp[n - 1] = '\0';
		if (sscanf(tmp, "%u %u%c", &rows, &cols, &extra) == 2 && rows && cols && rows <= 1000 &&
		    cols <= 1000) {
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
	ws_close(r, LWS_CLOSE_STATUS_UNACCEPTABLE_OPCODE, true, "bad message");
}

static void client_gone(struct lws *wsi)
{
	struct pss *pss = lws_wsi_user(wsi);
	if (!pss || !pss->r)
		return;
	struct areq *r = pss->r;
	pss->r = NULL;
	r->wsi = NULL;
	mgr_send_close(r);
	areq_free(r);
}

static int cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len)
{
	struct pss *pss = user;
	struct areq *r = pss ? pss->r : NULL;

	switch (reason) {
	case LWS_CALLBACK_RAW_RX_FILE:
		mgr_readable();
		if (A.quit)
			lws_cancel_service(A.ctx);
		return 0;
	case LWS_CALLBACK_RAW_WRITEABLE_FILE:
		mgr_writable();
		return 0;
	case LWS_CALLBACK_RAW_CLOSE_FILE:
		A.mgr_wsi = NULL;
		A.quit = 1;
		lws_cancel_service(A.ctx);
		return 0;

	case LWS_CALLBACK_HTTP: {
		if (!pss)
			return -1;
		if (r)
			client_gone(wsi); /* keep-alive: a new transaction */
		r = areq_new(wsi);
		if (!r)
			return -1;
		pss->r = r;
		char path[1024];
		if (len >= sizeof path) {
			http_error(r, 414, "SPACED_ETOOBIG", "path too long");
			return 0;
		}
		memcpy(path, in, len);
		path[len] = '\0';
		intake(r, wsi, path, false);
		if (r->final_ready)
			return 0;
		if (r->req.body == NODE_BODY_EXEC) {
			/* read the JSON body first */
			return 0;
		}
		send_req_with_auth(r, wsi);
		return 0;
	}
	case LWS_CALLBACK_HTTP_BODY:
		if (!r)
			return -1;
		if (len == 0 || r->final_ready || r->ended)
			return 0; /* refused or failed already: the rest of the body is dropped */
		if (r->req.body == NODE_BODY_EXEC) {
			if (spaced_buf_append(&r->body, in, len) < 0) {
				r->ended = true;
				http_error(r, 413, "SPACED_ETOOBIG", "exec body too large");
			}
			return 0;
		}
		if (r->req.body == NODE_BODY_STREAM) {
			mgr_send_in_chunks(r, SPACED_GUEST_IN_DATA, in, len, false);
			return 0;
		}
		r->ended = true;
		http_error(r, 400, "SPACED_EINVAL", "this endpoint takes no body");
		return 0;
	case LWS_CALLBACK_HTTP_BODY_COMPLETION:
		if (!r)
			return -1;
		if (r->final_ready || r->ended)
			return 0;
		if (r->req.body == NODE_BODY_EXEC)
			exec_body_done(r);
		else if (r->req.body == NODE_BODY_STREAM)
			mgr_send_in(r, SPACED_GUEST_IN_DATA, NULL, 0, true);
		return 0;
	case LWS_CALLBACK_HTTP_WRITEABLE:
		if (!r)
			return 0;
		return http_writable(r, wsi);
	case LWS_CALLBACK_CLOSED_HTTP:
	case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
		client_gone(wsi);
		return 0;

	case LWS_CALLBACK_ESTABLISHED: {
		if (!pss)
			return -1;
		r = areq_new(wsi);
		if (!r)
			return -1;
		r->is_ws = true;
		pss->r = r;
		char path[1024];
		int n = lws_hdr_copy(wsi, path, sizeof path, WSI_TOKEN_GET_URI);
		if (n <= 0) {
			ws_close(r, 4400, false, "bad request");
			return 0;
		}
		intake(r, wsi, path, true);
		if (!r->close_pending)
			send_req_with_auth(r, wsi);
		return 0;
	}
	case LWS_CALLBACK_RECEIVE:
		if (!r)
			return -1;
		if (lws_is_first_fragment(wsi))
			r->wrx.len = 0;
		if (spaced_buf_append(&r->wrx, in, len) < 0) {
			mgr_send_close(r);
			ws_close(r, LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE, true, "message too big");
			return 0;
		}
		if (lws_is_final_fragment(wsi) && !lws_remaining_packet_payload(wsi)) {
			ws_message(r, r->wrx.data, r->wrx.len);
			r->wrx.len = 0;
		}
		return 0;
	case LWS_CALLBACK_SERVER_WRITEABLE:
		if (!r)
			return -1;
		return ws_writable(r, wsi);
	case LWS_CALLBACK_CLOSED:
		client_gone(wsi);
		return 0;
	default:
		break;
	}
	return lws_callback_http_dummy(wsi, reason, user, in, len);
}

static const struct lws_protocols protocols[] = {
	{"spaced", cb, sizeof(struct pss), WS_MSG_MAX, 0, NULL, 0},
	{NULL, NULL, 0, 0, 0, NULL, 0},
};

int node_api_run(const struct node_api_config *cfg)
{
	struct lws_context_creation_info info;
	int rc = 1;

	signal(SIGPIPE, SIG_IGN);
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_term;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	lws_set_log_level(LLL_ERR, NULL);

	A.mgr_fd = cfg->mgr_fd;
	fcntl(A.mgr_fd, F_SETFL, fcntl(A.mgr_fd, F_GETFL) | O_NONBLOCK);
	spaced_buf_init(&A.mgr_out, 256u << 20);
	spaced_buf_init(&A.mgr_in, 4 * NODE_MSG_MAX);

	memset(&info, 0, sizeof info);
	info.port = cfg->listen_port;
	info.iface = cfg->listen_host;
	info.protocols = protocols;
	info.max_http_header_data = 8192;
	info.max_http_header_pool = 256;
	info.timeout_secs = 30;
	info.pt_serv_buf_size = 64 * 1024;
	info.fd_limit_per_thread = 4096;
	info.options = LWS_SERVER_OPTION_DISABLE_IPV6 | LWS_SERVER_OPTION_VALIDATE_UTF8;
	A.ctx = lws_create_context(&info);
	if (!A.ctx) {
		fprintf(stderr, "node-api: cannot listen on %s:%d\n", cfg->listen_host, cfg->listen_port);
		return 1;
	}
	struct lws_vhost *vh = lws_get_vhost_by_name(A.ctx, "default");
	lws_sock_file_fd_type fd;
	fd.filefd = A.mgr_fd;
	A.mgr_wsi = vh ? lws_adopt_descriptor_vhost(vh, LWS_ADOPT_RAW_FILE_DESC, fd, "spaced", NULL) : NULL;
	if (!A.mgr_wsi) {
		fprintf(stderr, "node-api: cannot adopt the manager socket\n");
		goto out;
	}
	int port = vh ? lws_get_vhost_listen_port(vh) : -1;
	if (cfg->port_file) {
		char tmp[4200];
		snprintf(tmp, sizeof tmp, "%s.tmp", cfg->port_file);
		FILE *f = fopen(tmp, "w");
		if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0 || rename(tmp, cfg->port_file) < 0) {
			fprintf(stderr, "node-api: cannot write %s\n", cfg->port_file);
			goto out;
		}
	}
	/* From here on: no privileges, no new files, no new connections. */
	int e = node_api_confine(cfg->drop_privileges);
	if (e < 0) {
		fprintf(stderr, "node-api: cannot confine itself: %s\n", spaced_strerror(e));
		goto out;
	}
	while (!A.quit) {
		if (A.mgr_wsi && A.mgr_out_off < A.mgr_out.len)
			lws_callback_on_writable(A.mgr_wsi);
		if (lws_service(A.ctx, 0) < 0)
			break;
	}
	rc = 0;
out:
	lws_context_destroy(A.ctx);
	A.ctx = NULL;
	for (size_t i = 0; i < API_BUCKETS; i++)
		while (A.bucket[i])
			areq_free(A.bucket[i]);
	spaced_buf_free(&A.mgr_out);
	spaced_buf_free(&A.mgr_in);
	return rc;
}
