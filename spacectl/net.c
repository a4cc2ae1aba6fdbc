/* net.c — spacectl's connections, TCP and TLS (see net.h). */
#include "net.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "tls.h"

struct net_conn {
	int fd;
	SSL *ssl;       /* NULL: plaintext */
	int timeout_ms; /* waits without MSG_DONTWAIT */
	bool drained;   /* TLS: the last read wanted more from the socket (what OpenSSL holds is a partial record) */
};

/* ---- the client context: one per process, for the CA file in force ---- */

static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static SSL_CTX *ctx;
static char ctx_ca[4096]; /* the CA file ctx was made for ("" : the system's) */
static const char *ca_override;

void net_set_ca_file(const char *path)
{
	pthread_mutex_lock(&ctx_mu);
	ca_override = path;
	pthread_mutex_unlock(&ctx_mu);
}

/* A new reference to the context for the CA in force, or NULL with err. */
static SSL_CTX *client_ctx(char *err, size_t errsz)
{
	pthread_mutex_lock(&ctx_mu);
	const char *ca = ca_override ? ca_override : getenv("SPACED_CA_FILE");
	if (ca && !*ca)
		ca = NULL;
	if (ctx && strcmp(ctx_ca, ca ? ca : "") != 0) {
		SSL_CTX_free(ctx); /* connections made with it keep their own reference */
		ctx = NULL;
	}
	if (!ctx) {
		char why[700];
		if (spaced_tls_client_ctx(ca, NULL, NULL, &ctx, why, sizeof why) < 0) {
			snprintf(err, errsz, "%s%s", ca && !ca_override ? "SPACED_CA_FILE: " : "", why);
			ctx = NULL;
		} else {
			snprintf(ctx_ca, sizeof ctx_ca, "%s", ca ? ca : "");
			/* like send(): a partial write is a count, and a retry may come
			 * from a buffer that has moved (ws_client's queue grows) */
			SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
			SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF); /* answers are framed: an end is an end */
			/* records are read ahead, many per system call (not a header
			 * then a body); what waits decrypted or whole is net_pending's */
			SSL_CTX_set_read_ahead(ctx, 1);
			/* a client holds few connections: its buffers stay with them
			 * (released and taken again per record, they are a malloc and a
			 * free every 16 KiB) */
			SSL_CTX_clear_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
			SSL_CTX_set_default_read_buffer_len(ctx, 128 * 1024);
		}
	}
	SSL_CTX *r = ctx;
	if (r)
		SSL_CTX_up_ref(r);
	pthread_mutex_unlock(&ctx_mu);
	return r;
}

/* TLS's own socket I/O: OpenSSL's socket BIO writes with write(2), and a
 * peer that is gone would raise SIGPIPE; this one sends with MSG_NOSIGNAL
 * (no signal mask changed around each call: no system call beyond the I/O). */
static BIO_METHOD *nosig_method;
static pthread_once_t nosig_once = PTHREAD_ONCE_INIT;

static int nosig_write(BIO *b, const char *p, int n)
{
	int fd = (int)(intptr_t)BIO_get_data(b);
	ssize_t w;
	BIO_clear_retry_flags(b);
	do
		w = send(fd, p, (size_t)n, MSG_NOSIGNAL);
	while (w < 0 && errno == EINTR);
	if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		BIO_set_retry_write(b);
	return (int)w;
}

static int nosig_read(BIO *b, char *p, int n)
{
	int fd = (int)(intptr_t)BIO_get_data(b);
	ssize_t k;
	BIO_clear_retry_flags(b);
	do
		k = recv(fd, p, (size_t)n, 0);
	while (k < 0 && errno == EINTR);
	if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		BIO_set_retry_read(b);
	if (k == 0)
		BIO_set_flags(b, BIO_FLAGS_IN_EOF); /* BIO_eof: an end without close_notify is an end */
	return (int)k;
}

static int nosig_puts(BIO *b, const char *str)
{
	return nosig_write(b, str, (int)strlen(str));
}

static long nosig_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	(void)num;
	int fd = (int)(intptr_t)BIO_get_data(b);
	switch (cmd) {
	case BIO_CTRL_FLUSH:
		return 1;
	case BIO_CTRL_EOF: /* SSL_OP_IGNORE_UNEXPECTED_EOF asks it */
		return BIO_test_flags(b, BIO_FLAGS_IN_EOF) != 0;
	case BIO_C_GET_FD: /* SSL_get_fd */
		if (ptr)
			*(int *)ptr = fd;
		return fd;
	default:
		return 0;
	}
}

static void nosig_init(void)
{
	BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR,
	                             "spacectl socket");
	if (m && BIO_meth_set_write(m, nosig_write) == 1 && BIO_meth_set_read(m, nosig_read) == 1 &&
	    BIO_meth_set_puts(m, nosig_puts) == 1 && BIO_meth_set_ctrl(m, nosig_ctrl) == 1) {
		nosig_method = m;
		return;
	}
	BIO_meth_free(m);
}

/* Gives ssl a BIO on fd that never raises SIGPIPE; 0 or -1. */
static int ssl_set_socket(SSL *ssl, int fd)
{
	pthread_once(&nosig_once, nosig_init);
	BIO *b = nosig_method ? BIO_new(nosig_method) : NULL;
	if (!b)
		return -1;
	BIO_set_data(b, (void *)(intptr_t)fd);
	BIO_set_init(b, 1);
	SSL_set_bio(ssl, b, b);
	return 0;
}

/* ---- connecting ---- */

static int tcp_connect(const char *host, int port, int timeout_s, char *err, size_t errsz)
{
	char portstr[16];
	struct timeval tv = {.tv_sec = timeout_s};
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
	char h[256];
	size_t hl = strlen(host);
	/* [v6] as getaddrinfo wants it */
	if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']' && hl - 2 < sizeof h) {
		memcpy(h, host + 1, hl - 2);
		h[hl - 2] = 0;
		host = h;
	}
	snprintf(portstr, sizeof portstr, "%d", port);
	if (getaddrinfo(host, portstr, &hints, &ai) != 0) {
		snprintf(err, errsz, "cannot resolve %s", host);
		return -1;
	}
	int fd = -1, cerr = 0;
	for (struct addrinfo *p = ai; p != NULL; p = p->ai_next) {
		fd = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
		if (fd < 0)
			continue;
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		int one = 1; /* a request is written whole: no waiting for the previous segment's ACK */
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		if (connect(fd, p->ai_addr, p->ai_addrlen) == 0)
			break;
		cerr = errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	if (fd < 0)
		snprintf(err, errsz, "cannot connect to %s:%d: %s", host, port, strerror(cerr ? cerr : ECONNREFUSED));
	return fd;
}

/* Waits for events on c's socket up to its timeout. 1 ready, 0 timed out,
 * -1 on error (errno). */
static int wait_for(struct net_conn *c, short events)
{
	struct pollfd pf = {.fd = c->fd, .events = events};
	for (;;) {
		int r = poll(&pf, 1, c->timeout_ms);
		if (r < 0 && errno == EINTR)
			continue;
		return r < 0 ? -1 : r > 0;
	}
}

int net_connect(const char *host, int port, bool tls, int timeout_s, struct net_conn **out, char *err,
                size_t errsz)
{
	return net_connect_named(host, port, host, tls, timeout_s, out, err, errsz);
}

int net_connect_named(const char *addr, int port, const char *host, bool tls, int timeout_s, struct net_conn **out,
                      char *err, size_t errsz)
{
	struct net_conn *c = calloc(1, sizeof *c);
	if (!c) {
		snprintf(err, errsz, "out of memory");
		return -1;
	}
	c->timeout_ms = timeout_s * 1000;
	if ((c->fd = tcp_connect(addr, port, timeout_s, err, errsz)) < 0) {
		free(c);
		return -1;
	}
	if (!tls) {
		*out = c;
		return 0;
	}
	SSL_CTX *cx = client_ctx(err, errsz);
	if (!cx)
		goto fail;
	c->ssl = SSL_new(cx);
	SSL_CTX_free(cx); /* the SSL holds its own reference */
	if (!c->ssl || spaced_tls_client_bind(c->ssl, host) < 0 || ssl_set_socket(c->ssl, c->fd) < 0) {
		snprintf(err, errsz, "cannot set up TLS for %s", host);
		goto fail;
	}
	fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
	for (;;) {
		ERR_clear_error();
		int r = SSL_connect(c->ssl);
		if (r == 1)
			break;
		int e = SSL_get_error(c->ssl, r);
		if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
			int w = wait_for(c, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT);
			if (w > 0)
				continue;
			snprintf(err, errsz, "TLS with %s:%d: %s", host, port, w == 0 ? "no handshake within the timeout"
			                                                              : strerror(errno));
			goto fail;
		}
		char why[512];
		long v = SSL_get_verify_result(c->ssl);
		spaced_tls_errors(why, sizeof why);
		if (v != X509_V_OK)
			snprintf(err, errsz, "TLS with %s:%d failed: the server's certificate is refused (%s)%s", host, port,
			         X509_verify_cert_error_string(v),
			         v == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY || v == X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN ||
			                 v == X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT
			             ? " (is SPACED_CA_FILE the CA that signed it?)"
			             : "");
		else if (e == SSL_ERROR_SYSCALL || e == SSL_ERROR_ZERO_RETURN)
			snprintf(err, errsz, "TLS with %s:%d failed: the connection ended in the handshake (%s)", host, port,
			         errno ? strerror(errno) : "is it a TLS port?");
		else
			snprintf(err, errsz, "TLS with %s:%d failed: %s", host, port, why);
		goto fail;
	}
	*out = c;
	return 0;
fail:
	ERR_clear_error();
	net_close(c);
	return -1;
}

struct net_conn *net_adopt(int fd)
{
	struct net_conn *c = calloc(1, sizeof *c);
	if (c) {
		c->fd = fd;
		c->timeout_ms = 30000;
	}
	return c;
}

int net_fd(const struct net_conn *c)
{
	return c->fd;
}

bool net_tls(const struct net_conn *c)
{
	return c->ssl != NULL;
}

void net_set_timeout_ms(struct net_conn *c, int timeout_ms)
{
	struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
	c->timeout_ms = timeout_ms;
	setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

/* One TLS call's outcome as send/recv report it: the count, 0 at the end,
 * or -1 with errno; *again when it has to wait for want (POLLIN/POLLOUT). */
static ssize_t tls_result(struct net_conn *c, int r, short *again)
{
	*again = 0;
	if (r > 0)
		return r;
	int e = SSL_get_error(c->ssl, r);
	switch (e) {
	case SSL_ERROR_ZERO_RETURN:
		return 0;
	case SSL_ERROR_WANT_READ:
		*again = POLLIN;
		errno = EAGAIN;
		return -1;
	case SSL_ERROR_WANT_WRITE:
		*again = POLLOUT;
		errno = EAGAIN;
		return -1;
	case SSL_ERROR_SYSCALL:
		if (errno == 0)
			errno = ECONNRESET;
		ERR_clear_error();
		return -1;
	default:
		ERR_clear_error();
		errno = EPROTO;
		return -1;
	}
}

ssize_t net_send(struct net_conn *c, const void *p, size_t n, int flags)
{
	if (!c->ssl) {
		for (;;) {
			ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL | flags);
			if (w < 0 && errno == EINTR)
				continue;
			return w;
		}
	}
	if (n == 0)
		return 0;
	for (;;) {
		short again;
		ERR_clear_error();
		int wr = SSL_write(c->ssl, p, n > INT32_MAX ? INT32_MAX : (int)n);
		ssize_t w = tls_result(c, wr, &again);
		if (w >= 0 || !again)
			return w == 0 ? (errno = EPIPE, -1) : w;
		if (flags & MSG_DONTWAIT)
			return -1;
		int r = wait_for(c, again);
		if (r <= 0) {
			errno = r == 0 ? EAGAIN : errno;
			return -1;
		}
	}
}

ssize_t net_recv(struct net_conn *c, void *p, size_t n, int flags)
{
	if (!c->ssl) {
		for (;;) {
			ssize_t k = recv(c->fd, p, n, flags);
			if (k < 0 && errno == EINTR)
				continue;
			return k;
		}
	}
	for (;;) {
		short again;
		ERR_clear_error();
		int rd = SSL_read(c->ssl, p, n > INT32_MAX ? INT32_MAX : (int)n);
		ssize_t k = tls_result(c, rd, &again);
		c->drained = again == POLLIN;
		if (k >= 0 || !again)
			return k;
		if (flags & MSG_DONTWAIT)
			return -1;
		int r = wait_for(c, again);
		if (r <= 0) {
			errno = r == 0 ? EAGAIN : errno;
			return -1;
		}
	}
}

bool net_pending(const struct net_conn *c)
{
	/* decrypted bytes, or whole records read ahead (unless the last read
	 * found only part of one: then the socket has to bring the rest) */
	return c->ssl && (SSL_pending(c->ssl) > 0 || (SSL_has_pending(c->ssl) && !c->drained));
}

int net_readable(struct net_conn *c)
{
	if (net_pending(c))
		return 1;
	struct pollfd pf = {.fd = c->fd, .events = POLLIN};
	if (poll(&pf, 1, 0) <= 0)
		return 0;
	if (!c->ssl)
		return 1;
	/* something came: application bytes, the end, or only protocol */
	char b;
	ERR_clear_error();
	int r = SSL_peek(c->ssl, &b, 1);
	if (r > 0)
		return 1;
	int e = SSL_get_error(c->ssl, r);
	ERR_clear_error();
	return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? 0 : 1;
}

void net_drop(struct net_conn *c)
{
	if (!c)
		return;
	SSL_free(c->ssl);
	if (c->fd >= 0)
		close(c->fd);
	free(c);
}

void net_close(struct net_conn *c)
{
	if (!c)
		return;
	if (c->ssl) {
		/* close_notify, without waiting for the peer's */
		ERR_clear_error();
		if (SSL_is_init_finished(c->ssl))
			SSL_shutdown(c->ssl);
		ERR_clear_error();
		SSL_free(c->ssl);
	}
	if (c->fd >= 0)
		close(c->fd);
	free(c);
}
