/*
 * bench-cp — control-plane figures, measured against a running spaced-cp whose
 * workers are cp-fake-worker test peers (they apply and ack at once, so these
 * are control-plane, store and channel costs, not substrate costs):
 *   - route: POST /v1/sandboxes/{id}/route latency (auth, store read, signer round trip),
 *     on a new connection per request (with TLS: a whole handshake each), then on
 *     one kept-alive connection;
 *   - create: POST /v1/sandboxes on one kept-alive connection, one after the other
 *     (placement, quotas, the first generation's transaction with its fsync, the
 *     install through the channel and its ack), and the whole host's CPU per create;
 *   - move: POST …/move latency (deactivate + snapshot acks, generation transaction, install ack);
 *   - R4 window: from the move request to the old worker receiving its deactivation
 *     (from then on it refuses the old execution's capabilities: REFRESH_ROUTE),
 *     taken from the worker's receive timestamps.
 *
 *   bench-cp URL API_KEY SANDBOX WORKER_A WORKER_B LOG_A LOG_B [ROUTES] [MOVES] [poll|-] [CREATES]
 * With "poll" (real workers, bench/cp_node_bench.sh; the logs are then "-"), the R4
 * window is measured at the old worker itself: a second thread presents the old
 * execution's fs.read capability to the old worker (GET …/stat?path=/) from the
 * moment the move is requested until the first refusal.
 * The last line is JSON.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>

#include <jansson.h>

#include "bench_host.h"
#include "http_client.h"

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static double pct(uint64_t *v, int n, double p)
{
	qsort(v, (size_t)n, sizeof *v, cmp_u64);
	int i = (int)(p * (n - 1) + 0.5);
	return (double)v[i] / 1e3; /* µs */
}

/* A kept-alive connection to the control plane, its URL parsed once. */
struct kept {
	struct http_conns c;
	char host[256], prefix[256];
	int port, tls;
};

/* One POST on k; 0 with *status, or -1 with err. */
static int kept_post(struct kept *k, const char *path, const char *key, const char *body, int *status, char *err,
                     size_t errsz)
{
	char head[1024];
	int hl = snprintf(head, sizeof head,
	                  "POST %s%s HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: Bearer %s\r\n"
	                  "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
	                  k->prefix, path, k->host, k->port, key, strlen(body));
	unsigned char *ans = NULL, *b = NULL;
	size_t alen = 0, bl = 0;
	int r = http_exchange(&k->c, k->host, k->port, k->tls, head, (size_t)hl, body, strlen(body), 30, &ans, &alen, err,
	                      errsz) < 0 ||
	                http_parse_answer(ans, alen, status, &b, &bl, NULL, NULL, 0, err, errsz) < 0
	            ? -1
	            : 0;
	if (r == 0 && (*status < 200 || *status > 299)) /* what was refused, for the message */
		snprintf(err, errsz, "%.*s", (int)(bl < 300 ? bl : 300), b ? (const char *)b : "");
	free(ans);
	free(b);
	return r;
}

/* Receive time of the deactivate of (sandbox, generation) in a worker log, or 0. */
static uint64_t deactivate_time(const char *log, const char *sbx, long long gen)
{
	char line[65536];
	uint64_t t = 0;
	FILE *f = fopen(log, "r");
	if (f == NULL)
		return 0;
	while (fgets(line, sizeof line, f) != NULL) {
		json_error_t jerr;
		json_t *m = json_loads(line, 0, &jerr);
		const char *type = json_string_value(json_object_get(m, "type"));
		json_t *id = json_object_get(m, "identity");
		const char *s = json_string_value(json_object_get(id, "sandbox"));
		if (type && strcmp(type, "deactivate") == 0 && s != NULL && strcmp(s, sbx) == 0 &&
		    json_integer_value(json_object_get(id, "generation")) == gen)
			t = (uint64_t)json_integer_value(json_object_get(m, "t_ns"));
		json_decref(m);
	}
	fclose(f);
	return t;
}

struct poller {
	char *url;
	char path[256];
	char *cap;
	volatile int stop;
	uint64_t refused_at;
	int last_status;
};

static void *poll_old(void *arg)
{
	struct poller *p = arg;
	char err[256];
	while (!p->stop) {
		int status = 0;
		char *ans = NULL;
		if (http_request(p->url, "GET", p->path, p->cap, NULL, &status, &ans, err, sizeof err) == 0) {
			free(ans);
			p->last_status = status;
			if (status != 200) {
				p->refused_at = now_ns();
				break;
			}
		}
	}
	return NULL;
}

/* The worker URL and a fresh fs.read capability of the current execution. */
static int route_fs_read(const char *url, const char *key, const char *sbx, char **wurl, char **cap)
{
	char path[256], err[256], *ans = NULL;
	int status = 0;
	json_error_t jerr;
	snprintf(path, sizeof path, "/v1/sandboxes/%s/route", sbx);
	if (http_request(url, "POST", path, key, "{\"purposes\":[\"fs.read\"]}", &status, &ans, err, sizeof err) < 0 ||
	    status != 200) {
		free(ans);
		return -1;
	}
	json_t *r = json_loads(ans, 0, &jerr);
	free(ans);
	const char *u = json_string_value(json_object_get(r, "worker_url"));
	const char *c = json_string_value(json_object_get(r, "capability"));
	if (u == NULL || c == NULL) {
		json_decref(r);
		return -1;
	}
	*wurl = strdup(u);
	*cap = strdup(c);
	json_decref(r);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 8) {
		fprintf(stderr, "usage: bench-cp URL API_KEY SANDBOX WORKER_A WORKER_B LOG_A LOG_B [ROUTES] [MOVES] [poll|-] "
		        "[CREATES]\n");
		return 2;
	}
	const char *url = argv[1], *key = argv[2], *sbx = argv[3];
	const char *wk[2] = {argv[4], argv[5]}, *logs[2] = {argv[6], argv[7]};
	int routes = argc > 8 ? atoi(argv[8]) : 500, moves = argc > 9 ? atoi(argv[9]) : 20;
	int poll = argc > 10 && strcmp(argv[10], "poll") == 0;
	/* not on real workers (poll): each would start a sandbox */
	int creates = argc > 11 ? atoi(argv[11]) : poll ? 0 : 200;
	/* on WORKER_A: the sandbox's own worker stays as it is for the moves */
	char create_body[128];
	snprintf(create_body, sizeof create_body, "{\"worker\":\"%s\"}", wk[0]);
	char path[256], err[256], body[128];
	uint64_t *rt = calloc((size_t)routes, sizeof *rt), *mv = calloc((size_t)moves, sizeof *mv),
	         *win = calloc((size_t)moves, sizeof *win);
	int nwin = 0;
	if (rt == NULL || mv == NULL || win == NULL || routes < 1 || moves < 1 || creates < 0)
		return 1;
	snprintf(path, sizeof path, "/v1/sandboxes/%s/route", sbx);
	uint64_t t_all = now_ns();
	for (int i = 0; i < routes; i++) {
		int status;
		char *ans = NULL;
		uint64_t t0 = now_ns();
		if (http_request(url, "POST", path, key, "{\"purposes\":[\"exec\"]}", &status, &ans, err, sizeof err) < 0 ||
		    status != 200) {
			fprintf(stderr, "bench-cp: route: %s %d\n", err, status);
			return 1;
		}
		rt[i] = now_ns() - t0;
		free(ans);
	}
	double route_rate = routes / ((double)(now_ns() - t_all) / 1e9);
	/* the same on one kept-alive connection: what a route costs once connected */
	uint64_t *rk = calloc((size_t)routes, sizeof *rk), *ck = calloc((size_t)creates + 1, sizeof *ck);
	struct kept kc;
	if (rk == NULL || ck == NULL ||
	    http_parse_url(url, kc.host, sizeof kc.host, &kc.port, kc.prefix, sizeof kc.prefix, &kc.tls) < 0)
		return 1;
	http_conns_init(&kc.c);
	for (int i = 0; i < routes; i++) {
		int status = 0;
		uint64_t t0 = now_ns();
		if (kept_post(&kc, path, key, "{\"purposes\":[\"exec\"]}", &status, err, sizeof err) < 0 ||
		    status != 200) {
			fprintf(stderr, "bench-cp: route on a kept connection: %s %d\n", err, status);
			return 1;
		}
		rk[i] = now_ns() - t0;
	}
	unsigned long kept_opened = kc.c.opened;
	/* creates, one after the other on the same connection */
	uint64_t cpu0 = bench_host_cpu_ns(), tc0 = now_ns();
	for (int i = 0; i < creates; i++) {
		int status = 0;
		uint64_t t0 = now_ns();
		if (kept_post(&kc, "/v1/sandboxes", key, create_body, &status, err, sizeof err) < 0 || status != 201) {
			fprintf(stderr, "bench-cp: create on a kept connection: %s %d\n", err, status);
			return 1;
		}
		ck[i] = now_ns() - t0;
	}
	uint64_t cpu1 = bench_host_cpu_ns(), tc1 = now_ns();
	double create_cpu_us = creates && cpu0 && cpu1 > cpu0 ? (double)(cpu1 - cpu0) / 1e3 / creates : -1;
	double create_rate = creates / ((double)(tc1 - tc0) / 1e9);
	http_conns_close(&kc.c);
	snprintf(path, sizeof path, "/v1/sandboxes/%s/move", sbx);
	for (int i = 0; i < moves; i++) {
		int status;
		char *ans = NULL;
		json_error_t jerr;
		/* where it is now: the worker that will get the deactivation */
		char gpath[256];
		snprintf(gpath, sizeof gpath, "/v1/sandboxes/%s", sbx);
		if (http_request(url, "GET", gpath, key, NULL, &status, &ans, err, sizeof err) < 0 || status != 200)
			return 1;
		json_t *s = json_loads(ans, 0, &jerr);
		free(ans);
		const char *cur = json_string_value(json_object_get(s, "worker"));
		long long gen = json_integer_value(json_object_get(s, "generation"));
		int from = cur && strcmp(cur, wk[0]) == 0 ? 0 : 1;
		json_decref(s);
		snprintf(body, sizeof body, "{\"to\":\"%s\"}", wk[1 - from]);
		struct poller pl = {0};
		pthread_t th;
		int polling = 0;
		if (poll) {
			char *wurl = NULL;
			if (route_fs_read(url, key, sbx, &wurl, &pl.cap) < 0) {
				fprintf(stderr, "bench-cp: no fs.read route\n");
				return 1;
			}
			pl.url = wurl;
			snprintf(pl.path, sizeof pl.path, "/v1/sandboxes/%s/stat?path=/", sbx);
		}
		uint64_t t0 = now_ns();
		if (poll)
			polling = pthread_create(&th, NULL, poll_old, &pl) == 0;
		if (http_request(url, "POST", path, key, body, &status, &ans, err, sizeof err) < 0 || status != 200) {
			fprintf(stderr, "bench-cp: move: %s %d %s\n", err, status, ans ? ans : "");
			return 1;
		}
		mv[i] = now_ns() - t0;
		free(ans);
		if (polling) {
			/* the old worker must refuse by now; give the poller a moment to see it */
			for (int k = 0; k < 200 && pl.refused_at == 0; k++)
				usleep(5000);
			pl.stop = 1;
			pthread_join(th, NULL);
			if (pl.refused_at > t0)
				win[nwin++] = pl.refused_at - t0;
			free(pl.url);
			free(pl.cap);
		} else {
			uint64_t td = deactivate_time(logs[from], sbx, gen);
			if (td > t0)
				win[nwin++] = td - t0;
		}
	}
	double r50 = pct(rt, routes, 0.5), r99 = pct(rt, routes, 0.99);
	double k50 = pct(rk, routes, 0.5), k99 = pct(rk, routes, 0.99);
	double m50 = pct(mv, moves, 0.5), m99 = pct(mv, moves, 0.99);
	double c50 = creates ? pct(ck, creates, 0.5) : -1, c99 = creates ? pct(ck, creates, 0.99) : -1;
	double w50 = nwin ? pct(win, nwin, 0.5) : -1, wmax = nwin ? pct(win, nwin, 1.0) : -1;
	printf("route issuance:  %d requests, median %.0f µs, p99 %.0f µs, %.0f routes/s (one client, new connection each)\n",
	       routes, r50, r99, route_rate);
	printf("route, kept:     %d requests, median %.0f µs, p99 %.0f µs (one kept-alive connection; %lu opened)\n",
	       routes, k50, k99, kept_opened);
	if (creates)
		printf("create, kept:    %d creates, median %.0f µs, p99 %.0f µs, %.0f creates/s, host CPU %.0f µs per "
		       "create (one kept-alive connection, one after the other)\n",
		       creates, c50, c99, create_rate, create_cpu_us);
	printf("move:            %d moves, median %.1f ms, p99 %.1f ms (deactivate + snapshot + generation commit + install)\n",
	       moves, m50 / 1e3, m99 / 1e3);
	printf("R4 window:       move request -> %s: median %.0f µs, max %.0f µs (%d samples)\n",
	       poll ? "first refusal of the old capability at the old worker" : "old worker holds the deactivation",
	       w50, wmax, nwin);
	printf("{\"route_median_us\":%.0f,\"route_p99_us\":%.0f,\"routes_per_s\":%.0f,\"route_kept_median_us\":%.0f,"
	       "\"route_kept_p99_us\":%.0f,\"create_kept_median_us\":%.0f,\"create_kept_p99_us\":%.0f,"
	       "\"create_cpu_us\":%.0f,\"move_median_ms\":%.1f,"
	       "\"move_p99_ms\":%.1f,\"r4_window_median_us\":%.0f,\"r4_window_max_us\":%.0f}\n",
	       r50, r99, route_rate, k50, k99, c50, c99, create_cpu_us, m50 / 1e3, m99 / 1e3, w50, wmax);
	free(rt);
	free(rk);
	free(ck);
	free(mv);
	free(win);
	return 0;
}
