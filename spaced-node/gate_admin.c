/*
 * gate_admin.c — the worker's local admin socket, STATE/admin.sock: the
 * control messages of docs/control-messages.md, one JSON object per line each
 * way, for `spacectl node …`, tests and the link to the control plane (link.c). Root or the gate's own
 * user only (SO_PEERCRED). A client has one message in progress at a time: its
 * socket is not read again until that message's acknowledgement is written,
 * so answers come back in the order of the requests.
 *
 * A client that sends {"type":"events"} (the link does after each hello of
 * its control channel) also gets, on that connection, one line for each
 * execution that ended under its record: at once for every record in state
 * "ended", then as each one ends. The link carries these lines to the control
 * plane unchanged.
 */
#include "gate.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "spaced_error.h"

struct admin_client {
	struct mgr *m;
	int slot;
	uint64_t gen;
	int fd;
	uv_poll_t poll;
	unsigned busy; /* messages waiting for their acknowledgements */
	bool in_next; /* inside client_next (an acknowledgement may come at once) */
	bool events;  /* asked for events: ended executions are written to it */
	struct spaced_buf rbuf;
	struct spaced_buf wbuf;
	size_t woff;
};

static void client_update(struct admin_client *a);

static void client_close_cb(uv_handle_t *h)
{
	struct admin_client *a = h->data;
	spaced_buf_free(&a->rbuf);
	spaced_buf_free(&a->wbuf);
	free(a);
}

static void client_drop(struct admin_client *a)
{
	struct mgr *m = a->m;
	if (m->admin[a->slot] == a)
		m->admin[a->slot] = NULL;
	gate_ctl_forget_requester(m, ((uintptr_t)a->gen << 8) | (uintptr_t)a->slot);
	uv_poll_stop(&a->poll);
	close(a->fd);
	uv_close((uv_handle_t *)&a->poll, client_close_cb);
}

static struct admin_client *client_of(struct mgr *m, uintptr_t ctx)
{
	int slot = (int)(ctx & 0xff);
	struct admin_client *a = slot < GATE_MAX_ADMIN ? m->admin[slot] : NULL;
	return a && a->gen == (ctx >> 8) ? a : NULL;
}

/* Queues line and a newline for a; false when a was dropped (its output is full). */
static bool client_put(struct admin_client *a, const char *line)
{
	if (spaced_buf_puts(&a->wbuf, line) < 0 || spaced_buf_puts(&a->wbuf, "\n") < 0) {
		client_drop(a);
		return false;
	}
	return true;
}

/* The acknowledgement of one of the client's messages in progress; NULL:
 * that message ends without one (the same seq sent again is answered). */
static void on_reply(struct mgr *m, uintptr_t ctx, const char *line)
{
	struct admin_client *a = client_of(m, ctx);
	if (!a)
		return;
	if (line && !client_put(a, line))
		return;
	if (a->busy > 0)
		a->busy--;
	if (!a->in_next)
		client_update(a);
}

char *gate_admin_ended_line(const struct mgr_rec *rec, const char *reason)
{
	json_t *o = json_pack("{s:{s:o,s:s}}", "ended", "identity", spaced_identity_to_json(&rec->r.id), "reason",
	                      reason);
	char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	return line;
}

void gate_admin_ended(struct mgr *m, const struct mgr_rec *rec, const char *reason)
{
	char *line = gate_admin_ended_line(rec, reason);
	for (int i = 0; line && i < GATE_MAX_ADMIN; i++) {
		struct admin_client *a = m->admin[i];
		if (a && a->events && client_put(a, line) && !a->in_next)
			client_update(a);
	}
	free(line);
}

/* {"type":"events"} (nothing else): a asks for events. */
static bool events_request(const char *line, size_t len)
{
	json_error_t jerr;
	if (!memmem(line, len, "\"events\"", 8))
		return false;
	json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
	bool yes = json_is_object(o) && json_object_size(o) == 1 &&
	           json_is_string(json_object_get(o, "type")) &&
	           strcmp(json_string_value(json_object_get(o, "type")), "events") == 0;
	json_decref(o);
	return yes;
}

/* a asked for events: the executions that ended so far, then each new one. */
static bool events_start(struct admin_client *a)
{
	struct mgr *m = a->m;
	a->events = true;
	for (size_t i = 0; i < m->nrecs; i++) {
		const struct mgr_rec *r = &m->recs[i];
		if (strcmp(r->state, MGR_ST_ENDED) != 0)
			continue;
		char *line = gate_admin_ended_line(r, "ended under its record");
		bool kept = line && client_put(a, line);
		free(line);
		if (!kept)
			return false;
	}
	return true;
}

/* Hands the next complete line to the control operations. */
static void client_next(struct admin_client *a)
{
	if (a->in_next)
		return;
	a->in_next = true;
	while (a->busy < GATE_ADMIN_INFLIGHT && a->m->admin[a->slot] == a) {
		uint8_t *nl = a->rbuf.len ? memchr(a->rbuf.data, '\n', a->rbuf.len) : NULL;
		if (!nl)
			break;
		size_t len = (size_t)(nl - a->rbuf.data);
		char *line = strndup((const char *)a->rbuf.data, len);
		memmove(a->rbuf.data, nl + 1, a->rbuf.len - len - 1);
		a->rbuf.len -= len + 1;
		if (!line) {
			a->in_next = false;
			client_drop(a);
			return;
		}
		if (events_request(line, len)) {
			free(line);
			if (!events_start(a)) {
				a->in_next = false;
				return; /* dropped */
			}
			continue;
		}
		a->busy++;
		gate_ctl_submit(a->m, line, len, on_reply, ((uintptr_t)a->gen << 8) | (uintptr_t)a->slot);
		free(line);
	}
	a->in_next = false;
}

static void on_client(uv_poll_t *h, int status, int events)
{
	struct admin_client *a = h->data;
	if (status < 0) {
		client_drop(a);
		return;
	}
	if (events & UV_WRITABLE) {
		while (a->woff < a->wbuf.len) {
			ssize_t w = send(a->fd, a->wbuf.data + a->woff, a->wbuf.len - a->woff, MSG_NOSIGNAL | MSG_DONTWAIT);
			if (w < 0 && (errno == EAGAIN || errno == EINTR))
				break;
			if (w <= 0) {
				client_drop(a);
				return;
			}
			a->woff += (size_t)w;
		}
		if (a->woff == a->wbuf.len)
			a->wbuf.len = a->woff = 0;
	}
	if (events & (UV_READABLE | UV_DISCONNECT)) {
		uint8_t tmp[16384];
		ssize_t r = recv(a->fd, tmp, sizeof tmp, MSG_DONTWAIT);
		if (r < 0 && (errno == EAGAIN || errno == EINTR))
			goto out;
		if (r <= 0 || spaced_buf_append(&a->rbuf, tmp, (size_t)r) < 0) {
			client_drop(a);
			return;
		}
		client_next(a);
	}
out:
	if (a->m->admin[a->slot] == a)
		client_update(a);
}

static void client_update(struct admin_client *a)
{
	if (a->m->admin[a->slot] != a)
		return;
	client_next(a);
	if (a->m->admin[a->slot] != a)
		return;
	/* Several messages may be in progress at once (the link sends the
	 * control channel's messages without waiting): the operations of one
	 * sandbox still apply in the order they came (gate_ctl.c), those of
	 * different sandboxes side by side, and each acknowledgement goes back
	 * when its operation is done — so a client that sends one message at a
	 * time gets its answers in order. Reading stops at the bound. */
	int ev = (a->busy >= GATE_ADMIN_INFLIGHT ? 0 : UV_READABLE) | (a->woff < a->wbuf.len ? UV_WRITABLE : 0);
	if (ev)
		uv_poll_start(&a->poll, ev, on_client);
	else
		uv_poll_stop(&a->poll);
}

static void on_listen(uv_poll_t *h, int status, int events)
{
	struct mgr *m = h->data;
	(void)events;
	if (status < 0)
		return;
	for (;;) {
		int fd = accept4(m->admin_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0)
			return;
		struct ucred uc;
		socklen_t ul = sizeof uc;
		/* root only, or the user the gate runs as */
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) < 0 || (uc.uid != 0 && uc.uid != geteuid())) {
			close(fd);
			continue;
		}
		int slot = -1;
		for (int i = 0; i < GATE_MAX_ADMIN && slot < 0; i++)
			if (!m->admin[i])
				slot = i;
		struct admin_client *a = slot >= 0 ? calloc(1, sizeof *a) : NULL;
		if (!a || uv_poll_init(m->loop, &a->poll, fd) < 0) {
			free(a);
			close(fd);
			continue;
		}
		a->m = m;
		a->slot = slot;
		a->gen = ++m->admin_gen;
		a->fd = fd;
		a->poll.data = a;
		spaced_buf_init(&a->rbuf, GATE_ADMIN_LINE_MAX);
		spaced_buf_init(&a->wbuf, 4 * GATE_ADMIN_LINE_MAX);
		m->admin[slot] = a;
		client_update(a);
	}
}

int gate_admin_start(struct mgr *m)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char path[4096], tmp[4096];
	/* bound and listening under a temporary name, then renamed into place:
	 * whoever sees admin.sock can connect */
	snprintf(path, sizeof path, "%s/admin.sock", m->cfg->state_dir);
	snprintf(tmp, sizeof tmp, "%s/admin.sock.new", m->cfg->state_dir);
	if (strlen(tmp) >= sizeof sa.sun_path)
		return SPACED_EINVAL;
	memcpy(sa.sun_path, tmp, strlen(tmp) + 1);
	unlink(tmp);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return SPACED_ESYS;
	mode_t old = umask(077);
	int r = bind(fd, (struct sockaddr *)&sa, sizeof sa);
	umask(old);
	if (r < 0 || chmod(tmp, 0600) < 0 || listen(fd, 16) < 0 || rename(tmp, path) < 0 ||
	    uv_poll_init(m->loop, &m->admin_poll, fd) < 0) {
		close(fd);
		unlink(tmp);
		return SPACED_ESYS;
	}
	m->admin_fd = fd;
	m->admin_poll.data = m;
	m->admin_poll_on = true;
	uv_poll_start(&m->admin_poll, UV_READABLE, on_listen);
	return 0;
}

void gate_admin_stop(struct mgr *m)
{
	for (int i = 0; i < GATE_MAX_ADMIN; i++)
		if (m->admin[i])
			client_drop(m->admin[i]);
	if (m->admin_poll_on) {
		uv_poll_stop(&m->admin_poll);
		uv_close((uv_handle_t *)&m->admin_poll, NULL);
		m->admin_poll_on = false;
	}
	if (m->admin_fd >= 0)
		close(m->admin_fd);
	m->admin_fd = -1;
}
