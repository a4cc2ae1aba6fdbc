/*
 * test_client.c — spacectl's client pieces that need no cluster: how a worker's
 * answer is read and classified (V1: only a recognized REFRESH_ROUTE body on a
 * 409 is a refresh signal; 401/403 are DENY, C5), bodies cut short, query
 * escaping and worker URLs. The recovery itself runs against real workers in
 * tests/client_recovery.t.sh.
 */
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "client.h"
#include "spaced_error.h"
#include "ws.h"
#include "ws_client.h"

/* Parses text into *a (which starts zeroed; what it held before is freed). */
static int parse(const char *text, struct client_answer *a)
{
	client_answer_clear(a);
	return client_parse_answer((const unsigned char *)text, strlen(text), a);
}

/* An answer with this status line and JSON body, its Content-Length right. */
static int parse_json(const char *status, const char *body, struct client_answer *a)
{
	char text[1024];
	snprintf(text, sizeof text, "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", status,
	         strlen(body), body);
	return parse(text, a);
}

Test(answer, allow_with_identity_and_length)
{
	struct client_answer a = {0};
	cr_assert_eq(parse("HTTP/1.1 200 OK\r\nX-Spaced-Identity: sandbox=s;generation=2;worker=w;substrate=process;"
	                   "activation=a;pod_uid=\r\nContent-Length: 5\r\n\r\nhello+trailing", &a), 0);
	cr_assert_eq(a.outcome, CLIENT_ALLOW);
	cr_assert_eq(a.status, 200);
	cr_assert_str_eq(a.identity, "sandbox=s;generation=2;worker=w;substrate=process;activation=a;pod_uid=");
	cr_assert_eq(a.body_len, 5);
	cr_assert_str_eq((char *)a.body, "hello");
	client_answer_clear(&a);
}

Test(answer, chunked_body_decoded)
{
	struct client_answer a = {0};
	cr_assert_eq(parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n1\r\n!\r\n0\r\n\r\n", &a), 0);
	cr_assert_str_eq((char *)a.body, "hello!");
	client_answer_clear(&a);
}

Test(answer, cut_short_is_a_transport_failure)
{
	struct client_answer a = {0};
	/* a stream cut before its final chunk, a body shorter than announced */
	cr_assert_eq(parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", &a), -1);
	cr_assert_str_eq(a.reason, "answer cut short");
	cr_assert_eq(parse("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", &a), -1);
	cr_assert_str_eq(a.reason, "answer cut short");
	cr_assert_eq(parse("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n", &a), -1);
	cr_assert_eq(parse("", &a), -1);
	cr_assert_eq(parse("SSH-2.0-x\r\n\r\n", &a), -1);
	client_answer_clear(&a);
}

Test(answer, refresh_route_only_from_its_body_on_409) /* V1 */
{
	struct client_answer a = {0};
	cr_assert_eq(parse_json("409 Conflict", "{\"outcome\":\"REFRESH_ROUTE\",\"reason\":\"deactivated\",\"sandbox\":\"sbx-1\"}", &a), 0);
	cr_assert_eq(a.outcome, CLIENT_REFRESH_ROUTE);
	cr_assert_str_eq(a.reason, "deactivated");
	cr_assert_str_eq(a.identity, "");
	/* a 409 that does not say REFRESH_ROUTE is not a refresh signal */
	cr_assert_eq(parse("HTTP/1.1 409 Conflict\r\nContent-Length: 2\r\n\r\n{}", &a), 0);
	cr_assert_eq(a.outcome, CLIENT_DENY);
	/* REFRESH_ROUTE claimed on a 401 is still a DENY */
	cr_assert_eq(parse_json("401 Unauthorized", "{\"outcome\":\"REFRESH_ROUTE\",\"reason\":\"expired\"}", &a), 0);
	cr_assert_eq(a.outcome, CLIENT_DENY);
	client_answer_clear(&a);
}

Test(answer, deny_on_401_and_403) /* C5 */
{
	struct client_answer a = {0};
	cr_assert_eq(parse_json("401 Unauthorized", "{\"outcome\":\"DENY\",\"reason\":\"bad-signature\"}", &a), 0);
	cr_assert_eq(a.outcome, CLIENT_DENY);
	cr_assert_str_eq(a.reason, "bad-signature");
	cr_assert_eq(parse_json("403 Forbidden", "{\"outcome\":\"DENY\",\"reason\":\"wrong-purpose\"}", &a), 0);
	cr_assert_eq(a.outcome, CLIENT_DENY);
	cr_assert_str_eq(a.reason, "wrong-purpose");
	client_answer_clear(&a);
}

Test(answer, operation_errors_are_allow)
{
	struct client_answer a = {0};
	cr_assert_eq(parse("HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}", &a), 0);
	cr_assert_eq(a.outcome, CLIENT_ALLOW);
	cr_assert_eq(a.status, 404);
	client_answer_clear(&a);
}

/* client_answer_length on text (NUL-terminated, as the reader keeps its buffer) */
static long alen(const char *text, int *keep)
{
	*keep = -1;
	return http_answer_length((const unsigned char *)text, strlen(text), keep);
}

Test(answer_length, framed_answers_end_where_their_framing_says) /* kept-alive connections */
{
	int keep;
	const char *cl = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
	cr_assert_eq(alen(cl, &keep), (long)strlen(cl));
	cr_assert_eq(keep, 1);
	const char *ch = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n1\r\n!\r\n0\r\n\r\n";
	cr_assert_eq(alen(ch, &keep), (long)strlen(ch));
	cr_assert_eq(keep, 1);
	const char *tr = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;x=y\r\na\r\n0\r\nX-T: 1\r\n\r\n";
	cr_assert_eq(alen(tr, &keep), (long)strlen(tr)); /* a chunk extension and a trailer */
	const char *nc = "HTTP/1.1 204 No Content\r\n\r\n";
	cr_assert_eq(alen(nc, &keep), (long)strlen(nc));
	/* the answer ends before bytes that follow it; they are not part of it */
	cr_assert_eq(alen("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhiEXTRA", &keep),
	             (long)strlen("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"));
}

Test(answer_length, incomplete_answers_need_more)
{
	int keep;
	cr_assert_eq(alen("HTTP/1.1 200 OK\r\nContent-Le", &keep), 0);
	cr_assert_eq(alen("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", &keep), 0);
	cr_assert_eq(alen("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", &keep), 0);
	cr_assert_eq(alen("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", &keep), 0);
	cr_assert_eq(alen("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n", &keep), 0);
}

Test(answer_length, unframed_or_closing_answers_are_not_kept)
{
	int keep;
	/* no length: the answer ends with the connection */
	cr_assert_eq(alen("HTTP/1.1 200 OK\r\n\r\nhello", &keep), 0);
	cr_assert_eq(keep, 0);
	const char *c = "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi";
	cr_assert_eq(alen(c, &keep), (long)strlen(c));
	cr_assert_eq(keep, 0);
}

Test(answer_length, malformed_framing_is_refused)
{
	int keep;
	cr_assert_eq(alen("HTTP/1.1 999 What\r\n\r\n", &keep), -1);
	cr_assert_eq(alen("SPDY 200 OK\r\n\r\n", &keep), -1);
	cr_assert_eq(alen("HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", &keep), -1);
	cr_assert_eq(alen("HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n", &keep), -1);
	cr_assert_eq(alen("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", &keep), -1);
	cr_assert_eq(alen("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhiXY0\r\n\r\n", &keep), -1);
	cr_assert_eq(alen("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffff\r\n", &keep), -1);
	/* a head that never ends */
	static char big[70000];
	memset(big, 'a', sizeof big - 1);
	memcpy(big, "HTTP/1.1 200 OK\r\nX: ", 20);
	cr_assert_eq(alen(big, &keep), -1);
}

Test(query, escape)
{
	char out[64];
	cr_assert_eq(client_query_escape("/work space/a&b=c+d%", out, sizeof out), 0);
	cr_assert_str_eq(out, "/work%20space/a%26b%3Dc%2Bd%25");
	cr_assert_eq(client_query_escape("0123456789", out, 10), -1);
	cr_assert_eq(client_query_escape("012345678", out, 10), 0);
}

Test(url, parse)
{
	char host[64], prefix[64];
	int port = 0, tls = -1;
	cr_assert_eq(http_parse_url("http://127.0.0.1:8080/base/", host, sizeof host, &port, prefix, sizeof prefix, &tls), 0);
	cr_assert_str_eq(host, "127.0.0.1");
	cr_assert_eq(port, 8080);
	cr_assert_str_eq(prefix, "/base");
	cr_assert_eq(tls, 0);
	cr_assert_eq(http_parse_url("http://w", host, sizeof host, &port, prefix, sizeof prefix, &tls), 0);
	cr_assert_eq(port, 80);
	/* https:// is TLS, port 443 unless given */
	cr_assert_eq(http_parse_url("https://w", host, sizeof host, &port, prefix, sizeof prefix, &tls), 0);
	cr_assert_eq(port, 443);
	cr_assert_eq(tls, 1);
	cr_assert_eq(http_parse_url("https://127.0.0.1:7443", host, sizeof host, &port, prefix, sizeof prefix, &tls), 0);
	cr_assert_eq(port, 7443);
	cr_assert_eq(tls, 1);
	cr_assert_eq(http_parse_url("https://[::1]:7443/p", host, sizeof host, &port, prefix, sizeof prefix, &tls), 0);
	cr_assert_str_eq(host, "[::1]");
	cr_assert_eq(port, 7443);
	cr_assert_str_eq(prefix, "/p");
	cr_assert_eq(http_parse_url("ws://w", host, sizeof host, &port, prefix, sizeof prefix, &tls), -1);
	cr_assert_eq(http_parse_url("httpx://w", host, sizeof host, &port, prefix, sizeof prefix, &tls), -1);
	cr_assert_eq(http_parse_url("https://[::1", host, sizeof host, &port, prefix, sizeof prefix, &tls), -1);
	cr_assert_eq(http_parse_url("http://w:0", host, sizeof host, &port, prefix, sizeof prefix, &tls), -1);
	cr_assert_eq(http_parse_url("http://w:99999", host, sizeof host, &port, prefix, sizeof prefix, &tls), -1);
	cr_assert_eq(http_parse_url("http://:80", host, sizeof host, &port, prefix, sizeof prefix, &tls), -1);
}

/* ---- the answer must name the route's execution (I2, I3) ---- */

#define ROUTE_ID "sandbox=s;generation=2;worker=w;substrate=process;activation=a;pod_uid="

Test(identity, allow_must_name_the_route)
{
	struct client_answer a = {0};
	cr_assert_eq(parse("HTTP/1.1 200 OK\r\nX-Spaced-Identity: " ROUTE_ID "\r\nContent-Length: 2\r\n\r\nok", &a), 0);
	cr_assert_eq(client_identity_check(ROUTE_ID, &a), 0);
	cr_assert_eq(a.outcome, CLIENT_ALLOW);
	cr_assert_str_eq((char *)a.body, "ok");

	/* none: refused, the body dropped */
	cr_assert_eq(parse("HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecret", &a), 0);
	cr_assert_eq(client_identity_check(ROUTE_ID, &a), -1);
	cr_assert_eq(a.outcome, CLIENT_UNVERIFIED);
	cr_assert_null(a.body);
	cr_assert_not_null(strstr(a.reason, "without X-Spaced-Identity"));

	/* another execution (an older generation): refused */
	cr_assert_eq(parse("HTTP/1.1 200 OK\r\nX-Spaced-Identity: sandbox=s;generation=1;worker=w;substrate=process;"
	                   "activation=a;pod_uid=\r\nContent-Length: 6\r\n\r\nsecret", &a), 0);
	cr_assert_eq(client_identity_check(ROUTE_ID, &a), -1);
	cr_assert_eq(a.outcome, CLIENT_UNVERIFIED);
	cr_assert_null(a.body);

	/* given twice (even when one of them is right): not taken, refused */
	cr_assert_eq(parse("HTTP/1.1 200 OK\r\nX-Spaced-Identity: other\r\nX-Spaced-Identity: " ROUTE_ID
	                   "\r\nContent-Length: 6\r\n\r\nsecret", &a), 0);
	cr_assert_str_eq(a.identity, "");
	cr_assert_eq(client_identity_check(ROUTE_ID, &a), -1);

	/* an operation error of the execution names it too; one without is refused */
	cr_assert_eq(parse_json("404 Not Found", "{\"code\":\"SPACED_ENOENT\",\"error\":\"x\"}", &a), 0);
	cr_assert_eq(client_identity_check(ROUTE_ID, &a), -1);

	/* refusals carry no identity and stay what they are */
	cr_assert_eq(parse_json("409 Conflict", "{\"outcome\":\"REFRESH_ROUTE\",\"reason\":\"deactivated\"}", &a), 0);
	cr_assert_eq(client_identity_check(ROUTE_ID, &a), 0);
	cr_assert_eq(a.outcome, CLIENT_REFRESH_ROUTE);
	client_answer_clear(&a);
}

Test(head, fields_status_length)
{
	const char *h = "HTTP/1.1 101 Switching Protocols\r\nUpgrade:  websocket \r\nA: 1\r\nA: 2\r\nB: x\001y\r\n\r\nrest";
	const unsigned char *u = (const unsigned char *)h;
	char v[64];
	long hl = http_head_length(u, strlen(h));
	cr_assert_eq(hl, (long)(strstr(h, "rest") - h));
	cr_assert_eq(http_head_length(u, 10), 0);
	cr_assert_eq(http_head_status(u, (size_t)hl), 101);
	cr_assert_eq(http_head_field(u, (size_t)hl, "upgrade", v, sizeof v), 9);
	cr_assert_str_eq(v, "websocket");
	cr_assert_eq(http_head_field(u, (size_t)hl, "A", v, sizeof v), -2, "repeated");
	cr_assert_eq(http_head_field(u, (size_t)hl, "B", v, sizeof v), -2, "a control byte");
	cr_assert_eq(http_head_field(u, (size_t)hl, "C", v, sizeof v), -1);
	cr_assert_eq(http_head_field(u, (size_t)hl, "Upgrade", v, 4), -2, "too long for out");
	cr_assert_eq(http_head_status((const unsigned char *)"HTTP/2 200 OK\r\n\r\n", 17), -1);
	cr_assert_eq(http_head_status((const unsigned char *)"HTTP/1.1 20x OK\r\n\r\n", 19), -1);
}

/* ---- the WebSocket client's reading of a server (ws_client.h) ---- */

/* An unmasked server frame. */
static size_t srv_frame(uint8_t *out, bool fin, uint8_t op, const void *p, size_t n)
{
	size_t h = spaced_ws_frame_header(out, fin, op, n);
	memcpy(out + h, p, n);
	return h + n;
}

Test(ws_client, messages_fragments_pings_close)
{
	struct ws_client *w;
	cr_assert_eq(ws_client_adopt(-1, &w), 0);
	uint8_t buf[4096];
	size_t n = 0;
	n += srv_frame(buf + n, true, SPACED_WS_TEXT, "{\"outcome\":\"ALLOW\"}", 19);
	n += srv_frame(buf + n, false, SPACED_WS_BINARY, "oab", 3);
	n += srv_frame(buf + n, true, SPACED_WS_PING, "p", 1);
	n += srv_frame(buf + n, true, SPACED_WS_CONT, "c\0\377", 3);
	n += srv_frame(buf + n, true, SPACED_WS_CLOSE, "\x03\xe8" "end", 5);
	/* given one byte at a time: every message comes out whole */
	struct ws_client_msg m;
	int got = 0;
	for (size_t i = 0; i < n; i++) {
		cr_assert_eq(ws_client_feed(w, buf + i, 1), 0);
		int k;
		while ((k = ws_client_next(w, &m)) == 1) {
			got++;
			if (got == 1) {
				cr_assert_eq(m.opcode, SPACED_WS_TEXT);
				cr_assert_eq(m.len, 19);
			} else if (got == 2) {
				cr_assert_eq(m.opcode, SPACED_WS_BINARY);
				cr_assert_eq(m.len, 6);
				cr_assert(memcmp(m.data, "oabc\0\377", 6) == 0);
			} else {
				cr_assert_eq(m.opcode, SPACED_WS_CLOSE);
				cr_assert_eq(m.close_code, 1000);
				cr_assert_str_eq(m.close_reason, "end");
			}
		}
		cr_assert_eq(k, 0);
	}
	cr_assert_eq(got, 3);
	/* the ping got its pong (6 + 1 bytes: masked header, payload), the close its answer */
	cr_assert_geq(ws_client_queued(w), 7 + 6 + 2);
	cr_assert_eq(ws_client_send(w, SPACED_WS_BINARY, "i", 1, "x", 1), SPACED_ECLOSED);
	ws_client_free(w);
}

Test(ws_client, bad_server_frames_are_refused)
{
	static const struct {
		const char *what;
		uint8_t bytes[16];
		size_t n;
	} bad[] = {
		{"masked by a server", {0x82, 0x81, 1, 2, 3, 4, 'x'}, 7},
		{"a reserved bit", {0xC2, 0x01, 'x'}, 3},
		{"an unknown opcode", {0x83, 0x00}, 2},
		{"a fragmented ping", {0x09, 0x00}, 2},
		{"a continuation with no message", {0x80, 0x01, 'x'}, 3},
		{"text not UTF-8", {0x81, 0x01, 0xff}, 3},
		{"a length not in its shortest form", {0x82, 0x7e, 0x00, 0x05, 1, 2, 3, 4, 5}, 9},
		{"a close of one byte", {0x88, 0x01, 0x03}, 3},
		{"a close code that may not be sent", {0x88, 0x02, 0x03, 0xed}, 4},
		{"over the message limit", {0x82, 0x7f, 0, 0, 0, 0, 0x00, 0x20, 0x00, 0x01}, 10},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct ws_client *w;
		struct ws_client_msg m;
		cr_assert_eq(ws_client_adopt(-1, &w), 0);
		cr_assert_eq(ws_client_feed(w, bad[i].bytes, bad[i].n), 0);
		cr_assert_eq(ws_client_next(w, &m), SPACED_EPROTO, "%s", bad[i].what);
		cr_assert_gt(ws_client_queued(w), 0, "%s: a close frame is queued", bad[i].what);
		ws_client_free(w);
	}
}

Test(ws_client, sent_frames_are_masked_and_well_formed)
{
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	struct ws_client *w;
	cr_assert_eq(ws_client_adopt(sv[0], &w), 0);
	static uint8_t big[70000], got[80000];
	for (size_t i = 0; i < sizeof big; i++)
		big[i] = (uint8_t)(i * 7);
	cr_assert_eq(ws_client_send(w, SPACED_WS_BINARY, "i", 1, big, sizeof big), 0);
	cr_assert_eq(ws_client_send(w, SPACED_WS_BINARY, "i", 1, big, WS_CLIENT_MSG_MAX), SPACED_ETOOBIG);
	cr_assert_eq(ws_client_queued(w), 14 + 1 + sizeof big);
	size_t n = 0;
	while (ws_client_queued(w) > 0) {
		cr_assert_geq(ws_client_flush(w), 0);
		ssize_t k = read(sv[1], got + n, sizeof got - n);
		cr_assert_gt(k, 0);
		n += (size_t)k;
	}
	/* as a server reads it: masked (a client's frame), the length in 64 bits */
	struct spaced_ws_frame f;
	cr_assert_eq(spaced_ws_frame_parse(got, n, true, 1 << 20, &f), 14);
	cr_assert(f.masked && f.fin && f.opcode == SPACED_WS_BINARY && f.len == 1 + sizeof big);
	spaced_ws_mask(got + f.hdr_len, (size_t)f.len, f.mask, 0);
	cr_assert_eq(got[f.hdr_len], 'i');
	cr_assert(memcmp(got + f.hdr_len + 1, big, sizeof big) == 0);
	close(sv[1]);
	ws_client_free(w);
}
