/*
 * cmd_dev.c — a development cluster on this machine:
 *   dev up [--workers N] [--dir DIR] [--substrate process|qemu|dev] [--stall-timeout S] [--log-format text|json]
 *          [--pool N] [--disk-io bps=SIZE,iops=N] [--allocatable memory=SIZE,pids=N] [--net-rate BITS]
 *          [--disk-reserve SIZE] [--net-openable CIDR[,CIDR]...] [--net-closed CIDR[,CIDR]...] [--net-conns N]
 *          [--cpu-latency-us N] [--request-cpu weight=N,max=CPUS,pin=CPU|last|off] [--plaintext]
 *   dev down [--dir DIR]
 *   dev status [--dir DIR]
 *   dev certs [--dir DIR] [--workers N]
 * `up` starts a control plane (SQLite, DIR/cp), N workers (spaced-node in
 * DIR/worker-K, each joining the control plane itself with a join token of
 * its own) on loopback ports, creates a tenant and its API key and writes
 * DIR/env. Every process started is recorded
 * in DIR/pids as "NAME PID STARTTIME" (the start time pins the process: a
 * reused PID is never signalled). A keeper process (recorded as "keeper")
 * starts the control plane or a worker again, on the same port, when it
 * dies, and keeps DIR/pids up to date; `down` stops the keeper first. Binaries are looked up next to spacectl
 * (BUILD/spacectl/../spaced-cp/…) or under $SPACED_BUILD.
 *
 * TLS (unless --plaintext): `up` makes a CA of its own in DIR/tls (ca.pem,
 * ca.key) and issues with it a server certificate for the control plane
 * (cp.pem) and for each worker's node-api (worker-K.pem), each naming
 * 127.0.0.1 and localhost, and a client certificate per worker whose name is
 * its worker ID (worker-K-client.pem); keys are 0600. Every listener then
 * speaks TLS, the control plane wants the workers' client certificates on
 * the worker endpoints (mutual TLS), and DIR/env holds SPACED_CA_FILE.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"
#include "cmd_ops.h"
#include "http_client.h"
#include "net.h"
#include "tls.h"

#define DEV_MAX_WORKERS 16

static const char usage_dev[] =
	"usage: spacectl dev up [--workers N] [--dir DIR] [--substrate process|qemu|dev] [--stall-timeout S]\n"
	"                       [--log-format text|json] [--pool N] [--disk-io bps=SIZE,iops=N]\n"
	"                       [--allocatable memory=SIZE,pids=N] [--net-rate BITS] [--disk-reserve SIZE]\n"
	"                       [--net-openable CIDR[,CIDR]...] [--net-closed CIDR[,CIDR]...] [--net-conns N]\n"
	"                       [--cpu-latency-us N] [--fence-after S] [--ack-timeout MS]\n"
	"                       [--request-cpu weight=N,max=CPUS,pin=CPU|last|off] [--plaintext]\n"
	"       spacectl dev down [--dir DIR]\n"
	"       spacectl dev certs [--dir DIR] [--workers N]    (only DIR/tls: the CA and certificates up makes)\n"
	"       spacectl dev status [--dir DIR]\n"
	"  DIR defaults to $SPACED_DEV_DIR, else ./.spaced-dev\n";

static char build_dir[PATH_MAX];

static int find_build(void)
{
	const char *b = getenv("SPACED_BUILD");
	if (b != NULL && b[0]) {
		snprintf(build_dir, sizeof build_dir, "%s", b);
		return 0;
	}
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0)
		return -1;
	self[n] = 0;
	char *s = strrchr(self, '/'); /* BUILD/spacectl/spacectl */
	if (s == NULL)
		return -1;
	*s = 0;
	s = strrchr(self, '/');
	if (s == NULL)
		return -1;
	*s = 0;
	snprintf(build_dir, sizeof build_dir, "%s", self);
	return 0;
}

static int bin(char *out, size_t outsz, const char *rel)
{
	int n = snprintf(out, outsz, "%s/%s", build_dir, rel);
	if (n < 0 || (size_t)n >= outsz)
		return -1;
	return access(out, X_OK);
}

static unsigned long long start_time(pid_t pid)
{
	char p[64], buf[2048];
	snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
	FILE *f = fopen(p, "r");
	if (f == NULL)
		return 0;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	char *e = strrchr(buf, ')');
	if (e == NULL)
		return 0;
	char state = 0;
	unsigned long long st = 0;
	/* fields after the name: state(3) … starttime(22) */
	if (sscanf(e + 2, "%c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &state,
	           &st) != 2)
		return 0;
	if (state == 'Z' || state == 'X')
		return 0; /* ended */
	return st;
}

/* A writable copy of argv for execv (in the child, before exec). */
static char **argv_copy(const char *const argv[])
{
	size_t n = 0;
	while (argv[n] != NULL)
		n++;
	char **v = calloc(n + 1, sizeof *v);
	for (size_t i = 0; v != NULL && i < n; i++)
		if ((v[i] = strdup(argv[i])) == NULL)
			return NULL;
	return v;
}

/* Starts argv in the background in its own session, output to log. */
static pid_t spawn_log(const char *const argv[], const char *log, bool again);

static pid_t spawn(const char *const argv[], const char *log)
{
	return spawn_log(argv, log, false);
}

/* again (the keeper starting a process again): its log must still be there,
 * else the child ends at once (127) and nothing is made: the cluster's
 * directory is being removed, and a log made anew would keep it (rm -rf's
 * last rmdir fails), and its cluster with it */
static pid_t spawn_log(const char *const argv[], const char *log, bool again)
{
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	char **av = argv_copy(argv);
	if (av == NULL)
		_exit(127);
	setsid();
	int in = open("/dev/null", O_RDONLY), out = open(log, O_WRONLY | O_APPEND | (again ? 0 : O_CREAT), 0600);
	if (out < 0 && again)
		_exit(127);
	if (in >= 0)
		dup2(in, 0);
	if (out >= 0) {
		dup2(out, 1);
		dup2(out, 2);
	}
	execv(av[0], av);
	_exit(127);
}

/* Runs argv and returns its first output line (a new string), or NULL. */
static char *run_line(const char *const argv[])
{
	int p[2];
	if (pipe(p) < 0)
		return NULL;
	pid_t pid = fork();
	if (pid == 0) {
		dup2(p[1], 1);
		close(p[0]);
		close(p[1]);
		int dn = open("/dev/null", O_WRONLY);
		if (dn >= 0)
			dup2(dn, 2);
		char **av = argv_copy(argv);
		if (av != NULL)
			execv(av[0], av);
		_exit(127);
	}
	close(p[1]);
	char buf[1024];
	size_t n = 0;
	ssize_t r;
	while (n < sizeof buf - 1 && (r = read(p[0], buf + n, sizeof buf - 1 - n)) > 0)
		n += (size_t)r;
	close(p[0]);
	int st = 0;
	waitpid(pid, &st, 0);
	buf[n] = 0;
	char *nl = strchr(buf, '\n');
	if (nl)
		*nl = 0;
	if (pid < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || buf[0] == 0)
		return NULL;
	return strdup(buf);
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static char *read_small(const char *path)
{
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return NULL;
	char buf[512];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		buf[--n] = 0;
	return n ? strdup(buf) : NULL;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	remove(p);
	return 0;
}

/* Removes what dev up creates in dir (never anything else: DIR may be a
 * directory of the user's), then dir itself when that left it empty. */
static void remove_cluster(const char *dir)
{
	static const char *const names[] = {"cp", "tls", "env", "pids", "pids.tmp", "cp.log", "keeper.log", NULL};
	char p[PATH_MAX + 64];
	for (size_t i = 0; names[i] != NULL; i++) {
		snprintf(p, sizeof p, "%s/%s", dir, names[i]);
		nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
	}
	for (int k = 1; k <= DEV_MAX_WORKERS; k++) {
		snprintf(p, sizeof p, "%s/worker-%d", dir, k);
		nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
		snprintf(p, sizeof p, "%s/worker-%d.log", dir, k);
		unlink(p);
	}
	rmdir(dir);
}

static void record(FILE *pids, const char *name, pid_t pid)
{
	fprintf(pids, "%s %d %llu\n", name, (int)pid, start_time(pid));
	fflush(pids);
}

struct proc_rec {
	char name[128];
	pid_t pid;
	unsigned long long st;
};

static int load_pids(const char *dir, struct proc_rec *r, int max)
{
	char p[PATH_MAX + 16];
	snprintf(p, sizeof p, "%s/pids", dir);
	FILE *f = fopen(p, "r");
	if (f == NULL)
		return -1;
	int n = 0, pid;
	unsigned long long st;
	char name[128];
	while (n < max && fscanf(f, "%127s %d %llu", name, &pid, &st) == 3) {
		snprintf(r[n].name, sizeof r[n].name, "%s", name);
		r[n].pid = pid;
		r[n].st = st;
		n++;
	}
	fclose(f);
	return n;
}

static int alive(const struct proc_rec *r)
{
	return r->pid > 0 && r->st != 0 && start_time(r->pid) == r->st;
}

/* The processes whose command line names the cluster's directory (the
 * executions that the workers started: guests, launchers, bridges): up to
 * max of them in pids, with their start times in sts. Returns how many. */
static int executions_of(const char *absdir, pid_t *pids, unsigned long long *sts, int max)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	size_t dl = strlen(absdir);
	int n = 0;
	if (d == NULL || dl <= 1) {
		if (d != NULL)
			closedir(d);
		return 0;
	}
	char pat[PATH_MAX + 2];
	snprintf(pat, sizeof pat, "%s/", absdir);
	while (n < max && (e = readdir(d)) != NULL) {
		pid_t pid = (pid_t)atoi(e->d_name);
		if (pid <= 1 || pid == getpid())
			continue;
		char p[64], buf[8192];
		snprintf(p, sizeof p, "/proc/%d/cmdline", (int)pid);
		int fd = open(p, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		ssize_t got = read(fd, buf, sizeof buf - 1);
		close(fd);
		if (got <= 0)
			continue;
		for (ssize_t i = 0; i < got; i++)
			if (buf[i] == 0)
				buf[i] = ' ';
		buf[got] = 0;
		if (strstr(buf, pat) != NULL) {
			pids[n] = pid;
			sts[n++] = start_time(pid);
		}
	}
	closedir(d);
	return n;
}

#define DEV_EXECS_MAX 16384

/* Kills (SIGKILL) what executions_of() found; each pinned by its start
 * time, so that a pid used again since is never signalled. */
static void kill_listed(const pid_t *pids, const unsigned long long *sts, int n)
{
	for (int i = 0; i < n; i++)
		if (sts[i] != 0 && start_time(pids[i]) == sts[i])
			kill(pids[i], SIGKILL);
}

/* Kills every process whose command line names the cluster's directory. */
static void kill_executions(const char *absdir)
{
	static pid_t pids[DEV_EXECS_MAX];
	static unsigned long long sts[DEV_EXECS_MAX];
	kill_listed(pids, sts, executions_of(absdir, pids, sts, DEV_EXECS_MAX));
}

/* What the cluster's microVMs (qemu substrate) leave outside its directory
 * when their supervisors are killed: their RAM files on tmpfs and their
 * directories, named by the uid ranges dev up gives the workers. Only
 * ranges nobody runs in: a supervisor just killed lets its range's lock go
 * as it dies, so a range still held is tried again for up to 2 s in all
 * (another cluster's VM holds its lock for good: never waited for each). */
static void remove_vm_files(void)
{
	enum { RANGES = DEV_MAX_WORKERS * 256 };
	static unsigned char pending[RANGES];
	memset(pending, 1, sizeof pending);
	for (int round = 0; round < 40; round++) {
		int held = 0;
		for (unsigned r = 0; r < RANGES; r++) {
			if (!pending[r])
				continue;
			unsigned base = (1u << 30) + r * 65536u;
			char p[128];
			snprintf(p, sizeof p, "/run/spaced/uid-ranges/%u.lock", base);
			int lk = open(p, O_RDWR | O_CLOEXEC);
			if (lk < 0) {
				pending[r] = 0;
				continue;
			}
			if (flock(lk, LOCK_EX | LOCK_NB) < 0) {
				close(lk);
				held++;
				continue;
			}
			pending[r] = 0;
			snprintf(p, sizeof p, "/dev/shm/spaced-vm/%u.ram", base);
			unlink(p);
			snprintf(p, sizeof p, "/dev/shm/spaced-vm/%u-template.ram", base);
			unlink(p);
			snprintf(p, sizeof p, "/run/spaced/vm/%u", base);
			struct stat st;
			if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
				const char *rm[] = {"rm", "-rf", "--", p, NULL};
				free(run_line(rm));
			}
			close(lk);
		}
		if (!held)
			return;
		sleep_ms(50);
	}
}

/* Waits (up to 5 s) until no loop device holds an image below absdir: the
 * disks of killed executions are released once their last task is gone. */
static void wait_disks_released(const char *absdir)
{
	char pat[PATH_MAX + 2];
	snprintf(pat, sizeof pat, "%s/", absdir);
	for (int t = 0; t < 100; t++) {
		int held = 0;
		DIR *d = opendir("/sys/block");
		struct dirent *e;
		while (d != NULL && (e = readdir(d)) != NULL) {
			char p[PATH_MAX], buf[PATH_MAX];
			if (strncmp(e->d_name, "loop", 4) != 0)
				continue;
			snprintf(p, sizeof p, "/sys/block/%.200s/loop/backing_file", e->d_name);
			int fd = open(p, O_RDONLY | O_CLOEXEC);
			if (fd < 0)
				continue;
			ssize_t n = read(fd, buf, sizeof buf - 1);
			close(fd);
			buf[n > 0 ? n : 0] = 0;
			held |= strncmp(buf, pat, strlen(pat)) == 0;
		}
		if (d != NULL)
			closedir(d);
		if (!held)
			return;
		sleep_ms(50);
	}
}

/* `spaced-launch reap`: executions whose launcher is gone (on cgroup v1 a
 * paused one stays frozen, its tasks unable to die, until its cgroup is
 * thawed). Returns false when it cannot run here. */
static bool reap_orphans(void)
{
	char launch[PATH_MAX];
	if (find_build() != 0 || bin(launch, sizeof launch, "spaced-node/spaced-launch") != 0 || geteuid() != 0)
		return false;
	const char *ra[] = {launch, "reap", NULL};
	free(run_line(ra));
	return true;
}

/* Each worker's egress namespace (docs/network.md): once unmounted, pasta
 * and spaced-netd have nothing left to serve. */
static void egress_unmount(const char *dir)
{
	for (int k = 1; k <= DEV_MAX_WORKERS; k++) {
		char ns[PATH_MAX + 64];
		snprintf(ns, sizeof ns, "%s/worker-%d/net/ns", dir, k);
		umount2(ns, MNT_DETACH);
	}
}

/* Once the cluster's processes are stopped: the executions its workers
 * started and its microVMs' files (absdir: the directory's real path, ""
 * when it is gone), each worker's egress namespace, and what dead launchers
 * left. Returns reap_orphans()'s answer. */
static bool executions_down(const char *dir, const char *absdir)
{
	if (absdir[0] != '\0') {
		kill_executions(absdir);
		remove_vm_files();
	}
	egress_unmount(dir);
	return reap_orphans();
}

/* Stops the n processes of r: SIGTERM, up to 5 s to end, then SIGKILL;
 * each pinned by its start time (a pid used again is never signalled). */
static void stop_procs(const struct proc_rec *r, int n)
{
	for (int i = n - 1; i >= 0; i--)
		if (alive(&r[i]))
			kill(r[i].pid, SIGTERM);
	for (int t = 0; t < 100; t++) {
		int any = 0;
		for (int i = 0; i < n; i++)
			any |= alive(&r[i]);
		if (!any)
			break;
		sleep_ms(50);
	}
	for (int i = 0; i < n; i++)
		if (alive(&r[i]))
			kill(r[i].pid, SIGKILL);
}

static int dev_down(const char *dir, int quiet, int remove_dir)
{
	struct proc_rec r[2 * DEV_MAX_WORKERS + 4];
	char absdir[PATH_MAX] = "";
	int n = load_pids(dir, r, (int)(sizeof r / sizeof r[0]));
	if (n < 0) {
		/* nothing recorded, but a cluster whose DIR/pids was removed may
		 * still be running (its keeper stopping it): its processes name
		 * DIR, and one that exits cleanly later removes files by their
		 * paths (a database's journal) — a cluster made here would lose
		 * them. They go first (SIGKILL), and dev up waits for them. */
		if (realpath(dir, absdir) != NULL)
			for (int t = 0; t < 100; t++) {
				static pid_t pids[DEV_EXECS_MAX];
				static unsigned long long sts[DEV_EXECS_MAX];
				int k = executions_of(absdir, pids, sts, DEV_EXECS_MAX);
				if (k == 0)
					break;
				kill_listed(pids, sts, k);
				sleep_ms(50);
			}
		if (!quiet)
			fprintf(stderr, "spacectl: dev down: nothing recorded in %s/pids\n", dir);
		return quiet ? 0 : 1;
	}
	/* the keeper first (so that it starts nothing again), then what it
	 * recorded last: workers first, the control plane last */
	for (int i = 0; i < n; i++) {
		if (strcmp(r[i].name, "keeper") != 0 || !alive(&r[i]))
			continue;
		kill(r[i].pid, SIGTERM);
		for (int t = 0; t < 40 && alive(&r[i]); t++)
			sleep_ms(50);
		if (alive(&r[i]))
			kill(r[i].pid, SIGKILL);
		n = load_pids(dir, r, (int)(sizeof r / sizeof r[0]));
		break;
	}
	stop_procs(r, n);
	if (realpath(dir, absdir) == NULL)
		absdir[0] = '\0';
	bool reap = executions_down(dir, absdir);
	if (absdir[0] != '\0')
		wait_disks_released(absdir);
	if (!quiet)
		printf("stopped %d processes; removed the cluster's files from %s\n", n, dir);
	if (remove_dir)
		remove_cluster(dir);
	else {
		char p[PATH_MAX + 16];
		snprintf(p, sizeof p, "%s/pids", dir);
		unlink(p);
	}
	/* again: the disks of the executions killed above were released after
	 * the first pass; their I/O bounds go now */
	if (reap)
		reap_orphans();
	return 0;
}

static int wait_file(const char *path, pid_t pid, int ms)
{
	for (int t = 0; t < ms / 50; t++) {
		struct stat sb;
		if (stat(path, &sb) == 0 && sb.st_size > 0)
			return 0;
		if (stat(path, &sb) == 0 && S_ISSOCK(sb.st_mode))
			return 0;
		if (kill(pid, 0) < 0 || start_time(pid) == 0)
			return -1;
		sleep_ms(50);
	}
	return -1;
}

/* ---- the keeper ---- */

/* A process the keeper starts again when it dies: its argv and log. */
struct kept_proc {
	char name[32];
	char **argv;
	char log[PATH_MAX + 64];
	pid_t pid;
	unsigned long long st;
	long pause_ms;
	long due_ms; /* when it is started again (0: running) */
};
static struct kept_proc kept[DEV_MAX_WORKERS + 1];
static int nkept;
static volatile sig_atomic_t keeper_stop;

static void keep(const char *name, const char *const argv[], const char *log, pid_t pid)
{
	if (nkept >= (int)(sizeof kept / sizeof kept[0]))
		return;
	struct kept_proc *k = &kept[nkept];
	snprintf(k->name, sizeof k->name, "%s", name);
	snprintf(k->log, sizeof k->log, "%s", log);
	if ((k->argv = argv_copy(argv)) == NULL)
		return;
	k->pid = pid;
	k->st = start_time(pid);
	k->pause_ms = 100;
	nkept++;
}

static long now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Rewrites DIR/pids (a temporary file renamed over it): the kept
 * processes, then the keeper. */
static void keeper_write_pids(const char *absdir)
{
	char p[PATH_MAX + 16], tmp[PATH_MAX + 32];
	snprintf(p, sizeof p, "%s/pids", absdir);
	snprintf(tmp, sizeof tmp, "%s/pids.tmp", absdir);
	FILE *f = fopen(tmp, "w");
	if (f == NULL)
		return;
	for (int i = 0; i < nkept; i++)
		fprintf(f, "%s %d %llu\n", kept[i].name, (int)kept[i].pid, kept[i].st);
	fprintf(f, "keeper %d %llu\n", (int)getpid(), start_time(getpid()));
	if (fclose(f) == 0)
		rename(tmp, p);
}

static void keeper_on_term(int sig)
{
	(void)sig;
	keeper_stop = 1;
}

/* Whether a directory other than dfd's is at absdir now: one made at the
 * same path since this keeper's was removed (a cluster being made there,
 * whose DIR/pids may not be written yet). */
static bool path_replaced(const char *absdir, int dfd)
{
	struct stat now, ours;
	return dfd >= 0 && stat(absdir, &now) == 0 && fstat(dfd, &ours) == 0 &&
	       (now.st_dev != ours.st_dev || now.st_ino != ours.st_ino);
}

/* Whether the cluster is still this keeper's: its directory has links
 * (dfd: the directory itself, not its name) and DIR/pids names this keeper.
 * *other: DIR/pids names another keeper, or another directory is at the
 * path (a cluster made there since). */
static bool keeper_owns(const char *absdir, int dfd, bool *other)
{
	struct stat ds;
	struct proc_rec r[2 * DEV_MAX_WORKERS + 4];
	*other = false;
	if (dfd >= 0 && fstat(dfd, &ds) == 0 && ds.st_nlink == 0) {
		int n = load_pids(absdir, r, (int)(sizeof r / sizeof r[0]));
		*other = n > 0 || path_replaced(absdir, dfd);
		return false;
	}
	int n = load_pids(absdir, r, (int)(sizeof r / sizeof r[0]));
	if (n < 0)
		return errno != ENOENT; /* only a missing file says the cluster was removed */
	for (int i = 0; i < n; i++)
		if (strcmp(r[i].name, "keeper") == 0) {
			*other = r[i].pid != getpid() || r[i].st != start_time(getpid());
			return !*other;
		}
	return true; /* being rewritten: not conclusive */
}

/* The cluster's directory (or its DIR/pids) was removed under it, or
 * another cluster was made there: what the keeper started is stopped
 * (SIGTERM, then SIGKILL after 5 s; each pinned by its start time), and,
 * unless another cluster is there now, their executions too, as dev down
 * does, once the workers are stopped (a pool that was filling starts no
 * more). A cluster made at the same path names it too and is never
 * touched: the processes are listed, then the path is looked at again, and
 * if a new directory is there by then (its processes may be among those
 * listed) nothing is killed by its name and no namespace under it is
 * unmounted (dev up there stops what is left of the old cluster before it
 * starts its own). */
static void keeper_cluster_gone(const char *dir, const char *absdir, int dfd, bool other)
{
	static pid_t pids[DEV_EXECS_MAX];
	static unsigned long long sts[DEV_EXECS_MAX];
	fprintf(stderr, "keeper: %s %s; stopping the cluster's processes\n", absdir,
	        other ? "holds another cluster" : "was removed");
	struct proc_rec r[DEV_MAX_WORKERS + 1];
	for (int i = 0; i < nkept; i++)
		r[i] = (struct proc_rec){.pid = kept[i].pid, .st = kept[i].st};
	stop_procs(r, nkept);
	if (other)
		return;
	for (int t = 0; t < 100; t++) {
		int nexec = executions_of(absdir, pids, sts, DEV_EXECS_MAX);
		if (path_replaced(absdir, dfd)) {
			fprintf(stderr, "keeper: another directory is at %s now; its processes are not touched\n", absdir);
			return;
		}
		if (nexec == 0)
			break;
		kill_listed(pids, sts, nexec);
		sleep_ms(50);
	}
	/* once nothing of the cluster runs: a worker whose pool was filling
	 * made its egress namespace again when it was gone */
	egress_unmount(dir);
	remove_vm_files();
	reap_orphans();
}

/* The keeper's loop: every 100 ms, a kept process whose (pid, start time)
 * is gone is started again after a pause (100 ms, doubling to 5 s, back to
 * 100 ms once it has run for 30 s). Ends on SIGTERM, or when the cluster is
 * no longer its own (keeper_owns, keeper_cluster_gone): a process started
 * again would make its files anew at the old paths, and hold the uid ranges
 * and egress namespaces of a cluster made there later. */
static void run_keeper(const char *absdir, int ready_fd)
{
	signal(SIGTERM, keeper_on_term);
	signal(SIGINT, keeper_on_term);
	signal(SIGCHLD, SIG_DFL);
	keeper_write_pids(absdir);
	/* the directory itself, not its name: removed, it has no links left */
	int dfd = open(absdir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	/* dev up returns now: a directory removed from here on is seen as
	 * removed (before, the keeper's first DIR/pids could land in a
	 * directory being removed and keep it, its cluster running) */
	(void)!write(ready_fd, "k", 1);
	close(ready_fd);
	long started[DEV_MAX_WORKERS + 1];
	for (int i = 0; i < nkept; i++)
		started[i] = now_ms();
	while (!keeper_stop) {
		bool other;
		if (!keeper_owns(absdir, dfd, &other)) {
			keeper_cluster_gone(absdir, absdir, dfd, other);
			break;
		}
		while (waitpid(-1, NULL, WNOHANG) > 0)
			; /* what it started itself */
		for (int i = 0; i < nkept && !keeper_stop; i++) {
			struct kept_proc *k = &kept[i];
			long t = now_ms();
			if (k->due_ms == 0 && start_time(k->pid) != k->st) {
				if (t - started[i] > 30000)
					k->pause_ms = 100;
				k->due_ms = t + k->pause_ms;
				fprintf(stderr, "keeper: %s (pid %d) is gone; starting it again in %ld ms\n", k->name, (int)k->pid,
				        k->pause_ms);
				k->pause_ms = k->pause_ms * 2 > 5000 ? 5000 : k->pause_ms * 2;
			}
			if (k->due_ms != 0 && t >= k->due_ms) {
				pid_t pid = spawn_log((const char *const *)k->argv, k->log, true);
				if (pid < 0)
					continue;
				k->pid = pid;
				k->st = 0;
				for (int w = 0; w < 20 && k->st == 0; w++) {
					k->st = start_time(pid);
					if (k->st == 0)
						sleep_ms(5);
				}
				k->due_ms = 0;
				started[i] = t;
				keeper_write_pids(absdir);
				fprintf(stderr, "keeper: %s started again (pid %d)\n", k->name, (int)pid);
			}
		}
		sleep_ms(100);
	}
}

/* Starts the keeper (in its own session, logging to DIR/keeper.log) and
 * waits (5 s at most) until it has named itself in DIR/pids and holds the
 * directory; returns its pid or -1. */
static pid_t start_keeper(const char *absdir)
{
	char log[PATH_MAX + 32];
	int ready[2];
	snprintf(log, sizeof log, "%s/keeper.log", absdir);
	if (pipe2(ready, O_CLOEXEC) < 0)
		return -1;
	pid_t pid = fork();
	if (pid != 0) {
		close(ready[1]);
		if (pid > 0) {
			struct pollfd p = {.fd = ready[0], .events = POLLIN};
			char c;
			int n;
			while ((n = poll(&p, 1, 5000)) < 0 && errno == EINTR)
				;
			if (n != 1 || read(ready[0], &c, 1) != 1)
				fprintf(stderr, "spacectl: the keeper did not say it runs within 5 s\n");
		}
		close(ready[0]);
		return pid;
	}
	close(ready[0]);
	setsid();
	int in = open("/dev/null", O_RDONLY), out = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
	if (in >= 0)
		dup2(in, 0);
	if (out >= 0) {
		dup2(out, 1);
		dup2(out, 2);
	}
	run_keeper(absdir, ready[1]);
	_exit(0);
}

/* With the qemu substrate, the control plane's options that make it the
 * default and wait for a VM's boot under TCG. Returns the count. */
static int cp_qemu_args(const char **a, int na, int qemu)
{
	if (qemu) {
		a[na++] = "--default-substrate";
		a[na++] = "qemu";
		a[na++] = "--ack-timeout";
		a[na++] = "180000";
	}
	return na;
}

/* The warm pool each worker keeps for its default template and limits
 * (spaced-node --pool; NULL: spaced-node's default). */
static const char *dev_pool;
/* --disk-io for every worker, or NULL: the workers' default */
static const char *dev_disk_io;
/* --allocatable for every worker, or NULL: the host's less a reserve */
static const char *dev_alloc;
/* --net-rate for every worker, or NULL: the workers' default */
static const char *dev_net_rate;
/* --disk-reserve for every worker, or NULL: the workers' default */
static const char *dev_disk_reserve;
/* --net-openable for every worker, or NULL: none of the closed set opens */
static const char *dev_net_openable;
/* --net-closed for every worker, or NULL: the closed set as spaced-node has it */
static const char *dev_net_closed;
/* --net-conns for every worker, or NULL: what pasta's open-file limit allows */
static const char *dev_net_conns;
static const char *dev_fence_after;
/* --cpu-latency-us for every worker, or NULL: no PM QoS request */
static const char *dev_cpu_latency;
/* --request-cpu for every worker, or NULL: the workers' default */
static const char *dev_request_cpu;


/* DIR/tls: the cluster's CA, the control plane's certificate, and each
 * worker's server and client certificates (see the head of this file). */
static int make_certs(const char *absdir, int nworkers)
{
	char t[PATH_MAX + 16], ca[PATH_MAX + 32], cak[PATH_MAX + 32], crt[PATH_MAX + 64], key[PATH_MAX + 64], err[600];
	char cn[128];
	snprintf(t, sizeof t, "%s/tls", absdir);
	if (mkdir(t, 0700) < 0 && errno != EEXIST)
		return cli_fail("dev up", "cannot create %s: %s", t, strerror(errno));
	snprintf(ca, sizeof ca, "%s/ca.pem", t);
	snprintf(cak, sizeof cak, "%s/ca.key", t);
	snprintf(cn, sizeof cn, "spaced dev CA %ld", (long)time(NULL));
	if (spaced_tls_issue(NULL, NULL, ca, cak, cn, NULL, false, 365, err, sizeof err) < 0)
		return cli_fail("dev up", "the cluster's CA: %s", err);
	snprintf(crt, sizeof crt, "%s/cp.pem", t);
	snprintf(key, sizeof key, "%s/cp.key", t);
	if (spaced_tls_issue(ca, cak, crt, key, "spaced-cp", "IP:127.0.0.1,DNS:localhost", true, 365, err, sizeof err) < 0)
		return cli_fail("dev up", "the control plane's certificate: %s", err);
	for (int k = 1; k <= nworkers; k++) {
		snprintf(crt, sizeof crt, "%s/worker-%d.pem", t, k);
		snprintf(key, sizeof key, "%s/worker-%d.key", t, k);
		snprintf(cn, sizeof cn, "spaced-node worker-%d", k);
		/* node-api's names, and its ServicePort gateways' (PORT-SANDBOX.gw.localhost:
		 * a wildcard directly under localhost is refused by clients) */
		if (spaced_tls_issue(ca, cak, crt, key, cn, "IP:127.0.0.1,DNS:localhost,DNS:*.gw.localhost", true, 365, err,
		                     sizeof err) < 0)
			return cli_fail("dev up", "worker-%d's certificate: %s", k, err);
		/* the client certificate: its name is the worker ID (mutual TLS) */
		snprintf(crt, sizeof crt, "%s/worker-%d-client.pem", t, k);
		snprintf(key, sizeof key, "%s/worker-%d-client.key", t, k);
		snprintf(cn, sizeof cn, "worker-%d", k);
		if (spaced_tls_issue(ca, cak, crt, key, cn, NULL, false, 365, err, sizeof err) < 0)
			return cli_fail("dev up", "worker-%d's client certificate: %s", k, err);
	}
	return 0;
}

/* --ack-timeout for the control plane (how long a lifecycle call waits for
 * its worker), or NULL: its default (the qemu substrate's: 180 s) */
static const char *dev_ack_timeout;

/* The control plane's last options: TLS with the cluster's certificate and
 * the workers' CA (or --plaintext), the log format, the ack timeout. Returns
 * the count. */
static int cp_args_tail(const char **a, int na, bool plaintext, const char *crt, const char *key, const char *ca,
                        const char *logfmt)
{
	if (plaintext) {
		a[na++] = "--plaintext";
	} else {
		a[na++] = "--tls-cert";
		a[na++] = crt;
		a[na++] = "--tls-key";
		a[na++] = key;
		a[na++] = "--tls-client-ca"; /* the workers' CA: the worker endpoints want their certificates */
		a[na++] = ca;
	}
	if (logfmt) {
		a[na++] = "--log-format";
		a[na++] = logfmt;
	}
	if (dev_ack_timeout) {
		a[na++] = "--ack-timeout";
		a[na++] = dev_ack_timeout;
	}
	return na;
}

static int dev_up(const char *dir, int nworkers, const char *substrate, const char *stall, const char *logfmt,
                  bool plaintext)
{
	char cp[PATH_MAX], node[PATH_MAX], guest[PATH_MAX], launch[PATH_MAX], host[PATH_MAX];
	static char ca_file[PATH_MAX + 32];
	char tdir[PATH_MAX + 16], cp_crt[PATH_MAX + 32], cp_key[PATH_MAX + 32];
	char p[PATH_MAX + 64], p2[PATH_MAX + 64], absdir[PATH_MAX], err[256];
	char *tkey = NULL, *port = NULL, *body = NULL;
	FILE *pids = NULL;
	int rc = 1, real = 0;
	pid_t cp_pid = 0;
	if (find_build() < 0 || bin(cp, sizeof cp, "spaced-cp/spaced-cp") < 0 ||
	    bin(node, sizeof node, "spaced-node/spaced-node") < 0 || bin(guest, sizeof guest, "spaced-guest/spaced-guest") < 0)
		return cli_fail("dev up", "spaced-cp, spaced-node and spaced-guest must be built (%s; set SPACED_BUILD)",
		                build_dir);
	char vm[PATH_MAX], images[PATH_MAX + 32] = "";
	int qemu = strcmp(substrate, "qemu") == 0;
	if (strcmp(substrate, "process") == 0 || qemu) {
		real = geteuid() == 0 && bin(launch, sizeof launch, "spaced-node/spaced-launch") == 0 &&
		       bin(host, sizeof host, "spaced-host/spaced-host") == 0;
		if (!real && qemu)
			return cli_fail("dev up", "the qemu substrate needs root, spaced-launch and spaced-host");
		if (!real)
			fprintf(stderr, "spacectl: dev up: the process substrate needs root, spaced-launch and spaced-host; "
			                "using development executions (plain spaced-guest processes)\n");
		if (qemu && (bin(vm, sizeof vm, "spaced-vmm/spaced-vm") < 0 ||
		             access("/usr/bin/qemu-system-x86_64", X_OK) != 0))
			return cli_fail("dev up", "the qemu substrate needs spaced-vm (%s) and qemu-system-x86_64", build_dir);
	} else if (strcmp(substrate, "dev") != 0) {
		return cli_fail("dev up", "substrate '%s' is not available here (process, qemu, dev)", substrate);
	}
	struct proc_rec old[2 * DEV_MAX_WORKERS + 4];
	int nold = load_pids(dir, old, (int)(sizeof old / sizeof old[0]));
	for (int i = 0; i < nold; i++)
		if (alive(&old[i]))
			return cli_fail("dev up", "a cluster is already up in %s (spacectl dev down --dir %s)", dir, dir);
	dev_down(dir, 1, 1); /* leftovers of a cluster that died */
	remove_cluster(dir);  /* and of one that failed to start (its logs were kept) */
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return cli_fail("dev up", "cannot create %s: %s", dir, strerror(errno));
	if (realpath(dir, absdir) == NULL)
		return cli_fail("dev up", "%s: %s", dir, strerror(errno));
	snprintf(tdir, sizeof tdir, "%s/tls", absdir);
	snprintf(ca_file, sizeof ca_file, "%s/ca.pem", tdir);
	snprintf(cp_crt, sizeof cp_crt, "%s/cp.pem", tdir);
	snprintf(cp_key, sizeof cp_key, "%s/cp.key", tdir);
	if (!plaintext) {
		if (make_certs(absdir, nworkers) != 0)
			return 1;
		net_set_ca_file(ca_file); /* this process talks to the cluster with its CA */
	}
	snprintf(p, sizeof p, "%s/pids", absdir);
	if ((pids = fopen(p, "w")) == NULL)
		return cli_fail("dev up", "cannot write %s", p);
	if (qemu) {
		/* the workers' kernel, initramfs (with this build's spaced-guest) and
		 * root tree, shared by every worker of the cluster */
		char script[PATH_MAX + 32], vlog[PATH_MAX + 32];
		snprintf(images, sizeof images, "%s/vm-images", absdir);
		snprintf(script, sizeof script, "%s/spaced-vmm/mkvmimage.sh", build_dir);
		snprintf(vlog, sizeof vlog, "%s/vm-images.log", absdir);
		const char *a[] = {"/bin/sh", script, guest, images, NULL};
		pid_t pid = spawn(a, vlog);
		int st = -1;
		if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			rc = cli_fail("dev up", "cannot build the VM images (see %s)", vlog);
			goto out;
		}
	}
	snprintf(p, sizeof p, "%s/cp", absdir);
	mkdir(p, 0700);
	{
		const char *a1[] = {cp, "admin", "--state", p, "create-tenant", "dev", NULL};
		if ((tkey = run_line(a1)) == NULL) {
			rc = cli_fail("dev up", "spaced-cp admin failed (state %s)", p);
			goto out;
		}
	}
	snprintf(p2, sizeof p2, "%s/cp.log", absdir);
	{
		/* request threads enough for many lifecycle calls waiting for
		 * their acks at once (50 concurrent creates) */
		const char *a[32] = {cp, "--state", p, "--listen", "127.0.0.1:0", "--threads", "64",
		                     "--metrics-listen", "127.0.0.1:0"};
		int na = cp_args_tail(a, cp_qemu_args(a, 9, qemu), plaintext, cp_crt, cp_key, ca_file, logfmt);
		a[na] = NULL;
		pid_t pid = spawn(a, p2);
		if (pid < 0) {
			rc = cli_fail("dev up", "fork: %s", strerror(errno));
			goto out;
		}
		record(pids, "spaced-cp", pid);
		cp_pid = pid;
		snprintf(p, sizeof p, "%s/cp/cp.port", absdir);
		if (wait_file(p, pid, 15000) < 0 || (port = read_small(p)) == NULL) {
			rc = cli_fail("dev up", "the control plane did not start (see %s)", p2);
			goto out;
		}
	}
	char cpurl[64];
	snprintf(cpurl, sizeof cpurl, "%s://127.0.0.1:%s", plaintext ? "http" : "https", port);
	{
		/* started again on the same port */
		char cpdir[PATH_MAX + 64], listen[64], store[64];
		snprintf(cpdir, sizeof cpdir, "%s/cp", absdir);
		snprintf(listen, sizeof listen, "127.0.0.1:%s", port);
		/* and its store too: what workers were told to fetch stays where it is */
		snprintf(p, sizeof p, "%s/cp/store.port", absdir);
		char *sp = read_small(p);
		snprintf(store, sizeof store, "127.0.0.1:%s", sp ? sp : "0");
		free(sp);
		char mlisten[64], mpath[PATH_MAX + 64];
		snprintf(mpath, sizeof mpath, "%s/cp/metrics.port", absdir);
		char *mp = read_small(mpath);
		snprintf(mlisten, sizeof mlisten, "127.0.0.1:%s", mp ? mp : "0");
		free(mp);
		const char *a[32] = {cp, "--state", cpdir, "--listen", listen, "--threads", "64", "--store-listen", store,
		                     "--metrics-listen", mlisten};
		int na = cp_args_tail(a, cp_qemu_args(a, 11, qemu), plaintext, cp_crt, cp_key, ca_file, logfmt);
		a[na] = NULL;
		keep("spaced-cp", a, p2, cp_pid);
	}
	for (int t = 0;; t++) {
		int st = 0;
		if (http_request(cpurl, "GET", "/v1/healthz", NULL, NULL, &st, &body, err, sizeof err) == 0) {
			free(body);
			body = NULL;
			break;
		}
		if (t > 200) {
			rc = cli_fail("dev up", "the control plane does not answer: %s", err);
			goto out;
		}
		sleep_ms(50);
	}
	for (int k = 1; k <= nworkers; k++) {
		char wid[32], wdir[PATH_MAX + 32], log[PATH_MAX + 64], join[PATH_MAX + 64];
		snprintf(wid, sizeof wid, "worker-%d", k);
		snprintf(wdir, sizeof wdir, "%s/%s", absdir, wid);
		snprintf(log, sizeof log, "%s/%s.log", absdir, wid);
		mkdir(wdir, 0700);
		/* a join token for this worker ID alone, spent when it joins; it is
		 * passed in a file of the worker's (never on a command line) */
		char *jt = NULL;
		{
			snprintf(p, sizeof p, "%s/cp", absdir);
			const char *a[] = {cp, "admin", "--state", p, "create-join-token", wid, "600", NULL};
			snprintf(join, sizeof join, "%s/join-token", wdir);
			int fd = -1;
			if ((jt = run_line(a)) == NULL ||
			    (fd = open(join, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0 ||
			    write(fd, jt, strlen(jt)) != (ssize_t)strlen(jt)) {
				if (fd >= 0)
					close(fd);
				free(jt);
				rc = cli_fail("dev up", "cannot make a join token for %s", wid);
				goto out;
			}
			close(fd);
			free(jt);
		}
		/* each worker's executions take uid ranges of their own: 256 ranges of
		 * 65536 uids per worker, one block after the other */
		char uids[48];
		snprintf(uids, sizeof uids, "%u:256", (1u << 30) + (unsigned)(k - 1) * 256u * 65536u);
		const char *a[96] = {node, "--state", wdir, "--worker-id", wid, "--listen", "127.0.0.1:0", "--guest-bin", guest,
		                     "--uid-range", uids, "--cp", cpurl, "--join-token-file", join,
		                     "--metrics-listen", "127.0.0.1:0", NULL};
		int na = 17;
		char w_crt[PATH_MAX + 64], w_key[PATH_MAX + 64], c_crt[PATH_MAX + 64], c_key[PATH_MAX + 64];
		if (plaintext) {
			a[na++] = "--plaintext";
		} else {
			/* node-api's certificate; the CA and client certificate for the control plane */
			snprintf(w_crt, sizeof w_crt, "%s/%s.pem", tdir, wid);
			snprintf(w_key, sizeof w_key, "%s/%s.key", tdir, wid);
			snprintf(c_crt, sizeof c_crt, "%s/%s-client.pem", tdir, wid);
			snprintf(c_key, sizeof c_key, "%s/%s-client.key", tdir, wid);
			const char *t[] = {"--tls-cert", w_crt, "--tls-key", w_key, "--tls-ca", ca_file,
			                   "--tls-client-cert", c_crt, "--tls-client-key", c_key};
			for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
				a[na++] = t[i];
		}
		if (real) {
			a[na++] = "--launcher";
			a[na++] = launch;
			a[na++] = "--host";
			a[na++] = host;
		}
		if (qemu) {
			a[na++] = "--vm";
			a[na++] = vm;
			a[na++] = "--vm-images";
			a[na++] = images;
		}
		/* several workers of this host, all in this cgroup: each caps its own
		 * executions in a parent of its own (spaced-node --cgroup-parent) */
		char cgparent[SPACED_NAME_MAX + 16];
		if (nworkers > 1) {
			snprintf(cgparent, sizeof cgparent, "spaced.%s", wid);
			a[na++] = "--cgroup-parent";
			a[na++] = cgparent;
		}
		/* ... and shares the host's tasks out: each worker's default is the
		 * host's less a reserve (spaced-node: kernel.threads-max, which
		 * it raises kernel.pid_max to), and the sandboxes of several such
		 * workers together could take every pid of the host */
		char alloc_share[64];
		const char *alloc = dev_alloc;
		unsigned long long threads = 0;
		FILE *tf = dev_alloc || nworkers < 2 ? NULL : fopen("/proc/sys/kernel/threads-max", "re");
		if (tf) {
			if (fscanf(tf, "%llu", &threads) == 1 && threads > 0) {
				unsigned long long tasks = threads < 4194304 ? threads : 4194304;
				unsigned long long keep = tasks / 8 > 2048 ? tasks / 8 : 2048;
				snprintf(alloc_share, sizeof alloc_share, "pids=%llu",
				         (tasks > 2 * keep ? tasks - keep : tasks / 2) / (unsigned long long)nworkers);
				alloc = alloc_share;
			}
			fclose(tf);
		}
		/* the workers' settings dev up passes on as given (NULL: spaced-node's default) */
		const char *const pass[][2] = {{"--stall-timeout", stall},       {"--pool", real ? dev_pool : NULL},
		                               {"--disk-io", dev_disk_io},        {"--allocatable", alloc},
		                               {"--net-rate", dev_net_rate},      {"--disk-reserve", dev_disk_reserve},
		                               {"--net-openable", dev_net_openable}, {"--net-closed", dev_net_closed},
		                               {"--net-conns", dev_net_conns},
		                               {"--cpu-latency-us", dev_cpu_latency}, {"--request-cpu", dev_request_cpu},
		                               {"--log-format", logfmt},          {"--fence-after", dev_fence_after}};
		for (size_t j = 0; j < sizeof pass / sizeof pass[0]; j++)
			if (pass[j][1]) {
				a[na++] = pass[j][0];
				a[na++] = pass[j][1];
			}
		a[na] = NULL;
		pid_t pid = spawn(a, log);
		record(pids, wid, pid);
		snprintf(p, sizeof p, "%s/worker.key", wdir);
		if (wait_file(p, pid, 30000) < 0) {
			rc = cli_fail("dev up", "%s did not join the control plane (see %s)", wid, log);
			goto out;
		}
		unlink(join); /* spent */
		/* started again with its key (no token) on the same ports */
		char listen[64], mlisten[64];
		snprintf(p, sizeof p, "%s/api.port", wdir);
		char *wp = read_small(p);
		snprintf(listen, sizeof listen, "127.0.0.1:%s", wp ? wp : "0");
		free(wp);
		snprintf(p, sizeof p, "%s/metrics.port", wdir);
		wp = read_small(p);
		snprintf(mlisten, sizeof mlisten, "127.0.0.1:%s", wp ? wp : "0");
		free(wp);
		const char *ka[96];
		int m = 0;
		for (int i = 0; a[i]; i++) {
			if (strcmp(a[i], "--join-token-file") == 0) {
				i++;
				continue;
			}
			bool after_listen = i > 0 && strcmp(a[i - 1], "--listen") == 0;
			bool after_metrics = i > 0 && strcmp(a[i - 1], "--metrics-listen") == 0;
			ka[m++] = after_listen ? listen : after_metrics ? mlisten : a[i];
		}
		ka[m] = NULL;
		keep(wid, ka, log, pid);
	}
	/* every worker's control channel is open */
	for (int t = 0;; t++) {
		int st = 0, connected = 0;
		if (http_request(cpurl, "GET", "/v1/workers", tkey, NULL, &st, &body, err, sizeof err) == 0 && st == 200) {
			json_error_t jerr;
			json_t *j = json_loads(body, 0, &jerr), *w;
			size_t i;
			json_array_foreach(json_object_get(j, "workers"), i, w)
				connected += json_is_true(json_object_get(w, "connected"));
			json_decref(j);
		}
		free(body);
		body = NULL;
		if (connected == nworkers)
			break;
		if (t > 600) {
			rc = cli_fail("dev up", "%d of %d workers connected to the control plane after 30 s", connected, nworkers);
			goto out;
		}
		sleep_ms(50);
	}
	snprintf(p, sizeof p, "%s/env", absdir);
	FILE *f = fopen(p, "w");
	if (f == NULL) {
		rc = cli_fail("dev up", "cannot write %s", p);
		goto out;
	}
	fchmod(fileno(f), 0600);
	if (plaintext)
		fprintf(f, "SPACED_CP_URL=%s\nSPACED_API_KEY=%s\nexport SPACED_CP_URL SPACED_API_KEY\n", cpurl, tkey);
	else
		fprintf(f, "SPACED_CP_URL=%s\nSPACED_API_KEY=%s\nSPACED_CA_FILE=%s\n"
		           "export SPACED_CP_URL SPACED_API_KEY SPACED_CA_FILE\n",
		        cpurl, tkey, ca_file);
	fclose(f);
	fclose(pids);
	pids = NULL;
	if (start_keeper(absdir) < 0) {
		rc = cli_fail("dev up", "cannot start the keeper: %s", strerror(errno));
		goto out;
	}
	printf("SPACED_CP_URL=%s\nSPACED_API_KEY=%s\n", cpurl, tkey);
	if (!plaintext)
		printf("SPACED_CA_FILE=%s\n", ca_file);
	fprintf(stderr, "spacectl: dev cluster up in %s: control plane %s, %d worker%s (%s executions, %s); "
	                "`. %s/env` to use it, `spacectl dev down --dir %s` to stop it\n",
	        absdir, cpurl, nworkers, nworkers == 1 ? "" : "s",
	        qemu ? "qemu (the default) and process substrate" : real ? "process substrate" : "development",
	        plaintext ? "no TLS" : "TLS with the cluster's own CA in tls/, mutual TLS for the workers", absdir, dir);
	rc = 0;
out:
	if (pids != NULL)
		fclose(pids);
	if (rc != 0)
		dev_down(dir, 1, 0); /* the logs stay for a look */
	free(tkey);
	free(port);
	free(body);
	return rc;
}

static int dev_status(const char *dir)
{
	struct proc_rec r[2 * DEV_MAX_WORKERS + 4];
	int n = load_pids(dir, r, (int)(sizeof r / sizeof r[0])), up = 0;
	if (n < 0) {
		printf("no dev cluster in %s\n", dir);
		return 1;
	}
	for (int i = 0; i < n; i++) {
		int a = alive(&r[i]);
		up += a;
		printf("%-20s pid %-8d %s\n", r[i].name, (int)r[i].pid, a ? "running" : "gone");
	}
	char p[PATH_MAX + 16];
	snprintf(p, sizeof p, "%s/env", dir);
	FILE *f = fopen(p, "r");
	if (f != NULL) {
		char line[PATH_MAX + 64], url[512] = "", key[512] = "";
		static char ca[PATH_MAX + 64];
		while (fgets(line, sizeof line, f)) {
			line[strcspn(line, "\n")] = 0;
			if (strncmp(line, "SPACED_CP_URL=", 14) == 0)
				snprintf(url, sizeof url, "%.500s", line + 14);
			if (strncmp(line, "SPACED_API_KEY=", 15) == 0)
				snprintf(key, sizeof key, "%.500s", line + 15);
			if (strncmp(line, "SPACED_CA_FILE=", 15) == 0) {
				snprintf(ca, sizeof ca, "%s", line + 15);
				net_set_ca_file(ca);
			}
		}
		fclose(f);
		char *body = NULL, err[256];
		int st = 0;
		if (url[0] && http_request(url, "GET", "/v1/workers", key, NULL, &st, &body, err, sizeof err) == 0 && st == 200) {
			json_error_t jerr;
			json_t *j = json_loads(body, 0, &jerr), *w;
			size_t i;
			printf("control plane %s:\n", url);
			json_array_foreach(json_object_get(j, "workers"), i, w)
				printf("  %-12s %-5s %-13s %lld sandboxes  %s\n", json_string_value(json_object_get(w, "id")),
				       json_string_value(json_object_get(w, "state")),
				       json_is_true(json_object_get(w, "connected")) ? "connected" : "not connected",
				       (long long)json_integer_value(json_object_get(w, "sandboxes")),
				       json_string_value(json_object_get(w, "url")));
			json_decref(j);
		} else if (url[0]) {
			printf("control plane %s: not answering\n", url);
		}
		free(body);
	}
	return up == n ? 0 : 1;
}

int cmd_dev(int argc, char **argv)
{
	static const struct option opts[] = {
		{"workers", required_argument, NULL, 'w'},
		{"dir", required_argument, NULL, 'd'},
		{"substrate", required_argument, NULL, 's'},
		{"stall-timeout", required_argument, NULL, 'S'},
		{"pool", required_argument, NULL, 'P'},
		{"disk-io", required_argument, NULL, 'D'},
		{"allocatable", required_argument, NULL, 'A'},
		{"net-rate", required_argument, NULL, 'R'},
		{"disk-reserve", required_argument, NULL, 'K'},
		{"net-openable", required_argument, NULL, 'O'},
		{"net-closed", required_argument, NULL, 'X'},
		{"net-conns", required_argument, NULL, 'C'},
		{"cpu-latency-us", required_argument, NULL, 'U'},
		{"request-cpu", required_argument, NULL, 'Q'},
		{"log-format", required_argument, NULL, 'L'},
		{"plaintext", no_argument, NULL, 'T'},
		{"fence-after", required_argument, NULL, 'F'},
		{"ack-timeout", required_argument, NULL, 'N'},
		{NULL, 0, NULL, 0},
	};
	bool plaintext = false;
	const char *dir = getenv("SPACED_DEV_DIR"), *substrate = "process", *stall = NULL, *logfmt = NULL;
	int workers = 2, c;
	if (dir == NULL || !dir[0])
		dir = ".spaced-dev";
	if (argc < 2)
		return cli_usage(usage_dev);
	const char *sub = argv[1];
	optind = 1;
	while ((c = getopt_long(argc - 1, argv + 1, "", opts, NULL)) != -1) {
		switch (c) {
		case 'w': workers = atoi(optarg); break;
		case 'd': dir = optarg; break;
		case 's': substrate = optarg; break;
		case 'S': stall = optarg; break;
		case 'P': dev_pool = optarg; break;
		case 'D': dev_disk_io = optarg; break;
		case 'A': dev_alloc = optarg; break;
		case 'R': dev_net_rate = optarg; break;
		case 'K': dev_disk_reserve = optarg; break;
		case 'O': dev_net_openable = optarg; break;
		case 'X': dev_net_closed = optarg; break;
		case 'C': dev_net_conns = optarg; break;
		case 'U': dev_cpu_latency = optarg; break;
		case 'Q': dev_request_cpu = optarg; break;
		case 'L': logfmt = optarg; break;
		case 'T': plaintext = true; break;
		case 'F': dev_fence_after = optarg; break;
		case 'N': {
			char *end;
			long ms = strtol(optarg, &end, 10);
			if (*end || end == optarg || ms < 100 || ms > 600000) {
				fprintf(stderr, "spacectl dev up: --ack-timeout wants milliseconds (100 .. 600000)\n");
				return 2;
			}
			dev_ack_timeout = optarg;
			break;
		}
		default: return cli_usage(usage_dev);
		}
	}
	if (optind != argc - 1 || workers < 1 || workers > DEV_MAX_WORKERS)
		return cli_usage(usage_dev);
	if (strcmp(sub, "up") == 0)
		return dev_up(dir, workers, substrate, stall, logfmt, plaintext);
	if (strcmp(sub, "down") == 0)
		return dev_down(dir, 0, 1);
	if (strcmp(sub, "status") == 0)
		return dev_status(dir);
	if (strcmp(sub, "certs") == 0) {
		/* what up makes in DIR/tls, for daemons started by hand */
		char absdir[PATH_MAX];
		if (mkdir(dir, 0700) < 0 && errno != EEXIST)
			return cli_fail("dev certs", "cannot create %s: %s", dir, strerror(errno));
		if (realpath(dir, absdir) == NULL)
			return cli_fail("dev certs", "%s: %s", dir, strerror(errno));
		if (make_certs(absdir, workers) != 0)
			return 1;
		printf("%s/tls\n", absdir);
		return 0;
	}
	return cli_usage(usage_dev);
}
