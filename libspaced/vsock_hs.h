/*
 * vsock_hs.h — the host-side vsock handshake of Firecracker, as spoken on a
 * guest-transport Unix socket (see docs/substrate.md).
 *
 * A client connects to the VMM's Unix socket and writes one line
 * "CONNECT <port>\n"; the VMM answers "OK <n>\n" and from then on the bytes of
 * the stream belong to the guest's port. The parser is strict: the line is at
 * most SPACED_VSOCK_HS_MAX bytes including its "\n", the port is a decimal u32
 * without sign, leading zeros or blanks, exactly one space separates the two
 * words, and anything else is refused (the caller closes the connection).
 */
#ifndef SPACED_VSOCK_HS_H
#define SPACED_VSOCK_HS_H

#include <stddef.h>
#include <stdint.h>

/* Longest accepted request or answer line, "\n" included. */
#define SPACED_VSOCK_HS_MAX 32

/* Looks at the first n bytes received so far (n may be 0) and says how long the
 * request line is. Returns the line length (index of the first "\n" plus one)
 * when a "\n" is present within the first SPACED_VSOCK_HS_MAX bytes; 0 when more
 * bytes are needed (no "\n" yet and n < SPACED_VSOCK_HS_MAX); SPACED_ETOOBIG when
 * SPACED_VSOCK_HS_MAX bytes arrived without a "\n"; SPACED_EPROTO when a NUL byte
 * appears before the "\n". Bytes after the "\n" are not looked at: they belong
 * to the stream. */
int spaced_vsock_hs_line_len(const uint8_t *buf, size_t n);

/* Parses one complete request line of exactly n bytes ("CONNECT <port>\n", the
 * "\n" last and only there). On success writes *port and returns 0; otherwise
 * returns SPACED_EPROTO (or SPACED_ETOOBIG when n > SPACED_VSOCK_HS_MAX) and
 * leaves *port untouched. */
int spaced_vsock_hs_parse_connect(const uint8_t *line, size_t n, uint32_t *port);

/* Parses one complete answer line "OK <n>\n" with the same strictness. */
int spaced_vsock_hs_parse_ok(const uint8_t *line, size_t n, uint32_t *val);

/* Writes "CONNECT <port>\n" or "OK <n>\n" (no NUL counted) into out, which has
 * room for outsz bytes (a NUL is added when it fits). Returns the line length
 * or SPACED_ETOOBIG. */
int spaced_vsock_hs_format_connect(char *out, size_t outsz, uint32_t port);
int spaced_vsock_hs_format_ok(char *out, size_t outsz, uint32_t val);

#endif
