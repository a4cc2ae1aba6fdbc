/*
 * netgtw.c — spaced-netgtw, the ServicePort gateway of one execution (R5, S1–S4, B4;
 * docs/network.md "ServicePorts").
 *
 *   spaced-netgtw --listen HOST:PORT --port-file PATH (--record PATH | --record-dir DIR) --keys PATH
 *                 --guest PATH --launcher-pid PID --launcher-start TICKS [--launcher-exe PATH]
 *                 --identity TEXT|- [--guest-owner UID] [--audit PATH] [--tls-cert FILE --tls-key FILE]
 *                 [--relay-budget BYTES] [--lease-file PATH]
 *                 [--vm-pid PID --forward-port N [--vm-start TICKS] [--vm-exe PATH] [--guest-cid N]]
 *
 * With --tls-cert/--tls-key every client connection is TLS (the worker's
 * node-api certificate: it names *.gw.localhost, the gateway's host names);
 * the guest side is the execution's own transport, as without.
 *
 * With --vm-pid the execution is a microVM (the qemu substrate): --guest is
 * its vsock back-end's hybrid socket (the launcher options name spaced-vsockd),
 * the back-end is checked to serve exactly that VM (libspaced/vmcheck.h:
 * QEMU's pid, start time, executable, the vhost-user link, --guest-cid), and
 * the guest's port is reached through the guest's forward port (--forward-port,
 * spaced-guest/fwd.c), which relays inside the VM: the connection to the
 * back-end is the stream.
 *
 * "--identity -" is a pooled execution's gateway (docs/templates.md "The warm
 * pool"): it listens and writes its port at once, reads the identity of the
 * sandbox that claims the execution as one line on its standard input (a
 * FIFO), and accepts no connection before it has it. --record-dir DIR: the
 * record is DIR/<sandbox>/record.json, the sandbox the identity names (a
 * directory per sandbox: a record written wakes only its own gateway).
 * Clients speak HTTP/1.1 to it. The first request head of a connection names
 * the port (Host "<port>-<sandbox>.localhost", else the capability's port) and
 * carries a credential: "Authorization: Bearer <serviceport capability>", the
 * cookie it was exchanged for ("?spaced_token=<capability>" answers 302 with
 * Set-Cookie: spaced_gw, bound to this execution's identity and that port), and
 * "Upgrade: spaced-tcp" asks for a raw TCP tunnel (101, then bytes). The
 * capability is verified with the worker's verification keys and compared with
 * the activation record the worker's gate pushes to --record (R5: purpose
 * serviceport, port, protocol, the full identity) before any connection to the
 * guest is opened. Only then is the guest's port reached, through the
 * execution's guest transport: the listener is checked to belong to the
 * expected launcher (B1, B2: socket owner, unix_diag, the launcher's pidfd,
 * start time and executable, the connection's peer credentials), then
 * "CONNECT <port>" hands the connection to the guest, which joins it to
 * 127.0.0.1:<port> inside (B4: the application itself is not attested). From
 * then on the connection is a stream bound to the record's epoch: when the
 * record changes, each stream is compared again (SPACED_COMPARE_ESTABLISHED_STREAM):
 * an activation-only change keeps it (S4), anything else — a new generation,
 * a deactivation, a move — cuts it at once (S1). New opens need the new identity.
 *
 * Every DENY is appended to the worker's audit log (--audit), like the gate's, at most
 * SPACED_AUDIT_DENY_RATE lines a second per caller address (ratelimit.h).
 * GET /metrics on the gateway's own address (no sandbox-port Host name, no
 * credential) gives its counters in Prometheus text.
 *
 * One thread, one epoll loop. The process ends when its launcher ends.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/netlink.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sodium.h>

#include "cap.h"
#include "compare.h"
#include "lease.h"
#include "confine.h"
#include "spaced_error.h"
#include "http.h"
#include "identity.h"
#include "keyring.h"
#include "pidref.h"
#include "ratelimit.h"
#include "tls.h"
#include "util.h"
#include "vcache.h"
#include "vmcheck.h"
#include "vsock_hs.h"

#define HEAD_MAX (16 * 1024)
#define BUF_SZ (256 * 1024)
#define HEAD_TIMEOUT_MS 10000
#define MAX_CONNS 1024
/* Connections from one address (loopback excepted: the gateway listens on
 * the worker's loopback, where every client of a front on the same host
 * arrives from 127.0.0.1), and connections that have not sent a whole
 * admitted request head yet: past either, a new connection pushes out the
 * oldest of those (a client trickling heads cannot hold the gateway). */
#define MAX_CONNS_PER_ADDR 128
#define MAX_HEAD_CONNS 256
/* The relay buffers (BUF_SZ each way) of all admitted streams: the
 * gateway runs outside its sandbox's memory limit, so what clients that
 * never read can make it hold is bounded here (an open past it: 503). */
#define RELAY_BUDGET (64u << 20) /* the default of --relay-budget */
/* Each client connection's kernel buffers, both ways (the kernel holds up to
 * twice it): what a client does not read, or the guest does not take, waits
 * in the relay's own buffers (BUF_SZ), not in the host's TCP memory, which
 * the kernel's tuning would grow to 4 MiB a connection (net.ipv4.tcp_wmem). */
#define SOCK_BUF (256 * 1024)
#define COOKIE_LIFETIME 3600
#define COOKIE_NAME "spaced_gw"
#define GUEST_HANDBACK 0x10000u /* CONNECT port | this: the guest hands the port's connection back */

/* C_GUEST: admitted, the guest's port being opened (open_step) */
enum cstate { C_HEAD = 1, C_GUEST, C_RELAY };
/* What an open of the guest's port waits for next */
enum gstep { G_TRANSPORT = 1, G_GUEST, G_FD };
#define GUEST_OPEN_MS 5000

struct dir {
	uint8_t *buf;
	size_t len, off;
	bool eof, shut;
};

struct conn {
	struct conn *next, *prev;
	int cfd, gfd;
	SSL *ssl;             /* the client side's TLS, NULL in plaintext */
	bool tls_want_write;  /* TLS waits for the client's socket to take bytes */
	enum cstate st;
	uint64_t t0;
	struct sockaddr_storage addr; /* the client's */
	bool relay_held;              /* counted in G.relay_bytes */
	uint8_t head[HEAD_MAX];
	size_t hlen;
	struct dir up, down; /* up: client -> guest, down: guest -> client */
	uint32_t ev_c, ev_g;
	struct spaced_cap cap; /* the credential the stream was admitted with (S4) */
	struct spaced_request req;
	char protocol[SPACED_PROTOCOL_MAX];
	uint64_t epoch;
	bool dead;
	/* C_GUEST: the open of the guest's port (the answer line read so far,
	 * what goes to the guest once it is open, whether the client asked
	 * for a tcp tunnel) */
	enum gstep gstep;
	uint16_t gport;
	uint8_t gans[SPACED_VSOCK_HS_MAX];
	size_t ganslen;
	uint64_t gdeadline;
	uint8_t *first;
	size_t nfirst;
	bool tcp;
};

static struct {
	int ep, lfd, ino, pidfd;
	int rec_wd, keys_wd; /* the inotify watches of the record's and the keys' directories */
	const char *record_path, *keys_path, *guest_path, *record_dir;
	char record_base[256], keys_base[256], record_buf[4200];
	bool identity_pending; /* --identity -: on standard input, not yet read */
	char idline[SPACED_IDENTITY_TEXT_MAX + 2];
	size_t idlen;
	struct spaced_keyring *kr;
	struct spaced_vcache *vc;
	struct spaced_record rec;
	bool have_rec;
	bool paused;           /* the record's execution is paused on purpose (its guest frozen) */
	bool fenced;           /* the worker fenced itself: lost its control plane (spaced-node gate_fence.c) */
	const char *lease_file; /* --lease-file: the worker's lease (wall-clock seconds), kept without its gate */
	bool lease_ended;      /* it has ended: fenced, whether the gate is there to say so or not */
	uint64_t lease_read_ms;
	uint64_t paused_since; /* since when this gateway knows it (monotonic ns) */
	struct spaced_identity self; /* the execution this gateway was started for */
	struct spaced_expected_listener exp;
	struct spaced_vm_expected vm; /* --vm-pid: the guest is a microVM's (vmcheck.h) */
	struct spaced_vm_check vmc;
	uint32_t fwd_port;            /* its guest's ServicePort forward port */
	uint8_t cookie_key[crypto_auth_KEYBYTES];
	struct conn *conns;
	unsigned nconns;
	uint64_t relay_bytes;  /* of relay_budget, held by admitted streams */
	uint64_t relay_budget; /* --relay-budget (RELAY_BUDGET) */
	uint64_t n_budget;    /* opens refused at the budget, connections pushed out */
	uint64_t n_allow, n_refuse, n_cut, n_kept, n_guest_fail;
	int audit_fd; /* the worker's audit log (STATE/audit.log), -1: none */
	struct spaced_ratelimit *refusals; /* the lines about refusals, per caller */
	struct spaced_ratelimit *guest_fail_log; /* and about a guest that does not answer */
	SSL_CTX *tls; /* --tls-cert/--tls-key: clients speak TLS */
} G;

static void glog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void glog(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (n > 0)
		fprintf(stderr, "spaced-netgtw %s\n", buf);
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* What the supervisor does for the confined serving process (below, "the
 * supervisor"): the guest transport connected after its checks, the keys
 * file, the lease file. */
enum { H_GUEST = 'g', H_KEYS = 'k', H_LEASE = 'l' };
static int helper_ask(char what, int *fd, char *why, size_t whysz);
static int helper_sock = -1; /* the serving process's end of the pair with its supervisor */

/* Whether the worker is fenced: its gate says so in the record, or the lease
 * the gate keeps renewed in --lease-file has ended (the gate stopped, or
 * cut off with it: the gateway keeps the fence on its own). Read at most
 * once a second while valid, at every call once ended (it is renewed the
 * moment the gate is back); a file that is missing or unreadable says
 * nothing. */
static bool fenced_now(void)
{
	uint64_t t = now_ms();
	if (G.lease_file && (G.lease_ended || G.lease_read_ms == 0 || t - G.lease_read_ms >= 1000)) {
		G.lease_read_ms = t;
		int fd = -1;
		char why[200];
		int e = helper_ask(H_LEASE, &fd, why, sizeof why);
		enum spaced_lease_state s = e == SPACED_ENOENT ? SPACED_LEASE_GONE
		                            : e < 0            ? SPACED_LEASE_UNREADABLE
		                                               : spaced_lease_read_fd(fd, NULL);
		if (fd >= 0)
			close(fd);
		if (s != SPACED_LEASE_UNREADABLE) /* gone: the fence was turned off */
			G.lease_ended = s == SPACED_LEASE_ENDED;
	}
	return G.fenced || G.lease_ended;
}

/* ---- the pushed activation record and the keys ---- */

static void conn_close(struct conn *c);
static void refuse(struct conn *c, struct spaced_decision d);

/* Every established stream is compared again with the new record (S1, S4);
 * an open still waiting for the guest is a new open: it needs the record's
 * identity as a new request does (STRICT), else it is refused as one. */
static void streams_recheck(void)
{
	for (struct conn *c = G.conns, *n; c; c = n) {
		n = c->next;
		if (c->dead)
			continue;
		if (c->st == C_GUEST) {
			struct spaced_decision d =
				spaced_compare(&c->cap, &c->req, G.have_rec ? &G.rec : NULL, SPACED_COMPARE_STRICT);
			if (d.verdict == SPACED_ALLOW && fenced_now())
				d = (struct spaced_decision){SPACED_REFRESH_ROUTE, SPACED_REASON_FENCED};
			if (d.verdict != SPACED_ALLOW)
				refuse(c, d);
			continue;
		}
		if (c->st != C_RELAY)
			continue;
		struct spaced_decision d =
			spaced_compare(&c->cap, &c->req, G.have_rec ? &G.rec : NULL, SPACED_COMPARE_ESTABLISHED_STREAM);
		/* a fenced worker's streams end, as the gate's do */
		if (d.verdict == SPACED_ALLOW && fenced_now())
			d = (struct spaced_decision){SPACED_REFRESH_ROUTE, SPACED_REASON_FENCED};
		if (d.verdict == SPACED_ALLOW) {
			if (c->epoch != G.rec.epoch)
				G.n_kept++;
			c->epoch = G.rec.epoch;
			continue;
		}
		G.n_cut++;
		glog("level=info event=stream-cut port=%u verdict=%s reason=%s", c->req.port,
		     spaced_verdict_name(d.verdict), spaced_reason_name(d.reason));
		conn_close(c);
	}
}

static void record_load(void)
{
	if (G.identity_pending)
		return; /* not yet any sandbox's */
	json_error_t jerr;
	json_t *j = json_load_file(G.record_path, JSON_REJECT_DUPLICATES, &jerr);
	struct spaced_record r;
	memset(&r, 0, sizeof r);
	json_t *je = json_object_get(j, "epoch"), *ja = json_object_get(j, "active");
	if (j && spaced_identity_from_json(&r.id, json_object_get(j, "identity")) == 0 && json_is_integer(je) &&
	    json_is_boolean(ja)) {
		r.epoch = (uint64_t)json_integer_value(je);
		r.active = json_is_true(ja);
		/* a record of another generation or placement is a record of another
		 * execution: this gateway's execution no longer serves (its
		 * tombstone, as the comparator sees it) */
		if (strcmp(r.id.sandbox, G.self.sandbox) != 0 || r.id.generation != G.self.generation ||
		    strcmp(r.id.worker, G.self.worker) != 0 || strcmp(r.id.substrate, G.self.substrate) != 0) {
			if (r.id.generation < G.self.generation || strcmp(r.id.sandbox, G.self.sandbox) != 0) {
				json_decref(j);
				return; /* not yet ours: nothing is served before it is */
			}
		}
		bool changed = !G.have_rec || r.epoch != G.rec.epoch;
		/* a pause seen in the first record this gateway reads began before
		 * it started: since when is unknown, so it is taken as long ago (as
		 * the gate takes a pause from before its start) */
		bool paused = json_is_true(json_object_get(j, "paused"));
		if (paused && !G.paused)
			G.paused_since = G.have_rec ? spaced_mono_ns() : 0;
		G.paused = paused;
		bool fenced = json_is_true(json_object_get(j, "fenced"));
		changed = changed || fenced != G.fenced;
		G.fenced = fenced;
		G.rec = r;
		G.have_rec = true;
		if (changed)
			streams_recheck();
	}
	json_decref(j);
}

/* --record-dir: the record of the sandbox this gateway serves, in a
 * directory of its own so that only its record's changes wake it. */
static void record_path_set(void)
{
	snprintf(G.record_buf, sizeof G.record_buf, "%s/%s/record.json", G.record_dir, G.self.sandbox);
	G.record_path = G.record_buf;
	snprintf(G.record_base, sizeof G.record_base, "record.json");
}

/* Watches the directory of G.record_path (the gate replaces the record by
 * rename). A --record-dir one is made by spaced-node before the gateway
 * learns whose it is: the gateway makes no directory. */
static int record_watch(void)
{
	char tmp[4200];
	snprintf(tmp, sizeof tmp, "%s", G.record_path);
	const char *dir = dirname(tmp);
	if (G.record_dir && G.self.sandbox[0] == '.') { /* "." and ".." are valid names, not directories of its own */
		errno = EINVAL;
		return -1;
	}
	G.rec_wd = inotify_add_watch(G.ino, dir, IN_CLOSE_WRITE | IN_MOVED_TO);
	return G.rec_wd < 0 ? -1 : 0;
}

/* --identity -: the claimed execution's identity, one line on standard
 * input, read by the supervisor while its first serving process (s, its
 * pidfd cfd) sets itself up, answering its requests meanwhile; the
 * supervisor then hands the line to it (until then nothing is accepted:
 * connections wait in the listener's backlog). A malformed line, or the
 * input ending without one, ends the gateway (it serves nobody). Returns 0
 * once the identity is taken, 1 when the launcher ended, 2 when the serving
 * process did, -1 to end. */
static bool helper_serve(int s);

static int identity_wait(int s, int cfd)
{
	for (;;) {
		struct pollfd pf[4] = {{.fd = 0, .events = POLLIN}, {.fd = G.pidfd, .events = POLLIN},
		                       {.fd = s, .events = POLLIN}, {.fd = cfd, .events = POLLIN}};
		if (poll(pf, 4, -1) < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		if (pf[1].revents)
			return 1;
		/* the serving process sets itself up meanwhile (its keys) */
		if ((pf[2].revents & POLLIN) && !helper_serve(s))
			return 2;
		if (pf[3].revents || (pf[2].revents & (POLLHUP | POLLERR)))
			return 2;
		if (!pf[0].revents)
			continue;
		ssize_t n = read(0, G.idline + G.idlen, sizeof G.idline - 1 - G.idlen);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n <= 0) {
			glog("level=error event=identity-missing reason=\"its input ended\"");
			return -1;
		}
		G.idlen += (size_t)n;
		char *nl = memchr(G.idline, '\n', G.idlen);
		if (nl == NULL) {
			if (G.idlen >= sizeof G.idline - 1) {
				glog("level=error event=identity-malformed reason=\"too long\"");
				return -1;
			}
			continue;
		}
		if (spaced_identity_decode(&G.self, G.idline, (size_t)(nl - G.idline)) < 0) {
			glog("level=error event=identity-malformed");
			return -1;
		}
		G.identity_pending = false;
		close(0);
		if (G.record_dir) {
			if (G.self.sandbox[0] == '.') { /* "." and "..": valid names, no directory of their own */
				glog("level=error event=identity-malformed reason=\"no record directory for this name\"");
				return -1;
			}
			record_path_set();
		}
		glog("level=info event=claimed sandbox=%s", G.self.sandbox);
		return 0;
	}
}

/* A pooled execution's serving process: the identity its supervisor read
 * ('I' and the line, on the pair), once the claim sent it. 0, or < 0 (the
 * supervisor went away, or sent something else). */
static int identity_take(void)
{
	char msg[sizeof G.idline + 1];
	ssize_t n;
	do
		n = recv(helper_sock, msg, sizeof msg, 0);
	while (n < 0 && errno == EINTR);
	if (n < 2 || msg[0] != 'I' || spaced_identity_decode(&G.self, msg + 1, (size_t)n - 1) < 0) {
		glog("level=error event=identity-missing reason=\"its supervisor sent none\"");
		return -1;
	}
	G.identity_pending = false;
	if (G.record_dir)
		record_path_set();
	return 0;
}

static void keys_load(void)
{
	int fd = -1;
	char why[200] = "";
	int e = helper_ask(H_KEYS, &fd, why, sizeof why);
	if (e == 0) {
		e = spaced_keyring_load_fd(G.kr, fd);
		close(fd);
	}
	if (e < 0 && e != SPACED_ESTALE)
		glog("level=warn event=keys-unreadable path=%s reason=\"%s\"", G.keys_path,
		     why[0] ? why : spaced_strerror(e));
}

static void on_inotify(void)
{
	char buf[4096] __attribute__((aligned(8)));
	bool rec = false, keys = false;
	for (;;) {
		ssize_t n = read(G.ino, buf, sizeof buf);
		if (n <= 0)
			break;
		for (char *p = buf; p < buf + n;) {
			struct inotify_event *ev = (struct inotify_event *)(void *)p;
			if (ev->len > 0 && ev->wd == G.rec_wd && strcmp(ev->name, G.record_base) == 0)
				rec = true;
			if (ev->len > 0 && ev->wd == G.keys_wd && strcmp(ev->name, G.keys_base) == 0)
				keys = true;
			p += sizeof *ev + ev->len;
		}
	}
	if (keys)
		keys_load();
	if (rec)
		record_load();
}

/* ---- connections ---- */

static void set_ev(struct conn *c)
{
	uint32_t ec = 0, eg = 0;
	if (c->st == C_HEAD) {
		ec = EPOLLIN | (c->tls_want_write ? EPOLLOUT : 0);
	} else if (c->st == C_GUEST) {
		ec = c->tls_want_write ? EPOLLOUT : 0; /* the client waits; its hang-up is seen */
		eg = EPOLLIN;
	} else {
		if (!c->up.eof && c->up.len < BUF_SZ)
			ec |= EPOLLIN;
		if (c->down.len > 0 || c->tls_want_write)
			ec |= EPOLLOUT;
		if (!c->down.eof && c->down.len < BUF_SZ)
			eg |= EPOLLIN;
		if (c->up.len > 0)
			eg |= EPOLLOUT;
	}
	if (ec != c->ev_c) {
		struct epoll_event e = {.events = ec, .data.ptr = c};
		epoll_ctl(G.ep, EPOLL_CTL_MOD, c->cfd, &e);
		c->ev_c = ec;
	}
	if (c->gfd >= 0 && eg != c->ev_g) {
		struct epoll_event e = {.events = eg, .data.ptr = (void *)((uintptr_t)c | 1)};
		epoll_ctl(G.ep, EPOLL_CTL_MOD, c->gfd, &e);
		c->ev_g = eg;
	}
}

static void conn_close(struct conn *c)
{
	if (c->dead)
		return;
	c->dead = true;
	if (c->ssl) {
		SSL_free(c->ssl);
		c->ssl = NULL;
	}
	close(c->cfd);
	if (c->gfd >= 0)
		close(c->gfd);
	c->cfd = c->gfd = -1;
}

static void conn_free(struct conn *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		G.conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	free(c->up.buf);
	free(c->down.buf);
	free(c->first);
	if (c->relay_held)
		G.relay_bytes -= 2u * BUF_SZ;
	free(c);
	G.nconns--;
}

/* ---- the client side: TCP, or TLS over it ---- */

/* An SSL result as recv/send would give it: > 0 bytes, 0 the end of the
 * stream, -1 with errno (EAGAIN: later, the loop says when; EPROTO). */
static ssize_t tls_result(struct conn *c, int r)
{
	if (r > 0) {
		c->tls_want_write = false;
		return r;
	}
	int e = SSL_get_error(c->ssl, r);
	ERR_clear_error();
	if (e == SSL_ERROR_WANT_READ) {
		errno = EAGAIN;
		return -1;
	}
	if (e == SSL_ERROR_WANT_WRITE) {
		c->tls_want_write = true;
		errno = EAGAIN;
		return -1;
	}
	if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && r == 0))
		return 0;
	errno = EPROTO;
	return -1;
}

static ssize_t c_recv(struct conn *c, void *p, size_t n)
{
	if (!c->ssl)
		return recv(c->cfd, p, n, MSG_DONTWAIT);
	return tls_result(c, SSL_read(c->ssl, p, n > INT32_MAX ? INT32_MAX : (int)n));
}

static ssize_t c_send(struct conn *c, const void *p, size_t n)
{
	if (!c->ssl)
		return send(c->cfd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
	return tls_result(c, SSL_write(c->ssl, p, n > INT32_MAX ? INT32_MAX : (int)n));
}

/* Decrypted bytes TLS holds that the socket's readiness does not show. */
static bool c_pending(const struct conn *c)
{
	return c->ssl && SSL_pending(c->ssl) > 0;
}

/* The end of what goes to the client: close_notify over TLS, then FIN. */
static void c_shut(struct conn *c)
{
	if (c->ssl)
		(void)SSL_shutdown(c->ssl);
	shutdown(c->cfd, SHUT_WR);
}

/* A short answer or the 101 line to the client. A fresh connection's socket
 * takes a few KiB at once; a client that takes nothing is given up after
 * about 20 ms, not waited for. */
static void send_all(struct conn *c, const char *p, size_t n)
{
	/* a TLS client that has not finished its handshake gets nothing (it
	 * would only stall this loop): its connection is just closed */
	if (c->ssl && !SSL_is_init_finished(c->ssl))
		return;
	for (int waits = 0; n > 0 && waits < 20;) {
		ssize_t w = c_send(c, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN) {
			struct timespec ts = {0, 1000000};
			nanosleep(&ts, NULL);
			waits++;
			continue;
		}
		if (w <= 0)
			return;
		p += w;
		n -= (size_t)w;
	}
}

static void reply(struct conn *c, int status, const char *extra_headers, const char *json)
{
	char buf[2048];
	int n = snprintf(buf, sizeof buf,
	                 "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n%s\r\n%s",
	                 status, spaced_http_reason(status), strlen(json), extra_headers ? extra_headers : "", json);
	if (n > 0)
		send_all(c, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
	/* what the client sent and nobody read would make the close a reset,
	 * which can discard this answer before the client reads it (a 431 for
	 * a 20 KB head): the write side ends first, then what came is drained */
	if (c->cfd >= 0) {
		char sink[4096];
		shutdown(c->cfd, SHUT_WR);
		for (int i = 0; i < 64 && recv(c->cfd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++)
			;
	}
	conn_close(c);
}

/* One line of the worker's audit log, as the gate writes its own: its time
 * and component first, then j's members (taken); one O_APPEND write. */
static void audit_write(json_t *j)
{
	if (G.audit_fd < 0 || !j) {
		json_decref(j);
		return;
	}
	char when[40];
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(when + n, sizeof when - n, ".%03ldZ", ts.tv_nsec / 1000000);
	json_t *line = json_pack("{s:s,s:s}", "time", when, "component", "spaced-netgtw");
	json_object_update(line, j);
	json_decref(j);
	char *text = line ? json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
	json_decref(line);
	if (text) {
		size_t len = strlen(text);
		text[len] = '\n';
		if (write(G.audit_fd, text, len + 1) != (ssize_t)(len + 1))
			glog("level=error event=audit-write-failed");
		free(text);
	}
}

/* Every DENY into the worker's audit log (one past its caller's rate is
 * counted, and written in its caller's summary: refusals_summary). */
static void audit_deny(const char *peer, struct conn *c, struct spaced_decision d, const struct spaced_cap *cap)
{
	json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:s,s:i}", "event", "deny", "outcome", spaced_verdict_name(d.verdict),
	                      "reason", spaced_reason_name(d.reason), "caller", peer, "sandbox", G.self.sandbox, "port",
	                      (int)c->req.port);
	if (j && cap && cap->id.sandbox[0])
		json_object_set_new(j, "identity", spaced_identity_to_json(&cap->id));
	audit_write(j);
}

/* A caller's refusals held back past its rate: one line, each reason's count
 * (DESIGN §5: every DENY in the audit log with its caller and reason). */
static void refusals_summary(void *ctx, const char *caller, const struct spaced_ratelimit_held *held, size_t n)
{
	(void)ctx;
	json_t *j = spaced_ratelimit_summary_json(caller, held, n);
	if (j)
		json_object_set_new(j, "sandbox", json_string(G.self.sandbox));
	audit_write(j);
}

/* The lines about an unreachable guest held back: one line per error. */
static void guest_fail_summary(void *ctx, const char *caller, const struct spaced_ratelimit_held *held, size_t n)
{
	(void)ctx;
	(void)caller;
	for (size_t i = 0; i < n; i++)
		glog("level=warn event=guest-unreachable-held-back code=%s count=%llu", held[i].reason,
		     (unsigned long long)held[i].count);
}

static void refuse(struct conn *c, struct spaced_decision d)
{
	char body[256];
	int status;
	if (d.verdict == SPACED_REFRESH_ROUTE) {
		status = 409;
		snprintf(body, sizeof body, "{\"outcome\":\"REFRESH_ROUTE\",\"reason\":\"%s\",\"sandbox\":\"%s\"}",
		         spaced_reason_name(d.reason), G.have_rec ? G.rec.id.sandbox : "");
	} else {
		switch (d.reason) {
		case SPACED_REASON_BAD_SIGNATURE:
		case SPACED_REASON_UNKNOWN_KEY:
		case SPACED_REASON_EXPIRED:
		case SPACED_REASON_NOT_YET_VALID:
		case SPACED_REASON_MALFORMED: status = 401; break;
		default: status = 403; break;
		}
		snprintf(body, sizeof body, "{\"outcome\":\"DENY\",\"reason\":\"%s\"}", spaced_reason_name(d.reason));
	}
	G.n_refuse++;
	/* the lines about it, unless its caller is past its rate (a flood of
	 * refusals cannot fill the worker's disk) */
	struct sockaddr_in pa;
	socklen_t pl = sizeof pa;
	char peer[64] = "";
	if (getpeername(c->cfd, (struct sockaddr *)&pa, &pl) == 0 && pa.sin_family == AF_INET) {
		char a[INET_ADDRSTRLEN];
		inet_ntop(AF_INET, &pa.sin_addr, a, sizeof a);
		snprintf(peer, sizeof peer, "%s:%u", a, ntohs(pa.sin_port));
	}
	if (!G.refusals || spaced_ratelimit_take(G.refusals, peer, spaced_reason_name(d.reason), spaced_mono_ns())) {
		audit_deny(peer, c, d, &c->cap);
		glog("level=info event=refused outcome=%s reason=%s", spaced_verdict_name(d.verdict),
		     spaced_reason_name(d.reason));
	}
	reply(c, status, NULL, body);
}

/* Host "<port>-<sandbox>[.gw].localhost[:N]": the port and sandbox it names. */
static bool host_names(const char *host, uint16_t *port, char *sandbox, size_t sbsz)
{
	if (!host)
		return false;
	char *end;
	unsigned long p = strtoul(host, &end, 10);
	if (end == host || *end != '-' || p == 0 || p > 65535)
		return false;
	const char *s = end + 1, *dot = strchr(s, '.');
	if (!dot || (size_t)(dot - s) >= sbsz)
		return false;
	/* "<port>-<sandbox>.localhost", or ".gw.localhost" (the names a TLS
	 * gateway's certificate covers: *.gw.localhost) */
	size_t sl = strncasecmp(dot, ".gw.localhost", 13) == 0 ? 13 : strncasecmp(dot, ".localhost", 10) == 0 ? 10 : 0;
	if (sl == 0 || (dot[sl] != '\0' && dot[sl] != ':'))
		return false;
	memcpy(sandbox, s, (size_t)(dot - s));
	sandbox[dot - s] = '\0';
	*port = (uint16_t)p;
	return true;
}

/* ---- cookies: a capability exchanged once, bound to this execution and port ---- */

static void cookie_mac(const struct spaced_identity *id, uint16_t port, uint64_t exp, uint8_t mac[crypto_auth_BYTES])
{
	char text[SPACED_IDENTITY_TEXT_MAX + 64];
	int n = spaced_identity_encode(id, text, sizeof text);
	if (n < 0)
		n = 0;
	n += snprintf(text + n, sizeof text - (size_t)n, "|%u|%llu", port, (unsigned long long)exp);
	crypto_auth(mac, (const uint8_t *)text, (size_t)n, G.cookie_key);
}

/* value: exp(8) port(2) generation(8) activation-length(1) activation mac(32), base64url */
static int cookie_make(const struct spaced_identity *id, uint16_t port, char *out, size_t outsz)
{
	uint8_t raw[8 + 2 + 8 + 1 + SPACED_NAME_MAX + crypto_auth_BYTES];
	uint64_t exp = (uint64_t)time(NULL) + COOKIE_LIFETIME;
	size_t al = strlen(id->activation), n = 0;
	for (int i = 7; i >= 0; i--)
		raw[n++] = (uint8_t)(exp >> (8 * i));
	raw[n++] = (uint8_t)(port >> 8);
	raw[n++] = (uint8_t)port;
	for (int i = 7; i >= 0; i--)
		raw[n++] = (uint8_t)(id->generation >> (8 * i));
	raw[n++] = (uint8_t)al;
	memcpy(raw + n, id->activation, al);
	n += al;
	cookie_mac(id, port, exp, raw + n);
	n += crypto_auth_BYTES;
	if (sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_URLSAFE_NO_PADDING) > outsz)
		return SPACED_ETOOBIG;
	sodium_bin2base64(out, outsz, raw, n, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
	return 0;
}

/* A cookie as a capability-like credential for the comparison. */
static int cookie_read(const char *v, size_t vl, struct spaced_cap *cap)
{
	uint8_t raw[8 + 2 + 8 + 1 + SPACED_NAME_MAX + crypto_auth_BYTES];
	size_t n;
	if (!G.have_rec ||
	    sodium_base642bin(raw, sizeof raw, v, vl, NULL, &n, NULL, sodium_base64_VARIANT_URLSAFE_NO_PADDING) < 0 ||
	    n < 19 + crypto_auth_BYTES)
		return SPACED_EFORMAT;
	uint64_t exp = 0, gen = 0;
	for (int i = 0; i < 8; i++)
		exp = (exp << 8) | raw[i];
	uint16_t port = (uint16_t)((raw[8] << 8) | raw[9]);
	for (int i = 10; i < 18; i++)
		gen = (gen << 8) | raw[i];
	size_t al = raw[18];
	if (al == 0 || al >= SPACED_NAME_MAX || n != 19 + al + crypto_auth_BYTES)
		return SPACED_EFORMAT;
	struct spaced_cap c;
	memset(&c, 0, sizeof c);
	char act[SPACED_NAME_MAX];
	memcpy(act, raw + 19, al);
	act[al] = '\0';
	if (spaced_identity_set(&c.id, G.rec.id.sandbox, gen, G.rec.id.worker, G.rec.id.substrate, act,
	                        G.rec.id.pod_uid) < 0)
		return SPACED_EFORMAT;
	uint8_t mac[crypto_auth_BYTES];
	cookie_mac(&c.id, port, exp, mac);
	if (sodium_memcmp(mac, raw + 19 + al, sizeof mac) != 0)
		return SPACED_ESIG;
	if (exp < (uint64_t)time(NULL))
		return SPACED_EEXPIRED;
	c.purposes = SPACED_PURPOSE_SERVICEPORT;
	c.cls = SPACED_CLASS_SERVICEPORT;
	c.port = port;
	/* a cookie is only ever made from an http capability: it opens http, never a tcp tunnel */
	snprintf(c.protocol, sizeof c.protocol, "http");
	*cap = c;
	return 0;
}

/* The gateway's cookie. Over TLS a __Host- cookie: a browser takes it only
 * with Secure, Path=/ and no Domain, so no other host — another sandbox's
 * application under the same parent domain — can set one of that name
 * for this gateway's host (cookie tossing). */
static const char *cookie_name(void)
{
	return G.tls ? "__Host-" COOKIE_NAME : COOKIE_NAME;
}

/* The value of the first cookie name in a Cookie header at or after hdr, or
 * NULL; *next is where to look for another. */
static const char *cookie_find(const char *hdr, const char *name, size_t *vl, const char **next)
{
	size_t nl = strlen(name);
	for (const char *p = hdr; p && *p;) {
		while (*p == ' ' || *p == ';')
			p++;
		const char *e = strchr(p, ';');
		size_t l = e ? (size_t)(e - p) : strlen(p);
		if (l > nl && strncmp(p, name, nl) == 0 && p[nl] == '=') {
			*vl = l - nl - 1;
			*next = p + l;
			return p + nl + 1;
		}
		p = e;
	}
	return NULL;
}

/* ---- the guest's port, through the verified guest transport (B1, B2) ---- */

/* Connects to the guest transport after the checks of the bridge (the
 * listener's holder; for a microVM also the VM its back-end serves,
 * vmcheck.h). They read the launcher's /proc files, which Landlock keeps
 * from the confined loop: the supervisor runs this for it (guest_connect). */
static int guest_connect_checked(int *out, char *why, size_t whysz)
{
	int fd = -1;
	int e = spaced_peer_connect_listener(G.guest_path, &G.exp, &fd, why, whysz);
	if (e < 0)
		return e;
	if (G.vm.pid > 0) {
		struct spaced_pidref be = SPACED_PIDREF_NULL;
		if (spaced_pidref_from_peer(&be, fd, NULL, NULL) < 0) {
			snprintf(why, whysz, "the guest transport's peer is unknown");
			close(fd);
			return SPACED_EPEER;
		}
		e = spaced_vm_verify(&G.vmc, &G.vm, &be, why, whysz);
		spaced_pidref_done(&be);
		if (e < 0) {
			close(fd);
			return e;
		}
	}
	*out = fd;
	return 0;
}

/* The one descriptor a message carried (SCM_RIGHTS), or -1 when it carried
 * none, more than one or a truncated set: every descriptor it did carry is
 * then closed (a peer that passes two must not leak them here). */
static int one_passed_fd(struct msghdr *mh)
{
	int got = -1, n = 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS || cm->cmsg_len < CMSG_LEN(0))
			continue;
		size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
			if (n++ == 0)
				got = fd;
			else
				close(fd);
		}
	}
	if (n != 1 || (mh->msg_flags & MSG_CTRUNC)) {
		if (got >= 0)
			close(got);
		return -1;
	}
	return got;
}

/* ---- the supervisor: what the confined loop may no longer do itself ----
 *
 * The gateway is two processes. The one the executor starts (the supervisor)
 * sets everything up, listens, writes the port file, waits for a pooled
 * execution's identity, then forks the serving process, which parses what
 * clients send. That one runs as root too, but from its loop on it opens
 * files only to read them and only beneath its record directory (Landlock,
 * where the kernel has it: spaced_confine_files), so a bug that a client's
 * bytes reach cannot read the worker's keys, its records or any other file
 * of the host. Three things it needs lie outside: the guest transport's
 * checks (the launcher's /proc files, B2), the verification keys
 * (STATE/keys.json) and the lease (STATE/lease). The supervisor does exactly
 * these, one request byte each, on a socket pair, and hands back the
 * descriptor (SCM_RIGHTS) with a status and a reason:
 *   'g' the guest transport connected after its checks, 'k' the keys file,
 *   'l' the lease file, each open for reading.
 * It reads no other input from it (the paths and expectations are fixed).
 * When the serving process ends while the launcher runs (a crash, an OOM
 * kill), the supervisor starts another on the same listening socket: the
 * port the control plane knows stays the execution's, connections wait in
 * the backlog meanwhile, cookies stay valid (the cookie key is the
 * supervisor's). Again at once, then after 0.1 s doubling to 10 s while it
 * keeps ending within a minute. When the launcher ends, both end. */
struct helper_reply {
	int32_t err; /* 0, or the spaced error code (SPACED_ENOENT: no such file) */
	char why[200];
};

static struct spaced_confine_filter *serve_filter; /* compiled before the first fork (main) */

static int supervisor_confine(void);

static int helper_do(char what, int *fd, char *why, size_t whysz)
{
	const char *path = what == H_KEYS ? G.keys_path : what == H_LEASE ? G.lease_file : NULL;
	if (what == H_GUEST)
		return guest_connect_checked(fd, why, whysz);
	if (!path) {
		snprintf(why, whysz, "no such request");
		return SPACED_EINVAL;
	}
	*fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (*fd < 0) {
		snprintf(why, whysz, "%s: %s", path, strerror(errno));
		return errno == ENOENT ? SPACED_ENOENT : SPACED_EIO;
	}
	return 0;
}

/* Answers one request of the serving process on s: false once it is gone
 * or does not read its answers. */
static bool helper_serve(int s)
{
	char what;
	ssize_t r = recv(s, &what, 1, MSG_DONTWAIT);
	if (r < 0 && (errno == EINTR || errno == EAGAIN))
		return true;
	if (r != 1)
		return false;
	struct helper_reply rep = {0};
	int fd = -1;
	rep.err = helper_do(what, &fd, rep.why, sizeof rep.why);
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec iov = {.iov_base = &rep, .iov_len = sizeof rep};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (rep.err == 0 && fd >= 0) {
		memset(&u, 0, sizeof u);
		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof u.buf;
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof fd);
	}
	/* never waits: a serving process that asks without reading the answers
	 * (its buffer full) is broken, and is ended (supervise) */
	ssize_t w = sendmsg(s, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	if (fd >= 0)
		close(fd);
	return w == (ssize_t)sizeof rep;
}

/* Whether the launcher has ended (its pidfd readable). */
static bool launcher_ended(int wait_ms)
{
	struct pollfd pf = {.fd = G.pidfd, .events = POLLIN};
	return poll(&pf, 1, wait_ms) > 0;
}

/* Requests answered until the serving process (cfd, pid) has ended or
 * ms have passed (-1: no bound) or the launcher ends (watch_launcher).
 * Returns 1 when the launcher ended, 0 otherwise; *broken when the serving
 * process was ended for not reading its answers. */
static int serve_requests(int s, int cfd, int ms, bool watch_launcher, bool *broken)
{
	uint64_t until = ms >= 0 ? now_ms() + (uint64_t)ms : 0;
	for (;;) {
		int left = ms < 0 ? -1 : (int)(until > now_ms() ? until - now_ms() : 0);
		if (ms >= 0 && left == 0)
			return 0;
		struct pollfd pf[3] = {{.fd = s, .events = POLLIN}, {.fd = cfd, .events = POLLIN},
		                       {.fd = watch_launcher ? G.pidfd : -1, .events = POLLIN}};
		int n = poll(pf, 3, left);
		if (n < 0 && errno != EINTR)
			return 0;
		if (n <= 0)
			continue;
		if (pf[2].revents)
			return 1;
		if ((pf[0].revents & POLLIN) && s >= 0 && !helper_serve(s)) {
			*broken = !(pf[0].revents & (POLLHUP | POLLERR)) && !pf[1].revents;
			return 0;
		}
		if (pf[1].revents || (pf[0].revents & (POLLHUP | POLLERR)))
			return 0;
	}
}

/* The supervisor's part: returns only in a serving process (helper_sock
 * its end of the pair); the supervisor itself ends here, with its launcher.
 * A serving process that was killed (SIGKILL: the OOM killer, an operator)
 * is started again each time; one that crashed (any other signal, an exit it
 * did not mean) SERVE_CRASHES_MAX times at most — each start is a fork of
 * the same supervisor, with its layout and canary, which must not become an
 * oracle for whoever makes it crash; one that could not set itself up
 * (SERVE_SETUP_FAILED) is not: the gateway then ends. */
#define SERVE_CRASHES_MAX 5
#define SERVE_SETUP_FAILED 3 /* the serving process's exit status when it could not set itself up */
static void supervise(void)
{
	prctl(PR_SET_NAME, "spaced-netgtw-s");
	/* confined from the start (a pooled execution's gateway compiles its
	 * filter with the pool's start, not in a create's claim) */
	if (supervisor_confine() < 0) {
		glog("level=error event=confine-failed what=supervisor");
		exit(1);
	}
	uint64_t backoff_ms = 0;
	unsigned restarts = 0, quick = 0, crashes = 0;
	for (;;) {
		int sv[2] = {-1, -1};
		pid_t parent = getpid(), pid = -1;
		if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0 && (pid = fork()) == 0) {
			close(sv[0]);
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (getppid() != parent)
				_exit(0);
			prctl(PR_SET_NAME, "spaced-netgtw");
			helper_sock = sv[1];
			if (G.vmc.qemu.pidfd >= 0) { /* the supervisor's, for its checks */
				close(G.vmc.qemu.pidfd);
				G.vmc.qemu.pidfd = -1;
			}
			return;
		}
		if (pid < 0) {
			glog("level=error event=start-failed reason=\"%s\" next_in_ms=1000", strerror(errno));
			if (sv[0] >= 0) {
				close(sv[0]);
				close(sv[1]);
			}
			if (launcher_ended(1000))
				exit(0);
			continue;
		}
		close(sv[1]);
		int cfd = (int)syscall(SYS_pidfd_open, pid, 0);
		uint64_t started = now_ms();
		bool broken = false;
		int w = 0;
		if (G.identity_pending) {
			/* a pooled execution's: its serving process was forked with the
			 * pool's start and set itself up; the claim's identity is handed
			 * to it (a fork in the claim's path cost milliseconds of CPU in
			 * copy-on-write faults) */
			w = identity_wait(sv[0], cfd);
			if (w < 0 || w == 1) {
				kill(pid, SIGKILL);
				waitpid(pid, NULL, 0);
				exit(w == 1 ? 0 : 1);
			}
			if (w == 0) {
				char msg[sizeof G.idline + 1];
				size_t n = (size_t)((const char *)memchr(G.idline, '\n', G.idlen) - G.idline);
				msg[0] = 'I';
				memcpy(msg + 1, G.idline, n);
				if (send(sv[0], msg, n + 1, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)(n + 1))
					w = 2;
			}
		}
		if (w == 0 && serve_requests(sv[0], cfd, -1, true, &broken) == 1) {
			/* the launcher ended: the serving process sees it too and says
			 * what it served (its questions still answered meanwhile);
			 * then both end */
			serve_requests(sv[0], cfd, 2000, false, &broken);
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
			exit(0);
		}
		close(sv[0]);
		int st = 0;
		kill(pid, SIGKILL); /* one that closed its end but lives on serves without its supervisor: no */
		waitpid(pid, &st, 0);
		if (cfd >= 0)
			close(cfd);
		if (launcher_ended(0))
			exit(0);
		char how[64];
		if (broken)
			snprintf(how, sizeof how, "it did not read its answers");
		else if (WIFSIGNALED(st))
			snprintf(how, sizeof how, "signal %d", WTERMSIG(st));
		else
			snprintf(how, sizeof how, "exit %d", WEXITSTATUS(st));
		if (WIFEXITED(st) && WEXITSTATUS(st) == SERVE_SETUP_FAILED) {
			glog("level=error event=exit reason=\"its serving process could not set itself up\"");
			exit(1);
		}
		bool killed = !broken && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
		if (!killed && ++crashes > SERVE_CRASHES_MAX) {
			glog("level=error event=exit reason=\"its serving process ended %u times (%s): not started again\"",
			     crashes, how);
			exit(1);
		}
		/* at once, then 0.1 s doubling to 10 s while it keeps ending within a minute */
		if (now_ms() - started >= 60000)
			quick = 0;
		backoff_ms = quick == 0 ? 0 : quick == 1 ? 100 : backoff_ms * 2 > 10000 ? 10000 : backoff_ms * 2;
		quick++;
		restarts++;
		glog("level=error event=serving-process-ended how=\"%s\" restarts=%u crashes=%u next_in_ms=%llu", how,
		     restarts, crashes, (unsigned long long)backoff_ms);
		if (backoff_ms > 0 && launcher_ended((int)backoff_ms))
			exit(0);
	}
}

/* Asks the supervisor for what (H_*): 0 with the descriptor in *fd, or its
 * error (the reason in why). A supervisor that is gone: SPACED_ECLOSED. */
static int helper_ask(char what, int *fd, char *why, size_t whysz)
{
	struct helper_reply rep;
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec iov = {.iov_base = &rep, .iov_len = sizeof rep};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	*fd = -1;
	if (send(helper_sock, &what, 1, MSG_NOSIGNAL) != 1) {
		snprintf(why, whysz, "the gateway's supervisor is gone");
		return SPACED_ECLOSED;
	}
	ssize_t r;
	do
		r = recvmsg(helper_sock, &mh, MSG_CMSG_CLOEXEC);
	while (r < 0 && errno == EINTR);
	if (r != (ssize_t)sizeof rep) {
		snprintf(why, whysz, "the gateway's supervisor is gone");
		return SPACED_ECLOSED;
	}
	rep.why[sizeof rep.why - 1] = 0;
	*fd = one_passed_fd(&mh);
	bool has_fd = *fd >= 0;
	if (rep.err == 0 && !has_fd) {
		snprintf(why, whysz, "the gateway's supervisor sent no descriptor");
		return SPACED_EPROTO;
	}
	if (rep.err < 0) {
		if (has_fd)
			close(*fd);
		*fd = -1;
		snprintf(why, whysz, "%s", rep.why);
		return rep.err;
	}
	return 0;
}

/* The guest transport, checked (guest_connect_checked), non-blocking. */
static int guest_connect(int *out, char *why, size_t whysz)
{
	int e = helper_ask(H_GUEST, out, why, whysz);
	if (e == 0)
		fcntl(*out, F_SETFL, O_NONBLOCK);
	return e;
}

/* "CONNECT <port>\n" on a fresh connection (a few bytes: they fit). */
static int send_connect(int fd, uint32_t port)
{
	char line[SPACED_VSOCK_HS_MAX + 1];
	int n = spaced_vsock_hs_format_connect(line, sizeof line, port);
	return n > 0 && send(fd, line, (size_t)n, MSG_NOSIGNAL) == n ? 0 : SPACED_ECLOSED;
}

/* Reads the answer line "OK <n>\n" byte by byte (what follows is the
 * stream's): 1 when it is complete and well-formed, 0 when more must come,
 * < 0 when the other side closed or said something else. */
static int read_answer(struct conn *c)
{
	for (;;) {
		ssize_t r = recv(c->gfd, c->gans + c->ganslen, 1, MSG_DONTWAIT);
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return SPACED_ECLOSED;
		c->ganslen++;
		int l = spaced_vsock_hs_line_len(c->gans, c->ganslen);
		uint32_t v;
		if (l > 0) {
			int ok = spaced_vsock_hs_parse_ok(c->gans, c->ganslen, &v) == 0;
			c->ganslen = 0;
			return ok ? 1 : SPACED_EPROTO;
		}
		if (l < 0 || c->ganslen >= sizeof c->gans)
			return SPACED_EPROTO;
	}
}

/* The process substrate's hand-back: one byte carrying the socket connected
 * to the port inside (spaced-guest fwd.c). 1 with it in *up, 0: later, < 0:
 * nothing listens there (EOF) or something else came. */
static int read_handback(struct conn *c, int *up)
{
	char one;
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec iov = {.iov_base = &one, .iov_len = 1};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	ssize_t r = recvmsg(c->gfd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return 0;
	int fd = r >= 0 ? one_passed_fd(&mh) : -1;
	if (r != 1 || fd < 0) {
		if (fd >= 0)
			close(fd);
		return SPACED_ECLOSED;
	}
	/* whatever the guest sent, it is only ever a byte stream to relay (B4) */
	int type = 0;
	socklen_t tl = sizeof type;
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) < 0 || type != SOCK_STREAM) {
		close(fd);
		return SPACED_EPROTO;
	}
	int on = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
	fcntl(fd, F_SETFL, O_NONBLOCK);
	*up = fd;
	return 1;
}

static void start_relay(struct conn *c, const void *first, size_t n);

static void guest_failed(struct conn *c, int e, const char *why)
{
	G.n_guest_fail++;
	/* a tenant connecting in a loop to a port nothing listens on: a line a
	 * second at most (ten at once), the rest counted */
	if (!G.guest_fail_log || spaced_ratelimit_take(G.guest_fail_log, "guest", spaced_errname(e), spaced_mono_ns()))
		glog("level=warn event=guest-unreachable port=%u code=%s reason=\"%s\"", c->gport, spaced_errname(e), why);
	if (c->gfd >= 0) {
		epoll_ctl(G.ep, EPOLL_CTL_DEL, c->gfd, NULL);
		close(c->gfd);
		c->gfd = -1;
	}
	reply(c, 502, NULL, "{\"code\":\"SPACED_ECLOSED\",\"error\":\"the sandbox's port cannot be reached\"}");
}

/* The port is open: the tunnel's 101, then the relay, first bytes first. */
static void guest_opened(struct conn *c)
{
	if (G.vm.pid > 0) /* the transport connection itself is the stream: registered anew */
		epoll_ctl(G.ep, EPOLL_CTL_DEL, c->gfd, NULL);
	G.n_allow++;
	if (c->tcp) {
		char ident[SPACED_IDENTITY_TEXT_MAX], hdr[1024];
		spaced_identity_encode(&G.rec.id, ident, sizeof ident);
		int n = snprintf(hdr, sizeof hdr,
		                 "HTTP/1.1 101 Switching Protocols\r\nUpgrade: spaced-tcp\r\nConnection: Upgrade\r\n"
		                 "X-Spaced-Identity: %s\r\n\r\n",
		                 ident);
		send_all(c, hdr, (size_t)n);
		if (c->dead)
			return;
	}
	uint8_t *first = c->first;
	c->first = NULL;
	start_relay(c, first, c->nfirst);
	free(first);
}

/* Drives the open of the guest's port (C_GUEST), one answer at a time:
 *   process substrate: CONNECT <port | hand-back> → the launcher's OK →
 *     the guest hands the connected socket back (one byte, SCM_RIGHTS);
 *   microVM: CONNECT <forward port> → the back-end's OK → CONNECT <port> →
 *     the guest's OK once 127.0.0.1:<port> inside is connected (the
 *     connection is the stream; spaced-guest fwd.c).
 * EOF where an answer was due: nothing listens there (502). The loop never
 * waits for the guest: GUEST_OPEN_MS bounds the open (the sweep). */
static void open_step(struct conn *c)
{
	for (;;) {
		if (c->gstep == G_FD) {
			int up = -1, r = read_handback(c, &up);
			if (r == 0)
				return;
			if (r < 0) {
				char why[64];
				snprintf(why, sizeof why, "nothing listens on port %u inside", (unsigned)c->gport);
				guest_failed(c, r, why);
				return;
			}
			epoll_ctl(G.ep, EPOLL_CTL_DEL, c->gfd, NULL);
			close(c->gfd);
			c->gfd = up; /* start_relay registers it */
			guest_opened(c);
			return;
		}
		int r = read_answer(c);
		if (r == 0)
			return;
		if (r < 0) {
			char why[64];
			if (r == SPACED_EPROTO)
				snprintf(why, sizeof why, "malformed handshake answer");
			else if (c->gstep == G_GUEST)
				snprintf(why, sizeof why, "nothing listens on port %u inside", (unsigned)c->gport);
			else
				snprintf(why, sizeof why, "the guest transport closed during the handshake");
			guest_failed(c, r, why);
			return;
		}
		if (G.vm.pid == 0) {
			c->gstep = G_FD;
		} else if (c->gstep == G_TRANSPORT) {
			c->gstep = G_GUEST;
			if (send_connect(c->gfd, c->gport) < 0) {
				guest_failed(c, SPACED_ECLOSED, "the guest's forward port refused CONNECT");
				return;
			}
		} else {
			guest_opened(c);
			return;
		}
	}
}

/* Starts opening the guest's port for an admitted connection; first (n
 * bytes) goes to the guest once it is open. */
static void open_guest(struct conn *c, uint16_t port, bool tcp, const void *first, size_t n)
{
	char why[512] = "";
	c->gport = port;
	c->tcp = tcp;
	if (n > BUF_SZ || (c->first = malloc(n ? n : 1)) == NULL) {
		conn_close(c);
		return;
	}
	memcpy(c->first, first, n);
	c->nfirst = n;
	int e = guest_connect(&c->gfd, why, sizeof why);
	if (e == 0 && send_connect(c->gfd, G.vm.pid > 0 ? G.fwd_port : ((uint32_t)port | GUEST_HANDBACK)) < 0) {
		e = SPACED_ECLOSED;
		snprintf(why, sizeof why, "the guest transport refused CONNECT");
	}
	if (e < 0) {
		guest_failed(c, e, why);
		return;
	}
	c->st = C_GUEST;
	c->gstep = G_TRANSPORT;
	c->ganslen = 0;
	c->gdeadline = now_ms() + GUEST_OPEN_MS;
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = (void *)((uintptr_t)c | 1)};
	epoll_ctl(G.ep, EPOLL_CTL_ADD, c->gfd, &ev);
	c->ev_g = EPOLLIN;
	set_ev(c);
}

static void start_relay(struct conn *c, const void *first, size_t n)
{
	c->up.buf = malloc(BUF_SZ);
	c->down.buf = malloc(BUF_SZ);
	if (!c->up.buf || !c->down.buf || n > BUF_SZ) {
		conn_close(c);
		return;
	}
	memcpy(c->up.buf, first, n);
	c->up.len = n;
	c->st = C_RELAY;
	c->epoch = G.rec.epoch;
	struct epoll_event e = {.events = 0, .data.ptr = (void *)((uintptr_t)c | 1)};
	epoll_ctl(G.ep, EPOLL_CTL_ADD, c->gfd, &e);
	c->ev_g = 0;
	int one = 1;
	setsockopt(c->cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	set_ev(c);
}

static void on_head(struct conn *c, struct spaced_http_req *req, size_t hl)
{
	const char *host = spaced_http_field(req, "host");
	const char *auth = spaced_http_field(req, "authorization");
	const char *upg = spaced_http_field(req, "upgrade");
	const char *cookies = spaced_http_field(req, "cookie");
	bool tcp = upg && strcasecmp(upg, "spaced-tcp") == 0;
	uint16_t port = 0;
	char hsb[SPACED_NAME_MAX] = "";
	bool named = host_names(host, &port, hsb, sizeof hsb);
	/* the gateway's own counters, on its address itself (never on a sandbox port's name) */
	if (!named && !auth && strcmp(req->method, "GET") == 0 && strcmp(req->target, "/metrics") == 0) {
		char m[2048];
		int n = snprintf(m, sizeof m,
		                 "# TYPE spaced_netgtw_opens_total counter\n"
		                 "spaced_netgtw_opens_total{outcome=\"allow\"} %llu\n"
		                 "spaced_netgtw_opens_total{outcome=\"refuse\"} %llu\n"
		                 "# TYPE spaced_netgtw_streams_cut_total counter\nspaced_netgtw_streams_cut_total %llu\n"
		                 "# TYPE spaced_netgtw_streams_kept_total counter\nspaced_netgtw_streams_kept_total %llu\n"
		                 "# TYPE spaced_netgtw_guest_unreachable_total counter\nspaced_netgtw_guest_unreachable_total %llu\n"
		                 "# TYPE spaced_netgtw_connections gauge\nspaced_netgtw_connections %u\n"
		                 "# TYPE spaced_netgtw_audit_suppressed_total counter\nspaced_netgtw_audit_suppressed_total %llu\n"
		                 "# TYPE spaced_netgtw_budget_refusals_total counter\nspaced_netgtw_budget_refusals_total %llu\n"
		                 "# TYPE spaced_netgtw_relay_bytes gauge\nspaced_netgtw_relay_bytes %llu\n",
		                 (unsigned long long)G.n_allow, (unsigned long long)G.n_refuse, (unsigned long long)G.n_cut,
		                 (unsigned long long)G.n_kept, (unsigned long long)G.n_guest_fail, G.nconns,
		                 (unsigned long long)spaced_ratelimit_suppressed_total(G.refusals),
		                 (unsigned long long)G.n_budget, (unsigned long long)G.relay_bytes);
		char h[256];
		int hn = snprintf(h, sizeof h,
		                  "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n"
		                  "Connection: close\r\n\r\n",
		                  n);
		send_all(c, h, (size_t)hn);
		send_all(c, m, (size_t)n);
		conn_close(c);
		return;
	}
	struct spaced_decision d = {SPACED_DENY, SPACED_REASON_MALFORMED};
	struct spaced_cap cap;
	memset(&cap, 0, sizeof cap);
	const char *tok = NULL;
	size_t toklen = 0;
	bool exchange = false, have = false;
	char *qtok = NULL;
	if (auth && strncasecmp(auth, "bearer ", 7) == 0) {
		tok = auth + 7;
		while (*tok == ' ')
			tok++;
		toklen = strlen(tok);
	} else {
		const char *q = strstr(req->target, "spaced_token=");
		if (q && (q[-1] == '?' || q[-1] == '&')) {
			q += 13;
			size_t l = strcspn(q, "&#");
			qtok = strndup(q, l);
			tok = qtok;
			toklen = l;
			exchange = true;
		}
	}
	if (tok && toklen > 0 && toklen <= 4096) {
		int e = spaced_cap_verify(G.kr, G.vc, tok, toklen, SPACED_CLASS_SERVICEPORT, spaced_now(), &cap);
		if (e < 0)
			d = spaced_decision_from_error(e);
		else
			have = true;
	} else if (cookies) {
		/* every cookie of the name (a browser sends those other hosts set
		 * too): the first valid one counts, at most 16 tried */
		size_t vl = 0;
		int e = SPACED_EFORMAT, tried = 0;
		for (const char *at = cookies, *v; e != 0 && tried < 16 && (v = cookie_find(at, cookie_name(), &vl, &at));
		     tried++)
			e = cookie_read(v, vl, &cap);
		if (e == 0)
			have = true;
		else
			d = spaced_decision_from_error(e == SPACED_EFORMAT ? SPACED_EFORMAT : e);
	}
	free(qtok);
	if (!have) {
		refuse(c, d);
		return;
	}
	c->cap = cap; /* named in the audit log when refused below */
	if (!named)
		port = cap.port;
	/* a Host naming another sandbox is another sandbox's request */
	if (named && G.have_rec && strcmp(hsb, G.rec.id.sandbox) != 0) {
		refuse(c, (struct spaced_decision){SPACED_DENY, SPACED_REASON_OTHER_SANDBOX});
		return;
	}
	if (tcp)
		snprintf(c->protocol, sizeof c->protocol, "tcp");
	else if (req->websocket && strcmp(cap.protocol, "ws") == 0)
		snprintf(c->protocol, sizeof c->protocol, "ws");
	else
		snprintf(c->protocol, sizeof c->protocol, "http");
	c->req = (struct spaced_request){.purpose = SPACED_PURPOSE_SERVICEPORT, .port = port, .protocol = c->protocol};
	/* R5: the full identity, the port and the protocol, before the guest is reached */
	d = spaced_compare(&cap, &c->req, G.have_rec ? &G.rec : NULL, SPACED_COMPARE_STRICT);
	if (d.verdict == SPACED_ALLOW && port == 1024) /* the guest API's own port is never a ServicePort */
		d = (struct spaced_decision){SPACED_DENY, SPACED_REASON_WRONG_PORT};
	/* this gateway reaches one execution only: a record of a newer one is not its own */
	if (d.verdict == SPACED_ALLOW && (cap.id.generation != G.self.generation ||
	                                  strcmp(cap.id.worker, G.self.worker) != 0 ||
	                                  strcmp(cap.id.substrate, G.self.substrate) != 0))
		d = (struct spaced_decision){SPACED_REFRESH_ROUTE, cap.id.generation > G.self.generation
		                                                       ? SPACED_REASON_NEWER_GENERATION
		                                                       : SPACED_REASON_OTHER_WORKER};
	/* paused on purpose for a while: its guest is frozen and the open would
	 * wait for a resume that may not come; the client resolves its route
	 * again (as the gate answers). Early in a pause it waits, as before. */
	if (d.verdict == SPACED_ALLOW && G.paused &&
	    spaced_mono_ns() - G.paused_since > SPACED_PAUSE_HOLD_MS * 1000000ull)
		d = (struct spaced_decision){SPACED_REFRESH_ROUTE, SPACED_REASON_PAUSED};
	/* the worker lost its control plane: the sandbox may run elsewhere by now */
	if (d.verdict == SPACED_ALLOW && fenced_now())
		d = (struct spaced_decision){SPACED_REFRESH_ROUTE, SPACED_REASON_FENCED};
	if (d.verdict != SPACED_ALLOW) {
		refuse(c, d);
		return;
	}
	c->cap = cap;
	char ident[SPACED_IDENTITY_TEXT_MAX];
	spaced_identity_encode(&G.rec.id, ident, sizeof ident);
	if (exchange) {
		char ck[256], hdr[10240], loc[8192];
		/* the same target without spaced_token */
		const char *t = req->target, *q = strchr(t, '?');
		size_t w = 0;
		if (q) {
			memcpy(loc, t, (size_t)(q - t));
			w = (size_t)(q - t);
			const char *p = q + 1;
			bool first = true;
			while (*p) {
				const char *e = strchr(p, '&');
				size_t l = e ? (size_t)(e - p) : strlen(p);
				if (!(l >= 13 && strncmp(p, "spaced_token=", 13) == 0) && w + l + 2 < sizeof loc) {
					loc[w++] = first ? '?' : '&';
					memcpy(loc + w, p, l);
					w += l;
					first = false;
				}
				p = e ? e + 1 : p + l;
			}
		} else {
			w = strlen(t) < sizeof loc ? strlen(t) : sizeof loc - 1;
			memcpy(loc, t, w);
		}
		loc[w] = '\0';
		/* a path of this host only: "//host/…" or "/\\host/…" would send
		 * the browser elsewhere (an open redirect) */
		if (loc[0] != '/' || loc[1] == '/' || loc[1] == '\\')
			snprintf(loc, sizeof loc, "/");
		if (cookie_make(&G.rec.id, port, ck, sizeof ck) < 0) {
			reply(c, 500, NULL, "{\"error\":\"cookie\"}");
			return;
		}
		snprintf(hdr, sizeof hdr,
		         "Location: %s\r\nSet-Cookie: %s=%s; Path=/; Max-Age=%d; HttpOnly; SameSite=Lax%s\r\n"
		         "X-Spaced-Identity: %s\r\n",
		         loc, cookie_name(), ck, COOKIE_LIFETIME, G.tls ? "; Secure" : "", ident);
		G.n_allow++;
		reply(c, 302, hdr, "{\"outcome\":\"ALLOW\"}");
		return;
	}
	if (G.relay_bytes + 2u * BUF_SZ > G.relay_budget) {
		G.n_budget++;
		reply(c, 503, "Retry-After: 1\r\n",
		      "{\"error\":\"busy\",\"message\":\"the gateway's streams are at their memory budget\"}");
		return;
	}
	G.relay_bytes += 2u * BUF_SZ;
	c->relay_held = true;
	if (tcp) {
		open_guest(c, port, true, c->head + hl, c->hlen - hl);
		return;
	}
	/* HTTP: the request goes on without the capability; the rest of the
	 * connection is relayed as it comes (one admitted stream) */
	uint8_t *out = malloc(c->hlen + 64);
	if (!out) {
		conn_close(c);
		return;
	}
	size_t o = 0;
	const uint8_t *h = c->head, *end = c->head + hl;
	const uint8_t *eol = memchr(h, '\n', (size_t)(end - h));
	size_t l1 = eol ? (size_t)(eol - h) + 1 : 0;
	memcpy(out, h, l1);
	o = l1;
	for (const uint8_t *p = h + l1; p < end;) {
		const uint8_t *e2 = memchr(p, '\n', (size_t)(end - p));
		size_t l = e2 ? (size_t)(e2 - p) + 1 : (size_t)(end - p);
		bool drop = l >= 14 && strncasecmp((const char *)p, "authorization:", 14) == 0 && auth;
		if (!drop) {
			memcpy(out + o, p, l);
			o += l;
		}
		p += l;
	}
	memcpy(out + o, c->head + hl, c->hlen - hl);
	o += c->hlen - hl;
	open_guest(c, port, false, out, o);
	free(out);
}

static void on_client_head(struct conn *c)
{
	for (;;) {
		ssize_t r = c_recv(c, c->head + c->hlen, sizeof c->head - c->hlen);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && errno == EAGAIN) {
			set_ev(c); /* the TLS handshake may wait to write */
			break;
		}
		if (r <= 0) {
			conn_close(c);
			return;
		}
		c->hlen += (size_t)r;
		if (c->hlen == sizeof c->head)
			break;
	}
	struct spaced_http_limits lim = {HEAD_MAX, 8192, 100};
	struct spaced_http_req req;
	memset(&req, 0, sizeof req);
	int hl = spaced_http_parse_head(c->head, c->hlen, &lim, &req);
	if (hl == 0) {
		if (c->hlen == sizeof c->head)
			reply(c, 431, NULL, "{\"error\":\"request head too large\"}");
		return;
	}
	if (hl < 0) {
		char body[64];
		snprintf(body, sizeof body, "{\"error\":\"bad request\"}");
		reply(c, -hl, NULL, body);
		return;
	}
	on_head(c, &req, (size_t)hl);
	spaced_http_req_clear(&req);
}

/* Moves bytes of one direction (up: client -> guest, else guest -> client):
 * reads what the source has (level-triggered: a short read means it is
 * drained, the loop tells when there is more; TLS may hold decrypted bytes
 * the socket does not show, c_pending) and writes what the sink takes. Two
 * system calls per message in the common case. false when the connection is
 * over. */
static bool pump(struct conn *c, bool up, bool readable)
{
	struct dir *d = up ? &c->up : &c->down;
	for (int rounds = 0; rounds < 8; rounds++) {
		bool again = false;
		if (readable && !d->eof && d->len < BUF_SZ) {
			if (d->len == 0)
				d->off = 0;
			else if (d->off + d->len == BUF_SZ) {
				memmove(d->buf, d->buf + d->off, d->len);
				d->off = 0;
			}
			size_t room = BUF_SZ - d->off - d->len;
			ssize_t r = up ? c_recv(c, d->buf + d->off + d->len, room)
			               : recv(c->gfd, d->buf + d->off + d->len, room, MSG_DONTWAIT);
			if (r > 0) {
				d->len += (size_t)r;
				again = (size_t)r == room || (up && c_pending(c)); /* it may hold more */
			} else if (r == 0) {
				d->eof = true;
			} else if (errno != EAGAIN && errno != EINTR) {
				return false;
			}
		}
		if (d->len > 0) {
			ssize_t w = up ? send(c->gfd, d->buf + d->off, d->len, MSG_DONTWAIT | MSG_NOSIGNAL)
			               : c_send(c, d->buf + d->off, d->len);
			if (w > 0) {
				d->off += (size_t)w;
				d->len -= (size_t)w;
			} else if (w < 0 && errno != EAGAIN && errno != EINTR) {
				return false;
			}
			if (d->len > 0)
				again = false; /* the sink is full: its EPOLLOUT comes back here */
		}
		if (d->eof && d->len == 0 && !d->shut) {
			if (up)
				shutdown(c->gfd, SHUT_WR);
			else
				c_shut(c);
			d->shut = true;
		}
		if (!again)
			break;
	}
	return true;
}

/* An event on one side: the directions it concerns move, and the client's
 * direction whenever TLS holds bytes of it (no event would come for them). */
static void on_relay(struct conn *c, bool guest_side, uint32_t ev)
{
	bool in = (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0, out = (ev & EPOLLOUT) != 0;
	bool ok = true;
	if (guest_side) {
		if (in || out)
			ok = pump(c, false, in) && (!out || pump(c, true, c_pending(c)));
	} else {
		if (in || out)
			ok = pump(c, true, in || c_pending(c)) && (!out || pump(c, false, false));
		/* a TLS write that waited for the socket moves the client's side */
		if (ok && out && c->ssl)
			ok = pump(c, true, c_pending(c));
	}
	if (!ok || (c->up.shut && c->down.shut)) {
		conn_close(c);
		return;
	}
	set_ev(c);
}

static bool same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return false;
	if (a->ss_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	if (a->ss_family == AF_INET6)
		return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
		              sizeof(struct in6_addr)) == 0;
	return true;
}

/* Room for a connection from addr. Past its address's share, or at the
 * budget of connections without an admitted head (or of all connections),
 * the oldest connection still sending its head — of that address, else of
 * any — is closed for it; never an admitted stream. false when there is
 * none to close. */
static bool is_loopback(const struct sockaddr_storage *a)
{
	if (a->ss_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
	if (a->ss_family == AF_INET6)
		return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a)->sin6_addr);
	return false;
}

static bool admit_conn(const struct sockaddr_storage *addr)
{
	unsigned from = 0, heads = 0;
	bool shared = !is_loopback(addr);
	struct conn *oldest = NULL, *oldest_here = NULL;
	for (struct conn *c = G.conns; c; c = c->next) {
		if (c->dead)
			continue;
		bool here = same_addr(&c->addr, addr);
		from += here;
		if (c->st == C_HEAD) {
			heads++;
			if (!oldest || c->t0 <= oldest->t0)
				oldest = c;
			if (here && (!oldest_here || c->t0 <= oldest_here->t0))
				oldest_here = c;
		}
	}
	struct conn *out = NULL;
	if (shared && from >= MAX_CONNS_PER_ADDR)
		out = oldest_here;
	else if (heads >= MAX_HEAD_CONNS || G.nconns >= MAX_CONNS)
		out = oldest;
	else
		return true;
	if (!out)
		return false;
	G.n_budget++;
	conn_close(out);
	return true;
}

static void on_accept(void)
{
	for (int i = 0; i < 64; i++) {
		struct sockaddr_storage addr;
		socklen_t alen = sizeof addr;
		memset(&addr, 0, sizeof addr);
		int fd = accept4(G.lfd, (struct sockaddr *)&addr, &alen, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		if (!admit_conn(&addr)) {
			G.n_budget++;
			close(fd);
			continue;
		}
		struct conn *c = calloc(1, sizeof *c);
		if (!c) {
			close(fd);
			continue;
		}
		c->addr = addr;
		int sb = SOCK_BUF;
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sb, sizeof sb);
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sb, sizeof sb);
		c->cfd = fd;
		c->gfd = -1;
		c->st = C_HEAD;
		if (G.tls && ((c->ssl = SSL_new(G.tls)) == NULL || SSL_set_fd(c->ssl, fd) != 1)) {
			SSL_free(c->ssl);
			free(c);
			close(fd);
			continue;
		}
		if (c->ssl) {
			SSL_set_accept_state(c->ssl);
			SSL_set_mode(c->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
		}
		c->t0 = now_ms();
		c->ev_c = EPOLLIN;
		struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
		epoll_ctl(G.ep, EPOLL_CTL_ADD, fd, &e);
		c->next = G.conns;
		if (G.conns)
			G.conns->prev = c;
		G.conns = c;
		G.nconns++;
	}
}

static int listen_on(const char *hostport)
{
	char host[64];
	const char *colon = strrchr(hostport, ':');
	if (!colon || (size_t)(colon - hostport) >= sizeof host)
		return -1;
	memcpy(host, hostport, (size_t)(colon - hostport));
	host[colon - hostport] = '\0';
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		return -1;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 1024) < 0)
		return -1;
	return fd;
}

static void usage(void)
{
	fprintf(stderr, "usage: spaced-netgtw --listen HOST:PORT --port-file PATH (--record PATH | --record-dir DIR)\n"
	                "                     --keys PATH --guest PATH --launcher-pid PID --launcher-start TICKS\n"
	                "                     --identity TEXT|- [--launcher-exe PATH] [--guest-owner UID] [--audit PATH]\n"
	                "                     [--tls-cert FILE --tls-key FILE] [--relay-budget BYTES] [--lease-file PATH]\n"
	                "                     [--vm-pid PID --forward-port N [--vm-start TICKS] [--vm-exe PATH] [--guest-cid N]]\n");
	exit(2);
}

/* What the serving process's loop calls (confine.h): its client sockets and
 * the descriptors the supervisor hands it, the record it reads, inotify, the
 * audit log it appends to. It runs as root: what a parser bug could do with
 * these is narrowed by their arguments (serve_args). */
static const char *const serve_calls[] = {
	"read", "write", "readv", "writev", "pread64", "close", "epoll_wait", "epoll_pwait", "epoll_ctl", "poll",
	"ppoll", "accept", "accept4", "recvfrom", "sendto", "recvmsg", "sendmsg", "shutdown",
	"setsockopt", "getsockopt", "getsockname", "getpeername", "fcntl", "lseek", "fstat", "newfstatat", "statx",
	"mmap", "munmap", "mremap", "brk", "madvise",
	"mprotect", "clock_gettime", "gettimeofday", "time", "nanosleep", "clock_nanosleep", "exit",
	"exit_group", "rt_sigreturn", "rt_sigprocmask", "rt_sigaction", "restart_syscall", "futex", "getpid",
	"gettid", "getrandom", "getuid", "geteuid", "getgid", "getegid", "uname", "sysinfo", "sched_yield",
	"sigaltstack", "getrlimit", "sched_getaffinity",
};

/* Files are opened for reading only (no write, create, truncate, append or
 * unnamed temporary file: no file's content can be changed through them, and
 * no directory is made); no new socket of any kind; limits only its own
 * (prlimit64 on pid 0: glibc's getrlimit and setrlimit); the serving process
 * signals nothing (no tgkill: glibc's abort then ends it by the filter). */
#define OPEN_WRITES ((uint64_t)(O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND | (O_TMPFILE & ~O_DIRECTORY)))
static const struct spaced_confine_arg serve_args[] = {
	{"openat", 1, {{2, OPEN_WRITES, 0}}},
	{"open", 1, {{1, OPEN_WRITES, 0}}},
	{"prlimit64", 1, {{0, UINT32_MAX, 0}}},
};

/* The supervisor makes these too: the guest transport's checks (its /proc
 * files, unix_diag, the connection), its serving processes (fork, wait,
 * their end) and what one of them does before it confines itself (the
 * filter stacks: a serving process is under both). */
static const char *const supervisor_calls[] = {
	"connect", "readlink", "readlinkat", "getdents64", "pidfd_open", "pidfd_send_signal", "clone", "wait4", "waitid", "kill",
	"prctl", "getppid", "set_robust_list", "rseq", "socketpair", "seccomp", "landlock_create_ruleset",
	"landlock_add_rule", "landlock_restrict_self", "inotify_init1", "inotify_add_watch", "epoll_create1", "tgkill",
};

/* ... and its only new sockets are Unix ones (the guest's transport, the
 * pair) and unix_diag's netlink: no TCP or UDP connection to anything, no
 * raw or packet socket, no netlink that changes routes or the packet filter. */
static const struct spaced_confine_arg supervisor_args[] = {
	{"socket", 1, {{0, UINT32_MAX, AF_UNIX}}},
	{"socket", 2, {{0, UINT32_MAX, AF_NETLINK}, {2, UINT32_MAX, NETLINK_SOCK_DIAG}}},
};

static int supervisor_confine(void)
{
	enum { NS = sizeof serve_calls / sizeof serve_calls[0], NP = sizeof supervisor_calls / sizeof supervisor_calls[0] };
	enum { AS = sizeof serve_args / sizeof serve_args[0], AP = sizeof supervisor_args / sizeof supervisor_args[0] };
	const char *calls[NS + NP];
	struct spaced_confine_arg args[AS + AP];
	memcpy(calls, serve_calls, sizeof serve_calls);
	memcpy(calls + NS, supervisor_calls, sizeof supervisor_calls);
	memcpy(args, serve_args, sizeof serve_args);
	memcpy(args + AS, supervisor_args, sizeof supervisor_args);
	return spaced_confine_syscalls(calls, NS + NP, NULL, 0, args, AS + AP);
}

int main(int argc, char **argv)
{
	const char *listen_s = NULL, *port_file = NULL, *launcher_exe = NULL, *tls_cert = NULL, *tls_key = NULL,
	           *vm_exe = NULL;
	G.vmc = (struct spaced_vm_check)SPACED_VM_CHECK_INIT;
	G.audit_fd = -1;
	G.relay_budget = RELAY_BUDGET;
	/* the relay buffers in mappings of their own, given back when a stream
	 * ends: a gateway whose clients went away holds nothing for them (it
	 * kept 557 MiB of a thousand streams' buffers until its execution ended) */
	mallopt(M_MMAP_THRESHOLD, 128 * 1024);
	mallopt(M_TRIM_THRESHOLD, 1 << 20);
	G.refusals = spaced_ratelimit_audit_deny(); /* NULL (out of memory): every line written */
	G.guest_fail_log = spaced_ratelimit_new(1, 10, 1, 10, 8);
	if (G.refusals)
		spaced_ratelimit_on_summary(G.refusals, refusals_summary, NULL);
	if (G.guest_fail_log)
		spaced_ratelimit_on_summary(G.guest_fail_log, guest_fail_summary, NULL);
	long lpid = 0;
	unsigned long long lstart = 0;
	uid_t owner = 0;
	for (int i = 1; i < argc; i += 2) {
		if (i + 1 >= argc)
			usage();
		const char *o = argv[i], *v = argv[i + 1];
		if (strcmp(o, "--listen") == 0)
			listen_s = v;
		else if (strcmp(o, "--port-file") == 0)
			port_file = v;
		else if (strcmp(o, "--record") == 0)
			G.record_path = v;
		else if (strcmp(o, "--record-dir") == 0)
			G.record_dir = v;
		else if (strcmp(o, "--lease-file") == 0)
			G.lease_file = v;
		else if (strcmp(o, "--tls-cert") == 0)
			tls_cert = v;
		else if (strcmp(o, "--tls-key") == 0)
			tls_key = v;
		else if (strcmp(o, "--keys") == 0)
			G.keys_path = v;
		else if (strcmp(o, "--guest") == 0)
			G.guest_path = v;
		else if (strcmp(o, "--launcher-pid") == 0)
			lpid = atol(v);
		else if (strcmp(o, "--launcher-start") == 0)
			lstart = strtoull(v, NULL, 10);
		else if (strcmp(o, "--launcher-exe") == 0)
			launcher_exe = v;
		else if (strcmp(o, "--guest-owner") == 0)
			owner = (uid_t)atol(v);
		else if (strcmp(o, "--vm-pid") == 0)
			G.vm.pid = (pid_t)atol(v);
		else if (strcmp(o, "--vm-start") == 0)
			G.vm.start_time = strtoull(v, NULL, 10);
		else if (strcmp(o, "--vm-exe") == 0)
			vm_exe = v;
		else if (strcmp(o, "--guest-cid") == 0)
			G.vm.guest_cid = (uint32_t)strtoul(v, NULL, 10);
		else if (strcmp(o, "--forward-port") == 0)
			G.fwd_port = (uint32_t)strtoul(v, NULL, 10);
		else if (strcmp(o, "--relay-budget") == 0)
			G.relay_budget = strtoull(v, NULL, 10);
		else if (strcmp(o, "--audit") == 0) {
			G.audit_fd = open(v, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
		} else if (strcmp(o, "--identity") == 0) {
			if (strcmp(v, "-") == 0)
				G.identity_pending = true;
			else if (spaced_identity_decode(&G.self, v, strlen(v)) < 0)
				usage();
		}
		else
			usage();
	}
	if (!listen_s || !G.record_path == !G.record_dir || !G.keys_path || !G.guest_path || lpid <= 1 ||
	    G.relay_budget < 2u * BUF_SZ ||
	    (G.self.sandbox[0] == 0 && !G.identity_pending))
		usage();
	/* a microVM's gateway names its VM and the guest's forward port, or neither */
	if ((G.vm.pid != 0) != (G.fwd_port != 0) || G.vm.pid < 0 ||
	    ((vm_exe || G.vm.start_time || G.vm.guest_cid) && G.vm.pid == 0))
		usage();
	if (vm_exe) {
		if (spaced_exe_id_of_path(vm_exe, false, &G.vm.exe) < 0) {
			glog("level=error event=bad-vm-exe path=%s", vm_exe);
			return 2;
		}
		G.vm.check_exe = true;
	}
	if (G.record_dir && !G.identity_pending)
		record_path_set();
	if (!tls_cert != !tls_key)
		usage();
	if (tls_cert) {
		char terr[512];
		if (spaced_tls_server_ctx(tls_cert, tls_key, NULL, false, &G.tls, terr, sizeof terr) < 0) {
			glog("level=error event=tls reason=\"%s\"", terr);
			return 2;
		}
	}
	if (sodium_init() < 0)
		return 1;
	prctl(PR_SET_NAME, "spaced-netgtw");
	signal(SIGPIPE, SIG_IGN);
	randombytes_buf(G.cookie_key, sizeof G.cookie_key);
	G.exp.owner_uid = owner;
	G.exp.pid = (pid_t)lpid;
	G.exp.start_time = lstart;
	if (launcher_exe) {
		if (spaced_exe_id_of_path(launcher_exe, false, &G.exp.exe) < 0) {
			glog("level=error event=bad-launcher-exe path=%s", launcher_exe);
			return 2;
		}
		G.exp.check_exe = true;
	}
	G.pidfd = (int)syscall(SYS_pidfd_open, (pid_t)lpid, 0);
	uint64_t st = 0;
	if (G.pidfd < 0 || spaced_proc_start_time((pid_t)lpid, &st) < 0 || st != lstart) {
		glog("level=error event=launcher-gone pid=%ld", lpid);
		return 1;
	}
	if (spaced_keyring_new(&G.kr) < 0 || spaced_vcache_new(&G.vc, 4096) < 0)
		return 1;
	G.lfd = listen_on(listen_s);
	if (G.lfd < 0) {
		glog("level=error event=listen address=%s reason=\"%s\"", listen_s, strerror(errno));
		return 1;
	}
	struct sockaddr_in sa;
	socklen_t sl = sizeof sa;
	getsockname(G.lfd, (struct sockaddr *)&sa, &sl);
	if (port_file) {
		char pf[4200], buf[16];
		snprintf(pf, sizeof pf, "%s.tmp", port_file);
		FILE *f = fopen(pf, "w");
		if (!f)
			return 1;
		snprintf(buf, sizeof buf, "%u", ntohs(sa.sin_port));
		fputs(buf, f);
		if (fclose(f) != 0 || rename(pf, port_file) < 0)
			return 1;
	}
	/* the serving process's filter, compiled once here (supervise forks it) */
	if (spaced_confine_prepare(serve_calls, sizeof serve_calls / sizeof serve_calls[0], NULL, 0, serve_args,
	                           sizeof serve_args / sizeof serve_args[0], &serve_filter) < 0) {
		glog("level=error event=confine-failed what=prepare");
		return 1;
	}
	/* the supervisor stays here; what follows is the serving process's */
	supervise();
	char tmp[4096];
	snprintf(tmp, sizeof tmp, "%s", G.keys_path);
	snprintf(G.keys_base, sizeof G.keys_base, "%s", basename(tmp));
	G.ino = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	G.rec_wd = G.keys_wd = -1;
	/* the keys' directory (replaced by rename), then the keys */
	snprintf(tmp, sizeof tmp, "%s", G.keys_path);
	if (G.ino < 0 || (G.keys_wd = inotify_add_watch(G.ino, dirname(tmp), IN_CLOSE_WRITE | IN_MOVED_TO)) < 0) {
		glog("level=error event=inotify reason=\"%s\"", strerror(errno));
		return SERVE_SETUP_FAILED;
	}
	keys_load();
	if (G.identity_pending && identity_take() < 0)
		return SERVE_SETUP_FAILED;
	/* the record's directory (the gate replaces the record by rename) */
	snprintf(tmp, sizeof tmp, "%s", G.record_path);
	snprintf(G.record_base, sizeof G.record_base, "%s", basename(tmp));
	if (record_watch() < 0) {
		glog("level=error event=inotify reason=\"%s\"", strerror(errno));
		return SERVE_SETUP_FAILED;
	}
	record_load();
	G.ep = epoll_create1(EPOLL_CLOEXEC);
	static int tag_ino, tag_pid, tag_supervisor;
	struct epoll_event e = {.events = EPOLLIN, .data.ptr = NULL};
	epoll_ctl(G.ep, EPOLL_CTL_ADD, G.lfd, &e);
	e.data.ptr = &tag_ino;
	epoll_ctl(G.ep, EPOLL_CTL_ADD, G.ino, &e);
	e.data.ptr = &tag_pid;
	epoll_ctl(G.ep, EPOLL_CTL_ADD, G.pidfd, &e);
	/* the supervisor's end of the pair answers nothing unasked: its hang-up only */
	e = (struct epoll_event){.events = 0, .data.ptr = &tag_supervisor};
	epoll_ctl(G.ep, EPOLL_CTL_ADD, helper_sock, &e);
	/* from here on files are read only beneath the record directory, and
	 * only the calls of this loop are made: a parser bug that a client's
	 * bytes reach can read nothing else and run nothing else (confine.h) */
	char rdir[4096];
	snprintf(rdir, sizeof rdir, "%s", G.record_path);
	const char *reads[] = {dirname(rdir)}; /* its own record's directory only */
	int lr = spaced_confine_files(reads, 1);
	if (lr < 0 && lr != SPACED_ENOENT) {
		glog("level=error event=confine-failed what=landlock");
		return SERVE_SETUP_FAILED;
	}
	/* the filter the supervisor compiled before it forked this process:
	 * loading it is one system call (compiling it took milliseconds of CPU,
	 * which a claim must not pay) */
	if (!serve_filter || spaced_confine_apply(serve_filter) < 0) {
		glog("level=error event=confine-failed what=seccomp");
		return SERVE_SETUP_FAILED;
	}
	glog("level=info event=serving port=%u sandbox=%s files=%s", ntohs(sa.sin_port),
	     G.have_rec ? G.rec.id.sandbox : "-", lr == 0 ? "beneath-dir" : "any(no-landlock)");
	struct epoll_event evs[64];
	uint64_t last_sweep = now_ms();
	for (;;) {
		/* the sweep's tick only while there are connections: an idle gateway
		 * (one per execution) sleeps until a client, a record or its launcher */
		int n = epoll_wait(G.ep, evs, 64,
		                   G.conns || spaced_ratelimit_pending(G.refusals) || spaced_ratelimit_pending(G.guest_fail_log)
		                       ? 1000
		                       : -1);
		if (n < 0 && errno != EINTR)
			return 1;
		for (int i = 0; i < n; i++) {
			void *p = evs[i].data.ptr;
			if (p == NULL) {
				on_accept();
			} else if (p == &tag_ino) {
				on_inotify();
			} else if (p == &tag_supervisor) {
				/* confined, it reaches its guest and reads its keys only
				 * through its supervisor: without it, it ends (as
				 * PDEATHSIG would have it) */
				glog("level=error event=exit reason=\"its supervisor is gone\"");
				return 1;
			} else if (p == &tag_pid) {
				spaced_ratelimit_flush(G.refusals, 0, true);
				spaced_ratelimit_flush(G.guest_fail_log, 0, true);
				glog("level=info event=exit reason=\"the launcher ended\" allowed=%llu refused=%llu cut=%llu kept=%llu",
				     (unsigned long long)G.n_allow, (unsigned long long)G.n_refuse, (unsigned long long)G.n_cut,
				     (unsigned long long)G.n_kept);
				return 0;
			} else {
				struct conn *c = (struct conn *)((uintptr_t)p & ~(uintptr_t)1);
				if (c->dead)
					continue;
				bool guest_side = ((uintptr_t)p & 1) != 0;
				if (c->st == C_HEAD)
					on_client_head(c);
				else if (c->st == C_GUEST && guest_side)
					open_step(c);
				else if (c->st == C_GUEST && (evs[i].events & (EPOLLHUP | EPOLLERR)))
					conn_close(c); /* the client went away while its port was being opened */
				else
					on_relay(c, guest_side, evs[i].events);
			}
		}
		/* closed connections are freed after the batch (events may still name them) */
		uint64_t t = now_ms();
		bool sweep = t - last_sweep > 1000;
		if (sweep) {
			last_sweep = t;
			spaced_ratelimit_flush(G.refusals, spaced_mono_ns(), false);
			spaced_ratelimit_flush(G.guest_fail_log, spaced_mono_ns(), false);
			/* the lease ended with no gate to say so: the streams end too */
			bool was = G.lease_ended;
			if (fenced_now() && !was && G.lease_ended) {
				glog("level=warn event=fenced reason=\"the worker's lease ended\"");
				streams_recheck();
			}
		}
		for (struct conn *c = G.conns, *nx; c; c = nx) {
			nx = c->next;
			if (sweep && !c->dead && c->st == C_HEAD && t - c->t0 > HEAD_TIMEOUT_MS)
				reply(c, 408, NULL, "{\"error\":\"request head timeout\"}");
			if (sweep && !c->dead && c->st == C_GUEST && t >= c->gdeadline)
				guest_failed(c, SPACED_ETIMEDOUT, "the guest did not answer in time");
			if (c->dead)
				conn_free(c);
		}
	}
}
