/*
 * frame.h — length-prefixed frames over stream sockets, and the small typed
 * field encoding carried inside request bodies.
 *
 * A frame is a fixed 12-byte header followed by `len` payload bytes. All
 * integers are little-endian:
 *
 *   offset 0  u32 len    payload length, at most the receiver's maximum
 *   offset 4  u16 type   message type (each receiver has a dispatch table;
 *                        unknown types are a protocol error)
 *   offset 6  u16 flags  SPACED_FRAME_F_* bits; unknown bits are an error
 *   offset 8  u32 id     request / stream id chosen by the requester
 *
 * The length is checked against the maximum before anything is allocated or
 * copied. Payloads of requests are a sequence of typed fields:
 *
 *   'u' u64        unsigned integer (8 bytes LE)
 *   'i' i64        signed integer (8 bytes LE, two's complement)
 *   's' u32 n, n   text without NUL bytes, n <= SPACED_FIELD_STR_MAX
 *   'b' u32 n, n   raw bytes
 *
 * Every field carries its kind tag, so a reader asking for a text where an
 * integer was sent fails; a reader must consume the whole payload
 * (spaced_field_end), trailing bytes are an error.
 */
#ifndef SPACED_FRAME_H
#define SPACED_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define SPACED_FRAME_HDR_LEN 12
/* Hard upper bound of one payload (1 MiB); receivers may use a lower one. */
#define SPACED_FRAME_MAX (UINT32_C(1) << 20)
/* The size of data chunks senders should use for streamed content. */
#define SPACED_FRAME_CHUNK (64 * 1024)

/* Flag bits. END marks the final frame of a request or of a stream's input. */
#define SPACED_FRAME_F_END 0x0001u
#define SPACED_FRAME_F_KNOWN 0x0001u

/* Field kinds and limits. */
#define SPACED_FIELD_U64 'u'
#define SPACED_FIELD_I64 'i'
#define SPACED_FIELD_STR 's'
#define SPACED_FIELD_BYTES 'b'
#define SPACED_FIELD_STR_MAX 65536

struct spaced_frame_hdr {
	uint32_t len;
	uint16_t type;
	uint16_t flags;
	uint32_t id;
};

/* Writes the 12-byte wire form of h into out. */
void spaced_frame_hdr_encode(uint8_t out[SPACED_FRAME_HDR_LEN], const struct spaced_frame_hdr *h);

/* Parses a 12-byte header. Returns 0, SPACED_ETOOBIG when len > max (or >
 * SPACED_FRAME_MAX), or SPACED_EPROTO for unknown flag bits. *out is written
 * only on success. */
int spaced_frame_hdr_decode(struct spaced_frame_hdr *out, const uint8_t in[SPACED_FRAME_HDR_LEN],
                            uint32_t max);

/* Appends a whole frame (header + payload) to out. Returns 0, SPACED_ETOOBIG
 * for payloads over SPACED_FRAME_MAX, or the buffer's errors. */
int spaced_frame_append(struct spaced_buf *out, uint16_t type, uint16_t flags, uint32_t id,
                        const void *payload, size_t len);

/* As spaced_frame_append, the payload given in two parts, head then tail
 * (a few fields, then bulk data): neither is first copied into one buffer. */
int spaced_frame_append2(struct spaced_buf *out, uint16_t type, uint16_t flags, uint32_t id, const void *head,
                         size_t hlen, const void *tail, size_t tlen);

/* Parses one frame at the start of in[0..n). Returns 0 with *consumed = 0 when
 * more bytes are needed; 0 with *consumed = header+payload length, *hdr and
 * *payload (pointing into in) when a frame is complete; or the header errors
 * above. Nothing is copied. */
int spaced_frame_parse(const uint8_t *in, size_t n, uint32_t max, struct spaced_frame_hdr *hdr,
                       const uint8_t **payload, size_t *consumed);

/* Blocking I/O on a stream socket or pipe: reads / writes exactly n bytes,
 * retrying on EINTR and short transfers. read returns SPACED_ECLOSED when the
 * peer closed before the first byte, SPACED_EPROTO when it closed in the
 * middle, SPACED_EIO on errors. write returns SPACED_EIO (EPIPE included). */
int spaced_io_read_full(int fd, void *p, size_t n);
int spaced_io_write_full(int fd, const void *p, size_t n);
/* Writes all of p[0..n) at file offset off (pwrite, EINTR retried). 0, or
 * SPACED_EIO with errno saying why (EIO for a write of nothing). */
int spaced_io_pwrite_full(int fd, const void *p, size_t n, uint64_t off);

/* Sends one frame with a single writev where possible (blocking). */
int spaced_frame_send(int fd, uint16_t type, uint16_t flags, uint32_t id, const void *payload,
                      size_t len);

/* Receives one frame (blocking): reads the header, checks len against max
 * BEFORE allocating, then reads the payload into a new buffer (*payload, to be
 * free()d; NULL when len is 0). Returns 0, SPACED_ECLOSED on a clean end of
 * stream between frames, SPACED_EPROTO on a truncated frame or bad flags,
 * SPACED_ETOOBIG, SPACED_ENOMEM or SPACED_EIO. */
int spaced_frame_recv(int fd, uint32_t max, struct spaced_frame_hdr *hdr, uint8_t **payload);

/* A row of a receiver's dispatch table. */
struct spaced_frame_handler {
	uint16_t type;
	int (*fn)(void *ctx, const struct spaced_frame_hdr *hdr, const uint8_t *payload,
	          size_t len);
};

/* Calls the handler registered for hdr->type in table[0..n). Returns the
 * handler's result, or SPACED_EPROTO when no row matches (unknown type). */
int spaced_frame_dispatch(const struct spaced_frame_handler *table, size_t n, void *ctx,
                          const struct spaced_frame_hdr *hdr, const uint8_t *payload, size_t len);

/* ---- typed fields ---- */

/* Append one field to b; same errors as spaced_buf_append. put_str rejects
 * texts containing NUL (impossible from a C string) or longer than
 * SPACED_FIELD_STR_MAX with SPACED_ETOOBIG; put_strn takes an explicit length
 * and returns SPACED_EINVAL for embedded NULs. */
int spaced_field_put_u64(struct spaced_buf *b, uint64_t v);
int spaced_field_put_i64(struct spaced_buf *b, int64_t v);
int spaced_field_put_str(struct spaced_buf *b, const char *s);
int spaced_field_put_strn(struct spaced_buf *b, const char *s, size_t n);
int spaced_field_put_bytes(struct spaced_buf *b, const void *p, size_t n);
/* Only the head of a bytes field of n bytes (its kind and length): the n
 * bytes follow it elsewhere (spaced_frame_append2's tail). */
int spaced_field_put_bytes_head(struct spaced_buf *b, size_t n);

/* A cursor over a received payload. Errors are sticky: after the first
 * failure every later call fails with the same code. */
struct spaced_field_reader {
	const uint8_t *p;
	size_t len;
	size_t off;
	int err;
};

void spaced_field_reader_init(struct spaced_field_reader *r, const void *p, size_t len);

/* Each get reads the next field, which must be of the named kind. Returns 0 or
 * SPACED_EPROTO (wrong kind, truncated, oversized, NUL inside a text).
 * get_str gives a view into the payload (not NUL-terminated); get_strdup a
 * NUL-terminated copy of at most max bytes (SPACED_ETOOBIG otherwise) owned by
 * the caller; get_strbuf copies into out[outsz] (SPACED_ETOOBIG if it does not
 * fit with its NUL). Outputs are written only on success. */
int spaced_field_get_u64(struct spaced_field_reader *r, uint64_t *out);
int spaced_field_get_i64(struct spaced_field_reader *r, int64_t *out);
int spaced_field_get_str(struct spaced_field_reader *r, const char **s, size_t *n);
int spaced_field_get_strdup(struct spaced_field_reader *r, size_t max, char **out);
int spaced_field_get_strbuf(struct spaced_field_reader *r, char *out, size_t outsz);
int spaced_field_get_bytes(struct spaced_field_reader *r, const uint8_t **p, size_t *n);

/* True when unread fields remain. */
bool spaced_field_more(const struct spaced_field_reader *r);

/* Returns the sticky error, or SPACED_EPROTO when bytes remain unread, or 0. */
int spaced_field_end(const struct spaced_field_reader *r);

/* Walks a whole payload as fields without knowing its schema; returns the
 * number of fields or SPACED_EPROTO. (Used by tools and the fuzzer.) */
int spaced_field_validate(const void *p, size_t len);

#endif
