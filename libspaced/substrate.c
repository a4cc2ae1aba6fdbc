/*
 * substrate.c — building, running, pausing and tearing down one execution of
 * the process substrate (see substrate.h and docs/substrate.md).
 *
 * Setup order. The supervisor prepares the state directory and the cgroups,
 * then clone3()s the child into new pid, mount, network, uts and ipc
 * namespaces. The child, still root of the host's user namespace but already
 * alone in its mount namespace, mounts the overlay root, the guest binary,
 * /dev and /proc, sets the hostname, brings lo up and pivots into the new
 * root. Only then does it enter a new user namespace (so every namespace it
 * lives in belongs to the host's user namespace and its root user has no
 * power over them: no mounts, no network or hostname changes) and a new
 * cgroup namespace, waits for the supervisor to write its uid/gid maps and to
 * put it into the cgroups, becomes root of its user namespace (host uid
 * uid_base), applies no_new_privs, Landlock and seccomp, and execs the guest.
 */
#include "substrate.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/sched.h>

#include "spaced_error.h"
#include "sub_internal.h"
#include "util.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

#define HOST_LAYERS_MAX 8

struct layer {
	char name[16];
	char lower[PATH_MAX];
	const char *mnt; /* mount point relative to the root: "" for the root */
};

struct spaced_sub {
	char state[PATH_MAX];
	char ldir[PATH_MAX]; /* holds upper/ and work/: the state dir, or (with a disk)
	                      * /proc/self/fd/<ldir_fd>: the disk mounted in the
	                      * execution's own mount namespace */
	int ldir_fd;         /* with a disk: the child's O_PATH descriptor of it */
	dev_t disk_rdev;     /* with a disk: its device number */
	uint64_t disk_bps;   /* the execution's disk I/O bound, 0 for none: its
	                      * snapshot's copy is paced to it too */
	uint32_t uid_base;
	char base[PATH_MAX]; /* "" when on the host's directories */
	bool templ;          /* base is a template: mapped by an idmapped mount */
	char base_label[PATH_MAX + 16]; /* what a snapshot's meta names: "host", the
	                                 * base's path or "template:<its directory name>" */
	bool rename_on_claim; /* started without identity nor hostname: named "spaced" until claimed */
	char etc_upper[16];   /* where /etc's upper directory is, under upper/: "etc" or "root/etc" */
	struct spaced_pidref init;
	struct sub_cgroup cg;
	int ctl; /* supervisor end of the control socketpair */
	bool ready;
	bool paused;
	bool has_identity;
	bool reaped;
	int exit_status;
	struct spaced_identity identity;
};


static int pathf(char *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int pathf(char *out, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(out, PATH_MAX, fmt, ap);
	va_end(ap);
	return n < 0 || n >= PATH_MAX ? SPACED_ETOOBIG : 0;
}

static int mkdir_p_one(const char *path, mode_t mode)
{
	if (mkdir(path, mode) < 0 && errno != EEXIST)
		return SPACED_ESYS;
	return 0;
}

/* ---- the layers ---------------------------------------------------------- */

/* The directories of the host that make up the root when no base is given:
 * each is an overlay of its own with an upper directory in upper/<name>. The
 * merged-/usr links (bin -> usr/bin …) are copied as links into skel/. */
static const char *const host_dirs[] = { "usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32" };

static int plan_layers(const char *state, const char *base, struct layer *layers, size_t *nlayers,
                       char *why, size_t whysz)
{
	char skel[PATH_MAX], p[PATH_MAX];
	size_t n = 0;

	if (base != NULL && base[0] != '\0') {
		snprintf(layers[0].name, sizeof(layers[0].name), "root");
		if (pathf(layers[0].lower, "%s", base) < 0)
			return SPACED_ETOOBIG;
		layers[0].mnt = "";
		*nlayers = 1;
		return 0;
	}
	if (pathf(skel, "%s/skel", state) < 0)
		return SPACED_ETOOBIG;
	if (mkdir_p_one(skel, 0755) < 0) {
		spaced_why(why, whysz, "mkdir %s: %s", skel, strerror(errno));
		return SPACED_ESYS;
	}
	snprintf(layers[0].name, sizeof(layers[0].name), "root");
	memcpy(layers[0].lower, skel, strlen(skel) + 1);
	layers[0].mnt = "";
	n = 1;
	for (size_t i = 0; i < sizeof(host_dirs) / sizeof(host_dirs[0]); i++) {
		char host[PATH_MAX], target[PATH_MAX];
		struct stat st;
		ssize_t tl;

		pathf(host, "/%s", host_dirs[i]);
		pathf(p, "%s/%s", skel, host_dirs[i]);
		if (lstat(host, &st) < 0)
			continue;
		if (S_ISLNK(st.st_mode)) {
			tl = readlink(host, target, sizeof(target) - 1);
			if (tl < 0)
				continue;
			target[tl] = '\0';
			if (symlink(target, p) < 0 && errno != EEXIST) {
				spaced_why(why, whysz, "symlink %s: %s", p, strerror(errno));
				return SPACED_ESYS;
			}
			continue;
		}
		if (!S_ISDIR(st.st_mode) || n >= HOST_LAYERS_MAX)
			continue;
		if (mkdir_p_one(p, 0755) < 0) {
			spaced_why(why, whysz, "mkdir %s: %s", p, strerror(errno));
			return SPACED_ESYS;
		}
		snprintf(layers[n].name, sizeof(layers[n].name), "%s", host_dirs[i]);
		memcpy(layers[n].lower, host, strlen(host) + 1);
		layers[n].mnt = host_dirs[i];
		n++;
	}
	*nlayers = n;
	return 0;
}

/* The directory rel beneath dirfd (an O_PATH descriptor), no symlink followed
 * on the way: a restored snapshot's upper layer is the tenant's, and a
 * symlink of its (var -> /some/host/dir) was followed by the launcher, which
 * is root and still sees the host's files. -1 with errno (ELOOP for a
 * symlink, ENOTDIR, ENOENT). */
static int open_beneath(int dirfd, const char *rel)
{
	return spaced_open_beneath(dirfd, rel, O_PATH | O_DIRECTORY);
}

/* Makes the directory leaf in parent (a descriptor) with mode, owned by
 * uid_base when owner; 0, 1 when something is there already (kept), or -1. */
static int mkdir_in(int parent, const char *leaf, mode_t mode, bool owner, uint32_t uid_base)
{
	int fd;

	if (mkdirat(parent, leaf, mode) < 0)
		return errno == EEXIST ? 1 : -1;
	fd = openat(parent, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (fchmod(fd, mode) < 0 || (owner && fchown(fd, uid_base, uid_base) < 0)) {
		close(fd);
		return -1;
	}
	close(fd);
	return 0;
}

/* upper/<layer> and work/<layer>; in the root layer, the mount points and the
 * directories the execution's root user may write to. Existing entries (a
 * restored snapshot) are kept as they are; nothing is made through a symlink
 * of theirs. */
static int prepare_dirs(const char *state, const char *ldir, const struct layer *layers, size_t nlayers,
                        uint32_t uid_base, bool templ, char *why, size_t whysz)
{
	static const struct {
		const char *path;
		mode_t mode;
		bool owned; /* by the execution's root */
		bool mount; /* a mount point: a directory, whatever the base has there */
	} root_dirs[] = {
		{ "dev", 0755, false, true }, { "proc", 0555, false, true }, { "tmp", 01777, false, false },
		{ "root", 0700, true, false }, { "home", 0755, true, false }, { "workspace", 0755, true, false },
		{ ".spaced", 0755, false, true }, { "var", 0755, false, false }, { "var/tmp", 01777, false, false },
		{ "run", 0755, false, false },
	};
	char p[PATH_MAX];
	int fd, rootfd = -1;

	pathf(p, "%s/upper", ldir);
	if (mkdir_p_one(p, 0755) < 0)
		goto fail;
	pathf(p, "%s/work", ldir);
	if (mkdir_p_one(p, 0755) < 0)
		goto fail;
	pathf(p, "%s/rootfs", state);
	if (mkdir_p_one(p, 0755) < 0)
		goto fail;
	for (size_t i = 0; i < nlayers; i++) {
		struct stat lst;

		pathf(p, "%s/upper/%s", ldir, layers[i].name);
		if (mkdir_p_one(p, 0755) < 0)
			goto fail;
		/* the merged directory takes the upper directory's owner and mode:
		 * give it the lower one's (a template owned by the execution's root
		 * stays writable at its top) */
		if (stat(layers[i].lower, &lst) < 0 || chown(p, lst.st_uid, lst.st_gid) < 0 ||
		    chmod(p, lst.st_mode & 07777) < 0)
			goto fail;
		pathf(p, "%s/work/%s", ldir, layers[i].name);
		if (mkdir_p_one(p, 0755) < 0)
			goto fail;
	}
	pathf(p, "%s/upper/root", ldir);
	rootfd = open(p, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (rootfd < 0)
		goto fail;
	for (size_t i = 0; i < sizeof(root_dirs) / sizeof(root_dirs[0]); i++) {
		struct stat st;
		char parent[32];
		const char *leaf = strrchr(root_dirs[i].path, '/');
		int pfd, r;

		/* what the base has stays as the base has it (owner, mode) — but a
		 * mount point is a directory of the upper layer unless the base has
		 * a directory there: the mounts below are made before pivot_root,
		 * on paths the kernel resolves on the host, and a template's
		 * symlink there (dev -> /some/host/dir) was followed */
		pathf(p, "%s/%s", layers[0].lower, root_dirs[i].path);
		if (lstat(p, &st) == 0 && (!root_dirs[i].mount || S_ISDIR(st.st_mode)))
			continue;
		pathf(p, "%s/upper/root/%s", ldir, root_dirs[i].path);
		/* its parent in the upper layer, reached without a symlink: under a
		 * non-directory there (var/tmp under a base's var symlink, or a
		 * restored snapshot's) is that layout's, left as it is */
		if (leaf) {
			snprintf(parent, sizeof(parent), "%.*s", (int)(leaf - root_dirs[i].path), root_dirs[i].path);
			leaf++;
			pfd = open_beneath(rootfd, parent);
			if (pfd < 0 && (errno == ENOENT || errno == ELOOP || errno == ENOTDIR || errno == EXDEV) &&
			    !root_dirs[i].mount)
				continue;
		} else {
			leaf = root_dirs[i].path;
			pfd = fcntl(rootfd, F_DUPFD_CLOEXEC, 0);
		}
		if (pfd < 0)
			goto fail;
		if (fstatat(pfd, leaf, &st, AT_SYMLINK_NOFOLLOW) == 0) {
			if (S_ISDIR(st.st_mode) || !root_dirs[i].mount) {
				close(pfd);
				continue; /* a restored snapshot's own entry */
			}
			if (unlinkat(pfd, leaf, 0) < 0) {
				close(pfd);
				goto fail;
			}
		}
		/* on a template, root inside owns the root: what is made here too */
		r = mkdir_in(pfd, leaf, root_dirs[i].mode, root_dirs[i].owned || templ, uid_base);
		close(pfd);
		if (r < 0)
			goto fail;
	}
	close(rootfd);
	rootfd = -1;
	/* the bind mount point of the guest binary: a regular file of the upper
	 * layer, always. It shadows whatever the base has there: a template
	 * whose /.spaced was a symlink to a host directory holding the real
	 * guest passed a check made through it, and the guest executed after
	 * pivot_root was the template's own file at that path. */
	struct stat gst;
	pathf(p, "%s/upper/root/.spaced", ldir);
	if (lstat(p, &gst) == 0 && !S_ISDIR(gst.st_mode) && unlink(p) < 0)
		goto fail;
	if (lstat(p, &gst) < 0 && mkdir(p, 0755) < 0)
		goto fail;
	pathf(p, "%s/upper/root%s", ldir, SPACED_SUB_GUEST_PATH);
	if (lstat(p, &gst) == 0 && !S_ISREG(gst.st_mode) && unlink(p) < 0 && rmdir(p) < 0)
		goto fail;
	fd = open(p, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0555);
	if (fd < 0)
		goto fail;
	close(fd);
	return 0;
fail:
	spaced_why(why, whysz, "prepare %s: %s", p, strerror(errno));
	if (rootfd >= 0)
		close(rootfd);
	return SPACED_ESYS;
}

/* /etc/hostname and /etc/hosts naming the execution's hostname, written into
 * the upper directory that carries /etc (kept when a snapshot brought them;
 * none written where a snapshot's upper layer has something other than a
 * directory at /etc: never through a symlink of the tenant's). */
static int write_etc(const char *state, const struct layer *layers, size_t nlayers,
                     const char *hostname, char *why, size_t whysz)
{
	char p[PATH_MAX], text[256];
	const char *names[2] = { "hostname", "hosts" };
	struct stat st;
	bool etc_layer = false;
	int dirfd = -1;

	for (size_t i = 0; i < nlayers; i++)
		if (strcmp(layers[i].name, "etc") == 0)
			etc_layer = true;
	if (etc_layer) {
		pathf(p, "%s/upper/etc", state);
		if ((dirfd = open(p, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
			goto fail;
	} else {
		int rootfd, r = 0;

		pathf(p, "%s/etc", layers[0].lower);
		if (lstat(p, &st) < 0 || !S_ISDIR(st.st_mode))
			return 0; /* a base without /etc (a symlink there is not followed on the host) */
		pathf(p, "%s/upper/root", state);
		if ((rootfd = open(p, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
			goto fail;
		if (mkdirat(rootfd, "etc", 0755) == 0) {
			int fd = openat(rootfd, "etc", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

			if (fd < 0 || fchown(fd, st.st_uid, st.st_gid) < 0 || fchmod(fd, st.st_mode & 07777) < 0)
				r = -1;
			if (fd >= 0)
				close(fd);
		} else if (errno != EEXIST) {
			r = -1;
		}
		pathf(p, "%s/upper/root/etc", state);
		if (r == 0 && (dirfd = open_beneath(rootfd, "etc")) < 0 && (errno == ELOOP || errno == ENOTDIR)) {
			close(rootfd);
			return 0; /* a restored snapshot's /etc is no directory: its own layout */
		}
		close(rootfd);
		if (r < 0 || dirfd < 0)
			goto fail;
	}
	for (int i = 0; i < 2; i++) {
		int fd, n;

		pathf(p, "%s/upper/%setc/%s", state, etc_layer ? "" : "root/", names[i]);
		if (fstatat(dirfd, names[i], &st, AT_SYMLINK_NOFOLLOW) == 0)
			continue;
		n = i == 0 ? snprintf(text, sizeof(text), "%s\n", hostname)
		           : snprintf(text, sizeof(text), "127.0.0.1\tlocalhost %s\n::1\tlocalhost ip6-localhost\n",
		                      hostname);
		fd = openat(dirfd, names[i], O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
		if (fd < 0)
			goto fail;
		if (n < 0 || write(fd, text, (size_t)n) != n) {
			close(fd);
			goto fail;
		}
		close(fd);
	}
	close(dirfd);
	return 0;
fail:
	spaced_why(why, whysz, "writing %s: %s", p, strerror(errno));
	if (dirfd >= 0)
		close(dirfd);
	return SPACED_ESYS;
}

/* ---- inside the child ------------------------------------------------------ */

struct child_args {
	const char *state;
	const char *ldir;     /* holds upper/ and work/ */
	const char *disk_dev; /* the loop device to mount on ldir, or NULL */
	const char *restore_from; /* snapshot whose upper/ the layer starts from, or NULL */
	const char *template_dir; /* a template to mount (idmapped) on layers[0].lower, or NULL */
	int tmpl_ns;              /* the user namespace of its mapping */
	const struct layer *layers;
	size_t nlayers;
	const char *guest_path;
	const char *hostname;
	const char *identity_text; /* NULL: sent later */
	bool service_ports;
	uint32_t uid_base;
	uint64_t disk_bps;         /* the restore's pace (bytes per second, 0: none) */
	int ctl;                   /* child end of the control socket */
	int sync;                  /* child end of the setup socket */
	int log_fd;
};

static __attribute__((noreturn)) void child_fail_msg(int sync, const char *msg)
{
	char buf[600];
	int n = snprintf(buf, sizeof(buf), "E%s", msg);

	if (n > 0)
		(void)!send(sync, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1, MSG_NOSIGNAL);
	_exit(127);
}

static __attribute__((noreturn)) void child_fail(int sync, const char *what)
{
	char msg[512];

	snprintf(msg, sizeof(msg), "%s: %s", what, strerror(errno));
	child_fail_msg(sync, msg);
}

/* Sends "U" with fd (when >= 0) in SCM_RIGHTS. */
static int send_u(int sync, int fd)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} cb;
	struct iovec iov = { .iov_base = (void *)(uintptr_t)"U", .iov_len = 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (fd >= 0) {
		struct cmsghdr *c;

		memset(&cb, 0, sizeof(cb));
		mh.msg_control = cb.b;
		mh.msg_controllen = sizeof(cb.b);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	return sendmsg(sync, &mh, MSG_NOSIGNAL) == 1 ? 0 : -1;
}

static void bring_lo_up(int sync)
{
	struct ifreq ifr;
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		child_fail(sync, "socket for lo");
	memset(&ifr, 0, sizeof(ifr));
	memcpy(ifr.ifr_name, "lo", 3);
	if (ioctl(fd, SIOCGIFFLAGS, &ifr) < 0)
		child_fail(sync, "SIOCGIFFLAGS lo");
	ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
	if (ioctl(fd, SIOCSIFFLAGS, &ifr) < 0)
		child_fail(sync, "SIOCSIFFLAGS lo");
	close(fd);
}

/* A mount point inside the new root, checked before the mount: path itself
 * (never a symlink: the mount would follow it on the host) is of type
 * (S_IFDIR, S_IFREG) — prepare_dirs made it so in the upper layer. */
static void mount_point(int sync, const char *path, mode_t type)
{
	struct stat st;
	char msg[PATH_MAX + 64];

	if (lstat(path, &st) < 0 || (st.st_mode & S_IFMT) != type) {
		snprintf(msg, sizeof(msg), "mount point %s is not a %s", path, type == S_IFDIR ? "directory" : "file");
		child_fail_msg(sync, msg);
	}
}

static void bind_node(int sync, const char *root, const char *name)
{
	char src[64], dst[PATH_MAX];
	int fd;

	snprintf(src, sizeof(src), "/dev/%s", name);
	if (pathf(dst, "%s/dev/%s", root, name) < 0)
		child_fail(sync, "dev path");
	fd = open(dst, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
	if (fd < 0)
		child_fail(sync, dst);
	close(fd);
	if (mount(src, dst, NULL, MS_BIND, NULL) < 0)
		child_fail(sync, dst);
}

static __attribute__((noreturn)) void child_main(const struct child_args *a)
{
	static const char *const nodes[] = { "null", "zero", "full", "random", "urandom", "tty" };
	char root[PATH_MAX], p[PATH_MAX], opts[3 * PATH_MAX + 64], msg[8];
	static char e_path[] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
	static char e_home[] = "HOME=/root", e_lang[] = "LANG=C.UTF-8", e_term[] = "TERM=xterm-256color";
	static char a_name[] = "spaced-guest", a_root[] = "--root", a_slash[] = "/";
	static char a_cfd[] = "--control-fd", a_3[] = "3", a_id[] = "--identity";
	static char a_oom[] = "--oom-fd", a_4[] = "4";
	/* ServicePorts (when asked): a transport connection for another port than
	 * the guest API's is joined to that port inside (only the launcher's
	 * root-owned socket hands connections over; spaced-netgtw checks them, R5) */
	static char a_sp[] = "--service-ports";
	static char guest[] = SPACED_SUB_GUEST_PATH;
	char idtext[SPACED_IDENTITY_TEXT_MAX];
	char *argv[12];
	char *envp[] = { e_path, e_home, e_lang, e_term, NULL };
	int sync = a->sync, argc = 0;

	char why[512] = "";
	int ldir_fd = -1;

	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
		child_fail(sync, "PR_SET_PDEATHSIG");
	/* the guest's own OOM score, opened while this process is still the
	 * host's root: the guest is never dumpable (it is sealed from its
	 * tenant), so its /proc files belong to a root it cannot act as, and it
	 * could not open this file itself. It raises its score through it for
	 * every command it starts (spaced-guest proc.c): the commands, not the
	 * guest, are what the kernel kills at the execution's memory limit. */
	int oomfd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (oomfd >= 0 && oomfd < 10) { /* out of the way of the fds set up below */
		int high = fcntl(oomfd, F_DUPFD_CLOEXEC, 10);
		close(oomfd);
		oomfd = high;
	}
	/* nothing done here may propagate back to the host */
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		child_fail(sync, "make / private");
	if (pathf(root, "%s/rootfs", a->state) < 0)
		child_fail(sync, "rootfs path");
	/* the writable layer: its own disk, mounted here only (it goes away
	 * with the last process of the execution) */
	if (a->disk_dev != NULL) {
		if (mkdir_p_one(a->ldir, 0755) < 0)
			child_fail(sync, "mkdir the disk's mount point");
		if (sub_disk_mount(a->disk_dev, a->ldir) < 0)
			child_fail(sync, "mount the execution's disk");
		ldir_fd = open(a->ldir, O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (ldir_fd < 0)
			child_fail(sync, "open the execution's disk");
	}
	if (a->template_dir != NULL) {
		if (sub_tmpl_mount(a->template_dir, a->tmpl_ns, a->layers[0].lower) < 0)
			child_fail(sync, "mount the template");
		close(a->tmpl_ns);
	}
	if (a->restore_from != NULL) {
		/* owners come back from the canonical snapshot range into this execution's */
		struct spaced_idshift sh = { SPACED_SUB_SNAP_UID_BASE, a->uid_base, SPACED_SUB_UID_RANGE };

		if (pathf(p, "%s/upper", a->restore_from) < 0 || pathf(opts, "%s/upper", a->ldir) < 0)
			child_fail(sync, "restore path");
		if (spaced_sub_copy_tree(p, opts, &sh, a->disk_bps, why, sizeof(why)) < 0)
			child_fail_msg(sync, why);
	}
	if (prepare_dirs(a->state, a->ldir, a->layers, a->nlayers, a->uid_base, a->template_dir != NULL, why,
	                 sizeof(why)) < 0 ||
	    write_etc(a->ldir, a->layers, a->nlayers, a->hostname, why, sizeof(why)) < 0)
		child_fail_msg(sync, why);
	for (size_t i = 0; i < a->nlayers; i++) {
		const struct layer *l = &a->layers[i];

		if (snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s/upper/%s,workdir=%s/work/%s",
		             l->lower, a->ldir, l->name, a->ldir, l->name) >= (int)sizeof(opts))
			child_fail(sync, "overlay options");
		if (pathf(p, "%s%s%s", root, l->mnt[0] ? "/" : "", l->mnt) < 0)
			child_fail(sync, "layer path");
		if (mount("overlay", p, "overlay", MS_NOSUID | MS_NODEV, opts) < 0)
			child_fail(sync, "mount overlay");
	}
	/* the guest binary, read-only */
	pathf(p, "%s/.spaced", root);
	mount_point(sync, p, S_IFDIR);
	pathf(p, "%s%s", root, SPACED_SUB_GUEST_PATH);
	mount_point(sync, p, S_IFREG);
	if (mount(a->guest_path, p, NULL, MS_BIND, NULL) < 0)
		child_fail(sync, "bind guest binary");
	if (mount(NULL, p, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
		child_fail(sync, "read-only guest binary");
	/* /dev: a small tmpfs with the harmless nodes and a private devpts */
	pathf(p, "%s/dev", root);
	mount_point(sync, p, S_IFDIR);
	if (mount("tmpfs", p, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=65536k,nr_inodes=4096") < 0)
		child_fail(sync, "mount /dev");
	for (size_t i = 0; i < sizeof(nodes) / sizeof(nodes[0]); i++)
		bind_node(sync, root, nodes[i]);
	pathf(p, "%s/dev/pts", root);
	if (mkdir(p, 0755) < 0)
		child_fail(sync, "mkdir /dev/pts");
	char ptsopt[96];
	snprintf(ptsopt, sizeof ptsopt, "newinstance,ptmxmode=0666,mode=0620,max=%u", SPACED_SUB_PTY_MAX);
	if (mount("devpts", p, "devpts", MS_NOSUID | MS_NOEXEC, ptsopt) < 0)
		child_fail(sync, "mount devpts");
	pathf(p, "%s/dev/shm", root);
	if (mkdir(p, 01777) < 0 || chmod(p, 01777) < 0)
		child_fail(sync, "mkdir /dev/shm");
	pathf(p, "%s/dev/ptmx", root);
	if (symlink("pts/ptmx", p) < 0)
		child_fail(sync, "/dev/ptmx");
	pathf(p, "%s/dev/fd", root);
	if (symlink("/proc/self/fd", p) < 0)
		child_fail(sync, "/dev/fd");
	pathf(p, "%s/dev/stdin", root);
	(void)!symlink("/proc/self/fd/0", p);
	pathf(p, "%s/dev/stdout", root);
	(void)!symlink("/proc/self/fd/1", p);
	pathf(p, "%s/dev/stderr", root);
	(void)!symlink("/proc/self/fd/2", p);
	/* /proc of the new pid namespace; the kernel knobs read-only */
	pathf(p, "%s/proc", root);
	mount_point(sync, p, S_IFDIR);
	if (mount("proc", p, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
		child_fail(sync, "mount /proc");
	pathf(p, "%s/proc/sys", root);
	if (mount(p, p, NULL, MS_BIND | MS_REC, NULL) < 0 ||
	    mount(NULL, p, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
		child_fail(sync, "read-only /proc/sys");
	pathf(p, "%s/proc/sysrq-trigger", root);
	if (mount("/dev/null", p, NULL, MS_BIND, NULL) < 0 && errno != ENOENT)
		child_fail(sync, "mask /proc/sysrq-trigger");
	if (sethostname(a->hostname, strlen(a->hostname)) < 0)
		child_fail(sync, "sethostname");
	bring_lo_up(sync);
	/* into the new root; the old one is detached, not reachable any more */
	if (chdir(root) < 0)
		child_fail(sync, "chdir rootfs");
	if (syscall(SYS_pivot_root, ".", ".") < 0)
		child_fail(sync, "pivot_root");
	if (umount2(".", MNT_DETACH) < 0)
		child_fail(sync, "detach old root");
	if (chdir("/") < 0)
		child_fail(sync, "chdir /");
	/* The user namespace last: it owns none of the namespaces above. It is
	 * made as host uid uid_base, so the kernel's per-user counts (inotify,
	 * pipe buffers, epoll watches …) are this execution's own: made by root,
	 * every execution would share root's. */
	if (a->uid_base != 0) {
		if (setgroups(0, NULL) < 0 || setresgid(a->uid_base, a->uid_base, a->uid_base) < 0 ||
		    setresuid(a->uid_base, a->uid_base, a->uid_base) < 0)
			child_fail(sync, "become the execution's host uid");
		/* a change of credentials clears the parent-death signal */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
			child_fail(sync, "PR_SET_PDEATHSIG");
	}
	if (unshare(CLONE_NEWUSER) < 0)
		child_fail(sync, "unshare user namespace");
	if (send_u(sync, ldir_fd) < 0)
		_exit(127);
	if (ldir_fd >= 0)
		close(ldir_fd);
	if (recv(sync, msg, sizeof(msg), 0) != 1 || msg[0] != 'M')
		_exit(127);
	/* a cgroup namespace rooted at the execution's own cgroup */
	if (unshare(CLONE_NEWCGROUP) < 0)
		child_fail(sync, "unshare cgroup namespace");
	if (setgroups(0, NULL) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0)
		child_fail(sync, "become root of the user namespace");
	/* fds: 0 /dev/null, 1-2 log, 3 control, 4 the guest's OOM score, nothing else */
	{
		int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
		int ctl = fcntl(a->ctl, F_DUPFD_CLOEXEC, 10);
		int log = a->log_fd >= 0 ? fcntl(a->log_fd, F_DUPFD_CLOEXEC, 10) : nul;

		if (nul < 0 || ctl < 0 || log < 0 || dup2(nul, 0) < 0 || dup2(log, 1) < 0 ||
		    dup2(log, 2) < 0 || dup2(ctl, 3) < 0)
			child_fail(sync, "set up fds");
		/* 4: its OOM score (above), when it could be opened */
		if (oomfd >= 0 && (dup2(oomfd, 4) < 0 || fcntl(4, F_SETFD, 0) < 0))
			child_fail(sync, "set up fds");
		/* whatever else was inherited closes at exec (sync too) */
		if (syscall(SYS_close_range, oomfd >= 0 ? 5U : 4U, ~0U, 4U /* CLOSE_RANGE_CLOEXEC */) < 0)
			child_fail(sync, "close_range");
	}
	if (sub_confine() < 0)
		child_fail(sync, "seccomp");
	argv[argc++] = a_name;
	argv[argc++] = a_root;
	argv[argc++] = a_slash;
	argv[argc++] = a_cfd;
	argv[argc++] = a_3;
	if (oomfd >= 0) {
		argv[argc++] = a_oom;
		argv[argc++] = a_4;
	}
	if (a->service_ports)
		argv[argc++] = a_sp;
	if (a->identity_text != NULL) {
		snprintf(idtext, sizeof(idtext), "%s", a->identity_text);
		argv[argc++] = a_id;
		argv[argc++] = idtext;
	}
	argv[argc] = NULL;
	/* sync is close-on-exec: the supervisor reads EOF once the exec happened */
	execve(guest, argv, envp);
	child_fail(sync, "exec " SPACED_SUB_GUEST_PATH);
}

/* ---- the supervisor's side --------------------------------------------------- */

static int check_opt_path(const char *p)
{
	/* overlay mount options are comma and colon separated */
	return strpbrk(p, ",:\\") == NULL ? 0 : SPACED_EINVAL;
}

static int read_meta(const char *snap, char *idtext, size_t idsz, char *base, size_t basesz)
{
	char path[PATH_MAX], buf[4096], *line, *save = NULL;
	bool have_id = false, have_base = false;
	ssize_t n;
	int fd;

	if (pathf(path, "%s/meta", snap) < 0)
		return SPACED_ETOOBIG;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return SPACED_ENOENT;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return SPACED_EFORMAT;
	buf[n] = '\0';
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (strncmp(line, "identity=", 9) == 0 && strlen(line + 9) < idsz) {
			strcpy(idtext, line + 9);
			have_id = true;
		} else if (strncmp(line, "base=", 5) == 0 && strlen(line + 5) < basesz) {
			strcpy(base, line + 5);
			have_base = true;
		}
	}
	return have_id && have_base ? 0 : SPACED_EFORMAT;
}

/* The restore rules of I2: a snapshot becomes a new execution of the same
 * sandbox with a strictly greater generation, on the same base. */
static int check_restore(const char *snap, const struct spaced_identity *id, const char *base,
                         char *why, size_t whysz)
{
	char idtext[SPACED_IDENTITY_TEXT_MAX], sbase[PATH_MAX];
	struct spaced_identity old;
	int r;

	if (id == NULL) {
		spaced_why(why, whysz, "a restore needs the new execution's identity");
		return SPACED_EINVAL;
	}
	r = read_meta(snap, idtext, sizeof(idtext), sbase, sizeof(sbase));
	if (r < 0) {
		spaced_why(why, whysz, "%s: not a complete snapshot (meta)", snap);
		return r;
	}
	if (spaced_identity_decode(&old, idtext, strlen(idtext)) < 0) {
		spaced_why(why, whysz, "%s: snapshot identity unreadable", snap);
		return SPACED_EFORMAT;
	}
	if (strcmp(old.sandbox, id->sandbox) != 0) {
		spaced_why(why, whysz, "snapshot of sandbox %s cannot start sandbox %s", old.sandbox, id->sandbox);
		return SPACED_EIDENTITY;
	}
	if (id->generation <= old.generation) {
		spaced_why(why, whysz, "restore needs a generation above the snapshot's %" PRIu64 " (got %" PRIu64 ")",
		       old.generation, id->generation);
		return SPACED_EIDENTITY;
	}
	if (strcmp(sbase, base) != 0) {
		spaced_why(why, whysz, "snapshot was taken on base %s, not %s", sbase, base);
		return SPACED_EINVAL;
	}
	return 0;
}

static int write_map(pid_t pid, const char *file, uint32_t base)
{
	char path[64], text[64];

	snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, file);
	snprintf(text, sizeof(text), "0 %u %u\n", (unsigned)base, (unsigned)SPACED_SUB_UID_RANGE);
	return sub_write_file(path, text);
}

/* Reads the child's setup report: 1 for "U", 0 for EOF (exec'ed), or an error
 * with the child's message in why. A descriptor passed along with "U" goes to
 * *passed (when passed is not NULL; else it is closed). */
static int read_sync(int fd, int *passed, char *why, size_t whysz)
{
	char msg[640];
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * 2)];
	} cb;
	struct iovec iov = { .iov_base = msg, .iov_len = sizeof(msg) - 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b,
	                     .msg_controllen = sizeof(cb.b) };
	ssize_t n;

	do
		n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); n > 0 && c != NULL; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
			int got;

			memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (passed != NULL && *passed < 0 && n == 1 && msg[0] == 'U')
				*passed = got;
			else
				close(got);
		}
	}
	if (n < 0)
		return SPACED_ESYS;
	if (n == 0)
		return 0;
	msg[n] = '\0';
	if (n == 1 && msg[0] == 'U')
		return 1;
	spaced_why(why, whysz, "execution setup failed: %s", msg[0] == 'E' ? msg + 1 : "unknown report");
	return SPACED_ESYS;
}

static unsigned int cgroup_seq;

int spaced_sub_create(const struct spaced_sub_config *cfg, struct spaced_sub **out, char *why,
                      size_t whysz)
{
	struct layer layers[HOST_LAYERS_MAX];
	struct spaced_sub *s = NULL;
	struct child_args ca;
	char idtext[SPACED_IDENTITY_TEXT_MAX], cgname[128], p[PATH_MAX], p2[PATH_MAX], disk_dev[32];
	const char *hostname;
	int ctl[2] = { -1, -1 }, sync[2] = { -1, -1 }, pidfd = -1, loopfd = -1, tmpl_ns = -1, r;
	size_t nlayers = 0;
	struct stat st;
	pid_t pid = -1;

	if (cfg == NULL || out == NULL || cfg->state_dir == NULL || cfg->guest_path == NULL)
		return SPACED_EINVAL;
	if (stat(cfg->guest_path, &st) < 0 || !S_ISREG(st.st_mode)) {
		spaced_why(why, whysz, "guest binary %s not found", cfg->guest_path);
		return SPACED_ENOENT;
	}
	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return SPACED_ENOMEM;
	s->ctl = -1;
	s->ldir_fd = -1;
	s->init = SPACED_PIDREF_NULL;
	s->uid_base = cfg->uid_base;
	s->disk_bps = cfg->disk_bps;
	if (mkdir(cfg->state_dir, 0700) < 0 && errno != EEXIST) {
		spaced_why(why, whysz, "mkdir %s: %s", cfg->state_dir, strerror(errno));
		r = SPACED_ESYS;
		goto fail;
	}
	if (realpath(cfg->state_dir, s->state) == NULL) {
		r = SPACED_ESYS;
		goto fail;
	}
	if (cfg->base_dir != NULL && cfg->template_dir != NULL) {
		spaced_why(why, whysz, "a base and a template exclude each other");
		r = SPACED_EINVAL;
		goto fail;
	}
	{
		const char *b = cfg->template_dir ? cfg->template_dir : cfg->base_dir;

		if (b != NULL && realpath(b, s->base) == NULL) {
			spaced_why(why, whysz, "base %s: %s", b, strerror(errno));
			r = SPACED_ENOENT;
			goto fail;
		}
		s->templ = cfg->template_dir != NULL;
		if (s->templ) {
			const char *slash = strrchr(s->base, '/');

			snprintf(s->base_label, sizeof(s->base_label), "template:%s", slash ? slash + 1 : s->base);
		} else {
			snprintf(s->base_label, sizeof(s->base_label), "%s", s->base[0] ? s->base : "host");
		}
	}
	if (check_opt_path(s->state) < 0 || check_opt_path(s->base) < 0) {
		spaced_why(why, whysz, "state and base paths may not contain ',', ':' or '\\'");
		r = SPACED_EINVAL;
		goto fail;
	}
	if (cfg->identity != NULL) {
		s->identity = *cfg->identity;
		s->has_identity = true;
		if (spaced_identity_encode(&s->identity, idtext, sizeof(idtext)) < 0) {
			r = SPACED_EINVAL;
			goto fail;
		}
	}
	/* a writable layer left by an earlier execution is never taken over: an
	 * execution starts empty or from a snapshot (I2) */
	pathf(p, "%s/upper", s->state);
	pathf(p2, "%s/disk.img", s->state);
	if (access(p, F_OK) == 0 || access(p2, F_OK) == 0) {
		spaced_why(why, whysz, "%s holds the writable layer of an earlier execution", s->state);
		s->state[0] = '\0'; /* not ours to remove */
		r = SPACED_EEXIST;
		goto fail;
	}
	pathf(p, "%s/work", s->state);
	(void)spaced_sub_rm_rf(p);
	memcpy(s->ldir, s->state, sizeof(s->ldir));
	disk_dev[0] = '\0';
	if (cfg->disk_bytes > 0) {
		/* the writable layer on a disk of its own, mounted by the child in
		 * the execution's mount namespace: bounded, and not memory */
		pathf(p2, "%s/disk.img", s->state);
		r = sub_disk_create(p2, cfg->disk_bytes, cfg->disk_bps, cfg->disk_iops, &loopfd, disk_dev,
		                    sizeof(disk_dev), &s->disk_rdev, why, whysz);
		if (r < 0)
			goto fail;
		pathf(s->ldir, "%s/fs", s->state);
	}
	pathf(p, "%s/skel", s->state);
	(void)spaced_sub_rm_rf(p);
	if (cfg->restore_from != NULL) {
		r = check_restore(cfg->restore_from, cfg->identity, s->base_label, why, whysz);
		if (r < 0)
			goto fail;
	}
	r = plan_layers(s->state, s->base[0] ? s->base : NULL, layers, &nlayers, why, whysz);
	if (r < 0)
		goto fail;
	if (s->templ) {
		/* the lower layer is the template seen through the execution's
		 * mapping, mounted here in its mount namespace only */
		if (pathf(layers[0].lower, "%s/lower", s->state) < 0 || mkdir_p_one(layers[0].lower, 0700) < 0) {
			spaced_why(why, whysz, "mkdir %s/lower: %s", s->state, strerror(errno));
			r = SPACED_ESYS;
			goto fail;
		}
		r = sub_tmpl_userns(cfg->uid_base, &tmpl_ns, why, whysz);
		if (r < 0)
			goto fail;
	}
	hostname = cfg->hostname ? cfg->hostname : s->has_identity ? s->identity.sandbox : "spaced";
	s->rename_on_claim = !cfg->hostname && !s->has_identity;
	snprintf(s->etc_upper, sizeof(s->etc_upper), "%s", s->base[0] ? "root/etc" : "etc");
	if (cfg->cgroup_name != NULL)
		snprintf(cgname, sizeof(cgname), "%s", cfg->cgroup_name);
	else
		snprintf(cgname, sizeof(cgname), "spaced-%d-%u", (int)getpid(), cgroup_seq++);
	r = sub_confine_prepare();
	if (r < 0) {
		spaced_why(why, whysz, "building the seccomp filter failed");
		goto fail;
	}
	{
		struct sub_limits lim = { .cpu_milli = cfg->cpu_milli, .mem_bytes = cfg->memory_bytes,
		                          .pids_max = cfg->pids_max };

		if (s->disk_rdev != 0 && (cfg->disk_bps > 0 || cfg->disk_iops > 0)) {
			lim.io_bps = cfg->disk_bps;
			lim.io_iops = cfg->disk_iops;
			lim.io_dev[0] = s->disk_rdev;
			lim.io_dev[1] = sub_disk_block_dev(s->base[0] ? s->base : "/usr");
		}
		r = sub_cgroup_create(&s->cg, cgname, &lim, why, whysz);
	}
	if (r < 0)
		goto fail;
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ctl) < 0 ||
	    socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sync) < 0) {
		r = SPACED_ESYS;
		goto fail;
	}
	memset(&ca, 0, sizeof(ca));
	ca.state = s->state;
	ca.ldir = s->ldir;
	ca.disk_dev = disk_dev[0] ? disk_dev : NULL;
	ca.restore_from = cfg->restore_from;
	ca.disk_bps = cfg->disk_bps;
	ca.template_dir = s->templ ? s->base : NULL;
	ca.tmpl_ns = tmpl_ns;
	ca.layers = layers;
	ca.nlayers = nlayers;
	ca.guest_path = cfg->guest_path;
	ca.hostname = hostname;
	ca.identity_text = s->has_identity ? idtext : NULL;
	ca.service_ports = cfg->service_ports;
	ca.uid_base = cfg->uid_base;
	ca.ctl = ctl[1];
	ca.sync = sync[1];
	ca.log_fd = cfg->log_fd;

	{
		struct clone_args args;

		memset(&args, 0, sizeof(args));
		args.flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWIPC |
		             CLONE_PIDFD;
		args.pidfd = (uint64_t)(uintptr_t)&pidfd;
		args.exit_signal = SIGCHLD;
		pid = (pid_t)syscall(SYS_clone3, &args, sizeof(args));
	}
	if (pid < 0) {
		spaced_why(why, whysz, "clone3: %s", strerror(errno));
		r = SPACED_ESYS;
		goto fail;
	}
	if (pid == 0) {
		close(ctl[0]);
		close(sync[0]);
		child_main(&ca);
	}
	close(ctl[1]);
	close(sync[1]);
	ctl[1] = sync[1] = -1;
	if (tmpl_ns >= 0) {
		close(tmpl_ns);
		tmpl_ns = -1;
	}
	s->init.pid = pid;
	s->init.pidfd = pidfd;
	pidfd = -1;

	r = sub_cgroup_add(&s->cg, pid, why, whysz);
	if (r < 0)
		goto fail;
	r = read_sync(sync[0], disk_dev[0] ? &s->ldir_fd : NULL, why, whysz);
	if (r != 1) {
		if (r == 0) {
			spaced_why(why, whysz, "execution setup ended early");
			r = SPACED_ESYS;
		}
		goto fail;
	}
	if (loopfd >= 0) {
		/* the child's mount holds the loop device now */
		close(loopfd);
		loopfd = -1;
		if (s->ldir_fd < 0) {
			spaced_why(why, whysz, "the execution did not hand over its disk");
			r = SPACED_EPROTO;
			goto fail;
		}
		pathf(s->ldir, "/proc/self/fd/%d", s->ldir_fd);
	}
	if (write_map(pid, "uid_map", cfg->uid_base) < 0 || write_map(pid, "gid_map", cfg->uid_base) < 0) {
		spaced_why(why, whysz, "writing the user namespace maps: %s", strerror(errno));
		r = SPACED_ESYS;
		goto fail;
	}
	if (send(sync[0], "M", 1, MSG_NOSIGNAL) != 1) {
		r = SPACED_ESYS;
		goto fail;
	}
	r = read_sync(sync[0], NULL, why, whysz);
	if (r != 0) {
		if (r == 1)
			r = SPACED_EPROTO;
		goto fail;
	}
	/* exec'ed: the start time from now on is the guest's for good */
	r = spaced_proc_start_time(pid, &s->init.start_time);
	if (r < 0)
		goto fail;
	close(sync[0]);
	s->ctl = ctl[0];
	*out = s;
	return 0;
fail:
	if (ctl[0] >= 0)
		close(ctl[0]);
	if (ctl[1] >= 0)
		close(ctl[1]);
	if (sync[0] >= 0)
		close(sync[0]);
	if (sync[1] >= 0)
		close(sync[1]);
	if (pidfd >= 0)
		close(pidfd);
	if (loopfd >= 0) {
		sub_disk_unbound(s->disk_rdev); /* while the device is still ours */
		s->disk_rdev = 0;
		close(loopfd);
	}
	if (tmpl_ns >= 0)
		close(tmpl_ns);
	spaced_sub_destroy(s, false, NULL);
	return r;
}

int spaced_sub_control_fd(const struct spaced_sub *s)
{
	return s->ctl;
}

const struct spaced_pidref *spaced_sub_init(const struct spaced_sub *s)
{
	return &s->init;
}

bool spaced_sub_ready(const struct spaced_sub *s)
{
	return s->ready;
}

bool spaced_sub_paused(const struct spaced_sub *s)
{
	return s->paused;
}

const struct spaced_identity *spaced_sub_identity(const struct spaced_sub *s)
{
	return s->has_identity ? &s->identity : NULL;
}

int spaced_sub_handle_control(struct spaced_sub *s)
{
	char buf[SPACED_SUB_MSG_MAX + 1];
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * 4)];
	} cbuf;
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) - 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.b,
	                     .msg_controllen = sizeof(cbuf.b) };
	struct cmsghdr *c;
	ssize_t n;

	do
		n = recvmsg(s->ctl, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EAGAIN ? 0 : SPACED_ECLOSED;
	/* the guest has no business sending descriptors */
	for (c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

			for (size_t i = 0; i < k; i++) {
				int fd;

				memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
				close(fd);
			}
		}
	}
	if (n == 0)
		return SPACED_ECLOSED;
	if ((mh.msg_flags & MSG_TRUNC) != 0)
		return SPACED_EPROTO;
	buf[n] = '\0';
	if ((size_t)n == 5 && memcmp(buf, "READY", 5) == 0) {
		s->ready = true;
		return 1;
	}
	/* a pooled guest says it once it is up; when its identity was sent while
	 * it booted, that no longer matters */
	if ((size_t)n == 7 && memcmp(buf, "WAITING", 7) == 0)
		return s->has_identity ? 0 : 2;
	return SPACED_EPROTO;
}

int spaced_sub_wait_ready(struct spaced_sub *s, int timeout_ms)
{
	uint64_t deadline = spaced_mono_ns() + (uint64_t)timeout_ms * 1000000u;

	while (!s->ready) {
		struct pollfd pfd = { .fd = s->ctl, .events = POLLIN };
		uint64_t now = spaced_mono_ns();
		int r;

		if (now >= deadline)
			return SPACED_ETIMEDOUT;
		r = poll(&pfd, 1, (int)((deadline - now) / 1000000u) + 1);
		if (r < 0 && errno != EINTR)
			return SPACED_ESYS;
		if (r <= 0)
			continue;
		r = spaced_sub_handle_control(s);
		if (r < 0)
			return r;
	}
	return 0;
}

/* A pooled execution takes its sandbox's name when claimed: the UTS name
 * (its namespace belongs to the host's user namespace, so only we can set
 * it) and /etc/hostname and /etc/hosts where the creation wrote "spaced".
 * Nothing inside has run yet but the guest; the files are still opened
 * beneath the upper directory without following any symlink. */
static void name_execution(struct spaced_sub *s, const char *name)
{
	char p[PATH_MAX], text[320];
	/* the UTS name: a UTS namespace is a thread's, so this thread enters the
	 * execution's, sets the name and comes back (no process forked for it) */
	int own = open("/proc/thread-self/ns/uts", O_RDONLY | O_CLOEXEC);

	if (own >= 0 && setns(s->init.pidfd, CLONE_NEWUTS) == 0) {
		(void)sethostname(name, strlen(name));
		if (setns(own, CLONE_NEWUTS) < 0)
			fprintf(stderr, "spaced-launch: cannot return to its own UTS namespace: %s\n", strerror(errno));
	}
	if (own >= 0)
		close(own);
	if (pathf(p, "%s/upper", s->ldir) < 0)
		return;
	int up = open(p, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (up < 0)
		return;
	static const char *const files[] = { "hostname", "hosts" };
	for (int i = 0; i < 2; i++) {
		char rel[64], old[512];
		snprintf(rel, sizeof(rel), "%s/%s", s->etc_upper, files[i]);
		int fd = spaced_open_beneath(up, rel, O_RDWR);
		if (fd < 0)
			continue;
		ssize_t n = read(fd, old, sizeof(old) - 1);
		int tl = i == 0 ? snprintf(text, sizeof(text), "%s\n", name)
		                : snprintf(text, sizeof(text), "127.0.0.1\tlocalhost %s\n::1\tlocalhost ip6-localhost\n", name);
		/* only what the creation wrote for "spaced" */
		bool ours = n > 0 && ((i == 0 && n == 7 && memcmp(old, "spaced\n", 7) == 0) ||
		                      (i == 1 && memmem(old, (size_t)n, "localhost spaced\n", 17) != NULL));
		/* written over, then cut to size: truncating it to nothing first
		 * made its close write it out to the disk at once (ext4's
		 * auto_da_alloc), in the claim's time */
		if (ours && tl > 0 && pwrite(fd, text, (size_t)tl, 0) == tl)
			(void)!ftruncate(fd, tl);
		close(fd);
	}
	close(up);
}

int spaced_sub_set_identity(struct spaced_sub *s, const struct spaced_identity *id)
{
	char msg[SPACED_IDENTITY_TEXT_MAX + 16];
	int n;

	/* once; again only for another activation of the same execution (S4) */
	if (s->has_identity && !spaced_identity_activation_change(&s->identity, id))
		return SPACED_EEXIST;
	if (s->rename_on_claim && !s->has_identity)
		name_execution(s, id->sandbox);
	memcpy(msg, "IDENTITY ", 9);
	n = spaced_identity_encode(id, msg + 9, sizeof(msg) - 9);
	if (n < 0)
		return n;
	if (send(s->ctl, msg, (size_t)n + 9, MSG_NOSIGNAL) != n + 9)
		return SPACED_ECLOSED;
	s->identity = *id;
	s->has_identity = true;
	return 0;
}

int spaced_sub_send_config(struct spaced_sub *s, const char *json)
{
	static char msg[SPACED_SUB_MSG_MAX + 8];
	size_t n = strlen(json);

	if (n + 7 > SPACED_SUB_MSG_MAX)
		return SPACED_ETOOBIG;
	memcpy(msg, "CONFIG ", 7);
	memcpy(msg + 7, json, n);
	if (send(s->ctl, msg, n + 7, MSG_NOSIGNAL) != (ssize_t)(n + 7))
		return SPACED_ECLOSED;
	return 0;
}

int spaced_sub_send_conn(struct spaced_sub *s, uint32_t port, int fd)
{
	char msg[32];
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} cbuf;
	struct iovec iov = { .iov_base = msg };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.b,
	                     .msg_controllen = sizeof(cbuf.b) };
	struct cmsghdr *c;
	ssize_t w;

	iov.iov_len = (size_t)snprintf(msg, sizeof(msg), "CONN %u", (unsigned)port);
	memset(&cbuf, 0, sizeof(cbuf));
	c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	do
		w = sendmsg(s->ctl, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (w < 0 && errno == EINTR);
	if (w < 0 && errno == EAGAIN)
		return SPACED_EBUSY; /* the guest is not draining its control socket */
	if (w < 0)
		return errno == EPIPE || errno == ECONNRESET ? SPACED_ECLOSED : SPACED_ESYS;
	return 0;
}

int spaced_sub_pause(struct spaced_sub *s)
{
	int r;

	if (s->paused)
		return 0;
	r = sub_cgroup_freeze(&s->cg, true);
	if (r == 0)
		s->paused = true;
	return r;
}

int spaced_sub_thaw(struct spaced_sub *s)
{
	int r;

	if (!s->paused)
		return 0;
	r = sub_cgroup_freeze(&s->cg, false);
	if (r == 0)
		s->paused = false;
	return r;
}

/* A snapshot's refusal reaches the tenant: in the sandbox's own paths
 * (src: the execution's upper directory, dir: the snapshot's), its names
 * quoted as a logfmt value is so that none closes a reason="…" it lands in,
 * and valid UTF-8 whatever the cuts (a JSON string carries it). */
static void snapshot_why_own(const char *src, const char *dir, char *why, size_t whysz)
{
	char host[PATH_MAX + 16];
	snprintf(host, sizeof host, "%s/root", src);
	spaced_str_replace(why, whysz, host, "");
	snprintf(host, sizeof host, "%s/upper/root", dir);
	spaced_str_replace(why, whysz, host, "");
	spaced_str_replace(why, whysz, src, "(sandbox)");
	spaced_str_replace(why, whysz, dir, "(snapshot)");
	spaced_str_replace(why, whysz, "\\", "\\\\");
	spaced_str_replace(why, whysz, "\"", "\\\"");
	spaced_utf8_clean(why);
}

int spaced_sub_snapshot(struct spaced_sub *s, const char *dir, char *why, size_t whysz)
{
	char src[PATH_MAX], dst[PATH_MAX], tmp[PATH_MAX], meta[PATH_MAX + 640];
	char idtext[SPACED_IDENTITY_TEXT_MAX] = "";
	int fd, n, r;

	if (!s->paused) {
		spaced_why(why, whysz, "the execution must be paused for a snapshot");
		return SPACED_EBUSY;
	}
	if (mkdir(dir, 0700) < 0) {
		int err = errno;
		spaced_why(why, whysz, "the snapshot's directory: %s", strerror(err));
		return err == EEXIST ? SPACED_EEXIST : SPACED_ESYS;
	}
	if (pathf(src, "%s/upper", s->ldir) < 0 || pathf(dst, "%s/upper", dir) < 0 ||
	    pathf(tmp, "%s/meta.tmp", dir) < 0)
		return SPACED_ETOOBIG;
	{
		struct spaced_idshift sh = { s->uid_base, SPACED_SUB_SNAP_UID_BASE, SPACED_SUB_UID_RANGE };

		r = spaced_sub_copy_tree(src, dst, s->uid_base != 0 ? &sh : NULL, s->disk_bps, why, whysz);
	}
	if (r < 0) {
		snapshot_why_own(src, dir, why, whysz);
		return r;
	}
	if (s->has_identity)
		spaced_identity_encode(&s->identity, idtext, sizeof(idtext));
	n = snprintf(meta, sizeof(meta), "identity=%s\nbase=%s\n", idtext, s->base_label);
	/* meta last, renamed into place: its presence marks a complete snapshot */
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0 || write(fd, meta, (size_t)n) != n || fsync(fd) < 0) {
		if (fd >= 0)
			close(fd);
		spaced_why(why, whysz, "the snapshot's meta: %s", strerror(errno));
		return SPACED_ESYS;
	}
	close(fd);
	pathf(dst, "%s/meta", dir);
	if (rename(tmp, dst) < 0)
		return SPACED_ESYS;
	return 0;
}

static int ns_probe(void *arg)
{
	*(volatile pid_t *)arg = (pid_t)syscall(SYS_getpid); /* its PID in the namespace it was cloned into */
	return 0;
}

/* The PID the execution's PID namespace gives next (arg: the spaced_sub),
 * for the spread rule's count of the tasks it starts: a child cloned into
 * that namespace (CLONE_VFORK | CLONE_VM: this process's memory, for the
 * moment it lives; no signal at its end, reaped here) reads its own PID
 * there and ends. The calling thread's namespace for its children is set
 * back before the return. The child is host root in this process's cgroups
 * and user namespace: no task of the execution can trace, signal, freeze or
 * read it for the microseconds it is there. 0 when it cannot be read (the execution's init is
 * gone: its namespace takes no more tasks). */
static uint32_t ns_next_pid(void *arg)
{
	struct spaced_sub *s = arg;
	static int own = -2;
	char stack[16384] __attribute__((aligned(16)));
	pid_t got = 0; /* written by the child through the address clone passes on */

	if (own == -2)
		own = open("/proc/self/ns/pid", O_RDONLY | O_CLOEXEC);
	if (own < 0 || s->init.pidfd < 0 || setns(s->init.pidfd, CLONE_NEWPID) < 0)
		return 0;
	/* the parent waits (CLONE_VFORK) while the child runs on stack */
	pid_t c = clone(ns_probe, stack + sizeof(stack), CLONE_VM | CLONE_VFORK, &got);
	if (c > 0)
		while (waitpid(c, NULL, __WCLONE) < 0 && errno == EINTR)
			;
	if (setns(own, CLONE_NEWPID) < 0) {
		/* never seen (this process holds its own namespace's rights): were
		 * it so, its later children would start in the execution's */
		close(own);
		own = -1;
		return 0;
	}
	return c > 0 && got > 0 ? (uint32_t)got : 0;
}

int spaced_sub_cpu_spread(struct spaced_sub *s, char *cpus, size_t cpussz, unsigned *next_ms)
{
	return sub_cgroup_cpu_spread(&s->cg, spaced_mono_ns(), ns_next_pid, s, cpus, cpussz, next_ms);
}

void spaced_sub_cpus_held(const struct spaced_sub *s, char *cpus, size_t cpussz)
{
	snprintf(cpus, cpussz, "%s", s->cg.held_cpus);
}

void spaced_sub_usage(const struct spaced_sub *s, struct spaced_sub_usage *u)
{
	struct statfs sf;

	struct sub_usage cu;

	sub_cgroup_usage(&s->cg, &cu);
	u->cpu_usec = cu.cpu_usec;
	u->memory_bytes = cu.mem_bytes;
	u->memory_peak = cu.mem_peak;
	u->oom_kills = cu.oom_kills;
	u->pids = cu.pids;
	u->disk_bytes = 0;
	u->disk_total = 0;
	if (s->ldir_fd >= 0 && fstatfs(s->ldir_fd, &sf) == 0) {
		u->disk_total = (uint64_t)sf.f_blocks * (uint64_t)sf.f_bsize;
		u->disk_bytes = (uint64_t)(sf.f_blocks - sf.f_bfree) * (uint64_t)sf.f_bsize;
	}
}

int spaced_sub_cap_all(uint64_t mem_bytes, uint64_t tasks, char *why, size_t whysz)
{
	return sub_cgroup_cap_all(mem_bytes, tasks, why, whysz);
}

int spaced_sub_reap_orphans(void)
{
	int n = sub_cgroup_reap_orphans();

	(void)sub_disk_reap();
	return n;
}

void spaced_sub_destroy(struct spaced_sub *s, bool keep_state, int *status)
{
	static const char *const parts[] = { "upper", "work", "skel", "rootfs", "lower", "fs", "disk.img" };
	char p[PATH_MAX];

	if (s == NULL)
		return;
	if (s->init.pidfd >= 0 && !s->reaped) {
		siginfo_t si;

		(void)syscall(SYS_pidfd_send_signal, s->init.pidfd, SIGKILL, NULL, 0);
		/* frozen tasks die only once thawed */
		if (s->paused)
			(void)sub_cgroup_freeze(&s->cg, false);
		memset(&si, 0, sizeof(si));
		while (waitid((idtype_t)P_PIDFD, (id_t)s->init.pidfd, &si, WEXITED) < 0 && errno == EINTR)
			;
		s->exit_status = si.si_code == CLD_EXITED ? (si.si_status & 0xff) << 8 : si.si_status & 0x7f;
		s->reaped = true;
	}
	if (status != NULL)
		*status = s->exit_status;
	sub_cgroup_remove(&s->cg);
	/* the last reference to the disk's mount from outside: once the
	 * execution's processes are gone, the mount and its loop device go too */
	if (s->ldir_fd >= 0) {
		/* the disk's bounds go while it is still this execution's
		 * (without ldir_fd it may be gone already: sub_disk_reap's) */
		sub_disk_unbound(s->disk_rdev);
		s->disk_rdev = 0;
		close(s->ldir_fd);
		s->ldir_fd = -1;
	}
	if (!keep_state && s->state[0] != '\0') {
		for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
			if (pathf(p, "%s/%s", s->state, parts[i]) == 0)
				(void)spaced_sub_rm_rf(p);
	}
	if (s->ctl >= 0)
		close(s->ctl);
	spaced_pidref_done(&s->init);
	free(s);
}

/* ---- entering a running execution ---------------------------------------- */

static __attribute__((noreturn)) void enter_child(int init_pidfd, pid_t init_pid, const char *cwd,
                                                  char *const argv[])
{
	pid_t pid;
	int st;

	if (sub_cgroup_join_of(init_pid) < 0)
		_exit(125);
	/* the namespaces owned by the host's user namespace first, as host root;
	 * then the execution's user and cgroup namespaces */
	if (setns(init_pidfd, CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWIPC) < 0)
		_exit(125);
	if (setns(init_pidfd, CLONE_NEWUSER | CLONE_NEWCGROUP) < 0)
		_exit(125);
	if (setgroups(0, NULL) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0)
		_exit(125);
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
		_exit(125);
	/* a fork to become a member of the pid namespace */
	pid = fork();
	if (pid < 0)
		_exit(125);
	if (pid == 0) {
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
			_exit(125);
		if (chdir(cwd ? cwd : "/") < 0)
			_exit(126);
		if (sub_confine() < 0)
			_exit(125);
		execvp(argv[0], argv);
		_exit(127);
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			_exit(125);
	if (WIFSIGNALED(st)) {
		/* die of the same signal, so the caller's waitpid sees what happened */
		struct rlimit nocore = { 0, 0 };
		sigset_t all;

		(void)setrlimit(RLIMIT_CORE, &nocore);
		(void)signal(WTERMSIG(st), SIG_DFL);
		sigfillset(&all);
		(void)sigprocmask(SIG_UNBLOCK, &all, NULL);
		(void)raise(WTERMSIG(st));
		_exit(128 + WTERMSIG(st));
	}
	_exit(WEXITSTATUS(st));
}

int spaced_sub_enter(int init_pidfd, const char *cwd, char *const argv[], int *status)
{
	struct spaced_pidref init = SPACED_PIDREF_NULL;
	int dupfd, st, r;
	pid_t pid;

	if (argv == NULL || argv[0] == NULL)
		return SPACED_EINVAL;
	r = sub_confine_prepare();
	if (r < 0)
		return r;
	dupfd = fcntl(init_pidfd, F_DUPFD_CLOEXEC, 3);
	if (dupfd < 0)
		return SPACED_ESYS;
	r = spaced_pidref_from_pidfd_take(&init, dupfd);
	if (r < 0) {
		close(dupfd);
		return r;
	}
	pid = fork();
	if (pid < 0) {
		r = SPACED_ESYS;
		goto out;
	}
	if (pid == 0)
		enter_child(init.pidfd, init.pid, cwd, argv);
	while (waitpid(pid, &st, 0) < 0) {
		if (errno != EINTR) {
			r = SPACED_ESYS;
			goto out;
		}
	}
	/* 125: the execution could not be entered */
	if (WIFEXITED(st) && WEXITSTATUS(st) == 125) {
		r = spaced_pidref_check(&init) < 0 ? SPACED_ESTALE : SPACED_ESYS;
		goto out;
	}
	*status = st;
	r = 0;
out:
	spaced_pidref_done(&init);
	return r;
}
