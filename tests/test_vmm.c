/*
 * test_vmm.c — the parts of spaced-vsockd that guest and front-end input
 * reaches first: the bounded ring, guest-memory translation, split
 * virtqueues over a synthetic guest memory, the vsock header codec; and the
 * daemon refusing host programs while no VM is attached.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "spaced_error.h"
#include "rbuf.h"
#include "vmm_mem.h"
#include "vring.h"
#include "vsock_pkt.h"
#include "vsockd.h"

Test(rbuf, wraps_and_bounds)
{
	struct vmm_rbuf r;
	uint8_t out[16];
	struct iovec iov[2];

	vmm_rbuf_init(&r, 8);
	cr_assert_eq(vmm_rbuf_put(&r, "abcdef", 6), 0);
	cr_assert_eq(vmm_rbuf_put(&r, "xyz", 3), SPACED_ETOOBIG, "more than the capacity");
	cr_assert_eq(r.len, 6);
	vmm_rbuf_consume(&r, 4);
	cr_assert_eq(vmm_rbuf_put(&r, "ghijkl", 6), 0, "wraps around");
	cr_assert_eq(vmm_rbuf_room(&r), 0);
	cr_assert_eq(vmm_rbuf_free_iov(&r, iov), 0, "full: no free space");
	cr_assert_eq(vmm_rbuf_data_iov(&r, iov), 2);
	cr_assert_eq(vmm_rbuf_peek(&r, out, sizeof(out)), 8);
	cr_assert_eq(memcmp(out, "efghijkl", 8), 0);
	vmm_rbuf_consume(&r, 8);
	cr_assert_eq(r.len, 0);
	cr_assert_eq(vmm_rbuf_free_iov(&r, iov), 1, "empty: one piece from the start");
	cr_assert_eq(iov[0].iov_len, 8);
	vmm_rbuf_clear(&r);
	cr_assert_null(r.data);
}

/* Guest memory for the ring tests: 64 KiB memfd at guest-physical 0, front-end address UA. */
#define UA 0x7f0000000000ull
#define MEM 65536

static int mfd = -1;
static uint8_t *gm;
static struct vmm_mem mem;

static void mem_setup(void)
{
	struct vmm_mem_region_desc d = { 0, MEM, UA, 0 };

	mfd = memfd_create("test-vmm", MFD_CLOEXEC);
	cr_assert_geq(mfd, 0);
	cr_assert_eq(ftruncate(mfd, MEM), 0);
	gm = mmap(NULL, MEM, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	cr_assert_neq(gm, MAP_FAILED);
	vmm_mem_init(&mem);
	cr_assert_eq(vmm_mem_set(&mem, &d, 1, &mfd), 0);
}

static void mem_teardown(void)
{
	vmm_mem_clear(&mem);
	munmap(gm, MEM);
	close(mfd);
}

Test(vmm_mem, translation_is_bounded, .init = mem_setup, .fini = mem_teardown)
{
	struct vmm_mem_region_desc past = { 0, MEM * 2, UA, 0 }, off = { 0, MEM, UA, 4096 };
	struct vmm_mem other;

	cr_assert_not_null(vmm_mem_gpa(&mem, 0, MEM));
	cr_assert_null(vmm_mem_gpa(&mem, 1, MEM), "one byte past the end");
	cr_assert_null(vmm_mem_gpa(&mem, MEM, 1));
	cr_assert_null(vmm_mem_gpa(&mem, UINT64_MAX, 2), "wrapping range");
	cr_assert_null(vmm_mem_gpa(&mem, 0, 0), "empty range");
	cr_assert_not_null(vmm_mem_uva(&mem, UA + 100, 10));
	cr_assert_null(vmm_mem_uva(&mem, 100, 10));
	vmm_mem_init(&other);
	cr_assert_eq(vmm_mem_set(&other, &past, 1, &mfd), SPACED_EINVAL, "region past the file's end");
	cr_assert_eq(vmm_mem_set(&other, &off, 1, &mfd), SPACED_EINVAL, "offset + size past the end");
	cr_assert_eq(other.n, 0);
}

/* A ring of 8 at desc 0x1000, avail 0x1100, used 0x1200. */
static struct vring vq;

static void ring_setup(void)
{
	mem_setup();
	vring_init(&vq);
	vq.num = 8;
	vq.desc_uva = UA + 0x1000;
	vq.avail_uva = UA + 0x1100;
	vq.used_uva = UA + 0x1200;
	vq.addr_set = true;
	cr_assert_eq(vring_map(&vq, &mem), 0);
	vq.started = vq.enabled = true;
}

static void ring_teardown(void)
{
	vring_reset(&vq);
	mem_teardown();
}

static void desc(uint16_t i, uint64_t addr, uint32_t len, uint16_t flags, uint16_t next)
{
	uint8_t *d = gm + 0x1000 + 16 * i;

	memcpy(d, &addr, 8);
	memcpy(d + 8, &len, 4);
	memcpy(d + 12, &flags, 2);
	memcpy(d + 14, &next, 2);
}

static void offer(uint16_t head)
{
	uint16_t idx;

	memcpy(&idx, gm + 0x1102, 2);
	memcpy(gm + 0x1104 + 2 * (idx % 8), &head, 2);
	idx++;
	memcpy(gm + 0x1102, &idx, 2);
}

static uint16_t used_idx(void)
{
	uint16_t v;

	memcpy(&v, gm + 0x1202, 2);
	return v;
}

Test(vring, chain_read_and_written, .init = ring_setup, .fini = ring_teardown)
{
	struct vring_chain c;
	uint8_t buf[8];

	memcpy(gm + 0x2000, "head", 4);
	desc(0, 0x2000, 4, 1, 1);       /* readable, next 1 */
	desc(1, 0x3000, 6, 2 | 0, 0);   /* writable, last */
	offer(0);
	cr_assert_eq(vring_pop(&vq, &mem, &c), 1);
	cr_assert_eq(c.nout, 1);
	cr_assert_eq(c.nin, 1);
	cr_assert_eq(c.out_len, 4);
	cr_assert_eq(c.in_len, 6);
	cr_assert_eq(vring_chain_read(&c, 0, buf, sizeof(buf)), 4);
	cr_assert_eq(memcmp(buf, "head", 4), 0);
	cr_assert_eq(vring_chain_write(&c, 2, "abcdefgh", 8), 4, "only what fits after the offset");
	cr_assert_eq(memcmp(gm + 0x3002, "abcd", 4), 0);
	vring_push(&vq, c.head, 6);
	cr_assert_eq(used_idx(), 1);
	cr_assert_eq(vring_pop(&vq, &mem, &c), 0, "nothing more");
}

Test(vring, malformed_chains_given_back_empty, .init = ring_setup, .fini = ring_teardown)
{
	struct vring_chain c;

	desc(0, 0x2000, 4, 1, 0);           /* loop: 0 -> 0 */
	offer(0);
	cr_assert_eq(vring_pop(&vq, &mem, &c), SPACED_EPROTO, "loop");
	desc(1, 0x2000, 4, 1, 9);           /* next out of the table */
	offer(1);
	cr_assert_eq(vring_pop(&vq, &mem, &c), SPACED_EPROTO, "next past the table");
	desc(2, MEM - 2, 4, 0, 0);          /* buffer past guest memory */
	offer(2);
	cr_assert_eq(vring_pop(&vq, &mem, &c), SPACED_EPROTO, "buffer outside memory");
	desc(3, 0x3000, 4, 2 | 1, 4);       /* writable then readable */
	desc(4, 0x2000, 4, 0, 0);
	offer(3);
	cr_assert_eq(vring_pop(&vq, &mem, &c), SPACED_EPROTO, "readable after writable");
	desc(5, 0x2000, 16, 4, 0);          /* indirect, not negotiated */
	offer(5);
	cr_assert_eq(vring_pop(&vq, &mem, &c), SPACED_EPROTO, "indirect");
	cr_assert_eq(used_idx(), 5, "every bad chain was given back");
	cr_assert(vring_ready(&vq), "the ring itself stays usable");
}

Test(vring, impossible_indexes_break_the_ring, .init = ring_setup, .fini = ring_teardown)
{
	struct vring_chain c;
	uint16_t idx = 100; /* 100 chains offered on a ring of 8 */

	memcpy(gm + 0x1102, &idx, 2);
	cr_assert_eq(vring_pop(&vq, &mem, &c), SPACED_ESTALE);
	cr_assert_not(vring_ready(&vq));
	cr_assert_eq(vring_pop(&vq, &mem, &c), SPACED_ESTALE, "stays broken");
}

Test(vring, head_out_of_range_breaks_the_ring, .init = ring_setup, .fini = ring_teardown)
{
	struct vring_chain c;

	offer(8);
	cr_assert_eq(vring_pop(&vq, &mem, &c), SPACED_ESTALE);
	cr_assert_eq(used_idx(), 0, "an index that cannot be given back is not");
}

Test(vring, map_refuses_bad_rings, .init = mem_setup, .fini = mem_teardown)
{
	struct vring r;

	vring_init(&r);
	r.addr_set = true;
	r.desc_uva = UA;
	r.avail_uva = UA + 0x1000;
	r.used_uva = UA + 0x2000;
	r.num = 6;
	cr_assert_eq(vring_map(&r, &mem), SPACED_EINVAL, "not a power of two");
	r.num = 8;
	r.desc_uva = UA + 8;
	cr_assert_eq(vring_map(&r, &mem), SPACED_EINVAL, "misaligned descriptors");
	r.desc_uva = UA + MEM - 64;
	cr_assert_eq(vring_map(&r, &mem), SPACED_EINVAL, "table past memory");
	cr_assert_null(r.desc);
	r.desc_uva = UA;
	cr_assert_eq(vring_map(&r, &mem), 0);
}

Test(vsock_pkt, header_round_trip)
{
	struct vsock_hdr h = { 3, 2, 1024, 1u << 30, 100, VSOCK_TYPE_STREAM, VSOCK_OP_RW, 3, 262144, 77 }, g;
	uint8_t raw[VSOCK_HDR_SIZE];

	vsock_hdr_encode(&h, raw);
	cr_assert_eq(raw[0], 3);
	cr_assert_eq(raw[8], 2);
	cr_assert_eq(raw[30], VSOCK_OP_RW, "op at byte 30");
	memset(&g, 0xa5, sizeof(g));
	vsock_hdr_decode(raw, &g);
	cr_assert(g.src_cid == h.src_cid && g.dst_cid == h.dst_cid && g.src_port == h.src_port &&
		  g.dst_port == h.dst_port && g.len == h.len && g.type == h.type && g.op == h.op &&
		  g.flags == h.flags && g.buf_alloc == h.buf_alloc && g.fwd_cnt == h.fwd_cnt);
	cr_assert_str_eq(vsock_op_name(VSOCK_OP_CREDIT_REQUEST), "CREDIT_REQUEST");
	cr_assert_str_eq(vsock_op_name(99), "?");
}

/* Without a VM the daemon listens, but a CONNECT is closed at once. */
Test(vsockd, refuses_connect_without_a_guest)
{
	char dir[] = "/tmp/spaced-test-vmm-XXXXXX", vu[64], uds[64];
	struct vsockd_config cfg = { .vu_path = vu, .uds_path = uds, .guest_cid = 3, .timeout_ms = 500,
				     .max_conns = 4, .buf_alloc = 65536, .no_signals = 1 };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct vsockd *d;
	char b;
	int fd;
	ssize_t r = 1;

	cr_assert_not_null(mkdtemp(dir));
	snprintf(vu, sizeof(vu), "%s/vu.sock", dir);
	snprintf(uds, sizeof(uds), "%s/v.sock", dir);
	cr_assert_eq(vsockd_open(&cfg, &d), 0);
	strcpy(sa.sun_path, uds);
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(write(fd, "CONNECT 1024\n", 13), 13);
	for (int i = 0; i < 20 && r != 0; i++) {
		cr_assert_geq(vsockd_step(d, 50), 1);
		r = recv(fd, &b, 1, MSG_DONTWAIT);
	}
	cr_assert_eq(r, 0, "closed without an answer");
	close(fd);
	vsockd_close(d);
	cr_assert_eq(access(uds, F_OK), -1, "sockets removed");
	cr_assert_eq(access(vu, F_OK), -1);
	rmdir(dir);
}

/* ---- qmp.c: QEMU's answers as the supervisor reads them ---- */

#include "qmp.h"

/* A client on one end of a socket pair whose other end (QEMU's) has sent
 * `script` and nothing more; that end stays open (QEMU reads the commands)
 * until the test ends. */
static int qemu_end = -1;

static int qmp_scripted(const char *script, struct qmp **out)
{
	int sv[2];
	if (qemu_end >= 0)
		close(qemu_end);
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	cr_assert_eq(write(sv[1], script, strlen(script)), (ssize_t)strlen(script));
	shutdown(sv[1], SHUT_WR);
	qemu_end = sv[1];
	return qmp_adopt(sv[0], 2000, out);
}

#define GREET "{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n{\"return\": {}, \"id\": 1}\n"

Test(qmp, answers_matched_by_id_events_skipped)
{
	struct qmp *q = NULL;
	char why[128] = "";
	json_t *ret = NULL;
	cr_assert_eq(qmp_scripted(GREET "{\"event\": \"STOP\", \"timestamp\": {}}\n"
	                                "{\"return\": {}, \"id\": 99}\n"
	                                "{\"return\": {\"status\": \"paused\"}, \"id\": 2}\n",
	                          &q),
	             0);
	cr_assert_eq(qmp_exec(q, "query-status", NULL, 2000, &ret, why, sizeof why), 0);
	cr_assert_str_eq(json_string_value(json_object_get(ret, "status")), "paused");
	json_decref(ret);
	cr_assert_eq(qmp_exec(q, "cont", NULL, 500, NULL, why, sizeof why), SPACED_ECLOSED, "QEMU went away");
	qmp_close(q);
}

Test(qmp, error_answer_has_its_reason)
{
	struct qmp *q = NULL;
	char why[256] = "";
	cr_assert_eq(qmp_scripted(GREET "{\"error\": {\"class\": \"GenericError\", \"desc\": \"State blocked by "
	                                "non-migratable device\"}, \"id\": 2}\n",
	                          &q),
	             0);
	cr_assert_eq(qmp_exec(q, "migrate", json_pack("{s:s}", "uri", "exec:cat"), 2000, NULL, why, sizeof why),
	             SPACED_EPERM);
	cr_assert(strstr(why, "migrate: State blocked by non-migratable device") != NULL, "%s", why);
	qmp_close(q);
}

Test(qmp, bad_input_refused)
{
	struct qmp *q = NULL;
	cr_assert_eq(qmp_scripted("{\"hello\": 1}\n", &q), SPACED_EPROTO, "not a greeting");
	cr_assert_eq(qmp_scripted("{\"QMP\": {}, \"QMP\": {}}\n", &q), SPACED_EPROTO, "duplicate keys");
	cr_assert_eq(qmp_scripted("[1,2]\n", &q), SPACED_EPROTO, "not an object");
	cr_assert_eq(qmp_scripted("{\"QMP\": {}}", &q), SPACED_ECLOSED, "no newline before the end");
	cr_assert_eq(qmp_scripted("{\"QMP\": {}}\n{\"return\": {}, \"id\": 7}\n", &q), SPACED_ECLOSED,
	             "an answer to another command");
	/* a line longer than QMP_LINE_MAX */
	size_t n = QMP_LINE_MAX + 16;
	char *big = malloc(n + 1);
	cr_assert_not_null(big);
	memset(big, 'x', n);
	big[0] = '"';
	big[n] = 0;
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	int sz = 256 * 1024;
	setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
	setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
	cr_assert_eq(write(sv[1], big, n), (ssize_t)n);
	cr_assert_eq(qmp_adopt(sv[0], 2000, &q), SPACED_ETOOBIG);
	close(sv[1]);
	free(big);
}

Test(qmp, silence_times_out)
{
	int sv[2];
	struct qmp *q = NULL;
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	cr_assert_eq(qmp_adopt(sv[0], 100, &q), SPACED_ETIMEDOUT);
	close(sv[1]);
}
