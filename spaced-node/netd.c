/*
 * netd.c — spaced-netd: the resolver of a worker's executions (docs/network.md).
 *
 *   spaced-netd --dir STATE/net [--upstream IP[:PORT]] [--idle SECONDS]
 *
 * It listens on UDP port 53 inside the egress namespace (every DNS packet an
 * execution sends, to any server, is redirected there by the base ruleset)
 * and asks the upstream resolver (default: the first nameserver of the host's
 * /etc/resolv.conf) from the host's own network namespace. The execution is
 * known by the packet's source address (the /30 of its slot; the packet
 * filter drops any other source), its policy by STATE/net/slot/N.json,
 * re-read whenever that file changes. For each question:
 *   - AAAA: an empty answer (executions have IPv4 only);
 *   - a name under a deny_out domain: REFUSED, and the addresses upstream
 *     gives for it are pinned into dpin_N (refused by the filter for their TTL);
 *   - a name under an allow_out domain: asked upstream, and its addresses are
 *     pinned into pin_N (reachable for max(TTL, 60 s), at most 1 h);
 *   - any other name: asked upstream in mode allow, REFUSED in mode deny.
 * An answer that holds an address of the closed set that the policy's CIDRs
 * do not open (a name resolving to 127.0.0.1, 10.x, the worker's own
 * address: rebinding) is replaced by an empty answer; the filter would refuse
 * the connection anyway. A policy's CIDRs open a part of the closed set only
 * where the operator made it openable (the slot file's "openable"). Malformed packets are dropped; nothing a client
 * sends ends the daemon. It exits when the egress namespace is gone, and
 * takes an idle one down: when no execution has had a link in it for --idle
 * seconds, it unmounts and removes STATE/net/ns under STATE/net/lock (the
 * lock every execution start holds while it attaches), so pasta (which quits
 * when its namespace's file goes) and this daemon end; the next execution
 * start makes everything again. A worker that is gone for good leaves nothing
 * running.
 *
 * Confined: its loop makes only the calls of loop_calls (seccomp), and reads
 * files only beneath STATE/net, writing, making and removing none (Landlock,
 * where the kernel has it): a bug that an execution's packets reach cannot
 * read the worker's keys or anything else root could. The teardown's steps
 * (the lock file opened to write, umount2, unlink: Landlock forbids all
 * three) run in a helper forked before, which answers one byte per request
 * on a socket pair and makes only the calls they need.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <nftables/libnftables.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <net/if.h>
#include <linux/netlink.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "confine.h"
#include "dnsmsg.h"
#include "netpolicy.h"
#include "spaced_error.h"

#define POOL 0x64580000u /* net.h NET_POOL */
#define SLOTS 16383u
/* questions waiting for the upstream resolver: the table is the resolver's
 * for all executions, each of which may have PENDING_SLOT in it (at 1024 in
 * all, one sandbox asking for names the upstream was slow on took every
 * place, and every other sandbox's questions were dropped) */
#define PENDING 32768
#define PENDING_SLOT 64
#define PENDING_MS 5000
#define PIN_MIN 60
#define PIN_MAX 3600
#define OWN_MAX 64
/* queries per second and burst one execution may ask: a sandbox flooding the
 * resolver slows only its own lookups */
#define IDLE_S 60 /* --idle's default */
#define RATE 200.0
#define BURST 400.0

struct slotpol {
	double tokens;     /* queries it may still ask now (RATE per second, BURST at most) */
	uint64_t refill;   /* when tokens were last topped up (ms) */
	time_t mtime;
	long mtime_ns;
	ino_t ino;
	bool valid;
	uint32_t addr;
	char sandbox[64];
	struct spaced_netpolicy pol;
	struct spaced_net_rule openable[SPACED_NET_RULES_MAX]; /* what its allow_out may open of the closed set */
	size_t nopenable;
	struct spaced_net_rule closed[SPACED_NET_RULES_MAX]; /* what the operator added to the closed set */
	size_t nclosed;
};

enum action { A_PASS = 1, A_PIN, A_DENYPIN };

struct pending {
	bool used;
	uint16_t id, client_id;
	struct sockaddr_in client;
	uint32_t slot;
	enum action act;
	char name[256];
	uint64_t t;
};

static const char *dir;
static struct slotpol *cache[SLOTS];
static struct pending pend[PENDING];
static uint16_t pend_of[SLOTS]; /* the places each slot holds in pend */
static struct nft_ctx *nft;
static uint32_t own[OWN_MAX];
static size_t nown;
static uint64_t n_queries, n_refused, n_pinned, n_stripped, n_dropped;

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Gives pe's place back (its slot's count with it). */
static void pend_free(struct pending *pe)
{
	if (!pe->used)
		return;
	pe->used = false;
	if (pe->slot < SLOTS && pend_of[pe->slot] > 0)
		pend_of[pe->slot]--;
}

/* Gives back the places of questions upstream never answered in time. */
static void pend_sweep(void)
{
	uint64_t t = now_ms();
	for (size_t i = 0; i < PENDING; i++)
		if (pend[i].used && t - pend[i].t > PENDING_MS)
			pend_free(&pend[i]);
}

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (n > 0)
		fprintf(stderr, "spaced-netd %s\n", buf);
}

/* CIDR rules from a JSON array of CIDR texts (at most SPACED_NET_RULES_MAX;
 * what is not one is skipped). Returns the count. */
static size_t cidr_rules(const json_t *list, struct spaced_net_rule *out)
{
	size_t i, n = 0;
	json_t *v;
	json_array_foreach(list, i, v) {
		if (n < SPACED_NET_RULES_MAX && json_is_string(v) && spaced_cidr_parse(json_string_value(v), &out[n].cidr) == 0) {
			out[n].is_domain = false;
			n++;
		}
	}
	return n;
}

/* The policy of slot k, re-read when its file changed; NULL when none. */
static const struct slotpol *policy_of(uint32_t k)
{
	char path[4200];
	struct stat st;
	snprintf(path, sizeof path, "%s/slot/%u.json", dir, (unsigned)k);
	if (stat(path, &st) < 0)
		return NULL;
	struct slotpol *c = cache[k];
	if (c && c->valid && c->mtime == st.st_mtim.tv_sec && c->mtime_ns == st.st_mtim.tv_nsec && c->ino == st.st_ino)
		return c;
	if (!c && (c = cache[k] = calloc(1, sizeof *c)) == NULL)
		return NULL;
	c->valid = false;
	json_error_t jerr;
	json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	struct spaced_cidr a;
	const char *sb = json_string_value(json_object_get(j, "sandbox"));
	const char *ad = json_string_value(json_object_get(j, "addr"));
	if (sb && ad && spaced_cidr_parse(ad, &a) == 0 &&
	    spaced_netpolicy_from_json(json_object_get(j, "policy"), &c->pol, NULL, 0) == 0) {
		snprintf(c->sandbox, sizeof c->sandbox, "%s", sb);
		c->addr = a.addr;
		/* the operator's --net-openable and --net-closed (a slot file without them: nothing) */
		c->nopenable = cidr_rules(json_object_get(j, "openable"), c->openable);
		c->nclosed = cidr_rules(json_object_get(j, "closed"), c->closed);
		c->mtime = st.st_mtim.tv_sec;
		c->mtime_ns = st.st_mtim.tv_nsec;
		c->ino = st.st_ino;
		c->valid = true;
	}
	json_decref(j);
	return c->valid ? c : NULL;
}

/* ---- DNS messages (dnsmsg.h) ---- */

static uint16_t rd16(const uint8_t *p)
{
	return (uint16_t)((p[0] << 8) | p[1]);
}

/* An answer of no records to the question in q[0..qend): rcode 0 (NODATA) or 5 (REFUSED). */
static size_t answer_empty(uint8_t *q, size_t qend, int rcode)
{
	q[2] = (uint8_t)(0x80 | (q[2] & 0x79)); /* QR, opcode kept, RD kept */
	q[3] = (uint8_t)(0x80 | (rcode & 15));  /* RA */
	memset(q + 6, 0, 6);                      /* an, ns, ar */
	return qend;
}

static bool is_own(uint32_t a)
{
	for (size_t i = 0; i < nown; i++)
		if (own[i] == a)
			return true;
	return false;
}

static void pin(uint32_t slot, bool deny, const uint32_t *addrs, const uint32_t *ttls, size_t na)
{
	if (na == 0)
		return;
	char cmd[4096];
	int w = snprintf(cmd, sizeof cmd, "add element inet spaced %s_%u { ", deny ? "dpin" : "pin", (unsigned)slot);
	for (size_t i = 0; i < na && w < (int)sizeof cmd - 64; i++) {
		uint32_t t = ttls[i] < PIN_MIN ? PIN_MIN : ttls[i] > PIN_MAX ? PIN_MAX : ttls[i];
		uint32_t a = addrs[i];
		w += snprintf(cmd + w, sizeof cmd - (size_t)w, "%s%u.%u.%u.%u timeout %us", i ? ", " : "", a >> 24,
		              (a >> 16) & 255, (a >> 8) & 255, a & 255, (unsigned)t);
	}
	snprintf(cmd + w, sizeof cmd - (size_t)w, " }");
	if (nft_run_cmd_from_buffer(nft, cmd) != 0)
		logf_("level=warn event=pin-failed slot=%u reason=\"%s\"", (unsigned)slot, nft_ctx_get_error_buffer(nft));
	else
		n_pinned += na;
}

static void on_query(int srv, int up)
{
	uint8_t m[4096];
	struct sockaddr_in from;
	socklen_t fl = sizeof from;
	ssize_t r = recvfrom(srv, m, sizeof m, 0, (struct sockaddr *)&from, &fl);
	if (r < 12 || fl != sizeof from)
		return;
	size_t n = (size_t)r;
	n_queries++;
	uint32_t src = ntohl(from.sin_addr.s_addr);
	if (src < POOL || src >= POOL + 4 * SLOTS || (src - POOL) % 4 != 2) {
		n_dropped++;
		return;
	}
	uint32_t slot = (src - POOL) / 4;
	char name[SPACED_DNS_NAME_MAX];
	uint16_t qtype, qclass;
	size_t qend;
	if (spaced_dns_query(m, n, name, &qtype, &qclass, &qend) < 0) {
		n_dropped++;
		return;
	}
	const struct slotpol *sp = policy_of(slot);
	if (!sp || sp->addr != src) {
		n_dropped++;
		return;
	}
	struct slotpol *rl = cache[slot];
	uint64_t tn = now_ms();
	if (rl->refill == 0)
		rl->tokens = BURST;
	else
		rl->tokens += (double)(tn - rl->refill) * RATE / 1000.0;
	if (rl->tokens > BURST)
		rl->tokens = BURST;
	rl->refill = tn;
	if (rl->tokens < 1.0) {
		n_dropped++;
		return;
	}
	rl->tokens -= 1.0;
	const struct spaced_netpolicy *p = &sp->pol;
	enum action act = A_PASS;
	size_t len = 0;
	bool deny = spaced_net_domain_match(p->deny_out, p->ndeny, name);
	bool allow = !deny && spaced_net_domain_match(p->allow_out, p->nallow, name);
	if (qclass != 1) {
		len = answer_empty(m, qend, 5);
	} else if (qtype == 28) {
		len = answer_empty(m, qend, 0); /* AAAA: IPv4 only */
	} else if (deny) {
		if (qtype != 1)
			len = answer_empty(m, qend, 5);
		act = A_DENYPIN;
	} else if (allow) {
		act = A_PIN;
	} else if (p->allow) {
		act = A_PASS;
	} else {
		len = answer_empty(m, qend, 5);
	}
	if (len > 0) {
		if (m[3] & 15)
			n_refused++;
		sendto(srv, m, len, MSG_DONTWAIT, (struct sockaddr *)&from, sizeof from);
		return;
	}
	/* forward with an id of ours, within the slot's places */
	uint64_t t = now_ms();
	struct pending *pe = NULL;
	uint16_t id = 0;
	if (slot >= SLOTS || pend_of[slot] >= PENDING_SLOT) {
		n_dropped++;
		return;
	}
	for (int tries = 0; tries < 16 && !pe; tries++) {
		id = (uint16_t)randombytes_uniform(65536);
		struct pending *c = &pend[id % PENDING];
		if (!c->used || t - c->t > PENDING_MS)
			pe = c;
	}
	if (!pe) {
		n_dropped++;
		return;
	}
	pend_free(pe);
	memset(pe, 0, sizeof *pe);
	pend_of[slot]++;
	pe->used = true;
	pe->id = id;
	pe->client_id = rd16(m);
	pe->client = from;
	pe->slot = slot;
	pe->act = act;
	pe->t = t;
	snprintf(pe->name, sizeof pe->name, "%s", name);
	m[0] = (uint8_t)(id >> 8);
	m[1] = (uint8_t)id;
	if (send(up, m, qend < n ? n : qend, MSG_DONTWAIT) < 0)
		pend_free(pe);
}

static void on_answer(int srv, int up)
{
	uint8_t m[4096];
	ssize_t r = recv(up, m, sizeof m, 0);
	if (r < 12)
		return;
	size_t n = (size_t)r;
	uint16_t id = rd16(m);
	struct pending *pe = &pend[id % PENDING];
	if (!pe->used || pe->id != id || now_ms() - pe->t > PENDING_MS)
		return;
	uint32_t addrs[64], ttls[64];
	size_t na = 0, qend;
	if (spaced_dns_answer_a(m, n, pe->name, &qend, addrs, ttls, 64, &na) < 0)
		return; /* not the answer to this question: the real one may still come */
	pend_free(pe);
	const struct slotpol *sp = policy_of(pe->slot);
	bool closed = na > 64; /* more addresses than it reads: not trusted either */
	for (size_t i = 0; i < na && i < 64; i++) {
		bool opened = sp && spaced_net_cidr_match(sp->pol.allow_out, sp->pol.nallow, addrs[i]) &&
		              spaced_net_cidr_match(sp->openable, sp->nopenable, addrs[i]);
		bool in_closed = spaced_net_closed(addrs[i]) || is_own(addrs[i]) ||
		                 (sp && spaced_net_cidr_match(sp->closed, sp->nclosed, addrs[i]));
		if (in_closed && !opened)
			closed = true;
	}
	if (na > 64)
		na = 64;
	m[0] = (uint8_t)(pe->client_id >> 8);
	m[1] = (uint8_t)pe->client_id;
	size_t len = n;
	if (pe->act == A_DENYPIN) {
		if (!closed)
			pin(pe->slot, true, addrs, ttls, na);
		len = answer_empty(m, qend, 5);
		n_refused++;
	} else if (closed) {
		/* a name that leads into the closed set resolves to nothing here */
		len = answer_empty(m, qend, 0);
		n_stripped++;
		logf_("level=info event=answer-stripped slot=%u name=%s", (unsigned)pe->slot, pe->name);
	} else if (pe->act == A_PIN && sp) {
		pin(pe->slot, false, addrs, ttls, na);
	}
	sendto(srv, m, len, MSG_DONTWAIT, (struct sockaddr *)&pe->client, sizeof pe->client);
}

static int parse_hostport(const char *s, struct sockaddr_in *sa)
{
	char host[64];
	const char *c = strchr(s, ':');
	unsigned port = 53;
	size_t hl = c ? (size_t)(c - s) : strlen(s);
	if (hl == 0 || hl >= sizeof host)
		return -1;
	memcpy(host, s, hl);
	host[hl] = '\0';
	if (c) {
		char *end;
		unsigned long v = strtoul(c + 1, &end, 10);
		if (*end || v == 0 || v > 65535)
			return -1;
		port = (unsigned)v;
	}
	memset(sa, 0, sizeof *sa);
	sa->sin_family = AF_INET;
	sa->sin_port = htons((uint16_t)port);
	return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -1;
}

static int host_resolver(char *out, size_t outsz)
{
	FILE *f = fopen("/etc/resolv.conf", "r");
	char line[256];
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f)) {
		char a[64];
		if (sscanf(line, " nameserver %63s", a) == 1 && strchr(a, ':') == NULL) {
			snprintf(out, outsz, "%s", a);
			fclose(f);
			return 0;
		}
	}
	fclose(f);
	return -1;
}

/* True when an execution's link (sx<k>) is in the egress namespace. */
static bool links_present(void)
{
	struct if_nameindex *ni = if_nameindex();
	bool any = false;
	for (struct if_nameindex *p = ni; p && p->if_index != 0; p++)
		if (strncmp(p->if_name, "sx", 2) == 0)
			any = true;
	if (ni)
		if_freenameindex(ni);
	return any;
}

/* Takes the idle namespace down under the attach lock; false when an
 * execution start holds the lock or a link came meanwhile. */
static bool teardown(const char *nsp)
{
	char lock[4200], p[4200];
	snprintf(lock, sizeof lock, "%s/lock", dir);
	/* the worker's state may be gone with everything in it but the mount:
	 * then nothing can attach any more, and the namespace goes without a lock */
	int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0 && errno != ENOENT)
		return false;
	if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) < 0) {
		close(fd);
		return false;
	}
	if (links_present()) {
		close(fd);
		return false;
	}
	umount2(nsp, MNT_DETACH);
	unlink(nsp);
	snprintf(p, sizeof p, "%s/netd.pid", dir);
	unlink(p);
	if (fd >= 0)
		close(fd);
	return true;
}

/* The teardown helper's end of its socket pair (-1: none; teardown runs here). */
static int teardown_sock = -1;

/* What the teardown helper calls: its socket pair, the lock file, the
 * routing netlink socket (links_present), the unmount and the unlinks. */
static const char *const helper_calls[] = {
	"read", "write", "close", "openat", "open", "flock", "umount2", "unlink", "unlinkat", "bind", "sendto",
	"recvfrom", "recvmsg", "sendmsg", "getsockname", "getsockopt", "fstat", "newfstatat", "mmap", "munmap", "brk", "madvise",
	"mremap", "exit", "exit_group", "rt_sigreturn", "getpid", "gettid", "futex",
};
static const struct spaced_confine_arg helper_args[] = {
	{"socket", 2, {{0, UINT32_MAX, AF_NETLINK}, {2, UINT32_MAX, NETLINK_ROUTE}}},
};

/* Forks the helper that takes the idle namespace down when asked: one byte
 * in, one byte out (1: taken down, then it ends; 0: not now). It ends with
 * its parent (the socket's end, or PDEATHSIG). 0, or -1 (teardown() then
 * runs in this process). */
static int teardown_helper_start(const char *nsp, int keep_a, int keep_b)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		return -1;
	pid_t parent = getpid(), pid = fork();
	if (pid < 0) {
		close(sv[0]);
		close(sv[1]);
		return -1;
	}
	if (pid == 0) {
		close(sv[0]);
		close(keep_a);
		close(keep_b);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(0);
		prctl(PR_SET_NAME, "spaced-netd-td");
		if (spaced_confine_syscalls(helper_calls, sizeof helper_calls / sizeof helper_calls[0], NULL, 0, helper_args,
		                            sizeof helper_args / sizeof helper_args[0]) < 0)
			_exit(1);
		for (;;) {
			char c;
			if (read(sv[1], &c, 1) != 1)
				_exit(0);
			char done = teardown(nsp) ? 1 : 0;
			if (write(sv[1], &done, 1) != 1 || done)
				_exit(0);
		}
	}
	close(sv[1]);
	teardown_sock = sv[0];
	return 0;
}

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* teardown(), through the helper when there is one. A helper that is gone
 * is said once: the idle namespace then stays up (this daemon serves on;
 * the worker's stop takes it down). */
static bool teardown_idle(const char *nsp)
{
	static bool said;
	char c = 't', done = 0;
	if (teardown_sock < 0)
		return teardown(nsp);
	errno = 0;
	if (write(teardown_sock, &c, 1) == 1 && read(teardown_sock, &done, 1) == 1)
		return done == 1;
	if (!said)
		logf_("level=error event=teardown-helper-gone reason=\"%s\": the idle namespace stays up",
		      errno ? strerror(errno) : "it closed its socket");
	said = true;
	return false;
}

/* What the resolver's loop calls (confine.h): its two UDP sockets, the
 * packet filter's netlink (libnftables), the slot files it reads and the
 * teardown helper's socket; socket only as loop_args says. Without the
 * helper (it could not be started), the teardown's flock, umount2 and
 * unlink too (loop_teardown_calls). */
static const char *const loop_teardown_calls[] = {"flock", "umount2", "unlink", "unlinkat"};
static const char *const loop_calls[] = {
	"read", "write", "readv", "writev", "pread64", "close", "poll", "ppoll", "select", "pselect6", "recvfrom",
	"sendto", "recvmsg",
	"sendmsg", "bind", "connect", "getsockname", "getpeername", "setsockopt", "getsockopt", "fcntl",
	"openat", "open", "getdents64", "lseek", "fstat", "newfstatat", "statx", "statfs", "fstatfs",
	"mmap", "munmap", "mremap", "brk", "madvise", "mprotect",
	"clock_gettime", "gettimeofday", "time", "nanosleep", "clock_nanosleep", "exit", "exit_group",
	"rt_sigreturn", "rt_sigprocmask", "rt_sigaction", "restart_syscall", "futex", "getpid", "gettid",
	"getrandom", "getuid", "geteuid", "getgid", "getegid", "uname", "sysinfo", "sigaltstack", "tgkill",
	"getrlimit", "prlimit64",
};

/* It runs as root, in the egress namespace every execution's traffic
 * crosses: its only new sockets are netlink ones, the packet filter's
 * (libnftables: the pins) and the routing one's (getifaddrs: are there links
 * left?). No TCP or UDP socket to anything, no raw or packet socket that
 * could read or forge the executions' traffic. */
static const struct spaced_confine_arg loop_args[] = {
	{"socket", 2, {{0, UINT32_MAX, AF_NETLINK}, {2, UINT32_MAX, NETLINK_NETFILTER}}},
	{"socket", 2, {{0, UINT32_MAX, AF_NETLINK}, {2, UINT32_MAX, NETLINK_ROUTE}}},
};

int main(int argc, char **argv)
{
	const char *upstream = NULL;
	char hostres[64];
	long idle_s = IDLE_S;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--dir") == 0)
			dir = argv[i + 1];
		else if (strcmp(argv[i], "--upstream") == 0)
			upstream = argv[i + 1];
		else if (strcmp(argv[i], "--idle") == 0)
			idle_s = strtol(argv[i + 1], NULL, 10);
	}
	if (!dir || idle_s < 1 || idle_s > 86400) {
		fprintf(stderr, "usage: spaced-netd --dir STATE/net [--upstream IP[:PORT]] [--idle SECONDS (1..86400)]\n");
		return 2;
	}
	if (sodium_init() < 0)
		return 1;
	if (!upstream) {
		if (host_resolver(hostres, sizeof hostres) < 0) {
			logf_("level=error event=no-upstream reason=\"no IPv4 nameserver in /etc/resolv.conf\"");
			return 1;
		}
		upstream = hostres;
	}
	struct sockaddr_in usa;
	if (parse_hostport(upstream, &usa) < 0) {
		logf_("level=error event=bad-upstream upstream=%s", upstream);
		return 2;
	}
	prctl(PR_SET_NAME, "spaced-netd");
	signal(SIGPIPE, SIG_IGN);
	/* the worker's own addresses, from the host's namespace */
	struct ifaddrs *ifa = NULL;
	if (getifaddrs(&ifa) == 0) {
		for (struct ifaddrs *p = ifa; p && nown < OWN_MAX; p = p->ifa_next)
			if (p->ifa_addr && p->ifa_addr->sa_family == AF_INET)
				own[nown++] = ntohl(((struct sockaddr_in *)(void *)p->ifa_addr)->sin_addr.s_addr);
		freeifaddrs(ifa);
	}
	/* upstream: a socket of the host's namespace */
	int up = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (up < 0 || connect(up, (struct sockaddr *)&usa, sizeof usa) < 0) {
		logf_("level=error event=upstream-socket reason=\"%s\"", strerror(errno));
		return 1;
	}
	char nsp[4200];
	snprintf(nsp, sizeof nsp, "%s/ns", dir);
	int nsfd = open(nsp, O_RDONLY | O_CLOEXEC);
	if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) < 0) {
		logf_("level=error event=setns path=%s reason=\"%s\"", nsp, strerror(errno));
		return 1;
	}
	close(nsfd);
	int srv = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(53)};
	int one = 1;
	setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (srv < 0 || bind(srv, (struct sockaddr *)&sa, sizeof sa) < 0) {
		logf_("level=error event=bind reason=\"%s\"", strerror(errno));
		return 1;
	}
	/* every sandbox's queries wait in this one socket: room for the bursts
	 * the filter lets through from many links at once (each link at most
	 * 400 a second, net_setup.c) */
	int rcvbuf = 4 << 20;
	(void)setsockopt(srv, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf);
	nft = nft_ctx_new(NFT_CTX_DEFAULT);
	if (!nft)
		return 1;
	nft_ctx_buffer_output(nft);
	nft_ctx_buffer_error(nft);
	/* the teardown's steps in a helper, then from here on only the calls of
	 * this loop, and only reads beneath dir: a bug that an execution's
	 * packets reach can run nothing else and read nothing else (confine.h) */
	bool helper = teardown_helper_start(nsp, srv, up) == 0;
	if (!helper)
		logf_("level=warn event=no-teardown-helper reason=\"%s\": the loop keeps the teardown's calls", strerror(errno));
	const char *calls[sizeof loop_calls / sizeof loop_calls[0] + sizeof loop_teardown_calls / sizeof loop_teardown_calls[0]];
	size_t ncalls = 0;
	for (size_t i = 0; i < sizeof loop_calls / sizeof loop_calls[0]; i++)
		calls[ncalls++] = loop_calls[i];
	for (size_t i = 0; !helper && i < sizeof loop_teardown_calls / sizeof loop_teardown_calls[0]; i++)
		calls[ncalls++] = loop_teardown_calls[i];
	const char *reads[] = {dir};
	int lr = helper ? spaced_confine_files(reads, 1) : SPACED_ENOENT;
	if (lr < 0 && lr != SPACED_ENOENT) {
		logf_("level=error event=confine-failed what=landlock");
		return 1;
	}
	if (spaced_confine_syscalls(calls, ncalls, NULL, 0, loop_args, sizeof loop_args / sizeof loop_args[0]) < 0) {
		logf_("level=error event=confine-failed what=seccomp");
		return 1;
	}
	logf_("level=info event=ready upstream=%s files=%s", upstream,
	      lr == 0 ? "beneath-dir" : helper ? "any(no-landlock)" : "any(no-helper)");
	uint64_t last_check = now_ms(), last_link = now_ms();
	for (;;) {
		struct pollfd pf[2] = {{.fd = srv, .events = POLLIN}, {.fd = up, .events = POLLIN}};
		int k = poll(pf, 2, 1000);
		if (k < 0 && errno != EINTR)
			return 1;
		for (int i = 0; i < 64 && (pf[0].revents & POLLIN); i++) {
			on_query(srv, up);
			struct pollfd q = {.fd = srv, .events = POLLIN};
			if (poll(&q, 1, 0) <= 0)
				break;
		}
		for (int i = 0; i < 64 && (pf[1].revents & POLLIN); i++) {
			on_answer(srv, up);
			struct pollfd q = {.fd = up, .events = POLLIN};
			if (poll(&q, 1, 0) <= 0)
				break;
		}
		if (now_ms() - last_check > 2000) {
			last_check = now_ms();
			pend_sweep();
			if (links_present())
				last_link = last_check;
			else if (last_check - last_link > (uint64_t)idle_s * 1000u && teardown_idle(nsp)) {
				logf_("level=info event=exit reason=\"no execution for %ld s: the egress namespace is taken down\"",
				      idle_s);
				return 0;
			}
			struct statfs sf;
			if (statfs(nsp, &sf) < 0 || (unsigned long)sf.f_type != 0x6e736673ul) {
				logf_("level=info event=exit reason=\"the egress namespace is gone\" queries=%llu refused=%llu "
				      "pinned=%llu stripped=%llu dropped=%llu",
				      (unsigned long long)n_queries, (unsigned long long)n_refused, (unsigned long long)n_pinned,
				      (unsigned long long)n_stripped, (unsigned long long)n_dropped);
				return 0;
			}
		}
	}
}
