/*
 * vhost_user.h — the back-end side of the vhost-user protocol (QEMU's
 * docs/interop/vhost-user.rst) for one device with a fixed set of virtqueues.
 *
 * One front-end (QEMU) connection at a time. Messages are a 12-byte header
 * {u32 request, u32 flags, u32 size} and `size` payload bytes, with file
 * descriptors as SCM_RIGHTS on the first byte. Reading is non-blocking and
 * incremental (vu_read() is called whenever the socket is readable); each
 * complete message is checked against a table (request, payload size bounds,
 * descriptors allowed) and dispatched. A message that breaks the framing
 * (unknown request, wrong size, descriptors where none belong, too many)
 * makes vu_read() fail: the caller drops the front-end. A message that is
 * well framed but asks for something impossible (a ring index past the
 * device's queues, memory that cannot be mapped) is refused through
 * REPLY_ACK when the front-end asked for a reply, and logged.
 *
 * Offered: VIRTIO_F_VERSION_1 and VHOST_USER_F_PROTOCOL_FEATURES; protocol
 * features REPLY_ACK and CONFIG (the device's config space, for vsock its
 * guest CID, is read by the front-end with GET_CONFIG).
 */
#ifndef SPACED_VMM_VHOST_USER_H
#define SPACED_VMM_VHOST_USER_H

#include <stdbool.h>
#include <stdint.h>

#include "vmm_mem.h"
#include "vring.h"

#define VU_MAX_QUEUES 2
#define VU_MAX_CONFIG 256
#define VU_HDR_SIZE 12
/* Largest payload of any message handled (SET_MEM_TABLE with 8 regions is
 * 264 bytes, GET_CONFIG 12 + 256). */
#define VU_MAX_PAYLOAD 512
#define VU_MAX_FDS 8

struct vu_dev;

/* What the device behind the protocol is told. */
struct vu_device_ops {
	/* Called after every message that may have changed the memory table or
	 * a ring (set up, started, stopped, enabled, new eventfds). */
	void (*rings_changed)(void *opaque);
	/* Called before a ring is stopped by GET_VRING_BASE or a reset, while
	 * its memory is still mapped. */
	void (*ring_stopping)(void *opaque, unsigned idx);
	/* Called before the ring's kick eventfd is closed or replaced, while it
	 * is still open (so the device can stop watching that very file). */
	void (*kick_closing)(void *opaque, unsigned idx, int fd);
	/* Called when a well-framed request is refused (the library does not log). */
	void (*refused)(void *opaque, const char *request, const char *reason);
};

struct vu_dev {
	int fd;                      /* front-end connection, -1 when none */
	unsigned nqueues;
	uint64_t features_offered, features;
	uint64_t protocol_offered, protocol;
	bool owner;
	struct vmm_mem mem;
	struct vring vq[VU_MAX_QUEUES];
	uint8_t config[VU_MAX_CONFIG];
	uint32_t config_len;
	const struct vu_device_ops *ops;
	void *opaque;
	/* message being read */
	uint8_t buf[VU_HDR_SIZE + VU_MAX_PAYLOAD];
	size_t have;
	int fds[VU_MAX_FDS];
	unsigned nfds;
	char err[160];               /* why the last failure happened */
};

/* Prepares a device with nqueues (<= VU_MAX_QUEUES) virtqueues and the given
 * config space (config_len <= VU_MAX_CONFIG bytes, copied). No front-end. */
void vu_init(struct vu_dev *d, unsigned nqueues, const void *config, uint32_t config_len,
	     const struct vu_device_ops *ops, void *opaque);

/* Takes fd (a connected, non-blocking stream socket) as the front-end. */
void vu_attach(struct vu_dev *d, int fd);

/* Reads what is there and handles every complete message. Returns 0 while
 * the connection stays usable; SPACED_ECLOSED when the front-end hung up;
 * SPACED_EPROTO (framing broken; d->err says how) or SPACED_ESYS otherwise.
 * On any error the caller calls vu_detach(). */
int vu_read(struct vu_dev *d);

/* Stops every ring (ring_stopping is called for each started one), closes
 * every descriptor, unmaps the memory and closes the front-end connection. */
void vu_detach(struct vu_dev *d);

#endif
