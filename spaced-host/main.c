/* spaced-host — the per-sandbox host bridge. See host.h for what it checks. */
#include <errno.h>
#include <getopt.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <sodium.h>

#include "spaced_error.h"
#include "frame.h"
#include "host.h"
#include "log.h"
#include "pidref.h"

static struct host_config cfg;

/* One structured log line on stderr. */
static void logline(const char *level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void logline(const char *level, const char *event, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	spaced_log("spaced-host", "level=%s event=%s sandbox=%s generation=%llu %s", level, event, cfg.identity.sandbox,
	           (unsigned long long)cfg.identity.generation, msg);
}

/* Serves one accepted connection: every check, then the relay or the handoff. */
static void serve(int cfd, struct host_relay_bufs *bufs)
{
	int gfd = -1;
	char why[512] = "";
	struct spaced_pidref caller = SPACED_PIDREF_NULL;
	struct spaced_buf hello_answer;
	spaced_buf_init(&hello_answer, 4096);
	int r = spaced_peer_verify_caller(cfd, &cfg.manager, &caller, why, sizeof why);
	if (r < 0) {
		logline("warn", "caller-refused", "reason=\"%s\"", why);
		host_refuse(cfd, SPACED_EPEER, "caller is not the sandbox manager", "");
		goto out;
	}
	r = host_open_guest(&cfg, cfg.handoff ? -1 : cfd, &hello_answer, &gfd, why, sizeof why);
	if (r < 0) {
		logline("warn", "guest-refused", "code=%s reason=\"%s\"", spaced_errname(r), why);
		host_refuse(cfd, r, why, "");
		goto out;
	}
	/* Still the same caller after the work above (SPIRE's peertracker habit). */
	if (spaced_pidref_check(&caller) < 0) {
		logline("warn", "caller-gone", "reason=\"caller exited during verification\"");
		goto out;
	}
	if (cfg.handoff) {
		if (host_handoff(cfd, gfd, cfg.identity_text) < 0)
			logline("warn", "handoff-failed", "reason=\"caller went away\"");
	} else if (hello_answer.len == 0 || spaced_io_write_full(cfd, hello_answer.data, hello_answer.len) == 0) {
		host_relay(cfd, gfd, bufs, cfg.relay_spin_us);
	}
out:
	spaced_buf_free(&hello_answer);
	spaced_pidref_done(&caller);
	if (gfd >= 0)
		close(gfd);
	close(cfd);
}

/*
 * Serving threads (leader/followers). Each one blocks in accept(2) on the
 * bridge's socket, serves the connection it took and goes back, keeping its
 * stack and relay buffers. SPARE_WORKERS of them wait at any time: a bridge
 * makes them at start (a pooled one before its claim), so a connection costs
 * no thread creation and no hand-over between threads. When a worker takes a
 * connection and none is left waiting, the main thread makes another one, so
 * a long relay never holds up the next connection; a worker that finishes
 * while SPARE_WORKERS already wait ends.
 */
enum { SPARE_WORKERS = 2 };

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;    /* serving became true, or waiting reached 0 */
	int waiting;          /* workers not serving a connection (made or being made) */
	bool serving;         /* the identity is known: serve connections */
	int lfd;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, false, -1};

static void *worker(void *bufs)
{
	for (;;) {
		int cfd = accept4(pool.lfd, NULL, NULL, SOCK_CLOEXEC);
		if (cfd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				usleep(10000); /* out of descriptors: let connections end */
				continue;
			}
			logline("error", "accept-failed", "errno=%d", errno);
			exit(1);
		}
		/* a connection taken before the identity is known waits for it (a
		 * pooled bridge's workers wait in accept, not here, so that learning
		 * the identity wakes none of them) */
		pthread_mutex_lock(&pool.mu);
		while (!pool.serving)
			pthread_cond_wait(&pool.cv, &pool.mu);
		if (--pool.waiting == 0)
			pthread_cond_broadcast(&pool.cv);
		pthread_mutex_unlock(&pool.mu);
		serve(cfd, bufs);
		pthread_mutex_lock(&pool.mu);
		bool keep = pool.waiting < SPARE_WORKERS;
		if (keep)
			pool.waiting++;
		pthread_mutex_unlock(&pool.mu);
		if (!keep)
			break;
	}
	free(bufs);
	return NULL;
}

/* Makes one worker (already counted in pool.waiting). Returns 0 or -1. */
static int worker_start(void)
{
	static pthread_attr_t attr;
	static bool attr_ready;
	if (!attr_ready) {
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		pthread_attr_setstacksize(&attr, 128 * 1024);
		attr_ready = true;
	}
	/* above malloc's mmap threshold: its own mapping, pages faulted in only
	 * as far as the relay uses them */
	struct host_relay_bufs *bufs = malloc(sizeof *bufs);
	pthread_t t;
	if (bufs != NULL && pthread_create(&t, &attr, worker, bufs) == 0)
		return 0;
	free(bufs);
	return -1;
}

static int listen_on(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof sa.sun_path)
		return -1;
	strcpy(sa.sun_path, path);
	struct stat st;
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path); /* a stale socket of an earlier run of this bridge */
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	mode_t old = umask(0077);
	int r = bind(fd, (struct sockaddr *)&sa, sizeof sa);
	umask(old);
	if (r < 0 || listen(fd, 128) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static const char usage[] =
	"usage: spaced-host --listen PATH --guest PATH --identity TEXT|- --launcher-pid PID\n"
	"       [--launcher-start TICKS] [--launcher-exe PATH] [--guest-owner UID] [--guest-port N]\n"
	"       [--manager-uid UID] [--manager-pid PID [--manager-start TICKS]] [--timeout-ms MS]\n"
	"       [--handoff | --relay-spin-us US]\n"
	"       [--vm-pid PID [--vm-start TICKS] [--vm-exe PATH]] [--guest-cid N]\n";

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (*s == 0 || *s == '-' || *end != 0 || errno != 0)
		return -1;
	*out = v;
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"listen", required_argument, NULL, 'l'},
		{"guest", required_argument, NULL, 'g'},
		{"guest-port", required_argument, NULL, 'p'},
		{"identity", required_argument, NULL, 'i'},
		{"launcher-pid", required_argument, NULL, 'L'},
		{"launcher-start", required_argument, NULL, 'S'},
		{"launcher-exe", required_argument, NULL, 'E'},
		{"guest-owner", required_argument, NULL, 'O'},
		{"manager-uid", required_argument, NULL, 'U'},
		{"manager-pid", required_argument, NULL, 'M'},
		{"manager-start", required_argument, NULL, 'T'},
		{"timeout-ms", required_argument, NULL, 't'},
		{"handoff", no_argument, NULL, 'H'},
		{"relay-spin-us", required_argument, NULL, 'R'},
		{"vm-pid", required_argument, NULL, 'V'},
		{"vm-start", required_argument, NULL, 'W'},
		{"vm-exe", required_argument, NULL, 'X'},
		{"guest-cid", required_argument, NULL, 'C'},
		{NULL, 0, NULL, 0},
	};
	const char *identity = NULL, *launcher_exe = NULL, *vm_exe = NULL;
	uint64_t vm_pid = 0, vm_start = 0;
	bool have_vm_start = false;
	uint64_t v, launcher_pid = 0, launcher_start = 0, owner = 0, mgr_uid = 0, mgr_pid = 0, mgr_start = 0;
	bool have_owner = false, have_launcher_start = false;
	int c;
	cfg.guest_port = 1024;
	cfg.timeout_ms = 2000;
	cfg.relay_spin_us = 50;
	const char *spin_env = getenv("SPACED_RELAY_SPIN_US"); /* the default, for a whole worker */
	if (spin_env != NULL) {
		if (parse_u64(spin_env, &v) < 0 || v > 1000) {
			fprintf(stderr, "spaced-host: invalid SPACED_RELAY_SPIN_US (0 to 1000)\n");
			return 2;
		}
		cfg.relay_spin_us = (int)v;
	}
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		const char *bad = NULL;
		switch (c) {
		case 'l': cfg.listen_path = optarg; break;
		case 'g': cfg.guest_path = optarg; break;
		case 'i': identity = optarg; break;
		case 'E': launcher_exe = optarg; break;
		case 'H': cfg.handoff = true; break;
		case 'p': if (parse_u64(optarg, &v) < 0 || v > UINT32_MAX) bad = "--guest-port"; else cfg.guest_port = (uint32_t)v; break;
		case 'L': if (parse_u64(optarg, &launcher_pid) < 0 || launcher_pid == 0) bad = "--launcher-pid"; break;
		case 'S': if (parse_u64(optarg, &launcher_start) < 0) bad = "--launcher-start"; else have_launcher_start = true; break;
		case 'O': if (parse_u64(optarg, &owner) < 0) bad = "--guest-owner"; else have_owner = true; break;
		case 'U': if (parse_u64(optarg, &mgr_uid) < 0) bad = "--manager-uid"; break;
		case 'M': if (parse_u64(optarg, &mgr_pid) < 0) bad = "--manager-pid"; break;
		case 'T': if (parse_u64(optarg, &mgr_start) < 0) bad = "--manager-start"; break;
		case 'R': if (parse_u64(optarg, &v) < 0 || v > 1000) bad = "--relay-spin-us"; else cfg.relay_spin_us = (int)v; break;
		case 't': if (parse_u64(optarg, &v) < 0 || v == 0 || v > 60000) bad = "--timeout-ms"; else cfg.timeout_ms = (int)v; break;
		case 'V': if (parse_u64(optarg, &vm_pid) < 0 || vm_pid == 0 || vm_pid > INT32_MAX) bad = "--vm-pid"; break;
		case 'W': if (parse_u64(optarg, &vm_start) < 0) bad = "--vm-start"; else have_vm_start = true; break;
		case 'X': vm_exe = optarg; break;
		case 'C': if (parse_u64(optarg, &v) < 0 || v < 3 || v >= UINT32_MAX) bad = "--guest-cid"; else cfg.vm.guest_cid = (uint32_t)v; break;
		default: fputs(usage, stderr); return 2;
		}
		if (bad != NULL) {
			fprintf(stderr, "spaced-host: invalid %s\n", bad);
			return 2;
		}
	}
	if (cfg.listen_path == NULL || cfg.guest_path == NULL || identity == NULL || launcher_pid == 0 ||
	    optind != argc) {
		fputs(usage, stderr);
		return 2;
	}
	if (sodium_init() < 0)
		return 1;
	if (strcmp(identity, "-") != 0 && spaced_identity_decode(&cfg.identity, identity, strlen(identity)) < 0) {
		fprintf(stderr, "spaced-host: --identity is not a canonical execution identity\n");
		return 2;
	}
	/* What the launcher must be: pinned now unless the manager passed its start time. */
	cfg.launcher.pid = (pid_t)launcher_pid;
	if (!have_launcher_start && spaced_proc_start_time((pid_t)launcher_pid, &launcher_start) < 0) {
		fprintf(stderr, "spaced-host: launcher process %llu does not exist\n",
		        (unsigned long long)launcher_pid);
		return 1;
	}
	cfg.launcher.start_time = launcher_start;
	cfg.launcher.owner_uid = have_owner ? (uid_t)owner : geteuid();
	if (launcher_exe != NULL) {
		cfg.launcher.check_exe = true;
		if (spaced_exe_id_of_path(launcher_exe, false, &cfg.launcher.exe) < 0) {
			fprintf(stderr, "spaced-host: cannot stat --launcher-exe %s\n", launcher_exe);
			return 1;
		}
	}
	if ((vm_exe != NULL || have_vm_start) && vm_pid == 0) {
		fprintf(stderr, "spaced-host: --vm-start and --vm-exe need --vm-pid\n");
		return 2;
	}
	if (vm_pid != 0) {
		/* the VM whose guest memory the launcher (its vhost-user back-end) serves */
		cfg.vm.pid = (pid_t)vm_pid;
		if (!have_vm_start && spaced_proc_start_time((pid_t)vm_pid, &vm_start) < 0) {
			fprintf(stderr, "spaced-host: VM process %llu does not exist\n", (unsigned long long)vm_pid);
			return 1;
		}
		cfg.vm.start_time = vm_start;
		if (vm_exe != NULL) {
			cfg.vm.check_exe = true;
			if (spaced_exe_id_of_path(vm_exe, false, &cfg.vm.exe) < 0) {
				fprintf(stderr, "spaced-host: cannot stat --vm-exe %s\n", vm_exe);
				return 1;
			}
		}
	}
	cfg.manager.uid = (uid_t)mgr_uid;
	cfg.manager.pid = (pid_t)mgr_pid;
	cfg.manager.start_time = mgr_start;

	signal(SIGPIPE, SIG_IGN);
	/* the workers' few small allocations share one arena instead of each
	 * mapping a 64 MiB one of its own */
	mallopt(M_ARENA_MAX, 1);
	int lfd = listen_on(cfg.listen_path);
	if (lfd < 0) {
		fprintf(stderr, "spaced-host: cannot listen on %s: %s\n", cfg.listen_path, strerror(errno));
		return 1;
	}
	/* Locate and pin what the checks look at, ahead of the first connection
	 * (which still passes every check). */
	char why[512] = "";
	if (host_prepare_listener(&cfg, why, sizeof why) < 0)
		fprintf(stderr, "spaced-host level=info event=prepare-failed reason=\"%s\"\n", why);
	pool.lfd = lfd;
	for (int i = 0; i < SPARE_WORKERS; i++) {
		if (worker_start() < 0) {
			fprintf(stderr, "spaced-host: cannot start a serving thread\n");
			return 1;
		}
		pool.waiting++;
	}
	/* A bridge pre-started for a warm pool listens at once (connections wait
	 * in the backlog) and learns the identity it must reach when the execution
	 * is claimed: one line on standard input. It serves nothing before. */
	char line[SPACED_IDENTITY_TEXT_MAX + 2];
	if (strcmp(identity, "-") == 0) {
		/* ... or for its launcher's end: a pooled execution whose launcher
		 * is gone is never claimed, and its bridge goes with it */
		struct spaced_pidref lref = SPACED_PIDREF_NULL;
		char lwhy[256];
		if (spaced_pidref_expected(&lref, cfg.launcher.pid, cfg.launcher.start_time, lwhy, sizeof lwhy) < 0) {
			fprintf(stderr, "spaced-host: its launcher is gone before the claim: %s\n", lwhy);
			return 1;
		}
		struct pollfd pw[2] = {{.fd = 0, .events = POLLIN}, {.fd = lref.pidfd, .events = POLLIN}};
		while (poll(pw, 2, -1) < 0 && errno == EINTR)
			;
		bool launcher_gone = pw[1].revents != 0 && !(pw[0].revents & POLLIN);
		spaced_pidref_done(&lref);
		if (launcher_gone) {
			fprintf(stderr, "spaced-host: its launcher ended before the claim\n");
			return 1;
		}
		if (fgets(line, sizeof line, stdin) == NULL || strchr(line, '\n') == NULL) {
			fprintf(stderr, "spaced-host: no identity line on standard input\n");
			return 2;
		}
		*strchr(line, '\n') = 0;
		identity = line;
	}
	if (spaced_identity_decode(&cfg.identity, identity, strlen(identity)) < 0) {
		fprintf(stderr, "spaced-host: --identity is not a canonical execution identity\n");
		return 2;
	}
	spaced_identity_encode(&cfg.identity, cfg.identity_text, sizeof cfg.identity_text);
	logline("info", "listening", "path=%s guest=%s", cfg.listen_path, cfg.guest_path);
	pthread_mutex_lock(&pool.mu);
	pool.serving = true;
	pthread_cond_broadcast(&pool.cv);
	for (;;) {
		while (pool.waiting > 0)
			pthread_cond_wait(&pool.cv, &pool.mu);
		pool.waiting++;
		pthread_mutex_unlock(&pool.mu);
		bool made = worker_start() == 0;
		pthread_mutex_lock(&pool.mu);
		if (!made) {
			pool.waiting--;
			pthread_mutex_unlock(&pool.mu);
			logline("warn", "thread-failed", "reason=\"cannot make a serving thread\"");
			usleep(10000);
			pthread_mutex_lock(&pool.mu);
		}
	}
}
