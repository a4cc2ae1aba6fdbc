/* httpsrv.c — HTTP/1.1 and WebSocket server on libuv (httpsrv.h). */
#include "httpsrv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <linux/sockios.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "spaced_error.h"
#include "ratelimit.h"
#include "tls.h"
#include "util.h"
#include "ws.h"

/* TLS: ciphertext read per libuv read, and the most of it left waiting in a
 * connection's read BIO before reading the socket stops */
#define TLS_READ_BUF 65536
#define TLS_RBIO_MAX 65536
/* What the application writes within one turn of the loop is gathered (up
 * to one TLS record's worth) and written, sealed over TLS, at the end of that
 * turn: one write for a response's head and body, not one per piece */
#define STAGE_MAX 16384
/* TLS output: the records sealed in one go gather in a write request made
 * to their size before they are sealed (a record's worth at least: what a
 * record adds to its plaintext is TLS_RECORD_EXTRA at most); one that was
 * all written is kept for the next go up to TLS_OUT_KEEP (under the 128 KiB
 * from which node-api's allocator maps each buffer on its own: a 64 KiB
 * frame's records, 65.7 KiB, reuse one buffer) */
#define TLS_RECORD_EXTRA 64
#define TLS_OUT_MIN (16384 + 2 * TLS_RECORD_EXTRA)
#define TLS_OUT_KEEP (112u << 10)
#define PEER_CERT_MAX 128

enum cstate {
	C_HEAD = 1, /* reading a request head */
	C_BODY,     /* reading its body */
	C_WAIT,     /* the request is read; its answer goes on */
	C_WS,       /* a WebSocket */
	C_CLOSING,  /* output drains, then close */
	C_CLOSED,
};

struct wreq {
	uv_write_t w;
	struct spaced_httpconn *c;
	size_t len; /* the bytes to write: data[off..off + len) */
	size_t off;
	size_t cap; /* data's size (tls_out: how much it can gather) */
	uint8_t data[];
};

struct ip_count {
	struct ip_count *next;
	char addr[64];
	unsigned n;
};

struct spaced_httpconn {
	struct spaced_httpconn *next, *prev;
	struct spaced_httpsrv *srv;
	uv_tcp_t tcp;
	enum cstate state;
	void *user;
	char peer[64];
	char who[SPACED_CALLER_KEY_MAX]; /* its per-address budget's key (spaced_caller_key: an IPv6 /64) */
	struct spaced_buf rbuf;
	size_t rbuf_hw;        /* how much of rbuf was ever written: what its wipe covers */
	bool reading, read_wanted, peer_eof;
	/* the current request */
	struct spaced_http_req req;
	bool have_req;
	struct spaced_http_body body;
	uint64_t body_max;
	bool responded, chunked, answer_ended, body_read, must_close;
	bool head_started;    /* a byte of the next head has come */
	uint64_t deadline_ns; /* idle / head / body progress must come before; 0: none */
	/* output */
	size_t queued;
	size_t *account; /* counts queued too (spaced_httpconn_set_account) */
	bool drain_armed;
	bool head_held;        /* a request sent ahead waits: earlier answers are not written yet */
	uint64_t wprogress_ns; /* output last moved (queued, written, the socket took some) */
	size_t wq_seen;        /* the socket's unwritten bytes at the last tick */
	uint64_t written, written_seen; /* bytes the socket took at once, in all and at the last tick */
	/* WebSocket */
	struct spaced_buf msg;  /* a message being assembled */
	uint8_t msg_opcode;     /* 0: none in progress */
	bool close_sent;
	bool in_callback;
	bool free_pending;
	bool stop_counted;     /* closed by the server's stop: its close callback counts down to the free */
	/* TLS (cfg.tls): OpenSSL over a memory BIO in and tls_out's BIO out,
	 * driven from the loop */
	SSL *ssl;              /* NULL: plaintext */
	BIO *rbio;             /* ciphertext in; owned by ssl */
	struct wreq *tls_out;  /* ciphertext out, sealed and not yet written (tls_flush) */
	bool tls_ready;        /* the handshake is done */
	bool tls_seen;         /* a first byte came (it tells TLS from plaintext) */
	bool tls_plain;        /* the refusal of a plaintext request goes out unencrypted */
	bool tls_stalled;      /* plaintext may wait in ssl for room in rbuf */
	bool tls_peer_closed;  /* close_notify or a TLS error: closed once what came is processed */
	struct spaced_buf stage; /* output written this turn: sealed (TLS) or written at its end */
	unsigned idle_ticks;     /* ticks it has been idle in a row (conn_release_idle) */
	struct spaced_httpconn *dirty_next; /* on the server's list of staged connections */
	bool dirty;
	char peer_cert[PEER_CERT_MAX]; /* CN of the verified client certificate, "" none */
};

struct spaced_httpsrv {
	uv_loop_t *loop;
	struct spaced_httpsrv_config cfg;
	uv_tcp_t listen;
	uv_timer_t tick;
	int port;
	struct spaced_httpconn *conns;
	unsigned nconns;
	size_t queued; /* every connection's queued output */
	struct ip_count *ips;
	bool stopping;
	unsigned closing_handles;
	struct spaced_httpsrv_stats stats;
	uv_timer_t tls_kick;   /* TLS: pulls plaintext left waiting in connections (tls_stalled) */
	bool tls_kick_armed;
	/* connections with staged output, written (sealed over TLS) in the
	 * check phase of the turn that staged it; the idle handle keeps that
	 * turn from waiting in poll meanwhile */
	struct spaced_httpconn *dirty;
	uv_check_t seal_check;
	uv_idle_t seal_idle;
	uint8_t tls_in[TLS_READ_BUF]; /* TLS: every read of the loop lands here, then in a read BIO */
};

static void conn_close(struct spaced_httpconn *c);
static void conn_process(struct spaced_httpconn *c);
static void conn_update_read(struct spaced_httpconn *c);
static void on_written(uv_write_t *w, int status);
static void srv_free(struct spaced_httpsrv *s);
static void tls_kick(struct spaced_httpsrv *s);

void spaced_httpsrv_defaults(struct spaced_httpsrv_config *cfg)
{
	memset(cfg, 0, sizeof *cfg);
	cfg->host = "127.0.0.1";
	cfg->listen_fd = -1;
	cfg->limits.head_max = 16384;
	cfg->limits.target_max = 8192;
	cfg->limits.fields_max = 100;
	cfg->body_max = 1u << 20;
	cfg->max_conns = 4096;
	cfg->max_conns_per_ip = 256;
	cfg->head_timeout_ms = 10000;
	cfg->idle_timeout_ms = 30000;
	cfg->body_timeout_ms = 30000;
	cfg->send_timeout_ms = 30000;
	cfg->body_min_rate = 1024;
	cfg->ws_message_max = 1u << 20;
	cfg->low_water = 65536;
}

/* ---- per-address budget ---- */

static struct ip_count *ip_find(struct spaced_httpsrv *s, const char *addr, bool create)
{
	for (struct ip_count *i = s->ips; i; i = i->next)
		if (strcmp(i->addr, addr) == 0)
			return i;
	if (!create)
		return NULL;
	struct ip_count *i = calloc(1, sizeof *i);
	if (!i)
		return NULL;
	snprintf(i->addr, sizeof i->addr, "%s", addr);
	i->next = s->ips;
	s->ips = i;
	return i;
}

static void ip_release(struct spaced_httpsrv *s, const char *addr)
{
	for (struct ip_count **pp = &s->ips; *pp; pp = &(*pp)->next) {
		if (strcmp((*pp)->addr, addr) == 0) {
			if (--(*pp)->n == 0) {
				struct ip_count *i = *pp;
				*pp = i->next;
				free(i);
			}
			return;
		}
	}
}

/* used bytes of a body came: its deadline moves 1/min_rate s per byte (at
 * any rate, body_timeout from now), never past body_timeout from now. */
static void body_progress(struct spaced_httpconn *c, size_t used)
{
	const struct spaced_httpsrv_config *cfg = &c->srv->cfg;
	uint64_t cap = spaced_mono_ns() + (uint64_t)cfg->body_timeout_ms * 1000000u;
	if (cfg->body_min_rate == 0) {
		c->deadline_ns = cap;
		return;
	}
	uint64_t more = (uint64_t)used * 1000000000u / cfg->body_min_rate;
	c->deadline_ns = c->deadline_ns + more < cap ? c->deadline_ns + more : cap;
}

/* ---- output ---- */

/* A request sent ahead and held (head_held) is taken once the answers a
 * pipelining client had not read are out. */
static void held_check(struct spaced_httpconn *c)
{
	if (c->head_held && c->state == C_HEAD && c->queued + c->stage.len <= c->srv->cfg.low_water) {
		c->head_held = false;
		c->deadline_ns = spaced_mono_ns() + (uint64_t)c->srv->cfg.idle_timeout_ms * 1000000u;
		conn_update_read(c);
		conn_process(c);
	}
}

/* Tells a producer that stopped at low_water (drain_armed) that what waits
 * — written, and staged — fell back to it. */
static void drain_check(struct spaced_httpconn *c)
{
	if (c->drain_armed && c->queued + c->stage.len <= c->srv->cfg.low_water) {
		c->drain_armed = false;
		if (c->srv->cfg.ops->on_drain)
			c->srv->cfg.ops->on_drain(c);
	}
}

static void on_written(uv_write_t *w, int status)
{
	struct wreq *r = (struct wreq *)w;
	struct spaced_httpconn *c = r->c;
	c->queued -= r->len;
	c->srv->queued -= r->len;
	if (c->account)
		*c->account -= r->len;
	c->wprogress_ns = spaced_mono_ns();
	free(r);
	if (c->state == C_CLOSED)
		return;
	if (status < 0) {
		conn_close(c);
		return;
	}
	if (c->state == C_CLOSING && c->queued == 0) {
		conn_close(c);
		return;
	}
	drain_check(c);
	held_check(c);
}

/* Counts n more bytes handed to the socket's write queue. */
static void queued_add(struct spaced_httpconn *c, size_t n)
{
	if (c->queued == 0) {
		c->wprogress_ns = spaced_mono_ns();
		c->wq_seen = SIZE_MAX; /* no measure yet: the first tick counts as progress */
	}
	c->queued += n;
	c->srv->queued += n;
	if (c->account)
		*c->account += n;
	if (c->queued > c->srv->cfg.low_water)
		c->drain_armed = true;
}

struct part {
	const void *p;
	size_t n;
};

#define OUT_PARTS_MAX 9

/* Writes what the socket takes of parts[0..n) at once (one system call),
 * when nothing of c waits before them; the bytes written, 0 for none. A
 * write done here needs no request, no copy and no callback. */
static size_t try_write_now(struct spaced_httpconn *c, const struct part *parts, int n)
{
	uv_buf_t bufs[OUT_PARTS_MAX];
	if (c->queued != 0 || n > OUT_PARTS_MAX)
		return 0;
	for (int i = 0; i < n; i++)
		bufs[i] = uv_buf_init((char *)(uintptr_t)parts[i].p, (unsigned)parts[i].n);
	int w = uv_try_write((uv_stream_t *)&c->tcp, bufs, (unsigned)n);
	if (w > 0)
		c->written += (uint64_t)w;
	return w > 0 ? (size_t)w : 0; /* an error shows in the queued write's callback */
}

/* Queues r (its data[0..len) filled) as one write. */
static int queue_wreq(struct spaced_httpconn *c, struct wreq *r)
{
	r->c = c;
	uv_buf_t buf = uv_buf_init((char *)r->data + r->off, (unsigned)r->len);
	if (uv_write(&r->w, (uv_stream_t *)&c->tcp, &buf, 1, on_written) < 0) {
		free(r);
		return SPACED_ECLOSED;
	}
	queued_add(c, r->len);
	return 0;
}

/* Writes parts[0..n) as one write to the socket: at once when it takes
 * them (one system call), what it does not take copied once and queued. */
static int outv_raw(struct spaced_httpconn *c, const struct part *parts, int n)
{
	if (c->state == C_CLOSED || c->state == C_CLOSING)
		return SPACED_ECLOSED;
	size_t total = 0;
	for (int i = 0; i < n; i++)
		total += parts[i].n;
	size_t skip = try_write_now(c, parts, n);
	if (skip == total)
		return 0;
	struct wreq *r = malloc(sizeof *r + total - skip);
	if (!r)
		return SPACED_ENOMEM;
	r->len = r->cap = total - skip;
	r->off = 0;
	size_t off = 0;
	for (int i = 0; i < n; i++) {
		size_t drop = skip < parts[i].n ? skip : parts[i].n;
		skip -= drop;
		if (parts[i].n > drop)
			memcpy(r->data + off, (const uint8_t *)parts[i].p + drop, parts[i].n - drop);
		off += parts[i].n - drop;
	}
	return queue_wreq(c, r);
}

/* ---- TLS output ----
 * OpenSSL writes each record it seals to the connection's BIO, which
 * gathers them in c->tls_out; tls_flush then writes them to the socket in
 * one system call and queues, as they are, the bytes it did not take. One
 * copy of the ciphertext (from OpenSSL's record buffer), where a memory BIO
 * took two and a request allocated per flush. */

/* Room in c->tls_out for n more bytes (grown to what is there and n, a
 * record's worth at least); 0, or SPACED_ENOMEM. */
static int tls_out_reserve(struct spaced_httpconn *c, size_t n)
{
	struct wreq *r = c->tls_out;
	size_t have = r ? r->len : 0;
	if (r && r->cap - have >= n)
		return 0;
	if (n > SIZE_MAX / 2 - have - sizeof *r)
		return SPACED_ENOMEM;
	size_t cap = have + n < TLS_OUT_MIN ? TLS_OUT_MIN : have + n;
	struct wreq *grown = realloc(r, sizeof *grown + cap);
	if (!grown)
		return SPACED_ENOMEM;
	grown->len = have;
	grown->off = 0;
	grown->cap = cap;
	c->tls_out = grown;
	return 0;
}

static int tls_out_write(BIO *b, const char *p, size_t n, size_t *written)
{
	struct spaced_httpconn *c = BIO_get_data(b);
	if (tls_out_reserve(c, n) < 0)
		return 0; /* SSL_write fails: the connection is closed */
	struct wreq *r = c->tls_out;
	memcpy(r->data + r->len, p, n);
	r->len += n;
	*written = n;
	return 1;
}

static long tls_out_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	(void)b;
	(void)num;
	(void)ptr;
	return cmd == BIO_CTRL_FLUSH; /* nothing waits in the BIO itself */
}

static BIO_METHOD *tls_out_method;
static pthread_once_t tls_out_once = PTHREAD_ONCE_INIT;

static void tls_out_method_make(void)
{
	BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "spaced httpconn output");
	if (m && (BIO_meth_set_write_ex(m, tls_out_write) != 1 || BIO_meth_set_ctrl(m, tls_out_ctrl) != 1)) {
		BIO_meth_free(m);
		m = NULL;
	}
	tls_out_method = m;
}

/* A BIO for c's TLS output (tls_out); NULL when out of memory. */
static BIO *tls_out_bio(struct spaced_httpconn *c)
{
	pthread_once(&tls_out_once, tls_out_method_make);
	BIO *b = tls_out_method ? BIO_new(tls_out_method) : NULL;
	if (b) {
		BIO_set_data(b, c);
		BIO_set_init(b, 1);
	}
	return b;
}

/* Writes what TLS has produced (records, alerts) to the socket. */
static int tls_flush(struct spaced_httpconn *c)
{
	struct wreq *r = c->tls_out;
	if (!r || r->len == 0)
		return 0;
	if (c->state == C_CLOSED || c->state == C_CLOSING)
		return SPACED_ECLOSED;
	size_t n = r->len;
	size_t now = try_write_now(c, &(struct part){r->data, n}, 1);
	if (now == n) {
		r->len = 0; /* kept for the next records, unless it grew large */
		if (r->cap > TLS_OUT_KEEP) {
			free(r);
			c->tls_out = NULL;
		}
		return 0;
	}
	/* the rest is written from where it is; one that fills less than half
	 * its buffer is moved into one its size first: what waits for a slow
	 * reader holds no more memory than twice what its queue counts */
	c->tls_out = NULL;
	r->off = now;
	r->len = n - now;
	if (r->len <= r->cap / 2) {
		memmove(r->data, r->data + now, r->len);
		struct wreq *fit = realloc(r, sizeof *r + r->len);
		if (fit)
			r = fit;
		r->off = 0;
		r->cap = r->len;
	}
	return queue_wreq(c, r);
}

/* Seals p[0..n) into records gathered in tls_out (made room for first:
 * one allocation, not one per doubling). */
static int tls_put(struct spaced_httpconn *c, const void *p, size_t n)
{
	if (n > 0 && tls_out_reserve(c, n + (n / 16384 + 1) * TLS_RECORD_EXTRA) < 0)
		return SPACED_ENOMEM;
	while (n > 0) {
		int k = n > INT_MAX ? INT_MAX : (int)n;
		ERR_clear_error();
		int w = SSL_write(c->ssl, p, k);
		if (w <= 0) {
			ERR_clear_error();
			return SPACED_EPROTO;
		}
		p = (const uint8_t *)p + w;
		n -= (size_t)w;
	}
	return 0;
}

/* Writes what c has staged: in one system call, sealed into records over
 * TLS. */
static int stage_flush(struct spaced_httpconn *c)
{
	int e = 0;
	if (!c->ssl || c->tls_plain) {
		struct part whole = {c->stage.data, c->stage.len};
		e = c->stage.len ? outv_raw(c, &whole, 1) : 0;
		c->stage.len = 0;
		return e;
	}
	if (c->stage.len) {
		e = tls_put(c, c->stage.data, c->stage.len);
		c->stage.len = 0;
	}
	if (e == 0)
		e = tls_flush(c);
	return e < 0 ? SPACED_ECLOSED : 0;
}

static void on_seal_check(uv_check_t *h);
static void on_seal_idle(uv_idle_t *h)
{
	(void)h; /* its being active is its purpose: poll does not wait */
}

/* Puts c on its server's list of connections to seal this turn. */
static void stage_mark_dirty(struct spaced_httpconn *c)
{
	struct spaced_httpsrv *s = c->srv;
	if (c->dirty)
		return;
	c->dirty = true;
	c->dirty_next = s->dirty;
	if (!s->dirty) {
		uv_check_start(&s->seal_check, on_seal_check);
		uv_idle_start(&s->seal_idle, on_seal_idle);
	}
	s->dirty = c;
}

/* The end of a turn's I/O: every staged connection is sealed, and one
 * whose last output went at once is closed. Connections closed meanwhile
 * are still allocated (freed in the closing phase, after this one) and
 * skipped. */
static void on_seal_check(uv_check_t *h)
{
	struct spaced_httpsrv *s = h->data;
	struct spaced_httpconn *c = s->dirty;
	s->dirty = NULL;
	uv_check_stop(&s->seal_check);
	uv_idle_stop(&s->seal_idle);
	while (c) {
		struct spaced_httpconn *next = c->dirty_next;
		c->dirty = false;
		c->dirty_next = NULL;
		if (c->state == C_CLOSING && c->queued == 0) {
			conn_close(c);
		} else if (c->state != C_CLOSED && c->state != C_CLOSING) {
			stage_flush(c);
			/* all of it went at once: no write's callback will tell the producer */
			if (c->state != C_CLOSED)
				drain_check(c);
			if (c->state != C_CLOSED)
				held_check(c);
		}
		c = next;
	}
}

/* Plaintext: parts[0..n) staged, written with the rest of the turn's
 * output at its end (an answer's head, body and end in one system call);
 * past a stage's worth, what is staged and the parts in one write now. */
static int outv_plain(struct spaced_httpconn *c, const struct part *parts, int n)
{
	size_t total = 0;
	for (int i = 0; i < n; i++)
		total += parts[i].n;
	if (c->stage.len + total > STAGE_MAX) {
		struct part all[OUT_PARTS_MAX];
		if (n + 1 > OUT_PARTS_MAX)
			return SPACED_EINVAL;
		all[0] = (struct part){c->stage.data, c->stage.len};
		memcpy(all + 1, parts, (size_t)n * sizeof *parts);
		int e = outv_raw(c, all, n + 1);
		c->stage.len = 0;
		return e;
	}
	for (int i = 0; i < n; i++)
		if (parts[i].n && spaced_buf_append(&c->stage, parts[i].p, parts[i].n) < 0)
			return SPACED_ENOMEM;
	return 0;
}

/* Queues parts[0..n) as one write, staged for the end of this turn of the
 * loop: sealed through TLS once its handshake is done (sooner when a
 * record's worth is there), unencrypted on a plaintext connection; the one
 * refusal of a plaintext request on a TLS port goes at once. */
static int outv(struct spaced_httpconn *c, const struct part *parts, int n)
{
	if (c->tls_plain)
		return outv_raw(c, parts, n);
	if (c->state == C_CLOSED || c->state == C_CLOSING)
		return SPACED_ECLOSED;
	if (c->ssl && !c->tls_ready)
		return SPACED_EPROTO; /* nothing of the application before the handshake */
	bool sealed = false;
	if (!c->ssl) {
		int e = outv_plain(c, parts, n);
		if (e < 0)
			return e;
		n = 0;
	}
	for (int i = 0; i < n; i++) {
		const uint8_t *p = parts[i].p;
		size_t len = parts[i].n;
		if (len == 0)
			continue;
		if (c->stage.len + len > STAGE_MAX) {
			/* a record's worth: the stage topped up and sealed, whole
			 * records of the rest sealed at once, the remainder staged */
			size_t fill = STAGE_MAX - c->stage.len;
			if (spaced_buf_append(&c->stage, p, fill) < 0)
				return SPACED_ENOMEM;
			p += fill;
			len -= fill;
			int e = tls_put(c, c->stage.data, c->stage.len);
			c->stage.len = 0;
			size_t whole = len - len % STAGE_MAX;
			if (e < 0 || (whole && tls_put(c, p, whole) < 0))
				return SPACED_ECLOSED;
			p += whole;
			len -= whole;
			sealed = true;
		}
		if (len && spaced_buf_append(&c->stage, p, len) < 0)
			return SPACED_ENOMEM;
	}
	if (sealed && tls_flush(c) < 0)
		return SPACED_ECLOSED;
	/* a producer that stops at low_water (spaced_httpconn_queued counts the
	 * stage) hears on_drain once what waits falls back to it */
	if (c->queued + c->stage.len > c->srv->cfg.low_water)
		c->drain_armed = true;
	if (c->stage.len)
		stage_mark_dirty(c);
	return 0;
}

static int out2(struct spaced_httpconn *c, const void *a, size_t an, const void *b, size_t bn)
{
	struct part parts[2] = {{a, an}, {b, bn}};
	return outv(c, parts, 2);
}

static int out(struct spaced_httpconn *c, const void *p, size_t n)
{
	return out2(c, p, n, NULL, 0);
}

/* Closes once what is queued is written. */
static void close_after_output(struct spaced_httpconn *c)
{
	if (c->state == C_CLOSED || c->state == C_CLOSING)
		return;
	if (!c->ssl) {
		stage_flush(c);
	} else if (c->tls_ready && !c->tls_peer_closed) {
		/* what is staged, then close_notify: the client can tell the end from a cut */
		stage_flush(c);
		ERR_clear_error();
		SSL_shutdown(c->ssl);
		ERR_clear_error();
		tls_flush(c);
	}
	c->state = C_CLOSING;
	uv_read_stop((uv_stream_t *)&c->tcp);
	c->reading = false;
	/* all of it written at once: closed at the end of this turn, never
	 * inside the application's call (its on_close would run under it) */
	if (c->queued == 0)
		stage_mark_dirty(c);
}

/* A refusal the server gives itself: the status, a short JSON body, close. */
static void refuse(struct spaced_httpconn *c, int status, const char *code)
{
	char body[256], head[512];
	int bl;
	if (c->srv->cfg.refusal_body) {
		size_t l = c->srv->cfg.refusal_body(status, code, body, sizeof body);
		bl = (int)(l < sizeof body ? l : sizeof body);
	} else {
		bl = snprintf(body, sizeof body, "{\"error\":\"%s\",\"code\":\"%s\"}\n", spaced_http_reason(status), code);
	}
	int hl = snprintf(head, sizeof head,
	                  "HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
	                  "connection: close\r\ncache-control: no-store\r\n\r\n",
	                  status, spaced_http_reason(status), bl);
	c->srv->stats.refused_parse += status != 408;
	c->srv->stats.timed_out += status == 408;
	c->responded = true;
	out2(c, head, (size_t)hl, body, (size_t)bl);
	close_after_output(c);
}

/* ---- closing ---- */

/* Frees the server once its handles and connections are closed. */
static void srv_free(struct spaced_httpsrv *s)
{
	struct ip_count *i = s->ips;
	while (i) {
		struct ip_count *n = i->next;
		free(i);
		i = n;
	}
	SSL_CTX_free(s->cfg.tls);
	free(s);
}

static void on_conn_closed(uv_handle_t *h)
{
	struct spaced_httpconn *c = h->data;
	struct spaced_httpsrv *s = c->srv;
	/* wiped where bytes came, not the whole reservation (its untouched
	 * pages would be faulted in only to be zeroed) */
	if (c->rbuf.data)
		spaced_wipe(c->rbuf.data, c->rbuf_hw < c->rbuf.cap ? c->rbuf_hw : c->rbuf.cap);
	free(c->rbuf.data);
	spaced_buf_free(&c->msg);
	spaced_http_req_clear(&c->req);
	SSL_free(c->ssl);
	free(c->tls_out);
	spaced_buf_free(&c->stage);
	/* only a connection closed once the stop began is counted in
	 * closing_handles (one closed just before has its callback run first) */
	bool counted = c->stop_counted;
	free(c);
	if (counted && --s->closing_handles == 0)
		srv_free(s);
}

static void conn_close(struct spaced_httpconn *c)
{
	if (c->state == C_CLOSED)
		return;
	struct spaced_httpsrv *s = c->srv;
	c->state = C_CLOSED;
	/* off the server's list of staged connections, which the next check
	 * phase goes through after this one is freed (one on the list being
	 * gone through now is skipped there, and freed after it) */
	for (struct spaced_httpconn **pp = &s->dirty; c->dirty && *pp; pp = &(*pp)->dirty_next)
		if (*pp == c) {
			*pp = c->dirty_next;
			c->dirty = false;
			c->dirty_next = NULL;
			break;
		}
	if (c->prev)
		c->prev->next = c->next;
	else
		s->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	s->nconns--;
	ip_release(s, c->who);
	if (s->cfg.ops->on_close)
		s->cfg.ops->on_close(c);
	spaced_httpconn_set_account(c, NULL); /* what it still queues counts in no account */
	if (s->stopping) {
		c->stop_counted = true;
		s->closing_handles++;
	}
	uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

/* ---- answers ---- */

int spaced_httpconn_respond(struct spaced_httpconn *c, int status, const char *content_type, int64_t length,
                            const char *headers)
{
	if (c->state == C_CLOSED || c->state == C_CLOSING || c->responded || !c->have_req)
		return SPACED_EINVAL;
	char head[1024];
	/* an answer before the whole body was read closes the connection: the
	 * rest of the body is never taken for a next request */
	bool close = !c->req.keep_alive || c->must_close || (c->state == C_BODY);
	c->chunked = length < 0;
	int n = snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\n", status, spaced_http_reason(status));
	if (content_type)
		n += snprintf(head + n, sizeof head - (size_t)n, "content-type: %s\r\n", content_type);
	if (c->chunked)
		n += snprintf(head + n, sizeof head - (size_t)n, "transfer-encoding: chunked\r\n");
	else
		n += snprintf(head + n, sizeof head - (size_t)n, "content-length: %lld\r\n", (long long)length);
	if (close)
		n += snprintf(head + n, sizeof head - (size_t)n, "connection: close\r\n");
	if (n < 0 || (size_t)n >= sizeof head - 4)
		return SPACED_ETOOBIG;
	c->must_close = close;
	c->responded = true;
	return out2(c, head, (size_t)n, headers ? headers : "", headers ? strlen(headers) : 0) < 0 ? SPACED_ECLOSED
	                                                                                        : out(c, "\r\n", 2);
}

int spaced_httpconn_write(struct spaced_httpconn *c, const void *p, size_t n)
{
	if (!c->responded || c->answer_ended)
		return SPACED_EINVAL;
	if (n == 0)
		return 0;
	if (!c->chunked)
		return out(c, p, n);
	char h[24];
	int hl = snprintf(h, sizeof h, "%zx\r\n", n);
	struct part parts[3] = {{h, (size_t)hl}, {p, n}, {"\r\n", 2}};
	return outv(c, parts, 3);
}

static void next_request(struct spaced_httpconn *c)
{
	spaced_http_req_clear(&c->req);
	c->have_req = false;
	c->responded = c->chunked = c->answer_ended = c->body_read = c->head_started = false;
	c->state = C_HEAD;
	c->deadline_ns = spaced_mono_ns() + (uint64_t)c->srv->cfg.idle_timeout_ms * 1000000u;
	conn_update_read(c);
	conn_process(c); /* a request sent ahead */
}

int spaced_httpconn_end(struct spaced_httpconn *c)
{
	if (!c->responded || c->answer_ended)
		return SPACED_EINVAL;
	if (c->chunked && out(c, "0\r\n\r\n", 5) < 0)
		return SPACED_ECLOSED;
	c->answer_ended = true;
	if (c->must_close || !c->body_read) {
		close_after_output(c);
		return 0;
	}
	if (!c->in_callback)
		next_request(c);
	return 0;
}

int spaced_httpconn_reply(struct spaced_httpconn *c, int status, const char *content_type, const void *body,
                          size_t len, const char *headers)
{
	int e = spaced_httpconn_respond(c, status, content_type, (int64_t)len, headers);
	if (e == 0 && len)
		e = spaced_httpconn_write(c, body, len);
	if (e == 0)
		e = spaced_httpconn_end(c);
	return e;
}

void spaced_httpconn_abort(struct spaced_httpconn *c)
{
	conn_close(c);
}

int spaced_httpconn_ws_accept(struct spaced_httpconn *c, const char *headers)
{
	char accept[29], head[512];
	if (c->state != C_WAIT || !c->have_req || !c->req.websocket || c->responded)
		return SPACED_EINVAL;
	if (spaced_ws_accept(c->req.ws_key, accept) < 0)
		return SPACED_ESYS;
	int n = snprintf(head, sizeof head,
	                 "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n"
	                 "sec-websocket-accept: %s\r\n",
	                 accept);
	c->responded = true;
	c->state = C_WS;
	c->deadline_ns = 0;
	c->srv->stats.ws_opened++;
	if (out2(c, head, (size_t)n, headers ? headers : "", headers ? strlen(headers) : 0) < 0 || out(c, "\r\n", 2) < 0)
		return SPACED_ECLOSED;
	conn_update_read(c);
	if (!c->in_callback)
		conn_process(c); /* frames sent right after the request */
	return 0;
}

int spaced_httpconn_ws_send(struct spaced_httpconn *c, uint8_t opcode, const void *p, size_t n)
{
	return spaced_httpconn_ws_send2(c, opcode, p, n, NULL, 0);
}

int spaced_httpconn_ws_send2(struct spaced_httpconn *c, uint8_t opcode, const void *p1, size_t n1, const void *p2,
                             size_t n2)
{
	uint8_t h[SPACED_WS_HDR_MAX];
	if (c->state != C_WS || c->close_sent)
		return SPACED_ECLOSED;
	size_t hl = spaced_ws_frame_header(h, true, opcode, n1 + n2);
	struct part parts[3] = {{h, hl}, {p1, n1}, {p2, n2}};
	return outv(c, parts, 3);
}

void spaced_httpconn_ws_close(struct spaced_httpconn *c, unsigned code, const char *reason)
{
	uint8_t payload[125], h[SPACED_WS_HDR_MAX];
	if (c->state != C_WS || c->close_sent) {
		if (c->state != C_WS)
			close_after_output(c);
		return;
	}
	size_t rl = reason ? strlen(reason) : 0;
	if (rl > 123)
		rl = 123;
	payload[0] = (uint8_t)(code >> 8);
	payload[1] = (uint8_t)code;
	if (rl)
		memcpy(payload + 2, reason, rl);
	size_t hl = spaced_ws_frame_header(h, true, SPACED_WS_CLOSE, rl + 2);
	out2(c, h, hl, payload, rl + 2);
	c->close_sent = true;
	close_after_output(c);
}

/* ---- reading ---- */

void spaced_httpconn_read(struct spaced_httpconn *c, bool on)
{
	c->read_wanted = on;
	conn_update_read(c);
}

size_t spaced_httpsrv_queued(const struct spaced_httpsrv *s)
{
	return s->queued;
}

void spaced_httpconn_set_account(struct spaced_httpconn *c, size_t *account)
{
	if (c->account)
		*c->account -= c->queued;
	c->account = account;
	if (account)
		*account += c->queued;
}

size_t *spaced_httpconn_account(const struct spaced_httpconn *c)
{
	return c->account;
}

size_t spaced_httpconn_queued(const struct spaced_httpconn *c)
{
	return c->queued + c->stage.len;
}

void spaced_httpconn_body_max(struct spaced_httpconn *c, uint64_t max)
{
	c->body_max = max;
	if (c->have_req && c->state == C_BODY)
		c->body.max = max;
}

/* After bytes came into rbuf: a NUL after them (for the parsers) and the
 * high-water mark moved. */
static void rbuf_mark(struct spaced_httpconn *c)
{
	if (c->rbuf.len < c->rbuf.cap)
		c->rbuf.data[c->rbuf.len] = 0;
	if (c->rbuf.len + 1 > c->rbuf_hw)
		c->rbuf_hw = c->rbuf.len + 1;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct spaced_httpconn *c = h->data;
	(void)suggested;
	if (c->ssl) {
		/* ciphertext: into the server's buffer, then the read BIO */
		buf->base = (char *)c->srv->tls_in;
		buf->len = sizeof c->srv->tls_in;
		return;
	}
	size_t room = c->rbuf.max - c->rbuf.len;
	if (room == 0 || spaced_buf_reserve(&c->rbuf, room < 65536 ? room : 65536) < 0) {
		/* the buffer is full: only a request over its limits gets here */
		buf->base = NULL;
		buf->len = 0;
		return;
	}
	buf->base = (char *)c->rbuf.data + c->rbuf.len;
	buf->len = c->rbuf.cap - c->rbuf.len;
}

static void tls_in(struct spaced_httpconn *c, const uint8_t *p, size_t n);

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
	struct spaced_httpconn *c = st->data;
	if (c->ssl && nread > 0) {
		tls_in(c, (const uint8_t *)buf->base, (size_t)nread);
		return;
	}
	if (nread == UV_ENOBUFS) {
		refuse(c, c->state == C_HEAD ? 431 : 413, "SPACED_ETOOBIG");
		return;
	}
	if (nread < 0) {
		c->peer_eof = true;
		conn_close(c); /* the client went away: its request is over */
		return;
	}
	if (nread == 0)
		return;
	c->rbuf.len += (size_t)nread;
	rbuf_mark(c);
	conn_process(c);
}

static void conn_update_read(struct spaced_httpconn *c)
{
	if (c->state == C_CLOSED || c->state == C_CLOSING)
		return;
	/* while an answer goes on, bytes sent ahead wait (one head's worth at most);
	 * so do they while earlier answers wait to be written (head_held) */
	bool want = c->read_wanted && !(c->state == C_WAIT && c->rbuf.len >= c->srv->cfg.limits.head_max) &&
	            !(c->head_held && c->rbuf.len >= c->srv->cfg.limits.head_max);
	if (c->ssl) {
		/* and ciphertext not yet decrypted stays bounded; plaintext left
		 * in ssl for want of room is pulled once there is room */
		if (c->tls_stalled && want && c->rbuf.len < c->rbuf.max)
			tls_kick(c->srv);
		want = want && BIO_ctrl_pending(c->rbio) < TLS_RBIO_MAX;
	}
	if (want && !c->reading) {
		if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
			c->reading = true;
	} else if (!want && c->reading) {
		uv_read_stop((uv_stream_t *)&c->tcp);
		c->reading = false;
	}
}

static void consume(struct spaced_httpconn *c, size_t n)
{
	memmove(c->rbuf.data, c->rbuf.data + n, c->rbuf.len - n);
	c->rbuf.len -= n;
}

/* One complete WebSocket frame at the start of rbuf; false to stop. */
static bool ws_frame(struct spaced_httpconn *c)
{
	struct spaced_ws_frame f;
	const struct spaced_httpsrv_ops *ops = c->srv->cfg.ops;
	int h = spaced_ws_frame_parse(c->rbuf.data, c->rbuf.len, true, c->srv->cfg.ws_message_max, &f);
	if (h == 0)
		return false;
	if (h < 0) {
		spaced_httpconn_ws_close(c, (unsigned)-h, h == -1009 ? "message too big" : "protocol error");
		return false;
	}
	if (c->rbuf.len - (size_t)h < f.len)
		return false; /* the rest of the payload is on its way */
	uint8_t *p = c->rbuf.data + h;
	spaced_ws_mask(p, (size_t)f.len, f.mask, 0);
	size_t total = (size_t)h + (size_t)f.len;
	switch (f.opcode) {
	case SPACED_WS_PING:
	case SPACED_WS_PONG:
		if (f.opcode == SPACED_WS_PING && !c->close_sent) {
			uint8_t hh[SPACED_WS_HDR_MAX];
			size_t hl = spaced_ws_frame_header(hh, true, SPACED_WS_PONG, f.len);
			out2(c, hh, hl, p, (size_t)f.len);
		}
		if (ops->on_ws_control) {
			ops->on_ws_control(c, f.opcode, p, (size_t)f.len);
			if (c->state != C_WS)
				return false;
		}
		break;
	case SPACED_WS_CLOSE: {
		unsigned code = 1000;
		if (f.len == 1 ||
		    (f.len >= 2 && (!spaced_ws_close_code_ok(code = (unsigned)(p[0] << 8 | p[1])) ||
		                    !spaced_utf8_valid(p + 2, (size_t)f.len - 2))))
			code = 1002;
		spaced_httpconn_ws_close(c, code, "");
		return false;
	}
	default: {
		bool start = f.opcode != SPACED_WS_CONT;
		if (start == (c->msg_opcode != 0)) {
			/* a continuation without a message, or a new message inside one */
			spaced_httpconn_ws_close(c, 1002, "protocol error");
			return false;
		}
		if (start)
			c->msg_opcode = f.opcode;
		if (spaced_buf_append(&c->msg, p, (size_t)f.len) < 0) {
			spaced_httpconn_ws_close(c, 1009, "message too big");
			return false;
		}
		if (f.fin) {
			bool text = c->msg_opcode == SPACED_WS_TEXT;
			c->msg_opcode = 0;
			if (text && !spaced_utf8_valid(c->msg.data, c->msg.len)) {
				spaced_httpconn_ws_close(c, 1007, "invalid UTF-8");
				return false;
			}
			consume(c, total);
			total = 0;
			size_t len = c->msg.len;
			c->msg.len = 0;
			if (ops->on_ws_message)
				ops->on_ws_message(c, text, c->msg.data, len);
		}
	}
	}
	if (total)
		consume(c, total);
	return c->state == C_WS;
}

static void conn_process(struct spaced_httpconn *c)
{
	struct spaced_httpsrv *s = c->srv;
	const struct spaced_httpsrv_ops *ops = s->cfg.ops;
	if (c->in_callback)
		return;
	c->in_callback = true;
	while (c->state != C_CLOSED && c->state != C_CLOSING) {
		if (c->state == C_HEAD) {
			if (c->rbuf.len == 0)
				break;
			/* a client that pipelines requests and reads no answer: the next
			 * is taken once what is queued for it is written (before, the
			 * control plane kept answering into memory: 864 MiB in 36 s) */
			if (c->queued + c->stage.len > s->cfg.low_water) {
				/* no idle deadline meanwhile: a client that reads slowly is
				 * not idle, and one that reads nothing meets the send
				 * timeout */
				c->head_held = true;
				c->deadline_ns = 0;
				conn_update_read(c);
				break;
			}
			if (!c->head_started) {
				/* the whole head within head_timeout_ms of its first byte */
				c->head_started = true;
				c->deadline_ns = spaced_mono_ns() + (uint64_t)s->cfg.head_timeout_ms * 1000000u;
			}
			struct spaced_http_req req;
			int r = spaced_http_parse_head(c->rbuf.data, c->rbuf.len, &s->cfg.limits, &req);
			if (r == 0)
				break;
			if (r < 0) {
				refuse(c, -r, "SPACED_EPROTO");
				break;
			}
			consume(c, (size_t)r);
			c->req = req;
			c->have_req = true;
			s->stats.requests++;
			c->body_max = s->cfg.body_max;
			c->deadline_ns = spaced_mono_ns() + (uint64_t)s->cfg.body_timeout_ms * 1000000u;
			c->state = req.body == SPACED_HTTP_BODY_NONE ? C_WAIT : C_BODY;
			c->body_read = c->state == C_WAIT;
			if (c->state == C_WAIT)
				c->deadline_ns = 0; /* the answer takes what it takes */
			ops->on_request(c, &c->req);
			if (c->state == C_CLOSED || c->state == C_CLOSING)
				break;
			if (c->state == C_BODY) {
				if (c->responded) {
					/* answered before its body: the body is not read; the
					 * connection closes once the answer ends */
					c->must_close = true;
					c->state = C_WAIT;
					continue;
				}
				if (spaced_http_body_start(&c->body, &c->req, c->body_max) < 0) {
					refuse(c, 413, "SPACED_ETOOBIG");
					break;
				}
				if (c->req.expect_continue)
					out(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
			}
			if (c->state == C_WAIT && c->answer_ended) {
				/* answered at once */
				if (c->must_close) {
					close_after_output(c);
					break;
				}
				c->in_callback = false;
				next_request(c);
				return;
			}
			continue;
		}
		if (c->state == C_BODY) {
			if (c->rbuf.len == 0)
				break;
			const uint8_t *data;
			size_t dlen;
			long used = spaced_http_body_feed(&c->body, c->rbuf.data, c->rbuf.len, &data, &dlen);
			if (used < 0) {
				refuse(c, (int)-used, "SPACED_EPROTO");
				break;
			}
			body_progress(c, (size_t)used);
			if (dlen && ops->on_body) {
				/* the slice lives in rbuf: hand it over before consuming */
				ops->on_body(c, data, dlen);
				if (c->state == C_CLOSED || c->state == C_CLOSING)
					break;
			}
			consume(c, (size_t)used);
			if (c->body.done) {
				c->state = C_WAIT;
				c->deadline_ns = 0;
				c->body_read = true;
				if (ops->on_body_end)
					ops->on_body_end(c);
				if (c->state == C_WAIT && c->answer_ended) {
					if (c->must_close) {
						close_after_output(c);
						break;
					}
					c->in_callback = false;
					next_request(c);
					return;
				}
			}
			if (used == 0)
				break;
			continue;
		}
		if (c->state == C_WS) {
			if (!ws_frame(c))
				break;
			continue;
		}
		break; /* C_WAIT: bytes sent ahead wait */
	}
	c->in_callback = false;
	if (c->state == C_WAIT && c->answer_ended && !c->must_close) {
		next_request(c);
		return;
	}
	conn_update_read(c);
}

/* ---- TLS input ---- */

/* Decrypts what ssl holds into rbuf while there is room. Returns the bytes
 * added; sets tls_peer_closed at close_notify or a TLS error (the caller
 * closes once what came is processed), tls_stalled when room ran out. */
static size_t tls_pull(struct spaced_httpconn *c)
{
	size_t got = 0;
	c->tls_stalled = false;
	while (!c->tls_peer_closed) {
		size_t room = c->rbuf.max - c->rbuf.len;
		if (room == 0) {
			c->tls_stalled = true;
			break;
		}
		if (spaced_buf_reserve(&c->rbuf, room < 65536 ? room : 65536) < 0) {
			c->tls_peer_closed = true;
			break;
		}
		size_t cap = c->rbuf.cap - c->rbuf.len;
		if (cap > room)
			cap = room;
		ERR_clear_error();
		int n = SSL_read(c->ssl, c->rbuf.data + c->rbuf.len, cap > INT_MAX ? INT_MAX : (int)cap);
		if (n > 0) {
			c->rbuf.len += (size_t)n;
			got += (size_t)n;
			continue;
		}
		int e = SSL_get_error(c->ssl, n);
		ERR_clear_error();
		if (e != SSL_ERROR_WANT_READ)
			c->tls_peer_closed = true; /* close_notify (the client is done) or a broken stream */
		break;
	}
	tls_flush(c); /* what reading produced: an alert, an answer to a key update */
	rbuf_mark(c);
	return got;
}

/* Runs the handshake on what came. Returns 1 when it is done, 0 when it
 * waits for more, -1 when it failed (the alert goes out, then the close). */
static int tls_handshake(struct spaced_httpconn *c)
{
	struct spaced_httpsrv *s = c->srv;
	ERR_clear_error();
	int r = SSL_do_handshake(c->ssl);
	int e = r == 1 ? SSL_ERROR_NONE : SSL_get_error(c->ssl, r);
	ERR_clear_error();
	if (r == 1) {
		c->tls_ready = true;
		s->stats.tls_handshakes++;
		if (spaced_tls_peer_name(c->ssl, c->peer_cert, sizeof c->peer_cert) < 0)
			c->peer_cert[0] = 0;
		tls_flush(c); /* the server's last flight, if any */
		return 1;
	}
	if (e != SSL_ERROR_WANT_READ)
		s->stats.tls_failed++;
	tls_flush(c); /* the server's flight, or an alert */
	if (e == SSL_ERROR_WANT_READ)
		return 0;
	close_after_output(c);
	return -1;
}

/* Bytes that are not TLS where a ClientHello should be: a plaintext HTTP
 * request is told, unencrypted, that this port speaks TLS; anything else is
 * closed on. */
static void tls_refuse_plain(struct spaced_httpconn *c, uint8_t first)
{
	static const char body[] = "{\"error\":\"tls-required\",\"code\":\"SPACED_EPROTO\",\"message\":"
	                           "\"this port speaks TLS: use https:// or wss://\"}\n";
	char head[256];
	c->srv->stats.tls_failed++;
	if (first < 'A' || first > 'Z') {
		conn_close(c);
		return;
	}
	int hl = snprintf(head, sizeof head,
	                  "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: %zu\r\n"
	                  "connection: close\r\ncache-control: no-store\r\n\r\n",
	                  sizeof body - 1);
	c->tls_plain = true;
	c->responded = true;
	struct part parts[2] = {{head, (size_t)hl}, {body, sizeof body - 1}};
	outv_raw(c, parts, 2);
	close_after_output(c);
}

/* Ciphertext from the socket: the handshake, then plaintext into rbuf and
 * on to the parser, as on_read does for a plaintext connection. */
static void tls_in(struct spaced_httpconn *c, const uint8_t *p, size_t n)
{
	if (c->state == C_CLOSED || c->state == C_CLOSING)
		return;
	if (!c->tls_seen) {
		c->tls_seen = true;
		if (p[0] != 0x16) { /* a TLS handshake record starts with 22 */
			tls_refuse_plain(c, p[0]);
			return;
		}
	}
	if (BIO_write(c->rbio, p, (int)n) != (int)n) {
		conn_close(c);
		return;
	}
	if (!c->tls_ready && tls_handshake(c) <= 0)
		return;
	tls_pull(c);
	conn_process(c);
	if (c->tls_peer_closed && c->state != C_CLOSED) {
		c->peer_eof = true;
		conn_close(c); /* as a plaintext client's end of stream */
		return;
	}
	conn_update_read(c);
}

/* Connections whose plaintext waited for room in rbuf get it now. */
static void on_tls_kick(uv_timer_t *t)
{
	struct spaced_httpsrv *s = t->data;
	s->tls_kick_armed = false;
	for (struct spaced_httpconn *c = s->conns, *next; c; c = next) {
		next = c->next;
		if (!c->tls_stalled || c->state == C_CLOSED || c->state == C_CLOSING || c->rbuf.len >= c->rbuf.max ||
		    c->in_callback)
			continue;
		size_t got = tls_pull(c);
		if (got > 0 || c->tls_peer_closed)
			conn_process(c);
		if (c->tls_peer_closed && c->state != C_CLOSED)
			conn_close(c);
		else
			conn_update_read(c);
	}
}

static void tls_kick(struct spaced_httpsrv *s)
{
	if (s->tls_kick_armed || s->stopping)
		return;
	s->tls_kick_armed = true;
	uv_timer_start(&s->tls_kick, on_tls_kick, 0, 0);
}

/* ---- accepting ---- */

/* Frees a connection refused before it was served (its handle is not at
 * the start of the struct: free the struct, not the handle). */
static void free_refused(uv_handle_t *h)
{
	free(h->data);
}

static void on_connection(uv_stream_t *l, int status)
{
	struct spaced_httpsrv *s = l->data;
	if (status < 0)
		return;
	struct spaced_httpconn *c = calloc(1, sizeof *c);
	if (!c)
		return;
	if (uv_tcp_init(s->loop, &c->tcp) < 0) {
		free(c);
		return;
	}
	c->tcp.data = c;
	c->srv = s;
	if (uv_accept(l, (uv_stream_t *)&c->tcp) < 0) {
		uv_close((uv_handle_t *)&c->tcp, free_refused);
		return;
	}
	struct sockaddr_storage ss;
	int sl = sizeof ss;
	if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sl) == 0) {
		if (ss.ss_family == AF_INET)
			uv_ip4_name((struct sockaddr_in *)&ss, c->peer, sizeof c->peer);
		else if (ss.ss_family == AF_INET6)
			uv_ip6_name((struct sockaddr_in6 *)&ss, c->peer, sizeof c->peer);
	}
	spaced_caller_key(c->peer, c->who);
	struct ip_count *ip = ip_find(s, c->who, true);
	if (s->stopping || s->nconns >= s->cfg.max_conns || !ip || ip->n >= s->cfg.max_conns_per_ip) {
		s->stats.refused_budget++;
		if (ip && ip->n == 0) {
			ip->n = 1;
			ip_release(s, c->who);
		}
		uv_close((uv_handle_t *)&c->tcp, free_refused);
		return;
	}
	if (s->cfg.tls) {
		BIO *rb = NULL, *wb = NULL;
		if (!(c->ssl = SSL_new(s->cfg.tls)) || !(rb = BIO_new(BIO_s_mem())) || !(wb = tls_out_bio(c))) {
			BIO_free(rb);
			SSL_free(c->ssl);
			c->ssl = NULL;
			s->stats.refused_budget++;
			if (ip->n == 0) {
				ip->n = 1;
				ip_release(s, c->who);
			}
			uv_close((uv_handle_t *)&c->tcp, free_refused);
			return;
		}
		BIO_set_mem_eof_return(rb, -1); /* empty: "retry", not end of stream */
		SSL_set_bio(c->ssl, rb, wb);
		SSL_set_accept_state(c->ssl);
		c->rbio = rb;
	}
	spaced_buf_init(&c->stage, STAGE_MAX);
	ip->n++;
	s->nconns++;
	s->stats.accepted++;
	uv_tcp_nodelay(&c->tcp, 1);
	int fd;
	if ((s->cfg.sndbuf > 0 || s->cfg.rcvbuf > 0) && uv_fileno((const uv_handle_t *)&c->tcp, &fd) == 0) {
		if (s->cfg.sndbuf > 0)
			setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &s->cfg.sndbuf, sizeof s->cfg.sndbuf);
		if (s->cfg.rcvbuf > 0)
			setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &s->cfg.rcvbuf, sizeof s->cfg.rcvbuf);
	}
	c->state = C_HEAD;
	c->read_wanted = true;
	c->deadline_ns = spaced_mono_ns() + (uint64_t)s->cfg.head_timeout_ms * 1000000u;
	/* room for a head, or for one whole WebSocket frame */
	spaced_buf_init(&c->rbuf, (s->cfg.limits.head_max > s->cfg.ws_message_max ? s->cfg.limits.head_max
	                                                                         : s->cfg.ws_message_max) +
	                              65536);
	spaced_buf_init(&c->msg, s->cfg.ws_message_max);
	c->next = s->conns;
	if (s->conns)
		s->conns->prev = c;
	s->conns = c;
	conn_update_read(c);
}

/* A kept-alive connection waiting for its next request, nothing held for
 * it either way. */
static bool conn_idle(const struct spaced_httpconn *c)
{
	return c->state == C_HEAD && !c->have_req && !c->head_started && c->rbuf.len == 0 &&
	       c->stage.len == 0 && c->queued == 0 && c->msg.len == 0 && !c->dirty && !c->tls_stalled &&
	       (!c->tls_out || c->tls_out->len == 0) && (!c->ssl || c->tls_ready);
}

/* An idle connection's buffers, given back (a client holding many idle
 * connections holds no memory of the server's for them): the read buffer
 * (wiped where bytes came), the output stage, TLS's record buffers. A
 * connection idle since the last tick only: one between two requests of a
 * busy client keeps them. */
static void conn_release_idle(struct spaced_httpconn *c)
{
	if (!conn_idle(c)) {
		c->idle_ticks = 0;
		return;
	}
	if (++c->idle_ticks < 2)
		return;
	if (c->rbuf.data) {
		spaced_wipe(c->rbuf.data, c->rbuf_hw < c->rbuf.cap ? c->rbuf_hw : c->rbuf.cap);
		free(c->rbuf.data);
		c->rbuf.data = NULL;
		c->rbuf.cap = 0;
		c->rbuf_hw = 0;
	}
	spaced_buf_free(&c->stage);
	spaced_buf_free(&c->msg);
	if (c->ssl)
		(void)SSL_free_buffers(c->ssl); /* refused (0) while a record is partly in: kept */
	free(c->tls_out); /* empty: an idle connection's output is all written */
	c->tls_out = NULL;
}

/* Deadlines and idle connections' buffers, once a second. */
static void on_tick(uv_timer_t *t)
{
	struct spaced_httpsrv *s = t->data;
	uint64_t now = spaced_mono_ns();
	for (struct spaced_httpconn *c = s->conns, *next; c; c = next) {
		next = c->next;
		conn_release_idle(c);
		/* an answer or a WebSocket under way: the kernel may hold what
		 * the client does not read though nothing waits here */
		bool answering = c->queued > 0 || c->state == C_WAIT || c->state == C_WS;
		if (answering && s->cfg.send_timeout_ms) {
			/* output must move: a client that reads nothing holds its
			 * answer send_timeout_ms at most, whatever state it is in */
			size_t wq = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
			/* and what the socket holds unacknowledged: a client reading
			 * slowly moves it long before the socket wakes its writer */
			uv_os_fd_t fd;
			int outq = 0;
			if (uv_fileno((const uv_handle_t *)&c->tcp, &fd) == 0 && ioctl(fd, SIOCOUTQ, &outq) == 0 && outq > 0)
				wq += (size_t)outq;
			if (wq == 0 || wq < c->wq_seen || c->written != c->written_seen)
				c->wprogress_ns = now;
			c->wq_seen = wq;
			c->written_seen = c->written;
			if (now - c->wprogress_ns >= (uint64_t)s->cfg.send_timeout_ms * 1000000u) {
				s->stats.timed_out++;
				conn_close(c);
				continue;
			}
		}
		if (c->deadline_ns == 0 || now < c->deadline_ns)
			continue;
		if (c->state == C_HEAD && !c->head_started) {
			/* idle (no byte of a next request): closed quietly */
			s->stats.timed_out++;
			conn_close(c);
		} else if (c->state == C_HEAD || c->state == C_BODY) {
			refuse(c, 408, "SPACED_ETIMEDOUT");
		}
	}
}

int spaced_httpsrv_start(uv_loop_t *loop, const struct spaced_httpsrv_config *cfg, struct spaced_httpsrv **out)
{
	struct spaced_httpsrv *s = calloc(1, sizeof *s);
	if (!s)
		return SPACED_ENOMEM;
	s->loop = loop;
	s->cfg = *cfg;
	if (uv_tcp_init(loop, &s->listen) < 0) {
		free(s);
		return SPACED_ESYS;
	}
	if (s->cfg.tls)
		SSL_CTX_up_ref(s->cfg.tls); /* released in srv_free */
	s->listen.data = s;
	int r;
	if (cfg->listen_fd >= 0) {
		r = uv_tcp_open(&s->listen, cfg->listen_fd);
	} else {
		struct sockaddr_storage ss;
		memset(&ss, 0, sizeof ss);
		if (uv_ip4_addr(cfg->host, cfg->port, (struct sockaddr_in *)&ss) != 0 &&
		    uv_ip6_addr(cfg->host, cfg->port, (struct sockaddr_in6 *)&ss) != 0) {
			uv_close((uv_handle_t *)&s->listen, NULL);
			uv_run(loop, UV_RUN_NOWAIT);
			SSL_CTX_free(s->cfg.tls);
			free(s);
			return SPACED_EINVAL;
		}
		r = uv_tcp_bind(&s->listen, (struct sockaddr *)&ss, 0);
	}
	if (r == 0)
		r = uv_listen((uv_stream_t *)&s->listen, 1024, on_connection);
	if (r < 0) {
		uv_close((uv_handle_t *)&s->listen, NULL);
		uv_run(loop, UV_RUN_NOWAIT);
		SSL_CTX_free(s->cfg.tls);
		free(s);
		return SPACED_ESYS;
	}
	struct sockaddr_storage ss;
	int sl = sizeof ss;
	if (uv_tcp_getsockname(&s->listen, (struct sockaddr *)&ss, &sl) == 0)
		s->port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
		                                        : ((struct sockaddr_in6 *)&ss)->sin6_port);
	uv_timer_init(loop, &s->tick);
	s->tick.data = s;
	uv_timer_start(&s->tick, on_tick, 1000, 1000);
	uv_timer_init(loop, &s->tls_kick);
	s->tls_kick.data = s;
	uv_check_init(loop, &s->seal_check);
	s->seal_check.data = s;
	uv_idle_init(loop, &s->seal_idle);
	s->seal_idle.data = s;
	*out = s;
	return 0;
}

int spaced_httpsrv_port(const struct spaced_httpsrv *s)
{
	return s->port;
}

void *spaced_httpsrv_user(const struct spaced_httpsrv *s)
{
	return s->cfg.user;
}

static void on_handle_closed(uv_handle_t *h)
{
	struct spaced_httpsrv *s = h->data;
	if (--s->closing_handles == 0)
		srv_free(s);
}

void spaced_httpsrv_stop(struct spaced_httpsrv *s)
{
	if (!s || s->stopping)
		return;
	s->stopping = true;
	s->closing_handles = 5;
	uv_close((uv_handle_t *)&s->listen, on_handle_closed);
	uv_timer_stop(&s->tick);
	uv_close((uv_handle_t *)&s->tick, on_handle_closed);
	uv_timer_stop(&s->tls_kick);
	uv_close((uv_handle_t *)&s->tls_kick, on_handle_closed);
	uv_check_stop(&s->seal_check);
	uv_close((uv_handle_t *)&s->seal_check, on_handle_closed);
	uv_idle_stop(&s->seal_idle);
	uv_close((uv_handle_t *)&s->seal_idle, on_handle_closed);
	while (s->conns)
		conn_close(s->conns);
}

void spaced_httpsrv_stats(const struct spaced_httpsrv *s, struct spaced_httpsrv_stats *out)
{
	*out = s->stats;
	out->open = s->nconns;
	out->buffered = 0;
	for (const struct spaced_httpconn *c = s->conns; c; c = c->next)
		out->buffered += c->rbuf.cap + c->stage.cap + c->msg.cap + (c->tls_out ? c->tls_out->cap : 0);
}

struct spaced_httpsrv *spaced_httpconn_srv(const struct spaced_httpconn *c)
{
	return c->srv;
}
void *spaced_httpconn_user(const struct spaced_httpconn *c)
{
	return c->user;
}
void spaced_httpconn_set_user(struct spaced_httpconn *c, void *user)
{
	c->user = user;
}
const char *spaced_httpconn_peer(const struct spaced_httpconn *c)
{
	return c->peer;
}
bool spaced_httpconn_tls(const struct spaced_httpconn *c)
{
	return c->ssl != NULL;
}
const char *spaced_httpconn_peer_cert(const struct spaced_httpconn *c)
{
	return c->peer_cert[0] ? c->peer_cert : NULL;
}
