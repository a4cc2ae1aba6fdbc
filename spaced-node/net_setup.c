/*
 * net_setup.c — the egress namespace, pasta, spaced-netd and each
 * execution's veth and packet filter (net.h, docs/network.md).
 *
 * Layout of STATE/net/:
 *   ns            the egress namespace (an nsfs bind mount)
 *   lock          taken while the namespace, pasta and netd are made ready
 *   pasta.pid, pasta.log, netd.pid, netd.log
 *   policy/S.json the stored policy of sandbox S (what an install or a
 *                 `net` message last said)
 *   slot/N.json   what runs behind sx<N>: {"sandbox","addr","policy"}; the
 *                 resolver reads it
 *
 * ip(8) and nft(8) are run inside the namespaces they change (setns in a
 * child, then exec); nothing of an execution's files is ever executed.
 */
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <libgen.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libnetfilter_conntrack/libnetfilter_conntrack.h>
#include <nftables/libnftables.h>
#include <sodium.h>

#include "spaced_error.h"
#include "log.h"
#include "netpolicy.h"
#include "pidref.h"
#include "helper_spawn.h"
#include "substrate.h"

#define NSFS_MAGIC_ 0x6e736673
#define IP_BIN "/usr/sbin/ip"
#define NFT_BIN "/usr/sbin/nft"
#define PASTA_BIN "/usr/bin/pasta"
#define TC_BIN "/usr/sbin/tc"

static void why_set(char *why, size_t whysz, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void why_set(char *why, size_t whysz, const char *fmt, ...)
{
	va_list ap;
	if (!why || whysz == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(why, whysz, fmt, ap);
	va_end(ap);
}

static int net_dir(const struct mgr_config *cfg, const char *sub, char *out, size_t outsz)
{
	int n = snprintf(out, outsz, "%s/net%s%s", cfg->state_dir, sub[0] ? "/" : "", sub);
	return (n < 0 || (size_t)n >= outsz) ? SPACED_ETOOBIG : 0;
}

bool net_enabled(const struct mgr_config *cfg)
{
	return cfg->launch_bin && cfg->host_bin && access(PASTA_BIN, X_OK) == 0 && access(NFT_BIN, X_OK) == 0 &&
	       access(IP_BIN, X_OK) == 0;
}

static void addr_text(uint32_t a, char out[16])
{
	snprintf(out, 16, "%u.%u.%u.%u", a >> 24, (a >> 16) & 255, (a >> 8) & 255, a & 255);
}

/* A netns file entered by a spawned child (spawn.h); 0 or -1. */
static int enter_ns(const char *nspath, int type)
{
	int fd = open(nspath, O_RDONLY | O_CLOEXEC);
	return fd < 0 || setns(fd, type) < 0 ? -1 : 0;
}

/* Reads what a child says on fd (closed here) until its end: the first
 * bufsz - 1 bytes into buf, NUL-terminated and its newlines made spaces (one
 * line for a log), the rest read and dropped (the child never blocks on a
 * full pipe). Returns the bytes kept. */
static size_t read_said(int fd, char *buf, size_t bufsz)
{
	size_t got = 0;
	for (;;) {
		ssize_t r = read(fd, buf + got, bufsz - 1 - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
		if (got == bufsz - 1) {
			char sink[256];
			while (read(fd, sink, sizeof sink) > 0)
				;
			break;
		}
	}
	buf[got] = '\0';
	close(fd);
	for (char *p = buf; *p; p++)
		if (*p == '\n')
			*p = ' ';
	return got;
}

/* What run_in's child needs, prepared before it starts. */
struct run_child {
	const char *nspath;
	const char *const *argv;
	int in, err;
};

static int run_child(void *arg)
{
	const struct run_child *c = arg;
	if (c->nspath && enter_ns(c->nspath, CLONE_NEWNET) < 0) {
		static const char msg[] = "cannot enter the network namespace at ";
		(void)!write(c->err, msg, sizeof msg - 1);
		(void)!write(c->err, c->nspath, strlen(c->nspath));
		return 126;
	}
	dup2(c->in, 0);
	int nul = open("/dev/null", O_WRONLY);
	if (nul >= 0)
		dup2(nul, 1);
	dup2(c->err, 2);
	return spaced_spawn_exec(c->argv, false);
}

/* Runs argv in the network namespace at nspath (NULL: this one), input on its
 * stdin; its stderr (first bytes) goes to why. Returns 0 when it exited 0. */
static int run_in(const char *nspath, const char *const argv[], const char *input, char *why, size_t whysz)
{
	int in[2] = {-1, -1}, err[2] = {-1, -1};
	if (pipe2(in, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) {
		why_set(why, whysz, "pipe: %s", strerror(errno));
		for (int i = 0; i < 2; i++)
			if (in[i] >= 0)
				close(in[i]);
		return SPACED_ESYS;
	}
	struct run_child c = {.nspath = nspath, .argv = argv, .in = in[0], .err = err[1]};
	pid_t pid = spaced_spawn(run_child, &c);
	if (pid < 0) {
		why_set(why, whysz, "spawn: %s", strerror(errno));
		close(in[0]);
		close(in[1]);
		close(err[0]);
		close(err[1]);
		return SPACED_ESYS;
	}
	close(in[0]);
	close(err[1]);
	if (input) {
		size_t left = strlen(input);
		const char *p = input;
		signal(SIGPIPE, SIG_IGN);
		while (left > 0) {
			ssize_t w = write(in[1], p, left);
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				break;
			p += w;
			left -= (size_t)w;
		}
	}
	close(in[1]);
	char buf[512];
	(void)read_said(err[0], buf, sizeof buf);
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return SPACED_ESYS;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	why_set(why, whysz, "%s failed: %s", argv[0], buf[0] ? buf : "(no message)");
	return SPACED_EIO;
}

/* Runs an nft script in the network namespace at nspath: through
 * libnftables, in a child forked for it (it enters the namespace; this
 * process stays where it is). No nft program is started (a policy's
 * transaction takes 0.3-1 ms; starting nft took 5-15 ms more). The child
 * says how it went once the kernel has taken the transaction, and this
 * process goes on without waiting for it to end: its exit, closing its
 * nftables netlink socket, waits for an RCU grace period (15 ms here). It
 * is reaped by whoever reaps this process's children (the executor, a
 * subreaper, for its jobs' orphans). nft's error message (its first bytes)
 * goes to why. */
static int nft_in(const char *nspath, const char *script, char *why, size_t whysz)
{
	int err[2];
	if (pipe2(err, O_CLOEXEC) < 0) {
		why_set(why, whysz, "pipe: %s", strerror(errno));
		return SPACED_ESYS;
	}
	pid_t pid = fork();
	if (pid < 0) {
		why_set(why, whysz, "fork: %s", strerror(errno));
		close(err[0]);
		close(err[1]);
		return SPACED_ESYS;
	}
	if (pid == 0) {
		close(err[0]);
		if (enter_ns(nspath, CLONE_NEWNET) < 0) {
			static const char msg[] = "cannot enter the network namespace";
			(void)!write(err[1], msg, sizeof msg - 1);
			_exit(126);
		}
		struct nft_ctx *nft = nft_ctx_new(NFT_CTX_DEFAULT);
		if (!nft || nft_ctx_buffer_output(nft) < 0 || nft_ctx_buffer_error(nft) < 0)
			_exit(125);
		int r = nft_run_cmd_from_buffer(nft, script);
		const char *msg = r != 0 ? nft_ctx_get_error_buffer(nft) : NULL;
		(void)!write(err[1], r == 0 ? "+" : "-", 1);
		if (msg)
			(void)!write(err[1], msg, strlen(msg));
		close(err[1]);
		_exit(r == 0 ? 0 : 1);
	}
	close(err[1]);
	char buf[512];
	size_t got = read_said(err[0], buf, sizeof buf);
	if (got >= 1 && buf[0] == '+') {
		(void)waitpid(pid, NULL, WNOHANG);
		return 0;
	}
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return SPACED_ESYS;
	why_set(why, whysz, "nft failed: %s", got > 1 ? buf + 1 : "(no message)");
	return SPACED_EIO;
}

/* The child's part of sysctl_in and link_exists. */
struct ns_child {
	const char *nspath;
	const char *file, *value; /* sysctl_in */
	const char *ifname;       /* link_exists */
};

static int sysctl_child(void *arg)
{
	const struct ns_child *c = arg;
	if (enter_ns(c->nspath, CLONE_NEWNET) < 0)
		return 1;
	/* /proc/sys/net follows the network namespace of the process reading it */
	int s = open(c->file, O_WRONLY | O_CLOEXEC);
	size_t n = strlen(c->value);
	return s >= 0 && write(s, c->value, n) == (ssize_t)n ? 0 : 1;
}

static int link_child(void *arg)
{
	const struct ns_child *c = arg;
	if (enter_ns(c->nspath, CLONE_NEWNET) < 0)
		return 1;
	return if_nametoindex(c->ifname) != 0 ? 0 : 1;
}

/* fn's child run to its end: its exit status, or -1. */
static int spawn_wait(spaced_spawn_fn fn, void *arg)
{
	pid_t pid = spaced_spawn(fn, arg);
	if (pid < 0)
		return -1;
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Writes value into a /proc/sys file as seen from the network namespace at nspath. */
static int sysctl_in(const char *nspath, const char *file, const char *value)
{
	struct ns_child c = {.nspath = nspath, .file = file, .value = value};
	return spawn_wait(sysctl_child, &c) == 0 ? 0 : SPACED_EIO;
}

static bool link_exists(const char *nspath, const char *ifname)
{
	struct ns_child c = {.nspath = nspath, .ifname = ifname};
	return spawn_wait(link_child, &c) == 0;
}

static bool is_nsfs(const char *path)
{
	struct statfs sf;
	return statfs(path, &sf) == 0 && (unsigned long)sf.f_type == NSFS_MAGIC_;
}

/* Replaces path with text through a rename (path.tmp, reused when
 * prepared: spaced_file_replace); durable: the text is on disk before the
 * rename (fsync), else only in the page cache (a file derived again after a
 * crash). */
static int write_atomic(const char *path, const char *text, bool durable)
{
	char tmp[4200];
	if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
		return SPACED_ETOOBIG;
	return spaced_file_replace(tmp, path, text, strlen(text), 0600, durable);
}

/* pasta runs as passt.avx2 where the CPU has AVX2 */
static const char *const pasta_names[] = {"passt.avx2", "passt", "pasta", "pasta.avx2"};

/* The pid in pidfile, 0 without one. */
static long pidfile_pid(const char *pidfile)
{
	char buf[64];
	FILE *f = fopen(pidfile, "r");
	if (!f)
		return 0;
	long pid = fgets(buf, sizeof buf, f) != NULL ? strtol(buf, NULL, 10) : 0;
	fclose(f);
	return pid > 1 ? pid : 0;
}

/* Whether process pid is named comm (/proc/PID/comm). */
static bool pid_named(long pid, const char *comm)
{
	char path[64], name[32];
	snprintf(path, sizeof path, "/proc/%ld/comm", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	bool ok = fgets(name, sizeof name, f) != NULL;
	fclose(f);
	name[ok ? strcspn(name, "\n") : 0] = '\0';
	return ok && strcmp(name, comm) == 0;
}

/* Stops the process pidfile names when its name is one of names (SIGTERM,
 * then SIGKILL after 2 s); true when one was running. Its pidfd is taken
 * first, then its name read, then the pidfd checked again: a pid reused in
 * between is neither taken for it nor signalled. */
static bool stop_pidfile(const char *pidfile, const char *const *names, size_t nnames)
{
	long pid = pidfile_pid(pidfile);
	struct spaced_pidref ref = SPACED_PIDREF_NULL;
	if (pid == 0 || spaced_pidref_from_pid(&ref, (pid_t)pid) < 0)
		return false;
	bool named = false;
	for (size_t i = 0; i < nnames && !named; i++)
		named = pid_named(pid, names[i]);
	if (!named || spaced_pidref_check(&ref) != 0) {
		spaced_pidref_done(&ref);
		return false;
	}
	(void)spaced_pidref_signal(&ref, SIGTERM);
	for (int t = 0; t < 40 && spaced_pidref_check(&ref) == 0; t++)
		usleep(50000);
	if (spaced_pidref_check(&ref) == 0)
		(void)spaced_pidref_signal(&ref, SIGKILL);
	spaced_pidref_done(&ref);
	return true;
}

int net_down(const char *state_dir, char *why, size_t whysz)
{
	char ns[4200], np[4200], pp[4200];
	snprintf(ns, sizeof ns, "%s/net/ns", state_dir);
	snprintf(np, sizeof np, "%s/net/netd.pid", state_dir);
	snprintf(pp, sizeof pp, "%s/net/pasta.pid", state_dir);
	static const char *const netd[] = {"spaced-netd"};
	bool d = stop_pidfile(np, netd, 1);
	bool p = stop_pidfile(pp, pasta_names, sizeof pasta_names / sizeof pasta_names[0]);
	bool m = is_nsfs(ns);
	if (m && umount2(ns, MNT_DETACH) < 0) {
		why_set(why, whysz, "umount %s: %s", ns, strerror(errno));
		return SPACED_ESYS;
	}
	unlink(np);
	unlink(pp);
	fprintf(stderr, "spaced-node: net-down: resolver %s, pasta %s, namespace %s\n", d ? "stopped" : "not running",
	        p ? "stopped" : "not running", m ? "unmounted" : "not mounted");
	return 0;
}

/* True when the process in pidfile runs and its name is comm. */
static bool pidfile_alive(const char *pidfile, const char *comm)
{
	long pid = pidfile_pid(pidfile);
	return pid != 0 && pid_named(pid, comm);
}

/* Starts argv detached (own session, stdin and stdout /dev/null, stderr to
 * logp) and writes its pid to pidfile. nofile_max: with its open-file limit
 * raised to the hard one (pasta holds two per connection it carries). */
struct daemon_child {
	const char *const *argv;
	const char *logp;
	bool nofile_max;
	char cpu_home[4200]; /* the cgroup.procs it moves itself to, "" for none */
};

static int daemon_child(void *arg)
{
	const struct daemon_child *c = arg;
	setsid();
	/* the worker's network serves every sandbox: at the default
	 * priority and out of the background CPU cgroup, whatever the job
	 * that first needed it ran at (a pool's start runs below it) */
	setpriority(PRIO_PROCESS, 0, 0);
	if (c->cpu_home[0]) {
		int fd = open(c->cpu_home, O_WRONLY | O_CLOEXEC);
		if (fd >= 0) {
			(void)!write(fd, "0", 1);
			close(fd);
		}
	}
	struct rlimit rl;
	if (c->nofile_max && getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	int nul = open("/dev/null", O_RDWR);
	int log = open(c->logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (nul >= 0) {
		dup2(nul, 0);
		dup2(nul, 1);
	}
	if (log >= 0)
		dup2(log, 2);
	return spaced_spawn_exec_fresh(c->argv);
}

static int spawn_daemon(const char *const argv[], const char *logp, const char *pidfile, bool nofile_max)
{
	struct daemon_child c = {.argv = argv, .logp = logp, .nofile_max = nofile_max};
	if (spaced_sub_background_cpu_home(c.cpu_home, sizeof c.cpu_home) < 0)
		c.cpu_home[0] = '\0';
	pid_t pid = spaced_spawn(daemon_child, &c);
	if (pid < 0)
		return SPACED_ESYS;
	char buf[32];
	snprintf(buf, sizeof buf, "%d\n", (int)pid);
	return write_atomic(pidfile, buf, true);
}

/* The base ruleset: every rule that is not one sandbox's. Re-applied in one
 * transaction whenever the namespace is made ready (the worker's own
 * addresses may have changed). */
/* The DNS flows (conntrack entries: a query, its answer) one slot may hold
 * to the resolver at once. Every execution's queries pass the egress
 * namespace's one conntrack table (net.netfilter.nf_conntrack_max entries,
 * the rest of the worker's egress too): five sandboxes that kept answered
 * queries alive (a packet after each answer, then one a minute) filled it,
 * and every other sandbox's connections and queries were dropped ("table
 * full"). Each slot gets an equal part of half of the table, at least 64:
 * 504 with 256 slots and the default table of 262144 (with 5 s per
 * answered flow, about 100 queries a second). */
static uint32_t slot_count(const struct mgr_config *cfg);

static unsigned dns_flows_per_slot(const struct mgr_config *cfg)
{
	uint64_t max = 0;
	FILE *f = fopen("/proc/sys/net/netfilter/nf_conntrack_max", "re");
	if (f) {
		unsigned long long v;
		if (fscanf(f, "%llu", &v) == 1)
			max = v;
		fclose(f);
	}
	if (max == 0)
		max = 65536; /* conntrack not loaded yet: a small machine's table */
	uint64_t n = max > 8192 ? (max - 4096) / 2 / slot_count(cfg) : 64;
	return n < 64 ? 64 : n > 65536 ? 65536 : (unsigned)n;
}

static int apply_base(const struct mgr_config *cfg, const char *ns, char *why, size_t whysz)
{
	char *s = NULL;
	size_t sl = 0;
	FILE *f = open_memstream(&s, &sl);
	if (!f)
		return SPACED_ENOMEM;
	fprintf(f, "add table inet spaced\n"
	           "add set inet spaced closed { type ipv4_addr; flags interval; auto-merge; }\n"
	           "add set inet spaced openable { type ipv4_addr; flags interval; auto-merge; }\n"
	           "add map inet spaced sbxmap { type ifname : verdict; }\n"
	           /* the connections executions hold beyond their guaranteed share
	            * (net_conn_share); never flushed: it counts live connections */
	           "add set inet spaced pool { type inet_proto; size 16; flags dynamic; }\n"
	           /* the DNS flows each sandbox holds to the resolver (dns_flows_per_slot);
	            * never flushed either */
	           "add set inet spaced dnscnt { type ifname; size 65535; flags dynamic; }\n"
	           /* the DNS packets each sandbox's link may send a second */
	           "add set inet spaced dnsrate { type ifname; size 65535; flags dynamic; timeout 60s; }\n"
	           /* a DNS flow is done once answered: its entry goes 5 s after the
	            * answer (10 s unanswered: the resolver waits up to 5 s upstream),
	            * not after the 30 or 120 s of UDP */
	           "add ct timeout inet spaced dns { protocol udp; l3proto ip; policy = { unreplied : 10, replied : 5 }; }\n"
	           /* a packet from a sandbox's link with a source that link does not
	            * lead to is dropped before anything reads it: root in a microVM
	            * owns its guest's network stack, and the resolver attributes a
	            * query to a sandbox by its source (reverse path, strict) */
	           "add chain inet spaced rpf { type filter hook prerouting priority raw; }\n"
	           "add chain inet spaced forward { type filter hook forward priority filter; policy drop; }\n"
	           "add chain inet spaced input { type filter hook input priority filter; policy accept; }\n"
	           "add chain inet spaced pre { type nat hook prerouting priority dstnat; }\n"
	           "add chain inet spaced post { type nat hook postrouting priority srcnat; }\n"
	           /* a connection past its sandbox's count, refused at once: a TCP
	            * reset (ICMP answers are rate-limited, the client would wait) */
	           "add chain inet spaced refuse\n"
	           "flush chain inet spaced refuse\n"
	           "add rule inet spaced refuse meta l4proto tcp reject with tcp reset\n"
	           "add rule inet spaced refuse reject with icmp type admin-prohibited\n"
	           "flush set inet spaced closed\n"
	           "flush set inet spaced openable\n"
	           "flush chain inet spaced rpf\n"
	           "flush chain inet spaced forward\n"
	           "flush chain inet spaced input\n"
	           "flush chain inet spaced pre\n"
	           "flush chain inet spaced post\n");
	fprintf(f, "add element inet spaced closed { ");
	for (size_t i = 0; i < spaced_net_closed_default_n; i++) {
		char c[32];
		spaced_cidr_format(&spaced_net_closed_default[i], c, sizeof c);
		fprintf(f, "%s%s", i ? ", " : "", c);
	}
	/* the worker's own addresses, as this host has them now */
	struct ifaddrs *ifa = NULL;
	if (getifaddrs(&ifa) == 0) {
		for (struct ifaddrs *p = ifa; p; p = p->ifa_next) {
			if (!p->ifa_addr || p->ifa_addr->sa_family != AF_INET)
				continue;
			char a[16];
			addr_text(ntohl(((struct sockaddr_in *)(void *)p->ifa_addr)->sin_addr.s_addr), a);
			fprintf(f, ", %s", a);
		}
		freeifaddrs(ifa);
	}
	/* and what the operator adds to it */
	for (size_t i = 0; i < cfg->net_nclosed; i++) {
		char c[32];
		spaced_cidr_format(&cfg->net_closed[i], c, sizeof c);
		fprintf(f, ", %s", c);
	}
	fprintf(f, " }\n");
	/* what the operator lets a sandbox's allow_out open of it */
	for (size_t i = 0; i < cfg->net_nopenable; i++) {
		char c[32];
		spaced_cidr_format(&cfg->net_openable[i], c, sizeof c);
		fprintf(f, "add element inet spaced openable { %s }\n", c);
	}
	fprintf(f,
	        "add rule inet spaced rpf iifname \"sx*\" meta nfproto ipv4 fib saddr . iif oif missing drop\n"
	        /* answers come back only to what a sandbox opened */
	        "add rule inet spaced forward iifname \"up0\" oifname \"sx*\" ct state established,related accept\n"
	        "add rule inet spaced forward meta nfproto ipv6 drop\n"
	        /* a sandbox reaches the uplink only: never another sandbox */
	        "add rule inet spaced forward iifname \"sx*\" oifname != \"up0\" drop\n"
	        "add rule inet spaced forward ip daddr 100.88.255.252/30 drop\n"
	        "add rule inet spaced forward iifname vmap @sbxmap\n"
	        /* the egress namespace itself answers DNS and nothing else */
	        /* at most 400 DNS packets a second from one link (burst 800), before
	         * anything else: the resolver's own budget per sandbox (200/s) is
	         * kept after its one socket has read a packet, and a guest's flood
	         * of queries on one flow (established: no new conntrack entry)
	         * overflowed that socket for every sandbox of the worker */
	        "add rule inet spaced input iifname \"sx*\" meta nfproto ipv4 udp dport 53 "
	        "update @dnsrate { iifname limit rate over 400/second burst 800 packets } drop\n"
	        "add rule inet spaced input iifname \"sx*\" ct state established,related accept\n"
	        "add rule inet spaced input iifname \"sx*\" meta nfproto ipv4 udp dport 53 ct state new "
	        "add @dnscnt { iifname ct count over %u } drop\n"
	        /* (on the flow not yet confirmed, which the conntrack hook made) */
	        "add rule inet spaced input iifname \"sx*\" meta nfproto ipv4 udp dport 53 ct timeout set \"dns\" accept\n"
	        "add rule inet spaced input iifname \"sx*\" drop\n"
	        "add rule inet spaced input iifname \"up0\" ct state established,related accept\n"
	        "add rule inet spaced input iifname \"up0\" drop\n"
	        /* every DNS query, to whatever server, goes to the worker's resolver */
	        "add rule inet spaced pre iifname \"sx*\" meta nfproto ipv4 meta l4proto { tcp, udp } th dport 53 "
	        "redirect to :53\n"
	        /* pasta sends a UDP flow from a host socket bound to the flow's
	         * source port (TCP from an ephemeral one): the sandboxes' UDP
	         * leaves from the ephemeral range and above, never from a port of
	         * the host's services (a sandbox sending from 5353 had made pasta
	         * hold the host's 0.0.0.0:5353) */
	        /* (random: a source port already in the range is not kept either) */
	        "add rule inet spaced post oifname \"up0\" meta l4proto udp masquerade to :" NET_UDP_PORTS " random\n"
	        "add rule inet spaced post oifname \"up0\" masquerade\n",
	        dns_flows_per_slot(cfg));
	fclose(f);
	int e = nft_in(ns, s, why, whysz);
	free(s);
	return e;
}

static const char *netd_bin(const struct mgr_config *cfg, char *buf, size_t bufsz)
{
	char tmp[4096];
	snprintf(tmp, sizeof tmp, "%s", cfg->launch_bin);
	snprintf(buf, bufsz, "%s/spaced-netd", dirname(tmp));
	return buf;
}

/* The executions the worker may run at once: one slot each. */
static uint32_t slot_count(const struct mgr_config *cfg)
{
	return cfg->uid_slots && cfg->uid_slots < NET_SLOTS ? cfg->uid_slots : NET_SLOTS;
}

/* What pasta can carry: the connections its open-file limit holds beyond its
 * own descriptors, two each (its socket and its timer). */
static uint32_t pasta_conn_capacity(const struct mgr_config *cfg)
{
	char path[4200], line[256];
	uint64_t nofile = 0;
	snprintf(path, sizeof path, "%s/net/pasta.pid", cfg->state_dir);
	long pid = pidfile_pid(path);
	if (pid) {
		snprintf(path, sizeof path, "/proc/%ld/limits", pid);
		FILE *f = fopen(path, "r");
		while (f && fgets(line, sizeof line, f))
			if (strncmp(line, "Max open files", 14) == 0) {
				nofile = strtoull(line + 14, NULL, 10);
				break;
			}
		if (f)
			fclose(f);
	}
	if (nofile == 0) { /* not started yet: it will have this process's hard limit */
		struct rlimit rl;
		nofile = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY ? rl.rlim_max : 1048576;
	}
	uint64_t c = nofile > NET_PASTA_FD_RESERVE ? (nofile - NET_PASTA_FD_RESERVE) / NET_PASTA_FDS_PER_CONN : 0;
	return c > UINT32_MAX ? UINT32_MAX : (uint32_t)c;
}

void net_conn_share(const struct mgr_config *cfg, uint32_t *guaranteed, uint32_t *pool)
{
	uint32_t cap = pasta_conn_capacity(cfg);
	uint32_t total = cfg->net_conns && cfg->net_conns < cap ? cfg->net_conns : cap;
	uint32_t slots = slot_count(cfg);
	uint32_t g = total / (2 * slots);
	if (g < 1)
		g = 1;
	if (g > NET_CONN_MAX)
		g = NET_CONN_MAX;
	*guaranteed = g;
	*pool = total > (uint64_t)g * slots ? total - g * slots : 0;
}

/* The egress namespace, its base ruleset, pasta and spaced-netd, made ready
 * when missing. Called with STATE/net/lock held. */
static int ensure(const struct mgr_config *cfg, char *why, size_t whysz)
{
	char dir[4096], ns[4200], p[4200], p2[4200];
	int e;
	if ((e = net_dir(cfg, "", dir, sizeof dir)) < 0)
		return e;
	snprintf(ns, sizeof ns, "%s/ns", dir);
	bool fresh = false;
	if (!is_nsfs(ns)) {
		int fd = open(ns, O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0) {
			why_set(why, whysz, "create %s: %s", ns, strerror(errno));
			return SPACED_ESYS;
		}
		close(fd);
		pid_t pid = fork();
		if (pid < 0)
			return SPACED_ESYS;
		if (pid == 0) {
			if (unshare(CLONE_NEWNET) < 0 || mount("/proc/self/ns/net", ns, NULL, MS_BIND, NULL) < 0)
				_exit(1);
			_exit(0);
		}
		int st;
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
		if (!is_nsfs(ns)) {
			why_set(why, whysz, "cannot make the egress namespace at %s", ns);
			return SPACED_ESYS;
		}
		fresh = true;
		const char *lo[] = {IP_BIN, "link", "set", "lo", "up", NULL};
		if ((e = run_in(ns, lo, NULL, why, whysz)) < 0)
			return e;
		if (sysctl_in(ns, "/proc/sys/net/ipv4/ip_forward", "1") < 0) {
			why_set(why, whysz, "cannot enable forwarding in the egress namespace");
			return SPACED_EIO;
		}
	}
	snprintf(p, sizeof p, "%s/pasta.pid", dir);
	/* the uplink exists exactly as long as pasta holds it (a tap device that
	 * is not persistent); pasta runs as passt.avx2 where the CPU has AVX2 */
	if (fresh || !link_exists(ns, "up0")) {
		snprintf(p2, sizeof p2, "%s/pasta.log", dir);
		/* pasta carries the egress namespace's traffic out as this host's own
		 * sockets; it forwards no port in either direction (-t/-u/-T/-U none)
		 * and does not map its gateway to the host (--no-map-gw) */
		const char *argv[] = {PASTA_BIN, "-q", "-f", "--runas", "0:0", "--config-net", "--netns", ns, "-I", "up0",
		                      "-a", NET_UPLINK, "-n", "30", "-g", NET_UPLINK_GW, "--no-map-gw", "-t", "none", "-u",
		                      "none", "-T", "none", "-U", "none", "-4", "--no-dhcp", "--no-ndp", "--no-dhcpv6",
		                      "--no-ra", NULL};
		if ((e = spawn_daemon(argv, p2, p, true)) < 0) {
			why_set(why, whysz, "cannot start pasta");
			return e;
		}
		for (int i = 0; i < 400 && !link_exists(ns, "up0"); i++) {
			struct timespec ts = {0, 10 * 1000 * 1000};
			nanosleep(&ts, NULL);
		}
		if (!link_exists(ns, "up0")) {
			why_set(why, whysz, "pasta did not bring the uplink up (see %s)", p2);
			return SPACED_EIO;
		}
		uint32_t g, pool;
		net_conn_share(cfg, &g, &pool);
		spaced_log("executor", "level=info event=egress-up pasta_conns=%u guaranteed=%u slots=%u shared=%u",
		           g * slot_count(cfg) + pool, g, slot_count(cfg), pool);
	}
	/* ARP is not IP (no inet hook sees it): a request aimed at the link's
	 * address made the kernel take a neighbour entry for its sender, any
	 * sender, and the neighbour table is one for the whole host (1024
	 * entries). A microVM's guest sending requests from ever other sender
	 * addresses kept it full, and no namespace of the host could reach a new
	 * neighbour. Now only a sender of the link's own subnet is answered or
	 * taken in (arp_ignore 2), and only where the route to it is that link
	 * (arp_filter): a sandbox's link takes in its own execution's address
	 * alone. Set each time: a namespace made by an older spaced-node too. */
	if (sysctl_in(ns, "/proc/sys/net/ipv4/conf/all/arp_ignore", "2") < 0 ||
	    sysctl_in(ns, "/proc/sys/net/ipv4/conf/all/arp_filter", "1") < 0) {
		why_set(why, whysz, "cannot set the egress namespace's ARP rules");
		return SPACED_EIO;
	}
	if ((e = apply_base(cfg, ns, why, whysz)) < 0)
		return e;
	snprintf(p, sizeof p, "%s/netd.pid", dir);
	if (!pidfile_alive(p, "spaced-netd")) {
		char bin[4200];
		snprintf(p2, sizeof p2, "%s/netd.log", dir);
		const char *argv[] = {netd_bin(cfg, bin, sizeof bin), "--dir", dir, cfg->net_dns ? "--upstream" : NULL,
		                      cfg->net_dns, NULL};
		if ((e = spawn_daemon(argv, p2, p, false)) < 0) {
			why_set(why, whysz, "cannot start spaced-netd");
			return e;
		}
	}
	return 0;
}

/* Whether the egress namespace is there, and pasta and spaced-netd run
 * (each named by its pid file, checked by its process name). */
static bool egress_state(const struct mgr_config *cfg, bool *pasta, bool *netd)
{
	char ns[4200], np[4200], pp[4200];
	snprintf(ns, sizeof ns, "%s/net/ns", cfg->state_dir);
	snprintf(np, sizeof np, "%s/net/netd.pid", cfg->state_dir);
	snprintf(pp, sizeof pp, "%s/net/pasta.pid", cfg->state_dir);
	*pasta = false;
	for (size_t i = 0; i < sizeof pasta_names / sizeof pasta_names[0] && !*pasta; i++)
		*pasta = pidfile_alive(pp, pasta_names[i]);
	*netd = pidfile_alive(np, "spaced-netd");
	return is_nsfs(ns);
}

bool net_needs_revive(const struct mgr_config *cfg)
{
	bool pasta, netd;
	return net_enabled(cfg) && egress_state(cfg, &pasta, &netd) && (!pasta || !netd);
}

int net_revive(const struct mgr_config *cfg, char *what, size_t whatsz, char *why, size_t whysz)
{
	char lp[4200];
	snprintf(what, whatsz, "%s", "");
	snprintf(lp, sizeof lp, "%s/net/lock", cfg->state_dir);
	int fd = open(lp, O_RDWR | O_CLOEXEC);
	if (fd < 0 || flock(fd, LOCK_EX) < 0) {
		if (fd >= 0)
			close(fd);
		return 0; /* no lock file: no namespace was ever made here */
	}
	int e = 0;
	/* checked again under the lock: an idle namespace taken down meanwhile
	 * is not made again (the next execution start makes it) */
	bool pasta, netd;
	if (egress_state(cfg, &pasta, &netd)) {
		if (!pasta || !netd) {
			snprintf(what, whatsz, "%s%s%s", pasta ? "" : "pasta", !pasta && !netd ? "," : "", netd ? "" : "spaced-netd");
			e = ensure(cfg, why, whysz);
		}
	}
	close(fd);
	return e;
}

/* Takes STATE/net/lock (made with its directories) and makes the egress
 * namespace, pasta and spaced-netd ready under it. Returns the lock's fd (the
 * caller closes it when its changes are done: spaced-netd tears an idle
 * namespace down only under the same lock) or an error. */
static int with_lock(const struct mgr_config *cfg, char *why, size_t whysz)
{
	char dir[4096], p[4200];
	int e = net_dir(cfg, "", dir, sizeof dir);
	if (e < 0)
		return e;
	const char *subs[] = {"", "policy", "slot"};
	for (size_t i = 0; i < 3; i++) {
		snprintf(p, sizeof p, "%s%s%s", dir, subs[i][0] ? "/" : "", subs[i]);
		if (mkdir(p, 0700) < 0 && errno != EEXIST) {
			why_set(why, whysz, "mkdir %s: %s", p, strerror(errno));
			return SPACED_ESYS;
		}
	}
	snprintf(p, sizeof p, "%s/lock", dir);
	int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0 || flock(fd, LOCK_EX) < 0) {
		if (fd >= 0)
			close(fd);
		return SPACED_ESYS;
	}
	e = ensure(cfg, why, whysz);
	if (e < 0) {
		close(fd);
		return e;
	}
	/* shared from here on: attaches go on side by side, a teardown waits */
	flock(fd, LOCK_SH);
	return fd;
}

/* ---- policies ---- */

static int policy_path(const struct mgr_config *cfg, const char *sandbox, char *out, size_t outsz)
{
	if (!spaced_name_valid(sandbox, strlen(sandbox)))
		return SPACED_EINVAL;
	int n = snprintf(out, outsz, "%s/net/policy/%s.json", cfg->state_dir, sandbox);
	return (n < 0 || (size_t)n >= outsz) ? SPACED_ETOOBIG : 0;
}

int net_policy_store(const struct mgr_config *cfg, const char *sandbox, json_t *policy, char *why, size_t whysz)
{
	struct spaced_netpolicy p;
	char path[4200], dir[4200];
	int e;
	if (spaced_netpolicy_from_json(policy, &p, why, whysz) < 0)
		return SPACED_EINVAL;
	if ((e = policy_path(cfg, sandbox, path, sizeof path)) < 0)
		return e;
	snprintf(dir, sizeof dir, "%s/net", cfg->state_dir);
	mkdir(dir, 0700);
	snprintf(dir, sizeof dir, "%s/net/policy", cfg->state_dir);
	mkdir(dir, 0700);
	json_t *canon = spaced_netpolicy_to_json(&p);
	char *text = canon ? json_dumps(canon, JSON_COMPACT) : NULL;
	json_decref(canon);
	if (!text)
		return SPACED_ENOMEM;
	e = write_atomic(path, text, true);
	free(text);
	if (e < 0)
		why_set(why, whysz, "cannot store the policy");
	return e;
}

/* The stored policy of sandbox, or the default one. */
static void policy_load(const struct mgr_config *cfg, const char *sandbox, struct spaced_netpolicy *p)
{
	char path[4200];
	json_error_t jerr;
	spaced_netpolicy_default(p);
	if (policy_path(cfg, sandbox, path, sizeof path) < 0)
		return;
	json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (j && spaced_netpolicy_from_json(j, p, NULL, 0) < 0)
		spaced_netpolicy_default(p);
	json_decref(j);
}

static int slot_of(const struct mgr_config *cfg, const struct mgr_rec *rec, uint32_t *slot)
{
	if (rec->uid_base < cfg->uid_first || (rec->uid_base - cfg->uid_first) % 65536u != 0)
		return SPACED_EINVAL;
	uint32_t k = (rec->uid_base - cfg->uid_first) / 65536u;
	if (k >= NET_SLOTS)
		return SPACED_EINVAL;
	*slot = k;
	return 0;
}

/* A TCP flow of a slot as pasta carries it: the egress namespace's side
 * after masquerade and the outside peer (network byte order). */
struct gone_flow {
	uint32_t nat_addr, peer;
	uint16_t nat_port, peer_port;
};

struct flush_ctx {
	uint32_t addr; /* the slot's (network byte order) */
	struct nfct_handle *del;
	struct gone_flow *tcp;
	size_t ntcp, cap;
	unsigned deleted, failed;
};

static int flush_cb(enum nf_conntrack_msg_type type, struct nf_conntrack *ct, void *arg)
{
	struct flush_ctx *x = arg;
	(void)type;
	if (nfct_get_attr_u8(ct, ATTR_L3PROTO) != AF_INET || nfct_get_attr_u32(ct, ATTR_ORIG_IPV4_SRC) != x->addr)
		return NFCT_CB_CONTINUE;
	/* (past cap, NET_CONN_MAX twice what one execution may hold, its
	 * entries are still deleted and pasta's sockets go when idle) */
	if (nfct_get_attr_u8(ct, ATTR_L4PROTO) == IPPROTO_TCP && x->ntcp < x->cap) {
		struct gone_flow *f = &x->tcp[x->ntcp++];
		f->nat_addr = nfct_get_attr_u32(ct, ATTR_REPL_IPV4_DST);
		f->nat_port = nfct_get_attr_u16(ct, ATTR_REPL_PORT_DST);
		f->peer = nfct_get_attr_u32(ct, ATTR_REPL_IPV4_SRC);
		f->peer_port = nfct_get_attr_u16(ct, ATTR_REPL_PORT_SRC);
	}
	if (nfct_query(x->del, NFCT_Q_DESTROY, ct) == 0)
		x->deleted++;
	else
		x->failed++;
	return NFCT_CB_CONTINUE;
}

static uint16_t csum_fold(uint32_t sum)
{
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)~sum;
}

/* Resets f at pasta: a TCP RST from the egress namespace's side of it. pasta
 * closes a connection on any RST it is handed, whatever its sequence number;
 * sent once the flow's conntrack entry is gone, it is no flow's packet and
 * leaves unchanged. */
static void reset_at_pasta(int raw, const struct gone_flow *f)
{
	struct {
		struct iphdr ip;
		struct tcphdr tcp;
	} pkt;
	memset(&pkt, 0, sizeof pkt);
	pkt.ip.version = 4;
	pkt.ip.ihl = 5;
	pkt.ip.tot_len = htons(sizeof pkt);
	pkt.ip.ttl = 64;
	pkt.ip.protocol = IPPROTO_TCP;
	pkt.ip.saddr = f->nat_addr;
	pkt.ip.daddr = f->peer;
	pkt.tcp.source = f->nat_port;
	pkt.tcp.dest = f->peer_port;
	pkt.tcp.doff = 5;
	pkt.tcp.rst = 1;
	/* the checksum over the pseudo-header and the header (the kernel
	 * completes the IP header's own) */
	uint32_t sum = 0;
	const uint16_t *w = (const uint16_t *)(const void *)&pkt.ip.saddr;
	for (int i = 0; i < 4; i++)
		sum += w[i];
	sum += htons(IPPROTO_TCP) + htons(sizeof pkt.tcp);
	w = (const uint16_t *)(const void *)&pkt.tcp;
	for (size_t i = 0; i < sizeof pkt.tcp / 2; i++)
		sum += w[i];
	pkt.tcp.check = csum_fold(sum);
	struct sockaddr_in to = {.sin_family = AF_INET, .sin_addr.s_addr = f->peer};
	(void)sendto(raw, &pkt, sizeof pkt, 0, (struct sockaddr *)&to, sizeof to);
}

/* Ends the flows of the execution that held slot last: deletes the egress
 * namespace's conntrack entries whose source is the slot's address and resets
 * their TCP connections at pasta. They stayed in the slot's and the shared
 * pool's connection counts (a microVM's guest that is killed closes nothing:
 * its flows stayed established, for the kernel's five days), pasta kept their
 * host sockets (two hours idle), and answers of theirs reached the slot's next
 * holder. The netlink and raw sockets are made in the egress namespace by
 * this thread, which enters it and comes back (a namespace is a thread's). */
static void flush_slot_flows(const char *ns, uint32_t slot)
{
	struct flush_ctx x = {.addr = htonl(NET_POOL + 4 * slot + 2), .cap = NET_CONN_MAX * 2};
	struct nfct_handle *dump = NULL;
	int raw = -1, err = 0;
	const char *why = NULL;
	int own = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC), target = open(ns, O_RDONLY | O_CLOEXEC);
	if (own < 0 || target < 0 || setns(target, CLONE_NEWNET) < 0) {
		why = "cannot enter the egress namespace";
		err = errno;
	} else {
		if (!(dump = nfct_open(CONNTRACK, 0)) || !(x.del = nfct_open(CONNTRACK, 0)) ||
		    (raw = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW)) < 0) {
			why = "cannot open conntrack or a raw socket";
			err = errno;
		}
		if (setns(own, CLONE_NEWNET) < 0) {
			/* this process would reach nothing of the host's any more: it
			 * is an executor's job child (a start's, a pool start's or a
			 * stop's), which ends here and its job with it */
			spaced_log("executor", "level=error event=netns-return-failed reason=\"%s\"", strerror(errno));
			abort();
		}
	}
	if (own >= 0)
		close(own);
	if (target >= 0)
		close(target);
	if (!why && !(x.tcp = calloc(x.cap, sizeof *x.tcp))) {
		why = "out of memory";
		err = ENOMEM;
	}
	if (!why) {
		uint32_t family = AF_INET;
		nfct_callback_register(dump, NFCT_T_ALL, flush_cb, &x);
		if (nfct_query(dump, NFCT_Q_DUMP, &family) < 0) {
			why = "the conntrack dump failed";
			err = errno;
		}
		for (size_t i = 0; i < x.ntcp; i++)
			reset_at_pasta(raw, &x.tcp[i]);
	}
	if (why)
		spaced_log("executor", "level=warn event=net-flows-kept slot=%u deleted=%u reason=\"%s: %s\"",
		           (unsigned)slot, x.deleted, why, strerror(err));
	else if (x.failed)
		spaced_log("executor", "level=warn event=net-flows-kept slot=%u deleted=%u failed=%u", (unsigned)slot,
		           x.deleted, x.failed);
	else if (x.deleted)
		spaced_log("executor", "level=info event=net-flows-ended slot=%u flows=%u tcp_reset=%zu", (unsigned)slot,
		           x.deleted, x.ntcp);
	free(x.tcp);
	if (dump)
		nfct_close(dump);
	if (x.del)
		nfct_close(x.del);
	if (raw >= 0)
		close(raw);
}

/* STATE/net/slot/N.holder: "PID START" of the process whose network
 * namespace holds slot N's link now (an execution's PID 1, or its QEMU),
 * written as its link is made. */
static void holder_path(const struct mgr_config *cfg, uint32_t slot, char *path, size_t pathsz)
{
	snprintf(path, pathsz, "%s/net/slot/%u.holder", cfg->state_dir, (unsigned)slot);
}

/* True when the holder file names a process that still runs (not a zombie). */
static bool holder_alive(const char *path)
{
	char text[64], statp[64], st[512];
	long pid;
	unsigned long long start;
	uint64_t now;
	FILE *f = fopen(path, "re");
	bool got = f && fgets(text, sizeof text, f) && sscanf(text, "%ld %llu", &pid, &start) == 2 && pid > 0;
	if (f)
		fclose(f);
	if (!got || spaced_proc_start_time((pid_t)pid, &now) < 0 || now != start)
		return false;
	snprintf(statp, sizeof statp, "/proc/%ld/stat", pid);
	f = fopen(statp, "re");
	got = f && fgets(st, sizeof st, f);
	if (f)
		fclose(f);
	const char *rp = got ? strrchr(st, ')') : NULL;
	return rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X';
}

void net_release(const struct mgr_config *cfg, const struct mgr_rec *rec)
{
	char ns[4200], holder[4200];
	uint32_t slot;
	if (!net_enabled(cfg) || slot_of(cfg, rec, &slot) < 0)
		return;
	snprintf(ns, sizeof ns, "%s/net/ns", cfg->state_dir);
	/* the execution stopped has let its uid range go: a newer one may have
	 * the slot already (a replacement started beside this stop), whose
	 * flows are its own (its attach ended the older ones) */
	holder_path(cfg, slot, holder, sizeof holder);
	if (holder_alive(holder)) {
		spaced_log("executor", "level=info event=net-flows-kept slot=%u reason=\"a newer execution holds the slot\"",
		           (unsigned)slot);
		return;
	}
	if (is_nsfs(ns))
		flush_slot_flows(ns, slot);
}

/* slot_of, the reason in why when there is none. */
static int slot_or_why(const struct mgr_config *cfg, const struct mgr_rec *rec, uint32_t *slot, char *why,
                       size_t whysz)
{
	int e = slot_of(cfg, rec, slot);
	if (e < 0)
		why_set(why, whysz, "no network slot for uid base %u", (unsigned)rec->uid_base);
	return e;
}

static void list_elems(FILE *f, const char *set, const struct spaced_net_rule *list, size_t n)
{
	bool any = false;
	for (size_t i = 0; i < n; i++) {
		if (list[i].is_domain)
			continue;
		char c[32];
		spaced_cidr_format(&list[i].cidr, c, sizeof c);
		fprintf(f, "%s%s", any ? ", " : "add element inet spaced ", any ? c : "");
		if (!any)
			fprintf(f, "%s { %s", set, c);
		any = true;
	}
	if (any)
		fprintf(f, " }\n");
}

/* The packet filter of the execution behind sx<slot>, replaced in one nft
 * transaction. The order of its rules is the policy's order of precedence:
 * deny lists, then allow lists where they name what the operator made
 * openable (--net-openable), then the rest of the closed set (no tenant's
 * list opens it), then the rest of the allow lists, then the addresses the
 * resolver pinned for allowed domains, then the mode. A connection admitted under an older version of the
 * policy is judged again, packet by packet, under the new one. */
static int apply_policy(const struct mgr_config *cfg, const char *ns, uint32_t slot, const struct spaced_netpolicy *p,
                        char *why, size_t whysz)
{
	uint32_t guaranteed, pool;
	net_conn_share(cfg, &guaranteed, &pool);
	char sbx[16];
	addr_text(NET_POOL + 4 * slot + 2, sbx);
	/* the policy's version, carried by the connections it admitted */
	uint32_t ver = randombytes_uniform(0x7ffffffeu) + 1;
	char *s = NULL;
	size_t sl = 0;
	FILE *f = open_memstream(&s, &sl);
	if (!f)
		return SPACED_ENOMEM;
	unsigned k = slot;
	fprintf(f, "add chain inet spaced s_%u\n", k);
	fprintf(f, "add set inet spaced allow_%u { type ipv4_addr; flags interval; auto-merge; }\n", k);
	fprintf(f, "add set inet spaced deny_%u { type ipv4_addr; flags interval; auto-merge; }\n", k);
	fprintf(f, "add set inet spaced pin_%u { type ipv4_addr; flags timeout; }\n", k);
	fprintf(f, "add set inet spaced dpin_%u { type ipv4_addr; flags timeout; }\n", k);
	fprintf(f, "add set inet spaced cnt_%u { type ipv4_addr; size 16; flags dynamic; }\n", k);
	fprintf(f, "add set inet spaced gcnt_%u { type ipv4_addr; size 16; flags dynamic; }\n", k);
	fprintf(f, "flush chain inet spaced s_%u\n", k);
	fprintf(f, "flush set inet spaced allow_%u\nflush set inet spaced deny_%u\n", k, k);
	fprintf(f, "flush set inet spaced pin_%u\nflush set inet spaced dpin_%u\n", k, k);
	char set[32];
	snprintf(set, sizeof set, "allow_%u", k);
	list_elems(f, set, p->allow_out, p->nallow);
	snprintf(set, sizeof set, "deny_%u", k);
	list_elems(f, set, p->deny_out, p->ndeny);
	const char *rej = "reject with icmp type admin-prohibited";
	fprintf(f, "add rule inet spaced s_%u ip saddr != %s drop\n", k, sbx);
	fprintf(f, "add rule inet spaced s_%u ct state established,related ct mark %u accept\n", k, ver);
	/* the connections one sandbox may hold open through the worker's egress */
	fprintf(f, "add rule inet spaced s_%u ct state new add @cnt_%u { ip saddr ct count over %u } goto refuse\n", k, k,
	        NET_CONN_MAX);
	/* past its guaranteed share, a connection is one of the pool's, which
	 * all executions share: no execution's connections take what pasta can
	 * carry from another's guaranteed share (net_conn_share) */
	fprintf(f, "add rule inet spaced s_%u ct state new add @gcnt_%u { ip saddr ct count over %u } "
	           "add @pool { meta l4proto ct count over %u } goto refuse\n", k, k, guaranteed, pool);
	fprintf(f, "add rule inet spaced s_%u ip daddr @deny_%u %s\n", k, k, rej);
	fprintf(f, "add rule inet spaced s_%u ip daddr @dpin_%u %s\n", k, k, rej);
	fprintf(f, "add rule inet spaced s_%u ip daddr @allow_%u ip daddr @openable ct mark set %u accept\n", k, k, ver);
	fprintf(f, "add rule inet spaced s_%u ip daddr @closed %s\n", k, rej);
	fprintf(f, "add rule inet spaced s_%u ip daddr @allow_%u ct mark set %u accept\n", k, k, ver);
	fprintf(f, "add rule inet spaced s_%u ip daddr @pin_%u ct mark set %u accept\n", k, k, ver);
	if (p->allow)
		fprintf(f, "add rule inet spaced s_%u ct mark set %u accept\n", k, ver);
	fprintf(f, "add rule inet spaced s_%u %s\n", k, rej);
	fprintf(f, "add element inet spaced sbxmap { \"sx%u\" : jump s_%u }\n", k, k);
	fclose(f);
	int e = nft_in(ns, s, why, whysz);
	free(s);
	return e;
}

/* A JSON array of the CIDRs' texts (NULL without memory). */
static json_t *cidr_list_json(const struct spaced_cidr *c, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; a && i < n; i++) {
		char t[32];
		spaced_cidr_format(&c[i], t, sizeof t);
		json_array_append_new(a, json_string(t));
	}
	return a;
}

/* STATE/net/slot/N.json: which sandbox holds slot N, its address and policy
 * (for spaced-netd). Derived state: every attach writes it again, so it
 * needs the disk only when durable is asked for. */
static int write_slot(const struct mgr_config *cfg, uint32_t slot, const char *sandbox,
                      const struct spaced_netpolicy *p, bool durable)
{
	char path[4200], addr[16];
	snprintf(path, sizeof path, "%s/net/slot/%u.json", cfg->state_dir, (unsigned)slot);
	addr_text(NET_POOL + 4 * slot + 2, addr);
	json_t *open = cidr_list_json(cfg->net_openable, cfg->net_nopenable);
	json_t *closed = cidr_list_json(cfg->net_closed, cfg->net_nclosed);
	/* with what the operator made openable and added to the closed set: the
	 * resolver strips answers into the closed set but for what is opened */
	json_t *j = json_pack("{s:s,s:s,s:o,s:o,s:o}", "sandbox", sandbox, "addr", addr, "policy",
	                      spaced_netpolicy_to_json(p), "openable", open ? open : json_array(), "closed",
	                      closed ? closed : json_array());
	char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	if (!text)
		return SPACED_ENOMEM;
	int e = write_atomic(path, text, durable);
	free(text);
	return e;
}

/* /etc/resolv.conf of the execution names its resolver. Written as host
 * root inside the execution's mount namespace only (its root, its files):
 * whatever is at /etc/resolv.conf is replaced, never followed, and nothing
 * of the execution's is executed. */
struct resolv_child {
	int mnt;
	const char *text;
};

static int resolv_child(void *arg)
{
	const struct resolv_child *c = arg;
	if (setns(c->mnt, CLONE_NEWNS) < 0)
		return 1;
	int etc = open("/etc", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (etc < 0)
		return 2;
	unlinkat(etc, "resolv.conf", 0);
	int fd = openat(etc, "resolv.conf", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0)
		return 3;
	size_t n = strlen(c->text);
	if (write(fd, c->text, n) != (ssize_t)n)
		return 4;
	fchmod(fd, 0644);
	return 0;
}

static int write_resolv(pid_t init, const char *gw)
{
	char path[64], text[128];
	snprintf(path, sizeof path, "/proc/%d/ns/mnt", (int)init);
	snprintf(text, sizeof text, "# the sandbox's resolver (spaced)\nnameserver %s\noptions edns0\n", gw);
	int mfd = open(path, O_RDONLY | O_CLOEXEC);
	if (mfd < 0)
		return SPACED_ESYS;
	struct resolv_child c = {.mnt = mfd, .text = text};
	int st = spawn_wait(resolv_child, &c);
	close(mfd);
	return st == 0 ? 0 : st < 0 ? SPACED_ESYS : SPACED_EIO;
}

/* PID 1 of the execution, from the launcher's state file, pinned by its start time. */
static int init_of(const char *e_dir, pid_t *out)
{
	char path[4200], buf[512];
	snprintf(path, sizeof path, "%s/launcher", e_dir);
	FILE *f = fopen(path, "r");
	if (!f)
		return SPACED_ENOENT;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	const char *p = strstr(buf, "init=");
	const char *q = strstr(buf, "init_start=");
	if (!p || !q)
		return SPACED_EPROTO;
	long pid = strtol(p + 5, NULL, 10);
	unsigned long long st = strtoull(q + 11, NULL, 10);
	uint64_t now = 0;
	if (pid <= 1 || spaced_proc_start_time((pid_t)pid, &now) < 0 || now != st)
		return SPACED_ENOENT;
	*out = (pid_t)pid;
	return 0;
}

static int attach_locked(const struct mgr_config *cfg, uint32_t slot, pid_t init, const char *sandbox,
                         const struct spaced_netpolicy *p, bool vm, char *why, size_t whysz);

int net_attach_vm(const struct mgr_config *cfg, const struct mgr_rec *rec, pid_t qemu, char *why, size_t whysz)
{
	struct spaced_netpolicy p;
	uint32_t slot;
	int e;
	if (!net_enabled(cfg))
		return 0;
	if ((e = slot_or_why(cfg, rec, &slot, why, whysz)) < 0)
		return e;
	policy_load(cfg, rec->r.id.sandbox, &p);
	int lock = with_lock(cfg, why, whysz);
	if (lock < 0)
		return lock;
	e = attach_locked(cfg, slot, qemu, rec->r.id.sandbox, &p, true, why, whysz);
	close(lock);
	return e;
}

int net_vm_addresses(const struct mgr_config *cfg, const struct mgr_rec *rec, char *guest, char *gw)
{
	uint32_t slot;
	if (!net_enabled(cfg) || slot_of(cfg, rec, &slot) < 0)
		return SPACED_ENOENT;
	addr_text(NET_POOL + 4 * slot + 2, guest);
	addr_text(NET_POOL + 4 * slot + 1, gw);
	return 0;
}

/* net_attach and net_attach_pooled: the link of rec's execution, under the
 * filter of p (held by sandbox, "" for a pooled execution). */
/* The shared lock alone when the egress namespace and its resolver are up
 * (a pooled attach: the pool refills while creates claim, and with_lock's
 * exclusive turn runs ip and nft each time); with_lock otherwise. */
static int lock_ready(const struct mgr_config *cfg, char *why, size_t whysz)
{
	char lp[4200];
	bool pasta, netd;
	snprintf(lp, sizeof lp, "%s/net/lock", cfg->state_dir);
	int fd = open(lp, O_RDWR | O_CLOEXEC);
	/* ready as it is (under the shared lock): nothing to make */
	if (fd >= 0 && flock(fd, LOCK_SH) == 0 && egress_state(cfg, &pasta, &netd) && pasta && netd)
		return fd;
	if (fd >= 0)
		close(fd);
	return with_lock(cfg, why, whysz);
}

static int attach_as(const struct mgr_config *cfg, const struct mgr_rec *rec, const char *e_dir, const char *sandbox,
                     const struct spaced_netpolicy *p, char *why, size_t whysz)
{
	uint32_t slot;
	pid_t init;
	int e;
	if ((e = slot_or_why(cfg, rec, &slot, why, whysz)) < 0)
		return e;
	if ((e = init_of(e_dir, &init)) < 0) {
		why_set(why, whysz, "the execution's PID 1 is not known: %s", spaced_strerror(e));
		return e;
	}
	int lock = sandbox[0] ? with_lock(cfg, why, whysz) : lock_ready(cfg, why, whysz);
	if (lock < 0)
		return lock;
	e = attach_locked(cfg, slot, init, sandbox, p, false, why, whysz);
	close(lock);
	return e;
}

int net_attach_pooled(const struct mgr_config *cfg, const struct mgr_rec *rec, const char *e_dir, char *why,
                      size_t whysz)
{
	struct spaced_netpolicy p;
	if (!net_enabled(cfg))
		return 0;
	/* the default policy's filter, held by no sandbox: most creates name no
	 * other, and their claim then changes no rule (nft is the most costly
	 * step of a claim). Nothing runs in a pooled execution but its guest,
	 * which runs nothing before it has an identity. */
	spaced_netpolicy_default(&p);
	return attach_as(cfg, rec, e_dir, "", &p, why, whysz);
}

bool net_policy_is_default(json_t *policy)
{
	struct spaced_netpolicy p, d;
	if (spaced_netpolicy_from_json(policy, &p, NULL, 0) < 0)
		return false;
	spaced_netpolicy_default(&d);
	json_t *pj = spaced_netpolicy_to_json(&p), *dj = spaced_netpolicy_to_json(&d);
	bool same = pj && dj && json_equal(pj, dj);
	json_decref(pj);
	json_decref(dj);
	return same;
}

bool net_policy_stored(const struct mgr_config *cfg, const char *sandbox)
{
	char path[4200];
	struct stat st;
	return policy_path(cfg, sandbox, path, sizeof path) < 0 || lstat(path, &st) == 0 || errno != ENOENT;
}

int net_claim(const struct mgr_config *cfg, const struct mgr_rec *rec, char *why, size_t whysz)
{
	return net_claim_as(cfg, rec, 0, why, whysz);
}

int net_claim_as(const struct mgr_config *cfg, const struct mgr_rec *rec, unsigned flags, char *why, size_t whysz)
{
	struct spaced_netpolicy p;
	char ns[4200];
	uint32_t slot;
	int e;
	if (!net_enabled(cfg))
		return 0;
	if ((e = slot_or_why(cfg, rec, &slot, why, whysz)) < 0)
		return e;
	snprintf(ns, sizeof ns, "%s/net/ns", cfg->state_dir);
	if (!is_nsfs(ns)) {
		why_set(why, whysz, "the egress namespace is gone");
		return SPACED_ENOENT;
	}
	policy_load(cfg, rec->r.id.sandbox, &p);
	/* the filter is the default policy's since net_attach_pooled */
	json_t *pj = spaced_netpolicy_to_json(&p);
	bool same = pj && net_policy_is_default(pj);
	json_decref(pj);
	if (!same && (flags & NET_CLAIM_QUICK)) {
		why_set(why, whysz, "the sandbox's policy needs its filter");
		return SPACED_EBUSY;
	}
	/* the link and the egress namespace were made ready when the pooled
	 * execution was attached: only the filter changes, under the shared
	 * lock that keeps a teardown away (with_lock's ensure() would run ip and
	 * nft again for nothing on every claim) */
	char lp[4200];
	snprintf(lp, sizeof lp, "%s/net/lock", cfg->state_dir);
	int lock = open(lp, O_RDWR | O_CLOEXEC);
	if (lock < 0 || flock(lock, (flags & NET_CLAIM_QUICK) ? LOCK_SH | LOCK_NB : LOCK_SH) < 0) {
		int err = errno;
		if (lock >= 0)
			close(lock);
		why_set(why, whysz, "cannot take the egress lock: %s", strerror(err));
		return err == EWOULDBLOCK ? SPACED_EBUSY : SPACED_ESYS;
	}
	if (!is_nsfs(ns)) {
		close(lock);
		why_set(why, whysz, "the egress namespace is gone");
		return SPACED_ENOENT;
	}
	if ((e = write_slot(cfg, slot, rec->r.id.sandbox, &p, !(flags & NET_CLAIM_QUICK))) < 0)
		why_set(why, whysz, "cannot write the slot file");
	else if (!same)
		e = apply_policy(cfg, ns, slot, &p, why, whysz);
	close(lock);
	return e;
}

int net_attach(const struct mgr_config *cfg, const struct mgr_rec *rec, const char *e_dir, char *why, size_t whysz)
{
	struct spaced_netpolicy p;
	if (!net_enabled(cfg))
		return 0;
	policy_load(cfg, rec->r.id.sandbox, &p);
	return attach_as(cfg, rec, e_dir, rec->r.id.sandbox, &p, why, whysz);
}

static int attach_locked(const struct mgr_config *cfg, uint32_t slot, pid_t init, const char *sandbox,
                         const struct spaced_netpolicy *pol, bool vm, char *why, size_t whysz)
{
	char ns[4200], sns[64], ifn[16], gw[16], sbx[16], script[512], pids[16];
	int e;
	snprintf(ns, sizeof ns, "%s/net/ns", cfg->state_dir);
	snprintf(sns, sizeof sns, "/proc/%d/ns/net", (int)init);
	snprintf(ifn, sizeof ifn, "sx%u", (unsigned)slot);
	snprintf(pids, sizeof pids, "%d", (int)init);
	addr_text(NET_POOL + 4 * slot + 1, gw);
	addr_text(NET_POOL + 4 * slot + 2, sbx);
	/* the filter first: the link carries nothing before its rules exist */
	if ((e = write_slot(cfg, slot, sandbox, pol, true)) < 0) {
		why_set(why, whysz, "cannot write the slot file");
		return e;
	}
	if (!sandbox[0]) {
		/* a pooled execution's: its claim writes the slot again, through a
		 * temporary file made now (no inode allocated during the claim) */
		char tmp[4200];
		snprintf(tmp, sizeof tmp, "%s/net/slot/%u.json.tmp", cfg->state_dir, (unsigned)slot);
		spaced_file_prepare(tmp, 0600);
	}
	if ((e = apply_policy(cfg, ns, slot, pol, why, whysz)) < 0)
		return e;
	const char *del[] = {IP_BIN, "link", "del", ifn, NULL};
	if (link_exists(ns, ifn))
		run_in(ns, del, NULL, NULL, 0); /* left by an execution that is gone */
	flush_slot_flows(ns, slot); /* also left by one whose executor did not see it end */
	/* the slot's holder from now on (net_release) */
	uint64_t start;
	char holder[4200], htext[64];
	if (spaced_proc_start_time(init, &start) == 0) {
		holder_path(cfg, slot, holder, sizeof holder);
		snprintf(htext, sizeof htext, "%ld %llu\n", (long)init, (unsigned long long)start);
		(void)write_atomic(holder, htext, false);
	}
	snprintf(script, sizeof script,
	         "link add %s mtu 65520 type veth peer name eth0 mtu 65520 netns %s\n"
	         "addr add %s/30 dev %s\n"
	         "link set %s up\n",
	         ifn, pids, gw, ifn, ifn);
	const char *batch[] = {IP_BIN, "-batch", "-", NULL};
	if ((e = run_in(ns, batch, script, why, whysz)) < 0)
		return e;
	sysctl_in(sns, "/proc/sys/net/ipv6/conf/eth0/disable_ipv6", "1");
	/* its rate each way (--net-rate): what it receives leaves the worker's
	 * namespace on its end of the link, what it sends leaves its own eth0
	 * (its namespace belongs to the host's user namespace: root inside
	 * cannot change the queue) */
	if (cfg->net_rate > 0) {
		char rate[32], burst[32], limit[32];
		/* burst: 10 ms of it, at least a few of the link's 64 KiB packets;
		 * queue: 100 ms of it, at least 1 MiB (pasta sends what the
		 * sandbox's window allows at once: a short queue drops most of a
		 * download, which then ran at a third of the rate) */
		uint64_t b = cfg->net_rate / 8 / 100, l = cfg->net_rate / 8 / 10;
		snprintf(rate, sizeof rate, "%llubit", (unsigned long long)cfg->net_rate);
		snprintf(burst, sizeof burst, "%llu", (unsigned long long)(b > 262144 ? b : 262144));
		snprintf(limit, sizeof limit, "%llu", (unsigned long long)(l > 1048576 ? l : 1048576));
		const char *down[] = {TC_BIN, "qdisc", "replace", "dev", ifn, "root", "tbf", "rate", rate, "burst", burst,
		                      "limit", limit, NULL};
		const char *up[] = {TC_BIN, "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate, "burst", burst,
		                    "limit", limit, NULL};
		if ((e = run_in(ns, down, NULL, why, whysz)) < 0 || (e = run_in(sns, up, NULL, why, whysz)) < 0)
			return e;
	}
	if (vm) {
		/* a VM's namespace holds QEMU and only L2: eth0 joins the bridge of
		 * the VM's tap (spaced-vm made both); the guest itself owns the
		 * execution's address, and its resolver is set inside it */
		snprintf(script, sizeof script, "link set eth0 master br0\nlink set eth0 up\n");
		return run_in(sns, batch, script, why, whysz);
	}
	snprintf(script, sizeof script,
	         "addr add %s/30 dev eth0\n"
	         "link set eth0 up\n"
	         "route add default via %s dev eth0\n",
	         sbx, gw);
	if ((e = run_in(sns, batch, script, why, whysz)) < 0)
		return e;
	if ((e = write_resolv(init, gw)) < 0) {
		why_set(why, whysz, "cannot write the execution's /etc/resolv.conf");
		return e;
	}
	return 0;
}

int net_job(const struct mgr_config *cfg, json_t *args, json_t **result, char *why, size_t whysz)
{
	json_t *js = json_object_get(args, "sandbox"), *jn = json_object_get(args, "network");
	json_t *jr = json_object_get(args, "rec");
	struct spaced_netpolicy p;
	int e;
	if (!json_is_string(js)) {
		why_set(why, whysz, "sandbox missing");
		return SPACED_EINVAL;
	}
	const char *sandbox = json_string_value(js);
	if ((e = net_policy_store(cfg, sandbox, jn, why, whysz)) < 0)
		return e;
	spaced_netpolicy_from_json(jn, &p, NULL, 0);
	bool applied = false;
	struct mgr_rec rec;
	uint32_t slot;
	if (jr && mgr_rec_from_json(jr, &rec) == 0 && rec.pid > 0 && net_enabled(cfg) && slot_of(cfg, &rec, &slot) == 0) {
		char path[4200], ns[4200];
		json_error_t jerr;
		snprintf(path, sizeof path, "%s/net/slot/%u.json", cfg->state_dir, (unsigned)slot);
		snprintf(ns, sizeof ns, "%s/net/ns", cfg->state_dir);
		json_t *cur = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
		const char *who = json_string_value(json_object_get(cur, "sandbox"));
		bool ours = who && strcmp(who, sandbox) == 0;
		json_decref(cur);
		if (ours && is_nsfs(ns)) {
			int lock = with_lock(cfg, why, whysz);
			if (lock < 0)
				return lock;
			if ((e = write_slot(cfg, slot, sandbox, &p, true)) == 0)
				e = apply_policy(cfg, ns, slot, &p, why, whysz);
			close(lock);
			if (e < 0)
				return e;
			applied = true;
		}
	}
	*result = json_pack("{s:b,s:o}", "applied", applied, "network", spaced_netpolicy_to_json(&p));
	return 0;
}
