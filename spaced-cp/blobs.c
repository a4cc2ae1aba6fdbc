/*
 * blobs.c — the control plane's store over HTTP (docs/templates.md, "The
 * store"): one thread with a libuv loop and libspaced's strict HTTP server
 * (httpsrv.h) on a port of its own (--store-listen; STATE/store.port), so
 * large transfers never share a loop with lifecycle calls.
 *
 *   PUT /v1/templates/NAME             tenant key   import a root filesystem tarball or an
 *                                                   OCI image archive (the body) as template NAME
 *   GET /v1/blobs/templates/HASH       worker key   a template's canonical archive
 *   PUT /v1/blobs/snapshots/NAME       worker key   a snapshot archive (once: never replaced)
 *   GET /v1/blobs/snapshots/NAME       worker key   a snapshot archive
 *   POST /v1/builds/from               tenant key   a build's FROM: {"from": "debian:bookworm" |
 *                                                   "scratch" | NAME} → {"hash","cached","config"}
 *                                                   (debian: mmdebstrap, a minute or more, once)
 *
 * The port speaks TLS when the API does (the same certificate; with
 * --tls-client-ca the worker endpoints require the worker's client
 * certificate naming the worker whose key is presented, as the API's do):
 * worker keys and tenant API keys travel in its requests.
 *
 * Downloads are resumable (Range: bytes=N- or bytes=N-M → 206) and sent under
 * flow control; what a worker fetches it checks against the hash it was
 * given, so the store is trusted for availability only. Uploads go to a
 * temporary file first and become visible whole (rename) or not at all;
 * imports run on libuv's thread pool, at most two at once; an upload that
 * is in while two run waits its turn in one queue, first come first served
 * (at most IMPORTS_QUEUED wait: 503 beyond). A tenant has one upload, queued
 * or running import in progress at most (its others 503), so the queue
 * takes the tenants in turn: two tenants' slow imports delay a third's by
 * one import at most, and one tenant's uploads cannot fill the store's
 * spool. A body must come at httpsrv's minimum rate (a trickle ends with
 * 408). A build's FROM that names a template is a lookup, answered at once;
 * one of a base (debian:…, scratch) takes its turn as an import does.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "cp.h"
#include "log.h"
#include "pace.h"
#include "spaced_error.h"
#include "frame.h"
#include "httpsrv.h"
#include "identity.h"
#include "treehash.h"

#define CHUNK (256 * 1024)
#define HIGH_WATER (2u << 20)
#define IMPORTS_MAX 2
#define IMPORTS_QUEUED 32 /* uploads in, waiting for an import to end */
#define TENANT_UPLOADS_MAX 1 /* so that one tenant never holds every import */

enum bkind { B_NONE, B_TEMPLATE, B_SNAPSHOT_PUT, B_GET, B_FROM };

struct bconn {
	struct spaced_httpconn *c; /* NULL once the connection is gone */
	enum bkind kind;
	int fd;
	char tmp[PATH_MAX], final[PATH_MAX];
	char tenant[SPACED_NAME_MAX], name[SPACED_NAME_MAX];
	uint64_t off, end, got;
	bool failed, working; /* working: its import runs or waits (it outlives its connection) */
	bool queued;          /* waiting in B.queue */
	struct bconn *next;   /* B.queue's next */
	uint64_t queued_ns;   /* when it began to wait (spaced_mono_ns) */
	bool tenant_held; /* counted in its tenant's uploads (tenant_take) */
	uv_work_t work;
	int status;
	json_t *answer;
	struct spaced_buf body; /* B_FROM: the small JSON request */
	struct spaced_pace pace; /* an upload's writes, written behind (pace.h) */
};

static struct {
	struct cp *cp;
	uv_loop_t loop;
	struct spaced_httpsrv *srv;
	struct cp_store *st;
	int imports;
	struct bconn *queue, **queue_end; /* uploads in, waiting for an import slot, oldest first */
	int nqueued;
	struct tenant_uploads {
		char tenant[SPACED_NAME_MAX];
		int n;
	} *uploads; /* tenants with uploads or imports in progress */
	size_t nuploads;
	uint8_t buf[CHUNK];
} B;

/* One more upload (and its import) of tenant's in progress: false when it
 * has TENANT_UPLOADS_MAX already (or no memory). B.loop's thread only. */
static bool tenant_take(const char *tenant)
{
	for (size_t i = 0; i < B.nuploads; i++)
		if (strcmp(B.uploads[i].tenant, tenant) == 0) {
			if (B.uploads[i].n >= TENANT_UPLOADS_MAX)
				return false;
			B.uploads[i].n++;
			return true;
		}
	struct tenant_uploads *nu = realloc(B.uploads, (B.nuploads + 1) * sizeof *nu);
	if (!nu)
		return false;
	B.uploads = nu;
	snprintf(B.uploads[B.nuploads].tenant, sizeof B.uploads[B.nuploads].tenant, "%s", tenant);
	B.uploads[B.nuploads++].n = 1;
	return true;
}

static void tenant_release(const char *tenant)
{
	for (size_t i = 0; i < B.nuploads; i++)
		if (strcmp(B.uploads[i].tenant, tenant) == 0) {
			if (--B.uploads[i].n == 0)
				B.uploads[i] = B.uploads[--B.nuploads];
			return;
		}
}

static void reply_json(struct spaced_httpconn *c, int status, json_t *body)
{
	char *t = body ? json_dumps(body, JSON_COMPACT) : NULL;
	spaced_httpconn_reply(c, status, "application/json", t ? t : "{}", t ? strlen(t) : 2, NULL);
	free(t);
	json_decref(body);
}

static void reply_err(struct spaced_httpconn *c, int status, const char *code, const char *msg)
{
	reply_json(c, status, cp_error(code, msg));
}

static void bconn_free(struct bconn *b)
{
	if (b->tenant_held)
		tenant_release(b->tenant);
	if (b->tmp[0])
		spaced_pace_drop(&b->pace); /* unlinked below: its writeback is not waited for */
	else
		spaced_pace_end(&b->pace);
	if (b->fd >= 0)
		close(b->fd);
	if (b->tmp[0])
		unlink(b->tmp);
	json_decref(b->answer);
	spaced_buf_free(&b->body);
	free(b);
}

/* ---- downloads ---- */

static void pump(struct bconn *b)
{
	while (b->c && b->off < b->end && spaced_httpconn_queued(b->c) < HIGH_WATER) {
		size_t want = b->end - b->off < CHUNK ? (size_t)(b->end - b->off) : CHUNK;
		ssize_t n = pread(b->fd, B.buf, want, (off_t)b->off);
		if (n <= 0) {
			spaced_httpconn_abort(b->c); /* cut short: the client sees it and resumes */
			return;
		}
		spaced_httpconn_write(b->c, B.buf, (size_t)n);
		b->off += (uint64_t)n;
	}
	if (b->c && b->off == b->end) {
		spaced_httpconn_end(b->c);
		b->kind = B_NONE;
	}
}

/* "bytes=N-" or "bytes=N-M" within size: [*from, *to). */
static int parse_range(const char *v, uint64_t size, uint64_t *from, uint64_t *to)
{
	char *end;
	if (strncmp(v, "bytes=", 6) != 0 || v[6] < '0' || v[6] > '9')
		return -1;
	errno = 0;
	unsigned long long a = strtoull(v + 6, &end, 10);
	if (errno || *end != '-')
		return -1;
	unsigned long long b = size ? size - 1 : 0;
	if (end[1] != 0) {
		char *e2;
		if (end[1] < '0' || end[1] > '9')
			return -1;
		b = strtoull(end + 1, &e2, 10);
		if (errno || *e2 != 0 || b < a)
			return -1;
		if (b >= size)
			b = size - 1;
	}
	if (a >= size)
		return -1;
	*from = a;
	*to = b + 1;
	return 0;
}

static void start_get(struct spaced_httpconn *c, struct bconn *b, const char *path, const struct spaced_http_req *req)
{
	struct stat sb;
	b->fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (b->fd < 0 || fstat(b->fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		reply_err(c, 404, "not-found", "no such blob");
		return;
	}
	uint64_t size = (uint64_t)sb.st_size, from = 0, to = size;
	const char *range = spaced_http_field(req, "range");
	char hdr[160];
	int status = 200;
	snprintf(hdr, sizeof hdr, "accept-ranges: bytes\r\n");
	if (range) {
		if (parse_range(range, size, &from, &to) < 0) {
			snprintf(hdr, sizeof hdr, "content-range: bytes */%llu\r\n", (unsigned long long)size);
			spaced_httpconn_reply(c, 416, "application/json", "{\"error\":\"range\"}", 17, hdr);
			return;
		}
		status = 206;
		snprintf(hdr, sizeof hdr, "accept-ranges: bytes\r\ncontent-range: bytes %llu-%llu/%llu\r\n",
		         (unsigned long long)from, (unsigned long long)to - 1, (unsigned long long)size);
	}
	b->kind = B_GET;
	b->off = from;
	b->end = to;
	spaced_httpconn_respond(c, status, "application/octet-stream", (int64_t)(to - from), hdr);
	pump(b);
}

/* ---- uploads ---- */

static int open_upload(struct bconn *b)
{
	snprintf(b->tmp, sizeof b->tmp, "%s/tmp/upload-XXXXXX", B.cp->store_dir);
	b->fd = mkstemp(b->tmp);
	if (b->fd < 0) {
		b->tmp[0] = 0;
		return -1;
	}
	return 0;
}

static void import_work(uv_work_t *w)
{
	struct bconn *b = w->data;
	struct cp_store *st = NULL;
	if (cp_store_open(B.cp->db_url, &st) < 0) {
		b->status = 503;
		b->answer = cp_error("store", "store unavailable");
		return;
	}
	if (b->kind == B_FROM) {
		json_error_t jerr;
		json_t *req = json_loadb((const char *)b->body.data, b->body.len, JSON_REJECT_DUPLICATES, &jerr);
		const char *from = json_string_value(json_object_get(req, "from"));
		if (!from) {
			b->status = 400;
			b->answer = cp_error("bad-request", "{\"from\": …}");
		} else {
			b->status = cp_build_from(B.cp, st, b->tenant, from, &b->answer);
		}
		json_decref(req);
	} else {
		b->status = cp_template_import(B.cp, st, b->tenant, b->name, b->tmp, &b->answer);
	}
	cp_store_close(st);
}

static void import_done(uv_work_t *w, int status);

/* Runs b's import (its upload is in) on the thread pool; answers 503 when it
 * cannot start. */
static void import_start(struct bconn *b)
{
	spaced_log("spaced-cp", "level=info event=template-import-started tenant=%s running=%d", b->tenant,
	           B.imports + 1);
	b->working = true;
	b->work.data = b;
	if (uv_queue_work(&B.loop, &b->work, import_work, import_done) < 0) {
		b->working = false;
		if (b->c)
			reply_err(b->c, 503, "busy", "cannot start the import");
		else
			bconn_free(b);
		return;
	}
	B.imports++;
}

/* Takes b out of B.queue. */
static void queue_remove(struct bconn *b)
{
	for (struct bconn **p = &B.queue; *p; p = &(*p)->next)
		if (*p == b) {
			*p = b->next;
			if (B.queue_end == &b->next)
				B.queue_end = p;
			break;
		}
	b->queued = false;
	B.nqueued--;
}

static void import_done(uv_work_t *w, int status)
{
	struct bconn *b = w->data;
	(void)status;
	B.imports--;
	b->working = false;
	spaced_log("spaced-cp", "level=info event=template-import template=%s tenant=%s status=%d", b->name, b->tenant,
	           b->status);
	if (b->c) {
		reply_json(b->c, b->status, b->answer);
		b->answer = NULL;
		spaced_httpconn_set_user(b->c, NULL);
	}
	bconn_free(b);
	/* the next upload waiting (one per tenant at most: the tenants in turn) */
	while (B.imports < IMPORTS_MAX && B.queue) {
		struct bconn *q = B.queue;
		queue_remove(q);
		spaced_log("spaced-cp", "level=info event=template-import-dequeued tenant=%s waited_ms=%" PRIu64, q->tenant,
		           (spaced_mono_ns() - q->queued_ns) / 1000000u);
		import_start(q);
	}
}

static void on_body(struct spaced_httpconn *c, const uint8_t *p, size_t n)
{
	struct bconn *b = spaced_httpconn_user(c);
	if (!b || b->failed || (b->kind != B_TEMPLATE && b->kind != B_SNAPSHOT_PUT && b->kind != B_FROM))
		return;
	if (b->kind == B_FROM) {
		if (spaced_buf_append(&b->body, p, n) < 0) {
			b->failed = true;
			reply_err(c, 413, "too-large", "a small JSON object");
		}
		return;
	}
	if (spaced_io_write_full(b->fd, p, n) < 0) {
		b->failed = true;
		reply_err(c, 507, "store", "the store cannot hold it");
		return;
	}
	/* written behind: a gigabyte upload never sits dirty in the page cache
	 * for the control plane's commits and the sandboxes' disks to wait
	 * behind (its final fsync held this loop for seconds) */
	spaced_pace_wrote(&b->pace, b->fd, (off_t)b->got, n);
	b->got += n;
}

/* A build's FROM that names a template: answered at once on this loop (one
 * lookup in the store), never queued behind imports and bases being built.
 * True when it answered. */
static bool from_template_name(struct spaced_httpconn *c, struct bconn *b)
{
	json_error_t jerr;
	json_t *req = json_loadb((const char *)b->body.data, b->body.len, JSON_REJECT_DUPLICATES, &jerr);
	const char *from = json_string_value(json_object_get(req, "from"));
	bool name = from && strcmp(from, "scratch") != 0 && strncmp(from, "debian:", 7) != 0;
	if (name) {
		json_t *answer = NULL;
		int status = cp_build_from(B.cp, B.st, b->tenant, from, &answer);
		reply_json(c, status, answer);
		b->kind = B_NONE;
		if (b->tenant_held) { /* the tenant's one upload at a time is free again */
			tenant_release(b->tenant);
			b->tenant_held = false;
		}
	}
	json_decref(req);
	return name;
}

static void on_body_end(struct spaced_httpconn *c)
{
	struct bconn *b = spaced_httpconn_user(c);
	if (!b || b->failed)
		return;
	spaced_pace_end(&b->pace);
	if (b->kind == B_SNAPSHOT_PUT) {
		if (fsync(b->fd) < 0) {
			reply_err(c, 507, "store", strerror(errno));
			return;
		}
		/* visible whole or not at all, and never over an earlier one */
		if (link(b->tmp, b->final) < 0) {
			reply_err(c, errno == EEXIST ? 409 : 507, errno == EEXIST ? "exists" : "store", strerror(errno));
			return;
		}
		unlink(b->tmp);
		b->tmp[0] = 0;
		reply_json(c, 201, json_pack("{s:s,s:I}", "name", b->name, "bytes", (json_int_t)b->got));
		b->kind = B_NONE;
		return;
	}
	if (b->kind == B_FROM && from_template_name(c, b))
		return; /* answered here: a lookup, no import */
	if (b->kind == B_TEMPLATE || b->kind == B_FROM) {
		if (b->fd >= 0)
			close(b->fd);
		b->fd = -1;
		/* the bound holds for what runs, whenever its upload ended */
		if (B.imports < IMPORTS_MAX) {
			import_start(b);
			return;
		}
		if (B.nqueued >= IMPORTS_QUEUED) {
			reply_err(c, 503, "busy", "imports are running and many wait: try again shortly");
			return;
		}
		b->working = b->queued = true;
		b->queued_ns = spaced_mono_ns();
		b->next = NULL;
		*B.queue_end = b;
		B.queue_end = &b->next;
		B.nqueued++;
		spaced_log("spaced-cp", "level=info event=template-import-queued tenant=%s waiting=%d", b->tenant,
		           B.nqueued);
	}
}

/* ---- requests ---- */

static int split(char *path, char **seg, int n)
{
	int k = 0;
	char *q = strchr(path, '?');
	if (q)
		*q = 0;
	if (path[0] != '/')
		return -1;
	for (char *p = path + 1; *p;) {
		if (k == n)
			return -1;
		seg[k++] = p;
		char *e = strchr(p, '/');
		if (!e)
			break;
		*e = 0;
		p = e + 1;
	}
	for (int i = 0; i < k; i++)
		if (!seg[i][0])
			return -1;
	return k;
}

static int check_key(const struct spaced_http_req *req, enum cp_role role, char owner[SPACED_NAME_MAX])
{
	const char *a = spaced_http_field(req, "authorization");
	if (!a || strncmp(a, "Bearer ", 7) != 0)
		return SPACED_EPERM;
	return cp_key_check(B.st, a + 7, role, owner, NULL);
}

static void on_request(struct spaced_httpconn *c, const struct spaced_http_req *req)
{
	char path[1024], *seg[5];
	struct bconn *b = calloc(1, sizeof *b);
	if (!b) {
		spaced_httpconn_reply(c, 503, "application/json", "{}", 2, NULL);
		return;
	}
	b->fd = -1;
	spaced_pace_init(&b->pace, 0, false);
	b->c = c;
	spaced_httpconn_set_user(c, b);
	snprintf(path, sizeof path, "%s", req->target);
	int n = split(path, seg, 5);
	bool get = strcmp(req->method, "GET") == 0, put = strcmp(req->method, "PUT") == 0;
	char owner[SPACED_NAME_MAX];
	if (n == 3 && strcmp(seg[0], "v1") == 0 && strcmp(seg[1], "templates") == 0 && put) {
		if (check_key(req, CP_ROLE_TENANT, owner) < 0) {
			reply_err(c, 401, "unauthorized", "a tenant API key is required");
			return;
		}
		if (!cp_template_name_valid(seg[2])) {
			reply_err(c, 400, "bad-request", "not a valid template name");
			return;
		}
		if (B.nqueued >= IMPORTS_QUEUED) {
			reply_err(c, 503, "busy", "imports are running and many wait: try again shortly");
			return;
		}
		if (req->body == SPACED_HTTP_BODY_LENGTH && req->content_length > B.cp->template_max) {
			reply_err(c, 413, "template-too-large", "the archive is larger than this store takes");
			return;
		}
		snprintf(b->tenant, sizeof b->tenant, "%s", owner); /* before tenant_take: bconn_free releases it */
		if (!(b->tenant_held = tenant_take(owner))) {
			reply_err(c, 503, "busy", "this tenant's upload is running (one at a time): try again shortly");
			return;
		}
		if (open_upload(b) < 0) {
			reply_err(c, 507, "store", strerror(errno));
			return;
		}
		snprintf(b->name, sizeof b->name, "%s", seg[2]);
		b->kind = B_TEMPLATE;
		spaced_httpconn_body_max(c, B.cp->template_max);
		if (req->body == SPACED_HTTP_BODY_NONE)
			on_body_end(c);
		return;
	}
	if (n == 3 && strcmp(seg[0], "v1") == 0 && strcmp(seg[1], "builds") == 0 && strcmp(seg[2], "from") == 0 &&
	    strcmp(req->method, "POST") == 0) {
		if (check_key(req, CP_ROLE_TENANT, owner) < 0) {
			reply_err(c, 401, "unauthorized", "a tenant API key is required");
			return;
		}
		if (B.nqueued >= IMPORTS_QUEUED) {
			reply_err(c, 503, "busy", "imports are running and many wait: try again shortly");
			return;
		}
		snprintf(b->tenant, sizeof b->tenant, "%s", owner);
		if (!(b->tenant_held = tenant_take(owner))) {
			reply_err(c, 503, "busy", "this tenant's upload is running (one at a time): try again shortly");
			return;
		}
		b->kind = B_FROM;
		spaced_buf_init(&b->body, 4096);
		spaced_httpconn_body_max(c, 4096);
		if (req->body == SPACED_HTTP_BODY_NONE)
			on_body_end(c);
		return;
	}
	if (n == 4 && strcmp(seg[0], "v1") == 0 && strcmp(seg[1], "blobs") == 0 &&
	    (strcmp(seg[2], "templates") == 0 || strcmp(seg[2], "snapshots") == 0)) {
		bool tmpl = strcmp(seg[2], "templates") == 0;
		if (check_key(req, CP_ROLE_WORKER, owner) < 0) {
			reply_err(c, 401, "unauthorized", "a worker key is required");
			return;
		}
		/* mutual TLS: the certificate names the worker the key is of */
		const char *cn = B.cp->mtls ? spaced_httpconn_peer_cert(c) : NULL;
		if (B.cp->mtls && (cn == NULL || cn[0] == 0)) {
			reply_err(c, 401, "unauthorized",
			          "the worker endpoints need a client certificate (mutual TLS) signed by the workers' CA");
			return;
		}
		if (cn != NULL && strcmp(cn, owner) != 0) {
			reply_err(c, 403, "forbidden", "the client certificate names another worker");
			return;
		}
		if (tmpl ? !spaced_treehash_hex_valid(seg[3]) : !spaced_name_valid(seg[3], strlen(seg[3]))) {
			reply_err(c, 404, "not-found", "no such blob");
			return;
		}
		char file[PATH_MAX];
		snprintf(file, sizeof file, "%s/%s/%s.tar", B.cp->store_dir, seg[2], seg[3]);
		if (get) {
			start_get(c, b, file, req);
			return;
		}
		if (put && !tmpl) {
			if (!cp_snapshot_awaited(B.st, seg[3], owner)) {
				reply_err(c, 409, "not-awaited",
				          "no snapshot of that sandbox and generation is being taken on this worker");
				return;
			}
			if (open_upload(b) < 0) {
				reply_err(c, 507, "store", strerror(errno));
				return;
			}
			snprintf(b->final, sizeof b->final, "%s", file);
			snprintf(b->name, sizeof b->name, "%s", seg[3]);
			b->kind = B_SNAPSHOT_PUT;
			spaced_httpconn_body_max(c, B.cp->snapshot_max);
			if (req->body == SPACED_HTTP_BODY_NONE)
				on_body_end(c);
			return;
		}
		reply_err(c, 405, "method-not-allowed", "GET, or PUT for a snapshot");
		return;
	}
	reply_err(c, 404, "not-found", "no such endpoint");
}

static void on_drain(struct spaced_httpconn *c)
{
	struct bconn *b = spaced_httpconn_user(c);
	if (b && b->kind == B_GET)
		pump(b);
}

static void on_close(struct spaced_httpconn *c)
{
	struct bconn *b = spaced_httpconn_user(c);
	if (!b)
		return;
	b->c = NULL;
	if (b->queued) { /* its client left while it waited: not imported */
		queue_remove(b);
		bconn_free(b);
	} else if (!b->working) {
		bconn_free(b); /* an import in flight frees it when done */
	}
}

static const struct spaced_httpsrv_ops ops = {
	.on_request = on_request,
	.on_body = on_body,
	.on_body_end = on_body_end,
	.on_drain = on_drain,
	.on_close = on_close,
};

static void *blobs_thread(void *arg)
{
	(void)arg;
	uv_run(&B.loop, UV_RUN_DEFAULT);
	return NULL;
}

int cp_blobs_start(struct cp *cp)
{
	char p[PATH_MAX];
	static const char *const dirs[] = {"", "/templates", "/snapshots", "/tmp"};
	for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
		snprintf(p, sizeof p, "%s%s", cp->store_dir, dirs[i]);
		if (mkdir(p, 0700) < 0 && errno != EEXIST)
			return SPACED_ESYS;
	}
	/* uploads and imports a crash left half done */
	snprintf(p, sizeof p, "rm -rf -- '%s/tmp' && mkdir -m 0700 '%s/tmp'", cp->store_dir, cp->store_dir);
	if (system(p) != 0)
		return SPACED_ESYS;
	B.cp = cp;
	B.queue_end = &B.queue;
	int r = cp_store_open(cp->db_url, &B.st);
	if (r < 0)
		return r;
	if (uv_loop_init(&B.loop) < 0)
		return SPACED_ESYS;
	struct spaced_httpsrv_config hc;
	spaced_httpsrv_defaults(&hc);
	hc.host = cp->store_host;
	hc.port = cp->store_port;
	hc.ops = &ops;
	hc.body_max = cp->snapshot_max;
	hc.body_timeout_ms = 60000;
	hc.low_water = 512 * 1024;
	hc.tls = cp->tls; /* NULL with --plaintext */
	if ((r = spaced_httpsrv_start(&B.loop, &hc, &B.srv)) < 0)
		return r;
	int port = spaced_httpsrv_port(B.srv);
	snprintf(cp->store_url, sizeof cp->store_url, "%s://%s:%d", cp->tls ? "https" : "http", cp->store_host, port);
	snprintf(p, sizeof p, "%s/store.port", cp->state_dir);
	FILE *f = fopen(p, "w");
	if (f) {
		fprintf(f, "%d\n", port);
		fclose(f);
	}
	pthread_t t;
	if (pthread_create(&t, NULL, blobs_thread, NULL) != 0)
		return SPACED_ESYS;
	pthread_detach(t);
	return 0;
}

/* ---- the snapshots' sweep (cp.h cp_snapshots_sweep; the reaper's thread) ---- */

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The name an archive URL ends with (…/v1/blobs/snapshots/NAME), or NULL. */
static const char *snapshot_name(const char *url)
{
	static const char mark[] = "/v1/blobs/snapshots/";
	const char *p = url ? strstr(url, mark) : NULL;
	return p && p[sizeof mark - 1] ? p + sizeof mark - 1 : NULL;
}

/* True when file (a directory entry) is an archive of sandbox: SANDBOX-GEN-RANDOM.tar. */
static bool archive_of(const char *file, const char *sandbox)
{
	size_t sl = strlen(sandbox), fl = strlen(file);
	if (fl <= sl + 4 || strncmp(file, sandbox, sl) != 0 || file[sl] != '-' || strcmp(file + fl - 4, ".tar") != 0)
		return false;
	const char *p = file + sl + 1;
	if (*p < '0' || *p > '9')
		return false;
	while (*p >= '0' && *p <= '9')
		p++;
	return *p == '-';
}

int cp_snapshots_drop_others(struct cp *cp, const char *sandbox, const char *keep)
{
	const char *k = keep ? snapshot_name(keep) : NULL;
	if (keep && !k)
		k = keep; /* a bare name */
	char dir[PATH_MAX], keep_file[300];
	snprintf(dir, sizeof dir, "%s/snapshots", cp->store_dir);
	snprintf(keep_file, sizeof keep_file, "%s.tar", k ? k : "");
	DIR *d = sandbox[0] ? opendir(dir) : NULL;
	if (!d)
		return 0;
	int removed = 0;
	uint64_t bytes = 0;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		struct stat sb;
		if (!archive_of(de->d_name, sandbox) || (k && strcmp(de->d_name, keep_file) == 0))
			continue;
		if (fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode) &&
		    unlinkat(dirfd(d), de->d_name, 0) == 0) {
			removed++;
			bytes += (uint64_t)sb.st_size;
		}
	}
	closedir(d);
	if (removed)
		spaced_log("spaced-cp", "level=info event=snapshots-dropped sandbox=%s removed=%d bytes=%" PRIu64, sandbox,
		           removed, bytes);
	return removed;
}

int cp_snapshots_sweep(struct cp *cp, struct cp_store *st)
{
	struct cp_rows *named = NULL, *busy = NULL;
	/* what is needed, read before the directory: an archive uploaded after
	 * this read is younger than the grace period */
	if (CP_Q0(st, &named, NULL, "SELECT snapshot FROM sandboxes WHERE deleted = 0 AND snapshot IS NOT NULL") < 0 ||
	    CP_Q0(st, &busy, NULL, "SELECT id FROM sandboxes WHERE deleted = 0 AND op IS NOT NULL") < 0) {
		cp_rows_free(named);
		cp_rows_free(busy);
		return 0;
	}
	size_t nk = 0, nb = (size_t)busy->nrows;
	const char **keep = calloc((size_t)named->nrows + 1, sizeof *keep);
	for (int i = 0; keep && i < named->nrows; i++) {
		const char *n = snapshot_name(cp_rows_get(named, i, 0));
		if (n)
			keep[nk++] = n;
	}
	char dir[PATH_MAX];
	snprintf(dir, sizeof dir, "%s/snapshots", cp->store_dir);
	DIR *d = keep ? opendir(dir) : NULL;
	int removed = 0;
	uint64_t bytes = 0;
	time_t now = time(NULL);
	if (d) {
		qsort(keep, nk, sizeof *keep, cmp_str);
		struct dirent *de;
		while ((de = readdir(d)) != NULL) {
			char name[256];
			size_t len = strlen(de->d_name);
			struct stat sb;
			if (len <= 4 || len - 4 >= sizeof name || strcmp(de->d_name + len - 4, ".tar") != 0)
				continue;
			memcpy(name, de->d_name, len - 4);
			name[len - 4] = '\0';
			const char *key = name;
			if (bsearch(&key, keep, nk, sizeof *keep, cmp_str) != NULL)
				continue;
			/* NAME is SANDBOX-GENERATION-RANDOM: a sandbox with an
			 * operation in flight keeps every archive of its own */
			bool in_flight = false;
			for (size_t i = 0; i < nb && !in_flight; i++) {
				const char *id = cp_rows_get(busy, (int)i, 0);
				size_t il = id ? strlen(id) : 0;
				in_flight = il && strncmp(name, id, il) == 0 && name[il] == '-';
			}
			if (in_flight || fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 ||
			    !S_ISREG(sb.st_mode) || now - sb.st_mtime < cp->snapshot_grace)
				continue;
			if (unlinkat(dirfd(d), de->d_name, 0) == 0) {
				removed++;
				bytes += (uint64_t)sb.st_size;
			}
		}
		closedir(d);
	}
	free(keep);
	cp_rows_free(named);
	cp_rows_free(busy);
	if (removed)
		spaced_log("spaced-cp", "level=info event=snapshots-swept removed=%d bytes=%" PRIu64, removed, bytes);
	return removed;
}
