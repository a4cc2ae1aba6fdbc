/*
 * host.h — spaced-host, the per-sandbox host bridge (B1–B3).
 *
 * spaced-host listens on its own Unix socket. For every new connection it
 *   1. verifies its caller is the expected sandbox manager (SO_PEERCRED uid,
 *      SO_PEERPIDFD, pid and start time when configured);
 *   2. verifies the guest-transport listener belongs to the expected launcher
 *      or VMM process (socket file owner, unix_diag VFS inode of the listener
 *      against stat() of the path, the process holding it, its start time and
 *      executable), connects, and checks the connection's peer is that process;
 *   3. speaks the vsock handshake (CONNECT <port> / OK <n>), its own HELLO
 *      sent in the same write;
 *   4. compares the guest's answer to that HELLO with the expected execution
 *      identity;
 * and only then relays the guest protocol both ways. When either side drops,
 * both are closed: a guest connection is never re-established behind the
 * caller's back. A refused connection receives one RESULT frame with id 0, a
 * negative status and the reason, then is closed.
 *
 * For a microVM (the qemu substrate) the listener is held by its vhost-user
 * vsock back-end (spaced-vsockd), and step 2 also checks the VM: the QEMU
 * process named by --vm-pid / --vm-start / --vm-exe is alive, the same
 * process (start time) running the same executable, and holds a Unix socket
 * whose peer the back-end holds (kernel evidence, unix_diag, that this
 * back-end serves that QEMU's guest memory); with --guest-cid the back-end
 * was started to serve exactly that guest CID (libspaced/vmcheck.h).
 *
 * With --handoff, step 5 is not a relay: the verified guest connection is
 * passed to the caller (host_client.h), which then has no hop in between.
 *
 * With `--identity -` the bridge listens at once but serves nothing until it
 * has read the identity it must reach as one line on standard input: a bridge
 * pre-started for a warm pool learns it when its execution is claimed.
 */
#ifndef SPACED_HOST_H
#define SPACED_HOST_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "identity.h"
#include "pidref.h"
#include "vmcheck.h"
#include "util.h"

struct host_config {
	const char *listen_path;                    /* the bridge's own socket */
	const char *guest_path;                     /* the guest-transport socket */
	uint32_t guest_port;                        /* vsock port of the guest agent */
	struct spaced_expected_listener launcher;   /* who must own guest_path */
	struct spaced_expected_caller manager;      /* who may call the bridge */
	struct spaced_vm_expected vm;               /* the VM the launcher serves, if any (vmcheck.h) */
	struct spaced_identity identity;            /* the execution it must reach */
	char identity_text[SPACED_IDENTITY_TEXT_MAX];
	int timeout_ms;                             /* for the handshake and HELLO */
	bool handoff;                               /* pass the verified guest connection on */
	int relay_spin_us;                          /* host_relay()'s spin_us */
};

/* Step 2: the checks of spaced_peer_connect_listener() (pidref.h) on
 * cfg->guest_path and cfg->launcher, every one of them at every call, then
 * connect(2). Keeps the launcher's pidfd and where its listening socket was
 * found between calls (verify.c says why that is sound). Returns 0 with a
 * connected socket in *fd_out, SPACED_EPEER with a reason in why,
 * SPACED_EINVAL or SPACED_ESYS. Thread-safe. */
int host_connect_listener(const struct host_config *cfg, int *fd_out, char *why, size_t whysz);

/* The same checks without connecting, run once at start so that the first
 * connection finds the launcher pinned and its listening socket located (a
 * warm-pool bridge does it before its claim). Returns 0 or what
 * host_connect_listener() would; a failure here refuses nothing by itself. */
int host_prepare_listener(const struct host_config *cfg, char *why, size_t whysz);

/* Runs the checks of steps 2–4 above and returns a connected, verified guest
 * stream (after the handshake and HELLO) in *fd_out. With caller >= 0 (relay
 * mode), a bare HELLO that is already the caller's first frame is taken and
 * sent as the bridge's own, and the checked answer is appended to *answer
 * (whole frame), for the caller to receive before anything relayed: one round
 * trip to the guest instead of two. On failure returns SPACED_EPEER,
 * SPACED_EIDENTITY, SPACED_EPROTO, SPACED_ETIMEDOUT … with a one-line reason
 * in why. */
int host_open_guest(const struct host_config *cfg, int caller, struct spaced_buf *answer, int *fd_out,
                    char *why, size_t whysz);

/* The relay's two buffers (one per direction), kept by a serving thread
 * across the connections it serves. */
enum { HOST_RELAY_BUF = 64 * 1024 };
struct host_relay_bufs {
	uint8_t up[HOST_RELAY_BUF], down[HOST_RELAY_BUF];
};

/* Relays bytes between a and b in the calling thread until either side
 * closes or fails, then shuts both down and returns (the caller closes them).
 * One poll loop for both directions, HOST_RELAY_BUF per read; a direction
 * whose destination is full stops reading until it drains while the other
 * goes on. After bytes moved, it keeps checking both sides without sleeping
 * for up to spin_us microseconds (0: never) before it sleeps in poll. */
void host_relay(int a, int b, struct host_relay_bufs *bufs, int spin_us);

/* Hands the verified guest connection guest_fd to the caller on fd: one
 * HANDOFF frame (host_client.h) with the identity text and the descriptor.
 * Returns 0 or SPACED_EIO. */
int host_handoff(int fd, int guest_fd, const char *identity_text);

/* Sends the refusal frame (RESULT, id 0, status err, message why) on fd, best effort. */
void host_refuse(int fd, int err, const char *why, const char *identity_text);

#endif
