/*
 * vm.h — spaced-vm, the supervisor of one `qemu` substrate execution
 * (docs/substrate.md "The qemu substrate").
 *
 *   spaced-vm --state DIR --images DIR --identity TEXT [--cid N] [--port N]
 *             [--cpus N] [--memory SIZE] [--pids N] [--disk SIZE] [--uid N]
 *             [--restore SNAPDIR] [--qemu PATH] [--vsockd PATH] [--accel tcg|kvm]
 *             [--machine pc|microvm] [--no-template] [--net ADDRESS/PREFIX,GATEWAY]
 *             [--boot-timeout-ms MS] [--uid-lock DIR] [--run-dir DIR] [--ram-dir DIR]
 *             [--kernel-args ARGS] [--keep-state]
 *   spaced-vm template --state DIR --images DIR --out DIR [the shape's options]
 *   spaced-vm ctl --state DIR PAUSE | THAW | STATUS | USAGE | STOP | SNAPSHOT DIR
 *
 * It plays for a VM the part spaced-launch plays for the process substrate:
 * it makes the execution's disk (a qcow2 overlay over a base image of the
 * worker's root tree or over a booted template's disk, or a copy of a
 * snapshot's disk) and its RAM file (tmpfs), starts spaced-vsockd (the
 * vhost-user vsock back-end holding the guest transport's hybrid socket
 * RUN/guest.sock; RUN is --run-dir, by default DIR/vm) and QEMU (a pc machine
 * in a network namespace of its own: the execution's vCPUs and memory, the
 * disk as virtio-blk, a NIC on a bridged tap, vhost-user-vsock), both as the
 * execution's own uid and in a cgroup with its limits; a VM from a template
 * or a memory snapshot loads the saved device state and gets its vsock
 * device plugged and its identity given on the guest's control port. It
 * waits until the guest answers HELLO with the expected identity, then
 * writes DIR/pids and DIR/ready, prints "READY <ms>" and serves control
 * commands on DIR/control.sock (SOCK_SEQPACKET, root or its own uid only)
 * until told to stop or until QEMU or spaced-vsockd ends (then the other is
 * stopped too). vm_int.h lists its files.
 *
 * DIR/pids names the two processes a bridge must pin (B1, B2):
 *   vsockd PID START\n  qemu PID START\n   (START: /proc/PID/stat field 22)
 * both children of spaced-vm.
 */
#ifndef SPACED_VM_H
#define SPACED_VM_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* The vsock port spaced-guest listens on inside the VM (guest_proto.h). */
#define VM_GUEST_PORT_DEFAULT 1024
/* The vsock port of the guest's ServicePort forwarding (spaced-guest/fwd.c):
 * spaced-netgtw reaches a VM's ports through it. */
#define VM_FWD_PORT 1025
/* Control messages are at most this long. */
#define VM_MSG_MAX 1024

/* Reads STATE/pids: the back-end's and QEMU's pid and start time. Returns 0,
 * SPACED_ENOENT (no file), SPACED_EPROTO (malformed). */
int vm_read_pids(const char *state, pid_t *vsockd, uint64_t *vsockd_start, pid_t *qemu, uint64_t *qemu_start);

#endif
