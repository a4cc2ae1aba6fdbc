/*
 * cmd_node.c — `spacectl node …`: a worker's local admin socket
 * (docs/control-messages.md). Each command sends one control message and
 * prints the acknowledgement line; exit status 0 when it says ok.
 *
 *   node status     --admin PATH
 *   node install    --admin PATH IDENTITY [--handoff] [--snapshot DIR] [--seq N]
 *   node deactivate --admin PATH IDENTITY [--keep-paused] [--seq N]
 *   node pause|thaw --admin PATH IDENTITY [--seq N]
 *   node snapshot   --admin PATH IDENTITY (--path DIR | --url URL) [--seq N]
 *   node destroy    --admin PATH --sandbox S [--seq N]
 *   node keys       --admin PATH BUNDLE_FILE [--seq N]
 * IDENTITY: --sandbox S --generation N --worker W [--substrate T] [--activation A] [--pod-uid U]
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"
#include "spaced_error.h"
#include "identity.h"
#include "keyring.h"

static const char node_usage[] =
	"usage: spacectl node status --admin PATH\n"
	"       spacectl node install --admin PATH IDENTITY [--handoff] [--snapshot DIR] [--seq N]\n"
	"       spacectl node deactivate --admin PATH IDENTITY [--keep-paused] [--seq N]\n"
	"       spacectl node pause|thaw --admin PATH IDENTITY [--seq N]\n"
	"       spacectl node snapshot --admin PATH IDENTITY (--path DIR | --url URL) [--seq N]\n"
	"       spacectl node destroy --admin PATH --sandbox S [--seq N]\n"
	"       spacectl node keys --admin PATH BUNDLE_FILE [--seq N]\n"
	"IDENTITY: --sandbox S --generation N --worker W [--substrate T] [--activation A] [--pod-uid U]\n";

static int admin_roundtrip(const char *path, const char *line, char **reply)
{
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	if (strlen(path) >= sizeof sa.sun_path)
		return SPACED_EINVAL;
	memcpy(sa.sun_path, path, strlen(path));
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return SPACED_ESYS;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		close(fd);
		return SPACED_ECLOSED;
	}
	size_t n = strlen(line);
	int e = 0;
	if (write(fd, line, n) != (ssize_t)n || write(fd, "\n", 1) != 1)
		e = SPACED_EIO;
	size_t cap = 65536, got = 0;
	char *buf = malloc(cap + 1);
	while (e == 0 && buf) {
		ssize_t r = read(fd, buf + got, cap - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			e = SPACED_ECLOSED;
			break;
		}
		got += (size_t)r;
		char *nl = memchr(buf, '\n', got);
		if (nl) {
			*nl = '\0';
			break;
		}
		if (got == cap) {
			cap *= 2;
			char *nb = cap > (16u << 20) ? NULL : realloc(buf, cap + 1);
			if (!nb) {
				e = SPACED_ETOOBIG;
				break;
			}
			buf = nb;
		}
	}
	close(fd);
	if (!buf)
		return SPACED_ENOMEM;
	if (e < 0) {
		free(buf);
		return e;
	}
	*reply = buf;
	return 0;
}

int cmd_node(int argc, char **argv)
{
	if (argc < 2)
		return cli_usage(node_usage);
	const char *cmd = argv[1];
	const char *admin = NULL, *sandbox = NULL, *worker = NULL, *substrate = "process",
	           *activation = "act-1", *pod = NULL, *snapshot = NULL, *path = NULL, *url = NULL, *bundle = NULL;
	unsigned long long gen = 0, seq = 0;
	bool handoff = false, keep = false;

	for (int i = 2; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--handoff") == 0) {
			handoff = true;
			continue;
		}
		if (strcmp(a, "--keep-paused") == 0) {
			keep = true;
			continue;
		}
		if (a[0] != '-' || a[1] != '-') {
			if (bundle)
				return cli_usage(node_usage);
			bundle = a;
			continue;
		}
		if (!v)
			return cli_usage(node_usage);
		i++;
		if (strcmp(a, "--admin") == 0)
			admin = v;
		else if (strcmp(a, "--sandbox") == 0)
			sandbox = v;
		else if (strcmp(a, "--generation") == 0)
			gen = strtoull(v, NULL, 10);
		else if (strcmp(a, "--worker") == 0)
			worker = v;
		else if (strcmp(a, "--substrate") == 0)
			substrate = v;
		else if (strcmp(a, "--activation") == 0)
			activation = v;
		else if (strcmp(a, "--pod-uid") == 0)
			pod = v;
		else if (strcmp(a, "--snapshot") == 0)
			snapshot = v;
		else if (strcmp(a, "--path") == 0)
			path = v;
		else if (strcmp(a, "--url") == 0)
			url = v;
		else if (strcmp(a, "--seq") == 0)
			seq = strtoull(v, NULL, 10);
		else
			return cli_usage(node_usage);
	}
	if (!admin)
		return cli_usage(node_usage);

	json_t *msg = json_object();
	bool needs_id = strcmp(cmd, "install") == 0 || strcmp(cmd, "deactivate") == 0 ||
	                strcmp(cmd, "pause") == 0 || strcmp(cmd, "thaw") == 0 || strcmp(cmd, "snapshot") == 0;
	if (needs_id) {
		struct spaced_identity id;
		if (!sandbox || !worker || gen == 0 ||
		    spaced_identity_set(&id, sandbox, gen, worker, substrate, activation, pod) < 0) {
			json_decref(msg);
			return cli_fail("node", "a valid identity is needed (--sandbox, --generation, --worker)");
		}
		json_object_set_new(msg, "identity", spaced_identity_to_json(&id));
	}
	json_object_set_new(msg, "type", json_string(cmd));
	if (strcmp(cmd, "status") == 0) {
		/* nothing more */
	} else if (strcmp(cmd, "install") == 0) {
		json_object_set_new(msg, "handoff", json_boolean(handoff));
		if (snapshot)
			json_object_set_new(msg, "spec", json_pack("{s:s}", "snapshot", snapshot));
	} else if (strcmp(cmd, "deactivate") == 0) {
		json_object_set_new(msg, "keep_paused", json_boolean(keep));
	} else if (strcmp(cmd, "pause") == 0 || strcmp(cmd, "thaw") == 0) {
		/* identity only */
	} else if (strcmp(cmd, "snapshot") == 0) {
		/* a directory, or the URL its archive is uploaded to (a store's) */
		if (!path == !url) {
			json_decref(msg);
			return cli_usage(node_usage);
		}
		json_object_set_new(msg, path ? "path" : "url", json_string(path ? path : url));
	} else if (strcmp(cmd, "destroy") == 0) {
		if (!sandbox) {
			json_decref(msg);
			return cli_usage(node_usage);
		}
		json_object_set_new(msg, "sandbox", json_string(sandbox));
	} else if (strcmp(cmd, "keys") == 0) {
		json_error_t jerr;
		json_t *b = bundle ? json_load_file(bundle, JSON_REJECT_DUPLICATES, &jerr) : NULL;
		if (!b) {
			json_decref(msg);
			return cli_fail("node keys", "cannot read the bundle %s", bundle ? bundle : "(none given)");
		}
		json_object_set_new(msg, "bundle", b);
	} else {
		json_decref(msg);
		return cli_usage(node_usage);
	}
	if (seq)
		json_object_set_new(msg, "seq", json_integer((json_int_t)seq));
	char *line = json_dumps(msg, JSON_COMPACT);
	json_decref(msg);
	if (!line)
		return cli_fail("node", "out of memory");
	char *reply = NULL;
	int e = admin_roundtrip(admin, line, &reply);
	free(line);
	if (e < 0)
		return cli_fail("node", "admin socket %s: %s", admin, spaced_strerror(e));
	printf("%s\n", reply);
	json_t *ack = json_loads(reply, 0, NULL);
	free(reply);
	bool ok = ack && json_is_true(json_object_get(ack, "ok"));
	if (!ok && ack) {
		json_t *er = json_object_get(ack, "error"), *code = json_object_get(ack, "code");
		fprintf(stderr, "spacectl: node %s: %s (%s)\n", cmd, json_is_string(er) ? json_string_value(er) : "refused",
		        json_is_string(code) ? json_string_value(code) : "?");
	}
	json_decref(ack);
	return ok ? 0 : 1;
}
