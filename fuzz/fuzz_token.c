/*
 * fuzz_token.c — libFuzzer target for everything a verifier does with an
 * untrusted token: spaced_paseto_parse, then spaced_cap_verify for both classes
 * with a fixed keyring (the PASETO 4-S public key) and a verification cache.
 * Whatever verifies must verify again identically from the cache.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cap.h"
#include "spaced_error.h"
#include "keyring.h"
#include "paserk.h"
#include "paseto.h"
#include "vcache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Field by field (struct padding is not compared). */
static int cap_same(const struct spaced_cap *a, const struct spaced_cap *b)
{
	return spaced_identity_equal(&a->id, &b->id) && a->purposes == b->purposes && a->cls == b->cls &&
	       a->port == b->port && strcmp(a->protocol, b->protocol) == 0 && a->exp == b->exp &&
	       a->iat == b->iat && a->nbf == b->nbf && strcmp(a->jti, b->jti) == 0 &&
	       strcmp(a->kid, b->kid) == 0;
}

/* 2026-12-01T00:00:30Z: inside the validity of the seed capabilities. */
#define FUZZ_NOW INT64_C(1796083230)

static const uint8_t PK[32] = {
	0x1e, 0xb9, 0xdb, 0xbb, 0xbc, 0x04, 0x7c, 0x03, 0xfd, 0x70, 0x60, 0x4e, 0x00, 0x71, 0xf0, 0x98,
	0x7e, 0x16, 0xb2, 0x8b, 0x75, 0x72, 0x25, 0xc1, 0x1f, 0x00, 0x41, 0x5d, 0x0e, 0x20, 0xb1, 0xa2,
};

static struct spaced_keyring *keyring(void)
{
	static struct spaced_keyring *kr;
	if (kr == NULL) {
		struct spaced_public_key pk;
		if (spaced_keyring_new(&kr) < 0 || spaced_public_key_from_bytes(&pk, PK, sizeof PK) < 0 ||
		    spaced_keyring_add(kr, &pk, FUZZ_NOW - 86400, FUZZ_NOW + 86400) < 0)
			abort();
	}
	return kr;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *token = (const char *)data;
	struct spaced_paseto t = {0};
	if (spaced_paseto_parse(&t, token, size) == 0) {
		if (t.msg_len + SPACED_PASETO_SIG_LEN > size || t.footer == NULL)
			abort();
		(void)spaced_paseto_check(&t, PK, NULL, 0);
		spaced_paseto_clear(&t);
	}

	struct spaced_vcache *vc = NULL;
	if (spaced_vcache_new(&vc, 8) < 0)
		abort();
	for (int cls = SPACED_CLASS_CONTROL; cls <= SPACED_CLASS_SERVICEPORT; cls++) {
		struct spaced_cap a, b;
		int r1 = spaced_cap_verify(keyring(), vc, token, size, (enum spaced_cap_class)cls, FUZZ_NOW, &a);
		int r2 = spaced_cap_verify(keyring(), vc, token, size, (enum spaced_cap_class)cls, FUZZ_NOW, &b);
		if (r1 > 0 || r2 > 0 || (r1 == 0) != (r2 == 0))
			abort(); /* the cache changed the answer */
		if (r1 == 0) {
			if (!cap_same(&a, &b) || spaced_cap_validate(&a) != 0 || a.cls != (enum spaced_cap_class)cls)
				abort();
			/* and without the cache, the same */
			struct spaced_cap c;
			if (spaced_cap_verify(keyring(), NULL, token, size, (enum spaced_cap_class)cls, FUZZ_NOW, &c) != 0 ||
			    !cap_same(&a, &c))
				abort();
		}
	}
	spaced_vcache_free(vc);
	return 0;
}
