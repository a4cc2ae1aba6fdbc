/* cap.c — capability claims, footer and verification. */
#include "cap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "spaced_error.h"
#include "keyring.h"
#include "paseto.h"
#include "util.h"
#include "vcache.h"

static const char *const purpose_names[] = {
	"fs.read", "fs.write", "exec", "term", "watch", "serviceport", "lifecycle",
};
#define PURPOSE_COUNT (sizeof purpose_names / sizeof purpose_names[0])

static const char *const protocols[] = {"tcp", "udp", "http", "https", "ws", "grpc"};

const char *spaced_purpose_name(uint32_t purpose)
{
	for (size_t i = 0; i < PURPOSE_COUNT; i++)
		if (purpose == (1u << i))
			return purpose_names[i];
	return NULL;
}

uint32_t spaced_purpose_parse(const char *s)
{
	for (size_t i = 0; s != NULL && i < PURPOSE_COUNT; i++)
		if (strcmp(s, purpose_names[i]) == 0)
			return 1u << i;
	return 0;
}

const char *spaced_cap_class_name(enum spaced_cap_class cls)
{
	return cls == SPACED_CLASS_SERVICEPORT ? "serviceport" : "control";
}

const char *spaced_cap_implicit(enum spaced_cap_class cls)
{
	return cls == SPACED_CLASS_SERVICEPORT ? "spaced.capability.v1.serviceport"
	                                       : "spaced.capability.v1.control";
}

static bool protocol_known(const char *p)
{
	for (size_t i = 0; i < sizeof protocols / sizeof protocols[0]; i++)
		if (strcmp(p, protocols[i]) == 0)
			return true;
	return false;
}

int spaced_cap_validate(const struct spaced_cap *c)
{
	struct spaced_identity tmp;
	if (spaced_identity_set(&tmp, c->id.sandbox, c->id.generation, c->id.worker, c->id.substrate,
	                        c->id.activation, c->id.pod_uid) < 0)
		return SPACED_ECLAIM;
	if (c->purposes == 0 || (c->purposes & ~SPACED_PURPOSE_ALL) != 0)
		return SPACED_ECLAIM;
	if (c->cls == SPACED_CLASS_SERVICEPORT) {
		if (c->purposes != SPACED_PURPOSE_SERVICEPORT || c->port == 0 ||
		    !protocol_known(c->protocol))
			return SPACED_ECLAIM;
	} else if (c->cls == SPACED_CLASS_CONTROL) {
		if ((c->purposes & SPACED_PURPOSE_SERVICEPORT) || c->port != 0 || c->protocol[0] != 0)
			return SPACED_ECLAIM;
	} else {
		return SPACED_ECLAIM;
	}
	/* exp > iat here, so the difference fits in uint64_t even at the ends of
	 * the int64 range (a signed difference could overflow). */
	if (c->iat > c->nbf || c->nbf >= c->exp ||
	    (uint64_t)c->exp - (uint64_t)c->iat > SPACED_CAP_LIFETIME)
		return SPACED_ECLAIM;
	if (!spaced_name_valid(c->jti, strlen(c->jti)))
		return SPACED_ECLAIM;
	return SPACED_OK;
}

static int put_time(json_t *o, const char *key, int64_t t)
{
	char buf[21];
	if (spaced_time_format(t, buf) < 0)
		return SPACED_ECLAIM;
	return json_object_set_new(o, key, json_string(buf)) == 0 ? SPACED_OK : SPACED_ENOMEM;
}

int spaced_cap_claims_encode(const struct spaced_cap *c, char **json, size_t *len)
{
	int r = spaced_cap_validate(c);
	if (r < 0)
		return r;
	json_t *purposes = json_array();
	for (size_t i = 0; purposes != NULL && i < PURPOSE_COUNT; i++)
		if (c->purposes & (1u << i))
			json_array_append_new(purposes, json_string(purpose_names[i]));
	json_t *o = json_pack("{s:s, s:I, s:s, s:s, s:s}", "sub", c->id.sandbox, "generation",
	                      (json_int_t)c->id.generation, "worker", c->id.worker, "substrate",
	                      c->id.substrate, "activation", c->id.activation);
	if (o == NULL || purposes == NULL) {
		json_decref(purposes);
		r = SPACED_ENOMEM;
		goto out;
	}
	if (c->id.pod_uid[0])
		json_object_set_new(o, "pod_uid", json_string(c->id.pod_uid));
	json_object_set_new(o, "class", json_string(spaced_cap_class_name(c->cls)));
	json_object_set_new(o, "purposes", purposes);
	if (c->cls == SPACED_CLASS_SERVICEPORT) {
		json_object_set_new(o, "port", json_integer(c->port));
		json_object_set_new(o, "protocol", json_string(c->protocol));
	}
	if ((r = put_time(o, "exp", c->exp)) < 0 || (r = put_time(o, "iat", c->iat)) < 0 ||
	    (r = put_time(o, "nbf", c->nbf)) < 0)
		goto out;
	json_object_set_new(o, "jti", json_string(c->jti));
	char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
	if (s == NULL) {
		r = SPACED_ENOMEM;
		goto out;
	}
	*json = s;
	if (len != NULL)
		*len = strlen(s);
	r = SPACED_OK;
out:
	json_decref(o);
	return r;
}

/* Copies a JSON string member into dst (size dstsz), refusing anything else. */
static int copy_string(json_t *v, char *dst, size_t dstsz)
{
	if (!json_is_string(v))
		return SPACED_ECLAIM;
	size_t n = json_string_length(v);
	if (n >= dstsz)
		return SPACED_ECLAIM;
	memcpy(dst, json_string_value(v), n + 1);
	return SPACED_OK;
}

static int take_time(json_t *v, int64_t *out)
{
	if (!json_is_string(v))
		return SPACED_ECLAIM;
	return spaced_time_parse(json_string_value(v), json_string_length(v), out) < 0 ? SPACED_ECLAIM
	                                                                              : SPACED_OK;
}

enum claim_bit {
	C_SUB = 1 << 0, C_GEN = 1 << 1, C_WORKER = 1 << 2, C_SUBSTRATE = 1 << 3, C_ACT = 1 << 4,
	C_POD = 1 << 5, C_CLASS = 1 << 6, C_PURPOSES = 1 << 7, C_PORT = 1 << 8, C_PROTO = 1 << 9,
	C_EXP = 1 << 10, C_IAT = 1 << 11, C_NBF = 1 << 12, C_JTI = 1 << 13,
};
#define C_REQUIRED (C_SUB | C_GEN | C_WORKER | C_SUBSTRATE | C_ACT | C_CLASS | C_PURPOSES | C_EXP | C_IAT | C_NBF | C_JTI)

static int decode_member(struct spaced_cap *c, const char *key, json_t *v, unsigned *seen)
{
	switch (key[0]) {
	case 's':
		if (strcmp(key, "sub") == 0)
			return *seen |= C_SUB, copy_string(v, c->id.sandbox, sizeof c->id.sandbox);
		if (strcmp(key, "substrate") == 0)
			return *seen |= C_SUBSTRATE, copy_string(v, c->id.substrate, sizeof c->id.substrate);
		break;
	case 'g':
		if (strcmp(key, "generation") == 0) {
			*seen |= C_GEN;
			if (!json_is_integer(v) || json_integer_value(v) <= 0)
				return SPACED_ECLAIM;
			c->id.generation = (uint64_t)json_integer_value(v);
			return SPACED_OK;
		}
		break;
	case 'w':
		if (strcmp(key, "worker") == 0)
			return *seen |= C_WORKER, copy_string(v, c->id.worker, sizeof c->id.worker);
		break;
	case 'a':
		if (strcmp(key, "activation") == 0)
			return *seen |= C_ACT, copy_string(v, c->id.activation, sizeof c->id.activation);
		break;
	case 'c':
		if (strcmp(key, "class") == 0) {
			*seen |= C_CLASS;
			const char *s = json_string_value(v);
			if (s != NULL && strcmp(s, "control") == 0)
				c->cls = SPACED_CLASS_CONTROL;
			else if (s != NULL && strcmp(s, "serviceport") == 0)
				c->cls = SPACED_CLASS_SERVICEPORT;
			else
				return SPACED_ECLAIM;
			return SPACED_OK;
		}
		break;
	case 'p':
		if (strcmp(key, "pod_uid") == 0)
			return *seen |= C_POD, copy_string(v, c->id.pod_uid, sizeof c->id.pod_uid);
		if (strcmp(key, "purposes") == 0) {
			*seen |= C_PURPOSES;
			size_t i;
			json_t *e;
			if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > PURPOSE_COUNT)
				return SPACED_ECLAIM;
			json_array_foreach(v, i, e) {
				uint32_t p = spaced_purpose_parse(json_string_value(e));
				if (p == 0 || (c->purposes & p))
					return SPACED_ECLAIM; /* unknown or repeated purpose */
				c->purposes |= p;
			}
			return SPACED_OK;
		}
		if (strcmp(key, "port") == 0) {
			*seen |= C_PORT;
			if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65535)
				return SPACED_ECLAIM;
			c->port = (uint16_t)json_integer_value(v);
			return SPACED_OK;
		}
		if (strcmp(key, "protocol") == 0)
			return *seen |= C_PROTO, copy_string(v, c->protocol, sizeof c->protocol);
		break;
	case 'e':
		if (strcmp(key, "exp") == 0)
			return *seen |= C_EXP, take_time(v, &c->exp);
		break;
	case 'i':
		if (strcmp(key, "iat") == 0)
			return *seen |= C_IAT, take_time(v, &c->iat);
		break;
	case 'n':
		if (strcmp(key, "nbf") == 0)
			return *seen |= C_NBF, take_time(v, &c->nbf);
		break;
	case 'j':
		if (strcmp(key, "jti") == 0)
			return *seen |= C_JTI, copy_string(v, c->jti, sizeof c->jti);
		break;
	default:
		break;
	}
	return SPACED_ECLAIM; /* unknown claim */
}

int spaced_cap_claims_decode(struct spaced_cap *out, const uint8_t *json, size_t len)
{
	if (len > SPACED_CAP_CLAIMS_MAX)
		return SPACED_ETOOBIG;
	json_error_t err;
	json_t *o = json_loadb((const char *)json, len, JSON_REJECT_DUPLICATES, &err);
	if (o == NULL)
		return SPACED_EJSON;
	struct spaced_cap c;
	memset(&c, 0, sizeof c);
	unsigned seen = 0;
	int r = json_is_object(o) ? SPACED_OK : SPACED_EJSON;
	const char *key;
	json_t *v;
	json_object_foreach(o, key, v) {
		if (r < 0)
			break;
		r = decode_member(&c, key, v, &seen);
	}
	if (r == 0 && (seen & C_REQUIRED) != C_REQUIRED)
		r = SPACED_ECLAIM;
	/* A control capability carries no port or protocol claim at all (an empty
	 * "protocol" would otherwise pass the consistency check). */
	if (r == 0 && c.cls == SPACED_CLASS_CONTROL && (seen & (C_PORT | C_PROTO)) != 0)
		r = SPACED_ECLAIM;
	if (r == 0)
		r = spaced_cap_validate(&c);
	json_decref(o);
	if (r == 0)
		*out = c;
	return r;
}

int spaced_cap_footer_encode(const struct spaced_public_key *pk, char *out, size_t outsz)
{
	char pid[SPACED_PASERK_PID_LEN + 1];
	spaced_paserk_pid(pk, pid);
	int n = snprintf(out, outsz, "{\"kid\":\"%s\"}", pid);
	if (n < 0 || (size_t)n >= outsz)
		return SPACED_ETOOBIG;
	return n;
}

/* Deepest nesting of objects and arrays outside strings; -1 on an unbalanced
 * or unterminated input. Runs before any JSON parsing. */
static int json_depth(const uint8_t *s, size_t n)
{
	int depth = 0, max = 0;
	bool in_str = false;
	for (size_t i = 0; i < n; i++) {
		uint8_t ch = s[i];
		if (in_str) {
			if (ch == '\\')
				i++;
			else if (ch == '"')
				in_str = false;
		} else if (ch == '"') {
			in_str = true;
		} else if (ch == '{' || ch == '[') {
			if (++depth > max)
				max = depth;
		} else if (ch == '}' || ch == ']') {
			if (--depth < 0)
				return -1;
		}
	}
	return (in_str || depth != 0) ? -1 : max;
}

int spaced_cap_footer_kid(const uint8_t *footer, size_t len, char kid[SPACED_PASERK_PID_LEN + 1])
{
	static const char pre[] = "{\"kid\":\"", post[] = "\"}";
	const size_t canonical = sizeof pre - 1 + SPACED_PASERK_PID_LEN + sizeof post - 1;
	if (len == canonical && memcmp(footer, pre, sizeof pre - 1) == 0 &&
	    memcmp(footer + len - (sizeof post - 1), post, sizeof post - 1) == 0) {
		/* The exact form spaced issues: no JSON parser needed to read it. */
		const char *pid = (const char *)footer + sizeof pre - 1;
		if (!spaced_paserk_pid_valid(pid, SPACED_PASERK_PID_LEN))
			return SPACED_EKEY;
		memcpy(kid, pid, SPACED_PASERK_PID_LEN);
		kid[SPACED_PASERK_PID_LEN] = 0;
		return SPACED_OK;
	}
	if (len == 0)
		return SPACED_EFORMAT;
	if (len > SPACED_CAP_FOOTER_MAX)
		return SPACED_ETOOBIG;
	int d = json_depth(footer, len);
	if (d < 0 || d > SPACED_CAP_FOOTER_DEPTH)
		return SPACED_EFORMAT;
	json_error_t err;
	json_t *o = json_loadb((const char *)footer, len, JSON_REJECT_DUPLICATES, &err);
	if (o == NULL)
		return SPACED_EJSON;
	int r = SPACED_OK;
	json_t *k = json_object_get(o, "kid");
	if (!json_is_object(o) || json_object_size(o) != 1 || !json_is_string(k)) {
		r = SPACED_EFORMAT;
	} else if (!spaced_paserk_pid_valid(json_string_value(k), json_string_length(k))) {
		r = SPACED_EKEY;
	} else {
		memcpy(kid, json_string_value(k), SPACED_PASERK_PID_LEN + 1);
	}
	json_decref(o);
	return r;
}

int spaced_cap_check_time(const struct spaced_cap *c, int64_t now)
{
	/* Each difference is taken only when positive, in uint64_t: no overflow
	 * whatever the values. */
	if (now > c->exp && (uint64_t)now - (uint64_t)c->exp > SPACED_CAP_SKEW)
		return SPACED_EEXPIRED;
	if ((c->nbf > now && (uint64_t)c->nbf - (uint64_t)now > SPACED_CAP_SKEW) ||
	    (c->iat > now && (uint64_t)c->iat - (uint64_t)now > SPACED_CAP_SKEW))
		return SPACED_ENOTYET;
	return SPACED_OK;
}

int spaced_cap_verify(const struct spaced_keyring *kr, struct spaced_vcache *cache, const char *token,
                      size_t len, enum spaced_cap_class cls, int64_t now, struct spaced_cap *out)
{
	struct spaced_paseto t = {0};
	struct spaced_cap c;
	struct spaced_public_key pk;
	uint8_t digest[SPACED_VCACHE_DIGEST];
	int r;

	if (token == NULL || len > SPACED_PASETO_TOKEN_MAX)
		return token == NULL ? SPACED_EINVAL : SPACED_ETOOBIG;
	if (cache != NULL) {
		spaced_vcache_digest(cls, token, len, digest);
		if (spaced_vcache_get(cache, spaced_keyring_epoch(kr), digest, now, &c) == 0) {
			/* A hit skips the signature check only: the signing key must
			 * still be inside its validity window now, as without the cache. */
			if ((r = spaced_keyring_lookup(kr, c.kid, now, &pk, NULL)) < 0)
				return r;
			if ((r = spaced_cap_check_time(&c, now)) < 0)
				return r;
			*out = c;
			return SPACED_OK;
		}
	}
	if ((r = spaced_paseto_parse(&t, token, len)) < 0)
		return r;
	memset(&c, 0, sizeof c);
	if ((r = spaced_cap_footer_kid(t.footer, t.footer_len, c.kid)) < 0)
		goto out;
	uint64_t epoch;
	if ((r = spaced_keyring_lookup(kr, c.kid, now, &pk, &epoch)) < 0)
		goto out;
	char kid[sizeof c.kid];
	memcpy(kid, c.kid, sizeof kid);
	if ((r = spaced_cap_claims_decode(&c, t.msg, t.msg_len)) < 0)
		goto out;
	memcpy(c.kid, kid, sizeof kid);
	if (c.cls != cls) {
		r = SPACED_EPURPOSE;
		goto out;
	}
	const char *ia = spaced_cap_implicit(cls);
	if ((r = spaced_paseto_check(&t, pk.pk, (const uint8_t *)ia, strlen(ia))) < 0)
		goto out;
	if ((r = spaced_cap_check_time(&c, now)) < 0)
		goto out;
	if (cache != NULL)
		spaced_vcache_put(cache, epoch, digest, &c);
	*out = c;
out:
	spaced_paseto_clear(&t);
	return r;
}
