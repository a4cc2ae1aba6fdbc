/*
 * fuzz_bundle.c — libFuzzer target for verification-key bundles:
 * spaced_keyring_install_bundle on a fresh keyring and on one holding a set,
 * which an invalid bundle must leave untouched.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "spaced_error.h"
#include "keyring.h"
#include "paserk.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint8_t raw[32] = {0x70, 0x71, 0x72, 0x73};
	struct spaced_public_key pk;
	char kid[SPACED_PASERK_PID_LEN + 1];
	struct spaced_keyring *kr = NULL;
	if (spaced_public_key_from_bytes(&pk, raw, sizeof raw) < 0 || spaced_keyring_new(&kr) < 0)
		abort();
	spaced_paserk_pid(&pk, kid);

	int r = spaced_keyring_install_bundle(kr, (const char *)data, size);
	if (r == 0) {
		if (spaced_keyring_count(kr) > SPACED_KEYRING_MAX_KEYS)
			abort();
		/* installing the same bundle again is allowed (same version) */
		if (spaced_keyring_install_bundle(kr, (const char *)data, size) != 0)
			abort();
	}
	spaced_keyring_free(kr);

	/* on a keyring that holds one key, a refused bundle changes nothing */
	if (spaced_keyring_new(&kr) < 0 || spaced_keyring_add(kr, &pk, 0, INT64_MAX / 2) < 0)
		abort();
	uint64_t epoch = spaced_keyring_epoch(kr);
	r = spaced_keyring_install_bundle(kr, (const char *)data, size);
	if (r < 0) {
		struct spaced_public_key got;
		if (spaced_keyring_epoch(kr) != epoch || spaced_keyring_count(kr) != 1 ||
		    spaced_keyring_lookup(kr, kid, 1000, &got, NULL) != 0 || memcmp(got.pk, raw, 32) != 0)
			abort();
	}
	spaced_keyring_free(kr);
	return 0;
}
