/*
 * mgr_hash.c — the content hash of a snapshot tree (docs/control-messages.md,
 * "Snapshot hash").
 *
 * BLAKE2b-256 (libsodium crypto_generichash, no key) over one byte stream:
 *
 *   "spaced-snapshot-v2" 0x00
 *   then one record per entry, the root first, depth first; the entries of a
 *   directory in bytewise order of their names, a directory's record before
 *   those of its entries. A record (integers little-endian):
 *     u32 path length, path bytes    relative path ("." for the root, "a/b")
 *     u8  type                       'd' 'f' 'l' 'p' 's' 'c' 'b'
 *     u32 mode                       st_mode & 07777
 *     u32 uid, u32 gid
 *     u64 size                       file: its size; symlink: target length; else 0
 *     u64 rdev                       'c' 'b': st_rdev; else 0
 *     payload                        file: its blocks (below); symlink: its target; else none
 *
 * A file's payload: its content cut into blocks of 4096 bytes (the last one
 * shorter); for each block that is not all zeros, in order, u64 block index
 * and the block's bytes; then u64 0xffffffffffffffff. Zeros cost nothing,
 * whether written or holes, so hashing a sparse file reads only its data
 * extents (SEEK_DATA / SEEK_HOLE): the work is bounded by what the file
 * holds, not by the size it claims.
 *
 * Times, inode numbers, link counts and extended attributes are not part of it.
 * Symlinks are never followed. A file whose size changes while it is read, or
 * a tree deeper than MGR_HASH_DEPTH, is an error.
 */
#include "mgr.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include "error.h"
#include "util.h"

#define MGR_HASH_DEPTH 256
#define MGR_HASH_PATH 4096

struct walk {
	crypto_generichash_state h;
	uint64_t bytes;
	char path[MGR_HASH_PATH];
};

static void put_u32(struct walk *w, uint32_t v)
{
	uint8_t b[4];
	for (int i = 0; i < 4; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	crypto_generichash_update(&w->h, b, sizeof b);
}

static void put_u64(struct walk *w, uint64_t v)
{
	uint8_t b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	crypto_generichash_update(&w->h, b, sizeof b);
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int type_of(mode_t m, uint8_t *t)
{
	if (S_ISDIR(m))
		*t = 'd';
	else if (S_ISREG(m))
		*t = 'f';
	else if (S_ISLNK(m))
		*t = 'l';
	else if (S_ISFIFO(m))
		*t = 'p';
	else if (S_ISSOCK(m))
		*t = 's';
	else if (S_ISCHR(m))
		*t = 'c';
	else if (S_ISBLK(m))
		*t = 'b';
	else
		return SPACED_EINVAL;
	return 0;
}

#define HASH_BLOCK 4096

static bool all_zero(const uint8_t *p, size_t n)
{
	static const uint8_t zero[HASH_BLOCK];
	return memcmp(p, zero, n) == 0;
}

/* Reads [from, to) of fd (from a block boundary; to a block boundary or the
 * end of the file) and hashes its non-zero blocks. */
static int hash_extent(struct walk *w, int fd, uint64_t from, uint64_t to)
{
	static uint8_t buf[16 * HASH_BLOCK];
	while (from < to) {
		size_t want = to - from < sizeof buf ? (size_t)(to - from) : sizeof buf, got = 0;
		while (got < want) {
			ssize_t n = pread(fd, buf + got, want - got, (off_t)(from + got));
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				return SPACED_EIO; /* shrank while read */
			got += (size_t)n;
		}
		for (size_t off = 0; off < want; off += HASH_BLOCK) {
			size_t bl = want - off < HASH_BLOCK ? want - off : HASH_BLOCK;
			if (all_zero(buf + off, bl))
				continue;
			put_u64(w, (from + off) / HASH_BLOCK);
			crypto_generichash_update(&w->h, buf + off, bl);
		}
		from += want;
	}
	return 0;
}

static int hash_file(struct walk *w, int dirfd, const char *name, const struct stat *sb)
{
	int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return SPACED_EIO;
	struct stat fs;
	int r = 0;
	uint64_t size = (uint64_t)sb->st_size, pos = 0;
	if (fstat(fd, &fs) < 0 || fs.st_ino != sb->st_ino || fs.st_dev != sb->st_dev || fs.st_size != sb->st_size) {
		r = SPACED_EIO;
		goto out;
	}
	while (pos < size && r == 0) {
		off_t data = lseek(fd, (off_t)pos, SEEK_DATA), hole;
		if (data < 0 && errno == ENXIO)
			break; /* a hole up to the end */
		if (data < 0) {
			r = hash_extent(w, fd, pos, size); /* no SEEK_DATA: all of it */
			break;
		}
		hole = lseek(fd, data, SEEK_HOLE);
		if (hole < 0 || (uint64_t)hole > size)
			hole = (off_t)size;
		/* whole blocks around the extent (a filesystem's blocks may be
		 * smaller than the hash's): from the block the data begins in to
		 * the end of the block it ends in; what lies past pos was hashed */
		uint64_t from = ((uint64_t)data / HASH_BLOCK) * HASH_BLOCK;
		uint64_t to = (((uint64_t)hole + HASH_BLOCK - 1) / HASH_BLOCK) * HASH_BLOCK;
		if (from < pos)
			from = pos;
		if (to > size)
			to = size;
		if (from < to)
			r = hash_extent(w, fd, from, to);
		pos = to > pos ? to : pos;
	}
	if (r == 0 && (fstat(fd, &fs) < 0 || fs.st_size != sb->st_size))
		r = SPACED_EIO; /* changed while read */
	put_u64(w, UINT64_MAX);
	w->bytes += size;
out:
	close(fd);
	return r;
}

/* Hashes the entry name of dirfd whose relative path is w->path[0..plen). */
static int hash_entry(struct walk *w, int dirfd, const char *name, size_t plen, int depth);

static int hash_dir(struct walk *w, int fd, size_t plen, int depth)
{
	char **names = NULL;
	size_t n = 0, cap = 0;
	int r = 0;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return SPACED_EIO;
	}
	struct dirent *de;
	errno = 0;
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 32;
			char **nn = realloc(names, nc * sizeof *nn);
			if (!nn) {
				r = SPACED_ENOMEM;
				goto out;
			}
			names = nn;
			cap = nc;
		}
		if ((names[n] = strdup(de->d_name)) == NULL) {
			r = SPACED_ENOMEM;
			goto out;
		}
		n++;
		errno = 0;
	}
	if (errno != 0) {
		r = SPACED_EIO;
		goto out;
	}
	if (n > 1)
		qsort(names, n, sizeof *names, name_cmp);
	for (size_t i = 0; i < n && r == 0; i++) {
		size_t nl = strlen(names[i]);
		size_t sep = plen ? 1 : 0;
		if (plen + sep + nl >= sizeof w->path) {
			r = SPACED_ETOOBIG;
			break;
		}
		if (sep)
			w->path[plen] = '/';
		memcpy(w->path + plen + sep, names[i], nl + 1);
		r = hash_entry(w, dirfd(d), names[i], plen + sep + nl, depth);
		w->path[plen] = 0;
	}
out:
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	closedir(d);
	return r;
}

static int hash_entry(struct walk *w, int dirfd, const char *name, size_t plen, int depth)
{
	struct stat sb;
	uint8_t t;
	char target[MGR_HASH_PATH];
	ssize_t tl = 0;
	if (depth > MGR_HASH_DEPTH)
		return SPACED_ETOOBIG;
	if (fstatat(dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) < 0)
		return SPACED_EIO;
	if (type_of(sb.st_mode, &t) < 0)
		return SPACED_EINVAL;
	if (t == 'l') {
		tl = readlinkat(dirfd, name, target, sizeof target);
		if (tl < 0 || (size_t)tl >= sizeof target)
			return SPACED_EIO;
	}
	const char *p = plen ? w->path : ".";
	size_t pl = plen ? plen : 1;
	put_u32(w, (uint32_t)pl);
	crypto_generichash_update(&w->h, (const uint8_t *)p, pl);
	crypto_generichash_update(&w->h, &t, 1);
	put_u32(w, (uint32_t)(sb.st_mode & 07777));
	put_u32(w, (uint32_t)sb.st_uid);
	put_u32(w, (uint32_t)sb.st_gid);
	put_u64(w, t == 'f' ? (uint64_t)sb.st_size : t == 'l' ? (uint64_t)tl : 0);
	put_u64(w, (t == 'c' || t == 'b') ? (uint64_t)sb.st_rdev : 0);
	if (t == 'l') {
		crypto_generichash_update(&w->h, (const uint8_t *)target, (size_t)tl);
		return 0;
	}
	if (t == 'f')
		return hash_file(w, dirfd, name, &sb);
	if (t != 'd')
		return 0;
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return SPACED_EIO;
	return hash_dir(w, fd, plen, depth + 1);
}

int mgr_snapshot_hash(const char *dir, char hex[MGR_HASH_HEX], uint64_t *bytes)
{
	static const char tag[] = "spaced-snapshot-v2";
	struct walk *w;
	uint8_t out[32];
	int r;
	if (!dir || dir[0] != '/')
		return SPACED_EINVAL;
	if (sodium_init() < 0)
		return SPACED_EIO;
	if ((w = calloc(1, sizeof *w)) == NULL)
		return SPACED_ENOMEM;
	crypto_generichash_init(&w->h, NULL, 0, sizeof out);
	crypto_generichash_update(&w->h, (const uint8_t *)tag, sizeof tag); /* with its NUL */
	struct stat sb;
	if (lstat(dir, &sb) < 0) {
		r = SPACED_ENOENT;
		goto out;
	}
	if (!S_ISDIR(sb.st_mode)) {
		r = SPACED_EINVAL;
		goto out;
	}
	r = hash_entry(w, AT_FDCWD, dir, 0, 0);
	if (r < 0)
		goto out;
	crypto_generichash_final(&w->h, out, sizeof out);
	sodium_bin2hex(hex, MGR_HASH_HEX, out, sizeof out);
	if (bytes)
		*bytes = w->bytes;
out:
	spaced_wipe(w, sizeof *w);
	free(w);
	return r;
}
