/*
 * vsock_pkt.c — virtio-vsock header codec (see vsock_pkt.h).
 */
#include "vsock_pkt.h"

#include <endian.h>
#include <string.h>

#define GET(bits, field, off)                                  \
	do {                                                   \
		uint##bits##_t v_;                             \
		memcpy(&v_, p + (off), sizeof(v_));            \
		h->field = le##bits##toh(v_);                  \
	} while (0)
#define PUT(bits, field, off)                                  \
	do {                                                   \
		uint##bits##_t v_ = htole##bits(h->field);     \
		memcpy(p + (off), &v_, sizeof(v_));            \
	} while (0)

void vsock_hdr_decode(const uint8_t p[VSOCK_HDR_SIZE], struct vsock_hdr *h)
{
	GET(64, src_cid, 0);
	GET(64, dst_cid, 8);
	GET(32, src_port, 16);
	GET(32, dst_port, 20);
	GET(32, len, 24);
	GET(16, type, 28);
	GET(16, op, 30);
	GET(32, flags, 32);
	GET(32, buf_alloc, 36);
	GET(32, fwd_cnt, 40);
}

void vsock_hdr_encode(const struct vsock_hdr *h, uint8_t p[VSOCK_HDR_SIZE])
{
	PUT(64, src_cid, 0);
	PUT(64, dst_cid, 8);
	PUT(32, src_port, 16);
	PUT(32, dst_port, 20);
	PUT(32, len, 24);
	PUT(16, type, 28);
	PUT(16, op, 30);
	PUT(32, flags, 32);
	PUT(32, buf_alloc, 36);
	PUT(32, fwd_cnt, 40);
}

const char *vsock_op_name(uint16_t op)
{
	static const char *const names[] = { "INVALID", "REQUEST", "RESPONSE", "RST",
					     "SHUTDOWN", "RW", "CREDIT_UPDATE", "CREDIT_REQUEST" };

	return op < sizeof(names) / sizeof(names[0]) ? names[op] : "?";
}
