/*
 * bench-guest — what the guest agent costs: idle memory, request round trips,
 * streamed file throughput and process start, measured against the real
 * spaced-guest binary on a temporary root over a Unix socket.
 *
 *   bench-guest [ROUNDS]
 *
 * Round trips and exec starts are medians of single requests; throughputs are
 * medians over 8 MiB transfers. Resident sizes come from /proc/PID/status
 * (idle: right after READY; after: once the workload ran). Last line: JSON.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sodium.h>

#include "spaced_error.h"
#include "guest_client.h"
#include "util.h"

#define IDENT "sandbox=bench;generation=1;worker=w1;substrate=process;activation=a1;pod_uid="

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

static double median_us(uint64_t *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_u64);
	return (n % 2 ? (double)v[n / 2] : (double)(v[n / 2 - 1] + v[n / 2]) / 2) / 1000.0;
}

static long status_kb(pid_t pid, const char *key)
{
	char p[64], line[256];
	snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
	FILE *f = fopen(p, "r");
	long v = -1;
	while (f != NULL && fgets(line, sizeof line, f) != NULL)
		if (strncmp(line, key, strlen(key)) == 0)
			v = atol(line + strlen(key) + 1);
	if (f)
		fclose(f);
	return v;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 2000;
	if (rounds < 10 || sodium_init() < 0)
		return 1;
	char dir[] = "/tmp/bench-guest-XXXXXX";
	if (mkdtemp(dir) == NULL)
		return 1;
	char root[64], sock[64];
	snprintf(root, sizeof root, "%s/root", dir);
	snprintf(sock, sizeof sock, "%s/g.sock", dir);
	mkdir(root, 0755);
	int pfd[2];
	if (pipe(pfd) < 0)
		return 1;
	pid_t pid = fork();
	if (pid == 0) {
		dup2(pfd[1], 1);
		close(pfd[0]);
		execl(SPACED_GUEST_BIN, "spaced-guest", "--root", root, "--identity", IDENT, "--listen",
		      sock, (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	char line[128];
	if (read(pfd[0], line, sizeof line) <= 0)
		return 1;
	long idle_rss = status_kb(pid, "VmRSS:");

	struct spaced_guest_client *c;
	if (spaced_guest_client_connect(sock, &c) < 0)
		return 1;
	uint64_t *t = calloc((size_t)rounds, sizeof *t);
	struct spaced_identity id;
	for (int i = 0; i < rounds; i++) {
		uint64_t t0 = spaced_mono_ns();
		if (spaced_guest_hello(c, &id) < 0)
			return 1;
		t[i] = spaced_mono_ns() - t0;
	}
	double hello_us = median_us(t, rounds);

	spaced_guest_fs_write(c, "small.txt", "hello", 5, 0644, 0);
	struct spaced_guest_stat st;
	for (int i = 0; i < rounds; i++) {
		uint64_t t0 = spaced_mono_ns();
		if (spaced_guest_fs_stat(c, "small.txt", &st) < 0)
			return 1;
		t[i] = spaced_mono_ns() - t0;
	}
	double stat_us = median_us(t, rounds);

	const size_t big = 8u << 20;
	uint8_t *data = malloc(big);
	randombytes_buf(data, big);
	enum { XFER = 9 };
	uint64_t wt[XFER], rt[XFER];
	struct spaced_buf b;
	spaced_buf_init(&b, big + 1);
	for (int i = 0; i < XFER; i++) {
		uint64_t t0 = spaced_mono_ns();
		if (spaced_guest_fs_write(c, "big.bin", data, big, 0644, 0) < 0)
			return 1;
		wt[i] = spaced_mono_ns() - t0;
		b.len = 0;
		t0 = spaced_mono_ns();
		if (spaced_guest_fs_read(c, "big.bin", 0, UINT64_MAX, &b) < 0 || b.len != big)
			return 1;
		rt[i] = spaced_mono_ns() - t0;
	}
	double w_ms = median_us(wt, XFER) / 1000.0, r_ms = median_us(rt, XFER) / 1000.0;
	double w_mbs = 8.0 / (w_ms / 1000.0), r_mbs = 8.0 / (r_ms / 1000.0);

	int execs = rounds / 20 < 20 ? 20 : rounds / 20;
	const char *targv[] = {"true", NULL};
	struct spaced_guest_exec_req req = {targv, NULL, NULL, 0, 0};
	struct spaced_guest_exit x;
	for (int i = 0; i < execs; i++) {
		uint64_t t0 = spaced_mono_ns();
		if (spaced_guest_exec(c, &req, NULL, 0, NULL, NULL, &x) < 0 || x.code != 0)
			return 1;
		t[i] = spaced_mono_ns() - t0;
	}
	double exec_us = median_us(t, execs);
	long after_rss = status_kb(pid, "VmRSS:"), hwm = status_kb(pid, "VmHWM:");

	printf("guest idle RSS           %ld kB\n", idle_rss);
	printf("guest RSS after workload %ld kB (peak %ld kB)\n", after_rss, hwm);
	printf("HELLO round trip         %.1f us (median of %d)\n", hello_us, rounds);
	printf("FS_STAT round trip       %.1f us (median of %d)\n", stat_us, rounds);
	printf("FS_WRITE 8 MiB           %.1f ms = %.0f MB/s (median of %d, fsync included)\n", w_ms,
	       w_mbs, XFER);
	printf("FS_READ 8 MiB            %.1f ms = %.0f MB/s (median of %d)\n", r_ms, r_mbs, XFER);
	printf("EXEC true                %.1f us (median of %d)\n", exec_us, execs);
	printf("{\"idle_rss_kb\":%ld,\"rss_after_kb\":%ld,\"peak_rss_kb\":%ld,\"hello_us\":%.1f,"
	       "\"stat_us\":%.1f,\"write_8m_ms\":%.1f,\"read_8m_ms\":%.1f,\"exec_us\":%.1f}\n",
	       idle_rss, after_rss, hwm, hello_us, stat_us, w_ms, r_ms, exec_us);

	spaced_buf_free(&b);
	free(data);
	free(t);
	spaced_guest_client_free(c);
	kill(pid, SIGTERM);
	waitpid(pid, NULL, 0);
	char cmd[96];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : 1;
}
