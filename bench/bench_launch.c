/*
 * bench_launch.c — create-to-ready of the process substrate, against
 * `bwrap --unshare-all --die-with-parent --ro-bind / / true` run interleaved
 * under the same machine load. Also pause, thaw, snapshot and destroy times.
 * Needs root. Prints a table; the last line is JSON.
 *
 *   bench-launch [ROUNDS] [GUEST]
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spaced_error.h"
#include "identity.h"
#include "substrate.h"
#include "util.h"

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static double pct(uint64_t *v, int n, double p)
{
	qsort(v, (size_t)n, sizeof(v[0]), cmp_u64);
	return (double)v[(int)((n - 1) * p)] / 1e6;
}

static uint64_t run_bwrap(void)
{
	uint64_t t0 = spaced_mono_ns();
	pid_t pid = fork();
	int st;

	if (pid == 0) {
		execlp("bwrap", "bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true",
		       (char *)NULL);
		_exit(127);
	}
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return 0;
	return spaced_mono_ns() - t0;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 30;
	const char *guest = argc > 2 ? argv[2] : SPACED_GUEST_BIN;
	uint64_t *ready, *bw, *destroy, *pause_ns, *thaw_ns, *snap_ns, *claim;
	int nclaim = 0;
	bool claim_ok;
	char base[] = "/tmp/spaced-bench-XXXXXX", state[128], snap[160], why[512] = "";
	struct spaced_identity id;
	int nb = 0;

	if (rounds < 1 || rounds > 10000)
		return 2;
	if (access(guest, X_OK) != 0) {
		fprintf(stderr, "bench-launch: no guest at %s (build first)\n", guest);
		return 1;
	}
	if (getuid() != 0) {
		fprintf(stderr, "bench-launch: needs root\n");
		return 77;
	}
	ready = calloc((size_t)rounds, sizeof(uint64_t));
	bw = calloc((size_t)rounds, sizeof(uint64_t));
	destroy = calloc((size_t)rounds, sizeof(uint64_t));
	pause_ns = calloc((size_t)rounds, sizeof(uint64_t));
	thaw_ns = calloc((size_t)rounds, sizeof(uint64_t));
	snap_ns = calloc((size_t)rounds, sizeof(uint64_t));
	claim = calloc((size_t)rounds, sizeof(uint64_t));
	claim_ok = true;
	if (!claim || !ready || !bw || !destroy || !pause_ns || !thaw_ns || !snap_ns || mkdtemp(base) == NULL)
		return 1;
	for (int i = 0; i < rounds; i++) {
		struct spaced_sub_config cfg;
		struct spaced_sub *s = NULL;
		uint64_t t0, t1;
		int r;

		spaced_identity_set(&id, "bench", (uint64_t)i + 1, "w1", "process", "a1", NULL);
		snprintf(state, sizeof(state), "%s/x%d", base, i);
		memset(&cfg, 0, sizeof(cfg));
		cfg.state_dir = state;
		cfg.guest_path = guest;
		cfg.identity = &id;
		cfg.uid_base = SPACED_SUB_UID_BASE_DEFAULT;
		cfg.memory_bytes = 256u << 20;
		cfg.pids_max = 256;
		cfg.log_fd = -1;
		t0 = spaced_mono_ns();
		r = spaced_sub_create(&cfg, &s, why, sizeof(why));
		if (r == 0)
			r = spaced_sub_wait_ready(s, 10000);
		t1 = spaced_mono_ns();
		if (r < 0) {
			fprintf(stderr, "bench-launch: %s: %s\n", spaced_strerror(r), why);
			spaced_sub_destroy(s, false, NULL);
			return 1;
		}
		ready[i] = t1 - t0;
		t0 = spaced_mono_ns();
		r = spaced_sub_pause(s);
		pause_ns[i] = spaced_mono_ns() - t0;
		snprintf(snap, sizeof(snap), "%s/snap%d", base, i);
		t0 = spaced_mono_ns();
		if (r == 0)
			r = spaced_sub_snapshot(s, snap, why, sizeof(why));
		snap_ns[i] = spaced_mono_ns() - t0;
		t0 = spaced_mono_ns();
		if (r == 0)
			r = spaced_sub_thaw(s);
		thaw_ns[i] = spaced_mono_ns() - t0;
		if (r < 0) {
			fprintf(stderr, "bench-launch: pause/snapshot/thaw: %s %s\n", spaced_strerror(r), why);
			return 1;
		}
		t0 = spaced_mono_ns();
		spaced_sub_destroy(s, false, NULL);
		destroy[i] = spaced_mono_ns() - t0;
		(void)spaced_sub_rm_rf(snap);
		(void)spaced_sub_rm_rf(state);
		if (claim_ok) {
			/* warm pool: started without identity, claimed later */
			cfg.identity = NULL;
			r = spaced_sub_create(&cfg, &s, why, sizeof(why));
			if (r == 0)
				r = spaced_sub_wait_ready(s, 300); /* drains WAITING: no READY before identity */
			if (r == SPACED_ETIMEDOUT) {
				t0 = spaced_mono_ns();
				r = spaced_sub_set_identity(s, &id);
				if (r == 0)
					r = spaced_sub_wait_ready(s, 10000);
				if (r == 0)
					claim[nclaim++] = spaced_mono_ns() - t0;
			}
			spaced_sub_destroy(s, false, NULL);
			(void)spaced_sub_rm_rf(state);
		}
		bw[nb] = run_bwrap();
		if (bw[nb] > 0)
			nb++;
	}
	(void)spaced_sub_rm_rf(base);
	{
		double r50 = pct(ready, rounds, 0.5), r90 = pct(ready, rounds, 0.9), rmin = pct(ready, rounds, 0);
		double b50 = nb ? pct(bw, nb, 0.5) : 0, b90 = nb ? pct(bw, nb, 0.9) : 0;
		double d50 = pct(destroy, rounds, 0.5), p50 = pct(pause_ns, rounds, 0.5);
		double t50 = pct(thaw_ns, rounds, 0.5), s50 = pct(snap_ns, rounds, 0.5);

		printf("guest: %s, %d rounds, interleaved with bwrap\n", guest, rounds);
		printf("create-to-ready       p50 %7.2f ms  p90 %7.2f ms  min %7.2f ms  (target p50 <= 30 ms)\n",
		       r50, r90, rmin);
		printf("bwrap --unshare-all   p50 %7.2f ms  p90 %7.2f ms  (%d runs)\n", b50, b90, nb);
		printf("ratio p50             %7.2f        (target <= 2)\n", b50 > 0 ? r50 / b50 : 0);
		if (nclaim > 0)
			printf("warm pool claim-to-ready p50 %7.3f ms  p90 %7.3f ms (IDENTITY -> READY)\n",
			       pct(claim, nclaim, 0.5), pct(claim, nclaim, 0.9));
		printf("pause p50 %.2f ms, snapshot p50 %.2f ms, thaw p50 %.2f ms, destroy p50 %.2f ms\n", p50,
		       s50, t50, d50);
		printf("{\"ready_p50_ms\":%.2f, \"ready_p90_ms\":%.2f, \"bwrap_p50_ms\":%.2f, \"ratio\":%.2f, "
		       "\"claim_p50_ms\":%.3f, \"pause_ms\":%.2f, \"snapshot_ms\":%.2f, \"thaw_ms\":%.2f, "
		       "\"destroy_ms\":%.2f}\n",
		       r50, r90, b50, b50 > 0 ? r50 / b50 : 0, nclaim ? pct(claim, nclaim, 0.5) : -1.0, p50, s50,
		       t50, d50);
	}
	return 0;
}
