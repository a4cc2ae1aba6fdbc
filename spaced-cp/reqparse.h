/*
 * reqparse.h — strict parsing of everything the control plane reads from a
 * peer as JSON: API request bodies and the worker's control-channel messages.
 * Each parser takes raw bytes (not NUL-terminated), refuses duplicate keys,
 * unknown members, wrong types and out-of-range values, and writes *out only
 * on success. On failure err receives a short reason for the 400 body.
 */
#ifndef SPACED_CP_REQPARSE_H
#define SPACED_CP_REQPARSE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "identity.h"
#include "resources.h"

#define CP_BODY_MAX (64 * 1024)
#define CP_URL_MAX 256
#define CP_SUBSTRATES_MAX 8
#define CP_NETWORK_MAX 40000 /* canonical policy JSON: 2 × 64 entries of at most 253 bytes */

#define CP_ENV_MAX 64        /* create-time environment variables */
#define CP_META_MAX 32       /* metadata entries */
#define CP_ENV_JSON_MAX 8192
#define CP_META_JSON_MAX 4096

struct cp_create_req {
	char template_name[SPACED_NAME_MAX]; /* "" when none */
	char template_hash[65];              /* "" when none: a tree the tenant built (template build) */
	char env_json[CP_ENV_JSON_MAX];      /* {"K":"V",…} compact, "" when none */
	char meta_json[CP_META_JSON_MAX];    /* {"K":"V",…} compact, "" when none */
	int auto_resume;                     /* an operation on it while paused for idleness resumes it */
	int restart_on_failure;              /* "restart": "on-failure": a failed sandbox is resumed (bounded) */
	struct spaced_resources res;          /* fields of 0: the placed worker's defaults */
	char substrate[SPACED_NAME_MAX];      /* "process" when the body names none */
	int has_substrate;                    /* 1 when the body named it */
	char worker[SPACED_NAME_MAX];         /* "" to let placement choose */
	int64_t idle_timeout, max_lifetime;   /* seconds, -1 = control-plane default, 0 = none */
	char network[CP_NETWORK_MAX];         /* the egress policy, canonical JSON (netpolicy.h); "" when none given */
	char idem_key[65];                    /* the request's Idempotency-Key, "" for none (not in the body) */
};

struct cp_route_req {
	uint32_t purposes; /* enum spaced_purpose bits */
	int serviceport;   /* 1 when purposes is exactly serviceport */
	uint16_t port;
	char protocol[8];
};

/* A worker's resource defaults and maxima, and what its sandboxes' limits
 * may add up to: {"default": {…}, "max": {…}, "allocatable": {"memory_bytes",
 * "pids", "memory_overcommit"}} (allocatable optional; 0: no bound). */
struct cp_worker_limits {
	int has;
	struct spaced_resources def, max;
	uint64_t alloc_memory, alloc_pids;
	double memory_overcommit;
};

struct cp_worker_reg {
	char id[SPACED_NAME_MAX];
	char url[CP_URL_MAX];
	int64_t capacity;
	char substrates[CP_SUBSTRATES_MAX * SPACED_NAME_MAX]; /* comma-separated names */
	struct cp_worker_limits limits;
};

enum cp_chan_kind { CP_CHAN_HELLO = 1, CP_CHAN_ACK = 2, CP_CHAN_ENDED = 3 };

/* An install a worker applied that was sent to it tentative (before the
 * control plane's commit was on its disk, docs/control-messages.md
 * "Tentative installs") and not yet said durable: its seq and the
 * identity it named. */
struct cp_tentative {
	int64_t seq;
	char sandbox[SPACED_NAME_MAX];
	char activation[SPACED_NAME_MAX];
};
#define CP_TENTATIVE_MAX 256 /* entries a hello lists at most (about 23 KiB: within CP_BODY_MAX) */

struct cp_chan_msg {
	enum cp_chan_kind kind;
	/* hello */
	char worker[SPACED_NAME_MAX];
	int64_t last_seq, capacity;
	char substrates[CP_SUBSTRATES_MAX * SPACED_NAME_MAX];
	int has_capacity, has_substrates;
	struct cp_worker_limits limits;
	int64_t fence_after; /* the worker fences itself after this many seconds without the control plane (0: never) */
	struct cp_tentative *tentative; /* its tentative installs, by seq (NULL: none); the caller frees it */
	size_t ntentative;
	int has_tentative; /* the hello had "tentative" (even empty): the worker takes installs sent tentative */
	/* ack */
	int64_t seq;
	int ok;
	char code[SPACED_NAME_MAX];
	char error[256];
	char *result; /* compact JSON of "result" or NULL; the caller frees it */
	/* ended: the execution identity that died on the worker, and how */
	struct spaced_identity ended;
	char reason[256];
};

/* POST /v1/sandboxes: {"template","template_hash","cpus","memory_bytes","pids","disk_bytes",
 * "substrate","worker","idle_timeout","max_lifetime","env","metadata","auto_resume","restart","network"}, every
 * member optional ("template" and "template_hash" exclude each other). "env": at most 64 names
 * [A-Za-z_][A-Za-z0-9_]* (up to 128 bytes) to strings of up to 4096 bytes without NUL; "metadata":
 * at most 32 keys [A-Za-z0-9._-] (up to 63 bytes) to strings of up to 256 bytes; network is an
 * egress policy (netpolicy.h), kept in canonical form. An empty body is {}. */
int cp_parse_create(const char *body, size_t len, struct cp_create_req *out, char *err, size_t errsz);

/* The metadata filter of GET /v1/sandboxes?meta=K=V…: the same key and value rules. */
int cp_parse_meta_pair(const char *s, size_t len, char key[64], char val[257]);

/* POST /v1/sandboxes/{id}/timeout: {"seconds": N} (0 .. 365 days from now). */
int cp_parse_timeout(const char *body, size_t len, int64_t *seconds, char *err, size_t errsz);

/* POST /v1/sandboxes/{id}/route: {"purposes":[…], "port":N, "protocol":"tcp"}.
 * purposes defaults to ["fs.read","fs.write","exec","term","watch","lifecycle"]; "serviceport"
 * must be alone and needs port (protocol defaults to "tcp"); port and protocol
 * are refused without it. */
int cp_parse_route(const char *body, size_t len, struct cp_route_req *out, char *err, size_t errsz);

/* POST /v1/workers: {"id","url","capacity","substrates":[…]}. */
int cp_parse_worker(const char *body, size_t len, struct cp_worker_reg *out, char *err, size_t errsz);

/* Optional {"worker": W} (resume) or {"to": W} (move): member names the one
 * accepted member; out receives "" when the body is empty or the member absent. */
int cp_parse_target(const char *body, size_t len, const char *member, char out[SPACED_NAME_MAX],
                    char *err, size_t errsz);

/* A control-channel message from a worker: {"hello":{…}}, {"ack":N,"ok":B,…}
 * or {"ended":{"identity":{…},"reason":"…"}} (reason: up to 255 bytes, no NUL). */
int cp_parse_chan(const char *msg, size_t len, struct cp_chan_msg *out);

/* The limits member of a hello or registration (JSON object or NULL). */
int cp_parse_limits(json_t *o, struct cp_worker_limits *out, char *err, size_t errsz);

/* The JSON form of limits (a new reference), as the workers listing shows it. */
json_t *cp_limits_json(const struct cp_worker_limits *l);

/* The JSON text of limits (a new string), as the workers table keeps it. */
char *cp_limits_text(const struct cp_worker_limits *l);

/* Reads the workers table's text back (NULL or malformed: has = 0). */
void cp_limits_from_text(const char *text, struct cp_worker_limits *out);

/* True when the comma-separated list has name. */
int cp_list_has(const char *list, const char *name);

/* POST /v1/sandboxes/{id}/network: an egress policy object (netpolicy.h);
 * out (CP_NETWORK_MAX bytes) receives its canonical JSON. */
int cp_parse_network(const char *body, size_t len, char *out, char *err, size_t errsz);

#endif
