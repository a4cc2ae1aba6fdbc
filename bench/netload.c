/*
 * netload — the load generator and upstream of make bench-netgtw (bench/netgtw_bench.sh).
 *
 *   netload http ADDR PORT HOST BEARER|- CONNS SECONDS
 *       keeps CONNS HTTP/1.1 connections busy for SECONDS (one request at a time
 *       each, keep-alive) and prints "rps=… p50_us=… p99_us=… errors=…"
 *   netload tcp ADDR PORT HOST|- BEARER|- BYTES
 *       (with a bearer: the spaced-tcp upgrade of spaced-netgtw first) reads
 *       BYTES from the server and prints "mbps=…" (megabytes per second)
 *   netload source PORT
 *       accepts connections on 0.0.0.0:PORT and writes zeros to each until it closes
 * Bounded: every run ends by itself (SECONDS, BYTES), and source by SIGTERM.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int dial(const char *addr, int port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
		return -1;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	return fd;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

struct hc {
	int fd;
	uint64_t t0;
	size_t got, need; /* bytes of the current answer read, and its total once known */
	char buf[8192];
};

static int http_load(const char *addr, int port, const char *host, const char *bearer, int conns, double secs)
{
	char req[6000];
	int rl = snprintf(req, sizeof req, "GET / HTTP/1.1\r\nHost: %s\r\n%s%s%sConnection: keep-alive\r\n\r\n", host,
	                  bearer ? "Authorization: Bearer " : "", bearer ? bearer : "", bearer ? "\r\n" : "");
	size_t cap = 1 << 20, n = 0;
	uint64_t *lat = malloc(cap * sizeof *lat), errors = 0;
	struct hc *c = calloc((size_t)conns, sizeof *c);
	int ep = epoll_create1(0);
	for (int i = 0; i < conns; i++) {
		c[i].fd = dial(addr, port);
		if (c[i].fd < 0) {
			fprintf(stderr, "netload: cannot connect to %s:%d\n", addr, port);
			return 1;
		}
		struct epoll_event e = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
		epoll_ctl(ep, EPOLL_CTL_ADD, c[i].fd, &e);
		c[i].t0 = now_ns();
		if (send(c[i].fd, req, (size_t)rl, MSG_NOSIGNAL) != rl)
			errors++;
	}
	uint64_t start = now_ns(), end = start + (uint64_t)(secs * 1e9);
	while (now_ns() < end) {
		struct epoll_event ev[64];
		int k = epoll_wait(ep, ev, 64, 100);
		for (int j = 0; j < k; j++) {
			struct hc *h = &c[ev[j].data.u32];
			ssize_t r = recv(h->fd, h->buf + h->got, sizeof h->buf - h->got, 0);
			if (r <= 0) {
				errors++;
				close(h->fd);
				h->fd = dial(addr, port);
				if (h->fd < 0)
					return 1;
				struct epoll_event e = {.events = EPOLLIN, .data.u32 = ev[j].data.u32};
				epoll_ctl(ep, EPOLL_CTL_ADD, h->fd, &e);
				h->got = h->need = 0;
				h->t0 = now_ns();
				send(h->fd, req, (size_t)rl, MSG_NOSIGNAL);
				continue;
			}
			h->got += (size_t)r;
			if (h->need == 0) {
				char *eoh = memmem(h->buf, h->got, "\r\n\r\n", 4);
				if (!eoh)
					continue;
				char *cl = memmem(h->buf, (size_t)(eoh - h->buf), "Content-Length:", 15);
				if (!cl)
					cl = memmem(h->buf, (size_t)(eoh - h->buf), "content-length:", 15);
				size_t blen = cl ? (size_t)strtoul(cl + 15, NULL, 10) : 0;
				h->need = (size_t)(eoh - h->buf) + 4 + blen;
				if (strncmp(h->buf, "HTTP/1.1 200", 12) != 0)
					errors++;
			}
			if (h->got >= h->need) {
				uint64_t t = now_ns();
				if (n < cap)
					lat[n++] = t - h->t0;
				size_t extra = h->got - h->need;
				memmove(h->buf, h->buf + h->need, extra);
				h->got = extra;
				h->need = 0;
				h->t0 = t;
				if (send(h->fd, req, (size_t)rl, MSG_NOSIGNAL) != rl)
					errors++;
			}
		}
	}
	double el = (double)(now_ns() - start) / 1e9;
	qsort(lat, n, sizeof *lat, cmp_u64);
	printf("rps=%.0f p50_us=%.1f p99_us=%.1f requests=%zu errors=%llu\n", (double)n / el,
	       n ? (double)lat[n / 2] / 1e3 : 0.0, n ? (double)lat[(size_t)((double)n * 0.99)] / 1e3 : 0.0, n,
	       (unsigned long long)errors);
	return 0;
}

static int tcp_read(const char *addr, int port, const char *host, const char *bearer, uint64_t bytes)
{
	int fd = dial(addr, port);
	if (fd < 0) {
		fprintf(stderr, "netload: cannot connect to %s:%d\n", addr, port);
		return 1;
	}
	if (bearer) {
		char req[6000];
		int rl = snprintf(req, sizeof req,
		                  "GET / HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\n"
		                  "Upgrade: spaced-tcp\r\n\r\n",
		                  host, bearer);
		send(fd, req, (size_t)rl, MSG_NOSIGNAL);
		char h[4096];
		size_t g = 0;
		while (g < sizeof h && (g < 4 || memcmp(h + g - 4, "\r\n\r\n", 4) != 0)) {
			if (recv(fd, h + g, 1, 0) != 1)
				return 1;
			g++;
		}
		if (strncmp(h, "HTTP/1.1 101", 12) != 0) {
			fprintf(stderr, "netload: the gateway answered %.20s\n", h);
			return 1;
		}
	}
	static char buf[1 << 20];
	uint64_t got = 0, t0 = now_ns();
	while (got < bytes) {
		ssize_t r = recv(fd, buf, sizeof buf, 0);
		if (r <= 0)
			break;
		got += (uint64_t)r;
	}
	double el = (double)(now_ns() - t0) / 1e9;
	close(fd);
	printf("mbps=%.1f bytes=%llu\n", (double)got / 1e6 / el, (unsigned long long)got);
	return got >= bytes ? 0 : 1;
}

static int source(int port)
{
	int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(l, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(l, 64) < 0)
		return 1;
	signal(SIGCHLD, SIG_IGN);
	signal(SIGPIPE, SIG_IGN);
	static char zeros[1 << 20];
	for (;;) {
		int c = accept(l, NULL, NULL);
		if (c < 0)
			continue;
		if (fork() == 0) {
			while (send(c, zeros, sizeof zeros, 0) > 0)
				;
			_exit(0);
		}
		close(c);
	}
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	if (argc == 9 - 1 && strcmp(argv[1], "http") == 0)
		return http_load(argv[2], atoi(argv[3]), argv[4], strcmp(argv[5], "-") ? argv[5] : NULL, atoi(argv[6]),
		                 atof(argv[7]));
	if (argc == 7 && strcmp(argv[1], "tcp") == 0)
		return tcp_read(argv[2], atoi(argv[3]), argv[4], strcmp(argv[5], "-") ? argv[5] : NULL,
		                strtoull(argv[6], NULL, 10));
	if (argc == 3 && strcmp(argv[1], "source") == 0)
		return source(atoi(argv[2]));
	fprintf(stderr, "usage: netload http ADDR PORT HOST BEARER|- CONNS SECONDS\n"
	                "       netload tcp ADDR PORT HOST|- BEARER|- BYTES\n"
	                "       netload source PORT\n");
	return 2;
}
