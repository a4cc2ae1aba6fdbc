/* netpolicy.c — egress policies: parsing, canonical JSON, matching (netpolicy.h). */
#include "netpolicy.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spaced_error.h"

#define C(a, b, c, d, n) {((uint32_t)(a) << 24) | ((uint32_t)(b) << 16) | ((uint32_t)(c) << 8) | (uint32_t)(d), n}
const struct spaced_cidr spaced_net_closed_default[] = {
	C(0, 0, 0, 0, 8),     C(10, 0, 0, 0, 8),    C(100, 64, 0, 0, 10), C(127, 0, 0, 0, 8),
	C(169, 254, 0, 0, 16), C(172, 16, 0, 0, 12), C(192, 168, 0, 0, 16), C(224, 0, 0, 0, 3),
};
#undef C
const size_t spaced_net_closed_default_n = sizeof spaced_net_closed_default / sizeof spaced_net_closed_default[0];

void spaced_netpolicy_default(struct spaced_netpolicy *p)
{
	memset(p, 0, sizeof *p);
	p->allow = true;
}

static uint32_t mask_of(uint8_t len)
{
	return len == 0 ? 0 : 0xffffffffu << (32 - len);
}

int spaced_cidr_parse(const char *s, struct spaced_cidr *out)
{
	uint32_t a = 0;
	const char *p = s;
	for (int i = 0; i < 4; i++) {
		if (!isdigit((unsigned char)*p))
			return SPACED_EINVAL;
		unsigned v = 0, nd = 0;
		const char *start = p;
		while (isdigit((unsigned char)*p) && nd < 4) {
			v = v * 10 + (unsigned)(*p - '0');
			p++;
			nd++;
		}
		if (nd == 0 || nd > 3 || v > 255 || (nd > 1 && *start == '0'))
			return SPACED_EINVAL;
		a = (a << 8) | v;
		if (i < 3) {
			if (*p != '.')
				return SPACED_EINVAL;
			p++;
		}
	}
	unsigned len = 32;
	if (*p == '/') {
		p++;
		if (!isdigit((unsigned char)*p) || (p[0] == '0' && p[1] != '\0'))
			return SPACED_EINVAL;
		len = 0;
		for (int nd = 0; isdigit((unsigned char)*p); p++, nd++) {
			if (nd >= 2)
				return SPACED_EINVAL;
			len = len * 10 + (unsigned)(*p - '0');
		}
		if (len > 32)
			return SPACED_EINVAL;
	}
	if (*p != '\0')
		return SPACED_EINVAL;
	out->len = (uint8_t)len;
	out->addr = a & mask_of((uint8_t)len);
	return 0;
}

void spaced_cidr_format(const struct spaced_cidr *c, char *out, size_t outsz)
{
	snprintf(out, outsz, "%u.%u.%u.%u/%u", c->addr >> 24, (c->addr >> 16) & 255, (c->addr >> 8) & 255,
	         c->addr & 255, c->len);
}

bool spaced_cidr_contains(const struct spaced_cidr *c, uint32_t addr)
{
	return (addr & mask_of(c->len)) == c->addr;
}

static int domain_parse(const char *s, char out[SPACED_NET_DOMAIN_MAX])
{
	size_t n = strlen(s);
	if (n > 0 && s[n - 1] == '.')
		n--;
	if (n == 0 || n >= SPACED_NET_DOMAIN_MAX)
		return SPACED_EINVAL;
	size_t label = 0, labels = 1;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (c == '.') {
			if (label == 0 || s[i - 1] == '-')
				return SPACED_EINVAL;
			label = 0;
			labels++;
			continue;
		}
		if (!isalnum((unsigned char)c) && c != '-')
			return SPACED_EINVAL;
		if (c == '-' && label == 0)
			return SPACED_EINVAL;
		if (++label > 63)
			return SPACED_EINVAL;
		out[i] = (char)tolower((unsigned char)c);
	}
	if (label == 0 || s[n - 1] == '-' || labels < 2)
		return SPACED_EINVAL;
	for (size_t i = 0; i < n; i++)
		if (s[i] == '.')
			out[i] = '.';
	out[n] = '\0';
	return 0;
}

int spaced_net_rule_parse(const char *s, struct spaced_net_rule *out)
{
	struct spaced_net_rule r;
	memset(&r, 0, sizeof r);
	if (s == NULL)
		return SPACED_EINVAL;
	if (spaced_cidr_parse(s, &r.cidr) == 0) {
		*out = r;
		return 0;
	}
	/* something that looks numeric but is no valid CIDR is not a domain either */
	bool numeric = true;
	for (const char *p = s; *p; p++)
		if (!isdigit((unsigned char)*p) && *p != '.' && *p != '/')
			numeric = false;
	if (numeric || domain_parse(s, r.domain) < 0)
		return SPACED_EINVAL;
	r.is_domain = true;
	*out = r;
	return 0;
}

static int list_from_json(json_t *a, const char *what, struct spaced_net_rule *list, size_t *n, char *why,
                          size_t whysz)
{
	size_t i;
	json_t *v;
	*n = 0;
	if (a == NULL || json_is_null(a))
		return 0;
	if (!json_is_array(a)) {
		if (why)
			snprintf(why, whysz, "%s must be an array", what);
		return SPACED_EINVAL;
	}
	if (json_array_size(a) > SPACED_NET_RULES_MAX) {
		if (why)
			snprintf(why, whysz, "%s holds more than %d entries", what, SPACED_NET_RULES_MAX);
		return SPACED_EINVAL;
	}
	json_array_foreach(a, i, v) {
		if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v) ||
		    spaced_net_rule_parse(json_string_value(v), &list[*n]) < 0) {
			if (why)
				snprintf(why, whysz, "%s[%zu] is neither an IPv4 CIDR nor a domain name", what, i);
			return SPACED_EINVAL;
		}
		(*n)++;
	}
	return 0;
}

int spaced_netpolicy_from_json(json_t *j, struct spaced_netpolicy *out, char *why, size_t whysz)
{
	struct spaced_netpolicy *np = NULL; /* large: not on small stacks */
	const char *k;
	int e = SPACED_EINVAL;
	json_t *v;
	if (!json_is_object(j)) {
		if (why)
			snprintf(why, whysz, "network must be an object");
		return SPACED_EINVAL;
	}
	json_object_foreach(j, k, v) {
		if (strcmp(k, "mode") != 0 && strcmp(k, "allow_out") != 0 && strcmp(k, "deny_out") != 0) {
			if (why)
				snprintf(why, whysz, "unknown member '%s' in network", k);
			return SPACED_EINVAL;
		}
	}
	const char *mode = json_string_value(json_object_get(j, "mode"));
	if (mode == NULL || (strcmp(mode, "allow") != 0 && strcmp(mode, "deny") != 0)) {
		if (why)
			snprintf(why, whysz, "network.mode must be \"allow\" or \"deny\"");
		return SPACED_EINVAL;
	}
	if ((np = calloc(1, sizeof *np)) == NULL)
		return SPACED_ENOMEM;
	np->allow = strcmp(mode, "allow") == 0;
	if (list_from_json(json_object_get(j, "allow_out"), "allow_out", np->allow_out, &np->nallow, why, whysz) < 0 ||
	    list_from_json(json_object_get(j, "deny_out"), "deny_out", np->deny_out, &np->ndeny, why, whysz) < 0)
		goto out;
	*out = *np;
	e = 0;
out:
	free(np);
	return e;
}

static json_t *list_to_json(const struct spaced_net_rule *list, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; a && i < n; i++) {
		char buf[32];
		if (list[i].is_domain) {
			json_array_append_new(a, json_string(list[i].domain));
		} else {
			spaced_cidr_format(&list[i].cidr, buf, sizeof buf);
			json_array_append_new(a, json_string(buf));
		}
	}
	return a;
}

json_t *spaced_netpolicy_to_json(const struct spaced_netpolicy *p)
{
	return json_pack("{s:s,s:o,s:o}", "mode", p->allow ? "allow" : "deny", "allow_out",
	                 list_to_json(p->allow_out, p->nallow), "deny_out", list_to_json(p->deny_out, p->ndeny));
}

bool spaced_net_domain_match(const struct spaced_net_rule *list, size_t n, const char *name)
{
	char lc[SPACED_NET_DOMAIN_MAX];
	size_t len = strlen(name);
	if (len > 0 && name[len - 1] == '.')
		len--;
	if (len == 0 || len >= sizeof lc)
		return false;
	for (size_t i = 0; i < len; i++)
		lc[i] = (char)tolower((unsigned char)name[i]);
	lc[len] = '\0';
	for (size_t i = 0; i < n; i++) {
		if (!list[i].is_domain)
			continue;
		size_t dl = strlen(list[i].domain);
		if (len == dl && memcmp(lc, list[i].domain, dl) == 0)
			return true;
		if (len > dl && lc[len - dl - 1] == '.' && memcmp(lc + len - dl, list[i].domain, dl) == 0)
			return true;
	}
	return false;
}

bool spaced_net_cidr_match(const struct spaced_net_rule *list, size_t n, uint32_t addr)
{
	for (size_t i = 0; i < n; i++)
		if (!list[i].is_domain && spaced_cidr_contains(&list[i].cidr, addr))
			return true;
	return false;
}

bool spaced_net_closed(uint32_t addr)
{
	for (size_t i = 0; i < spaced_net_closed_default_n; i++)
		if (spaced_cidr_contains(&spaced_net_closed_default[i], addr))
			return true;
	return false;
}
