/* test_route_cache.c — the client's route cache: V2 (one rebuilt retry uses the
 * fresh route), V3 (compare-and-swap replacement), V4 (repair keeps expiry). */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cap.h"
#include "spaced_error.h"
#include "route_cache.h"

static struct spaced_route route(const char *sandbox, uint64_t gen, const char *worker, const char *cap,
                                 int64_t cap_exp, uint32_t purposes)
{
	struct spaced_route r;
	memset(&r, 0, sizeof r);
	cr_assert_eq(spaced_identity_set(&r.id, sandbox, gen, worker, "process", "a1", NULL), 0);
	snprintf(r.worker_url, sizeof r.worker_url, "http://127.0.0.1:1/%s", worker);
	r.capability = (char *)(uintptr_t)cap;
	r.cap_expires_at = cap_exp;
	r.purposes = purposes;
	return r;
}

#define RW (SPACED_PURPOSE_FS_READ | SPACED_PURPOSE_FS_WRITE)

Test(route_cache, hit_needs_purposes_unexpired_capability_and_entry)
{
	struct spaced_route_cache *c;
	struct spaced_route out;
	cr_assert_eq(spaced_route_cache_new(&c, 8), 0);
	struct spaced_route r7 = route("sbx-a", 7, "w-a", "cap-7", 1000, RW);
	cr_assert_eq(spaced_route_cache_put(c, &r7, 900), 0);
	cr_assert_eq(spaced_route_cache_get(c, "sbx-a", SPACED_PURPOSE_FS_READ, 100, &out), 0);
	cr_assert_str_eq(out.capability, "cap-7");
	cr_assert_eq(out.id.generation, 7u);
	spaced_route_clear(&out);
	cr_assert_eq(spaced_route_cache_get(c, "sbx-a", SPACED_PURPOSE_EXEC, 100, &out), SPACED_ENOENT,
	             "a purpose the capability lacks is a miss");
	cr_assert_eq(spaced_route_cache_get(c, "sbx-b", SPACED_PURPOSE_FS_READ, 100, &out), SPACED_ENOENT);
	cr_assert_eq(spaced_route_cache_get(c, "sbx-a", SPACED_PURPOSE_FS_READ, 1000 - SPACED_ROUTE_EXPIRY_MARGIN, &out),
	             SPACED_ENOENT, "a capability in its last seconds is not used");
	cr_assert_eq(spaced_route_cache_get(c, "sbx-a", SPACED_PURPOSE_FS_READ, 900, &out), SPACED_ENOENT,
	             "the entry's own expiry ends it");
	spaced_route_cache_free(c);
}

Test(route_cache, refresh_replaces_only_the_refused_route_V3)
{
	struct spaced_route_cache *c;
	struct spaced_route out;
	cr_assert_eq(spaced_route_cache_new(&c, 8), 0);
	struct spaced_route r7 = route("sbx-a", 7, "w-a", "cap-7", 1000, RW);
	struct spaced_route r8 = route("sbx-a", 8, "w-b", "cap-8", 1100, RW);
	struct spaced_route r9 = route("sbx-a", 9, "w-a", "cap-9", 1200, RW);
	cr_assert_eq(spaced_route_cache_put(c, &r7, 5000), 0);

	/* A request through 7 was refused: the entry still holds 7, so 8 replaces it. */
	cr_assert_eq(spaced_route_cache_replace(c, &r7, &r8), 0);
	cr_assert_eq(spaced_route_cache_get(c, "sbx-a", SPACED_PURPOSE_FS_READ, 100, &out), 0);
	cr_assert_eq(out.id.generation, 8u);
	spaced_route_clear(&out);

	/* Another request resolved 9 meanwhile and stored it … */
	cr_assert_eq(spaced_route_cache_replace(c, &r8, &r9), 0);
	/* … then a late REFRESH_ROUTE for 7 (or 8) arrives: it must not evict 9. */
	cr_assert_eq(spaced_route_cache_replace(c, &r7, &r8), SPACED_ESTALE);
	cr_assert_eq(spaced_route_cache_replace(c, &r8, &r8), SPACED_ESTALE);
	cr_assert_eq(spaced_route_cache_get(c, "sbx-a", SPACED_PURPOSE_FS_READ, 100, &out), 0);
	cr_assert_eq(out.id.generation, 9u, "the newer entry survives a late rejection");
	spaced_route_clear(&out);

	/* The same capability text under another identity is not the same route. */
	struct spaced_route fake = route("sbx-a", 10, "w-a", "cap-9", 1200, RW);
	cr_assert_eq(spaced_route_cache_replace(c, &fake, &r7), SPACED_ESTALE);
	spaced_route_cache_free(c);
}

Test(route_cache, repair_keeps_the_entry_expiry_V4)
{
	struct spaced_route_cache *c;
	int64_t exp = 0;
	cr_assert_eq(spaced_route_cache_new(&c, 8), 0);
	struct spaced_route r7 = route("sbx-a", 7, "w-a", "cap-7", 1000, RW);
	struct spaced_route r8 = route("sbx-a", 8, "w-b", "cap-8", 99999, RW);
	cr_assert_eq(spaced_route_cache_put(c, &r7, 500), 0);
	cr_assert_eq(spaced_route_cache_replace(c, &r7, &r8), 0);
	cr_assert_eq(spaced_route_cache_entry_expiry(c, "sbx-a", &exp), 0);
	cr_assert_eq(exp, 500, "route repair is not renewal of the caller's authorization");
	struct spaced_route out;
	cr_assert_eq(spaced_route_cache_get(c, "sbx-a", SPACED_PURPOSE_FS_READ, 500, &out), SPACED_ENOENT);
	spaced_route_cache_free(c);
}

Test(route_cache, deny_drops_only_the_refused_route)
{
	struct spaced_route_cache *c;
	struct spaced_route out;
	cr_assert_eq(spaced_route_cache_new(&c, 8), 0);
	struct spaced_route r7 = route("sbx-a", 7, "w-a", "cap-7", 1000, RW);
	struct spaced_route r8 = route("sbx-a", 8, "w-a", "cap-8", 1000, RW);
	cr_assert_eq(spaced_route_cache_put(c, &r8, 5000), 0);
	cr_assert_eq(spaced_route_cache_drop(c, &r7), SPACED_ESTALE);
	cr_assert_eq(spaced_route_cache_get(c, "sbx-a", SPACED_PURPOSE_FS_READ, 1, &out), 0);
	spaced_route_clear(&out);
	cr_assert_eq(spaced_route_cache_drop(c, &r8), 0);
	cr_assert_eq(spaced_route_cache_get(c, "sbx-a", SPACED_PURPOSE_FS_READ, 1, &out), SPACED_ENOENT);
	cr_assert_eq(spaced_route_cache_replace(c, &r8, &r7), SPACED_ENOENT, "nothing to repair");
	spaced_route_cache_free(c);
}

Test(route_cache, bounded_evicts_the_entry_that_expires_first)
{
	struct spaced_route_cache *c;
	struct spaced_route out;
	char name[32], cap[32];
	cr_assert_eq(spaced_route_cache_new(&c, 4), 0);
	for (int i = 0; i < 4; i++) {
		snprintf(name, sizeof name, "sbx-%d", i);
		snprintf(cap, sizeof cap, "cap-%d", i);
		struct spaced_route r = route(name, 1, "w", cap, 1000, RW);
		cr_assert_eq(spaced_route_cache_put(c, &r, 100 + (i == 2 ? -50 : i)), 0);
	}
	struct spaced_route r = route("sbx-new", 1, "w", "cap-new", 1000, RW);
	cr_assert_eq(spaced_route_cache_put(c, &r, 200), 0);
	cr_assert_eq(spaced_route_cache_get(c, "sbx-2", SPACED_PURPOSE_FS_READ, 1, &out), SPACED_ENOENT);
	for (int i = 0; i < 4; i++) {
		if (i == 2)
			continue;
		snprintf(name, sizeof name, "sbx-%d", i);
		cr_assert_eq(spaced_route_cache_get(c, name, SPACED_PURPOSE_FS_READ, 1, &out), 0, "%s", name);
		spaced_route_clear(&out);
	}
	cr_assert_eq(spaced_route_cache_get(c, "sbx-new", SPACED_PURPOSE_FS_READ, 1, &out), 0);
	spaced_route_clear(&out);
	spaced_route_cache_free(c);
}

struct racer {
	struct spaced_route_cache *c;
	int wins;
};

static void *race(void *arg)
{
	struct racer *rc = arg;
	struct spaced_route r7 = route("sbx-a", 7, "w-a", "cap-7", 1000, RW);
	char cap[32];
	snprintf(cap, sizeof cap, "cap-8-%p", arg);
	struct spaced_route r8 = route("sbx-a", 8, "w-b", cap, 1000, RW);
	rc->wins = spaced_route_cache_replace(rc->c, &r7, &r8) == 0;
	return NULL;
}

Test(route_cache, concurrent_repairs_of_one_refusal_replace_once)
{
	struct spaced_route_cache *c;
	cr_assert_eq(spaced_route_cache_new(&c, 8), 0);
	struct spaced_route r7 = route("sbx-a", 7, "w-a", "cap-7", 1000, RW);
	cr_assert_eq(spaced_route_cache_put(c, &r7, 5000), 0);
	struct racer rc[8];
	pthread_t t[8];
	for (int i = 0; i < 8; i++) {
		rc[i].c = c;
		pthread_create(&t[i], NULL, race, &rc[i]);
	}
	int wins = 0;
	for (int i = 0; i < 8; i++) {
		pthread_join(t[i], NULL);
		wins += rc[i].wins;
	}
	cr_assert_eq(wins, 1, "exactly one of the racing repairs replaces the refused route");
	spaced_route_cache_free(c);
}
