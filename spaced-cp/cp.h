/*
 * cp.h — private header of spaced-cp, the control plane.
 *
 * Processes: spaced-cp (HTTP API + control channels + lifecycle) and
 * spaced-cp-signer (holds the secret keys, answers over a socketpair; see
 * signer_main.c). Threads inside spaced-cp:
 *   - the loop thread: one libuv loop for all network I/O (server.c):
 *     libspaced's strict HTTP/1.1 + WebSocket server (httpsrv.h) with its
 *     connection budgets and deadlines, the worker control channels
 *     (channel.c: hello, replay, push, acks, pings, liveness), and the
 *     answers the request threads post back (uv_async);
 *   - request threads: every API request (authentication, store
 *     transactions, signer questions, pushes and waits for acks), each with
 *     its own store handle; reads (GET) and channel authorizations have a
 *     pool of their own, so they never queue behind lifecycle calls;
 *   - the reaper thread: idle and absolute timeouts.
 * The outbox table is the push queue: a message is committed with its seq in
 * the same transaction as the state change it carries, the service thread
 * sends it, the worker's ack is written back to the row, and a waiting request
 * thread sees it. Control-plane replicas sharing PostgreSQL see each other's
 * outbox rows and acks the same way.
 */
#ifndef SPACED_CP_H
#define SPACED_CP_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include <jansson.h>

#include "reqparse.h"
#include "rootfs.h"
#include "store.h"
#include "util.h"

#define CP_MOVE_DRAIN_MS 30 /* default move drain window (ops.c) */
#define CP_ROUTE_DRAIN_MS 250 /* a move waits this long after this replica issued the sandbox a route */
#define CP_RECENT_ROUTES 1024 /* slots of the recent-route table */
#define CP_OP_LEASE 120   /* default seconds a lifecycle operation holds its sandbox */
#define CP_SNAPSHOT_GRACE 600 /* default seconds a snapshot archive no sandbox names is kept */
/* Creates a tenant may make: CP_CREATE_RATE a second (--create-rate), up to
 * CP_CREATE_BURST_S seconds' worth at once, and as many network policy
 * updates and as many lifecycle operations (pause, snapshot, resume, move),
 * each kind a bucket of its own; past it 429 rate-limited with Retry-After.
 * Each create starts an execution on a worker and leaves rows kept
 * --retain-deleted after its delete, each policy update a control message,
 * each lifecycle operation a snapshot written to the store (kept
 * --snapshot-grace once no sandbox names it) or an execution started: a
 * tenant doing any in a loop would otherwise take the workers' CPU and disk
 * and grow the store without end. Counted in the store across the replicas
 * of a PostgreSQL store, per replica on SQLite (api.c rate_allows). */
#define CP_CREATE_RATE 20
#define CP_CREATE_BURST_S 10
/* Routes (each signs a capability and reads the store) at this many times
 * the create rate, a bucket of their own: 200 a second and 2,000 at once by
 * default, far above what clients that keep their routes for a capability's
 * lifetime ask, and a bound on what one tenant's loop takes of the control
 * plane's CPU from the others. */
#define CP_ROUTE_RATE_TIMES 10
/* Liveness (channel.c): a worker is live while its control channel is open
 * on some replica. That replica writes workers.channel_until = now +
 * CP_CHAN_UNTIL_S (seconds) every second and 0 as soon as the channel
 * closes; a channel silent for 4 s (no message, no pong) is closed; so a
 * worker, or a replica, that is gone stops counting within 5 s. */
#define CP_CHAN_UNTIL_S 4
/* A worker whose hello says it fences itself after fence_after seconds
 * without the control plane counts as fenced once it is not connected and
 * was last seen more than fence_after + this ago: the second its last_seen
 * is rounded to, up to CP_SEEN_STALL_S during which a replica that cannot
 * record liveness still answers pings (channel.c), the worker's gate
 * noticing its lease ended and freezing (two seconds), and the replicas'
 * clocks within 5 s of each other (ops.c, "At most one execution"). */
#define CP_FENCE_MARGIN_S 18
/* A replica that has written no liveness renewal for this long closes its
 * channels (channel.c cp_chan_tick). */
#define CP_SEEN_STALL_S 8
#define CP_KEY_FAR (INT64_C(10) * 365 * 86400)

struct cp_req;

/* A tenant's quotas (0: none) or what it holds. */
struct cp_quota {
	int64_t sandboxes, memory, disk;
	int64_t templates; /* bytes of the trees its templates name (each tree once) */
	int64_t pids;      /* the sum of its sandboxes' task limits */
};

struct cp {
	const char *state_dir;
	const char *db_url;
	char listen_host[64];
	int port;
	int ack_timeout_ms;
	int snapshot_timeout_ms; /* a snapshot's wait for its worker: the copy, hash, archive and upload */
	int move_drain_ms; /* a move waits this long between 'moving' and deactivating the old execution */
	int64_t op_lease; /* seconds a lifecycle operation holds its sandbox */
	char replica_id[24]; /* "r" + 16 hex, kept in STATE/replica.id */
	int64_t idle_timeout, max_lifetime; /* defaults for new sandboxes (0 = none) */
	struct cp_quota quota_default; /* for tenants without quotas of their own */
	char default_substrate[SPACED_NAME_MAX]; /* for a create that names none ("process") */
	int nthreads;

	/* the store of templates and snapshots (blobs.c, templates.c) */
	char store_host[64];
	int store_port;               /* 0: any free port */
	char store_url[CP_URL_MAX];   /* http://HOST:PORT, what workers and spacectl are told */
	char store_dir[1024];         /* STATE/store */
	uint64_t template_max;        /* largest archive a template import takes */
	uint64_t snapshot_max;        /* largest snapshot archive */
	int snapshot_grace;           /* seconds an unreferenced snapshot archive is kept (cp_snapshots_sweep),
	                               * and a build step's tree after its last use (cp_build_cache_sweep) */
	uint64_t build_cache_max;     /* bytes of build steps' trees no template or sandbox names */
	int64_t retain_deleted;       /* seconds a deleted sandbox's rows are kept (0: forever) */
	unsigned create_rate;         /* creates (and policy updates) a second per tenant (0: no bound) */
	struct spaced_rootfs_limits template_limits;

	/* signer */
	int signer_fd;
	pid_t signer_pid;
	pthread_mutex_t signer_mu;

	/* TLS (tls.h): the listener's context, NULL with --plaintext; mtls: a
	 * client CA was given, so join, register, heartbeat and the channel
	 * want a verified client certificate whose name is the worker ID */
	struct ssl_ctx_st *tls;
	bool mtls;
	/* the metrics listener (--metrics-listen), or metrics_host[0] == 0: none */
	char metrics_host[64];
	int metrics_port;

	/* HTTP budgets (httpsrv.h) */
	int head_timeout_ms;  /* a request head must be complete within this */
	int max_conns;        /* open connections at most */
	int max_conns_per_ip; /* from one client address at most */

	struct cp_store *loop_st; /* the loop thread's store handle */

	pthread_mutex_t mu;       /* guards the acks handed over in memory and their waiters (acks.c) */
	volatile int stopping;

	/* when this replica last issued a route per sandbox (monotonic ns), for
	 * the move drain; a slot per hash of the ID, a collision forgets one */
	pthread_mutex_t recent_mu;
	struct {
		char sandbox[SPACED_NAME_MAX];
		uint64_t at_ns;
	} recent_routes[CP_RECENT_ROUTES];
};

/* One request handed to a request thread. The loop thread fills it in and
 * queues it; a request thread answers it (status, resp) and posts it back;
 * the loop thread writes the answer and frees it. */
enum cp_job { CP_JOB_API, CP_JOB_CHANNEL, CP_JOB_METRICS };
struct cp_req {
	struct cp_req *next_job;
	struct spaced_httpconn *conn; /* loop thread only: NULL once the client is gone */
	enum cp_job kind;  /* an API call, or the authorization of a channel upgrade */
	int queued;        /* with a request thread now (loop thread only) */
	char method[8];
	char path[4096]; /* the request target: up to 4 KiB (a list's meta filters) */
	char auth[512];
	char fair_key[17];            /* the key ID its Authorization names, "" for none (server.c's queue) */
	char worker[SPACED_NAME_MAX]; /* CP_JOB_CHANNEL: the worker named by the path */
	char peer_cert[SPACED_NAME_MAX]; /* the verified client certificate's name, "" none (cp->mtls) */
	char peer[64];                /* the client's address */
	char request_id[65];          /* the client's X-Request-Id, or one made for it */
	char tenant[SPACED_NAME_MAX]; /* the tenant its key speaks for, once authenticated (api.c) */
	char idem_key[65];            /* its Idempotency-Key, "" for none */
	bool idem_bad;                /* it sent one that is not 1-64 of [A-Za-z0-9._:-] */
	struct spaced_buf body;
	int status;
	int retry_after; /* > 0: a Retry-After header of that many seconds */
	char *resp; /* body of the answer: JSON, or the metrics text (CP_JOB_METRICS) */
};

/* api.c: with mTLS (cp->mtls), whether rq came with a verified client
 * certificate, naming worker when worker is not NULL. Returns 0, or -1 with
 * the answer set (401 without one, 403 naming another worker). */
int cp_worker_cert_check(const struct cp *cp, struct cp_req *rq, const char *worker);

/* server.c */
/* Serves the API and the control channels until SIGTERM / SIGINT; returns 0
 * or a SPACED_E* code when it cannot listen. */
int cp_server_run(struct cp *cp);
/* Tells the loop thread that the outbox has new rows (any thread). */
void cp_wake(struct cp *cp);

/* api.c: answers one request (rq->status, rq->resp) with the thread's store. */
void cp_api_handle(struct cp *cp, struct cp_store *st, struct cp_req *rq);

/* ops.c — domain operations on the store */
/* Who a key speaks for. A join token is bound to one worker ID, expires and
 * serves once: it lets that worker join (and receive its worker key). A
 * worker key is bound to one worker ID and is the only way to speak as that
 * worker (its registration, heartbeat and control channel). */
enum cp_role { CP_ROLE_TENANT, CP_ROLE_ADMIN, CP_ROLE_JOIN, CP_ROLE_WORKER };
/* A new random key "spk_<id>_<secret>" for role, its BLAKE2b-256 hash stored;
 * owner is the tenant of a tenant key, the worker ID of a join token or a
 * worker key (NULL otherwise); expires (Unix seconds, 0: never). *key
 * receives the only copy (free() it). */
int cp_key_create(struct cp_store *st, enum cp_role role, const char *owner, int64_t expires, char **key);
/* Checks a bearer key for role; on success *owner (may be NULL) receives its
 * tenant or worker ID and *key_id (may be NULL) its ID. An expired or used
 * key is SPACED_EPERM, as is a wrong one. */
int cp_key_check(struct cp_store *st, const char *key, enum cp_role role, char owner[SPACED_NAME_MAX],
                 char key_id[SPACED_NAME_MAX]);
/* Checks that key is the worker key of worker (SPACED_EPERM otherwise). */
int cp_worker_auth(struct cp_store *st, const char *key, const char *worker);
int cp_tenant_create(struct cp_store *st, const char *name, char id[SPACED_NAME_MAX]);
/* Random name "<prefix><16 hex>". */
void cp_random_name(char out[SPACED_NAME_MAX], const char *prefix);
/* The largest control message the control plane queues for a worker, well
 * within what a worker's link takes in one line (1 MiB): a larger one would
 * close the channel at every replay, and hold up every later message. */
#define CP_CHAN_MSG_MAX (512u * 1024u)
/* Appends one message to worker's outbox inside the caller's transaction;
 * msg gets its "seq". *seq receives it. SPACED_ETOOBIG (nothing queued)
 * when it is larger than CP_CHAN_MSG_MAX. */
int cp_outbox_push(struct cp_store *st, const char *worker, json_t *msg, int64_t *seq);
/* The answer to a failed cp_outbox_push (or a store failure around it) of
 * an install: 413 too-large, else 503 (the store busy) or 500; *body set. */
int cp_install_failed(int r, json_t **body);
/* Waits until worker acked seq or timeout_ms passed. On an ack *ok, *result
 * (JSON text or NULL; free()) and code/error fill in. SPACED_ETIMEDOUT otherwise. */
int cp_wait_ack(struct cp *cp, struct cp_store *st, const char *worker, int64_t seq, int timeout_ms,
                int *ok, char **result);
/* acks.c: an ack handed over in memory (the waiters see it at once) and
 * queued for its outbox row; and the ack of worker's seq when this replica
 * holds it in memory (1, *ok, *result a copy) or 0. */
void cp_acks_put(struct cp *cp, const char *worker, int64_t seq, int ok, const char *result);
int cp_acks_get(struct cp *cp, const char *worker, int64_t seq, int *ok, char **result);
/* Sleeps until the ack of worker's seq is handed over in memory here (or its
 * row written by this replica after another ack took its slot), until the
 * CLOCK_MONOTONIC time until, or until the control plane stops. True when
 * woken for it (or already there). */
bool cp_acks_wait(struct cp *cp, const char *worker, int64_t seq, const struct timespec *until);
/* Wakes every waiter (the control plane stops). */
void cp_acks_wake_all(struct cp *cp);
/* Records an ack from the channel (service thread). */
int cp_record_ack(struct cp *cp, struct cp_store *st, const char *worker, const struct cp_chan_msg *m);
/* worker says the execution id died under its record (reason: how). When id
 * is the sandbox's current execution (every field of I2) and it is running,
 * paused or starting, the sandbox becomes "failed" with the reason as its
 * last_error; anything else is logged and changes nothing (a late or
 * repeated report, another worker's sandbox). The channels' writer thread. */
void cp_execution_ended(struct cp *cp, struct cp_store *st, const char *worker, const struct spaced_identity *id,
                        const char *reason);
/* Current verification bundle from the store (keys whose window is still open). */
json_t *cp_bundle(struct cp_store *st);
/* Makes the store's key table match the signer's keys and queues a keys message
 * for every worker when anything changed. */
int cp_keys_sync(struct cp *cp, struct cp_store *st);
/* Rotation: pending key → pushed to every worker → acked by the live ones → active. */
int cp_keys_rotate(struct cp *cp, struct cp_store *st, json_t **answer);
/* Queues the current bundle to one worker (inside the caller's transaction). */
int cp_push_bundle(struct cp_store *st, const char *worker);

/* signer_client.c */
int cp_signer_start(struct cp *cp);
void cp_signer_stop(struct cp *cp);
/* One question to the signer: type byte and payload; *answer a new NUL-terminated string. */
int cp_signer_ask(struct cp *cp, char type, const char *payload, char **answer);

/* lifecycle (ops.c) — each returns an HTTP status and sets *body. */
/* A create's Idempotency-Key (key, "" for none): the sandbox an earlier
 * create of the tenant with it made, answered as it is (200; 409
 * idempotency-key-used once deleted) in *body, else 0: this create goes on.
 * While that sandbox is `starting` (its create waits for a worker) it waits
 * with it, every 20 ms, up to --ack-timeout and a second. */
int cp_create_replayed(struct cp *cp, struct cp_store *st, const char *tenant, const char *key, json_t **body);
/* A create; its caller answered a replay of c->idem_key first (cp_create_replayed). */
int cp_op_create(struct cp *cp, struct cp_store *st, const char *tenant, const struct cp_create_req *c,
                 json_t **body);
/* Whether a snapshot upload named name (the last part of the URL a
 * snapshot or move sent its worker) is awaited from worker: its sandbox not
 * deleted, at that generation, on that worker, held by a snapshot's or a
 * move's lease that runs. The store takes no other. */
bool cp_snapshot_awaited(struct cp_store *st, const char *name, const char *worker);
int cp_op_simple(struct cp *cp, struct cp_store *st, const char *tenant, const char *id, const char *op,
                 const char *worker, json_t **body);
/* POST /v1/sandboxes/{id}/network: stores the egress policy (canonical JSON)
 * in the sandbox's spec and, when a worker runs or holds it, pushes `net` and
 * waits for the acknowledgement. An HTTP status, *body the answer. */
int cp_op_network(struct cp *cp, struct cp_store *st, const char *tenant, const char *id, const char *network,
                  json_t **body);
/* A policy object from canonical JSON text, or the default policy for "". */
json_t *cp_network_or_default(const char *text);
int cp_op_route(struct cp *cp, struct cp_store *st, const char *tenant, const char *id,
                const struct cp_route_req *rt, json_t **body);
json_t *cp_sandbox_json(struct cp_store *st, const char *tenant, const char *id);
/* spacectl timeout: the sandbox is reaped seconds from now (0: never). */
int cp_op_timeout(struct cp_store *st, const char *tenant, const char *id, int64_t seconds, json_t **body);
/* The tenant's quotas and what it holds; with lock, inside a transaction,
 * taking the tenant's row lock (ops.c). */
int cp_quota_usage(struct cp *cp, struct cp_store *st, const char *tenant, int lock, struct cp_quota *limit,
                   struct cp_quota *used);
/* The reaper, every second: lifetimes, idle timeouts, interrupted
 * operations, restarts, and the deletes cp_deleting_finish completes. */
void cp_reap(struct cp *cp, struct cp_store *st);
/* Every `deleting` sandbox that every worker which ran it has confirmed
 * (acknowledged its destroy, or declared lost) becomes `deleted`. */
void cp_deleting_finish(struct cp *cp, struct cp_store *st);
/* Removes from the store's snapshots/ every archive older than
 * cp->snapshot_grace seconds that no sandbox needs: one is needed when it is
 * the `snapshot` of a sandbox not deleted, or belongs to one with an
 * operation in flight (its next snapshot may be uploaded and not yet
 * recorded). Each snapshot is a new archive: kept forever, a tenant that
 * snapshots (pauses, moves) in a loop, or creates and deletes, would fill the
 * control plane's disk. Returns how many were removed. */
int cp_snapshots_sweep(struct cp *cp, struct cp_store *st);
/* Removes at once every archive of sandbox (SANDBOX-GENERATION-RANDOM.tar)
 * but the one named keep (its archive name, or its URL …/snapshots/NAME;
 * NULL: all of them): for the operation that holds the sandbox (no other of
 * its operations is in flight) when it records a new snapshot, and for its
 * delete. Without it each snapshot's predecessor waited the grace period, and
 * a sandbox snapshotted in a loop could fill the store within it (400 MB
 * every 3.4 s). Returns how many were removed. */
int cp_snapshots_drop_others(struct cp *cp, const char *sandbox, const char *keep);
/* Holds the build cache (build steps' trees in the store that no template and
 * no sandbox not deleted names) under cp->build_cache_max bytes: steps go
 * from the tenant holding the most of the cache first, its least recently
 * used first, so a tenant filling the cache evicts its own steps before
 * anyone else's; never a step used in the last cp->snapshot_grace seconds (a
 * build in progress). An archive goes when no tenant's step names it any
 * more. A later build of an evicted step runs it again. Returns how many
 * archives were removed. */
int cp_build_cache_sweep(struct cp *cp, struct cp_store *st);
/* Removes the rows of sandboxes deleted more than cp->retain_deleted seconds
 * ago (the sandbox's and its generations'), and each worker's outbox rows
 * older than that which it acknowledged, up to its first one not
 * acknowledged (workers.outbox_pruned_to: a hello naming an older last_seq
 * is refused, channel.c): a tenant creating and deleting in a loop would
 * otherwise grow the store without bound. Their history stays in the audit
 * log; sandbox IDs are random and never reused. Returns how many sandboxes
 * were removed. */
int cp_deleted_sweep(struct cp *cp, struct cp_store *st);
/* Replaces the body of every outbox row in each worker's acknowledged prefix
 * (up to its first message not acknowledged; workers.outbox_compacted_to) by
 * {"seq","type","compacted":true}: a tenant's network-policy updates (46 KB
 * each) or creates with large variables would otherwise stay whole for
 * --retain-deleted. Sent again (a worker that reconnects below it), such a
 * row changes nothing: the worker answers it from the acknowledgement it
 * stored, as ack-pruned, or refuses it as malformed (one the control plane
 * acknowledged itself, too-large, and never sent). Returns how many rows
 * were compacted. */
long cp_outbox_compact(struct cp *cp, struct cp_store *st);

/* blobs.c: the store's own HTTP server thread (templates in, templates and
 * snapshots out and in); fills store_url. 0 or a SPACED_E* code. */
int cp_blobs_start(struct cp *cp);

/* templates.c */
/* The tenant's template name as {"name","hash","config"} (*tmpl), or an HTTP
 * status with *err. */
int cp_template_resolve(struct cp_store *st, const char *tenant, const char *name, json_t **tmpl, json_t **err);
/* A tree the tenant may run as its template by hash (one of its templates,
 * or a step of one of its builds): {"name","hash","config"}, or an HTTP
 * status with *err. */
int cp_template_owned(struct cp_store *st, const char *tenant, const char *hash, json_t **tmpl, json_t **err);
/* Adds spec.template.url: where a worker fetches the template's archive. */
void cp_template_locate(struct cp *cp, json_t *spec);
/* Imports the archive at upload as the tenant's template name (HTTP status,
 * *answer the body). Runs off the loops (blocking, CPU and disk). */
int cp_template_import(struct cp *cp, struct cp_store *st, const char *tenant, const char *name, const char *upload,
                       json_t **answer);
/* FROM of a build (debian:SUITE through mmdebstrap, scratch, or a template):
 * {"hash","cached","config"}; runs long (the store's work threads). */
int cp_build_from(struct cp *cp, struct cp_store *st, const char *tenant, const char *from, json_t **out);
/* POST /v1/builds/lookup {"parent","step"} and /v1/builds/commit
 * {"sandbox","parent","step","config"}. */
int cp_builds_api(struct cp *cp, struct cp_store *st, const char *tenant, const char *method, char **seg, int n,
                  const char *body, size_t blen, json_t **out);
/* The bytes of the trees tenant's templates name, each tree once (its
 * templates quota's use): 0 or the store's error. */
int cp_templates_held(struct cp_store *st, const char *tenant, int64_t *bytes);
/* A template's name: a name (identity.h) other than "." and "..", which a
 * URL's path cannot carry (clients take them out as dot segments). */
bool cp_template_name_valid(const char *name);
/* POST /v1/templates/NAME {"hash","config"}: names a built tree. */
int cp_template_name(struct cp *cp, struct cp_store *st, const char *tenant, const char *name, const char *body, size_t blen,
                     json_t **out);
/* GET /v1/templates[/NAME], DELETE /v1/templates/NAME, GET /v1/store. */
int cp_templates_api(struct cp *cp, struct cp_store *st, const char *tenant, const char *method, char **seg, int n,
                     json_t **out);
json_t *cp_error(const char *code, const char *msg);

#endif
