/*
 * stub_guest.c — a stand-in for spaced-guest used by the substrate tests
 * only while BUILD/spaced-guest/spaced-guest does not exist. It speaks the
 * guest's control protocol (substrate.h): answers READY, accepts IDENTITY
 * once and CONN <port> + fd; on each connection it writes one banner line
 * "stub-guest port=<port> identity=<text or ->\n" and then echoes what it reads.
 *
 *   stub-guest --root / --control-fd N [--identity TEXT]
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXC 64

static char identity[600] = "-";

static int recv_ctl(int ctl, char *buf, size_t sz, int *fd_out)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} cb;
	struct iovec iov = { .iov_base = buf, .iov_len = sz - 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b,
	                     .msg_controllen = sizeof(cb.b) };
	struct cmsghdr *c;
	ssize_t n = recvmsg(ctl, &mh, MSG_CMSG_CLOEXEC);

	*fd_out = -1;
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	c = CMSG_FIRSTHDR(&mh);
	if (c != NULL && c->cmsg_type == SCM_RIGHTS)
		memcpy(fd_out, CMSG_DATA(c), sizeof(int));
	return 0;
}

int main(int argc, char **argv)
{
	struct pollfd pfd[MAXC + 1];
	int conns[MAXC], nconn = 0, ctl = -1;

	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--control-fd") == 0)
			ctl = atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--identity") == 0)
			snprintf(identity, sizeof(identity), "%s", argv[i + 1]);
	}
	if (ctl < 0)
		return 2;
	if (send(ctl, "READY", 5, MSG_NOSIGNAL) != 5)
		return 1;
	for (;;) {
		char buf[4096];
		int n;

		while (waitpid(-1, NULL, WNOHANG) > 0)
			; /* PID 1 reaps what is reparented to it */
		pfd[0].fd = ctl;
		pfd[0].events = POLLIN;
		for (int i = 0; i < nconn; i++) {
			pfd[i + 1].fd = conns[i];
			pfd[i + 1].events = POLLIN;
		}
		n = poll(pfd, (nfds_t)nconn + 1, 200);
		if (n < 0 && errno != EINTR)
			return 1;
		if (n <= 0)
			continue;
		if (pfd[0].revents) {
			int fd;

			if (recv_ctl(ctl, buf, sizeof(buf), &fd) < 0)
				return 0; /* the supervisor is gone */
			if (strncmp(buf, "IDENTITY ", 9) == 0 && strcmp(identity, "-") == 0) {
				snprintf(identity, sizeof(identity), "%s", buf + 9);
			} else if (strncmp(buf, "CONN ", 5) == 0 && fd >= 0 && nconn < MAXC) {
				char banner[700];
				int bl = snprintf(banner, sizeof(banner), "stub-guest port=%s identity=%s\n",
				                  buf + 5, identity);

				if (write(fd, banner, (size_t)bl) != bl) {
					close(fd);
					continue;
				}
				conns[nconn++] = fd;
				continue;
			} else if (fd >= 0) {
				close(fd);
			}
		}
		for (int i = nconn - 1; i >= 0; i--) {
			ssize_t r;

			if (!pfd[i + 1].revents)
				continue;
			r = read(conns[i], buf, sizeof(buf));
			if (r <= 0 || write(conns[i], buf, (size_t)r) != r) {
				close(conns[i]);
				conns[i] = conns[--nconn];
			}
		}
	}
}
