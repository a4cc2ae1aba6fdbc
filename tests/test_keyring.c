/*
 * test_keyring.c — verification keys and the verification cache (C2, T1, R1,
 * R3): bundles installed atomically and only when valid, lookups that fail
 * closed, reloads under concurrent lookups, and a cache that skips the
 * signature check and nothing else.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "cap.h"
#include "compare.h"
#include "spaced_error.h"
#include "keyring.h"
#include "paserk.h"
#include "signer.h"
#include "util.h"
#include "vcache.h"

#define NOW INT64_C(1796083200) /* 2026-12-01T00:00:00Z */

/* The public key, k4.public and k4.pid of the deterministic key number i. */
struct test_key {
	struct spaced_secret_key *sk;
	struct spaced_public_key pk;
	char pub[SPACED_PASERK_PUBLIC_LEN + 1];
	char kid[SPACED_PASERK_PID_LEN + 1];
};

static void key_make(struct test_key *k, unsigned i)
{
	uint8_t seed[32] = {0};
	memcpy(seed, &i, sizeof i);
	seed[31] = 0x5c;
	cr_assert_eq(spaced_secret_key_from_bytes(&k->sk, seed, sizeof seed), 0);
	spaced_secret_key_public(k->sk, &k->pk);
	spaced_paserk_public_encode(&k->pk, k->pub);
	spaced_paserk_pid(&k->pk, k->kid);
}

static void key_drop(struct test_key *k)
{
	spaced_secret_key_free(k->sk);
	k->sk = NULL;
}

/* A bundle text: version and the given keys, each valid around NOW. */
static char *bundle(uint64_t version, const struct test_key *const *keys, size_t n)
{
	json_t *arr = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:s}", "key", keys[i]->pub, "kid", keys[i]->kid,
		                                     "not_before", "2026-11-01T00:00:00Z", "not_after",
		                                     "2027-01-01T00:00:00Z"));
	json_t *o = json_pack("{s:I, s:o}", "version", (json_int_t)version, "keys", arr);
	char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(o);
	cr_assert_not_null(s);
	return s;
}

static int install(struct spaced_keyring *kr, const char *json)
{
	return spaced_keyring_install_bundle(kr, json, strlen(json));
}

static int lookup(const struct spaced_keyring *kr, const struct test_key *k, int64_t now)
{
	struct spaced_public_key pk;
	int r = spaced_keyring_lookup(kr, k->kid, now, &pk, NULL);
	if (r == 0)
		cr_assert_arr_eq(pk.pk, k->pk.pk, 32, "lookup returned another key");
	return r;
}

/* ---- keyring ---- */

Test(keyring, install_and_lookup)
{
	struct test_key a, b;
	key_make(&a, 1);
	key_make(&b, 2);
	struct spaced_keyring *kr;
	cr_assert_eq(spaced_keyring_new(&kr), 0);
	cr_assert_eq(spaced_keyring_count(kr), 0);
	cr_assert_eq(spaced_keyring_version(kr), 0);
	uint64_t e0 = spaced_keyring_epoch(kr);
	cr_assert_eq(lookup(kr, &a, NOW), SPACED_EUNKNOWNKEY, "empty keyring");
	const struct test_key *both[] = {&a, &b};
	char *j = bundle(3, both, 2);
	cr_assert_eq(install(kr, j), 0);
	cr_assert_eq(spaced_keyring_count(kr), 2);
	cr_assert_eq(spaced_keyring_version(kr), 3);
	cr_assert_gt(spaced_keyring_epoch(kr), e0);
	cr_assert_eq(lookup(kr, &a, NOW), 0);
	cr_assert_eq(lookup(kr, &b, NOW), 0);
	struct spaced_public_key pk;
	uint64_t epoch = 0;
	cr_assert_eq(spaced_keyring_lookup(kr, a.kid, NOW, &pk, &epoch), 0);
	cr_assert_eq(epoch, spaced_keyring_epoch(kr));
	/* the same version again is accepted (not lower than the installed one) */
	uint64_t e1 = spaced_keyring_epoch(kr);
	cr_assert_eq(install(kr, j), 0);
	cr_assert_gt(spaced_keyring_epoch(kr), e1);
	free(j);
	spaced_keyring_free(kr);
	spaced_keyring_free(NULL);
	key_drop(&a);
	key_drop(&b);
}

Test(keyring, lookup_fails_closed)
{
	struct test_key a, b;
	key_make(&a, 1);
	key_make(&b, 2);
	struct spaced_keyring *kr;
	cr_assert_eq(spaced_keyring_new(&kr), 0);
	const struct test_key *one[] = {&a};
	char *j = bundle(1, one, 1);
	cr_assert_eq(install(kr, j), 0);
	int64_t nb, na;
	cr_assert_eq(spaced_time_parse("2026-11-01T00:00:00Z", 20, &nb), 0);
	cr_assert_eq(spaced_time_parse("2027-01-01T00:00:00Z", 20, &na), 0);
	cr_assert_eq(lookup(kr, &b, NOW), SPACED_EUNKNOWNKEY, "unknown kid");
	cr_assert_eq(lookup(kr, &a, nb - 1), SPACED_EUNKNOWNKEY, "before not_before");
	cr_assert_eq(lookup(kr, &a, nb), 0);
	cr_assert_eq(lookup(kr, &a, na), 0);
	cr_assert_eq(lookup(kr, &a, na + 1), SPACED_EUNKNOWNKEY, "after not_after");
	struct spaced_public_key pk;
	cr_assert_eq(spaced_keyring_lookup(kr, NULL, NOW, &pk, NULL), SPACED_EUNKNOWNKEY);
	cr_assert_eq(spaced_keyring_lookup(kr, "", NOW, &pk, NULL), SPACED_EUNKNOWNKEY);
	cr_assert_eq(spaced_keyring_lookup(kr, a.pub, NOW, &pk, NULL), SPACED_EUNKNOWNKEY, "a key is not a kid");
	char prefix[SPACED_PASERK_PID_LEN + 1];
	snprintf(prefix, sizeof prefix, "%.*s", SPACED_PASERK_PID_LEN - 1, a.kid);
	cr_assert_eq(spaced_keyring_lookup(kr, prefix, NOW, &pk, NULL), SPACED_EUNKNOWNKEY, "kid prefix");
	free(j);
	spaced_keyring_free(kr);
	key_drop(&a);
	key_drop(&b);
}

Test(keyring, add_single_keys)
{
	struct test_key a;
	key_make(&a, 1);
	struct spaced_keyring *kr;
	cr_assert_eq(spaced_keyring_new(&kr), 0);
	uint64_t e = spaced_keyring_epoch(kr);
	cr_assert_eq(spaced_keyring_add(kr, &a.pk, NOW + 10, NOW), SPACED_EINVAL, "window upside down");
	cr_assert_eq(spaced_keyring_epoch(kr), e);
	cr_assert_eq(spaced_keyring_add(kr, &a.pk, NOW, NOW + 10), 0);
	cr_assert_gt(spaced_keyring_epoch(kr), e);
	cr_assert_eq(lookup(kr, &a, NOW + 5), 0);
	for (size_t i = 1; i < SPACED_KEYRING_MAX_KEYS; i++)
		cr_assert_eq(spaced_keyring_add(kr, &a.pk, NOW, NOW + 10), 0);
	cr_assert_eq(spaced_keyring_add(kr, &a.pk, NOW, NOW + 10), SPACED_ETOOBIG);
	cr_assert_eq(spaced_keyring_count(kr), SPACED_KEYRING_MAX_KEYS);
	spaced_keyring_free(kr);
	key_drop(&a);
}

/* Any invalid bundle leaves the installed set, version and epoch untouched. */
Test(keyring, invalid_bundles_leave_previous_set)
{
	struct test_key a, b;
	key_make(&a, 1);
	key_make(&b, 2);
	struct spaced_keyring *kr;
	cr_assert_eq(spaced_keyring_new(&kr), 0);
	const struct test_key *one[] = {&a};
	char *good = bundle(5, one, 1);
	cr_assert_eq(install(kr, good), 0);
	uint64_t epoch = spaced_keyring_epoch(kr);

	struct spaced_secret_key *sk = a.sk;
	char secret[SPACED_PASERK_SECRET_LEN + 1];
	spaced_secret_key_to_paserk(sk, secret);
	char local[128];
	snprintf(local, sizeof local, "k4.local.%s", b.pub + 10);

	struct {
		const char *what;
		char *json;
		int err;
	} cases[16];
	size_t n = 0;
#define CASE(w, e, ...)                                                                  \
	do {                                                                             \
		cases[n].what = (w);                                                     \
		cr_assert_gt(asprintf(&cases[n].json, __VA_ARGS__), 0);                  \
		cases[n].err = (e);                                                      \
		n++;                                                                     \
	} while (0)
#define KEYFMT "{\"key\":\"%s\",\"not_before\":\"2026-11-01T00:00:00Z\",\"not_after\":\"2027-01-01T00:00:00Z\"%s}"
	CASE("not JSON", SPACED_EJSON, "{\"version\":6,\"keys\":[");
	CASE("not an object", SPACED_EJSON, "[6]");
	CASE("duplicate version", SPACED_EJSON, "{\"version\":6,\"version\":7,\"keys\":[" KEYFMT "]}", b.pub, "");
	CASE("duplicate key member", SPACED_EJSON,
	     "{\"version\":6,\"keys\":[{\"key\":\"%s\",\"key\":\"%s\",\"not_before\":\"2026-11-01T00:00:00Z\","
	     "\"not_after\":\"2027-01-01T00:00:00Z\"}]}",
	     b.pub, b.pub);
	CASE("k4.secret as key", SPACED_EKEYTYPE, "{\"version\":6,\"keys\":[" KEYFMT "]}", secret, "");
	CASE("k4.local as key", SPACED_EKEYTYPE, "{\"version\":6,\"keys\":[" KEYFMT "]}", local, "");
	char kidpart[128];
	snprintf(kidpart, sizeof kidpart, ",\"kid\":\"%s\"", a.kid);
	CASE("kid of another key", SPACED_EKEY, "{\"version\":6,\"keys\":[" KEYFMT "]}", b.pub, kidpart);
	CASE("not_after before not_before", SPACED_EINVAL,
	     "{\"version\":6,\"keys\":[{\"key\":\"%s\",\"not_before\":\"2027-01-01T00:00:00Z\","
	     "\"not_after\":\"2026-11-01T00:00:00Z\"}]}",
	     b.pub);
	CASE("bad time", SPACED_EINVAL,
	     "{\"version\":6,\"keys\":[{\"key\":\"%s\",\"not_before\":\"soon\",\"not_after\":\"2027-01-01T00:00:00Z\"}]}",
	     b.pub);
	CASE("unknown key member", SPACED_EJSON, "{\"version\":6,\"keys\":[" KEYFMT "]}", b.pub, ",\"comment\":\"x\"");
	CASE("unknown top member", SPACED_EJSON, "{\"version\":6,\"keys\":[],\"signed_by\":\"x\"}%s", "");
	CASE("version not an integer", SPACED_EJSON, "{\"version\":\"6\",\"keys\":[]}%s", "");
	CASE("negative version", SPACED_EJSON, "{\"version\":-6,\"keys\":[]}%s", "");
	CASE("keys not an array", SPACED_EJSON, "{\"version\":6,\"keys\":{}}%s", "");
	/* a valid second key after an invalid first one is not installed either */
	CASE("one bad key among good ones", SPACED_EKEY,
	     "{\"version\":6,\"keys\":[" KEYFMT "," KEYFMT "]}", b.pub, "", "k4.public.short", "");
#undef CASE
#undef KEYFMT
	for (size_t i = 0; i < n; i++) {
		int r = install(kr, cases[i].json);
		cr_expect_eq(r, cases[i].err, "%s: got %s, expected %s", cases[i].what, spaced_errname(r),
		             spaced_errname(cases[i].err));
		cr_assert_lt(r, 0, "%s accepted", cases[i].what);
		cr_assert_eq(spaced_keyring_version(kr), 5, "%s", cases[i].what);
		cr_assert_eq(spaced_keyring_count(kr), 1, "%s", cases[i].what);
		cr_assert_eq(spaced_keyring_epoch(kr), epoch, "%s", cases[i].what);
		cr_assert_eq(lookup(kr, &a, NOW), 0, "%s", cases[i].what);
		cr_assert_eq(lookup(kr, &b, NOW), SPACED_EUNKNOWNKEY, "%s", cases[i].what);
		free(cases[i].json);
	}
	spaced_wipe(secret, sizeof secret);
	free(good);
	spaced_keyring_free(kr);
	key_drop(&a);
	key_drop(&b);
}

Test(keyring, too_many_keys_and_too_large)
{
	struct test_key keys[SPACED_KEYRING_MAX_KEYS + 1];
	const struct test_key *ptrs[SPACED_KEYRING_MAX_KEYS + 1];
	for (unsigned i = 0; i <= SPACED_KEYRING_MAX_KEYS; i++) {
		key_make(&keys[i], 100 + i);
		ptrs[i] = &keys[i];
	}
	struct spaced_keyring *kr;
	cr_assert_eq(spaced_keyring_new(&kr), 0);
	const struct test_key *one[] = {&keys[0]};
	char *first = bundle(1, one, 1);
	cr_assert_eq(install(kr, first), 0);
	char *over = bundle(2, ptrs, SPACED_KEYRING_MAX_KEYS + 1);
	cr_assert_eq(install(kr, over), SPACED_ETOOBIG);
	cr_assert_eq(spaced_keyring_count(kr), 1);
	char *full = bundle(2, ptrs, SPACED_KEYRING_MAX_KEYS);
	cr_assert_eq(install(kr, full), 0, "exactly the maximum");
	cr_assert_eq(spaced_keyring_count(kr), SPACED_KEYRING_MAX_KEYS);
	cr_assert_eq(lookup(kr, &keys[SPACED_KEYRING_MAX_KEYS - 1], NOW), 0);
	/* a bundle larger than the byte limit is refused before parsing */
	size_t big = SPACED_KEYRING_BUNDLE_MAX + 1;
	char *huge = malloc(big + 1);
	memset(huge, ' ', big);
	memcpy(huge, "{\"version\":9,\"keys\":[]}", 23);
	huge[big] = 0;
	cr_assert_eq(spaced_keyring_install_bundle(kr, huge, big), SPACED_ETOOBIG);
	cr_assert_eq(spaced_keyring_install_bundle(kr, huge, big - 1), 0, "whitespace up to the limit is fine");
	cr_assert_eq(spaced_keyring_version(kr), 9);
	free(huge);
	free(first);
	free(over);
	free(full);
	spaced_keyring_free(kr);
	for (unsigned i = 0; i <= SPACED_KEYRING_MAX_KEYS; i++)
		key_drop(&keys[i]);
}

Test(keyring, older_version_refused)
{
	struct test_key a, b;
	key_make(&a, 1);
	key_make(&b, 2);
	struct spaced_keyring *kr;
	cr_assert_eq(spaced_keyring_new(&kr), 0);
	const struct test_key *ka[] = {&a}, *kb[] = {&b};
	char *v7 = bundle(7, ka, 1), *v6 = bundle(6, kb, 1), *v8 = bundle(8, kb, 1);
	cr_assert_eq(install(kr, v7), 0);
	uint64_t e = spaced_keyring_epoch(kr);
	cr_assert_eq(install(kr, v6), SPACED_ESTALE);
	cr_assert_eq(spaced_keyring_epoch(kr), e);
	cr_assert_eq(lookup(kr, &a, NOW), 0);
	cr_assert_eq(lookup(kr, &b, NOW), SPACED_EUNKNOWNKEY);
	cr_assert_eq(install(kr, v8), 0);
	cr_assert_eq(lookup(kr, &a, NOW), SPACED_EUNKNOWNKEY, "a bundle replaces the whole set");
	cr_assert_eq(lookup(kr, &b, NOW), 0);
	free(v6);
	free(v7);
	free(v8);
	spaced_keyring_free(kr);
	key_drop(&a);
	key_drop(&b);
}

Test(keyring, load_file)
{
	struct test_key a;
	key_make(&a, 1);
	struct spaced_keyring *kr;
	cr_assert_eq(spaced_keyring_new(&kr), 0);
	const struct test_key *ka[] = {&a};
	char *j = bundle(1, ka, 1);
	char path[] = "/tmp/spaced-bundle-XXXXXX";
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, j, strlen(j)), (ssize_t)strlen(j));
	close(fd);
	cr_assert_eq(spaced_keyring_load_file(kr, path), 0);
	cr_assert_eq(lookup(kr, &a, NOW), 0);
	unlink(path);
	cr_assert_eq(spaced_keyring_load_file(kr, path), SPACED_EIO, "missing file");
	cr_assert_eq(spaced_keyring_load_file(kr, "/tmp"), SPACED_EIO, "a directory");
	free(j);
	spaced_keyring_free(kr);
	key_drop(&a);
}

/* ---- atomic reload under concurrency (T1) ---- */

#define SET_SIZE 16
#define RELOADS 400

struct race {
	struct spaced_keyring *kr;
	struct test_key common, x[SET_SIZE - 1], y[SET_SIZE - 1];
	char *bundles[RELOADS];
	atomic_bool done;
	atomic_ulong samples, torn, missing_common, reloads_failed;
};

static void *reloader(void *arg)
{
	struct race *rc = arg;
	for (size_t i = 0; i < RELOADS; i++)
		if (install(rc->kr, rc->bundles[i]) != 0)
			atomic_fetch_add(&rc->reloads_failed, 1);
	atomic_store(&rc->done, true);
	return NULL;
}

static bool found(struct race *rc, const struct test_key *k)
{
	struct spaced_public_key pk;
	int r = spaced_keyring_lookup(rc->kr, k->kid, NOW, &pk, NULL);
	return r == 0 && memcmp(pk.pk, k->pk.pk, 32) == 0;
}

/* One sample: every key of both sets looked up between two readings of the
 * epoch. When no reload finished in between, exactly one whole set is seen. */
static void *looker(void *arg)
{
	struct race *rc = arg;
	bool last;
	do {
		/* the sample after the reloader finished is always a consistent one */
		last = atomic_load(&rc->done);
		uint64_t e1 = spaced_keyring_epoch(rc->kr);
		size_t nx = 0, ny = 0;
		if (!found(rc, &rc->common))
			atomic_fetch_add(&rc->missing_common, 1);
		for (size_t i = 0; i < SET_SIZE - 1; i++) {
			nx += found(rc, &rc->x[i]);
			ny += found(rc, &rc->y[i]);
		}
		uint64_t e2 = spaced_keyring_epoch(rc->kr);
		if (e1 != e2)
			continue;
		atomic_fetch_add(&rc->samples, 1);
		if (!((nx == SET_SIZE - 1 && ny == 0) || (nx == 0 && ny == SET_SIZE - 1)))
			atomic_fetch_add(&rc->torn, 1);
	} while (!last);
	return NULL;
}

Test(keyring, atomic_reload_under_concurrency, .timeout = 120)
{
	static struct race rc;
	key_make(&rc.common, 1000);
	const struct test_key *sx[SET_SIZE], *sy[SET_SIZE];
	sx[0] = sy[0] = &rc.common;
	for (unsigned i = 0; i < SET_SIZE - 1; i++) {
		key_make(&rc.x[i], 2000 + i);
		key_make(&rc.y[i], 3000 + i);
		sx[i + 1] = &rc.x[i];
		sy[i + 1] = &rc.y[i];
	}
	for (size_t i = 0; i < RELOADS; i++)
		rc.bundles[i] = bundle(i + 1, (i % 2) ? sy : sx, SET_SIZE);
	cr_assert_eq(spaced_keyring_new(&rc.kr), 0);
	cr_assert_eq(install(rc.kr, rc.bundles[0]), 0);
	pthread_t w, r[3];
	for (int i = 0; i < 3; i++)
		cr_assert_eq(pthread_create(&r[i], NULL, looker, &rc), 0);
	cr_assert_eq(pthread_create(&w, NULL, reloader, &rc), 0);
	pthread_join(w, NULL);
	for (int i = 0; i < 3; i++)
		pthread_join(r[i], NULL);
	cr_log_info("%lu consistent samples during %d reloads", (unsigned long)atomic_load(&rc.samples), RELOADS);
	cr_assert_eq(atomic_load(&rc.reloads_failed), 0);
	cr_assert_gt(atomic_load(&rc.samples), 0, "no sample completed between two reloads");
	cr_assert_eq(atomic_load(&rc.torn), 0, "a lookup saw a mix of two key sets");
	cr_assert_eq(atomic_load(&rc.missing_common), 0, "a key present in every bundle went missing");
	cr_assert_eq(spaced_keyring_version(rc.kr), RELOADS);
	for (size_t i = 0; i < RELOADS; i++)
		free(rc.bundles[i]);
	spaced_keyring_free(rc.kr);
	key_drop(&rc.common);
	for (unsigned i = 0; i < SET_SIZE - 1; i++) {
		key_drop(&rc.x[i]);
		key_drop(&rc.y[i]);
	}
}

/* ---- verification cache ---- */

struct cache_fx {
	struct test_key k, other;
	struct spaced_keyring *kr;
	struct spaced_vcache *vc;
};

static void cache_fx_init(struct cache_fx *f, size_t capacity)
{
	key_make(&f->k, 7);
	key_make(&f->other, 8);
	cr_assert_eq(spaced_keyring_new(&f->kr), 0);
	const struct test_key *ks[] = {&f->k};
	char *j = bundle(1, ks, 1);
	cr_assert_eq(install(f->kr, j), 0);
	free(j);
	cr_assert_eq(spaced_vcache_new(&f->vc, capacity), 0);
}

static void cache_fx_fini(struct cache_fx *f)
{
	spaced_vcache_free(f->vc);
	spaced_keyring_free(f->kr);
	key_drop(&f->k);
	key_drop(&f->other);
}

static struct spaced_cap make_cap(uint64_t generation, const char *jti, int64_t iat)
{
	struct spaced_cap c;
	memset(&c, 0, sizeof c);
	cr_assert_eq(spaced_identity_set(&c.id, "sbx-1", generation, "worker-a", "process", "act-1", NULL), 0);
	c.cls = SPACED_CLASS_CONTROL;
	c.purposes = SPACED_PURPOSE_EXEC;
	c.iat = c.nbf = iat;
	c.exp = iat + SPACED_CAP_LIFETIME;
	snprintf(c.jti, sizeof c.jti, "%s", jti);
	return c;
}

static char *issue_with(const struct test_key *k, const struct spaced_cap *c)
{
	char *t = NULL;
	cr_assert_eq(spaced_cap_issue(k->sk, c, &t), 0);
	return t;
}

static int cverify(struct cache_fx *f, const char *t, enum spaced_cap_class cls, int64_t now, struct spaced_cap *out)
{
	struct spaced_cap tmp;
	return spaced_cap_verify(f->kr, f->vc, t, strlen(t), cls, now, out ? out : &tmp);
}

static struct spaced_vcache_stats stats(struct cache_fx *f)
{
	struct spaced_vcache_stats s;
	spaced_vcache_stats(f->vc, &s);
	return s;
}

Test(vcache, hit_after_first_verification)
{
	struct cache_fx f;
	cache_fx_init(&f, 64);
	struct spaced_cap c = make_cap(7, "j1", NOW), got;
	char *t = issue_with(&f.k, &c);
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, NOW, &got), 0);
	struct spaced_vcache_stats s = stats(&f);
	cr_assert_eq(s.hits, 0);
	cr_assert_eq(s.misses, 1);
	cr_assert_eq(s.inserts, 1);
	cr_assert_eq(s.entries, 1);
	struct spaced_cap again;
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, NOW + 1, &again), 0);
	s = stats(&f);
	cr_assert_eq(s.hits, 1, "second verification is a hit");
	cr_assert_eq(s.inserts, 1);
	cr_assert(spaced_identity_equal(&again.id, &got.id));
	cr_assert_str_eq(again.kid, got.kid, "the cached result carries the kid");
	free(t);
	cache_fx_fini(&f);
}

/* What a hit skips is the signature: an entry stored under the digest of a
 * token is trusted for that exact token. (Only spaced_cap_verify stores
 * entries, and only after a successful signature check.) */
Test(vcache, hit_skips_the_signature_check)
{
	struct cache_fx f;
	cache_fx_init(&f, 64);
	struct spaced_cap c = make_cap(7, "j1", NOW);
	memcpy(c.kid, f.k.kid, sizeof c.kid);
	const char *forged = "v4.public.not-a-real-token";
	cr_assert_neq(cverify(&f, forged, SPACED_CLASS_CONTROL, NOW, NULL), 0);
	uint8_t d[SPACED_VCACHE_DIGEST];
	spaced_vcache_digest(SPACED_CLASS_CONTROL, forged, strlen(forged), d);
	spaced_vcache_put(f.vc, spaced_keyring_epoch(f.kr), d, &c);
	struct spaced_cap got;
	cr_assert_eq(cverify(&f, forged, SPACED_CLASS_CONTROL, NOW, &got), 0);
	cr_assert_eq(stats(&f).hits, 1);
	cr_assert_eq(got.id.generation, 7);
	cache_fx_fini(&f);
}

/* A cached token still goes through the time checks on every hit (C3). */
Test(vcache, cached_token_still_time_checked)
{
	struct cache_fx f;
	cache_fx_init(&f, 64);
	struct spaced_cap c = make_cap(7, "j1", NOW);
	char *t = issue_with(&f.k, &c);
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, NOW, NULL), 0);
	/* earlier than nbf - skew: a hit, refused as not yet valid */
	uint64_t hits = stats(&f).hits;
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, NOW - 16, NULL), SPACED_ENOTYET);
	cr_assert_eq(stats(&f).hits, hits + 1, "the refusal came from a cache hit");
	/* exactly exp + skew: still accepted from the cache */
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, c.exp + 15, NULL), 0);
	cr_assert_eq(stats(&f).hits, hits + 2);
	/* past exp + skew: refused even though it was cached */
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, c.exp + 16, NULL), SPACED_EEXPIRED);
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, c.exp + 1000, NULL), SPACED_EEXPIRED);
	free(t);
	cache_fx_fini(&f);
}

Test(vcache, class_is_part_of_the_key)
{
	struct cache_fx f;
	cache_fx_init(&f, 64);
	struct spaced_cap c = make_cap(7, "j1", NOW);
	char *t = issue_with(&f.k, &c);
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, NOW, NULL), 0);
	struct spaced_vcache_stats s0 = stats(&f);
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_SERVICEPORT, NOW, NULL), SPACED_EPURPOSE);
	struct spaced_vcache_stats s1 = stats(&f);
	cr_assert_eq(s1.hits, s0.hits, "other class: no hit");
	cr_assert_eq(s1.misses, s0.misses + 1);
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, NOW, NULL), 0);
	cr_assert_eq(stats(&f).hits, s0.hits + 1, "same class: hit");
	uint8_t d1[SPACED_VCACHE_DIGEST], d2[SPACED_VCACHE_DIGEST];
	spaced_vcache_digest(SPACED_CLASS_CONTROL, t, strlen(t), d1);
	spaced_vcache_digest(SPACED_CLASS_SERVICEPORT, t, strlen(t), d2);
	cr_assert_neq(memcmp(d1, d2, sizeof d1), 0);
	free(t);
	cache_fx_fini(&f);
}

/* T1: a new key set flushes what the old one verified. */
Test(vcache, flush_on_keyring_epoch_change)
{
	struct cache_fx f;
	cache_fx_init(&f, 64);
	struct spaced_cap c = make_cap(7, "j1", NOW);
	char *t = issue_with(&f.k, &c);
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, NOW, NULL), 0);
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, NOW, NULL), 0);
	cr_assert_eq(stats(&f).hits, 1);
	const struct test_key *ks[] = {&f.other};
	char *j = bundle(2, ks, 1);
	cr_assert_eq(install(f.kr, j), 0);
	free(j);
	int r = cverify(&f, t, SPACED_CLASS_CONTROL, NOW, NULL);
	cr_assert_eq(r, SPACED_EUNKNOWNKEY, "cached token after its key left: %s", spaced_errname(r));
	struct spaced_vcache_stats s = stats(&f);
	cr_assert_eq(s.hits, 1, "no hit after the epoch changed");
	cr_assert_geq(s.flushes, 1);
	cr_assert_eq(s.entries, 0);
	struct spaced_decision d = spaced_decision_from_error(r);
	cr_assert_eq(d.verdict, SPACED_DENY);
	cr_assert_eq(d.reason, SPACED_REASON_UNKNOWN_KEY);
	free(t);
	cache_fx_fini(&f);
}

/* A key that leaves its validity window while a token it verified is cached:
 * the cached answer must not outlive the key. */
Test(vcache, cached_token_after_key_window_ends)
{
	struct cache_fx f;
	key_make(&f.k, 7);
	key_make(&f.other, 8);
	cr_assert_eq(spaced_keyring_new(&f.kr), 0);
	cr_assert_eq(spaced_keyring_add(f.kr, &f.k.pk, NOW - 100, NOW + 10), 0);
	cr_assert_eq(spaced_vcache_new(&f.vc, 64), 0);
	struct spaced_cap c = make_cap(7, "j1", NOW);
	char *t = issue_with(&f.k, &c);
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, NOW, NULL), 0);
	/* without a cache: the key is outside its window at NOW + 11 */
	struct spaced_cap out;
	cr_assert_eq(spaced_cap_verify(f.kr, NULL, t, strlen(t), SPACED_CLASS_CONTROL, NOW + 11, &out),
	             SPACED_EUNKNOWNKEY);
	/* with the cache: the same answer */
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, NOW + 11, NULL), SPACED_EUNKNOWNKEY);
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, NOW + 5, NULL), 0);
	free(t);
	cache_fx_fini(&f);
}

Test(vcache, bounded_size)
{
	struct cache_fx f;
	cache_fx_init(&f, 16);
	struct spaced_vcache_stats s = stats(&f);
	cr_assert_geq(s.capacity, 16);
	size_t cap = s.capacity;
	uint64_t epoch = spaced_keyring_epoch(f.kr);
	/* many more direct insertions than the capacity */
	for (unsigned i = 0; i < 50 * cap; i++) {
		struct spaced_cap c = make_cap(1 + i % 5, "j", NOW + (int64_t)(i % 100));
		uint8_t d[SPACED_VCACHE_DIGEST];
		char name[32];
		snprintf(name, sizeof name, "token-%u", i);
		spaced_vcache_digest(SPACED_CLASS_CONTROL, name, strlen(name), d);
		spaced_vcache_put(f.vc, epoch, d, &c);
		s = stats(&f);
		cr_assert_leq(s.entries, cap, "entries %zu > capacity %zu", s.entries, cap);
	}
	cr_assert_gt(s.evictions, 0);
	cr_assert_eq(s.capacity, cap);
	/* and through real verifications */
	for (unsigned i = 0; i < 4 * cap; i++) {
		char jti[32];
		snprintf(jti, sizeof jti, "jti-%u", i);
		struct spaced_cap c = make_cap(7, jti, NOW);
		char *t = issue_with(&f.k, &c);
		cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, NOW, NULL), 0);
		free(t);
		cr_assert_leq(stats(&f).entries, cap);
	}
	spaced_vcache_flush(f.vc);
	cr_assert_eq(stats(&f).entries, 0);
	cache_fx_fini(&f);
}

Test(vcache, capacity_rounding)
{
	struct spaced_vcache *vc;
	struct spaced_vcache_stats s;
	cr_assert_eq(spaced_vcache_new(&vc, 0), 0);
	spaced_vcache_stats(vc, &s);
	cr_assert_gt(s.capacity, 0, "at least one set");
	spaced_vcache_free(vc);
	cr_assert_eq(spaced_vcache_new(&vc, 5), 0);
	spaced_vcache_stats(vc, &s);
	cr_assert_geq(s.capacity, 5);
	spaced_vcache_free(vc);
	spaced_vcache_free(NULL);
}

/* R1, R3: a cache hit never skips the identity comparison. The cached result
 * is compared with the record like any other; once the receiver installs a
 * newer generation the same cached token gets REFRESH_ROUTE. */
Test(vcache, hit_never_skips_identity_comparison)
{
	struct cache_fx f;
	cache_fx_init(&f, 64);
	struct spaced_cap c = make_cap(7, "j1", NOW), got;
	char *t = issue_with(&f.k, &c);
	struct spaced_request req = {SPACED_PURPOSE_EXEC, 0, NULL};
	struct spaced_record rec = {.id = c.id, .epoch = 1, .active = true};
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, NOW, &got), 0);
	struct spaced_decision d = spaced_compare(&got, &req, &rec, SPACED_COMPARE_STRICT);
	cr_assert_eq(d.verdict, SPACED_ALLOW);
	/* the receiver installs generation 8 */
	rec.id.generation = 8;
	rec.epoch = 2;
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, NOW + 1, &got), 0);
	cr_assert_eq(stats(&f).hits, 1, "served from the cache");
	d = spaced_compare(&got, &req, &rec, SPACED_COMPARE_STRICT);
	cr_assert_eq(d.verdict, SPACED_REFRESH_ROUTE);
	cr_assert_eq(d.reason, SPACED_REASON_OLDER_GENERATION);
	/* and a deactivation of generation 7 */
	rec.id.generation = 7;
	rec.active = false;
	cr_assert_eq(cverify(&f, t, SPACED_CLASS_CONTROL, NOW + 2, &got), 0);
	d = spaced_compare(&got, &req, &rec, SPACED_COMPARE_STRICT);
	cr_assert_eq(d.verdict, SPACED_REFRESH_ROUTE);
	cr_assert_eq(d.reason, SPACED_REASON_DEACTIVATED);
	free(t);
	cache_fx_fini(&f);
}

struct cache_race {
	struct cache_fx *f;
	char *tokens[8];
	atomic_ulong bad;
};

static void *cache_worker(void *arg)
{
	struct cache_race *cr = arg;
	for (int round = 0; round < 200; round++) {
		for (int i = 0; i < 8; i++) {
			struct spaced_cap got;
			int r = spaced_cap_verify(cr->f->kr, cr->f->vc, cr->tokens[i], strlen(cr->tokens[i]),
			                          SPACED_CLASS_CONTROL, NOW, &got);
			char want[8];
			snprintf(want, sizeof want, "j%d", i);
			if (r != 0 || strcmp(got.jti, want) != 0)
				atomic_fetch_add(&cr->bad, 1);
		}
	}
	return NULL;
}

/* Several threads verifying through one small cache always get each token's
 * own claims back. */
Test(vcache, concurrent_use, .timeout = 120)
{
	struct cache_fx f;
	cache_fx_init(&f, 4);
	static struct cache_race cr;
	cr.f = &f;
	for (int i = 0; i < 8; i++) {
		char jti[8];
		snprintf(jti, sizeof jti, "j%d", i);
		struct spaced_cap c = make_cap(7, jti, NOW);
		cr.tokens[i] = issue_with(&f.k, &c);
	}
	pthread_t th[4];
	for (int i = 0; i < 4; i++)
		cr_assert_eq(pthread_create(&th[i], NULL, cache_worker, &cr), 0);
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	cr_assert_eq(atomic_load(&cr.bad), 0);
	cr_assert_leq(stats(&f).entries, stats(&f).capacity);
	for (int i = 0; i < 8; i++)
		free(cr.tokens[i]);
	cache_fx_fini(&f);
}

struct reload_verify {
	struct spaced_keyring *kr;
	struct spaced_vcache *vc;
	char *bundles[2];
	char *common_token, *x_token;
	atomic_bool done;
	atomic_ulong common_bad, x_bad, x_ok, x_unknown;
};

static void *rv_reloader(void *arg)
{
	struct reload_verify *rv = arg;
	for (int i = 0; i < 300; i++) {
		/* versions only grow; the last bundle installed is set Y (no X key) */
		char *b = rv->bundles[i % 2];
		json_error_t e;
		json_t *o = json_loads(b, 0, &e);
		json_object_set_new(o, "version", json_integer(10 + i));
		char *s = json_dumps(o, JSON_COMPACT);
		if (install(rv->kr, s) != 0)
			atomic_fetch_add(&rv->common_bad, 1000);
		free(s);
		json_decref(o);
	}
	atomic_store(&rv->done, true);
	return NULL;
}

static void *rv_verifier(void *arg)
{
	struct reload_verify *rv = arg;
	do {
		struct spaced_cap c;
		if (spaced_cap_verify(rv->kr, rv->vc, rv->common_token, strlen(rv->common_token),
		                      SPACED_CLASS_CONTROL, NOW, &c) != 0)
			atomic_fetch_add(&rv->common_bad, 1);
		int r = spaced_cap_verify(rv->kr, rv->vc, rv->x_token, strlen(rv->x_token), SPACED_CLASS_CONTROL, NOW, &c);
		if (r == 0)
			atomic_fetch_add(&rv->x_ok, 1);
		else if (r == SPACED_EUNKNOWNKEY)
			atomic_fetch_add(&rv->x_unknown, 1);
		else
			atomic_fetch_add(&rv->x_bad, 1);
	} while (!atomic_load(&rv->done));
	return NULL;
}

/* T1: verifications through the cache while bundles are replaced: a key in
 * every bundle always verifies; a key in every other bundle verifies or is
 * unknown, never anything else; once the last bundle (without it) is in, its
 * token is refused even though it was cached before. */
Test(vcache, verification_during_reloads, .timeout = 120)
{
	static struct reload_verify rv;
	struct test_key common, x, y;
	key_make(&common, 500);
	key_make(&x, 501);
	key_make(&y, 502);
	const struct test_key *sx[] = {&common, &x}, *sy[] = {&common, &y};
	rv.bundles[0] = bundle(1, sx, 2);
	rv.bundles[1] = bundle(1, sy, 2);
	cr_assert_eq(spaced_keyring_new(&rv.kr), 0);
	cr_assert_eq(spaced_vcache_new(&rv.vc, 16), 0);
	cr_assert_eq(install(rv.kr, rv.bundles[0]), 0);
	struct spaced_cap c1 = make_cap(7, "common", NOW), c2 = make_cap(7, "x", NOW);
	rv.common_token = issue_with(&common, &c1);
	rv.x_token = issue_with(&x, &c2);
	struct spaced_cap out;
	cr_assert_eq(spaced_cap_verify(rv.kr, rv.vc, rv.x_token, strlen(rv.x_token), SPACED_CLASS_CONTROL, NOW, &out), 0);
	pthread_t w, v[2];
	for (int i = 0; i < 2; i++)
		cr_assert_eq(pthread_create(&v[i], NULL, rv_verifier, &rv), 0);
	cr_assert_eq(pthread_create(&w, NULL, rv_reloader, &rv), 0);
	pthread_join(w, NULL);
	for (int i = 0; i < 2; i++)
		pthread_join(v[i], NULL);
	cr_log_info("x token: %lu verified, %lu unknown-key", (unsigned long)atomic_load(&rv.x_ok),
	            (unsigned long)atomic_load(&rv.x_unknown));
	cr_assert_eq(atomic_load(&rv.common_bad), 0, "the key present in every bundle failed");
	cr_assert_eq(atomic_load(&rv.x_bad), 0, "a verification failed other than unknown-key");
	cr_assert_eq(spaced_cap_verify(rv.kr, rv.vc, rv.x_token, strlen(rv.x_token), SPACED_CLASS_CONTROL, NOW, &out),
	             SPACED_EUNKNOWNKEY, "the cache kept a token of a key that left");
	cr_assert_eq(spaced_cap_verify(rv.kr, rv.vc, rv.common_token, strlen(rv.common_token), SPACED_CLASS_CONTROL,
	                               NOW, &out),
	             0);
	free(rv.common_token);
	free(rv.x_token);
	free(rv.bundles[0]);
	free(rv.bundles[1]);
	spaced_vcache_free(rv.vc);
	spaced_keyring_free(rv.kr);
	key_drop(&common);
	key_drop(&x);
	key_drop(&y);
}
