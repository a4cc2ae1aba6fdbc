/*
 * paserk.h — Ed25519 public keys and their PASERK forms: k4.public (the key)
 * and k4.pid (its key ID, BLAKE2b-264 of "k4.pid." || the k4.public string).
 */
#ifndef SPACED_PASERK_H
#define SPACED_PASERK_H

#include <stddef.h>
#include <stdint.h>

#define SPACED_PASERK_PUBLIC_LEN 53 /* "k4.public." + 43 */
#define SPACED_PASERK_PID_LEN 51    /* "k4.pid." + 44 */
#define SPACED_PASERK_SECRET_LEN 96 /* "k4.secret." + 86 */

struct spaced_public_key {
	uint8_t pk[32];
};

/* Takes a raw public key of exactly 32 bytes (SPACED_EKEY otherwise). */
int spaced_public_key_from_bytes(struct spaced_public_key *out, const uint8_t *bytes, size_t n);

/* Parses "k4.public.<base64url>". A PASERK of another version (k1–k3) or type
 * (k4.local, k4.secret, k4.pid, …) is SPACED_EKEYTYPE; a wrong length or bad
 * encoding is SPACED_EKEY. */
int spaced_paserk_public_decode(struct spaced_public_key *out, const char *s, size_t n);

/* Writes the k4.public form of pk (NUL-terminated) into out. */
void spaced_paserk_public_encode(const struct spaced_public_key *pk,
                                 char out[SPACED_PASERK_PUBLIC_LEN + 1]);

/* Writes the k4.pid key ID of pk (NUL-terminated) into out. */
void spaced_paserk_pid(const struct spaced_public_key *pk, char out[SPACED_PASERK_PID_LEN + 1]);

/* True when s (n bytes) has the exact shape of a k4.pid: prefix, length and
 * strict base64url body. */
int spaced_paserk_pid_valid(const char *s, size_t n);

#endif
