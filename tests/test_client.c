/*
 * test_client.c — spacectl's client pieces that need no cluster: how a worker's
 * answer is read and classified (V1: only a recognized REFRESH_ROUTE body on a
 * 409 is a refresh signal; 401/403 are DENY, C5), bodies cut short, query
 * escaping and worker URLs. The recovery itself runs against real workers in
 * tests/client_recovery.t.sh.
 */
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "client.h"

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
	int port = 0;
	cr_assert_eq(http_parse_url("http://127.0.0.1:8080/base/", host, sizeof host, &port, prefix, sizeof prefix), 0);
	cr_assert_str_eq(host, "127.0.0.1");
	cr_assert_eq(port, 8080);
	cr_assert_str_eq(prefix, "/base");
	cr_assert_eq(http_parse_url("http://w", host, sizeof host, &port, prefix, sizeof prefix), 0);
	cr_assert_eq(port, 80);
	cr_assert_eq(http_parse_url("https://w", host, sizeof host, &port, prefix, sizeof prefix), -1);
	cr_assert_eq(http_parse_url("http://w:0", host, sizeof host, &port, prefix, sizeof prefix), -1);
	cr_assert_eq(http_parse_url("http://w:99999", host, sizeof host, &port, prefix, sizeof prefix), -1);
	cr_assert_eq(http_parse_url("http://:80", host, sizeof host, &port, prefix, sizeof prefix), -1);
}
