/*
 * fuzz_identity.c — libFuzzer target for the canonical identity text
 * (spaced_identity_decode: whatever decodes must re-encode to exactly the
 * input, as the form is canonical) and RFC 3339 times (spaced_time_parse:
 * whatever parses and can be formatted parses back to the same second) and
 * the identity's JSON form (spaced_identity_from_json / _to_json round trip).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "spaced_error.h"
#include "identity.h"
#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *s = (const char *)data;
	struct spaced_identity id;
	if (spaced_identity_decode(&id, s, size) == 0) {
		char text[SPACED_IDENTITY_TEXT_MAX];
		int n = spaced_identity_encode(&id, text, sizeof text);
		if (n < 0 || (size_t)n != size || memcmp(text, s, size) != 0)
			abort();
		struct spaced_identity check;
		if (spaced_identity_set(&check, id.sandbox, id.generation, id.worker, id.substrate, id.activation,
		                        id.pod_uid) != 0 ||
		    !spaced_identity_equal(&check, &id))
			abort();
	}
	json_error_t err;
	json_t *o = json_loadb(s, size, JSON_REJECT_DUPLICATES, &err);
	if (o != NULL) {
		struct spaced_identity j, k;
		if (spaced_identity_from_json(&j, o) == 0) {
			json_t *back = spaced_identity_to_json(&j);
			if (back == NULL || spaced_identity_from_json(&k, back) != 0 || !spaced_identity_equal(&j, &k))
				abort();
			json_decref(back);
		}
		json_decref(o);
	}
	int64_t t;
	if (spaced_time_parse(s, size, &t) == 0) {
		char out[21];
		int64_t back;
		if (spaced_time_format(t, out) == 0 &&
		    (spaced_time_parse(out, strlen(out), &back) != 0 || back != t))
			abort();
	}
	return 0;
}
