/* ratelimit.c — token buckets per caller for audit lines (ratelimit.h). */
#include "ratelimit.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROBE 8    /* neighbours looked at for a caller's slot */

struct bucket {
	double tokens;
	uint64_t last_ns;
};

struct slot {
	char key[SPACED_CALLER_KEY_MAX];
	struct bucket b;
	uint64_t suppressed;
	bool used;
};

struct spaced_ratelimit {
	double rate, burst, total_rate, total_burst;
	struct bucket total;
	struct slot *slots;
	size_t n;
	uint64_t suppressed_total;
};

struct spaced_ratelimit *spaced_ratelimit_new(unsigned per_second, unsigned burst, unsigned total_per_second,
                                              unsigned total_burst, size_t keys)
{
	if (!per_second || !burst || !total_per_second || !total_burst || keys < PROBE)
		return NULL;
	struct spaced_ratelimit *l = calloc(1, sizeof *l);
	if (!l || !(l->slots = calloc(keys, sizeof *l->slots))) {
		free(l);
		return NULL;
	}
	l->n = keys;
	l->rate = per_second;
	l->burst = burst;
	l->total_rate = total_per_second;
	l->total_burst = total_burst;
	l->total.tokens = total_burst;
	return l;
}

struct spaced_ratelimit *spaced_ratelimit_audit_deny(void)
{
	return spaced_ratelimit_new(SPACED_AUDIT_DENY_RATE, SPACED_AUDIT_DENY_BURST, SPACED_AUDIT_DENY_TOTAL_RATE,
	                            SPACED_AUDIT_DENY_TOTAL_BURST, SPACED_AUDIT_DENY_KEYS);
}

void spaced_ratelimit_free(struct spaced_ratelimit *l)
{
	if (l)
		free(l->slots);
	free(l);
}

void spaced_caller_key(const char *caller, char out[SPACED_CALLER_KEY_MAX])
{
	/* the address part: "a.b.c.d:port" → "a.b.c.d", "[v6]:port" → "v6" */
	char addr[SPACED_CALLER_KEY_MAX];
	const char *s = caller ? caller : "";
	size_t n = strlen(s);
	if (s[0] == '[') {
		const char *end = strchr(s, ']');
		s++;
		n = end ? (size_t)(end - s) : strlen(s);
	} else {
		const char *colon = strchr(s, ':');
		if (colon && !strchr(colon + 1, ':')) /* one colon: address:port (a bare IPv6 address has several) */
			n = (size_t)(colon - s);
	}
	if (n >= sizeof addr)
		n = sizeof addr - 1;
	memcpy(addr, s, n);
	addr[n] = 0;
	struct in6_addr a6;
	if (inet_pton(AF_INET6, addr, &a6) == 1) {
		if (IN6_IS_ADDR_V4MAPPED(&a6)) {
			if (inet_ntop(AF_INET, &a6.s6_addr[12], out, SPACED_CALLER_KEY_MAX))
				return;
		} else {
			memset(&a6.s6_addr[8], 0, 8);
			char p[INET6_ADDRSTRLEN];
			if (inet_ntop(AF_INET6, &a6, p, sizeof p)) {
				snprintf(out, SPACED_CALLER_KEY_MAX, "%s/64", p);
				return;
			}
		}
	}
	memcpy(out, addr, n + 1);
}

static uint64_t fnv1a(const char *s)
{
	uint64_t h = 14695981039346656037ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

static void refill(struct bucket *b, double rate, double burst, uint64_t now_ns)
{
	if (now_ns > b->last_ns) {
		b->tokens += (double)(now_ns - b->last_ns) * rate / 1e9;
		if (b->tokens > burst)
			b->tokens = burst;
	}
	b->last_ns = now_ns;
}

/* caller's slot: its own, else a free one among its neighbours, else the
 * neighbour seen least recently (reset for it) */
static struct slot *slot_of(struct spaced_ratelimit *l, const char *key, uint64_t now_ns)
{
	size_t h = (size_t)(fnv1a(key) % l->n);
	struct slot *oldest = NULL;
	for (size_t i = 0; i < PROBE; i++) {
		struct slot *s = &l->slots[(h + i) % l->n];
		if (s->used && strcmp(s->key, key) == 0)
			return s;
		if (!oldest || (oldest->used && (!s->used || s->b.last_ns < oldest->b.last_ns)))
			oldest = s;
	}
	memset(oldest, 0, sizeof *oldest);
	oldest->used = true;
	snprintf(oldest->key, sizeof oldest->key, "%s", key);
	oldest->b.tokens = l->burst;
	oldest->b.last_ns = now_ns;
	return oldest;
}

bool spaced_ratelimit_take(struct spaced_ratelimit *l, const char *caller, uint64_t now_ns, uint64_t *suppressed)
{
	char key[SPACED_CALLER_KEY_MAX];
	spaced_caller_key(caller, key);
	struct slot *s = slot_of(l, key, now_ns);
	refill(&s->b, l->rate, l->burst, now_ns);
	refill(&l->total, l->total_rate, l->total_burst, now_ns);
	*suppressed = 0;
	if (s->b.tokens < 1 || l->total.tokens < 1) {
		s->suppressed++;
		l->suppressed_total++;
		return false;
	}
	s->b.tokens -= 1;
	l->total.tokens -= 1;
	*suppressed = s->suppressed;
	s->suppressed = 0;
	return true;
}

uint64_t spaced_ratelimit_suppressed_total(const struct spaced_ratelimit *l)
{
	return l ? l->suppressed_total : 0;
}
