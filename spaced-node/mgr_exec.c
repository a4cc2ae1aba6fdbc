/*
 * mgr_exec.c — starting, pausing, snapshotting and stopping executions.
 *
 * Substrate mode (--launcher and --host): each execution is a `process`
 * substrate execution supervised by spaced-launch in STATE/exec/<sandbox>.<gen>
 * (docs/substrate.md), and requests reach it only through its own spaced-host
 * bridge listening on STATE/run/<sandbox>.<gen>.sock, which verifies the
 * launcher, the guest transport and this manager (B1–B3) for every connection.
 * Pause, thaw and snapshot are the launcher's control commands.
 *
 * Development mode: one spaced-guest --listen per execution in its own session
 * (no namespaces); its files live in STATE/sbx/<sandbox>/root and survive a
 * new generation; pause is SIGSTOP of its process group, a snapshot a copy.
 *
 * Processes are pinned by {pid, start time} and signalled through a pidfd only
 * after the start time matched.
 */
#include "mgr.h"
#include "net.h"
#include "node.h"

#include <dirent.h>
#include <inttypes.h>
#include <poll.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "spaced_error.h"
#include "fetch.h"
#include "rootfs.h"
#include "pidref.h"
#include "helper_spawn.h"
#include "substrate.h"
#include "util.h"

/* The nice value of a warm pool's start, its session's and its processes' */
#define POOL_NICE 10

static int mkdirs(const char *path)
{
	char buf[4096];
	if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
		return SPACED_EINVAL;
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0700) < 0 && errno != EEXIST)
			return SPACED_ESYS;
		*p = '/';
	}
	if (mkdir(buf, 0700) < 0 && errno != EEXIST)
		return SPACED_ESYS;
	return 0;
}

static int root_dir(const char *state_dir, const char *sandbox, char *out, size_t outsz)
{
	int n = snprintf(out, outsz, "%s/sbx/%s/root", state_dir, sandbox);
	return (n < 0 || (size_t)n >= outsz) ? SPACED_EINVAL : 0;
}

static bool substrate_mode(const struct mgr_config *cfg)
{
	return cfg->launch_bin && cfg->host_bin;
}

static int exec_dir(const struct mgr_config *cfg, const struct mgr_rec *rec, char *out, size_t outsz)
{
	/* a claimed pooled execution keeps the directory it was started in */
	int n = rec->exec_name[0] ? snprintf(out, outsz, "%s/%s", cfg->state_dir, rec->exec_name)
	                          : snprintf(out, outsz, "%s/exec/%s.%llu", cfg->state_dir, rec->r.id.sandbox,
	                                     (unsigned long long)rec->r.id.generation);
	return (n < 0 || (size_t)n >= outsz) ? SPACED_EINVAL : 0;
}

int mgr_exec_target(const struct mgr_config *cfg, const struct mgr_rec *rec, char *out, size_t outsz)
{
	const char *state_dir = cfg->state_dir;
	size_t max = sizeof(((struct sockaddr_un *)0)->sun_path);
	int n = rec->exec_name[0] ? snprintf(out, outsz, "%s/run/%s.sock", state_dir, rec->exec_name + 5)
	                          : snprintf(out, outsz, "%s/run/%s.%llu.sock", state_dir, rec->r.id.sandbox,
	                                     (unsigned long long)rec->r.id.generation);
	if (n < 0 || (size_t)n >= outsz || (size_t)n >= max)
		return SPACED_EINVAL;
	return 0;
}

/* Removes the tree at path (rm -rf); nothing is run when there is none. */
static int remove_tree(const char *path)
{
	struct stat sb;
	if (lstat(path, &sb) < 0 && errno == ENOENT)
		return 0;
	const char *rm[] = {"rm", "-rf", "--", path, NULL};
	return mgr_run_wait(rm);
}

/* Runs argv to completion; 0 when it exited 0. */
int mgr_run_wait(const char *const argv[])
{
	return mgr_run_why(argv, NULL, 0);
}

int mgr_run_why(const char *const argv[], char *why, size_t whysz)
{
	int p[2] = {-1, -1};
	if (why && whysz && pipe2(p, O_CLOEXEC) < 0)
		return SPACED_ESYS;
	pid_t pid = p[1] >= 0 ? spaced_spawn_quiet_err(argv, p[1]) : spaced_spawn_quiet(argv);
	if (p[1] >= 0)
		close(p[1]);
	size_t got = 0;
	char sink[512];
	for (ssize_t n; pid >= 0 && p[0] >= 0;) { /* its first line kept, the rest drained */
		bool keep = got + 1 < whysz;
		n = read(p[0], keep ? why + got : sink, keep ? whysz - 1 - got : sizeof sink);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		if (keep)
			got += (size_t)n;
	}
	if (p[0] >= 0) {
		close(p[0]);
		why[got] = 0;
		why[strcspn(why, "\n")] = 0;
	}
	if (pid < 0)
		return SPACED_ESYS;
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return SPACED_ESYS;
	return (WIFEXITED(status) && WEXITSTATUS(status) == 0) ? 0 : SPACED_EIO;
}

/* A pidfd of pid when it is still the process that started at start (the
 * caller closes it), or SPACED_ENOENT. */
static int pidfd_pinned(int64_t pid, uint64_t start)
{
	struct spaced_pidref ref = SPACED_PIDREF_NULL;
	char why[160];
	if (pid <= 0 || spaced_pidref_expected(&ref, (pid_t)pid, start, why, sizeof why) < 0)
		return SPACED_ENOENT;
	return ref.pidfd; /* the caller's now */
}

static int pidfd_of(const struct mgr_rec *rec)
{
	return pidfd_pinned(rec->pid, rec->pid_start);
}

/* Waits up to ms for the pinned process to exit (reaping it when it is ours). */
static bool wait_exit(int fd, int ms)
{
	for (int i = 0; i < ms / 5; i++) {
		siginfo_t si;
		memset(&si, 0, sizeof si);
		if (waitid(P_PIDFD, (id_t)fd, &si, WEXITED | WNOHANG) == 0 && si.si_pid != 0)
			return true;
		if (waitid(P_PIDFD, (id_t)fd, &si, WEXITED | WNOHANG | WNOWAIT) < 0 && errno == ECHILD) {
			/* not our child: ask whether it still exists */
			if (syscall(SYS_pidfd_send_signal, fd, 0, NULL, 0) < 0)
				return true;
		}
		struct timespec ts = {0, 5 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	return false;
}

/* Stops a pinned process: SIGTERM, then SIGKILL. */
static void stop_pinned(int64_t pid, uint64_t start, bool group)
{
	int fd = pidfd_pinned(pid, start);
	if (fd < 0)
		return;
	syscall(SYS_pidfd_send_signal, fd, SIGTERM, NULL, 0);
	if (!wait_exit(fd, 2000)) {
		if (group)
			kill(-(pid_t)pid, SIGKILL);
		syscall(SYS_pidfd_send_signal, fd, SIGKILL, NULL, 0);
		wait_exit(fd, 2000);
	}
	close(fd);
}

bool mgr_exec_alive(const struct mgr_rec *rec)
{
	int fd = pidfd_of(rec);
	if (fd < 0)
		return false;
	/* a zombie still has its start time: its pidfd is readable once it
	 * exited, whoever its parent is (waitid answers only a parent) */
	struct pollfd p = {.fd = fd, .events = POLLIN};
	bool alive = poll(&p, 1, 0) == 0;
	close(fd);
	return alive;
}

/* The processes descending from root (not root itself), from one scan of
 * /proc: the guest runs each command in a session of its own, so its process
 * group alone does not reach them. *out is a new array of *n pids. */
static int descendants(pid_t root, pid_t **out, size_t *n)
{
	struct pp {
		pid_t pid, ppid;
	} *all = NULL;
	size_t na = 0, cap = 0;
	DIR *d = opendir("/proc");
	if (!d)
		return SPACED_ESYS;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		char path[64], buf[512];
		char *end;
		long pid = strtol(de->d_name, &end, 10);
		if (*end || pid <= 0)
			continue;
		snprintf(path, sizeof path, "/proc/%ld/stat", pid);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		ssize_t len = read(fd, buf, sizeof buf - 1);
		close(fd);
		if (len <= 0)
			continue;
		buf[len] = 0;
		char *rp = strrchr(buf, ')'); /* after the command name, which may hold ')' */
		long ppid;
		char st;
		if (!rp || sscanf(rp + 1, " %c %ld", &st, &ppid) != 2)
			continue;
		if (na == cap) {
			size_t nc = cap ? cap * 2 : 256;
			struct pp *nn = realloc(all, nc * sizeof *nn);
			if (!nn) {
				free(all);
				closedir(d);
				return SPACED_ENOMEM;
			}
			all = nn;
			cap = nc;
		}
		all[na].pid = (pid_t)pid;
		all[na].ppid = (pid_t)ppid;
		na++;
	}
	closedir(d);
	pid_t *res = malloc((na ? na : 1) * sizeof *res);
	if (!res) {
		free(all);
		return SPACED_ENOMEM;
	}
	size_t nr = 0;
	/* breadth first: res[k] are found in order, each parent before its children */
	for (size_t k = 0;; k++) {
		pid_t parent = k == 0 ? root : (k - 1 < nr ? res[k - 1] : 0);
		if (parent == 0)
			break;
		for (size_t i = 0; i < na; i++)
			if (all[i].ppid == parent && all[i].pid != root)
				res[nr++] = all[i].pid;
	}
	free(all);
	*out = res;
	*n = nr;
	return 0;
}

/* Signals every process descending from the guest and its process group.
 * The scan comes first: once a SIGKILL reaches the guest, its children are
 * re-parented and no longer descend from it. Returns how many descendants
 * the scan found. */
static size_t dev_signal_tree(pid_t leader, int sig)
{
	pid_t *ds = NULL;
	size_t n = 0;
	if (descendants(leader, &ds, &n) < 0) {
		kill(-leader, sig);
		return 0;
	}
	for (size_t i = 0; i < n; i++)
		kill(ds[i], sig);
	kill(-leader, sig);
	free(ds);
	return n;
}

static int dev_signal(const struct mgr_rec *rec, int sig)
{
	int fd = pidfd_of(rec);
	if (fd < 0)
		return fd;
	/* The guest leads its own session and process group: signal the group,
	 * after the pidfd proved the leader is still the recorded process. */
	int e = 0;
	if (kill(-(pid_t)rec->pid, sig) < 0 &&
	    syscall(SYS_pidfd_send_signal, fd, sig, NULL, 0) < 0)
		e = SPACED_ESYS;
	else
		dev_signal_tree((pid_t)rec->pid, sig); /* the commands it runs in their own sessions */
	close(fd);
	return e;
}

static void dev_stop(struct mgr_rec *rec)
{
	int fd = pidfd_of(rec);
	if (fd >= 0) {
		/* freeze the tree, then kill it while it is still a tree: once the
		 * guest is gone its commands would be orphans nobody finds */
		/* A process forked while a scan ran is found by the next one: stop
		 * until a scan finds no more than the one before, then kill until
		 * nothing descends from the guest any more (both bounded). */
		size_t seen = 0, now;
		for (int round = 0; round < 16; round++) {
			now = dev_signal_tree((pid_t)rec->pid, SIGSTOP);
			if (now <= seen)
				break;
			seen = now;
		}
		for (int round = 0; round < 50 && dev_signal_tree((pid_t)rec->pid, SIGKILL) > 0; round++) {
			struct timespec pause = {0, 2 * 1000 * 1000};
			nanosleep(&pause, NULL);
		}
		kill(-(pid_t)rec->pid, SIGKILL);
		syscall(SYS_pidfd_send_signal, fd, SIGKILL, NULL, 0);
		kill(-(pid_t)rec->pid, SIGCONT);
		siginfo_t si;
		/* our child: reap it; an orphan adopted by init after a restart: wait for exit */
		if (waitid(P_PIDFD, (id_t)fd, &si, WEXITED) < 0) {
			for (int i = 0; i < 200 && mgr_exec_alive(rec); i++) {
				struct timespec ts = {0, 5 * 1000 * 1000};
				nanosleep(&ts, NULL);
			}
		}
		close(fd);
	}
	rec->pid = 0;
	rec->pid_start = 0;
}

/* The dev substrate's guest: its own session, its output to its log. */
struct dev_child {
	const char *const *argv;
	const char *logp;
};

static int dev_child(void *arg)
{
	const struct dev_child *c = arg;
	setsid();
	int nul = open("/dev/null", O_RDONLY);
	int log = open(c->logp, O_WRONLY | O_CREAT | O_APPEND, 0600);
	if (nul >= 0)
		dup2(nul, 0);
	if (log >= 0) {
		dup2(log, 1);
		dup2(log, 2);
	}
	return spaced_spawn_exec_fresh(c->argv);
}

static int dev_start(const char *state_dir, const char *guest_bin, struct mgr_rec *rec,
                     const char *snapshot)
{
	char root[4096], sock[256], logp[4096], dir[4096], text[SPACED_IDENTITY_TEXT_MAX];
	int e;

	if (!guest_bin)
		return SPACED_EINVAL;
	struct mgr_config tc = {.state_dir = state_dir};
	e = root_dir(state_dir, rec->r.id.sandbox, root, sizeof root);
	if (e == 0)
		e = mgr_exec_target(&tc, rec, sock, sizeof sock);
	if (e < 0)
		return e;
	if (spaced_identity_encode(&rec->r.id, text, sizeof text) < 0)
		return SPACED_EINVAL;
	snprintf(dir, sizeof dir, "%s/run", state_dir);
	if ((e = mkdirs(dir)) < 0)
		return e;
	snprintf(dir, sizeof dir, "%s/log", state_dir);
	if ((e = mkdirs(dir)) < 0)
		return e;
	if (snapshot && *snapshot) {
		const char *rm[] = {"rm", "-rf", "--", root, NULL};
		const char *cp[] = {"cp", "-a", "--", snapshot, root, NULL};
		snprintf(dir, sizeof dir, "%s/sbx/%s", state_dir, rec->r.id.sandbox);
		if ((e = mkdirs(dir)) < 0)
			return e;
		if (mgr_run_wait(rm) < 0 || mgr_run_wait(cp) < 0)
			return SPACED_EIO;
	}
	if ((e = mkdirs(root)) < 0)
		return e;
	unlink(sock);
	snprintf(logp, sizeof logp, "%s/log/%s.log", state_dir, rec->r.id.sandbox);

	const char *const argv[] = {guest_bin, "--root", root, "--identity", text, "--listen", sock, NULL};
	struct dev_child c = {.argv = argv, .logp = logp};
	pid_t pid = spaced_spawn(dev_child, &c);
	if (pid < 0)
		return SPACED_ESYS;
	uint64_t st = 0;
	if (spaced_proc_start_time(pid, &st) < 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return SPACED_ESYS;
	}
	/* Wait until it listens (the install is acknowledged with a serving execution). */
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, sock, strlen(sock));
	e = SPACED_ETIMEDOUT;
	for (int i = 0; i < 1000; i++) {
		int status;
		if (waitpid(pid, &status, WNOHANG) == pid) {
			e = SPACED_EIO;
			break;
		}
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
			close(fd);
			e = 0;
			break;
		}
		if (fd >= 0)
			close(fd);
		struct timespec ts = {0, 5 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	if (e < 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return e;
	}
	rec->pid = pid;
	rec->pid_start = st;
	return 0;
}

static uint64_t snap_bytes;
static int sum_cb(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
	(void)p;
	(void)f;
	if (flag == FTW_F)
		snap_bytes += (uint64_t)sb->st_size;
	return 0;
}

static int dev_snapshot(const char *state_dir, const struct mgr_rec *rec, const char *path,
                        uint64_t *bytes)
{
	char root[4096];
	int e = root_dir(state_dir, rec->r.id.sandbox, root, sizeof root);
	if (e < 0)
		return e;
	if (!path || path[0] != '/')
		return SPACED_EINVAL;
	struct stat sb;
	if (lstat(path, &sb) == 0)
		return SPACED_EEXIST;
	const char *cp[] = {"cp", "-a", "--", root, path, NULL};
	if (mgr_run_wait(cp) < 0)
		return SPACED_EIO;
	snap_bytes = 0;
	if (nftw(path, sum_cb, 16, FTW_PHYS) < 0)
		return SPACED_EIO;
	*bytes = snap_bytes;
	return 0;
}

void mgr_exec_remove(const struct mgr_config *cfg, const char *sandbox)
{
	const char *state_dir = cfg->state_dir;
	char dir[4096];
	if (snprintf(dir, sizeof dir, "%s/sbx/%s", state_dir, sandbox) >= (int)sizeof dir)
		return;
	const char *rm[] = {"rm", "-rf", "--", dir, NULL};
	mgr_run_wait(rm);
}

/* ---- substrate mode: spaced-launch + spaced-host ---- */

/* When set, the next spawn_logged's standard input (a FIFO, opened
 * read-write so it never sees an end) and standard output (a pipe's write
 * end). Job children only: each runs one job. */
static const char *spawn_stdin;
static int spawn_stdout = -1;

/* A pooled execution's process (launcher, bridge, gateway) once claimed: at
 * the priority every execution's has, itself and its session; pid pinned by
 * the caller. Its CPU cgroup is already the executor's, as a cold start's
 * (left_background): a claim moves no process between cgroups. */
static void raise_pinned(pid_t pid)
{
	setpriority(PRIO_PROCESS, (id_t)pid, 0);
	spaced_session_nice(pid, 0);
}

/* A pooled execution's process once its start is over: out of the
 * background CPU cgroup, into the executor's, where it waits (idle, at
 * the pool's priority: POOL_NICE, itself and its session) until a claim
 * raises it. Moved here, by the start's job, and not by the claim: the
 * first move between cgroups after a quiet while waits for an RCU grace
 * period (6-8 ms here), which a create would wait for. */
static void left_background(pid_t pid)
{
	(void)spaced_sub_background_cpu_leave(pid);
}

/* fn for a process pinned here by its start time; with children, also for
 * the processes it forked (a gateway's serving process, forked with the
 * pool's start: spaced-netgtw; a child's pid stays its own while the pinned
 * parent has not reaped it). */
static void each_pinned(int64_t pid, uint64_t start, bool children, void (*fn)(pid_t))
{
	int fd = pidfd_pinned(pid, start);
	if (fd < 0)
		return;
	fn((pid_t)pid);
	char path[96], buf[512];
	snprintf(path, sizeof path, "/proc/%lld/task/%lld/children", (long long)pid, (long long)pid);
	int cf = children ? open(path, O_RDONLY | O_CLOEXEC) : -1;
	ssize_t n = cf >= 0 ? read(cf, buf, sizeof buf - 1) : -1;
	if (cf >= 0)
		close(cf);
	if (n > 0) {
		buf[n] = 0;
		for (char *p = buf, *end; *p; p = end) {
			long long c = strtoll(p, &end, 10);
			if (end == p)
				break;
			if (c > 1)
				fn((pid_t)c);
		}
	}
	close(fd);
}

/* The pinned pid and start of a process named by the file e_dir/name
 * ("pid=P start=S"); false when there is none. */
static bool pinned_in(const char *e_dir, const char *name, long long *pid, unsigned long long *start)
{
	char lf[4200];
	snprintf(lf, sizeof lf, "%s/%s", e_dir, name);
	FILE *f = fopen(lf, "r");
	if (!f)
		return false;
	bool ok = fscanf(f, "pid=%lld start=%llu", pid, start) == 2;
	fclose(f);
	return ok;
}

/* What a logged child needs, prepared before it starts (spawn.h). */
struct logged_child {
	const char *const *argv;
	const char *logp;
	const char *in;   /* spawn_stdin */
	int out;          /* spawn_stdout */
	char nice[16];    /* its session's nice value, "" for the default */
};

static int logged_child(void *arg)
{
	const struct logged_child *c = arg;
	setsid();
	if (c->nice[0]) {
		int fd = open("/proc/self/autogroup", O_WRONLY | O_CLOEXEC);
		if (fd >= 0) {
			(void)!write(fd, c->nice, strlen(c->nice));
			close(fd);
		}
	}
	int nul = open("/dev/null", O_RDWR);
	int log = open(c->logp, O_WRONLY | O_CREAT | O_APPEND, 0600);
	if (nul >= 0) {
		dup2(nul, 0);
		dup2(nul, 1);
	}
	if (c->in) {
		int in = open(c->in, O_RDWR | O_NOFOLLOW);
		if (in < 0)
			return 127;
		dup2(in, 0);
	}
	if (c->out >= 0)
		dup2(c->out, 1);
	if (log >= 0)
		dup2(log, 2);
	return spaced_spawn_exec_fresh(c->argv);
}

/* Starts argv in its own session, stdout to /dev/null, stderr appended to
 * logp. The session keeps the caller's priority: one started below the
 * default (the warm pool's) stays below its siblings' sessions too. */
static int spawn_logged(const char *const argv[], const char *logp, int64_t *pid, uint64_t *start)
{
	struct logged_child c = {.argv = argv, .logp = logp, .in = spawn_stdin, .out = spawn_stdout};
	errno = 0;
	int nice = getpriority(PRIO_PROCESS, 0);
	if (errno == 0 && nice > 0)
		snprintf(c.nice, sizeof c.nice, "%d", nice);
	pid_t p = spaced_spawn(logged_child, &c);
	if (p < 0)
		return SPACED_ESYS;
	uint64_t st = 0;
	if (spaced_proc_start_time(p, &st) < 0) {
		kill(p, SIGKILL);
		waitpid(p, NULL, 0);
		return SPACED_ESYS;
	}
	*pid = p;
	*start = st;
	return 0;
}

static bool connectable(const char *path)
{
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	if (strlen(path) >= sizeof sa.sun_path)
		return false;
	memcpy(sa.sun_path, path, strlen(path));
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return false;
	bool ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
	close(fd);
	return ok;
}

/* Waits until path exists (want_sock: accepts connections) while the pinned process lives. */
static int wait_for(const char *path, bool want_sock, int64_t pid, uint64_t start, int ms)
{
	/* looked at after 0.25, 0.5, 1, 2 ms and then every 5 ms: most of what
	 * is waited for here is ready within a few milliseconds */
	long waited_us = 0, step_us = 250;
	while (waited_us < (long)ms * 1000) {
		struct stat sb;
		if (want_sock ? connectable(path) : stat(path, &sb) == 0)
			return 0;
		int fd = pidfd_pinned(pid, start);
		if (fd < 0)
			return SPACED_EIO;
		siginfo_t si;
		memset(&si, 0, sizeof si);
		bool gone = waitid(P_PIDFD, (id_t)fd, &si, WEXITED | WNOHANG) == 0 && si.si_pid != 0;
		close(fd);
		if (gone)
			return SPACED_EIO;
		struct timespec ts = {0, step_us * 1000};
		nanosleep(&ts, NULL);
		waited_us += step_us;
		step_us = step_us * 2 > 5000 ? 5000 : step_us * 2;
	}
	return SPACED_ETIMEDOUT;
}

/* Spawns argv (output to logp) and waits until path exists (want_sock: accepts
 * connections) while the spawned process lives; stops it (its process group
 * too with group) when it does not get there. *pid / *start pin it. */
static int spawn_ready(const char *const argv[], const char *logp, const char *path, bool want_sock,
                       int timeout_ms, bool group, int64_t *pid, uint64_t *start)
{
	int e = spawn_logged(argv, logp, pid, start);
	if (e < 0)
		return e;
	e = wait_for(path, want_sock, *pid, *start, timeout_ms);
	if (e < 0)
		stop_pinned(*pid, *start, group);
	return e;
}

/* Starts rec's bridge. With fifo, a pooled one: it listens at once and
 * reads its identity line from that FIFO when the execution is claimed. */
static int start_bridge_in(const struct mgr_config *cfg, struct mgr_rec *rec, const char *fifo)
{
	char e_dir[4096], gsock[4200], sock[256], logp[4096], text[SPACED_IDENTITY_TEXT_MAX];
	char lpid[32], lstart[32], muid[32], mpid[32], mstart[32];
	uint64_t me = 0;
	int e = exec_dir(cfg, rec, e_dir, sizeof e_dir);
	if (e == 0)
		e = mgr_exec_target(cfg, rec, sock, sizeof sock);
	if (fifo)
		snprintf(text, sizeof text, "-");
	if (e < 0 || (!fifo && spaced_identity_encode(&rec->r.id, text, sizeof text) < 0))
		return SPACED_EINVAL;
	/* the bridge accepts one caller: the executor, which makes every
	 * connection to it (this may run in one of its job children) */
	pid_t caller = cfg->exe_pid ? cfg->exe_pid : getpid();
	me = cfg->exe_pid ? cfg->exe_start : 0;
	if (!cfg->exe_pid && spaced_proc_start_time(caller, &me) < 0)
		return SPACED_ESYS;
	snprintf(gsock, sizeof gsock, "%s/guest.sock", e_dir);
	snprintf(logp, sizeof logp, "%s/log/%s.log", cfg->state_dir, fifo ? "pool" : rec->r.id.sandbox);
	snprintf(lpid, sizeof lpid, "%lld", (long long)rec->pid);
	snprintf(lstart, sizeof lstart, "%llu", (unsigned long long)rec->pid_start);
	snprintf(muid, sizeof muid, "%u", (unsigned)geteuid());
	snprintf(mpid, sizeof mpid, "%d", (int)caller);
	snprintf(mstart, sizeof mstart, "%llu", (unsigned long long)me);
	unlink(sock);
	const char *argv[] = {cfg->host_bin, "--listen", sock, "--guest", gsock, "--identity", text,
	                      "--launcher-pid", lpid, "--launcher-start", lstart, "--launcher-exe",
	                      cfg->launch_bin, "--manager-uid", muid, "--manager-pid", mpid,
	                      "--manager-start", mstart, "--handoff", NULL};
	int64_t hp;
	uint64_t hs;
	/* a pooled bridge takes the FIFO as its standard input; it listens before
	 * it reads it (connections wait in its backlog), so the socket existing
	 * is what is waited for */
	spawn_stdin = fifo;
	e = spawn_ready(argv, logp, sock, !fifo, 10000, false, &hp, &hs);
	spawn_stdin = NULL;
	if (e < 0)
		return e;
	rec->host_pid = hp;
	rec->host_start = hs;
	return 0;
}

static int start_bridge(const struct mgr_config *cfg, struct mgr_rec *rec)
{
	return start_bridge_in(cfg, rec, NULL);
}

/* CONFIG on the execution's control socket, its answer awaited (job
 * children only). */
static int send_config(const char *e_dir, const char *config)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char path[4200], *msg, reply[256];
	snprintf(path, sizeof path, "%s/control.sock", e_dir);
	if (strlen(path) >= sizeof sa.sun_path || strlen(config) + 8 > MGR_CONFIG_MAX + 16)
		return SPACED_ETOOBIG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0 || asprintf(&msg, "CONFIG %s", config) < 0) {
		if (fd >= 0)
			close(fd);
		return SPACED_ENOMEM;
	}
	struct timeval tv = {.tv_sec = 5};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	ssize_t n = -1;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && send(fd, msg, strlen(msg), MSG_NOSIGNAL) > 0)
		n = recv(fd, reply, sizeof reply, 0);
	free(msg);
	close(fd);
	return n >= 2 && memcmp(reply, "OK", 2) == 0 ? 0 : SPACED_ECLOSED;
}

/* The execution's ServicePort gateway (spaced-netgtw, R5): it listens on
 * 127.0.0.1 (its port in E_DIR/gateway.port), compares every open with the
 * record the gate publishes in STATE/gw/<sandbox>/record.json and reaches
 * the guest's ports through the same guest transport, verified as the
 * bridge does (B1, B2). It ends with the launcher. Without it the execution
 * runs, its ServicePorts unreachable (logged). */
static bool gateway_bin(const struct mgr_config *cfg, char *bin, size_t binsz)
{
	char tmp[4096];
	struct stat sb;
	if (!cfg->launch_bin)
		return false;
	snprintf(tmp, sizeof tmp, "%s", cfg->launch_bin);
	const char *d = dirname(tmp);
	snprintf(bin, binsz, "%s/spaced-netgtw", d);
	if (stat(bin, &sb) < 0)
		snprintf(bin, binsz, "%s/../spaced-netgtw/spaced-netgtw", d);
	return stat(bin, &sb) == 0;
}

/* A pooled gateway's record directory, STATE/gw/.pool-<name>, made with
 * the pooled execution together with the gate's temporary file for the
 * record in it: the claim renames it to STATE/gw/<sandbox> (gw_pool_claim),
 * and neither the gateway's mkdir nor the gate's first record allocates an
 * inode during the claim (spaced_file_replace). */
static void gw_pool_dir(const struct mgr_config *cfg, const char *exec_name, char *out, size_t outsz)
{
	snprintf(out, outsz, "%s/gw/.pool-%s", cfg->state_dir,
	         strncmp(exec_name, "pool/", 5) == 0 ? exec_name + 5 : exec_name);
}

static void gw_pool_dir_remove(const char *dir)
{
	char tmp[4600];
	snprintf(tmp, sizeof tmp, "%s/" GW_RECORD_TMP, dir);
	unlink(tmp);
	rmdir(dir);
}

/* The prepared directory becomes the claiming sandbox's; when that one has
 * a directory already (an earlier execution of it ran here), it is kept and
 * the prepared one goes. The gateway makes no directory (it cannot: its
 * filter allows no mkdir), so the sandbox's is there before it learns whose
 * it is. */
static void gw_pool_claim(const struct mgr_config *cfg, const struct mgr_rec *rec)
{
	char pd[4200], sd[4200];
	if (rec->r.id.sandbox[0] == '.')
		return; /* "." and "..": never a directory of its own */
	gw_pool_dir(cfg, rec->exec_name, pd, sizeof pd);
	snprintf(sd, sizeof sd, "%s/gw/%s", cfg->state_dir, rec->r.id.sandbox);
	if (rename(pd, sd) < 0) {
		gw_pool_dir_remove(pd);
		mkdir(sd, 0700);
	}
}

/* With fifo, a pooled execution's gateway: it listens at once and reads the
 * identity of the sandbox that claims the execution from that FIFO
 * (mgr_pool_claim_finish). g: how it reaches the guest (mgr.h), NULL for the
 * process substrate's launcher. Returns 0 when it serves (or no gateway
 * binary exists: ServicePorts are then unreachable), < 0 when it did not start. */
static int start_gateway_in(const struct mgr_config *cfg, const struct mgr_rec *rec, const char *e_dir,
                            const char *logp, const char *fifo, const struct mgr_gw_guest *g)
{
	char bin[4096], tmp[4096], pf[4200], recd[4200], keys[4200], gsock[4200], lpid[32], lstart[32];
	char owner[16], vpid[32], vstart[32], cid[16], fwd[16];
	char text[SPACED_IDENTITY_TEXT_MAX] = "-";
	if (!gateway_bin(cfg, bin, sizeof bin))
		return 0;
	if (!fifo && spaced_identity_encode(&rec->r.id, text, sizeof text) < 0)
		return SPACED_EINVAL;
	snprintf(pf, sizeof pf, "%s/gateway.port", e_dir);
	snprintf(recd, sizeof recd, "%s/gw", cfg->state_dir);
	snprintf(keys, sizeof keys, "%s/keys.json", cfg->state_dir);
	if (g)
		snprintf(gsock, sizeof gsock, "%s", g->sock);
	else
		snprintf(gsock, sizeof gsock, "%s/guest.sock", e_dir);
	snprintf(lpid, sizeof lpid, "%lld", (long long)(g ? g->pid : rec->pid));
	snprintf(lstart, sizeof lstart, "%llu", (unsigned long long)(g ? g->start : rec->pid_start));
	snprintf(tmp, sizeof tmp, "%s/gw", cfg->state_dir);
	mkdir(tmp, 0700);
	if (!fifo && rec->r.id.sandbox[0] != '.') {
		/* the record directory it watches (gw_pool_claim for a pooled one) */
		char sd[4300];
		snprintf(sd, sizeof sd, "%s/%s", tmp, rec->r.id.sandbox);
		mkdir(sd, 0700);
	}
	if (fifo) {
		char pd[4200], pt[4300];
		gw_pool_dir(cfg, rec->exec_name, pd, sizeof pd);
		snprintf(pt, sizeof pt, "%s/" GW_RECORD_TMP, pd);
		if (mkdir(pd, 0700) == 0 || errno == EEXIST)
			spaced_file_prepare(pt, 0600);
	}
	char audit[4200];
	snprintf(audit, sizeof audit, "%s/audit.log", cfg->state_dir);
	const char *argv[48] = {bin, "--listen", "127.0.0.1:0", "--port-file", pf, "--record-dir", recd, "--keys", keys,
	                        "--guest", gsock, "--launcher-pid", lpid, "--launcher-start", lstart, "--launcher-exe",
	                        g ? g->exe : cfg->launch_bin, "--identity", text, "--audit", audit};
	size_t n = 21;
	if (g) {
		/* a microVM: its back-end's socket file, the VM it must serve */
		snprintf(owner, sizeof owner, "%u", (unsigned)g->owner);
		snprintf(vpid, sizeof vpid, "%lld", (long long)g->vm_pid);
		snprintf(vstart, sizeof vstart, "%llu", (unsigned long long)g->vm_start);
		snprintf(cid, sizeof cid, "%u", (unsigned)g->cid);
		snprintf(fwd, sizeof fwd, "%u", (unsigned)g->fwd_port);
		const char *more[] = {"--guest-owner", owner, "--vm-pid", vpid, "--vm-start", vstart, "--vm-exe",
		                      g->vm_exe, "--guest-cid", cid, "--forward-port", fwd};
		for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
			argv[n++] = more[i];
	}
	char lease[4200];
	if (cfg->fence_after_s > 0) {
		/* the worker's lease: the gateway keeps the fence without the gate */
		snprintf(lease, sizeof lease, "%s/lease", cfg->state_dir);
		argv[n++] = "--lease-file";
		argv[n++] = lease;
	}
	char budget[24];
	if (cfg->gateway_memory) {
		snprintf(budget, sizeof budget, "%llu", (unsigned long long)cfg->gateway_memory);
		argv[n++] = "--relay-budget";
		argv[n++] = budget;
	}
	if (cfg->api_tls_cert && cfg->api_tls_key) {
		/* TLS as node-api speaks it, with its certificate */
		argv[n++] = "--tls-cert";
		argv[n++] = cfg->api_tls_cert;
		argv[n++] = "--tls-key";
		argv[n++] = cfg->api_tls_key;
	}
	argv[n] = NULL;
	int64_t gp;
	uint64_t gs;
	unlink(pf);
	spawn_stdin = fifo;
	int e = spawn_ready(argv, logp, pf, false, 5000, false, &gp, &gs);
	spawn_stdin = NULL;
	if (e < 0)
		fprintf(stderr, "spaced-executor level=warn event=gateway-failed sandbox=%s\n",
		        fifo ? "-" : rec->r.id.sandbox);
	if (e == 0 && fifo) {
		/* a pooled one: its claim raises it (mgr_pool_claim_send) */
		char gf[4200];
		snprintf(gf, sizeof gf, "%s/gateway", e_dir);
		FILE *f = fopen(gf, "w");
		if (f) {
			fprintf(f, "pid=%lld start=%llu\n", (long long)gp, (unsigned long long)gs);
			fclose(f);
		}
	}
	return e;
}

static void start_gateway(const struct mgr_config *cfg, const struct mgr_rec *rec, const char *e_dir, const char *logp)
{
	start_gateway_in(cfg, rec, e_dir, logp, NULL, NULL);
}

int mgr_gateway_start(const struct mgr_config *cfg, const struct mgr_rec *rec, const char *logp,
                      const struct mgr_gw_guest *g)
{
	char e_dir[4096];
	int e = exec_dir(cfg, rec, e_dir, sizeof e_dir);
	return e < 0 ? e : start_gateway_in(cfg, rec, e_dir, logp, NULL, g);
}

/* spaced-launch's command line for rec (docs/substrate.md): its state
 * directory, the guest, the identity (NULL: a pooled execution learns it at
 * its claim), the template's root (NULL: the worker's own), the limits it
 * runs under (each one given is enforced or the start fails) and its uid
 * range (l->uid, which the caller may fill later); room for two more. */
struct launch_argv {
	const char *argv[32];
	size_t n;
	char cpus[16], mem[24], pids[24], disk[24], disk_bps[24], disk_iops[24], uid[16], lease[4200];
};

static void launch_argv_build(const struct mgr_config *cfg, const struct mgr_rec *rec, const char *e_dir,
                              const char *identity, const char *troot, struct launch_argv *l)
{
	size_t n = 0;
	const char **a = l->argv;
	a[n++] = cfg->launch_bin;
	a[n++] = "--state";
	a[n++] = e_dir;
	a[n++] = "--guest";
	a[n++] = cfg->guest_bin;
	if (identity) {
		a[n++] = "--identity";
		a[n++] = identity;
	}
	a[n++] = "--service-ports";
	if (troot) {
		a[n++] = "--template";
		a[n++] = troot;
	}
	if (rec->res.cpu_milli) {
		spaced_cpus_format(rec->res.cpu_milli, l->cpus);
		a[n++] = "--cpus";
		a[n++] = l->cpus;
	}
	if (rec->res.memory_bytes) {
		snprintf(l->mem, sizeof l->mem, "%llu", (unsigned long long)rec->res.memory_bytes);
		a[n++] = "--memory";
		a[n++] = l->mem;
	}
	if (rec->res.pids) {
		snprintf(l->pids, sizeof l->pids, "%llu", (unsigned long long)rec->res.pids);
		a[n++] = "--pids";
		a[n++] = l->pids;
	}
	if (rec->res.disk_bytes) {
		snprintf(l->disk, sizeof l->disk, "%llu", (unsigned long long)rec->res.disk_bytes);
		a[n++] = "--disk";
		a[n++] = l->disk;
		if (cfg->disk_bps) {
			snprintf(l->disk_bps, sizeof l->disk_bps, "%llu", (unsigned long long)cfg->disk_bps);
			a[n++] = "--disk-bps";
			a[n++] = l->disk_bps;
		}
		if (cfg->disk_iops) {
			snprintf(l->disk_iops, sizeof l->disk_iops, "%llu", (unsigned long long)cfg->disk_iops);
			a[n++] = "--disk-iops";
			a[n++] = l->disk_iops;
		}
	}
	snprintf(l->uid, sizeof l->uid, "%u", (unsigned)rec->uid_base);
	a[n++] = "--uid-base";
	a[n++] = l->uid;
	if (cfg->uid_lock_dir) {
		a[n++] = "--uid-lock";
		a[n++] = cfg->uid_lock_dir;
	}
	if (cfg->fence_after_s > 0) {
		/* the worker's lease: the launcher freezes its execution once it
		 * ended with no gate to do so */
		snprintf(l->lease, sizeof l->lease, "%s/lease", cfg->state_dir);
		a[n++] = "--lease-file";
		a[n++] = l->lease;
	}
	a[n] = NULL;
	l->n = n;
}

static int sub_start(const struct mgr_config *cfg, struct mgr_rec *rec, const char *snapshot)
{
	char e_dir[4096], ready[4200], logp[4096], dir[4096], text[SPACED_IDENTITY_TEXT_MAX];
	rec->exec_name[0] = 0; /* started for this record: exec/S.G */
	int e = exec_dir(cfg, rec, e_dir, sizeof e_dir);
	if (e < 0 || spaced_identity_encode(&rec->r.id, text, sizeof text) < 0 || !cfg->guest_bin)
		return SPACED_EINVAL;
	snprintf(dir, sizeof dir, "%s/exec", cfg->state_dir);
	if ((e = mkdirs(dir)) < 0)
		return e;
	snprintf(dir, sizeof dir, "%s/run", cfg->state_dir);
	if ((e = mkdirs(dir)) < 0)
		return e;
	snprintf(dir, sizeof dir, "%s/log", cfg->state_dir);
	if ((e = mkdirs(dir)) < 0)
		return e;
	/* a generation starts from nothing but its snapshot, in a directory of its own */
	remove_tree(e_dir);
	snprintf(ready, sizeof ready, "%s/ready", e_dir);
	snprintf(logp, sizeof logp, "%s/log/%s.log", cfg->state_dir, rec->r.id.sandbox);
	char troot[4400], why[512] = "";
	if (rec->tmpl[0]) {
		/* the template, fetched and checked against its hash before use */
		e = tmpl_ensure(cfg, rec->tmpl, rec->tmpl_url, troot, sizeof troot, NULL, why, sizeof why);
		if (e < 0) {
			fprintf(stderr, "executor: level=error event=template-unavailable hash=%s reason=\"%s\"\n", rec->tmpl,
			        why);
			return e;
		}
	}
	if (rec->uid_base == 0)
		return SPACED_EINVAL; /* every execution has a uid range of its own */
	struct launch_argv l;
	launch_argv_build(cfg, rec, e_dir, text, rec->tmpl[0] ? troot : NULL, &l);
	const char **argv = l.argv;
	size_t n = l.n;
	if (snapshot) {
		argv[n++] = "--restore";
		argv[n++] = snapshot;
	}
	argv[n] = NULL;
	int64_t lp;
	uint64_t ls;
	e = spawn_ready(argv, logp, ready, false, 30000, true, &lp, &ls);
	if (e < 0)
		return e;
	/* the sandbox's settings reach the guest before its first connection */
	if (rec->config[0] && (e = send_config(e_dir, rec->config)) < 0) {
		stop_pinned(lp, ls, true);
		return e;
	}
	struct mgr_rec r = *rec;
	r.pid = lp;
	r.pid_start = ls;
	/* its network (net.h): the egress link and its policy's filter, before
	 * any request can reach it. Without them it runs with `lo` only (a host
	 * without /dev/net/tun, pasta or nft): closed, never open — a link whose
	 * filter is missing carries nothing (the forward chain drops it). */
	char nwhy[256] = "";
	if (net_attach(cfg, &r, e_dir, nwhy, sizeof nwhy) < 0)
		fprintf(stderr, "spaced-executor level=error event=net-attach-failed sandbox=%s reason=\"%s\"\n",
		        rec->r.id.sandbox, nwhy);
	e = start_bridge(cfg, &r);
	if (e < 0) {
		stop_pinned(lp, ls, true);
		return e;
	}
	start_gateway(cfg, &r, e_dir, logp);
	*rec = r;
	return 0;
}

/* One control command to the execution's launcher (or spaced-vm); its
 * refusal's reason, when why is not NULL, into why. */
static int sub_ctl_why(const struct mgr_config *cfg, const struct mgr_rec *rec, const char *what, const char *arg,
                       char *why, size_t whysz)
{
	char e_dir[4096];
	int e = exec_dir(cfg, rec, e_dir, sizeof e_dir);
	if (e < 0)
		return e;
	/* spaced-vm (qemu substrate) speaks the same control commands */
	const char *argv[] = {mgr_vm_is(rec) ? cfg->vm_bin : cfg->launch_bin, "ctl", "--state", e_dir, what, arg, NULL};
	if (argv[0] == NULL)
		return SPACED_EINVAL;
	return mgr_run_why(argv, why, whysz);
}

static int sub_ctl(const struct mgr_config *cfg, const struct mgr_rec *rec, const char *what, const char *arg)
{
	return sub_ctl_why(cfg, rec, what, arg, NULL, 0);
}

/* ---- uid ranges ---- */

/* Marks in busy[] every slot of the worker's range some process of this host
 * runs in: its effective uid, the owner of /proc/PID (a stat, where reading
 * every process's status file took about ten times as long: ≈ 3.5 ms per pick
 * with 350 processes on a worker). Every process of an execution runs in the
 * execution's user namespace, where every id it can hold maps into its range,
 * so a process left of an old execution shows there. */
static void uids_running(const struct mgr_config *cfg, uint8_t *busy)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	uint64_t lo = cfg->uid_first, hi = lo + (uint64_t)cfg->uid_slots * 65536u;
	if (!d)
		return;
	while ((de = readdir(d)) != NULL) {
		struct stat st;
		if (de->d_name[0] < '1' || de->d_name[0] > '9' || fstatat(dirfd(d), de->d_name, &st, 0) < 0)
			continue;
		if (st.st_uid >= lo && st.st_uid < hi)
			busy[(st.st_uid - lo) / 65536u] = 1;
	}
	closedir(d);
}

/* True when a launcher holds the host-wide lock of the range at base. */
static bool uid_locked(const struct mgr_config *cfg, uint32_t base)
{
	char path[4096];
	if (!cfg->uid_lock_dir)
		return false;
	snprintf(path, sizeof path, "%s/%u.lock", cfg->uid_lock_dir, (unsigned)base);
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return true; /* cannot tell: not this one */
	bool held = flock(fd, LOCK_EX | LOCK_NB) < 0;
	close(fd); /* releases the probe's lock */
	return held;
}

/* True when no launcher holds the range at base and no process runs in it. */
static bool uid_free(const struct mgr_config *cfg, uint32_t base)
{
	if (base < cfg->uid_first || (base - cfg->uid_first) % 65536u != 0 ||
	    (base - cfg->uid_first) / 65536u >= cfg->uid_slots || uid_locked(cfg, base))
		return false;
	uint8_t *busy = calloc(cfg->uid_slots, 1);
	if (!busy)
		return false;
	uids_running(cfg, busy);
	bool free_ = !busy[(base - cfg->uid_first) / 65536u];
	free(busy);
	return free_;
}

int mgr_uid_pick(const struct mgr_config *cfg, const uint32_t *used, size_t nused, uint32_t *base)
{
	if (cfg->uid_slots == 0)
		return SPACED_EBUSY;
	uint8_t *busy = calloc(cfg->uid_slots, 1);
	if (!busy)
		return SPACED_ENOMEM;
	uids_running(cfg, busy);
	int e = SPACED_EBUSY;
	for (uint32_t k = 0; k < cfg->uid_slots; k++) {
		uint32_t b = cfg->uid_first + k * 65536u;
		bool taken = busy[k];
		for (size_t i = 0; !taken && i < nused; i++)
			taken = used[i] == b;
		if (taken || uid_locked(cfg, b))
			continue;
		*base = b;
		e = 0;
		break;
	}
	free(busy);
	return e;
}

int mgr_exec_start_fresh(const struct mgr_config *cfg, struct mgr_rec *rec, const char *snapshot, const uint32_t *used,
                         size_t nused, char *why, size_t whysz)
{
	if (!substrate_mode(cfg))
		return mgr_exec_start(cfg, rec, snapshot);
	uint32_t *skip = calloc(nused + 16, sizeof *skip);
	if (!skip)
		return SPACED_ENOMEM;
	memcpy(skip, used, nused * sizeof *used);
	size_t nskip = nused;
	int e = SPACED_EBUSY;
	/* Another worker's launcher may take a range between the check and this
	 * launcher's lock: then the launch fails on the lock and the next range
	 * is tried. */
	for (int attempt = 0; attempt < 16; attempt++) {
		uint32_t base;
		if (attempt == 0 && rec->uid_base != 0 && uid_free(cfg, rec->uid_base)) {
			base = rec->uid_base; /* a restart keeps its range while it is free */
		} else if ((e = mgr_uid_pick(cfg, skip, nskip, &base)) < 0) {
			break;
		}
		rec->uid_base = base;
		e = mgr_exec_start(cfg, rec, snapshot);
		if (e == 0 || !uid_locked(cfg, base))
			break;
		skip[nskip++] = base;
	}
	free(skip);
	if (e == SPACED_EBUSY)
		snprintf(why, whysz, "every uid range of this worker is in use");
	else if (e < 0)
		snprintf(why, whysz, "cannot start the execution: %s", spaced_strerror(e));
	return e;
}

/* ---- usage ---- */

int mgr_exec_usage(const struct mgr_config *cfg, const struct mgr_rec *rec, json_t **out)
{
	char e_dir[4096], reply[512];
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (!substrate_mode(cfg))
		return SPACED_EPERM; /* development executions have no cgroups of their own */
	int e = exec_dir(cfg, rec, e_dir, sizeof e_dir);
	if (e < 0)
		return e;
	char path[4200];
	int pl = snprintf(path, sizeof path, "%s/control.sock", e_dir);
	if (pl < 0 || (size_t)pl >= sizeof sa.sun_path)
		return SPACED_ETOOBIG;
	memcpy(sa.sun_path, path, (size_t)pl + 1);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return SPACED_ESYS;
	struct timeval tv = {.tv_sec = 1};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	ssize_t n = -1;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && send(fd, "USAGE", 5, MSG_NOSIGNAL) == 5)
		n = recv(fd, reply, sizeof reply - 1, 0);
	close(fd);
	if (n <= 0)
		return SPACED_ECLOSED;
	reply[n] = '\0';
	long long cpu_usec, mem, peak, ooms, pids;
	unsigned long long disk, disk_total;
	unsigned pct, pct10;
	if (sscanf(reply,
	           "OK cpu_usec=%lld cpu_pct=%u.%u memory=%lld memory_peak=%lld oom_kills=%lld pids=%lld disk=%llu "
	           "disk_total=%llu",
	           &cpu_usec, &pct, &pct10, &mem, &peak, &ooms, &pids, &disk, &disk_total) != 9)
		return SPACED_EPROTO;
	json_t *o = json_object();
	if (!o)
		return SPACED_ENOMEM;
	json_object_set_new(o, "cpu_pct", json_real(pct + pct10 / 10.0));
	json_object_set_new(o, "cpu_usec", json_integer(cpu_usec));
	json_object_set_new(o, "memory_bytes", json_integer(mem));
	json_object_set_new(o, "memory_peak_bytes", json_integer(peak));
	json_object_set_new(o, "oom_kills", json_integer(ooms));
	json_object_set_new(o, "pids", json_integer(pids));
	json_object_set_new(o, "disk_bytes", json_integer((json_int_t)disk));
	json_object_set_new(o, "disk_total", json_integer((json_int_t)disk_total));
	/* the CPUs the spread rule holds it to (docs/substrate.md), null when free */
	const char *held = strstr(reply, " cpus_held=");
	char hl[256] = "";
	if (held && sscanf(held, " cpus_held=%255[0-9,-]", hl) == 1 && hl[0] != '-')
		json_object_set_new(o, "cpus_held", json_string(hl));
	else
		json_object_set_new(o, "cpus_held", json_null());
	*out = o;
	return 0;
}

/* ---- the interface ---- */

int mgr_exec_start(const struct mgr_config *cfg, struct mgr_rec *rec, const char *snapshot)
{
	if (mgr_vm_is(rec))
		return mgr_vm_start(cfg, rec, snapshot);
	if (substrate_mode(cfg))
		return sub_start(cfg, rec, snapshot);
	return dev_start(cfg->state_dir, cfg->guest_bin, rec, snapshot);
}

int mgr_exec_pause(const struct mgr_config *cfg, const struct mgr_rec *rec, bool pause)
{
	if (!mgr_exec_alive(rec))
		return SPACED_ENOENT;
	if (substrate_mode(cfg))
		return sub_ctl(cfg, rec, pause ? "PAUSE" : "THAW", NULL);
	return dev_signal(rec, pause ? SIGSTOP : SIGCONT);
}

void mgr_exec_stop(const struct mgr_config *cfg, struct mgr_rec *rec)
{
	if (substrate_mode(cfg)) {
		char e_dir[4096];
		if (mgr_exec_alive(rec))
			sub_ctl(cfg, rec, "THAW", NULL);
		stop_pinned(rec->pid, rec->pid_start, true);
		stop_pinned(rec->host_pid, rec->host_start, false);
		net_release(cfg, rec);
		char sock[4200]; /* its bridge's: no other execution ever listens there */
		if (mgr_exec_target(cfg, rec, sock, sizeof sock) == 0)
			unlink(sock);
		if (exec_dir(cfg, rec, e_dir, sizeof e_dir) == 0) {
			const char *rm[] = {"rm", "-rf", "--", e_dir, NULL};
			mgr_run_wait(rm);
		}
		if (strncmp(rec->exec_name, "pool/", 5) == 0) {
			/* a pooled execution never claimed (the pool shrank), or whose
			 * claim failed: what was made for its claim goes with it */
			char p[4200];
			gw_pool_dir(cfg, rec->exec_name, p, sizeof p);
			gw_pool_dir_remove(p);
			mgr_pool_claim_ended(cfg, rec->exec_name);
		}
		rec->pid = rec->pid_start = 0;
		rec->host_pid = 0;
		rec->host_start = 0;
		return;
	}
	dev_stop(rec);
}

int mgr_exec_rebridge(const struct mgr_config *cfg, struct mgr_rec *rec)
{
	if (!substrate_mode(cfg))
		return 0;
	stop_pinned(rec->host_pid, rec->host_start, false);
	struct mgr_rec r = *rec;
	int e = mgr_vm_is(rec) ? mgr_vm_bridge(cfg, &r) : start_bridge(cfg, &r);
	if (e == 0)
		*rec = r;
	return e;
}

int mgr_exec_activate(const struct mgr_config *cfg, struct mgr_rec *rec, bool thaw)
{
	char text[SPACED_IDENTITY_TEXT_MAX];
	int e;
	if (!mgr_exec_alive(rec))
		return SPACED_ENOENT;
	if (!substrate_mode(cfg))
		return thaw ? dev_signal(rec, SIGCONT) : 0; /* development mode: the guest keeps its identity */
	if (thaw && (e = sub_ctl(cfg, rec, "THAW", NULL)) < 0)
		return e;
	if (spaced_identity_encode(&rec->r.id, text, sizeof text) < 0)
		return SPACED_EINVAL;
	/* the guest answers with the new identity from here; the bridge that
	 * checks its answers is started again with it */
	if ((e = sub_ctl(cfg, rec, "IDENTITY", text)) < 0)
		return e;
	return mgr_exec_rebridge(cfg, rec);
}

int mgr_exec_snapshot(const struct mgr_config *cfg, const struct mgr_rec *rec, const char *path,
                      uint64_t *bytes, char *why, size_t whysz)
{
	if (!substrate_mode(cfg))
		return dev_snapshot(cfg->state_dir, rec, path, bytes);
	struct stat sb;
	if (!path || path[0] != '/')
		return SPACED_EINVAL;
	if (lstat(path, &sb) == 0)
		return SPACED_EEXIST;
	char msg[512] = "";
	if (sub_ctl_why(cfg, rec, "SNAPSHOT", path, msg, sizeof msg) < 0) {
		/* the launcher's refusal ("ERR snapshot: …"), written in the
		 * sandbox's own paths, is the tenant's to read; anything else
		 * (spaced-vm's, a launcher that did not answer) names the host's */
		bool own = !mgr_vm_is(rec) && strncmp(msg, "ERR snapshot: ", 14) == 0;
		spaced_utf8_clean(msg);
		spaced_why(why, whysz, "%s", own ? msg + 14 : spaced_strerror(SPACED_EIO));
		return SPACED_EIO;
	}
	snap_bytes = 0;
	if (nftw(path, sum_cb, 16, FTW_PHYS) < 0)
		return SPACED_EIO;
	*bytes = snap_bytes;
	return 0;
}

/* ---- snapshots arriving from a store the control plane names ---- */

static bool hash_hex_valid(const char *h)
{
	if (!h || strlen(h) != MGR_HASH_HEX - 1)
		return false;
	for (const char *p = h; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	return true;
}

int mgr_exec_stage_snapshot(const struct mgr_config *cfg, const char *sandbox, const char *src,
                            const char *want, char *staged, size_t stagedsz)
{
	char dir[4096], got[MGR_HASH_HEX];
	struct stat sb;
	int e;
	bool remote = src && strncmp(src, "http", 4) == 0;
	if (!src || (src[0] != '/' && !remote) || !spaced_name_valid(sandbox, strlen(sandbox)))
		return SPACED_EINVAL;
	if (!hash_hex_valid(want))
		return SPACED_EIDENTITY; /* nothing starts from an unverified snapshot */
	if (!remote && (lstat(src, &sb) < 0 || !S_ISDIR(sb.st_mode)))
		return SPACED_ENOENT;
	snprintf(dir, sizeof dir, "%s/stage", cfg->state_dir);
	if ((e = mkdirs(dir)) < 0)
		return e;
	if (snprintf(dir, sizeof dir, "%s/stage/%s", cfg->state_dir, sandbox) >= (int)sizeof dir ||
	    strlen(dir) >= stagedsz)
		return SPACED_ETOOBIG;
	/* the private copy is the one verified and the one restored: what is
	 * checked cannot change in the shared store afterwards */
	const char *rm[] = {"rm", "-rf", "--", dir, NULL};
	if (remote) {
		/* from the control plane's store: the archive, then the tree it
		 * holds (only what spaced_rootfs_pack_dir writes is accepted) */
		char tarp[4200], why[512] = "";
		snprintf(tarp, sizeof tarp, "%s.tar", dir);
		unlink(tarp);
		mgr_run_wait(rm);
		e = fetch_blob(cfg, src, tarp, UINT64_C(1) << 40, why, sizeof why);
		if (e == 0)
			e = spaced_rootfs_extract(tarp, dir, SPACED_ROOTFS_X_SNAPSHOT, NULL, why, sizeof why);
		unlink(tarp);
		if (e < 0) {
			fprintf(stderr, "executor: level=warn event=snapshot-fetch-failed url=%s reason=\"%s\"\n", src, why);
			mgr_run_wait(rm);
			return e == SPACED_EFORMAT ? SPACED_EIDENTITY : e;
		}
	} else {
		const char *cp[] = {"cp", "-a", "--", src, dir, NULL};
		if (mgr_run_wait(rm) < 0 || mgr_run_wait(cp) < 0) {
			mgr_run_wait(rm);
			return SPACED_EIO;
		}
	}
	e = mgr_snapshot_hash(dir, got, NULL);
	if (e == 0 && !spaced_ct_eq(got, want, MGR_HASH_HEX - 1))
		e = SPACED_EIDENTITY;
	if (e < 0) {
		mgr_run_wait(rm);
		return e;
	}
	memcpy(staged, dir, strlen(dir) + 1);
	return 0;
}

void mgr_exec_unstage(const char *staged)
{
	if (!staged || !*staged)
		return;
	const char *rm[] = {"rm", "-rf", "--", staged, NULL};
	mgr_run_wait(rm);
}

/* ---- shared with mgr_vm.c (mgr.h) ---- */

int mgr_mkdirs(const char *path)
{
	return mkdirs(path);
}

int mgr_exec_dir(const struct mgr_config *cfg, const struct mgr_rec *rec, char *out, size_t outsz)
{
	return exec_dir(cfg, rec, out, outsz);
}

int mgr_spawn_ready(const char *const argv[], const char *logp, const char *path, bool want_sock, int timeout_ms,
                    bool group, int64_t *pid, uint64_t *start)
{
	return spawn_ready(argv, logp, path, want_sock, timeout_ms, group, pid, start);
}

void mgr_stop_pinned(int64_t pid, uint64_t start, bool group)
{
	stop_pinned(pid, start, group);
}

/* ---- the warm pool's executions ---- */

/* Proportional set size of a process, KiB (0 when unknown). */
static uint64_t pss_of(int64_t pid)
{
	char path[64], line[256];
	uint64_t kib = 0;
	snprintf(path, sizeof path, "/proc/%lld/smaps_rollup", (long long)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "Pss: %" SCNu64, &kib) == 1)
			break;
	fclose(f);
	return kib;
}

/* Reads lines from fd until one starts with want (up to ms). */
static int wait_line(int fd, const char *want, int ms)
{
	char buf[256];
	size_t n = 0;
	uint64_t end = spaced_mono_ns() + (uint64_t)ms * 1000000u;
	for (;;) {
		uint64_t now = spaced_mono_ns();
		if (now >= end)
			return SPACED_ETIMEDOUT;
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int r = poll(&p, 1, (int)((end - now) / 1000000u) + 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return SPACED_ETIMEDOUT;
		ssize_t got = read(fd, buf + n, sizeof buf - 1 - n);
		if (got <= 0)
			return SPACED_ECLOSED;
		n += (size_t)got;
		buf[n] = 0;
		char *nl;
		while ((nl = strchr(buf, '\n')) != NULL) {
			*nl = 0;
			if (strncmp(buf, want, strlen(want)) == 0)
				return 0;
			memmove(buf, nl + 1, n - (size_t)(nl + 1 - buf) + 1);
			n -= (size_t)(nl + 1 - buf);
		}
		if (n == sizeof buf - 1)
			n = 0;
	}
}

/* The claim FIFOs of a pooled execution: STATE/run/<name>.in (its bridge's)
 * and .gw (its gateway's), into p[i]. */
static void claim_fifos(const struct mgr_config *cfg, const char *exec_name, char p[2][4200])
{
	static const char *const fifos[] = {"in", "gw"};
	for (size_t i = 0; i < 2; i++)
		snprintf(p[i], sizeof p[i], "%s/run/%s.%s", cfg->state_dir,
		         strncmp(exec_name, "pool/", 5) == 0 ? exec_name + 5 : exec_name, fifos[i]);
}

int mgr_pool_exec_start(const struct mgr_config *cfg, const char *name, struct mgr_rec *rec, const uint32_t *used,
                        size_t nused, uint64_t *pss_kib, char *why, size_t whysz)
{
	char e_dir[4096], dir[4096], logp[4096], troot[4400];
	int e;
	if (!substrate_mode(cfg) || !cfg->guest_bin || !spaced_name_valid(name, strlen(name)))
		return SPACED_EINVAL;
	static const char *const subdirs[] = {"pool", "run", "log"};
	for (size_t i = 0; i < 3; i++) {
		snprintf(dir, sizeof dir, "%s/%s", cfg->state_dir, subdirs[i]);
		if ((e = mkdirs(dir)) < 0)
			return e;
	}
	snprintf(rec->exec_name, sizeof rec->exec_name, "pool/%s", name);
	if ((e = exec_dir(cfg, rec, e_dir, sizeof e_dir)) < 0)
		return e;
	/* in the background CPU cgroup from the start: the template's fetch and
	 * check too (below) */
	(void)spaced_sub_background_cpu_join(NULL, 0);
	const char *rm[] = {"rm", "-rf", "--", e_dir, NULL};
	remove_tree(e_dir);
	snprintf(logp, sizeof logp, "%s/log/pool.log", cfg->state_dir);
	if (rec->tmpl[0] && (e = tmpl_ensure(cfg, rec->tmpl, rec->tmpl_url, troot, sizeof troot, NULL, why, whysz)) < 0)
		return e;
	/* the limits of the sandbox that will claim it (the pool is keyed by
	 * them); its uid range is filled in below, once picked */
	struct launch_argv l;
	launch_argv_build(cfg, rec, e_dir, NULL, rec->tmpl[0] ? troot : NULL, &l);
	const char **argv = l.argv;
	/* started in the background: below the priority of creates and requests
	 * (it is raised back when claimed). A nice value weighs only against
	 * the tasks of the same session (the kernel's autogroups): in the
	 * executor's, this job and its helpers (ip, tc, nft) took a whole
	 * session's share whenever the executor itself waited — as much CPU as
	 * the gate's or the control plane's during a burst of creates. In a
	 * session of its own, niced, each start still weighed a tenth of a
	 * create's processes: in a burst of 50 creates, the tc and ip of the
	 * refills it set off took 18 % of the host's CPU (perf, the burst's
	 * window; 0-2 % now). So all starts share one CPU cgroup weighed at 1/32
	 * (a pooled execution's launcher, bridge and gateway leave it when the
	 * start is over: left_background); the session and nice value stay, for
	 * the waiting execution and for a host without a CPU controller (joined
	 * above). */
	setsid();
	spaced_session_nice(getpid(), POOL_NICE);
	setpriority(PRIO_PROCESS, 0, POOL_NICE);
	/* a uid range of its own, as every execution (mgr_exec_start_fresh) */
	uint32_t skip[64];
	size_t nskip = 0;
	int64_t lp = 0;
	uint64_t ls = 0;
	int out[2] = {-1, -1};
	e = SPACED_EBUSY;
	for (int attempt = 0; attempt < 16; attempt++) {
		uint32_t *all = calloc(nused + nskip + 1, sizeof *all);
		if (!all)
			return SPACED_ENOMEM;
		memcpy(all, used, nused * sizeof *used);
		memcpy(all + nused, skip, nskip * sizeof *skip);
		uint32_t base = 0;
		e = mgr_uid_pick(cfg, all, nused + nskip, &base);
		free(all);
		if (e < 0)
			break;
		rec->uid_base = base;
		snprintf(l.uid, sizeof l.uid, "%u", (unsigned)base);
		if (pipe2(out, O_CLOEXEC) < 0)
			return SPACED_ESYS;
		spawn_stdout = out[1];
		e = spawn_logged(argv, logp, &lp, &ls);
		spawn_stdout = -1;
		close(out[1]);
		if (e == 0)
			e = wait_line(out[0], "POOLED", 30000);
		close(out[0]);
		if (e == 0)
			break;
		stop_pinned(lp, ls, true);
		mgr_run_wait(rm);
		if (!uid_locked(cfg, base) || nskip == sizeof skip / sizeof skip[0])
			break;
		skip[nskip++] = base;
	}
	if (e < 0) {
		snprintf(why, whysz, e == SPACED_EBUSY ? "every uid range of this worker is in use"
		                                       : "the pooled execution did not come up: %s",
		         spaced_strerror(e));
		return e;
	}
	rec->pid = lp;
	rec->pid_start = ls;
	/* its network made now, closed until a sandbox claims it (net.h) */
	if ((e = net_attach_pooled(cfg, rec, e_dir, why, whysz)) < 0) {
		stop_pinned(lp, ls, true);
		mgr_run_wait(rm);
		return e;
	}
	char fifos[2][4200];
	claim_fifos(cfg, name, fifos);
	unlink(fifos[0]);
	if (mkfifo(fifos[0], 0600) < 0 || (e = start_bridge_in(cfg, rec, fifos[0])) < 0) {
		snprintf(why, whysz, "the pooled execution's bridge did not start");
		stop_pinned(lp, ls, true);
		mgr_run_wait(rm);
		unlink(fifos[0]);
		return e < 0 ? e : SPACED_ESYS;
	}
	/* its ServicePort gateway, listening already; it ends with the launcher */
	unlink(fifos[1]);
	if (mkfifo(fifos[1], 0600) < 0 || (e = start_gateway_in(cfg, rec, e_dir, logp, fifos[1], NULL)) < 0) {
		snprintf(why, whysz, "the pooled execution's ServicePort gateway did not start");
		stop_pinned(rec->host_pid, rec->host_start, false);
		stop_pinned(lp, ls, true);
		mgr_run_wait(rm);
		mgr_pool_claim_ended(cfg, name);
		return e < 0 ? e : SPACED_ESYS;
	}
	/* its bridge, for a reap after a restart of the gate */
	char lf[4200], text[256] = "";
	snprintf(lf, sizeof lf, "%s/bridge", e_dir);
	snprintf(text, sizeof text, "pid=%lld start=%llu\n", (long long)rec->host_pid,
	         (unsigned long long)rec->host_start);
	FILE *bf = fopen(lf, "w");
	if (bf) {
		fputs(text, bf);
		fclose(bf);
	}
	text[0] = 0;
	/* what it costs while it waits: launcher, guest, bridge */
	long long init = 0;
	snprintf(lf, sizeof lf, "%s/launcher", e_dir);
	FILE *f = fopen(lf, "r");
	if (f) {
		if (fgets(text, sizeof text, f) && strstr(text, "init="))
			init = atoll(strstr(text, "init=") + 5);
		fclose(f);
	}
	*pss_kib = pss_of(lp) + (init > 0 ? pss_of(init) : 0) + pss_of(rec->host_pid);
	/* started: its launcher, bridge and gateway wait in the executor's CPU
	 * cgroup (left_background) */
	long long gpid = 0;
	unsigned long long gstart = 0;
	each_pinned(lp, ls, false, left_background);
	each_pinned(rec->host_pid, rec->host_start, false, left_background);
	if (pinned_in(e_dir, "gateway", &gpid, &gstart))
		each_pinned(gpid, gstart, true, left_background);
	return 0;
}

int mgr_pool_claim_send(const struct mgr_config *cfg, const struct mgr_rec *rec, int *ctl_fd, int *answers, char *why,
                        size_t whysz)
{
	char e_dir[4096], ctlp[4200], text[SPACED_IDENTITY_TEXT_MAX], cmd[SPACED_IDENTITY_TEXT_MAX + 16];
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int e = exec_dir(cfg, rec, e_dir, sizeof e_dir);
	if (e < 0 || !rec->exec_name[0] || spaced_identity_encode(&rec->r.id, text, sizeof text) < 0)
		return SPACED_EINVAL;
	int pfd = pidfd_pinned(rec->pid, rec->pid_start);
	if (pfd < 0) {
		snprintf(why, whysz, "the pooled execution is gone");
		return SPACED_ECLOSED;
	}
	/* it was started below the gate's priority, like its siblings in the
	 * pool: from now on it is a sandbox's (its claim, below, included) */
	raise_pinned((pid_t)rec->pid);
	close(pfd);
	snprintf(ctlp, sizeof ctlp, "%s/control.sock", e_dir);
	if (strlen(ctlp) >= sizeof sa.sun_path)
		return SPACED_ETOOBIG;
	memcpy(sa.sun_path, ctlp, strlen(ctlp) + 1);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	int n = snprintf(cmd, sizeof cmd, "IDENTITY %s", text);
	/* the sandbox's settings first: the guest takes its messages in order */
	char *config_msg = NULL;
	if (rec->config[0] && asprintf(&config_msg, "CONFIG %s", rec->config) < 0) {
		if (fd >= 0)
			close(fd);
		return SPACED_ENOMEM;
	}
	/* a listening SEQPACKET socket accepts the connection at once (backlog) */
	bool sent_config = fd >= 0 && config_msg && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
	                   send(fd, config_msg, strlen(config_msg), MSG_NOSIGNAL) == (ssize_t)strlen(config_msg);
	free(config_msg);
	if (fd < 0 || (rec->config[0] && !sent_config) ||
	    (!rec->config[0] && connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) ||
	    send(fd, cmd, (size_t)n, MSG_NOSIGNAL) != n) {
		snprintf(why, whysz, "the pooled execution's launcher does not answer: %s", strerror(errno));
		if (fd >= 0)
			close(fd);
		return SPACED_ECLOSED;
	}
	/* the bridge learns the identity it must reach; the gate's first
	 * connection waits in its backlog meanwhile */
	char fifos[2][4200];
	claim_fifos(cfg, rec->exec_name, fifos);
	int ff = open(fifos[0], O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
	n = snprintf(cmd, sizeof cmd, "%s\n", text);
	if (ff < 0 || write(ff, cmd, (size_t)n) != n) {
		if (ff >= 0)
			close(ff);
		close(fd);
		snprintf(why, whysz, "the pooled execution's bridge does not take its identity");
		return SPACED_ECLOSED;
	}
	close(ff);
	/* its bridge and gateway too (the launcher was raised above) */
	each_pinned(rec->host_pid, rec->host_start, false, raise_pinned);
	char lf[4200], line[256];
	snprintf(lf, sizeof lf, "%s/launcher", e_dir);
	FILE *f = fopen(lf, "r");
	if (f) {
		long long init = 0;
		if (fgets(line, sizeof line, f) && strstr(line, "init=") && (init = atoll(strstr(line, "init=") + 5)) > 0)
			setpriority(PRIO_PROCESS, (id_t)init, 0);
		fclose(f);
	}
	long long gpid = 0;
	unsigned long long gstart = 0;
	if (pinned_in(e_dir, "gateway", &gpid, &gstart))
		each_pinned(gpid, gstart, true, raise_pinned);
	*ctl_fd = fd;
	*answers = rec->config[0] ? 2 : 1;
	return 0;
}

bool mgr_pool_claim_inline(const struct mgr_config *cfg, const struct mgr_rec *rec, json_t *network)
{
	char bin[4096];
	struct stat st;
	if (json_is_object(network) && !net_policy_is_default(network))
		return false;
	if (net_enabled(cfg) && net_policy_stored(cfg, rec->r.id.sandbox))
		return false;
	if (!gateway_bin(cfg, bin, sizeof bin))
		return true;
	char fifos[2][4200];
	claim_fifos(cfg, rec->exec_name, fifos);
	return lstat(fifos[1], &st) == 0 && S_ISFIFO(st.st_mode);
}

int mgr_pool_claim_finish(const struct mgr_config *cfg, const struct mgr_rec *rec, bool may_start, int *gateway_port)
{
	char e_dir[4096], logp[4096];
	*gateway_port = 0;
	if (exec_dir(cfg, rec, e_dir, sizeof e_dir) < 0)
		return SPACED_EINVAL;
	snprintf(logp, sizeof logp, "%s/log/%s.log", cfg->state_dir, rec->r.id.sandbox);
	/* the gateway started with the pooled execution takes its identity
	 * (mgr_pool_exec_start); one started before pooled gateways existed has
	 * no FIFO and one is started now */
	char fifos[2][4200], text[SPACED_IDENTITY_TEXT_MAX + 1];
	claim_fifos(cfg, rec->exec_name, fifos);
	int ff = open(fifos[1], O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
	if (ff >= 0) {
		gw_pool_claim(cfg, rec);
		int n = spaced_identity_encode(&rec->r.id, text, sizeof text - 1);
		bool sent = n > 0 && (text[n] = '\n', write(ff, text, (size_t)n + 1) == n + 1);
		close(ff);
		if (!sent)
			return SPACED_ECLOSED;
	} else if (!may_start) {
		int err = errno;
		char bin[4096];
		if (!gateway_bin(cfg, bin, sizeof bin))
			return 0; /* a worker without gateways: none waits, none is missed */
		return err == ENOENT || err == ENXIO ? SPACED_ECLOSED : SPACED_ESYS;
	} else {
		start_gateway(cfg, rec, e_dir, logp);
	}
	return mgr_pool_gateway_port(cfg, rec, gateway_port);
}

void mgr_pool_claim_ended(const struct mgr_config *cfg, const char *exec_name)
{
	char p[2][4200];
	claim_fifos(cfg, exec_name, p);
	for (size_t i = 0; i < 2; i++)
		unlink(p[i]);
}

bool mgr_pool_claim_unfinished(const struct mgr_config *cfg, const struct mgr_rec *rec)
{
	char p[2][4200];
	struct stat st;
	if (strncmp(rec->exec_name, "pool/", 5) != 0)
		return false;
	claim_fifos(cfg, rec->exec_name, p);
	return lstat(p[0], &st) == 0 || lstat(p[1], &st) == 0;
}

int mgr_pool_gateway_port(const struct mgr_config *cfg, const struct mgr_rec *rec, int *gateway_port)
{
	char e_dir[4096], pf[4200];
	*gateway_port = 0;
	if (exec_dir(cfg, rec, e_dir, sizeof e_dir) < 0)
		return SPACED_EINVAL;
	snprintf(pf, sizeof pf, "%s/gateway.port", e_dir);
	FILE *f = fopen(pf, "r");
	if (f) {
		if (fscanf(f, "%d", gateway_port) != 1 || *gateway_port <= 0 || *gateway_port > 65535)
			*gateway_port = 0;
		fclose(f);
	}
	return 0;
}

int mgr_pool_claim_done(int ctl_fd, int *answers, char *why, size_t whysz)
{
	char reply[256];
	while (*answers > 0) {
		ssize_t got = recv(ctl_fd, reply, sizeof reply - 1, MSG_DONTWAIT);
		if (got < 0 && (errno == EAGAIN || errno == EINTR))
			return SPACED_EBUSY;
		if (got < 2 || memcmp(reply, "OK", 2) != 0) {
			reply[got > 0 ? got : 0] = 0;
			snprintf(why, whysz, "the launcher refused the claim: %.200s", got > 0 ? reply : "no answer");
			return SPACED_EPROTO;
		}
		(*answers)--;
	}
	return 0;
}

void mgr_pool_exec_reap(const struct mgr_config *cfg, const char *const *keep, size_t nkeep)
{
	char dir[4096];
	snprintf(dir, sizeof dir, "%s/pool", cfg->state_dir);
	DIR *d = opendir(dir);
	struct dirent *de;
	if (!d)
		return;
	while ((de = readdir(d)) != NULL) {
		char name[40], e_dir[4400], lf[4500], text[256] = "", sock[4500];
		/* "." and ".." are valid names, and never a pooled execution's */
		if (de->d_name[0] == '.' || !spaced_name_valid(de->d_name, strlen(de->d_name)) || strlen(de->d_name) > 20)
			continue;
		snprintf(name, sizeof name, "pool/%.30s", de->d_name);
		bool kept = false;
		for (size_t i = 0; i < nkeep && !kept; i++)
			kept = strcmp(keep[i], name) == 0;
		if (kept)
			continue;
		snprintf(e_dir, sizeof e_dir, "%s/%s", dir, de->d_name);
		static const char *const files[] = {"bridge", "launcher"};
		for (int i = 0; i < 2; i++) {
			snprintf(lf, sizeof lf, "%s/%s", e_dir, files[i]);
			FILE *f = fopen(lf, "r");
			if (!f)
				continue;
			long long pid = 0;
			unsigned long long start = 0;
			if (fgets(text, sizeof text, f) && sscanf(text, "pid=%lld start=%llu", &pid, &start) == 2)
				stop_pinned(pid, start, i == 1);
			fclose(f);
		}
		snprintf(sock, sizeof sock, "%s/run/%s.sock", cfg->state_dir, de->d_name);
		unlink(sock);
		mgr_pool_claim_ended(cfg, de->d_name);
		gw_pool_dir(cfg, name, sock, sizeof sock);
		gw_pool_dir_remove(sock);
		const char *rm[] = {"rm", "-rf", "--", e_dir, NULL};
		mgr_run_wait(rm);
	}
	closedir(d);
}
