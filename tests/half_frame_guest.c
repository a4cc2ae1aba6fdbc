/*
 * half_frame_guest.c — an execution's guest that breaks off in the middle
 * of a large output frame, for the gate's bulk output (gate_streams.c: a
 * frame's payload spliced whole before its message goes on node-api's link).
 * Development substrate only: it answers FS_READ and nothing else.
 *
 *   half-frame-guest --root DIR --identity TEXT --listen SOCK
 *
 * FS_READ of a path ending in "stall": one whole DATA frame of 64 KiB (so
 * the gate reads the stream a frame at a time from then on), then the
 * header of a second and 1000 bytes of it, then nothing more on that
 * connection. Any other path: FRAMES DATA frames of 64 KiB, byte i of frame
 * f being (i * 7 + f) & 0xff, then its RESULT.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "frame.h"
#include "guest_proto.h"

#define FRAMES 8
#define CHUNK 65536
#define MAXC 64

static const char *identity = "";

static int send_all(int fd, const void *p, size_t n)
{
	while (n > 0) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		p = (const char *)p + k;
		n -= (size_t)k;
	}
	return 0;
}

static int send_frame(int fd, uint16_t type, uint16_t flags, const void *p, size_t n)
{
	uint8_t h[SPACED_FRAME_HDR_LEN];
	spaced_frame_hdr_encode(h, &(struct spaced_frame_hdr){.len = (uint32_t)n, .type = type, .flags = flags, .id = 1});
	return send_all(fd, h, sizeof h) < 0 || send_all(fd, p, n) < 0 ? -1 : 0;
}

/* Answers one request; -1 drops the connection, 1 leaves it stalled. */
static int answer(int fd, const struct spaced_frame_hdr *h, const uint8_t *p)
{
	static uint8_t data[CHUNK];
	struct spaced_field_reader r;
	const char *path;
	size_t pl;
	if (h->type != SPACED_GUEST_FS_READ)
		return -1;
	spaced_field_reader_init(&r, p, h->len);
	if (spaced_field_get_str(&r, &path, &pl) < 0)
		return -1;
	bool stall = pl >= 5 && memcmp(path + pl - 5, "stall", 5) == 0;
	for (int f = 0; f < (stall ? 1 : FRAMES); f++) {
		for (size_t i = 0; i < CHUNK; i++)
			data[i] = (uint8_t)((i * 7 + (size_t)f) & 0xff);
		if (send_frame(fd, SPACED_GUEST_OUT_DATA, 0, data, CHUNK) < 0)
			return -1;
	}
	if (stall) {
		uint8_t hh[SPACED_FRAME_HDR_LEN];
		spaced_frame_hdr_encode(hh, &(struct spaced_frame_hdr){.len = CHUNK, .type = SPACED_GUEST_OUT_DATA, .id = 1});
		return send_all(fd, hh, sizeof hh) < 0 || send_all(fd, data, 1000) < 0 ? -1 : 1;
	}
	struct spaced_buf b;
	spaced_buf_init(&b, 4096);
	spaced_field_put_i64(&b, 0);
	spaced_field_put_str(&b, "");
	spaced_field_put_str(&b, identity);
	spaced_field_put_u64(&b, (uint64_t)FRAMES * CHUNK);
	spaced_field_put_u64(&b, (uint64_t)FRAMES * CHUNK);
	int e = send_frame(fd, SPACED_GUEST_OUT_RESULT, SPACED_FRAME_F_END, b.data, b.len);
	spaced_buf_free(&b);
	return e;
}

int main(int argc, char **argv)
{
	const char *sock = NULL;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--identity") == 0)
			identity = argv[i + 1];
		else if (strcmp(argv[i], "--listen") == 0)
			sock = argv[i + 1];
	}
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (!sock || strlen(sock) >= sizeof sa.sun_path || ls < 0)
		return 2;
	memcpy(sa.sun_path, sock, strlen(sock) + 1);
	unlink(sock);
	if (bind(ls, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(ls, 64) < 0)
		return 2;
	struct pollfd pf[MAXC + 1] = {{.fd = ls, .events = POLLIN}};
	static uint8_t in[MAXC][SPACED_FRAME_HDR_LEN + 8192];
	size_t have[MAXC] = {0};
	int nc = 0;
	for (;;) {
		if (poll(pf, (nfds_t)nc + 1, -1) < 0 && errno != EINTR)
			return 1;
		if ((pf[0].revents & POLLIN) && nc < MAXC) {
			int c = accept(ls, NULL, NULL);
			if (c >= 0) {
				pf[++nc] = (struct pollfd){.fd = c, .events = POLLIN};
				have[nc - 1] = 0;
			}
		}
		for (int i = 1; i <= nc; i++) {
			if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			size_t *hv = &have[i - 1];
			ssize_t k = recv(pf[i].fd, in[i - 1] + *hv, sizeof in[0] - *hv, 0);
			int e = k <= 0 ? -1 : 0;
			if (k > 0)
				*hv += (size_t)k;
			struct spaced_frame_hdr h;
			const uint8_t *p;
			size_t used = 0;
			while (e == 0 && spaced_frame_parse(in[i - 1], *hv, 8192, &h, &p, &used) == 0 && used > 0) {
				e = answer(pf[i].fd, &h, p);
				memmove(in[i - 1], in[i - 1] + used, *hv - used);
				*hv -= used;
			}
			if (e == 1)
				pf[i].events = 0; /* stalled: kept open, never read again */
			if (e < 0) {
				close(pf[i].fd);
				pf[i] = pf[nc];
				have[i - 1] = have[nc - 1];
				memcpy(in[i - 1], in[nc - 1], have[i - 1]);
				nc--;
				i--;
			}
		}
	}
}
