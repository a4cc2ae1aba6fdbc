/*
 * vsockd.c — the virtio-vsock device behind vhost-user and the hybrid Unix
 * socket in front of it (see vsockd.h), in one epoll loop.
 *
 * epoll rather than libuv: the loop watches raw eventfds handed over by QEMU
 * (the rings' kicks), a vhost-user socket whose messages carry descriptors on
 * their first byte (read with recvmsg, which uv_pipe does not expose per
 * message), and Unix stream sockets whose read and write interest follows
 * the guest's credit; that is all epoll, and one wrapper would only hide it.
 *
 * Connections (struct conn) are keyed by (local port, guest port). A host
 * connection goes HANDSHAKE (reading its CONNECT line) → CONNECTING
 * (OP_REQUEST queued or sent, waiting for OP_RESPONSE) → ESTABLISHED →
 * CLOSING (our SHUTDOWN sent, waiting for the guest's RST). HANDSHAKE,
 * CONNECTING and CLOSING each have the configured timeout; every timed
 * connection sits in one FIFO whose order is deadline order (one timeout
 * value). Memory per connection is bounded: host-to-guest bytes wait in a
 * ring of H2G_BUF bytes, guest-to-host bytes in a ring of buf_alloc bytes
 * (the credit we give the guest; a guest that sends past it is reset).
 * Packets to the guest wait in a round-robin list of connections that have
 * something to send, plus a bounded queue of RSTs for connections that no
 * longer exist.
 */
#include "vsockd.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "spaced_error.h"
#include "log.h"
#include "confine.h"
#include "rbuf.h"
#include "vhost_user.h"
#include "vring.h"
#include "vsock_hs.h"
#include "vsock_pkt.h"

#define RXQ 0
#define TXQ 1
#define H2G_BUF (64 * 1024)
#define HASH_BUCKETS 256
#define RSTQ_MAX 1024
#define LOCAL_PORT_FIRST (1u << 30)
#define RING_BUDGET 256 /* chains taken from one ring before other events get a turn */

enum ev_kind { EV_SIGNAL, EV_VU_LISTEN, EV_VU, EV_HOST_LISTEN, EV_KICK, EV_CONN };

struct vsockd;

struct ev {
	enum ev_kind kind;
	int fd;
	unsigned idx; /* EV_KICK: the ring */
	bool registered;
	uint32_t mask;
};

enum conn_state { C_HANDSHAKE, C_CONNECTING, C_ESTABLISHED, C_CLOSING };

static const char *const state_names[] = { "handshake", "connecting", "established", "closing" };

struct conn {
	struct ev ev; /* first: the epoll pointer is the conn */
	enum conn_state st;
	bool dead;          /* closed; freed after this round of events */
	struct conn *dnext;
	bool guest_initiated;
	uint32_t local_port, peer_port;
	struct conn *hnext;
	struct conn *tprev, *tnext; /* timed FIFO */
	bool timed;
	uint64_t deadline_ms;
	struct conn *rprev, *rnext; /* has something for the guest */
	bool ready;
	uint8_t hs[SPACED_VSOCK_HS_MAX];
	size_t hs_len;
	struct vmm_rbuf h2g, g2h;
	size_t g2h_own;     /* bytes at the front of g2h that are ours ("OK <n>\n"), not the guest's */
	/* credit: what the guest told us, and what we have sent and received */
	uint32_t peer_buf_alloc, peer_fwd_cnt, tx_cnt;
	uint32_t rx_cnt, fwd_cnt, fwd_cnt_sent;
	bool pend_request, pend_response, pend_credit_update, pend_credit_request;
	uint32_t shut_sent;    /* SHUTDOWN flags already sent */
	uint32_t shut_pending; /* flags of a SHUTDOWN to send */
	bool host_rd_eof, host_wr_shut, host_gone;
	bool guest_shut_send, guest_shut_rcv;
	bool credit_asked;
};

struct rst_entry {
	uint32_t src_port, dst_port; /* as sent: ours, then the guest's */
};

struct vsockd {
	const struct vsockd_config *cfg;
	int ep;
	struct ev sig_ev, vu_listen_ev, vu_ev, host_listen_ev, kick_ev[2];
	char *vu_path, *uds_path;
	struct vu_dev vu;
	bool frontend_seen, quit;
	struct conn *buckets[HASH_BUCKETS];
	unsigned nconns;
	struct conn *timed_head, *timed_tail;
	struct conn *ready_head, *ready_tail;
	unsigned nready;
	struct conn *dead; /* closed connections an event of this round may still name */
	struct rst_entry rstq[RSTQ_MAX];
	unsigned rst_head, rst_len;
	uint32_t next_port;
	bool more_tx; /* the tx ring had more than one budget's worth */
	bool more_rx; /* the rx flush stopped at its budget */
	struct vring_chain chain;
	uint64_t stat_rx_pkts, stat_tx_pkts, stat_bad_chains, stat_rst_dropped;
};

static void logf_(const char *level, const char *event, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void logf_(const char *level, const char *event, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	spaced_log_escape_controls(msg, sizeof(msg));
	fprintf(stderr, "spaced-vsockd level=%s event=%s %s\n", level, event, msg);
}

#define LOG_CONN(d, c, event, fmt, ...)                                                     \
	do {                                                                                  \
		if ((d)->cfg->verbose)                                                        \
			logf_("debug", event, "local_port=%u guest_port=%u state=%s " fmt,    \
			      (c)->local_port, (c)->peer_port, state_names[(c)->st], __VA_ARGS__); \
	} while (0)

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- epoll registration ---- */

static void ev_set(struct vsockd *d, struct ev *e, uint32_t mask, bool want_registered)
{
	struct epoll_event ee = { .events = mask, .data.ptr = e };

	if (!want_registered) {
		if (e->registered)
			epoll_ctl(d->ep, EPOLL_CTL_DEL, e->fd, NULL);
		e->registered = false;
		return;
	}
	if (e->registered && e->mask == mask)
		return;
	if (epoll_ctl(d->ep, e->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, e->fd, &ee) < 0) {
		logf_("error", "epoll", "fd=%d: %s", e->fd, strerror(errno));
		return;
	}
	e->registered = true;
	e->mask = mask;
}

/* ---- connection table, timers, ready list ---- */

static unsigned hash_of(uint32_t local, uint32_t peer)
{
	return (local * 2654435761u ^ peer * 40503u) % HASH_BUCKETS;
}

static struct conn *conn_find(struct vsockd *d, uint32_t local, uint32_t peer)
{
	for (struct conn *c = d->buckets[hash_of(local, peer)]; c; c = c->hnext)
		if (c->local_port == local && c->peer_port == peer && c->st != C_HANDSHAKE)
			return c;
	return NULL;
}

static bool local_port_used(struct vsockd *d, uint32_t port)
{
	for (unsigned b = 0; b < HASH_BUCKETS; b++)
		for (struct conn *c = d->buckets[b]; c; c = c->hnext)
			if (c->local_port == port && !c->guest_initiated)
				return true;
	return false;
}

static void hash_insert(struct vsockd *d, struct conn *c)
{
	unsigned h = hash_of(c->local_port, c->peer_port);

	c->hnext = d->buckets[h];
	d->buckets[h] = c;
}

static void hash_remove(struct vsockd *d, struct conn *c)
{
	struct conn **pp = &d->buckets[hash_of(c->local_port, c->peer_port)];

	for (; *pp; pp = &(*pp)->hnext)
		if (*pp == c) {
			*pp = c->hnext;
			return;
		}
}

static void timer_stop(struct vsockd *d, struct conn *c)
{
	if (!c->timed)
		return;
	if (c->tprev)
		c->tprev->tnext = c->tnext;
	else
		d->timed_head = c->tnext;
	if (c->tnext)
		c->tnext->tprev = c->tprev;
	else
		d->timed_tail = c->tprev;
	c->tprev = c->tnext = NULL;
	c->timed = false;
}

/* (Re)arms c's deadline at now + timeout: the FIFO stays in deadline order. */
static void timer_start(struct vsockd *d, struct conn *c)
{
	timer_stop(d, c);
	c->deadline_ms = now_ms() + d->cfg->timeout_ms;
	c->tprev = d->timed_tail;
	c->tnext = NULL;
	if (d->timed_tail)
		d->timed_tail->tnext = c;
	else
		d->timed_head = c;
	d->timed_tail = c;
	c->timed = true;
}

static void ready_remove(struct vsockd *d, struct conn *c)
{
	if (!c->ready)
		return;
	if (c->rprev)
		c->rprev->rnext = c->rnext;
	else
		d->ready_head = c->rnext;
	if (c->rnext)
		c->rnext->rprev = c->rprev;
	else
		d->ready_tail = c->rprev;
	c->rprev = c->rnext = NULL;
	c->ready = false;
	d->nready--;
}

static void ready_append(struct vsockd *d, struct conn *c)
{
	if (c->ready)
		return;
	c->rprev = d->ready_tail;
	c->rnext = NULL;
	if (d->ready_tail)
		d->ready_tail->rnext = c;
	else
		d->ready_head = c;
	d->ready_tail = c;
	c->ready = true;
	d->nready++;
}

/* ---- credit ---- */

/* Bytes the guest can take from us now. */
static uint32_t peer_credit(const struct conn *c)
{
	uint32_t in_flight = c->tx_cnt - c->peer_fwd_cnt;

	return in_flight >= c->peer_buf_alloc ? 0 : c->peer_buf_alloc - in_flight;
}

static bool conn_has_packet(const struct conn *c)
{
	if (c->pend_request || c->pend_response || c->pend_credit_update || c->pend_credit_request)
		return true;
	if (c->st == C_ESTABLISHED || c->st == C_CLOSING) {
		if (c->h2g.len > 0 && !c->guest_shut_rcv && peer_credit(c) > 0)
			return true;
		if (c->shut_pending && (c->h2g.len == 0 || c->guest_shut_rcv))
			return true;
	}
	return false;
}

/* Puts c on the ready list when it has a packet for the guest. */
static void conn_kick(struct vsockd *d, struct conn *c)
{
	if (conn_has_packet(c))
		ready_append(d, c);
}

/* Counts n bytes as handed on to the host and asks for a credit update once
 * a quarter of the buffer has been freed since the guest last heard. */
static void conn_forwarded(struct vsockd *d, struct conn *c, uint32_t n)
{
	c->fwd_cnt += n;
	if (c->fwd_cnt - c->fwd_cnt_sent >= d->cfg->buf_alloc / 4) {
		c->pend_credit_update = true;
		conn_kick(d, c);
	}
}

/* ---- RSTs for connections that are gone ---- */

static void rst_queue(struct vsockd *d, uint32_t local, uint32_t peer)
{
	if (d->rst_len == RSTQ_MAX) {
		d->stat_rst_dropped++;
		return; /* the guest's own close timeout ends that socket */
	}
	d->rstq[(d->rst_head + d->rst_len) % RSTQ_MAX] = (struct rst_entry){ local, peer };
	d->rst_len++;
}

/* ---- connection lifetime ---- */

static void conn_update_events(struct vsockd *d, struct conn *c);

static struct conn *conn_new(struct vsockd *d, int fd)
{
	struct conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->ev.kind = EV_CONN;
	c->ev.fd = fd;
	vmm_rbuf_init(&c->h2g, H2G_BUF);
	vmm_rbuf_init(&c->g2h, (size_t)d->cfg->buf_alloc + SPACED_VSOCK_HS_MAX);
	d->nconns++;
	return c;
}

/* Frees c; queues an RST to the guest first when send_rst and the guest
 * knows the connection. */
static void conn_free(struct vsockd *d, struct conn *c, bool send_rst, const char *why)
{
	LOG_CONN(d, c, "conn-close", "reason=\"%s\" to_guest=%u from_guest=%u", why, c->tx_cnt,
		 c->rx_cnt);
	if (send_rst && c->st != C_HANDSHAKE)
		rst_queue(d, c->local_port, c->peer_port);
	if (c->st != C_HANDSHAKE)
		hash_remove(d, c);
	timer_stop(d, c);
	ready_remove(d, c);
	ev_set(d, &c->ev, 0, false);
	close(c->ev.fd);
	c->ev.fd = -1;
	vmm_rbuf_clear(&c->h2g);
	vmm_rbuf_clear(&c->g2h);
	d->nconns--;
	c->dead = true;
	c->dnext = d->dead;
	d->dead = c;
}

static void reap_dead(struct vsockd *d)
{
	while (d->dead) {
		struct conn *c = d->dead;

		d->dead = c->dnext;
		free(c);
	}
}

static void conn_free_all(struct vsockd *d)
{
	for (unsigned b = 0; b < HASH_BUCKETS; b++)
		while (d->buckets[b])
			conn_free(d, d->buckets[b], false, "device reset");
	/* connections still reading their CONNECT line are only in the timer list */
	while (d->timed_head)
		conn_free(d, d->timed_head, false, "device reset");
	d->rst_len = 0;
}

/* Writes what g2h holds to the host. Returns 0, or -1 when the host is gone
 * (c has been freed). */
static int conn_flush_g2h(struct vsockd *d, struct conn *c)
{
	while (c->g2h.len > 0 && !c->host_gone && !c->host_wr_shut) {
		struct iovec iov[2];
		int cnt = vmm_rbuf_data_iov(&c->g2h, iov);
		ssize_t n = writev(c->ev.fd, iov, cnt);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n <= 0) {
			conn_free(d, c, true, "host write failed");
			return -1;
		}
		vmm_rbuf_consume(&c->g2h, (size_t)n);
		if ((size_t)n <= c->g2h_own) {
			c->g2h_own -= (size_t)n;
		} else {
			conn_forwarded(d, c, (uint32_t)((size_t)n - c->g2h_own));
			c->g2h_own = 0;
		}
	}
	return 0;
}

/* Decides what the end of the streams means: SHUTDOWN to send, the host's
 * write side to shut, RST and free, or waiting for the guest's RST.
 * Returns -1 when c has been freed. */
static int conn_check_done(struct vsockd *d, struct conn *c)
{
	bool h2g_done, g2h_done;
	uint32_t want;

	if (c->st != C_ESTABLISHED && c->st != C_CLOSING)
		return 0;
	if (c->guest_shut_send && c->g2h.len == 0 && !c->host_wr_shut && !c->host_gone) {
		shutdown(c->ev.fd, SHUT_WR);
		c->host_wr_shut = true;
	}
	h2g_done = c->guest_shut_rcv || (c->host_rd_eof && c->h2g.len == 0);
	g2h_done = c->host_gone || (c->guest_shut_send && c->g2h.len == 0);
	if (h2g_done && g2h_done && c->guest_shut_send && c->guest_shut_rcv) {
		/* the guest closed and waits for our RST */
		conn_free(d, c, true, "closed");
		return -1;
	}
	want = (h2g_done ? VSOCK_SHUTDOWN_SEND : 0) | (g2h_done ? VSOCK_SHUTDOWN_RCV : 0);
	if (want & ~(c->shut_sent | c->shut_pending)) {
		c->shut_pending = want | c->shut_sent;
		conn_kick(d, c);
	}
	if (h2g_done && g2h_done && c->st != C_CLOSING) {
		c->st = C_CLOSING; /* until the guest's RST, or the timeout */
		timer_start(d, c);
	}
	conn_update_events(d, c);
	return 0;
}

static void conn_update_events(struct vsockd *d, struct conn *c)
{
	uint32_t want = 0;
	bool reg;

	if (c->st == C_HANDSHAKE)
		want |= EPOLLIN;
	if ((c->st == C_ESTABLISHED || c->st == C_CLOSING) && !c->host_rd_eof &&
	    (vmm_rbuf_room(&c->h2g) > 0 || c->guest_shut_rcv))
		want |= EPOLLIN;
	if (c->g2h.len > 0 && !c->host_wr_shut && !c->host_gone)
		want |= EPOLLOUT;
	/* a hung-up socket reports EPOLLHUP whatever the mask: stay registered
	 * only while that still tells something new, or while there is work */
	reg = want != 0 || (!c->host_gone && !(c->host_rd_eof && c->host_wr_shut));
	ev_set(d, &c->ev, want, reg);
}

/* ---- the host side ---- */

static void host_accept(struct vsockd *d)
{
	for (int i = 0; i < 64; i++) {
		int fd = accept4(d->host_listen_ev.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct conn *c;

		if (fd < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
			    errno != ECONNABORTED)
				logf_("warn", "accept", "reason=\"%s\"", strerror(errno));
			return;
		}
		if (d->nconns >= d->cfg->max_conns || !(c = conn_new(d, fd))) {
			logf_("warn", "conn-refused", "reason=\"%s\"",
			      d->nconns >= d->cfg->max_conns ? "too many connections" : "out of memory");
			close(fd);
			continue;
		}
		c->st = C_HANDSHAKE;
		timer_start(d, c);
		conn_update_events(d, c);
	}
}

static uint32_t alloc_local_port(struct vsockd *d)
{
	/* Firecracker counts up from 2^30; skip ports still in use */
	for (unsigned tries = 0; tries < 4096; tries++) {
		uint32_t p = d->next_port++;

		if (d->next_port < LOCAL_PORT_FIRST || d->next_port == UINT32_MAX)
			d->next_port = LOCAL_PORT_FIRST;
		if (!local_port_used(d, p))
			return p;
	}
	return 0;
}

/* Reads the CONNECT line. Returns -1 when c has been freed. */
static int host_read_handshake(struct vsockd *d, struct conn *c)
{
	ssize_t n;
	int len, rc;
	uint32_t port;

	n = read(c->ev.fd, c->hs + c->hs_len, sizeof(c->hs) - c->hs_len);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return 0;
	if (n <= 0) {
		conn_free(d, c, false, n == 0 ? "closed before CONNECT" : "read failed");
		return -1;
	}
	c->hs_len += (size_t)n;
	len = spaced_vsock_hs_line_len(c->hs, c->hs_len);
	if (len == 0)
		return 0;
	if (len < 0 || (rc = spaced_vsock_hs_parse_connect(c->hs, (size_t)len, &port)) < 0) {
		if (d->cfg->verbose)
			logf_("debug", "conn-refused", "reason=\"malformed CONNECT line\"");
		conn_free(d, c, false, "malformed CONNECT line");
		return -1;
	}
	/* while the rings are stopped (a paused VM, a device not yet plugged or
	 * not yet started by the guest's driver) the request waits, within the
	 * CONNECTING timeout, and goes out when they run again (rx_flush): a
	 * request to a paused sandbox waits for its resume, as one to a frozen
	 * process execution does */
	c->local_port = alloc_local_port(d);
	if (c->local_port == 0) {
		conn_free(d, c, false, "no local port free");
		return -1;
	}
	c->peer_port = port;
	/* bytes after the line belong to the stream (spaced-host sends its HELLO
	 * in the same write) */
	if (vmm_rbuf_put(&c->h2g, c->hs + len, c->hs_len - (size_t)len) < 0) {
		conn_free(d, c, false, "out of memory");
		return -1;
	}
	c->st = C_CONNECTING;
	hash_insert(d, c);
	c->pend_request = true;
	timer_start(d, c);
	conn_kick(d, c);
	conn_update_events(d, c);
	LOG_CONN(d, c, "conn-request", "%s", "");
	return 0;
}

static void host_event(struct vsockd *d, struct conn *c, uint32_t events)
{
	if (c->dead)
		return;
	if (c->st == C_HANDSHAKE) {
		if (events & (EPOLLIN | EPOLLHUP | EPOLLERR))
			host_read_handshake(d, c);
		return;
	}
	if (c->st == C_CONNECTING) {
		if (events & (EPOLLHUP | EPOLLERR))
			conn_free(d, c, true, "host hung up while connecting");
		return;
	}
	if (events & EPOLLOUT) {
		if (conn_flush_g2h(d, c) < 0)
			return;
	}
	if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !c->host_rd_eof) {
		struct iovec iov[2];
		uint8_t sink[4096];
		int cnt;
		ssize_t n;

		if (c->guest_shut_rcv) {
			/* the guest takes nothing more: drain and drop */
			iov[0].iov_base = sink;
			iov[0].iov_len = sizeof(sink);
			cnt = 1;
		} else {
			cnt = vmm_rbuf_free_iov(&c->h2g, iov);
			if (cnt < 0) {
				conn_free(d, c, true, "out of memory");
				return;
			}
		}
		n = cnt > 0 ? readv(c->ev.fd, iov, cnt) : -2;
		if (n > 0 && !c->guest_shut_rcv) {
			vmm_rbuf_commit(&c->h2g, (size_t)n);
			conn_kick(d, c);
		} else if (n == 0) {
			c->host_rd_eof = true;
		} else if (n == -1 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
			conn_free(d, c, true, "host read failed");
			return;
		}
	}
	if ((events & (EPOLLHUP | EPOLLERR)) && !c->host_wr_shut && !c->host_gone) {
		/* the host closed completely: nothing more can reach it */
		uint32_t dropped = (uint32_t)(c->g2h.len - c->g2h_own);

		c->host_gone = true;
		c->g2h_own = 0;
		vmm_rbuf_consume(&c->g2h, c->g2h.len);
		conn_forwarded(d, c, dropped);
	}
	if (conn_check_done(d, c) < 0)
		return;
	conn_update_events(d, c);
}

/* ---- packets to the guest (rx ring) ---- */

/* Writes c's next packet into the chain. Returns the bytes written (header
 * included), or 0 when c has nothing to send now. */
static size_t conn_build_packet(struct vsockd *d, struct conn *c, const struct vring_chain *ch)
{
	struct vsock_hdr h = {
		.src_cid = VSOCK_HOST_CID, .dst_cid = d->cfg->guest_cid,
		.src_port = c->local_port, .dst_port = c->peer_port,
		.type = VSOCK_TYPE_STREAM, .buf_alloc = d->cfg->buf_alloc, .fwd_cnt = c->fwd_cnt,
	};
	uint8_t raw[VSOCK_HDR_SIZE];
	size_t payload = 0;

	if (c->pend_request) {
		h.op = VSOCK_OP_REQUEST;
		c->pend_request = false;
	} else if (c->pend_response) {
		h.op = VSOCK_OP_RESPONSE;
		c->pend_response = false;
	} else if ((c->st == C_ESTABLISHED || c->st == C_CLOSING) && c->h2g.len > 0 &&
		   !c->guest_shut_rcv && peer_credit(c) > 0) {
		size_t room = ch->in_len - VSOCK_HDR_SIZE;
		struct iovec iov[2];
		int cnt = vmm_rbuf_data_iov(&c->h2g, iov);

		payload = c->h2g.len;
		if (payload > peer_credit(c))
			payload = peer_credit(c);
		if (payload > room)
			payload = room;
		if (payload > VSOCK_MAX_PAYLOAD)
			payload = VSOCK_MAX_PAYLOAD;
		if (payload == 0)
			return 0;
		for (int i = 0, off = 0; i < cnt && (size_t)off < payload; i++) {
			size_t k = payload - (size_t)off < iov[i].iov_len ? payload - (size_t)off : iov[i].iov_len;

			vring_chain_write(ch, VSOCK_HDR_SIZE + (size_t)off, iov[i].iov_base, k);
			off += (int)k;
		}
		vmm_rbuf_consume(&c->h2g, payload);
		c->tx_cnt += (uint32_t)payload;
		h.op = VSOCK_OP_RW;
		h.len = (uint32_t)payload;
		c->pend_credit_update = false; /* the header carries fwd_cnt */
		c->credit_asked = false;
	} else if (c->pend_credit_update) {
		h.op = VSOCK_OP_CREDIT_UPDATE;
		c->pend_credit_update = false;
	} else if (c->pend_credit_request) {
		h.op = VSOCK_OP_CREDIT_REQUEST;
		c->pend_credit_request = false;
	} else if (c->shut_pending && (c->h2g.len == 0 || c->guest_shut_rcv)) {
		h.op = VSOCK_OP_SHUTDOWN;
		h.flags = c->shut_pending;
		c->shut_sent = c->shut_pending;
		c->shut_pending = 0;
	} else {
		return 0;
	}
	c->fwd_cnt_sent = c->fwd_cnt;
	vsock_hdr_encode(&h, raw);
	vring_chain_write(ch, 0, raw, sizeof(raw));
	/* out of credit with bytes waiting: ask once (Linux also updates by itself) */
	if ((c->st == C_ESTABLISHED || c->st == C_CLOSING) && c->h2g.len > 0 && peer_credit(c) == 0 &&
	    !c->credit_asked && !c->guest_shut_rcv) {
		c->pend_credit_request = true;
		c->credit_asked = true;
	}
	return VSOCK_HDR_SIZE + payload;
}

static void rx_flush(struct vsockd *d)
{
	struct vring *vq = &d->vu.vq[RXQ];
	struct vring_chain *ch = &d->chain;
	unsigned budget = 4 * RING_BUDGET;

	d->more_rx = false;
	if (!vring_ready(vq))
		return;
	while (d->rst_len > 0 || d->ready_head) {
		int rc;
		size_t len = 0;

		if (budget-- == 0) {
			/* the guest may keep adding (bad) chains while we take them */
			d->more_rx = true;
			break;
		}
		rc = vring_pop(vq, &d->vu.mem, ch);
		if (rc == SPACED_EPROTO) {
			d->stat_bad_chains++;
			continue;
		}
		if (rc <= 0)
			break;
		if (ch->in_len < VSOCK_HDR_SIZE) {
			d->stat_bad_chains++;
			vring_push(vq, ch->head, 0);
			continue;
		}
		if (d->rst_len > 0) {
			struct rst_entry *r = &d->rstq[d->rst_head];
			struct vsock_hdr h = {
				.src_cid = VSOCK_HOST_CID, .dst_cid = d->cfg->guest_cid,
				.src_port = r->src_port, .dst_port = r->dst_port,
				.type = VSOCK_TYPE_STREAM, .op = VSOCK_OP_RST,
			};
			uint8_t raw[VSOCK_HDR_SIZE];

			vsock_hdr_encode(&h, raw);
			vring_chain_write(ch, 0, raw, sizeof(raw));
			d->rst_head = (d->rst_head + 1) % RSTQ_MAX;
			d->rst_len--;
			len = VSOCK_HDR_SIZE;
		}
		/* each ready connection gets one try at this chain: one whose only
		 * packet is data cannot use a chain with no room past the header
		 * (a guest may offer such buffers), and must not be tried forever */
		for (unsigned tries = d->nready; len == 0 && tries > 0 && d->ready_head; tries--) {
			struct conn *c = d->ready_head;

			len = conn_build_packet(d, c, ch);
			ready_remove(d, c);
			if (conn_has_packet(c))
				ready_append(d, c); /* round robin */
			if (len > 0 && (c->st == C_ESTABLISHED || c->st == C_CLOSING)) {
				/* room in h2g again, or the end of the stream to act on */
				if (conn_check_done(d, c) == 0)
					conn_update_events(d, c);
			}
		}
		if (len == 0) {
			vring_unpop(vq);
			break;
		}
		vring_push(vq, ch->head, (uint32_t)len);
		d->stat_rx_pkts++;
	}
	vring_notify(vq);
}

/* ---- packets from the guest (tx ring) ---- */

/* Delivers n payload bytes at offset off of the chain to c's host. Returns -1
 * when c has been freed. */
static int deliver_to_host(struct vsockd *d, struct conn *c, const struct vring_chain *ch, size_t off,
			   uint32_t n)
{
	struct iovec iov[VRING_CHAIN_MAX];
	unsigned cnt = 0;
	size_t left = n, written = 0;

	if (c->host_gone || c->host_wr_shut) {
		conn_forwarded(d, c, n); /* nobody to read it: free the credit at once */
		return 0;
	}
	if (c->g2h.len == 0) {
		/* straight from guest memory to the socket */
		for (unsigned i = 0; i < ch->nout && left > 0; i++) {
			size_t seg = ch->out[i].iov_len;

			if (off >= seg) {
				off -= seg;
				continue;
			}
			iov[cnt].iov_base = (uint8_t *)ch->out[i].iov_base + off;
			iov[cnt].iov_len = seg - off < left ? seg - off : left;
			left -= iov[cnt].iov_len;
			cnt++;
			off = 0;
		}
		for (;;) {
			ssize_t w = writev(c->ev.fd, iov, (int)cnt);

			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				break;
			if (w <= 0) {
				conn_free(d, c, true, "host write failed");
				return -1;
			}
			written = (size_t)w;
			break;
		}
		conn_forwarded(d, c, (uint32_t)written);
		/* the rest is buffered below, from where writev stopped */
		for (unsigned i = 0; i < cnt; i++) {
			size_t k = written < iov[i].iov_len ? written : iov[i].iov_len;

			written -= k;
			if (vmm_rbuf_put(&c->g2h, (uint8_t *)iov[i].iov_base + k, iov[i].iov_len - k) < 0) {
				conn_free(d, c, true, "out of memory");
				return -1;
			}
		}
		return 0;
	}
	/* bytes are already waiting: keep the order */
	for (unsigned i = 0; i < ch->nout && left > 0; i++) {
		size_t seg = ch->out[i].iov_len, k;

		if (off >= seg) {
			off -= seg;
			continue;
		}
		k = seg - off < left ? seg - off : left;
		if (vmm_rbuf_put(&c->g2h, (uint8_t *)ch->out[i].iov_base + off, k) < 0) {
			conn_free(d, c, true, "out of memory");
			return -1;
		}
		left -= k;
		off = 0;
	}
	return 0;
}

/* A guest connecting to the host: Firecracker's "<uds_path>_<port>". */
static void guest_connect(struct vsockd *d, const struct vsock_hdr *h)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct conn *c;
	int fd, n;

	n = snprintf(sa.sun_path, sizeof(sa.sun_path), "%s_%u", d->cfg->uds_path, h->dst_port);
	if (n < 0 || (size_t)n >= sizeof(sa.sun_path) || d->nconns >= d->cfg->max_conns) {
		rst_queue(d, h->dst_port, h->src_port);
		return;
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		/* a Unix connect either completes at once or fails (EAGAIN: backlog full) */
		if (fd >= 0)
			close(fd);
		rst_queue(d, h->dst_port, h->src_port);
		return;
	}
	c = conn_new(d, fd);
	if (!c) {
		close(fd);
		rst_queue(d, h->dst_port, h->src_port);
		return;
	}
	c->guest_initiated = true;
	c->local_port = h->dst_port;
	c->peer_port = h->src_port;
	c->peer_buf_alloc = h->buf_alloc;
	c->peer_fwd_cnt = h->fwd_cnt;
	c->st = C_ESTABLISHED;
	hash_insert(d, c);
	c->pend_response = true;
	conn_kick(d, c);
	conn_update_events(d, c);
	LOG_CONN(d, c, "conn-from-guest", "%s", "");
}

static void tx_packet(struct vsockd *d, const struct vring_chain *ch)
{
	uint8_t raw[VSOCK_HDR_SIZE];
	struct vsock_hdr h;
	struct conn *c;

	if (vring_chain_read(ch, 0, raw, sizeof(raw)) != sizeof(raw)) {
		d->stat_bad_chains++;
		return;
	}
	vsock_hdr_decode(raw, &h);
	if (h.src_cid != d->cfg->guest_cid || h.dst_cid != VSOCK_HOST_CID) {
		if (d->cfg->verbose)
			logf_("debug", "packet-dropped", "reason=\"addresses\" src_cid=%llu dst_cid=%llu",
			      (unsigned long long)h.src_cid, (unsigned long long)h.dst_cid);
		return;
	}
	c = conn_find(d, h.dst_port, h.src_port);
	if (h.type != VSOCK_TYPE_STREAM || h.len > VSOCK_MAX_PAYLOAD ||
	    h.len > ch->out_len - VSOCK_HDR_SIZE || (h.op != VSOCK_OP_RW && h.len != 0)) {
		if (d->cfg->verbose)
			logf_("debug", "packet-dropped", "reason=\"malformed\" op=%s type=%u len=%u",
			      vsock_op_name(h.op), h.type, h.len);
		if (c)
			conn_free(d, c, true, "malformed packet");
		else if (h.op != VSOCK_OP_RST)
			rst_queue(d, h.dst_port, h.src_port);
		return;
	}
	if (!c) {
		if (h.op == VSOCK_OP_REQUEST)
			guest_connect(d, &h);
		else if (h.op != VSOCK_OP_RST)
			rst_queue(d, h.dst_port, h.src_port);
		return;
	}
	c->peer_buf_alloc = h.buf_alloc;
	c->peer_fwd_cnt = h.fwd_cnt;
	switch (h.op) {
	case VSOCK_OP_RESPONSE:
		if (c->st != C_CONNECTING) {
			conn_free(d, c, true, "unexpected RESPONSE");
			return;
		}
		{
			char ok[SPACED_VSOCK_HS_MAX + 1];
			int n = spaced_vsock_hs_format_ok(ok, sizeof(ok), c->local_port);

			if (n < 0 || vmm_rbuf_put(&c->g2h, ok, (size_t)n) < 0) {
				conn_free(d, c, true, "out of memory");
				return;
			}
			c->g2h_own = (size_t)n;
		}
		c->st = C_ESTABLISHED;
		timer_stop(d, c);
		LOG_CONN(d, c, "conn-established", "%s", "");
		if (conn_flush_g2h(d, c) < 0)
			return;
		break;
	case VSOCK_OP_RST:
		conn_free(d, c, false, c->st == C_CONNECTING ? "refused by the guest" : c->st == C_CLOSING ? "closed" : "reset by the guest");
		return;
	case VSOCK_OP_REQUEST:
		conn_free(d, c, true, "REQUEST on an open connection");
		return;
	case VSOCK_OP_SHUTDOWN:
		if (c->st == C_CONNECTING) {
			conn_free(d, c, true, "SHUTDOWN before RESPONSE");
			return;
		}
		if (h.flags & VSOCK_SHUTDOWN_RCV)
			c->guest_shut_rcv = true;
		if (h.flags & VSOCK_SHUTDOWN_SEND)
			c->guest_shut_send = true;
		break;
	case VSOCK_OP_RW:
		if (c->st == C_CONNECTING || c->guest_shut_send) {
			conn_free(d, c, true, "data out of place");
			return;
		}
		if ((uint32_t)(c->rx_cnt + h.len - c->fwd_cnt) > d->cfg->buf_alloc) {
			conn_free(d, c, true, "guest sent past its credit");
			return;
		}
		c->rx_cnt += h.len;
		if (h.len > 0 && deliver_to_host(d, c, ch, VSOCK_HDR_SIZE, h.len) < 0)
			return;
		break;
	case VSOCK_OP_CREDIT_UPDATE:
		c->credit_asked = false;
		break;
	case VSOCK_OP_CREDIT_REQUEST:
		c->pend_credit_update = true;
		break;
	default:
		conn_free(d, c, true, "unknown op");
		return;
	}
	conn_kick(d, c);
	if (conn_check_done(d, c) < 0)
		return;
	conn_update_events(d, c);
}

static void tx_process(struct vsockd *d)
{
	struct vring *vq = &d->vu.vq[TXQ];
	struct vring_chain *ch = &d->chain;
	unsigned budget = RING_BUDGET;

	d->more_tx = false;
	while (vring_ready(vq)) {
		int rc;

		if (budget-- == 0) {
			d->more_tx = true;
			break;
		}
		rc = vring_pop(vq, &d->vu.mem, ch);
		if (rc == SPACED_EPROTO) {
			d->stat_bad_chains++;
			continue;
		}
		if (rc == SPACED_ESTALE) {
			logf_("warn", "ring-broken", "ring=tx reason=\"indexes out of range\"");
			break;
		}
		if (rc == 0)
			break;
		if (ch->out_len < VSOCK_HDR_SIZE || ch->nin > 0)
			d->stat_bad_chains++;
		else
			tx_packet(d, ch);
		vring_push(vq, ch->head, 0);
		d->stat_tx_pkts++;
	}
	vring_notify(vq);
}

/* ---- vhost-user glue ---- */

static void on_rings_changed(void *opaque)
{
	struct vsockd *d = opaque;

	for (unsigned i = 0; i < 2; i++) {
		struct vring *vq = &d->vu.vq[i];
		struct ev *e = &d->kick_ev[i];

		if (vq->started && vq->kick_fd >= 0 && !e->registered) {
			e->fd = vq->kick_fd;
			ev_set(d, e, EPOLLIN, true);
		}
	}
}

static void on_kick_closing(void *opaque, unsigned idx, int fd)
{
	struct vsockd *d = opaque;
	struct ev *e = &d->kick_ev[idx];

	if (e->registered && e->fd == fd)
		ev_set(d, e, 0, false);
}

static void on_ring_stopping(void *opaque, unsigned idx)
{
	struct vsockd *d = opaque;

	/* QEMU stops the rings when the VM stops (QMP stop: a pause keeps the
	 * guest and its sockets as they are) and when the guest's driver resets
	 * the device. The connections stay: while the rings are stopped nothing
	 * moves and new CONNECTs wait (within their timeout); once QEMU restarts
	 * them, streams go on where they were. After a driver reset the guest's sockets are gone,
	 * and the guest answers the next packet of each connection with RST,
	 * which closes it here. */
	if (d->nconns > 0)
		logf_("info", "ring-stop", "ring=%u connections=%u kept=1", idx, d->nconns);
}

static void on_refused(void *opaque, const char *request, const char *reason)
{
	logf_("warn", "vhost-user-refused", "request=%s reason=\"%s\"", request, reason);
}

static const struct vu_device_ops vsock_ops = {
	.refused = on_refused,
	.rings_changed = on_rings_changed,
	.ring_stopping = on_ring_stopping,
	.kick_closing = on_kick_closing,
};

static void vu_accept(struct vsockd *d)
{
	int fd = accept4(d->vu_listen_ev.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

	if (fd < 0)
		return;
	if (d->vu.fd >= 0) {
		logf_("warn", "frontend-refused", "reason=\"a front-end is already connected\"");
		close(fd);
		return;
	}
	vu_attach(&d->vu, fd);
	d->vu_ev.fd = fd;
	ev_set(d, &d->vu_ev, EPOLLIN, true);
	d->frontend_seen = true;
	logf_("info", "frontend-connected", "guest_cid=%llu", (unsigned long long)d->cfg->guest_cid);
}

static void vu_event(struct vsockd *d)
{
	int rc = vu_read(&d->vu);

	if (rc == 0)
		return;
	if (rc == SPACED_ECLOSED)
		logf_("info", "frontend-gone", "rx_packets=%llu tx_packets=%llu bad_chains=%llu",
		      (unsigned long long)d->stat_rx_pkts, (unsigned long long)d->stat_tx_pkts,
		      (unsigned long long)d->stat_bad_chains);
	else
		logf_("error", "frontend-dropped", "code=%s reason=\"%s\"", spaced_errname(rc), d->vu.err);
	ev_set(d, &d->vu_ev, 0, false);
	vu_detach(&d->vu);
	conn_free_all(d);
	d->quit = true; /* one VM per daemon: its front-end is gone */
}

static void kick_event(struct vsockd *d, unsigned idx)
{
	uint64_t v;

	while (read(d->kick_ev[idx].fd, &v, sizeof(v)) < 0 && errno == EINTR)
		;
	if (idx == TXQ)
		tx_process(d);
	/* rx: the guest gave us buffers; flushed below either way */
}

/* ---- sockets and the loop ---- */

/* Binds a listening Unix socket at path (through path.tmp and a rename). */
static int listen_unix(const char *path, int *out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char tmp[sizeof(sa.sun_path)];
	int fd, rc = SPACED_ESYS;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp) ||
	    strlen(path) >= sizeof(sa.sun_path))
		return SPACED_ETOOBIG;
	memcpy(sa.sun_path, tmp, strlen(tmp) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return SPACED_ESYS;
	unlink(tmp);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || chmod(tmp, 0600) < 0 ||
	    listen(fd, 128) < 0 || rename(tmp, path) < 0)
		goto out;
	*out = fd;
	return 0;
out:
	logf_("error", "listen", "path=%s reason=\"%s\"", path, strerror(errno));
	unlink(tmp);
	close(fd);
	return rc;
}

static int next_timeout(struct vsockd *d)
{
	uint64_t now;

	if (d->more_tx || d->more_rx)
		return 0;
	if (!d->timed_head)
		return -1;
	now = now_ms();
	return d->timed_head->deadline_ms <= now ? 0 : (int)(d->timed_head->deadline_ms - now);
}

static void expire_timers(struct vsockd *d)
{
	uint64_t now = now_ms();

	while (d->timed_head && d->timed_head->deadline_ms <= now) {
		struct conn *c = d->timed_head;

		switch (c->st) {
		case C_HANDSHAKE:
			conn_free(d, c, false, "no CONNECT line in time");
			break;
		case C_CONNECTING:
			conn_free(d, c, true, "the guest did not answer in time");
			break;
		default:
			conn_free(d, c, true, "the guest did not close in time");
			break;
		}
	}
}

int vsockd_open(const struct vsockd_config *cfg, struct vsockd **out)
{
	struct vsockd *d = calloc(1, sizeof(*d));
	uint8_t config[8];
	uint64_t cid_le;
	int rc = 0, fd;

	if (!d)
		return SPACED_ENOMEM;
	d->cfg = cfg;
	d->next_port = LOCAL_PORT_FIRST;
	d->ep = -1;
	d->sig_ev = (struct ev){ .kind = EV_SIGNAL, .fd = -1 };
	d->vu_listen_ev = (struct ev){ .kind = EV_VU_LISTEN, .fd = -1 };
	d->vu_ev = (struct ev){ .kind = EV_VU, .fd = -1 };
	d->host_listen_ev = (struct ev){ .kind = EV_HOST_LISTEN, .fd = -1 };
	for (unsigned i = 0; i < 2; i++)
		d->kick_ev[i] = (struct ev){ .kind = EV_KICK, .fd = -1, .idx = i };
	cid_le = htole64(cfg->guest_cid);
	memcpy(config, &cid_le, sizeof(config)); /* struct virtio_vsock_config { le64 guest_cid; } */
	vu_init(&d->vu, 2, config, sizeof(config), &vsock_ops, d);
	signal(SIGPIPE, SIG_IGN);
	d->ep = epoll_create1(EPOLL_CLOEXEC);
	if (d->ep < 0) {
		rc = SPACED_ESYS;
		goto out;
	}
	if (!cfg->no_signals) {
		sigset_t mask;

		sigemptyset(&mask);
		sigaddset(&mask, SIGTERM);
		sigaddset(&mask, SIGINT);
		sigprocmask(SIG_BLOCK, &mask, NULL);
		d->sig_ev.fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
		if (d->sig_ev.fd < 0) {
			rc = SPACED_ESYS;
			goto out;
		}
		ev_set(d, &d->sig_ev, EPOLLIN, true);
	}
	if ((rc = listen_unix(cfg->uds_path, &fd)) < 0)
		goto out;
	d->host_listen_ev.fd = fd;
	if ((rc = listen_unix(cfg->vu_path, &fd)) < 0)
		goto out;
	d->vu_listen_ev.fd = fd;
	ev_set(d, &d->vu_listen_ev, EPOLLIN, true);
	ev_set(d, &d->host_listen_ev, EPOLLIN, true);
	logf_("info", "listening", "vhost_user=%s uds=%s guest_cid=%llu", cfg->vu_path, cfg->uds_path,
	      (unsigned long long)cfg->guest_cid);
	*out = d;
	return 0;
out:
	vsockd_close(d);
	return rc;
}

int vsockd_step(struct vsockd *d, int timeout_ms)
{
	struct epoll_event evs[64];
	int n, t = next_timeout(d);

	if (d->quit)
		return 0;
	if (timeout_ms >= 0 && (t < 0 || t > timeout_ms))
		t = timeout_ms;
	n = epoll_wait(d->ep, evs, 64, t);
	if (n < 0 && errno != EINTR)
		return SPACED_ESYS;
	for (int i = 0; i < n && !d->quit; i++) {
		struct ev *e = evs[i].data.ptr;

		switch (e->kind) {
		case EV_SIGNAL:
			d->quit = true;
			logf_("info", "signal", "%s", "stopping");
			break;
		case EV_VU_LISTEN:
			vu_accept(d);
			break;
		case EV_VU:
			vu_event(d);
			break;
		case EV_HOST_LISTEN:
			host_accept(d);
			break;
		case EV_KICK:
			if (e->registered)
				kick_event(d, e->idx);
			break;
		case EV_CONN:
			host_event(d, (struct conn *)(void *)e, evs[i].events);
			break;
		}
	}
	if (d->more_tx)
		tx_process(d);
	expire_timers(d);
	rx_flush(d);
	reap_dead(d);
	return d->quit ? 0 : 1;
}

void vsockd_close(struct vsockd *d)
{
	if (!d)
		return;
	conn_free_all(d);
	reap_dead(d);
	if (d->vu.fd >= 0)
		vu_detach(&d->vu);
	if (d->host_listen_ev.fd >= 0) {
		close(d->host_listen_ev.fd);
		unlink(d->cfg->uds_path);
	}
	if (d->vu_listen_ev.fd >= 0) {
		close(d->vu_listen_ev.fd);
		unlink(d->cfg->vu_path);
	}
	if (d->sig_ev.fd >= 0)
		close(d->sig_ev.fd);
	if (d->ep >= 0)
		close(d->ep);
	free(d);
}

/* What the loop calls (confine.h): epoll, the vhost-user socket and its
 * descriptors, the guest's memory maps, the host connections and the guest's
 * connections to RUN/guest.sock_<port>, and at its end the sockets' unlink. */
static const char *const loop_calls[] = {
	"epoll_wait", "epoll_pwait", "epoll_ctl", "accept4", "accept", "recvmsg", "sendmsg", "recvfrom", "sendto",
	"read", "write", "readv", "writev", "close", "shutdown", "connect", "getsockopt", "setsockopt", "fcntl",
	"fstat", "newfstatat", "statx", "lseek", "mmap", "munmap", "mremap", "brk", "madvise", "mprotect",
	"unlink", "unlinkat", "clock_gettime", "gettimeofday", "time", "nanosleep", "clock_nanosleep", "exit",
	"exit_group", "rt_sigreturn", "rt_sigprocmask", "rt_sigaction", "restart_syscall", "futex", "getpid",
	"gettid", "getrandom", "sigaltstack", "tgkill", "getrlimit", "prlimit64",
};

/* A guest's connection to the host is a Unix socket; nothing else is made. */
static const struct spaced_confine_arg loop_args[] = {
	{"socket", 1, {{0, UINT32_MAX, AF_UNIX}}},
};

int vsockd_run(const struct vsockd_config *cfg)
{
	struct vsockd *d;
	int rc = vsockd_open(cfg, &d);

	if (rc < 0)
		return rc;
	/* from here on it parses what the guest puts in its rings: a bug there
	 * can run only the calls of this loop */
	if (cfg->confine && (rc = spaced_confine_syscalls(loop_calls, sizeof loop_calls / sizeof loop_calls[0], NULL, 0,
	                                                  loop_args, sizeof loop_args / sizeof loop_args[0])) < 0) {
		logf_("error", "confine-failed", "code=%s", spaced_errname(rc));
		vsockd_close(d);
		return rc;
	}
	while ((rc = vsockd_step(d, -1)) > 0)
		;
	vsockd_close(d);
	return rc;
}
