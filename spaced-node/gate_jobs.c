/*
 * gate_jobs.c — the gate's side of the executor link (executor.h): jobs
 * queued, sent when the link takes them, completions matched to their job.
 *
 * What the gate takes on this link is in links.c's table: EXE_DONE, with
 * END, for a job in flight, at most one descriptor with it.
 *
 * Anything else — an unknown type, other flags, an id not in flight, a
 * malformed payload, more than one descriptor — ends the gate (the
 * supervisor starts the worker's processes again; the records are on disk).
 */
#include "executor.h"
#include "gate.h"
#include "links.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "spaced_error.h"

struct gjob {
	struct gjob *next;
	uint32_t id;
	gate_job_cb cb;
	uintptr_t ctx;
	bool forgotten;
	uint8_t *msg; /* the whole EXE_JOB message until sent */
	size_t len;
};

static void exe_update_poll(struct mgr *m);

static struct gjob *find_job(struct mgr *m, uint32_t id)
{
	for (struct gjob *j = m->jobs; j; j = j->next)
		if (j->id == id)
			return j;
	return NULL;
}

size_t gate_jobs_in_flight(const struct mgr *m)
{
	size_t n = 0;
	for (const struct gjob *j = m->jobs; j; j = j->next)
		n++;
	for (const struct gjob *j = m->jobq; j; j = j->next)
		n++;
	return n;
}

uint32_t gate_job(struct mgr *m, const char *kind, json_t *args, gate_job_cb cb, uintptr_t ctx)
{
	char *text = args ? json_dumps(args, JSON_COMPACT) : NULL;
	json_decref(args);
	struct gjob *j = calloc(1, sizeof *j);
	struct spaced_buf b;
	spaced_buf_init(&b, EXE_MSG_MAX);
	if (!text || !j)
		goto fail;
	do {
		j->id = ++m->next_job;
	} while (j->id == 0 || find_job(m, j->id));
	struct spaced_buf f;
	spaced_buf_init(&f, EXE_MSG_MAX - SPACED_FRAME_HDR_LEN);
	if (spaced_field_put_str(&f, kind) < 0 || spaced_field_put_str(&f, text) < 0 ||
	    spaced_frame_append(&b, EXE_JOB, 0, j->id, f.data, f.len) < 0) {
		spaced_buf_free(&f);
		goto fail;
	}
	spaced_buf_free(&f);
	j->cb = cb;
	j->ctx = ctx;
	j->forgotten = cb == NULL; /* nobody waits for it */
	j->msg = spaced_buf_take(&b, &j->len);
	free(text);
	*m->jobq_tail = j;
	m->jobq_tail = &j->next;
	exe_update_poll(m);
	return j->id;
fail:
	gate_log("level=error event=job-not-queued kind=%s", kind);
	spaced_buf_free(&b);
	free(text);
	free(j);
	return 0;
}

void gate_job_forget(struct mgr *m, uint32_t id)
{
	for (struct gjob *j = m->jobs; j; j = j->next)
		if (j->id == id)
			j->forgotten = true;
	for (struct gjob *j = m->jobq; j; j = j->next)
		if (j->id == id)
			j->forgotten = true;
}

/* Sends queued jobs while the link takes them. */
static void exe_flush(struct mgr *m)
{
	while (m->jobq) {
		struct gjob *j = m->jobq;
		ssize_t n = send(m->exe_fd, j->msg, j->len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		if (n != (ssize_t)j->len) {
			gate_quit(m, "the executor's link failed");
			return;
		}
		m->jobq = j->next;
		if (!m->jobq)
			m->jobq_tail = &m->jobq;
		free(j->msg);
		j->msg = NULL;
		j->next = m->jobs;
		m->jobs = j;
	}
}

static void exe_readable(struct mgr *m)
{
	uint8_t buf[EXE_MSG_MAX];
	for (int round = 0; round < 64; round++) {
		union {
			struct cmsghdr align;
			char b[CMSG_SPACE(sizeof(int) * 4)];
		} cb;
		struct iovec iov = {buf, sizeof buf};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b, .msg_controllen = sizeof cb.b};
		ssize_t n = recvmsg(m->exe_fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		int fds[4], nfds = 0;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); n > 0 && c; c = CMSG_NXTHDR(&mh, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int) && nfds < 4; i++)
				memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
		}
		struct spaced_frame_hdr h;
		bool ok = n >= SPACED_FRAME_HDR_LEN && !(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) && nfds <= 1 &&
		          spaced_frame_hdr_decode(&h, buf, EXE_MSG_MAX) == 0 && h.len == (size_t)n - SPACED_FRAME_HDR_LEN;
		struct gjob *j = ok ? find_job(m, h.id) : NULL;
		ok = ok && link_check(LINK_GATE, &h, j ? LINK_ID_INFLIGHT : LINK_ID_FREE) == LINK_HANDLE;
		struct spaced_field_reader rd;
		int64_t status = 0;
		const char *msg = NULL, *res = NULL;
		size_t ml = 0, rl = 0;
		if (j) {
			spaced_field_reader_init(&rd, buf + SPACED_FRAME_HDR_LEN, h.len);
			spaced_field_get_i64(&rd, &status);
			spaced_field_get_str(&rd, &msg, &ml);
			spaced_field_get_str(&rd, &res, &rl);
			ok = spaced_field_end(&rd) == 0 && status <= 0;
		}
		if (n == 0 || !ok || !j) {
			for (int i = 0; i < nfds; i++)
				close(fds[i]);
			gate_quit(m, n == 0 ? "the executor went away" : "protocol error from the executor");
			return;
		}
		/* out of the in-flight list before the callback (it may queue jobs) */
		for (struct gjob **pp = &m->jobs; *pp; pp = &(*pp)->next)
			if (*pp == j) {
				*pp = j->next;
				break;
			}
		int fd = nfds ? fds[0] : -1;
		if (j->forgotten) {
			if (fd >= 0)
				close(fd);
		} else {
			char *mcopy = strndup(msg, ml);
			json_error_t jerr;
			json_t *result = rl ? json_loadb(res, rl, JSON_REJECT_DUPLICATES, &jerr) : NULL;
			j->cb(m, j->ctx, (int)status, mcopy ? mcopy : "", result, fd);
			json_decref(result);
			free(mcopy);
		}
		free(j);
	}
}

static void on_exe(uv_poll_t *h, int status, int events)
{
	struct mgr *m = h->data;
	if (status < 0) {
		gate_quit(m, "the executor's link failed");
		return;
	}
	if (events & UV_WRITABLE)
		exe_flush(m);
	if (events & (UV_READABLE | UV_DISCONNECT))
		exe_readable(m);
	exe_update_poll(m);
}

static void exe_update_poll(struct mgr *m)
{
	if (!m->exe_poll_on || m->quit)
		return;
	uv_poll_start(&m->exe_poll, UV_READABLE | (m->jobq ? UV_WRITABLE : 0), on_exe);
}

int gate_jobs_start(struct mgr *m, int fd)
{
	m->exe_fd = fd;
	m->jobq_tail = &m->jobq;
	if (uv_poll_init(m->loop, &m->exe_poll, fd) < 0)
		return SPACED_ESYS;
	m->exe_poll.data = m;
	m->exe_poll_on = true;
	exe_update_poll(m);
	return 0;
}

void gate_jobs_stop(struct mgr *m)
{
	if (m->exe_poll_on) {
		uv_poll_stop(&m->exe_poll);
		uv_close((uv_handle_t *)&m->exe_poll, NULL);
		m->exe_poll_on = false;
	}
	while (m->jobs) {
		struct gjob *j = m->jobs;
		m->jobs = j->next;
		free(j);
	}
	while (m->jobq) {
		struct gjob *j = m->jobq;
		m->jobq = j->next;
		free(j->msg);
		free(j);
	}
	m->jobq_tail = &m->jobq;
}
