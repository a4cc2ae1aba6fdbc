/*
 * guest.h — private header of spaced-guest, the agent inside an execution.
 *
 * One poll() loop (main.c), and one helper thread that runs large uploads'
 * direct writes meanwhile (writer.c). Connections (conn.c) carry frames;
 * each request opens a stream on its connection; file operations (fs.c),
 * processes and terminals (proc.c) and watches (watch.c) hang off streams.
 * Objects that die during an iteration are only marked and reclaimed at its end.
 */
#ifndef SPACED_GUEST_H
#define SPACED_GUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "frame.h"
#include "guest_proto.h"
#include "identity.h"
#include "util.h"

#define GUEST_MAX_CONNS 128
#define GUEST_MAX_STREAMS 256     /* per connection */
#define GUEST_MAX_BG 64           /* background processes kept */
#define GUEST_OUT_HIGH (1u << 20) /* stop producing for a connection above this */
#define GUEST_STDIN_HIGH (256u * 1024)
#define GUEST_SPLICE_MIN (16u * 1024) /* output sent without a copy from this much on */
#define GUEST_LIST_DEPTH_MAX 64
#define GUEST_WATCH_MAX 8192 /* directories per watch */
#define GUEST_INBUF 4096      /* per-connection input buffer */

struct outbuf {
	struct outbuf *next;
	size_t len, off;
	uint8_t data[];
};

struct ring {
	uint8_t *buf; /* SPACED_GUEST_RING bytes, allocated on first use */
	size_t start, len;
};

enum stream_kind { ST_READ, ST_WRITE, ST_EXEC, ST_ATTACH, ST_TERM, ST_WATCH };

struct conn;
struct proc;
struct watch;

/* A direct write handed to the writer thread (writer.c): fd, p[0..n) at off.
 * busy until it is done; err is then 0 or the errno of the failed pwrite. */
struct wjob {
	struct wjob *next;
	int fd;
	const uint8_t *p;
	size_t n;
	uint64_t off;
	bool busy;
	int err;
};

struct stream {
	struct stream *next;
	struct conn *conn;
	uint32_t id;
	enum stream_kind kind;
	bool dead;
	/* ST_READ */
	int fd;
	uint64_t remaining, sent, offset, fsize;
	/* ST_WRITE */
	int dirfd;
	char *name;
	char tmpname[48];
	uint64_t written;  /* bytes received; the file holds written - dlen */
	uint8_t *dbuf[2];  /* a large upload's staging for direct writes (fs.c) */
	int dcur;          /* the one being filled; the other may be in job */
	size_t dlen;       /* bytes staged in dbuf[dcur] */
	bool direct_tried; /* the switch to direct writes was made or refused */
	struct wjob job;   /* the other buffer's write, handed over */
	bool job_pending;  /* job's result not taken yet (writer_wait) */
	/* ST_EXEC, ST_ATTACH, ST_TERM */
	struct proc *proc;
	/* ST_WATCH */
	struct watch *watch;
};

struct conn {
	struct conn *next;
	int fd;
	bool dead;
	uint8_t *ib; /* GUEST_INBUF bytes of input, allocated on first read */
	size_t ib_off, ib_len;
	struct spaced_frame_hdr hdr; /* of the large frame being read into payload */
	uint8_t *payload;
	size_t pay_got;
	bool in_payload;
	struct outbuf *oq_head, *oq_tail;
	size_t oq_bytes;
	bool wblocked; /* a send found its socket full: what waits in pipes and files
	                * for it waits for POLLOUT (conn_send_from_fd) */
	struct stream *streams;
	unsigned nstreams;
	bool rd_eof; /* the peer half-closed: answer what is in flight, then close */
};

struct proc {
	struct proc *next;
	uint64_t id;
	pid_t pid;
	bool background, pty, exited, timed_out, forget, done;
	int status; /* waitpid status once exited */
	int in_fd, out_fd, err_fd;
	uint8_t *inq;
	size_t inq_len, inq_off;
	bool in_close; /* close stdin once inq drains */
	struct ring ring_out, ring_err;
	struct stream *attached;
	uint64_t deadline_ns; /* 0: none */
	char argv0[64];
};

struct guest {
	int rootfd;
	char root[4096];
	bool have_identity;
	char identity[SPACED_IDENTITY_TEXT_MAX];
	int listen_fd, control_fd, sig_fd;
	int vctl_fd; /* the vsock control port's listener (vctl.c), -1 when none */
	int oom_fd;  /* its own /proc/PID/oom_score_adj, opened by the launcher before
	              * the exec (--oom-fd; -1: opened when written, as in a VM) */
	bool pid1;
	struct conn *conns;
	unsigned nconns;
	struct proc *procs;
	uint64_t next_proc;
	bool quit;
	int exit_code;
	bool service_ports; /* CONN for other ports than the API port: forward */
	/* the sandbox's settings (CONFIG from the launcher: its template's ENV,
	 * WORKDIR and USER, its create-time environment): what every command
	 * starts with unless its request says otherwise */
	char **cfg_env;      /* "K=V" entries, NULL-terminated, or NULL */
	char cfg_workdir[4096];
	char cfg_user[256];
};

extern struct guest G;

/* vctl.c: the control port of a guest inside a microVM (see there). */
int vctl_listen(unsigned port);
void vctl_accept(void);
void vctl_on_readable(int fd);
/* Calls add(fd) for every open control connection. */
void vctl_poll_add(void (*add)(int fd));

/* main.c: one structured line on stderr; guest_log only with --verbose,
 * guest_warn always (a peer broke the protocol and was dropped). */
void guest_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void guest_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* conn.c */
int conn_new(int fd);
void conn_on_readable(struct conn *c);
/* True when buffered input holds a whole frame (or a bad header) to handle. */
bool conn_has_input(const struct conn *c);
/* Handles buffered whole frames (at most 64 per call). */
void conn_parse(struct conn *c);
void conn_on_writable(struct conn *c);
/* After a clean end of input: ends the streams that wait for input. */
void conn_end_input(struct conn *c);
/* True once a half-closed connection has nothing left to answer. */
bool conn_done(const struct conn *c);
void conn_kill(struct conn *c, const char *why);
int conn_queue_frame(struct conn *c, uint16_t type, uint16_t flags, uint32_t id,
                     const void *p, size_t n);
/* An output frame with room for n payload bytes at data + SPACED_FRAME_HDR_LEN
 * (NULL when n is too large or memory is short); commit queues it with its
 * final length (<= n) or frees it when the connection is gone. */
struct outbuf *conn_frame_alloc(size_t n);
int conn_frame_commit(struct conn *c, struct outbuf *o, uint16_t type, uint16_t flags, uint32_t id,
                      size_t n);
/* Sends a frame of n payload bytes taken from fd without copying them
 * through the guest: spliced from a pipe (off NULL), or sent from a regular
 * file at *off (advanced). Only when nothing is queued on c; what the socket
 * does not take at once is read from fd and queued, so the frame is whole
 * either way. fd must hold n bytes: a pipe only this process reads, with n
 * available (FIONREAD); a file at least *off + n long. Returns n, 0 when
 * nothing was done (something queued; or the socket full, and c->wblocked set
 * until it is writable), or
 * -1 when c was killed (write failed, or fd held fewer bytes). */
ssize_t conn_send_from_fd(struct conn *c, uint16_t type, uint32_t id, int fd, off_t *off, size_t n);
struct stream *stream_new(struct conn *c, uint32_t id, enum stream_kind kind);
/* Sends RESULT (status, message, identity, extras) and ends the stream. */
void stream_finish(struct stream *s, int status, const char *msg, const struct spaced_buf *extras);
/* Releases what the stream holds (files, process attachment, watch) once. */
void stream_cleanup(struct stream *s, bool conn_gone);
void guest_reap_dead(void);
int errno_to_spaced(int e);
/* Sends a RESULT for a request that opened no stream. */
void reply_result(struct conn *c, uint32_t id, int status, const char *msg,
                  const struct spaced_buf *extras);

/* fs.c */
int fs_resolve(const char *path, int flags, mode_t mode, int *out);

/* proc.c: takes the sandbox's settings {"env": {K: V} | ["K=V"…], "workdir":
 * D, "user": U} (a CONFIG message). Returns 0 or -1 (malformed: nothing
 * changes). */
int proc_config(const char *json, size_t len);
int fs_read_start(struct conn *c, uint32_t id, struct spaced_field_reader *r);
void fs_read_pump(struct stream *s);
/* True when fs_read_pump can make progress now (else it waits for its
 * connection's POLLOUT). */
bool fs_read_ready(const struct stream *s);
int fs_write_start(struct conn *c, uint32_t id, struct spaced_field_reader *r);
/* writer.c: queue j for the writer thread (started on first use); 0, or a
 * negative errno when the thread cannot start (the caller writes itself) */
int writer_submit(struct wjob *j);
/* Blocks until j is done; its err. */
int writer_wait(struct wjob *j);
void fs_write_data(struct stream *s, const uint8_t *p, size_t n, bool end);
void fs_write_abort(struct stream *s);
int fs_list(struct conn *c, uint32_t id, struct spaced_field_reader *r);
int fs_stat(struct conn *c, uint32_t id, struct spaced_field_reader *r);
int fs_mkdir(struct conn *c, uint32_t id, struct spaced_field_reader *r);
int fs_move(struct conn *c, uint32_t id, struct spaced_field_reader *r);
int fs_remove(struct conn *c, uint32_t id, struct spaced_field_reader *r);

/* proc.c */
int proc_exec(struct conn *c, uint32_t id, struct spaced_field_reader *r, bool term);
void proc_list(struct conn *c, uint32_t id);
void proc_attach(struct conn *c, uint32_t id, uint64_t procid);
void proc_signal(struct conn *c, uint32_t id, uint64_t procid, int64_t sig);
void proc_kill(struct conn *c, uint32_t id, uint64_t procid);
void proc_stdin(struct stream *s, const uint8_t *p, size_t n, bool end);
/* Sends sig to the process group of the stream's running foreground command
 * (nothing once it has exited: its group id may belong to someone else). */
void proc_signal_stream(struct stream *s, int sig);
void proc_resize(struct stream *s, uint64_t rows, uint64_t cols);
void proc_detach_stream(struct stream *s, bool kill_fg);
void proc_on_sigchld(void);
void proc_on_output(struct proc *p, int fd);
void proc_on_stdin_writable(struct proc *p);
void proc_check_timeouts(uint64_t now);
uint64_t proc_next_deadline(void);
void proc_reap_done(void);
bool proc_output_allowed(const struct proc *p);
/* On exit: kills the process group of every process still running. */
void proc_kill_all(void);

/* watch.c */
int watch_start(struct conn *c, uint32_t id, struct spaced_field_reader *r);
void watch_on_readable(struct watch *w);
void watch_free(struct watch *w);
int watch_fd(const struct watch *w);

/* A listening AF_VSOCK socket on port of any local CID (non-blocking,
 * close-on-exec; a microVM's guest), or SPACED_ESYS. (main.c) */
int guest_vsock_listen(unsigned port, int backlog);

/* fwd.c (opt-in ServicePort forwarding) */
int fwd_start(int fd, uint32_t port);
/* A microVM's ServicePort listener on AF_VSOCK port (fwd.c says how it is
 * spoken). Returns 0 or SPACED_ESYS. */
int fwd_vsock_listen(unsigned port);
/* The earliest deadline of a connection still owing its CONNECT line, 0: none. */
uint64_t fwd_next_deadline(void);
void fwd_poll_add(void (*add)(int fd, short ev, void *ptr));
void fwd_on_event(void *ptr, int fd, short revents);
void fwd_reap(void);

#endif
