/*
 * confine.c — a daemon's system-call allow-list (confine.h).
 */
#include "confine.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include <seccomp.h>

#include "spaced_error.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
#define CONFINE_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CONFINE_SANITIZED 1
#endif
#endif

int spaced_confine_syscalls(const char *const *allow, size_t nallow, const char *const *eacces, size_t neacces,
                            const struct spaced_confine_arg *args, size_t nargs)
{
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return SPACED_ESYS;
	const char *log = getenv("SPACED_SECCOMP_LOG");
	uint32_t otherwise;
	if (log && strcmp(log, "1") == 0)
		otherwise = SCMP_ACT_LOG;
	else
#ifdef CONFINE_SANITIZED
		otherwise = SCMP_ACT_ERRNO(ENOSYS);
#else
		otherwise = SCMP_ACT_KILL_PROCESS;
#endif
	scmp_filter_ctx ctx = seccomp_init(otherwise);
	if (!ctx)
		return SPACED_ENOMEM;
	int e = 0;
	for (size_t i = 0; i < nallow && e == 0; i++) {
		int nr = seccomp_syscall_resolve_name(allow[i]);
		if (nr != __NR_SCMP_ERROR && seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0) < 0)
			e = SPACED_ESYS;
	}
	for (size_t i = 0; i < nargs && e == 0; i++) {
		int nr = seccomp_syscall_resolve_name(args[i].call);
		struct scmp_arg_cmp cmp[2];
		unsigned n = args[i].n < 2 ? args[i].n : 2;
		for (unsigned k = 0; k < n; k++)
			cmp[k] = SCMP_CMP(args[i].cmp[k].index, SCMP_CMP_MASKED_EQ, args[i].cmp[k].mask, args[i].cmp[k].value);
		if (nr != __NR_SCMP_ERROR && seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, n, cmp) < 0)
			e = SPACED_ESYS;
	}
	for (size_t i = 0; i < neacces && e == 0; i++) {
		int nr = seccomp_syscall_resolve_name(eacces[i]);
		if (nr != __NR_SCMP_ERROR && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EACCES), nr, 0) < 0)
			e = SPACED_ESYS;
	}
#ifdef CONFINE_SANITIZED
	/* the leak checker at exit stops the process's threads from a clone of
	 * its own that traces them: allowed in sanitizer builds only */
	static const char *const lsan[] = {"clone", "clone3", "ptrace", "wait4", "waitid", "prctl", "sched_yield",
	                                   "getppid", "kill", "tgkill", "sigaltstack", "set_robust_list",
	                                   "rt_sigtimedwait", "getdents", "getdents64", "openat", "open", "readlink",
	                                   "read", "write", "close", "mmap", "munmap", "madvise", "mprotect"};
	for (size_t i = 0; i < sizeof lsan / sizeof lsan[0] && e == 0; i++) {
		int nr = seccomp_syscall_resolve_name(lsan[i]);
		int rc = nr == __NR_SCMP_ERROR ? 0 : seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0);
		if (rc < 0 && rc != -EEXIST)
			e = SPACED_ESYS;
	}
#endif
	if (e == 0 && seccomp_load(ctx) < 0)
		e = SPACED_ESYS;
	seccomp_release(ctx);
	return e;
}
