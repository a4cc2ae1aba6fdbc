/* http_client.c — spacectl's blocking HTTP/1.1 client (see http_client.h). */
#include "http_client.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "http.h"
#include "net.h"

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int http_parse_url(const char *url, char *host, size_t hostsz, int *port, char *prefix, size_t prefixsz, int *tls)
{
	int t = strncmp(url, "https://", 8) == 0;
	if (!t && strncmp(url, "http://", 7) != 0)
		return -1;
	const char *h = url + (t ? 8 : 7), *slash = strchr(h, '/'), *end = slash ? slash : h + strlen(h);
	const char *colon;
	if (*h == '[') { /* an IPv6 literal keeps its brackets */
		const char *rb = memchr(h, ']', (size_t)(end - h));
		if (rb == NULL)
			return -1;
		colon = rb + 1 < end && rb[1] == ':' ? rb + 1 : NULL;
		if (rb + 1 != end && colon == NULL)
			return -1;
	} else {
		colon = memchr(h, ':', (size_t)(end - h));
	}
	const char *hend = colon ? colon : end;
	if (hend == h || (size_t)(hend - h) >= hostsz)
		return -1;
	memcpy(host, h, (size_t)(hend - h));
	host[hend - h] = 0;
	int p = t ? 443 : 80;
	if (colon) {
		char *e = NULL;
		long v = strtol(colon + 1, &e, 10);
		if (e != end || v < 1 || v > 65535)
			return -1;
		p = (int)v;
	}
	if (snprintf(prefix, prefixsz, "%s", slash ? slash : "") >= (int)prefixsz)
		return -1;
	size_t n = strlen(prefix);
	if (n > 0 && prefix[n - 1] == '/')
		prefix[n - 1] = 0;
	*port = p;
	*tls = t;
	return 0;
}

/* The value of header name in the head [head, hend), *vlen bytes; or NULL. */
static const char *http_header(const char *head, const char *hend, const char *name, size_t *vlen)
{
	size_t nl = strlen(name);
	for (const char *h = strstr(head, "\r\n"); h != NULL && h < hend; h = strstr(h + 2, "\r\n")) {
		const char *line = h + 2;
		if (strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
			const char *v = line + nl + 1;
			while (*v == ' ' || *v == '\t')
				v++;
			const char *e = strstr(v, "\r\n");
			if (e == NULL || e > hend)
				e = hend;
			*vlen = (size_t)(e - v);
			return v;
		}
	}
	return NULL;
}

/* Decodes a chunked body in place. Returns the decoded length or -1 when the
 * body is malformed or cut short (no final chunk). */
static long dechunk(unsigned char *b, size_t n)
{
	size_t in = 0, outl = 0;
	for (;;) {
		char *e = NULL;
		if (in >= n)
			return -1;
		unsigned long sz = strtoul((char *)b + in, &e, 16);
		if (e == (char *)b + in)
			return -1;
		const char *crlf = strstr(e, "\r\n");
		if (crlf == NULL)
			return -1;
		in = (size_t)((const unsigned char *)crlf - b) + 2;
		if (sz == 0)
			return (long)outl;
		if (sz > n - in || n - in - sz < 2)
			return -1;
		memmove(b + outl, b + in, sz);
		outl += sz;
		in += sz + 2;
	}
}

long http_answer_length(const unsigned char *in, size_t len, int *keep)
{
	const char *b = (const char *)in;
	*keep = 0;
	const char *hend = strstr(b, "\r\n\r\n");
	if (hend == NULL || (size_t)(hend - b) > len)
		return len > 65536 ? -1 : 0; /* a head larger than 64 KiB is not an answer */
	size_t hl = (size_t)(hend - b) + 4, vl = 0;
	int st = 0;
	if (sscanf(b, "HTTP/1.%*d %d", &st) != 1 || st < 100 || st > 599)
		return -1;
	const char *v = http_header(b, hend, "Connection", &vl);
	int close_after = v != NULL && vl >= 5 && strncasecmp(v, "close", 5) == 0;
	if (st == 204 || st == 304) {
		*keep = !close_after;
		return (long)hl;
	}
	if ((v = http_header(b, hend, "Transfer-Encoding", &vl)) != NULL && vl >= 7 && strncasecmp(v, "chunked", 7) == 0) {
		size_t p = hl;
		for (;;) {
			const char *crlf = p < len ? strstr(b + p, "\r\n") : NULL;
			if (crlf == NULL)
				return len - p > 64 ? -1 : 0;
			char *e = NULL;
			unsigned long sz = strtoul(b + p, &e, 16);
			if (e == b + p || (e != crlf && *e != ';'))
				return -1;
			p = (size_t)(crlf - b) + 2;
			if (sz == 0) {
				/* the last chunk, then trailers up to an empty line */
				const char *end = strstr(b + p - 2, "\r\n\r\n");
				if (end == NULL)
					return 0;
				*keep = !close_after;
				return (long)((size_t)(end - b) + 4);
			}
			if (sz > HTTP_RESPONSE_MAX)
				return -1;
			if (len - p < sz + 2)
				return 0;
			if (memcmp(b + p + sz, "\r\n", 2) != 0)
				return -1;
			p += sz + 2;
		}
	}
	if ((v = http_header(b, hend, "Content-Length", &vl)) != NULL) {
		char *e = NULL;
		unsigned long cl = strtoul(v, &e, 10);
		if (e == v || cl > HTTP_RESPONSE_MAX)
			return -1;
		if (len - hl < cl)
			return 0;
		*keep = !close_after;
		return (long)(hl + cl);
	}
	return 0; /* ends when the worker closes the connection */
}

void http_conns_init(struct http_conns *k)
{
	memset(k, 0, sizeof *k);
}

void http_conns_close(struct http_conns *k)
{
	for (int i = 0; i < HTTP_CONNS; i++) {
		net_close(k->c[i].conn);
		k->c[i].conn = NULL;
		k->c[i].addr[0] = 0;
	}
}

/* A kept connection to addr that is still usable, taken out of k; or NULL. */
static struct net_conn *conns_take(struct http_conns *k, const char *addr)
{
	if (k == NULL)
		return NULL;
	uint64_t now = mono_ns();
	for (int i = 0; i < HTTP_CONNS; i++) {
		if (k->c[i].conn == NULL || strcmp(k->c[i].addr, addr) != 0)
			continue;
		struct net_conn *c = k->c[i].conn;
		k->c[i].conn = NULL;
		k->c[i].addr[0] = 0;
		/* idle too long, or readable (closed by the worker, or stray bytes): not reused */
		if (now - k->c[i].idle_since_ns >= (uint64_t)HTTP_CONN_IDLE_MS * 1000000u || net_readable(c) != 0) {
			net_close(c);
			continue;
		}
		k->reused++;
		return c;
	}
	return NULL;
}

/* Keeps c for the next request to addr (closes it when k is NULL). */
static void conns_put(struct http_conns *k, const char *addr, struct net_conn *c)
{
	if (k == NULL) {
		net_close(c);
		return;
	}
	int slot = 0;
	for (int i = 0; i < HTTP_CONNS; i++) {
		if (k->c[i].conn == NULL) {
			slot = i;
			break;
		}
		if (k->c[i].idle_since_ns < k->c[slot].idle_since_ns)
			slot = i; /* all taken: the one idle longest goes */
	}
	net_close(k->c[slot].conn);
	snprintf(k->c[slot].addr, sizeof k->c[slot].addr, "%s", addr);
	k->c[slot].conn = c;
	k->c[slot].idle_since_ns = mono_ns();
}

/* flags: MSG_MORE when more of the same request follows (one segment, not two) */
static int send_all(struct net_conn *c, const void *p, size_t n, int flags)
{
	const char *b = p;
	while (n > 0) {
		ssize_t w = net_send(c, b, n, flags);
		if (w < 0)
			return -1;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

int http_exchange(struct http_conns *conns, const char *host, int port, int tls, const char *head, size_t headlen,
                  const void *body, size_t blen, int timeout_s, unsigned char **answer, size_t *len, char *err,
                  size_t errsz)
{
	char addr[280];
	int r = -1, keep = 0;
	unsigned char *buf = NULL, *one = NULL;
	size_t n = 0, cap = 0;
	snprintf(addr, sizeof addr, "%s:%s:%d", tls ? "https" : "http", host, port);
	struct net_conn *fd = conns_take(conns, addr);
	if (fd == NULL) {
		if (net_connect(host, port, tls, timeout_s, &fd, err, errsz) < 0)
			return -1;
		if (conns != NULL)
			conns->opened++;
	}
	net_set_timeout_ms(fd, timeout_s * 1000);
	if (tls && blen > 0 && blen <= 65536 && (one = malloc(headlen + blen)) != NULL) {
		/* with TLS, head and a small body in one record */
		memcpy(one, head, headlen);
		memcpy(one + headlen, body, blen);
		head = (const char *)one;
		headlen += blen;
		blen = 0;
	}
	int send_err = 0;
	if (send_all(fd, head, headlen, blen > 0 ? MSG_MORE : 0) < 0 || (blen > 0 && send_all(fd, body, blen, 0) < 0)) {
		send_err = errno;
		snprintf(err, errsz, "cannot send the request: %s", strerror(send_err));
		/* the server may have answered (a 413 for a body too large) and closed: read that */
		if (send_err != EPIPE && send_err != ECONNRESET)
			goto out;
	}
	for (;;) {
		if (n + 65536 + 1 > cap) {
			if (cap >= HTTP_RESPONSE_MAX) {
				snprintf(err, errsz, "answer larger than %u bytes", HTTP_RESPONSE_MAX);
				goto out;
			}
			size_t ncap = cap ? cap * 2 : 131072;
			unsigned char *nb = realloc(buf, ncap);
			if (nb == NULL) {
				snprintf(err, errsz, "out of memory");
				goto out;
			}
			buf = nb;
			cap = ncap;
		}
		ssize_t got = net_recv(fd, buf + n, cap - n - 1, 0);
		if (got < 0) {
			if (!send_err)
				snprintf(err, errsz, "no answer: %s", strerror(errno));
			goto out;
		}
		if (got == 0)
			break;
		n += (size_t)got;
		buf[n] = 0;
		long whole = http_answer_length(buf, n, &keep);
		if (whole < 0) {
			snprintf(err, errsz, "malformed answer");
			goto out;
		}
		if (whole > 0) {
			keep = keep && (size_t)whole == n; /* bytes past the answer: the connection is not reused */
			n = (size_t)whole;
			break;
		}
	}
	if (n == 0) {
		if (!send_err)
			snprintf(err, errsz, "connection closed without an answer");
		goto out;
	}
	if (send_err)
		keep = 0; /* answered before the request was all sent */
	buf[n] = 0;
	*answer = buf;
	*len = n;
	buf = NULL;
	r = 0;
	if (keep) {
		conns_put(conns, addr, fd);
		fd = NULL;
	}
out:
	net_close(fd);
	free(buf);
	free(one);
	return r;
}

int http_parse_answer(const unsigned char *in, size_t len, int *status, unsigned char **body, size_t *blen,
                      const char *header, char *hval, size_t hvalsz, char *err, size_t errsz)
{
	unsigned char *buf = NULL;
	int r = -1;
	if (hval != NULL && hvalsz > 0)
		hval[0] = 0;
	if (len == 0) {
		snprintf(err, errsz, "connection closed without an answer");
		return -1;
	}
	/* a NUL-terminated copy: no search runs past the end (a NUL in the
	 * head hides the blank line: malformed) */
	if ((buf = malloc(len + 1)) == NULL) {
		snprintf(err, errsz, "out of memory");
		return -1;
	}
	memcpy(buf, in, len);
	buf[len] = 0;
	char *hend = strstr((char *)buf, "\r\n\r\n");
	int st = 0;
	if (hend == NULL || sscanf((char *)buf, "HTTP/1.%*d %d", &st) != 1 || st < 100 || st > 599) {
		snprintf(err, errsz, "malformed answer");
		goto out;
	}
	size_t vl = 0;
	const char *v;
	if (header != NULL && hval != NULL && (v = http_header((char *)buf, hend, header, &vl)) != NULL &&
	    vl < hvalsz) {
		memcpy(hval, v, vl);
		hval[vl] = 0;
	}
	unsigned char *content = (unsigned char *)hend + 4;
	size_t clen = len - (size_t)(content - buf);
	const char *te = http_header((char *)buf, hend, "Transfer-Encoding", &vl);
	if (te != NULL && vl >= 7 && strncasecmp(te, "chunked", 7) == 0) {
		long d = dechunk(content, clen);
		if (d < 0) {
			snprintf(err, errsz, "answer cut short");
			goto out;
		}
		clen = (size_t)d;
	} else if ((v = http_header((char *)buf, hend, "Content-Length", &vl)) != NULL) {
		unsigned long cl = strtoul(v, NULL, 10);
		if (cl > clen) {
			snprintf(err, errsz, "answer cut short");
			goto out;
		}
		clen = cl;
	}
	unsigned char *out = malloc(clen + 1);
	if (out == NULL) {
		snprintf(err, errsz, "out of memory");
		goto out;
	}
	memcpy(out, content, clen);
	out[clen] = 0;
	*status = st;
	*body = out;
	*blen = clen;
	r = 0;
out:
	free(buf);
	return r;
}

int http_request(const char *base_url, const char *method, const char *path, const char *bearer,
                 const char *json_body, int *status, char **body, char *err, size_t errsz)
{
	return http_request_headers(base_url, method, path, bearer, NULL, json_body, status, body, err, errsz);
}

int http_request_headers(const char *base_url, const char *method, const char *path, const char *bearer,
                         const char *headers, const char *json_body, int *status, char **body, char *err,
                         size_t errsz)
{
	char host[256], prefix[512];
	int port, tls;
	if (http_parse_url(base_url, host, sizeof host, &port, prefix, sizeof prefix, &tls) < 0) {
		snprintf(err, errsz, "SPACED_CP_URL must look like https://HOST:PORT (or http://)");
		return -1;
	}
	size_t blen = json_body ? strlen(json_body) : 0;
	size_t need = strlen(method) + strlen(prefix) + strlen(path) + strlen(host) + (bearer ? strlen(bearer) : 0) +
	              (headers ? strlen(headers) : 0) + 256;
	char *head = malloc(need);
	unsigned char *ans = NULL, *b = NULL;
	size_t alen = 0, bl = 0;
	int r = -1;
	if (head == NULL) {
		snprintf(err, errsz, "out of memory");
		return -1;
	}
	int n = snprintf(head, need,
	                 "%s %s%s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\nAccept: application/json\r\n"
	                 "%s%s%s%sContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
	                 method, prefix, path, host, port, bearer ? "Authorization: Bearer " : "", bearer ? bearer : "",
	                 bearer ? "\r\n" : "", headers ? headers : "", blen);
	if (n < 0 || (size_t)n >= need) {
		snprintf(err, errsz, "request too long");
		goto out;
	}
	if (http_exchange(NULL, host, port, tls, head, (size_t)n, json_body, blen, 120, &ans, &alen, err, errsz) < 0 ||
	    http_parse_answer(ans, alen, status, &b, &bl, NULL, NULL, 0, err, errsz) < 0)
		goto out;
	*body = (char *)b;
	r = 0;
out:
	free(head);
	free(ans);
	return r;
}

/* ---- answer heads, for streamed answers and WebSocket upgrades ---- */

long http_head_length(const unsigned char *in, size_t n)
{
	size_t lim = n < HTTP_HEAD_MAX ? n : HTTP_HEAD_MAX;
	for (size_t i = 3; i < lim; i++)
		if (in[i] == '\n' && in[i - 1] == '\r' && in[i - 2] == '\n' && in[i - 3] == '\r')
			return (long)(i + 1);
	return n >= HTTP_HEAD_MAX ? -1 : 0;
}

int http_head_status(const unsigned char *h, size_t hlen)
{
	if (hlen < 14 || memcmp(h, "HTTP/1.", 7) != 0 || (h[7] != '0' && h[7] != '1') || h[8] != ' ')
		return -1;
	int st = 0;
	for (int i = 9; i < 12; i++) {
		if (h[i] < '0' || h[i] > '9')
			return -1;
		st = st * 10 + (h[i] - '0');
	}
	if ((h[12] != ' ' && h[12] != '\r') || st < 100 || st > 599)
		return -1;
	return st;
}

int http_head_field(const unsigned char *h, size_t hlen, const char *name, char *out, size_t outsz)
{
	size_t nl = strlen(name), i = 0, found = 0, vl = 0;
	const unsigned char *val = NULL;
	/* skip the status line */
	while (i + 1 < hlen && !(h[i] == '\r' && h[i + 1] == '\n'))
		i++;
	i += 2;
	while (i + 1 < hlen) {
		size_t e = i;
		while (e + 1 < hlen && !(h[e] == '\r' && h[e + 1] == '\n'))
			e++;
		if (e + 1 >= hlen || e == i)
			break; /* the blank line ends the head */
		if (e - i > nl && h[i + nl] == ':' && strncasecmp((const char *)h + i, name, nl) == 0) {
			size_t a = i + nl + 1, b = e;
			while (a < b && (h[a] == ' ' || h[a] == '\t'))
				a++;
			while (b > a && (h[b - 1] == ' ' || h[b - 1] == '\t'))
				b--;
			for (size_t k = a; k < b; k++)
				if (h[k] < 0x20 && h[k] != '\t')
					return -2; /* a control byte (NUL included) in a value */
			found++;
			val = h + a;
			vl = b - a;
		}
		i = e + 2;
	}
	if (found == 0)
		return -1;
	if (found > 1 || vl >= outsz)
		return -2;
	memcpy(out, val, vl);
	out[vl] = 0;
	return (int)vl;
}

/* ---- one streamed exchange ---- */

#define STREAM_BUF (256u << 10)

struct http_stream {
	struct net_conn *fd;
	int timeout_ms;
	unsigned char *buf;
	size_t off, len;        /* bytes read, not yet decoded: buf[off, len) */
	struct spaced_http_body body;
	bool until_close;       /* no framing: the body ends when the server closes */
	bool done;
	uint64_t sent;          /* request body bytes sent */
};

/* Waits for events on s->fd within the stream's timeout. Returns the revents,
 * 0 on timeout, -1 on error (err set). */
static int wait_fd(struct http_stream *s, short events, char *err, size_t errsz)
{
	if ((events & POLLIN) && net_pending(s->fd))
		return POLLIN; /* decrypted already: poll() cannot see it */
	struct pollfd pf = {.fd = net_fd(s->fd), .events = events};
	for (;;) {
		int r = poll(&pf, 1, s->timeout_ms);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			snprintf(err, errsz, "poll: %s", strerror(errno));
			return -1;
		}
		if (r == 0) {
			snprintf(err, errsz, "no progress within %d s", s->timeout_ms / 1000);
			return 0;
		}
		return pf.revents;
	}
}

/* Reads what the socket has into the buffer (after moving undecoded bytes to
 * its front). Returns the count, 0 at the end of the connection, -1 on error. */
static long fill(struct http_stream *s, char *err, size_t errsz)
{
	if (s->off > 0) {
		memmove(s->buf, s->buf + s->off, s->len - s->off);
		s->len -= s->off;
		s->off = 0;
	}
	if (s->len == STREAM_BUF) {
		snprintf(err, errsz, "answer head too large");
		return -1;
	}
	for (;;) {
		int ev = wait_fd(s, POLLIN, err, errsz);
		if (ev <= 0)
			return -1;
		ssize_t k = net_recv(s->fd, s->buf + s->len, STREAM_BUF - s->len, MSG_DONTWAIT);
		if (k < 0 && errno == EAGAIN)
			continue;
		if (k < 0) {
			snprintf(err, errsz, "connection broken: %s", strerror(errno));
			return -1;
		}
		s->len += (size_t)k;
		return (long)k;
	}
}

/* Sends p[0..n) while watching for an early answer. Returns 1 when all was
 * sent, 0 when the server answered first (stop sending), -1 on error. */
static int send_watching(struct http_stream *s, const void *p, size_t n, int more, char *err, size_t errsz)
{
	const unsigned char *c = p;
	while (n > 0) {
		int ev = wait_fd(s, POLLIN | POLLOUT, err, errsz);
		if (ev <= 0)
			return -1;
		/* an answer (or the end) before the body is all sent; with TLS only
		 * application bytes count, not records of the protocol alone */
		if ((ev & (POLLHUP | POLLERR)) || ((ev & POLLIN) && net_readable(s->fd)))
			return 0;
		if (!(ev & POLLOUT))
			continue;
		ssize_t k = net_send(s->fd, c, n, MSG_DONTWAIT | (more ? MSG_MORE : 0));
		if (k < 0 && errno == EAGAIN)
			continue;
		if (k < 0) {
			if (errno == EPIPE || errno == ECONNRESET)
				return 0; /* the server may have answered and closed: read that */
			snprintf(err, errsz, "cannot send the request: %s", strerror(errno));
			return -1;
		}
		c += k;
		n -= (size_t)k;
	}
	return 1;
}

/* Sends the body from src (chunked unless its length is known). Returns 1
 * when sent whole, 0 when the server answered first, -1 on error. */
static int send_body_src(struct http_stream *s, const struct http_body_src *src, char *err, size_t errsz)
{
	unsigned char *chunk = malloc(STREAM_BUF + 32);
	if (chunk == NULL) {
		snprintf(err, errsz, "out of memory");
		return -1;
	}
	int r = 1;
	uint64_t left = src->length >= 0 ? (uint64_t)src->length : UINT64_MAX;
	for (;;) {
		size_t want = STREAM_BUF;
		if (src->length >= 0 && left < want)
			want = (size_t)left;
		ssize_t got = want ? src->read(src->arg, chunk + 16, want) : 0;
		if (got < 0) {
			snprintf(err, errsz, "cannot read the request body (standard input)");
			r = -1;
			break;
		}
		if (src->length >= 0) {
			if (got == 0 && left > 0) {
				snprintf(err, errsz, "the request body ended %llu bytes short of its length",
				         (unsigned long long)left);
				r = -1;
				break;
			}
			if (got == 0)
				break;
			left -= (uint64_t)got;
			if ((r = send_watching(s, chunk + 16, (size_t)got, left > 0, err, errsz)) != 1)
				break;
			s->sent += (uint64_t)got;
			continue;
		}
		if (got == 0) {
			r = send_watching(s, "0\r\n\r\n", 5, 0, err, errsz);
			break;
		}
		/* a chunk: its size line before the data, CR LF after it */
		char line[20];
		int ll = snprintf(line, sizeof line, "%zx\r\n", (size_t)got);
		memcpy(chunk + 16 - ll, line, (size_t)ll);
		memcpy(chunk + 16 + got, "\r\n", 2);
		if ((r = send_watching(s, chunk + 16 - ll, (size_t)ll + (size_t)got + 2, 1, err, errsz)) != 1)
			break;
		s->sent += (uint64_t)got;
	}
	free(chunk);
	return r;
}

int http_stream_open(const char *host, int port, int tls, const char *head, size_t headlen, const void *body,
                     size_t blen, const struct http_body_src *src, int timeout_s, struct http_stream **out,
                     struct http_answer_head *ah, char *err, size_t errsz)
{
	struct http_stream *s = calloc(1, sizeof *s);
	if (s == NULL || (s->buf = malloc(STREAM_BUF)) == NULL) {
		free(s);
		snprintf(err, errsz, "out of memory");
		return -1;
	}
	s->timeout_ms = timeout_s * 1000;
	if (net_connect(host, port, tls, timeout_s, &s->fd, err, errsz) < 0) {
		http_stream_close(s);
		return -1;
	}
	int more = src != NULL || blen > 0;
	int r = send_watching(s, head, headlen, more, err, errsz);
	if (r == 1 && blen > 0) {
		r = send_watching(s, body, blen, 0, err, errsz);
		if (r == 1)
			s->sent = blen;
	} else if (r == 1 && src != NULL) {
		r = send_body_src(s, src, err, errsz);
	}
	if (r < 0) {
		http_stream_close(s);
		return -1;
	}
	/* the answer's head (1xx interim answers skipped) */
	long hl;
	for (;;) {
		while ((hl = http_head_length(s->buf + s->off, s->len - s->off)) == 0) {
			long k = fill(s, err, errsz);
			if (k < 0 || (k == 0 && s->len == s->off)) {
				if (k == 0)
					snprintf(err, errsz, "connection closed without an answer");
				http_stream_close(s);
				return -1;
			}
			if (k == 0) {
				snprintf(err, errsz, "answer cut short in its head");
				http_stream_close(s);
				return -1;
			}
		}
		if (hl < 0) {
			snprintf(err, errsz, "malformed answer");
			http_stream_close(s);
			return -1;
		}
		int st = http_head_status(s->buf + s->off, (size_t)hl);
		if (st < 0) {
			snprintf(err, errsz, "malformed answer");
			http_stream_close(s);
			return -1;
		}
		if (st >= 200)
			break;
		s->off += (size_t)hl;
	}
	const unsigned char *h = s->buf + s->off;
	struct http_answer_head a;
	memset(&a, 0, sizeof a);
	a.status = http_head_status(h, (size_t)hl);
	a.content_length = -1;
	char v[64], clv[32];
	int te = http_head_field(h, (size_t)hl, "Transfer-Encoding", v, sizeof v);
	int cl = http_head_field(h, (size_t)hl, "Content-Length", clv, sizeof clv);
	if (te == -2 || cl == -2 || (te >= 0 && strcasecmp(v, "chunked") != 0) || (te >= 0 && cl >= 0)) {
		snprintf(err, errsz, "malformed answer (its framing)");
		http_stream_close(s);
		return -1;
	}
	struct spaced_http_req fake;
	memset(&fake, 0, sizeof fake);
	if (te >= 0) {
		a.chunked = 1;
		fake.body = SPACED_HTTP_BODY_CHUNKED;
	} else if (cl >= 0) {
		char *e = NULL;
		errno = 0;
		unsigned long long n = strtoull(clv, &e, 10);
		if (e == clv || *e != 0 || clv[0] < '0' || clv[0] > '9' || errno != 0 || n > INT64_MAX) {
			snprintf(err, errsz, "malformed answer (Content-Length)");
			http_stream_close(s);
			return -1;
		}
		a.content_length = (int64_t)n;
		fake.body = SPACED_HTTP_BODY_LENGTH;
		fake.content_length = n;
	} else if (a.status == 204 || a.status == 304) {
		fake.body = SPACED_HTTP_BODY_NONE;
	} else {
		s->until_close = true;
	}
	int idn = http_head_field(h, (size_t)hl, "X-Spaced-Identity", a.identity, sizeof a.identity);
	if (idn < 0)
		a.identity[0] = 0;
	a.identity_bad = idn == -2;
	(void)spaced_http_body_start(&s->body, &fake, UINT64_MAX);
	s->done = !s->until_close && (s->body.done || (fake.body == SPACED_HTTP_BODY_LENGTH && fake.content_length == 0));
	s->off += (size_t)hl;
	*ah = a;
	*out = s;
	return 0;
}

uint64_t http_stream_sent(const struct http_stream *s)
{
	return s->sent;
}

long http_stream_next(struct http_stream *s, const unsigned char **data, char *err, size_t errsz)
{
	for (;;) {
		if (s->done)
			return 0;
		if (s->off < s->len) {
			if (s->until_close) {
				*data = s->buf + s->off;
				long k = (long)(s->len - s->off);
				s->off = s->len;
				return k;
			}
			const uint8_t *d;
			size_t dl;
			long used = spaced_http_body_feed(&s->body, s->buf + s->off, s->len - s->off, &d, &dl);
			if (used < 0) {
				snprintf(err, errsz, "malformed answer (its chunked framing)");
				return -1;
			}
			s->off += (size_t)used;
			if (s->body.done)
				s->done = true;
			if (dl > 0) {
				*data = d;
				return (long)dl;
			}
			if (s->done)
				return 0;
			if (used > 0)
				continue;
		}
		long k = fill(s, err, errsz);
		if (k < 0)
			return -1;
		if (k == 0) {
			if (s->until_close) {
				s->done = true;
				return 0;
			}
			snprintf(err, errsz, "answer cut short");
			return -1;
		}
	}
}

void http_stream_close(struct http_stream *s)
{
	if (s == NULL)
		return;
	net_close(s->fd);
	free(s->buf);
	free(s);
}
