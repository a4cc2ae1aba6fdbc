/*
 * fuzz_vsockd.c — libFuzzer target for spaced-vsockd as a whole: the
 * harness plays QEMU (vhost-user set-up over the real socket, a memfd as
 * guest memory, eventfds as kicks) and a hostile guest driver, and host
 * programs on the hybrid socket. The input is a list of actions; the daemon
 * runs one round of events (vsockd_step) after each.
 *
 * Actions (first byte % 8, then fixed-size arguments, missing bytes are 0):
 *   0 guest packet on the tx ring: op, flags, type selector, addressing
 *     selector (the open connection, the wrong CID, any ports), len field,
 *     bytes really there, buf_alloc, fwd_cnt
 *   1 rx buffers for the guest's receive ring: count, size of each
 *   2 the host program writes n bytes      3 the host program reads
 *   4 the host program shuts its write side or closes
 *   5 a new host program sends a CONNECT line (well formed or not)
 *   6 the guest scribbles on its rings: offset, 8 bytes
 *   7 QEMU stops and restarts a ring (GET_VRING_BASE, then set-up again)
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "vsockd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MEM_SIZE (256 * 1024)
#define UADDR 0x7f0000000000ull
#define QSIZE 16u
#define RXQ_BASE 0x0000u /* desc, +0x100 avail, +0x200 used */
#define TXQ_BASE 0x1000u
#define TX_BUFS 0x4000u  /* 16 × 4 KiB */
#define RX_BUFS 0x14000u /* 16 × 4 KiB */
#define CID 3u
#define MAX_CLIENTS 4

struct fz {
	struct vsockd *d;
	int fe, mfd;
	uint8_t *mem;
	int kick[2], call[2];
	uint16_t avail[2];
	int clients[MAX_CLIENTS];
};

static char dir[64], vu_path[96], uds_path[96];

static const uint8_t *in;
static size_t in_len, in_off;

static uint64_t take(unsigned bytes)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < bytes; i++, in_off++)
		v |= (uint64_t)(in_off < in_len ? in[in_off] : 0) << (8 * i);
	return v;
}

static void step(struct fz *f)
{
	for (int i = 0; i < 3; i++)
		vsockd_step(f->d, 0);
}

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* One vhost-user message (with at most one descriptor); replies drained. */
static void vu_send(struct fz *f, uint32_t req, const void *payload, uint32_t len, int fd)
{
	uint8_t buf[12 + 64], junk[512];
	uint32_t h[3] = { req, 1, len };
	struct iovec iov = { buf, 12 + len };
	union {
		struct cmsghdr c;
		char b[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	memcpy(buf, h, 12);
	if (len > 0)
		memcpy(buf + 12, payload, len);
	if (fd >= 0) {
		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.b;
		mh.msg_controllen = sizeof(ctl.b);
		CMSG_FIRSTHDR(&mh)->cmsg_level = SOL_SOCKET;
		CMSG_FIRSTHDR(&mh)->cmsg_type = SCM_RIGHTS;
		CMSG_FIRSTHDR(&mh)->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(CMSG_FIRSTHDR(&mh)), &fd, sizeof(int));
	}
	if (sendmsg(f->fe, &mh, MSG_NOSIGNAL) < 0)
		return;
	step(f);
	while (recv(f->fe, junk, sizeof(junk), MSG_DONTWAIT) > 0)
		;
}

static void ring_setup(struct fz *f, uint32_t q)
{
	uint32_t base = q == 0 ? RXQ_BASE : TXQ_BASE;
	uint8_t p[40];

	put32(p, q);
	put32(p + 4, QSIZE);
	vu_send(f, 8, p, 8, -1); /* SET_VRING_NUM */
	put32(p + 4, f->avail[q]);
	vu_send(f, 10, p, 8, -1); /* SET_VRING_BASE */
	memset(p, 0, sizeof(p));
	put32(p, q);
	put64(p + 8, UADDR + base);
	put64(p + 16, UADDR + base + 0x200);
	put64(p + 24, UADDR + base + 0x100);
	vu_send(f, 9, p, 40, -1); /* SET_VRING_ADDR */
	put64(p, q);
	vu_send(f, 12, p, 8, f->kick[q]); /* SET_VRING_KICK */
	vu_send(f, 13, p, 8, f->call[q]); /* SET_VRING_CALL */
	put32(p, q);
	put32(p + 4, 1);
	vu_send(f, 18, p, 8, -1); /* SET_VRING_ENABLE */
}

static void kick(struct fz *f, unsigned q)
{
	uint64_t one = 1;

	if (write(f->kick[q], &one, 8) < 0)
		return;
}

/* Adds a one-descriptor chain on ring q (the guest's side of the ring). */
static void add_chain(struct fz *f, unsigned q, uint32_t buf, uint32_t len, int writable)
{
	uint32_t base = q == 0 ? RXQ_BASE : TXQ_BASE;
	uint16_t slot = f->avail[q] % QSIZE, idx;
	uint8_t *d = f->mem + base + 16u * slot;

	put64(d, buf);
	put32(d + 8, len);
	put16(d + 12, writable ? 2 : 0);
	put16(d + 14, 0);
	put16(f->mem + base + 0x100 + 4 + 2u * slot, slot);
	f->avail[q]++;
	idx = f->avail[q];
	__atomic_store_n((uint16_t *)(void *)(f->mem + base + 0x100 + 2), idx, __ATOMIC_RELEASE);
}

static int client_connect(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	strcpy(sa.sun_path, uds_path);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
		close(fd);
		return -1;
	}
	return fd;
}

static int setup(struct fz *f)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	static struct vsockd_config cfg;
	uint8_t p[40];

	cfg = (struct vsockd_config){ .vu_path = vu_path, .uds_path = uds_path, .guest_cid = CID,
				      .timeout_ms = 1000, .max_conns = 8, .buf_alloc = 16384,
				      .no_signals = 1, .verbose = getenv("FUZZ_VERBOSE") != NULL };
	if (vsockd_open(&cfg, &f->d) < 0)
		return -1;
	f->mfd = memfd_create("fuzz-vsockd", MFD_CLOEXEC);
	if (f->mfd < 0 || ftruncate(f->mfd, MEM_SIZE) < 0)
		return -1;
	f->mem = mmap(NULL, MEM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, f->mfd, 0);
	if (f->mem == MAP_FAILED)
		return -1;
	for (int q = 0; q < 2; q++) {
		f->kick[q] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		f->call[q] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	}
	strcpy(sa.sun_path, vu_path);
	f->fe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (f->fe < 0 || connect(f->fe, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return -1;
	step(f);
	put64(p, (1ull << 3) | (1ull << 9));
	vu_send(f, 16, p, 8, -1); /* SET_PROTOCOL_FEATURES: REPLY_ACK, CONFIG */
	vu_send(f, 3, NULL, 0, -1); /* SET_OWNER */
	put64(p, (1ull << 32) | (1ull << 30));
	vu_send(f, 2, p, 8, -1); /* SET_FEATURES */
	memset(p, 0, sizeof(p));
	put32(p, 1);
	put64(p + 8, 0);
	put64(p + 16, MEM_SIZE);
	put64(p + 24, UADDR);
	vu_send(f, 5, p, 40, f->mfd); /* SET_MEM_TABLE */
	ring_setup(f, 0);
	ring_setup(f, 1);
	return 0;
}

static void teardown(struct fz *f)
{
	for (int i = 0; i < MAX_CLIENTS; i++)
		if (f->clients[i] >= 0)
			close(f->clients[i]);
	if (f->fe >= 0)
		close(f->fe);
	step(f);
	vsockd_close(f->d);
	for (int q = 0; q < 2; q++) {
		close(f->kick[q]);
		close(f->call[q]);
	}
	if (f->mem && f->mem != MAP_FAILED)
		munmap(f->mem, MEM_SIZE);
	if (f->mfd >= 0)
		close(f->mfd);
}

static void remove_dir(void)
{
	rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz f = { .fe = -1, .mfd = -1 };
	unsigned actions = 0;

	if (!dir[0]) {
		snprintf(dir, sizeof(dir), "/tmp/spaced-fuzz-vsockd-%d", (int)getpid());
		mkdir(dir, 0700);
		atexit(remove_dir);
		snprintf(vu_path, sizeof(vu_path), "%s/vu.sock", dir);
		snprintf(uds_path, sizeof(uds_path), "%s/v.sock", dir);
	}
	for (int i = 0; i < MAX_CLIENTS; i++)
		f.clients[i] = -1;
	in = data;
	in_len = size;
	in_off = 0;
	if (setup(&f) < 0)
		abort();
	/* one host program connected to the guest's port 1024, as local port 2^30 */
	f.clients[0] = client_connect();
	if (f.clients[0] >= 0 && write(f.clients[0], "CONNECT 1024\n", 13) < 0)
		abort();
	step(&f);
	while (in_off < in_len && actions++ < 64) {
		unsigned kind = (unsigned)take(1) % 8;
		int c = f.clients[take(1) % MAX_CLIENTS];

		switch (kind) {
		case 0: {
			uint16_t op = (uint16_t)take(1) % 9, flags = (uint16_t)take(1);
			unsigned tsel = (unsigned)take(1), asel = (unsigned)take(1);
			uint32_t len = (uint32_t)take(2), real = (uint32_t)take(2) % 4052;
			uint32_t buf_alloc = (uint32_t)take(4), fwd = (uint32_t)take(4);
			uint32_t slot = f.avail[1] % QSIZE, at = TX_BUFS + 4096u * slot;
			uint8_t *h = f.mem + at;

			put64(h, asel % 4 == 1 ? 7 : CID);
			put64(h + 8, asel % 4 == 2 ? 9 : 2);
			put32(h + 16, asel % 4 == 3 ? (uint32_t)take(4) : 1024);
			put32(h + 20, asel % 4 == 3 ? (uint32_t)take(4) : (1u << 30) + (asel >> 2) % 3);
			put32(h + 24, op == 5 ? (len % 2 ? len : real) : len % 4 == 0 ? 0 : len);
			put16(h + 28, tsel % 5 == 0 ? 2 : 1);
			put16(h + 30, op);
			put32(h + 32, flags % 4);
			put32(h + 36, buf_alloc % 3 == 0 ? 262144 : buf_alloc);
			put32(h + 40, fwd % 2 ? fwd : 0);
			memset(h + 44, 'g', real);
			add_chain(&f, 1, at, 44 + real, 0);
			kick(&f, 1);
			break;
		}
		case 1: {
			unsigned n = (unsigned)take(1) % 8 + 1, len = (unsigned)take(2) % 4097;

			if (len % 3 == 0)
				len = 40 + len % 8; /* around the 44-byte header: no room for data */

			for (unsigned i = 0; i < n; i++)
				add_chain(&f, 0, RX_BUFS + 4096u * (f.avail[0] % QSIZE), len, 1);
			kick(&f, 0);
			break;
		}
		case 2: {
			static uint8_t junk[65536];
			size_t n = (size_t)take(2);

			if (c >= 0 && send(c, junk, n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
				break;
			break;
		}
		case 3: {
			static uint8_t sink[65536];

			if (c >= 0)
				while (recv(c, sink, sizeof(sink), MSG_DONTWAIT) > 0)
					;
			break;
		}
		case 4: {
			unsigned how = (unsigned)take(1) % 2;
			int *slotp = NULL;

			for (int i = 0; i < MAX_CLIENTS; i++)
				if (f.clients[i] == c && c >= 0)
					slotp = &f.clients[i];
			if (!slotp)
				break;
			if (how == 0) {
				shutdown(c, SHUT_WR);
			} else {
				close(c);
				*slotp = -1;
			}
			break;
		}
		case 5: {
			static const char *const lines[] = { "CONNECT 1024\n", "CONNECT 5\n", "CONNECT 1024",
							     "CONNECT x\n", "CONNECT 1024\nextra bytes" };
			unsigned which = (unsigned)take(1) % 5;

			for (int i = 0; i < MAX_CLIENTS; i++)
				if (f.clients[i] < 0) {
					f.clients[i] = client_connect();
					if (f.clients[i] >= 0 &&
					    send(f.clients[i], lines[which], strlen(lines[which]), MSG_NOSIGNAL) < 0)
						break;
					break;
				}
			break;
		}
		case 6: {
			uint32_t off = (uint32_t)take(2) % 0x1400;
			uint64_t v = take(8);

			memcpy(f.mem + off, &v, 8);
			kick(&f, (unsigned)take(1) % 2);
			break;
		}
		case 7: {
			uint32_t q = (uint32_t)take(1) % 2;
			uint8_t p[8];

			put32(p, q);
			put32(p + 4, 0);
			vu_send(&f, 11, p, 8, -1); /* GET_VRING_BASE: stop */
			f.kick[q] = (close(f.kick[q]), eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
			ring_setup(&f, q);
			break;
		}
		}
		step(&f);
	}
	teardown(&f);
	return 0;
}
