/*
 * node_main.c — spaced-node: starts sbx-manager and node-api (node.h).
 *
 *   spaced-node --state DIR --worker-id ID --listen HOST:PORT [--keys BUNDLE]
 *               [--guest-bin PATH] [--launcher PATH --host PATH] [--no-drop]
 *               [--limits-default LIST] [--limits-max LIST] [--uid-range FIRST:COUNT]
 *               [--uid-lock-dir DIR] [--stall-timeout S]
 * LIST: "cpus=1,memory=512M,pids=512,disk=2G" (resources.h).
 *
 * The process started is the supervisor of the group of node.h: the gate,
 * node-api (which binds the listener, writes the bound port to DIR/api.port,
 * then gives up its privileges and enters its seccomp allow-list before
 * serving) and the executor. When any of them dies, the group is started
 * again. SIGTERM stops the group and the supervisor; executions keep running.
 */
#include "node.h"

#include <errno.h>
#include <limits.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "executor.h"
#include "pidref.h"

static void usage(void)
{
	fprintf(stderr, "usage: spaced-node --state DIR --worker-id ID --listen HOST:PORT [--keys BUNDLE]\n"
	                "                   [--guest-bin PATH] [--launcher PATH --host PATH] [--no-drop]\n"
	                "                   [--limits-default LIST] [--limits-max LIST] [--uid-range FIRST:COUNT]\n"
	                "                   [--uid-lock-dir DIR] [--stall-timeout S]\n"
	                "  LIST: cpus=N,memory=SIZE,pids=N,disk=SIZE\n");
}

/* ---- the group: gate, node-api, executor ---- */

/* Starts node-api and the executor, then runs the gate in this process until
 * a link goes away; the children end with it (parent-death signal). */
static int run_group(struct mgr_config *mc, const char *host, int port, const char *port_file, bool drop)
{
	int api[2], exe[2];
	prctl(PR_SET_PDEATHSIG, SIGKILL); /* the group never outlives its supervisor */
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, api) < 0 ||
	    socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, exe) < 0) {
		perror("spaced-node: socketpair");
		return 1;
	}
	pid_t api_pid = fork();
	if (api_pid < 0)
		return 1;
	if (api_pid == 0) {
		close(api[0]);
		close(exe[0]);
		close(exe[1]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() == 1)
			_exit(1);
		struct node_api_config ac = {.listen_host = host, .listen_port = port, .mgr_fd = api[1],
		                             .port_file = port_file, .drop_privileges = drop};
		_exit(node_api_run(&ac));
	}
	pid_t exe_pid = fork();
	if (exe_pid < 0)
		return 1;
	if (exe_pid == 0) {
		close(exe[0]);
		close(api[0]);
		close(api[1]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		_exit(executor_run(mc, exe[1]));
	}
	close(api[1]);
	close(exe[1]);
	mc->api_fd = api[0];
	mc->api_pid = api_pid;
	mc->exe_fd = exe[0];
	mc->exe_pid = exe_pid;
	spaced_proc_start_time(exe_pid, &mc->exe_start);
	int rc = mgr_run(mc);
	kill(api_pid, SIGTERM);
	kill(exe_pid, SIGTERM);
	waitpid(api_pid, NULL, 0);
	waitpid(exe_pid, NULL, 0);
	return rc;
}

/* ---- the supervisor ---- */

static volatile sig_atomic_t stopping;

static void on_stop(int sig)
{
	(void)sig;
	stopping = 1;
}

static long ms_since(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

/* Runs the group and starts it again whenever it ends, until SIGTERM or
 * SIGINT: a pause of 100 ms before the first restart, doubling up to 5 s,
 * back to 100 ms once a group has run for 30 s. node-api listens on the port
 * the first group bound, so a restart keeps the worker's address. As the
 * child subreaper, the supervisor also reaps the processes it adopts. */
static int supervise(struct mgr_config *mc, const char *host, int port, const char *port_file, bool drop)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_stop;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	long pause_ms = 100;
	int starts = 0;
	while (!stopping) {
		struct timespec t0;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		if (starts > 0 && port == 0) {
			/* the port the first group bound */
			FILE *f = fopen(port_file, "r");
			int p = 0;
			if (f && fscanf(f, "%d", &p) == 1 && p > 0 && p < 65536)
				port = p;
			if (f)
				fclose(f);
		}
		pid_t g = fork();
		if (g < 0) {
			perror("spaced-node: fork");
			sleep(1);
			continue;
		}
		if (g == 0) {
			struct sigaction dfl;
			memset(&dfl, 0, sizeof dfl);
			dfl.sa_handler = SIG_DFL;
			sigaction(SIGTERM, &dfl, NULL);
			sigaction(SIGINT, &dfl, NULL);
			_exit(run_group(mc, host, port, port_file, drop));
		}
		starts++;
		int st = 0;
		for (;;) {
			pid_t w = waitpid(-1, &st, 0);
			if (w == g)
				break;
			if (w < 0 && errno == EINTR && stopping) {
				kill(g, SIGTERM);
				continue;
			}
			if (w < 0 && errno == ECHILD)
				break;
			/* an adopted process (a launcher, a bridge): reaped */
		}
		if (stopping)
			break;
		long up = ms_since(&t0);
		if (up > 30000)
			pause_ms = 100;
		fprintf(stderr, "spaced-node: the worker's processes ended (status 0x%x after %ld ms); starting them again "
		                "in %ld ms\n", (unsigned)st, up, pause_ms);
		struct timespec ts = {pause_ms / 1000, (pause_ms % 1000) * 1000000L};
		while (!stopping && nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
		pause_ms = pause_ms * 2 > 5000 ? 5000 : pause_ms * 2;
	}
	/* the group ends with the supervisor; adopted processes (executions)
	 * keep running and are found again by the next start */
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	return 0;
}

static char *default_guest(void)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0)
		return NULL;
	self[n] = '\0';
	char *dir = dirname(self);
	char path[PATH_MAX];
	if (snprintf(path, sizeof path, "%s/../spaced-guest/spaced-guest", dir) >= (int)sizeof path)
		return NULL;
	if (access(path, X_OK) != 0)
		return NULL;
	return realpath(path, NULL);
}

int main(int argc, char **argv)
{
	const char *state = NULL, *worker = NULL, *listen_s = NULL, *keys = NULL;
	char *guest = NULL, *launch = NULL, *host_bin = NULL, err[160];
	const char *uid_lock_dir = "/run/spaced/uid-ranges";
	bool drop = true;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	/* defaults: one CPU, 512 MiB, 512 tasks, 2 GiB of disk; maxima: the
	 * machine's CPUs, 16 GiB, 32768 tasks, 64 GiB */
	struct spaced_resources def = {1000, 512ull << 20, 512, 2ull << 30};
	struct spaced_resources max = {(uint32_t)(ncpu > 0 ? ncpu : 1) * 1000, 16ull << 30, 32768, 64ull << 30};
	uint32_t uid_first = 1u << 30, uid_slots = 4096;
	int stall_ms = 60000;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--no-drop") == 0) {
			drop = false;
			continue;
		}
		if (!v) {
			usage();
			return 2;
		}
		if (strcmp(a, "--state") == 0)
			state = v;
		else if (strcmp(a, "--worker-id") == 0)
			worker = v;
		else if (strcmp(a, "--listen") == 0)
			listen_s = v;
		else if (strcmp(a, "--keys") == 0)
			keys = v;
		else if (strcmp(a, "--guest-bin") == 0)
			guest = realpath(v, NULL);
		else if (strcmp(a, "--launcher") == 0)
			launch = realpath(v, NULL);
		else if (strcmp(a, "--host") == 0)
			host_bin = realpath(v, NULL);
		else if (strcmp(a, "--limits-default") == 0 || strcmp(a, "--limits-max") == 0) {
			if (spaced_resources_parse(v, a[9] == 'd' ? &def : &max, err, sizeof err) < 0) {
				fprintf(stderr, "spaced-node: %s: %s\n", a, err);
				return 2;
			}
		} else if (strcmp(a, "--uid-range") == 0) {
			unsigned long long f, c;
			char extra;
			if (sscanf(v, "%llu:%llu%c", &f, &c, &extra) != 2 || f < 65536 || c < 1 ||
			    f + c * 65536ull > 0xffff0000ull) {
				fprintf(stderr, "spaced-node: --uid-range wants FIRST:COUNT (COUNT ranges of 65536 uids "
				                "from FIRST, FIRST >= 65536, below 2^32)\n");
				return 2;
			}
			uid_first = (uint32_t)f;
			uid_slots = (uint32_t)c;
		} else if (strcmp(a, "--uid-lock-dir") == 0)
			uid_lock_dir = v;
		else if (strcmp(a, "--stall-timeout") == 0) {
			char *end;
			long t = strtol(v, &end, 10);
			if (*end || t < 0 || t > 3600) {
				fprintf(stderr, "spaced-node: --stall-timeout wants seconds (0 .. 3600; 0: never)\n");
				return 2;
			}
			stall_ms = (int)t * 1000;
		}
		else {
			usage();
			return 2;
		}
		i++;
	}
	if (!state || !worker || !listen_s || !spaced_name_valid(worker, strlen(worker))) {
		usage();
		return 2;
	}
	if (!guest)
		guest = default_guest();
	if ((launch == NULL) != (host_bin == NULL)) {
		fprintf(stderr, "spaced-node: --launcher and --host go together\n");
		return 2;
	}
	spaced_resources_default(&def, &(struct spaced_resources){1000, 512ull << 20, 512, 2ull << 30});
	const char *over = spaced_resources_exceeds(&def, &max);
	if (over) {
		fprintf(stderr, "spaced-node: the default %s is above the maximum\n", over);
		return 2;
	}
	if (launch && mkdir(uid_lock_dir, 0700) < 0 && errno != EEXIST) {
		/* its parent may be missing: /run/spaced */
		char parent[PATH_MAX];
		snprintf(parent, sizeof parent, "%s", uid_lock_dir);
		mkdir(dirname(parent), 0755);
		if (mkdir(uid_lock_dir, 0700) < 0 && errno != EEXIST) {
			fprintf(stderr, "spaced-node: cannot create %s: %s\n", uid_lock_dir, strerror(errno));
			return 1;
		}
	}
	char host[256];
	const char *colon = strrchr(listen_s, ':');
	char *end = NULL;
	long port = colon ? strtol(colon + 1, &end, 10) : -1;
	if (!colon || (size_t)(colon - listen_s) >= sizeof host || !end || *end || port < 0 || port > 65535) {
		fprintf(stderr, "spaced-node: --listen wants HOST:PORT\n");
		return 2;
	}
	memcpy(host, listen_s, (size_t)(colon - listen_s));
	host[colon - listen_s] = '\0';
	if (mkdir(state, 0700) < 0 && errno != EEXIST) {
		fprintf(stderr, "spaced-node: cannot create %s: %s\n", state, strerror(errno));
		return 1;
	}
	char *state_abs = realpath(state, NULL);
	if (!state_abs) {
		fprintf(stderr, "spaced-node: %s: %s\n", state, strerror(errno));
		return 1;
	}
	char port_file[PATH_MAX];
	snprintf(port_file, sizeof port_file, "%s/api.port", state_abs);
	unlink(port_file);
	char admin[PATH_MAX];
	snprintf(admin, sizeof admin, "%s/admin.sock", state_abs);
	unlink(admin); /* waiters see the socket only once the gate listens */

	struct mgr_config mc = {.state_dir = state_abs, .worker_id = worker, .keys_path = keys,
	                        .guest_bin = guest, .launch_bin = launch, .host_bin = host_bin,
	                        .limits_default = def, .limits_max = max, .uid_first = uid_first,
	                        .uid_slots = uid_slots, .uid_lock_dir = uid_lock_dir,
	                        .stall_timeout_ms = stall_ms};
	int rc = supervise(&mc, host, (int)port, port_file, drop);
	free(state_abs);
	free(guest);
	free(launch);
	free(host_bin);
	return rc;
}
