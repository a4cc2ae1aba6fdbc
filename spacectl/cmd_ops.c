/*
 * cmd_ops.c — operations on a sandbox through the worker that serves it:
 *   exec ID [--env K=V]... [--cwd DIR] [--timeout S] -- CMD [ARG...]
 *   fs read|write|ls|stat|mkdir|mv|rm ID PATH...
 *   watch ID PATH
 *   term ID [--env K=V]... [--cwd DIR] [-- CMD [ARG...]]
 * Every one takes [--route FILE] [--no-retry] [-v]; the route and its recovery
 * are client.h's.
 */
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <jansson.h>
#include <libwebsockets.h>

#include "cli.h"
#include "client.h"
#include "cmd_ops.h"
#include "util.h"

int ops_verbose;

enum { O_ROUTE = 1000, O_NORETRY, O_CACHE, O_ENV, O_CWD, O_TIMEOUT, O_DEPTH, O_MKDIRS, O_JSON, O_USER };

static const struct option common_opts[] = {
	{"route", required_argument, NULL, O_ROUTE},
	{"no-retry", no_argument, NULL, O_NORETRY},
	{"cache", required_argument, NULL, O_CACHE},
	{"verbose", no_argument, NULL, 'v'},
	{"env", required_argument, NULL, O_ENV},
	{"cwd", required_argument, NULL, O_CWD},
	{"timeout", required_argument, NULL, O_TIMEOUT},
	{"depth", required_argument, NULL, O_DEPTH},
	{"mkdirs", no_argument, NULL, O_MKDIRS},
	{"recursive", no_argument, NULL, 'r'},
	{"json", no_argument, NULL, O_JSON},
	{"user", required_argument, NULL, O_USER},
	{NULL, 0, NULL, 0},
};

struct opargs {
	struct client_opts o;
	json_t *env;
	const char *cwd;
	const char *user; /* exec --user: a user of the sandbox (name, uid or uid:gid) */
	long timeout_s;
	int depth;
	int mkdirs;
	int recursive;
	int json;
};

static const char usage_ops[] =
	"usage: spacectl exec ID [--env K=V]... [--cwd DIR] [--user U] [--timeout S] -- CMD [ARG...]\n"
	"       spacectl fs read|stat|mkdir|rm [-r] ID PATH...\n"
	"       spacectl fs write [--mkdirs] ID PATH      (the content is read from stdin)\n"
	"       spacectl fs ls [--depth N] ID PATH | fs mv ID FROM TO\n"
	"       spacectl watch ID PATH\n"
	"       spacectl top ID [--json]\n"
	"  each with [--route FILE] [--no-retry] [-v]\n";

/* Parses the options of every operation; returns the index of the first
 * operand, or -1 after printing the usage. */
static int parse(int argc, char **argv, struct opargs *a)
{
	memset(a, 0, sizeof *a);
	a->o.cp_url = getenv("SPACED_CP_URL");
	a->o.api_key = getenv("SPACED_API_KEY");
	a->o.verbose = ops_verbose;
	a->env = json_object();
	int c;
	optind = 0; /* glibc: a full reset (the previous parse may have stopped inside a cluster) */
	while ((c = getopt_long(argc, argv, "+vr", common_opts, NULL)) != -1) {
		switch (c) {
		case O_ROUTE: a->o.route_file = optarg; break;
		case O_NORETRY: a->o.no_retry = 1; break;
		case O_CACHE: a->o.cache_dir = optarg; break;
		case 'v': a->o.verbose = 1; break;
		case O_ENV: {
			const char *eq = strchr(optarg, '=');
			if (eq == NULL || eq == optarg)
				return -1;
			char k[256];
			if ((size_t)(eq - optarg) >= sizeof k)
				return -1;
			memcpy(k, optarg, (size_t)(eq - optarg));
			k[eq - optarg] = 0;
			json_object_set_new(a->env, k, json_string(eq + 1));
			break;
		}
		case O_CWD: a->cwd = optarg; break;
		case O_USER: a->user = optarg; break;
		case O_TIMEOUT: a->timeout_s = atol(optarg); if (a->timeout_s <= 0) return -1; break;
		case O_DEPTH: a->depth = atoi(optarg); if (a->depth < 1 || a->depth > 64) return -1; break;
		case O_MKDIRS: a->mkdirs = 1; break;
		case 'r': a->recursive = 1; break;
		case O_JSON: a->json = 1; break;
		default: return -1;
		}
	}
	return optind;
}

/* Options may also follow the ID (`fs read ID PATH --route F`): a second pass
 * over what follows the first operands. */
static int parse_rest(int argc, char **argv, struct opargs *a, int first, char **operands, int max)
{
	int n = 0;
	for (int i = first; i < argc; i++) {
		if (strcmp(argv[i], "--") == 0) {
			for (i++; i < argc; i++) {
				if (n >= max)
					return -1;
				operands[n++] = argv[i];
			}
			break;
		}
		if (argv[i][0] == '-' && argv[i][1] != 0) {
			/* re-parse this option (and its argument) */
			char *sub[3] = {argv[0], argv[i], i + 1 < argc ? argv[i + 1] : NULL};
			int subc = sub[2] ? 3 : 2;
			struct opargs keep = *a;
			json_t *env = a->env;
			optind = 0;
			int c = getopt_long(subc, sub, "+vr", common_opts, NULL);
			switch (c) {
			case O_ROUTE: keep.o.route_file = optarg; break;
			case O_NORETRY: keep.o.no_retry = 1; break;
			case O_CACHE: keep.o.cache_dir = optarg; break;
			case 'v': keep.o.verbose = 1; break;
			case O_CWD: keep.cwd = optarg; break;
			case O_USER: keep.user = optarg; break;
			case O_TIMEOUT: keep.timeout_s = atol(optarg); break;
			case O_DEPTH: keep.depth = atoi(optarg); break;
			case O_MKDIRS: keep.mkdirs = 1; break;
			case 'r': keep.recursive = 1; break;
			case O_JSON: keep.json = 1; break;
			case O_ENV: {
				const char *eq = strchr(optarg, '=');
				if (eq == NULL || eq == optarg || (size_t)(eq - optarg) >= 256)
					return -1;
				char k[256];
				memcpy(k, optarg, (size_t)(eq - optarg));
				k[eq - optarg] = 0;
				json_object_set_new(env, k, json_string(eq + 1));
				break;
			}
			default: return -1;
			}
			*a = keep;
			i += optind - 2;
			continue;
		}
		if (n >= max)
			return -1;
		operands[n++] = argv[i];
	}
	return n;
}

static int report_refusal(const char *what, const struct client_opts *o, const struct client_answer *a)
{
	if (a->outcome == CLIENT_TRANSPORT)
		return cli_fail(what, "transport failure: %s%s", a->reason,
		                a->attempts > 1 ? " (after one retry on a fresh connection)" : " (not retried)");
	if (o->no_retry)
		return 1; /* the outcome line says it all */
	if (a->outcome == CLIENT_DENY)
		return cli_fail(what, "DENY (%s): not retried", a->reason);
	return cli_fail(what, "REFRESH_ROUTE (%s)%s", a->reason, a->refreshed ? " after one retry" : "");
}

/* Sends one request; prints the outcome line for --no-retry. Returns 0 with an
 * ALLOW answer in *a, else the exit status (1). */
static int call(const char *what, struct opargs *oa, const char *sandbox, struct client_request *req,
                struct client_answer *a)
{
	char err[512];
	if (client_call(&oa->o, sandbox, req, a, err, sizeof err) < 0)
		return cli_fail(what, "%s", err);
	if (oa->o.no_retry) {
		if (a->outcome == CLIENT_ALLOW)
			fprintf(stderr, "outcome: ALLOW (%s)\n", a->identity[0] ? a->identity : "no identity");
		else if (a->outcome != CLIENT_TRANSPORT)
			fprintf(stderr, "outcome: %s (%s)\n", a->outcome == CLIENT_DENY ? "DENY" : "REFRESH_ROUTE", a->reason);
	}
	if (a->outcome != CLIENT_ALLOW) {
		int rc = report_refusal(what, &oa->o, a);
		client_answer_clear(a);
		return rc;
	}
	if (a->status < 200 || a->status > 299) {
		json_error_t jerr;
		json_t *b = json_loadb((const char *)a->body, a->body_len, 0, &jerr);
		const char *code = json_string_value(json_object_get(b, "code"));
		const char *msg = json_string_value(json_object_get(b, "error"));
		cli_fail(what, "%d %s%s%s", a->status, code ? code : "", msg ? ": " : "", msg ? msg : (const char *)a->body);
		json_decref(b);
		client_answer_clear(a);
		return 1;
	}
	return 0;
}

static int write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n > 0) {
		ssize_t w = write(fd, c, n);
		if (w <= 0)
			return -1;
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Writes a JSON answer's text member k (or k_b64url) to fd. */
static int put_stream(int fd, json_t *ans, const char *k)
{
	const char *s = json_string_value(json_object_get(ans, k));
	if (s != NULL)
		return write_all(fd, s, strlen(s));
	char kb[64];
	snprintf(kb, sizeof kb, "%s_b64url", k);
	s = json_string_value(json_object_get(ans, kb));
	if (s == NULL)
		return 0;
	size_t n = strlen(s), outl = 0;
	uint8_t *raw = malloc(spaced_b64url_decoded_max(n) + 1);
	if (raw == NULL)
		return -1;
	int r = spaced_b64url_decode(raw, &outl, s, n) < 0 ? -1 : write_all(fd, raw, outl);
	free(raw);
	return r;
}

int cmd_exec(int argc, char **argv)
{
	struct opargs oa;
	char *ops[4096];
	int rc = 2, first = parse(argc, argv, &oa);
	json_t *body = NULL, *ans = NULL;
	char *text = NULL;
	int n = first < 0 ? -1 : parse_rest(argc, argv, &oa, first, ops, 4096);
	if (n < 2) {
		rc = cli_usage(usage_ops);
		goto out;
	}
	json_t *av = json_array();
	for (int i = 1; i < n; i++)
		json_array_append_new(av, json_string(ops[i]));
	body = json_pack("{s:o}", "argv", av);
	if (json_object_size(oa.env) > 0)
		json_object_set(body, "env", oa.env);
	if (oa.cwd)
		json_object_set_new(body, "cwd", json_string(oa.cwd));
	if (oa.user)
		json_object_set_new(body, "user", json_string(oa.user));
	if (oa.timeout_s > 0)
		json_object_set_new(body, "timeout_ms", json_integer((json_int_t)oa.timeout_s * 1000));
	text = json_dumps(body, JSON_COMPACT);
	if (text == NULL) {
		rc = cli_fail("exec", "out of memory");
		goto out;
	}
	struct client_request req = {.method = "POST", .op = "exec", .body = text, .body_len = strlen(text),
	                             .content_type = "application/json", .idempotent = 0,
	                             .timeout_s = oa.timeout_s > 0 ? (int)oa.timeout_s + 60 : 0};
	struct client_answer a;
	if ((rc = call("exec", &oa, ops[0], &req, &a)) != 0)
		goto out;
	json_error_t jerr;
	ans = json_loadb((const char *)a.body, a.body_len, JSON_REJECT_DUPLICATES, &jerr);
	client_answer_clear(&a);
	if (ans == NULL) {
		rc = cli_fail("exec", "malformed answer: %s", jerr.text);
		goto out;
	}
	fflush(stdout);
	put_stream(STDOUT_FILENO, ans, "stdout");
	put_stream(STDERR_FILENO, ans, "stderr");
	long long sig = json_integer_value(json_object_get(ans, "signal"));
	if (json_is_true(json_object_get(ans, "timed_out"))) {
		cli_fail("exec", "timed out");
		rc = 124;
	} else if (sig > 0) {
		rc = 128 + (int)(sig & 127);
	} else {
		rc = (int)(json_integer_value(json_object_get(ans, "exit_code")) & 255);
	}
out:
	free(text);
	json_decref(body);
	json_decref(ans);
	json_decref(oa.env);
	return rc;
}

/* Bytes as "512.0M" / "1.5G". */
static void human(char out[32], long long v)
{
	static const char units[] = "BKMGT";
	double d = (double)v;
	int u = 0;
	while (d >= 1024 && u < 4) {
		d /= 1024;
		u++;
	}
	if (v < 0)
		snprintf(out, 32, "-");
	else if (u == 0)
		snprintf(out, 32, "%lldB", v);
	else
		snprintf(out, 32, "%.1f%c", d, units[u]);
}

int cmd_top(int argc, char **argv)
{
	struct opargs oa;
	char *ops[2];
	int rc, first = parse(argc, argv, &oa);
	int n = first < 0 ? -1 : parse_rest(argc, argv, &oa, first, ops, 2);
	json_decref(oa.env);
	if (n != 1)
		return cli_usage(usage_ops);
	struct client_request req = {.method = "GET", .op = "usage", .idempotent = 1};
	struct client_answer a;
	if ((rc = call("top", &oa, ops[0], &req, &a)) != 0)
		return rc;
	json_error_t jerr;
	json_t *u = json_loadb((const char *)a.body, a.body_len, JSON_REJECT_DUPLICATES, &jerr);
	client_answer_clear(&a);
	if (u == NULL)
		return cli_fail("top", "malformed answer: %s", jerr.text);
	json_object_del(u, "ok");
	if (oa.json) {
		char *s = json_dumps(u, JSON_INDENT(2) | JSON_SORT_KEYS);
		if (s)
			puts(s);
		free(s);
	} else {
		json_t *lim = json_object_get(u, "limits");
		char mem[32], meml[32], disk[32], diskl[32];
		human(mem, json_integer_value(json_object_get(u, "memory_bytes")));
		human(meml, json_integer_value(json_object_get(lim, "memory_bytes")));
		human(disk, json_integer_value(json_object_get(u, "disk_bytes")));
		human(diskl, json_integer_value(json_object_get(lim, "disk_bytes")));
		json_t *cpus = json_object_get(lim, "cpus");
		printf("%-22s cpu %5.1f%% of %g  memory %s / %s  pids %lld / %lld  disk %s / %s\n", ops[0],
		       json_number_value(json_object_get(u, "cpu_pct")), cpus ? json_number_value(cpus) : 0.0, mem, meml,
		       (long long)json_integer_value(json_object_get(u, "pids")),
		       (long long)json_integer_value(json_object_get(lim, "pids")), disk, diskl);
	}
	json_decref(u);
	return 0;
}

static void print_entry(json_t *e)
{
	const char *type = json_string_value(json_object_get(e, "type"));
	const char *path = json_string_value(json_object_get(e, "path"));
	printf("%-7s %10lld %04llo %s\n", type ? type : "?",
	       (long long)json_integer_value(json_object_get(e, "size")),
	       (unsigned long long)json_integer_value(json_object_get(e, "mode")) & 07777,
	       path ? path : "?");
}

int cmd_fs(int argc, char **argv)
{
	struct opargs oa;
	char *ops[1024], q[8192], e1[4000], e2[4000];
	const char *what = "fs";
	if (argc < 2)
		return cli_usage(usage_ops);
	int rc = 2, first = parse(argc - 1, argv + 1, &oa);
	if (first < 0) {
		json_decref(oa.env);
		return cli_usage(usage_ops);
	}
	const char *sub = argv[1];
	int n = parse_rest(argc - 1, argv + 1, &oa, first, ops, 1024);
	if (n < 2)
		goto usage;
	const char *sbx = ops[0];
	if (strcmp(sub, "write") == 0) {
		if (n != 2 || client_query_escape(ops[1], e1, sizeof e1) < 0)
			goto usage;
		size_t len = 0;
		char *data = cli_read_stdin(CLIENT_ANSWER_MAX, &len);
		if (data == NULL) {
			rc = cli_fail("fs write", "cannot read standard input (at most %u bytes)", CLIENT_ANSWER_MAX);
			goto out;
		}
		snprintf(q, sizeof q, "files?path=%s%s", e1, oa.mkdirs ? "&mkdirs=1" : "");
		struct client_request req = {.method = "PUT", .op = q, .body = data, .body_len = len,
		                             .content_type = "application/octet-stream", .idempotent = 0};
		struct client_answer a;
		rc = call("fs write", &oa, sbx, &req, &a);
		free(data);
		if (rc == 0)
			client_answer_clear(&a);
		goto out;
	}
	if (strcmp(sub, "mv") == 0) {
		if (n != 3 || client_query_escape(ops[1], e1, sizeof e1) < 0 || client_query_escape(ops[2], e2, sizeof e2) < 0)
			goto usage;
		snprintf(q, sizeof q, "move?from=%s&to=%s", e1, e2);
		struct client_request req = {.method = "POST", .op = q, .idempotent = 0};
		struct client_answer a;
		if ((rc = call("fs mv", &oa, sbx, &req, &a)) == 0)
			client_answer_clear(&a);
		goto out;
	}
	rc = 0;
	for (int i = 1; i < n && rc == 0; i++) {
		struct client_request req = {.method = "GET", .op = q, .idempotent = 1};
		if (client_query_escape(ops[i], e1, sizeof e1) < 0)
			goto usage;
		if (strcmp(sub, "read") == 0) {
			what = "fs read";
			snprintf(q, sizeof q, "files?path=%s", e1);
		} else if (strcmp(sub, "ls") == 0) {
			what = "fs ls";
			if (oa.depth > 0)
				snprintf(q, sizeof q, "list?path=%s&depth=%d", e1, oa.depth);
			else
				snprintf(q, sizeof q, "list?path=%s", e1);
		} else if (strcmp(sub, "stat") == 0) {
			what = "fs stat";
			snprintf(q, sizeof q, "stat?path=%s", e1);
		} else if (strcmp(sub, "mkdir") == 0) {
			what = "fs mkdir";
			req.method = "POST", req.idempotent = 0;
			snprintf(q, sizeof q, "mkdir?path=%s", e1);
		} else if (strcmp(sub, "rm") == 0) {
			what = "fs rm";
			req.method = "DELETE", req.idempotent = 0;
			snprintf(q, sizeof q, "files?path=%s%s", e1, oa.recursive ? "&recursive=1" : "");
		} else {
			goto usage;
		}
		struct client_answer a;
		if ((rc = call(what, &oa, sbx, &req, &a)) != 0)
			break;
		if (strcmp(sub, "read") == 0) {
			fflush(stdout);
			if (write_all(STDOUT_FILENO, a.body, a.body_len) < 0)
				rc = cli_fail(what, "cannot write standard output");
		} else if (strcmp(sub, "ls") == 0 || strcmp(sub, "stat") == 0) {
			json_error_t jerr;
			json_t *ans = json_loadb((const char *)a.body, a.body_len, JSON_REJECT_DUPLICATES, &jerr);
			if (ans == NULL) {
				rc = cli_fail(what, "malformed answer");
			} else if (sub[0] == 'l') {
				size_t k;
				json_t *e;
				json_array_foreach(json_object_get(ans, "entries"), k, e)
					print_entry(e);
			} else {
				json_object_set_new(ans, "path", json_string(ops[i]));
				print_entry(ans);
			}
			json_decref(ans);
		}
		client_answer_clear(&a);
	}
	goto out;
usage:
	rc = cli_usage(usage_ops);
out:
	fflush(stdout);
	json_decref(oa.env);
	return rc;
}

/* ---- watch: a WebSocket stream (libwebsockets client) ---- */

struct watch {
	const struct client_route *rt;
	char path[8192];
	char host[256];
	int port;
	struct lws *wsi;
	struct spaced_buf rx;
	int allowed;       /* the first message said ALLOW */
	int done;          /* the connection ended */
	int close_code;    /* from the peer's close frame, 0 when none */
	char close_reason[128];
	char conn_error[512];
};

static volatile sig_atomic_t watch_stop;
static struct lws_context *watch_ctx;

static void watch_on_signal(int sig)
{
	(void)sig;
	watch_stop = 1;
	if (watch_ctx)
		lws_cancel_service(watch_ctx);
}

static int watch_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len)
{
	(void)user;
	struct watch *w = lws_context_user(lws_get_context(wsi));
	switch (reason) {
	case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER: {
		unsigned char **p = in, *end = *p + len;
		size_t cl = strlen(w->rt->capability);
		char *auth = malloc(cl + 8);
		if (auth == NULL)
			return -1;
		int n = snprintf(auth, cl + 8, "Bearer %s", w->rt->capability);
		int r = lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_AUTHORIZATION, (unsigned char *)auth, n, p, end);
		spaced_wipe(auth, cl + 8);
		free(auth);
		return r ? -1 : 0;
	}
	case LWS_CALLBACK_CLIENT_RECEIVE: {
		if (spaced_buf_append(&w->rx, in, len) < 0)
			return -1;
		if (!lws_is_final_fragment(wsi))
			return 0;
		json_error_t jerr;
		json_t *m = json_loadb((const char *)w->rx.data, w->rx.len, JSON_REJECT_DUPLICATES, &jerr);
		spaced_buf_free(&w->rx);
		spaced_buf_init(&w->rx, 1 << 20);
		if (m == NULL)
			return -1;
		if (!w->allowed) {
			const char *oc = json_string_value(json_object_get(m, "outcome"));
			const char *id = json_string_value(json_object_get(m, "identity"));
			if (oc == NULL || strcmp(oc, "ALLOW") != 0) {
				json_decref(m);
				return -1;
			}
			w->allowed = 1;
			fprintf(stderr, "spacectl: watching %s (identity %s)\n", w->path, id ? id : "?");
		} else {
			const char *ev = json_string_value(json_object_get(m, "event"));
			const char *p1 = json_string_value(json_object_get(m, "path"));
			const char *p2 = json_string_value(json_object_get(m, "path2"));
			printf("%s %s%s%s\n", ev ? ev : "?", p1 ? p1 : "", p2 ? " -> " : "", p2 ? p2 : "");
			fflush(stdout);
		}
		json_decref(m);
		return 0;
	}
	case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
		if (len >= 2) {
			const unsigned char *b = in;
			w->close_code = (b[0] << 8) | b[1];
			size_t rl = len - 2 < sizeof w->close_reason - 1 ? len - 2 : sizeof w->close_reason - 1;
			memcpy(w->close_reason, b + 2, rl);
			w->close_reason[rl] = 0;
		}
		return 0;
	case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
		snprintf(w->conn_error, sizeof w->conn_error, "%s", in ? (const char *)in : "connection failed");
		w->done = 1;
		w->wsi = NULL;
		return 0;
	case LWS_CALLBACK_CLIENT_CLOSED:
		w->done = 1;
		w->wsi = NULL;
		return 0;
	default:
		return 0;
	}
}

static const struct lws_protocols watch_protocols[] = {
	{"spaced", watch_cb, 0, 65536, 0, NULL, 0},
	{NULL, NULL, 0, 0, 0, NULL, 0},
};

/* One stream open through route rt, served until it ends or the user stops it. */
static int watch_once(struct watch *w, const char *sandbox, const char *qpath)
{
	char prefix[256], full[9000];
	if (http_parse_url(w->rt->worker_url, w->host, sizeof w->host, &w->port, prefix, sizeof prefix) < 0) {
		snprintf(w->conn_error, sizeof w->conn_error, "bad worker URL");
		return -1;
	}
	snprintf(full, sizeof full, "%s/v1/sandboxes/%s/watch?path=%s", prefix, sandbox, qpath);
	w->allowed = w->done = w->close_code = 0;
	w->close_reason[0] = w->conn_error[0] = 0;
	spaced_buf_init(&w->rx, 1 << 20);
	struct lws_context_creation_info info;
	memset(&info, 0, sizeof info);
	info.port = CONTEXT_PORT_NO_LISTEN;
	info.protocols = watch_protocols;
	info.user = w;
	info.gid = (gid_t)-1;
	info.uid = (uid_t)-1;
	watch_ctx = lws_create_context(&info);
	if (watch_ctx == NULL) {
		snprintf(w->conn_error, sizeof w->conn_error, "cannot create a WebSocket context");
		return -1;
	}
	struct lws_client_connect_info ci;
	memset(&ci, 0, sizeof ci);
	ci.context = watch_ctx;
	ci.address = w->host;
	ci.port = w->port;
	ci.path = full;
	ci.host = w->host;
	ci.origin = w->host;
	ci.protocol = NULL;
	ci.pwsi = &w->wsi;
	if (lws_client_connect_via_info(&ci) == NULL && !w->done) {
		snprintf(w->conn_error, sizeof w->conn_error, "cannot connect to %s", w->rt->worker_url);
		w->done = 1;
	}
	while (!w->done && !watch_stop)
		if (lws_service(watch_ctx, 0) < 0)
			break;
	lws_context_destroy(watch_ctx);
	watch_ctx = NULL;
	spaced_buf_free(&w->rx);
	return 0;
}

int cmd_watch(int argc, char **argv)
{
	struct opargs oa;
	char *ops[4], qpath[8192], err[512];
	int first = parse(argc, argv, &oa), rc = 1;
	int n = first < 0 ? -1 : parse_rest(argc, argv, &oa, first, ops, 4);
	json_decref(oa.env);
	if (n != 2 || client_query_escape(ops[1], qpath, sizeof qpath) < 0)
		return cli_usage(usage_ops);
	const char *sbx = ops[0];
	struct client_route rt;
	if (client_route_get(&oa.o, sbx, &rt, err, sizeof err) < 0)
		return cli_fail("watch", "%s", err);
	struct watch *w = calloc(1, sizeof *w);
	if (w == NULL) {
		client_route_clear(&rt);
		return cli_fail("watch", "out of memory");
	}
	snprintf(w->path, sizeof w->path, "%s", ops[1]);
	signal(SIGINT, watch_on_signal);
	signal(SIGTERM, watch_on_signal);
	signal(SIGPIPE, SIG_IGN);
	lws_set_log_level(LLL_ERR, NULL);
	int refused_once = 0, transport_retry = 0;
	for (;;) {
		w->rt = &rt;
		watch_once(w, sbx, qpath);
		if (watch_stop) {
			rc = 0;
			break;
		}
		if (w->close_code == 4409) {
			const char *rs = strchr(w->close_reason, ':');
			rs = rs ? rs + 1 : w->close_reason;
			if (oa.o.no_retry) {
				fprintf(stderr, "outcome: REFRESH_ROUTE (%s)\n", rs);
				break;
			}
			/* a refused open gets one repair; a stream cut after it was
			 * admitted reopens through admission again (V5, S2) */
			if (!w->allowed && refused_once) {
				cli_fail("watch", "REFRESH_ROUTE (%s) after one retry", rs);
				break;
			}
			refused_once = !w->allowed;
			struct client_route fresh;
			int replaced = 0;
			if (client_route_repair(&oa.o, sbx, &rt, &fresh, &replaced, err, sizeof err) < 0) {
				cli_fail("watch", "%s", err);
				break;
			}
			fprintf(stderr, "spacectl: watch %s (%s): reopening at %s (identity %s; %s)\n",
			        w->allowed ? "cut" : "refused", w->close_reason, fresh.worker_url, fresh.identity,
			        client_cache_verdict(replaced));
			client_route_clear(&rt);
			rt = fresh;
			continue;
		}
		if (w->close_code == 4401 || w->close_code == 4403) {
			const char *rs = strchr(w->close_reason, ':');
			rs = rs ? rs + 1 : w->close_reason;
			if (oa.o.no_retry)
				fprintf(stderr, "outcome: DENY (%s)\n", rs);
			else
				cli_fail("watch", "DENY (%s): not retried", rs);
			if (oa.o.route_file == NULL)
				client_route_forget(&oa.o, sbx, &rt);
			break;
		}
		if (w->conn_error[0] && !w->allowed && !transport_retry) {
			/* a stream open is an idempotent read: once more on a fresh connection */
			transport_retry = 1;
			if (oa.o.verbose)
				fprintf(stderr, "spacectl: watch: %s; once more on a fresh connection\n", w->conn_error);
			continue;
		}
		if (w->conn_error[0])
			cli_fail("watch", "transport failure: %s%s", w->conn_error,
			         transport_retry && !w->allowed ? " (after one retry on a fresh connection)" : "");
		else
			cli_fail("watch", "the stream ended (%d %s)", w->close_code, w->close_reason);
		break;
	}
	client_route_clear(&rt);
	free(w);
	return rc;
}

/* ---- term: an interactive terminal over a WebSocket ---- */

struct outmsg {
	struct outmsg *next;
	size_t len;
	unsigned char data[]; /* LWS_PRE + payload */
};

struct term {
	const struct client_route *rt;
	char host[256];
	int port;
	struct lws *wsi;
	struct spaced_buf rx;
	struct outmsg *qh, *qt;
	lws_sorted_usec_list_t sul;
	int allowed, done, close_code, exited, exit_code, exit_signal, stdin_eof, sent_eof;
	char close_reason[128];
	char conn_error[512];
};

static volatile sig_atomic_t term_winch;
static struct lws_context *term_ctx;

static void term_on_winch(int sig)
{
	(void)sig;
	term_winch = 1;
}

static int term_queue(struct term *t, char kind, const void *p, size_t n)
{
	struct outmsg *m = malloc(sizeof *m + LWS_PRE + 1 + n);
	if (m == NULL)
		return -1;
	m->next = NULL;
	m->len = 1 + n;
	m->data[LWS_PRE] = (unsigned char)kind;
	if (n)
		memcpy(m->data + LWS_PRE + 1, p, n);
	if (t->qt)
		t->qt->next = m;
	else
		t->qh = m;
	t->qt = m;
	if (t->wsi)
		lws_callback_on_writable(t->wsi);
	return 0;
}

static void term_queue_clear(struct term *t)
{
	while (t->qh) {
		struct outmsg *m = t->qh;
		t->qh = m->next;
		free(m);
	}
	t->qt = NULL;
}

static void term_size(int *rows, int *cols)
{
	struct winsize ws;
	*rows = 24;
	*cols = 80;
	if (ioctl(STDIN_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
		*rows = ws.ws_row;
		*cols = ws.ws_col;
	}
}

/* Every 10 ms: what the person typed, and window size changes. */
static void term_tick(lws_sorted_usec_list_t *s)
{
	struct term *t = lws_container_of(s, struct term, sul);
	if (t->allowed && !t->done) {
		if (term_winch) {
			term_winch = 0;
			int r, c;
			char sz[32];
			term_size(&r, &c);
			int n = snprintf(sz, sizeof sz, "%d %d", r, c);
			term_queue(t, 'r', sz, (size_t)n);
		}
		struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
		while (!t->stdin_eof && poll(&pfd, 1, 0) > 0) {
			unsigned char buf[16384];
			ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
			if (n <= 0) {
				t->stdin_eof = 1;
				break;
			}
			term_queue(t, 'i', buf, (size_t)n);
			if (n < (ssize_t)sizeof buf)
				break;
		}
		if (t->stdin_eof && !t->sent_eof) {
			t->sent_eof = 1;
			term_queue(t, 'd', NULL, 0);
		}
	}
	lws_sul_schedule(term_ctx, 0, &t->sul, term_tick, 10 * LWS_US_PER_MS);
}

static int term_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len)
{
	(void)user;
	struct term *t = lws_context_user(lws_get_context(wsi));
	switch (reason) {
	case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER: {
		unsigned char **p = in, *end = *p + len;
		size_t cl = strlen(t->rt->capability);
		char *auth = malloc(cl + 8);
		if (auth == NULL)
			return -1;
		int n = snprintf(auth, cl + 8, "Bearer %s", t->rt->capability);
		int r = lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_AUTHORIZATION, (unsigned char *)auth, n, p, end);
		spaced_wipe(auth, cl + 8);
		free(auth);
		return r ? -1 : 0;
	}
	case LWS_CALLBACK_CLIENT_RECEIVE: {
		int text = lws_frame_is_binary(wsi) == 0;
		if (spaced_buf_append(&t->rx, in, len) < 0)
			return -1;
		if (!lws_is_final_fragment(wsi))
			return 0;
		const unsigned char *d = t->rx.data;
		size_t n = t->rx.len;
		int r = 0;
		if (!t->allowed || (text && n > 0 && d[0] == '{')) {
			json_error_t jerr;
			json_t *m = json_loadb((const char *)d, n, JSON_REJECT_DUPLICATES, &jerr);
			json_t *ex = json_object_get(m, "exit");
			if (!t->allowed) {
				const char *oc = json_string_value(json_object_get(m, "outcome"));
				const char *id = json_string_value(json_object_get(m, "identity"));
				if (oc == NULL || strcmp(oc, "ALLOW") != 0) {
					r = -1;
				} else {
					t->allowed = 1;
					if (ops_verbose)
						fprintf(stderr, "spacectl: terminal open (identity %s)\r\n", id ? id : "?");
				}
			} else if (ex != NULL) {
				t->exited = 1;
				t->exit_code = (int)json_integer_value(json_object_get(ex, "code"));
				t->exit_signal = (int)json_integer_value(json_object_get(ex, "signal"));
			}
			json_decref(m);
		} else if (n > 0 && (d[0] == 'o' || d[0] == 'e')) {
			int fd = d[0] == 'o' ? STDOUT_FILENO : STDERR_FILENO;
			if (write_all(fd, d + 1, n - 1) < 0)
				r = -1;
		}
		spaced_buf_free(&t->rx);
		spaced_buf_init(&t->rx, 1 << 20);
		return r;
	}
	case LWS_CALLBACK_CLIENT_WRITEABLE: {
		struct outmsg *m = t->qh;
		if (m == NULL)
			return 0;
		t->qh = m->next;
		if (t->qh == NULL)
			t->qt = NULL;
		int w = lws_write(wsi, m->data + LWS_PRE, m->len, LWS_WRITE_BINARY);
		size_t want = m->len;
		free(m);
		if (w < (int)want)
			return -1;
		if (t->qh)
			lws_callback_on_writable(wsi);
		return 0;
	}
	case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
		if (len >= 2) {
			const unsigned char *b = in;
			t->close_code = (b[0] << 8) | b[1];
			size_t rl = len - 2 < sizeof t->close_reason - 1 ? len - 2 : sizeof t->close_reason - 1;
			memcpy(t->close_reason, b + 2, rl);
			t->close_reason[rl] = 0;
		}
		return 0;
	case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
		snprintf(t->conn_error, sizeof t->conn_error, "%s", in ? (const char *)in : "connection failed");
		t->done = 1;
		t->wsi = NULL;
		return 0;
	case LWS_CALLBACK_CLIENT_CLOSED:
		t->done = 1;
		t->wsi = NULL;
		return 0;
	default:
		return 0;
	}
}

static const struct lws_protocols term_protocols[] = {
	{"spaced", term_cb, 0, 65536, 0, NULL, 0},
	{NULL, NULL, 0, 0, 0, NULL, 0},
};

static void term_once(struct term *t, const char *sandbox, const char *query)
{
	char prefix[256], full[9000];
	t->allowed = t->done = t->close_code = t->exited = 0;
	t->sent_eof = 0;
	t->close_reason[0] = t->conn_error[0] = 0;
	if (http_parse_url(t->rt->worker_url, t->host, sizeof t->host, &t->port, prefix, sizeof prefix) < 0) {
		snprintf(t->conn_error, sizeof t->conn_error, "bad worker URL");
		return;
	}
	snprintf(full, sizeof full, "%s/v1/sandboxes/%s/term?%s", prefix, sandbox, query);
	spaced_buf_init(&t->rx, 1 << 20);
	struct lws_context_creation_info info;
	memset(&info, 0, sizeof info);
	info.port = CONTEXT_PORT_NO_LISTEN;
	info.protocols = term_protocols;
	info.user = t;
	info.gid = (gid_t)-1;
	info.uid = (uid_t)-1;
	term_ctx = lws_create_context(&info);
	if (term_ctx == NULL) {
		snprintf(t->conn_error, sizeof t->conn_error, "cannot create a WebSocket context");
		return;
	}
	struct lws_client_connect_info ci;
	memset(&ci, 0, sizeof ci);
	ci.context = term_ctx;
	ci.address = t->host;
	ci.port = t->port;
	ci.path = full;
	ci.host = t->host;
	ci.origin = t->host;
	ci.pwsi = &t->wsi;
	if (lws_client_connect_via_info(&ci) == NULL && !t->done) {
		snprintf(t->conn_error, sizeof t->conn_error, "cannot connect");
		t->done = 1;
	}
	lws_sul_schedule(term_ctx, 0, &t->sul, term_tick, 10 * LWS_US_PER_MS);
	while (!t->done && !watch_stop)
		if (lws_service(term_ctx, 0) < 0)
			break;
	lws_sul_cancel(&t->sul);
	lws_context_destroy(term_ctx);
	term_ctx = NULL;
	term_queue_clear(t);
	spaced_buf_free(&t->rx);
}

int cmd_term(int argc, char **argv)
{
	struct opargs oa;
	char *ops[256], err[512], q[8192], e[4096];
	int first = parse(argc, argv, &oa), rc = 1;
	int n = first < 0 ? -1 : parse_rest(argc, argv, &oa, first, ops, 256);
	if (n < 1) {
		json_decref(oa.env);
		return cli_usage("usage: spacectl term ID [--env K=V]... [--cwd DIR] [--route FILE] [--no-retry] [-- CMD [ARG...]]\n");
	}
	const char *sbx = ops[0];
	/* the query: argv, env, cwd, size */
	size_t ql = 0;
	int rows, cols;
	term_size(&rows, &cols);
	q[0] = 0;
	for (int i = 1; i < n || i == 1; i++) {
		const char *a = i < n ? ops[i] : "/bin/sh";
		if (client_query_escape(a, e, sizeof e) < 0 || ql + strlen(e) + 8 >= sizeof q)
			goto usage;
		ql += (size_t)snprintf(q + ql, sizeof q - ql, "%sargv=%s", ql ? "&" : "", e);
		if (i >= n)
			break;
	}
	const char *key;
	json_t *val;
	json_object_foreach(oa.env, key, val)
	{
		char kv[4096];
		snprintf(kv, sizeof kv, "%s=%s", key, json_string_value(val));
		if (client_query_escape(kv, e, sizeof e) < 0 || ql + strlen(e) + 8 >= sizeof q)
			goto usage;
		ql += (size_t)snprintf(q + ql, sizeof q - ql, "&env=%s", e);
	}
	if (json_object_get(oa.env, "TERM") == NULL && getenv("TERM") != NULL) {
		char kv[512];
		snprintf(kv, sizeof kv, "TERM=%s", getenv("TERM"));
		if (client_query_escape(kv, e, sizeof e) == 0 && ql + strlen(e) + 8 < sizeof q)
			ql += (size_t)snprintf(q + ql, sizeof q - ql, "&env=%s", e);
	}
	if (oa.cwd != NULL) {
		if (client_query_escape(oa.cwd, e, sizeof e) < 0 || ql + strlen(e) + 8 >= sizeof q)
			goto usage;
		ql += (size_t)snprintf(q + ql, sizeof q - ql, "&cwd=%s", e);
	}
	if (ql + 40 >= sizeof q)
		goto usage;
	snprintf(q + ql, sizeof q - ql, "&rows=%d&cols=%d", rows, cols);
	struct client_route rt;
	if (client_route_get(&oa.o, sbx, &rt, err, sizeof err) < 0) {
		json_decref(oa.env);
		return cli_fail("term", "%s", err);
	}
	struct term *t = calloc(1, sizeof *t);
	if (t == NULL) {
		client_route_clear(&rt);
		json_decref(oa.env);
		return cli_fail("term", "out of memory");
	}
	struct termios saved;
	int raw = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved) == 0;
	if (raw) {
		struct termios r = saved;
		cfmakeraw(&r);
		tcsetattr(STDIN_FILENO, TCSANOW, &r);
	}
	signal(SIGINT, raw ? SIG_IGN : watch_on_signal); /* raw mode: ^C goes to the sandbox */
	signal(SIGTERM, watch_on_signal);
	signal(SIGWINCH, term_on_winch);
	signal(SIGPIPE, SIG_IGN);
	lws_set_log_level(LLL_ERR, NULL);
	int refused_once = 0;
	const char *nl = raw ? "\r\n" : "\n";
	for (;;) {
		t->rt = &rt;
		term_once(t, sbx, q);
		if (t->exited) {
			rc = t->exit_signal > 0 ? 128 + (t->exit_signal & 127) : t->exit_code & 255;
			break;
		}
		if (watch_stop) {
			rc = 130;
			break;
		}
		const char *rs = strchr(t->close_reason, ':');
		rs = rs ? rs + 1 : t->close_reason;
		if (t->close_code == 4409) {
			if (oa.o.no_retry) {
				fprintf(stderr, "outcome: REFRESH_ROUTE (%s)%s", rs, nl);
				break;
			}
			if (!t->allowed && refused_once) {
				fprintf(stderr, "spacectl: term: REFRESH_ROUTE (%s) after one retry%s", rs, nl);
				break;
			}
			refused_once = !t->allowed;
			struct client_route fresh;
			int replaced = 0;
			if (client_route_repair(&oa.o, sbx, &rt, &fresh, &replaced, err, sizeof err) < 0) {
				fprintf(stderr, "spacectl: term: %s%s", err, nl);
				break;
			}
			/* V5: the person's terminal stays; a new one opens through admission */
			fprintf(stderr, "%s[spacectl: the terminal's execution was replaced (%s); a new terminal at %s]%s", nl,
			        t->close_reason, fresh.identity, nl);
			client_route_clear(&rt);
			rt = fresh;
			continue;
		}
		if (t->close_code == 4401 || t->close_code == 4403) {
			if (oa.o.no_retry)
				fprintf(stderr, "outcome: DENY (%s)%s", rs, nl);
			else
				fprintf(stderr, "spacectl: term: DENY (%s): not retried%s", rs, nl);
			if (oa.o.route_file == NULL)
				client_route_forget(&oa.o, sbx, &rt);
			break;
		}
		if (t->conn_error[0])
			fprintf(stderr, "spacectl: term: %s%s", t->conn_error, nl);
		else
			fprintf(stderr, "spacectl: term: the terminal ended (%d %s)%s", t->close_code, t->close_reason, nl);
		break;
	}
	if (raw)
		tcsetattr(STDIN_FILENO, TCSANOW, &saved);
	client_route_clear(&rt);
	free(t);
	json_decref(oa.env);
	return rc;
usage:
	json_decref(oa.env);
	return cli_usage("usage: spacectl term ID [--env K=V]... [--cwd DIR] [-- CMD [ARG...]]\n");
}
