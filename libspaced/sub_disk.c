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
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/loop.h>
#include <linux/magic.h>
#include <linux/major.h>

#include "spaced_error.h"
#include "helper_spawn.h"
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
	/* -T default: 4 KiB blocks whatever the size; no reserved blocks,
	 * no journal, no room reserved for growing */
	const char *const argv[] = {mkfs, "-q", "-F", "-T", "default", "-m", "0", "-i", ratio, "-O",
	                            "^has_journal,^resize_inode", "-E", "lazy_itable_init=1,nodiscard", "-L", "spaced",
	                            img, NULL};
	pid = spaced_spawn_quiet(argv);
	if (pid < 0) {
		spaced_why(why, whysz, "spawn of mkfs.ext4: %s", strerror(errno));
		return SPACED_ESYS;
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

/* The v1 blkio root, where the kernel's flusher threads run: v1 charges the
 * writeback of every filesystem there, whoever dirtied the pages. */
#define BLKIO_ROOT "/sys/fs/cgroup/blkio"

/* A knob of the device's writeback (/sys/class/bdi/MAJ:MIN/<file>); 0 or -1
 * with errno (ENOENT: the kernel has no such knob). */
static int bdi_knob(dev_t dev, const char *file, const char *val)
{
	char path[96];

	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/%s", major(dev), minor(dev), file);
	return sub_write_file(path, val);
}

/* Writes "MAJ:MIN value" into the blkio root's blkio.throttle.<file>. */
static int root_rule(dev_t dev, const char *file, uint64_t value)
{
	char path[96], val[64];

	snprintf(path, sizeof(path), BLKIO_ROOT "/blkio.throttle.%s", file);
	snprintf(val, sizeof(val), "%u:%u %" PRIu64, major(dev), minor(dev), value);
	return sub_write_file(path, val);
}

/* What a disk may hold dirty: a second of its writeback, within these. */
#define DIRTY_MIN (UINT64_C(8) << 20)
#define DIRTY_MAX (UINT64_C(1) << 30)

static int bound_io(dev_t dev, uint64_t bps, uint64_t iops, char *why, size_t whysz)
{
	struct statfs sf;
	char val[32];

	/* v1 only: cgroup2 charges writeback to the cgroup that dirtied the
	 * pages, whose io.max bounds it (sub_cgroup.c) */
	if (statfs(BLKIO_ROOT, &sf) == 0 && (unsigned long)sf.f_type == CGROUP_SUPER_MAGIC) {
		if ((bps > 0 && root_rule(dev, "write_bps_device", bps) < 0) ||
		    (iops > 0 && root_rule(dev, "write_iops_device", iops) < 0)) {
			spaced_why(why, whysz, "bounding the writeback of %u:%u in " BLKIO_ROOT ": %s", major(dev),
			           minor(dev), strerror(errno));
			return SPACED_ESYS;
		}
	}
	if (bps > 0) {
		snprintf(val, sizeof(val), "%" PRIu64, bps < DIRTY_MIN ? DIRTY_MIN : bps > DIRTY_MAX ? DIRTY_MAX : bps);
		/* before 6.2 there is no such knob: the writeback is bounded all
		 * the same, only writers are not slowed before reclaim */
		if (bdi_knob(dev, "max_bytes", val) == 0)
			(void)bdi_knob(dev, "strict_limit", "1");
	}
	return 0;
}

/* Attaches imgfd to a free loop device and bounds its I/O; another process
 * may take the free device first, so a busy one is retried with the next
 * free one. */
static int attach_loop(int imgfd, uint64_t bps, uint64_t iops, int *loopfd, char *dev, size_t devsz, dev_t *rdev,
                       char *why, size_t whysz)
{
	int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);

	if (ctl < 0) {
		spaced_why(why, whysz, "open /dev/loop-control: %s", strerror(errno));
		return SPACED_ESYS;
	}
	/* held (shared) from the attach until the device's bounds are set:
	 * sub_disk_reap, which takes the bounds off devices holding no image,
	 * never sees one in between */
	if (flock(ctl, LOCK_SH) < 0) {
		spaced_why(why, whysz, "lock /dev/loop-control: %s", strerror(errno));
		close(ctl);
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
			struct stat st = { 0 };
			int r = fstat(fd, &st) < 0 ? SPACED_ESYS : 0;

			if (r == 0 && (bps > 0 || iops > 0))
				r = bound_io(st.st_rdev, bps, iops, why, whysz);
			close(ctl); /* the bounds are set: sub_disk_reap may look */
			if (r == 0 && (size_t)snprintf(dev, devsz, "%s", path) >= devsz)
				r = SPACED_ETOOBIG;
			if (r < 0) {
				sub_disk_unbound(st.st_rdev);
				close(fd);
				return r;
			}
			*rdev = st.st_rdev;
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

int sub_disk_create(const char *img, uint64_t bytes, uint64_t bps, uint64_t iops, int *loopfd, char *dev,
                    size_t devsz, dev_t *rdev, char *why, size_t whysz)
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
	if ((r = attach_loop(fd, bps, iops, loopfd, dev, devsz, rdev, why, whysz)) < 0)
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

dev_t sub_disk_block_dev(const char *path)
{
	char sys[96], text[32];
	unsigned maj, min;
	struct stat st;
	dev_t dev;
	FILE *f;

	if (stat(path, &st) < 0)
		return 0;
	dev = st.st_dev;
	if (major(dev) == 0)
		return 0; /* an anonymous device: overlayfs, tmpfs, btrfs subvolumes */
	snprintf(sys, sizeof(sys), "/sys/dev/block/%u:%u", major(dev), minor(dev));
	if (access(sys, F_OK) < 0)
		return 0; /* not a block device */
	snprintf(sys, sizeof(sys), "/sys/dev/block/%u:%u/partition", major(dev), minor(dev));
	if (access(sys, F_OK) < 0)
		return dev;
	/* a partition: the rule names its disk, the directory above */
	snprintf(sys, sizeof(sys), "/sys/dev/block/%u:%u/../dev", major(dev), minor(dev));
	if ((f = fopen(sys, "re")) == NULL)
		return 0;
	if (fgets(text, sizeof(text), f) == NULL || sscanf(text, "%u:%u", &maj, &min) != 2)
		maj = min = 0;
	fclose(f);
	return maj == 0 ? 0 : makedev(maj, min);
}

void sub_disk_unbound(dev_t rdev)
{
	if (rdev == 0)
		return;
	(void)root_rule(rdev, "write_bps_device", 0);
	(void)root_rule(rdev, "write_iops_device", 0);
	(void)bdi_knob(rdev, "strict_limit", "0");
	(void)bdi_knob(rdev, "max_ratio", "100");
}

int sub_disk_reap(void)
{
	static const char *const files[] = { BLKIO_ROOT "/blkio.throttle.write_bps_device",
		                             BLKIO_ROOT "/blkio.throttle.write_iops_device" };
	int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC), n = 0;

	if (ctl < 0)
		return 0;
	/* no attach in progress (they hold it shared): a device seen without
	 * an image here gets no bound from a new execution meanwhile */
	if (flock(ctl, LOCK_EX) < 0) {
		close(ctl);
		return 0;
	}
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		char line[128], sys[96];
		unsigned maj, min;
		FILE *f = fopen(files[i], "re");

		if (f == NULL)
			continue;
		while (fgets(line, sizeof(line), f) != NULL) {
			if (sscanf(line, "%u:%u", &maj, &min) != 2)
				continue;
			/* (loop/ is there only while the device holds an image) */
			snprintf(sys, sizeof(sys), "/sys/dev/block/%u:%u/loop/backing_file", maj, min);
			if (maj != LOOP_MAJOR || access(sys, F_OK) == 0)
				continue; /* not a loop device, or one holding an image */
			sub_disk_unbound(makedev(maj, min));
			n++;
		}
		fclose(f);
	}
	close(ctl);
	return n;
}
