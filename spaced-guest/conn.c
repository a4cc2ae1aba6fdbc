/* conn.c — connections of spaced-guest: frame input, the dispatch table,
 * queued output, streams and RESULT frames. A malformed frame from a peer
 * drops that connection only. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "spaced_error.h"
#include "guest.h"

#define OUTQ_HARD_MAX (64u << 20) /* a peer that never reads is dropped */

int conn_new(int fd)
{
	if (G.nconns >= GUEST_MAX_CONNS) {
		close(fd);
		return SPACED_EBUSY;
	}
	struct conn *c = calloc(1, sizeof *c);
	if (c == NULL) {
		close(fd);
		return SPACED_ENOMEM;
	}
	c->fd = fd;
	c->next = G.conns;
	G.conns = c;
	G.nconns++;
	guest_log("conn open fd=%d", fd);
	return SPACED_OK;
}

void conn_kill(struct conn *c, const char *why)
{
	if (c->dead)
		return;
	if (strcmp(why, "peer closed") == 0 || strcmp(why, "peer gone") == 0)
		guest_log("conn close fd=%d", c->fd);
	else
		guest_warn("conn drop fd=%d reason=\"%s\"", c->fd, why);
	c->dead = true;
	for (struct stream *s = c->streams; s != NULL; s = s->next)
		if (!s->dead)
			stream_cleanup(s, true);
}

struct outbuf *conn_frame_alloc(size_t n)
{
	if (n > SPACED_FRAME_MAX)
		return NULL;
	struct outbuf *o = malloc(sizeof *o + SPACED_FRAME_HDR_LEN + n);
	if (o != NULL) {
		o->len = SPACED_FRAME_HDR_LEN + n;
		o->off = 0;
		o->next = NULL;
	}
	return o;
}

int conn_frame_commit(struct conn *c, struct outbuf *o, uint16_t type, uint16_t flags, uint32_t id,
                      size_t n)
{
	if (c->dead) {
		free(o);
		return SPACED_ECLOSED;
	}
	if (c->oq_bytes > OUTQ_HARD_MAX) {
		free(o);
		conn_kill(c, "peer does not read its answers");
		return SPACED_ECLOSED;
	}
	struct spaced_frame_hdr h = {.len = (uint32_t)n, .type = type, .flags = flags, .id = id};
	spaced_frame_hdr_encode(o->data, &h);
	o->len = SPACED_FRAME_HDR_LEN + n;
	o->off = 0;
	o->next = NULL;
	if (c->oq_tail)
		c->oq_tail->next = o;
	else
		c->oq_head = o;
	c->oq_tail = o;
	c->oq_bytes += o->len;
	return SPACED_OK;
}

int conn_queue_frame(struct conn *c, uint16_t type, uint16_t flags, uint32_t id,
                     const void *p, size_t n)
{
	if (c->dead)
		return SPACED_ECLOSED;
	struct outbuf *o = conn_frame_alloc(n);
	if (o == NULL) {
		conn_kill(c, n > SPACED_FRAME_MAX ? "answer too large" : "out of memory");
		return SPACED_ENOMEM;
	}
	if (n > 0)
		memcpy(o->data + SPACED_FRAME_HDR_LEN, p, n);
	return conn_frame_commit(c, o, type, flags, id, n);
}

/* Reads exactly n bytes from fd (at *off when off is not NULL) into p;
 * false when fewer are there. */
static bool read_exact(int fd, off_t *off, uint8_t *p, size_t n)
{
	while (n > 0) {
		ssize_t k = off != NULL ? pread(fd, p, n, *off) : read(fd, p, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return false;
		if (off != NULL)
			*off += k;
		p += k;
		n -= (size_t)k;
	}
	return true;
}

ssize_t conn_send_from_fd(struct conn *c, uint16_t type, uint32_t id, int fd, off_t *off, size_t n)
{
	if (c->dead || c->oq_head != NULL || n == 0 || n > SPACED_FRAME_MAX)
		return 0;
	uint8_t hdr[SPACED_FRAME_HDR_LEN];
	spaced_frame_hdr_encode(hdr, &(struct spaced_frame_hdr){.len = (uint32_t)n, .type = type, .id = id});
	ssize_t h;
	do
		h = send(c->fd, hdr, sizeof hdr, MSG_NOSIGNAL | MSG_DONTWAIT | MSG_MORE);
	while (h < 0 && errno == EINTR);
	if (h < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
		c->wblocked = true; /* fd keeps it until the socket has room */
		return 0;
	}
	if (h < 0) {
		conn_kill(c, "write failed");
		return -1;
	}
	/* the frame has begun: its payload goes next, whatever the socket takes
	 * straight from fd (the pipe's pages, or the file's), the rest copied */
	size_t sent = 0;
	while (h == (ssize_t)sizeof hdr && sent < n) {
		ssize_t k = off != NULL ? sendfile(c->fd, fd, off, n - sent)
		                        : splice(fd, NULL, c->fd, NULL, n - sent, SPLICE_F_NONBLOCK | SPLICE_F_MOVE);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break; /* full, or not supported here: copied below */
		sent += (size_t)k;
	}
	size_t hrest = sizeof hdr - (size_t)h, rest = n - sent;
	if (hrest + rest == 0)
		return (ssize_t)n;
	struct outbuf *o = malloc(sizeof *o + hrest + rest);
	if (o == NULL || !read_exact(fd, off, o->data + hrest, rest)) {
		free(o);
		conn_kill(c, o == NULL ? "out of memory" : "output shrank while it was sent");
		return -1;
	}
	memcpy(o->data, hdr + h, hrest);
	o->len = hrest + rest;
	o->off = 0;
	o->next = NULL;
	c->oq_head = c->oq_tail = o;
	c->oq_bytes = o->len;
	return (ssize_t)n;
}

void conn_on_writable(struct conn *c)
{
	c->wblocked = false;
	while (c->oq_head != NULL && !c->dead) {
		struct iovec iov[16];
		int n = 0;
		for (struct outbuf *o = c->oq_head; o != NULL && n < 16; o = o->next, n++) {
			iov[n].iov_base = o->data + o->off;
			iov[n].iov_len = o->len - o->off;
		}
		struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
		ssize_t k = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			conn_kill(c, "write failed");
			return;
		}
		size_t adv = (size_t)k;
		c->oq_bytes -= adv;
		while (adv > 0) {
			struct outbuf *o = c->oq_head;
			size_t left = o->len - o->off;
			if (adv < left) {
				o->off += adv;
				break;
			}
			adv -= left;
			c->oq_head = o->next;
			if (c->oq_head == NULL)
				c->oq_tail = NULL;
			free(o);
		}
	}
}

struct stream *stream_new(struct conn *c, uint32_t id, enum stream_kind kind)
{
	struct stream *s = calloc(1, sizeof *s);
	if (s == NULL)
		return NULL;
	s->conn = c;
	s->id = id;
	s->kind = kind;
	s->fd = -1;
	s->dirfd = -1;
	s->next = c->streams;
	c->streams = s;
	c->nstreams++;
	return s;
}

static struct stream *stream_find(struct conn *c, uint32_t id)
{
	for (struct stream *s = c->streams; s != NULL; s = s->next)
		if (s->id == id && !s->dead)
			return s;
	return NULL;
}

void stream_cleanup(struct stream *s, bool conn_gone)
{
	if (s->dead)
		return;
	s->dead = true;
	switch (s->kind) {
	case ST_READ:
		break;
	case ST_WRITE:
		fs_write_abort(s);
		break;
	case ST_EXEC:
	case ST_ATTACH:
	case ST_TERM:
		proc_detach_stream(s, conn_gone);
		break;
	case ST_WATCH:
		watch_free(s->watch);
		s->watch = NULL;
		break;
	}
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
}

static int build_result(struct spaced_buf *b, int status, const char *msg,
                        const struct spaced_buf *extras)
{
	int e = spaced_field_put_i64(b, status);
	if (e == 0)
		e = spaced_field_put_str(b, msg ? msg : (status ? spaced_strerror(status) : ""));
	if (e == 0)
		e = spaced_field_put_str(b, G.have_identity ? G.identity : "");
	if (e == 0 && extras != NULL && extras->len > 0)
		e = spaced_buf_append(b, extras->data, extras->len);
	return e;
}

void reply_result(struct conn *c, uint32_t id, int status, const char *msg,
                  const struct spaced_buf *extras)
{
	struct spaced_buf b;
	spaced_buf_init(&b, SPACED_FRAME_MAX);
	if (build_result(&b, status, msg, extras) < 0) {
		spaced_buf_free(&b);
		conn_kill(c, "cannot build result");
		return;
	}
	(void)conn_queue_frame(c, SPACED_GUEST_OUT_RESULT, SPACED_FRAME_F_END, id, b.data, b.len);
	spaced_buf_free(&b);
}

void stream_finish(struct stream *s, int status, const char *msg, const struct spaced_buf *extras)
{
	if (s->dead)
		return;
	stream_cleanup(s, false);
	reply_result(s->conn, s->id, status, msg, extras);
}

int errno_to_spaced(int e)
{
	switch (e) {
	case ENOENT:
		return SPACED_ENOENT;
	case EEXIST:
	case ENOTEMPTY:
		return SPACED_EEXIST;
	case EACCES:
	case EPERM:
	case EXDEV:
	case ELOOP:
	case EROFS:
		return SPACED_EPERM;
	case ENOMEM:
		return SPACED_ENOMEM;
	case ENAMETOOLONG:
	case EFBIG:
		return SPACED_ETOOBIG;
	case EINVAL:
	case ENOTDIR:
	case EISDIR:
		return SPACED_EINVAL;
	case EAGAIN:
	case EBUSY:
		return SPACED_EBUSY;
	default:
		return SPACED_EIO;
	}
}

/* ---- the dispatch table ---- */

/* Common checks for a request that opens a stream id. Returns 1 to go on, 0
 * when already answered, or SPACED_EPROTO. */
static int request_open(struct conn *c, const struct spaced_frame_hdr *h)
{
	if (h->id == 0 || stream_find(c, h->id) != NULL)
		return SPACED_EPROTO;
	if (h->flags != 0)
		return SPACED_EPROTO;
	if (!G.have_identity) {
		reply_result(c, h->id, SPACED_EIDENTITY, "guest has no execution identity yet", NULL);
		return 0;
	}
	if (c->nstreams >= GUEST_MAX_STREAMS) {
		reply_result(c, h->id, SPACED_EBUSY, "too many open streams", NULL);
		return 0;
	}
	return 1;
}

#define OPEN_OR_RETURN(c, h)                     \
	do {                                     \
		int ro_ = request_open((c), (h)); \
		if (ro_ <= 0)                    \
			return ro_;              \
	} while (0)

static int h_hello(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	struct conn *c = ctx;
	if (n != 0)
		return SPACED_EPROTO;
	OPEN_OR_RETURN(c, h);
	reply_result(c, h->id, 0, "", NULL);
	return 0;
}

typedef int (*fs_fn)(struct conn *c, uint32_t id, struct spaced_field_reader *r);

static int fs_call(fs_fn fn, void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p,
                   size_t n)
{
	struct conn *c = ctx;
	int e = spaced_field_validate(p, n);
	if (e < 0)
		return SPACED_EPROTO;
	OPEN_OR_RETURN(c, h);
	struct spaced_field_reader r;
	spaced_field_reader_init(&r, p, n);
	return fn(c, h->id, &r);
}

static int h_read(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	return fs_call(fs_read_start, ctx, h, p, n);
}

static int h_write(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	return fs_call(fs_write_start, ctx, h, p, n);
}

static int h_list(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	return fs_call(fs_list, ctx, h, p, n);
}

static int h_stat(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	return fs_call(fs_stat, ctx, h, p, n);
}

static int h_mkdir(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	return fs_call(fs_mkdir, ctx, h, p, n);
}

static int h_move(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	return fs_call(fs_move, ctx, h, p, n);
}

static int h_remove(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	return fs_call(fs_remove, ctx, h, p, n);
}

static int h_watch(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	return fs_call(watch_start, ctx, h, p, n);
}

static int exec_call(struct conn *c, uint32_t id, struct spaced_field_reader *r)
{
	return proc_exec(c, id, r, false);
}

static int term_call(struct conn *c, uint32_t id, struct spaced_field_reader *r)
{
	return proc_exec(c, id, r, true);
}

static int h_exec(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	return fs_call(exec_call, ctx, h, p, n);
}

static int h_term(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	return fs_call(term_call, ctx, h, p, n);
}

static int h_proc_list(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	struct conn *c = ctx;
	if (n != 0)
		return SPACED_EPROTO;
	OPEN_OR_RETURN(c, h);
	proc_list(c, h->id);
	return 0;
}

static int proc_body(const uint8_t *p, size_t n, uint64_t *procid, int64_t *sig)
{
	struct spaced_field_reader r;
	spaced_field_reader_init(&r, p, n);
	(void)spaced_field_get_u64(&r, procid);
	if (sig != NULL)
		(void)spaced_field_get_i64(&r, sig);
	return spaced_field_end(&r) < 0 ? SPACED_EPROTO : 0;
}

static int h_proc_attach(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	struct conn *c = ctx;
	uint64_t procid = 0;
	if (proc_body(p, n, &procid, NULL) < 0)
		return SPACED_EPROTO;
	OPEN_OR_RETURN(c, h);
	proc_attach(c, h->id, procid);
	return 0;
}

static int h_proc_signal(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	struct conn *c = ctx;
	uint64_t procid = 0;
	int64_t sig = 0;
	if (proc_body(p, n, &procid, &sig) < 0)
		return SPACED_EPROTO;
	OPEN_OR_RETURN(c, h);
	proc_signal(c, h->id, procid, sig);
	return 0;
}

static int h_proc_kill(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	struct conn *c = ctx;
	uint64_t procid = 0;
	if (proc_body(p, n, &procid, NULL) < 0)
		return SPACED_EPROTO;
	OPEN_OR_RETURN(c, h);
	proc_kill(c, h->id, procid);
	return 0;
}

/* Stream input: an id that is no longer open is ignored (the stream may have
 * ended while the input was in flight); input of the wrong kind is an error. */
static int h_in_data(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	struct stream *s = stream_find(ctx, h->id);
	if (s == NULL)
		return 0;
	if (s->kind != ST_WRITE)
		return SPACED_EPROTO;
	fs_write_data(s, p, n, (h->flags & SPACED_FRAME_F_END) != 0);
	return 0;
}

static int h_in_stdin(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	struct stream *s = stream_find(ctx, h->id);
	if (s == NULL)
		return 0;
	if (s->kind != ST_EXEC && s->kind != ST_TERM)
		return SPACED_EPROTO;
	proc_stdin(s, p, n, (h->flags & SPACED_FRAME_F_END) != 0);
	return 0;
}

static int h_in_resize(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	struct spaced_field_reader r;
	uint64_t rows = 0, cols = 0;
	spaced_field_reader_init(&r, p, n);
	(void)spaced_field_get_u64(&r, &rows);
	(void)spaced_field_get_u64(&r, &cols);
	if (spaced_field_end(&r) < 0 || rows == 0 || cols == 0 || rows > 65535 || cols > 65535)
		return SPACED_EPROTO;
	struct stream *s = stream_find(ctx, h->id);
	if (s == NULL)
		return 0;
	if (s->kind != ST_TERM)
		return SPACED_EPROTO;
	proc_resize(s, rows, cols);
	return 0;
}

static int h_in_cancel(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	if (n != 0)
		return SPACED_EPROTO;
	struct stream *s = stream_find(ctx, h->id);
	if (s == NULL)
		return 0;
	switch (s->kind) {
	case ST_READ:
	case ST_WRITE:
		stream_finish(s, SPACED_ECLOSED, "cancelled", NULL);
		break;
	case ST_WATCH:
	case ST_ATTACH:
		stream_finish(s, 0, "cancelled", NULL);
		break;
	case ST_EXEC:
	case ST_TERM:
		if (s->proc != NULL && !s->proc->exited)
			kill(-s->proc->pid, SIGKILL);
		break;
	}
	return 0;
}

/* SIGNAL: exactly one i64, a signal number 1-64, for a foreground EXEC: sent
 * to the command's process group. A malformed body, a number out of range or
 * a stream of another kind is a protocol error. */
static int h_in_signal(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	struct spaced_field_reader r;
	int64_t sig = 0;
	spaced_field_reader_init(&r, p, n);
	(void)spaced_field_get_i64(&r, &sig);
	if (spaced_field_end(&r) < 0 || sig < 1 || sig > 64)
		return SPACED_EPROTO;
	struct stream *s = stream_find(ctx, h->id);
	if (s == NULL)
		return 0;
	if (s->kind != ST_EXEC)
		return SPACED_EPROTO;
	proc_signal_stream(s, (int)sig);
	return 0;
}

static const struct spaced_frame_handler dispatch[] = {
	{SPACED_GUEST_HELLO, h_hello},
	{SPACED_GUEST_FS_READ, h_read},
	{SPACED_GUEST_FS_WRITE, h_write},
	{SPACED_GUEST_FS_LIST, h_list},
	{SPACED_GUEST_FS_STAT, h_stat},
	{SPACED_GUEST_FS_MKDIR, h_mkdir},
	{SPACED_GUEST_FS_MOVE, h_move},
	{SPACED_GUEST_FS_REMOVE, h_remove},
	{SPACED_GUEST_EXEC, h_exec},
	{SPACED_GUEST_PROC_LIST, h_proc_list},
	{SPACED_GUEST_PROC_ATTACH, h_proc_attach},
	{SPACED_GUEST_PROC_SIGNAL, h_proc_signal},
	{SPACED_GUEST_PROC_KILL, h_proc_kill},
	{SPACED_GUEST_TERM_OPEN, h_term},
	{SPACED_GUEST_WATCH, h_watch},
	{SPACED_GUEST_IN_DATA, h_in_data},
	{SPACED_GUEST_IN_STDIN, h_in_stdin},
	{SPACED_GUEST_IN_RESIZE, h_in_resize},
	{SPACED_GUEST_IN_CANCEL, h_in_cancel},
	{SPACED_GUEST_IN_SIGNAL, h_in_signal},
};

static bool dispatch_frame(struct conn *c, const struct spaced_frame_hdr *h, const uint8_t *p)
{
	int e = spaced_frame_dispatch(dispatch, sizeof dispatch / sizeof dispatch[0], c, h, p,
	                              h->len);
	if (e < 0) {
		char why[96];
		snprintf(why, sizeof why, "protocol error in frame type=0x%04x id=%u len=%u", h->type,
		         h->id, h->len);
		conn_kill(c, why);
		return false;
	}
	return !c->dead;
}

bool conn_has_input(const struct conn *c)
{
	if (c->dead || c->in_payload || c->ib_len - c->ib_off < SPACED_FRAME_HDR_LEN)
		return false;
	struct spaced_frame_hdr h;
	if (spaced_frame_hdr_decode(&h, c->ib + c->ib_off, SPACED_FRAME_MAX) < 0)
		return true; /* an error to report */
	return c->ib_len - c->ib_off - SPACED_FRAME_HDR_LEN >= h.len ||
	       c->ib_len - c->ib_off == GUEST_INBUF;
}

void conn_parse(struct conn *c)
{
	/* A bounded number of frames per call keeps one busy peer from
	 * starving the others; the loop calls again while input is buffered. */
	for (int rounds = 0; rounds < 64 && !c->dead && !c->in_payload; rounds++) {
		size_t avail = c->ib_len - c->ib_off;
		if (avail < SPACED_FRAME_HDR_LEN)
			break;
		struct spaced_frame_hdr h;
		/* The length is checked before anything is allocated. */
		int e = spaced_frame_hdr_decode(&h, c->ib + c->ib_off, SPACED_FRAME_MAX);
		if (e < 0) {
			conn_kill(c, e == SPACED_ETOOBIG ? "frame too large" : "bad frame header");
			return;
		}
		if (avail - SPACED_FRAME_HDR_LEN >= h.len) {
			const uint8_t *p = c->ib + c->ib_off + SPACED_FRAME_HDR_LEN;
			c->ib_off += SPACED_FRAME_HDR_LEN + h.len;
			if (!dispatch_frame(c, &h, p))
				return;
			continue;
		}
		/* A payload larger than what is buffered: read the rest straight
		 * into its own buffer. */
		c->payload = malloc(h.len);
		if (c->payload == NULL) {
			conn_kill(c, "out of memory");
			return;
		}
		c->hdr = h;
		c->pay_got = avail - SPACED_FRAME_HDR_LEN;
		memcpy(c->payload, c->ib + c->ib_off + SPACED_FRAME_HDR_LEN, c->pay_got);
		c->ib_off = c->ib_len = 0;
		c->in_payload = true;
	}
	if (c->ib_off == c->ib_len)
		c->ib_off = c->ib_len = 0;
}

/* The peer ended its input (a half-close): requests that finish by
 * themselves go on and are answered; streams that wait for input end now.
 * The connection closes once nothing is left to send. */
void conn_end_input(struct conn *c)
{
	c->rd_eof = true;
	for (struct stream *s = c->streams; s != NULL && !c->dead; s = s->next) {
		if (s->dead)
			continue;
		switch (s->kind) {
		case ST_READ:
			break;
		case ST_WRITE:
			stream_finish(s, SPACED_ECLOSED, "input ended before the end of the data", NULL);
			break;
		case ST_WATCH:
		case ST_ATTACH:
			stream_finish(s, 0, "input ended", NULL);
			break;
		case ST_EXEC:
			proc_stdin(s, NULL, 0, true);
			break;
		case ST_TERM:
			if (s->proc != NULL && !s->proc->exited)
				kill(-s->proc->pid, SIGKILL);
			break;
		}
	}
}

bool conn_done(const struct conn *c)
{
	if (c->dead || !c->rd_eof || c->oq_head != NULL)
		return false;
	for (const struct stream *s = c->streams; s != NULL; s = s->next)
		if (!s->dead)
			return false;
	return true;
}

void conn_on_readable(struct conn *c)
{
	if (c->rd_eof) {
		/* only reached on POLLHUP / POLLERR: the peer is gone altogether */
		conn_kill(c, "peer gone");
		return;
	}
	for (int rounds = 0; rounds < 64 && !c->dead; rounds++) {
		ssize_t k;
		size_t want;
		if (c->in_payload) {
			want = c->hdr.len - c->pay_got;
			k = recv(c->fd, c->payload + c->pay_got, want, MSG_DONTWAIT);
		} else {
			if (c->ib == NULL && (c->ib = malloc(GUEST_INBUF)) == NULL) {
				conn_kill(c, "out of memory");
				return;
			}
			if (c->ib_off > 0) {
				memmove(c->ib, c->ib + c->ib_off, c->ib_len - c->ib_off);
				c->ib_len -= c->ib_off;
				c->ib_off = 0;
			}
			want = GUEST_INBUF - c->ib_len;
			if (want == 0)
				return; /* full of unparsed frames: the loop parses first */
			k = recv(c->fd, c->ib + c->ib_len, want, MSG_DONTWAIT);
		}
		if (k < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				conn_kill(c, "read failed");
			return;
		}
		if (k == 0) {
			/* whole frames that arrived before the end are still handled */
			while (!c->dead && !c->in_payload && conn_has_input(c))
				conn_parse(c);
			if (c->dead)
				return;
			if (c->ib_len > c->ib_off || c->in_payload)
				conn_kill(c, "truncated frame");
			else
				conn_end_input(c);
			return;
		}
		if (c->in_payload) {
			c->pay_got += (size_t)k;
			if (c->pay_got < c->hdr.len)
				continue;
			struct spaced_frame_hdr h = c->hdr;
			uint8_t *p = c->payload;
			c->payload = NULL;
			c->in_payload = false;
			bool ok = dispatch_frame(c, &h, p);
			free(p);
			if (!ok)
				return;
			continue;
		}
		c->ib_len += (size_t)k;
		conn_parse(c);
		if ((size_t)k < want && !c->in_payload)
			return; /* the socket is drained; poll tells when more comes */
	}
}

void guest_reap_dead(void)
{
	struct conn **cp = &G.conns;
	while (*cp != NULL) {
		struct conn *c = *cp;
		struct stream **sp = &c->streams;
		while (*sp != NULL) {
			struct stream *s = *sp;
			if (s->dead) {
				*sp = s->next;
				free(s->name);
				free(s);
				c->nstreams--;
			} else {
				sp = &s->next;
			}
		}
		if (c->dead) {
			*cp = c->next;
			close(c->fd);
			free(c->payload);
			free(c->ib);
			while (c->oq_head) {
				struct outbuf *o = c->oq_head;
				c->oq_head = o->next;
				free(o);
			}
			free(c);
			G.nconns--;
		} else {
			cp = &c->next;
		}
	}
	proc_reap_done();
}
