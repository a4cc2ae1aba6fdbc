/*
 * test-http — the strict HTTP/1.1 parser and the WebSocket codec every spaced
 * server reads its clients with (libspaced/http.c, ws.c): what is valid is
 * read exactly; each ambiguity a request-smuggling or parser-confusion attack
 * relies on is refused with its status (issue 12, item 5).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "http.h"
#include "ws.h"

static const struct spaced_http_limits lim = {.head_max = 16384, .target_max = 8192, .fields_max = 100};

static int parse(const char *s, struct spaced_http_req *r)
{
	return spaced_http_parse_head((const uint8_t *)s, strlen(s), &lim, r);
}

static int status_of(const char *s)
{
	struct spaced_http_req r;
	int n = parse(s, &r);
	if (n > 0)
		spaced_http_req_clear(&r);
	return n;
}

Test(http, a_valid_request_is_read_exactly)
{
	struct spaced_http_req r;
	const char *s = "POST /v1/sandboxes/x/files?path=%2Fa HTTP/1.1\r\nHost: h\r\nContent-Length: 12\r\n"
	                "Authorization: Bearer tok  \r\nX-Empty:\r\n\r\nbody follows";
	int n = parse(s, &r);
	cr_assert_eq(n, (int)(strstr(s, "body") - s));
	cr_assert_str_eq(r.method, "POST");
	cr_assert_str_eq(r.target, "/v1/sandboxes/x/files?path=%2Fa");
	cr_assert_eq(r.minor, 1);
	cr_assert_eq(r.body, SPACED_HTTP_BODY_LENGTH);
	cr_assert_eq(r.content_length, 12);
	cr_assert_str_eq(spaced_http_field(&r, "authorization"), "Bearer tok");
	cr_assert_str_eq(spaced_http_field(&r, "x-empty"), "");
	cr_assert(r.keep_alive);
	spaced_http_req_clear(&r);
	/* incomplete: more bytes wanted, nothing refused */
	cr_assert_eq(parse("GET / HTTP/1.1\r\nHost: h\r\n", &r), 0);
	cr_assert_eq(parse("GET / HT", &r), 0);
}

Test(http, line_endings_and_bytes_that_smuggle_are_refused)
{
	cr_assert_eq(status_of("GET / HTTP/1.1\nHost: h\n\n"), -400, "bare LF");
	cr_assert_eq(status_of("GET / HTTP/1.1\r\nHost: h\n\r\n"), -400, "LF-ended field");
	cr_assert_eq(status_of("GET / HTTP/1.1\r\nHost: h\rX: y\r\n\r\n"), -400, "bare CR");
	cr_assert_eq(status_of("GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n"), -400, "folded line");
	cr_assert_eq(status_of("GET / HTTP/1.1\r\nHost : h\r\n\r\n"), -400, "space before the colon");
	cr_assert_eq(status_of("GET / HTTP/1.1\r\nHo st: h\r\n\r\n"), -400, "space in a name");
	char nul[] = "GET / HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer k\0junk\r\n\r\n";
	struct spaced_http_req r;
	cr_assert_eq(spaced_http_parse_head((const uint8_t *)nul, sizeof nul - 1, &lim, &r), -400, "NUL in a value");
	cr_assert_eq(status_of("GET / HTTP/1.1\r\nHost: h\r\nX: a\x01b\r\n\r\n"), -400, "control byte");
	cr_assert_eq(status_of("GET /a#b HTTP/1.1\r\nHost: h\r\n\r\n"), -400, "fragment in the target");
	cr_assert_eq(status_of("GET http://h/ HTTP/1.1\r\nHost: h\r\n\r\n"), -400, "absolute form");
	cr_assert_eq(status_of("GET  / HTTP/1.1\r\nHost: h\r\n\r\n"), -400, "two spaces");
	cr_assert_eq(status_of("\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n"), -400, "empty line first");
	cr_assert_eq(status_of("GET / HTTP/9.9\r\nHost: h\r\n\r\n"), -505);
	cr_assert_eq(status_of("GET / HTTP/2\r\nHost: h\r\n\r\n"), -400);
	cr_assert_eq(status_of("GET / HTTP/1.1\r\n\r\n"), -400, "no Host");
	cr_assert_eq(status_of("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), -400, "two Hosts");
	cr_assert_gt(status_of("GET / HTTP/1.0\r\n\r\n"), 0, "HTTP/1.0 needs no Host");
}

Test(http, message_framing_is_unambiguous)
{
	cr_assert_eq(status_of("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"), -400);
	cr_assert_eq(status_of("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n"), -400);
	cr_assert_eq(status_of("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 6\r\n\r\n"), -400);
	cr_assert_eq(status_of("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +5\r\n\r\n"), -400);
	cr_assert_eq(status_of("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0x10\r\n\r\n"), -400);
	cr_assert_eq(status_of("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 18446744073709551616\r\n\r\n"), -400);
	cr_assert_eq(status_of("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 18446744073709551615\r\n\r\n"), -400);
	cr_assert_eq(status_of("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"), -400);
	cr_assert_eq(status_of("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n"), -501);
	cr_assert_eq(status_of("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"), -400);
	cr_assert_eq(status_of("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"),
	             -400);
	cr_assert_eq(status_of("POST / HTTP/1.1\r\nHost: h\r\nExpect: 200-ok\r\n\r\n"), -417);
	struct spaced_http_req r;
	cr_assert_gt(parse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\n\r\n", &r), 0);
	cr_assert_eq(r.body, SPACED_HTTP_BODY_CHUNKED);
	spaced_http_req_clear(&r);
}

Test(http, limits_give_431_and_414)
{
	size_t big = 70000;
	char *s = malloc(big + 64);
	int n = sprintf(s, "GET / HTTP/1.1\r\nHost: h\r\nX: ");
	memset(s + n, 'a', big);
	s[n + big] = 0;
	struct spaced_http_req r;
	/* refused as soon as the limit is passed, before the head is complete */
	cr_assert_eq(spaced_http_parse_head((const uint8_t *)s, strlen(s), &lim, &r), -431);
	char *t = malloc(9000 + 64);
	n = sprintf(t, "GET /");
	memset(t + n, 'a', 8800);
	strcpy(t + n + 8800, " HTTP/1.1\r\nHost: h\r\n\r\n");
	cr_assert_eq(status_of(t), -414);
	/* too many fields */
	char *u = malloc(200 * 16 + 64);
	n = sprintf(u, "GET / HTTP/1.1\r\nHost: h\r\n");
	for (int i = 0; i < 150; i++)
		n += sprintf(u + n, "X%d: v\r\n", i);
	strcpy(u + n, "\r\n");
	cr_assert_eq(status_of(u), -431);
	free(s);
	free(t);
	free(u);
}

Test(http, websocket_upgrade_is_checked)
{
	struct spaced_http_req r;
	const char *ok = "GET /w HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n"
	                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
	cr_assert_gt(parse(ok, &r), 0);
	cr_assert(r.websocket);
	spaced_http_req_clear(&r);
	cr_assert_eq(status_of("GET /w HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
	                       "Sec-WebSocket-Key: short\r\nSec-WebSocket-Version: 13\r\n\r\n"), -400);
	cr_assert_eq(status_of("GET /w HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
	                       "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n"), -400);
	/* h2c is not an upgrade spaced makes */
	cr_assert_gt(parse("GET / HTTP/1.1\r\nHost: h\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n"
	                   "HTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n", &r), 0);
	cr_assert(!r.websocket);
	spaced_http_req_clear(&r);
	char accept[29];
	cr_assert_eq(spaced_ws_accept("dGhlIHNhbXBsZSBub25jZQ==", accept), 0);
	cr_assert_str_eq(accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="); /* RFC 6455, 1.3 */
}

static long feed_all(struct spaced_http_body *b, const char *in, char *out, size_t *outlen)
{
	size_t n = strlen(in), off = 0;
	*outlen = 0;
	while (off < n && !b->done) {
		const uint8_t *d;
		size_t dl;
		long u = spaced_http_body_feed(b, (const uint8_t *)in + off, n - off, &d, &dl);
		if (u < 0)
			return u;
		memcpy(out + *outlen, d, dl);
		*outlen += dl;
		off += (size_t)u;
		if (u == 0)
			break;
	}
	return (long)off;
}

Test(http, chunked_bodies_are_decoded_strictly)
{
	struct spaced_http_req r;
	struct spaced_http_body b;
	char out[256];
	size_t ol;
	cr_assert_gt(parse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n", &r), 0);
	cr_assert_eq(spaced_http_body_start(&b, &r, 100), 0);
	cr_assert_eq(feed_all(&b, "5\r\n{\"pid\r\na\r\ns\":5}xxxxx\r\n0\r\n\r\n", out, &ol), 30);
	cr_assert(b.done);
	cr_assert_eq(ol, 15);
	cr_assert_eq(memcmp(out, "{\"pids\":5}xxxxx", 15), 0);
	static const char *const bad[] = {"zz\r\n", "5 \r\nabcde\r\n0\r\n\r\n", " 5\r\n", "5;ext=1\r\nabcde\r\n0\r\n\r\n",
	                                  "5\nabcde\r\n", "5\r\nabcdeX\r\n", "0\r\nTrailer: x\r\n\r\n",
	                                  "fffffffffffffffff\r\n", "-1\r\n"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		cr_assert_eq(spaced_http_body_start(&b, &r, 100), 0);
		cr_assert_eq(feed_all(&b, bad[i], out, &ol), -400, "%s", bad[i]);
	}
	cr_assert_eq(spaced_http_body_start(&b, &r, 4), 0);
	cr_assert_eq(feed_all(&b, "5\r\nabcde\r\n0\r\n\r\n", out, &ol), -413);
	spaced_http_req_clear(&r);
	cr_assert_gt(parse("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n", &r), 0);
	cr_assert_eq(spaced_http_body_start(&b, &r, 9), -413);
	spaced_http_req_clear(&r);
}

Test(ws, client_frames_are_read_strictly)
{
	struct spaced_ws_frame f;
	uint8_t masked[] = {0x81, 0x85, 1, 2, 3, 4, 'h' ^ 1, 'e' ^ 2, 'l' ^ 3, 'l' ^ 4, 'o' ^ 1};
	cr_assert_eq(spaced_ws_frame_parse(masked, sizeof masked, true, 1000, &f), 6);
	cr_assert(f.fin);
	cr_assert_eq(f.opcode, SPACED_WS_TEXT);
	cr_assert_eq(f.len, 5);
	spaced_ws_mask(masked + 6, 5, f.mask, 0);
	cr_assert_eq(memcmp(masked + 6, "hello", 5), 0);
	uint8_t unmasked[] = {0x81, 0x05, 'h', 'e', 'l', 'l', 'o'};
	cr_assert_eq(spaced_ws_frame_parse(unmasked, sizeof unmasked, true, 1000, &f), -1002, "unmasked from a client");
	uint8_t rsv[] = {0xc1, 0x80, 0, 0, 0, 0};
	cr_assert_eq(spaced_ws_frame_parse(rsv, sizeof rsv, true, 1000, &f), -1002, "reserved bit");
	uint8_t op[] = {0x83, 0x80, 0, 0, 0, 0};
	cr_assert_eq(spaced_ws_frame_parse(op, sizeof op, true, 1000, &f), -1002, "unknown opcode");
	uint8_t frag_ping[] = {0x09, 0x80, 0, 0, 0, 0};
	cr_assert_eq(spaced_ws_frame_parse(frag_ping, sizeof frag_ping, true, 1000, &f), -1002, "fragmented control");
	uint8_t long_ping[] = {0x89, 0xfe, 0, 126, 0, 0, 0, 0};
	cr_assert_eq(spaced_ws_frame_parse(long_ping, sizeof long_ping, true, 1000, &f), -1002, "long control");
	uint8_t not_short[] = {0x82, 0xfe, 0, 5, 0, 0, 0, 0};
	cr_assert_eq(spaced_ws_frame_parse(not_short, sizeof not_short, true, 1000, &f), -1002, "length not shortest");
	uint8_t huge[] = {0x82, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
	cr_assert_eq(spaced_ws_frame_parse(huge, sizeof huge, true, UINT64_MAX, &f), -1002, "top bit of a 64-bit length");
	uint8_t big[] = {0x82, 0xfe, 0x10, 0x00, 0, 0, 0, 0};
	cr_assert_eq(spaced_ws_frame_parse(big, sizeof big, true, 1000, &f), -1009, "over the limit");
	cr_assert_eq(spaced_ws_frame_parse(big, 3, true, 1000, &f), 0, "more bytes wanted");
	uint8_t h[SPACED_WS_HDR_MAX];
	cr_assert_eq(spaced_ws_frame_header(h, true, SPACED_WS_BINARY, 70000), 10);
	cr_assert_eq(spaced_ws_frame_parse(h, 10, false, UINT64_MAX, &f), 10);
	cr_assert_eq(f.len, 70000);
}

/* The word-at-a-time mask is the RFC 6455 definition, byte for byte, at
 * every alignment, length and offset into the frame. */
Test(ws, mask_is_the_definition_at_every_alignment)
{
	static uint8_t buf[96], want[96];
	const uint8_t mask[4] = {0x9e, 0x01, 0x5a, 0xf3};
	for (size_t start = 0; start < 9; start++)
		for (size_t n = 0; n + start <= 80; n++)
			for (uint64_t off = 0; off < 5; off++) {
				for (size_t i = 0; i < sizeof buf; i++)
					buf[i] = want[i] = (uint8_t)(i * 37 + 11);
				for (size_t i = 0; i < n; i++)
					want[start + i] ^= mask[(off + i) % 4];
				spaced_ws_mask(buf + start, n, mask, off);
				cr_assert_eq(memcmp(buf, want, sizeof buf), 0, "start %zu, %zu bytes, offset %llu", start, n,
				             (unsigned long long)off);
			}
}

Test(ws, utf8_and_close_codes)
{
	cr_assert(spaced_utf8_valid((const uint8_t *)"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80", 15));
	cr_assert(!spaced_utf8_valid((const uint8_t *)"\xc0\xaf", 2), "overlong");
	cr_assert(!spaced_utf8_valid((const uint8_t *)"\xed\xa0\x80", 3), "surrogate");
	cr_assert(!spaced_utf8_valid((const uint8_t *)"\xf4\x90\x80\x80", 4), "above U+10FFFF");
	cr_assert(!spaced_utf8_valid((const uint8_t *)"\xe2\x82", 2), "truncated");
	cr_assert(!spaced_utf8_valid((const uint8_t *)"\xff", 1));
	cr_assert(spaced_ws_close_code_ok(1000));
	cr_assert(spaced_ws_close_code_ok(4409));
	cr_assert(!spaced_ws_close_code_ok(1005));
	cr_assert(!spaced_ws_close_code_ok(999));
	cr_assert(!spaced_ws_close_code_ok(5000));
}
