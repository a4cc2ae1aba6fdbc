/*
 * test_paseto.c — PASETO v4.public and PASERK k4 against the official vectors,
 * and the strict parsing every verifier relies on (C1, C2, C5).
 *
 * The vectors are transcribed from the PASETO / PASERK test-vector files
 * (v4.json: 4-S-1..3, 4-F-1..5; k4.public.json; k4.pid.json) so that this suite
 * stands alone.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "spaced_error.h"
#include "paserk.h"
#include "paseto.h"
#include "signer.h"
#include "util.h"

/* ---- vectors (v4.public) ---- */

static const char V_SECRET_HEX[] =
	"b4cbfb43df4ce210727d953e4a713307fa19bb7d9f85041438d9e11b942a3774"
	"1eb9dbbbbc047c03fd70604e0071f0987e16b28b757225c11f00415d0e20b1a2";
static const char V_SEED_HEX[] = "b4cbfb43df4ce210727d953e4a713307fa19bb7d9f85041438d9e11b942a3774";
static const char V_PUBLIC_HEX[] = "1eb9dbbbbc047c03fd70604e0071f0987e16b28b757225c11f00415d0e20b1a2";

static const char V_PAYLOAD[] = "{\"data\":\"this is a signed message\",\"exp\":\"2022-01-01T00:00:00+00:00\"}";
static const char V_FOOTER[] = "{\"kid\":\"zVhMiPBP9fRf2snEcT7gFTioeA9COcNy9DfgL1W60haN\"}";

struct vector {
	const char *name, *token, *footer, *implicit;
};

static const struct vector S_VECTORS[] = {
	{"4-S-1",
	 "v4.public.eyJkYXRhIjoidGhpcyBpcyBhIHNpZ25lZCBtZXNzYWdlIiwiZXhwIjoiMjAyMi0wMS0wMVQwMDowMDowMCswMDowMCJ9"
	 "bg_XBBzds8lTZShVlwwKSgeKpLT3yukTw6JUz3W4h_ExsQV-P0V54zemZDcAxFaSeef1QlXEFtkqxT1ciiQEDA",
	 "", ""},
	{"4-S-2",
	 "v4.public.eyJkYXRhIjoidGhpcyBpcyBhIHNpZ25lZCBtZXNzYWdlIiwiZXhwIjoiMjAyMi0wMS0wMVQwMDowMDowMCswMDowMCJ9"
	 "v3Jt8mx_TdM2ceTGoqwrh4yDFn0XsHvvV_D0DtwQxVrJEBMl0F2caAdgnpKlt4p7xBnx1HcO-SPo8FPp214HDw"
	 ".eyJraWQiOiJ6VmhNaVBCUDlmUmYyc25FY1Q3Z0ZUaW9lQTlDT2NOeTlEZmdMMVc2MGhhTiJ9",
	 V_FOOTER, ""},
	{"4-S-3",
	 "v4.public.eyJkYXRhIjoidGhpcyBpcyBhIHNpZ25lZCBtZXNzYWdlIiwiZXhwIjoiMjAyMi0wMS0wMVQwMDowMDowMCswMDowMCJ9"
	 "NPWciuD3d0o5eXJXG5pJy-DiVEoyPYWs1YSTwWHNJq6DZD3je5gf-0M4JR9ipdUSJbIovzmBECeaWmaqcaP0DQ"
	 ".eyJraWQiOiJ6VmhNaVBCUDlmUmYyc25FY1Q3Z0ZUaW9lQTlDT2NOeTlEZmdMMVc2MGhhTiJ9",
	 V_FOOTER, "{\"test-vector\":\"4-S-3\"}"},
};

static const char F1_TOKEN[] =
	"v4.local.vngXfCISbnKgiP6VWGuOSlYrFYU300fy9ijW33rznDYgxHNPwWluAY2Bgb0z54CUs6aYYkIJ-bOOOmJHPuX_34Agt_IPl"
	"NdGDpRdGNnBz2MpWJvB3cttheEc1uyCEYltj7wBQQYX.YXJiaXRyYXJ5LXN0cmluZy10aGF0LWlzbid0LWpzb24";
static const char F2_TOKEN[] =
	"v4.public.eyJpbnZhbGlkIjoidGhpcyBzaG91bGQgbmV2ZXIgZGVjb2RlIn22Sp4gjCaUw0c7EH84ZSm_jN_Qr41MrgLNu5LIBCz"
	"Ur1pn3Z-Wukg9h3ceplWigpoHaTLcwxj0NsI1vjTh67YB.eyJraWQiOiJ6VmhNaVBCUDlmUmYyc25FY1Q3Z0ZUaW9lQTlDT2NOeT"
	"lEZmdMMVc2MGhhTiJ9";
static const char F3_TOKEN[] =
	"v3.local.23e_2PiqpQBPvRFKzB0zHhjmxK3sKo2grFZRRLM-U7L0a8uHxuF9RlVz3Ic6WmdUUWTxCaYycwWV1yM8gKbZB2JhygD"
	"MKvHQ7eBf8GtF0r3K0Q_gF1PXOxcOgztak1eD1dPe9rLVMSgR0nHJXeIGYVuVrVoLWQ.YXJiaXRyYXJ5LXN0cmluZy10aGF0LWlz"
	"bid0LWpzb24";
static const char F4_TOKEN[] =
	"v4.local.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAQAr68PS4AXe7If_ZgesdkUMvSwscFlAl1pk5HC0e8kApeaqMf"
	"Go_7OpBnwJOAbY9V7WU6abu74MmcUE8YWAiaArVI8XJ5hOb_4v9RmDkneN0S92dx0OW4pgy7omxgf3S8c3LlQh";
static const char F5_TOKEN[] =
	"v4.local.32VIErrEkmY4JVILovbmfPXKW9wT1OdQepjMTC_MOtjA4kiqw7_tcaOM5GNEcnTxl60WkwMsYXw6FSNb_UdJPXjpzm0K"
	"W9ojM5f4O2mRvE2IcweP-PRdoHjd5-RHCiExR1IK6t4x-RMNXtQNbz7FvFZ_G-lFpk5RG3EOrwDL6CgDqcerSQ==.eyJraWQiOiJ"
	"6VmhNaVBCUDlmUmYyc25FY1Q3Z0ZUaW9lQTlDT2NOeTlEZmdMMVc2MGhhTiJ9";

/* ---- vectors (PASERK) ---- */

struct paserk_vector {
	const char *name, *key_hex, *paserk;
};

static const struct paserk_vector PUBLIC_VECTORS[] = {
	{"k4.public-1", "0000000000000000000000000000000000000000000000000000000000000000",
	 "k4.public.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},
	{"k4.public-2", "707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f",
	 "k4.public.cHFyc3R1dnd4eXp7fH1-f4CBgoOEhYaHiImKi4yNjo8"},
	{"k4.public-3", "707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e90",
	 "k4.public.cHFyc3R1dnd4eXp7fH1-f4CBgoOEhYaHiImKi4yNjpA"},
};
static const struct paserk_vector PID_VECTORS[] = {
	{"k4.pid-1", "0000000000000000000000000000000000000000000000000000000000000000",
	 "k4.pid.S_XQmeEwHbbvRmiyfXfHYpLGjXGzjTRSDoT1YtTakWFE"},
	{"k4.pid-2", "707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f",
	 "k4.pid.9ShR3xc8-qVJ_di0tc9nx0IDIqbatdeM2mqLFBJsKRHs"},
	{"k4.pid-3", "707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e90",
	 "k4.pid.-nyvbaTz8U6TQz7OZWW-iB3va31iAxIpUgzUcVQVmW9A"},
};
/* k4.public-fail-1 and k4.pid-fail-2: a 49-byte (version 3) public key. */
static const char FAIL_K3_KEY_HEX[] =
	"02707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f";
/* k4.pid-fail-1: a 31-byte key. */
static const char FAIL_SHORT_KEY_HEX[] = "707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e";

/* ---- helpers ---- */

static size_t unhex(uint8_t *out, size_t outsz, const char *hex)
{
	size_t n = strlen(hex) / 2;
	cr_assert(n <= outsz, "hex constant too long");
	for (size_t i = 0; i < n; i++) {
		unsigned v;
		cr_assert_eq(sscanf(hex + 2 * i, "%2x", &v), 1);
		out[i] = (uint8_t)v;
	}
	return n;
}

static struct spaced_secret_key *vector_secret_key(void)
{
	uint8_t raw[64];
	struct spaced_secret_key *sk = NULL;
	size_t n = unhex(raw, sizeof raw, V_SECRET_HEX);
	cr_assert_eq(spaced_secret_key_from_bytes(&sk, raw, n), 0);
	return sk;
}

static void vector_public_key(uint8_t pk[32])
{
	cr_assert_eq(unhex(pk, 32, V_PUBLIC_HEX), 32);
}

static int verify_str(const char *token, size_t len, const char *footer, const char *implicit)
{
	uint8_t pk[32];
	uint8_t *msg = NULL;
	size_t mlen = 0;
	vector_public_key(pk);
	int r = spaced_paseto_verify(token, len, pk, (const uint8_t *)footer, footer ? strlen(footer) : 0,
	                             (const uint8_t *)implicit, implicit ? strlen(implicit) : 0, &msg, &mlen);
	if (r == 0) {
		cr_assert_not_null(msg);
		free(msg);
	}
	return r;
}

/* Signs V_PAYLOAD (or msg) with the vector key. */
static char *sign_with(const uint8_t *msg, size_t mlen, const char *footer, const char *implicit)
{
	struct spaced_secret_key *sk = vector_secret_key();
	char *token = NULL;
	cr_assert_eq(spaced_paseto_sign(sk, msg, mlen, (const uint8_t *)footer, footer ? strlen(footer) : 0,
	                                (const uint8_t *)implicit, implicit ? strlen(implicit) : 0, &token),
	             0);
	spaced_secret_key_free(sk);
	return token;
}

static const char ALPHABET[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* Replaces the last character of a base64url string whose length is 2 or 3 mod
 * 4 so that only the unused low bits change. */
static void set_unused_bits(char *s, size_t len)
{
	cr_assert(len % 4 == 2 || len % 4 == 3, "no unused bits in a length %zu encoding", len);
	const char *p = strchr(ALPHABET, s[len - 1]);
	cr_assert_not_null(p);
	unsigned v = (unsigned)(p - ALPHABET);
	v |= 1; /* the lowest bit is unused in both cases */
	s[len - 1] = ALPHABET[v];
}

/* ---- official vectors ---- */

Test(paseto_vectors, sign_reproduces_4S_byte_for_byte)
{
	for (size_t i = 0; i < sizeof S_VECTORS / sizeof S_VECTORS[0]; i++) {
		const struct vector *v = &S_VECTORS[i];
		char *t = sign_with((const uint8_t *)V_PAYLOAD, strlen(V_PAYLOAD), v->footer, v->implicit);
		cr_assert_str_eq(t, v->token, "%s: signing does not reproduce the vector", v->name);
		free(t);
	}
}

Test(paseto_vectors, sign_from_seed_equals_sign_from_secret)
{
	uint8_t seed[32];
	struct spaced_secret_key *sk = NULL;
	char *t = NULL;
	cr_assert_eq(unhex(seed, sizeof seed, V_SEED_HEX), 32);
	cr_assert_eq(spaced_secret_key_from_bytes(&sk, seed, sizeof seed), 0);
	cr_assert_eq(spaced_paseto_sign(sk, (const uint8_t *)V_PAYLOAD, strlen(V_PAYLOAD), NULL, 0, NULL, 0, &t), 0);
	cr_assert_str_eq(t, S_VECTORS[0].token);
	struct spaced_public_key pk;
	uint8_t want[32];
	vector_public_key(want);
	spaced_secret_key_public(sk, &pk);
	cr_assert_arr_eq(pk.pk, want, 32);
	free(t);
	spaced_secret_key_free(sk);
}

Test(paseto_vectors, verify_4S_prints_payload)
{
	uint8_t pk[32];
	vector_public_key(pk);
	for (size_t i = 0; i < sizeof S_VECTORS / sizeof S_VECTORS[0]; i++) {
		const struct vector *v = &S_VECTORS[i];
		uint8_t *msg = NULL;
		size_t mlen = 0;
		int r = spaced_paseto_verify(v->token, strlen(v->token), pk, (const uint8_t *)v->footer,
		                             strlen(v->footer), (const uint8_t *)v->implicit, strlen(v->implicit),
		                             &msg, &mlen);
		cr_assert_eq(r, 0, "%s: %s", v->name, spaced_strerror(r));
		cr_assert_eq(mlen, strlen(V_PAYLOAD));
		cr_assert_arr_eq(msg, V_PAYLOAD, mlen);
		cr_assert_eq(msg[mlen], 0, "payload copy is NUL-terminated");
		free(msg);
		/* Without an expected footer the footer is not compared, but it is signed. */
		cr_assert_eq(verify_str(v->token, strlen(v->token), NULL, v->implicit), 0, "%s", v->name);
	}
}

Test(paseto_vectors, parse_4S_2_splits_message_signature_footer)
{
	struct spaced_paseto t = {0};
	const char *tok = S_VECTORS[1].token;
	cr_assert_eq(spaced_paseto_parse(&t, tok, strlen(tok)), 0);
	cr_assert_eq(t.msg_len, strlen(V_PAYLOAD));
	cr_assert_arr_eq(t.msg, V_PAYLOAD, t.msg_len);
	cr_assert_eq(t.footer_len, strlen(V_FOOTER));
	cr_assert_arr_eq(t.footer, V_FOOTER, t.footer_len);
	cr_assert_eq(t.sig, t.msg + t.msg_len);
	spaced_paseto_clear(&t);
	spaced_paseto_clear(&t); /* clearing twice is harmless */
	spaced_paseto_clear(NULL);
}

/* 4-F-1, 4-F-3, 4-F-4, 4-F-5 are not v4.public tokens at all: refused on the header. */
Test(paseto_vectors, fail_vectors_wrong_header)
{
	const char *const toks[] = {F1_TOKEN, F3_TOKEN, F4_TOKEN, F5_TOKEN};
	const char *const implicits[] = {"{\"test-vector\":\"4-F-1\"}", "{\"test-vector\":\"4-F-3\"}", "", ""};
	for (size_t i = 0; i < 4; i++) {
		struct spaced_paseto t = {0};
		cr_assert_eq(spaced_paseto_parse(&t, toks[i], strlen(toks[i])), SPACED_EHEADER, "vector %zu", i);
		cr_assert_eq(verify_str(toks[i], strlen(toks[i]), NULL, implicits[i]), SPACED_EHEADER);
	}
}

/* 4-F-2: a v4.public token made for a symmetric key: it parses, but it does
 * not carry a valid signature under the 4-S public key. */
Test(paseto_vectors, fail_vector_4F2_bad_signature)
{
	struct spaced_paseto t = {0};
	cr_assert_eq(spaced_paseto_parse(&t, F2_TOKEN, strlen(F2_TOKEN)), 0);
	spaced_paseto_clear(&t);
	cr_assert_eq(verify_str(F2_TOKEN, strlen(F2_TOKEN), V_FOOTER, "{\"test-vector\":\"4-F-2\"}"), SPACED_ESIG);
	cr_assert_eq(verify_str(F2_TOKEN, strlen(F2_TOKEN), NULL, NULL), SPACED_ESIG);
}

/* 4-F-5's body carries '=' padding: even under a v4.public header it is refused. */
Test(paseto_vectors, fail_vector_4F5_padding_refused_under_public_header)
{
	const char *body = strchr(F5_TOKEN + 3, '.') + 1;
	char tok[512];
	snprintf(tok, sizeof tok, "v4.public.%s", body);
	struct spaced_paseto t = {0};
	cr_assert_eq(spaced_paseto_parse(&t, tok, strlen(tok)), SPACED_EBASE64);
}

/* ---- PASERK ---- */

Test(paserk, k4_public_vectors)
{
	for (size_t i = 0; i < sizeof PUBLIC_VECTORS / sizeof PUBLIC_VECTORS[0]; i++) {
		const struct paserk_vector *v = &PUBLIC_VECTORS[i];
		uint8_t raw[32];
		struct spaced_public_key pk, back;
		char out[SPACED_PASERK_PUBLIC_LEN + 1];
		cr_assert_eq(spaced_public_key_from_bytes(&pk, raw, unhex(raw, sizeof raw, v->key_hex)), 0);
		spaced_paserk_public_encode(&pk, out);
		cr_assert_str_eq(out, v->paserk, "%s", v->name);
		cr_assert_eq(strlen(out), SPACED_PASERK_PUBLIC_LEN);
		cr_assert_eq(spaced_paserk_public_decode(&back, v->paserk, strlen(v->paserk)), 0);
		cr_assert_arr_eq(back.pk, raw, 32, "%s", v->name);
	}
}

Test(paserk, k4_public_fail_wrong_version_key)
{
	uint8_t raw[64];
	struct spaced_public_key pk;
	size_t n = unhex(raw, sizeof raw, FAIL_K3_KEY_HEX);
	cr_assert_eq(n, 49);
	cr_assert_eq(spaced_public_key_from_bytes(&pk, raw, n), SPACED_EKEY);
	/* The same key in a version-3 PASERK is a type error. */
	char k3[128] = "k3.public.";
	spaced_b64url_encode(k3 + 10, raw, n);
	cr_assert_eq(spaced_paserk_public_decode(&pk, k3, strlen(k3)), SPACED_EKEYTYPE);
	/* And the 49 bytes under a k4.public prefix have the wrong length. */
	char k4[128] = "k4.public.";
	spaced_b64url_encode(k4 + 10, raw, n);
	cr_assert_eq(spaced_paserk_public_decode(&pk, k4, strlen(k4)), SPACED_EKEY);
}

Test(paserk, k4_pid_vectors)
{
	for (size_t i = 0; i < sizeof PID_VECTORS / sizeof PID_VECTORS[0]; i++) {
		const struct paserk_vector *v = &PID_VECTORS[i];
		uint8_t raw[32];
		struct spaced_public_key pk;
		char pid[SPACED_PASERK_PID_LEN + 1];
		cr_assert_eq(spaced_public_key_from_bytes(&pk, raw, unhex(raw, sizeof raw, v->key_hex)), 0);
		spaced_paserk_pid(&pk, pid);
		cr_assert_str_eq(pid, v->paserk, "%s", v->name);
		cr_assert(spaced_paserk_pid_valid(v->paserk, strlen(v->paserk)));
	}
}

Test(paserk, k4_pid_fail_vectors)
{
	uint8_t raw[64];
	struct spaced_public_key pk;
	size_t n = unhex(raw, sizeof raw, FAIL_SHORT_KEY_HEX);
	cr_assert_eq(n, 31);
	cr_assert_eq(spaced_public_key_from_bytes(&pk, raw, n), SPACED_EKEY, "small public keys must fail");
	n = unhex(raw, sizeof raw, FAIL_K3_KEY_HEX);
	cr_assert_eq(spaced_public_key_from_bytes(&pk, raw, n), SPACED_EKEY, "wrong-version key must fail");
	cr_assert_eq(spaced_public_key_from_bytes(&pk, NULL, 32), SPACED_EKEY);
}

Test(paserk, k4_pid_shape)
{
	const char *ok = PID_VECTORS[0].paserk;
	char buf[64];
	cr_assert(!spaced_paserk_pid_valid(ok, strlen(ok) - 1));
	snprintf(buf, sizeof buf, "k3.pid.%s", ok + 7);
	cr_assert(!spaced_paserk_pid_valid(buf, strlen(buf)));
	snprintf(buf, sizeof buf, "%s", ok);
	buf[10] = '+';
	cr_assert(!spaced_paserk_pid_valid(buf, strlen(buf)));
	snprintf(buf, sizeof buf, "%sA", ok);
	cr_assert(!spaced_paserk_pid_valid(buf, strlen(buf)));
}

Test(paserk, k4_secret_round_trip)
{
	struct spaced_secret_key *sk = vector_secret_key(), *back = NULL;
	char s1[SPACED_PASERK_SECRET_LEN + 1], s2[SPACED_PASERK_SECRET_LEN + 1];
	spaced_secret_key_to_paserk(sk, s1);
	cr_assert_eq(strlen(s1), SPACED_PASERK_SECRET_LEN);
	cr_assert_eq(strncmp(s1, "k4.secret.", 10), 0);
	cr_assert_eq(spaced_secret_key_from_paserk(&back, s1, strlen(s1)), 0);
	spaced_secret_key_to_paserk(back, s2);
	cr_assert_str_eq(s1, s2);
	/* The round-tripped key still reproduces 4-S-1. */
	char *t = NULL;
	cr_assert_eq(spaced_paseto_sign(back, (const uint8_t *)V_PAYLOAD, strlen(V_PAYLOAD), NULL, 0, NULL, 0, &t), 0);
	cr_assert_str_eq(t, S_VECTORS[0].token);
	free(t);
	spaced_secret_key_free(sk);
	spaced_secret_key_free(back);
	spaced_secret_key_free(NULL);
}

Test(paserk, k4_secret_generated_round_trip)
{
	struct spaced_secret_key *sk = NULL, *back = NULL;
	struct spaced_public_key p1, p2;
	char s[SPACED_PASERK_SECRET_LEN + 1];
	cr_assert_eq(spaced_secret_key_generate(&sk), 0);
	spaced_secret_key_to_paserk(sk, s);
	cr_assert_eq(spaced_secret_key_from_paserk(&back, s, strlen(s)), 0);
	spaced_secret_key_public(sk, &p1);
	spaced_secret_key_public(back, &p2);
	cr_assert_arr_eq(p1.pk, p2.pk, 32);
	spaced_secret_key_free(sk);
	spaced_secret_key_free(back);
}

Test(paserk, k4_secret_mismatched_halves_refused)
{
	uint8_t raw[64], other[32];
	struct spaced_secret_key *sk = NULL;
	unhex(raw, sizeof raw, V_SECRET_HEX);
	unhex(other, sizeof other, PUBLIC_VECTORS[1].key_hex);
	memcpy(raw + 32, other, 32); /* seed of one key, public half of another */
	cr_assert_eq(spaced_secret_key_from_bytes(&sk, raw, 64), SPACED_EKEY);
	cr_assert_null(sk, "output untouched on error");
	char s[SPACED_PASERK_SECRET_LEN + 1] = "k4.secret.";
	spaced_b64url_encode(s + 10, raw, 64);
	cr_assert_eq(spaced_secret_key_from_paserk(&sk, s, strlen(s)), SPACED_EKEY);
	/* One flipped bit in the public half is enough. */
	unhex(raw, sizeof raw, V_SECRET_HEX);
	raw[63] ^= 1;
	cr_assert_eq(spaced_secret_key_from_bytes(&sk, raw, 64), SPACED_EKEY);
	cr_assert_null(sk);
}

Test(paserk, k4_secret_bad_forms_refused)
{
	struct spaced_secret_key *sk = NULL;
	uint8_t raw[64];
	unhex(raw, sizeof raw, V_SECRET_HEX);
	char s[160] = "k4.secret.";
	spaced_b64url_encode(s + 10, raw, 63); /* one byte short */
	cr_assert_eq(spaced_secret_key_from_paserk(&sk, s, strlen(s)), SPACED_EKEY);
	spaced_b64url_encode(s + 10, raw, 32); /* a seed is not a k4.secret */
	cr_assert_eq(spaced_secret_key_from_paserk(&sk, s, strlen(s)), SPACED_EKEY);
	memcpy(s, "k3.secret.", 10);
	spaced_b64url_encode(s + 10, raw, 64);
	cr_assert_eq(spaced_secret_key_from_paserk(&sk, s, strlen(s)), SPACED_EKEYTYPE);
	const char *pub = PUBLIC_VECTORS[1].paserk;
	cr_assert_eq(spaced_secret_key_from_paserk(&sk, pub, strlen(pub)), SPACED_EKEYTYPE);
	cr_assert_eq(spaced_secret_key_from_paserk(&sk, "secret", 6), SPACED_EKEY);
	cr_assert_eq(spaced_secret_key_from_bytes(&sk, raw, 33), SPACED_EKEY);
	cr_assert_null(sk);
}

/* A key of another type or version offered where a k4.public is expected (C2). */
Test(paserk, other_types_offered_as_public_refused)
{
	struct spaced_secret_key *sk = vector_secret_key();
	char secret[SPACED_PASERK_SECRET_LEN + 1];
	spaced_secret_key_to_paserk(sk, secret);
	spaced_secret_key_free(sk);
	const char *b43 = PUBLIC_VECTORS[1].paserk + 10;
	char local[80], k3[80], k2[80];
	snprintf(local, sizeof local, "k4.local.%s", b43);
	snprintf(k3, sizeof k3, "k3.public.%s", b43);
	snprintf(k2, sizeof k2, "k2.public.%s", b43);
	const char *const bad[] = {local, k3, k2, secret, PID_VECTORS[1].paserk};
	struct spaced_public_key pk;
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		cr_assert_eq(spaced_paserk_public_decode(&pk, bad[i], strlen(bad[i])), SPACED_EKEYTYPE, "%s", bad[i]);
	spaced_wipe(secret, sizeof secret);
	/* Not a PASERK at all, or the right type with a wrong body. */
	char s[80];
	const char *good = PUBLIC_VECTORS[1].paserk;
	cr_assert_eq(spaced_paserk_public_decode(&pk, "hello", 5), SPACED_EKEY);
	cr_assert_eq(spaced_paserk_public_decode(&pk, good, strlen(good) - 1), SPACED_EKEY);
	snprintf(s, sizeof s, "%sA", good);
	cr_assert_eq(spaced_paserk_public_decode(&pk, s, strlen(s)), SPACED_EKEY);
	snprintf(s, sizeof s, "%s", good);
	s[20] = '/';
	cr_assert_eq(spaced_paserk_public_decode(&pk, s, strlen(s)), SPACED_EKEY);
	/* Non-canonical last character of a valid k4.public (only unused bits differ). */
	snprintf(s, sizeof s, "%s", good);
	set_unused_bits(s + 10, strlen(s) - 10);
	cr_assert_neq(strcmp(s, good), 0);
	cr_assert_eq(spaced_paserk_public_decode(&pk, s, strlen(s)), SPACED_EKEY);
}

/* ---- strict base64url ---- */

static int b64(const char *s)
{
	uint8_t out[256];
	size_t n = 0;
	return spaced_b64url_decode(out, &n, s, strlen(s));
}

Test(base64url, strict_decoding)
{
	cr_assert_eq(b64(""), 0);
	cr_assert_eq(b64("AAAA"), 0);
	cr_assert_eq(b64("AA"), 0);
	cr_assert_eq(b64("AAA"), 0);
	cr_assert_eq(b64("-_-_"), 0);
	cr_assert_eq(b64("AA=="), SPACED_EBASE64, "padding");
	cr_assert_eq(b64("AAA="), SPACED_EBASE64, "padding");
	cr_assert_eq(b64("ab+c"), SPACED_EBASE64, "'+' is standard base64");
	cr_assert_eq(b64("ab/c"), SPACED_EBASE64, "'/' is standard base64");
	cr_assert_eq(b64(" AAA"), SPACED_EBASE64, "whitespace");
	cr_assert_eq(b64("AA\nAA"), SPACED_EBASE64, "newline");
	cr_assert_eq(b64("AAAA "), SPACED_EBASE64, "trailing space");
	cr_assert_eq(b64("AA\tA"), SPACED_EBASE64, "tab");
	cr_assert_eq(b64("A"), SPACED_EBASE64, "length 1 mod 4");
	cr_assert_eq(b64("AAAAA"), SPACED_EBASE64, "length 1 mod 4");
	cr_assert_eq(b64("AB"), SPACED_EBASE64, "non-zero unused bits (2 chars)");
	cr_assert_eq(b64("AAB"), SPACED_EBASE64, "non-zero unused bits (3 chars)");
	cr_assert_eq(b64("AAAAAP"), SPACED_EBASE64, "non-zero unused bits after a full group");
	cr_assert_eq(b64("AAAAAQ"), 0, "Q has zero low bits");
	cr_assert_eq(b64("A\x80""AA"), SPACED_EBASE64, "8-bit byte");
	uint8_t out[8];
	size_t n = 0;
	cr_assert_eq(spaced_b64url_decode(out, &n, "AA\0A", 4), SPACED_EBASE64, "embedded NUL");
}

Test(base64url, round_trip_every_length)
{
	uint8_t in[70], out[80];
	char enc[100];
	for (size_t i = 0; i < sizeof in; i++)
		in[i] = (uint8_t)(i * 37 + 11);
	for (size_t n = 0; n <= sizeof in; n++) {
		size_t got = 0;
		spaced_b64url_encode(enc, in, n);
		cr_assert_eq(strlen(enc), spaced_b64url_encoded_len(n));
		cr_assert(spaced_b64url_decoded_max(strlen(enc)) <= sizeof out);
		cr_assert_eq(spaced_b64url_decode(out, &got, enc, strlen(enc)), 0);
		cr_assert_eq(got, n);
		cr_assert_arr_eq(out, in, n);
	}
}

/* Every form of non-strict base64url in the body and footer of a real token. */
Test(base64url, token_bodies_strictly_decoded)
{
	const char *good = S_VECTORS[1].token; /* with footer */
	const char *dot = strchr(good + SPACED_PASETO_HEADER_LEN, '.');
	size_t body_end = (size_t)(dot - good), len = strlen(good);
	char t[600];
	struct spaced_paseto p = {0};

	/* non-canonical trailing bits in the body (133 bytes: 2 chars in the last group) */
	snprintf(t, sizeof t, "%s", good);
	set_unused_bits(t + SPACED_PASETO_HEADER_LEN, body_end - SPACED_PASETO_HEADER_LEN);
	cr_assert_neq(strcmp(t, good), 0);
	cr_assert_eq(spaced_paseto_parse(&p, t, len), SPACED_EBASE64);
	cr_assert_eq(verify_str(t, len, V_FOOTER, ""), SPACED_EBASE64);

	/* padding after the body */
	snprintf(t, sizeof t, "%.*s==%s", (int)body_end, good, dot);
	cr_assert_eq(spaced_paseto_parse(&p, t, strlen(t)), SPACED_EBASE64);
	/* padding after the footer */
	snprintf(t, sizeof t, "%s==", good);
	cr_assert_eq(spaced_paseto_parse(&p, t, strlen(t)), SPACED_EBASE64);
	/* standard alphabet: the body contains '_' and '-' */
	for (size_t i = SPACED_PASETO_HEADER_LEN; i < body_end; i++) {
		if (good[i] != '-' && good[i] != '_')
			continue;
		snprintf(t, sizeof t, "%s", good);
		t[i] = good[i] == '-' ? '+' : '/';
		cr_assert_eq(spaced_paseto_parse(&p, t, len), SPACED_EBASE64, "at %zu", i);
	}
	/* whitespace inside the body, and a trailing newline */
	snprintf(t, sizeof t, "%.*s %s", 40, good, good + 40);
	cr_assert_eq(spaced_paseto_parse(&p, t, strlen(t)), SPACED_EBASE64);
	snprintf(t, sizeof t, "%s\n", good);
	cr_assert_eq(spaced_paseto_parse(&p, t, strlen(t)), SPACED_EBASE64);
	/* body length 1 mod 4 */
	size_t blen = body_end - SPACED_PASETO_HEADER_LEN, pad = (5 - blen % 4) % 4;
	snprintf(t, sizeof t, "%.*s%.*s%s", (int)body_end, good, (int)pad, "AAAA", dot);
	cr_assert_eq((blen + pad) % 4, 1);
	cr_assert_eq(spaced_paseto_parse(&p, t, strlen(t)), SPACED_EBASE64);
}

Test(base64url, token_footer_unused_bits)
{
	/* 4-S-2's footer is 54 bytes (no unused bits); sign one of 55 bytes. */
	const char *footer = "{\"kid\":\"zVhMiPBP9fRf2snEcT7gFTioeA9COcNy9DfgL1W60haN\"} ";
	char *tok = sign_with((const uint8_t *)V_PAYLOAD, strlen(V_PAYLOAD), footer, NULL);
	size_t len = strlen(tok);
	cr_assert_eq(verify_str(tok, len, footer, NULL), 0);
	char *dot = strchr(tok + SPACED_PASETO_HEADER_LEN, '.');
	set_unused_bits(dot + 1, strlen(dot + 1));
	cr_assert_eq(verify_str(tok, len, NULL, NULL), SPACED_EBASE64);
	free(tok);
}

/* ---- tampering ---- */

Test(paseto_tamper, header_every_byte)
{
	const char *good = S_VECTORS[0].token;
	char t[400];
	for (size_t i = 0; i < SPACED_PASETO_HEADER_LEN; i++) {
		snprintf(t, sizeof t, "%s", good);
		t[i] ^= 0x20;
		cr_assert_eq(verify_str(t, strlen(t), NULL, NULL), SPACED_EHEADER, "header byte %zu", i);
	}
}

/* Every decoded byte of the body (message and signature) flipped, re-encoded
 * canonically: the signature check refuses each one. */
Test(paseto_tamper, body_every_byte)
{
	for (size_t v = 0; v < 3; v++) {
		const char *good = S_VECTORS[v].token;
		struct spaced_paseto p = {0};
		cr_assert_eq(spaced_paseto_parse(&p, good, strlen(good)), 0);
		size_t blen = p.msg_len + SPACED_PASETO_SIG_LEN;
		uint8_t *body = malloc(blen);
		memcpy(body, p.msg, blen);
		char *enc = malloc(spaced_b64url_encoded_len(blen) + 1);
		const char *dot = strchr(good + SPACED_PASETO_HEADER_LEN, '.');
		char *t = malloc(strlen(good) + 8);
		for (size_t i = 0; i < blen; i++) {
			for (unsigned bit = 0; bit < 8; bit += 7) {
				body[i] ^= (uint8_t)(1u << bit);
				spaced_b64url_encode(enc, body, blen);
				sprintf(t, "v4.public.%s%s", enc, dot ? dot : "");
				body[i] ^= (uint8_t)(1u << bit);
				int r = verify_str(t, strlen(t), S_VECTORS[v].footer[0] ? S_VECTORS[v].footer : NULL,
				                   S_VECTORS[v].implicit);
				cr_assert_eq(r, SPACED_ESIG, "%s: byte %zu bit %u: %s", S_VECTORS[v].name, i, bit,
				             spaced_errname(r));
			}
		}
		free(t);
		free(enc);
		free(body);
		spaced_paseto_clear(&p);
	}
}

/* Every character of the token text replaced: never accepted. */
Test(paseto_tamper, every_character)
{
	for (size_t v = 0; v < 3; v++) {
		const char *good = S_VECTORS[v].token;
		size_t len = strlen(good);
		char *t = malloc(len + 1);
		for (size_t i = 0; i < len; i++) {
			memcpy(t, good, len + 1);
			t[i] = t[i] == 'A' ? 'B' : 'A';
			if (t[i] == good[i])
				continue;
			int r = verify_str(t, len, NULL, S_VECTORS[v].implicit);
			cr_assert_neq(r, 0, "%s: char %zu", S_VECTORS[v].name, i);
		}
		free(t);
	}
}

Test(paseto_tamper, signature_and_footer)
{
	const struct vector *v = &S_VECTORS[2];
	struct spaced_paseto p = {0};
	cr_assert_eq(spaced_paseto_parse(&p, v->token, strlen(v->token)), 0);
	/* footer: each byte flipped, with and without an expected footer */
	uint8_t *foot = malloc(p.footer_len);
	memcpy(foot, p.footer, p.footer_len);
	char enc[128], t[600];
	const char *dot = strchr(v->token + SPACED_PASETO_HEADER_LEN, '.');
	for (size_t i = 0; i < p.footer_len; i++) {
		foot[i] ^= 1;
		spaced_b64url_encode(enc, foot, p.footer_len);
		foot[i] ^= 1;
		snprintf(t, sizeof t, "%.*s.%s", (int)(dot - v->token), v->token, enc);
		cr_assert_eq(verify_str(t, strlen(t), NULL, v->implicit), SPACED_ESIG, "footer byte %zu", i);
		cr_assert_eq(verify_str(t, strlen(t), V_FOOTER, v->implicit), SPACED_EFOOTER);
	}
	/* footer removed: the signature covered it */
	cr_assert_eq(verify_str(v->token, (size_t)(dot - v->token), NULL, v->implicit), SPACED_ESIG);
	/* all-zero signature */
	uint8_t *body = malloc(p.msg_len + 64);
	memcpy(body, p.msg, p.msg_len);
	memset(body + p.msg_len, 0, 64);
	char *benc = malloc(spaced_b64url_encoded_len(p.msg_len + 64) + 1);
	spaced_b64url_encode(benc, body, p.msg_len + 64);
	snprintf(t, sizeof t, "v4.public.%s%s", benc, dot);
	cr_assert_eq(verify_str(t, strlen(t), V_FOOTER, v->implicit), SPACED_ESIG);
	/* signature of another vector (same message and key, other implicit assertion) */
	struct spaced_paseto q = {0};
	cr_assert_eq(spaced_paseto_parse(&q, S_VECTORS[1].token, strlen(S_VECTORS[1].token)), 0);
	memcpy(body + p.msg_len, q.sig, 64);
	spaced_b64url_encode(benc, body, p.msg_len + 64);
	snprintf(t, sizeof t, "v4.public.%s%s", benc, dot);
	cr_assert_eq(verify_str(t, strlen(t), V_FOOTER, v->implicit), SPACED_ESIG);
	spaced_paseto_clear(&q);
	free(benc);
	free(body);
	free(foot);
	spaced_paseto_clear(&p);
}

Test(paseto_tamper, truncated_every_length)
{
	for (size_t v = 0; v < 3; v++) {
		const char *good = S_VECTORS[v].token;
		size_t len = strlen(good);
		for (size_t n = 0; n < len; n++) {
			/* an exact-size copy of the prefix: ASan catches any read past n */
			char *exact = malloc(n ? n : 1);
			memcpy(exact, good, n);
			int r = verify_str(exact, n, NULL, S_VECTORS[v].implicit);
			cr_assert_neq(r, 0, "%s truncated to %zu accepted", S_VECTORS[v].name, n);
			free(exact);
		}
	}
}

Test(paseto_tamper, body_shorter_than_signature)
{
	uint8_t raw[63] = {0};
	char t[200] = "v4.public.";
	spaced_b64url_encode(t + 10, raw, sizeof raw);
	struct spaced_paseto p = {0};
	cr_assert_eq(spaced_paseto_parse(&p, t, strlen(t)), SPACED_EFORMAT);
	cr_assert_eq(spaced_paseto_parse(&p, "v4.public.", 10), SPACED_EFORMAT);
	cr_assert_eq(spaced_paseto_parse(&p, NULL, 0), SPACED_EINVAL);
}

/* Tokens longer than SPACED_PASETO_TOKEN_MAX are refused before decoding, even
 * with a valid signature; one of exactly the maximum is accepted. */
Test(paseto_tamper, oversized)
{
	size_t mlen = 0;
	uint8_t *msg = malloc(SPACED_PASETO_TOKEN_MAX);
	memset(msg, 'x', SPACED_PASETO_TOKEN_MAX);
	bool saw_max = false, saw_over = false;
	for (mlen = 6000; mlen < SPACED_PASETO_TOKEN_MAX; mlen++) {
		char *t = sign_with(msg, mlen, NULL, NULL);
		size_t len = strlen(t);
		int r = verify_str(t, len, NULL, NULL);
		if (len <= SPACED_PASETO_TOKEN_MAX) {
			cr_assert_eq(r, 0, "length %zu refused", len);
			saw_max |= len == SPACED_PASETO_TOKEN_MAX;
		} else {
			cr_assert_eq(r, SPACED_ETOOBIG, "length %zu", len);
			saw_over = true;
		}
		free(t);
		if (saw_over)
			break;
	}
	cr_assert(saw_max && saw_over);
	free(msg);
	/* garbage of every size past the limit */
	char *big = malloc(SPACED_PASETO_TOKEN_MAX * 2);
	memset(big, 'A', SPACED_PASETO_TOKEN_MAX * 2);
	memcpy(big, "v4.public.", 10);
	struct spaced_paseto p = {0};
	cr_assert_eq(spaced_paseto_parse(&p, big, SPACED_PASETO_TOKEN_MAX + 1), SPACED_ETOOBIG);
	cr_assert_eq(spaced_paseto_parse(&p, big, SPACED_PASETO_TOKEN_MAX * 2), SPACED_ETOOBIG);
	cr_assert_eq(spaced_paseto_parse(&p, big, (size_t)-1), SPACED_ETOOBIG);
	free(big);
}

/* ---- structure ---- */

Test(paseto_structure, wrong_version_or_purpose)
{
	const char *body = S_VECTORS[0].token + SPACED_PASETO_HEADER_LEN;
	const char *const heads[] = {"v3.public.", "v4.local.", "V4.public.", "v4.Public.", "v4.public",
	                             "v4public.", "v2.public.", "", "v4..public.", " v4.public.", "k4.public."};
	char t[400];
	for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
		snprintf(t, sizeof t, "%s%s", heads[i], body);
		int r = verify_str(t, strlen(t), NULL, NULL);
		cr_assert_eq(r, SPACED_EHEADER, "header '%s': %s", heads[i], spaced_errname(r));
	}
	cr_assert_eq(verify_str("v4.public", 9, NULL, NULL), SPACED_EHEADER);
	cr_assert_eq(verify_str("", 0, NULL, NULL), SPACED_EHEADER);
}

Test(paseto_structure, empty_footer_and_extra_dots)
{
	const char *nofoot = S_VECTORS[0].token, *foot = S_VECTORS[1].token;
	char t[600];
	struct spaced_paseto p = {0};
	snprintf(t, sizeof t, "%s.", nofoot);
	cr_assert_eq(spaced_paseto_parse(&p, t, strlen(t)), SPACED_EFORMAT, "empty footer after the dot");
	snprintf(t, sizeof t, "%s.", foot);
	cr_assert_eq(spaced_paseto_parse(&p, t, strlen(t)), SPACED_EFORMAT, "trailing dot");
	snprintf(t, sizeof t, "%s.eyJ9", foot);
	cr_assert_eq(spaced_paseto_parse(&p, t, strlen(t)), SPACED_EFORMAT, "two footers");
	snprintf(t, sizeof t, "%s..", nofoot);
	cr_assert_eq(spaced_paseto_parse(&p, t, strlen(t)), SPACED_EFORMAT);
	snprintf(t, sizeof t, "%s..eyJ9", nofoot);
	cr_assert_eq(spaced_paseto_parse(&p, t, strlen(t)), SPACED_EFORMAT);
	snprintf(t, sizeof t, "v4.public..%s", nofoot + 10);
	cr_assert_neq(spaced_paseto_parse(&p, t, strlen(t)), 0, "empty body");
	/* a dot inside the body splits it: the pieces are not a valid token */
	snprintf(t, sizeof t, "%.*s.%s", 50, nofoot, nofoot + 50);
	cr_assert_neq(verify_str(t, strlen(t), NULL, NULL), 0);
}

Test(paseto_structure, expected_footer_compared)
{
	const struct vector *v = &S_VECTORS[1];
	size_t len = strlen(v->token);
	char f[128];
	cr_assert_eq(verify_str(v->token, len, V_FOOTER, ""), 0, "match");
	snprintf(f, sizeof f, "%s", V_FOOTER);
	f[10] ^= 1;
	cr_assert_eq(verify_str(v->token, len, f, ""), SPACED_EFOOTER, "mismatch, same length");
	snprintf(f, sizeof f, "%.*s", (int)strlen(V_FOOTER) - 1, V_FOOTER);
	cr_assert_eq(verify_str(v->token, len, f, ""), SPACED_EFOOTER, "expected is a prefix");
	snprintf(f, sizeof f, "%s ", V_FOOTER);
	cr_assert_eq(verify_str(v->token, len, f, ""), SPACED_EFOOTER, "expected is longer");
	cr_assert_eq(verify_str(v->token, len, "", ""), SPACED_EFOOTER, "expected none, token has one");
	/* a token without footer where one is expected */
	const char *nf = S_VECTORS[0].token;
	cr_assert_eq(verify_str(nf, strlen(nf), V_FOOTER, ""), SPACED_EFOOTER);
	cr_assert_eq(verify_str(nf, strlen(nf), "", ""), 0, "expected empty, token has none");
}

Test(paseto_structure, implicit_assertion_mismatch)
{
	const struct vector *v3 = &S_VECTORS[2], *v2 = &S_VECTORS[1];
	cr_assert_eq(verify_str(v3->token, strlen(v3->token), V_FOOTER, NULL), SPACED_ESIG, "none given");
	cr_assert_eq(verify_str(v3->token, strlen(v3->token), V_FOOTER, "{\"test-vector\":\"4-S-2\"}"), SPACED_ESIG);
	cr_assert_eq(verify_str(v3->token, strlen(v3->token), V_FOOTER, "{\"test-vector\":\"4-S-3\"} "), SPACED_ESIG);
	cr_assert_eq(verify_str(v2->token, strlen(v2->token), V_FOOTER, "{\"test-vector\":\"4-S-3\"}"), SPACED_ESIG,
	             "given where none was signed");
	/* the footer and the implicit assertion are separate PAE pieces */
	char *t = sign_with((const uint8_t *)V_PAYLOAD, strlen(V_PAYLOAD), NULL, V_FOOTER);
	cr_assert_eq(verify_str(t, strlen(t), NULL, V_FOOTER), 0);
	struct spaced_paseto p = {0};
	cr_assert_eq(spaced_paseto_parse(&p, t, strlen(t)), 0);
	uint8_t pk[32];
	vector_public_key(pk);
	cr_assert_eq(spaced_paseto_check(&p, pk, NULL, 0), SPACED_ESIG);
	cr_assert_eq(spaced_paseto_check(&p, pk, (const uint8_t *)V_FOOTER, strlen(V_FOOTER)), 0);
	pk[0] ^= 1;
	cr_assert_eq(spaced_paseto_check(&p, pk, (const uint8_t *)V_FOOTER, strlen(V_FOOTER)), SPACED_ESIG,
	             "another public key");
	spaced_paseto_clear(&p);
	free(t);
}

Test(paseto_structure, empty_payload_and_large_implicit)
{
	char big[4000];
	memset(big, 'i', sizeof big - 1);
	big[sizeof big - 1] = 0;
	char *t = sign_with((const uint8_t *)"", 0, NULL, big);
	cr_assert_eq(verify_str(t, strlen(t), NULL, big), 0, "PAE larger than the stack buffer");
	big[100] = 'j';
	cr_assert_eq(verify_str(t, strlen(t), NULL, big), SPACED_ESIG);
	free(t);
}

/* ---- PAE, as in the specification ---- */

static void pae_expect(size_t count, const char *const *pieces, const uint8_t *want, size_t wlen)
{
	const uint8_t *p[4];
	size_t l[4];
	for (size_t i = 0; i < count; i++) {
		p[i] = (const uint8_t *)pieces[i];
		l[i] = strlen(pieces[i]);
	}
	struct spaced_buf b;
	spaced_buf_init(&b, 1024);
	cr_assert_eq(spaced_paseto_pae(&b, count, p, l), 0);
	cr_assert_eq(b.len, wlen);
	cr_assert_arr_eq(b.data, want, wlen);
	spaced_buf_free(&b);
}

Test(paseto_pae, specification_examples)
{
	static const uint8_t empty_list[8] = {0};
	static const uint8_t one_empty[16] = {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
	static const uint8_t test[20] = {1, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 't', 'e', 's', 't'};
	const char *const e[] = {""}, *const t[] = {"test"};
	pae_expect(0, NULL, empty_list, sizeof empty_list);
	pae_expect(1, e, one_empty, sizeof one_empty);
	pae_expect(1, t, test, sizeof test);
}

Test(paseto_pae, bounded_buffer)
{
	const uint8_t *p[1] = {(const uint8_t *)"test"};
	size_t l[1] = {4};
	struct spaced_buf b;
	spaced_buf_init(&b, 19);
	cr_assert_eq(spaced_paseto_pae(&b, 1, p, l), SPACED_ETOOBIG);
	spaced_buf_free(&b);
}
