/*
 * qmp.h — a small blocking client of QEMU's machine protocol (QMP), for the
 * supervisor of a qemu substrate execution (spaced-vm).
 *
 * QMP is one JSON object per line over a Unix socket: a greeting, then
 * {"execute": CMD, "arguments": {…}, "id": N} answered by {"return": …, "id": N}
 * or {"error": {"class", "desc"}, "id": N}, with asynchronous {"event": …} lines
 * in between. QEMU runs guest code, so what it sends is treated as untrusted
 * input: lines are bounded (QMP_LINE_MAX), parsed strictly (duplicate keys
 * refused), answers matched by id, and every wait has a deadline.
 *
 * Functions return 0 or a negative SPACED_E* code; outputs are written only
 * on success. Not thread-safe: one client per thread.
 */
#ifndef SPACED_QMP_H
#define SPACED_QMP_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define QMP_LINE_MAX (64u * 1024u)

struct qmp;

/* Connects to the QMP socket at path (retrying while it does not exist or
 * refuses, up to timeout_ms), reads the greeting and leaves capability
 * negotiation mode. Returns 0 with *out set, SPACED_ETIMEDOUT, SPACED_EPROTO
 * (not a QMP greeting), SPACED_ECLOSED, SPACED_ETOOBIG, SPACED_ENOMEM,
 * SPACED_ESYS. */
int qmp_open(const char *path, int timeout_ms, struct qmp **out);

/* The same on a socket already connected to QEMU's QMP (the client owns fd
 * from now on, and closes it on failure too). */
int qmp_adopt(int fd, int timeout_ms, struct qmp **out);

/* Runs command cmd with args (a JSON object, stolen; NULL for none) and waits
 * up to timeout_ms for its answer, skipping events. On success *ret (when not
 * NULL) receives a new reference to the "return" value. An "error" answer is
 * SPACED_EPERM with QEMU's description in why. Other failures: SPACED_ETIMEDOUT,
 * SPACED_ECLOSED, SPACED_EPROTO, SPACED_ETOOBIG, SPACED_ENOMEM; after them the
 * client is unusable (close it). */
int qmp_exec(struct qmp *q, const char *cmd, json_t *args, int timeout_ms, json_t **ret, char *why,
             size_t whysz);

/* The same, with descriptor fd passed along with the command (SCM_RIGHTS):
 * QMP "getfd" and "add-fd" take theirs that way. fd stays the caller's. */
int qmp_exec_fd(struct qmp *q, const char *cmd, json_t *args, int fd, int timeout_ms, json_t **ret, char *why,
                size_t whysz);

/* Reads and discards what QEMU sent unasked (events) without waiting.
 * Returns 0, or SPACED_ECLOSED when QEMU closed the socket (or it failed),
 * SPACED_ETOOBIG / SPACED_EPROTO on a bad line. */
int qmp_drain(struct qmp *q);

/* The socket, for poll(). */
int qmp_fd(const struct qmp *q);

/* Closes; NULL is fine. */
void qmp_close(struct qmp *q);

#endif
