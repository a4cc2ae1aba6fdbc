/*
 * fuzz_vhost_user.c — libFuzzer target for spaced-vsockd's device side: the
 * vhost-user message parser (spaced-vmm/vhost_user.c) as QEMU would feed it,
 * and the split virtqueues (spaced-vmm/vring.c) over guest memory whose every
 * byte the input chooses.
 *
 * Input: GUEST_INPUT bytes of guest memory (shorter inputs leave the rest
 * zero), then messages, each as {u8 fds, le16 len, len bytes}: fds % 3 says
 * which descriptors travel with the message (none, the guest-memory memfd,
 * a fresh eventfd). After every message, each started ring is drained as the
 * device would: tx chains read, rx chains written, all given back.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "vhost_user.h"
#include "vring.h"

#define GUEST_MEM 65536 /* the memfd: the guest memory the region maps */
#define GUEST_INPUT 2048 /* its first bytes, taken from the input */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void nop(void *opaque)
{
	(void)opaque;
}

static void nop_stop(void *opaque, unsigned idx)
{
	(void)opaque;
	(void)idx;
}

static void nop_kick(void *opaque, unsigned idx, int fd)
{
	(void)opaque;
	(void)idx;
	(void)fd;
}

static const struct vu_device_ops ops = {
	.rings_changed = nop, .ring_stopping = nop_stop, .kick_closing = nop_kick,
};

static void drain(struct vu_dev *d)
{
	static struct vring_chain ch;
	static uint8_t scratch[256];

	for (unsigned q = 0; q < d->nqueues; q++) {
		for (int i = 0; i < 64; i++) {
			int rc = vring_pop(&d->vq[q], &d->mem, &ch);
			size_t n = 0;

			if (rc == 0 || rc == -28 /* SPACED_ESTALE */)
				break;
			if (rc < 0)
				continue;
			vring_chain_read(&ch, 0, scratch, sizeof(scratch));
			if (ch.in_len > 0)
				n = vring_chain_write(&ch, 3, scratch, sizeof(scratch));
			if (i == 5) {
				vring_unpop(&d->vq[q]);
				continue;
			}
			vring_push(&d->vq[q], ch.head, (uint32_t)n);
		}
		vring_notify(&d->vq[q]);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct vu_dev d;
	uint8_t cfg[8] = { 3 };
	size_t memlen = size < GUEST_INPUT ? size : GUEST_INPUT, off = memlen;
	int sv[2], mfd;

	mfd = memfd_create("fuzz-guest", MFD_CLOEXEC);
	if (mfd < 0 || ftruncate(mfd, GUEST_MEM) < 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) < 0)
		abort();
	if (memlen > 0 && pwrite(mfd, data, memlen, 0) != (ssize_t)memlen)
		abort();
	vu_init(&d, 2, cfg, sizeof(cfg), &ops, NULL);
	vu_attach(&d, sv[0]);
	while (off + 3 <= size) {
		unsigned kind = data[off] % 3;
		size_t len = (size_t)data[off + 1] | (size_t)data[off + 2] << 8;
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int))];
		} ctl;
		struct iovec iov;
		struct msghdr mh = { 0 };
		int fd = -1, rc;
		uint8_t reply[1024];

		off += 3;
		if (len > size - off)
			len = size - off;
		if (len == 0)
			break;
		iov.iov_base = (void *)(uintptr_t)(data + off);
		iov.iov_len = len;
		mh.msg_iov = &iov;
		mh.msg_iovlen = 1;
		if (kind == 1)
			fd = dup(mfd);
		else if (kind == 2)
			fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (fd >= 0) {
			memset(&ctl, 0, sizeof(ctl));
			mh.msg_control = ctl.b;
			mh.msg_controllen = sizeof(ctl.b);
			CMSG_FIRSTHDR(&mh)->cmsg_level = SOL_SOCKET;
			CMSG_FIRSTHDR(&mh)->cmsg_type = SCM_RIGHTS;
			CMSG_FIRSTHDR(&mh)->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(CMSG_FIRSTHDR(&mh)), &fd, sizeof(int));
		}
		if (sendmsg(sv[1], &mh, MSG_NOSIGNAL) < 0) {
			if (fd >= 0)
				close(fd);
			break;
		}
		if (fd >= 0)
			close(fd);
		off += len;
		rc = vu_read(&d);
		while (read(sv[1], reply, sizeof(reply)) > 0)
			; /* replies */
		if (rc < 0)
			break;
		drain(&d);
	}
	vu_detach(&d); /* closes sv[0] */
	close(sv[1]);
	close(mfd);
	return 0;
}
