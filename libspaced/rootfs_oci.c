/*
 * rootfs_oci.c — an OCI image archive into a tree (rootfs.h).
 *
 * The archive is a tar of an OCI image layout (image-spec image-layout.md):
 * "oci-layout", "index.json" and blobs/sha256/<hex>. Only those names are
 * taken out of it (each a regular file, into a private directory under the
 * spool directory); everything else in it is ignored. Then: index.json →
 * the image manifest (through a nested image index, by platform
 * linux/amd64, at most 4 levels) → its config (Env, WorkingDir, User) and
 * its layers, applied in order (rootfs.c applies whiteouts). Every blob is
 * checked against the sha256 digest and the size its descriptor names
 * before it is read; JSON is parsed with duplicate keys refused.
 */
#include "rootfs.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "spaced_error.h"
#include "frame.h"
#include "util.h"

#define OCI_JSON_MAX (4u << 20) /* an index, manifest or config */
#define OCI_DEPTH 4
#define OCI_LAYERS_MAX 256

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

static bool hex64(const char *s, size_t n)
{
	if (n != 64)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

/* The layout name an entry carries, or NULL when it is not one we take:
 * "oci-layout", "index.json", "blobs/sha256/<64 hex>". */
static const char *layout_name(const char *p)
{
	while (p[0] == '.' && p[1] == '/')
		p += 2;
	while (*p == '/')
		p++;
	if (strcmp(p, "oci-layout") == 0 || strcmp(p, "index.json") == 0)
		return p;
	if (strncmp(p, "blobs/sha256/", 13) == 0 && hex64(p + 13, strlen(p + 13)))
		return p;
	return NULL;
}

static struct archive *outer_open(const char *path)
{
	struct archive *a = archive_read_new();
	if (!a)
		return NULL;
	archive_read_support_format_tar(a);
	archive_read_support_format_gnutar(a);
	archive_read_support_filter_gzip(a);
	archive_read_support_filter_zstd(a);
	archive_read_support_filter_xz(a);
	archive_read_support_filter_none(a);
	if (archive_read_open_filename(a, path, 64 * 1024) != ARCHIVE_OK) {
		archive_read_free(a);
		return NULL;
	}
	return a;
}

int spaced_rootfs_is_oci(const char *path)
{
	struct archive *a = outer_open(path);
	struct archive_entry *e;
	struct spaced_rootfs_limits lim;
	uint64_t skipped = 0, entries = 0;
	int oci = 0;
	if (!a)
		return 0;
	spaced_rootfs_limits_default(&lim);
	while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
		/* what is skipped here is decompressed all the same: bounded as
		 * an import's content is (past it, the import's own pass refuses) */
		int64_t size = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
		if (++entries > lim.max_entries || (size > 0 && (skipped += (uint64_t)size) > lim.max_bytes))
			break;
		const char *p = archive_entry_pathname(e);
		const char *n = p ? layout_name(p) : NULL;
		if (n && (strcmp(n, "oci-layout") == 0 || strcmp(n, "index.json") == 0)) {
			oci = 1;
			break;
		}
		if (archive_read_data_skip(a) != ARCHIVE_OK)
			break;
	}
	archive_read_free(a);
	return oci;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
	(void)sb;
	(void)f;
	if (flag == FTW_DP)
		rmdir(p);
	else
		unlink(p);
	return 0;
}

struct oci {
	struct spaced_rootfs *t;
	char dir[4096]; /* the private copy of the layout */
	uint64_t taken, limit;
	char *why;
	size_t whysz;
};

/* Takes the layout's files out of the archive into o->dir. */
static int take_layout(struct oci *o, const char *path)
{
	struct archive *a = outer_open(path);
	struct archive_entry *e;
	int r = 0, ar;
	char buf[64 * 1024];
	if (!a)
		return failf(o->why, o->whysz, SPACED_EFORMAT, "not an archive");
	char blobs[4200];
	snprintf(blobs, sizeof blobs, "%s/blobs", o->dir);
	if (mkdir(blobs, 0700) < 0)
		return failf(o->why, o->whysz, SPACED_ESYS, "mkdir: %s", strerror(errno));
	snprintf(blobs, sizeof blobs, "%s/blobs/sha256", o->dir);
	if (mkdir(blobs, 0700) < 0)
		return failf(o->why, o->whysz, SPACED_ESYS, "mkdir: %s", strerror(errno));
	while ((ar = archive_read_next_header(a, &e)) == ARCHIVE_OK) {
		const char *p = archive_entry_pathname(e);
		const char *n = p ? layout_name(p) : NULL;
		if (!n || archive_entry_filetype(e) != AE_IFREG || archive_entry_hardlink(e)) {
			if (archive_read_data_skip(a) != ARCHIVE_OK)
				break;
			continue;
		}
		char dst[4400];
		snprintf(dst, sizeof dst, "%s/%s", o->dir, n);
		/* O_EXCL: a name given twice is refused, never overwritten */
		int fd = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd < 0) {
			r = failf(o->why, o->whysz, errno == EEXIST ? SPACED_EFORMAT : SPACED_ESYS, "%s: %s", n,
			          errno == EEXIST ? "appears twice in the archive" : strerror(errno));
			goto out;
		}
		for (;;) {
			la_ssize_t got = archive_read_data(a, buf, sizeof buf);
			if (got == 0)
				break;
			if (got < 0) {
				r = failf(o->why, o->whysz, SPACED_EFORMAT, "%s: %s", n, archive_error_string(a));
				break;
			}
			o->taken += (uint64_t)got;
			if (o->taken > o->limit) {
				r = failf(o->why, o->whysz, SPACED_ETOOBIG, "the image holds more than %llu bytes",
				          (unsigned long long)o->limit);
				break;
			}
			if (spaced_io_write_full(fd, buf, (size_t)got) < 0) {
				r = failf(o->why, o->whysz, SPACED_EIO, "%s: %s", n, strerror(errno));
				break;
			}
		}
		close(fd);
		if (r < 0)
			goto out;
	}
	if (ar != ARCHIVE_EOF)
		r = failf(o->why, o->whysz, SPACED_EFORMAT, "%s", archive_error_string(a));
out:
	archive_read_free(a);
	return r;
}

/* The blob a descriptor names, checked: its path in *path. */
static int blob_checked(struct oci *o, json_t *desc, char *path, size_t pathsz)
{
	json_t *dg = json_object_get(desc, "digest"), *sz = json_object_get(desc, "size");
	if (!json_is_string(dg) || !json_is_integer(sz) || json_integer_value(sz) < 0)
		return failf(o->why, o->whysz, SPACED_EFORMAT, "a descriptor without digest or size");
	const char *d = json_string_value(dg);
	if (strncmp(d, "sha256:", 7) != 0 || !hex64(d + 7, strlen(d + 7)))
		return failf(o->why, o->whysz, SPACED_EFORMAT, "digest %.80s is not sha256:<64 hex>", d);
	snprintf(path, pathsz, "%s/blobs/sha256/%s", o->dir, d + 7);
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return failf(o->why, o->whysz, SPACED_EFORMAT, "blob %.80s is not in the archive", d);
	crypto_hash_sha256_state st;
	crypto_hash_sha256_init(&st);
	uint8_t buf[64 * 1024], out[32];
	uint64_t total = 0;
	ssize_t n;
	while ((n = read(fd, buf, sizeof buf)) > 0) {
		crypto_hash_sha256_update(&st, buf, (unsigned long long)n);
		total += (uint64_t)n;
	}
	close(fd);
	if (n < 0)
		return failf(o->why, o->whysz, SPACED_EIO, "blob %.80s: %s", d, strerror(errno));
	crypto_hash_sha256_final(&st, out);
	char hex[65];
	sodium_bin2hex(hex, sizeof hex, out, sizeof out);
	if (total != (uint64_t)json_integer_value(sz))
		return failf(o->why, o->whysz, SPACED_EFORMAT, "blob %.80s holds %llu bytes, its descriptor says %lld", d,
		             (unsigned long long)total, (long long)json_integer_value(sz));
	if (!spaced_ct_eq(hex, d + 7, 64))
		return failf(o->why, o->whysz, SPACED_EFORMAT, "blob %.80s does not match its digest", d);
	return 0;
}

static json_t *load_json(struct oci *o, const char *path, const char *what)
{
	json_error_t err;
	struct stat sb;
	if (stat(path, &sb) < 0 || (uint64_t)sb.st_size > OCI_JSON_MAX) {
		failf(o->why, o->whysz, 0, "%s is missing or too large", what);
		return NULL;
	}
	json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
	if (!json_is_object(j)) {
		failf(o->why, o->whysz, 0, "%s: %s", what, j ? "not an object" : err.text);
		json_decref(j);
		return NULL;
	}
	return j;
}

static bool is_index_type(const char *mt)
{
	return mt && (strcmp(mt, "application/vnd.oci.image.index.v1+json") == 0 ||
	              strcmp(mt, "application/vnd.docker.distribution.manifest.list.v2+json") == 0);
}

static bool is_manifest_type(const char *mt)
{
	return mt && (strcmp(mt, "application/vnd.oci.image.manifest.v1+json") == 0 ||
	              strcmp(mt, "application/vnd.docker.distribution.manifest.v2+json") == 0);
}

/* The descriptor in an index's manifests to follow: the one for
 * linux/amd64, else the only one without a platform. */
static json_t *pick(json_t *index)
{
	json_t *ms = json_object_get(index, "manifests"), *d, *fallback = NULL;
	size_t i, count = 0;
	if (!json_is_array(ms))
		return NULL;
	json_array_foreach(ms, i, d) {
		json_t *pl = json_object_get(d, "platform");
		const char *os = json_string_value(json_object_get(pl, "os"));
		const char *arch = json_string_value(json_object_get(pl, "architecture"));
		if (os && arch && strcmp(os, "linux") == 0 && strcmp(arch, "amd64") == 0)
			return d;
		if (!pl) {
			fallback = d;
			count++;
		}
	}
	return count == 1 || json_array_size(ms) == 1 ? (fallback ? fallback : json_array_get(ms, 0)) : NULL;
}

/* The configuration's Env, WorkingDir and User, as spaced keeps them. */
static json_t *config_of(json_t *cfg)
{
	json_t *c = json_object_get(cfg, "config"), *env = json_object_get(c, "Env");
	json_t *out = json_object(), *e = json_array(), *v;
	size_t i;
	if (!out || !e) {
		json_decref(out);
		json_decref(e);
		return NULL;
	}
	json_array_foreach(env, i, v) {
		if (json_is_string(v) && strchr(json_string_value(v), '=') && json_string_length(v) < 4096)
			json_array_append(e, v);
	}
	json_object_set_new(out, "env", e);
	const char *wd = json_string_value(json_object_get(c, "WorkingDir"));
	const char *user = json_string_value(json_object_get(c, "User"));
	if (wd && *wd && strlen(wd) < 1024)
		json_object_set_new(out, "workdir", json_string(wd));
	if (user && *user && strlen(user) < 256)
		json_object_set_new(out, "user", json_string(user));
	return out;
}

int spaced_rootfs_add_oci(struct spaced_rootfs *t, const char *path, json_t **config, char *why, size_t whysz)
{
	struct oci o = {.t = t, .why = why, .whysz = whysz};
	json_t *doc = NULL, *manifest = NULL, *cfg = NULL;
	char p[4400];
	int r;
	o.limit = spaced_rootfs_limits_of(t)->max_bytes;
	if (sodium_init() < 0)
		return SPACED_EIO;
	snprintf(o.dir, sizeof o.dir, "%s/oci-XXXXXX", spaced_rootfs_spool_dir(t));
	if (!mkdtemp(o.dir))
		return failf(why, whysz, SPACED_ESYS, "mkdtemp in %s: %s", spaced_rootfs_spool_dir(t), strerror(errno));
	if ((r = take_layout(&o, path)) < 0)
		goto out;
	snprintf(p, sizeof p, "%s/oci-layout", o.dir);
	json_t *layout = load_json(&o, p, "oci-layout");
	const char *ver = json_string_value(json_object_get(layout, "imageLayoutVersion"));
	bool ok_layout = ver && strcmp(ver, "1.0.0") == 0;
	json_decref(layout);
	if (!ok_layout) {
		r = failf(why, whysz, SPACED_EFORMAT, "oci-layout is missing or not imageLayoutVersion 1.0.0");
		goto out;
	}
	snprintf(p, sizeof p, "%s/index.json", o.dir);
	if (!(doc = load_json(&o, p, "index.json"))) {
		r = SPACED_EFORMAT;
		goto out;
	}
	/* index → (index →) manifest */
	for (int depth = 0;; depth++) {
		json_t *d = pick(doc);
		if (!d || depth >= OCI_DEPTH) {
			r = failf(why, whysz, SPACED_EFORMAT, "no image manifest for linux/amd64 in the index");
			goto out;
		}
		/* a copy: d belongs to doc, which is freed below */
		char mtb[160];
		const char *dmt = json_string_value(json_object_get(d, "mediaType"));
		snprintf(mtb, sizeof mtb, "%s", dmt ? dmt : "");
		const char *mt = dmt ? mtb : NULL;
		if ((r = blob_checked(&o, d, p, sizeof p)) < 0)
			goto out;
		json_t *next = load_json(&o, p, "a manifest");
		if (!next) {
			r = SPACED_EFORMAT;
			goto out;
		}
		json_decref(doc);
		doc = next;
		const char *own = json_string_value(json_object_get(doc, "mediaType"));
		if (is_index_type(mt) || (!mt && is_index_type(own)))
			continue;
		if (!is_manifest_type(mt ? mt : own) && !json_is_array(json_object_get(doc, "layers"))) {
			r = failf(why, whysz, SPACED_EFORMAT, "unsupported manifest type %.100s", mt ? mt : "(none)");
			goto out;
		}
		manifest = doc;
		doc = NULL;
		break;
	}
	json_t *cd = json_object_get(manifest, "config");
	if (cd) {
		if ((r = blob_checked(&o, cd, p, sizeof p)) < 0)
			goto out;
		if (!(cfg = load_json(&o, p, "the image configuration"))) {
			r = SPACED_EFORMAT;
			goto out;
		}
	}
	json_t *layers = json_object_get(manifest, "layers"), *l;
	size_t i;
	if (!json_is_array(layers) || json_array_size(layers) > OCI_LAYERS_MAX) {
		r = failf(why, whysz, SPACED_EFORMAT, "the manifest has no layers array, or more than %d layers",
		          OCI_LAYERS_MAX);
		goto out;
	}
	json_array_foreach(layers, i, l) {
		const char *mt = json_string_value(json_object_get(l, "mediaType"));
		static const char *const ok[] = {
			"application/vnd.oci.image.layer.v1.tar",
			"application/vnd.oci.image.layer.v1.tar+gzip",
			"application/vnd.oci.image.layer.v1.tar+zstd",
			"application/vnd.docker.image.rootfs.diff.tar.gzip",
			"application/vnd.oci.image.layer.nondistributable.v1.tar",
			"application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
		};
		bool known = false;
		for (size_t k = 0; mt && k < sizeof ok / sizeof ok[0]; k++)
			known = known || strcmp(mt, ok[k]) == 0;
		if (!known) {
			r = failf(why, whysz, SPACED_EFORMAT, "layer %zu has unsupported media type %.100s", i,
			          mt ? mt : "(none)");
			goto out;
		}
		if ((r = blob_checked(&o, l, p, sizeof p)) < 0)
			goto out;
		char lwhy[512] = "";
		if ((r = spaced_rootfs_add_archive(t, p, SPACED_ROOTFS_OCI_LAYER, lwhy, sizeof lwhy)) < 0) {
			failf(why, whysz, r, "layer %zu: %s", i, lwhy);
			goto out;
		}
	}
	if (config && cfg) {
		json_t *kept = config_of(cfg);
		char *text = kept ? json_dumps(kept, JSON_COMPACT) : NULL;
		size_t n = text ? strlen(text) : 0;
		free(text);
		if (n > SPACED_ROOTFS_CONFIG_MAX) {
			json_decref(kept);
			r = failf(why, whysz, SPACED_ETOOBIG,
			          "the image's configuration (Env, WorkingDir, User) is %zu bytes: a template's is at most %u", n,
			          SPACED_ROOTFS_CONFIG_MAX);
			goto out;
		}
		*config = kept;
	} else if (config) {
		*config = NULL;
	}
	r = 0;
out:
	json_decref(doc);
	json_decref(manifest);
	json_decref(cfg);
	nftw(o.dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
	return r;
}
