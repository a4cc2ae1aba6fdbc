/*
 * rbuf.h — a bounded byte ring for one direction of a relayed stream.
 *
 * The storage (cap bytes) is allocated on first use, so a connection that never
 * needs to buffer holds none, and kept until vmm_rbuf_clear() (freeing it each
 * time the ring drains would cost an mmap/munmap pair per packet for rings
 * above malloc's mmap threshold); the ring never holds more than cap bytes.
 */
#ifndef SPACED_VMM_RBUF_H
#define SPACED_VMM_RBUF_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct vmm_rbuf {
	uint8_t *data; /* NULL while empty */
	size_t cap;    /* fixed capacity */
	size_t head;   /* offset of the first byte */
	size_t len;    /* bytes held */
};

/* Starts an empty ring of capacity cap (> 0). Allocates nothing. */
void vmm_rbuf_init(struct vmm_rbuf *r, size_t cap);

/* Bytes that can still be added. */
size_t vmm_rbuf_room(const struct vmm_rbuf *r);

/* Fills iov[0..1] with the free space (in order) and returns how many entries
 * were used (0 when full). Allocates the storage if needed; returns
 * SPACED_ENOMEM when that fails. Bytes written there count only after
 * vmm_rbuf_commit(). */
int vmm_rbuf_free_iov(struct vmm_rbuf *r, struct iovec iov[2]);

/* Counts n bytes written into the space vmm_rbuf_free_iov() gave (n <= room). */
void vmm_rbuf_commit(struct vmm_rbuf *r, size_t n);

/* Appends n bytes from p. Returns 0, SPACED_ETOOBIG when they do not fit (the
 * ring is unchanged) or SPACED_ENOMEM. */
int vmm_rbuf_put(struct vmm_rbuf *r, const void *p, size_t n);

/* Fills iov[0..1] with the held bytes (in order) and returns how many entries
 * were used (0 when empty). */
int vmm_rbuf_data_iov(const struct vmm_rbuf *r, struct iovec iov[2]);

/* Copies up to n held bytes into out without consuming them; returns how many. */
size_t vmm_rbuf_peek(const struct vmm_rbuf *r, void *out, size_t n);

/* Drops the first n held bytes (n <= len). */
void vmm_rbuf_consume(struct vmm_rbuf *r, size_t n);

/* Drops everything and frees the storage. */
void vmm_rbuf_clear(struct vmm_rbuf *r);

#endif
