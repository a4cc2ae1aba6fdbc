/*
 * vsock_client.c — host-side client of a hybrid vsock socket (Firecracker's
 * "CONNECT <port>\n" -> "OK <n>\n"), for tests/vm_vsock.t.sh.
 *
 *   vsock-client echo UDS PORT BYTES      one connection; BYTES of a pattern
 *                                          sent while the echo is read back and
 *                                          compared byte for byte
 *   vsock-client loop UDS PORT COUNT      COUNT connections in a row, each
 *                                          CONNECT, 64 bytes echoed, close
 *   vsock-client refused UDS TEXT         sends TEXT ("\n" is a newline) and
 *                                          expects the socket closed without a
 *                                          single byte in answer
 *   vsock-client read PATH                connects, sends nothing, prints what
 *                                          arrives until the socket closes
 *                                          (bytes outside printable ASCII as '.')
 *   vsock-client line UDS PORT TEXT       CONNECT PORT, sends TEXT and a newline,
 *                                          prints the one line answered (a
 *                                          guest's control port)
 *   vsock-client hello PATH               a bridge's caller: connects to PATH (a
 *                                          spaced-host socket), sends HELLO and
 *                                          prints "ok hello identity=…" or
 *                                          "refused code=… reason=…" (exit 3)
 *   vsock-client serve PATH               listens on PATH (a guest-initiated
 *                                          connection's "<uds>_<port>"), takes one
 *                                          connection, reads to EOF and answers
 *                                          "host got: " and what it read
 *
 * Every wait is bounded (SPACED_VSOCK_CLIENT_TIMEOUT_MS, default 30000 in
 * all). Prints one "ok …" line with figures, or "error: …"; exit 0 or 1.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "spaced_error.h"
#include "guest_client.h"
#include "vsock_hs.h"

static long long deadline_ms;

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int left_ms(void)
{
	long long l = deadline_ms - now_ms();

	return l < 0 ? 0 : (int)l;
}

static int dial(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -1;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		fprintf(stderr, "error: connect %s: %s\n", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* Waits for fd to be readable (bounded by the deadline). */
static int wait_in(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int rc = poll(&p, 1, left_ms());

	return rc > 0 ? 0 : -1;
}

static int write_all(int fd, const void *buf, size_t n)
{
	const char *p = buf;

	while (n > 0) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* CONNECT port, then the answer line read one byte at a time (no byte of the
 * stream taken with it). Returns the fd, or -1. */
static int vconnect(const char *path, unsigned port, unsigned *local)
{
	char line[SPACED_VSOCK_HS_MAX + 1];
	size_t n = 0;
	int fd = dial(path), len;
	uint32_t v;

	if (fd < 0)
		return -1;
	len = spaced_vsock_hs_format_connect(line, sizeof(line), port);
	if (len < 0 || write_all(fd, line, (size_t)len) < 0)
		goto fail;
	while (n < SPACED_VSOCK_HS_MAX) {
		ssize_t r;

		if (wait_in(fd) < 0) {
			fprintf(stderr, "error: no answer to CONNECT %u in time\n", port);
			goto fail;
		}
		r = read(fd, line + n, 1);
		if (r <= 0) {
			fprintf(stderr, "error: CONNECT %u: closed after %zu bytes of answer\n", port, n);
			goto fail;
		}
		n++;
		if (line[n - 1] == '\n')
			break;
	}
	if (spaced_vsock_hs_parse_ok((const uint8_t *)line, n, &v) < 0) {
		fprintf(stderr, "error: CONNECT %u: bad answer '%.*s'\n", port, (int)n, line);
		goto fail;
	}
	*local = v;
	return fd;
fail:
	close(fd);
	return -1;
}

static unsigned char pattern_byte(size_t i)
{
	return (unsigned char)((i * 2654435761u) >> 13 ^ i);
}

/* Sends total bytes and reads them back at the same time (poll on both
 * directions, so neither side's buffers can deadlock the exchange). */
static int echo_exchange(int fd, size_t total)
{
	static unsigned char out[65536], in[65536];
	size_t sent = 0, got = 0;

	while (got < total) {
		struct pollfd p = { .fd = fd, .events = POLLIN | (sent < total ? POLLOUT : 0) };
		int rc = poll(&p, 1, left_ms());

		if (rc <= 0) {
			fprintf(stderr, "error: echo stalled at %zu sent, %zu received\n", sent, got);
			return -1;
		}
		if ((p.revents & POLLOUT) && sent < total) {
			size_t k = total - sent < sizeof(out) ? total - sent : sizeof(out);
			ssize_t w;

			for (size_t i = 0; i < k; i++)
				out[i] = pattern_byte(sent + i);
			w = send(fd, out, k, MSG_DONTWAIT | MSG_NOSIGNAL);
			if (w < 0 && errno != EAGAIN && errno != EINTR) {
				fprintf(stderr, "error: send: %s\n", strerror(errno));
				return -1;
			}
			if (w > 0)
				sent += (size_t)w;
		}
		if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
			ssize_t r = recv(fd, in, sizeof(in), MSG_DONTWAIT);

			if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
				fprintf(stderr, "error: echo closed after %zu of %zu bytes\n", got, total);
				return -1;
			}
			for (ssize_t i = 0; i < r; i++)
				if (in[i] != pattern_byte(got + (size_t)i)) {
					fprintf(stderr, "error: byte %zu differs\n", got + (size_t)i);
					return -1;
				}
			if (r > 0)
				got += (size_t)r;
		}
	}
	return 0;
}

/* After our SHUT_WR the far side must close: EOF with nothing more. */
static int expect_eof(int fd)
{
	char b;

	shutdown(fd, SHUT_WR);
	if (wait_in(fd) < 0 || read(fd, &b, 1) != 0) {
		fprintf(stderr, "error: no clean end of stream after shutdown\n");
		return -1;
	}
	return 0;
}

static int cmd_echo(const char *path, unsigned port, size_t bytes)
{
	unsigned local;
	long long t0 = now_ms(), t1;
	int fd = vconnect(path, port, &local);

	if (fd < 0)
		return 1;
	t1 = now_ms();
	if (echo_exchange(fd, bytes) < 0 || expect_eof(fd) < 0) {
		close(fd);
		return 1;
	}
	{
		long long t2 = now_ms();
		double secs = (double)(t2 - t1) / 1000.0;

		printf("ok echo local_port=%u bytes=%zu connect_ms=%lld echo_ms=%lld MiB_per_s=%.2f\n", local,
		       bytes, t1 - t0, t2 - t1, secs > 0 ? (double)bytes / 1048576.0 / secs : 0.0);
	}
	close(fd);
	return 0;
}

static int cmd_loop(const char *path, unsigned port, unsigned count)
{
	unsigned first = 0, prev = 0;
	long long t0 = now_ms();

	for (unsigned i = 0; i < count; i++) {
		unsigned local;
		int fd = vconnect(path, port, &local);

		if (fd < 0) {
			fprintf(stderr, "error: connection %u of %u\n", i + 1, count);
			return 1;
		}
		if (i == 0)
			first = local;
		else if (local == prev) {
			fprintf(stderr, "error: local port %u given twice in a row\n", local);
			close(fd);
			return 1;
		}
		prev = local;
		if (echo_exchange(fd, 64) < 0 || expect_eof(fd) < 0) {
			fprintf(stderr, "error: connection %u of %u\n", i + 1, count);
			close(fd);
			return 1;
		}
		close(fd);
	}
	printf("ok loop connections=%u first_local_port=%u last_local_port=%u ms_per_connection=%.1f\n",
	       count, first, prev, count ? (double)(now_ms() - t0) / count : 0.0);
	return 0;
}

static int cmd_refused(const char *path, const char *text)
{
	char buf[256], b;
	size_t n = 0;
	long long t0 = now_ms();
	int fd = dial(path);
	ssize_t r;

	if (fd < 0)
		return 1;
	for (const char *p = text; *p && n < sizeof(buf); p++) {
		if (p[0] == '\\' && p[1] == 'n') {
			buf[n++] = '\n';
			p++;
		} else {
			buf[n++] = *p;
		}
	}
	if (n > 0 && write_all(fd, buf, n) < 0) {
		/* refused before we finished writing is refused too */
		close(fd);
		printf("ok refused ms=%lld (while writing)\n", now_ms() - t0);
		return 0;
	}
	if (wait_in(fd) < 0) {
		fprintf(stderr, "error: still open after the time allowed\n");
		close(fd);
		return 1;
	}
	r = read(fd, &b, 1);
	close(fd);
	if (r > 0) {
		fprintf(stderr, "error: answered (first byte '%c') instead of closing\n", b);
		return 1;
	}
	printf("ok refused ms=%lld\n", now_ms() - t0);
	return 0;
}

static int cmd_read(const char *path)
{
	char buf[4096];
	size_t n = 0;
	int fd = dial(path);

	if (fd < 0)
		return 1;
	while (n < sizeof(buf)) {
		ssize_t r;

		if (wait_in(fd) < 0) {
			fprintf(stderr, "error: still open after the time allowed\n");
			close(fd);
			return 1;
		}
		r = read(fd, buf + n, sizeof(buf) - n);
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	for (size_t i = 0; i < n; i++)
		if (buf[i] < 0x20 || buf[i] > 0x7e)
			buf[i] = '.';
	printf("ok read bytes=%zu text='%.*s'\n", n, (int)n, buf);
	return 0;
}

static int cmd_line(const char *path, unsigned port, const char *text)
{
	unsigned local;
	char buf[2048];
	size_t n = 0;
	int fd = vconnect(path, port, &local);

	if (fd < 0)
		return 1;
	if (write_all(fd, text, strlen(text)) < 0 || write_all(fd, "\n", 1) < 0) {
		close(fd);
		printf("error: cannot send\n");
		return 1;
	}
	while (n < sizeof(buf) - 1) {
		ssize_t r;

		if (wait_in(fd) < 0)
			break;
		r = read(fd, buf + n, 1);
		if (r <= 0 || buf[n] == '\n')
			break;
		n++;
	}
	close(fd);
	buf[n] = '\0';
	printf("answer '%s'\n", buf);
	return n > 0 ? 0 : 1;
}

static int cmd_hello(const char *path)
{
	struct spaced_guest_client *c;
	struct spaced_guest_msg m;
	struct spaced_field_reader r;
	int e = spaced_guest_client_connect(path, &c);

	if (e < 0) {
		printf("error: connect %s: %s\n", path, spaced_strerror(e));
		return 1;
	}
	struct timeval tv = { .tv_sec = 30 };
	setsockopt(spaced_guest_client_fd(c), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	uint32_t id = spaced_guest_client_next_id(c);
	/* the bridge's verdict comes with the first answer: the guest's RESULT
	 * to this HELLO, or its own refusal (RESULT, id 0) */
	(void)spaced_guest_send(c, SPACED_GUEST_HELLO, 0, id, NULL, 0); /* a refusal may already be there */
	e = spaced_guest_recv(c, &m);
	if (e < 0) {
		printf("error: %s\n", spaced_strerror(e));
		spaced_guest_client_free(c);
		return 1;
	}
	int st = m.hdr.type == SPACED_GUEST_OUT_RESULT ? spaced_guest_result_head(c, &m, &r) : SPACED_EPROTO;
	uint32_t got = m.hdr.id;
	spaced_guest_msg_clear(&m);
	if (st == 0 && got == id) {
		printf("ok hello identity=%s\n", spaced_guest_client_identity(c));
		spaced_guest_client_free(c);
		return 0;
	}
	printf("refused code=%s reason=\"%s\"\n", spaced_errname(st), spaced_guest_client_errmsg(c));
	spaced_guest_client_free(c);
	return 3;
}

static int cmd_serve(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char buf[512] = "host got: ";
	size_t pre = strlen(buf), n = pre;
	int lfd, fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return 1;
	strcpy(sa.sun_path, path);
	unlink(path);
	lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 4) < 0) {
		fprintf(stderr, "error: listen %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (wait_in(lfd) < 0 || (fd = accept(lfd, NULL, NULL)) < 0) {
		fprintf(stderr, "error: no connection from the guest in time\n");
		close(lfd);
		unlink(path);
		return 1;
	}
	close(lfd);
	unlink(path);
	while (n < sizeof(buf) - 1) {
		ssize_t r;

		if (wait_in(fd) < 0)
			break;
		r = read(fd, buf + n, sizeof(buf) - 1 - n);
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	if (write_all(fd, buf, n) < 0) {
		fprintf(stderr, "error: answer: %s\n", strerror(errno));
		close(fd);
		return 1;
	}
	close(fd);
	while (n > pre && buf[n - 1] == '\n')
		n--;
	printf("ok serve got='%.*s'\n", (int)(n - pre), buf + pre);
	return 0;
}

int main(int argc, char **argv)
{
	const char *t = getenv("SPACED_VSOCK_CLIENT_TIMEOUT_MS");

	deadline_ms = now_ms() + (t ? atoll(t) : 30000);
	if (argc == 5 && strcmp(argv[1], "echo") == 0)
		return cmd_echo(argv[2], (unsigned)strtoul(argv[3], NULL, 10),
				(size_t)strtoull(argv[4], NULL, 10));
	if (argc == 5 && strcmp(argv[1], "loop") == 0)
		return cmd_loop(argv[2], (unsigned)strtoul(argv[3], NULL, 10),
				(unsigned)strtoul(argv[4], NULL, 10));
	if (argc == 4 && strcmp(argv[1], "refused") == 0)
		return cmd_refused(argv[2], argv[3]);
	if (argc == 3 && strcmp(argv[1], "read") == 0)
		return cmd_read(argv[2]);
	if (argc == 3 && strcmp(argv[1], "serve") == 0)
		return cmd_serve(argv[2]);
	if (argc == 3 && strcmp(argv[1], "hello") == 0)
		return cmd_hello(argv[2]);
	if (argc == 5 && strcmp(argv[1], "line") == 0)
		return cmd_line(argv[2], (unsigned)strtoul(argv[3], NULL, 10), argv[4]);
	fprintf(stderr, "usage: vsock-client echo UDS PORT BYTES | loop UDS PORT COUNT | refused UDS TEXT | read PATH | hello PATH | line UDS PORT TEXT | serve PATH\n");
	return 2;
}
