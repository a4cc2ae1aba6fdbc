/* vm_guest.c — spaced-vm reaching its guest the way any host program does:
 * through the hybrid vsock socket (CONNECT <port>), every read bounded in
 * size and time (vm_int.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "error.h"
#include "frame.h"
#include "guest_client.h"
#include "util.h"
#include "vm_int.h"

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
	size_t got = 0;
	while (got < sizeof line - 1) {
		ssize_t r = recv(fd, line + got, 1, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			close(fd);
			return SPACED_ECLOSED; /* refused: no listener yet, or the guest is gone */
		}
		if (line[got++] == '\n')
			break;
	}
	line[got] = '\0';
	if (strncmp(line, "OK ", 3) != 0 || line[got - 1] != '\n') {
		close(fd);
		return SPACED_EPROTO;
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
	int fd, e = dial(VM_CTL_PORT, timeout_ms, &fd);
	if (e < 0)
		return e;
	if (spaced_io_write_full(fd, line, strlen(line)) < 0 || spaced_io_write_full(fd, "\n", 1) < 0) {
		close(fd);
		return SPACED_ECLOSED;
	}
	size_t got = 0;
	e = SPACED_ECLOSED;
	while (got + 1 < answersz) {
		ssize_t r = recv(fd, answer + got, 1, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		if (answer[got] == '\n') {
			e = 0;
			break;
		}
		got++;
	}
	if (got + 1 >= answersz)
		e = SPACED_ETOOBIG;
	answer[got] = '\0';
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
