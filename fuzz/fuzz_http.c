/*
 * fuzz_http.c — libFuzzer target for what every spaced server reads from its
 * clients: HTTP/1.1 request heads, bodies (length and chunked) and WebSocket
 * frames (libspaced/http.c, ws.c). Checks that a parsed head is internally
 * consistent, that a body decoder never hands out more than it was given,
 * and that frame parsing never reads past its input.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"
#include "ws.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct spaced_http_limits lim = {.head_max = 4096, .target_max = 1024, .fields_max = 32};
	struct spaced_http_req r;
	int n = spaced_http_parse_head(data, size, &lim, &r);
	if (n > 0) {
		if ((size_t)n > size || (size_t)n > lim.head_max || r.nfields > lim.fields_max || r.target[0] != '/' ||
		    (r.minor != 0 && r.minor != 1) || (r.websocket && r.body != SPACED_HTTP_BODY_NONE))
			abort();
		if (r.body == SPACED_HTTP_BODY_LENGTH && (r.content_length == 0 || r.content_length > (uint64_t)INT64_MAX))
			abort();
		struct spaced_http_body b;
		if (spaced_http_body_start(&b, &r, 1u << 20) == 0) {
			size_t off = (size_t)n, got = 0;
			while (off < size && !b.done) {
				const uint8_t *d;
				size_t dl;
				long u = spaced_http_body_feed(&b, data + off, size - off, &d, &dl);
				if (u < 0)
					break;
				if ((size_t)u > size - off || dl > (size_t)u || (dl && (d < data + off || d + dl > data + size)))
					abort();
				got += dl;
				off += (size_t)u;
				if (u == 0)
					break;
			}
			if (got > (1u << 20) || got != b.total)
				abort();
		}
		spaced_http_req_clear(&r);
	} else if (n != 0 && n != -400 && n != -414 && n != -417 && n != -431 && n != -501 && n != -505) {
		abort();
	}
	for (int client = 0; client < 2; client++) {
		struct spaced_ws_frame f;
		int h = spaced_ws_frame_parse(data, size, client, 1u << 20, &f);
		if (h > 0 && ((size_t)h > size || (size_t)h != f.hdr_len || f.len > (1u << 20) || f.masked != client))
			abort();
		if (h < 0 && h != -1002 && h != -1009)
			abort();
	}
	(void)spaced_utf8_valid(data, size);
	return 0;
}
