/* spacectl — the command line of spaced. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "cli.h"
#include "tmpl.h"
#include "cmd_ops.h"

static const char usage[] =
	"usage: spacectl <command> [args]\n"
	"\n"
	"tokens and capabilities:\n"
	"  token keygen [--json]                          a new Ed25519 key pair (k4.secret, k4.public, k4.pid)\n"
	"  token sign --key k4.secret.… [--footer F] [--implicit I] PAYLOAD|-\n"
	"  token verify --key k4.public.… [--footer F] [--implicit I] TOKEN|-\n"
	"  cap issue --key k4.secret.… --sandbox S --generation N --worker W [--substrate T]\n"
	"            [--activation A] [--pod-uid U] --purpose P... [--port N --protocol X] [--ttl S]\n"
	"  cap inspect [--key k4.public.… | --bundle FILE] [--json] TOKEN|-\n"
	"  cap check (--key k4.public.… | --bundle FILE) --installed IDENTITY [--tombstone]\n"
	"            --purpose P [--port N --protocol X] TOKEN|-\n"
	"\n"
	"\n"
	"control plane (SPACED_CP_URL, SPACED_API_KEY; https:// and wss:// verified against SPACED_CA_FILE,\n"
	"else the system's trust store):\n"
	"  workers [--json]                               registered workers\n"
	"  create [--worker W] [--substrate S] [--cpus N] [--memory SIZE] [--pids N] [--disk SIZE]\n"
	"         [--template T] [--env K=V]... [--meta K=V]... [--auto-resume] [--restart on-failure] [--json]\n"
	"                                                 a new sandbox (prints its ID); limits default\n"
	"                                                 to the worker's (SIZE: bytes or 512M, 2G …)\n"
	"  quota [--json]                                 the tenant's quotas and what it holds\n"
	"  ls [--meta K=V]... [--json] | rm ID | inspect ID [--json]\n"
	"  timeout ID SECONDS                             reaped SECONDS from now (0: never)\n"
	"  route ID [--purpose P]... [--port N --protocol X] [--json]\n"
	"  pause ID | snapshot ID | resume ID [--worker W] | move ID --to W\n"
	"\n"
	"network (docs/network.md):\n"
	"  create … [--network allow|deny] [--allow-out CIDR|DOMAIN]... [--deny-out CIDR|DOMAIN]...\n"
	"  net ID [--network allow|deny] [--allow-out X]... [--deny-out X]... [--json]   show or change egress live\n"
	"  expose ID PORT [--protocol http|tcp] [--json]   a URL and capability for a port (spaced-netgtw)\n"
	"  port-forward ID PORT [LOCAL_PORT]              a local port forwarded through the gateway\n"
	"\n"
	"templates (docs/templates.md):\n"
	"  template import NAME FILE [--json]             a root filesystem tarball or an OCI image archive\n"
	"  template build NAME -f SPACEFILE [--context DIR] [--no-cache] [--json]\n"
	"  template ls [--json] | template rm NAME\n"
	"\n"
	"sandbox operations (through the worker that serves the sandbox; route cached, V1–V4):\n"
	"  [-v] exec ID [--env K=V]... [--cwd DIR] [--user U] [--timeout S] [--no-stdin] -- CMD [ARG...]\n"
	"                                                 streamed: stdin, stdout, stderr, signals, exit status\n"
	"  [-v] fs read|write|ls|stat|mkdir|mv|rm ID PATH...      (write: content on stdin; any size)\n"
	"  [-v] watch ID PATH                                   file events until interrupted\n"
	"  [-v] term ID [--env K=V]... [--cwd DIR] [-- CMD...]  an interactive terminal (/bin/sh)\n"
	"  [-v] top ID [--json]                                 CPU, memory, pids and disk used, and the limits\n"
	"       each also [--route FILE] [--no-retry]\n"
	"\n"
	"development cluster on this machine:\n"
	"  dev up [--workers N] [--dir DIR] [--substrate process|qemu|dev] [--pool N] [--plaintext] | dev down [--dir DIR]\n"
	"       | dev status                               TLS with a CA of its own in DIR/tls (SPACED_CA_FILE)\n"
	"  dev certs [--dir DIR] [--workers N]            only that CA and its certificates\n"
	"\n"
	"shell:\n"
	"  completion bash                                a bash completion script (source <(spacectl completion bash))\n"
	"\n"
	"worker admin socket (root):\n"
	"  node status|install|deactivate|pause|thaw|snapshot|destroy|keys --admin PATH …\n"
	"\n"
	"purposes: fs.read fs.write exec term watch serviceport lifecycle\n";

int cli_fail(const char *what, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "spacectl: %s: ", what);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 1;
}

int cli_print_name(FILE *f, const char *name)
{
	for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
		int r;
		if (*p == '\\')
			r = fputs("\\\\", f);
		else if (*p == '\n')
			r = fputs("\\n", f);
		else if (*p == '\t')
			r = fputs("\\t", f);
		else if (*p < 0x20 || *p == 0x7f)
			r = fprintf(f, "\\x%02x", *p);
		else
			r = fputc(*p, f);
		if (r < 0)
			return -1;
	}
	return 0;
}

int cli_usage(const char *u)
{
	fputs(u, stderr);
	return 2;
}

char *cli_read_stdin(size_t max, size_t *len)
{
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap + 1);
	while (buf != NULL) {
		if (n == cap) {
			if (cap >= max) {
				free(buf);
				return NULL;
			}
			cap = cap * 2 > max ? max : cap * 2;
			char *nb = realloc(buf, cap + 1);
			if (nb == NULL)
				break;
			buf = nb;
		}
		ssize_t got = read(STDIN_FILENO, buf + n, cap - n);
		if (got < 0) {
			break;
		}
		if (got == 0) {
			buf[n] = 0;
			*len = n;
			return buf;
		}
		n += (size_t)got;
	}
	free(buf);
	return NULL;
}

int main(int argc, char **argv)
{
	if (sodium_init() < 0) {
		fprintf(stderr, "spacectl: libsodium failed to initialise\n");
		return 1;
	}
	if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
	    strcmp(argv[1], "help") == 0) {
		fputs(usage, argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (strcmp(argv[1], "-v") == 0 && argc > 2) {
		ops_verbose = 1;
		argc--;
		argv++;
	}
	if (strcmp(argv[1], "exec") == 0)
		return cmd_exec(argc - 1, argv + 1);
	if (strcmp(argv[1], "fs") == 0)
		return cmd_fs(argc - 1, argv + 1);
	if (strcmp(argv[1], "watch") == 0)
		return cmd_watch(argc - 1, argv + 1);
	if (strcmp(argv[1], "term") == 0)
		return cmd_term(argc - 1, argv + 1);
	if (strcmp(argv[1], "top") == 0)
		return cmd_top(argc - 1, argv + 1);
	if (strcmp(argv[1], "dev") == 0)
		return cmd_dev(argc - 1, argv + 1);
	if (strcmp(argv[1], "completion") == 0)
		return cmd_completion(argc - 1, argv + 1);
	if (strcmp(argv[1], "token") == 0)
		return cmd_token(argc - 1, argv + 1);
	if (strcmp(argv[1], "cap") == 0)
		return cmd_cap(argc - 1, argv + 1);
	if (strcmp(argv[1], "node") == 0)
		return cmd_node(argc - 1, argv + 1);
	if (strcmp(argv[1], "template") == 0)
		return cmd_template(argc - 1, argv + 1);
	if (strcmp(argv[1], "net") == 0)
		return cmd_net(argc - 1, argv + 1);
	if (strcmp(argv[1], "expose") == 0)
		return cmd_expose(argc - 1, argv + 1);
	if (strcmp(argv[1], "port-forward") == 0)
		return cmd_port_forward(argc - 1, argv + 1);
	static const char *const cp_cmds[] = {"workers", "create", "ls", "rm", "inspect", "route",
	                                      "pause", "snapshot", "resume", "move", "quota", "timeout", NULL};
	for (size_t i = 0; cp_cmds[i] != NULL; i++)
		if (strcmp(argv[1], cp_cmds[i]) == 0)
			return cmd_cp(argc - 1, argv + 1);
	fprintf(stderr, "spacectl: unknown command '%s'\n%s", argv[1], usage);
	return 2;
}
