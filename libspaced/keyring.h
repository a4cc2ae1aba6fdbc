/*
 * keyring.h — verification keys (C2, T1). A keyring holds Ed25519 public keys
 * only, each with a validity window, looked up by k4.pid key ID. It has no way
 * to hold or produce a secret key: a component that links only libspaced
 * cannot sign.
 *
 * Bundle file (JSON, duplicate keys refused):
 *   {"version": 7,
 *    "keys": [{"key": "k4.public.…", "kid": "k4.pid.…" (optional, checked),
 *              "not_before": "RFC 3339", "not_after": "RFC 3339"}, …]}
 * A bundle replaces the whole key set at once, and only with a version not
 * lower than the one installed (an older bundle is SPACED_ESTALE).
 * All functions are safe to call from several threads.
 */
#ifndef SPACED_KEYRING_H
#define SPACED_KEYRING_H

#include <stddef.h>
#include <stdint.h>

#include "paserk.h"

#define SPACED_KEYRING_MAX_KEYS 64
#define SPACED_KEYRING_BUNDLE_MAX (64 * 1024)

struct spaced_keyring;

/* A new, empty keyring (every lookup fails until keys are installed). */
int spaced_keyring_new(struct spaced_keyring **out);

/* Frees; accepts NULL. */
void spaced_keyring_free(struct spaced_keyring *kr);

/* Installs one key with its validity window [not_before, not_after] next to the
 * keys held (for tools and tests; fleets install bundles). Bumps the epoch. */
int spaced_keyring_add(struct spaced_keyring *kr, const struct spaced_public_key *pk,
                       int64_t not_before, int64_t not_after);

/* Parses a bundle and, only if all of it is valid, replaces the key set in one
 * step and bumps the epoch. On any error the installed set is untouched.
 * Returns 0, SPACED_EJSON, SPACED_EKEY, SPACED_EKEYTYPE, SPACED_ETOOBIG,
 * SPACED_EINVAL or SPACED_ESTALE. */
int spaced_keyring_install_bundle(struct spaced_keyring *kr, const char *json, size_t len);

/* Reads a bundle file and installs it as above (SPACED_EIO when unreadable). */
int spaced_keyring_load_file(struct spaced_keyring *kr, const char *path);

/* The same from a file open for reading (read from its start; not closed):
 * for a process that may no longer open it itself (spaced-netgtw). */
int spaced_keyring_load_fd(struct spaced_keyring *kr, int fd);

/* Finds the key with this k4.pid whose window contains now. Unknown IDs and
 * keys outside their window are SPACED_EUNKNOWNKEY (fail closed). On success
 * *pk is a copy and *epoch (may be NULL) the epoch it was found in. */
int spaced_keyring_lookup(const struct spaced_keyring *kr, const char *kid, int64_t now,
                          struct spaced_public_key *pk, uint64_t *epoch);

/* Changes every time the key set changes (starts at 1). */
uint64_t spaced_keyring_epoch(const struct spaced_keyring *kr);

/* The version of the installed bundle (0 before any). */
uint64_t spaced_keyring_version(const struct spaced_keyring *kr);

/* Number of keys held. */
size_t spaced_keyring_count(const struct spaced_keyring *kr);

#endif
