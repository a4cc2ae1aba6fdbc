/*
 * bench_pidref.c — the cost of the B1/B2 checks a bridge makes on every new
 * connection (B3): spaced_peer_verify_listener (unix_diag + /proc scan),
 * spaced_peer_connect_listener (the same plus connect and SO_PEERPIDFD),
 * spaced_peer_verify_caller, with and without hashing the executable.
 * Prints a table; the last line is JSON.
 *
 *   bench-pidref [ROUNDS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "spaced_error.h"
#include "pidref.h"
#include "util.h"

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static double p50_us(uint64_t *v, int n)
{
	qsort(v, (size_t)n, sizeof(v[0]), cmp_u64);
	return (double)v[n / 2] / 1e3;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 2000;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct spaced_expected_listener exp;
	struct spaced_expected_caller ec;
	struct spaced_pidref self;
	char dir[] = "/tmp/spaced-bench-pidref-XXXXXX", why[256] = "";
	uint64_t *t;
	double l_plain, l_hash, c_plain, v_caller;
	int lfd, r;

	if (rounds < 10 || mkdtemp(dir) == NULL)
		return 2;
	t = calloc((size_t)rounds, sizeof(uint64_t));
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/l.sock", dir);
	lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	if (t == NULL || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 4096) < 0)
		return 1;
	if (spaced_pidref_from_pid(&self, getpid()) < 0)
		return 1;
	memset(&exp, 0, sizeof(exp));
	exp.owner_uid = getuid();
	exp.pid = getpid();
	exp.start_time = self.start_time;
	exp.check_exe = true;
	if (spaced_exe_id_of_path("/proc/self/exe", false, &exp.exe) < 0)
		return 1;

	for (int i = 0; i < rounds; i++) {
		uint64_t t0 = spaced_mono_ns();

		r = spaced_peer_verify_listener(sa.sun_path, &exp, why, sizeof(why));
		t[i] = spaced_mono_ns() - t0;
		if (r < 0) {
			fprintf(stderr, "verify_listener: %s\n", why);
			return 1;
		}
	}
	l_plain = p50_us(t, rounds);

	for (int i = 0; i < rounds; i++) {
		uint64_t t0 = spaced_mono_ns();
		int fd = -1, c;

		r = spaced_peer_connect_listener(sa.sun_path, &exp, &fd, why, sizeof(why));
		t[i] = spaced_mono_ns() - t0;
		if (r < 0) {
			fprintf(stderr, "connect_listener: %s\n", why);
			return 1;
		}
		/* the caller side on the accepted end */
		c = accept(lfd, NULL, NULL);
		memset(&ec, 0, sizeof(ec));
		ec.uid = getuid();
		ec.pid = getpid();
		ec.start_time = self.start_time;
		ec.check_exe = true;
		ec.exe = exp.exe;
		{
			uint64_t t1 = spaced_mono_ns();

			r = spaced_peer_verify_caller(c, &ec, NULL, why, sizeof(why));
			t[i] = (t[i] & 0xffffffffu) | ((spaced_mono_ns() - t1) << 32);
		}
		if (r < 0) {
			fprintf(stderr, "verify_caller: %s\n", why);
			return 1;
		}
		close(c);
		close(fd);
	}
	{
		uint64_t *a = calloc((size_t)rounds, sizeof(uint64_t)), *b = calloc((size_t)rounds, sizeof(uint64_t));

		if (a == NULL || b == NULL)
			return 1;
		for (int i = 0; i < rounds; i++) {
			a[i] = t[i] & 0xffffffffu;
			b[i] = t[i] >> 32;
		}
		c_plain = p50_us(a, rounds);
		v_caller = p50_us(b, rounds);
		free(a);
		free(b);
	}

	if (spaced_exe_id_of_path("/proc/self/exe", true, &exp.exe) < 0)
		return 1;
	for (int i = 0; i < rounds / 10; i++) {
		uint64_t t0 = spaced_mono_ns();

		r = spaced_peer_verify_listener(sa.sun_path, &exp, why, sizeof(why));
		t[i] = spaced_mono_ns() - t0;
		if (r < 0) {
			fprintf(stderr, "verify_listener (hash): %s\n", why);
			return 1;
		}
	}
	l_hash = p50_us(t, rounds / 10);

	printf("verify_listener (exe dev/ino)          p50 %8.1f us\n", l_plain);
	printf("verify_listener (exe dev/ino + BLAKE2b) p50 %8.1f us\n", l_hash);
	printf("connect_listener (verify + connect + SO_PEERPIDFD) p50 %8.1f us\n", c_plain);
	printf("verify_caller (SO_PEERCRED + SO_PEERPIDFD + exe)   p50 %8.1f us\n", v_caller);
	printf("{\"listener_us\":%.1f, \"listener_hash_us\":%.1f, \"connect_listener_us\":%.1f, \"caller_us\":%.1f}\n",
	       l_plain, l_hash, c_plain, v_caller);
	unlink(sa.sun_path);
	rmdir(dir);
	spaced_pidref_done(&self);
	return 0;
}
