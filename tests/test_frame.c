/*
 * test_frame.c — the wire framing and typed fields of frame.h over real
 * sockets: limits checked before allocation, truncation, short transfers and
 * EINTR, unknown types refused by the dispatch table, strict field decoding
 * (wrong kind, overlong lengths, NUL in text, trailing bytes).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spaced_error.h"
#include "frame.h"

static void pair(int sv[2])
{
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
}

Test(frame, header_round_trip_little_endian)
{
	struct spaced_frame_hdr h = {0x01020304, 0x0506, SPACED_FRAME_F_END, 0x0a0b0c0d}, g;
	uint8_t b[SPACED_FRAME_HDR_LEN];
	spaced_frame_hdr_encode(b, &h);
	static const uint8_t want[] = {4, 3, 2, 1, 6, 5, 1, 0, 0x0d, 0x0c, 0x0b, 0x0a};
	cr_assert(memcmp(b, want, sizeof want) == 0);
	/* 0x01020304 is over SPACED_FRAME_MAX */
	cr_assert_eq(spaced_frame_hdr_decode(&g, b, SPACED_FRAME_MAX), SPACED_ETOOBIG);
	h.len = 100;
	spaced_frame_hdr_encode(b, &h);
	cr_assert_eq(spaced_frame_hdr_decode(&g, b, 99), SPACED_ETOOBIG);
	cr_assert_eq(spaced_frame_hdr_decode(&g, b, 100), 0);
	cr_assert(g.len == 100 && g.type == 0x0506 && g.flags == 1 && g.id == 0x0a0b0c0d);
	b[7] = 0x80; /* an unknown flag bit */
	cr_assert_eq(spaced_frame_hdr_decode(&g, b, 100), SPACED_EPROTO);
}

Test(frame, parse_needs_whole_frames)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 1 << 20);
	cr_assert_eq(spaced_frame_append(&b, 7, 0, 1, "abc", 3), 0);
	cr_assert_eq(spaced_frame_append(&b, 8, SPACED_FRAME_F_END, 2, NULL, 0), 0);
	struct spaced_frame_hdr h;
	const uint8_t *p;
	size_t used = 99;
	for (size_t n = 0; n < SPACED_FRAME_HDR_LEN + 3; n++) {
		cr_assert_eq(spaced_frame_parse(b.data, n, 1024, &h, &p, &used), 0);
		cr_assert_eq(used, 0, "partial frame of %zu bytes", n);
	}
	cr_assert_eq(spaced_frame_parse(b.data, b.len, 1024, &h, &p, &used), 0);
	cr_assert_eq(used, 15);
	cr_assert(h.type == 7 && h.len == 3 && memcmp(p, "abc", 3) == 0);
	cr_assert_eq(spaced_frame_parse(b.data + used, b.len - used, 1024, &h, &p, &used), 0);
	cr_assert(h.type == 8 && h.len == 0 && h.flags == SPACED_FRAME_F_END && used == 12);
	/* an oversized header is refused before its payload arrives */
	cr_assert_eq(spaced_frame_parse(b.data, SPACED_FRAME_HDR_LEN, 2, &h, &p, &used),
	             SPACED_ETOOBIG);
	spaced_buf_free(&b);
}

Test(frame, recv_checks_size_before_reading)
{
	int sv[2];
	pair(sv);
	struct spaced_frame_hdr h = {.len = 4096, .type = 1, .flags = 0, .id = 1};
	uint8_t hb[SPACED_FRAME_HDR_LEN];
	spaced_frame_hdr_encode(hb, &h);
	cr_assert_eq(write(sv[0], hb, sizeof hb), (ssize_t)sizeof hb);
	struct spaced_frame_hdr g;
	uint8_t *p = NULL;
	cr_assert_eq(spaced_frame_recv(sv[1], 1024, &g, &p), SPACED_ETOOBIG);
	cr_assert_null(p);
	close(sv[0]);
	close(sv[1]);
}

Test(frame, recv_truncated_and_clean_end)
{
	int sv[2];
	pair(sv);
	struct spaced_frame_hdr h = {.len = 10, .type = 1, .flags = 0, .id = 1}, g;
	uint8_t hb[SPACED_FRAME_HDR_LEN];
	spaced_frame_hdr_encode(hb, &h);
	cr_assert_eq(write(sv[0], hb, sizeof hb), (ssize_t)sizeof hb);
	cr_assert_eq(write(sv[0], "12345", 5), 5);
	shutdown(sv[0], SHUT_WR);
	uint8_t *p = NULL;
	cr_assert_eq(spaced_frame_recv(sv[1], 1024, &g, &p), SPACED_EPROTO);
	close(sv[0]);
	close(sv[1]);

	pair(sv);
	cr_assert_eq(write(sv[0], hb, 5), 5); /* half a header */
	shutdown(sv[0], SHUT_WR);
	cr_assert_eq(spaced_frame_recv(sv[1], 1024, &g, &p), SPACED_EPROTO);
	close(sv[0]);
	close(sv[1]);

	pair(sv);
	shutdown(sv[0], SHUT_WR); /* nothing at all: a clean end */
	cr_assert_eq(spaced_frame_recv(sv[1], 1024, &g, &p), SPACED_ECLOSED);
	close(sv[0]);
	close(sv[1]);
}

struct dribble {
	int fd;
	struct spaced_buf frame;
};

/* Writes a frame one byte at a time: the reader sees many short reads. */
static void *dribble_writer(void *arg)
{
	struct dribble *d = arg;
	sigset_t alrm;
	sigemptyset(&alrm);
	sigaddset(&alrm, SIGALRM); /* interruptions are for the reader */
	pthread_sigmask(SIG_BLOCK, &alrm, NULL);
	for (size_t i = 0; i < d->frame.len; i++) {
		if (write(d->fd, d->frame.data + i, 1) != 1)
			break;
		if (i % 7 == 0)
			usleep(300);
	}
	return NULL;
}

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

Test(frame, recv_handles_short_reads_and_eintr)
{
	int sv[2];
	pair(sv);
	struct sigaction sa = {0};
	sa.sa_handler = on_alarm; /* no SA_RESTART: read() fails with EINTR */
	sigaction(SIGALRM, &sa, NULL);
	struct dribble d = {.fd = sv[0]};
	spaced_buf_init(&d.frame, 1 << 16);
	uint8_t payload[300];
	for (size_t i = 0; i < sizeof payload; i++)
		payload[i] = (uint8_t)i;
	cr_assert_eq(spaced_frame_append(&d.frame, 42, SPACED_FRAME_F_END, 77, payload,
	                                 sizeof payload),
	             0);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, dribble_writer, &d), 0);
	struct itimerval it = {{0, 2000}, {0, 2000}}; /* frequent interruptions */
	setitimer(ITIMER_REAL, &it, NULL);
	struct spaced_frame_hdr g;
	uint8_t *p = NULL;
	cr_assert_eq(spaced_frame_recv(sv[1], 1024, &g, &p), 0);
	struct itimerval off = {{0, 0}, {0, 0}};
	setitimer(ITIMER_REAL, &off, NULL);
	pthread_join(t, NULL);
	cr_assert(g.type == 42 && g.id == 77 && g.len == sizeof payload);
	cr_assert_gt(alarms, 0, "the read was interrupted at least once");
	cr_assert(memcmp(p, payload, sizeof payload) == 0);
	free(p);
	spaced_buf_free(&d.frame);
	close(sv[0]);
	close(sv[1]);
}

Test(frame, send_large_frame_through_small_buffer)
{
	int sv[2];
	pair(sv);
	int small = 4096;
	setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
	static uint8_t big[SPACED_FRAME_MAX];
	for (size_t i = 0; i < sizeof big; i++)
		big[i] = (uint8_t)(i * 31);
	pid_t pid = fork();
	if (pid == 0) {
		close(sv[1]);
		_exit(spaced_frame_send(sv[0], 5, 0, 9, big, sizeof big) == 0 ? 0 : 1);
	}
	close(sv[0]);
	struct spaced_frame_hdr g;
	uint8_t *p = NULL;
	cr_assert_eq(spaced_frame_recv(sv[1], SPACED_FRAME_MAX, &g, &p), 0);
	cr_assert_eq(g.len, sizeof big);
	cr_assert(memcmp(p, big, sizeof big) == 0);
	free(p);
	int st;
	waitpid(pid, &st, 0);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	/* a payload over the hard limit is refused by the sender */
	cr_assert_eq(spaced_frame_send(sv[1], 5, 0, 9, big, (size_t)SPACED_FRAME_MAX + 1),
	             SPACED_ETOOBIG);
	close(sv[1]);
}

static int seen_type;

static int h_one(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	(void)ctx;
	(void)p;
	(void)n;
	seen_type = h->type;
	return 0;
}

Test(frame, dispatch_refuses_unknown_types)
{
	static const struct spaced_frame_handler table[] = {{1, h_one}, {2, h_one}};
	struct spaced_frame_hdr h = {0, 2, 0, 1};
	cr_assert_eq(spaced_frame_dispatch(table, 2, NULL, &h, NULL, 0), 0);
	cr_assert_eq(seen_type, 2);
	h.type = 3;
	seen_type = 0;
	cr_assert_eq(spaced_frame_dispatch(table, 2, NULL, &h, NULL, 0), SPACED_EPROTO);
	cr_assert_eq(seen_type, 0);
}

Test(frame, fields_round_trip)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 1 << 20);
	cr_assert_eq(spaced_field_put_u64(&b, UINT64_MAX), 0);
	cr_assert_eq(spaced_field_put_i64(&b, -5), 0);
	cr_assert_eq(spaced_field_put_str(&b, "path/to"), 0);
	cr_assert_eq(spaced_field_put_bytes(&b, "\0\1\2", 3), 0);
	cr_assert_eq(spaced_field_put_str(&b, ""), 0);
	cr_assert_eq(spaced_field_validate(b.data, b.len), 5);
	struct spaced_field_reader r;
	spaced_field_reader_init(&r, b.data, b.len);
	uint64_t u;
	int64_t i;
	const char *s;
	size_t n;
	const uint8_t *p;
	char buf[8];
	cr_assert_eq(spaced_field_get_u64(&r, &u), 0);
	cr_assert_eq(u, UINT64_MAX);
	cr_assert_eq(spaced_field_get_i64(&r, &i), 0);
	cr_assert_eq(i, -5);
	cr_assert_eq(spaced_field_get_str(&r, &s, &n), 0);
	cr_assert(n == 7 && memcmp(s, "path/to", 7) == 0);
	cr_assert_eq(spaced_field_get_bytes(&r, &p, &n), 0);
	cr_assert(n == 3 && p[0] == 0 && p[2] == 2);
	cr_assert(spaced_field_more(&r));
	cr_assert_eq(spaced_field_get_strbuf(&r, buf, sizeof buf), 0);
	cr_assert_str_eq(buf, "");
	cr_assert(!spaced_field_more(&r));
	cr_assert_eq(spaced_field_end(&r), 0);
	spaced_buf_free(&b);
}

Test(frame, fields_are_strict)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 1 << 20);
	struct spaced_field_reader r;
	uint64_t u = 7;
	const char *s;
	size_t n;
	char small[4];
	char *dup = NULL;

	/* wrong kind: a text where an integer is expected; the error sticks */
	spaced_field_put_str(&b, "x");
	spaced_field_put_u64(&b, 1);
	spaced_field_reader_init(&r, b.data, b.len);
	cr_assert_eq(spaced_field_get_u64(&r, &u), SPACED_EPROTO);
	cr_assert_eq(u, 7, "output untouched on error");
	cr_assert_eq(spaced_field_get_str(&r, &s, &n), SPACED_EPROTO);
	cr_assert_eq(spaced_field_end(&r), SPACED_EPROTO);

	/* trailing bytes */
	spaced_field_reader_init(&r, b.data, b.len);
	cr_assert_eq(spaced_field_get_str(&r, &s, &n), 0);
	cr_assert_eq(spaced_field_end(&r), SPACED_EPROTO);

	/* lengths past the end, truncated integers */
	static const uint8_t past[] = {'s', 0xff, 0xff, 0xff, 0xff, 'a'};
	spaced_field_reader_init(&r, past, sizeof past);
	cr_assert_eq(spaced_field_get_str(&r, &s, &n), SPACED_EPROTO);
	static const uint8_t shortu[] = {'u', 1, 2, 3};
	spaced_field_reader_init(&r, shortu, sizeof shortu);
	cr_assert_eq(spaced_field_get_u64(&r, &u), SPACED_EPROTO);
	cr_assert_eq(spaced_field_validate(shortu, sizeof shortu), SPACED_EPROTO);
	static const uint8_t unknown[] = {'z', 0, 0, 0, 0};
	cr_assert_eq(spaced_field_validate(unknown, sizeof unknown), SPACED_EPROTO);

	/* NUL inside a text: refused on both sides */
	cr_assert_eq(spaced_field_put_strn(&b, "a\0b", 3), SPACED_EINVAL);
	static const uint8_t nul[] = {'s', 3, 0, 0, 0, 'a', 0, 'b'};
	spaced_field_reader_init(&r, nul, sizeof nul);
	cr_assert_eq(spaced_field_get_str(&r, &s, &n), SPACED_EPROTO);

	/* bounded copies */
	b.len = 0;
	spaced_field_put_str(&b, "toolong");
	spaced_field_reader_init(&r, b.data, b.len);
	cr_assert_eq(spaced_field_get_strbuf(&r, small, sizeof small), SPACED_ETOOBIG);
	spaced_field_reader_init(&r, b.data, b.len);
	cr_assert_eq(spaced_field_get_strdup(&r, 3, &dup), SPACED_ETOOBIG);
	cr_assert_null(dup);
	spaced_field_reader_init(&r, b.data, b.len);
	cr_assert_eq(spaced_field_get_strdup(&r, 7, &dup), 0);
	cr_assert_str_eq(dup, "toolong");
	free(dup);

	/* texts over the field limit are refused */
	static char huge[SPACED_FIELD_STR_MAX + 2];
	memset(huge, 'a', sizeof huge - 1);
	cr_assert_eq(spaced_field_put_str(&b, huge), SPACED_ETOOBIG);
	spaced_buf_free(&b);
}
