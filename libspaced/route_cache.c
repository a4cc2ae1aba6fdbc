/* route_cache.c — per-sandbox routes with compare-and-swap replacement. */
#include "route_cache.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "spaced_error.h"

struct entry {
	bool used;
	struct spaced_route route;
	int64_t expires_at; /* the caller's authorization, never extended by a repair */
};

struct spaced_route_cache {
	pthread_mutex_t lock;
	size_t max;
	struct entry *e;
};

int spaced_route_copy(struct spaced_route *dst, const struct spaced_route *src)
{
	char *cap = strdup(src->capability ? src->capability : "");
	if (cap == NULL)
		return SPACED_ENOMEM;
	*dst = *src;
	dst->capability = cap;
	return SPACED_OK;
}

void spaced_route_clear(struct spaced_route *r)
{
	if (r == NULL)
		return;
	free(r->capability);
	memset(r, 0, sizeof *r);
}

int spaced_route_cache_new(struct spaced_route_cache **out, size_t max_entries)
{
	struct spaced_route_cache *c = calloc(1, sizeof *c);
	if (c == NULL || max_entries == 0)
		goto fail;
	c->max = max_entries;
	c->e = calloc(max_entries, sizeof *c->e);
	if (c->e == NULL || pthread_mutex_init(&c->lock, NULL) != 0)
		goto fail;
	*out = c;
	return SPACED_OK;
fail:
	if (c != NULL)
		free(c->e);
	free(c);
	return max_entries == 0 ? SPACED_EINVAL : SPACED_ENOMEM;
}

void spaced_route_cache_free(struct spaced_route_cache *c)
{
	if (c == NULL)
		return;
	for (size_t i = 0; i < c->max; i++)
		spaced_route_clear(&c->e[i].route);
	pthread_mutex_destroy(&c->lock);
	free(c->e);
	free(c);
}

static struct entry *find(struct spaced_route_cache *c, const char *sandbox)
{
	for (size_t i = 0; i < c->max; i++)
		if (c->e[i].used && strcmp(c->e[i].route.id.sandbox, sandbox) == 0)
			return &c->e[i];
	return NULL;
}

/* The same route: the very capability that was sent (it names the identity). */
static bool same_route(const struct spaced_route *a, const struct spaced_route *b)
{
	return a->capability != NULL && b->capability != NULL && strcmp(a->capability, b->capability) == 0 &&
	       spaced_identity_equal(&a->id, &b->id);
}

int spaced_route_cache_get(struct spaced_route_cache *c, const char *sandbox, uint32_t purposes,
                           int64_t now, struct spaced_route *out)
{
	int r = SPACED_ENOENT;
	pthread_mutex_lock(&c->lock);
	struct entry *e = find(c, sandbox);
	if (e != NULL && (e->route.purposes & purposes) == purposes && now < e->expires_at &&
	    now + SPACED_ROUTE_EXPIRY_MARGIN < e->route.cap_expires_at)
		r = spaced_route_copy(out, &e->route);
	pthread_mutex_unlock(&c->lock);
	return r;
}

int spaced_route_cache_put(struct spaced_route_cache *c, const struct spaced_route *rt,
                           int64_t entry_expires_at)
{
	struct spaced_route copy;
	int r = spaced_route_copy(&copy, rt);
	if (r < 0)
		return r;
	pthread_mutex_lock(&c->lock);
	struct entry *e = find(c, rt->id.sandbox);
	for (size_t i = 0; e == NULL && i < c->max; i++)
		if (!c->e[i].used)
			e = &c->e[i];
	if (e == NULL) { /* full: evict the entry that expires first */
		e = &c->e[0];
		for (size_t i = 1; i < c->max; i++)
			if (c->e[i].expires_at < e->expires_at)
				e = &c->e[i];
	}
	spaced_route_clear(&e->route);
	e->used = true;
	e->route = copy;
	e->expires_at = entry_expires_at;
	pthread_mutex_unlock(&c->lock);
	return SPACED_OK;
}

int spaced_route_cache_replace(struct spaced_route_cache *c, const struct spaced_route *refused,
                               const struct spaced_route *fresh)
{
	if (strcmp(refused->id.sandbox, fresh->id.sandbox) != 0)
		return SPACED_EINVAL;
	struct spaced_route copy;
	int r = spaced_route_copy(&copy, fresh);
	if (r < 0)
		return r;
	pthread_mutex_lock(&c->lock);
	struct entry *e = find(c, fresh->id.sandbox);
	if (e == NULL) {
		r = SPACED_ENOENT;
	} else if (!same_route(&e->route, refused)) {
		r = SPACED_ESTALE; /* someone stored a newer route since: keep it (V3) */
	} else {
		spaced_route_clear(&e->route);
		e->route = copy; /* e->expires_at stays (V4) */
		copy.capability = NULL;
		r = SPACED_OK;
	}
	pthread_mutex_unlock(&c->lock);
	spaced_route_clear(&copy);
	return r;
}

int spaced_route_cache_drop(struct spaced_route_cache *c, const struct spaced_route *refused)
{
	int r;
	pthread_mutex_lock(&c->lock);
	struct entry *e = find(c, refused->id.sandbox);
	if (e == NULL) {
		r = SPACED_ENOENT;
	} else if (!same_route(&e->route, refused)) {
		r = SPACED_ESTALE;
	} else {
		spaced_route_clear(&e->route);
		e->used = false;
		r = SPACED_OK;
	}
	pthread_mutex_unlock(&c->lock);
	return r;
}

int spaced_route_cache_entry_expiry(struct spaced_route_cache *c, const char *sandbox, int64_t *out)
{
	int r = SPACED_ENOENT;
	pthread_mutex_lock(&c->lock);
	struct entry *e = find(c, sandbox);
	if (e != NULL) {
		*out = e->expires_at;
		r = SPACED_OK;
	}
	pthread_mutex_unlock(&c->lock);
	return r;
}
