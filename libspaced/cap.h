/*
 * cap.h — capabilities (C1–C5): PASETO v4.public tokens whose claims name one
 * execution identity, the purposes allowed, and for ServicePort the port and
 * protocol. The footer carries {"kid":"k4.pid.…"}; the purpose class is bound
 * through the implicit assertion so a ServicePort capability can never pass as
 * a control capability or the reverse.
 *
 * Claims (all required unless marked):
 *   sub          sandbox ID                  generation  integer ≥ 1
 *   worker, substrate, activation            pod_uid     string (optional)
 *   class        "control" | "serviceport"   purposes    array of purpose names
 *   port         1–65535 (serviceport only)  protocol    "tcp"|"udp"|"http"|"ws"|"grpc" (serviceport only)
 *   exp, iat, nbf  RFC 3339 times            jti         unique token ID
 * Unknown claims, duplicate keys and wrong types are refused.
 */
#ifndef SPACED_CAP_H
#define SPACED_CAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "identity.h"
#include "paserk.h"

#define SPACED_CAP_LIFETIME 120 /* seconds (C3) */
#define SPACED_CAP_SKEW 15      /* seconds of clock-skew tolerance (C3) */
#define SPACED_CAP_FOOTER_MAX 128
#define SPACED_CAP_FOOTER_DEPTH 1
#define SPACED_CAP_CLAIMS_MAX 2048
#define SPACED_PROTOCOL_MAX 8

enum spaced_purpose {
	SPACED_PURPOSE_FS_READ = 1u << 0,
	SPACED_PURPOSE_FS_WRITE = 1u << 1,
	SPACED_PURPOSE_EXEC = 1u << 2,
	SPACED_PURPOSE_TERM = 1u << 3,
	SPACED_PURPOSE_WATCH = 1u << 4,
	SPACED_PURPOSE_SERVICEPORT = 1u << 5,
	SPACED_PURPOSE_LIFECYCLE = 1u << 6,
};
#define SPACED_PURPOSE_ALL 0x7fu

enum spaced_cap_class {
	SPACED_CLASS_CONTROL = 0,
	SPACED_CLASS_SERVICEPORT = 1,
};

struct spaced_cap {
	struct spaced_identity id;
	uint32_t purposes; /* bit set of enum spaced_purpose */
	enum spaced_cap_class cls;
	uint16_t port;                           /* serviceport only, else 0 */
	char protocol[SPACED_PROTOCOL_MAX];      /* serviceport only, else "" */
	int64_t exp, iat, nbf;                   /* Unix seconds */
	char jti[SPACED_NAME_MAX];
	char kid[SPACED_PASERK_PID_LEN + 1];     /* from the footer; set by verification */
};

/* Name of one purpose bit ("fs.read", …) or NULL. */
const char *spaced_purpose_name(uint32_t purpose);

/* The purpose bit named s, or 0 when s names none. */
uint32_t spaced_purpose_parse(const char *s);

/* Name of a class ("control" / "serviceport"). */
const char *spaced_cap_class_name(enum spaced_cap_class cls);

/* The implicit assertion bound into every signature of this class. */
const char *spaced_cap_implicit(enum spaced_cap_class cls);

/* Checks a capability's own consistency: identity valid, purposes non-empty and
 * known; a serviceport capability has exactly the serviceport purpose, a port
 * and a known protocol, a control one neither; iat ≤ nbf < exp and exp - iat ≤
 * the lifetime; jti a valid name. Returns 0 or SPACED_ECLAIM. */
int spaced_cap_validate(const struct spaced_cap *cap);

/* Encodes the claims as compact JSON (fixed member order). *json is a new
 * NUL-terminated string (free() it). */
int spaced_cap_claims_encode(const struct spaced_cap *cap, char **json, size_t *len);

/* Decodes claims strictly: JSON object, duplicate keys refused (SPACED_EJSON),
 * every required claim present with its type and nothing unknown, consistency as
 * spaced_cap_validate (SPACED_ECLAIM). kid is left empty. */
int spaced_cap_claims_decode(struct spaced_cap *out, const uint8_t *json, size_t len);

/* Encodes the footer {"kid":"<k4.pid>"} for pk into out (room for
 * SPACED_CAP_FOOTER_MAX bytes). Returns its length. */
int spaced_cap_footer_encode(const struct spaced_public_key *pk, char *out, size_t outsz);

/* Reads the key ID from a footer after checking its length (≤ SPACED_CAP_FOOTER_MAX)
 * and nesting depth (≤ SPACED_CAP_FOOTER_DEPTH) before parsing; duplicate keys
 * and any member other than "kid" are refused. Returns 0 or SPACED_EFORMAT /
 * SPACED_ETOOBIG / SPACED_EJSON / SPACED_EKEY. */
int spaced_cap_footer_kid(const uint8_t *footer, size_t len, char kid[SPACED_PASERK_PID_LEN + 1]);

/* Time checks with SPACED_CAP_SKEW tolerance: expired when now > exp + skew
 * (SPACED_EEXPIRED); not yet valid when nbf or iat > now + skew (SPACED_ENOTYET). */
int spaced_cap_check_time(const struct spaced_cap *cap, int64_t now);

struct spaced_keyring;
struct spaced_vcache;

/* Verifies a capability token for the expected class at time now: parse,
 * footer kid looked up among the keyring's keys only (SPACED_EUNKNOWNKEY),
 * claims decoded, class compared (SPACED_EPURPOSE), signature checked with the
 * class's implicit assertion (SPACED_ESIG), times checked. With a cache (may be
 * NULL), a token verified before is taken from it: the signature check is
 * skipped, the time checks and the key's validity window are not; a newly
 * verified one is remembered.
 * On success *out holds the claims and kid. The identity comparison is the
 * caller's next step (compare.h): it is never skipped. */
int spaced_cap_verify(const struct spaced_keyring *kr, struct spaced_vcache *cache, const char *token,
                      size_t len, enum spaced_cap_class cls, int64_t now, struct spaced_cap *out);

#endif
