/*
 * vmcheck.h — a microVM's guest-transport back-end bound to its VM (B1, B2).
 *
 * For the qemu substrate the hybrid vsock socket (docs/vm-transport.md) is
 * held by spaced-vsockd, the VM's vhost-user vsock back-end. Whoever connects
 * to it (spaced-host, spaced-netgtw) first checks that back-end as the
 * listener's holder (pidref.h), then, here, that it serves the expected VM:
 *   1. QEMU (vm->pid) is the process pinned at the first call (pidfd; its
 *      start time compared once, so a reused PID never passes) and, with
 *      check_exe, runs the expected executable (dev/ino of /proc/PID/exe);
 *   2. the back-end holds a Unix socket connected to one QEMU holds (unix_diag
 *      peer): the vhost-user connection over which QEMU gave it the guest's
 *      memory. A back-end serving another VM fails here;
 *   3. with guest_cid, the back-end was started for exactly that guest CID.
 */
#ifndef SPACED_VMCHECK_H
#define SPACED_VMCHECK_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "pidref.h"
#include "util.h"

/* The VM behind a back-end; pid 0 and guest_cid 0: nothing to check. */
struct spaced_vm_expected {
	pid_t pid;           /* QEMU */
	uint64_t start_time;
	bool check_exe;
	struct spaced_exe_id exe;
	uint32_t guest_cid;  /* 0: not checked */
};

/* What is kept between calls: QEMU's pidfd, and where the link between the
 * back-end and QEMU was last found (looked at first; the full search of the
 * back-end's few descriptors runs when it no longer holds). */
struct spaced_vm_check {
	pthread_mutex_t lock;
	struct spaced_pidref qemu; /* pinned at the first call */
	int be_fd;                 /* the back-end's descriptor of its end of the link, -1: unknown */
	uint64_t be_ino;           /* that socket's inode */
	uint64_t qemu_ino;         /* its peer, which QEMU holds */
};
#define SPACED_VM_CHECK_INIT {PTHREAD_MUTEX_INITIALIZER, {.pid = 0, .pidfd = -1, .start_time = 0}, -1, 0, 0}

/* Checks 1–3 above for the back-end process `backend` (pinned, and verified
 * as the listener's holder by the caller), every one at every call. Returns 0
 * or SPACED_EPEER with a one-line reason in why. Thread-safe per vc. */
int spaced_vm_verify(struct spaced_vm_check *vc, const struct spaced_vm_expected *vm,
                     const struct spaced_pidref *backend, char *why, size_t whysz);

#endif
