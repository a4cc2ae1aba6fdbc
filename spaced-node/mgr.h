/*
 * mgr.h — private header of sbx-manager (see node.h for the process layout).
 */
#ifndef SPACED_MGR_H
#define SPACED_MGR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "compare.h"
#include "identity.h"
#include "resources.h"

/* The sandbox's settings a record carries (JSON text, with its NUL). */
#define MGR_CONFIG_MAX 12288

/* Execution states kept in the record. */
#define MGR_ST_RUNNING "running"
#define MGR_ST_PAUSED "paused"
#define MGR_ST_KEPT "kept"       /* deactivated, kept frozen for a snapshot */
#define MGR_ST_STOPPED "stopped"
#define MGR_ST_DESTROYED "destroyed"
#define MGR_ST_ENDED "ended"     /* its execution died under it: a tombstone until another generation (I2) */

/* The gate's temporary file for a gateway's record, in STATE/gw/<sandbox>/
 * beside record.json (gate_gw.c; a pooled gateway's is made in advance,
 * mgr_exec.c) */
#define GW_RECORD_TMP ".record.json.tmp"

/* One runtime record: the comparator's record plus what the manager needs to
 * find the execution again after a restart. */
struct mgr_rec {
	struct spaced_record r;
	char state[16];
	int64_t pid;         /* the execution's main process (guest or launcher), 0 when none */
	uint64_t pid_start;  /* its start time (clock ticks since boot), pins the pid */
	int64_t host_pid;    /* its spaced-host bridge (launcher mode), 0 when none */
	uint64_t host_start;
	struct spaced_resources res; /* the limits it runs under (the worker's defaults filled in) */
	uint32_t uid_base;   /* host uid of root inside (substrate mode); 0 when none */
	char tmpl[65];       /* the template it runs on (its hash), "" for the worker's own /usr and /etc */
	char tmpl_url[512];  /* where the template is fetched from when it is not in the cache */
	char tenant[SPACED_NAME_MAX]; /* whose sandbox it is (the install's spec.tenant; "" when not
	                               * given): streams are shared between tenants (gate_streams.c) */
	char exec_name[32];  /* a claimed pooled execution: "pool/<id>" (its directory and bridge
	                      * socket are named after it); "" for one started for this record */
	char config[MGR_CONFIG_MAX]; /* the sandbox's settings for its guest: {"env","workdir","user"}
	                              * (its template's and its create's), "" for none */
	uint64_t tomb_mono;          /* the gate's memory only: since when it is a tombstone
	                              * that may be forgotten (gate_main.c: destroyed, moved
	                              * away); monotonic ns, 0: not one */
	uint64_t paused_mono;        /* the gate's memory only: since when it is paused on
	                              * purpose (gate_ctl.c); monotonic ns, 0: not paused, or
	                              * paused before this gate started */
};

/* ---- mgr_rec.c: a record as JSON (the jobs of executor.h carry it) ---- */
/* A new JSON object of rec, or NULL on allocation failure. */
json_t *mgr_rec_to_json(const struct mgr_rec *rec);
/* Reads it back; unknown or malformed members are SPACED_EINVAL. */
int mgr_rec_from_json(json_t *o, struct mgr_rec *out);

/* ---- mgr_store.c: SQLite runtime records (WAL, synchronous=FULL) ---- */
struct mgr_store;

/* Opens (creating) DIR/records.db. Returns 0, SPACED_EIO. */
int mgr_store_open(const char *dir, struct mgr_store **out);
void mgr_store_close(struct mgr_store *st);

/* Runs n control messages' effects as one transaction (one wait for the
 * disk), all of them or none: writes recs[i] (may be NULL), the
 * acknowledgement line for seqs[i] (0: none), and last_seq; tents (may be
 * NULL) notes seqs[i] as applied tentative with the identity tents[i]
 * names (NULL: not tentative) unless seqs[i] <= durable_through, and the
 * notes at or below durable_through are deleted (docs/control-messages.md
 * "Tentative installs"). Returns 0 or
 * SPACED_EIO (nothing written), SPACED_ESTALE when the store refuses a
 * generation going backwards. Only the gate's writer calls it
 * (gate_commit.c). */
int mgr_store_commit_many(struct mgr_store *st, const struct mgr_rec *const *recs, const uint64_t *seqs,
                          const char *const *acks, const struct spaced_identity *const *tents, size_t n,
                          uint64_t durable_through);
/* The tentative notes above seq after, at most max, by seq:
 * [{"seq","sandbox","activation"}, …] (a new array), or NULL (the store
 * failed, or out of memory). */
json_t *mgr_store_tentative(struct mgr_store *st, uint64_t after, size_t max);

/* The next identity epoch (persistent, strictly increasing). Not committed until
 * the next mgr_store_commit_many: the counter is written with it. */
uint64_t mgr_store_peek_epoch(struct mgr_store *st);
void mgr_store_use_epoch(struct mgr_store *st, uint64_t epoch);

/* The acknowledgement stored for seq (*line is a new string) or SPACED_ENOENT. */
int mgr_store_ack(struct mgr_store *st, uint64_t seq, char **line);
/* Turns the stored acknowledgement that installed epoch (its result's
 * "epoch": each record's is its own) into a refusal with code and error,
 * durably, if it is still a success: what the control plane gets when it
 * sends that install again. 0 or SPACED_EIO. */
int mgr_store_refuse_ack_of(struct mgr_store *st, uint64_t epoch, const char *code, const char *error);
/* Calls cb for each stored successful acknowledgement whose result names an
 * epoch: its seq, that epoch and the ServicePort gateway port it names (0:
 * none), in one pass. 0 or SPACED_EIO. */
int mgr_store_acks_of_epochs(struct mgr_store *st, void (*cb)(void *arg, uint64_t seq, uint64_t epoch, int gateway),
                             void *arg);
/* Makes the stored acknowledgement of seq name gateway_port as its
 * execution's ServicePort gateway (none when 0), durably: what the control
 * plane gets when it sends that install again. 0 or SPACED_EIO. */
int mgr_store_ack_set_gateway(struct mgr_store *st, uint64_t seq, int gateway_port);

uint64_t mgr_store_last_seq(struct mgr_store *st);
/* What another connection wrote (gate_commit.c), noted in this one's memory:
 * seq acknowledged (last_seq becomes at least seq), acknowledgements at or
 * below to pruned. */
void mgr_store_note_seq(struct mgr_store *st, uint64_t seq);
void mgr_store_note_pruned(struct mgr_store *st, uint64_t to);

/* Every record, for loading into memory at start. cb returns non-zero to stop. */
/* Deletes the records of the n sandboxes that are tombstones (inactive, in
 * state destroyed or stopped; no other), keeping the generation each had
 * (mgr_store_gone_generation), in one transaction; 0, or SPACED_EIO (none
 * deleted). */
int mgr_store_forget(struct mgr_store *st, const char *const *sandboxes, size_t n);
/* The highest generation of sandbox's forgotten records: 0, SPACED_ENOENT
 * (none forgotten) or SPACED_EIO. */
int mgr_store_gone_generation(struct mgr_store *st, const char *sandbox, uint64_t *generation);

/* The horizon of a prune that keeps the last keep acknowledgements: 0 when
 * there is nothing worth a transaction yet (less than a sixteenth of keep
 * beyond the last horizon). */
uint64_t mgr_store_prune_horizon(struct mgr_store *st, uint64_t keep);
/* Deletes the stored acknowledgements of every seq at or below to and
 * remembers that horizon; 0 or SPACED_EIO. */
int mgr_store_prune_acks(struct mgr_store *st, uint64_t to);
/* The highest seq whose acknowledgement may have been pruned (0: none). */
uint64_t mgr_store_acks_pruned_to(struct mgr_store *st);

int mgr_store_foreach(struct mgr_store *st, int (*cb)(void *arg, const struct mgr_rec *rec),
                      void *arg);

/* A small key/value table (keys version, …). */
int mgr_store_meta_get(struct mgr_store *st, const char *key, int64_t *out);
int mgr_store_meta_set(struct mgr_store *st, const char *key, int64_t v);

/* ---- mgr_exec.c: starting and stopping executions ----
 * Two modes, chosen by the configuration: with --launcher and --host every
 * execution is a `process` substrate execution supervised by spaced-launch,
 * reached only through its own spaced-host bridge (B1–B3); without them a
 * development spaced-guest --listen is started directly. */
struct mgr_config;
/* Starts the execution of rec (restoring snapshot when given) under rec->res
 * and rec->uid_base and waits until its socket answers. Fills rec->pid /
 * pid_start (and host_pid / host_start). */
int mgr_exec_start(const struct mgr_config *cfg, struct mgr_rec *rec, const char *snapshot);
/* Starts a new execution of rec in a uid range of its own (rec->uid_base
 * when set and free, else the lowest free one not in used[0..nused)),
 * trying the next range when another launcher took the chosen one first.
 * Returns 0 (rec filled as by mgr_exec_start), SPACED_EBUSY (no range left)
 * or mgr_exec_start's errors, with a reason in why. */
int mgr_exec_start_fresh(const struct mgr_config *cfg, struct mgr_rec *rec, const char *snapshot, const uint32_t *used,
                         size_t nused, char *why, size_t whysz);
/* Runs argv to completion (stdin and stdout on /dev/null); 0 when it exited 0. */
int mgr_run_wait(const char *const argv[]);
/* mgr_run_wait, with the first line argv writes on stderr in why (when why
 * is not NULL; what follows is read and dropped). */
int mgr_run_why(const char *const argv[], char *why, size_t whysz);
/* Chooses the uid range of a new execution: the lowest slot of the worker's
 * range that no record in used[0..nused) holds, that no process on this host
 * runs in (a range is reused only once everything of its execution is gone)
 * and whose host-wide lock no launcher holds. Returns 0 with *base set,
 * SPACED_EBUSY when every slot is taken. */
int mgr_uid_pick(const struct mgr_config *cfg, const uint32_t *used, size_t nused, uint32_t *base);
/* What the execution uses now (its launcher's USAGE), as a JSON object
 * {"cpu_pct","cpu_usec","memory_bytes","pids","disk_bytes","disk_total"}. */
int mgr_exec_usage(const struct mgr_config *cfg, const struct mgr_rec *rec, json_t **out);
/* Freezes or thaws it. */
int mgr_exec_pause(const struct mgr_config *cfg, const struct mgr_rec *rec, bool pause);
/* Stops it and its bridge; clears the pids. */
void mgr_exec_stop(const struct mgr_config *cfg, struct mgr_rec *rec);
/* True when the recorded process still runs. */
bool mgr_exec_alive(const struct mgr_rec *rec);
/* After a manager restart: a new bridge that knows the new manager (launcher mode). */
int mgr_exec_rebridge(const struct mgr_config *cfg, struct mgr_rec *rec);
/* The running execution of rec under rec's identity, another activation of
 * the one it has (S4): thawed first when thaw (a kept execution activated
 * again), the guest told its new identity, a new bridge that expects it
 * (rec's host pid and start change). SPACED_ENOENT when it does not run. In
 * development mode (no launcher) the guest keeps its first identity. */
int mgr_exec_activate(const struct mgr_config *cfg, struct mgr_rec *rec, bool thaw);
/* Copies a paused execution's files to path; *bytes its size. A refusal's
 * reason (the launcher's, naming the sandbox's own paths) in why. */
int mgr_exec_snapshot(const struct mgr_config *cfg, const struct mgr_rec *rec, const char *path,
                      uint64_t *bytes, char *why, size_t whysz);
/* Copies the snapshot at src (a store the control plane names) into this
 * worker's private staging directory, recomputes its hash there and compares it
 * with want (64 lowercase hex digits). On success *staged (a buffer of stagedsz)
 * names the verified private copy, to restore from and then pass to
 * mgr_exec_unstage. Returns 0, SPACED_EIDENTITY when the hash differs or want is
 * missing/malformed (nothing is kept), SPACED_ENOENT, SPACED_EIO. */
int mgr_exec_stage_snapshot(const struct mgr_config *cfg, const char *sandbox, const char *src,
                            const char *want, char *staged, size_t stagedsz);
void mgr_exec_unstage(const char *staged);
/* Removes the execution's files. */
void mgr_exec_remove(const struct mgr_config *cfg, const char *sandbox);

/* ---- the warm pool's executions (mgr_exec.c; the pool itself is pool.c) ----
 * A pooled execution is a launcher started without identity under the
 * limits and template of rec (res, tmpl, tmpl_url) in a uid range of its
 * own, in STATE/pool/<name>, whose guest is up and waiting (POOLED), and a
 * bridge already listening on STATE/run/<name>.sock that learns its identity
 * from the FIFO STATE/run/<name>.in when the execution is claimed. */
/* Starts one; fills rec's pid, pid_start, host_pid, host_start, uid_base,
 * exec_name ("pool/<name>") and *pss_kib (what its three processes use). */
int mgr_pool_exec_start(const struct mgr_config *cfg, const char *name, struct mgr_rec *rec, const uint32_t *used,
                        size_t nused, uint64_t *pss_kib, char *why, size_t whysz);
/* Gives the pooled execution of rec (exec_name set) rec's identity, without
 * waiting: the launcher's IDENTITY (the guest takes one identity, once) on a
 * new control connection (*ctl_fd, non-blocking, to poll for the answer) and
 * the bridge's identity line; its processes are set back to the priority of
 * every execution. 0, or SPACED_ECLOSED when it is gone (the caller stops it). */
int mgr_pool_claim_send(const struct mgr_config *cfg, const struct mgr_rec *rec, int *ctl_fd, int *answers, char *why,
                        size_t whysz);
/* The launcher's answers on ctl_fd (*answers of them: the sandbox's CONFIG,
 * when it has one, comes before the IDENTITY): 0 (all OK), SPACED_EBUSY (not
 * all yet), SPACED_EPROTO. */
int mgr_pool_claim_done(int ctl_fd, int *answers, char *why, size_t whysz);
/* True when the claim of rec's pooled execution can be made in the
 * executor's loop, which never waits: the sandbox's policy (network, the
 * install's, NULL for none) is the default one, which the pooled
 * execution's filter already is, and none is stored for it; a ServicePort
 * gateway, when the worker has them, waits on its FIFO. Such a claim is
 * net_claim_as(NET_CLAIM_QUICK), mgr_pool_claim_send and
 * mgr_pool_claim_finish(may_start false), then the launcher's answers on
 * the control socket; any other claim is a job in a child. */
bool mgr_pool_claim_inline(const struct mgr_config *cfg, const struct mgr_rec *rec, json_t *network);
/* The claimed identity for the execution's ServicePort gateway: the one
 * started with the pooled execution reads it from its FIFO (a pooled
 * execution of an earlier spaced-node without one gets a gateway started
 * now when may_start, which waits for it); *gateway_port its port, 0
 * without one. SPACED_ECLOSED when no gateway waits (and none may be
 * started) or the waiting one does not take it. */
int mgr_pool_claim_finish(const struct mgr_config *cfg, const struct mgr_rec *rec, bool may_start, int *gateway_port);
/* The claim of a pooled execution (exec_name "pool/<name>") is over, every identity delivered and
 * the launcher's answers OK: its bridge's and its gateway's FIFOs go (they
 * stay until then, whatever was written to them). */
void mgr_pool_claim_ended(const struct mgr_config *cfg, const char *exec_name);
/* True when rec names a pooled execution whose claim did not end
 * (mgr_pool_claim_ended): its bridge's or its gateway's FIFO is still
 * there. */
bool mgr_pool_claim_unfinished(const struct mgr_config *cfg, const struct mgr_rec *rec);
/* The port of rec's ServicePort gateway once started (0: none). */
int mgr_pool_gateway_port(const struct mgr_config *cfg, const struct mgr_rec *rec, int *gateway_port);
/* Stops the pooled executions in STATE/pool that no name in keep[] names
 * (left by an earlier gate): their launchers and bridges, their files. */
void mgr_pool_exec_reap(const struct mgr_config *cfg, const char *const *keep, size_t nkeep);
/* The socket serving rec: the one place that decides where requests go. */
int mgr_exec_target(const struct mgr_config *cfg, const struct mgr_rec *rec, char *out, size_t outsz);

/* How a ServicePort gateway (spaced-netgtw) reaches a microVM's guest: the
 * back-end's hybrid socket and the process that must hold it, the VM that
 * back-end must serve (libspaced/vmcheck.h) and the guest's forward port. */
struct mgr_gw_guest {
	const char *sock;
	int64_t pid;
	uint64_t start;
	const char *exe;
	uint32_t owner; /* the socket file's owner */
	int64_t vm_pid;
	uint64_t vm_start;
	const char *vm_exe;
	uint32_t cid;
	uint32_t fwd_port;
};
/* Starts rec's gateway, reaching its guest as g says; its port goes to
 * E_DIR/gateway.port. Returns 0 when it serves (or no gateway binary exists:
 * ServicePorts are then unreachable), < 0 when it did not start. */
int mgr_gateway_start(const struct mgr_config *cfg, const struct mgr_rec *rec, const char *logp,
                      const struct mgr_gw_guest *g);

/* Helpers of mgr_exec.c that mgr_vm.c uses too. */
int mgr_mkdirs(const char *path);
/* STATE/exec/<sandbox>.<generation>, the execution's state directory. */
int mgr_exec_dir(const struct mgr_config *cfg, const struct mgr_rec *rec, char *out, size_t outsz);
/* Spawns argv in its own session (stderr appended to logp) and waits up to
 * timeout_ms until path exists (want_sock: accepts connections) while it
 * lives; stops it (with its process group when group) otherwise. */
int mgr_spawn_ready(const char *const argv[], const char *logp, const char *path, bool want_sock, int timeout_ms,
                    bool group, int64_t *pid, uint64_t *start);
/* SIGTERM, then SIGKILL, to the process pinned by {pid, start}. */
void mgr_stop_pinned(int64_t pid, uint64_t start, bool group);

/* ---- mgr_vm.c: executions of the qemu substrate (spaced-vm + spaced-host) ---- */
/* Whether rec is a qemu substrate execution. */
bool mgr_vm_is(const struct mgr_rec *rec);
/* Whether this worker is configured to run them (--vm, --vm-images, and the
 * bridge and launcher of substrate mode). */
bool mgr_vm_offered(const struct mgr_config *cfg);
/* Starts the microVM of rec under spaced-vm (from snapshot when given: a
 * qemu snapshot directory) with rec->res and rec->uid_base, waits until its
 * guest answered HELLO with rec's identity, then starts its bridge. Fills
 * rec->pid / pid_start (spaced-vm) and host_pid / host_start. */
int mgr_vm_start(const struct mgr_config *cfg, struct mgr_rec *rec, const char *snapshot);
/* Starts the bridge of a running VM (at start and after a manager restart),
 * pinned to the spaced-vsockd and QEMU that spaced-vm recorded as its
 * children. Fills rec->host_pid / host_start. */
int mgr_vm_bridge(const struct mgr_config *cfg, struct mgr_rec *rec);
/* Removes the VM directories of this worker's uid ranges that no live
 * spaced-vm holds (its uid lock is free): what a supervisor killed with
 * SIGKILL left behind. */
void mgr_vm_reap(const struct mgr_config *cfg);

/* ---- mgr_hash.c: the content hash of a snapshot tree ---- */
#define MGR_HASH_HEX 65 /* 64 hex digits and a NUL */
/* BLAKE2b-256 over the canonical walk of the directory tree at dir (absolute),
 * as mgr_hash.c and docs/control-messages.md define it: hex is written in
 * lowercase, *bytes (may be NULL) the total size of its regular files. Returns
 * 0, SPACED_ENOENT, SPACED_EINVAL (not a directory, an unknown file type),
 * SPACED_ETOOBIG (too deep, a path too long), SPACED_EIO, SPACED_ENOMEM. */
int mgr_snapshot_hash(const char *dir, char hex[MGR_HASH_HEX], uint64_t *bytes);

/* ---- gate_main.c: the records and keys the gate holds ---- */
struct mgr;
const struct mgr_rec *mgr_rec_find(struct mgr *m, const char *sandbox);
/* A write's completion (gate_commit.c): status 0 once on disk, or its error. */
typedef void (*gate_written_fn)(struct mgr *m, void *ctx, int status);
/* Writes rec durably (with the ack of seq, through the writer of
 * gate_commit.c), then updates memory and cancels streams bound to older
 * epochs as S1/S3/S4 say, then calls done (may be NULL) with 0 or the error.
 * A tombstone (inactive) is applied in memory at once — it only narrows what
 * is admitted — then written; if that write fails, the gate ends (and starts
 * again from the disk). */
void mgr_rec_install(struct mgr *m, const struct mgr_rec *rec, bool handoff, uint64_t seq, const char *ack_line,
                     gate_written_fn done, void *ctx);
/* What mgr_rec_install does once its write is on disk (memory, streams of
 * older epochs, the gateway's record, the watch), for a record written
 * without it (gate_commit_write: a claimed pooled execution's, written
 * while its claim goes on, gate_ctl.c, and applied once the claim ended):
 * 0 or the error. */
int mgr_rec_apply(struct mgr *m, const struct mgr_rec *rec, bool handoff);
const char *mgr_worker_id(const struct mgr *m);
const char *mgr_state_dir(const struct mgr *m);
const struct mgr_config *mgr_cfg(const struct mgr *m);
struct mgr_store *mgr_store_of(struct mgr *m);
int mgr_keys_install(struct mgr *m, const char *bundle_json, size_t len, uint64_t *version);
json_t *mgr_status_json(struct mgr *m);

#endif
