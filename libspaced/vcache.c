/* vcache.c — bounded, set-associative cache of verified capabilities. */
#include "vcache.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "spaced_error.h"
#include "util.h"

#define WAYS 4

struct entry {
	bool used;
	uint8_t digest[SPACED_VCACHE_DIGEST];
	int64_t deadline; /* exp + skew */
	struct spaced_cap cap;
};

struct spaced_vcache {
	pthread_mutex_t lock;
	size_t sets;
	uint64_t epoch;
	struct spaced_vcache_stats st;
	struct entry *entries; /* sets * WAYS */
};

int spaced_vcache_new(struct spaced_vcache **out, size_t capacity)
{
	struct spaced_vcache *c = calloc(1, sizeof *c);
	if (c == NULL)
		return SPACED_ENOMEM;
	c->sets = (capacity + WAYS - 1) / WAYS;
	if (c->sets == 0)
		c->sets = 1;
	c->entries = calloc(c->sets * WAYS, sizeof *c->entries);
	if (c->entries == NULL || pthread_mutex_init(&c->lock, NULL) != 0) {
		free(c->entries);
		free(c);
		return SPACED_ENOMEM;
	}
	c->st.capacity = c->sets * WAYS;
	*out = c;
	return SPACED_OK;
}

void spaced_vcache_free(struct spaced_vcache *c)
{
	if (c == NULL)
		return;
	pthread_mutex_destroy(&c->lock);
	free(c->entries);
	free(c);
}

void spaced_vcache_digest(enum spaced_cap_class cls, const char *token, size_t len,
                          uint8_t digest[SPACED_VCACHE_DIGEST])
{
	crypto_generichash_state st;
	uint8_t tag = (uint8_t)cls;
	crypto_generichash_init(&st, NULL, 0, SPACED_VCACHE_DIGEST);
	crypto_generichash_update(&st, &tag, 1);
	crypto_generichash_update(&st, (const uint8_t *)token, len);
	crypto_generichash_final(&st, digest, SPACED_VCACHE_DIGEST);
}

static struct entry *set_of(struct spaced_vcache *c, const uint8_t *digest)
{
	uint64_t h;
	memcpy(&h, digest, sizeof h);
	return &c->entries[(h % c->sets) * WAYS];
}

static void flush_locked(struct spaced_vcache *c)
{
	memset(c->entries, 0, c->sets * WAYS * sizeof *c->entries);
	c->st.entries = 0;
	c->st.flushes++;
}

/* Moves the cache to a newer keyring epoch, flushing what older keys verified. */
static void sync_epoch_locked(struct spaced_vcache *c, uint64_t epoch)
{
	if (epoch > c->epoch) {
		if (c->st.entries > 0)
			flush_locked(c);
		c->epoch = epoch;
	}
}

int spaced_vcache_get(struct spaced_vcache *c, uint64_t keyring_epoch,
                      const uint8_t digest[SPACED_VCACHE_DIGEST], int64_t now, struct spaced_cap *out)
{
	int r = SPACED_ENOENT;
	pthread_mutex_lock(&c->lock);
	sync_epoch_locked(c, keyring_epoch);
	if (keyring_epoch == c->epoch) {
		struct entry *set = set_of(c, digest);
		for (int w = 0; w < WAYS; w++) {
			struct entry *e = &set[w];
			if (!e->used || memcmp(e->digest, digest, SPACED_VCACHE_DIGEST) != 0)
				continue;
			if (now > e->deadline) {
				e->used = false;
				c->st.entries--;
				break;
			}
			*out = e->cap;
			r = SPACED_OK;
			break;
		}
	}
	if (r == 0)
		c->st.hits++;
	else
		c->st.misses++;
	pthread_mutex_unlock(&c->lock);
	return r;
}

void spaced_vcache_put(struct spaced_vcache *c, uint64_t keyring_epoch,
                       const uint8_t digest[SPACED_VCACHE_DIGEST], const struct spaced_cap *cap)
{
	pthread_mutex_lock(&c->lock);
	sync_epoch_locked(c, keyring_epoch);
	if (keyring_epoch != c->epoch)
		goto out; /* verified with keys that have since been replaced */
	struct entry *set = set_of(c, digest), *victim = NULL;
	for (int w = 0; w < WAYS; w++) {
		struct entry *e = &set[w];
		if (e->used && memcmp(e->digest, digest, SPACED_VCACHE_DIGEST) == 0) {
			victim = e; /* refresh in place */
			break;
		}
		if (!e->used) {
			if (victim == NULL || victim->used)
				victim = e;
		} else if (victim == NULL || (victim->used && e->deadline < victim->deadline)) {
			victim = e;
		}
	}
	if (!victim->used)
		c->st.entries++;
	else if (memcmp(victim->digest, digest, SPACED_VCACHE_DIGEST) != 0)
		c->st.evictions++;
	victim->used = true;
	memcpy(victim->digest, digest, SPACED_VCACHE_DIGEST);
	victim->deadline = cap->exp > INT64_MAX - SPACED_CAP_SKEW ? INT64_MAX : cap->exp + SPACED_CAP_SKEW;
	victim->cap = *cap;
	c->st.inserts++;
out:
	pthread_mutex_unlock(&c->lock);
}

void spaced_vcache_flush(struct spaced_vcache *c)
{
	pthread_mutex_lock(&c->lock);
	flush_locked(c);
	pthread_mutex_unlock(&c->lock);
}

void spaced_vcache_stats(struct spaced_vcache *c, struct spaced_vcache_stats *out)
{
	pthread_mutex_lock(&c->lock);
	*out = c->st;
	pthread_mutex_unlock(&c->lock);
}
