/* qmp.c — a blocking QMP client with bounded lines and deadlines (qmp.h). */
#include "qmp.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "spaced_error.h"
#include "util.h"

struct qmp {
	int fd;
	uint64_t next_id;
	size_t len;              /* bytes in buf */
	char buf[QMP_LINE_MAX + 1];
};

static int ms_left(uint64_t deadline)
{
	uint64_t now = spaced_mono_ns();
	if (now >= deadline)
		return 0;
	uint64_t ms = (deadline - now) / 1000000u + 1;
	return ms > 60000000u ? 60000000 : (int)ms;
}

/* Takes one complete line out of the buffer into *line (a new JSON object).
 * Returns 1 with a line, 0 when none is complete yet, or an error. */
static int take_line(struct qmp *q, json_t **line)
{
	char *nl = memchr(q->buf, '\n', q->len);
	if (nl == NULL)
		return q->len >= QMP_LINE_MAX ? SPACED_ETOOBIG : 0;
	size_t n = (size_t)(nl - q->buf);
	json_error_t jerr;
	json_t *o = json_loadb(q->buf, n, JSON_REJECT_DUPLICATES, &jerr);
	memmove(q->buf, nl + 1, q->len - n - 1);
	q->len -= n + 1;
	if (o == NULL || !json_is_object(o)) {
		json_decref(o);
		return SPACED_EPROTO;
	}
	*line = o;
	return 1;
}

/* Reads what is there (waiting up to ms, 0: not at all). Returns the bytes
 * read (> 0), 0 when nothing came in time, SPACED_ECLOSED. */
static int fill(struct qmp *q, int ms)
{
	struct pollfd p = {.fd = q->fd, .events = POLLIN};
	int r = poll(&p, 1, ms);
	if (r < 0)
		return errno == EINTR ? 0 : SPACED_ECLOSED;
	if (r == 0)
		return 0;
	ssize_t n = recv(q->fd, q->buf + q->len, QMP_LINE_MAX - q->len, MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return 0;
	if (n <= 0)
		return SPACED_ECLOSED;
	q->len += (size_t)n;
	return (int)n;
}

/* The next line, waiting until deadline. */
static int next_line(struct qmp *q, uint64_t deadline, json_t **line)
{
	for (;;) {
		int r = take_line(q, line);
		if (r != 0)
			return r < 0 ? r : 0;
		int left = ms_left(deadline);
		if (left == 0)
			return SPACED_ETIMEDOUT;
		if ((r = fill(q, left)) < 0)
			return r;
	}
}

static int send_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return SPACED_ECLOSED;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int qmp_open(const char *path, int timeout_ms, struct qmp **out)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof sa.sun_path)
		return SPACED_EINVAL;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	uint64_t deadline = spaced_mono_ns() + (uint64_t)timeout_ms * 1000000u;
	for (;;) {
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return SPACED_ESYS;
		if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
			int left = ms_left(deadline);
			return qmp_adopt(fd, left ? left : 1, out);
		}
		close(fd);
		if (ms_left(deadline) == 0)
			return SPACED_ETIMEDOUT;
		struct timespec ts = {0, 20 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
}

int qmp_adopt(int fd, int timeout_ms, struct qmp **out)
{
	uint64_t deadline = spaced_mono_ns() + (uint64_t)timeout_ms * 1000000u;
	struct qmp *q = calloc(1, sizeof *q);
	int e;
	if (q == NULL) {
		close(fd);
		return SPACED_ENOMEM;
	}
	q->fd = fd;
	json_t *greeting = NULL;
	if ((e = next_line(q, deadline, &greeting)) < 0)
		goto fail;
	bool ok = json_is_object(json_object_get(greeting, "QMP"));
	json_decref(greeting);
	if (!ok) {
		e = SPACED_EPROTO;
		goto fail;
	}
	char why[160];
	if ((e = qmp_exec(q, "qmp_capabilities", NULL, ms_left(deadline) ? ms_left(deadline) : 1, NULL, why,
	                  sizeof why)) < 0)
		goto fail;
	*out = q;
	return 0;
fail:
	qmp_close(q);
	return e;
}

/* Sends the first byte of p with fd attached (SCM_RIGHTS), then the rest. */
static int send_with_fd(int sock, const char *p, size_t n, int fd)
{
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} cb;
	struct iovec iov = {.iov_base = (void *)(uintptr_t)p, .iov_len = 1};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b, .msg_controllen = sizeof cb.b};
	memset(&cb, 0, sizeof cb);
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof fd);
	ssize_t w;
	while ((w = sendmsg(sock, &mh, MSG_NOSIGNAL)) < 0 && errno == EINTR)
		;
	if (w != 1)
		return SPACED_ECLOSED;
	return send_all(sock, p + 1, n - 1);
}

int qmp_exec(struct qmp *q, const char *cmd, json_t *args, int timeout_ms, json_t **ret, char *why,
             size_t whysz)
{
	return qmp_exec_fd(q, cmd, args, -1, timeout_ms, ret, why, whysz);
}

int qmp_exec_fd(struct qmp *q, const char *cmd, json_t *args, int fd, int timeout_ms, json_t **ret, char *why,
                size_t whysz)
{
	uint64_t id = ++q->next_id;
	json_t *msg = json_pack("{s:s,s:I}", "execute", cmd, "id", (json_int_t)id);
	if (msg != NULL && args != NULL && json_object_set_new(msg, "arguments", args) < 0) {
		json_decref(msg);
		return SPACED_ENOMEM;
	}
	if (msg == NULL) {
		json_decref(args);
		return SPACED_ENOMEM;
	}
	char *text = json_dumps(msg, JSON_COMPACT);
	json_decref(msg);
	if (text == NULL)
		return SPACED_ENOMEM;
	size_t tl = strlen(text);
	int e = fd >= 0 ? send_with_fd(q->fd, text, tl, fd) : send_all(q->fd, text, tl);
	if (e == 0)
		e = send_all(q->fd, "\n", 1);
	free(text);
	if (e < 0)
		return e;
	uint64_t deadline = spaced_mono_ns() + (uint64_t)timeout_ms * 1000000u;
	for (;;) {
		json_t *line = NULL;
		if ((e = next_line(q, deadline, &line)) < 0)
			return e;
		json_t *jid = json_object_get(line, "id");
		if (json_object_get(line, "event") != NULL || !json_is_integer(jid) ||
		    (uint64_t)json_integer_value(jid) != id) {
			json_decref(line); /* an event, or the late answer of an earlier command */
			continue;
		}
		json_t *err = json_object_get(line, "error");
		if (err != NULL) {
			const char *d = json_string_value(json_object_get(err, "desc"));
			spaced_why(why, whysz, "%s: %s", cmd, d ? d : "error");
			json_decref(line);
			return SPACED_EPERM;
		}
		json_t *r = json_object_get(line, "return");
		if (r == NULL) {
			json_decref(line);
			return SPACED_EPROTO;
		}
		if (ret != NULL)
			*ret = json_incref(r);
		json_decref(line);
		return 0;
	}
}

int qmp_drain(struct qmp *q)
{
	for (;;) {
		json_t *line = NULL;
		int r = take_line(q, &line);
		if (r < 0)
			return r;
		if (r == 1) {
			json_decref(line);
			continue;
		}
		if ((r = fill(q, 0)) < 0)
			return r;
		if (r == 0)
			return 0;
	}
}

int qmp_fd(const struct qmp *q)
{
	return q->fd;
}

void qmp_close(struct qmp *q)
{
	if (q == NULL)
		return;
	if (q->fd >= 0)
		close(q->fd);
	free(q);
}
