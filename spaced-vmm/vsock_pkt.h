/*
 * vsock_pkt.h — the virtio-vsock packet header (virtio 1.2, 5.10.6).
 *
 * struct virtio_vsock_hdr is 44 little-endian bytes: le64 src_cid, le64
 * dst_cid, le32 src_port, le32 dst_port, le32 len, le16 type, le16 op,
 * le32 flags, le32 buf_alloc, le32 fwd_cnt; `len` payload bytes follow.
 */
#ifndef SPACED_VMM_VSOCK_PKT_H
#define SPACED_VMM_VSOCK_PKT_H

#include <stddef.h>
#include <stdint.h>

#define VSOCK_HDR_SIZE 44
#define VSOCK_HOST_CID 2
/* Largest payload accepted in one packet (Linux's VIRTIO_VSOCK_MAX_PKT_BUF_SIZE). */
#define VSOCK_MAX_PAYLOAD (64 * 1024)

enum vsock_type { VSOCK_TYPE_STREAM = 1, VSOCK_TYPE_SEQPACKET = 2 };

enum vsock_op {
	VSOCK_OP_INVALID = 0,
	VSOCK_OP_REQUEST = 1,
	VSOCK_OP_RESPONSE = 2,
	VSOCK_OP_RST = 3,
	VSOCK_OP_SHUTDOWN = 4,
	VSOCK_OP_RW = 5,
	VSOCK_OP_CREDIT_UPDATE = 6,
	VSOCK_OP_CREDIT_REQUEST = 7,
};

/* SHUTDOWN flags: the sender will receive no more / send no more. */
#define VSOCK_SHUTDOWN_RCV 1u
#define VSOCK_SHUTDOWN_SEND 2u

struct vsock_hdr {
	uint64_t src_cid, dst_cid;
	uint32_t src_port, dst_port;
	uint32_t len;
	uint16_t type, op;
	uint32_t flags, buf_alloc, fwd_cnt;
};

/* Decodes the 44 bytes at p into *h (no check of the values). */
void vsock_hdr_decode(const uint8_t p[VSOCK_HDR_SIZE], struct vsock_hdr *h);

/* Encodes *h into the 44 bytes at p. */
void vsock_hdr_encode(const struct vsock_hdr *h, uint8_t p[VSOCK_HDR_SIZE]);

/* Name of an op for logs ("RW"), "?" for unknown values. */
const char *vsock_op_name(uint16_t op);

#endif
