/*
 * fuzz_vsock_hs.c — libFuzzer target for the guest-transport CONNECT handshake
 * parser: framing, parsing, and the formatter round trip of whatever parses.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vsock_hs.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char again[SPACED_VSOCK_HS_MAX + 1];
	uint32_t port = 0, port2 = 0;
	int len, n;

	len = spaced_vsock_hs_line_len(data, size);
	if (len > 0) {
		if ((size_t)len > size || len > SPACED_VSOCK_HS_MAX || data[len - 1] != '\n')
			abort();
		if (spaced_vsock_hs_parse_connect(data, (size_t)len, &port) == 0) {
			/* what parses must be exactly the canonical form */
			n = spaced_vsock_hs_format_connect(again, sizeof(again), port);
			if (n != len || memcmp(again, data, (size_t)len) != 0)
				abort();
			if (spaced_vsock_hs_parse_connect((const uint8_t *)again, (size_t)n, &port2) != 0 ||
			    port2 != port)
				abort();
		}
	}
	(void)spaced_vsock_hs_parse_connect(data, size, &port);
	(void)spaced_vsock_hs_parse_ok(data, size, &port);
	return 0;
}
