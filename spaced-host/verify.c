/* verify.c — the per-connection checks of the guest-transport listener (B1,
 * B2), with what cannot change during the launcher's life kept between
 * connections.
 *
 * Every connection passes every check of spaced_peer_connect_listener()
 * (pidref.h), in the same order and with the same reasons: the socket file and
 * its owner, the listening socket bound to exactly that inode, the launcher
 * alive with its start time, its executable, the launcher holding that
 * listening socket, and the connection's peer being the launcher. What is kept:
 *   - the launcher's pidfd, opened and compared with the expected start time at
 *     the first connection. A pidfd names one process for good: while it is
 *     alive the pid names that process, and spaced_pidref_check() re-reads the
 *     start time at every connection anyway;
 *   - the inode of the listening socket last found bound to the path and the
 *     descriptor number the launcher holds it under. They are where each
 *     connection looks first (one exact unix_diag query, one readlink) instead
 *     of a dump of every listening socket of the machine and a scan of the
 *     launcher's descriptor table; when either no longer matches, the full
 *     search runs, exactly as without the cache.
 * The executable's dev/ino is compared at every connection: an execve(2)
 * changes it without changing the pid or the start time. */
#include "host.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "spaced_error.h"
#include "util.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif
#define PIDFS_MAGIC_ 0x50494446 /* pidfds are pidfs inodes (Linux 6.9+) */

static struct {
	pthread_mutex_t lock;
	struct spaced_pidref launcher; /* pinned at the first connection */
	uint64_t launcher_pidfs_ino;   /* its pidfs inode, 0 when pidfds are not pidfs */
	uint64_t sock_ino;             /* listening socket last bound to the path, 0: none */
	int sock_fd;                   /* its number in the launcher's table, -1: unknown */
} cache = {PTHREAD_MUTEX_INITIALIZER, {.pid = 0, .pidfd = -1, .start_time = 0}, 0, 0, -1};

/* the VM its back-end serves, kept between connections (vmcheck.h) */
static struct spaced_vm_check vm_check = SPACED_VM_CHECK_INIT;

/* The pidfs inode of a pidfd: equal inodes, same process (never reused). */
static uint64_t pidfs_ino(int pidfd)
{
	struct statfs sf;
	struct stat st;
	if (fstatfs(pidfd, &sf) < 0 || (uint32_t)sf.f_type != PIDFS_MAGIC_ || fstat(pidfd, &st) < 0)
		return 0;
	return (uint64_t)st.st_ino;
}

/* The listening socket bound to exactly the inode st names: the remembered one
 * when it still is, else the result of a full unix_diag dump. */
static int listener_of(const struct stat *st, uint64_t remembered, uint64_t *sock_ino)
{
	if (spaced_unix_diag_is_listener_of(remembered, (uint64_t)st->st_dev, (uint64_t)st->st_ino) == 0) {
		*sock_ino = remembered;
		return 0;
	}
	return spaced_unix_diag_listener_of((uint64_t)st->st_dev, (uint64_t)st->st_ino, sock_ino);
}

/* Whether descriptor fdnum of pid is socket sock_ino. */
static bool fd_is_socket(pid_t pid, int fdnum, const char *want)
{
	char path[64], link[64];
	snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, fdnum);
	ssize_t n = readlink(path, link, sizeof link - 1);
	if (n <= 0)
		return false;
	link[n] = 0;
	return strcmp(link, want) == 0;
}

/* The descriptor number under which pid holds socket sock_ino: the remembered
 * one when it still is, else a scan of /proc/PID/fd. -1 when it holds none. */
static int holder_fd(pid_t pid, uint64_t sock_ino, int remembered)
{
	char want[48], path[64];
	snprintf(want, sizeof want, "socket:[%" PRIu64 "]", sock_ino);
	if (remembered >= 0 && fd_is_socket(pid, remembered, want))
		return remembered;
	snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
	DIR *d = opendir(path);
	int found = -1;
	struct dirent *de;
	while (d != NULL && found < 0 && (de = readdir(d)) != NULL) {
		char link[64];
		if (de->d_name[0] == '.')
			continue;
		ssize_t n = readlinkat(dirfd(d), de->d_name, link, sizeof link - 1);
		if (n <= 0)
			continue;
		link[n] = 0;
		if (strcmp(link, want) == 0)
			found = atoi(de->d_name);
	}
	if (d != NULL)
		closedir(d);
	return found;
}

/* The launcher, pinned once (pid and start time as expected) and checked
 * alive and unchanged at every call. */
static int launcher_ref(const struct spaced_expected_listener *exp, struct spaced_pidref *out, char *why,
                        size_t whysz)
{
	if (cache.launcher.pidfd < 0) {
		struct spaced_pidref ref = SPACED_PIDREF_NULL;
		int r = spaced_pidref_expected(&ref, exp->pid, exp->start_time, why, whysz);
		if (r < 0)
			return r;
		cache.launcher = ref;
		cache.launcher_pidfs_ino = pidfs_ino(ref.pidfd);
	} else if (spaced_pidref_check(&cache.launcher) < 0) {
		/* the pidfd still names the launcher first pinned: it has exited */
		spaced_why(why, whysz, "expected listener process %d is gone", (int)exp->pid);
		return SPACED_EPEER;
	}
	*out = cache.launcher;
	return 0;
}

/* Whether the peer of connected socket fd is the pinned launcher. */
static int peer_is_launcher(int fd, const char *path, const struct spaced_expected_listener *exp,
                            const struct spaced_pidref *launcher, uint64_t launcher_ino, char *why,
                            size_t whysz)
{
	struct ucred cred;
	socklen_t len = sizeof cred;
	int pidfd = -1;
	if (launcher_ino != 0 && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 &&
	    len == sizeof cred && (len = sizeof pidfd,
	                           getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) == 0)) {
		/* same pidfs inode: the very process pinned as the launcher, whose
		 * start time was compared when it was pinned */
		bool same = cred.pid == launcher->pid && pidfs_ino(pidfd) == launcher_ino;
		close(pidfd);
		if (same)
			return 0;
	}
	struct spaced_pidref peer = SPACED_PIDREF_NULL;
	int r = spaced_pidref_from_peer(&peer, fd, NULL, NULL);
	if (r < 0) {
		spaced_why(why, whysz, "%s: peer credentials unavailable (%s)", path, spaced_strerror(r));
		return SPACED_EPEER;
	}
	if (peer.pid != exp->pid || peer.start_time != exp->start_time) {
		spaced_why(why, whysz,
		           "%s: the connection's listener is process %d (start %" PRIu64 "), expected %d (start %" PRIu64
		           ")",
		           path, (int)peer.pid, peer.start_time, (int)exp->pid, exp->start_time);
		r = SPACED_EPEER;
	}
	spaced_pidref_done(&peer);
	return r < 0 ? r : 0;
}

/* Every check before connect(2); on success *launcher is the pinned launcher
 * (owned by the cache) and *launcher_ino its pidfs inode. */
static int verify_listener(const struct host_config *cfg, struct spaced_pidref *launcher_out,
                           uint64_t *launcher_ino, char *why, size_t whysz)
{
	const char *path = cfg->guest_path;
	const struct spaced_expected_listener *exp = &cfg->launcher;
	struct spaced_pidref launcher;
	struct stat st;
	uint64_t sock_ino;
	int r, holder;

	if (exp->pid <= 0)
		return SPACED_EINVAL;
	if (lstat(path, &st) < 0) {
		spaced_why(why, whysz, "%s: %s", path, strerror(errno));
		return SPACED_EPEER;
	}
	if (!S_ISSOCK(st.st_mode)) {
		spaced_why(why, whysz, "%s is not a socket", path);
		return SPACED_EPEER;
	}
	if (st.st_uid != exp->owner_uid) {
		spaced_why(why, whysz, "%s is owned by uid %u, expected %u", path, (unsigned)st.st_uid,
		           (unsigned)exp->owner_uid);
		return SPACED_EPEER;
	}
	pthread_mutex_lock(&cache.lock);
	r = listener_of(&st, cache.sock_ino, &sock_ino);
	if (r < 0) {
		spaced_why(why, whysz, "%s: no listening socket is bound to this inode (%s)", path,
		           spaced_strerror(r));
		r = SPACED_EPEER;
		goto unlock;
	}
	if ((r = launcher_ref(exp, &launcher, why, whysz)) < 0)
		goto unlock;
	if (exp->check_exe && (r = spaced_pidref_check_exe(&launcher, &exp->exe, "listener", why, whysz)) < 0)
		goto unlock;
	holder = holder_fd(launcher.pid, sock_ino, cache.sock_ino == sock_ino ? cache.sock_fd : -1);
	/* the fd table read above was the pinned process's only if it is still alive */
	if (holder < 0 || spaced_pidref_check(&launcher) < 0) {
		spaced_why(why, whysz, "listening socket %" PRIu64 " of %s is not held by process %d (%s)", sock_ino,
		           path, (int)exp->pid, spaced_strerror(holder < 0 ? SPACED_ENOENT : SPACED_ESTALE));
		r = SPACED_EPEER;
		goto unlock;
	}
	cache.sock_ino = sock_ino;
	cache.sock_fd = holder;
	*launcher_out = launcher;
	*launcher_ino = cache.launcher_pidfs_ino;
	r = 0;
unlock:
	pthread_mutex_unlock(&cache.lock);
	/* a microVM: the listener's holder is its back-end; bind it to the VM */
	if (r == 0)
		r = spaced_vm_verify(&vm_check, &cfg->vm, &launcher, why, whysz);
	return r;
}

int host_prepare_listener(const struct host_config *cfg, char *why, size_t whysz)
{
	struct spaced_pidref launcher;
	uint64_t ino;
	return verify_listener(cfg, &launcher, &ino, why, whysz);
}

int host_connect_listener(const struct host_config *cfg, int *fd_out, char *why, size_t whysz)
{
	const char *path = cfg->guest_path;
	const struct spaced_expected_listener *exp = &cfg->launcher;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct spaced_pidref launcher;
	uint64_t launcher_ino;
	int fd, r;

	if (strlen(path) >= sizeof sa.sun_path)
		return SPACED_EINVAL;
	if ((r = verify_listener(cfg, &launcher, &launcher_ino, why, whysz)) < 0)
		return r;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return SPACED_ESYS;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		spaced_why(why, whysz, "connect %s: %s", path, strerror(errno));
		close(fd);
		return SPACED_EPEER;
	}
	r = peer_is_launcher(fd, path, exp, &launcher, launcher_ino, why, whysz);
	if (r < 0) {
		close(fd);
		return r;
	}
	*fd_out = fd;
	return 0;
}
