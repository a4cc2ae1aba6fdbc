/*
 * node.h — private header of spaced-node, the worker daemon.
 *
 * spaced-node runs as a small tree of processes, one per role:
 *
 *   supervisor (the process started; node_main.c): starts the group below,
 *     restarts it when any of it dies (with a growing pause between tries),
 *     reaps what it adopts; a restart finds the records as they were
 *   └─ sbx-manager, the gate (gate_main.c and gate_*.c; privileged): the
 *      runtime records (mgr_store.c), the admin socket and the control
 *      messages, verification and comparison of every capability (R1) before
 *      a byte goes to an execution, and the streams — on one event loop that
 *      never waits for an execution
 *      ├─ node-api (node_api.c; gives up its privileges and enters a seccomp
 *      │  allow-list right after start, node_sandbox.c): HTTP and WebSocket
 *      │  to the network; turns requests into guest-protocol requests
 *      │  (node_req.c) and hands them to the gate
 *      └─ the executor (executor.c): starts, stops, pauses and snapshots
 *         executions and connects to their bridges, as jobs of the gate
 *
 * The gate and node-api talk in frame.h frames over a socketpair (the frame
 * id is node-api's request id); the gate and the executor in one frame per
 * SOCK_SEQPACKET message (executor.h). Every message of both links is declared
 * once, in links.c (direction, payload bound, flags, the states of its id in
 * which it is allowed); each receiver checks every message against it, and
 * unknown types, wrong flags or states and malformed payloads end that link,
 * and with it the group, which the supervisor starts again.
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
	                            b guest payload, u port, s protocol,
	                            s request id, s client address */
	NODE_MSG_IN = 0x0A02,    /* u guest input type, b bytes; END flag passes through */
	NODE_MSG_CLOSE = 0x0A03, /* (none): the client went away; the stream ends */
	NODE_MSG_CREDIT = 0x0A04, /* u bytes: output of the stream its client has taken (flow control) */
	NODE_MSG_METRICS = 0x0A05, /* (none): the worker's metrics, for the metrics listener */
	/* sbx-manager -> node-api */
	NODE_MSG_ACCEPT = 0x0B01, /* s identity text, u epoch: forwarded to the bridge */
	NODE_MSG_REFUSE = 0x0B02, /* END: u verdict, u reason, s sandbox */
	NODE_MSG_OUT = 0x0B03,    /* u guest output type, b payload; END on the RESULT */
	NODE_MSG_CANCEL = 0x0B04, /* END: u verdict, u reason — the stream's lease ended (S1) */
	NODE_MSG_FAIL = 0x0B05,   /* END: i error, s message — the backend failed */
	NODE_MSG_GCREDIT = 0x0B06, /* u bytes: input of the stream the execution has taken (flow control) */
	NODE_MSG_METRICS_TEXT = 0x0B07, /* b a part of the metrics text; END on the last */
};

/* Flow control on the socketpair: per stream and direction, at most this
 * many bytes on their way (the gate's GATE_WINDOW). */
#define NODE_WINDOW (1024u << 10)
/* ... while all the streams' windows in one direction together hold less
 * than NODE_WINDOWS_BUDGET; past it a stream gets NODE_WINDOW_SMALL, so a
 * tenant that stalls hundreds of streams holds the budget (plus 64 KiB a
 * stream) in node-api and the gate, not a MiB each, and everyone's streams
 * still move. (The output side is the gate's, the input side node-api's: each
 * holds back what its own side sends.) */
#define NODE_WINDOWS_BUDGET (64u << 20)
#define NODE_WINDOW_SMALL (64u << 10)
/* node-api credits a stream's output in batches of this much (sooner when
 * nothing is left to write): up to this much it took may stay uncredited while
 * a command is quiet, so the gate takes a stream for stalled by its client only
 * past it (gate_streams_tick) */
#define NODE_CREDIT_BATCH (32u << 10)

/* Largest frame on the socketpair: a guest chunk plus its fields. */
#define NODE_MSG_MAX (SPACED_FRAME_CHUNK + 1024)
/* Largest capability token accepted. */
#define NODE_TOKEN_MAX 4096
/* Room for a request id (1-64 of [A-Za-z0-9._-]) and its NUL. */
#define NODE_REQUEST_ID_MAX 65
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
	NODE_ANS_WS_EXEC,  /* WebSocket exec: output as it comes, stdin in, signals */
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
	const char *metrics_host; /* the metrics listener (GET /metrics), or NULL: none */
	int metrics_port;
	const char *metrics_port_file;
	/* TLS on both listeners (tls.h), loaded before the confinement; NULL
	 * cert: plaintext (--plaintext). client_ca: every client must present a
	 * certificate of this CA. */
	const char *tls_cert, *tls_key, *tls_client_ca;
	/* what node-api may hold for exec bodies, JSON answers being collected
	 * and answers its clients have not taken (0: NODE_ANSWER_MEMORY); past
	 * it a request that would hold more than 64 KiB is refused 503 */
	uint64_t answer_memory;
	/* each client connection's kernel buffers, both ways (SO_SNDBUF and
	 * SO_RCVBUF: the kernel holds up to twice each; 0: NODE_SOCKET_BUFFER),
	 * so output a client does not read, and input node-api does not take
	 * yet, stay in node-api's budget and windows, not in the kernel */
	uint64_t socket_buffer;
	/* a client that takes none of its queued output for this long is
	 * closed (the gate's --stall-timeout, the same for every answer) */
	int stall_timeout_ms;
};
#define NODE_ANSWER_MEMORY (256ull << 20)
#define NODE_SOCKET_BUFFER (256u << 10)
/* Runs node-api until the manager goes away. Returns the exit status. */
int node_api_run(const struct node_api_config *cfg);

/* node_sandbox.c: setresuid/gid to nobody (when root), no_new_privs, seccomp allow-list. */
int node_api_confine(bool drop_privileges);

/* ---- sbx-manager: the gate (gate_main.c) and the executor (executor.h) ---- */
struct mgr_config {
	const char *state_dir;
	const char *worker_id;
	const char *keys_path; /* may be NULL */
	const char *guest_bin;  /* spaced-guest */
	const char *launch_bin; /* spaced-launch: with host_bin, the process substrate */
	const char *host_bin;   /* spaced-host: the per-execution bridge */
	int api_fd;             /* the gate's end of the link to node-api */
	pid_t api_pid;
	int exe_fd;             /* the gate's end of the link to the executor */
	struct spaced_resources limits_default; /* for what an install leaves out */
	struct spaced_resources limits_max;     /* an install above these is refused */
	/* what the limits of this worker's sandboxes may add up to (0: no
	 * bound): tasks exactly (a fork that fails is no one's fault but the
	 * sandbox's own), memory times mem_overcommit (above its share, a
	 * sandbox's memory is reclaimed or its largest process OOM-killed, all
	 * executions together being capped at alloc.memory_bytes) */
	struct spaced_resources alloc;
	double mem_overcommit;
	/* the host's disk: what the executions may still write to their sparse
	 * disks stays within disk_overcommit times what the state directory's
	 * filesystem has free beyond disk_reserve (0: 5 %, at least 2 GiB);
	 * disk_overcommit 0: no check */
	uint64_t disk_reserve;
	double disk_overcommit;
	uint64_t disk_bps;      /* each execution's disk reads and writes per second, apart (0: none) */
	uint64_t gateway_memory; /* each ServicePort gateway's relay buffers at most (spaced-netgtw --relay-budget) */
	unsigned executor_jobs;  /* the executor's job children at once (0: 64); snapshots and stages take half at most */
	uint64_t disk_iops;     /* the same in operations */
	uint32_t uid_first;     /* executions' uid ranges: uid_first + k * 65536 … */
	uint32_t uid_slots;     /* … for k < uid_slots */
	const char *uid_lock_dir; /* host-wide locks of the ranges in use */
	int stall_timeout_ms;   /* a stream whose flow-control window stays full this long is cut */
	int fence_after_s;      /* fenced after this long without the control plane (gate_fence.c; 0: never) */
	int forget_after_s;     /* a tombstone (destroyed, moved away) is forgotten this long after */
	int acks_kept;          /* acknowledgements kept below the last applied seq (older ones
	                         * are pruned; a repeat of one is answered `ack-pruned`) */
	int max_streams;        /* open requests and streams at once, all sandboxes together
	                         * (shared fairly: gate_streams.c stream_admitted) */
	const char *vm_bin;     /* spaced-vm: with vm_images, the qemu substrate (mgr_vm.c) */
	const char *vm_images;  /* its kernel, initramfs and root tree (spaced-vmm/mkvmimage.sh) */
	const char *vsockd_bin; /* spaced-vsockd */
	const char *qemu_bin;   /* qemu-system-x86_64 */
	const char *vm_accel;   /* tcg or kvm, NULL: spaced-vm's default (tcg) */
	/* the control plane's store over https:// (fetch.c), as the link dials
	 * the control plane: the CA file (NULL: the system's trust store) and
	 * the worker's client certificate and key (mutual TLS; NULL: none) */
	const char *tls_ca, *tls_client_cert, *tls_client_key;
	/* node-api's certificate and key (NULL: plaintext): the executions'
	 * ServicePort gateways serve TLS with them too */
	const char *api_tls_cert, *api_tls_key;
	uint64_t tmpl_max;       /* a template's archive and content at most */
	int pool_min;            /* pooled executions kept for the worker's default template and limits */
	int pool_max;            /* at most this many per template and limits (0: no pool) */
	int pool_starts;         /* pooled executions being started at once, at most */
	uint64_t pool_memory;    /* what all pooled executions may use together */
	uint64_t tmpl_cache_max; /* the template cache keeps at most this much (least recently used go) */
	pid_t exe_pid;          /* the executor (executor.h): the caller every bridge accepts */
	uint64_t exe_start;     /* its start time */
	const char *net_dns;    /* the upstream resolver of executions' DNS (IP[:PORT]); NULL: the host's */
	uint64_t net_rate;      /* bits per second each execution may send and, apart, receive on its
	                         * network path out (0: no bound) */
	/* the parts of the closed set a sandbox's allow_out may open (--net-openable; none by default:
	 * no tenant reaches the worker's own addresses, loopback, link-local or private ranges) */
	const struct spaced_cidr *net_openable;
	size_t net_nopenable;
	/* ranges the operator adds to the closed set (--net-closed; none by default) */
	const struct spaced_cidr *net_closed;
	size_t net_nclosed;
	/* connections the worker's egress (pasta) carries for all executions together (--net-conns;
	 * 0: what pasta's open-file limit allows); split into a share each slot is guaranteed and a
	 * pool the rest draw from (net_setup.c net_conn_share, docs/network.md) */
	uint32_t net_conns;
};
/* Runs the gate until a link goes away or a signal stops it. */
int mgr_run(const struct mgr_config *cfg);

/* ---- the link to the control plane (link.c) ---- */
struct link_config {
	const char *cp_url;     /* https://HOST:PORT of spaced-cp (http:// with --plaintext) */
	const char *worker_id;
	const char *state_dir;  /* STATE/worker.key, STATE/api.port */
	const char *admin_path; /* the gate's admin socket */
	const char *join_token; /* used only while there is no worker key; may be NULL */
	const char *advertise;  /* node-api's URL for clients, or NULL: http://LISTEN_HOST:PORT */
	const char *listen_host;
	int capacity;           /* sandboxes placed here at most */
	int fence_after_s;      /* the gate fences after this long without the control plane (0: never) */
	bool api_tls;           /* node-api speaks TLS: its default URL is https:// */
	/* the control plane over https:// / wss:// (tls.h): the CA file to verify
	 * it with (NULL: the system's), the worker's client certificate and key
	 * for mutual TLS (both or neither) */
	const char *tls_ca, *tls_client_cert, *tls_client_key;
};
/* Exit status of a link that the control plane refused (no key and no
 * token, a spent or foreign token, a revoked key): not started again. */
#define LINK_EXIT_FATAL 3
/* Joins if needed, registers, then holds the control channel until SIGTERM.
 * Returns the exit status. */
int link_run(const struct link_config *cfg);

#endif
