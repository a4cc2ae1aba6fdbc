/*
 * signer.h — Ed25519 secret keys and signing (C2).
 *
 * Only processes that sign link this module (libspaced_signer): the control
 * plane's signer and the spacectl tool. Workers and gateways link libspaced
 * alone, in which no function accepts or produces a secret key, so a
 * verify-only component cannot sign by construction.
 */
#ifndef SPACED_SIGNER_H
#define SPACED_SIGNER_H

#include <stddef.h>
#include <stdint.h>

#include "cap.h"
#include "paserk.h"

/* An Ed25519 secret key (seed || public key), kept in memory locked against
 * swapping and wiped when freed. Opaque. */
struct spaced_secret_key;

/* A fresh random key pair. Returns 0 or SPACED_ENOMEM. */
int spaced_secret_key_generate(struct spaced_secret_key **out);

/* A key from its 32-byte seed or its 64-byte seed||pk form (the public half must
 * match the seed: SPACED_EKEY otherwise). */
int spaced_secret_key_from_bytes(struct spaced_secret_key **out, const uint8_t *bytes, size_t n);

/* Parses "k4.secret.<base64url of 64 bytes>" (another version or type:
 * SPACED_EKEYTYPE; bad length, encoding or mismatched halves: SPACED_EKEY). */
int spaced_secret_key_from_paserk(struct spaced_secret_key **out, const char *s, size_t n);

/* Writes the k4.secret form (NUL-terminated). The caller wipes it when done. */
void spaced_secret_key_to_paserk(const struct spaced_secret_key *sk,
                                 char out[SPACED_PASERK_SECRET_LEN + 1]);

/* The public half of sk. */
void spaced_secret_key_public(const struct spaced_secret_key *sk, struct spaced_public_key *out);

/* Wipes and frees; accepts NULL. */
void spaced_secret_key_free(struct spaced_secret_key *sk);

/* Signs a PASETO v4.public token over msg with the optional footer and implicit
 * assertion (either may be NULL with length 0). *token receives a new
 * NUL-terminated string (free() it). Returns 0, SPACED_ETOOBIG or SPACED_ENOMEM. */
int spaced_paseto_sign(const struct spaced_secret_key *sk, const uint8_t *msg, size_t msg_len,
                       const uint8_t *footer, size_t footer_len, const uint8_t *implicit,
                       size_t ilen, char **token);

/* Issues a capability: encodes the claims of *cap (which must satisfy
 * spaced_cap_validate), puts the signer's k4.pid in the footer and binds the
 * purpose class through the implicit assertion (C1). *token as above. */
int spaced_cap_issue(const struct spaced_secret_key *sk, const struct spaced_cap *cap, char **token);

#endif
