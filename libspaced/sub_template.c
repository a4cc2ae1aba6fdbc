/*
 * sub_template.c — an execution's root from a template (docs/substrate.md,
 * "Templates").
 *
 * A template's files are stored with owners in the canonical range
 * 100000 … 165535 (inside id k is 100000 + k, as in snapshots), whatever
 * uid range the execution runs in. The lower layer of the execution's root
 * is an idmapped bind mount of the template directory — made in the
 * execution's own mount namespace, read-only, nosuid, nodev — whose
 * mapping sends 100000 + k to uid_base + k: root inside owns what the
 * template's root owns, the template itself never changes, and one copy on
 * disk serves executions of every uid range at once.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spaced_error.h"
#include "sub_internal.h"
#include "substrate.h"
#include "util.h"

int sub_tmpl_userns(uint32_t uid_base, int *out, char *why, size_t whysz)
{
	int p[2], r = SPACED_ESYS, fd = -1;
	char path[64], map[64];
	if (pipe2(p, O_CLOEXEC) < 0) {
		spaced_why(why, whysz, "pipe: %s", strerror(errno));
		return SPACED_ESYS;
	}
	pid_t c = fork();
	if (c < 0) {
		close(p[0]);
		close(p[1]);
		spaced_why(why, whysz, "fork: %s", strerror(errno));
		return SPACED_ESYS;
	}
	if (c == 0) {
		/* a user namespace to carry the mapping, then wait to be killed */
		close(p[0]);
		char ok = unshare(CLONE_NEWUSER) == 0 ? 'u' : 'e';
		(void)!write(p[1], &ok, 1);
		for (;;)
			pause();
	}
	close(p[1]);
	char got = 0;
	if (read(p[0], &got, 1) != 1 || got != 'u') {
		spaced_why(why, whysz, "the template's user namespace could not be made");
		goto out;
	}
	/* inside the namespace id 100000 + k is host uid_base + k */
	snprintf(map, sizeof map, "%u %u %u\n", SPACED_SUB_SNAP_UID_BASE, (unsigned)uid_base, SPACED_SUB_UID_RANGE);
	static const char *const files[] = {"uid_map", "gid_map"};
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof path, "/proc/%d/%s", (int)c, files[i]);
		if (sub_write_file(path, map) < 0) {
			spaced_why(why, whysz, "%s of the template's mapping: %s", files[i], strerror(errno));
			goto out;
		}
	}
	snprintf(path, sizeof path, "/proc/%d/ns/user", (int)c);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		spaced_why(why, whysz, "open %s: %s", path, strerror(errno));
		goto out;
	}
	*out = fd;
	fd = -1;
	r = 0;
out:
	close(p[0]);
	kill(c, SIGKILL);
	while (waitpid(c, NULL, 0) < 0 && errno == EINTR)
		;
	return r;
}

int sub_tmpl_mount(const char *tmpl, int userns_fd, const char *target)
{
	int t = (int)syscall(SYS_open_tree, AT_FDCWD, tmpl, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
	if (t < 0)
		return -1;
	struct mount_attr attr = {
		.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
		.userns_fd = (uint64_t)userns_fd,
	};
	if (syscall(SYS_mount_setattr, t, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0 ||
	    syscall(SYS_move_mount, t, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) < 0) {
		int e = errno;
		close(t);
		errno = e;
		return -1;
	}
	close(t);
	return 0;
}
