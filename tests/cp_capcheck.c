/*
 * cp-capcheck — verifies a route answer of spaced-cp the way a receiver does
 * (C1, C2, R1): the capability must verify against the bundle (libspaced
 * keyring + spaced_cap_verify, class taken from the answer) and name exactly the
 * identity the answer gives. Prints the verified claims as JSON:
 *   {"kid":…, "identity":{…}, "purposes":[…], "class":…, "port":N, "protocol":…, "exp":N, "iat":N}
 *
 *   cp-capcheck BUNDLE_FILE ROUTE_FILE [NOW]
 * Exit 0 when it verifies and matches, 1 with a reason otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cap.h"
#include "spaced_error.h"
#include "identity.h"
#include "keyring.h"
#include "util.h"

int main(int argc, char **argv)
{
	json_error_t jerr;
	struct spaced_keyring *kr = NULL;
	struct spaced_cap cap;
	struct spaced_identity want;
	json_t *route = NULL;
	int rc = 1;
	if (argc < 3) {
		fprintf(stderr, "usage: cp-capcheck BUNDLE_FILE ROUTE_FILE [NOW]\n");
		return 2;
	}
	int64_t now = argc > 3 ? atoll(argv[3]) : spaced_now();
	route = json_load_file(argv[2], JSON_REJECT_DUPLICATES, &jerr);
	if (route == NULL) {
		fprintf(stderr, "capcheck: route: %s\n", jerr.text);
		goto out;
	}
	int r = spaced_keyring_new(&kr);
	if (r == 0)
		r = spaced_keyring_load_file(kr, argv[1]);
	if (r < 0) {
		fprintf(stderr, "capcheck: bundle: %s\n", spaced_strerror(r));
		goto out;
	}
	const char *tok = json_string_value(json_object_get(route, "capability"));
	const char *cls = json_string_value(json_object_get(route, "class"));
	if (tok == NULL || cls == NULL) {
		fprintf(stderr, "capcheck: route has no capability/class\n");
		goto out;
	}
	enum spaced_cap_class c = strcmp(cls, "serviceport") == 0 ? SPACED_CLASS_SERVICEPORT : SPACED_CLASS_CONTROL;
	r = spaced_cap_verify(kr, NULL, tok, strlen(tok), c, now, &cap);
	if (r < 0) {
		fprintf(stderr, "capcheck: verify: %s (%s)\n", spaced_strerror(r), spaced_errname(r));
		goto out;
	}
	if (spaced_identity_from_json(&want, json_object_get(route, "identity")) < 0 ||
	    !spaced_identity_equal(&want, &cap.id)) {
		fprintf(stderr, "capcheck: the capability names another identity than the answer\n");
		goto out;
	}
	json_t *purposes = json_array();
	for (uint32_t b = 1; b <= SPACED_PURPOSE_ALL; b <<= 1)
		if (cap.purposes & b)
			json_array_append_new(purposes, json_string(spaced_purpose_name(b)));
	json_t *o = json_pack("{s:s,s:o,s:o,s:s,s:i,s:s,s:I,s:I}", "kid", cap.kid, "identity",
	                      spaced_identity_to_json(&cap.id), "purposes", purposes, "class",
	                      spaced_cap_class_name(cap.cls), "port", (int)cap.port, "protocol", cap.protocol, "exp",
	                      (json_int_t)cap.exp, "iat", (json_int_t)cap.iat);
	char *s = json_dumps(o, JSON_COMPACT);
	printf("%s\n", s);
	free(s);
	json_decref(o);
	rc = 0;
out:
	json_decref(route);
	spaced_keyring_free(kr);
	return rc;
}
