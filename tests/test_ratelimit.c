/*
 * test_ratelimit.c — libspaced/ratelimit.h: the audit log's DENY lines are
 * held to a rate per caller address and for all callers together, and what
 * is held back is counted by caller and reason and handed to the summary
 * function once it is SPACED_RATELIMIT_SUMMARY_S old, when its caller's slot
 * goes to another caller, or on a flush of all — never lost. Time is given,
 * not measured: nothing here depends on the machine's speed. And the rule
 * that shares a capacity among tenants (util.h spaced_fair_share: a worker's
 * streams, node-api's answer memory) lets one tenant hold half at most and
 * keeps the last quarter for those holding little.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "ratelimit.h"
#include "util.h"

#define S 1000000000ull

static unsigned taken(struct spaced_ratelimit *l, const char *caller, unsigned tries, uint64_t now)
{
	unsigned n = 0;
	for (unsigned i = 0; i < tries; i++)
		n += spaced_ratelimit_take(l, caller, "bad-signature", now);
	return n;
}

Test(ratelimit, a_caller_gets_its_burst_then_its_rate)
{
	struct spaced_ratelimit *l = spaced_ratelimit_new(10, 50, 1000, 10000, 64);
	cr_assert_not_null(l);
	cr_expect_eq(taken(l, "198.18.0.1:4000", 500, 5 * S), 50, "the burst at once, no more");
	cr_expect_eq(taken(l, "198.18.0.1:4001", 500, 5 * S + S / 2), 5, "half a second later: half of 10 a second");
	cr_expect_eq(taken(l, "198.18.0.1:4002", 500, 1000 * S), 50, "after a long pause: the burst again, not more");
	spaced_ratelimit_free(l);
}

/* What the summaries said: caller key, reason, count, in order. */
static char said[64][128];
static int nsaid;

static void note(void *ctx, const char *caller, const struct spaced_ratelimit_held *held, size_t n)
{
	(*(int *)ctx)++;
	for (size_t i = 0; i < n && nsaid < 64; i++)
		snprintf(said[nsaid++], sizeof said[0], "%s %s %llu", caller, held[i].reason,
		         (unsigned long long)held[i].count);
}

Test(ratelimit, the_held_back_lines_are_summarized_by_caller_and_reason)
{
	int calls = 0;
	nsaid = 0;
	struct spaced_ratelimit *l = spaced_ratelimit_new(1, 2, 1000, 10000, 64);
	spaced_ratelimit_on_summary(l, note, &calls);
	cr_assert(spaced_ratelimit_take(l, "127.0.0.1:1", "expired", S));
	cr_assert(spaced_ratelimit_take(l, "127.0.0.1:2", "expired", S));
	for (int i = 0; i < 5; i++)
		cr_expect_not(spaced_ratelimit_take(l, "127.0.0.1:3", "expired", S));
	cr_expect_not(spaced_ratelimit_take(l, "127.0.0.1:3", "bad-signature", S));
	cr_expect_not(spaced_ratelimit_take(l, "127.0.0.1:3", NULL, S));
	cr_expect_eq(spaced_ratelimit_suppressed_total(l), 7);
	cr_expect(spaced_ratelimit_pending(l));
	spaced_ratelimit_flush(l, S + S, false);
	cr_expect_eq(calls, 0, "a second later: not yet due");
	cr_assert(spaced_ratelimit_take(l, "127.0.0.1:4", "expired", 2 * S), "a line of its own again");
	spaced_ratelimit_flush(l, S + SPACED_RATELIMIT_SUMMARY_S * S, false);
	cr_assert_eq(calls, 1, "due once its first held-back one is %d s old", SPACED_RATELIMIT_SUMMARY_S);
	cr_expect_eq(nsaid, 3);
	cr_expect_str_eq(said[0], "127.0.0.1 expired 5");
	cr_expect_str_eq(said[1], "127.0.0.1 bad-signature 1");
	cr_expect_str_eq(said[2], "127.0.0.1 other 1");
	cr_expect_not(spaced_ratelimit_pending(l));
	spaced_ratelimit_flush(l, 100 * S, true);
	cr_expect_eq(calls, 1, "and only once");
	spaced_ratelimit_free(l);
}

Test(ratelimit, past_its_reasons_a_caller_counts_the_rest_as_other_and_nothing_is_lost)
{
	int calls = 0;
	nsaid = 0;
	struct spaced_ratelimit *l = spaced_ratelimit_new(1, 1, 1000, 10000, 64);
	spaced_ratelimit_on_summary(l, note, &calls);
	char why[32];
	cr_assert(spaced_ratelimit_take(l, "198.18.0.9", "r0", S));
	for (int i = 0; i < 20; i++) {
		snprintf(why, sizeof why, "r%d", i);
		cr_expect_not(spaced_ratelimit_take(l, "198.18.0.9", why, S));
	}
	spaced_ratelimit_free(l); /* a flush of all first */
	cr_assert_eq(calls, 1);
	cr_assert_eq(nsaid, SPACED_RATELIMIT_REASONS);
	unsigned long long sum = 0, c;
	for (int i = 0; i < nsaid; i++) {
		char k[64], r[64];
		cr_assert_eq(sscanf(said[i], "%63s %63s %llu", k, r, &c), 3);
		sum += c;
	}
	cr_expect_eq(sum, 20, "every held-back line counted once");
	cr_expect_str_eq(said[SPACED_RATELIMIT_REASONS - 1], "198.18.0.9 other 13", "7 reasons named, 13 as other");
}

Test(ratelimit, callers_are_counted_apart_and_the_port_is_not_part_of_one)
{
	struct spaced_ratelimit *l = spaced_ratelimit_new(1, 3, 1000, 10000, 64);
	cr_expect_eq(taken(l, "198.18.0.1:1", 10, S), 3);
	cr_expect_eq(taken(l, "198.18.0.1:2", 10, S), 0, "another port of the same address: the same caller");
	cr_expect_eq(taken(l, "198.18.0.2:1", 10, S), 3, "another address: its own bucket");
	cr_expect_eq(taken(l, "[fd00::1]:80", 10, S), 3);
	cr_expect_eq(taken(l, "[fd00::1]:81", 10, S), 0);
	cr_expect_eq(taken(l, "fd00:0:0:1::2", 10, S), 3, "a bare IPv6 address of another /64 is another caller");
	cr_expect_eq(taken(l, "fd00:0:0:1::3", 10, S), 0);
	spaced_ratelimit_free(l);
}

Test(ratelimit, many_callers_together_are_held_to_the_total)
{
	struct spaced_ratelimit *l = spaced_ratelimit_new(100, 100, 10, 40, 256);
	char caller[64];
	unsigned n = 0;
	for (int i = 0; i < 1000; i++) {
		snprintf(caller, sizeof caller, "198.18.%d.%d:9", i / 250, i % 250);
		n += taken(l, caller, 1, S);
	}
	cr_expect_eq(n, 40, "a thousand callers at once: the total's burst");
	n = 0;
	for (int i = 0; i < 1000; i++) {
		snprintf(caller, sizeof caller, "198.18.%d.%d:9", i / 250, i % 250);
		n += taken(l, caller, 1, 3 * S);
	}
	cr_expect_eq(n, 20, "two seconds later: the total's rate");
	spaced_ratelimit_free(l);
}

Test(ratelimit, more_callers_than_the_table_holds_stay_bounded_and_the_evicted_are_summarized)
{
	struct spaced_ratelimit *l = spaced_ratelimit_new(1, 1, 1000000, 1000000, 16);
	char caller[64];
	unsigned n = 0;
	for (int i = 0; i < 5000; i++) {
		snprintf(caller, sizeof caller, "198.18.%d.%d", i / 250, i % 250);
		n += taken(l, caller, 2, S);
	}
	cr_expect_eq(n, 5000, "each new caller its first line, the second held back");
	cr_expect_eq(spaced_ratelimit_suppressed_total(l), 5000);
	int calls = 0;
	nsaid = 0;
	spaced_ratelimit_on_summary(l, note, &calls);
	for (int i = 0; i < 100; i++) {
		snprintf(caller, sizeof caller, "198.18.100.%d", i);
		n += taken(l, caller, 2, 2 * S);
	}
	cr_expect_geq(calls, 100 - 16, "a caller whose slot goes to another is summarized first (%d)", calls);
	cr_expect_null(spaced_ratelimit_new(1, 1, 1, 1, 4), "a table smaller than its probe is refused");
	cr_expect_null(spaced_ratelimit_new(0, 1, 1, 1, 64), "a rate of 0 is refused");
	spaced_ratelimit_free(l);
}

static const char *key_of(const char *caller)
{
	static char k[SPACED_CALLER_KEY_MAX];
	spaced_caller_key(caller, k);
	return k;
}

Test(ratelimit, a_caller_is_its_address_and_an_ipv6_one_its_64)
{
	cr_expect_str_eq(key_of("198.18.0.1"), "198.18.0.1");
	cr_expect_str_eq(key_of("198.18.0.1:443"), "198.18.0.1", "the port is not part of it");
	cr_expect_str_eq(key_of("2001:db8:1:2:3:4:5:6"), "2001:db8:1:2::/64");
	cr_expect_str_eq(key_of("[2001:db8:1:2:ffff::1]:8080"), "2001:db8:1:2::/64", "any address of the /64, any port");
	cr_expect_str_neq(key_of("2001:db8:1:3::1"), "2001:db8:1:2::/64", "another /64 is another caller");
	cr_expect_str_eq(key_of("::ffff:198.18.0.7"), "198.18.0.7", "IPv4-mapped: the IPv4 address");
	cr_expect_str_eq(key_of("::1"), "::/64");
	cr_expect_str_eq(key_of("not an address"), "not an address", "anything else as it is");
	cr_expect_str_eq(key_of(""), "");
}

Test(ratelimit, the_addresses_of_one_ipv6_64_share_a_bucket)
{
	struct spaced_ratelimit *l = spaced_ratelimit_new(1, 3, 1000, 10000, 64);
	char caller[64];
	unsigned n = 0;
	for (int i = 0; i < 100; i++) {
		snprintf(caller, sizeof caller, "[2001:db8:0:7::%x]:443", i + 1);
		n += taken(l, caller, 1, S);
	}
	cr_expect_eq(n, 3, "a hundred addresses of one /64: one caller's burst");
	spaced_ratelimit_free(l);
}

Test(share, one_tenant_holds_half_at_most_and_the_last_quarter_stays_for_those_holding_little)
{
	const size_t cap = 1024;
	/* below half in use anyone takes more, however much it holds */
	cr_expect_eq(spaced_fair_share(511, cap, 511, 2), 0);
	/* one tenant alone: refused once half is in use and it holds an eighth */
	cr_expect_eq(spaced_fair_share(512, cap, 512, 2), 1);
	/* past half, a tenant under an eighth still takes more, up to three quarters */
	cr_expect_eq(spaced_fair_share(700, cap, 127, 2), 0);
	cr_expect_eq(spaced_fair_share(700, cap, 128, 2), 1);
	/* past three quarters only one holding less than a 128th (or few, if more) */
	cr_expect_eq(spaced_fair_share(768, cap, 7, 2), 0);
	cr_expect_eq(spaced_fair_share(768, cap, 8, 2), 2);
	cr_expect_eq(spaced_fair_share(768, cap, 8, 16), 0, "few above a 128th raises the bar");
	cr_expect_eq(spaced_fair_share(768, cap, 16, 16), 2);
	/* eight tenants taking all they may, one after the other */
	size_t used = 0, held[8] = {0};
	for (int t = 0; t < 8; t++)
		while (used < cap && spaced_fair_share(used, cap, held[t], 2) == 0) {
			held[t]++;
			used++;
		}
	cr_expect_eq(held[0], 512, "the first tenant alone got half (%zu)", held[0]);
	cr_expect_eq(held[1], 128, "the second an eighth (%zu)", held[1]);
	cr_expect_eq(held[2], 128, "the third an eighth, up to three quarters (%zu)", held[2]);
	for (int t = 3; t < 8; t++)
		cr_expect_eq(held[t], 8, "past three quarters the others a 128th each (%zu)", held[t]);
	cr_expect_eq(used, 768 + 5 * 8, "%zu used", used);
	cr_expect_eq(spaced_fair_share(used, cap, 0, 2), 0, "a tenant holding nothing still gets some");
	cr_expect_neq(spaced_fair_share(used, cap, 512, 2), 0, "the first gets nothing more");
}
