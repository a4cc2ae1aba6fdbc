/*
 * bench_host.h — what the benchmarks read of the host they run on.
 */
#ifndef SPACED_BENCH_HOST_H
#define SPACED_BENCH_HOST_H

#include <stdint.h>
#include <stdio.h>

/* The CPU time every process of this host has used so far, in ns: the root
 * cgroup's (v1 cpuacct.usage, or v2 cpu.stat usage_usec); 0 when neither is
 * readable. Differences over a window are what the window cost the host. */
uint64_t bench_host_cpu_ns(void);

/* The CPU time of every thread of the host, by its process's name, over a
 * window: _start reads it, _print reads it again and prints each name's
 * difference divided by per (ms), the largest first. Threads that ended in
 * the window are not counted (a diagnostic, not a figure). */
void bench_cpu_byname_start(void);
void bench_cpu_byname_print(FILE *out, int per);

#endif
