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
	int no_signals;          /* leave SIGTERM/SIGINT alone (tests and fuzzing) */
	int confine;             /* vsockd_run: the loop under its system-call allow-list */
};

struct vsockd;

/* Binds both sockets (each as PATH.tmp, made to listen, then renamed over
 * PATH, so PATH never exists without a listener) and, unless cfg->no_signals,
 * takes SIGTERM and SIGINT through a signalfd. On success *out is the daemon
 * (cfg must outlive it) and 0 is returned; otherwise a negative SPACED_E* code
 * (a message says why on stderr) and *out is untouched. */
int vsockd_open(const struct vsockd_config *cfg, struct vsockd **out);

/* Handles one round of events, waiting at most timeout_ms for them (-1: as
 * long as it takes; a pending deadline or unfinished ring shortens the wait).
 * Returns 1 while serving, 0 once done (QEMU hung up after having connected:
 * the VM is gone; or a signal), SPACED_ESYS when epoll itself fails. */
int vsockd_step(struct vsockd *d, int timeout_ms);

/* Closes every connection and socket, removes both socket files and frees d
 * (NULL is accepted). */
void vsockd_close(struct vsockd *d);

/* vsockd_open, vsockd_step until done, vsockd_close. With cfg->confine, the
 * loop runs under a seccomp allow-list once both sockets listen (libspaced
 * confine.h: the calls of the loop only, new sockets Unix ones only; anything
 * else kills the daemon). Returns 0 or the error. */
int vsockd_run(const struct vsockd_config *cfg);

#endif
