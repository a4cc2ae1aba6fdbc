/* ws_client.c — spacectl's WebSocket client (see ws_client.h). */
#include "ws_client.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#include <sodium.h>

#include "spaced_error.h"
#include "http_client.h"
#include "net.h"
#include "util.h"
#include "ws.h"

/* the read buffer: one whole largest message, its header, and room to read */
#define RX_CAP (WS_CLIENT_MSG_MAX + SPACED_WS_HDR_MAX + (256u << 10))

struct ws_client {
	struct net_conn *conn; /* TCP, or TLS over it (wss://) */
	uint8_t *rx;
	size_t rx_off, rx_len; /* bytes read and not yet taken: rx[rx_off, rx_len) */
	size_t taken;          /* bytes of the message returned last, taken at the next call */
	struct spaced_buf frag; /* a fragmented message being put together */
	uint8_t frag_op;
	bool in_frag, frag_ready;
	struct spaced_buf tx;
	size_t tx_off;
	bool close_sent, close_seen;
	char errmsg[256];
};

static void fail(struct ws_client *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct ws_client *w, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(w->errmsg, sizeof w->errmsg, fmt, ap);
	va_end(ap);
}

static struct ws_client *client_new(struct net_conn *conn)
{
	struct ws_client *w = calloc(1, sizeof *w);
	if (w == NULL)
		return NULL;
	if ((w->rx = malloc(RX_CAP)) == NULL) {
		free(w);
		return NULL;
	}
	w->conn = conn;
	spaced_buf_init(&w->frag, WS_CLIENT_MSG_MAX);
	spaced_buf_init(&w->tx, SIZE_MAX / 2);
	return w;
}

int ws_client_adopt(int fd, struct ws_client **out)
{
	struct net_conn *c = net_adopt(fd);
	struct ws_client *w = c ? client_new(c) : NULL;
	if (w == NULL) {
		net_close(c);
		return SPACED_ENOMEM;
	}
	*out = w;
	return 0;
}

void ws_client_free(struct ws_client *w)
{
	if (w == NULL)
		return;
	net_close(w->conn);
	spaced_buf_free(&w->frag);
	spaced_buf_free(&w->tx);
	free(w->rx);
	free(w);
}

int ws_client_fd(const struct ws_client *w)
{
	return net_fd(w->conn);
}

bool ws_client_pending(const struct ws_client *w)
{
	return net_pending(w->conn);
}

const char *ws_client_errmsg(const struct ws_client *w)
{
	return w->errmsg;
}

size_t ws_client_queued(const struct ws_client *w)
{
	return w->tx.len - w->tx_off;
}

/* Appends one masked frame (header, then head || p masked) to the send queue. */
static int queue_frame(struct ws_client *w, uint8_t opcode, const void *head, size_t hn, const void *p, size_t n)
{
	uint8_t hdr[SPACED_WS_HDR_MAX + 4], mask[4];
	size_t total = hn + n;
	size_t hl = spaced_ws_frame_header(hdr, true, opcode, total);
	hdr[1] |= 0x80; /* a client masks every frame */
	randombytes_buf(mask, sizeof mask);
	memcpy(hdr + hl, mask, 4);
	hl += 4;
	/* compact what was sent before growing */
	if (w->tx_off > 0 && w->tx_off == w->tx.len) {
		w->tx.len = 0;
		w->tx_off = 0;
	}
	if (spaced_buf_reserve(&w->tx, hl + total) < 0)
		return SPACED_ENOMEM;
	memcpy(w->tx.data + w->tx.len, hdr, hl);
	uint8_t *dst = w->tx.data + w->tx.len + hl;
	if (hn)
		memcpy(dst, head, hn);
	if (n)
		memcpy(dst + hn, p, n);
	spaced_ws_mask(dst, total, mask, 0);
	w->tx.len += hl + total;
	return 0;
}

int ws_client_send(struct ws_client *w, uint8_t opcode, const void *head, size_t hn, const void *p, size_t n)
{
	if (w->close_sent)
		return SPACED_ECLOSED;
	if ((opcode != SPACED_WS_TEXT && opcode != SPACED_WS_BINARY) || hn + n > WS_CLIENT_MSG_MAX || hn + n < hn)
		return SPACED_ETOOBIG;
	return queue_frame(w, opcode, head, hn, p, n);
}

int ws_client_close(struct ws_client *w, unsigned code, const char *reason)
{
	if (w->close_sent)
		return 0;
	uint8_t b[2] = {(uint8_t)(code >> 8), (uint8_t)code};
	size_t rl = reason ? strlen(reason) : 0;
	if (rl > 123)
		rl = 123;
	int e = queue_frame(w, SPACED_WS_CLOSE, b, 2, reason, rl);
	if (e == 0)
		w->close_sent = true;
	return e;
}

int ws_client_flush(struct ws_client *w)
{
	while (w->tx_off < w->tx.len) {
		ssize_t k = net_send(w->conn, w->tx.data + w->tx_off, w->tx.len - w->tx_off, MSG_DONTWAIT);
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 1;
		if (k <= 0) {
			fail(w, "cannot send: %s", strerror(errno));
			return SPACED_ECLOSED;
		}
		w->tx_off += (size_t)k;
	}
	w->tx.len = 0;
	w->tx_off = 0;
	return 0;
}

/* Drops the message returned last; moves what is left to the front when the
 * free room at the end runs short. */
static void take_returned(struct ws_client *w)
{
	w->rx_off += w->taken;
	w->taken = 0;
	if (w->frag_ready) {
		w->frag.len = 0;
		w->frag_ready = false;
	}
	if (w->rx_off == w->rx_len) {
		w->rx_off = w->rx_len = 0;
	} else if (w->rx_off > 0 && RX_CAP - w->rx_len < (256u << 10)) {
		memmove(w->rx, w->rx + w->rx_off, w->rx_len - w->rx_off);
		w->rx_len -= w->rx_off;
		w->rx_off = 0;
	}
}

int ws_client_read(struct ws_client *w)
{
	take_returned(w);
	if (w->rx_len == RX_CAP) {
		if (w->rx_off == 0)
			return SPACED_EBUSY;
		memmove(w->rx, w->rx + w->rx_off, w->rx_len - w->rx_off);
		w->rx_len -= w->rx_off;
		w->rx_off = 0;
	}
	/* every record TLS holds decrypted or whole is taken now, not one per
	 * poll(); an end or error after some bytes is seen by the next call */
	size_t got = 0;
	for (;;) {
		ssize_t k = net_recv(w->conn, w->rx + w->rx_len, RX_CAP - w->rx_len, MSG_DONTWAIT);
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return (int)got;
		if (k <= 0 && got > 0)
			return (int)got;
		if (k < 0) {
			fail(w, "connection broken: %s", strerror(errno));
			return SPACED_ECLOSED;
		}
		if (k == 0) {
			fail(w, "connection closed by the server");
			return SPACED_ECLOSED;
		}
		w->rx_len += (size_t)k;
		got += (size_t)k;
		if (w->rx_len == RX_CAP || !net_pending(w->conn))
			return (int)got;
	}
}

int ws_client_feed(struct ws_client *w, const void *p, size_t n)
{
	take_returned(w);
	if (w->rx_off > 0) {
		memmove(w->rx, w->rx + w->rx_off, w->rx_len - w->rx_off);
		w->rx_len -= w->rx_off;
		w->rx_off = 0;
	}
	if (n > RX_CAP - w->rx_len)
		return SPACED_EBUSY;
	memcpy(w->rx + w->rx_len, p, n);
	w->rx_len += n;
	return 0;
}

/* A protocol error of the server: the close frame with code is queued. */
static int proto_error(struct ws_client *w, unsigned code, const char *what)
{
	fail(w, "WebSocket protocol error from the server: %s", what);
	(void)ws_client_close(w, code, what);
	return SPACED_EPROTO;
}

int ws_client_next(struct ws_client *w, struct ws_client_msg *m)
{
	take_returned(w);
	for (;;) {
		if (w->close_seen)
			return 0; /* nothing follows a close */
		const uint8_t *in = w->rx + w->rx_off;
		size_t avail = w->rx_len - w->rx_off;
		struct spaced_ws_frame f;
		int h = spaced_ws_frame_parse(in, avail, false, WS_CLIENT_MSG_MAX, &f);
		if (h == 0)
			return 0;
		if (h < 0)
			return proto_error(w, (unsigned)-h, h == -1009 ? "message too big" : "bad frame");
		if (avail - f.hdr_len < f.len)
			return 0; /* the rest of the payload is on its way (it fits: f.len <= WS_CLIENT_MSG_MAX) */
		const uint8_t *pl = in + f.hdr_len;
		size_t total = f.hdr_len + (size_t)f.len;
		switch (f.opcode) {
		case SPACED_WS_PING:
			w->rx_off += total;
			if (!w->close_sent && queue_frame(w, SPACED_WS_PONG, pl, (size_t)f.len, NULL, 0) < 0)
				return SPACED_ENOMEM;
			continue;
		case SPACED_WS_PONG:
			w->rx_off += total;
			continue;
		case SPACED_WS_CLOSE: {
			unsigned code = 1005;
			size_t rl = 0;
			if (f.len == 1)
				return proto_error(w, 1002, "close frame of one byte");
			if (f.len >= 2) {
				code = (unsigned)pl[0] << 8 | pl[1];
				if (!spaced_ws_close_code_ok(code))
					return proto_error(w, 1002, "bad close code");
				if (!spaced_utf8_valid(pl + 2, (size_t)f.len - 2))
					return proto_error(w, 1007, "close reason not UTF-8");
				rl = (size_t)f.len - 2;
			}
			memset(m, 0, sizeof *m);
			m->opcode = SPACED_WS_CLOSE;
			m->close_code = code;
			if (rl > sizeof m->close_reason - 1)
				rl = sizeof m->close_reason - 1;
			for (size_t i = 0; i < rl; i++)
				m->close_reason[i] = pl[2 + i] < 0x20 || pl[2 + i] == 0x7f ? '?' : (char)pl[2 + i];
			w->rx_off += total;
			w->close_seen = true;
			if (!w->close_sent)
				(void)ws_client_close(w, code == 1005 ? 1000 : code, "");
			return 1;
		}
		case SPACED_WS_TEXT:
		case SPACED_WS_BINARY:
			if (w->in_frag)
				return proto_error(w, 1002, "a new message inside a fragmented one");
			if (f.fin) {
				if (f.opcode == SPACED_WS_TEXT && !spaced_utf8_valid(pl, (size_t)f.len))
					return proto_error(w, 1007, "text not UTF-8");
				memset(m, 0, sizeof *m);
				m->opcode = f.opcode;
				m->data = pl;
				m->len = (size_t)f.len;
				w->taken = total;
				return 1;
			}
			w->in_frag = true;
			w->frag_op = f.opcode;
			w->frag.len = 0;
			/* fall through: the first fragment's payload is collected below */
			__attribute__((fallthrough));
		case SPACED_WS_CONT:
			if (!w->in_frag)
				return proto_error(w, 1002, "a continuation with no message");
			if (spaced_buf_append(&w->frag, pl, (size_t)f.len) < 0)
				return proto_error(w, 1009, "message too big");
			w->rx_off += total;
			if (!f.fin)
				continue;
			w->in_frag = false;
			if (w->frag_op == SPACED_WS_TEXT && !spaced_utf8_valid(w->frag.data, w->frag.len))
				return proto_error(w, 1007, "text not UTF-8");
			memset(m, 0, sizeof *m);
			m->opcode = w->frag_op;
			m->data = w->frag.data ? w->frag.data : (const uint8_t *)"";
			m->len = w->frag.len;
			w->frag_ready = true;
			return 1;
		default:
			return proto_error(w, 1002, "unknown opcode");
		}
	}
}

/* ---- the opening handshake ---- */

static uint64_t now_ms(void)
{
	return spaced_mono_ns() / 1000000u;
}

int ws_client_open(const char *host, int port, int tls, const char *target, const char *bearer, int timeout_s,
                   struct ws_client **out, int *http_status, char *err, size_t errsz)
{
	uint8_t keyraw[16];
	char key[32], want[29];
	randombytes_buf(keyraw, sizeof keyraw);
	/* standard base64 of 16 bytes: 24 characters with padding */
	if (sodium_bin2base64(key, sizeof key, keyraw, sizeof keyraw, sodium_base64_VARIANT_ORIGINAL) == NULL ||
	    spaced_ws_accept(key, want) < 0) {
		snprintf(err, errsz, "cannot make a WebSocket key");
		return SPACED_ENOMEM;
	}
	struct net_conn *fd = NULL;
	if (net_connect(host, port, tls, timeout_s, &fd, err, errsz) < 0)
		return SPACED_ECLOSED;
	int e = SPACED_ENOMEM;
	struct ws_client *w = NULL;
	size_t need = strlen(target) + strlen(host) + (bearer ? strlen(bearer) : 0) + 256;
	char *req = malloc(need);
	if (req == NULL) {
		snprintf(err, errsz, "out of memory");
		goto out;
	}
	int n = snprintf(req, need,
	                 "GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
	                 "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n%s%s%s\r\n",
	                 target, host, port, key, bearer ? "Authorization: Bearer " : "", bearer ? bearer : "",
	                 bearer ? "\r\n" : "");
	if (n < 0 || (size_t)n >= need) {
		snprintf(err, errsz, "request too long");
		e = SPACED_ETOOBIG;
		goto out;
	}
	uint64_t deadline = now_ms() + (uint64_t)timeout_s * 1000u;
	size_t off = 0;
	while (off < (size_t)n) {
		ssize_t k = net_send(fd, req + off, (size_t)n - off, 0);
		if (k < 0 && errno == EINTR) {
			snprintf(err, errsz, "interrupted");
			e = SPACED_ECLOSED;
			goto out;
		}
		if (k < 0) {
			snprintf(err, errsz, "cannot send the request: %s", strerror(errno));
			e = errno == EAGAIN ? SPACED_ETIMEDOUT : SPACED_ECLOSED;
			goto out;
		}
		off += (size_t)k;
	}
	if ((w = client_new(fd)) == NULL) {
		snprintf(err, errsz, "out of memory");
		goto out;
	}
	fd = NULL;
	/* the answer's head; what follows it is the stream's first bytes */
	long hl = 0;
	while ((hl = http_head_length(w->rx, w->rx_len)) == 0) {
		uint64_t t = now_ms();
		struct pollfd pf = {.fd = net_fd(w->conn), .events = POLLIN};
		int pr = net_pending(w->conn) ? 1 : t >= deadline ? 0 : poll(&pf, 1, (int)(deadline - t));
		if (pr < 0) {
			snprintf(err, errsz, errno == EINTR ? "interrupted" : "poll: %s", strerror(errno));
			e = SPACED_ECLOSED;
			goto out;
		}
		if (pr == 0) {
			snprintf(err, errsz, "no answer to the WebSocket upgrade within %d s", timeout_s);
			e = SPACED_ETIMEDOUT;
			goto out;
		}
		int r = ws_client_read(w);
		if (r < 0) {
			snprintf(err, errsz, "%s", r == SPACED_EBUSY ? "answer head too large" : ws_client_errmsg(w));
			e = r == SPACED_EBUSY ? SPACED_EPROTO : SPACED_ECLOSED;
			goto out;
		}
	}
	if (hl < 0) {
		snprintf(err, errsz, "malformed answer to the WebSocket upgrade");
		e = SPACED_EPROTO;
		goto out;
	}
	int st = http_head_status(w->rx, (size_t)hl);
	char v[64];
	if (st != 101) {
		if (st < 0)
			snprintf(err, errsz, "malformed answer to the WebSocket upgrade");
		else
			snprintf(err, errsz, "the server answered the WebSocket upgrade with HTTP %d", st);
		*http_status = st < 0 ? 0 : st;
		e = SPACED_EPROTO;
		goto out;
	}
	if (http_head_field(w->rx, (size_t)hl, "Upgrade", v, sizeof v) < 0 || strcasecmp(v, "websocket") != 0 ||
	    http_head_field(w->rx, (size_t)hl, "Connection", v, sizeof v) < 0 || strcasestr(v, "upgrade") == NULL ||
	    http_head_field(w->rx, (size_t)hl, "Sec-WebSocket-Accept", v, sizeof v) < 0 || strcmp(v, want) != 0) {
		snprintf(err, errsz, "the server's WebSocket handshake is wrong (Upgrade, Connection or Sec-WebSocket-Accept)");
		*http_status = st;
		e = SPACED_EPROTO;
		goto out;
	}
	w->rx_off = (size_t)hl;
	int fl = fcntl(net_fd(w->conn), F_GETFL);
	if (fl < 0 || fcntl(net_fd(w->conn), F_SETFL, fl | O_NONBLOCK) < 0) {
		snprintf(err, errsz, "fcntl: %s", strerror(errno));
		e = SPACED_ECLOSED;
		goto out;
	}
	*out = w;
	w = NULL;
	e = 0;
out:
	if (req != NULL) {
		spaced_wipe(req, strlen(req)); /* it holds the capability */
		free(req);
	}
	ws_client_free(w);
	net_close(fd);
	return e;
}
