/* vm_qemu.c — QEMU for a qemu substrate execution: its command line, the
 * back-end beside it, and what spaced-vm asks of it over QMP (vm_int.h). */
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "spaced_error.h"
#include "util.h"
#include "vm_int.h"

/* Fixed PCI slots (pc): a VM restored from a memory image must have its
 * devices where the saved one had them. */
#define PC_DISK_ADDR "0x3"
#define PC_VSOCK_ADDR "0x4"

static unsigned tsc_khz(void)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[256];
	unsigned khz = 0;
	while (f && fgets(line, sizeof line, f)) {
		double mhz;
		const char *colon = strchr(line, ':');
		if (strncmp(line, "cpu MHz", 7) == 0 && colon && sscanf(colon + 1, "%lf", &mhz) == 1) {
			khz = (unsigned)(mhz * 1000.0);
			break;
		}
	}
	if (f)
		fclose(f);
	return khz;
}

/* Waits until path is a socket (the back-end listens before it renames). */
static int wait_socket(const char *path, pid_t owner, int ms)
{
	for (int i = 0; i < ms / 10; i++) {
		struct stat st;
		if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
			return 0;
		if (vm_child_gone(owner))
			return SPACED_EIO;
		vm_sleep_ms(10);
	}
	return SPACED_ETIMEDOUT;
}

int vm_start_vsockd(int err_fd, char *why, size_t whysz)
{
	char vu[PATH_MAX + 16], uds[PATH_MAX + 16], cid[16];
	snprintf(vu, sizeof vu, "%s/vu.sock", V.vmdir);
	snprintf(uds, sizeof uds, "%s/guest.sock", V.vmdir);
	snprintf(cid, sizeof cid, "%u", V.cid);
	const char *argv[] = {V.vsockd_bin, "--socket", vu, "--uds", uds, "--cid", cid, NULL};
	int e = vm_spawn(argv, err_fd, err_fd, NULL, 0, NULL, &V.vsockd, &V.vsockd_start, why, whysz);
	if (e < 0)
		return e;
	if ((e = wait_socket(uds, V.vsockd, 10000)) < 0 || (e = wait_socket(vu, V.vsockd, 10000)) < 0)
		spaced_why(why, whysz, "spaced-vsockd did not listen");
	return e;
}

/* In QEMU's child, as root: a network namespace of its own holding only L2 —
 * the VM's tap (owned by the execution's uid, which QEMU opens) in a bridge
 * that spaced-node joins the egress link to (net.h: net_attach_vm). Until
 * then, or on a worker without egress, the VM's network leads nowhere. MTU
 * 65520 all the way, as on the egress link: pasta hands over segments that
 * large, and a 1500 hop would drop them. */
static int qemu_netns(void)
{
	if (unshare(CLONE_NEWNET) < 0)
		return 1;
	int fd = open("/proc/sys/net/ipv6/conf/all/disable_ipv6", O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		(void)!write(fd, "1\n", 2);
		close(fd);
	}
	fd = open("/proc/sys/net/ipv6/conf/default/disable_ipv6", O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		(void)!write(fd, "1\n", 2);
		close(fd);
	}
	char script[256];
	snprintf(script, sizeof script,
	         "link set lo up\nlink add br0 type bridge\ntuntap add dev tap0 mode tap user %u group %u\n"
	         "link set tap0 mtu 65520\nlink set tap0 master br0\nlink set tap0 up\nlink set br0 up\n",
	         (unsigned)V.uid, (unsigned)V.uid);
	int in[2];
	if (pipe(in) < 0)
		return 1;
	pid_t p = fork();
	if (p < 0)
		return 1;
	if (p == 0) {
		dup2(in[0], 0);
		close(in[0]);
		close(in[1]);
		execl("/usr/sbin/ip", "ip", "-batch", "-", (char *)NULL);
		execl("/sbin/ip", "ip", "-batch", "-", (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	ssize_t w = write(in[1], script, strlen(script));
	close(in[1]);
	int st;
	if (waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || w != (ssize_t)strlen(script))
		return 1;
	return 0;
}

int vm_start_qemu(int out_fd, int err_fd, char *why, size_t whysz)
{
	char accel[64], machine[128], mem[32], smp[16], obj[128], vuchar[PATH_MAX + 48], qmp[PATH_MAX + 48],
	    kernel[32], initrd[32], append[1400], basefile[96] = "", basenode[128] = "", diskfile[PATH_MAX + 96],
	    drive[256], blkdev[64], vsockdev[96], incoming[32], tgroup[160], tnode[128];
	uint64_t mib = V.memory >> 20;
	unsigned vcpus = (V.cpu_milli + 999) / 1000;
	if (vcpus == 0)
		vcpus = 1;
	bool pc = V.machine == VM_PC;
	/* the descriptors QEMU gets: 3, 4, … in this order */
	int keep[6], nkeep = 0;
	keep[nkeep++] = V.kernel_fd;
	snprintf(kernel, sizeof kernel, "/proc/self/fd/%d", 2 + nkeep);
	keep[nkeep++] = V.initrd_fd;
	snprintf(initrd, sizeof initrd, "/proc/self/fd/%d", 2 + nkeep);
	if (strcmp(V.accel, "tcg") == 0)
		snprintf(accel, sizeof accel, "tcg,tb-size=%d", VM_TB_SIZE_MB);
	else
		snprintf(accel, sizeof accel, "%s", V.accel);
	if (pc)
		snprintf(machine, sizeof machine, "pc,memory-backend=mem,usb=off,vmport=off");
	else
		snprintf(machine, sizeof machine, "microvm,pit=on,pic=on,rtc=on,acpi=on,memory-backend=mem");
	snprintf(mem, sizeof mem, "%" PRIu64, mib);
	snprintf(smp, sizeof smp, "%u", vcpus);
	/* the guest's RAM is a file on tmpfs shared with the back-end: saved with
	 * the VM apart from the device state (x-ignore-shared), and a VM made from
	 * saved memory starts with its pages in place, never touching the others */
	keep[nkeep++] = V.ram_fd;
	snprintf(obj, sizeof obj, "memory-backend-file,id=mem,size=%" PRIu64 "M,share=on,mem-path=/proc/self/fd/%d", mib,
	         2 + nkeep);
	/* the vhost-user connection is made here, in the host's network
	 * namespace, and handed to QEMU: a Unix connection's two sockets belong
	 * to the connecting side's namespace, and the bridge checks this one
	 * with unix_diag from the host's (libspaced/vmcheck.c) */
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int vufd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (vufd < 0)
		return SPACED_ESYS;
	if ((size_t)snprintf(sa.sun_path, sizeof sa.sun_path, "%.80s/vu.sock", V.vmdir) >= sizeof sa.sun_path ||
	    connect(vufd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		spaced_why(why, whysz, "connect %s: %s", sa.sun_path, strerror(errno));
		close(vufd);
		return SPACED_ESYS;
	}
	keep[nkeep++] = vufd;
	snprintf(vuchar, sizeof vuchar, "socket,id=vu,fd=%d", 2 + nkeep);
	snprintf(qmp, sizeof qmp, "unix:%s/qmp.sock,server=on,wait=off", V.vmdir);
	/* the disk's graph is given whole: nothing QEMU opens comes from a name
	 * written in an image's header (a backing or data file) */
	snprintf(diskfile, sizeof diskfile, "driver=file,filename=%s/disk.qcow2,node-name=diskfile,discard=unmap",
	         V.vmdir);
	if (V.base_fd >= 0) {
		keep[nkeep++] = V.base_fd;
		snprintf(basefile, sizeof basefile, "driver=file,filename=/proc/self/fd/%d,node-name=basefile,read-only=on",
		         2 + nkeep);
		if (strcmp(V.base_fmt, "qcow2") == 0)
			snprintf(basenode, sizeof basenode,
			         "{\"driver\":\"qcow2\",\"file\":\"basefile\",\"node-name\":\"base\",\"read-only\":true,"
			         "\"backing\":null}");
		else
			snprintf(basenode, sizeof basenode, "driver=raw,file=basefile,node-name=base,read-only=on");
		snprintf(drive, sizeof drive,
		         "{\"driver\":\"qcow2\",\"file\":\"diskfile\",\"backing\":\"base\",\"node-name\":\"disk\","
		         "\"discard\":\"unmap\"}");
	} else {
		snprintf(drive, sizeof drive,
		         "{\"driver\":\"qcow2\",\"file\":\"diskfile\",\"backing\":null,\"node-name\":\"disk\","
		         "\"discard\":\"unmap\"}");
	}
	/* the guest's disk I/O bounded like a process execution's (spaced-node
	 * --disk-io): a throttle node between the device and its image */
	bool throttled = V.disk_bps > 0 || V.disk_iops > 0;
	if (throttled) {
		int tn = snprintf(tgroup, sizeof tgroup, "throttle-group,id=io");
		if (V.disk_bps > 0)
			tn += snprintf(tgroup + tn, sizeof tgroup - (size_t)tn, ",x-bps-read=%" PRIu64 ",x-bps-write=%" PRIu64,
			               V.disk_bps, V.disk_bps);
		if (V.disk_iops > 0)
			snprintf(tgroup + tn, sizeof tgroup - (size_t)tn, ",x-iops-read=%" PRIu64 ",x-iops-write=%" PRIu64,
			         V.disk_iops, V.disk_iops);
		snprintf(tnode, sizeof tnode, "driver=throttle,throttle-group=io,file=disk,node-name=disk-io");
	}
	snprintf(blkdev, sizeof blkdev, "%s,drive=%s%s", pc ? "virtio-blk-pci" : "virtio-blk-device",
	         throttled ? "disk-io" : "disk", pc ? ",addr=" PC_DISK_ADDR : "");
	snprintf(vsockdev, sizeof vsockdev,
	         pc ? "vhost-user-vsock-pci,chardev=vu,id=vsock,addr=" PC_VSOCK_ADDR : "vhost-user-vsock-device,chardev=vu,id=vsock");
	unsigned khz = tsc_khz();
	char tsc[40] = "", ident[SPACED_IDENTITY_TEXT_MAX + 24] = "", net[64] = "";
	if (V.net_addr[0] && !V.need_identity)
		snprintf(net, sizeof net, " spaced.net=%s,%s", V.net_addr, V.net_gw);
	if (khz > 0)
		snprintf(tsc, sizeof tsc, " tsc_early_khz=%u", khz);
	if (V.have_identity && !V.need_identity)
		snprintf(ident, sizeof ident, " spaced.identity=%s", V.idtext);
	/* tsc=reliable: under TCG on a loaded host the TSC watchdog would move the
	 * guest to jiffies, a coarse clock. (init_on_free=1 would make saved
	 * memory smaller, 59 instead of 77 MB for a template, but the kernel then
	 * zeroes all of the guest's RAM at boot: every page touched on the host.)
	 * VM_BOOT_ARGS: what a cold boot and a hot-plug need not do (vm_int.h). */
	int an = snprintf(append, sizeof append,
	                  "console=ttyS0 quiet panic=-1 tsc=reliable " VM_BOOT_ARGS "%s%s%s%s%s%s spaced.port=%u spaced.ctlport=%u spaced.fwdport=%u spaced.pids=%" PRIu64,
	                  pc ? " " VM_BOOT_ARGS_PC : " pci=off", tsc, V.kernel_args ? " " : "", V.kernel_args ? V.kernel_args : "", ident, net,
	                  V.port, VM_CTL_PORT, VM_FWD_PORT, V.pids);
	if (an < 0 || (size_t)an >= sizeof append)
		return SPACED_ETOOBIG;
	const char *argv[64] = {V.qemu_bin, "-accel", accel, "-M", machine, "-m", mem, "-smp", smp, "-object", obj,
	                        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
	                        "-chardev", "stdio,id=con,signal=off", "-serial", "chardev:con",
	                        "-chardev", vuchar, "-qmp", qmp, "-kernel", kernel, "-initrd", initrd, "-append", append,
	                        "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"};
	size_t n = 0;
	while (argv[n] != NULL)
		n++;
	if (V.base_fd >= 0) { /* the backing node before the node that names it */
		argv[n++] = "-blockdev";
		argv[n++] = basefile;
		argv[n++] = "-blockdev";
		argv[n++] = basenode;
	}
	argv[n++] = "-blockdev";
	argv[n++] = diskfile;
	argv[n++] = "-blockdev";
	argv[n++] = drive;
	if (throttled) {
		argv[n++] = "-object";
		argv[n++] = tgroup;
		argv[n++] = "-blockdev";
		argv[n++] = tnode;
	}
	argv[n++] = "-device";
	argv[n++] = blkdev;
	/* the network card: on the tap of QEMU's own namespace (qemu_netns) */
	argv[n++] = "-netdev";
	argv[n++] = "tap,id=net0,ifname=tap0,script=no,downscript=no";
	argv[n++] = "-device";
	argv[n++] = pc ? "virtio-net-pci,netdev=net0,addr=0x5,mac=52:54:00:00:00:02"
	               : "virtio-net-device,netdev=net0,mac=52:54:00:00:00:02";
	if (pc) {
		/* a new generation ID at every start, restores included: the guest's
		 * kernel reseeds its random number generator when it changes (the
		 * clones of one template must not share it) */
		argv[n++] = "-device";
		argv[n++] = "vmgenid,guid=auto";
	}
	if (V.state_fd >= 0) {
		/* the saved VM had no vsock device (it was unplugged before the
		 * save): it is plugged once the state is loaded (vm_vsock_plug) */
		snprintf(incoming, sizeof incoming, "defer");
		argv[n++] = "-incoming";
		argv[n++] = incoming;
	} else {
		argv[n++] = "-device";
		argv[n++] = vsockdev;
	}
	argv[n] = NULL;
	int e = vm_spawn(argv, out_fd, err_fd, keep, nkeep, qemu_netns, &V.qemu, &V.qemu_start, why, whysz);
	close(vufd);
	if (e == 0)
		V.vsock_plugged = V.state_fd < 0;
	return e;
}

int vm_qmp(const char *cmd, char *why, size_t whysz)
{
	if (V.qmp == NULL) {
		spaced_why(why, whysz, "no QMP connection");
		return SPACED_ECLOSED;
	}
	int e = qmp_exec(V.qmp, cmd, NULL, VM_QMP_TIMEOUT_MS, NULL, why, whysz);
	if (e < 0 && e != SPACED_EPERM) {
		qmp_close(V.qmp); /* a QEMU that does not answer is not asked again */
		V.qmp = NULL;
	}
	return e;
}

/* query-migrate's status, "" when there is none yet. */
static int migrate_status(char *st, size_t stsz, char *why, size_t whysz)
{
	json_t *ret = NULL;
	if (V.qmp == NULL)
		return SPACED_ECLOSED;
	int e = qmp_exec(V.qmp, "query-migrate", NULL, VM_QMP_TIMEOUT_MS, &ret, why, whysz);
	if (e < 0)
		return e;
	const char *s = json_string_value(json_object_get(ret, "status"));
	snprintf(st, stsz, "%s", s ? s : "");
	json_decref(ret);
	return 0;
}

/* Polls query-migrate until completed (0) or failed, for at most ms. */
static int migrate_wait(int ms, char *why, size_t whysz)
{
	uint64_t deadline = spaced_mono_ns() + (uint64_t)ms * 1000000u;
	char st[32];
	while (spaced_mono_ns() < deadline) {
		int e = migrate_status(st, sizeof st, why, whysz);
		if (e < 0)
			return e;
		if (strcmp(st, "completed") == 0)
			return 0;
		if (strcmp(st, "failed") == 0 || strcmp(st, "cancelled") == 0) {
			spaced_why(why, whysz, "migration %s (see vm.log)", st);
			return SPACED_EIO;
		}
		if (vm_child_gone(V.qemu)) {
			V.qemu = 0;
			spaced_why(why, whysz, "QEMU ended during the migration (see vm.log)");
			return SPACED_EIO;
		}
		vm_sleep_ms(5);
	}
	spaced_why(why, whysz, "the migration did not complete within %d ms", ms);
	return SPACED_ETIMEDOUT;
}

int vm_qmp_setup(char *why, size_t whysz)
{
	if (V.machine != VM_PC || V.qmp == NULL)
		return 0;
	json_t *args = json_pack("{s:[{s:s,s:b}]}", "capabilities", "capability", "x-ignore-shared", "state", 1);
	return qmp_exec(V.qmp, "migrate-set-capabilities", args, VM_QMP_TIMEOUT_MS, NULL, why, whysz);
}

int vm_load_state(char *why, size_t whysz)
{
	if (V.qmp == NULL)
		return SPACED_ECLOSED;
	int e = qmp_exec_fd(V.qmp, "getfd", json_pack("{s:s}", "fdname", "state"), V.state_fd, VM_QMP_TIMEOUT_MS, NULL,
	                    why, whysz);
	if (e == 0)
		e = qmp_exec(V.qmp, "migrate-incoming", json_pack("{s:s}", "uri", "fd:state"), VM_QMP_TIMEOUT_MS, NULL,
		             why, whysz);
	if (e == 0)
		e = migrate_wait(VM_MIGRATE_TIMEOUT_MS, why, whysz);
	return e;
}

int vm_vsock_plug(char *why, size_t whysz)
{
	if (V.vsock_plugged)
		return 0;
	if (V.qmp == NULL)
		return SPACED_ECLOSED;
	json_t *args = json_pack("{s:s,s:s,s:s,s:s}", "driver", "vhost-user-vsock-pci", "chardev", "vu", "id", "vsock",
	                         "addr", PC_VSOCK_ADDR);
	int e = qmp_exec(V.qmp, "device_add", args, VM_QMP_TIMEOUT_MS, NULL, why, whysz);
	if (e == 0) {
		V.vsock_plugged = true;
		vm_transport_reset();
	}
	return e;
}

int vm_vsock_driver(bool *driver_ok, bool *running, char *why, size_t whysz)
{
	if (V.qmp == NULL)
		return SPACED_ECLOSED;
	json_t *ret = NULL;
	/* the VirtIODevice: a PCI proxy's backend child, or the virtio-mmio device itself */
	json_t *args = json_pack("{s:s}", "path",
	                         V.machine == VM_PC ? "/machine/peripheral/vsock/virtio-backend" : "/machine/peripheral/vsock");
	int e = qmp_exec(V.qmp, "x-query-virtio-status", args, VM_QMP_PROBE_MS, &ret, why, whysz);
	if (e < 0) {
		/* a late answer is told apart by its id and dropped: only a
		 * connection QEMU closed is given up (a busy QEMU keeps serving
		 * pauses and snapshots) */
		if (e == SPACED_ECLOSED) {
			qmp_close(V.qmp);
			V.qmp = NULL;
		}
		return e;
	}
	json_t *st = json_object_get(json_object_get(ret, "status"), "statuses"), *v;
	size_t i;
	*driver_ok = false;
	json_array_foreach(st, i, v) {
		const char *s = json_string_value(v);
		if (s && strncmp(s, "VIRTIO_CONFIG_S_DRIVER_OK", 25) == 0)
			*driver_ok = true;
	}
	*running = json_is_true(json_object_get(ret, "vm-running"));
	json_decref(ret);
	return 0;
}

int vm_vsock_present(bool *present, char *why, size_t whysz)
{
	json_t *ret = NULL;
	char w[256];
	json_t *args = json_pack("{s:s,s:s}", "path", "/machine/peripheral/vsock", "property", "type");
	int e = qmp_exec(V.qmp, "qom-get", args, VM_QMP_TIMEOUT_MS, &ret, w, sizeof w);
	json_decref(ret);
	if (e == SPACED_EPERM) { /* "Device '/machine/peripheral/vsock' not found" */
		*present = false;
		return 0;
	}
	if (e < 0) {
		spaced_why(why, whysz, "%s", w);
		return e;
	}
	*present = true;
	return 0;
}

int vm_vsock_unplug(char *why, size_t whysz)
{
	if (!V.vsock_plugged)
		return 0;
	if (V.machine != VM_PC) {
		spaced_why(why, whysz, "a microvm's vsock device cannot be unplugged");
		return SPACED_EPERM;
	}
	if (V.qmp == NULL)
		return SPACED_ECLOSED;
	json_t *args = json_pack("{s:s}", "id", "vsock");
	int e = qmp_exec(V.qmp, "device_del", args, VM_QMP_TIMEOUT_MS, NULL, why, whysz);
	if (e < 0)
		return e;
	/* the guest's ACPI hot-plug handler lets it go; a guest that does not
	 * has its snapshot taken without memory */
	uint64_t deadline = spaced_mono_ns() + (uint64_t)VM_UNPLUG_TIMEOUT_MS * 1000000u;
	while (spaced_mono_ns() < deadline) {
		bool present = true;
		if ((e = vm_vsock_present(&present, why, whysz)) < 0)
			return e;
		if (!present) {
			V.vsock_plugged = false;
			return 0;
		}
		vm_sleep_ms(10);
	}
	spaced_why(why, whysz, "the guest did not release its vsock device within %d ms", VM_UNPLUG_TIMEOUT_MS);
	return SPACED_ETIMEDOUT;
}

int vm_save_state(const char *path, char *why, size_t whysz)
{
	if (V.qmp == NULL)
		return SPACED_ECLOSED;
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0) {
		spaced_why(why, whysz, "create %s: %s", path, strerror(errno));
		return SPACED_ESYS;
	}
	/* QEMU writes through this descriptor: it needs no way to the path */
	int e = qmp_exec_fd(V.qmp, "getfd", json_pack("{s:s}", "fdname", "snapshot"), fd, VM_QMP_TIMEOUT_MS, NULL, why,
	                    whysz);
	close(fd);
	if (e == 0)
		e = qmp_exec(V.qmp, "migrate", json_pack("{s:s}", "uri", "fd:snapshot"), VM_QMP_TIMEOUT_MS, NULL, why,
		             whysz);
	if (e == 0)
		e = migrate_wait(VM_MIGRATE_TIMEOUT_MS, why, whysz);
	if (e == 0) {
		int rfd = open(path, O_RDONLY | O_CLOEXEC);
		if (rfd < 0 || fsync(rfd) < 0)
			e = SPACED_EIO;
		if (rfd >= 0)
			close(rfd);
	}
	if (e < 0)
		unlink(path);
	return e;
}
