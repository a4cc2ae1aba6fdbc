/* bridge.c — verification of the guest endpoint and the relay (B1–B3). */
#include "host.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "spaced_error.h"
#include "frame.h"
#include "guest_proto.h"
#include "host_client.h"
#include "util.h"
#include "vsock_hs.h"

/* Reads of fd give up after ms milliseconds without data (0: never). */
static int set_recv_timeout(int fd, int ms)
{
	struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
	return setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0 ? SPACED_ESYS : SPACED_OK;
}

/* The error of a failed read: a timeout, or an I/O error. */
static int read_error(int r)
{
	return r == SPACED_EIO && (errno == EAGAIN || errno == EWOULDBLOCK) ? SPACED_ETIMEDOUT : r;
}

/* Reads the "OK <n>\n" answer: peeks at what has arrived and consumes exactly
 * the line, so not one byte of the guest's stream is taken with it (bytes
 * without a newline are all part of the line and are consumed as they come). */
static int read_ok_line(int fd, char *why, size_t whysz)
{
	uint8_t line[SPACED_VSOCK_HS_MAX];
	size_t n = 0;
	int len = 0;
	while (len == 0) {
		ssize_t got = recv(fd, line + n, sizeof line - n, MSG_PEEK);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			snprintf(why, whysz, "no handshake answer from the guest transport (%s)",
			         spaced_strerror(SPACED_ETIMEDOUT));
			return SPACED_ETIMEDOUT;
		}
		if (got <= 0) {
			snprintf(why, whysz, "guest transport closed during the handshake");
			return SPACED_ECLOSED;
		}
		len = spaced_vsock_hs_line_len(line, n + (size_t)got);
		if (len < 0)
			break;
		size_t take = len > 0 ? (size_t)len - n : (size_t)got;
		if (recv(fd, line + n, take, 0) != (ssize_t)take) {
			snprintf(why, whysz, "guest transport closed during the handshake");
			return SPACED_ECLOSED;
		}
		n += take;
	}
	uint32_t val;
	if (len < 0 || spaced_vsock_hs_parse_ok(line, (size_t)len, &val) < 0) {
		snprintf(why, whysz, "malformed handshake answer from the guest transport");
		return SPACED_EPROTO;
	}
	return SPACED_OK;
}

/* Compares the identity in the guest's answer to HELLO (already sent with
 * hello_id) with the expected one. With answer != NULL, the checked answer is
 * kept there, whole (header and payload). */
static int check_identity(const struct host_config *cfg, int fd, uint32_t hello_id, struct spaced_buf *answer,
                          char *why, size_t whysz)
{
	struct spaced_frame_hdr hdr;
	uint8_t *payload = NULL;
	int r = spaced_frame_recv(fd, 64 * 1024, &hdr, &payload);
	if (r < 0) {
		r = read_error(r);
		snprintf(why, whysz, "no HELLO answer from the guest (%s)", spaced_strerror(r));
		return r;
	}
	struct spaced_field_reader rd;
	int64_t status = 0;
	const char *msg, *text;
	size_t msg_len, text_len;
	spaced_field_reader_init(&rd, payload, hdr.len);
	if (hdr.type != SPACED_GUEST_OUT_RESULT || hdr.id != hello_id || !(hdr.flags & SPACED_FRAME_F_END) ||
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
	if (answer != NULL && spaced_frame_append(answer, hdr.type, hdr.flags, hdr.id, payload, hdr.len) < 0) {
		snprintf(why, whysz, "cannot keep the HELLO answer");
		r = SPACED_ENOMEM;
	}
out:
	free(payload);
	return r;
}

/* When the caller's first frame has already arrived and is a bare HELLO
 * (no payload, no flags), takes it and returns its id: the bridge then sends
 * it as its own, checks the answer and keeps it for the caller, one round
 * trip to the guest instead of two. HELLO changes nothing in the guest, and
 * it is still the bridge that sends it before anything else of the caller's.
 * Returns -1 (nothing taken) otherwise. */
static int64_t take_callers_hello(int caller)
{
	uint8_t h[SPACED_FRAME_HDR_LEN];
	struct spaced_frame_hdr hdr;
	if (recv(caller, h, sizeof h, MSG_PEEK | MSG_DONTWAIT) != (ssize_t)sizeof h ||
	    spaced_frame_hdr_decode(&hdr, h, 0) < 0 || hdr.type != SPACED_GUEST_HELLO || hdr.len != 0 ||
	    hdr.flags != 0 || recv(caller, h, sizeof h, MSG_DONTWAIT) != (ssize_t)sizeof h)
		return -1;
	return hdr.id;
}

int host_open_guest(const struct host_config *cfg, int caller, struct spaced_buf *answer, int *fd_out,
                    char *why, size_t whysz)
{
	int fd = -1, r;
	r = host_connect_listener(cfg, &fd, why, whysz);
	if (r < 0)
		return r;
	int64_t callers_hello = caller >= 0 ? take_callers_hello(caller) : -1;
	uint32_t hello_id = callers_hello >= 0 ? (uint32_t)callers_hello : 1;
	/* The handshake line and the bridge's own HELLO leave in one write: the
	 * transport consumes exactly the CONNECT line and leaves the HELLO in the
	 * stream for the guest (Firecracker reads the line byte by byte for the
	 * same reason), which saves a round trip per connection. Nothing of the
	 * caller's reaches the guest before the answer is checked (B3). */
	uint8_t out[SPACED_VSOCK_HS_MAX + 1 + SPACED_FRAME_HDR_LEN];
	int n = spaced_vsock_hs_format_connect((char *)out, SPACED_VSOCK_HS_MAX + 1, cfg->guest_port);
	if (n < 0) {
		snprintf(why, whysz, "cannot format the handshake");
		r = SPACED_EINVAL;
		goto fail;
	}
	struct spaced_frame_hdr hello = {.len = 0, .type = SPACED_GUEST_HELLO, .flags = 0, .id = hello_id};
	spaced_frame_hdr_encode(out + n, &hello);
	if (set_recv_timeout(fd, cfg->timeout_ms) < 0 ||
	    spaced_io_write_full(fd, out, (size_t)n + SPACED_FRAME_HDR_LEN) < 0) {
		snprintf(why, whysz, "cannot send the handshake to the guest transport");
		r = SPACED_EIO;
		goto fail;
	}
	if ((r = read_ok_line(fd, why, whysz)) < 0)
		goto fail;
	if ((r = check_identity(cfg, fd, hello_id, callers_hello >= 0 ? answer : NULL, why, whysz)) < 0)
		goto fail;
	if (set_recv_timeout(fd, 0) < 0) {
		snprintf(why, whysz, "cannot clear the handshake timeout");
		r = SPACED_ESYS;
		goto fail;
	}
	*fd_out = fd;
	return SPACED_OK;
fail:
	close(fd);
	return r;
}

/* One direction of the relay: bytes read from `from` and not yet written to `to`. */
struct half {
	int from, to;
	uint8_t *buf;
	size_t off, len;
};

enum { HALF_ENDED = -1, HALF_IDLE = 0, HALF_MOVED = 1 };

/* Moves what it can without blocking. Returns HALF_MOVED when bytes were
 * read or written, HALF_IDLE when nothing could move, HALF_ENDED when `from`
 * ended or either side failed. */
static int half_step(struct half *h, short revents)
{
	int moved = HALF_IDLE;
	if (h->len == 0 && (revents & (POLLIN | POLLHUP | POLLERR))) {
		ssize_t got = recv(h->from, h->buf, HOST_RELAY_BUF, MSG_DONTWAIT);
		if (got < 0)
			return errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK ? HALF_IDLE : HALF_ENDED;
		if (got == 0)
			return HALF_ENDED;
		h->off = 0;
		h->len = (size_t)got;
		moved = HALF_MOVED;
	}
	while (h->len > 0) {
		ssize_t put = send(h->to, h->buf + h->off, h->len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (put < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN || errno == EWOULDBLOCK ? moved : HALF_ENDED;
		}
		h->off += (size_t)put;
		h->len -= (size_t)put;
		moved = HALF_MOVED;
	}
	return moved;
}

/*
 * The relay's spin. After bytes moved, the next ones often follow within
 * microseconds (the rest of an answer, a guest answering a read, a caller
 * sending its next request), and on a virtual machine the wake-up from poll is
 * most of what a hop costs. So after a move the relay may keep checking both
 * sides without sleeping for up to spin_us before it sleeps:
 *   - only while the traffic comes close together: after a move that woke it
 *     from poll sooner than spin_us after the move before (a spin would have
 *     caught it), or that a spin caught. A connection that says one thing and
 *     waits (a claim's HELLO, an agent typing, a watch) never spins;
 *   - a spin that ends without bytes stops spinning until traffic comes close
 *     together again;
 *   - between checks it yields the processor, and a yield that let other work
 *     run (the machine is busy) ends the spin at once.
 * So a connection pays at most spin_us of processor time per move, and only
 * while its traffic came close together and the processor had nothing else to do.
 */
enum { SPIN_BUSY_NS = 20000 };

void host_relay(int a, int b, struct host_relay_bufs *bufs, int spin_us)
{
	struct half up = {a, b, bufs->up, 0, 0}, down = {b, a, bufs->down, 0, 0};
	struct half *hs[2] = {&up, &down};
	uint64_t spin_ns = (uint64_t)spin_us * 1000u;
	uint64_t spin_until = 0; /* spinning until then (0: sleeping in poll) */
	uint64_t last_move = 0;  /* when bytes last moved */
	for (;;) {
		/* a direction with bytes pending waits for room at its destination
		 * and reads nothing more meanwhile; the other one goes on */
		short ready[2] = {POLLIN, POLLIN}; /* while spinning: try both directly */
		if (spin_until == 0) {
			struct pollfd p[2];
			for (int i = 0; i < 2; i++)
				p[i] = hs[i]->len > 0 ? (struct pollfd){.fd = hs[i]->to, .events = POLLOUT}
				                      : (struct pollfd){.fd = hs[i]->from, .events = POLLIN};
			int n = poll(p, 2, -1);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0)
				break;
			ready[0] = p[0].revents;
			ready[1] = p[1].revents;
		}
		int step = HALF_IDLE;
		for (int i = 0; i < 2 && step != HALF_ENDED; i++) {
			int s = ready[i] != 0 ? half_step(hs[i], hs[i]->len > 0 ? 0 : ready[i]) : HALF_IDLE;
			if (s == HALF_ENDED || s > step)
				step = s;
		}
		if (step == HALF_ENDED)
			break;
		uint64_t now = spaced_mono_ns();
		if (step == HALF_MOVED && spin_ns > 0) {
			/* caught by a spin, or it would have been */
			bool close_together = spin_until != 0 || now - last_move < spin_ns;
			last_move = now;
			spin_until = close_together ? now + spin_ns : 0;
		} else if (spin_until != 0 && step == HALF_IDLE) {
			if (now >= spin_until) {
				spin_until = 0;
				continue;
			}
			/* a yield that ran something else says the processor is wanted:
			 * sleep instead of spinning on */
			sched_yield();
			if (spaced_mono_ns() - now > SPIN_BUSY_NS)
				spin_until = 0;
		}
	}
	shutdown(a, SHUT_RDWR);
	shutdown(b, SHUT_RDWR);
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
