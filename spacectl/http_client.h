/*
 * http_client.h — spacectl's blocking HTTP/1.1 client, http:// and https://
 * (TLS through net.h, verified against SPACED_CA_FILE): one
 * exchange on a new or kept-alive connection (http_exchange), the framing and
 * body of an answer, and a JSON call for the control plane (http_request).
 * The worker side (route cache, recovery, outcomes) is client.h; both send
 * every request through http_exchange.
 *
 * A request is written whole: TCP_NODELAY, and the head corked (MSG_MORE)
 * until its body follows, so no request waits for a delayed ACK.
 */
#ifndef SPACECTL_HTTP_CLIENT_H
#define SPACECTL_HTTP_CLIENT_H

#include <stddef.h>
#include <stdint.h>

struct net_conn;

/* Largest answer read. */
#define HTTP_RESPONSE_MAX (64u << 20)

/* Kept-alive connections (HTTP/1.1 persistent connections). One holder per
 * thread: not locked. A connection is reused only while it has been idle less
 * than HTTP_CONN_IDLE_MS (below node-api's 5 s keep-alive timeout) and the
 * peer has not closed it. */
#define HTTP_CONN_IDLE_MS 2000
#define HTTP_CONNS 8
struct http_conns {
	struct {
		char addr[280]; /* "SCHEME:HOST:PORT" ("" when the slot is free) */
		struct net_conn *conn;
		uint64_t idle_since_ns;
	} c[HTTP_CONNS];
	unsigned long reused, opened; /* counters, for tools and benchmarks */
};

/* Empties k (no connection). */
void http_conns_init(struct http_conns *k);
/* Closes every connection held in k. */
void http_conns_close(struct http_conns *k);

/* Splits http://HOST[:PORT][/prefix] or https://… (port 1–65535, default 80
 * or 443; an IPv6 literal keeps its brackets; a trailing '/' of prefix
 * dropped); *tls is 1 for https://. Returns 0 or -1. */
int http_parse_url(const char *url, char *host, size_t hostsz, int *port, char *prefix, size_t prefixsz, int *tls);

/* Sends head (the whole request head, ending with its blank line) and body
 * (blen bytes, may be 0) to host:port, over TLS when tls — on a connection kept in conns when
 * there is one, else a new one — and reads the whole answer into *answer
 * (malloc'd, NUL-terminated, *len bytes without the NUL). With conns set the
 * connection is kept afterwards when the answer is framed and does not ask
 * to close; without, the request should say "Connection: close". timeout_s
 * bounds each send and receive. Returns 0, or -1 with the transport error in
 * err (the request may or may not have reached the peer). */
int http_exchange(struct http_conns *conns, const char *host, int port, int tls, const char *head, size_t headlen,
                  const void *body, size_t blen, int timeout_s, unsigned char **answer, size_t *len, char *err,
                  size_t errsz);

/* How much of in[0..len) is one whole HTTP/1.1 answer: its length when it is
 * complete (framed by Content-Length or chunked encoding; a 204/304 has no
 * body), 0 when more bytes are needed or its end is the connection's close
 * (no framing), -1 when the head or the chunk framing is malformed. *keep is
 * set to 1 when the connection may carry another request after it (framed,
 * no "Connection: close"). in[len] must be readable and 0. */
long http_answer_length(const unsigned char *in, size_t len, int *keep);

/* Parses one whole answer in[0..len) (as read until the connection closed or
 * http_answer_length found its end): *status, the body (Content-Length or
 * chunked decoded; a chunked body without its final chunk, or one shorter than
 * its Content-Length, is "answer cut short") into *body (malloc'd,
 * NUL-terminated) and *blen, and when header is not NULL that header's value
 * into hval ("" when absent or longer than hvalsz - 1). Returns 0, or -1 with
 * "malformed answer" / "answer cut short" in err. */
int http_parse_answer(const unsigned char *in, size_t len, int *status, unsigned char **body, size_t *blen,
                      const char *header, char *hval, size_t hvalsz, char *err, size_t errsz);


/* ---- answer heads (streamed answers, WebSocket upgrades) ---- */

/* Largest answer head taken. */
#define HTTP_HEAD_MAX 65536

/* The length of the answer head at the start of in[0..n), through its blank
 * line: > 0 when complete, 0 when more bytes are needed, -1 when no blank
 * line comes within HTTP_HEAD_MAX bytes. */
long http_head_length(const unsigned char *in, size_t n);

/* The status of a complete head (HTTP/1.0 or 1.1, three digits, 100-599), or -1. */
int http_head_status(const unsigned char *head, size_t hlen);

/* The value of header field name (any case) of a complete head, without the
 * white space around it, NUL-terminated into out. Returns its length, -1 when
 * the field is absent, -2 when it is given more than once, holds a control
 * byte or does not fit in outsz. */
int http_head_field(const unsigned char *head, size_t hlen, const char *name, char *out, size_t outsz);

/* ---- one streamed exchange: a body of any size each way, bounded memory ---- */

/* A request body read as it is sent. */
struct http_body_src {
	/* Up to n bytes into buf: the count, 0 at the end, -1 on error. */
	long (*read)(void *arg, void *buf, size_t n);
	void *arg;
	int64_t length; /* the body's length when known (Content-Length), else -1 (chunked) */
};

struct http_answer_head {
	int status;
	int chunked;
	int64_t content_length; /* -1 when not given */
	char identity[512];     /* X-Spaced-Identity ("" when absent, repeated or too long) */
	int identity_bad;       /* X-Spaced-Identity was given more than once or malformed */
};

struct http_stream;

/* Connects to host:port (a new connection; TLS when tls), sends head (the whole request
 * head, which should say "Connection: close") and the body — body[0..blen)
 * or, when src is set, src read to its end — while watching the connection:
 * when the server answers before the body is all sent (a refusal), sending
 * stops there. Then reads the answer head (1xx skipped) into *ah. timeout_s
 * bounds each wait for progress. Returns 0 with *out (read the body with
 * http_stream_next, release with http_stream_close), or -1 with the
 * transport failure in err (the request may or may not have reached the
 * server; none of its body may have been read from src, or some). */
int http_stream_open(const char *host, int port, int tls, const char *head, size_t headlen, const void *body,
                     size_t blen, const struct http_body_src *src, int timeout_s, struct http_stream **out,
                     struct http_answer_head *ah, char *err, size_t errsz);

/* Request body bytes sent. */
uint64_t http_stream_sent(const struct http_stream *s);

/* The next bytes of the answer's body (Content-Length or chunked decoded):
 * *data points at them (valid until the next call). Returns their count,
 * 0 at the body's proper end, or -1 with "answer cut short" (the connection
 * ended before the Content-Length or the final chunk), a malformed framing
 * or a transport failure in err. */
long http_stream_next(struct http_stream *s, const unsigned char **data, char *err, size_t errsz);

/* Closes the connection and frees s (NULL is fine). */
void http_stream_close(struct http_stream *s);

/* A JSON call: METHOD base_url+path with an optional bearer key and JSON body
 * on a new connection, waiting at most 120 s. On success *status holds the
 * HTTP status and *body a new NUL-terminated string (free() it; may be empty).
 * Returns 0, or -1 with a reason in err (errsz bytes) for a malformed URL, a
 * connection failure, a timeout or a malformed answer. */
int http_request(const char *base_url, const char *method, const char *path, const char *bearer,
                 const char *json_body, int *status, char **body, char *err, size_t errsz);
/* The same with more request headers ("Name: value\r\n"..., NULL: none). */
int http_request_headers(const char *base_url, const char *method, const char *path, const char *bearer,
                         const char *headers, const char *json_body, int *status, char **body, char *err,
                         size_t errsz);

#endif
