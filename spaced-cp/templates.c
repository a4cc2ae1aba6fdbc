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
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "cp.h"
#include "error.h"
#include "identity.h"
#include "rootfs.h"

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

int cp_template_import(struct cp *cp, struct cp_store *st, const char *tenant, const char *name, const char *upload,
                       json_t **answer)
{
	char why[512] = "", canon[PATH_MAX], final[PATH_MAX], spool[PATH_MAX], now[24], b[24], e[24];
	struct spaced_rootfs *t = NULL;
	struct spaced_rootfs_info info;
	json_t *config = NULL;
	const char *format = "";
	char *cfg_text = NULL;
	int status = 500, r;
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
	/* one archive per tree, whoever imported it */
	snprintf(final, sizeof final, "%s/templates/%s.tar", cp->store_dir, info.hash);
	if (rename(canon, final) < 0) {
		*answer = cp_error("store", strerror(errno));
		goto out;
	}
	canon[0] = 0;
	if (config)
		cfg_text = json_dumps(config, JSON_COMPACT);
	r = CP_Q(st, NULL, NULL,
	         "INSERT INTO templates (tenant, name, hash, bytes, entries, config, source, created) "
	         "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
	         tenant, name, info.hash, cp_i64(b, (int64_t)info.bytes), cp_i64(e, (int64_t)info.entries), cfg_text,
	         format, cp_i64(now, spaced_now()));
	if (r == SPACED_EEXIST) {
		status = 409;
		*answer = cp_error("template-exists", "a template of this name exists (templates are immutable: "
		                                      "spacectl template rm it first)");
		goto out;
	}
	if (r < 0) {
		*answer = cp_error("store", spaced_strerror(r));
		goto out;
	}
	*answer = json_pack("{s:s,s:s,s:I,s:I,s:s,s:I,s:I,s:o}", "name", name, "hash", info.hash, "bytes",
	                    (json_int_t)info.bytes, "entries", (json_int_t)info.entries, "source", format, "dropped",
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

/* Removes the archive of hash when no template and no live sandbox names it. */
static void template_gc(struct cp *cp, struct cp_store *st, const char *hash)
{
	struct cp_rows *rows = NULL;
	if (CP_Q(st, &rows, NULL,
	         "SELECT (SELECT COUNT(*) FROM templates WHERE hash = $1) + "
	         "(SELECT COUNT(*) FROM sandboxes WHERE template_hash = $1 AND deleted = 0)",
	         hash) == 0 &&
	    cp_rows_i64(rows, 0, 0, 1) == 0) {
		char p[PATH_MAX];
		snprintf(p, sizeof p, "%s/templates/%s.tar", cp->store_dir, hash);
		unlink(p);
	}
	cp_rows_free(rows);
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
	*out = cp_error("method-not-allowed", "GET or DELETE");
	return 405;
}
