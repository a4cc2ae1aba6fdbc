/*
 * test_pidref.c — process identities and bridge endpoint checks (B1, B2) with
 * real processes and real sockets: PID/start-time pinning, a listener that
 * takes over a socket path, a replaced executable, a foreign socket owner and
 * a caller with the wrong uid.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spaced_error.h"
#include "pidref.h"

struct helper {
	pid_t pid;
};

static char tmpdir[64];
static char sockpath[128];

static void setup_dir(void)
{
	strcpy(tmpdir, "/tmp/spaced-pidref-XXXXXX");
	cr_assert_not_null(mkdtemp(tmpdir));
	snprintf(sockpath, sizeof(sockpath), "%s/l.sock", tmpdir);
}

static void teardown_dir(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	(void)system(cmd);
}

/* Starts `exe listen path` and waits for its "ready" line. */
static pid_t start_listener(const char *exe, const char *path)
{
	int pfd[2];
	char buf[8] = { 0 };
	pid_t pid;

	cr_assert_eq(pipe(pfd), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		dup2(pfd[1], 1);
		close(pfd[0]);
		execl(exe, exe, "listen", path, (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	cr_assert_eq(read(pfd[0], buf, 6), 6, "listener %s did not start", exe);
	cr_assert_str_eq(buf, "ready\n");
	close(pfd[0]);
	return pid;
}

static void stop(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

static struct spaced_expected_listener expect_of(pid_t pid)
{
	struct spaced_expected_listener e;
	struct spaced_pidref ref;

	memset(&e, 0, sizeof(e));
	cr_assert_eq(spaced_pidref_from_pid(&ref, pid), 0);
	e.owner_uid = getuid();
	e.pid = pid;
	e.start_time = ref.start_time;
	e.check_exe = true;
	cr_assert_eq(spaced_pidref_exe(&ref, true, &e.exe), 0);
	spaced_pidref_done(&ref);
	return e;
}

TestSuite(pidref, .init = setup_dir, .fini = teardown_dir);

Test(pidref, start_time_and_liveness)
{
	struct spaced_pidref ref;
	uint64_t st;
	pid_t pid = fork();

	cr_assert_geq(pid, 0);
	if (pid == 0) {
		pause();
		_exit(0);
	}
	cr_assert_eq(spaced_pidref_from_pid(&ref, pid), 0);
	cr_assert_eq(spaced_proc_start_time(pid, &st), 0);
	cr_assert_eq(st, ref.start_time);
	cr_assert_eq(spaced_pidref_check(&ref), 0);
	stop(pid);
	/* reaped: the pidfd no longer names a live process, whatever takes the PID */
	cr_assert_eq(spaced_pidref_check(&ref), SPACED_ESTALE);
	spaced_pidref_done(&ref);
	spaced_pidref_done(&ref); /* idempotent */
	spaced_pidref_done(NULL);
	cr_assert_eq(spaced_pidref_from_pid(&ref, pid), SPACED_ENOENT);
}

Test(pidref, listener_verified) /* B2 */
{
	pid_t pid = start_listener(PEER_HELPER, sockpath);
	struct spaced_expected_listener e = expect_of(pid);
	char why[256] = "";
	int fd = -1;

	cr_assert_eq(spaced_peer_verify_listener(sockpath, &e, why, sizeof(why)), 0, "%s", why);
	cr_assert_eq(spaced_peer_connect_listener(sockpath, &e, &fd, why, sizeof(why)), 0, "%s", why);
	cr_assert_geq(fd, 0);
	close(fd);
	stop(pid);
}

Test(pidref, takeover_after_listener_died) /* B1, B2 */
{
	pid_t pid1 = start_listener(PEER_HELPER, sockpath);
	struct spaced_expected_listener e = expect_of(pid1);
	char why[256] = "";
	pid_t pid2;

	stop(pid1);
	/* another process binds the same path */
	pid2 = start_listener(PEER_HELPER, sockpath);
	cr_assert_eq(spaced_peer_verify_listener(sockpath, &e, why, sizeof(why)), SPACED_EPEER);
	cr_log_info("refused: %s", why);
	cr_assert(strstr(why, "gone") != NULL || strstr(why, "start time") != NULL, "%s", why);

	/* the new process with a stale start time (what a reused PID looks like) */
	struct spaced_expected_listener e2 = expect_of(pid2);
	e2.start_time -= 1;
	cr_assert_eq(spaced_peer_verify_listener(sockpath, &e2, why, sizeof(why)), SPACED_EPEER);
	cr_assert(strstr(why, "start time") != NULL, "%s", why);
	stop(pid2);
}

Test(pidref, path_rebound_while_listener_alive) /* B2: kernel socket evidence */
{
	pid_t pid1 = start_listener(PEER_HELPER, sockpath);
	struct spaced_expected_listener e = expect_of(pid1);
	char why[256] = "";
	int fd = -1;
	pid_t pid2;

	/* the expected process lives on, but the path now leads to another listener */
	pid2 = start_listener(PEER_HELPER, sockpath);
	cr_assert_eq(spaced_peer_verify_listener(sockpath, &e, why, sizeof(why)), SPACED_EPEER);
	cr_assert(strstr(why, "not held") != NULL, "%s", why);
	cr_assert_eq(spaced_peer_connect_listener(sockpath, &e, &fd, why, sizeof(why)), SPACED_EPEER);
	cr_assert_eq(fd, -1);
	/* a plain file at the path is no listener */
	stop(pid2);
	unlink(sockpath);
	cr_assert_eq(spaced_peer_verify_listener(sockpath, &e, why, sizeof(why)), SPACED_EPEER);
	stop(pid1);
}

Test(pidref, replaced_executable) /* B1 */
{
	char a[160], b[160], cmd[1024];
	struct spaced_expected_listener e;
	char why[256] = "";
	pid_t pid;

	snprintf(a, sizeof(a), "%s/helper", tmpdir);
	snprintf(b, sizeof(b), "%s/helper.new", tmpdir);
	snprintf(cmd, sizeof(cmd), "cp %s %s && cp %s %s", PEER_HELPER, a, PEER_HELPER, b);
	cr_assert_eq(system(cmd), 0);
	pid = start_listener(a, sockpath);
	e = expect_of(pid);
	cr_assert_eq(spaced_peer_verify_listener(sockpath, &e, why, sizeof(why)), 0, "%s", why);
	stop(pid);

	/* the executable is replaced on disk and the listener restarted from it:
	 * the record of the old executable no longer matches */
	cr_assert_eq(rename(b, a), 0);
	pid = start_listener(a, sockpath);
	struct spaced_expected_listener now = expect_of(pid);
	now.exe = e.exe;
	cr_assert_eq(spaced_peer_verify_listener(sockpath, &now, why, sizeof(why)), SPACED_EPEER);
	cr_assert(strstr(why, "executable") != NULL, "%s", why);

	/* same inode, other bytes: only the hash can tell */
	struct spaced_expected_listener h = expect_of(pid);
	h.exe.hash[0] ^= 1;
	cr_assert_eq(spaced_peer_verify_listener(sockpath, &h, why, sizeof(why)), SPACED_EPEER);
	cr_assert(strstr(why, "hash") != NULL, "%s", why);
	stop(pid);
}

Test(pidref, socket_owned_by_other_uid) /* B2: socket ownership */
{
	pid_t pid = start_listener(PEER_HELPER, sockpath);
	struct spaced_expected_listener e = expect_of(pid);
	char why[256] = "";

	if (getuid() != 0) {
		stop(pid);
		cr_skip_test("needs root to chown the socket file");
	}
	cr_assert_eq(chown(sockpath, 65534, 65534), 0);
	cr_assert_eq(spaced_peer_verify_listener(sockpath, &e, why, sizeof(why)), SPACED_EPEER);
	cr_assert(strstr(why, "owned by uid 65534") != NULL, "%s", why);
	stop(pid);
}

/* A client process running as uid/gid `as` that connects to path and waits. */
static pid_t start_caller(const char *path, uid_t as)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int pfd[2];
	char c;
	pid_t pid;

	strcpy(sa.sun_path, path);
	cr_assert_eq(pipe(pfd), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		int fd;

		close(pfd[0]);
		if (setresgid(as, as, as) < 0 || setresuid(as, as, as) < 0)
			_exit(2);
		fd = socket(AF_UNIX, SOCK_STREAM, 0);
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
			_exit(3);
		(void)!write(pfd[1], "c", 1);
		pause();
		_exit(0);
	}
	close(pfd[1]);
	cr_assert_eq(read(pfd[0], &c, 1), 1, "caller did not connect");
	close(pfd[0]);
	return pid;
}

static int listen_on(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	strcpy(sa.sun_path, path);
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(chmod(path, 0777), 0);
	cr_assert_eq(listen(fd, 4), 0);
	return fd;
}

Test(pidref, caller_checks) /* B1 */
{
	struct spaced_expected_caller ex;
	struct spaced_pidref got = SPACED_PIDREF_NULL;
	char why[256] = "";
	int lfd, c;
	pid_t pid;

	if (getuid() != 0)
		cr_skip_test("needs root to run a caller as another uid");
	cr_assert_eq(chmod(tmpdir, 0755), 0);
	lfd = listen_on(sockpath);
	pid = start_caller(sockpath, 65534);
	c = accept(lfd, NULL, NULL);
	cr_assert_geq(c, 0);

	memset(&ex, 0, sizeof(ex));
	ex.uid = 0; /* wrong uid */
	cr_assert_eq(spaced_peer_verify_caller(c, &ex, NULL, why, sizeof(why)), SPACED_EPEER);
	cr_assert(strstr(why, "uid 65534") != NULL, "%s", why);

	ex.uid = 65534;
	cr_assert_eq(spaced_peer_verify_caller(c, &ex, &got, why, sizeof(why)), 0, "%s", why);
	cr_assert_eq(got.pid, pid);

	struct spaced_pidref ref;
	cr_assert_eq(spaced_pidref_from_pid(&ref, pid), 0);
	ex.pid = pid;
	ex.start_time = ref.start_time + 1; /* a different incarnation of that PID */
	cr_assert_eq(spaced_peer_verify_caller(c, &ex, NULL, why, sizeof(why)), SPACED_EPEER);
	cr_assert(strstr(why, "start time") != NULL, "%s", why);
	ex.start_time = ref.start_time;
	ex.check_exe = true;
	cr_assert_eq(spaced_exe_id_of_path("/proc/self/exe", true, &ex.exe), 0);
	/* the caller is a fork of this test: same executable */
	cr_assert_eq(spaced_peer_verify_caller(c, &ex, NULL, why, sizeof(why)), 0, "%s", why);
	ex.exe.ino += 1;
	cr_assert_eq(spaced_peer_verify_caller(c, &ex, NULL, why, sizeof(why)), SPACED_EPEER);

	/* the pinned caller goes away: the re-check after the work catches it */
	stop(pid);
	cr_assert_eq(spaced_pidref_check(&got), SPACED_ESTALE);
	ex.check_exe = false;
	ex.pid = 0;
	cr_assert_eq(spaced_peer_verify_caller(c, &ex, NULL, why, sizeof(why)), SPACED_EPEER);
	cr_log_info("dead caller: %s", why);
	spaced_pidref_done(&got);
	spaced_pidref_done(&ref);
	close(c);
	close(lfd);
}

Test(pidref, unix_diag_peer)
{
	int sv[2];
	struct stat st;
	uint64_t peer = 0;

	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	cr_assert_eq(fstat(sv[1], &st), 0);
	cr_assert_eq(spaced_unix_diag_peer_of(sv[0], &peer), 0);
	cr_assert_eq(peer, (uint64_t)st.st_ino);
	close(sv[0]);
	close(sv[1]);
}

/* B2: the exact check of a remembered listening socket against the path's file. */
Test(pidref, unix_diag_is_listener_of)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat path_st, sock_st, other_st;
	uint64_t found = 0;
	int l, c, other[2];

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%.100s", sockpath);
	l = socket(AF_UNIX, SOCK_STREAM, 0);
	cr_assert_eq(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(stat(sockpath, &path_st), 0);
	cr_assert_eq(fstat(l, &sock_st), 0);
	cr_assert_eq(spaced_unix_diag_is_listener_of((uint64_t)sock_st.st_ino, (uint64_t)path_st.st_dev,
	                                             (uint64_t)path_st.st_ino),
	             SPACED_ENOENT, "bound but not listening yet");
	cr_assert_eq(listen(l, 4), 0);
	cr_assert_eq(spaced_unix_diag_listener_of((uint64_t)path_st.st_dev, (uint64_t)path_st.st_ino, &found), 0);
	cr_assert_eq(found, (uint64_t)sock_st.st_ino);
	cr_assert_eq(spaced_unix_diag_is_listener_of(found, (uint64_t)path_st.st_dev, (uint64_t)path_st.st_ino), 0);
	/* another file, another socket, no socket */
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, other), 0);
	cr_assert_eq(fstat(other[0], &other_st), 0);
	cr_assert_eq(spaced_unix_diag_is_listener_of(found, (uint64_t)path_st.st_dev, (uint64_t)path_st.st_ino + 1),
	             SPACED_ENOENT);
	cr_assert_eq(spaced_unix_diag_is_listener_of((uint64_t)other_st.st_ino, (uint64_t)path_st.st_dev,
	                                             (uint64_t)path_st.st_ino),
	             SPACED_ENOENT);
	cr_assert_eq(spaced_unix_diag_is_listener_of(0, (uint64_t)path_st.st_dev, (uint64_t)path_st.st_ino),
	             SPACED_ENOENT);
	/* a connection to it is not the listener */
	c = socket(AF_UNIX, SOCK_STREAM, 0);
	cr_assert_eq(connect(c, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(fstat(c, &other_st), 0);
	cr_assert_eq(spaced_unix_diag_is_listener_of((uint64_t)other_st.st_ino, (uint64_t)path_st.st_dev,
	                                             (uint64_t)path_st.st_ino),
	             SPACED_ENOENT);
	close(l);
	cr_assert_eq(spaced_unix_diag_is_listener_of(found, (uint64_t)path_st.st_dev, (uint64_t)path_st.st_ino),
	             SPACED_ENOENT, "closed");
	close(c);
	close(other[0]);
	close(other[1]);
}
