/*
 * vsock_dial.c — the guest side of a guest-initiated connection, for the
 * qemu substrate's test: connects to the host (CID 2) port PORT, sends TEXT
 * and a newline, shuts its sending side, and prints what comes back until
 * EOF as one line "vsock-dial: reply: ...". Retries a refused connection for
 * up to 10 s (the host's listener may come after the guest). Static
 * (gcc -static), started in the background by the test initramfs's /init.
 *
 *   vsock-dial PORT TEXT
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

int main(int argc, char **argv)
{
	struct sockaddr_vm addr;
	char reply[512];
	size_t got = 0;
	int fd = -1;

	if (argc != 3) {
		fprintf(stderr, "usage: vsock-dial PORT TEXT\n");
		return 2;
	}
	memset(&addr, 0, sizeof(addr));
	addr.svm_family = AF_VSOCK;
	addr.svm_cid = VMADDR_CID_HOST;
	addr.svm_port = (unsigned)strtoul(argv[1], NULL, 10);
	for (int i = 0; i < 100; i++) {
		fd = socket(AF_VSOCK, SOCK_STREAM, 0);
		if (fd < 0) {
			perror("vsock-dial: socket");
			return 1;
		}
		if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0)
			break;
		close(fd);
		fd = -1;
		usleep(100000);
	}
	if (fd < 0) {
		printf("vsock-dial: cannot connect to the host's port %u: %s\n", addr.svm_port, strerror(errno));
		return 1;
	}
	if (write(fd, argv[2], strlen(argv[2])) < 0 || write(fd, "\n", 1) < 0) {
		perror("vsock-dial: write");
		return 1;
	}
	shutdown(fd, SHUT_WR);
	while (got < sizeof(reply) - 1) {
		ssize_t n = read(fd, reply + got, sizeof(reply) - 1 - got);

		if (n <= 0)
			break;
		got += (size_t)n;
	}
	reply[got] = '\0';
	if (got > 0 && reply[got - 1] == '\n')
		reply[got - 1] = '\0';
	printf("vsock-dial: reply: %s\n", reply);
	close(fd);
	return 0;
}
