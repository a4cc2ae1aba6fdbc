/*
 * client.h — spacectl's client side of the route: the on-disk route cache and
 * one operation sent to the worker that serves a sandbox, with the recovery
 * rules of DESIGN.md V1–V4 in one place (client_call()).
 *
 * A route is a `POST /v1/sandboxes/{id}/route` answer of the control plane
 * (the `spacectl route --json` document): the execution identity, the worker's
 * node-api address and a capability for the control purposes (fs.read,
 * fs.write, exec, term, watch). spacectl keeps one route per sandbox in a cache
 * directory ($SPACED_ROUTE_CACHE, else $XDG_RUNTIME_DIR/spaced/routes, else
 * ~/.cache/spaced/routes): FILE = <sandbox>.json holding
 * {"cp_url":…, "entry_expires_at":N, "route":{…}}. entry_expires_at is the
 * caller's session (set when the entry is first resolved, CLIENT_SESSION_TTL
 * seconds); route repair never moves it (V4). Every read-modify-write of an
 * entry happens under flock() on <sandbox>.lock.
 *
 * Every ALLOW answer must carry X-Spaced-Identity naming the route's
 * execution (I2, I3: an address only locates); one that does not is refused
 * as CLIENT_UNVERIFIED, its body never shown, never retried.
 *
 * Recovery (client_call):
 *  - 401/403 DENY: returned as is, never retried (V1, C5); the cache entry is
 *    dropped when it still holds the refused route.
 *  - 409 REFRESH_ROUTE: the route is resolved again at the control plane and
 *    the request rebuilt and sent exactly once more to the new route (V2);
 *    the cache entry is replaced only when it still holds the refused route
 *    (compare-and-swap on the capability, V3), keeping its expiry (V4).
 *  - transport failure (no connection, connection cut, malformed answer): an
 *    idempotent request is sent once more on a fresh connection, unless some
 *    of its answer was already handed on (a streamed read cut short); any
 *    other is reported as failed and never sent again.
 *  - with no_retry nothing is retried and the raw outcome is returned.
 */
#ifndef SPACECTL_CLIENT_H
#define SPACECTL_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "http_client.h"
#include "identity.h"

/* The caller's session: how long a cache entry lives after it was resolved
 * on a miss. Route repair keeps it (V4). */
#define CLIENT_SESSION_TTL 3600
/* A capability is not used in its last seconds (it could expire in flight). */
#define CLIENT_CAP_MARGIN 5
/* How long a route resolution waits for a moving or starting sandbox. */
#define CLIENT_RESOLVE_WAIT 30
/* Largest file content spacectl sends or an answer it reads from a worker. */
#define CLIENT_ANSWER_MAX HTTP_RESPONSE_MAX

struct client_opts {
	struct http_conns *conns; /* kept-alive worker connections (http_client.h); NULL: one per request */
	const char *cp_url;     /* SPACED_CP_URL */
	const char *api_key;    /* SPACED_API_KEY */
	const char *route_file; /* --route FILE: start from this saved route (a stale cache) */
	const char *cache_dir;  /* NULL: the default directory above */
	int no_retry;           /* --no-retry */
	int verbose;            /* -v: every answer's serving identity on stderr */
};

/* A route as loaded from the control plane, a cache entry or a route file. */
struct client_route {
	char *capability;        /* owned */
	char worker_url[256];
	char identity[512];      /* canonical text (identity.h) */
	int64_t cap_expires_at;  /* Unix seconds */
	int64_t entry_expires_at; /* the cache entry's expiry (0 when not from the cache) */
};

void client_route_clear(struct client_route *r);

/* The route an operation on sandbox starts from: the --route file when given,
 * else a usable cache entry, else a fresh route from the control plane stored
 * as a new entry. Returns 0 (clear *out with client_route_clear) or -1 with a
 * reason in err. */
int client_route_get(const struct client_opts *o, const char *sandbox, struct client_route *out, char *err,
                     size_t errsz);

enum { CLIENT_CACHE_NONE = 0, CLIENT_CACHE_REPLACED = 1, CLIENT_CACHE_OTHER = 2 };

/* After a REFRESH_ROUTE answer to `refused`: resolves the route at the control
 * plane into *fresh and replaces the cache entry only when it still holds
 * `refused` (V3), keeping the entry's expiry (V4). *replaced is
 * CLIENT_CACHE_REPLACED, CLIENT_CACHE_OTHER (the entry holds another route:
 * left alone) or CLIENT_CACHE_NONE. Returns 0 or -1 with a reason in err. */
int client_route_repair(const struct client_opts *o, const char *sandbox, const struct client_route *refused,
                        struct client_route *fresh, int *replaced, char *err, size_t errsz);

/* After a DENY answer to `refused`: drops the cache entry when it still holds it. */
/* A human phrase for a *replaced value of client_route_repair. */
const char *client_cache_verdict(int replaced);

void client_route_forget(const struct client_opts *o, const char *sandbox, const struct client_route *refused);

/* The cache entry file of sandbox (for tools and tests), or -1. */
int client_cache_path(const struct client_opts *o, const char *sandbox, char *out, size_t outsz);

enum client_outcome {
	CLIENT_ALLOW = 0,     /* the route's execution answered (status may still be an operation error) */
	CLIENT_REFRESH_ROUTE, /* 409: another incarnation; after the one retry when retrying */
	CLIENT_DENY,          /* 401/403 */
	CLIENT_TRANSPORT,     /* no usable answer */
	CLIENT_UNVERIFIED,    /* an answer that does not name the route's execution (no
	                       * X-Spaced-Identity, or another one): refused, its body dropped */
};

struct client_request {
	const char *method;     /* GET, PUT, POST, DELETE */
	const char *op;         /* after /v1/sandboxes/{id}/ : "files?path=…", "exec", … (already encoded) */
	const void *body;       /* may be NULL */
	size_t body_len;
	const char *content_type;
	int idempotent;         /* may be sent again after a transport failure */
	int timeout_s;          /* how long to wait for the answer (0: 300 s); streamed: for each step */
	/* Streaming (a new connection per request, bounded memory, any size):
	 * body_src: the body is read from it as it is sent (instead of body);
	 *   body_rewind(body_src->arg) starts it again for V2's one retry (0), or
	 *   cannot (-1: the retry is not made);
	 * sink: the body of a 2xx answer that names the route's execution is
	 *   handed to sink as it arrives (instead of into client_answer.body);
	 *   sink returns 0, or -1 to stop (client_answer.sink_failed). */
	const struct http_body_src *body_src;
	int (*body_rewind)(void *arg);
	int (*sink)(void *arg, const void *p, size_t n);
	void *sink_arg;
};

struct client_answer {
	enum client_outcome outcome;
	int status;             /* HTTP status (0 on transport failure) */
	char reason[512];       /* DENY / REFRESH_ROUTE reason, or the transport error */
	char identity[512];     /* X-Spaced-Identity of the answer ("" for refusals) */
	unsigned char *body;    /* owned, NUL-terminated */
	size_t body_len;
	int attempts;           /* requests sent (1 or 2) */
	int refreshed;          /* 1 when a REFRESH_ROUTE was repaired */
	uint64_t delivered;     /* body bytes handed to the request's sink */
	int sink_failed;        /* the sink stopped the answer */
	int not_replayable;     /* a REFRESH_ROUTE was not retried: the body could not be sent again */
};

void client_answer_clear(struct client_answer *a);

/* Sends req for sandbox along the recovery rules above. Returns 0 with the
 * final answer in *out (clear it with client_answer_clear) — whatever its
 * outcome — or -1 with a reason in err when no route could be had. */
int client_call(const struct client_opts *o, const char *sandbox, const struct client_request *req,
                struct client_answer *out, char *err, size_t errsz);

/* Parses one whole HTTP/1.1 answer of a worker (len bytes, as read until the
 * connection closed or http_answer_length() found its end): status, X-Spaced-Identity, the body (Content-Length or
 * chunked; a chunked body without its final chunk is "cut short") and the
 * outcome (ALLOW, or DENY / REFRESH_ROUTE with its reason from the body).
 * Fills a->status, identity, body (replacing any), outcome and reason.
 * Returns 0, or -1 with the reason in a->reason. */
int client_parse_answer(const unsigned char *in, size_t len, struct client_answer *a);

/* An ALLOW answer must name the route's execution: when a (outcome ALLOW)
 * carries no X-Spaced-Identity, or another identity than route_identity (the
 * canonical text), a becomes CLIENT_UNVERIFIED with the reason and its body
 * is dropped. Returns 0 when a is left as it was, -1 when it was refused. */
int client_identity_check(const char *route_identity, struct client_answer *a);

/* Percent-encodes s for a query value into out. Returns 0 or -1 when too long. */
int client_query_escape(const char *s, char *out, size_t outsz);


#endif
