/* guest_client.c — blocking client of the guest protocol (see guest_client.h). */
#include "guest_client.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "spaced_error.h"

#define RESULT_MSG_MAX 256

struct spaced_guest_client {
	int fd;
	uint32_t next_id;
	char identity[SPACED_IDENTITY_TEXT_MAX];
	char errmsg[RESULT_MSG_MAX];
};

int spaced_guest_client_adopt(int fd, struct spaced_guest_client **out)
{
	struct spaced_guest_client *c = calloc(1, sizeof *c);
	if (c == NULL) {
		close(fd);
		return SPACED_ENOMEM;
	}
	c->fd = fd;
	c->next_id = 1;
	*out = c;
	return SPACED_OK;
}

int spaced_guest_client_connect(const char *path, struct spaced_guest_client **out)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof sa.sun_path)
		return SPACED_EINVAL;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return SPACED_ESYS;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		close(fd);
		return SPACED_ESYS;
	}
	return spaced_guest_client_adopt(fd, out);
}

void spaced_guest_client_free(struct spaced_guest_client *c)
{
	if (c == NULL)
		return;
	if (c->fd >= 0)
		close(c->fd);
	free(c);
}

int spaced_guest_client_fd(const struct spaced_guest_client *c)
{
	return c->fd;
}

const char *spaced_guest_client_identity(const struct spaced_guest_client *c)
{
	return c->identity;
}

const char *spaced_guest_client_errmsg(const struct spaced_guest_client *c)
{
	return c->errmsg;
}

uint32_t spaced_guest_client_next_id(struct spaced_guest_client *c)
{
	uint32_t id = c->next_id++;
	if (c->next_id == 0)
		c->next_id = 1;
	return id;
}

int spaced_guest_send(struct spaced_guest_client *c, uint16_t type, uint16_t flags, uint32_t id,
                      const void *payload, size_t len)
{
	return spaced_frame_send(c->fd, type, flags, id, payload, len);
}

int spaced_guest_recv(struct spaced_guest_client *c, struct spaced_guest_msg *m)
{
	struct spaced_frame_hdr h;
	uint8_t *p = NULL;
	int r = spaced_frame_recv(c->fd, SPACED_FRAME_MAX, &h, &p);
	if (r < 0)
		return r;
	m->hdr = h;
	m->payload = p;
	return SPACED_OK;
}

void spaced_guest_msg_clear(struct spaced_guest_msg *m)
{
	if (m == NULL)
		return;
	free(m->payload);
	m->payload = NULL;
	memset(&m->hdr, 0, sizeof m->hdr);
}

int spaced_guest_result_head(struct spaced_guest_client *c, const struct spaced_guest_msg *m,
                             struct spaced_field_reader *r)
{
	int64_t status;
	char msg[RESULT_MSG_MAX];
	char ident[SPACED_IDENTITY_TEXT_MAX];
	if (m->hdr.type != SPACED_GUEST_OUT_RESULT || !(m->hdr.flags & SPACED_FRAME_F_END))
		return SPACED_EPROTO;
	spaced_field_reader_init(r, m->payload, m->hdr.len);
	if (spaced_field_get_i64(r, &status) < 0 || spaced_field_get_strbuf(r, msg, sizeof msg) < 0 ||
	    spaced_field_get_strbuf(r, ident, sizeof ident) < 0)
		return SPACED_EPROTO;
	if (status > 0 || status < -1000)
		return SPACED_EPROTO;
	memcpy(c->identity, ident, sizeof ident);
	memcpy(c->errmsg, msg, sizeof msg);
	return (int)status;
}

/* Sends a request and waits for its RESULT; frames of other types are errors
 * unless `other` accepts them. On success *res holds the RESULT frame (to be
 * cleared by the caller) and r is at its extras. */
typedef int (*other_fn)(void *arg, const struct spaced_guest_msg *m);

static int wait_result(struct spaced_guest_client *c, uint32_t id, other_fn other, void *arg,
                       struct spaced_guest_msg *res, struct spaced_field_reader *r)
{
	int cbr = 0;
	for (;;) {
		struct spaced_guest_msg m = {0};
		int e = spaced_guest_recv(c, &m);
		if (e < 0)
			return e;
		if (m.hdr.id != id) {
			spaced_guest_msg_clear(&m);
			return SPACED_EPROTO;
		}
		if (m.hdr.type == SPACED_GUEST_OUT_RESULT) {
			e = spaced_guest_result_head(c, &m, r);
			if (e < 0 || cbr < 0) {
				spaced_guest_msg_clear(&m);
				return e < 0 ? e : cbr;
			}
			*res = m;
			return SPACED_OK;
		}
		if (other == NULL) {
			spaced_guest_msg_clear(&m);
			return SPACED_EPROTO;
		}
		e = other(arg, &m);
		spaced_guest_msg_clear(&m);
		if (e == SPACED_EPROTO)
			return e;
		if (e < 0 && cbr == 0)
			cbr = e;
	}
}

/* Runs a request whose RESULT has no extras. */
static int simple(struct spaced_guest_client *c, uint16_t type, const struct spaced_buf *body)
{
	uint32_t id = spaced_guest_client_next_id(c);
	int e = spaced_guest_send(c, type, 0, id, body ? body->data : NULL, body ? body->len : 0);
	if (e < 0)
		return e;
	struct spaced_guest_msg m;
	struct spaced_field_reader r;
	e = wait_result(c, id, NULL, NULL, &m, &r);
	if (e < 0)
		return e;
	e = spaced_field_end(&r);
	spaced_guest_msg_clear(&m);
	return e;
}

int spaced_guest_hello(struct spaced_guest_client *c, struct spaced_identity *out)
{
	int e = simple(c, SPACED_GUEST_HELLO, NULL);
	if (e < 0)
		return e;
	struct spaced_identity id;
	e = spaced_identity_decode(&id, c->identity, strlen(c->identity));
	if (e < 0)
		return SPACED_EPROTO;
	*out = id;
	return SPACED_OK;
}

static int sink_buf(void *arg, const struct spaced_guest_msg *m)
{
	if (m->hdr.type != SPACED_GUEST_OUT_DATA)
		return SPACED_EPROTO;
	return spaced_buf_append(arg, m->payload, m->hdr.len);
}

int spaced_guest_fs_read(struct spaced_guest_client *c, const char *path, uint64_t offset,
                         uint64_t length, struct spaced_buf *out)
{
	struct spaced_buf b;
	spaced_buf_init(&b, SPACED_FRAME_MAX);
	int e = spaced_field_put_str(&b, path);
	if (e == 0)
		e = spaced_field_put_u64(&b, offset);
	if (e == 0)
		e = spaced_field_put_u64(&b, length);
	uint32_t id = spaced_guest_client_next_id(c);
	if (e == 0)
		e = spaced_guest_send(c, SPACED_GUEST_FS_READ, 0, id, b.data, b.len);
	spaced_buf_free(&b);
	if (e < 0)
		return e;
	struct spaced_guest_msg m;
	struct spaced_field_reader r;
	e = wait_result(c, id, sink_buf, out, &m, &r);
	if (e < 0)
		return e;
	spaced_guest_msg_clear(&m);
	return SPACED_OK;
}

int spaced_guest_fs_write(struct spaced_guest_client *c, const char *path, const void *data,
                          size_t len, uint32_t mode, uint32_t flags)
{
	struct spaced_buf b;
	spaced_buf_init(&b, SPACED_FRAME_MAX);
	int e = spaced_field_put_str(&b, path);
	if (e == 0)
		e = spaced_field_put_u64(&b, mode);
	if (e == 0)
		e = spaced_field_put_u64(&b, flags);
	uint32_t id = spaced_guest_client_next_id(c);
	if (e == 0)
		e = spaced_guest_send(c, SPACED_GUEST_FS_WRITE, 0, id, b.data, b.len);
	spaced_buf_free(&b);
	const uint8_t *p = data;
	size_t off = 0;
	while (e == 0) {
		size_t n = len - off > SPACED_FRAME_CHUNK ? SPACED_FRAME_CHUNK : len - off;
		int last = off + n == len;
		e = spaced_guest_send(c, SPACED_GUEST_IN_DATA, last ? SPACED_FRAME_F_END : 0, id,
		                      p + off, n);
		off += n;
		if (last)
			break;
	}
	if (e < 0)
		return e;
	struct spaced_guest_msg m;
	struct spaced_field_reader r;
	e = wait_result(c, id, NULL, NULL, &m, &r);
	if (e < 0)
		return e;
	spaced_guest_msg_clear(&m);
	return SPACED_OK;
}

static int stat_parse(struct spaced_field_reader *r, struct spaced_guest_stat *st)
{
	uint64_t type, size, mode;
	int64_t mtime;
	if (spaced_field_get_u64(r, &type) < 0 || spaced_field_get_u64(r, &size) < 0 ||
	    spaced_field_get_u64(r, &mode) < 0 || spaced_field_get_i64(r, &mtime) < 0)
		return SPACED_EPROTO;
	st->type = (uint32_t)type;
	st->size = size;
	st->mode = (uint32_t)mode;
	st->mtime = mtime;
	return SPACED_OK;
}

int spaced_guest_fs_stat(struct spaced_guest_client *c, const char *path,
                         struct spaced_guest_stat *out)
{
	struct spaced_buf b;
	spaced_buf_init(&b, SPACED_FRAME_MAX);
	int e = spaced_field_put_str(&b, path);
	uint32_t id = spaced_guest_client_next_id(c);
	if (e == 0)
		e = spaced_guest_send(c, SPACED_GUEST_FS_STAT, 0, id, b.data, b.len);
	spaced_buf_free(&b);
	if (e < 0)
		return e;
	struct spaced_guest_msg m;
	struct spaced_field_reader r;
	e = wait_result(c, id, NULL, NULL, &m, &r);
	if (e < 0)
		return e;
	struct spaced_guest_stat st;
	e = stat_parse(&r, &st);
	if (e == 0)
		e = spaced_field_end(&r);
	spaced_guest_msg_clear(&m);
	if (e == 0)
		*out = st;
	return e;
}

int spaced_guest_fs_mkdir(struct spaced_guest_client *c, const char *path, uint32_t mode)
{
	struct spaced_buf b;
	spaced_buf_init(&b, SPACED_FRAME_MAX);
	int e = spaced_field_put_str(&b, path);
	if (e == 0)
		e = spaced_field_put_u64(&b, mode);
	if (e == 0)
		e = simple(c, SPACED_GUEST_FS_MKDIR, &b);
	spaced_buf_free(&b);
	return e;
}

int spaced_guest_fs_move(struct spaced_guest_client *c, const char *from, const char *to)
{
	struct spaced_buf b;
	spaced_buf_init(&b, SPACED_FRAME_MAX);
	int e = spaced_field_put_str(&b, from);
	if (e == 0)
		e = spaced_field_put_str(&b, to);
	if (e == 0)
		e = simple(c, SPACED_GUEST_FS_MOVE, &b);
	spaced_buf_free(&b);
	return e;
}

int spaced_guest_fs_remove(struct spaced_guest_client *c, const char *path, int recursive)
{
	struct spaced_buf b;
	spaced_buf_init(&b, SPACED_FRAME_MAX);
	int e = spaced_field_put_str(&b, path);
	if (e == 0)
		e = spaced_field_put_u64(&b, recursive ? 1 : 0);
	if (e == 0)
		e = simple(c, SPACED_GUEST_FS_REMOVE, &b);
	spaced_buf_free(&b);
	return e;
}

struct list_ctx {
	int (*cb)(void *arg, const struct spaced_guest_entry *e);
	void *arg;
};

static int list_frame(void *arg, const struct spaced_guest_msg *m)
{
	struct list_ctx *lc = arg;
	if (m->hdr.type != SPACED_GUEST_OUT_ENTRIES)
		return SPACED_EPROTO;
	struct spaced_field_reader r;
	spaced_field_reader_init(&r, m->payload, m->hdr.len);
	int cbr = 0;
	while (spaced_field_more(&r)) {
		char *path = NULL;
		struct spaced_guest_entry en;
		if (spaced_field_get_strdup(&r, SPACED_GUEST_PATH_MAX, &path) < 0)
			return SPACED_EPROTO;
		if (stat_parse(&r, &en.st) < 0) {
			free(path);
			return SPACED_EPROTO;
		}
		en.path = path;
		if (cbr == 0)
			cbr = lc->cb(lc->arg, &en);
		free(path);
	}
	if (spaced_field_end(&r) < 0)
		return SPACED_EPROTO;
	return cbr;
}

int spaced_guest_fs_list(struct spaced_guest_client *c, const char *path, uint32_t depth,
                         int (*cb)(void *arg, const struct spaced_guest_entry *e), void *arg)
{
	struct spaced_buf b;
	spaced_buf_init(&b, SPACED_FRAME_MAX);
	int e = spaced_field_put_str(&b, path);
	if (e == 0)
		e = spaced_field_put_u64(&b, depth);
	uint32_t id = spaced_guest_client_next_id(c);
	if (e == 0)
		e = spaced_guest_send(c, SPACED_GUEST_FS_LIST, 0, id, b.data, b.len);
	spaced_buf_free(&b);
	if (e < 0)
		return e;
	struct list_ctx lc = {cb, arg};
	struct spaced_guest_msg m;
	struct spaced_field_reader r;
	e = wait_result(c, id, list_frame, &lc, &m, &r);
	if (e < 0)
		return e;
	spaced_guest_msg_clear(&m);
	return SPACED_OK;
}

static int put_list(struct spaced_buf *b, const char *const *v)
{
	uint64_t n = 0;
	while (v != NULL && v[n] != NULL)
		n++;
	int e = spaced_field_put_u64(b, n);
	for (uint64_t i = 0; e == 0 && i < n; i++)
		e = spaced_field_put_str(b, v[i]);
	return e;
}

static int encode_cmd(struct spaced_buf *b, const struct spaced_guest_exec_req *req)
{
	if (req->argv == NULL || req->argv[0] == NULL)
		return SPACED_EINVAL;
	int e = put_list(b, req->argv);
	if (e == 0)
		e = put_list(b, req->env);
	if (e == 0)
		e = spaced_field_put_str(b, req->cwd ? req->cwd : "");
	return e;
}

int spaced_guest_encode_exec(struct spaced_buf *b, const struct spaced_guest_exec_req *req)
{
	int e = encode_cmd(b, req);
	if (e == 0)
		e = spaced_field_put_u64(b, req->timeout_ms);
	if (e == 0)
		e = spaced_field_put_u64(b, req->flags);
	return e;
}

int spaced_guest_encode_term(struct spaced_buf *b, const struct spaced_guest_exec_req *req,
                             uint32_t rows, uint32_t cols)
{
	int e = encode_cmd(b, req);
	if (e == 0)
		e = spaced_field_put_u64(b, rows);
	if (e == 0)
		e = spaced_field_put_u64(b, cols);
	return e;
}

int spaced_guest_exit_parse(struct spaced_field_reader *r, struct spaced_guest_exit *res)
{
	int64_t code, sig;
	uint64_t to;
	if (spaced_field_get_i64(r, &code) < 0 || spaced_field_get_i64(r, &sig) < 0 ||
	    spaced_field_get_u64(r, &to) < 0 || spaced_field_end(r) < 0)
		return SPACED_EPROTO;
	res->code = code;
	res->signal = sig;
	res->timed_out = to ? 1 : 0;
	return SPACED_OK;
}

struct out_ctx {
	struct spaced_buf *out, *err;
	struct spaced_guest_exit *res;
};

static int out_frame(void *arg, const struct spaced_guest_msg *m)
{
	struct out_ctx *oc = arg;
	struct spaced_field_reader r;
	uint64_t proc, pid;
	switch (m->hdr.type) {
	case SPACED_GUEST_OUT_STDOUT:
		return oc->out ? spaced_buf_append(oc->out, m->payload, m->hdr.len) : 0;
	case SPACED_GUEST_OUT_STDERR:
		return oc->err ? spaced_buf_append(oc->err, m->payload, m->hdr.len) : 0;
	case SPACED_GUEST_OUT_STARTED:
		spaced_field_reader_init(&r, m->payload, m->hdr.len);
		if (spaced_field_get_u64(&r, &proc) < 0 || spaced_field_get_u64(&r, &pid) < 0 ||
		    spaced_field_end(&r) < 0)
			return SPACED_EPROTO;
		oc->res->proc = proc;
		oc->res->pid = (int64_t)pid;
		return 0;
	default:
		return SPACED_EPROTO;
	}
}

static int run_output(struct spaced_guest_client *c, uint32_t id, struct spaced_buf *out,
                      struct spaced_buf *err, struct spaced_guest_exit *res, int background)
{
	struct spaced_guest_exit x = {0};
	struct out_ctx oc = {out, err, &x};
	struct spaced_guest_msg m;
	struct spaced_field_reader r;
	int e = wait_result(c, id, out_frame, &oc, &m, &r);
	if (e < 0)
		return e;
	if (background) {
		uint64_t proc = 0, pid = 0;
		if (spaced_field_get_u64(&r, &proc) < 0 || spaced_field_get_u64(&r, &pid) < 0 ||
		    spaced_field_end(&r) < 0)
			e = SPACED_EPROTO;
		x.proc = proc;
		x.pid = (int64_t)pid;
	} else {
		e = spaced_guest_exit_parse(&r, &x);
	}
	spaced_guest_msg_clear(&m);
	if (e == 0)
		*res = x;
	return e;
}

int spaced_guest_exec(struct spaced_guest_client *c, const struct spaced_guest_exec_req *req,
                      const void *stdin_data, size_t stdin_len, struct spaced_buf *out,
                      struct spaced_buf *err, struct spaced_guest_exit *res)
{
	struct spaced_buf b;
	spaced_buf_init(&b, SPACED_FRAME_MAX);
	int e = spaced_guest_encode_exec(&b, req);
	uint32_t id = spaced_guest_client_next_id(c);
	if (e == 0)
		e = spaced_guest_send(c, SPACED_GUEST_EXEC, 0, id, b.data, b.len);
	spaced_buf_free(&b);
	if (e == 0 && (req->flags & SPACED_GUEST_EXEC_STDIN)) {
		const uint8_t *p = stdin_data;
		size_t off = 0;
		for (;;) {
			size_t n = stdin_len - off > SPACED_FRAME_CHUNK ? SPACED_FRAME_CHUNK : stdin_len - off;
			int last = off + n == stdin_len;
			e = spaced_guest_send(c, SPACED_GUEST_IN_STDIN, last ? SPACED_FRAME_F_END : 0, id,
			                      p ? p + off : NULL, n);
			off += n;
			if (e < 0 || last)
				break;
		}
	}
	if (e < 0)
		return e;
	return run_output(c, id, out, err, res, (req->flags & SPACED_GUEST_EXEC_BACKGROUND) != 0);
}

int spaced_guest_proc_attach(struct spaced_guest_client *c, uint64_t proc, struct spaced_buf *out,
                             struct spaced_buf *err, struct spaced_guest_exit *res)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 64);
	int e = spaced_field_put_u64(&b, proc);
	uint32_t id = spaced_guest_client_next_id(c);
	if (e == 0)
		e = spaced_guest_send(c, SPACED_GUEST_PROC_ATTACH, 0, id, b.data, b.len);
	spaced_buf_free(&b);
	if (e < 0)
		return e;
	return run_output(c, id, out, err, res, 0);
}

int spaced_guest_proc_signal(struct spaced_guest_client *c, uint64_t proc, int sig)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 64);
	int e = spaced_field_put_u64(&b, proc);
	if (e == 0)
		e = spaced_field_put_i64(&b, sig);
	if (e == 0)
		e = simple(c, SPACED_GUEST_PROC_SIGNAL, &b);
	spaced_buf_free(&b);
	return e;
}

int spaced_guest_proc_kill(struct spaced_guest_client *c, uint64_t proc)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 64);
	int e = spaced_field_put_u64(&b, proc);
	if (e == 0)
		e = simple(c, SPACED_GUEST_PROC_KILL, &b);
	spaced_buf_free(&b);
	return e;
}

struct procs_ctx {
	int (*cb)(void *arg, const struct spaced_guest_proc *p);
	void *arg;
};

static int procs_frame(void *arg, const struct spaced_guest_msg *m)
{
	struct procs_ctx *pc = arg;
	if (m->hdr.type != SPACED_GUEST_OUT_PROCS)
		return SPACED_EPROTO;
	struct spaced_field_reader r;
	spaced_field_reader_init(&r, m->payload, m->hdr.len);
	int cbr = 0;
	while (spaced_field_more(&r)) {
		uint64_t proc, pid, running;
		int64_t code, sig;
		char *argv0 = NULL;
		if (spaced_field_get_u64(&r, &proc) < 0 || spaced_field_get_u64(&r, &pid) < 0 ||
		    spaced_field_get_u64(&r, &running) < 0 || spaced_field_get_i64(&r, &code) < 0 ||
		    spaced_field_get_i64(&r, &sig) < 0 ||
		    spaced_field_get_strdup(&r, SPACED_GUEST_PATH_MAX, &argv0) < 0)
			return SPACED_EPROTO;
		struct spaced_guest_proc p = {proc, (int64_t)pid, running ? 1 : 0, code, sig, argv0};
		if (cbr == 0)
			cbr = pc->cb(pc->arg, &p);
		free(argv0);
	}
	if (spaced_field_end(&r) < 0)
		return SPACED_EPROTO;
	return cbr;
}

int spaced_guest_proc_list(struct spaced_guest_client *c,
                           int (*cb)(void *arg, const struct spaced_guest_proc *p), void *arg)
{
	uint32_t id = spaced_guest_client_next_id(c);
	int e = spaced_guest_send(c, SPACED_GUEST_PROC_LIST, 0, id, NULL, 0);
	if (e < 0)
		return e;
	struct procs_ctx pc = {cb, arg};
	struct spaced_guest_msg m;
	struct spaced_field_reader r;
	e = wait_result(c, id, procs_frame, &pc, &m, &r);
	if (e < 0)
		return e;
	spaced_guest_msg_clear(&m);
	return SPACED_OK;
}
