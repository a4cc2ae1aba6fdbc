/*
 * mgr_exec.c — the development launcher of executions: one spaced-guest per
 * execution, started with --root/--identity/--listen in its own session (no
 * namespaces; the `process` substrate and spaced-host replace it). Its files
 * live in STATE/sbx/<sandbox>/root and survive a new generation; a snapshot is
 * a copy of that directory. Processes are pinned by {pid, start time} and
 * signalled through a pidfd only after the start time matched.
 */
#include "mgr.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "pidref.h"
#include "util.h"

static int mkdirs(const char *path)
{
	char buf[4096];
	if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
		return SPACED_EINVAL;
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0700) < 0 && errno != EEXIST)
			return SPACED_ESYS;
		*p = '/';
	}
	if (mkdir(buf, 0700) < 0 && errno != EEXIST)
		return SPACED_ESYS;
	return 0;
}

static int root_dir(const char *state_dir, const char *sandbox, char *out, size_t outsz)
{
	int n = snprintf(out, outsz, "%s/sbx/%s/root", state_dir, sandbox);
	return (n < 0 || (size_t)n >= outsz) ? SPACED_EINVAL : 0;
}

int mgr_exec_target(const char *state_dir, const struct mgr_rec *rec, char *out, size_t outsz)
{
	size_t max = sizeof(((struct sockaddr_un *)0)->sun_path);
	int n = snprintf(out, outsz, "%s/run/%s.%llu.sock", state_dir, rec->r.id.sandbox,
	                 (unsigned long long)rec->r.id.generation);
	if (n < 0 || (size_t)n >= outsz || (size_t)n >= max)
		return SPACED_EINVAL;
	return 0;
}

/* Runs argv to completion; 0 when it exited 0. */
static int run_wait(const char *const argv[])
{
	pid_t pid = fork();
	if (pid < 0)
		return SPACED_ESYS;
	if (pid == 0) {
		int fd = open("/dev/null", O_RDWR);
		if (fd >= 0) {
			dup2(fd, 0);
			dup2(fd, 1);
		}
		char *args[8];
		size_t i = 0;
		for (; argv[i] && i < 7; i++)
			args[i] = strdup(argv[i]);
		args[i] = NULL;
		execvp(args[0], args);
		_exit(127);
	}
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return SPACED_ESYS;
	return (WIFEXITED(status) && WEXITSTATUS(status) == 0) ? 0 : SPACED_EIO;
}

static int pidfd_of(const struct mgr_rec *rec)
{
	uint64_t st;
	if (rec->pid <= 0)
		return SPACED_ENOENT;
	int fd = (int)syscall(SYS_pidfd_open, (pid_t)rec->pid, 0);
	if (fd < 0)
		return SPACED_ENOENT;
	if (spaced_proc_start_time((pid_t)rec->pid, &st) < 0 || st != rec->pid_start) {
		close(fd);
		return SPACED_ENOENT;
	}
	return fd;
}

bool mgr_exec_alive(const struct mgr_rec *rec)
{
	int fd = pidfd_of(rec);
	if (fd < 0)
		return false;
	/* a zombie still has its start time: ask whether it exited */
	siginfo_t si;
	memset(&si, 0, sizeof si);
	bool alive = true;
	if (waitid(P_PIDFD, (id_t)fd, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid != 0)
		alive = false;
	close(fd);
	return alive;
}

int mgr_exec_signal(const struct mgr_rec *rec, int sig)
{
	int fd = pidfd_of(rec);
	if (fd < 0)
		return fd;
	/* The guest leads its own session and process group: signal the group,
	 * after the pidfd proved the leader is still the recorded process. */
	int e = 0;
	if (kill(-(pid_t)rec->pid, sig) < 0 &&
	    syscall(SYS_pidfd_send_signal, fd, sig, NULL, 0) < 0)
		e = SPACED_ESYS;
	close(fd);
	return e;
}

void mgr_exec_stop(struct mgr_rec *rec)
{
	int fd = pidfd_of(rec);
	if (fd >= 0) {
		kill(-(pid_t)rec->pid, SIGKILL);
		syscall(SYS_pidfd_send_signal, fd, SIGKILL, NULL, 0);
		kill(-(pid_t)rec->pid, SIGCONT);
		siginfo_t si;
		/* our child: reap it; an orphan adopted by init after a restart: wait for exit */
		if (waitid(P_PIDFD, (id_t)fd, &si, WEXITED) < 0) {
			for (int i = 0; i < 200 && mgr_exec_alive(rec); i++) {
				struct timespec ts = {0, 5 * 1000 * 1000};
				nanosleep(&ts, NULL);
			}
		}
		close(fd);
	}
	rec->pid = 0;
	rec->pid_start = 0;
}

int mgr_exec_start(const char *state_dir, const char *guest_bin, struct mgr_rec *rec,
                   const char *snapshot)
{
	char root[4096], sock[256], logp[4096], dir[4096], text[SPACED_IDENTITY_TEXT_MAX];
	int e;

	if (!guest_bin)
		return SPACED_EINVAL;
	e = root_dir(state_dir, rec->r.id.sandbox, root, sizeof root);
	if (e == 0)
		e = mgr_exec_target(state_dir, rec, sock, sizeof sock);
	if (e < 0)
		return e;
	if (spaced_identity_encode(&rec->r.id, text, sizeof text) < 0)
		return SPACED_EINVAL;
	snprintf(dir, sizeof dir, "%s/run", state_dir);
	if ((e = mkdirs(dir)) < 0)
		return e;
	snprintf(dir, sizeof dir, "%s/log", state_dir);
	if ((e = mkdirs(dir)) < 0)
		return e;
	if (snapshot && *snapshot) {
		const char *rm[] = {"rm", "-rf", "--", root, NULL};
		const char *cp[] = {"cp", "-a", "--", snapshot, root, NULL};
		snprintf(dir, sizeof dir, "%s/sbx/%s", state_dir, rec->r.id.sandbox);
		if ((e = mkdirs(dir)) < 0)
			return e;
		if (run_wait(rm) < 0 || run_wait(cp) < 0)
			return SPACED_EIO;
	}
	if ((e = mkdirs(root)) < 0)
		return e;
	unlink(sock);
	snprintf(logp, sizeof logp, "%s/log/%s.log", state_dir, rec->r.id.sandbox);

	pid_t pid = fork();
	if (pid < 0)
		return SPACED_ESYS;
	if (pid == 0) {
		setsid();
		int nul = open("/dev/null", O_RDONLY);
		int log = open(logp, O_WRONLY | O_CREAT | O_APPEND, 0600);
		if (nul >= 0)
			dup2(nul, 0);
		if (log >= 0) {
			dup2(log, 1);
			dup2(log, 2);
		}
		syscall(SYS_close_range, 3, ~0u, 0);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		signal(SIGPIPE, SIG_DFL);
		execl(guest_bin, "spaced-guest", "--root", root, "--identity", text, "--listen", sock,
		      (char *)NULL);
		_exit(127);
	}
	uint64_t st = 0;
	if (spaced_proc_start_time(pid, &st) < 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return SPACED_ESYS;
	}
	/* Wait until it listens (the install is acknowledged with a serving execution). */
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, sock, strlen(sock));
	e = SPACED_ETIMEDOUT;
	for (int i = 0; i < 1000; i++) {
		int status;
		if (waitpid(pid, &status, WNOHANG) == pid) {
			e = SPACED_EIO;
			break;
		}
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
			close(fd);
			e = 0;
			break;
		}
		if (fd >= 0)
			close(fd);
		struct timespec ts = {0, 5 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	if (e < 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return e;
	}
	rec->pid = pid;
	rec->pid_start = st;
	return 0;
}

static uint64_t snap_bytes;
static int sum_cb(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
	(void)p;
	(void)f;
	if (flag == FTW_F)
		snap_bytes += (uint64_t)sb->st_size;
	return 0;
}

int mgr_exec_snapshot(const char *state_dir, const struct mgr_rec *rec, const char *path,
                      uint64_t *bytes)
{
	char root[4096];
	int e = root_dir(state_dir, rec->r.id.sandbox, root, sizeof root);
	if (e < 0)
		return e;
	if (!path || path[0] != '/')
		return SPACED_EINVAL;
	struct stat sb;
	if (lstat(path, &sb) == 0)
		return SPACED_EEXIST;
	const char *cp[] = {"cp", "-a", "--", root, path, NULL};
	if (run_wait(cp) < 0)
		return SPACED_EIO;
	snap_bytes = 0;
	if (nftw(path, sum_cb, 16, FTW_PHYS) < 0)
		return SPACED_EIO;
	*bytes = snap_bytes;
	return 0;
}

void mgr_exec_remove(const char *state_dir, const char *sandbox)
{
	char dir[4096];
	if (snprintf(dir, sizeof dir, "%s/sbx/%s", state_dir, sandbox) >= (int)sizeof dir)
		return;
	const char *rm[] = {"rm", "-rf", "--", dir, NULL};
	run_wait(rm);
}
