/*
 * test-httpsrv — libspaced's HTTP/WebSocket server (httpsrv.c) on a real
 * loopback socket, the loop stepped by the test: a connection refused by the
 * per-address budget is closed and freed cleanly while the accepted one is
 * served, and the addresses of one IPv6 /64 share one budget (in a network
 * namespace of the test's own, fd00::/64 and fd00:0:0:1::/64 on its loopback);
 * a body that trickles in below the minimum rate ends with 408 while one
 * that keeps the rate goes on past the body timeout; an answer its client
 * reads none of is dropped after the send timeout while a slow reader keeps
 * its own; a connection's queued output counts in the account the
 * application names, moves with it and leaves it when the connection
 * closes; the refusal body hook shapes the server's own refusals; a client's
 * ping is answered with a pong and, like a pong, reported through
 * on_ws_control (issue 12); kept-alive connections left idle give back
 * their buffers and are served again.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sched.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <uv.h>

#include "httpsrv.h"
#include "ws.h"

static uv_loop_t loop;
static struct spaced_httpsrv *srv;
static int controls[16], ncontrols;
static struct spaced_httpconn *last_conn; /* the latest connection that asked /acct */
static size_t account_a, account_b;

static void on_request(struct spaced_httpconn *c, const struct spaced_http_req *req)
{
	if (req->websocket) {
		spaced_httpconn_ws_accept(c, NULL);
		return;
	}
	if (req->body != SPACED_HTTP_BODY_NONE)
		return; /* answered once the body is in */
	if (strcmp(req->target, "/acct") == 0) {
		last_conn = c;
		spaced_httpconn_set_account(c, &account_a);
	}
	if (strcmp(req->target, "/open") == 0) {
		/* an answer under way: 64 KiB of a chunked body, not ended (more
		 * would come, as a download's or an exec's) */
		static char part[64u << 10];
		memset(part, 'o', sizeof part);
		spaced_httpconn_respond(c, 200, "text/plain", -1, NULL);
		spaced_httpconn_write(c, part, sizeof part);
		return;
	}
	if (strcmp(req->target, "/mid") == 0) {
		static char mid[256u << 10];
		memset(mid, 'm', sizeof mid);
		spaced_httpconn_reply(c, 200, "text/plain", mid, sizeof mid, NULL);
		return;
	}
	if (strcmp(req->target, "/big") == 0 || strcmp(req->target, "/acct") == 0) {
		static char big[16u << 20];
		memset(big, 'b', sizeof big);
		spaced_httpconn_reply(c, 200, "text/plain", big, sizeof big, NULL);
		return;
	}
	spaced_httpconn_reply(c, 200, "text/plain", "hi", 2, NULL);
}

static void on_body_end(struct spaced_httpconn *c)
{
	spaced_httpconn_reply(c, 200, "text/plain", "in", 2, NULL);
}

static void on_ws_control(struct spaced_httpconn *c, uint8_t opcode, const uint8_t *p, size_t n)
{
	(void)c;
	(void)p;
	(void)n;
	if (ncontrols < 16)
		controls[ncontrols++] = opcode;
}

static const struct spaced_httpsrv_ops ops = {.on_request = on_request, .on_body_end = on_body_end,
                                              .on_ws_control = on_ws_control};

static size_t refusal(int status, const char *code, char *buf, size_t cap)
{
	int n = snprintf(buf, cap, "{\"status\":%d,\"why\":\"%s\"}", status, code);
	return (size_t)n < cap ? (size_t)n : cap;
}

static const char *listen_host = NULL; /* NULL: the defaults' */
static unsigned body_timeout_ms, body_min_rate, send_timeout_ms; /* 0: the defaults' */

static void start(unsigned per_ip, spaced_httpsrv_refusal_fn fn)
{
	struct spaced_httpsrv_config cfg;
	cr_assert_eq(uv_loop_init(&loop), 0);
	spaced_httpsrv_defaults(&cfg);
	if (listen_host)
		cfg.host = listen_host;
	cfg.port = 0;
	if (body_timeout_ms)
		cfg.body_timeout_ms = body_timeout_ms;
	if (body_min_rate)
		cfg.body_min_rate = body_min_rate;
	if (send_timeout_ms)
		cfg.send_timeout_ms = send_timeout_ms;
	cfg.max_conns_per_ip = per_ip;
	cfg.refusal_body = fn;
	cfg.ops = &ops;
	cr_assert_eq(spaced_httpsrv_start(&loop, &cfg, &srv), 0);
	ncontrols = 0;
}

static void stop(void)
{
	spaced_httpsrv_stop(srv);
	uv_run(&loop, UV_RUN_DEFAULT);
	cr_assert_eq(uv_loop_close(&loop), 0);
}

static int client(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)spaced_httpsrv_port(srv))};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(fd >= 0);
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	return fd;
}

/* Runs the loop until fd has bytes or EOF (at most ~5 s); returns what recv
 * gave (0: EOF, -1: nothing). */
static ssize_t step_recv(int fd, char *buf, size_t cap)
{
	for (int i = 0; i < 5000; i++) {
		uv_run(&loop, UV_RUN_NOWAIT);
		ssize_t n = recv(fd, buf, cap, 0);
		if (n >= 0)
			return n;
		if (errno == ECONNRESET)
			return 0;
		struct pollfd p = {.fd = fd, .events = POLLIN};
		poll(&p, 1, 1);
	}
	return -1;
}

static void step_until_stats(uint64_t accepted, uint64_t refused)
{
	struct spaced_httpsrv_stats st;
	for (int i = 0; i < 5000; i++) {
		uv_run(&loop, UV_RUN_NOWAIT);
		spaced_httpsrv_stats(srv, &st);
		if (st.accepted >= accepted && st.refused_budget >= refused)
			return;
		usleep(1000);
	}
	cr_assert_fail("the server never accepted %llu and refused %llu", (unsigned long long)accepted,
	               (unsigned long long)refused);
}

Test(httpsrv, a_connection_over_the_per_address_budget_is_closed_and_the_other_served)
{
	char buf[512];
	start(1, NULL);
	int a = client();
	step_until_stats(1, 0);
	int b = client();
	step_until_stats(1, 1);
	cr_assert_eq(step_recv(b, buf, sizeof buf), 0, "the refused connection is closed without an answer");
	const char req[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
	cr_assert_eq(send(a, req, sizeof req - 1, 0), (ssize_t)(sizeof req - 1));
	ssize_t n = step_recv(a, buf, sizeof buf - 1);
	cr_assert_gt(n, 0);
	buf[n] = 0;
	cr_assert(strncmp(buf, "HTTP/1.1 200 ", 13) == 0, "%s", buf);
	close(a);
	close(b);
	/* once the server saw the first close, the address may connect again */
	struct spaced_httpsrv_stats st;
	for (int i = 0; i < 5000; i++) {
		uv_run(&loop, UV_RUN_NOWAIT);
		spaced_httpsrv_stats(srv, &st);
		if (st.open == 0)
			break;
		usleep(1000);
	}
	cr_assert_eq(st.open, 0);
	int c = client();
	step_until_stats(2, 1);
	cr_assert_eq(send(c, req, sizeof req - 1, 0), (ssize_t)(sizeof req - 1));
	n = step_recv(c, buf, sizeof buf - 1);
	cr_assert_gt(n, 0);
	close(c);
	stop();
}

Test(httpsrv, the_refusal_body_hook_shapes_the_servers_own_refusals)
{
	char buf[1024];
	start(8, refusal);
	int a = client();
	const char bad[] = "GET / HTTP/1.1\nHost: x\n\n";
	cr_assert_eq(send(a, bad, sizeof bad - 1, 0), (ssize_t)(sizeof bad - 1));
	size_t got = 0;
	ssize_t n;
	while ((n = step_recv(a, buf + got, sizeof buf - 1 - got)) > 0)
		got += (size_t)n;
	buf[got] = 0;
	cr_assert(strncmp(buf, "HTTP/1.1 400 ", 13) == 0, "%s", buf);
	static const char want[] = "{\"status\":400,\"why\":\"SPACED_EPROTO\"}";
	char cl[64];
	snprintf(cl, sizeof cl, "content-length: %zu\r\n", sizeof want - 1);
	cr_assert(strstr(buf, want) != NULL && strcmp(strstr(buf, "\r\n\r\n") + 4, want) == 0, "%s", buf);
	cr_assert(strstr(buf, cl) != NULL, "%s", buf);
	close(a);
	stop();
}

Test(httpsrv, pings_and_pongs_are_reported_and_pings_answered)
{
	char buf[1024];
	start(8, NULL);
	int a = client();
	const char up[] = "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
	                  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
	cr_assert_eq(send(a, up, sizeof up - 1, 0), (ssize_t)(sizeof up - 1));
	ssize_t n = step_recv(a, buf, sizeof buf - 1);
	cr_assert_gt(n, 0);
	buf[n] = 0;
	cr_assert(strncmp(buf, "HTTP/1.1 101 ", 13) == 0, "%s", buf);
	/* a masked ping "abc", then a masked pong "z" */
	uint8_t frames[] = {0x89, 0x83, 1, 2, 3, 4, 'a' ^ 1, 'b' ^ 2, 'c' ^ 3, 0x8A, 0x81, 9, 9, 9, 9, 'z' ^ 9};
	cr_assert_eq(send(a, frames, sizeof frames, 0), (ssize_t)sizeof frames);
	n = step_recv(a, buf, sizeof buf);
	cr_assert_eq(n, 5, "one unmasked pong with the ping's payload");
	cr_assert_eq(memcmp(buf, "\x8a\x03" "abc", 5), 0);
	for (int i = 0; i < 1000 && ncontrols < 2; i++)
		uv_run(&loop, UV_RUN_NOWAIT);
	cr_assert_eq(ncontrols, 2);
	cr_assert_eq(controls[0], SPACED_WS_PING);
	cr_assert_eq(controls[1], SPACED_WS_PONG);
	close(a);
	stop();
}

/* A connection to [::1] from src (an address of this namespace's loopback). */
static int client6(const char *src)
{
	struct sockaddr_in6 from = {.sin6_family = AF_INET6}, to = {.sin6_family = AF_INET6,
	                                                            .sin6_port = htons((uint16_t)spaced_httpsrv_port(srv))};
	cr_assert_eq(inet_pton(AF_INET6, src, &from.sin6_addr), 1);
	inet_pton(AF_INET6, "::1", &to.sin6_addr);
	int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(fd >= 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&from, sizeof from), 0, "bind %s: %s", src, strerror(errno));
	cr_assert_eq(connect(fd, (struct sockaddr *)&to, sizeof to), 0, "connect from %s: %s", src, strerror(errno));
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	return fd;
}

Test(httpsrv, the_addresses_of_one_ipv6_64_share_one_budget)
{
	if (unshare(CLONE_NEWNET) < 0)
		cr_skip_test("no network namespace of its own here (%s)", strerror(errno));
	cr_assert_eq(system("ip link set lo up && ip -6 addr add fd00::1/64 dev lo nodad && "
	                    "ip -6 addr add fd00::2/64 dev lo nodad && ip -6 addr add fd00:0:0:1::1/64 dev lo nodad"),
	             0, "the test's addresses");
	listen_host = "::";
	start(1, NULL);
	char buf[64];
	int a = client6("fd00::1");
	step_until_stats(1, 0);
	int b = client6("fd00::2");
	step_until_stats(1, 1);
	cr_assert_eq(step_recv(b, buf, sizeof buf), 0, "another address of the same /64 is over its budget");
	int c = client6("fd00:0:0:1::1");
	step_until_stats(2, 1);
	const char req[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
	cr_assert_eq(send(c, req, sizeof req - 1, 0), (ssize_t)(sizeof req - 1));
	ssize_t n = step_recv(c, buf, sizeof buf - 1);
	cr_assert_gt(n, 0, "an address of another /64 is served");
	buf[n] = 0;
	cr_assert(strncmp(buf, "HTTP/1.1 200 ", 13) == 0, "%s", buf);
	close(a);
	close(b);
	close(c);
	stop();
}

/* Sends n bytes of a body to fd in pieces of piece bytes every gap_ms while
 * stepping the loop; stops early when the server answered (returns the
 * status line's code, or 0 when it never did before the end). */
static int trickle(int fd, size_t n, size_t piece, int gap_ms)
{
	char buf[4096], chunk[4096];
	memset(chunk, 'b', sizeof chunk);
	for (size_t sent = 0; sent < n; sent += piece) {
		send(fd, chunk, piece < n - sent ? piece : n - sent, MSG_NOSIGNAL);
		for (int i = 0; i < gap_ms; i++) {
			uv_run(&loop, UV_RUN_NOWAIT);
			ssize_t got = recv(fd, buf, sizeof buf - 1, 0);
			if (got > 0) {
				buf[got] = 0;
				int status = 0;
				sscanf(buf, "HTTP/1.1 %d", &status);
				return status;
			}
			usleep(1000);
		}
	}
	ssize_t got = step_recv(fd, buf, sizeof buf - 1);
	if (got <= 0)
		return 0;
	buf[got] = 0;
	int status = 0;
	sscanf(buf, "HTTP/1.1 %d", &status);
	return status;
}

Test(httpsrv, a_trickled_body_ends_with_408_a_steady_one_goes_on, .timeout = 60)
{
	body_timeout_ms = 2000;
	body_min_rate = 1000;
	start(8, NULL);
	const char head[] = "PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 32000\r\n\r\n";
	int slow = client(), steady = client();
	cr_assert_eq(send(slow, head, sizeof head - 1, 0), (ssize_t)(sizeof head - 1));
	/* 4 bytes a second, each moving the deadline 4 ms: 408 after about 2 s */
	cr_expect_eq(trickle(slow, 40, 1, 250), 408, "a trickle below the minimum rate");
	/* 8 KB a second for 4 s, twice the body timeout: it is all taken */
	cr_assert_eq(send(steady, head, sizeof head - 1, 0), (ssize_t)(sizeof head - 1));
	cr_expect_eq(trickle(steady, 32000, 2000, 250), 200, "a body at eight times the minimum rate");
	close(slow);
	close(steady);
	stop();
}

/* The loop stepped for ms milliseconds; a reader (fd >= 0) takes up to 64 KiB
 * every 100 ms meanwhile. Returns the bytes it took. */
static size_t step_for(int ms, int fd)
{
	static char buf[65536];
	size_t got = 0;
	for (int i = 0; i < ms; i++) {
		uv_run(&loop, UV_RUN_NOWAIT);
		if (fd >= 0 && i % 100 == 0) {
			ssize_t n = recv(fd, buf, sizeof buf, 0);
			if (n > 0)
				got += (size_t)n;
		}
		usleep(1000);
	}
	return got;
}

/* A client with a small receive buffer (set before it connects) that has
 * sent req and will read nothing. */
static int client_reading_nothing(const char *req)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), small = 4096;
	cr_assert(fd >= 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)spaced_httpsrv_port(srv))};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	cr_assert_eq(send(fd, req, strlen(req), 0), (ssize_t)strlen(req));
	return fd;
}

Test(httpsrv, an_answer_nobody_reads_is_dropped_after_the_send_timeout_a_slow_reader_keeps_its_own, .timeout = 60)
{
	send_timeout_ms = 1000;
	start(8, NULL);
	const char get[] = "GET /big HTTP/1.1\r\nHost: x\r\n\r\n";
	int idle = client_reading_nothing(get), slow = client();
	cr_assert_eq(send(slow, get, sizeof get - 1, 0), (ssize_t)(sizeof get - 1));
	step_for(300, -1);
	struct spaced_httpsrv_stats st;
	spaced_httpsrv_stats(srv, &st);
	cr_assert_eq(st.open, 2);
	cr_assert_gt(spaced_httpsrv_queued(srv), 16u << 20, "both answers wait (%zu bytes)", spaced_httpsrv_queued(srv));
	/* three times the send timeout: the reader that takes 640 KB a second
	 * keeps its answer, the one that takes nothing loses its own */
	size_t got = step_for(3000, slow);
	spaced_httpsrv_stats(srv, &st);
	cr_expect_eq(st.open, 1, "the connection that read nothing is closed (%u open)", st.open);
	cr_expect_geq(st.timed_out, 1);
	cr_expect_gt(got, 1u << 20, "the slow reader took %zu bytes", got);
	/* the answer's head and body are one write: what its socket did not
	 * take at once is held whole until written (at most the 16 MiB body
	 * and its head; both answers held more than 16 MiB) */
	size_t held = spaced_httpsrv_queued(srv);
	cr_expect(held > 8u << 20 && held < (16u << 20) + 512, "only the slow reader's answer is held (%zu bytes)",
	          held);
	close(idle);
	close(slow);
	stop();
	send_timeout_ms = 0;
}

/* What waits may be in the socket's kernel buffers only: an answer under
 * way whose bytes the kernel took at once (nothing queued in the server)
 * to a client that reads none of them is closed after the send timeout all
 * the same; one whose client took its bytes stays (a quiet answer is no
 * stalled client). */
Test(httpsrv, an_answer_under_way_whose_client_reads_nothing_is_closed_though_the_kernel_holds_it_all, .timeout = 60)
{
	send_timeout_ms = 1000;
	start(8, NULL);
	const char get[] = "GET /open HTTP/1.1\r\nHost: x\r\n\r\n";
	int idle = client_reading_nothing(get), reader = client();
	cr_assert_eq(send(reader, get, sizeof get - 1, 0), (ssize_t)(sizeof get - 1));
	size_t got = step_for(300, reader);
	cr_assert_eq(spaced_httpsrv_queued(srv), 0, "the kernel took both answers' bytes (%zu queued)",
	             spaced_httpsrv_queued(srv));
	struct spaced_httpsrv_stats st;
	spaced_httpsrv_stats(srv, &st);
	cr_assert_eq(st.open, 2);
	got += step_for(3000, reader);
	spaced_httpsrv_stats(srv, &st);
	cr_expect_eq(st.open, 1, "the connection whose client read nothing is closed (%u open)", st.open);
	cr_expect_geq(st.timed_out, 1);
	cr_expect_gt(got, 64u << 10, "the reader took its bytes (%zu)", got);
	close(idle);
	close(reader);
	stop();
	send_timeout_ms = 0;
}

Test(httpsrv, a_connections_queued_output_counts_in_its_account_moves_with_it_and_leaves_it_at_close)
{
	start(8, NULL);
	account_a = account_b = 0;
	const char get[] = "GET /acct HTTP/1.1\r\nHost: x\r\n\r\n";
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), small = 4096;
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)spaced_httpsrv_port(srv))};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	cr_assert_eq(send(fd, get, sizeof get - 1, 0), (ssize_t)(sizeof get - 1));
	step_for(300, -1);
	cr_assert_not_null(last_conn);
	size_t q = spaced_httpsrv_queued(srv);
	cr_assert_gt(q, 8u << 20, "the answer waits (%zu bytes)", q);
	cr_expect_eq(account_a, q, "the account holds what the connection queues (%zu of %zu)", account_a, q);
	cr_expect_eq(spaced_httpconn_account(last_conn), &account_a);
	/* the client takes some: the account falls with the queue */
	char buf[65536];
	for (int i = 0; i < 64; i++)
		if (recv(fd, buf, sizeof buf, MSG_DONTWAIT) <= 0)
			break;
	step_for(200, -1);
	q = spaced_httpsrv_queued(srv);
	cr_expect_eq(account_a, q, "after a read: %zu in the account, %zu queued", account_a, q);
	spaced_httpconn_set_account(last_conn, &account_b);
	cr_expect_eq(account_a, 0, "what was queued left the first account");
	cr_expect_eq(account_b, q, "and went to the second (%zu of %zu)", account_b, q);
	close(fd);
	step_for(300, -1);
	cr_expect_eq(spaced_httpsrv_queued(srv), 0);
	cr_expect_eq(account_b, 0, "the closed connection's output left its account (%zu left)", account_b);
	last_conn = NULL;
	stop();
}

/* A client that sends 200 requests at once and reads none of the answers
 * (256 KiB each): the server takes the next request only once what it
 * queued for the connection is written, so it holds about one answer, not
 * 50 MiB (the control plane reached 864 MiB that way); read, every answer
 * comes, in order. */
Test(httpsrv, a_pipelining_client_that_reads_nothing_gets_one_answer_queued_at_a_time, .timeout = 60)
{
	start(8, NULL);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), small = 4096;
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)spaced_httpsrv_port(srv))};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	static char reqs[200 * 40];
	size_t rl = 0;
	for (int i = 0; i < 200; i++)
		rl += (size_t)snprintf(reqs + rl, sizeof reqs - rl, "GET /mid HTTP/1.1\r\nHost: x\r\n\r\n");
	cr_assert_eq(send(fd, reqs, rl, 0), (ssize_t)rl);
	step_for(500, -1);
	size_t q = spaced_httpsrv_queued(srv);
	struct spaced_httpsrv_stats st;
	spaced_httpsrv_stats(srv, &st);
	cr_expect(q <= (256u << 10) + (64u << 10) + 4096, "%zu bytes queued for a client that reads nothing", q);
	cr_expect_lt(st.requests, 40, "%llu requests taken (what the kernel's buffers took, then one)",
	             (unsigned long long)st.requests);
	/* the client reads: every answer comes */
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	size_t total = 0, want = 200 * ((256u << 10) + 1);
	static char buf[65536];
	for (int i = 0; i < 20000 && total < want; i++) {
		uv_run(&loop, UV_RUN_NOWAIT);
		ssize_t n = recv(fd, buf, sizeof buf, 0);
		if (n > 0)
			total += (size_t)n;
		else
			usleep(200);
	}
	spaced_httpsrv_stats(srv, &st);
	cr_expect_eq(st.requests, 200, "%llu requests answered", (unsigned long long)st.requests);
	cr_expect_gt(total, 200 * (256u << 10), "%zu bytes read", total);
	close(fd);
	step_for(100, -1);
	stop();
}

/* Sends one GET on fd and expects "hi" back in a 200. */
static void get_hi(int fd)
{
	const char req[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
	char buf[512];
	cr_assert_eq(send(fd, req, sizeof req - 1, 0), (ssize_t)(sizeof req - 1));
	ssize_t n = step_recv(fd, buf, sizeof buf - 1);
	cr_assert_gt(n, 0);
	buf[n] = 0;
	cr_assert(strncmp(buf, "HTTP/1.1 200 ", 13) == 0 && strstr(buf, "\r\n\r\nhi") != NULL, "%s", buf);
}

Test(httpsrv, idle_kept_alive_connections_give_back_their_buffers_and_are_served_again, .timeout = 60)
{
	enum { N = 20 };
	start(64, NULL);
	int fds[N];
	for (int i = 0; i < N; i++) {
		fds[i] = client();
		get_hi(fds[i]);
	}
	struct spaced_httpsrv_stats st;
	spaced_httpsrv_stats(srv, &st);
	cr_assert_eq(st.open, (unsigned)N);
	cr_assert_geq(st.buffered, (size_t)N * 4096, "each connection that was served holds its read buffer: %zu",
	              st.buffered);
	/* one client is mid-way through a head: its buffer is in use */
	int busy = client();
	const char part[] = "GET / HTTP/1.1\r\nHost:";
	cr_assert_eq(send(busy, part, sizeof part - 1, 0), (ssize_t)(sizeof part - 1));
	step_for(2600, -1); /* two ticks and more */
	spaced_httpsrv_stats(srv, &st);
	cr_assert_eq(st.open, (unsigned)N + 1, "idle connections stay open (idle_timeout_ms is far)");
	cr_assert_gt(st.buffered, 0, "the connection with half a head keeps its buffer");
	cr_assert_lt(st.buffered, (size_t)2 * 131072, "the %d idle connections hold no buffer: %zu in all", N,
	             st.buffered);
	/* and they are served again as before, the half head too once it ends */
	for (int i = 0; i < N; i++)
		get_hi(fds[i]);
	const char rest[] = " x\r\n\r\n";
	char buf[512];
	cr_assert_eq(send(busy, rest, sizeof rest - 1, 0), (ssize_t)(sizeof rest - 1));
	ssize_t n = step_recv(busy, buf, sizeof buf - 1);
	cr_assert_gt(n, 0);
	for (int i = 0; i < N; i++)
		close(fds[i]);
	close(busy);
	stop();
}
