/*
 * ws.h — WebSocket frames (RFC 6455) without I/O: the strict reading of a
 * peer's frame header, (un)masking, the server's frame headers, the opening
 * handshake's accept key, and UTF-8 validation.
 *
 * A frame is refused (the close code to send is returned: 1002 protocol
 * error, 1009 too big) when: a reserved bit is set (no extension is ever
 * negotiated), the opcode is unknown, a control frame is fragmented or longer
 * than 125 bytes, the length is not in its shortest form or has its top bit
 * set, the frame's masking is not what the peer's role demands (a client
 * always masks, a server never), or the payload is over the caller's limit.
 */
#ifndef SPACED_WS_H
#define SPACED_WS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum spaced_ws_opcode {
	SPACED_WS_CONT = 0x0,
	SPACED_WS_TEXT = 0x1,
	SPACED_WS_BINARY = 0x2,
	SPACED_WS_CLOSE = 0x8,
	SPACED_WS_PING = 0x9,
	SPACED_WS_PONG = 0xA,
};

#define SPACED_WS_HDR_MAX 14

struct spaced_ws_frame {
	bool fin;
	uint8_t opcode;
	bool masked;
	uint8_t mask[4];
	uint64_t len;     /* payload length */
	size_t hdr_len;   /* bytes of the header */
};

/* Reads the frame header at the start of in[0..n). from_client: the frame
 * comes from a client (it must be masked) or from a server (it must not be).
 * Returns the header's length (> 0) with *f filled, 0 when more bytes are
 * needed, or -1002 / -1009 (the close code) when the frame is refused. */
int spaced_ws_frame_parse(const uint8_t *in, size_t n, bool from_client, uint64_t max_len,
                          struct spaced_ws_frame *f);

/* XORs p[0..n) with the mask, for payload bytes starting at offset within the frame. */
void spaced_ws_mask(uint8_t *p, size_t n, const uint8_t mask[4], uint64_t offset);

/* Writes the header of an unmasked frame into out; returns its length. */
size_t spaced_ws_frame_header(uint8_t out[SPACED_WS_HDR_MAX], bool fin, uint8_t opcode, uint64_t len);

/* The Sec-WebSocket-Accept value for a client's key (28 characters and a NUL). */
int spaced_ws_accept(const char *key, char out[29]);

/* True when p[0..n) is well-formed UTF-8 (no overlong forms, no surrogates,
 * nothing above U+10FFFF). */
bool spaced_utf8_valid(const uint8_t *p, size_t n);

/* True for a close code a peer may send (1000-1003, 1007-1011, 3000-4999). */
bool spaced_ws_close_code_ok(unsigned code);

#endif
