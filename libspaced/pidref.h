/*
 * pidref.h — process identities and peer verification of Unix sockets (B1, B2).
 *
 * A process is named by {pid, pidfd, start time}, never by a bare PID: the
 * pidfd pins the process (a reused PID never matches it) and the start time
 * (field 22 of /proc/PID/stat, in clock ticks since boot) is what a record
 * written earlier can be compared with. An executable is named by the device
 * and inode of /proc/PID/exe and, when asked, by a BLAKE2b-256 hash of its bytes.
 *
 * The kernel evidence for sockets comes from SO_PEERCRED / SO_PEERPIDFD and
 * from unix_diag (NETLINK_SOCK_DIAG): which listening socket is bound to a
 * path's inode, and which socket is the peer of a connected one. unix_diag
 * answers for the caller's network namespace only.
 *
 * Functions return 0 or a negative SPACED_E* code and write their outputs
 * only on success. The verify functions also write a one-line reason into
 * why (when why is not NULL) on failure, e.g. "listener process 812 start time
 * 4711 differs from the expected 4690 (PID reused?)".
 */
#ifndef SPACED_PIDREF_H
#define SPACED_PIDREF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

#define SPACED_EXE_HASH_LEN 32 /* BLAKE2b-256 */

struct spaced_pidref {
	pid_t pid;
	int pidfd;           /* -1 when not held */
	uint64_t start_time; /* /proc/PID/stat field 22 */
};

#define SPACED_PIDREF_NULL ((struct spaced_pidref){ .pid = 0, .pidfd = -1, .start_time = 0 })

struct spaced_exe_id {
	uint64_t dev; /* st_dev of /proc/PID/exe */
	uint64_t ino; /* st_ino of /proc/PID/exe */
	bool has_hash;
	uint8_t hash[SPACED_EXE_HASH_LEN];
};

/* Reads the start time of pid from /proc/PID/stat. Returns 0, SPACED_ENOENT
 * when the process does not exist, or SPACED_EIO on an unreadable line. */
int spaced_proc_start_time(pid_t pid, uint64_t *out);

/* Pins process pid: opens its pidfd, then reads its start time, then checks
 * that the pidfd still refers to a live process, so the start time belongs to
 * the pinned process. Returns 0, SPACED_ENOENT (no such process) or SPACED_ESYS.
 * The caller releases *out with spaced_pidref_done. */
int spaced_pidref_from_pid(struct spaced_pidref *out, pid_t pid);

/* Pins the expected listener process: pid must exist and have started at
 * start_time (a reused pid has another start time). Returns 0 with *out set
 * (release it with spaced_pidref_done) or SPACED_EPEER with the reason in
 * why. */
int spaced_pidref_expected(struct spaced_pidref *out, pid_t pid, uint64_t start_time, char *why,
                           size_t whysz);

/* Pins the process of a pidfd, taking ownership of pidfd on success only (on
 * failure the caller still owns it). Returns 0, SPACED_ESTALE when the process
 * has exited, or SPACED_ESYS. */
int spaced_pidref_from_pidfd_take(struct spaced_pidref *out, int pidfd);

/* Pins the peer of a connected Unix socket through SO_PEERPIDFD and reads its
 * SO_PEERCRED credentials into *uid / *gid (either may be NULL). The pid given
 * by SO_PEERCRED must be the pidfd's process. Returns 0, SPACED_ESTALE (peer
 * gone), SPACED_EPEER (pidfd and credentials disagree) or SPACED_ESYS (for
 * instance a kernel without SO_PEERPIDFD). */
int spaced_pidref_from_peer(struct spaced_pidref *out, int sockfd, uid_t *uid, gid_t *gid);

/* Is p still the same live process (not yet reaped): its pidfd accepts signal
 * 0. While it does, the PID cannot have been reused, so p->pid and the start
 * time pinned with it still name this process. Returns 0 or SPACED_ESTALE. */
int spaced_pidref_check(const struct spaced_pidref *p);

/* Sends sig to the pinned process through its pidfd (never to a process that
 * reused its pid). Returns 0 or SPACED_ESTALE (gone, or p released). */
int spaced_pidref_signal(const struct spaced_pidref *p, int sig);

/* Sends sig to pid when it is still the process that started at start_time
 * (pins it, signals it, releases it). Returns 0 or SPACED_ESTALE. */
int spaced_pid_signal_expected(pid_t pid, uint64_t start_time, int sig);

/* The uid (real) of a pinned process, re-checked against the pidfd after the
 * read. Returns 0 or SPACED_ESTALE / SPACED_EIO. */
int spaced_pidref_uid(const struct spaced_pidref *p, uid_t *uid);

/* Identity of the executable of a pinned process (dev/ino of /proc/PID/exe,
 * plus a BLAKE2b-256 of the file when want_hash). Returns 0, SPACED_ESTALE,
 * SPACED_EPERM (exe not readable) or SPACED_EIO. */
int spaced_pidref_exe(const struct spaced_pidref *p, bool want_hash, struct spaced_exe_id *out);

/* Identity of an executable file by path (to record what is expected). */
int spaced_exe_id_of_path(const char *path, bool want_hash, struct spaced_exe_id *out);

/* Does the pinned process hold a file descriptor for socket inode sock_ino
 * ("socket:[ino]" in /proc/PID/fd)? Returns 0 when it does, SPACED_ENOENT when
 * it does not, SPACED_ESTALE when the process changed during the scan. */
int spaced_pidref_holds_socket(const struct spaced_pidref *p, uint64_t sock_ino);

/* Releases the pidfd; p may be NULL or already released. */
void spaced_pidref_done(struct spaced_pidref *p);

/* unix_diag: the inode of the listening Unix socket whose bound file has
 * device st_dev and inode st_ino (as stat() reports them). Returns 0,
 * SPACED_ENOENT when no listening socket is bound to that file, SPACED_ESYS. */
int spaced_unix_diag_listener_of(uint64_t st_dev, uint64_t st_ino, uint64_t *sock_ino);

/* unix_diag, one exact query: whether socket sock_ino is listening and bound
 * to the file st_dev/st_ino. Returns 0, SPACED_ENOENT (no such socket, not
 * listening, or bound elsewhere), SPACED_ESYS. */
int spaced_unix_diag_is_listener_of(uint64_t sock_ino, uint64_t st_dev, uint64_t st_ino);

/* unix_diag: the inode of the peer of connected Unix socket fd. Returns 0,
 * SPACED_ENOENT (no peer), SPACED_ESYS. */
int spaced_unix_diag_peer_of(int fd, uint64_t *peer_ino);

/* unix_diag, one exact query: the inode of the peer of Unix socket sock_ino,
 * which need not be one of the caller's descriptors (a socket seen in
 * /proc/PID/fd of another process). Returns 0, SPACED_ENOENT (no such socket
 * or no peer), SPACED_EINVAL, SPACED_ESYS. */
int spaced_unix_diag_peer_of_ino(uint64_t sock_ino, uint64_t *peer_ino);

/* What the bridge expects of a guest-transport (or other) listening socket. */
struct spaced_expected_listener {
	uid_t owner_uid;     /* owner of the socket file */
	pid_t pid;           /* the process that must hold the listening socket */
	uint64_t start_time; /* and its start time */
	bool check_exe;      /* compare exe dev/ino (and hash when has_hash) */
	struct spaced_exe_id exe;
};

/* Checks, in this order: path is a socket file owned by exp->owner_uid; a
 * listening socket is bound to exactly that inode (unix_diag UNIX_DIAG_VFS);
 * process exp->pid is alive with start time exp->start_time; its executable
 * matches (when asked); it holds that listening socket; and it is still the
 * same process afterwards. Returns 0 or SPACED_EPEER (reason in why),
 * SPACED_EINVAL for bad arguments. */
/* Whether p runs the executable want names (dev/ino of /proc/PID/exe, and its
 * hash when want->has_hash). Returns 0, or SPACED_EPEER with a reason naming
 * "<who> process <pid>" in why. */
int spaced_pidref_check_exe(const struct spaced_pidref *p, const struct spaced_exe_id *want, const char *who,
                            char *why, size_t whysz);

int spaced_peer_verify_listener(const char *path, const struct spaced_expected_listener *exp,
                                char *why, size_t whysz);

/* spaced_peer_verify_listener, then connect(2) to path, then check that the
 * connection's SO_PEERCRED / SO_PEERPIDFD name the expected process (the
 * kernel records the process that called listen()). A listener whose backlog
 * is full is refused at once (SPACED_EPEER), never waited for. On success
 * *fd_out is a connected, blocking SOCK_STREAM socket (close-on-exec) owned
 * by the caller. */
int spaced_peer_connect_listener(const char *path, const struct spaced_expected_listener *exp,
                                 int *fd_out, char *why, size_t whysz);

/* What a server expects of the process on the other end of an accepted socket. */
struct spaced_expected_caller {
	uid_t uid;           /* SO_PEERCRED uid */
	bool check_gid;
	gid_t gid;
	pid_t pid;           /* 0: any process */
	uint64_t start_time; /* 0: any (only with pid) */
	bool check_exe;
	struct spaced_exe_id exe;
};

/* Verifies the peer of connected Unix socket fd: SO_PEERCRED uid (and gid),
 * SO_PEERPIDFD pins the peer, pid and start time when expected, executable
 * when asked, and the pin still holds after the checks. On success, when out
 * is not NULL, *out receives the pinned peer (the caller releases it and may
 * call spaced_pidref_check again after its work). Returns 0 or SPACED_EPEER
 * (reason in why). */
int spaced_peer_verify_caller(int fd, const struct spaced_expected_caller *exp,
                              struct spaced_pidref *out, char *why, size_t whysz);

#endif
