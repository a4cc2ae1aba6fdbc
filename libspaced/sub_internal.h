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

/* The cgroups of one execution: v1 memory, pids and freezer hierarchies, or
 * one cgroup2 directory when /sys/fs/cgroup is unified. */
struct sub_cgroup {
	bool v2;
	bool made;
	char mem[PATH_MAX];
	char pids[PATH_MAX];
	char freezer[PATH_MAX];
	char unified[PATH_MAX];
};

/* Creates the cgroups named `name` below the caller's own cgroups (in a
 * "spaced" directory) and sets the limits (0: none). */
int sub_cgroup_create(struct sub_cgroup *cg, const char *name, uint64_t mem_bytes,
                      uint64_t pids_max, char *why, size_t whysz);

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

#endif
