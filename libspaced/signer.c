/* signer.c — secret keys, PASETO v4.public signing and capability issuance. */
#include "signer.h"

#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "spaced_error.h"
#include "paseto.h"
#include "util.h"

struct spaced_secret_key {
	uint8_t sk[crypto_sign_SECRETKEYBYTES]; /* seed || public key */
};

static struct spaced_secret_key *key_alloc(void)
{
	/* sodium_malloc guards the page and locks it against swapping; it needs
	 * libsodium initialised (idempotent and thread-safe), which callers of this
	 * module are not required to have done. */
	if (sodium_init() < 0)
		return NULL;
	return sodium_malloc(sizeof(struct spaced_secret_key));
}

void spaced_secret_key_free(struct spaced_secret_key *sk)
{
	if (sk != NULL)
		sodium_free(sk); /* wipes before unmapping */
}

int spaced_secret_key_generate(struct spaced_secret_key **out)
{
	uint8_t pk[crypto_sign_PUBLICKEYBYTES];
	struct spaced_secret_key *k = key_alloc();
	if (k == NULL)
		return SPACED_ENOMEM;
	crypto_sign_keypair(pk, k->sk);
	*out = k;
	return SPACED_OK;
}

int spaced_secret_key_from_bytes(struct spaced_secret_key **out, const uint8_t *bytes, size_t n)
{
	uint8_t pk[crypto_sign_PUBLICKEYBYTES];
	if (bytes == NULL || (n != crypto_sign_SEEDBYTES && n != crypto_sign_SECRETKEYBYTES))
		return SPACED_EKEY;
	struct spaced_secret_key *k = key_alloc();
	if (k == NULL)
		return SPACED_ENOMEM;
	crypto_sign_seed_keypair(pk, k->sk, bytes);
	if (n == crypto_sign_SECRETKEYBYTES && !spaced_ct_eq(pk, bytes + crypto_sign_SEEDBYTES, sizeof pk)) {
		spaced_secret_key_free(k);
		return SPACED_EKEY;
	}
	*out = k;
	return SPACED_OK;
}

int spaced_secret_key_from_paserk(struct spaced_secret_key **out, const char *s, size_t n)
{
	static const char prefix[] = "k4.secret.";
	uint8_t raw[72];
	size_t rl = 0;
	if (n < sizeof prefix - 1 || memcmp(s, prefix, sizeof prefix - 1) != 0)
		return (n >= 3 && s[0] == 'k' && s[1] >= '1' && s[1] <= '9' && s[2] == '.') ? SPACED_EKEYTYPE
		                                                                          : SPACED_EKEY;
	if (n != SPACED_PASERK_SECRET_LEN ||
	    spaced_b64url_decode_secret(raw, &rl, s + sizeof prefix - 1, n - (sizeof prefix - 1)) < 0 ||
	    rl != crypto_sign_SECRETKEYBYTES) {
		spaced_wipe(raw, sizeof raw);
		return SPACED_EKEY;
	}
	int r = spaced_secret_key_from_bytes(out, raw, rl);
	spaced_wipe(raw, sizeof raw);
	return r;
}

void spaced_secret_key_to_paserk(const struct spaced_secret_key *sk,
                                 char out[SPACED_PASERK_SECRET_LEN + 1])
{
	memcpy(out, "k4.secret.", 10);
	spaced_b64url_encode(out + 10, sk->sk, sizeof sk->sk);
}

void spaced_secret_key_public(const struct spaced_secret_key *sk, struct spaced_public_key *out)
{
	memcpy(out->pk, sk->sk + crypto_sign_SEEDBYTES, sizeof out->pk);
}

int spaced_paseto_sign(const struct spaced_secret_key *sk, const uint8_t *msg, size_t msg_len,
                       const uint8_t *footer, size_t footer_len, const uint8_t *implicit,
                       size_t ilen, char **token)
{
	static const uint8_t header[] = SPACED_PASETO_HEADER;
	const uint8_t *pieces[4] = {header, msg, footer, implicit};
	size_t lens[4] = {SPACED_PASETO_HEADER_LEN, msg_len, footer_len, ilen};
	struct spaced_buf m2, body;
	uint8_t sig[crypto_sign_BYTES];
	int r;
	spaced_buf_init(&m2, SIZE_MAX / 2);
	spaced_buf_init(&body, SIZE_MAX / 2);
	if ((r = spaced_paseto_pae(&m2, 4, pieces, lens)) < 0)
		goto out;
	crypto_sign_detached(sig, NULL, m2.data, m2.len, sk->sk);
	if ((r = spaced_buf_append(&body, msg, msg_len)) < 0 ||
	    (r = spaced_buf_append(&body, sig, sizeof sig)) < 0)
		goto out;
	size_t blen = spaced_b64url_encoded_len(body.len);
	size_t flen = footer_len ? 1 + spaced_b64url_encoded_len(footer_len) : 0;
	size_t total = SPACED_PASETO_HEADER_LEN + blen + flen;
	char *t = malloc(total + 1);
	if (t == NULL) {
		r = SPACED_ENOMEM;
		goto out;
	}
	memcpy(t, SPACED_PASETO_HEADER, SPACED_PASETO_HEADER_LEN);
	spaced_b64url_encode(t + SPACED_PASETO_HEADER_LEN, body.data, body.len);
	if (footer_len) {
		t[SPACED_PASETO_HEADER_LEN + blen] = '.';
		spaced_b64url_encode(t + SPACED_PASETO_HEADER_LEN + blen + 1, footer, footer_len);
	}
	t[total] = 0;
	*token = t;
	r = SPACED_OK;
out:
	spaced_buf_free(&m2);
	spaced_buf_free(&body);
	return r;
}

int spaced_cap_issue(const struct spaced_secret_key *sk, const struct spaced_cap *cap, char **token)
{
	struct spaced_public_key pk;
	char footer[SPACED_CAP_FOOTER_MAX];
	char *claims = NULL;
	size_t claims_len = 0;
	int r, flen;
	spaced_secret_key_public(sk, &pk);
	if ((flen = spaced_cap_footer_encode(&pk, footer, sizeof footer)) < 0)
		return flen;
	if ((r = spaced_cap_claims_encode(cap, &claims, &claims_len)) < 0)
		return r;
	const char *ia = spaced_cap_implicit(cap->cls);
	r = spaced_paseto_sign(sk, (const uint8_t *)claims, claims_len, (const uint8_t *)footer,
	                       (size_t)flen, (const uint8_t *)ia, strlen(ia), token);
	free(claims);
	return r;
}
