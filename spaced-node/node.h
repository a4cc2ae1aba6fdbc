/*
 * node.h — private header of spaced-node, the worker daemon.
 *
 * spaced-node runs as two processes joined by one socketpair:
 *
 *   sbx-manager (privileged; node_main.c forks, the parent stays manager)
 *     owns the runtime records (mgr_store.c), the admin socket (mgr_admin.c),
 *     the executions (mgr_exec.c); verifies every capability and compares the
 *     identity (R1) before a byte goes to the sandbox's bridge (mgr_main.c).
 *   node-api (the child: gives up its privileges and enters a seccomp
 *     allow-list right after start, node_sandbox.c)
 *     speaks HTTP and WebSocket to the network (node_api.c), turns requests
 *     into guest-protocol requests (node_req.c) and hands them to the manager.
 *
 * The socketpair carries frame.h frames. The frame id is node-api's request
 * id. Each side has a fixed dispatch table; unknown types, flags or malformed
 * payloads drop the connection; when either process ends the other follows,
 * and a restart of spaced-node finds the runtime records as they were.
 */
#ifndef SPACED_NODE_H
#define SPACED_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cap.h"
#include "compare.h"
#include "frame.h"
#include "guest_proto.h"
#include "identity.h"
#include "resources.h"
#include "util.h"

/* ---- the socketpair message table ---- */
enum node_msg {
	/* node-api -> sbx-manager */
	NODE_MSG_REQ = 0x0A01,   /* s token, s sandbox (from the URL), u guest type,
	                            b guest payload, u port, s protocol */
	NODE_MSG_IN = 0x0A02,    /* u guest input type, b bytes; END flag passes through */
	NODE_MSG_CLOSE = 0x0A03, /* (none): the client went away; the stream ends */
	/* sbx-manager -> node-api */
	NODE_MSG_ACCEPT = 0x0B01, /* s identity text, u epoch: forwarded to the bridge */
	NODE_MSG_REFUSE = 0x0B02, /* END: u verdict, u reason, s sandbox */
	NODE_MSG_OUT = 0x0B03,    /* u guest output type, b payload; END on the RESULT */
	NODE_MSG_CANCEL = 0x0B04, /* END: u verdict, u reason — the stream's lease ended (S1) */
	NODE_MSG_FAIL = 0x0B05,   /* END: i error, s message — the backend failed */
};

/* Largest frame on the socketpair: a guest chunk plus its fields. */
#define NODE_MSG_MAX (SPACED_FRAME_CHUNK + 1024)
/* Largest capability token accepted. */
#define NODE_TOKEN_MAX 4096
/* Pseudo guest types answered without the guest (node-api -> manager only). */
#define NODE_PORT_OPEN 0x0050 /* ServicePort stream */
#define NODE_USAGE 0x0051     /* what the execution uses now (purpose lifecycle) */

/* ---- request parsing (node_req.c; pure, fuzzed) ---- */

enum node_method { NODE_GET = 1, NODE_PUT, NODE_POST, NODE_DELETE };

enum node_body {
	NODE_BODY_NONE = 0, /* no body is read */
	NODE_BODY_STREAM,   /* body streamed as IN_DATA frames (file write) */
	NODE_BODY_EXEC,     /* JSON exec body, buffered then translated */
};

enum node_answer {
	NODE_ANS_JSON = 1, /* a JSON document built from the RESULT */
	NODE_ANS_STREAM,   /* octet stream from DATA frames (file read) */
	NODE_ANS_WS_TERM,  /* WebSocket terminal */
	NODE_ANS_WS_WATCH, /* WebSocket watch */
	NODE_ANS_WS_PORT,  /* WebSocket ServicePort tunnel */
};

/* One parsed HTTP request, ready for the manager. */
struct node_req {
	char sandbox[SPACED_NAME_MAX];
	uint16_t guest_type;      /* SPACED_GUEST_* or NODE_PORT_OPEN */
	struct spaced_buf payload; /* guest request fields (owned) */
	enum node_body body;
	enum node_answer answer;
	uint16_t port;            /* ServicePort only */
	char protocol[SPACED_PROTOCOL_MAX];
	uint32_t exec_flags;      /* the EXEC flags sent (BACKGROUND, STDIN) */
};

#define NODE_BODY_MAX (1u << 20)   /* largest exec JSON body */
#define NODE_QUERY_MAX 16384       /* largest query string */
#define NODE_QUERY_FRAGS 64        /* most query parameters */

/* Query parameters, each a decoded NUL-terminated "name=value" (or "name"). */
struct node_query {
	size_t n;
	const char *frag[NODE_QUERY_FRAGS];
};

/* Splits a raw query string raw[0..len) at '&' and percent-decodes each
 * fragment ('+' is a space) into store[0..storesz); q points into store.
 * Returns 0, SPACED_EFORMAT (bad escape, NUL byte) or SPACED_ETOOBIG. */
int node_query_split(const char *raw, size_t len, char *store, size_t storesz, struct node_query *q);

/* Parses method + path + query (decoded fragments, may be NULL) into *out.
 * websocket says the request is an upgrade. Returns 0, SPACED_ENOENT (no such
 * endpoint: 404), SPACED_EINVAL (bad method for the endpoint: 405),
 * SPACED_EFORMAT (bad or missing parameter: 400) or SPACED_ENOMEM. *out is
 * written only on success; release it with node_req_clear. */
int node_req_parse(struct node_req *out, enum node_method method, const char *path,
                   const struct node_query *query, bool websocket);

/* Builds the EXEC payload from a JSON body {"argv":[…], "env":{…} or […],
 * "cwd":…, "timeout_ms":…, "background":bool, "stdin": "text"}; *stdin_data /
 * *stdin_len receive the stdin text (a pointer into *keep, which the caller
 * json_decref()s) when given. Returns 0 or SPACED_EFORMAT / SPACED_EJSON. */
int node_req_exec_body(struct node_req *r, const char *body, size_t len, void **keep,
                       const char **stdin_data, size_t *stdin_len);

void node_req_clear(struct node_req *r);

/* Copies the first value of parameter name into out (outsz bytes incl. NUL).
 * Returns its length, SPACED_ENOENT when absent, SPACED_ETOOBIG when it does
 * not fit. */
int node_query_get(const struct node_query *query, const char *name, char *out, size_t outsz);

/* Extracts the token of "Bearer <token>" (case-insensitive scheme, one space
 * or more). Returns 0 with *tok / *toklen pointing into hdr, or SPACED_EFORMAT. */
int node_bearer(const char *hdr, size_t len, const char **tok, size_t *toklen);

/* HTTP status of a refusal: DENY → 401 (verification failures) or 403, REFRESH_ROUTE → 409. */
int node_refusal_status(enum spaced_verdict v, enum spaced_reason r);

/* HTTP status of a guest error code. Never 401/403/409, which belong to identity outcomes. */
int node_error_status(int err);

/* ---- node-api (node_api.c) ---- */
struct node_api_config {
	const char *listen_host;
	int listen_port;
	int mgr_fd;          /* the socketpair end */
	const char *port_file; /* where the bound port is written, or NULL */
	bool drop_privileges;
};
/* Runs node-api until the manager goes away. Returns the exit status. */
int node_api_run(const struct node_api_config *cfg);

/* node_sandbox.c: setresuid/gid to nobody (when root), no_new_privs, seccomp allow-list. */
int node_api_confine(bool drop_privileges);

/* ---- sbx-manager ---- */
struct mgr_config {
	const char *state_dir;
	const char *worker_id;
	const char *keys_path; /* may be NULL */
	const char *guest_bin;  /* spaced-guest */
	const char *launch_bin; /* spaced-launch: with host_bin, the process substrate */
	const char *host_bin;   /* spaced-host: the per-execution bridge */
	int api_fd;
	pid_t api_pid;
	struct spaced_resources limits_default; /* for what an install leaves out */
	struct spaced_resources limits_max;     /* an install above these is refused */
	uint32_t uid_first;     /* executions' uid ranges: uid_first + k * 65536 … */
	uint32_t uid_slots;     /* … for k < uid_slots */
	const char *uid_lock_dir; /* host-wide locks of the ranges in use */
};
int mgr_run(const struct mgr_config *cfg);

#endif
