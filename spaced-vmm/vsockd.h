/*
 * vsockd.h — spaced-vsockd: a vhost-user virtio-vsock device whose host side
 * is Firecracker's hybrid vsock (docs/vm-transport.md).
 *
 * QEMU connects to the vhost-user socket and hands over the guest's memory
 * and the rx/tx virtqueues (the event queue stays in QEMU). Host programs
 * connect to the hybrid Unix socket and write "CONNECT <port>\n"; the daemon
 * opens a stream to that port of the guest (OP_REQUEST), answers
 * "OK <local port>\n" once the guest accepts (OP_RESPONSE) and then relays
 * bytes both ways with virtio-vsock credit flow control. A guest that
 * connects to the host (CID 2) port P is connected to the Unix socket
 * "<hybrid path>_P", as Firecracker does.
 */
#ifndef SPACED_VMM_VSOCKD_H
#define SPACED_VMM_VSOCKD_H

#include <stdint.h>

struct vsockd_config {
	const char *vu_path;     /* vhost-user socket QEMU connects to */
	const char *uds_path;    /* hybrid vsock socket host programs connect to */
	uint64_t guest_cid;      /* the guest's CID (>= 3), given to QEMU in the config space */
	unsigned timeout_ms;     /* CONNECT line, guest answer and close handshake, each */
	unsigned max_conns;      /* connections at once; more are closed at accept */
	uint32_t buf_alloc;      /* receive buffer per connection advertised to the guest */
	int verbose;             /* log every connection event */
};

/* Binds both sockets (each as PATH.tmp, made to listen, then renamed over
 * PATH, so PATH never exists without a listener), waits for QEMU and serves
 * until QEMU hangs up after having connected (the VM is gone), SIGTERM or
 * SIGINT. Returns 0 then, or a negative SPACED_E* code when the sockets
 * cannot be set up (a message says why on stderr). Every host connection is
 * closed on return and both socket files are removed. */
int vsockd_run(const struct vsockd_config *cfg);

#endif
