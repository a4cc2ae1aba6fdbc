/*
 * spacectl — control-plane commands (docs/cp-api.yaml), with SPACED_CP_URL and
 * SPACED_API_KEY from the environment:
 *   workers [--json]
 *   create [--worker W] [--substrate S] [--template T] [--cpus N] [--memory SIZE] [--pids N]
 *          [--disk SIZE] [--idle-timeout S] [--max-lifetime S] [--json]
 *   quota [--json]
 *   ls [--json] | rm ID | inspect ID [--json]
 *   route ID [--purpose P]... [--port N] [--protocol X] [--json]
 *   pause ID | snapshot ID | resume ID [--worker W] | move ID --to W   (each [--json])
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "http_client.h"
#include "resources.h"

static void print_json(json_t *v)
{
	char *s = json_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	if (s != NULL)
		puts(s);
	free(s);
}

static const char *str(json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));
	return s ? s : "-";
}

static void print_sandbox_line(json_t *s)
{
	printf("%-22s %-9s %5lld  %-16s %s\n", str(s, "id"), str(s, "state"),
	       (long long)json_integer_value(json_object_get(s, "generation")), str(s, "worker"),
	       str(json_object_get(s, "route"), "activation"));
}

enum { O_JSON = 1, O_WORKER, O_SUBSTRATE, O_TEMPLATE, O_MEMORY, O_PIDS, O_IDLE, O_MAXLIFE, O_PURPOSE, O_PORT,
       O_PROTOCOL, O_TO, O_CPUS, O_DISK, O_ENV, O_META, O_AUTO_RESUME, O_RESTART, O_NETWORK, O_ALLOW_OUT, O_DENY_OUT,
       O_IDEM };

static const struct option cp_longopts[] = {
	{"json", no_argument, NULL, O_JSON},
	{"worker", required_argument, NULL, O_WORKER},
	{"substrate", required_argument, NULL, O_SUBSTRATE},
	{"template", required_argument, NULL, O_TEMPLATE},
	{"memory", required_argument, NULL, O_MEMORY},
	{"pids", required_argument, NULL, O_PIDS},
	{"cpus", required_argument, NULL, O_CPUS},
	{"disk", required_argument, NULL, O_DISK},
	{"idle-timeout", required_argument, NULL, O_IDLE},
	{"max-lifetime", required_argument, NULL, O_MAXLIFE},
	{"purpose", required_argument, NULL, O_PURPOSE},
	{"port", required_argument, NULL, O_PORT},
	{"protocol", required_argument, NULL, O_PROTOCOL},
	{"to", required_argument, NULL, O_TO},
	{"env", required_argument, NULL, O_ENV},
	{"meta", required_argument, NULL, O_META},
	{"auto-resume", no_argument, NULL, O_AUTO_RESUME},
	{"restart", required_argument, NULL, O_RESTART},
	{"network", required_argument, NULL, O_NETWORK},
	{"allow-out", required_argument, NULL, O_ALLOW_OUT},
	{"deny-out", required_argument, NULL, O_DENY_OUT},
	{"idempotency-key", required_argument, NULL, O_IDEM},
	{NULL, 0, NULL, 0},
};

static const char cp_usage[] =
	"usage: spacectl workers [--json]\n"
	"       spacectl create [--worker W] [--substrate S] [--template T] [--cpus N] [--memory SIZE]\n"
	"                       [--pids N] [--disk SIZE] [--idle-timeout S] [--max-lifetime S] [--env K=V]...\n"
	"                       [--meta K=V]... [--auto-resume] [--restart never|on-failure] [--json]\n"
	"                       [--network allow|deny] [--allow-out CIDR|DOMAIN]... [--deny-out CIDR|DOMAIN]...\n"
	"                       [--idempotency-key K]   (a retry with K gets the sandbox the first made)\n"
	"       spacectl quota [--json]\n"
	"       spacectl ls [--meta K=V]... [--json] | rm ID | inspect ID [--json]\n"
	"       spacectl timeout ID SECONDS                   it is reaped SECONDS from now (0: never)\n"
	"       spacectl route ID [--purpose P]... [--port N] [--protocol X] [--json]\n"
	"       spacectl pause ID | snapshot ID | resume ID [--worker W] | move ID --to W   [--json]\n";

int cmd_cp(int argc, char **argv)
{
	const char *cmd = argv[0];
	int json = 0, c, rc = 1;
	json_t *req = json_object(), *purposes = json_array(), *env = json_object(), *meta = json_object();
	char query[4000] = ""; /* the control plane takes a request target of up to 4 KiB */
	size_t ql = 0;
	json_t *ans = NULL; /* the control plane's answer (net_cp_call) */
	char path[4100]; /* /v1/sandboxes and the query of ls --meta */
	const char *target = NULL;
	char idem[128] = ""; /* "Idempotency-Key: K\r\n" */
	optind = 0; /* full reinitialisation; options may follow the ID (GNU permutation) */
	while ((c = getopt_long(argc, argv, "", cp_longopts, NULL)) != -1) {
		switch (c) {
		case O_JSON: json = 1; break;
		case O_IDEM:
			if (strlen(optarg) > 64 || strpbrk(optarg, "\r\n") != NULL) {
				rc = cli_fail("create", "an idempotency key is 1-64 characters of [A-Za-z0-9._:-]");
				goto out;
			}
			snprintf(idem, sizeof idem, "Idempotency-Key: %s\r\n", optarg);
			break;
		case O_WORKER: json_object_set_new(req, "worker", json_string(optarg)); target = optarg; break;
		case O_SUBSTRATE: json_object_set_new(req, "substrate", json_string(optarg)); break;
		case O_TEMPLATE: json_object_set_new(req, "template", json_string(optarg)); break;
		case O_MEMORY:
		case O_DISK:
		case O_PIDS: {
			uint64_t v;
			if (spaced_size_parse(optarg, &v) < 0 || v > (uint64_t)INT64_MAX) {
				rc = cli_fail("create", "'%s' is not a size (bytes, or a number with K, M, G, T)", optarg);
				goto out;
			}
			json_object_set_new(req, c == O_MEMORY ? "memory_bytes" : c == O_DISK ? "disk_bytes" : "pids",
			                    json_integer((json_int_t)v));
			break;
		}
		case O_CPUS: {
			uint32_t m;
			if (spaced_cpus_parse(optarg, &m) < 0) {
				rc = cli_fail("create", "'%s' is not a number of CPUs (0.001 .. 1024)", optarg);
				goto out;
			}
			json_object_set_new(req, "cpus", m % 1000 ? json_real(m / 1000.0) : json_integer(m / 1000));
			break;
		}
		case O_IDLE: json_object_set_new(req, "idle_timeout", json_integer(atoll(optarg))); break;
		case O_MAXLIFE: json_object_set_new(req, "max_lifetime", json_integer(atoll(optarg))); break;
		case O_PURPOSE: json_array_append_new(purposes, json_string(optarg)); break;
		case O_PORT: json_object_set_new(req, "port", json_integer(atoll(optarg))); break;
		case O_PROTOCOL: json_object_set_new(req, "protocol", json_string(optarg)); break;
		case O_TO: json_object_set_new(req, "to", json_string(optarg)); target = optarg; break;
		case O_AUTO_RESUME: json_object_set_new(req, "auto_resume", json_true()); break;
		case O_RESTART: json_object_set_new(req, "restart", json_string(optarg)); break;
		case O_ENV:
		case O_META: {
			const char *eq = strchr(optarg, '=');
			char k[256];
			if (!eq || eq == optarg || (size_t)(eq - optarg) >= sizeof k) {
				rc = cli_fail(cmd, "--%s wants K=V", c == O_ENV ? "env" : "meta");
				goto out;
			}
			snprintf(k, sizeof k, "%.*s", (int)(eq - optarg), optarg);
			json_object_set_new(c == O_ENV ? env : meta, k, json_string(eq + 1));
			/* for ls: ?meta=K%3DV… (every one must match) */
			if (c == O_META) {
				char e[1024]; /* K=V percent-encoded: (63 + 1 + 256) * 3 at most */
				size_t el = 0;
				for (const char *p = optarg; *p && el + 4 < sizeof e; p++)
					el += (size_t)(strchr("-._~", *p) || (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') ||
					                       (*p >= 'A' && *p <= 'Z')
					                   ? snprintf(e + el, sizeof e - el, "%c", *p)
					                   : snprintf(e + el, sizeof e - el, "%%%02X", (unsigned char)*p));
				ql += (size_t)snprintf(query + ql, sizeof query - ql, "%smeta=%s", ql ? "&" : "?", e);
				if (ql >= sizeof query) {
					rc = cli_fail(cmd, "too many --meta");
					goto out;
				}
			}
			break;
		}
		case O_NETWORK:
		case O_ALLOW_OUT:
		case O_DENY_OUT: {
			/* the egress policy (docs/network.md): mode allow unless said */
			json_t *net = json_object_get(req, "network");
			if (net == NULL) {
				net = json_pack("{s:s,s:[],s:[]}", "mode", "allow", "allow_out", "deny_out");
				json_object_set_new(req, "network", net);
			}
			if (c == O_NETWORK)
				json_object_set_new(net, "mode", json_string(optarg));
			else
				json_array_append_new(json_object_get(net, c == O_ALLOW_OUT ? "allow_out" : "deny_out"),
				                      json_string(optarg));
			break;
		}
		default: rc = cli_usage(cp_usage); goto out;
		}
	}
	int nargs = argc - optind;
	const char *id = nargs > 0 ? argv[optind] : NULL;
	if (id != NULL && (strlen(id) > 63 || strpbrk(id, "/?#% ") != NULL)) {
		rc = cli_fail(cmd, "'%s' is not a sandbox ID", id);
		goto out;
	}
	if (strcmp(cmd, "workers") == 0 && nargs == 0) {
		if ((rc = net_cp_call(cmd, "GET", "/v1/workers", NULL, &ans)) != 0)
			goto out;
		json_t *ws = json_object_get(ans, "workers"), *w;
		size_t i;
		if (json)
			print_json(ws);
		else
			json_array_foreach(ws, i, w)
				printf("%-16s %-5s %3lld/%-3lld %s\n", str(w, "id"), str(w, "state"),
				       (long long)json_integer_value(json_object_get(w, "sandboxes")),
				       (long long)json_integer_value(json_object_get(w, "capacity")), str(w, "url"));
	} else if (strcmp(cmd, "create") == 0 && nargs == 0) {
		if (json_object_size(env) > 0)
			json_object_set(req, "env", env);
		if (json_object_size(meta) > 0)
			json_object_set(req, "metadata", meta);
		if ((rc = net_cp_call_headers(cmd, "POST", "/v1/sandboxes", req, idem[0] ? idem : NULL, &ans)) != 0)
			goto out;
		if (json)
			print_json(ans);
		else
			puts(str(ans, "id"));
	} else if (strcmp(cmd, "quota") == 0 && nargs == 0) {
		if ((rc = net_cp_call(cmd, "GET", "/v1/quota", NULL, &ans)) != 0)
			goto out;
		if (json) {
			print_json(ans);
		} else {
			json_t *q = json_object_get(ans, "quota"), *u = json_object_get(ans, "used");
			static const char *const k[] = {"sandboxes", "memory_bytes", "disk_bytes", "pids", "templates_bytes"};
			for (int i = 0; i < 5; i++)
				printf("%-15s %lld of %lld%s\n", k[i], (long long)json_integer_value(json_object_get(u, k[i])),
				       (long long)json_integer_value(json_object_get(q, k[i])),
				       json_integer_value(json_object_get(q, k[i])) == 0 ? " (no limit)" : "");
		}
	} else if (strcmp(cmd, "ls") == 0 && nargs == 0) {
		snprintf(path, sizeof path, "/v1/sandboxes%s", query);
		if ((rc = net_cp_call(cmd, "GET", path, NULL, &ans)) != 0)
			goto out;
		json_t *l = json_object_get(ans, "sandboxes"), *s;
		size_t i;
		if (json)
			print_json(l);
		else
			json_array_foreach(l, i, s)
				print_sandbox_line(s);
	} else if ((strcmp(cmd, "inspect") == 0 || strcmp(cmd, "rm") == 0) && nargs == 1) {
		snprintf(path, sizeof path, "/v1/sandboxes/%s", id);
		if ((rc = net_cp_call(cmd, cmd[0] == 'i' ? "GET" : "DELETE", path, NULL, &ans)) != 0)
			goto out;
		if (json || cmd[0] == 'i')
			print_json(ans);
		else
			printf("%s %s\n", id, str(ans, "state"));
		if (cmd[0] == 'r' && strcmp(str(ans, "state"), "deleting") == 0)
			fprintf(stderr,
			        "spacectl: rm: worker %s has not confirmed that it destroyed the sandbox; it counts against "
			        "the quotas until it does\n",
			        str(ans, "worker"));
	} else if (strcmp(cmd, "timeout") == 0 && nargs == 2) {
		char *end;
		long long secs = strtoll(argv[optind + 1], &end, 10);
		if (*end || secs < 0) {
			rc = cli_fail(cmd, "SECONDS must be a number of seconds (0: never)");
			goto out;
		}
		json_t *t = json_pack("{s:I}", "seconds", (json_int_t)secs);
		snprintf(path, sizeof path, "/v1/sandboxes/%s/timeout", id);
		rc = net_cp_call(cmd, "POST", path, t, &ans);
		json_decref(t);
		if (rc != 0)
			goto out;
		if (json)
			print_json(ans);
	} else if (strcmp(cmd, "route") == 0 && nargs == 1) {
		if (json_array_size(purposes) > 0)
			json_object_set(req, "purposes", purposes);
		snprintf(path, sizeof path, "/v1/sandboxes/%s/route", id);
		if ((rc = net_cp_call(cmd, "POST", path, req, &ans)) != 0)
			goto out;
		print_json(ans);
	} else if ((strcmp(cmd, "pause") == 0 || strcmp(cmd, "snapshot") == 0 || strcmp(cmd, "resume") == 0 ||
	            strcmp(cmd, "move") == 0) && nargs == 1) {
		if (strcmp(cmd, "move") == 0 && target == NULL) {
			rc = cli_fail(cmd, "move needs --to WORKER");
			goto out;
		}
		if ((strcmp(cmd, "pause") == 0 || strcmp(cmd, "snapshot") == 0) && json_object_size(req) > 0) {
			rc = cli_usage(cp_usage);
			goto out;
		}
		snprintf(path, sizeof path, "/v1/sandboxes/%s/%s", id, cmd);
		if ((rc = net_cp_call(cmd, "POST", path, req, &ans)) != 0)
			goto out;
		if (json)
			print_json(ans);
		else
			print_sandbox_line(ans);
	} else {
		rc = cli_usage(cp_usage);
		goto out;
	}
	rc = 0;
out:
	json_decref(ans);
	json_decref(req);
	json_decref(purposes);
	json_decref(env);
	json_decref(meta);
	return rc;
}
