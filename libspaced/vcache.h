/*
 * vcache.h — the verification cache. Tokens that verified are remembered by
 * BLAKE2b-256 of (class, token) until their expiry plus the skew, in a bounded
 * set-associative table. A hit skips the signature check and nothing else: the
 * caller still checks times and always compares identities. The cache is
 * flushed whenever the keyring's epoch changes. Thread-safe.
 */
#ifndef SPACED_VCACHE_H
#define SPACED_VCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "cap.h"

#define SPACED_VCACHE_DIGEST 32

struct spaced_vcache;

/* A cache of at most `capacity` entries (rounded up to a multiple of the set
 * size; at least one set). */
int spaced_vcache_new(struct spaced_vcache **out, size_t capacity);

/* Frees; accepts NULL. */
void spaced_vcache_free(struct spaced_vcache *c);

/* The cache key of a token presented for class cls. */
void spaced_vcache_digest(enum spaced_cap_class cls, const char *token, size_t len,
                          uint8_t digest[SPACED_VCACHE_DIGEST]);

/* Looks a digest up. When keyring_epoch differs from the epoch of the cached
 * entries, everything is flushed first. Entries past exp + skew are dropped.
 * Returns 0 with *out filled, or SPACED_ENOENT. */
int spaced_vcache_get(struct spaced_vcache *c, uint64_t keyring_epoch,
                      const uint8_t digest[SPACED_VCACHE_DIGEST], int64_t now, struct spaced_cap *out);

/* Remembers a verified capability, verified with keys of keyring_epoch (an
 * entry from an older epoch than the cache's is not stored; a newer epoch
 * flushes the cache first). Evicts the entry that expires first in its set. */
void spaced_vcache_put(struct spaced_vcache *c, uint64_t keyring_epoch,
                       const uint8_t digest[SPACED_VCACHE_DIGEST], const struct spaced_cap *cap);

/* Drops every entry. */
void spaced_vcache_flush(struct spaced_vcache *c);

/* Counters since creation. */
struct spaced_vcache_stats {
	uint64_t hits, misses, inserts, evictions, flushes;
	size_t entries, capacity;
};
void spaced_vcache_stats(struct spaced_vcache *c, struct spaced_vcache_stats *out);

#endif
