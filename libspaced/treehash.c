/*
 * treehash.c — the content hash of a tree (treehash.h): the record stream
 * and a walk of a directory on disk that feeds it.
 */
#include "treehash.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "spaced_error.h"
#include "util.h"

#define NO_BLOCK UINT64_MAX

struct spaced_treehash {
	crypto_generichash_state h;
	bool file_open;
	uint64_t fsize, fed, blk; /* the open file: size, bytes fed up to, block in buf */
	uint8_t buf[SPACED_TREEHASH_BLOCK];
};

static void put_u32(struct spaced_treehash *t, uint32_t v)
{
	uint8_t b[4];
	for (int i = 0; i < 4; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	crypto_generichash_update(&t->h, b, sizeof b);
}

static void put_u64(struct spaced_treehash *t, uint64_t v)
{
	uint8_t b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	crypto_generichash_update(&t->h, b, sizeof b);
}

int spaced_treehash_new(struct spaced_treehash **out)
{
	static const char tag[] = "spaced-snapshot-v2";
	if (sodium_init() < 0)
		return SPACED_EIO;
	struct spaced_treehash *t = calloc(1, sizeof *t);
	if (!t)
		return SPACED_ENOMEM;
	crypto_generichash_init(&t->h, NULL, 0, 32);
	crypto_generichash_update(&t->h, (const uint8_t *)tag, sizeof tag); /* with its NUL */
	t->blk = NO_BLOCK;
	*out = t;
	return 0;
}

void spaced_treehash_free(struct spaced_treehash *t)
{
	if (!t)
		return;
	spaced_wipe(t, sizeof *t);
	free(t);
}

int spaced_treehash_entry(struct spaced_treehash *t, const char *path, char type, uint32_t mode, uint32_t uid,
                          uint32_t gid, uint64_t size, uint64_t rdev, const char *link)
{
	if (t->file_open || !path || !*path || !strchr("dfplscb", type) || type == 0)
		return SPACED_EINVAL;
	size_t pl = strlen(path);
	if (pl >= SPACED_TREEHASH_PATH)
		return SPACED_ETOOBIG;
	if (type == 'l' && (!link || strlen(link) != size))
		return SPACED_EINVAL;
	uint8_t ty = (uint8_t)type;
	put_u32(t, (uint32_t)pl);
	crypto_generichash_update(&t->h, (const uint8_t *)path, pl);
	crypto_generichash_update(&t->h, &ty, 1);
	put_u32(t, mode & 07777);
	put_u32(t, uid);
	put_u32(t, gid);
	put_u64(t, (type == 'f' || type == 'l') ? size : 0);
	put_u64(t, (type == 'c' || type == 'b') ? rdev : 0);
	if (type == 'l')
		crypto_generichash_update(&t->h, (const uint8_t *)link, (size_t)size);
	if (type == 'f') {
		t->file_open = true;
		t->fsize = size;
		t->fed = 0;
		t->blk = NO_BLOCK;
	}
	return 0;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	static const uint8_t zero[SPACED_TREEHASH_BLOCK];
	return memcmp(p, zero, n) == 0;
}

/* Emits the block in buf unless it is all zeros. */
static void flush_block(struct spaced_treehash *t)
{
	if (t->blk == NO_BLOCK)
		return;
	uint64_t start = t->blk * SPACED_TREEHASH_BLOCK;
	size_t len = t->fsize - start < SPACED_TREEHASH_BLOCK ? (size_t)(t->fsize - start) : SPACED_TREEHASH_BLOCK;
	if (!all_zero(t->buf, len)) {
		put_u64(t, t->blk);
		crypto_generichash_update(&t->h, t->buf, len);
	}
	t->blk = NO_BLOCK;
}

int spaced_treehash_data(struct spaced_treehash *t, uint64_t off, const void *p, size_t n)
{
	const uint8_t *in = p;
	if (!t->file_open || off < t->fed || off > t->fsize || n > t->fsize - off)
		return SPACED_EINVAL;
	while (n > 0) {
		uint64_t blk = off / SPACED_TREEHASH_BLOCK;
		size_t at = (size_t)(off % SPACED_TREEHASH_BLOCK);
		size_t take = SPACED_TREEHASH_BLOCK - at < n ? SPACED_TREEHASH_BLOCK - at : n;
		if (blk != t->blk) {
			flush_block(t);
			memset(t->buf, 0, sizeof t->buf);
			t->blk = blk;
		}
		memcpy(t->buf + at, in, take);
		in += take;
		off += take;
		n -= take;
	}
	t->fed = off;
	return 0;
}

int spaced_treehash_file_end(struct spaced_treehash *t)
{
	if (!t->file_open)
		return SPACED_EINVAL;
	flush_block(t);
	put_u64(t, UINT64_MAX);
	t->file_open = false;
	return 0;
}

int spaced_treehash_final(struct spaced_treehash *t, char hex[SPACED_TREEHASH_HEX])
{
	uint8_t out[32];
	if (t->file_open) {
		spaced_treehash_free(t);
		return SPACED_EINVAL;
	}
	crypto_generichash_final(&t->h, out, sizeof out);
	sodium_bin2hex(hex, SPACED_TREEHASH_HEX, out, sizeof out);
	spaced_treehash_free(t);
	return 0;
}

int spaced_treehash_hex_valid(const char *s)
{
	if (!s || strlen(s) != SPACED_TREEHASH_HEX - 1)
		return 0;
	for (const char *p = s; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return 0;
	return 1;
}

/* ---- a directory on disk ---- */

struct walk {
	struct spaced_treehash *t;
	uint64_t bytes, read; /* the files' sizes; their data read so far */
	char path[SPACED_TREEHASH_PATH];
	uint8_t buf[16 * SPACED_TREEHASH_BLOCK];
};

static int type_of(mode_t m, char *t)
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

/* Reads [from, to) of fd and feeds it. */
static int hash_extent(struct walk *w, int fd, uint64_t from, uint64_t to)
{
	while (from < to) {
		size_t want = to - from < sizeof w->buf ? (size_t)(to - from) : sizeof w->buf, got = 0;
		while (got < want) {
			ssize_t n = pread(fd, w->buf + got, want - got, (off_t)(from + got));
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				return SPACED_EIO; /* shrank while read */
			got += (size_t)n;
		}
		int r = spaced_treehash_data(w->t, from, w->buf, want);
		if (r < 0)
			return r;
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
	/* what it holds is read once per name: a thousand names of a big file
	 * would have the walk read it a thousand times */
	uint64_t held = (uint64_t)sb->st_blocks * 512u;
	if (held > SPACED_TREEHASH_MAX_READ - w->read) {
		r = SPACED_ETOOBIG;
		goto out;
	}
	w->read += held;
	/* only the data extents are read: a sparse file costs what it holds */
	while (pos < size && r == 0) {
		off_t data = lseek(fd, (off_t)pos, SEEK_DATA), hole;
		if (data < 0 && errno == ENXIO)
			break; /* a hole up to the end */
		if (data < 0) {
			r = hash_extent(w, fd, pos, size); /* no SEEK_DATA: all of it */
			break;
		}
		if ((uint64_t)data >= size)
			break;
		hole = lseek(fd, data, SEEK_HOLE);
		if (hole <= data || (uint64_t)hole > size)
			hole = (off_t)size;
		r = hash_extent(w, fd, (uint64_t)data, (uint64_t)hole);
		pos = (uint64_t)hole;
	}
	if (r == 0 && (fstat(fd, &fs) < 0 || fs.st_size != sb->st_size))
		r = SPACED_EIO; /* changed while read */
	if (r == 0)
		r = spaced_treehash_file_end(w->t);
	w->bytes += size;
out:
	close(fd);
	return r;
}

static int hash_entry(struct walk *w, int dirfd, const char *name, size_t plen, int depth);

static int hash_dir(struct walk *w, int fd, size_t plen, int depth)
{
	char **names = NULL;
	size_t n = 0;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return SPACED_EIO;
	}
	int r = spaced_dir_names(d, &names, &n);
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
	spaced_dir_names_free(names, n);
	closedir(d);
	return r;
}

static int hash_entry(struct walk *w, int dirfd, const char *name, size_t plen, int depth)
{
	struct stat sb;
	char t;
	char target[SPACED_TREEHASH_PATH];
	ssize_t tl = 0;
	if (depth > SPACED_TREEHASH_DEPTH)
		return SPACED_ETOOBIG;
	if (fstatat(dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) < 0)
		return SPACED_EIO;
	if (type_of(sb.st_mode, &t) < 0)
		return SPACED_EINVAL;
	if (t == 'l') {
		tl = readlinkat(dirfd, name, target, sizeof target);
		if (tl < 0 || (size_t)tl >= sizeof target)
			return SPACED_EIO;
		target[tl] = 0;
	}
	int r = spaced_treehash_entry(w->t, plen ? w->path : ".", t, (uint32_t)sb.st_mode, (uint32_t)sb.st_uid,
	                              (uint32_t)sb.st_gid, t == 'f' ? (uint64_t)sb.st_size : (uint64_t)tl,
	                              (uint64_t)sb.st_rdev, t == 'l' ? target : NULL);
	if (r < 0)
		return r;
	if (t == 'f')
		return hash_file(w, dirfd, name, &sb);
	if (t != 'd')
		return 0;
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return SPACED_EIO;
	return hash_dir(w, fd, plen, depth + 1);
}

int spaced_treehash_dir(const char *dir, char hex[SPACED_TREEHASH_HEX], uint64_t *bytes)
{
	struct walk *w;
	struct stat sb;
	int r;
	if (!dir || dir[0] != '/')
		return SPACED_EINVAL;
	if ((w = calloc(1, sizeof *w)) == NULL)
		return SPACED_ENOMEM;
	if ((r = spaced_treehash_new(&w->t)) < 0)
		goto out;
	if (lstat(dir, &sb) < 0) {
		r = SPACED_ENOENT;
		goto out;
	}
	if (!S_ISDIR(sb.st_mode)) {
		r = SPACED_EINVAL;
		goto out;
	}
	if ((r = hash_entry(w, AT_FDCWD, dir, 0, 0)) < 0)
		goto out;
	char h[SPACED_TREEHASH_HEX];
	r = spaced_treehash_final(w->t, h);
	w->t = NULL;
	if (r < 0)
		goto out;
	memcpy(hex, h, sizeof h);
	if (bytes)
		*bytes = w->bytes;
out:
	spaced_treehash_free(w->t);
	spaced_wipe(w, sizeof *w);
	free(w);
	return r;
}
