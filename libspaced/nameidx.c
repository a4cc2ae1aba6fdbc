/* nameidx.c — names to positions (nameidx.h). */
#include "nameidx.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "spaced_error.h"
#include "util.h"

void spaced_nameidx_init(struct spaced_nameidx *x, spaced_nameidx_name_fn name_of, const void *ctx)
{
	memset(x, 0, sizeof *x);
	x->name_of = name_of;
	x->ctx = ctx;
}

void spaced_nameidx_init_keyed(struct spaced_nameidx *x, spaced_nameidx_name_fn name_of, const void *ctx,
                               const unsigned char *key)
{
	spaced_nameidx_init(x, name_of, ctx);
	x->key = key;
}

/* The slot where a probe for name starts (nslots > 0). */
static size_t home_of(const struct spaced_nameidx *x, const char *name)
{
	uint64_t h;
	if (x->key) {
		unsigned char out[crypto_shorthash_BYTES];
		crypto_shorthash(out, (const unsigned char *)name, strlen(name), x->key);
		memcpy(&h, out, sizeof h);
	} else {
		h = spaced_fnv1a(name);
	}
	return (size_t)h & (x->nslots - 1);
}

/* The slot holding name, or the free slot where it would go (nslots > 0). */
static size_t slot_of(const struct spaced_nameidx *x, const char *name)
{
	size_t mask = x->nslots - 1, i = home_of(x, name);
	while (x->slots[i] != 0 && strcmp(x->name_of(x->ctx, x->slots[i] - 1), name) != 0)
		i = (i + 1) & mask;
	return i;
}

int spaced_nameidx_reserve(struct spaced_nameidx *x, size_t want, size_t n)
{
	if (x->nslots >= 2 * want && x->nslots > 0)
		return 0;
	size_t ns = x->nslots ? x->nslots : 16;
	while (ns < 2 * want) {
		if (ns > SIZE_MAX / 2 / sizeof *x->slots || ns >= UINT32_MAX)
			return SPACED_ENOMEM;
		ns *= 2;
	}
	uint32_t *slots = calloc(ns, sizeof *slots);
	if (!slots)
		return SPACED_ENOMEM;
	free(x->slots);
	x->slots = slots;
	x->nslots = ns;
	for (size_t pos = 0; pos < n; pos++)
		x->slots[slot_of(x, x->name_of(x->ctx, (uint32_t)pos))] = (uint32_t)pos + 1;
	return 0;
}

int64_t spaced_nameidx_get(const struct spaced_nameidx *x, const char *name)
{
	if (x->nslots == 0)
		return -1;
	uint32_t at = x->slots[slot_of(x, name)];
	return at ? (int64_t)at - 1 : -1;
}

void spaced_nameidx_put(struct spaced_nameidx *x, const char *name, uint32_t pos)
{
	if (x->nslots > 0)
		x->slots[slot_of(x, name)] = pos + 1;
}

void spaced_nameidx_del(struct spaced_nameidx *x, const char *name)
{
	if (x->nslots == 0)
		return;
	size_t mask = x->nslots - 1, hole = slot_of(x, name);
	if (x->slots[hole] == 0)
		return;
	/* the entries after the hole, up to a free slot, move back into it unless
	 * their home slot lies after the hole (cyclically): a probe must still
	 * reach each of them before a free slot */
	for (size_t j = (hole + 1) & mask; x->slots[j] != 0; j = (j + 1) & mask) {
		size_t home = home_of(x, x->name_of(x->ctx, x->slots[j] - 1));
		bool stays = hole < j ? home > hole && home <= j : home > hole || home <= j;
		if (!stays) {
			x->slots[hole] = x->slots[j];
			hole = j;
		}
	}
	x->slots[hole] = 0;
}

void spaced_nameidx_free(struct spaced_nameidx *x)
{
	free(x->slots);
	x->slots = NULL;
	x->nslots = 0;
}
