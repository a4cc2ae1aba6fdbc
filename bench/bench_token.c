/*
 * bench-token — what a capability check costs.
 *
 * In one run, on the same token bytes:
 *   raw   crypto_sign_verify_detached over the token's PAE message (the floor),
 *   cold  spaced_cap_verify without a cache (parse + key lookup + claims + signature + times),
 *   hit   spaced_cap_verify with a warm verification cache.
 * Batches of each are interleaved over several rounds; the figure for each is
 * the median of its per-batch means. Last line: JSON.
 * Targets (issue 2): cold_ratio = cold/raw ≤ 1.15, hit_speedup = cold/hit ≥ 20.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "cap.h"
#include "spaced_error.h"
#include "keyring.h"
#include "paseto.h"
#include "signer.h"
#include "util.h"
#include "vcache.h"

#define ROUNDS 15

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static volatile int sink;

int main(int argc, char **argv)
{
	int batch = argc > 1 ? atoi(argv[1]) : 400;
	if (sodium_init() < 0 || batch <= 0)
		return 1;
	struct spaced_secret_key *sk;
	struct spaced_public_key pk;
	struct spaced_keyring *kr;
	struct spaced_vcache *cache;
	if (spaced_secret_key_generate(&sk) < 0 || spaced_keyring_new(&kr) < 0 ||
	    spaced_vcache_new(&cache, 4096) < 0)
		return 1;
	spaced_secret_key_public(sk, &pk);
	int64_t now = spaced_now();
	spaced_keyring_add(kr, &pk, now - 3600, now + 3600);

	struct spaced_cap cap;
	memset(&cap, 0, sizeof cap);
	spaced_identity_set(&cap.id, "sbx-4f1c2a9e7d3b4c5a", 8, "worker-b.eu-west-1", "process",
	                    "act-20261130-0002", NULL);
	cap.purposes = SPACED_PURPOSE_FS_READ | SPACED_PURPOSE_FS_WRITE | SPACED_PURPOSE_EXEC;
	cap.cls = SPACED_CLASS_CONTROL;
	cap.iat = cap.nbf = now;
	cap.exp = now + SPACED_CAP_LIFETIME;
	strcpy(cap.jti, "Zk3nq0V1bW9xYzR0c2Q2Zw");
	char *token;
	if (spaced_cap_issue(sk, &cap, &token) < 0)
		return 1;
	size_t tlen = strlen(token);

	/* The exact message and signature the cold path verifies. */
	struct spaced_paseto t = {0};
	struct spaced_buf m2;
	spaced_buf_init(&m2, 1 << 16);
	const char *ia = spaced_cap_implicit(SPACED_CLASS_CONTROL);
	static const uint8_t header[] = SPACED_PASETO_HEADER;
	if (spaced_paseto_parse(&t, token, tlen) < 0)
		return 1;
	const uint8_t *pieces[4] = {header, t.msg, t.footer, (const uint8_t *)ia};
	size_t lens[4] = {SPACED_PASETO_HEADER_LEN, t.msg_len, t.footer_len, strlen(ia)};
	spaced_paseto_pae(&m2, 4, pieces, lens);

	struct spaced_cap out;
	if (crypto_sign_verify_detached(t.sig, m2.data, m2.len, pk.pk) != 0 ||
	    spaced_cap_verify(kr, NULL, token, tlen, SPACED_CLASS_CONTROL, now, &out) != 0 ||
	    spaced_cap_verify(kr, cache, token, tlen, SPACED_CLASS_CONTROL, now, &out) != 0) {
		fprintf(stderr, "bench-token: the token does not verify\n");
		return 1;
	}

	double raw[ROUNDS], cold[ROUNDS], hit[ROUNDS];
	int hit_batch = batch * 20;
	for (int r = 0; r < ROUNDS; r++) {
		uint64_t t0 = spaced_mono_ns();
		for (int i = 0; i < batch; i++)
			sink += crypto_sign_verify_detached(t.sig, m2.data, m2.len, pk.pk);
		uint64_t t1 = spaced_mono_ns();
		for (int i = 0; i < batch; i++)
			sink += spaced_cap_verify(kr, NULL, token, tlen, SPACED_CLASS_CONTROL, now, &out);
		uint64_t t2 = spaced_mono_ns();
		for (int i = 0; i < hit_batch; i++)
			sink += spaced_cap_verify(kr, cache, token, tlen, SPACED_CLASS_CONTROL, now, &out);
		uint64_t t3 = spaced_mono_ns();
		raw[r] = (double)(t1 - t0) / batch / 1000.0;
		cold[r] = (double)(t2 - t1) / batch / 1000.0;
		hit[r] = (double)(t3 - t2) / hit_batch / 1000.0;
	}
	if (sink != 0) {
		fprintf(stderr, "bench-token: a verification failed during the run\n");
		return 1;
	}
	double raw_us = median(raw, ROUNDS), cold_us = median(cold, ROUNDS), hit_us = median(hit, ROUNDS);
	struct spaced_vcache_stats st;
	spaced_vcache_stats(cache, &st);
	printf("token: %zu bytes (claims %zu, footer %zu); %d rounds of %d cold / %d raw / %d hit\n", tlen,
	       t.msg_len, t.footer_len, ROUNDS, batch, batch, hit_batch);
	printf("raw crypto_sign_verify_detached  %8.2f us\n", raw_us);
	printf("cold spaced_cap_verify           %8.2f us  (ratio %.3f, target <= 1.15)\n", cold_us,
	       cold_us / raw_us);
	printf("cache hit spaced_cap_verify      %8.3f us  (speedup %.1fx, target >= 20)\n", hit_us,
	       cold_us / hit_us);
	printf("{\"cold_us\":%.2f, \"raw_us\":%.2f, \"cold_ratio\":%.3f, \"hit_us\":%.3f, \"hit_speedup\":%.1f}\n",
	       cold_us, raw_us, cold_us / raw_us, hit_us, cold_us / hit_us);
	spaced_paseto_clear(&t);
	spaced_buf_free(&m2);
	free(token);
	spaced_vcache_free(cache);
	spaced_keyring_free(kr);
	spaced_secret_key_free(sk);
	return 0;
}
