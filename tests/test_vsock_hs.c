/*
 * test_vsock_hs.c — the strict CONNECT handshake parser of the guest transport
 * (B2: the transport must not be talked into serving a malformed request).
 */
#include <criterion/criterion.h>
#include <string.h>

#include "spaced_error.h"
#include "vsock_hs.h"

static int parse(const char *s, size_t n, uint32_t *port)
{
	return spaced_vsock_hs_parse_connect((const uint8_t *)s, n, port);
}

#define P(lit, portp) parse(lit, sizeof(lit) - 1, portp)

Test(vsock_hs, accepts_valid_ports)
{
	uint32_t port = 7;

	cr_assert_eq(P("CONNECT 0\n", &port), 0);
	cr_assert_eq(port, 0);
	cr_assert_eq(P("CONNECT 1\n", &port), 0);
	cr_assert_eq(port, 1);
	cr_assert_eq(P("CONNECT 52000\n", &port), 0);
	cr_assert_eq(port, 52000);
	cr_assert_eq(P("CONNECT 4294967295\n", &port), 0);
	cr_assert_eq(port, 4294967295u);
}

Test(vsock_hs, refuses_malformed_lines)
{
	static const struct {
		const char *s;
		size_t n;
	} bad[] = {
#define B(lit) { lit, sizeof(lit) - 1 }
		B("CONNECT 1"),             /* no newline */
		B("CONNECT -1\n"),          /* sign */
		B("CONNECT +1\n"),
		B("CONNECT 4294967296\n"),  /* u32 overflow */
		B("CONNECT 99999999999999999999\n"),
		B("connect 1\n"),           /* case */
		B("CONNECT  1\n"),          /* extra spaces */
		B(" CONNECT 1\n"),
		B("CONNECT 1 \n"),
		B("CONNECT\t1\n"),
		B("CONNECT 1\r\n"),         /* trailing byte before the newline */
		B("CONNECT 1x\n"),
		B("CONNECT 01\n"),          /* leading zero */
		B("CONNECT 00\n"),
		B("CONNECT \n"),            /* no port */
		B("CONNECT\n"),
		B("\n"),
		B(""),
		B("CONNECT 1\n\n"),         /* newline twice */
		B("CONNECT 1\nX"),          /* newline not last */
		B("CONNECT 0x10\n"),
		B("CONNEC 1\n"),
		B("OK 1\n"),
		B("CONNECT 1\0\n"),         /* NUL bytes */
		B("CONNECT \0001\n"),
		B("\0CONNECT 1\n"),
#undef B
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint32_t port = 12345;
		int r = parse(bad[i].s, bad[i].n, &port);

		cr_assert_lt(r, 0, "case %zu accepted", i);
		cr_assert_eq(port, 12345, "case %zu wrote the output", i);
	}
}

Test(vsock_hs, refuses_over_long_line)
{
	char line[64];
	uint32_t port;

	/* "CONNECT " + 23 zeros-free digits exceeds 32 bytes even before the newline */
	memset(line, '1', sizeof(line));
	memcpy(line, "CONNECT ", 8);
	line[40] = '\n';
	cr_assert_eq(parse(line, 41, &port), SPACED_ETOOBIG);
	cr_assert_eq(spaced_vsock_hs_line_len((const uint8_t *)line, 41), SPACED_ETOOBIG);
}

Test(vsock_hs, line_len_framing)
{
	const uint8_t *s = (const uint8_t *)"CONNECT 5\nPAYLOAD";

	cr_assert_eq(spaced_vsock_hs_line_len(s, 0), 0);
	cr_assert_eq(spaced_vsock_hs_line_len(s, 9), 0);     /* more needed */
	cr_assert_eq(spaced_vsock_hs_line_len(s, 10), 10);
	cr_assert_eq(spaced_vsock_hs_line_len(s, 17), 10);   /* payload stays for the stream */
	cr_assert_eq(spaced_vsock_hs_line_len((const uint8_t *)"CONN\0ECT 5\n", 11), SPACED_EPROTO);
	uint8_t full[SPACED_VSOCK_HS_MAX];
	memset(full, 'A', sizeof(full));
	cr_assert_eq(spaced_vsock_hs_line_len(full, sizeof(full) - 1), 0);
	cr_assert_eq(spaced_vsock_hs_line_len(full, sizeof(full)), SPACED_ETOOBIG);
	full[sizeof(full) - 1] = '\n';
	cr_assert_eq(spaced_vsock_hs_line_len(full, sizeof(full)), (int)sizeof(full));
}

Test(vsock_hs, ok_roundtrip)
{
	char buf[SPACED_VSOCK_HS_MAX];
	uint32_t v = 0;
	int n;

	n = spaced_vsock_hs_format_ok(buf, sizeof(buf), 1073741824u);
	cr_assert_eq(n, (int)strlen("OK 1073741824\n"));
	cr_assert_eq(spaced_vsock_hs_parse_ok((const uint8_t *)buf, (size_t)n, &v), 0);
	cr_assert_eq(v, 1073741824u);
	n = spaced_vsock_hs_format_connect(buf, sizeof(buf), 4294967295u);
	cr_assert_eq(spaced_vsock_hs_parse_connect((const uint8_t *)buf, (size_t)n, &v), 0);
	cr_assert_eq(v, 4294967295u);
	cr_assert_eq(spaced_vsock_hs_format_ok(buf, 4, 1), SPACED_ETOOBIG);
	cr_assert_lt(spaced_vsock_hs_parse_ok((const uint8_t *)"OK -1\n", 6, &v), 0);
}
