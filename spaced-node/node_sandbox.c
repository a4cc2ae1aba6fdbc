/*
 * node_sandbox.c — node-api's confinement, applied right after its listener
 * is bound: the unprivileged user (nobody) when started as root, no new
 * privileges, and a seccomp allow-list of the calls an event loop over
 * sockets needs; opening files fails with EACCES. Anything else kills the process (sanitizer builds answer
 * ENOSYS instead, so their runtime can still report).
 */
#include "node.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <seccomp.h>

#include "error.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
#define NODE_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NODE_SANITIZED 1
#endif
#endif

static const char *const allowed[] = {
	"read", "write", "readv", "writev", "close", "poll", "ppoll", "epoll_wait", "epoll_pwait",
	"epoll_ctl", "accept", "accept4", "recvfrom", "sendto", "recvmsg", "sendmsg", "shutdown",
	"setsockopt", "getsockopt", "getsockname", "getpeername", "fcntl", "ioctl", "mmap", "munmap",
	"mremap", "brk", "madvise", "mprotect", "clock_gettime", "gettimeofday", "time", "exit",
	"exit_group", "rt_sigreturn", "rt_sigprocmask", "rt_sigaction", "futex", "getpid", "gettid",
	"getrandom", "nanosleep", "clock_nanosleep", "restart_syscall", "lseek", "fstat", "newfstatat",
	"sched_yield", "sigaltstack", "uname", "getuid", "geteuid", "getgid", "getegid", "pipe2", "dup",
	"tgkill", "getrlimit", "prlimit64", "sysinfo", "sched_getaffinity",
};

int node_api_confine(bool drop_privileges)
{
	if (drop_privileges && geteuid() == 0) {
		struct passwd *pw = getpwnam("nobody");
		uid_t uid = pw ? pw->pw_uid : 65534;
		gid_t gid = pw ? pw->pw_gid : 65534;
		if (setgroups(0, NULL) < 0 || setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0)
			return SPACED_EPERM;
		if (setuid(0) == 0)
			return SPACED_EPERM;
	}
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return SPACED_ESYS;
#ifdef NODE_SANITIZED
	scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(ENOSYS));
#else
	scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_KILL_PROCESS);
#endif
	if (!ctx)
		return SPACED_ENOMEM;
	int e = 0;
	for (size_t i = 0; i < sizeof allowed / sizeof allowed[0] && e == 0; i++) {
		int nr = seccomp_syscall_resolve_name(allowed[i]);
		if (nr == __NR_SCMP_ERROR)
			continue;
		if (seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0) < 0)
			e = SPACED_ESYS;
	}
	/* Opening files is refused with an error rather than killed: the HTTP
	 * library probes /dev/urandom lazily and copes with the refusal. */
	if (e == 0 && (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EACCES), SCMP_SYS(openat), 0) < 0 ||
	               seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EACCES), SCMP_SYS(open), 0) < 0))
		e = SPACED_ESYS;
	if (e == 0 && seccomp_load(ctx) < 0)
		e = SPACED_ESYS;
	seccomp_release(ctx);
	return e;
}
