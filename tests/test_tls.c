/*
 * test-tls — TLS in libspaced (tls.c, httpsrv.c): the server on a real
 * loopback socket, its loop on a thread of its own, and OpenSSL clients
 * made by tls.c the way spaced's clients make them (issue 16, item 4).
 *
 * Certificates are issued here by spaced_tls_issue, as `spacectl dev up`
 * issues them: a CA, a server certificate for 127.0.0.1 and localhost, client
 * certificates; a second CA that nothing trusts. Checked: a request over
 * TLS 1.3 with the chain and the name verified; a client trusting another
 * CA, or dialling a name the certificate does not carry, refuses the server;
 * a plaintext request on the TLS port gets a plaintext 400 naming https://
 * and garbage gets nothing; with a client CA a verified client certificate's
 * name reaches the application, no certificate is taken as none, and one from
 * another CA fails the handshake (and a required one is required); a client
 * that says nothing, stops mid-ClientHello or stalls after it is closed by the
 * head deadline, and over the per-address budget at once; bodies of many
 * records go both ways whole; an idle connection gives back its buffers
 * (its read buffer, output stage and TLS record buffers) and is served again.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <uv.h>

#include "spaced_error.h"
#include "httpsrv.h"
#include "tls.h"

static char dir[64];
static char path_buf[16][256];
static int npaths;

/* DIR/name */
static const char *P(const char *name)
{
	char *p = path_buf[npaths++ % 16];
	snprintf(p, 256, "%s/%s", dir, name);
	return p;
}

static void issue(const char *ca, const char *name, const char *cn, const char *sans, bool server)
{
	char err[512], cert[256], key[256], cac[256], cak[256];
	snprintf(cert, sizeof cert, "%s/%s.pem", dir, name);
	snprintf(key, sizeof key, "%s/%s.key", dir, name);
	snprintf(cac, sizeof cac, "%s/%s.pem", dir, ca ? ca : "");
	snprintf(cak, sizeof cak, "%s/%s.key", dir, ca ? ca : "");
	int r = spaced_tls_issue(ca ? cac : NULL, ca ? cak : NULL, cert, key, cn, sans, server, 2, err, sizeof err);
	cr_assert_eq(r, 0, "issue %s: %s", name, err);
}

static void certs(void)
{
	snprintf(dir, sizeof dir, "/tmp/spaced-test-tls.XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	issue(NULL, "ca", "spaced test CA", NULL, false);
	issue(NULL, "other-ca", "another CA", NULL, false);
	issue("ca", "server", "spaced test server", "IP:127.0.0.1,DNS:localhost", true);
	issue("ca", "server-elsewhere", "elsewhere", "IP:127.0.0.2,DNS:elsewhere.test", true);
	issue("ca", "worker-1", "worker-1", NULL, false);
	issue("other-ca", "forged-worker-1", "worker-1", NULL, false);
}

static void rm_certs(void)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	(void)!system(cmd);
}

/* ---- the server, on a thread ---- */

static uv_loop_t loop;
static struct spaced_httpsrv *srv;
static pthread_t srv_thread;
static uv_async_t stop_async;
static atomic_size_t body_bytes;
static SSL_CTX *srv_ctx;

/* /pump: 8 MiB in 4 KiB writes, produced only while what waits is at most
 * low_water and resumed from on_drain (node-api's flow control) */
#define PUMP_TOTAL (8u << 20)
static size_t pumped;
static struct spaced_httpconn *pumping;

static void pump(struct spaced_httpconn *c)
{
	static uint8_t chunk[4096];
	while (pumped < PUMP_TOTAL && spaced_httpconn_queued(c) <= 65536) {
		memset(chunk, (int)(pumped / sizeof chunk), sizeof chunk);
		if (spaced_httpconn_write(c, chunk, sizeof chunk) < 0)
			return;
		pumped += sizeof chunk;
	}
	if (pumped == PUMP_TOTAL) {
		pumping = NULL;
		spaced_httpconn_end(c);
	}
}

static void on_drain(struct spaced_httpconn *c)
{
	if (c == pumping)
		pump(c);
}

static void on_close(struct spaced_httpconn *c)
{
	if (c == pumping)
		pumping = NULL;
}

static void on_request(struct spaced_httpconn *c, const struct spaced_http_req *req)
{
	char body[256];
	atomic_store(&body_bytes, 0);
	if (strcmp(req->target, "/pump") == 0) {
		pumped = 0;
		pumping = c;
		spaced_httpconn_respond(c, 200, "application/octet-stream", PUMP_TOTAL, NULL);
		pump(c);
		return;
	}
	if (strcmp(req->target, "/big") == 0) {
		/* 3 MiB in pieces: many records, a queue that drains */
		static uint8_t chunk[65536];
		for (size_t i = 0; i < sizeof chunk; i++)
			chunk[i] = (uint8_t)(i * 7 + 3);
		spaced_httpconn_respond(c, 200, "application/octet-stream", 48 * (int64_t)sizeof chunk, NULL);
		for (int i = 0; i < 48; i++)
			spaced_httpconn_write(c, chunk, sizeof chunk);
		spaced_httpconn_end(c);
		return;
	}
	if (req->body != SPACED_HTTP_BODY_NONE)
		return; /* answered at on_body_end */
	const char *cn = spaced_httpconn_peer_cert(c);
	int n = snprintf(body, sizeof body, "tls=%d cert=%s", spaced_httpconn_tls(c), cn ? cn : "-");
	spaced_httpconn_reply(c, 200, "text/plain", body, (size_t)n, NULL);
}

static void on_body(struct spaced_httpconn *c, const uint8_t *p, size_t n)
{
	(void)c;
	(void)p;
	atomic_fetch_add(&body_bytes, n);
}

static void on_body_end(struct spaced_httpconn *c)
{
	char body[64];
	int n = snprintf(body, sizeof body, "got %zu", atomic_load(&body_bytes));
	spaced_httpconn_reply(c, 200, "text/plain", body, (size_t)n, NULL);
}

static const struct spaced_httpsrv_ops ops = {.on_request = on_request, .on_body = on_body, .on_body_end = on_body_end,
                                              .on_drain = on_drain, .on_close = on_close};

static void on_stop(uv_async_t *a)
{
	spaced_httpsrv_stop(srv);
	uv_close((uv_handle_t *)a, NULL);
}

static void *run(void *arg)
{
	(void)arg;
	uv_run(&loop, UV_RUN_DEFAULT);
	return NULL;
}

/* Starts a TLS server, with the test CA as its client CA when client_ca. */
static void start(bool client_ca, bool require, unsigned per_ip, unsigned head_ms)
{
	char err[512];
	struct spaced_httpsrv_config cfg;
	certs();
	cr_assert_eq(spaced_tls_server_ctx(P("server.pem"), P("server.key"), client_ca ? P("ca.pem") : NULL, require, &srv_ctx, err,
	                                   sizeof err),
	             0, "%s", err);
	cr_assert_eq(uv_loop_init(&loop), 0);
	spaced_httpsrv_defaults(&cfg);
	cfg.port = 0;
	cfg.tls = srv_ctx;
	cfg.body_max = 8u << 20;
	if (per_ip)
		cfg.max_conns_per_ip = per_ip;
	if (head_ms)
		cfg.head_timeout_ms = head_ms;
	cfg.ops = &ops;
	cr_assert_eq(spaced_httpsrv_start(&loop, &cfg, &srv), 0);
	SSL_CTX_free(srv_ctx); /* the server holds its own reference */
	uv_async_init(&loop, &stop_async, on_stop);
	cr_assert_eq(pthread_create(&srv_thread, NULL, run, NULL), 0);
}

static void stop(void)
{
	uv_async_send(&stop_async);
	pthread_join(srv_thread, NULL);
	cr_assert_eq(uv_loop_close(&loop), 0);
	rm_certs();
}

static void stats(struct spaced_httpsrv_stats *st)
{
	/* read from the test thread: counters only, a torn read is harmless here */
	spaced_httpsrv_stats(srv, st);
}

/* ---- clients ---- */

static int tcp(int timeout_s)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)spaced_httpsrv_port(srv))};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(fd >= 0);
	struct timeval tv = {.tv_sec = timeout_s};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	return fd;
}

struct tclient {
	int fd;
	SSL_CTX *ctx;
	SSL *ssl;
	long verify;
};

/* A TLS client trusting ca (a name under dir) that dials host, with an
 * optional client certificate (name under dir, or NULL). Returns 1 when the
 * handshake succeeded, 0 when it failed. */
static int tconnect(struct tclient *t, const char *ca, const char *host, const char *cert)
{
	char err[512], cc[256], ck[256];
	memset(t, 0, sizeof *t);
	if (cert) {
		snprintf(cc, sizeof cc, "%s/%s.pem", dir, cert);
		snprintf(ck, sizeof ck, "%s/%s.key", dir, cert);
	}
	char cap[256];
	snprintf(cap, sizeof cap, "%s/%s.pem", dir, ca);
	cr_assert_eq(spaced_tls_client_ctx(cap, cert ? cc : NULL, cert ? ck : NULL, &t->ctx, err, sizeof err), 0, "%s",
	             err);
	t->fd = tcp(10);
	t->ssl = SSL_new(t->ctx);
	cr_assert_eq(spaced_tls_client_bind(t->ssl, host), 0);
	SSL_set_fd(t->ssl, t->fd);
	int r = SSL_connect(t->ssl);
	t->verify = SSL_get_verify_result(t->ssl);
	ERR_clear_error();
	return r == 1;
}

static void tclose(struct tclient *t)
{
	SSL_free(t->ssl);
	SSL_CTX_free(t->ctx);
	close(t->fd);
}

/* Sends req and reads until the server closes or len bytes came; returns
 * the count. With TLS 1.3 a client certificate that fails shows here: the
 * server's alert arrives on the first read. */
static size_t exchange(struct tclient *t, const char *req, size_t reqlen, char *buf, size_t cap)
{
	size_t got = 0;
	if (reqlen && SSL_write(t->ssl, req, (int)reqlen) != (int)reqlen) {
		ERR_clear_error();
		return 0;
	}
	while (got < cap - 1) {
		int n = SSL_read(t->ssl, buf + got, (int)(cap - 1 - got));
		if (n <= 0)
			break;
		got += (size_t)n;
		/* a whole small answer: a head and a Content-Length body */
		buf[got] = 0;
		char *h = strstr(buf, "\r\n\r\n"), *cl = strcasestr(buf, "content-length: ");
		if (h && cl && (size_t)(h + 4 - buf) + strtoul(cl + 16, NULL, 10) <= got)
			break;
	}
	ERR_clear_error();
	buf[got] = 0;
	return got;
}

static const char GET[] = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

Test(tls, a_request_over_tls_1_3_with_chain_and_name_verified)
{
	struct tclient t;
	char buf[4096];
	start(false, false, 0, 0);
	cr_assert_eq(tconnect(&t, "ca", "127.0.0.1", NULL), 1, "handshake failed: verify %ld", t.verify);
	cr_assert_eq(SSL_version(t.ssl), TLS1_3_VERSION);
	cr_assert_eq(t.verify, X509_V_OK);
	exchange(&t, GET, sizeof GET - 1, buf, sizeof buf);
	cr_assert(strstr(buf, "HTTP/1.1 200") == buf, "%s", buf);
	cr_assert_not_null(strstr(buf, "tls=1 cert=-"), "%s", buf);
	tclose(&t);
	/* by name too: the certificate carries DNS:localhost */
	cr_assert_eq(tconnect(&t, "ca", "localhost", NULL), 1);
	exchange(&t, GET, sizeof GET - 1, buf, sizeof buf);
	cr_assert(strstr(buf, "HTTP/1.1 200") == buf, "%s", buf);
	tclose(&t);
	struct spaced_httpsrv_stats st;
	stats(&st);
	cr_assert_eq(st.tls_handshakes, 2);
	stop();
}

Test(tls, a_client_trusting_another_ca_refuses_the_server)
{
	struct tclient t;
	start(false, false, 0, 0);
	cr_assert_eq(tconnect(&t, "other-ca", "127.0.0.1", NULL), 0, "a server of another CA was accepted");
	cr_assert_eq(t.verify, X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY, "verify result %ld", t.verify);
	tclose(&t);
	stop();
}

Test(tls, a_client_refuses_a_certificate_that_does_not_name_the_host_it_dialled)
{
	struct tclient t;
	start(false, false, 0, 0);
	/* the server's certificate names 127.0.0.1 and localhost: dialled as
	 * 127.0.0.2 or as another name, it is refused */
	cr_assert_eq(tconnect(&t, "ca", "127.0.0.2", NULL), 0, "a certificate for 127.0.0.1 passed for 127.0.0.2");
	cr_assert_eq(t.verify, X509_V_ERR_IP_ADDRESS_MISMATCH, "verify result %ld", t.verify);
	tclose(&t);
	cr_assert_eq(tconnect(&t, "ca", "elsewhere.test", NULL), 0);
	cr_assert_eq(t.verify, X509_V_ERR_HOSTNAME_MISMATCH, "verify result %ld", t.verify);
	tclose(&t);
	stop();
}

Test(tls, a_plaintext_request_on_the_tls_port_is_refused_in_plaintext_and_garbage_closed)
{
	char buf[1024];
	start(false, false, 0, 0);
	int fd = tcp(10);
	cr_assert_eq(send(fd, GET, sizeof GET - 1, 0), (ssize_t)(sizeof GET - 1));
	size_t got = 0;
	ssize_t n;
	while ((n = recv(fd, buf + got, sizeof buf - 1 - got, 0)) > 0)
		got += (size_t)n;
	buf[got] = 0;
	close(fd);
	cr_assert(strncmp(buf, "HTTP/1.1 400 ", 13) == 0, "answer: %s", buf);
	cr_assert_not_null(strstr(buf, "tls-required"), "%s", buf);
	cr_assert_null(strstr(buf, "tls=1"), "the request was served");
	/* bytes that are neither TLS nor HTTP: closed without a word */
	fd = tcp(10);
	static const uint8_t junk[] = {0x00, 0xff, 0x13, 0x37, 'x', 'y'};
	cr_assert_eq(send(fd, junk, sizeof junk, 0), (ssize_t)sizeof junk);
	cr_assert_eq(recv(fd, buf, sizeof buf, 0), 0, "garbage was answered");
	close(fd);
	/* a TLS record header with garbage inside: the handshake fails */
	fd = tcp(10);
	static const uint8_t bad[] = {0x16, 0x03, 0x01, 0x00, 0x08, 0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3};
	cr_assert_eq(send(fd, bad, sizeof bad, 0), (ssize_t)sizeof bad);
	while ((n = recv(fd, buf, sizeof buf, 0)) > 0) /* an alert, then the end */
		cr_assert(n < 16 && (uint8_t)buf[0] == 0x15, "not an alert: %zd bytes, first 0x%02x", n, (uint8_t)buf[0]);
	cr_assert_eq(n, 0);
	close(fd);
	struct spaced_httpsrv_stats st;
	stats(&st);
	cr_assert_eq(st.tls_failed, 3);
	cr_assert_eq(st.requests, 0);
	stop();
}

Test(tls, mutual_tls_names_a_verified_client_and_refuses_another_ca)
{
	struct tclient t;
	char buf[4096];
	start(true, false, 0, 0);
	/* a client certificate of the CA: its name reaches the application */
	cr_assert_eq(tconnect(&t, "ca", "127.0.0.1", "worker-1"), 1);
	exchange(&t, GET, sizeof GET - 1, buf, sizeof buf);
	cr_assert_not_null(strstr(buf, "cert=worker-1"), "%s", buf);
	tclose(&t);
	/* none: served, with no name (spaced-cp's public API) */
	cr_assert_eq(tconnect(&t, "ca", "127.0.0.1", NULL), 1);
	exchange(&t, GET, sizeof GET - 1, buf, sizeof buf);
	cr_assert_not_null(strstr(buf, "cert=-"), "%s", buf);
	tclose(&t);
	/* the same name from another CA: no request is ever served */
	tconnect(&t, "ca", "127.0.0.1", "forged-worker-1");
	size_t got = exchange(&t, GET, sizeof GET - 1, buf, sizeof buf);
	cr_assert_eq(got, 0, "served a client certificate of another CA: %s", buf);
	tclose(&t);
	struct spaced_httpsrv_stats st;
	stats(&st);
	cr_assert_eq(st.requests, 2);
	cr_assert_eq(st.tls_failed, 1);
	stop();
}

Test(tls, a_required_client_certificate_is_required)
{
	struct tclient t;
	char buf[1024];
	start(true, true, 0, 0);
	tconnect(&t, "ca", "127.0.0.1", NULL);
	cr_assert_eq(exchange(&t, GET, sizeof GET - 1, buf, sizeof buf), 0, "served without a certificate: %s", buf);
	tclose(&t);
	cr_assert_eq(tconnect(&t, "ca", "127.0.0.1", "worker-1"), 1);
	exchange(&t, GET, sizeof GET - 1, buf, sizeof buf);
	cr_assert_not_null(strstr(buf, "cert=worker-1"), "%s", buf);
	tclose(&t);
	stop();
}

/* Waits (bounded) until the server closes fd; 1 when it did. */
static int closed_by_server(int fd, int max_s)
{
	char b[256];
	for (int i = 0; i < max_s * 10; i++) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, 100) > 0) {
			ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
			if (n == 0 || (n < 0 && errno == ECONNRESET))
				return 1;
		}
	}
	return 0;
}

Test(tls, silent_half_hello_and_stalled_handshakes_end_at_the_head_deadline_and_the_budget_holds)
{
	/* per address: 3 connections; the head deadline 3 s */
	start(false, false, 3, 3000);
	int silent = tcp(10);
	/* the first bytes of a ClientHello, then nothing */
	int half = tcp(10);
	static const uint8_t hello_start[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03};
	cr_assert_eq(send(half, hello_start, sizeof hello_start, 0), (ssize_t)sizeof hello_start);
	/* a whole ClientHello from a real client that then never sends its Finished */
	SSL_CTX *cctx = NULL;
	char err[512];
	cr_assert_eq(spaced_tls_client_ctx(P("ca.pem"), NULL, NULL, &cctx, err, sizeof err), 0);
	int stall = tcp(10);
	SSL *ssl = SSL_new(cctx);
	BIO *rb = BIO_new(BIO_s_mem()), *wb = BIO_new(BIO_s_mem());
	SSL_set_bio(ssl, rb, wb);
	SSL_set_connect_state(ssl);
	cr_assert_eq(SSL_do_handshake(ssl), -1); /* wants the server's answer */
	char hello[4096];
	int hl = BIO_read(wb, hello, sizeof hello);
	cr_assert(hl > 0);
	cr_assert_eq(send(stall, hello, (size_t)hl, 0), hl);
	/* the budget: a fourth connection from this address is closed at once */
	int fourth = tcp(10);
	cr_assert_eq(closed_by_server(fourth, 5), 1, "the fourth connection was kept");
	struct spaced_httpsrv_stats st;
	stats(&st);
	cr_assert_eq(st.refused_budget, 1);
	cr_assert_eq(st.timed_out, 0, "a deadline passed before the budget was checked");
	/* the three end by the head deadline (bounded wait, no timing asserted) */
	cr_assert_eq(closed_by_server(silent, 10), 1, "a silent connection was kept");
	cr_assert_eq(closed_by_server(half, 10), 1, "half a ClientHello was kept");
	cr_assert_eq(closed_by_server(stall, 10), 1, "a stalled handshake was kept");
	stats(&st);
	cr_assert_eq(st.timed_out, 3);
	cr_assert_eq(st.tls_handshakes, 0);
	cr_assert_eq(st.open, 0);
	/* and the address is served again */
	struct tclient t;
	cr_assert_eq(tconnect(&t, "ca", "127.0.0.1", NULL), 1);
	tclose(&t);
	SSL_free(ssl);
	SSL_CTX_free(cctx);
	close(silent);
	close(half);
	close(stall);
	close(fourth);
	stop();
}

Test(tls, bodies_of_many_records_pass_whole_both_ways)
{
	struct tclient t;
	static char buf[4u << 20];
	start(false, false, 0, 0);
	cr_assert_eq(tconnect(&t, "ca", "127.0.0.1", NULL), 1);
	/* up: 2.5 MiB in one request, more than the server's read buffer holds at once */
	size_t up = (5u << 20) / 2;
	char head[128];
	int hl = snprintf(head, sizeof head, "PUT /up HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n", up);
	cr_assert_eq(SSL_write(t.ssl, head, hl), hl);
	memset(buf, 'u', up);
	for (size_t off = 0; off < up;) {
		int n = SSL_write(t.ssl, buf + off, (int)(up - off > 100000 ? 100000 : up - off));
		cr_assert(n > 0);
		off += (size_t)n;
	}
	exchange(&t, NULL, 0, buf, 4096);
	char want[64];
	snprintf(want, sizeof want, "got %zu", up);
	cr_assert_not_null(strstr(buf, want), "%s", buf);
	/* down: 3 MiB, checked byte for byte */
	static const char big[] = "GET /big HTTP/1.1\r\nHost: x\r\n\r\n";
	size_t got = exchange(&t, big, sizeof big - 1, buf, sizeof buf);
	char *body = strstr(buf, "\r\n\r\n");
	cr_assert_not_null(body);
	body += 4;
	size_t blen = got - (size_t)(body - buf);
	cr_assert_eq(blen, 48u * 65536, "body of %zu bytes", blen);
	for (size_t i = 0; i < blen; i++)
		if ((uint8_t)body[i] != (uint8_t)((i % 65536) * 7 + 3))
			cr_assert_fail("byte %zu differs", i);
	tclose(&t);
	stop();
}

Test(tls, a_producer_held_to_low_water_is_woken_by_on_drain_until_its_end)
{
	/* node-api's flow control over TLS: small writes while what waits
	 * (sealed and staged) stays under low_water, more from on_drain */
	struct tclient t;
	static char buf[(8u << 20) + 4096];
	start(false, false, 0, 0);
	cr_assert_eq(tconnect(&t, "ca", "127.0.0.1", NULL), 1);
	static const char req[] = "GET /pump HTTP/1.1\r\nHost: x\r\n\r\n";
	size_t got = exchange(&t, req, sizeof req - 1, buf, sizeof buf);
	char *body = strstr(buf, "\r\n\r\n");
	cr_assert_not_null(body, "no answer");
	body += 4;
	size_t blen = got - (size_t)(body - buf);
	cr_assert_eq(blen, PUMP_TOTAL, "the stream stopped after %zu of %u bytes", blen, PUMP_TOTAL);
	for (size_t i = 0; i < blen; i += 4096)
		cr_assert_eq((uint8_t)body[i], (uint8_t)(i / 4096), "4 KiB piece %zu out of order", i / 4096);
	tclose(&t);
	stop();
}

Test(tls, an_idle_connection_gives_back_its_buffers_and_its_next_request_is_served, .timeout = 60)
{
	struct tclient t[4];
	char buf[4096];
	start(false, false, 0, 0);
	for (int i = 0; i < 4; i++) {
		cr_assert_eq(tconnect(&t[i], "ca", "127.0.0.1", NULL), 1);
		exchange(&t[i], GET, sizeof GET - 1, buf, sizeof buf);
		cr_assert(strstr(buf, "HTTP/1.1 200") == buf, "%s", buf);
	}
	struct spaced_httpsrv_stats st;
	stats(&st);
	cr_assert_geq(st.buffered, (size_t)4 * 4096, "%zu", st.buffered);
	sleep(3); /* two of the server's ticks and more: the four are idle */
	stats(&st);
	cr_assert_eq(st.open, 4);
	cr_assert_eq(st.buffered, 0, "idle TLS connections hold no buffer: %zu", st.buffered);
	/* their record buffers went too (SSL_free_buffers): the sessions go on */
	for (int i = 0; i < 4; i++) {
		exchange(&t[i], GET, sizeof GET - 1, buf, sizeof buf);
		cr_assert(strstr(buf, "HTTP/1.1 200") == buf, "%s", buf);
		tclose(&t[i]);
	}
	stop();
}
