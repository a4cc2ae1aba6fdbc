/*
 * httpsrv.h — the HTTP/1.1 and WebSocket server every spaced daemon faces
 * its clients with, on a libuv loop. It parses with http.h and ws.h (strict:
 * anything ambiguous is refused and the connection closed) and keeps every
 * client to budgets:
 *   - connections in all and per client address (past either, a new
 *     connection is closed at once);
 *   - a request head must be complete within head_timeout_ms of its first
 *     byte, and fit in limits.head_max (431) — so a client trickling header
 *     bytes holds one small buffer for a bounded time and delays no one;
 *   - a body must make progress every body_timeout_ms (408);
 *   - output must move: a connection whose queued output the client has not
 *     taken any of for send_timeout_ms is closed, in any state (an answer
 *     to a client that reads nothing is held that long at most), also when
 *     what waits is only in the socket's kernel buffers (an answer or a
 *     WebSocket under way, nothing queued here);
 *   - an idle kept-alive connection is closed after idle_timeout_ms, and
 *     within about two seconds of going idle holds no buffer (its read
 *     buffer, output stage and TLS record buffers are given back; the next
 *     request takes them again);
 *   - a WebSocket message is at most ws_message_max bytes (1009), text must
 *     be UTF-8 (1007), client frames must be masked (1002).
 * One request at a time per connection: bytes a client sends ahead
 * (pipelining) wait until the current answer has ended.
 *
 * With cfg.tls (an SSL_CTX from tls.h: spaced_tls_server_ctx) every
 * connection speaks TLS (1.2 or 1.3), driven on the same loop (ciphertext in
 * through a memory BIO, out through a BIO that gathers the records in the
 * connection's own write request); nothing else changes for the application. The handshake counts as
 * the start of the first request: the handshake and the first byte of the
 * first request head must come within head_timeout_ms of the accept (a
 * client that opens TCP and says nothing, sends half a ClientHello or stalls
 * mid-handshake holds its slot, under the same budgets, at most that long);
 * bytes that are not TLS are refused (a plaintext HTTP request gets a
 * plaintext 400 naming https://, anything else a TLS alert or nothing) and
 * the connection closed. With a client CA in the context, the name of a
 * verified client certificate is spaced_httpconn_peer_cert(). Over TLS, what
 * the application writes in one turn of the loop is gathered and sealed into
 * records (one per 16 KiB) at the end of that turn, in the loop's check phase:
 * a response's head and body go as one record and one write; queued() counts
 * those bytes too. A daemon of its own gets all this with cfg.tls alone.
 *
 * The application answers through the spaced_httpconn_* calls below and is
 * told about the peer through the callbacks of spaced_httpsrv_ops. Output is
 * queued; spaced_httpconn_queued() tells how much, and on_drain is called
 * when the queue runs low, so a producer can stop and go (flow control).
 */
#ifndef SPACED_HTTPSRV_H
#define SPACED_HTTPSRV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "http.h"

struct spaced_httpsrv;
struct spaced_httpconn;

struct spaced_httpsrv_ops {
	/* A complete, valid request head. The application answers (respond /
	 * write / end), or accepts a WebSocket upgrade (ws_accept), now or
	 * later; a body, if any, arrives through on_body then on_body_end. req
	 * stays valid until the answer ends or the connection closes. */
	void (*on_request)(struct spaced_httpconn *c, const struct spaced_http_req *req);
	void (*on_body)(struct spaced_httpconn *c, const uint8_t *p, size_t n);
	void (*on_body_end)(struct spaced_httpconn *c);
	/* One whole WebSocket message (text is valid UTF-8). */
	void (*on_ws_message)(struct spaced_httpconn *c, bool text, const uint8_t *p, size_t n);
	/* The queued output fell to low_water bytes or less. */
	void (*on_drain)(struct spaced_httpconn *c);
	/* The connection is gone (peer closed, refused, timed out, or closed by
	 * the application): forget c; no call on it is allowed after this. */
	void (*on_close)(struct spaced_httpconn *c);
	/* Optional: a WebSocket control frame came, opcode SPACED_WS_PING (it is
	 * answered with a pong already) or SPACED_WS_PONG; p[0..n) its payload.
	 * Tells a server that sends pings that its peer is alive. */
	void (*on_ws_control)(struct spaced_httpconn *c, uint8_t opcode, const uint8_t *p, size_t n);
};

/* Optional: writes the body of an answer the server gives by itself (400,
 * 408, 413, 414, 417, 431, 501, 505: the connection then closes) into
 * buf[0..cap) and returns its length (at most cap); code names the reason
 * ("SPACED_EPROTO", "SPACED_ETOOBIG", "SPACED_ETIMEDOUT"). The content type
 * is application/json. */
typedef size_t (*spaced_httpsrv_refusal_fn)(int status, const char *code, char *buf, size_t cap);

struct spaced_httpsrv_config {
	const char *host;          /* listen address (numeric IPv4 or IPv6) */
	int port;                  /* 0: any free port (see spaced_httpsrv_port) */
	int listen_fd;             /* >= 0: listen on this bound, listening socket instead */
	struct spaced_http_limits limits;
	uint64_t body_max;         /* largest request body (413); per request: spaced_httpconn_body_max */
	unsigned max_conns;        /* open connections at most */
	unsigned max_conns_per_ip; /* from one client address at most (an IPv6 /64 is one: spaced_caller_key) */
	unsigned head_timeout_ms;  /* a request head must be complete within this of its first byte */
	unsigned idle_timeout_ms;  /* a kept-alive connection waits this long for the next request */
	unsigned body_timeout_ms;  /* a body must make progress within this */
	unsigned send_timeout_ms;  /* queued output must move within this (0: no bound) */
	unsigned body_min_rate;    /* and come at this many bytes a second at least (0: any rate): each
	                              byte moves its deadline 1/rate s on, never past body_timeout_ms
	                              from now, so a trickle ends with 408 */
	size_t ws_message_max;     /* largest WebSocket message a client may send */
	size_t low_water;          /* on_drain below this many queued bytes */
	int sndbuf, rcvbuf;        /* > 0: each connection's SO_SNDBUF / SO_RCVBUF (the kernel holds up
	                              to twice it of unsent output / of input not read, autotuning off);
	                              0: the kernel's autotuning, up to net.ipv4.tcp_wmem's / tcp_rmem's
	                              largest (4 / 32 MiB here) a connection */
	spaced_httpsrv_refusal_fn refusal_body; /* NULL: {"error":"<reason phrase>","code":"<code>"} */
	struct ssl_ctx_st *tls;    /* an SSL_CTX (tls.h) for TLS on every connection, NULL: plaintext;
	                              the server takes a reference of its own */
	const struct spaced_httpsrv_ops *ops;
	void *user;
};

/* Fills cfg with spaced's defaults: head 16 KiB, target 8 KiB, 100 fields,
 * body 1 MiB, 4096 connections, 256 per address, 10 s for a head, 30 s idle,
 * 30 s without body progress and 1 KiB a second at least, 30 s without output
 * progress, WebSocket messages
 * of 1 MiB, low water 64 KiB. */
void spaced_httpsrv_defaults(struct spaced_httpsrv_config *cfg);

/* Binds (unless given a listening socket) and starts serving on loop.
 * Returns 0, SPACED_EINVAL (bad address) or SPACED_ESYS. */
int spaced_httpsrv_start(uv_loop_t *loop, const struct spaced_httpsrv_config *cfg, struct spaced_httpsrv **out);

/* The port it listens on. */
int spaced_httpsrv_port(const struct spaced_httpsrv *s);

void *spaced_httpsrv_user(const struct spaced_httpsrv *s);

/* Stops listening and closes every connection (on_close is called for
 * each); the server is freed once the loop has run its close callbacks. */
void spaced_httpsrv_stop(struct spaced_httpsrv *s);

/* Bytes of output queued on every connection, not yet written to sockets. */
size_t spaced_httpsrv_queued(const struct spaced_httpsrv *s);

/* Counters since the start. */
struct spaced_httpsrv_stats {
	uint64_t accepted, refused_budget, refused_parse, timed_out, requests, ws_opened;
	uint64_t tls_handshakes; /* TLS handshakes completed */
	uint64_t tls_failed;     /* connections closed for a failed handshake or bytes that are not TLS */
	unsigned open;
	size_t buffered; /* bytes of read buffers, output stages and TLS output buffers open connections hold */
};
void spaced_httpsrv_stats(const struct spaced_httpsrv *s, struct spaced_httpsrv_stats *out);

/* ---- one connection ---- */

struct spaced_httpsrv *spaced_httpconn_srv(const struct spaced_httpconn *c);
void *spaced_httpconn_user(const struct spaced_httpconn *c);
void spaced_httpconn_set_user(struct spaced_httpconn *c, void *user);
/* The client's address, as text. */
const char *spaced_httpconn_peer(const struct spaced_httpconn *c);
/* Whether c speaks TLS (its handshake is done once a request has come). */
bool spaced_httpconn_tls(const struct spaced_httpconn *c);
/* The common name of the client certificate c presented and the server
 * verified against its client CA (tls.h, spaced_tls_peer_name), or NULL when
 * there is none (plaintext, no client CA, no certificate sent). */
const char *spaced_httpconn_peer_cert(const struct spaced_httpconn *c);

/* Bounds the body of the current request (before it is read: in on_request). */
void spaced_httpconn_body_max(struct spaced_httpconn *c, uint64_t max);

/* Starts the answer: the status line and headers. length >= 0 sends
 * Content-Length; -1 sends the body chunked. headers: more "name: value\r\n"
 * lines, or NULL. Returns 0, SPACED_EINVAL (an answer was started already). */
int spaced_httpconn_respond(struct spaced_httpconn *c, int status, const char *content_type, int64_t length,
                            const char *headers);
/* A whole small answer: respond + write + end. */
int spaced_httpconn_reply(struct spaced_httpconn *c, int status, const char *content_type, const void *body,
                          size_t len, const char *headers);
/* Body bytes of the answer. */
int spaced_httpconn_write(struct spaced_httpconn *c, const void *p, size_t n);
/* Ends the answer; the connection takes the next request (keep-alive) or
 * closes once its output is written. */
int spaced_httpconn_end(struct spaced_httpconn *c);
/* Closes at once: an answer cut short is visible as such to the client. */
void spaced_httpconn_abort(struct spaced_httpconn *c);

/* Accepts the current request's WebSocket upgrade (101). */
int spaced_httpconn_ws_accept(struct spaced_httpconn *c, const char *headers);
/* Sends one message (opcode SPACED_WS_TEXT or SPACED_WS_BINARY). */
int spaced_httpconn_ws_send(struct spaced_httpconn *c, uint8_t opcode, const void *p, size_t n);
/* The same for a message made of two parts (p1 then p2), without joining them first. */
int spaced_httpconn_ws_send2(struct spaced_httpconn *c, uint8_t opcode, const void *p1, size_t n1, const void *p2,
                             size_t n2);
/* Sends a close frame and closes once it is written (or the peer answers). */
void spaced_httpconn_ws_close(struct spaced_httpconn *c, unsigned code, const char *reason);

/* Stops or resumes reading the client (input flow control). */
void spaced_httpconn_read(struct spaced_httpconn *c, bool on);
/* Bytes of output queued, not yet written to the socket. */
size_t spaced_httpconn_queued(const struct spaced_httpconn *c);

/* From now on c's output handed to its socket and not yet written counts in
 * *account too (an application's share of what its server holds); what is
 * queued now moves there from the previous account; NULL stops counting.
 * *account must stay valid until the connection's on_close has returned:
 * then what c still queues leaves it (or the application sets NULL there). */
void spaced_httpconn_set_account(struct spaced_httpconn *c, size_t *account);
size_t *spaced_httpconn_account(const struct spaced_httpconn *c);

#endif
