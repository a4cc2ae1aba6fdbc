/*
 * vm_int.h — private header of spaced-vm, the supervisor of one qemu
 * substrate execution (vm.h). One process, one VM; its state is the single
 * `struct vm V`. Files:
 *   vm.c        the command line, start-up, the control loop, the ending
 *   vm_disk.c   base images, overlays, snapshots' disks and meta, templates' paths
 *   vm_qemu.c   QEMU's command line, spawning, and the QMP-driven operations:
 *               incoming memory, vsock hot-plug, migration to a file
 *   vm_guest.c  the guest as the host reaches it: HELLO, control port, sync
 */
#ifndef SPACED_VM_INT_H
#define SPACED_VM_INT_H

#include <limits.h>

#include "lease.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "identity.h"
#include "qmp.h"
#include "sub_internal.h"
#include "vm.h"

#define VM_LOG_MAX (1u << 20)           /* per log file */
#define VM_MEMORY_MIN (64ull << 20)
#define VM_HOST_OVERHEAD (384ull << 20) /* QEMU and the back-end beside guest RAM */
/* Kernel arguments that take work off a boot and off a hot-plug under TCG
 * (docs/substrate.md "Boot time"): the crypto self-tests (≈ 0.5 s; they
 * check the kernel's own implementations, nothing a tenant gives), the
 * SP800-108 KDF's self-test and kprobe tracing's set-up (initcalls that only
 * test or prepare tracing). On the pc machine, PCI interrupts are routed
 * from the firmware's table instead of ACPI's (_PRT, link devices): each
 * virtio device's interrupt link cost 0.2–0.5 s of AML at boot, and the
 * same again for the vsock device plugged into a VM made from a template.
 * Devices use MSI-X; hot-plug itself stays ACPI's. */
#define VM_BOOT_ARGS "cryptomgr.notests initcall_blacklist=crypto_kdf108_init,init_kprobe_trace"
#define VM_BOOT_ARGS_PC "acpi=noirq"
#define VM_TB_SIZE_MB 64                /* TCG translation cache (QEMU's default is 1 GiB) */
#define VM_QEMU_TASKS 256               /* QEMU's threads and the back-end */
#define VM_SYNC_TIMEOUT_MS 5000
#define VM_QMP_TIMEOUT_MS 5000
#define VM_QMP_PROBE_MS 1000            /* the periodic look at the vsock driver: skipped when slower */
#define VM_UNPLUG_TIMEOUT_MS 10000      /* the guest acknowledging the vsock device's removal */
#define VM_TRANSPORT_CHECK_MS 2000      /* how often a running guest's vsock driver is looked at */
#define VM_TRANSPORT_GRACE_MS 30000     /* a running guest without it this long is stopped (a starved guest binds late) */
#define VM_MIGRATE_TIMEOUT_MS 120000
#define VM_CTL_PORT 1023                /* spaced-guest's control port (spaced-guest/vctl.c) */
#define VM_RAM_DIR "/dev/shm/spaced-vm"  /* guests' RAM files (tmpfs), default of --ram-dir */
#define VM_MAX_CTL 8

/* The machine QEMU emulates. pc (i440fx, ACPI PCI hot-plug) lets the vsock
 * device be unplugged before a memory snapshot and plugged again after a
 * restore; microvm cannot, so its snapshots hold the disk only. */
enum vm_machine { VM_PC = 0, VM_MICROVM };

struct logsink {
	int rd; /* read end of the pipe, -1 when closed */
	int fd; /* the log file */
	uint64_t written;
	bool capped;
	const char *name;
};

/* What a snapshot directory's meta says (vm_disk.c). A snapshot with memory
 * holds DIR/ram (the guest's RAM as a sparse file) and DIR/state (QEMU's
 * device state, saved with x-ignore-shared: the RAM is not in it). */
struct vm_snapmeta {
	struct spaced_identity id; /* sandbox and generation "" / 0 for a template */
	bool memory;               /* DIR/ram and DIR/state hold the VM's memory and device state */
	enum vm_machine machine;
	uint64_t memory_bytes, disk_bytes;
	uint32_t vcpus;
};

struct vm {
	char state[PATH_MAX];
	char vmdir[PATH_MAX]; /* RUN: the execution's uid's own directory */
	char images[PATH_MAX];
	const char *qemu_bin, *vsockd_bin, *accel, *restore, *uid_lock, *run_dir, *kernel_args, *ram_dir;
	/* --lease-file: the worker's lease; the VM is stopped once it ended
	 * with no gate to fence (lease.h) */
	struct spaced_lease_watch lease;
	bool lease_stop_failed; /* the last stop for the lease failed (logged once) */
	char net_addr[24], net_gw[16]; /* the guest's egress address (a.b.c.d/p) and gateway, "" when none */
	char ram_path[PATH_MAX];  /* the guest's RAM: a file on tmpfs, shared with the back-end */
	enum vm_machine machine;
	/* files opened by this process and handed to QEMU as descriptors (-1: none):
	 * the kernel, the initramfs, the disk's backing image, the guest's RAM
	 * file, and the device state to load (-incoming) */
	int kernel_fd, initrd_fd, base_fd, ram_fd, state_fd;
	int ram_src_fd;           /* saved RAM (a snapshot's or template's) copied into the RAM file */
	const char *base_fmt;   /* the base_fd image's format: "raw" (base image) or "qcow2" (a template's disk) */
	bool have_identity;     /* false while booting a template */
	bool need_identity;     /* the guest learns its identity on its control port (restored memory) */
	bool template_build;    /* this process builds a template (spaced-vm template) */
	bool no_template;
	char template_dir[PATH_MAX]; /* the template this VM was made from, "" when none */
	struct spaced_identity id;
	char idtext[SPACED_IDENTITY_TEXT_MAX];
	char *config; /* the sandbox's settings for its guest (JSON, --config-file), NULL when none */
	uint32_t cid, port, cpu_milli;
	uint64_t memory, pids, disk;
	uint64_t disk_bps, disk_iops; /* the guest's disk reads and writes per second, apart (0: none) */
	uid_t uid;
	int boot_timeout_ms;
	bool keep_state;
	struct sub_cgroup cg;
	bool have_cg;
	pid_t qemu, vsockd;
	uint64_t qemu_start, vsockd_start;
	struct qmp *qmp;
	int ctl_lfd, sigfd;
	int ctl[VM_MAX_CTL];
	int nctl;
	struct logsink con, diag;
	bool paused, stop, ready, vsock_plugged;
	uint64_t t0;
	uint64_t cpu_at_ns, cpu_at_usec;
	uint32_t cpu_pct_x10;
	uint64_t transport_at_ns, transport_lost_ns; /* the last look at the guest's vsock driver; since when it is gone */
};

extern struct vm V;

/* ---- vm.c: small helpers ---- */
void vm_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t vm_ms_since(uint64_t t0);
void vm_sleep_ms(int ms);
/* Writes dir/name (through a temporary file, fsync'd, renamed). */
int vm_write_file(const char *dir, const char *name, const char *text, mode_t mode);
/* Runs argv as root to completion, stderr to the diagnostics log; 0 on exit 0. */
int vm_run_tool(const char *const argv[]);
/* Starts argv as the execution's uid in its cgroup, stdout/stderr to
 * out_fd/err_fd, with keep[0..nkeep) as its descriptors 3, 4, …; killed with
 * this process. before (may be NULL) runs in the child as root just before
 * it gives its privileges up; a non-zero return ends the child. */
int vm_spawn(const char *const argv[], int out_fd, int err_fd, const int *keep, int nkeep, int (*before)(void),
             pid_t *pid, uint64_t *start, char *why, size_t whysz);
/* Runs argv like vm_spawn and waits for it; 0 on exit 0. */
int vm_spawn_wait(const char *const argv[], const int *keep, int nkeep, char *why, size_t whysz);
/* Whether child p has ended (reaping it). */
bool vm_child_gone(pid_t p);

/* ---- vm_disk.c ---- */
/* The execution's disk in RUN/disk.qcow2 from a snapshot, a template or the
 * base image for V.disk; sets V.base_fd / V.base_fmt, and V.state_fd /
 * V.ram_src_fd when the VM starts from saved memory. */
int vm_make_disk(char *why, size_t whysz);
/* The guest's RAM file (V.ram_path, V.ram_fd): new and empty (sparse), with
 * the saved RAM of V.ram_src_fd copied in when there is one (by a child in
 * the VM's cgroup, which the pages are charged to; zero pages stay holes). */
int vm_make_ram(char *why, size_t whysz);
/* Copies the RAM file into dst (sparse: zero pages are holes). */
int vm_save_ram(const char *dst, char *why, size_t whysz);
/* Reads and checks DIR/meta. Returns 0, SPACED_ENOENT, SPACED_EPROTO (reason in why). */
int vm_read_meta(const char *dir, struct vm_snapmeta *m, char *why, size_t whysz);
/* Writes DIR/meta for this VM (memory: whether DIR/memory was saved). */
int vm_write_meta(const char *dir, bool memory);
/* Writes the (stopped) VM's disk as one standalone qcow2 image at dst. */
int vm_save_disk(const char *dst, char *why, size_t whysz);
/* IMAGES/cache/template-<key>: the template for this VM's machine, memory,
 * vCPUs, disk size and QEMU binary. */
int vm_template_path(char *out, size_t outsz);

/* ---- vm_qemu.c ---- */
int vm_start_vsockd(int err_fd, char *why, size_t whysz);
/* Starts QEMU (to load V.state_fd when it is open: -incoming defer, and
 * without the vsock device, which vm_vsock_plug adds). */
int vm_start_qemu(int out_fd, int err_fd, char *why, size_t whysz);
/* One QMP command without arguments or answer; a QEMU that does not answer
 * is not asked again. */
int vm_qmp(const char *cmd, char *why, size_t whysz);
/* Loads V.state_fd (the RAM is already in the RAM file) and waits until done. */
int vm_load_state(char *why, size_t whysz);
/* Turns on x-ignore-shared (the RAM file is not part of saved state). */
int vm_qmp_setup(char *why, size_t whysz);
/* Adds / removes the vsock device (pc); removal waits for the guest to let it go. */
int vm_vsock_plug(char *why, size_t whysz);
int vm_vsock_unplug(char *why, size_t whysz);
/* Whether the guest's vsock driver holds the device (virtio DRIVER_OK) and
 * whether the VM runs, from QEMU (x-query-virtio-status). */
int vm_vsock_driver(bool *driver_ok, bool *running, char *why, size_t whysz);
/* Whether QEMU has the vsock device (qom-get of its path). */
int vm_vsock_present(bool *present, char *why, size_t whysz);
/* The guest's vsock driver is looked at afresh from now (a pause, a thaw, a
 * plug: the grace starts with a running VM that has the device). */
void vm_transport_reset(void);
/* Saves the stopped VM's device state into a new file at path (the RAM is
 * saved apart: vm_save_ram). */
int vm_save_state(const char *path, char *why, size_t whysz);

/* ---- vm_guest.c ---- */
/* HELLO answered with V's identity: 0, SPACED_EIDENTITY (why says what it
 * claimed), or a transport error while the guest is not up. */
int vm_guest_hello(char *why, size_t whysz);
/* One control-port exchange: sends line, reads one line back into answer,
 * all of it within timeout_ms: 0, SPACED_ECLOSED, SPACED_ETIMEDOUT,
 * SPACED_ETOOBIG, SPACED_EPROTO. */
int vm_guest_control(const char *line, char *answer, size_t answersz, int timeout_ms);
/* The guest's dirty pages to its disk (best effort). */
int vm_guest_sync(void);

#endif
