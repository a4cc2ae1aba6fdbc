/*
 * host_client.h — how a sandbox manager reaches an execution through its
 * spaced-host bridge (B1–B3).
 *
 * The manager connects to the bridge's socket. The bridge verifies the manager
 * and the guest endpoint, then either
 *   - relays: the connection itself now speaks the guest protocol; or
 *   - hands off (spaced-host --handoff): it sends one HANDOFF frame (type
 *     SPACED_HOST_HANDOFF, id 0, payload: the verified identity text) carrying
 *     the verified guest connection as an SCM_RIGHTS descriptor, and closes its
 *     own copies. The manager then talks to the guest with no hop in between;
 *     every new connection still passes through the bridge's checks.
 * A refusal is a RESULT frame with id 0, a negative status and the reason.
 */
#ifndef SPACED_HOST_CLIENT_H
#define SPACED_HOST_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

#define SPACED_HOST_HANDOFF 0x02FF

/* Connects to the bridge at path and returns in *fd a stream that speaks the
 * guest protocol with the verified execution: the bridge connection (relay)
 * or the handed-off guest connection (handoff), whichever the bridge does.
 * In relay mode the bridge's verdict arrives with the first answer; in
 * handoff mode this call waits for it (timeout_ms). Returns 0, SPACED_EPEER /
 * SPACED_EIDENTITY … (the bridge's refusal, reason in why), SPACED_ESYS,
 * SPACED_ETIMEDOUT. */
int spaced_host_connect(const char *path, bool expect_handoff, int timeout_ms, int *fd, char *why,
                        size_t whysz);

#endif
