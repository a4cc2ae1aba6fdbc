/*
 * gate.h — private header of the gate, the process of sbx-manager that is
 * the authority of this worker (node.h shows the processes).
 *
 * One libuv loop, never blocked, over:
 *   - the link to node-api: requests are verified (keyring + verification
 *     cache) and compared with the installed record (R1) before a byte goes to
 *     an execution; answers stream back under per-stream flow control
 *     (gate_streams.c);
 *   - the link to the executor (executor.h): every job that takes time —
 *     bridge connections, starting, stopping, snapshotting — goes there and
 *     comes back as a completion (gate_jobs.c);
 *   - the control messages of the admin socket and of the control channel,
 *     applied as operations that wait for their jobs without blocking
 *     anything else (gate_ctl.c, gate_admin.c);
 *   - the completions of the records' writes, which a thread of the gate's
 *     own makes (gate_commit.c): the loop never waits for the disk;
 *   - one connection per forwarded request to its execution.
 *
 * Message tables: the links to node-api and to the executor each have one
 * table (gate_streams.c, gate_jobs.c) naming, for every message the gate
 * receives, its bounds and the states of its id in which it may arrive;
 * anything else drops that link.
 */
#ifndef SPACED_GATE_H
#define SPACED_GATE_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>
#include <uv.h>

#include "cap.h"
#include "compare.h"
#include "frame.h"
#include "mgr.h"
#include "nameidx.h"
#include "node.h"
#include "util.h"

#define GATE_MAX_STREAMS 1024
#define GATE_MAX_ADMIN 16
#define GATE_ADMIN_LINE_MAX (256 * 1024)
#define GATE_ADMIN_INFLIGHT 256 /* messages of one admin client in progress at once */
#define GATE_IDLE_PER_SANDBOX 32
/* Kept connections are found in one of this many lists, by their sandbox's
 * name (a power of two): a request walks its sandbox's, not every one. */
#define GATE_IDLE_BUCKETS 1024
/* Flow control: at most this many bytes of a stream's output are on their way
 * to its client (sent to node-api, not yet written to the client), and at most
 * this many bytes of its input on their way to the execution. A stream whose
 * window stays full longer than cfg->stall_timeout_ms is cut. */
#define GATE_WINDOW NODE_WINDOW
/* Everything queued for node-api at once (all streams together). */
#define GATE_API_OUT_MAX (64u << 20)

/* ---- gate_jobs.c: jobs for the executor ---- */

struct mgr;

/* A job's completion. status 0 or SPACED_E*; msg a reason; result the job's
 * JSON object (borrowed; NULL when none); fd a connect job's connection
 * (owned by the callback; -1 when none). Called once, from the loop. */
typedef void (*gate_job_cb)(struct mgr *m, uintptr_t ctx, int status, const char *msg, json_t *result, int fd);

/* Queues a job of kind with args (stolen) for the executor. Returns its id
 * (> 0), or 0 when it could not be queued (cb is then not called). */
uint32_t gate_job(struct mgr *m, const char *kind, json_t *args, gate_job_cb cb, uintptr_t ctx);

/* Forgets the callback of a job in flight: its completion is discarded (a
 * connection it brings is closed). */
void gate_job_forget(struct mgr *m, uint32_t id);

int gate_jobs_start(struct mgr *m, int fd);
void gate_jobs_stop(struct mgr *m);
size_t gate_jobs_in_flight(const struct mgr *m);

/* ---- gate_streams.c: node-api, streams, executions ---- */

int gate_streams_start(struct mgr *m, int api_fd);
/* Queues one frame for node-api (links.c says which). */
void gate_api_send(struct mgr *m, uint16_t type, uint16_t flags, uint32_t id, const struct spaced_buf *b);
void gate_streams_stop(struct mgr *m);
/* After an install: the streams and idle connections of older epochs of
 * rec's sandbox end as S1/S3/S4 say. */
void gate_streams_on_install(struct mgr *m, const struct mgr_rec *rec, bool handoff);
/* Every open stream ends (CANCEL, REFRESH_ROUTE why): the worker fenced. */
void gate_streams_cancel_all(struct mgr *m, enum spaced_reason why);
/* The recovery of sandbox's execution is over: its waiting streams connect. */
void gate_streams_recovered(struct mgr *m, const char *sandbox);
/* Streams whose window stayed full too long are cut (called every second). */
void gate_streams_tick(struct mgr *m);
json_t *gate_streams_status(struct mgr *m);

/* ---- gate_ctl.c: control messages ---- */

/* Where an acknowledgement goes: fn(m, ctx, line), once per message given
 * to gate_ctl_submit; line NULL when none comes for that message (out of
 * memory, or the same seq, sent again meanwhile, takes it). */
typedef void (*gate_reply_fn)(struct mgr *m, uintptr_t ctx, const char *line);

/* Takes one control message (one JSON object); its acknowledgement line is
 * given to reply, at once or when the operation's jobs are done. Messages of
 * one sandbox are applied one after the other, in the order they came;
 * messages of different sandboxes go on side by side. */
void gate_ctl_submit(struct mgr *m, const char *text, size_t len, gate_reply_fn reply, uintptr_t ctx);
/* The requester behind ctx is gone: its pending acknowledgements are dropped
 * (the operations still complete). */
void gate_ctl_forget_requester(struct mgr *m, uintptr_t ctx);
/* Whether a control operation on sandbox is queued or running. */
bool gate_ctl_busy(struct mgr *m, const char *sandbox);
/* At start: restarts or re-bridges the executions the records say run. */
void gate_ctl_recover(struct mgr *m);
size_t gate_ctl_pending(const struct mgr *m);
/* The lowest seq of a control operation queued or in progress, 0 for none
 * (the stored acknowledgements are kept from there on). */
uint64_t gate_ctl_lowest_pending_seq(const struct mgr *m);
/* True while the execution of sandbox is being recovered after a restart. */
bool gate_ctl_recovering(const struct mgr *m, const char *sandbox);
/* The launcher pid (started at start) of sandbox's running execution has
 * ended: queued behind the sandbox's operations, the record becomes a
 * tombstone in state "ended" — when it still names that launcher — its
 * bridge ends and the control plane is told (gate_admin_ended). */
void gate_ctl_ended(struct mgr *m, const char *sandbox, int64_t pid, uint64_t start);
/* True when r is active and says its execution runs or is paused. */
bool gate_rec_serving(const struct mgr_rec *r);
/* The name of a control operation kind (1 … GATE_CTL_KINDS-1), "?" else. */
const char *gate_ctl_kind_name(unsigned kind);

/* ---- gate_watch.c: a running execution's end, seen when it happens ---- */

/* Watches rec's launcher while rec says its execution runs (and stops
 * watching otherwise): call after every change of a record in memory. */
void gate_watch_update(struct mgr *m, const struct mgr_rec *rec);
/* Ends every watch (the gate stops). */
void gate_watch_stop(struct mgr *m);

/* ---- gate_commit.c: the records' writes, on a thread of their own ----
 * Every write to the records' store goes through one queue, in order, to a
 * writer thread with its own connection to the store: the loop never waits
 * for the disk. Writes queued while a transaction syncs go in the next one
 * together. A write's completion, done(m, ctx, status) with status 0 or the
 * write's error (SPACED_EIO, SPACED_ESTALE: a generation going backwards,
 * SPACED_ENOMEM), runs on the loop once its transaction is on disk, in the
 * order the writes were queued; before it, the loop's store has noted the
 * record's epoch and the seq (mgr_store_use_epoch, mgr_store_note_seq). It
 * may run before the call returns when the write cannot be queued. */

/* Opens the writer's connection and starts it (before the first write). */
int gate_commit_start(struct mgr *m);
/* Writes what is queued, then stops the writer (after the loop's end: the
 * completions not yet run are not run). */
void gate_commit_stop(struct mgr *m);
/* rec (may be NULL) and the acknowledgement line of seq (seq 0: none), in a
 * transaction with what else is queued (mgr_store_commit_many); both copied. */
void gate_commit_write(struct mgr *m, const struct mgr_rec *rec, uint64_t seq, const char *ack_line,
                       gate_written_fn done, void *ctx);
/* Tentative installs (docs/control-messages.md "Tentative installs"): seq
 * was sent tentative, naming id; its acknowledgement's write
 * (gate_commit_write) notes it so in the same transaction, unless seq was
 * said durable by then. 0, or SPACED_ENOMEM (nothing noted: the install is
 * refused). Loop thread. */
int gate_commit_tentative(struct mgr *m, uint64_t seq, const struct spaced_identity *id);
/* The tentative installs a status (and so a hello) lists at most, oldest
 * first: the control plane's CP_TENTATIVE_MAX. */
#define GATE_TENTATIVE_LISTED 256
/* The control plane's {"type":"durable","through":N}: every seq at or below
 * is durable there; their notes are deleted with the next transaction (no
 * wait of their own for the disk: one lost comes back in the next hello,
 * which is answered the same). Loop thread. */
void gate_commit_durable(struct mgr *m, uint64_t through);
/* The installs applied or being applied tentative and not said durable
 * (those noted in the store, and those whose write is still to come), by
 * seq, the oldest GATE_TENTATIVE_LISTED: [{"seq","sandbox","activation"}, …]
 * (a new array), or NULL (the store failed, or out of memory). The hello
 * lists them (link.c). Loop thread. */
json_t *gate_commit_tentative_list(struct mgr *m);
/* fn(store, arg) on the writer, in the queue's order (a write of another
 * kind: forgetting, pruning); its result is the completion's status. */
void gate_commit_call(struct mgr *m, int (*fn)(struct mgr_store *st, void *arg), void *arg, gate_written_fn done,
                      void *ctx);

/* ---- gate_gw.c: the record each ServicePort gateway compares with (R5) ---- */

/* Writes STATE/gw/<sandbox>/record.json for rec (rename: never torn). */
void gate_gw_publish(struct mgr *m, const struct mgr_rec *rec);
/* Removes STATE/gw/<sandbox> (its record and temporary file) once the
 * sandbox's record is forgotten (gate_main.c). */
void gate_gw_forget(struct mgr *m, const char *sandbox);

/* ---- gate_admin.c: the admin socket ---- */

int gate_admin_start(struct mgr *m);
void gate_admin_stop(struct mgr *m);
/* The line that tells the control plane rec's execution ended (a new
 * string): {"ended":{"identity":{…},"reason":"…"}} (docs/control-messages.md). */
char *gate_admin_ended_line(const struct mgr_rec *rec, const char *reason);
/* Sends that line to every admin client that asked for events
 * ({"type":"events"}: the link, which carries it on the control channel). */
void gate_admin_ended(struct mgr *m, const struct mgr_rec *rec, const char *reason);

/* ---- gate_main.c: the gate's state ---- */

#define GATE_CTL_KINDS 11   /* control operation kinds (gate_ctl.c), 0 unused */
#define GATE_LAT_BUCKETS 12 /* histogram buckets (gate_metrics.c) */

struct gstream;
struct gconn;
struct gate_bulk;
struct gjob;
struct ctl_queue;
struct admin_client;

struct mgr {
	const struct mgr_config *cfg;
	uv_loop_t *loop;
	struct mgr_store *store;
	struct spaced_keyring *kr;
	struct spaced_vcache *vc;
	struct mgr_rec *recs;
	size_t nrecs, caprecs;
	struct spaced_nameidx rec_index; /* recs by sandbox name */
	bool quit;
	/* node-api (gate_streams.c) */
	int api_fd;
	uv_poll_t api_poll;
	bool api_poll_on;
	int api_events;
	struct spaced_buf api_rbuf;
	struct spaced_buf api_out; /* frames for node-api not yet written */
	size_t api_out_off;
	uv_check_t api_check;      /* writes them at the end of each turn of the loop */
	uv_idle_t api_idle;        /* keeps the loop from sleeping while some are due */
	bool api_flush_due;
	bool api_held;             /* a stream was held back while node-api was behind */
	struct gate_bulk *bulk;    /* output spliced through the link (gate_streams.c) */
	struct gstream *streams;
	size_t nstreams;
	uint64_t out_unacked; /* every stream's output sent to node-api, not yet credited */
	struct gconn *idle[GATE_IDLE_BUCKETS]; /* kept connections, by their sandbox's name */
	size_t nidle;
	/* the executor (gate_jobs.c) */
	int exe_fd;
	uv_poll_t exe_poll;
	bool exe_poll_on;
	struct gjob *jobs;      /* in flight */
	struct gjob *jobq, **jobq_tail; /* not yet sent */
	uint32_t next_job;
	/* control operations (gate_ctl.c) */
	struct ctl_queue *ctlq;
	/* the admin socket (gate_admin.c) */
	int admin_fd;
	uv_poll_t admin_poll;
	bool admin_poll_on;
	struct admin_client *admin[GATE_MAX_ADMIN];
	uint64_t admin_gen;
	uv_timer_t tick;
	uint64_t ticks;
	/* the fence (gate_fence.c) */
	struct {
		uint64_t deadline_ns;    /* when the lease ends (monotonic; 0: no fence) */
		uint64_t since_ns;       /* fenced since */
		bool fenced;
		int64_t unfence_through; /* lifted once this seq is applied (-1: not asked) */
		int64_t written;         /* the lease's end last written to STATE/lease */
		char **frozen;           /* the sandboxes whose executions the fence froze */
		size_t nfrozen;
	} fence;
	uv_signal_t sigterm, sigint;
	/* counters */
	uint64_t n_req, n_allow, n_refuse, n_cancel, n_cut, vc_ns;
	/* streams to executions: on a kept connection, on a new one (checked by the bridge) */
	uint64_t n_conn_kept, n_conn_new;
	/* usage requests: measurements made, requests answered by one made for another */
	uint64_t n_usage_measured, n_usage_shared;
	/* outcomes of admission (REFUSE) and of leases (CANCEL), by verdict and reason */
	uint64_t n_refused_by[3][SPACED_REASON__COUNT], n_cancelled_by[3][SPACED_REASON__COUNT];
	/* control operations: count, failures and a histogram of their time to
	 * acknowledgement, per kind (gate_ctl.c's enum; 0 unused) */
	uint64_t ctl_n[GATE_CTL_KINDS], ctl_failed[GATE_CTL_KINDS], ctl_sum_ns[GATE_CTL_KINDS];
	uint64_t ctl_hist[GATE_CTL_KINDS][GATE_LAT_BUCKETS];
};

/* ---- gate_fence.c: a worker cut off from its control plane fences itself ----
 * Only with a link (--cp) and --fence-after > 0; otherwise nothing here acts. */
/* Reads the lease a gate before this one held (STATE/lease), else starts one. */
void gate_fence_init(struct mgr *m);
/* Every second: fences when the lease has ended; while fenced, freezes what
 * runs and lifts the fence once the link asked and the replay is applied. */
void gate_fence_tick(struct mgr *m);
/* Whether requests are refused (REFRESH_ROUTE fenced). */
bool gate_fenced(const struct mgr *m);
/* The admin lines {"type":"lease","since_ns":T} and {"type":"unfence",
 * "through":N} (the link's): a result object ({"fenced","lease_left_ms"}),
 * or NULL with *err. */
json_t *gate_fence_admin(struct mgr *m, json_t *msg, const char **err);
void gate_fence_stop(struct mgr *m);
/* The fence's clock: CLOCK_BOOTTIME in ns (the link's lease lines use it). */
uint64_t gate_fence_clock_ns(void);

/* ---- gate_audit.c: the audit log ---- */

/* Opens STATE/audit.log for appending. Returns 0 or SPACED_EIO. */
int gate_audit_open(struct mgr *m);
/* Appends entry (a JSON object, taken) with its time as one line. */
void gate_audit(struct mgr *m, json_t *entry);
/* Whether the lines about one more refused request of caller for reason
 * may be written (ratelimit.h: a flood of refusals cannot fill the worker's
 * disk); when not, it is counted, and written in a `deny-summary` line of
 * its caller (each reason's count) by gate_audit_flush within
 * SPACED_RATELIMIT_SUMMARY_S and a tick. */
bool gate_audit_refusal_allowed(const char *caller, const char *reason);
/* Writes the summaries that are due (all: every one). From the tick. */
void gate_audit_flush(bool all);
/* Every refusal's lines held back so far. */
uint64_t gate_audit_suppressed_total(void);

/* ---- gate_metrics.c: the worker's metrics (Prometheus text) ---- */

/* Counts one control operation of kind that took ns to its outcome. */
void gate_metrics_ctl(struct mgr *m, unsigned kind, uint64_t ns, bool ok);
/* The metrics of the worker as Prometheus text exposition (free() it);
 * usage: the per-sandbox usage object of the executor's "usage-all" job, or NULL. */
char *gate_metrics_text(struct mgr *m, json_t *usage);
/* Answers node-api's METRICS request id (after measuring the live executions
 * through the executor): METRICS_TEXT frames, the last with END. */
int gate_metrics_request(struct mgr *m, uint32_t id);

/* A log line of the gate on stderr. */
void gate_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Ends the loop (a link went away). */
void gate_quit(struct mgr *m, const char *why);

#endif
