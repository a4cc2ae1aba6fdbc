/*
 * cmd_ops.c — request/answer operations on a sandbox through the worker that
 * serves it:
 *   fs read|write|ls|stat|mkdir|mv|rm ID PATH...
 *   top ID [--json]
 * and the option parsing every operation shares (cmd_ops.h). Each takes
 * [--route FILE] [--no-retry] [-v]; the route and its recovery are client.h's.
 * fs read and fs write stream: any size, bounded memory. The streams (exec,
 * term, watch) are cmd_stream.c's.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"
#include "client.h"
#include "cmd_ops.h"
#include "util.h"

int ops_verbose;

enum { O_ROUTE = 1000, O_NORETRY, O_CACHE, O_ENV, O_CWD, O_TIMEOUT, O_DEPTH, O_MKDIRS, O_JSON, O_NOSTDIN, O_USER };

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
	{"no-stdin", no_argument, NULL, O_NOSTDIN},
	{NULL, 0, NULL, 0},
};

const char ops_usage[] =
	"usage: spacectl exec ID [--env K=V]... [--cwd DIR] [--user U] [--timeout S] [--no-stdin] -- CMD [ARG...]\n"
	"       spacectl fs read|stat|mkdir|rm [-r] ID PATH...\n"
	"       spacectl fs write [--mkdirs] ID PATH      (the content is read from stdin)\n"
	"       spacectl fs ls [--depth N] ID PATH | fs mv ID FROM TO\n"
	"       spacectl watch ID PATH\n"
	"       spacectl top ID [--json]\n"
	"  each with [--route FILE] [--no-retry] [-v]\n";

int ops_parse(int argc, char **argv, struct opargs *a)
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
		case O_NOSTDIN: a->no_stdin = 1; break;
		default: return -1;
		}
	}
	return optind;
}

int ops_parse_rest(int argc, char **argv, struct opargs *a, int first, char **operands, int max)
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
			case O_TIMEOUT: keep.timeout_s = atol(optarg); if (keep.timeout_s <= 0) return -1; break;
			case O_DEPTH: keep.depth = atoi(optarg); break;
			case O_MKDIRS: keep.mkdirs = 1; break;
			case 'r': keep.recursive = 1; break;
			case O_JSON: keep.json = 1; break;
			case O_NOSTDIN: keep.no_stdin = 1; break;
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
	if (a->outcome == CLIENT_TRANSPORT && a->delivered > 0)
		return cli_fail(what, "%s: the output is incomplete (not retried)", a->reason);
	if (a->outcome == CLIENT_TRANSPORT)
		return cli_fail(what, "transport failure: %s%s", a->reason,
		                a->attempts > 1 ? " (after one retry on a fresh connection)" : " (not retried)");
	if (o->no_retry)
		return 1; /* the outcome line says it all */
	if (a->outcome == CLIENT_UNVERIFIED)
		return cli_fail(what, "refused: %s", a->reason);
	if (a->outcome == CLIENT_DENY)
		return cli_fail(what, "DENY (%s): not retried", a->reason);
	if (a->not_replayable)
		return cli_fail(what, "REFRESH_ROUTE (%s): not retried: %s", a->reason,
		                "standard input was sent already and cannot be read again (write from a file to allow the retry)");
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
			fprintf(stderr, "outcome: %s (%s)\n",
			        a->outcome == CLIENT_DENY ? "DENY" : a->outcome == CLIENT_UNVERIFIED ? "UNVERIFIED" : "REFRESH_ROUTE",
			        a->reason);
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
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

/* ---- fs read and fs write: streamed ---- */

/* A kept prefix of standard input, so that V2's one retry can send a piped
 * body again; past it, the retry is not made (the bytes are gone). */
#define REPLAY_MAX (8u << 20)

/* Standard input as a request body: a regular file goes with its length
 * and is read again from where it started for a retry; anything else is sent
 * chunked, its first REPLAY_MAX bytes kept. */
struct stdin_body {
	struct http_body_src src;
	int fd;
	int seekable;
	off_t start;
	unsigned char *keep;   /* the bytes read so far (pipes), while they fit */
	size_t kept, cap, pos; /* pos: bytes of this attempt taken from keep */
	int overflow;          /* more than REPLAY_MAX were read: no replay */
};

static long stdin_read(void *arg, void *buf, size_t n)
{
	struct stdin_body *b = arg;
	if (!b->seekable && !b->overflow && b->pos < b->kept) {
		size_t k = b->kept - b->pos < n ? b->kept - b->pos : n;
		memcpy(buf, b->keep + b->pos, k);
		b->pos += k;
		return (long)k;
	}
	ssize_t k;
	do
		k = read(b->fd, buf, n);
	while (k < 0 && errno == EINTR);
	if (k < 0)
		return -1;
	if (!b->seekable && !b->overflow && k > 0) {
		if (b->kept + (size_t)k > REPLAY_MAX) {
			b->overflow = 1;
			free(b->keep);
			b->keep = NULL;
			b->kept = b->cap = 0;
		} else {
			if (b->kept + (size_t)k > b->cap) {
				size_t nc = b->cap ? b->cap : 65536;
				while (nc < b->kept + (size_t)k)
					nc *= 2;
				unsigned char *nk = realloc(b->keep, nc);
				if (nk == NULL)
					return -1;
				b->keep = nk;
				b->cap = nc;
			}
			memcpy(b->keep + b->kept, buf, (size_t)k);
			b->kept += (size_t)k;
			b->pos = b->kept;
		}
	}
	return (long)k;
}

static int stdin_rewind(void *arg)
{
	struct stdin_body *b = arg;
	if (b->seekable)
		return lseek(b->fd, b->start, SEEK_SET) == b->start ? 0 : -1;
	if (b->overflow)
		return -1;
	b->pos = 0;
	return 0;
}

static void stdin_body_init(struct stdin_body *b)
{
	struct stat st;
	memset(b, 0, sizeof *b);
	b->fd = STDIN_FILENO;
	b->src.read = stdin_read;
	b->src.arg = b;
	b->src.length = -1;
	if (fstat(b->fd, &st) == 0 && S_ISREG(st.st_mode) && (b->start = lseek(b->fd, 0, SEEK_CUR)) >= 0) {
		b->seekable = 1;
		b->src.length = st.st_size > b->start ? (int64_t)(st.st_size - b->start) : 0;
	}
}

static int stdout_sink(void *arg, const void *p, size_t n)
{
	(void)arg;
	return write_all(STDOUT_FILENO, p, n);
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
	int rc, first = ops_parse(argc, argv, &oa);
	int n = first < 0 ? -1 : ops_parse_rest(argc, argv, &oa, first, ops, 2);
	json_decref(oa.env);
	if (n != 1)
		return cli_usage(ops_usage);
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
		const char *held = json_string_value(json_object_get(u, "cpus_held"));
		printf("%-22s cpu %5.1f%% of %g  memory %s / %s  pids %lld / %lld  disk %s / %s%s%s\n", ops[0],
		       json_number_value(json_object_get(u, "cpu_pct")), cpus ? json_number_value(cpus) : 0.0, mem, meml,
		       (long long)json_integer_value(json_object_get(u, "pids")),
		       (long long)json_integer_value(json_object_get(lim, "pids")), disk, diskl,
		       held ? "  held to CPUs " : "", held ? held : "");
	}
	json_decref(u);
	return 0;
}

static void print_entry(json_t *e)
{
	const char *type = json_string_value(json_object_get(e, "type"));
	const char *path = json_string_value(json_object_get(e, "path"));
	printf("%-7s %10lld %04llo ", type ? type : "?", (long long)json_integer_value(json_object_get(e, "size")),
	       (unsigned long long)json_integer_value(json_object_get(e, "mode")) & 07777);
	cli_print_name(stdout, path ? path : "?"); /* the sandbox's names: escaped (cli.h) */
	putchar('\n');
}

int cmd_fs(int argc, char **argv)
{
	struct opargs oa;
	char *ops[1024], q[8192], e1[4000], e2[4000];
	const char *what = "fs";
	if (argc < 2)
		return cli_usage(ops_usage);
	int rc = 2, first = ops_parse(argc - 1, argv + 1, &oa);
	if (first < 0) {
		json_decref(oa.env);
		return cli_usage(ops_usage);
	}
	const char *sub = argv[1];
	int n = ops_parse_rest(argc - 1, argv + 1, &oa, first, ops, 1024);
	if (n < 2)
		goto usage;
	const char *sbx = ops[0];
	if (strcmp(sub, "write") == 0) {
		if (n != 2 || client_query_escape(ops[1], e1, sizeof e1) < 0)
			goto usage;
		struct stdin_body body;
		stdin_body_init(&body);
		snprintf(q, sizeof q, "files?path=%s%s", e1, oa.mkdirs ? "&mkdirs=1" : "");
		struct client_request req = {.method = "PUT", .op = q, .content_type = "application/octet-stream",
		                             .idempotent = 0, .body_src = &body.src, .body_rewind = stdin_rewind};
		struct client_answer a;
		rc = call("fs write", &oa, sbx, &req, &a);
		free(body.keep);
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
		if (strcmp(sub, "read") == 0) {
			/* the bytes go to stdout as they come, once the answer is known
			 * to be the route's execution's */
			fflush(stdout);
			req.sink = stdout_sink;
		}
		if ((rc = call(what, &oa, sbx, &req, &a)) != 0)
			break;
		if (strcmp(sub, "read") == 0) {
			if (a.sink_failed)
				rc = cli_fail(what, "cannot write standard output (%llu bytes written)",
				              (unsigned long long)a.delivered);
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
	rc = cli_usage(ops_usage);
out:
	fflush(stdout);
	json_decref(oa.env);
	return rc;
}

