/*
 * confine.c — a daemon's system-call allow-list (confine.h).
 */
#include "confine.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <seccomp.h>

#include "spaced_error.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
#define CONFINE_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CONFINE_SANITIZED 1
#endif
#endif

struct spaced_confine_filter {
	struct sock_fprog prog;
};

int spaced_confine_prepare(const char *const *allow, size_t nallow, const char *const *eacces, size_t neacces,
                           const struct spaced_confine_arg *args, size_t nargs, struct spaced_confine_filter **out)
{
	*out = NULL;
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
	/* the program as the kernel takes it, kept in memory: loading it later
	 * costs one system call, not libseccomp's compilation */
	int mfd = e == 0 ? memfd_create("spaced-seccomp", MFD_CLOEXEC) : -1;
	if (e == 0 && (mfd < 0 || seccomp_export_bpf(ctx, mfd) < 0))
		e = SPACED_ESYS;
	seccomp_release(ctx);
	off_t size = e == 0 ? lseek(mfd, 0, SEEK_END) : -1;
	struct spaced_confine_filter *f = NULL;
	if (e == 0 && (size <= 0 || size % (off_t)sizeof(struct sock_filter) != 0 ||
	               size / (off_t)sizeof(struct sock_filter) > BPF_MAXINSNS))
		e = SPACED_ESYS;
	if (e == 0 && ((f = calloc(1, sizeof *f)) == NULL || (f->prog.filter = malloc((size_t)size)) == NULL))
		e = SPACED_ENOMEM;
	if (e == 0 && pread(mfd, f->prog.filter, (size_t)size, 0) != size)
		e = SPACED_ESYS;
	if (mfd >= 0)
		close(mfd);
	if (e < 0) {
		spaced_confine_filter_free(f);
		return e;
	}
	f->prog.len = (unsigned short)(size / (off_t)sizeof(struct sock_filter));
	*out = f;
	return 0;
}

int spaced_confine_apply(const struct spaced_confine_filter *f)
{
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &f->prog, 0, 0) < 0)
		return SPACED_ESYS;
	return 0;
}

void spaced_confine_filter_free(struct spaced_confine_filter *f)
{
	if (f) {
		free(f->prog.filter);
		free(f);
	}
}

int spaced_confine_syscalls(const char *const *allow, size_t nallow, const char *const *eacces, size_t neacces,
                            const struct spaced_confine_arg *args, size_t nargs)
{
	struct spaced_confine_filter *f;
	int e = spaced_confine_prepare(allow, nallow, eacces, neacces, args, nargs, &f);
	if (e == 0)
		e = spaced_confine_apply(f);
	spaced_confine_filter_free(f);
	return e;
}

/* Landlock's interface (linux/landlock.h; this system's header may predate
 * the later ABIs): a ruleset's attributes, grown field by field */
struct confine_landlock_attr {
	uint64_t handled_access_fs;
	uint64_t handled_access_net; /* ABI 4 */
	uint64_t scoped;             /* ABI 6 */
};
struct confine_landlock_beneath {
	uint64_t allowed_access;
	int32_t parent_fd;
} __attribute__((packed));
#define LL_CREATE_RULESET_VERSION (1u << 0)
#define LL_RULE_PATH_BENEATH 1
#define LL_FS_READ_FILE (1ull << 2)
#define LL_FS_READ_DIR (1ull << 3)
#define LL_NET_BIND_TCP (1ull << 0)
#define LL_NET_CONNECT_TCP (1ull << 1)
#define LL_SCOPE_ABSTRACT_UNIX_SOCKET (1ull << 0)
#define LL_SCOPE_SIGNAL (1ull << 1)
#ifndef __NR_landlock_create_ruleset
#define __NR_landlock_create_ruleset 444
#define __NR_landlock_add_rule 445
#define __NR_landlock_restrict_self 446
#endif

int spaced_confine_files(const char *const *read_dirs, size_t n)
{
	long abi = syscall(__NR_landlock_create_ruleset, NULL, 0, LL_CREATE_RULESET_VERSION);
	if (abi < 1)
		return SPACED_ENOENT;
	/* every file system right this ABI knows: execute .. make_sym (1), refer
	 * (2), truncate (3), ioctl on devices (5) */
	unsigned bits = abi >= 5 ? 16 : abi >= 3 ? 15 : abi >= 2 ? 14 : 13;
	struct confine_landlock_attr attr = {.handled_access_fs = (1ull << bits) - 1};
	size_t size = sizeof attr.handled_access_fs;
	if (abi >= 4) {
		attr.handled_access_net = LL_NET_BIND_TCP | LL_NET_CONNECT_TCP;
		size = offsetof(struct confine_landlock_attr, scoped);
	}
	if (abi >= 6) {
		attr.scoped = LL_SCOPE_ABSTRACT_UNIX_SOCKET | LL_SCOPE_SIGNAL;
		size = sizeof attr;
	}
	int rs = (int)syscall(__NR_landlock_create_ruleset, &attr, size, 0);
	if (rs < 0)
		return SPACED_ESYS;
	int e = 0;
	for (size_t i = 0; i <= n && e == 0; i++) {
		const char *d = i < n ? read_dirs[i] : NULL;
#ifdef CONFINE_SANITIZED
		if (d == NULL)
			d = "/proc";
#endif
		if (d == NULL)
			break;
		struct confine_landlock_beneath rule = {.allowed_access = LL_FS_READ_FILE | LL_FS_READ_DIR,
		                                        .parent_fd = open(d, O_PATH | O_DIRECTORY | O_CLOEXEC)};
		if (rule.parent_fd < 0 || syscall(__NR_landlock_add_rule, rs, LL_RULE_PATH_BENEATH, &rule, 0) < 0)
			e = SPACED_ESYS;
		if (rule.parent_fd >= 0)
			close(rule.parent_fd);
	}
	if (e == 0 && (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || syscall(__NR_landlock_restrict_self, rs, 0) < 0))
		e = SPACED_ESYS;
	close(rs);
	return e;
}
