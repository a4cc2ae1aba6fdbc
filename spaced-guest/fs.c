/* fs.c — file operations of spaced-guest.
 *
 * Every path is resolved with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
 * from the root directory fd: "..", absolute symlinks and symlinks pointing
 * outside stay inside the root (as if the root were "/"), and magic links such
 * as /proc/self/root are refused. Operations on a final name (mkdir, rename,
 * unlink, stat) resolve the parent that way and act on the name with *at()
 * calls that never follow it. The guest's own entry in /proc (its memory map,
 * its descriptors, its command line: what its seal keeps from the sandbox's
 * processes) is refused too, since the guest is the one that would open it. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <sodium.h>

#include "spaced_error.h"
#include "guest.h"

#define RESOLVE_FLAGS (RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
#define PROC_MAGIC 0x9fa0 /* procfs's f_type */

/* True when fd (just opened for a tenant) is in the guest's own /proc entry:
 * /proc/self, /proc/thread-self and /proc/<its pid> lead there. Anything of
 * /proc the guest cannot place is refused with it. */
static bool guest_own_proc(int fd)
{
	struct statfs sf;
	if (fstatfs(fd, &sf) < 0 || sf.f_type != PROC_MAGIC)
		return false;
	char link[64], at[SPACED_GUEST_PATH_MAX], own[32];
	snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, at, sizeof at - 1);
	if (n < 0)
		return true;
	at[n] = 0;
	/* as the sandbox sees it: below the root the guest serves (--root) */
	const char *rel = at;
	size_t rl = strlen(G.root);
	while (rl > 1 && G.root[rl - 1] == '/')
		rl--;
	if (rl > 1 && strncmp(at, G.root, rl) == 0 && at[rl] == '/')
		rel = at + rl;
	int l = snprintf(own, sizeof own, "/proc/%d", (int)getpid());
	if (strncmp(rel, "/proc/", 6) != 0 && strcmp(rel, "/proc") != 0)
		return true; /* a procfs seen elsewhere than /proc */
	return strncmp(rel, own, (size_t)l) == 0 && (rel[l] == 0 || rel[l] == '/');
}

int fs_resolve(const char *path, int flags, mode_t mode, int *out)
{
	struct open_how how = {
		.flags = (uint64_t)(flags | O_CLOEXEC),
		.mode = (flags & (O_CREAT | O_TMPFILE)) ? mode : 0,
		.resolve = RESOLVE_FLAGS,
	};
	const char *p = path[0] ? path : ".";
	for (;;) {
		long fd = syscall(SYS_openat2, G.rootfd, p, &how, sizeof how);
		if (fd >= 0 && guest_own_proc((int)fd)) {
			close((int)fd);
			return -EACCES;
		}
		if (fd >= 0) {
			*out = (int)fd;
			return 0;
		}
		if (errno != EINTR && errno != EAGAIN)
			return -errno;
	}
}

static void reply_errno(struct conn *c, uint32_t id, const char *what, int err)
{
	char msg[160];
	snprintf(msg, sizeof msg, "%s: %s", what, strerror(err));
	reply_result(c, id, errno_to_spaced(err), msg, NULL);
}

/* Splits path into a resolved parent directory fd and the final name. The
 * name must be a real component (not "", "." or ".."). Returns 0, -EINVAL or
 * another -errno. */
static int split_parent(const char *path, int oflags, int *pfd, char name[NAME_MAX + 1])
{
	char buf[SPACED_GUEST_PATH_MAX];
	size_t n = strlen(path);
	if (n >= sizeof buf)
		return -ENAMETOOLONG;
	memcpy(buf, path, n + 1);
	while (n > 0 && buf[n - 1] == '/')
		buf[--n] = 0;
	char *slash = strrchr(buf, '/');
	const char *last = slash ? slash + 1 : buf;
	if (last[0] == 0 || strcmp(last, ".") == 0 || strcmp(last, "..") == 0)
		return -EINVAL;
	if (strlen(last) > NAME_MAX)
		return -ENAMETOOLONG;
	memcpy(name, last, strlen(last) + 1);
	if (slash == NULL)
		buf[0] = 0;
	else if (slash == buf)
		buf[1] = 0;
	else
		*slash = 0;
	return fs_resolve(buf, oflags | O_DIRECTORY, 0, pfd);
}

/* True when p names the root: components that are all "", "." or ".."
 * ("..." and "...." are names like any other). */
static bool is_root_path(const char *p)
{
	while (*p) {
		size_t n = strcspn(p, "/");
		if (n > 2 || (n > 0 && strspn(p, ".") < n))
			return false;
		p += n;
		p += *p == '/';
	}
	return true;
}

static uint32_t ftype(mode_t m)
{
	if (S_ISREG(m))
		return SPACED_GUEST_FT_FILE;
	if (S_ISDIR(m))
		return SPACED_GUEST_FT_DIR;
	if (S_ISLNK(m))
		return SPACED_GUEST_FT_SYMLINK;
	return SPACED_GUEST_FT_OTHER;
}

static int put_stat(struct spaced_buf *b, const struct stat *st)
{
	int e = spaced_field_put_u64(b, ftype(st->st_mode));
	if (e == 0)
		e = spaced_field_put_u64(b, (uint64_t)st->st_size);
	if (e == 0)
		e = spaced_field_put_u64(b, st->st_mode & 07777);
	if (e == 0)
		e = spaced_field_put_i64(b, (int64_t)st->st_mtim.tv_sec);
	return e;
}

/* ---- read ---- */

int fs_read_start(struct conn *c, uint32_t id, struct spaced_field_reader *r)
{
	char path[SPACED_GUEST_PATH_MAX];
	uint64_t off = 0, len = 0;
	(void)spaced_field_get_strbuf(r, path, sizeof path);
	(void)spaced_field_get_u64(r, &off);
	(void)spaced_field_get_u64(r, &len);
	if (spaced_field_end(r) < 0)
		return SPACED_EPROTO;
	int fd = -1;
	int e = fs_resolve(path, O_RDONLY | O_NOCTTY | O_NONBLOCK, 0, &fd);
	if (e < 0) {
		reply_errno(c, id, "open", -e);
		return 0;
	}
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		reply_result(c, id, SPACED_EINVAL, "not a regular file", NULL);
		return 0;
	}
	struct stream *s = stream_new(c, id, ST_READ);
	if (s == NULL) {
		close(fd);
		reply_result(c, id, SPACED_ENOMEM, NULL, NULL);
		return 0;
	}
	s->fd = fd;
	s->offset = off;
	s->fsize = (uint64_t)st.st_size;
	s->remaining = len;
	return 0;
}

/* How much of the read stream s its file held when it was opened, up to a
 * chunk: sent from the file's pages (conn_send_from_fd) from
 * GUEST_SPLICE_MIN on. */
static size_t read_spliceable(const struct stream *s)
{
	uint64_t n = s->fsize > s->offset ? s->fsize - s->offset : 0;
	if (n > s->remaining)
		n = s->remaining;
	return n < SPACED_FRAME_CHUNK ? (size_t)n : SPACED_FRAME_CHUNK;
}

bool fs_read_ready(const struct stream *s)
{
	const struct conn *c = s->conn;
	if (read_spliceable(s) >= GUEST_SPLICE_MIN)
		return c->oq_head == NULL && !c->wblocked;
	return c->oq_bytes < GUEST_OUT_HIGH && !c->wblocked;
}

/* Sends the next chunk of an open read stream, or its RESULT. */
void fs_read_pump(struct stream *s)
{
	size_t want = SPACED_FRAME_CHUNK;
	if (s->remaining < want)
		want = (size_t)s->remaining;
	size_t direct = read_spliceable(s);
	if (direct >= GUEST_SPLICE_MIN) {
		/* from the file's pages, when the connection has room (else later) */
		off_t off = (off_t)s->offset;
		if (conn_send_from_fd(s->conn, SPACED_GUEST_OUT_DATA, s->id, s->fd, &off, direct) > 0) {
			s->offset += direct;
			s->sent += direct;
			s->remaining -= direct;
		}
		return;
	}
	if (want > 0) {
		struct outbuf *o = conn_frame_alloc(want);
		if (o == NULL) {
			stream_finish(s, SPACED_ENOMEM, NULL, NULL);
			return;
		}
		ssize_t k;
		do
			k = pread(s->fd, o->data + SPACED_FRAME_HDR_LEN, want, (off_t)s->offset);
		while (k < 0 && errno == EINTR);
		if (k < 0) {
			free(o);
			stream_finish(s, SPACED_EIO, "read failed", NULL);
			return;
		}
		if (k > 0) {
			(void)conn_frame_commit(s->conn, o, SPACED_GUEST_OUT_DATA, 0, s->id, (size_t)k);
			s->offset += (uint64_t)k;
			s->sent += (uint64_t)k;
			s->remaining -= (uint64_t)k;
			return;
		}
		free(o);
	}
	struct spaced_buf x;
	spaced_buf_init(&x, 64);
	(void)spaced_field_put_u64(&x, s->sent);
	(void)spaced_field_put_u64(&x, s->fsize);
	stream_finish(s, 0, "", &x);
	spaced_buf_free(&x);
}

/* ---- write: temp file beside the target, fsync, rename, fsync dir ---- */

static int mkdirs(const char *path, mode_t mode);

int fs_write_start(struct conn *c, uint32_t id, struct spaced_field_reader *r)
{
	char path[SPACED_GUEST_PATH_MAX];
	char name[NAME_MAX + 1];
	uint64_t mode = 0, flags = 0;
	(void)spaced_field_get_strbuf(r, path, sizeof path);
	(void)spaced_field_get_u64(r, &mode);
	(void)spaced_field_get_u64(r, &flags);
	if (spaced_field_end(r) < 0)
		return SPACED_EPROTO;
	if (mode > 07777 || (flags & ~(uint64_t)SPACED_GUEST_WRITE_MKDIRS)) {
		reply_result(c, id, SPACED_EINVAL, "bad mode or flags", NULL);
		return 0;
	}
	if (mode == 0)
		mode = 0644;
	int pfd = -1, fd = -1;
	int e = split_parent(path, O_RDONLY, &pfd, name);
	if (e == -ENOENT && (flags & SPACED_GUEST_WRITE_MKDIRS)) {
		char parent[SPACED_GUEST_PATH_MAX];
		snprintf(parent, sizeof parent, "%s", path);
		char *sl = strrchr(parent, '/');
		if (sl != NULL) {
			*sl = 0;
			e = mkdirs(parent, 0755);
			if (e == 0)
				e = split_parent(path, O_RDONLY, &pfd, name);
		}
	}
	if (e < 0) {
		reply_errno(c, id, "parent", -e);
		return 0;
	}
	struct stream *s = stream_new(c, id, ST_WRITE);
	if (s == NULL) {
		close(pfd);
		reply_result(c, id, SPACED_ENOMEM, NULL, NULL);
		return 0;
	}
	s->dirfd = pfd;
	s->name = strdup(name);
	for (int tries = 0; tries < 8 && fd < 0; tries++) {
		uint8_t rnd[8];
		randombytes_buf(rnd, sizeof rnd);
		snprintf(s->tmpname, sizeof s->tmpname, ".spaced-tmp-%02x%02x%02x%02x%02x%02x%02x%02x",
		         rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
		fd = openat(pfd, s->tmpname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
		            (mode_t)mode);
		if (fd < 0 && errno != EEXIST)
			break;
	}
	if (fd < 0 || s->name == NULL) {
		int err = fd < 0 ? errno : ENOMEM;
		s->tmpname[0] = 0;
		char msg[160];
		snprintf(msg, sizeof msg, "create: %s", strerror(err));
		stream_finish(s, errno_to_spaced(err), msg, NULL);
		return 0;
	}
	if (fchmod(fd, (mode_t)mode) < 0) {
		close(fd);
		stream_finish(s, SPACED_EIO, "chmod failed", NULL);
		return 0;
	}
	s->fd = fd;
	return 0;
}

/* Writeback is started every FS_WRITEBACK_CHUNK bytes as the data comes in
 * (sync_file_range, which does not wait), so that the fsync that commits the
 * file finds most of it on its way to the disk already instead of writing it
 * all after the last byte; and the file's pages do not pile up dirty. */
#define FS_WRITEBACK_CHUNK (8u << 20)

/* A large upload goes past the page cache: after its first FS_DIRECT_AFTER
 * bytes (written through the cache, like every small file), the rest is
 * staged in two aligned buffers and written with O_DIRECT, FS_DIRECT_CHUNK at
 * a time, by the writer thread while the next chunk comes in (writer.c); the
 * unaligned tail goes through the cache again. Copying a whole upload into
 * fresh page-cache pages costs the sandbox more CPU than the transfer itself,
 * evicts its working set, and all of it must reach the disk before the fsync
 * that commits the file returns anyway. A file system that refuses O_DIRECT
 * keeps the upload buffered. At most FS_DIRECT_STREAMS uploads hold staging
 * buffers at once (the guest's memory is the sandbox's). */
#define FS_DIRECT_AFTER (8u << 20)
#define FS_DIRECT_CHUNK (2u << 20)
#define FS_DIRECT_ALIGN 4096u
#define FS_DIRECT_STREAMS 4
static unsigned direct_streams;

/* Waits for the write handed over last, if any, and takes its result (it
 * may have finished, and failed, long before); 0, or -1 with errno set. */
static int direct_settle(struct stream *s)
{
	if (!s->job_pending)
		return 0;
	s->job_pending = false;
	int err = writer_wait(&s->job);
	if (err == 0)
		return 0;
	errno = err;
	return -1;
}

/* The staging buffers go (after the write in flight); the upload goes on
 * through the page cache. */
static void direct_end(struct stream *s)
{
	if (s->dbuf[0] == NULL)
		return;
	(void)direct_settle(s);
	free(s->dbuf[0]);
	free(s->dbuf[1]);
	s->dbuf[0] = s->dbuf[1] = NULL;
	s->dlen = 0;
	direct_streams--;
}

/* p[0..n) at off through the page cache: O_DIRECT off first. */
static int write_buffered(struct stream *s, const uint8_t *p, size_t n, uint64_t off)
{
	int flags = fcntl(s->fd, F_GETFL);
	if (flags < 0 || ((flags & O_DIRECT) && fcntl(s->fd, F_SETFL, flags & ~O_DIRECT) < 0))
		return -1;
	return spaced_io_pwrite_full(s->fd, p, n, off);
}

/* Hands the full staging buffer to the writer thread and switches to the
 * other one, once its own write is done. A write the file system refused
 * (EINVAL: no O_DIRECT here after all) is made again through the page cache,
 * and the upload stays buffered. */
static int direct_rotate(struct stream *s)
{
	uint64_t off = s->written - s->dlen;
	if (direct_settle(s) < 0) {
		if (errno != EINVAL || write_buffered(s, s->job.p, s->job.n, s->job.off) < 0 ||
		    write_buffered(s, s->dbuf[s->dcur], s->dlen, off) < 0)
			return -1;
		direct_end(s);
		return 0;
	}
	s->job = (struct wjob){.fd = s->fd, .p = s->dbuf[s->dcur], .n = s->dlen, .off = off};
	if (writer_submit(&s->job) == 0)
		s->job_pending = true;
	else if (spaced_io_pwrite_full(s->fd, s->job.p, s->job.n, off) < 0) {
		/* no thread: written here, and refused */
		if (errno != EINVAL || write_buffered(s, s->job.p, s->job.n, off) < 0)
			return -1;
		direct_end(s);
		return 0;
	}
	s->dcur ^= 1;
	s->dlen = 0;
	return 0;
}

/* At the end of the upload: what is staged, its aligned part direct, the
 * rest through the page cache. */
static int direct_finish(struct stream *s)
{
	uint64_t off = s->written - s->dlen;
	size_t aligned = s->dlen & ~(size_t)(FS_DIRECT_ALIGN - 1);
	if (direct_settle(s) < 0) {
		if (errno != EINVAL || write_buffered(s, s->job.p, s->job.n, s->job.off) < 0)
			return -1;
		aligned = 0;
	}
	if (aligned > 0 && spaced_io_pwrite_full(s->fd, s->dbuf[s->dcur], aligned, off) < 0) {
		if (errno != EINVAL)
			return -1;
		aligned = 0;
	}
	if (aligned < s->dlen && write_buffered(s, s->dbuf[s->dcur] + aligned, s->dlen - aligned, off + aligned) < 0)
		return -1;
	s->dlen = 0;
	direct_end(s);
	return 0;
}

/* Starts staging for direct writes (at an aligned offset); false: buffered. */
static bool direct_start(struct stream *s)
{
	s->direct_tried = true;
	if (direct_streams >= FS_DIRECT_STREAMS)
		return false;
	void *a = NULL, *b = NULL;
	if (posix_memalign(&a, FS_DIRECT_ALIGN, FS_DIRECT_CHUNK) != 0 ||
	    posix_memalign(&b, FS_DIRECT_ALIGN, FS_DIRECT_CHUNK) != 0) {
		free(a);
		return false;
	}
	int flags = fcntl(s->fd, F_GETFL);
	/* what was written through the cache starts on its way to the disk */
	(void)sync_file_range(s->fd, 0, 0, SYNC_FILE_RANGE_WRITE);
	if (flags < 0 || fcntl(s->fd, F_SETFL, flags | O_DIRECT) < 0) {
		free(a);
		free(b);
		return false;
	}
	s->dbuf[0] = a;
	s->dbuf[1] = b;
	s->dcur = 0;
	s->dlen = 0;
	direct_streams++;
	return true;
}

static int write_some(struct stream *s, const uint8_t *p, size_t n)
{
	while (n > 0) {
		if (s->dbuf[0] != NULL) {
			size_t take = FS_DIRECT_CHUNK - s->dlen < n ? FS_DIRECT_CHUNK - s->dlen : n;
			memcpy(s->dbuf[s->dcur] + s->dlen, p, take);
			s->dlen += take;
			s->written += take;
			p += take;
			n -= take;
			if (s->dlen == FS_DIRECT_CHUNK && direct_rotate(s) < 0)
				return -1;
			continue;
		}
		/* through the cache, up to the switch's (aligned) offset */
		size_t take = n;
		if (!s->direct_tried && s->written < FS_DIRECT_AFTER && FS_DIRECT_AFTER - s->written < n)
			take = (size_t)(FS_DIRECT_AFTER - s->written);
		if (spaced_io_pwrite_full(s->fd, p, take, s->written) < 0)
			return -1;
		uint64_t before = s->written;
		s->written += take;
		p += take;
		n -= take;
		if (s->written / FS_WRITEBACK_CHUNK != before / FS_WRITEBACK_CHUNK) {
			uint64_t upto = s->written / FS_WRITEBACK_CHUNK * FS_WRITEBACK_CHUNK;
			(void)sync_file_range(s->fd, (off_t)(upto - FS_WRITEBACK_CHUNK), FS_WRITEBACK_CHUNK,
			                      SYNC_FILE_RANGE_WRITE);
		}
		if (!s->direct_tried && s->written == FS_DIRECT_AFTER)
			(void)direct_start(s);
	}
	return 0;
}

void fs_write_data(struct stream *s, const uint8_t *p, size_t n, bool end)
{
	if (write_some(s, p, n) < 0 || (end && s->dbuf[0] != NULL && direct_finish(s) < 0)) {
		char msg[160];
		snprintf(msg, sizeof msg, "write failed: %s", strerror(errno));
		stream_finish(s, SPACED_EIO, msg, NULL);
		return;
	}
	if (!end)
		return;
	if (fsync(s->fd) < 0) {
		stream_finish(s, SPACED_EIO, "fsync failed", NULL);
		return;
	}
	if (renameat(s->dirfd, s->tmpname, s->dirfd, s->name) < 0) {
		char msg[160];
		snprintf(msg, sizeof msg, "rename: %s", strerror(errno));
		stream_finish(s, errno_to_spaced(errno), msg, NULL);
		return;
	}
	s->tmpname[0] = 0; /* committed: nothing to remove */
	(void)fsync(s->dirfd);
	struct spaced_buf x;
	spaced_buf_init(&x, 64);
	(void)spaced_field_put_u64(&x, s->written);
	stream_finish(s, 0, "", &x);
	spaced_buf_free(&x);
}

void fs_write_abort(struct stream *s)
{
	direct_end(s);
	if (s->dirfd >= 0 && s->tmpname[0])
		(void)unlinkat(s->dirfd, s->tmpname, 0);
	s->tmpname[0] = 0;
	if (s->dirfd >= 0)
		close(s->dirfd);
	s->dirfd = -1;
}

/* ---- list ---- */

struct lister {
	struct conn *c;
	uint32_t id;
	struct spaced_buf batch;
	int err;
};

static void list_flush(struct lister *l)
{
	if (l->batch.len > 0)
		(void)conn_queue_frame(l->c, SPACED_GUEST_OUT_ENTRIES, 0, l->id, l->batch.data,
		                       l->batch.len);
	l->batch.len = 0;
}

static void list_dir(struct lister *l, int dfd, const char *prefix, uint32_t depth)
{
	DIR *d = fdopendir(dfd);
	if (d == NULL) {
		close(dfd);
		l->err = errno;
		return;
	}
	struct dirent *de;
	while ((de = readdir(d)) != NULL && !l->c->dead) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		struct stat st;
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		char rel[SPACED_GUEST_PATH_MAX];
		int rl = snprintf(rel, sizeof rel, "%s%s%s", prefix, prefix[0] ? "/" : "", de->d_name);
		if (rl < 0 || (size_t)rl >= sizeof rel)
			continue;
		if (spaced_field_put_str(&l->batch, rel) < 0 || put_stat(&l->batch, &st) < 0) {
			l->err = ENOMEM;
			break;
		}
		if (l->batch.len > SPACED_FRAME_CHUNK)
			list_flush(l);
		if (S_ISDIR(st.st_mode) && depth > 1) {
			int sub = openat(dirfd(d), de->d_name,
			                 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub >= 0)
				list_dir(l, sub, rel, depth - 1);
		}
	}
	closedir(d);
}

int fs_list(struct conn *c, uint32_t id, struct spaced_field_reader *r)
{
	char path[SPACED_GUEST_PATH_MAX];
	uint64_t depth = 0;
	(void)spaced_field_get_strbuf(r, path, sizeof path);
	(void)spaced_field_get_u64(r, &depth);
	if (spaced_field_end(r) < 0)
		return SPACED_EPROTO;
	if (depth == 0)
		depth = 1;
	if (depth > GUEST_LIST_DEPTH_MAX)
		depth = GUEST_LIST_DEPTH_MAX;
	int dfd = -1;
	int e = fs_resolve(path, O_RDONLY | O_DIRECTORY, 0, &dfd);
	if (e < 0) {
		reply_errno(c, id, "open", -e);
		return 0;
	}
	struct lister l = {.c = c, .id = id};
	spaced_buf_init(&l.batch, SPACED_FRAME_MAX);
	list_dir(&l, dfd, "", (uint32_t)depth);
	list_flush(&l);
	spaced_buf_free(&l.batch);
	if (l.err)
		reply_errno(c, id, "list", l.err);
	else
		reply_result(c, id, 0, "", NULL);
	return 0;
}

/* ---- stat ---- */

int fs_stat(struct conn *c, uint32_t id, struct spaced_field_reader *r)
{
	char path[SPACED_GUEST_PATH_MAX];
	char name[NAME_MAX + 1];
	(void)spaced_field_get_strbuf(r, path, sizeof path);
	if (spaced_field_end(r) < 0)
		return SPACED_EPROTO;
	struct stat st;
	if (is_root_path(path)) {
		if (fstat(G.rootfd, &st) < 0) {
			reply_errno(c, id, "stat", errno);
			return 0;
		}
	} else {
		int pfd = -1;
		int e = split_parent(path, O_PATH, &pfd, name);
		if (e < 0) {
			reply_errno(c, id, "stat", -e);
			return 0;
		}
		e = fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 ? errno : 0;
		close(pfd);
		if (e) {
			reply_errno(c, id, "stat", e);
			return 0;
		}
	}
	struct spaced_buf x;
	spaced_buf_init(&x, 128);
	(void)put_stat(&x, &st);
	reply_result(c, id, 0, "", &x);
	spaced_buf_free(&x);
	return 0;
}

/* ---- mkdir -p ---- */

static int mkdirs(const char *path, mode_t mode)
{
	char buf[SPACED_GUEST_PATH_MAX];
	char name[NAME_MAX + 1];
	size_t n = strlen(path);
	if (n >= sizeof buf)
		return -ENAMETOOLONG;
	if (is_root_path(path))
		return 0;
	memcpy(buf, path, n + 1);
	/* Walk prefixes ending at each component boundary. */
	for (size_t i = 1; i <= n; i++) {
		if (i < n && buf[i] != '/')
			continue;
		if (buf[i - 1] == '/')
			continue;
		char save = buf[i];
		buf[i] = 0;
		const char *comp = strrchr(buf, '/');
		comp = comp ? comp + 1 : buf;
		if (strcmp(comp, "..") == 0) {
			buf[i] = save;
			return -EINVAL;
		}
		if (strcmp(comp, ".") != 0) {
			int pfd = -1;
			int e = split_parent(buf, O_PATH, &pfd, name);
			if (e < 0) {
				buf[i] = save;
				return e;
			}
			e = mkdirat(pfd, name, mode) < 0 ? errno : 0;
			close(pfd);
			if (e == EEXIST) {
				int dfd = -1;
				e = -fs_resolve(buf, O_PATH | O_DIRECTORY, 0, &dfd);
				if (e == 0)
					close(dfd);
			}
			if (e) {
				buf[i] = save;
				return -e;
			}
		}
		buf[i] = save;
	}
	return 0;
}

int fs_mkdir(struct conn *c, uint32_t id, struct spaced_field_reader *r)
{
	char path[SPACED_GUEST_PATH_MAX];
	uint64_t mode = 0;
	(void)spaced_field_get_strbuf(r, path, sizeof path);
	(void)spaced_field_get_u64(r, &mode);
	if (spaced_field_end(r) < 0)
		return SPACED_EPROTO;
	if (mode > 07777) {
		reply_result(c, id, SPACED_EINVAL, "bad mode", NULL);
		return 0;
	}
	int e = mkdirs(path, mode ? (mode_t)mode : 0755);
	if (e < 0)
		reply_errno(c, id, "mkdir", -e);
	else
		reply_result(c, id, 0, "", NULL);
	return 0;
}

/* ---- move ---- */

int fs_move(struct conn *c, uint32_t id, struct spaced_field_reader *r)
{
	char from[SPACED_GUEST_PATH_MAX], to[SPACED_GUEST_PATH_MAX];
	char n1[NAME_MAX + 1], n2[NAME_MAX + 1];
	(void)spaced_field_get_strbuf(r, from, sizeof from);
	(void)spaced_field_get_strbuf(r, to, sizeof to);
	if (spaced_field_end(r) < 0)
		return SPACED_EPROTO;
	int p1 = -1, p2 = -1;
	int e = split_parent(from, O_PATH, &p1, n1);
	if (e == 0)
		e = split_parent(to, O_PATH, &p2, n2);
	if (e == 0 && renameat(p1, n1, p2, n2) < 0)
		e = -errno;
	if (p1 >= 0)
		close(p1);
	if (p2 >= 0)
		close(p2);
	if (e < 0)
		reply_errno(c, id, "move", -e);
	else
		reply_result(c, id, 0, "", NULL);
	return 0;
}

/* ---- remove ---- */

static int rm_tree(int dfd, const char *name, int level)
{
	if (level > 256)
		return -ELOOP;
	int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	DIR *d = fdopendir(fd);
	if (d == NULL) {
		int e = errno;
		close(fd);
		return -e;
	}
	struct dirent *de;
	int e = 0;
	while (e == 0 && (de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		struct stat st;
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			e = -errno;
			break;
		}
		if (S_ISDIR(st.st_mode))
			e = rm_tree(dirfd(d), de->d_name, level + 1);
		else if (unlinkat(dirfd(d), de->d_name, 0) < 0)
			e = -errno;
	}
	closedir(d);
	if (e == 0 && unlinkat(dfd, name, AT_REMOVEDIR) < 0)
		e = -errno;
	return e;
}

int fs_remove(struct conn *c, uint32_t id, struct spaced_field_reader *r)
{
	char path[SPACED_GUEST_PATH_MAX];
	char name[NAME_MAX + 1];
	uint64_t recursive = 0;
	(void)spaced_field_get_strbuf(r, path, sizeof path);
	(void)spaced_field_get_u64(r, &recursive);
	if (spaced_field_end(r) < 0)
		return SPACED_EPROTO;
	if (is_root_path(path)) {
		reply_result(c, id, SPACED_EPERM, "the root cannot be removed", NULL);
		return 0;
	}
	int pfd = -1;
	int e = split_parent(path, O_PATH, &pfd, name);
	if (e == 0) {
		struct stat st;
		if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			e = -errno;
		else if (!S_ISDIR(st.st_mode))
			e = unlinkat(pfd, name, 0) < 0 ? -errno : 0;
		else if (recursive)
			e = rm_tree(pfd, name, 0);
		else
			e = unlinkat(pfd, name, AT_REMOVEDIR) < 0 ? -errno : 0;
		close(pfd);
	}
	if (e < 0)
		reply_errno(c, id, "remove", -e);
	else
		reply_result(c, id, 0, "", NULL);
	return 0;
}
