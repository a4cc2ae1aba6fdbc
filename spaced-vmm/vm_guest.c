/* vm_guest.c — spaced-vm reaching its guest the way any host program does:
 * through the hybrid vsock socket (CONNECT <port>), every read bounded in
 * size and time (vm_int.h): an answer line has one deadline for all of it,
 * so a guest that trickles its bytes holds spaced-vm no longer than one
 * that says nothing. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "spaced_error.h"
#include "frame.h"
#include "guest_client.h"
#include "util.h"
#include "vm_int.h"

/* One line from fd into line (its '\n' replaced by NUL) by deadline
 * (spaced_mono_ns): 0, SPACED_ETIMEDOUT, SPACED_ECLOSED or SPACED_ETOOBIG. */
static int line_by(int fd, char *line, size_t sz, uint64_t deadline)
{
	size_t got = 0;
	line[0] = '\0';
	while (got + 1 < sz) {
		uint64_t now = spaced_mono_ns();
		if (now >= deadline)
			return SPACED_ETIMEDOUT;
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int n = poll(&p, 1, (int)((deadline - now + 999999u) / 1000000u));
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0)
			return SPACED_ETIMEDOUT;
		ssize_t r = recv(fd, line + got, 1, MSG_DONTWAIT);
		if (r < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (r <= 0)
			return SPACED_ECLOSED;
		if (line[got] == '\n') {
			line[got] = '\0';
			return 0;
		}
		line[++got] = '\0';
	}
	return SPACED_ETOOBIG;
}

/* A stream to the guest's vsock port, after CONNECT / OK. */
static int dial(uint32_t port, int timeout_ms, int *out)
{
	char path[PATH_MAX + 16], line[64];
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(path, sizeof path, "%s/guest.sock", V.vmdir);
	if (strlen(path) >= sizeof sa.sun_path)
		return SPACED_ETOOBIG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return SPACED_ESYS;
	struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	int n = snprintf(line, sizeof line, "CONNECT %u\n", port);
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || spaced_io_write_full(fd, line, (size_t)n) < 0) {
		close(fd);
		return SPACED_ECLOSED;
	}
	int e = line_by(fd, line, sizeof line, spaced_mono_ns() + (uint64_t)timeout_ms * 1000000u);
	if (e < 0 || strncmp(line, "OK ", 3) != 0) {
		close(fd);
		/* closed or silent: no listener yet, or the guest is gone */
		return e == SPACED_ECLOSED || e == SPACED_ETIMEDOUT ? SPACED_ECLOSED : SPACED_EPROTO;
	}
	*out = fd;
	return 0;
}

int vm_guest_hello(char *why, size_t whysz)
{
	struct spaced_guest_client *c;
	int fd, e = dial(V.port, 3000, &fd);
	if (e < 0)
		return e;
	if ((e = spaced_guest_client_adopt(fd, &c)) < 0)
		return e;
	struct spaced_identity got;
	e = spaced_guest_hello(c, &got);
	spaced_guest_client_free(c);
	if (e < 0)
		return e;
	if (!spaced_identity_equal(&got, &V.id)) {
		char text[SPACED_IDENTITY_TEXT_MAX];
		spaced_identity_encode(&got, text, sizeof text);
		spaced_why(why, whysz, "the guest reports identity %s", text);
		return SPACED_EIDENTITY;
	}
	return 0;
}

int vm_guest_control(const char *line, char *answer, size_t answersz, int timeout_ms)
{
	uint64_t deadline = spaced_mono_ns() + (uint64_t)timeout_ms * 1000000u;
	int fd, e = dial(VM_CTL_PORT, timeout_ms, &fd);
	if (e < 0)
		return e;
	if (spaced_io_write_full(fd, line, strlen(line)) < 0 || spaced_io_write_full(fd, "\n", 1) < 0) {
		close(fd);
		return SPACED_ECLOSED;
	}
	e = line_by(fd, answer, answersz, deadline);
	close(fd);
	return e;
}

int vm_guest_sync(void)
{
	char answer[64];
	int e = vm_guest_control("SYNC", answer, sizeof answer, VM_SYNC_TIMEOUT_MS);
	if (e == 0 && strcmp(answer, "SYNCED") != 0)
		e = SPACED_EPROTO;
	return e;
}
