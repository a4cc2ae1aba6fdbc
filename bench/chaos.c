/*
 * chaos.c — the route-chaos soak: client threads write, read and exec through
 * cached routes (spacectl/client.h) while a chaos thread keeps pausing,
 * resuming and moving the sandboxes between workers, and long-lived watches
 * and terminals stay open throughout.
 *
 *   bench-chaos [OPS]
 *
 * Environment: CHAOS_DIR (a cluster from `spacectl dev up --workers 3 --dir
 * DIR` to use; otherwise one is started in a fresh directory and torn down at
 * the end), CHAOS_SANDBOXES (20), CHAOS_THREADS (16 client threads),
 * CHAOS_WORKERS (3, for a cluster started here), CHAOS_MAX_SECONDS (3600: the
 * run stops at this bound even short of OPS), CHAOS_OP_TIMEOUT (10 s per
 * request), CHAOS_MIX (write,read,exec weights: 1,1,1), CHAOS_PERIOD_MS (10:
 * the chaos thread's pause between two lifecycle requests), CHAOS_KEEPALIVE
 * (1: client threads keep worker connections alive; 0: one per request),
 * CHAOS_QEMU (0: the first N sandboxes are qemu substrate microVMs, 192 MiB
 * each, the others process executions; a cluster started here then offers
 * both, `dev up --substrate qemu`).
 * SIGINT / SIGTERM end the run early: figures are printed and the cluster is
 * torn down.
 *
 * Checks (DESIGN.md I2, V2–V5, S1–S2):
 *  - every answer's X-Spaced-Identity names the requested sandbox, one of the
 *    identities the control plane selected for it (as answered to the chaos
 *    thread's pause / resume / move), of a generation no older than the one
 *    selected when the operation started; otherwise it is `misdelivered`;
 *  - every read returns the last acknowledged write of that sandbox (content
 *    unique per sandbox and per write), every exec the unique token it echoed;
 *    otherwise `misdelivered`;
 *  - a watch or terminal closed with 4409 refresh-route is reopened through a
 *    repaired route (`streams_cut_on_replacement`); any other end of an
 *    admitted stream is `streams_dropped_wrongly` (it is reopened too); a
 *    terminal must answer the lines typed into it.
 * Operations that fail while their sandbox is being paused or is paused
 * (`paused_failures`) are expected; error_rate = failed_after_retry / ops,
 * where failed_after_retry counts the operations that failed (after the
 * client's one retry) with their sandbox running throughout.
 * Last line JSON.
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "client.h"
#include "http_client.h"
#include "identity.h"
#include "net.h"
#include "util.h"

#define MAX_SBX 256
#define HIST 16
#define TOKEN_MAX 160

struct sbx {
	char id[64];
	pthread_mutex_t op_lock;    /* one client operation at a time: reads check the last write */
	pthread_mutex_t chaos_lock; /* held by the chaos thread around a lifecycle request */
	pthread_mutex_t id_lock;    /* hist, gen, worker */
	char hist[HIST][512];       /* identities the control plane selected, newest last */
	int nhist;
	uint64_t gen;               /* generation currently selected */
	char worker[64];
	atomic_int pause_epoch;     /* odd while a pause..resume is in progress */
	char acked[TOKEN_MAX];      /* last acknowledged write ("" before the first) */
	char pending[TOKEN_MAX];    /* a write whose outcome is unknown ("" when none) */
	unsigned long seq;
};

static struct sbx sbxs[MAX_SBX];
static int nsbx = 20, nworkers = 3, op_timeout = 10, nqemu = 0;
static int mix[3] = {1, 1, 1}; /* relative weights of write, read, exec */
static char cp_url[512], api_key[512], cache_dir[4096];
static long target_ops = 20000, max_seconds = 3600, chaos_period_ms = 10;
static atomic_long ops, misdelivered, failed_after_retry, paused_failures, refreshes, moves, pauses,
	chaos_errors, cut_on_replacement, dropped_wrongly, watch_opens, watch_events, term_opens, term_echoes,
	claimed;
static atomic_int stop;
static atomic_long conns_opened, conns_reused;
static double t_start; /* when the client threads started */
static double now_s(void);
static int keepalive = 1; /* CHAOS_KEEPALIVE=0: a new connection per request */
/* failures after retry by kind: no route, ALLOW with another status, REFRESH_ROUTE, DENY, transport */
static atomic_long fail_kind[6];
static char first_misdelivery[1024], first_failure[1024], first_paused_failure[1024];
static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;

/* what: a phrase; a and b: what answered and what was expected */
static void note_misdelivery(const char *what, const char *a, const char *b)
{
	atomic_fetch_add(&misdelivered, 1);
	pthread_mutex_lock(&report_lock);
	if (first_misdelivery[0] == 0)
		snprintf(first_misdelivery, sizeof first_misdelivery, "%s: %s (expected %s)", what, a, b);
	pthread_mutex_unlock(&report_lock);
}

/* ---- the control plane ---- */

static int cp_call(const char *method, const char *path, const char *body, int *status, json_t **ans)
{
	char err[512], *text = NULL;
	if (http_request(cp_url, method, path, api_key, body, status, &text, err, sizeof err) < 0)
		return -1;
	json_error_t jerr;
	*ans = text[0] ? json_loads(text, 0, &jerr) : NULL;
	free(text);
	return 0;
}

/* Records the identity of a Sandbox answer as selected by the control plane. */
static void record_selected(struct sbx *s, json_t *sandbox)
{
	struct spaced_identity id;
	char text[512];
	json_t *route = json_object_get(sandbox, "route");
	if (!json_is_object(route) || spaced_identity_from_json(&id, route) < 0 ||
	    spaced_identity_encode(&id, text, sizeof text) < 0)
		return;
	pthread_mutex_lock(&s->id_lock);
	if (s->nhist == 0 || strcmp(s->hist[(s->nhist - 1) % HIST], text) != 0) {
		snprintf(s->hist[s->nhist % HIST], sizeof s->hist[0], "%s", text);
		s->nhist++;
	}
	s->gen = id.generation;
	snprintf(s->worker, sizeof s->worker, "%s", id.worker);
	pthread_mutex_unlock(&s->id_lock);
}

/* ident must be the identity selected when the operation started (history
 * entry h0 - 1) or one selected since; h0 == 0 accepts any still recorded. */
static int identity_known(struct sbx *s, const char *ident, int h0)
{
	struct spaced_identity id;
	int ok = 0;
	if (spaced_identity_decode(&id, ident, strlen(ident)) < 0 || strcmp(id.sandbox, s->id) != 0)
		return 0;
	pthread_mutex_lock(&s->id_lock);
	int lo = h0 > 0 ? h0 - 1 : 0;
	if (lo < s->nhist - HIST)
		lo = s->nhist - HIST;
	for (int i = s->nhist - 1; i >= lo && !ok; i--)
		ok = strcmp(s->hist[i % HIST], ident) == 0;
	pthread_mutex_unlock(&s->id_lock);
	return ok;
}

/* I2: the serving identity is the one the control plane had selected for
 * this sandbox when the operation started, or one it selected since (never an
 * older incarnation). A lifecycle request in flight may not be recorded yet:
 * wait for it once. */
static int identity_ok(struct sbx *s, const char *ident, int h0)
{
	if (identity_known(s, ident, h0))
		return 1;
	pthread_mutex_lock(&s->chaos_lock);
	pthread_mutex_unlock(&s->chaos_lock);
	if (identity_known(s, ident, h0))
		return 1;
	/* a transition the chaos thread has not seen answered (e.g. its request
	 * timed out but the control plane completed it): ask the control plane */
	char path[128];
	int st = 0;
	json_t *a = NULL;
	snprintf(path, sizeof path, "/v1/sandboxes/%s", s->id);
	if (cp_call("GET", path, NULL, &st, &a) == 0 && st == 200)
		record_selected(s, a);
	json_decref(a);
	return identity_known(s, ident, h0);
}

/* ---- client operations ---- */

static int current_hist(struct sbx *s)
{
	pthread_mutex_lock(&s->id_lock);
	int h = s->nhist;
	pthread_mutex_unlock(&s->id_lock);
	return h;
}

static void client_op(struct client_opts *o, struct sbx *s, unsigned tid, unsigned *rnd)
{
	char op[512], body[512], err[512], token[TOKEN_MAX];
	struct client_request req = {0};
	struct client_answer a;
	unsigned pick = (unsigned)rand_r(rnd) % (unsigned)(mix[0] + mix[1] + mix[2]);
	int kind = pick < (unsigned)mix[0] ? 0 : pick < (unsigned)(mix[0] + mix[1]) ? 1 : 2; /* write, read, exec */
	pthread_mutex_lock(&s->op_lock);
	unsigned long seq = ++s->seq;
	snprintf(token, sizeof token, "%s-t%u-n%lu", s->id, tid, seq);
	if (kind == 1 && s->acked[0] == 0 && s->pending[0] == 0)
		kind = 0;
	req.timeout_s = op_timeout;
	if (kind == 0) {
		snprintf(op, sizeof op, "files?path=%%2Fworkspace%%2Fchaos.txt&mkdirs=1");
		req.method = "PUT";
		req.body = token;
		req.body_len = strlen(token);
		req.content_type = "application/octet-stream";
	} else if (kind == 1) {
		snprintf(op, sizeof op, "files?path=%%2Fworkspace%%2Fchaos.txt");
		req.method = "GET";
		req.idempotent = 1;
	} else {
		snprintf(op, sizeof op, "exec");
		snprintf(body, sizeof body, "{\"argv\":[\"echo\",\"%s\"]}", token);
		req.method = "POST";
		req.body = body;
		req.body_len = strlen(body);
		req.content_type = "application/json";
	}
	req.op = op;
	int pe0 = atomic_load(&s->pause_epoch);
	int h0 = current_hist(s);
	int rc = client_call(o, s->id, &req, &a, err, sizeof err);
	int pe1 = atomic_load(&s->pause_epoch);
	int paused = (pe0 & 1) || pe0 != pe1;
	int ok = 0, fkind = 0;
	char why[700];
	snprintf(why, sizeof why, "%s", err);
	atomic_fetch_add(&ops, 1);
	if (rc == 0) {
		if (a.refreshed)
			atomic_fetch_add(&refreshes, 1);
		if (a.outcome == CLIENT_ALLOW && a.identity[0] && !identity_ok(s, a.identity, h0))
			note_misdelivery("serving identity", a.identity, s->id);
		/* the client refused an answer that did not name its route's execution */
		if (a.outcome == CLIENT_UNVERIFIED)
			note_misdelivery("answer refused by the client", a.reason, s->id);
		snprintf(why, sizeof why, "outcome %d status %d %.200s %.200s", (int)a.outcome, a.status, a.reason,
		         a.body ? (const char *)a.body : "");
		fkind = 1 + (int)a.outcome;
		if (a.outcome == CLIENT_ALLOW && a.status == 200) {
			ok = 1;
			if (kind == 0) {
				snprintf(s->acked, sizeof s->acked, "%s", token);
				s->pending[0] = 0;
			} else if (kind == 1) {
				const char *got = (const char *)a.body;
				if (strcmp(got, s->acked) == 0 || (s->pending[0] && strcmp(got, s->pending) == 0)) {
					/* a write of unknown outcome that did happen is acknowledged now */
					snprintf(s->acked, sizeof s->acked, "%s", got);
					s->pending[0] = 0;
				} else {
					note_misdelivery("read", got, s->acked);
				}
			} else {
				json_error_t jerr;
				json_t *j = json_loadb((const char *)a.body, a.body_len, 0, &jerr);
				const char *out = json_string_value(json_object_get(j, "stdout"));
				char want[TOKEN_MAX + 2];
				snprintf(want, sizeof want, "%s\n", token);
				if (out == NULL || strcmp(out, want) != 0)
					note_misdelivery("exec output", out ? out : "(none)", token);
				json_decref(j);
			}
		}
		client_answer_clear(&a);
	}
	if (!ok) {
		if (kind == 0)
			snprintf(s->pending, sizeof s->pending, "%s", token);
		char *first = paused ? first_paused_failure : first_failure;
		atomic_fetch_add(paused ? &paused_failures : &failed_after_retry, 1);
		if (!paused)
			atomic_fetch_add(&fail_kind[fkind], 1);
		pthread_mutex_lock(&report_lock);
		if (first[0] == 0)
			snprintf(first, sizeof first_failure, "%s %s: %s", req.method, s->id, why);
		pthread_mutex_unlock(&report_lock);
		/* every failure after retry (the first 100) on stderr, as it happens */
		if (!paused && atomic_load(&failed_after_retry) <= 100)
			fprintf(stderr, "chaos: %.3f s: failure after retry: %s %s (%s): %s\n", now_s() - t_start, req.method,
			        s->id, kind == 0 ? "write" : kind == 1 ? "read" : "exec", why);
	}
	pthread_mutex_unlock(&s->op_lock);
}

struct worker_arg {
	unsigned tid;
};

static void *client_thread(void *p)
{
	struct worker_arg *wa = p;
	unsigned rnd = 0x9e3779b9u * (wa->tid + 1);
	struct http_conns conns;
	http_conns_init(&conns);
	struct client_opts o = {.cp_url = cp_url, .api_key = api_key, .cache_dir = cache_dir,
	                        .conns = keepalive ? &conns : NULL};
	while (!atomic_load(&stop)) {
		if (atomic_fetch_add(&claimed, 1) >= target_ops)
			break;
		client_op(&o, &sbxs[rand_r(&rnd) % (unsigned)nsbx], wa->tid, &rnd);
	}
	atomic_fetch_add(&conns_opened, (long)conns.opened);
	atomic_fetch_add(&conns_reused, (long)conns.reused);
	http_conns_close(&conns);
	return NULL;
}

/* ---- the chaos thread ---- */

static void chaos_request(struct sbx *s, const char *verb, const char *body)
{
	char path[128];
	int st = 0;
	json_t *a = NULL;
	snprintf(path, sizeof path, "/v1/sandboxes/%s/%s", s->id, verb);
	/* past the tenant's rate of lifecycle operations (spaced-cp --create-rate)
	 * the control plane did nothing: sent again after its retry_after, as
	 * the SDKs do, three times at most */
	for (int tries = 0; tries < 4; tries++) {
		json_decref(a);
		a = NULL;
		if (cp_call("POST", path, body, &st, &a) != 0 || st != 429 || atomic_load(&stop))
			break;
		json_t *ra = json_object_get(a, "retry_after");
		double secs = json_is_number(ra) ? json_number_value(ra) : 1;
		struct timespec ts = {0, 0};
		secs = secs < 0.05 ? 0.05 : secs > 5 ? 5 : secs;
		ts.tv_sec = (time_t)secs;
		ts.tv_nsec = (long)((secs - (double)ts.tv_sec) * 1e9);
		nanosleep(&ts, NULL);
	}
	if (st == 200 && a != NULL)
		record_selected(s, a);
	else
		atomic_fetch_add(&chaos_errors, 1);
	json_decref(a);
}

static void *chaos_thread(void *p)
{
	(void)p;
	unsigned rnd = 12345;
	while (!atomic_load(&stop)) {
		struct sbx *s = &sbxs[rand_r(&rnd) % (unsigned)nsbx];
		pthread_mutex_lock(&s->chaos_lock);
		if (rand_r(&rnd) % 3 == 0) {
			atomic_fetch_add(&s->pause_epoch, 1);
			chaos_request(s, "pause", "{}");
			struct timespec ts = {0, 20 * 1000 * 1000};
			nanosleep(&ts, NULL);
			chaos_request(s, "resume", "{}");
			atomic_fetch_add(&s->pause_epoch, 1);
			atomic_fetch_add(&pauses, 1);
		} else {
			char to[64], body[128];
			pthread_mutex_lock(&s->id_lock);
			int cur = atoi(s->worker + strlen("worker-"));
			pthread_mutex_unlock(&s->id_lock);
			int k = 1 + (int)(rand_r(&rnd) % (unsigned)(nworkers - 1));
			snprintf(to, sizeof to, "worker-%d", (cur - 1 + k) % nworkers + 1);
			snprintf(body, sizeof body, "{\"to\":\"%s\"}", to);
			chaos_request(s, "move", body);
			atomic_fetch_add(&moves, 1);
		}
		pthread_mutex_unlock(&s->chaos_lock);
		for (long left = chaos_period_ms; left > 0 && !atomic_load(&stop); left -= 10) {
			struct timespec ts = {0, (left < 10 ? left : 10) * 1000 * 1000};
			nanosleep(&ts, NULL);
		}
	}
	return NULL;
}

/* ---- watches: a minimal WebSocket client (RFC 6455), one thread per watch ---- */

static int read_full(struct net_conn *fd, void *buf, size_t n)
{
	unsigned char *p = buf;
	while (n > 0) {
		ssize_t r = net_recv(fd, p, n, 0);
		if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
			if (atomic_load(&stop))
				return -1;
			continue;
		}
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

static int write_full(struct net_conn *fd, const void *buf, size_t n)
{
	const unsigned char *p = buf;
	while (n > 0) {
		ssize_t w = net_send(fd, p, n, 0);
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

enum { WS_REFRESH = 1, WS_DROPPED, WS_STOPPED, WS_REFUSED };
enum stream_kind { STREAM_WATCH, STREAM_TERM };

/* One client → server frame (masked, with a zero mask: RFC 6455 asks for a
 * mask, not a secret one here). */
static int ws_send(struct net_conn *fd, int opcode, const void *p, size_t n)
{
	unsigned char h[8] = {(unsigned char)(0x80 | opcode)};
	size_t hl = 2;
	if (n < 126) {
		h[1] = (unsigned char)(0x80 | n);
	} else {
		h[1] = 0x80 | 126;
		h[2] = (unsigned char)(n >> 8);
		h[3] = (unsigned char)n;
		hl = 4;
	}
	memset(h + hl, 0, 4);
	unsigned char one[8 + 256];
	if (n <= 256) { /* one write: with TLS, one record */
		memcpy(one, h, hl + 4);
		memcpy(one + hl + 4, p, n);
		return write_full(fd, one, hl + 4 + n);
	}
	return write_full(fd, h, hl + 4) < 0 || write_full(fd, p, n) < 0 ? -1 : 0;
}

/* One watch or terminal stream through rt: returns WS_REFRESH (4409 after
 * admission), WS_REFUSED (closed before admission), WS_DROPPED or
 * WS_STOPPED. A terminal runs /bin/sh; every 300 ms it types `echo TOKEN`
 * (unique per sandbox and line) and counts the token coming back. */
static int stream_once(enum stream_kind kind, struct sbx *s, const struct client_route *rt, int h0,
                       int *admitted)
{
	char typed[TOKEN_MAX + 16] = "", seen[8192];
	size_t seen_len = 0;
	unsigned long line = 0;
	uint64_t next_input = 0;
	char host[256], prefix[256], *req = NULL, cerr[512];
	int iport, tls, res = WS_DROPPED;
	struct net_conn *fd = NULL;
	unsigned char *payload = NULL;
	*admitted = 0;
	if (http_parse_url(rt->worker_url, host, sizeof host, &iport, prefix, sizeof prefix, &tls) < 0)
		goto out;
	if (net_connect(host, iport, tls, 10, &fd, cerr, sizeof cerr) < 0)
		goto out;
	net_set_timeout_ms(fd, 200);
	if (asprintf(&req,
	             "GET %s/v1/sandboxes/%s/%s HTTP/1.1\r\nHost: %s:%d\r\n"
	             "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: c3BhY2VkLWNoYW9zLWtleQ==\r\n"
	             "Sec-WebSocket-Version: 13\r\nAuthorization: Bearer %s\r\n\r\n",
	             prefix, s->id,
	             kind == STREAM_TERM ? "term?argv=%2Fbin%2Fsh&rows=24&cols=200" : "watch?path=%2Fworkspace", host,
	             iport, rt->capability) < 0) {
		req = NULL;
		goto out;
	}
	if (write_full(fd, req, strlen(req)) < 0)
		goto out;
	/* the upgrade answer, byte by byte up to its blank line */
	char hdr[4096];
	size_t hl = 0;
	while (hl < sizeof hdr - 1) {
		if (read_full(fd, hdr + hl, 1) < 0)
			goto out;
		hl++;
		if (hl >= 4 && memcmp(hdr + hl - 4, "\r\n\r\n", 4) == 0)
			break;
	}
	hdr[hl] = 0;
	if (strncmp(hdr, "HTTP/1.1 101", 12) != 0) {
		res = WS_REFUSED;
		goto out;
	}
	payload = malloc(1 << 20);
	if (payload == NULL)
		goto out;
	for (;;) {
		unsigned char h[2], ext[8];
		if (kind == STREAM_TERM && *admitted) {
			/* type the next line when due; wait for output meanwhile */
			uint64_t now = spaced_mono_ns();
			if (now >= next_input) {
				char in[TOKEN_MAX + 32];
				snprintf(typed, sizeof typed, "%s-term-%lu", s->id, ++line);
				int n = snprintf(in, sizeof in, "iecho %s\n", typed);
				if (ws_send(fd, 2, in, (size_t)n) < 0)
					goto out;
				seen_len = 0;
				next_input = now + 300u * 1000000u;
			}
			struct pollfd pf = {.fd = net_fd(fd), .events = POLLIN};
			if (!net_pending(fd) && poll(&pf, 1, 100) == 0) {
				if (atomic_load(&stop)) {
					res = WS_STOPPED;
					goto out;
				}
				continue;
			}
		}
		if (read_full(fd, h, 2) < 0) {
			res = atomic_load(&stop) ? WS_STOPPED : (*admitted ? WS_DROPPED : WS_REFUSED);
			goto out;
		}
		uint64_t len = h[1] & 0x7f;
		if (len == 126) {
			if (read_full(fd, ext, 2) < 0)
				goto out;
			len = ((uint64_t)ext[0] << 8) | ext[1];
		} else if (len == 127) {
			if (read_full(fd, ext, 8) < 0)
				goto out;
			len = 0;
			for (int i = 0; i < 8; i++)
				len = (len << 8) | ext[i];
		}
		if ((h[1] & 0x80) || len >= (1 << 20)) /* a server never masks; bounded */
			goto out;
		if (read_full(fd, payload, (size_t)len) < 0)
			goto out;
		payload[len] = 0;
		int opcode = h[0] & 0x0f;
		if (opcode == 8) {
			int code = len >= 2 ? (payload[0] << 8) | payload[1] : 0;
			if (code == 4409)
				res = *admitted ? WS_REFRESH : WS_REFUSED;
			else
				res = *admitted ? WS_DROPPED : WS_REFUSED;
			goto out;
		}
		if (opcode == 9) { /* ping: a masked pong with a zero mask */
			unsigned char pong[6 + 125] = {0x8a, (unsigned char)(0x80 | (len & 0x7f)), 0, 0, 0, 0};
			if (len <= 125) {
				memcpy(pong + 6, payload, (size_t)len);
				write_full(fd, pong, 6 + (size_t)len);
			}
			continue;
		}
		if (opcode == 2 && kind == STREAM_TERM && *admitted && len > 1 && payload[0] == 'o') {
			/* the terminal's output: the typed token comes back (echoed by the
			 * terminal, then printed by the shell) */
			size_t n = (size_t)len - 1;
			if (n > sizeof seen - 1 - seen_len) {
				size_t keep = seen_len > 512 ? 512 : seen_len;
				memmove(seen, seen + seen_len - keep, keep);
				seen_len = keep;
				if (n > sizeof seen - 1 - seen_len)
					n = sizeof seen - 1 - seen_len;
			}
			memcpy(seen + seen_len, payload + 1, n);
			seen_len += n;
			seen[seen_len] = 0;
			char want[TOKEN_MAX + 20];
			snprintf(want, sizeof want, "\n%s\r", typed); /* the shell's line, not the echoed input */
			if (typed[0] && strstr(seen, want) != NULL) {
				atomic_fetch_add(&term_echoes, 1);
				typed[0] = 0;
			}
			continue;
		}
		if (opcode != 1)
			continue;
		json_error_t jerr;
		json_t *m = json_loads((const char *)payload, 0, &jerr);
		if (!*admitted) {
			const char *oc = json_string_value(json_object_get(m, "outcome"));
			const char *id = json_string_value(json_object_get(m, "identity"));
			if (oc == NULL || strcmp(oc, "ALLOW") != 0) {
				json_decref(m);
				res = WS_REFUSED;
				goto out;
			}
			if (id == NULL || !identity_ok(s, id, h0))
				note_misdelivery(kind == STREAM_TERM ? "terminal admitted by" : "watch admitted by",
				                 id ? id : "(none)", s->id);
			*admitted = 1;
			atomic_fetch_add(kind == STREAM_TERM ? &term_opens : &watch_opens, 1);
		} else if (kind == STREAM_WATCH) {
			atomic_fetch_add(&watch_events, 1);
		} else if (json_object_get(m, "exit") != NULL) {
			/* the shell ended: the stream ends with it (1000), a drop */
			json_decref(m);
			res = WS_DROPPED;
			goto out;
		}
		json_decref(m);
		if (atomic_load(&stop)) {
			res = WS_STOPPED;
			goto out;
		}
	}
out:
	if (atomic_load(&stop))
		res = WS_STOPPED;
	free(payload);
	free(req);
	net_close(fd);
	return res;
}

struct stream_arg {
	enum stream_kind kind;
	struct sbx *s;
};

static void *stream_thread(void *p)
{
	struct stream_arg *sa = p;
	struct sbx *s = sa->s;
	/* its own route cache entry: a stream is another client */
	char dir[4200];
	snprintf(dir, sizeof dir, "%s-%s-%s", cache_dir, sa->kind == STREAM_TERM ? "term" : "watch", s->id);
	struct client_opts o = {.cp_url = cp_url, .api_key = api_key, .cache_dir = dir};
	struct client_route rt = {0};
	char err[512];
	int have = 0, h0 = current_hist(s);
	while (!atomic_load(&stop)) {
		if (!have) {
			h0 = current_hist(s);
			if (client_route_get(&o, s->id, &rt, err, sizeof err) < 0) {
				usleep(50 * 1000);
				continue;
			}
			have = 1;
		}
		int admitted = 0;
		int r = stream_once(sa->kind, s, &rt, h0, &admitted);
		if (r == WS_STOPPED)
			break;
		if (r == WS_REFRESH)
			atomic_fetch_add(&cut_on_replacement, 1);
		else if (r == WS_DROPPED && admitted)
			atomic_fetch_add(&dropped_wrongly, 1);
		/* reopen through a repaired route (V5) */
		struct client_route fresh = {0};
		int replaced = 0;
		h0 = current_hist(s);
		if (client_route_repair(&o, s->id, &rt, &fresh, &replaced, err, sizeof err) == 0) {
			client_route_clear(&rt);
			rt = fresh;
		} else {
			usleep(50 * 1000);
		}
	}
	if (have)
		client_route_clear(&rt);
	return NULL;
}

/* ---- the cluster ---- */

static int load_env(const char *dir)
{
	char p[4200], line[1024];
	snprintf(p, sizeof p, "%s/env", dir);
	FILE *f = fopen(p, "r");
	if (f == NULL)
		return -1;
	while (fgets(line, sizeof line, f)) {
		line[strcspn(line, "\n")] = 0;
		/* a value longer than its buffer is not taken (it would be cut) */
		if (strncmp(line, "SPACED_CP_URL=", 14) == 0 && strlen(line + 14) < sizeof cp_url)
			memcpy(cp_url, line + 14, strlen(line + 14) + 1);
		else if (strncmp(line, "SPACED_API_KEY=", 15) == 0 && strlen(line + 15) < sizeof api_key)
			memcpy(api_key, line + 15, strlen(line + 15) + 1);
		else if (strncmp(line, "SPACED_CA_FILE=", 15) == 0)
			setenv("SPACED_CA_FILE", line + 15, 1); /* a TLS cluster: its CA, for every connection */
	}
	fclose(f);
	return cp_url[0] && api_key[0] ? 0 : -1;
}

static void on_signal(int sig)
{
	(void)sig;
	atomic_store(&stop, 1);
}

static double now_s(void)
{
	return (double)spaced_mono_ns() / 1e9;
}

int main(int argc, char **argv)
{
	char dir[4096], cmd[8500];
	const char *e;
	int own = 0, rc = 1, nthreads = 16;
	signal(SIGPIPE, SIG_IGN);
	/* interrupted: stop the run, print what was measured and tear the cluster down */
	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	if (argc > 1)
		target_ops = atol(argv[1]);
	if ((e = getenv("CHAOS_SANDBOXES")))
		nsbx = atoi(e);
	if ((e = getenv("CHAOS_THREADS")))
		nthreads = atoi(e);
	if ((e = getenv("CHAOS_WORKERS")))
		nworkers = atoi(e);
	if ((e = getenv("CHAOS_MAX_SECONDS")))
		max_seconds = atol(e);
	if ((e = getenv("CHAOS_MIX")) && (sscanf(e, "%d,%d,%d", &mix[0], &mix[1], &mix[2]) != 3 || mix[0] < 1 ||
	                                  mix[1] < 0 || mix[2] < 0 || mix[0] + mix[1] + mix[2] > 1000)) {
		fprintf(stderr, "bench-chaos: CHAOS_MIX is WRITE,READ,EXEC weights, e.g. 1,1,1\n");
		return 2;
	}
	if ((e = getenv("CHAOS_QEMU")))
		nqemu = atoi(e);
	if ((e = getenv("CHAOS_KEEPALIVE")))
		keepalive = atoi(e) != 0;
	if ((e = getenv("CHAOS_PERIOD_MS")))
		chaos_period_ms = atol(e);
	if ((e = getenv("CHAOS_OP_TIMEOUT")))
		op_timeout = atoi(e);
	if (nsbx < 1 || nsbx > MAX_SBX || nthreads < 1 || nthreads > 64 || target_ops < 1 || max_seconds < 1 ||
	    nqemu < 0 || nqemu > nsbx) {
		fprintf(stderr, "bench-chaos: bad parameters\n");
		return 2;
	}
	char tmpl[] = "/tmp/spaced-chaos.XXXXXX";
	if (mkdtemp(tmpl) == NULL) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(cache_dir, sizeof cache_dir, "%s/routes", tmpl);
	if ((e = getenv("CHAOS_DIR")) && *e) {
		snprintf(dir, sizeof dir, "%s", e);
	} else {
		own = 1;
		snprintf(dir, sizeof dir, "%s/cluster", tmpl);
		snprintf(cmd, sizeof cmd, "'%s' dev up --workers %d --dir '%s'%s >/dev/null", SPACECTL_BIN, nworkers,
		         dir, nqemu > 0 ? " --substrate qemu" : "");
		double t0 = now_s();
		if (system(cmd) != 0) {
			fprintf(stderr, "bench-chaos: spacectl dev up failed; the cluster's logs:\n");
			snprintf(cmd, sizeof cmd, "tail -n 5 '%s'/*.log >&2", dir);
			if (system(cmd) != 0)
				fprintf(stderr, "bench-chaos: no logs\n");
			goto out;
		}
		printf("cluster: %d workers up in %.2f s (%s)\n", nworkers, now_s() - t0, dir);
	}
	if (load_env(dir) < 0) {
		fprintf(stderr, "bench-chaos: no usable %s/env\n", dir);
		goto out;
	}
	if (!own) {
		int st = 0;
		json_t *a = NULL;
		if (cp_call("GET", "/v1/workers", NULL, &st, &a) == 0 && st == 200)
			nworkers = (int)json_array_size(json_object_get(a, "workers"));
		json_decref(a);
	}
	if (nworkers < 2) {
		fprintf(stderr, "bench-chaos: at least two workers are needed to move sandboxes\n");
		goto out;
	}
	for (int i = 0; i < nsbx; i++) {
		struct sbx *s = &sbxs[i];
		char body[160];
		int st = 0;
		json_t *a = NULL;
		pthread_mutex_init(&s->op_lock, NULL);
		pthread_mutex_init(&s->chaos_lock, NULL);
		pthread_mutex_init(&s->id_lock, NULL);
		if (i < nqemu)
			snprintf(body, sizeof body, "{\"worker\":\"worker-%d\",\"substrate\":\"qemu\",\"memory_bytes\":201326592}",
			         i % nworkers + 1);
		else if (nqemu > 0)
			snprintf(body, sizeof body, "{\"worker\":\"worker-%d\",\"substrate\":\"process\"}", i % nworkers + 1);
		else
			snprintf(body, sizeof body, "{\"worker\":\"worker-%d\"}", i % nworkers + 1);
		if (cp_call("POST", "/v1/sandboxes", body, &st, &a) < 0 || st != 201 ||
		    !json_is_string(json_object_get(a, "id"))) {
			fprintf(stderr, "bench-chaos: creating sandbox %d: status %d\n", i, st);
			json_decref(a);
			goto out;
		}
		snprintf(s->id, sizeof s->id, "%s", json_string_value(json_object_get(a, "id")));
		record_selected(s, a);
		json_decref(a);
	}
	/* a watch on every 4th sandbox, a terminal on every 4th from the 2nd on */
	int nwatch = (nsbx + 3) / 4, nterm = (nsbx + 2) / 4, nstream = 0;
	static struct stream_arg sargs[MAX_SBX];
	for (int i = 0; i < nsbx; i++)
		if (i % 4 == 0 || i % 4 == 1)
			sargs[nstream++] = (struct stream_arg){i % 4 == 0 ? STREAM_WATCH : STREAM_TERM, &sbxs[i]};
	printf("%d sandboxes (%d qemu), %d client threads, %d watches, %d terminals, target %ld operations\n", nsbx,
	       nqemu, nthreads, nwatch, nterm, target_ops);
	fflush(stdout);
	pthread_t th[64], ch, wt[MAX_SBX];
	struct worker_arg wa[64];
	for (int i = 0; i < nstream; i++)
		pthread_create(&wt[i], NULL, stream_thread, &sargs[i]);
	double t0 = now_s();
	t_start = t0;
	for (int i = 0; i < nthreads; i++) {
		wa[i].tid = (unsigned)i;
		pthread_create(&th[i], NULL, client_thread, &wa[i]);
	}
	pthread_create(&ch, NULL, chaos_thread, NULL);
	/* progress and the time bound */
	long last = 0;
	while ((atomic_load(&claimed) < target_ops || atomic_load(&ops) < target_ops) && !atomic_load(&stop)) {
		sleep(1);
		double el = now_s() - t0;
		long n = atomic_load(&ops);
		if ((long)el % 10 == 0 && n != last) {
			fprintf(stderr, "chaos: %.0f s: %ld ops, %ld moves, %ld pauses, %ld misdelivered, %ld failed, "
			        "%ld paused failures\n", el, n, atomic_load(&moves), atomic_load(&pauses),
			        atomic_load(&misdelivered), atomic_load(&failed_after_retry), atomic_load(&paused_failures));
			last = n;
		}
		if (el > (double)max_seconds) {
			fprintf(stderr, "chaos: time bound of %ld s reached\n", max_seconds);
			break;
		}
	}
	atomic_store(&stop, 1);
	for (int i = 0; i < nthreads; i++)
		pthread_join(th[i], NULL);
	double el = now_s() - t0;
	pthread_join(ch, NULL);
	for (int i = 0; i < nstream; i++)
		pthread_join(wt[i], NULL);
	long n = atomic_load(&ops);
	if (first_misdelivery[0])
		printf("first misdelivery: %s\n", first_misdelivery);
	if (first_failure[0])
		printf("first failure after retry: %s\n", first_failure);
	printf("failures after retry: %ld without a route, %ld other status, %ld REFRESH_ROUTE after the retry, "
	       "%ld DENY, %ld transport, %ld without the route's identity\n", atomic_load(&fail_kind[0]),
	       atomic_load(&fail_kind[1]), atomic_load(&fail_kind[2]), atomic_load(&fail_kind[3]),
	       atomic_load(&fail_kind[4]), atomic_load(&fail_kind[5]));
	if (first_paused_failure[0])
		printf("first failure with the sandbox paused: %s\n", first_paused_failure);
	printf("worker connections: %ld opened, %ld reused\n", atomic_load(&conns_opened), atomic_load(&conns_reused));
	printf("%ld operations in %.1f s; %ld moves, %ld pauses (%ld lifecycle requests refused or failed); "
	       "%ld paused failures; %ld watch opens, %ld watch events\n",
	       n, el, atomic_load(&moves), atomic_load(&pauses), atomic_load(&chaos_errors),
	       atomic_load(&paused_failures), atomic_load(&watch_opens), atomic_load(&watch_events));
	printf("%ld terminal opens, %ld typed lines answered\n", atomic_load(&term_opens), atomic_load(&term_echoes));
	printf("{\"ops\":%ld,\"misdelivered\":%ld,\"failed_after_retry\":%ld,\"paused_failures\":%ld,"
	       "\"error_rate\":%.6f,\"refreshes\":%ld,\"moves\":%ld,\"pauses\":%ld,\"streams_cut_on_replacement\":%ld,"
	       "\"streams_dropped_wrongly\":%ld,\"ops_per_s\":%.1f,\"qemu_sandboxes\":%d}\n",
	       n, atomic_load(&misdelivered), atomic_load(&failed_after_retry), atomic_load(&paused_failures),
	       n ? (double)atomic_load(&failed_after_retry) / (double)n : 0.0, atomic_load(&refreshes),
	       atomic_load(&moves), atomic_load(&pauses), atomic_load(&cut_on_replacement),
	       atomic_load(&dropped_wrongly), el > 0 ? (double)n / el : 0.0, nqemu);
	rc = atomic_load(&misdelivered) || atomic_load(&dropped_wrongly) ? 1 : 0;
out:
	if (own) {
		snprintf(cmd, sizeof cmd, "'%s' dev down --dir '%s' >/dev/null 2>&1", SPACECTL_BIN, dir);
		if (system(cmd) != 0)
			fprintf(stderr, "bench-chaos: spacectl dev down failed\n");
	}
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpl);
	if (system(cmd) != 0)
		fprintf(stderr, "bench-chaos: cannot remove %s\n", tmpl);
	return rc;
}
