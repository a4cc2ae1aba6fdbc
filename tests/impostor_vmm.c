/*
 * impostor-vmm — a test peer for the bridge's impostor tests (B1–B3).
 *
 * It listens on a Unix socket path and behaves exactly like a well-behaved
 * launcher with a guest behind it: it answers "CONNECT <port>\n" with
 * "OK <port>\n" and HELLO with a RESULT naming the identity it is told to
 * claim. A bridge must refuse it all the same, because the process holding the
 * socket is not the launcher it expects.
 *
 *   impostor-vmm PATH IDENTITY_TEXT      (prints "ready\n" on stdout once listening)
 */
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
#include "vsock_hs.h"

static void serve(int fd, const char *identity)
{
	uint8_t line[SPACED_VSOCK_HS_MAX];
	size_t n = 0;
	uint32_t port;
	while (n < sizeof line && read(fd, line + n, 1) == 1)
		if (line[n++] == '\n')
			break;
	if (spaced_vsock_hs_parse_connect(line, n, &port) < 0)
		return;
	char ok[SPACED_VSOCK_HS_MAX + 1];
	int l = spaced_vsock_hs_format_ok(ok, sizeof ok, port);
	if (l < 0 || spaced_io_write_full(fd, ok, (size_t)l) < 0)
		return;
	for (;;) {
		struct spaced_frame_hdr h;
		uint8_t *p = NULL;
		if (spaced_frame_recv(fd, SPACED_FRAME_MAX, &h, &p) < 0)
			return;
		free(p);
		struct spaced_buf b;
		spaced_buf_init(&b, 4096);
		spaced_field_put_i64(&b, 0);
		spaced_field_put_str(&b, "");
		spaced_field_put_str(&b, identity);
		spaced_frame_send(fd, SPACED_GUEST_OUT_RESULT, SPACED_FRAME_F_END, h.id, b.data, b.len);
		spaced_buf_free(&b);
	}
}

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(argv[1]) >= sizeof sa.sun_path)
		return 2;
	strcpy(sa.sun_path, argv[1]);
	unlink(argv[1]);
	int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(lfd, 16) < 0) {
		perror("impostor-vmm");
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	for (;;) {
		int fd = accept(lfd, NULL, NULL);
		if (fd < 0)
			continue;
		serve(fd, argv[2]);
		close(fd);
	}
}
