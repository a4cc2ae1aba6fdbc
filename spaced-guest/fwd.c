/* fwd.c — ServicePort forwarding of spaced-guest (opt-in: --service-ports).
 *
 * A connection the launcher hands over for a port other than the guest API
 * port is joined to 127.0.0.1:<port> inside the execution: bytes are copied
 * both ways, each direction through a bounded buffer, half-closes are passed
 * on. The guest does not interpret these bytes and attaches no identity to
 * them (B4: the gateway's checks decide, R5).
 *
 * Hand-back: for port | FWD_HANDBACK the guest makes the connection to
 * 127.0.0.1:port and, once it is established, hands that socket back over the
 * transport connection (one byte with SCM_RIGHTS) and keeps nothing: the
 * gateway then relays between its client and the port with no hop inside (the
 * process substrate's transport is a Unix socket; a microVM's is not, and
 * its gateway asks for the relay). When the connection fails, the transport
 * connection is closed. */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "error.h"
#include "guest.h"

#define FWD_BUF (64 * 1024)
#define FWD_HANDBACK 0x10000u
#define FWD_MAX 256

struct fwd_dir {
	uint8_t *buf;
	size_t len, off;
	bool eof;      /* the source reached its end */
	bool shut;     /* the end was passed on to the sink */
};

struct fwd {
	struct fwd *next;
	int a, b; /* a: the handed-over connection; b: the local service */
	bool connecting, dead, handback;
	struct fwd_dir ab, ba;
};

static struct fwd *fwds;
static unsigned nfwd;

int fwd_start(int fd, uint32_t port)
{
	bool handback = (port & FWD_HANDBACK) != 0;
	port &= ~FWD_HANDBACK;
	if (nfwd >= FWD_MAX || port == 0 || port > 65535) {
		close(fd);
		return SPACED_EBUSY;
	}
	struct fwd *f = calloc(1, sizeof *f);
	int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (f == NULL || s < 0) {
		free(f);
		if (s >= 0)
			close(s);
		close(fd);
		return SPACED_ESYS;
	}
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(s, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS) {
		guest_log("fwd port=%u connect failed: %s", port, strerror(errno));
		close(s);
		close(fd);
		free(f);
		return SPACED_ESYS;
	}
	f->a = fd;
	f->b = s;
	f->connecting = true;
	f->handback = handback;
	f->next = fwds;
	fwds = f;
	nfwd++;
	guest_log("fwd port=%u open", port);
	return 0;
}

/* Moves bytes from src into d's buffer, and from the buffer into dst. */
static void pump(struct fwd *f, int src, int dst, struct fwd_dir *d, short rev_src, short rev_dst)
{
	if ((rev_src & (POLLIN | POLLHUP | POLLERR)) && !d->eof && d->len < FWD_BUF) {
		if (d->buf == NULL && (d->buf = malloc(FWD_BUF)) == NULL) {
			f->dead = true;
			return;
		}
		if (d->off > 0 && d->len > 0)
			memmove(d->buf, d->buf + d->off, d->len);
		d->off = 0;
		ssize_t k = recv(src, d->buf + d->len, FWD_BUF - d->len, MSG_DONTWAIT);
		if (k > 0)
			d->len += (size_t)k;
		else if (k == 0)
			d->eof = true;
		else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			f->dead = true;
	}
	(void)rev_dst; /* a non-blocking send is tried whenever bytes wait */
	if (d->len > 0) {
		ssize_t k = send(dst, d->buf + d->off, d->len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (k > 0) {
			d->off += (size_t)k;
			d->len -= (size_t)k;
		} else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
			f->dead = true;
		}
	}
	if (d->eof && d->len == 0 && !d->shut) {
		(void)shutdown(dst, SHUT_WR);
		d->shut = true;
	}
}

void fwd_poll_add(void (*add)(int fd, short ev, void *ptr))
{
	for (struct fwd *f = fwds; f != NULL; f = f->next) {
		if (f->dead)
			continue;
		if (f->connecting) {
			add(f->b, POLLOUT, f);
			continue;
		}
		short ea = 0, eb = 0;
		if (!f->ab.eof && f->ab.len < FWD_BUF)
			ea |= POLLIN;
		if (f->ab.len > 0)
			eb |= POLLOUT;
		if (!f->ba.eof && f->ba.len < FWD_BUF)
			eb |= POLLIN;
		if (f->ba.len > 0)
			ea |= POLLOUT;
		add(f->a, ea, f);
		add(f->b, eb, f);
	}
}

void fwd_on_event(void *ptr, int fd, short revents)
{
	struct fwd *f = ptr;
	if (f->dead)
		return;
	if (f->connecting) {
		int err = 0;
		socklen_t el = sizeof err;
		if (getsockopt(f->b, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err != 0) {
			guest_log("fwd connect failed: %s", strerror(err));
			f->dead = true;
			return;
		}
		f->connecting = false;
		if (f->handback) {
			/* the established connection goes to the gateway; nothing stays here */
			char one = 1;
			union {
				struct cmsghdr h;
				char buf[CMSG_SPACE(sizeof(int))];
			} u;
			struct iovec iov = {.iov_base = &one, .iov_len = 1};
			struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
			struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(cm), &f->b, sizeof(int));
			if (sendmsg(f->a, &mh, MSG_NOSIGNAL) != 1)
				guest_log("fwd hand-back failed: %s", strerror(errno));
			f->dead = true;
		}
		return;
	}
	if (fd == f->a) {
		pump(f, f->a, f->b, &f->ab, revents, 0);
		pump(f, f->b, f->a, &f->ba, 0, revents);
	} else {
		pump(f, f->b, f->a, &f->ba, revents, 0);
		pump(f, f->a, f->b, &f->ab, 0, revents);
	}
	if (f->ab.shut && f->ba.shut)
		f->dead = true;
}

void fwd_reap(void)
{
	struct fwd **fp = &fwds;
	while (*fp != NULL) {
		struct fwd *f = *fp;
		if (f->dead) {
			*fp = f->next;
			close(f->a);
			close(f->b);
			free(f->ab.buf);
			free(f->ba.buf);
			free(f);
			nfwd--;
		} else {
			fp = &f->next;
		}
	}
}
