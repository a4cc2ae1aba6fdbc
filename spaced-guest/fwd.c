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
 * connection is closed.
 *
 * A microVM's gateway reaches ServicePorts through the guest's vsock forward
 * port (fwd_vsock_listen): each connection there starts with the line
 * "CONNECT <port>\n" (the vsock handshake's syntax, vsock_hs.h, within
 * FWD_LINE_MS); once 127.0.0.1:<port> is connected the guest answers
 * "OK <port>\n" and relays, and when nothing listens there it closes the
 * connection without an answer. */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "spaced_error.h"
#include "guest.h"
#include "util.h"
#include "vsock_hs.h"

#define FWD_BUF (64 * 1024)
#define FWD_HANDBACK 0x10000u
#define FWD_MAX 256
#define FWD_LINE_MS 10000 /* for a vsock connection's CONNECT line */

struct fwd_dir {
	uint8_t *buf;
	size_t len, off;
	bool eof;      /* the source reached its end */
	bool shut;     /* the end was passed on to the sink */
};

struct fwd {
	struct fwd *next;
	int a, b; /* a: the handed-over connection; b: the local service (-1 before it) */
	bool reading_line; /* a vsock connection whose CONNECT line is not in yet */
	bool connecting, dead, handback, announce;
	uint32_t port;
	uint64_t deadline; /* for the CONNECT line */
	struct fwd_dir ab, ba;
};

static struct fwd *fwds;
static unsigned nfwd;
static int vsock_listen_fd = -1;
static char listener_tag; /* fwd_on_event's ptr for the vsock listener */

/* Starts connecting f->b to 127.0.0.1:f->port. */
static int fwd_connect(struct fwd *f)
{
	int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s < 0)
		return SPACED_ESYS;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)f->port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(s, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS) {
		guest_log("fwd port=%u connect failed: %s", f->port, strerror(errno));
		close(s);
		return SPACED_ESYS;
	}
	f->b = s;
	f->connecting = true;
	guest_log("fwd port=%u open", f->port);
	return 0;
}

/* A new forwarding on connection fd (taken: closed on failure). */
static struct fwd *fwd_new(int fd)
{
	struct fwd *f = nfwd < FWD_MAX ? calloc(1, sizeof *f) : NULL;
	if (f == NULL) {
		close(fd);
		return NULL;
	}
	f->a = fd;
	f->b = -1;
	f->next = fwds;
	fwds = f;
	nfwd++;
	return f;
}

int fwd_start(int fd, uint32_t port)
{
	bool handback = (port & FWD_HANDBACK) != 0;
	port &= ~FWD_HANDBACK;
	if (port == 0 || port > 65535) {
		close(fd);
		return SPACED_EINVAL;
	}
	struct fwd *f = fwd_new(fd);
	if (f == NULL)
		return SPACED_EBUSY;
	f->handback = handback;
	f->port = port;
	int e = fwd_connect(f);
	if (e < 0)
		f->dead = true;
	return e;
}

int fwd_vsock_listen(unsigned port)
{
	int fd = guest_vsock_listen(port, 64);
	if (fd < 0)
		return fd;
	vsock_listen_fd = fd;
	return 0;
}

static void vsock_accept(void)
{
	for (;;) {
		int fd = accept4(vsock_listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		struct fwd *f = fwd_new(fd);
		if (f == NULL) {
			guest_warn("fwd: too many forwarded connections, one refused");
			continue;
		}
		f->reading_line = true;
		f->announce = true;
		f->deadline = spaced_mono_ns() + (uint64_t)FWD_LINE_MS * 1000000u;
	}
}

/* Takes the CONNECT line (only it: what follows is the stream's) and starts
 * the connection it names. */
static void read_line(struct fwd *f)
{
	uint8_t line[SPACED_VSOCK_HS_MAX];
	ssize_t k = recv(f->a, line, sizeof line, MSG_PEEK | MSG_DONTWAIT);
	if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	if (k <= 0) {
		f->dead = true;
		return;
	}
	int l = spaced_vsock_hs_line_len(line, (size_t)k);
	if (l == 0)
		return; /* more to come */
	uint32_t port = 0;
	if (l < 0 || recv(f->a, line, (size_t)l, MSG_DONTWAIT) != l ||
	    spaced_vsock_hs_parse_connect(line, (size_t)l, &port) < 0 || port == 0 || port > 65535) {
		guest_warn("fwd: malformed CONNECT line, connection closed");
		f->dead = true;
		return;
	}
	f->reading_line = false;
	f->port = port;
	if (fwd_connect(f) < 0)
		f->dead = true;
}

uint64_t fwd_next_deadline(void)
{
	uint64_t dl = 0;
	for (struct fwd *f = fwds; f != NULL; f = f->next)
		if (!f->dead && f->reading_line && (dl == 0 || f->deadline < dl))
			dl = f->deadline;
	return dl;
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
	if (vsock_listen_fd >= 0 && nfwd < FWD_MAX)
		add(vsock_listen_fd, POLLIN, &listener_tag);
	for (struct fwd *f = fwds; f != NULL; f = f->next) {
		if (f->dead)
			continue;
		if (f->reading_line) {
			add(f->a, POLLIN, f);
			continue;
		}
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
	if (ptr == &listener_tag) {
		vsock_accept();
		return;
	}
	struct fwd *f = ptr;
	if (f->dead)
		return;
	if (f->reading_line) {
		read_line(f);
		return;
	}
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
		} else if (f->announce) {
			/* the answer goes out before any byte of the port's */
			if ((f->ba.buf = malloc(FWD_BUF)) == NULL) {
				f->dead = true;
				return;
			}
			int l = spaced_vsock_hs_format_ok((char *)f->ba.buf, FWD_BUF, f->port);
			f->ba.len = l > 0 ? (size_t)l : 0;
			if (l <= 0)
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
	uint64_t now = spaced_mono_ns();
	while (*fp != NULL) {
		struct fwd *f = *fp;
		if (f->reading_line && now >= f->deadline)
			f->dead = true; /* its CONNECT line did not come in time */
		if (f->dead) {
			*fp = f->next;
			close(f->a);
			if (f->b >= 0)
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
