/*
 * sub_disk.c — the writable layer of an execution on a filesystem of its own:
 * a sparse ext4 image in the state directory, attached to a loop device and
 * mounted only inside the execution's mount namespace.
 *
 * Why: the writable layer (overlay upper and work directories, so everything
 * the execution writes, /tmp included) then has a hard size — writes past it
 * get ENOSPC — that is not memory (a tmpfs would be charged to the memory
 * cgroup and live in RAM), `df` inside shows the execution's own disk, and the
 * host's filesystem only ever holds the blocks actually written (the image is
 * sparse; `discard` punches the blocks of deleted files back out of it).
 *
 * The image carries no journal (an execution's disk does not outlive a crash
 * of its host: a new generation starts from its snapshot) and its inode tables
 * are never zeroed in the background (`noinit_itable`: the group checksums say
 * which inodes are unused), so a large empty disk costs a few hundred KiB of
 * host disk and about 10 ms to make.
 */
#include "sub_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/loop.h>

#include "error.h"
#include "util.h"

/* One inode per 8 KiB of disk (node_modules-style trees hold many small
 * files); the inode tables then take about 3.1 % of the image. The image is
 * made that much larger, so the files it holds come to about the disk size
 * asked for. */
#define DISK_BYTES_PER_INODE 8192
#define DISK_MIN_BYTES (8u << 20)

static const char *const mkfs_paths[] = { "/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4" };

static int run_mkfs(const char *img, char *why, size_t whysz)
{
	const char *mkfs = NULL;
	char ratio[16];
	int st;
	pid_t pid;

	for (size_t i = 0; i < sizeof(mkfs_paths) / sizeof(mkfs_paths[0]); i++)
		if (access(mkfs_paths[i], X_OK) == 0)
			mkfs = mkfs_paths[i];
	if (mkfs == NULL) {
		spaced_why(why, whysz, "mkfs.ext4 not found (Debian package e2fsprogs)");
		return SPACED_ENOENT;
	}
	snprintf(ratio, sizeof(ratio), "%d", DISK_BYTES_PER_INODE);
	pid = fork();
	if (pid < 0) {
		spaced_why(why, whysz, "fork for mkfs.ext4: %s", strerror(errno));
		return SPACED_ESYS;
	}
	if (pid == 0) {
		int nul = open("/dev/null", O_RDWR | O_CLOEXEC);

		if (nul >= 0) {
			(void)dup2(nul, 0);
			(void)dup2(nul, 1);
		}
		/* -T default: 4 KiB blocks whatever the size; no reserved blocks,
		 * no journal, no room reserved for growing */
		execl(mkfs, "mkfs.ext4", "-q", "-F", "-T", "default", "-m", "0", "-i", ratio, "-O",
		      "^has_journal,^resize_inode", "-E", "lazy_itable_init=1,nodiscard", "-L", "spaced", img,
		      (char *)NULL);
		_exit(127);
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return SPACED_ESYS;
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		spaced_why(why, whysz, "mkfs.ext4 %s failed (status 0x%x)", img, (unsigned)st);
		return SPACED_ESYS;
	}
	return 0;
}

/* Attaches imgfd to a free loop device; another process may take the free
 * device first, so a busy one is retried with the next free one. */
static int attach_loop(int imgfd, int *loopfd, char *dev, size_t devsz, char *why, size_t whysz)
{
	int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);

	if (ctl < 0) {
		spaced_why(why, whysz, "open /dev/loop-control: %s", strerror(errno));
		return SPACED_ESYS;
	}
	for (int attempt = 0; attempt < 64; attempt++) {
		struct loop_config lc;
		char path[32];
		int n = ioctl(ctl, LOOP_CTL_GET_FREE);
		int fd;

		if (n < 0) {
			spaced_why(why, whysz, "LOOP_CTL_GET_FREE: %s", strerror(errno));
			break;
		}
		snprintf(path, sizeof(path), "/dev/loop%d", n);
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd < 0) {
			if (errno == ENOENT)
				continue; /* the node appears asynchronously */
			spaced_why(why, whysz, "open %s: %s", path, strerror(errno));
			break;
		}
		memset(&lc, 0, sizeof(lc));
		lc.fd = (uint32_t)imgfd;
		lc.block_size = 4096;
		lc.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
		if (ioctl(fd, LOOP_CONFIGURE, &lc) == 0) {
			close(ctl);
			if ((size_t)snprintf(dev, devsz, "%s", path) >= devsz) {
				close(fd);
				return SPACED_ETOOBIG;
			}
			*loopfd = fd;
			return 0;
		}
		int e = errno;

		close(fd);
		if (e != EBUSY) {
			spaced_why(why, whysz, "LOOP_CONFIGURE %s: %s", path, strerror(e));
			break;
		}
	}
	close(ctl);
	if (why != NULL && why[0] == '\0')
		spaced_why(why, whysz, "no free loop device");
	return SPACED_ESYS;
}

int sub_disk_create(const char *img, uint64_t bytes, int *loopfd, char *dev, size_t devsz,
                    char *why, size_t whysz)
{
	uint64_t size;
	int fd, r;

	if (bytes < DISK_MIN_BYTES || bytes > (UINT64_C(1) << 44)) {
		spaced_why(why, whysz, "a disk of %" PRIu64 " bytes is outside 8 MiB .. 16 TiB", bytes);
		return SPACED_EINVAL;
	}
	/* on top: the inode tables (1/32 of the image), the clusters ext4 keeps
	 * back for its own allocations (2 %, at most 16 MiB) and the group metadata */
	uint64_t resv = bytes / 50 < (UINT64_C(16) << 20) ? bytes / 50 : (UINT64_C(16) << 20);

	size = bytes + bytes / 30 + resv + (UINT64_C(2) << 20);
	size = (size + 4095) & ~UINT64_C(4095);
	fd = open(img, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		spaced_why(why, whysz, "create %s: %s", img, strerror(errno));
		return errno == EEXIST ? SPACED_EEXIST : SPACED_ESYS;
	}
	if (ftruncate(fd, (off_t)size) < 0) {
		spaced_why(why, whysz, "size %s: %s", img, strerror(errno));
		r = SPACED_ESYS;
		goto fail;
	}
	if ((r = run_mkfs(img, why, whysz)) < 0)
		goto fail;
	if ((r = attach_loop(fd, loopfd, dev, devsz, why, whysz)) < 0)
		goto fail;
	close(fd); /* the loop device holds the image now */
	return 0;
fail:
	close(fd);
	(void)unlink(img);
	return r;
}

int sub_disk_mount(const char *dev, const char *dir)
{
	return mount(dev, dir, "ext4", MS_NOSUID | MS_NODEV | MS_NOATIME, "discard,noinit_itable") < 0
	               ? SPACED_ESYS
	               : 0;
}
