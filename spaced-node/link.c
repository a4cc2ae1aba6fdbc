/*
 * link.c — the worker's link to the control plane (node.h: the link role).
 *
 * A worker speaks for itself with its worker key, kept in STATE/worker.key
 * (mode 0600, never on a command line). Without one it joins once: it
 * presents the single-use join token it was started with, bound by the
 * control plane to this worker ID, and receives its key. Then it registers
 * its node-api address (only the holder of the worker key can change it) and
 * holds the control channel (docs/control-messages.md): a WebSocket client of
 * spaced-cp on one side, the gate's admin socket (one JSON object per line
 * each way) on the other. It sends hello with the worker's own last_seq (from
 * its `status`), hands every message to the gate unchanged, in order, and
 * returns the gate's acknowledgement line unchanged; the gate applies each
 * seq at most once and answers repeats from its store. After each hello it
 * asks the gate for events: the executions that ended under their records
 * reach the control plane the same way, as `ended` lines.
 *
 * Joining and registering use libcurl; the channel uses libwebsockets, on its
 * own loop that keeps answering the control plane's pings while the gate works
 * (a thread of its own asks the gate). The link has no state but the key: when it dies, the supervisor starts it
 * again, and the control plane replays what it missed after the next hello.
 *
 * With --cp https://HOST:PORT both speak TLS (tls.h): the control plane's
 * certificate is verified against --tls-ca (else the system's trust store)
 * and must name HOST; the worker presents --tls-client-cert (mutual TLS:
 * the control plane wants its name to be this worker's ID). The channel is
 * then wss://. An http:// URL (only with --plaintext) speaks without TLS.
 */
#include "node.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>
#include <libwebsockets.h>
#include <sodium.h>

#include "spaced_error.h"
#include "log.h"
#include "tls.h"

#define LINE_MAX_BYTES (1u << 20)
#define KEY_MAX 128

struct out {
	struct out *next;
	char *text;
};

static const struct link_config *C;
static char key[KEY_MAX];
static char ws_host[128], ws_path[256];
static int ws_port;
static bool cp_tls;        /* --cp https:// */
static SSL_CTX *ws_tls;    /* the channel's TLS context (given to libwebsockets) */
static volatile sig_atomic_t stop;
static int admin_fd = -1;
static char abuf[LINE_MAX_BYTES];
static size_t alen;
static struct lws_context *ctx;
static struct lws *conn;
static struct out *q_head, *q_tail;
static struct spaced_buf rx;
static lws_sorted_usec_list_t sul;
static void tick_again(void);
static uint64_t next_connect, backoff_ns;

static void llog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void llog(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	spaced_vlog("link", fmt, ap);
	va_end(ap);
}

/* ---- the worker key ---- */

/* Reads STATE/worker.key into key. 1 when there is none, 0 when read, -1 when
 * it is unsafe (not a regular file of ours, readable by others) or malformed. */
static int key_load(void)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/worker.key", C->state_dir);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return errno == ENOENT ? 1 : -1;
	struct stat sb;
	char buf[KEY_MAX + 2];
	ssize_t n = -1;
	if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_uid == geteuid() && (sb.st_mode & 077) == 0)
		n = read(fd, buf, sizeof buf - 1);
	else
		llog("%s must be a regular file of uid %u with mode 0600; not used", path, (unsigned)geteuid());
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	buf[strcspn(buf, "\r\n")] = '\0';
	if (strncmp(buf, "spk_", 4) != 0 || strlen(buf) >= KEY_MAX)
		return -1;
	memcpy(key, buf, strlen(buf) + 1);
	sodium_memzero(buf, sizeof buf);
	return 0;
}

/* Writes k to STATE/worker.key (0600), durably: a temporary file, fsync,
 * rename, fsync of the directory. */
static int key_store(const char *k)
{
	char path[4200], tmp[4300];
	snprintf(path, sizeof path, "%s/worker.key", C->state_dir);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	unlink(tmp);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -1;
	size_t n = strlen(k);
	bool ok = write(fd, k, n) == (ssize_t)n && write(fd, "\n", 1) == 1 && fsync(fd) == 0;
	ok = close(fd) == 0 && ok;
	if (!ok || rename(tmp, path) < 0) {
		unlink(tmp);
		return -1;
	}
	int dfd = open(C->state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		fsync(dfd);
		close(dfd);
	}
	return 0;
}

/* ---- the gate's admin socket ---- */

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
	if (strlen(C->admin_path) >= sizeof sa.sun_path)
		return -1;
	memcpy(sa.sun_path, C->admin_path, strlen(C->admin_path));
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

/* One request line to the gate, one answer line back (a new string). */
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

/* The gate's status result (a new reference), or NULL. */
static json_t *gate_status(void)
{
	json_error_t jerr;
	char *ans = admin_ask("{\"type\":\"status\"}", 17);
	json_t *a = ans ? json_loads(ans, JSON_REJECT_DUPLICATES, &jerr) : NULL;
	free(ans);
	json_t *r = json_incref(json_object_get(a, "result"));
	json_decref(a);
	return json_is_object(r) ? r : (json_decref(r), NULL);
}

/* ---- joining and registering (HTTP) ---- */

static size_t collect(char *p, size_t size, size_t n, void *u)
{
	struct spaced_buf *b = u;
	return spaced_buf_append(b, p, size * n) == 0 ? size * n : 0;
}

/* POSTs body to the control plane's path with bearer; *status receives the
 * HTTP status and *answer the parsed JSON answer (or NULL). -1 when the
 * control plane could not be reached. */
static int cp_post(const char *path, const char *bearer, const char *body, long *status, json_t **answer)
{
	char url[1024], auth[KEY_MAX + 32], cerr[CURL_ERROR_SIZE] = "";
	struct spaced_buf b;
	spaced_buf_init(&b, 1u << 20);
	snprintf(url, sizeof url, "%s%s", C->cp_url, path);
	snprintf(auth, sizeof auth, "Authorization: Bearer %s", bearer);
	CURL *h = curl_easy_init();
	struct curl_slist *hd = curl_slist_append(NULL, auth);
	hd = curl_slist_append(hd, "Content-Type: application/json");
	int rc = -1;
	*answer = NULL;
	if (h && hd) {
		curl_easy_setopt(h, CURLOPT_URL, url);
		curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
		curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
		curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 15000L);
		curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
		curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, cp_tls ? "https" : "http");
		curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
		if (cp_tls) {
			/* verification stays on (libcurl's default): chain and name */
			curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
			curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
			curl_easy_setopt(h, CURLOPT_SSLVERSION, (long)CURL_SSLVERSION_TLSv1_2);
			if (C->tls_ca)
				curl_easy_setopt(h, CURLOPT_CAINFO, C->tls_ca);
			if (C->tls_client_cert) {
				curl_easy_setopt(h, CURLOPT_SSLCERT, C->tls_client_cert);
				curl_easy_setopt(h, CURLOPT_SSLKEY, C->tls_client_key);
			}
		}
		CURLcode cr = curl_easy_perform(h);
		if (cr != CURLE_OK)
			llog("%s%s: %s", C->cp_url, path, cerr[0] ? cerr : curl_easy_strerror(cr));
		if (cr == CURLE_OK) {
			curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
			json_error_t jerr;
			*answer = b.len ? json_loadb((const char *)b.data, b.len, JSON_REJECT_DUPLICATES, &jerr) : NULL;
			rc = 0;
		}
	}
	curl_slist_free_all(hd);
	if (h)
		curl_easy_cleanup(h);
	sodium_memzero(auth, sizeof auth);
	spaced_buf_free(&b);
	return rc;
}

/* The registration document: ID, node-api URL, capacity, the substrates and
 * limits the gate reports. */
static char *registration(const char *url)
{
	json_t *st = NULL;
	for (int t = 0; t < 600 && !stop && !(st = gate_status()); t++)
		usleep(50000);
	json_t *subs = json_object_get(st, "substrates");
	subs = json_is_array(subs) ? json_incref(subs) : json_pack("[s]", "process");
	json_t *doc = json_pack("{s:s,s:s,s:I,s:o}", "id", C->worker_id, "url", url, "capacity",
	                        (json_int_t)C->capacity, "substrates", subs);
	json_t *lim = json_object_get(st, "limits");
	if (doc && json_is_object(lim))
		json_object_set(doc, "limits", lim);
	char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
	json_decref(doc);
	json_decref(st);
	return text;
}

static const char *answer_error(json_t *a)
{
	const char *m = json_string_value(json_object_get(json_object_get(a, "error"), "message"));
	if (!m)
		m = json_string_value(json_object_get(a, "message"));
	return m ? m : "";
}

/* The node-api URL to register: --advertise, or http://LISTEN_HOST:PORT
 * with the port node-api bound (STATE/api.port). */
static int node_url(char *out, size_t n)
{
	if (C->advertise) {
		snprintf(out, n, "%s", C->advertise);
		return 0;
	}
	char path[4200];
	snprintf(path, sizeof path, "%s/api.port", C->state_dir);
	for (int t = 0; t < 600 && !stop; t++) {
		FILE *f = fopen(path, "r");
		int port = 0;
		if (f) {
			if (fscanf(f, "%d", &port) != 1)
				port = 0;
			fclose(f);
		}
		if (port > 0 && port < 65536) {
			bool v6 = strchr(C->listen_host, ':') != NULL;
			snprintf(out, n, v6 ? "%s://[%s]:%d" : "%s://%s:%d", C->api_tls ? "https" : "http", C->listen_host,
			         port);
			return 0;
		}
		usleep(50000);
	}
	return -1;
}

/* Registers (with the worker key) or joins (with the join token) until the
 * control plane answers. Returns 0, or LINK_EXIT_FATAL when it refused and
 * nothing here can change that. */
static int join_or_register(void)
{
	char url[600];
	if (node_url(url, sizeof url) < 0) {
		llog("node-api did not write its port; cannot register");
		return 1;
	}
	char *doc = registration(url);
	if (!doc)
		return 1;
	uint64_t pause_ms = 200;
	int rc = 1;
	while (!stop) {
		long status = 0;
		json_t *a = NULL;
		bool joining = key[0] == '\0';
		if (joining && !C->join_token) {
			llog("not joined: no %s/worker.key and no join token (spaced-cp admin create-join-token %s)",
			     C->state_dir, C->worker_id);
			rc = LINK_EXIT_FATAL;
			break;
		}
		int e = joining ? cp_post("/v1/workers/join", C->join_token, doc, &status, &a)
		                : cp_post("/v1/workers", key, doc, &status, &a);
		if (e == 0 && status == 200) {
			const char *k = json_string_value(json_object_get(a, "worker_key"));
			if (joining && (!k || strlen(k) >= KEY_MAX || strncmp(k, "spk_", 4) != 0 || key_store(k) < 0)) {
				llog("joined, but the worker key could not be kept in %s: %s", C->state_dir, strerror(errno));
				json_decref(a);
				rc = LINK_EXIT_FATAL;
				break;
			}
			if (joining) {
				memcpy(key, k, strlen(k) + 1);
				llog("joined %s; the worker key is in %s/worker.key", C->cp_url, C->state_dir);
			}
			llog("registered at %s as %s", C->cp_url, url);
			json_decref(a);
			rc = 0;
			break;
		}
		if (e == 0 && (status == 401 || status == 403)) {
			if (!joining && C->join_token) {
				llog("the worker key was refused (%ld %s); joining again with the join token", status,
				     answer_error(a));
				sodium_memzero(key, sizeof key);
				json_decref(a);
				continue;
			}
			llog("%s refused (%ld %s)", joining ? "joining was" : "the worker key was", status, answer_error(a));
			json_decref(a);
			rc = LINK_EXIT_FATAL;
			break;
		}
		if (e == 0 && status >= 400 && status < 500 && status != 408 && status != 429) {
			llog("the control plane refused the registration (%ld %s)", status, answer_error(a));
			json_decref(a);
			rc = LINK_EXIT_FATAL;
			break;
		}
		json_decref(a);
		llog("the control plane is not reachable (%s); trying again in %llu ms",
		     e < 0 ? "no answer" : "busy", (unsigned long long)pause_ms);
		usleep((useconds_t)pause_ms * 1000);
		pause_ms = pause_ms * 2 > 5000 ? 5000 : pause_ms * 2;
	}
	free(doc);
	return rc;
}

/* ---- the channel (WebSocket) ---- */

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

/* hello with the worker's durable last_seq and its limits (a new string),
 * or NULL when the gate does not answer */
static char *hello_text(void)
{
	json_t *st = gate_status();
	json_t *ls = json_object_get(st, "last_seq");
	if (!json_is_integer(ls)) {
		llog("no status from %s", C->admin_path);
		json_decref(st);
		return NULL;
	}
	json_t *h = json_pack("{s:{s:s,s:I}}", "hello", "worker", C->worker_id, "last_seq", json_integer_value(ls));
	json_t *lim = json_object_get(st, "limits");
	if (h != NULL && json_is_object(lim))
		json_object_set(json_object_get(h, "hello"), "limits", lim);
	/* always there, empty or not: the control plane then sends this worker
	 * installs tentative (docs/control-messages.md "Tentative installs") */
	json_t *tent = json_object_get(st, "tentative");
	if (h != NULL && json_is_array(tent))
		json_object_set(json_object_get(h, "hello"), "tentative", tent);
	if (h != NULL) /* when the control plane may count this worker as fenced */
		json_object_set_new(json_object_get(h, "hello"), "fence_after", json_integer(C->fence_after_s));
	char *text = h ? json_dumps(h, JSON_COMPACT) : NULL;
	json_decref(h);
	json_decref(st);
	return text;
}

/* ---- the gate thread ----
 * The gate may take seconds over a control message (a snapshot, a start);
 * meanwhile the channel must keep answering the control plane's pings, or
 * it is declared dead. So the gate is given messages from a thread of its own,
 * in the order they came; each answer is posted back to the channel's loop
 * (lws_cancel_service). Messages and answers carry the connection they belong
 * to: an answer for a connection that has ended is dropped (the control plane
 * replays unacknowledged messages on the next).
 * The hello is asked and answered (admin_ask). Messages go to the gate on a
 * connection of their own without waiting for each one's acknowledgement (a
 * pipeline): the gate applies the operations of different sandboxes side by
 * side and acknowledges each when it is done, in any order (the control plane
 * matches them by seq); a reader thread takes the acknowledgement lines. */

struct gate_item {
	struct gate_item *next;
	uint64_t conn;  /* the connection it belongs to */
	bool hello;     /* make the hello (no message) */
	int64_t synced; /* >= 0: the control plane's replay ended at this seq (no message) */
	char *text;     /* the message; then the answer, NULL when the gate failed */
	size_t len;
};

static pthread_mutex_t gmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gcv = PTHREAD_COND_INITIALIZER;
static struct gate_item *gin_head, *gin_tail, *gdone_head, *gdone_tail;
static uint64_t conn_no;   /* the current connection's number (changed by the channel loop, read atomically) */
/* the fence's lease (gate_fence.c): the connection whose replay is with the
 * gate and its last seq (set by the gate thread), and when the last ping the
 * control plane answered on it was sent (set by the channel loop) */
static uint64_t synced_conn;
static int64_t synced_through = -1;
static uint64_t contact_ns;
/* the link's own pings on a synced connection (channel loop only): one out
 * at a time, a second apart; one not answered in 4 s ends the connection
 * (a peer cut off sends no close) */
#define LINK_PING_NS 1000000000ull
#define LINK_PING_DEAD_NS 4000000000ull
static bool ping_out, want_ping;
static uint64_t ping_sent_ns, ping_no; /* CLOCK_BOOTTIME (the gate's fence clock); the ping's number, its payload */

static uint64_t boottime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_BOOTTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static bool conn_failed;   /* channel loop only: the gate failed on this connection */

static void gitem_push(struct gate_item **head, struct gate_item **tail, struct gate_item *it)
{
	it->next = NULL;
	if (*tail)
		(*tail)->next = it;
	else
		*head = it;
	*tail = it;
}

static void gitems_free(struct gate_item *it)
{
	while (it) {
		struct gate_item *n = it->next;
		free(it->text);
		free(it);
		it = n;
	}
}

/* Queues a message (or the hello, or the end of the replay: synced >= 0)
 * for the gate (channel loop). */
static int gate_queue(bool hello, int64_t synced, const uint8_t *p, size_t n)
{
	bool marker = hello || synced >= 0;
	struct gate_item *it = calloc(1, sizeof *it);
	if (!it || (!marker && !(it->text = malloc(n + 1)))) {
		free(it);
		return -1;
	}
	it->hello = hello;
	it->synced = synced;
	it->conn = conn_no;
	if (!marker) {
		memcpy(it->text, p, n);
		it->text[n] = '\0';
		it->len = n;
	}
	pthread_mutex_lock(&gmu);
	gitem_push(&gin_head, &gin_tail, it);
	pthread_cond_signal(&gcv);
	pthread_mutex_unlock(&gmu);
	return 0;
}

/* the pipelined connection: written by the gate thread only, read by its reader */
static int pipe_fd = -1;
static volatile int pipe_broken;

static void gate_done(struct gate_item *it)
{
	pthread_mutex_lock(&gmu);
	gitem_push(&gdone_head, &gdone_tail, it);
	pthread_mutex_unlock(&gmu);
	lws_cancel_service(ctx);
}

/* Acknowledgement lines from the gate, posted to the channel as answers of
 * the connection current when they come; at the end of the connection, a
 * failure of that channel connection (it is dropped and replayed). */
static void *pipe_reader(void *arg)
{
	int fd = (int)(intptr_t)arg;
	static char buf[LINE_MAX_BYTES];
	size_t len = 0;
	for (;;) {
		char *nl = memchr(buf, '\n', len);
		if (nl) {
			size_t n = (size_t)(nl - buf);
			struct gate_item *it = calloc(1, sizeof *it);
			if (it && (it->text = strndup(buf, n)) != NULL) {
				it->conn = __atomic_load_n(&conn_no, __ATOMIC_ACQUIRE);
				gate_done(it);
			} else {
				free(it);
			}
			memmove(buf, nl + 1, len - n - 1);
			len -= n + 1;
			continue;
		}
		if (len == sizeof buf)
			break;
		ssize_t got = recv(fd, buf + len, sizeof buf - len, 0);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			break;
		len += (size_t)got;
	}
	pipe_broken = 1;
	struct gate_item *it = calloc(1, sizeof *it);
	if (it) {
		it->conn = __atomic_load_n(&conn_no, __ATOMIC_ACQUIRE); /* text NULL: failed */
		gate_done(it);
	}
	return NULL;
}

/* Sends one message line to the gate on the pipelined connection (opened,
 * with its reader, when missing or broken). 0 or -1. Gate thread only. */
static int pipe_send(const char *msg, size_t len)
{
	if (pipe_fd >= 0 && pipe_broken) {
		close(pipe_fd); /* its reader has stopped */
		pipe_fd = -1;
	}
	if (pipe_fd < 0) {
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		if (strlen(C->admin_path) >= sizeof sa.sun_path)
			return -1;
		memcpy(sa.sun_path, C->admin_path, strlen(C->admin_path));
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
			if (fd >= 0)
				close(fd);
			return -1;
		}
		pthread_t t;
		pipe_broken = 0;
		if (pthread_create(&t, NULL, pipe_reader, (void *)(intptr_t)fd) != 0) {
			close(fd);
			return -1;
		}
		pthread_detach(t);
		pipe_fd = fd;
	}
	struct iovec iov[2] = {{(void *)(uintptr_t)msg, len}, {(void *)(uintptr_t)"\n", 1}};
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
	if (pipe_broken || sendmsg(pipe_fd, &mh, MSG_NOSIGNAL) != (ssize_t)(len + 1)) {
		shutdown(pipe_fd, SHUT_RDWR); /* its reader sees the end and stops */
		pipe_broken = 1;
		return -1;
	}
	return 0;
}

static void *gate_thread(void *arg)
{
	(void)arg;
	for (;;) {
		pthread_mutex_lock(&gmu);
		while (!gin_head)
			pthread_cond_wait(&gcv, &gmu);
		struct gate_item *it = gin_head;
		gin_head = it->next;
		if (!gin_head)
			gin_tail = NULL;
		pthread_mutex_unlock(&gmu);
		if (it->synced >= 0) {
			/* every message before it is with the gate: the lease
			 * thread may ask it to lift its fence once they are applied */
			__atomic_store_n(&synced_through, it->synced, __ATOMIC_RELEASE);
			__atomic_store_n(&synced_conn, it->conn, __ATOMIC_RELEASE);
			free(it);
		} else if (it->hello) {
			/* the hello, then the executions that ended under their
			 * records (the gate sends one line each, now and as more
			 * end; those lines go to the control plane as they come) */
			static const char events[] = "{\"type\":\"events\"}";
			uint64_t c = it->conn;
			it->text = hello_text();
			gate_done(it);
			if (pipe_send(events, sizeof events - 1) < 0) {
				struct gate_item *f = calloc(1, sizeof *f);
				if (f) {
					f->conn = c; /* text NULL: this connection failed */
					gate_done(f);
				}
			}
		} else if (pipe_send(it->text, it->len) < 0) {
			free(it->text);
			it->text = NULL; /* failed: the channel connection is dropped */
			gate_done(it);
		} else {
			free(it->text); /* its acknowledgement comes through pipe_reader */
			free(it);
		}
	}
	return NULL;
}

/* ---- the fence's lease (gate_fence.c) ----
 * A thread of its own, on an admin connection of its own: the gate may be
 * slow over the messages of the pipeline (a start of 60,000 files), and a
 * lease must not wait behind them. Every 250 ms: once a connection's replay
 * is with the gate, {"type":"unfence","through":N} (again while the gate
 * answers that it is fenced); and at most every second, while a ping was
 * answered since the last one, {"type":"lease","since_ns":T} — T when that
 * ping was sent (CLOCK_BOOTTIME, the gate's clock too), never when its answer
 * came, so the gate's lease never outlasts what the control plane saw
 * (docs/control-messages.md, "Fence"). */
static int lease_fd = -1;

/* One line to the gate on the lease connection and its answer line read;
 * 0, 1 when the answer says the gate is fenced, or -1 (the connection is
 * closed, opened again next time). */
static int lease_ask(const char *line)
{
	if (lease_fd < 0) {
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		if (strlen(C->admin_path) >= sizeof sa.sun_path)
			return -1;
		memcpy(sa.sun_path, C->admin_path, strlen(C->admin_path));
		lease_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		struct timeval tv = {.tv_sec = 5};
		if (lease_fd < 0 || setsockopt(lease_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0 ||
		    connect(lease_fd, (struct sockaddr *)&sa, sizeof sa) < 0)
			goto fail;
	}
	size_t n = strlen(line);
	char ans[1024];
	size_t got = 0;
	if (send(lease_fd, line, n, MSG_NOSIGNAL) != (ssize_t)n)
		goto fail;
	while (got == 0 || memchr(ans, '\n', got) == NULL) {
		if (got == sizeof ans)
			got = 0; /* a long answer: only its end matters */
		ssize_t r = recv(lease_fd, ans + got, sizeof ans - got, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			goto fail;
		got += (size_t)r;
	}
	static const char fenced_true[] = "\"fenced\":true";
	return memmem(ans, got, fenced_true, sizeof fenced_true - 1) != NULL ? 1 : 0;
fail:
	if (lease_fd >= 0)
		close(lease_fd);
	lease_fd = -1;
	return -1;
}

static void *lease_thread(void *arg)
{
	(void)arg;
	uint64_t unfenced_conn = 0, leased_contact = 0, leased_at = 0;
	bool gate_fenced = false;
	char line[96];
	while (!stop) {
		usleep(250000);
		uint64_t c = __atomic_load_n(&synced_conn, __ATOMIC_ACQUIRE);
		if (c != 0 && c == __atomic_load_n(&conn_no, __ATOMIC_ACQUIRE) && (c != unfenced_conn || gate_fenced)) {
			snprintf(line, sizeof line, "{\"type\":\"unfence\",\"through\":%lld}\n",
			         (long long)__atomic_load_n(&synced_through, __ATOMIC_ACQUIRE));
			int a = lease_ask(line);
			if (a >= 0) {
				unfenced_conn = c;
				gate_fenced = a == 1;
			}
		}
		uint64_t contact = __atomic_load_n(&contact_ns, __ATOMIC_ACQUIRE), now = boottime_ns();
		if (contact == 0 || contact == leased_contact || now - leased_at < 1000000000ull)
			continue;
		snprintf(line, sizeof line, "{\"type\":\"lease\",\"since_ns\":%llu}\n", (unsigned long long)contact);
		int a = lease_ask(line);
		if (a >= 0) {
			leased_contact = contact;
			leased_at = now;
			gate_fenced = a == 1;
		}
	}
	return NULL;
}

/* The answers back from the gate, into the channel's output (channel loop). */
static void gate_answers(void)
{
	pthread_mutex_lock(&gmu);
	struct gate_item *it = gdone_head;
	gdone_head = gdone_tail = NULL;
	pthread_mutex_unlock(&gmu);
	while (it) {
		struct gate_item *n = it->next;
		if (conn && it->conn == conn_no) {
			if (it->text)
				enqueue(it->text);
			else
				conn_failed = true;
			it->text = NULL;
		}
		free(it->text);
		free(it);
		it = n;
	}
	if (conn)
		lws_callback_on_writable(conn);
}

/* A new or ended connection: what was queued for the old one is dropped. */
static void conn_changed(void)
{
	__atomic_add_fetch(&conn_no, 1, __ATOMIC_RELEASE);
	conn_failed = false;
	pthread_mutex_lock(&gmu);
	struct gate_item *it = gin_head;
	gin_head = gin_tail = NULL;
	pthread_mutex_unlock(&gmu);
	gitems_free(it);
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len)
{
	(void)user;
	switch (reason) {
	case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER: {
		unsigned char **p = in, *end = *p + len;
		char auth[KEY_MAX + 16];
		int n = snprintf(auth, sizeof auth, "Bearer %s", key);
		int r = lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_AUTHORIZATION, (unsigned char *)auth, n, p, end);
		sodium_memzero(auth, sizeof auth);
		return r ? -1 : 0;
	}
	case LWS_CALLBACK_CLIENT_ESTABLISHED:
		queue_clear();
		conn_changed();
		spaced_buf_free(&rx);
		spaced_buf_init(&rx, LINE_MAX_BYTES);
		if (gate_queue(true, -1, NULL, 0) < 0) /* the hello goes first */
			return -1;
		backoff_ns = 0;
		tick_again(); /* its replay's way to the gate is watched from now */
		llog("channel open to %s", C->cp_url);
		return 0;
	case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
		gate_answers();
		return 0;
	case LWS_CALLBACK_CLIENT_RECEIVE: {
		if (spaced_buf_append(&rx, in, len) < 0) {
			/* the control plane queues none this large (CP_CHAN_MSG_MAX) */
			llog("a message from the control plane is larger than %u bytes; reconnecting", LINE_MAX_BYTES);
			return -1;
		}
		if (!lws_is_final_fragment(wsi))
			return 0;
		/* one message: to the gate as one line (JSON text has no raw newline) */
		if (memchr(rx.data, '\n', rx.len) != NULL)
			return -1;
		int qe;
		long long through = -1;
		char tail = 0;
		/* {"synced":N}: the replay after the hello is over (the fence's end) */
		char small[40];
		if (rx.len < sizeof small && rx.len > 11 && memcmp(rx.data, "{\"synced\":", 10) == 0) {
			memcpy(small, rx.data, rx.len);
			small[rx.len] = '\0';
		} else {
			small[0] = '\0';
		}
		if (small[0] && sscanf(small + 10, "%lld%c", &through, &tail) == 2 && tail == '}' && through >= 0)
			qe = gate_queue(false, through, NULL, 0);
		else
			qe = gate_queue(false, -1, rx.data, rx.len);
		spaced_buf_free(&rx);
		spaced_buf_init(&rx, LINE_MAX_BYTES);
		return qe;
	}
	case LWS_CALLBACK_CLIENT_RECEIVE_PONG:
		/* the answer to the ping out now, never a late one of an earlier ping */
		if (ping_out && len == sizeof ping_no && memcmp(in, &ping_no, sizeof ping_no) == 0) {
			ping_out = false;
			__atomic_store_n(&contact_ns, ping_sent_ns, __ATOMIC_RELEASE);
			tick_again(); /* the next ping's time, not the answer's deadline */
		}
		return 0;
	case LWS_CALLBACK_CLIENT_WRITEABLE: {
		if (conn_failed) {
			llog("the gate did not answer; reconnecting");
			return -1; /* the control plane replays what is unacknowledged after the next hello */
		}
		if (want_ping) {
			unsigned char pb[LWS_PRE + sizeof ping_no];
			want_ping = false;
			ping_no++;
			memcpy(pb + LWS_PRE, &ping_no, sizeof ping_no);
			ping_sent_ns = boottime_ns(); /* before it leaves: the lease never counts from later */
			if (lws_write(wsi, pb + LWS_PRE, sizeof ping_no, LWS_WRITE_PING) < (int)sizeof ping_no)
				return -1;
			ping_out = true;
			if (q_head)
				lws_callback_on_writable(wsi);
			return 0;
		}
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
		ping_out = want_ping = false;
		conn_changed();
		/* the next try after a pause that grows to 5 s while it keeps failing */
		backoff_ns = backoff_ns ? (backoff_ns * 2 > 5000000000ull ? 5000000000ull : backoff_ns * 2) : 250000000ull;
		next_connect = spaced_mono_ns() + backoff_ns;
		tick_again();
		return 0;
	default:
		return 0;
	}
}

static const struct lws_protocols protocols[] = {
	{"spaced-link", callback, 0, LINE_MAX_BYTES, 0, NULL, 0},
	{NULL, NULL, 0, 0, 0, NULL, 0},
};

/* How soon tick must run again (µs): at the next ping's time or the
 * answer's deadline on a leased connection, at the next try without one,
 * every 50 ms while a new connection's replay is on its way to the gate or
 * a ping waits to be written; a second at most. */
#define TICK_POLL_US (50 * LWS_US_PER_MS)
#define TICK_MAX_US (1000 * LWS_US_PER_MS)
static lws_usec_t tick_wait(void)
{
	uint64_t now, due;
	if (conn != NULL && C->fence_after_s > 0) {
		if (__atomic_load_n(&synced_conn, __ATOMIC_ACQUIRE) != conn_no || want_ping)
			return TICK_POLL_US;
		now = boottime_ns();
		due = ping_sent_ns + (ping_out ? LINK_PING_DEAD_NS : LINK_PING_NS) + 1000000ull;
	} else if (conn == NULL && !stop) {
		now = spaced_mono_ns();
		due = next_connect;
	} else {
		return TICK_MAX_US;
	}
	uint64_t us = due > now ? (due - now) / 1000u : 0;
	return us < 1000u ? 1000 : us > TICK_MAX_US ? TICK_MAX_US : (lws_usec_t)us;
}

static void tick(lws_sorted_usec_list_t *s);

/* tick at once when what it waits for moved earlier (an answered ping, a
 * connection that ended or began) */
static void tick_again(void)
{
	if (ctx != NULL)
		lws_sul_schedule(ctx, 0, &sul, tick, 1);
}

static void tick(lws_sorted_usec_list_t *s)
{
	/* the fence's lease: pings on a connection whose replay is with the gate */
	if (conn != NULL && C->fence_after_s > 0 && __atomic_load_n(&synced_conn, __ATOMIC_ACQUIRE) == conn_no) {
		uint64_t now = boottime_ns();
		if (ping_out && now - ping_sent_ns > LINK_PING_DEAD_NS) {
			llog("the control plane answered no ping for 4 s; reconnecting");
			ping_out = false;
			lws_set_timeout(conn, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_ASYNC);
		} else if (!ping_out && !want_ping && now - ping_sent_ns >= LINK_PING_NS) {
			want_ping = true;
			lws_callback_on_writable(conn);
		}
	}
	if (conn == NULL && !stop && spaced_mono_ns() >= next_connect) {
		struct lws_client_connect_info ci;
		memset(&ci, 0, sizeof ci);
		ci.context = ctx;
		ci.address = ws_host;
		ci.port = ws_port;
		ci.path = ws_path;
		ci.host = ws_host;
		ci.origin = ws_host;
		ci.pwsi = &conn;
		ci.ssl_connection = cp_tls ? LCCSCF_USE_SSL : 0; /* verified: chain and name, never relaxed */
		next_connect = spaced_mono_ns() + 1000000000ull; /* unless it ends sooner */
		lws_client_connect_via_info(&ci);
	}
	if (stop)
		lws_cancel_service(ctx);
	lws_sul_schedule(ctx, 0, s, tick, tick_wait());
}

static void on_term(int sig)
{
	(void)sig;
	stop = 1;
}

int link_run(const struct link_config *cfg)
{
	C = cfg;
	cp_tls = strncmp(cfg->cp_url, "https://", 8) == 0;
	size_t skip = cp_tls ? 8 : 7;
	if ((!cp_tls && strncmp(cfg->cp_url, "http://", 7) != 0) ||
	    sscanf(cfg->cp_url + skip, "%127[^:/]:%d", ws_host, &ws_port) != 2 || ws_port < 1 || ws_port > 65535) {
		llog("--cp wants https://HOST:PORT (http:// with --plaintext)");
		return LINK_EXIT_FATAL;
	}
	snprintf(ws_path, sizeof ws_path, "/v1/workers/%s/channel", cfg->worker_id);
	signal(SIGTERM, on_term);
	signal(SIGINT, on_term);
	signal(SIGPIPE, SIG_IGN);
	if (sodium_init() < 0 || curl_global_init(CURL_GLOBAL_DEFAULT) != 0)
		return 1;
	int k = key_load();
	if (k < 0) {
		llog("%s/worker.key is unusable", cfg->state_dir);
		return LINK_EXIT_FATAL;
	}
	int rc = join_or_register();
	if (rc != 0 || stop)
		return rc;
	spaced_buf_init(&rx, LINE_MAX_BYTES);
	struct lws_context_creation_info info;
	memset(&info, 0, sizeof info);
	info.port = CONTEXT_PORT_NO_LISTEN;
	info.protocols = protocols;
	if (cp_tls) {
		/* the channel's TLS is ours (tls.h), handed to libwebsockets: the
		 * CA, the client certificate, and the control plane's name bound
		 * on the context as well, whatever the library checks itself */
		char terr[600] = "the control plane's host is not a name or an address";
		if (spaced_tls_client_ctx(C->tls_ca, C->tls_client_cert, C->tls_client_key, &ws_tls, terr, sizeof terr) < 0 ||
		    spaced_tls_expect_host(SSL_CTX_get0_param(ws_tls), ws_host) < 0) {
			llog("the channel's TLS: %s", terr);
			return LINK_EXIT_FATAL;
		}
		info.options |= LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
		info.provided_client_ssl_ctx = ws_tls;
	}
	lws_set_log_level(LLL_ERR, NULL);
	ctx = lws_create_context(&info);
	if (ctx == NULL) {
		SSL_CTX_free(ws_tls);
		return 1;
	}
	lws_sul_schedule(ctx, 0, &sul, tick, 1);
	pthread_t gt;
	if (pthread_create(&gt, NULL, gate_thread, NULL) != 0)
		return 1;
	pthread_detach(gt); /* it may be waiting on the gate: the process ends with it */
	if (C->fence_after_s > 0) {
		pthread_t lt;
		if (pthread_create(&lt, NULL, lease_thread, NULL) != 0)
			return 1;
		pthread_detach(lt);
	}
	while (!stop)
		if (lws_service(ctx, 0) < 0)
			break;
	/* the gate thread may be inside the gate's socket: nothing it holds is
	 * released here, the process ends */
	queue_clear();
	spaced_buf_free(&rx);
	sodium_memzero(key, sizeof key);
	return 0;
}
