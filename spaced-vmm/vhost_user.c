/*
 * vhost_user.c — vhost-user back-end protocol (see vhost_user.h).
 */
#include "vhost_user.h"

#include <endian.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "spaced_error.h"

enum {
	VU_GET_FEATURES = 1,
	VU_SET_FEATURES = 2,
	VU_SET_OWNER = 3,
	VU_RESET_OWNER = 4,
	VU_SET_MEM_TABLE = 5,
	VU_SET_VRING_NUM = 8,
	VU_SET_VRING_ADDR = 9,
	VU_SET_VRING_BASE = 10,
	VU_GET_VRING_BASE = 11,
	VU_SET_VRING_KICK = 12,
	VU_SET_VRING_CALL = 13,
	VU_SET_VRING_ERR = 14,
	VU_GET_PROTOCOL_FEATURES = 15,
	VU_SET_PROTOCOL_FEATURES = 16,
	VU_GET_QUEUE_NUM = 17,
	VU_SET_VRING_ENABLE = 18,
	VU_GET_CONFIG = 24,
	VU_SET_CONFIG = 25,
};

#define VU_VERSION 0x1u
#define VU_FLAG_VERSION_MASK 0x3u
#define VU_FLAG_REPLY (1u << 2)
#define VU_FLAG_NEED_REPLY (1u << 3)
#define VU_VRING_IDX_MASK 0xffu
#define VU_VRING_NOFD (1u << 8)

#define VIRTIO_F_VERSION_1 32
#define VHOST_USER_F_PROTOCOL_FEATURES 30
#define VU_PROTOCOL_F_MQ 0
#define VU_PROTOCOL_F_REPLY_ACK 3
#define VU_PROTOCOL_F_CONFIG 9

/* Reply being built by a handler: a payload of up to VU_MAX_PAYLOAD bytes. */
struct vu_reply {
	bool has;
	uint32_t size;
	uint8_t payload[VU_MAX_PAYLOAD];
};

struct vu_msg {
	uint32_t request, flags, size;
	const uint8_t *p;
	int *fds;       /* handlers that keep a descriptor set the slot to -1 */
	unsigned nfds;
};

typedef int (*vu_handler)(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r);

struct vu_entry {
	uint32_t request;
	const char *name;
	uint32_t min_size, max_size;
	unsigned max_fds;
	vu_handler fn;
};

static void set_err(struct vu_dev *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(struct vu_dev *d, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(d->err, sizeof(d->err), fmt, ap);
	va_end(ap);
}

static uint32_t rd32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return le32toh(v);
}

static uint64_t rd64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return le64toh(v);
}

static void reply_u64(struct vu_reply *r, uint64_t v)
{
	v = htole64(v);
	memcpy(r->payload, &v, 8);
	r->size = 8;
	r->has = true;
}

static void reply_state(struct vu_reply *r, uint32_t idx, uint32_t num)
{
	idx = htole32(idx);
	num = htole32(num);
	memcpy(r->payload, &idx, 4);
	memcpy(r->payload + 4, &num, 4);
	r->size = 8;
	r->has = true;
}

/* The ring named by a vring-state or vring-file message, or NULL. */
static struct vring *ring_of(struct vu_dev *d, uint64_t idx)
{
	if (idx >= d->nqueues) {
		set_err(d, "ring index %llu past the device's %u queues", (unsigned long long)idx,
			d->nqueues);
		return NULL;
	}
	return &d->vq[idx];
}

static void stop_ring(struct vu_dev *d, unsigned idx)
{
	struct vring *vq = &d->vq[idx];

	if (vq->started && d->ops->ring_stopping)
		d->ops->ring_stopping(d->opaque, idx);
	vq->started = false;
}

/* Closes the ring's kick eventfd, telling the device first. */
static void close_kick(struct vu_dev *d, unsigned idx)
{
	struct vring *vq = &d->vq[idx];

	if (vq->kick_fd < 0)
		return;
	if (d->ops->kick_closing)
		d->ops->kick_closing(d->opaque, idx, vq->kick_fd);
	close(vq->kick_fd);
	vq->kick_fd = -1;
}

/* Stops and forgets everything about ring idx. */
static void reset_ring(struct vu_dev *d, unsigned idx)
{
	stop_ring(d, idx);
	close_kick(d, idx);
	vring_reset(&d->vq[idx]);
}

static int h_get_features(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	reply_u64(r, d->features_offered);
	return 0;
}

static int h_set_features(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	uint64_t f = rd64(m->p);

	if (f & ~d->features_offered) {
		set_err(d, "features %#llx not offered", (unsigned long long)(f & ~d->features_offered));
		return SPACED_EINVAL;
	}
	d->features = f;
	/* without PROTOCOL_FEATURES a ring is enabled as soon as it starts */
	if (!(f & (1ull << VHOST_USER_F_PROTOCOL_FEATURES)))
		for (unsigned i = 0; i < d->nqueues; i++)
			d->vq[i].enabled = true;
	return 0;
}

static int h_set_owner(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	d->owner = true;
	return 0;
}

static int h_reset_owner(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	for (unsigned i = 0; i < d->nqueues; i++)
		reset_ring(d, i);
	vmm_mem_clear(&d->mem);
	d->features = 0;
	d->owner = false;
	return 0;
}

static int h_set_mem_table(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	struct vmm_mem_region_desc reg[VMM_MEM_MAX_REGIONS];
	uint32_t n = rd32(m->p);
	int rc;

	if (n == 0 || n > VMM_MEM_MAX_REGIONS || m->size != 8 + 32 * n || m->nfds != n) {
		set_err(d, "memory table of %u regions in %u bytes with %u descriptors", n, m->size,
			m->nfds);
		return SPACED_EPROTO; /* framing: drop the front-end */
	}
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *q = m->p + 8 + 32 * i;

		reg[i].gpa = rd64(q);
		reg[i].size = rd64(q + 8);
		reg[i].uaddr = rd64(q + 16);
		reg[i].mmap_offset = rd64(q + 24);
	}
	/* rings stay as they are but must be translated again */
	rc = vmm_mem_set(&d->mem, reg, n, m->fds);
	if (rc < 0) {
		set_err(d, "memory table refused: %s (%s)", spaced_strerror(rc),
			rc == SPACED_ESYS ? strerror(errno) : "bad regions");
		return rc;
	}
	for (unsigned i = 0; i < d->nqueues; i++)
		if (d->vq[i].addr_set)
			vring_map(&d->vq[i], &d->mem); /* on failure the ring is not ready */
	return 0;
}

static int h_set_vring_num(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	struct vring *vq = ring_of(d, rd32(m->p));
	uint32_t num = rd32(m->p + 4);

	if (!vq)
		return SPACED_EINVAL;
	if (num == 0 || num > VRING_MAX_SIZE || (num & (num - 1))) {
		set_err(d, "ring size %u", num);
		return SPACED_EINVAL;
	}
	vq->num = num;
	return 0;
}

static int h_set_vring_addr(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	struct vring *vq = ring_of(d, rd32(m->p));

	if (!vq)
		return SPACED_EINVAL;
	/* {u32 index, u32 flags, u64 desc, u64 used, u64 avail, u64 log} */
	vq->desc_uva = rd64(m->p + 8);
	vq->used_uva = rd64(m->p + 16);
	vq->avail_uva = rd64(m->p + 24);
	vq->addr_set = true;
	if (vring_map(vq, &d->mem) < 0) {
		set_err(d, "ring %u addresses outside the memory table", rd32(m->p));
		return SPACED_EINVAL;
	}
	return 0;
}

static int h_set_vring_base(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	struct vring *vq = ring_of(d, rd32(m->p));

	if (!vq)
		return SPACED_EINVAL;
	vq->last_avail = (uint16_t)rd32(m->p + 4);
	vq->broken = false;
	return 0;
}

static int h_get_vring_base(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	uint32_t idx = rd32(m->p);
	struct vring *vq = ring_of(d, idx);

	if (!vq)
		return SPACED_EPROTO; /* the front-end waits for an answer we cannot give */
	stop_ring(d, idx);
	reply_state(r, idx, vq->last_avail);
	close_kick(d, idx); /* a stopped ring's kick descriptor is not used again */
	return 0;
}

/* SET_VRING_KICK / CALL / ERR: u64 with the index in bits 0–7 and bit 8 set
 * when no descriptor comes with it. */
static int take_ring_fd(struct vu_dev *d, struct vu_msg *m, struct vring **vqp, int *fd)
{
	uint64_t v = rd64(m->p);
	bool nofd = (v & VU_VRING_NOFD) != 0;

	if (v & ~(uint64_t)(VU_VRING_IDX_MASK | VU_VRING_NOFD)) {
		set_err(d, "vring file value %#llx", (unsigned long long)v);
		return SPACED_EPROTO;
	}
	if (nofd != (m->nfds == 0)) {
		set_err(d, "vring file: %u descriptors with nofd=%d", m->nfds, nofd);
		return SPACED_EPROTO;
	}
	*vqp = ring_of(d, v & VU_VRING_IDX_MASK);
	if (!*vqp)
		return SPACED_EINVAL;
	*fd = -1;
	if (!nofd) {
		*fd = m->fds[0];
		m->fds[0] = -1;
	}
	return 0;
}

static int h_set_vring_kick(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	struct vring *vq;
	int fd, rc = take_ring_fd(d, m, &vq, &fd);

	if (rc < 0)
		return rc;
	if (fd < 0) {
		set_err(d, "polling mode (kick without an eventfd) is not supported");
		return SPACED_EINVAL;
	}
	close_kick(d, (unsigned)(vq - d->vq));
	vq->kick_fd = fd;
	if (vring_map(vq, &d->mem) < 0) {
		set_err(d, "ring started before its size and addresses were set");
		return SPACED_EINVAL;
	}
	vq->started = true;
	return 0;
}

static int h_set_vring_call(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	struct vring *vq;
	int fd, rc = take_ring_fd(d, m, &vq, &fd);

	if (rc < 0)
		return rc;
	if (vq->call_fd >= 0)
		close(vq->call_fd);
	vq->call_fd = fd;
	return 0;
}

static int h_set_vring_err(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	struct vring *vq;
	int fd, rc = take_ring_fd(d, m, &vq, &fd);

	if (rc < 0)
		return rc;
	if (vq->err_fd >= 0)
		close(vq->err_fd);
	vq->err_fd = fd;
	return 0;
}

static int h_get_protocol_features(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	reply_u64(r, d->protocol_offered);
	return 0;
}

static int h_set_protocol_features(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	uint64_t f = rd64(m->p);

	if (f & ~d->protocol_offered) {
		set_err(d, "protocol features %#llx not offered",
			(unsigned long long)(f & ~d->protocol_offered));
		return SPACED_EINVAL;
	}
	d->protocol = f;
	return 0;
}

static int h_get_queue_num(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	reply_u64(r, d->nqueues);
	return 0;
}

static int h_set_vring_enable(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	struct vring *vq = ring_of(d, rd32(m->p));
	uint32_t on = rd32(m->p + 4);

	if (!vq)
		return SPACED_EINVAL;
	if (on > 1) {
		set_err(d, "ring enable value %u", on);
		return SPACED_EINVAL;
	}
	vq->enabled = on == 1;
	return 0;
}

static int h_get_config(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	uint32_t off = rd32(m->p), size = rd32(m->p + 4);

	/* {u32 offset, u32 size, u32 flags, u8 payload[size]} */
	if (size > VU_MAX_CONFIG || m->size != 12 + size) {
		set_err(d, "config request of %u bytes in a %u-byte message", size, m->size);
		return SPACED_EPROTO;
	}
	memcpy(r->payload, m->p, 12);
	memset(r->payload + 12, 0, size);
	if (off < d->config_len) {
		uint32_t k = d->config_len - off < size ? d->config_len - off : size;

		memcpy(r->payload + 12, d->config + off, k);
	}
	r->size = 12 + size;
	r->has = true;
	return 0;
}

static int h_set_config(struct vu_dev *d, struct vu_msg *m, struct vu_reply *r)
{
	set_err(d, "the config space is read-only");
	return SPACED_EINVAL;
}

static const struct vu_entry vu_table[] = {
	{ VU_GET_FEATURES, "GET_FEATURES", 0, 0, 0, h_get_features },
	{ VU_SET_FEATURES, "SET_FEATURES", 8, 8, 0, h_set_features },
	{ VU_SET_OWNER, "SET_OWNER", 0, 0, 0, h_set_owner },
	{ VU_RESET_OWNER, "RESET_OWNER", 0, 0, 0, h_reset_owner },
	{ VU_SET_MEM_TABLE, "SET_MEM_TABLE", 8 + 32, 8 + 32 * VMM_MEM_MAX_REGIONS, VMM_MEM_MAX_REGIONS,
	  h_set_mem_table },
	{ VU_SET_VRING_NUM, "SET_VRING_NUM", 8, 8, 0, h_set_vring_num },
	{ VU_SET_VRING_ADDR, "SET_VRING_ADDR", 40, 40, 0, h_set_vring_addr },
	{ VU_SET_VRING_BASE, "SET_VRING_BASE", 8, 8, 0, h_set_vring_base },
	{ VU_GET_VRING_BASE, "GET_VRING_BASE", 8, 8, 0, h_get_vring_base },
	{ VU_SET_VRING_KICK, "SET_VRING_KICK", 8, 8, 1, h_set_vring_kick },
	{ VU_SET_VRING_CALL, "SET_VRING_CALL", 8, 8, 1, h_set_vring_call },
	{ VU_SET_VRING_ERR, "SET_VRING_ERR", 8, 8, 1, h_set_vring_err },
	{ VU_GET_PROTOCOL_FEATURES, "GET_PROTOCOL_FEATURES", 0, 0, 0, h_get_protocol_features },
	{ VU_SET_PROTOCOL_FEATURES, "SET_PROTOCOL_FEATURES", 8, 8, 0, h_set_protocol_features },
	{ VU_GET_QUEUE_NUM, "GET_QUEUE_NUM", 0, 0, 0, h_get_queue_num },
	{ VU_SET_VRING_ENABLE, "SET_VRING_ENABLE", 8, 8, 0, h_set_vring_enable },
	{ VU_GET_CONFIG, "GET_CONFIG", 12, 12 + VU_MAX_CONFIG, 0, h_get_config },
	{ VU_SET_CONFIG, "SET_CONFIG", 12, 12 + VU_MAX_CONFIG, 0, h_set_config },
};

void vu_init(struct vu_dev *d, unsigned nqueues, const void *config, uint32_t config_len,
	     const struct vu_device_ops *ops, void *opaque)
{
	memset(d, 0, sizeof(*d));
	d->fd = -1;
	d->nqueues = nqueues > VU_MAX_QUEUES ? VU_MAX_QUEUES : nqueues;
	for (unsigned i = 0; i < VU_MAX_QUEUES; i++)
		vring_init(&d->vq[i]);
	vmm_mem_init(&d->mem);
	d->features_offered = (1ull << VIRTIO_F_VERSION_1) | (1ull << VHOST_USER_F_PROTOCOL_FEATURES);
	d->protocol_offered = (1ull << VU_PROTOCOL_F_REPLY_ACK) | (1ull << VU_PROTOCOL_F_CONFIG);
	d->config_len = config_len > VU_MAX_CONFIG ? VU_MAX_CONFIG : config_len;
	memcpy(d->config, config, d->config_len);
	d->ops = ops;
	d->opaque = opaque;
	for (unsigned i = 0; i < VU_MAX_FDS; i++)
		d->fds[i] = -1;
}

void vu_attach(struct vu_dev *d, int fd)
{
	d->fd = fd;
	d->have = 0;
	d->nfds = 0;
	d->features = d->protocol = 0;
	d->owner = false;
}

static void drop_fds(struct vu_dev *d)
{
	for (unsigned i = 0; i < d->nfds; i++)
		if (d->fds[i] >= 0)
			close(d->fds[i]);
	d->nfds = 0;
}

void vu_detach(struct vu_dev *d)
{
	for (unsigned i = 0; i < d->nqueues; i++)
		reset_ring(d, i);
	vmm_mem_clear(&d->mem);
	drop_fds(d);
	if (d->fd >= 0)
		close(d->fd);
	d->fd = -1;
	d->have = 0;
}

static int send_reply(struct vu_dev *d, uint32_t request, const struct vu_reply *r)
{
	uint8_t out[VU_HDR_SIZE + VU_MAX_PAYLOAD];
	uint32_t h[3] = { htole32(request), htole32(VU_VERSION | VU_FLAG_REPLY), htole32(r->size) };
	size_t len = VU_HDR_SIZE + r->size, off = 0;

	memcpy(out, h, sizeof(h));
	memcpy(out + VU_HDR_SIZE, r->payload, r->size);
	while (off < len) {
		ssize_t n = send(d->fd, out + off, len - off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			/* replies are small and the front-end waits for them: a full
			 * socket here means it is not reading */
			set_err(d, "reply to request %u: %s", request, n < 0 ? strerror(errno) : "short");
			return SPACED_ESYS;
		}
		off += (size_t)n;
	}
	return 0;
}

static int dispatch(struct vu_dev *d, uint32_t request, uint32_t flags, uint32_t size)
{
	const struct vu_entry *e = NULL;
	struct vu_reply r = { .has = false };
	struct vu_msg m = { request, flags, size, d->buf + VU_HDR_SIZE, d->fds, d->nfds };
	int rc;

	for (size_t i = 0; i < sizeof(vu_table) / sizeof(vu_table[0]); i++)
		if (vu_table[i].request == request)
			e = &vu_table[i];
	if (!e) {
		set_err(d, "unknown request %u", request);
		return SPACED_EPROTO;
	}
	if (size < e->min_size || size > e->max_size || d->nfds > e->max_fds) {
		set_err(d, "%s with %u bytes and %u descriptors", e->name, size, d->nfds);
		return SPACED_EPROTO;
	}
	rc = e->fn(d, &m, &r);
	drop_fds(d); /* whatever the handler did not keep */
	if (d->ops->rings_changed)
		d->ops->rings_changed(d->opaque);
	if (rc == SPACED_EPROTO || rc == SPACED_ESYS)
		return rc;
	if (rc < 0 && d->ops->refused)
		d->ops->refused(d->opaque, e->name, d->err);
	if (r.has)
		return send_reply(d, request, &r);
	if ((flags & VU_FLAG_NEED_REPLY) && (d->protocol & (1ull << VU_PROTOCOL_F_REPLY_ACK))) {
		reply_u64(&r, rc < 0 ? 1 : 0);
		return send_reply(d, request, &r);
	}
	return 0;
}

/* Reads into the message buffer up to `want` bytes in total, taking any
 * descriptors that come with them. Returns 1 when `want` bytes are there, 0
 * when the socket has nothing more now, or an error. */
static int fill(struct vu_dev *d, size_t want)
{
	while (d->have < want) {
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int) * VU_MAX_FDS)];
		} ctl;
		struct iovec iov = { d->buf + d->have, want - d->have };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
				     .msg_controllen = sizeof(ctl.b) };
		ssize_t n = recvmsg(d->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			set_err(d, "recvmsg: %s", strerror(errno));
			return SPACED_ESYS;
		}
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
			size_t cnt;
			int fdv[VU_MAX_FDS];

			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			cnt = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			memcpy(fdv, CMSG_DATA(c), cnt * sizeof(int));
			for (size_t i = 0; i < cnt; i++) {
				if (d->nfds < VU_MAX_FDS && d->have == 0)
					d->fds[d->nfds++] = fdv[i];
				else
					close(fdv[i]); /* too many, or not on a message's first byte */
			}
			if (cnt > VU_MAX_FDS || (d->have > 0 && cnt > 0)) {
				set_err(d, "descriptors beyond what one message may carry");
				return SPACED_EPROTO;
			}
		}
		if (mh.msg_flags & MSG_CTRUNC) {
			set_err(d, "descriptors truncated");
			return SPACED_EPROTO;
		}
		if (n == 0)
			return SPACED_ECLOSED;
		d->have += (size_t)n;
	}
	return 1;
}

int vu_read(struct vu_dev *d)
{
	for (;;) {
		uint32_t request, flags, size;
		int rc = fill(d, VU_HDR_SIZE);

		if (rc <= 0)
			return rc;
		request = rd32(d->buf);
		flags = rd32(d->buf + 4);
		size = rd32(d->buf + 8);
		if ((flags & VU_FLAG_VERSION_MASK) != VU_VERSION || (flags & VU_FLAG_REPLY)) {
			set_err(d, "message flags %#x", flags);
			return SPACED_EPROTO;
		}
		if (size > VU_MAX_PAYLOAD) {
			set_err(d, "request %u with a %u-byte payload", request, size);
			return SPACED_EPROTO;
		}
		rc = fill(d, VU_HDR_SIZE + size);
		if (rc <= 0)
			return rc;
		rc = dispatch(d, request, flags, size);
		d->have = 0;
		drop_fds(d);
		if (rc < 0)
			return rc;
	}
}
