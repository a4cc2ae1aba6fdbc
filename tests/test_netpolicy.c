/* test_netpolicy.c — egress policies (libspaced/netpolicy.h; DESIGN §6 "Network"). */
#include <criterion/criterion.h>
#include <string.h>

#include "spaced_error.h"
#include "netpolicy.h"

static uint32_t ip(unsigned a, unsigned b, unsigned c, unsigned d)
{
	return (a << 24) | (b << 16) | (c << 8) | d;
}

Test(netpolicy, cidr_strict)
{
	struct spaced_cidr c;
	cr_assert_eq(spaced_cidr_parse("198.18.0.0/15", &c), 0);
	cr_assert_eq(c.addr, ip(198, 18, 0, 0));
	cr_assert_eq(c.len, 15);
	cr_assert_eq(spaced_cidr_parse("10.1.2.3/8", &c), 0, "host bits are cleared");
	cr_assert_eq(c.addr, ip(10, 0, 0, 0));
	cr_assert_eq(spaced_cidr_parse("1.2.3.4", &c), 0);
	cr_assert_eq(c.len, 32);
	const char *bad[] = {"", "1.2.3", "1.2.3.4.5", "01.2.3.4", "1.2.3.256", "1.2.3.4/33", "1.2.3.4/", "1.2.3.4/08",
	                     "1.2.3.4/8x", " 1.2.3.4", "1.2.3.4 ", "a.b.c.d", "1..2.3", "1.2.3.4/-1", "::1"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		cr_expect_eq(spaced_cidr_parse(bad[i], &c), SPACED_EINVAL, "'%s' accepted", bad[i]);
}

Test(netpolicy, rules_and_domains)
{
	struct spaced_net_rule r;
	cr_assert_eq(spaced_net_rule_parse("PyPI.org.", &r), 0);
	cr_assert(r.is_domain);
	cr_assert_str_eq(r.domain, "pypi.org");
	const char *bad[] = {"localhost", "-a.com", "a-.com", "a..com", "a_b.com", "1.2.3.4/40", "999.1.1.1", ".com",
	                     "a.com/8", "*.a.com", "a. com"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		cr_expect_eq(spaced_net_rule_parse(bad[i], &r), SPACED_EINVAL, "'%s' accepted", bad[i]);
	char long_label[80];
	memset(long_label, 'a', 64);
	strcpy(long_label + 64, ".com");
	cr_expect_eq(spaced_net_rule_parse(long_label, &r), SPACED_EINVAL, "a 64-character label accepted");
}

Test(netpolicy, json_strict_and_canonical)
{
	json_error_t jerr;
	struct spaced_netpolicy p;
	char why[160];
	json_t *j = json_loads("{\"mode\":\"deny\",\"allow_out\":[\"Example.COM\",\"10.0.0.1/8\"],\"deny_out\":[]}", 0, &jerr);
	cr_assert_eq(spaced_netpolicy_from_json(j, &p, why, sizeof why), 0, "%s", why);
	json_decref(j);
	cr_assert(!p.allow);
	json_t *c = spaced_netpolicy_to_json(&p);
	char *s = json_dumps(c, JSON_COMPACT);
	cr_assert_str_eq(s, "{\"mode\":\"deny\",\"allow_out\":[\"example.com\",\"10.0.0.0/8\"],\"deny_out\":[]}");
	free(s);
	json_decref(c);
	const char *bad[] = {"{}", "{\"mode\":\"open\"}", "{\"mode\":\"allow\",\"extra\":1}", "{\"mode\":\"allow\",\"allow_out\":\"x.com\"}",
	                     "{\"mode\":\"allow\",\"allow_out\":[1]}", "[]", "{\"mode\":\"allow\",\"deny_out\":[\"nope\"]}"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		j = json_loads(bad[i], 0, &jerr);
		cr_expect_eq(spaced_netpolicy_from_json(j, &p, why, sizeof why), SPACED_EINVAL, "'%s' accepted", bad[i]);
		json_decref(j);
	}
	/* more than the rule limit */
	json_t *big = json_pack("{s:s,s:[]}", "mode", "allow", "allow_out");
	for (int i = 0; i <= SPACED_NET_RULES_MAX; i++)
		json_array_append_new(json_object_get(big, "allow_out"), json_string("1.2.3.4"));
	cr_expect_eq(spaced_netpolicy_from_json(big, &p, why, sizeof why), SPACED_EINVAL);
	json_decref(big);
}

Test(netpolicy, matching)
{
	struct spaced_net_rule list[3];
	cr_assert_eq(spaced_net_rule_parse("allowed.test", &list[0]), 0);
	cr_assert_eq(spaced_net_rule_parse("198.18.0.0/15", &list[1]), 0);
	cr_assert_eq(spaced_net_rule_parse("ex-ample.org", &list[2]), 0);
	cr_expect(spaced_net_domain_match(list, 3, "allowed.test"));
	cr_expect(spaced_net_domain_match(list, 3, "WWW.Allowed.Test."));
	cr_expect(!spaced_net_domain_match(list, 3, "notallowed.test"), "a suffix that is not a label boundary matched");
	cr_expect(!spaced_net_domain_match(list, 3, "allowed.test.evil.com"));
	cr_expect(!spaced_net_domain_match(list, 3, "test"));
	cr_expect(spaced_net_cidr_match(list, 3, ip(198, 19, 255, 255)));
	cr_expect(!spaced_net_cidr_match(list, 3, ip(198, 20, 0, 0)));
	/* the default closed set */
	cr_expect(spaced_net_closed(ip(127, 0, 0, 1)));
	cr_expect(spaced_net_closed(ip(10, 255, 255, 53)));
	cr_expect(spaced_net_closed(ip(169, 254, 169, 254)), "the metadata address is closed");
	cr_expect(spaced_net_closed(ip(100, 88, 0, 1)), "the sandboxes' own pool is closed");
	cr_expect(spaced_net_closed(ip(172, 31, 0, 1)));
	cr_expect(spaced_net_closed(ip(192, 168, 1, 1)));
	cr_expect(spaced_net_closed(ip(224, 0, 0, 251)));
	cr_expect(spaced_net_closed(ip(0, 0, 0, 0)));
	cr_expect(!spaced_net_closed(ip(198, 18, 0, 1)), "198.18.0.0/15 stays open (DESIGN §6)");
	cr_expect(!spaced_net_closed(ip(8, 8, 8, 8)));
}
