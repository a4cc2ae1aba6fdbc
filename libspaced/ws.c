/* ws.c — WebSocket frames, handshake key and UTF-8 (ws.h). */
#include "ws.h"

#include <string.h>

#include <openssl/evp.h>

#include "spaced_error.h"
#include "util.h"

int spaced_ws_frame_parse(const uint8_t *in, size_t n, bool from_client, uint64_t max_len,
                          struct spaced_ws_frame *f)
{
	if (n < 2)
		return 0;
	uint8_t b0 = in[0], b1 = in[1];
	struct spaced_ws_frame t;
	memset(&t, 0, sizeof t);
	t.fin = (b0 & 0x80) != 0;
	t.opcode = b0 & 0x0f;
	t.masked = (b1 & 0x80) != 0;
	if (b0 & 0x70)
		return -1002; /* reserved bits: no extension is negotiated */
	switch (t.opcode) {
	case SPACED_WS_CONT:
	case SPACED_WS_TEXT:
	case SPACED_WS_BINARY:
		break;
	case SPACED_WS_CLOSE:
	case SPACED_WS_PING:
	case SPACED_WS_PONG:
		if (!t.fin || (b1 & 0x7f) > 125)
			return -1002;
		break;
	default:
		return -1002;
	}
	if (t.masked != from_client)
		return -1002;
	size_t h = 2;
	uint64_t len = b1 & 0x7f;
	if (len == 126) {
		if (n < 4)
			return 0;
		len = (uint64_t)in[2] << 8 | in[3];
		if (len < 126)
			return -1002; /* not the shortest form */
		h = 4;
	} else if (len == 127) {
		if (n < 10)
			return 0;
		len = 0;
		for (int i = 0; i < 8; i++)
			len = len << 8 | in[2 + i];
		if (len >> 63 || len <= 0xffff)
			return -1002;
		h = 10;
	}
	if (t.masked) {
		if (n < h + 4)
			return 0;
		memcpy(t.mask, in + h, 4);
		h += 4;
	}
	if (len > max_len)
		return -1009;
	t.len = len;
	t.hdr_len = h;
	*f = t;
	return (int)h;
}

void spaced_ws_mask(uint8_t *p, size_t n, const uint8_t mask[4], uint64_t offset)
{
	/* a byte at a time up to an 8-byte boundary, then a word at a time (the
	 * mask repeats every 4 bytes, so a word holds it twice), then the tail:
	 * every byte of a client's upload goes through here, on both ends */
	size_t i = 0;
	for (; i < n && ((uintptr_t)(p + i) & 7) != 0; i++)
		p[i] ^= mask[(offset + i) & 3];
	uint8_t m8[8];
	for (size_t k = 0; k < sizeof m8; k++)
		m8[k] = mask[(offset + i + k) & 3];
	uint64_t w;
	memcpy(&w, m8, sizeof w);
	for (; i + 8 <= n; i += 8) {
		uint64_t v;
		memcpy(&v, p + i, sizeof v);
		v ^= w;
		memcpy(p + i, &v, sizeof v);
	}
	for (; i < n; i++)
		p[i] ^= mask[(offset + i) & 3];
}

size_t spaced_ws_frame_header(uint8_t out[SPACED_WS_HDR_MAX], bool fin, uint8_t opcode, uint64_t len)
{
	out[0] = (uint8_t)((fin ? 0x80 : 0) | (opcode & 0x0f));
	if (len < 126) {
		out[1] = (uint8_t)len;
		return 2;
	}
	if (len <= 0xffff) {
		out[1] = 126;
		out[2] = (uint8_t)(len >> 8);
		out[3] = (uint8_t)len;
		return 4;
	}
	out[1] = 127;
	for (int i = 0; i < 8; i++)
		out[2 + i] = (uint8_t)(len >> (56 - 8 * i));
	return 10;
}

int spaced_ws_accept(const char *key, char out[29])
{
	static const char guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
	uint8_t in[64], md[20];
	unsigned int mdlen = 0;
	size_t kl = strlen(key);
	if (kl != 24)
		return SPACED_EINVAL;
	memcpy(in, key, kl);
	memcpy(in + kl, guid, sizeof guid - 1);
	if (EVP_Digest(in, kl + sizeof guid - 1, md, &mdlen, EVP_sha1(), NULL) != 1 || mdlen != 20)
		return SPACED_ESYS;
	/* standard base64 with padding (the handshake's, not base64url) */
	static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t o = 0;
	for (size_t i = 0; i < 20; i += 3) {
		uint32_t v = (uint32_t)md[i] << 16 | (i + 1 < 20 ? (uint32_t)md[i + 1] << 8 : 0) | (i + 2 < 20 ? md[i + 2] : 0);
		out[o++] = tab[(v >> 18) & 63];
		out[o++] = tab[(v >> 12) & 63];
		out[o++] = i + 1 < 20 ? tab[(v >> 6) & 63] : '=';
		out[o++] = i + 2 < 20 ? tab[v & 63] : '=';
	}
	out[o] = '\0';
	return 0;
}

bool spaced_utf8_valid(const uint8_t *p, size_t n)
{
	size_t i = 0;
	while (i < n) {
		uint8_t c = p[i];
		if (c < 0x80) {
			i++;
			continue;
		}
		size_t len;
		uint32_t cp, min;
		if ((c & 0xe0) == 0xc0) {
			len = 2, cp = c & 0x1f, min = 0x80;
		} else if ((c & 0xf0) == 0xe0) {
			len = 3, cp = c & 0x0f, min = 0x800;
		} else if ((c & 0xf8) == 0xf0) {
			len = 4, cp = c & 0x07, min = 0x10000;
		} else {
			return false;
		}
		if (n - i < len)
			return false;
		for (size_t k = 1; k < len; k++) {
			if ((p[i + k] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (p[i + k] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += len;
	}
	return true;
}

bool spaced_ws_close_code_ok(unsigned code)
{
	return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1011) || (code >= 3000 && code <= 4999);
}
