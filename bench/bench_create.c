/*
 * bench_create.c — make bench-create (issue 13): sandbox creation as users
 * get it, POST /v1/sandboxes through the control plane to a worker with a
 * warm pool, against bwrap --unshare-all in the same run.
 *
 *   bench-create [N_SEQUENTIAL=50] [N_CONCURRENT=50]
 *
 * It starts a cluster on this machine (spacectl dev up: one control plane,
 * one worker of the process substrate, --pool N_CONCURRENT), waits until the
 * worker's pool is full, then:
 *   - sequential: N creates, one after the other, on one kept-alive
 *     connection, each interleaved with one `bwrap --unshare-all
 *     --die-with-parent --ro-bind / / true` so both see the same machine;
 *   - paced (informative, not a target): N_SEQUENTIAL / 2 creates and bwraps
 *     the same way with 100 ms of quiet before each, as an agent's sporadic
 *     creates come (creates about 200 ms apart: under the 250 ms pause that
 *     sets the pool's refill off). What only a quiet host shows appears here:
 *     a move between CPU cgroups, for one, waits for an RCU grace period
 *     (6-8 ms) when none was moved just before; then as many with an egress
 *     policy of their own ({"network":{"mode":"deny"}}: the claim makes
 *     their packet filter), 200 ms apart;
 *   - concurrent: the sandboxes removed and the pool full again, N_CONCURRENT
 *     creates at once (one kept-alive connection each, opened beforehand),
 *     then N_CONCURRENT bwraps at once; BENCH_ROUNDS rounds of both (5 by
 *     default: one burst's p99 moves by a third from one to the next on
 *     this machine), each round's p99 printed, their median the figure.
 * A create's time is from writing the request to reading the whole answer
 * (201, the sandbox running: the worker acknowledged its install). What the
 * burst cost the host in CPU (every process, from the root CPU cgroup) is
 * printed per create. The pool's
 * hit rate over the measured creates comes from the worker's status.
 * Needs root (the process substrate) and bwrap. Last line: one JSON object.
 * Before them, BENCH_WARMUP creates (20 by default; 0: none) and their
 * removal: the measured creates meet a control plane that has served some,
 * as on a running one; those first creates' p50 is printed apart
 * (warmup_create_p50_ms; -1 with none). BENCH_CLIENT_CPU=N holds the
 * benchmark's client (and the bwraps it starts) to CPU N once the cluster
 * is up.
 * BENCH_POOL=N sets the worker's --pool (default N_CONCURRENT + 4);
 * BENCH_CPU_LATENCY_US=N starts the worker with --cpu-latency-us N;
 * BENCH_REQUEST_CPU=LIST with --request-cpu LIST (pin=off: the request path
 * not kept on one CPU).
 * BENCH_TMP=DIR puts the cluster's directory under DIR instead of /tmp (to
 * compare file systems); BENCH_TRACE=1 prints the concurrent burst's window
 * in CLOCK_MONOTONIC seconds, for `perf record -k CLOCK_MONOTONIC -a` and
 * `perf report --time START,END`, every concurrent create's time, the
 * pool's state as the burst starts, and the CPU each process name used over
 * the burst per create (threads alive at its end: a diagnostic).
 * A burst's window (its wall time and the CPU it cost) starts once its
 * clients are ready (threads made, connections open) and are released.
 */
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "bench_host.h"

extern char **environ;

#define ROUNDS_MAX 20 /* concurrent bursts at most (BENCH_ROUNDS) */

static char top[4096], dir[256], cp_host[64], api_key[256];
static int cp_port;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double pct(double *v, int n, double p)
{
	qsort(v, (size_t)n, sizeof *v, cmp_d);
	int i = (int)(p * (n - 1) + 0.5);
	return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

/* ---- a kept-alive HTTP/1.1 client for the control plane ---- */

static int dial(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)cp_port)};
	sa.sin_addr.s_addr = htonl(0x7f000001);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	return fd;
}

/* One request on fd; the answer's status and body (malloc'd). */
static int exchange(int fd, const char *method, const char *path, const char *body, char **out)
{
	char req[1024];
	size_t bl = body ? strlen(body) : 0;
	int n = snprintf(req, sizeof req,
	                 "%s %s HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
	                 "Content-Length: %zu\r\n\r\n%s",
	                 method, path, cp_host, cp_port, api_key, bl, body ? body : "");
	if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n)
		return -1;
	static __thread char buf[65536];
	size_t have = 0;
	long clen = -1;
	char *hend = NULL;
	for (;;) {
		ssize_t r = recv(fd, buf + have, sizeof buf - 1 - have, 0);
		if (r <= 0)
			return -1;
		have += (size_t)r;
		buf[have] = 0;
		if (!hend && (hend = strstr(buf, "\r\n\r\n")) != NULL) {
			char *cl = strcasestr(buf, "content-length:");
			if (!cl || cl > hend)
				return -1;
			clen = strtol(cl + 15, NULL, 10);
		}
		if (hend && have >= (size_t)(hend + 4 - buf) + (size_t)clen)
			break;
		if (have == sizeof buf - 1)
			return -1;
	}
	int status = atoi(buf + 9);
	if (out) {
		*out = strndup(hend + 4, (size_t)clen);
	}
	return status;
}

/* ---- bwrap ---- */

static double bwrap_try(void)
{
	const char *argv[] = {"bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true", NULL};
	uint64_t t0 = now_ns();
	pid_t pid;
	if (posix_spawnp(&pid, "bwrap", NULL, NULL, (char *const *)(uintptr_t)argv, environ) != 0)
		return -1;
	int st;
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return -1;
	return (double)(now_ns() - t0) / 1e6;
}

/* bwrap binds the whole host read-only: a mount another program makes or
 * removes meanwhile (a network namespace's nsfs file) can fail its remount.
 * Such a run is tried again (at most twice); the time is the run's that
 * worked. */
static double bwrap_once(void)
{
	double ms = -1;
	for (int i = 0; i < 3 && ms < 0; i++)
		ms = bwrap_try();
	return ms;
}

/* ---- the cluster ---- */

static int sh(const char *cmd)
{
	int r = system(cmd);
	return WIFEXITED(r) ? WEXITSTATUS(r) : -1;
}

static json_t *worker_status(void)
{
	char cmd[4600];
	snprintf(cmd, sizeof cmd, "%s/spacectl/spacectl node status --admin %s/worker-1/admin.sock", top, dir);
	FILE *f = popen(cmd, "r");
	if (!f)
		return NULL;
	/* all of it: the status lists every record the worker keeps (past
	 * 64 KiB after about 130 creates) */
	json_error_t e;
	json_t *j = json_loadf(f, 0, &e);
	pclose(f);
	json_t *r = json_incref(json_object_get(j, "result"));
	json_decref(j);
	return r;
}

static void pool_counts(int *ready, long *hits, long *misses)
{
	json_t *s = worker_status();
	json_t *p = json_object_get(s, "pool");
	*ready = (int)json_integer_value(json_object_get(p, "ready"));
	*hits = (long)json_integer_value(json_object_get(p, "hits"));
	*misses = (long)json_integer_value(json_object_get(p, "misses"));
	json_decref(s);
}

/* The median of n figures (left in their order). */
static double median(const double *v, int n)
{
	double c[ROUNDS_MAX];
	memcpy(c, v, (size_t)n * sizeof *c);
	return pct(c, n, 0.5);
}

/* Waits (at most 120 s) until the pool holds want ready executions. */
static int wait_pool(int want)
{
	for (int i = 0; i < 1200; i++) {
		int ready;
		long h, m;
		pool_counts(&ready, &h, &m);
		if (ready >= want)
			return 0;
		usleep(100000);
	}
	return -1;
}

static char *ids[1024];
static int nids;

static void remove_all(void)
{
	int fd = dial();
	for (int i = 0; i < nids; i++) {
		char path[128];
		snprintf(path, sizeof path, "/v1/sandboxes/%s", ids[i]);
		if (fd < 0 || exchange(fd, "DELETE", path, NULL, NULL) < 0) {
			if (fd >= 0)
				close(fd);
			fd = dial();
		}
		free(ids[i]);
	}
	nids = 0;
	if (fd >= 0)
		close(fd);
}

static pthread_mutex_t ids_mu = PTHREAD_MUTEX_INITIALIZER;

static double create_body(int fd, const char *req)
{
	char *body = NULL;
	uint64_t t0 = now_ns();
	int st = exchange(fd, "POST", "/v1/sandboxes", req, &body);
	double ms = (double)(now_ns() - t0) / 1e6;
	if (st != 201) {
		fprintf(stderr, "bench-create: create answered %d: %s\n", st, body ? body : "");
		free(body);
		return -1;
	}
	json_error_t e;
	json_t *j = json_loads(body, 0, &e);
	const char *id = json_string_value(json_object_get(j, "id"));
	pthread_mutex_lock(&ids_mu);
	if (id && nids < 1024)
		ids[nids++] = strdup(id);
	pthread_mutex_unlock(&ids_mu);
	json_decref(j);
	free(body);
	return ms;
}

static double create_on(int fd)
{
	return create_body(fd, "{}");
}

/* Paced creates: the sandboxes removed and the pool full again, then n
 * creates of req on one kept-alive connection, each after 100 ms of quiet,
 * and (bw not NULL) each followed by 100 ms of quiet and one bwrap (else
 * 100 ms more of quiet). Times into cr and bw; -1 when one failed. */
static int paced(int n, const char *req, int pool, double *cr, double *bw)
{
	remove_all();
	wait_pool(pool);
	int fd = dial();
	if (fd < 0)
		return -1;
	int e = 0;
	for (int i = 0; i < n && e == 0; i++) {
		usleep(100 * 1000);
		cr[i] = create_body(fd, req);
		usleep(100 * 1000);
		if (bw)
			bw[i] = bwrap_once();
		e = cr[i] < 0 || (bw && bw[i] < 0) ? -1 : 0;
	}
	close(fd);
	return e;
}

struct job {
	int fd;
	double ms;
	bool bwrap;
	pthread_barrier_t *go, *done;
};

static void *conc(void *arg)
{
	struct job *j = arg;
	pthread_barrier_wait(j->go);
	j->ms = j->bwrap ? bwrap_once() : create_on(j->fd);
	pthread_barrier_wait(j->done);
	return NULL;
}

/* The window of a burst: from the moment its clients are released (their
 * threads made and connections open) to the last answer. */
struct window {
	uint64_t t0, t1, cpu0, cpu1;
};

/* n at once; their times into out, the burst's window into w (NULL: not
 * wanted). Returns how many failed. */
static int concurrent(int n, bool bwrap, double *out, struct window *w)
{
	struct job *jobs = calloc((size_t)n, sizeof *jobs);
	pthread_t *t = calloc((size_t)n, sizeof *t);
	pthread_barrier_t go, done;
	pthread_barrier_init(&go, NULL, (unsigned)n + 1);
	pthread_barrier_init(&done, NULL, (unsigned)n + 1);
	for (int i = 0; i < n; i++) {
		jobs[i] = (struct job){.fd = bwrap ? -1 : dial(), .bwrap = bwrap, .go = &go, .done = &done};
		pthread_create(&t[i], NULL, conc, &jobs[i]);
	}
	if (w) {
		if (getenv("BENCH_TRACE"))
			bench_cpu_byname_start();
		w->t0 = now_ns();
		w->cpu0 = bench_host_cpu_ns();
	}
	pthread_barrier_wait(&go);
	pthread_barrier_wait(&done);
	if (w) {
		w->t1 = now_ns();
		w->cpu1 = bench_host_cpu_ns();
		if (getenv("BENCH_TRACE"))
			bench_cpu_byname_print(stderr, n);
	}
	int bad = 0;
	for (int i = 0; i < n; i++) {
		pthread_join(t[i], NULL);
		out[i] = jobs[i].ms;
		bad += jobs[i].ms < 0;
		if (jobs[i].fd >= 0)
			close(jobs[i].fd);
	}
	free(jobs);
	free(t);
	return bad;
}

int main(int argc, char **argv)
{
	int nseq = argc > 1 ? atoi(argv[1]) : 50, nconc = argc > 2 ? atoi(argv[2]) : 50;
	if (nseq < 1 || nseq > 500 || nconc < 1 || nconc > 200) {
		fprintf(stderr, "usage: bench-create [N_SEQUENTIAL] [N_CONCURRENT (<= 200)]\n");
		return 2;
	}
	if (getuid() != 0) {
		fprintf(stderr, "bench-create: needs root (the process substrate)\n");
		return 77;
	}
	if (bwrap_once() < 0) {
		fprintf(stderr, "bench-create: bwrap --unshare-all does not run here\n");
		return 77;
	}
	/* BUILD/bench/bench-create -> BUILD */
	char self[4096];
	ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
	if (sl <= 0)
		return 1;
	self[sl] = 0;
	*strrchr(self, '/') = 0;
	*strrchr(self, '/') = 0;
	snprintf(top, sizeof top, "%s", self);
	snprintf(dir, sizeof dir, "%s/bench-create-XXXXXX", getenv("BENCH_TMP") ? getenv("BENCH_TMP") : "/tmp");
	if (!mkdtemp(dir))
		return 1;
	char cmd[9000];
	int pool = getenv("BENCH_POOL") ? atoi(getenv("BENCH_POOL")) : nconc + 4;
	int rounds = getenv("BENCH_ROUNDS") ? atoi(getenv("BENCH_ROUNDS")) : 5;
	if (rounds < 1 || rounds > ROUNDS_MAX) {
		fprintf(stderr, "bench-create: BENCH_ROUNDS is 1 to %d\n", ROUNDS_MAX);
		return 2;
	}
	/* plaintext: one kept-alive connection per client, so TLS would add a
	 * record's encryption per request, not a handshake (bench-node measures
	 * that cost: within the noise); the create path is what is measured */
	const char *lat = getenv("BENCH_CPU_LATENCY_US"), *rq = getenv("BENCH_REQUEST_CPU");
	char latopt[160] = "";
	if (lat && strspn(lat, "0123456789") == strlen(lat) && lat[0])
		snprintf(latopt, sizeof latopt, " --cpu-latency-us %s", lat);
	/* the workers' --request-cpu (weight=N,max=CPUS,pin=CPU|off, or off) */
	if (rq && rq[0] && strspn(rq, "abcdefghijklmnopqrstuvwxyz0123456789=,.") == strlen(rq) && strlen(rq) < 64)
		snprintf(latopt + strlen(latopt), sizeof latopt - strlen(latopt), " --request-cpu %s", rq);
	snprintf(cmd, sizeof cmd,
	         "%s/spacectl/spacectl dev up --workers 1 --dir %s/c --pool %d --plaintext%s >%s/up.log 2>&1", top, dir,
	         pool, latopt, dir);
	strcat(dir, "/c");
	if (sh(cmd) != 0) {
		fprintf(stderr, "bench-create: dev up failed (%s/../up.log)\n", dir);
		/* what came up goes down (its logs stay) */
		snprintf(cmd, sizeof cmd, "%s/spacectl/spacectl dev down --dir %s >/dev/null 2>&1", top, dir);
		sh(cmd);
		return 1;
	}
	/* the tenant may hold what the concurrent phase makes */
	snprintf(cmd, sizeof cmd, "%s/spaced-cp/spaced-cp admin --state %s/cp set-quota dev sandboxes=0 >/dev/null", top, dir);
	sh(cmd);
	char envp[4200], line[512];
	snprintf(envp, sizeof envp, "%s/env", dir);
	FILE *f = fopen(envp, "r");
	while (f && fgets(line, sizeof line, f)) {
		line[strcspn(line, "\n")] = 0;
		if (strncmp(line, "SPACED_CP_URL=http://", 21) == 0)
			sscanf(line + 21, "%63[^:]:%d", cp_host, &cp_port);
		else if (strncmp(line, "SPACED_API_KEY=", 15) == 0 && strlen(line + 15) < sizeof api_key)
			memcpy(api_key, line + 15, strlen(line + 15) + 1); /* a longer one is not taken (it would be cut) */
	}
	if (f)
		fclose(f);
	int rc = 1;
	double *cr = calloc((size_t)(nseq + nconc), sizeof *cr), *bw = calloc((size_t)(nseq + nconc), sizeof *bw);
	printf("bench-create: %d sequential, %d concurrent; pool of %d on one worker\n", nseq, nconc, pool);
	if (wait_pool(pool) < 0) {
		fprintf(stderr, "bench-create: the pool did not fill\n");
		goto out;
	}
	/* BENCH_CLIENT_CPU=N: the benchmark's own client (and the bwrap runs it
	 * starts) held to CPU N once the cluster is up, which runs free */
	const char *ccpu = getenv("BENCH_CLIENT_CPU");
	if (ccpu && ccpu[0]) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(atoi(ccpu), &set);
		if (sched_setaffinity(0, sizeof set, &set) < 0)
			fprintf(stderr, "bench-create: BENCH_CLIENT_CPU %s: %s\n", ccpu, strerror(errno));
	}
	/* warm-up: BENCH_WARMUP creates (20 by default) and their removal before
	 * anything is measured, so that what is measured is a control plane that
	 * has served creates, as users of a running one meet it (its statements
	 * prepared, its caches filled). Their p50 is printed apart: a control
	 * plane's first creates after its start. */
	int nwarm = getenv("BENCH_WARMUP") ? atoi(getenv("BENCH_WARMUP")) : 20;
	double cold_p50 = -1;
	if (nwarm > 0) {
		double *wv = calloc((size_t)nwarm, sizeof *wv);
		int wfd = wv ? dial() : -1;
		int k = 0;
		while (wfd >= 0 && k < nwarm && (wv[k] = create_on(wfd)) >= 0)
			k++;
		if (wfd >= 0)
			close(wfd);
		if (k == nwarm) {
			cold_p50 = pct(wv, nwarm, 0.5);
			printf("warm-up: the control plane's first %d creates      p50 %7.2f ms (not measured)\n", nwarm,
			       cold_p50);
		}
		free(wv);
		remove_all();
		if (k < nwarm || wait_pool(pool) < 0)
			goto out;
	}
	int ready;
	long h0, m0, h1, m1;
	pool_counts(&ready, &h0, &m0);
	/* sequential, interleaved */
	int fd = dial();
	if (fd < 0)
		goto out;
	for (int i = 0; i < nseq; i++) {
		cr[i] = create_on(fd);
		bw[i] = bwrap_once();
		if (cr[i] < 0 || bw[i] < 0)
			goto out;
		if (nids >= pool - 2) { /* the pool refills in the background; keep the tenant's count low */
			close(fd);
			remove_all();
			wait_pool(pool);
			fd = dial();
		}
	}
	close(fd);
	double s_p50 = pct(cr, nseq, 0.5), s_p99 = pct(cr, nseq, 0.99), b_p50 = pct(bw, nseq, 0.5), b_p99 = pct(bw, nseq, 0.99);
	printf("sequential create (POST /v1/sandboxes, kept alive)  p50 %7.2f ms  p99 %7.2f ms\n", s_p50, s_p99);
	printf("sequential bwrap --unshare-all                     p50 %7.2f ms  p99 %7.2f ms\n", b_p50, b_p99);
	/* paced: each after 100 ms of quiet */
	int npaced = nseq / 2 > 0 ? nseq / 2 : 1;
	if (paced(npaced, "{}", pool, cr, bw) < 0)
		goto out;
	double p_p50 = pct(cr, npaced, 0.5), p_p99 = pct(cr, npaced, 0.99), pb_p50 = pct(bw, npaced, 0.5),
	       pb_p99 = pct(bw, npaced, 0.99);
	printf("paced create, 100 ms of quiet before each (%d)       p50 %7.2f ms  p99 %7.2f ms\n", npaced, p_p50, p_p99);
	printf("paced bwrap --unshare-all                          p50 %7.2f ms  p99 %7.2f ms\n", pb_p50, pb_p99);
	/* paced, each with an egress policy of its own (its packet filter made in the claim) */
	if (paced(npaced, "{\"network\":{\"mode\":\"deny\"}}", pool, cr, NULL) < 0)
		goto out;
	double d_p50 = pct(cr, npaced, 0.5), d_p99 = pct(cr, npaced, 0.99);
	printf("paced create with a deny policy (%d)                p50 %7.2f ms  p99 %7.2f ms\n", npaced, d_p50, d_p99);
	/* the concurrent burst, several rounds (this machine's figures move by a
	 * third from one burst to the next): each round's p99, and their median */
	double r_p99[ROUNDS_MAX], r_p50[ROUNDS_MAX], rb_p99[ROUNDS_MAX], rb_p50[ROUNDS_MAX], r_cpu[ROUNDS_MAX],
	    r_ms[ROUNDS_MAX];
	for (int r = 0; r < rounds; r++) {
		remove_all();
		if (wait_pool(pool) < 0) {
			fprintf(stderr, "bench-create: the pool did not refill\n");
			goto out;
		}
		if (getenv("BENCH_TRACE")) { /* what the pool is doing as the burst starts */
			json_t *st = worker_status();
			char *t = json_dumps(json_object_get(st, "pool"), JSON_COMPACT);
			fprintf(stderr, "bench-create: the pool as the burst starts: %s\n", t ? t : "?");
			free(t);
			json_decref(st);
		}
		struct window w;
		int bad = concurrent(nconc, false, cr, &w);
		uint64_t burst0 = w.t0, burst1 = w.t1, cpu0 = w.cpu0, cpu1 = w.cpu1;
		/* what the burst cost the machine: every process's CPU over its window
		 * (the benchmark's own client and the pool's refills included) */
		r_cpu[r] = cpu0 && cpu1 > cpu0 ? (double)(cpu1 - cpu0) / 1e6 / nconc : 0;
		r_ms[r] = (double)(burst1 - burst0) / 1e6;
		if (getenv("BENCH_TRACE")) /* the burst's window, for perf record -k CLOCK_MONOTONIC … --time */
			fprintf(stderr, "bench-create: concurrent creates from %.6f to %.6f (CLOCK_MONOTONIC, s)\n",
			        (double)burst0 / 1e9, (double)burst1 / 1e9);
		if (getenv("BENCH_TRACE")) { /* every concurrent create's time, in order of completion */
			fprintf(stderr, "bench-create: concurrent creates (ms):");
			for (int i = 0; i < nconc; i++)
				fprintf(stderr, " %.1f", cr[i]);
			fprintf(stderr, "\n");
		}
		pool_counts(&ready, &h1, &m1);
		int badb = concurrent(nconc, true, bw, NULL);
		if (bad || badb) {
			fprintf(stderr, "bench-create: %d creates and %d bwraps failed\n", bad, badb);
			goto out;
		}
		r_p50[r] = pct(cr, nconc, 0.5), r_p99[r] = pct(cr, nconc, 0.99);
		rb_p50[r] = pct(bw, nconc, 0.5), rb_p99[r] = pct(bw, nconc, 0.99);
		printf("round %d: %d concurrent creates p50 %6.2f p99 %6.2f ms (%.2f ms of CPU each); bwrap p50 %6.2f p99 %6.2f ms\n",
		       r + 1, nconc, r_p50[r], r_p99[r], r_cpu[r], rb_p50[r], rb_p99[r]);
	}
	double c_p50 = median(r_p50, rounds), c_p99 = median(r_p99, rounds), cb_p50 = median(rb_p50, rounds),
	       cb_p99 = median(rb_p99, rounds), cpu_per_create = median(r_cpu, rounds), burst_ms = median(r_ms, rounds);
	printf("%d concurrent creates, median of %d rounds      p50 %7.2f ms  p99 %7.2f ms  (target p99 <= 60 and <= bwrap's)\n",
	       nconc, rounds, c_p50, c_p99);
	printf("%d concurrent bwrap --unshare-all, median       p50 %7.2f ms  p99 %7.2f ms\n", nconc, cb_p50, cb_p99);
	printf("CPU of the whole host over a concurrent burst (median): %.2f ms per create (%.0f ms over %.0f ms)\n",
	       cpu_per_create, cpu_per_create * nconc, burst_ms);
	long hits = h1 - h0, total = h1 - h0 + m1 - m0;
	double hit = total > 0 ? (double)hits / (double)total : 0;
	printf("pool hit rate over the measured creates: %.3f (%ld of %ld)\n", hit, hits, total);
	printf("targets: sequential p50 %s bwrap's; 50-concurrent p99 %s 60 ms and %s bwrap's\n",
	       s_p50 <= b_p50 ? "<=" : "> (missed)", c_p99 <= 60 ? "<=" : "> (missed)", c_p99 <= cb_p99 ? "<=" : "> (missed)");
	printf("{\"create_p50_ms\":%.2f,\"bwrap_p50_ms\":%.2f,\"create_p99_ms_50\":%.2f,\"bwrap_p99_ms_50\":%.2f,"
	       "\"pool_hit_rate\":%.3f,\"burst_cpu_ms_per_create\":%.2f,\"paced_create_p50_ms\":%.2f,"
	       "\"paced_bwrap_p50_ms\":%.2f,\"paced_deny_create_p50_ms\":%.2f,\"warmup_create_p50_ms\":%.2f,"
	       "\"rounds\":%d,\"create_p99_ms_50_rounds\":[",
	       s_p50, b_p50, c_p99, cb_p99, hit, cpu_per_create, p_p50, pb_p50, d_p50, cold_p50, rounds);
	for (int r = 0; r < rounds; r++)
		printf("%s%.2f", r ? "," : "", r_p99[r]);
	printf("]}\n");
	rc = 0;
out:
	remove_all();
	if (getenv("BENCH_KEEP")) { /* the cluster stays up for a look: spacectl dev down --dir DIR */
		fprintf(stderr, "bench-create: the cluster is in %s\n", dir);
		free(cr);
		free(bw);
		return rc;
	}
	snprintf(cmd, sizeof cmd, "%s/spacectl/spacectl dev down --dir %s >/dev/null 2>&1", top, dir);
	sh(cmd);
	{
		*strrchr(dir, '/') = 0;
		snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
		sh(cmd);
	}
	free(cr);
	free(bw);
	return rc;
}
