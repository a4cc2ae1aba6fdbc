/*
 * vsock_hs.c — strict parser of the Firecracker host-side vsock handshake.
 */
#include "vsock_hs.h"

#include <stdio.h>
#include <string.h>

#include "spaced_error.h"

int spaced_vsock_hs_line_len(const uint8_t *buf, size_t n)
{
	size_t lim = n < SPACED_VSOCK_HS_MAX ? n : SPACED_VSOCK_HS_MAX;

	for (size_t i = 0; i < lim; i++) {
		if (buf[i] == '\n')
			return (int)(i + 1);
		if (buf[i] == '\0')
			return SPACED_EPROTO;
	}
	return n >= SPACED_VSOCK_HS_MAX ? SPACED_ETOOBIG : 0;
}

/* "<word> <u32>\n" with nothing else: a decimal u32, no sign, no leading zero
 * (except "0" itself), no blanks, "\n" exactly once and last. */
static int parse_word_u32(const uint8_t *line, size_t n, const char *word, uint32_t *out)
{
	size_t wl = strlen(word);
	uint64_t v = 0;
	size_t i;

	if (n > SPACED_VSOCK_HS_MAX)
		return SPACED_ETOOBIG;
	/* word, one space, at least one digit, "\n" */
	if (n < wl + 3 || memcmp(line, word, wl) != 0 || line[wl] != ' ' || line[n - 1] != '\n')
		return SPACED_EPROTO;
	i = wl + 1;
	if (line[i] == '0' && i + 1 != n - 1)
		return SPACED_EPROTO;
	for (; i < n - 1; i++) {
		if (line[i] < '0' || line[i] > '9')
			return SPACED_EPROTO;
		v = v * 10 + (uint64_t)(line[i] - '0');
		if (v > UINT32_MAX)
			return SPACED_EPROTO;
	}
	*out = (uint32_t)v;
	return 0;
}

int spaced_vsock_hs_parse_connect(const uint8_t *line, size_t n, uint32_t *port)
{
	return parse_word_u32(line, n, "CONNECT", port);
}

int spaced_vsock_hs_parse_ok(const uint8_t *line, size_t n, uint32_t *val)
{
	return parse_word_u32(line, n, "OK", val);
}

static int format_word_u32(char *out, size_t outsz, const char *word, uint32_t v)
{
	char tmp[SPACED_VSOCK_HS_MAX + 1];
	int len = snprintf(tmp, sizeof(tmp), "%s %u\n", word, (unsigned)v);

	if (len < 0 || (size_t)len > outsz)
		return SPACED_ETOOBIG;
	memcpy(out, tmp, (size_t)len);
	if ((size_t)len < outsz)
		out[len] = '\0';
	return len;
}

int spaced_vsock_hs_format_connect(char *out, size_t outsz, uint32_t port)
{
	return format_word_u32(out, outsz, "CONNECT", port);
}

int spaced_vsock_hs_format_ok(char *out, size_t outsz, uint32_t val)
{
	return format_word_u32(out, outsz, "OK", val);
}
