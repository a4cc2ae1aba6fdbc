/*
 * mgr_main.c — sbx-manager: the authority of this worker.
 *
 * One thread, one poll() loop over: the socketpair to node-api, the admin
 * socket and its clients, and one bridge connection per forwarded request.
 * Every request from node-api is verified (keyring + verification cache) and
 * compared with the installed runtime record (R1) before a byte goes to the
 * bridge; refusals go back as REFUSE. Each forwarded request is a stream bound
 * to the record's identity epoch (S1); installing a new identity cancels the
 * streams of older epochs (R3), except on an ownership handoff (S3) and, for
 * ServicePort streams, on a change of the activation alone (S4).
 */
#include "mgr.h"
#include "node.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "error.h"
#include "host_client.h"
#include "keyring.h"
#include "vcache.h"

#define MGR_MAX_STREAMS 1024
#define MGR_API_HIGH (8u << 20)  /* stop reading executions above this backlog to node-api */
#define MGR_API_MAX (64u << 20)  /* node-api that leaves this much unread is dropped */
#define MGR_MAX_ADMIN 16
#define MGR_ADMIN_LINE_MAX (256 * 1024)

struct mstream {
	struct mstream *next;
	uint32_t id;            /* node-api's request id */
	int gfd;                /* bridge connection (or TCP for a ServicePort tunnel) */
	bool raw;               /* ServicePort tunnel: bytes, not frames */
	bool dead;
	struct spaced_buf rbuf;
	uint16_t gtype;
	uint64_t epoch;
	struct spaced_cap cap;  /* for the established-stream comparison (S4) */
	struct spaced_request req;
	char protocol[SPACED_PROTOCOL_MAX];
	char ident[SPACED_IDENTITY_TEXT_MAX];
	struct spaced_buf wq;   /* bytes for the execution not yet written */
	size_t wq_off;
	bool shut_pending;      /* ServicePort: half-close once wq drained */
	bool cancelled;         /* the client sent CANCEL: the connection is not reused */
};

/* An execution that does not read (a paused one) holds at most this much per
 * stream; past it the stream fails instead of stalling the manager. */
#define MGR_STREAM_WQ_MAX (8u << 20)

/* A connection to an execution kept for the next request: it passed the
 * bridge's checks when it was opened (B3: a new connection is checked again)
 * and is bound to the epoch it was opened under. */
struct idle_conn {
	struct idle_conn *next;
	int fd;
	char sandbox[SPACED_NAME_MAX];
	uint64_t epoch;
};
#define MGR_IDLE_PER_SANDBOX 32
#define MGR_POLL_MAX (2 * MGR_MAX_STREAMS + MGR_MAX_ADMIN + 2)

struct admin_client {
	int fd;
	struct spaced_buf rbuf;
};

struct mgr {
	const struct mgr_config *cfg;
	struct mgr_store *store;
	struct spaced_keyring *kr;
	struct spaced_vcache *vc;
	struct mgr_rec *recs;
	size_t nrecs, caprecs;
	int api_fd;
	struct spaced_buf api_rbuf;
	struct spaced_buf api_out; /* frames for node-api not yet written */
	size_t api_out_off;
	struct mstream *streams;
	size_t nstreams;
	struct idle_conn *idle;
	size_t nidle;
	int admin_fd;
	struct admin_client admin[MGR_MAX_ADMIN];
	bool quit;
	/* counters */
	uint64_t n_req, n_allow, n_refuse, n_cancel, vc_ns;
};

static volatile sig_atomic_t got_term;

static void on_term(int sig)
{
	(void)sig;
	got_term = 1;
}

static void mlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void mlog(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "sbx-manager: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
}

/* ---- records in memory ---- */

const struct mgr_rec *mgr_rec_find(struct mgr *m, const char *sandbox)
{
	for (size_t i = 0; i < m->nrecs; i++)
		if (strcmp(m->recs[i].r.id.sandbox, sandbox) == 0)
			return &m->recs[i];
	return NULL;
}

static int rec_put_mem(struct mgr *m, const struct mgr_rec *rec)
{
	for (size_t i = 0; i < m->nrecs; i++) {
		if (strcmp(m->recs[i].r.id.sandbox, rec->r.id.sandbox) == 0) {
			m->recs[i] = *rec;
			return 0;
		}
	}
	if (m->nrecs == m->caprecs) {
		size_t nc = m->caprecs ? m->caprecs * 2 : 16;
		struct mgr_rec *n = realloc(m->recs, nc * sizeof *n);
		if (!n)
			return SPACED_ENOMEM;
		m->recs = n;
		m->caprecs = nc;
	}
	m->recs[m->nrecs++] = *rec;
	return 0;
}

static int load_cb(void *arg, const struct mgr_rec *rec)
{
	struct mgr *m = arg;
	mgr_store_use_epoch(m->store, rec->r.epoch);
	return rec_put_mem(m, rec) < 0;
}

int mgr_uid_alloc(struct mgr *m, uint32_t *base)
{
	uint32_t *used = calloc(m->nrecs + 1, sizeof *used);
	size_t n = 0;
	if (!used)
		return SPACED_ENOMEM;
	for (size_t i = 0; i < m->nrecs; i++) {
		const struct mgr_rec *r = &m->recs[i];
		/* a record keeps its range while anything of its execution may run */
		if (r->uid_base != 0 && (r->pid != 0 || r->host_pid != 0))
			used[n++] = r->uid_base;
	}
	int e = mgr_uid_pick(m->cfg, used, n, base);
	free(used);
	return e;
}

const char *mgr_worker_id(const struct mgr *m)
{
	return m->cfg->worker_id;
}
const char *mgr_state_dir(const struct mgr *m)
{
	return m->cfg->state_dir;
}
const struct mgr_config *mgr_cfg(const struct mgr *m)
{
	return m->cfg;
}
struct mgr_store *mgr_store_of(struct mgr *m)
{
	return m->store;
}

/* ---- frames to node-api (blocking writes; node-api never blocks on us) ---- */

static void api_drop(struct mgr *m, const char *why)
{
	if (m->api_fd < 0)
		return;
	mlog("dropping node-api: %s", why);
	close(m->api_fd);
	m->api_fd = -1;
}

/* Writes queued frames without blocking: node-api can never stall the
 * manager (installs and deactivations go on whatever it does). */
static void api_flush(struct mgr *m)
{
	while (m->api_fd >= 0 && m->api_out_off < m->api_out.len) {
		ssize_t w = send(m->api_fd, m->api_out.data + m->api_out_off, m->api_out.len - m->api_out_off,
		                 MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN)
			return;
		if (w <= 0) {
			api_drop(m, "write failed");
			return;
		}
		m->api_out_off += (size_t)w;
	}
	if (m->api_out_off == m->api_out.len) {
		m->api_out.len = 0;
		m->api_out_off = 0;
	} else if (m->api_out_off >= (1u << 20)) {
		memmove(m->api_out.data, m->api_out.data + m->api_out_off, m->api_out.len - m->api_out_off);
		m->api_out.len -= m->api_out_off;
		m->api_out_off = 0;
	}
}

static int api_send(struct mgr *m, uint16_t type, uint16_t flags, uint32_t id, const struct spaced_buf *b)
{
	if (m->api_fd < 0)
		return SPACED_ECLOSED;
	int e = spaced_frame_append(&m->api_out, type, flags, id, b ? b->data : NULL, b ? b->len : 0);
	if (e < 0) {
		api_drop(m, "it does not read its answers");
		return e;
	}
	api_flush(m);
	return 0;
}

static void send_refuse(struct mgr *m, uint16_t type, uint32_t id, struct spaced_decision d,
                        const char *sandbox)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 1024);
	if (spaced_field_put_u64(&b, (uint64_t)d.verdict) == 0 &&
	    spaced_field_put_u64(&b, (uint64_t)d.reason) == 0 && spaced_field_put_str(&b, sandbox) == 0)
		api_send(m, type, SPACED_FRAME_F_END, id, &b);
	spaced_buf_free(&b);
}

static void send_fail(struct mgr *m, uint32_t id, int err, const char *msg)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 1024);
	if (spaced_field_put_i64(&b, err) == 0 && spaced_field_put_str(&b, msg) == 0)
		api_send(m, NODE_MSG_FAIL, SPACED_FRAME_F_END, id, &b);
	spaced_buf_free(&b);
}

/* ---- streams ---- */

static struct mstream *stream_find(struct mgr *m, uint32_t id)
{
	for (struct mstream *s = m->streams; s; s = s->next)
		if (s->id == id && !s->dead)
			return s;
	return NULL;
}

static void stream_kill(struct mstream *s)
{
	if (s->dead)
		return;
	s->dead = true;
	if (s->gfd >= 0) {
		shutdown(s->gfd, SHUT_RDWR);
		close(s->gfd);
		s->gfd = -1;
	}
}

static int pool_take(struct mgr *m, const char *sandbox, uint64_t epoch)
{
	for (struct idle_conn **pp = &m->idle; *pp; pp = &(*pp)->next) {
		struct idle_conn *c = *pp;
		if (c->epoch == epoch && strcmp(c->sandbox, sandbox) == 0) {
			int fd = c->fd;
			*pp = c->next;
			free(c);
			m->nidle--;
			return fd;
		}
	}
	return -1;
}

static void pool_put(struct mgr *m, int fd, const char *sandbox, uint64_t epoch)
{
	size_t same = 0;
	for (struct idle_conn *c = m->idle; c; c = c->next)
		same += strcmp(c->sandbox, sandbox) == 0;
	const struct mgr_rec *rec = mgr_rec_find(m, sandbox);
	bool current = rec && rec->r.active && rec->r.epoch == epoch;
	struct idle_conn *c = current && same < MGR_IDLE_PER_SANDBOX && m->nidle < MGR_MAX_STREAMS
	                              ? calloc(1, sizeof *c)
	                              : NULL;
	if (!c) {
		close(fd);
		return;
	}
	c->fd = fd;
	snprintf(c->sandbox, sizeof c->sandbox, "%s", sandbox);
	c->epoch = epoch;
	c->next = m->idle;
	m->idle = c;
	m->nidle++;
}

/* Closes idle connections of sandbox (all of them when sandbox is NULL) older than epoch. */
static void pool_flush(struct mgr *m, const char *sandbox, uint64_t epoch)
{
	struct idle_conn **pp = &m->idle;
	while (*pp) {
		struct idle_conn *c = *pp;
		if (!sandbox || (strcmp(c->sandbox, sandbox) == 0 && c->epoch < epoch)) {
			*pp = c->next;
			close(c->fd);
			free(c);
			m->nidle--;
		} else {
			pp = &c->next;
		}
	}
}

/* An idle connection that became readable was closed or misbehaves: drop it. */
static void pool_drop_fd(struct mgr *m, int fd)
{
	for (struct idle_conn **pp = &m->idle; *pp; pp = &(*pp)->next) {
		if ((*pp)->fd == fd) {
			struct idle_conn *c = *pp;
			*pp = c->next;
			close(c->fd);
			free(c);
			m->nidle--;
			return;
		}
	}
}

static void streams_reap(struct mgr *m)
{
	struct mstream **pp = &m->streams;
	while (*pp) {
		struct mstream *s = *pp;
		if (s->dead) {
			*pp = s->next;
			spaced_buf_free(&s->rbuf);
			spaced_buf_free(&s->wq);
			free(s);
			m->nstreams--;
		} else {
			pp = &s->next;
		}
	}
}

/* The purpose and class of a guest request type; 0 for types node-api may not send. */
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
static bool input_allowed(const struct mstream *s, uint16_t in)
{
	if (in == SPACED_GUEST_IN_CANCEL)
		return !s->raw;
	switch (s->gtype) {
	case SPACED_GUEST_FS_WRITE:
		return in == SPACED_GUEST_IN_DATA;
	case SPACED_GUEST_EXEC:
		return in == SPACED_GUEST_IN_STDIN;
	case SPACED_GUEST_TERM_OPEN:
		return in == SPACED_GUEST_IN_STDIN || in == SPACED_GUEST_IN_RESIZE;
	case NODE_PORT_OPEN:
		return in == SPACED_GUEST_IN_STDIN;
	default:
		return false;
	}
}

static int connect_unix(const char *path)
{
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	if (strlen(path) >= sizeof sa.sun_path)
		return SPACED_EINVAL;
	memcpy(sa.sun_path, path, strlen(path));
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return SPACED_ESYS;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		close(fd);
		return SPACED_ECLOSED;
	}
	return fd;
}

/* ServicePort in the development launcher: the guest shares the host network,
 * so the port is reached on loopback. */
static int connect_port(uint16_t port)
{
	struct sockaddr_in sa;
	memset(&sa, 0, sizeof sa);
	sa.sin_family = AF_INET;
	sa.sin_port = htons(port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return SPACED_ESYS;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		close(fd);
		return SPACED_ECLOSED;
	}
	return fd;
}

/* Writes what the socket takes now and queues the rest (never blocks). */
static int stream_flush(struct mstream *s)
{
	while (s->wq_off < s->wq.len) {
		ssize_t w = send(s->gfd, s->wq.data + s->wq_off, s->wq.len - s->wq_off, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN)
			break;
		if (w <= 0)
			return SPACED_EIO;
		s->wq_off += (size_t)w;
	}
	if (s->wq_off == s->wq.len) {
		s->wq.len = 0;
		s->wq_off = 0;
		if (s->shut_pending) {
			shutdown(s->gfd, SHUT_WR);
			s->shut_pending = false;
		}
	} else if (s->wq_off >= (1u << 20)) {
		memmove(s->wq.data, s->wq.data + s->wq_off, s->wq.len - s->wq_off);
		s->wq.len -= s->wq_off;
		s->wq_off = 0;
	}
	return 0;
}

static int stream_write(struct mstream *s, const void *p, size_t n)
{
	int e = spaced_buf_append(&s->wq, p, n);
	if (e < 0)
		return e;
	return stream_flush(s);
}

/* The answer to a usage request, which the manager gives itself: what the
 * execution uses now and the limits it runs under, as one JSON text in the
 * RESULT (after ACCEPT, like any answer an execution served). */
static void answer_usage(struct mgr *m, uint32_t id, const struct mgr_rec *rec)
{
	json_t *u = NULL;
	char ident[SPACED_IDENTITY_TEXT_MAX];
	int e = mgr_exec_usage(m->cfg, rec, &u);
	if (e < 0) {
		send_fail(m, id, e, e == SPACED_EPERM ? "usage is not measured for development executions"
		                                       : "the execution's launcher did not answer");
		return;
	}
	json_object_set_new(u, "limits", spaced_resources_to_json(&rec->res));
	char *text = json_dumps(u, JSON_COMPACT);
	json_decref(u);
	spaced_identity_encode(&rec->r.id, ident, sizeof ident);
	struct spaced_buf b, r;
	spaced_buf_init(&b, 1024);
	spaced_buf_init(&r, 8192);
	if (text && spaced_field_put_str(&b, ident) == 0 && spaced_field_put_u64(&b, rec->r.epoch) == 0 &&
	    spaced_field_put_i64(&r, 0) == 0 && spaced_field_put_str(&r, "") == 0 && spaced_field_put_str(&r, ident) == 0 &&
	    spaced_field_put_str(&r, text) == 0) {
		api_send(m, NODE_MSG_ACCEPT, 0, id, &b);
		struct spaced_buf o;
		spaced_buf_init(&o, NODE_MSG_MAX);
		if (spaced_field_put_u64(&o, SPACED_GUEST_OUT_RESULT) == 0 && spaced_field_put_bytes(&o, r.data, r.len) == 0)
			api_send(m, NODE_MSG_OUT, SPACED_FRAME_F_END, id, &o);
		spaced_buf_free(&o);
	} else {
		send_fail(m, id, SPACED_ENOMEM, "out of memory");
	}
	free(text);
	spaced_buf_free(&b);
	spaced_buf_free(&r);
}

/* One REQ: verify, compare, forward. */
static int on_req(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	struct mgr *m = ctx;
	struct spaced_field_reader r;
	const char *tok;
	size_t toklen, plen;
	char sandbox[SPACED_NAME_MAX];
	uint64_t gtype, port;
	const uint8_t *payload;
	char protocol[SPACED_PROTOCOL_MAX];
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
	if (spaced_field_end(&r) < 0 || gtype > 0xffff || port > 65535 || toklen > NODE_TOKEN_MAX)
		return SPACED_EPROTO;
	if (h->id == 0 || stream_find(m, h->id))
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

	if (d.verdict != SPACED_ALLOW) {
		m->n_refuse++;
		send_refuse(m, NODE_MSG_REFUSE, h->id, d, sandbox);
		return 0;
	}
	m->n_allow++;
	if (m->nstreams >= MGR_MAX_STREAMS) {
		send_fail(m, h->id, SPACED_EBUSY, "too many open requests");
		return 0;
	}
	if (gtype == NODE_USAGE) {
		answer_usage(m, h->id, rec);
		return 0;
	}
	char target[256];
	int fd;
	bool raw = gtype == NODE_PORT_OPEN;
	if (raw && m->cfg->launch_bin && m->cfg->host_bin) {
		/* an execution in its own network namespace: its ports are reached
		 * through spaced-netgtw, never through this host's loopback */
		send_fail(m, h->id, SPACED_EPERM, "ServicePort is served by the sandbox's gateway");
		return 0;
	}
	if (raw) {
		fd = connect_port((uint16_t)port);
	} else {
		fd = pool_take(m, sandbox, rec->r.epoch);
		if (fd < 0) {
			e = mgr_exec_target(m->cfg, rec, target, sizeof target);
			if (e < 0) {
				fd = e;
			} else if (m->cfg->launch_bin && m->cfg->host_bin) {
				/* The bridge checks this manager, the launcher, the guest
				 * transport and the guest's identity (B1–B3), then hands the
				 * verified guest connection over: no hop per request. */
				char why[256] = "";
				e = spaced_host_connect(target, true, 5000, &fd, why, sizeof why);
				if (e < 0) {
					mlog("level=warn event=bridge-refused sandbox=%s reason=\"%s\"", sandbox, why);
					fd = e;
				}
			} else {
				fd = connect_unix(target);
			}
		}
	}
	if (fd < 0) {
		send_fail(m, h->id, SPACED_ECLOSED, "execution unreachable");
		return 0;
	}
	struct mstream *s = calloc(1, sizeof *s);
	if (!s) {
		close(fd);
		send_fail(m, h->id, SPACED_ENOMEM, "out of memory");
		return 0;
	}
	s->id = h->id;
	s->gfd = fd;
	s->raw = raw;
	s->gtype = (uint16_t)gtype;
	s->epoch = rec->r.epoch;
	s->cap = cap;
	snprintf(s->protocol, sizeof s->protocol, "%s", protocol);
	s->req = req;
	s->req.protocol = raw ? s->protocol : NULL;
	spaced_identity_encode(&rec->r.id, s->ident, sizeof s->ident);
	spaced_buf_init(&s->rbuf, SPACED_FRAME_MAX + SPACED_FRAME_HDR_LEN);
	spaced_buf_init(&s->wq, MGR_STREAM_WQ_MAX);
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	if (!raw) {
		uint8_t fh[SPACED_FRAME_HDR_LEN];
		struct spaced_frame_hdr hh = {.len = (uint32_t)plen, .type = (uint16_t)gtype, .flags = 0, .id = 1};
		spaced_frame_hdr_encode(fh, &hh);
		if (stream_write(s, fh, sizeof fh) < 0 || (plen && stream_write(s, payload, plen) < 0)) {
			close(fd);
			spaced_buf_free(&s->rbuf);
			spaced_buf_free(&s->wq);
			free(s);
			send_fail(m, h->id, SPACED_ECLOSED, "execution unreachable");
			return 0;
		}
	}
	s->next = m->streams;
	m->streams = s;
	m->nstreams++;

	struct spaced_buf b;
	spaced_buf_init(&b, 1024);
	if (spaced_field_put_str(&b, s->ident) == 0 && spaced_field_put_u64(&b, s->epoch) == 0)
		api_send(m, NODE_MSG_ACCEPT, 0, h->id, &b);
	spaced_buf_free(&b);
	return 0;
}

static int on_in(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	struct mgr *m = ctx;
	struct spaced_field_reader r;
	uint64_t in;
	const uint8_t *data;
	size_t dlen;
	spaced_field_reader_init(&r, p, n);
	spaced_field_get_u64(&r, &in);
	spaced_field_get_bytes(&r, &data, &dlen);
	if (spaced_field_end(&r) < 0 || in > 0xffff || dlen > SPACED_FRAME_CHUNK)
		return SPACED_EPROTO;
	struct mstream *s = stream_find(m, h->id);
	if (!s)
		return 0; /* already ended or cancelled: input stops here */
	if (!input_allowed(s, (uint16_t)in))
		return SPACED_EPROTO;
	if (in == SPACED_GUEST_IN_CANCEL)
		s->cancelled = true;
	int e;
	if (s->raw) {
		e = dlen ? stream_write(s, data, dlen) : 0;
		if (e == 0 && (h->flags & SPACED_FRAME_F_END)) {
			s->shut_pending = true;
			e = stream_flush(s);
		}
	} else {
		uint8_t hdr[SPACED_FRAME_HDR_LEN];
		struct spaced_frame_hdr fh = {.len = (uint32_t)dlen, .type = (uint16_t)in,
		                              .flags = h->flags & SPACED_FRAME_F_END, .id = 1};
		spaced_frame_hdr_encode(hdr, &fh);
		e = stream_write(s, hdr, sizeof hdr);
		if (e == 0 && dlen)
			e = stream_write(s, data, dlen);
	}
	if (e < 0) {
		send_fail(m, s->id, e == SPACED_ETOOBIG ? SPACED_EBUSY : SPACED_ECLOSED,
		          e == SPACED_ETOOBIG ? "the execution does not take input" : "execution connection lost");
		stream_kill(s);
	}
	return 0;
}

static int on_close(void *ctx, const struct spaced_frame_hdr *h, const uint8_t *p, size_t n)
{
	struct mgr *m = ctx;
	(void)p;
	if (n != 0)
		return SPACED_EPROTO;
	struct mstream *s = stream_find(m, h->id);
	if (s)
		stream_kill(s);
	return 0;
}

static const struct spaced_frame_handler api_table[] = {
	{NODE_MSG_REQ, on_req},
	{NODE_MSG_IN, on_in},
	{NODE_MSG_CLOSE, on_close},
};

static void api_readable(struct mgr *m)
{
	uint8_t tmp[65536];
	ssize_t r = read(m->api_fd, tmp, sizeof tmp);
	if (r < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (r <= 0 || spaced_buf_append(&m->api_rbuf, tmp, (size_t)r) < 0) {
		mlog("node-api closed its end");
		close(m->api_fd);
		m->api_fd = -1;
		return;
	}
	size_t off = 0;
	while (m->api_fd >= 0) {
		struct spaced_frame_hdr h;
		const uint8_t *pl;
		size_t used;
		int e = spaced_frame_parse(m->api_rbuf.data + off, m->api_rbuf.len - off, NODE_MSG_MAX, &h,
		                           &pl, &used);
		if (e == 0 && used == 0)
			break;
		if (e == 0)
			e = spaced_frame_dispatch(api_table, sizeof api_table / sizeof api_table[0], m, &h, pl,
			                          h.len);
		if (e < 0) {
			mlog("protocol error from node-api (%s): dropping it", spaced_strerror(e));
			close(m->api_fd);
			m->api_fd = -1;
			break;
		}
		off += used;
	}
	if (off > 0 && m->api_fd >= 0) {
		memmove(m->api_rbuf.data, m->api_rbuf.data + off, m->api_rbuf.len - off);
		m->api_rbuf.len -= off;
	}
}

/* Checks the identity the execution put in its RESULT against the one the
 * request was admitted for. */
static bool result_identity_ok(const struct mstream *s, const uint8_t *p, size_t n)
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

static void stream_out(struct mgr *m, struct mstream *s, uint16_t type, uint16_t flags,
                       const uint8_t *p, size_t n)
{
	struct spaced_buf b;
	spaced_buf_init(&b, NODE_MSG_MAX);
	if (spaced_field_put_u64(&b, type) == 0 && spaced_field_put_bytes(&b, p, n) == 0)
		api_send(m, NODE_MSG_OUT, flags, s->id, &b);
	spaced_buf_free(&b);
}

static void guest_readable(struct mgr *m, struct mstream *s)
{
	uint8_t tmp[SPACED_FRAME_CHUNK];
	ssize_t r = read(s->gfd, tmp, sizeof tmp);
	if (r < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (s->raw) {
		if (r <= 0) {
			struct spaced_buf b;
			spaced_buf_init(&b, 256);
			spaced_field_put_i64(&b, 0);
			spaced_field_put_str(&b, "port closed");
			spaced_field_put_str(&b, s->ident);
			stream_out(m, s, SPACED_GUEST_OUT_RESULT, SPACED_FRAME_F_END, b.data, b.len);
			spaced_buf_free(&b);
			stream_kill(s);
		} else {
			stream_out(m, s, SPACED_GUEST_OUT_STDOUT, 0, tmp, (size_t)r);
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
		int e = spaced_frame_parse(s->rbuf.data + off, s->rbuf.len - off, SPACED_FRAME_MAX, &h, &pl,
		                           &used);
		if (e == 0 && used == 0)
			break;
		if (e < 0 || h.id != 1 || h.type < SPACED_GUEST_OUT_RESULT ||
		    h.type > SPACED_GUEST_OUT_PROCS || h.len > SPACED_FRAME_CHUNK + 512) {
			send_fail(m, s->id, SPACED_EPROTO, "execution protocol error");
			stream_kill(s);
			break;
		}
		off += used;
		if (h.type == SPACED_GUEST_OUT_RESULT) {
			if (!(h.flags & SPACED_FRAME_F_END) || !result_identity_ok(s, pl, h.len)) {
				send_fail(m, s->id, SPACED_EIDENTITY, "the execution answered with another identity");
			} else {
				stream_out(m, s, h.type, SPACED_FRAME_F_END, pl, h.len);
				/* a cleanly ended request leaves a reusable connection */
				if (off == s->rbuf.len && s->wq_off == s->wq.len && !s->cancelled) {
					pool_put(m, s->gfd, s->cap.id.sandbox, s->epoch);
					s->gfd = -1;
				}
			}
			stream_kill(s);
			break;
		}
		stream_out(m, s, h.type, 0, pl, h.len);
	}
	if (!s->dead && off > 0) {
		memmove(s->rbuf.data, s->rbuf.data + off, s->rbuf.len - off);
		s->rbuf.len -= off;
	}
}

/* ---- installs (called by mgr_admin.c) ---- */

int mgr_rec_install(struct mgr *m, const struct mgr_rec *rec, bool handoff, uint64_t seq,
                    const char *ack_line)
{
	int e = mgr_store_commit(m->store, rec, seq, ack_line);
	if (e < 0)
		return e;
	mgr_store_use_epoch(m->store, rec->r.epoch);
	e = rec_put_mem(m, rec);
	if (e < 0)
		return e;
	if (handoff)
		return 0; /* S3: streams and unexpired capabilities stay */
	pool_flush(m, rec->r.id.sandbox, rec->r.epoch);
	for (struct mstream *s = m->streams; s; s = s->next) {
		if (s->dead || strcmp(s->cap.id.sandbox, rec->r.id.sandbox) != 0 || s->epoch >= rec->r.epoch)
			continue;
		if (s->raw && rec->r.active) {
			struct spaced_decision keep =
				spaced_compare(&s->cap, &s->req, &rec->r, SPACED_COMPARE_ESTABLISHED_STREAM);
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
		/* S1: the lease ends — the bridge connection goes first, then node-api is told. */
		int id = (int)s->id;
		stream_kill(s);
		m->n_cancel++;
		send_refuse(m, NODE_MSG_CANCEL, (uint32_t)id, d, rec->r.id.sandbox);
	}
	return 0;
}

int mgr_keys_install(struct mgr *m, const char *bundle_json, size_t len, uint64_t *version)
{
	char path[4096], tmp[4096];
	int e = spaced_keyring_install_bundle(m->kr, bundle_json, len);
	if (e < 0)
		return e;
	spaced_vcache_flush(m->vc);
	*version = spaced_keyring_version(m->kr);
	/* keep it for restarts: write, fsync, rename, fsync the directory */
	snprintf(path, sizeof path, "%s/keys.json", m->cfg->state_dir);
	snprintf(tmp, sizeof tmp, "%s/keys.json.tmp", m->cfg->state_dir);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return SPACED_EIO;
	e = spaced_io_write_full(fd, bundle_json, len);
	if (e == 0 && fsync(fd) < 0)
		e = SPACED_EIO;
	close(fd);
	if (e == 0 && rename(tmp, path) < 0)
		e = SPACED_EIO;
	if (e == 0) {
		int dfd = open(m->cfg->state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) {
			fsync(dfd);
			close(dfd);
		}
	}
	return e;
}

json_t *mgr_status_json(struct mgr *m)
{
	json_t *o = json_object();
	json_t *recs = json_array();
	struct spaced_vcache_stats vs;
	spaced_vcache_stats(m->vc, &vs);
	for (size_t i = 0; i < m->nrecs; i++) {
		const struct mgr_rec *r = &m->recs[i];
		json_t *ro = json_object();
		char text[SPACED_IDENTITY_TEXT_MAX];
		spaced_identity_encode(&r->r.id, text, sizeof text);
		json_object_set_new(ro, "identity", spaced_identity_to_json(&r->r.id));
		json_object_set_new(ro, "text", json_string(text));
		json_object_set_new(ro, "epoch", json_integer((json_int_t)r->r.epoch));
		json_object_set_new(ro, "active", json_boolean(r->r.active));
		json_object_set_new(ro, "state", json_string(r->state));
		json_object_set_new(ro, "pid", json_integer(r->pid));
		json_object_set_new(ro, "host_pid", json_integer(r->host_pid));
		json_object_set_new(ro, "resources", spaced_resources_to_json(&r->res));
		json_object_set_new(ro, "uid_base", json_integer(r->uid_base));
		json_array_append_new(recs, ro);
	}
	size_t open_streams = 0;
	for (struct mstream *s = m->streams; s; s = s->next)
		open_streams += !s->dead;
	json_object_set_new(o, "worker", json_string(m->cfg->worker_id));
	json_object_set_new(o, "mode", json_string(m->cfg->launch_bin && m->cfg->host_bin ? "substrate" : "development"));
	json_object_set_new(o, "last_seq", json_integer((json_int_t)mgr_store_last_seq(m->store)));
	json_object_set_new(o, "keys_version", json_integer((json_int_t)spaced_keyring_version(m->kr)));
	json_object_set_new(o, "keys", json_integer((json_int_t)spaced_keyring_count(m->kr)));
	json_object_set_new(o, "manager_pid", json_integer(getpid()));
	json_object_set_new(o, "api_pid", json_integer(m->cfg->api_pid));
	json_object_set_new(o, "streams", json_integer((json_int_t)open_streams));
	json_object_set_new(o, "requests", json_integer((json_int_t)m->n_req));
	json_object_set_new(o, "allowed", json_integer((json_int_t)m->n_allow));
	json_object_set_new(o, "refused", json_integer((json_int_t)m->n_refuse));
	json_object_set_new(o, "cancelled", json_integer((json_int_t)m->n_cancel));
	json_object_set_new(o, "verify_compare_ns", json_integer((json_int_t)m->vc_ns));
	json_object_set_new(o, "vcache_hits", json_integer((json_int_t)vs.hits));
	json_object_set_new(o, "vcache_misses", json_integer((json_int_t)vs.misses));
	json_object_set_new(o, "records", recs);
	/* development executions take no limits: they report none */
	if (m->cfg->launch_bin)
		json_object_set_new(o, "limits",
		                    json_pack("{s:o,s:o}", "default", spaced_resources_to_json(&m->cfg->limits_default),
		                              "max", spaced_resources_to_json(&m->cfg->limits_max)));
	json_object_set_new(o, "uid_range", json_pack("{s:I,s:I}", "first", (json_int_t)m->cfg->uid_first, "count",
	                                              (json_int_t)m->cfg->uid_slots));
	return o;
}

/* ---- admin socket ---- */

static int admin_listen(const char *state_dir)
{
	struct sockaddr_un sa;
	char path[4096], tmp[4096];
	/* bound and listening under a temporary name, then renamed into place:
	 * whoever sees admin.sock can connect */
	snprintf(path, sizeof path, "%s/admin.sock", state_dir);
	snprintf(tmp, sizeof tmp, "%s/admin.sock.new", state_dir);
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	if (strlen(tmp) >= sizeof sa.sun_path)
		return SPACED_EINVAL;
	memcpy(sa.sun_path, tmp, strlen(tmp));
	unlink(tmp);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return SPACED_ESYS;
	mode_t old = umask(077);
	int r = bind(fd, (struct sockaddr *)&sa, sizeof sa);
	umask(old);
	if (r < 0 || chmod(tmp, 0600) < 0 || listen(fd, 16) < 0 || rename(tmp, path) < 0) {
		close(fd);
		unlink(tmp);
		return SPACED_ESYS;
	}
	return fd;
}

static void admin_accept(struct mgr *m)
{
	int fd = accept4(m->admin_fd, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0)
		return;
	struct ucred uc;
	socklen_t ul = sizeof uc;
	/* root only, or the user the manager runs as */
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) < 0 || (uc.uid != 0 && uc.uid != geteuid())) {
		close(fd);
		return;
	}
	for (int i = 0; i < MGR_MAX_ADMIN; i++) {
		if (m->admin[i].fd < 0) {
			m->admin[i].fd = fd;
			spaced_buf_init(&m->admin[i].rbuf, MGR_ADMIN_LINE_MAX);
			return;
		}
	}
	close(fd);
}

static void admin_drop(struct admin_client *a)
{
	close(a->fd);
	a->fd = -1;
	spaced_buf_free(&a->rbuf);
}

static void admin_readable(struct mgr *m, struct admin_client *a)
{
	uint8_t tmp[16384];
	ssize_t r = read(a->fd, tmp, sizeof tmp);
	if (r < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (r <= 0 || spaced_buf_append(&a->rbuf, tmp, (size_t)r) < 0) {
		admin_drop(a);
		return;
	}
	for (;;) {
		uint8_t *nl = memchr(a->rbuf.data, '\n', a->rbuf.len);
		if (!nl)
			break;
		size_t len = (size_t)(nl - a->rbuf.data);
		char *reply = NULL;
		mgr_admin_handle(m, (const char *)a->rbuf.data, len, &reply);
		if (reply) {
			int e = spaced_io_write_full(a->fd, reply, strlen(reply));
			if (e == 0)
				e = spaced_io_write_full(a->fd, "\n", 1);
			free(reply);
			if (e < 0) {
				admin_drop(a);
				return;
			}
		}
		memmove(a->rbuf.data, nl + 1, a->rbuf.len - len - 1);
		a->rbuf.len -= len + 1;
	}
}

/* ---- start and loop ---- */

/* After a restart: executions recorded as running whose process is gone are
 * started again (their files are kept); the records never move. */
static void recover_executions(struct mgr *m)
{
	for (size_t i = 0; i < m->nrecs; i++) {
		struct mgr_rec r = m->recs[i];
		bool live = strcmp(r.state, MGR_ST_RUNNING) == 0 || strcmp(r.state, MGR_ST_PAUSED) == 0 ||
		            strcmp(r.state, MGR_ST_KEPT) == 0;
		if (!live || r.pid == 0)
			continue;
		int e;
		if (mgr_exec_alive(&r))
			e = mgr_exec_rebridge(m->cfg, &r); /* the bridge must know this manager */
		else if (r.r.active && strcmp(r.state, MGR_ST_RUNNING) == 0 && m->cfg->guest_bin) {
			/* a record from before uid ranges were recorded gets one now */
			e = m->cfg->launch_bin && r.uid_base == 0 ? mgr_uid_alloc(m, &r.uid_base) : 0;
			if (e == 0)
				e = mgr_exec_start(m->cfg, &r, NULL);
		} else
			continue;
		if (e == 0 && mgr_store_commit(m->store, &r, 0, NULL) == 0)
			m->recs[i] = r;
		else
			mlog("could not recover the execution of %s", r.r.id.sandbox);
	}
}

int mgr_run(const struct mgr_config *cfg)
{
	struct mgr m;
	int e, rc = 1;
	char path[4096];

	memset(&m, 0, sizeof m);
	m.cfg = cfg;
	m.api_fd = cfg->api_fd;
	m.admin_fd = -1;
	for (int i = 0; i < MGR_MAX_ADMIN; i++)
		m.admin[i].fd = -1;
	spaced_buf_init(&m.api_rbuf, 2 * NODE_MSG_MAX + 2 * SPACED_FRAME_HDR_LEN + 65536);
	spaced_buf_init(&m.api_out, MGR_API_MAX);

	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_term;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	if ((e = mgr_store_open(cfg->state_dir, &m.store)) < 0) {
		mlog("cannot open the runtime records: %s", spaced_strerror(e));
		goto out;
	}
	if ((e = spaced_keyring_new(&m.kr)) < 0 || (e = spaced_vcache_new(&m.vc, 4096)) < 0)
		goto out;
	snprintf(path, sizeof path, "%s/keys.json", cfg->state_dir);
	if (access(path, F_OK) == 0 && (e = spaced_keyring_load_file(m.kr, path)) < 0)
		mlog("stored key bundle refused: %s", spaced_strerror(e));
	if (cfg->keys_path) {
		FILE *f = fopen(cfg->keys_path, "r");
		char *buf = malloc(SPACED_KEYRING_BUNDLE_MAX + 1);
		size_t n = (f && buf) ? fread(buf, 1, SPACED_KEYRING_BUNDLE_MAX + 1, f) : 0;
		uint64_t ver;
		if (f)
			fclose(f);
		e = (!f || !buf || n > SPACED_KEYRING_BUNDLE_MAX) ? SPACED_EIO : mgr_keys_install(&m, buf, n, &ver);
		free(buf);
		if (e < 0 && e != SPACED_ESTALE) {
			mlog("cannot install the key bundle %s: %s", cfg->keys_path, spaced_strerror(e));
			goto out;
		}
	}
	if ((e = mgr_store_foreach(m.store, load_cb, &m)) < 0)
		goto out;
	if (cfg->launch_bin) {
		/* what launchers killed with SIGKILL left behind (frozen tasks) */
		pid_t rp = fork();
		if (rp == 0) {
			int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
			if (nul >= 0)
				dup2(nul, 1);
			execl(cfg->launch_bin, "spaced-launch", "reap", (char *)NULL);
			_exit(127);
		}
		if (rp > 0)
			waitpid(rp, NULL, 0);
	}
	recover_executions(&m);
	if ((m.admin_fd = admin_listen(cfg->state_dir)) < 0) {
		mlog("cannot listen on the admin socket");
		goto out;
	}
	{
		int sz = 4 << 20;
		setsockopt(m.api_fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
		fcntl(m.api_fd, F_SETFL, fcntl(m.api_fd, F_GETFL) | O_NONBLOCK);
	}
	mlog("serving worker %s (%zu records, last seq %llu)", cfg->worker_id, m.nrecs,
	     (unsigned long long)mgr_store_last_seq(m.store));

	struct pollfd *pfd = calloc(MGR_POLL_MAX, sizeof *pfd);
	struct mstream **ps = calloc(MGR_POLL_MAX, sizeof *ps);
	if (!pfd || !ps) {
		free(pfd);
		free(ps);
		goto out;
	}
	while (!got_term && m.api_fd >= 0) {
		nfds_t n = 0;
		bool api_backlog = m.api_out.len - m.api_out_off > MGR_API_HIGH;
		pfd[n++] = (struct pollfd){.fd = m.api_fd,
		                           .events = (short)(POLLIN | (m.api_out_off < m.api_out.len ? POLLOUT : 0))};
		pfd[n++] = (struct pollfd){.fd = m.admin_fd, .events = POLLIN};
		for (int i = 0; i < MGR_MAX_ADMIN; i++)
			pfd[n++] = (struct pollfd){.fd = m.admin[i].fd, .events = POLLIN};
		nfds_t first_idle = n;
		for (struct idle_conn *c = m.idle; c && n < MGR_POLL_MAX; c = c->next)
			pfd[n++] = (struct pollfd){.fd = c->fd, .events = POLLIN};
		nfds_t first_stream = n;
		for (struct mstream *s = m.streams; s && n < MGR_POLL_MAX; s = s->next) {
			if (s->dead)
				continue;
			ps[n] = s;
			/* while node-api is behind, executions are not read (their output waits in their sockets) */
			pfd[n++] = (struct pollfd){.fd = s->gfd,
			                           .events = (short)((api_backlog ? 0 : POLLIN) |
			                                             (s->wq_off < s->wq.len ? POLLOUT : 0))};
		}
		int r = poll(pfd, n, 1000);
		if (r < 0 && errno != EINTR)
			break;
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
		if (r <= 0)
			continue;
		if (pfd[0].revents & POLLOUT)
			api_flush(&m);
		if ((pfd[0].revents & ~POLLOUT) && m.api_fd >= 0)
			api_readable(&m);
		if (pfd[1].revents & POLLIN)
			admin_accept(&m);
		for (int i = 0; i < MGR_MAX_ADMIN; i++)
			if (m.admin[i].fd >= 0 && pfd[2 + i].fd == m.admin[i].fd && pfd[2 + i].revents)
				admin_readable(&m, &m.admin[i]);
		for (nfds_t i = first_idle; i < first_stream; i++)
			if (pfd[i].revents)
				pool_drop_fd(&m, pfd[i].fd);
		for (nfds_t i = first_stream; i < n; i++) {
			struct mstream *s = ps[i];
			if ((pfd[i].revents & POLLOUT) && !s->dead && stream_flush(s) < 0) {
				send_fail(&m, s->id, SPACED_ECLOSED, "execution connection lost");
				stream_kill(s);
			}
			if ((pfd[i].revents & ~POLLOUT) && !s->dead && m.api_fd >= 0 && !api_backlog)
				guest_readable(&m, s);
		}
		streams_reap(&m);
	}
	free(pfd);
	free(ps);
	rc = 0;
out:
	for (struct mstream *s = m.streams; s; s = s->next)
		stream_kill(s);
	streams_reap(&m);
	pool_flush(&m, NULL, 0);
	for (int i = 0; i < MGR_MAX_ADMIN; i++)
		if (m.admin[i].fd >= 0)
			admin_drop(&m.admin[i]);
	if (m.admin_fd >= 0)
		close(m.admin_fd);
	if (m.api_fd >= 0)
		close(m.api_fd);
	spaced_buf_free(&m.api_rbuf);
	spaced_buf_free(&m.api_out);
	free(m.recs);
	spaced_vcache_free(m.vc);
	spaced_keyring_free(m.kr);
	mgr_store_close(m.store);
	return rc;
}
