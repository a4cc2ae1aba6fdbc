/* bench_host.c — what the benchmarks read of the host (bench_host.h). */
#include "bench_host.h"

#include <stdio.h>
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
