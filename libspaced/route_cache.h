/*
 * route_cache.h — the client's route cache (V2, V3, V4).
 *
 * A route is what the control plane answers for a sandbox: the selected
 * execution identity, the worker's address and a capability for some purposes.
 * Clients keep one entry per sandbox and send requests through it until the
 * capability nears expiry, the entry's own expiry passes (the caller's
 * authorization), or a receiver answers REFRESH_ROUTE.
 *
 * After a REFRESH_ROUTE the client resolves the route again and replaces the
 * entry only if it still holds the route that was refused (compare-and-swap,
 * V3), so a late rejection never evicts a newer entry; the replacement keeps
 * the entry's original expiry (V4: route repair does not renew the caller's
 * authorization). Thread-safe.
 */
#ifndef SPACED_ROUTE_CACHE_H
#define SPACED_ROUTE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "identity.h"

#define SPACED_URL_MAX 256
/* A capability is not used in its last seconds: it could expire in flight. */
#define SPACED_ROUTE_EXPIRY_MARGIN 5

struct spaced_route {
	struct spaced_identity id;
	char worker_url[SPACED_URL_MAX];
	char *capability;        /* owned, NUL-terminated */
	int64_t cap_expires_at;  /* Unix seconds */
	uint32_t purposes;       /* enum spaced_purpose bits the capability grants */
};

/* Deep copy of src into *dst (dst's previous contents are not freed). */
int spaced_route_copy(struct spaced_route *dst, const struct spaced_route *src);

/* Frees the capability and zeroes the route; accepts NULL. */
void spaced_route_clear(struct spaced_route *r);

struct spaced_route_cache;

/* A cache of at most max_entries sandboxes (the entry that expires first is
 * evicted when full). */
int spaced_route_cache_new(struct spaced_route_cache **out, size_t max_entries);
void spaced_route_cache_free(struct spaced_route_cache *c);

/* A copy of the entry for sandbox when it grants every bit of purposes, its
 * capability is valid for more than SPACED_ROUTE_EXPIRY_MARGIN seconds after
 * now and the entry itself has not expired. Returns 0 (free *out with
 * spaced_route_clear) or SPACED_ENOENT. */
int spaced_route_cache_get(struct spaced_route_cache *c, const char *sandbox, uint32_t purposes,
                           int64_t now, struct spaced_route *out);

/* Stores a route resolved after a miss, with the entry's own expiry
 * (entry_expires_at, the caller's authorization). Replaces what was there. */
int spaced_route_cache_put(struct spaced_route_cache *c, const struct spaced_route *r,
                           int64_t entry_expires_at);

/* V3/V4: replaces the entry for fresh->id.sandbox with fresh only when it still
 * holds `refused` (same capability), keeping the entry's expiry. Returns 0 when
 * replaced, SPACED_ESTALE when the entry holds another route (a newer one:
 * left alone), SPACED_ENOENT when there is no entry. */
int spaced_route_cache_replace(struct spaced_route_cache *c, const struct spaced_route *refused,
                               const struct spaced_route *fresh);

/* Drops the entry for sandbox when it still holds `refused` (after a DENY).
 * Returns 0 when dropped, SPACED_ESTALE or SPACED_ENOENT otherwise. */
int spaced_route_cache_drop(struct spaced_route_cache *c, const struct spaced_route *refused);

/* The expiry of the entry for sandbox (for tests and tools), or SPACED_ENOENT. */
int spaced_route_cache_entry_expiry(struct spaced_route_cache *c, const char *sandbox, int64_t *out);

#endif
