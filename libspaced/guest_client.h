/*
 * guest_client.h — a blocking client of the guest protocol (guest_proto.h),
 * used by tests, spaced-host and spaced-node.
 *
 * One client owns one connected stream socket. The synchronous helpers
 * (hello, fs_*, exec, proc_*) each run one request to completion and expect no
 * other stream to be open on the client; streams that stay open (terminal,
 * watch, concurrent exec + signal) use the raw send/recv calls. After every
 * RESULT the client remembers the identity text that came with it
 * (spaced_guest_client_identity), so callers can check who answered.
 */
#ifndef SPACED_GUEST_CLIENT_H
#define SPACED_GUEST_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "guest_proto.h"
#include "identity.h"
#include "util.h"

struct spaced_guest_client;

/* One received frame; payload is owned by the message (spaced_guest_msg_clear). */
struct spaced_guest_msg {
	struct spaced_frame_hdr hdr;
	uint8_t *payload;
};

struct spaced_guest_stat {
	uint32_t type; /* SPACED_GUEST_FT_* */
	uint64_t size;
	uint32_t mode; /* permission bits */
	int64_t mtime; /* Unix seconds */
};

struct spaced_guest_entry {
	const char *path; /* relative to the listed directory; valid during the callback */
	struct spaced_guest_stat st;
};

struct spaced_guest_exit {
	uint64_t proc;   /* guest process id (background start, STARTED) */
	int64_t pid;     /* the process's pid inside the guest */
	int64_t code;    /* exit code, -1 when killed by a signal */
	int64_t signal;  /* terminating signal or 0 */
	int timed_out;   /* 1 when the guest killed it at its timeout */
};

struct spaced_guest_proc {
	uint64_t proc;
	int64_t pid;
	int running;
	int64_t code;
	int64_t signal;
	const char *argv0; /* valid during the callback */
};

struct spaced_guest_exec_req {
	const char *const *argv; /* NULL-terminated, at least one element */
	const char *const *env;  /* NULL or NULL-terminated "K=V" list */
	const char *cwd;         /* NULL or "" for the root */
	uint64_t timeout_ms;     /* 0: none */
	uint32_t flags;          /* SPACED_GUEST_EXEC_* */
};

/* Connects to a Unix stream socket path. Returns 0, SPACED_EINVAL (path too
 * long), SPACED_ESYS, or SPACED_ENOMEM. */
int spaced_guest_client_connect(const char *path, struct spaced_guest_client **out);

/* Wraps an already connected socket; the client owns fd from now on (even on
 * failure it is closed). */
int spaced_guest_client_adopt(int fd, struct spaced_guest_client **out);

/* Closes the socket and frees; NULL is fine. */
void spaced_guest_client_free(struct spaced_guest_client *c);

/* The socket (for poll). */
int spaced_guest_client_fd(const struct spaced_guest_client *c);

/* The identity text of the last RESULT ("" before any). */
const char *spaced_guest_client_identity(const struct spaced_guest_client *c);

/* The message of the last failed RESULT ("" otherwise). */
const char *spaced_guest_client_errmsg(const struct spaced_guest_client *c);

/* A fresh request id. */
uint32_t spaced_guest_client_next_id(struct spaced_guest_client *c);

/* Raw frame I/O (blocking). recv returns SPACED_ECLOSED at end of stream. */
int spaced_guest_send(struct spaced_guest_client *c, uint16_t type, uint16_t flags, uint32_t id,
                      const void *payload, size_t len);
int spaced_guest_recv(struct spaced_guest_client *c, struct spaced_guest_msg *m);
void spaced_guest_msg_clear(struct spaced_guest_msg *m);

/* Parses the common head of a RESULT payload (status, message, identity),
 * stores message and identity in the client and leaves r positioned at the
 * extras. Returns the guest's status (0 or a negative SPACED_E*), or
 * SPACED_EPROTO when the payload is malformed. */
int spaced_guest_result_head(struct spaced_guest_client *c, const struct spaced_guest_msg *m,
                             struct spaced_field_reader *r);

/* HELLO: the serving execution's identity. */
int spaced_guest_hello(struct spaced_guest_client *c, struct spaced_identity *out);

/* FS_READ of [offset, offset+length) (length UINT64_MAX: to the end), appended
 * to out (bounded by out->max: SPACED_ETOOBIG, after which the connection is
 * unusable). */
int spaced_guest_fs_read(struct spaced_guest_client *c, const char *path, uint64_t offset,
                         uint64_t length, struct spaced_buf *out);

/* FS_WRITE: replaces path atomically with data[0..len), sent in chunks. */
int spaced_guest_fs_write(struct spaced_guest_client *c, const char *path, const void *data,
                          size_t len, uint32_t mode, uint32_t flags);

int spaced_guest_fs_stat(struct spaced_guest_client *c, const char *path,
                         struct spaced_guest_stat *out);
int spaced_guest_fs_mkdir(struct spaced_guest_client *c, const char *path, uint32_t mode);
int spaced_guest_fs_move(struct spaced_guest_client *c, const char *from, const char *to);
int spaced_guest_fs_remove(struct spaced_guest_client *c, const char *path, int recursive);

/* FS_LIST: calls cb for every entry down to depth levels; a non-zero return
 * from cb is remembered and returned after the stream ends. */
int spaced_guest_fs_list(struct spaced_guest_client *c, const char *path, uint32_t depth,
                         int (*cb)(void *arg, const struct spaced_guest_entry *e), void *arg);

/* Encodes an EXEC or TERM_OPEN body (TERM adds rows, cols instead of timeout/flags). */
int spaced_guest_encode_exec(struct spaced_buf *b, const struct spaced_guest_exec_req *req);
int spaced_guest_encode_term(struct spaced_buf *b, const struct spaced_guest_exec_req *req,
                             uint32_t rows, uint32_t cols);

/* EXEC to completion: stdin_data (when flags has SPACED_GUEST_EXEC_STDIN) is sent
 * first, then stdout/stderr are appended to out/err (either may be NULL to
 * discard) until the RESULT. For SPACED_GUEST_EXEC_BACKGROUND it returns at once
 * with res->proc set. */
int spaced_guest_exec(struct spaced_guest_client *c, const struct spaced_guest_exec_req *req,
                      const void *stdin_data, size_t stdin_len, struct spaced_buf *out,
                      struct spaced_buf *err, struct spaced_guest_exit *res);

/* Reads the extras of an exec-like RESULT (code, signal, timed_out). */
int spaced_guest_exit_parse(struct spaced_field_reader *r, struct spaced_guest_exit *res);

/* PROC_ATTACH: replays the kept output, then live output until the process ends. */
int spaced_guest_proc_attach(struct spaced_guest_client *c, uint64_t proc, struct spaced_buf *out,
                             struct spaced_buf *err, struct spaced_guest_exit *res);
int spaced_guest_proc_signal(struct spaced_guest_client *c, uint64_t proc, int sig);
int spaced_guest_proc_kill(struct spaced_guest_client *c, uint64_t proc);
int spaced_guest_proc_list(struct spaced_guest_client *c,
                           int (*cb)(void *arg, const struct spaced_guest_proc *p), void *arg);

#endif
