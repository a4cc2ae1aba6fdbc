/*
 * test_node_util.h — helpers for the spaced-node tests: real spaced-node
 * processes on loopback, their admin sockets, a small HTTP/1.1 client and a
 * small WebSocket client over plain sockets, and capabilities signed here in
 * the test (the node never signs).
 */
#ifndef TEST_NODE_UTIL_H
#define TEST_NODE_UTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cap.h"
#include "spaced_error.h"
#include "identity.h"
#include "signer.h"
#include "util.h"

static void tn_sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/* ---- keys and capabilities ---- */

struct tn_keys {
	struct spaced_secret_key *sk, *other;
	char bundle_path[256];
};

static void tn_keys_init(struct tn_keys *k, const char *dir)
{
	struct spaced_public_key pk;
	char pub[SPACED_PASERK_PUBLIC_LEN + 1];
	if (spaced_secret_key_generate(&k->sk) < 0 || spaced_secret_key_generate(&k->other) < 0)
		abort();
	spaced_secret_key_public(k->sk, &pk);
	spaced_paserk_public_encode(&pk, pub);
	snprintf(k->bundle_path, sizeof k->bundle_path, "%s/bundle.json", dir);
	FILE *f = fopen(k->bundle_path, "w");
	if (!f)
		abort();
	fprintf(f, "{\"version\":1,\"keys\":[{\"key\":\"%s\",\"not_before\":\"2020-01-01T00:00:00Z\","
	           "\"not_after\":\"2099-01-01T00:00:00Z\"}]}",
	        pub);
	fclose(f);
}

struct tn_capspec {
	const char *sandbox;
	uint64_t generation;
	const char *worker;
	const char *substrate;  /* default "process" */
	const char *activation; /* default "act-1" */
	const char *pod_uid;
	uint32_t purposes;      /* default: all control purposes */
	bool serviceport;
	uint16_t port;
	const char *protocol;
	int64_t iat_off, exp_off; /* relative to now; 0/0: now, now+120 */
	int64_t nbf_off;
	bool other_key;
};

/* A capability token (static storage, overwritten by the next call). */
static char *tn_cap(const struct tn_keys *k, struct tn_capspec s)
{
	static char *last;
	struct spaced_cap cap;
	int64_t now = spaced_now();
	memset(&cap, 0, sizeof cap);
	if (spaced_identity_set(&cap.id, s.sandbox, s.generation, s.worker,
	                        s.substrate ? s.substrate : "process", s.activation ? s.activation : "act-1",
	                        s.pod_uid) < 0)
		abort();
	if (s.serviceport) {
		cap.cls = SPACED_CLASS_SERVICEPORT;
		cap.purposes = SPACED_PURPOSE_SERVICEPORT;
		cap.port = s.port;
		snprintf(cap.protocol, sizeof cap.protocol, "%s", s.protocol ? s.protocol : "tcp");
	} else {
		cap.cls = SPACED_CLASS_CONTROL;
		cap.purposes = s.purposes ? s.purposes
		                          : (SPACED_PURPOSE_FS_READ | SPACED_PURPOSE_FS_WRITE | SPACED_PURPOSE_EXEC |
		                             SPACED_PURPOSE_TERM | SPACED_PURPOSE_WATCH);
	}
	cap.iat = now + s.iat_off;
	cap.nbf = now + (s.nbf_off ? s.nbf_off : s.iat_off);
	cap.exp = s.exp_off ? now + s.exp_off : cap.iat + 120;
	static unsigned n;
	snprintf(cap.jti, sizeof cap.jti, "jti-%d-%u", (int)getpid(), ++n);
	free(last);
	last = NULL;
	if (spaced_cap_issue(s.other_key ? k->other : k->sk, &cap, &last) < 0)
		abort();
	return last;
}

/* ---- spaced-node processes ---- */

struct tn_node {
	bool substrate; /* set before start: executions through spaced-launch + spaced-host */
	int forget_after; /* set before start: --forget-after seconds (0: the default) */
	int acks_kept;    /* set before start: --acks-kept (0: the default) */
	int max_streams;  /* set before start: --max-streams (0: the default) */
	const char *guest_bin; /* set before start: --guest-bin (NULL: spaced-guest) */
	pid_t pid; /* sbx-manager (the process started) */
	int port;
	char state[256];
	char admin[300];
	char worker[64];
};

static void tn_node_start(struct tn_node *n, const char *dir, const char *worker, const char *bundle)
{
	snprintf(n->state, sizeof n->state, "%s/%s", dir, worker);
	snprintf(n->admin, sizeof n->admin, "%s/admin.sock", n->state);
	snprintf(n->worker, sizeof n->worker, "%s", worker);
	char port_file[320], log[320];
	snprintf(port_file, sizeof port_file, "%s/api.port", n->state);
	snprintf(log, sizeof log, "%s/%s.log", dir, worker);
	mkdir(n->state, 0700);
	unlink(port_file);
	pid_t pid = fork();
	if (pid < 0)
		abort();
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		char forget[16], acks[16], streams[16];
		snprintf(forget, sizeof forget, "%d", n->forget_after);
		snprintf(acks, sizeof acks, "%d", n->acks_kept);
		snprintf(streams, sizeof streams, "%d", n->max_streams);
		const char *argv[24] = {"spaced-node", "--state", n->state, "--worker-id", worker, "--listen",
		                        "127.0.0.1:0", "--keys", bundle, "--guest-bin", n->guest_bin ? n->guest_bin : SPACED_GUEST_BIN,
		                        "--plaintext"};
		int k = 12;
		if (n->substrate) {
			argv[k++] = "--launcher";
			argv[k++] = SPACED_LAUNCH_BIN;
			argv[k++] = "--host";
			argv[k++] = SPACED_HOST_BIN;
		}
		if (n->forget_after > 0) {
			argv[k++] = "--forget-after";
			argv[k++] = forget;
		}
		if (n->acks_kept > 0) {
			argv[k++] = "--acks-kept";
			argv[k++] = acks;
		}
		if (n->max_streams > 0) {
			argv[k++] = "--max-streams";
			argv[k++] = streams;
		}
		argv[k] = NULL;
		execv(SPACED_NODE_BIN, (char *const *)(uintptr_t)argv);
		_exit(127);
	}
	n->pid = pid;
	n->port = 0;
	for (int i = 0; i < 1000 && n->port == 0; i++) {
		FILE *f = fopen(port_file, "r");
		if (f) {
			if (fscanf(f, "%d", &n->port) != 1)
				n->port = 0;
			fclose(f);
		}
		struct stat st;
		if (n->port && stat(n->admin, &st) != 0)
			n->port = 0;
		if (!n->port)
			tn_sleep_ms(10);
	}
	if (!n->port)
		abort();
}

static void tn_node_stop(struct tn_node *n)
{
	if (n->pid > 0) {
		kill(n->pid, SIGTERM);
		waitpid(n->pid, NULL, 0);
		n->pid = 0;
	}
}

/* ---- admin socket ---- */

static int tn_admin_connect(const struct tn_node *n)
{
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	if (strlen(n->admin) >= sizeof sa.sun_path)
		return -1;
	memcpy(sa.sun_path, n->admin, strlen(n->admin));
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* Sends one JSON line and returns the parsed answer (NULL on failure). */
__attribute__((format(printf, 2, 3)))
static json_t *tn_admin_fd(int fd, const char *fmt, ...)
{
	char line[8192];
	va_list ap;
	va_start(ap, fmt);
	int len = vsnprintf(line, sizeof line - 1, fmt, ap);
	va_end(ap);
	line[len++] = '\n';
	if (write(fd, line, (size_t)len) != len)
		return NULL;
	char buf[65536];
	size_t got = 0;
	for (;;) {
		ssize_t r = read(fd, buf + got, sizeof buf - 1 - got);
		if (r <= 0)
			return NULL;
		got += (size_t)r;
		if (memchr(buf, '\n', got))
			break;
		if (got == sizeof buf - 1)
			return NULL;
	}
	return json_loadb(buf, (size_t)((char *)memchr(buf, '\n', got) - buf), 0, NULL);
}

__attribute__((format(printf, 2, 3)))
static json_t *tn_admin(const struct tn_node *n, const char *fmt, ...)
{
	char line[8192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	int fd = tn_admin_connect(n);
	if (fd < 0)
		return NULL;
	json_t *j = tn_admin_fd(fd, "%s", line);
	close(fd);
	return j;
}

static bool tn_ok(json_t *ack)
{
	bool ok = ack && json_is_true(json_object_get(ack, "ok"));
	return ok;
}

/* install sandbox/generation/activation on n; returns the ack (caller decrefs). */
static json_t *tn_install(const struct tn_node *n, const char *sandbox, uint64_t gen, const char *act,
                          bool handoff)
{
	return tn_admin(n,
	                "{\"type\":\"install\",\"identity\":{\"sandbox\":\"%s\",\"generation\":%llu,"
	                "\"worker\":\"%s\",\"substrate\":\"process\",\"activation\":\"%s\",\"pod_uid\":null},"
	                "\"handoff\":%s}",
	                sandbox, (unsigned long long)gen, n->worker, act, handoff ? "true" : "false");
}

/* An install whose spec names the sandbox's tenant. */
static json_t *tn_install_tenant(const struct tn_node *n, const char *sandbox, uint64_t gen, const char *act,
                                 const char *tenant)
{
	return tn_admin(n,
	                "{\"type\":\"install\",\"identity\":{\"sandbox\":\"%s\",\"generation\":%llu,"
	                "\"worker\":\"%s\",\"substrate\":\"process\",\"activation\":\"%s\",\"pod_uid\":null},"
	                "\"handoff\":false,\"spec\":{\"tenant\":\"%s\"}}",
	                sandbox, (unsigned long long)gen, n->worker, act, tenant);
}

static json_t *tn_deactivate(const struct tn_node *n, const char *sandbox, uint64_t gen, const char *act,
                             bool keep)
{
	return tn_admin(n,
	                "{\"type\":\"deactivate\",\"identity\":{\"sandbox\":\"%s\",\"generation\":%llu,"
	                "\"worker\":\"%s\",\"substrate\":\"process\",\"activation\":\"%s\",\"pod_uid\":null},"
	                "\"keep_paused\":%s}",
	                sandbox, (unsigned long long)gen, n->worker, act, keep ? "true" : "false");
}

/* ---- HTTP client ---- */

static int tn_tcp(int port)
{
	struct sockaddr_in sa;
	memset(&sa, 0, sizeof sa);
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	struct timeval tv = {20, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	return fd;
}

struct tn_resp {
	int status;
	char identity[SPACED_IDENTITY_TEXT_MAX];
	char *body;
	size_t body_len;
	json_t *json; /* parsed body when it is JSON */
	bool complete;
};

static void tn_resp_free(struct tn_resp *r)
{
	free(r->body);
	json_decref(r->json);
	memset(r, 0, sizeof *r);
}

static ssize_t tn_read_some(int fd, char *buf, size_t n)
{
	for (;;) {
		ssize_t r = read(fd, buf, n);
		if (r < 0 && errno == EINTR)
			continue;
		return r;
	}
}

/* Reads one HTTP response from fd. */
static int tn_read_resp(int fd, struct tn_resp *out)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 64u << 20);
	char tmp[65536];
	char *hend = NULL;
	memset(out, 0, sizeof *out);
	while (!hend) {
		ssize_t r = tn_read_some(fd, tmp, sizeof tmp);
		if (r <= 0) {
			spaced_buf_free(&b);
			return -1;
		}
		spaced_buf_append(&b, tmp, (size_t)r);
		hend = strstr((char *)b.data, "\r\n\r\n");
	}
	size_t hlen = (size_t)(hend - (char *)b.data) + 4;
	if (sscanf((char *)b.data, "HTTP/1.%*d %d", &out->status) != 1) {
		spaced_buf_free(&b);
		return -1;
	}
	long clen = -1;
	bool chunked = false;
	char *line = strstr((char *)b.data, "\r\n") + 2;
	while (line < (char *)b.data + hlen - 2) {
		char *eol = strstr(line, "\r\n");
		*eol = '\0';
		if (strncasecmp(line, "content-length:", 15) == 0)
			clen = strtol(line + 15, NULL, 10);
		else if (strncasecmp(line, "transfer-encoding:", 18) == 0 && strstr(line + 18, "chunked"))
			chunked = true;
		else if (strncasecmp(line, "x-spaced-identity:", 18) == 0) {
			const char *v = line + 18;
			while (*v == ' ')
				v++;
			snprintf(out->identity, sizeof out->identity, "%s", v);
		}
		*eol = '\r';
		line = eol + 2;
	}
	struct spaced_buf body;
	spaced_buf_init(&body, 64u << 20);
	size_t have = b.len - hlen;
	const char *rest = (char *)b.data + hlen;
	if (!chunked) {
		if (clen < 0)
			clen = 0;
		spaced_buf_append(&body, rest, have);
		while (body.len < (size_t)clen) {
			ssize_t r = tn_read_some(fd, tmp, sizeof tmp);
			if (r <= 0)
				break;
			spaced_buf_append(&body, tmp, (size_t)r);
		}
		out->complete = body.len >= (size_t)clen;
	} else {
		struct spaced_buf raw;
		spaced_buf_init(&raw, 64u << 20);
		spaced_buf_append(&raw, rest, have);
		size_t pos = 0;
		for (;;) {
			char *crlf = raw.len > pos ? memmem(raw.data + pos, raw.len - pos, "\r\n", 2) : NULL;
			if (!crlf) {
				ssize_t r = tn_read_some(fd, tmp, sizeof tmp);
				if (r <= 0)
					break;
				spaced_buf_append(&raw, tmp, (size_t)r);
				continue;
			}
			unsigned long sz = strtoul((char *)raw.data + pos, NULL, 16);
			size_t start = (size_t)(crlf - (char *)raw.data) + 2;
			while (raw.len < start + sz + 2) {
				ssize_t r = tn_read_some(fd, tmp, sizeof tmp);
				if (r <= 0)
					break;
				spaced_buf_append(&raw, tmp, (size_t)r);
			}
			if (raw.len < start + sz + 2)
				break;
			if (sz == 0) {
				out->complete = true;
				break;
			}
			spaced_buf_append(&body, raw.data + start, sz);
			pos = start + sz + 2;
		}
		spaced_buf_free(&raw);
	}
	spaced_buf_free(&b);
	out->body_len = body.len;
	out->body = (char *)spaced_buf_take(&body, &out->body_len);
	if (!out->body)
		out->body = calloc(1, 1);
	out->json = json_loadb(out->body, out->body_len, 0, NULL);
	return 0;
}

/* One request on a new connection. body may be NULL. */
static int tn_http(int port, const char *method, const char *target, const char *token, const void *body,
                   size_t blen, struct tn_resp *out)
{
	int fd = tn_tcp(port);
	if (fd < 0)
		return -1;
	size_t hsz = 1024 + strlen(target) + (token ? strlen(token) : 0);
	char *hdr = malloc(hsz);
	int n = snprintf(hdr, hsz,
	                 "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s%s%sContent-Length: %zu\r\nConnection: close\r\n\r\n",
	                 method, target, token ? "Authorization: Bearer " : "", token ? token : "",
	                 token ? "\r\n" : "", blen);
	bool ok = write(fd, hdr, (size_t)n) == n;
	free(hdr);
	/* the server may answer before reading the whole body (a refusal): read anyway */
	for (size_t off = 0; ok && off < blen;) {
		ssize_t w = send(fd, (const char *)body + off, blen - off, MSG_NOSIGNAL);
		if (w <= 0)
			break;
		off += (size_t)w;
	}
	if (!ok) {
		close(fd);
		return -1;
	}
	int e = tn_read_resp(fd, out);
	close(fd);
	return e;
}

static const char *tn_reason(const struct tn_resp *r)
{
	json_t *v = r->json ? json_object_get(r->json, "reason") : NULL;
	return json_is_string(v) ? json_string_value(v) : "";
}

static const char *tn_outcome(const struct tn_resp *r)
{
	json_t *v = r->json ? json_object_get(r->json, "outcome") : NULL;
	return json_is_string(v) ? json_string_value(v) : "";
}

/* ---- WebSocket client ---- */

struct tn_ws {
	int fd;
	int status;               /* HTTP status of the upgrade */
	char buf[1 << 17];
	size_t len;
};

struct tn_wsmsg {
	int opcode; /* 1 text, 2 binary, 8 close */
	char data[1 << 16];
	size_t len;
	int close_code;
	char close_reason[128];
};

static int tn_ws_open(struct tn_ws *w, int port, const char *target, const char *token)
{
	memset(w, 0, sizeof *w);
	w->fd = tn_tcp(port);
	if (w->fd < 0)
		return -1;
	char hdr[8192];
	int n = snprintf(hdr, sizeof hdr,
	                 "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
	                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
	                 "%s%s%s\r\n",
	                 target, token ? "Authorization: Bearer " : "", token ? token : "", token ? "\r\n" : "");
	if (write(w->fd, hdr, (size_t)n) != n)
		return -1;
	char *end = NULL;
	while (!end) {
		ssize_t r = tn_read_some(w->fd, w->buf + w->len, sizeof w->buf - 1 - w->len);
		if (r <= 0)
			return -1;
		w->len += (size_t)r;
		w->buf[w->len] = '\0';
		end = strstr(w->buf, "\r\n\r\n");
	}
	sscanf(w->buf, "HTTP/1.1 %d", &w->status);
	size_t hl = (size_t)(end - w->buf) + 4;
	memmove(w->buf, w->buf + hl, w->len - hl);
	w->len -= hl;
	return w->status == 101 ? 0 : -1;
}

/* Sends one masked frame. */
static int tn_ws_send(struct tn_ws *w, int opcode, const void *p, size_t n)
{
	uint8_t h[14];
	size_t hl = 0;
	h[hl++] = (uint8_t)(0x80 | opcode);
	if (n < 126) {
		h[hl++] = (uint8_t)(0x80 | n);
	} else if (n < 65536) {
		h[hl++] = 0x80 | 126;
		h[hl++] = (uint8_t)(n >> 8);
		h[hl++] = (uint8_t)n;
	} else {
		h[hl++] = 0x80 | 127;
		for (int i = 7; i >= 0; i--)
			h[hl++] = (uint8_t)((uint64_t)n >> (8 * i));
	}
	uint8_t mask[4] = {0x12, 0x34, 0x56, 0x78};
	memcpy(h + hl, mask, 4);
	hl += 4;
	uint8_t *f = malloc(hl + n);
	memcpy(f, h, hl);
	for (size_t i = 0; i < n; i++)
		f[hl + i] = ((const uint8_t *)p)[i] ^ mask[i % 4];
	ssize_t r = write(w->fd, f, hl + n);
	free(f);
	return r == (ssize_t)(hl + n) ? 0 : -1;
}

/* Receives one frame within timeout_ms. Returns 0, -1 on error/EOF, -2 on timeout. */
static int tn_ws_recv(struct tn_ws *w, struct tn_wsmsg *m, int timeout_ms)
{
	for (;;) {
		if (w->len >= 2) {
			const uint8_t *b = (const uint8_t *)w->buf;
			size_t need = 2;
			uint64_t plen = b[1] & 0x7f;
			if (plen == 126)
				need += 2;
			else if (plen == 127)
				need += 8;
			if (w->len >= need) {
				if (plen == 126)
					plen = (uint64_t)b[2] << 8 | b[3];
				else if (plen == 127) {
					plen = 0;
					for (int i = 0; i < 8; i++)
						plen = plen << 8 | b[2 + i];
				}
				if (plen > sizeof m->data)
					return -1;
				if (w->len >= need + plen) {
					m->opcode = b[0] & 0x0f;
					memcpy(m->data, b + need, plen);
					m->len = plen;
					m->close_code = 0;
					m->close_reason[0] = '\0';
					if (m->opcode == 8 && plen >= 2) {
						m->close_code = (uint8_t)m->data[0] << 8 | (uint8_t)m->data[1];
						size_t rl = plen - 2 < sizeof m->close_reason - 1 ? plen - 2 : sizeof m->close_reason - 1;
						memcpy(m->close_reason, m->data + 2, rl);
						m->close_reason[rl] = '\0';
					}
					memmove(w->buf, w->buf + need + plen, w->len - need - plen);
					w->len -= need + plen;
					m->data[m->len < sizeof m->data ? m->len : sizeof m->data - 1] = '\0';
					return 0;
				}
			}
		}
		struct pollfd pf = {.fd = w->fd, .events = POLLIN};
		int pr = poll(&pf, 1, timeout_ms);
		if (pr == 0)
			return -2;
		if (pr < 0)
			return -1;
		ssize_t r = tn_read_some(w->fd, w->buf + w->len, sizeof w->buf - w->len);
		if (r <= 0)
			return -1;
		w->len += (size_t)r;
	}
}

/* Receives until a close frame (skipping data) or timeout; returns its code or -1. */
static int tn_ws_wait_close(struct tn_ws *w, char *reason, size_t rsz, int timeout_ms)
{
	struct tn_wsmsg *m = malloc(sizeof *m);
	int code = -1;
	for (;;) {
		int e = tn_ws_recv(w, m, timeout_ms);
		if (e < 0)
			break;
		if (m->opcode == 8) {
			code = m->close_code;
			if (reason)
				snprintf(reason, rsz, "%s", m->close_reason);
			break;
		}
	}
	free(m);
	return code;
}

static void tn_ws_close(struct tn_ws *w)
{
	if (w->fd >= 0)
		close(w->fd);
	w->fd = -1;
}

#endif
