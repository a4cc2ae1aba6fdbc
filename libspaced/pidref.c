/*
 * pidref.c — {pid, pidfd, start time} process identities, executable
 * identities, unix_diag lookups and the bridge's peer checks (B1, B2).
 */
#include "pidref.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>

#include <sodium.h>

#include "spaced_error.h"
#include "util.h"

#ifndef TCP_LISTEN
#define TCP_LISTEN 10
#endif


static int sys_pidfd_open(pid_t pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

static int sys_pidfd_send_signal(int pidfd, int sig)
{
	return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
}

int spaced_proc_start_time(pid_t pid, uint64_t *out)
{
	char path[64], buf[1024];
	const char *p;
	unsigned long long v;
	ssize_t n;
	int fd, field;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT || errno == ESRCH ? SPACED_ENOENT : SPACED_ESYS;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return n == 0 ? SPACED_ENOENT : SPACED_EIO;
	buf[n] = '\0';
	/* comm (field 2) may hold spaces and parentheses: start after the last ')' */
	p = strrchr(buf, ')');
	if (p == NULL || p[1] != ' ')
		return SPACED_EIO;
	p += 2; /* field 3 */
	for (field = 3; field < 22; field++) {
		p = strchr(p, ' ');
		if (p == NULL)
			return SPACED_EIO;
		p++;
	}
	if (sscanf(p, "%llu", &v) != 1)
		return SPACED_EIO;
	*out = (uint64_t)v;
	return 0;
}

/* The pid of a pidfd's process from /proc/self/fdinfo ("Pid:\t-1" once exited). */
static int pidfd_pid(int pidfd, pid_t *out)
{
	char path[64], buf[2048];
	const char *p;
	ssize_t n;
	int fd, v;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", pidfd);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return SPACED_ESYS;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return SPACED_EIO;
	buf[n] = '\0';
	p = strstr(buf, "\nPid:");
	if (p == NULL || sscanf(p + 5, "%d", &v) != 1)
		return SPACED_EIO;
	if (v <= 0)
		return SPACED_ESTALE;
	*out = (pid_t)v;
	return 0;
}

int spaced_pidref_from_pid(struct spaced_pidref *out, pid_t pid)
{
	uint64_t st;
	int pidfd, r;

	if (pid <= 0)
		return SPACED_EINVAL;
	pidfd = sys_pidfd_open(pid);
	if (pidfd < 0)
		return errno == ESRCH ? SPACED_ENOENT : SPACED_ESYS;
	r = spaced_proc_start_time(pid, &st);
	if (r < 0)
		goto out;
	/* the pidfd was opened first: if it is still alive now, the stat line read
	 * in between was the pinned process's */
	if (sys_pidfd_send_signal(pidfd, 0) < 0 && errno == ESRCH) {
		r = SPACED_ENOENT;
		goto out;
	}
	out->pid = pid;
	out->pidfd = pidfd;
	out->start_time = st;
	pidfd = -1;
	r = 0;
out:
	if (pidfd >= 0)
		close(pidfd);
	return r;
}

int spaced_pidref_expected(struct spaced_pidref *out, pid_t pid, uint64_t start_time, char *why,
                           size_t whysz)
{
	struct spaced_pidref ref = SPACED_PIDREF_NULL;
	if (spaced_pidref_from_pid(&ref, pid) < 0) {
		spaced_why(why, whysz, "expected listener process %d is gone", (int)pid);
		return SPACED_EPEER;
	}
	if (ref.start_time != start_time) {
		spaced_why(why, whysz,
		           "listener process %d start time %" PRIu64 " differs from the expected %" PRIu64
		           " (PID reused?)",
		           (int)pid, ref.start_time, start_time);
		spaced_pidref_done(&ref);
		return SPACED_EPEER;
	}
	*out = ref;
	return 0;
}

int spaced_pidref_from_pidfd_take(struct spaced_pidref *out, int pidfd)
{
	uint64_t st;
	pid_t pid;
	int r;

	r = pidfd_pid(pidfd, &pid);
	if (r < 0)
		return r;
	r = spaced_proc_start_time(pid, &st);
	if (r < 0)
		return r == SPACED_ENOENT ? SPACED_ESTALE : r;
	if (sys_pidfd_send_signal(pidfd, 0) < 0 && errno == ESRCH)
		return SPACED_ESTALE;
	out->pid = pid;
	out->pidfd = pidfd;
	out->start_time = st;
	return 0;
}

int spaced_pidref_from_peer(struct spaced_pidref *out, int sockfd, uid_t *uid, gid_t *gid)
{
	struct spaced_pidref ref = SPACED_PIDREF_NULL;
	struct ucred cred;
	socklen_t len = sizeof(cred);
	int pidfd = -1, r;

	if (getsockopt(sockfd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || len != sizeof(cred))
		return SPACED_ESYS;
	len = sizeof(pidfd);
	if (getsockopt(sockfd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) < 0)
		return errno == ESRCH ? SPACED_ESTALE : SPACED_ESYS;
	r = spaced_pidref_from_pidfd_take(&ref, pidfd);
	if (r < 0)
		goto out;
	pidfd = -1;
	if (ref.pid != cred.pid) {
		r = SPACED_EPEER;
		goto out;
	}
	if (uid != NULL)
		*uid = cred.uid;
	if (gid != NULL)
		*gid = cred.gid;
	*out = ref;
	ref = SPACED_PIDREF_NULL;
	r = 0;
out:
	if (pidfd >= 0)
		close(pidfd);
	spaced_pidref_done(&ref);
	return r;
}

int spaced_pidref_check(const struct spaced_pidref *p)
{
	/* The pidfd holds its process's PID until the process is reaped, and
	 * answers ESRCH from then on: while it answers, p->pid names this very
	 * process, whose start time was read and checked when p was made. */
	if (p == NULL || p->pidfd < 0)
		return SPACED_ESTALE;
	if (sys_pidfd_send_signal(p->pidfd, 0) < 0 && errno == ESRCH)
		return SPACED_ESTALE;
	return 0;
}

int spaced_pidref_signal(const struct spaced_pidref *p, int sig)
{
	if (p == NULL || p->pidfd < 0 || sys_pidfd_send_signal(p->pidfd, sig) < 0)
		return SPACED_ESTALE;
	return 0;
}

int spaced_pid_signal_expected(pid_t pid, uint64_t start_time, int sig)
{
	struct spaced_pidref ref = SPACED_PIDREF_NULL;
	char why[128];
	if (pid <= 1 || spaced_pidref_expected(&ref, pid, start_time, why, sizeof why) < 0)
		return SPACED_ESTALE;
	int e = spaced_pidref_signal(&ref, sig);
	spaced_pidref_done(&ref);
	return e;
}

int spaced_pidref_uid(const struct spaced_pidref *p, uid_t *uid)
{
	char path[64], buf[4096];
	const char *s;
	unsigned int v;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)p->pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return SPACED_ESTALE;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return SPACED_EIO;
	buf[n] = '\0';
	s = strstr(buf, "\nUid:");
	if (s == NULL || sscanf(s + 5, "%u", &v) != 1)
		return SPACED_EIO;
	if (spaced_pidref_check(p) < 0)
		return SPACED_ESTALE;
	*uid = (uid_t)v;
	return 0;
}

static int hash_fd(int fd, uint8_t out[SPACED_EXE_HASH_LEN])
{
	crypto_generichash_state st;
	uint8_t buf[65536];
	ssize_t n;

	if (sodium_init() < 0)
		return SPACED_ESYS;
	crypto_generichash_init(&st, NULL, 0, SPACED_EXE_HASH_LEN);
	for (;;) {
		n = read(fd, buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return SPACED_EIO;
		if (n == 0)
			break;
		crypto_generichash_update(&st, buf, (unsigned long long)n);
	}
	crypto_generichash_final(&st, out, SPACED_EXE_HASH_LEN);
	return 0;
}

static int exe_id_of(const char *path, bool want_hash, struct spaced_exe_id *out)
{
	struct spaced_exe_id id;
	struct stat st, st2;
	int fd = -1, r;

	memset(&id, 0, sizeof(id));
	if (stat(path, &st) < 0)
		return errno == EACCES || errno == EPERM ? SPACED_EPERM : SPACED_ENOENT;
	id.dev = (uint64_t)st.st_dev;
	id.ino = (uint64_t)st.st_ino;
	if (want_hash) {
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return errno == EACCES || errno == EPERM ? SPACED_EPERM : SPACED_EIO;
		/* hash the very file whose identity was recorded */
		if (fstat(fd, &st2) < 0 || st2.st_dev != st.st_dev || st2.st_ino != st.st_ino) {
			r = SPACED_ESTALE;
			goto out;
		}
		r = hash_fd(fd, id.hash);
		if (r < 0)
			goto out;
		id.has_hash = true;
	}
	*out = id;
	r = 0;
out:
	if (fd >= 0)
		close(fd);
	return r;
}

int spaced_exe_id_of_path(const char *path, bool want_hash, struct spaced_exe_id *out)
{
	return exe_id_of(path, want_hash, out);
}

int spaced_pidref_exe(const struct spaced_pidref *p, bool want_hash, struct spaced_exe_id *out)
{
	struct spaced_exe_id id;
	char path[64];
	int r;

	snprintf(path, sizeof(path), "/proc/%d/exe", (int)p->pid);
	r = exe_id_of(path, want_hash, &id);
	if (r < 0)
		return spaced_pidref_check(p) < 0 ? SPACED_ESTALE : r;
	if (spaced_pidref_check(p) < 0)
		return SPACED_ESTALE;
	*out = id;
	return 0;
}

int spaced_pidref_holds_socket(const struct spaced_pidref *p, uint64_t sock_ino)
{
	char path[64], want[48], link[64];
	struct dirent *de;
	DIR *d;
	int r = SPACED_ENOENT;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)p->pid);
	snprintf(want, sizeof(want), "socket:[%" PRIu64 "]", sock_ino);
	d = opendir(path);
	if (d == NULL)
		return SPACED_ESTALE;
	while ((de = readdir(d)) != NULL) {
		ssize_t n;

		if (de->d_name[0] == '.')
			continue;
		n = readlinkat(dirfd(d), de->d_name, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = '\0';
		if (strcmp(link, want) == 0) {
			r = 0;
			break;
		}
	}
	closedir(d);
	if (spaced_pidref_check(p) < 0)
		return SPACED_ESTALE;
	return r;
}

void spaced_pidref_done(struct spaced_pidref *p)
{
	if (p == NULL)
		return;
	if (p->pidfd >= 0)
		close(p->pidfd);
	p->pidfd = -1;
}

/* One unix_diag request; calls match() on every answer until it returns 1. */
static int unix_diag_query(const struct unix_diag_req *req, bool dump,
                           int (*match)(const struct unix_diag_msg *m, struct rtattr *attrs,
                                        int alen, void *ctx),
                           void *ctx)
{
	struct {
		struct nlmsghdr nlh;
		struct unix_diag_req req;
	} msg;
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	long buf[8192 / sizeof(long)];
	int fd, r = SPACED_ENOENT;
	bool done = false;

	fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (fd < 0)
		return SPACED_ESYS;
	memset(&msg, 0, sizeof(msg));
	msg.nlh.nlmsg_len = sizeof(msg);
	msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	msg.nlh.nlmsg_flags = NLM_F_REQUEST | (dump ? NLM_F_DUMP : 0);
	msg.nlh.nlmsg_seq = 1;
	msg.req = *req;
	if (sendto(fd, &msg, sizeof(msg), 0, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = SPACED_ESYS;
		goto out;
	}
	while (!done) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);
		struct nlmsghdr *h;

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = SPACED_ESYS;
			goto out;
		}
		for (h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
			struct unix_diag_msg *m;
			int alen;

			if (h->nlmsg_type == NLMSG_DONE) {
				done = true;
				break;
			}
			if (h->nlmsg_type == NLMSG_ERROR) {
				struct nlmsgerr *e = NLMSG_DATA(h);

				if (h->nlmsg_len >= NLMSG_LENGTH(sizeof(*e)) && e->error == -ENOENT)
					r = SPACED_ENOENT;
				else
					r = SPACED_ESYS;
				goto out;
			}
			if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
			    h->nlmsg_len < NLMSG_LENGTH(sizeof(*m)))
				continue;
			m = NLMSG_DATA(h);
			alen = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(*m)));
			if (match(m, (struct rtattr *)(m + 1), alen, ctx) == 1) {
				r = 0;
				/* keep reading a dump to its end is not needed: closing drops it */
				goto out;
			}
			if (!dump) {
				done = true;
				break;
			}
		}
	}
out:
	close(fd);
	return r;
}

struct vfs_match {
	uint32_t kdev; /* device in the kernel's internal encoding */
	uint32_t ino;
	uint64_t sock_ino;
	int hits;
};

static int match_vfs(const struct unix_diag_msg *m, struct rtattr *a, int alen, void *ctx)
{
	struct vfs_match *vm = ctx;

	if (m->udiag_state != TCP_LISTEN)
		return 0;
	for (; RTA_OK(a, alen); a = RTA_NEXT(a, alen)) {
		struct unix_diag_vfs *v;

		if (a->rta_type != UNIX_DIAG_VFS || RTA_PAYLOAD(a) < sizeof(*v))
			continue;
		v = RTA_DATA(a);
		if (v->udiag_vfs_ino == vm->ino && v->udiag_vfs_dev == vm->kdev) {
			vm->sock_ino = m->udiag_ino;
			vm->hits++;
			return 1;
		}
	}
	return 0;
}

/* Sets up a query for listening sockets bound to the file st_dev/st_ino:
 * all of them (sock_ino 0, a dump) or exactly socket sock_ino. */
static int listener_query(uint64_t st_dev, uint64_t st_ino, uint64_t sock_ino, struct unix_diag_req *req,
                          struct vfs_match *vm)
{
	memset(req, 0, sizeof(*req));
	req->sdiag_family = AF_UNIX;
	req->udiag_states = 1U << TCP_LISTEN;
	req->udiag_show = UDIAG_SHOW_VFS;
	if (sock_ino != 0) {
		req->udiag_ino = (uint32_t)sock_ino;
		req->udiag_cookie[0] = ~0U; /* INET_DIAG_NOCOOKIE: no cookie check */
		req->udiag_cookie[1] = ~0U;
	}
	memset(vm, 0, sizeof(*vm));
	/* unix_diag reports the superblock's s_dev (MAJOR << 20 | MINOR), not the
	 * encoding stat() uses */
	vm->kdev = (uint32_t)((major((dev_t)st_dev) << 20) | minor((dev_t)st_dev));
	vm->ino = (uint32_t)st_ino;
	/* unix_diag carries 32-bit inode numbers */
	return (uint64_t)vm->ino != st_ino || (uint32_t)sock_ino != sock_ino ? SPACED_ENOENT : 0;
}

int spaced_unix_diag_listener_of(uint64_t st_dev, uint64_t st_ino, uint64_t *sock_ino)
{
	struct unix_diag_req req;
	struct vfs_match vm;
	int r = listener_query(st_dev, st_ino, 0, &req, &vm);

	if (r == 0)
		r = unix_diag_query(&req, true, match_vfs, &vm);
	if (r < 0)
		return r;
	*sock_ino = vm.sock_ino;
	return 0;
}

int spaced_unix_diag_is_listener_of(uint64_t sock_ino, uint64_t st_dev, uint64_t st_ino)
{
	struct unix_diag_req req;
	struct vfs_match vm;
	int r = sock_ino == 0 ? SPACED_ENOENT : listener_query(st_dev, st_ino, sock_ino, &req, &vm);

	if (r == 0)
		r = unix_diag_query(&req, false, match_vfs, &vm);
	if (r < 0)
		return r;
	return vm.sock_ino == sock_ino ? 0 : SPACED_ENOENT;
}

struct peer_match {
	uint32_t self_ino;
	uint64_t peer;
	bool found;
};

static int match_peer(const struct unix_diag_msg *m, struct rtattr *a, int alen, void *ctx)
{
	struct peer_match *pm = ctx;

	if (m->udiag_ino != pm->self_ino)
		return 0;
	for (; RTA_OK(a, alen); a = RTA_NEXT(a, alen)) {
		if (a->rta_type == UNIX_DIAG_PEER && RTA_PAYLOAD(a) >= sizeof(uint32_t)) {
			uint32_t v;

			memcpy(&v, RTA_DATA(a), sizeof(v));
			pm->peer = v;
			pm->found = true;
			return 1;
		}
	}
	return 0;
}

int spaced_unix_diag_peer_of_ino(uint64_t sock_ino, uint64_t *peer_ino)
{
	struct unix_diag_req req;
	struct peer_match pm;
	int r;

	if (sock_ino == 0 || sock_ino > UINT32_MAX)
		return SPACED_EINVAL;
	memset(&req, 0, sizeof(req));
	req.sdiag_family = AF_UNIX;
	req.udiag_states = ~0U;
	req.udiag_ino = (uint32_t)sock_ino;
	req.udiag_show = UDIAG_SHOW_PEER;
	req.udiag_cookie[0] = ~0U;
	req.udiag_cookie[1] = ~0U;
	memset(&pm, 0, sizeof(pm));
	pm.self_ino = (uint32_t)sock_ino;
	r = unix_diag_query(&req, false, match_peer, &pm);
	if (r < 0)
		return r;
	if (!pm.found)
		return SPACED_ENOENT;
	*peer_ino = pm.peer;
	return 0;
}

int spaced_unix_diag_peer_of(int fd, uint64_t *peer_ino)
{
	struct stat st;

	if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
		return SPACED_EINVAL;
	return spaced_unix_diag_peer_of_ino((uint64_t)st.st_ino, peer_ino);
}

int spaced_pidref_check_exe(const struct spaced_pidref *p, const struct spaced_exe_id *want, const char *who,
                            char *why, size_t whysz)
{
	struct spaced_exe_id got;
	int r = spaced_pidref_exe(p, want->has_hash, &got);

	if (r < 0) {
		spaced_why(why, whysz, "%s process %d: executable unreadable (%s)", who, (int)p->pid,
		       spaced_strerror(r));
		return SPACED_EPEER;
	}
	if (got.dev != want->dev || got.ino != want->ino) {
		spaced_why(why, whysz,
		       "%s process %d: executable dev/ino %" PRIu64 "/%" PRIu64
		       " differs from the expected %" PRIu64 "/%" PRIu64 " (replaced executable?)",
		       who, (int)p->pid, got.dev, got.ino, want->dev, want->ino);
		return SPACED_EPEER;
	}
	if (want->has_hash && !spaced_ct_eq(got.hash, want->hash, SPACED_EXE_HASH_LEN)) {
		spaced_why(why, whysz, "%s process %d: executable hash differs from the expected one",
		       who, (int)p->pid);
		return SPACED_EPEER;
	}
	return 0;
}

int spaced_peer_verify_listener(const char *path, const struct spaced_expected_listener *exp,
                                char *why, size_t whysz)
{
	struct spaced_pidref ref = SPACED_PIDREF_NULL;
	uint64_t sock_ino;
	struct stat st;
	int r;

	if (path == NULL || exp == NULL || exp->pid <= 0)
		return SPACED_EINVAL;
	if (lstat(path, &st) < 0) {
		spaced_why(why, whysz, "%s: %s", path, strerror(errno));
		r = SPACED_EPEER;
		goto out;
	}
	if (!S_ISSOCK(st.st_mode)) {
		spaced_why(why, whysz, "%s is not a socket", path);
		r = SPACED_EPEER;
		goto out;
	}
	if (st.st_uid != exp->owner_uid) {
		spaced_why(why, whysz, "%s is owned by uid %u, expected %u", path, (unsigned)st.st_uid,
		       (unsigned)exp->owner_uid);
		r = SPACED_EPEER;
		goto out;
	}
	r = spaced_unix_diag_listener_of((uint64_t)st.st_dev, (uint64_t)st.st_ino, &sock_ino);
	if (r < 0) {
		spaced_why(why, whysz, "%s: no listening socket is bound to this inode (%s)", path,
		       spaced_strerror(r));
		r = SPACED_EPEER;
		goto out;
	}
	if ((r = spaced_pidref_expected(&ref, exp->pid, exp->start_time, why, whysz)) < 0)
		goto out;
	if (exp->check_exe) {
		r = spaced_pidref_check_exe(&ref, &exp->exe, "listener", why, whysz);
		if (r < 0)
			goto out;
	}
	r = spaced_pidref_holds_socket(&ref, sock_ino);
	if (r < 0) {
		spaced_why(why, whysz, "listening socket %" PRIu64 " of %s is not held by process %d (%s)",
		       sock_ino, path, (int)exp->pid, spaced_strerror(r));
		r = SPACED_EPEER;
		goto out;
	}
	r = 0;
out:
	spaced_pidref_done(&ref);
	return r;
}

int spaced_peer_connect_listener(const char *path, const struct spaced_expected_listener *exp,
                                 int *fd_out, char *why, size_t whysz)
{
	struct spaced_pidref peer = SPACED_PIDREF_NULL;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	uid_t uid;
	int fd = -1, r;

	if (path == NULL || strlen(path) >= sizeof(sa.sun_path))
		return SPACED_EINVAL;
	r = spaced_peer_verify_listener(path, exp, why, whysz);
	if (r < 0)
		return r;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	/* non-blocking for the connect only: a listener whose backlog is full
	 * (its process stopped, or flooded) is refused at once, never waited for */
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return SPACED_ESYS;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		spaced_why(why, whysz, "connect %s: %s", path,
		           errno == EAGAIN ? "its backlog is full" : strerror(errno));
		r = SPACED_EPEER;
		goto out;
	}
	(void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	r = spaced_pidref_from_peer(&peer, fd, &uid, NULL);
	if (r < 0) {
		spaced_why(why, whysz, "%s: peer credentials unavailable (%s)", path, spaced_strerror(r));
		r = SPACED_EPEER;
		goto out;
	}
	if (peer.pid != exp->pid || peer.start_time != exp->start_time) {
		spaced_why(why, whysz,
		       "%s: the connection's listener is process %d (start %" PRIu64
		       "), expected %d (start %" PRIu64 ")",
		       path, (int)peer.pid, peer.start_time, (int)exp->pid, exp->start_time);
		r = SPACED_EPEER;
		goto out;
	}
	*fd_out = fd;
	fd = -1;
	r = 0;
out:
	spaced_pidref_done(&peer);
	if (fd >= 0)
		close(fd);
	return r;
}

int spaced_peer_verify_caller(int fd, const struct spaced_expected_caller *exp,
                              struct spaced_pidref *out, char *why, size_t whysz)
{
	struct spaced_pidref ref = SPACED_PIDREF_NULL;
	uid_t uid;
	gid_t gid;
	int r;

	if (exp == NULL)
		return SPACED_EINVAL;
	r = spaced_pidref_from_peer(&ref, fd, &uid, &gid);
	if (r < 0) {
		spaced_why(why, whysz, "peer process could not be pinned (%s)", spaced_strerror(r));
		r = SPACED_EPEER;
		goto out;
	}
	if (uid != exp->uid) {
		spaced_why(why, whysz, "peer process %d runs as uid %u, expected %u", (int)ref.pid,
		       (unsigned)uid, (unsigned)exp->uid);
		r = SPACED_EPEER;
		goto out;
	}
	if (exp->check_gid && gid != exp->gid) {
		spaced_why(why, whysz, "peer process %d runs as gid %u, expected %u", (int)ref.pid,
		       (unsigned)gid, (unsigned)exp->gid);
		r = SPACED_EPEER;
		goto out;
	}
	if (exp->pid > 0 && ref.pid != exp->pid) {
		spaced_why(why, whysz, "peer is process %d, expected %d", (int)ref.pid, (int)exp->pid);
		r = SPACED_EPEER;
		goto out;
	}
	if (exp->pid > 0 && exp->start_time != 0 && ref.start_time != exp->start_time) {
		spaced_why(why, whysz,
		       "peer process %d start time %" PRIu64 " differs from the expected %" PRIu64
		       " (PID reused?)",
		       (int)ref.pid, ref.start_time, exp->start_time);
		r = SPACED_EPEER;
		goto out;
	}
	if (exp->check_exe) {
		r = spaced_pidref_check_exe(&ref, &exp->exe, "peer", why, whysz);
		if (r < 0)
			goto out;
	}
	if (spaced_pidref_check(&ref) < 0) {
		spaced_why(why, whysz, "peer process %d changed during verification", (int)ref.pid);
		r = SPACED_EPEER;
		goto out;
	}
	if (out != NULL) {
		*out = ref;
		ref = SPACED_PIDREF_NULL;
	}
	r = 0;
out:
	spaced_pidref_done(&ref);
	return r;
}
