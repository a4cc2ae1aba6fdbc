/* paseto.c — PASETO v4.public parsing and signature verification. */
#include "paseto.h"

#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "spaced_error.h"
#include "util.h"

int spaced_paseto_pae(struct spaced_buf *out, size_t count, const uint8_t *const *pieces,
                      const size_t *lens)
{
	int r = spaced_buf_put_le64(out, (uint64_t)count & INT64_MAX);
	for (size_t i = 0; r == 0 && i < count; i++) {
		r = spaced_buf_put_le64(out, (uint64_t)lens[i] & INT64_MAX);
		if (r == 0)
			r = spaced_buf_append(out, pieces[i], lens[i]);
	}
	return r;
}

int spaced_paseto_parse(struct spaced_paseto *out, const char *token, size_t len)
{
	if (token == NULL)
		return SPACED_EINVAL;
	if (len > SPACED_PASETO_TOKEN_MAX)
		return SPACED_ETOOBIG;
	if (len < SPACED_PASETO_HEADER_LEN || memcmp(token, SPACED_PASETO_HEADER, SPACED_PASETO_HEADER_LEN) != 0)
		return SPACED_EHEADER;
	const char *body = token + SPACED_PASETO_HEADER_LEN;
	size_t rest = len - SPACED_PASETO_HEADER_LEN;
	const char *dot = memchr(body, '.', rest);
	size_t body_len = dot ? (size_t)(dot - body) : rest;
	const char *foot = dot ? dot + 1 : NULL;
	size_t foot_len = dot ? rest - body_len - 1 : 0;
	if (dot != NULL && (foot_len == 0 || memchr(foot, '.', foot_len) != NULL))
		return SPACED_EFORMAT;

	uint8_t *storage = malloc(spaced_b64url_decoded_max(body_len) + spaced_b64url_decoded_max(foot_len) + 1);
	if (storage == NULL)
		return SPACED_ENOMEM;
	size_t blen = 0, flen = 0;
	int r = spaced_b64url_decode(storage, &blen, body, body_len);
	if (r < 0)
		goto out;
	if (blen < SPACED_PASETO_SIG_LEN) {
		r = SPACED_EFORMAT;
		goto out;
	}
	uint8_t *fbuf = storage + blen;
	if (foot != NULL && (r = spaced_b64url_decode(fbuf, &flen, foot, foot_len)) < 0)
		goto out;
	fbuf[flen] = 0;
	out->msg = storage;
	out->msg_len = blen - SPACED_PASETO_SIG_LEN;
	out->sig = storage + out->msg_len;
	out->footer = fbuf;
	out->footer_len = flen;
	out->storage = storage;
	return SPACED_OK;
out:
	free(storage);
	return r;
}

int spaced_paseto_check(const struct spaced_paseto *t, const uint8_t pk[32], const uint8_t *implicit,
                        size_t ilen)
{
	static const uint8_t header[] = SPACED_PASETO_HEADER;
	const uint8_t *pieces[4] = {header, t->msg, t->footer, implicit ? implicit : header};
	size_t lens[4] = {SPACED_PASETO_HEADER_LEN, t->msg_len, t->footer_len, ilen};
	/* The PAE of a typical capability fits on the stack; larger ones are built
	 * in a bounded heap buffer. */
	uint8_t stack[1536];
	size_t total = 8 + 4 * 8 + lens[0] + lens[1] + lens[2] + lens[3];
	uint8_t *m2 = stack;
	if (total > sizeof stack) {
		m2 = malloc(total);
		if (m2 == NULL)
			return SPACED_ENOMEM;
	}
	uint8_t *p = m2;
	uint64_t n = 4;
	for (int b = 0; b < 8; b++)
		*p++ = (uint8_t)(n >> (8 * b));
	for (int i = 0; i < 4; i++) {
		uint64_t l = (uint64_t)lens[i] & INT64_MAX;
		for (int b = 0; b < 8; b++)
			*p++ = (uint8_t)(l >> (8 * b));
		if (lens[i] > 0)
			memcpy(p, pieces[i], lens[i]);
		p += lens[i];
	}
	int ok = crypto_sign_verify_detached(t->sig, m2, total, pk);
	if (m2 != stack)
		free(m2);
	return ok == 0 ? SPACED_OK : SPACED_ESIG;
}

void spaced_paseto_clear(struct spaced_paseto *t)
{
	if (t == NULL)
		return;
	free(t->storage);
	memset(t, 0, sizeof *t);
}

int spaced_paseto_verify(const char *token, size_t len, const uint8_t pk[32],
                         const uint8_t *expected_footer, size_t expected_footer_len,
                         const uint8_t *implicit, size_t ilen, uint8_t **msg, size_t *msg_len)
{
	struct spaced_paseto t = {0};
	int r = spaced_paseto_parse(&t, token, len);
	if (r < 0)
		return r;
	if (expected_footer != NULL &&
	    !spaced_ct_eq_len(t.footer, t.footer_len, expected_footer, expected_footer_len)) {
		r = SPACED_EFOOTER;
		goto out;
	}
	if ((r = spaced_paseto_check(&t, pk, implicit, ilen)) < 0)
		goto out;
	uint8_t *copy = malloc(t.msg_len + 1);
	if (copy == NULL) {
		r = SPACED_ENOMEM;
		goto out;
	}
	memcpy(copy, t.msg, t.msg_len);
	copy[t.msg_len] = 0;
	*msg = copy;
	*msg_len = t.msg_len;
out:
	spaced_paseto_clear(&t);
	return r;
}
