/*
 * sub_fs.c — tree copy for snapshots and restores of the writable layer, and
 * recursive removal of state directories.
 *
 * The copy keeps what an overlay upper directory holds: directories, regular
 * files (their data extents through copy_file_range, holes kept as holes),
 * symlinks, whiteouts (0/0 character
 * devices) and other device nodes, FIFOs, owners, modes, times and extended
 * attributes (trusted.overlay.* marks opaque directories and redirects).
 * Files with several links inside the tree stay linked in the copy; sockets
 * are skipped. Owners can be translated on the way (an execution's uid range
 * to the canonical range of snapshots, and back).
 */
#define _FILE_OFFSET_BITS 64
#include "substrate.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "pace.h"
#include "spaced_error.h"
#include "treehash.h"
#include "util.h"


static int copy_xattrs(const char *src, const char *dst)
{
	char names[8192], *name;
	char val[65536];
	ssize_t n = llistxattr(src, names, sizeof(names));

	if (n < 0)
		return errno == ENOTSUP ? 0 : SPACED_ESYS;
	for (name = names; name < names + n; name += strlen(name) + 1) {
		ssize_t vl = lgetxattr(src, name, val, sizeof(val));

		if (vl < 0)
			return SPACED_ESYS;
		if (lsetxattr(dst, name, val, (size_t)vl, 0) < 0 && errno != ENOTSUP)
			return SPACED_ESYS;
	}
	return 0;
}

/* Copies a regular file keeping its holes: only the data extents the source
 * reports (SEEK_DATA / SEEK_HOLE) are copied, and the size is set last, so a
 * sparse file costs what it holds, not what it claims. */
static int copy_data(const char *src, const char *dst, const struct stat *st, struct spaced_pace *pace)
{
	int in = -1, out = -1, r = SPACED_ESYS;
	off_t pos = 0, size = st->st_size;

	in = open(src, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (in < 0)
		goto out;
	out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (out < 0)
		goto out;
	while (pos < size) {
		off_t data = lseek(in, pos, SEEK_DATA), hole;

		if (data < 0 && errno == ENXIO)
			break; /* only a hole up to the end */
		if (data < 0) {
			/* no SEEK_DATA here: the rest as data */
			if (spaced_copy_range(in, out, pos, size - pos, pace) < 0)
				goto out;
			break;
		}
		hole = lseek(in, data, SEEK_HOLE);
		if (hole < 0 || hole > size)
			hole = size;
		if (data >= size)
			break;
		if (spaced_copy_range(in, out, data, hole - data, pace) < 0)
			goto out;
		pos = hole;
	}
	if (ftruncate(out, size) < 0)
		goto out;
	r = 0;
out: {
	int saved = errno; /* the caller's message names the failure */
	if (in >= 0)
		close(in);
	spaced_pace_closing(pace, out);
	if (out >= 0)
		close(out);
	errno = saved;
}
	return r;
}

static uint32_t shift_id(const struct spaced_idshift *sh, uint32_t id)
{
	if (sh != NULL && id >= sh->from && id - sh->from < sh->count)
		return id - sh->from + sh->to;
	return id;
}

/* Owner, mode, xattrs, times of one copied entry. */
static int finish(const char *src, const char *dst, const struct stat *st, const struct spaced_idshift *sh)
{
	struct timespec ts[2] = { st->st_atim, st->st_mtim };

	if (fchownat(AT_FDCWD, dst, shift_id(sh, st->st_uid), shift_id(sh, st->st_gid), AT_SYMLINK_NOFOLLOW) < 0 &&
	    errno != EPERM)
		return SPACED_ESYS;
	if (!S_ISLNK(st->st_mode) && chmod(dst, st->st_mode & 07777) < 0)
		return SPACED_ESYS;
	if (copy_xattrs(src, dst) < 0)
		return SPACED_ESYS;
	if (utimensat(AT_FDCWD, dst, ts, AT_SYMLINK_NOFOLLOW) < 0)
		return SPACED_ESYS;
	return 0;
}

/* A tree's copy: the regular files with more than one link seen so far,
 * (dev, ino) -> first copy; the pacer of its writes. */
struct copying {
	struct link_ent {
		dev_t dev;
		ino_t ino;
		char *dst;
	} *v;
	size_t n, cap;
	struct spaced_pace pace;
};

static const char *links_find(const struct copying *lk, const struct stat *st)
{
	for (size_t i = 0; i < lk->n; i++)
		if (lk->v[i].dev == st->st_dev && lk->v[i].ino == st->st_ino)
			return lk->v[i].dst;
	return NULL;
}

static int links_add(struct copying *lk, const struct stat *st, const char *dst)
{
	if (lk->n == lk->cap) {
		size_t cap = lk->cap ? lk->cap * 2 : 16;
		struct link_ent *v = realloc(lk->v, cap * sizeof(*v));

		if (v == NULL)
			return SPACED_ENOMEM;
		lk->v = v;
		lk->cap = cap;
	}
	lk->v[lk->n].dst = strdup(dst);
	if (lk->v[lk->n].dst == NULL)
		return SPACED_ENOMEM;
	lk->v[lk->n].dev = st->st_dev;
	lk->v[lk->n].ino = st->st_ino;
	lk->n++;
	return 0;
}

static void links_free(struct copying *lk)
{
	for (size_t i = 0; i < lk->n; i++)
		free(lk->v[i].dst);
	free(lk->v);
}

/* depth: of src below the tree's top; past SPACED_TREEHASH_DEPTH (what a
 * snapshot or a template may hold) the copy is refused, so a tenant's deep
 * directories cannot take the copying process's stack */
static int copy_rec(char *src, size_t sl, char *dst, size_t dl, struct copying *lk,
                    const struct spaced_idshift *sh, unsigned depth, char *why, size_t whysz)
{
	struct stat st;
	int r = 0;

	if (lstat(src, &st) < 0) {
		spaced_why(why, whysz, "lstat %s: %s", src, strerror(errno));
		return SPACED_ESYS;
	}
	if (S_ISDIR(st.st_mode)) {
		struct dirent *de;
		DIR *d;

		if (depth >= SPACED_TREEHASH_DEPTH) {
			spaced_why(why, whysz, "directories deeper than %d levels at %s", SPACED_TREEHASH_DEPTH, src);
			return SPACED_ETOOBIG;
		}
		if (mkdir(dst, 0700) < 0) {
			spaced_why(why, whysz, "mkdir %s: %s", dst, strerror(errno));
			return errno == EEXIST ? SPACED_EEXIST : SPACED_ESYS;
		}
		d = opendir(src);
		if (d == NULL) {
			spaced_why(why, whysz, "opendir %s: %s", src, strerror(errno));
			return SPACED_ESYS;
		}
		while (r == 0 && (de = readdir(d)) != NULL) {
			size_t nl = strlen(de->d_name);

			if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
				continue;
			if (sl + 1 + nl >= PATH_MAX || dl + 1 + nl >= PATH_MAX) {
				spaced_why(why, whysz, "path too long below %s", src);
				r = SPACED_ETOOBIG;
				break;
			}
			src[sl] = '/';
			memcpy(src + sl + 1, de->d_name, nl + 1);
			dst[dl] = '/';
			memcpy(dst + dl + 1, de->d_name, nl + 1);
			r = copy_rec(src, sl + 1 + nl, dst, dl + 1 + nl, lk, sh, depth + 1, why, whysz);
			src[sl] = '\0';
			dst[dl] = '\0';
		}
		closedir(d);
		if (r < 0)
			return r;
	} else if (S_ISREG(st.st_mode)) {
		const char *first = st.st_nlink > 1 ? links_find(lk, &st) : NULL;

		if (first != NULL) {
			/* another name of a file already copied: link, attributes are shared */
			if (link(first, dst) < 0) {
				spaced_why(why, whysz, "link %s: %s", dst, strerror(errno));
				return SPACED_ESYS;
			}
			return 0;
		}
		if (copy_data(src, dst, &st, &lk->pace) < 0) {
			spaced_why(why, whysz, "copy %s: %s", src, strerror(errno));
			return SPACED_ESYS;
		}
		if (st.st_nlink > 1 && links_add(lk, &st, dst) < 0)
			return SPACED_ENOMEM;
	} else if (S_ISLNK(st.st_mode)) {
		char target[PATH_MAX];
		ssize_t n = readlink(src, target, sizeof(target) - 1);

		if (n < 0) {
			spaced_why(why, whysz, "readlink %s: %s", src, strerror(errno));
			return SPACED_ESYS;
		}
		target[n] = '\0';
		if (symlink(target, dst) < 0) {
			spaced_why(why, whysz, "symlink %s: %s", dst, strerror(errno));
			return SPACED_ESYS;
		}
	} else if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) || S_ISFIFO(st.st_mode)) {
		if (mknod(dst, st.st_mode, st.st_rdev) < 0) {
			spaced_why(why, whysz, "mknod %s: %s", dst, strerror(errno));
			return SPACED_ESYS;
		}
	} else {
		return 0; /* sockets are not state */
	}
	if (finish(src, dst, &st, sh) < 0) {
		spaced_why(why, whysz, "attributes of %s: %s", dst, strerror(errno));
		return SPACED_ESYS;
	}
	return 0;
}

int spaced_sub_copy_tree(const char *src, const char *dst, const struct spaced_idshift *shift, uint64_t rate,
                         char *why, size_t whysz)
{
	char s[PATH_MAX], d[PATH_MAX];
	size_t sl = strlen(src), dl = strlen(dst);
	struct copying lk = { NULL, 0, 0, { 0 } };
	int r;

	if (sl >= PATH_MAX || dl >= PATH_MAX)
		return SPACED_ETOOBIG;
	memcpy(s, src, sl + 1);
	memcpy(d, dst, dl + 1);
	/* its pages stay cached: a snapshot's copy is hashed and packed next */
	spaced_pace_init(&lk.pace, rate, false);
	r = copy_rec(s, sl, d, dl, &lk, shift, 0, why, whysz);
	spaced_pace_end(&lk.pace);
	links_free(&lk);
	return r;
}

static int rm_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	if (type == FTW_DP)
		return rmdir(path) < 0 && errno != ENOENT ? -1 : 0;
	return unlink(path) < 0 && errno != ENOENT ? -1 : 0;
}

int spaced_sub_rm_rf(const char *path)
{
	struct stat st;

	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : SPACED_ESYS;
	if (!S_ISDIR(st.st_mode))
		return unlink(path) < 0 ? SPACED_ESYS : 0;
	return nftw(path, rm_one, 64, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) == 0 ? 0 : SPACED_ESYS;
}
