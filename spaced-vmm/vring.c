/*
 * vring.c — split virtqueue over shared guest memory (see vring.h).
 *
 * Layout (virtio 1.x 2.7): descriptor table of num × 16 bytes {le64 addr,
 * le32 len, le16 flags, le16 next}; available ring {le16 flags, le16 idx,
 * le16 ring[num], le16 used_event}; used ring {le16 flags, le16 idx,
 * {le32 id, le32 len} ring[num], le16 avail_event}. Neither EVENT_IDX nor
 * INDIRECT_DESC is offered, so the guest uses neither.
 */
#include "vring.h"

#include <endian.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "spaced_error.h"

#define VRING_DESC_F_NEXT 1
#define VRING_DESC_F_WRITE 2
#define VRING_DESC_F_INDIRECT 4
#define VRING_AVAIL_F_NO_INTERRUPT 1

void vring_init(struct vring *vq)
{
	memset(vq, 0, sizeof(*vq));
	vq->kick_fd = -1;
	vq->call_fd = -1;
	vq->err_fd = -1;
}

void vring_reset(struct vring *vq)
{
	if (vq->kick_fd >= 0)
		close(vq->kick_fd);
	if (vq->call_fd >= 0)
		close(vq->call_fd);
	if (vq->err_fd >= 0)
		close(vq->err_fd);
	vring_init(vq);
}

static uint16_t load_le16(const uint8_t *p)
{
	uint16_t v = __atomic_load_n((const uint16_t *)(const void *)p, __ATOMIC_ACQUIRE);

	return le16toh(v);
}

static void store_le16(uint8_t *p, uint16_t v)
{
	__atomic_store_n((uint16_t *)(void *)p, htole16(v), __ATOMIC_RELEASE);
}

int vring_map(struct vring *vq, const struct vmm_mem *mem)
{
	uint64_t n = vq->num;

	vq->desc = vq->avail = vq->used = NULL; /* nothing stale survives a failure */
	if (n == 0 || n > VRING_MAX_SIZE || (n & (n - 1)) != 0 || !vq->addr_set)
		return SPACED_EINVAL;
	if ((vq->desc_uva & 15) || (vq->avail_uva & 1) || (vq->used_uva & 3))
		return SPACED_EINVAL;
	vq->desc = vmm_mem_uva(mem, vq->desc_uva, 16 * n);
	vq->avail = vmm_mem_uva(mem, vq->avail_uva, 6 + 2 * n);
	vq->used = vmm_mem_uva(mem, vq->used_uva, 6 + 8 * n);
	/* the host pointers must be aligned too: a region's file offset could
	 * shift them where the guest's addresses are aligned */
	if (!vq->desc || !vq->avail || !vq->used || ((uintptr_t)vq->desc & 15) ||
	    ((uintptr_t)vq->avail & 1) || ((uintptr_t)vq->used & 3)) {
		vq->desc = vq->avail = vq->used = NULL;
		return SPACED_EINVAL;
	}
	vq->used_idx = load_le16(vq->used + 2); /* where the previous user of the ring stopped */
	return 0;
}

bool vring_ready(const struct vring *vq)
{
	return vq->started && vq->enabled && !vq->broken && vq->desc != NULL;
}

struct desc {
	uint64_t addr;
	uint32_t len;
	uint16_t flags;
	uint16_t next;
};

static void read_desc(const struct vring *vq, uint16_t i, struct desc *d)
{
	uint8_t raw[16];

	memcpy(raw, vq->desc + 16u * i, sizeof(raw)); /* one copy: the guest may rewrite it */
	memcpy(&d->addr, raw, 8);
	memcpy(&d->len, raw + 8, 4);
	memcpy(&d->flags, raw + 12, 2);
	memcpy(&d->next, raw + 14, 2);
	d->addr = le64toh(d->addr);
	d->len = le32toh(d->len);
	d->flags = le16toh(d->flags);
	d->next = le16toh(d->next);
}

/* Walks the chain starting at head into c. Returns 0 or SPACED_EPROTO. */
static int walk_chain(const struct vring *vq, const struct vmm_mem *mem, uint16_t head,
		      struct vring_chain *c)
{
	uint16_t i = head;
	unsigned steps = 0;

	c->head = head;
	c->nout = c->nin = 0;
	c->out_len = c->in_len = 0;
	for (;;) {
		struct desc d;
		void *p;

		if (i >= vq->num || ++steps > vq->num)
			return SPACED_EPROTO; /* out of the table, or a loop */
		read_desc(vq, i, &d);
		if (d.flags & VRING_DESC_F_INDIRECT)
			return SPACED_EPROTO; /* not negotiated */
		if (d.len > 0) {
			p = vmm_mem_gpa(mem, d.addr, d.len);
			if (!p)
				return SPACED_EPROTO;
			if (d.flags & VRING_DESC_F_WRITE) {
				if (c->nin == VRING_CHAIN_MAX)
					return SPACED_EPROTO;
				c->in[c->nin].iov_base = p;
				c->in[c->nin].iov_len = d.len;
				c->nin++;
				c->in_len += d.len;
			} else {
				if (c->nin > 0 || c->nout == VRING_CHAIN_MAX)
					return SPACED_EPROTO; /* readable after writable */
				c->out[c->nout].iov_base = p;
				c->out[c->nout].iov_len = d.len;
				c->nout++;
				c->out_len += d.len;
			}
		}
		if (!(d.flags & VRING_DESC_F_NEXT))
			return 0;
		i = d.next;
	}
}

int vring_pop(struct vring *vq, const struct vmm_mem *mem, struct vring_chain *c)
{
	uint16_t avail_idx, head;
	int rc;

	if (!vring_ready(vq))
		return vq->broken ? SPACED_ESTALE : 0;
	avail_idx = load_le16(vq->avail + 2);
	if (avail_idx == vq->last_avail)
		return 0;
	if ((uint16_t)(avail_idx - vq->last_avail) > vq->num) {
		vq->broken = true;
		return SPACED_ESTALE;
	}
	head = load_le16(vq->avail + 4 + 2u * (vq->last_avail % vq->num));
	vq->last_avail++;
	if (head >= vq->num) {
		vq->broken = true; /* cannot even give it back */
		return SPACED_ESTALE;
	}
	rc = walk_chain(vq, mem, head, c);
	if (rc < 0) {
		vring_push(vq, head, 0);
		return SPACED_EPROTO;
	}
	return 1;
}

void vring_unpop(struct vring *vq)
{
	vq->last_avail--;
}

void vring_push(struct vring *vq, uint16_t head, uint32_t len)
{
	uint8_t *e = vq->used + 4 + 8u * (vq->used_idx % vq->num);
	uint32_t id = htole32(head), l = htole32(len);

	memcpy(e, &id, 4);
	memcpy(e + 4, &l, 4);
	vq->used_idx++;
	store_le16(vq->used + 2, vq->used_idx); /* release: the entry is visible first */
	vq->pushed++;
}

void vring_notify(struct vring *vq)
{
	uint64_t one = 1;

	if (vq->pushed == 0 || vq->call_fd < 0 || !vq->avail)
		return;
	vq->pushed = 0;
	__atomic_thread_fence(__ATOMIC_SEQ_CST); /* used idx before reading the guest's flags */
	if (load_le16(vq->avail) & VRING_AVAIL_F_NO_INTERRUPT)
		return;
	while (write(vq->call_fd, &one, sizeof(one)) < 0 && errno == EINTR)
		;
}

size_t vring_chain_write(const struct vring_chain *c, size_t off, const void *src, size_t len)
{
	const uint8_t *s = src;
	size_t done = 0;

	for (unsigned i = 0; i < c->nin && done < len; i++) {
		size_t seg = c->in[i].iov_len, k;

		if (off >= seg) {
			off -= seg;
			continue;
		}
		k = seg - off < len - done ? seg - off : len - done;
		memcpy((uint8_t *)c->in[i].iov_base + off, s + done, k);
		done += k;
		off = 0;
	}
	return done;
}

size_t vring_chain_read(const struct vring_chain *c, size_t off, void *dst, size_t len)
{
	uint8_t *d = dst;
	size_t done = 0;

	for (unsigned i = 0; i < c->nout && done < len; i++) {
		size_t seg = c->out[i].iov_len, k;

		if (off >= seg) {
			off -= seg;
			continue;
		}
		k = seg - off < len - done ? seg - off : len - done;
		memcpy(d + done, (const uint8_t *)c->out[i].iov_base + off, k);
		done += k;
		off = 0;
	}
	return done;
}
