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

/* The cgroups of one execution: v1 memory, pids, freezer, cpu and cpuacct
 * hierarchies, or one cgroup2 directory when /sys/fs/cgroup is unified. */
struct sub_cgroup {
	bool v2;
	bool made;
	char mem[PATH_MAX];
	char pids[PATH_MAX];
	char freezer[PATH_MAX];
	char cpu[PATH_MAX];     /* "" when the v1 cpu hierarchy is missing */
	char cpuacct[PATH_MAX]; /* "" when the v1 cpuacct hierarchy is missing */
	char unified[PATH_MAX];
};

/* The limits a cgroup enforces (0: none). */
struct sub_limits {
	uint32_t cpu_milli; /* CPU time per wall-clock time, in thousandths of a CPU */
	uint64_t mem_bytes;
	uint64_t pids_max;
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

/* Moves pid into the cgroups. */
int sub_cgroup_add(const struct sub_cgroup *cg, pid_t pid, char *why, size_t whysz);

/* Freezes or thaws, waiting until the kernel reports the state reached. */
int sub_cgroup_freeze(const struct sub_cgroup *cg, bool freeze);

/* Removes the cgroups, retrying while the last tasks exit; idempotent. */
void sub_cgroup_remove(struct sub_cgroup *cg);

/* Moves the calling process into the cgroups process pid is in (v1 memory,
 * pids and freezer; or its cgroup2 directory). */
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
 * dev receives its path. Returns 0, SPACED_EINVAL, SPACED_ESYS. */
int sub_disk_create(const char *img, uint64_t bytes, int *loopfd, char *dev, size_t devsz,
                    char *why, size_t whysz);

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
