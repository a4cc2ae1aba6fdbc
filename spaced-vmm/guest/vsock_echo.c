/*
 * vsock_echo.c — the guest-side test listener of the qemu substrate.
 *
 * Listens on AF_VSOCK port PORT (default 1024) for connections from any CID
 * and echoes every byte back until the peer shuts its side down. One child
 * process per connection, so a stuck or slow connection never holds up the
 * next one. Built statically (gcc -static) by spaced-vmm/mkinitramfs.sh and
 * started by the initramfs's /init; spaced's guest agent will listen there
 * instead once it runs inside microVMs.
 *
 *   vsock-echo [PORT]
 *
 * Prints "vsock-echo: listening on port PORT" on stdout once it listens (the
 * test waits for that line on the serial console).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

#define ECHO_BUF (64 * 1024)

/* Copies everything read from fd back to it until EOF or an error. Returns 0
 * on a clean EOF, -1 otherwise. */
static int echo_loop(int fd)
{
	static char buf[ECHO_BUF];

	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf));

		if (n == 0)
			return 0;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		for (ssize_t off = 0; off < n;) {
			ssize_t w = write(fd, buf + off, (size_t)(n - off));

			if (w < 0) {
				if (errno == EINTR)
					continue;
				return -1;
			}
			off += w;
		}
	}
}

int main(int argc, char **argv)
{
	struct sockaddr_vm addr;
	unsigned long port = 1024;
	int lfd;

	if (argc > 1) {
		char *end;

		errno = 0;
		port = strtoul(argv[1], &end, 10);
		if (errno || *end || end == argv[1] || port > 0xffffffffUL) {
			fprintf(stderr, "vsock-echo: bad port '%s'\n", argv[1]);
			return 2;
		}
	}
	signal(SIGCHLD, SIG_IGN); /* children are reaped by the kernel */
	signal(SIGPIPE, SIG_IGN);
	lfd = socket(AF_VSOCK, SOCK_STREAM, 0);
	if (lfd < 0) {
		perror("vsock-echo: socket(AF_VSOCK)");
		return 1;
	}
	memset(&addr, 0, sizeof(addr));
	addr.svm_family = AF_VSOCK;
	addr.svm_cid = VMADDR_CID_ANY;
	addr.svm_port = (unsigned)port;
	if (bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || listen(lfd, 128) < 0) {
		perror("vsock-echo: bind/listen");
		return 1;
	}
	printf("vsock-echo: listening on port %lu\n", port);
	fflush(stdout);
	for (;;) {
		int fd = accept(lfd, NULL, NULL);
		pid_t pid;

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			perror("vsock-echo: accept");
			sleep(1);
			continue;
		}
		pid = fork();
		if (pid == 0) {
			close(lfd);
			_exit(echo_loop(fd) == 0 ? 0 : 1);
		}
		if (pid < 0) /* no child: refuse this one, keep listening */
			perror("vsock-echo: fork");
		close(fd);
	}
}
