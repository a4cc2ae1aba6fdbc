/*
 * peer_helper.c — a small real process for the pidref tests: it listens on a
 * Unix socket path (replacing whatever file is there), prints "ready" on
 * stdout, and accepts and closes connections until killed.
 *
 *   peer-helper listen PATH
 */
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (argc != 3 || strcmp(argv[1], "listen") != 0 || strlen(argv[2]) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "usage: peer-helper listen PATH\n");
		return 2;
	}
	memcpy(sa.sun_path, argv[2], strlen(argv[2]) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	unlink(argv[2]);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 16) < 0) {
		perror("peer-helper");
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	for (;;) {
		int c = accept(fd, NULL, NULL);

		if (c >= 0)
			close(c);
	}
}
