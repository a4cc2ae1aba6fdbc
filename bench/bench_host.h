/*
 * bench_host.h — what the benchmarks read of the host they run on.
 */
#ifndef SPACED_BENCH_HOST_H
#define SPACED_BENCH_HOST_H

#include <stdint.h>

/* The CPU time every process of this host has used so far, in ns: the root
 * cgroup's (v1 cpuacct.usage, or v2 cpu.stat usage_usec); 0 when neither is
 * readable. Differences over a window are what the window cost the host. */
uint64_t bench_host_cpu_ns(void);

#endif
