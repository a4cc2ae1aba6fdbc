/* bridge.c — verification of the guest endpoint and the relay (B1–B3). */
#include "host.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "error.h"
#include "frame.h"
#include "guest_proto.h"
#include "host_client.h"
#include "util.h"
#include "vsock_hs.h"

/* Waits until fd is readable or the deadline passes. */
static int wait_readable(int fd, uint64_t deadline_ns)
{
	for (;;) {
		uint64_t now = spaced_mono_ns();
		if (now >= deadline_ns)
			return SPACED_ETIMEDOUT;
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int n = poll(&p, 1, (int)((deadline_ns - now) / 1000000 + 1));
		if (n > 0)
			return SPACED_OK;
		if (n < 0 && errno != EINTR)
			return SPACED_EIO;
	}
}

/* Reads the "OK <n>\n" answer byte by byte, so not one byte of the guest's
 * stream is consumed with it. */
static int read_ok_line(int fd, uint64_t deadline_ns, char *why, size_t whysz)
{
	uint8_t line[SPACED_VSOCK_HS_MAX];
	size_t n = 0;
	while (n < sizeof line) {
		int r = wait_readable(fd, deadline_ns);
		if (r < 0) {
			snprintf(why, whysz, "no handshake answer from the guest transport (%s)", spaced_strerror(r));
			return r;
		}
		ssize_t got = read(fd, line + n, 1);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0) {
			snprintf(why, whysz, "guest transport closed during the handshake");
			return SPACED_ECLOSED;
		}
		n++;
		if (line[n - 1] == '\n')
			break;
	}
	uint32_t val;
	if (spaced_vsock_hs_parse_ok(line, n, &val) < 0) {
		snprintf(why, whysz, "malformed handshake answer from the guest transport");
		return SPACED_EPROTO;
	}
	return SPACED_OK;
}

/* HELLO, then compares the identity in the RESULT with the expected one. */
static int check_identity(const struct host_config *cfg, int fd, uint64_t deadline_ns, char *why,
                          size_t whysz)
{
	struct spaced_frame_hdr hdr;
	uint8_t *payload = NULL;
	int r = spaced_frame_send(fd, SPACED_GUEST_HELLO, 0, 1, NULL, 0);
	if (r < 0) {
		snprintf(why, whysz, "cannot send HELLO to the guest (%s)", spaced_strerror(r));
		return r;
	}
	if ((r = wait_readable(fd, deadline_ns)) < 0 ||
	    (r = spaced_frame_recv(fd, 64 * 1024, &hdr, &payload)) < 0) {
		snprintf(why, whysz, "no HELLO answer from the guest (%s)", spaced_strerror(r));
		return r;
	}
	struct spaced_field_reader rd;
	int64_t status = 0;
	const char *msg, *text;
	size_t msg_len, text_len;
	spaced_field_reader_init(&rd, payload, hdr.len);
	if (hdr.type != SPACED_GUEST_OUT_RESULT || hdr.id != 1 || !(hdr.flags & SPACED_FRAME_F_END) ||
	    spaced_field_get_i64(&rd, &status) < 0 || spaced_field_get_str(&rd, &msg, &msg_len) < 0 ||
	    spaced_field_get_str(&rd, &text, &text_len) < 0) {
		snprintf(why, whysz, "malformed HELLO answer from the guest");
		r = SPACED_EPROTO;
		goto out;
	}
	struct spaced_identity got;
	if (status != 0 || spaced_identity_decode(&got, text, text_len) < 0) {
		snprintf(why, whysz, "the guest did not report a valid execution identity");
		r = SPACED_EIDENTITY;
		goto out;
	}
	if (!spaced_identity_equal(&got, &cfg->identity)) {
		snprintf(why, whysz, "the guest reports execution [%.*s], expected [%s]", (int)text_len, text,
		         cfg->identity_text);
		r = SPACED_EIDENTITY;
		goto out;
	}
	r = SPACED_OK;
out:
	free(payload);
	return r;
}

int host_open_guest(const struct host_config *cfg, int *fd_out, char *why, size_t whysz)
{
	int fd = -1, r;
	uint64_t deadline = spaced_mono_ns() + (uint64_t)cfg->timeout_ms * 1000000u;
	r = spaced_peer_connect_listener(cfg->guest_path, &cfg->launcher, &fd, why, whysz);
	if (r < 0)
		return r;
	char line[SPACED_VSOCK_HS_MAX + 1];
	int n = spaced_vsock_hs_format_connect(line, sizeof line, cfg->guest_port);
	if (n < 0 || (r = spaced_io_write_full(fd, line, (size_t)n)) < 0) {
		snprintf(why, whysz, "cannot send the handshake to the guest transport");
		r = SPACED_EIO;
		goto fail;
	}
	if ((r = read_ok_line(fd, deadline, why, whysz)) < 0)
		goto fail;
	if ((r = check_identity(cfg, fd, deadline, why, whysz)) < 0)
		goto fail;
	*fd_out = fd;
	return SPACED_OK;
fail:
	close(fd);
	return r;
}

struct pump {
	int from, to;
};

/* Copies from -> to until either side ends, then shuts both down so the pump
 * of the other direction ends too. Blocking reads: one wake-up per message. */
static void *pump_run(void *arg)
{
	struct pump *p = arg;
	enum { BUF = 64 * 1024 };
	uint8_t *buf = malloc(BUF);
	while (buf != NULL) {
		ssize_t got = read(p->from, buf, BUF);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0 || spaced_io_write_full(p->to, buf, (size_t)got) < 0)
			break;
	}
	free(buf);
	shutdown(p->from, SHUT_RDWR);
	shutdown(p->to, SHUT_RDWR);
	return NULL;
}

void host_relay(int a, int b)
{
	struct pump up = {a, b}, down = {b, a};
	pthread_t t;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 64 * 1024);
	if (pthread_create(&t, &attr, pump_run, &down) != 0) {
		pthread_attr_destroy(&attr);
		return;
	}
	pthread_attr_destroy(&attr);
	pump_run(&up);
	pthread_join(t, NULL);
}

int host_handoff(int fd, int guest_fd, const char *identity_text)
{
	uint8_t hdr[SPACED_FRAME_HDR_LEN];
	size_t n = strlen(identity_text);
	struct spaced_frame_hdr h = {.len = (uint32_t)n, .type = SPACED_HOST_HANDOFF, .flags = 0, .id = 0};
	spaced_frame_hdr_encode(hdr, &h);
	union {
		struct cmsghdr align;
		char b[CMSG_SPACE(sizeof(int))];
	} cb;
	memset(&cb, 0, sizeof cb);
	struct iovec iov[2] = {{hdr, sizeof hdr}, {(void *)(uintptr_t)identity_text, n}};
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2, .msg_control = cb.b,
	                    .msg_controllen = sizeof cb.b};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &guest_fd, sizeof(int));
	ssize_t w;
	do
		w = sendmsg(fd, &mh, MSG_NOSIGNAL);
	while (w < 0 && errno == EINTR);
	return w == (ssize_t)(sizeof hdr + n) ? SPACED_OK : SPACED_EIO;
}

void host_refuse(int fd, int err, const char *why, const char *identity_text)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 4096);
	if (spaced_field_put_i64(&b, err) == 0 && spaced_field_put_str(&b, why) == 0 &&
	    spaced_field_put_str(&b, identity_text) == 0)
		(void)spaced_frame_send(fd, SPACED_GUEST_OUT_RESULT, SPACED_FRAME_F_END, 0, b.data, b.len);
	spaced_buf_free(&b);
}
