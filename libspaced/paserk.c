/* paserk.c — k4.public and k4.pid. */
#include "paserk.h"

#include <string.h>

#include <sodium.h>

#include "spaced_error.h"
#include "util.h"

int spaced_public_key_from_bytes(struct spaced_public_key *out, const uint8_t *bytes, size_t n)
{
	if (bytes == NULL || n != sizeof out->pk)
		return SPACED_EKEY;
	memcpy(out->pk, bytes, sizeof out->pk);
	return SPACED_OK;
}

/* Classifies the "kN.type." prefix of a PASERK string. */
static int paserk_prefix(const char *s, size_t n, const char *want)
{
	size_t wl = strlen(want);
	if (n >= wl && memcmp(s, want, wl) == 0)
		return SPACED_OK;
	/* Anything that looks like a PASERK of another version or type is a type
	 * error; everything else is simply not a key. */
	if (n >= 3 && s[0] == 'k' && s[1] >= '1' && s[1] <= '9' && s[2] == '.')
		return SPACED_EKEYTYPE;
	return SPACED_EKEY;
}

int spaced_paserk_public_decode(struct spaced_public_key *out, const char *s, size_t n)
{
	int r = paserk_prefix(s, n, "k4.public.");
	if (r < 0)
		return r;
	uint8_t raw[48];
	size_t rl = 0;
	if (n != SPACED_PASERK_PUBLIC_LEN || spaced_b64url_decode(raw, &rl, s + 10, n - 10) < 0 || rl != 32)
		return SPACED_EKEY;
	memcpy(out->pk, raw, 32);
	return SPACED_OK;
}

void spaced_paserk_public_encode(const struct spaced_public_key *pk,
                                 char out[SPACED_PASERK_PUBLIC_LEN + 1])
{
	memcpy(out, "k4.public.", 10);
	spaced_b64url_encode(out + 10, pk->pk, sizeof pk->pk);
}

void spaced_paserk_pid(const struct spaced_public_key *pk, char out[SPACED_PASERK_PID_LEN + 1])
{
	char pub[SPACED_PASERK_PUBLIC_LEN + 1];
	uint8_t digest[33];
	crypto_generichash_state st;
	spaced_paserk_public_encode(pk, pub);
	crypto_generichash_init(&st, NULL, 0, sizeof digest);
	crypto_generichash_update(&st, (const uint8_t *)"k4.pid.", 7);
	crypto_generichash_update(&st, (const uint8_t *)pub, SPACED_PASERK_PUBLIC_LEN);
	crypto_generichash_final(&st, digest, sizeof digest);
	memcpy(out, "k4.pid.", 7);
	spaced_b64url_encode(out + 7, digest, sizeof digest);
}

int spaced_paserk_pid_valid(const char *s, size_t n)
{
	uint8_t raw[48];
	size_t rl = 0;
	return n == SPACED_PASERK_PID_LEN && memcmp(s, "k4.pid.", 7) == 0 &&
	       spaced_b64url_decode(raw, &rl, s + 7, n - 7) == 0 && rl == 33;
}
