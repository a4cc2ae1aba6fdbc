/*
 * ratelimit.h — how many lines about refused requests a caller may add to a
 * log. Every DENY is audited (the gate's, the gateway's and the control
 * plane's audit logs), so a flood of refused requests from anyone who can
 * reach a port would otherwise fill the disk of a worker or of the control
 * plane. A token bucket per caller address (per_second lines, at most burst at
 * once) and one for all callers together (total_per_second, total_burst) hold
 * it; what is held back is counted and named in the caller's next line
 * ("suppressed": N), and in a total the daemon's metrics show.
 *
 * A caller is its spaced_caller_key. The callers are kept in a table of fixed size (keys): a caller not in it
 * takes the place of the one seen least recently among its neighbours, whose
 * count of held-back lines is then lost (the total keeps it). Not
 * thread-safe: one per thread, or under the caller's lock.
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

/* A limiter for up to keys callers; NULL when out of memory or a figure is 0. */
struct spaced_ratelimit *spaced_ratelimit_new(unsigned per_second, unsigned burst, unsigned total_per_second,
                                              unsigned total_burst, size_t keys);
/* A limiter with the SPACED_AUDIT_DENY_* figures. */
struct spaced_ratelimit *spaced_ratelimit_audit_deny(void);
void spaced_ratelimit_free(struct spaced_ratelimit *l);

/* Whether a line about caller (an address, with or without ":port" or
 * "[v6]:port": spaced_caller_key) may be written at now_ns
 * (CLOCK_MONOTONIC). When it may, *suppressed is how many of caller's lines
 * were held back since its last one written (to be named in it); when not,
 * the line is counted as held back. */
bool spaced_ratelimit_take(struct spaced_ratelimit *l, const char *caller, uint64_t now_ns, uint64_t *suppressed);

/* Every line held back since the limiter was made. */
uint64_t spaced_ratelimit_suppressed_total(const struct spaced_ratelimit *l);

#endif
