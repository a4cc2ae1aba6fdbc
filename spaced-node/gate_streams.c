/*
 * gate_streams.c — the gate's side of node-api: every request verified and
 * compared (R1) before a byte goes to an execution, then a stream to that
 * execution bound to the record's identity epoch (S1), under flow control.
 *
 * What the gate takes from node-api, and in which state of the stream, is
 * the table in links.c (REQ for a free id; IN, CLOSE and CREDIT for a stream
 * being opened or open, dropped for one that has ended). Anything else drops
 * node-api (it is restarted with the gate).
 *
 * Flow control. A stream has at most GATE_WINDOW bytes of output on their way
 * to its client: past that the gate stops reading the execution's connection
 * (the execution's own buffers then stop it) until node-api credits what its
 * client took. Likewise at most GATE_WINDOW bytes of input go to node-api's
 * credit before node-api stops reading its client. A slow client thus slows
 * only its own stream; one whose client takes none of its output (or whose
 * execution none of a window of its input) for cfg->stall_timeout_ms is cut
 * (a slow but steady client keeps its own). While all streams' output on its way holds NODE_WINDOWS_BUDGET, a
 * stream's window is NODE_WINDOW_SMALL (node.h): a stream paused by it has
 * that much uncredited, so its own credit wakes it. The link to node-api never carries more than the windows of the open
 * streams, and the gate stops reading executions while node-api is behind.
 *
 * Bulk output (exec output, a file's bytes) crosses the gate without a copy:
 * see "bulk output" below.
 */
#include "gate.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "spaced_error.h"
#include "keyring.h"
#include "links.h"
#include "vcache.h"

#define API_HIGH (8u << 20) /* stop reading executions above this backlog to node-api */
/* node-api keeps to the window; what its HTTP layer had read before it
 * paused comes on top */
#define STREAM_WQ_MAX (2 * GATE_WINDOW + (1u << 20))
#define CREDIT_RING 64

enum gstate { GS_CONNECTING = 1, GS_OPEN = 2 };

struct gstream {
	struct gstream *next;
	struct mgr *m;
	uint32_t id;            /* node-api's request id */
	enum gstate state;
	uint32_t job;           /* the connect job while connecting */
	struct gconn *conn;     /* the execution's connection, NULL before and after */
	bool raw;               /* ServicePort tunnel: bytes, not frames */
	bool dead;
	bool shut_pending;      /* ServicePort: half-close once wq drained */
	bool cancelled;         /* the client sent CANCEL: the connection is not reused */
	uint16_t gtype;
	uint64_t epoch;
	struct spaced_cap cap;  /* for the established-stream comparison (S4) */
	char owner[SPACED_NAME_MAX + 2]; /* whose share it counts in: "t:TENANT", or "s:SANDBOX"
	                                  * for a record that names no tenant (stream_refusal) */
	struct spaced_request req;
	char protocol[SPACED_PROTOCOL_MAX];
	char ident[SPACED_IDENTITY_TEXT_MAX];
	struct spaced_buf rbuf; /* bytes from the execution not yet parsed */
	struct spaced_buf wq;   /* bytes for the execution not yet written */
	size_t wq_off;
	uint64_t out_unacked;   /* output sent to node-api, not yet credited */
	/* input: credited back to node-api as it is written to the execution.
	 * wq_in / wq_out count bytes ever appended to / written from wq; each
	 * ring entry is the wq_in position where an input frame ends and its
	 * payload bytes */
	uint64_t wq_in, wq_out;
	struct {
		uint64_t end, bytes;
	} ring[CREDIT_RING];
	unsigned ring_head, ring_len;
	uint64_t stalled_since; /* since when its output or input has not moved (0: it moves) */
	uint64_t out_credited;  /* output node-api credited, in all */
	uint64_t tick_credited, tick_wq_out; /* out_credited and wq_out at the last tick */
	bool awaiting_recovery; /* its execution is being re-bridged or restarted */
	/* bulk output (below): once a large output frame came, frames are read
	 * one at a time, and large ones spliced through pipe */
	bool bulk;
	bool in_frame;          /* fh's payload is being spliced into pipe */
	struct spaced_frame_hdr fh;
	size_t fh_have;
	struct gpipe *pipe;
};

/* A connection to an execution and its one poll handle, which serve one
 * stream after another: a request on a kept connection costs no system call
 * beyond its own reads and writes. While no stream owns it, it is kept for
 * the next request (on its list of m->idle): it passed the bridge's checks when it was
 * opened (B3: a new connection is checked again) and is bound to the epoch
 * it was opened under. */
struct gconn {
	struct gconn *next;     /* on its list of m->idle */
	struct mgr *m;
	int fd;
	uv_poll_t poll;
	int events;             /* what poll watches (0: stopped) */
	struct gstream *owner;  /* the stream it serves; NULL: idle */
	char sandbox[SPACED_NAME_MAX];
	uint64_t epoch;
};

static void api_update_poll(struct mgr *m);
static void stream_update_poll(struct gstream *s);
static void stream_connect(struct mgr *m, struct gstream *s, const struct mgr_rec *rec);
static void stream_kill(struct gstream *s);

/* ---- frames to node-api (never blocking) ---- */

/* ---- bulk output ----
 *
 * A stream whose execution sends a large output frame (exec output, a
 * file's bytes: GATE_SPLICE_MIN and more) is read a frame at a time from
 * then on, and each large frame's payload is spliced from the execution's
 * connection into a pipe of its own; only once the payload is whole in the
 * pipe is its OUT message queued on node-api's link: its head in api_out,
 * and a mark there from which the link's flush splices the payload on. So
 * the payload is moved by reference (the pages the execution wrote), never
 * copied through the gate; a stalled execution holds only its own pipe
 * (nothing of a frame goes on the link before it is whole); and the link
 * carries every message in order. A pipe holds pieces, not bytes: a frame
 * sent in more small pieces than its pipe has slots is read back out of it
 * and copied, as is a frame that finds no pipe (GATE_PIPES_MAX in flight) or
 * no room among the marks. */

#define GATE_SPLICE_MIN (16u << 10)
#define GATE_PIPE_SIZE (256u << 10) /* 64 slots: a frame in pieces of 1 KiB on average */
#define GATE_PIPES_MAX 128
#define GATE_PIPES_KEPT 16
#define GATE_MARKS_MAX 2048

/* A pipe carrying one frame's payload: its stream's while it fills, then
 * its mark's until the link took it all; empty again, it is kept for the
 * next. */
struct gpipe {
	struct gpipe *next; /* on the kept list */
	int rd, wr;
};

struct api_mark {
	size_t at;   /* the api_out offset the payload follows */
	size_t left; /* its bytes still in p */
	struct gpipe *p;
};

struct gate_bulk {
	struct api_mark marks[GATE_MARKS_MAX]; /* a ring, in the link's order */
	unsigned head, len;
	size_t spliced; /* the bytes the marks hold */
	struct gpipe *kept;
	unsigned nkept, npipes;
};

/* An empty pipe (kept or new), NULL when none may be had. */
static struct gpipe *pipe_get(struct mgr *m)
{
	struct gate_bulk *b = m->bulk;
	if (b->kept) {
		struct gpipe *p = b->kept;
		b->kept = p->next;
		b->nkept--;
		return p;
	}
	int fds[2];
	if (b->npipes >= GATE_PIPES_MAX || pipe2(fds, O_NONBLOCK | O_CLOEXEC) < 0)
		return NULL;
	(void)fcntl(fds[1], F_SETPIPE_SZ, (int)GATE_PIPE_SIZE);
	struct gpipe *p = malloc(sizeof *p);
	if (!p) {
		close(fds[0]);
		close(fds[1]);
		return NULL;
	}
	*p = (struct gpipe){.rd = fds[0], .wr = fds[1]};
	b->npipes++;
	return p;
}

/* Gives p back: kept when empty (and few are kept), else closed. */
static void pipe_put(struct mgr *m, struct gpipe *p, bool empty)
{
	struct gate_bulk *b = m->bulk;
	if (empty && b->nkept < GATE_PIPES_KEPT) {
		p->next = b->kept;
		b->kept = p;
		b->nkept++;
		return;
	}
	close(p->rd);
	close(p->wr);
	free(p);
	b->npipes--;
}

static size_t bulk_spliced(const struct mgr *m)
{
	return m->bulk ? m->bulk->spliced : 0;
}

static void api_flush_soon(struct mgr *m);

/* Queues OUT for s (guest answer type, n payload bytes now whole in its
 * pipe, which the message's mark takes over): its head in api_out, and the
 * mark. */
static void stream_out_spliced(struct gstream *s, uint16_t type, size_t n)
{
	struct mgr *m = s->m;
	struct gate_bulk *b = m->bulk;
	uint8_t head[SPACED_FRAME_HDR_LEN + 32];
	struct spaced_buf f = {.data = head + SPACED_FRAME_HDR_LEN, .cap = 32, .max = 31};
	(void)spaced_field_put_u64(&f, type);
	(void)spaced_field_put_bytes_head(&f, n);
	spaced_frame_hdr_encode(head, &(struct spaced_frame_hdr){.len = (uint32_t)(f.len + n), .type = NODE_MSG_OUT,
	                                                          .id = s->id});
	if (spaced_buf_append(&m->api_out, head, SPACED_FRAME_HDR_LEN + f.len) < 0) {
		gate_quit(m, "the link to node-api overflowed");
		return;
	}
	b->marks[(b->head + b->len) % GATE_MARKS_MAX] = (struct api_mark){.at = m->api_out.len, .left = n, .p = s->pipe};
	s->pipe = NULL;
	b->len++;
	b->spliced += n;
	s->out_unacked += n;
	m->out_unacked += n;
	api_flush_soon(m);
}

static bool bulk_type(uint16_t type)
{
	return type == SPACED_GUEST_OUT_STDOUT || type == SPACED_GUEST_OUT_STDERR || type == SPACED_GUEST_OUT_DATA;
}

static void send_fail(struct mgr *m, uint32_t id, int err, const char *msg);

/* Ends s's frame being spliced: what its pipe holds goes back to rbuf,
 * after the frame's header, for the copying read to finish (the pipe had
 * no slot left for the next piece, or cannot be spliced into). */
static bool bulk_read_back(struct gstream *s)
{
	uint8_t h[SPACED_FRAME_HDR_LEN];
	spaced_frame_hdr_encode(h, &s->fh);
	bool ok = spaced_buf_append(&s->rbuf, h, sizeof h) == 0 && spaced_buf_reserve(&s->rbuf, s->fh_have) == 0;
	size_t got = 0;
	while (ok && got < s->fh_have) {
		ssize_t k = read(s->pipe->rd, s->rbuf.data + s->rbuf.len + got, s->fh_have - got);
		if (k < 0 && errno == EINTR)
			continue;
		ok = k > 0;
		got += k > 0 ? (size_t)k : 0;
	}
	s->rbuf.len += got;
	pipe_put(s->m, s->pipe, ok);
	s->pipe = NULL;
	s->in_frame = false;
	return ok;
}

/* Reads s's next frame when it may be spliced (s in bulk mode, nothing of
 * it buffered): 0 when done or waiting for the execution, 1 when the
 * frame is not one to splice (what there is of it is now in rbuf, for the
 * copying read), -1 when the stream ended. */
static int bulk_read(struct gstream *s)
{
	int fd = s->conn->fd;
	if (!s->in_frame) {
		uint8_t h[SPACED_FRAME_HDR_LEN];
		ssize_t r = recv(fd, h, sizeof h, MSG_DONTWAIT);
		if (r < 0 && (errno == EINTR || errno == EAGAIN))
			return 0;
		struct spaced_frame_hdr fh;
		if (r <= 0 || spaced_buf_append(&s->rbuf, h, (size_t)r) < 0) {
			send_fail(s->m, s->id, SPACED_ECLOSED, "execution closed the connection");
			stream_kill(s);
			return -1;
		}
		if (r < (ssize_t)sizeof h || spaced_frame_hdr_decode(&fh, h, SPACED_FRAME_MAX) < 0 || fh.id != 1 ||
		    !bulk_type(fh.type) || fh.flags != 0 || fh.len < GATE_SPLICE_MIN || fh.len > SPACED_FRAME_CHUNK + 512 ||
		    s->m->bulk->len >= GATE_MARKS_MAX || !(s->pipe = pipe_get(s->m)))
			return 1;
		s->rbuf.len = 0;
		s->in_frame = true;
		s->fh = fh;
		s->fh_have = 0;
	}
	while (s->fh_have < s->fh.len) {
		ssize_t k = splice(fd, NULL, s->pipe->wr, NULL, s->fh.len - s->fh_have, SPLICE_F_NONBLOCK | SPLICE_F_MOVE);
		if (k < 0 && errno == EINTR)
			continue;
		int waiting = 0;
		if (k < 0 && errno == EAGAIN && (ioctl(fd, FIONREAD, &waiting) < 0 || waiting == 0))
			return 0; /* the rest is not here yet */
		if (k == 0) {
			send_fail(s->m, s->id, SPACED_ECLOSED, "execution closed the connection");
			stream_kill(s);
			return -1;
		}
		if (k < 0) /* the pipe's slots are full (small pieces), or no splice here */
			return bulk_read_back(s) ? 1 : (stream_kill(s), -1);
		s->fh_have += (size_t)k;
	}
	s->in_frame = false;
	stream_out_spliced(s, s->fh.type, s->fh.len);
	return 0;
}

/* What the copying read of a stream in bulk mode takes: the rest of the
 * frame rbuf holds the start of (its header first), so that the next
 * frame's header is read on its own. */
static size_t frame_rest(const struct spaced_buf *rb, size_t most)
{
	struct spaced_frame_hdr fh;
	size_t want = SPACED_FRAME_HDR_LEN - (rb->len < SPACED_FRAME_HDR_LEN ? rb->len : SPACED_FRAME_HDR_LEN);
	if (want == 0 && spaced_frame_hdr_decode(&fh, rb->data, SPACED_FRAME_MAX) == 0 &&
	    SPACED_FRAME_HDR_LEN + (size_t)fh.len > rb->len)
		want = SPACED_FRAME_HDR_LEN + (size_t)fh.len - rb->len;
	return want > 0 && want < most ? want : most;
}

static void api_flush(struct mgr *m)
{
	struct gate_bulk *b = m->bulk;
	while (m->api_fd >= 0) {
		size_t end = b && b->len ? b->marks[b->head].at : m->api_out.len;
		ssize_t w;
		if (m->api_out_off < end) {
			w = send(m->api_fd, m->api_out.data + m->api_out_off, end - m->api_out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
		} else if (b && b->len) {
			struct api_mark *k = &b->marks[b->head];
			w = splice(k->p->rd, NULL, m->api_fd, NULL, k->left, SPLICE_F_NONBLOCK | SPLICE_F_MOVE);
			if (w > 0) {
				k->left -= (size_t)w;
				b->spliced -= (size_t)w;
				if (k->left == 0) {
					pipe_put(m, k->p, true);
					b->head = (b->head + 1) % GATE_MARKS_MAX;
					b->len--;
				}
				continue;
			}
		} else {
			break;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN)
			break;
		if (w <= 0) {
			gate_quit(m, "node-api's link failed");
			return;
		}
		m->api_out_off += (size_t)w;
	}
	size_t off = m->api_out_off;
	bool marks = b && b->len;
	if (off == m->api_out.len && !marks) {
		m->api_out.len = 0;
		m->api_out_off = 0;
	} else if (off >= (1u << 20)) {
		memmove(m->api_out.data, m->api_out.data + off, m->api_out.len - off);
		m->api_out.len -= off;
		m->api_out_off = 0;
		for (unsigned i = 0; marks && i < b->len; i++)
			b->marks[(b->head + i) % GATE_MARKS_MAX].at -= off;
	}
}

/* node-api is behind: executions are not read meanwhile (api_held says
 * some stream was held back for it, to be polled again once it caught up). */
static bool api_backlog(struct mgr *m)
{
	bool behind = m->api_out.len - m->api_out_off + bulk_spliced(m) > API_HIGH;
	if (behind)
		m->api_held = true;
	return behind;
}

/* After output to node-api went: the streams held back are read again once
 * it has caught up. */
static void api_caught_up(struct mgr *m)
{
	if (!m->api_held || m->api_out.len - m->api_out_off + bulk_spliced(m) > API_HIGH)
		return;
	m->api_held = false;
	for (struct gstream *s = m->streams; s; s = s->next)
		stream_update_poll(s);
}

/* Frames queued during one turn of the loop go out together at its end (the
 * check phase; the idle handle keeps the loop from sleeping before it), so
 * that an answer's ACCEPT, data and RESULT wake node-api once. */
static void api_flush_due(uv_check_t *h)
{
	struct mgr *m = h->data;
	if (!m->api_flush_due)
		return;
	m->api_flush_due = false;
	uv_idle_stop(&m->api_idle);
	api_flush(m);
	api_update_poll(m);
	api_caught_up(m);
}

static void api_idle(uv_idle_t *h)
{
	api_flush_due((uv_check_t *)&((struct mgr *)h->data)->api_check);
}

/* One message whose payload is head then tail, built in the link's queue
 * (the tail, a stream's data, is copied once). */
static void api_send2(struct mgr *m, uint16_t type, uint16_t flags, uint32_t id, const void *head, size_t hlen,
                      const void *tail, size_t tlen)
{
	if (m->api_fd < 0)
		return;
	if (spaced_frame_append2(&m->api_out, type, flags, id, head, hlen, tail, tlen) < 0) {
		/* only the windows of open streams are ever queued: this is a bug */
		gate_quit(m, "the link to node-api overflowed");
		return;
	}
	api_flush_soon(m);
}

/* The link is flushed at the end of this turn of the loop. */
static void api_flush_soon(struct mgr *m)
{
	if (!m->api_flush_due) {
		m->api_flush_due = true;
		uv_idle_start(&m->api_idle, api_idle);
	}
}

void gate_api_send(struct mgr *m, uint16_t type, uint16_t flags, uint32_t id, const struct spaced_buf *b)
{
	api_send2(m, type, flags, id, b ? b->data : NULL, b ? b->len : 0, NULL, 0);
}

static void send_refuse(struct mgr *m, uint16_t type, uint32_t id, struct spaced_decision d, const char *sandbox)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 1024);
	if (spaced_field_put_u64(&b, (uint64_t)d.verdict) == 0 && spaced_field_put_u64(&b, (uint64_t)d.reason) == 0 &&
	    spaced_field_put_str(&b, sandbox) == 0)
		gate_api_send(m, type, SPACED_FRAME_F_END, id, &b);
	spaced_buf_free(&b);
}

static void send_fail(struct mgr *m, uint32_t id, int err, const char *msg)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 1024);
	char text[256]; /* within FAIL's bound (links.c) */
	snprintf(text, sizeof text, "%s", msg);
	if (spaced_field_put_i64(&b, err) == 0 && spaced_field_put_str(&b, text) == 0)
		gate_api_send(m, NODE_MSG_FAIL, SPACED_FRAME_F_END, id, &b);
	spaced_buf_free(&b);
}

/* ACCEPT: the identity and epoch the request reaches, and whose share its
 * answer counts in at node-api (stream_owner). */
static void send_accept(struct mgr *m, uint32_t id, const char *ident, uint64_t epoch, const char *owner)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 1024);
	if (spaced_field_put_str(&b, ident) == 0 && spaced_field_put_u64(&b, epoch) == 0 &&
	    spaced_field_put_str(&b, owner) == 0)
		gate_api_send(m, NODE_MSG_ACCEPT, 0, id, &b);
	spaced_buf_free(&b);
}

/* Tells node-api how much of a stream's input the execution has taken:
 * every input frame written out whole since the last credit. */
static void send_credit(struct gstream *s)
{
	uint64_t bytes = 0;
	while (s->ring_len > 0 && s->ring[s->ring_head].end <= s->wq_out) {
		bytes += s->ring[s->ring_head].bytes;
		s->ring_head = (s->ring_head + 1) % CREDIT_RING;
		s->ring_len--;
	}
	if (bytes == 0)
		return;
	struct spaced_buf b;
	spaced_buf_init(&b, 32);
	if (spaced_field_put_u64(&b, bytes) == 0)
		gate_api_send(s->m, NODE_MSG_GCREDIT, 0, s->id, &b);
	spaced_buf_free(&b);
}

/* Notes that the input frame just appended to wq carries bytes of payload. */
static void note_input(struct gstream *s, uint64_t bytes)
{
	if (bytes == 0)
		return;
	if (s->ring_len == CREDIT_RING) {
		/* merged into the newest entry: credited a little later */
		unsigned last = (s->ring_head + s->ring_len - 1) % CREDIT_RING;
		s->ring[last].end = s->wq_in;
		s->ring[last].bytes += bytes;
		return;
	}
	unsigned at = (s->ring_head + s->ring_len) % CREDIT_RING;
	s->ring[at].end = s->wq_in;
	s->ring[at].bytes = bytes;
	s->ring_len++;
}

/* The output window of s now (node.h: NODE_WINDOWS_BUDGET). */
static uint64_t out_window(const struct gstream *s)
{
	return s->m->out_unacked >= NODE_WINDOWS_BUDGET ? NODE_WINDOW_SMALL : GATE_WINDOW;
}

static void out_acked(struct gstream *s, uint64_t bytes)
{
	if (bytes > s->out_unacked)
		bytes = s->out_unacked;
	s->out_unacked -= bytes;
	s->m->out_unacked -= bytes;
	s->out_credited += bytes;
}

static void stream_out(struct gstream *s, uint16_t type, uint16_t flags, const uint8_t *p, size_t n)
{
	/* OUT's fields, the guest's type and its bytes: the two fields' heads
	 * here, the bytes straight from the guest's read buffer */
	uint8_t head[32];
	struct spaced_buf b = {.data = head, .cap = sizeof head, .max = sizeof head - 1};
	if (n <= NODE_MSG_MAX - 64 && spaced_field_put_u64(&b, type) == 0 && spaced_field_put_bytes_head(&b, n) == 0)
		api_send2(s->m, NODE_MSG_OUT, flags, s->id, b.data, b.len, p, n);
	s->out_unacked += n;
	s->m->out_unacked += n;
}

/* ---- connections to executions ---- */

static void on_guest(struct gstream *s, int status, int events);

static void gconn_close_cb(uv_handle_t *h)
{
	free(h->data);
}

/* Closes c for good (its stream or the idle list no longer names it). */
static void gconn_close(struct gconn *c, bool reset)
{
	if (reset)
		shutdown(c->fd, SHUT_RDWR);
	c->owner = NULL; /* its stream may be freed before the close callback */
	uv_poll_stop(&c->poll);
	close(c->fd);
	uv_close((uv_handle_t *)&c->poll, gconn_close_cb);
}

/* Watches ev on c (no system call when it watches that already). */
static void gconn_watch(struct gconn *c, int ev);

/* The list of kept connections where those to sandbox are. */
static struct gconn **idle_list(struct mgr *m, const char *sandbox)
{
	return &m->idle[spaced_fnv1a(sandbox) & (GATE_IDLE_BUCKETS - 1)];
}

static void on_gconn(uv_poll_t *h, int status, int events)
{
	struct gconn *c = h->data;
	if (c->owner) {
		on_guest(c->owner, status, events);
		return;
	}
	/* an idle connection that became readable was closed or misbehaves */
	for (struct gconn **pp = idle_list(c->m, c->sandbox); *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	}
	c->m->nidle--;
	gconn_close(c, false);
}

static void gconn_watch(struct gconn *c, int ev)
{
	if (ev == c->events)
		return;
	c->events = ev;
	if (ev)
		uv_poll_start(&c->poll, ev, on_gconn);
	else
		uv_poll_stop(&c->poll);
}

/* A connection for fd (nonblocking from here on), NULL when it cannot be
 * watched (fd closed then). */
static struct gconn *gconn_new(struct mgr *m, int fd)
{
	struct gconn *c = calloc(1, sizeof *c);
	if (!c || uv_poll_init(m->loop, &c->poll, fd) < 0) {
		free(c);
		close(fd);
		return NULL;
	}
	c->m = m;
	c->fd = fd;
	c->poll.data = c;
	return c;
}

/* Takes a kept connection to sandbox's execution of epoch off the idle list. */
static struct gconn *pool_take(struct mgr *m, const char *sandbox, uint64_t epoch)
{
	for (struct gconn **pp = idle_list(m, sandbox); *pp; pp = &(*pp)->next) {
		struct gconn *c = *pp;
		if (c->epoch == epoch && strcmp(c->sandbox, sandbox) == 0) {
			*pp = c->next;
			c->next = NULL;
			m->nidle--;
			return c;
		}
	}
	return NULL;
}

/* Keeps c for the next request to sandbox, while epoch is its current one
 * and the bounds allow; else closes it. */
static void pool_put(struct mgr *m, struct gconn *c, const char *sandbox, uint64_t epoch)
{
	size_t same = 0;
	struct gconn **list = idle_list(m, sandbox);
	for (struct gconn *i = *list; i; i = i->next)
		same += strcmp(i->sandbox, sandbox) == 0;
	const struct mgr_rec *rec = mgr_rec_find(m, sandbox);
	bool current = rec && rec->r.active && rec->r.epoch == epoch;
	c->owner = NULL;
	if (!current || same >= GATE_IDLE_PER_SANDBOX || m->nidle >= GATE_MAX_STREAMS) {
		gconn_close(c, false);
		return;
	}
	snprintf(c->sandbox, sizeof c->sandbox, "%s", sandbox);
	c->epoch = epoch;
	c->next = *list;
	*list = c;
	m->nidle++;
	gconn_watch(c, UV_READABLE | UV_DISCONNECT);
}

/* Closes idle connections of sandbox (all of them when sandbox is NULL) older than epoch. */
static void pool_flush(struct mgr *m, const char *sandbox, uint64_t epoch)
{
	size_t first = 0, end = GATE_IDLE_BUCKETS;
	if (sandbox) {
		first = (size_t)(idle_list(m, sandbox) - m->idle);
		end = first + 1;
	}
	for (size_t b = first; b < end; b++) {
		for (struct gconn **pp = &m->idle[b]; *pp;) {
			struct gconn *c = *pp;
			if (!sandbox || (strcmp(c->sandbox, sandbox) == 0 && c->epoch < epoch)) {
				*pp = c->next;
				m->nidle--;
				gconn_close(c, false);
			} else {
				pp = &c->next;
			}
		}
	}
}

/* ---- streams ---- */

static struct gstream *stream_find(struct mgr *m, uint32_t id)
{
	for (struct gstream *s = m->streams; s; s = s->next)
		if (s->id == id && !s->dead)
			return s;
	return NULL;
}

static void stream_kill(struct gstream *s)
{
	if (s->dead)
		return;
	s->dead = true;
	if (s->state == GS_CONNECTING && s->job)
		gate_job_forget(s->m, s->job);
	if (s->pipe) { /* a frame begun, never sent (what its marks hold still goes) */
		pipe_put(s->m, s->pipe, s->fh_have == 0);
		s->pipe = NULL;
	}
	if (s->conn) {
		gconn_close(s->conn, true);
		s->conn = NULL;
	}
}

/* Whose share a stream of rec counts in: its tenant's, or the sandbox's
 * own when its install named no tenant. */
static void stream_owner(const struct mgr_rec *rec, char out[SPACED_NAME_MAX + 2])
{
	snprintf(out, SPACED_NAME_MAX + 2, "%s:%s", rec->tenant[0] ? "t" : "s",
	         rec->tenant[0] ? rec->tenant : rec->r.id.sandbox);
}

/* Why owner (stream_owner) may not open one more request or stream, NULL
 * when it may. The worker's table (cfg->max_streams) is shared so that no
 * tenant, and no few, hold all of it: once half of it is in use a tenant
 * holding an eighth opens no more (one tenant holds half at most); once
 * three quarters are, only a tenant holding fewer than a 128th (at least 2)
 * does, so a quarter stays for those with a few. A tenant's own are counted
 * only past half (a walk of the table). */
static const char *stream_refusal(struct mgr *m, const char *owner)
{
	size_t max = m->cfg->max_streams > 0 ? (size_t)m->cfg->max_streams : GATE_MAX_STREAMS, n = m->nstreams;
	if (n >= max)
		return "too many open requests on this worker";
	if (n < max / 2)
		return NULL;
	size_t held = 0;
	for (const struct gstream *s = m->streams; s; s = s->next)
		held += !s->dead && strcmp(s->owner, owner) == 0;
	switch (spaced_fair_share(n, max, held, 2)) {
	case 1:
		return "this tenant holds too many open requests on this worker";
	case 2:
		return "this tenant holds too many open requests on this worker (the rest is kept for those with a few)";
	default:
		return NULL;
	}
}

/* Frees the dead streams (outside the callbacks that may still use them). */
static void streams_reap(struct mgr *m)
{
	for (struct gstream **pp = &m->streams; *pp;) {
		struct gstream *s = *pp;
		if (s->dead) {
			*pp = s->next;
			out_acked(s, s->out_unacked);
			spaced_buf_free(&s->rbuf);
			spaced_buf_free(&s->wq);
			free(s);
			m->nstreams--;
		} else {
			pp = &s->next;
		}
	}
}

/* Writes what the connection takes now and keeps the rest (never blocks). */
static int stream_flush(struct gstream *s)
{
	if (!s->conn)
		return 0;
	while (s->wq_off < s->wq.len) {
		ssize_t w = send(s->conn->fd, s->wq.data + s->wq_off, s->wq.len - s->wq_off, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN)
			break;
		if (w <= 0)
			return SPACED_EIO;
		s->wq_off += (size_t)w;
		s->wq_out += (uint64_t)w;
	}
	if (s->wq_off == s->wq.len) {
		s->wq.len = 0;
		s->wq_off = 0;
		if (s->shut_pending) {
			shutdown(s->conn->fd, SHUT_WR);
			s->shut_pending = false;
		}
	} else if (s->wq_off >= (1u << 20)) {
		memmove(s->wq.data, s->wq.data + s->wq_off, s->wq.len - s->wq_off);
		s->wq.len -= s->wq_off;
		s->wq_off = 0;
	}
	return 0;
}

/* The purpose and class of a request type; 0 for types node-api may not send. */
static uint32_t purpose_of(uint16_t gtype, enum spaced_cap_class *cls)
{
	*cls = SPACED_CLASS_CONTROL;
	switch (gtype) {
	case SPACED_GUEST_FS_READ:
	case SPACED_GUEST_FS_LIST:
	case SPACED_GUEST_FS_STAT:
		return SPACED_PURPOSE_FS_READ;
	case SPACED_GUEST_FS_WRITE:
	case SPACED_GUEST_FS_MKDIR:
	case SPACED_GUEST_FS_MOVE:
	case SPACED_GUEST_FS_REMOVE:
		return SPACED_PURPOSE_FS_WRITE;
	case SPACED_GUEST_EXEC:
	case SPACED_GUEST_PROC_LIST:
	case SPACED_GUEST_PROC_ATTACH:
	case SPACED_GUEST_PROC_SIGNAL:
	case SPACED_GUEST_PROC_KILL:
		return SPACED_PURPOSE_EXEC;
	case SPACED_GUEST_TERM_OPEN:
		return SPACED_PURPOSE_TERM;
	case SPACED_GUEST_WATCH:
		return SPACED_PURPOSE_WATCH;
	case NODE_PORT_OPEN:
		*cls = SPACED_CLASS_SERVICEPORT;
		return SPACED_PURPOSE_SERVICEPORT;
	case NODE_USAGE:
		return SPACED_PURPOSE_LIFECYCLE;
	default:
		return 0;
	}
}

/* Which stream inputs a request type accepts. */
static bool input_allowed(const struct gstream *s, uint16_t in)
{
	if (in == SPACED_GUEST_IN_CANCEL)
		return !s->raw;
	switch (s->gtype) {
	case SPACED_GUEST_FS_WRITE:
		return in == SPACED_GUEST_IN_DATA;
	case SPACED_GUEST_EXEC:
		return in == SPACED_GUEST_IN_STDIN || in == SPACED_GUEST_IN_SIGNAL;
	case SPACED_GUEST_TERM_OPEN:
		return in == SPACED_GUEST_IN_STDIN || in == SPACED_GUEST_IN_RESIZE;
	case NODE_PORT_OPEN:
		return in == SPACED_GUEST_IN_STDIN;
	default:
		return false;
	}
}

/* Checks the identity the execution put in its RESULT against the one the
 * request was admitted for. */
static bool result_identity_ok(const struct gstream *s, const uint8_t *p, size_t n)
{
	struct spaced_field_reader r;
	int64_t status;
	const char *msg, *ident;
	size_t ml, il;
	spaced_field_reader_init(&r, p, n);
	if (spaced_field_get_i64(&r, &status) < 0 || spaced_field_get_str(&r, &msg, &ml) < 0 ||
	    spaced_field_get_str(&r, &ident, &il) < 0)
		return false;
	return il == strlen(s->ident) && memcmp(ident, s->ident, il) == 0;
}

static void guest_readable(struct gstream *s)
{
	struct mgr *m = s->m;
	uint8_t tmp[SPACED_FRAME_CHUNK];
	/* what the window and node-api's backlog let through */
	uint64_t window = out_window(s);
	size_t room = (size_t)(window - (s->out_unacked < window ? s->out_unacked : window));
	if (room == 0 || api_backlog(m))
		return;
	if (!s->raw && s->bulk && (s->in_frame || s->rbuf.len == 0) && bulk_read(s) <= 0)
		return;
	size_t want = s->raw && room < sizeof tmp ? room : sizeof tmp;
	ssize_t r = recv(s->conn->fd, tmp, s->bulk ? frame_rest(&s->rbuf, want) : want, MSG_DONTWAIT);
	if (r < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (s->raw) {
		if (r <= 0) {
			struct spaced_buf b;
			spaced_buf_init(&b, 256);
			spaced_field_put_i64(&b, 0);
			spaced_field_put_str(&b, "port closed");
			spaced_field_put_str(&b, s->ident);
			stream_out(s, SPACED_GUEST_OUT_RESULT, SPACED_FRAME_F_END, b.data, b.len);
			spaced_buf_free(&b);
			stream_kill(s);
		} else {
			stream_out(s, SPACED_GUEST_OUT_STDOUT, 0, tmp, (size_t)r);
		}
		return;
	}
	if (r <= 0 || spaced_buf_append(&s->rbuf, tmp, (size_t)r) < 0) {
		send_fail(m, s->id, SPACED_ECLOSED, "execution closed the connection");
		stream_kill(s);
		return;
	}
	size_t off = 0;
	while (!s->dead) {
		struct spaced_frame_hdr h;
		const uint8_t *pl;
		size_t used;
		int e = spaced_frame_parse(s->rbuf.data + off, s->rbuf.len - off, SPACED_FRAME_MAX, &h, &pl, &used);
		if (e == 0 && used == 0)
			break;
		if (e < 0 || h.id != 1 || h.type < SPACED_GUEST_OUT_RESULT || h.type > SPACED_GUEST_OUT_PROCS ||
		    h.len > SPACED_FRAME_CHUNK + 512) {
			send_fail(m, s->id, SPACED_EPROTO, "execution protocol error");
			stream_kill(s);
			break;
		}
		off += used;
		if (h.type == SPACED_GUEST_OUT_RESULT) {
			if (!(h.flags & SPACED_FRAME_F_END) || !result_identity_ok(s, pl, h.len)) {
				send_fail(m, s->id, SPACED_EIDENTITY, "the execution answered with another identity");
			} else {
				stream_out(s, h.type, SPACED_FRAME_F_END, pl, h.len);
				/* a cleanly ended request leaves a reusable connection */
				if (off == s->rbuf.len && s->wq_off == s->wq.len && !s->cancelled) {
					pool_put(m, s->conn, s->cap.id.sandbox, s->epoch);
					s->conn = NULL;
				}
			}
			stream_kill(s);
			break;
		}
		stream_out(s, h.type, 0, pl, h.len);
		/* large output: from the next frame on, spliced (bulk output) */
		s->bulk |= m->bulk && bulk_type(h.type) && h.len >= GATE_SPLICE_MIN;
	}
	if (!s->dead && off > 0) {
		memmove(s->rbuf.data, s->rbuf.data + off, s->rbuf.len - off);
		s->rbuf.len -= off;
	}
}

static void on_guest(struct gstream *s, int status, int events)
{
	if (s->dead)
		return;
	if (status < 0) {
		send_fail(s->m, s->id, SPACED_ECLOSED, "execution connection lost");
		stream_kill(s);
		return;
	}
	if (events & UV_WRITABLE) {
		if (stream_flush(s) < 0) {
			send_fail(s->m, s->id, SPACED_ECLOSED, "execution connection lost");
			stream_kill(s);
			return;
		}
		/* the execution took input: node-api may send more */
		send_credit(s);
	}
	if (events & (UV_READABLE | UV_DISCONNECT))
		guest_readable(s);
	if (!s->dead)
		stream_update_poll(s);
}

static void stream_update_poll(struct gstream *s)
{
	if (s->dead || !s->conn)
		return;
	/* reading watches what an idle connection does: a kept connection
	 * changes hands without a system call */
	bool want_read = s->out_unacked < out_window(s) && !api_backlog(s->m);
	gconn_watch(s->conn,
	            (want_read ? UV_READABLE | UV_DISCONNECT : 0) | (s->wq_off < s->wq.len ? UV_WRITABLE : 0));
}

/* The stream's connection is there (conn, NULL when it could not be
 * watched): forward what waited and start polling. */
static void stream_open(struct gstream *s, struct gconn *conn)
{
	struct mgr *m = s->m;
	s->state = GS_OPEN;
	s->job = 0;
	if (!conn) {
		send_fail(m, s->id, SPACED_ESYS, "cannot watch the execution's connection");
		stream_kill(s);
		return;
	}
	s->conn = conn;
	conn->owner = s;
	send_accept(m, s->id, s->ident, s->epoch, s->owner);
	/* what arrived while connecting goes now */
	if (stream_flush(s) < 0) {
		send_fail(m, s->id, SPACED_ECLOSED, "execution connection lost");
		stream_kill(s);
		return;
	}
	send_credit(s);
	stream_update_poll(s);
}

static void on_connected(struct mgr *m, uintptr_t ctx, int status, const char *msg, json_t *result, int fd)
{
	(void)result;
	struct gstream *s = stream_find(m, (uint32_t)ctx);
	if (!s || s->state != GS_CONNECTING) {
		if (fd >= 0)
			close(fd);
		return;
	}
	s->job = 0;
	if (status < 0 || fd < 0) {
		if (fd >= 0)
			close(fd);
		if (status == SPACED_EPEER || status == SPACED_EIDENTITY)
			gate_log("level=warn event=bridge-refused sandbox=%s reason=\"%s\"", s->cap.id.sandbox, msg);
		send_fail(m, s->id, SPACED_ECLOSED, "execution unreachable");
		stream_kill(s);
		return;
	}
	m->n_conn_new++;
	stream_open(s, gconn_new(m, fd));
}

/* ---- usage: one measurement per sandbox at a time, shared ----
 *
 * A measurement is a job of the executor's (a child asking the launcher),
 * in the same queue as installs, claims, pauses and snapshots. Each request
 * measuring anew let one tenant's flood of usage requests (120 a second)
 * hold up every tenant's lifecycle on the worker (a create 84–318 ms quiet
 * took 1.4–8.7 s). Now requests for one sandbox share one measurement, and
 * its answer serves every request within USAGE_FRESH_MS; a tenant has one
 * measurement running at a time (the others wait their turn), so the queue
 * holds one usage job per tenant at most. */
#define USAGE_FRESH_MS 1000   /* an answer serves every request for this long */
#define USAGE_WAITERS_MAX 256 /* requests sharing one measurement (more: busy) */

struct usage_entry {
	struct usage_entry *next;
	char sandbox[SPACED_NAME_MAX];
	char owner[SPACED_NAME_MAX + 2]; /* stream_owner's: one measurement at a time each */
	uint64_t serial;                 /* its job's context */
	uint64_t generation;             /* of the execution measured */
	int64_t pid;
	enum { USAGE_IDLE, USAGE_QUEUED, USAGE_RUNNING } state;
	uint64_t queued_seq; /* the owner's turns, oldest first */
	uint32_t waiters[USAGE_WAITERS_MAX];
	int nwaiters;
	json_t *answer; /* the last one, without limits */
	uint64_t at_ns; /* when it was measured */
};

static struct usage_entry *usages;
static uint64_t usage_serial, usage_seq;

/* The answer to request id: result with rec's limits, as the execution
 * installed now. */
static void usage_send(struct mgr *m, uint32_t id, const struct mgr_rec *rec, json_t *result)
{
	json_t *a = json_copy(result);
	if (a)
		json_object_set_new(a, "limits", spaced_resources_to_json(&rec->res));
	char *text = a ? json_dumps(a, JSON_COMPACT) : NULL;
	json_decref(a);
	char ident[SPACED_IDENTITY_TEXT_MAX];
	spaced_identity_encode(&rec->r.id, ident, sizeof ident);
	struct spaced_buf r, o;
	spaced_buf_init(&r, 8192);
	spaced_buf_init(&o, NODE_MSG_MAX);
	if (text && spaced_field_put_i64(&r, 0) == 0 && spaced_field_put_str(&r, "") == 0 &&
	    spaced_field_put_str(&r, ident) == 0 && spaced_field_put_str(&r, text) == 0 &&
	    spaced_field_put_u64(&o, SPACED_GUEST_OUT_RESULT) == 0 && spaced_field_put_bytes(&o, r.data, r.len) == 0) {
		char owner[SPACED_NAME_MAX + 2];
		stream_owner(rec, owner);
		send_accept(m, id, ident, rec->r.epoch, owner);
		gate_api_send(m, NODE_MSG_OUT, SPACED_FRAME_F_END, id, &o);
	} else {
		send_fail(m, id, SPACED_ENOMEM, "out of memory");
	}
	free(text);
	spaced_buf_free(&r);
	spaced_buf_free(&o);
}

static void on_usage(struct mgr *m, uintptr_t ctx, int status, const char *msg, json_t *result, int fd);

/* Starts e's measurement of rec. False when it cannot start. */
static bool usage_start(struct mgr *m, struct usage_entry *e, const struct mgr_rec *rec)
{
	json_t *args = json_pack("{s:o}", "rec", mgr_rec_to_json(rec));
	e->serial = ++usage_serial;
	e->generation = rec->r.id.generation;
	e->pid = rec->pid;
	if (!args || !gate_job(m, "usage", args, on_usage, (uintptr_t)e->serial))
		return false;
	e->state = USAGE_RUNNING;
	m->n_usage_measured++;
	return true;
}

static void usage_fail_all(struct mgr *m, struct usage_entry *e, int status, const char *why)
{
	for (int i = 0; i < e->nwaiters; i++)
		send_fail(m, e->waiters[i], status, why);
	e->nwaiters = 0;
	e->state = USAGE_IDLE;
}

/* The oldest waiting turn of owner's, started; one that cannot start fails. */
static void usage_next(struct mgr *m, const char *owner)
{
	for (;;) {
		struct usage_entry *next = NULL;
		for (struct usage_entry *e = usages; e; e = e->next)
			if (e->state == USAGE_QUEUED && strcmp(e->owner, owner) == 0 &&
			    (!next || e->queued_seq < next->queued_seq))
				next = e;
		if (!next)
			return;
		const struct mgr_rec *rec = mgr_rec_find(m, next->sandbox);
		if (rec && usage_start(m, next, rec))
			return;
		usage_fail_all(m, next, rec ? SPACED_ENOMEM : SPACED_ECLOSED,
		               rec ? "out of memory" : "the execution's launcher did not answer");
	}
}

/* Frees the entries nothing waits on whose answer is no longer fresh. */
static void usage_prune(uint64_t now)
{
	for (struct usage_entry **pp = &usages; *pp;) {
		struct usage_entry *e = *pp;
		if (e->state == USAGE_IDLE && now - e->at_ns >= (uint64_t)USAGE_FRESH_MS * 1000000u) {
			*pp = e->next;
			json_decref(e->answer);
			free(e);
			continue;
		}
		pp = &e->next;
	}
}

/* A usage request (id) for rec: answered from a fresh measurement of this
 * execution, joined to the one running or waiting, or a new one. */
static void usage_request(struct mgr *m, const struct mgr_rec *rec, uint32_t id)
{
	uint64_t now = spaced_mono_ns();
	usage_prune(now);
	struct usage_entry *e = usages;
	while (e && strcmp(e->sandbox, rec->r.id.sandbox) != 0)
		e = e->next;
	if (e && e->state == USAGE_IDLE && e->answer && e->generation == rec->r.id.generation && e->pid == rec->pid &&
	    now - e->at_ns < (uint64_t)USAGE_FRESH_MS * 1000000u) {
		m->n_usage_shared++;
		usage_send(m, id, rec, e->answer);
		return;
	}
	if (!e) {
		if (!(e = calloc(1, sizeof *e))) {
			send_fail(m, id, SPACED_ENOMEM, "out of memory");
			return;
		}
		snprintf(e->sandbox, sizeof e->sandbox, "%s", rec->r.id.sandbox);
		stream_owner(rec, e->owner);
		e->next = usages;
		usages = e;
	}
	if (e->nwaiters >= USAGE_WAITERS_MAX) {
		send_fail(m, id, SPACED_EBUSY, "too many usage requests for this sandbox at once: try again shortly");
		return;
	}
	e->waiters[e->nwaiters++] = id;
	if (e->state != USAGE_IDLE) {
		m->n_usage_shared++;
		return; /* it shares the measurement running or waiting */
	}
	bool busy = false;
	for (struct usage_entry *o = usages; o && !busy; o = o->next)
		busy = o->state == USAGE_RUNNING && strcmp(o->owner, e->owner) == 0;
	if (busy) {
		e->state = USAGE_QUEUED; /* after the owner's running one */
		e->queued_seq = ++usage_seq;
		return;
	}
	if (!usage_start(m, e, rec))
		usage_fail_all(m, e, SPACED_ENOMEM, "out of memory");
}

static void on_usage(struct mgr *m, uintptr_t ctx, int status, const char *msg, json_t *result, int fd)
{
	(void)msg;
	if (fd >= 0)
		close(fd);
	struct usage_entry *e = usages;
	while (e && !(e->state == USAGE_RUNNING && e->serial == (uint64_t)ctx))
		e = e->next;
	if (!e)
		return;
	json_object_del(result, "sandbox");
	/* the record may have changed meanwhile: answer for what is installed now, or not at all */
	const struct mgr_rec *rec = mgr_rec_find(m, e->sandbox);
	char owner[SPACED_NAME_MAX + 2];
	snprintf(owner, sizeof owner, "%s", e->owner);
	if (status < 0 || !rec || !json_is_object(result)) {
		usage_fail_all(m, e, status < 0 ? status : SPACED_ECLOSED,
		               status == SPACED_EPERM ? "usage is not measured for development executions"
		                                      : "the execution's launcher did not answer");
		e->at_ns = 0;
	} else {
		json_decref(e->answer);
		e->answer = json_incref(result);
		e->at_ns = spaced_mono_ns();
		for (int i = 0; i < e->nwaiters; i++)
			usage_send(m, e->waiters[i], rec, result);
		e->nwaiters = 0;
		e->state = USAGE_IDLE;
	}
	usage_next(m, owner);
}

/* ---- messages from node-api ---- */

/* One REQ: verify, compare, then forward. */
static int on_req(struct mgr *m, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	struct spaced_field_reader r;
	const char *tok;
	size_t toklen, plen;
	char sandbox[SPACED_NAME_MAX];
	uint64_t gtype, port;
	const uint8_t *payload;
	char protocol[SPACED_PROTOCOL_MAX];
	char request_id[NODE_REQUEST_ID_MAX], peer[64];
	struct spaced_cap cap;
	struct spaced_decision d;
	enum spaced_cap_class cls;

	spaced_field_reader_init(&r, p, n);
	spaced_field_get_str(&r, &tok, &toklen);
	spaced_field_get_strbuf(&r, sandbox, sizeof sandbox);
	spaced_field_get_u64(&r, &gtype);
	spaced_field_get_bytes(&r, &payload, &plen);
	spaced_field_get_u64(&r, &port);
	spaced_field_get_strbuf(&r, protocol, sizeof protocol);
	spaced_field_get_strbuf(&r, request_id, sizeof request_id);
	spaced_field_get_strbuf(&r, peer, sizeof peer);
	if (spaced_field_end(&r) < 0 || gtype > 0xffff || port > 65535 || toklen > NODE_TOKEN_MAX)
		return SPACED_EPROTO;
	m->n_req++;
	uint32_t purpose = purpose_of((uint16_t)gtype, &cls);
	if (purpose == 0)
		return SPACED_EPROTO;

	/* R1: verify, then compare with the installed record — nothing is forwarded before. */
	uint64_t t0 = spaced_mono_ns();
	struct spaced_request req = {.purpose = purpose, .port = (uint16_t)port,
	                             .protocol = cls == SPACED_CLASS_SERVICEPORT ? protocol : NULL};
	const struct mgr_rec *rec = mgr_rec_find(m, sandbox);
	int e = spaced_cap_verify(m->kr, m->vc, tok, toklen, cls, spaced_now(), &cap);
	if (e < 0)
		d = spaced_decision_from_error(e);
	else
		d = spaced_compare(&cap, &req, rec ? &rec->r : NULL, SPACED_COMPARE_STRICT);
	m->vc_ns += spaced_mono_ns() - t0;
	/* An execution paused on purpose (a pause, or its idle timeout) is
	 * frozen. In the first SPACED_PAUSE_HOLD_MS of a pause a request waits
	 * for the resume, as the frozen guest makes it (a pause for a snapshot
	 * or a move is that short); past them it would wait however long the
	 * pause lasts, and the caller resolves its route again instead (V1):
	 * the control plane resumes an auto-resume sandbox there, or answers
	 * that it is paused. Its usage is read without the guest. */
	if (d.verdict == SPACED_ALLOW && gate_fenced(m))
		d = (struct spaced_decision){.verdict = SPACED_REFRESH_ROUTE, .reason = SPACED_REASON_FENCED};
	if (d.verdict == SPACED_ALLOW && gtype != NODE_USAGE && strcmp(rec->state, MGR_ST_PAUSED) == 0 &&
	    (rec->paused_mono == 0 || spaced_mono_ns() - rec->paused_mono > SPACED_PAUSE_HOLD_MS * 1000000ull))
		d = (struct spaced_decision){.verdict = SPACED_REFRESH_ROUTE, .reason = SPACED_REASON_PAUSED};

	if (d.verdict != SPACED_ALLOW) {
		m->n_refuse++;
		if (d.verdict <= SPACED_DENY && d.reason < SPACED_REASON__COUNT)
			m->n_refused_by[d.verdict][d.reason]++;
		/* the lines about a refusal; a flood's past the caller's rate
		 * are counted, by reason, and written as its summary */
		char why[64];
		snprintf(why, sizeof why, "%s%s", d.verdict == SPACED_DENY ? "" : "refresh-route:",
		         spaced_reason_name(d.reason));
		if (gate_audit_refusal_allowed(peer, why)) {
			if (d.verdict == SPACED_DENY) {
				/* every DENY: the caller, the reason and the identity (when verified) */
				json_t *a = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "event", "deny", "reason",
				                      spaced_reason_name(d.reason), "sandbox", sandbox, "purpose",
				                      spaced_purpose_name(purpose), "caller", peer, "request_id", request_id);
				if (e == 0) {
					char text[SPACED_IDENTITY_TEXT_MAX];
					spaced_identity_encode(&cap.id, text, sizeof text);
					json_object_set_new(a, "identity", json_string(text));
					json_object_set_new(a, "jti", json_string(cap.jti));
				}
				gate_audit(m, a);
			}
			gate_log("level=info event=refused request_id=%s caller=%s sandbox=%s outcome=%s reason=%s", request_id,
			         peer, sandbox, d.verdict == SPACED_DENY ? "DENY" : "REFRESH_ROUTE", spaced_reason_name(d.reason));
		}
		send_refuse(m, NODE_MSG_REFUSE, h->id, d, sandbox);
		return 0;
	}
	m->n_allow++;
	if (gtype == NODE_USAGE) {
		usage_request(m, rec, h->id);
		return 0;
	}
	char owner[SPACED_NAME_MAX + 2];
	stream_owner(rec, owner);
	const char *full = stream_refusal(m, owner);
	if (full) {
		send_fail(m, h->id, SPACED_EBUSY, full);
		return 0;
	}
	bool raw = gtype == NODE_PORT_OPEN;
	if (raw && m->cfg->launch_bin && m->cfg->host_bin) {
		/* an execution in its own network namespace: its ports are reached
		 * through spaced-netgtw, never through this host's loopback */
		send_fail(m, h->id, SPACED_EPERM, "ServicePort is served by the sandbox's gateway");
		return 0;
	}
	struct gstream *s = calloc(1, sizeof *s);
	if (!s) {
		send_fail(m, h->id, SPACED_ENOMEM, "out of memory");
		return 0;
	}
	s->m = m;
	s->id = h->id;
	s->raw = raw;
	s->gtype = (uint16_t)gtype;
	s->epoch = rec->r.epoch;
	s->cap = cap;
	memcpy(s->owner, owner, sizeof s->owner);
	s->state = GS_CONNECTING;
	snprintf(s->protocol, sizeof s->protocol, "%s", protocol);
	s->req = req;
	s->req.protocol = raw ? s->protocol : NULL;
	spaced_identity_encode(&rec->r.id, s->ident, sizeof s->ident);
	spaced_buf_init(&s->rbuf, SPACED_FRAME_MAX + SPACED_FRAME_HDR_LEN);
	spaced_buf_init(&s->wq, STREAM_WQ_MAX);
	if (!raw) {
		uint8_t fh[SPACED_FRAME_HDR_LEN];
		struct spaced_frame_hdr hh = {.len = (uint32_t)plen, .type = (uint16_t)gtype, .flags = 0, .id = 1};
		spaced_frame_hdr_encode(fh, &hh);
		s->wq_in = sizeof fh + plen;
		if (spaced_buf_append(&s->wq, fh, sizeof fh) < 0 || (plen && spaced_buf_append(&s->wq, payload, plen) < 0)) {
			spaced_buf_free(&s->rbuf);
			spaced_buf_free(&s->wq);
			free(s);
			send_fail(m, h->id, SPACED_ENOMEM, "out of memory");
			return 0;
		}
	}
	s->next = m->streams;
	m->streams = s;
	m->nstreams++;
	struct gconn *kept = raw ? NULL : pool_take(m, sandbox, rec->r.epoch);
	if (kept) {
		m->n_conn_kept++;
		stream_open(s, kept);
		return 0;
	}
	if (gate_ctl_recovering(m, sandbox)) {
		/* after a restart of the gate, its bridge does not know this
		 * executor yet: the connection is asked for once it does */
		s->awaiting_recovery = true;
		return 0;
	}
	stream_connect(m, s, rec);
	return 0;
}

/* Asks the executor for a connection to the execution of rec for s. */
static void stream_connect(struct mgr *m, struct gstream *s, const struct mgr_rec *rec)
{
	/* a new connection: the executor makes it (the bridge checks it, B1–B3) */
	json_t *args;
	if (s->raw) {
		args = json_pack("{s:i}", "port", (int)s->req.port);
	} else {
		char target[256];
		if (mgr_exec_target(m->cfg, rec, target, sizeof target) < 0) {
			send_fail(m, s->id, SPACED_ECLOSED, "execution unreachable");
			stream_kill(s);
			return;
		}
		args = json_pack("{s:s}", "target", target);
	}
	s->job = gate_job(m, "connect", args, on_connected, s->id);
	if (!s->job) {
		send_fail(m, s->id, SPACED_ENOMEM, "out of memory");
		stream_kill(s);
	}
}

void gate_streams_recovered(struct mgr *m, const char *sandbox)
{
	const struct mgr_rec *rec = mgr_rec_find(m, sandbox);
	for (struct gstream *s = m->streams; s; s = s->next) {
		if (s->dead || !s->awaiting_recovery || strcmp(s->cap.id.sandbox, sandbox) != 0)
			continue;
		s->awaiting_recovery = false;
		if (!rec || !rec->r.active || rec->r.epoch != s->epoch) {
			send_fail(m, s->id, SPACED_ECLOSED, "execution unreachable");
			stream_kill(s);
			continue;
		}
		stream_connect(m, s, rec);
	}
	streams_reap(m);
}

static int on_in(struct mgr *m, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	struct spaced_field_reader r;
	uint64_t in;
	const uint8_t *data;
	size_t dlen;
	spaced_field_reader_init(&r, p, n);
	spaced_field_get_u64(&r, &in);
	spaced_field_get_bytes(&r, &data, &dlen);
	if (spaced_field_end(&r) < 0 || in > 0xffff || dlen > SPACED_FRAME_CHUNK)
		return SPACED_EPROTO;
	struct gstream *s = stream_find(m, h->id);
	if (!s)
		return 0; /* already ended or cancelled: input stops here */
	if (!input_allowed(s, (uint16_t)in))
		return SPACED_EPROTO;
	if (in == SPACED_GUEST_IN_CANCEL)
		s->cancelled = true;
	int e;
	size_t before = s->wq.len;
	if (s->raw) {
		e = dlen ? spaced_buf_append(&s->wq, data, dlen) : 0;
		if (e == 0 && (h->flags & SPACED_FRAME_F_END))
			s->shut_pending = true;
	} else {
		uint8_t hdr[SPACED_FRAME_HDR_LEN];
		struct spaced_frame_hdr fh = {.len = (uint32_t)dlen, .type = (uint16_t)in,
		                              .flags = h->flags & SPACED_FRAME_F_END, .id = 1};
		spaced_frame_hdr_encode(hdr, &fh);
		e = spaced_buf_append(&s->wq, hdr, sizeof hdr);
		if (e == 0 && dlen)
			e = spaced_buf_append(&s->wq, data, dlen);
	}
	if (e < 0) {
		/* node-api keeps to its window: a queue this full is a protocol breach */
		gate_log("level=error event=input-over-window stream=%u", s->id);
		return SPACED_EPROTO;
	}
	s->wq_in += s->wq.len - before;
	note_input(s, dlen);
	if (s->state == GS_OPEN && stream_flush(s) < 0) {
		send_fail(m, s->id, SPACED_ECLOSED, "execution connection lost");
		stream_kill(s);
		return 0;
	}
	if (s->state == GS_OPEN)
		send_credit(s);
	stream_update_poll(s);
	return 0;
}

static int on_close(struct mgr *m, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	(void)p;
	(void)n;
	struct gstream *s = stream_find(m, h->id);
	if (s)
		stream_kill(s);
	return 0;
}

static int on_credit(struct mgr *m, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	struct spaced_field_reader r;
	uint64_t bytes;
	spaced_field_reader_init(&r, p, n);
	spaced_field_get_u64(&r, &bytes);
	if (spaced_field_end(&r) < 0)
		return SPACED_EPROTO;
	struct gstream *s = stream_find(m, h->id);
	if (!s)
		return 0;
	out_acked(s, bytes);
	stream_update_poll(s);
	return 0;
}

/* The handlers of what the gate takes from node-api (links.c has the table). */
static int api_dispatch(struct mgr *m, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	const struct gstream *s = stream_find(m, h->id);
	unsigned state = !s ? LINK_ID_FREE : s->state == GS_OPEN ? LINK_ID_OPEN : LINK_ID_OPENING;
	switch (link_check(LINK_GATE, h, state)) {
	case LINK_BAD:
		fprintf(stderr, "gate: %s for request %u in state %#x breaks the link table\n", link_msg_name(h->type),
		        h->id, state);
		return SPACED_EPROTO;
	case LINK_STALE:
		return 0;
	case LINK_HANDLE:
		break;
	}
	switch (h->type) {
	case NODE_MSG_REQ:
		return on_req(m, h, p, n);
	case NODE_MSG_IN:
		return on_in(m, h, p, n);
	case NODE_MSG_CLOSE:
		return on_close(m, h, p, n);
	case NODE_MSG_CREDIT:
		return on_credit(m, h, p, n);
	case NODE_MSG_METRICS:
		return gate_metrics_request(m, h->id) < 0 ? SPACED_ENOMEM : 0;
	}
	return SPACED_EPROTO;
}

static void api_readable(struct mgr *m)
{
	uint8_t tmp[65536];
	ssize_t r = recv(m->api_fd, tmp, sizeof tmp, MSG_DONTWAIT);
	if (r < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (r <= 0 || spaced_buf_append(&m->api_rbuf, tmp, (size_t)r) < 0) {
		gate_quit(m, "node-api closed its end");
		return;
	}
	size_t off = 0;
	while (!m->quit) {
		struct spaced_frame_hdr h;
		const uint8_t *pl;
		size_t used;
		int e = spaced_frame_parse(m->api_rbuf.data + off, m->api_rbuf.len - off, NODE_MSG_MAX, &h, &pl, &used);
		if (e == 0 && used == 0)
			break;
		if (e == 0)
			e = api_dispatch(m, &h, pl, h.len);
		if (e < 0) {
			gate_log("level=error event=protocol-error from=node-api reason=\"%s\"", spaced_strerror(e));
			gate_quit(m, "protocol error from node-api");
			return;
		}
		off += used;
	}
	if (off > 0) {
		memmove(m->api_rbuf.data, m->api_rbuf.data + off, m->api_rbuf.len - off);
		m->api_rbuf.len -= off;
	}
}

static void on_api(uv_poll_t *h, int status, int events)
{
	struct mgr *m = h->data;
	if (status < 0) {
		gate_quit(m, "node-api's link failed");
		return;
	}
	if (events & UV_WRITABLE)
		api_flush(m);
	if (events & (UV_READABLE | UV_DISCONNECT))
		api_readable(m);
	if (m->quit)
		return;
	api_update_poll(m);
	/* node-api caught up: the executions it held back are read again */
	api_caught_up(m);
	streams_reap(m);
}

static void api_update_poll(struct mgr *m)
{
	if (!m->api_poll_on || m->quit)
		return;
	/* frames due this turn go in its check phase: waiting for room is
	 * for what a flush left (the poll is not changed twice a request) */
	bool pending = m->api_out_off < m->api_out.len || bulk_spliced(m) > 0;
	int ev = UV_READABLE | (!m->api_flush_due && pending ? UV_WRITABLE : 0);
	if (ev != m->api_events) {
		m->api_events = ev;
		uv_poll_start(&m->api_poll, ev, on_api);
	}
}

/* ---- installs, ticks, status ---- */

void gate_streams_on_install(struct mgr *m, const struct mgr_rec *rec, bool handoff)
{
	if (handoff)
		return; /* S3: streams and unexpired capabilities stay */
	pool_flush(m, rec->r.id.sandbox, rec->r.epoch);
	for (struct gstream *s = m->streams; s; s = s->next) {
		if (s->dead || strcmp(s->cap.id.sandbox, rec->r.id.sandbox) != 0 || s->epoch >= rec->r.epoch)
			continue;
		if (s->raw && rec->r.active) {
			struct spaced_decision keep = spaced_compare(&s->cap, &s->req, &rec->r, SPACED_COMPARE_ESTABLISHED_STREAM);
			if (keep.verdict == SPACED_ALLOW) {
				s->epoch = rec->r.epoch; /* S4: activation-only change */
				spaced_identity_encode(&rec->r.id, s->ident, sizeof s->ident);
				continue;
			}
		}
		struct spaced_decision d = spaced_compare(&s->cap, &s->req, &rec->r, SPACED_COMPARE_STRICT);
		if (d.verdict == SPACED_ALLOW) {
			d.verdict = SPACED_REFRESH_ROUTE;
			d.reason = SPACED_REASON_OTHER_ACTIVATION;
		}
		/* S1: the lease ends — the execution's connection goes first, then node-api is told. */
		uint32_t id = s->id;
		stream_kill(s);
		m->n_cancel++;
		if (d.verdict <= SPACED_DENY && d.reason < SPACED_REASON__COUNT)
			m->n_cancelled_by[d.verdict][d.reason]++;
		send_refuse(m, NODE_MSG_CANCEL, id, d, rec->r.id.sandbox);
	}
	streams_reap(m);
}

void gate_streams_cancel_all(struct mgr *m, enum spaced_reason why)
{
	for (struct gstream *s = m->streams; s; s = s->next) {
		if (s->dead)
			continue;
		struct spaced_decision d = {.verdict = SPACED_REFRESH_ROUTE, .reason = why};
		uint32_t id = s->id;
		char sandbox[SPACED_NAME_MAX];
		snprintf(sandbox, sizeof sandbox, "%s", s->cap.id.sandbox);
		stream_kill(s);
		m->n_cancel++;
		m->n_cancelled_by[d.verdict][d.reason]++;
		send_refuse(m, NODE_MSG_CANCEL, id, d, sandbox);
	}
	streams_reap(m);
}

void gate_streams_tick(struct mgr *m)
{
	uint64_t now = spaced_mono_ns(), limit = (uint64_t)m->cfg->stall_timeout_ms * 1000000u;
	for (struct gstream *s = m->streams; s; s = s->next) {
		if (s->dead || s->state != GS_OPEN)
			continue;
		/* stalled: output waiting that the client took none of since the
		 * last tick, or a window of input the execution took none of (a
		 * client that reads slowly but steadily keeps its stream, however
		 * long it takes; the window's size, which the budget of all windows
		 * changes, does not matter). Output under node-api's credit batch
		 * may wait uncredited for as long as a command is quiet (a STARTED,
		 * the start of a JSON answer): that is no stalled client. */
		bool client_full = s->out_unacked >= NODE_CREDIT_BATCH && s->out_credited == s->tick_credited;
		bool exec_full = s->wq.len - s->wq_off >= NODE_WINDOW_SMALL && s->wq_out == s->tick_wq_out;
		s->tick_credited = s->out_credited;
		s->tick_wq_out = s->wq_out;
		if (!client_full && !exec_full) {
			s->stalled_since = 0;
			continue;
		}
		if (s->stalled_since == 0) {
			s->stalled_since = now;
			continue;
		}
		if (limit == 0 || now - s->stalled_since < limit)
			continue;
		gate_log("level=warn event=stream-cut sandbox=%s reason=\"%s\"", s->cap.id.sandbox,
		         client_full ? "the client does not read" : "the execution does not read");
		m->n_cut++;
		send_fail(m, s->id, SPACED_ETIMEDOUT,
		          client_full ? "the client did not read its answer in time" : "the execution did not read its input in time");
		stream_kill(s);
	}
	streams_reap(m);
}

json_t *gate_streams_status(struct mgr *m)
{
	size_t open = 0, connecting = 0;
	for (struct gstream *s = m->streams; s; s = s->next) {
		if (s->dead)
			continue;
		open += s->state == GS_OPEN;
		connecting += s->state == GS_CONNECTING;
	}
	return json_pack("{s:I,s:I,s:I,s:I}", "streams", (json_int_t)open, "connecting", (json_int_t)connecting,
	                 "idle_connections", (json_int_t)m->nidle, "api_backlog",
	                 (json_int_t)(m->api_out.len - m->api_out_off + bulk_spliced(m)));
}

int gate_streams_start(struct mgr *m, int api_fd)
{
	m->api_fd = api_fd;
	spaced_buf_init(&m->api_rbuf, 2 * NODE_MSG_MAX + 2 * SPACED_FRAME_HDR_LEN + 65536);
	spaced_buf_init(&m->api_out, GATE_API_OUT_MAX);
	m->bulk = calloc(1, sizeof *m->bulk); /* none: every frame is copied */
	int sz = 4 << 20;
	setsockopt(api_fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
	fcntl(api_fd, F_SETFL, fcntl(api_fd, F_GETFL) | O_NONBLOCK);
	if (uv_poll_init(m->loop, &m->api_poll, api_fd) < 0)
		return SPACED_ESYS;
	m->api_poll.data = m;
	m->api_poll_on = true;
	m->api_events = 0;
	uv_check_init(m->loop, &m->api_check);
	uv_idle_init(m->loop, &m->api_idle);
	m->api_check.data = m->api_idle.data = m;
	uv_check_start(&m->api_check, api_flush_due);
	api_update_poll(m);
	return 0;
}

void gate_streams_stop(struct mgr *m)
{
	for (struct gstream *s = m->streams; s; s = s->next)
		stream_kill(s);
	pool_flush(m, NULL, 0);
	if (m->api_poll_on) {
		uv_poll_stop(&m->api_poll);
		uv_close((uv_handle_t *)&m->api_poll, NULL);
		uv_check_stop(&m->api_check);
		uv_close((uv_handle_t *)&m->api_check, NULL);
		uv_idle_stop(&m->api_idle);
		uv_close((uv_handle_t *)&m->api_idle, NULL);
		m->api_poll_on = false;
	}
	if (m->api_fd >= 0)
		close(m->api_fd);
	m->api_fd = -1;
}

/* Frees what is left once the loop has run the close callbacks. */
void gate_streams_free(struct mgr *m);
void gate_streams_free(struct mgr *m)
{
	streams_reap(m);
	spaced_buf_free(&m->api_rbuf);
	spaced_buf_free(&m->api_out);
	struct gate_bulk *b = m->bulk;
	while (b && b->len > 0) {
		pipe_put(m, b->marks[b->head].p, false);
		b->head = (b->head + 1) % GATE_MARKS_MAX;
		b->len--;
	}
	while (b && b->kept) {
		struct gpipe *p = b->kept;
		b->kept = p->next;
		b->nkept--;
		pipe_put(m, p, false);
	}
	free(b);
	m->bulk = NULL;
}
