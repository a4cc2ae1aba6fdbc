/*
 * spaced-cp-link — carries the control channel (docs/control-messages.md) to a
 * worker's local admin socket: a WebSocket client of spaced-cp on one side,
 * STATE/admin.sock of spaced-node (one JSON object per line each way) on the
 * other. It sends hello with the worker's own last_seq (from its `status`),
 * hands every message to the worker unchanged, in order, and returns the
 * worker's acknowledgement line unchanged. It holds no state of its own: the
 * worker applies each seq at most once and answers repeats from its store.
 * Used until spaced-node dials the control plane itself.
 *
 *   spaced-cp-link --cp ws://HOST:PORT --worker ID --key ENROLLMENT_KEY --admin STATE/admin.sock
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <jansson.h>
#include <libwebsockets.h>

#include "identity.h"
#include "util.h"

#define LINE_MAX_BYTES (1u << 20)

struct out {
	struct out *next;
	char *text;
};

static const char *o_cp, *o_worker, *o_key, *o_admin;
static char host[128], path[256];
static int port, stop, connected, admin_fd = -1;
static struct lws_context *ctx;
static struct lws *conn;
static struct out *q_head, *q_tail;
static struct spaced_buf rx;
static lws_sorted_usec_list_t sul;
static uint64_t next_connect;
static char abuf[LINE_MAX_BYTES];
static size_t alen;

static void admin_close(void)
{
	if (admin_fd >= 0)
		close(admin_fd);
	admin_fd = -1;
	alen = 0;
}

static int admin_open(void)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (admin_fd >= 0)
		return 0;
	if (strlen(o_admin) >= sizeof sa.sun_path)
		return -1;
	memcpy(sa.sun_path, o_admin, strlen(o_admin));
	admin_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (admin_fd < 0)
		return -1;
	struct timeval tv = {.tv_sec = 120};
	setsockopt(admin_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	if (connect(admin_fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		admin_close();
		return -1;
	}
	return 0;
}

/* One request line to the worker, one answer line back (a new string). */
static char *admin_ask(const char *msg, size_t len)
{
	if (admin_open() < 0)
		return NULL;
	if (send(admin_fd, msg, len, MSG_NOSIGNAL) != (ssize_t)len || send(admin_fd, "\n", 1, MSG_NOSIGNAL) != 1) {
		admin_close();
		return NULL;
	}
	for (;;) {
		char *nl = memchr(abuf, '\n', alen);
		if (nl != NULL) {
			size_t n = (size_t)(nl - abuf);
			char *line = strndup(abuf, n);
			memmove(abuf, nl + 1, alen - n - 1);
			alen -= n + 1;
			return line;
		}
		if (alen == sizeof abuf) {
			admin_close();
			return NULL;
		}
		ssize_t got = recv(admin_fd, abuf + alen, sizeof abuf - alen, 0);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0) {
			admin_close();
			return NULL;
		}
		alen += (size_t)got;
	}
}

static void enqueue(char *text)
{
	struct out *o = calloc(1, sizeof *o);
	if (o == NULL) {
		free(text);
		return;
	}
	o->text = text;
	if (q_tail)
		q_tail->next = o;
	else
		q_head = o;
	q_tail = o;
}

static void queue_clear(void)
{
	while (q_head) {
		struct out *o = q_head;
		q_head = o->next;
		free(o->text);
		free(o);
	}
	q_tail = NULL;
}

/* hello with the worker's durable last_seq */
static int send_hello(void)
{
	json_error_t jerr;
	char *ans = admin_ask("{\"type\":\"status\"}", 17);
	json_t *a = ans ? json_loads(ans, JSON_REJECT_DUPLICATES, &jerr) : NULL;
	free(ans);
	json_t *ls = json_object_get(json_object_get(a, "result"), "last_seq");
	if (!json_is_integer(ls)) {
		fprintf(stderr, "spaced-cp-link: no status from %s\n", o_admin);
		json_decref(a);
		return -1;
	}
	json_t *h = json_pack("{s:{s:s,s:I}}", "hello", "worker", o_worker, "last_seq", json_integer_value(ls));
	/* the worker's resource defaults and maxima, for placement */
	json_t *lim = json_object_get(json_object_get(a, "result"), "limits");
	if (h != NULL && json_is_object(lim))
		json_object_set(json_object_get(h, "hello"), "limits", lim);
	char *text = h ? json_dumps(h, JSON_COMPACT) : NULL;
	json_decref(h);
	json_decref(a);
	if (text == NULL)
		return -1;
	enqueue(text);
	return 0;
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len)
{
	switch (reason) {
	case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER: {
		unsigned char **p = in, *end = *p + len;
		char auth[256];
		int n = snprintf(auth, sizeof auth, "Bearer %s", o_key);
		return lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_AUTHORIZATION, (unsigned char *)auth, n, p, end) ? -1 : 0;
	}
	case LWS_CALLBACK_CLIENT_ESTABLISHED:
		connected = 1;
		queue_clear();
		spaced_buf_free(&rx);
		spaced_buf_init(&rx, LINE_MAX_BYTES);
		if (send_hello() < 0)
			return -1;
		lws_callback_on_writable(wsi);
		fprintf(stderr, "spaced-cp-link: %s connected to %s\n", o_worker, o_cp);
		return 0;
	case LWS_CALLBACK_CLIENT_RECEIVE: {
		if (spaced_buf_append(&rx, in, len) < 0)
			return -1;
		if (!lws_is_final_fragment(wsi))
			return 0;
		/* one message: to the worker as one line (JSON text has no raw newline) */
		if (memchr(rx.data, '\n', rx.len) != NULL)
			return -1;
		char *ack = admin_ask((const char *)rx.data, rx.len);
		spaced_buf_free(&rx);
		spaced_buf_init(&rx, LINE_MAX_BYTES);
		if (ack == NULL) {
			fprintf(stderr, "spaced-cp-link: the worker did not answer; reconnecting\n");
			return -1; /* the control plane replays it on the next hello */
		}
		enqueue(ack);
		lws_callback_on_writable(wsi);
		return 0;
	}
	case LWS_CALLBACK_CLIENT_WRITEABLE: {
		struct out *o = q_head;
		if (o == NULL)
			return 0;
		q_head = o->next;
		if (q_head == NULL)
			q_tail = NULL;
		size_t n = strlen(o->text);
		unsigned char *buf = malloc(LWS_PRE + n);
		int w = -1;
		if (buf != NULL) {
			memcpy(buf + LWS_PRE, o->text, n);
			w = lws_write(wsi, buf + LWS_PRE, n, LWS_WRITE_TEXT);
		}
		free(buf);
		free(o->text);
		free(o);
		if (w < (int)n)
			return -1;
		if (q_head)
			lws_callback_on_writable(wsi);
		return 0;
	}
	case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
	case LWS_CALLBACK_CLIENT_CLOSED:
		conn = NULL;
		connected = 0;
		return 0;
	default:
		return 0;
	}
}

static const struct lws_protocols protocols[] = {
	{"spaced-cp-link", callback, 0, LINE_MAX_BYTES, 0, NULL, 0},
	{NULL, NULL, 0, 0, 0, NULL, 0},
};

static void tick(lws_sorted_usec_list_t *s)
{
	if (conn == NULL && !stop && spaced_mono_ns() >= next_connect) {
		struct lws_client_connect_info ci;
		memset(&ci, 0, sizeof ci);
		ci.context = ctx;
		ci.address = host;
		ci.port = port;
		ci.path = path;
		ci.host = host;
		ci.origin = host;
		ci.pwsi = &conn;
		next_connect = spaced_mono_ns() + 500000000u;
		lws_client_connect_via_info(&ci);
	}
	lws_sul_schedule(ctx, 0, s, tick, 50 * LWS_US_PER_MS);
}

static void on_term(int sig)
{
	(void)sig;
	stop = 1;
	if (ctx)
		lws_cancel_service(ctx);
}

int main(int argc, char **argv)
{
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--cp")) o_cp = argv[i + 1];
		else if (!strcmp(argv[i], "--worker")) o_worker = argv[i + 1];
		else if (!strcmp(argv[i], "--key")) o_key = argv[i + 1];
		else if (!strcmp(argv[i], "--admin")) o_admin = argv[i + 1];
		else o_cp = NULL, i = argc;
	}
	if (!o_cp || !o_worker || !o_key || !o_admin || strncmp(o_cp, "ws://", 5) != 0 ||
	    sscanf(o_cp + 5, "%127[^:]:%d", host, &port) != 2 || !spaced_name_valid(o_worker, strlen(o_worker))) {
		fprintf(stderr, "usage: spaced-cp-link --cp ws://HOST:PORT --worker ID --key ENROLLMENT_KEY --admin STATE/admin.sock\n");
		return 2;
	}
	snprintf(path, sizeof path, "/v1/workers/%s/channel", o_worker);
	spaced_buf_init(&rx, LINE_MAX_BYTES);
	signal(SIGTERM, on_term);
	signal(SIGINT, on_term);
	signal(SIGPIPE, SIG_IGN);
	struct lws_context_creation_info info;
	memset(&info, 0, sizeof info);
	info.port = CONTEXT_PORT_NO_LISTEN;
	info.protocols = protocols;
	lws_set_log_level(LLL_ERR, NULL);
	ctx = lws_create_context(&info);
	if (ctx == NULL)
		return 1;
	lws_sul_schedule(ctx, 0, &sul, tick, 1);
	while (!stop)
		if (lws_service(ctx, 0) < 0)
			break;
	lws_context_destroy(ctx);
	queue_clear();
	spaced_buf_free(&rx);
	admin_close();
	return 0;
}
