/*
 * test_confine.c — libspaced/confine.h: a system call allowed only with the
 * arguments a rule names (what spaced-netgtw and spaced-netd narrow their
 * sockets and opens with) is refused with any other. Each probe runs in a
 * child that confines itself; a refused call kills it (SIGSYS), or, in a
 * sanitizer build, fails with ENOSYS.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "confine.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
#define SANITIZED 1 /* the leak checker's allowances include open and openat */
#else
#define SANITIZED 0
#endif

static const char *const allow[] = {"close", "exit", "exit_group", "rt_sigreturn", "write", "brk", "mmap", "munmap"};
#define OPEN_WRITES ((uint64_t)(O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND | (O_TMPFILE & ~O_DIRECTORY)))
static const struct spaced_confine_arg args[] = {
	{"openat", 1, {{2, OPEN_WRITES, 0}}},
	{"socket", 1, {{0, UINT32_MAX, AF_UNIX}}},
	{"socket", 2, {{0, UINT32_MAX, AF_NETLINK}, {2, UINT32_MAX, NETLINK_SOCK_DIAG}}},
};

enum probe { P_UNIX, P_INET, P_PACKET, P_DIAG, P_ROUTE, P_NETFILTER, P_RDONLY, P_DIR, P_WRONLY, P_CREAT, P_APPEND, P_RDWR };

static long call(enum probe p)
{
	switch (p) {
	case P_UNIX: return syscall(SYS_socket, AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	case P_INET: return syscall(SYS_socket, AF_INET, SOCK_STREAM, 0);
	case P_PACKET: return syscall(SYS_socket, AF_PACKET, SOCK_RAW, 0);
	case P_DIAG: return syscall(SYS_socket, AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	case P_ROUTE: return syscall(SYS_socket, AF_NETLINK, SOCK_DGRAM, NETLINK_ROUTE);
	case P_NETFILTER: return syscall(SYS_socket, AF_NETLINK, SOCK_DGRAM, NETLINK_NETFILTER);
	case P_RDONLY: return syscall(SYS_openat, AT_FDCWD, "/proc/self/status", O_RDONLY | O_CLOEXEC);
	case P_DIR: return syscall(SYS_openat, AT_FDCWD, "/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	case P_WRONLY: return syscall(SYS_openat, AT_FDCWD, "/dev/null", O_WRONLY);
	case P_CREAT: return syscall(SYS_openat, AT_FDCWD, "/tmp/spaced-confine-probe", O_RDONLY | O_CREAT, 0600);
	case P_APPEND: return syscall(SYS_openat, AT_FDCWD, "/dev/null", O_RDONLY | O_APPEND);
	case P_RDWR: return syscall(SYS_openat, AT_FDCWD, "/dev/null", O_RDWR);
	}
	return -1;
}

/* 1: the call was allowed, 0: refused (killed, or ENOSYS). */
static int allowed(enum probe p)
{
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		if (spaced_confine_syscalls(allow, sizeof allow / sizeof allow[0], NULL, 0, args,
		                            sizeof args / sizeof args[0]) < 0)
			_exit(3);
		long r = call(p);
		_exit(r >= 0 ? 0 : errno == ENOSYS ? 2 : 4);
	}
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	if (WIFSIGNALED(st)) {
		cr_assert_eq(WTERMSIG(st), SIGSYS, "probe %d: killed by signal %d", p, WTERMSIG(st));
		return 0;
	}
	cr_assert(WIFEXITED(st));
	cr_assert_neq(WEXITSTATUS(st), 3, "the filter did not load");
	cr_assert_neq(WEXITSTATUS(st), 4, "probe %d: allowed by the filter, failed for another reason", p);
	return WEXITSTATUS(st) == 0;
}

Test(confine, sockets_only_of_the_families_named)
{
	cr_expect(allowed(P_UNIX), "a Unix socket is allowed");
	cr_expect(allowed(P_DIAG), "unix_diag's netlink is allowed");
	cr_expect(!allowed(P_INET), "no TCP or UDP socket");
	cr_expect(!allowed(P_PACKET), "no packet socket");
	cr_expect(!allowed(P_ROUTE), "no routing netlink");
	cr_expect(!allowed(P_NETFILTER), "no packet filter netlink");
}

Test(confine, files_opened_for_reading_only)
{
	if (SANITIZED)
		cr_skip_test("the sanitizer build allows every open (its leak checker's needs)");
	cr_expect(allowed(P_RDONLY), "an open for reading is allowed");
	cr_expect(allowed(P_DIR), "a directory is opened for reading (O_DIRECTORY is no write)");
	cr_expect(!allowed(P_WRONLY), "no open for writing");
	cr_expect(!allowed(P_RDWR), "no open for reading and writing");
	cr_expect(!allowed(P_CREAT), "no file created");
	cr_expect(!allowed(P_APPEND), "no open for appending");
}
