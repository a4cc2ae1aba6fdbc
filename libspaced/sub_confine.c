/*
 * sub_confine.c — the last layers put on every process of an execution before
 * it execs: no_new_privs, Landlock scoping and the seccomp deny-list.
 */
#include "sub_internal.h"

#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <seccomp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#include "spaced_error.h"

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

/* Landlock ABI 6 (kernel 6.12): the ruleset attribute grew a `scoped` field. */
struct sub_landlock_attr {
	uint64_t handled_access_fs;
	uint64_t handled_access_net;
	uint64_t scoped;
};
#define SUB_LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0)
#define SUB_LANDLOCK_SCOPE_SIGNAL (1ULL << 1)
#define SUB_LANDLOCK_CREATE_RULESET_VERSION (1U << 0)

/* Syscalls an execution never needs: kernel images and modules, mounts after
 * setup, new namespaces, BPF, perf, the kernel keyring, handle-based opens
 * (which can leave a bind mount), swap, clock and reboot control, raw I/O
 * ports, userfaultfd (a race amplifier), io_uring (and below: vsock sockets). Numbers come from the kernel headers
 * so syscalls newer than libseccomp are still covered. */
static const int denied[] = {
	__NR_kexec_load, __NR_kexec_file_load, __NR_init_module, __NR_finit_module,
	__NR_delete_module, __NR_create_module, __NR_get_kernel_syms, __NR_query_module,
	__NR_mount, __NR_umount2, __NR_pivot_root, __NR_chroot, __NR_move_mount, __NR_open_tree,
	__NR_fsopen, __NR_fsconfig, __NR_fsmount, __NR_fspick, __NR_mount_setattr,
	__NR_unshare, __NR_setns,
	__NR_bpf, __NR_perf_event_open, __NR_keyctl, __NR_add_key, __NR_request_key,
	__NR_open_by_handle_at, __NR_name_to_handle_at,
	__NR_swapon, __NR_swapoff, __NR_reboot, __NR_syslog, __NR_acct,
	__NR_settimeofday, __NR_clock_settime, __NR_clock_adjtime, __NR_adjtimex,
	__NR_iopl, __NR_ioperm, __NR_userfaultfd, __NR_quotactl, __NR_lookup_dcookie,
	__NR_vhangup, __NR_nfsservctl, __NR_uselib, __NR__sysctl, __NR_fanotify_init,
	__NR_quotactl_fd,
	/* io_uring: a large kernel surface most sandboxes keep out */
	__NR_io_uring_setup, __NR_io_uring_enter, __NR_io_uring_register,
	/* refused by the kernel already (the uts namespace is not the execution's) */
	__NR_sethostname, __NR_setdomainname,
};

/* Namespace flags refused in clone(2) flags. */
static const uint64_t ns_flags[] = {
	CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID,
	CLONE_NEWNET, CLONE_NEWCGROUP, CLONE_NEWTIME,
};

/* The filter as BPF, built once per process by libseccomp (which takes a
 * millisecond or more) and loaded as is by every execution's processes. */
static struct sock_filter *filter_prog;
static unsigned short filter_len;

static int build_filter(struct sock_filter **prog_out, unsigned short *len_out)
{
	scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
	struct sock_filter *prog = NULL;
	struct stat st;
	int r = SPACED_ESYS, mfd = -1;

	if (ctx == NULL)
		return SPACED_ENOMEM;
	for (size_t i = 0; i < sizeof(denied) / sizeof(denied[0]); i++)
		if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), denied[i], 0) < 0)
			goto out;
	for (size_t i = 0; i < sizeof(ns_flags) / sizeof(ns_flags[0]); i++)
		if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), __NR_clone, 1,
		                     SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i])) < 0)
			goto out;
	/* clone3 passes its flags in memory, out of a filter's reach: ENOSYS makes
	 * the C library fall back to clone(2), which is filtered above */
	if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), __NR_clone3, 0) < 0)
		goto out;
	/* typing into another terminal's input queue */
	if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), __NR_ioctl, 1,
	                     SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCSTI)) < 0 ||
	    seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), __NR_ioctl, 1,
	                     SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCLINUX)) < 0)
		goto out;
	/* BPF compiled from inside: a classic socket filter (SO_ATTACH_FILTER,
	 * SO_ATTACH_REUSEPORT_CBPF) and a seccomp filter are each JIT-compiled
	 * into one pool for the whole host (net.core.bpf_jit_limit; a kernel with
	 * BPF_JIT_ALWAYS_ON has no interpreter to fall back to), charged only in
	 * part to the caller's memory: one execution that filled it stopped
	 * every other execution from starting (its own filter, below, is one of
	 * them) and every unprivileged process of the host from using either.
	 * The arguments are ints: compared on their low 32 bits, as the kernel
	 * reads them. */
	if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), __NR_setsockopt, 2,
	                     SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, SOL_SOCKET),
	                     SCMP_A2(SCMP_CMP_MASKED_EQ, 0xffffffffu, SO_ATTACH_FILTER)) < 0 ||
	    seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), __NR_setsockopt, 2,
	                     SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, SOL_SOCKET),
	                     SCMP_A2(SCMP_CMP_MASKED_EQ, 0xffffffffu, SO_ATTACH_REUSEPORT_CBPF)) < 0 ||
	    seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), __NR_seccomp, 1,
	                     SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffu, SECCOMP_SET_MODE_FILTER)) < 0 ||
	    seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), __NR_prctl, 2,
	                     SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffu, PR_SET_SECCOMP),
	                     SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, SECCOMP_MODE_FILTER)) < 0)
		goto out;
	/* vsock reaches the host's services (and, on a worker of microVMs, what
	 * listens for them); an execution's guest speaks over a Unix socket. The
	 * family is an int: compared on its low 32 bits, as the kernel reads it
	 * (a full 64-bit compare let socket(0x100000028, …) through as AF_VSOCK) */
	if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), __NR_socket, 1,
	                     SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffu, AF_VSOCK)) < 0)
		goto out;
	/* other architectures (i386 through int 0x80, x32) are killed by the
	 * default bad-architecture action */
	mfd = memfd_create("spaced-seccomp", MFD_CLOEXEC);
	if (mfd < 0 || seccomp_export_bpf(ctx, mfd) < 0 || fstat(mfd, &st) < 0)
		goto out;
	if (st.st_size <= 0 || st.st_size % (off_t)sizeof(struct sock_filter) != 0 ||
	    st.st_size / (off_t)sizeof(struct sock_filter) > BPF_MAXINSNS)
		goto out;
	prog = malloc((size_t)st.st_size);
	if (prog == NULL) {
		r = SPACED_ENOMEM;
		goto out;
	}
	if (pread(mfd, prog, (size_t)st.st_size, 0) != (ssize_t)st.st_size)
		goto out;
	*prog_out = prog;
	*len_out = (unsigned short)(st.st_size / (off_t)sizeof(struct sock_filter));
	prog = NULL;
	r = 0;
out:
	free(prog);
	if (mfd >= 0)
		close(mfd);
	seccomp_release(ctx);
	return r;
}

int sub_confine_prepare(void)
{
	if (filter_prog != NULL)
		return 0;
	return build_filter(&filter_prog, &filter_len);
}

static int load_seccomp(void)
{
	struct sock_fprog fprog;
	int r = sub_confine_prepare();

	if (r < 0)
		return r;
	fprog.len = filter_len;
	fprog.filter = filter_prog;
	if (syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) < 0)
		return SPACED_ESYS;
	return 0;
}

/* Landlock scoping (ABI 6+): no abstract Unix sockets or signals across the
 * execution's boundary. Best effort: older kernels go without. */
static void load_landlock(void)
{
	struct sub_landlock_attr attr = {
		.scoped = SUB_LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | SUB_LANDLOCK_SCOPE_SIGNAL,
	};
	long abi = syscall(__NR_landlock_create_ruleset, NULL, 0, SUB_LANDLOCK_CREATE_RULESET_VERSION);
	int fd;

	if (abi < 6)
		return;
	fd = (int)syscall(__NR_landlock_create_ruleset, &attr, sizeof(attr), 0);
	if (fd < 0)
		return;
	(void)syscall(__NR_landlock_restrict_self, fd, 0);
	close(fd);
}

int sub_confine(void)
{
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return SPACED_ESYS;
	load_landlock();
	return load_seccomp();
}
