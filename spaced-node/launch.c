/*
 * launch.c — spaced-launch: creates one execution of the process substrate
 * and supervises it in the foreground (the "VMM" role): it owns the guest
 * transport socket STATE/guest.sock (Firecracker's host-side vsock handshake)
 * and a control socket STATE/control.sock. See docs/substrate.md.
 *
 *   spaced-launch --state DIR --guest PATH [--identity TEXT] [--base DIR | --template DIR]
 *                 [--cpus N] [--memory SIZE] [--pids N] [--disk SIZE] [--disk-bps SIZE]
 *                 [--disk-iops N] [--uid-base N]
 *                 [--uid-lock DIR] [--hostname NAME] [--restore SNAPDIR] [--keep-state] [--service-ports]
 *                 [--lease-file PATH]
 *   spaced-launch ctl --state DIR PAUSE|THAW|STATUS|USAGE|STOP|SNAPSHOT DIR|IDENTITY TEXT
 *   spaced-launch exec --state DIR [--cwd DIR] -- CMD [ARG...]
 *   spaced-launch reap      (kill and remove what launchers killed with SIGKILL left)
 *   spaced-launch cap MEMORY TASKS   (all executions together: spaced_sub_cap_all)
 */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "spaced_error.h"
#include "log.h"
#include "identity.h"
#include "lease.h"
#include "pidref.h"
#include "resources.h"
#include "substrate.h"
#include "util.h"
#include "vsock_hs.h"

#define MAX_HS 64          /* handshakes in progress */
#define MAX_CTL 8          /* control connections */
#define HS_TIMEOUT_MS 5000 /* a client has this long to send its CONNECT line */
#define LOCAL_PORT_FIRST (1u << 30)

struct hs {
	int fd;
	uint64_t deadline;
};

struct launcher {
	char state[PATH_MAX];
	char guest_sock[PATH_MAX];
	char ctl_sock[PATH_MAX];
	struct spaced_sub *sub;
	int guest_lfd, ctl_lfd, sigfd;
	struct hs hs[MAX_HS];
	int nhs;
	int ctl[MAX_CTL];
	int nctl;
	uint32_t next_local_port;
	uint64_t t0; /* start of the creation, for create-to-ready */
	int log_rd;     /* read end of the guest's stdout/stderr pipe */
	int log_fd;     /* STATE/guest.log */
	uint64_t log_written;
	bool log_capped;
	bool pooled;    /* started without identity (warm pool) */
	bool stop;
	/* --lease-file: the worker's lease (spaced-node's STATE/lease, wall-clock
	 * seconds); once it has ended the execution is frozen here, whether the
	 * gate is there to fence or not (lease_check) */
	struct spaced_lease_watch lease;
	/* a CLOCK_REALTIME timer at the second the lease says it ends (lease.h
	 * spaced_lease_watch_due): the lease is read then, not every second while
	 * it is valid (a thousand idle executions: a thousand wake-ups a second) */
	int lease_tfd;
	long long lease_armed; /* the second it is set to, 0: not set */
	/* CPU use over the last sampling interval (cpu_sample) */
	uint64_t cpu_at_ns, cpu_at_usec;
	uint32_t cpu_pct_x10; /* percent of one CPU, in tenths */
	/* the spread rule (spread_sample): its next sample, or off for good */
	uint64_t spread_due_ns;
	bool spread_off;
};

/* The execution's CPU time is sampled when USAGE asks (at most every
 * CPU_SAMPLE_MIN) and at least every CPU_SAMPLE_MAX: the share of a CPU it
 * used since the previous sample is what USAGE reports — the last second for
 * a client asking every second, at most the last half minute for one asking
 * once. A launcher per execution woke every second only for this: a worker
 * of a thousand executions took a thousand wake-ups a second. */
#define CPU_SAMPLE_MIN 200000000ull    /* ns */
#define CPU_SAMPLE_MAX 30000000000ull  /* ns */
static void cpu_sample(struct launcher *L, uint64_t now, bool asked)
{
	struct spaced_sub_usage u;

	if (L->cpu_at_ns != 0 && now - L->cpu_at_ns < (asked ? CPU_SAMPLE_MIN : CPU_SAMPLE_MAX))
		return;
	spaced_sub_usage(L->sub, &u);
	if (u.cpu_usec == UINT64_MAX)
		return;
	if (L->cpu_at_ns != 0 && u.cpu_usec >= L->cpu_at_usec)
		L->cpu_pct_x10 = (uint32_t)((u.cpu_usec - L->cpu_at_usec) * 1000u / ((now - L->cpu_at_ns) / 1000u + 1));
	L->cpu_at_ns = now;
	L->cpu_at_usec = u.cpu_usec;
}

/* The guest's output goes through a pipe the supervisor drains, so nothing
 * inside can fill the host's disk through it: past this size it is dropped. */
#define GUEST_LOG_MAX (8u << 20)

static void usage(void)
{
	fprintf(stderr,
	        "usage: spaced-launch --state DIR --guest PATH [--identity TEXT] [--base DIR | --template DIR]\n"
	        "                     [--cpus N] [--memory SIZE] [--pids N] [--disk SIZE] [--disk-bps SIZE]\n"
	        "                     [--disk-iops N] [--uid-base N]\n"
	        "                     [--uid-lock DIR] [--hostname NAME] [--restore SNAPDIR] [--keep-state] [--service-ports]\n"
	        "                     [--lease-file PATH]\n"
	        "       spaced-launch ctl --state DIR PAUSE|THAW|STATUS|USAGE|STOP|SNAPSHOT DIR|IDENTITY TEXT\n"
	        "       spaced-launch exec --state DIR [--cwd DIR] -- CMD [ARG...]\n"
	        "       spaced-launch reap\n"
	        "       spaced-launch cap MEMORY TASKS\n");
	exit(2);
}

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The sandbox that claimed this pooled execution, "" before: its lines go
 * on to the pool's log (the stderr it was started with), and name it. */
static char claimed_by[SPACED_NAME_MAX];

/* One structured line per event on stderr, in one write (a claim logs twice). */
static void logf_(const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	int n = claimed_by[0] ? snprintf(line, sizeof(line), "spaced-launch[%d] %s: ", (int)getpid(), claimed_by)
	                      : snprintf(line, sizeof(line), "spaced-launch[%d]: ", (int)getpid());

	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	spaced_log_escape_controls(line + n, sizeof(line) - (size_t)n - 1); /* one line, whatever a reason holds */
	n += (int)strlen(line + n);
	if ((size_t)n > sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, (size_t)n) < 0)
		return; /* nowhere to say it */
}

/* A listening socket at path that appears there only once it listens, with
 * its final mode: bound under a temporary name, then renamed into place. */
static int listen_unix(const char *path, int type, mode_t mode)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, n;

	n = snprintf(sa.sun_path, sizeof(sa.sun_path), "%s.tmp", path);
	if (n < 0 || (size_t)n >= sizeof(sa.sun_path))
		return SPACED_ETOOBIG;
	fd = socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return SPACED_ESYS;
	(void)unlink(sa.sun_path);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || chmod(sa.sun_path, mode) < 0 ||
	    listen(fd, 64) < 0 || rename(sa.sun_path, path) < 0) {
		(void)unlink(sa.sun_path);
		close(fd);
		return SPACED_ESYS;
	}
	return fd;
}

static int connect_unix(const char *path, int type)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -1;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Writes STATE/name atomically (a temporary file renamed into place). The
 * temporary file is reused when it exists: prepare_file() creates it ahead of
 * time, so the write at a claim allocates no inode (on ext4 an allocation
 * right after many deletions scans the inode bitmap for a long time). */
static int write_file(const char *dir, const char *name, const char *text)
{
	char path[PATH_MAX + 64], tmp[PATH_MAX + 80];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", dir, name);
	return spaced_file_replace(tmp, path, text, strlen(text), 0644, false) < 0 ? -1 : 0;
}

/* Creates the empty temporary file write_file() will use for name. */
static void prepare_file(const char *dir, const char *name)
{
	char tmp[PATH_MAX + 80];
	snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", dir, name);
	spaced_file_prepare(tmp, 0644);
}

/* ---- guest transport ------------------------------------------------------ */

static void hs_drop(struct launcher *L, int i)
{
	close(L->hs[i].fd);
	L->hs[i] = L->hs[--L->nhs];
}

/* One step of a CONNECT handshake; returns true when the entry is finished
 * (handed over or refused) and must leave the table. */
static bool hs_step(struct launcher *L, struct hs *h)
{
	uint8_t buf[SPACED_VSOCK_HS_MAX];
	char ok[SPACED_VSOCK_HS_MAX];
	uint32_t port;
	ssize_t n;
	int len, flags;

	n = recv(h->fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return false;
	if (n <= 0)
		return true;
	len = spaced_vsock_hs_line_len(buf, (size_t)n);
	if (len == 0)
		return false; /* more to come */
	if (len < 0) {
		logf_("guest.sock: handshake refused (%s)", spaced_strerror(len));
		return true;
	}
	/* consume exactly the line: what follows belongs to the guest's stream */
	if (recv(h->fd, buf, (size_t)len, MSG_DONTWAIT) != len)
		return true;
	if (spaced_vsock_hs_parse_connect(buf, (size_t)len, &port) < 0) {
		logf_("guest.sock: handshake refused (malformed CONNECT line)");
		return true;
	}
	len = spaced_vsock_hs_format_ok(ok, sizeof(ok), L->next_local_port++);
	if (len < 0 || send(h->fd, ok, (size_t)len, MSG_NOSIGNAL) != len)
		return true;
	flags = fcntl(h->fd, F_GETFL);
	if (flags >= 0)
		(void)fcntl(h->fd, F_SETFL, flags & ~O_NONBLOCK);
	if (spaced_sub_send_conn(L->sub, port, h->fd) < 0)
		logf_("guest.sock: handing port %u to the guest failed", (unsigned)port);
	return true;
}

static void guest_accept(struct launcher *L)
{
	for (;;) {
		int fd = accept4(L->guest_lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

		if (fd < 0)
			return;
		if (L->nhs >= MAX_HS) {
			close(fd);
			continue;
		}
		L->hs[L->nhs].fd = fd;
		L->hs[L->nhs].deadline = spaced_mono_ns() + (uint64_t)HS_TIMEOUT_MS * 1000000u;
		L->nhs++;
	}
}

/* ---- control socket -------------------------------------------------------- */

static void ctl_reply(int fd, const char *text, int pass_fd)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} cb;
	struct iovec iov = { .iov_base = (void *)(uintptr_t)text, .iov_len = strlen(text) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (pass_fd >= 0) {
		struct cmsghdr *c;

		memset(&cb, 0, sizeof(cb));
		mh.msg_control = cb.b;
		mh.msg_controllen = sizeof(cb.b);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
	}
	(void)sendmsg(fd, &mh, MSG_NOSIGNAL);
}

/* The worker fences itself when its lease ends (spaced-node gate_fence.c):
 * its gate freezes every execution. A gate that is not running (stopped,
 * restarting, crashing) cannot; the launcher then freezes its own execution
 * once the lease in --lease-file has ended, and thaws only what it froze
 * itself (lease.h spaced_lease_watch_step). Pool executions not yet claimed
 * are left to their worker. */
static void lease_check(struct launcher *L)
{
	long long ago = 0;
	if (spaced_sub_identity(L->sub) == NULL)
		return;
	switch (spaced_lease_watch_step(&L->lease, spaced_sub_paused(L->sub), &ago)) {
	case SPACED_LEASE_FREEZE:
		if (spaced_sub_pause(L->sub) == 0) {
			L->lease.frozen = true;
			logf_("the worker's lease ended %lld s ago: frozen until its gate lifts the fence", ago);
		}
		break;
	case SPACED_LEASE_THAW:
		if (spaced_sub_thaw(L->sub) == 0) {
			logf_("the worker's lease is valid again and its gate is not fenced: thawed");
		} else {
			L->lease.frozen = true; /* still the launcher's to thaw: tried again in a second */
			logf_("thawing after the lease failed");
		}
		break;
	case SPACED_LEASE_NOTHING:
		break;
	}
}

static void ctl_command(struct launcher *L, int fd, char *cmd)
{
	char reply[SPACED_SUB_MSG_MAX], why[512] = "";
	const struct spaced_pidref *init = spaced_sub_init(L->sub);
	int r;

	if (strcmp(cmd, "PAUSE") == 0 || strcmp(cmd, "THAW") == 0)
		L->lease.frozen = false; /* the gate decides again: the launcher thaws nothing it did not freeze last */
	if (strcmp(cmd, "PAUSE") == 0) {
		r = spaced_sub_pause(L->sub);
		snprintf(reply, sizeof(reply), r == 0 ? "OK" : "ERR pause: %s", spaced_strerror(r));
		if (r == 0)
			logf_("paused");
	} else if (strcmp(cmd, "THAW") == 0) {
		r = spaced_sub_thaw(L->sub);
		snprintf(reply, sizeof(reply), r == 0 ? "OK" : "ERR thaw: %s", spaced_strerror(r));
		if (r == 0)
			logf_("thawed");
	} else if (strncmp(cmd, "SNAPSHOT ", 9) == 0) {
		r = spaced_sub_snapshot(L->sub, cmd + 9, why, sizeof(why));
		if (r == 0)
			snprintf(reply, sizeof(reply), "OK");
		else
			snprintf(reply, sizeof(reply), "ERR snapshot: %s", why[0] ? why : spaced_strerror(r));
		logf_("snapshot %s: %s", cmd + 9, r == 0 ? "ok" : reply);
	} else if (strncmp(cmd, "IDENTITY ", 9) == 0) {
		struct spaced_identity id;

		r = spaced_identity_decode(&id, cmd + 9, strlen(cmd + 9));
		if (r == 0)
			r = spaced_sub_set_identity(L->sub, &id);
		if (r == 0) {
			/* the answer first: the claimer waits for it, the file is informational */
			ctl_reply(fd, "OK", -1);
			(void)write_file(L->state, "identity", cmd + 9);
			logf_("identity %s", cmd + 9);
			if (L->pooled)
				snprintf(claimed_by, sizeof(claimed_by), "%s", id.sandbox);
			return;
		} else {
			snprintf(reply, sizeof(reply), "ERR identity: %s", spaced_strerror(r));
		}
	} else if (strncmp(cmd, "CONFIG ", 7) == 0) {
		/* the sandbox's settings, passed on to the guest before anything
		 * that follows on this connection (its IDENTITY, its first CONN) */
		r = spaced_sub_send_config(L->sub, cmd + 7);
		snprintf(reply, sizeof(reply), r == 0 ? "OK" : "ERR config: %s", spaced_strerror(r));
	} else if (strcmp(cmd, "STATUS") == 0) {
		char idtext[SPACED_IDENTITY_TEXT_MAX] = "-";
		const struct spaced_identity *id = spaced_sub_identity(L->sub);

		if (id != NULL)
			spaced_identity_encode(id, idtext, sizeof(idtext));
		snprintf(reply, sizeof(reply), "OK ready=%d paused=%d init=%d start=%" PRIu64 " identity=%s",
		         spaced_sub_ready(L->sub), spaced_sub_paused(L->sub), (int)init->pid,
		         init->start_time, idtext);
	} else if (strcmp(cmd, "USAGE") == 0) {
		struct spaced_sub_usage u;
		char held[256];

		cpu_sample(L, spaced_mono_ns(), true);
		spaced_sub_usage(L->sub, &u);
		spaced_sub_cpus_held(L->sub, held, sizeof(held));
		/* unknown figures (UINT64_MAX) are printed as -1 */
#define FIG(v) ((v) == UINT64_MAX ? (int64_t)-1 : (int64_t)(v))
		snprintf(reply, sizeof(reply),
		         "OK cpu_usec=%" PRId64 " cpu_pct=%u.%u memory=%" PRId64 " memory_peak=%" PRId64
		         " oom_kills=%" PRId64 " pids=%" PRId64 " disk=%" PRIu64 " disk_total=%" PRIu64 " cpus_held=%s",
		         FIG(u.cpu_usec), L->cpu_pct_x10 / 10, L->cpu_pct_x10 % 10, FIG(u.memory_bytes),
		         FIG(u.memory_peak), FIG(u.oom_kills), FIG(u.pids), u.disk_bytes, u.disk_total,
		         held[0] ? held : "-");
#undef FIG
	} else if (strcmp(cmd, "PIDFD") == 0) {
		ctl_reply(fd, "OK", init->pidfd);
		return;
	} else if (strcmp(cmd, "STOP") == 0) {
		snprintf(reply, sizeof(reply), "OK");
		L->stop = true;
	} else {
		snprintf(reply, sizeof(reply), "ERR unknown command");
	}
	ctl_reply(fd, reply, -1);
}

static void ctl_accept(struct launcher *L)
{
	for (;;) {
		struct ucred cr;
		socklen_t len = sizeof(cr);
		int fd = accept4(L->ctl_lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

		if (fd < 0)
			return;
		/* only the launcher's own user (or root) drives it */
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0 ||
		    (cr.uid != 0 && cr.uid != geteuid()) || L->nctl >= MAX_CTL) {
			close(fd);
			continue;
		}
		L->ctl[L->nctl++] = fd;
	}
}

static bool ctl_step(struct launcher *L, int fd)
{
	char buf[SPACED_SUB_MSG_MAX + 1];
	ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_TRUNC);

	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return false;
	if (n <= 0)
		return true;
	if ((size_t)n > sizeof(buf) - 1 || memchr(buf, '\0', (size_t)n) != NULL) {
		ctl_reply(fd, "ERR malformed command", -1);
		return true;
	}
	buf[n] = '\0';
	ctl_command(L, fd, buf);
	return false;
}

/* ---- guest output ------------------------------------------------------------ */

static void log_drain(struct launcher *L)
{
	char buf[65536];

	for (;;) {
		ssize_t n = read(L->log_rd, buf, sizeof(buf));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return;
		if (L->log_written + (uint64_t)n <= GUEST_LOG_MAX) {
			if (L->log_fd >= 0 && write(L->log_fd, buf, (size_t)n) == n)
				L->log_written += (uint64_t)n;
		} else if (!L->log_capped) {
			static const char note[] = "\n[spaced-launch: guest output past 8 MiB dropped]\n";

			if (L->log_fd >= 0)
				(void)!write(L->log_fd, note, sizeof(note) - 1);
			L->log_capped = true;
			logf_("guest output reached %u bytes: dropping the rest", GUEST_LOG_MAX);
		}
	}
}

/* The spread rule (spaced_sub_cpu_spread: how many CPUs a CPU-bound
 * execution takes at once), sampled while the execution runs — not while it
 * waits in the pool for its claim — when its last sample said. */
static void spread_sample(struct launcher *L, uint64_t now)
{
	char cpus[256];
	unsigned next_ms = 0;

	if (L->spread_off || now < L->spread_due_ns || (L->pooled && spaced_sub_identity(L->sub) == NULL))
		return;
	int r = spaced_sub_cpu_spread(L->sub, cpus, sizeof(cpus), &next_ms);
	L->spread_due_ns = now + (uint64_t)next_ms * 1000000u;
	if (r == 1)
		logf_("its CPU quota throttles it (more runnable tasks than its limit's CPUs): held to CPUs %s", cpus);
	else if (r == 5)
		logf_("it spends 0.15 of a CPU and more in the kernel (forks, execs, exits): held to CPUs %s", cpus);
	else if (r == 6)
		logf_("it starts 200 tasks a second and more (forks, execs, exits in the kernel): held to CPUs %s", cpus);
	else if (r == 2)
		logf_("under its CPU limit again: let go to CPUs %s", cpus);
	else if (r == 3)
		logf_("beside executions held to other CPUs: its tasks kept to CPUs %s", cpus);
	else if (r == 4)
		logf_("no execution held beside it any more: its tasks on CPUs %s", cpus);
	else if (r < 0)
		L->spread_off = true; /* no cpuset for it (SPACED_ENOENT), or its files unreadable */
	if (r < 0 && r != SPACED_ENOENT)
		logf_("the CPU spread rule stops for this execution: %s", spaced_strerror(r));
}

/* ---- supervisor loop -------------------------------------------------------- */

static int supervise(struct launcher *L)
{
	const struct spaced_pidref *init = spaced_sub_init(L->sub);
	struct pollfd pfd[7 + MAX_CTL + MAX_HS];
	bool init_gone = false;

	while (!L->stop && !init_gone) {
		uint64_t now = spaced_mono_ns();
		int n = 0, r, ctl0, hs0;

		cpu_sample(L, now, false);
		spread_sample(L, now);
		pfd[n++] = (struct pollfd){ .fd = L->sigfd, .events = POLLIN };
		pfd[n++] = (struct pollfd){ .fd = spaced_sub_control_fd(L->sub), .events = POLLIN };
		pfd[n++] = (struct pollfd){ .fd = init->pidfd, .events = POLLIN };
		pfd[n++] = (struct pollfd){ .fd = L->ctl_lfd, .events = POLLIN };
		/* connections are accepted while the guest can serve them: once it is
		 * ready and not while it is frozen (clients wait in the backlog; a
		 * frozen guest could not drain its control socket). A pooled guest
		 * can as soon as its identity is on the way: it takes its control
		 * messages in order, so a CONN always reaches it after IDENTITY, and
		 * no connection waits for the READY round trip of a claim. */
		bool serving = spaced_sub_ready(L->sub) || (L->pooled && spaced_sub_identity(L->sub) != NULL);

		pfd[n++] = (struct pollfd){
			.fd = serving && !spaced_sub_paused(L->sub) ? L->guest_lfd : -1,
			.events = POLLIN,
		};
		pfd[n++] = (struct pollfd){ .fd = L->log_rd, .events = POLLIN };
		/* the lease's end: read then (while it is valid and nothing is
		 * frozen here), else every second as before */
		long long due = L->lease_tfd >= 0 ? spaced_lease_watch_due(&L->lease) : 0;
		if (due != L->lease_armed) {
			struct itimerspec at = { .it_value = { .tv_sec = (time_t)due } };
			/* cancelled when the wall clock is set: the file may then say
			 * an earlier end, read at once */
			L->lease_armed =
			    timerfd_settime(L->lease_tfd, TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET, &at, NULL) == 0 ? due
			                                                                                          : 0;
		}
		int lease_i = n;
		pfd[n++] = (struct pollfd){ .fd = L->lease_armed ? L->lease_tfd : -1, .events = POLLIN };
		ctl0 = n;
		for (int i = 0; i < L->nctl; i++)
			pfd[n++] = (struct pollfd){ .fd = L->ctl[i], .events = POLLIN };
		hs0 = n;
		for (int i = 0; i < L->nhs; i++)
			pfd[n++] = (struct pollfd){ .fd = L->hs[i].fd, .events = POLLIN };
		/* a slow tick for the CPU share (cpu_sample) once there is a
		 * sandbox to report it for: a pooled execution waiting for its claim
		 * sleeps */
		bool waiting = L->pooled && spaced_sub_identity(L->sub) == NULL;
		int tick = L->lease.path && !L->lease_armed ? 1000 : (int)(CPU_SAMPLE_MAX / 1000000u);
		if (!L->spread_off && L->spread_due_ns > now && (L->spread_due_ns - now) / 1000000u < (uint64_t)tick)
			tick = (int)((L->spread_due_ns - now) / 1000000u) + 1;
		else if (!L->spread_off && L->spread_due_ns <= now)
			tick = 1;
		r = poll(pfd, (nfds_t)n, L->nhs > 0 ? 100 : waiting ? -1 : tick);
		if (r < 0 && errno != EINTR)
			return SPACED_ESYS;
		if (r > 0 && pfd[lease_i].revents) {
			uint64_t fired;
			if (read(L->lease_tfd, &fired, sizeof(fired)) < 0 && errno == ECANCELED)
				L->lease.checked_ns = 0; /* the clock was set: the lease is read now */
			L->lease_armed = 0;      /* set again from that reading */
		}
		lease_check(L);
		if (pfd[0].revents) {
			struct signalfd_siginfo si;

			if (read(L->sigfd, &si, sizeof(si)) == sizeof(si)) {
				logf_("signal %u: stopping", si.ssi_signo);
				L->stop = true;
			}
		}
		if (pfd[1].revents) {
			r = spaced_sub_handle_control(L->sub);
			if (r == 1) {
				double ms = (double)(spaced_mono_ns() - L->t0) / 1e6;

				logf_("guest ready %.2f ms after the start of creation", ms);
				(void)write_file(L->state, "ready", "ready\n");
				printf("READY %.3f\n", ms);
				fflush(stdout);
			} else if (r == 2) {
				double ms = (double)(spaced_mono_ns() - L->t0) / 1e6;

				logf_("guest waiting for its identity %.2f ms after the start of creation", ms);
				printf("POOLED %.3f\n", ms);
				fflush(stdout);
			} else if (r == SPACED_ECLOSED) {
				logf_("guest closed its control socket");
				init_gone = true;
			} else if (r < 0) {
				logf_("guest control: %s (ignored)", spaced_strerror(r));
			}
		}
		if (pfd[2].revents) {
			logf_("execution init exited");
			init_gone = true;
		}
		/* handshakes and control connections, highest index first (removal swaps) */
		for (int i = L->nhs - 1; i >= 0; i--) {
			bool done = false;

			if (hs0 + i < n && pfd[hs0 + i].revents)
				done = hs_step(L, &L->hs[i]);
			if (!done && now > L->hs[i].deadline) {
				logf_("guest.sock: handshake timed out");
				done = true;
			}
			if (done)
				hs_drop(L, i);
		}
		for (int i = L->nctl - 1; i >= 0; i--) {
			if (ctl0 + i < hs0 && pfd[ctl0 + i].revents && ctl_step(L, L->ctl[i])) {
				close(L->ctl[i]);
				L->ctl[i] = L->ctl[--L->nctl];
			}
		}
		if (pfd[3].revents)
			ctl_accept(L);
		if (pfd[4].revents)
			guest_accept(L);
		if (pfd[5].revents & POLLIN) {
			log_drain(L);
		} else if (pfd[5].revents) {
			close(L->log_rd); /* every writer is gone */
			L->log_rd = -1;
		}
	}
	return 0;
}

/* A decimal number for an option, or exit with a usage error. */
static uint64_t num_arg(const char *opt, const char *v, uint64_t max)
{
	unsigned long long x;
	char *end;

	errno = 0;
	x = strtoull(v, &end, 10);
	if (errno != 0 || end == v || *end != '\0' || v[0] == '-' || x > max) {
		fprintf(stderr, "spaced-launch: %s: not a number up to %llu: %s\n", opt,
		        (unsigned long long)max, v);
		exit(2);
	}
	return (uint64_t)x;
}

/* A number of CPUs ("1", "0.5") in thousandths, or exit with a usage error. */
static uint32_t cpus_arg(const char *opt, const char *v)
{
	uint32_t m;

	if (spaced_cpus_parse(v, &m) < 0) {
		fprintf(stderr, "spaced-launch: %s: not a number of CPUs (0.001 .. 1024, up to 3 decimals): %s\n", opt, v);
		exit(2);
	}
	return m;
}

/* A size ("4096", "512M", "2G"), or exit with a usage error. */
static uint64_t size_arg(const char *opt, const char *v)
{
	uint64_t x;

	if (spaced_size_parse(v, &x) < 0 || x > UINT64_MAX / 2) {
		fprintf(stderr, "spaced-launch: %s: not a size (bytes, or a number with K, M, G, T): %s\n", opt, v);
		exit(2);
	}
	return x;
}

static int run(int argc, char **argv)
{
	struct spaced_sub_config cfg;
	struct spaced_identity id;
	struct launcher L;
	char why[512] = "", path[PATH_MAX + 64], line[256];
	const char *state = NULL, *uid_lock_dir = NULL;
	bool keep = false;
	uint64_t t0;
	int uid_lock = -1;
	sigset_t ss;
	int r, status = 0, logfd;

	memset(&cfg, 0, sizeof(cfg));
	memset(&L, 0, sizeof(L));
	L.log_rd = L.log_fd = -1;
	cfg.uid_base = SPACED_SUB_UID_BASE_DEFAULT;
	cfg.log_fd = -1;
	for (int i = 1; i < argc; i++) {
		const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (strcmp(o, "--keep-state") == 0) {
			keep = true;
			continue;
		}
		if (strcmp(o, "--service-ports") == 0) {
			cfg.service_ports = true; /* ServicePorts through spaced-netgtw (docs/network.md) */
			continue;
		}
		if (v == NULL)
			usage();
		i++;
		if (strcmp(o, "--state") == 0)
			state = v;
		else if (strcmp(o, "--guest") == 0)
			cfg.guest_path = v;
		else if (strcmp(o, "--base") == 0)
			cfg.base_dir = v;
		else if (strcmp(o, "--template") == 0)
			cfg.template_dir = v;
		else if (strcmp(o, "--restore") == 0)
			cfg.restore_from = v;
		else if (strcmp(o, "--hostname") == 0)
			cfg.hostname = v;
		else if (strcmp(o, "--cpus") == 0)
			cfg.cpu_milli = cpus_arg(o, v);
		else if (strcmp(o, "--memory") == 0)
			cfg.memory_bytes = size_arg(o, v);
		else if (strcmp(o, "--disk") == 0)
			cfg.disk_bytes = size_arg(o, v);
		else if (strcmp(o, "--disk-bps") == 0)
			cfg.disk_bps = size_arg(o, v);
		else if (strcmp(o, "--disk-iops") == 0)
			cfg.disk_iops = num_arg(o, v, UINT32_MAX);
		else if (strcmp(o, "--pids") == 0)
			cfg.pids_max = num_arg(o, v, 4194304);
		else if (strcmp(o, "--uid-base") == 0)
			cfg.uid_base = (uint32_t)num_arg(o, v, UINT32_MAX - SPACED_SUB_UID_RANGE);
		else if (strcmp(o, "--uid-lock") == 0)
			uid_lock_dir = v;
		else if (strcmp(o, "--lease-file") == 0)
			L.lease.path = v;
		else if (strcmp(o, "--identity") == 0) {
			if (spaced_identity_decode(&id, v, strlen(v)) < 0) {
				fprintf(stderr, "spaced-launch: --identity: not a canonical identity\n");
				return 2;
			}
			cfg.identity = &id;
		} else
			usage();
	}
	if (state == NULL || cfg.guest_path == NULL)
		usage();
	if (uid_lock_dir != NULL) {
		/* the uid range is this execution's for as long as this launcher
		 * lives: another launcher asking for it is refused */
		snprintf(path, sizeof(path), "%s/%u.lock", uid_lock_dir, (unsigned)cfg.uid_base);
		(void)mkdir(uid_lock_dir, 0700);
		uid_lock = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (uid_lock < 0 || flock(uid_lock, LOCK_EX | LOCK_NB) < 0) {
			fprintf(stderr, "spaced-launch: uid range %u is in use (%s: %s)\n", (unsigned)cfg.uid_base, path,
			        strerror(errno));
			return 1;
		}
	}
	if (mkdir(state, 0700) < 0 && errno != EEXIST) {
		fprintf(stderr, "spaced-launch: mkdir %s: %s\n", state, strerror(errno));
		return 1;
	}
	if (realpath(state, L.state) == NULL)
		return 1;
	cfg.state_dir = L.state;
	snprintf(L.guest_sock, sizeof(L.guest_sock), "%.*s/guest.sock", PATH_MAX - 16, L.state);
	snprintf(L.ctl_sock, sizeof(L.ctl_sock), "%.*s/control.sock", PATH_MAX - 16, L.state);
	snprintf(path, sizeof(path), "%s/guest.log", L.state);
	logfd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	L.log_fd = logfd;
	{
		int lp[2];

		if (pipe2(lp, O_CLOEXEC) < 0) {
			fprintf(stderr, "spaced-launch: pipe: %s\n", strerror(errno));
			return 1;
		}
		(void)fcntl(lp[0], F_SETFL, O_NONBLOCK);
		L.log_rd = lp[0];
		cfg.log_fd = lp[1]; /* closed once the execution holds it */
	}
	L.next_local_port = LOCAL_PORT_FIRST;
	L.guest_lfd = L.ctl_lfd = L.sigfd = L.lease_tfd = -1;

	sigemptyset(&ss);
	sigaddset(&ss, SIGTERM);
	sigaddset(&ss, SIGINT);
	sigaddset(&ss, SIGHUP);
	sigprocmask(SIG_BLOCK, &ss, NULL);
	signal(SIGPIPE, SIG_IGN);
	L.sigfd = signalfd(-1, &ss, SFD_CLOEXEC | SFD_NONBLOCK);
	if (L.lease.path) /* none: the lease is read every second */
		L.lease_tfd = timerfd_create(CLOCK_REALTIME, TFD_CLOEXEC | TFD_NONBLOCK);
	L.ctl_lfd = listen_unix(L.ctl_sock, SOCK_SEQPACKET, 0600);
	L.guest_lfd = listen_unix(L.guest_sock, SOCK_STREAM, 0600);
	if (L.sigfd < 0 || L.ctl_lfd < 0 || L.guest_lfd < 0) {
		fprintf(stderr, "spaced-launch: sockets in %s: %s\n", L.state, strerror(errno));
		return 1;
	}
	snprintf(path, sizeof(path), "%s/ready", L.state);
	(void)unlink(path);
	L.pooled = cfg.identity == NULL;
	/* spaced-node --cpu-spread off */
	L.spread_off = getenv("SPACED_CPU_SPREAD") != NULL && strcmp(getenv("SPACED_CPU_SPREAD"), "off") == 0;
	prepare_file(L.state, "ready");
	if (L.pooled)
		prepare_file(L.state, "identity");

	t0 = spaced_mono_ns();
	r = spaced_sub_create(&cfg, &L.sub, why, sizeof(why));
	close(cfg.log_fd);
	cfg.log_fd = -1;
	if (r < 0) {
		fprintf(stderr, "spaced-launch: create: %s: %s\n", spaced_strerror(r), why);
		status = 1;
		goto out;
	}
	{
		const struct spaced_pidref *init = spaced_sub_init(L.sub);
		uint64_t self_start = 0;

		(void)spaced_proc_start_time(getpid(), &self_start);
		snprintf(line, sizeof(line), "pid=%d start=%" PRIu64 " init=%d init_start=%" PRIu64 "\n",
		         (int)getpid(), self_start, (int)init->pid, init->start_time);
		(void)write_file(L.state, "launcher", line);
	}
	if (cfg.identity != NULL) {
		char idtext[SPACED_IDENTITY_TEXT_MAX];

		spaced_identity_encode(cfg.identity, idtext, sizeof(idtext));
		(void)write_file(L.state, "identity", idtext);
	}
	L.t0 = t0;
	logf_("execution created in %.2f ms (guest exec'ed)", (double)(spaced_mono_ns() - t0) / 1e6);
	r = supervise(&L);
	if (r < 0)
		status = 1;
out:
	if (L.sub != NULL) {
		int st = 0;

		spaced_sub_destroy(L.sub, keep, &st);
		logf_("execution ended (status 0x%x)", (unsigned)st);
	}
	for (int i = 0; i < L.nhs; i++)
		close(L.hs[i].fd);
	for (int i = 0; i < L.nctl; i++)
		close(L.ctl[i]);
	if (L.guest_lfd >= 0) {
		close(L.guest_lfd);
		unlink(L.guest_sock);
	}
	if (L.ctl_lfd >= 0) {
		close(L.ctl_lfd);
		unlink(L.ctl_sock);
	}
	snprintf(path, sizeof(path), "%s/ready", L.state);
	(void)unlink(path);
	snprintf(path, sizeof(path), "%s/launcher", L.state);
	(void)unlink(path);
	snprintf(path, sizeof(path), "%s/.ready.tmp", L.state);
	(void)unlink(path);
	snprintf(path, sizeof(path), "%s/.identity.tmp", L.state);
	(void)unlink(path);
	if (L.log_rd >= 0) {
		log_drain(&L);
		close(L.log_rd);
	}
	if (logfd >= 0)
		close(logfd);
	if (uid_lock >= 0)
		close(uid_lock); /* the execution is gone: its range may be used again */
	return status;
}

/* Sends one command, prints the answer; returns the fd passed along (or -1). */
static int ctl_call(const char *state, const char *cmd, char *reply, size_t replysz, int *fd_out)
{
	char path[PATH_MAX + 32];
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} cb;
	struct iovec iov = { .iov_base = reply, .iov_len = replysz - 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b,
	                     .msg_controllen = sizeof(cb.b) };
	struct cmsghdr *c;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/control.sock", state);
	fd = connect_unix(path, SOCK_SEQPACKET);
	if (fd < 0) {
		snprintf(reply, replysz, "ERR connect %s: %s", path, strerror(errno));
		return -1;
	}
	if (send(fd, cmd, strlen(cmd), MSG_NOSIGNAL) < 0) {
		close(fd);
		snprintf(reply, replysz, "ERR send: %s", strerror(errno));
		return -1;
	}
	n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
	close(fd);
	if (n <= 0) {
		snprintf(reply, replysz, "ERR no answer");
		return -1;
	}
	reply[n] = '\0';
	if (fd_out != NULL) {
		*fd_out = -1;
		c = CMSG_FIRSTHDR(&mh);
		if (c != NULL && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			memcpy(fd_out, CMSG_DATA(c), sizeof(int));
	}
	return 0;
}

static int ctl_main(int argc, char **argv)
{
	char cmd[SPACED_SUB_MSG_MAX], reply[SPACED_SUB_MSG_MAX + 1];
	const char *state = NULL;
	size_t len = 0;
	int i = 1;

	if (argc > 3 && strcmp(argv[1], "--state") == 0) {
		state = argv[2];
		i = 3;
	}
	if (state == NULL || i >= argc)
		usage();
	cmd[0] = '\0';
	for (; i < argc; i++) {
		int w = snprintf(cmd + len, sizeof(cmd) - len, "%s%s", len ? " " : "", argv[i]);

		if (w < 0 || (size_t)w >= sizeof(cmd) - len) {
			fprintf(stderr, "spaced-launch: command too long\n");
			return 2;
		}
		len += (size_t)w;
	}
	if (ctl_call(state, cmd, reply, sizeof(reply), NULL) < 0 || strncmp(reply, "OK", 2) != 0) {
		spaced_log_escape_controls(reply, sizeof(reply));
		fprintf(stderr, "%s\n", reply);
		return 1;
	}
	printf("%s\n", reply);
	return 0;
}

static int exec_main(int argc, char **argv)
{
	char reply[SPACED_SUB_MSG_MAX + 1];
	const char *state = NULL, *cwd = NULL;
	int i, pidfd = -1, st = 0, r;

	for (i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--") == 0) {
			i++;
			break;
		}
		if (i + 1 >= argc)
			usage();
		if (strcmp(argv[i], "--state") == 0)
			state = argv[++i];
		else if (strcmp(argv[i], "--cwd") == 0)
			cwd = argv[++i];
		else
			usage();
	}
	if (state == NULL || i >= argc)
		usage();
	if (ctl_call(state, "PIDFD", reply, sizeof(reply), &pidfd) < 0 || pidfd < 0) {
		fprintf(stderr, "spaced-launch exec: %s\n", reply);
		return 125;
	}
	r = spaced_sub_enter(pidfd, cwd, argv + i, &st);
	close(pidfd);
	if (r < 0) {
		fprintf(stderr, "spaced-launch exec: cannot enter the execution: %s\n", spaced_strerror(r));
		return 125;
	}
	if (WIFSIGNALED(st))
		return 128 + WTERMSIG(st);
	return WEXITSTATUS(st);
}

int main(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "ctl") == 0)
		return ctl_main(argc - 1, argv + 1);
	if (argc >= 2 && strcmp(argv[1], "exec") == 0)
		return exec_main(argc - 1, argv + 1);
	if (argc >= 2 && strcmp(argv[1], "run") == 0)
		return run(argc - 1, argv + 1);
	if (argc == 4 && strcmp(argv[1], "cap") == 0) {
		char why[256] = "";
		uint64_t mem = size_arg("cap MEMORY", argv[2]), tasks = num_arg("cap TASKS", argv[3], UINT32_MAX);

		if (spaced_sub_cap_all(mem, tasks, why, sizeof why) < 0) {
			fprintf(stderr, "spaced-launch: cap: %s\n", why);
			return 1;
		}
		return 0;
	}
	if (argc == 2 && strcmp(argv[1], "reap") == 0) {
		int n = spaced_sub_reap_orphans();

		printf("reaped %d execution%s of launchers that are gone\n", n, n == 1 ? "" : "s");
		return n < 0 ? 1 : 0;
	}
	return run(argc, argv);
}
