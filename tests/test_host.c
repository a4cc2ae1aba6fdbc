/*
 * test_host.c — spaced-host, the verified bridge, against real launchers,
 * real guests and real impostors (B1, B2, B3, I3).
 *
 * Each test starts spaced-launch (the process substrate's supervisor, which
 * owns STATE/guest.sock), then spaced-host configured with what it must find,
 * and talks to the bridge with libspaced's guest client.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spaced_error.h"
#include "frame.h"
#include "guest_client.h"
#include "guest_proto.h"
#include "host_client.h"
#include "pidref.h"
#include "util.h"

extern char **environ;

#define ID7 "sandbox=sbx-host;generation=7;worker=w-a;substrate=process;activation=a1;pod_uid="
#define ID8 "sandbox=sbx-host;generation=8;worker=w-a;substrate=process;activation=a1;pod_uid="

static char dir[256];

static void setup(void)
{
	if (geteuid() != 0)
		cr_skip_test("the process substrate needs root (namespaces, cgroups)");
	snprintf(dir, sizeof dir, "/tmp/spaced-test-host-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
	char cmd[400];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (dir[0])
		(void)system(cmd);
}

TestSuite(host, .init = setup, .fini = teardown, .timeout = 60);

struct proc {
	pid_t pid;
	int out; /* its stdout, or -1 */
};

static struct proc spawn(const char *const argv[], bool capture)
{
	posix_spawn_file_actions_t fa;
	int p[2] = {-1, -1};
	posix_spawn_file_actions_init(&fa);
	if (capture) {
		cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
		posix_spawn_file_actions_adddup2(&fa, p[1], 1);
	}
	struct proc pr = {0, -1};
	cr_assert_eq(posix_spawn(&pr.pid, argv[0], &fa, NULL, (char *const *)(uintptr_t)argv, environ), 0, "spawn %s", argv[0]);
	posix_spawn_file_actions_destroy(&fa);
	if (capture) {
		close(p[1]);
		pr.out = p[0];
	}
	return pr;
}

/* Reads the child's stdout until a line starting with want (5 s at most). */
static void wait_line(struct proc *pr, const char *want)
{
	char buf[512];
	size_t n = 0;
	uint64_t deadline = spaced_mono_ns() + 5000000000ull;
	while (spaced_mono_ns() < deadline && n < sizeof buf - 1) {
		struct pollfd pf = {.fd = pr->out, .events = POLLIN};
		if (poll(&pf, 1, 100) <= 0)
			continue;
		ssize_t got = read(pr->out, buf + n, 1);
		if (got <= 0)
			break;
		if (buf[n] == '\n') {
			buf[n] = 0;
			if (strncmp(buf, want, strlen(want)) == 0)
				return;
			n = 0;
			continue;
		}
		n++;
	}
	cr_assert_fail("no '%s' line from pid %d", want, (int)pr->pid);
}

static void stop(struct proc *pr)
{
	if (pr->pid > 0) {
		kill(pr->pid, SIGKILL);
		waitpid(pr->pid, NULL, 0);
	}
	if (pr->out >= 0)
		close(pr->out);
	pr->pid = 0;
	pr->out = -1;
}

static struct proc start_launcher(const char *launch_bin, const char *state, const char *identity)
{
	const char *argv[] = {launch_bin, "--state", state, "--guest", SPACED_GUEST_BIN,
	                      "--identity", identity, NULL};
	struct proc pr = spawn(argv, true);
	wait_line(&pr, "READY");
	return pr;
}

/* Waits until something accepts connections at path: bind() creates the file
 * a moment before listen() makes it connectable. */
static void wait_socket(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	for (int i = 0; i < 500; i++) {
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		int r = connect(fd, (struct sockaddr *)&sa, sizeof sa);
		close(fd);
		if (r == 0)
			return;
		usleep(10000);
	}
	cr_assert_fail("nothing listening at %s", path);
}

/* Starts spaced-host with extra arguments (NULL-terminated) after the usual ones. */
static struct proc start_host(const char *host_sock, const char *guest_sock, pid_t launcher,
                              const char *identity, const char *const *extra)
{
	char pidbuf[32];
	snprintf(pidbuf, sizeof pidbuf, "%d", (int)launcher);
	const char *argv[32] = {SPACED_HOST_BIN, "--listen", host_sock, "--guest", guest_sock,
	                        "--launcher-pid", pidbuf, "--identity", identity};
	int n = 9;
	for (int i = 0; extra != NULL && extra[i] != NULL && n < 31; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	unlink(host_sock);
	struct proc pr = spawn(argv, false);
	wait_socket(host_sock);
	return pr;
}

/* Connects to the bridge and asks HELLO. Returns the status; the client's
 * error message (the bridge's reason on a refusal) is copied to why. */
static int hello_via(const char *host_sock, struct spaced_identity *id, char *why, size_t whysz)
{
	struct spaced_guest_client *c;
	cr_assert_eq(spaced_guest_client_connect(host_sock, &c), 0);
	int r = spaced_guest_hello(c, id);
	if (r < 0 && why != NULL)
		snprintf(why, whysz, "%s", spaced_guest_client_errmsg(c));
	spaced_guest_client_free(c);
	return r;
}

/* Reads the refusal frame a bridge sends on a connection it does not serve.
 * No Criterion assertions here: forked children call it too. Returns the
 * refusal's status, or a positive code for an answer that is not a refusal. */
static int read_refusal(const char *host_sock, char *why, size_t whysz)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", host_sock);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		snprintf(why, whysz, "cannot connect to %s: %s", host_sock, strerror(errno));
		if (fd >= 0)
			close(fd);
		return 1;
	}
	struct spaced_frame_hdr h;
	uint8_t *p = NULL;
	int r = spaced_frame_recv(fd, SPACED_FRAME_MAX, &h, &p);
	close(fd);
	if (r < 0)
		return r;
	struct spaced_field_reader rd;
	int64_t status = 0;
	spaced_field_reader_init(&rd, p, h.len);
	if (h.type != SPACED_GUEST_OUT_RESULT || h.id != 0 || spaced_field_get_i64(&rd, &status) != 0 ||
	    spaced_field_get_strbuf(&rd, why, whysz) != 0)
		status = 2; /* a refusal is a RESULT under id 0 */
	free(p);
	return (int)status;
}

static int refusal_via(const char *host_sock, char *why, size_t whysz)
{
	int r = read_refusal(host_sock, why, whysz);
	cr_assert(r <= 0, "expected a refusal frame from the bridge (got %d: %s)", r, why);
	return r;
}

static void paths(char *state, char *guest_sock, char *host_sock, size_t n, const char *name)
{
	snprintf(state, n, "%s/%s", dir, name);
	snprintf(guest_sock, n, "%s/%s/guest.sock", dir, name);
	snprintf(host_sock, n, "%s/%s-host.sock", dir, name);
}

/* Names the paths of execution `name` (state, gs, hs: 300 bytes each) and
 * starts its launcher with identity. */
static struct proc launch_named(const char *name, const char *identity, char *state, char *gs, char *hs)
{
	paths(state, gs, hs, 300, name);
	return start_launcher(SPACED_LAUNCH_BIN, state, identity);
}

Test(host, forwards_to_the_expected_execution_only_after_checks)
{
	char state[300], gs[300], hs[300];
	struct proc l = launch_named("ok", ID7, state, gs, hs);
	const char *extra[] = {"--launcher-exe", SPACED_LAUNCH_BIN, "--manager-uid", "0", NULL};
	struct proc h = start_host(hs, gs, l.pid, ID7, extra);

	struct spaced_guest_client *c;
	struct spaced_identity id, want;
	cr_assert_eq(spaced_identity_decode(&want, ID7, strlen(ID7)), 0);
	cr_assert_eq(spaced_guest_client_connect(hs, &c), 0);
	cr_assert_eq(spaced_guest_hello(c, &id), 0);
	cr_assert(spaced_identity_equal(&id, &want));
	cr_assert_eq(spaced_guest_fs_write(c, "workspace/via-bridge.txt", "bridged", 7, 0644, 0), 0);
	struct spaced_buf b;
	spaced_buf_init(&b, 1 << 20);
	cr_assert_eq(spaced_guest_fs_read(c, "workspace/via-bridge.txt", 0, UINT64_MAX, &b), 0);
	cr_assert_eq(b.len, 7u);
	cr_assert_eq(memcmp(b.data, "bridged", 7), 0);
	cr_assert_str_eq(spaced_guest_client_identity(c), ID7, "every answer names the serving execution");
	spaced_buf_free(&b);
	spaced_guest_client_free(c);
	stop(&h);
	stop(&l);
}

Test(host, refuses_a_process_that_took_over_the_socket_path_after_the_launcher_died)
{
	char state[300], gs[300], hs[300], why[512] = "";
	struct proc l = launch_named("takeover", ID7, state, gs, hs);
	pid_t real = l.pid;
	const char *extra[] = {"--manager-uid", "0", NULL};
	struct proc h = start_host(hs, gs, real, ID7, extra);
	struct spaced_identity id;
	cr_assert_eq(hello_via(hs, &id, NULL, 0), 0);

	stop(&l); /* the real launcher dies … */
	const char *imp_argv[] = {IMPOSTOR_VMM_BIN, gs, ID7, NULL};
	struct proc imp = spawn(imp_argv, true); /* … and an impostor claims the same identity at the same path */
	wait_line(&imp, "ready");
	int r = refusal_via(hs, why, sizeof why);
	cr_assert_eq(r, SPACED_EPEER, "refused as a peer failure, got %d (%s)", r, why);
	cr_assert(strstr(why, "listener") != NULL || strstr(why, "process") != NULL, "reason: %s", why);
	stop(&imp);
	stop(&h);
}

Test(host, refuses_a_listener_swapped_in_at_the_path_while_the_launcher_lives)
{
	/* The bridge has served a connection (it knows where the launcher's
	 * listener was); then another process of the same uid renames its own
	 * listener over guest.sock while the launcher keeps running. */
	char state[300], gs[300], hs[300], tmp[320], why[512] = "";
	struct proc l = launch_named("swap", ID7, state, gs, hs);
	const char *extra[] = {"--launcher-exe", SPACED_LAUNCH_BIN, "--manager-uid", "0", NULL};
	struct proc h = start_host(hs, gs, l.pid, ID7, extra);
	struct spaced_identity id;
	cr_assert_eq(hello_via(hs, &id, NULL, 0), 0);
	cr_assert_eq(hello_via(hs, &id, NULL, 0), 0);

	snprintf(tmp, sizeof tmp, "%s.impostor", gs);
	const char *imp_argv[] = {IMPOSTOR_VMM_BIN, tmp, ID7, NULL};
	struct proc imp = spawn(imp_argv, true);
	wait_line(&imp, "ready");
	cr_assert_eq(rename(tmp, gs), 0);
	int r = refusal_via(hs, why, sizeof why);
	cr_assert_eq(r, SPACED_EPEER, "got %d (%s)", r, why);
	cr_assert(strstr(why, "not held by process") != NULL, "reason: %s", why);
	/* and so is every later connection */
	r = refusal_via(hs, why, sizeof why);
	cr_assert_eq(r, SPACED_EPEER, "got %d (%s)", r, why);
	stop(&imp);
	stop(&h);
	stop(&l);
}

Test(host, refuses_a_launcher_whose_executable_was_replaced)
{
	char state[300], gs[300], hs[300], why[512] = "", exe[300], repl[300], cmd[1400];
	paths(state, gs, hs, sizeof state, "exe");
	snprintf(exe, sizeof exe, "%s/spaced-launch", dir);
	snprintf(repl, sizeof repl, "%s/spaced-launch.new", dir);
	snprintf(cmd, sizeof cmd, "cp '%s' '%s' && cp '%s' '%s'", SPACED_LAUNCH_BIN, exe, SPACED_LAUNCH_BIN, repl);
	cr_assert_eq(system(cmd), 0);
	struct proc l = start_launcher(exe, state, ID7);
	/* The file the launcher was started from is replaced on disk (same bytes, new inode). */
	cr_assert_eq(rename(repl, exe), 0);
	const char *extra[] = {"--launcher-exe", exe, "--manager-uid", "0", NULL};
	struct proc h = start_host(hs, gs, l.pid, ID7, extra);
	int r = refusal_via(hs, why, sizeof why);
	cr_assert_eq(r, SPACED_EPEER, "got %d (%s)", r, why);
	cr_assert(strstr(why, "xecutable") != NULL, "reason names the executable: %s", why);
	stop(&h);
	stop(&l);
}

Test(host, refuses_a_guest_socket_owned_by_another_uid)
{
	char state[300], gs[300], hs[300], why[512] = "";
	struct proc l = launch_named("owner", ID7, state, gs, hs);
	cr_assert_eq(chown(gs, 65534, 65534), 0);
	const char *extra[] = {"--manager-uid", "0", NULL};
	struct proc h = start_host(hs, gs, l.pid, ID7, extra);
	int r = refusal_via(hs, why, sizeof why);
	cr_assert_eq(r, SPACED_EPEER, "got %d (%s)", r, why);
	cr_assert(strstr(why, "own") != NULL, "reason names the owner: %s", why);
	stop(&h);
	stop(&l);
}

Test(host, refuses_a_caller_that_is_not_the_manager)
{
	char state[300], gs[300], hs[300];
	struct proc l = launch_named("caller", ID7, state, gs, hs);
	const char *extra[] = {"--manager-uid", "0", NULL};
	struct proc h = start_host(hs, gs, l.pid, ID7, extra);
	/* Even with the socket's permissions opened up, another uid is refused. */
	cr_assert_eq(chmod(dir, 0711), 0);
	cr_assert_eq(chmod(hs, 0666), 0);
	int p[2];
	cr_assert_eq(pipe(p), 0);
	pid_t child = fork();
	if (child == 0) {
		close(p[0]);
		if (setgid(65534) != 0 || setuid(65534) != 0)
			_exit(3);
		char why[512] = "";
		int r = read_refusal(hs, why, sizeof why);
		dprintf(p[1], "%d %s\n", r, why);
		_exit(0);
	}
	close(p[1]);
	char buf[600] = "";
	ssize_t n = read(p[0], buf, sizeof buf - 1);
	close(p[0]);
	int st;
	waitpid(child, &st, 0);
	cr_assert(n > 0, "the child reported nothing");
	cr_assert_eq(atoi(buf), SPACED_EPEER, "unprivileged caller: %s", buf);
	cr_assert(strstr(buf, "manager") != NULL, "reason: %s", buf);

	/* A caller with the right uid but another process than the pinned manager. */
	stop(&h);
	const char *extra2[] = {"--manager-uid", "0", "--manager-pid", "1", NULL};
	h = start_host(hs, gs, l.pid, ID7, extra2);
	char why[512] = "";
	cr_assert_eq(refusal_via(hs, why, sizeof why), SPACED_EPEER, "%s", why);
	stop(&h);
	stop(&l);
}

Test(host, never_reconnects_behind_the_callers_back_after_the_guest_restarted)
{
	char state[300], gs[300], hs[300], why[512] = "";
	struct proc l = launch_named("restart", ID7, state, gs, hs);
	const char *extra[] = {"--manager-uid", "0", NULL};
	struct proc h = start_host(hs, gs, l.pid, ID7, extra);
	struct spaced_guest_client *c;
	struct spaced_identity id;
	cr_assert_eq(spaced_guest_client_connect(hs, &c), 0);
	cr_assert_eq(spaced_guest_hello(c, &id), 0);

	stop(&l); /* the execution goes away under an open connection */
	struct spaced_guest_msg m;
	int r = spaced_guest_recv(c, &m);
	cr_assert(r == SPACED_ECLOSED || r == SPACED_EIO || r == SPACED_EPROTO,
	          "the open connection ends instead of being re-established (got %d)", r);
	spaced_guest_client_free(c);

	/* The same state directory and path, a new launcher with the same identity:
	 * still a different process than the bridge was told to trust. */
	char cmd[400];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", state);
	(void)system(cmd);
	struct proc l2 = start_launcher(SPACED_LAUNCH_BIN, state, ID7);
	r = refusal_via(hs, why, sizeof why);
	cr_assert_eq(r, SPACED_EPEER, "got %d (%s)", r, why);
	stop(&h);
	stop(&l2);
}

Test(host, refuses_a_guest_that_reports_another_identity)
{
	char state[300], gs[300], hs[300], why[512] = "";
	struct proc l = launch_named("ident", ID8, state, gs, hs);
	const char *extra[] = {"--manager-uid", "0", NULL};
	struct proc h = start_host(hs, gs, l.pid, ID7, extra);
	int r = refusal_via(hs, why, sizeof why);
	cr_assert_eq(r, SPACED_EIDENTITY, "got %d (%s)", r, why);
	cr_assert(strstr(why, "generation=8") != NULL, "the reason names what the guest reported: %s", why);
	stop(&h);
	stop(&l);
}

Test(host, handoff_passes_only_a_verified_connection)
{
	char state[300], gs[300], hs[300], why[512] = "";
	struct proc l = launch_named("handoff", ID7, state, gs, hs);
	const char *extra[] = {"--manager-uid", "0", "--handoff", NULL};
	struct proc h = start_host(hs, gs, l.pid, ID7, extra);
	int fd = -1;
	cr_assert_eq(spaced_host_connect(hs, true, 5000, &fd, why, sizeof why), 0, "%s", why);
	struct spaced_guest_client *c;
	struct spaced_identity id, want;
	cr_assert_eq(spaced_guest_client_adopt(fd, &c), 0);
	cr_assert_eq(spaced_guest_hello(c, &id), 0);
	cr_assert_eq(spaced_identity_decode(&want, ID7, strlen(ID7)), 0);
	cr_assert(spaced_identity_equal(&id, &want));
	/* The handed-off descriptor is the guest transport itself: its peer is the launcher (B2). */
	struct ucred cred;
	socklen_t len = sizeof cred;
	cr_assert_eq(getsockopt(spaced_guest_client_fd(c), SOL_SOCKET, SO_PEERCRED, &cred, &len), 0);
	cr_assert_eq(cred.pid, l.pid);
	spaced_guest_client_free(c);
	stop(&h);

	/* A bridge that must refuse says why, in handoff mode too, and hands nothing. */
	const char *extra8[] = {"--manager-uid", "0", "--handoff", NULL};
	h = start_host(hs, gs, l.pid, ID8, extra8);
	fd = -1;
	int r = spaced_host_connect(hs, true, 5000, &fd, why, sizeof why);
	cr_assert_eq(r, SPACED_EIDENTITY, "got %d (%s)", r, why);
	cr_assert_eq(fd, -1);
	stop(&h);
	stop(&l);
}

/* A bridge pre-started for a warm pool: it listens at once, serves nothing
 * before it has the identity on stdin, then checks against that identity. */
static pid_t start_pooled_host(const char *hs, const char *gs, pid_t launcher, int *in)
{
	char pidbuf[32];
	snprintf(pidbuf, sizeof pidbuf, "%d", (int)launcher);
	const char *argv[] = {SPACED_HOST_BIN, "--listen", hs, "--guest", gs, "--launcher-pid", pidbuf,
	                      "--identity", "-", "--manager-uid", "0", NULL};
	int q[2];
	cr_assert_eq(pipe2(q, O_CLOEXEC), 0);
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, q[0], 0);
	pid_t pid;
	unlink(hs);
	cr_assert_eq(posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)(uintptr_t)argv, environ), 0);
	posix_spawn_file_actions_destroy(&fa);
	close(q[0]);
	*in = q[1];
	struct stat st;
	for (int i = 0; i < 500 && !(stat(hs, &st) == 0 && S_ISSOCK(st.st_mode)); i++)
		usleep(10000);
	return pid;
}

Test(host, pooled_bridge_serves_only_after_it_learns_the_identity)
{
	char state[300], gs[300], hs[300], why[512] = "";
	struct proc l = launch_named("pool", ID7, state, gs, hs);
	int in;
	struct proc h = {start_pooled_host(hs, gs, l.pid, &in), -1};

	struct spaced_guest_client *c;
	cr_assert_eq(spaced_guest_client_connect(hs, &c), 0, "the pooled bridge listens before its claim");
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_HELLO, 0, 1, NULL, 0), 0);
	struct pollfd pf = {.fd = spaced_guest_client_fd(c), .events = POLLIN};
	cr_assert_eq(poll(&pf, 1, 300), 0, "nothing is served before the identity is known");
	cr_assert_eq(write(in, ID7 "\n", strlen(ID7) + 1), (ssize_t)strlen(ID7) + 1);
	close(in);
	struct spaced_guest_msg m;
	cr_assert_eq(spaced_guest_recv(c, &m), 0);
	cr_assert_eq(m.hdr.type, SPACED_GUEST_OUT_RESULT);
	cr_assert_eq(m.hdr.id, 1u);
	struct spaced_field_reader rd;
	cr_assert_eq(spaced_guest_result_head(c, &m, &rd), 0);
	spaced_guest_msg_clear(&m);
	cr_assert_str_eq(spaced_guest_client_identity(c), ID7);
	spaced_guest_client_free(c);
	stop(&h);

	/* Claimed for another execution than the one running: refused. */
	h.pid = start_pooled_host(hs, gs, l.pid, &in);
	cr_assert_eq(write(in, ID8 "\n", strlen(ID8) + 1), (ssize_t)strlen(ID8) + 1);
	close(in);
	wait_socket(hs);
	cr_assert_eq(refusal_via(hs, why, sizeof why), SPACED_EIDENTITY, "%s", why);
	stop(&h);
	stop(&l);
}

/* Writes then reads back size bytes through c and checks them. */
static void roundtrip(struct spaced_guest_client *c, const char *path, size_t size, unsigned seed)
{
	uint8_t *data = malloc(size);
	cr_assert_not_null(data);
	for (size_t i = 0; i < size; i++)
		data[i] = (uint8_t)(seed * 131u + i * 7u + (i >> 12));
	cr_assert_eq(spaced_guest_fs_write(c, path, data, size, 0644, 0), 0, "%s", spaced_guest_client_errmsg(c));
	struct spaced_buf b;
	spaced_buf_init(&b, size + 1);
	cr_assert_eq(spaced_guest_fs_read(c, path, 0, UINT64_MAX, &b), 0, "%s", spaced_guest_client_errmsg(c));
	cr_assert_eq(b.len, size);
	cr_assert_eq(memcmp(b.data, data, size), 0, "%s came back altered through the relay", path);
	spaced_buf_free(&b);
	free(data);
}

/* B3: the bridge keeps a few serving threads ready; connections beyond them,
 * held open at once, are all checked and served, and threads are reused after
 * connections end. Large transfers cross the relay intact with its spin on
 * and off. */
Test(host, serves_more_open_connections_than_its_ready_threads_and_relays_large_transfers)
{
	char state[300], gs[300], hs[300];
	struct proc l = launch_named("many", ID7, state, gs, hs);
	static const char *const spins[] = {"0", "50"};
	for (size_t s = 0; s < 2; s++) {
		const char *extra[] = {"--manager-uid", "0", "--relay-spin-us", spins[s], NULL};
		struct proc h = start_host(hs, gs, l.pid, ID7, extra);
		enum { OPEN = 6 };
		struct spaced_guest_client *c[OPEN];
		struct spaced_identity id;
		for (int i = 0; i < OPEN; i++) { /* all open at once: more than the ready threads */
			cr_assert_eq(spaced_guest_client_connect(hs, &c[i]), 0);
			cr_assert_eq(spaced_guest_hello(c[i], &id), 0, "connection %d: %s", i,
			             spaced_guest_client_errmsg(c[i]));
		}
		for (int i = OPEN - 1; i >= 0; i--) {
			char path[64];
			snprintf(path, sizeof path, "workspace/many-%d.bin", i);
			roundtrip(c[i], path, i == 0 ? 3u << 20 : 70000u, (unsigned)i);
			cr_assert_str_eq(spaced_guest_client_identity(c[i]), ID7);
		}
		for (int i = 0; i < OPEN; i++)
			spaced_guest_client_free(c[i]);
		for (int i = 0; i < 8; i++) { /* one after another: served by threads kept */
			struct spaced_guest_client *d;
			cr_assert_eq(spaced_guest_client_connect(hs, &d), 0);
			cr_assert_eq(spaced_guest_hello(d, &id), 0, "sequential connection %d: %s", i,
			             spaced_guest_client_errmsg(d));
			spaced_guest_client_free(d);
		}
		stop(&h);
	}
	stop(&l);
}

/* Receives one frame on fd and checks it is the RESULT of id, with status 0
 * and the expected identity. */
static void expect_hello_answer(int fd, uint32_t id)
{
	struct spaced_frame_hdr h;
	uint8_t *p = NULL;
	cr_assert_eq(spaced_frame_recv(fd, SPACED_FRAME_MAX, &h, &p), 0);
	cr_assert_eq(h.type, SPACED_GUEST_OUT_RESULT);
	cr_assert_eq(h.id, id, "the answer carries the caller's id");
	cr_assert(h.flags & SPACED_FRAME_F_END);
	struct spaced_field_reader rd;
	int64_t status = -1;
	char msg[256], ident[256];
	spaced_field_reader_init(&rd, p, h.len);
	cr_assert_eq(spaced_field_get_i64(&rd, &status), 0);
	cr_assert_eq(status, 0);
	cr_assert_eq(spaced_field_get_strbuf(&rd, msg, sizeof msg), 0);
	cr_assert_eq(spaced_field_get_strbuf(&rd, ident, sizeof ident), 0);
	cr_assert_str_eq(ident, ID7);
	free(p);
}

/* B3: a caller whose first frame is a bare HELLO gets the answer the bridge
 * checked, under the caller's own id, and everything after it relayed in
 * order; a first frame that is not a bare HELLO is relayed as it is. */
Test(host, answers_a_callers_first_hello_with_the_checked_answer_and_relays_the_rest)
{
	char state[300], gs[300], hs[300];
	struct proc l = launch_named("hello", ID7, state, gs, hs);
	const char *extra[] = {"--manager-uid", "0", NULL};
	struct proc h = start_host(hs, gs, l.pid, ID7, extra);
	for (int round = 0; round < 2; round++) {
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		snprintf(sa.sun_path, sizeof sa.sun_path, "%.100s", hs);
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
		if (round == 0) { /* a bare HELLO first, then another right behind it */
			cr_assert_eq(spaced_frame_send(fd, SPACED_GUEST_HELLO, 0, 42, NULL, 0), 0);
			cr_assert_eq(spaced_frame_send(fd, SPACED_GUEST_HELLO, 0, 43, NULL, 0), 0);
			expect_hello_answer(fd, 42);
			expect_hello_answer(fd, 43);
		} else { /* first a PROC_LIST, then a HELLO: both answered by the guest, in order */
			cr_assert_eq(spaced_frame_send(fd, SPACED_GUEST_PROC_LIST, 0, 5, NULL, 0), 0);
			cr_assert_eq(spaced_frame_send(fd, SPACED_GUEST_HELLO, 0, 6, NULL, 0), 0);
			struct spaced_frame_hdr fh;
			uint8_t *p = NULL;
			do { /* the PROC_LIST's frames, ending with its RESULT */
				free(p);
				p = NULL;
				cr_assert_eq(spaced_frame_recv(fd, SPACED_FRAME_MAX, &fh, &p), 0);
				cr_assert_eq(fh.id, 5u, "the PROC_LIST is answered first");
			} while (fh.type != SPACED_GUEST_OUT_RESULT);
			free(p);
			expect_hello_answer(fd, 6);
		}
		close(fd);
	}
	stop(&h);
	stop(&l);
}
