/*
 * net.h — spacectl's connections: TCP, with TLS over it for https:// and
 * wss:// (libspaced/tls.h, OpenSSL). Both HTTP clients (http_client.h) and
 * the WebSocket client (ws_client.h) read and write through these calls, so
 * a scheme is the only difference they see.
 *
 * TLS: the server's chain is verified against the CA file named by
 * SPACED_CA_FILE (else the system's trust store) and its certificate must
 * name the host dialled (an IP address as an IP SAN); there is no way to turn
 * verification off. TLS 1.2 or 1.3.
 *
 * A TLS connection's socket is non-blocking; net_send and net_recv without
 * MSG_DONTWAIT wait (poll) up to the connection's timeout, with MSG_DONTWAIT
 * they fail with EAGAIN instead, as send/recv do. Bytes TLS has decrypted but
 * the caller has not read are invisible to poll(): a caller that polls
 * checks net_pending() first.
 */
#ifndef SPACECTL_NET_H
#define SPACECTL_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct net_conn;

/* Connects to host:port (TCP_NODELAY; waits bounded by timeout_s) and, when
 * tls, runs the TLS handshake, verifying the server. Returns 0 with *out
 * (net_close), or -1 with the reason in err ("cannot connect to …",
 * "TLS with … failed: certificate verify failed (…)"). */
int net_connect(const char *host, int port, bool tls, int timeout_s, struct net_conn **out, char *err,
                size_t errsz);

/* As net_connect, to the address addr, the server's certificate verified
 * (and SNI sent) for the name host: a name the resolver need not know (a
 * ServicePort gateway's PORT-SANDBOX.gw.localhost on 127.0.0.1). */
int net_connect_named(const char *addr, int port, const char *host, bool tls, int timeout_s, struct net_conn **out,
                      char *err, size_t errsz);

/* Makes path the CA file of the TLS connections made from now on, in place
 * of SPACED_CA_FILE (spacectl dev up talks to the cluster it starts with
 * its own CA); NULL: SPACED_CA_FILE again. path must stay valid. */
void net_set_ca_file(const char *path);

/* A plaintext connection over fd, a connected socket (tests, fuzzing; fd < 0:
 * one that is never read or written). Takes fd. Returns NULL without memory. */
struct net_conn *net_adopt(int fd);

/* The socket, for poll(). */
int net_fd(const struct net_conn *c);

/* Whether c speaks TLS. */
bool net_tls(const struct net_conn *c);

/* Changes the timeout of waits without MSG_DONTWAIT (and of the socket's). */
void net_set_timeout_ms(struct net_conn *c, int timeout_ms);

/* Sends up to n bytes (flags: MSG_DONTWAIT; MSG_MORE corks a plaintext
 * socket and is ignored with TLS). Returns the count sent (> 0), or -1 with
 * errno (EAGAIN: it would block / the wait timed out; EPIPE, ECONNRESET:
 * the peer is gone; EPROTO: TLS failed). */
ssize_t net_send(struct net_conn *c, const void *p, size_t n, int flags);

/* Receives up to n bytes (flags: MSG_DONTWAIT). Returns the count (> 0), 0
 * at the end of the stream, or -1 with errno as net_send. */
ssize_t net_recv(struct net_conn *c, void *p, size_t n, int flags);

/* Whether decrypted bytes wait to be read (poll() does not see them). */
bool net_pending(const struct net_conn *c);

/* Whether something for the application has come without blocking: bytes
 * or the end of the stream (1), or nothing (0). TLS records that carry only
 * protocol are consumed on the way. Used to tell an early answer, or a kept
 * connection the server has closed. */
int net_readable(struct net_conn *c);

/* Closes the connection and frees c (NULL is fine). */
void net_close(struct net_conn *c);

/* Frees this process's copy of c without ending the connection (no
 * close_notify): after a fork, in the process that hands it to the other. */
void net_drop(struct net_conn *c);

#endif
