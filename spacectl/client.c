/* client.c — route cache on disk and route recovery for one operation (see client.h). */
#include "client.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "http_client.h"
#include "util.h"

void client_route_clear(struct client_route *r)
{
	if (r == NULL)
		return;
	if (r->capability != NULL) {
		spaced_wipe(r->capability, strlen(r->capability));
		free(r->capability);
	}
	memset(r, 0, sizeof *r);
}

void client_answer_clear(struct client_answer *a)
{
	if (a == NULL)
		return;
	free(a->body);
	memset(a, 0, sizeof *a);
}

int client_query_escape(const char *s, char *out, size_t outsz)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t n = 0;
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		int plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
		            c == '_' || c == '.' || c == '~' || c == '/';
		if (n + (plain ? 1 : 3) >= outsz)
			return -1;
		if (plain) {
			out[n++] = (char)c;
		} else {
			out[n++] = '%';
			out[n++] = hex[c >> 4];
			out[n++] = hex[c & 15];
		}
	}
	if (n >= outsz)
		return -1;
	out[n] = 0;
	return 0;
}

/* ---- routes as JSON ---- */

/* Reads a route answer object into *out. Returns 0 or -1. */
static int route_from_json(json_t *o, struct client_route *out, char *err, size_t errsz)
{
	struct spaced_identity id;
	const char *cap = json_string_value(json_object_get(o, "capability"));
	const char *url = json_string_value(json_object_get(o, "worker_url"));
	const char *exp = json_string_value(json_object_get(o, "expires_at"));
	int64_t t;
	if (cap == NULL || url == NULL || exp == NULL || spaced_identity_from_json(&id, json_object_get(o, "identity")) < 0 ||
	    spaced_time_parse(exp, strlen(exp), &t) < 0 || strlen(url) >= sizeof out->worker_url) {
		snprintf(err, errsz, "not a route (identity, worker_url, capability, expires_at)");
		return -1;
	}
	struct client_route r;
	memset(&r, 0, sizeof r);
	if (spaced_identity_encode(&id, r.identity, sizeof r.identity) < 0 || (r.capability = strdup(cap)) == NULL) {
		snprintf(err, errsz, "route too large");
		return -1;
	}
	snprintf(r.worker_url, sizeof r.worker_url, "%s", url);
	r.cap_expires_at = t;
	*out = r;
	return 0;
}

/* ---- the cache directory ---- */

static int cache_dir(const struct client_opts *o, char *out, size_t outsz)
{
	const char *d = o->cache_dir ? o->cache_dir : getenv("SPACED_ROUTE_CACHE");
	int n;
	if (d != NULL && d[0])
		n = snprintf(out, outsz, "%s", d);
	else if (getenv("XDG_RUNTIME_DIR") != NULL && getenv("XDG_RUNTIME_DIR")[0])
		n = snprintf(out, outsz, "%s/spaced/routes", getenv("XDG_RUNTIME_DIR"));
	else if (getenv("HOME") != NULL && getenv("HOME")[0])
		n = snprintf(out, outsz, "%s/.cache/spaced/routes", getenv("HOME"));
	else
		return -1;
	return n > 0 && (size_t)n < outsz ? 0 : -1;
}

/* mkdir -p with mode 0700 for the directories created. */
static int mkdirs(const char *path)
{
	char buf[4096];
	if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
		return -1;
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(buf, 0700) < 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	return mkdir(buf, 0700) < 0 && errno != EEXIST ? -1 : 0;
}

int client_cache_path(const struct client_opts *o, const char *sandbox, char *out, size_t outsz)
{
	char d[4096];
	if (!spaced_name_valid(sandbox, strlen(sandbox)) || cache_dir(o, d, sizeof d) < 0)
		return -1;
	int n = snprintf(out, outsz, "%s/%s.json", d, sandbox);
	return n > 0 && (size_t)n < outsz ? 0 : -1;
}

/* Opens and locks <sandbox>.lock (exclusive). Returns the fd or -1. */
static int cache_lock(const struct client_opts *o, const char *sandbox)
{
	char d[4096], p[4200];
	if (!spaced_name_valid(sandbox, strlen(sandbox)) || cache_dir(o, d, sizeof d) < 0 || mkdirs(d) < 0)
		return -1;
	snprintf(p, sizeof p, "%s/%s.lock", d, sandbox);
	int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	while (flock(fd, LOCK_EX) < 0) {
		if (errno != EINTR) {
			close(fd);
			return -1;
		}
	}
	return fd;
}

static void cache_unlock(int fd)
{
	if (fd >= 0)
		close(fd); /* releases the flock */
}

/* What an entry names its caller by: a keyed BLAKE2b of the API key (not
 * the key). An entry holds a live capability, so it serves only the key
 * it was resolved with: one cache directory shared by several tenants' keys
 * (a service running spacectl for several customers) must not hand one
 * tenant the route another tenant's key was given. */
static void cache_caller(const struct client_opts *o, char hex[33])
{
	static const unsigned char domain[crypto_generichash_KEYBYTES] = "spaced route cache, caller v1";
	unsigned char h[16];
	const char *k = o->api_key ? o->api_key : "";
	crypto_generichash(h, sizeof h, (const unsigned char *)k, strlen(k), domain, sizeof domain);
	sodium_bin2hex(hex, 33, h, sizeof h);
}

/* Reads the entry of sandbox (lock held). Returns 0 or -1 (none, other control
 * plane or caller, unreadable). */
static int cache_read(const struct client_opts *o, const char *sandbox, struct client_route *out)
{
	char p[4200], err[128];
	if (client_cache_path(o, sandbox, p, sizeof p) < 0)
		return -1;
	json_error_t jerr;
	json_t *e = json_load_file(p, JSON_REJECT_DUPLICATES, &jerr);
	if (e == NULL)
		return -1;
	int r = -1;
	const char *cp = json_string_value(json_object_get(e, "cp_url"));
	const char *caller = json_string_value(json_object_get(e, "caller"));
	json_t *exp = json_object_get(e, "entry_expires_at");
	struct client_route rt;
	char mine[33];
	cache_caller(o, mine);
	if (cp == NULL || o->cp_url == NULL || strcmp(cp, o->cp_url) != 0 || !caller || strcmp(caller, mine) != 0 ||
	    !json_is_integer(exp) ||
	    route_from_json(json_object_get(e, "route"), &rt, err, sizeof err) < 0)
		goto out;
	rt.entry_expires_at = json_integer_value(exp);
	*out = rt;
	r = 0;
out:
	json_decref(e);
	return r;
}

/* Writes the entry of sandbox (lock held): route answer `route` with the
 * entry's expiry. Atomic (write, fsync, rename). */
static int cache_write(const struct client_opts *o, const char *sandbox, json_t *route, int64_t entry_expires_at)
{
	char p[4200], tmp[4300];
	if (client_cache_path(o, sandbox, p, sizeof p) < 0)
		return -1;
	snprintf(tmp, sizeof tmp, "%s.%ld.tmp", p, (long)getpid());
	char caller[33];
	cache_caller(o, caller);
	json_t *e = json_pack("{s:s,s:s,s:I,s:O}", "cp_url", o->cp_url, "caller", caller, "entry_expires_at",
	                      (json_int_t)entry_expires_at, "route", route);
	if (e == NULL)
		return -1;
	char *text = json_dumps(e, JSON_COMPACT);
	json_decref(e);
	if (text == NULL)
		return -1;
	int r = -1, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd >= 0) {
		size_t n = strlen(text), off = 0;
		while (off < n) {
			ssize_t w = write(fd, text + off, n - off);
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				break;
			off += (size_t)w;
		}
		if (off == n && fsync(fd) == 0)
			r = 0;
		close(fd);
		if (r == 0 && rename(tmp, p) < 0)
			r = -1;
		if (r < 0)
			unlink(tmp);
	}
	spaced_wipe(text, strlen(text));
	free(text);
	return r;
}

static void cache_remove(const struct client_opts *o, const char *sandbox)
{
	char p[4200];
	if (client_cache_path(o, sandbox, p, sizeof p) == 0)
		unlink(p);
}

/* ---- the control plane ---- */

/* True when a sandbox in `state` is between two executions of a lifecycle
 * operation (moving, starting, or stopped while an operation holds it, as a
 * move does between the snapshot and the new generation). */
static int between_executions(const struct client_opts *o, const char *sandbox, const char *state)
{
	if (strcmp(state, "moving") == 0 || strcmp(state, "starting") == 0)
		return 1;
	if (strcmp(state, "stopped") != 0)
		return 0;
	char path[256], *body = NULL, herr[256];
	int status = 0, busy = 0;
	snprintf(path, sizeof path, "/v1/sandboxes/%s", sandbox);
	if (http_request(o->cp_url, "GET", path, o->api_key, NULL, &status, &body, herr, sizeof herr) == 0 && status == 200) {
		json_error_t jerr;
		json_t *s = json_loads(body, 0, &jerr);
		busy = json_is_string(json_object_get(s, "operation"));
		json_decref(s);
	}
	free(body);
	return busy;
}

/* POST /v1/sandboxes/{id}/route: the current route as JSON (*json, a new
 * reference) and parsed (*out). */
static int resolve(const struct client_opts *o, const char *sandbox, json_t **json, struct client_route *out,
                   char *err, size_t errsz)
{
	char path[256], *body = NULL, herr[256];
	int status = 0, r = -1;
	json_t *ans = NULL;
	if (o->cp_url == NULL || o->api_key == NULL) {
		snprintf(err, errsz, "SPACED_CP_URL and SPACED_API_KEY must be set (spacectl dev up writes them)");
		return -1;
	}
	snprintf(path, sizeof path, "/v1/sandboxes/%s/route", sandbox);
	json_error_t jerr;
	/* a sandbox between two executions (moving, starting) has no route for a
	 * moment: wait for the new one, at most CLIENT_RESOLVE_WAIT seconds */
	uint64_t deadline = spaced_mono_ns() + (uint64_t)CLIENT_RESOLVE_WAIT * 1000000000u;
	for (;;) {
		if (http_request(o->cp_url, "POST", path, o->api_key, "{}", &status, &body, herr, sizeof herr) < 0) {
			snprintf(err, errsz, "control plane: %s", herr);
			return -1;
		}
		ans = json_loads(body, JSON_REJECT_DUPLICATES, &jerr);
		const char *state = json_string_value(json_object_get(ans, "state"));
		if (status != 409 || state == NULL || spaced_mono_ns() > deadline || !between_executions(o, sandbox, state))
			break;
		json_decref(ans);
		ans = NULL;
		free(body);
		body = NULL;
		usleep(100000);
	}
	if (status != 200) {
		const char *code = json_string_value(json_object_get(ans, "error"));
		const char *msg = json_string_value(json_object_get(ans, "message"));
		snprintf(err, errsz, "control plane: route: %d %s%s%s", status, code ? code : "", msg ? ": " : "",
		         msg ? msg : "");
		goto out;
	}
	if (ans == NULL || route_from_json(ans, out, err, errsz) < 0)
		goto out;
	*json = ans;
	ans = NULL;
	r = 0;
out:
	json_decref(ans);
	free(body);
	return r;
}

static int same_route(const struct client_route *a, const struct client_route *b)
{
	return a->capability && b->capability && strcmp(a->capability, b->capability) == 0;
}

int client_route_get(const struct client_opts *o, const char *sandbox, struct client_route *out, char *err,
                     size_t errsz)
{
	if (!spaced_name_valid(sandbox, strlen(sandbox))) {
		snprintf(err, errsz, "'%s' is not a sandbox ID", sandbox);
		return -1;
	}
	if (o->route_file != NULL) {
		json_error_t jerr;
		json_t *f = json_load_file(o->route_file, JSON_REJECT_DUPLICATES, &jerr);
		if (f == NULL) {
			snprintf(err, errsz, "%s: %s", o->route_file, jerr.text);
			return -1;
		}
		json_t *rt = json_object_get(f, "route") ? json_object_get(f, "route") : f;
		int r = route_from_json(rt, out, err, errsz);
		json_decref(f);
		return r;
	}
	if (o->cp_url == NULL || o->api_key == NULL) {
		snprintf(err, errsz, "SPACED_CP_URL and SPACED_API_KEY must be set (spacectl dev up writes them)");
		return -1;
	}
	int64_t now = spaced_now();
	int lk = cache_lock(o, sandbox); /* no cache (no directory): resolve every time */
	struct client_route c;
	memset(&c, 0, sizeof c);
	if (lk >= 0 && cache_read(o, sandbox, &c) == 0) {
		if (c.entry_expires_at > now && c.cap_expires_at > now + CLIENT_CAP_MARGIN) {
			cache_unlock(lk);
			*out = c;
			return 0;
		}
	}
	/* a miss, or the capability nears expiry: the entry's expiry is kept
	 * while it lasts (V4); an expired entry starts a new session */
	int64_t entry_exp = c.capability != NULL && c.entry_expires_at > now ? c.entry_expires_at : now + CLIENT_SESSION_TTL;
	client_route_clear(&c);
	json_t *j = NULL;
	struct client_route f;
	if (resolve(o, sandbox, &j, &f, err, errsz) < 0) {
		cache_unlock(lk);
		return -1;
	}
	if (lk >= 0)
		(void)cache_write(o, sandbox, j, entry_exp);
	cache_unlock(lk);
	json_decref(j);
	f.entry_expires_at = entry_exp;
	*out = f;
	return 0;
}

/* V3: replaces the cache entry of sandbox with the resolved route j only when
 * it still holds `refused`; V4: with the entry's own expiry (copied into
 * fresh->entry_expires_at). Returns a CLIENT_CACHE_* verdict. */
static int cache_repair(const struct client_opts *o, const char *sandbox, const struct client_route *refused,
                        json_t *j, struct client_route *fresh)
{
	int did = CLIENT_CACHE_NONE;
	int lk = cache_lock(o, sandbox);
	struct client_route c;
	memset(&c, 0, sizeof c);
	if (lk >= 0 && cache_read(o, sandbox, &c) == 0) {
		did = CLIENT_CACHE_OTHER;
		if (same_route(&c, refused) && cache_write(o, sandbox, j, c.entry_expires_at) == 0) {
			did = CLIENT_CACHE_REPLACED;
			fresh->entry_expires_at = c.entry_expires_at;
		}
	}
	cache_unlock(lk);
	client_route_clear(&c);
	return did;
}

int client_route_repair(const struct client_opts *o, const char *sandbox, const struct client_route *refused,
                        struct client_route *fresh, int *replaced, char *err, size_t errsz)
{
	json_t *j = NULL;
	struct client_route f;
	if (resolve(o, sandbox, &j, &f, err, errsz) < 0)
		return -1;
	*replaced = cache_repair(o, sandbox, refused, j, &f);
	json_decref(j);
	*fresh = f;
	return 0;
}

void client_route_forget(const struct client_opts *o, const char *sandbox, const struct client_route *refused)
{
	int lk = cache_lock(o, sandbox);
	struct client_route c;
	memset(&c, 0, sizeof c);
	if (lk >= 0 && cache_read(o, sandbox, &c) == 0 && same_route(&c, refused))
		cache_remove(o, sandbox);
	cache_unlock(lk);
	client_route_clear(&c);
}

/* ---- one HTTP exchange with a worker ---- */

/* Classifies an answer: ALLOW, or a refusal with its reason. */
static void classify(struct client_answer *a)
{
	a->outcome = CLIENT_ALLOW;
	if (a->status != 401 && a->status != 403 && a->status != 409)
		return;
	json_error_t jerr;
	json_t *b = json_loadb((const char *)a->body, a->body_len, JSON_REJECT_DUPLICATES, &jerr);
	const char *oc = json_string_value(json_object_get(b, "outcome"));
	const char *rs = json_string_value(json_object_get(b, "reason"));
	snprintf(a->reason, sizeof a->reason, "%s", rs ? rs : "unknown");
	if (oc != NULL && strcmp(oc, "REFRESH_ROUTE") == 0 && a->status == 409)
		a->outcome = CLIENT_REFRESH_ROUTE;
	else
		a->outcome = CLIENT_DENY; /* 401/403, or a 409 that is not a recognized refresh signal (V1) */
	json_decref(b);
}

int client_parse_answer(const unsigned char *in, size_t len, struct client_answer *a)
{
	free(a->body);
	a->body = NULL;
	a->body_len = 0;
	if (http_parse_answer(in, len, &a->status, &a->body, &a->body_len, NULL, NULL, 0, a->reason,
	                      sizeof a->reason) < 0) {
		a->status = 0;
		return -1;
	}
	/* the identity: given once, or it is not taken */
	long hl = http_head_length(in, len);
	if (hl <= 0 || http_head_field(in, (size_t)hl, "X-Spaced-Identity", a->identity, sizeof a->identity) < 0)
		a->identity[0] = 0;
	classify(a);
	return 0;
}

int client_identity_check(const char *route_identity, struct client_answer *a)
{
	if (a->outcome != CLIENT_ALLOW)
		return 0;
	if (a->identity[0] != 0 && strcmp(a->identity, route_identity) == 0)
		return 0;
	if (a->identity[0] == 0)
		snprintf(a->reason, sizeof a->reason, "answer %d without X-Spaced-Identity (not an execution's answer)",
		         a->status);
	else
		snprintf(a->reason, sizeof a->reason, "answer %d from %.200s, not from the route's execution %.200s",
		         a->status, a->identity, route_identity);
	a->outcome = CLIENT_UNVERIFIED;
	free(a->body);
	a->body = NULL;
	a->body_len = 0;
	return -1;
}

/* The request head for sandbox along rt (malloc'd; it holds the capability:
 * wipe it). Streamed requests say Connection: close and frame their body by
 * its length when known, else chunked. */
static char *request_head(const struct client_route *rt, const char *sandbox, const struct client_request *req,
                          int keep, size_t *headlen, struct client_answer *a)
{
	char host[256], prefix[256], framing[64];
	int port, tls;
	if (http_parse_url(rt->worker_url, host, sizeof host, &port, prefix, sizeof prefix, &tls) < 0) {
		snprintf(a->reason, sizeof a->reason, "bad worker URL '%s'", rt->worker_url);
		return NULL;
	}
	if (req->body_src != NULL && req->body_src->length < 0)
		snprintf(framing, sizeof framing, "Transfer-Encoding: chunked\r\n");
	else
		snprintf(framing, sizeof framing, "Content-Length: %llu\r\n",
		         (unsigned long long)(req->body_src ? (uint64_t)req->body_src->length : req->body_len));
	size_t need = strlen(req->method) + strlen(prefix) + strlen(sandbox) + strlen(req->op) + strlen(host) +
	              strlen(rt->capability) + 256;
	char *head = malloc(need);
	if (head == NULL) {
		snprintf(a->reason, sizeof a->reason, "out of memory");
		return NULL;
	}
	int n = snprintf(head, need,
	                 "%s %s/v1/sandboxes/%s/%s HTTP/1.1\r\nHost: %s:%d\r\n%s"
	                 "Authorization: Bearer %s\r\n%s%s%s%s\r\n",
	                 req->method, prefix, sandbox, req->op, host, port, keep ? "" : "Connection: close\r\n",
	                 rt->capability, req->content_type ? "Content-Type: " : "",
	                 req->content_type ? req->content_type : "", req->content_type ? "\r\n" : "", framing);
	if (n < 0 || (size_t)n >= need) {
		snprintf(a->reason, sizeof a->reason, "request too long");
		spaced_wipe(head, need);
		free(head);
		return NULL;
	}
	*headlen = (size_t)n;
	return head;
}

/* Sends one request for sandbox along rt and reads its whole answer
 * (http_exchange: on a kept connection from conns when there is one).
 * Returns 0 with status/identity/body set, or -1 with the transport error in
 * reason (the request may or may not have reached the worker). */
static int exchange(struct http_conns *conns, const struct client_route *rt, const char *sandbox,
                    const struct client_request *req, int timeout_s, struct client_answer *a)
{
	char host[256], prefix[256];
	int port, tls, r = -1;
	unsigned char *ans = NULL;
	size_t alen = 0, hl = 0;
	if (http_parse_url(rt->worker_url, host, sizeof host, &port, prefix, sizeof prefix, &tls) < 0) {
		snprintf(a->reason, sizeof a->reason, "bad worker URL '%s'", rt->worker_url);
		return -1;
	}
	char *head = request_head(rt, sandbox, req, conns != NULL, &hl, a);
	if (head == NULL)
		return -1;
	if (http_exchange(conns, host, port, tls, head, hl, req->body, req->body_len, timeout_s, &ans, &alen, a->reason,
	                  sizeof a->reason) < 0 ||
	    client_parse_answer(ans, alen, a) < 0)
		goto out;
	r = 0;
out:
	spaced_wipe(head, hl); /* it holds the capability */
	free(head);
	free(ans);
	return r;
}

/* The rest of an answer's body into a->body (a refusal, an error or a small
 * document: at most 1 MiB). Returns 0 or -1 with the reason. */
static int stream_slurp(struct http_stream *s, struct client_answer *a)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 1u << 20);
	for (;;) {
		const unsigned char *d;
		long n = http_stream_next(s, &d, a->reason, sizeof a->reason);
		if (n < 0) {
			spaced_buf_free(&b);
			return -1;
		}
		if (n == 0)
			break;
		if (spaced_buf_append(&b, d, (size_t)n) < 0) {
			snprintf(a->reason, sizeof a->reason, "answer larger than 1 MiB");
			spaced_buf_free(&b);
			return -1;
		}
	}
	free(a->body);
	a->body = malloc(b.len + 1);
	if (a->body == NULL) {
		spaced_buf_free(&b);
		snprintf(a->reason, sizeof a->reason, "out of memory");
		return -1;
	}
	if (b.len)
		memcpy(a->body, b.data, b.len);
	a->body[b.len] = 0;
	a->body_len = b.len;
	spaced_buf_free(&b);
	return 0;
}

/* One streamed request on a new connection: the body from req->body_src as
 * it is sent, a 2xx answer of the route's execution to req->sink as it
 * arrives (memory bounded by a few buffers whatever the sizes). Returns 0 with
 * the answer classified (the identity already checked), or -1 with the
 * transport error in reason — also when an answer was cut short after
 * a->delivered bytes went to the sink. */
static int exchange_stream(const struct client_route *rt, const char *sandbox, const struct client_request *req,
                           int timeout_s, struct client_answer *a)
{
	char host[256], prefix[256];
	int port, tls, r = -1;
	size_t hl = 0;
	struct http_stream *s = NULL;
	struct http_answer_head ah;
	if (http_parse_url(rt->worker_url, host, sizeof host, &port, prefix, sizeof prefix, &tls) < 0) {
		snprintf(a->reason, sizeof a->reason, "bad worker URL '%s'", rt->worker_url);
		return -1;
	}
	char *head = request_head(rt, sandbox, req, 0, &hl, a);
	if (head == NULL)
		return -1;
	int e = http_stream_open(host, port, tls, head, hl, req->body, req->body_len, req->body_src, timeout_s, &s, &ah,
	                         a->reason, sizeof a->reason);
	spaced_wipe(head, hl); /* it holds the capability */
	free(head);
	if (e < 0)
		return -1;
	free(a->body);
	a->body = NULL;
	a->body_len = 0;
	a->status = ah.status;
	snprintf(a->identity, sizeof a->identity, "%s", ah.identity);
	if (a->status == 401 || a->status == 403 || a->status == 409) {
		if (stream_slurp(s, a) < 0)
			goto out;
		classify(a);
		r = 0;
		goto out;
	}
	a->outcome = CLIENT_ALLOW;
	if (client_identity_check(rt->identity, a) < 0) {
		r = 0; /* refused before a byte of its body is read */
		goto out;
	}
	if (a->status < 200 || a->status > 299 || req->sink == NULL) {
		if (stream_slurp(s, a) < 0)
			goto out;
		r = 0;
		goto out;
	}
	for (;;) {
		const unsigned char *d;
		long n = http_stream_next(s, &d, a->reason, sizeof a->reason);
		if (n < 0) {
			size_t l = strlen(a->reason);
			snprintf(a->reason + l, sizeof a->reason - l, " after %llu bytes", (unsigned long long)a->delivered);
			goto out;
		}
		if (n == 0)
			break;
		if (req->sink(req->sink_arg, d, (size_t)n) < 0) {
			a->sink_failed = 1;
			break;
		}
		a->delivered += (uint64_t)n;
	}
	if ((a->body = malloc(1)) != NULL)
		a->body[0] = 0;
	r = 0;
out:
	http_stream_close(s);
	return r;
}

static const char *outcome_name(enum client_outcome o)
{
	switch (o) {
	case CLIENT_ALLOW: return "ALLOW";
	case CLIENT_REFRESH_ROUTE: return "REFRESH_ROUTE";
	case CLIENT_DENY: return "DENY";
	case CLIENT_UNVERIFIED: return "UNVERIFIED";
	default: return "TRANSPORT";
	}
}

static void tell(const struct client_opts *o, const struct client_route *rt, const struct client_answer *a)
{
	if (!o->verbose)
		return;
	if (a->outcome == CLIENT_ALLOW)
		fprintf(stderr, "spacectl: %d from %s (identity %s)\n", a->status, rt->worker_url,
		        a->identity[0] ? a->identity : "none");
	else
		fprintf(stderr, "spacectl: %s %s from %s (route %s)\n", outcome_name(a->outcome), a->reason,
		        rt->worker_url, rt->identity);
}

const char *client_cache_verdict(int replaced)
{
	switch (replaced) {
	case CLIENT_CACHE_REPLACED: return "cache entry replaced, its expiry kept";
	case CLIENT_CACHE_OTHER: return "cache entry left alone: it holds another route";
	default: return "no cache entry";
	}
}

int client_call(const struct client_opts *o, const char *sandbox, const struct client_request *req,
                struct client_answer *out, char *err, size_t errsz)
{
	struct client_route rt, refused;
	struct client_answer a;
	json_t *repair_json = NULL; /* the route resolved after a REFRESH_ROUTE, for the cache */
	int transport_retry = 0, refreshed = 0, attempts = 0;
	memset(&a, 0, sizeof a);
	memset(&refused, 0, sizeof refused);
	if (client_route_get(o, sandbox, &rt, err, errsz) < 0)
		return -1;
	int timeout = req->timeout_s > 0 ? req->timeout_s : 300;
	for (;;) {
		client_answer_clear(&a);
		attempts++;
		int streamed = req->body_src != NULL || req->sink != NULL;
		if ((streamed ? exchange_stream(&rt, sandbox, req, timeout, &a)
		              : exchange(o->conns, &rt, sandbox, req, timeout, &a)) < 0) {
			a.outcome = CLIENT_TRANSPORT;
			a.status = 0;
			if (o->verbose)
				fprintf(stderr, "spacectl: transport failure at %s: %s\n", rt.worker_url, a.reason);
			/* an idempotent read may go once more on a fresh connection
			 * (unless part of its answer was handed on already); a write
			 * or an exec may have happened: never sent again */
			if (req->idempotent && !o->no_retry && !transport_retry && a.delivered == 0) {
				transport_retry = 1;
				continue;
			}
			break;
		}
		/* an answer that does not name the route's execution is refused (I2, I3) */
		(void)client_identity_check(rt.identity, &a);
		tell(o, &rt, &a);
		if (a.outcome == CLIENT_DENY || a.outcome == CLIENT_UNVERIFIED) {
			if (o->route_file == NULL)
				client_route_forget(o, sandbox, &rt);
			break; /* V1, C5: never retried */
		}
		if (a.outcome != CLIENT_REFRESH_ROUTE || o->no_retry || refreshed)
			break;
		if (req->body_src != NULL && (req->body_rewind == NULL || req->body_rewind(req->body_src->arg) < 0)) {
			a.not_replayable = 1; /* its body cannot be sent again */
			break;
		}
		/* V2: resolve the current execution, one rebuilt retry. The cache is
		 * repaired (V3, V4) after the retry: nothing (a lock, an fsync) stands
		 * between the resolution and the retry, the moment the fresh route is
		 * most likely to still be current. */
		struct client_route fresh;
		if (resolve(o, sandbox, &repair_json, &fresh, err, errsz) < 0) {
			client_route_clear(&rt);
			client_answer_clear(&a);
			return -1;
		}
		if (o->verbose)
			fprintf(stderr, "spacectl: route resolved again: %s at %s; one retry\n", fresh.identity,
			        fresh.worker_url);
		refused = rt;
		rt = fresh;
		refreshed = 1;
	}
	if (repair_json != NULL) {
		int replaced = cache_repair(o, sandbox, &refused, repair_json, &rt);
		if (o->verbose)
			fprintf(stderr, "spacectl: %s\n", client_cache_verdict(replaced));
		json_decref(repair_json);
		client_route_clear(&refused);
	}
	client_route_clear(&rt);
	a.attempts = attempts;
	a.refreshed = refreshed;
	*out = a;
	return 0;
}
