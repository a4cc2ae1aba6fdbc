/*
 * bench-substrate — what it costs to create an execution of the process
 * substrate and to reach it through the verified bridge (issue 3 targets).
 *
 * All in one run, on this machine:
 *   cold create   spaced-launch with the identity → READY, then spaced-host,
 *                 then HELLO answered through the bridge (create-to-ready);
 *   pooled create an execution pre-started without identity (warm pool) is
 *                 claimed: IDENTITY over its control socket → READY, then
 *                 spaced-host and HELLO through it. A pooled execution takes its
 *                 identity once and only once (a second IDENTITY ends it), so it
 *                 can never carry a previous identity. The pool's own cost (pre-
 *                 start time, resident memory per waiting execution) is printed;
 *   bwrap         `bwrap --unshare-all --die-with-parent --ro-bind / / true`,
 *                 the baseline of a bare namespace sandbox;
 *   50 concurrent cold creates and 50 concurrent claims;
 *   CPU per cold create (launcher, guest and bridge, teardown included);
 *   idle resident memory of one spaced-host plus one spaced-guest;
 *   a 4 KiB file read straight to the guest transport and through spaced-host,
 *                 and beside it the floor of any relay: the same sizes in a
 *                 ping-pong straight over a socket pair and through a bare
 *                 copying process (relay_floor_us_p50, the cost of one more
 *                 process hop each way on this machine at that moment);
 *   CPU per claim, from a cpuacct cgroup the bench puts itself in.
 * Pooled executions count as pre-started once the launcher has said POOLED
 * (the guest is up and waiting for its identity) and the bridge listens.
 * Needs root (namespaces, cgroups). Last line: JSON.
 *
 *   bench-substrate [N_SEQUENTIAL=50] [N_CONCURRENT=50] [claims]
 * With "claims", only the concurrent claims run (to profile them).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spaced_error.h"
#include "frame.h"
#include "guest_client.h"
#include "host_client.h"
#include "identity.h"
#include "util.h"
#include "vsock_hs.h"

extern char **environ;

static char top[256];

struct execution {
	char state[300], gsock[320], hsock[320], ctl[320];
	char identity[SPACED_IDENTITY_TEXT_MAX];
	pid_t launcher, host;
	int out;      /* launcher stdout */
	int host_in;  /* a pre-started bridge's stdin (warm pool), or -1 */
	double t_ident, t_stdin, t_conn; /* claim steps, ms after its start */
	uint64_t t0;
};

/* CPU time of the bench and everything it starts, from a cpuacct cgroup of
 * its own (cgroup v1 or v2), in ns; 0 when unavailable. The executions move
 * into their own memory, pids and freezer cgroups but stay in this one. */
static char cpu_cg[128];

static void cpu_cg_enter(void)
{
	static const char *const roots[] = {"/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/cpu,cpuacct"};
	for (size_t i = 0; i < sizeof roots / sizeof roots[0] && cpu_cg[0] == 0; i++) {
		char path[200];
		snprintf(cpu_cg, sizeof cpu_cg, "%s/spaced-bench-%d", roots[i], (int)getpid());
		snprintf(path, sizeof path, "%s/cgroup.procs", cpu_cg);
		FILE *f = NULL;
		if (mkdir(cpu_cg, 0755) == 0 && (f = fopen(path, "w")) != NULL && fprintf(f, "%d\n", (int)getpid()) > 0 &&
		    fclose(f) == 0)
			return;
		if (f != NULL)
			fclose(f);
		rmdir(cpu_cg);
		cpu_cg[0] = 0;
	}
}

static uint64_t cpu_cg_ns(void)
{
	char path[200];
	unsigned long long v = 0;
	snprintf(path, sizeof path, "%s/cpuacct.usage", cpu_cg);
	FILE *f = cpu_cg[0] ? fopen(path, "r") : NULL;
	if (f != NULL) {
		if (fscanf(f, "%llu", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v;
}

static void cpu_cg_leave(void)
{
	if (cpu_cg[0] == 0)
		return;
	char path[200];
	snprintf(path, sizeof path, "%.*s/cgroup.procs", (int)(strrchr(cpu_cg, '/') - cpu_cg), cpu_cg);
	FILE *f = fopen(path, "w");
	if (f != NULL) {
		fprintf(f, "%d\n", (int)getpid());
		fclose(f);
	}
	rmdir(cpu_cg);
}

static double ms_since(uint64_t t0)
{
	return (double)(spaced_mono_ns() - t0) / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double pct(double *v, int n, double p)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	int i = (int)(p * (n - 1) + 0.5);
	return v[i];
}

static pid_t spawn_io(const char *const argv[], int *out, int *in)
{
	posix_spawn_file_actions_t fa;
	int p[2] = {-1, -1}, q[2] = {-1, -1};
	pid_t pid;
	posix_spawn_file_actions_init(&fa);
	if (in != NULL) {
		if (pipe2(q, O_CLOEXEC) < 0)
			return -1;
		posix_spawn_file_actions_adddup2(&fa, q[0], 0);
	}
	if (out != NULL) {
		if (pipe2(p, O_CLOEXEC) < 0)
			return -1;
		posix_spawn_file_actions_adddup2(&fa, p[1], 1);
	}
	posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
	int r = posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)(uintptr_t)argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (out != NULL) {
		close(p[1]);
		*out = r == 0 ? p[0] : (close(p[0]), -1);
	}
	if (in != NULL) {
		close(q[0]);
		*in = r == 0 ? q[1] : (close(q[1]), -1);
	}
	return r == 0 ? pid : -1;
}

static pid_t spawn(const char *const argv[], int *out)
{
	return spawn_io(argv, out, NULL);
}

/* Reads the launcher's stdout until a line starting with what. */
static int wait_line(int fd, const char *what, int timeout_ms)
{
	size_t wl = strlen(what);
	char buf[128];
	size_t n = 0;
	uint64_t deadline = spaced_mono_ns() + (uint64_t)timeout_ms * 1000000u;
	while (spaced_mono_ns() < deadline) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		if (poll(&pf, 1, 50) <= 0)
			continue;
		if (read(fd, buf + n, 1) != 1)
			return SPACED_ECLOSED;
		if (buf[n] == '\n') {
			if (n >= wl && memcmp(buf, what, wl) == 0)
				return 0;
			n = 0;
		} else if (++n == sizeof buf) {
			n = 0;
		}
	}
	return SPACED_ETIMEDOUT;
}

static void exec_paths(struct execution *e, const char *root, const char *name, uint64_t gen)
{
	snprintf(e->state, sizeof e->state, "%s/%s", root, name);
	snprintf(e->gsock, sizeof e->gsock, "%s/guest.sock", e->state);
	snprintf(e->hsock, sizeof e->hsock, "%s/host.sock", e->state);
	snprintf(e->ctl, sizeof e->ctl, "%s/control.sock", e->state);
	snprintf(e->identity, sizeof e->identity,
	         "sandbox=sbx-%s;generation=%llu;worker=bench;substrate=process;activation=a1;pod_uid=", name,
	         (unsigned long long)gen);
	e->launcher = e->host = 0;
	e->out = e->host_in = -1;
}

static int start_launcher(struct execution *e, bool with_identity)
{
	char guest[300], launch[300];
	snprintf(guest, sizeof guest, "%s/spaced-guest/spaced-guest", top);
	snprintf(launch, sizeof launch, "%s/spaced-node/spaced-launch", top);
	const char *argv[] = {launch, "--state", e->state, "--guest", guest, "--pids", "256",
	                      with_identity ? "--identity" : NULL, e->identity, NULL};
	e->launcher = spawn(argv, &e->out);
	return e->launcher > 0 ? 0 : SPACED_ESYS;
}

/* Starts spaced-host for e; with pooled, it waits for the identity on stdin. */
static int start_bridge(struct execution *e, bool pooled)
{
	char host[300], pid[32];
	snprintf(host, sizeof host, "%s/spaced-host/spaced-host", top);
	snprintf(pid, sizeof pid, "%d", (int)e->launcher);
	const char *argv[] = {host, "--listen", e->hsock, "--guest", e->gsock, "--launcher-pid", pid,
	                      "--identity", pooled ? "-" : e->identity, "--manager-uid", "0", NULL};
	e->host = spawn_io(argv, NULL, pooled ? &e->host_in : NULL);
	return e->host > 0 ? 0 : SPACED_ESYS;
}

/* Waits until HELLO through the bridge names e's identity. */
static int hello_via_bridge(struct execution *e)
{
	uint64_t deadline = spaced_mono_ns() + 10000000000ull;
	while (spaced_mono_ns() < deadline) {
		struct spaced_guest_client *c;
		if (spaced_guest_client_connect(e->hsock, &c) < 0) {
			usleep(100);
			continue;
		}
		e->t_conn = ms_since(e->t0);
		struct spaced_identity id;
		int r = spaced_guest_hello(c, &id);
		bool ok = r == 0 && strcmp(spaced_guest_client_identity(c), e->identity) == 0;
		spaced_guest_client_free(c);
		return ok ? 0 : SPACED_EIDENTITY;
	}
	return SPACED_ETIMEDOUT;
}

static int bridge_and_hello(struct execution *e)
{
	int r = start_bridge(e, false);
	return r < 0 ? r : hello_via_bridge(e);
}

/* Connects a socket of the given type to path; -1 on failure. */
static int connect_path(const char *path, int type)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t n = strlen(path);
	if (n >= sizeof sa.sun_path)
		return -1;
	memcpy(sa.sun_path, path, n + 1);
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* Sends IDENTITY to the launcher; returns the control connection (the answer
 * is read by ctl_identity_done), or -1. */
static int ctl_identity_send(struct execution *e)
{
	char cmd[SPACED_IDENTITY_TEXT_MAX + 16];
	int fd = connect_path(e->ctl, SOCK_SEQPACKET);
	if (fd < 0)
		return -1;
	int n = snprintf(cmd, sizeof cmd, "IDENTITY %s", e->identity);
	if (send(fd, cmd, (size_t)n, 0) != n) {
		close(fd);
		return -1;
	}
	return fd;
}

/* The launcher's answer to IDENTITY: 0 for OK. Closes fd. */
static int ctl_identity_done(int fd)
{
	char reply[256];
	ssize_t got = recv(fd, reply, sizeof reply - 1, 0);
	close(fd);
	return (got >= 2 && memcmp(reply, "OK", 2) == 0) ? 0 : SPACED_EPROTO;
}

static void teardown(struct execution *e)
{
	if (e->host > 0) {
		kill(e->host, SIGKILL);
		waitpid(e->host, NULL, 0);
	}
	if (e->launcher > 0) {
		kill(e->launcher, SIGTERM); /* the launcher destroys its execution */
		waitpid(e->launcher, NULL, 0);
	}
	if (e->out >= 0)
		close(e->out);
	if (e->host_in >= 0)
		close(e->host_in);
	e->host = e->launcher = 0;
	e->out = e->host_in = -1;
	char cmd[400];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->state);
	(void)system(cmd);
}

static double cold_create(struct execution *e)
{
	uint64_t t0 = spaced_mono_ns();
	if (start_launcher(e, true) < 0 || wait_line(e->out, "READY", 20000) < 0 || bridge_and_hello(e) < 0)
		return -1;
	return ms_since(t0);
}

/* Pre-starts a pooled execution: everything but the identity, its bridge
 * included (waiting for the identity on its stdin). Done once the launcher
 * reports its guest up and waiting (POOLED) and the bridge listens. */
static int prestart(struct execution *e)
{
	if (start_launcher(e, false) < 0)
		return SPACED_ESYS;
	if (wait_line(e->out, "POOLED", 20000) < 0)
		return SPACED_ETIMEDOUT;
	if (start_bridge(e, true) < 0) /* in the state directory the launcher made */
		return SPACED_ESYS;
	struct stat st;
	for (int j = 0; j < 20000; j++) { /* the pooled bridge listens before its claim */
		if (stat(e->hsock, &st) == 0 && S_ISSOCK(st.st_mode))
			return 0;
		usleep(500);
	}
	return SPACED_ETIMEDOUT;
}

/* Claims a pooled execution: the identity goes to the execution (once: a
 * second IDENTITY ends it) and to its bridge, then HELLO through the bridge.
 * The three are pipelined: the bridge's HELLO connection waits in its
 * backlog until the bridge has the identity, the launcher accepts the
 * bridge's guest connection once the identity is on its way to the guest
 * (which takes it before any connection), and the launcher's OK is checked
 * last. */
static double claim(struct execution *e)
{
	char line[SPACED_IDENTITY_TEXT_MAX + 2];
	int n = snprintf(line, sizeof line, "%s\n", e->identity);
	uint64_t t0 = spaced_mono_ns();
	e->t0 = t0;
	/* No waiting for the launcher's READY line: the pooled bridge already
	 * listens, and answers HELLO once it and the guest have the identity. */
	int ctl = ctl_identity_send(e);
	if (ctl < 0)
		return -1;
	e->t_ident = ms_since(t0);
	if (spaced_io_write_full(e->host_in, line, (size_t)n) < 0) {
		close(ctl);
		return -1;
	}
	e->t_stdin = ms_since(t0);
	int r = hello_via_bridge(e);
	if (ctl_identity_done(ctl) < 0 || r < 0)
		return -1;
	return ms_since(t0);
}

struct job {
	struct execution e;
	bool pooled;
	double ms;
	pthread_barrier_t *go, *done;
};

static void *concurrent_one(void *arg)
{
	struct job *j = arg;
	pthread_barrier_wait(j->go);
	j->ms = j->pooled ? claim(&j->e) : cold_create(&j->e);
	/* no thread ends (unmapping its stack) while others still run theirs */
	pthread_barrier_wait(j->done);
	return NULL;
}

static double claim_cpu_ms = -1; /* CPU per claim during the concurrent claims */

static int concurrent(const char *root, int n, bool pooled, double *out_ms)
{
	struct job *jobs = calloc((size_t)n, sizeof *jobs);
	pthread_t *t = calloc((size_t)n, sizeof *t);
	pthread_barrier_t go, done;
	int r = 0;
	/* the bench's own thread joins both: CPU is counted from when all the
	 * threads are made to when all have finished, not their making and ending */
	pthread_barrier_init(&go, NULL, (unsigned)n + 1);
	pthread_barrier_init(&done, NULL, (unsigned)n + 1);
	for (int i = 0; i < n; i++) {
		char name[32];
		snprintf(name, sizeof name, "%s%d", pooled ? "p" : "c", i);
		exec_paths(&jobs[i].e, root, name, 1);
		jobs[i].pooled = pooled;
		jobs[i].go = &go;
		jobs[i].done = &done;
		if (pooled && prestart(&jobs[i].e) < 0)
			r = -1;
	}
	for (int i = 0; i < n; i++)
		pthread_create(&t[i], NULL, concurrent_one, &jobs[i]);
	uint64_t cpu0 = cpu_cg_ns();
	pthread_barrier_wait(&go);
	pthread_barrier_wait(&done);
	uint64_t cpu1 = cpu_cg_ns();
	for (int i = 0; i < n; i++) {
		pthread_join(t[i], NULL);
		out_ms[i] = jobs[i].ms;
		if (jobs[i].ms < 0)
			r = -1;
	}
	if (pooled && cpu0 != 0)
		claim_cpu_ms = (double)(cpu1 - cpu0) / 1e6 / n;
	if (pooled) {
		double *a = calloc((size_t)n, sizeof *a), *b = calloc((size_t)n, sizeof *b),
		       *c = calloc((size_t)n, sizeof *c);
		for (int i = 0; i < n; i++) {
			a[i] = jobs[i].e.t_ident;
			b[i] = jobs[i].e.t_stdin;
			c[i] = jobs[i].e.t_conn;
		}
		printf("  claim steps, ms after the claim's start, p50/p99: IDENTITY sent %.2f/%.2f, bridge told %.2f/%.2f, "
		       "HELLO connection made %.2f/%.2f\n",
		        pct(a, n, .5), pct(a, n, .99), pct(b, n, .5), pct(b, n, .99), pct(c, n, .5), pct(c, n, .99));
		free(a);
		free(b);
		free(c);
	}
	for (int i = 0; i < n; i++)
		teardown(&jobs[i].e);
	pthread_barrier_destroy(&go);
	pthread_barrier_destroy(&done);
	free(jobs);
	free(t);
	return r;
}

static double rss_mb(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	double kb = -1;
	while (f != NULL && fgets(line, sizeof line, f) != NULL)
		if (sscanf(line, "VmRSS: %lf kB", &kb) == 1)
			break;
	if (f != NULL)
		fclose(f);
	return kb / 1024.0;
}

/* The host-side pid of the execution's PID 1 (the guest), from the launcher. */
static pid_t guest_pid(struct execution *e)
{
	char path[64], buf[64];
	snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)e->launcher, (int)e->launcher);
	FILE *f = fopen(path, "r");
	int pid = -1;
	if (f != NULL && fgets(buf, sizeof buf, f) != NULL)
		pid = atoi(buf);
	if (f != NULL)
		fclose(f);
	return pid;
}

/* A guest-protocol client straight on the guest transport: CONNECT, OK, then adopt. */
static int direct_client(struct execution *e, struct spaced_guest_client **out)
{
	int fd = connect_path(e->gsock, SOCK_STREAM);
	if (fd < 0)
		return SPACED_ESYS;
	if (spaced_io_write_full(fd, "CONNECT 1024\n", 13) < 0)
		return SPACED_EIO;
	uint8_t line[SPACED_VSOCK_HS_MAX];
	size_t n = 0;
	uint32_t v;
	while (n < sizeof line && read(fd, line + n, 1) == 1)
		if (line[n++] == '\n')
			break;
	if (spaced_vsock_hs_parse_ok(line, n, &v) < 0)
		return SPACED_EPROTO;
	return spaced_guest_client_adopt(fd, out);
}

/* The floor of what any relay adds: a ping-pong of a 64-byte request and a
 * 4 KiB answer (the sizes of the 4 KiB read) between this process and an
 * answering process, straight over a socket pair and through a third process
 * that does nothing but copy (blocking reads of exactly one message, no
 * checks, no poll): the difference is the cost of one more process wake-up
 * and copy each way on this machine. */
enum { PP_REQ = 64, PP_RESP = 4096 + 2 * SPACED_FRAME_HDR_LEN + 32 };

static bool pp_read(int fd, uint8_t *b, size_t n)
{
	return spaced_io_read_full(fd, b, n) == 0;
}

static void pp_answer(int fd)
{
	static uint8_t b[PP_RESP];
	while (pp_read(fd, b, PP_REQ) && spaced_io_write_full(fd, b, PP_RESP) == 0)
		;
	_exit(0);
}

static void pp_copy(int client, int server)
{
	static uint8_t b[PP_RESP];
	while (pp_read(client, b, PP_REQ) && spaced_io_write_full(server, b, PP_REQ) == 0 &&
	       pp_read(server, b, PP_RESP) && spaced_io_write_full(client, b, PP_RESP) == 0)
		;
	_exit(0);
}

struct pingpong {
	int fd;          /* this end */
	pid_t srv, rel;  /* the answering process, the copying one (or 0) */
};

static int pingpong_start(struct pingpong *pp, bool relayed)
{
	int a[2], r[2] = {-1, -1};
	pp->fd = -1;
	pp->srv = pp->rel = 0;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a) < 0)
		return -1;
	if (relayed && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, r) < 0)
		return -1;
	pp->srv = fork();
	if (pp->srv == 0) {
		close(a[0]); /* only its own end open: it sees the end of the run */
		if (relayed) {
			close(a[1]);
			close(r[0]);
		}
		pp_answer(relayed ? r[1] : a[1]);
	}
	if (relayed && (pp->rel = fork()) == 0) {
		close(a[0]);
		close(r[1]);
		pp_copy(a[1], r[0]);
	}
	close(a[1]);
	if (relayed) {
		close(r[0]);
		close(r[1]);
	}
	pp->fd = a[0];
	return pp->srv > 0 && (!relayed || pp->rel > 0) ? 0 : -1;
}

/* One round trip; its duration in us, or -1. */
static int pingpong_once(struct pingpong *pp, double *us)
{
	static uint8_t b[PP_RESP];
	uint64_t t0 = spaced_mono_ns();
	if (pp->fd < 0 || spaced_io_write_full(pp->fd, b, PP_REQ) < 0 || !pp_read(pp->fd, b, PP_RESP))
		return -1;
	*us = (double)(spaced_mono_ns() - t0) / 1e3;
	return 0;
}

static void pingpong_stop(struct pingpong *pp)
{
	/* other forks may hold copies of the socket ends: no waiting for EOF */
	if (pp->fd >= 0)
		close(pp->fd);
	if (pp->srv > 0) {
		kill(pp->srv, SIGKILL);
		waitpid(pp->srv, NULL, 0);
	}
	if (pp->rel > 0) {
		kill(pp->rel, SIGKILL);
		waitpid(pp->rel, NULL, 0);
	}
}

static int read4k(struct spaced_guest_client *c, double *us)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 8192);
	uint64_t t0 = spaced_mono_ns();
	int r = spaced_guest_fs_read(c, "workspace/4k.bin", 0, UINT64_MAX, &b);
	*us = (double)(spaced_mono_ns() - t0) / 1e3;
	if (r == 0 && b.len != 4096)
		r = SPACED_EPROTO;
	spaced_buf_free(&b);
	return r;
}

int main(int argc, char **argv)
{
	int nseq = argc > 1 ? atoi(argv[1]) : 50, nconc = argc > 2 ? atoi(argv[2]) : 50;
	if (geteuid() != 0) {
		fprintf(stderr, "bench-substrate: needs root (namespaces, cgroups)\n");
		return 77;
	}
	if (nseq < 2 || nconc < 2)
		return 2;
	/* The build directory is where this program lives: BUILD/bench/bench-substrate. */
	char self[256];
	ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
	if (sl <= 0)
		return 1;
	self[sl] = 0;
	*strrchr(self, '/') = 0;
	*strrchr(self, '/') = 0;
	snprintf(top, sizeof top, "%s", self);
	cpu_cg_enter();
	char root[] = "/tmp/spaced-bench-substrate-XXXXXX";
	if (mkdtemp(root) == NULL)
		return 1;
	signal(SIGPIPE, SIG_IGN);

	double *cold = calloc((size_t)nseq, sizeof(double)), *pooled = calloc((size_t)nseq, sizeof(double));
	double *pre = calloc((size_t)nseq, sizeof(double)), *bw = calloc((size_t)nseq, sizeof(double));
	double *cc = calloc((size_t)nconc, sizeof(double)), *cp = calloc((size_t)nconc, sizeof(double));
	int failures = 0;

	if (argc > 3 && strcmp(argv[3], "claims") == 0) { /* only the concurrent claims (for profiling) */
		int r = concurrent(root, nconc, true, cp);
		printf("%d concurrent pooled claims         p50 %7.2f ms  p99 %7.2f ms  CPU per claim %.2f ms\n", nconc,
		       pct(cp, nconc, 0.5), pct(cp, nconc, 0.99), claim_cpu_ms);
		rmdir(root);
		cpu_cg_leave();
		return r < 0 ? 1 : 0;
	}
	/* Sequential: cold create, bwrap and pooled claims interleaved, so each sees the same machine. */
	struct rusage ru0, ru1;
	double cold_cpu_ms = 0;
	double pool_rss = 0;
	for (int i = 0; i < nseq; i++) {
		struct execution e;
		char name[32];
		snprintf(name, sizeof name, "s%d", i);
		exec_paths(&e, root, name, (uint64_t)i + 1);
		getrusage(RUSAGE_CHILDREN, &ru0);
		cold[i] = cold_create(&e);
		teardown(&e);
		getrusage(RUSAGE_CHILDREN, &ru1);
		cold_cpu_ms += (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec + ru1.ru_stime.tv_sec -
		                        ru0.ru_stime.tv_sec) * 1e3 +
		               (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec + ru1.ru_stime.tv_usec -
		                        ru0.ru_stime.tv_usec) / 1e3;
		if (cold[i] < 0)
			failures++;

		const char *bargv[] = {"/usr/bin/bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/",
		                       "/", "true", NULL};
		uint64_t t0 = spaced_mono_ns();
		pid_t b = spawn(bargv, NULL);
		int st = 0;
		if (b > 0)
			waitpid(b, &st, 0);
		bw[i] = ms_since(t0);
		if (b <= 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			failures++;

		snprintf(name, sizeof name, "w%d", i);
		exec_paths(&e, root, name, (uint64_t)i + 1);
		t0 = spaced_mono_ns();
		if (prestart(&e) < 0)
			failures++;
		pre[i] = ms_since(t0);
		usleep(20000); /* the pooled execution settles, as it would waiting in a pool */
		if (i == 0) {
			pid_t g = guest_pid(&e);
			pool_rss = rss_mb(e.launcher) + (g > 0 ? rss_mb(g) : 0);
		}
		pooled[i] = claim(&e);
		if (pooled[i] < 0)
			failures++;
		teardown(&e);
	}
	cold_cpu_ms /= nseq;

	/* Concurrent: nconc cold creates at once, then nconc claims from a full pool. */
	if (concurrent(root, nconc, false, cc) < 0)
		failures++;
	if (concurrent(root, nconc, true, cp) < 0)
		failures++;

	/* Idle memory and the cost of the bridge on one execution. */
	struct execution e;
	exec_paths(&e, root, "rd", 1);
	double idle_rss = -1, direct_p50 = -1, bridge_p50 = -1, handoff_p50 = -1, pp_direct = -1, pp_relayed = -1;
	if (cold_create(&e) >= 0) {
		usleep(300000);
		pid_t g = guest_pid(&e);
		idle_rss = rss_mb(e.host) + (g > 0 ? rss_mb(g) : 0);
		/* A second bridge on the same execution that hands verified connections off. */
		char hsock2[340], host[300], lp[32], why[256] = "";
		snprintf(hsock2, sizeof hsock2, "%s/host-handoff.sock", e.state);
		snprintf(host, sizeof host, "%s/spaced-host/spaced-host", top);
		snprintf(lp, sizeof lp, "%d", (int)e.launcher);
		const char *hargv[] = {host, "--listen", hsock2, "--guest", e.gsock, "--launcher-pid", lp,
		                       "--identity", e.identity, "--manager-uid", "0", "--handoff", NULL};
		pid_t h2 = spawn(hargv, NULL);
		int hfd = -1;
		for (int i = 0; i < 2000 && hfd < 0; i++)
			if (spaced_host_connect(hsock2, true, 2000, &hfd, why, sizeof why) < 0)
				usleep(1000);
		struct spaced_guest_client *bc = NULL, *dc = NULL, *hc = NULL;
		if (hfd >= 0)
			spaced_guest_client_adopt(hfd, &hc);
		static uint8_t data[4096];
		memset(data, 'x', sizeof data);
		if (hc != NULL && spaced_guest_client_connect(e.hsock, &bc) == 0 && direct_client(&e, &dc) == 0 &&
		    spaced_guest_fs_write(bc, "workspace/4k.bin", data, sizeof data, 0644, 0) == 0) {
			enum { ROUNDS = 20, PER = 100 };
			double *d = calloc(ROUNDS * PER, sizeof(double)), *br = calloc(ROUNDS * PER, sizeof(double));
			double *ho = calloc(ROUNDS * PER, sizeof(double));
			double *p1 = calloc(ROUNDS * PER, sizeof(double)), *p2 = calloc(ROUNDS * PER, sizeof(double));
			int nd = 0, nb = 0, nh = 0, n1 = 0, n2 = 0;
			struct pingpong ppd, ppr;
			pingpong_start(&ppd, false);
			pingpong_start(&ppr, true);
			/* every kind in every round, so that all see the same machine */
			for (int r = 0; r < ROUNDS; r++) {
				for (int i = 0; i < PER; i++)
					if (pingpong_once(&ppd, &p1[n1]) == 0)
						n1++;
				for (int i = 0; i < PER; i++)
					if (pingpong_once(&ppr, &p2[n2]) == 0)
						n2++;
				for (int i = 0; i < PER; i++)
					if (read4k(dc, &d[nd]) == 0)
						nd++;
				for (int i = 0; i < PER; i++)
					if (read4k(bc, &br[nb]) == 0)
						nb++;
				for (int i = 0; i < PER; i++)
					if (read4k(hc, &ho[nh]) == 0)
						nh++;
			}
			pingpong_stop(&ppd);
			pingpong_stop(&ppr);
			if (n1 > 0 && n2 > 0) {
				pp_direct = pct(p1, n1, 0.5);
				pp_relayed = pct(p2, n2, 0.5);
			}
			free(p1);
			free(p2);
			if (nd > 0 && nb > 0 && nh > 0) {
				direct_p50 = pct(d, nd, 0.5);
				bridge_p50 = pct(br, nb, 0.5);
				handoff_p50 = pct(ho, nh, 0.5);
			}
			free(d);
			free(br);
			free(ho);
		} else {
			failures++;
		}
		spaced_guest_client_free(bc);
		spaced_guest_client_free(dc);
		spaced_guest_client_free(hc);
		if (h2 > 0) {
			kill(h2, SIGKILL);
			waitpid(h2, NULL, 0);
		}
	} else {
		failures++;
	}
	teardown(&e);
	rmdir(root);

	double cold50 = pct(cold, nseq, 0.5), pool50 = pct(pooled, nseq, 0.5), bw50 = pct(bw, nseq, 0.5);
	double pre50 = pct(pre, nseq, 0.5), cc99 = pct(cc, nconc, 0.99), cp99 = pct(cp, nconc, 0.99);
	double cc50 = pct(cc, nconc, 0.5), cp50 = pct(cp, nconc, 0.5);
	printf("machine: %ld cores; %d sequential, %d concurrent; failures: %d\n",
	       sysconf(_SC_NPROCESSORS_ONLN), nseq, nconc, failures);
	printf("bwrap --unshare-all true            p50 %7.2f ms\n", bw50);
	printf("cold create-to-ready (via bridge)   p50 %7.2f ms  p99 %7.2f ms\n", cold50, pct(cold, nseq, 0.99));
	printf("pooled claim-to-ready (via bridge)  p50 %7.2f ms  p99 %7.2f ms  (target p50 <= 30 ms and <= 2x bwrap)\n",
	       pool50, pct(pooled, nseq, 0.99));
	printf("  pool cost: pre-start p50 %.2f ms per execution, %.2f MB resident per waiting execution\n",
	       pre50, pool_rss);
	printf("%d concurrent cold creates          p50 %7.2f ms  p99 %7.2f ms\n", nconc, cc50, cc99);
	printf("%d concurrent pooled claims         p50 %7.2f ms  p99 %7.2f ms  (target p99 <= 60 ms)\n", nconc,
	       cp50, cp99);
	printf("  CPU per concurrent claim (claimer, launcher, guest, bridge; cpuacct): %.2f ms\n", claim_cpu_ms);
	printf("CPU per cold create (all processes, teardown included): %.2f ms\n", cold_cpu_ms);
	printf("idle RSS spaced-host + spaced-guest: %.2f MB (target <= 3)\n", idle_rss);
	printf("4 KiB read: direct %.1f us, through spaced-host %.1f us, bridge adds %.1f us (target <= 15)\n",
	       direct_p50, bridge_p50, bridge_p50 - direct_p50);
	printf("4 KiB read on a connection handed off by spaced-host --handoff: %.1f us (adds %.1f us)\n",
	       handoff_p50, handoff_p50 - direct_p50);
	printf("relay floor: 64 B / 4 KiB ping-pong %.1f us direct, %.1f us through a bare copying process: "
	       "one more hop adds %.1f us\n",
	       pp_direct, pp_relayed, pp_relayed - pp_direct);
	printf("{\"create_p50_ms\":%.2f, \"create_p99_ms_50concurrent\":%.2f, \"bwrap_p50_ms\":%.2f, "
	       "\"create_cpu_ms\":%.2f, \"idle_rss_mb\":%.2f, \"read4k_direct_us_p50\":%.1f, "
	       "\"read4k_bridge_us_p50\":%.1f, \"cold_create_p50_ms\":%.2f, "
	       "\"cold_create_p99_ms_50concurrent\":%.2f, \"pool_prestart_p50_ms\":%.2f, "
	       "\"pool_rss_mb_per_execution\":%.2f, \"read4k_handoff_us_p50\":%.1f, \"relay_floor_us_p50\":%.1f, "
	       "\"claim_cpu_ms\":%.2f, \"failures\":%d}\n",
	       pool50, cp99, bw50, cold_cpu_ms, idle_rss, direct_p50, bridge_p50, cold50, cc99, pre50, pool_rss,
	       handoff_p50, pp_relayed - pp_direct, claim_cpu_ms, failures);
	cpu_cg_leave();
	return failures ? 1 : 0;
}
