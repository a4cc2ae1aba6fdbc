/*
 * cmd_net.c — a sandbox's network from the command line (docs/network.md):
 *
 *   net ID [--network allow|deny] [--allow-out X]... [--deny-out X]... [--json]
 *       without options: prints the sandbox's egress policy; with options:
 *       changes it live (what is not given stays as it is; a list given
 *       replaces that list; --allow-out '' or --deny-out '' empties it).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "http_client.h"

/* One call to the control plane; *answer on 2xx, else 1 with the reason printed. */
int net_cp_call(const char *what, const char *method, const char *path, json_t *req, json_t **answer)
{
	return net_cp_call_headers(what, method, path, req, NULL, answer);
}

int net_cp_call_headers(const char *what, const char *method, const char *path, json_t *req, const char *headers,
                        json_t **answer)
{
	const char *url = getenv("SPACED_CP_URL"), *key = getenv("SPACED_API_KEY");
	char err[256], *body = NULL, *text = NULL;
	json_error_t jerr;
	int status = 0;
	if (url == NULL || *url == 0)
		return cli_fail(what, "SPACED_CP_URL is not set (spacectl dev up writes it to DIR/env)");
	if (key == NULL || *key == 0)
		return cli_fail(what, "SPACED_API_KEY is not set");
	if (req != NULL && (text = json_dumps(req, JSON_COMPACT)) == NULL)
		return cli_fail(what, "out of memory");
	int r = http_request_headers(url, method, path, key, headers, text, &status, &body, err, sizeof err);
	free(text);
	if (r < 0)
		return cli_fail(what, "%s", err);
	json_t *ans = body[0] ? json_loads(body, JSON_REJECT_DUPLICATES, &jerr) : json_object();
	free(body);
	if (ans == NULL)
		return cli_fail(what, "HTTP %d with a malformed answer", status);
	if (status < 200 || status > 299) {
		const char *code = json_string_value(json_object_get(ans, "error"));
		const char *msg = json_string_value(json_object_get(ans, "message"));
		cli_fail(what, "HTTP %d %s%s%s", status, code ? code : "error", msg ? ": " : "", msg ? msg : "");
		json_decref(ans);
		return 1;
	}
	*answer = ans;
	return 0;
}

static const char net_usage[] =
	"usage: spacectl net ID [--network allow|deny] [--allow-out CIDR|DOMAIN]... [--deny-out CIDR|DOMAIN]... [--json]\n";

static void print_policy(json_t *net, int json)
{
	if (json) {
		char *s = json_dumps(net, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
		if (s)
			puts(s);
		free(s);
		return;
	}
	printf("mode %s\n", json_string_value(json_object_get(net, "mode")));
	const char *lists[] = {"allow_out", "deny_out"};
	for (int l = 0; l < 2; l++) {
		size_t i;
		json_t *v;
		json_array_foreach(json_object_get(net, lists[l]), i, v)
			printf("%s %s\n", lists[l], json_string_value(v));
	}
}

int cmd_net(int argc, char **argv)
{
	enum { O_JSON = 1, O_NETWORK, O_ALLOW, O_DENY };
	static const struct option opts[] = {
		{"json", no_argument, NULL, O_JSON},
		{"network", required_argument, NULL, O_NETWORK},
		{"allow-out", required_argument, NULL, O_ALLOW},
		{"deny-out", required_argument, NULL, O_DENY},
		{NULL, 0, NULL, 0},
	};
	int json = 0, c, rc = 1, change = 0;
	const char *mode = NULL;
	json_t *allow = NULL, *deny = NULL, *ans = NULL, *req = NULL;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case O_JSON: json = 1; break;
		case O_NETWORK: mode = optarg; change = 1; break;
		case O_ALLOW:
		case O_DENY: {
			json_t **l = c == O_ALLOW ? &allow : &deny;
			if (*l == NULL)
				*l = json_array();
			if (optarg[0] != '\0')
				json_array_append_new(*l, json_string(optarg));
			change = 1;
			break;
		}
		default: rc = cli_usage(net_usage); goto out;
		}
	}
	if (argc - optind != 1) {
		rc = cli_usage(net_usage);
		goto out;
	}
	const char *id = argv[optind];
	char path[256];
	if (strlen(id) > 63 || strpbrk(id, "/?#% ") != NULL) {
		rc = cli_fail("net", "'%s' is not a sandbox ID", id);
		goto out;
	}
	snprintf(path, sizeof path, "/v1/sandboxes/%s", id);
	if ((rc = net_cp_call("net", "GET", path, NULL, &ans)) != 0)
		goto out;
	json_t *cur = json_object_get(ans, "network");
	if (!change) {
		print_policy(cur, json);
		rc = 0;
		goto out;
	}
	req = json_pack("{s:s,s:O,s:O}", "mode", mode ? mode : json_string_value(json_object_get(cur, "mode")),
	                "allow_out", allow ? allow : json_object_get(cur, "allow_out"), "deny_out",
	                deny ? deny : json_object_get(cur, "deny_out"));
	json_decref(ans);
	ans = NULL;
	if (req == NULL) {
		rc = cli_fail("net", "the current policy is unreadable");
		goto out;
	}
	snprintf(path, sizeof path, "/v1/sandboxes/%s/network", id);
	if ((rc = net_cp_call("net", "POST", path, req, &ans)) != 0)
		goto out;
	print_policy(json_object_get(ans, "network"), json);
	rc = 0;
out:
	json_decref(allow);
	json_decref(deny);
	json_decref(req);
	json_decref(ans);
	return rc;
}
