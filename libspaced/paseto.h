/*
 * paseto.h — PASETO v4.public (Ed25519 over PAE), verification side.
 *
 * Tokens are "v4.public." base64url(message || signature) [ "." base64url(footer) ],
 * unpadded base64url, strictly decoded. Signing is in signer.h, which only
 * signer processes and tools link (C2).
 */
#ifndef SPACED_PASETO_H
#define SPACED_PASETO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SPACED_PASETO_HEADER "v4.public."
#define SPACED_PASETO_HEADER_LEN 10
#define SPACED_PASETO_SIG_LEN 64
/* Longest token accepted at all: anything longer is refused before decoding. */
#define SPACED_PASETO_TOKEN_MAX 8192

/* A token split and decoded, not yet verified. Owns one allocation. */
struct spaced_paseto {
	const uint8_t *msg;    /* the payload (message) bytes */
	size_t msg_len;
	const uint8_t *sig;    /* 64 bytes */
	const uint8_t *footer; /* NULL-free pointer even when footer_len == 0 */
	size_t footer_len;
	uint8_t *storage;
};

/* PAE (pre-authentication encoding) of `count` pieces, appended to `out`. Fails
 * only as spaced_buf_append does. */
struct spaced_buf;
int spaced_paseto_pae(struct spaced_buf *out, size_t count, const uint8_t *const *pieces,
                      const size_t *lens);

/* Splits and decodes a token without any cryptographic check: the header must be
 * exactly "v4.public." (else SPACED_EHEADER), the body and the optional footer
 * strictly base64url (SPACED_EBASE64), the body at least 64 bytes and the token
 * at most SPACED_PASETO_TOKEN_MAX (SPACED_EFORMAT / SPACED_ETOOBIG). An empty
 * footer after a second '.' is malformed. On success *out owns its storage:
 * release it with spaced_paseto_clear(). */
int spaced_paseto_parse(struct spaced_paseto *out, const char *token, size_t len);

/* Checks the signature of a parsed token with the 32-byte public key pk and the
 * implicit assertion (may be NULL when ilen is 0). Returns 0 or SPACED_ESIG
 * (SPACED_ENOMEM on allocation failure). */
int spaced_paseto_check(const struct spaced_paseto *t, const uint8_t pk[32], const uint8_t *implicit,
                        size_t ilen);

/* Releases what spaced_paseto_parse() allocated. Accepts a zeroed struct. */
void spaced_paseto_clear(struct spaced_paseto *t);

/* The whole verification in one call: parse; when expected_footer is non-NULL,
 * compare the token's footer with it in constant time (SPACED_EFOOTER); check
 * the signature. On success *msg is a new NUL-terminated copy of the payload
 * (free() it) and *msg_len its length. */
int spaced_paseto_verify(const char *token, size_t len, const uint8_t pk[32],
                         const uint8_t *expected_footer, size_t expected_footer_len,
                         const uint8_t *implicit, size_t ilen, uint8_t **msg, size_t *msg_len);

#endif
