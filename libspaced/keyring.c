/* keyring.c — verify-only key sets with validity windows and atomic replacement. */
#include "keyring.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "spaced_error.h"
#include "util.h"

struct key_entry {
	struct spaced_public_key pk;
	char kid[SPACED_PASERK_PID_LEN + 1];
	int64_t not_before, not_after;
};

struct spaced_keyring {
	pthread_rwlock_t lock;
	struct key_entry keys[SPACED_KEYRING_MAX_KEYS];
	size_t count;
	uint64_t version;
	_Atomic uint64_t epoch;
};

int spaced_keyring_new(struct spaced_keyring **out)
{
	struct spaced_keyring *kr = calloc(1, sizeof *kr);
	if (kr == NULL)
		return SPACED_ENOMEM;
	/* Writers first: with glibc's default (readers first) a steady stream of
	 * lookups can hold off a bundle install, and with it a key removal (T1),
	 * indefinitely. No function here takes the read lock recursively. */
	pthread_rwlockattr_t attr;
	int rc = pthread_rwlockattr_init(&attr);
	if (rc == 0) {
		pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
		rc = pthread_rwlock_init(&kr->lock, &attr);
		pthread_rwlockattr_destroy(&attr);
	}
	if (rc != 0) {
		free(kr);
		return SPACED_ENOMEM;
	}
	atomic_init(&kr->epoch, 1);
	*out = kr;
	return SPACED_OK;
}

void spaced_keyring_free(struct spaced_keyring *kr)
{
	if (kr == NULL)
		return;
	pthread_rwlock_destroy(&kr->lock);
	free(kr);
}

static void entry_set(struct key_entry *e, const struct spaced_public_key *pk, int64_t nb, int64_t na)
{
	e->pk = *pk;
	spaced_paserk_pid(pk, e->kid);
	e->not_before = nb;
	e->not_after = na;
}

int spaced_keyring_add(struct spaced_keyring *kr, const struct spaced_public_key *pk,
                       int64_t not_before, int64_t not_after)
{
	if (not_after < not_before)
		return SPACED_EINVAL;
	int r = SPACED_OK;
	pthread_rwlock_wrlock(&kr->lock);
	if (kr->count == SPACED_KEYRING_MAX_KEYS) {
		r = SPACED_ETOOBIG;
	} else {
		entry_set(&kr->keys[kr->count++], pk, not_before, not_after);
		atomic_fetch_add(&kr->epoch, 1);
	}
	pthread_rwlock_unlock(&kr->lock);
	return r;
}

static int parse_key(json_t *k, struct key_entry *e)
{
	json_t *key = json_object_get(k, "key"), *kid = json_object_get(k, "kid");
	json_t *nb = json_object_get(k, "not_before"), *na = json_object_get(k, "not_after");
	if (!json_is_object(k) || !json_is_string(key) || !json_is_string(nb) || !json_is_string(na) ||
	    (kid != NULL && !json_is_string(kid)) || json_object_size(k) != 3u + (kid != NULL))
		return SPACED_EJSON;
	struct spaced_public_key pk;
	int64_t t_nb, t_na;
	int r = spaced_paserk_public_decode(&pk, json_string_value(key), json_string_length(key));
	if (r < 0)
		return r;
	if (spaced_time_parse(json_string_value(nb), json_string_length(nb), &t_nb) < 0 ||
	    spaced_time_parse(json_string_value(na), json_string_length(na), &t_na) < 0 || t_na < t_nb)
		return SPACED_EINVAL;
	entry_set(e, &pk, t_nb, t_na);
	if (kid != NULL && strcmp(json_string_value(kid), e->kid) != 0)
		return SPACED_EKEY; /* the stated ID does not belong to this key */
	return SPACED_OK;
}

int spaced_keyring_install_bundle(struct spaced_keyring *kr, const char *json, size_t len)
{
	if (len > SPACED_KEYRING_BUNDLE_MAX)
		return SPACED_ETOOBIG;
	json_error_t err;
	json_t *o = json_loadb(json, len, JSON_REJECT_DUPLICATES, &err);
	if (o == NULL)
		return SPACED_EJSON;
	struct key_entry *keys = NULL;
	int r = SPACED_EJSON;
	json_t *ver = json_object_get(o, "version"), *arr = json_object_get(o, "keys");
	if (!json_is_object(o) || json_object_size(o) != 2 || !json_is_integer(ver) ||
	    json_integer_value(ver) < 0 || !json_is_array(arr))
		goto out;
	size_t n = json_array_size(arr);
	if (n > SPACED_KEYRING_MAX_KEYS) {
		r = SPACED_ETOOBIG;
		goto out;
	}
	keys = calloc(n ? n : 1, sizeof *keys);
	if (keys == NULL) {
		r = SPACED_ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		if ((r = parse_key(json_array_get(arr, i), &keys[i])) < 0)
			goto out;
	pthread_rwlock_wrlock(&kr->lock);
	if ((uint64_t)json_integer_value(ver) < kr->version) {
		r = SPACED_ESTALE;
	} else {
		memcpy(kr->keys, keys, n * sizeof *keys);
		kr->count = n;
		kr->version = (uint64_t)json_integer_value(ver);
		atomic_fetch_add(&kr->epoch, 1);
		r = SPACED_OK;
	}
	pthread_rwlock_unlock(&kr->lock);
out:
	free(keys);
	json_decref(o);
	return r;
}

int spaced_keyring_load_file(struct spaced_keyring *kr, const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return SPACED_EIO;
	int r = spaced_keyring_load_fd(kr, fd);
	close(fd);
	return r;
}

int spaced_keyring_load_fd(struct spaced_keyring *kr, int fd)
{
	char *data = NULL;
	size_t len = 0;
	struct stat st;
	int r = SPACED_EIO;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
		goto out;
	if (st.st_size > SPACED_KEYRING_BUNDLE_MAX) {
		r = SPACED_ETOOBIG;
		goto out;
	}
	data = malloc((size_t)st.st_size + 1);
	if (data == NULL) {
		r = SPACED_ENOMEM;
		goto out;
	}
	while (len < (size_t)st.st_size) {
		ssize_t got = pread(fd, data + len, (size_t)st.st_size - len, (off_t)len);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			goto out;
		len += (size_t)got;
	}
	r = spaced_keyring_install_bundle(kr, data, len);
out:
	free(data);
	return r;
}

int spaced_keyring_lookup(const struct spaced_keyring *kr, const char *kid, int64_t now,
                          struct spaced_public_key *pk, uint64_t *epoch)
{
	struct spaced_keyring *k = (struct spaced_keyring *)(uintptr_t)kr;
	int r = SPACED_EUNKNOWNKEY;
	if (kid == NULL)
		return r;
	pthread_rwlock_rdlock(&k->lock);
	for (size_t i = 0; i < k->count; i++) {
		const struct key_entry *e = &k->keys[i];
		if (strcmp(e->kid, kid) == 0 && now >= e->not_before && now <= e->not_after) {
			*pk = e->pk;
			if (epoch != NULL)
				*epoch = atomic_load(&k->epoch);
			r = SPACED_OK;
			break;
		}
	}
	pthread_rwlock_unlock(&k->lock);
	return r;
}

uint64_t spaced_keyring_epoch(const struct spaced_keyring *kr)
{
	return atomic_load(&kr->epoch);
}

uint64_t spaced_keyring_version(const struct spaced_keyring *kr)
{
	struct spaced_keyring *k = (struct spaced_keyring *)(uintptr_t)kr;
	pthread_rwlock_rdlock(&k->lock);
	uint64_t v = k->version;
	pthread_rwlock_unlock(&k->lock);
	return v;
}

size_t spaced_keyring_count(const struct spaced_keyring *kr)
{
	struct spaced_keyring *k = (struct spaced_keyring *)(uintptr_t)kr;
	pthread_rwlock_rdlock(&k->lock);
	size_t n = k->count;
	pthread_rwlock_unlock(&k->lock);
	return n;
}
