/* bench_host.c — what the benchmarks read of the host (bench_host.h). */
#include "bench_host.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t bench_host_cpu_ns(void)
{
	unsigned long long v = 0;
	FILE *f = fopen("/sys/fs/cgroup/cpuacct/cpuacct.usage", "r");
	if (f) {
		if (fscanf(f, "%llu", &v) != 1)
			v = 0;
		fclose(f);
		return v;
	}
	char key[64];
	if ((f = fopen("/sys/fs/cgroup/cpu.stat", "r")) == NULL)
		return 0;
	while (fscanf(f, "%63s %llu", key, &v) == 2)
		if (strcmp(key, "usage_usec") == 0) {
			fclose(f);
			return v * 1000u;
		}
	fclose(f);
	return 0;
}

/* ---- CPU by process name ---- */

#define BYNAME_MAX 8192

struct thread_cpu {
	int pid, tid;
	char comm[16];
	uint64_t ns;
};
static struct thread_cpu byname[2][BYNAME_MAX];
static int nbyname[2];

static int by_tid(const void *a, const void *b)
{
	const struct thread_cpu *x = a, *y = b;
	return (x->tid > y->tid) - (x->tid < y->tid);
}

/* Every thread's run time (schedstat's first field), with its process's name. */
static int threads_read(int slot)
{
	int n = 0;
	DIR *d = opendir("/proc");
	struct dirent *e;
	while (d && (e = readdir(d)) && n < BYNAME_MAX) {
		int pid = atoi(e->d_name);
		if (pid <= 0)
			continue;
		char p[64], comm[16] = "";
		snprintf(p, sizeof p, "/proc/%d/comm", pid);
		FILE *f = fopen(p, "r");
		if (!f)
			continue;
		if (!fgets(comm, sizeof comm, f))
			comm[0] = 0;
		fclose(f);
		comm[strcspn(comm, "\n")] = 0;
		snprintf(p, sizeof p, "/proc/%d/task", pid);
		DIR *t = opendir(p);
		struct dirent *te;
		while (t && (te = readdir(t)) && n < BYNAME_MAX) {
			int tid = atoi(te->d_name);
			if (tid <= 0)
				continue;
			char q[96];
			unsigned long long ns;
			snprintf(q, sizeof q, "/proc/%d/task/%d/schedstat", pid, tid);
			FILE *g = fopen(q, "r");
			if (!g)
				continue;
			if (fscanf(g, "%llu", &ns) == 1) {
				byname[slot][n].pid = pid;
				byname[slot][n].tid = tid;
				snprintf(byname[slot][n].comm, sizeof byname[slot][n].comm, "%s", comm);
				byname[slot][n].ns = ns;
				n++;
			}
			fclose(g);
		}
		if (t)
			closedir(t);
	}
	if (d)
		closedir(d);
	nbyname[slot] = n;
	return n;
}

void bench_cpu_byname_start(void)
{
	threads_read(0);
	qsort(byname[0], (size_t)nbyname[0], sizeof byname[0][0], by_tid);
}

void bench_cpu_byname_print(FILE *out, int per)
{
	threads_read(1);
	struct {
		char comm[16];
		uint64_t ns;
	} sum[256];
	int ns = 0;
	uint64_t total = 0;
	for (int i = 0; i < nbyname[1]; i++) {
		const struct thread_cpu *was =
		    bsearch(&byname[1][i], byname[0], (size_t)nbyname[0], sizeof byname[0][0], by_tid);
		uint64_t before = was && was->pid == byname[1][i].pid ? was->ns : 0;
		uint64_t d = byname[1][i].ns > before ? byname[1][i].ns - before : 0;
		if (!d)
			continue;
		int k = 0;
		while (k < ns && strcmp(sum[k].comm, byname[1][i].comm) != 0)
			k++;
		if (k == ns) {
			if (ns == 256)
				continue;
			snprintf(sum[ns].comm, sizeof sum[ns].comm, "%s", byname[1][i].comm);
			sum[ns++].ns = 0;
		}
		sum[k].ns += d;
		total += d;
	}
	fprintf(out, "cpu by process name (threads alive at the end; ms per unit of %d):", per);
	for (int pass = 0; pass < ns; pass++) {
		int best = -1;
		for (int k = 0; k < ns; k++)
			if (sum[k].ns && (best < 0 || sum[k].ns > sum[best].ns))
				best = k;
		if (best < 0)
			break;
		fprintf(out, " %s %.3f", sum[best].comm, (double)sum[best].ns / 1e6 / per);
		sum[best].ns = 0;
	}
	fprintf(out, " (all %.3f)\n", (double)total / 1e6 / per);
}
