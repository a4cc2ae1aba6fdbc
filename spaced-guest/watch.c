/* watch.c — recursive directory watches of spaced-guest (inotify).
 *
 * A watch stream owns one inotify instance with one watch per directory under
 * the watched path. New subdirectories get watches as they appear (and their
 * existing entries are reported as created, since they may predate the
 * watch); directories moved within the tree keep their watches under the new
 * name; directories moved out lose theirs. Events carry paths relative to the
 * watched directory. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "spaced_error.h"
#include "guest.h"

#define WATCH_MASK                                                                          \
	(IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | \
	 IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)

/* How long a MOVED_FROM at the end of a read waits for its MOVED_TO. */
#define MOVE_PAIR_WAIT_MS 20

struct wdent {
	int wd;
	char *rel; /* "" for the watched directory itself */
};

struct watch {
	int ifd;
	struct stream *s;
	char base[SPACED_GUEST_PATH_MAX]; /* the watched path as requested */
	struct wdent *ents;
	size_t n, cap;
};

int watch_fd(const struct watch *w)
{
	return w->ifd;
}

void watch_free(struct watch *w)
{
	if (w == NULL)
		return;
	if (w->ifd >= 0)
		close(w->ifd);
	for (size_t i = 0; i < w->n; i++)
		free(w->ents[i].rel);
	free(w->ents);
	free(w);
}

static void emit(struct watch *w, uint32_t kind, const char *path, const char *path2)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 3 * SPACED_GUEST_PATH_MAX);
	if (spaced_field_put_u64(&b, kind) == 0 && spaced_field_put_str(&b, path) == 0 &&
	    spaced_field_put_str(&b, path2) == 0)
		(void)conn_queue_frame(w->s->conn, SPACED_GUEST_OUT_EVENT, 0, w->s->id, b.data, b.len);
	spaced_buf_free(&b);
}

static struct wdent *find_wd(struct watch *w, int wd)
{
	for (size_t i = 0; i < w->n; i++)
		if (w->ents[i].wd == wd)
			return &w->ents[i];
	return NULL;
}

static void join(char *out, size_t outsz, const char *a, const char *b)
{
	int n = snprintf(out, outsz, "%s%s%s", a, a[0] && b[0] ? "/" : "", b);
	if (n < 0 || (size_t)n >= outsz)
		out[0] = 0; /* too long: reported as the watch root rather than cut */
}

/* Adds a watch for base/rel (opened through the root, never following a
 * final symlink), then recurses into its subdirectories. When report is set,
 * entries found are sent as CREATE events. */
static int add_tree(struct watch *w, const char *rel, bool report, int level)
{
	char full[SPACED_GUEST_PATH_MAX];
	join(full, sizeof full, w->base, rel);
	if (level > GUEST_LIST_DEPTH_MAX || w->n >= GUEST_WATCH_MAX)
		return -ENOSPC;
	int dfd = -1;
	int e = fs_resolve(full, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, 0, &dfd);
	if (e < 0)
		return e;
	char proc[64];
	snprintf(proc, sizeof proc, "/proc/self/fd/%d", dfd);
	int wd = inotify_add_watch(w->ifd, proc, WATCH_MASK & ~IN_DONT_FOLLOW);
	if (wd < 0) {
		/* No /proc: fall back to the path under the root directory. */
		char host[2 * SPACED_GUEST_PATH_MAX];
		snprintf(host, sizeof host, "%s/%s", G.root, full);
		wd = inotify_add_watch(w->ifd, host, WATCH_MASK);
	}
	if (wd < 0) {
		e = -errno;
		close(dfd);
		return e;
	}
	struct wdent *ex = find_wd(w, wd);
	if (ex == NULL) {
		if (w->n == w->cap) {
			size_t nc = w->cap ? w->cap * 2 : 8;
			struct wdent *ne = realloc(w->ents, nc * sizeof *ne);
			if (ne == NULL) {
				close(dfd);
				return -ENOMEM;
			}
			w->ents = ne;
			w->cap = nc;
		}
		ex = &w->ents[w->n++];
		ex->wd = wd;
		ex->rel = NULL;
	}
	free(ex->rel);
	ex->rel = strdup(rel);
	if (ex->rel == NULL) {
		close(dfd);
		return -ENOMEM;
	}
	DIR *d = fdopendir(dfd);
	if (d == NULL) {
		close(dfd);
		return 0;
	}
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		char sub[SPACED_GUEST_PATH_MAX];
		join(sub, sizeof sub, rel, de->d_name);
		if (report)
			emit(w, SPACED_GUEST_EV_CREATE, sub, "");
		struct stat st;
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
			(void)add_tree(w, sub, report, level + 1);
	}
	closedir(d);
	return 0;
}

/* Drops the watches of rel and everything below it. */
static void drop_tree(struct watch *w, const char *rel)
{
	size_t rl = strlen(rel);
	for (size_t i = 0; i < w->n;) {
		const char *r = w->ents[i].rel;
		if (strncmp(r, rel, rl) == 0 && (r[rl] == 0 || r[rl] == '/')) {
			(void)inotify_rm_watch(w->ifd, w->ents[i].wd);
			free(w->ents[i].rel);
			w->ents[i] = w->ents[--w->n];
		} else {
			i++;
		}
	}
}

/* Renames the watch paths under from to live under to. */
static void rename_tree(struct watch *w, const char *from, const char *to)
{
	size_t fl = strlen(from);
	for (size_t i = 0; i < w->n; i++) {
		const char *r = w->ents[i].rel;
		if (strncmp(r, from, fl) == 0 && (r[fl] == 0 || r[fl] == '/')) {
			char nr[SPACED_GUEST_PATH_MAX];
			snprintf(nr, sizeof nr, "%s%s", to, r + fl);
			char *d = strdup(nr);
			if (d != NULL) {
				free(w->ents[i].rel);
				w->ents[i].rel = d;
			}
		}
	}
}

int watch_start(struct conn *c, uint32_t id, struct spaced_field_reader *r)
{
	char path[SPACED_GUEST_PATH_MAX];
	(void)spaced_field_get_strbuf(r, path, sizeof path);
	if (spaced_field_end(r) < 0)
		return SPACED_EPROTO;
	struct watch *w = calloc(1, sizeof *w);
	struct stream *s = w ? stream_new(c, id, ST_WATCH) : NULL;
	if (s == NULL) {
		free(w);
		reply_result(c, id, SPACED_ENOMEM, NULL, NULL);
		return 0;
	}
	s->watch = w;
	w->s = s;
	snprintf(w->base, sizeof w->base, "%s", path);
	w->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (w->ifd < 0) {
		stream_finish(s, SPACED_ESYS, "inotify unavailable", NULL);
		return 0;
	}
	int e = add_tree(w, "", false, 0);
	if (e < 0) {
		char msg[160];
		snprintf(msg, sizeof msg, "watch: %s", strerror(-e));
		stream_finish(s, errno_to_spaced(-e), msg, NULL);
		return 0;
	}
	/* STARTED (0, 0): the watches are in place. */
	struct spaced_buf x;
	spaced_buf_init(&x, 32);
	(void)spaced_field_put_u64(&x, 0);
	(void)spaced_field_put_u64(&x, 0);
	(void)conn_queue_frame(c, SPACED_GUEST_OUT_STARTED, 0, id, x.data, x.len);
	spaced_buf_free(&x);
	return 0;
}

void watch_on_readable(struct watch *w)
{
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
	char pend[SPACED_GUEST_PATH_MAX] = "";
	char last_modify[SPACED_GUEST_PATH_MAX] = "";
	uint32_t pend_cookie = 0;
	bool pend_dir = false, have_pend = false;
	ssize_t k = read(w->ifd, buf, sizeof buf);
	if (k <= 0)
		return;
next_batch:
	for (char *p = buf; p < buf + k;) {
		struct inotify_event *ev = (struct inotify_event *)(void *)p;
		p += sizeof *ev + ev->len;
		if (ev->mask & IN_Q_OVERFLOW) {
			emit(w, SPACED_GUEST_EV_OVERFLOW, "", "");
			continue;
		}
		struct wdent *we = find_wd(w, ev->wd);
		if (we == NULL)
			continue;
		if (ev->mask & IN_IGNORED) {
			if (we->rel[0] == 0) {
				stream_finish(w->s, 0, "watched directory is gone", NULL);
				return;
			}
			/* the kernel dropped this watch: forget its entry */
			free(we->rel);
			*we = w->ents[--w->n];
			continue;
		}
		if (ev->mask & IN_DELETE_SELF)
			continue;
		char path[SPACED_GUEST_PATH_MAX];
		join(path, sizeof path, we->rel, ev->len ? ev->name : "");
		bool isdir = (ev->mask & IN_ISDIR) != 0;
		if (!(ev->mask & IN_MODIFY))
			last_modify[0] = 0;
		if (have_pend && !((ev->mask & IN_MOVED_TO) && ev->cookie == pend_cookie)) {
			emit(w, SPACED_GUEST_EV_MOVE, pend, "");
			if (pend_dir)
				drop_tree(w, pend);
			have_pend = false;
		}
		if (ev->mask & IN_CREATE) {
			emit(w, SPACED_GUEST_EV_CREATE, path, "");
			if (isdir)
				(void)add_tree(w, path, true, 1);
		} else if (ev->mask & IN_MODIFY) {
			/* a burst of writes to one file is one event per read */
			if (strcmp(last_modify, path) != 0) {
				emit(w, SPACED_GUEST_EV_MODIFY, path, "");
				snprintf(last_modify, sizeof last_modify, "%s", path);
			}
			continue;
		} else if (ev->mask & IN_DELETE) {
			emit(w, SPACED_GUEST_EV_DELETE, path, "");
			if (isdir)
				drop_tree(w, path);
		} else if (ev->mask & IN_MOVED_FROM) {
			snprintf(pend, sizeof pend, "%s", path);
			pend_cookie = ev->cookie;
			pend_dir = isdir;
			have_pend = true;
		} else if (ev->mask & IN_MOVED_TO) {
			if (have_pend) {
				emit(w, SPACED_GUEST_EV_MOVE, pend, path);
				if (isdir)
					rename_tree(w, pend, path);
				have_pend = false;
			} else {
				emit(w, SPACED_GUEST_EV_MOVE, "", path);
				if (isdir)
					(void)add_tree(w, path, false, 1);
			}
		}
	}
	if (have_pend) {
		/* The two halves of a rename can arrive in different reads: give the
		 * MOVED_TO a moment before calling this a move out of the tree. */
		struct pollfd pf = {.fd = w->ifd, .events = POLLIN};
		if (poll(&pf, 1, MOVE_PAIR_WAIT_MS) > 0 && (k = read(w->ifd, buf, sizeof buf)) > 0) {
			last_modify[0] = 0;
			goto next_batch;
		}
		emit(w, SPACED_GUEST_EV_MOVE, pend, "");
		if (pend_dir)
			drop_tree(w, pend);
	}
}
