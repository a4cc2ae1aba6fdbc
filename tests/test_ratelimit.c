/*
 * test_ratelimit.c — libspaced/ratelimit.h: the audit log's DENY lines are
 * held to a rate per caller address and for all callers together, and what
 * is held back is counted and named in the caller's next line. Time is
 * given, not measured: nothing here depends on the machine's speed.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "ratelimit.h"

#define S 1000000000ull

static unsigned taken(struct spaced_ratelimit *l, const char *caller, unsigned tries, uint64_t now)
{
	unsigned n = 0;
	uint64_t sup;
	for (unsigned i = 0; i < tries; i++)
		n += spaced_ratelimit_take(l, caller, now, &sup);
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

Test(ratelimit, the_held_back_lines_are_named_in_the_next_one)
{
	struct spaced_ratelimit *l = spaced_ratelimit_new(1, 2, 1000, 10000, 64);
	uint64_t sup = 99;
	cr_assert(spaced_ratelimit_take(l, "127.0.0.1:1", S, &sup));
	cr_expect_eq(sup, 0);
	cr_assert(spaced_ratelimit_take(l, "127.0.0.1:2", S, &sup));
	for (int i = 0; i < 7; i++)
		cr_expect_not(spaced_ratelimit_take(l, "127.0.0.1:3", S, &sup));
	cr_expect_eq(spaced_ratelimit_suppressed_total(l), 7);
	cr_assert(spaced_ratelimit_take(l, "127.0.0.1:4", 2 * S, &sup), "a second later, one more");
	cr_expect_eq(sup, 7, "it names the seven held back");
	cr_assert(spaced_ratelimit_take(l, "127.0.0.1:5", 3 * S, &sup));
	cr_expect_eq(sup, 0, "and only once");
	spaced_ratelimit_free(l);
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

Test(ratelimit, more_callers_than_the_table_holds_stay_bounded)
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
