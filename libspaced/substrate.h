/*
 * substrate.h — the `process` substrate: one execution on this machine.
 *
 * An execution is a tree of processes in fresh pid, mount, network, uts, ipc,
 * cgroup and user namespaces, with an overlayfs root (read-only base plus a
 * private writable layer under the execution's state directory), a minimal
 * /dev, its own /proc, cgroup memory and pids limits, the cgroup freezer for
 * pause, no_new_privs, Landlock scoping and a seccomp deny-list.
 * spaced-guest runs as its PID 1 from /.spaced/spaced-guest (a read-only bind
 * of the host binary) and speaks the control protocol below over fd 3, an
 * AF_UNIX SOCK_SEQPACKET socket whose other end the supervisor holds:
 *
 *   supervisor -> guest  "IDENTITY <canonical identity text>"  (once, when the
 *                        identity was not given on the command line)
 *                        "CONFIG <json>" (the sandbox's settings: its environment,
 *                        working directory and user, which every command starts
 *                        with unless its request says otherwise; before IDENTITY
 *                        for a pooled execution, before any CONN otherwise)
 *                        "CONN <port>" + one fd in SCM_RIGHTS (a connected
 *                        stream socket to serve as guest port <port>)
 *   guest -> supervisor  "WAITING"  (started without identity: up and waiting
 *                        for it — a warm-pool execution that can be claimed)
 *                        "READY"    (it has its identity)
 *
 * State directory layout (docs/substrate.md):
 *   upper/<layer>/ work/<layer>/  overlay upper and work dirs per layer (inside
 *                                 fs/ when disk_bytes > 0)
 *   disk.img                      with disk_bytes > 0: the sparse ext4 image of
 *                                 the writable layer, mounted on fs/ inside the
 *                                 execution's mount namespace only
 *   skel/                         lower of the root layer when no base is given
 *   rootfs/                       mount point of the root (inside the execution's
 *                                 mount namespace only: nothing is mounted on the host)
 *
 * The functions fork the execution with clone3(2); call them from a process
 * that does not run other threads at that moment. All of them return 0 or a
 * negative SPACED_E* code; a reason for failures of the system (a mount that
 * failed, a cgroup write) is written to the `why` buffer of the call when given.
 */
#ifndef SPACED_SUBSTRATE_H
#define SPACED_SUBSTRATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "identity.h"
#include "pidref.h"

/* Root inside is mapped to host uids uid_base … uid_base+65535; the user
 * namespace is created by host uid uid_base, so the kernel's per-user counts
 * (inotify instances and watches, pipe buffers, epoll watches …) are the
 * execution's own, not shared with other executions. */
#define SPACED_SUB_UID_BASE_DEFAULT 100000u
#define SPACED_SUB_UID_RANGE 65536u
/* Snapshots keep owners in one canonical range, whatever range the execution
 * that wrote them had: an execution's ids uid_base+k are stored as
 * SPACED_SUB_SNAP_UID_BASE+k and restored as the new execution's uid_base+k.
 * Owners outside the range (host root: the base's directories) stay as they are. */
#define SPACED_SUB_SNAP_UID_BASE SPACED_SUB_UID_BASE_DEFAULT
/* Where the guest binary appears inside. */
#define SPACED_SUB_GUEST_PATH "/.spaced/spaced-guest"
/* Largest control message (either direction): a CONFIG carries a sandbox's
 * environment. */
#define SPACED_SUB_MSG_MAX 16384
/* Terminals an execution may hold at once: the `max` of its own devpts
 * instance. Without it every instance draws on the host's kernel.pty.max
 * (less kernel.pty.reserve): one execution could take every terminal of
 * every other execution and container of the host. */
#define SPACED_SUB_PTY_MAX 64u

struct spaced_sub_config {
	const char *state_dir;     /* required; created when missing */
	const char *base_dir;      /* a root directory used as it is; NULL: the host's /usr and /etc */
	const char *template_dir;  /* a template: a root whose owners are in the canonical range
	                            * 100000 … 165535, seen through an idmapped mount that gives
	                            * them to the execution's range (sub_template.c); excludes
	                            * base_dir. A snapshot names it by its last path component. */
	const char *guest_path;    /* host path of the guest binary (required) */
	const char *restore_from;  /* snapshot directory to start from, or NULL */
	const struct spaced_identity *identity; /* NULL: given later (warm pool) */
	const char *hostname;      /* NULL: the sandbox id, or "spaced" */
	uint32_t cpu_milli;        /* CPU bandwidth in thousandths of a CPU; 0: none */
	uint64_t memory_bytes;     /* 0: no memory limit */
	uint64_t pids_max;         /* 0: no pids limit */
	uint64_t disk_bytes;       /* > 0: the writable layer lives on an ext4 disk
	                            * of its own holding about this much (a sparse
	                            * image, STATE/disk.img; writes past it get
	                            * ENOSPC; not memory); 0: on the state
	                            * directory's filesystem, unbounded */
	uint64_t disk_bps;         /* with a disk: bytes per second it may read, and
	                            * as many write (writeback included), on that
	                            * disk and on the lower layer's device; 0: none */
	uint64_t disk_iops;        /* the same in operations per second; 0: none */
	uint32_t uid_base;         /* host uid of root inside; 0 maps root to root */
	int log_fd;                /* the guest's stdout and stderr; -1: /dev/null */
	const char *cgroup_name;   /* NULL: "spaced-<launcher pid>-<n>" */
	bool service_ports;        /* the guest joins transport connections for other ports
	                            * than its API's to those ports inside (ServicePorts) */
};

struct spaced_sub;

/* Builds and starts an execution: prepares the state directory (restoring the
 * writable layer from cfg->restore_from when set: its sandbox must equal
 * cfg->identity's and its generation must be smaller, I2; a state directory
 * that still holds an earlier execution's upper/ is refused with SPACED_EEXIST),
 * creates the cgroups,
 * clones the namespaces, sets up the root and execs the guest. Returns once the
 * guest binary has been exec'ed (not yet READY). On success *out owns the
 * execution; release it with spaced_sub_destroy. */
int spaced_sub_create(const struct spaced_sub_config *cfg, struct spaced_sub **out,
                      char *why, size_t whysz);

/* The supervisor's end of the control socket (for poll). */
int spaced_sub_control_fd(const struct spaced_sub *s);

/* The execution's PID 1, pinned (pidfd pollable: readable once it exits). */
const struct spaced_pidref *spaced_sub_init(const struct spaced_sub *s);

/* Reads one control message from the guest. Returns 1 for READY (and records
 * it), 2 for WAITING (0 when the identity was given meanwhile), 0 when there
 * was no message, SPACED_ECLOSED when the guest closed its end, SPACED_EPROTO for an
 * unknown message. */
int spaced_sub_handle_control(struct spaced_sub *s);

/* Waits up to timeout_ms for READY. Returns 0, SPACED_ETIMEDOUT, SPACED_ECLOSED. */
int spaced_sub_wait_ready(struct spaced_sub *s, int timeout_ms);

/* True once the guest has said READY. */
bool spaced_sub_ready(const struct spaced_sub *s);

/* The identity of the execution, or NULL while it has none. */
const struct spaced_identity *spaced_sub_identity(const struct spaced_sub *s);

/* Gives an execution started without identity its identity (IDENTITY message),
 * or an execution another activation of the identity it has (S4). Returns 0,
 * SPACED_EEXIST when it has another identity, SPACED_ECLOSED. */
int spaced_sub_set_identity(struct spaced_sub *s, const struct spaced_identity *id);

/* Gives the guest the sandbox's settings (CONFIG message: a JSON object
 * {"env", "workdir", "user"}). Returns 0, SPACED_ETOOBIG, SPACED_ECLOSED. */
int spaced_sub_send_config(struct spaced_sub *s, const char *json);

/* Hands connected stream socket fd to the guest as port `port` (CONN message).
 * The caller keeps its own fd and closes it. Never blocks: returns 0,
 * SPACED_EBUSY when the guest's control socket is full (a frozen or stuck
 * guest), SPACED_ECLOSED or SPACED_ESYS. */
int spaced_sub_send_conn(struct spaced_sub *s, uint32_t port, int fd);

/* Freezes (pause) or thaws every process of the execution through the cgroup
 * freezer; returns once the freezer reports the new state. */
int spaced_sub_pause(struct spaced_sub *s);
int spaced_sub_thaw(struct spaced_sub *s);
bool spaced_sub_paused(const struct spaced_sub *s);

/* Copies the writable layer of a paused execution into dir (created; it must
 * not exist): dir/upper/<layer>/… with modes, owners (in the canonical
 * snapshot range), symlinks, times, whiteouts, xattrs and holes, then dir/meta
 * naming the identity and base. Returns 0, SPACED_EBUSY when the execution is
 * not paused, SPACED_EEXIST, SPACED_ESYS. */
int spaced_sub_snapshot(struct spaced_sub *s, const char *dir, char *why, size_t whysz);

/* What the execution uses now. A figure that cannot be read is UINT64_MAX. */
struct spaced_sub_usage {
	uint64_t cpu_usec;     /* CPU time since creation */
	uint64_t memory_bytes; /* memory charged to its cgroup */
	uint64_t memory_peak;  /* the most it was ever charged */
	uint64_t oom_kills;    /* processes the OOM killer ended in it */
	uint64_t pids;         /* tasks */
	uint64_t disk_bytes;   /* bytes used on its disk (or 0 without one) */
	uint64_t disk_total;   /* what its disk holds in all (0 without one) */
};
void spaced_sub_usage(const struct spaced_sub *s, struct spaced_sub_usage *u);

/* The spread rule, one sample (the supervisor calls it about once a second
 * while the execution runs): an execution whose CPU limit covers fewer CPUs
 * than the host's is held to ceil(limit) CPUs while its quota keeps
 * throttling it, or once it spent 0.15 of a CPU in the kernel for three
 * samples in a row, or started 200 tasks a second with 0.05 of a CPU there
 * for as many (the count: the PID its namespace gives next, read by a child
 * cloned into that namespace for the moment it takes, only in a sample after
 * which the execution used CPU), and let go after five calm samples:
 * unthrottled, under 80 % of its limit, and (one held for its time in the
 * kernel or its task starts) under both triggers and under half the CPU it
 * used when it was held
 * (docs/substrate.md "CPU: how many at once"); a free one keeps its tasks off the CPUs executions are
 * held to on the host, where the rest leaves it its limit's CPUs. Returns 1
 * when it was held (cpus: the CPU list), 5 when it was held for its time in
 * the kernel, 6 for its task starts (whether or not its time in the kernel
 * held it too), 2 when let go (cpus: the list it may use again), 3 when its tasks
 * were kept to cpus, 4 when they may use every CPU again (cpus), 0 for no
 * change, SPACED_ENOENT when the rule does not apply to this execution (no
 * need to call again), SPACED_ESYS; *next_ms: when
 * to call next (1 s while it is held or busy, 5 s while it idles). */
int spaced_sub_cpu_spread(struct spaced_sub *s, char *cpus, size_t cpussz, unsigned *next_ms);

/* The CPUs the spread rule holds the execution to now ("0,1"), or "" when
 * it does not hold it. */
void spaced_sub_cpus_held(const struct spaced_sub *s, char *cpus, size_t cpussz);

/* Caps all executions this process and its children start, together (their
 * parent cgroups): memory in bytes and tasks; 0 leaves one uncapped. Past
 * the memory cap the kernel's OOM killer picks among the executions only (the
 * largest first), never the host's daemons; past the task cap fork fails in
 * executions only. Returns 0 or a negative code with a reason in why. */
int spaced_sub_cap_all(uint64_t mem_bytes, uint64_t tasks, char *why, size_t whysz);

/* The request path's CPU share (spaced-node's gate, node-api and link): the
 * calling process, all its threads, moves into a CPU cgroup of its own beside
 * the executions' parent ("<parent>+request"; a process already in it stays
 * in it), weighed as `weight` times the default CPU weight (that of the
 * executions' parent, all executions together), its CPU counted apart, and
 * held to at most max_milli thousandths of a CPU per 10 ms (0: no ceiling),
 * so that requests, whoever sends them, never take more than that from the
 * executions. Returns 0, SPACED_ENOENT when the host has no CPU controller
 * there (nothing changes), or another negative code with a reason in why. */
int spaced_sub_request_cpu_join(uint32_t weight, uint32_t max_milli, char *why, size_t whysz);

/* What the calling process's request path cgroup counts (when it is in one):
 * the CPU its processes took, the periods in which the ceiling held them
 * back and for how long. SPACED_ENOENT when it is not in one. */
int spaced_sub_request_cpu_stat(uint64_t *usage_ns, uint64_t *throttled, uint64_t *throttled_ns);

/* Removes that cgroup once no process is left in it (spaced-node's stop). */
void spaced_sub_request_cpu_remove(void);

/* Background work (a warm pool's starts): the calling process moves into a
 * CPU cgroup beside the executions' parent ("<parent>+background"), weighed
 * at 1/32 of the default CPU weight for all its processes together, so that
 * what it and the processes it starts do takes only the CPU that creates,
 * requests and executions leave (a nice value weighs only inside a session
 * of the root cgroup; every start was one session, each at a tenth of the
 * weight). Returns 0, SPACED_ENOENT when the host has no CPU controller there
 * (nothing changes), or another negative code with a reason in why. */
int spaced_sub_background_cpu_join(char *why, size_t whysz);

/* A process of that background work that stays beyond it (a pooled
 * execution's launcher, bridge or gateway, once started; a daemon of the
 * worker's that a start needed) moves into the CPU cgroup that holds the
 * background one (the caller's own, or the one above it when the caller is
 * in the background cgroup), where the same process started for a create
 * would be. 0, or a negative code (the process stays where it is). The
 * first move after a quiet while waits for an RCU grace period (several
 * ms): not for a request's path. */
int spaced_sub_background_cpu_leave(pid_t pid);

/* The cgroup.procs file leave() writes to, in procs: a child about to run
 * writes "0" to it (open and write only) to leave on its own. 0, or a
 * negative code (SPACED_ENOENT: no CPU controller). */
int spaced_sub_background_cpu_home(char *procs, size_t procssz);

/* Removes the background cgroup once no process is left in it (waiting up
 * to 0.25 s for the processes in it to end). */
void spaced_sub_background_cpu_remove(void);

/* Kills the tasks of executions whose launcher is gone (killed with SIGKILL:
 * it could not clean up; on cgroup v1 a frozen task cannot even die until
 * thawed), thaws and removes their cgroups, and takes the disk I/O bounds off
 * loop devices that hold no image any more. Returns how many such executions
 * were found, or a negative code. */
int spaced_sub_reap_orphans(void);

/* Kills the execution (its PID 1, which takes the pid namespace down), waits
 * for it, removes its cgroups and, unless keep_state, its state directory's
 * layers. Accepts NULL. The status of PID 1 (waitid) is returned in *status
 * when status is not NULL. */
void spaced_sub_destroy(struct spaced_sub *s, bool keep_state, int *status);

/* Runs argv inside the execution whose PID 1 is init_pidfd (joining its
 * cgroups and namespaces, as its root user, under the same seccomp filter),
 * with stdin/stdout/stderr inherited, in directory cwd (NULL: "/"). Waits for
 * it; *status receives the wait status of the command (as from waitpid).
 * Returns 0 or a negative code when the execution could not be entered. */
int spaced_sub_enter(int init_pidfd, const char *cwd, char *const argv[], int *status);

/* Recursively removes path (not crossing mount points). 0 or SPACED_ESYS. */
int spaced_sub_rm_rf(const char *path);

/* Owner translation of a tree copy: ids in [from, from + count) become
 * id - from + to; the others stay. */
struct spaced_idshift {
	uint32_t from, to, count;
};

/* Copies a directory tree as the snapshot does (dst must not exist), with
 * owners translated by shift (NULL: as they are), its writes paced at rate
 * bytes per second at most (0: no ceiling) and written behind (pace.h).
 * Directories deeper than SPACED_TREEHASH_DEPTH are refused (SPACED_ETOOBIG,
 * why names where). */
int spaced_sub_copy_tree(const char *src, const char *dst, const struct spaced_idshift *shift, uint64_t rate,
                         char *why, size_t whysz);

#endif
