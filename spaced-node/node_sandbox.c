/*
 * node_sandbox.c — node-api's confinement, applied right after its listener
 * is bound: the unprivileged user (nobody) when started as root, no new
 * privileges, and a seccomp allow-list of the calls an event loop over
 * sockets needs; opening files fails with EACCES. Anything else kills the process (sanitizer builds answer
 * ENOSYS instead, so their runtime can still report).
 */
#include "node.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include "confine.h"
#include "spaced_error.h"

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
	/* Opening files is refused with an error rather than killed: the HTTP
	 * library probes /dev/urandom lazily and copes with the refusal. */
	static const char *const refused[] = {"openat", "open"};
	return spaced_confine_syscalls(allowed, sizeof allowed / sizeof allowed[0], refused,
	                               sizeof refused / sizeof refused[0], NULL, 0);
}
