/* host_client.c — connecting to an execution through its spaced-host bridge. */
#include "host_client.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "spaced_error.h"
#include "frame.h"
#include "guest_proto.h"
#include "util.h"

/* Receives one frame whose payload fits in buf, with at most one descriptor. */
static int recv_frame_fd(int fd, struct spaced_frame_hdr *h, uint8_t *buf, size_t bufsz, int *passed)
{
	uint8_t hdr[SPACED_FRAME_HDR_LEN];
	union {
		struct cmsghdr align;
		char b[CMSG_SPACE(sizeof(int))];
	} cb;
	struct iovec iov = {.iov_base = hdr, .iov_len = sizeof hdr};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b,
	                    .msg_controllen = sizeof cb.b};
	*passed = -1;
	ssize_t n;
	do
		n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL);
	while (n < 0 && errno == EINTR);
	if (n == 0)
		return SPACED_ECLOSED;
	if (n != (ssize_t)sizeof hdr)
		return SPACED_EPROTO;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
		    c->cmsg_len == CMSG_LEN(sizeof(int)) && *passed < 0)
			memcpy(passed, CMSG_DATA(c), sizeof(int));
		else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			return SPACED_EPROTO; /* more descriptors than one (they are closed by the caller's exit path) */
	}
	int r = spaced_frame_hdr_decode(h, hdr, (uint32_t)bufsz);
	if (r == 0 && h->len > 0)
		r = spaced_io_read_full(fd, buf, h->len);
	if (r < 0 && *passed >= 0) {
		close(*passed);
		*passed = -1;
	}
	return r;
}

int spaced_host_connect(const char *path, bool expect_handoff, int timeout_ms, int *fd_out, char *why,
                        size_t whysz)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t plen = strlen(path);
	if (plen >= sizeof sa.sun_path)
		return SPACED_EINVAL;
	memcpy(sa.sun_path, path, plen + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return SPACED_ESYS;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		snprintf(why, whysz, "cannot connect to the bridge at %s: %s", path, strerror(errno));
		close(fd);
		return SPACED_ESYS;
	}
	if (!expect_handoff) {
		*fd_out = fd;
		return SPACED_OK;
	}
	struct pollfd p = {.fd = fd, .events = POLLIN};
	if (poll(&p, 1, timeout_ms) <= 0) {
		snprintf(why, whysz, "no answer from the bridge within %d ms", timeout_ms);
		close(fd);
		return SPACED_ETIMEDOUT;
	}
	struct spaced_frame_hdr h;
	uint8_t payload[2048];
	int passed = -1, r = recv_frame_fd(fd, &h, payload, sizeof payload, &passed);
	close(fd);
	if (r < 0) {
		snprintf(why, whysz, "malformed answer from the bridge (%s)", spaced_strerror(r));
		return r;
	}
	if (h.type == SPACED_HOST_HANDOFF && h.id == 0 && passed >= 0) {
		*fd_out = passed;
		return SPACED_OK;
	}
	if (passed >= 0)
		close(passed);
	struct spaced_field_reader rd;
	int64_t status = SPACED_EPROTO;
	spaced_field_reader_init(&rd, payload, h.len);
	if (h.type != SPACED_GUEST_OUT_RESULT || spaced_field_get_i64(&rd, &status) < 0 || status >= 0 ||
	    spaced_field_get_strbuf(&rd, why, whysz) < 0) {
		snprintf(why, whysz, "unexpected answer from the bridge");
		return SPACED_EPROTO;
	}
	return (int)status;
}
