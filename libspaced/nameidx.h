/*
 * nameidx.h — an index from names to positions in an array its owner keeps
 * (open addressing with linear probing). The index holds positions only; it
 * reads each entry's name back through name_of, so the array may move
 * (realloc) under it. Names are hashed with FNV-1a, unkeyed, for names a
 * tenant does not choose (sandbox IDs the control plane issues), or with
 * SipHash under a secret key for names it does (a template's file names):
 * nobody can then choose names that share a probe run.
 */
#ifndef SPACED_NAMEIDX_H
#define SPACED_NAMEIDX_H

#include <stddef.h>
#include <stdint.h>

/* The name at position pos of the owner's array (ctx). */
typedef const char *(*spaced_nameidx_name_fn)(const void *ctx, uint32_t pos);

struct spaced_nameidx {
	uint32_t *slots; /* 0: free, else a position plus one */
	size_t nslots;   /* 0 or a power of two */
	spaced_nameidx_name_fn name_of;
	const void *ctx;
	const unsigned char *key; /* NULL: FNV-1a; else crypto_shorthash_KEYBYTES of SipHash key */
};

/* An empty index reading names through name_of(ctx, pos). */
void spaced_nameidx_init(struct spaced_nameidx *x, spaced_nameidx_name_fn name_of, const void *ctx);

/* The same, hashing names with SipHash under key (crypto_shorthash_KEYBYTES,
 * held by the caller for as long as the index lives). */
void spaced_nameidx_init_keyed(struct spaced_nameidx *x, spaced_nameidx_name_fn name_of, const void *ctx,
                               const unsigned char *key);

/* Makes room for want entries (at least twice as many slots), indexing
 * positions 0..n-1 of the array again when it grows: 0, or SPACED_ENOMEM
 * with the index as it was. */
int spaced_nameidx_reserve(struct spaced_nameidx *x, size_t want, size_t n);

/* The position of name, or -1. */
int64_t spaced_nameidx_get(const struct spaced_nameidx *x, const char *name);

/* name is at pos from now on (added when absent; room reserved before). */
void spaced_nameidx_put(struct spaced_nameidx *x, const char *name, uint32_t pos);

/* name is no longer indexed (nothing happens when it was not). */
void spaced_nameidx_del(struct spaced_nameidx *x, const char *name);

void spaced_nameidx_free(struct spaced_nameidx *x);

#endif
