/*
 * templates.c — templates in the control plane (docs/templates.md): a
 * tenant's names for content-hashed root filesystems held in the store, the
 * import of what a user uploads (libspaced/rootfs.h), and what a create
 * puts into the install message so a worker can fetch the template and
 * check it (spec.template = {"name","hash","url"}).
 *
 * Store layout (STATE/store): templates/HASH.tar (canonical archives, shared
 * by every name and tenant whose tree has that hash), snapshots/NAME.tar,
 * tmp/ (uploads and imports in progress).
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "cp.h"
#include "spaced_error.h"
#include "identity.h"
#include "log.h"
#include "rootfs.h"

/* The store's archives (templates/HASH.tar) are published and removed under
 * archive_lock: a remover holds it from its check that nothing names a tree
 * to its unlink, a publisher from its check that the archive is there (or
 * its rename that puts it there) to the commit of the row that names it. So
 * no row ever names a tree whose archive a remover is about to take: before,
 * a tenant's template delete that found the tree unnamed could unlink it
 * just after another tenant's import of the same tree, which found the
 * archive there and dropped its own copy, had named it (the second tenant's
 * template then named nothing). Taken before any transaction of the store
 * and never inside one (writers wait for the store's locks under it, never
 * the other way round); held for a few statements, never for a tree's
 * reading or writing. One control plane's threads share the directory (each
 * replica has its own store, docs/control-plane.md "Known limits"). */
static pthread_mutex_t archive_lock = PTHREAD_MUTEX_INITIALIZER;

static json_t *template_row_json(const struct cp_rows *rows, int i)
{
	char created[21] = "";
	json_error_t jerr;
	const char *cfg = cp_rows_get(rows, i, 5);
	json_t *c = cfg ? json_loads(cfg, JSON_REJECT_DUPLICATES, &jerr) : NULL;
	spaced_time_format(cp_rows_i64(rows, i, 6, 0), created);
	return json_pack("{s:s,s:s,s:I,s:I,s:o,s:s,s:s}", "name", cp_rows_get(rows, i, 0), "hash", cp_rows_get(rows, i, 1),
	                 "bytes", (json_int_t)cp_rows_i64(rows, i, 2, 0), "entries",
	                 (json_int_t)cp_rows_i64(rows, i, 3, 0), "config", c ? c : json_object(), "source",
	                 cp_rows_get(rows, i, 4) ? cp_rows_get(rows, i, 4) : "", "created", created);
}

#define TEMPLATE_COLS "name, hash, bytes, entries, source, config, created"

int cp_template_resolve(struct cp_store *st, const char *tenant, const char *name, json_t **tmpl, json_t **err)
{
	struct cp_rows *rows = NULL;
	int r = CP_Q(st, &rows, NULL, "SELECT " TEMPLATE_COLS " FROM templates WHERE tenant = $1 AND name = $2", tenant,
	             name);
	if (r < 0) {
		*err = cp_error("store", spaced_strerror(r));
		return 503;
	}
	if (rows->nrows != 1) {
		cp_rows_free(rows);
		*err = cp_error("template-not-found", "no template of this name (spacectl template ls)");
		return 404;
	}
	json_error_t jerr;
	const char *cfg = cp_rows_get(rows, 0, 5);
	json_t *c = cfg ? json_loads(cfg, JSON_REJECT_DUPLICATES, &jerr) : NULL;
	*tmpl = json_pack("{s:s,s:s,s:o}", "name", cp_rows_get(rows, 0, 0), "hash", cp_rows_get(rows, 0, 1), "config",
	                  c ? c : json_object());
	cp_rows_free(rows);
	return *tmpl ? 0 : 500;
}

void cp_template_locate(struct cp *cp, json_t *spec)
{
	json_t *t = json_object_get(spec, "template");
	const char *h = json_string_value(json_object_get(t, "hash"));
	if (!json_is_object(t) || !h)
		return;
	char url[CP_URL_MAX + 128];
	snprintf(url, sizeof url, "%s/v1/blobs/templates/%s", cp->store_url, h);
	json_object_set_new(t, "url", json_string(url));
}

bool cp_template_name_valid(const char *name)
{
	return spaced_name_valid(name, strlen(name)) && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

int cp_templates_held(struct cp_store *st, const char *tenant, int64_t *bytes)
{
	struct cp_rows *rows = NULL;
	int r = CP_Q(st, &rows, NULL,
	             "SELECT COALESCE(SUM(b), 0) FROM (SELECT hash, MAX(bytes) AS b FROM (SELECT hash, bytes FROM "
	             "templates WHERE tenant = $1 UNION ALL SELECT hash, bytes FROM build_steps WHERE tenant = $1) AS u "
	             "GROUP BY hash) AS t",
	             tenant);
	if (r == 0)
		*bytes = cp_rows_i64(rows, 0, 0, 0);
	cp_rows_free(rows);
	return r;
}

#define TEMPLATE_NAMES_MAX 1000 /* a tenant's template names (each holds a row and its settings) */

/* Opens a transaction under the tenant's row lock (cp_quota_usage's) and
 * checks that one more tree of bytes (hash) fits its templates quota: the
 * trees its templates and its recorded build steps name, each once; with
 * naming, also that it has fewer than TEMPLATE_NAMES_MAX names. 0 with the
 * transaction open (the caller inserts and commits); else the status (429
 * quota-exceeded, 503 store) with *answer, the transaction rolled back.
 * Concurrent imports, namings and build steps of one tenant are so counted
 * one after the other, as its creates are. */
static int templates_quota_locked(struct cp *cp, struct cp_store *st, const char *tenant, const char *hash,
                                  int64_t bytes, bool naming, json_t **answer)
{
	struct cp_quota limit, used;
	struct cp_rows *rows = NULL;
	int64_t cur = 0;
	int r = cp_store_begin(st);
	if (r < 0) {
		*answer = cp_error("store", spaced_strerror(r));
		return 503;
	}
	r = cp_quota_usage(cp, st, tenant, 1, &limit, &used);
	if (r == 0)
		r = cp_templates_held(st, tenant, &cur);
	if (r == 0)
		r = CP_Q(st, &rows, NULL,
		         "SELECT (SELECT COUNT(*) FROM templates WHERE tenant = $1 AND hash = $2) + "
		         "(SELECT COUNT(*) FROM build_steps WHERE tenant = $1 AND hash = $2), "
		         "(SELECT COUNT(*) FROM templates WHERE tenant = $1)",
		         tenant, hash);
	if (r < 0) {
		cp_rows_free(rows);
		cp_store_rollback(st);
		*answer = cp_error("store", spaced_strerror(r));
		return 503;
	}
	int64_t want = cp_rows_i64(rows, 0, 0, 0) > 0 ? 0 : bytes, names = cp_rows_i64(rows, 0, 1, 0);
	cp_rows_free(rows);
	char m[200];
	if (limit.templates > 0 && cur + want > limit.templates) {
		cp_store_rollback(st);
		snprintf(m, sizeof m,
		         "the tenant's templates_bytes quota is %lld; its templates and build steps hold %lld and this "
		         "one %lld more",
		         (long long)limit.templates, (long long)cur, (long long)want);
		*answer = json_pack("{s:s,s:s,s:s,s:I,s:I,s:I}", "error", "quota-exceeded", "message", m, "quota",
		                    "templates_bytes", "limit", (json_int_t)limit.templates, "used", (json_int_t)cur,
		                    "requested", (json_int_t)want);
		return 429;
	}
	if (naming && names >= TEMPLATE_NAMES_MAX) {
		cp_store_rollback(st);
		snprintf(m, sizeof m, "a tenant has at most %d templates (spacectl template rm some)", TEMPLATE_NAMES_MAX);
		*answer = json_pack("{s:s,s:s,s:s,s:I,s:I,s:I}", "error", "quota-exceeded", "message", m, "quota",
		                    "templates", "limit", (json_int_t)TEMPLATE_NAMES_MAX, "used", (json_int_t)names,
		                    "requested", (json_int_t)1);
		return 429;
	}
	return 0;
}

/* Names a template of tenant's: name → the tree hash of bytes (entries,
 * config text cfg or NULL, source), within its templates quota
 * (templates_quota_locked). 201 with *answer unset when named; else the
 * status (429 quota-exceeded, 409 template-exists, 503 store) with *answer. */
static int template_insert(struct cp *cp, struct cp_store *st, const char *tenant, const char *name,
                           const char *hash, int64_t bytes, int64_t entries, const char *cfg, const char *source,
                           json_t **answer)
{
	char now[24], b[24], e[24];
	int status = templates_quota_locked(cp, st, tenant, hash, bytes, true, answer);
	if (status != 0)
		return status;
	int r = CP_Q(st, NULL, NULL,
	             "INSERT INTO templates (tenant, name, hash, bytes, entries, config, source, created) "
	             "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
	             tenant, name, hash, cp_i64(b, bytes), cp_i64(e, entries), cfg, source, cp_i64(now, spaced_now()));
	if (r == SPACED_EEXIST) {
		cp_store_rollback(st);
		*answer = cp_error("template-exists", "a template of this name exists (templates are immutable: "
		                                      "spacectl template rm it first)");
		return 409;
	}
	if (r == 0 && (r = cp_store_commit(st)) == 0)
		return 201;
	if (r != 0)
		cp_store_rollback(st); /* (a failed commit rolled back already; again is harmless) */
	*answer = cp_error("store", spaced_strerror(r));
	return 503;
}

int cp_template_import(struct cp *cp, struct cp_store *st, const char *tenant, const char *name, const char *upload,
                       json_t **answer)
{
	char why[512] = "", canon[PATH_MAX], final[PATH_MAX], spool[PATH_MAX];
	struct spaced_rootfs *t = NULL;
	struct spaced_rootfs_info info;
	json_t *config = NULL;
	const char *format = "";
	char *cfg_text = NULL;
	int status = 500, r;
	/* a tenant with no room left in its quota is refused before its archive
	 * is read: reading and writing one took the control plane up to a
	 * minute and gigabytes, and the quota was checked only after that (the
	 * check asks room for one byte: at its quota to the byte, a tree it holds
	 * already is refused too) */
	if ((status = templates_quota_locked(cp, st, tenant, "", 1, true, answer)) != 0)
		return status;
	cp_store_rollback(st);
	status = 500;
	snprintf(spool, sizeof spool, "%s/tmp", cp->store_dir);
	snprintf(canon, sizeof canon, "%s/tmp/canon-XXXXXX", cp->store_dir);
	int fd = mkstemp(canon);
	if (fd < 0) {
		*answer = cp_error("store", strerror(errno));
		return 500;
	}
	close(fd);
	if ((r = spaced_rootfs_new(&cp->template_limits, spool, &t, why, sizeof why)) < 0 ||
	    (r = spaced_rootfs_import(t, upload, &config, &format, why, sizeof why)) < 0 ||
	    (r = spaced_rootfs_write(t, canon, &info, why, sizeof why)) < 0) {
		if (r == SPACED_EFORMAT || r == SPACED_ETOOBIG) {
			status = r == SPACED_ETOOBIG ? 413 : 422;
			*answer = cp_error(r == SPACED_ETOOBIG ? "template-too-large" : "template-refused", why);
		} else {
			*answer = cp_error("import", why[0] ? why : spaced_strerror(r));
		}
		goto out;
	}
	if (config)
		cfg_text = json_dumps(config, JSON_COMPACT);
	/* what it counts in the templates quota: its files' sizes, or what the
	 * store holds for it when that is more (as a built tree counts: its
	 * archive). 200,000 empty files counted 2 MB of content and the store
	 * held 310 MB of headers for them. */
	struct stat sb;
	int64_t held = (int64_t)info.bytes;
	if (stat(canon, &sb) == 0 && (int64_t)sb.st_size > held)
		held = (int64_t)sb.st_size;
	pthread_mutex_lock(&archive_lock);
	if ((status = template_insert(cp, st, tenant, name, info.hash, held, (int64_t)info.entries, cfg_text, format,
	                              answer)) != 201) {
		pthread_mutex_unlock(&archive_lock);
		goto out;
	}
	/* one archive per tree, whoever imported it; published once a template
	 * names it, so that no sweep (template_gc) finds it unnamed meanwhile */
	snprintf(final, sizeof final, "%s/templates/%s.tar", cp->store_dir, info.hash);
	/* the first archive of a tree stays: another tenant's import of the
	 * same tree (its times may differ: they are not in the hash) replaced
	 * the archive every tenant's sandboxes of that tree are made from */
	if (renameat2(AT_FDCWD, canon, AT_FDCWD, final, RENAME_NOREPLACE) < 0) {
		if (errno != EEXIST) {
			status = 500;
			*answer = cp_error("store", strerror(errno));
			CP_Q(st, NULL, NULL, "DELETE FROM templates WHERE tenant = $1 AND name = $2", tenant, name);
			pthread_mutex_unlock(&archive_lock);
			goto out;
		}
		unlink(canon);
	}
	pthread_mutex_unlock(&archive_lock);
	canon[0] = 0;
	*answer = json_pack("{s:s,s:s,s:I,s:I,s:s,s:I,s:I,s:o}", "name", name, "hash", info.hash, "bytes",
	                    (json_int_t)held, "entries", (json_int_t)info.entries, "source", format, "dropped",
	                    (json_int_t)info.dropped, "setid_cleared", (json_int_t)info.cleared, "config",
	                    config ? json_incref(config) : json_object());
	status = 201;
out:
	if (canon[0])
		unlink(canon);
	spaced_rootfs_free(t);
	json_decref(config);
	free(cfg_text);
	return status;
}

/* Whether hash is named by a template or a sandbox not deleted (with
 * steps: or by a cached build step); true when the store cannot tell. */
static bool tree_pinned(struct cp_store *st, const char *hash, bool steps)
{
	struct cp_rows *rows = NULL;
	bool pinned = CP_Q(st, &rows, NULL,
	                   steps ? "SELECT (SELECT COUNT(*) FROM templates WHERE hash = $1) + "
	                           "(SELECT COUNT(*) FROM sandboxes WHERE template_hash = $1 AND deleted = 0) + "
	                           "(SELECT COUNT(*) FROM build_steps WHERE hash = $1)"
	                         : "SELECT (SELECT COUNT(*) FROM templates WHERE hash = $1) + "
	                           "(SELECT COUNT(*) FROM sandboxes WHERE template_hash = $1 AND deleted = 0)",
	                   hash) < 0 ||
	              cp_rows_i64(rows, 0, 0, 1) != 0;
	cp_rows_free(rows);
	return pinned;
}


/* A test's window between a remover's check and its unlink (milliseconds,
 * SPACED_CP_TEST_REMOVE_DELAY_MS, 10 s at most; tests/cp_template_race.t.sh),
 * logged as it opens. */
static void remove_delay(const char *hash)
{
	const char *d = getenv("SPACED_CP_TEST_REMOVE_DELAY_MS");
	long ms = d ? strtol(d, NULL, 10) : 0;
	if (ms <= 0)
		return;
	if (ms > 10000)
		ms = 10000;
	spaced_log("spaced-cp", "level=warn event=test-remove-delay hash=%s ms=%ld", hash, ms);
	usleep((useconds_t)ms * 1000);
}

/* With archive_lock held: removes the archive of hash when no template, no
 * live sandbox and no cached build step names it; true when it removed it. */
static bool archive_remove_locked(struct cp *cp, struct cp_store *st, const char *hash)
{
	if (tree_pinned(st, hash, true))
		return false;
	remove_delay(hash);
	char p[PATH_MAX];
	snprintf(p, sizeof p, "%s/templates/%s.tar", cp->store_dir, hash);
	return unlink(p) == 0;
}

/* Removes the archive of hash when nothing names it (archive_lock taken here). */
static void template_gc(struct cp *cp, struct cp_store *st, const char *hash)
{
	pthread_mutex_lock(&archive_lock);
	(void)archive_remove_locked(cp, st, hash);
	pthread_mutex_unlock(&archive_lock);
}

int cp_templates_api(struct cp *cp, struct cp_store *st, const char *tenant, const char *method, char **seg, int n,
                     json_t **out)
{
	int get = strcmp(method, "GET") == 0, del = strcmp(method, "DELETE") == 0;
	struct cp_rows *rows = NULL;
	int r;
	if (strcmp(seg[1], "store") == 0) {
		if (n != 2 || !get) {
			*out = cp_error("method-not-allowed", "GET /v1/store");
			return 405;
		}
		*out = json_pack("{s:s}", "url", cp->store_url);
		return 200;
	}
	if (n == 2 && get) {
		if ((r = CP_Q(st, &rows, NULL, "SELECT " TEMPLATE_COLS " FROM templates WHERE tenant = $1 ORDER BY name",
		              tenant)) < 0) {
			*out = cp_error("store", spaced_strerror(r));
			return 503;
		}
		json_t *a = json_array();
		for (int i = 0; i < rows->nrows; i++)
			json_array_append_new(a, template_row_json(rows, i));
		cp_rows_free(rows);
		*out = json_pack("{s:o}", "templates", a);
		return 200;
	}
	if (n != 3 || !spaced_name_valid(seg[2], strlen(seg[2]))) {
		*out = cp_error("not-found", "no such endpoint");
		return 404;
	}
	if ((r = CP_Q(st, &rows, NULL, "SELECT " TEMPLATE_COLS " FROM templates WHERE tenant = $1 AND name = $2", tenant,
	              seg[2])) < 0) {
		*out = cp_error("store", spaced_strerror(r));
		return 503;
	}
	if (rows->nrows != 1) {
		cp_rows_free(rows);
		*out = cp_error("template-not-found", "no template of this name");
		return 404;
	}
	if (get) {
		*out = template_row_json(rows, 0);
		cp_rows_free(rows);
		return 200;
	}
	if (del) {
		char hash[SPACED_TREEHASH_HEX];
		snprintf(hash, sizeof hash, "%s", cp_rows_get(rows, 0, 1));
		cp_rows_free(rows);
		if ((r = CP_Q(st, NULL, NULL, "DELETE FROM templates WHERE tenant = $1 AND name = $2", tenant, seg[2])) < 0) {
			*out = cp_error("store", spaced_strerror(r));
			return 503;
		}
		/* sandboxes made from it keep their tree: it stays while one lives */
		template_gc(cp, st, hash);
		*out = json_pack("{s:s,s:s}", "name", seg[2], "state", "deleted");
		return 200;
	}
	cp_rows_free(rows);
	*out = cp_error("method-not-allowed", "GET, POST or DELETE");
	return 405;
}

/* ---- template builds (docs/templates.md, "Spacefiles") ----
 * spacectl template build drives a build step by step: each RUN or COPY runs
 * in a build sandbox of the tenant made from the step's parent tree (by
 * hash), then the sandbox's snapshot — its overlay upper directory — is
 * merged onto the parent into a new canonical tree (rootfs.h, kind UPPER),
 * recorded in build_steps under (tenant, parent, step): a later build of
 * the same step on the same parent takes it from there. */

int cp_template_owned(struct cp_store *st, const char *tenant, const char *hash, json_t **tmpl, json_t **err)
{
	struct cp_rows *rows = NULL;
	int r = CP_Q(st, &rows, NULL,
	             "SELECT config FROM templates WHERE tenant = $1 AND hash = $2 UNION ALL "
	             "SELECT config FROM build_steps WHERE (tenant = $1 OR tenant = '') AND hash = $2",
	             tenant, hash);
	if (r < 0) {
		*err = cp_error("store", spaced_strerror(r));
		return 503;
	}
	if (rows->nrows < 1) {
		cp_rows_free(rows);
		*err = cp_error("template-not-found", "no template or build step of this tenant has this hash");
		return 404;
	}
	json_error_t jerr;
	const char *cfg = cp_rows_get(rows, 0, 0);
	json_t *c = cfg ? json_loads(cfg, JSON_REJECT_DUPLICATES, &jerr) : NULL;
	*tmpl = json_pack("{s:s,s:s,s:o}", "name", "(build)", "hash", hash, "config", c ? c : json_object());
	cp_rows_free(rows);
	return *tmpl ? 0 : 500;
}

/* A canonical archive of the tree t, written to a temporary file of the
 * store (its path into tmp, PATH_MAX) for publish_locked; its hash into
 * hash. On an error nothing is left. */
static int store_tree(struct cp *cp, struct spaced_rootfs *t, char hash[SPACED_TREEHASH_HEX], char *tmp,
                      char *why, size_t whysz)
{
	struct spaced_rootfs_info info;
	snprintf(tmp, PATH_MAX, "%s/tmp/tree-XXXXXX", cp->store_dir);
	int fd = mkstemp(tmp);
	if (fd < 0) {
		snprintf(why, whysz, "%s", strerror(errno));
		tmp[0] = 0;
		return SPACED_ESYS;
	}
	close(fd);
	int r = spaced_rootfs_write(t, tmp, &info, why, whysz);
	if (r == 0)
		memcpy(hash, info.hash, SPACED_TREEHASH_HEX);
	else
		unlink(tmp);
	return r;
}

/* With archive_lock held: the archive store_tree wrote at tmp becomes the
 * store's archive of hash, unless the store has one already (the first
 * stays: a worker may be resuming its download); tmp is gone after. The
 * archive's size, -1 when it cannot be put there. */
static int64_t tree_bytes(struct cp *cp, const char *hash);

static int64_t publish_locked(struct cp *cp, const char *tmp, const char *hash)
{
	char final[PATH_MAX];
	snprintf(final, sizeof final, "%s/templates/%s.tar", cp->store_dir, hash);
	if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_NOREPLACE) < 0) {
		int e = errno;
		unlink(tmp);
		if (e != EEXIST) {
			spaced_log("spaced-cp", "level=error event=store-publish-failed hash=%s reason=\"%s\"", hash,
			           strerror(e));
			return -1;
		}
	}
	return tree_bytes(cp, hash);
}

/* A build step's last use: `created` is when it was last recorded or taken
 * from the cache (cp_build_cache_sweep evicts the least recently used). */
static void touch_step(struct cp_store *st, const char *tenant, const char *parent, const char *step)
{
	char now[24];
	cp_store_relaxed(st, 1);
	CP_Q(st, NULL, NULL, "UPDATE build_steps SET created = $4 WHERE tenant = $1 AND parent = $2 AND step = $3", tenant,
	     parent, step, cp_i64(now, spaced_now()));
	cp_store_relaxed(st, 0);
}

/* The size of the store's archive of hash (what a built tree counts for in
 * a templates quota), -1 when it is not there. */
static int64_t tree_bytes(struct cp *cp, const char *hash)
{
	char p[PATH_MAX];
	struct stat sb;
	snprintf(p, sizeof p, "%s/templates/%s.tar", cp->store_dir, hash);
	return stat(p, &sb) == 0 ? (int64_t)sb.st_size : -1;
}

/* Records a build step whose tree's archive is bytes (counted in the
 * tenant's templates quota, cp_templates_held). */
static int record_step(struct cp_store *st, const char *tenant, const char *parent, const char *step,
                       const char *hash, const char *config, int64_t bytes)
{
	char now[24], b[24];
	return CP_Q(st, NULL, NULL,
	            "INSERT INTO build_steps (tenant, parent, step, hash, config, created, bytes) "
	            "VALUES ($1, $2, $3, $4, $5, $6, $7) "
	            "ON CONFLICT (tenant, parent, step) DO UPDATE SET hash = $4, config = $5, created = $6, bytes = $7",
	            tenant, parent, step, hash, config, cp_i64(now, spaced_now()), cp_i64(b, bytes));
}

/* Builds a minimal Debian suite with mmdebstrap into a tarball, then a tree. */
static int debian_base(struct cp *cp, const char *suite, char hash[SPACED_TREEHASH_HEX], char *tmp, char *why,
                       size_t whysz)
{
	char tarp[PATH_MAX], spool[PATH_MAX], log[PATH_MAX];
	snprintf(spool, sizeof spool, "%s/tmp", cp->store_dir);
	snprintf(tarp, sizeof tarp, "%s/tmp/debian-%s-%d.tar", cp->store_dir, suite, (int)getpid());
	snprintf(log, sizeof log, "%s/tmp/debian-%s.log", cp->store_dir, suite);
	unlink(tarp);
	pid_t pid = fork();
	if (pid < 0)
		return SPACED_ESYS;
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600), in = open("/dev/null", O_RDONLY);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		if (in >= 0)
			dup2(in, 0);
		/* a clean start: the control plane's threads block and ignore signals
		 * that apt and dpkg rely on */
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		for (int sig = 1; sig < 32; sig++)
			if (sig != SIGKILL && sig != SIGSTOP)
				signal(sig, SIG_DFL);
		setsid();
		/* nothing of the control plane's (its sockets, its database) */
		syscall(SYS_close_range, 3, ~0u, 0);
		/* Debian's own tool, from the package archive this machine reaches;
		 * the suite comes from a fixed list, nothing else of the request */
		execlp("mmdebstrap", "mmdebstrap", "--variant=minbase", "--quiet", suite, tarp, (char *)NULL);
		_exit(127);
	}
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return SPACED_ESYS;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		snprintf(why, whysz, "mmdebstrap %s failed (exit %d; the package archive may be unreachable: %.200s)", suite,
		         WIFEXITED(status) ? WEXITSTATUS(status) : -1, log);
		unlink(tarp);
		return SPACED_EIO;
	}
	struct spaced_rootfs *t = NULL;
	int r = spaced_rootfs_new(&cp->template_limits, spool, &t, why, whysz);
	if (r == 0)
		r = spaced_rootfs_add_archive(t, tarp, SPACED_ROOTFS_TARBALL, why, whysz);
	if (r == 0)
		r = store_tree(cp, t, hash, tmp, why, whysz);
	spaced_rootfs_free(t);
	unlink(tarp);
	return r;
}

/* One build of each base (FROM debian:SUITE or scratch) at a time: two
 * tenants asking for the same suite at once had two mmdebstrap runs write one
 * file, and one of them failed (or could have taken the other's half-written
 * archive); the second now finds the first one's tree. One lock per base
 * (base_suites' order, then scratch): a suite's minutes-long build holds up
 * no other. */
static const char *const base_suites[] = {"bookworm", "trixie", "bullseye"};
static pthread_mutex_t base_lock[4] = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
                                       PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER};

/* FROM debian:SUITE or scratch: the shared tree, built once (base_lock held). */
static int base_step(struct cp *cp, struct cp_store *st, const char *from, bool scratch, json_t **out)
{
	char why[512] = "", hash[SPACED_TREEHASH_HEX], step[64], tmp[PATH_MAX];
	struct cp_rows *rows = NULL;
	int r;
	snprintf(step, sizeof step, "FROM %s", from);
	/* Debian's public content: built once for every tenant */
	if ((r = CP_Q(st, &rows, NULL, "SELECT hash FROM build_steps WHERE tenant = '' AND parent = '' AND step = $1",
	              step)) < 0) {
		*out = cp_error("store", spaced_strerror(r));
		return 503;
	}
	if (rows->nrows == 1) {
		char p[PATH_MAX];
		snprintf(hash, sizeof hash, "%s", cp_rows_get(rows, 0, 0));
		snprintf(p, sizeof p, "%s/templates/%s.tar", cp->store_dir, hash);
		if (access(p, F_OK) == 0) {
			cp_rows_free(rows);
			touch_step(st, "", "", step);
			*out = json_pack("{s:s,s:b,s:o}", "hash", hash, "cached", 1, "config", json_object());
			return 200;
		}
	}
	cp_rows_free(rows);
	if (scratch) {
		struct spaced_rootfs *t = NULL;
		char spool[PATH_MAX];
		snprintf(spool, sizeof spool, "%s/tmp", cp->store_dir);
		r = spaced_rootfs_new(&cp->template_limits, spool, &t, why, sizeof why);
		if (r == 0)
			r = store_tree(cp, t, hash, tmp, why, sizeof why);
		spaced_rootfs_free(t);
	} else {
		r = debian_base(cp, from + 7, hash, tmp, why, sizeof why);
	}
	if (r < 0) {
		*out = cp_error("build-failed", why[0] ? why : spaced_strerror(r));
		return 502;
	}
	pthread_mutex_lock(&archive_lock);
	int64_t bytes = publish_locked(cp, tmp, hash);
	if (bytes < 0) {
		pthread_mutex_unlock(&archive_lock);
		*out = cp_error("store", "the base's tree is not in the store");
		return 503;
	}
	r = record_step(st, "", "", step, hash, "{}", bytes);
	pthread_mutex_unlock(&archive_lock);
	if (r < 0) {
		*out = cp_error("store", spaced_strerror(r));
		return 503;
	}
	*out = json_pack("{s:s,s:b,s:o}", "hash", hash, "cached", 0, "config", json_object());
	return 200;
}

int cp_build_from(struct cp *cp, struct cp_store *st, const char *tenant, const char *from, json_t **out)
{
	if (strcmp(from, "scratch") == 0 || strncmp(from, "debian:", 7) == 0) {
		bool scratch = strcmp(from, "scratch") == 0;
		size_t k = scratch ? 3 : 0;
		while (!scratch && k < 3 && strcmp(from + 7, base_suites[k]) != 0)
			k++;
		if (k == 3 && !scratch) {
			*out = cp_error("bad-request", "FROM takes debian:bookworm (trixie, bullseye), scratch or a template name");
			return 400;
		}
		pthread_mutex_lock(&base_lock[k]);
		int status = base_step(cp, st, from, scratch, out);
		pthread_mutex_unlock(&base_lock[k]);
		return status;
	}
	if (!spaced_name_valid(from, strlen(from))) {
		*out = cp_error("bad-request", "FROM takes debian:bookworm, scratch or a template name");
		return 400;
	}
	json_t *t = NULL;
	int status = cp_template_resolve(st, tenant, from, &t, out);
	if (status != 0)
		return status;
	*out = json_pack("{s:O,s:b,s:O}", "hash", json_object_get(t, "hash"), "cached", 1, "config",
	                 json_object_get(t, "config"));
	json_decref(t);
	return 200;
}

/* The snapshot archive of sandbox (its last snapshot) in this store. */
static int snapshot_file(struct cp *cp, struct cp_store *st, const char *tenant, const char *id, char *path,
                         size_t pathsz)
{
	json_t *s = cp_sandbox_json(st, tenant, id);
	const char *url = json_string_value(json_object_get(s, "snapshot"));
	const char *name = url ? strstr(url, "/v1/blobs/snapshots/") : NULL;
	int r = SPACED_ENOENT;
	if (name && spaced_name_valid(name + 20, strlen(name + 20))) {
		snprintf(path, pathsz, "%s/snapshots/%s.tar", cp->store_dir, name + 20);
		r = 0;
	}
	json_decref(s);
	return r;
}

/* A built template's configuration (ENV, WORKDIR, USER) is bounded as an
 * imported image's (SPACED_ROOTFS_CONFIG_MAX): true, with *out a 413 answer,
 * when config is longer. */
static bool config_too_large(json_t *config, json_t **out)
{
	char *text = config ? json_dumps(config, JSON_COMPACT) : NULL;
	size_t n = text ? strlen(text) : 0;
	free(text);
	if (n <= SPACED_ROOTFS_CONFIG_MAX)
		return false;
	char m[160];
	snprintf(m, sizeof m, "the template's configuration (ENV, WORKDIR, USER) is %zu bytes: one is at most %u", n,
	         SPACED_ROOTFS_CONFIG_MAX);
	*out = cp_error("template-too-large", m);
	return true;
}

/* A tenant's build steps are committed one at a time on a control plane
 * (one more waits its turn, COMMIT_WAIT_S at most; any other is 503 at
 * once, so a tenant's burst parks no request threads): each writes a whole
 * tree into the store before its quota can count it, so six at once took a
 * tenant to twice its templates quota on the disk every tenant's snapshots
 * and the database share. One at a time, a commit's tree is also bounded by
 * the room its quota has left (commit_limits). */
#define COMMIT_WAIT_S 300
#define COMMITS_MAX 64 /* tenants committing at once (more: 503) */

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct commit_turn {
		char tenant[SPACED_NAME_MAX];
		bool running;
		bool waiting;
	} t[COMMITS_MAX];
	int n;
} commits = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {{{0}, false, false}}, 0};

/* Takes tenant's turn to commit: true once it has it; false when another of
 * its commits waits already, when COMMITS_MAX tenants commit, or after
 * COMMIT_WAIT_S. */
static bool commit_take(const char *tenant)
{
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += COMMIT_WAIT_S;
	pthread_mutex_lock(&commits.mu);
	struct commit_turn *c = NULL;
	for (int i = 0; i < commits.n && !c; i++)
		if (strcmp(commits.t[i].tenant, tenant) == 0)
			c = &commits.t[i];
	bool got = false;
	if (!c && commits.n < COMMITS_MAX) {
		c = &commits.t[commits.n++];
		snprintf(c->tenant, sizeof c->tenant, "%s", tenant);
		c->running = got = true;
		c->waiting = false;
	} else if (c && !c->waiting) {
		c->waiting = true;
		int w = 0;
		while (c->running && w != ETIMEDOUT) {
			w = pthread_cond_timedwait(&commits.cv, &commits.mu, &until);
			/* the table may have been compacted: find the tenant's turn again */
			c = NULL;
			for (int i = 0; i < commits.n && !c; i++)
				if (strcmp(commits.t[i].tenant, tenant) == 0)
					c = &commits.t[i];
		}
		c->waiting = false;
		c->running = got = !c->running;
	}
	pthread_mutex_unlock(&commits.mu);
	return got;
}

static void commit_release(const char *tenant)
{
	pthread_mutex_lock(&commits.mu);
	for (int i = 0; i < commits.n; i++)
		if (strcmp(commits.t[i].tenant, tenant) == 0) {
			commits.t[i].running = false;
			if (!commits.t[i].waiting)
				commits.t[i] = commits.t[--commits.n];
			break;
		}
	pthread_cond_broadcast(&commits.cv);
	pthread_mutex_unlock(&commits.mu);
}

/* The bounds of a commit's tree: the store's, and no more content than the
 * tenant's templates quota has room for beside the parent's archive
 * (*quota_bound then): a step that changes nothing, or makes a tree the
 * tenant holds already, costs no room and must still be read. 0, or 503
 * with *out. */
static int commit_limits(struct cp *cp, struct cp_store *st, const char *tenant, const char *parent,
                         struct spaced_rootfs_limits *lim, bool *quota_bound, json_t **out)
{
	struct cp_quota limit, used;
	int64_t held = 0;
	*lim = cp->template_limits;
	*quota_bound = false;
	int r = cp_quota_usage(cp, st, tenant, 0, &limit, &used);
	if (r == 0)
		r = cp_templates_held(st, tenant, &held);
	if (r < 0) {
		*out = cp_error("store", spaced_strerror(r));
		return 503;
	}
	if (limit.templates > 0) {
		int64_t pb = tree_bytes(cp, parent);
		uint64_t room = (held < limit.templates ? (uint64_t)(limit.templates - held) : 0) + (uint64_t)(pb > 0 ? pb : 0);
		if (room < lim->max_bytes) {
			lim->max_bytes = room;
			*quota_bound = true;
		}
	}
	return 0;
}

static int build_commit_turn(struct cp *cp, struct cp_store *st, const char *tenant, json_t *req, json_t **out);

static int build_commit(struct cp *cp, struct cp_store *st, const char *tenant, json_t *req, json_t **out)
{
	if (!commit_take(tenant)) {
		*out = cp_error("busy", "this tenant's build steps are being committed (one at a time, one more waiting): "
		                        "try again shortly");
		return 503;
	}
	int status = build_commit_turn(cp, st, tenant, req, out);
	commit_release(tenant);
	return status;
}

static int build_commit_turn(struct cp *cp, struct cp_store *st, const char *tenant, json_t *req, json_t **out)
{
	const char *id = json_string_value(json_object_get(req, "sandbox"));
	const char *parent = json_string_value(json_object_get(req, "parent"));
	const char *step = json_string_value(json_object_get(req, "step"));
	json_t *config = json_object_get(req, "config");
	char why[512] = "", parent_tar[PATH_MAX], snap[PATH_MAX], spool[PATH_MAX], hash[SPACED_TREEHASH_HEX],
	    tmp[PATH_MAX];
	json_t *b = NULL;
	if (!id || !spaced_name_valid(id, strlen(id)) || !parent || !spaced_treehash_hex_valid(parent) || !step ||
	    strlen(step) > 16384 || (config && !json_is_object(config))) {
		*out = cp_error("bad-request", "commit wants {\"sandbox\", \"parent\" (a tree hash), \"step\", \"config\"}");
		return 400;
	}
	if (config_too_large(config, out))
		return 413;
	json_t *owned = NULL;
	int status = cp_template_owned(st, tenant, parent, &owned, out);
	json_decref(owned);
	if (status != 0)
		return status;
	/* its filesystem, as the sandbox left it: paused, snapshotted into the store */
	status = cp_op_simple(cp, st, tenant, id, "pause", NULL, &b);
	json_decref(b);
	b = NULL;
	if (status >= 300) {
		*out = cp_error("build-failed", "the build sandbox could not be paused");
		return status;
	}
	status = cp_op_simple(cp, st, tenant, id, "snapshot", NULL, &b);
	json_decref(b);
	if (status >= 300 || snapshot_file(cp, st, tenant, id, snap, sizeof snap) < 0) {
		*out = cp_error("build-failed", "the build sandbox could not be snapshotted");
		return status >= 300 ? status : 502;
	}
	snprintf(parent_tar, sizeof parent_tar, "%s/templates/%s.tar", cp->store_dir, parent);
	snprintf(spool, sizeof spool, "%s/tmp", cp->store_dir);
	struct spaced_rootfs *t = NULL;
	struct spaced_rootfs_limits lim;
	bool quota_bound = false;
	if ((status = commit_limits(cp, st, tenant, parent, &lim, &quota_bound, out)) != 0)
		return status;
	int r = spaced_rootfs_new(&lim, spool, &t, why, sizeof why);
	if (r == 0)
		r = spaced_rootfs_add_archive(t, parent_tar, SPACED_ROOTFS_TEMPLATE, why, sizeof why);
	if (r == 0)
		r = spaced_rootfs_add_archive(t, snap, SPACED_ROOTFS_UPPER, why, sizeof why);
	if (r == 0)
		r = store_tree(cp, t, hash, tmp, why, sizeof why);
	spaced_rootfs_free(t);
	if (r == SPACED_ETOOBIG && quota_bound) {
		/* refused while read, before its tree was written */
		char m[800];
		snprintf(m, sizeof m, "the step's tree holds more than the %llu bytes the tenant's templates_bytes quota has "
		         "room for (%s)", (unsigned long long)lim.max_bytes, why);
		*out = json_pack("{s:s,s:s,s:s}", "error", "quota-exceeded", "message", m, "quota", "templates_bytes");
		return 429;
	}
	if (r < 0) {
		*out = cp_error("build-failed", why[0] ? why : spaced_strerror(r));
		return r == SPACED_ETOOBIG ? 413 : 422;
	}
	/* the step's tree counts in the tenant's templates quota: past it the
	 * step is not recorded and its tree leaves the store (unless named) */
	pthread_mutex_lock(&archive_lock);
	int64_t bytes = publish_locked(cp, tmp, hash);
	if (bytes < 0) {
		pthread_mutex_unlock(&archive_lock);
		*out = cp_error("store", "the step's tree is not in the store");
		return 503;
	}
	if ((status = templates_quota_locked(cp, st, tenant, hash, bytes, false, out)) != 0) {
		(void)archive_remove_locked(cp, st, hash);
		pthread_mutex_unlock(&archive_lock);
		return status;
	}
	char *cfg = json_dumps(config ? config : json_object(), JSON_COMPACT | JSON_SORT_KEYS);
	r = record_step(st, tenant, parent, step, hash, cfg, bytes);
	free(cfg);
	if (r == 0)
		r = cp_store_commit(st);
	else
		cp_store_rollback(st);
	pthread_mutex_unlock(&archive_lock);
	if (r < 0) {
		*out = cp_error("store", spaced_strerror(r));
		return 503;
	}
	*out = json_pack("{s:s}", "hash", hash);
	return 200;
}

int cp_builds_api(struct cp *cp, struct cp_store *st, const char *tenant, const char *method, char **seg, int n,
                  const char *body, size_t blen, json_t **out)
{
	json_error_t jerr;
	if (strcmp(method, "POST") != 0 || n != 3) {
		*out = cp_error("not-found", "POST /v1/builds/lookup | /v1/builds/commit");
		return 404;
	}
	json_t *req = json_loadb(body ? body : "{}", body ? blen : 2, JSON_REJECT_DUPLICATES, &jerr);
	int status;
	if (!json_is_object(req)) {
		json_decref(req);
		*out = cp_error("bad-request", "a JSON object");
		return 400;
	}
	if (strcmp(seg[2], "lookup") == 0) {
		const char *parent = json_string_value(json_object_get(req, "parent"));
		const char *step = json_string_value(json_object_get(req, "step"));
		struct cp_rows *rows = NULL;
		if (!parent || !step) {
			*out = cp_error("bad-request", "lookup wants {\"parent\", \"step\"}");
			status = 400;
		} else if (CP_Q(st, &rows, NULL, "SELECT hash, config FROM build_steps WHERE tenant = $1 AND parent = $2 AND step = $3",
		                tenant, parent, step) < 0) {
			*out = cp_error("store", "store unavailable");
			status = 503;
		} else if (rows->nrows != 1) {
			*out = cp_error("not-found", "no such step built yet");
			status = 404;
		} else {
			char p[PATH_MAX];
			snprintf(p, sizeof p, "%s/templates/%s.tar", cp->store_dir, cp_rows_get(rows, 0, 0));
			const char *cfg = cp_rows_get(rows, 0, 1);
			json_t *c = cfg ? json_loads(cfg, JSON_REJECT_DUPLICATES, &jerr) : NULL;
			if (access(p, F_OK) != 0) {
				json_decref(c);
				*out = cp_error("not-found", "the step's tree is gone from the store");
				status = 404;
			} else {
				*out = json_pack("{s:s,s:o}", "hash", cp_rows_get(rows, 0, 0), "config", c ? c : json_object());
				status = 200;
				touch_step(st, tenant, parent, step);
			}
		}
		cp_rows_free(rows);
	} else if (strcmp(seg[2], "commit") == 0) {
		status = build_commit(cp, st, tenant, req, out);
	} else {
		*out = cp_error("not-found", "POST /v1/builds/lookup | /v1/builds/commit");
		status = 404;
	}
	json_decref(req);
	return status;
}

int cp_template_name(struct cp *cp, struct cp_store *st, const char *tenant, const char *name, const char *body,
                     size_t blen, json_t **out)
{
	json_error_t jerr;
	json_t *req = json_loadb(body ? body : "{}", body ? blen : 2, JSON_REJECT_DUPLICATES, &jerr), *t = NULL;
	const char *hash = json_string_value(json_object_get(req, "hash"));
	json_t *config = json_object_get(req, "config");
	int status;
	if (!hash || !spaced_treehash_hex_valid(hash) || (config && !json_is_object(config))) {
		json_decref(req);
		*out = cp_error("bad-request", "POST /v1/templates/NAME wants {\"hash\", \"config\"}");
		return 400;
	}
	if (config_too_large(config, out)) {
		json_decref(req);
		return 413;
	}
	if ((status = cp_template_owned(st, tenant, hash, &t, out)) != 0) {
		json_decref(req);
		return status;
	}
	json_decref(t);
	char *cfg = config ? json_dumps(config, JSON_COMPACT | JSON_SORT_KEYS) : strdup("{}"), hb[65];
	snprintf(hb, sizeof hb, "%s", hash); /* hash belongs to req, freed below */
	hash = hb;
	/* a built tree counts by its archive's size */
	pthread_mutex_lock(&archive_lock);
	int64_t bytes = tree_bytes(cp, hash);
	if (bytes < 0) {
		pthread_mutex_unlock(&archive_lock);
		free(cfg);
		json_decref(req);
		*out = cp_error("template-not-found", "the tree is gone from the store (build it again)");
		return 404;
	}
	status = cfg ? template_insert(cp, st, tenant, name, hash, bytes, 0, cfg, "build", out) : 500;
	pthread_mutex_unlock(&archive_lock);
	free(cfg);
	json_decref(req);
	if (status == 201)
		*out = json_pack("{s:s,s:s}", "name", name, "hash", hash);
	else if (status == 500)
		*out = cp_error("internal", "out of memory");
	return status;
}

/* ---- the build cache's bound (cp.h cp_build_cache_sweep; the reaper's thread) ---- */


/* One tenant's step trees in the sweep: what it holds of the cache. */
struct sweep_tenant {
	const char *id; /* "" for the bases every tenant builds on (FROM debian:…, scratch) */
	uint64_t held;  /* bytes of the unnamed trees its steps name, a shared tree's split between its holders */
	int next;       /* its least recently used step not looked at yet, in this round */
};

/* One (tenant, tree) of the build cache, and its last use by that tenant. */
struct sweep_step {
	int tenant, tree; /* indexes into the sweep's tenants and trees */
	int64_t used;
	bool done;
};

/* The index of name in names[0..*n), added at the end when it is not there. */
static int sweep_index(const char **names, int *n, const char *name)
{
	for (int i = 0; i < *n; i++)
		if (strcmp(names[i], name) == 0)
			return i;
	names[*n] = name;
	return (*n)++;
}

/* The sweep's rounds, in order: a tenant's own trees; then the bases;
 * then trees several tenants' steps name (every holder's steps go). */
enum sweep_round { SWEEP_OWN, SWEEP_BASES, SWEEP_SHARED };

/* Whether step k may go in round r. */
static bool sweep_may(const struct sweep_tenant *tn, const struct sweep_step *s, const bool *pinned,
                      const int *holders, int64_t cutoff, enum sweep_round r)
{
	if (s->done || pinned[s->tree] || s->used > cutoff)
		return false;
	bool base = tn[s->tenant].id[0] == 0, shared = holders[s->tree] > 1;
	return r == SWEEP_SHARED ? shared : !shared && base == (r == SWEEP_BASES);
}

/* The tenant to take a step from in round r: the one holding the most of
 * the cache among those with a step that may go. -1 when none. */
static int sweep_pick(struct sweep_tenant *tn, int ntn, struct sweep_step *sp, int nsp, const bool *pinned,
                      const int *holders, int64_t cutoff, enum sweep_round r)
{
	int best = -1;
	for (int t = 0; t < ntn; t++) {
		int *k = &tn[t].next;
		while (*k < nsp && (sp[*k].tenant != t || !sweep_may(tn, &sp[*k], pinned, holders, cutoff, r)))
			(*k)++;
		if (*k < nsp && (best < 0 || tn[t].held > tn[best].held))
			best = t;
	}
	return best;
}

int cp_build_cache_sweep(struct cp *cp, struct cp_store *st)
{
	struct cp_rows *rows = NULL;
	/* every tenant's cached trees with their last use, the least recently used first */
	if (CP_Q0(st, &rows, NULL,
	          "SELECT tenant, hash, MAX(created) FROM build_steps GROUP BY tenant, hash ORDER BY 3, 1, 2") < 0)
		return 0;
	int n = rows->nrows, removed = 0, ntr = 0, ntn = 0;
	const char **trees = calloc((size_t)n + 1, sizeof *trees), **tenants = calloc((size_t)n + 1, sizeof *tenants);
	struct sweep_step *sp = calloc((size_t)n + 1, sizeof *sp);
	struct sweep_tenant *tn = calloc((size_t)n + 1, sizeof *tn);
	uint64_t *size = calloc((size_t)n + 1, sizeof *size), total = 0, freed = 0, all = 0;
	bool *pinned = calloc((size_t)n + 1, sizeof *pinned);
	int *holders = calloc((size_t)n + 1, sizeof *holders);
	bool ok = trees && tenants && sp && tn && size && pinned && holders;
	for (int i = 0; ok && i < n; i++) {
		const char *t = cp_rows_get(rows, i, 0), *h = cp_rows_get(rows, i, 1);
		if (!t || !h) {
			sp[i].done = true;
			continue;
		}
		sp[i].tenant = sweep_index(tenants, &ntn, t);
		int before = ntr;
		sp[i].tree = sweep_index(trees, &ntr, h);
		sp[i].used = cp_rows_i64(rows, i, 2, INT64_MAX);
		holders[sp[i].tree]++; /* rows are one per (tenant, tree) */
		if (ntr > before) { /* the sizes first: under the bound (the usual case) nothing more is asked */
			char p[PATH_MAX];
			struct stat sb;
			snprintf(p, sizeof p, "%s/templates/%s.tar", cp->store_dir, h);
			if (stat(p, &sb) == 0)
				all += (size[sp[i].tree] = (uint64_t)sb.st_size);
		}
	}
	if (ok && all > cp->build_cache_max) {
		for (int k = 0; k < ntr; k++) {
			pinned[k] = size[k] == 0 || tree_pinned(st, trees[k], false);
			if (!pinned[k])
				total += size[k];
		}
		for (int t = 0; t < ntn; t++)
			tn[t].id = tenants[t];
		for (int i = 0; i < n; i++)
			if (!sp[i].done && !pinned[sp[i].tree])
				tn[sp[i].tenant].held += size[sp[i].tree] / (uint64_t)holders[sp[i].tree];
	}
	/* fair to tenants: a step goes from whoever holds the most of the cache,
	 * its least recently used first, so one tenant building in a loop evicts
	 * its own steps before anyone else's; the bases every tenant builds on
	 * and the trees several tenants share go only once no tenant's own tree
	 * is left to take (taking one holder's step of a shared tree frees nothing) */
	int64_t cutoff = spaced_now() - cp->snapshot_grace;
	for (enum sweep_round r = SWEEP_OWN; ok && r <= SWEEP_SHARED && total > cp->build_cache_max; r++) {
		for (int t = 0; t < ntn; t++)
			tn[t].next = 0;
		int t;
		while (total > cp->build_cache_max && (t = sweep_pick(tn, ntn, sp, n, pinned, holders, cutoff, r)) >= 0) {
			struct sweep_step *s = &sp[tn[t].next];
			const char *h = trees[s->tree];
			long changed = 0;
			char cb[24];
			s->done = true;
			/* not used since the list was read; a shared tree: every holder's steps */
			int q = r == SWEEP_SHARED
			            ? CP_Q(st, NULL, &changed, "DELETE FROM build_steps WHERE hash = $1 AND created <= $2", h,
			                   cp_i64(cb, cutoff))
			            : CP_Q(st, NULL, &changed,
			                   "DELETE FROM build_steps WHERE tenant = $1 AND hash = $2 AND created <= $3", tn[t].id,
			                   h, cp_i64(cb, cutoff));
			if (q < 0 || changed == 0)
				continue;
			uint64_t share = size[s->tree] / (uint64_t)holders[s->tree];
			tn[t].held -= share;
			for (int i = 0; r == SWEEP_SHARED && i < n; i++)
				if (sp[i].tree == s->tree && !sp[i].done) { /* the other holders' steps went too */
					sp[i].done = true;
					tn[sp[i].tenant].held -= share;
				}
			/* the archive goes once no step of any tenant and nothing else names it */
			pthread_mutex_lock(&archive_lock);
			bool gone = archive_remove_locked(cp, st, h);
			pthread_mutex_unlock(&archive_lock);
			if (!gone)
				continue;
			total -= size[s->tree];
			freed += size[s->tree];
			removed++;
		}
	}
	if (removed)
		spaced_log("spaced-cp", "level=info event=build-cache-swept removed=%d bytes=%" PRIu64 " left=%" PRIu64,
		           removed, freed, total);
	free(trees);
	free(tenants);
	free(sp);
	free(tn);
	free(size);
	free(pinned);
	free(holders);
	cp_rows_free(rows);
	return removed;
}
