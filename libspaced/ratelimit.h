/*
 * ratelimit.h — how many lines about refused requests a caller may add to a
 * log. Every DENY is audited (the gate's, the gateway's and the control
 * plane's audit logs), so a flood of refused requests from anyone who can
 * reach a port would otherwise fill the disk of a worker or of the control
 * plane. A token bucket per caller address (per_second lines, at most burst at
 * once) and one for all callers together (total_per_second, total_burst) hold
 * it. What is held back is counted per caller and reason (up to
 * SPACED_RATELIMIT_REASONS reasons a caller, the rest as "other") and handed
 * to a summary function — the daemon writes it as one line naming the
 * caller and each reason's count — once the caller's first held-back one is
 * SPACED_RATELIMIT_SUMMARY_S old (spaced_ratelimit_flush, from the daemon's
 * tick), when its slot goes to another caller, or on a flush of all. So every
 * refusal is in the log with its caller and reason, one by one or in a
 * count, and a flood adds at most the rate plus a line per caller every few
 * seconds. A total of everything held back is kept for the metrics.
 *
 * A caller is its spaced_caller_key. The callers are kept in a table of fixed
 * size (keys): a caller not in it takes the place of the one seen least
 * recently among its neighbours (whose counts are summarized first). Not
 * thread-safe: one per thread, or under the caller's lock (the summary
 * function runs under it too).
 */
#ifndef SPACED_RATELIMIT_H
#define SPACED_RATELIMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What the daemons use for their audit logs' DENY lines: a caller address
 * 20 a second (200 at once), everyone together 200 a second (2000 at once). */
#define SPACED_AUDIT_DENY_RATE 20
#define SPACED_AUDIT_DENY_BURST 200
#define SPACED_AUDIT_DENY_TOTAL_RATE 200
#define SPACED_AUDIT_DENY_TOTAL_BURST 2000
#define SPACED_AUDIT_DENY_KEYS 1024

/* Who a caller is, for budgets and rates: its address without the port; an
 * IPv6 one by its /64 (one host's or one customer's usual allocation: every
 * address in it is the same caller), an IPv4-mapped one as IPv4. */
#define SPACED_CALLER_KEY_MAX 64
void spaced_caller_key(const char *caller, char out[SPACED_CALLER_KEY_MAX]);

struct spaced_ratelimit;

#define SPACED_RATELIMIT_REASONS 8
#define SPACED_RATELIMIT_REASON_MAX 48
#define SPACED_RATELIMIT_SUMMARY_S 5

/* What was held back of one caller: its key, then n reasons and counts. */
struct spaced_ratelimit_held {
	const char *reason;
	uint64_t count;
};
typedef void (*spaced_ratelimit_summary_fn)(void *ctx, const char *caller, const struct spaced_ratelimit_held *held,
                                            size_t n);

/* The audit line of a summary: {"event":"deny-summary","caller","held_back":
 * {reason: count…},"total"} (a new reference; NULL when out of memory). */
struct json_t;
struct json_t *spaced_ratelimit_summary_json(const char *caller, const struct spaced_ratelimit_held *held, size_t n);

/* A limiter for up to keys callers; NULL when out of memory or a figure is 0. */
struct spaced_ratelimit *spaced_ratelimit_new(unsigned per_second, unsigned burst, unsigned total_per_second,
                                              unsigned total_burst, size_t keys);
/* A limiter with the SPACED_AUDIT_DENY_* figures. */
struct spaced_ratelimit *spaced_ratelimit_audit_deny(void);
/* Summarizes every caller's held-back lines (spaced_ratelimit_flush(l, 0,
 * true)), then frees. */
void spaced_ratelimit_free(struct spaced_ratelimit *l);

/* Where summaries go (none: they are only counted). */
void spaced_ratelimit_on_summary(struct spaced_ratelimit *l, spaced_ratelimit_summary_fn fn, void *ctx);

/* Whether a line about caller (an address, with or without ":port" or
 * "[v6]:port": spaced_caller_key) for reason (NULL: "other") may be written
 * at now_ns (CLOCK_MONOTONIC). When not, it is counted as held back. */
bool spaced_ratelimit_take(struct spaced_ratelimit *l, const char *caller, const char *reason, uint64_t now_ns);

/* Summarizes the callers whose first held-back line is at least
 * SPACED_RATELIMIT_SUMMARY_S old at now_ns, or every caller with lines held
 * back when all. */
void spaced_ratelimit_flush(struct spaced_ratelimit *l, uint64_t now_ns, bool all);

/* Whether some caller has lines held back not yet summarized (a daemon that
 * sleeps until its next event keeps a tick while this is so). */
bool spaced_ratelimit_pending(const struct spaced_ratelimit *l);

/* Every line held back since the limiter was made. */
uint64_t spaced_ratelimit_suppressed_total(const struct spaced_ratelimit *l);

#endif
