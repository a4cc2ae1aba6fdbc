/*
 * test_substrate.c — the process substrate end to end, with real processes:
 * spaced-launch creates executions (namespaces, overlay root, cgroups,
 * seccomp) around the guest, and the tests look at them from inside (through
 * `spaced-launch exec`) and from the host (state directory, cgroup files,
 * /proc). The guest is the real BUILD/spaced-guest/spaced-guest.
 *
 * Rules: I2 (a restore is a new execution with a greater generation), B2 (the
 * guest transport listener is bound to the launcher process), and the
 * isolation the substrate promises (docs/substrate.md).
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stddef.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "spaced_error.h"
#include "guest_client.h"
#include "identity.h"
#include "pidref.h"
#include "substrate.h"
#include "sub_internal.h"
#include "treehash.h"
#include "util.h"
#include "vsock_hs.h"

static char dir[64];
/* launchers started by the running test, stopped by teardown even when an
 * assertion ended the test early */
static pid_t started[8];
static int nstarted;

static const char *guest_bin(void)
{
	return SPACED_GUEST_BIN;
}

static void idtext(char *out, size_t sz, const char *sandbox, int gen)
{
	snprintf(out, sz, "sandbox=%s;generation=%d;worker=w1;substrate=process;activation=a1;pod_uid=",
	         sandbox, gen);
}

static void setup(void)
{
	strcpy(dir, "/tmp/spaced-sub-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
	char cmd[128];

	for (int i = 0; i < nstarted; i++) {
		if (waitpid(started[i], NULL, WNOHANG) != 0)
			continue;
		kill(started[i], SIGTERM); /* the launcher tears its execution down */
		waitpid(started[i], NULL, 0);
	}
	nstarted = 0;

	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	(void)system(cmd);
}

/* Skips unless this machine can build executions. */
static void need_sandbox(void)
{
	pid_t pid;
	int st;

	if (getuid() != 0)
		cr_skip_test("needs root (namespaces, overlayfs, cgroups)");
	pid = fork();
	if (pid == 0)
		_exit(unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET) == 0 ? 0 : 1);
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		cr_skip_test("namespaces unavailable on this machine");
	if (access("/sys/fs/cgroup/freezer", F_OK) != 0 && access("/sys/fs/cgroup/cgroup.controllers", F_OK) != 0)
		cr_skip_test("no cgroup freezer");
}

struct launcher {
	pid_t pid;
	int out; /* its stdout */
	char state[80];
};

/* Reads one line from fd (blocking, up to timeout_ms); "" on EOF/timeout. */
static void read_line(int fd, char *buf, size_t sz, int timeout_ms)
{
	size_t n = 0;

	buf[0] = '\0';
	while (n + 1 < sz) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		char c;

		if (poll(&p, 1, timeout_ms) <= 0 || read(fd, &c, 1) != 1)
			break;
		if (c == '\n')
			break;
		buf[n++] = c;
	}
	buf[n] = '\0';
}

/* Where the next launcher started writes its log (stderr), NULL: the test's own. */
static const char *launch_log;

/* Starts spaced-launch with the given guest and extra arguments (NULL-terminated). */
static void start_with(struct launcher *l, const char *name, const char *guest,
                       const char *const *extra, bool wait_ready)
{
	const char *argv[32];
	int pfd[2], n = 0;
	char line[128];

	snprintf(l->state, sizeof(l->state), "%.40s/%.30s", dir, name);
	argv[n++] = SPACED_LAUNCH;
	argv[n++] = "--state";
	argv[n++] = l->state;
	argv[n++] = "--guest";
	argv[n++] = guest;
	for (; extra != NULL && *extra != NULL && n < 30; extra++)
		argv[n++] = *extra;
	argv[n] = NULL;
	cr_assert_eq(pipe2(pfd, O_CLOEXEC), 0);
	l->pid = fork();
	cr_assert_geq(l->pid, 0);
	if (l->pid == 0) {
		dup2(pfd[1], 1);
		if (launch_log != NULL) {
			int lf = open(launch_log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
			if (lf < 0 || dup2(lf, 2) < 0)
				_exit(126);
		}
		execv(SPACED_LAUNCH, (char *const *)(uintptr_t)argv);
		_exit(127);
	}
	close(pfd[1]);
	l->out = pfd[0];
	if (nstarted < 8)
		started[nstarted++] = l->pid;
	if (wait_ready) {
		read_line(l->out, line, sizeof(line), 20000);
		cr_assert(strncmp(line, "READY", 5) == 0, "launcher did not become ready (got \"%s\")", line);
		cr_log_info("%s: %s ms (create to READY)", name, line + 6);
	}
}

static void start(struct launcher *l, const char *name, const char *const *extra, bool wait_ready)
{
	start_with(l, name, guest_bin(), extra, wait_ready);
}

/* One control command; returns the answer. */
static void ctl(const struct launcher *l, const char *cmd, char *reply, size_t sz)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ssize_t n;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/control.sock", l->state);
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0, "control.sock: %s", strerror(errno));
	cr_assert_eq(send(fd, cmd, strlen(cmd), 0), (ssize_t)strlen(cmd));
	n = recv(fd, reply, sz - 1, 0);
	cr_assert_gt(n, 0);
	reply[n] = '\0';
	close(fd);
}

static void ctl_ok(const struct launcher *l, const char *cmd)
{
	char reply[1024];

	ctl(l, cmd, reply, sizeof(reply));
	cr_assert(strncmp(reply, "OK", 2) == 0, "%s: %s", cmd, reply);
}

static int stop(struct launcher *l)
{
	int st;

	ctl_ok(l, "STOP");
	cr_assert_eq(waitpid(l->pid, &st, 0), l->pid);
	close(l->out);
	return st;
}

/* Runs `sh -c script` inside; its stdout+stderr land in out. Returns the exit
 * code (128+signal when killed). */
static int run_in(const struct launcher *l, const char *script, char *out, size_t sz)
{
	int pfd[2], st;
	size_t n = 0;
	pid_t pid;

	cr_assert_eq(pipe2(pfd, O_CLOEXEC), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		dup2(pfd[1], 1);
		dup2(pfd[1], 2);
		execl(SPACED_LAUNCH, SPACED_LAUNCH, "exec", "--state", l->state, "--", "/bin/sh", "-c",
		      script, (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	for (;;) {
		ssize_t r = read(pfd[0], out + n, sz - 1 - n);

		if (r <= 0)
			break;
		n += (size_t)r;
		if (n == sz - 1)
			break;
	}
	out[n] = '\0';
	close(pfd[0]);
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static pid_t init_pid(const struct launcher *l)
{
	char reply[1024], *p;

	ctl(l, "STATUS", reply, sizeof(reply));
	p = strstr(reply, "init=");
	cr_assert_not_null(p, "%s", reply);
	return (pid_t)atoi(p + 5);
}

/* Connects to guest.sock and sends the CONNECT line; returns the socket. */
static int transport_connect(const struct launcher *l, uint32_t port)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char req[32];
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/guest.sock", l->state);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	snprintf(req, sizeof(req), "CONNECT %u\n", (unsigned)port);
	cr_assert_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
	return fd;
}

/* Reads the "OK <n>" answer, then asks the guest on that connection which
 * identity it serves. Consumes fd. */
static int transport_identity(int fd, char *out, size_t sz)
{
	char line[64];
	uint32_t local;

	read_line(fd, line, sizeof(line), 10000);
	strcat(line, "\n");
	if (spaced_vsock_hs_parse_ok((const uint8_t *)line, strlen(line), &local) < 0) {
		close(fd);
		return SPACED_EPROTO;
	}
	struct spaced_guest_client *c = NULL;
	struct spaced_identity id;
	int r;

	cr_assert_eq(spaced_guest_client_adopt(fd, &c), 0);
	r = spaced_guest_hello(c, &id);
	if (r == 0)
		r = spaced_identity_encode(&id, out, sz) < 0 ? SPACED_EINVAL : 0;
	spaced_guest_client_free(c);
	return r;
}

/* The guest transport: CONNECT handshake, then the identity the guest
 * reports on that connection. */
static int guest_identity(const struct launcher *l, uint32_t port, char *out, size_t sz)
{
	int fd = transport_connect(l, port);

	if (fd < 0)
		return SPACED_ESYS;
	return transport_identity(fd, out, sz);
}

TestSuite(substrate, .init = setup, .fini = teardown, .timeout = 120);

Test(substrate, namespaces_and_identity)
{
	char id[256], out[8192], path[128], a[128], b[128], got[512];
	const char *extra[] = { "--identity", id, NULL };
	struct launcher l;
	pid_t init;
	ssize_t n;

	need_sandbox();
	idtext(id, sizeof(id), "sbx-ns", 1);
	start(&l, "x", extra, true);
	/* inside: PID 1 is the guest, the hostname is the sandbox, only lo exists */
	cr_assert_eq(run_in(&l, "tr '\\0' ' ' </proc/1/cmdline; echo; hostname; "
	                        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; id -u; "
	                        "ls /proc | grep -c '^[0-9]'; cat /etc/hostname; grep -c 'localhost sbx-ns' /etc/hosts",
	                    out, sizeof(out)), 0, "%s", out);
	cr_log_info("inside:\n%s", out);
	cr_assert(strstr(out, "spaced-guest --root / --control-fd 3") != NULL, "%s", out);
	cr_assert(strstr(out, "\nsbx-ns\nlo\n0\n") != NULL, "%s", out);
	cr_assert(strstr(out, "\nsbx-ns\n1\n") != NULL, "/etc/hostname, /etc/hosts: %s", out);
	/* a terminal from the execution's own devpts instance */
	cr_assert_eq(run_in(&l, "python3 -c 'import pty, os; m, s = pty.openpty(); print(os.ttyname(s))'",
	                    out, sizeof(out)), 0, "%s", out);
	cr_assert_str_eq(out, "/dev/pts/0\n");
	/* from the host: other namespaces than ours, root inside is uid 100000 */
	init = init_pid(&l);
	for (const char *const *ns = (const char *const[]){ "pid", "mnt", "net", "uts", "ipc", "user", "cgroup", NULL }; *ns; ns++) {
		snprintf(path, sizeof(path), "/proc/self/ns/%s", *ns);
		n = readlink(path, a, sizeof(a) - 1);
		cr_assert_gt(n, 0);
		a[n] = '\0';
		snprintf(path, sizeof(path), "/proc/%d/ns/%s", (int)init, *ns);
		n = readlink(path, b, sizeof(b) - 1);
		cr_assert_gt(n, 0);
		b[n] = '\0';
		cr_assert_str_neq(a, b, "namespace %s shared with the host", *ns);
	}
	{
		struct spaced_pidref ref;
		uid_t uid;

		cr_assert_eq(spaced_pidref_from_pid(&ref, init), 0);
		cr_assert_eq(spaced_pidref_uid(&ref, &uid), 0);
		cr_assert_eq(uid, 100000);
		spaced_pidref_done(&ref);
	}
	/* the guest reports the identity it was started with */
	cr_assert_eq(guest_identity(&l, 5, got, sizeof(got)), 0);
	cr_assert_str_eq(got, id);
	stop(&l);
	/* stopped: the layers are gone, the cgroups too */
	snprintf(path, sizeof(path), "%s/upper", l.state);
	cr_assert_neq(access(path, F_OK), 0);
}

Test(substrate, guest_transport_handshake) /* B2, strict CONNECT parsing */
{
	static const char *const bad[] = {
		"CONNECT -1\n", "CONNECT 4294967296\n", "connect 1\n", "CONNECT  1\n",
		"CONNECT 1 \n", "CONNECT 01\n", "CONNECT 1\r\n", "CONNECT 123456789012345678901234567\n",
	};
	char id[256], buf[64], why[256] = "";
	const char *extra[] = { "--identity", id, NULL };
	struct spaced_expected_listener exp;
	struct spaced_pidref lref;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct launcher l;
	int fd;

	need_sandbox();
	idtext(id, sizeof(id), "sbx-hs", 1);
	start(&l, "x", extra, true);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/guest.sock", l.state);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ssize_t n;

		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
		cr_assert_eq(write(fd, bad[i], strlen(bad[i])), (ssize_t)strlen(bad[i]));
		n = read(fd, buf, sizeof(buf)); /* refused: closed without an answer */
		cr_assert_leq(n, 0, "\"%s\" was answered", bad[i]);
		close(fd);
	}
	/* no newline at all, NUL bytes: refused too (the NUL at once, the other at 32 bytes) */
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(write(fd, "CONNECT 1\0\n", 11), 11);
	/* closed with our bytes unread: EOF or ECONNRESET, never an answer */
	cr_assert_leq(read(fd, buf, sizeof(buf)), 0);
	close(fd);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	memset(buf, '7', 40);
	cr_assert_eq(write(fd, buf, 40), 40);
	cr_assert_leq(read(fd, buf, sizeof(buf)), 0);
	close(fd);
	/* the launcher survived all of it and still serves */
	{
		char got[512];

		cr_assert_eq(guest_identity(&l, 1024, got, sizeof(got)), 0);
		cr_assert_str_eq(got, id);
	}
	/* B2: guest.sock is owned by root and held by the launcher process */
	cr_assert_eq(spaced_pidref_from_pid(&lref, l.pid), 0);
	memset(&exp, 0, sizeof(exp));
	exp.owner_uid = 0;
	exp.pid = l.pid;
	exp.start_time = lref.start_time;
	exp.check_exe = true;
	cr_assert_eq(spaced_exe_id_of_path(SPACED_LAUNCH, true, &exp.exe), 0);
	cr_assert_eq(spaced_peer_verify_listener(sa.sun_path, &exp, why, sizeof(why)), 0, "%s", why);
	fd = -1;
	cr_assert_eq(spaced_peer_connect_listener(sa.sun_path, &exp, &fd, why, sizeof(why)), 0, "%s", why);
	close(fd);
	/* the guest binary is not the VMM: expecting it is refused */
	cr_assert_eq(spaced_exe_id_of_path(guest_bin(), false, &exp.exe), 0);
	cr_assert_eq(spaced_peer_verify_listener(sa.sun_path, &exp, why, sizeof(why)), SPACED_EPEER);
	spaced_pidref_done(&lref);
	stop(&l);
}

Test(substrate, overlay_writes_stay_in_upper)
{
	char id[256], out[4096], p[256];
	const char *extra[] = { "--identity", id, "--uid-base", "0", NULL };
	struct launcher l;
	struct stat st;

	need_sandbox();
	idtext(id, sizeof(id), "sbx-ov", 1);
	/* root mapped to root (uid base 0): the base's own files are writable
	 * through the overlay, which shows where the writes go */
	start(&l, "x", extra, true);
	cr_assert_eq(run_in(&l, "echo new > /usr/spaced-overlay-probe && echo mod >> /etc/hostname && "
	                        "echo t > /tmp/t && rm /etc/debian_version && cat /etc/hostname",
	                    out, sizeof(out)), 0, "%s", out);
	cr_assert(strstr(out, "mod") != NULL);
	/* the writes are in the upper dirs … */
	snprintf(p, sizeof(p), "%s/upper/usr/spaced-overlay-probe", l.state);
	cr_assert_eq(stat(p, &st), 0);
	snprintf(p, sizeof(p), "%s/upper/etc/hostname", l.state);
	cr_assert_eq(stat(p, &st), 0);
	snprintf(p, sizeof(p), "%s/upper/etc/debian_version", l.state);
	cr_assert_eq(lstat(p, &st), 0);
	cr_assert(S_ISCHR(st.st_mode) && st.st_rdev == 0, "whiteout expected");
	snprintf(p, sizeof(p), "%s/upper/root/tmp/t", l.state);
	cr_assert_eq(stat(p, &st), 0);
	/* … and the base is unchanged */
	cr_assert_neq(access("/usr/spaced-overlay-probe", F_OK), 0);
	cr_assert_eq(access("/etc/debian_version", F_OK), 0);
	{
		FILE *f = fopen("/etc/hostname", "r");
		char line[256] = "";

		cr_assert_not_null(f);
		while (fgets(line, sizeof(line), f) != NULL)
			cr_assert(strstr(line, "mod") == NULL, "host /etc/hostname changed");
		fclose(f);
	}
	stop(&l);
}

Test(substrate, escape_attempts_fail)
{
	char id[256], out[8192];
	const char *extra[] = { "--identity", id, NULL };
	struct launcher l;
	pid_t sleeper;
	int st, tcp_fd, abs_fd;
	char netprobe[1024];

	need_sandbox();
	idtext(id, sizeof(id), "sbx-esc", 1);
	sleeper = fork();
	if (sleeper == 0) {
		pause();
		_exit(0);
	}
	start(&l, "x", extra, true);
	/* host listeners the execution must not reach: TCP on the host's loopback
	 * and an abstract Unix socket */
	{
		struct sockaddr_in in = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		struct sockaddr_un un = { .sun_family = AF_UNIX };
		socklen_t len = sizeof(in);
		int n;

		tcp_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		cr_assert_eq(bind(tcp_fd, (struct sockaddr *)&in, sizeof(in)), 0);
		cr_assert_eq(listen(tcp_fd, 4), 0);
		cr_assert_eq(getsockname(tcp_fd, (struct sockaddr *)&in, &len), 0);
		abs_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		n = snprintf(un.sun_path + 1, sizeof(un.sun_path) - 1, "spaced-test-%d", (int)getpid());
		cr_assert_eq(bind(abs_fd, (struct sockaddr *)&un, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n)), 0);
		cr_assert_eq(listen(abs_fd, 4), 0);
		snprintf(netprobe, sizeof(netprobe),
		         "python3 -c '\n"
		         "import socket\n"
		         "for fam, addr, name in ((socket.AF_INET, (\"127.0.0.1\", %d), \"tcp\"), (socket.AF_UNIX, \"\\0spaced-test-%d\", \"abstract\")):\n"
		         "    s = socket.socket(fam, socket.SOCK_STREAM)\n"
		         "    try:\n"
		         "        s.connect(addr); print(\"REACHED-\" + name)\n"
		         "    except OSError:\n"
		         "        print(\"ok-\" + name)\n"
		         "'",
		         (int)ntohs(in.sin_port), (int)getpid());
	}
	cr_assert_eq(run_in(&l, netprobe, out, sizeof(out)), 0, "%s", out);
	cr_log_info("network probes:\n%s", out);
	cr_assert(strstr(out, "ok-tcp") != NULL && strstr(out, "ok-abstract") != NULL &&
	          strstr(out, "REACHED") == NULL, "%s", out);
	close(tcp_fd);
	close(abs_fd);
	/* each line prints "ok" when the attempt was refused */
	cr_assert_eq(run_in(&l,
	                    "mount -t tmpfs none /tmp 2>/dev/null && echo MOUNTED || echo ok-mount;"
	                    "unshare -U true 2>/dev/null && echo UNSHARED || echo ok-unshare;"
	                    "unshare -n true 2>/dev/null && echo UNSHARED-NET || echo ok-unshare-net;"
	                    "chroot / true 2>/dev/null && echo CHROOT || echo ok-chroot;"
	                    "ls /work >/dev/null 2>&1 && echo HOST-FS || echo ok-hostfs;"
	                    "ls /sys/class/net >/dev/null 2>&1 && echo SYSFS || echo ok-sysfs;"
	                    "test -e /dev/vda && echo DISK || echo ok-disk;"
	                    "cat /etc/shadow >/dev/null 2>&1 && echo SHADOW || echo ok-shadow;"
	                    "echo x > /proc/sys/kernel/hostname 2>/dev/null && echo SYSCTL || echo ok-sysctl;"
	                    "hostname evil 2>/dev/null && echo HOSTNAME || echo ok-hostname;"
	                    "ip link set lo down 2>/dev/null && echo NETADMIN || echo ok-netadmin;"
	                    "kill -9 -1 2>/dev/null; echo ok-kill;"
	                    "touch /usr/bin/evil 2>/dev/null && echo BASE-WRITE || echo ok-base;"
	                    /* syscalls of the deny-list through ctypes: EPERM (1) from seccomp,
	                     * including calls that succeed anywhere else: unshare(0), keyctl */
	                    "python3 -c '\n"
	                    "import ctypes, os\n"
	                    "libc = ctypes.CDLL(None, use_errno=True)\n"
	                    "calls = {\"unshare0\": (272, 0), \"keyctl\": (250, 0, -3, 0),\n"
	                    " \"bpf\": (321, 0, 0, 0), \"perf_event_open\": (298, 0, 0, -1, -1, 0),\n"
	                    " \"open_by_handle_at\": (304, 3, 0, 0), \"kexec_load\": (246, 0, 0, 0, 0),\n"
	                    " \"init_module\": (175, 0, 0, 0), \"setns\": (308, 0, 0), \"userfaultfd\": (323, 0),\n"
	                    " \"mount_setattr\": (442, -1, 0, 0, 0, 0), \"fsopen\": (430, 0, 0),\n"
	                    " \"io_uring_setup\": (425, 1, 0)}\n"
	                    "for name, args in calls.items():\n"
	                    "    r = libc.syscall(*[ctypes.c_long(a) for a in args])\n"
	                    "    e = ctypes.get_errno()\n"
	                    "    print(name, \"ok-seccomp\" if r == -1 and e == 1 else \"ALLOWED r=%d errno=%d\" % (r, e))\n"
	                    /* no vsock socket (EAFNOSUPPORT): the host's services are out of reach */
	                    "r = libc.syscall(41, 40, 1, 0)\n"
	                    "e = ctypes.get_errno()\n"
	                    "print(\"vsock\", \"ok-seccomp\" if r == -1 and e == 97 else \"ALLOWED r=%d errno=%d\" % (r, e))\n"
	                    /* the same family with high bits set: the kernel reads an int */
	                    "r = libc.syscall(41, ctypes.c_long(0x100000028), 1, 0)\n"
	                    "e = ctypes.get_errno()\n"
	                    "print(\"vsock-high-bits\", \"ok-seccomp\" if r == -1 and e == 97 else \"ALLOWED r=%d errno=%d\" % (r, e))\n"
	                    "'",
	                    out, sizeof(out)), 0, "%s", out);
	cr_log_info("escape attempts:\n%s", out);
	cr_assert(strstr(out, "MOUNTED") == NULL && strstr(out, "UNSHARED") == NULL &&
	          strstr(out, "CHROOT") == NULL && strstr(out, "HOST-FS") == NULL &&
	          strstr(out, "SYSFS") == NULL && strstr(out, "DISK") == NULL &&
	          strstr(out, "SHADOW") == NULL && strstr(out, "SYSCTL") == NULL &&
	          strstr(out, "HOSTNAME") == NULL && strstr(out, "NETADMIN") == NULL &&
	          strstr(out, "BASE-WRITE") == NULL && strstr(out, "ALLOWED") == NULL,
	          "%s", out);
	cr_assert_eq(strstr(out, "ok-seccomp") != NULL, true, "%s", out);
	/* kill -9 -1 inside reached nothing outside */
	cr_assert_eq(waitpid(sleeper, &st, WNOHANG), 0, "a host process was killed from inside");
	kill(sleeper, SIGKILL);
	waitpid(sleeper, &st, 0);
	/* the execution itself survives its own kill -9 -1 (PID 1 ignores it) */
	cr_assert_eq(run_in(&l, "echo alive", out, sizeof(out)), 0, "%s", out);
	stop(&l);
}

/* The cgroup v1 directory of `ctrl` holding pid (from the host's view). */
static void cgroup_dir(pid_t pid, const char *ctrl, char *out, size_t sz)
{
	char path[64], line[512];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	f = fopen(path, "r");
	cr_assert_not_null(f);
	out[0] = '\0';
	while (fgets(line, sizeof(line), f) != NULL) {
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;

		if (c2 == NULL)
			continue;
		*c2 = '\0';
		line[strcspn(c2 + 1, "\n") + (size_t)(c2 + 1 - line)] = '\0';
		if (strcmp(c1 + 1, ctrl) == 0)
			snprintf(out, sz, "/sys/fs/cgroup/%s%s", ctrl, c2 + 1);
	}
	fclose(f);
	cr_assert_neq(out[0], '\0', "no %s cgroup", ctrl);
}

static long read_key(const char *file, const char *key)
{
	char line[256];
	long v = -1;
	FILE *f = fopen(file, "r");

	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, key, strlen(key)) == 0 && line[strlen(key)] == ' ')
			v = atol(line + strlen(key) + 1);
	fclose(f);
	return v;
}

Test(substrate, memory_limit_kills_a_hog)
{
	char id[256], out[4096], cg[512], p[600];
	const char *extra[] = { "--identity", id, "--memory", "67108864", NULL };
	struct launcher l;
	int rc;

	need_sandbox();
	if (access("/sys/fs/cgroup/memory", F_OK) != 0)
		cr_skip_test("cgroup v1 memory hierarchy not mounted (this test reads its files)");
	idtext(id, sizeof(id), "sbx-mem", 1);
	start(&l, "x", extra, true);
	/* 256 MiB of touched memory against a 64 MiB limit */
	rc = run_in(&l, "python3 -c 'b = bytearray(b\"x\") * (256 << 20); print(\"SURVIVED\", len(b))'",
	            out, sizeof(out));
	cr_log_info("hog exit %d: %s", rc, out);
	cr_assert(strstr(out, "SURVIVED") == NULL, "%s", out);
	cr_assert_eq(rc, 128 + SIGKILL, "hog exit %d: %s", rc, out);
	cgroup_dir(init_pid(&l), "memory", cg, sizeof(cg));
	snprintf(p, sizeof(p), "%s/memory.oom_control", cg);
	cr_assert_geq(read_key(p, "oom_kill"), 1, "no OOM kill recorded in %s", p);
	/* the guest itself was not the victim */
	cr_assert_eq(run_in(&l, "echo alive", out, sizeof(out)), 0);
	stop(&l);
}

Test(substrate, pids_limit_stops_a_fork_bomb)
{
	char id[256], out[8192], cg[512], p[600];
	const char *extra[] = { "--identity", id, "--pids", "24", NULL };
	struct launcher l;
	long cur, ev;

	need_sandbox();
	if (access("/sys/fs/cgroup/pids", F_OK) != 0)
		cr_skip_test("cgroup v1 pids hierarchy not mounted (this test reads its files)");
	idtext(id, sizeof(id), "sbx-pids", 1);
	start(&l, "x", extra, true);
	/* a bounded bomb: 100 sleepers asked for, the limit lets ~20 through */
	(void)run_in(&l, "i=0; while [ $i -lt 100 ]; do sleep 30 >/dev/null 2>&1 & i=$((i+1)); done; echo done", out,
	             sizeof(out));
	cgroup_dir(init_pid(&l), "pids", cg, sizeof(cg));
	snprintf(p, sizeof(p), "%s/pids.events", cg);
	ev = read_key(p, "max");
	snprintf(p, sizeof(p), "%s/pids.current", cg);
	{
		FILE *f = fopen(p, "r");

		cr_assert_not_null(f);
		cr_assert_eq(fscanf(f, "%ld", &cur), 1);
		fclose(f);
	}
	cr_log_info("pids.current %ld, pids.events max %ld", cur, ev);
	cr_assert_geq(ev, 1, "the pids limit was never hit");
	cr_assert_leq(cur, 24);
	stop(&l);
}

static long read_counter(const char *path)
{
	long v = -1;
	FILE *f = fopen(path, "r");

	if (f != NULL) {
		if (fscanf(f, "%ld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

static void nap_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* The first line of a small file, "" when unreadable. */
static void line_of(const char *path, char *out, size_t sz)
{
	FILE *f = fopen(path, "r");

	out[0] = '\0';
	if (f != NULL) {
		if (fgets(out, (int)sz, f) == NULL)
			out[0] = '\0';
		fclose(f);
	}
	out[strcspn(out, "\n")] = '\0';
}

/* Whether every task of cgroup dir may run on exactly the CPUs cpus
 * (/proc/TID/status Cpus_allowed_list); how many tasks it saw in *n. */
static bool tasks_on(const char *cgdir, const char *cpus, int *n)
{
	char path[700], line[256], want[300];
	bool all = true;
	FILE *t;

	*n = 0;
	snprintf(path, sizeof(path), "%s/tasks", cgdir);
	if ((t = fopen(path, "r")) == NULL)
		return false;
	snprintf(want, sizeof(want), "Cpus_allowed_list:\t%s\n", cpus);
	while (fgets(line, sizeof(line), t) != NULL) {
		char st[64], l2[256];
		bool seen = false;
		FILE *f;

		snprintf(st, sizeof(st), "/proc/%ld/status", atol(line));
		if ((f = fopen(st, "r")) == NULL)
			continue; /* gone meanwhile */
		while (fgets(l2, sizeof(l2), f) != NULL)
			if (strncmp(l2, "Cpus_allowed_list:", 18) == 0)
				seen = strcmp(l2, want) == 0;
		fclose(f);
		all = all && seen;
		(*n)++;
	}
	fclose(t);
	return all;
}

/* An execution of the spread rule's tests: its launcher, its cpuset and cpu
 * cgroups, and the CPUs of its parent (the ones a free execution has). */
/* Voluntary context switches of task pid so far (its wake-ups), or -1. */
static long wakeups(pid_t pid)
{
	char path[64], line[256];
	long n = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	if ((f = fopen(path, "r")) == NULL)
		return -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, "voluntary_ctxt_switches:", 24) == 0)
			n = atol(line + 24);
	fclose(f);
	return n;
}

/* The worker's lease (--lease-file, libspaced/lease.h): while it is valid
 * the launcher sets a CLOCK_REALTIME timer at the second after it ends and
 * sleeps until then (it read the file every second: a thousand idle
 * executions woke a thousand times a second); at that second it reads the
 * lease, which has ended (no gate renewed it), and freezes its execution on
 * its own. Fails on the code before (a wake-up a second). */
Test(substrate, launcher_reads_a_valid_lease_at_its_end_not_every_second, .timeout = 60)
{
	struct launcher l;
	char lease[300], id[256], fz[600], state[64] = "";
	long long until = (long long)time(NULL) + 5;
	FILE *f;

	need_sandbox();
	if (access("/sys/fs/cgroup/freezer", F_OK) != 0)
		cr_skip_test("no cgroup v1 freezer hierarchy (this test reads freezer.state)");
	idtext(id, sizeof(id), "sbx-lease-timer", 1);
	snprintf(lease, sizeof(lease), "%s/lease", dir);
	cr_assert_not_null(f = fopen(lease, "w"));
	fprintf(f, "%lld\n", until);
	fclose(f);
	const char *extra[] = { "--identity", id, "--lease-file", lease, NULL };
	start(&l, "lt", extra, true);
	nap_ms(1200);
	long w0 = wakeups(l.pid);
	nap_ms(2500);
	long w1 = wakeups(l.pid);
	cr_log_info("the launcher woke %ld times in 2.5 s while the lease was valid", w1 - w0);
	cr_expect(w0 >= 0 && w1 - w0 <= 1, "an idle launcher with a valid lease woke %ld times in 2.5 s", w1 - w0);
	cgroup_dir(init_pid(&l), "freezer", fz, sizeof(fz));
	strcat(fz, "/freezer.state");
	for (int i = 0; i < 100 && strcmp(state, "FROZEN") != 0; i++) {
		nap_ms(100);
		line_of(fz, state, sizeof(state));
	}
	cr_log_info("%s %lld s after the lease's end", state, (long long)time(NULL) - until);
	cr_expect_str_eq(state, "FROZEN", "the execution frozen once the lease ended (%s)", state);
	stop(&l);
}

struct spread_exec {
	struct launcher l;
	char id[256], cpuset[512], cpu[512], all[256];
};

/* Skips a test of the spread rule where it cannot run. */
static void need_spread(void)
{
	need_sandbox();
	if (access("/sys/fs/cgroup/cpuset/cpuset.cpus", F_OK) != 0 || access("/sys/fs/cgroup/cpu/cpu.shares", F_OK) != 0)
		cr_skip_test("no cgroup v1 cpuset and cpu hierarchies (these tests read and make cgroups there)");
	if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
		cr_skip_test("one CPU: nothing to hold an execution to");
}

/* Starts execution name of sandbox under --cpus cpus; it may use every CPU
 * of its parent at first. */
static void spread_start(struct spread_exec *e, const char *name, const char *sandbox, const char *cpus)
{
	const char *extra[] = { "--identity", e->id, "--cpus", cpus, NULL };
	char path[600], now[256];

	idtext(e->id, sizeof(e->id), sandbox, 1);
	start(&e->l, name, extra, true);
	cgroup_dir(init_pid(&e->l), "cpuset", e->cpuset, sizeof(e->cpuset));
	cgroup_dir(init_pid(&e->l), "cpu", e->cpu, sizeof(e->cpu));
	snprintf(path, sizeof(path), "%s", e->cpuset);
	*strrchr(path, '/') = '\0';
	strcat(path, "/cpuset.cpus");
	line_of(path, e->all, sizeof(e->all));
	snprintf(path, sizeof(path), "%s/cpuset.cpus", e->cpuset);
	line_of(path, now, sizeof(now));
	cr_assert_neq(e->all[0], '\0');
	cr_assert_str_eq(now, e->all, "a new execution may use every CPU of its parent");
}

/* The CPUs the execution may use now. */
static void spread_cpus(const struct spread_exec *e, char *out, size_t sz)
{
	char path[600];

	snprintf(path, sizeof(path), "%s/cpuset.cpus", e->cpuset);
	line_of(path, out, sz);
}

/* n busy processes in it, each ending by itself after secs seconds. */
static void spread_busy(const struct spread_exec *e, int n, int secs)
{
	char cmd[256], out[4096];

	snprintf(cmd, sizeof(cmd),
	         "i=0; while [ $i -lt %d ]; do timeout %d sh -c 'while :; do :; done' >/dev/null 2>&1 & "
	         "i=$((i + 1)); done; echo started", n, secs);
	cr_assert_eq(run_in(&e->l, cmd, out, sizeof(out)), 0, "%s", out);
}

/* Waits (up to ms) until the execution's CPUs are other than all (held),
 * or, held false, are all again; the CPUs in now, the time waited. */
static int spread_wait(const struct spread_exec *e, bool held, int ms, char *now, size_t sz)
{
	int waited = 0;

	for (;; waited += 50) {
		spread_cpus(e, now, sz);
		if ((now[0] != '\0' && strcmp(now, e->all) != 0) == held || waited >= ms)
			return waited;
		nap_ms(50);
	}
}

/* The spread rule (docs/substrate.md "CPU: how many at once"): four
 * CPU-bound processes under --cpus 0.5 take every CPU of the host for a
 * quarter of each period, so a co-tenant's woken task waits for a tick there;
 * once the quota holds them back the execution is held to one CPU (its
 * cpuset, every task in it), and let go to all once they end. */
Test(substrate, cpu_bound_execution_is_held_to_its_limits_cpus, .timeout = 90)
{
	struct spread_exec e;
	char now[256];
	int n = 0, ms;

	need_spread();
	spread_start(&e, "x", "sbx-spread", "0.5");
	spread_busy(&e, 4, 8);
	ms = spread_wait(&e, true, 7000, now, sizeof(now));
	cr_log_info("held after %d ms to CPUs %s (of %s)", ms, now, e.all);
	cr_assert(now[0] != '\0' && strcmp(now, e.all) != 0, "still on CPUs %s after 7 s", now);
	cr_expect(strchr(now, ',') == NULL && strchr(now, '-') == NULL, "0.5 CPU held to one CPU: %s", now);
	cr_expect(tasks_on(e.cpuset, now, &n) && n >= 5, "every task of the execution (%d seen) on CPU %s", n, now);
	ms = spread_wait(&e, false, 25000, now, sizeof(now));
	cr_log_info("let go after %d ms", ms);
	cr_expect_str_eq(now, e.all, "let go once its processes ended (25 s): %s", now);
	cr_expect(tasks_on(e.cpuset, e.all, &n) && n >= 1, "its tasks (%d) on every CPU again", n);
	stop(&e.l);
}

/* A fork loop under half a CPU never meets its quota, yet spends a quarter
 * of a CPU in the kernel, which this host's kernel may not preempt
 * (PREEMPT_NONE): a co-tenant's woken task waited for each of its forks,
 * execs and exits on the CPU it ran on. After three such samples it is held
 * to one CPU, as a throttled one is, and let go once the loop ends. Fails
 * without the kernel-time trigger (never held). */
Test(substrate, execution_busy_in_the_kernel_is_held, .timeout = 90)
{
	struct spread_exec e;
	char now[256] = "", st[600], sys_path[600], acct[512], out[256], seen[200] = "";
	struct timespec a, b;
	int run = 0, most = 0, ms = 0;

	need_spread();
	spread_start(&e, "kf", "sbx-spread-forks", "0.5");
	snprintf(st, sizeof(st), "%s/cpu.stat", e.cpu);
	cgroup_dir(init_pid(&e.l), "cpuacct", acct, sizeof(acct));
	snprintf(sys_path, sizeof(sys_path), "%s/cpuacct.usage_sys", acct);
	long thr0 = read_key(st, "throttled_time");
	clock_gettime(CLOCK_MONOTONIC, &a);
	cr_assert_eq(run_in(&e.l,
	                    "timeout 16 sh -c 'while :; do for i in 1 2 3 4 5 6 7 8; do sleep 0.01 & done; wait; done' "
	                    ">/dev/null 2>&1 & echo started",
	                    out, sizeof(out)),
	             0, "%s", out);
	/* what the rule reads, each second: its time in the kernel as the kernel
	 * counts it (at its ticks; a busy host, make check's, counts less) */
	char line[64];
	line_of(sys_path, line, sizeof(line));
	long long sys0 = atoll(line);
	bool held = false;
	for (int s = 0; s < 14 && !held && run < 6; s++) {
		for (int k = 0; k < 10 && !held; k++, ms += 100) {
			nap_ms(100);
			spread_cpus(&e, now, sizeof(now));
			held = now[0] != '\0' && strcmp(now, e.all) != 0;
		}
		line_of(sys_path, line, sizeof(line));
		long long milli = (atoll(line) - sys0) / 1000000;
		sys0 = atoll(line);
		run = milli >= 150 ? run + 1 : 0;
		most = run > most ? run : most;
		snprintf(seen + strlen(seen), sizeof(seen) - strlen(seen), " %lld", milli);
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	long thr = read_key(st, "throttled_time") - thr0;
	long el = (b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec);
	cr_log_info("fork loop: in the kernel each second (thousandths of a CPU):%s; held after %d ms to CPUs %s (of %s); "
	            "its quota held it back %ld of %ld ns",
	            seen, ms, now, e.all, thr, el);
	if (!held && most < 4) {
		stop(&e.l);
		cr_skip_test("the host is too busy: the loop's time in the kernel as counted reached 150 for %d s in a row "
		             "at most (%s)",
		             most, seen);
	}
	if (!held) {
		stop(&e.l);
		cr_assert_fail("a fork loop in the kernel 0.15 of a CPU for %d s in a row is still on CPUs %s", most, now);
	}
	cr_expect(thr * 5 < el, "its quota held it back %ld of %ld ns: held for that, not for its time in the kernel",
	          thr, el);
	cr_expect(strchr(now, ',') == NULL && strchr(now, '-') == NULL, "0.5 CPU held to one CPU: %s", now);
	ms = spread_wait(&e, false, 35000, now, sizeof(now));
	cr_log_info("let go %d ms after", ms);
	cr_expect_str_eq(now, e.all, "let go once the loop ended: %s", now);
	stop(&e.l);
}

/* Two busy loops on the host at nice 19 for secs seconds (they take next to
 * no CPU from anything else, but leave no CPU idle: the kernel then counts
 * less of a fork loop's time as its time in the kernel); their pids. */
static void host_busy(pid_t out[2], int secs)
{
	char t[16];

	snprintf(t, sizeof(t), "%d", secs);
	for (int i = 0; i < 2; i++) {
		out[i] = fork();
		cr_assert_geq(out[i], 0);
		if (out[i] == 0) {
			execlp("timeout", "timeout", t, "nice", "-n", "19", "sh", "-c", "while :; do :; done", (char *)NULL);
			_exit(127);
		}
	}
}

static void host_busy_end(const pid_t p[2])
{
	for (int i = 0; i < 2; i++) {
		kill(p[i], SIGTERM);
		waitpid(p[i], NULL, 0);
	}
}

/* A loop (a shell line) run for 12 s in execution e (started here under
 * 0.5 CPU as name of sandbox, its launcher's log in DIR/name.log), and up
 * to 10 s for the spread rule to hold it: the CPUs it may use then in now,
 * the tasks it started a second (a shell's PID inside before and after: the
 * namespace gives them in turn; what the launcher counts), the launcher's
 * log in text. Skips, with the figures, when it was not held and started
 * under 250 a second: the host was too busy for the test. before(): what
 * to start once the execution runs (NULL: nothing); after(): its end. */
static int loop_held(struct spread_exec *e, const char *name, const char *sandbox, const char *loop,
                     void (*before)(void), void (*after)(void), char *now, size_t nowsz, char *text, size_t textsz)
{
	char log[300], cmd[600], out[256];

	snprintf(log, sizeof(log), "%s/%s.log", dir, name);
	launch_log = log;
	spread_start(e, name, sandbox, "0.5");
	launch_log = NULL;
	if (before)
		before();
	snprintf(cmd, sizeof(cmd), "timeout 12 %s >/dev/null 2>&1 & echo $$", loop);
	cr_assert_eq(run_in(&e->l, cmd, out, sizeof(out)), 0, "%s", out);
	long pid0 = atol(out);
	int ms = spread_wait(e, true, 10000, now, nowsz);
	if (after)
		after();
	cr_assert_eq(run_in(&e->l, "echo $$", out, sizeof(out)), 0, "%s", out);
	long rate = (atol(out) - pid0) * 1000 / (ms > 0 ? ms : 1);
	text[0] = '\0';
	int fd = open(log, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		ssize_t n = read(fd, text, textsz - 1);
		text[n > 0 ? n : 0] = '\0';
		close(fd);
	}
	cr_log_info("%s: %ld tasks a second by its own count; CPUs %s after %d ms (of %s)", name, rate, now, ms, e->all);
	if (strcmp(now, e->all) == 0 && rate < 250) {
		stop(&e->l);
		cr_skip_test("the host is too busy: the loop started %ld tasks a second, not the 250 and more the test needs",
		             rate);
	}
	cr_expect(strcmp(now, e->all) != 0, "a loop starting %ld tasks a second is still on CPUs %s after %d ms", rate,
	          now, ms);
	cr_expect(strstr(text, "it starts 200 tasks a second and more") != NULL,
	          "held for its task starts, by the launcher's log:\n%s", text);
	return ms;
}

static pid_t busy_bg[2];
static void busy_start(void)
{
	host_busy(busy_bg, 20);
}
static void busy_end(void)
{
	host_busy_end(busy_bg);
}

/* The same hold for an execution that starts 200 tasks a second and more
 * (with a twentieth of a CPU in the kernel) for three samples: its PID
 * namespace's counter, read by the launcher, says how many it started, not
 * the kernel's tick-counted time. A loop of four `sleep 0.01 &` starts about
 * 300 a second; beside busy host tasks its time in the kernel as counted
 * read 0.10-0.15 of a CPU, sometimes more: the launcher names the task starts
 * whether or not that held it too (without the count, the test fails: not
 * held, or held for its time in the kernel alone). */
Test(substrate, execution_starting_many_tasks_is_held, .timeout = 90)
{
	struct spread_exec e;
	char now[256], text[8192];

	need_spread();
	loop_held(&e, "kt", "sbx-spread-tasks",
	          "sh -c 'while :; do for i in 1 2 3 4; do sleep 0.01 & done; wait; done'", busy_start, busy_end, now,
	          sizeof(now), text, sizeof(text));
	cr_expect(strchr(now, ',') == NULL && strchr(now, '-') == NULL, "0.5 CPU held to one CPU: %s", now);
	int ms = spread_wait(&e, false, 35000, now, sizeof(now));
	cr_log_info("let go %d ms after", ms);
	cr_expect_str_eq(now, e.all, "let go once the loop ended: %s", now);
	stop(&e.l);
}

/* A hostile tenant hiding its fork loop: bursts of 80 tasks one after the
 * other (each gone within a millisecond, never more than one at a time, so
 * its quota never holds it back for long), then 0.15 s with nothing new
 * alive, so that a look at its live tasks finds the old shell most of the
 * time; and, where the sandbox lets it, in a PID namespace of its own (each
 * level of nested namespaces gives a task a PID, the execution's too; this
 * host's sandboxes refuse one). The kernel-time trigger misses it (without
 * the count: never held in 10 s); the count is the namespace's counter, not
 * a look at live tasks: held for its task starts. */
Test(substrate, a_fork_loop_in_bursts_is_held, .timeout = 90)
{
	struct spread_exec e;
	char now[256], text[8192], out[64];

	need_spread();
	/* unshare in the loop where the sandbox allows it: run_in answers in a
	 * throwaway execution first */
	struct spread_exec probe;
	spread_start(&probe, "kbp", "sbx-spread-probe", "0.5");
	cr_assert_eq(run_in(&probe.l, "unshare -p -f true 2>/dev/null && echo nested || echo refused", out, sizeof(out)),
	             0, "%s", out);
	stop(&probe.l);
	bool nested = strncmp(out, "nested", 6) == 0;
	cr_log_info("a PID namespace of its own: %s", nested ? "made" : "refused here");
	loop_held(&e, "kb", "sbx-spread-bursts",
	          nested ? "unshare -p -f sh -c 'while :; do i=0; while [ $i -lt 80 ]; do /bin/true; i=$((i + 1)); "
	                   "done; sleep 0.15; done'"
	                 : "sh -c 'while :; do i=0; while [ $i -lt 80 ]; do /bin/true; i=$((i + 1)); done; sleep 0.15; "
	                   "done'",
	          NULL, NULL, now, sizeof(now), text, sizeof(text));
	stop(&e.l);
}

/* A thread pool's churn is not a fork loop: 400 threads started a second,
 * with little time in the kernel, leave the execution free. */
Test(substrate, thread_churn_is_not_held, .timeout = 60)
{
	struct spread_exec e;
	char now[256], out[512];

	need_spread();
	if (system("command -v python3 >/dev/null 2>&1") != 0)
		cr_skip_test("no python3 on this host (the execution runs the host's)");
	spread_start(&e, "tc", "sbx-thread-churn", "0.5");
	cr_assert_eq(run_in(&e.l,
	                    "timeout 7 python3 -c 'import threading, time\n"
	                    "while True:\n"
	                    "    t = threading.Thread(target=int); t.start(); t.join(); time.sleep(0.002)' "
	                    ">/dev/null 2>&1 & echo started",
	                    out, sizeof(out)),
	             0, "%s", out);
	int ms = spread_wait(&e, true, 6500, now, sizeof(now));
	cr_log_info("thread churn: CPUs %s after %d ms (of %s)", now, ms, e.all);
	cr_expect_str_eq(now, e.all, "a thread pool's churn is not held: %s", now);
	stop(&e.l);
}

/* One busy process under a whole-CPU limit meets its quota, at most a
 * moment past it: it is not held (it would lose moving between CPUs for
 * nothing), while the same process under half a CPU is. */
Test(substrate, one_busy_process_under_a_whole_cpu_is_not_held, .timeout = 60)
{
	struct spread_exec e;
	char now[256], st[600];

	need_spread();
	spread_start(&e, "one", "sbx-one-busy", "1");
	spread_busy(&e, 1, 6);
	nap_ms(4500); /* four samples */
	spread_cpus(&e, now, sizeof(now));
	snprintf(st, sizeof(st), "%s/cpu.stat", e.cpu);
	cr_log_info("one busy process under 1 CPU: CPUs %s, throttled %ld of %ld periods, %ld ns in all", now,
	            read_key(st, "nr_throttled"), read_key(st, "nr_periods"), read_key(st, "throttled_time"));
	cr_expect_str_eq(now, e.all, "one busy process under a whole CPU is not held: %s", now);
	stop(&e.l);
}

/* spaced-node --cpu-spread off (SPACED_CPU_SPREAD=off in its launchers'
 * environment): the same hog as above is left on every CPU. */
Test(substrate, spread_rule_off_leaves_a_cpu_bound_execution_free, .timeout = 60)
{
	struct spread_exec e;
	char now[256];

	need_spread();
	setenv("SPACED_CPU_SPREAD", "off", 1);
	spread_start(&e, "off", "sbx-spread-off", "0.5");
	unsetenv("SPACED_CPU_SPREAD");
	spread_busy(&e, 4, 6);
	nap_ms(3500); /* three samples: held after one with the rule on */
	spread_cpus(&e, now, sizeof(now));
	cr_expect_str_eq(now, e.all, "with the rule off it keeps every CPU, not %s", now);
	stop(&e.l);
}

/* Kills the busy loops (spread_busy) among the tasks of cgroup cgdir; how
 * many. */
static int kill_busy(const char *cgdir)
{
	char path[700], line[64];
	int n = 0;
	FILE *t;

	snprintf(path, sizeof(path), "%s/tasks", cgdir);
	if ((t = fopen(path, "r")) == NULL)
		return 0;
	while (fgets(line, sizeof(line), t) != NULL) {
		char cl[256] = "", cp[64];
		long pid = atol(line);
		FILE *f;
		size_t got = 0;

		snprintf(cp, sizeof(cp), "/proc/%ld/cmdline", pid);
		if ((f = fopen(cp, "r")) != NULL) {
			got = fread(cl, 1, sizeof(cl) - 1, f);
			fclose(f);
		}
		for (size_t i = 0; i < got; i++)
			if (cl[i] == '\0')
				cl[i] = ' ';
		cl[got] = '\0';
		if (strstr(cl, "while :") != NULL && strstr(cl, "timeout") == NULL && kill((pid_t)pid, SIGKILL) == 0)
			n++;
	}
	fclose(t);
	return n;
}

/* Whether an execution cgroup under /sys/fs/cgroup/cpuset (every worker's
 * parent) other than mine is held to a list that names cpu. */
static bool other_held_on(const char *mine, const char *cpu)
{
	char cmd[2048], out[64] = "";
	FILE *p;

	snprintf(cmd, sizeof(cmd),
	         "for d in /sys/fs/cgroup/cpuset/spaced*/spaced-*; do [ \"$d\" = '%.700s' ] && continue; "
	         "c=$(cat \"$d/cpuset.cpus\" 2>/dev/null); "
	         "[ -n \"$c\" ] && [ \"$c\" != \"$(cat $(dirname $d)/cpuset.cpus)\" ] && echo \"$c\"; done | "
	         "grep -qx '%.200s' && echo yes", mine, cpu);
	if ((p = popen(cmd, "r")) != NULL) {
		if (fgets(out, sizeof(out), p) == NULL)
			out[0] = '\0';
		pclose(p);
	}
	return strncmp(out, "yes", 3) == 0;
}

/* list (a cpuset list: "0-3", "1,3") without the CPUs of minus, in the
 * kernel's form ("0,2-3"). */
static void cpus_without(const char *list, const char *minus, char *out, size_t sz)
{
	bool in[256] = { false }, out_of[256] = { false };
	bool *sets[2] = { in, out_of };
	const char *texts[2] = { list, minus };
	size_t used = 0;

	for (int k = 0; k < 2; k++)
		for (const char *p = texts[k]; *p != '\0' && *p != '\n';) {
			char *end;
			long a = strtol(p, &end, 10), b = a;

			if (*end == '-')
				b = strtol(end + 1, &end, 10);
			for (long c = a < 0 ? 0 : a; c <= b && c < 256; c++)
				sets[k][c] = true;
			p = *end == ',' ? end + 1 : end;
			if (end == p && *p != ',')
				break;
		}
	out[0] = '\0';
	for (int c = 0; c < 256; c++) {
		if (!in[c] || out_of[c] || (c > 0 && in[c - 1] && !out_of[c - 1]))
			continue;
		int e = c;

		while (e + 1 < 256 && in[e + 1] && !out_of[e + 1])
			e++;
		used += (size_t)snprintf(out + used, sz - used, e > c ? "%s%d-%d" : "%s%d", used ? "," : "", c, e);
	}
}

/* Beside an execution held to a CPU, a free one keeps its tasks off that CPU
 * (their affinity; its cpuset stays its parent's: the rule counts it free)
 * — a task of its woken there waited for the held one's tick — and runs on
 * every CPU again once that one is let go. Fails on the code before (the
 * free one's tasks stay on every CPU). The rule is the host's: another
 * test's execution held meanwhile may leave no room (then it stays on
 * every CPU a while), hence the long waits. */
Test(substrate, free_execution_keeps_off_a_held_executions_cpus, .timeout = 150)
{
	struct spread_exec h, q;
	char held[256], want[256], now[256];
	int n = 0, waited;

	need_spread();
	spread_start(&h, "kh", "sbx-keep-hog", "0.5");
	spread_start(&q, "kq", "sbx-keep-quiet", "1");
	spread_busy(&h, 4, 90);
	spread_wait(&h, true, 7000, held, sizeof(held));
	if (held[0] == '\0' || strcmp(held, h.all) == 0) {
		kill_busy(h.cpuset);
		stop(&q.l);
		stop(&h.l);
		cr_assert_fail("the hog is not held (CPUs %s)", held);
	}
	cpus_without(q.all, held, want, sizeof(want));
	/* its samples come every 5 s while it idles: the second one decides */
	for (waited = 0; waited < 40000 && !tasks_on(q.cpuset, want, &n); waited += 100)
		nap_ms(100);
	cr_log_info("hog held to %s; the free one's tasks kept to %s after %d ms", held, want, waited);
	cr_expect(tasks_on(q.cpuset, want, &n) && n >= 1, "the free execution's tasks (%d) kept to CPUs %s", n, want);
	/* a tenant's process that sets its own affinity back to every CPU is
	 * kept again at the next sample (within 5 s while the sandbox idles) */
	char out[256];
	run_in(&q.l, "(taskset -p -c 0-255 $$ >/dev/null 2>&1; sleep 40) >/dev/null 2>&1 & echo started", out,
	       sizeof(out));
	nap_ms(300);
	bool widened = !tasks_on(q.cpuset, want, &n);
	for (waited = 0; waited < 12000 && !tasks_on(q.cpuset, want, &n); waited += 100)
		nap_ms(100);
	cr_log_info("a task that widened itself (seen: %d) kept again after %d ms", widened, waited);
	cr_expect(tasks_on(q.cpuset, want, &n) && n >= 2, "every task (%d), the one that widened itself too, kept to %s",
	          n, want);
	spread_cpus(&q, now, sizeof(now));
	cr_expect_str_eq(now, q.all, "its cpuset stays its parent's (it is not held): %s", now);
	/* the hog's processes end: it is let go, and the free one comes back */
	int killed = kill_busy(h.cpuset);
	waited = spread_wait(&h, false, 30000, now, sizeof(now));
	cr_log_info("the hog's %d busy processes killed: let go after %d ms", killed, waited);
	cr_expect_str_eq(now, h.all, "the hog let go: %s", now);
	for (waited = 0; waited < 30000 && !tasks_on(q.cpuset, q.all, &n); waited += 100)
		nap_ms(100);
	cr_log_info("the free one back on CPUs %s %d ms after", q.all, waited);
	cr_expect(tasks_on(q.cpuset, q.all, &n) && n >= 1, "its tasks (%d) on every CPU again", n);
	stop(&q.l);
	stop(&h.l);
}

/* A held execution whose limit is under half a CPU takes no CPU from the
 * free ones (held limits take at most twice their worth from the rest): a
 * hog of 0.2 CPU held to a CPU is not published as holding it. Fails without
 * the threshold (any held CPU published). */
Test(substrate, a_small_held_limit_takes_no_cpu_from_the_others, .timeout = 90)
{
	struct spread_exec h;
	char held[256], note[512];

	need_spread();
	spread_start(&h, "ks", "sbx-keep-small", "0.2");
	spread_busy(&h, 4, 60);
	spread_wait(&h, true, 7000, held, sizeof(held));
	if (held[0] == '\0' || strcmp(held, h.all) == 0) {
		kill_busy(h.cpuset);
		stop(&h.l);
		cr_assert_fail("the small hog is not held (CPUs %s)", held);
	}
	nap_ms(2500); /* two of its samples publish afresh */
	ssize_t n = getxattr("/sys/fs/cgroup/cpuset", "trusted.spaced.cpus_held", note, sizeof(note) - 1);
	note[n > 0 ? n : 0] = '\0';
	const char *list = strchr(note, ' ');
	cr_log_info("held to %s; published: %s", held, note);
	bool beside = other_held_on(h.cpuset, held);
	bool named = list != NULL && (strcmp(list + 1, held) == 0 || strstr(list + 1, held) != NULL);
	kill_busy(h.cpuset);
	stop(&h.l);
	if (beside)
		cr_skip_test("another execution is held to CPU %s meanwhile (a test beside this one)", held);
	cr_expect(!named, "0.2 CPU held to %s: not published as taking it (%s)", held, note);
}

/* The parent of the stand-ins of another worker's executions (beside the
 * test's own parent: "spaced.room-other"). */
#define OTHER_PARENT "spaced.room-other"

/* A held execution's stand-in, beside the execution whose cgroups are in
 * cpuset_dir and cpu_dir (or, other, in another worker's parent beside its
 * own): cgroups "spaced-<this pid>-<n>" held to CPU cpu under a limit of
 * milli thousandths of a CPU (they hold no task). */
static void stand_in(const char *cpuset_dir, const char *cpu_dir, int n, int cpu, int milli, bool other,
                     char made[2][700])
{
	char parent[600], path[800], v[64];

	for (int h = 0; h < 2; h++) {
		snprintf(parent, sizeof(parent), "%.500s", h == 0 ? cpuset_dir : cpu_dir);
		*strrchr(parent, '/') = '\0';
		if (other) {
			char mine[600];

			snprintf(mine, sizeof(mine), "%s", parent);
			*strrchr(parent, '/') = '\0';
			strcat(parent, "/" OTHER_PARENT);
			cr_assert(mkdir(parent, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", parent, strerror(errno));
			for (int f = 0; h == 0 && f < 2; f++) {
				const char *file = f == 0 ? "cpuset.mems" : "cpuset.cpus";

				snprintf(path, sizeof(path), "%s/%s", mine, file);
				line_of(path, v, sizeof(v));
				snprintf(path, sizeof(path), "%s/%s", parent, file);
				cr_assert_eq(sub_write_file(path, v), 0, "%s", path);
			}
		}
		snprintf(made[h], 700, "%s/spaced-%d-%d", parent, (int)getpid(), n);
		cr_assert(mkdir(made[h], 0755) == 0 || errno == EEXIST, "mkdir %s: %s", made[h], strerror(errno));
	}
	snprintf(path, sizeof(path), "%s/cpuset.mems", cpuset_dir);
	line_of(path, v, sizeof(v));
	snprintf(path, sizeof(path), "%s/cpuset.mems", made[0]);
	cr_assert_eq(sub_write_file(path, v), 0);
	snprintf(path, sizeof(path), "%s/cpuset.cpus", made[0]);
	snprintf(v, sizeof(v), "%d", cpu);
	cr_assert_eq(sub_write_file(path, v), 0);
	snprintf(path, sizeof(path), "%s/cpu.cfs_period_us", made[1]);
	cr_assert_eq(sub_write_file(path, "100000"), 0);
	snprintf(path, sizeof(path), "%s/cpu.cfs_quota_us", made[1]);
	snprintf(v, sizeof(v), "%d", milli * 100);
	cr_assert_eq(sub_write_file(path, v), 0);
}

/* The room rule: a CPU never holds more than one CPU's worth of limits (two
 * held executions on one CPU beyond that would each get less than its limit
 * gives it). Beside stand-ins of held executions (0.9 CPU each), an
 * execution under --cpus 0.2 with four busy processes (throttled whatever
 * else the host runs):
 *  - with a stand-in on every CPU but the last (the first of them another
 *    worker's: every worker's held executions count), it is held to the last
 *    one (not the lowest: no room there);
 *  - with one on every CPU, a second such execution finds no room: its quota
 *    throttles it, and it keeps every CPU. */
Test(substrate, held_executions_never_share_a_cpu_beyond_its_worth, .timeout = 90)
{
	struct spread_exec a, b;
	char now[256], last[24], st[600], made[4][2][700];
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int nmade = 0, ms;

	need_spread();
	if (ncpu > 4)
		cr_skip_test("made for 2 to 4 CPUs (%ld here)", ncpu);
	spread_start(&a, "a", "sbx-room-a", "0.2");
	for (int c = 0; c < ncpu - 1; c++)
		stand_in(a.cpuset, a.cpu, 9000 + c, c, 900, c == 0, made[nmade++]);
	spread_busy(&a, 4, 20);
	ms = spread_wait(&a, true, 7000, now, sizeof(now));
	cr_log_info("held after %d ms to CPUs %s (of %s)", ms, now, a.all);
	snprintf(last, sizeof(last), "%ld", ncpu - 1);
	cr_expect_str_eq(now, last, "held to the one CPU with room for 0.2 (the last), not %s", now);
	/* every CPU taken now: the last by execution a */
	spread_start(&b, "b", "sbx-room-b", "0.2");
	stand_in(b.cpuset, b.cpu, 9000 + (int)ncpu - 1, (int)ncpu - 1, 900, false, made[nmade++]);
	snprintf(st, sizeof(st), "%s/cpu.stat", b.cpu);
	long thr0 = read_key(st, "nr_throttled");
	spread_busy(&b, 4, 20);
	nap_ms(4000); /* four samples, every one throttled */
	spread_cpus(&b, now, sizeof(now));
	long thr = read_key(st, "nr_throttled");
	cr_log_info("b: CPUs %s, throttled in %ld periods meanwhile", now, thr - thr0);
	cr_expect_geq(thr - thr0, 10, "b's quota throttled it");
	cr_expect_str_eq(now, b.all, "b found no room: it keeps every CPU, not %s", now);
	stop(&b.l);
	stop(&a.l);
	for (int k = 0; k < nmade; k++)
		for (int h = 0; h < 2; h++) {
			rmdir(made[k][h]);
			*strrchr(made[k][h], '/') = '\0';
			if (strstr(made[k][h], OTHER_PARENT) != NULL)
				rmdir(made[k][h]);
		}
}

/* Waits (up to ~20 s) for the counter file to show a value other than `old`. */
static long wait_change(const char *path, long old)
{
	for (int i = 0; i < 2000; i++) {
		long v = read_counter(path);

		if (v >= 0 && v != old)
			return v;
		nap_ms(10);
	}
	return old;
}

Test(substrate, freeze_stops_a_counter)
{
	char id[256], out[1024], counter[256], reply[1024];
	const char *extra[] = { "--identity", id, NULL };
	struct launcher l;
	long a, b, c;

	need_sandbox();
	idtext(id, sizeof(id), "sbx-frz", 1);
	start(&l, "x", extra, true);
	cr_assert_eq(run_in(&l, "(i=0; while :; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; "
	                        "sleep 0.01; done) >/dev/null 2>&1 </dev/null & echo started",
	                    out, sizeof(out)), 0, "%s", out);
	snprintf(counter, sizeof(counter), "%s/upper/root/tmp/c", l.state);
	a = wait_change(counter, -1);
	cr_assert_geq(a, 0, "the counter never started");
	a = wait_change(counter, a);
	ctl_ok(&l, "PAUSE");
	ctl(&l, "STATUS", reply, sizeof(reply));
	cr_assert(strstr(reply, "paused=1") != NULL, "%s", reply);
	b = read_counter(counter);
	cr_assert_geq(b, 0, "no counter value while frozen");
	nap_ms(500); /* a running counter moves ~50 times in this time */
	c = read_counter(counter);
	cr_assert_eq(b, c, "the counter moved while frozen (%ld -> %ld)", b, c);
	ctl_ok(&l, "THAW");
	c = wait_change(counter, b);
	cr_assert_neq(c, b, "the counter did not resume after thaw");
	stop(&l);
}

Test(substrate, snapshot_restore_new_execution) /* I2 */
{
	char id1[256], id2[256], idbad[256], out[4096], snap[128], got[512], reply[1024];
	/* root mapped to root so the test can also delete a base file (a whiteout) */
	const char *extra1[] = { "--identity", id1, "--uid-base", "0", NULL };
	const char *extra2[] = { "--identity", id2, "--restore", snap, "--uid-base", "0", NULL };
	struct launcher l1, l2;

	need_sandbox();
	idtext(id1, sizeof(id1), "sbx-snap", 7);
	idtext(id2, sizeof(id2), "sbx-snap", 8);
	start(&l1, "one", extra1, true);
	cr_assert_eq(run_in(&l1, "mkdir -p /root/proj && echo hello-snapshot > /root/proj/data.txt && "
	                         "chmod 0640 /root/proj/data.txt && ln -s proj/data.txt /root/link && "
	                         "ln /root/proj/data.txt /root/hard && mkfifo /root/fifo && "
	                         /* an opaque directory: the base's /etc/apt replaced by a new one */
	                         "rm -rf /etc/apt && mkdir /etc/apt && echo n > /etc/apt/only && "
	                         "echo scratch > /tmp/scratch && rm -f /etc/motd",
	                     out, sizeof(out)), 0, "%s", out);
	snprintf(snap, sizeof(snap), "%s/snap", dir);
	/* a snapshot needs a paused execution */
	ctl(&l1, "SNAPSHOT /nonexistent-unused", reply, sizeof(reply));
	cr_assert(strncmp(reply, "ERR", 3) == 0, "%s", reply);
	ctl_ok(&l1, "PAUSE");
	{
		char cmd[200];

		snprintf(cmd, sizeof(cmd), "SNAPSHOT %s", snap);
		ctl_ok(&l1, cmd);
	}
	ctl_ok(&l1, "THAW");
	stop(&l1);

	/* restore: same sandbox, older or equal generation refused, other sandbox refused */
	for (int k = 0; k < 2; k++) {
		struct launcher lb;
		const char *extrab[] = { "--identity", idbad, "--restore", snap, "--uid-base", "0", NULL };
		int st;

		if (k == 0)
			idtext(idbad, sizeof(idbad), "sbx-snap", 7);
		else
			idtext(idbad, sizeof(idbad), "sbx-other", 9);
		start(&lb, k == 0 ? "bad0" : "bad1", extrab, false);
		cr_assert_eq(waitpid(lb.pid, &st, 0), lb.pid);
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "restore %d was accepted", k);
		close(lb.out);
	}

	start(&l2, "two", extra2, true);
	cr_assert_eq(run_in(&l2, "cat /root/proj/data.txt; stat -c %a /root/proj/data.txt; "
	                         "readlink /root/link; cat /tmp/scratch; test -e /etc/motd && echo MOTD || echo no-motd; "
	                         "test /root/hard -ef /root/proj/data.txt && echo linked; test -p /root/fifo && echo fifo; "
	                         "ls /etc/apt",
	                     out, sizeof(out)), 0, "%s", out);
	cr_assert_str_eq(out, "hello-snapshot\n640\nproj/data.txt\nscratch\nno-motd\nlinked\nfifo\nonly\n");
	/* a new execution: the guest reports the new generation */
	cr_assert_eq(guest_identity(&l2, 2, got, sizeof(got)), 0);
	cr_assert_str_eq(got, id2);
	cr_assert_str_neq(got, id1);
	stop(&l2);
}

Test(substrate, identity_after_start) /* warm pool: IDENTITY message */
{
	char id[256], got[512], cmd[300], reply[1024], line[128];
	struct launcher l;

	struct pollfd p;
	int early;

	need_sandbox();
	idtext(id, sizeof(id), "sbx-warm", 3);
	start(&l, "x", NULL, false);
	/* a pooled execution reports once it can be claimed (POOLED), READY only
	 * once it has an identity */
	read_line(l.out, line, sizeof(line), 20000);
	cr_assert(strncmp(line, "POOLED ", 7) == 0, "%s", line);
	ctl(&l, "STATUS", reply, sizeof(reply));
	cr_assert(strstr(reply, "identity=-") != NULL, "%s", reply);
	cr_assert(strstr(reply, "ready=0") != NULL, "%s", reply);
	/* a transport connection made before the claim is not served … */
	early = transport_connect(&l, 3);
	cr_assert_geq(early, 0);
	p = (struct pollfd){ .fd = early, .events = POLLIN };
	cr_assert_eq(poll(&p, 1, 200), 0, "a pooled execution answered before it had an identity");
	snprintf(cmd, sizeof(cmd), "IDENTITY %s", id);
	ctl_ok(&l, cmd);
	ctl(&l, cmd, reply, sizeof(reply)); /* only once */
	cr_assert(strncmp(reply, "ERR", 3) == 0, "%s", reply);
	/* … and once claimed it reaches a guest that already has the identity */
	cr_assert_eq(transport_identity(early, got, sizeof(got)), 0);
	cr_assert_str_eq(got, id);
	read_line(l.out, line, sizeof(line), 20000);
	cr_assert(strncmp(line, "READY", 5) == 0, "%s", line);
	cr_assert_eq(guest_identity(&l, 3, got, sizeof(got)), 0);
	cr_assert_str_eq(got, id);
	stop(&l);
}

Test(substrate, transport_waits_while_paused)
{
	char id[256], got[512];
	const char *extra[] = { "--identity", id, NULL };
	struct launcher l;
	struct pollfd p;
	int fd;

	need_sandbox();
	idtext(id, sizeof(id), "sbx-pz", 1);
	start(&l, "x", extra, true);
	ctl_ok(&l, "PAUSE");
	fd = transport_connect(&l, 7);
	cr_assert_geq(fd, 0);
	/* frozen guest: the handshake is not answered (the client waits) … */
	p = (struct pollfd){ .fd = fd, .events = POLLIN };
	cr_assert_eq(poll(&p, 1, 300), 0, "answered while paused");
	/* … and the supervisor still obeys its control socket */
	ctl_ok(&l, "STATUS");
	ctl_ok(&l, "THAW");
	cr_assert_eq(transport_identity(fd, got, sizeof(got)), 0);
	cr_assert_str_eq(got, id);
	stop(&l);
}

Test(substrate, template_base)
{
	char id[256], out[4096], base[128], cmd[2048], p[256];
	const char *extra[] = { "--identity", id, "--base", base, NULL };
	struct launcher l;
	FILE *f;

	need_sandbox();
	idtext(id, sizeof(id), "sbx-base", 1);
	/* a minimal template: a shell, cat, the libraries the guest and they need,
	 * owned by the execution's root user (host uid 100000) as a template should be */
	snprintf(base, sizeof(base), "%s/base", dir);
	snprintf(cmd, sizeof(cmd),
	         "set -e; B=%s; mkdir -p $B/usr/bin $B/usr/lib $B/usr/lib64 $B/etc; "
	         "ln -s usr/bin $B/bin; ln -s usr/lib $B/lib; ln -s usr/lib64 $B/lib64; "
	         "for f in /usr/bin/dash /usr/bin/cat /usr/bin/ls %s; do "
	         "  for l in $(ldd $f | grep -o '/[^ ]*'); do mkdir -p $B$(dirname $l); cp -L $l $B$l; done; "
	         "done; cp /usr/bin/dash $B/usr/bin/sh; cp /usr/bin/cat /usr/bin/ls $B/usr/bin/; "
	         "echo base > $B/etc/marker; chown -R 100000:100000 $B",
	         base, guest_bin());
	cr_assert_eq(system(cmd), 0, "building the template failed");
	start(&l, "x", extra, true);
	cr_assert_eq(run_in(&l, "cat /etc/marker && echo changed > /etc/marker && echo n > /newfile && ls /",
	                    out, sizeof(out)), 0, "%s", out);
	cr_assert(strncmp(out, "base\n", 5) == 0, "%s", out);
	/* the template is untouched, the changes are in the upper layer */
	snprintf(p, sizeof(p), "%s/etc/marker", base);
	f = fopen(p, "r");
	cr_assert_not_null(f);
	cr_assert_not_null(fgets(out, sizeof(out), f));
	fclose(f);
	cr_assert_str_eq(out, "base\n");
	snprintf(p, sizeof(p), "%s/newfile", base);
	cr_assert_neq(access(p, F_OK), 0);
	snprintf(p, sizeof(p), "%s/upper/root/newfile", l.state);
	cr_assert_eq(access(p, F_OK), 0);
	snprintf(p, sizeof(p), "%s/upper/root/etc/marker", l.state);
	cr_assert_eq(access(p, F_OK), 0);
	/* nothing of the host outside the template is visible */
	cr_assert_neq(run_in(&l, "test -e /usr/bin/python3", out, sizeof(out)), 0);
	stop(&l);
}

/* A template (owners in the canonical range 100000 + k) seen through an
 * idmapped mount by executions of two different uid ranges at once: root
 * inside owns the template's files in both, the files on disk never change
 * owner, and a snapshot names the template it was taken on. */
Test(substrate, template_idmapped)
{
	char id[256], id2[256], id3[256], out[4096], tmpl[128], cmd[2048], p[256], snap[128], reply[256];
	const char *a[] = { "--identity", id, "--template", tmpl, "--uid-base", "1073807360", NULL };
	const char *b[] = { "--identity", id2, "--template", tmpl, "--uid-base", "1073872896", NULL };
	struct launcher la, lb, lc;
	struct stat sb;

	need_sandbox();
	idtext(id, sizeof(id), "sbx-ta", 1);
	idtext(id2, sizeof(id2), "sbx-tb", 1);
	snprintf(tmpl, sizeof(tmpl), "%s/0123abcd", dir);
	snprintf(cmd, sizeof(cmd),
	         "set -e; B=%s; mkdir -p $B/usr/bin $B/usr/lib $B/usr/lib64 $B/etc $B/home/app; "
	         "ln -s usr/bin $B/bin; ln -s usr/lib $B/lib; ln -s usr/lib64 $B/lib64; "
	         "for f in /usr/bin/dash /usr/bin/cat /usr/bin/ls /usr/bin/stat %s; do "
	         "  for l in $(ldd $f | grep -o '/[^ ]*'); do mkdir -p $B$(dirname $l); cp -L $l $B$l; done; "
	         "done; cp /usr/bin/dash $B/usr/bin/sh; cp /usr/bin/cat /usr/bin/ls /usr/bin/stat $B/usr/bin/; "
	         "echo tmpl > $B/etc/marker; echo app > $B/home/app/f; chown -R 100000:100000 $B; "
	         "chown -R 101000:101000 $B/home/app",
	         tmpl, guest_bin());
	cr_assert_eq(system(cmd), 0, "building the template failed");
	start(&la, "a", a, true);
	start(&lb, "b", b, true);
	for (int i = 0; i < 2; i++) {
		struct launcher *l = i ? &lb : &la;
		cr_assert_eq(run_in(l, "stat -c '%u:%g %n' /etc/marker /home/app/f /usr/bin/cat && cat /etc/marker && "
		                       "echo mine > /etc/marker && echo mine > /home/app/f && cat /etc/marker",
		                    out, sizeof(out)), 0, "%s", out);
		cr_assert_str_eq(out, "0:0 /etc/marker\n1000:1000 /home/app/f\n0:0 /usr/bin/cat\ntmpl\nmine\n");
	}
	/* the template itself: unchanged, canonical owners */
	snprintf(p, sizeof(p), "%s/etc/marker", tmpl);
	cr_assert_eq(stat(p, &sb), 0);
	cr_assert_eq(sb.st_uid, 100000u);
	cr_assert_eq(sb.st_size, 5);
	/* the upper layer holds the copies, in the execution's own range */
	snprintf(p, sizeof(p), "%s/upper/root/home/app/f", lb.state);
	cr_assert_eq(stat(p, &sb), 0);
	cr_assert_eq(sb.st_uid, 1073872896u + 1000u);
	/* a snapshot names the template; a restore onto another template is refused */
	ctl_ok(&la, "PAUSE");
	snprintf(snap, sizeof(snap), "%s/snap", dir);
	snprintf(cmd, sizeof(cmd), "SNAPSHOT %s", snap);
	ctl_ok(&la, cmd);
	snprintf(cmd, sizeof(cmd), "grep -qx 'base=template:0123abcd' %s/meta", snap);
	cr_assert_eq(system(cmd), 0, "meta names the template");
	stop(&la);
	stop(&lb);
	idtext(id3, sizeof(id3), "sbx-ta", 2);
	snprintf(cmd, sizeof(cmd), "cp -a %s %s/other", tmpl, dir);
	cr_assert_eq(system(cmd), 0);
	char other[160];
	snprintf(other, sizeof(other), "%s/other", dir);
	const char *c[] = { "--identity", id3, "--template", other, "--restore", snap, NULL };
	start(&lc, "c", c, false);
	int st;
	cr_assert_eq(waitpid(lc.pid, &st, 0), lc.pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "a restore onto another template was accepted");
	const char *d[] = { "--identity", id3, "--template", tmpl, "--restore", snap, NULL };
	start(&lc, "d", d, true);
	cr_assert_eq(run_in(&lc, "cat /etc/marker", out, sizeof(out)), 0);
	cr_assert_str_eq(out, "mine\n");
	ctl(&lc, "STATUS", reply, sizeof(reply));
	stop(&lc);
}

Test(substrate, earlier_layer_not_taken_over) /* I2: start empty or from a snapshot */
{
	char id[256], out[1024], p[256];
	const char *extra1[] = { "--identity", id, "--keep-state", NULL };
	const char *extra2[] = { "--identity", id, NULL };
	struct launcher l, l2;
	int st;

	need_sandbox();
	idtext(id, sizeof(id), "sbx-keep", 1);
	start(&l, "x", extra1, true);
	cr_assert_eq(run_in(&l, "echo kept > /root/f", out, sizeof(out)), 0, "%s", out);
	stop(&l);
	snprintf(p, sizeof(p), "%s/upper/root/root/f", l.state);
	cr_assert_eq(access(p, F_OK), 0, "--keep-state removed the layer");
	/* a new execution in the same state directory would inherit the layer */
	start(&l2, "x", extra2, false);
	cr_assert_eq(waitpid(l2.pid, &st, 0), l2.pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "the earlier layer was taken over");
	close(l2.out);
	cr_assert_eq(access(p, F_OK), 0, "the refused start removed the earlier layer");
}

Test(substrate, guest_output_is_capped) /* the host's disk is not the guest's to fill */
{
	char id[256], p[256];
	const char *extra[] = { "--identity", id, NULL };
	struct launcher l;
	struct stat st;

	need_sandbox();
	idtext(id, sizeof(id), "sbx-log", 1);
	/* a guest that writes 24 MiB to its stdout before READY */
	start_with(&l, "x", NOISY_GUEST, extra, true);
	stop(&l);
	snprintf(p, sizeof(p), "%s/guest.log", l.state);
	cr_assert_eq(stat(p, &st), 0);
	cr_log_info("guest.log: %lld bytes", (long long)st.st_size);
	cr_assert_leq(st.st_size, (8 << 20) + 4096, "guest.log grew to %lld bytes", (long long)st.st_size);
	cr_assert_geq(st.st_size, 8 << 20);
}

/* The writable layer lives on a disk of its own (a sparse ext4 image mounted
 * only in the execution's mount namespace): writes stop at its size with
 * ENOSPC, within 5 %; it is a budget apart from memory (a 32 MiB memory limit
 * does not stop 64 MiB of files, nothing is OOM-killed); the host's
 * filesystem holds only the blocks written; nothing stays mounted or attached
 * on the host (issue 11). */
Test(substrate, disk_is_its_own_budget_apart_from_memory)
{
	char id[256], out[4096], p[256], snapcmd[256];
	const char *extra[] = { "--identity", id, "--disk", "64M", "--memory", "32M", NULL };
	const long disk = 64L << 20;
	struct launcher l;
	struct stat st, fs;
	long size, dfsize;
	char *q;

	need_sandbox();
	idtext(id, sizeof(id), "sbx-disk", 1);
	start(&l, "x", extra, true);
	/* nothing of the disk is mounted on the host: STATE/fs is a plain directory there */
	snprintf(p, sizeof(p), "%s/fs", l.state);
	cr_assert_eq(stat(l.state, &st), 0);
	cr_assert_eq(stat(p, &fs), 0);
	cr_assert_eq(st.st_dev, fs.st_dev, "the disk is mounted on the host");
	snprintf(p, sizeof(p), "%s/disk.img", l.state);
	cr_assert_eq(stat(p, &fs), 0);
	cr_assert_lt((long)fs.st_blocks * 512, 8L << 20, "an empty disk takes %ld bytes of the host's", (long)fs.st_blocks * 512);
	/* inside, / is the execution's disk: df shows its size */
	cr_assert_eq(run_in(&l, "df -B1 --output=avail / | tail -n 1", out, sizeof(out)), 0, "%s", out);
	dfsize = atol(out);
	cr_assert(dfsize > disk * 95 / 100 && dfsize < disk * 105 / 100, "df shows %ld bytes free of a %ld disk", dfsize, disk);
	/* 128 MiB into the 64 MiB disk: ENOSPC at the disk's size, not an OOM kill at 32 MiB */
	/* synced: the blocks reach the image through the loop device, not at once */
	(void)run_in(&l, "head -c 134217728 /dev/zero > /root/big; echo status=$?; stat -c size=%s /root/big; sync", out,
	             sizeof(out));
	cr_log_info("%s", out);
	cr_assert(strstr(out, "No space left") != NULL, "%s", out);
	cr_assert(strstr(out, "status=1") != NULL, "the writer did not end with its own error: %s", out);
	q = strstr(out, "size=");
	cr_assert_not_null(q, "%s", out);
	size = atol(q + 5);
	cr_assert(size > disk * 95 / 100 && size < disk * 105 / 100, "wrote %ld bytes into a %ld disk", size, disk);
	snprintf(p, sizeof(p), "%s/disk.img", l.state);
	cr_assert_eq(stat(p, &fs), 0);
	cr_assert_gt((long)fs.st_blocks * 512, disk * 90 / 100, "the written blocks are not in the image");
	/* deleted files give their blocks back to the host (discard punches holes) */
	cr_assert_eq(run_in(&l, "rm /root/big && echo small > /root/small && sync", out, sizeof(out)), 0, "%s", out);
	cr_assert_eq(stat(p, &fs), 0);
	cr_assert_lt((long)fs.st_blocks * 512, 16L << 20, "the image still holds %ld bytes", (long)fs.st_blocks * 512);
	/* snapshots read the layer from the disk */
	ctl_ok(&l, "PAUSE");
	snprintf(snapcmd, sizeof(snapcmd), "SNAPSHOT %s/snap", dir);
	ctl_ok(&l, snapcmd);
	ctl_ok(&l, "THAW");
	stop(&l);
	snprintf(p, sizeof(p), "%s/snap/upper/root/root/small", dir);
	cr_assert_eq(access(p, F_OK), 0);
	/* stopped: the image is gone, no loop device holds it */
	snprintf(p, sizeof(p), "%s/disk.img", l.state);
	cr_assert_neq(access(p, F_OK), 0, "STATE/disk.img left behind");
	snprintf(snapcmd, sizeof(snapcmd), "losetup -a | grep -c '%s' || true", l.state);
	FILE *f = popen(snapcmd, "r");
	cr_assert_not_null(f);
	cr_assert_not_null(fgets(out, sizeof(out), f));
	pclose(f);
	for (int i = 0; i < 100 && atoi(out) != 0; i++) {
		usleep(20000);
		f = popen(snapcmd, "r");
		if (f && fgets(out, sizeof(out), f) == NULL)
			out[0] = '0';
		if (f)
			pclose(f);
	}
	cr_assert_eq(atoi(out), 0, "a loop device still holds the execution's disk");
}

/* A sparse file costs a snapshot what it holds, not the size it claims:
 * holes stay holes in the copy (issue 11). */
Test(substrate, snapshot_keeps_holes)
{
	char id[256], out[4096], p[256], snapcmd[256];
	const char *extra[] = { "--identity", id, "--disk", "64M", NULL };
	struct launcher l;
	struct stat st;

	need_sandbox();
	idtext(id, sizeof(id), "sbx-sparse", 1);
	start(&l, "x", extra, true);
	cr_assert_eq(run_in(&l, "truncate -s 3G /root/sparse && printf end >> /root/sparse", out, sizeof(out)), 0, "%s", out);
	ctl_ok(&l, "PAUSE");
	snprintf(snapcmd, sizeof(snapcmd), "SNAPSHOT %s/snap", dir);
	ctl_ok(&l, snapcmd);
	stop(&l);
	snprintf(p, sizeof(p), "%s/snap/upper/root/root/sparse", dir);
	cr_assert_eq(stat(p, &st), 0);
	cr_assert_eq(st.st_size, (3L << 30) + 3);
	cr_assert_lt((long)st.st_blocks * 512, 1L << 20, "the snapshot holds %ld bytes", (long)st.st_blocks * 512);
	int fd = open(p, O_RDONLY);
	cr_assert_geq(fd, 0);
	cr_assert_eq(pread(fd, out, 3, 3L << 30), 3);
	close(fd);
	cr_assert_eq(memcmp(out, "end", 3), 0);
}

/* A tree of depth directories a/a/a/... under top. */
static void deep_tree(const char *top, int depth)
{
	cr_assert_eq(mkdir(top, 0700), 0);
	int fd = open(top, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	for (int i = 0; i < depth; i++) {
		cr_assert_eq(mkdirat(fd, "a", 0700), 0);
		int next = openat(fd, "a", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		cr_assert_geq(next, 0);
		close(fd);
		fd = next;
	}
	close(fd);
}

/* the snapshot's copy of a tenant's tree: directories deeper than a snapshot may
 * hold are refused with a reason (2040 of them took the root launcher's stack:
 * SIGSEGV, the sandbox frozen and its disk attached until removed) */
Test(copy_tree, directories_deeper_than_a_snapshot_holds_are_refused_not_a_crash, .timeout = 60)
{
	char top[] = "/tmp/spaced-copy-XXXXXX", src[64], dst[64], why[512] = "", cmd[96];
	cr_assert_not_null(mkdtemp(top));
	snprintf(src, sizeof src, "%s/deep", top);
	deep_tree(src, 2040);
	snprintf(dst, sizeof dst, "%s/copy", top);
	cr_expect_eq(spaced_sub_copy_tree(src, dst, NULL, 0, why, sizeof why), SPACED_ETOOBIG);
	cr_expect_not_null(strstr(why, "deeper than"), "%s", why);
	/* one within the bound is copied whole */
	snprintf(src, sizeof src, "%s/ok", top);
	deep_tree(src, SPACED_TREEHASH_DEPTH - 1);
	snprintf(dst, sizeof dst, "%s/okcopy", top);
	cr_expect_eq(spaced_sub_copy_tree(src, dst, NULL, 0, why, sizeof why), 0, "%s", why);
	struct stat st;
	char leaf[2 * SPACED_TREEHASH_DEPTH + 64];
	int n = snprintf(leaf, sizeof leaf, "%s", dst);
	for (int i = 0; i < SPACED_TREEHASH_DEPTH - 1; i++)
		n += snprintf(leaf + n, sizeof leaf - (size_t)n, "/a");
	cr_expect_eq(stat(leaf, &st), 0, "the deepest directory was copied");
	snprintf(cmd, sizeof cmd, "rm -rf %s", top);
	cr_assert_eq(system(cmd), 0);
}

/* The first line of a small file, or "" (request_cpu tests). */
static void first_line(const char *path, char *out, size_t n)
{
	FILE *f = fopen(path, "re");

	out[0] = '\0';
	if (f != NULL && fgets(out, (int)n, f) != NULL)
		out[strcspn(out, "\n")] = '\0';
	if (f != NULL)
		fclose(f);
}

/* This process's cgroup in the cgroup v1 hierarchy of controller ctrl
 * ("/" at the root, "" when it has none). */
static void v1_own(const char *ctrl, char *out, size_t n)
{
	char line[512], key[64];
	FILE *f = fopen("/proc/self/cgroup", "re");

	out[0] = '\0';
	snprintf(key, sizeof key, ":%s:", ctrl);
	while (f != NULL && fgets(line, sizeof line, f) != NULL) {
		const char *k = strstr(line, key);
		if (k != NULL)
			snprintf(out, n, "%s", k + strlen(key));
	}
	if (f != NULL)
		fclose(f);
	out[strcspn(out, "\n")] = '\0';
}

/* spaced-node's request path joins "<parent>+request" in the cpu (and
 * cpuacct) hierarchies, below its own cgroup there, its weight and ceiling
 * written; the cgroup is removed once empty. In a child, which then leaves it. */
Test(request_cpu, joins_its_cgroup_with_weight_and_ceiling)
{
	char own_cpu[400], own_acct[400], cpu[600], acct[600], want_cpu[700], want_acct[700];
	char p[700], v[128];
	int st = 0;

	if (geteuid() != 0)
		cr_skip_test("needs root (cgroups)");
	if (access("/sys/fs/cgroup/cpu/cpu.shares", F_OK) != 0 || access("/sys/fs/cgroup/cpuacct/cpuacct.usage", F_OK) != 0)
		cr_skip_test("no cgroup v1 cpu and cpuacct hierarchies of their own (the cgroup2 case: below)");
	v1_own("cpu", own_cpu, sizeof own_cpu);
	v1_own("cpuacct", own_acct, sizeof own_acct);
	if (strcmp(own_cpu, "/") == 0)
		own_cpu[0] = '\0';
	if (strcmp(own_acct, "/") == 0)
		own_acct[0] = '\0';
	snprintf(cpu, sizeof cpu, "/sys/fs/cgroup/cpu%s/spaced.rq-test+request", own_cpu);
	snprintf(acct, sizeof acct, "/sys/fs/cgroup/cpuacct%s/spaced.rq-test+request", own_acct);
	snprintf(want_cpu, sizeof want_cpu, ":cpu:%s/spaced.rq-test+request\n", own_cpu);
	snprintf(want_acct, sizeof want_acct, ":cpuacct:%s/spaced.rq-test+request\n", own_acct);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		char why[256] = "", line[512];
		setenv("SPACED_CGROUP_PARENT", "spaced.rq-test", 1);
		if (spaced_sub_request_cpu_join(3, 250, why, sizeof why) != 0) {
			fprintf(stderr, "join: %s\n", why);
			_exit(1);
		}
		FILE *f = fopen("/proc/self/cgroup", "re");
		int in = 0;
		while (f != NULL && fgets(line, sizeof line, f) != NULL)
			in += strstr(line, want_cpu) != NULL || strstr(line, want_acct) != NULL;
		if (f != NULL)
			fclose(f);
		/* a second join (a restarted group) rewrites the settings */
		_exit(in == 2 && spaced_sub_request_cpu_join(3, 250, why, sizeof why) == 0 ? 0 : 2);
	}
	snprintf(p, sizeof p, "%s/cpu.shares", cpu);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child joined both hierarchies: status 0x%x", st);
	first_line(p, v, sizeof v);
	cr_expect_str_eq(v, "3072", "weight 3 times 1024");
	snprintf(p, sizeof p, "%s/cpu.cfs_period_us", cpu);
	first_line(p, v, sizeof v);
	cr_expect_str_eq(v, "10000");
	snprintf(p, sizeof p, "%s/cpu.cfs_quota_us", cpu);
	first_line(p, v, sizeof v);
	cr_expect_str_eq(v, "2500", "0.25 CPU of a 10 ms period");
	setenv("SPACED_CGROUP_PARENT", "spaced.rq-test", 1);
	spaced_sub_request_cpu_remove();
	unsetenv("SPACED_CGROUP_PARENT");
	cr_expect_neq(access(cpu, F_OK), 0, "removed once empty");
	cr_expect_neq(access(acct, F_OK), 0);
}

/* This process's (pid 0) or pid's cgroup in the v1 cpu hierarchy, or "". */
static void cpu_cgroup_of(pid_t pid, char *out, size_t n)
{
	char path[64], line[512];
	FILE *f;

	snprintf(path, sizeof path, pid ? "/proc/%d/cgroup" : "/proc/self/cgroup", (int)pid);
	out[0] = '\0';
	if ((f = fopen(path, "re")) == NULL)
		return;
	while (fgets(line, sizeof line, f) != NULL) {
		char *c = strstr(line, ":cpu:");
		if (c != NULL) {
			snprintf(out, n, "%s", c + 5);
			out[strcspn(out, "\n")] = '\0';
		}
	}
	fclose(f);
}

/* A warm pool's starts run in "<parent>+background" (cpu.shares 32); what a
 * process there makes (its execution's cgroups) goes beside it, where a
 * foreground process's would, never below it; leave() moves a process to the
 * cgroup holding the background one; the cgroup is removed once empty. */
Test(background_cpu, joins_makes_beside_and_leaves)
{
	const char *bg = "/sys/fs/cgroup/cpu/spaced.bg-test+background";
	char p[256], v[128];
	int st = 0;

	if (geteuid() != 0)
		cr_skip_test("needs root (cgroups)");
	if (access("/sys/fs/cgroup/cpu/cpu.shares", F_OK) != 0)
		cr_skip_test("no cgroup v1 cpu hierarchy of its own");
	char own[256];
	cpu_cgroup_of(0, own, sizeof own);
	if (strcmp(own, "/") != 0)
		cr_skip_test("this test runs in the cpu hierarchy's root only (here: %s)", own);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		char why[256] = "", cg_now[256], home[300];
		struct sub_cgroup cg;
		setenv("SPACED_CGROUP_PARENT", "spaced.bg-test", 1);
		if (spaced_sub_background_cpu_join(why, sizeof why) != 0) {
			fprintf(stderr, "join: %s\n", why);
			_exit(1);
		}
		cpu_cgroup_of(0, cg_now, sizeof cg_now);
		if (strcmp(cg_now, "/spaced.bg-test+background") != 0) {
			fprintf(stderr, "in %s\n", cg_now);
			_exit(2);
		}
		/* an execution's cgroup made from here: beside, not below */
		if (sub_cgroup_create(&cg, "bg-exec", NULL, why, sizeof why) != 0) {
			fprintf(stderr, "create: %s\n", why);
			_exit(3);
		}
		int made_beside = strcmp(cg.cpu, "/sys/fs/cgroup/cpu/spaced.bg-test/bg-exec") == 0;
		if (!made_beside)
			fprintf(stderr, "made %s\n", cg.cpu);
		sub_cgroup_remove(&cg);
		if (!made_beside)
			_exit(4);
		/* a process started from here, once it serves in the foreground */
		pid_t kid = fork();
		if (kid == 0) {
			pause();
			_exit(0);
		}
		cpu_cgroup_of(kid, cg_now, sizeof cg_now);
		int was_bg = strcmp(cg_now, "/spaced.bg-test+background") == 0;
		int left = spaced_sub_background_cpu_leave(kid) == 0;
		cpu_cgroup_of(kid, cg_now, sizeof cg_now);
		int home_ok = spaced_sub_background_cpu_home(home, sizeof home) == 0 &&
		              strcmp(home, "/sys/fs/cgroup/cpu/cgroup.procs") == 0;
		kill(kid, SIGKILL);
		waitpid(kid, NULL, 0);
		if (!was_bg || !left || strcmp(cg_now, "/") != 0 || !home_ok) {
			fprintf(stderr, "kid was_bg %d left %d now %s home %s\n", was_bg, left, cg_now, home);
			_exit(5);
		}
		_exit(0);
	}
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "joined, made beside, left: status 0x%x", st);
	snprintf(p, sizeof p, "%s/cpu.shares", bg);
	first_line(p, v, sizeof v);
	cr_expect_str_eq(v, "32", "weighed at 1/32 of 1024");
	cr_expect_neq(access("/sys/fs/cgroup/cpu/spaced.bg-test+background/spaced.bg-test", F_OK), 0,
	              "no executions' parent below the background cgroup");
	setenv("SPACED_CGROUP_PARENT", "spaced.bg-test", 1);
	spaced_sub_background_cpu_remove();
	unsetenv("SPACED_CGROUP_PARENT");
	cr_expect_neq(access(bg, F_OK), 0, "removed once empty");
	static const char *const ctrls[] = {"memory", "pids", "freezer", "cpu", "cpuacct", "blkio"};
	for (size_t i = 0; i < sizeof ctrls / sizeof ctrls[0]; i++) {
		snprintf(p, sizeof p, "/sys/fs/cgroup/%s/spaced.bg-test", ctrls[i]);
		(void)rmdir(p);
	}
}

/* This process's cgroup2 path ("0::PATH" in /proc/self/cgroup), or "". */
static void unified_own(char *out, size_t n)
{
	char line[512];
	FILE *f = fopen("/proc/self/cgroup", "re");

	out[0] = '\0';
	while (f != NULL && fgets(line, sizeof line, f) != NULL)
		if (strncmp(line, "0::", 3) == 0)
			snprintf(out, n, "%s", line + 3);
	if (f != NULL)
		fclose(f);
	out[strcspn(out, "\n")] = '\0';
}

/* On a cgroup2 hierarchy without the cpu controller (this host's, mounted in a
 * private mount namespace), the join says so (SPACED_ENOENT), the process
 * stays where it is and no directory is left; with the controller, its
 * weight and ceiling are in cpu.weight and cpu.max. */
Test(request_cpu, cgroup2_without_cpu_controller_leaves_the_process)
{
	int st = 0;

	if (geteuid() != 0)
		cr_skip_test("needs root (a mount namespace)");
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		char why[256] = "", own[512], rdir[600], v[128];
		if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
		    mount("none", "/sys/fs/cgroup", "cgroup2", 0, NULL) != 0)
			_exit(77);
		char path[700];
		FILE *f;
		unified_own(own, sizeof own);
		snprintf(rdir, sizeof rdir, "/sys/fs/cgroup%s/spaced+request", strcmp(own, "/") == 0 ? "" : own);
		int r = spaced_sub_request_cpu_join(8, 1000, why, sizeof why);
		char after[512];
		unified_own(after, sizeof after);
		if (r == SPACED_ENOENT) /* no cpu controller: nothing moved, nothing left */
			_exit(strcmp(after, own) == 0 && access(rdir, F_OK) != 0 ? 0 : 3);
		if (r != 0) {
			fprintf(stderr, "join: %s\n", why);
			_exit(4);
		}
		snprintf(path, sizeof path, "%s/cpu.max", rdir);
		first_line(path, v, sizeof v);
		int ok = strcmp(v, "10000 10000") == 0;
		snprintf(path, sizeof path, "%s/cpu.weight", rdir);
		first_line(path, v, sizeof v);
		ok = ok && strcmp(v, "800") == 0 && strstr(after, "spaced+request") != NULL;
		/* leave it, then remove it */
		snprintf(path, sizeof path, "/sys/fs/cgroup%s/cgroup.procs", strcmp(own, "/") == 0 ? "" : own);
		f = fopen(path, "we");
		if (f != NULL) {
			fprintf(f, "0\n");
			fclose(f);
		}
		spaced_sub_request_cpu_remove();
		_exit(ok ? 0 : 5);
	}
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
		cr_skip_test("cannot mount cgroup2 in a private mount namespace here");
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", st);
}
