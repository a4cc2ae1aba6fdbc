/*
 * bench_node.c — spaced-node figures, measured against a real spaced-node
 * and spaced-guest started here:
 *   read4k_node_us_p50   GET of a 4 KiB file through node-api (keep-alive,
 *                        capability verified from the warm cache and compared)
 *   read4k_host_us_p50   the same read straight on a spaced-host bridge of the
 *                        same execution (an established guest-protocol
 *                        connection; a second bridge that admits this program)
 *   node_overhead_us_p50 what node-api and the gate add: the two reads
 *                        alternate, and this is the median of the paired
 *                        differences (both see the same load)
 *   verify_compare_share sbx-manager's verify + compare time per request over
 *                        the node p50
 *   rps_2cores           4 KiB reads per second with 64 keep-alive connections
 *   connect_us_p50       a new connection to node-api, ready for a request
 *                        (TCP connect, with TLS the whole handshake)
 * and, before the JSON, the S1 cancellation latency: from sending an install
 * that replaces a terminal's epoch to the terminal's close frame.
 *
 * Everything is measured twice in the same run, on a node-api without TLS
 * (--plaintext) and then on one with TLS (a CA and a certificate for
 * 127.0.0.1 issued here; the client verifies the chain and the address), and
 * the last line holds both and their ratios. BENCH_NODE_TLS=0: plaintext only.
 * Then both again on a spaced-node started with --cpu-latency-us 0 (idle
 * CPUs poll instead of halting while it runs): on a virtual machine whose
 * idle vCPUs halt, every wake-up of a process is a trip through the
 * hypervisor, and a read through node-api has four of them in turn against
 * the direct read's two; "low_latency" in the JSON. BENCH_NODE_LOWLAT=0:
 * not measured.
 * Executions run on the process substrate (spaced-launch + spaced-host); with
 * --dev, as bare spaced-guest processes (then "host" is the guest's socket).
 * The last line is JSON.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cap.h"
#include "spaced_error.h"
#include "guest_client.h"
#include "signer.h"
#include "tls.h"
#include "util.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#define NCONN 64
#define LAT_N 3000
#define RPS_SECONDS 3

static char dir[64], admin[256], token[2048];
static int port;
static pid_t node_pid;
static SSL_CTX *cli_tls; /* NULL: the run without TLS */
#define CONNECT_N 300

static pid_t bench_host;
static json_t *admin_send(const char *line);

static void die(const char *what)
{
	static bool dying;
	fprintf(stderr, "bench-node: %s\n", what);
	if (!dying && node_pid > 0) {
		dying = true;
		json_decref(admin_send("{\"type\":\"destroy\",\"sandbox\":\"S\"}"));
	}
	if (bench_host > 0)
		kill(bench_host, SIGKILL);
	if (node_pid > 0)
		kill(node_pid, SIGTERM);
	exit(1);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

static json_t *admin_send(const char *line)
{
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, admin, strlen(admin));
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
		die("admin socket");
	if (write(fd, line, strlen(line)) < 0 || write(fd, "\n", 1) != 1)
		die("admin write");
	char buf[65536];
	size_t got = 0;
	while (!memchr(buf, '\n', got) && got < sizeof buf - 1) {
		ssize_t r = read(fd, buf + got, sizeof buf - 1 - got);
		if (r <= 0)
			die("admin read");
		got += (size_t)r;
	}
	close(fd);
	return json_loadb(buf, (size_t)((char *)memchr(buf, '\n', got) - buf), 0, NULL);
}

static int tcp_connect_raw(void)
{
	struct sockaddr_in sa;
	memset(&sa, 0, sizeof sa);
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
		die("connect to node-api");
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	return fd;
}

/* A connection to node-api: TCP, or TLS over it in the TLS run. */
struct conn {
	int fd;
	SSL *ssl;
	char buf[65536];
	size_t len;
	uint64_t t0;
	bool busy;
};

/* Returns the bytes of one complete response at the start of buf, 0 when incomplete, -1 on error. */
static long response_size(const char *b, size_t n, int *status)
{
	const char *end = memmem(b, n, "\r\n\r\n", 4);
	if (!end)
		return 0;
	size_t hl = (size_t)(end - b) + 4;
	if (sscanf(b, "HTTP/1.1 %d", status) != 1)
		return -1;
	const char *cl = memmem(b, hl, "content-length:", 15);
	if (cl) {
		long len = strtol(cl + 15, NULL, 10);
		return n >= hl + (size_t)len ? (long)hl + len : 0;
	}
	size_t pos = hl;
	for (;;) {
		const char *crlf = memmem(b + pos, n - pos, "\r\n", 2);
		if (!crlf)
			return 0;
		unsigned long sz = strtoul(b + pos, NULL, 16);
		size_t start = (size_t)(crlf - b) + 2;
		if (n < start + sz + 2)
			return 0;
		pos = start + sz + 2;
		if (sz == 0)
			return (long)pos;
	}
}

/* Connects c (blocking), with the TLS handshake in the TLS run (the chain
 * and 127.0.0.1 verified). */
static void conn_open(struct conn *c)
{
	c->fd = tcp_connect_raw();
	c->ssl = NULL;
	c->len = 0;
	if (!cli_tls)
		return;
	c->ssl = SSL_new(cli_tls);
	if (!c->ssl || spaced_tls_client_bind(c->ssl, "127.0.0.1") < 0 || SSL_set_fd(c->ssl, c->fd) != 1 ||
	    SSL_connect(c->ssl) != 1) {
		ERR_print_errors_fp(stderr);
		die("TLS handshake with node-api");
	}
}

static void conn_close(struct conn *c)
{
	if (c->ssl) {
		SSL_shutdown(c->ssl);
		SSL_free(c->ssl);
		c->ssl = NULL;
	}
	close(c->fd);
}

static ssize_t conn_read(struct conn *c, void *p, size_t n)
{
	if (!c->ssl)
		return read(c->fd, p, n);
	int r = SSL_read(c->ssl, p, (int)n);
	return r > 0 ? r : -1;
}

static int conn_write(struct conn *c, const void *p, size_t n)
{
	if (!c->ssl)
		return write(c->fd, p, n) == (ssize_t)n ? 0 : -1;
	return SSL_write(c->ssl, p, (int)n) == (int)n ? 0 : -1;
}

static char req[4096];
static size_t req_len;

static void send_req(struct conn *c)
{
	c->t0 = spaced_mono_ns();
	if (conn_write(c, req, req_len) < 0)
		die("request write");
	c->busy = true;
}

/* Blocks until the response on c is complete. */
static int wait_response(struct conn *c)
{
	int status = 0;
	for (;;) {
		long sz = response_size(c->buf, c->len, &status);
		if (sz < 0)
			die("bad response");
		if (sz > 0) {
			memmove(c->buf, c->buf + sz, c->len - (size_t)sz);
			c->len -= (size_t)sz;
			c->busy = false;
			return status;
		}
		ssize_t r = conn_read(c, c->buf + c->len, sizeof c->buf - c->len);
		if (r <= 0)
			die("response read");
		c->len += (size_t)r;
	}
}

static json_t *status_json(void)
{
	json_t *s = admin_send("{\"type\":\"status\"}");
	if (!s)
		die("status");
	json_t *r = json_incref(json_object_get(s, "result"));
	json_decref(s);
	return r;
}

static int read_exact(struct conn *c, void *p, size_t n)
{
	uint8_t *b = p;
	while (n) {
		ssize_t r = conn_read(c, b, n);
		if (r <= 0)
			return -1;
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

static double cancel_latency_ms(const struct spaced_secret_key *sk, uint64_t *gen_act)
{
	/* a capability for the activation installed now */
	struct spaced_cap cap;
	char act[32], *tok;
	memset(&cap, 0, sizeof cap);
	snprintf(act, sizeof act, "act-%llu", (unsigned long long)*gen_act);
	spaced_identity_set(&cap.id, "S", 1, "w-bench", "process", act, NULL);
	cap.cls = SPACED_CLASS_CONTROL;
	cap.purposes = SPACED_PURPOSE_TERM;
	cap.iat = cap.nbf = spaced_now();
	cap.exp = cap.iat + SPACED_CAP_LIFETIME;
	snprintf(cap.jti, sizeof cap.jti, "bench-term-%llu", (unsigned long long)*gen_act);
	if (spaced_cap_issue(sk, &cap, &tok) < 0)
		die("issue");
	/* a terminal through node-api, then an activation change for the same generation */
	struct conn *fd = calloc(1, sizeof *fd);
	if (!fd)
		die("memory");
	conn_open(fd);
	char h[4096];
	int n = snprintf(h, sizeof h,
	                 "GET /v1/sandboxes/S/term?argv=/bin/cat HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
	                 "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
	                 "Sec-WebSocket-Version: 13\r\nAuthorization: Bearer %s\r\n\r\n",
	                 tok);
	free(tok);
	if (conn_write(fd, h, (size_t)n) < 0)
		die("ws write");
	char buf[65536];
	size_t got = 0;
	/* the upgrade and the ALLOW message */
	while (!(memmem(buf, got, "\r\n\r\n", 4) && memmem(buf, got, "ALLOW", 5))) {
		ssize_t r = conn_read(fd, buf + got, sizeof buf - got);
		if (r <= 0) {
			fprintf(stderr, "%.*s\n", (int)got, buf);
			die("ws open");
		}
		got += (size_t)r;
	}
	char line[1024];
	(*gen_act)++;
	snprintf(line, sizeof line,
	         "{\"type\":\"install\",\"identity\":{\"sandbox\":\"S\",\"generation\":1,\"worker\":\"w-bench\","
	         "\"substrate\":\"process\",\"activation\":\"act-%llu\",\"pod_uid\":null}}",
	         (unsigned long long)*gen_act);
	uint64_t t0 = spaced_mono_ns();
	json_t *a = admin_send(line);
	json_decref(a);
	/* wait for the close frame (opcode 8) */
	for (;;) {
		uint8_t b2[2];
		if (read_exact(fd, b2, 2) < 0)
			die("ws close read");
		size_t plen = b2[1] & 0x7f;
		if (plen == 126) {
			uint8_t e[2];
			if (read_exact(fd, e, 2) < 0)
				die("ws read");
			plen = (size_t)e[0] << 8 | e[1];
		}
		char p[65536];
		size_t left = plen;
		while (left) {
			ssize_t r = conn_read(fd, p, left > sizeof p ? sizeof p : left);
			if (r <= 0)
				die("ws read");
			left -= (size_t)r;
		}
		if ((b2[0] & 0x0f) == 8)
			break;
	}
	uint64_t t1 = spaced_mono_ns();
	conn_close(fd);
	free(fd);
	return (double)(t1 - t0) / 1e6;
}

static pid_t spawn(const char *const argv[])
{
	pid_t p = fork();
	if (p == 0) {
		int nul = open("/dev/null", O_WRONLY);
		dup2(nul, 1);
		if (!getenv("BENCH_NODE_VERBOSE"))
			dup2(nul, 2);
		execv(argv[0], (char *const *)(uintptr_t)argv);
		_exit(127);
	}
	return p;
}

struct results {
	double node_p50, node_p99, host_p50, overhead, vc_us, hits, nreq, share, rps, secs, cancel_p50, cancel_max;
	double connect_p50, connect_p99;
	unsigned long long bad;
};

/* The worker's egress namespace outlives spaced-node (its executions keep
 * their network across restarts): taken down here as `spacectl dev down`
 * does, pasta and spaced-netd stopped, the namespace unmounted. */
static void egress_down(const char *state)
{
	static const char *const pidfiles[] = {"pasta.pid", "netd.pid"};
	char path[256];
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof path, "%s/net/%s", state, pidfiles[i]);
		FILE *f = fopen(path, "r");
		long pid = 0;
		if (f && fscanf(f, "%ld", &pid) == 1 && pid > 1)
			kill((pid_t)pid, SIGTERM);
		if (f)
			fclose(f);
	}
	snprintf(path, sizeof path, "%s/net/ns", state);
	umount2(path, MNT_DETACH);
}

/* One whole measurement on a spaced-node started here: without TLS, or with
 * it (tls: the certificate and key for node-api; the client trusts ca). */
static void run(bool dev, struct spaced_secret_key *sk, const char *bundle, bool tls, bool lowlat,
                struct results *R)
{
	const char *node_bin = SPACED_NODE_BIN;
	const char *guest_bin = SPACED_GUEST_BIN;
	char state[128], crt[128], key[128], ca[128], err[600];
	snprintf(state, sizeof state, "%s/w-%s%s", dir, tls ? "tls" : "plain", lowlat ? "-lowlat" : "");
	snprintf(admin, sizeof admin, "%s/admin.sock", state);
	snprintf(crt, sizeof crt, "%s/node.pem", dir);
	snprintf(key, sizeof key, "%s/node.key", dir);
	snprintf(ca, sizeof ca, "%s/ca.pem", dir);
	port = 0;
	bench_host = 0;
	cli_tls = NULL;
	if (tls && spaced_tls_client_ctx(ca, NULL, NULL, &cli_tls, err, sizeof err) < 0) {
		fprintf(stderr, "bench-node: %s\n", err);
		die("TLS client context");
	}
	node_pid = fork();
	if (node_pid == 0) {
		int nul = open("/dev/null", O_WRONLY);
		if (!getenv("BENCH_NODE_VERBOSE"))
			dup2(nul, 2);
		const char *a[32] = {node_bin, "--state", state, "--worker-id", "w-bench", "--listen", "127.0.0.1:0",
		                     "--keys", bundle, "--guest-bin", guest_bin};
		int n = 11;
		if (!dev) {
			a[n++] = "--launcher";
			a[n++] = SPACED_LAUNCH_BIN;
			a[n++] = "--host";
			a[n++] = SPACED_HOST_BIN;
		}
		if (tls) {
			a[n++] = "--tls-cert";
			a[n++] = crt;
			a[n++] = "--tls-key";
			a[n++] = key;
		} else {
			a[n++] = "--plaintext";
		}
		if (lowlat) {
			a[n++] = "--cpu-latency-us";
			a[n++] = "0";
		}
		a[n] = NULL;
		execv(node_bin, (char *const *)(uintptr_t)a);
		_exit(127);
	}
	char pf[192];
	snprintf(pf, sizeof pf, "%s/api.port", state);
	for (int i = 0; i < 500 && port == 0; i++) {
		struct stat st;
		FILE *p = fopen(pf, "r");
		if (p) {
			if (fscanf(p, "%d", &port) != 1)
				port = 0;
			fclose(p);
		}
		if (port && stat(admin, &st) != 0)
			port = 0;
		if (!port)
			usleep(10000);
	}
	if (!port)
		die("spaced-node did not start");
	json_t *a = admin_send("{\"type\":\"install\",\"identity\":{\"sandbox\":\"S\",\"generation\":1,\"worker\":"
	                       "\"w-bench\",\"substrate\":\"process\",\"activation\":\"act-0\",\"pod_uid\":null}}");
	if (!a || !json_is_true(json_object_get(a, "ok")))
		die("install");
	json_decref(a);

	/* a 4 KiB file, written straight on the execution's socket: in substrate
	 * mode a second bridge of the same execution that admits this program */
	char sock[256];
	snprintf(sock, sizeof sock, "%s/run/S.1.sock", state);
	if (!dev) {
		json_t *st = status_json();
		json_t *r0 = json_array_get(json_object_get(st, "records"), 0);
		char lpid[32], me[32], gsock[256];
		snprintf(lpid, sizeof lpid, "%lld", (long long)json_integer_value(json_object_get(r0, "pid")));
		snprintf(me, sizeof me, "%d", (int)getpid());
		json_decref(st);
		snprintf(gsock, sizeof gsock, "%s/exec/S.1/guest.sock", state);
		snprintf(sock, sizeof sock, "%s/bench-host.sock", state);
		const char *hargv[] = {SPACED_HOST_BIN, "--listen", sock, "--guest", gsock, "--identity",
		                       "sandbox=S;generation=1;worker=w-bench;substrate=process;activation=act-0;pod_uid=",
		                       "--launcher-pid", lpid, "--launcher-exe", SPACED_LAUNCH_BIN, "--manager-uid", "0",
		                       "--manager-pid", me, NULL};
		bench_host = spawn(hargv);
		struct stat sb;
		for (int i = 0; i < 500 && stat(sock, &sb) != 0; i++)
			usleep(10000);
	}
	struct spaced_guest_client *gc;
	if (spaced_guest_client_connect(sock, &gc) < 0)
		die("guest connect");
	uint8_t data[4096];
	for (size_t i = 0; i < sizeof data; i++)
		data[i] = (uint8_t)i;
	int we = spaced_guest_fs_write(gc, "/tmp/f4k", data, sizeof data, 0644, 0);
	if (we < 0) {
		fprintf(stderr, "bench-node: %s: %s\n", spaced_strerror(we), spaced_guest_client_errmsg(gc));
		die("guest write");
	}

	uint64_t *lat = calloc(LAT_N, sizeof *lat), *lat_h = calloc(LAT_N, sizeof *lat_h);
	int64_t *diff = calloc(LAT_N, sizeof *diff);

	/* one capability, reused: the verification cache is warm after the first request */
	struct spaced_cap cap;
	memset(&cap, 0, sizeof cap);
	spaced_identity_set(&cap.id, "S", 1, "w-bench", "process", "act-0", NULL);
	cap.cls = SPACED_CLASS_CONTROL;
	cap.purposes = SPACED_PURPOSE_FS_READ | SPACED_PURPOSE_TERM;
	cap.iat = cap.nbf = spaced_now();
	cap.exp = cap.iat + SPACED_CAP_LIFETIME;
	snprintf(cap.jti, sizeof cap.jti, "bench-%d", (int)getpid());
	char *tok;
	if (spaced_cap_issue(sk, &cap, &tok) < 0)
		die("issue");
	snprintf(token, sizeof token, "%s", tok);
	free(tok);
	req_len = (size_t)snprintf(req, sizeof req,
	                           "GET /v1/sandboxes/S/files?path=/tmp/f4k HTTP/1.1\r\nHost: x\r\n"
	                           "Authorization: Bearer %s\r\n\r\n",
	                           token);

	/* a new connection, ready for a request: TCP connect (+ the TLS handshake).
	 * Each is then used for one request (not measured) before it is closed,
	 * as a client would: hundreds of connections opened and dropped unused
	 * faster than node-api sees them end would meet its per-address budget */
	uint64_t *con = calloc(CONNECT_N, sizeof *con);
	struct conn *nc = calloc(1, sizeof *nc);
	if (!con || !nc)
		die("memory");
	for (int i = 0; i < CONNECT_N; i++) {
		uint64_t t0 = spaced_mono_ns();
		conn_open(nc);
		con[i] = spaced_mono_ns() - t0;
		send_req(nc);
		if (wait_response(nc) != 200)
			die("read on a new connection refused");
		conn_close(nc);
	}
	free(nc);
	qsort(con, CONNECT_N, sizeof *con, cmp_u64);
	R->connect_p50 = (double)con[CONNECT_N / 2] / 1000.0;
	R->connect_p99 = (double)con[CONNECT_N * 99 / 100] / 1000.0;
	free(con);

	/* read4k_node_us_p50 and the verify + compare share */
	struct conn *c = calloc(1, sizeof *c);
	conn_open(c);
	send_req(c);
	if (wait_response(c) != 200)
		die("first read through node-api refused");
	/* the two reads alternate, so that both see the same machine: each pair
	 * gives one difference, and the overhead is the median difference */
	json_t *s0 = status_json();
	for (int i = 0; i < LAT_N; i++) {
		struct spaced_buf out;
		spaced_buf_init(&out, 8192);
		uint64_t t0 = spaced_mono_ns();
		if (spaced_guest_fs_read(gc, "/tmp/f4k", 0, UINT64_MAX, &out) < 0 || out.len != 4096)
			die("guest read");
		lat_h[i] = spaced_mono_ns() - t0;
		spaced_buf_free(&out);
		send_req(c);
		if (wait_response(c) != 200)
			die("read through node-api failed");
		lat[i] = spaced_mono_ns() - c->t0;
		diff[i] = (int64_t)lat[i] - (int64_t)lat_h[i];
	}
	json_t *s1 = status_json();
	conn_close(c);
	spaced_guest_client_free(gc);
	qsort(lat, LAT_N, sizeof *lat, cmp_u64);
	qsort(lat_h, LAT_N, sizeof *lat_h, cmp_u64);
	qsort(diff, LAT_N, sizeof *diff, cmp_i64);
	double node_p50 = (double)lat[LAT_N / 2] / 1000.0;
	double host_p50 = (double)lat_h[LAT_N / 2] / 1000.0;
	double overhead = (double)diff[LAT_N / 2] / 1000.0;
	double vc_ns = (double)(json_integer_value(json_object_get(s1, "verify_compare_ns")) -
	                        json_integer_value(json_object_get(s0, "verify_compare_ns")));
	double nreq = (double)(json_integer_value(json_object_get(s1, "requests")) -
	                       json_integer_value(json_object_get(s0, "requests")));
	double hits = (double)(json_integer_value(json_object_get(s1, "vcache_hits")) -
	                       json_integer_value(json_object_get(s0, "vcache_hits")));
	double vc_us = nreq > 0 ? vc_ns / nreq / 1000.0 : 0;
	double share = node_p50 > 0 ? vc_us / node_p50 : 0;
	json_decref(s0);
	json_decref(s1);

	/* rps with 64 connections */
	struct conn *cs = calloc(NCONN, sizeof *cs);
	struct pollfd pfd[NCONN];
	for (int i = 0; i < NCONN; i++) {
		conn_open(&cs[i]);
		pfd[i].fd = cs[i].fd;
		pfd[i].events = POLLIN;
		send_req(&cs[i]);
	}
	uint64_t done = 0, bad = 0, start = spaced_mono_ns(), until = start + RPS_SECONDS * 1000000000ull;
	while (spaced_mono_ns() < until) {
		if (poll(pfd, NCONN, 1000) <= 0)
			continue;
		for (int i = 0; i < NCONN; i++) {
			if (!(pfd[i].revents & POLLIN))
				continue;
			struct conn *k = &cs[i];
			do { /* with TLS, until nothing decrypted waits (poll() cannot see it) */
				ssize_t r = conn_read(k, k->buf + k->len, sizeof k->buf - k->len);
				if (r <= 0)
					die("rps read");
				k->len += (size_t)r;
				int st;
				long sz;
				while ((sz = response_size(k->buf, k->len, &st)) > 0) {
					memmove(k->buf, k->buf + sz, k->len - (size_t)sz);
					k->len -= (size_t)sz;
					done++;
					bad += st != 200;
					send_req(k);
				}
				if (sz < 0)
					die("rps parse");
			} while (k->ssl && SSL_pending(k->ssl) > 0);
		}
	}
	double secs = (double)(spaced_mono_ns() - start) / 1e9;
	double rps = (double)done / secs;
	for (int i = 0; i < NCONN; i++)
		conn_close(&cs[i]);

	/* S1 cancellation latency */
	double cl[15];
	uint64_t act = 0;
	for (int i = 0; i < 15; i++)
		cl[i] = cancel_latency_ms(sk, &act);
	for (int i = 0; i < 15; i++)
		for (int j = i + 1; j < 15; j++)
			if (cl[j] < cl[i]) {
				double t = cl[i];
				cl[i] = cl[j];
				cl[j] = t;
			}

	R->node_p50 = node_p50;
	R->node_p99 = (double)lat[LAT_N * 99 / 100] / 1000.0;
	R->host_p50 = host_p50;
	R->overhead = overhead;
	R->vc_us = vc_us;
	R->hits = hits;
	R->nreq = nreq;
	R->share = share;
	R->rps = rps;
	R->secs = secs;
	R->bad = (unsigned long long)bad;
	R->cancel_p50 = cl[7];
	R->cancel_max = cl[14];

	/* stop the execution and the node */
	json_decref(admin_send("{\"type\":\"destroy\",\"sandbox\":\"S\"}"));
	if (bench_host > 0) {
		kill(bench_host, SIGTERM);
		waitpid(bench_host, NULL, 0);
	}
	kill(node_pid, SIGTERM);
	waitpid(node_pid, NULL, 0);
	node_pid = 0;
	egress_down(state);
	SSL_CTX_free(cli_tls);
	cli_tls = NULL;
	free(lat);
	free(lat_h);
	free(diff);
	free(c);
	free(cs);
}

static void report(const char *name, bool dev, const struct results *r)
{
	printf("-- %s\n", name);
	printf("new connection to node-api, ready for a request: p50 %.1f us, p99 %.1f us (%d)\n", r->connect_p50,
	       r->connect_p99, CONNECT_N);
	printf("read4k through node-api: p50 %.1f us, p99 %.1f us (%d reads, keep-alive)\n", r->node_p50, r->node_p99,
	       LAT_N);
	printf("read4k straight on %s: p50 %.1f us\n", dev ? "the guest socket (--dev)" : "a spaced-host bridge",
	       r->host_p50);
	printf("what node-api and the gate add over the direct read: %.1f us (median of %d paired differences; "
	       "target <= 40)\n",
	       r->overhead, LAT_N);
	printf("verify + compare in sbx-manager: %.2f us per request (%.0f of %.0f from the cache)\n", r->vc_us, r->hits,
	       r->nreq);
	printf("64 connections: %.0f requests/s over %.1f s (%llu non-200)\n", r->rps, r->secs, r->bad);
	printf("S1 stream cancel after install: p50 %.2f ms, max %.2f ms (15 runs)\n", r->cancel_p50, r->cancel_max);
}

static void json_of(const struct results *r)
{
	printf("{\"read4k_node_us_p50\":%.1f,\"read4k_host_us_p50\":%.1f,\"node_overhead_us_p50\":%.1f,"
	       "\"verify_compare_share\":%.4f,\"rps_2cores\":%.0f,\"connect_us_p50\":%.1f}",
	       r->node_p50, r->host_p50, r->overhead, r->share, r->rps, r->connect_p50);
}

int main(int argc, char **argv)
{
	bool dev = argc > 1 && strcmp(argv[1], "--dev") == 0;
	bool with_tls = !getenv("BENCH_NODE_TLS") || strcmp(getenv("BENCH_NODE_TLS"), "0") != 0;
	bool with_lowlat = !getenv("BENCH_NODE_LOWLAT") || strcmp(getenv("BENCH_NODE_LOWLAT"), "0") != 0;
	signal(SIGPIPE, SIG_IGN);
	snprintf(dir, sizeof dir, "/tmp/bench-node-XXXXXX");
	if (!mkdtemp(dir))
		die("mkdtemp");

	/* keys: the signer stays here, the node gets the public half */
	struct spaced_secret_key *sk;
	struct spaced_public_key pk;
	char pub[SPACED_PASERK_PUBLIC_LEN + 1], bundle[128];
	if (spaced_secret_key_generate(&sk) < 0)
		die("keygen");
	spaced_secret_key_public(sk, &pk);
	spaced_paserk_public_encode(&pk, pub);
	snprintf(bundle, sizeof bundle, "%s/bundle.json", dir);
	FILE *f = fopen(bundle, "w");
	if (!f)
		die("bundle");
	fprintf(f, "{\"version\":1,\"keys\":[{\"key\":\"%s\",\"not_before\":\"2020-01-01T00:00:00Z\","
	           "\"not_after\":\"2099-01-01T00:00:00Z\"}]}",
	        pub);
	fclose(f);
	/* TLS: a CA and node-api's certificate for 127.0.0.1 */
	char ca[128], cak[128], crt[128], key[128], err[600];
	snprintf(ca, sizeof ca, "%s/ca.pem", dir);
	snprintf(cak, sizeof cak, "%s/ca.key", dir);
	snprintf(crt, sizeof crt, "%s/node.pem", dir);
	snprintf(key, sizeof key, "%s/node.key", dir);
	if (spaced_tls_issue(NULL, NULL, ca, cak, "bench-node CA", NULL, false, 1, err, sizeof err) < 0 ||
	    spaced_tls_issue(ca, cak, crt, key, "bench-node", "IP:127.0.0.1", true, 1, err, sizeof err) < 0) {
		fprintf(stderr, "bench-node: %s\n", err);
		die("certificates");
	}
	struct results plain, tls, ll_plain, ll_tls;
	memset(&plain, 0, sizeof plain);
	memset(&tls, 0, sizeof tls);
	memset(&ll_plain, 0, sizeof ll_plain);
	memset(&ll_tls, 0, sizeof ll_tls);
	for (int lowlat = 0; lowlat <= (with_lowlat ? 1 : 0); lowlat++) {
		struct results *p = lowlat ? &ll_plain : &plain, *t = lowlat ? &ll_tls : &tls;
		if (lowlat)
			printf("== spaced-node --cpu-latency-us 0: idle CPUs poll instead of halting while it runs\n");
		run(dev, sk, bundle, false, lowlat, p);
		report("without TLS (--plaintext)", dev, p);
		if (with_tls) {
			run(dev, sk, bundle, true, lowlat, t);
			report("with TLS (TLS 1.3, ECDSA P-256 certificate, the client verifying chain and address)", dev, t);
			printf("-- TLS against plaintext: read4k p50 x%.2f (%+.1f us), requests/s x%.2f, new connection x%.1f "
			       "(%+.0f us)\n",
			       t->node_p50 / p->node_p50, t->node_p50 - p->node_p50, t->rps / p->rps,
			       t->connect_p50 / p->connect_p50, t->connect_p50 - p->connect_p50);
		}
	}
	if (with_lowlat)
		printf("overhead of node-api and the gate (target <= 40 us): %.1f us plaintext, %.1f us TLS as the machine "
		       "idles by default; %.1f us and %.1f us with --cpu-latency-us 0\n",
		       plain.overhead, tls.overhead, ll_plain.overhead, ll_tls.overhead);
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "bench-node: could not remove %s\n", dir);
	spaced_secret_key_free(sk);
	/* the last line: JSON (the plaintext figures at the top level, as before) */
	printf("{\"read4k_node_us_p50\":%.1f,\"read4k_host_us_p50\":%.1f,\"node_overhead_us_p50\":%.1f,"
	       "\"verify_compare_share\":%.4f,\"rps_2cores\":%.0f",
	       plain.node_p50, plain.host_p50, plain.overhead, plain.share, plain.rps);
	if (with_tls) {
		printf(",\"plain\":");
		json_of(&plain);
		printf(",\"tls\":");
		json_of(&tls);
		printf(",\"tls_read4k_ratio\":%.3f,\"tls_rps_ratio\":%.3f", tls.node_p50 / plain.node_p50,
		       tls.rps / plain.rps);
	}
	if (with_lowlat) {
		printf(",\"low_latency\":{\"plain\":");
		json_of(&ll_plain);
		if (with_tls) {
			printf(",\"tls\":");
			json_of(&ll_tls);
		}
		printf("}");
	}
	printf("}\n");
	return 0;
}
