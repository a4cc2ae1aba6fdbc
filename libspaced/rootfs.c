/*
 * rootfs.c — root filesystem trees: archives in, a canonical archive out,
 * safe extraction (rootfs.h).
 */
#include "rootfs.h"

#include <archive.h>
#include <archive_entry.h>
#include <sodium.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "spaced_error.h"
#include "frame.h"
#include "nameidx.h"
#include "pace.h"
#include "util.h"

#define NAME_MAX_ 255
#define READ_BLOCK (64 * 1024)

/* A run of a file's content in the spool. */
struct extent {
	uint64_t off, len, spool;
};

struct node {
	char *name;
	char type; /* 'd' 'f' 'l' 'p' */
	uint32_t mode, uid, gid; /* ids as inside (0 … 65535) */
	int64_t mtime;
	uint64_t size;
	char *link;
	struct extent *ext;
	size_t next, capext;
	struct node **kids; /* in the order they came; sorted by name (strcmp) when written */
	size_t nkids, capkids;
	bool unsorted;
	struct spaced_nameidx idx; /* of kids, from KIDS_INDEXED of them on (else empty) */
	int hidden_below; /* the last layer whose opaque marker hid the children below it */
	int layer; /* the layer that made it */
};

struct spaced_rootfs {
	struct spaced_rootfs_limits lim;
	char spool_dir[4096];
	int spool;
	uint64_t spooled, entries_read;
	uint64_t skipped; /* content entries carried that the tree did not take */
	bool took_content; /* the entry being added read its content */
	int layer;
	struct node *root;
	uint64_t dropped, cleared;
	unsigned char name_key[crypto_shorthash_KEYBYTES]; /* of the directories' indexes */
};

static int failf(char *why, size_t whysz, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int failf(char *why, size_t whysz, int code, const char *fmt, ...)
{
	if (why && whysz) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(why, whysz, fmt, ap);
		va_end(ap);
	}
	return code;
}

void spaced_rootfs_limits_default(struct spaced_rootfs_limits *l)
{
	l->max_bytes = UINT64_C(8) << 30;
	l->max_entries = 2000000;
}

/* ---- the tree ---- */

static void node_free(struct node *n)
{
	if (!n)
		return;
	for (size_t i = 0; i < n->nkids; i++)
		node_free(n->kids[i]);
	free(n->kids);
	spaced_nameidx_free(&n->idx);
	free(n->name);
	free(n->link);
	free(n->ext);
	free(n);
}

static struct node *node_new(const char *name, char type, int layer)
{
	struct node *n = calloc(1, sizeof *n);
	if (!n || !(n->name = strdup(name))) {
		free(n);
		return NULL;
	}
	n->type = type;
	n->mode = type == 'd' ? 0755 : 0644;
	n->layer = layer;
	return n;
}

/* ---- a directory's children ----
 *
 * A directory's children are kept in the order they came, indexed by name
 * (nameidx.h, SipHash under a key random per tree, so no archive can choose
 * names that collide) once they are many, and sorted by name once, before
 * the tree is written: an archive lists a directory's names in any order (a
 * tenant's in the worst one), and keeping them sorted on each insert moved
 * every entry after it. */

/* Children from which a directory indexes them. */
#define KIDS_INDEXED 32

/* Entries one directory holds at most. */
#define DIR_ENTRIES_MAX 100000

static const char *kid_name(const void *ctx, uint32_t pos)
{
	return ((const struct node *)ctx)->kids[pos]->name;
}

/* Indexes d's children anew (none below KIDS_INDEXED). */
static int kids_reindex(const struct spaced_rootfs *t, struct node *d)
{
	spaced_nameidx_free(&d->idx);
	if (d->nkids < KIDS_INDEXED)
		return 0;
	spaced_nameidx_init_keyed(&d->idx, kid_name, d, t->name_key);
	return spaced_nameidx_reserve(&d->idx, d->nkids, d->nkids);
}

/* Index of name among d's children (*found), or d->nkids. */
static size_t kid_find(const struct node *d, const char *name, bool *found)
{
	if (d->idx.nslots) {
		int64_t at = spaced_nameidx_get(&d->idx, name);
		*found = at >= 0;
		return at >= 0 ? (size_t)at : d->nkids;
	}
	for (size_t i = 0; i < d->nkids; i++)
		if (strcmp(d->kids[i]->name, name) == 0) {
			*found = true;
			return i;
		}
	*found = false;
	return d->nkids;
}

/* Adds k (a name d does not hold) to d's children. */
static int kid_insert(const struct spaced_rootfs *t, struct node *d, struct node *k)
{
	if (d->nkids >= DIR_ENTRIES_MAX)
		return SPACED_ETOOBIG;
	if (d->nkids == d->capkids) {
		size_t nc = d->capkids ? d->capkids * 2 : 8;
		struct node **nk = realloc(d->kids, nc * sizeof *nk);
		if (!nk)
			return SPACED_ENOMEM;
		d->kids = nk;
		d->capkids = nc;
	}
	if (d->nkids && strcmp(d->kids[d->nkids - 1]->name, k->name) > 0)
		d->unsorted = true;
	d->kids[d->nkids++] = k;
	int r = 0;
	if (d->nkids < KIDS_INDEXED)
		return 0;
	if (!d->idx.nslots)
		r = kids_reindex(t, d);
	else if ((r = spaced_nameidx_reserve(&d->idx, d->nkids, d->nkids - 1)) == 0)
		spaced_nameidx_put(&d->idx, k->name, (uint32_t)(d->nkids - 1));
	if (r < 0)
		d->nkids--;
	return r;
}

/* Removes and frees d's child at index at (the last one takes its place). */
static void kid_remove(struct node *d, size_t at)
{
	struct node *gone = d->kids[at];
	size_t last = d->nkids - 1;
	spaced_nameidx_del(&d->idx, gone->name);
	if (at != last) {
		d->kids[at] = d->kids[last];
		d->unsorted = true;
		spaced_nameidx_put(&d->idx, d->kids[at]->name, (uint32_t)at);
	}
	d->nkids--;
	node_free(gone);
}

/* Removes every child of d made by a layer below layer (once per layer: what
 * is left and what comes after are of this layer or above). */
static int kids_hide_lower(const struct spaced_rootfs *t, struct node *d, int layer)
{
	if (d->hidden_below == layer)
		return 0;
	d->hidden_below = layer;
	size_t w = 0;
	for (size_t i = 0; i < d->nkids; i++) {
		if (d->kids[i]->layer < layer)
			node_free(d->kids[i]);
		else
			d->kids[w++] = d->kids[i];
	}
	if (w == d->nkids)
		return 0;
	d->nkids = w;
	return kids_reindex(t, d);
}

static int kid_cmp(const void *a, const void *b)
{
	return strcmp((*(struct node *const *)a)->name, (*(struct node *const *)b)->name);
}

/* Sorts every directory's children by name (strcmp), as a tree is written. */
static int kids_sort(const struct spaced_rootfs *t, struct node *d)
{
	if (d->unsorted) {
		qsort(d->kids, d->nkids, sizeof *d->kids, kid_cmp);
		d->unsorted = false;
		int r = kids_reindex(t, d);
		if (r < 0)
			return r;
	}
	for (size_t i = 0; i < d->nkids; i++)
		if (d->kids[i]->type == 'd') {
			int r = kids_sort(t, d->kids[i]);
			if (r < 0)
				return r;
		}
	return 0;
}

/* Splits a path an archive gave into normalized parts in buf (NUL-separated,
 * *nparts of them, parts[] pointing into buf). "" or "." or "/" is the root
 * (0 parts). */
static int split_path(const char *in, char *buf, size_t bufsz, char **parts, size_t maxparts, size_t *nparts,
                      char *why, size_t whysz)
{
	size_t n = 0, len = strlen(in);
	if (len >= SPACED_TREEHASH_PATH || len >= bufsz)
		return failf(why, whysz, SPACED_ETOOBIG, "a path of %zu bytes is too long", len);
	memcpy(buf, in, len + 1);
	char *save = NULL;
	for (char *p = strtok_r(buf, "/", &save); p; p = strtok_r(NULL, "/", &save)) {
		if (strcmp(p, ".") == 0)
			continue;
		if (strcmp(p, "..") == 0)
			return failf(why, whysz, SPACED_EFORMAT, "the path %.200s has a '..' part", in);
		if (strlen(p) > NAME_MAX_)
			return failf(why, whysz, SPACED_ETOOBIG, "a name in %.200s is longer than 255 bytes", in);
		if (n == maxparts)
			return failf(why, whysz, SPACED_ETOOBIG, "the path %.200s is deeper than %d directories", in,
			             SPACED_TREEHASH_DEPTH);
		parts[n++] = p;
	}
	*nparts = n;
	return 0;
}

/* The directory that holds parts[0..n-1] (creating missing directories as
 * root's 0755). Refuses a path through a symlink or a non-directory. */
static int walk_parent(struct spaced_rootfs *t, char **parts, size_t n, struct node **out, char *why, size_t whysz)
{
	struct node *d = t->root;
	for (size_t i = 0; i + 1 < n; i++) {
		bool found;
		size_t at = kid_find(d, parts[i], &found);
		if (!found) {
			struct node *k = node_new(parts[i], 'd', t->layer);
			int r = k ? kid_insert(t, d, k) : SPACED_ENOMEM;
			if (r < 0) {
				node_free(k);
				return r == SPACED_ETOOBIG ? failf(why, whysz, r, "a directory holds more than %d entries",
				                                   DIR_ENTRIES_MAX)
				                           : r;
			}
			d = k;
			continue;
		}
		struct node *k = d->kids[at];
		if (k->type != 'd')
			return failf(why, whysz, SPACED_EFORMAT, "%s of the path of an entry is a %s, not a directory",
			             parts[i], k->type == 'l' ? "symlink" : "file");
		d = k;
	}
	*out = d;
	return 0;
}

/* The node at parts[0..n) or NULL. */
static struct node *lookup(struct spaced_rootfs *t, char **parts, size_t n)
{
	struct node *d = t->root;
	for (size_t i = 0; i < n; i++) {
		bool found;
		if (d->type != 'd')
			return NULL;
		size_t at = kid_find(d, parts[i], &found);
		if (!found)
			return NULL;
		d = d->kids[at];
	}
	return d;
}

static int spool_put(struct spaced_rootfs *t, struct node *f, uint64_t off, const void *p, size_t n, char *why,
                     size_t whysz)
{
	if (n == 0)
		return 0;
	if (t->spooled + n > t->lim.max_bytes || t->spooled + n < t->spooled)
		return failf(why, whysz, SPACED_ETOOBIG, "more than %llu bytes of file content",
		             (unsigned long long)t->lim.max_bytes);
	if (off > f->size || n > f->size - off)
		return failf(why, whysz, SPACED_EFORMAT, "content of %s beyond its size", f->name);
	if (f->next && f->ext[f->next - 1].off + f->ext[f->next - 1].len > off)
		return failf(why, whysz, SPACED_EFORMAT, "content of %s out of order", f->name);
	if (spaced_io_write_full(t->spool, p, n) < 0)
		return failf(why, whysz, SPACED_EIO, "spool: %s", strerror(errno));
	struct extent *last = f->next ? &f->ext[f->next - 1] : NULL;
	if (last && last->off + last->len == off && last->spool + last->len == t->spooled) {
		last->len += n;
	} else {
		if (f->next == f->capext) {
			size_t nc = f->capext ? f->capext * 2 : 2;
			struct extent *ne = realloc(f->ext, nc * sizeof *ne);
			if (!ne)
				return SPACED_ENOMEM;
			f->ext = ne;
			f->capext = nc;
		}
		f->ext[f->next++] = (struct extent){off, n, t->spooled};
	}
	t->spooled += n;
	return 0;
}

/* Reads the uid/gid of an entry into inside ids for kind. */
static int entry_ids(enum spaced_rootfs_kind kind, struct archive_entry *e, uint32_t *uid, uint32_t *gid,
                     const char *path, char *why, size_t whysz)
{
	int64_t ids[2] = {archive_entry_uid(e), archive_entry_gid(e)};
	uint32_t out[2];
	for (int i = 0; i < 2; i++) {
		int64_t v = ids[i];
		if (kind == SPACED_ROOTFS_TEMPLATE || kind == SPACED_ROOTFS_UPPER) {
			if (kind == SPACED_ROOTFS_UPPER && v == 0)
				v = SPACED_ROOTFS_CANON_UID; /* host root: directories the launcher made */
			if (v < SPACED_ROOTFS_CANON_UID || v >= (int64_t)(SPACED_ROOTFS_CANON_UID + SPACED_ROOTFS_IDS))
				return failf(why, whysz, SPACED_EFORMAT, "%.200s has owner %lld outside the canonical range",
				             path, (long long)ids[i]);
			out[i] = (uint32_t)(v - SPACED_ROOTFS_CANON_UID);
		} else {
			if (v < 0 || v >= (int64_t)SPACED_ROOTFS_IDS)
				return failf(why, whysz, SPACED_EFORMAT, "%.200s has owner %lld (ids above 65535 are refused)",
				             path, (long long)v);
			out[i] = (uint32_t)v;
		}
	}
	*uid = out[0];
	*gid = out[1];
	return 0;
}

/* For UPPER: the entry's path relative to the root, or NULL for entries
 * outside upper/root/ (the archive's meta, upper/ itself). Also says
 * whether the path is one the merge leaves out. */
static const char *upper_rel(const char *path, bool *skip)
{
	static const char *const not_taken[] = {"dev", "proc", ".spaced"};
	/* per execution: its name, and its resolver (written by the worker when it has egress) */
	static const char *const files_not_taken[] = {"etc/hostname", "etc/hosts", "etc/resolv.conf"};
	const char *p = path;
	while (p[0] == '.' && p[1] == '/')
		p += 2;
	*skip = false;
	if (strncmp(p, "upper/root", 10) != 0 || (p[10] != 0 && p[10] != '/'))
		return NULL;
	p += 10;
	while (*p == '/')
		p++;
	for (size_t i = 0; i < sizeof not_taken / sizeof not_taken[0]; i++) {
		size_t l = strlen(not_taken[i]);
		if (strncmp(p, not_taken[i], l) == 0 && (p[l] == 0 || p[l] == '/'))
			*skip = true;
	}
	for (size_t i = 0; i < sizeof files_not_taken / sizeof files_not_taken[0]; i++)
		if (strcmp(p, files_not_taken[i]) == 0)
			*skip = true;
	return p;
}

static bool xattr_set(struct archive_entry *e, const char *name, const char *want)
{
	const char *n;
	const void *v;
	size_t sz;
	archive_entry_xattr_reset(e);
	while (archive_entry_xattr_next(e, &n, &v, &sz) == ARCHIVE_OK)
		if (strcmp(n, name) == 0 && sz == strlen(want) && memcmp(v, want, sz) == 0)
			return true;
	return false;
}

static bool xattr_has_prefix(struct archive_entry *e, const char *prefix)
{
	const char *n;
	const void *v;
	size_t sz;
	archive_entry_xattr_reset(e);
	while (archive_entry_xattr_next(e, &n, &v, &sz) == ARCHIVE_OK)
		if (strncmp(n, prefix, strlen(prefix)) == 0)
			return true;
	return false;
}

/* One entry of a layer. */
static int add_entry_one(struct spaced_rootfs *t, struct archive *a, struct archive_entry *e,
                         enum spaced_rootfs_kind kind, char *why, size_t whysz)
{
	char buf[SPACED_TREEHASH_PATH + 1];
	char *parts[SPACED_TREEHASH_DEPTH + 1];
	size_t n;
	const char *path = archive_entry_pathname(e);
	int r;
	if (!path)
		return failf(why, whysz, SPACED_EFORMAT, "an entry without a name");
	if (++t->entries_read > t->lim.max_entries)
		return failf(why, whysz, SPACED_ETOOBIG, "more than %llu entries", (unsigned long long)t->lim.max_entries);
	if (kind == SPACED_ROOTFS_UPPER) {
		bool skip;
		const char *rel = upper_rel(path, &skip);
		if (!rel || skip)
			return 0;
		path = rel;
	}
	if ((r = split_path(path, buf, sizeof buf, parts, SPACED_TREEHASH_DEPTH, &n, why, whysz)) < 0)
		return r;
	mode_t ft = archive_entry_filetype(e);
	const char *hl = archive_entry_hardlink(e);
	uint32_t uid = 0, gid = 0;
	if ((r = entry_ids(kind, e, &uid, &gid, path, why, whysz)) < 0)
		return r;
	uint32_t mode = (uint32_t)archive_entry_perm(e) & 07777;
	if (kind == SPACED_ROOTFS_UPPER &&
	    (xattr_has_prefix(e, "trusted.overlay.redirect") || xattr_has_prefix(e, "trusted.overlay.metacopy")))
		return failf(why, whysz, SPACED_EFORMAT, "%.200s: overlay redirects and metacopy are not supported", path);

	if (n == 0) { /* the root itself: attributes only */
		if (ft != AE_IFDIR)
			return failf(why, whysz, SPACED_EFORMAT, "the root of the archive is not a directory");
		t->root->mode = mode;
		t->root->uid = uid;
		t->root->gid = gid;
		t->root->mtime = archive_entry_mtime(e);
		if (kind == SPACED_ROOTFS_UPPER && xattr_set(e, "trusted.overlay.opaque", "y"))
			return kids_hide_lower(t, t->root, t->layer);
		return 0;
	}
	struct node *d = NULL;
	if ((r = walk_parent(t, parts, n, &d, why, whysz)) < 0)
		return r;
	const char *name = parts[n - 1];
	bool found;
	size_t at;

	/* whiteouts: they remove what lower layers made, and are not entries */
	if (kind == SPACED_ROOTFS_OCI_LAYER && strncmp(name, ".wh.", 4) == 0) {
		if (strcmp(name, ".wh..wh..opq") == 0)
			return kids_hide_lower(t, d, t->layer);
		at = kid_find(d, name + 4, &found);
		if (found && d->kids[at]->layer < t->layer)
			kid_remove(d, at);
		return 0;
	}
	if (kind == SPACED_ROOTFS_UPPER && ft == AE_IFCHR && archive_entry_rdev(e) == 0) {
		at = kid_find(d, name, &found);
		if (found && d->kids[at]->layer < t->layer)
			kid_remove(d, at);
		return 0;
	}

	char type;
	struct node *src = NULL;
	struct extent *link_ext = NULL; /* a hard link's: the content of the file it names */
	size_t link_next = 0;
	uint64_t link_size = 0;
	if (hl) {
		char hbuf[SPACED_TREEHASH_PATH + 1];
		char *hparts[SPACED_TREEHASH_DEPTH + 1];
		size_t hn;
		const char *hpath = hl;
		if (kind == SPACED_ROOTFS_UPPER) {
			bool skip;
			hpath = upper_rel(hl, &skip);
			if (!hpath || skip)
				return failf(why, whysz, SPACED_EFORMAT, "hard link %.200s to %.200s outside the tree", path, hl);
		}
		if ((r = split_path(hpath, hbuf, sizeof hbuf, hparts, SPACED_TREEHASH_DEPTH, &hn, why, whysz)) < 0)
			return r;
		src = lookup(t, hparts, hn);
		if (!src || src->type != 'f')
			return failf(why, whysz, SPACED_EFORMAT, "hard link %.200s names %.200s, which is no file of the tree",
			             path, hl);
		/* its content is taken now: the entry it replaces below may be that
		 * file itself, or a directory holding it */
		link_size = src->size;
		if (src->next) {
			if (!(link_ext = malloc(src->next * sizeof *link_ext)))
				return SPACED_ENOMEM;
			memcpy(link_ext, src->ext, src->next * sizeof *link_ext);
			link_next = src->next;
		}
		type = 'f';
	} else {
		switch (ft) {
		case AE_IFDIR: type = 'd'; break;
		case AE_IFREG: type = 'f'; break;
		case AE_IFLNK: type = 'l'; break;
		case AE_IFIFO: type = 'p'; break;
		case AE_IFCHR:
		case AE_IFBLK:
		case AE_IFSOCK:
			/* device nodes and sockets have no place in a template: an
			 * execution's /dev is its own */
			t->dropped++;
			return 0;
		default:
			return failf(why, whysz, SPACED_EFORMAT, "%.200s has an unknown type", path);
		}
	}
	if (type == 'f' && (mode & 06000)) {
		mode &= ~(uint32_t)06000;
		t->cleared++;
	}
	at = kid_find(d, name, &found);
	struct node *k;
	if (found && type == 'd' && d->kids[at]->type == 'd') {
		k = d->kids[at]; /* a directory again: new attributes, same entries */
	} else {
		if (found)
			kid_remove(d, at);
		if (!(k = node_new(name, type, t->layer))) {
			free(link_ext);
			return SPACED_ENOMEM;
		}
		if ((r = kid_insert(t, d, k)) < 0) {
			node_free(k);
			free(link_ext);
			return r == SPACED_ETOOBIG
			               ? failf(why, whysz, r, "a directory holds more than %d entries", DIR_ENTRIES_MAX)
			               : r;
		}
	}
	k->layer = t->layer;
	k->mode = mode;
	k->uid = uid;
	k->gid = gid;
	k->mtime = archive_entry_mtime(e);
	if (type == 'd' && kind == SPACED_ROOTFS_UPPER && xattr_set(e, "trusted.overlay.opaque", "y") &&
	    (r = kids_hide_lower(t, k, t->layer)) < 0)
		return r;
	if (type == 'l') {
		const char *target = archive_entry_symlink(e);
		k->mode = 0777; /* as every symlink on Linux */
		if (!target || strlen(target) >= SPACED_TREEHASH_PATH)
			return failf(why, whysz, SPACED_EFORMAT, "symlink %.200s has no or too long a target", path);
		if (!(k->link = strdup(target)))
			return SPACED_ENOMEM;
		k->size = strlen(target);
		return 0;
	}
	if (type != 'f')
		return 0;
	if (hl) { /* a hard link: a copy of the file it names */
		k->size = link_size;
		k->ext = link_ext;
		k->next = k->capext = link_next;
		return 0;
	}
	int64_t size = archive_entry_size(e);
	if (size < 0 || (uint64_t)size > t->lim.max_bytes)
		return failf(why, whysz, SPACED_ETOOBIG, "%.200s claims %lld bytes", path, (long long)size);
	k->size = (uint64_t)size;
	t->took_content = true;
	for (;;) {
		const void *p;
		size_t len;
		int64_t off;
		int ar = archive_read_data_block(a, &p, &len, &off);
		if (ar == ARCHIVE_EOF)
			break;
		if (ar != ARCHIVE_OK && ar != ARCHIVE_WARN)
			return failf(why, whysz, SPACED_EFORMAT, "reading %.200s: %s", path, archive_error_string(a));
		if (off < 0)
			return failf(why, whysz, SPACED_EFORMAT, "%.200s: content at a negative offset", path);
		if ((r = spool_put(t, k, (uint64_t)off, p, len, why, whysz)) < 0)
			return r;
	}
	return 0;
}

/* One entry. The content an entry declares and the tree does not take (a
 * whiteout's, a hard link's, a dropped node's, a directory's or a link's
 * "data") is decompressed all the same when the next header is read: it is
 * counted in the bound of content read before that, so a few bytes of
 * compressed archive cannot make an import read without end. */
static int add_entry(struct spaced_rootfs *t, struct archive *a, struct archive_entry *e,
                     enum spaced_rootfs_kind kind, char *why, size_t whysz)
{
	int64_t declared = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
	t->took_content = false;
	int r = add_entry_one(t, a, e, kind, why, whysz);
	if (r < 0 || t->took_content || declared <= 0)
		return r;
	t->skipped += (uint64_t)declared;
	if ((uint64_t)declared > t->lim.max_bytes || t->skipped > t->lim.max_bytes ||
	    t->spooled + t->skipped > t->lim.max_bytes) {
		const char *path = archive_entry_pathname(e);
		return failf(why, whysz, SPACED_ETOOBIG, "%.200s carries %lld bytes the tree does not take: past %llu bytes of content",
		             path ? path : "an entry", (long long)declared, (unsigned long long)t->lim.max_bytes);
	}
	return 0;
}

int spaced_rootfs_new(const struct spaced_rootfs_limits *lim, const char *spool_dir, struct spaced_rootfs **out,
                      char *why, size_t whysz)
{
	struct spaced_rootfs *t = calloc(1, sizeof *t);
	if (!t)
		return SPACED_ENOMEM;
	if (lim)
		t->lim = *lim;
	else
		spaced_rootfs_limits_default(&t->lim);
	snprintf(t->spool_dir, sizeof t->spool_dir, "%s", spool_dir ? spool_dir : "/tmp");
	t->spool = open(t->spool_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (t->spool < 0) {
		int r = failf(why, whysz, SPACED_ESYS, "spool in %s: %s", t->spool_dir, strerror(errno));
		free(t);
		return r;
	}
	randombytes_buf(t->name_key, sizeof t->name_key);
	if (!(t->root = node_new(".", 'd', 0))) {
		close(t->spool);
		free(t);
		return SPACED_ENOMEM;
	}
	*out = t;
	return 0;
}

void spaced_rootfs_free(struct spaced_rootfs *t)
{
	if (!t)
		return;
	node_free(t->root);
	if (t->spool >= 0)
		close(t->spool);
	free(t);
}

const char *spaced_rootfs_spool_dir(const struct spaced_rootfs *t)
{
	return t->spool_dir;
}

const struct spaced_rootfs_limits *spaced_rootfs_limits_of(const struct spaced_rootfs *t)
{
	return &t->lim;
}

static struct archive *reader_open(const char *path, char *why, size_t whysz)
{
	struct archive *a = archive_read_new();
	if (!a)
		return NULL;
	archive_read_support_format_tar(a);
	archive_read_support_format_gnutar(a);
	archive_read_support_filter_gzip(a);
	archive_read_support_filter_xz(a);
	archive_read_support_filter_zstd(a);
	archive_read_support_filter_bzip2(a);
	archive_read_support_filter_none(a);
	if (archive_read_open_filename(a, path, READ_BLOCK) != ARCHIVE_OK) {
		failf(why, whysz, 0, "not an archive: %s", archive_error_string(a));
		(void)path;
		archive_read_free(a);
		return NULL;
	}
	return a;
}

int spaced_rootfs_add_archive(struct spaced_rootfs *t, const char *path, enum spaced_rootfs_kind kind, char *why,
                              size_t whysz)
{
	struct archive *a = reader_open(path, why, whysz);
	struct archive_entry *e;
	int r = 0, ar;
	if (!a)
		return SPACED_EFORMAT;
	t->layer++;
	while ((ar = archive_read_next_header(a, &e)) == ARCHIVE_OK || ar == ARCHIVE_WARN) {
		if ((r = add_entry(t, a, e, kind, why, whysz)) < 0)
			goto out;
	}
	if (ar != ARCHIVE_EOF)
		r = failf(why, whysz, SPACED_EFORMAT, "%s", archive_error_string(a) ? archive_error_string(a) : "not an archive");
out:
	archive_read_free(a);
	return r;
}

int spaced_rootfs_import(struct spaced_rootfs *t, const char *path, json_t **config, const char **format, char *why,
                         size_t whysz)
{
	if (config)
		*config = NULL;
	if (spaced_rootfs_is_oci(path)) {
		*format = "oci";
		return spaced_rootfs_add_oci(t, path, config, why, whysz);
	}
	*format = "tarball";
	return spaced_rootfs_add_archive(t, path, SPACED_ROOTFS_TARBALL, why, whysz);
}

/* ---- the canonical archive ---- */

struct writer {
	struct spaced_rootfs *t;
	struct archive *a;
	struct archive_entry *e;
	struct spaced_treehash *h;
	struct spaced_rootfs_info info;
	char path[SPACED_TREEHASH_PATH + 2];
	uint8_t *buf;
	char *why;
	size_t whysz;
};

/* A file's sparse map: its data extents, or for a file of holes only one
 * empty extent at its end (without a map its size would be stored as
 * zeros). */
static void sparse_map(struct archive_entry *e, const struct extent *x, size_t n, uint64_t size)
{
	for (size_t i = 0; i < n; i++)
		archive_entry_sparse_add_entry(e, (la_int64_t)x[i].off, (la_int64_t)x[i].len);
	if (n == 0)
		archive_entry_sparse_add_entry(e, (la_int64_t)size, 0);
}

static int write_content(struct writer *w, const struct node *n)
{
	static const uint8_t zero[READ_BLOCK];
	uint64_t pos = 0;
	for (size_t i = 0; i < n->next; i++) {
		const struct extent *x = &n->ext[i];
		/* the pax writer skips what its sparse map calls holes: they
		 * cost nothing but the calls */
		while (pos < x->off) {
			size_t z = x->off - pos < sizeof zero ? (size_t)(x->off - pos) : sizeof zero;
			if (archive_write_data(w->a, zero, z) != (la_ssize_t)z)
				return failf(w->why, w->whysz, SPACED_EIO, "archive: %s", archive_error_string(w->a));
			pos += z;
		}
		uint64_t done = 0;
		while (done < x->len) {
			size_t want = x->len - done < READ_BLOCK ? (size_t)(x->len - done) : READ_BLOCK;
			ssize_t got = pread(w->t->spool, w->buf, want, (off_t)(x->spool + done));
			if (got != (ssize_t)want)
				return failf(w->why, w->whysz, SPACED_EIO, "spool read: %s", strerror(errno));
			if (archive_write_data(w->a, w->buf, want) != (la_ssize_t)want)
				return failf(w->why, w->whysz, SPACED_EIO, "archive: %s", archive_error_string(w->a));
			int r = spaced_treehash_data(w->h, x->off + done, w->buf, want);
			if (r < 0)
				return r;
			done += want;
		}
		pos = x->off + x->len;
	}
	while (pos < n->size) {
		size_t z = n->size - pos < sizeof zero ? (size_t)(n->size - pos) : sizeof zero;
		if (archive_write_data(w->a, zero, z) != (la_ssize_t)z)
			return failf(w->why, w->whysz, SPACED_EIO, "archive: %s", archive_error_string(w->a));
		pos += z;
	}
	return spaced_treehash_file_end(w->h);
}

static int write_node(struct writer *w, const struct node *n, size_t plen)
{
	const char *hpath = plen ? w->path : ".";
	uint32_t uid = n->uid + SPACED_ROOTFS_CANON_UID, gid = n->gid + SPACED_ROOTFS_CANON_UID;
	int r = spaced_treehash_entry(w->h, hpath, n->type, n->mode, uid, gid, n->size, 0, n->link);
	if (r < 0)
		return failf(w->why, w->whysz, r, "hash: %s", spaced_strerror(r));
	archive_entry_clear(w->e);
	if (plen == 0) {
		archive_entry_set_pathname(w->e, "./");
	} else if (n->type == 'd') {
		w->path[plen] = '/';
		w->path[plen + 1] = 0;
		archive_entry_set_pathname(w->e, w->path);
		w->path[plen] = 0;
	} else {
		archive_entry_set_pathname(w->e, w->path);
	}
	archive_entry_set_uid(w->e, uid);
	archive_entry_set_gid(w->e, gid);
	archive_entry_set_perm(w->e, n->mode);
	archive_entry_set_mtime(w->e, n->mtime, 0);
	switch (n->type) {
	case 'd': archive_entry_set_filetype(w->e, AE_IFDIR); break;
	case 'l':
		archive_entry_set_filetype(w->e, AE_IFLNK);
		archive_entry_set_symlink(w->e, n->link);
		break;
	case 'p': archive_entry_set_filetype(w->e, AE_IFIFO); break;
	default:
		archive_entry_set_filetype(w->e, AE_IFREG);
		archive_entry_set_size(w->e, (la_int64_t)n->size);
		uint64_t held = 0;
		for (size_t i = 0; i < n->next; i++)
			held += n->ext[i].len;
		if (held < n->size) /* holes: a sparse map, and only the data is stored */
			sparse_map(w->e, n->ext, n->next, n->size);
		break;
	}
	if (archive_write_header(w->a, w->e) != ARCHIVE_OK)
		return failf(w->why, w->whysz, SPACED_EIO, "archive: %s", archive_error_string(w->a));
	w->info.entries++;
	if (n->type == 'f') {
		/* what a worker extracts is held to the same bound as what was
		 * read (a hard link is a copy here) */
		if (n->size > w->t->lim.max_bytes - w->info.bytes)
			return failf(w->why, w->whysz, SPACED_ETOOBIG,
			             "the tree's files hold more than %llu bytes (each hard link is a copy)",
			             (unsigned long long)w->t->lim.max_bytes);
		w->info.bytes += n->size;
		if ((r = write_content(w, n)) < 0)
			return r;
	}
	if (n->type != 'd')
		return 0;
	for (size_t i = 0; i < n->nkids; i++) {
		const struct node *k = n->kids[i];
		size_t nl = strlen(k->name), sep = plen ? 1 : 0;
		if (plen + sep + nl >= SPACED_TREEHASH_PATH)
			return failf(w->why, w->whysz, SPACED_ETOOBIG, "a path is too long");
		if (sep)
			w->path[plen] = '/';
		memcpy(w->path + plen + sep, k->name, nl + 1);
		r = write_node(w, k, plen + sep + nl);
		w->path[plen] = 0;
		if (r < 0)
			return r;
	}
	return 0;
}

/* The bytes the tree's files hold, each hard link a copy, counted up to just
 * past cap. */
static uint64_t tree_bytes(const struct node *n, uint64_t cap)
{
	uint64_t sum = n->type == 'f' ? n->size : 0;
	for (size_t i = 0; i < n->nkids && sum <= cap; i++) {
		uint64_t k = tree_bytes(n->kids[i], cap);
		sum = k > cap - (sum < cap ? sum : cap) ? cap + 1 : sum + k;
	}
	return sum;
}

int spaced_rootfs_write(struct spaced_rootfs *t, const char *out, struct spaced_rootfs_info *info, char *why,
                        size_t whysz)
{
	struct writer w = {.t = t, .why = why, .whysz = whysz};
	int r = SPACED_ENOMEM, fd = -1;
	/* refused before anything is written: 10 MB of tarball holding 1000
	 * hard links of one file had the archive written up to the bound (8 GiB,
	 * a minute) before it was */
	if (tree_bytes(t->root, t->lim.max_bytes) > t->lim.max_bytes)
		return failf(why, whysz, SPACED_ETOOBIG, "the tree's files hold more than %llu bytes (each hard link is a copy)",
		             (unsigned long long)t->lim.max_bytes);
	if (!(w.buf = malloc(READ_BLOCK)) || !(w.e = archive_entry_new()) || !(w.a = archive_write_new()))
		goto out;
	if ((r = spaced_treehash_new(&w.h)) < 0)
		goto out;
	fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		r = failf(why, whysz, SPACED_ESYS, "%s: %s", out, strerror(errno));
		goto out;
	}
	/* names as their bytes are (a name that is not UTF-8 is a tenant's to make) */
	if (archive_write_set_format_pax_restricted(w.a) != ARCHIVE_OK ||
	    archive_write_set_format_option(w.a, "pax", "hdrcharset", "BINARY") != ARCHIVE_OK ||
	    archive_write_set_bytes_in_last_block(w.a, 1) != ARCHIVE_OK || archive_write_open_fd(w.a, fd) != ARCHIVE_OK) {
		r = failf(why, whysz, SPACED_EIO, "archive: %s", archive_error_string(w.a));
		goto out;
	}
	if ((r = kids_sort(t, t->root)) < 0 || (r = write_node(&w, t->root, 0)) < 0)
		goto out;
	if (archive_write_close(w.a) != ARCHIVE_OK) {
		r = failf(why, whysz, SPACED_EIO, "archive: %s", archive_error_string(w.a));
		goto out;
	}
	if (fsync(fd) < 0) {
		r = failf(why, whysz, SPACED_EIO, "fsync %s: %s", out, strerror(errno));
		goto out;
	}
	r = spaced_treehash_final(w.h, w.info.hash);
	w.h = NULL;
	if (r < 0)
		goto out;
	w.info.dropped = t->dropped;
	w.info.cleared = t->cleared;
	*info = w.info;
out:
	if (w.a)
		archive_write_free(w.a);
	if (fd >= 0)
		close(fd);
	archive_entry_free(w.e);
	spaced_treehash_free(w.h);
	free(w.buf);
	return r;
}

/* ---- extraction ---- */

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
	(void)sb;
	(void)f;
	if (flag == FTW_DP)
		return rmdir(p) < 0 && errno != ENOENT ? 0 : 0;
	return unlink(p) < 0 && errno != ENOENT ? 0 : 0;
}

static void rm_tree(const char *p)
{
	nftw(p, rm_cb, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

/* Compares two normalized relative paths in walk order: part by part,
 * bytewise, a path before the paths below it. */
static int walk_cmp(const char *a, const char *b)
{
	for (;;) {
		size_t la = strcspn(a, "/"), lb = strcspn(b, "/");
		int c = memcmp(a, b, la < lb ? la : lb);
		if (c != 0)
			return c;
		if (la != lb)
			return la < lb ? -1 : 1; /* a name before the longer names it begins */
		a += la;
		b += lb;
		if (*a == 0 || *b == 0)
			return (*a != 0) - (*b != 0); /* a directory before its entries */
		a++;
		b++;
	}
}

/* True when path is normalized: no leading "/" or "./", no empty, "." or
 * ".." parts, no trailing "/". */
static bool normalized(const char *p)
{
	if (!*p || *p == '/')
		return false;
	for (const char *s = p;;) {
		size_t l = strcspn(s, "/");
		if (l == 0 || l > NAME_MAX_ || (l == 1 && s[0] == '.') || (l == 2 && s[0] == '.' && s[1] == '.'))
			return false;
		s += l;
		if (*s == 0)
			return true;
		s++;
		if (*s == 0)
			return false;
	}
}

/* A snapshot's hard link (an entry named full, linking to target): target is
 * a normalized path earlier in the walk, and names a regular file already
 * extracted, reached below the working directory (the new tree's root)
 * through no symbolic link. */
static int snapshot_link_ok(const char *target, const char *full, char *why, size_t whysz)
{
	char t[SPACED_TREEHASH_PATH + 1];
	if (strlen(target) >= sizeof t)
		return failf(why, whysz, SPACED_ETOOBIG, "a hard link's target is too long");
	snprintf(t, sizeof t, "%s", target);
	if (!normalized(t) || walk_cmp(t, full) >= 0)
		return failf(why, whysz, SPACED_EFORMAT, "%.200s: a hard link to %.200s, not a file before it", full, target);
	int fd = spaced_open_beneath(AT_FDCWD, t, O_PATH);
	struct stat sb;
	bool ok = fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
	if (fd >= 0)
		close(fd);
	if (!ok)
		return failf(why, whysz, SPACED_EFORMAT, "%.200s: a hard link to %.200s, which is no file of the tree", full,
		             target);
	return 0;
}

/* The file libarchive is writing at full (beneath the working directory,
 * reached through no symlink), opened to write its data behind; -1 when it
 * cannot be (then it is written as libarchive writes it). */
static int extracting_fd(const char *full)
{
	int fd = spaced_open_beneath(AT_FDCWD, full, O_RDONLY | O_NONBLOCK | O_NOCTTY);
	struct stat sb;
	if (fd >= 0 && (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode))) {
		close(fd);
		fd = -1;
	}
	return fd;
}

int spaced_rootfs_extract(const char *archive, const char *dst, enum spaced_rootfs_extract_kind kind,
                          const struct spaced_rootfs_limits *lim_in, char *why, size_t whysz)
{
	/* a restore or an import of gigabytes is written behind as it goes
	 * (pace.h), its pages kept: the tree is hashed next */
	struct spaced_pace pace;
	spaced_pace_init(&pace, 0, false);
	struct spaced_rootfs_limits lim;
	struct archive *a = NULL, *x = NULL;
	struct archive_entry *e;
	char prev[SPACED_TREEHASH_PATH + 1] = "", full[SPACED_TREEHASH_PATH + 1];
	/* the directories above the current entry, for the parent check */
	char **stack = NULL;
	size_t depth = 0;
	uint64_t entries = 0, bytes = 0;
	int r = 0, ar, cwd = -1;
	bool made = false, root_seen = false;
	uint32_t root_uid = 0, root_gid = 0, root_mode = 0700;
	if (lim_in)
		lim = *lim_in;
	else
		spaced_rootfs_limits_default(&lim);
	if (mkdir(dst, 0700) < 0)
		return errno == EEXIST ? failf(why, whysz, SPACED_EEXIST, "%s exists", dst)
		                       : failf(why, whysz, SPACED_ESYS, "mkdir %s: %s", dst, strerror(errno));
	made = true;
	if (!(stack = calloc(SPACED_TREEHASH_DEPTH + 2, sizeof *stack))) {
		r = SPACED_ENOMEM;
		goto out;
	}
	if (!(a = reader_open(archive, why, whysz))) {
		r = SPACED_EFORMAT;
		goto out;
	}
	x = archive_write_disk_new();
	int flags = ARCHIVE_EXTRACT_OWNER | ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_SECURE_SYMLINKS |
	            ARCHIVE_EXTRACT_SECURE_NODOTDOT | ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS | ARCHIVE_EXTRACT_NO_OVERWRITE |
	            ARCHIVE_EXTRACT_SPARSE;
	if (kind == SPACED_ROOTFS_X_SNAPSHOT)
		flags |= ARCHIVE_EXTRACT_XATTR;
	if (!x || archive_write_disk_set_options(x, flags) != ARCHIVE_OK) {
		r = SPACED_ENOMEM;
		goto out;
	}
	/* libarchive writes relative to the working directory: the new
	 * directory's, for the duration */
	cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (cwd < 0 || chdir(dst) < 0) {
		r = failf(why, whysz, SPACED_ESYS, "chdir %s: %s", dst, strerror(errno));
		goto out;
	}
	while ((ar = archive_read_next_header(a, &e)) == ARCHIVE_OK) {
		const char *p = archive_entry_pathname(e);
		mode_t ft = archive_entry_filetype(e);
		int64_t uid = archive_entry_uid(e), gid = archive_entry_gid(e);
		if (++entries > lim.max_entries) {
			r = failf(why, whysz, SPACED_ETOOBIG, "more than %llu entries", (unsigned long long)lim.max_entries);
			goto out;
		}
		const char *hl = archive_entry_hardlink(e);
		if (!p || (hl && kind != SPACED_ROOTFS_X_SNAPSHOT)) {
			r = failf(why, whysz, SPACED_EFORMAT, "an entry without a name, or a hard link");
			goto out;
		}
		bool ids_ok = true;
		for (int i = 0; i < 2; i++) {
			int64_t v = i ? gid : uid;
			bool canon = v >= SPACED_ROOTFS_CANON_UID && v < (int64_t)(SPACED_ROOTFS_CANON_UID + SPACED_ROOTFS_IDS);
			if (!canon && !(kind == SPACED_ROOTFS_X_SNAPSHOT && v == 0))
				ids_ok = false;
		}
		if (!ids_ok) {
			r = failf(why, whysz, SPACED_EFORMAT, "%.200s has owner %lld:%lld outside the allowed range", p,
			          (long long)uid, (long long)gid);
			goto out;
		}
		if (strcmp(p, "./") == 0 || strcmp(p, ".") == 0) {
			if (root_seen || entries != 1 || ft != AE_IFDIR) {
				r = failf(why, whysz, SPACED_EFORMAT, "the root entry is not first, or not a directory");
				goto out;
			}
			root_seen = true;
			root_uid = (uint32_t)uid;
			root_gid = (uint32_t)gid;
			root_mode = (uint32_t)archive_entry_perm(e) & 07777;
			if (archive_read_data_skip(a) != ARCHIVE_OK) {
				r = failf(why, whysz, SPACED_EFORMAT, "%s", archive_error_string(a));
				goto out;
			}
			continue;
		}
		size_t pl = strlen(p);
		if (pl >= sizeof full) {
			r = failf(why, whysz, SPACED_ETOOBIG, "a path is too long");
			goto out;
		}
		memcpy(full, p, pl + 1);
		if (pl > 1 && full[pl - 1] == '/' && ft == AE_IFDIR)
			full[--pl] = 0;
		if (!root_seen || !normalized(full) || (prev[0] && walk_cmp(prev, full) >= 0)) {
			r = failf(why, whysz, SPACED_EFORMAT, "%.200s is out of order or not a normalized path", p);
			goto out;
		}
		/* its parent is the last directory above it */
		const char *slash = strrchr(full, '/');
		size_t parent_len = slash ? (size_t)(slash - full) : 0;
		while (depth > 0 && !(strlen(stack[depth - 1]) == parent_len && strncmp(stack[depth - 1], full, parent_len) == 0))
			free(stack[--depth]);
		if (parent_len > 0 && depth == 0) {
			r = failf(why, whysz, SPACED_EFORMAT, "%.200s comes without its directory", p);
			goto out;
		}
		if (depth > SPACED_TREEHASH_DEPTH) {
			r = failf(why, whysz, SPACED_ETOOBIG, "%.200s is too deep", p);
			goto out;
		}
		bool ok_type = ft == AE_IFDIR || ft == AE_IFREG || ft == AE_IFLNK || ft == AE_IFIFO ||
		               (kind == SPACED_ROOTFS_X_SNAPSHOT && ft == AE_IFCHR && archive_entry_rdev(e) == 0);
		if (!hl && !ok_type) {
			r = failf(why, whysz, SPACED_EFORMAT, "%.200s: this kind of entry is not allowed here", p);
			goto out;
		}
		/* a hard link carries no content (it would be written into the
		 * file it names) */
		if (hl && (archive_entry_size(e) != 0 || (r = snapshot_link_ok(hl, full, why, whysz)) < 0)) {
			if (r == 0)
				r = failf(why, whysz, SPACED_EFORMAT, "%.200s: a hard link with content", p);
			goto out;
		}
		if (ft == AE_IFREG) {
			int64_t sz = archive_entry_size(e);
			if (sz < 0 || (uint64_t)sz > lim.max_bytes || bytes + (uint64_t)sz > lim.max_bytes) {
				r = failf(why, whysz, SPACED_ETOOBIG, "more than %llu bytes of files",
				          (unsigned long long)lim.max_bytes);
				goto out;
			}
			bytes += (uint64_t)sz;
		}
		if (kind == SPACED_ROOTFS_X_SNAPSHOT && ft == AE_IFDIR && xattr_set(e, "trusted.overlay.opaque", "y")) {
			/* the one attribute a snapshot carries: the hash does not
			 * cover attributes, so no other is taken from an archive */
			archive_entry_xattr_clear(e);
			archive_entry_xattr_add_entry(e, "trusted.overlay.opaque", "y", 1);
		} else {
			archive_entry_xattr_clear(e);
		}
		archive_entry_set_uname(e, NULL);
		archive_entry_set_gname(e, NULL);
		archive_entry_set_pathname(e, full);
		if (archive_write_header(x, e) != ARCHIVE_OK) {
			r = failf(why, whysz, SPACED_EFORMAT, "%.200s: %s", p, archive_error_string(x));
			goto out;
		}
		if (ft == AE_IFREG) {
			const void *b;
			size_t len;
			la_int64_t off;
			int wfd = archive_entry_size(e) > 0 ? extracting_fd(full) : -1;
			while ((ar = archive_read_data_block(a, &b, &len, &off)) == ARCHIVE_OK) {
				if (archive_write_data_block(x, b, len, off) != ARCHIVE_OK) {
					r = failf(why, whysz, SPACED_EIO, "%.200s: %s", p, archive_error_string(x));
					break;
				}
				if (wfd >= 0)
					spaced_pace_wrote(&pace, wfd, (off_t)off, len);
			}
			if (wfd >= 0) {
				spaced_pace_closing(&pace, wfd);
				close(wfd);
			}
			if (r < 0)
				goto out;
			if (ar != ARCHIVE_EOF) {
				r = failf(why, whysz, SPACED_EFORMAT, "%.200s: %s", p, archive_error_string(a));
				goto out;
			}
		}
		if (archive_write_finish_entry(x) != ARCHIVE_OK) {
			r = failf(why, whysz, SPACED_EIO, "%.200s: %s", p, archive_error_string(x));
			goto out;
		}
		if (ft == AE_IFDIR && !(stack[depth++] = strdup(full))) {
			r = SPACED_ENOMEM;
			goto out;
		}
		snprintf(prev, sizeof prev, "%s", full);
	}
	if (ar != ARCHIVE_EOF) {
		r = failf(why, whysz, SPACED_EFORMAT, "%s", archive_error_string(a));
		goto out;
	}
	if (!root_seen) {
		r = failf(why, whysz, SPACED_EFORMAT, "an empty archive");
		goto out;
	}
	if (archive_write_close(x) != ARCHIVE_OK) {
		r = failf(why, whysz, SPACED_EIO, "%s", archive_error_string(x));
		goto out;
	}
	if (chown(".", root_uid, root_gid) < 0 || chmod(".", root_mode) < 0)
		r = failf(why, whysz, SPACED_ESYS, "root of %s: %s", dst, strerror(errno));
out:
	spaced_pace_end(&pace);
	if (cwd >= 0) {
		if (fchdir(cwd) < 0)
			r = r < 0 ? r : SPACED_ESYS;
		close(cwd);
	}
	if (a)
		archive_read_free(a);
	if (x)
		archive_write_free(x);
	for (size_t i = 0; i < depth; i++)
		free(stack[i]);
	free(stack);
	if (r < 0 && made)
		rm_tree(dst);
	return r;
}

/* ---- packing a snapshot directory ---- */

struct packer {
	struct archive *a;
	struct archive_entry *e;
	uint64_t bytes, max_bytes; /* the files' sizes so far, and what a restore takes */
	bool measure;              /* a walk that writes nothing: the sizes only */
	char path[SPACED_TREEHASH_PATH + 2];
	uint8_t *buf;
	char *why;
	size_t whysz;
	/* files of more than one name met so far: (device, inode) -> the first
	 * name's path, which the others' entries name as hard links */
	struct linked {
		dev_t dev;
		ino_t ino;
		char *path;
	} *links;
	size_t nlinks, links_cap; /* cap: 0 or a power of two */
	int out;                  /* the archive's file, written behind through pace */
	uint64_t out_off;
	struct spaced_pace pace;
};

static size_t linked_slot(const struct packer *k, dev_t dev, ino_t ino)
{
	uint64_t h = ((uint64_t)ino * UINT64_C(0x9E3779B97F4A7C15)) ^ (uint64_t)dev;
	size_t i = (size_t)(h >> 17) & (k->links_cap - 1);
	while (k->links[i].path && !(k->links[i].dev == dev && k->links[i].ino == ino))
		i = (i + 1) & (k->links_cap - 1);
	return i;
}

/* The first name of the file (dev, ino) when one was met before; else NULL,
 * and the current path is kept as its first. SPACED_ENOMEM in *r. */
static const char *linked_first(struct packer *k, dev_t dev, ino_t ino, int *r)
{
	*r = 0;
	if (k->links_cap) {
		size_t i = linked_slot(k, dev, ino);
		if (k->links[i].path)
			return k->links[i].path;
	}
	if ((k->nlinks + 1) * 2 > k->links_cap) {
		size_t nc = k->links_cap ? k->links_cap * 2 : 64;
		struct linked *old = k->links;
		size_t oc = k->links_cap;
		if (!(k->links = calloc(nc, sizeof *k->links))) {
			k->links = old;
			*r = SPACED_ENOMEM;
			return NULL;
		}
		k->links_cap = nc;
		for (size_t j = 0; j < oc; j++)
			if (old[j].path)
				k->links[linked_slot(k, old[j].dev, old[j].ino)] = old[j];
		free(old);
	}
	size_t i = linked_slot(k, dev, ino);
	if (!(k->links[i].path = strdup(k->path))) {
		*r = SPACED_ENOMEM;
		return NULL;
	}
	k->links[i].dev = dev;
	k->links[i].ino = ino;
	k->nlinks++;
	return NULL;
}

static void linked_free(struct packer *k)
{
	for (size_t i = 0; i < k->links_cap; i++)
		free(k->links[i].path);
	free(k->links);
	k->links = NULL;
	k->nlinks = k->links_cap = 0;
}

static int pack_entry(struct packer *k, int dirfd, const char *name, size_t plen, int depth);

static int pack_dir_entries(struct packer *k, int fd, size_t plen, int depth)
{
	DIR *d = fdopendir(fd);
	char **names = NULL;
	size_t n = 0;
	if (!d) {
		close(fd);
		return SPACED_EIO;
	}
	int r = spaced_dir_names(d, &names, &n);
	for (size_t i = 0; i < n && r == 0; i++) {
		size_t nl = strlen(names[i]), sep = plen ? 1 : 0;
		if (plen + sep + nl >= SPACED_TREEHASH_PATH) {
			r = SPACED_ETOOBIG;
			break;
		}
		if (sep)
			k->path[plen] = '/';
		memcpy(k->path + plen + sep, names[i], nl + 1);
		r = pack_entry(k, dirfd(d), names[i], plen + sep + nl, depth);
		k->path[plen] = 0;
	}
	spaced_dir_names_free(names, n);
	closedir(d);
	return r;
}

static int pack_xattrs(struct packer *k, int dirfd, const char *name)
{
	char proc[64], list[4096], val[1024];
	int fd = openat(dirfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return SPACED_EIO;
	snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
	ssize_t ln = listxattr(proc, list, sizeof list);
	for (ssize_t off = 0; ln > 0 && off < ln; off += (ssize_t)strlen(list + off) + 1) {
		const char *xn = list + off;
		if (strncmp(xn, "trusted.overlay.", 16) != 0)
			continue;
		ssize_t vl = getxattr(proc, xn, val, sizeof val);
		if (vl >= 0)
			archive_entry_xattr_add_entry(k->e, xn, val, (size_t)vl);
	}
	close(fd);
	return 0;
}

static int pack_file(struct packer *k, int dirfd, const char *name, const struct stat *sb)
{
	static const uint8_t zero[READ_BLOCK];
	int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return failf(k->why, k->whysz, SPACED_EIO, "open %s: %s", k->path, strerror(errno));
	uint64_t size = (uint64_t)sb->st_size, pos = 0;
	struct extent *ext = NULL;
	size_t next = 0, cap = 0;
	uint64_t held = 0;
	int r = 0;
	while (pos < size) {
		off_t data = lseek(fd, (off_t)pos, SEEK_DATA);
		if (data < 0 && errno == ENXIO)
			break;
		if (data < 0)
			data = (off_t)pos; /* no SEEK_DATA: all of it */
		if ((uint64_t)data >= size)
			break;
		off_t hole = lseek(fd, data, SEEK_HOLE);
		if (hole <= data || (uint64_t)hole > size)
			hole = (off_t)size;
		if (next == cap) {
			size_t nc = cap ? cap * 2 : 4;
			void *nn = realloc(ext, nc * sizeof *ext);
			if (!nn) {
				r = SPACED_ENOMEM;
				goto out;
			}
			ext = nn;
			cap = nc;
		}
		ext[next].off = (uint64_t)data;
		ext[next].len = (uint64_t)hole - (uint64_t)data;
		held += ext[next].len;
		next++;
		pos = (uint64_t)hole;
	}
	if (held < size)
		sparse_map(k->e, ext, next, size);
	if (archive_write_header(k->a, k->e) != ARCHIVE_OK) {
		r = failf(k->why, k->whysz, SPACED_EIO, "archive: %s", archive_error_string(k->a));
		goto out;
	}
	pos = 0;
	for (size_t i = 0; i <= next && r == 0; i++) {
		uint64_t until = i < next ? ext[i].off : size;
		while (pos < until) {
			size_t z = until - pos < sizeof zero ? (size_t)(until - pos) : sizeof zero;
			if (archive_write_data(k->a, zero, z) != (la_ssize_t)z) {
				r = failf(k->why, k->whysz, SPACED_EIO, "archive: %s", archive_error_string(k->a));
				goto out;
			}
			pos += z;
		}
		if (i == next)
			break;
		uint64_t end = ext[i].off + ext[i].len;
		while (pos < end) {
			size_t want = end - pos < READ_BLOCK ? (size_t)(end - pos) : READ_BLOCK;
			ssize_t got = pread(fd, k->buf, want, (off_t)pos);
			if (got != (ssize_t)want) {
				r = failf(k->why, k->whysz, SPACED_EIO, "%s changed while it was read", k->path);
				goto out;
			}
			if (archive_write_data(k->a, k->buf, want) != (la_ssize_t)want) {
				r = failf(k->why, k->whysz, SPACED_EIO, "archive: %s", archive_error_string(k->a));
				goto out;
			}
			pos += want;
		}
	}
out:
	free(ext);
	close(fd);
	return r;
}

static int pack_entry(struct packer *k, int dirfd, const char *name, size_t plen, int depth)
{
	struct stat sb;
	char target[SPACED_TREEHASH_PATH];
	if (depth > SPACED_TREEHASH_DEPTH)
		return failf(k->why, k->whysz, SPACED_ETOOBIG, "too deep");
	if (fstatat(dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) < 0)
		return failf(k->why, k->whysz, SPACED_EIO, "stat %s: %s", k->path, strerror(errno));
	if (S_ISSOCK(sb.st_mode))
		return 0;
	if (S_ISBLK(sb.st_mode) || (S_ISCHR(sb.st_mode) && sb.st_rdev != 0))
		return failf(k->why, k->whysz, SPACED_EFORMAT, "%s is a device", k->path);
	archive_entry_clear(k->e);
	if (plen == 0) {
		archive_entry_set_pathname(k->e, "./");
	} else if (S_ISDIR(sb.st_mode)) {
		k->path[plen] = '/';
		k->path[plen + 1] = 0;
		archive_entry_set_pathname(k->e, k->path);
		k->path[plen] = 0;
	} else {
		archive_entry_set_pathname(k->e, k->path);
	}
	archive_entry_copy_stat(k->e, &sb);
	archive_entry_set_nlink(k->e, 1);
	if (S_ISLNK(sb.st_mode)) {
		ssize_t tl = readlinkat(dirfd, name, target, sizeof target - 1);
		if (tl < 0)
			return failf(k->why, k->whysz, SPACED_EIO, "readlink %s: %s", k->path, strerror(errno));
		target[tl] = 0;
		archive_entry_set_symlink(k->e, target);
	} else if (!k->measure) {
		int r = pack_xattrs(k, dirfd, name);
		if (r < 0)
			return r;
	}
	if (S_ISREG(sb.st_mode)) {
		/* a file's second name on: a hard link to its first (a restore
		 * makes the link: the file's data is held once, as in the sandbox) */
		if (sb.st_nlink > 1) {
			int r;
			const char *first = linked_first(k, sb.st_dev, sb.st_ino, &r);
			if (r < 0)
				return r;
			if (first) {
				if (k->measure)
					return 0;
				archive_entry_set_size(k->e, 0);
				archive_entry_set_hardlink(k->e, first);
				if (archive_write_header(k->a, k->e) != ARCHIVE_OK)
					return failf(k->why, k->whysz, SPACED_EIO, "archive: %s", archive_error_string(k->a));
				return 0;
			}
		}
		/* a restore takes at most max_bytes of files (their sizes, holes
		 * included: spaced_rootfs_extract), so no more is packed */
		if ((uint64_t)sb.st_size > k->max_bytes - k->bytes)
			return failf(k->why, k->whysz, SPACED_ETOOBIG,
			             "the files hold more than %llu bytes (sparse files count by their size): %s",
			             (unsigned long long)k->max_bytes, k->path);
		k->bytes += (uint64_t)sb.st_size;
		return k->measure ? 0 : pack_file(k, dirfd, name, &sb);
	}
	if (S_ISCHR(sb.st_mode) || S_ISFIFO(sb.st_mode) || S_ISLNK(sb.st_mode))
		archive_entry_set_size(k->e, 0);
	if (!k->measure && archive_write_header(k->a, k->e) != ARCHIVE_OK)
		return failf(k->why, k->whysz, SPACED_EIO, "archive: %s", archive_error_string(k->a));
	if (!S_ISDIR(sb.st_mode))
		return 0;
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return failf(k->why, k->whysz, SPACED_EIO, "open %s: %s", k->path, strerror(errno));
	return pack_dir_entries(k, fd, plen, depth + 1);
}

/* libarchive's writes of the archive: paced (pace.h) */
static la_ssize_t pack_out(struct archive *a, void *arg, const void *buf, size_t n)
{
	struct packer *k = arg;
	if (spaced_io_write_full(k->out, buf, n) < 0) {
		archive_set_error(a, errno, "write: %s", strerror(errno));
		return -1;
	}
	spaced_pace_wrote(&k->pace, k->out, (off_t)k->out_off, n);
	k->out_off += n;
	return (la_ssize_t)n;
}

/* Packs dir into the file out, created (written behind), or, when out is
 * NULL, into the pipe or socket out_fd (left open). */
static int pack_to(const char *dir, const char *out, int out_fd, uint64_t rate, char *why, size_t whysz)
{
	struct packer k = {.why = why, .whysz = whysz};
	if (out)
		spaced_pace_init(&k.pace, rate, false);
	else
		spaced_pace_init_stream(&k.pace, rate);
	struct spaced_rootfs_limits lim;
	spaced_rootfs_limits_default(&lim);
	k.max_bytes = lim.max_bytes;
	int r = SPACED_ENOMEM, fd = -1;
	if (!(k.buf = malloc(READ_BLOCK)) || !(k.e = archive_entry_new()) || !(k.a = archive_write_new()))
		goto out;
	/* the sizes first: a snapshot past what a restore takes is refused
	 * before anything is written (hundreds of hard links to a big file made
	 * the worker write 8 GiB and then refuse it) */
	k.measure = true;
	if ((r = pack_entry(&k, AT_FDCWD, dir, 0, 0)) < 0)
		goto out;
	k.measure = false;
	k.bytes = 0;
	linked_free(&k); /* the second walk meets each file's names in the same order */
	fd = out ? open(out, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600) : out_fd;
	if (fd < 0) {
		r = failf(why, whysz, errno == EEXIST ? SPACED_EEXIST : SPACED_ESYS, "%s: %s", out ? out : "the stream",
		          strerror(errno));
		goto out;
	}
	/* names as their bytes are (a name that is not UTF-8 is a tenant's to make) */
	if (archive_write_set_format_pax_restricted(k.a) != ARCHIVE_OK ||
	    archive_write_set_format_option(k.a, "pax", "hdrcharset", "BINARY") != ARCHIVE_OK ||
	    archive_write_set_bytes_in_last_block(k.a, 1) != ARCHIVE_OK ||
	    (k.out = fd, archive_write_open(k.a, &k, NULL, pack_out, NULL)) != ARCHIVE_OK) {
		r = failf(why, whysz, SPACED_EIO, "archive: %s", archive_error_string(k.a));
		goto out;
	}
	if ((r = pack_entry(&k, AT_FDCWD, dir, 0, 0)) < 0)
		goto out;
	if (archive_write_close(k.a) != ARCHIVE_OK) {
		r = failf(why, whysz, SPACED_EIO, "archive: %s", archive_error_string(k.a));
		goto out;
	}
	spaced_pace_end(&k.pace);
	if (out && fsync(fd) < 0)
		r = failf(why, whysz, SPACED_EIO, "fsync: %s", strerror(errno));
out:
	if (k.a)
		archive_write_free(k.a);
	spaced_pace_end(&k.pace);
	if (out && fd >= 0)
		close(fd);
	if (out && r < 0 && fd >= 0)
		unlink(out);
	archive_entry_free(k.e);
	free(k.buf);
	linked_free(&k);
	return r;
}

int spaced_rootfs_pack_dir(const char *dir, const char *out, uint64_t rate, char *why, size_t whysz)
{
	return pack_to(dir, out, -1, rate, why, whysz);
}

int spaced_rootfs_pack_fd(const char *dir, int fd, uint64_t rate, char *why, size_t whysz)
{
	return pack_to(dir, NULL, fd, rate, why, whysz);
}
