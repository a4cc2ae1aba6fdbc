/*
 * mgr_vm.c — executions of the qemu substrate (docs/substrate.md "The qemu
 * substrate"): a microVM supervised by spaced-vm in STATE/exec/<sandbox>.<gen>
 * (spaced-vmm/vm.h), reached only through its own spaced-host bridge, which
 * pins spaced-vsockd (the process holding the guest transport's hybrid
 * socket) as the listener and QEMU as the VM whose guest memory that
 * back-end serves (B1, B2; libspaced/vmcheck.c).
 *
 * Pause, thaw, usage, snapshot and stop go through spaced-vm's control socket,
 * which speaks the same commands as spaced-launch's (mgr_exec.c picks the
 * binary by the record's substrate). Each execution runs as the base uid of
 * its own uid range, and its guest CID is derived from that range's slot, so
 * no two live executions on this host share either.
 */
#include "mgr.h"
#include "node.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "spaced_error.h"
#include "net.h"
#include "pidref.h"
#include "vm.h"

/* How long a VM may take to boot to its guest's HELLO (TCG on a loaded machine). */
#define VM_BOOT_TIMEOUT_MS 180000
/* Where each VM's own directory is (sockets, disk): RUN/<uid base>, reachable
 * by the execution's uid (the worker's state directory is not). The uid range
 * is the execution's alone on this host while it lives (its lock). */
#define VM_RUN_ROOT "/run/spaced/vm"
/* The guests' RAM files (spaced-vm's default --ram-dir, on tmpfs). */
#define VM_RAM_FILES "/dev/shm/spaced-vm"

static int run_dir(const struct mgr_rec *rec, char *out, size_t outsz)
{
	int n = snprintf(out, outsz, "%s/%u", VM_RUN_ROOT, (unsigned)rec->uid_base);
	return (n < 0 || (size_t)n >= outsz) ? SPACED_EINVAL : 0;
}

bool mgr_vm_is(const struct mgr_rec *rec)
{
	return strcmp(rec->r.id.substrate, "qemu") == 0;
}

bool mgr_vm_offered(const struct mgr_config *cfg)
{
	return cfg->vm_bin != NULL && cfg->vm_images != NULL && cfg->host_bin != NULL && cfg->launch_bin != NULL;
}

/* The guest CID of an execution: 3 + the slot of its uid range. */
static uint32_t vm_cid(const struct mgr_config *cfg, const struct mgr_rec *rec)
{
	return 3u + (rec->uid_base - cfg->uid_first) / 65536u;
}

/* The parent pid of pid (from /proc/PID/status), 0 when unknown. */
static pid_t parent_of(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	const char *p = strstr(buf, "\nPPid:");
	int pp = 0;
	if (p == NULL || sscanf(p + 6, "%d", &pp) != 1)
		return 0;
	return pp;
}

/* A child of the supervisor, alive, with the start time it recorded. */
static int child_pinned(const struct mgr_rec *rec, pid_t pid, uint64_t start)
{
	uint64_t st;
	if (spaced_proc_start_time(pid, &st) < 0 || st != start || parent_of(pid) != (pid_t)rec->pid)
		return SPACED_EPEER;
	return 0;
}

int mgr_vm_bridge(const struct mgr_config *cfg, struct mgr_rec *rec)
{
	char e_dir[4096], gsock[4200], sock[256], logp[4096], text[SPACED_IDENTITY_TEXT_MAX];
	char vpid[32], vstart[32], qpid[32], qstart[32], owner[32], cid[16], muid[32], mpid[32], mstart[32];
	pid_t vp, qp;
	uint64_t vs, qs, sup;
	int e = mgr_exec_dir(cfg, rec, e_dir, sizeof e_dir);
	if (e == 0)
		e = mgr_exec_target(cfg, rec, sock, sizeof sock);
	if (e < 0 || spaced_identity_encode(&rec->r.id, text, sizeof text) < 0)
		return SPACED_EINVAL;
	/* the two processes are the supervisor's children, as it recorded them:
	 * nothing else is named to the bridge */
	if ((e = vm_read_pids(e_dir, &vp, &vs, &qp, &qs)) < 0)
		return e;
	if (spaced_proc_start_time((pid_t)rec->pid, &sup) < 0 || sup != rec->pid_start ||
	    child_pinned(rec, vp, vs) < 0 || child_pinned(rec, qp, qs) < 0)
		return SPACED_EPEER;
	pid_t caller = cfg->exe_pid ? cfg->exe_pid : getpid();
	uint64_t me = cfg->exe_pid ? cfg->exe_start : 0;
	if (!cfg->exe_pid && spaced_proc_start_time(caller, &me) < 0)
		return SPACED_ESYS;
	char rdir[128];
	if (run_dir(rec, rdir, sizeof rdir) < 0)
		return SPACED_EINVAL;
	snprintf(gsock, sizeof gsock, "%s/guest.sock", rdir);
	snprintf(logp, sizeof logp, "%s/log/%s.log", cfg->state_dir, rec->r.id.sandbox);
	snprintf(vpid, sizeof vpid, "%d", (int)vp);
	snprintf(vstart, sizeof vstart, "%" PRIu64, vs);
	snprintf(qpid, sizeof qpid, "%d", (int)qp);
	snprintf(qstart, sizeof qstart, "%" PRIu64, qs);
	snprintf(owner, sizeof owner, "%u", (unsigned)rec->uid_base);
	snprintf(cid, sizeof cid, "%u", vm_cid(cfg, rec));
	snprintf(muid, sizeof muid, "%u", (unsigned)geteuid());
	snprintf(mpid, sizeof mpid, "%d", (int)caller);
	snprintf(mstart, sizeof mstart, "%" PRIu64, me);
	unlink(sock);
	const char *argv[] = {cfg->host_bin, "--listen", sock, "--guest", gsock, "--identity", text,
	                      "--launcher-pid", vpid, "--launcher-start", vstart, "--launcher-exe", cfg->vsockd_bin,
	                      "--guest-owner", owner, "--vm-pid", qpid, "--vm-start", qstart, "--vm-exe",
	                      cfg->qemu_bin, "--guest-cid", cid, "--manager-uid", muid, "--manager-pid", mpid,
	                      "--manager-start", mstart, "--timeout-ms", "10000", "--handoff", NULL};
	int64_t hp;
	uint64_t hs;
	e = mgr_spawn_ready(argv, logp, sock, true, 10000, false, &hp, &hs);
	if (e < 0)
		return e;
	rec->host_pid = hp;
	rec->host_start = hs;
	return 0;
}

int mgr_vm_start(const struct mgr_config *cfg, struct mgr_rec *rec, const char *snapshot)
{
	char e_dir[4096], ready[4200], logp[4096], dir[4096], text[SPACED_IDENTITY_TEXT_MAX];
	char cpus[16], mem[24], pids[24], disk[24], disk_bps[24], disk_iops[24], uid[16], cid[16], net[48], ga[16], gw[16];
	if (!mgr_vm_offered(cfg))
		return SPACED_EINVAL;
	int e = mgr_exec_dir(cfg, rec, e_dir, sizeof e_dir);
	if (e < 0 || spaced_identity_encode(&rec->r.id, text, sizeof text) < 0)
		return SPACED_EINVAL;
	if (rec->uid_base < cfg->uid_first)
		return SPACED_EINVAL; /* every execution has a uid range of its own */
	if (rec->tmpl[0])
		return SPACED_EINVAL; /* the control plane refuses it first (docs/substrate.md) */
	const char *sub[] = {"exec", "run", "log"};
	for (size_t i = 0; i < 3; i++) {
		snprintf(dir, sizeof dir, "%s/%s", cfg->state_dir, sub[i]);
		if ((e = mgr_mkdirs(dir)) < 0)
			return e;
	}
	char rdir[128];
	if ((e = run_dir(rec, rdir, sizeof rdir)) < 0)
		return e;
	if ((mkdir("/run/spaced", 0755) < 0 && errno != EEXIST) || (mkdir(VM_RUN_ROOT, 0711) < 0 && errno != EEXIST) ||
	    chmod(VM_RUN_ROOT, 0711) < 0)
		return SPACED_ESYS;
	/* a generation starts from nothing but its snapshot */
	const char *rm[] = {"rm", "-rf", "--", e_dir, NULL};
	mgr_run_wait(rm);
	snprintf(ready, sizeof ready, "%s/ready", e_dir);
	snprintf(logp, sizeof logp, "%s/log/%s.log", cfg->state_dir, rec->r.id.sandbox);
	snprintf(uid, sizeof uid, "%u", (unsigned)rec->uid_base);
	snprintf(cid, sizeof cid, "%u", vm_cid(cfg, rec));
	const char *argv[48] = {cfg->vm_bin, "--state", e_dir, "--images", cfg->vm_images, "--identity", text,
	                        "--uid", uid, "--cid", cid, "--vsockd", cfg->vsockd_bin, "--qemu", cfg->qemu_bin,
	                        "--run-dir", rdir};
	size_t n = 17;
	if (cfg->vm_accel) {
		argv[n++] = "--accel";
		argv[n++] = cfg->vm_accel;
	}
	if (cfg->uid_lock_dir) {
		argv[n++] = "--uid-lock";
		argv[n++] = cfg->uid_lock_dir;
	}
	char lease[PATH_MAX];
	if (cfg->fence_after_s > 0) {
		/* the worker's lease: spaced-vm stops the VM once it ended with
		 * no gate to do so */
		snprintf(lease, sizeof lease, "%s/lease", cfg->state_dir);
		argv[n++] = "--lease-file";
		argv[n++] = lease;
	}
	/* the limits it runs under: vCPUs (and a CPU quota for fractions),
	 * guest memory, tasks inside the guest, the disk's size */
	if (rec->res.cpu_milli) {
		spaced_cpus_format(rec->res.cpu_milli, cpus);
		argv[n++] = "--cpus";
		argv[n++] = cpus;
	}
	if (rec->res.memory_bytes) {
		snprintf(mem, sizeof mem, "%" PRIu64, rec->res.memory_bytes);
		argv[n++] = "--memory";
		argv[n++] = mem;
	}
	if (rec->res.pids) {
		snprintf(pids, sizeof pids, "%" PRIu64, rec->res.pids);
		argv[n++] = "--pids";
		argv[n++] = pids;
	}
	if (rec->res.disk_bytes) {
		snprintf(disk, sizeof disk, "%" PRIu64, rec->res.disk_bytes);
		argv[n++] = "--disk";
		argv[n++] = disk;
	}
	if (cfg->disk_bps) {
		snprintf(disk_bps, sizeof disk_bps, "%" PRIu64, cfg->disk_bps);
		argv[n++] = "--disk-bps";
		argv[n++] = disk_bps;
	}
	if (cfg->disk_iops) {
		snprintf(disk_iops, sizeof disk_iops, "%" PRIu64, cfg->disk_iops);
		argv[n++] = "--disk-iops";
		argv[n++] = disk_iops;
	}
	if (snapshot) {
		argv[n++] = "--restore";
		argv[n++] = snapshot;
	}
	/* the sandbox's settings (env, workdir, user), in a file of the
	 * execution's directory: not on a command line every user can read */
	char cfgp[4200];
	if (rec->config[0]) {
		snprintf(cfgp, sizeof cfgp, "%s/config", e_dir);
		int fd = -1;
		if ((mkdir(e_dir, 0711) < 0 && errno != EEXIST) ||
		    (fd = open(cfgp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0 ||
		    write(fd, rec->config, strlen(rec->config)) != (ssize_t)strlen(rec->config)) {
			if (fd >= 0)
				close(fd);
			return SPACED_ESYS;
		}
		close(fd);
		argv[n++] = "--config-file";
		argv[n++] = cfgp;
	}
	/* its egress link's addresses (net.h; the slot is the uid range's) */
	if (net_vm_addresses(cfg, rec, ga, gw) == 0) {
		snprintf(net, sizeof net, "%s/30,%s", ga, gw);
		argv[n++] = "--net";
		argv[n++] = net;
	}
	argv[n] = NULL;
	int64_t sp;
	uint64_t ss;
	e = mgr_spawn_ready(argv, logp, ready, false, VM_BOOT_TIMEOUT_MS, true, &sp, &ss);
	if (e < 0)
		return e;
	struct mgr_rec r = *rec;
	r.pid = sp;
	r.pid_start = ss;
	/* the egress link under the sandbox's policy, in QEMU's network namespace,
	 * before any request can reach the VM; without it the VM's network leads
	 * nowhere (closed, never open) */
	pid_t vp, qp;
	uint64_t vs, qs;
	char nwhy[256] = "";
	if (vm_read_pids(e_dir, &vp, &vs, &qp, &qs) == 0 && child_pinned(&r, qp, qs) == 0 &&
	    net_attach_vm(cfg, &r, qp, nwhy, sizeof nwhy) < 0)
		fprintf(stderr, "spaced-executor level=error event=net-attach-failed sandbox=%s reason=\"%s\"\n",
		        rec->r.id.sandbox, nwhy);
	e = mgr_vm_bridge(cfg, &r);
	if (e < 0) {
		mgr_stop_pinned(sp, ss, true);
		return e;
	}
	/* its ServicePort gateway: the same back-end and VM checks as the
	 * bridge's, the guest's forward port behind them (docs/network.md) */
	char gsock[200];
	if (vm_read_pids(e_dir, &vp, &vs, &qp, &qs) == 0) {
		snprintf(gsock, sizeof gsock, "%s/guest.sock", rdir);
		struct mgr_gw_guest g = {.sock = gsock, .pid = vp, .start = vs, .exe = cfg->vsockd_bin,
		                         .owner = r.uid_base, .vm_pid = qp, .vm_start = qs, .vm_exe = cfg->qemu_bin,
		                         .cid = vm_cid(cfg, &r), .fwd_port = VM_FWD_PORT};
		if (mgr_gateway_start(cfg, &r, logp, &g) < 0)
			fprintf(stderr, "spaced-executor level=warn event=gateway-failed sandbox=%s\n", r.r.id.sandbox);
	}
	*rec = r;
	return 0;
}

void mgr_vm_reap(const struct mgr_config *cfg)
{
	if (!mgr_vm_offered(cfg) || cfg->uid_lock_dir == NULL)
		return;
	for (uint32_t k = 0; k < cfg->uid_slots; k++) {
		char dir[128], lock[4096];
		uint32_t base = cfg->uid_first + k * 65536u;
		struct stat st;
		snprintf(dir, sizeof dir, "%s/%u", VM_RUN_ROOT, (unsigned)base);
		if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
			continue;
		snprintf(lock, sizeof lock, "%s/%u.lock", cfg->uid_lock_dir, (unsigned)base);
		int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0)
			continue;
		if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
			/* nobody runs this range: what is there is left over */
			const char *rm[] = {"rm", "-rf", "--", dir, NULL};
			mgr_run_wait(rm);
			char ram[128];
			snprintf(ram, sizeof ram, "%s/%u.ram", VM_RAM_FILES, (unsigned)base);
			unlink(ram);
			snprintf(ram, sizeof ram, "%s/%u-template.ram", VM_RAM_FILES, (unsigned)base);
			unlink(ram);
		}
		close(fd);
	}
}
