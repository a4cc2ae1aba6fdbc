/*
 * sub_cgroup.c — memory and pids limits and the freezer of one execution, on
 * cgroup v1 (memory, pids, freezer hierarchies under /sys/fs/cgroup/<name>)
 * or on a unified cgroup2 /sys/fs/cgroup.
 */
#include "sub_internal.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
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
static bool swept_v1[3], swept_v2;

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
		unsigned int n;
		int pid;

		if (sscanf(de->d_name, "spaced-%d-%u", &pid, &n) != 2 || pid <= 0)
			continue;
		if (kill(pid, 0) == 0 || errno != ESRCH)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		(void)rmdir(path);
	}
	closedir(d);
}

static int make_v1(const char *ctrl, const char *name, char *out, size_t outsz, char *why,
                   size_t whysz)
{
	char own[PATH_MAX - 64], dir[PATH_MAX];
	int r;

	r = cgroup_path_of(0, ctrl, own, sizeof(own));
	if (r < 0) {
		spaced_why(why, whysz, "cgroup v1 %s hierarchy not found in /proc/self/cgroup", ctrl);
		return r;
	}
	if (strcmp(own, "/") == 0)
		own[0] = '\0';
	if ((size_t)snprintf(dir, sizeof(dir), "/sys/fs/cgroup/%s%s/spaced", ctrl, own) >= sizeof(dir))
		return SPACED_ETOOBIG;
	if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
		spaced_why(why, whysz, "mkdir %s: %s", dir, strerror(errno));
		return SPACED_ESYS;
	}
	{
		int k = strcmp(ctrl, "memory") == 0 ? 0 : strcmp(ctrl, "pids") == 0 ? 1 : 2;

		if (!swept_v1[k]) {
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

int sub_cgroup_create(struct sub_cgroup *cg, const char *name, uint64_t mem_bytes,
                      uint64_t pids_max, char *why, size_t whysz)
{
	char val[32], path[PATH_MAX + 64];
	int r;

	memset(cg, 0, sizeof(*cg));
	if (unified_mode()) {
		char own[PATH_MAX - 64], dir[PATH_MAX];

		cg->v2 = true;
		r = cgroup_path_of(0, "", own, sizeof(own));
		if (r < 0) {
			spaced_why(why, whysz, "no cgroup2 line in /proc/self/cgroup");
			return r;
		}
		if (strcmp(own, "/") == 0)
			own[0] = '\0';
		snprintf(dir, sizeof(dir), "/sys/fs/cgroup%s", own);
		/* best effort: a delegated subtree may have these enabled already */
		(void)knob(dir, "cgroup.subtree_control", "+memory +pids", NULL, 0);
		if ((size_t)snprintf(path, sizeof(path), "%s/spaced", dir) >= sizeof(path))
			return SPACED_ETOOBIG;
		if (mkdir(path, 0755) < 0 && errno != EEXIST) {
			spaced_why(why, whysz, "mkdir %s: %s", path, strerror(errno));
			return SPACED_ESYS;
		}
		(void)knob(path, "cgroup.subtree_control", "+memory +pids", NULL, 0);
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
		if (mem_bytes > 0) {
			snprintf(val, sizeof(val), "%" PRIu64, mem_bytes);
			if ((r = knob(cg->unified, "memory.max", val, why, whysz)) < 0)
				goto fail;
			(void)knob(cg->unified, "memory.swap.max", "0", NULL, 0);
		}
		if (pids_max > 0) {
			snprintf(val, sizeof(val), "%" PRIu64, pids_max);
			if ((r = knob(cg->unified, "pids.max", val, why, whysz)) < 0)
				goto fail;
		}
		return 0;
	}
	cg->made = true;
	if ((r = make_v1("memory", name, cg->mem, sizeof(cg->mem), why, whysz)) < 0)
		goto fail;
	if ((r = make_v1("pids", name, cg->pids, sizeof(cg->pids), why, whysz)) < 0)
		goto fail;
	if ((r = make_v1("freezer", name, cg->freezer, sizeof(cg->freezer), why, whysz)) < 0)
		goto fail;
	if (mem_bytes > 0) {
		snprintf(val, sizeof(val), "%" PRIu64, mem_bytes);
		if ((r = knob(cg->mem, "memory.limit_in_bytes", val, why, whysz)) < 0)
			goto fail;
		/* with swap accounting, memory+swap gets the same ceiling: no escape to swap */
		snprintf(path, sizeof(path), "%s/memory.memsw.limit_in_bytes", cg->mem);
		if (access(path, F_OK) == 0 && (r = knob(cg->mem, "memory.memsw.limit_in_bytes", val, why, whysz)) < 0)
			goto fail;
	}
	if (pids_max > 0) {
		snprintf(val, sizeof(val), "%" PRIu64, pids_max);
		if ((r = knob(cg->pids, "pids.max", val, why, whysz)) < 0)
			goto fail;
	}
	return 0;
fail:
	sub_cgroup_remove(cg);
	return r < 0 ? r : SPACED_ESYS;
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
	return knob(cg->freezer, "cgroup.procs", val, why, whysz);
}

static void nap_us(long us)
{
	struct timespec ts = { .tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000L };

	nanosleep(&ts, NULL);
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
	remove_dir(cg->freezer);
	remove_dir(cg->pids);
	remove_dir(cg->mem);
	cg->made = false;
}

int sub_cgroup_join_of(pid_t pid)
{
	static const char *const ctrls[] = { "memory", "pids", "freezer" };
	char rel[PATH_MAX], path[PATH_MAX + 64];
	int r;

	if (unified_mode()) {
		if ((r = cgroup_path_of(pid, "", rel, sizeof(rel))) < 0)
			return r;
		snprintf(path, sizeof(path), "/sys/fs/cgroup%s/cgroup.procs", rel);
		return sub_write_file(path, "0");
	}
	for (size_t i = 0; i < sizeof(ctrls) / sizeof(ctrls[0]); i++) {
		if ((r = cgroup_path_of(pid, ctrls[i], rel, sizeof(rel))) < 0)
			return r;
		snprintf(path, sizeof(path), "/sys/fs/cgroup/%s%s/cgroup.procs", ctrls[i], rel);
		if ((r = sub_write_file(path, "0")) < 0)
			return r;
	}
	return 0;
}
