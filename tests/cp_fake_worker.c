/*
 * cp-fake-worker — a test peer that speaks the worker side of the control
 * channel (docs/control-messages.md) for real: a libwebsockets client on a
 * real socket. It sends hello with its durable last_seq, applies messages in
 * seq order at most once (the applied seq is fsync'd to --state before the ack),
 * acks again without effect anything it already applied, and writes every
 * message it received to --log (one JSON line each, its members preceded by
 * "t_ns", the wall-clock receive time in ns; re-sent ones as {"dup":true,"t_ns":…,"msg":…}). spaced-node's channel client replaces it in production.
 *
 *   cp-fake-worker --url ws://HOST:PORT --worker ID --key WORKER_KEY --state FILE --log FILE
 *                  [--delay-ms N [--delay-type TYPE]] [--refuse TYPE [--refuse-code C] [--refuse-count N]]
 *                  [--silent TYPE] [--exit-after N] [--say FILE] [--capacity N] [--tentative FILE]
 *                  [--ca FILE [--cert FILE --key-file FILE]]   (with --url wss://HOST:PORT)
 *
 * --refuse TYPE acks messages of that type with ok:false (code C, default
 * "refused"; only the first N of them with --refuse-count); --silent TYPE never
 * acks them, and once one came applies and acks nothing new after it (a worker
 * stuck on it; before, the next message was a gap it exited on, which could
 * close its channel before the control plane waited for it); --exit-after N exits (status 0) right after receiving the N-th new
 * message, before acking it; --delay-ms holds every ack back N ms (with
 * --delay-type, the acks of messages of that type only); --say FILE
 * sends each line of FILE as a text message right after every hello (the
 * worker's own reports, such as an execution that ended); --capacity N is the
 * number of sandboxes its hello offers (16 by default); --tentative FILE puts
 * the JSON array in FILE into every hello as its "tentative" installs (a
 * forged list, as a hostile worker would send: it applies none of them).
 * Exit status 3: a gap or reordering in seq was seen. With wss:// it speaks
 * TLS as spaced-node's link does (libspaced/tls.h: the control plane verified
 * against --ca, --cert/--key-file its client certificate).
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <libwebsockets.h>

#include "tls.h"
#include "util.h"

struct ack {
	struct ack *next;
	char *text;
	uint64_t due;
};

static const char *o_url, *o_worker, *o_key, *o_state, *o_log, *o_refuse, *o_silent, *o_say, *o_delay_type;
static const char *o_tentative;
static bool hung; /* a --silent message came: the worker is stuck on it */
static const char *o_refuse_code = "refused";
static long o_delay, o_exit_after = -1, o_refuse_count = -1, o_capacity = 16;
static long long last_seq;
static long received_new, epoch;
static struct ack *acks_head, *acks_tail;
static struct lws *conn;
static int hello_pending, stop, exit_code, connected;
static struct lws_context *ctx;
static lws_sorted_usec_list_t sul_tick;
static char host[128], path[256];
static int port;

static void state_save(void)
{
	char tmp[1024], buf[64];
	snprintf(tmp, sizeof tmp, "%s.tmp", o_state);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		return;
	int n = snprintf(buf, sizeof buf, "%lld %ld\n", last_seq, epoch);
	if (write(fd, buf, (size_t)n) != n || fsync(fd) < 0) {
		close(fd);
		return;
	}
	close(fd);
	rename(tmp, o_state);
}

static void state_load(void)
{
	FILE *f = fopen(o_state, "r");
	if (f == NULL)
		return;
	if (fscanf(f, "%lld %ld", &last_seq, &epoch) != 2)
		last_seq = 0;
	fclose(f);
}

static void log_line(const char *text, int dup)
{
	FILE *f = fopen(o_log, "a");
	if (f == NULL)
		return;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	unsigned long long ns = (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
	if (dup)
		fprintf(f, "{\"dup\":true,\"t_ns\":%llu,\"msg\":%s}\n", ns, text);
	else if (text[0] == '{' && text[1] != '}')
		fprintf(f, "{\"t_ns\":%llu,%s\n", ns, text + 1); /* receive time first, then the message's members */
	else
		fprintf(f, "%s\n", text);
	fflush(f);
	fsync(fileno(f));
	fclose(f);
}

/* Queues text (taken) to go out at due (monotonic ns). */
static void out_push(char *text, uint64_t due)
{
	struct ack *k = text ? calloc(1, sizeof *k) : NULL;
	if (k == NULL) {
		free(text);
		return;
	}
	k->text = text;
	k->due = due;
	if (acks_tail)
		acks_tail->next = k;
	else
		acks_head = k;
	acks_tail = k;
}

static void queue_ack(json_t *a, const char *type)
{
	bool held = o_delay_type == NULL || (type != NULL && strcmp(type, o_delay_type) == 0);
	out_push(json_dumps(a, JSON_COMPACT), spaced_mono_ns() + (held ? (uint64_t)o_delay * 1000000u : 0));
}

/* --say: every line of the file, queued to go out now (after the hello). */
static void queue_said(void)
{
	FILE *f = o_say ? fopen(o_say, "r") : NULL;
	char line[8192];
	while (f && fgets(line, sizeof line, f)) {
		line[strcspn(line, "\n")] = '\0';
		if (line[0])
			out_push(strdup(line), spaced_mono_ns());
	}
	if (f)
		fclose(f);
}

static void on_message(const char *text, size_t len)
{
	json_error_t jerr;
	json_t *m = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (m != NULL && json_object_get(m, "synced") != NULL) {
		json_decref(m); /* the replay is over (a fence's end: nothing to do here) */
		return;
	}
	if (m != NULL && json_is_string(json_object_get(m, "type")) &&
	    strcmp(json_string_value(json_object_get(m, "type")), "durable") == 0 &&
	    !json_object_get(m, "seq")) {
		json_decref(m); /* what it was sent tentative is durable: it keeps no notes of them */
		return;
	}
	if (m == NULL || !json_is_integer(json_object_get(m, "seq"))) {
		fprintf(stderr, "fake-worker: malformed message\n");
		json_decref(m);
		return;
	}
	long long seq = json_integer_value(json_object_get(m, "seq"));
	const char *type = json_string_value(json_object_get(m, "type"));
	if (type == NULL)
		type = "";
	char *copy = strndup(text, len);
	if (seq <= last_seq) {
		log_line(copy, 1);
		if (o_silent == NULL || strcmp(type, o_silent) != 0) {
			json_t *a = json_pack("{s:I,s:b,s:{}}", "ack", (json_int_t)seq, "ok", 1, "result");
			queue_ack(a, type);
			json_decref(a);
		}
		goto out;
	}
	if (hung) {
		/* a worker stuck on a --silent message applies nothing after it
		 * either (a real one applies in order): what comes is logged only */
		log_line(copy, 0);
		goto out;
	}
	if (seq != last_seq + 1) {
		fprintf(stderr, "fake-worker: seq gap: got %lld after %lld\n", seq, last_seq);
		exit_code = 3;
		stop = 1;
		goto out;
	}
	received_new++;
	if (o_exit_after >= 0 && received_new >= o_exit_after) {
		log_line(copy, 0);
		fprintf(stderr, "fake-worker: exiting after %ld messages, seq %lld not acked\n", received_new, seq);
		stop = 1;
		goto out;
	}
	log_line(copy, 0);
	if (o_silent != NULL && strcmp(type, o_silent) == 0) {
		hung = true; /* never applied, never acked, nor anything after it */
		goto out;
	}
	last_seq = seq;
	json_t *a;
	if (o_refuse != NULL && strcmp(type, o_refuse) == 0 && o_refuse_count != 0) {
		if (o_refuse_count > 0)
			o_refuse_count--;
		state_save();
		a = json_pack("{s:I,s:b,s:s,s:s}", "ack", (json_int_t)seq, "ok", 0, "error", "refused by test peer",
		              "code", o_refuse_code);
	} else if (strcmp(type, "install") == 0) {
		epoch++;
		state_save();
		a = json_pack("{s:I,s:b,s:{s:I}}", "ack", (json_int_t)seq, "ok", 1, "result", "epoch", (json_int_t)epoch);
	} else if (strcmp(type, "snapshot") == 0) {
		state_save();
		const char *p = json_string_value(json_object_get(m, "path"));
		if (!p)
			p = json_string_value(json_object_get(m, "url"));
		a = json_pack("{s:I,s:b,s:{s:s,s:I}}", "ack", (json_int_t)seq, "ok", 1, "result", "path", p ? p : "",
		              "bytes", (json_int_t)0);
	} else {
		state_save();
		a = json_pack("{s:I,s:b,s:{}}", "ack", (json_int_t)seq, "ok", 1, "result");
	}
	queue_ack(a, type);
	json_decref(a);
out:
	free(copy);
	json_decref(m);
}

static struct spaced_buf rx;

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len)
{
	switch (reason) {
	case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER: {
		unsigned char **p = in, *end = *p + len;
		char auth[256];
		int n = snprintf(auth, sizeof auth, "Bearer %s", o_key);
		if (lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_AUTHORIZATION, (unsigned char *)auth, n, p, end))
			return -1;
		return 0;
	}
	case LWS_CALLBACK_CLIENT_ESTABLISHED:
		connected = 1;
		hello_pending = 1;
		spaced_buf_free(&rx);
		spaced_buf_init(&rx, 1 << 20);
		/* acks queued for an older connection are dropped: the replay brings them back */
		while (acks_head) {
			struct ack *k = acks_head;
			acks_head = k->next;
			free(k->text);
			free(k);
		}
		acks_tail = NULL;
		lws_callback_on_writable(wsi);
		return 0;
	case LWS_CALLBACK_CLIENT_RECEIVE:
		if (spaced_buf_append(&rx, in, len) < 0)
			return -1;
		if (!lws_is_final_fragment(wsi))
			return 0;
		on_message((const char *)rx.data, rx.len);
		spaced_buf_free(&rx);
		spaced_buf_init(&rx, 1 << 20);
		if (stop)
			return -1;
		lws_callback_on_writable(wsi);
		return 0;
	case LWS_CALLBACK_CLIENT_WRITEABLE: {
		char *text = NULL;
		if (hello_pending) {
			json_t *h = json_pack("{s:{s:s,s:I,s:[s],s:i}}", "hello", "worker", o_worker, "last_seq",
			                      (json_int_t)last_seq, "substrates", "process", "capacity", (int)o_capacity);
			json_error_t terr;
			json_t *tl = o_tentative ? json_load_file(o_tentative, 0, &terr) : NULL;
			if (h && tl)
				json_object_set_new(json_object_get(h, "hello"), "tentative", tl);
			else
				json_decref(tl);
			text = json_dumps(h, JSON_COMPACT);
			json_decref(h);
			hello_pending = 0;
			queue_said();
		} else if (acks_head != NULL && acks_head->due <= spaced_mono_ns()) {
			struct ack *k = acks_head;
			acks_head = k->next;
			if (acks_head == NULL)
				acks_tail = NULL;
			text = k->text;
			free(k);
		}
		if (text == NULL)
			return 0;
		size_t n = strlen(text);
		unsigned char *buf = malloc(LWS_PRE + n);
		memcpy(buf + LWS_PRE, text, n);
		int w = lws_write(wsi, buf + LWS_PRE, n, LWS_WRITE_TEXT);
		free(buf);
		free(text);
		if (w < (int)n)
			return -1;
		if (acks_head)
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
	{"spaced-control-client", callback, 0, 1 << 20, 0, NULL, 0},
	{NULL, NULL, 0, 0, 0, NULL, 0},
};

static uint64_t next_connect;
static SSL_CTX *tls_ctx; /* wss:// */

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
		ci.protocol = NULL;
		ci.pwsi = &conn;
		ci.ssl_connection = tls_ctx ? LCCSCF_USE_SSL : 0;
		next_connect = spaced_mono_ns() + 200000000u;
		lws_client_connect_via_info(&ci);
	}
	if (conn != NULL && connected && acks_head != NULL)
		lws_callback_on_writable(conn);
	lws_sul_schedule(ctx, 0, s, tick, 20 * LWS_US_PER_MS);
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
	const char *o_ca = NULL, *o_cert = NULL, *o_keyf = NULL;
	for (int i = 1; i + 1 < argc; i += 2) {
		const char *k = argv[i], *v = argv[i + 1];
		if (!strcmp(k, "--url")) o_url = v;
		else if (!strcmp(k, "--worker")) o_worker = v;
		else if (!strcmp(k, "--key")) o_key = v;
		else if (!strcmp(k, "--state")) o_state = v;
		else if (!strcmp(k, "--log")) o_log = v;
		else if (!strcmp(k, "--refuse")) o_refuse = v;
		else if (!strcmp(k, "--silent")) o_silent = v;
		else if (!strcmp(k, "--delay-ms")) o_delay = atol(v);
		else if (!strcmp(k, "--delay-type")) o_delay_type = v;
		else if (!strcmp(k, "--exit-after")) o_exit_after = atol(v);
		else if (!strcmp(k, "--capacity")) o_capacity = atol(v);
		else if (!strcmp(k, "--say")) o_say = v;
		else if (!strcmp(k, "--tentative")) o_tentative = v;
		else if (!strcmp(k, "--refuse-code")) o_refuse_code = v;
		else if (!strcmp(k, "--refuse-count")) o_refuse_count = atol(v);
		else if (!strcmp(k, "--ca")) o_ca = v;
		else if (!strcmp(k, "--cert")) o_cert = v;
		else if (!strcmp(k, "--key-file")) o_keyf = v;
		else {
			fprintf(stderr, "fake-worker: unknown option %s\n", k);
			return 2;
		}
	}
	bool wss = o_url && strncmp(o_url, "wss://", 6) == 0;
	if (!o_url || !o_worker || !o_key || !o_state || !o_log || (!wss && strncmp(o_url, "ws://", 5) != 0) ||
	    sscanf(o_url + (wss ? 6 : 5), "%127[^:]:%d", host, &port) != 2) {
		fprintf(stderr, "usage: cp-fake-worker --url ws://HOST:PORT --worker ID --key K --state F --log F [...]\n");
		return 2;
	}
	if (wss) {
		char terr[600] = "the control plane's host is not a name or an address";
		if (spaced_tls_client_ctx(o_ca, o_cert, o_keyf, &tls_ctx, terr, sizeof terr) < 0 ||
		    spaced_tls_expect_host(SSL_CTX_get0_param(tls_ctx), host) < 0) {
			fprintf(stderr, "fake-worker: %s\n", terr);
			return 2;
		}
	}
	snprintf(path, sizeof path, "/v1/workers/%s/channel", o_worker);
	state_load();
	spaced_buf_init(&rx, 1 << 20);
	signal(SIGTERM, on_term);
	signal(SIGINT, on_term);
	/* a suite killed by a timeout (its EXIT trap does not run) takes its
	 * fake workers with it: none is left reconnecting to a gone control plane */
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	if (getppid() == 1)
		return 0;
	struct lws_context_creation_info info;
	memset(&info, 0, sizeof info);
	info.port = CONTEXT_PORT_NO_LISTEN;
	info.protocols = protocols;
	if (tls_ctx) {
		info.options |= LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
		info.provided_client_ssl_ctx = tls_ctx;
	}
	lws_set_log_level(LLL_ERR, NULL);
	ctx = lws_create_context(&info);
	if (ctx == NULL)
		return 1;
	lws_sul_schedule(ctx, 0, &sul_tick, tick, 1);
	while (!stop)
		if (lws_service(ctx, 0) < 0)
			break;
	lws_context_destroy(ctx);
	spaced_buf_free(&rx);
	return exit_code;
}
