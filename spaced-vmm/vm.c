/*
 * vm.c — spaced-vm: starts and supervises one qemu substrate execution
 * (vm.h; docs/substrate.md "The qemu substrate").
 *
 * Layout: the state directory DIR (root-owned, 0711) holds what only root
 * uses; RUN (--run-dir, or DIR/vm) is the execution's uid's own directory:
 *   DIR/control.sock  control commands (root or this process's uid)
 *   DIR/pids          the back-end's and QEMU's {pid, start time} (vm.h)
 *   DIR/ready         "READY <ms>" once the guest answered HELLO
 *   DIR/console.log   the guest's serial console, at most VM_LOG_MAX bytes
 *   DIR/vm.log        QEMU's and spaced-vsockd's diagnostics, at most VM_LOG_MAX
 *   RUN/disk.qcow2    the execution's disk (copy-on-write over a base image or
 *                     a template's disk, or a copy of a snapshot's)
 *   RUN/vu.sock       vhost-user socket (spaced-vsockd listens, QEMU connects)
 *   RUN/guest.sock    the hybrid vsock socket (Firecracker's CONNECT handshake)
 *   RUN/qmp.sock      QEMU's machine protocol
 *
 * A VM starts in one of three ways: a cold boot of the base image; from a
 * booted template (IMAGES/cache/template-…: its disk under an overlay and its
 * memory loaded with -incoming, built on first use by `spaced-vm template`);
 * or from a snapshot (its disk, and its memory when it has one). A VM started
 * from saved memory has no vsock device until spaced-vm plugs it in, and
 * learns its identity on the guest's control port.
 *
 * Everything that comes from the VM — console bytes, QMP lines, the guest's
 * answers — is bounded and may only end this execution, never the host's
 * other work.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "spaced_error.h"
#include "log.h"
#include "frame.h"
#include "pidref.h"
#include "resources.h"
#include "util.h"
#include "vm_int.h"

struct vm V = {.ctl_lfd = -1, .sigfd = -1, .kernel_fd = -1, .initrd_fd = -1, .base_fd = -1, .ram_fd = -1, .state_fd = -1,
               .ram_src_fd = -1,
               .base_fmt = "raw", .con = {.rd = -1, .fd = -1, .name = "console"},
               .diag = {.rd = -1, .fd = -1, .name = "diagnostics"}};

/* ---- helpers (vm_int.h) ---- */

void vm_log(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	spaced_log_escape_controls(msg, sizeof msg);
	if (V.have_identity)
		fprintf(stderr, "spaced-vm: sandbox=%s generation=%" PRIu64 " %s\n", V.id.sandbox, V.id.generation, msg);
	else
		fprintf(stderr, "spaced-vm: template %s\n", msg);
}

uint64_t vm_ms_since(uint64_t t0)
{
	return (spaced_mono_ns() - t0) / 1000000u;
}

void vm_sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

int vm_write_file(const char *dir, const char *name, const char *text, mode_t mode)
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

int vm_run_tool(const char *const argv[])
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

int vm_spawn(const char *const argv[], int out_fd, int err_fd, const int *keep, int nkeep, int (*before)(void),
             pid_t *pid, uint64_t *start, char *why, size_t whysz)
{
	int go[2];
	if (nkeep > 8 || pipe2(go, O_CLOEXEC) < 0)
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
		/* the files handed over become descriptors 3, 4, …; first moved out
		 * of the way of that range */
		int moved[8];
		for (int i = 0; i < nkeep; i++)
			if ((moved[i] = fcntl(keep[i], F_DUPFD_CLOEXEC, 16)) < 0)
				_exit(127);
		for (int i = 0; i < nkeep; i++)
			if (dup2(moved[i], 3 + i) < 0)
				_exit(127);
		syscall(SYS_close_range, 3 + nkeep, ~0u, 0);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		signal(SIGPIPE, SIG_DFL);
		if (before != NULL && before() != 0)
			_exit(125);
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

int vm_spawn_wait(const char *const argv[], const int *keep, int nkeep, char *why, size_t whysz)
{
	pid_t p;
	uint64_t st;
	int e = vm_spawn(argv, -1, V.diag.fd, keep, nkeep, NULL, &p, &st, why, whysz);
	if (e < 0)
		return e;
	int status;
	while (waitpid(p, &status, 0) < 0)
		if (errno != EINTR)
			return SPACED_ESYS;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : SPACED_EIO;
}

bool vm_child_gone(pid_t p)
{
	return p <= 0 || waitpid(p, NULL, WNOHANG) == p;
}

/* ---- logs ---- */

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
	while (s->rd >= 0) {
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
			vm_log("%s output reached %u bytes: dropping the rest", s->name, VM_LOG_MAX);
		}
	}
}

/* ---- becoming ready ---- */

/* Checks that neither child ended; drains the logs. */
static int children_alive(char *why, size_t whysz)
{
	log_drain(&V.con);
	log_drain(&V.diag);
	if (vm_child_gone(V.qemu)) {
		V.qemu = 0;
		spaced_why(why, whysz, "QEMU ended during the start (see console.log and vm.log)");
		return SPACED_EIO;
	}
	if (vm_child_gone(V.vsockd)) {
		V.vsockd = 0;
		spaced_why(why, whysz, "spaced-vsockd ended during the start (see vm.log)");
		return SPACED_EIO;
	}
	struct signalfd_siginfo si;
	while (read(V.sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
		if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
			spaced_why(why, whysz, "stopped by signal %u during the start", si.ssi_signo);
			return SPACED_ECLOSED;
		}
	}
	return 0;
}

/* Waits until the guest is what it must be: WAITING for a template, its
 * identity taken on the control port when it came from saved memory, and
 * HELLO answered with that identity. */
static int wait_ready(char *why, size_t whysz)
{
	uint64_t deadline = spaced_mono_ns() + (uint64_t)V.boot_timeout_ms * 1000000u;
	bool identified = !V.need_identity;
	int e = SPACED_ETIMEDOUT;
	char line[SPACED_IDENTITY_TEXT_MAX + 16], answer[SPACED_IDENTITY_TEXT_MAX + 64], w[256];
	while (spaced_mono_ns() < deadline) {
		if ((e = children_alive(why, whysz)) < 0)
			return e;
		w[0] = '\0';
		if (V.template_build) {
			if (vm_guest_control("STATUS", answer, sizeof answer, 3000) == 0 && strcmp(answer, "WAITING") == 0)
				return 0;
		} else if (!identified) {
			snprintf(line, sizeof line, "IDENTITY %s", V.idtext);
			if (vm_guest_control(line, answer, sizeof answer, 3000) == 0) {
				if (strcmp(answer, "READY") != 0) {
					spaced_why(why, whysz, "the guest refused its identity: %.200s", answer);
					return SPACED_EIDENTITY;
				}
				/* its tasks limit: a template was booted without one */
				snprintf(line, sizeof line, "PIDS %" PRIu64, V.pids);
				if (V.pids > 0 && (vm_guest_control(line, answer, sizeof answer, 3000) < 0 ||
				                   strcmp(answer, "OK") != 0)) {
					spaced_why(why, whysz, "the guest did not take its tasks limit: %.200s", answer);
					return SPACED_EPROTO;
				}
				/* the egress link of this worker (a template has none; a
				 * snapshot's was another worker's) */
				snprintf(line, sizeof line, "NET %s %s", V.net_addr, V.net_gw);
				if (V.net_addr[0] && (vm_guest_control(line, answer, sizeof answer, 3000) < 0 ||
				                      strcmp(answer, "OK") != 0))
					vm_log("the guest did not take its network: %.200s (it runs without)", answer);
				identified = true;
				vm_log("identity taken on the control port at %" PRIu64 " ms", vm_ms_since(V.t0));
				continue;
			}
		} else {
			e = vm_guest_hello(w, sizeof w);
			if (e == 0)
				return 0;
			if (e == SPACED_EIDENTITY) {
				spaced_why(why, whysz, "%s", w);
				return e;
			}
		}
		vm_sleep_ms(V.need_identity ? 20 : 25);
	}
	spaced_why(why, whysz, "the guest did not answer within %d ms", V.boot_timeout_ms);
	return SPACED_ETIMEDOUT;
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
	/* pids: the guest's tasks are inside the VM, where the host does not
	 * count them: the guest reports its cgroup's count on its control port
	 * (-1 while paused or when it does not answer within a second) */
	int64_t tasks = -1;
	char ans[64];
	unsigned long long t;
	char extra;
	if (V.ready && !V.paused && vm_guest_control("TASKS", ans, sizeof ans, 1000) == 0 &&
	    sscanf(ans, "OK %llu%c", &t, &extra) == 1 && t < INT64_MAX)
		tasks = (int64_t)t;
	snprintf(reply, sz,
	         "OK cpu_usec=%" PRId64 " cpu_pct=%u.%u memory=%" PRId64 " memory_peak=%" PRId64 " oom_kills=%" PRId64
	         " pids=%" PRId64 " disk=%" PRIu64 " disk_total=%" PRIu64,
	         FIG(u.cpu_usec), V.cpu_pct_x10 / 10, V.cpu_pct_x10 % 10, FIG(u.mem_bytes), FIG(u.mem_peak),
	         FIG(u.oom_kills), tasks, used, V.disk);
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

static int do_pause(char *why, size_t whysz)
{
	if (V.paused)
		return 0;
	uint64_t t = spaced_mono_ns();
	int s = vm_guest_sync();
	if (s < 0)
		vm_log("guest sync before pause failed: %s (pausing anyway)", spaced_strerror(s));
	int e = vm_qmp("stop", why, whysz);
	if (e == 0) {
		V.paused = true;
		vm_transport_reset();
		vm_log("paused (sync %s, %" PRIu64 " ms)", s == 0 ? "done" : "failed", vm_ms_since(t));
	}
	return e;
}

static int do_thaw(char *why, size_t whysz)
{
	if (!V.paused)
		return 0;
	int e = vm_qmp("cont", why, whysz);
	if (e == 0) {
		V.paused = false;
		vm_transport_reset();
		vm_log("thawed");
	}
	return e;
}

/* Saves the VM into dir (which must not exist): its memory and device state
 * when it can (pc: the vsock device is unplugged first — QEMU refuses to
 * save a VM that has one — and plugged again after), its disk as one
 * standalone qcow2 image, and dir/meta. The VM is stopped before and after;
 * to let the device go the guest runs for that moment. */
static int save_vm(const char *dir, char *why, size_t whysz)
{
	char path[PATH_MAX + 32], w[256] = "";
	if (dir[0] != '/') {
		spaced_why(why, whysz, "the snapshot path must be absolute");
		return SPACED_EINVAL;
	}
	if (mkdir(dir, 0700) < 0) {
		spaced_why(why, whysz, "mkdir %s: %s", dir, strerror(errno));
		return errno == EEXIST ? SPACED_EEXIST : SPACED_ESYS;
	}
	uint64_t t = spaced_mono_ns(), t_unplug = 0, t_mem = 0;
	bool memory = false;
	int e;
	if (V.machine == VM_PC) {
		if (V.paused && (e = vm_qmp("cont", w, sizeof w)) < 0) {
			vm_log("cannot resume the VM to unplug its vsock device: %s", w);
		} else {
			V.paused = false;
			e = vm_vsock_unplug(w, sizeof w);
			t_unplug = vm_ms_since(t);
			if (vm_qmp("stop", why, whysz) < 0)
				return SPACED_EIO;
			V.paused = true;
			if (e < 0) {
				vm_log("no memory in this snapshot: %s", w);
			} else {
				/* the device state (the RAM is not in it), then the RAM file:
				 * both as they are while the VM is stopped */
				snprintf(path, sizeof path, "%s/state", dir);
				if ((e = vm_save_state(path, w, sizeof w)) == 0) {
					snprintf(path, sizeof path, "%s/ram", dir);
					e = vm_save_ram(path, w, sizeof w);
				}
				if (e < 0) {
					vm_log("no memory in this snapshot: %s", w);
					snprintf(path, sizeof path, "%s/state", dir);
					unlink(path);
				} else {
					memory = true;
				}
				t_mem = vm_ms_since(t);
			}
			/* the execution goes on having its device (still stopped) */
			if ((e = vm_vsock_plug(w, sizeof w)) < 0)
				vm_log("cannot plug the vsock device back: %s", w);
		}
	}
	snprintf(path, sizeof path, "%s/disk.qcow2", dir);
	if ((e = vm_save_disk(path, why, whysz)) < 0)
		return e;
	if ((e = vm_write_meta(dir, memory)) < 0) {
		spaced_why(why, whysz, "cannot write the snapshot meta");
		return e;
	}
	vm_log("snapshot %s (%s; unplug %" PRIu64 " ms, memory %" PRIu64 " ms, total %" PRIu64 " ms)", dir,
	       memory ? "memory and disk" : "disk only", t_unplug, t_mem, vm_ms_since(t));
	return 0;
}

static int do_snapshot(const char *dir, char *why, size_t whysz)
{
	if (!V.paused) {
		spaced_why(why, whysz, "the execution is not paused");
		return SPACED_EINVAL;
	}
	return save_vm(dir, why, whysz);
}

/* IDENTITY TEXT: the same execution under another activation (S4): the
 * guest takes it on its control port, then every answer carries it. */
static int do_identity(const char *text, char *why, size_t whysz)
{
	struct spaced_identity id;
	char line[SPACED_IDENTITY_TEXT_MAX + 16], answer[SPACED_IDENTITY_TEXT_MAX + 64];
	if (spaced_identity_decode(&id, text, strlen(text)) < 0) {
		spaced_why(why, whysz, "not a canonical execution identity");
		return SPACED_EINVAL;
	}
	if (!V.have_identity || !spaced_identity_activation_change(&V.id, &id)) {
		spaced_why(why, whysz, "only another activation of %s", V.idtext);
		return SPACED_EPERM;
	}
	if (V.paused) {
		spaced_why(why, whysz, "the execution is paused");
		return SPACED_EINVAL;
	}
	snprintf(line, sizeof line, "IDENTITY %s", text);
	int e = vm_guest_control(line, answer, sizeof answer, 3000);
	if (e == 0 && strcmp(answer, "READY") != 0) {
		spaced_why(why, whysz, "the guest refused it: %.200s", answer);
		e = SPACED_EIDENTITY;
	}
	if (e < 0)
		return e;
	V.id = id;
	spaced_identity_encode(&V.id, V.idtext, sizeof V.idtext);
	vm_log("identity %s", V.idtext);
	return 0;
}

static void ctl_reply(int fd, const char *text)
{
	(void)send(fd, text, strlen(text), MSG_NOSIGNAL);
}

/* The worker fences itself when its lease ends: its gate stops every
 * execution. A gate that is not running cannot; the VM is then stopped here
 * once the lease ended, as spaced-launch freezes a process execution
 * (lease.h spaced_lease_watch_step), and started again here only when this
 * stopped it and the gate is back unfenced. */
static void lease_check(void)
{
	char why[256] = "";
	long long ago = 0;
	if (!V.have_identity)
		return;
	switch (spaced_lease_watch_step(&V.lease, V.paused, &ago)) {
	case SPACED_LEASE_FREEZE:
		if (do_pause(why, sizeof why) == 0) {
			V.lease.frozen = true;
			V.lease_stop_failed = false;
			vm_log("the worker's lease ended %lld s ago: stopped until its gate lifts the fence", ago);
		} else if (!V.lease_stop_failed) { /* tried again every second, said once */
			V.lease_stop_failed = true;
			vm_log("the worker's lease ended %lld s ago; stopping the VM failed: %s", ago, why);
		}
		break;
	case SPACED_LEASE_THAW:
		if (do_thaw(why, sizeof why) == 0) {
			vm_log("the worker's lease is valid again and its gate is not fenced: started again");
		} else {
			V.lease.frozen = true; /* still this one's to start: tried again in a second */
			vm_log("starting the VM again failed: %s", why);
		}
		break;
	case SPACED_LEASE_NOTHING:
		break;
	}
}

static void ctl_command(int fd, char *cmd)
{
	char reply[VM_MSG_MAX + PATH_MAX], why[512] = "";
	int e;
	if (strcmp(cmd, "PAUSE") == 0 || strcmp(cmd, "THAW") == 0)
		V.lease.frozen = false; /* the gate decides again: nothing this did not stop last is started here */
	if (strcmp(cmd, "PAUSE") == 0) {
		e = do_pause(why, sizeof why);
		snprintf(reply, sizeof reply, e == 0 ? "OK" : "ERR pause: %s", why[0] ? why : spaced_strerror(e));
	} else if (strcmp(cmd, "THAW") == 0) {
		e = do_thaw(why, sizeof why);
		snprintf(reply, sizeof reply, e == 0 ? "OK" : "ERR thaw: %s", why[0] ? why : spaced_strerror(e));
	} else if (strncmp(cmd, "SNAPSHOT ", 9) == 0) {
		e = do_snapshot(cmd + 9, why, sizeof why);
		snprintf(reply, sizeof reply, e == 0 ? "OK" : "ERR snapshot: %s", why[0] ? why : spaced_strerror(e));
	} else if (strncmp(cmd, "IDENTITY ", 9) == 0) {
		e = do_identity(cmd + 9, why, sizeof why);
		snprintf(reply, sizeof reply, e == 0 ? "OK" : "ERR identity: %s", why[0] ? why : spaced_strerror(e));
	} else if (strcmp(cmd, "STATUS") == 0) {
		snprintf(reply, sizeof reply, "OK ready=%d paused=%d qemu=%d vsockd=%d template=%s identity=%s", V.ready,
		         V.paused, (int)V.qemu, (int)V.vsockd, V.template_dir[0] ? V.template_dir : "-", V.idtext);
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
		    V.nctl >= VM_MAX_CTL) {
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
		vm_sleep_ms(10);
	}
	kill(p, SIGTERM);
	for (int i = 0; i < 300; i++) {
		if (waitpid(p, NULL, WNOHANG) == p) {
			*pp = 0;
			return;
		}
		vm_sleep_ms(10);
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
	if (V.ram_fd >= 0) {
		close(V.ram_fd);
		V.ram_fd = -1;
	}
	if (V.ram_path[0])
		unlink(V.ram_path); /* the guest's memory is gone with it */
	if (V.have_cg)
		sub_cgroup_remove(&V.cg);
	if (!V.keep_state) {
		const char *rm[] = {"rm", "-rf", "--", V.vmdir, NULL};
		vm_run_tool(rm);
	}
	char p[PATH_MAX + 32];
	snprintf(p, sizeof p, "%s/control.sock", V.state);
	unlink(p);
	snprintf(p, sizeof p, "%s/ready", V.state);
	unlink(p);
	snprintf(p, sizeof p, "%s/pids", V.state);
	unlink(p);
}

static void on_signals(void)
{
	struct signalfd_siginfo si;
	while (read(V.sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
		if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
			vm_log("signal %u: stopping", si.ssi_signo);
			V.stop = true;
		}
	}
	for (;;) {
		int st;
		pid_t p = waitpid(-1, &st, WNOHANG);
		if (p <= 0)
			break;
		if (p == V.qemu || p == V.vsockd) {
			vm_log("%s ended (%s %d)", p == V.qemu ? "QEMU" : "spaced-vsockd",
			       WIFEXITED(st) ? "status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
			if (p == V.qemu)
				V.qemu = 0;
			else
				V.vsockd = 0;
			V.stop = true;
		}
	}
}

/* A guest whose kernel lets go of its vsock device (its driver unbound:
 * `echo 1 > /sys/bus/pci/devices/…/remove` as root inside) can no longer be
 * reached, and nothing of it answers: its open streams would wait for good
 * and its sandbox be listed running. A VM that runs without the driver for
 * VM_TRANSPORT_GRACE_MS (time for a rescan to bind it again) is stopped, as
 * if its guest had powered off: the worker sees its execution end (its
 * streams are cut, the control plane is told). Not while paused, before the
 * guest is ready, or while spaced-vm has the device out (a snapshot). */
void vm_transport_reset(void)
{
	V.transport_lost_ns = 0;
	V.transport_at_ns = spaced_mono_ns();
}

static void transport_check(void)
{
	uint64_t now = spaced_mono_ns();
	if (!V.ready || V.paused || !V.vsock_plugged || V.qmp == NULL ||
	    now - V.transport_at_ns < (uint64_t)VM_TRANSPORT_CHECK_MS * 1000000u)
		return;
	V.transport_at_ns = now;
	bool ok = true, running = true;
	char why[256];
	int e = vm_vsock_driver(&ok, &running, why, sizeof why);
	if (e == SPACED_EPERM) {
		/* no such device: the guest had QEMU eject it (ACPI), or let a
		 * snapshot's unplug go late; as lost as an unbound driver */
		bool present = true;
		if (vm_vsock_present(&present, why, sizeof why) == 0 && !present) {
			ok = false;
			e = 0;
		}
	}
	if (e < 0 || ok || !running) {
		if (V.transport_lost_ns != 0 && ok)
			vm_log("the guest's vsock driver holds its device again");
		if (ok)
			V.transport_lost_ns = 0;
		return;
	}
	if (V.transport_lost_ns == 0) {
		V.transport_lost_ns = now;
		vm_log("the guest's vsock driver let go of its device: the VM stops in %d ms unless it takes it again",
		       VM_TRANSPORT_GRACE_MS);
	} else if (now - V.transport_lost_ns >= (uint64_t)VM_TRANSPORT_GRACE_MS * 1000000u) {
		vm_log("the guest has had no vsock driver for %" PRIu64 " ms: stopping the VM (it cannot be reached)",
		       (now - V.transport_lost_ns) / 1000000u);
		V.stop = true;
	}
}

static void loop(void)
{
	while (!V.stop) {
		struct pollfd pf[5 + VM_MAX_CTL];
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
		transport_check();
		lease_check();
		if (r <= 0)
			continue;
		if (pf[0].revents)
			on_signals();
		if (pf[1].revents)
			ctl_accept();
		if (pf[2].revents)
			log_drain(&V.con);
		if (pf[3].revents)
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

/* ---- templates ---- */

/* Makes sure IMAGES/cache holds a booted template for this VM's shape, and
 * sets V.template_dir to it: built once, under a lock, by a `spaced-vm
 * template` child running as this execution's uid. A template that cannot be
 * built leaves V.template_dir empty: the VM boots cold. */
static void template_ensure(const char *self)
{
	char dir[PATH_MAX], meta[PATH_MAX + 16], lockp[PATH_MAX + 32], tmp[PATH_MAX + 32], state[PATH_MAX + 32],
	    run[PATH_MAX + 16], cache[PATH_MAX + 16], mem[32], disk[32], cpus[16], uid[16], cid[16];
	if (vm_template_path(dir, sizeof dir) < 0)
		return;
	snprintf(meta, sizeof meta, "%s/meta", dir);
	if (access(meta, R_OK) == 0) {
		snprintf(V.template_dir, sizeof V.template_dir, "%s", dir);
		return;
	}
	snprintf(cache, sizeof cache, "%s/cache", V.images);
	if (mkdir(cache, 0755) < 0 && errno != EEXIST)
		return;
	snprintf(lockp, sizeof lockp, "%s/.template.lock", cache);
	int lk = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (lk < 0 || flock(lk, LOCK_EX) < 0) {
		if (lk >= 0)
			close(lk);
		return;
	}
	if (access(meta, R_OK) != 0) {
		uint64_t t = spaced_mono_ns();
		snprintf(tmp, sizeof tmp, "%s.tmp.%d", dir, (int)getpid());
		snprintf(state, sizeof state, "%s/template", V.state);
		snprintf(run, sizeof run, "%s.t", V.vmdir);
		snprintf(mem, sizeof mem, "%" PRIu64, V.memory);
		snprintf(disk, sizeof disk, "%" PRIu64, V.disk);
		spaced_cpus_format(V.cpu_milli, cpus);
		snprintf(uid, sizeof uid, "%u", (unsigned)V.uid);
		snprintf(cid, sizeof cid, "%u", V.cid);
		const char *rm[] = {"rm", "-rf", "--", tmp, NULL};
		vm_run_tool(rm);
		char boot[16];
		snprintf(boot, sizeof boot, "%d", V.boot_timeout_ms);
		const char *argv[] = {self, "template", "--state", state, "--images", V.images, "--out", tmp, "--memory", mem,
		                      "--disk", disk, "--cpus", cpus, "--uid", uid, "--cid", cid, "--run-dir", run,
		                      "--qemu", V.qemu_bin, "--vsockd", V.vsockd_bin, "--accel", V.accel,
		                      "--boot-timeout-ms", boot, "--ram-dir", V.ram_dir, NULL};
		int e = vm_run_tool(argv);
		if (e == 0 && rename(tmp, dir) == 0) {
			vm_log("built the template %s (%" PRIu64 " ms)", dir, vm_ms_since(t));
		} else {
			vm_log("cannot build a template (see %s/vm.log): a cold boot", state);
			vm_run_tool(rm);
		}
		const char *rms[] = {"rm", "-rf", "--", state, NULL};
		vm_run_tool(rms);
	}
	close(lk);
	if (access(meta, R_OK) == 0)
		snprintf(V.template_dir, sizeof V.template_dir, "%s", dir);
}

/* ---- the command line ---- */

/* The sandbox's settings for its guest: one JSON object on one line (it
 * goes to the guest's control port as a line), at most VM_CONFIG_MAX bytes. */
#define VM_CONFIG_MAX 12288
static int read_config(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return SPACED_ESYS;
	char *buf = malloc(VM_CONFIG_MAX + 1);
	size_t n = 0;
	ssize_t r = 1;
	while (buf && n < VM_CONFIG_MAX + 1 && (r = read(fd, buf + n, VM_CONFIG_MAX + 1 - n)) > 0)
		n += (size_t)r;
	close(fd);
	if (!buf || r < 0 || n == 0 || n > VM_CONFIG_MAX || memchr(buf, '\n', n) || memchr(buf, '\0', n)) {
		free(buf);
		return SPACED_EINVAL;
	}
	buf[n] = '\0';
	free(V.config);
	V.config = buf;
	return 0;
}

/* Hands the sandbox's settings to the guest (before any request reaches it). */
static int send_config(char *why, size_t whysz)
{
	char answer[256];
	if (V.config == NULL)
		return 0;
	size_t n = strlen(V.config) + 8;
	char *line = malloc(n);
	if (line == NULL)
		return SPACED_ENOMEM;
	snprintf(line, n, "CONFIG %s", V.config);
	int e = vm_guest_control(line, answer, sizeof answer, 5000);
	free(line);
	if (e == 0 && strcmp(answer, "OK") != 0)
		e = SPACED_EPROTO;
	if (e < 0)
		spaced_why(why, whysz, "the guest did not take the sandbox's settings: %.200s",
		           e == SPACED_EPROTO ? answer : spaced_strerror(e));
	return e;
}

static void usage(void)
{
	fprintf(stderr,
	        "usage: spaced-vm --state DIR --images DIR --identity TEXT [--cid N] [--port N]\n"
	        "                 [--cpus N] [--memory SIZE] [--pids N] [--disk SIZE] [--disk-bps SIZE]\n"
	        "                 [--disk-iops N] [--uid N]\n"
	        "                 [--restore SNAPDIR] [--qemu PATH] [--vsockd PATH] [--accel tcg|kvm]\n"
	        "                 [--machine pc|microvm] [--no-template] [--boot-timeout-ms MS] [--uid-lock DIR]\n"
	        "                 [--lease-file PATH]\n"
	        "                 [--run-dir DIR] [--ram-dir DIR] [--net ADDRESS/PREFIX,GATEWAY] [--kernel-args ARGS]\n"
	        "                 [--keep-state] [--config-file FILE]\n"
	        "       spaced-vm template --state DIR --images DIR --out DIR [same options, no identity]\n"
	        "       spaced-vm ctl --state DIR PAUSE|THAW|STATUS|USAGE|STOP|SNAPSHOT DIR|IDENTITY TEXT\n");
	exit(2);
}

static int ctl_main(int argc, char **argv)
{
	char cmd[VM_MSG_MAX], reply[VM_MSG_MAX + PATH_MAX + 1], path[PATH_MAX + 16];
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
		spaced_log_escape_controls(reply, sizeof reply);
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

/* Starts the VM described by V: disk, back-end, QEMU, QMP, and (from saved
 * memory) the memory loaded, the vsock device plugged, the VM running. */
static int start_vm(int con_w, int diag_w, char *why, size_t whysz)
{
	uint64_t t_disk, t_vsockd, t_qemu, t_qmp, t_mem = 0;
	int e;
	if ((e = vm_make_disk(why, whysz)) < 0 || (e = vm_make_ram(why, whysz)) < 0)
		return e;
	t_disk = vm_ms_since(V.t0);
	if ((e = vm_start_vsockd(diag_w, why, whysz)) < 0)
		return e;
	t_vsockd = vm_ms_since(V.t0);
	if ((e = vm_start_qemu(con_w, diag_w, why, whysz)) < 0)
		return e;
	t_qemu = vm_ms_since(V.t0);
	char qmp[PATH_MAX + 16];
	snprintf(qmp, sizeof qmp, "%s/qmp.sock", V.vmdir);
	if ((e = qmp_open(qmp, 20000, &V.qmp)) < 0) {
		spaced_why(why, whysz, "QMP: %s", spaced_strerror(e));
		return e;
	}
	t_qmp = vm_ms_since(V.t0);
	if ((e = vm_qmp_setup(why, whysz)) < 0)
		return e;
	if (V.state_fd >= 0) {
		if ((e = vm_load_state(why, whysz)) < 0 || (e = vm_vsock_plug(why, whysz)) < 0 ||
		    (e = vm_qmp("cont", why, whysz)) < 0)
			return e;
		t_mem = vm_ms_since(V.t0);
		close(V.state_fd);
		V.state_fd = -1;
	}
	vm_log("started: disk %" PRIu64 " ms, back-end %" PRIu64 ", QEMU %" PRIu64 ", QMP %" PRIu64 "%s%s", t_disk,
	       t_vsockd, t_qemu, t_qmp, t_mem ? ", memory loaded and vsock plugged " : "",
	       t_mem ? (V.restore ? "(from the snapshot)" : "(from the template)") : "");
	if (t_mem)
		vm_log("memory at %" PRIu64 " ms", t_mem);
	return 0;
}

static int run(int argc, char **argv, bool template_mode)
{
	const char *state = NULL, *images = NULL, *identity = NULL, *out = NULL;
	uint64_t v;
	V.qemu_bin = "/usr/bin/qemu-system-x86_64";
	V.vsockd_bin = NULL;
	V.accel = "tcg";
	V.machine = VM_PC;
	V.cid = 3;
	V.port = VM_GUEST_PORT_DEFAULT;
	V.memory = 256ull << 20;
	V.disk = 1ull << 30;
	V.pids = 0;
	V.cpu_milli = 1000;
	V.boot_timeout_ms = 120000;
	V.template_build = template_mode;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--keep-state") == 0) {
			V.keep_state = true;
			continue;
		}
		if (strcmp(a, "--no-template") == 0) {
			V.no_template = true;
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
		else if (strcmp(a, "--identity") == 0 && !template_mode)
			identity = val;
		else if (strcmp(a, "--out") == 0 && template_mode)
			out = val;
		else if (strcmp(a, "--restore") == 0 && !template_mode)
			V.restore = val;
		else if (strcmp(a, "--uid-lock") == 0)
			V.uid_lock = val;
		else if (strcmp(a, "--lease-file") == 0 && !template_mode)
			V.lease.path = val;
		else if (strcmp(a, "--run-dir") == 0)
			V.run_dir = val;
		else if (strcmp(a, "--ram-dir") == 0)
			V.ram_dir = val;
		else if (strcmp(a, "--config-file") == 0 && !template_mode)
			ok = read_config(val) == 0;
		else if (strcmp(a, "--net") == 0) {
			/* ADDRESS/PREFIX,GATEWAY */
			const char *comma = strchr(val, ',');
			ok = comma != NULL && (size_t)(comma - val) < sizeof V.net_addr && strlen(comma + 1) < sizeof V.net_gw &&
			     strspn(val, "0123456789./,") == strlen(val);
			if (ok) {
				memcpy(V.net_addr, val, (size_t)(comma - val));
				V.net_addr[comma - val] = '\0';
				snprintf(V.net_gw, sizeof V.net_gw, "%s", comma + 1);
			}
		}
		else if (strcmp(a, "--kernel-args") == 0)
			V.kernel_args = val; /* before spaced's own: they cannot replace them */
		else if (strcmp(a, "--qemu") == 0)
			V.qemu_bin = val;
		else if (strcmp(a, "--vsockd") == 0)
			V.vsockd_bin = val;
		else if (strcmp(a, "--accel") == 0) {
			ok = strcmp(val, "tcg") == 0 || strcmp(val, "kvm") == 0;
			V.accel = val;
		} else if (strcmp(a, "--machine") == 0) {
			ok = strcmp(val, "pc") == 0 || strcmp(val, "microvm") == 0;
			V.machine = strcmp(val, "pc") == 0 ? VM_PC : VM_MICROVM;
		} else if (strcmp(a, "--cid") == 0) {
			ok = parse_u64(val, 3, UINT32_MAX - 1, &v) == 0;
			V.cid = (uint32_t)v;
		} else if (strcmp(a, "--port") == 0) {
			ok = parse_u64(val, 1, UINT32_MAX - 1, &v) == 0 && v != VM_CTL_PORT;
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
		else if (strcmp(a, "--disk-bps") == 0)
			ok = spaced_size_parse(val, &V.disk_bps) == 0 && V.disk_bps <= (UINT64_C(1) << 50);
		else if (strcmp(a, "--disk-iops") == 0)
			ok = parse_u64(val, 0, UINT32_MAX, &V.disk_iops) == 0;
		else
			ok = false;
		if (!ok) {
			fprintf(stderr, "spaced-vm: bad option or value: %s %s\n", a, val);
			usage();
		}
	}
	if (state == NULL || images == NULL || (!template_mode && identity == NULL) || (template_mode && out == NULL))
		usage();
	if (template_mode && V.machine != VM_PC) {
		fprintf(stderr, "spaced-vm: a template needs the pc machine (its memory is saved)\n");
		return 2;
	}
	if (identity != NULL) {
		if (spaced_identity_decode(&V.id, identity, strlen(identity)) < 0 ||
		    spaced_identity_encode(&V.id, V.idtext, sizeof V.idtext) < 0) {
			fprintf(stderr, "spaced-vm: --identity is not a canonical execution identity\n");
			return 2;
		}
		V.have_identity = true;
	}
	V.memory = (V.memory + (1u << 20) - 1) & ~((uint64_t)(1u << 20) - 1);
	V.disk &= ~(uint64_t)4095;
	if (realpath(images, V.images) == NULL) {
		fprintf(stderr, "spaced-vm: --images %s: %s\n", images, strerror(errno));
		return 1;
	}
	char self[PATH_MAX];
	ssize_t sn = readlink("/proc/self/exe", self, sizeof self - 1);
	if (sn <= 0) {
		fprintf(stderr, "spaced-vm: /proc/self/exe: %s\n", strerror(errno));
		return 1;
	}
	self[sn] = '\0';
	static char vsockd_default[PATH_MAX + 32];
	if (V.vsockd_bin == NULL) {
		/* beside this binary, as the build and the install put them */
		snprintf(vsockd_default, sizeof vsockd_default, "%s", self);
		char *slash = strrchr(vsockd_default, '/');
		if (slash)
			snprintf(slash, sizeof vsockd_default - (size_t)(slash - vsockd_default), "/spaced-vsockd");
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
		vm_run_tool(rm); /* what an execution of this uid range that died left */
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
	/* the guest's RAM: a file on tmpfs (its pages are memory, not disk),
	 * named after the uid range, which is this execution's alone */
	if (V.ram_dir == NULL)
		V.ram_dir = VM_RAM_DIR;
	if ((mkdir(V.ram_dir, 0711) < 0 && errno != EEXIST) ||
	    (size_t)snprintf(V.ram_path, sizeof V.ram_path, "%s/%u%s.ram", V.ram_dir, (unsigned)V.uid,
	                     template_mode ? "-template" : "") >= sizeof V.ram_path) {
		fprintf(stderr, "spaced-vm: cannot use %s for the guest's RAM\n", V.ram_dir);
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
	if (!template_mode && V.machine == VM_PC && V.restore == NULL && !V.no_template)
		template_ensure(self);

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
	if (e == 0)
		e = start_vm(con_w, diag_w, why, sizeof why);
	if (con_w >= 0)
		close(con_w);
	if (diag_w >= 0)
		close(diag_w);
	if (e == 0)
		e = wait_ready(why, sizeof why);
	if (e == 0 && !template_mode)
		e = send_config(why, sizeof why);
	if (e == 0 && template_mode) {
		/* the guest is up and has no identity yet: save it as it is, its
		 * clean caches dropped */
		char answer[64];
		int s = vm_guest_control("TRIM", answer, sizeof answer, VM_SYNC_TIMEOUT_MS);
		if (s < 0 || strcmp(answer, "OK") != 0)
			vm_log("trimming the template's memory failed: %s", s < 0 ? spaced_strerror(s) : answer);
		if ((e = vm_qmp("stop", why, sizeof why)) == 0) {
			V.paused = true;
			e = save_vm(out, why, sizeof why);
		}
		if (e == 0) {
			/* a template without its memory is no template */
			char mp[PATH_MAX + 16], sp[PATH_MAX + 16];
			snprintf(mp, sizeof mp, "%s/ram", out);
			snprintf(sp, sizeof sp, "%s/state", out);
			if (access(mp, R_OK) != 0 || access(sp, R_OK) != 0) {
				spaced_why(why, sizeof why, "the template's memory could not be saved");
				e = SPACED_EIO;
			}
		}
		if (e == 0)
			vm_log("saved to %s in %" PRIu64 " ms", out, vm_ms_since(V.t0));
		else {
			spaced_log_escape_controls(why, sizeof why);
			fprintf(stderr, "spaced-vm: template: %s\n", why[0] ? why : spaced_strerror(e));
		}
		shutdown_vm();
		return e == 0 ? 0 : 1;
	}
	char text[128];
	if (e == 0) {
		snprintf(text, sizeof text, "vsockd %d %" PRIu64 "\nqemu %d %" PRIu64 "\n", (int)V.vsockd, V.vsockd_start,
		         (int)V.qemu, V.qemu_start);
		e = vm_write_file(V.state, "pids", text, 0644);
	}
	if (e == 0)
		e = ctl_listen();
	if (e == 0) {
		uint64_t ms = vm_ms_since(V.t0);
		snprintf(text, sizeof text, "READY %" PRIu64 "\n", ms);
		e = vm_write_file(V.state, "ready", text, 0644);
		if (e == 0) {
			V.ready = true;
			printf("READY %" PRIu64 "\n", ms);
			fflush(stdout);
			vm_log("ready in %" PRIu64 " ms (%s; qemu %d, spaced-vsockd %d, cid %u)", ms,
			       V.restore ? (V.need_identity ? "from a memory snapshot" : "a boot of a snapshot's disk")
			                 : V.template_dir[0] ? "from a template" : "a cold boot",
			       (int)V.qemu, (int)V.vsockd, V.cid);
		}
	}
	if (e < 0) {
		spaced_log_escape_controls(why, sizeof why);
		fprintf(stderr, "spaced-vm: execution setup failed: %s\n", why[0] ? why : spaced_strerror(e));
		shutdown_vm();
		return 1;
	}
	loop();
	shutdown_vm();
	vm_log("stopped");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "ctl") == 0)
		return ctl_main(argc - 1, argv + 1);
	if (argc >= 2 && strcmp(argv[1], "template") == 0)
		return run(argc - 1, argv + 1, true);
	return run(argc, argv, false);
}
