/*
 * tmpl_cache.c — the worker's cache of templates (fetch.h, docs/templates.md
 * "On a worker").
 *
 * STATE/templates (0700, root's only: the trees hold setuid-free files of
 * foreign owners, and nothing on the host but the executions' mounts needs
 * to reach them):
 *   HASH/root          the tree, owners in the canonical range
 *   HASH/fingerprint   BLAKE2b of every entry's metadata, taken right after
 *                      the tree hash was checked
 *   HASH/bytes         what its files hold, for the size bound
 *   HASH/used          touched at every use (least recently used goes first)
 *   HASH.lock          one fetch or check of HASH at a time
 *   .dl-HASH.tar       a download in progress (resumed after a cut)
 *   .x-HASH/           an extraction in progress
 */
#include "fetch.h"
#include "mgr.h"
#include "node.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "spaced_error.h"
#include "frame.h"
#include "log.h"
#include "rootfs.h"
#include "util.h"

#define FP_HEX 65
#define RECENT_USE_S 60

static void tlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void tlog(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	spaced_vlog("executor", fmt, ap);
	va_end(ap);
}

static void rm_rf(const char *p)
{
	const char *argv[] = {"rm", "-rf", "--", p, NULL};
	mgr_run_wait(argv);
}

/* ---- the fingerprint: a sorted walk of every entry's metadata ---- */

static void fp_put(crypto_generichash_state *h, const void *p, size_t n)
{
	crypto_generichash_update(h, p, n);
}

static int fp_entry(crypto_generichash_state *h, int parent, const char *name, const char *rel, int depth)
{
	struct stat sb;
	if (depth > SPACED_TREEHASH_DEPTH || fstatat(parent, name, &sb, AT_SYMLINK_NOFOLLOW) < 0)
		return SPACED_EIO;
	uint64_t rec[10] = {(uint64_t)sb.st_mode, (uint64_t)sb.st_uid,        (uint64_t)sb.st_gid,
	                    (uint64_t)sb.st_size, (uint64_t)sb.st_ino,         (uint64_t)sb.st_mtim.tv_sec,
	                    (uint64_t)sb.st_mtim.tv_nsec, (uint64_t)sb.st_ctim.tv_sec, (uint64_t)sb.st_ctim.tv_nsec,
	                    (uint64_t)sb.st_nlink};
	uint32_t rl = (uint32_t)strlen(rel);
	fp_put(h, &rl, sizeof rl);
	fp_put(h, rel, rl);
	fp_put(h, rec, sizeof rec);
	if (!S_ISDIR(sb.st_mode))
		return 0;
	int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return SPACED_EIO;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return SPACED_EIO;
	}
	char **names = NULL;
	size_t n = 0;
	int r = spaced_dir_names(d, &names, &n);
	for (size_t i = 0; i < n && r == 0; i++) {
		char sub[SPACED_TREEHASH_PATH];
		if (snprintf(sub, sizeof sub, "%s/%s", rel, names[i]) >= (int)sizeof sub) {
			r = SPACED_ETOOBIG;
			break;
		}
		r = fp_entry(h, dirfd(d), names[i], sub, depth + 1);
	}
	spaced_dir_names_free(names, n);
	closedir(d);
	return r;
}

static int fingerprint(const char *root, char hex[FP_HEX])
{
	crypto_generichash_state h;
	uint8_t out[32];
	if (sodium_init() < 0)
		return SPACED_EIO;
	crypto_generichash_init(&h, NULL, 0, sizeof out);
	fp_put(&h, "spaced-tmpl-fp-v1", 17);
	int r = fp_entry(&h, AT_FDCWD, root, ".", 0);
	if (r < 0)
		return r;
	crypto_generichash_final(&h, out, sizeof out);
	sodium_bin2hex(hex, FP_HEX, out, sizeof out);
	return 0;
}

static int read_small(const char *path, char *buf, size_t sz)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sz - 1);
	close(fd);
	if (n < 0)
		return -1;
	buf[n] = 0;
	buf[strcspn(buf, "\n")] = 0;
	return 0;
}

static int write_small(const char *path, const char *text)
{
	char tmp[4300];
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -1;
	int ok = spaced_io_write_full(fd, text, strlen(text)) == 0 && fsync(fd) == 0;
	close(fd);
	if (!ok || rename(tmp, path) < 0) {
		unlink(tmp);
		return -1;
	}
	return 0;
}

static void touch_used(const char *tdir)
{
	char p[4400];
	snprintf(p, sizeof p, "%s/used", tdir);
	int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd >= 0) {
		futimens(fd, NULL);
		close(fd);
	}
}

/* Fetches, extracts and checks hash into tdir. */
static int fetch_one(const struct mgr_config *cfg, const char *base, const char *hash, const char *url,
                     const char *tdir, char *why, size_t whysz)
{
	char part[4300], x[4300], xroot[4400], got[SPACED_TREEHASH_HEX], fp[FP_HEX], p[4400], num[32];
	uint64_t bytes = 0;
	int r;
	snprintf(part, sizeof part, "%s/.dl-%s.tar", base, hash);
	snprintf(x, sizeof x, "%s/.x-%s", base, hash);
	snprintf(xroot, sizeof xroot, "%s/root", x);
	r = fetch_blob(cfg, url, part, cfg->tmpl_max, why, whysz);
	if (r < 0)
		return r;
	rm_rf(x);
	if (mkdir(x, 0700) < 0) {
		spaced_why(why, whysz, "mkdir %s: %s", x, strerror(errno));
		return SPACED_ESYS;
	}
	struct spaced_rootfs_limits lim;
	spaced_rootfs_limits_default(&lim);
	lim.max_bytes = cfg->tmpl_max;
	r = spaced_rootfs_extract(part, xroot, SPACED_ROOTFS_X_TEMPLATE, &lim, why, whysz);
	if (r == 0 && (r = spaced_treehash_dir(xroot, got, &bytes)) == 0 && !spaced_ct_eq(got, hash, 64)) {
		spaced_why(why, whysz, "the template fetched from %.200s hashes to %s, not %s", url, got, hash);
		r = SPACED_EIDENTITY;
	}
	/* a partial file is kept only for resuming a cut transfer: once it is
	 * whole it goes, good or bad */
	unlink(part);
	if (r < 0) {
		rm_rf(x);
		return r;
	}
	snprintf(num, sizeof num, "%llu\n", (unsigned long long)bytes);
	snprintf(p, sizeof p, "%s/bytes", x);
	if ((r = fingerprint(xroot, fp)) < 0 || write_small(p, num) < 0) {
		rm_rf(x);
		spaced_why(why, whysz, "cannot record the template's fingerprint");
		return r < 0 ? r : SPACED_EIO;
	}
	snprintf(p, sizeof p, "%s/fingerprint", x);
	if (write_small(p, fp) < 0 || rename(x, tdir) < 0) {
		rm_rf(x);
		spaced_why(why, whysz, "cannot keep the template: %s", strerror(errno));
		return SPACED_EIO;
	}
	return 0;
}

int tmpl_ensure(const struct mgr_config *cfg, const char *hash, const char *url, char *root, size_t rootsz,
                int *fetched, char *why, size_t whysz)
{
	char base[4200], lockp[4300], tdir[4300], troot[4400], p[4400], want[FP_HEX + 8], fp[FP_HEX];
	int r, lockfd = -1;
	if (!spaced_treehash_hex_valid(hash)) {
		spaced_why(why, whysz, "not a template hash");
		return SPACED_EINVAL;
	}
	if (fetched)
		*fetched = 0;
	snprintf(base, sizeof base, "%s/templates", cfg->state_dir);
	if (mkdir(base, 0700) < 0 && errno != EEXIST) {
		spaced_why(why, whysz, "mkdir %s: %s", base, strerror(errno));
		return SPACED_ESYS;
	}
	snprintf(lockp, sizeof lockp, "%s/%s.lock", base, hash);
	snprintf(tdir, sizeof tdir, "%s/%s", base, hash);
	snprintf(troot, sizeof troot, "%s/root", tdir);
	if (strlen(troot) >= rootsz)
		return SPACED_ETOOBIG;
	lockfd = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (lockfd < 0 || flock(lockfd, LOCK_EX) < 0) {
		spaced_why(why, whysz, "%s: %s", lockp, strerror(errno));
		r = SPACED_ESYS;
		goto out;
	}
	snprintf(p, sizeof p, "%s/fingerprint", tdir);
	struct stat sb;
	if (lstat(troot, &sb) == 0 && read_small(p, want, sizeof want) == 0) {
		if (fingerprint(troot, fp) == 0 && spaced_ct_eq(fp, want, FP_HEX - 1)) {
			r = 0;
			goto ok;
		}
		/* something changed under it: only its content hash can tell */
		char got[SPACED_TREEHASH_HEX];
		if (spaced_treehash_dir(troot, got, NULL) == 0 && spaced_ct_eq(got, hash, 64) && fingerprint(troot, fp) == 0 &&
		    write_small(p, fp) == 0) {
			tlog("level=warn event=template-metadata-changed hash=%s reason=\"content intact\"", hash);
			r = 0;
			goto ok;
		}
		/* set aside, not removed: executions running on it keep their
		 * files; new ones get a fresh copy */
		char aside[4400];
		snprintf(aside, sizeof aside, "%s/.bad-%s-%lld", base, hash, (long long)time(NULL));
		tlog("level=error event=template-tampered hash=%s reason=\"its tree no longer has its hash\" "
		     "action=refetch set_aside=%s",
		     hash, aside);
		if (rename(tdir, aside) < 0)
			rm_rf(tdir);
	}
	rm_rf(tdir);
	if (!url || !*url) {
		spaced_why(why, whysz, "template %s is not here and no URL names it", hash);
		r = SPACED_ENOENT;
		goto out;
	}
	r = fetch_one(cfg, base, hash, url, tdir, why, whysz);
	if (r == SPACED_EIDENTITY) /* damaged in transit, or in the store: one fresh try */
		r = fetch_one(cfg, base, hash, url, tdir, why, whysz);
	if (r < 0)
		goto out;
	if (fetched)
		*fetched = 1;
	tlog("level=info event=template-fetched hash=%s", hash);
ok:
	touch_used(tdir);
	memcpy(root, troot, strlen(troot) + 1);
out:
	if (lockfd >= 0)
		close(lockfd);
	return r;
}

int tmpl_unchanged(const struct mgr_config *cfg, const char *hash)
{
	char troot[4400], p[4400], want[FP_HEX + 8], fp[FP_HEX];
	if (!spaced_treehash_hex_valid(hash))
		return SPACED_EINVAL;
	snprintf(troot, sizeof troot, "%s/templates/%s/root", cfg->state_dir, hash);
	snprintf(p, sizeof p, "%s/templates/%s/fingerprint", cfg->state_dir, hash);
	if (read_small(p, want, sizeof want) < 0 || fingerprint(troot, fp) < 0 || !spaced_ct_eq(fp, want, FP_HEX - 1))
		return SPACED_EIDENTITY;
	return 0;
}

struct cached {
	char hash[SPACED_TREEHASH_HEX];
	uint64_t bytes;
	time_t used;
};

static int by_use(const void *a, const void *b)
{
	const struct cached *x = a, *y = b;
	return (x->used > y->used) - (x->used < y->used);
}

void tmpl_evict(const struct mgr_config *cfg, uint64_t max, const char *const *keep, size_t nkeep)
{
	char base[4200], p[4500];
	snprintf(base, sizeof base, "%s/templates", cfg->state_dir);
	DIR *d = opendir(base);
	if (!d)
		return;
	struct cached *c = NULL;
	size_t n = 0, cap = 0;
	uint64_t total = 0;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		if (!spaced_treehash_hex_valid(de->d_name))
			continue;
		char num[32] = "0";
		struct stat sb;
		snprintf(p, sizeof p, "%s/%s/bytes", base, de->d_name);
		read_small(p, num, sizeof num);
		snprintf(p, sizeof p, "%s/%s/used", base, de->d_name);
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 16;
			struct cached *nn = realloc(c, nc * sizeof *nn);
			if (!nn)
				break;
			c = nn;
			cap = nc;
		}
		memcpy(c[n].hash, de->d_name, SPACED_TREEHASH_HEX);
		c[n].bytes = strtoull(num, NULL, 10);
		c[n].used = stat(p, &sb) == 0 ? sb.st_mtime : 0;
		total += c[n].bytes;
		n++;
	}
	closedir(d);
	if (n > 1)
		qsort(c, n, sizeof *c, by_use);
	time_t now = time(NULL);
	for (size_t i = 0; i < n && total > max; i++) {
		bool kept = c[i].used > now - RECENT_USE_S;
		for (size_t k = 0; !kept && k < nkeep; k++)
			kept = strcmp(keep[k], c[i].hash) == 0;
		if (kept)
			continue;
		snprintf(p, sizeof p, "%s/%s.lock", base, c[i].hash);
		int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) < 0) {
			if (fd >= 0)
				close(fd);
			continue;
		}
		snprintf(p, sizeof p, "%s/%s", base, c[i].hash);
		rm_rf(p);
		tlog("level=info event=template-evicted hash=%s bytes=%llu", c[i].hash, (unsigned long long)c[i].bytes);
		total -= c[i].bytes;
		close(fd);
	}
	free(c);
}
