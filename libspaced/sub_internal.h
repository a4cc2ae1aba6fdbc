/*
 * sub_internal.h — pieces of the process substrate shared by its files
 * (substrate.c, sub_cgroup.c, sub_confine.c, sub_fs.c). Not a public header.
 */
#ifndef SPACED_SUB_INTERNAL_H
#define SPACED_SUB_INTERNAL_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The cgroups of one execution: v1 memory, pids, freezer, cpu, cpuacct and
 * blkio hierarchies, or one cgroup2 directory when /sys/fs/cgroup is unified. */
struct sub_cgroup {
	bool v2;
	bool made;
	char mem[PATH_MAX];
	char pids[PATH_MAX];
	char freezer[PATH_MAX];
	char cpu[PATH_MAX];     /* "" when the v1 cpu hierarchy is missing */
	char cpuacct[PATH_MAX]; /* "" when the v1 cpuacct hierarchy is missing */
	char blkio[PATH_MAX];   /* "" without a disk I/O limit (v1) */
	char cpuset[PATH_MAX];  /* v1: "" without one (sub_cgroup_cpu_spread) */
	char unified[PATH_MAX];
	/* sub_cgroup_cpu_spread: the CPU limit, how many CPUs that takes at
	 * most (0: no spread rule), and the rule's last sample and state */
	uint32_t cpu_milli;
	unsigned spread_width;
	uint64_t sp_at_ns, sp_usec, sp_periods, sp_throttled; /* sp_throttled: µs held back */
	uint64_t sp_kernel_usec; /* its CPU time in the kernel (UINT64_MAX: unreadable) */
	unsigned kernel_run;     /* samples in a row it spent SPREAD_KERNEL_MILLI in the kernel */
	uint64_t kernel_hold_milli; /* held for its time in the kernel or its task starts: its use then (else 0) */
	uint32_t sp_ns_pid;      /* the PID its namespace gave next at the last reading (0: none yet) */
	uint64_t sp_ns_at_ns;    /* when that was read */
	unsigned fork_run;       /* samples in a row it started SPREAD_FORKS tasks a second (and was in the kernel) */
	char held_cpus[256]; /* the list it is held to, "" while free */
	char kept_to[256];   /* free: the list its tasks are kept to (affinity), "" while on every CPU */
	unsigned calm;
};

/* The limits a cgroup enforces (0: none). */
struct sub_limits {
	uint32_t cpu_milli; /* CPU time per wall-clock time, in thousandths of a CPU */
	uint64_t mem_bytes;
	uint64_t pids_max;
	/* disk I/O, each direction apart (reads, writes), on each device of
	 * io_dev: bytes and operations per second */
	uint64_t io_bps;
	uint64_t io_iops;
	/* [0]: the execution's own disk (v1: its writeback has its rule from
	 * sub_disk_create); [1]: the device of the lower layer (reads of the
	 * template or of the host's /usr). 0: none. */
	dev_t io_dev[2];
};

/* Creates the cgroups named `name` below the caller's own cgroups (in a
 * "spaced" directory) and sets the limits. A limit that cannot be enforced
 * (its controller is missing) fails the creation: nothing is accepted and then
 * ignored. */
int sub_cgroup_create(struct sub_cgroup *cg, const char *name, const struct sub_limits *lim,
                      char *why, size_t whysz);

/* What the execution uses: CPU time (µs, since creation), memory charged now
 * and at its highest (bytes), processes killed by the OOM killer, tasks. A
 * figure the hierarchy cannot give is UINT64_MAX. */
struct sub_usage {
	uint64_t cpu_usec, mem_bytes, mem_peak, oom_kills, pids;
};
void sub_cgroup_usage(const struct sub_cgroup *cg, struct sub_usage *u);

/* Tears down what launchers that are gone left behind: in every hierarchy,
 * each "spaced-<pid>-<n>" cgroup whose launcher <pid> no longer runs has its
 * tasks killed and thawed (a frozen task cannot die) and is removed. Returns
 * how many cgroups it found populated. */
int sub_cgroup_reap_orphans(void);

/* Caps every execution this process and its children create, all together:
 * the "spaced" directories sub_cgroup_create makes its cgroups in get
 * mem_bytes (v1: memory, memory+swap and TCP buffers) and tasks (0: no cap),
 * so no number of executions can take the host's memory or process table
 * from its daemons. */
int sub_cgroup_cap_all(uint64_t mem_bytes, uint64_t tasks, char *why, size_t whysz);

/* The spread rule, one sample (call it about once a second): an execution
 * with a CPU limit covering fewer CPUs than the host's runs where it likes
 * while it keeps under its limit; once its CPU quota holds it back for a
 * fifth of a sample's time (it has more runnable tasks than its limit's
 * CPUs; one busy task under a whole-CPU limit only meets its quota), it is
 * held to ceil(limit) CPUs where the executions held already, every
 * worker's of the host, leave room for its limit (packed with them: the
 * most loaded with room, the lowest first; with no room it stays as it
 * is), and the free ones keep their tasks off the CPUs held limits fill
 * half of (keep_off); it is let go once it used under 80 % of
 * its limit for SPREAD_CALM samples in a row. A limit bounds an execution's
 * CPU time, not how many CPUs it takes at once: four CPU-bound tasks under
 * 0.5 CPU took every CPU of the host for a quarter of each period, and a
 * co-tenant's woken task waited for the next scheduler tick (4 ms) there.
 * An execution that spends 0.15 of a CPU and more in the kernel for
 * SPREAD_KERNEL_SAMPLES samples in a row (a fork loop, under its quota) is
 * held the same way, and stays held while it uses half of what it used
 * then (or is throttled, or busy): a kernel that does not preempt a task in
 * a system call (PREEMPT_NONE, as this host's; voluntary preemption only at
 * its rescheduling points) lets a co-tenant's woken task wait for each
 * fork, exec and exit there. The kernel counts that time at its ticks, and
 * beside busy tasks it counts less of it (a fork loop read 0.10-0.12); so
 * one that starts SPREAD_FORKS tasks a second with a third of that time in
 * the kernel (SPREAD_FORKS_KERNEL_MILLI) for as many samples in a row is
 * held too (and stays held while it does): next_pid(arg), when given,
 * says which PID the execution's namespace gives next — an exact count of
 * the tasks it started, read only when it used CPU since the last reading
 * (0: unreadable).
 * Returns 1 when it was held (cpus: the CPU list), 5 when it was held for
 * its time in the kernel, 6 for its task starts (with or without), 2 when let go, 0 for no
 * change, SPACED_ENOENT when the rule does not apply to cg (no need to call
 * again), or SPACED_ESYS; *next_ms: when the next sample is due (every
 * second while it is held or uses a tenth of its limit, else every 5 s). */
int sub_cgroup_cpu_spread(struct sub_cgroup *cg, uint64_t now_ns, uint32_t (*next_pid)(void *), void *arg, char *cpus,
                          size_t cpussz, unsigned *next_ms);

/* Moves pid into the cgroups. */
int sub_cgroup_add(const struct sub_cgroup *cg, pid_t pid, char *why, size_t whysz);

/* Freezes or thaws, waiting until the kernel reports the state reached. */
int sub_cgroup_freeze(const struct sub_cgroup *cg, bool freeze);

/* Removes the cgroups, retrying while the last tasks exit; idempotent. */
void sub_cgroup_remove(struct sub_cgroup *cg);

/* Moves the calling process into the cgroups process pid is in (v1 memory,
 * pids and freezer, and cpu, cpuacct and blkio where there are; or its
 * cgroup2 directory). */
int sub_cgroup_join_of(pid_t pid);

/* Builds the seccomp program once in this process (call before forking, so
 * children only load it). Returns 0 or SPACED_ENOMEM / SPACED_ESYS. */
int sub_confine_prepare(void);

/* no_new_privs, Landlock scoping (where the kernel has it) and the seccomp
 * deny-list, for the calling process and what it execs. */
int sub_confine(void);

/* Writes a whole small file (the cgroup and /proc knobs). */
int sub_write_file(const char *path, const char *text);

/* ---- sub_disk.c: the writable layer's own filesystem ---- */

/* Makes a sparse ext4 image at img that holds about `bytes` of files (its
 * metadata comes on top) and attaches it to a free loop device (detached
 * automatically once the last user is gone, direct I/O, discard punching
 * holes into the image). *loopfd keeps the device attached until closed;
 * dev receives its path, *rdev its number. With bps or iops (0: none), the
 * device's writeback is bounded to that many bytes and operations per second
 * (cgroup v1 charges writeback to the blkio root: a rule for this device
 * there, which bounds nobody else, the device being the execution's alone)
 * and what it may hold dirty to about a second of it (strict per-device
 * limit, kernel 6.2 and later), so writers are slowed to that rate instead
 * of filling the host's page cache. Returns 0, SPACED_EINVAL, SPACED_ESYS. */
int sub_disk_create(const char *img, uint64_t bytes, uint64_t bps, uint64_t iops, int *loopfd, char *dev,
                    size_t devsz, dev_t *rdev, char *why, size_t whysz);

/* Takes the bounds sub_disk_create set off the disk rdev. Call while the
 * device is still the execution's (its mount not yet released). */
void sub_disk_unbound(dev_t rdev);

/* Takes the bounds off every loop device that holds no image any more (left
 * by launchers killed with SIGKILL). Returns how many it cleared. */
int sub_disk_reap(void);

/* The whole disk holding path's filesystem, as a throttle rule names it (a
 * partition gives its disk); 0 when there is none (a filesystem on no block
 * device: overlayfs, tmpfs, btrfs). */
dev_t sub_disk_block_dev(const char *path);

/* Mounts the loop device dev on dir (nosuid, nodev, discard, no inode-table
 * zeroing in the background). In the execution's own mount namespace only. */
int sub_disk_mount(const char *dev, const char *dir);

/* ---- sub_template.c: the root of an execution made from a template ---- */

/* A user namespace whose mapping sends the canonical ids 100000 + k to
 * uid_base + k (for an idmapped mount); *fd receives it. The helper process
 * that made it is gone on return. */
int sub_tmpl_userns(uint32_t uid_base, int *fd, char *why, size_t whysz);

/* Mounts the template directory tmpl on target through the mapping of
 * userns_fd: read-only, nosuid, nodev. In the execution's own mount
 * namespace only. 0 or -1 with errno. */
int sub_tmpl_mount(const char *tmpl, int userns_fd, const char *target);

#endif
