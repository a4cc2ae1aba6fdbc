/*
 * ws_client.h — spacectl's WebSocket client (RFC 6455) over one TCP
 * connection, ws:// or wss:// (TLS through net.h), built on libspaced/ws.h
 * (frame parsing, masking, the accept key). It does no I/O of its own accord
 * and keeps no thread: the caller polls ws_client_fd() (not blocking at all
 * while ws_client_pending() says TLS holds decrypted bytes) and calls
 * ws_client_read() when it is readable,
 * ws_client_next() to take the messages that arrived, ws_client_send() to
 * queue a message and ws_client_flush() when the socket is writable. So one
 * poll() loop can carry a stream and the terminal, pipes and signals around
 * it, and stop reading the server while the caller's own output is blocked
 * (backpressure: what the server sends then waits in the kernel and in the
 * server's flow control, not here).
 *
 * Bounds: a message from the server is at most WS_CLIENT_MSG_MAX bytes
 * (fragments included); the read buffer is fixed; what waits to be sent grows
 * only with what the caller queues (ws_client_queued() tells how much).
 * A server frame that is masked, has a reserved bit, an unknown opcode, a
 * fragmented or long control frame, a non-minimal length, text that is not
 * UTF-8, or a close frame with a bad code is a protocol error: a close frame
 * (1002/1007/1009) is queued and the call fails.
 *
 * Every function returns 0 (or a count) on success and a negative SPACED_E*
 * code on failure; ws_client_errmsg() describes the last failure.
 */
#ifndef SPACECTL_WS_CLIENT_H
#define SPACECTL_WS_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Largest message taken from a server. */
#define WS_CLIENT_MSG_MAX (1u << 20)

struct ws_client;

struct ws_client_msg {
	uint8_t opcode;         /* SPACED_WS_TEXT, SPACED_WS_BINARY or SPACED_WS_CLOSE */
	const uint8_t *data;    /* the payload; valid until the next ws_client_read/next/free */
	size_t len;
	unsigned close_code;    /* CLOSE: the server's code (1005 when it gave none) */
	char close_reason[124]; /* CLOSE: its reason, NUL-terminated (control bytes as '?') */
};

/* Connects to host:port (TLS when tls) and opens a WebSocket at target (origin-form, e.g.
 * "/v1/sandboxes/S/exec?argv=sh"), sending "Authorization: Bearer <bearer>"
 * when bearer is not NULL. timeout_s bounds the connection and the
 * handshake. Checks the answer: status 101, Upgrade: websocket,
 * Connection: upgrade and the Sec-WebSocket-Accept of the key sent. Bytes the
 * server sent after its head are kept as the first of the stream. The socket
 * is non-blocking afterwards. Returns 0 with *out (free with ws_client_free),
 * or SPACED_ECLOSED (no connection, it closed, or a signal interrupted the
 * wait: err says "interrupted" and the caller checks its own flags),
 * SPACED_ETIMEDOUT, SPACED_EPROTO (not a WebSocket answer; *http_status is
 * the answer's status when there was one, else 0) or SPACED_ENOMEM; err
 * (errsz bytes) says what happened. Nothing is written to *http_status on
 * success. */
int ws_client_open(const char *host, int port, int tls, const char *target, const char *bearer, int timeout_s,
                   struct ws_client **out, int *http_status, char *err, size_t errsz);

/* A client over fd, a connection whose handshake is done (tests, fuzzing);
 * fd < 0 for one that is only fed (ws_client_feed). The client owns fd. */
int ws_client_adopt(int fd, struct ws_client **out);

/* Closes the connection and frees w (NULL is fine). */
void ws_client_free(struct ws_client *w);

/* The socket, for poll(). */
int ws_client_fd(const struct ws_client *w);

/* Whether bytes TLS decrypted already wait (poll() cannot see them): read
 * them (ws_client_read) before waiting on the socket. */
bool ws_client_pending(const struct ws_client *w);

/* The description of the last failure ("" when none). */
const char *ws_client_errmsg(const struct ws_client *w);

/* Queues one message, masked: opcode (SPACED_WS_TEXT or SPACED_WS_BINARY),
 * payload head[0..hn) followed by p[0..n) (either may be empty), so a
 * one-byte kind prefix needs no copy by the caller. Nothing is written here
 * (ws_client_flush does). Returns 0, SPACED_ECLOSED after a close was queued,
 * SPACED_ETOOBIG (over WS_CLIENT_MSG_MAX), SPACED_ENOMEM. */
int ws_client_send(struct ws_client *w, uint8_t opcode, const void *head, size_t hn, const void *p, size_t n);

/* Queues a close frame with code and reason (at most 123 bytes taken) unless
 * one was queued already. Returns 0 or SPACED_ENOMEM. */
int ws_client_close(struct ws_client *w, unsigned code, const char *reason);

/* Bytes queued, not yet written to the socket. */
size_t ws_client_queued(const struct ws_client *w);

/* Writes what is queued without blocking. Returns 0 when everything is
 * written, 1 when some is left (poll for POLLOUT), SPACED_ECLOSED when the
 * connection is gone. */
int ws_client_flush(struct ws_client *w);

/* Reads what the socket has now (one recv, without blocking) into the read
 * buffer. Returns the number of bytes (> 0), 0 when nothing is there yet,
 * SPACED_ECLOSED when the server closed the connection or it broke (errmsg
 * says which), SPACED_EBUSY when the buffer is full (take messages first).
 * Invalidates the message returned last by ws_client_next. */
int ws_client_read(struct ws_client *w);

/* Appends bytes as if read from the socket (tests, fuzzing). Returns 0 or
 * SPACED_EBUSY when they do not fit. */
int ws_client_feed(struct ws_client *w, const void *p, size_t n);

/* Takes the next whole message out of what was read. Pings are answered
 * (a pong is queued) and pongs dropped without being returned; fragments are
 * put together. Returns 1 with *m filled, 0 when more bytes are needed,
 * SPACED_EPROTO (a close frame with the code is queued) or SPACED_ENOMEM.
 * After a CLOSE message the server sends nothing more; a close answering it
 * is queued unless the client sent one first. */
int ws_client_next(struct ws_client *w, struct ws_client_msg *m);

#endif
