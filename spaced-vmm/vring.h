/*
 * vring.h — a split virtqueue (virtio 1.x, section 2.7) served from guest
 * memory shared by a vhost-user front-end.
 *
 * The guest owns the descriptor table and the available ring and may change
 * them at any time, so every descriptor is copied out once, checked (index,
 * length, translation, chain length, no loops, readable before writable) and
 * only the copy is used. A malformed chain is returned to the guest as used
 * with length 0; a ring whose indexes make no sense is marked broken and not
 * served again until it is set up anew. Nothing the guest writes can make this
 * code read or write outside the mapped regions.
 */
#ifndef SPACED_VMM_VRING_H
#define SPACED_VMM_VRING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "vmm_mem.h"

#define VRING_MAX_SIZE 32768u
/* Segments of one chain we accept (Linux's vsock uses 1 or 2). */
#define VRING_CHAIN_MAX 64

struct vring_chain {
	uint16_t head;            /* descriptor index to give back */
	unsigned nout, nin;       /* readable (driver to device) and writable segments */
	struct iovec out[VRING_CHAIN_MAX];
	struct iovec in[VRING_CHAIN_MAX];
	size_t out_len, in_len;   /* total bytes of each kind */
};

struct vring {
	/* set up by the front-end */
	uint32_t num;             /* queue size, 0 until SET_VRING_NUM */
	uint64_t desc_uva, avail_uva, used_uva;
	bool addr_set;
	uint16_t last_avail;      /* next available entry to take */
	uint16_t used_idx;        /* next used entry to write */
	int kick_fd, call_fd, err_fd;
	bool enabled;             /* SET_VRING_ENABLE */
	bool started;             /* a kick fd arrived and GET_VRING_BASE has not stopped it */
	bool broken;              /* bad indexes from the guest: served no more */
	/* translated from the addresses above when the ring starts */
	uint8_t *desc, *avail, *used;
	unsigned pushed;          /* used entries written since the last notify */
};

/* A ring with nothing set up (descriptors -1). */
void vring_init(struct vring *vq);

/* Closes the ring's descriptors and sets it back to vring_init's state. */
void vring_reset(struct vring *vq);

/* Translates the ring's three areas through mem and takes the used index the
 * ring holds as the next one to write. Returns 0, or SPACED_EINVAL (the ring
 * is then not ready) when the size is unset or not a power of two, the
 * addresses are unset or misaligned, or an area is not wholly inside one
 * region. */
int vring_map(struct vring *vq, const struct vmm_mem *mem);

/* Whether the device may take buffers from this ring now. */
bool vring_ready(const struct vring *vq);

/* Takes the next available chain into *c. Returns 1 when a chain was taken,
 * 0 when none is available, SPACED_EPROTO when the chain was malformed (it has
 * already been returned to the guest as used with length 0; the caller goes
 * on with the next) and SPACED_ESTALE when the ring is broken. */
int vring_pop(struct vring *vq, const struct vmm_mem *mem, struct vring_chain *c);

/* Gives the last chain taken back as unused, so the next vring_pop() takes it
 * again (only right after vring_pop() returned 1, before any vring_push()). */
void vring_unpop(struct vring *vq);

/* Returns chain head to the guest with len bytes written into it. */
void vring_push(struct vring *vq, uint16_t head, uint32_t len);

/* Signals the call eventfd when chains were pushed since the last call and the
 * guest has not asked for no interrupts. */
void vring_notify(struct vring *vq);

/* Copies len bytes from src into the writable segments of c starting at byte
 * off of the chain; returns how many fitted. */
size_t vring_chain_write(const struct vring_chain *c, size_t off, const void *src, size_t len);

/* Copies up to len bytes from the readable segments of c starting at byte off
 * into dst; returns how many were there. */
size_t vring_chain_read(const struct vring_chain *c, size_t off, void *dst, size_t len);

#endif
