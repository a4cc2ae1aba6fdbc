/*
 * node_main.c — spaced-node: starts sbx-manager and node-api (node.h).
 *
 *   spaced-node --state DIR --worker-id ID --listen HOST:PORT [--keys BUNDLE]
 *               [--guest-bin PATH] [--launcher PATH --host PATH] [--no-drop]
 *               [--limits-default LIST] [--limits-max LIST] [--disk-io bps=SIZE,iops=N]
 *               [--allocatable memory=SIZE,pids=N] [--memory-overcommit F]
 *               [--disk-reserve SIZE] [--disk-overcommit F] [--uid-range FIRST:COUNT]
 *               [--uid-lock-dir DIR] [--cgroup-parent spaced.NAME] [--stall-timeout S] [--forget-after S] [--acks-kept N] [--max-streams N]
 *               [--fence-after S]
 *               [--answer-memory SIZE] [--socket-buffer SIZE] [--gateway-memory SIZE] [--executor-jobs N]
 *               [--template-cache SIZE] [--template-max SIZE]
 *               [--pool N] [--pool-max N] [--pool-memory SIZE] [--pool-starts N] [--net-dns IP[:PORT]]
 *               [--net-rate BITS] [--cpu-latency-us N] [--cpu-spread on|off]
 *               [--cp URL [--join-token T | --join-token-file F] [--advertise URL] [--capacity N]]
 *               [--metrics-listen HOST:PORT] [--log-format text|json] [--config FILE]
 *               (--tls-cert FILE --tls-key FILE [--tls-client-ca FILE] | --plaintext)
 *               [--tls-ca FILE] [--tls-client-cert FILE --tls-client-key FILE]
 * LIST: "cpus=1,memory=512M,pids=512,disk=2G" (resources.h).
 * --allocatable: what the limits of this worker's sandboxes may add up to —
 * tasks exactly, memory times --memory-overcommit (default 2) — and what
 * all executions together are capped at (their parent cgroups: memory, and
 * tasks plus a little for the warm pool); default the host's memory and
 * tasks less a reserve for the host (an eighth, at least 1 GiB and 2048
 * tasks). Installs beyond it are refused `no-capacity`; maxima above it are
 * lowered to it.
 * --disk-reserve, --disk-overcommit: what the executions may still write to
 * their disks (sparse images: their limits less what they hold) stays within
 * F (default 2; 0: no check) times what the state directory's filesystem has
 * free beyond the reserve (default 5 %, at least 2 GiB) — the filesystem of
 * the worker's records, logs and template cache. Installs past it are
 * refused `no-capacity`.
 * --cgroup-parent: the directory, below spaced-node's own cgroup, that holds
 * its executions and caps them all together (default "spaced"): each worker
 * of a host that runs several in one cgroup needs its own ("spaced.NAME"),
 * else their caps are one.
 * --net-rate: bits per second each execution may send and, apart, receive on
 * its network path out (default 500M; 0: no bound; docs/network.md).
 * --net-openable CIDR[,CIDR]...: the parts of the closed set (loopback,
 * link-local, private ranges, the worker's own addresses) that a sandbox's
 * allow_out may open; none by default, so no tenant reaches the worker's own
 * services, a cloud's metadata address or the operator's private networks by
 * naming them (docs/network.md). Repeatable.
 * --net-closed CIDR[,CIDR]...: ranges added to the closed set (the operator's
 * other networks, a public subnet the worker is on, a provider's service
 * addresses): no sandbox reaches them and names resolving into them resolve
 * to nothing, unless --net-openable also names them and an allow_out does.
 * Repeatable.
 * --net-conns N: the connections the worker's egress carries for all its
 * executions together (default: what pasta's open-file limit allows, two
 * descriptors each); each execution is guaranteed an equal part of half of
 * it and draws beyond that from the other half, shared (docs/network.md).
 * --cpu-latency-us N: the longest wake-up latency this worker lets the
 * host's CPUs take when idle (a PM QoS request on /dev/cpu_dma_latency, held
 * while spaced-node runs; 0: an idle CPU polls instead of halting). A
 * request through node-api wakes four processes in turn (node-api, the gate,
 * the execution's guest, node-api again): on a virtual machine whose idle
 * vCPUs halt, each wake-up is a trip through the hypervisor. Costs the idle
 * CPU time it saves in latency; default: none (the kernel's choice).
 * --disk-io: what each execution may read and, apart, write per second on its
 * disk (writeback included) and on the lower layer's device (default
 * bps=256M,iops=4096; 0 in a field: no bound; "0": none at all).
 *
 * TLS (tls.h): node-api and the metrics listener serve TLS with --tls-cert
 * and --tls-key (with --tls-client-ca every client must present a
 * certificate of that CA); only --plaintext serves without it, and one of the
 * two is required. The link dials --cp https://… verifying the control plane
 * against --tls-ca (else the system's trust store) and presents
 * --tls-client-cert/--tls-client-key (mutual TLS: the certificate's name is
 * the worker ID); an http:// --cp needs --plaintext.
 *
 * With --cp the worker joins the control plane itself (link.c): the join
 * token (single use, bound to this worker ID) is spent once for a worker key
 * kept in DIR/worker.key; later starts need no token.
 *
 * The process started is the supervisor of the group of node.h (process
 * names spaced-gate, spaced-api, spaced-executor, spaced-link): the gate,
 * node-api (which binds the listener, writes the bound port to DIR/api.port,
 * then gives up its privileges and enters its seccomp allow-list before
 * serving) and the executor. When any of them dies, the group is started
 * again; so is the link to the control plane, on its own. SIGTERM stops
 * them and the supervisor; executions keep running.
 */
#include "node.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <libgen.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "spaced_error.h"
#include "util.h"
#include "tls.h"
#include "executor.h"
#include "log.h"
#include "net.h"
#include "netpolicy.h"
#include "pidref.h"
#include "substrate.h"

/* The n (1 to 3) numbers of a /proc/sys file; false when unreadable. */
static bool proc_read_n(const char *path, uint64_t *v, int n)
{
	unsigned long long x[3] = {0, 0, 0};
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	bool ok = fscanf(f, "%llu %llu %llu", &x[0], &x[1], &x[2]) >= n;
	fclose(f);
	for (int i = 0; ok && i < n; i++)
		v[i] = x[i];
	return ok;
}

/* The host's memory (MemTotal) and how many tasks it can hold (the smaller
 * of kernel.pid_max and kernel.threads-max). Returns 0 or -1. */
static int host_totals(uint64_t *mem_bytes, uint64_t *tasks)
{
	unsigned long long kib = 0;
	uint64_t pid_max = 0, threads = 0;
	char line[256];
	FILE *f = fopen("/proc/meminfo", "re");

	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "MemTotal: %llu kB", &kib) == 1)
			break;
	fclose(f);
	(void)proc_read_n("/proc/sys/kernel/pid_max", &pid_max, 1);
	(void)proc_read_n("/proc/sys/kernel/threads-max", &threads, 1);
	if (kib == 0 || pid_max == 0)
		return -1;
	*mem_bytes = (uint64_t)kib << 10;
	*tasks = threads > 0 && threads < pid_max ? threads : pid_max;
	return 0;
}

/* The worker's capacity for sandboxes (--allocatable, node.h): the fields
 * not given are the host's less a reserve for the host; the maxima are
 * lowered to it; all executions together are capped at it (tasks: and a
 * little for the warm pool's). Returns 0, or -1 with the reason on stderr. */
static int host_capacity(const char *launch, struct spaced_resources *alloc, struct spaced_resources *max)
{
	uint64_t mem, tasks;
	if (host_totals(&mem, &tasks) < 0) {
		fprintf(stderr, "spaced-node: cannot read the host's memory and task limits in /proc\n");
		return -1;
	}
	uint64_t mem_keep = mem / 8 > (1ull << 30) ? mem / 8 : 1ull << 30, tasks_keep = tasks / 8 > 2048 ? tasks / 8 : 2048;
	if (alloc->memory_bytes == 0)
		alloc->memory_bytes = mem > 2 * mem_keep ? mem - mem_keep : mem / 2;
	if (alloc->pids == 0)
		alloc->pids = tasks > 2 * tasks_keep ? tasks - tasks_keep : tasks / 2;
	if (max->memory_bytes > alloc->memory_bytes)
		max->memory_bytes = alloc->memory_bytes;
	if (max->pids > alloc->pids)
		max->pids = alloc->pids;
	/* by the launcher, which holds the substrate (its children's cgroups
	 * are those of this process) */
	char m[24], t[24];
	snprintf(m, sizeof m, "%llu", (unsigned long long)alloc->memory_bytes);
	snprintf(t, sizeof t, "%llu", (unsigned long long)alloc->pids + 1024);
	pid_t pid = fork();
	if (pid == 0) {
		execl(launch, "spaced-launch", "cap", m, t, (char *)NULL);
		_exit(127);
	}
	int st = 0;
	while (pid > 0 && waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (pid < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "spaced-node: cannot cap all executions together (spaced-launch cap)\n");
		return -1;
	}
	return 0;
}

/* A decimal option value within lo .. hi into *out: false for anything else
 * (empty, a sign where lo >= 0, trailing characters, out of range). */
static bool num_opt(const char *v, long lo, long hi, long *out)
{
	char *end = NULL;
	errno = 0;
	long n = strtol(v, &end, 10);
	if (errno || !v[0] || !end || *end || (lo >= 0 && v[0] == '-') || n < lo || n > hi)
		return false;
	*out = n;
	return true;
}

/* Bits per second: "500M", "1G", "64K", "100000" (decimal units); "0": none. */
static int net_rate_parse(const char *text, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long x = strtoull(text, &end, 10);
	uint64_t unit = 1;
	if (errno || end == text || text[0] == '-')
		return -1;
	if (*end == 'K' || *end == 'k')
		unit = 1000, end++;
	else if (*end == 'M' || *end == 'm')
		unit = 1000000, end++;
	else if (*end == 'G' || *end == 'g')
		unit = 1000000000, end++;
	if (*end || x > (1ull << 40) / unit || (x > 0 && x * unit < 8000))
		return -1; /* nothing slower than 8 kbit/s */
	*out = x * unit;
	return 0;
}

/* "bps=SIZE,iops=N" (either, fields named replace the defaults) or "0". */
static int disk_io_parse(const char *text, uint64_t *bps, uint64_t *iops)
{
	char buf[128], *save = NULL;
	uint64_t b = *bps, o = *iops;

	if (strcmp(text, "0") == 0) {
		*bps = *iops = 0;
		return 0;
	}
	if (snprintf(buf, sizeof buf, "%s", text) >= (int)sizeof buf)
		return -1;
	for (char *f = strtok_r(buf, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
		char *end;
		if (strncmp(f, "bps=", 4) == 0) {
			if (spaced_size_parse(f + 4, &b) < 0)
				return -1;
		} else if (strncmp(f, "iops=", 5) == 0) {
			errno = 0;
			unsigned long long x = strtoull(f + 5, &end, 10);
			if (errno || end == f + 5 || *end || f[5] == '-' || x > UINT32_MAX)
				return -1;
			o = x;
		} else
			return -1;
	}
	*bps = b;
	*iops = o;
	return 0;
}

/* --request-cpu: "weight=N,max=CPUS,pin=CPU|last|off" (any of them; fields
 * named replace the defaults) or "off". pin: *pin is the CPU, -2 for the
 * last this process may use, -1 for none. *cgroup: weight or max named (the
 * cgroup is then asked for, and must be had). */
static int request_cpu_parse(const char *text, uint32_t *weight, uint32_t *max_milli, int *pin, bool *on,
                             bool *cgroup)
{
	char buf[128];
	uint32_t w = *weight, m = *max_milli;
	int pn = *pin;

	bool cg = false;
	if (strcmp(text, "off") == 0) {
		*on = false;
		*cgroup = false;
		return 0;
	}
	if (snprintf(buf, sizeof buf, "%s", text) >= (int)sizeof buf)
		return -1;
	/* every field named, none empty ("", "weight=8," are refused) */
	for (char *f = buf, *next; f; f = next) {
		long n;
		next = strchr(f, ',');
		if (next)
			*next++ = '\0';
		if (strncmp(f, "weight=", 7) == 0) {
			if (!num_opt(f + 7, 1, 100, &n))
				return -1;
			w = (uint32_t)n;
			cg = true;
		} else if (strncmp(f, "max=", 4) == 0) {
			cg = true;
			if (strcmp(f + 4, "0") == 0)
				m = 0;
			else if (spaced_cpus_parse(f + 4, &m) < 0 || m < 100)
				return -1;
		} else if (strncmp(f, "pin=", 4) == 0) {
			if (strcmp(f + 4, "off") == 0)
				pn = -1;
			else if (strcmp(f + 4, "last") == 0)
				pn = -2;
			else if (!num_opt(f + 4, 0, CPU_SETSIZE - 1, &n))
				return -1;
			else
				pn = (int)n;
		} else
			return -1;
	}
	*weight = w;
	*max_milli = m;
	*pin = pn;
	*on = true;
	*cgroup = cg;
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: spaced-node --state DIR --worker-id ID --listen HOST:PORT [--keys BUNDLE]\n"
	                "                   [--guest-bin PATH] [--launcher PATH --host PATH] [--no-drop]\n"
	                "                   [--vm PATH --vm-images DIR [--vsockd PATH] [--qemu PATH] [--vm-accel tcg|kvm]]\n"
	                "                   [--limits-default LIST] [--limits-max LIST] [--disk-io bps=SIZE,iops=N]\n"
	                "                   [--allocatable memory=SIZE,pids=N] [--memory-overcommit F]\n"
	                "                   [--disk-reserve SIZE] [--disk-overcommit F] [--uid-range FIRST:COUNT]\n"
	                "                   [--uid-lock-dir DIR] [--cgroup-parent spaced.NAME] [--stall-timeout S]\n"
	                "                   [--forget-after S] [--acks-kept N] [--fence-after S]\n"
	                "                   [--max-streams N] [--answer-memory SIZE] [--socket-buffer SIZE]\n"
	                "                   [--gateway-memory SIZE] [--executor-jobs N]\n"
	                "                   [--template-cache SIZE]\n"
	                "                   [--template-max SIZE] [--pool N] [--pool-max N] [--pool-memory SIZE]\n"
	                "                   [--pool-starts N] [--net-dns IP[:PORT]] [--net-rate BITS] [--net-openable CIDR[,CIDR]...]\n"
	                "                   [--net-closed CIDR[,CIDR]...]\n"
	                "                   [--net-conns N] [--cpu-latency-us N] [--cpu-spread on|off] [--request-cpu weight=N,max=CPUS,pin=CPU|last|off]\n"
	                "                   [--cp URL [--join-token T | --join-token-file F] [--advertise URL] [--capacity N]]\n"
	                "                   [--metrics-listen HOST:PORT] [--log-format text|json] [--config FILE]\n"
	                "                   (--tls-cert FILE --tls-key FILE [--tls-client-ca FILE] | --plaintext)\n"
	                "                   [--tls-ca FILE] [--tls-client-cert FILE --tls-client-key FILE]\n"
	                "  LIST: cpus=N,memory=SIZE,pids=N,disk=SIZE\n"
	                "       spaced-node net-down --state DIR\n");
}

/* `spaced-node net-down --state DIR`: the worker's egress taken down for a
 * decommission (net.h net_down). Executions keep their network across
 * restarts of spaced-node, so stopping it leaves the egress namespace, pasta
 * and spaced-netd up; this is the step after it. Refused while a spaced-node
 * serves DIR (its admin socket answers). */
static int net_down_main(int argc, char **argv)
{
	if (argc != 3 || strcmp(argv[1], "--state") != 0) {
		usage();
		return 2;
	}
	char admin[4200], why[256] = "";
	snprintf(admin, sizeof admin, "%s/admin.sock", argv[2]);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && strlen(admin) < sizeof sa.sun_path) {
		memcpy(sa.sun_path, admin, strlen(admin) + 1);
		if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
			close(fd);
			fprintf(stderr, "spaced-node: net-down: a spaced-node serves %s (its admin socket answers): stop it first\n",
			        argv[2]);
			return 1;
		}
	}
	if (fd >= 0)
		close(fd);
	if (net_down(argv[2], why, sizeof why) < 0) {
		fprintf(stderr, "spaced-node: net-down: %s\n", why);
		return 1;
	}
	return 0;
}

/* ---- the group: gate, node-api, executor ---- */

#define REQUEST_PATH_NICE (-10)

/* Starts node-api and the executor, then runs the gate in this process until
 * a link goes away; the children end with it (parent-death signal). */
/* A listener of node-api: where, and the file its bound port is written to. */
struct listener {
	const char *host; /* NULL: none */
	int port;         /* 0 until the first group bound one */
	const char *port_file;
};

/* The port the first group bound (from its port file), so that a restart
 * keeps the worker's addresses. */
static void keep_port(struct listener *l)
{
	if (!l->host || l->port != 0)
		return;
	FILE *f = fopen(l->port_file, "r");
	int p = 0;
	if (f && fscanf(f, "%d", &p) == 1 && p > 0 && p < 65536)
		l->port = p;
	if (f)
		fclose(f);
}

static const struct spaced_tls_opts *TLS;

/* --request-cpu: the request path's weight and ceiling (max = 0: none);
 * the ceiling's default is set from the host's CPUs in main */
static bool REQUEST_CPU_ON = true, REQUEST_CPU_ASKED;
static uint32_t REQUEST_CPU_WEIGHT = 1, REQUEST_CPU_MAX_MILLI = UINT32_MAX;
static int REQUEST_CPU_PIN = -2;

/* The calling process into the request path's CPU cgroup: weighed by
 * default as much as all executions together (their parent), held to a
 * ceiling, and counted apart. The ceiling, since no sandbox is charged for
 * what node-api and the gate do on its behalf: at most half the host's CPUs
 * by default, so that request floods (small requests, TLS handshakes, forged
 * capabilities: no sandbox needed for the last two) never take more than
 * that from the executions. The weight, since a request needs both the
 * request path and the sandbox's guest, which runs among the executions:
 * weighed higher the request path took the CPU the guest needed
 * (bench-hostile: ratios 4.7-6.0 at eight times, 4.6 at twice, 2.9-3.4 at
 * once). A host without a CPU controller keeps the processes where they
 * are. */
static void request_cpu_join(bool say)
{
	char why[300] = "";
	if (!REQUEST_CPU_ON || geteuid() != 0)
		return;
	int r = spaced_sub_request_cpu_join(REQUEST_CPU_WEIGHT, REQUEST_CPU_MAX_MILLI, why, sizeof why);
	if (r < 0 && say)
		fprintf(stderr, "spaced-node: the request path keeps the host's CPU share: %s\n", why);
}

/* The gate and node-api (forked after this) on one CPU (--request-cpu pin=,
 * by default the last this process may use): each request crosses both,
 * four wake-ups, and a wake-up on another CPU costs a trip through an idle
 * CPU's wake (an interrupt to it, on a virtual machine the hypervisor's
 * halt and resume): bench-node's overhead over a direct bridge read was
 * 43.9-71.2 us with them free, 28.0-49.2 us pinned (five alternating pairs,
 * each pinned run below its pair). Their ceiling (max=) was half the host's
 * CPUs, one here; their own loops are one thread each. Nothing to pin on a
 * host with one CPU allowed. */
static void request_path_pin(void)
{
	cpu_set_t set;
	int cpu = REQUEST_CPU_PIN;
	if (!REQUEST_CPU_ON || cpu == -1)
		return;
	CPU_ZERO(&set);
	if (sched_getaffinity(0, sizeof set, &set) < 0 || CPU_COUNT(&set) < 2)
		return;
	for (int c = CPU_SETSIZE - 1; cpu == -2 && c >= 0; c--)
		if (CPU_ISSET(c, &set))
			cpu = c;
	if (cpu < 0 || !CPU_ISSET(cpu, &set)) {
		fprintf(stderr, "spaced-node: --request-cpu pin=%d: not a CPU this process may use; not pinned\n", cpu);
		return;
	}
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof set, &set) < 0)
		fprintf(stderr, "spaced-node: cannot pin the request path to CPU %d: %s\n", cpu, strerror(errno));
}

/* A --request-cpu the operator gave is enforced or spaced-node does not
 * start (the default, where the host has no CPU controller, only says so
 * when the gate starts): a child joins, as the gate will, and ends. 0, or
 * -1 with the reason on stderr. */
static int request_cpu_check(void)
{
	if (!REQUEST_CPU_ASKED)
		return 0;
	if (geteuid() != 0) {
		fprintf(stderr, "spaced-node: --request-cpu needs root (a CPU cgroup)\n");
		return -1;
	}
	pid_t pid = fork();
	if (pid < 0) {
		perror("spaced-node: --request-cpu: fork");
		return -1;
	}
	if (pid == 0) {
		char why[300] = "";
		if (spaced_sub_request_cpu_join(REQUEST_CPU_WEIGHT, REQUEST_CPU_MAX_MILLI, why, sizeof why) < 0) {
			fprintf(stderr, "spaced-node: --request-cpu cannot be enforced here: %s\n", why);
			_exit(1);
		}
		_exit(0);
	}
	int st = 0;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}
static uint64_t ANSWER_MEMORY = NODE_ANSWER_MEMORY, SOCKET_BUFFER = NODE_SOCKET_BUFFER;

static int run_group(struct mgr_config *mc, const struct listener *api_l, const struct listener *met_l, bool drop)
{
	int api[2], exe[2];
	prctl(PR_SET_PDEATHSIG, SIGKILL); /* the group never outlives its supervisor */
	prctl(PR_SET_NAME, "spaced-gate");
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, api) < 0 ||
	    socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, exe) < 0) {
		perror("spaced-node: socketpair");
		return 1;
	}
	pid_t exe_pid = fork();
	if (exe_pid < 0)
		return 1;
	if (exe_pid == 0) {
		close(exe[0]);
		close(api[0]);
		close(api[1]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		prctl(PR_SET_NAME, "spaced-executor");
		_exit(executor_run(mc, exe[1]));
	}
	/* the request path (the gate, node-api and the link) in a CPU cgroup of
	 * its own (request_cpu_join), the executor and what it starts not:
	 * joined after the executor's fork, before node-api's (which inherits
	 * it and the gate's priority); inside it, and where there is no such
	 * cgroup, the gate and node-api run ahead of the link (best effort:
	 * needs CAP_SYS_NICE) */
	request_cpu_join(true);
	setpriority(PRIO_PROCESS, 0, REQUEST_PATH_NICE);
	request_path_pin();
	pid_t api_pid = fork();
	if (api_pid < 0)
		return 1;
	if (api_pid == 0) {
		close(api[0]);
		close(exe[0]);
		close(exe[1]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		prctl(PR_SET_NAME, "spaced-api");
		if (getppid() == 1)
			_exit(1);
		struct node_api_config ac = {.listen_host = api_l->host, .listen_port = api_l->port, .mgr_fd = api[1],
		                             .port_file = api_l->port_file, .drop_privileges = drop,
		                             .metrics_host = met_l->host, .metrics_port = met_l->port,
		                             .metrics_port_file = met_l->port_file,
		                             .tls_cert = TLS->cert, .tls_key = TLS->key, .tls_client_ca = TLS->client_ca,
		                             .answer_memory = ANSWER_MEMORY, .socket_buffer = SOCKET_BUFFER,
		                             .stall_timeout_ms = mc->stall_timeout_ms};
		_exit(node_api_run(&ac));
	}
	close(api[1]);
	close(exe[1]);
	mc->api_fd = api[0];
	mc->api_pid = api_pid;
	mc->exe_fd = exe[0];
	mc->exe_pid = exe_pid;
	spaced_proc_start_time(exe_pid, &mc->exe_start);
	int rc = mgr_run(mc);
	kill(api_pid, SIGTERM);
	kill(exe_pid, SIGTERM);
	waitpid(api_pid, NULL, 0);
	waitpid(exe_pid, NULL, 0);
	return rc;
}

/* ---- the supervisor ---- */

static volatile sig_atomic_t stopping;

static void on_stop(int sig)
{
	(void)sig;
	stopping = 1;
}

/* A child the supervisor keeps running: the group, or the link. */
struct kept {
	const char *name;
	pid_t pid;          /* 0 while not running */
	long due_ms;        /* when it is started next (monotonic ms) */
	long started_ms;
	long pause_ms;      /* the pause before the next start after an end */
	bool off;           /* not started again (the link after a refusal) */
};

static long mono_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Forks a child with the supervisor's signal state undone. */
static pid_t fork_child(void)
{
	pid_t p = fork();
	if (p == 0) {
		struct sigaction dfl;
		memset(&dfl, 0, sizeof dfl);
		dfl.sa_handler = SIG_DFL;
		sigaction(SIGTERM, &dfl, NULL);
		sigaction(SIGINT, &dfl, NULL);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
	}
	return p;
}

static void write_pid(const char *state, const char *name, pid_t pid)
{
	char path[PATH_MAX], tmp[PATH_MAX + 8];
	snprintf(path, sizeof path, "%s/%s.pid", state, name);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (f && fprintf(f, "%d\n", (int)pid) > 0 && fclose(f) == 0)
		rename(tmp, path);
	else if (f)
		fclose(f);
}

/* Runs the group (and the link, when lc is given) and starts each again
 * whenever it ends, until SIGTERM or SIGINT: a pause of 100 ms before the
 * first restart, doubling up to 5 s, back to 100 ms once it has run for 30 s.
 * A link that ends with LINK_EXIT_FATAL (the control plane refused it) is
 * not started again. node-api listens on the port the first group bound, so
 * a restart keeps the worker's address. As the child subreaper, the
 * supervisor also reaps the processes it adopts. */
static int supervise(struct mgr_config *mc, const struct link_config *lc, struct listener *api_l,
                     struct listener *met_l, bool drop)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_stop;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	sigset_t chld;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, NULL);
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	struct kept group = {.name = "group", .pause_ms = 100}, link = {.name = "link", .pause_ms = 100, .off = !lc};
	struct kept *kids[] = {&group, &link};
	int group_starts = 0;
	while (!stopping) {
		long now = mono_ms();
		for (size_t i = 0; i < 2; i++) {
			struct kept *k = kids[i];
			if (k->pid || k->off || now < k->due_ms)
				continue;
			if (k == &group && group_starts > 0) {
				keep_port(api_l);
				keep_port(met_l);
			}
			pid_t p = fork_child();
			if (p < 0) {
				perror("spaced-node: fork");
				k->due_ms = now + 1000;
				continue;
			}
			if (p == 0) {
				if (k == &group)
					_exit(run_group(mc, api_l, met_l, drop));
				prctl(PR_SET_PDEATHSIG, SIGTERM);
				prctl(PR_SET_NAME, "spaced-link");
				if (getppid() == 1)
					_exit(1);
				request_cpu_join(false);
				_exit(link_run(lc));
			}
			k->pid = p;
			k->started_ms = now;
			if (k == &group)
				group_starts++;
			else
				write_pid(mc->state_dir, "link", p);
		}
		int st = 0;
		pid_t w = waitpid(-1, &st, WNOHANG);
		if (w > 0) {
			for (size_t i = 0; i < 2; i++) {
				struct kept *k = kids[i];
				if (k->pid != w)
					continue;
				k->pid = 0;
				long up = mono_ms() - k->started_ms;
				if (up > 30000)
					k->pause_ms = 100;
				if (k == &link && WIFEXITED(st) && WEXITSTATUS(st) == LINK_EXIT_FATAL) {
					fprintf(stderr, "spaced-node: the link to the control plane was refused; it is not started "
					                "again (the worker serves what it has until its lease ends and it fences, "
					                "--fence-after; see the messages above)\n");
					k->off = true;
					break;
				}
				fprintf(stderr, "spaced-node: the %s ended (status 0x%x after %ld ms); starting it again in %ld ms\n",
				        k == &group ? "worker's processes" : "link to the control plane", (unsigned)st, up,
				        k->pause_ms);
				k->due_ms = mono_ms() + k->pause_ms;
				k->pause_ms = k->pause_ms * 2 > 5000 ? 5000 : k->pause_ms * 2;
			}
			continue; /* an adopted process (a launcher, a bridge) is simply reaped */
		}
		/* nothing to reap: wait for a child's end, a signal or the next start */
		long wait_ms = 1000;
		for (size_t i = 0; i < 2; i++)
			if (!kids[i]->pid && !kids[i]->off)
				wait_ms = kids[i]->due_ms - mono_ms() < wait_ms ? kids[i]->due_ms - mono_ms() : wait_ms;
		if (wait_ms > 0) {
			struct timespec ts = {wait_ms / 1000, (wait_ms % 1000) * 1000000L};
			sigtimedwait(&chld, NULL, &ts);
		}
	}
	/* the group and the link end with the supervisor; adopted processes
	 * (executions) keep running and are found again by the next start */
	for (size_t i = 0; i < 2; i++)
		if (kids[i]->pid)
			kill(kids[i]->pid, SIGTERM);
	for (size_t i = 0; i < 2; i++)
		if (kids[i]->pid)
			waitpid(kids[i]->pid, NULL, 0);
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	if (REQUEST_CPU_ON && geteuid() == 0)
		spaced_sub_request_cpu_remove();
	if (geteuid() == 0)
		spaced_sub_background_cpu_remove();
	return 0;
}

/* The TLS options against each other and the control plane's URL, and the
 * files they name (read again by each node-api, before it confines itself,
 * and by the link): 0, or -1 with the reason on stderr. */
static int tls_check(const struct spaced_tls_opts *tls, const char *cp_url)
{
	char terr[600];
	if (spaced_tls_opts_check(tls, terr, sizeof terr) < 0) {
		fprintf(stderr, "spaced-node: %s\n", terr);
		return -1;
	}
	SSL_CTX *probe = NULL;
	if (!tls->plaintext) {
		if (spaced_tls_server_ctx(tls->cert, tls->key, tls->client_ca, true, &probe, terr, sizeof terr) < 0) {
			fprintf(stderr, "spaced-node: %s\n", terr);
			return -1;
		}
		SSL_CTX_free(probe);
	}
	bool https = cp_url && strncmp(cp_url, "https://", 8) == 0;
	if (cp_url && !https && !(strncmp(cp_url, "http://", 7) == 0 && tls->plaintext)) {
		fprintf(stderr, "spaced-node: --cp wants https://HOST:PORT (http:// only with --plaintext: the worker "
		                "key would cross the network in the clear)\n");
		return -1;
	}
	if ((tls->ca || tls->client_cert) && !https) {
		fprintf(stderr, "spaced-node: --tls-ca, --tls-client-cert and --tls-client-key go with --cp https://…\n");
		return -1;
	}
	if (https) {
		if (spaced_tls_client_ctx(tls->ca, tls->client_cert, tls->client_key, &probe, terr, sizeof terr) < 0) {
			fprintf(stderr, "spaced-node: %s\n", terr);
			return -1;
		}
		SSL_CTX_free(probe);
	}
	return 0;
}

static char *default_guest(void)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0)
		return NULL;
	self[n] = '\0';
	char *dir = dirname(self);
	char path[PATH_MAX];
	if (snprintf(path, sizeof path, "%s/../spaced-guest/spaced-guest", dir) >= (int)sizeof path)
		return NULL;
	if (access(path, X_OK) != 0)
		return NULL;
	return realpath(path, NULL);
}

/* STATE/guest/spaced-guest: a copy of guest, root's, mode 0511 (execute only
 * for anyone else), made afresh at each start (replaced by rename: running
 * executions keep the one they mapped). Its path (malloc'd), NULL after a
 * message on failure. */
static char *guest_sealed(const char *guest, const char *state)
{
	char dir[PATH_MAX], tmp[PATH_MAX + 32], *out = NULL;
	snprintf(dir, sizeof dir, "%s/guest", state);
	snprintf(tmp, sizeof tmp, "%s/.spaced-guest.tmp", dir);
	int in = open(guest, O_RDONLY | O_CLOEXEC), fd = -1;
	struct stat sb;
	if (in < 0 || fstat(in, &sb) < 0 || (mkdir(dir, 0755) < 0 && errno != EEXIST) ||
	    (unlink(tmp) < 0 && errno != ENOENT) || (fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0500)) < 0)
		goto fail;
	struct stat copied;
	if (spaced_copy_range(in, fd, 0, sb.st_size, NULL) < 0 || fstat(fd, &copied) < 0 || copied.st_size != sb.st_size)
		goto fail;
	if (fchown(fd, 0, 0) < 0 || fchmod(fd, 0511) < 0 || fsync(fd) < 0 || close(fd) < 0) {
		fd = -1;
		goto fail;
	}
	fd = -1;
	if (asprintf(&out, "%s/spaced-guest", dir) < 0 || rename(tmp, out) < 0)
		goto fail;
	close(in);
	return out;
fail:
	fprintf(stderr, "spaced-node: cannot make the executions' copy of %s in %s: %s\n", guest, dir, strerror(errno));
	if (fd >= 0)
		close(fd);
	if (in >= 0)
		close(in);
	unlink(tmp);
	free(out);
	return NULL;
}

/* Raises each of the n numbers of the host's setting at path (a /proc/sys
 * file: one, or three for tcp_mem and udp_mem) to need[i] when it holds
 * less, keeping those it holds above. Returns 0 when it holds need now;
 * SPACED_ESYS with why when it does not (the host's setting is kept). */
static int sysctl_at_least(const char *path, const uint64_t *need, int n, char *why, size_t whysz)
{
	uint64_t have[3] = {0, 0, 0};
	bool enough = proc_read_n(path, have, n);
	for (int i = 0; enough && i < n; i++)
		enough = have[i] >= need[i];
	if (enough)
		return 0;
	char text[96] = "";
	for (int i = 0; i < n; i++) {
		size_t l = strlen(text);
		snprintf(text + l, sizeof text - l, "%s%" PRIu64, i ? " " : "", have[i] > need[i] ? have[i] : need[i]);
	}
	FILE *f = fopen(path, "w");
	bool raised = f && fprintf(f, "%s\n", text) > 0;
	if (f && fclose(f) != 0)
		raised = false;
	for (int i = 0; raised && i < n; i++)
		raised = proc_read_n(path, have, n) && have[i] >= need[i];
	if (raised)
		return 0;
	snprintf(why, whysz, "%s could not be raised to %s", path, text);
	return SPACED_ESYS;
}

/* Host-wide kernel counts that executions draw on, made large enough that
 * what bounds each execution is its own limit, never what others took
 * (alloc_mem: what the limits of the worker's executions add up to,
 * overcommit included):
 * - kernel.pty.max: each execution's devpts instance holds SPACED_SUB_PTY_MAX
 *   terminals, all instances but the host's share pty.max less pty.reserve;
 * - fs.aio-max-nr: io_setup's events, one count for the whole host (65536 by
 *   default: one sandbox took all and every other one and the host got
 *   EAGAIN); each event's 32 bytes of ring are charged to the execution's
 *   memory: raised by alloc_mem / 32;
 * - fs.file-max: open files of the whole host (the kernel's default, a tenth
 *   of memory at 1 KiB each: 2.4 M here, which one 1.5 GiB sandbox filled
 *   with eventfds, and every other sandbox and the host's unprivileged
 *   processes got ENFILE); each file is charged to its execution's memory
 *   (about 420 bytes): raised by alloc_mem / 256;
 * - net.ipv4.tcp_mem, udp_mem: the socket memory of the whole host, in
 *   pages; past the first number every UDP socket of the host is held to
 *   4 KiB queued (TCP: past the second, pressure), and a few large
 *   sandboxes filled it. Each execution's socket buffers are held to a
 *   quarter of its memory limit (sub_cgroup.c, memory.kmem.tcp on v1, which
 *   also counts UDP; memory.max on v2): each number raised by alloc_mem / 4
 *   over the kernel's own default (a sixteenth of memory for TCP, an eighth
 *   for UDP), so the host's sockets keep theirs.
 * Warns on stderr for what cannot be raised. */
static void host_kernel_room(uint32_t slots, uint64_t alloc_mem)
{
	char why[256];
	uint64_t mem = 0, tasks = 0, reserve = 0;
	(void)proc_read_n("/proc/sys/kernel/pty/reserve", &reserve, 1);
	uint64_t pty = reserve + (uint64_t)slots * SPACED_SUB_PTY_MAX;
	if (pty > (UINT64_C(1) << 20)) /* NR_UNIX98_PTY_MAX */
		pty = UINT64_C(1) << 20;
	uint64_t aio = 65536 + alloc_mem / 32, files = 0;
	if (host_totals(&mem, &tasks) == 0)
		files = mem / 1024 / 10 + alloc_mem / 256;
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), add = alloc_mem / 4 / page;
	uint64_t tcp = mem / page / 16, udp = mem / page / 8;
	const struct {
		const char *path, *risk;
		uint64_t need[3];
		int n;
	} room[] = {
		{"/proc/sys/kernel/pty/max", "executions past it find no terminal", {pty}, 1},
		{"/proc/sys/fs/aio-max-nr", "an execution's io_setup can take what others need", {aio}, 1},
		{"/proc/sys/fs/file-max", "an execution's open files can take what others need", {files}, 1},
		{"/proc/sys/net/ipv4/tcp_mem", "executions' socket buffers can take the host's",
		 {tcp / 4 * 3 + add, tcp + add, tcp / 2 * 3 + add}, 3},
		{"/proc/sys/net/ipv4/udp_mem", "executions' socket buffers can take the host's",
		 {udp / 4 * 3 + add, udp + add, udp / 2 * 3 + add}, 3},
	};
	for (size_t i = 0; i < sizeof room / sizeof room[0]; i++)
		if ((room[i].n > 1 || room[i].need[0] > 0) &&
		    sysctl_at_least(room[i].path, room[i].need, room[i].n, why, sizeof why) < 0)
			spaced_log("spaced-node", "level=warn event=host-setting reason=\"%s: %s\"", why, room[i].risk);
}

/* --cpu-latency-us: the PM QoS request, held by this process (the
 * supervisor: it outlives its children's restarts) until it exits, when the
 * kernel drops it. Returns 0, or -1 with the reason on stderr. */
static int cpu_latency_hold(int32_t us)
{
	int fd = open("/dev/cpu_dma_latency", O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, &us, sizeof us) != (ssize_t)sizeof us) {
		fprintf(stderr, "spaced-node: --cpu-latency-us: /dev/cpu_dma_latency: %s\n", strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	spaced_log("spaced-node", "level=info event=cpu-latency us=%d", (int)us);
	return 0; /* fd stays open */
}

/* kernel.pid_max raised to kernel.threads-max (at most 4194304, the
 * kernel's limit), before the host's tasks are read for --allocatable: a
 * small machine's default (32768) is far below the tasks its memory holds,
 * and the pid numbers were the count sandboxes ran out of first — with
 * two workers on one host, each capping its executions at the host's tasks
 * less a reserve, their sandboxes together took every pid and the host's
 * own processes could not fork. Threads cost kernel memory that each
 * execution's memory limit pays for; what bounds the host's tasks is
 * threads-max (its memory), the same for every start of the worker. */
static void host_pid_room(void)
{
	char why[256];
	uint64_t threads = 0;
	if (!proc_read_n("/proc/sys/kernel/threads-max", &threads, 1) || threads == 0)
		return;
	uint64_t need = threads < 4194304 ? threads : 4194304;
	if (sysctl_at_least("/proc/sys/kernel/pid_max", &need, 1, why, sizeof why) < 0)
		spaced_log("spaced-node", "level=warn event=host-setting reason=\"%s: %s\"", why,
		           "sandboxes can take every pid number before their own limits");
}

int main(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "net-down") == 0)
		return net_down_main(argc - 1, argv + 1);
	const char *state = NULL, *worker = NULL, *listen_s = NULL, *keys = NULL;
	char *guest = NULL, *launch = NULL, *host_bin = NULL, err[160];
	char *vm_bin = NULL, *vm_images = NULL, *vsockd_bin = NULL, *qemu_bin = NULL;
	const char *vm_accel = NULL;
	const char *uid_lock_dir = "/run/spaced/uid-ranges";
	bool drop = true;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	/* defaults: one CPU, 512 MiB, 512 tasks, 2 GiB of disk; maxima: the
	 * machine's CPUs, 16 GiB, 32768 tasks, 64 GiB */
	struct spaced_resources def = {1000, 512ull << 20, 512, 2ull << 30};
	struct spaced_resources max = {(uint32_t)(ncpu > 0 ? ncpu : 1) * 1000, 16ull << 30, 32768, 64ull << 30};
	uint32_t uid_first = 1u << 30, uid_slots = 4096;
	int stall_ms = 60000, forget_after = SPACED_CAP_LIFETIME + SPACED_CAP_SKEW + 60, acks_kept = 4096,
	    max_streams = 1024, fence_after = 60;
	/* the upstream resolver of executions' DNS (docs/network.md); SPACED_NET_DNS for development clusters */
	const char *net_dns = getenv("SPACED_NET_DNS");
	uint64_t net_rate = 500000000; /* 500 Mbit/s each way */
	uint32_t net_conns = 0;        /* pasta's open-file limit decides */
	int32_t cpu_latency_us = -1;   /* no PM QoS request */
	static struct spaced_cidr net_openable[SPACED_NET_RULES_MAX], net_closed[SPACED_NET_RULES_MAX];
	size_t net_nopenable = 0, net_nclosed = 0;
	const char *cp_url = NULL, *join_token = NULL, *join_file = NULL, *advertise = NULL, *metrics_listen = NULL;
	long capacity = 64;
	/* templates: 8 GiB each at most, a cache of 20 GiB */
	uint64_t tmpl_max = 8ull << 30, tmpl_cache_max = 20ull << 30;
	/* the warm pool: 2 kept for the default template and limits, up to 64 per
	 * template and limits as demand asks, within 256 MiB, 2 starting at once */
	int pool_min = 2, pool_max = 64, pool_starts = 2;
	uint64_t pool_memory = 256ull << 20;
	uint64_t disk_bps = 256ull << 20, disk_iops = 4096, gateway_memory = 64ull << 20;
	unsigned executor_jobs = 0;
	struct spaced_resources alloc = {0};
	double mem_overcommit = 2.0, disk_overcommit = 2.0;
	uint64_t disk_reserve = 0;
	static struct spaced_tls_opts tls;

	char cfg_err[256];
	if (spaced_config_expand(argc, argv, &argc, &argv, cfg_err, sizeof cfg_err) < 0) {
		fprintf(stderr, "spaced-node: --config: %s\n", cfg_err);
		return 2;
	}
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--no-drop") == 0) {
			drop = false;
			continue;
		}
		int topt = spaced_tls_opt(&tls, a, v);
		if (topt == 2)
			continue;
		if (topt == 1) {
			i++;
			continue;
		}
		if (!v) {
			usage();
			return 2;
		}
		if (strcmp(a, "--state") == 0)
			state = v;
		else if (strcmp(a, "--worker-id") == 0)
			worker = v;
		else if (strcmp(a, "--listen") == 0)
			listen_s = v;
		else if (strcmp(a, "--keys") == 0)
			keys = v;
		else if (strcmp(a, "--guest-bin") == 0)
			guest = realpath(v, NULL);
		else if (strcmp(a, "--launcher") == 0)
			launch = realpath(v, NULL);
		else if (strcmp(a, "--host") == 0)
			host_bin = realpath(v, NULL);
		else if (strcmp(a, "--vm") == 0)
			vm_bin = realpath(v, NULL);
		else if (strcmp(a, "--vm-images") == 0)
			vm_images = realpath(v, NULL);
		else if (strcmp(a, "--vsockd") == 0)
			vsockd_bin = realpath(v, NULL);
		else if (strcmp(a, "--qemu") == 0)
			qemu_bin = realpath(v, NULL);
		else if (strcmp(a, "--vm-accel") == 0) {
			if (strcmp(v, "tcg") != 0 && strcmp(v, "kvm") != 0) {
				fprintf(stderr, "spaced-node: --vm-accel wants tcg or kvm\n");
				return 2;
			}
			vm_accel = v;
		}
		else if (strcmp(a, "--limits-default") == 0 || strcmp(a, "--limits-max") == 0) {
			if (spaced_resources_parse(v, a[9] == 'd' ? &def : &max, err, sizeof err) < 0) {
				fprintf(stderr, "spaced-node: %s: %s\n", a, err);
				return 2;
			}
		} else if (strcmp(a, "--allocatable") == 0) {
			if (spaced_resources_parse(v, &alloc, err, sizeof err) < 0 || alloc.cpu_milli || alloc.disk_bytes) {
				fprintf(stderr, "spaced-node: --allocatable wants memory=SIZE,pids=N%s%s\n", err[0] ? ": " : "", err);
				return 2;
			}
		} else if (strcmp(a, "--memory-overcommit") == 0 || strcmp(a, "--disk-overcommit") == 0) {
			char *end;
			double f = strtod(v, &end);
			/* --disk-overcommit 0: no check of the host's disk */
			if (*end || end == v || !((f >= 1.0 && f <= 64.0) || (f == 0 && a[2] == 'd'))) {
				fprintf(stderr, "spaced-node: %s wants a number from 1 to 64%s\n", a, a[2] == 'd' ? ", or 0" : "");
				return 2;
			}
			*(a[2] == 'm' ? &mem_overcommit : &disk_overcommit) = f;
		} else if (strcmp(a, "--disk-reserve") == 0) {
			if (spaced_size_parse(v, &disk_reserve) < 0) {
				fprintf(stderr, "spaced-node: --disk-reserve wants a size\n");
				return 2;
			}
		} else if (strcmp(a, "--disk-io") == 0) {
			if (disk_io_parse(v, &disk_bps, &disk_iops) < 0) {
				fprintf(stderr, "spaced-node: --disk-io wants bps=SIZE,iops=N (either; 0: no bound) or 0\n");
				return 2;
			}
		} else if (strcmp(a, "--uid-range") == 0) {
			unsigned long long f, c;
			char extra;
			if (sscanf(v, "%llu:%llu%c", &f, &c, &extra) != 2 || f < 65536 || c < 1 ||
			    f + c * 65536ull > 0xffff0000ull) {
				fprintf(stderr, "spaced-node: --uid-range wants FIRST:COUNT (COUNT ranges of 65536 uids "
				                "from FIRST, FIRST >= 65536, below 2^32)\n");
				return 2;
			}
			uid_first = (uint32_t)f;
			uid_slots = (uint32_t)c;
		} else if (strcmp(a, "--uid-lock-dir") == 0) {
			uid_lock_dir = v;
		} else if (strcmp(a, "--cgroup-parent") == 0) {
			/* its launchers read it (sub_cgroup.c parent_name) */
			if (!spaced_cgroup_parent_valid(v)) {
				fprintf(stderr, "spaced-node: --cgroup-parent wants spaced or spaced.NAME (NAME of [A-Za-z0-9_.-], "
				                "at most 63 characters)\n");
				return 2;
			}
			setenv("SPACED_CGROUP_PARENT", v, 1);
		} else if (strcmp(a, "--cp") == 0)
			cp_url = v;
		else if (strcmp(a, "--metrics-listen") == 0)
			metrics_listen = v;
		else if (strcmp(a, "--log-format") == 0) {
			enum spaced_log_format lf;
			if (spaced_log_format_parse(v, &lf) < 0) {
				fprintf(stderr, "spaced-node: --log-format wants text or json\n");
				return 2;
			}
			spaced_log_set_format(lf);
		}
		else if (strcmp(a, "--join-token") == 0)
			join_token = v;
		else if (strcmp(a, "--join-token-file") == 0)
			join_file = v;
		else if (strcmp(a, "--advertise") == 0)
			advertise = v;
		else if (strcmp(a, "--capacity") == 0) {
			if (!num_opt(v, 1, 100000, &capacity)) {
				fprintf(stderr, "spaced-node: --capacity wants 1 .. 100000 sandboxes\n");
				return 2;
			}
		} else if (strcmp(a, "--stall-timeout") == 0) {
			long t;
			if (!num_opt(v, 0, 3600, &t)) {
				fprintf(stderr, "spaced-node: --stall-timeout wants seconds (0 .. 3600; 0: never)\n");
				return 2;
			}
			stall_ms = (int)t * 1000;
		} else if (strcmp(a, "--fence-after") == 0) {
			long t;
			if (!num_opt(v, 0, 86400, &t) || (t > 0 && t < 5)) {
				fprintf(stderr, "spaced-node: --fence-after wants seconds (5 .. 86400; 0: never)\n");
				return 2;
			}
			fence_after = (int)t;
		} else if (strcmp(a, "--forget-after") == 0) {
			long t;
			if (!num_opt(v, 1, 30 * 86400, &t)) {
				fprintf(stderr, "spaced-node: --forget-after wants seconds (1 .. 2592000)\n");
				return 2;
			}
			forget_after = (int)t;
		} else if (strcmp(a, "--acks-kept") == 0) {
			long k;
			if (!num_opt(v, 16, 1000000, &k)) {
				fprintf(stderr, "spaced-node: --acks-kept wants 16 .. 1000000\n");
				return 2;
			}
			acks_kept = (int)k;
		} else if (strcmp(a, "--executor-jobs") == 0) {
			long k;
			if (!num_opt(v, 2, 1024, &k)) {
				fprintf(stderr, "spaced-node: --executor-jobs wants 2 .. 1024\n");
				return 2;
			}
			executor_jobs = (unsigned)k;
		} else if (strcmp(a, "--max-streams") == 0) {
			long k;
			if (!num_opt(v, 64, 65536, &k)) {
				fprintf(stderr, "spaced-node: --max-streams wants 64 .. 65536\n");
				return 2;
			}
			max_streams = (int)k;
		} else if (strcmp(a, "--pool") == 0 || strcmp(a, "--pool-max") == 0 || strcmp(a, "--pool-starts") == 0) {
			long n;
			if (!num_opt(v, 0, 4096, &n)) {
				fprintf(stderr, "spaced-node: %s wants 0 .. 4096\n", a);
				return 2;
			}
			*(strcmp(a, "--pool") == 0 ? &pool_min : strcmp(a, "--pool-max") == 0 ? &pool_max : &pool_starts) =
			    (int)n;
		} else if (strcmp(a, "--answer-memory") == 0) {
			if (spaced_size_parse(v, &ANSWER_MEMORY) < 0 || ANSWER_MEMORY < (1u << 20)) {
				fprintf(stderr, "spaced-node: --answer-memory wants a size of 1M at least\n");
				return 2;
			}
		} else if (strcmp(a, "--gateway-memory") == 0) {
			if (spaced_size_parse(v, &gateway_memory) < 0 || gateway_memory < (1u << 20)) {
				fprintf(stderr, "spaced-node: --gateway-memory wants a size of 1M at least\n");
				return 2;
			}
		} else if (strcmp(a, "--socket-buffer") == 0) {
			if (spaced_size_parse(v, &SOCKET_BUFFER) < 0 || SOCKET_BUFFER < (16u << 10) || SOCKET_BUFFER > (64u << 20)) {
				fprintf(stderr, "spaced-node: --socket-buffer wants a size from 16K to 64M\n");
				return 2;
			}
		} else if (strcmp(a, "--pool-memory") == 0) {
			if (spaced_size_parse(v, &pool_memory) < 0) {
				fprintf(stderr, "spaced-node: --pool-memory wants a size\n");
				return 2;
			}
		} else if (strcmp(a, "--template-cache") == 0 || strcmp(a, "--template-max") == 0) {
			uint64_t sz;
			if (spaced_size_parse(v, &sz) < 0 || sz == 0) {
				fprintf(stderr, "spaced-node: %s wants a size\n", a);
				return 2;
			}
			*(a[11] == 'c' ? &tmpl_cache_max : &tmpl_max) = sz;
		} else if (strcmp(a, "--net-dns") == 0)
			net_dns = v;
		else if (strcmp(a, "--net-openable") == 0 || strcmp(a, "--net-closed") == 0) {
			bool open = a[6] == 'o';
			struct spaced_cidr *list_to = open ? net_openable : net_closed;
			size_t *n = open ? &net_nopenable : &net_nclosed;
			char list[1024], *save = NULL;
			snprintf(list, sizeof list, "%s", v);
			for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
				if (*n == SPACED_NET_RULES_MAX || spaced_cidr_parse(t, &list_to[*n]) < 0) {
					fprintf(stderr, "spaced-node: %s wants IPv4 CIDRs (10.20.0.0/16,192.0.2.7), %d at most\n", a,
					        SPACED_NET_RULES_MAX);
					return 2;
				}
				(*n)++;
			}
		}
		else if (strcmp(a, "--net-conns") == 0) {
			long n;
			if (!num_opt(v, 64, 4000000, &n)) {
				fprintf(stderr, "spaced-node: --net-conns wants a number of connections, 64 to 4000000\n");
				return 2;
			}
			net_conns = (uint32_t)n;
		}
		else if (strcmp(a, "--cpu-spread") == 0) {
			/* its launchers read it (launch.c spread_sample; docs/substrate.md
			 * "CPU: how many at once") */
			if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0) {
				fprintf(stderr, "spaced-node: --cpu-spread wants on or off\n");
				return 2;
			}
			setenv("SPACED_CPU_SPREAD", v, 1);
		}
		else if (strcmp(a, "--cpu-latency-us") == 0) {
			long n;
			if (!num_opt(v, 0, 1000000, &n)) {
				fprintf(stderr, "spaced-node: --cpu-latency-us wants microseconds, 0 to 1000000\n");
				return 2;
			}
			cpu_latency_us = (int32_t)n;
		}
		else if (strcmp(a, "--request-cpu") == 0) {
			/* a weight or a ceiling named is enforced (request_cpu_check);
			 * a pin alone needs no cgroup */
			if (request_cpu_parse(v, &REQUEST_CPU_WEIGHT, &REQUEST_CPU_MAX_MILLI, &REQUEST_CPU_PIN,
			                      &REQUEST_CPU_ON, &REQUEST_CPU_ASKED) < 0) {
				fprintf(stderr, "spaced-node: --request-cpu wants weight=N (1 .. 100),max=CPUS (0.1 at least; "
				                "0: no ceiling),pin=CPU|last|off, any of them, or off\n");
				return 2;
			}
		}
		else if (strcmp(a, "--net-rate") == 0) {
			if (net_rate_parse(v, &net_rate) < 0) {
				fprintf(stderr, "spaced-node: --net-rate wants bits per second (a number with K, M or G: 500M), or 0\n");
				return 2;
			}
		}
		else {
			usage();
			return 2;
		}
		i++;
	}
	if (!state || !worker || !listen_s || !spaced_name_valid(worker, strlen(worker))) {
		usage();
		return 2;
	}
	if (!guest)
		guest = default_guest();
	if (REQUEST_CPU_MAX_MILLI == UINT32_MAX) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		REQUEST_CPU_MAX_MILLI = n > 2 ? (uint32_t)n * 500 : 1000;
	}
	if ((join_token || join_file || advertise) && !cp_url) {
		fprintf(stderr, "spaced-node: --join-token, --join-token-file and --advertise go with --cp\n");
		return 2;
	}
	if (join_token && join_file) {
		fprintf(stderr, "spaced-node: --join-token or --join-token-file, not both\n");
		return 2;
	}
	char token_buf[256] = "";
	if (join_file) {
		FILE *f = fopen(join_file, "r");
		if (!f || !fgets(token_buf, sizeof token_buf, f)) {
			fprintf(stderr, "spaced-node: cannot read %s\n", join_file);
			if (f)
				fclose(f);
			return 2;
		}
		fclose(f);
		token_buf[strcspn(token_buf, "\r\n")] = '\0';
		join_token = token_buf;
	}
	if (tls_check(&tls, cp_url) < 0) {
		free(guest); /* what was resolved so far (the sanitizers count it) */
		free(launch);
		free(host_bin);
		return 2;
	}
	TLS = &tls;
	if ((launch == NULL) != (host_bin == NULL)) {
		fprintf(stderr, "spaced-node: --launcher and --host go together\n");
		return 2;
	}
	/* the qemu substrate (mgr_vm.c): spaced-vm, its images, the back-end
	 * beside spaced-vm unless named, QEMU from the system unless named */
	if ((vm_bin == NULL) != (vm_images == NULL) || (vm_bin && !launch)) {
		fprintf(stderr, "spaced-node: --vm and --vm-images go together, with --launcher and --host\n");
		return 2;
	}
	if (vm_bin && !vsockd_bin) {
		char p[PATH_MAX];
		snprintf(p, sizeof p, "%s", vm_bin);
		snprintf(p + strlen(dirname(p)), sizeof p - strlen(p), "/spaced-vsockd");
		vsockd_bin = realpath(p, NULL);
	}
	if (vm_bin && !qemu_bin)
		qemu_bin = realpath("/usr/bin/qemu-system-x86_64", NULL);
	if (vm_bin && (!vsockd_bin || !qemu_bin)) {
		fprintf(stderr, "spaced-node: --vm needs spaced-vsockd (--vsockd) and QEMU (--qemu)\n");
		return 2;
	}
	spaced_resources_default(&def, &(struct spaced_resources){1000, 512ull << 20, 512, 2ull << 30});
	if (launch)
		host_pid_room();
	if (launch && host_capacity(launch, &alloc, &max) < 0)
		return 1;
	const char *over = spaced_resources_exceeds(&def, &max);
	if (over) {
		fprintf(stderr, "spaced-node: the default %s is above the maximum\n", over);
		return 2;
	}
	if (launch && mkdir(uid_lock_dir, 0700) < 0 && errno != EEXIST) {
		/* its parent may be missing: /run/spaced */
		char parent[PATH_MAX];
		snprintf(parent, sizeof parent, "%s", uid_lock_dir);
		mkdir(dirname(parent), 0755);
		if (mkdir(uid_lock_dir, 0700) < 0 && errno != EEXIST) {
			fprintf(stderr, "spaced-node: cannot create %s: %s\n", uid_lock_dir, strerror(errno));
			return 1;
		}
	}
	char host[256];
	const char *colon = strrchr(listen_s, ':');
	char *end = NULL;
	long port = colon ? strtol(colon + 1, &end, 10) : -1;
	if (!colon || (size_t)(colon - listen_s) >= sizeof host || !end || *end || port < 0 || port > 65535) {
		fprintf(stderr, "spaced-node: --listen wants HOST:PORT\n");
		return 2;
	}
	memcpy(host, listen_s, (size_t)(colon - listen_s));
	host[colon - listen_s] = '\0';
	if (mkdir(state, 0700) < 0 && errno != EEXIST) {
		fprintf(stderr, "spaced-node: cannot create %s: %s\n", state, strerror(errno));
		return 1;
	}
	char *state_abs = realpath(state, NULL);
	if (!state_abs) {
		fprintf(stderr, "spaced-node: %s: %s\n", state, strerror(errno));
		return 1;
	}
	/* executions run a copy of the guest that they can execute and not read:
	 * the kernel then makes the guest undumpable, its memory owned by the
	 * host's user namespace, so the sandbox's root can neither ptrace it nor
	 * read its memory nor take its descriptors (pidfd_getfd) */
	char *sealed = launch && guest ? guest_sealed(guest, state_abs) : NULL;
	if (launch && guest && !sealed)
		return 1;
	if (sealed) {
		free(guest);
		guest = sealed;
	}
	char port_file[PATH_MAX];
	snprintf(port_file, sizeof port_file, "%s/api.port", state_abs);
	unlink(port_file);
	char admin[PATH_MAX];
	snprintf(admin, sizeof admin, "%s/admin.sock", state_abs);
	unlink(admin); /* waiters see the socket only once the gate listens */

	struct mgr_config mc = {.state_dir = state_abs, .worker_id = worker, .keys_path = keys,
	                        .guest_bin = guest, .launch_bin = launch, .host_bin = host_bin,
	                        .limits_default = def, .limits_max = max, .alloc = alloc, .mem_overcommit = mem_overcommit,
	                        .disk_reserve = disk_reserve, .disk_overcommit = disk_overcommit,
	                        .disk_bps = disk_bps, .disk_iops = disk_iops, .gateway_memory = gateway_memory,
	                        .executor_jobs = executor_jobs,
	                        .uid_first = uid_first,
	                        .uid_slots = uid_slots, .uid_lock_dir = uid_lock_dir,
	                        .stall_timeout_ms = stall_ms, .fence_after_s = cp_url ? fence_after : 0, .forget_after_s = forget_after, .acks_kept = acks_kept, .max_streams = max_streams, .tmpl_max = tmpl_max, .tmpl_cache_max = tmpl_cache_max,
	                        .pool_min = pool_min, .pool_max = pool_max, .pool_starts = pool_starts > 0 ? pool_starts : 1,
	                        .pool_memory = pool_memory, .net_dns = net_dns, .net_rate = net_rate,
	                        .net_openable = net_openable, .net_nopenable = net_nopenable,
	                        .net_closed = net_closed, .net_nclosed = net_nclosed,
	                        .net_conns = net_conns,
	                        .vm_bin = vm_bin, .vm_images = vm_images,
	                        .vsockd_bin = vsockd_bin, .qemu_bin = qemu_bin, .vm_accel = vm_accel,
	                        .tls_ca = tls.ca, .tls_client_cert = tls.client_cert, .tls_client_key = tls.client_key,
	                        .api_tls_cert = tls.plaintext ? NULL : tls.cert, .api_tls_key = tls.plaintext ? NULL : tls.key};
	host_kernel_room(uid_slots, (uint64_t)((double)alloc.memory_bytes * (mem_overcommit > 0 ? mem_overcommit : 1.0)));
	if (cpu_latency_us >= 0 && cpu_latency_hold(cpu_latency_us) < 0)
		return 1;
	if (cp_url && (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0) && !advertise) {
		fprintf(stderr, "spaced-node: listening on %s, the control plane needs --advertise URL\n", host);
		return 2;
	}
	struct link_config lc = {.cp_url = cp_url, .worker_id = worker, .state_dir = state_abs, .admin_path = admin,
	                         .join_token = join_token, .advertise = advertise, .listen_host = host,
	                         .capacity = (int)capacity, .fence_after_s = fence_after, .api_tls = !tls.plaintext, .tls_ca = tls.ca,
	                         .tls_client_cert = tls.client_cert, .tls_client_key = tls.client_key};
	struct listener api_l = {host, (int)port, port_file}, met_l = {NULL, 0, NULL};
	char met_host[256], met_file[PATH_MAX];
	if (metrics_listen) {
		const char *mc_ = strrchr(metrics_listen, ':');
		char *mend = NULL;
		long mport = mc_ ? strtol(mc_ + 1, &mend, 10) : -1;
		if (!mc_ || (size_t)(mc_ - metrics_listen) >= sizeof met_host || !mend || *mend || mport < 0 || mport > 65535) {
			fprintf(stderr, "spaced-node: --metrics-listen wants HOST:PORT\n");
			return 2;
		}
		memcpy(met_host, metrics_listen, (size_t)(mc_ - metrics_listen));
		met_host[mc_ - metrics_listen] = '\0';
		snprintf(met_file, sizeof met_file, "%s/metrics.port", state_abs);
		unlink(met_file);
		met_l = (struct listener){met_host, (int)mport, met_file};
	}
	int rc = 2;
	if (request_cpu_check() == 0)
		rc = supervise(&mc, cp_url ? &lc : NULL, &api_l, &met_l, drop);
	else if (geteuid() == 0)
		spaced_sub_request_cpu_remove();
	free(state_abs);
	free(guest);
	free(launch);
	free(host_bin);
	free(vm_bin);
	free(vm_images);
	free(vsockd_bin);
	free(qemu_bin);
	return rc;
}
