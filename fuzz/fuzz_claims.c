/*
 * fuzz_claims.c — libFuzzer target for capability claims and footers:
 * spaced_cap_claims_decode (with an encode / decode round trip of whatever
 * decodes) and spaced_cap_footer_kid.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cap.h"
#include "spaced_error.h"
#include "paserk.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Field by field (struct padding is not compared). */
static int cap_same(const struct spaced_cap *a, const struct spaced_cap *b)
{
	return spaced_identity_equal(&a->id, &b->id) && a->purposes == b->purposes && a->cls == b->cls &&
	       a->port == b->port && strcmp(a->protocol, b->protocol) == 0 && a->exp == b->exp &&
	       a->iat == b->iat && a->nbf == b->nbf && strcmp(a->jti, b->jti) == 0 &&
	       strcmp(a->kid, b->kid) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct spaced_cap c;
	if (spaced_cap_claims_decode(&c, data, size) == 0) {
		if (spaced_cap_validate(&c) != 0 || c.kid[0] != 0)
			abort();
		char *json = NULL;
		size_t len = 0;
		if (spaced_cap_claims_encode(&c, &json, &len) != 0)
			abort();
		struct spaced_cap again;
		if (spaced_cap_claims_decode(&again, (const uint8_t *)json, len) != 0 ||
		    !cap_same(&c, &again))
			abort(); /* encode(decode(x)) must mean the same claims */
		free(json);
	}
	char kid[SPACED_PASERK_PID_LEN + 1];
	if (spaced_cap_footer_kid(data, size, kid) == 0) {
		if (size > SPACED_CAP_FOOTER_MAX || !spaced_paserk_pid_valid(kid, strlen(kid)))
			abort();
	}
	return 0;
}
