/*
 * cmd_template.c — spacectl template (docs/templates.md), with SPACED_CP_URL
 * and SPACED_API_KEY from the environment:
 *   template import NAME FILE [--json]     a root filesystem tarball (gzip, xz, zstd or none) or an
 *                                          OCI image archive; uploaded to the control plane's store
 *   template build NAME -f SPACEFILE [--context DIR] [--no-cache] [--json]   (tmpl_build.c)
 *   template ls [--json]
 *   template rm NAME
 * The store's address comes from the control plane (GET /v1/store): https
 * when the control plane speaks TLS (verified as every spacectl connection,
 * net.h); the archive is streamed from the file, never held in memory.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"
#include "http_client.h"
#include "net.h"
#include "tmpl.h"

int tmpl_api(const char *what, const char *method, const char *path, json_t *req, json_t **out)
{
	return net_cp_call(what, method, path, req, out); /* the one control-plane JSON call (cmd_net.c) */
}

static int send_file(const char *what, const char *method, const char *ctype, const char *store_url, const char *path,
                     const char *file, json_t **out);

int tmpl_upload(const char *what, const char *store_url, const char *path, const char *file, json_t **out)
{
	return send_file(what, "PUT", "application/octet-stream", store_url, path, file, out);
}

int tmpl_post_file(const char *what, const char *store_url, const char *path, const char *file, json_t **out)
{
	return send_file(what, "POST", "application/json", store_url, path, file, out);
}

static int send_file(const char *what, const char *method, const char *ctype, const char *store_url, const char *path,
                     const char *file, json_t **out)
{
	const char *key = getenv("SPACED_API_KEY");
	char host[256], prefix[512], err[512];
	int port, in = -1, rc = 1;
	struct net_conn *nc = NULL;
	unsigned char *ans = NULL, *body = NULL, *chunk = NULL;
	size_t alen = 0, acap = 0, blen = 0;
	struct stat sb;
	int tls = 0;
	/* https when the control plane speaks TLS: the API key travels in it */
	if (http_parse_url(store_url, host, sizeof host, &port, prefix, sizeof prefix, &tls) < 0)
		return cli_fail(what, "the store's address %s is not an http(s)://HOST:PORT URL", store_url);
	in = open(file, O_RDONLY | O_CLOEXEC);
	if (in < 0 || fstat(in, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		rc = cli_fail(what, "%s: %s", file, in < 0 ? strerror(errno) : "not a regular file");
		goto out;
	}
	if (net_connect(host, port, tls != 0, 600, &nc, err, sizeof err) < 0) {
		rc = cli_fail(what, "%s", err);
		goto out;
	}
	char head[2048];
	int n = snprintf(head, sizeof head,
	                 "%s %s%s HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: Bearer %s\r\nContent-Type: "
	                 "%s\r\nContent-Length: %lld\r\nConnection: close\r\n\r\n",
	                 method, prefix, path, host, port, key ? key : "", ctype, (long long)sb.st_size);
	if (n < 0 || (size_t)n >= sizeof head || net_send(nc, head, (size_t)n, 0) != n) {
		rc = cli_fail(what, "cannot send the request");
		goto out;
	}
	off_t off = 0;
	if (!net_tls(nc)) {
		/* plaintext: straight from the file to the socket; a store that
		 * answered early and closed (a refusal, or busy) is EPIPE, not a
		 * silent death by SIGPIPE */
		void (*was)(int) = signal(SIGPIPE, SIG_IGN);
		while (off < sb.st_size) {
			size_t left = (size_t)(sb.st_size - off);
			ssize_t w = sendfile(net_fd(nc), in, &off, left < (1u << 30) ? left : (1u << 30));
			if (w <= 0)
				break; /* the store may have answered early (a refusal): read it below */
		}
		signal(SIGPIPE, was);
	} else if ((chunk = malloc(256 * 1024)) != NULL) {
		while (off < sb.st_size) {
			ssize_t r = read(in, chunk, 256 * 1024);
			if (r <= 0)
				break;
			ssize_t done = 0;
			while (done < r) {
				ssize_t w = net_send(nc, chunk + done, (size_t)(r - done), 0);
				if (w <= 0)
					break;
				done += w;
			}
			if (done < r)
				break; /* an early answer: read it below */
			off += r;
		}
	}
	for (;;) {
		if (alen + 4096 + 1 > acap) {
			size_t nc2 = acap ? acap * 2 : 16384;
			unsigned char *na = realloc(ans, nc2);
			if (!na || nc2 > HTTP_RESPONSE_MAX) {
				free(na == ans ? NULL : na);
				rc = cli_fail(what, "answer too large");
				goto out;
			}
			ans = na;
			acap = nc2;
		}
		ssize_t got = net_recv(nc, ans + alen, acap - alen - 1, 0);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			break;
		alen += (size_t)got;
	}
	if (!ans || alen == 0) {
		rc = cli_fail(what, "the store closed the connection without an answer");
		goto out;
	}
	ans[alen] = 0;
	int status = 0;
	if (http_parse_answer(ans, alen, &status, &body, &blen, NULL, NULL, 0, err, sizeof err) < 0) {
		rc = cli_fail(what, "%s", err);
		goto out;
	}
	json_error_t jerr;
	json_t *j = json_loads((const char *)body, JSON_REJECT_DUPLICATES, &jerr);
	if (!j) {
		rc = cli_fail(what, "HTTP %d with a malformed answer", status);
		goto out;
	}
	if (status < 200 || status > 299) {
		const char *code = json_string_value(json_object_get(j, "error"));
		const char *msg = json_string_value(json_object_get(j, "message"));
		rc = cli_fail(what, "HTTP %d %s%s%s", status, code ? code : "error", msg ? ": " : "", msg ? msg : "");
		json_decref(j);
		goto out;
	}
	*out = j;
	rc = 0;
out:
	net_close(nc);
	if (in >= 0)
		close(in);
	free(chunk);
	free(ans);
	free(body);
	return rc;
}

int tmpl_store_url(const char *what, char *out, size_t outsz)
{
	json_t *a = NULL;
	if (tmpl_api(what, "GET", "/v1/store", NULL, &a) != 0)
		return 1;
	const char *u = json_string_value(json_object_get(a, "url"));
	if (!u || strlen(u) >= outsz) {
		json_decref(a);
		return cli_fail(what, "the control plane names no store");
	}
	snprintf(out, outsz, "%s", u);
	json_decref(a);
	return 0;
}

static void print_json(json_t *v)
{
	char *s = json_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	if (s)
		puts(s);
	free(s);
}

static int do_import(int argc, char **argv)
{
	static const char use[] = "usage: spacectl template import NAME FILE [--json]";
	const char *name = NULL, *file = NULL;
	int json = 0;
	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0)
			json = 1;
		else if (!name)
			name = argv[i];
		else if (!file)
			file = argv[i];
		else
			return cli_usage(use);
	}
	if (!name || !file)
		return cli_usage(use);
	char store[512], path[600];
	json_t *a = NULL;
	if (tmpl_store_url("template import", store, sizeof store) != 0)
		return 1;
	snprintf(path, sizeof path, "/v1/templates/%s", name);
	if (tmpl_upload("template import", store, path, file, &a) != 0)
		return 1;
	if (json)
		print_json(a);
	else
		printf("%s %s\n", json_string_value(json_object_get(a, "name")), json_string_value(json_object_get(a, "hash")));
	json_decref(a);
	return 0;
}

static int do_ls(int argc, char **argv)
{
	int json = argc == 1 && strcmp(argv[0], "--json") == 0;
	if (argc > 1 || (argc == 1 && !json))
		return cli_usage("usage: spacectl template ls [--json]");
	json_t *a = NULL;
	if (tmpl_api("template ls", "GET", "/v1/templates", NULL, &a) != 0)
		return 1;
	json_t *t = json_object_get(a, "templates"), *v;
	size_t i;
	if (json) {
		print_json(t);
	} else {
		json_array_foreach(t, i, v) {
			printf("%-24s %.16s  %12lld bytes  %s\n", json_string_value(json_object_get(v, "name")),
			       json_string_value(json_object_get(v, "hash")),
			       (long long)json_integer_value(json_object_get(v, "bytes")),
			       json_string_value(json_object_get(v, "created")));
		}
	}
	json_decref(a);
	return 0;
}

static int do_rm(int argc, char **argv)
{
	if (argc != 1)
		return cli_usage("usage: spacectl template rm NAME");
	char path[600];
	json_t *a = NULL;
	snprintf(path, sizeof path, "/v1/templates/%s", argv[0]);
	if (tmpl_api("template rm", "DELETE", path, NULL, &a) != 0)
		return 1;
	json_decref(a);
	return 0;
}

int cmd_template(int argc, char **argv)
{
	static const char use[] = "usage: spacectl template import NAME FILE [--json]\n"
	                          "       spacectl template build NAME -f SPACEFILE [--context DIR] [--no-cache] [--json]\n"
	                          "       spacectl template ls [--json]\n"
	                          "       spacectl template rm NAME";
	if (argc < 2)
		return cli_usage(use);
	if (strcmp(argv[1], "import") == 0)
		return do_import(argc - 2, argv + 2);
	if (strcmp(argv[1], "build") == 0)
		return tmpl_build(argc - 2, argv + 2);
	if (strcmp(argv[1], "ls") == 0)
		return do_ls(argc - 2, argv + 2);
	if (strcmp(argv[1], "rm") == 0)
		return do_rm(argc - 2, argv + 2);
	return cli_usage(use);
}
