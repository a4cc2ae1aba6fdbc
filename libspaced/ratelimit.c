/* ratelimit.c — token buckets per caller for audit lines (ratelimit.h). */
#include "ratelimit.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#define PROBE 8    /* neighbours looked at for a caller's slot */

struct bucket {
	double tokens;
	uint64_t last_ns;
};

struct slot {
	char key[SPACED_CALLER_KEY_MAX];
	struct bucket b;
	bool used;
	/* held back, by reason, since first_held_ns */
	uint64_t first_held_ns;
	size_t nheld;
	char reason[SPACED_RATELIMIT_REASONS][SPACED_RATELIMIT_REASON_MAX];
	uint64_t count[SPACED_RATELIMIT_REASONS];
};

struct spaced_ratelimit {
	double rate, burst, total_rate, total_burst;
	struct bucket total;
	struct slot *slots;
	size_t n;
	size_t pending; /* slots with lines held back */
	uint64_t suppressed_total;
	spaced_ratelimit_summary_fn summary;
	void *summary_ctx;
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

/* Hands s's held-back counts to the summary function and clears them. */
static void summarize(struct spaced_ratelimit *l, struct slot *s)
{
	if (s->nheld == 0)
		return;
	struct spaced_ratelimit_held h[SPACED_RATELIMIT_REASONS];
	for (size_t i = 0; i < s->nheld; i++) {
		h[i].reason = s->reason[i];
		h[i].count = s->count[i];
	}
	if (l->summary)
		l->summary(l->summary_ctx, s->key, h, s->nheld);
	s->nheld = 0;
	l->pending--;
}

void spaced_ratelimit_flush(struct spaced_ratelimit *l, uint64_t now_ns, bool all)
{
	if (!l || l->pending == 0)
		return;
	uint64_t age = (uint64_t)SPACED_RATELIMIT_SUMMARY_S * 1000000000ull;
	for (size_t i = 0; i < l->n && l->pending > 0; i++) {
		struct slot *s = &l->slots[i];
		if (s->nheld && (all || now_ns - s->first_held_ns >= age))
			summarize(l, s);
	}
}

bool spaced_ratelimit_pending(const struct spaced_ratelimit *l)
{
	return l && l->pending > 0;
}

void spaced_ratelimit_on_summary(struct spaced_ratelimit *l, spaced_ratelimit_summary_fn fn, void *ctx)
{
	l->summary = fn;
	l->summary_ctx = ctx;
}

void spaced_ratelimit_free(struct spaced_ratelimit *l)
{
	if (l) {
		spaced_ratelimit_flush(l, 0, true);
		free(l->slots);
	}
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
	summarize(l, oldest); /* what it held back is written before its slot goes */
	memset(oldest, 0, sizeof *oldest);
	oldest->used = true;
	snprintf(oldest->key, sizeof oldest->key, "%s", key);
	oldest->b.tokens = l->burst;
	oldest->b.last_ns = now_ns;
	return oldest;
}

static size_t reason_at(const struct slot *s, const char *reason)
{
	size_t i = 0;
	while (i < s->nheld && strcmp(s->reason[i], reason) != 0)
		i++;
	return i;
}

/* Counts one held-back line of s for reason (past SPACED_RATELIMIT_REASONS - 1
 * reasons, as "other": only "other" takes the table's last entry). */
static void hold(struct spaced_ratelimit *l, struct slot *s, const char *reason, uint64_t now_ns)
{
	if (!reason || !reason[0])
		reason = "other";
	size_t i = reason_at(s, reason);
	if (i == s->nheld && s->nheld >= SPACED_RATELIMIT_REASONS - 1)
		i = reason_at(s, reason = "other");
	if (i == s->nheld) {
		if (s->nheld == 0) {
			s->first_held_ns = now_ns;
			l->pending++;
		}
		snprintf(s->reason[i], sizeof s->reason[i], "%s", reason);
		s->count[i] = 0;
		s->nheld++;
	}
	s->count[i]++;
	l->suppressed_total++;
}

bool spaced_ratelimit_take(struct spaced_ratelimit *l, const char *caller, const char *reason, uint64_t now_ns)
{
	char key[SPACED_CALLER_KEY_MAX];
	spaced_caller_key(caller, key);
	struct slot *s = slot_of(l, key, now_ns);
	refill(&s->b, l->rate, l->burst, now_ns);
	refill(&l->total, l->total_rate, l->total_burst, now_ns);
	if (s->b.tokens < 1 || l->total.tokens < 1) {
		hold(l, s, reason, now_ns);
		return false;
	}
	s->b.tokens -= 1;
	l->total.tokens -= 1;
	return true;
}

uint64_t spaced_ratelimit_suppressed_total(const struct spaced_ratelimit *l)
{
	return l ? l->suppressed_total : 0;
}

json_t *spaced_ratelimit_summary_json(const char *caller, const struct spaced_ratelimit_held *held, size_t n)
{
	json_t *by = json_object();
	uint64_t total = 0;
	for (size_t i = 0; i < n; i++) {
		json_object_set_new(by, held[i].reason, json_integer((json_int_t)held[i].count));
		total += held[i].count;
	}
	return json_pack("{s:s,s:s,s:o,s:I}", "event", "deny-summary", "caller", caller, "held_back", by, "total",
	                 (json_int_t)total);
}
