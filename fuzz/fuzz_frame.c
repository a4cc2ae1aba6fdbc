/*
 * fuzz_frame.c — the frame decoder and the typed field decoder (frame.h) on
 * arbitrary bytes, as a guest or a bridge receives them from a peer.
 *
 * Oracles: parsing never reads out of bounds (ASan); a frame never exceeds
 * the maximum; a payload that validates as fields re-encodes to the same bytes;
 * RESULT heads and exit extras parse without trusting any length.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "spaced_error.h"
#include "frame.h"
#include "guest_client.h"

/* Re-encodes a validated field payload and checks it is byte-identical. */
static void roundtrip(const uint8_t *p, size_t n)
{
	struct spaced_field_reader r;
	struct spaced_buf out;
	spaced_field_reader_init(&r, p, n);
	spaced_buf_init(&out, n + 16);
	while (spaced_field_more(&r)) {
		uint8_t kind = r.p[r.off];
		uint64_t u;
		int64_t i;
		const char *s;
		const uint8_t *b;
		size_t len;
		switch (kind) {
		case SPACED_FIELD_U64:
			if (spaced_field_get_u64(&r, &u) < 0 || spaced_field_put_u64(&out, u) < 0)
				abort();
			break;
		case SPACED_FIELD_I64:
			if (spaced_field_get_i64(&r, &i) < 0 || spaced_field_put_i64(&out, i) < 0)
				abort();
			break;
		case SPACED_FIELD_STR:
			if (spaced_field_get_str(&r, &s, &len) < 0 || spaced_field_put_strn(&out, s, len) < 0)
				abort();
			break;
		case SPACED_FIELD_BYTES:
			if (spaced_field_get_bytes(&r, &b, &len) < 0 || spaced_field_put_bytes(&out, b, len) < 0)
				abort();
			break;
		default:
			abort();
		}
	}
	if (spaced_field_end(&r) != 0 || out.len != n || (n && memcmp(out.data, p, n) != 0))
		abort();
	spaced_buf_free(&out);
}

/* The typed getters in an order chosen by the input, as a request schema would. */
static void schema_walk(const uint8_t *p, size_t n, uint8_t script)
{
	struct spaced_field_reader r;
	spaced_field_reader_init(&r, p, n);
	for (int k = 0; k < 8; k++) {
		uint64_t u;
		int64_t i;
		char buf[32];
		char *d = NULL;
		const uint8_t *b;
		size_t len;
		switch ((script >> (k % 4 * 2)) & 3) {
		case 0:
			(void)spaced_field_get_u64(&r, &u);
			break;
		case 1:
			(void)spaced_field_get_i64(&r, &i);
			break;
		case 2:
			if (spaced_field_get_strbuf(&r, buf, sizeof buf) == 0 && strlen(buf) >= sizeof buf)
				abort();
			break;
		default:
			if (k & 1) {
				(void)spaced_field_get_bytes(&r, &b, &len);
			} else if (spaced_field_get_strdup(&r, 100, &d) == 0) {
				if (strlen(d) > 100)
					abort();
				free(d);
			}
		}
	}
	(void)spaced_field_end(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct spaced_guest_client *c = NULL;
	if (spaced_guest_client_adopt(-1, &c) < 0)
		return 0;
	size_t off = 0;
	while (off < size) {
		struct spaced_frame_hdr h;
		const uint8_t *payload;
		size_t used = 0;
		int e = spaced_frame_parse(data + off, size - off, 2048, &h, &payload, &used);
		if (e < 0 || used == 0)
			break;
		if (h.len > 2048 || used != SPACED_FRAME_HDR_LEN + h.len || used > size - off)
			abort();
		if (spaced_field_validate(payload, h.len) >= 0)
			roundtrip(payload, h.len);
		schema_walk(payload, h.len, (uint8_t)h.type);
		if (h.type == SPACED_GUEST_OUT_RESULT) {
			struct spaced_guest_msg m = {h, (uint8_t *)(uintptr_t)payload};
			struct spaced_field_reader r;
			if (spaced_guest_result_head(c, &m, &r) >= 0) {
				struct spaced_guest_exit x;
				(void)spaced_guest_exit_parse(&r, &x);
			}
		}
		off += used;
	}
	spaced_guest_client_free(c);
	return 0;
}
