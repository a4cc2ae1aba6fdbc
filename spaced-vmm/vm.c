/*
 * vm.c — spaced-vm: starts and supervises one qemu substrate execution
 * (vm.h; docs/substrate.md "The qemu substrate").
 *
 * Layout of the state directory (root-owned; the execution's uid can only
 * reach vm/):
 *   DIR/control.sock  control commands (root or this process's uid)
 *   DIR/pids          the back-end's and QEMU's {pid, start time} (vm.h)
 *   DIR/ready         "READY <ms>" once the guest answered HELLO
 *   DIR/console.log   the guest's serial console, at most VM_LOG_MAX bytes
 *   DIR/vm.log        QEMU's and spaced-vsockd's diagnostics, at most VM_LOG_MAX
 *   DIR/vm/           owned by the execution's uid, mode 0700:
 *     disk.qcow2      the execution's disk (copy-on-write over the base image)
 *     vu.sock         vhost-user socket (spaced-vsockd listens, QEMU connects)
 *     guest.sock      the hybrid vsock socket (Firecracker's CONNECT handshake)
 *     qmp.sock        QEMU's machine protocol
 *
 * Everything that comes from the VM — console bytes, QMP lines, the guest's
 * answers — is bounded and may only end this execution, never the host's
 * other work.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "error.h"
#include "frame.h"
#include "guest_client.h"
#include "identity.h"
#include "pidref.h"
#include "qmp.h"
#include "resources.h"
#include "sub_internal.h"
#include "util.h"
#include "vm.h"

#define MAX_CTL 8
#define VM_LOG_MAX (1u << 20)            /* per log file */
#define VM_MEMORY_MIN (64ull << 20)
#define VM_HOST_OVERHEAD (384ull << 20)  /* QEMU and the back-end beside guest RAM */
#define VM_TB_SIZE_MB 64                 /* TCG translation cache (QEMU's default is 1 GiB) */
#define VM_QEMU_TASKS 256                /* QEMU's threads and the back-end */
#define VM_SYNC_TIMEOUT_MS 5000
#define VM_QMP_TIMEOUT_MS 5000

struct logsink {
	int rd;           /* read end of the pipe, -1 when closed */
	int fd;           /* the log file */
	uint64_t written;
	bool capped;
	const char *name;
};

static struct vm {
	char state[PATH_MAX];
	char vmdir[PATH_MAX];
	char images[PATH_MAX];
	const char *qemu_bin, *vsockd_bin, *accel, *restore, *uid_lock, *run_dir, *kernel_args;
	int kernel_fd, initrd_fd, base_fd; /* opened by this process, handed to QEMU (-1: none) */
	struct spaced_identity id;
	char idtext[SPACED_IDENTITY_TEXT_MAX];
	uint32_t cid, port, cpu_milli;
	uint64_t memory, pids, disk;
	uid_t uid;
	int boot_timeout_ms;
	bool keep_state;
	struct sub_cgroup cg;
	bool have_cg;
	pid_t qemu, vsockd;
	uint64_t qemu_start, vsockd_start;
	struct qmp *qmp;
	int ctl_lfd, sigfd;
	int ctl[MAX_CTL];
	int nctl;
	struct logsink con, diag;
	bool paused, stop, ready;
	uint64_t t0;
	uint64_t cpu_at_ns, cpu_at_usec;
	uint32_t cpu_pct_x10;
} V = {.ctl_lfd = -1, .sigfd = -1, .kernel_fd = -1, .initrd_fd = -1, .base_fd = -1, .con = {.rd = -1, .fd = -1, .name = "console"},
       .diag = {.rd = -1, .fd = -1, .name = "diagnostics"}};

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	fprintf(stderr, "spaced-vm: sandbox=%s generation=%" PRIu64 " %s\n", V.id.sandbox, V.id.generation, msg);
}

static uint64_t ms_since(uint64_t t0)
{
	return (spaced_mono_ns() - t0) / 1000000u;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static int write_file_atomic(const char *dir, const char *name, const char *text, mode_t mode)
{
	char path[PATH_MAX + 64], tmp[PATH_MAX + 80];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
	if (fd < 0)
		return SPACED_ESYS;
	int e = spaced_io_write_full(fd, text, strlen(text));
	if (e == 0 && fsync(fd) < 0)
		e = SPACED_EIO;
	close(fd);
	if (e == 0 && rename(tmp, path) < 0)
		e = SPACED_ESYS;
	if (e < 0)
		unlink(tmp);
	return e;
}

/* Runs argv to completion as root with output to the diagnostics log;
 * 0 when it exited 0. */
static int run_tool(const char *const argv[])
{
	pid_t p = fork();
	if (p < 0)
		return SPACED_ESYS;
	if (p == 0) {
		int nul = open("/dev/null", O_RDWR);
		dup2(nul, 0);
		dup2(nul, 1);
		if (V.diag.fd >= 0)
			dup2(V.diag.fd, 2);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		execvp(argv[0], (char *const *)(uintptr_t)argv);
		_exit(127);
	}
	int st;
	while (waitpid(p, &st, 0) < 0)
		if (errno != EINTR)
			return SPACED_ESYS;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : SPACED_EIO;
}

/* ---- the disk ---- */

/* The base image of the worker's root tree for a disk of `disk` bytes:
 * IMAGES/cache/base-<bytes>.img, an ext4 filesystem of exactly that size (a
 * sparse file), built once under a lock and then only read. */
static int base_image(uint64_t disk, char *out, size_t outsz, char *why, size_t whysz)
{
	char cache[PATH_MAX + 16], lockp[PATH_MAX + 32], tmp[PATH_MAX + 128], rootfs[PATH_MAX + 16], size[32];
	snprintf(cache, sizeof cache, "%s/cache", V.images);
	if (mkdir(cache, 0755) < 0 && errno != EEXIST) {
		spaced_why(why, whysz, "mkdir %s: %s", cache, strerror(errno));
		return SPACED_ESYS;
	}
	if ((size_t)snprintf(out, outsz, "%s/base-%" PRIu64 ".img", cache, disk) >= outsz)
		return SPACED_ETOOBIG;
	if (access(out, R_OK) == 0)
		return 0;
	snprintf(lockp, sizeof lockp, "%s/.lock", cache);
	int lk = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (lk < 0 || flock(lk, LOCK_EX) < 0) {
		spaced_why(why, whysz, "lock %s: %s", lockp, strerror(errno));
		if (lk >= 0)
			close(lk);
		return SPACED_ESYS;
	}
	int e = 0;
	if (access(out, R_OK) != 0) {
		snprintf(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
		snprintf(rootfs, sizeof rootfs, "%s/rootfs", V.images);
		snprintf(size, sizeof size, "%" PRIu64 "k", disk / 1024);
		/* no journal (a generation starts from its snapshot, taken after a
		 * sync), lazily initialised inode tables that the guest never zeroes
		 * (noinit_itable): an empty disk costs a few hundred KiB */
		const char *argv[] = {"mke2fs", "-q", "-F", "-t", "ext4", "-T", "default", "-m", "0", "-O",
		                      "^has_journal,^resize_inode", "-E", "lazy_itable_init=1,nodiscard,root_owner=0:0",
		                      "-L", "spaced", "-d", rootfs, tmp, size, NULL};
		e = run_tool(argv);
		if (e == 0 && (chmod(tmp, 0644) < 0 || rename(tmp, out) < 0))
			e = SPACED_ESYS;
		if (e < 0) {
			unlink(tmp);
			spaced_why(why, whysz, "cannot build the base image %s from %s", out, rootfs);
		}
	}
	close(lk);
	return e;
}

/* A snapshot's disk must stand alone: a backing or external data file named
 * inside it would make QEMU read a host file as the guest's disk. */
static int disk_standalone(const char *path, char *why, size_t whysz)
{
	int pfd[2];
	if (pipe2(pfd, O_CLOEXEC) < 0)
		return SPACED_ESYS;
	pid_t p = fork();
	if (p < 0) {
		close(pfd[0]);
		close(pfd[1]);
		return SPACED_ESYS;
	}
	if (p == 0) {
		int nul = open("/dev/null", O_RDWR);
		dup2(nul, 0);
		dup2(pfd[1], 1);
		dup2(nul, 2);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		execlp("qemu-img", "qemu-img", "info", "-U", "--output=json", "-f", "qcow2", path, (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	struct spaced_buf b;
	spaced_buf_init(&b, 256 * 1024);
	char chunk[4096];
	ssize_t n;
	int e = 0;
	while ((n = read(pfd[0], chunk, sizeof chunk)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 || spaced_buf_append(&b, chunk, (size_t)n) < 0) {
			e = SPACED_EIO;
			break;
		}
	}
	close(pfd[0]);
	int st;
	while (waitpid(p, &st, 0) < 0 && errno == EINTR)
		;
	json_t *o = NULL;
	if (e == 0 && (!WIFEXITED(st) || WEXITSTATUS(st) != 0))
		e = SPACED_EIO;
	if (e == 0) {
		json_error_t jerr;
		o = json_loadb((const char *)b.data, b.len, JSON_REJECT_DUPLICATES, &jerr);
		if (!json_is_object(o))
			e = SPACED_EPROTO;
	}
	if (e == 0) {
		const char *fmt = json_string_value(json_object_get(o, "format"));
		json_t *fs = json_object_get(json_object_get(o, "format-specific"), "data");
		if (!fmt || strcmp(fmt, "qcow2") != 0 || json_object_get(o, "backing-filename") != NULL ||
		    json_object_get(o, "full-backing-filename") != NULL || json_object_get(fs, "data-file") != NULL) {
			spaced_why(why, whysz, "the snapshot's disk is not a standalone qcow2 image");
			e = SPACED_EPERM;
		}
	} else {
		spaced_why(why, whysz, "qemu-img info of the snapshot's disk failed");
	}
	json_decref(o);
	spaced_buf_free(&b);
	return e;
}

/* Reads SNAP/meta's identity and checks that the new execution may start
 * from it: same sandbox, strictly greater generation (I2). */
static int restore_check(const char *snap, char *why, size_t whysz)
{
	char path[PATH_MAX + 16], buf[2048];
	snprintf(path, sizeof path, "%s/meta", snap);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		spaced_why(why, whysz, "no snapshot at %s (meta missing)", snap);
		return SPACED_ENOENT;
	}
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0) {
		spaced_why(why, whysz, "unreadable snapshot meta");
		return SPACED_EPROTO;
	}
	buf[n] = '\0';
	char *line = strncmp(buf, "identity=", 9) == 0 ? buf : NULL;
	char *sub = strstr(buf, "\nsubstrate=");
	if (line == NULL || sub == NULL || strncmp(sub, "\nsubstrate=qemu\n", 16) != 0) {
		spaced_why(why, whysz, "the snapshot is not a qemu substrate snapshot");
		return SPACED_EPROTO;
	}
	char *nl = strchr(line, '\n');
	struct spaced_identity old;
	if (nl == NULL || spaced_identity_decode(&old, line + 9, (size_t)(nl - line - 9)) < 0) {
		spaced_why(why, whysz, "malformed identity in the snapshot meta");
		return SPACED_EPROTO;
	}
	if (strcmp(old.sandbox, V.id.sandbox) != 0 || V.id.generation <= old.generation) {
		spaced_why(why, whysz, "a restore needs the same sandbox and a newer generation (snapshot of %s generation %" PRIu64 ")",
		           old.sandbox, old.generation);
		return SPACED_EPERM;
	}
	return 0;
}

static int make_disk(char *why, size_t whysz)
{
	char disk[PATH_MAX + 16];
	snprintf(disk, sizeof disk, "%s/disk.qcow2", V.vmdir);
	int e;
	if (V.restore) {
		char src[PATH_MAX + 16];
		snprintf(src, sizeof src, "%s/disk.qcow2", V.restore);
		if ((e = restore_check(V.restore, why, whysz)) < 0 || (e = disk_standalone(src, why, whysz)) < 0)
			return e;
		const char *cp[] = {"cp", "--sparse=always", "--", src, disk, NULL};
		if ((e = run_tool(cp)) < 0) {
			spaced_why(why, whysz, "cannot copy the snapshot's disk");
			return e;
		}
		/* the copy is what QEMU opens: check it too (the store may change) */
		if ((e = disk_standalone(disk, why, whysz)) < 0)
			return e;
	} else {
		char base[PATH_MAX + 64];
		if ((e = base_image(V.disk, base, sizeof base, why, whysz)) < 0)
			return e;
		V.base_fd = open(base, O_RDONLY | O_CLOEXEC);
		if (V.base_fd < 0) {
			spaced_why(why, whysz, "open %s: %s", base, strerror(errno));
			return SPACED_ESYS;
		}
		const char *argv[] = {"qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, disk, NULL};
		if ((e = run_tool(argv)) < 0) {
			spaced_why(why, whysz, "qemu-img create of the execution's disk failed");
			return e;
		}
	}
	if (chown(disk, V.uid, V.uid) < 0 || chmod(disk, 0600) < 0) {
		spaced_why(why, whysz, "chown %s: %s", disk, strerror(errno));
		return SPACED_ESYS;
	}
	return 0;
}

/* ---- processes ---- */

/* Starts argv as the execution's uid, stdout to out_fd and stderr to err_fd,
 * moved into the execution's cgroup before it execs, killed when this
 * supervisor dies. */
static int spawn(const char *const argv[], int out_fd, int err_fd, const int *keep, int nkeep, pid_t *pid,
                 uint64_t *start, char *why, size_t whysz)
{
	int go[2];
	if (pipe2(go, O_CLOEXEC) < 0)
		return SPACED_ESYS;
	pid_t parent = getpid();
	pid_t p = fork();
	if (p < 0) {
		close(go[0]);
		close(go[1]);
		return SPACED_ESYS;
	}
	if (p == 0) {
		char c;
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		close(go[1]);
		if (read(go[0], &c, 1) != 1)
			_exit(127); /* the supervisor could not place it */
		int nul = open("/dev/null", O_RDWR);
		if (nul < 0 || dup2(nul, 0) < 0 || dup2(out_fd >= 0 ? out_fd : nul, 1) < 0 ||
		    dup2(err_fd >= 0 ? err_fd : nul, 2) < 0)
			_exit(127);
		/* the files handed over become descriptors 3, 4, … (fd_path());
		 * first moved out of the way of that range */
		int moved[8];
		for (int i = 0; i < nkeep && i < 8; i++)
			if ((moved[i] = fcntl(keep[i], F_DUPFD_CLOEXEC, 16)) < 0)
				_exit(127);
		for (int i = 0; i < nkeep && i < 8; i++)
			if (dup2(moved[i], 3 + i) < 0)
				_exit(127);
		syscall(SYS_close_range, 3 + (nkeep < 8 ? nkeep : 8), ~0u, 0);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		signal(SIGPIPE, SIG_DFL);
		if (V.uid != 0 && (setgroups(0, NULL) < 0 || setresgid(V.uid, V.uid, V.uid) < 0 ||
		                   setresuid(V.uid, V.uid, V.uid) < 0))
			_exit(126);
		prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
		execv(argv[0], (char *const *)(uintptr_t)argv);
		_exit(127);
	}
	close(go[0]);
	int e = 0;
	if (V.have_cg)
		e = sub_cgroup_add(&V.cg, p, why, whysz);
	if (e == 0 && spaced_proc_start_time(p, start) < 0)
		e = SPACED_ESYS;
	if (e == 0 && write(go[1], "g", 1) != 1)
		e = SPACED_ESYS;
	close(go[1]);
	if (e < 0) {
		kill(p, SIGKILL);
		waitpid(p, NULL, 0);
		return e;
	}
	*pid = p;
	return 0;
}

/* Waits until path is a socket (the back-end listens before it renames). */
static int wait_socket(const char *path, pid_t owner, int ms)
{
	for (int i = 0; i < ms / 10; i++) {
		struct stat st;
		if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
			return 0;
		if (waitpid(owner, NULL, WNOHANG) == owner)
			return SPACED_EIO;
		sleep_ms(10);
	}
	return SPACED_ETIMEDOUT;
}

static int pipe_log(struct logsink *s, const char *file)
{
	int p[2];
	char path[PATH_MAX + 32];
	if (pipe2(p, O_CLOEXEC) < 0)
		return SPACED_ESYS;
	snprintf(path, sizeof path, "%s/%s", V.state, file);
	s->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (s->fd < 0) {
		close(p[0]);
		close(p[1]);
		return SPACED_ESYS;
	}
	fcntl(p[0], F_SETFL, O_NONBLOCK);
	s->rd = p[0];
	return p[1]; /* the write end, for the children */
}

static void log_drain(struct logsink *s)
{
	char buf[16384];
	for (;;) {
		ssize_t n = read(s->rd, buf, sizeof buf);
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0) {
			close(s->rd);
			s->rd = -1;
			return;
		}
		if (n < 0)
			return;
		if (s->written + (uint64_t)n <= VM_LOG_MAX) {
			if (write(s->fd, buf, (size_t)n) == n)
				s->written += (uint64_t)n;
		} else if (!s->capped) {
			s->capped = true;
			logf_("%s output reached %u bytes: dropping the rest", s->name, VM_LOG_MAX);
		}
	}
}

static unsigned tsc_khz(void)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[256];
	unsigned khz = 0;
	while (f && fgets(line, sizeof line, f)) {
		double mhz;
		if (strncmp(line, "cpu MHz", 7) == 0 && sscanf(strchr(line, ':') ? strchr(line, ':') + 1 : "", "%lf", &mhz) == 1) {
			khz = (unsigned)(mhz * 1000.0);
			break;
		}
	}
	if (f)
		fclose(f);
	return khz;
}

static int start_vsockd(int err_fd, char *why, size_t whysz)
{
	char vu[PATH_MAX + 16], uds[PATH_MAX + 16], cid[16];
	snprintf(vu, sizeof vu, "%s/vu.sock", V.vmdir);
	snprintf(uds, sizeof uds, "%s/guest.sock", V.vmdir);
	snprintf(cid, sizeof cid, "%u", V.cid);
	const char *argv[] = {V.vsockd_bin, "--socket", vu, "--uds", uds, "--cid", cid, NULL};
	int e = spawn(argv, err_fd, err_fd, NULL, 0, &V.vsockd, &V.vsockd_start, why, whysz);
	if (e < 0)
		return e;
	if ((e = wait_socket(uds, V.vsockd, 10000)) < 0 || (e = wait_socket(vu, V.vsockd, 10000)) < 0)
		spaced_why(why, whysz, "spaced-vsockd did not listen");
	return e;
}

static int start_qemu(int out_fd, int err_fd, char *why, size_t whysz)
{
	char accel[64], machine[128], mem[32], smp[16], obj[128], vuchar[PATH_MAX + 48], drive[256],
	    qmp[PATH_MAX + 48], kernel[PATH_MAX + 16], initrd[PATH_MAX + 16], append[1400];
	uint64_t mib = V.memory >> 20;
	unsigned vcpus = (V.cpu_milli + 999) / 1000;
	if (vcpus == 0)
		vcpus = 1;
	if (strcmp(V.accel, "tcg") == 0)
		snprintf(accel, sizeof accel, "tcg,tb-size=%d", VM_TB_SIZE_MB);
	else
		snprintf(accel, sizeof accel, "%s", V.accel);
	snprintf(machine, sizeof machine, "microvm,pit=on,pic=on,rtc=on,acpi=on,memory-backend=mem");
	snprintf(mem, sizeof mem, "%" PRIu64, mib);
	snprintf(smp, sizeof smp, "%u", vcpus);
	snprintf(obj, sizeof obj, "memory-backend-memfd,id=mem,size=%" PRIu64 "M,share=on", mib);
	snprintf(vuchar, sizeof vuchar, "socket,id=vu,path=%s/vu.sock", V.vmdir);
	/* the disk's graph is given whole: nothing QEMU opens comes from a name
	 * written in an image's header (a backing or data file) */
	char basefile[96] = "", basenode[64] = "", diskfile[PATH_MAX + 96];
	snprintf(diskfile, sizeof diskfile, "driver=file,filename=%s/disk.qcow2,node-name=diskfile,discard=unmap",
	         V.vmdir);
	if (V.base_fd >= 0) {
		snprintf(basefile, sizeof basefile, "driver=file,filename=/proc/self/fd/5,node-name=basefile,read-only=on");
		snprintf(basenode, sizeof basenode, "driver=raw,file=basefile,node-name=base,read-only=on");
		snprintf(drive, sizeof drive,
		         "{\"driver\":\"qcow2\",\"file\":\"diskfile\",\"backing\":\"base\",\"node-name\":\"disk\","
		         "\"discard\":\"unmap\"}");
	} else {
		snprintf(drive, sizeof drive,
		         "{\"driver\":\"qcow2\",\"file\":\"diskfile\",\"backing\":null,\"node-name\":\"disk\","
		         "\"discard\":\"unmap\"}");
	}
	snprintf(qmp, sizeof qmp, "unix:%s/qmp.sock,server=on,wait=off", V.vmdir);
	/* read through descriptors this process opened: the execution's uid
	 * needs no way to the worker's image directory */
	snprintf(kernel, sizeof kernel, "/proc/self/fd/3");
	snprintf(initrd, sizeof initrd, "/proc/self/fd/4");
	unsigned khz = tsc_khz();
	char tsc[40] = "";
	if (khz > 0)
		snprintf(tsc, sizeof tsc, " tsc_early_khz=%u", khz);
	int an = snprintf(append, sizeof append,
	                  "console=ttyS0 quiet panic=-1 pci=off%s%s%s spaced.identity=%s spaced.port=%u spaced.pids=%" PRIu64,
	                  tsc, V.kernel_args ? " " : "", V.kernel_args ? V.kernel_args : "", V.idtext, V.port, V.pids);
	if (an < 0 || (size_t)an >= sizeof append)
		return SPACED_ETOOBIG;
	const char *argv[64] = {V.qemu_bin, "-accel", accel, "-M", machine, "-m", mem, "-smp", smp, "-object", obj,
	                        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
	                        "-chardev", "stdio,id=con,signal=off", "-serial", "chardev:con",
	                        "-chardev", vuchar, "-device", "vhost-user-vsock-device,chardev=vu",
	                        "-qmp", qmp, "-kernel", kernel, "-initrd", initrd, "-append", append,
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
	argv[n++] = "-device";
	argv[n++] = "virtio-blk-device,drive=disk";
	argv[n] = NULL;
	int keep[3] = {V.kernel_fd, V.initrd_fd, V.base_fd};
	return spawn(argv, out_fd, err_fd, keep, V.base_fd >= 0 ? 3 : 2, &V.qemu, &V.qemu_start, why, whysz);
}

/* ---- the guest, reached as any host program reaches it ---- */

/* Connects to the guest agent through the hybrid socket: CONNECT, OK, then a
 * guest protocol client. Every read has a timeout. */
static int guest_connect(int timeout_ms, struct spaced_guest_client **out)
{
	char path[PATH_MAX + 16], line[64];
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(path, sizeof path, "%s/guest.sock", V.vmdir);
	if (strlen(path) >= sizeof sa.sun_path)
		return SPACED_ETOOBIG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return SPACED_ESYS;
	struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	int n = snprintf(line, sizeof line, "CONNECT %u\n", V.port);
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || spaced_io_write_full(fd, line, (size_t)n) < 0) {
		close(fd);
		return SPACED_ECLOSED;
	}
	size_t got = 0;
	while (got < sizeof line - 1) {
		ssize_t r = recv(fd, line + got, 1, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			close(fd);
			return SPACED_ECLOSED; /* refused: no listener yet, or the guest is gone */
		}
		if (line[got++] == '\n')
			break;
	}
	line[got] = '\0';
	if (strncmp(line, "OK ", 3) != 0 || line[got - 1] != '\n') {
		close(fd);
		return SPACED_EPROTO;
	}
	return spaced_guest_client_adopt(fd, out);
}

/* Whether the guest answers HELLO with this execution's identity. */
static int guest_hello(char *why, size_t whysz)
{
	struct spaced_guest_client *c;
	int e = guest_connect(3000, &c);
	if (e < 0)
		return e;
	struct spaced_identity got;
	e = spaced_guest_hello(c, &got);
	spaced_guest_client_free(c);
	if (e < 0)
		return e;
	if (!spaced_identity_equal(&got, &V.id)) {
		char text[SPACED_IDENTITY_TEXT_MAX];
		spaced_identity_encode(&got, text, sizeof text);
		spaced_why(why, whysz, "the guest reports identity %s", text);
		return SPACED_EIDENTITY;
	}
	return 0;
}

/* The guest's dirty pages to its disk before QEMU stops (best effort: a
 * guest that does not answer only loses its own unsynced writes). */
static int guest_sync(void)
{
	struct spaced_guest_client *c;
	int e = guest_connect(VM_SYNC_TIMEOUT_MS, &c);
	if (e < 0)
		return e;
	const char *const argv[] = {"sync", NULL};
	struct spaced_guest_exec_req req = {.argv = argv, .timeout_ms = VM_SYNC_TIMEOUT_MS};
	struct spaced_guest_exit res;
	e = spaced_guest_exec(c, &req, NULL, 0, NULL, NULL, &res);
	spaced_guest_client_free(c);
	if (e == 0 && res.code != 0)
		e = SPACED_EIO;
	return e;
}

static bool child_gone(pid_t p)
{
	return p <= 0 || waitpid(p, NULL, WNOHANG) == p;
}

static int wait_ready(char *why, size_t whysz)
{
	uint64_t deadline = spaced_mono_ns() + (uint64_t)V.boot_timeout_ms * 1000000u;
	int e = SPACED_ETIMEDOUT;
	while (spaced_mono_ns() < deadline) {
		struct signalfd_siginfo si;
		while (read(V.sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
			if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
				spaced_why(why, whysz, "stopped by signal %u during the boot", si.ssi_signo);
				return SPACED_ECLOSED;
			}
		}
		if (child_gone(V.qemu)) {
			V.qemu = 0;
			spaced_why(why, whysz, "QEMU ended during the boot (see console.log and vm.log)");
			return SPACED_EIO;
		}
		if (child_gone(V.vsockd)) {
			V.vsockd = 0;
			spaced_why(why, whysz, "spaced-vsockd ended during the boot (see vm.log)");
			return SPACED_EIO;
		}
		log_drain(&V.con);
		log_drain(&V.diag);
		char w[256] = "";
		e = guest_hello(w, sizeof w);
		if (e == 0)
			return 0;
		if (e == SPACED_EIDENTITY) {
			spaced_why(why, whysz, "%s", w);
			return e;
		}
		sleep_ms(100);
	}
	spaced_why(why, whysz, "the guest did not answer within %d ms", V.boot_timeout_ms);
	return e;
}

/* ---- control ---- */

static void usage_text(char *reply, size_t sz)
{
	struct sub_usage u = {UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT64_MAX};
	if (V.have_cg)
		sub_cgroup_usage(&V.cg, &u);
	char disk[PATH_MAX + 16];
	struct stat st;
	uint64_t used = 0;
	snprintf(disk, sizeof disk, "%s/disk.qcow2", V.vmdir);
	if (stat(disk, &st) == 0)
		used = (uint64_t)st.st_blocks * 512u;
#define FIG(v) ((v) == UINT64_MAX ? (int64_t)-1 : (int64_t)(v))
	/* pids: the guest's tasks are inside the VM; the host does not count them */
	snprintf(reply, sz,
	         "OK cpu_usec=%" PRId64 " cpu_pct=%u.%u memory=%" PRId64 " memory_peak=%" PRId64 " oom_kills=%" PRId64
	         " pids=-1 disk=%" PRIu64 " disk_total=%" PRIu64,
	         FIG(u.cpu_usec), V.cpu_pct_x10 / 10, V.cpu_pct_x10 % 10, FIG(u.mem_bytes), FIG(u.mem_peak),
	         FIG(u.oom_kills), used, V.disk);
#undef FIG
}

static void cpu_sample(void)
{
	struct sub_usage u;
	uint64_t now = spaced_mono_ns();
	if (!V.have_cg || (V.cpu_at_ns != 0 && now - V.cpu_at_ns < 1000000000u))
		return;
	sub_cgroup_usage(&V.cg, &u);
	if (u.cpu_usec == UINT64_MAX)
		return;
	if (V.cpu_at_ns != 0 && u.cpu_usec >= V.cpu_at_usec)
		V.cpu_pct_x10 = (uint32_t)((u.cpu_usec - V.cpu_at_usec) * 1000u / ((now - V.cpu_at_ns) / 1000u + 1));
	V.cpu_at_ns = now;
	V.cpu_at_usec = u.cpu_usec;
}

static int qmp_simple(const char *cmd, char *why, size_t whysz)
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

static int do_pause(char *why, size_t whysz)
{
	if (V.paused)
		return 0;
	uint64_t t = spaced_mono_ns();
	int s = guest_sync();
	if (s < 0)
		logf_("guest sync before pause failed: %s (pausing anyway)", spaced_strerror(s));
	int e = qmp_simple("stop", why, whysz);
	if (e == 0) {
		V.paused = true;
		logf_("paused (sync %s, %" PRIu64 " ms)", s == 0 ? "done" : "failed", ms_since(t));
	}
	return e;
}

static int do_thaw(char *why, size_t whysz)
{
	if (!V.paused)
		return 0;
	int e = qmp_simple("cont", why, whysz);
	if (e == 0) {
		V.paused = false;
		logf_("thawed");
	}
	return e;
}

/* Writes the disk as one standalone qcow2 image at out (in the execution's
 * directory). qemu-img runs as the execution's uid with the disk's graph
 * given whole, as QEMU got it: the image's header was writable by QEMU, and
 * a backing or data file named there must not make a root process read a
 * host file into the snapshot. -U: QEMU holds the image (stopped, its
 * writes flushed by the stop). */
static int convert_disk(const char *out, char *why, size_t whysz)
{
	char spec[PATH_MAX + 256];
	if (V.base_fd >= 0)
		snprintf(spec, sizeof spec,
		         "json:{\"driver\":\"qcow2\",\"file\":{\"driver\":\"file\",\"filename\":\"%s/disk.qcow2\"},"
		         "\"backing\":{\"driver\":\"raw\",\"file\":{\"driver\":\"file\",\"filename\":\"/proc/self/fd/3\"}}}",
		         V.vmdir);
	else
		snprintf(spec, sizeof spec,
		         "json:{\"driver\":\"qcow2\",\"file\":{\"driver\":\"file\",\"filename\":\"%s/disk.qcow2\"},"
		         "\"backing\":null}",
		         V.vmdir);
	const char *argv[] = {"/usr/bin/qemu-img", "convert", "-U", "-O", "qcow2", spec, out, NULL};
	pid_t p;
	uint64_t st;
	int keep[1] = {V.base_fd};
	int e = spawn(argv, -1, V.diag.fd, keep, V.base_fd >= 0 ? 1 : 0, &p, &st, why, whysz);
	if (e < 0)
		return e;
	int status;
	while (waitpid(p, &status, 0) < 0)
		if (errno != EINTR)
			return SPACED_ESYS;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		spaced_why(why, whysz, "qemu-img convert of the disk failed");
		return SPACED_EIO;
	}
	return 0;
}

/* Copies the regular file at src (in the execution's directory, so opened
 * without following a link and checked to belong to the execution's uid)
 * to dst, created new. Holes stay holes. */
static int copy_out(const char *src, const char *dst, char *why, size_t whysz)
{
	int in = open(src, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	struct stat st;
	if (in < 0 || fstat(in, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != V.uid || st.st_nlink != 1) {
		spaced_why(why, whysz, "the converted disk is not a plain file of the execution");
		if (in >= 0)
			close(in);
		return SPACED_EPERM;
	}
	int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (out < 0) {
		close(in);
		spaced_why(why, whysz, "create %s: %s", dst, strerror(errno));
		return SPACED_ESYS;
	}
	int e = 0;
	off_t pos = 0;
	while (e == 0 && pos < st.st_size) {
		off_t data = lseek(in, pos, SEEK_DATA);
		if (data < 0)
			break; /* only a hole is left */
		off_t hole = lseek(in, data, SEEK_HOLE);
		if (hole < 0)
			hole = st.st_size;
		off_t a = data, b = data;
		while (a < hole) {
			ssize_t w = copy_file_range(in, &a, out, &b, (size_t)(hole - a), 0);
			if (w <= 0) {
				e = SPACED_EIO;
				break;
			}
		}
		pos = hole;
	}
	if (e == 0 && (ftruncate(out, st.st_size) < 0 || fsync(out) < 0))
		e = SPACED_EIO;
	close(in);
	close(out);
	if (e < 0) {
		unlink(dst);
		spaced_why(why, whysz, "cannot copy the snapshot's disk");
	}
	return e;
}

/* Saves the stopped VM's disk into dir (which must not exist) as one
 * standalone qcow2 image, then dir/meta. The memory is not saved: QEMU 7.2
 * refuses to migrate a VM with a vhost-user-vsock device (docs/substrate.md). */
static int do_snapshot(const char *dir, char *why, size_t whysz)
{
	if (!V.paused) {
		spaced_why(why, whysz, "the execution is not paused");
		return SPACED_EINVAL;
	}
	if (dir[0] != '/') {
		spaced_why(why, whysz, "the snapshot path must be absolute");
		return SPACED_EINVAL;
	}
	if (mkdir(dir, 0700) < 0) {
		spaced_why(why, whysz, "mkdir %s: %s", dir, strerror(errno));
		return errno == EEXIST ? SPACED_EEXIST : SPACED_ESYS;
	}
	char dst[PATH_MAX + 16], tmp[PATH_MAX + 32], meta[SPACED_IDENTITY_TEXT_MAX + 128];
	snprintf(dst, sizeof dst, "%s/disk.qcow2", dir);
	snprintf(tmp, sizeof tmp, "%s/snapshot.qcow2", V.vmdir);
	uint64_t t = spaced_mono_ns();
	int e = convert_disk(tmp, why, whysz);
	if (e == 0)
		e = copy_out(tmp, dst, why, whysz);
	unlink(tmp);
	if (e < 0)
		return e;
	snprintf(meta, sizeof meta, "identity=%s\nsubstrate=qemu\ndisk_bytes=%" PRIu64 "\nmemory=none\n", V.idtext,
	         V.disk);
	if ((e = write_file_atomic(dir, "meta", meta, 0600)) < 0) {
		spaced_why(why, whysz, "cannot write the snapshot meta");
		return e;
	}
	logf_("snapshot %s (%" PRIu64 " ms)", dir, ms_since(t));
	return 0;
}

static void ctl_reply(int fd, const char *text)
{
	(void)send(fd, text, strlen(text), MSG_NOSIGNAL);
}

static void ctl_command(int fd, char *cmd)
{
	char reply[VM_MSG_MAX], why[512] = "";
	int e;
	if (strcmp(cmd, "PAUSE") == 0) {
		e = do_pause(why, sizeof why);
		snprintf(reply, sizeof reply, e == 0 ? "OK" : "ERR pause: %s", why[0] ? why : spaced_strerror(e));
	} else if (strcmp(cmd, "THAW") == 0) {
		e = do_thaw(why, sizeof why);
		snprintf(reply, sizeof reply, e == 0 ? "OK" : "ERR thaw: %s", why[0] ? why : spaced_strerror(e));
	} else if (strncmp(cmd, "SNAPSHOT ", 9) == 0) {
		e = do_snapshot(cmd + 9, why, sizeof why);
		snprintf(reply, sizeof reply, e == 0 ? "OK" : "ERR snapshot: %s", why[0] ? why : spaced_strerror(e));
	} else if (strcmp(cmd, "STATUS") == 0) {
		snprintf(reply, sizeof reply, "OK ready=%d paused=%d qemu=%d vsockd=%d identity=%s", V.ready, V.paused,
		         (int)V.qemu, (int)V.vsockd, V.idtext);
	} else if (strcmp(cmd, "USAGE") == 0) {
		usage_text(reply, sizeof reply);
	} else if (strcmp(cmd, "STOP") == 0) {
		snprintf(reply, sizeof reply, "OK");
		V.stop = true;
	} else {
		snprintf(reply, sizeof reply, "ERR unknown command");
	}
	ctl_reply(fd, reply);
}

static void ctl_accept(void)
{
	for (;;) {
		struct ucred cr;
		socklen_t len = sizeof cr;
		int fd = accept4(V.ctl_lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0)
			return;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0 || (cr.uid != 0 && cr.uid != geteuid()) ||
		    V.nctl >= MAX_CTL) {
			close(fd);
			continue;
		}
		V.ctl[V.nctl++] = fd;
	}
}

/* One command from fd; true when the connection is done. */
static bool ctl_step(int fd)
{
	char buf[VM_MSG_MAX + 1];
	ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT | MSG_TRUNC);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return false;
	if (n <= 0)
		return true;
	if ((size_t)n > sizeof buf - 1 || memchr(buf, '\0', (size_t)n) != NULL) {
		ctl_reply(fd, "ERR malformed command");
		return true;
	}
	buf[n] = '\0';
	ctl_command(fd, buf);
	return false;
}

static int ctl_listen(void)
{
	char path[PATH_MAX + 16], tmp[PATH_MAX + 24];
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(path, sizeof path, "%s/control.sock", V.state);
	snprintf(tmp, sizeof tmp, "%s/control.tmp", V.state);
	if (strlen(tmp) >= sizeof sa.sun_path)
		return SPACED_ETOOBIG;
	unlink(tmp);
	memcpy(sa.sun_path, tmp, strlen(tmp) + 1);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return SPACED_ESYS;
	mode_t old = umask(0077);
	int r = bind(fd, (struct sockaddr *)&sa, sizeof sa);
	umask(old);
	if (r < 0 || listen(fd, 8) < 0 || rename(tmp, path) < 0) {
		close(fd);
		return SPACED_ESYS;
	}
	V.ctl_lfd = fd;
	return 0;
}

/* ---- ending ---- */

static void stop_child(pid_t *pp, int grace_ms)
{
	pid_t p = *pp;
	if (p <= 0)
		return;
	for (int i = 0; i < grace_ms / 10; i++) {
		if (waitpid(p, NULL, WNOHANG) == p) {
			*pp = 0;
			return;
		}
		sleep_ms(10);
	}
	kill(p, SIGTERM);
	for (int i = 0; i < 300; i++) {
		if (waitpid(p, NULL, WNOHANG) == p) {
			*pp = 0;
			return;
		}
		sleep_ms(10);
	}
	kill(p, SIGKILL);
	waitpid(p, NULL, 0);
	*pp = 0;
}

static void shutdown_vm(void)
{
	/* nothing of a stopped VM is kept but what a snapshot already saved */
	stop_child(&V.qemu, 0);
	/* the back-end ends by itself once QEMU has hung up */
	stop_child(&V.vsockd, 2000);
	qmp_close(V.qmp);
	V.qmp = NULL;
	if (V.have_cg)
		sub_cgroup_remove(&V.cg);
	if (!V.keep_state) {
		const char *rm[] = {"rm", "-rf", "--", V.vmdir, NULL};
		run_tool(rm);
	}
	char p[PATH_MAX + 32];
	snprintf(p, sizeof p, "%s/control.sock", V.state);
	unlink(p);
	snprintf(p, sizeof p, "%s/ready", V.state);
	unlink(p);
	snprintf(p, sizeof p, "%s/pids", V.state);
	unlink(p);
}

static void on_sigchld(void)
{
	struct signalfd_siginfo si;
	while (read(V.sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
		if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
			logf_("signal %u: stopping", si.ssi_signo);
			V.stop = true;
		}
	}
	for (;;) {
		int st;
		pid_t p = waitpid(-1, &st, WNOHANG);
		if (p <= 0)
			break;
		if (p == V.qemu) {
			V.qemu = 0;
			logf_("QEMU ended (%s %d)", WIFEXITED(st) ? "status" : "signal",
			      WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
			V.stop = true;
		} else if (p == V.vsockd) {
			V.vsockd = 0;
			logf_("spaced-vsockd ended (%s %d)", WIFEXITED(st) ? "status" : "signal",
			      WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
			V.stop = true;
		}
	}
}

static void loop(void)
{
	while (!V.stop) {
		struct pollfd pf[5 + MAX_CTL];
		int n = 0;
		pf[n++] = (struct pollfd){.fd = V.sigfd, .events = POLLIN};
		pf[n++] = (struct pollfd){.fd = V.ctl_lfd, .events = POLLIN};
		pf[n++] = (struct pollfd){.fd = V.con.rd, .events = POLLIN};
		pf[n++] = (struct pollfd){.fd = V.diag.rd, .events = POLLIN};
		pf[n++] = (struct pollfd){.fd = V.qmp ? qmp_fd(V.qmp) : -1, .events = POLLIN};
		for (int i = 0; i < V.nctl; i++)
			pf[n++] = (struct pollfd){.fd = V.ctl[i], .events = POLLIN};
		int r = poll(pf, (nfds_t)n, 1000);
		if (r < 0 && errno != EINTR)
			break;
		cpu_sample();
		if (r <= 0)
			continue;
		if (pf[0].revents)
			on_sigchld();
		if (pf[1].revents)
			ctl_accept();
		if (pf[2].revents && V.con.rd >= 0)
			log_drain(&V.con);
		if (pf[3].revents && V.diag.rd >= 0)
			log_drain(&V.diag);
		if (pf[4].revents && V.qmp != NULL && qmp_drain(V.qmp) < 0) {
			qmp_close(V.qmp);
			V.qmp = NULL;
		}
		for (int i = 5; i < n; i++) {
			if (pf[i].revents == 0)
				continue;
			int fd = pf[i].fd;
			if (ctl_step(fd)) {
				close(fd);
				for (int j = 0; j < V.nctl; j++)
					if (V.ctl[j] == fd) {
						V.ctl[j] = V.ctl[--V.nctl];
						break;
					}
			}
		}
	}
}

/* ---- the command line ---- */

static void usage(void)
{
	fprintf(stderr,
	        "usage: spaced-vm --state DIR --images DIR --identity TEXT [--cid N] [--port N]\n"
	        "                 [--cpus N] [--memory SIZE] [--pids N] [--disk SIZE] [--uid N]\n"
	        "                 [--restore SNAPDIR] [--qemu PATH] [--vsockd PATH] [--accel tcg|kvm]\n"
	        "                 [--boot-timeout-ms MS] [--uid-lock DIR] [--run-dir DIR] [--kernel-args ARGS] [--keep-state]\n"
	        "       spaced-vm ctl --state DIR PAUSE|THAW|STATUS|USAGE|STOP|SNAPSHOT DIR\n");
	exit(2);
}

static int ctl_main(int argc, char **argv)
{
	char cmd[VM_MSG_MAX], reply[VM_MSG_MAX + 1], path[PATH_MAX + 16];
	if (argc < 4 || strcmp(argv[1], "--state") != 0)
		usage();
	size_t len = 0;
	cmd[0] = '\0';
	for (int i = 3; i < argc; i++) {
		int w = snprintf(cmd + len, sizeof cmd - len, "%s%s", len ? " " : "", argv[i]);
		if (w < 0 || (size_t)w >= sizeof cmd - len) {
			fprintf(stderr, "spaced-vm: command too long\n");
			return 2;
		}
		len += (size_t)w;
	}
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(path, sizeof path, "%s/control.sock", argv[2]);
	if (strlen(path) >= sizeof sa.sun_path)
		return 2;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		fprintf(stderr, "ERR connect %s: %s\n", path, strerror(errno));
		return 1;
	}
	ssize_t n = -1;
	if (send(fd, cmd, len, MSG_NOSIGNAL) == (ssize_t)len)
		n = recv(fd, reply, sizeof reply - 1, 0);
	close(fd);
	if (n <= 0) {
		fprintf(stderr, "ERR no answer\n");
		return 1;
	}
	reply[n] = '\0';
	if (strncmp(reply, "OK", 2) != 0) {
		fprintf(stderr, "%s\n", reply);
		return 1;
	}
	printf("%s\n", reply);
	return 0;
}

static int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	char *end;
	if (s == NULL || *s < '0' || *s > '9')
		return SPACED_EINVAL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end || v < min || v > max)
		return SPACED_EINVAL;
	*out = v;
	return 0;
}

static int run(int argc, char **argv)
{
	const char *state = NULL, *images = NULL, *identity = NULL;
	uint64_t v;
	V.qemu_bin = "/usr/bin/qemu-system-x86_64";
	V.vsockd_bin = NULL;
	V.accel = "tcg";
	V.cid = 3;
	V.port = VM_GUEST_PORT_DEFAULT;
	V.memory = 256ull << 20;
	V.disk = 1ull << 30;
	V.pids = 0;
	V.cpu_milli = 1000;
	V.boot_timeout_ms = 120000;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--keep-state") == 0) {
			V.keep_state = true;
			continue;
		}
		if (val == NULL)
			usage();
		i++;
		bool ok = true;
		if (strcmp(a, "--state") == 0)
			state = val;
		else if (strcmp(a, "--images") == 0)
			images = val;
		else if (strcmp(a, "--identity") == 0)
			identity = val;
		else if (strcmp(a, "--restore") == 0)
			V.restore = val;
		else if (strcmp(a, "--uid-lock") == 0)
			V.uid_lock = val;
		else if (strcmp(a, "--run-dir") == 0)
			V.run_dir = val;
		else if (strcmp(a, "--kernel-args") == 0)
			V.kernel_args = val; /* before spaced's own: they cannot replace them */
		else if (strcmp(a, "--qemu") == 0)
			V.qemu_bin = val;
		else if (strcmp(a, "--vsockd") == 0)
			V.vsockd_bin = val;
		else if (strcmp(a, "--accel") == 0) {
			ok = strcmp(val, "tcg") == 0 || strcmp(val, "kvm") == 0;
			V.accel = val;
		} else if (strcmp(a, "--cid") == 0) {
			ok = parse_u64(val, 3, UINT32_MAX - 1, &v) == 0;
			V.cid = (uint32_t)v;
		} else if (strcmp(a, "--port") == 0) {
			ok = parse_u64(val, 1, UINT32_MAX - 1, &v) == 0;
			V.port = (uint32_t)v;
		} else if (strcmp(a, "--uid") == 0) {
			ok = parse_u64(val, 0, UINT32_MAX - 1, &v) == 0;
			V.uid = (uid_t)v;
		} else if (strcmp(a, "--pids") == 0) {
			ok = parse_u64(val, 1, 4194304, &V.pids) == 0;
		} else if (strcmp(a, "--boot-timeout-ms") == 0) {
			ok = parse_u64(val, 100, 3600000, &v) == 0;
			V.boot_timeout_ms = (int)v;
		} else if (strcmp(a, "--cpus") == 0)
			ok = spaced_cpus_parse(val, &V.cpu_milli) == 0;
		else if (strcmp(a, "--memory") == 0)
			ok = spaced_size_parse(val, &V.memory) == 0 && V.memory >= VM_MEMORY_MIN;
		else if (strcmp(a, "--disk") == 0)
			ok = spaced_size_parse(val, &V.disk) == 0 && V.disk >= (16ull << 20);
		else
			ok = false;
		if (!ok) {
			fprintf(stderr, "spaced-vm: bad option or value: %s %s\n", a, val);
			usage();
		}
	}
	if (state == NULL || images == NULL || identity == NULL)
		usage();
	if (spaced_identity_decode(&V.id, identity, strlen(identity)) < 0 ||
	    spaced_identity_encode(&V.id, V.idtext, sizeof V.idtext) < 0) {
		fprintf(stderr, "spaced-vm: --identity is not a canonical execution identity\n");
		return 2;
	}
	V.memory = (V.memory + (1u << 20) - 1) & ~((uint64_t)(1u << 20) - 1);
	V.disk &= ~(uint64_t)4095;
	if (realpath(images, V.images) == NULL) {
		fprintf(stderr, "spaced-vm: --images %s: %s\n", images, strerror(errno));
		return 1;
	}
	static char vsockd_default[PATH_MAX + 32];
	if (V.vsockd_bin == NULL) {
		/* beside this binary, as the build and the install put them */
		char self[PATH_MAX];
		ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
		if (n > 0) {
			self[n] = '\0';
			char *slash = strrchr(self, '/');
			if (slash)
				*slash = '\0';
			snprintf(vsockd_default, sizeof vsockd_default, "%s/spaced-vsockd", self);
		}
		V.vsockd_bin = vsockd_default;
	}
	V.t0 = spaced_mono_ns();
	if (V.uid_lock != NULL) {
		/* the uid range is this execution's for as long as this process lives
		 * (the same host-wide lock spaced-launch takes) */
		char lp[PATH_MAX + 32];
		snprintf(lp, sizeof lp, "%s/%u.lock", V.uid_lock, (unsigned)V.uid);
		int lk = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (lk < 0 || flock(lk, LOCK_EX | LOCK_NB) < 0) {
			fprintf(stderr, "spaced-vm: uid range %u is in use (%s)\n", (unsigned)V.uid, lp);
			return 1;
		}
	}
	if (mkdir(state, 0711) < 0 && errno != EEXIST) {
		fprintf(stderr, "spaced-vm: mkdir %s: %s\n", state, strerror(errno));
		return 1;
	}
	if (realpath(state, V.state) == NULL) {
		fprintf(stderr, "spaced-vm: %s: %s\n", state, strerror(errno));
		return 1;
	}
	if (V.run_dir != NULL) {
		/* its parent must let the execution's uid through (0711) */
		if ((size_t)snprintf(V.vmdir, sizeof V.vmdir, "%s", V.run_dir) >= 100 || V.run_dir[0] != '/') {
			fprintf(stderr, "spaced-vm: --run-dir must be an absolute path short enough for its sockets\n");
			return 1;
		}
		const char *rm[] = {"rm", "-rf", "--", V.vmdir, NULL};
		run_tool(rm); /* what an execution of this uid range that died left */
	} else if ((size_t)snprintf(V.vmdir, sizeof V.vmdir, "%s/vm", V.state) >= 100 || chmod(V.state, 0711) < 0) {
		fprintf(stderr, "spaced-vm: --state path too long for its sockets\n");
		return 1;
	}
	/* the execution's uid reaches its own directory and nothing else */
	if ((mkdir(V.vmdir, 0700) < 0 && errno != EEXIST) || chown(V.vmdir, V.uid, V.uid) < 0 ||
	    chmod(V.vmdir, 0700) < 0) {
		fprintf(stderr, "spaced-vm: cannot prepare %s: %s\n", V.vmdir, strerror(errno));
		return 1;
	}
	char img[PATH_MAX + 16];
	snprintf(img, sizeof img, "%s/vmlinux", V.images);
	V.kernel_fd = open(img, O_RDONLY | O_CLOEXEC);
	snprintf(img, sizeof img, "%s/initrd.img", V.images);
	V.initrd_fd = open(img, O_RDONLY | O_CLOEXEC);
	if (V.kernel_fd < 0 || V.initrd_fd < 0) {
		fprintf(stderr, "spaced-vm: %s/vmlinux or initrd.img missing (spaced-vmm/mkvmimage.sh)\n", V.images);
		return 1;
	}

	signal(SIGPIPE, SIG_IGN);
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigprocmask(SIG_BLOCK, &set, NULL);
	V.sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
	char why[512] = "";
	int con_w = pipe_log(&V.con, "console.log"), diag_w = pipe_log(&V.diag, "vm.log");
	int e = (V.sigfd < 0 || con_w < 0 || diag_w < 0) ? SPACED_ESYS : 0;
	if (e == 0) {
		/* the host-side cost of the VM: CPU (fractions of a vCPU too),
		 * guest RAM plus QEMU's own, QEMU's threads */
		struct sub_limits lim = {.cpu_milli = V.cpu_milli, .mem_bytes = V.memory + VM_HOST_OVERHEAD,
		                         .pids_max = VM_QEMU_TASKS};
		char name[64];
		snprintf(name, sizeof name, "spaced-%d-0", (int)getpid());
		if ((e = sub_cgroup_create(&V.cg, name, &lim, why, sizeof why)) == 0)
			V.have_cg = true;
	}
	uint64_t t_disk = 0, t_vsockd = 0, t_qemu = 0, t_qmp = 0;
	if (e == 0 && (e = make_disk(why, sizeof why)) == 0 && (t_disk = ms_since(V.t0), true) &&
	    (e = start_vsockd(diag_w, why, sizeof why)) == 0 && (t_vsockd = ms_since(V.t0), true) &&
	    (e = start_qemu(con_w, diag_w, why, sizeof why)) == 0) {
		char qmp[PATH_MAX + 16];
		t_qemu = ms_since(V.t0);
		snprintf(qmp, sizeof qmp, "%s/qmp.sock", V.vmdir);
		if ((e = qmp_open(qmp, 20000, &V.qmp)) < 0)
			spaced_why(why, sizeof why, "QMP: %s", spaced_strerror(e));
		t_qmp = ms_since(V.t0);
	}
	if (con_w >= 0)
		close(con_w);
	if (diag_w >= 0)
		close(diag_w);
	if (e == 0)
		e = wait_ready(why, sizeof why);
	char text[128];
	if (e == 0) {
		snprintf(text, sizeof text, "vsockd %d %" PRIu64 "\nqemu %d %" PRIu64 "\n", (int)V.vsockd, V.vsockd_start,
		         (int)V.qemu, V.qemu_start);
		e = write_file_atomic(V.state, "pids", text, 0644);
	}
	if (e == 0)
		e = ctl_listen();
	if (e == 0) {
		uint64_t ms = ms_since(V.t0);
		snprintf(text, sizeof text, "READY %" PRIu64 "\n", ms);
		e = write_file_atomic(V.state, "ready", text, 0644);
		if (e == 0) {
			V.ready = true;
			printf("READY %" PRIu64 "\n", ms);
			fflush(stdout);
			logf_("ready in %" PRIu64 " ms (disk %" PRIu64 ", back-end %" PRIu64 ", QEMU started %" PRIu64
			      ", QMP %" PRIu64 "; qemu %d, spaced-vsockd %d, cid %u)",
			      ms, t_disk, t_vsockd, t_qemu, t_qmp, (int)V.qemu, (int)V.vsockd, V.cid);
		}
	}
	if (e < 0) {
		fprintf(stderr, "spaced-vm: execution setup failed: %s\n", why[0] ? why : spaced_strerror(e));
		shutdown_vm();
		return 1;
	}
	loop();
	shutdown_vm();
	logf_("stopped");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "ctl") == 0)
		return ctl_main(argc - 1, argv + 1);
	return run(argc, argv);
}
