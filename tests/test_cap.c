/*
 * test_cap.c — capabilities: issue and verify, and the whole negative catalogue
 * (C1, C3, C4, C5, R6). Every refusal is driven through spaced_cap_verify, then
 * spaced_decision_from_error / spaced_compare, to the DENY reason a receiver
 * would answer. Hostile tokens are signed by hand with spaced_paseto_sign.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "cap.h"
#include "compare.h"
#include "spaced_error.h"
#include "keyring.h"
#include "paserk.h"
#include "paseto.h"
#include "signer.h"
#include "util.h"

/* A fixed "now" (2026-12-01T00:00:00Z): verification takes the time as input. */
#define NOW INT64_C(1796083200)

struct fixture {
	struct spaced_secret_key *sk, *other_sk;
	struct spaced_public_key pk, other_pk;
	struct spaced_keyring *kr;
};

static struct fixture fx;

static struct spaced_secret_key *seeded_key(uint8_t fill)
{
	uint8_t seed[32];
	struct spaced_secret_key *sk = NULL;
	memset(seed, fill, sizeof seed);
	cr_assert_eq(spaced_secret_key_from_bytes(&sk, seed, sizeof seed), 0);
	return sk;
}

static void setup(void)
{
	fx.sk = seeded_key(0x11);
	fx.other_sk = seeded_key(0x22);
	spaced_secret_key_public(fx.sk, &fx.pk);
	spaced_secret_key_public(fx.other_sk, &fx.other_pk);
	cr_assert_eq(spaced_keyring_new(&fx.kr), 0);
	cr_assert_eq(spaced_keyring_add(fx.kr, &fx.pk, NOW - 86400, NOW + 86400), 0);
}

static void teardown(void)
{
	spaced_keyring_free(fx.kr);
	spaced_secret_key_free(fx.sk);
	spaced_secret_key_free(fx.other_sk);
	memset(&fx, 0, sizeof fx);
}

TestSuite(cap, .init = setup, .fini = teardown);

static struct spaced_cap control_cap(void)
{
	struct spaced_cap c;
	memset(&c, 0, sizeof c);
	cr_assert_eq(spaced_identity_set(&c.id, "sbx-1", 7, "worker-a", "process", "act-1", NULL), 0);
	c.cls = SPACED_CLASS_CONTROL;
	c.purposes = SPACED_PURPOSE_FS_READ | SPACED_PURPOSE_EXEC;
	c.iat = c.nbf = NOW;
	c.exp = NOW + SPACED_CAP_LIFETIME;
	strcpy(c.jti, "jti-1");
	return c;
}

static struct spaced_cap serviceport_cap(void)
{
	struct spaced_cap c = control_cap();
	c.cls = SPACED_CLASS_SERVICEPORT;
	c.purposes = SPACED_PURPOSE_SERVICEPORT;
	c.port = 8080;
	strcpy(c.protocol, "http");
	return c;
}

static struct spaced_record record_of(const struct spaced_cap *c)
{
	struct spaced_record r = {.id = c->id, .epoch = 1, .active = true};
	return r;
}

static char *issue(const struct spaced_cap *c)
{
	char *t = NULL;
	int r = spaced_cap_issue(fx.sk, c, &t);
	cr_assert_eq(r, 0, "issue: %s", spaced_errname(r));
	return t;
}

/* Signs arbitrary claims / footer / implicit assertion with sk. */
static char *sign_raw(const struct spaced_secret_key *sk, const char *claims, const char *footer,
                      const char *implicit)
{
	char *t = NULL;
	cr_assert_eq(spaced_paseto_sign(sk, (const uint8_t *)claims, strlen(claims), (const uint8_t *)footer,
	                                footer ? strlen(footer) : 0, (const uint8_t *)implicit,
	                                implicit ? strlen(implicit) : 0, &t),
	             0);
	return t;
}

static const char *footer_for(const struct spaced_public_key *pk)
{
	static char f[SPACED_CAP_FOOTER_MAX];
	cr_assert_gt(spaced_cap_footer_encode(pk, f, sizeof f), 0);
	return f;
}

/* Signs claims the way the issuer does (right footer, class implicit assertion). */
static char *sign_claims(const char *claims, enum spaced_cap_class cls)
{
	return sign_raw(fx.sk, claims, footer_for(&fx.pk), spaced_cap_implicit(cls));
}

static char *claims_of(const struct spaced_cap *c)
{
	char *j = NULL;
	size_t n = 0;
	cr_assert_eq(spaced_cap_claims_encode(c, &j, &n), 0);
	cr_assert_eq(n, strlen(j));
	return j;
}

/* The claims of c as a JSON object to edit. */
static json_t *claims_obj(const struct spaced_cap *c)
{
	char *j = claims_of(c);
	json_error_t e;
	json_t *o = json_loads(j, JSON_REJECT_DUPLICATES, &e);
	cr_assert_not_null(o);
	free(j);
	return o;
}

static char *sign_obj(json_t *o, enum spaced_cap_class cls)
{
	char *j = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
	cr_assert_not_null(j);
	char *t = sign_claims(j, cls);
	free(j);
	return t;
}

static int verify_at(const char *token, enum spaced_cap_class cls, int64_t now, struct spaced_cap *out)
{
	struct spaced_cap tmp;
	return spaced_cap_verify(fx.kr, NULL, token, strlen(token), cls, now, out ? out : &tmp);
}

/* The receiver's whole decision: verify, then compare with the record. */
static struct spaced_decision decide(const char *token, enum spaced_cap_class cls, int64_t now,
                                     const struct spaced_request *req, const struct spaced_record *rec)
{
	struct spaced_cap c;
	int r = verify_at(token, cls, now, &c);
	if (r < 0)
		return spaced_decision_from_error(r);
	return spaced_compare(&c, req, rec, SPACED_COMPARE_STRICT);
}

#define expect_decision(d, v, why)                                                                     \
	do {                                                                                           \
		struct spaced_decision d_ = (d);                                                      \
		cr_assert_eq(d_.verdict, (v), "verdict %s (%s), expected %s (%s)",                     \
		             spaced_verdict_name(d_.verdict), spaced_reason_name(d_.reason),           \
		             spaced_verdict_name(v), spaced_reason_name(why));                         \
		cr_assert_eq(d_.reason, (why), "reason %s, expected %s", spaced_reason_name(d_.reason), \
		             spaced_reason_name(why));                                                 \
	} while (0)

static const struct spaced_request REQ_EXEC = {SPACED_PURPOSE_EXEC, 0, NULL};
static const struct spaced_request REQ_HTTP_8080 = {SPACED_PURPOSE_SERVICEPORT, 8080, "http"};

/* Verifies claims edited in o (signed properly) and expects err. */
static void expect_claims_refused(json_t *o, enum spaced_cap_class cls, int err, const char *what)
{
	char *t = sign_obj(o, cls);
	struct spaced_cap c;
	int r = verify_at(t, cls, NOW, &c);
	cr_assert_eq(r, err, "%s: got %s, expected %s", what, spaced_errname(r), spaced_errname(err));
	struct spaced_record rec = record_of(&c);
	expect_decision(decide(t, cls, NOW, &REQ_EXEC, &rec), SPACED_DENY, SPACED_REASON_MALFORMED);
	free(t);
}

/* ---- round trips ---- */

Test(cap, issue_verify_round_trip)
{
	struct spaced_cap c = control_cap(), got;
	char *t = issue(&c);
	cr_assert_eq(verify_at(t, SPACED_CLASS_CONTROL, NOW, &got), 0);
	cr_assert(spaced_identity_equal(&got.id, &c.id));
	cr_assert_eq(got.purposes, c.purposes);
	cr_assert_eq(got.cls, SPACED_CLASS_CONTROL);
	cr_assert_eq(got.exp, c.exp);
	cr_assert_eq(got.iat, c.iat);
	cr_assert_eq(got.nbf, c.nbf);
	cr_assert_str_eq(got.jti, c.jti);
	char pid[SPACED_PASERK_PID_LEN + 1];
	spaced_paserk_pid(&fx.pk, pid);
	cr_assert_str_eq(got.kid, pid, "kid comes from the footer");
	struct spaced_record rec = record_of(&c);
	expect_decision(decide(t, SPACED_CLASS_CONTROL, NOW, &REQ_EXEC, &rec), SPACED_ALLOW, SPACED_REASON_OK);
	struct spaced_request rd = {SPACED_PURPOSE_FS_READ, 0, NULL};
	expect_decision(decide(t, SPACED_CLASS_CONTROL, NOW, &rd, &rec), SPACED_ALLOW, SPACED_REASON_OK);
	free(t);
}

Test(cap, serviceport_round_trip_with_pod)
{
	struct spaced_cap c = serviceport_cap(), got;
	strcpy(c.id.pod_uid, "pod-123");
	char *t = issue(&c);
	cr_assert_eq(verify_at(t, SPACED_CLASS_SERVICEPORT, NOW, &got), 0);
	cr_assert_eq(got.port, 8080);
	cr_assert_str_eq(got.protocol, "http");
	cr_assert_str_eq(got.id.pod_uid, "pod-123");
	struct spaced_record rec = record_of(&c);
	expect_decision(decide(t, SPACED_CLASS_SERVICEPORT, NOW, &REQ_HTTP_8080, &rec), SPACED_ALLOW,
	                SPACED_REASON_OK);
	free(t);
}

Test(cap, claims_encode_decode_round_trip)
{
	struct spaced_cap c = serviceport_cap(), back;
	char *j = claims_of(&c);
	cr_assert_eq(spaced_cap_claims_decode(&back, (const uint8_t *)j, strlen(j)), 0);
	cr_assert(spaced_identity_equal(&back.id, &c.id));
	cr_assert_eq(back.port, c.port);
	cr_assert_str_eq(back.kid, "", "claims carry no kid");
	free(j);
}

/* ---- time (C3) ---- */

Test(cap, expiry_skew_boundary)
{
	struct spaced_cap c = control_cap();
	char *t = issue(&c);
	struct spaced_record rec = record_of(&c);
	cr_assert_eq(verify_at(t, SPACED_CLASS_CONTROL, c.exp, NULL), 0);
	cr_assert_eq(verify_at(t, SPACED_CLASS_CONTROL, c.exp + 15, NULL), 0, "accepted at exactly exp+15 s");
	cr_assert_eq(verify_at(t, SPACED_CLASS_CONTROL, c.exp + 16, NULL), SPACED_EEXPIRED, "refused at exp+16 s");
	expect_decision(decide(t, SPACED_CLASS_CONTROL, c.exp + 16, &REQ_EXEC, &rec), SPACED_DENY,
	                SPACED_REASON_EXPIRED);
	expect_decision(decide(t, SPACED_CLASS_CONTROL, c.exp + 50000, &REQ_EXEC, &rec), SPACED_DENY,
	                SPACED_REASON_EXPIRED);
	free(t);
}

Test(cap, not_before_skew_boundary)
{
	struct spaced_cap c = control_cap();
	c.nbf = NOW + 15;
	char *t = issue(&c);
	struct spaced_record rec = record_of(&c);
	cr_assert_eq(verify_at(t, SPACED_CLASS_CONTROL, NOW, NULL), 0, "nbf exactly now+15 accepted");
	free(t);
	c.nbf = NOW + 16;
	t = issue(&c);
	cr_assert_eq(verify_at(t, SPACED_CLASS_CONTROL, NOW, NULL), SPACED_ENOTYET, "nbf now+16 refused");
	expect_decision(decide(t, SPACED_CLASS_CONTROL, NOW, &REQ_EXEC, &rec), SPACED_DENY,
	                SPACED_REASON_NOT_YET_VALID);
	cr_assert_eq(verify_at(t, SPACED_CLASS_CONTROL, NOW + 1, NULL), 0);
	free(t);
}

Test(cap, issued_at_skew_boundary)
{
	struct spaced_cap c = control_cap();
	c.iat = c.nbf = NOW + 15;
	c.exp = c.iat + SPACED_CAP_LIFETIME;
	char *t = issue(&c);
	struct spaced_record rec = record_of(&c);
	cr_assert_eq(verify_at(t, SPACED_CLASS_CONTROL, NOW, NULL), 0, "iat exactly now+15 accepted");
	free(t);
	c.iat = c.nbf = NOW + 16;
	c.exp = c.iat + SPACED_CAP_LIFETIME;
	t = issue(&c);
	cr_assert_eq(verify_at(t, SPACED_CLASS_CONTROL, NOW, NULL), SPACED_ENOTYET, "iat now+16 refused");
	expect_decision(decide(t, SPACED_CLASS_CONTROL, NOW, &REQ_EXEC, &rec), SPACED_DENY,
	                SPACED_REASON_NOT_YET_VALID);
	free(t);
	/* iat alone in the future (nbf in range) is refused too: a hand-made claim
	 * set with nbf < iat is inconsistent and refused before the time check. */
	json_t *o = claims_obj(&c);
	json_object_set_new(o, "nbf", json_string("2026-12-01T00:00:00Z"));
	expect_claims_refused(o, SPACED_CLASS_CONTROL, SPACED_ECLAIM, "nbf before iat");
	json_decref(o);
}

Test(cap, check_time_direct)
{
	struct spaced_cap c = control_cap();
	cr_assert_eq(spaced_cap_check_time(&c, c.exp + SPACED_CAP_SKEW), 0);
	cr_assert_eq(spaced_cap_check_time(&c, c.exp + SPACED_CAP_SKEW + 1), SPACED_EEXPIRED);
	cr_assert_eq(spaced_cap_check_time(&c, c.nbf - SPACED_CAP_SKEW), 0);
	cr_assert_eq(spaced_cap_check_time(&c, c.nbf - SPACED_CAP_SKEW - 1), SPACED_ENOTYET);
}

/* C3: a capability lives at most 120 s, refused at issue and at verification. */
Test(cap, lifetime_over_limit)
{
	struct spaced_cap c = control_cap();
	char *t = NULL;
	c.exp = c.iat + SPACED_CAP_LIFETIME + 1;
	cr_assert_eq(spaced_cap_validate(&c), SPACED_ECLAIM);
	cr_assert_eq(spaced_cap_issue(fx.sk, &c, &t), SPACED_ECLAIM);
	cr_assert_null(t);
	c.exp = c.iat + SPACED_CAP_LIFETIME;
	json_t *o = claims_obj(&c);
	json_object_set_new(o, "exp", json_string("2026-12-01T00:02:01Z")); /* NOW + 121 */
	expect_claims_refused(o, SPACED_CLASS_CONTROL, SPACED_ECLAIM, "lifetime 121 s");
	json_object_set_new(o, "exp", json_string("2026-12-01T00:02:00Z")); /* NOW + 120 */
	char *ok = sign_obj(o, SPACED_CLASS_CONTROL);
	cr_assert_eq(verify_at(ok, SPACED_CLASS_CONTROL, NOW, NULL), 0, "exactly 120 s");
	free(ok);
	json_object_set_new(o, "exp", json_string("2026-12-01T00:00:00Z")); /* exp == nbf */
	expect_claims_refused(o, SPACED_CLASS_CONTROL, SPACED_ECLAIM, "exp not after nbf");
	json_decref(o);
}

/* ---- signature and keys (C2, C5) ---- */

Test(cap, bad_signature)
{
	struct spaced_cap c = control_cap();
	char *t = issue(&c);
	struct spaced_record rec = record_of(&c);
	struct spaced_paseto p = {0};
	cr_assert_eq(spaced_paseto_parse(&p, t, strlen(t)), 0);
	size_t blen = p.msg_len + SPACED_PASETO_SIG_LEN;
	uint8_t *body = malloc(blen);
	memcpy(body, p.msg, blen);
	body[blen - 1] ^= 0x80;
	char *enc = malloc(spaced_b64url_encoded_len(blen) + 1);
	spaced_b64url_encode(enc, body, blen);
	char *bad = malloc(strlen(t) + 1);
	sprintf(bad, "v4.public.%s%s", enc, strchr(t + 10, '.'));
	cr_assert_eq(verify_at(bad, SPACED_CLASS_CONTROL, NOW, NULL), SPACED_ESIG);
	expect_decision(decide(bad, SPACED_CLASS_CONTROL, NOW, &REQ_EXEC, &rec), SPACED_DENY,
	                SPACED_REASON_BAD_SIGNATURE);
	/* changed claims under the original signature */
	memcpy(body, p.msg, blen);
	char *gen = memmem(body, p.msg_len, "\"generation\":7", 14);
	cr_assert_not_null(gen);
	gen[13] = '8';
	spaced_b64url_encode(enc, body, blen);
	sprintf(bad, "v4.public.%s%s", enc, strchr(t + 10, '.'));
	expect_decision(decide(bad, SPACED_CLASS_CONTROL, NOW, &REQ_EXEC, &rec), SPACED_DENY,
	                SPACED_REASON_BAD_SIGNATURE);
	free(bad);
	free(enc);
	free(body);
	spaced_paseto_clear(&p);
	free(t);
}

/* Claims signed with a key that is not in the keyring, under a footer naming a
 * key that is: the signature fails. */
Test(cap, signed_by_key_not_in_keyring)
{
	struct spaced_cap c = control_cap();
	struct spaced_record rec = record_of(&c);
	char *j = claims_of(&c);
	char *t = sign_raw(fx.other_sk, j, footer_for(&fx.pk), spaced_cap_implicit(SPACED_CLASS_CONTROL));
	expect_decision(decide(t, SPACED_CLASS_CONTROL, NOW, &REQ_EXEC, &rec), SPACED_DENY,
	                SPACED_REASON_BAD_SIGNATURE);
	free(t);
	/* the same, with its own key ID in the footer: the key is unknown */
	t = sign_raw(fx.other_sk, j, footer_for(&fx.other_pk), spaced_cap_implicit(SPACED_CLASS_CONTROL));
	cr_assert_eq(verify_at(t, SPACED_CLASS_CONTROL, NOW, NULL), SPACED_EUNKNOWNKEY);
	expect_decision(decide(t, SPACED_CLASS_CONTROL, NOW, &REQ_EXEC, &rec), SPACED_DENY,
	                SPACED_REASON_UNKNOWN_KEY);
	free(t);
	/* issued properly by the other key: unknown too */
	char *t2 = NULL;
	cr_assert_eq(spaced_cap_issue(fx.other_sk, &c, &t2), 0);
	expect_decision(decide(t2, SPACED_CLASS_CONTROL, NOW, &REQ_EXEC, &rec), SPACED_DENY,
	                SPACED_REASON_UNKNOWN_KEY);
	free(t2);
	free(j);
}

Test(cap, key_outside_its_window)
{
	struct spaced_cap c = control_cap();
	struct spaced_record rec = record_of(&c);
	struct spaced_keyring *kr;
	cr_assert_eq(spaced_keyring_new(&kr), 0);
	cr_assert_eq(spaced_keyring_add(kr, &fx.pk, NOW + 10, NOW + 20), 0);
	spaced_keyring_free(fx.kr);
	fx.kr = kr;
	char *t = issue(&c);
	expect_decision(decide(t, SPACED_CLASS_CONTROL, NOW + 9, &REQ_EXEC, &rec), SPACED_DENY,
	                SPACED_REASON_UNKNOWN_KEY);
	expect_decision(decide(t, SPACED_CLASS_CONTROL, NOW + 10, &REQ_EXEC, &rec), SPACED_ALLOW, SPACED_REASON_OK);
	expect_decision(decide(t, SPACED_CLASS_CONTROL, NOW + 20, &REQ_EXEC, &rec), SPACED_ALLOW, SPACED_REASON_OK);
	expect_decision(decide(t, SPACED_CLASS_CONTROL, NOW + 21, &REQ_EXEC, &rec), SPACED_DENY,
	                SPACED_REASON_UNKNOWN_KEY);
	free(t);
}

Test(cap, empty_keyring_fails_closed)
{
	struct spaced_keyring *kr;
	struct spaced_cap c = control_cap(), out;
	cr_assert_eq(spaced_keyring_new(&kr), 0);
	char *t = issue(&c);
	cr_assert_eq(spaced_cap_verify(kr, NULL, t, strlen(t), SPACED_CLASS_CONTROL, NOW, &out), SPACED_EUNKNOWNKEY);
	spaced_keyring_free(kr);
	free(t);
}

/* ---- purpose classes (C1, C5) ---- */

Test(cap, wrong_purpose_not_granted)
{
	struct spaced_cap c = control_cap();
	char *t = issue(&c);
	struct spaced_record rec = record_of(&c);
	const uint32_t refused[] = {SPACED_PURPOSE_FS_WRITE, SPACED_PURPOSE_TERM, SPACED_PURPOSE_WATCH,
	                            SPACED_PURPOSE_LIFECYCLE, SPACED_PURPOSE_SERVICEPORT,
	                            SPACED_PURPOSE_EXEC | SPACED_PURPOSE_FS_READ, 0, 1u << 20};
	for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
		struct spaced_request req = {refused[i], 0, NULL};
		expect_decision(decide(t, SPACED_CLASS_CONTROL, NOW, &req, &rec), SPACED_DENY,
		                SPACED_REASON_WRONG_PURPOSE);
	}
	free(t);
}

Test(cap, serviceport_presented_as_control_and_reverse)
{
	struct spaced_cap sp = serviceport_cap(), ctl = control_cap();
	char *tsp = issue(&sp), *tctl = issue(&ctl);
	struct spaced_record rec = record_of(&ctl);
	cr_assert_eq(verify_at(tsp, SPACED_CLASS_CONTROL, NOW, NULL), SPACED_EPURPOSE);
	cr_assert_eq(verify_at(tctl, SPACED_CLASS_SERVICEPORT, NOW, NULL), SPACED_EPURPOSE);
	expect_decision(decide(tsp, SPACED_CLASS_CONTROL, NOW, &REQ_EXEC, &rec), SPACED_DENY,
	                SPACED_REASON_WRONG_PURPOSE);
	expect_decision(decide(tctl, SPACED_CLASS_SERVICEPORT, NOW, &REQ_HTTP_8080, &rec), SPACED_DENY,
	                SPACED_REASON_WRONG_PURPOSE);
	free(tsp);
	free(tctl);
}

/* The class is bound by the implicit assertion as well as by the claim: claims
 * of one class signed under the other class's implicit assertion never verify. */
Test(cap, class_bound_by_implicit_assertion)
{
	struct spaced_cap sp = serviceport_cap(), ctl = control_cap();
	struct spaced_record rec = record_of(&ctl);
	char *jsp = claims_of(&sp), *jctl = claims_of(&ctl);
	char *t1 = sign_raw(fx.sk, jsp, footer_for(&fx.pk), spaced_cap_implicit(SPACED_CLASS_CONTROL));
	char *t2 = sign_raw(fx.sk, jctl, footer_for(&fx.pk), spaced_cap_implicit(SPACED_CLASS_SERVICEPORT));
	char *t3 = sign_raw(fx.sk, jctl, footer_for(&fx.pk), NULL);
	cr_assert_eq(verify_at(t1, SPACED_CLASS_SERVICEPORT, NOW, NULL), SPACED_ESIG);
	cr_assert_eq(verify_at(t1, SPACED_CLASS_CONTROL, NOW, NULL), SPACED_EPURPOSE);
	cr_assert_eq(verify_at(t2, SPACED_CLASS_CONTROL, NOW, NULL), SPACED_ESIG);
	cr_assert_eq(verify_at(t2, SPACED_CLASS_SERVICEPORT, NOW, NULL), SPACED_EPURPOSE);
	cr_assert_eq(verify_at(t3, SPACED_CLASS_CONTROL, NOW, NULL), SPACED_ESIG, "no implicit assertion");
	expect_decision(decide(t2, SPACED_CLASS_CONTROL, NOW, &REQ_EXEC, &rec), SPACED_DENY,
	                SPACED_REASON_BAD_SIGNATURE);
	cr_assert_str_neq(spaced_cap_implicit(SPACED_CLASS_CONTROL), spaced_cap_implicit(SPACED_CLASS_SERVICEPORT));
	free(t1);
	free(t2);
	free(t3);
	free(jsp);
	free(jctl);
}

Test(cap, wrong_port_and_protocol)
{
	struct spaced_cap c = serviceport_cap();
	char *t = issue(&c);
	struct spaced_record rec = record_of(&c);
	struct spaced_request p1 = {SPACED_PURPOSE_SERVICEPORT, 8081, "http"};
	struct spaced_request p2 = {SPACED_PURPOSE_SERVICEPORT, 0, "http"};
	struct spaced_request q1 = {SPACED_PURPOSE_SERVICEPORT, 8080, "tcp"};
	struct spaced_request q2 = {SPACED_PURPOSE_SERVICEPORT, 8080, NULL};
	struct spaced_request q3 = {SPACED_PURPOSE_SERVICEPORT, 8080, "HTTP"};
	expect_decision(decide(t, SPACED_CLASS_SERVICEPORT, NOW, &p1, &rec), SPACED_DENY, SPACED_REASON_WRONG_PORT);
	expect_decision(decide(t, SPACED_CLASS_SERVICEPORT, NOW, &p2, &rec), SPACED_DENY, SPACED_REASON_WRONG_PORT);
	expect_decision(decide(t, SPACED_CLASS_SERVICEPORT, NOW, &q1, &rec), SPACED_DENY,
	                SPACED_REASON_WRONG_PROTOCOL);
	expect_decision(decide(t, SPACED_CLASS_SERVICEPORT, NOW, &q2, &rec), SPACED_DENY,
	                SPACED_REASON_WRONG_PROTOCOL);
	expect_decision(decide(t, SPACED_CLASS_SERVICEPORT, NOW, &q3, &rec), SPACED_DENY,
	                SPACED_REASON_WRONG_PROTOCOL);
	free(t);
}

/* ---- which sandbox ---- */

Test(cap, unknown_and_other_sandbox)
{
	struct spaced_cap c = control_cap();
	char *t = issue(&c);
	expect_decision(decide(t, SPACED_CLASS_CONTROL, NOW, &REQ_EXEC, NULL), SPACED_DENY,
	                SPACED_REASON_UNKNOWN_SANDBOX);
	struct spaced_record rec = record_of(&c);
	strcpy(rec.id.sandbox, "sbx-2");
	expect_decision(decide(t, SPACED_CLASS_CONTROL, NOW, &REQ_EXEC, &rec), SPACED_DENY,
	                SPACED_REASON_OTHER_SANDBOX);
	strcpy(rec.id.sandbox, "sbx-1x");
	expect_decision(decide(t, SPACED_CLASS_CONTROL, NOW, &REQ_EXEC, &rec), SPACED_DENY,
	                SPACED_REASON_OTHER_SANDBOX);
	/* C4: valid signature and time, other execution of the same sandbox */
	rec = record_of(&c);
	rec.id.generation = 8;
	expect_decision(decide(t, SPACED_CLASS_CONTROL, NOW, &REQ_EXEC, &rec), SPACED_REFRESH_ROUTE,
	                SPACED_REASON_OLDER_GENERATION);
	free(t);
}

/* ---- malformed claims ---- */

Test(cap, missing_required_claims)
{
	static const char *const control_required[] = {"sub", "generation", "worker", "substrate", "activation",
	                                               "class", "purposes", "exp", "iat", "nbf", "jti"};
	struct spaced_cap c = control_cap();
	for (size_t i = 0; i < sizeof control_required / sizeof control_required[0]; i++) {
		json_t *o = claims_obj(&c);
		cr_assert_eq(json_object_del(o, control_required[i]), 0, "%s", control_required[i]);
		expect_claims_refused(o, SPACED_CLASS_CONTROL, SPACED_ECLAIM, control_required[i]);
		json_decref(o);
	}
	static const char *const sp_required[] = {"sub", "generation", "worker", "substrate", "activation",
	                                          "class", "purposes", "port", "protocol", "exp", "iat", "nbf",
	                                          "jti"};
	struct spaced_cap s = serviceport_cap();
	for (size_t i = 0; i < sizeof sp_required / sizeof sp_required[0]; i++) {
		json_t *o = claims_obj(&s);
		cr_assert_eq(json_object_del(o, sp_required[i]), 0, "%s", sp_required[i]);
		expect_claims_refused(o, SPACED_CLASS_SERVICEPORT, SPACED_ECLAIM, sp_required[i]);
		json_decref(o);
	}
}

/* A serviceport capability without its port or protocol cannot be issued; a
 * control one cannot carry them. */
Test(cap, serviceport_port_protocol_consistency)
{
	struct spaced_cap s = serviceport_cap();
	char *t = NULL;
	s.port = 0;
	cr_assert_eq(spaced_cap_issue(fx.sk, &s, &t), SPACED_ECLAIM);
	s = serviceport_cap();
	s.protocol[0] = 0;
	cr_assert_eq(spaced_cap_issue(fx.sk, &s, &t), SPACED_ECLAIM);
	s = serviceport_cap();
	strcpy(s.protocol, "ftp");
	cr_assert_eq(spaced_cap_issue(fx.sk, &s, &t), SPACED_ECLAIM);
	s = serviceport_cap();
	s.purposes |= SPACED_PURPOSE_EXEC;
	cr_assert_eq(spaced_cap_issue(fx.sk, &s, &t), SPACED_ECLAIM, "serviceport with other purposes");
	struct spaced_cap c = control_cap();
	c.port = 80;
	cr_assert_eq(spaced_cap_issue(fx.sk, &c, &t), SPACED_ECLAIM);
	c = control_cap();
	strcpy(c.protocol, "tcp");
	cr_assert_eq(spaced_cap_issue(fx.sk, &c, &t), SPACED_ECLAIM);
	c = control_cap();
	c.purposes |= SPACED_PURPOSE_SERVICEPORT;
	cr_assert_eq(spaced_cap_issue(fx.sk, &c, &t), SPACED_ECLAIM);
	c = control_cap();
	c.cls = (enum spaced_cap_class)7;
	cr_assert_eq(spaced_cap_issue(fx.sk, &c, &t), SPACED_ECLAIM);
	cr_assert_null(t);

	/* hand-signed: control claims carrying a port or protocol */
	c = control_cap();
	json_t *o = claims_obj(&c);
	json_object_set_new(o, "port", json_integer(80));
	expect_claims_refused(o, SPACED_CLASS_CONTROL, SPACED_ECLAIM, "control with port");
	json_object_del(o, "port");
	json_object_set_new(o, "protocol", json_string("tcp"));
	expect_claims_refused(o, SPACED_CLASS_CONTROL, SPACED_ECLAIM, "control with protocol");
	json_decref(o);
	/* hand-signed: serviceport with an unknown protocol or another purpose */
	s = serviceport_cap();
	o = claims_obj(&s);
	json_object_set_new(o, "protocol", json_string("ftp"));
	expect_claims_refused(o, SPACED_CLASS_SERVICEPORT, SPACED_ECLAIM, "unknown protocol");
	json_object_set_new(o, "protocol", json_string("http"));
	json_object_set_new(o, "purposes", json_pack("[s,s]", "serviceport", "exec"));
	expect_claims_refused(o, SPACED_CLASS_SERVICEPORT, SPACED_ECLAIM, "serviceport plus exec");
	json_decref(o);
}

struct bad_value {
	const char *key;
	const char *json; /* the value, as JSON text */
};

Test(cap, wrong_types_and_values)
{
	static const struct bad_value bad[] = {
		{"sub", "5"}, {"sub", "null"}, {"sub", "\"\""}, {"sub", "\"a b\""}, {"sub", "[\"sbx-1\"]"},
		{"sub", "\"0123456789012345678901234567890123456789012345678901234567890123\""},
		{"generation", "\"7\""}, {"generation", "7.0"}, {"generation", "0"}, {"generation", "-1"},
		{"generation", "9007199254740992"}, {"generation", "true"}, {"generation", "null"},
		{"worker", "true"}, {"worker", "\"w/1\""}, {"substrate", "{}"}, {"activation", "1"},
		{"pod_uid", "5"}, {"pod_uid", "\"p;1\""}, {"class", "\"admin\""}, {"class", "0"},
		{"class", "\"serviceport\""}, {"purposes", "\"exec\""}, {"purposes", "[]"},
		{"purposes", "[\"bogus\"]"}, {"purposes", "[1]"}, {"purposes", "[\"exec\",\"exec\"]"},
		{"purposes", "[\"EXEC\"]"}, {"purposes", "{\"exec\":true}"},
		{"exp", "1796083320"}, {"exp", "\"yesterday\""}, {"exp", "\"2026-12-01 00:02:00Z\""},
		{"exp", "\"2026-12-01T00:02:00\""}, {"exp", "\"2026-13-01T00:02:00Z\""}, {"iat", "null"},
		{"nbf", "\"2026-02-30T00:00:00Z\""}, {"jti", "5"}, {"jti", "\"\""}, {"jti", "\"a\\u0000b\""},
		{"port", "80"}, {"protocol", "\"tcp\""}, {"protocol", "\"\""},
	};
	struct spaced_cap c = control_cap();
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		json_t *o = claims_obj(&c);
		json_error_t e;
		json_t *v = json_loads(bad[i].json, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
		cr_assert_not_null(v, "%s", bad[i].json);
		json_object_set_new(o, bad[i].key, v);
		char *j = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
		char *t = sign_claims(j, SPACED_CLASS_CONTROL);
		int r = verify_at(t, SPACED_CLASS_CONTROL, NOW, NULL);
		cr_assert(r == SPACED_ECLAIM || r == SPACED_EJSON || r == SPACED_EPURPOSE,
		          "%s=%s: got %s", bad[i].key, bad[i].json, spaced_errname(r));
		struct spaced_decision d = spaced_decision_from_error(r);
		cr_assert_eq(d.verdict, SPACED_DENY, "%s=%s", bad[i].key, bad[i].json);
		free(t);
		free(j);
		json_decref(o);
	}
	/* serviceport port out of range or of the wrong type */
	static const char *const ports[] = {"0", "65536", "-80", "\"8080\"", "8080.0", "null"};
	struct spaced_cap s = serviceport_cap();
	for (size_t i = 0; i < sizeof ports / sizeof ports[0]; i++) {
		json_t *o = claims_obj(&s);
		json_error_t e;
		json_object_set_new(o, "port", json_loads(ports[i], JSON_DECODE_ANY, &e));
		expect_claims_refused(o, SPACED_CLASS_SERVICEPORT, SPACED_ECLAIM, ports[i]);
		json_decref(o);
	}
}

Test(cap, unknown_claim)
{
	struct spaced_cap c = control_cap();
	const char *const extra[] = {"admin", "aud", "iss", "Sub", "", "kid"};
	for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
		json_t *o = claims_obj(&c);
		json_object_set_new(o, extra[i], json_true());
		expect_claims_refused(o, SPACED_CLASS_CONTROL, SPACED_ECLAIM, extra[i]);
		json_decref(o);
	}
}

/* A repeated claim could be read two ways; claims with a duplicate key are refused. */
Test(cap, duplicate_keys_in_claims)
{
	struct spaced_cap c = control_cap();
	char *j = claims_of(&c);
	/* "sub":"sbx-1",... -> "sub":"sbx-2","sub":"sbx-1",... */
	size_t dsz = strlen(j) + 32;
	char *dup = malloc(dsz);
	cr_assert_eq(strncmp(j, "{\"sub\":", 7), 0);
	snprintf(dup, dsz, "{\"sub\":\"sbx-2\",%s", j + 1);
	char *t = sign_claims(dup, SPACED_CLASS_CONTROL);
	cr_assert_eq(verify_at(t, SPACED_CLASS_CONTROL, NOW, NULL), SPACED_EJSON);
	struct spaced_record rec = record_of(&c);
	expect_decision(decide(t, SPACED_CLASS_CONTROL, NOW, &REQ_EXEC, &rec), SPACED_DENY, SPACED_REASON_MALFORMED);
	free(t);
	/* a duplicate generation at the end */
	snprintf(dup, dsz, "%.*s,\"generation\":8}", (int)strlen(j) - 1, j);
	t = sign_claims(dup, SPACED_CLASS_CONTROL);
	cr_assert_eq(verify_at(t, SPACED_CLASS_CONTROL, NOW, NULL), SPACED_EJSON);
	free(t);
	free(dup);
	free(j);
}

Test(cap, claims_not_an_object)
{
	const char *const bad[] = {"[]", "\"x\"", "1", "null", "", "{", "{}", "{} {}", "{\"sub\":\"a\"} x"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char *t = sign_claims(bad[i], SPACED_CLASS_CONTROL);
		int r = verify_at(t, SPACED_CLASS_CONTROL, NOW, NULL);
		cr_assert(r == SPACED_EJSON || r == SPACED_ECLAIM, "'%s': %s", bad[i], spaced_errname(r));
		expect_decision(spaced_decision_from_error(r), SPACED_DENY, SPACED_REASON_MALFORMED);
		free(t);
	}
	/* claims past their size limit */
	char *big = malloc(SPACED_CAP_CLAIMS_MAX + 64);
	memset(big, ' ', SPACED_CAP_CLAIMS_MAX + 63);
	big[0] = '{';
	big[SPACED_CAP_CLAIMS_MAX + 62] = '}';
	big[SPACED_CAP_CLAIMS_MAX + 63] = 0;
	char *t = sign_claims(big, SPACED_CLASS_CONTROL);
	cr_assert_eq(verify_at(t, SPACED_CLASS_CONTROL, NOW, NULL), SPACED_ETOOBIG);
	free(t);
	free(big);
}

/* ---- footer ---- */

static void expect_footer_refused(const char *footer, const char *what)
{
	struct spaced_cap c = control_cap();
	char *j = claims_of(&c);
	char *t = sign_raw(fx.sk, j, footer, spaced_cap_implicit(SPACED_CLASS_CONTROL));
	int r = verify_at(t, SPACED_CLASS_CONTROL, NOW, NULL);
	cr_assert(r < 0, "%s accepted", what);
	cr_assert(r != SPACED_ESIG, "%s: refused only by the signature (%s)", what, spaced_errname(r));
	expect_decision(spaced_decision_from_error(r), SPACED_DENY,
	                r == SPACED_EUNKNOWNKEY ? SPACED_REASON_UNKNOWN_KEY : SPACED_REASON_MALFORMED);
	char kid[SPACED_PASERK_PID_LEN + 1];
	cr_assert_neq(spaced_cap_footer_kid((const uint8_t *)footer, footer ? strlen(footer) : 0, kid), 0, "%s", what);
	free(t);
	free(j);
}

Test(cap, footer_refusals)
{
	char pid[SPACED_PASERK_PID_LEN + 1], f[512];
	spaced_paserk_pid(&fx.pk, pid);

	expect_footer_refused(NULL, "no footer");
	snprintf(f, sizeof f, "{\"kid\":\"%s\",\"kid\":\"%s\"}", pid, pid);
	expect_footer_refused(f, "duplicate kid");
	snprintf(f, sizeof f, "{\"kid\":\"%s\",\"x\":1}", pid);
	expect_footer_refused(f, "extra member");
	snprintf(f, sizeof f, "{\"x\":1,\"kid\":\"%s\"}", pid);
	expect_footer_refused(f, "extra member first");
	snprintf(f, sizeof f, "{\"kid\":\"%s\",\"pad\":\"%0100d\"}", pid, 0);
	cr_assert_gt(strlen(f), SPACED_CAP_FOOTER_MAX);
	expect_footer_refused(f, "too long");
	snprintf(f, sizeof f, "{\"kid\":{\"k\":\"%s\"}}", pid);
	expect_footer_refused(f, "too deep");
	snprintf(f, sizeof f, "{\"kid\":[\"%s\"]}", pid);
	expect_footer_refused(f, "kid in an array");
	expect_footer_refused("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]", "deep arrays");
	expect_footer_refused("hello", "not JSON");
	expect_footer_refused(pid, "bare kid");
	expect_footer_refused("{}", "empty object");
	expect_footer_refused("{\"kid\":5}", "kid not a string");
	expect_footer_refused("{\"kid\":\"k4.pid.short\"}", "kid malformed");
	snprintf(f, sizeof f, "{\"kid\":\"k3.pid.%s\"}", pid + 7);
	expect_footer_refused(f, "kid of another version");
	snprintf(f, sizeof f, "{\"kid\":\"%s\"}", pid);
	f[20] = '+';
	expect_footer_refused(f, "kid with a non-base64url character");
	snprintf(f, sizeof f, "{\"kid\":\"%sA\"}", pid);
	expect_footer_refused(f, "kid one character long");
	expect_footer_refused("{\"kid\":\"x\"", "unterminated string");
	snprintf(f, sizeof f, "{\"kid\":\"%s\"}x", pid);
	expect_footer_refused(f, "trailing garbage");
	snprintf(f, sizeof f, "{\"kid\":\"%s\"", pid);
	expect_footer_refused(f, "unterminated object");
}

/* Footers spaced would accept: the canonical form and equivalent JSON. */
Test(cap, footer_accepted_forms)
{
	char pid[SPACED_PASERK_PID_LEN + 1], f[256], kid[SPACED_PASERK_PID_LEN + 1];
	spaced_paserk_pid(&fx.pk, pid);
	snprintf(f, sizeof f, "{\"kid\":\"%s\"}", pid);
	cr_assert_eq(spaced_cap_footer_kid((const uint8_t *)f, strlen(f), kid), 0);
	cr_assert_str_eq(kid, pid);
	cr_assert_str_eq(f, footer_for(&fx.pk), "footer_encode is the canonical form");
	snprintf(f, sizeof f, "{ \"kid\" : \"%s\" }", pid);
	memset(kid, 0, sizeof kid);
	cr_assert_eq(spaced_cap_footer_kid((const uint8_t *)f, strlen(f), kid), 0);
	cr_assert_str_eq(kid, pid);
	/* and a token with that footer verifies (the footer is signed as is) */
	struct spaced_cap c = control_cap();
	char *j = claims_of(&c);
	char *t = sign_raw(fx.sk, j, f, spaced_cap_implicit(SPACED_CLASS_CONTROL));
	cr_assert_eq(verify_at(t, SPACED_CLASS_CONTROL, NOW, NULL), 0);
	free(t);
	free(j);
	/* footer_encode refuses a buffer too small */
	cr_assert_eq(spaced_cap_footer_encode(&fx.pk, f, 20), SPACED_ETOOBIG);
}

Test(cap, malformed_tokens)
{
	const char *const bad[] = {"", "v4.public.", "garbage", "v4.local.AAAA", "v4.public.AAAA.AAAA"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct spaced_cap out;
		int r = spaced_cap_verify(fx.kr, NULL, bad[i], strlen(bad[i]), SPACED_CLASS_CONTROL, NOW, &out);
		cr_assert_lt(r, 0, "'%s'", bad[i]);
		expect_decision(spaced_decision_from_error(r), SPACED_DENY, SPACED_REASON_MALFORMED);
	}
	struct spaced_cap out;
	cr_assert_eq(spaced_cap_verify(fx.kr, NULL, NULL, 0, SPACED_CLASS_CONTROL, NOW, &out), SPACED_EINVAL);
	char *big = malloc(SPACED_PASETO_TOKEN_MAX + 2);
	memset(big, 'A', SPACED_PASETO_TOKEN_MAX + 1);
	memcpy(big, "v4.public.", 10);
	cr_assert_eq(spaced_cap_verify(fx.kr, NULL, big, SPACED_PASETO_TOKEN_MAX + 1, SPACED_CLASS_CONTROL, NOW, &out),
	             SPACED_ETOOBIG);
	free(big);
}

/* Output parameters are written only on success. */
Test(cap, output_untouched_on_refusal)
{
	struct spaced_cap c = control_cap(), out, before;
	memset(&out, 0xa5, sizeof out);
	before = out;
	char *t = issue(&c);
	cr_assert_eq(verify_at(t, SPACED_CLASS_CONTROL, c.exp + 16, &out), SPACED_EEXPIRED);
	cr_assert_eq(memcmp(&out, &before, sizeof out), 0);
	cr_assert_eq(verify_at(t, SPACED_CLASS_SERVICEPORT, NOW, &out), SPACED_EPURPOSE);
	cr_assert_eq(memcmp(&out, &before, sizeof out), 0);
	free(t);
}

Test(cap, purpose_and_class_names)
{
	const char *const names[] = {"fs.read", "fs.write", "exec", "term", "watch", "serviceport", "lifecycle"};
	for (unsigned i = 0; i < 7; i++) {
		cr_assert_str_eq(spaced_purpose_name(1u << i), names[i]);
		cr_assert_eq(spaced_purpose_parse(names[i]), 1u << i);
	}
	cr_assert_null(spaced_purpose_name(0));
	cr_assert_null(spaced_purpose_name(3));
	cr_assert_null(spaced_purpose_name(1u << 7));
	cr_assert_eq(spaced_purpose_parse("Exec"), 0);
	cr_assert_eq(spaced_purpose_parse(NULL), 0);
	cr_assert_str_eq(spaced_cap_class_name(SPACED_CLASS_CONTROL), "control");
	cr_assert_str_eq(spaced_cap_class_name(SPACED_CLASS_SERVICEPORT), "serviceport");
}

/* ---- RFC 3339 times, as the exp / iat / nbf claims carry them ---- */

Test(cap_time, format_parse_round_trip)
{
	static const struct {
		const char *text, *canonical;
	} ok[] = {
		{"2026-11-30T14:00:00Z", "2026-11-30T14:00:00Z"},
		{"2026-11-30t14:00:00z", "2026-11-30T14:00:00Z"},
		{"2026-11-30T15:00:00+01:00", "2026-11-30T14:00:00Z"},
		{"2026-11-30T04:30:00-09:30", "2026-11-30T14:00:00Z"},
		{"2026-11-30T14:00:00.999999999Z", "2026-11-30T14:00:00Z"},
		{"2028-02-29T00:00:00Z", "2028-02-29T00:00:00Z"},
		{"2026-06-30T23:59:60Z", "2026-06-30T23:59:59Z"},
		{"1970-01-01T00:00:00Z", "1970-01-01T00:00:00Z"},
		/* years below 1000 keep four digits (strftime's %Y would print "226") */
		{"0226-02-28T23:59:60.5-09:30", "0226-03-01T09:29:59Z"},
		{"0001-01-01T00:00:00Z", "0001-01-01T00:00:00Z"},
		{"9999-12-31T23:59:59Z", "9999-12-31T23:59:59Z"},
	};
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		int64_t t, back;
		char out[21];
		cr_assert_eq(spaced_time_parse(ok[i].text, strlen(ok[i].text), &t), 0, "%s", ok[i].text);
		cr_assert_eq(spaced_time_format(t, out), 0);
		cr_assert_str_eq(out, ok[i].canonical, "%s", ok[i].text);
		cr_assert_eq(spaced_time_parse(out, strlen(out), &back), 0, "%s", out);
		cr_assert_eq(back, t);
	}
	char out[21];
	cr_assert_eq(spaced_time_format(INT64_C(253402300800), out), SPACED_EINVAL, "year 10000");
	int64_t t;
	static const char *const bad[] = {
		"2026-11-30T14:00:00", "2026-11-30 14:00:00Z", "2026-11-30T24:00:00Z", "2026-11-31T00:00:00Z",
		"2027-02-29T00:00:00Z", "2026-00-10T00:00:00Z", "2026-11-30T14:60:00Z", "2026-11-30T14:00:61Z",
		"2026-11-30T14:00:00.Z", "2026-11-30T14:00:00.1234567890Z", "2026-11-30T14:00:00+1:00",
		"2026-11-30T14:00:00+01:60", "2026-11-30T14:00:00+0100", "2026-11-30T14:00:00ZZ", "+2026-11-30T14:00:00Z",
		"26-11-30T14:00:00Z", "2026-11-30T14:00:00Z ", "", "2026-11-30T14:00:00+01:00:00",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		cr_assert_eq(spaced_time_parse(bad[i], strlen(bad[i]), &t), SPACED_EFORMAT, "accepted: '%s'", bad[i]);
}

/* Times at the ends of the int64 range: the lifetime and skew arithmetic must
 * not overflow (a wrapped difference would accept an unbounded lifetime, C3). */
Test(cap_time, extreme_times)
{
	struct spaced_cap c = control_cap();
	c.iat = c.nbf = INT64_MIN;
	c.exp = INT64_MAX;
	cr_assert_eq(spaced_cap_validate(&c), SPACED_ECLAIM, "unbounded lifetime accepted");
	c.iat = c.nbf = INT64_MIN;
	c.exp = INT64_MIN + SPACED_CAP_LIFETIME;
	cr_assert_eq(spaced_cap_validate(&c), 0);
	c.exp = INT64_MIN + SPACED_CAP_LIFETIME + 1;
	cr_assert_eq(spaced_cap_validate(&c), SPACED_ECLAIM);

	c.iat = c.nbf = INT64_MAX - SPACED_CAP_LIFETIME;
	c.exp = INT64_MAX;
	cr_assert_eq(spaced_cap_validate(&c), 0);
	cr_assert_eq(spaced_cap_check_time(&c, INT64_MAX), 0, "not expired at exp");
	cr_assert_eq(spaced_cap_check_time(&c, INT64_MAX - SPACED_CAP_LIFETIME - SPACED_CAP_SKEW), 0);
	cr_assert_eq(spaced_cap_check_time(&c, INT64_MAX - SPACED_CAP_LIFETIME - SPACED_CAP_SKEW - 1), SPACED_ENOTYET);
	cr_assert_eq(spaced_cap_check_time(&c, INT64_MIN), SPACED_ENOTYET);

	c.iat = c.nbf = INT64_MIN;
	c.exp = INT64_MIN + 1;
	cr_assert_eq(spaced_cap_check_time(&c, INT64_MAX), SPACED_EEXPIRED);
	cr_assert_eq(spaced_cap_check_time(&c, INT64_MIN + 1 + SPACED_CAP_SKEW), 0);
	cr_assert_eq(spaced_cap_check_time(&c, INT64_MIN + 2 + SPACED_CAP_SKEW), SPACED_EEXPIRED);
	cr_assert_eq(spaced_cap_check_time(&c, INT64_MIN), 0);
}
