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
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <sys/mount.h>
#include <sys/stat.h>
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

/* 1: the call was allowed, 0: refused (killed, or ENOSYS), in a child that
 * confines itself (f NULL: spaced_confine_syscalls) or loads f, a filter the
 * parent prepared before the fork (spaced_confine_apply). */
static int allowed_under(const struct spaced_confine_filter *f, enum probe p)
{
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		if ((f ? spaced_confine_apply(f)
		       : spaced_confine_syscalls(allow, sizeof allow / sizeof allow[0], NULL, 0, args,
		                                 sizeof args / sizeof args[0])) < 0)
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

static int allowed(enum probe p)
{
	return allowed_under(NULL, p);
}

static int allowed_prepared(const struct spaced_confine_filter *f, enum probe p)
{
	return allowed_under(f, p);
}

Test(confine, a_prepared_filter_is_the_same_filter_loaded_later)
{
	struct spaced_confine_filter *f = NULL;
	cr_assert_eq(spaced_confine_prepare(allow, sizeof allow / sizeof allow[0], NULL, 0, args,
	                                    sizeof args / sizeof args[0], &f),
	             0);
	cr_assert_not_null(f);
	/* preparing confines nothing: the parent still makes any socket */
	long s = call(P_INET);
	cr_expect_geq(s, 0, "the preparing process is not confined");
	if (s >= 0)
		close((int)s);
	for (int round = 0; round < 2; round++) { /* one program serves every child */
		cr_expect(allowed_prepared(f, P_UNIX), "a Unix socket is allowed");
		cr_expect(!allowed_prepared(f, P_INET), "no TCP or UDP socket");
		cr_expect(!allowed_prepared(f, P_ROUTE), "no routing netlink");
		cr_expect(allowed_prepared(f, P_RDONLY), "a file opened to read");
		if (!SANITIZED) /* the leak checker's allowances include openat */
			cr_expect(!allowed_prepared(f, P_WRONLY), "no file opened to write");
	}
	spaced_confine_filter_free(f);
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

/* spaced_confine_files (Landlock): a child confined to read beneath one
 * directory reads a file there, and is refused any other file, any write
 * (there too), any make or remove, a TCP connect (Landlock ABI 4) and an
 * unmount; a child it forked before stays free. */
Test(confine, files_read_beneath_one_directory)
{
	if (syscall(SYS_landlock_create_ruleset, NULL, 0, 1u) < 1)
		cr_skip_test("no Landlock in this kernel");
	char d[] = "/tmp/spaced-confine-XXXXXX", f[64], g[64], m[64];
	cr_assert_not_null(mkdtemp(d));
	snprintf(f, sizeof f, "%s/slot.json", d);
	snprintf(g, sizeof g, "%s/new", d);
	snprintf(m, sizeof m, "%s/mnt", d);
	cr_assert_eq(mkdir(m, 0700), 0);
	bool mounted = geteuid() == 0 && mount("none", m, "tmpfs", 0, "size=64k") == 0;
	FILE *w = fopen(f, "w");
	cr_assert_not_null(w);
	fputs("{}\n", w);
	fclose(w);
	/* a TCP listener of this process, for the connect probe */
	int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof sa;
	cr_assert(l >= 0 && bind(l, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(l, 4) == 0 &&
	          getsockname(l, (struct sockaddr *)&sa, &sl) == 0);
	long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, 1u);
	int pipefd[2];
	cr_assert_eq(pipe(pipefd), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		/* bits: 1 read there, 2 read elsewhere, 4 write there, 8 make there,
		 * 16 remove there, 32 TCP connect, 64 unmount, 128 a child forked
		 * before reads elsewhere */
		int out = 0;
		pid_t before = fork();
		if (before == 0) {
			char c;
			(void)!read(pipefd[0], &c, 1);
			int fd = open("/etc/hostname", O_RDONLY | O_CLOEXEC);
			_exit(fd >= 0 ? 0 : 1);
		}
		const char *dirs[] = {d};
		if (spaced_confine_files(dirs, 1) != 0)
			_exit(255);
		int fd = open(f, O_RDONLY | O_CLOEXEC);
		out |= fd >= 0 ? 1 : 0;
		out |= open("/etc/hostname", O_RDONLY | O_CLOEXEC) >= 0 ? 2 : 0;
		out |= open(f, O_WRONLY | O_CLOEXEC) >= 0 ? 4 : 0;
		out |= open(g, O_WRONLY | O_CREAT | O_CLOEXEC, 0600) >= 0 ? 8 : 0;
		out |= unlink(f) == 0 ? 16 : 0;
		int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		out |= s >= 0 && connect(s, (struct sockaddr *)&sa, sizeof sa) == 0 ? 32 : 0;
		out |= mounted && (umount2(m, MNT_DETACH) == 0 || errno != EPERM) ? 64 : 0;
		(void)!write(pipefd[1], "x", 1);
		int st = 0;
		waitpid(before, &st, 0);
		out |= WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 128 : 0;
		_exit(out);
	}
	int st = 0;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	close(l);
	if (mounted)
		umount2(m, MNT_DETACH);
	rmdir(m);
	unlink(f);
	unlink(g);
	rmdir(d);
	cr_assert(WIFEXITED(st), "the child ended: 0x%x", st);
	int got = WEXITSTATUS(st);
	cr_assert_neq(got, 255, "spaced_confine_files failed");
	cr_expect(got & 1, "a file beneath the directory is read");
	cr_expect(!(got & 2), "a file elsewhere is not");
	cr_expect(!(got & 4), "nothing is written, there either");
	cr_expect(!(got & 8), "nothing is made");
	cr_expect(!(got & 16), "nothing is removed");
	if (abi >= 4)
		cr_expect(!(got & 32), "no TCP connect (Landlock ABI %ld)", abi);
	if (mounted)
		cr_expect(!(got & 64), "no unmount (EPERM)");
	cr_expect(got & 128, "a child forked before is not confined");
}
