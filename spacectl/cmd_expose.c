/*
 * cmd_expose.c — ServicePorts from the command line (docs/network.md):
 *
 *   expose ID PORT [--protocol http|tcp] [--json]
 *       a serviceport capability for PORT and the URL of the execution's
 *       gateway on its worker: {"url","capability","expires_at","identity"};
 *       curl -H "Authorization: Bearer CAP" URL reaches the port, and
 *       URL?spaced_token=CAP gives a browser a cookie for it.
 *   port-forward ID PORT [LOCAL_PORT]
 *       listens on 127.0.0.1:LOCAL_PORT (0 or absent: any free port, printed)
 *       and carries each connection to the sandbox's PORT through the gateway
 *       (a spaced-tcp upgrade with a fresh capability; REFRESH_ROUTE is
 *       answered by one new route and one retry, V1/V2).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"
#include "net.h"


/* A serviceport route for id/port/protocol: the control plane's answer. */
static int sp_route(const char *what, const char *id, long port, const char *protocol, json_t **ans)
{
	char path[256];
	if (strlen(id) > 63 || strpbrk(id, "/?#% ") != NULL)
		return cli_fail(what, "'%s' is not a sandbox ID", id);
	snprintf(path, sizeof path, "/v1/sandboxes/%s/route", id);
	json_t *req = json_pack("{s:[s],s:i,s:s}", "purposes", "serviceport", "port", (int)port, "protocol", protocol);
	int rc = net_cp_call(what, "POST", path, req, ans);
	json_decref(req);
	if (rc == 0 && json_object_get(*ans, "url") == NULL) {
		json_decref(*ans);
		return cli_fail(what, "the sandbox's worker reports no ServicePort gateway");
	}
	return rc;
}

static long port_arg(const char *s)
{
	char *end;
	long v = strtol(s, &end, 10);
	return (*end || v < 1 || v > 65535) ? -1 : v;
}

int cmd_expose(int argc, char **argv)
{
	static const char usage[] = "usage: spacectl expose ID PORT [--protocol http|tcp] [--json]\n";
	static const struct option opts[] = {
		{"protocol", required_argument, NULL, 'p'},
		{"json", no_argument, NULL, 'j'},
		{NULL, 0, NULL, 0},
	};
	const char *protocol = "http";
	int json = 0, c;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 'p')
			protocol = optarg;
		else if (c == 'j')
			json = 1;
		else
			return cli_usage(usage);
	}
	if (argc - optind != 2 || port_arg(argv[optind + 1]) < 0)
		return cli_usage(usage);
	json_t *ans = NULL;
	int rc = sp_route("expose", argv[optind], port_arg(argv[optind + 1]), protocol, &ans);
	if (rc != 0)
		return rc;
	json_t *out = json_pack("{s:O,s:O,s:O,s:O}", "url", json_object_get(ans, "url"), "capability",
	                        json_object_get(ans, "capability"), "expires_at", json_object_get(ans, "expires_at"),
	                        "identity", json_object_get(ans, "identity"));
	if (json) {
		char *s = out ? json_dumps(out, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
		if (s)
			puts(s);
		free(s);
	} else {
		printf("%s\n", json_string_value(json_object_get(ans, "url")));
		printf("# curl -H \"Authorization: Bearer $CAP\" URL, or open URL?spaced_token=CAP (until %s)\n",
		       json_string_value(json_object_get(ans, "expires_at")));
	}
	json_decref(out);
	json_decref(ans);
	return 0;
}

/* ---- port-forward ---- */

struct pf {
	const char *id;
	long port;
	char cap[4096];
	char host[192], name[160]; /* the Host header; the name the gateway's certificate is checked for */
	int gw_port;
	bool tls; /* the gateway speaks TLS (its URL is https://) */
	time_t expires;
};

static int pf_refresh(struct pf *p)
{
	json_t *ans = NULL;
	if (sp_route("port-forward", p->id, p->port, "tcp", &ans) != 0)
		return -1;
	const char *cap = json_string_value(json_object_get(ans, "capability"));
	json_t *gp = json_object_get(ans, "gateway_port");
	if (!cap || strlen(cap) >= sizeof p->cap || !json_is_integer(gp)) {
		json_decref(ans);
		return cli_fail("port-forward", "malformed route answer");
	}
	snprintf(p->cap, sizeof p->cap, "%s", cap);
	p->gw_port = (int)json_integer_value(gp);
	const char *url = json_string_value(json_object_get(ans, "url"));
	p->tls = url && strncmp(url, "https://", 8) == 0;
	snprintf(p->name, sizeof p->name, "%ld-%s.%slocalhost", p->port, p->id, p->tls ? "gw." : "");
	snprintf(p->host, sizeof p->host, "%s:%d", p->name, p->gw_port);
	p->expires = time(NULL) + 90; /* capabilities live 120 s: renewed well before */
	json_decref(ans);
	return 0;
}

/* Opens a tunnel through the gateway (TLS when it speaks it, its certificate
 * checked for the gateway's name); the HTTP status of its answer (101 on
 * success, *out the tunnel), -1 on error. */
static int pf_open(const struct pf *p, struct net_conn **out)
{
	struct net_conn *g = NULL;
	char err[512];
	if (net_connect_named("127.0.0.1", p->gw_port, p->tls ? p->name : "127.0.0.1", p->tls, 30, &g, err, sizeof err) <
	    0) {
		fprintf(stderr, "spacectl: port-forward: %s\n", err);
		return -1;
	}
	char req[5000];
	int n = snprintf(req, sizeof req,
	                 "GET / HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\n"
	                 "Upgrade: spaced-tcp\r\n\r\n",
	                 p->host, p->cap);
	for (int o = 0; o < n;) {
		ssize_t w = net_send(g, req + o, (size_t)(n - o), 0);
		if (w <= 0) {
			net_close(g);
			return -1;
		}
		o += (int)w;
	}
	/* the answer head, byte by byte: what follows belongs to the tunnel */
	char head[4096];
	size_t got = 0;
	while (got < sizeof head - 1) {
		ssize_t r = net_recv(g, head + got, 1, 0);
		if (r <= 0)
			break;
		got++;
		if (got >= 4 && memcmp(head + got - 4, "\r\n\r\n", 4) == 0)
			break;
	}
	head[got] = '\0';
	int status = 0;
	if (sscanf(head, "HTTP/1.1 %d", &status) != 1 || status != 101) {
		net_close(g);
		return status ? status : -1;
	}
	*out = g;
	return 101;
}

/* Bytes both ways between the local client a and the tunnel g until both
 * ends are done (TLS may hold decrypted bytes poll does not show). */
static void relay(int a, struct net_conn *g)
{
	char buf[65536];
	bool a_eof = false, g_eof = false;
	int gfd = net_fd(g);
	net_set_timeout_ms(g, 30000);
	while (!(a_eof && g_eof)) {
		bool pend = !g_eof && net_pending(g);
		struct pollfd pf[2] = {{.fd = a, .events = a_eof ? 0 : POLLIN}, {.fd = gfd, .events = g_eof ? 0 : POLLIN}};
		if (poll(pf, 2, pend ? 0 : -1) < 0 && errno != EINTR)
			return;
		if (!a_eof && (pf[0].revents & (POLLIN | POLLHUP | POLLERR))) {
			ssize_t r = recv(a, buf, sizeof buf, 0);
			if (r <= 0) {
				shutdown(gfd, SHUT_WR);
				a_eof = true;
				if (r < 0)
					return;
			}
			for (ssize_t o = 0; r > 0 && o < r;) {
				ssize_t w = net_send(g, buf + o, (size_t)(r - o), 0);
				if (w <= 0)
					return;
				o += w;
			}
		}
		if (!g_eof && (pend || (pf[1].revents & (POLLIN | POLLHUP | POLLERR)))) {
			ssize_t r = net_recv(g, buf, sizeof buf, MSG_DONTWAIT);
			if (r < 0 && errno == EAGAIN)
				continue;
			if (r <= 0) {
				shutdown(a, SHUT_WR);
				g_eof = true;
				if (r < 0)
					return;
			}
			for (ssize_t o = 0; r > 0 && o < r;) {
				ssize_t w = send(a, buf + o, (size_t)(r - o), MSG_NOSIGNAL);
				if (w <= 0)
					return;
				o += w;
			}
		}
	}
}

int cmd_port_forward(int argc, char **argv)
{
	static const char usage[] = "usage: spacectl port-forward ID PORT [LOCAL_PORT]\n";
	if (argc < 3 || argc > 4 || port_arg(argv[2]) < 0 || (argc == 4 && strcmp(argv[3], "0") != 0 && port_arg(argv[3]) < 0))
		return cli_usage(usage);
	struct pf p = {.id = argv[1], .port = port_arg(argv[2])};
	if (pf_refresh(&p) < 0)
		return 1;
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(argc == 4 ? atoi(argv[3]) : 0))};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(lfd, 64) < 0)
		return cli_fail("port-forward", "cannot listen on 127.0.0.1:%s: %s", argc == 4 ? argv[3] : "0", strerror(errno));
	socklen_t sl = sizeof sa;
	getsockname(lfd, (struct sockaddr *)&sa, &sl);
	printf("forwarding 127.0.0.1:%u -> %s port %ld\n", ntohs(sa.sin_port), p.id, p.port);
	fflush(stdout);
	signal(SIGCHLD, SIG_IGN); /* tunnels are children; nobody waits for them */
	for (;;) {
		int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (cfd < 0) {
			if (errno == EINTR)
				continue;
			return cli_fail("port-forward", "accept: %s", strerror(errno));
		}
		if (time(NULL) >= p.expires && pf_refresh(&p) < 0) {
			close(cfd);
			continue;
		}
		struct net_conn *g = NULL;
		int st = pf_open(&p, &g);
		if (st == 409 && pf_refresh(&p) == 0) /* REFRESH_ROUTE: one new route, one retry (V2) */
			st = pf_open(&p, &g);
		if (st != 101) {
			fprintf(stderr, "spacectl: port-forward: the gateway answered %d\n", st);
			close(cfd);
			continue;
		}
		int one2 = 1;
		setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one2, sizeof one2);
		pid_t pid = fork();
		if (pid == 0) {
			close(lfd);
			relay(cfd, g);
			_exit(0);
		}
		close(cfd);
		net_drop(g); /* the child relays it */
	}
}
