/*
 * test_nameidx.c — the index of names to positions (nameidx.h), used as the
 * gate uses it for its records: entries appended at the end, taken out by
 * moving the last entry into the hole, looked up by name. Random steps are
 * checked against a linear search of the same array, so any entry a removal
 * leaves where no probe reaches it (a wrong backward shift) shows up as a
 * lookup that disagrees. Both hashes: FNV-1a (unkeyed) and SipHash (keyed).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nameidx.h"

#define MAXN 3000

static char names[MAXN][24];
static size_t n;

static const char *name_at(const void *ctx, uint32_t pos)
{
	(void)ctx;
	return names[pos];
}

static int64_t linear(const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(names[i], name) == 0)
			return (int64_t)i;
	return -1;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static void take_out(struct spaced_nameidx *x, size_t pos)
{
	char gone[24];
	snprintf(gone, sizeof gone, "%s", names[pos]);
	spaced_nameidx_del(x, gone);
	if (pos != n - 1) {
		spaced_nameidx_put(x, names[n - 1], (uint32_t)pos);
		memcpy(names[pos], names[n - 1], sizeof names[pos]);
	}
	n--;
	cr_assert_eq(spaced_nameidx_get(x, gone), -1, "%s is gone", gone);
}

/* Random steps, hashing with FNV-1a (key NULL) or SipHash under key. */
static void random_steps(const unsigned char *key)
{
	struct spaced_nameidx x;
	n = 0;
	spaced_nameidx_init_keyed(&x, name_at, NULL, key);
	cr_assert_eq(spaced_nameidx_get(&x, "sbx-0"), -1, "an empty index finds nothing");
	spaced_nameidx_del(&x, "sbx-0"); /* nothing to take out: no effect */
	unsigned issued = 0, adds = 0, removes = 0;
	for (int step = 0; step < 40000; step++) {
		uint64_t r = next();
		/* mostly grow up to 2,000, then churn; sometimes empty it far down */
		bool add = n == 0 || (n < 2000 && r % 3 != 0) || (n >= 2000 && r % 2 == 0 && n < MAXN);
		if (step % 10000 > 9000)
			add = n == 0;
		if (add) {
			cr_assert_eq(spaced_nameidx_reserve(&x, n + 1, n), 0);
			snprintf(names[n], sizeof names[n], "sbx-%016x", issued++ * 2654435761u);
			spaced_nameidx_put(&x, names[n], (uint32_t)n);
			n++;
			adds++;
		} else {
			take_out(&x, (size_t)(next() % n));
			removes++;
		}
		/* a present name and an absent one */
		if (n > 0) {
			size_t pos = (size_t)(next() % n);
			cr_assert_eq(spaced_nameidx_get(&x, names[pos]), (int64_t)pos, "step %d: %s at %zu", step, names[pos], pos);
		}
		char absent[24];
		snprintf(absent, sizeof absent, "sbx-%016x", (unsigned)next() | 1u);
		cr_assert_eq(spaced_nameidx_get(&x, absent), linear(absent));
		/* now and then, every entry */
		if (step % 997 == 0)
			for (size_t i = 0; i < n; i++)
				cr_assert_eq(spaced_nameidx_get(&x, names[i]), (int64_t)i, "step %d: %s", step, names[i]);
	}
	cr_assert(adds > 10000 && removes > 10000, "both kinds of steps ran (%u adds, %u removes)", adds, removes);
	cr_assert(x.nslots >= 2 * n && (x.nslots & (x.nslots - 1)) == 0, "at least twice as many slots, a power of two");
	spaced_nameidx_free(&x);
}

Test(nameidx, random_steps_agree_with_a_linear_search)
{
	random_steps(NULL);
}

/* keyed (SipHash), as rootfs indexes a directory's names, which a tenant
 * chooses: the same steps, the same answers */
Test(nameidx, random_steps_agree_with_a_linear_search_keyed)
{
	static const unsigned char key[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
	random_steps(key);
}

Test(nameidx, put_moves_an_existing_name)
{
	struct spaced_nameidx x;
	n = 0;
	spaced_nameidx_init(&x, name_at, NULL);
	cr_assert_eq(spaced_nameidx_reserve(&x, 2, 0), 0);
	snprintf(names[0], sizeof names[0], "a");
	snprintf(names[1], sizeof names[1], "a");
	spaced_nameidx_put(&x, "a", 0);
	spaced_nameidx_put(&x, "a", 1); /* the same name, now at 1 */
	cr_assert_eq(spaced_nameidx_get(&x, "a"), 1);
	spaced_nameidx_del(&x, "a");
	cr_assert_eq(spaced_nameidx_get(&x, "a"), -1, "one entry per name: one removal takes it out");
	spaced_nameidx_free(&x);
}
