/*
 * confine.h — a daemon's system-call allow-list (seccomp), for the worker's
 * processes that read what tenants send: node-api (HTTP from clients),
 * spaced-netgtw (ServicePort traffic), spaced-netd (the executions' DNS) and
 * spaced-vsockd (a microVM guest's vsock rings).
 * Whatever a bug in their parsers lets an attacker run can then make only
 * the calls the daemon's own loop makes: no execve, no fork, no ptrace, no
 * mount or namespace change, no module, BPF or keyring call.
 */
#ifndef SPACED_CONFINE_H
#define SPACED_CONFINE_H

#include <stddef.h>
#include <stdint.h>

/* A call allowed only with its arguments so: for each of its n (1 or 2)
 * comparisons, (args[index] & mask) == value. Several for one call: any of
 * them allows it. */
struct spaced_confine_arg {
	const char *call;
	unsigned n;
	struct {
		unsigned index;
		uint64_t mask, value;
	} cmp[2];
};

/* Sets no_new_privs, then loads a filter that allows the system calls named
 * in allow (names this kernel or libseccomp does not know are skipped), those
 * of args with the arguments they name, and answers EACCES to those in
 * eacces; any other call kills the process. In a
 * sanitizer build it answers ENOSYS instead (its runtime can still report
 * what went wrong), and also allows what the leak checker needs at exit
 * (clone, ptrace, reading /proc/self/task); with SPACED_SECCOMP_LOG=1 in the environment it only logs
 * each call outside the list to the kernel log (to find what a daemon needs:
 * `dmesg | grep 'type=1326'`). Returns 0 or SPACED_ENOMEM / SPACED_ESYS. */
int spaced_confine_syscalls(const char *const *allow, size_t nallow, const char *const *eacces, size_t neacces,
                            const struct spaced_confine_arg *args, size_t nargs);

/* spaced_confine_syscalls in two steps, for a process that confines the
 * children it forks on a hot path: prepare compiles the same filter into a
 * program kept in memory (libseccomp's work, milliseconds of CPU and many
 * allocations), apply sets no_new_privs and loads it (one system call; in a
 * child forked after prepare, nothing else). Returns as spaced_confine_syscalls;
 * *out is freed with spaced_confine_filter_free. */
struct spaced_confine_filter;
int spaced_confine_prepare(const char *const *allow, size_t nallow, const char *const *eacces, size_t neacces,
                           const struct spaced_confine_arg *args, size_t nargs, struct spaced_confine_filter **out);
int spaced_confine_apply(const struct spaced_confine_filter *f);
void spaced_confine_filter_free(struct spaced_confine_filter *f);

/* Landlock, for a daemon that runs as root but needs few files: from now on
 * the process opens files only to read them, and only beneath the n
 * directories of read_dirs (files open already stay open); it makes,
 * removes, renames, truncates or runs nothing; where the kernel knows them,
 * it binds and connects no TCP port (Landlock ABI 4), and reaches no
 * abstract Unix socket and signals no process outside its domain (ABI 6).
 * Mounts change no more either (umount2 fails). Processes it forked before
 * stay as they are. In a sanitizer build /proc is readable too (the leak
 * checker's). Returns 0, SPACED_ENOENT when the kernel has no Landlock
 * (nothing changes), or SPACED_ESYS. */
int spaced_confine_files(const char *const *read_dirs, size_t n);

#endif
