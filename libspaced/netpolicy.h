/*
 * netpolicy.h — a sandbox's egress policy (DESIGN §6 "Network", docs/network.md).
 *
 * JSON form, as stored with the sandbox and sent to workers:
 *   {"mode": "allow" | "deny", "allow_out": [X, …], "deny_out": [X, …]}
 * X is an IPv4 CIDR ("198.18.0.0/15", a bare address is a /32) or a domain
 * name ("example.com": the name and every name under it). Pure code, no I/O:
 * the control plane validates with it, the worker's egress code turns it into
 * packet-filter rules, the worker's resolver matches names with it.
 */
#ifndef SPACED_NETPOLICY_H
#define SPACED_NETPOLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define SPACED_NET_RULES_MAX 64   /* entries per list */
#define SPACED_NET_DOMAIN_MAX 254 /* a domain's length, NUL included */

struct spaced_cidr {
	uint32_t addr; /* host byte order, host bits cleared */
	uint8_t len;   /* 0 … 32 */
};

struct spaced_net_rule {
	bool is_domain;
	struct spaced_cidr cidr;
	char domain[SPACED_NET_DOMAIN_MAX]; /* lower case, no trailing dot */
};

struct spaced_netpolicy {
	bool allow;                 /* mode "allow": public addresses are reachable */
	size_t nallow, ndeny;
	struct spaced_net_rule allow_out[SPACED_NET_RULES_MAX];
	struct spaced_net_rule deny_out[SPACED_NET_RULES_MAX];
};

/* The closed set every worker keeps (an allow_out CIDR opens a part of it
 * only where the worker's operator made that part openable, --net-openable):
 * "this network", loopback, link-local, RFC 1918, 100.64/10 (shared address
 * space), multicast and the reserved range above it. The worker adds its own
 * addresses. 198.18.0.0/15 is deliberately not in it (DESIGN §6). */
extern const struct spaced_cidr spaced_net_closed_default[];
extern const size_t spaced_net_closed_default_n;

/* The default policy of a sandbox created without one: mode allow, no lists. */
void spaced_netpolicy_default(struct spaced_netpolicy *p);

/* Parses "a.b.c.d" or "a.b.c.d/n" strictly (no leading zeros, n ≤ 32); host
 * bits are cleared. Returns 0 or SPACED_EINVAL. */
int spaced_cidr_parse(const char *s, struct spaced_cidr *out);

/* Writes "a.b.c.d/n" into out (at least 19 bytes). */
void spaced_cidr_format(const struct spaced_cidr *c, char *out, size_t outsz);

bool spaced_cidr_contains(const struct spaced_cidr *c, uint32_t addr);

/* Parses one list entry: a CIDR, or a domain name (1–253 characters, labels
 * of 1–63 of [A-Za-z0-9-] not starting or ending with '-', at least two
 * labels, a trailing dot dropped; kept in lower case). */
int spaced_net_rule_parse(const char *s, struct spaced_net_rule *out);

/* Reads a policy object: mode required ("allow"|"deny"), the lists optional,
 * unknown members refused; why (may be NULL) says what was wrong. *out is
 * written only on success. Returns 0 or SPACED_EINVAL. */
int spaced_netpolicy_from_json(json_t *j, struct spaced_netpolicy *out, char *why, size_t whysz);

/* The policy as a new canonical JSON object (NULL on allocation failure). */
json_t *spaced_netpolicy_to_json(const struct spaced_netpolicy *p);

/* True when name (any case, a trailing dot allowed) is the domain of a
 * domain rule of list[0..n) or a name under it. */
bool spaced_net_domain_match(const struct spaced_net_rule *list, size_t n, const char *name);

/* True when addr (host order) is in a CIDR rule of list[0..n). */
bool spaced_net_cidr_match(const struct spaced_net_rule *list, size_t n, uint32_t addr);

/* True when addr is in the default closed set. */
bool spaced_net_closed(uint32_t addr);

#endif
