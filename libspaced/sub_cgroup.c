/*
 * sub_cgroup.c — CPU, memory, pids and disk I/O limits, usage and the freezer
 * of one execution, and the spread rule holding a CPU-bound one to its
 * limit's CPUs, on cgroup v1 (memory, pids, freezer, cpu, cpuacct, blkio,
 * cpuset hierarchies under /sys/fs/cgroup/<ctrl>) or on a unified cgroup2
 * /sys/fs/cgroup; the reaping of what launchers killed with SIGKILL left
 * behind; and the request path's CPU cgroup (spaced-node links this file
 * for it, not the rest of the substrate).
 */
#include "sub_internal.h"
#include "identity.h"
#include "substrate.h"

#include <dirent.h>
#include <sched.h>
#include <sys/xattr.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "spaced_error.h"
#include "util.h"

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif


int sub_write_file(const char *path, const char *text)
{
	size_t n = strlen(text);
	ssize_t w;
	int fd = open(path, O_WRONLY | O_CLOEXEC);

	if (fd < 0)
		return SPACED_ESYS;
	w = write(fd, text, n);
	close(fd);
	return w == (ssize_t)n ? 0 : SPACED_ESYS;
}

static int read_small(const char *path, char *buf, size_t sz)
{
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return SPACED_ESYS;
	n = read(fd, buf, sz - 1);
	close(fd);
	if (n < 0)
		return SPACED_ESYS;
	buf[n] = '\0';
	return 0;
}

static bool unified_mode(void)
{
	struct statfs sf;

	return statfs("/sys/fs/cgroup", &sf) == 0 && (unsigned long)sf.f_type == CGROUP2_SUPER_MAGIC;
}

/* The cgroup path of `pid` in the v1 hierarchy holding `ctrl`, or in the
 * unified hierarchy when ctrl is "" (the "0::" line). */
static int cgroup_path_of(pid_t pid, const char *ctrl, char *out, size_t outsz)
{
	char path[64], line[PATH_MAX + 64];
	int r = SPACED_ENOENT;
	FILE *f;

	if (pid == 0)
		snprintf(path, sizeof(path), "/proc/self/cgroup");
	else
		snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	f = fopen(path, "re");
	if (f == NULL)
		return SPACED_ESYS;
	while (fgets(line, sizeof(line), f) != NULL) {
		char *c1 = strchr(line, ':'), *c2, *nl;

		if (c1 == NULL || (c2 = strchr(c1 + 1, ':')) == NULL)
			continue;
		*c2 = '\0';
		nl = strchr(c2 + 1, '\n');
		if (nl != NULL)
			*nl = '\0';
		if (ctrl[0] == '\0') {
			/* the unified hierarchy's line is "0::<path>" */
			if (c1 != line + 1 || line[0] != '0' || c1[1] != '\0')
				continue;
		} else {
			/* the controller list is comma separated: "cpu,cpuacct" */
			char *list = c1 + 1, *tok, *save = NULL;
			bool hit = false;

			for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
				if (strcmp(tok, ctrl) == 0)
					hit = true;
			if (!hit)
				continue;
		}
		if ((size_t)snprintf(out, outsz, "%s", c2 + 1) >= outsz) {
			r = SPACED_ETOOBIG;
			break;
		}
		r = 0;
		break;
	}
	fclose(f);
	return r;
}

static void nap_us(long us)
{
	struct timespec ts = { .tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000L };

	nanosleep(&ts, NULL);
}

/* mkdir of a cgroup directory; an empty one left by a launcher that died
 * with the same name (a reused PID) is removed first. A populated one stays
 * and the call fails (EBUSY). */
static int mkdir_fresh(const char *dir)
{
	if (mkdir(dir, 0755) == 0)
		return 0;
	if (errno != EEXIST || rmdir(dir) < 0)
		return -1;
	return mkdir(dir, 0755);
}

/* One sweep per process and hierarchy is enough. */
static const char *const v1_ctrls[] = { "memory", "pids", "freezer", "cpu", "cpuacct", "blkio", "cpuset" };

static bool swept_v1[sizeof(v1_ctrls) / sizeof(v1_ctrls[0])], swept_v2;

/* The launcher pid of a cgroup named "spaced-<pid>-<n>", or 0. */
static int launcher_of(const char *name)
{
	unsigned int n;
	int pid;

	if (sscanf(name, "spaced-%d-%u", &pid, &n) != 2 || pid <= 0)
		return 0;
	return pid;
}

/* Gone: no such process, or only its zombie is left (a parent that does not
 * reap soon, such as a minimal init, must not keep an execution alive). */
static bool launcher_gone(int pid)
{
	char path[64], buf[512];

	if (kill(pid, 0) < 0 && errno == ESRCH)
		return true;
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	if (read_small(path, buf, sizeof(buf)) < 0)
		return true;
	const char *rp = strrchr(buf, ')');
	return rp != NULL && (rp[2] == 'Z' || rp[2] == 'X');
}

/* Removes the empty cgroups "spaced-<pid>-<n>" in dir whose launcher <pid> is
 * gone (a launcher killed with SIGKILL cannot clean up). Populated cgroups and
 * those of live launchers are left alone; rmdir never removes a populated one. */
static void sweep_dead(const char *dir)
{
	struct dirent *de;
	DIR *d = opendir(dir);

	if (d == NULL)
		return;
	while ((de = readdir(d)) != NULL) {
		char path[PATH_MAX + 300];
		int pid = launcher_of(de->d_name);

		if (pid == 0 || !launcher_gone(pid))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		(void)rmdir(path);
	}
	closedir(d);
}

/* The directory below this process's own cgroup that holds its executions
 * and caps them all: SPACED_CGROUP_PARENT when valid (spaced-node
 * --cgroup-parent: each of several workers on one host its own), else
 * "spaced". */
static const char *parent_name(void)
{
	const char *n = getenv("SPACED_CGROUP_PARENT");

	return spaced_cgroup_parent_valid(n) ? n : "spaced";
}

/* The last component of the cgroup path own when it is name, else NULL. */
static char *last_named(char *own, const char *name)
{
	char *last = strrchr(own, '/');

	return last != NULL && strcmp(last + 1, name) == 0 ? last : NULL;
}

/* This process's cgroup path in controller ctrl ("" on cgroup2), or the one
 * holding it when it is the background cgroup ("<parent>+background"): what
 * a process there makes (a pooled execution's launcher makes its
 * execution's cgroups) goes where it would go from the foreground, not below
 * the background cgroup. */
static int own_base(const char *ctrl, char *out, size_t outsz)
{
	char mine[PATH_MAX], *last;
	int r = cgroup_path_of(0, ctrl, out, outsz);

	if (r < 0)
		return r;
	snprintf(mine, sizeof(mine), "%s+background", parent_name());
	if ((last = last_named(out, mine)) != NULL)
		*(last == out ? last + 1 : last) = '\0';
	return 0;
}

static int make_v1(const char *ctrl, const char *name, char *out, size_t outsz, char *why,
                   size_t whysz)
{
	char own[PATH_MAX - 64], dir[PATH_MAX];
	int r;

	r = own_base(ctrl, own, sizeof(own));
	if (r < 0) {
		spaced_why(why, whysz, "cgroup v1 %s hierarchy not found in /proc/self/cgroup", ctrl);
		return r;
	}
	if (strcmp(own, "/") == 0)
		own[0] = '\0';
	if ((size_t)snprintf(dir, sizeof(dir), "/sys/fs/cgroup/%s%s/%s", ctrl, own, parent_name()) >= sizeof(dir))
		return SPACED_ETOOBIG;
	if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
		spaced_why(why, whysz, "mkdir %s: %s", dir, strerror(errno));
		return SPACED_ESYS;
	}
	for (size_t k = 0; k < sizeof(v1_ctrls) / sizeof(v1_ctrls[0]); k++) {
		if (strcmp(ctrl, v1_ctrls[k]) == 0 && !swept_v1[k]) {
			sweep_dead(dir);
			swept_v1[k] = true;
		}
	}
	if ((size_t)snprintf(out, outsz, "%s/%s", dir, name) >= outsz)
		return SPACED_ETOOBIG;
	if (mkdir_fresh(out) < 0) {
		spaced_why(why, whysz, "mkdir %s: %s", out, strerror(errno));
		return errno == EEXIST || errno == EBUSY ? SPACED_EEXIST : SPACED_ESYS;
	}
	return 0;
}

/* True when this process sits in a v1 hierarchy of controller ctrl. */
static bool has_v1(const char *ctrl)
{
	char own[PATH_MAX];

	return cgroup_path_of(0, ctrl, own, sizeof(own)) == 0;
}

static int knob(const char *dir, const char *file, const char *val, char *why, size_t whysz)
{
	char path[PATH_MAX + 64];

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	if (sub_write_file(path, val) < 0) {
		spaced_why(why, whysz, "write %s=%s: %s", path, val, strerror(errno));
		return SPACED_ESYS;
	}
	return 0;
}

/* The CFS bandwidth of cpu_milli thousandths of a CPU: quota per 100 ms period. */
#define CPU_PERIOD_US 100000u

static int set_v2_limits(const char *dir, const struct sub_limits *lim, char *why, size_t whysz)
{
	char val[64];
	int r;

	if (lim->mem_bytes > 0) {
		snprintf(val, sizeof(val), "%" PRIu64, lim->mem_bytes);
		if ((r = knob(dir, "memory.max", val, why, whysz)) < 0)
			return r;
		(void)knob(dir, "memory.swap.max", "0", NULL, 0);
	}
	if (lim->pids_max > 0) {
		snprintf(val, sizeof(val), "%" PRIu64, lim->pids_max);
		if ((r = knob(dir, "pids.max", val, why, whysz)) < 0)
			return r;
	}
	if (lim->cpu_milli > 0) {
		/* weight in proportion (100 per CPU, the default being one CPU),
		 * and a hard ceiling of cpu_milli per period */
		uint64_t w = (uint64_t)lim->cpu_milli / 10;

		snprintf(val, sizeof(val), "%" PRIu64 " %u",
		         (uint64_t)lim->cpu_milli * CPU_PERIOD_US / 1000, CPU_PERIOD_US);
		if ((r = knob(dir, "cpu.max", val, why, whysz)) < 0)
			return r;
		snprintf(val, sizeof(val), "%" PRIu64, w < 1 ? 1 : w > 10000 ? 10000 : w);
		if ((r = knob(dir, "cpu.weight", val, why, whysz)) < 0)
			return r;
	}
	for (size_t i = 0; i < 2 && (lim->io_bps > 0 || lim->io_iops > 0); i++) {
		char line[160], bps[24] = "max", iops[24] = "max";

		if (lim->io_dev[i] == 0)
			continue;
		if (lim->io_bps > 0)
			snprintf(bps, sizeof(bps), "%" PRIu64, lim->io_bps);
		if (lim->io_iops > 0)
			snprintf(iops, sizeof(iops), "%" PRIu64, lim->io_iops);
		/* cgroup2 charges writeback to the cgroup that dirtied the pages
		 * (memory and io both on): one rule bounds every path */
		snprintf(line, sizeof(line), "%u:%u rbps=%s wbps=%s riops=%s wiops=%s", major(lim->io_dev[i]),
		         minor(lim->io_dev[i]), bps, bps, iops, iops);
		if ((r = knob(dir, "io.max", line, why, whysz)) < 0) {
			spaced_why(why, whysz, "write %s/io.max: %s (the io controller must be enabled for this "
			                       "subtree; spaced-node --disk-io 0 runs without a bound)", dir, strerror(errno));
			return r;
		}
	}
	return 0;
}

/* Writes "MAJ:MIN value" into dir's blkio.throttle.<file>. */
static int throttle_rule(const char *dir, const char *file, dev_t dev, uint64_t value, char *why, size_t whysz)
{
	char name[64], val[64];

	snprintf(name, sizeof(name), "blkio.throttle.%s", file);
	snprintf(val, sizeof(val), "%u:%u %" PRIu64, major(dev), minor(dev), value);
	return knob(dir, name, val, why, whysz);
}

/* v1: the execution's own blkio cgroup bounds what its tasks submit (reads,
 * direct I/O, writes forced by fsync); the writeback of what they leave dirty
 * is charged to the blkio root, where its disk has a rule of its own
 * (sub_disk_create). */
static int set_v1_io(struct sub_cgroup *cg, const char *name, const struct sub_limits *lim, char *why,
                     size_t whysz)
{
	static const char *const dirs[2] = { "read", "write" };
	int r;

	if (lim->io_bps == 0 && lim->io_iops == 0)
		return 0;
	if (!has_v1("blkio")) {
		spaced_why(why, whysz, "no cgroup v1 blkio hierarchy: disk I/O cannot be bounded "
		                       "(spaced-node --disk-io 0 runs without a bound)");
		return SPACED_ESYS;
	}
	if ((r = make_v1("blkio", name, cg->blkio, sizeof(cg->blkio), why, whysz)) < 0)
		return r;
	for (size_t i = 0; i < 2; i++) {
		char file[32];

		if (lim->io_dev[i] == 0)
			continue;
		for (size_t d = 0; d < 2; d++) {
			if (lim->io_bps > 0) {
				snprintf(file, sizeof(file), "%s_bps_device", dirs[d]);
				if ((r = throttle_rule(cg->blkio, file, lim->io_dev[i], lim->io_bps, why, whysz)) < 0)
					return r;
			}
			if (lim->io_iops > 0) {
				snprintf(file, sizeof(file), "%s_iops_device", dirs[d]);
				if ((r = throttle_rule(cg->blkio, file, lim->io_dev[i], lim->io_iops, why, whysz)) < 0)
					return r;
			}
		}
	}
	return 0;
}

/* The directory named parent_name() + suffix of controller ctrl ("" on
 * cgroup2) below this process's own cgroup, made when missing: the
 * executions' parent (suffix ""), the request path's ("+request") or
 * background work's ("+background"). A
 * process already in the latter (node-api, forked by the gate that joined
 * first; a second join) names the same one, not one below it. */
static int parent_dir(const char *ctrl, const char *suffix, char *out, size_t outsz, char *why, size_t whysz)
{
	char own[PATH_MAX - 96], mine[PATH_MAX];
	int r = own_base(ctrl, own, sizeof(own));
	char *last;

	if (r < 0) {
		spaced_why(why, whysz, "no cgroup %s%s hierarchy in /proc/self/cgroup", ctrl[0] ? "v1 " : "v2", ctrl);
		return r;
	}
	snprintf(mine, sizeof(mine), "%s%s", parent_name(), suffix);
	if (suffix[0] && (last = last_named(own, mine)) != NULL)
		*(last == own ? last + 1 : last) = '\0';
	if ((size_t)snprintf(out, outsz, "/sys/fs/cgroup%s%s%s/%s", ctrl[0] ? "/" : "", ctrl,
	                     strcmp(own, "/") == 0 ? "" : own, mine) >= outsz)
		return SPACED_ETOOBIG;
	if (mkdir(out, 0755) < 0 && errno != EEXIST) {
		spaced_why(why, whysz, "mkdir %s: %s", out, strerror(errno));
		return SPACED_ESYS;
	}
	return 0;
}

/* The "spaced" directory of controller ctrl: the executions' parent. */
static int spaced_dir(const char *ctrl, char *out, size_t outsz, char *why, size_t whysz)
{
	return parent_dir(ctrl, "", out, outsz, why, whysz);
}

int sub_cgroup_cap_all(uint64_t mem_bytes, uint64_t tasks, char *why, size_t whysz)
{
	char dir[PATH_MAX], mem[32], pids[32], path[PATH_MAX + 64];
	int r;

	snprintf(mem, sizeof(mem), mem_bytes ? "%" PRIu64 : "-1", mem_bytes);
	snprintf(pids, sizeof(pids), tasks ? "%" PRIu64 : "max", tasks);
	if (unified_mode()) {
		if ((r = spaced_dir("", dir, sizeof(dir), why, whysz)) < 0)
			return r;
		(void)knob(dir, "cgroup.subtree_control", "+memory +pids +cpu +io", NULL, 0);
		if ((r = knob(dir, "memory.max", mem_bytes ? mem : "max", why, whysz)) < 0)
			return r;
		return knob(dir, "pids.max", pids, why, whysz);
	}
	if ((r = spaced_dir("memory", dir, sizeof(dir), why, whysz)) < 0)
		return r;
	/* memory+swap is never below memory: lowered after it, raised before */
	snprintf(path, sizeof(path), "%s/memory.memsw.limit_in_bytes", dir);
	bool memsw = access(path, F_OK) == 0;
	if (knob(dir, "memory.limit_in_bytes", mem, NULL, 0) < 0) {
		if (memsw && (r = knob(dir, "memory.memsw.limit_in_bytes", mem, why, whysz)) < 0)
			return r;
		if ((r = knob(dir, "memory.limit_in_bytes", mem, why, whysz)) < 0)
			return r;
	} else if (memsw && (r = knob(dir, "memory.memsw.limit_in_bytes", mem, why, whysz)) < 0)
		return r;
	snprintf(path, sizeof(path), "%s/memory.kmem.tcp.limit_in_bytes", dir);
	if (access(path, F_OK) == 0 && (r = knob(dir, "memory.kmem.tcp.limit_in_bytes", mem, why, whysz)) < 0)
		return r;
	if ((r = spaced_dir("pids", dir, sizeof(dir), why, whysz)) < 0)
		return r;
	return knob(dir, "pids.max", pids, why, whysz);
}

static uint64_t read_u64(const char *dir, const char *file, const char *key);

/* The request path's CFS period: short, so that a ceiling reached holds the
 * request path back for a few milliseconds, not for a tenth of a second. */
#define REQUEST_PERIOD_US 10000u

/* "<own>/<parent>+request" in controller ctrl ("" on cgroup2), made when
 * missing: '+' is in no parent name (spaced_cgroup_parent_valid), so no
 * worker's executions can be named so, and reap_parents passes it by. */
static int request_dir(const char *ctrl, char *out, size_t outsz, char *why, size_t whysz)
{
	return parent_dir(ctrl, "+request", out, outsz, why, whysz);
}

/* The CPU cgroup named parent_name() + suffix beside the executions' parent
 * (made when missing, with the cpu controller enabled for it on cgroup2),
 * in dir; SPACED_ENOENT when there is no CPU controller there. */
static int cpu_side_dir(const char *suffix, char *dir, size_t dirsz, char *why, size_t whysz)
{
	bool v2 = unified_mode();
	char path[PATH_MAX + 32];
	int r;

	if (v2) {
		char own[PATH_MAX];

		if ((r = cgroup_path_of(0, "", own, sizeof(own))) < 0)
			return r;
		snprintf(path, sizeof(path), "/sys/fs/cgroup%s", strcmp(own, "/") == 0 ? "" : own);
		(void)knob(path, "cgroup.subtree_control", "+cpu", NULL, 0);
	} else if (!has_v1("cpu")) {
		spaced_why(why, whysz, "no cgroup v1 cpu hierarchy");
		return SPACED_ENOENT;
	}
	if ((r = parent_dir(v2 ? "" : "cpu", suffix, dir, dirsz, why, whysz)) < 0)
		return r;
	snprintf(path, sizeof(path), "%s/%s", dir, v2 ? "cpu.weight" : "cpu.shares");
	if (access(path, F_OK) != 0) {
		spaced_why(why, whysz, "no cpu controller in %s", dir);
		(void)rmdir(dir);
		return SPACED_ENOENT;
	}
	return 0;
}

int spaced_sub_request_cpu_join(uint32_t weight, uint32_t max_milli, char *why, size_t whysz)
{
	char dir[PATH_MAX], val[64];
	uint64_t quota = (uint64_t)max_milli * REQUEST_PERIOD_US / 1000;
	int r;

	if ((r = cpu_side_dir("+request", dir, sizeof(dir), why, whysz)) < 0)
		return r;
	if (unified_mode()) {
		snprintf(val, sizeof(val), "%u", weight * 100 > 10000 ? 10000 : weight * 100);
		if ((r = knob(dir, "cpu.weight", val, why, whysz)) < 0)
			return r;
		if (quota)
			snprintf(val, sizeof(val), "%" PRIu64 " %u", quota < 1000 ? 1000 : quota, REQUEST_PERIOD_US);
		else
			snprintf(val, sizeof(val), "max %u", REQUEST_PERIOD_US);
		if ((r = knob(dir, "cpu.max", val, why, whysz)) < 0)
			return r;
		return knob(dir, "cgroup.procs", "0", why, whysz);
	}
	snprintf(val, sizeof(val), "%u", weight * 1024 > 262144 ? 262144 : weight * 1024);
	if ((r = knob(dir, "cpu.shares", val, why, whysz)) < 0)
		return r;
	/* the period once, when the cgroup is new: the quota is lifted first (a
	 * period shorter than the one set may be below it), which a join into a
	 * cgroup already set (the link's, a restarted gate's) must not do */
	if (read_u64(dir, "cpu.cfs_period_us", NULL) != REQUEST_PERIOD_US) {
		if ((r = knob(dir, "cpu.cfs_quota_us", "-1", why, whysz)) < 0)
			return r;
		snprintf(val, sizeof(val), "%u", REQUEST_PERIOD_US);
		if ((r = knob(dir, "cpu.cfs_period_us", val, why, whysz)) < 0)
			return r;
	}
	if (quota)
		snprintf(val, sizeof(val), "%" PRIu64, quota < 1000 ? 1000 : quota);
	if ((r = knob(dir, "cpu.cfs_quota_us", quota ? val : "-1", why, whysz)) < 0)
		return r;
	if ((r = knob(dir, "cgroup.procs", "0", why, whysz)) < 0)
		return r;
	/* its CPU time counted apart too, where cpuacct is a hierarchy of its own */
	if (has_v1("cpuacct") && request_dir("cpuacct", dir, sizeof(dir), NULL, 0) == 0)
		(void)knob(dir, "cgroup.procs", "0", NULL, 0);
	return 0;
}

int spaced_sub_request_cpu_stat(uint64_t *usage_ns, uint64_t *throttled, uint64_t *throttled_ns)
{
	char own[PATH_MAX - 64], dir[PATH_MAX], mine[PATH_MAX];
	bool v2 = unified_mode();

	snprintf(mine, sizeof(mine), "%s+request", parent_name());
	if (cgroup_path_of(0, v2 ? "" : "cpu", own, sizeof(own)) < 0 || last_named(own, mine) == NULL)
		return SPACED_ENOENT;
	snprintf(dir, sizeof(dir), "/sys/fs/cgroup%s%s", v2 ? "" : "/cpu", own);
	*throttled = read_u64(dir, "cpu.stat", "nr_throttled");
	if (v2) {
		*throttled_ns = read_u64(dir, "cpu.stat", "throttled_usec") * 1000;
		*usage_ns = read_u64(dir, "cpu.stat", "usage_usec") * 1000;
		return 0;
	}
	*throttled_ns = read_u64(dir, "cpu.stat", "throttled_time");
	*usage_ns = 0;
	if (cgroup_path_of(0, "cpuacct", own, sizeof(own)) == 0) {
		snprintf(dir, sizeof(dir), "/sys/fs/cgroup/cpuacct%s", own);
		*usage_ns = read_u64(dir, "cpuacct.usage", NULL);
	}
	return 0;
}

void spaced_sub_request_cpu_remove(void)
{
	static const char *const ctrls[] = { "cpu", "cpuacct" };
	char dir[PATH_MAX];

	if (unified_mode()) {
		if (request_dir("", dir, sizeof(dir), NULL, 0) == 0)
			(void)rmdir(dir);
		return;
	}
	for (size_t i = 0; i < 2; i++)
		if (has_v1(ctrls[i]) && request_dir(ctrls[i], dir, sizeof(dir), NULL, 0) == 0)
			(void)rmdir(dir);
}

/* The background cgroup's weight: 32 of the 1024 of the executions' parent
 * (cgroup2: 3 of 100), enough that background work still moves on a host
 * whose CPUs executions keep busy */
#define BACKGROUND_SHARES "32"
#define BACKGROUND_WEIGHT "3"

int spaced_sub_background_cpu_join(char *why, size_t whysz)
{
	bool v2 = unified_mode();
	char dir[PATH_MAX];
	int r;

	if ((r = cpu_side_dir("+background", dir, sizeof(dir), why, whysz)) < 0)
		return r;
	if ((r = knob(dir, v2 ? "cpu.weight" : "cpu.shares", v2 ? BACKGROUND_WEIGHT : BACKGROUND_SHARES, why,
	              whysz)) < 0)
		return r;
	return knob(dir, "cgroup.procs", "0", why, whysz);
}

int spaced_sub_background_cpu_home(char *procs, size_t procssz)
{
	bool v2 = unified_mode();
	char own[PATH_MAX - 96];
	int r;

	if (!v2 && !has_v1("cpu"))
		return SPACED_ENOENT;
	if ((r = own_base(v2 ? "" : "cpu", own, sizeof(own))) < 0)
		return r;
	if ((size_t)snprintf(procs, procssz, "/sys/fs/cgroup%s%s/cgroup.procs", v2 ? "" : "/cpu",
	                     strcmp(own, "/") == 0 ? "" : own) >= procssz)
		return SPACED_ETOOBIG;
	return 0;
}

int spaced_sub_background_cpu_leave(pid_t pid)
{
	/* the caller's cgroup does not change: found once (three moves a claim) */
	static char procs[PATH_MAX];
	static int found = 1;
	char val[32];

	if (found > 0)
		found = spaced_sub_background_cpu_home(procs, sizeof(procs));
	if (found < 0)
		return found;
	snprintf(val, sizeof(val), "%d", (int)pid);
	return sub_write_file(procs, val) < 0 ? SPACED_ESYS : 0;
}

void spaced_sub_background_cpu_remove(void)
{
	char dir[PATH_MAX];
	bool v2 = unified_mode();

	if (!(v2 || has_v1("cpu")) || parent_dir(v2 ? "" : "cpu", "+background", dir, sizeof(dir), NULL, 0) < 0)
		return;
	/* the pool's executions stopped with the gate may still be ending (or
	 * another worker of this host, of the same parent name, uses it: then it
	 * stays, empty later, for the next) */
	for (int i = 0; i < 12 && rmdir(dir) < 0 && errno == EBUSY; i++)
		usleep(20000);
}

/* ---- the CPU spread rule (sub_cgroup_cpu_spread) ---- */

#define SPREAD_CPUS 1024 /* CPU numbers it handles */
#define SPREAD_CALM 5    /* samples under 80 % of the limit before a held execution is let go */
/* how soon the next sample is due: an execution held, or using a tenth of
 * its limit and more, every second; an idle one every 5 s (a worker of a
 * thousand idle executions: 200 wake-ups a second, not a thousand) */
#define SPREAD_BUSY_MS 1000u
#define SPREAD_IDLE_MS 5000u
/* Time in the kernel (thousandths of a CPU) that holds an execution once it
 * lasts SPREAD_KERNEL_SAMPLES samples: this host's kernel may not preempt a
 * task in a system call (PREEMPT_NONE), so a co-tenant's woken task waits
 * for each fork, exec and exit of it on that CPU (a loop of `sleep 0.01 &`
 * under 0.5 CPU: 240-300 alone, less beside busy tasks, as the kernel counts
 * it at its ticks — at 200 it was missed twice in ten loaded benchmark runs;
 * a victim's back-to-back reads and execs: 170 over its busiest second) —
 * a quota does not bound that: the fork loop never meets it. Several samples
 * in a row: a burst of a few hundred milliseconds is not held. */
#define SPREAD_KERNEL_MILLI 150u
#define SPREAD_KERNEL_SAMPLES 3u
/* Tasks started a second (processes and threads: every PID its namespace
 * gives), with SPREAD_FORKS_KERNEL_MILLI of a CPU in the kernel, that hold an
 * execution once they last SPREAD_KERNEL_SAMPLES samples: the same fork loop
 * starts 560-630 a second alone or beside busy tasks, while its time in the
 * kernel as counted fell to 0.10-0.12 of a CPU there and it was not held. A
 * fork, an exec and an exit each take a CPU for 0.3-0.45 ms that this kernel
 * does not give up; starting a thread takes far less (a loop starting 420
 * threads a second: 0.01-0.04 of a CPU in the kernel), and a thread pool's
 * churn is not held. */
#define SPREAD_FORKS 200u
#define SPREAD_FORKS_KERNEL_MILLI 50u
/* the PID namespace's counter is read when the execution used this much CPU
 * (thousandths) since the last sample: SPREAD_FORKS a second cost more */
#define SPREAD_FORKS_PROBE_MILLI 20u

static void remove_dir(char *dir);

/* The CPUs of a cpuset list ("0-3,6\n") into set; how many, or -1. */
static int cpulist_parse(const char *text, bool set[SPREAD_CPUS])
{
	const char *p = text;
	int n = 0;

	memset(set, 0, SPREAD_CPUS * sizeof(bool));
	while (*p != '\0' && *p != '\n') {
		char *end;
		long a = strtol(p, &end, 10), b;

		if (end == p || a < 0 || a >= SPREAD_CPUS)
			return -1;
		b = a;
		if (*end == '-') {
			p = end + 1;
			b = strtol(p, &end, 10);
			if (end == p || b < a || b >= SPREAD_CPUS)
				return -1;
		}
		for (long c = a; c <= b; c++)
			if (!set[c]) {
				set[c] = true;
				n++;
			}
		p = end;
		if (*p == ',')
			p++;
		else if (*p != '\0' && *p != '\n')
			return -1;
	}
	return n;
}

/* dir with its last component cut (out may be dir's copy). */
static void dir_up(const char *dir, char *out, size_t outsz)
{
	snprintf(out, outsz, "%s", dir);
	char *slash = strrchr(out, '/');
	if (slash != NULL && slash != out)
		*slash = '\0';
}

/* The execution's cpuset directory: v1's own, or its cgroup2 directory. */
static const char *spread_dir(const struct sub_cgroup *cg)
{
	return cg->v2 ? cg->unified : cg->cpuset;
}

/* The CPUs of the directory holding the executions (text as the kernel
 * gives it). */
static int spread_parent_cpus(const struct sub_cgroup *cg, char *out, size_t outsz)
{
	char parent[PATH_MAX], path[PATH_MAX + 32];

	dir_up(spread_dir(cg), parent, sizeof(parent));
	snprintf(path, sizeof(path), "%s/%s", parent, cg->v2 ? "cpuset.cpus.effective" : "cpuset.cpus");
	if (read_small(path, out, outsz) < 0)
		return SPACED_ESYS;
	out[strcspn(out, "\n")] = '\0';
	return out[0] != '\0' ? 0 : SPACED_ENOENT;
}

/* v1: a new cpuset cgroup has no CPUs and no memory nodes (no task may
 * join it): dir gets from's where it has none. */
static int cpuset_fill(const char *dir, const char *from)
{
	static const char *const files[] = { "cpuset.mems", "cpuset.cpus" };

	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		char path[PATH_MAX + 32], val[4096];

		snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
		if (read_small(path, val, sizeof(val)) < 0)
			return SPACED_ESYS;
		if (val[0] != '\0' && val[0] != '\n')
			continue;
		snprintf(path, sizeof(path), "%s/%s", from, files[i]);
		if (read_small(path, val, sizeof(val)) < 0)
			return SPACED_ESYS;
		val[strcspn(val, "\n")] = '\0';
		if (val[0] == '\0' || knob(dir, files[i], val, NULL, 0) < 0)
			return SPACED_ESYS;
	}
	return 0;
}

/* Where the spread rule can hold the execution to fewer CPUs: its cpuset
 * cgroup (v1: made now, as wide as its parent; cgroup2: its own directory,
 * when the cpuset controller is on there). Best effort: the rule is the
 * worker's, not a limit asked for, and without a cpuset it does not apply.
 * Not made where the limit covers every CPU of the parent. */
static void spread_setup(struct sub_cgroup *cg, const char *name, uint32_t cpu_milli)
{
	char path[PATH_MAX + 32], list[4096];
	bool set[SPREAD_CPUS];
	unsigned width = (cpu_milli + 999) / 1000;

	cg->cpu_milli = cpu_milli;
	if (cg->v2) {
		snprintf(path, sizeof(path), "%s/cpuset.cpus", cg->unified);
		if (access(path, F_OK) != 0)
			return;
	} else {
		char parent[PATH_MAX], grand[PATH_MAX];

		if (!has_v1("cpuset") || make_v1("cpuset", name, cg->cpuset, sizeof(cg->cpuset), NULL, 0) < 0) {
			cg->cpuset[0] = '\0';
			return;
		}
		dir_up(cg->cpuset, parent, sizeof(parent));
		dir_up(parent, grand, sizeof(grand));
		if (cpuset_fill(parent, grand) < 0 || cpuset_fill(cg->cpuset, parent) < 0) {
			remove_dir(cg->cpuset);
			return;
		}
	}
	int n = spread_parent_cpus(cg, list, sizeof(list)) < 0 ? -1 : cpulist_parse(list, set);
	if (n < 0 || (unsigned)n <= width) {
		if (!cg->v2)
			remove_dir(cg->cpuset);
		return;
	}
	cg->spread_width = width;
}

/* The largest PID a namespace gives (its counter wraps there, starting
 * again at 300), from /proc/sys/kernel/pid_max; 0 when unreadable. */
static uint32_t pid_max(void)
{
	static uint32_t max;
	char text[32];

	if (max == 0 && read_small("/proc/sys/kernel/pid_max", text, sizeof(text)) == 0)
		max = (uint32_t)strtoul(text, NULL, 10);
	return max;
}

/* Tasks started a second since the last reading of the execution's PID
 * namespace (cg->sp_ns_pid), from next, the PID it gives now (the reading
 * itself took one); 0 when no rate can be told yet. */
static uint64_t forks_per_s(struct sub_cgroup *cg, uint64_t now_ns, uint32_t next)
{
	uint64_t rate = 0;

	if (next == 0)
		return 0;
	if (cg->sp_ns_pid != 0 && now_ns > cg->sp_ns_at_ns) {
		uint64_t started;
		if (next > cg->sp_ns_pid)
			started = next - cg->sp_ns_pid - 1u;
		else /* it wrapped at pid_max (or nothing told: 0) */
			started = pid_max() > cg->sp_ns_pid && next > 300u ? pid_max() - cg->sp_ns_pid + (next - 300u) : 0;
		rate = started * 1000000000ull / (now_ns - cg->sp_ns_at_ns);
	}
	cg->sp_ns_pid = next;
	cg->sp_ns_at_ns = now_ns;
	return rate;
}

/* CPU time the execution used (µs), or UINT64_MAX. */
static uint64_t used_usec(const struct sub_cgroup *cg)
{
	if (cg->v2)
		return read_u64(cg->unified, "cpu.stat", "usage_usec");
	uint64_t ns = read_u64(cg->cpuacct, "cpuacct.usage", NULL);
	return ns == UINT64_MAX ? ns : ns / 1000;
}

/* The part of it spent in the kernel (µs), or UINT64_MAX. */
static uint64_t kernel_usec(const struct sub_cgroup *cg)
{
	if (cg->v2)
		return read_u64(cg->unified, "cpu.stat", "system_usec");
	uint64_t ns = read_u64(cg->cpuacct, "cpuacct.usage_sys", NULL);
	return ns == UINT64_MAX ? ns : ns / 1000;
}

/* The CPU limit (thousandths of a CPU) of execution cgroup name in the
 * parent pname (a worker's "spaced" or "spaced.NAME") beside cg's, from its
 * quota; 0 when unreadable or none. */
static uint64_t held_milli(const struct sub_cgroup *cg, const char *pname, const char *name)
{
	char dir[PATH_MAX], grand[PATH_MAX], path[PATH_MAX + 600], text[128];
	unsigned long long quota = 0, period = 0;

	dir_up(cg->v2 ? cg->unified : cg->cpu, dir, sizeof(dir));
	dir_up(dir, grand, sizeof(grand));
	if (cg->v2) {
		snprintf(path, sizeof(path), "%s/%s/%s/cpu.max", grand, pname, name);
		if (read_small(path, text, sizeof(text)) < 0 || sscanf(text, "%llu %llu", &quota, &period) != 2)
			return 0;
	} else {
		snprintf(path, sizeof(path), "%s/%s/%s/cpu.cfs_quota_us", grand, pname, name);
		if (read_small(path, text, sizeof(text)) < 0 || sscanf(text, "%llu", &quota) != 1)
			return 0;
		snprintf(path, sizeof(path), "%s/%s/%s/cpu.cfs_period_us", grand, pname, name);
		if (read_small(path, text, sizeof(text)) < 0 || sscanf(text, "%llu", &period) != 1)
			return 0;
	}
	return period > 0 && quota < (1ull << 40) ? quota * 1000u / period : 0;
}

/* Adds to load what the executions held in the parent pname (under grand)
 * put on each CPU: each one's limit counted evenly over its CPUs (a whole
 * CPU where its limit cannot be read). own_dir is left out. */
static void held_load(const struct sub_cgroup *cg, const char *grand, const char *pname, const char *own_dir,
                      uint64_t load[SPREAD_CPUS])
{
	char pdir[PATH_MAX], path[PATH_MAX + 300], text[4096];
	bool theirs[SPREAD_CPUS];
	int n;

	snprintf(pdir, sizeof(pdir), "%.3800s/%.200s", grand, pname);
	snprintf(path, sizeof(path), "%s/%s", pdir, cg->v2 ? "cpuset.cpus.effective" : "cpuset.cpus");
	if (read_small(path, text, sizeof(text)) < 0 || (n = cpulist_parse(text, theirs)) <= 0)
		return;
	DIR *d = opendir(pdir);
	struct dirent *de;

	while (d != NULL && (de = readdir(d)) != NULL) {
		int m;

		if (launcher_of(de->d_name) == 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", pdir, de->d_name);
		if (strcmp(path, own_dir) == 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s/cpuset.cpus", pdir, de->d_name);
		if (read_small(path, text, sizeof(text)) < 0 || (m = cpulist_parse(text, theirs)) <= 0 || m >= n)
			continue;
		uint64_t each = held_milli(cg, pname, de->d_name) / (unsigned)m;
		for (int c = 0; c < SPREAD_CPUS; c++)
			if (theirs[c])
				load[c] += each ? each : 1000u;
	}
	if (d != NULL)
		closedir(d);
}

/* The directory holding the workers' parents (grand: the rule's lock, and
 * where the held CPUs are published). */
static void spread_grand(const struct sub_cgroup *cg, char *grand, size_t grandsz)
{
	char parent[PATH_MAX];

	dir_up(spread_dir(cg), parent, sizeof(parent));
	dir_up(parent, grand, grandsz);
}

/* The rule's host-wide lock on grand, never waited for: a launcher's loop
 * serves its guest's transport; one that finds another deciding tries again
 * at its next sample. The locked descriptor, -1 when taken (busy set) or on
 * error. */
static int spread_lock(const char *grand, bool *busy)
{
	int lock = open(grand, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	*busy = false;
	if (lock < 0 || flock(lock, LOCK_EX | LOCK_NB) < 0) {
		*busy = lock >= 0 && errno == EWOULDBLOCK;
		if (lock >= 0)
			close(lock);
		return -1;
	}
	return lock;
}

/* What the executions held on the host (every worker's parent under grand)
 * put on each CPU, own left out (held_load). */
static void host_held_load(const struct sub_cgroup *cg, const char *grand, const char *own, uint64_t load[SPREAD_CPUS])
{
	DIR *d = opendir(grand);
	struct dirent *de;

	memset(load, 0, SPREAD_CPUS * sizeof(uint64_t));
	while (d != NULL && (de = readdir(d)) != NULL)
		if (strcmp(de->d_name, "spaced") == 0 ||
		    (strncmp(de->d_name, "spaced.", 7) == 0 && strchr(de->d_name, '+') == NULL))
			held_load(cg, grand, de->d_name, own, load);
	if (d != NULL)
		closedir(d);
}

/* ---- free executions off the held CPUs ----
 * A held execution runs its tasks on its CPUs whenever its quota lets it: a
 * task of another execution woken there waits, more often than not, for the
 * kernel's next tick (4 ms at 250 Hz), while the other CPUs may be idle. So
 * the CPUs that held executions run on are published on grand (an extended
 * attribute, with the second it was written; older than TAKEN_FRESH_S it
 * says nothing) by the launcher that decides under the rule's lock — a hold,
 * a release, and every sample of a held execution — and every free
 * execution keeps its tasks off them (their affinity: its cpuset stays its
 * parent's, so the rule counts it as free) wherever the rest leaves it its
 * limit's CPUs: what it may use is never below its limit, what it gives up
 * is the held CPUs' time their executions' limits leave over (a victim's
 * burst of execs is busy too, and was the one that waited); a CPU counts as
 * taken where the held limits make half a CPU (TAKEN_MIN_MILLI). */
#define TAKEN_XATTR "trusted.spaced.cpus_held"
#define TAKEN_FRESH_S 5
/* A CPU is taken from the free executions only where the held executions'
 * limits make half a CPU: held limits take at most twice their worth from
 * the rest (a hog of a hundredth of a CPU, held, takes no CPU). */
#define TAKEN_MIN_MILLI 500u

/* Publishes on grand the CPUs where load (and mine_milli on the CPUs of
 * mine, when not NULL) makes TAKEN_MIN_MILLI. */
static void taken_publish(const char *grand, const uint64_t load[SPREAD_CPUS], const bool *mine, uint64_t mine_milli)
{
	char text[4096];
	size_t used = (size_t)snprintf(text, sizeof(text), "%lld ", (long long)time(NULL));
	bool any = false;

	for (int c = 0; c < SPREAD_CPUS && used + 8 < sizeof(text); c++)
		if (load[c] + (mine != NULL && mine[c] ? mine_milli : 0) >= TAKEN_MIN_MILLI) {
			used += (size_t)snprintf(text + used, sizeof(text) - used, "%s%d", any ? "," : "", c);
			any = true;
		}
	if (!any)
		used += (size_t)snprintf(text + used, sizeof(text) - used, "-");
	(void)setxattr(grand, TAKEN_XATTR, text, used, 0);
}

/* The CPUs published as held (none when the note is missing or stale). */
static void taken_read(const char *grand, bool taken[SPREAD_CPUS])
{
	char text[4096];
	ssize_t n = getxattr(grand, TAKEN_XATTR, text, sizeof(text) - 1);
	long long at;
	int off = 0;

	memset(taken, 0, SPREAD_CPUS * sizeof(bool));
	if (n <= 0)
		return;
	text[n] = '\0';
	if (sscanf(text, "%lld %n", &at, &off) != 1 || off <= 0 || at + TAKEN_FRESH_S < (long long)time(NULL) ||
	    text[off] == '-' || cpulist_parse(text + off, taken) < 0)
		memset(taken, 0, SPREAD_CPUS * sizeof(bool));
}

/* Sets the affinity of every task of the execution to set. */
static void tasks_affinity(const struct sub_cgroup *cg, const bool set[SPREAD_CPUS])
{
	char path[PATH_MAX + 32];
	cpu_set_t mask;

	CPU_ZERO(&mask);
	for (int c = 0; c < SPREAD_CPUS && c < CPU_SETSIZE; c++)
		if (set[c])
			CPU_SET(c, &mask);
	snprintf(path, sizeof(path), "%s/%s", spread_dir(cg), cg->v2 ? "cgroup.threads" : "tasks");
	FILE *f = fopen(path, "re");
	long tid;

	while (f != NULL && fscanf(f, "%ld", &tid) == 1)
		(void)sched_setaffinity((pid_t)tid, sizeof(mask), &mask);
	if (f != NULL)
		fclose(f);
}

/* One sample of a free execution: kept off the published held CPUs (3,
 * cpus: where it is kept), on every CPU again once none is held or the rest
 * is narrower than its limit (4, cpus: every CPU), 0 for no change. Its
 * tasks' affinity is set again at each sample while it is kept (new ones
 * inherit it; one that set its own is put back). */
static int keep_off(struct sub_cgroup *cg, char *cpus, size_t cpussz)
{
	char list[4096], grand[PATH_MAX], text[256] = "";
	bool all[SPREAD_CPUS], want[SPREAD_CPUS], taken[SPREAD_CPUS], any = false;
	int n = 0, nall;

	spread_grand(cg, grand, sizeof(grand));
	taken_read(grand, taken);
	for (int c = 0; c < SPREAD_CPUS && !any; c++)
		any = taken[c];
	if (!any && !cg->kept_to[0])
		return 0; /* the common case, one system call: none held, none kept */
	if (spread_parent_cpus(cg, list, sizeof(list)) < 0 || (nall = cpulist_parse(list, all)) <= 0)
		return SPACED_ESYS;
	for (int c = 0; c < SPREAD_CPUS; c++)
		want[c] = all[c] && !taken[c];
	for (int c = 0; c < SPREAD_CPUS; c++)
		n += want[c];
	if ((unsigned)n < cg->spread_width || n == nall) {
		if (!cg->kept_to[0])
			return 0;
		memcpy(want, all, sizeof(want));
	} else {
		size_t used = 0;

		for (int c = 0; c < SPREAD_CPUS; c++)
			if (want[c] && used + 8 < sizeof(text))
				used += (size_t)snprintf(text + used, sizeof(text) - used, "%s%d", used ? "," : "", c);
	}
	tasks_affinity(cg, want);
	int r = strcmp(text, cg->kept_to) == 0 ? 0 : text[0] ? 3 : 4;

	snprintf(cg->kept_to, sizeof(cg->kept_to), "%s", text);
	snprintf(cpus, cpussz, "%s", text[0] ? text : list);
	return r;
}

/* Holds the execution to spread_width CPUs where the executions held
 * already — this worker's and every other worker's of the host (each
 * worker's parent, "spaced" or "spaced.NAME") — leave room for its limit
 * (a CPU holds at most one CPU's worth): the most loaded of those, the
 * lowest first — held executions packed together, so that the free ones
 * keep the most CPUs (keep_off). Where there is no such room it stays where
 * it is (0: a CPU given to two held executions beyond its worth would take
 * from both what their limits give them; it is tried again at the next
 * sample). The host's launchers decide one at a time (spread_lock); one
 * that finds the lock taken decides at its next sample (0). 1 when held
 * (cpus: the list); the held CPUs published afresh either way. */
static int spread_hold(struct sub_cgroup *cg, char *cpus, size_t cpussz)
{
	char list[4096], grand[PATH_MAX];
	bool all[SPREAD_CPUS], chosen[SPREAD_CPUS], busy;
	uint64_t load[SPREAD_CPUS];
	const char *own = spread_dir(cg);
	uint64_t mine = cg->cpu_milli / cg->spread_width;
	int r = 0;

	if (spread_parent_cpus(cg, list, sizeof(list)) < 0 || cpulist_parse(list, all) <= 0)
		return SPACED_ESYS;
	memset(chosen, 0, sizeof(chosen));
	spread_grand(cg, grand, sizeof(grand));
	int lock = spread_lock(grand, &busy);
	if (lock < 0)
		return busy ? 0 : SPACED_ESYS;
	host_held_load(cg, grand, own, load);
	unsigned got = 0;
	for (; got < cg->spread_width; got++) {
		int best = -1;

		for (int c = 0; c < SPREAD_CPUS; c++)
			if (all[c] && !chosen[c] && load[c] + mine <= 1000u && (best < 0 || load[c] > load[best]))
				best = c;
		if (best < 0)
			break;
		chosen[best] = true;
	}
	if (got == cg->spread_width) {
		size_t used = 0;

		cpus[0] = '\0';
		for (int c = 0; c < SPREAD_CPUS; c++)
			if (chosen[c] && used + 8 < cpussz)
				used += (size_t)snprintf(cpus + used, cpussz - used, "%s%d", used ? "," : "", c);
		r = knob(own, "cpuset.cpus", cpus, NULL, 0) < 0 ? SPACED_ESYS : 1;
	}
	taken_publish(grand, load, r == 1 ? chosen : NULL, mine);
	close(lock); /* the lock goes with it */
	return r;
}

/* A held execution's sample, or one just let go (own's cpuset wide again):
 * the held CPUs published afresh, when the lock is free. */
static void taken_refresh(const struct sub_cgroup *cg)
{
	char grand[PATH_MAX];
	uint64_t load[SPREAD_CPUS];
	bool busy;

	spread_grand(cg, grand, sizeof(grand));
	int lock = spread_lock(grand, &busy);
	if (lock < 0)
		return;
	host_held_load(cg, grand, "", load); /* its own too, while it is held */
	taken_publish(grand, load, NULL, 0);
	close(lock);
}

int sub_cgroup_cpu_spread(struct sub_cgroup *cg, uint64_t now_ns, uint32_t (*next_pid)(void *), void *arg, char *cpus,
                          size_t cpussz, unsigned *next_ms)
{
	char list[4096];

	*next_ms = SPREAD_IDLE_MS;
	if (cg->spread_width == 0)
		return SPACED_ENOENT;
	const char *cpu_dir = cg->v2 ? cg->unified : cg->cpu;
	uint64_t periods = read_u64(cpu_dir, "cpu.stat", "nr_periods");
	/* how long its quota held it back (µs; v1 counts ns) */
	uint64_t throttled = read_u64(cpu_dir, "cpu.stat", cg->v2 ? "throttled_usec" : "throttled_time");
	uint64_t usec = used_usec(cg), kusec = kernel_usec(cg);

	if (!cg->v2 && throttled != UINT64_MAX)
		throttled /= 1000u;

	if (periods == UINT64_MAX || throttled == UINT64_MAX || usec == UINT64_MAX)
		return SPACED_ESYS;
	bool first = cg->sp_at_ns == 0 || now_ns <= cg->sp_at_ns || periods < cg->sp_periods ||
	             throttled < cg->sp_throttled || usec < cg->sp_usec;
	uint64_t dt = now_ns - cg->sp_at_ns, dp = periods - cg->sp_periods, dthr = throttled - cg->sp_throttled,
	         du = usec - cg->sp_usec;
	/* its time in the kernel over the sample, when both readings are there */
	uint64_t kernel_milli = first || kusec == UINT64_MAX || cg->sp_kernel_usec == UINT64_MAX ||
	                                kusec < cg->sp_kernel_usec
	                            ? 0
	                            : (kusec - cg->sp_kernel_usec) * 1000u / (dt / 1000u + 1);

	cg->sp_at_ns = now_ns;
	cg->sp_periods = periods;
	cg->sp_throttled = throttled;
	cg->sp_usec = usec;
	cg->sp_kernel_usec = kusec;
	cg->kernel_run = kernel_milli >= SPREAD_KERNEL_MILLI ? cg->kernel_run + 1 : 0;
	if (first) {
		/* the count of its task starts from here too: the next sample
		 * tells a rate, as it tells the time in the kernel */
		if (next_pid != NULL)
			(void)forks_per_s(cg, now_ns, next_pid(arg));
		*next_ms = SPREAD_BUSY_MS;
		return 0;
	}
	/* held back by its quota for a fifth of the sample's time: more runnable
	 * tasks than the limit's CPUs (one busy task under a whole-CPU limit
	 * meets its quota, at most a moment past it: it is not held); using
	 * 80 % of the limit: still as busy */
	bool capped = dp >= 4 && dthr * 5 >= dt / 1000u;
	uint64_t used_milli = du * 1000u / (dt / 1000u + 1);
	bool busy = used_milli * 10u >= (uint64_t)cg->cpu_milli * 8u;
	/* the tasks it started: its namespace's counter, read when it used CPU
	 * (an idle one started none); a reading skipped leaves the last one,
	 * and the next rate covers the whole time since */
	uint64_t forks = 0;
	if (next_pid != NULL && used_milli >= SPREAD_FORKS_PROBE_MILLI)
		forks = forks_per_s(cg, now_ns, next_pid(arg));
	bool forked = forks >= SPREAD_FORKS && kernel_milli >= SPREAD_FORKS_KERNEL_MILLI;
	cg->fork_run = forked ? cg->fork_run + 1 : 0;
	bool in_kernel = cg->kernel_run >= SPREAD_KERNEL_SAMPLES;
	bool forking = cg->fork_run >= SPREAD_KERNEL_SAMPLES;

	if (cg->held_cpus[0] || capped || cg->kernel_run || cg->fork_run || used_milli * 10u >= cg->cpu_milli)
		*next_ms = SPREAD_BUSY_MS;

	if (!cg->held_cpus[0]) {
		if (!capped && !in_kernel && !forking)
			return keep_off(cg, cpus, cpussz);
		if (cg->kept_to[0]) {
			/* every CPU first: an affinity set by sched_setaffinity stays
			 * the task's wish, which a cpuset's change intersects (Linux
			 * 6.2 on): let go later, its tasks would stay where kept */
			char all_list[4096];
			bool all[SPREAD_CPUS];

			if (spread_parent_cpus(cg, all_list, sizeof(all_list)) == 0 && cpulist_parse(all_list, all) > 0)
				tasks_affinity(cg, all);
			cg->kept_to[0] = '\0';
		}
		int h = spread_hold(cg, cpus, cpussz);
		if (h <= 0)
			return h;
		snprintf(cg->held_cpus, sizeof(cg->held_cpus), "%s", cpus);
		cg->calm = 0;
		cg->kernel_hold_milli = capped ? 0 : used_milli;
		return capped ? 1 : forking ? 6 : 5; /* both: the exact count is named */
	}
	taken_refresh(cg);
	/* one held for its time in the kernel stays held while it uses half of
	 * what it used then: the kernel's share is counted at the scheduler's
	 * ticks, and beside a busy task its short runs between them are missed
	 * (a fork loop's 0.2 CPU in the kernel read as 0.08 beside the hog,
	 * its use the same within a fifth) */
	bool still = cg->kernel_hold_milli && used_milli * 2u >= cg->kernel_hold_milli;
	if (capped || busy || kernel_milli >= SPREAD_KERNEL_MILLI || forked || still) {
		cg->calm = 0;
		return 0;
	}
	if (++cg->calm < SPREAD_CALM)
		return 0;
	if (spread_parent_cpus(cg, list, sizeof(list)) < 0 || knob(spread_dir(cg), "cpuset.cpus", list, NULL, 0) < 0)
		return SPACED_ESYS;
	snprintf(cpus, cpussz, "%s", list);
	cg->held_cpus[0] = '\0';
	cg->calm = 0;
	cg->kernel_hold_milli = 0;
	cg->kernel_run = 0;
	cg->fork_run = 0;
	taken_refresh(cg);
	return 2;
}

int sub_cgroup_create(struct sub_cgroup *cg, const char *name, const struct sub_limits *lim,
                      char *why, size_t whysz)
{
	static const struct sub_limits none = { 0 };
	char val[32], path[PATH_MAX + 64];
	int r;

	if (lim == NULL)
		lim = &none;
	memset(cg, 0, sizeof(*cg));
	if (unified_mode()) {
		char own[PATH_MAX - 64], dir[PATH_MAX];

		cg->v2 = true;
		r = own_base("", own, sizeof(own));
		if (r < 0) {
			spaced_why(why, whysz, "no cgroup2 line in /proc/self/cgroup");
			return r;
		}
		if (strcmp(own, "/") == 0)
			own[0] = '\0';
		snprintf(dir, sizeof(dir), "/sys/fs/cgroup%s", own);
		/* best effort: a delegated subtree may have these enabled already;
		 * cpuset apart (the spread rule's, where the host has it) */
		(void)knob(dir, "cgroup.subtree_control", "+memory +pids +cpu +io", NULL, 0);
		if (lim->cpu_milli > 0)
			(void)knob(dir, "cgroup.subtree_control", "+cpuset", NULL, 0);
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, parent_name()) >= sizeof(path))
			return SPACED_ETOOBIG;
		if (mkdir(path, 0755) < 0 && errno != EEXIST) {
			spaced_why(why, whysz, "mkdir %s: %s", path, strerror(errno));
			return SPACED_ESYS;
		}
		(void)knob(path, "cgroup.subtree_control", "+memory +pids +cpu +io", NULL, 0);
		if (lim->cpu_milli > 0)
			(void)knob(path, "cgroup.subtree_control", "+cpuset", NULL, 0);
		if (!swept_v2) {
			sweep_dead(path);
			swept_v2 = true;
		}
		if ((size_t)snprintf(cg->unified, sizeof(cg->unified), "%s/%s", path, name) >=
		    sizeof(cg->unified))
			return SPACED_ETOOBIG;
		if (mkdir_fresh(cg->unified) < 0) {
			spaced_why(why, whysz, "mkdir %s: %s", cg->unified, strerror(errno));
			return SPACED_ESYS;
		}
		cg->made = true;
		if ((r = set_v2_limits(cg->unified, lim, why, whysz)) < 0)
			goto fail;
		if (lim->cpu_milli > 0)
			spread_setup(cg, name, lim->cpu_milli);
		return 0;
	}
	cg->made = true;
	if ((r = make_v1("memory", name, cg->mem, sizeof(cg->mem), why, whysz)) < 0)
		goto fail;
	if ((r = make_v1("pids", name, cg->pids, sizeof(cg->pids), why, whysz)) < 0)
		goto fail;
	if ((r = make_v1("freezer", name, cg->freezer, sizeof(cg->freezer), why, whysz)) < 0)
		goto fail;
	/* cpu: needed for a CPU limit; cpuacct: for the usage figure (often one
	 * hierarchy "cpu,cpuacct", where both names lead to the same directory) */
	if ((lim->cpu_milli > 0 || has_v1("cpu")) &&
	    (r = make_v1("cpu", name, cg->cpu, sizeof(cg->cpu), why, whysz)) < 0)
		goto fail;
	if (has_v1("cpuacct") && strcmp(cg->cpu, "") != 0) {
		char own_cpu[PATH_MAX], own_acct[PATH_MAX];

		/* a joint hierarchy: the cpu directory is the cpuacct directory */
		if (cgroup_path_of(0, "cpu", own_cpu, sizeof(own_cpu)) == 0 &&
		    cgroup_path_of(0, "cpuacct", own_acct, sizeof(own_acct)) == 0) {
			char probe[PATH_MAX + 32];

			snprintf(probe, sizeof(probe), "%s/cpuacct.usage", cg->cpu);
			if (access(probe, F_OK) == 0)
				snprintf(cg->cpuacct, sizeof(cg->cpuacct), "%s", cg->cpu);
		}
	}
	if (cg->cpuacct[0] == '\0' && has_v1("cpuacct") &&
	    (r = make_v1("cpuacct", name, cg->cpuacct, sizeof(cg->cpuacct), why, whysz)) < 0)
		goto fail;
	if (lim->mem_bytes > 0) {
		snprintf(val, sizeof(val), "%" PRIu64, lim->mem_bytes);
		if ((r = knob(cg->mem, "memory.limit_in_bytes", val, why, whysz)) < 0)
			goto fail;
		/* with swap accounting, memory+swap gets the same ceiling: no escape to swap */
		snprintf(path, sizeof(path), "%s/memory.memsw.limit_in_bytes", cg->mem);
		if (access(path, F_OK) == 0 && (r = knob(cg->mem, "memory.memsw.limit_in_bytes", val, why, whysz)) < 0)
			goto fail;
		/* v1 counts TCP buffers apart, and only under a limit of their own:
		 * without it the execution's sockets hold the host's TCP memory
		 * (net.ipv4.tcp_mem, shared by every socket) outside its limit. A
		 * quarter of the limit (16 MiB at least, the limit at most): memory
		 * and TCP buffers together stay within 1.25 times it. v2 counts them
		 * in memory.max. */
		uint64_t tcp = lim->mem_bytes / 4 > (UINT64_C(16) << 20) ? lim->mem_bytes / 4 : UINT64_C(16) << 20;
		snprintf(val, sizeof(val), "%" PRIu64, tcp < lim->mem_bytes ? tcp : lim->mem_bytes);
		snprintf(path, sizeof(path), "%s/memory.kmem.tcp.limit_in_bytes", cg->mem);
		if (access(path, F_OK) == 0 && (r = knob(cg->mem, "memory.kmem.tcp.limit_in_bytes", val, why, whysz)) < 0)
			goto fail;
	}
	if (lim->pids_max > 0) {
		snprintf(val, sizeof(val), "%" PRIu64, lim->pids_max);
		if ((r = knob(cg->pids, "pids.max", val, why, whysz)) < 0)
			goto fail;
	}
	if (lim->cpu_milli > 0) {
		uint64_t shares = (uint64_t)lim->cpu_milli * 1024 / 1000;

		snprintf(val, sizeof(val), "%u", CPU_PERIOD_US);
		if ((r = knob(cg->cpu, "cpu.cfs_period_us", val, why, whysz)) < 0)
			goto fail;
		snprintf(val, sizeof(val), "%" PRIu64, (uint64_t)lim->cpu_milli * CPU_PERIOD_US / 1000);
		if ((r = knob(cg->cpu, "cpu.cfs_quota_us", val, why, whysz)) < 0)
			goto fail;
		snprintf(val, sizeof(val), "%" PRIu64, shares < 2 ? 2 : shares);
		if ((r = knob(cg->cpu, "cpu.shares", val, why, whysz)) < 0)
			goto fail;
	}
	if ((r = set_v1_io(cg, name, lim, why, whysz)) < 0)
		goto fail;
	if (lim->cpu_milli > 0)
		spread_setup(cg, name, lim->cpu_milli);
	return 0;
fail:
	sub_cgroup_remove(cg);
	return r < 0 ? r : SPACED_ESYS;
}

/* The first unsigned number in a small file (or after `key ` in a keyed one). */
static uint64_t read_u64(const char *dir, const char *file, const char *key)
{
	char path[PATH_MAX + 64], buf[4096];
	unsigned long long v;

	if (dir[0] == '\0')
		return UINT64_MAX;
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	if (read_small(path, buf, sizeof(buf)) < 0)
		return UINT64_MAX;
	if (key != NULL) {
		size_t kl = strlen(key);

		for (char *line = buf; line != NULL && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
			if (strncmp(line, key, kl) == 0 && line[kl] == ' ' && sscanf(line + kl + 1, "%llu", &v) == 1)
				return v;
		return UINT64_MAX;
	}
	return sscanf(buf, "%llu", &v) == 1 ? v : UINT64_MAX;
}

void sub_cgroup_usage(const struct sub_cgroup *cg, struct sub_usage *u)
{
	if (cg->v2) {
		u->cpu_usec = read_u64(cg->unified, "cpu.stat", "usage_usec");
		u->mem_bytes = read_u64(cg->unified, "memory.current", NULL);
		u->mem_peak = read_u64(cg->unified, "memory.peak", NULL);
		u->oom_kills = read_u64(cg->unified, "memory.events", "oom_kill");
		u->pids = read_u64(cg->unified, "pids.current", NULL);
		return;
	}
	uint64_t ns = read_u64(cg->cpuacct, "cpuacct.usage", NULL);

	u->cpu_usec = ns == UINT64_MAX ? ns : ns / 1000;
	u->mem_bytes = read_u64(cg->mem, "memory.usage_in_bytes", NULL);
	u->mem_peak = read_u64(cg->mem, "memory.max_usage_in_bytes", NULL);
	u->oom_kills = read_u64(cg->mem, "memory.oom_control", "oom_kill");
	u->pids = read_u64(cg->pids, "pids.current", NULL);
}

/* Kills every task listed in dir/cgroup.procs; returns how many it saw. */
static int kill_procs(const char *dir)
{
	char path[PATH_MAX + 64], buf[65536];
	int n = 0;

	snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
	if (read_small(path, buf, sizeof(buf)) < 0)
		return 0;
	for (char *p = buf; *p;) {
		char *end;
		long pid = strtol(p, &end, 10);

		if (end == p)
			break;
		if (pid > 1) {
			(void)kill((pid_t)pid, SIGKILL);
			n++;
		}
		p = end;
		while (*p == '\n')
			p++;
	}
	return n;
}

/* One hierarchy's "spaced" directory: kill, thaw and remove what dead launchers left. */
static int reap_dir(const char *spaced_dir, const char *ctrl)
{
	struct dirent *de;
	DIR *d = opendir(spaced_dir);
	int found = 0;

	if (d == NULL)
		return 0;
	while ((de = readdir(d)) != NULL) {
		char cg[PATH_MAX + 600];
		int pid = launcher_of(de->d_name);

		if (pid == 0 || !launcher_gone(pid))
			continue;
		if ((size_t)snprintf(cg, sizeof(cg), "%s/%s", spaced_dir, de->d_name) >= sizeof(cg))
			continue;
		if (rmdir(cg) == 0 || errno == ENOENT)
			continue;
		found++;
		for (int i = 0; i < 200; i++) {
			kill_procs(cg);
			if (ctrl == NULL)
				(void)knob(cg, "cgroup.freeze", "0", NULL, 0);
			else if (strcmp(ctrl, "freezer") == 0)
				(void)knob(cg, "freezer.state", "THAWED", NULL, 0);
			if (rmdir(cg) == 0 || errno == ENOENT)
				break;
			nap_us(5000);
		}
	}
	closedir(d);
	return found;
}

/* reap_dir for every parent of executions in base ("spaced", and each
 * worker's "spaced.NAME": parent_name). */
static int reap_parents(const char *base, const char *ctrl)
{
	DIR *d = opendir(base);
	struct dirent *de;
	int found = 0;

	if (d == NULL)
		return 0;
	while ((de = readdir(d)) != NULL) {
		char dir[PATH_MAX + 300];

		if (strcmp(de->d_name, "spaced") != 0 && strncmp(de->d_name, "spaced.", 7) != 0)
			continue;
		if ((size_t)snprintf(dir, sizeof(dir), "%s/%s", base, de->d_name) < sizeof(dir))
			found += reap_dir(dir, ctrl);
	}
	closedir(d);
	return found;
}

int sub_cgroup_reap_orphans(void)
{
	char own[PATH_MAX - 64], dir[PATH_MAX];
	int found = 0;

	if (unified_mode()) {
		if (own_base("", own, sizeof(own)) < 0)
			return 0;
		snprintf(dir, sizeof(dir), "/sys/fs/cgroup%s", strcmp(own, "/") == 0 ? "" : own);
		return reap_parents(dir, NULL);
	}
	/* the freezer first: its tasks must be thawed before they can die */
	static const char *const order[] = { "freezer", "pids", "memory", "cpu", "cpuacct", "blkio", "cpuset" };
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		if (own_base(order[i], own, sizeof(own)) < 0)
			continue;
		snprintf(dir, sizeof(dir), "/sys/fs/cgroup/%s%s", order[i], strcmp(own, "/") == 0 ? "" : own);
		found += reap_parents(dir, order[i]);
	}
	return found;
}

int sub_cgroup_add(const struct sub_cgroup *cg, pid_t pid, char *why, size_t whysz)
{
	char val[32];
	int r;

	snprintf(val, sizeof(val), "%d", (int)pid);
	if (cg->v2)
		return knob(cg->unified, "cgroup.procs", val, why, whysz);
	if ((r = knob(cg->mem, "cgroup.procs", val, why, whysz)) < 0)
		return r;
	if ((r = knob(cg->pids, "cgroup.procs", val, why, whysz)) < 0)
		return r;
	if (cg->cpu[0] && (r = knob(cg->cpu, "cgroup.procs", val, why, whysz)) < 0)
		return r;
	if (cg->cpuacct[0] && strcmp(cg->cpuacct, cg->cpu) != 0 &&
	    (r = knob(cg->cpuacct, "cgroup.procs", val, why, whysz)) < 0)
		return r;
	if (cg->blkio[0] && (r = knob(cg->blkio, "cgroup.procs", val, why, whysz)) < 0)
		return r;
	/* best effort: the spread rule's, not a limit (it holds none then) */
	if (cg->cpuset[0])
		(void)knob(cg->cpuset, "cgroup.procs", val, NULL, 0);
	return knob(cg->freezer, "cgroup.procs", val, why, whysz);
}

int sub_cgroup_freeze(const struct sub_cgroup *cg, bool freeze)
{
	char path[PATH_MAX + 64], buf[256];
	int i;

	if (cg->v2) {
		if (knob(cg->unified, "cgroup.freeze", freeze ? "1" : "0", NULL, 0) < 0)
			return SPACED_ESYS;
		snprintf(path, sizeof(path), "%s/cgroup.events", cg->unified);
		for (i = 0; i < 5000; i++) {
			if (read_small(path, buf, sizeof(buf)) < 0)
				return SPACED_ESYS;
			if (strstr(buf, freeze ? "frozen 1" : "frozen 0") != NULL)
				return 0;
			nap_us(i < 10 ? 50 : 1000);
		}
		return SPACED_ETIMEDOUT;
	}
	if (knob(cg->freezer, "freezer.state", freeze ? "FROZEN" : "THAWED", NULL, 0) < 0)
		return SPACED_ESYS;
	snprintf(path, sizeof(path), "%s/freezer.state", cg->freezer);
	for (i = 0; i < 5000; i++) {
		if (read_small(path, buf, sizeof(buf)) < 0)
			return SPACED_ESYS;
		if (strncmp(buf, freeze ? "FROZEN" : "THAWED", 6) == 0)
			return 0;
		/* FREEZING: a task is between states; writing again retries it */
		if (freeze && i % 16 == 15)
			(void)knob(cg->freezer, "freezer.state", "FROZEN", NULL, 0);
		nap_us(i < 10 ? 50 : 1000);
	}
	return SPACED_ETIMEDOUT;
}

static void remove_dir(char *dir)
{
	int i;

	if (dir[0] == '\0')
		return;
	for (i = 0; i < 2000; i++) {
		if (rmdir(dir) == 0 || errno == ENOENT)
			break;
		if (errno != EBUSY)
			break;
		nap_us(i < 20 ? 100 : 1000); /* the last tasks of the pid namespace are still exiting */
	}
	dir[0] = '\0';
}

void sub_cgroup_remove(struct sub_cgroup *cg)
{
	if (cg == NULL || !cg->made)
		return;
	remove_dir(cg->unified);
	remove_dir(cg->blkio);
	remove_dir(cg->cpuset);
	if (strcmp(cg->cpuacct, cg->cpu) != 0)
		remove_dir(cg->cpuacct);
	remove_dir(cg->cpu);
	cg->cpuacct[0] = '\0';
	remove_dir(cg->freezer);
	remove_dir(cg->pids);
	remove_dir(cg->mem);
	cg->made = false;
}

int sub_cgroup_join_of(pid_t pid)
{
	static const char *const ctrls[] = { "memory", "pids", "freezer", "cpu", "cpuacct", "blkio", "cpuset" };
	char rel[PATH_MAX], path[PATH_MAX + 64];
	int r;

	if (unified_mode()) {
		if ((r = cgroup_path_of(pid, "", rel, sizeof(rel))) < 0)
			return r;
		snprintf(path, sizeof(path), "/sys/fs/cgroup%s/cgroup.procs", rel);
		return sub_write_file(path, "0");
	}
	for (size_t i = 0; i < sizeof(ctrls) / sizeof(ctrls[0]); i++) {
		if ((r = cgroup_path_of(pid, ctrls[i], rel, sizeof(rel))) < 0) {
			if (i >= 3)
				continue; /* no cpu / cpuacct / blkio / cpuset hierarchy on this host */
			return r;
		}
		snprintf(path, sizeof(path), "/sys/fs/cgroup/%s%s/cgroup.procs", ctrls[i], rel);
		if ((r = sub_write_file(path, "0")) < 0)
			return r;
	}
	return 0;
}
