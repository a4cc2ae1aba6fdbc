/*
 * cmd_stream.c — spacectl's WebSocket streams to a sandbox:
 *   exec ID [--env K=V]... [--cwd DIR] [--user U] [--timeout S] [--no-stdin] -- CMD [ARG...]
 *   term ID [--env K=V]... [--cwd DIR] [-- CMD [ARG...]]
 *   watch ID PATH
 * Each open is one session (session_run): one poll() loop over the WebSocket
 * (ws_client.h), standard input and a self-pipe that carries signals. The
 * first message must be ALLOW naming the route's own execution; anything
 * else ends the session before a byte of output is written. How a session
 * ended decides what follows, by the same rules for the three streams
 * (stream_recover: V1–V5): a refused open gets one repair, a watch or terminal
 * cut by a replacement reopens through admission, an exec is never run twice.
 *
 * Output is written with blocking writes: while standard output does not
 * take it, the socket is not read, and the worker's flow control stops the
 * command (nothing piles up here). Signals interrupt those writes (no
 * SA_RESTART), so ^C is forwarded even then.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"
#include "client.h"
#include "cmd_ops.h"
#include "spaced_error.h"
#include "util.h"
#include "ws.h"
#include "ws_client.h"

/* A request target (path and query) at most: node-api refuses longer ones (414). */
#define TARGET_MAX 8192
/* Largest stdin message ('i' + bytes) node-api takes. */
#define STDIN_CHUNK 65535
/* Stdin is read only while less than this waits to be sent. */
#define TX_HIGH (256u << 10)
/* The connection and the WebSocket handshake. */
#define OPEN_TIMEOUT_S 30

enum kind { K_EXEC, K_TERM, K_WATCH };

/* ---- signals through a self-pipe ---- */

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
	int saved = errno;
	unsigned char b = (unsigned char)sig;
	(void)!write(sig_pipe[1], &b, 1);
	errno = saved;
}

/* Catches sigs: their numbers come out of sig_pipe[0]. SIGWINCH restarts
 * interrupted calls; the others interrupt them (a blocked write to standard
 * output, the handshake), so they are handled at once. Returns 0 or -1. */
static int signals_catch(const int *sigs, size_t n)
{
	if (sig_pipe[0] < 0 && pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
		return -1;
	for (size_t i = 0; i < n; i++) {
		struct sigaction sa;
		memset(&sa, 0, sizeof sa);
		sa.sa_handler = on_signal;
		sigemptyset(&sa.sa_mask);
		sa.sa_flags = sigs[i] == SIGWINCH ? SA_RESTART : 0;
		if (sigaction(sigs[i], &sa, NULL) < 0)
			return -1;
	}
	return 0;
}

/* The next caught signal, or 0. */
static int signal_take(void)
{
	unsigned char b;
	return read(sig_pipe[0], &b, 1) == 1 ? b : 0;
}

/* ---- one session ---- */

struct session {
	enum kind kind;
	const struct client_route *rt;
	const char *target;  /* path and query, after the worker URL's prefix */
	const char *nl;      /* "\r\n" on a terminal in raw mode, else "\n" */
	const char *path;    /* watch: the watched path (for the admission line) */
	struct opargs *oa;
	int raw;             /* term: the local terminal is in raw mode */
	int pass_stdin;      /* exec, term: standard input goes to the command */
	/* kept across the sessions of one command */
	int stdin_eof;       /* standard input ended (or is not passed) */
	int stopped;         /* the user stopped it (exec: the signal number) */
	int signals;         /* exec: signals caught in all */
	/* this session */
	struct ws_client *w;
	int allowed;
	int sent_eof;
	int done;
	int close_code;      /* the server's close code (0: none came) */
	char close_reason[128];
	int transport;       /* no stream: the connection failed or broke without a close */
	int protocol;        /* the server broke the protocol */
	int unverified;      /* ALLOW without the route's identity */
	char error[512];
	int exited, exit_code, exit_signal;
	int stdout_broken;
	uint64_t out_bytes;
	uint64_t started_ns;
};

static void session_fail(struct session *s, int *flag, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void session_fail(struct session *s, int *flag, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->error, sizeof s->error, fmt, ap);
	va_end(ap);
	*flag = 1;
	s->done = 1;
}

static void send_kind(struct session *s, char kind, const void *p, size_t n)
{
	if (ws_client_send(s->w, SPACED_WS_BINARY, &kind, 1, p, n) < 0 && !s->done)
		session_fail(s, &s->transport, "cannot queue a message: %s", ws_client_errmsg(s->w));
}

static void send_signal(struct session *s, int sig)
{
	char b[8];
	int n = snprintf(b, sizeof b, "%d", sig);
	send_kind(s, 's', b, (size_t)n);
	if (s->oa->o.verbose)
		fprintf(stderr, "spacectl: signal %d forwarded to the command%s", sig, s->nl);
}

static void term_size(int *rows, int *cols)
{
	struct winsize ws;
	*rows = 24;
	*cols = 80;
	if (ioctl(STDIN_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
		*rows = ws.ws_row > 1000 ? 1000 : ws.ws_row;
		*cols = ws.ws_col > 1000 ? 1000 : ws.ws_col;
	}
}

/* A caught signal, by kind of stream. */
static void on_caught(struct session *s, int sig)
{
	if (sig == SIGWINCH) {
		if (s->kind == K_TERM && s->allowed && !s->done) {
			int r, c;
			char sz[32];
			term_size(&r, &c);
			int n = snprintf(sz, sizeof sz, "%d %d", r, c);
			send_kind(s, 'r', sz, (size_t)n);
		}
		return;
	}
	if (s->kind != K_EXEC) {
		s->stopped = 1; /* watch, term (^C in raw mode is a byte, not a signal) */
		s->done = 1;
		return;
	}
	s->signals++;
	if (!s->allowed || s->signals >= 3) {
		/* before the admission (the command may not have started), or the
		 * third: stop here; closing the stream makes the worker cancel it */
		s->stopped = sig;
		s->done = 1;
		return;
	}
	if (!s->exited)
		send_signal(s, sig);
}

static void take_signals(struct session *s)
{
	int sig;
	while ((sig = signal_take()) != 0)
		on_caught(s, sig);
}

/* Writes command output to fd whole, handling signals that interrupt the
 * write. Returns 0, or -1 when fd no longer takes output (EPIPE, …). */
static int put_out(struct session *s, int fd, const uint8_t *p, size_t n)
{
	while (n > 0) {
		ssize_t k = write(fd, p, n);
		if (k < 0 && errno == EINTR) {
			take_signals(s);
			(void)ws_client_flush(s->w);
			if (s->stopped)
				return 0;
			continue;
		}
		if (k <= 0)
			return -1;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

static void admitted(struct session *s, const char *ident)
{
	s->allowed = 1;
	struct opargs *oa = s->oa;
	switch (s->kind) {
	case K_WATCH:
		fprintf(stderr, "spacectl: watching %s (identity %s)\n", s->path, ident);
		break;
	case K_TERM:
		if (oa->o.verbose)
			fprintf(stderr, "spacectl: terminal open (identity %s)%s", ident, s->nl);
		break;
	case K_EXEC:
		if (oa->o.no_retry)
			fprintf(stderr, "outcome: ALLOW (%s)\n", ident);
		if (oa->o.verbose)
			fprintf(stderr, "spacectl: ALLOW from %s (identity %s)\n", s->rt->worker_url, ident);
		break;
	}
	if (s->kind != K_WATCH && s->stdin_eof && !s->sent_eof) {
		s->sent_eof = 1;
		send_kind(s, 'd', NULL, 0);
	}
}

/* The first message: ALLOW naming the route's execution, or the end. */
static void on_first(struct session *s, const struct ws_client_msg *m)
{
	json_error_t jerr;
	json_t *j = m->opcode == SPACED_WS_TEXT ? json_loadb((const char *)m->data, m->len, JSON_REJECT_DUPLICATES, &jerr)
	                                        : NULL;
	const char *oc = json_string_value(json_object_get(j, "outcome"));
	const char *id = json_string_value(json_object_get(j, "identity"));
	if (oc == NULL || strcmp(oc, "ALLOW") != 0)
		session_fail(s, &s->protocol, "the stream's first message is not its admission (ALLOW)");
	else if (id == NULL || id[0] == 0)
		session_fail(s, &s->unverified, "ALLOW without the serving identity (not an execution's answer)");
	else if (strcmp(id, s->rt->identity) != 0)
		session_fail(s, &s->unverified, "ALLOW from %.200s, not from the route's execution %.200s", id,
		             s->rt->identity);
	else
		admitted(s, id);
	json_decref(j);
}

static void on_message(struct session *s, const struct ws_client_msg *m)
{
	if (m->opcode == SPACED_WS_CLOSE) {
		s->close_code = (int)m->close_code;
		snprintf(s->close_reason, sizeof s->close_reason, "%s", m->close_reason);
		s->done = 1;
		return;
	}
	if (!s->allowed) {
		on_first(s, m);
		return;
	}
	if (s->kind == K_WATCH) {
		json_error_t jerr;
		json_t *j = json_loadb((const char *)m->data, m->len, JSON_REJECT_DUPLICATES, &jerr);
		const char *ev = json_string_value(json_object_get(j, "event"));
		const char *p1 = json_string_value(json_object_get(j, "path"));
		const char *p2 = json_string_value(json_object_get(j, "path2"));
		if (ev == NULL) {
			json_decref(j);
			session_fail(s, &s->protocol, "a watch message that is not an event");
			return;
		}
		/* the paths are the sandbox's names: escaped, so none forges an event line (cli.h) */
		if (printf("%s ", ev) < 0 || cli_print_name(stdout, p1 ? p1 : "") < 0 ||
		    (p2 && (fputs(" -> ", stdout) < 0 || cli_print_name(stdout, p2) < 0)) || putchar('\n') < 0 ||
		    fflush(stdout) != 0)
			s->stopped = s->done = 1;
		json_decref(j);
		return;
	}
	if (m->opcode == SPACED_WS_BINARY && m->len >= 1 && (m->data[0] == 'o' || m->data[0] == 'e')) {
		int fd = m->data[0] == 'o' ? STDOUT_FILENO : STDERR_FILENO;
		if (s->stdout_broken && fd == STDOUT_FILENO)
			return; /* dropped: nobody takes it any more */
		s->out_bytes += m->len - 1;
		if (put_out(s, fd, m->data + 1, m->len - 1) < 0) {
			if (s->kind == K_EXEC && fd == STDOUT_FILENO) {
				/* as in a local pipeline: the command learns that its
				 * output has no reader (SIGPIPE), its status tells the rest */
				s->stdout_broken = 1;
				if (!s->exited)
					send_signal(s, SIGPIPE);
			} else {
				s->stopped = s->done = 1;
			}
		}
		return;
	}
	if (m->opcode == SPACED_WS_TEXT) {
		json_error_t jerr;
		json_t *j = json_loadb((const char *)m->data, m->len, JSON_REJECT_DUPLICATES, &jerr);
		json_t *ex = json_object_get(j, "exit");
		if (j == NULL) {
			session_fail(s, &s->protocol, "a text message that is not JSON");
		} else if (json_is_object(ex)) {
			s->exited = 1;
			s->exit_code = (int)json_integer_value(json_object_get(ex, "code"));
			s->exit_signal = (int)json_integer_value(json_object_get(ex, "signal"));
		}
		/* other documents: room for additions, ignored */
		json_decref(j);
		return;
	}
	/* other binary kinds: room for additions, ignored */
}

/* Reads standard input once it is readable: 'i' + bytes, or 'd' at its end. */
static void on_stdin(struct session *s)
{
	static uint8_t buf[STDIN_CHUNK];
	ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (n <= 0) {
		/* the end, or an input that cannot be read (EIO: a terminal we
		 * are in the background of): the end too */
		s->stdin_eof = 1;
		if (!s->sent_eof) {
			s->sent_eof = 1;
			send_kind(s, 'd', NULL, 0);
		}
		return;
	}
	send_kind(s, 'i', buf, (size_t)n);
}

/* Handles every whole message read so far. */
static void take_messages(struct session *s)
{
	struct ws_client_msg m;
	int k = 0;
	while (!s->done && (k = ws_client_next(s->w, &m)) == 1)
		on_message(s, &m);
	if (!s->done && k < 0)
		session_fail(s, &s->protocol, "%s", ws_client_errmsg(s->w));
}

/* Opens the stream along s->rt and serves it until it ends (s->done). */
static void session_run(struct session *s)
{
	char host[256], prefix[256];
	int port, tls, http_status = 0;
	s->allowed = s->sent_eof = s->done = s->close_code = 0;
	s->transport = s->protocol = s->unverified = 0;
	s->exited = s->exit_code = s->exit_signal = 0;
	s->close_reason[0] = s->error[0] = 0;
	s->started_ns = spaced_mono_ns();
	if (http_parse_url(s->rt->worker_url, host, sizeof host, &port, prefix, sizeof prefix, &tls) < 0) {
		session_fail(s, &s->transport, "bad worker URL '%s'", s->rt->worker_url);
		return;
	}
	size_t tl = strlen(prefix) + strlen(s->target) + 1;
	char *target = malloc(tl);
	if (target == NULL) {
		session_fail(s, &s->transport, "out of memory");
		return;
	}
	snprintf(target, tl, "%s%s", prefix, s->target);
	int e = ws_client_open(host, port, tls, target, s->rt->capability, OPEN_TIMEOUT_S, &s->w, &http_status, s->error,
	                       sizeof s->error);
	free(target);
	take_signals(s);
	if (e < 0) {
		s->transport = 1;
		s->done = 1;
		return;
	}
	take_messages(s); /* what came with the handshake's answer */
	while (!s->done) {
		struct pollfd pf[3];
		int np = 2, want_in = s->allowed && s->pass_stdin && !s->stdin_eof && ws_client_queued(s->w) < TX_HIGH;
		pf[0] = (struct pollfd){.fd = ws_client_fd(s->w), .events = POLLIN | (ws_client_queued(s->w) ? POLLOUT : 0)};
		pf[1] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
		if (want_in)
			pf[np++] = (struct pollfd){.fd = STDIN_FILENO, .events = POLLIN};
		/* bytes TLS decrypted already are not seen by poll(): no waiting then */
		bool pending = ws_client_pending(s->w);
		if (poll(pf, (nfds_t)np, pending ? 0 : -1) < 0) {
			if (errno == EINTR)
				continue;
			session_fail(s, &s->transport, "poll: %s", strerror(errno));
			break;
		}
		if (pending)
			pf[0].revents |= POLLIN;
		if (pf[1].revents)
			take_signals(s);
		if (pf[0].revents & POLLOUT && ws_client_flush(s->w) < 0) {
			session_fail(s, &s->transport, "%s", ws_client_errmsg(s->w));
			break;
		}
		if (pf[0].revents & (POLLIN | POLLHUP | POLLERR)) {
			int r = ws_client_read(s->w);
			take_messages(s);
			if (!s->done && r < 0)
				session_fail(s, &s->transport, "%s", ws_client_errmsg(s->w));
		}
		if (!s->done && np > 2 && pf[2].revents)
			on_stdin(s);
		if (!s->done && ws_client_flush(s->w) < 0)
			session_fail(s, &s->transport, "%s", ws_client_errmsg(s->w));
	}
	/* our side of the close, then the connection goes (a server that
	 * closed first has its answer queued already) */
	(void)ws_client_close(s->w, 1000, "");
	for (int i = 0; i < 20 && ws_client_flush(s->w) == 1; i++) {
		struct pollfd pf = {.fd = ws_client_fd(s->w), .events = POLLOUT};
		(void)poll(&pf, 1, 50);
	}
	ws_client_free(s->w);
	s->w = NULL;
}

/* ---- what follows a session: the V1–V5 rules for streams ---- */

struct recover {
	int refused_once;    /* a refused open was repaired already (V2: once) */
	int transport_retry; /* an open that failed in transport was tried again */
};

enum next { NEXT_STOP, NEXT_REOPEN };

static const char *close_reason_tail(const struct session *s)
{
	const char *rs = strchr(s->close_reason, ':');
	return rs ? rs + 1 : s->close_reason;
}

static const char *what_of(const struct session *s)
{
	return s->kind == K_EXEC ? "exec" : s->kind == K_TERM ? "term" : "watch";
}

/* After session s along *rt ended without the command's exit (or the user's
 * stop): decides whether to open again (*rt replaced by the route to use) or
 * stop, printing what happened. *rc is the exit status when stopping. */
static enum next stream_recover(struct session *s, const char *sandbox, struct client_route *rt, struct recover *st,
                                int *rc)
{
	struct opargs *oa = s->oa;
	const char *what = what_of(s), *nl = s->nl, *rs = close_reason_tail(s);
	char err[512];
	*rc = 1;
	if (s->unverified) {
		fprintf(stderr, "spacectl: %s: refused: %s%s", what, s->error, nl);
		if (oa->o.route_file == NULL)
			client_route_forget(&oa->o, sandbox, rt);
		return NEXT_STOP;
	}
	if (s->close_code == 4409) {
		if (oa->o.verbose)
			fprintf(stderr, "spacectl: REFRESH_ROUTE %s from %s (route %s)%s", rs, rt->worker_url, rt->identity, nl);
		if (oa->o.no_retry) {
			fprintf(stderr, "outcome: REFRESH_ROUTE (%s)%s", rs, nl);
			return NEXT_STOP;
		}
		if (s->allowed && s->kind == K_EXEC) {
			/* it may have run, in part: never run again */
			fprintf(stderr, "spacectl: exec: the execution was replaced while the command ran (%s): not run again%s",
			        s->close_reason, nl);
			return NEXT_STOP;
		}
		if (!s->allowed && st->refused_once) {
			fprintf(stderr, "spacectl: %s: REFRESH_ROUTE (%s) after one retry%s", what, rs, nl);
			return NEXT_STOP;
		}
		/* a refused open gets one repair (V2); a stream cut after it was
		 * admitted reopens through admission again (V5, S2) */
		st->refused_once = !s->allowed;
		struct client_route fresh;
		int replaced = 0;
		if (client_route_repair(&oa->o, sandbox, rt, &fresh, &replaced, err, sizeof err) < 0) {
			fprintf(stderr, "spacectl: %s: %s%s", what, err, nl);
			return NEXT_STOP;
		}
		if (s->kind == K_WATCH)
			fprintf(stderr, "spacectl: watch %s (%s): reopening at %s (identity %s; %s)\n",
			        s->allowed ? "cut" : "refused", s->close_reason, fresh.worker_url, fresh.identity,
			        client_cache_verdict(replaced));
		else if (s->kind == K_TERM)
			fprintf(stderr, "%s[spacectl: the terminal's execution was replaced (%s); a new terminal at %s]%s", nl,
			        s->close_reason, fresh.identity, nl);
		else if (oa->o.verbose)
			fprintf(stderr, "spacectl: route resolved again: %s at %s; one retry (%s)\n", fresh.identity,
			        fresh.worker_url, client_cache_verdict(replaced));
		client_route_clear(rt);
		*rt = fresh;
		return NEXT_REOPEN;
	}
	if (s->close_code == 4401 || s->close_code == 4403) {
		if (oa->o.verbose)
			fprintf(stderr, "spacectl: DENY %s from %s (route %s)%s", rs, rt->worker_url, rt->identity, nl);
		if (oa->o.no_retry)
			fprintf(stderr, "outcome: DENY (%s)%s", rs, nl);
		else
			fprintf(stderr, "spacectl: %s: DENY (%s): not retried%s", what, rs, nl);
		if (oa->o.route_file == NULL)
			client_route_forget(&oa->o, sandbox, rt);
		return NEXT_STOP;
	}
	if (s->transport && !s->allowed) {
		/* a watch or terminal open is a read: once more on a fresh
		 * connection; an exec may have started: never sent again */
		if (s->kind != K_EXEC && !oa->o.no_retry && !st->transport_retry && !s->stopped) {
			st->transport_retry = 1;
			if (oa->o.verbose)
				fprintf(stderr, "spacectl: %s: %s; once more on a fresh connection%s", what, s->error, nl);
			return NEXT_REOPEN;
		}
		fprintf(stderr, "spacectl: %s: transport failure: %s%s%s", what, s->error,
		        s->kind == K_EXEC || oa->o.no_retry ? " (not retried)"
		                                            : " (after one retry on a fresh connection)", nl);
		return NEXT_STOP;
	}
	if (s->transport || s->protocol) {
		fprintf(stderr, "spacectl: %s: %s%s%s", what, s->error,
		        s->kind == K_EXEC && s->allowed ? " (the command is not run again)" : "", nl);
		return NEXT_STOP;
	}
	if (s->close_code == 1011 && strncmp(s->close_reason, "error:", 6) == 0) {
		const char *code = s->close_reason + 6;
		if (s->kind == K_EXEC && s->allowed) {
			fprintf(stderr, "spacectl: exec: the command could not be run: %s%s", code, nl);
			*rc = strcmp(code, "SPACED_ENOENT") == 0 ? 127 : strcmp(code, "SPACED_EPERM") == 0 ? 126 : 1;
		} else {
			fprintf(stderr, "spacectl: %s: the worker failed: %s%s", what, code, nl);
		}
		return NEXT_STOP;
	}
	if (s->close_code >= 4000 && s->close_code < 5000)
		fprintf(stderr, "spacectl: %s: refused by the worker: %d %s%s", what, s->close_code, s->close_reason, nl);
	else
		fprintf(stderr, "spacectl: %s: the stream ended (%d %s)%s", what, s->close_code, s->close_reason, nl);
	return NEXT_STOP;
}

/* ---- queries ---- */

/* Appends "&name=<escaped value>" (no '&' first) to q; -1 when it is too long. */
static int q_add(char *q, size_t qsz, size_t *ql, const char *name, const char *value)
{
	char *e = malloc(qsz);
	if (e == NULL)
		return -1;
	int r = -1;
	if (client_query_escape(value, e, qsz) == 0 && *ql + strlen(name) + strlen(e) + 3 < qsz) {
		*ql += (size_t)snprintf(q + *ql, qsz - *ql, "%s%s=%s", *ql ? "&" : "", name, e);
		r = 0;
	}
	free(e);
	return r;
}

/* argv (default /bin/sh when n == 0), env, cwd and user as a query. */
static int command_query(struct opargs *oa, char **args, int n, char *q, size_t qsz, size_t *ql)
{
	for (int i = 0; i < n || i == 0; i++)
		if (q_add(q, qsz, ql, "argv", i < n ? args[i] : "/bin/sh") < 0)
			return -1;
	const char *key;
	json_t *val;
	json_object_foreach(oa->env, key, val)
	{
		size_t kl = strlen(key) + strlen(json_string_value(val)) + 2;
		char *kv = malloc(kl);
		if (kv == NULL)
			return -1;
		snprintf(kv, kl, "%s=%s", key, json_string_value(val));
		int r = q_add(q, qsz, ql, "env", kv);
		free(kv);
		if (r < 0)
			return -1;
	}
	if (oa->cwd != NULL && q_add(q, qsz, ql, "cwd", oa->cwd) < 0)
		return -1;
	if (oa->user != NULL && q_add(q, qsz, ql, "user", oa->user) < 0)
		return -1;
	return 0;
}

/* The command's exit status as spacectl's. */
static int exit_status(const struct session *s)
{
	if (s->exit_signal > 0) {
		long t = s->oa->timeout_s;
		/* the worker kills at the deadline with SIGKILL; it started
		 * counting after spacectl did, so a timed-out command always
		 * shows at least this much time here */
		if (t > 0 && s->exit_signal == SIGKILL && spaced_mono_ns() - s->started_ns >= (uint64_t)t * 1000000000u) {
			fprintf(stderr, "spacectl: exec: timed out after %ld s%s", t, s->nl);
			return 124;
		}
		return 128 + (s->exit_signal & 127);
	}
	return s->exit_code & 255;
}

/* ---- exec ---- */

int cmd_exec(int argc, char **argv)
{
	struct opargs oa;
	char *ops[4096], err[512];
	int rc = 2, first = ops_parse(argc, argv, &oa);
	int n = first < 0 ? -1 : ops_parse_rest(argc, argv, &oa, first, ops, 4096);
	char *q = NULL;
	struct client_route rt;
	memset(&rt, 0, sizeof rt);
	if (n < 2) {
		rc = cli_usage(ops_usage);
		goto out;
	}
	const char *sbx = ops[0];
	size_t qsz = TARGET_MAX + 1024, ql = 0;
	if ((q = malloc(qsz)) == NULL) {
		rc = cli_fail("exec", "out of memory");
		goto out;
	}
	ql = (size_t)snprintf(q, qsz, "/v1/sandboxes/%s/exec?", sbx);
	size_t qstart = ql;
	char tmo[32] = "";
	if (oa.timeout_s > 0)
		snprintf(tmo, sizeof tmo, "%lld", (long long)oa.timeout_s * 1000);
	ql = 0;
	if (command_query(&oa, ops + 1, n - 1, q + qstart, qsz - qstart, &ql) < 0 ||
	    (tmo[0] && q_add(q + qstart, qsz - qstart, &ql, "timeout_ms", tmo) < 0) || qstart + ql > TARGET_MAX) {
		rc = cli_fail("exec", "the command line is too long for a streamed exec (at most %d bytes, encoded); "
		              "pass a long script on standard input instead: spacectl exec ID -- sh -s < SCRIPT", TARGET_MAX);
		goto out;
	}
	if (client_route_get(&oa.o, sbx, &rt, err, sizeof err) < 0) {
		rc = cli_fail("exec", "%s", err);
		goto out;
	}
	static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
	signal(SIGPIPE, SIG_IGN);
	if (signals_catch(sigs, sizeof sigs / sizeof sigs[0]) < 0) {
		rc = cli_fail("exec", "cannot catch signals: %s", strerror(errno));
		goto out;
	}
	struct session s;
	memset(&s, 0, sizeof s);
	s.kind = K_EXEC;
	s.target = q;
	s.nl = "\n";
	s.oa = &oa;
	/* standard input goes to the command, unless told otherwise or it is a
	 * terminal this process is in the background of (reading it would stop us) */
	s.pass_stdin = !oa.no_stdin;
	if (s.pass_stdin && isatty(STDIN_FILENO) && tcgetpgrp(STDIN_FILENO) != getpgrp())
		s.pass_stdin = 0;
	s.stdin_eof = !s.pass_stdin;
	struct recover st = {0, 0};
	fflush(stdout);
	for (;;) {
		s.rt = &rt;
		session_run(&s);
		if (s.exited) {
			rc = exit_status(&s);
			break;
		}
		if (s.stopped) {
			if (s.allowed)
				fprintf(stderr, "spacectl: exec: signal %d caught three times: the stream is closed "
				        "(the worker ends the command)%s", s.stopped, s.nl);
			rc = 128 + (s.stopped & 127);
			break;
		}
		if (stream_recover(&s, sbx, &rt, &st, &rc) == NEXT_STOP)
			break;
	}
out:
	client_route_clear(&rt);
	free(q);
	json_decref(oa.env);
	return rc;
}

/* ---- term ---- */

int cmd_term(int argc, char **argv)
{
	struct opargs oa;
	char *ops[256], err[512];
	char q[TARGET_MAX + 1024];
	int first = ops_parse(argc, argv, &oa), rc = 1;
	int n = first < 0 ? -1 : ops_parse_rest(argc, argv, &oa, first, ops, 256);
	static const char usage[] =
		"usage: spacectl term ID [--env K=V]... [--cwd DIR] [--route FILE] [--no-retry] [-- CMD [ARG...]]\n";
	if (n < 1) {
		json_decref(oa.env);
		return cli_usage(usage);
	}
	const char *sbx = ops[0];
	int rows, cols;
	term_size(&rows, &cols);
	size_t qstart = (size_t)snprintf(q, sizeof q, "/v1/sandboxes/%s/term?", sbx), ql = 0;
	char *qq = q + qstart, sz[16];
	size_t qqsz = sizeof q - qstart;
	if (command_query(&oa, ops + 1, n - 1, qq, qqsz, &ql) < 0)
		goto usage;
	if (json_object_get(oa.env, "TERM") == NULL && getenv("TERM") != NULL) {
		char kv[512];
		snprintf(kv, sizeof kv, "TERM=%s", getenv("TERM"));
		(void)q_add(qq, qqsz, &ql, "env", kv);
	}
	snprintf(sz, sizeof sz, "%d", rows);
	if (q_add(qq, qqsz, &ql, "rows", sz) < 0)
		goto usage;
	snprintf(sz, sizeof sz, "%d", cols);
	if (q_add(qq, qqsz, &ql, "cols", sz) < 0 || qstart + ql > TARGET_MAX)
		goto usage;
	struct client_route rt;
	if (client_route_get(&oa.o, sbx, &rt, err, sizeof err) < 0) {
		json_decref(oa.env);
		return cli_fail("term", "%s", err);
	}
	struct termios saved;
	int raw = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved) == 0;
	if (raw) {
		struct termios r = saved;
		cfmakeraw(&r);
		tcsetattr(STDIN_FILENO, TCSANOW, &r);
	}
	/* raw mode: ^C is a byte for the sandbox's terminal, not a signal here */
	static const int sigs_raw[] = {SIGTERM, SIGHUP, SIGWINCH};
	static const int sigs_cooked[] = {SIGINT, SIGTERM, SIGHUP, SIGWINCH};
	signal(SIGPIPE, SIG_IGN);
	if (raw)
		signal(SIGINT, SIG_IGN); /* a SIGINT from elsewhere must not leave the terminal raw */
	if ((raw ? signals_catch(sigs_raw, 3) : signals_catch(sigs_cooked, 4)) < 0) {
		if (raw)
			tcsetattr(STDIN_FILENO, TCSANOW, &saved);
		client_route_clear(&rt);
		json_decref(oa.env);
		return cli_fail("term", "cannot catch signals: %s", strerror(errno));
	}
	struct session s;
	memset(&s, 0, sizeof s);
	s.kind = K_TERM;
	s.target = q;
	s.raw = raw;
	s.nl = raw ? "\r\n" : "\n";
	s.oa = &oa;
	s.pass_stdin = 1;
	struct recover st = {0, 0};
	for (;;) {
		s.rt = &rt;
		session_run(&s);
		if (s.exited) {
			rc = s.exit_signal > 0 ? 128 + (s.exit_signal & 127) : s.exit_code & 255;
			break;
		}
		if (s.stopped) {
			rc = 130;
			break;
		}
		if (stream_recover(&s, sbx, &rt, &st, &rc) == NEXT_STOP)
			break;
	}
	if (raw)
		tcsetattr(STDIN_FILENO, TCSANOW, &saved);
	client_route_clear(&rt);
	json_decref(oa.env);
	return rc;
usage:
	json_decref(oa.env);
	return cli_usage(usage);
}

/* ---- watch ---- */

int cmd_watch(int argc, char **argv)
{
	struct opargs oa;
	char *ops[4], err[512], q[TARGET_MAX + 1024];
	int first = ops_parse(argc, argv, &oa), rc = 1;
	int n = first < 0 ? -1 : ops_parse_rest(argc, argv, &oa, first, ops, 4);
	json_decref(oa.env);
	oa.env = NULL;
	size_t ql = 0;
	int qstart = n == 2 ? snprintf(q, sizeof q, "/v1/sandboxes/%s/watch?", ops[0]) : 0;
	if (n != 2 || q_add(q + qstart, sizeof q - (size_t)qstart, &ql, "path", ops[1]) < 0 ||
	    (size_t)qstart + ql > TARGET_MAX)
		return cli_usage(ops_usage);
	const char *sbx = ops[0];
	struct client_route rt;
	if (client_route_get(&oa.o, sbx, &rt, err, sizeof err) < 0)
		return cli_fail("watch", "%s", err);
	static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
	signal(SIGPIPE, SIG_IGN);
	if (signals_catch(sigs, 3) < 0) {
		client_route_clear(&rt);
		return cli_fail("watch", "cannot catch signals: %s", strerror(errno));
	}
	struct session s;
	memset(&s, 0, sizeof s);
	s.kind = K_WATCH;
	s.target = q;
	s.nl = "\n";
	s.path = ops[1];
	s.oa = &oa;
	s.stdin_eof = 1;
	struct recover st = {0, 0};
	for (;;) {
		s.rt = &rt;
		session_run(&s);
		if (s.stopped) {
			rc = 0;
			break;
		}
		if (stream_recover(&s, sbx, &rt, &st, &rc) == NEXT_STOP)
			break;
	}
	client_route_clear(&rt);
	return rc;
}
