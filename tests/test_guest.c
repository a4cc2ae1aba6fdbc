/*
 * test_guest.c — the real spaced-guest binary on a temporary root, driven
 * through libspaced's guest client over real Unix sockets: files (streamed,
 * ranges, atomic replace), containment inside the root, exec, background
 * processes, PTY, watches, the identity on every answer (I2: each answer names
 * the execution that served it), malformed frames, and the launcher's
 * control-fd mode.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <ftw.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sodium.h>

#include "spaced_error.h"
#include "frame.h"
#include "guest_client.h"
#include "identity.h"

#define IDENT "sandbox=sbx-1;generation=8;worker=w1;substrate=process;activation=act-1;pod_uid="
#define IDENT2 "sandbox=sbx-2;generation=3;worker=w2;substrate=process;activation=a2;pod_uid="

static char dir[64], root[128], sock[128], outside[128];
static pid_t guest_pid = -1;

static void mkdir_p(const char *path)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd, "mkdir -p '%s'", path);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
}

static void put_file(const char *path, const char *content)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	fputs(content, f);
	fclose(f);
}

static char *slurp(const char *path)
{
	static char buf[4096];
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return NULL;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	buf[n] = 0;
	fclose(f);
	return buf;
}

static void make_dirs(void)
{
	snprintf(dir, sizeof dir, "/tmp/spaced-guest-test-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(root, sizeof root, "%s/root", dir);
	snprintf(sock, sizeof sock, "%s/g.sock", dir);
	snprintf(outside, sizeof outside, "%s/outside", dir);
	cr_assert_eq(mkdir(root, 0755), 0);
	cr_assert_eq(mkdir(outside, 0755), 0);
	char p[256];
	snprintf(p, sizeof p, "%s/secret", outside);
	put_file(p, "outside-content\n");
}

/* Starts spaced-guest --listen and waits for its READY line. */
static void start_guest(void)
{
	make_dirs();
	int pfd[2];
	cr_assert_eq(pipe2(pfd, O_CLOEXEC), 0);
	guest_pid = fork();
	cr_assert_geq(guest_pid, 0);
	if (guest_pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(pfd[1], 1);
		close(pfd[0]);
		execl(SPACED_GUEST_BIN, "spaced-guest", "--root", root, "--identity", IDENT, "--listen",
		      sock, (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	char line[256];
	ssize_t n = read(pfd[0], line, sizeof line - 1);
	close(pfd[0]);
	cr_assert_gt(n, 0, "guest did not start");
	line[n] = 0;
	cr_assert(strncmp(line, "READY ", 6) == 0, "got %s", line);
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	if (flag == FTW_DP)
		rmdir(p);
	else
		unlink(p);
	return 0;
}

static void stop_guest(void)
{
	if (guest_pid > 0) {
		kill(guest_pid, SIGKILL);
		waitpid(guest_pid, NULL, 0);
		guest_pid = -1;
	}
	if (dir[0]) {
		(void)nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
		dir[0] = 0;
	}
}

static struct spaced_guest_client *connect_guest(void)
{
	struct spaced_guest_client *c = NULL;
	cr_assert_eq(spaced_guest_client_connect(sock, &c), 0);
	return c;
}

static void assert_ident(struct spaced_guest_client *c)
{
	cr_assert_str_eq(spaced_guest_client_identity(c), IDENT);
}

TestSuite(guest, .init = start_guest, .fini = stop_guest, .timeout = 60);

/* I2: HELLO names the execution; every RESULT carries it. */
Test(guest, hello_returns_identity)
{
	struct spaced_guest_client *c = connect_guest();
	struct spaced_identity id, want;
	cr_assert_eq(spaced_guest_hello(c, &id), 0);
	cr_assert_eq(spaced_identity_decode(&want, IDENT, strlen(IDENT)), 0);
	cr_assert(spaced_identity_equal(&id, &want));
	cr_assert_eq(id.generation, 8);
	struct spaced_guest_stat st;
	cr_assert_eq(spaced_guest_fs_stat(c, "nope", &st), SPACED_ENOENT);
	assert_ident(c); /* errors carry it too */
	spaced_guest_client_free(c);
}

static int count_entries(void *arg, const struct spaced_guest_entry *e)
{
	struct spaced_buf *b = arg;
	spaced_buf_puts(b, e->path);
	spaced_buf_puts(b, e->st.type == SPACED_GUEST_FT_DIR ? "/ " : " ");
	return 0;
}

Test(guest, file_operations)
{
	struct spaced_guest_client *c = connect_guest();
	cr_assert_eq(spaced_guest_fs_mkdir(c, "a/b/c", 0750), 0);
	assert_ident(c);
	cr_assert_eq(spaced_guest_fs_mkdir(c, "a/b/c", 0750), 0, "mkdir -p is idempotent");
	cr_assert_eq(spaced_guest_fs_write(c, "a/b/c/f.txt", "hello\n", 6, 0600, 0), 0);
	assert_ident(c);
	char p[256];
	snprintf(p, sizeof p, "%s/a/b/c/f.txt", root);
	cr_assert_str_eq(slurp(p), "hello\n");
	struct stat hst;
	cr_assert_eq(stat(p, &hst), 0);
	cr_assert_eq(hst.st_mode & 0777, 0600);

	/* atomic replace: the new content, no temp files left behind */
	cr_assert_eq(spaced_guest_fs_write(c, "a/b/c/f.txt", "second", 6, 0644, 0), 0);
	cr_assert_str_eq(slurp(p), "second");

	struct spaced_guest_stat st;
	cr_assert_eq(spaced_guest_fs_stat(c, "a/b/c/f.txt", &st), 0);
	cr_assert_eq(st.type, SPACED_GUEST_FT_FILE);
	cr_assert_eq(st.size, 6);
	cr_assert_eq(st.mode, 0644);
	cr_assert_eq(spaced_guest_fs_stat(c, "a/b", &st), 0);
	cr_assert_eq(st.type, SPACED_GUEST_FT_DIR);
	cr_assert_eq(spaced_guest_fs_stat(c, "", &st), 0);
	cr_assert_eq(st.type, SPACED_GUEST_FT_DIR);

	/* write with MKDIRS creates missing parents; without it they are an error */
	cr_assert_eq(spaced_guest_fs_write(c, "x/y/z.txt", "z", 1, 0, 0), SPACED_ENOENT);
	cr_assert_eq(spaced_guest_fs_write(c, "x/y/z.txt", "z", 1, 0, SPACED_GUEST_WRITE_MKDIRS), 0);

	struct spaced_buf l;
	spaced_buf_init(&l, 4096);
	cr_assert_eq(spaced_guest_fs_list(c, "a", 1, count_entries, &l), 0);
	cr_assert_str_eq((char *)l.data, "b/ ");
	l.len = 0;
	cr_assert_eq(spaced_guest_fs_list(c, "a", 3, count_entries, &l), 0);
	cr_assert(strstr((char *)l.data, "b/c/f.txt ") != NULL, "%s", l.data);
	cr_assert(strstr((char *)l.data, ".spaced-tmp") == NULL, "temp file left: %s", l.data);
	spaced_buf_free(&l);

	cr_assert_eq(spaced_guest_fs_move(c, "a/b/c/f.txt", "moved.txt"), 0);
	snprintf(p, sizeof p, "%s/moved.txt", root);
	cr_assert_str_eq(slurp(p), "second");
	cr_assert_eq(spaced_guest_fs_stat(c, "a/b/c/f.txt", &st), SPACED_ENOENT);

	cr_assert_eq(spaced_guest_fs_remove(c, "a", 0), SPACED_EEXIST, "non-empty without recursive");
	cr_assert_eq(spaced_guest_fs_remove(c, "a", 1), 0);
	cr_assert_eq(spaced_guest_fs_stat(c, "a", &st), SPACED_ENOENT);
	cr_assert_eq(spaced_guest_fs_remove(c, "moved.txt", 0), 0);
	cr_assert_eq(spaced_guest_fs_remove(c, "", 1), SPACED_EPERM, "the root stays");
	spaced_guest_client_free(c);
}

Test(guest, large_file_both_ways)
{
	const size_t n = 8u << 20;
	uint8_t *data = malloc(n);
	cr_assert_not_null(data);
	randombytes_buf(data, n);
	struct spaced_guest_client *c = connect_guest();
	cr_assert_eq(spaced_guest_fs_write(c, "big.bin", data, n, 0644, 0), 0);
	char p[256];
	snprintf(p, sizeof p, "%s/big.bin", root);
	struct stat hst;
	cr_assert_eq(stat(p, &hst), 0);
	cr_assert_eq((size_t)hst.st_size, n);
	struct spaced_buf b;
	spaced_buf_init(&b, n + 1);
	cr_assert_eq(spaced_guest_fs_read(c, "big.bin", 0, UINT64_MAX, &b), 0);
	assert_ident(c);
	cr_assert_eq(b.len, n);
	cr_assert(memcmp(b.data, data, n) == 0, "content differs");
	spaced_buf_free(&b);
	free(data);
	spaced_guest_client_free(c);
}

Test(guest, byte_ranges)
{
	char p[256];
	snprintf(p, sizeof p, "%s/r.txt", root);
	put_file(p, "0123456789abcdef");
	struct spaced_guest_client *c = connect_guest();
	struct spaced_buf b;
	spaced_buf_init(&b, 1024);
	cr_assert_eq(spaced_guest_fs_read(c, "r.txt", 4, 6, &b), 0);
	cr_assert_str_eq((char *)b.data, "456789");
	b.len = 0;
	cr_assert_eq(spaced_guest_fs_read(c, "r.txt", 10, UINT64_MAX, &b), 0);
	cr_assert_str_eq((char *)b.data, "abcdef");
	b.len = 0;
	cr_assert_eq(spaced_guest_fs_read(c, "r.txt", 14, 100, &b), 0);
	cr_assert_str_eq((char *)b.data, "ef");
	b.len = 0;
	cr_assert_eq(spaced_guest_fs_read(c, "r.txt", 100, 5, &b), 0);
	cr_assert_eq(b.len, 0);
	cr_assert_eq(spaced_guest_fs_read(c, "", 0, 5, &b), SPACED_EINVAL, "a directory");
	spaced_buf_free(&b);
	spaced_guest_client_free(c);
}

/* Paths never leave the root: "..", absolute symlinks, symlinks to outside,
 * loops; and nothing outside is read, written or removed. */
Test(guest, escapes_are_contained)
{
	char p[256], t[256];
	snprintf(p, sizeof p, "%s/etc_link", root);
	cr_assert_eq(symlink("/etc", p), 0);
	snprintf(p, sizeof p, "%s/abs", root);
	snprintf(t, sizeof t, "%s/secret", outside);
	cr_assert_eq(symlink(t, p), 0);
	snprintf(p, sizeof p, "%s/rel", root);
	cr_assert_eq(symlink("../outside/secret", p), 0);
	snprintf(p, sizeof p, "%s/reldir", root);
	cr_assert_eq(symlink("../outside", p), 0);
	snprintf(p, sizeof p, "%s/loop1", root);
	cr_assert_eq(symlink("loop2", p), 0);
	snprintf(p, sizeof p, "%s/loop2", root);
	cr_assert_eq(symlink("loop1", p), 0);

	struct spaced_guest_client *c = connect_guest();
	struct spaced_buf b;
	spaced_buf_init(&b, 1 << 20);
	const char *reads[] = {"../outside/secret", "/../outside/secret", "abs", "rel",
	                       "reldir/secret", "etc_link/passwd", "/etc/passwd",
	                       "a/../../outside/secret"};
	for (size_t i = 0; i < sizeof reads / sizeof reads[0]; i++) {
		int e = spaced_guest_fs_read(c, reads[i], 0, UINT64_MAX, &b);
		cr_assert_eq(e, SPACED_ENOENT, "%s: %s", reads[i], spaced_strerror(e));
		cr_assert_eq(b.len, 0);
	}
	cr_assert_eq(spaced_guest_fs_read(c, "loop1", 0, UINT64_MAX, &b), SPACED_EPERM, "loop");
	assert_ident(c);

	/* writes through the same paths land inside the root or fail */
	cr_assert_eq(spaced_guest_fs_write(c, "reldir/secret", "X", 1, 0, 0), SPACED_ENOENT);
	cr_assert_eq(spaced_guest_fs_write(c, "../outside/secret", "X", 1, 0, 0), SPACED_ENOENT);
	cr_assert_eq(spaced_guest_fs_write(c, "etc_link/evil", "X", 1, 0, 0), SPACED_ENOENT);
	cr_assert_eq(spaced_guest_fs_write(c, "../../escaped", "X", 1, 0, 0), 0);
	snprintf(p, sizeof p, "%s/escaped", root);
	cr_assert_str_eq(slurp(p), "X", "'..' at the root stays at the root");
	cr_assert_eq(spaced_guest_fs_mkdir(c, "../up", 0755), SPACED_EINVAL);
	cr_assert_eq(spaced_guest_fs_remove(c, "reldir/secret", 0), SPACED_ENOENT);
	cr_assert_eq(spaced_guest_fs_remove(c, "../outside", 1), SPACED_ENOENT);
	cr_assert_eq(spaced_guest_fs_move(c, "../outside/secret", "stolen"), SPACED_ENOENT);
	/* removing a symlink removes the link, never its target */
	cr_assert_eq(spaced_guest_fs_remove(c, "abs", 0), 0);

	snprintf(p, sizeof p, "%s/secret", outside);
	cr_assert_str_eq(slurp(p), "outside-content\n", "outside file touched");
	snprintf(p, sizeof p, "%s/evil", "/etc");
	cr_assert_eq(access(p, F_OK), -1);
	spaced_buf_free(&b);
	spaced_guest_client_free(c);
}

/* /proc/self/root inside the root is a magic link: refused, and so is the
 * guest's own /proc entry. The test binds the real /proc into the root in a
 * private mount namespace. */
Test(guest, proc_self_root_refused)
{
	stop_guest();
	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		cr_skip_test("no mount namespace: %s", strerror(errno));
	start_guest();
	char p[256];
	snprintf(p, sizeof p, "%s/proc", root);
	cr_assert_eq(mkdir(p, 0755), 0);
	cr_assert_eq(mount("/proc", p, NULL, MS_BIND | MS_REC, NULL), 0, "%s", strerror(errno));
	struct spaced_guest_client *c = connect_guest();
	struct spaced_buf b;
	spaced_buf_init(&b, 1 << 20);
	int e = spaced_guest_fs_read(c, "proc/self/root/etc/passwd", 0, UINT64_MAX, &b);
	cr_assert_eq(e, SPACED_EPERM, "%s", spaced_strerror(e));
	e = spaced_guest_fs_read(c, "/proc/1/root/etc/hostname", 0, UINT64_MAX, &b);
	cr_assert_eq(e, SPACED_EPERM, "%s", spaced_strerror(e));
	e = spaced_guest_fs_write(c, "proc/self/root/tmp/spaced-escape", "X", 1, 0, 0);
	cr_assert_eq(e, SPACED_EPERM, "%s", spaced_strerror(e));
	cr_assert_eq(access("/tmp/spaced-escape", F_OK), -1);
	cr_assert_eq(b.len, 0);
	/* the guest's own entry is not the tenant's to read (its memory map, descriptors) */
	cr_assert_neq(spaced_guest_fs_read(c, "proc/self/status", 0, UINT64_MAX, &b), 0);
	cr_assert_eq(b.len, 0);
	/* an ordinary file under the same mount is still readable */
	cr_assert_eq(spaced_guest_fs_read(c, "proc/loadavg", 0, UINT64_MAX, &b), 0);
	cr_assert(b.len > 0);
	spaced_buf_free(&b);
	spaced_guest_client_free(c);
	umount2(p, MNT_DETACH);
}

static struct spaced_guest_exit run(struct spaced_guest_client *c, const char *const *argv,
                                    const char *const *env, const char *cwd, uint64_t timeout,
                                    const char *in, struct spaced_buf *out, struct spaced_buf *err)
{
	struct spaced_guest_exec_req req = {argv, env, cwd, timeout, in ? SPACED_GUEST_EXEC_STDIN : 0};
	struct spaced_guest_exit x;
	int e = spaced_guest_exec(c, &req, in, in ? strlen(in) : 0, out, err, &x);
	cr_assert_eq(e, 0, "exec %s: %s (%s)", argv[0], spaced_strerror(e),
	             spaced_guest_client_errmsg(c));
	return x;
}

Test(guest, exec_output_status_env_cwd_stdin)
{
	struct spaced_guest_client *c = connect_guest();
	struct spaced_buf out, err;
	spaced_buf_init(&out, 1 << 20);
	spaced_buf_init(&err, 1 << 20);
	const char *a1[] = {"sh", "-c", "echo out; echo err >&2; exit 7", NULL};
	struct spaced_guest_exit x = run(c, a1, NULL, NULL, 0, NULL, &out, &err);
	cr_assert_eq(x.code, 7);
	cr_assert_eq(x.signal, 0);
	cr_assert_str_eq((char *)out.data, "out\n");
	cr_assert_str_eq((char *)err.data, "err\n");
	assert_ident(c);

	cr_assert_eq(spaced_guest_fs_mkdir(c, "work", 0755), 0);
	out.len = 0;
	const char *a2[] = {"sh", "-c", "echo \"$FOO\"; pwd", NULL};
	const char *env[] = {"FOO=bar baz", NULL};
	x = run(c, a2, env, "work", 0, NULL, &out, NULL);
	cr_assert_eq(x.code, 0);
	char want[4200];
	char real[4096];
	cr_assert_not_null(realpath(root, real));
	snprintf(want, sizeof want, "bar baz\n%s/work\n", real);
	cr_assert_str_eq((char *)out.data, want);

	out.len = 0;
	const char *a3[] = {"tr", "a-z", "A-Z", NULL};
	x = run(c, a3, NULL, NULL, 0, "streamed stdin\n", &out, NULL);
	cr_assert_eq(x.code, 0);
	cr_assert_str_eq((char *)out.data, "STREAMED STDIN\n");

	/* a missing program is the request's error, not an exit status */
	const char *a4[] = {"/no/such/program", NULL};
	struct spaced_guest_exec_req req = {a4, NULL, NULL, 0, 0};
	cr_assert_eq(spaced_guest_exec(c, &req, NULL, 0, NULL, NULL, &x), SPACED_ENOENT);
	req.cwd = "no-such-dir";
	req.argv = a1;
	cr_assert_eq(spaced_guest_exec(c, &req, NULL, 0, NULL, NULL, &x), SPACED_ENOENT);
	spaced_buf_free(&out);
	spaced_buf_free(&err);
	spaced_guest_client_free(c);
}

/* How a program is found and what it inherits: the request's PATH (not the
 * guest's own) names where a bare program name is looked up, in the request's
 * working directory; a file that is not executable is refused; the child
 * starts with no signal blocked and no standard signal ignored, though the
 * guest blocks and ignores some for itself. */
Test(guest, exec_lookup_and_inheritance)
{
	struct spaced_guest_client *c = connect_guest();
	struct spaced_buf out;
	spaced_buf_init(&out, 1 << 20);
	cr_assert_eq(spaced_guest_fs_mkdir(c, "bin", 0755), 0);
	const char script[] = "#!/bin/sh\necho found-in-request-path\n";
	cr_assert_eq(spaced_guest_fs_write(c, "bin/only-here", script, strlen(script), 0755, 0), 0);
	cr_assert_eq(spaced_guest_fs_write(c, "bin/not-exec", script, strlen(script), 0644, 0), 0);
	char real[4096], pathvar[4200];
	cr_assert_not_null(realpath(root, real));
	snprintf(pathvar, sizeof pathvar, "PATH=%s/bin:/usr/bin:/bin", real);
	const char *env[] = {pathvar, NULL};
	const char *a1[] = {"only-here", NULL};
	struct spaced_guest_exit x = run(c, a1, env, NULL, 0, NULL, &out, NULL);
	cr_assert_eq(x.code, 0);
	cr_assert_str_eq((char *)out.data, "found-in-request-path\n");

	/* without that PATH the name is not found; a relative name is taken in the request's cwd */
	struct spaced_guest_exec_req req = {a1, NULL, NULL, 0, 0};
	cr_assert_eq(spaced_guest_exec(c, &req, NULL, 0, NULL, NULL, &x), SPACED_ENOENT);
	const char *a2[] = {"./only-here", NULL};
	out.len = 0;
	x = run(c, a2, NULL, "bin", 0, NULL, &out, NULL);
	cr_assert_eq(x.code, 0);
	cr_assert_str_eq((char *)out.data, "found-in-request-path\n");
	const char *a3[] = {"not-exec", NULL};
	req.argv = a3;
	req.env = env;
	int e = spaced_guest_exec(c, &req, NULL, 0, NULL, NULL, &x);
	cr_assert_eq(e, SPACED_EPERM, "not-exec: %s", spaced_strerror(e));

	const char *a4[] = {"sh", "-c", "grep -E '^Sig(Blk|Ign):' /proc/self/status", NULL};
	out.len = 0;
	x = run(c, a4, NULL, NULL, 0, NULL, &out, NULL);
	cr_assert_eq(x.code, 0);
	unsigned long long blk = 1, ign = 1;
	cr_assert_eq(sscanf((char *)out.data, "SigBlk:\t%llx\nSigIgn:\t%llx", &blk, &ign), 2, "%s", (char *)out.data);
	cr_assert_eq(blk, 0, "blocked in the child: %llx", blk);
	/* no standard signal ignored (the guest ignores SIGPIPE and, as PID 1,
	 * others); glibc's posix_spawn leaves its own two internal real-time
	 * signals (32, 33) ignored, as in any glibc program's children */
	cr_assert_eq(ign & ~0x180000000ull, 0, "ignored in the child: %llx", ign);
	spaced_buf_free(&out);
	spaced_guest_client_free(c);
}

/* Stdin larger than the pipe and than the guest's stdin queue: the guest
 * feeds it as the process reads and holds the connection back meanwhile. */
Test(guest, exec_large_stdin)
{
	struct spaced_guest_client *c = connect_guest();
	const size_t n = 3u << 20;
	char *in = malloc(n + 1);
	cr_assert_not_null(in);
	memset(in, 'a', n);
	in[n] = 0;
	struct spaced_buf out;
	spaced_buf_init(&out, 4096);
	const char *a[] = {"sh", "-c", "sleep 0.2; wc -c", NULL};
	struct spaced_guest_exit x = run(c, a, NULL, NULL, 0, in, &out, NULL);
	cr_assert_eq(x.code, 0);
	cr_assert_eq(strtoul((char *)out.data, NULL, 10), n, "%s", out.data);
	struct spaced_identity id;
	cr_assert_eq(spaced_guest_hello(c, &id), 0);
	spaced_buf_free(&out);
	free(in);
	spaced_guest_client_free(c);
}

/* Bulk output of a pipe goes to the connection without a copy through the
 * guest (spliced, spaced-guest/proc.c), a whole frame at a time: byte-exact
 * for stdout and stderr together, through a connection whose reader takes
 * little at a time (its socket full again and again, so the guest waits for
 * room with output left in the pipes), and for the output still in the pipes
 * when the process has exited. */
static uint8_t *random_bytes(size_t n);
static uint32_t start_fg(struct spaced_guest_client *c, const char *const *argv);

Test(guest, exec_bulk_output_exact_through_a_full_socket)
{
	const size_t n = 5u << 20;
	uint8_t *data = random_bytes(n);
	struct spaced_guest_client *c = connect_guest();
	cr_assert_eq(spaced_guest_fs_write(c, "bulk.bin", data, n, 0644, 0), 0);
	struct spaced_buf out, err;
	spaced_buf_init(&out, 2 * n);
	spaced_buf_init(&err, 2 * n);
	const char *a[] = {"sh", "-c", "cat bulk.bin; cat bulk.bin >&2; head -c 1000 bulk.bin", NULL};
	uint32_t id = start_fg(c, a);
	usleep(300 * 1000); /* the socket and the pipe fill, the rest waits */
	size_t since_pause = 0;
	for (;;) {
		struct spaced_guest_msg m = {0};
		cr_assert_eq(spaced_guest_recv(c, &m), 0);
		cr_assert_eq(m.hdr.id, id);
		if (m.hdr.type == SPACED_GUEST_OUT_RESULT) {
			spaced_guest_msg_clear(&m);
			break;
		}
		cr_assert(m.hdr.type == SPACED_GUEST_OUT_STDOUT || m.hdr.type == SPACED_GUEST_OUT_STDERR, "type %x",
		          m.hdr.type);
		cr_assert_eq(spaced_buf_append(m.hdr.type == SPACED_GUEST_OUT_STDOUT ? &out : &err, m.payload, m.hdr.len), 0);
		since_pause += m.hdr.len;
		if (since_pause > (256u << 10)) { /* a reader that takes a little, then pauses */
			usleep(5 * 1000);
			since_pause = 0;
		}
		spaced_guest_msg_clear(&m);
	}
	cr_assert_eq(out.len, n + 1000);
	cr_assert_eq(err.len, n);
	cr_assert(memcmp(out.data, data, n) == 0 && memcmp(out.data + n, data, 1000) == 0, "stdout differs");
	cr_assert(memcmp(err.data, data, n) == 0, "stderr differs");
	/* the connection is still in step: another request on it works */
	assert_ident(c);
	spaced_buf_free(&out);
	spaced_buf_free(&err);
	free(data);
	spaced_guest_client_free(c);
}

/* A stream whose reader takes none of a bulk exec's output holds only its own
 * pipe and socket: the guest serves another connection meanwhile. */
Test(guest, stalled_exec_reader_does_not_block_others)
{
	struct spaced_guest_client *stalled = connect_guest();
	const char *big[] = {"head", "-c", "50000000", "/dev/zero", NULL};
	uint32_t sid = start_fg(stalled, big);
	(void)sid;
	usleep(200 * 1000); /* its socket and pipe fill */
	struct spaced_guest_client *c = connect_guest();
	struct spaced_buf out;
	spaced_buf_init(&out, 4096);
	const char *a[] = {"echo", "alive", NULL};
	struct spaced_guest_exit x = run(c, a, NULL, NULL, 0, NULL, &out, NULL);
	cr_assert_eq(x.code, 0);
	cr_assert_str_eq((char *)out.data, "alive\n");
	spaced_buf_free(&out);
	spaced_guest_client_free(c);
	spaced_guest_client_free(stalled);
}

Test(guest, exec_timeout_kills_group)
{
	struct spaced_guest_client *c = connect_guest();
	struct spaced_buf out;
	spaced_buf_init(&out, 1 << 20);
	const char *a[] = {"sh", "-c", "echo before; sleep 30; echo after", NULL};
	struct spaced_guest_exit x = run(c, a, NULL, NULL, 300, NULL, &out, NULL);
	cr_assert_eq(x.timed_out, 1);
	cr_assert_eq(x.signal, SIGKILL);
	cr_assert_str_eq((char *)out.data, "before\n");
	spaced_buf_free(&out);
	spaced_guest_client_free(c);
}

/* Two streams on one connection: an exec and a signal request for it. */
Test(guest, signal_running_process)
{
	struct spaced_guest_client *c = connect_guest();
	const char *a[] = {"sleep", "30", NULL};
	struct spaced_guest_exec_req req = {a, NULL, NULL, 0, 0};
	struct spaced_buf b;
	spaced_buf_init(&b, 4096);
	cr_assert_eq(spaced_guest_encode_exec(&b, &req), 0);
	uint32_t eid = spaced_guest_client_next_id(c);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_EXEC, 0, eid, b.data, b.len), 0);
	struct spaced_guest_msg m = {0};
	cr_assert_eq(spaced_guest_recv(c, &m), 0);
	cr_assert_eq(m.hdr.type, SPACED_GUEST_OUT_STARTED);
	struct spaced_field_reader r;
	uint64_t proc, pid;
	spaced_field_reader_init(&r, m.payload, m.hdr.len);
	cr_assert_eq(spaced_field_get_u64(&r, &proc), 0);
	cr_assert_eq(spaced_field_get_u64(&r, &pid), 0);
	spaced_guest_msg_clear(&m);

	b.len = 0;
	spaced_field_put_u64(&b, proc);
	spaced_field_put_i64(&b, SIGTERM);
	uint32_t sid = spaced_guest_client_next_id(c);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_PROC_SIGNAL, 0, sid, b.data, b.len), 0);
	bool got_sig = false, got_exec = false;
	while (!got_sig || !got_exec) {
		cr_assert_eq(spaced_guest_recv(c, &m), 0);
		cr_assert_eq(m.hdr.type, SPACED_GUEST_OUT_RESULT);
		cr_assert_eq(spaced_guest_result_head(c, &m, &r), 0);
		assert_ident(c);
		if (m.hdr.id == sid) {
			got_sig = true;
		} else {
			cr_assert_eq(m.hdr.id, eid);
			struct spaced_guest_exit x;
			cr_assert_eq(spaced_guest_exit_parse(&r, &x), 0);
			cr_assert_eq(x.signal, SIGTERM);
			cr_assert_eq(x.code, -1);
			got_exec = true;
		}
		spaced_guest_msg_clear(&m);
	}
	spaced_buf_free(&b);
	spaced_guest_client_free(c);
}

static int raw_conn(void);
static void assert_dropped(int fd);
static void raw_header(int fd, uint32_t len, uint16_t type, uint16_t flags, uint32_t id);

/* Starts a foreground exec with stdin open (as a streamed exec does) and
 * returns its stream id once STARTED came. */
static uint32_t start_fg(struct spaced_guest_client *c, const char *const *argv)
{
	struct spaced_guest_exec_req req = {argv, NULL, NULL, 0, SPACED_GUEST_EXEC_STDIN};
	struct spaced_buf b;
	spaced_buf_init(&b, 4096);
	cr_assert_eq(spaced_guest_encode_exec(&b, &req), 0);
	uint32_t id = spaced_guest_client_next_id(c);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_EXEC, 0, id, b.data, b.len), 0);
	spaced_buf_free(&b);
	struct spaced_guest_msg m = {0};
	cr_assert_eq(spaced_guest_recv(c, &m), 0);
	cr_assert_eq(m.hdr.type, SPACED_GUEST_OUT_STARTED);
	spaced_guest_msg_clear(&m);
	return id;
}

static void send_signal_input(struct spaced_guest_client *c, uint32_t id, int64_t sig)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 64);
	spaced_field_put_i64(&b, sig);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_IN_SIGNAL, 0, id, b.data, b.len), 0);
	spaced_buf_free(&b);
}

/* Reads stream id's stdout (stderr is dropped) until its RESULT; returns the exit. */
static struct spaced_guest_exit collect_exit(struct spaced_guest_client *c, uint32_t id, struct spaced_buf *out)
{
	for (;;) {
		struct spaced_guest_msg m = {0};
		cr_assert_eq(spaced_guest_recv(c, &m), 0);
		cr_assert_eq(m.hdr.id, id);
		if (m.hdr.type == SPACED_GUEST_OUT_STDOUT) {
			cr_assert_eq(spaced_buf_append(out, m.payload, m.hdr.len), 0);
			spaced_guest_msg_clear(&m);
			continue;
		}
		if (m.hdr.type == SPACED_GUEST_OUT_STDERR) {
			/* a shell may say a child of its died of a signal ("Real-time signal 30") */
			spaced_guest_msg_clear(&m);
			continue;
		}
		struct spaced_field_reader r;
		struct spaced_guest_exit x;
		cr_assert_eq(m.hdr.type, SPACED_GUEST_OUT_RESULT, "type %x", m.hdr.type);
		cr_assert_eq(spaced_guest_result_head(c, &m, &r), 0);
		cr_assert_eq(spaced_guest_exit_parse(&r, &x), 0);
		spaced_guest_msg_clear(&m);
		cr_assert_eq(spaced_buf_append(out, "", 1), 0);
		out->len--;
		return x;
	}
}

/* True once pid is gone or a zombie (bounded by count, not time). */
static bool pid_ended(pid_t pid)
{
	for (int i = 0; i < 1200; i++) {
		char path[64], st[512];
		snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
		FILE *f = fopen(path, "r");
		if (f == NULL)
			return true;
		size_t n = fread(st, 1, sizeof st - 1, f);
		fclose(f);
		st[n] = 0;
		const char *rp = strrchr(st, ')');
		if (rp != NULL && rp[1] == ' ' && rp[2] == 'Z')
			return true;
		usleep(25000);
	}
	return false;
}

/* True once /proc/PID/comm is comm (bounded by count, not time). */
static bool pid_runs(pid_t pid, const char *comm)
{
	for (int i = 0; i < 4000; i++) {
		char path[64], c[64] = {0};
		snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
		FILE *f = fopen(path, "r");
		if (f == NULL)
			return false;
		size_t n = fread(c, 1, sizeof c - 1, f);
		fclose(f);
		if (n > 0 && c[n - 1] == '\n')
			c[n - 1] = 0;
		if (strcmp(c, comm) == 0)
			return true;
		usleep(5000);
	}
	return false;
}

/* SIGNAL input on a foreground EXEC stream (what a streamed exec's 's' message
 * becomes): the signal reaches the command's whole process group, the stream
 * ends with the command's own exit; a number outside 1-64, a malformed body
 * or a stream of another kind drops that connection only, and kills its
 * foreground command. */
Test(guest, signal_input_reaches_foreground_group)
{
	struct spaced_guest_client *c = connect_guest();
	struct spaced_buf out;
	spaced_buf_init(&out, 1 << 20);
	/* sh traps TERM; its background sleep (same group) gets it too */
	const char *a[] = {"sh", "-c", "trap 'echo trapped; exit 3' TERM; sleep 30 & echo $!; wait", NULL};
	uint32_t id = start_fg(c, a);
	struct spaced_guest_msg m = {0};
	cr_assert_eq(spaced_guest_recv(c, &m), 0);
	cr_assert_eq(m.hdr.type, SPACED_GUEST_OUT_STDOUT);
	char pidtext[32] = {0};
	memcpy(pidtext, m.payload, m.hdr.len < sizeof pidtext - 1 ? m.hdr.len : sizeof pidtext - 1);
	spaced_guest_msg_clear(&m);
	pid_t sleeper = (pid_t)atoi(pidtext);
	cr_assert_gt(sleeper, 1);
	/* until the child runs sleep, a TERM would be taken by the shell's own
	 * trap in the child (and lost at its exec) */
	cr_assert(pid_runs(sleeper, "sleep"), "the background sleep started");
	send_signal_input(c, id, SIGTERM);
	struct spaced_guest_exit x = collect_exit(c, id, &out);
	cr_assert_eq(x.code, 3, "code %d signal %d", (int)x.code, (int)x.signal);
	cr_assert_str_eq((char *)out.data, "trapped\n");
	cr_assert(pid_ended(sleeper), "the group's other member got the signal too");
	assert_ident(c);

	/* a plain command killed by SIGINT: the signal is its exit */
	const char *b[] = {"sleep", "30", NULL};
	id = start_fg(c, b);
	send_signal_input(c, id, SIGINT);
	out.len = 0;
	x = collect_exit(c, id, &out);
	cr_assert_eq(x.signal, SIGINT);
	cr_assert_eq(x.code, -1);

	/* signal 64 (the highest) is taken */
	const char *d[] = {"sh", "-c", "trap 'echo rt; exit 4' 64; echo ready; while :; do sleep 0.05; done", NULL};
	id = start_fg(c, d);
	struct spaced_buf ready;
	spaced_buf_init(&ready, 4096);
	while (ready.data == NULL || strstr((char *)ready.data, "ready") == NULL) {
		cr_assert_eq(spaced_guest_recv(c, &m), 0);
		cr_assert_eq(m.hdr.type, SPACED_GUEST_OUT_STDOUT);
		cr_assert_eq(spaced_buf_append(&ready, m.payload, m.hdr.len), 0);
		cr_assert_eq(spaced_buf_append(&ready, "", 1), 0);
		ready.len--;
		spaced_guest_msg_clear(&m);
	}
	send_signal_input(c, id, 64);
	out.len = 0;
	x = collect_exit(c, id, &out);
	cr_assert_eq(x.code, 4, "code %d signal %d", (int)x.code, (int)x.signal);
	spaced_buf_free(&ready);

	/* refused inputs: each drops its own connection, and its command with it */
	const int64_t bad[] = {0, 65, -1, 1000000};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct spaced_guest_client *v = connect_guest();
		const char *e[] = {"sh", "-c", "echo $$; exec sleep 30", NULL};
		uint32_t vid = start_fg(v, e);
		cr_assert_eq(spaced_guest_recv(v, &m), 0);
		memset(pidtext, 0, sizeof pidtext);
		memcpy(pidtext, m.payload, m.hdr.len < sizeof pidtext - 1 ? m.hdr.len : sizeof pidtext - 1);
		spaced_guest_msg_clear(&m);
		pid_t victim = (pid_t)atoi(pidtext);
		send_signal_input(v, vid, bad[i]);
		int fd = dup(spaced_guest_client_fd(v));
		spaced_guest_client_free(v);
		assert_dropped(fd);
		cr_assert(pid_ended(victim), "signal %lld: the foreground command was killed with its connection",
		          (long long)bad[i]);
	}
	int fd = raw_conn(); /* a body that is not exactly one i64 */
	struct spaced_buf bb;
	spaced_buf_init(&bb, 64);
	spaced_field_put_u64(&bb, 15);
	raw_header(fd, (uint32_t)bb.len, SPACED_GUEST_IN_SIGNAL, 0, 9);
	cr_assert_eq(write(fd, bb.data, bb.len), (ssize_t)bb.len);
	assert_dropped(fd);
	fd = raw_conn(); /* trailing bytes */
	bb.len = 0;
	spaced_field_put_i64(&bb, 15);
	spaced_field_put_i64(&bb, 15);
	raw_header(fd, (uint32_t)bb.len, SPACED_GUEST_IN_SIGNAL, 0, 9);
	cr_assert_eq(write(fd, bb.data, bb.len), (ssize_t)bb.len);
	assert_dropped(fd);
	fd = raw_conn(); /* a stream of another kind: a watch */
	bb.len = 0;
	spaced_field_put_str(&bb, "");
	raw_header(fd, (uint32_t)bb.len, SPACED_GUEST_WATCH, 0, 7);
	cr_assert_eq(write(fd, bb.data, bb.len), (ssize_t)bb.len);
	bb.len = 0;
	spaced_field_put_i64(&bb, 15);
	raw_header(fd, (uint32_t)bb.len, SPACED_GUEST_IN_SIGNAL, 0, 7);
	cr_assert_eq(write(fd, bb.data, bb.len), (ssize_t)bb.len);
	assert_dropped(fd);
	spaced_buf_free(&bb);

	/* a signal for a stream that is not open is ignored (it may have ended) */
	send_signal_input(c, 4242, SIGTERM);
	struct spaced_identity ident;
	cr_assert_eq(spaced_guest_hello(c, &ident), 0);
	cr_assert_eq(waitpid(guest_pid, NULL, WNOHANG), 0, "guest died");
	spaced_buf_free(&out);
	spaced_guest_client_free(c);
}

struct find_proc {
	uint64_t id;
	int found, running;
};

static int find_cb(void *arg, const struct spaced_guest_proc *p)
{
	struct find_proc *f = arg;
	if (p->proc == f->id) {
		f->found = 1;
		f->running = p->running;
	}
	return 0;
}

Test(guest, background_reattach_and_kill)
{
	struct spaced_guest_client *c = connect_guest();
	const char *a[] = {"sh", "-c", "echo one; echo two >&2; read x; echo got-$x", NULL};
	/* The process waits on a FIFO-less stdin: background processes get an empty
	 * stdin, so `read` sees EOF at once and the script goes on. */
	struct spaced_guest_exec_req req = {a, NULL, NULL, 0, SPACED_GUEST_EXEC_BACKGROUND};
	struct spaced_guest_exit x = {0};
	cr_assert_eq(spaced_guest_exec(c, &req, NULL, 0, NULL, NULL, &x), 0);
	cr_assert_gt(x.proc, 0);
	assert_ident(c);
	uint64_t first = x.proc;
	spaced_guest_client_free(c); /* it outlives its connection */

	c = connect_guest();
	struct find_proc f = {first, 0, 0};
	cr_assert_eq(spaced_guest_proc_list(c, find_cb, &f), 0);
	cr_assert(f.found);
	struct spaced_buf out, err;
	spaced_buf_init(&out, 1 << 20);
	spaced_buf_init(&err, 1 << 20);
	cr_assert_eq(spaced_guest_proc_attach(c, first, &out, &err, &x), 0);
	cr_assert_str_eq((char *)out.data, "one\ngot-\n");
	cr_assert_str_eq((char *)err.data, "two\n");
	cr_assert_eq(x.code, 0);
	/* attach again after the end: the same kept output */
	out.len = err.len = 0;
	cr_assert_eq(spaced_guest_proc_attach(c, first, &out, &err, &x), 0);
	cr_assert_str_eq((char *)out.data, "one\ngot-\n");

	/* a long-running one: attached on a second connection, killed from the first */
	const char *b[] = {"sh", "-c", "echo running; exec sleep 100", NULL};
	req.argv = b;
	cr_assert_eq(spaced_guest_exec(c, &req, NULL, 0, NULL, NULL, &x), 0);
	uint64_t second = x.proc;
	struct spaced_guest_client *c2 = connect_guest();
	struct spaced_buf body;
	spaced_buf_init(&body, 64);
	spaced_field_put_u64(&body, second);
	uint32_t aid = spaced_guest_client_next_id(c2);
	cr_assert_eq(spaced_guest_send(c2, SPACED_GUEST_PROC_ATTACH, 0, aid, body.data, body.len), 0);
	struct spaced_guest_msg m = {0};
	cr_assert_eq(spaced_guest_recv(c2, &m), 0);
	cr_assert_eq(m.hdr.type, SPACED_GUEST_OUT_STDOUT);
	cr_assert_eq(m.hdr.len, 8);
	cr_assert(memcmp(m.payload, "running\n", 8) == 0);
	spaced_guest_msg_clear(&m);
	cr_assert_eq(spaced_guest_proc_kill(c, second), 0);
	cr_assert_eq(spaced_guest_recv(c2, &m), 0);
	struct spaced_field_reader r;
	cr_assert_eq(spaced_guest_result_head(c2, &m, &r), 0);
	cr_assert_eq(spaced_guest_exit_parse(&r, &x), 0);
	cr_assert_eq(x.signal, SIGKILL);
	spaced_guest_msg_clear(&m);
	f = (struct find_proc){second, 0, 0};
	cr_assert_eq(spaced_guest_proc_list(c, find_cb, &f), 0);
	cr_assert_eq(f.found, 0, "killed process is forgotten");
	cr_assert_eq(spaced_guest_proc_attach(c, second, &out, &err, &x), SPACED_ENOENT);
	spaced_buf_free(&body);
	spaced_buf_free(&out);
	spaced_buf_free(&err);
	spaced_guest_client_free(c2);
	spaced_guest_client_free(c);
}

/* Reads STDOUT frames of stream id into acc until it contains needle. */
static void read_until(struct spaced_guest_client *c, uint32_t id, struct spaced_buf *acc,
                       const char *needle)
{
	while (acc->data == NULL || strstr((char *)acc->data, needle) == NULL) {
		struct spaced_guest_msg m = {0};
		cr_assert_eq(spaced_guest_recv(c, &m), 0);
		cr_assert_eq(m.hdr.id, id);
		if (m.hdr.type == SPACED_GUEST_OUT_STDOUT)
			cr_assert_eq(spaced_buf_append(acc, m.payload, m.hdr.len), 0);
		else
			cr_assert_eq(m.hdr.type, SPACED_GUEST_OUT_STARTED, "type %x", m.hdr.type);
		spaced_guest_msg_clear(&m);
	}
}

Test(guest, terminal_resize_and_exit)
{
	struct spaced_guest_client *c = connect_guest();
	const char *a[] = {"sh", NULL};
	const char *env[] = {"PS1=$ ", NULL};
	struct spaced_guest_exec_req req = {a, env, NULL, 0, 0};
	struct spaced_buf b, acc;
	spaced_buf_init(&b, 4096);
	spaced_buf_init(&acc, 1 << 20);
	cr_assert_eq(spaced_guest_encode_term(&b, &req, 24, 80), 0);
	uint32_t id = spaced_guest_client_next_id(c);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_TERM_OPEN, 0, id, b.data, b.len), 0);
	const char *cmd = "stty size; tty\n";
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_IN_STDIN, 0, id, cmd, strlen(cmd)), 0);
	read_until(c, id, &acc, "/dev/pts/");
	cr_assert(strstr((char *)acc.data, "24 80") != NULL, "%s", acc.data);
	b.len = 0;
	spaced_field_put_u64(&b, 33);
	spaced_field_put_u64(&b, 111);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_IN_RESIZE, 0, id, b.data, b.len), 0);
	cmd = "stty size\n";
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_IN_STDIN, 0, id, cmd, strlen(cmd)), 0);
	read_until(c, id, &acc, "33 111");
	cmd = "exit 5\n";
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_IN_STDIN, 0, id, cmd, strlen(cmd)), 0);
	for (;;) {
		struct spaced_guest_msg m = {0};
		cr_assert_eq(spaced_guest_recv(c, &m), 0);
		if (m.hdr.type == SPACED_GUEST_OUT_RESULT) {
			struct spaced_field_reader r;
			struct spaced_guest_exit x;
			cr_assert_eq(spaced_guest_result_head(c, &m, &r), 0);
			cr_assert_eq(spaced_guest_exit_parse(&r, &x), 0);
			cr_assert_eq(x.code, 5);
			assert_ident(c);
			spaced_guest_msg_clear(&m);
			break;
		}
		cr_assert_eq(m.hdr.type, SPACED_GUEST_OUT_STDOUT);
		spaced_guest_msg_clear(&m);
	}
	spaced_buf_free(&b);
	spaced_buf_free(&acc);
	spaced_guest_client_free(c);
}

struct want_ev {
	uint64_t kind;
	const char *path, *path2;
	int seen;
};

static void expect_events(struct spaced_guest_client *c, uint32_t id, struct want_ev *w, size_t n)
{
	size_t left = n;
	for (size_t i = 0; i < n; i++)
		left -= w[i].seen ? 1 : 0;
	while (left > 0) {
		struct spaced_guest_msg m = {0};
		cr_assert_eq(spaced_guest_recv(c, &m), 0);
		cr_assert_eq(m.hdr.id, id);
		cr_assert_eq(m.hdr.type, SPACED_GUEST_OUT_EVENT, "type %x", m.hdr.type);
		struct spaced_field_reader r;
		uint64_t kind;
		char p1[512], p2[512];
		spaced_field_reader_init(&r, m.payload, m.hdr.len);
		cr_assert_eq(spaced_field_get_u64(&r, &kind), 0);
		cr_assert_eq(spaced_field_get_strbuf(&r, p1, sizeof p1), 0);
		cr_assert_eq(spaced_field_get_strbuf(&r, p2, sizeof p2), 0);
		cr_assert_eq(spaced_field_end(&r), 0);
		for (size_t i = 0; i < n; i++) {
			if (!w[i].seen && w[i].kind == kind && strcmp(w[i].path, p1) == 0 &&
			    strcmp(w[i].path2, p2) == 0) {
				w[i].seen = 1;
				left--;
			}
		}
		spaced_guest_msg_clear(&m);
	}
}

Test(guest, watch_recursive_events)
{
	char p[256], q[256];
	snprintf(p, sizeof p, "%s/w", root);
	cr_assert_eq(mkdir(p, 0755), 0);
	snprintf(p, sizeof p, "%s/w/old", root);
	cr_assert_eq(mkdir(p, 0755), 0);
	struct spaced_guest_client *c = connect_guest();
	struct spaced_buf b;
	spaced_buf_init(&b, 4096);
	spaced_field_put_str(&b, "w");
	uint32_t id = spaced_guest_client_next_id(c);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_WATCH, 0, id, b.data, b.len), 0);
	struct spaced_guest_msg m = {0};
	cr_assert_eq(spaced_guest_recv(c, &m), 0);
	cr_assert_eq(m.hdr.type, SPACED_GUEST_OUT_STARTED);
	spaced_guest_msg_clear(&m);

	snprintf(p, sizeof p, "%s/w/a.txt", root);
	put_file(p, "x");
	struct want_ev w1[] = {
		{SPACED_GUEST_EV_CREATE, "a.txt", "", 0},
		{SPACED_GUEST_EV_MODIFY, "a.txt", "", 0},
	};
	expect_events(c, id, w1, 2);

	/* a file in a new subdirectory, and in a directory that existed before */
	snprintf(p, sizeof p, "%s/w/sub", root);
	cr_assert_eq(mkdir(p, 0755), 0);
	snprintf(p, sizeof p, "%s/w/sub/b.txt", root);
	put_file(p, "y");
	snprintf(p, sizeof p, "%s/w/old/c.txt", root);
	put_file(p, "z");
	struct want_ev w2[] = {
		{SPACED_GUEST_EV_CREATE, "sub", "", 0},
		{SPACED_GUEST_EV_CREATE, "sub/b.txt", "", 0},
		{SPACED_GUEST_EV_CREATE, "old/c.txt", "", 0},
	};
	expect_events(c, id, w2, 3);

	/* a file in a directory created after the previous round */
	snprintf(p, sizeof p, "%s/w/sub/deeper/x", root);
	mkdir_p(p);
	struct want_ev w3a[] = {{SPACED_GUEST_EV_CREATE, "sub/deeper/x", "", 0}};
	expect_events(c, id, w3a, 1);
	snprintf(p, sizeof p, "%s/w/sub/deeper/x/f", root);
	put_file(p, "1");
	put_file(p, "12");
	struct want_ev w3[] = {
		{SPACED_GUEST_EV_CREATE, "sub/deeper/x/f", "", 0},
		{SPACED_GUEST_EV_MODIFY, "sub/deeper/x/f", "", 0},
	};
	expect_events(c, id, w3, 2);

	snprintf(p, sizeof p, "%s/w/a.txt", root);
	snprintf(q, sizeof q, "%s/w/sub/moved.txt", root);
	cr_assert_eq(rename(p, q), 0);
	snprintf(p, sizeof p, "%s/w/sub", root);
	snprintf(q, sizeof q, "%s/w/renamed", root);
	cr_assert_eq(rename(p, q), 0);
	snprintf(p, sizeof p, "%s/w/renamed/b.txt", root);
	cr_assert_eq(unlink(p), 0);
	struct want_ev w4[] = {
		{SPACED_GUEST_EV_MOVE, "a.txt", "sub/moved.txt", 0},
		{SPACED_GUEST_EV_MOVE, "sub", "renamed", 0},
		{SPACED_GUEST_EV_DELETE, "renamed/b.txt", "", 0},
	};
	expect_events(c, id, w4, 3);

	/* moves into and out of the watched tree */
	snprintf(p, sizeof p, "%s/w/renamed/moved.txt", root);
	snprintf(q, sizeof q, "%s/gone.txt", root);
	cr_assert_eq(rename(p, q), 0);
	struct want_ev w5[] = {{SPACED_GUEST_EV_MOVE, "renamed/moved.txt", "", 0}};
	expect_events(c, id, w5, 1);

	/* an atomic write through the guest shows as its temp file moved into place */
	struct spaced_guest_client *c2 = connect_guest();
	cr_assert_eq(spaced_guest_fs_write(c2, "w/written.txt", "w", 1, 0, 0), 0);
	spaced_guest_client_free(c2);
	for (bool moved = false; !moved;) {
		cr_assert_eq(spaced_guest_recv(c, &m), 0);
		cr_assert_eq(m.hdr.type, SPACED_GUEST_OUT_EVENT);
		struct spaced_field_reader er;
		uint64_t kind;
		char p1[512], p2[512];
		spaced_field_reader_init(&er, m.payload, m.hdr.len);
		cr_assert_eq(spaced_field_get_u64(&er, &kind), 0);
		cr_assert_eq(spaced_field_get_strbuf(&er, p1, sizeof p1), 0);
		cr_assert_eq(spaced_field_get_strbuf(&er, p2, sizeof p2), 0);
		moved = kind == SPACED_GUEST_EV_MOVE && strcmp(p2, "written.txt") == 0 &&
		        strncmp(p1, ".spaced-tmp-", 12) == 0;
		spaced_guest_msg_clear(&m);
	}

	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_IN_CANCEL, 0, id, NULL, 0), 0);
	for (;;) {
		cr_assert_eq(spaced_guest_recv(c, &m), 0);
		if (m.hdr.type == SPACED_GUEST_OUT_RESULT)
			break;
		spaced_guest_msg_clear(&m);
	}
	struct spaced_field_reader r;
	cr_assert_eq(spaced_guest_result_head(c, &m, &r), 0);
	assert_ident(c);
	spaced_guest_msg_clear(&m);
	spaced_buf_free(&b);
	spaced_guest_client_free(c);
}

/* Several streams at once on one connection: a watch, two execs (one
 * cancelled), a stat and a read; their frames interleave and each ends with
 * its own RESULT carrying the identity. */
Test(guest, concurrent_streams_on_one_connection)
{
	char p[256];
	snprintf(p, sizeof p, "%s/cw", root);
	cr_assert_eq(mkdir(p, 0755), 0);
	snprintf(p, sizeof p, "%s/cw/r.txt", root);
	put_file(p, "read me");
	struct spaced_guest_client *c = connect_guest();
	struct spaced_buf b;
	spaced_buf_init(&b, 4096);
	const uint32_t W = 101, E = 102, S = 103, R = 104, K = 105;

	spaced_field_put_str(&b, "cw");
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_WATCH, 0, W, b.data, b.len), 0);
	struct spaced_guest_msg m = {0};
	cr_assert_eq(spaced_guest_recv(c, &m), 0);
	cr_assert_eq(m.hdr.type, SPACED_GUEST_OUT_STARTED);
	spaced_guest_msg_clear(&m);

	const char *ka[] = {"sleep", "30", NULL};
	struct spaced_guest_exec_req kr = {ka, NULL, NULL, 0, 0};
	b.len = 0;
	cr_assert_eq(spaced_guest_encode_exec(&b, &kr), 0);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_EXEC, 0, K, b.data, b.len), 0);
	const char *ea[] = {"sh", "-c", "echo hi > cw/new.txt; echo done", NULL};
	struct spaced_guest_exec_req er = {ea, NULL, NULL, 0, 0};
	b.len = 0;
	cr_assert_eq(spaced_guest_encode_exec(&b, &er), 0);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_EXEC, 0, E, b.data, b.len), 0);
	b.len = 0;
	spaced_field_put_str(&b, "cw/r.txt");
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_FS_STAT, 0, S, b.data, b.len), 0);
	spaced_field_put_u64(&b, 5);
	spaced_field_put_u64(&b, 2);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_FS_READ, 0, R, b.data, b.len), 0);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_IN_CANCEL, 0, K, NULL, 0), 0);

	int results = 0, created = 0, done_out = 0, read_ok = 0;
	while (results < 4 || !created) {
		cr_assert_eq(spaced_guest_recv(c, &m), 0);
		struct spaced_field_reader r;
		if (m.hdr.type == SPACED_GUEST_OUT_RESULT) {
			cr_assert_eq(spaced_guest_result_head(c, &m, &r), 0, "id %u", m.hdr.id);
			assert_ident(c);
			cr_assert(m.hdr.id == E || m.hdr.id == S || m.hdr.id == R || m.hdr.id == K);
			if (m.hdr.id == K) {
				struct spaced_guest_exit x;
				cr_assert_eq(spaced_guest_exit_parse(&r, &x), 0);
				cr_assert_eq(x.signal, SIGKILL, "cancel kills");
			}
			results++;
		} else if (m.hdr.type == SPACED_GUEST_OUT_EVENT) {
			cr_assert_eq(m.hdr.id, W);
			uint64_t kind;
			char path[256];
			spaced_field_reader_init(&r, m.payload, m.hdr.len);
			cr_assert_eq(spaced_field_get_u64(&r, &kind), 0);
			cr_assert_eq(spaced_field_get_strbuf(&r, path, sizeof path), 0);
			if (kind == SPACED_GUEST_EV_CREATE && strcmp(path, "new.txt") == 0)
				created = 1;
		} else if (m.hdr.type == SPACED_GUEST_OUT_STDOUT) {
			cr_assert_eq(m.hdr.id, E);
			done_out = m.hdr.len == 5 && memcmp(m.payload, "done\n", 5) == 0;
		} else if (m.hdr.type == SPACED_GUEST_OUT_DATA) {
			cr_assert_eq(m.hdr.id, R);
			read_ok = m.hdr.len == 2 && memcmp(m.payload, "me", 2) == 0;
		} else {
			cr_assert_eq(m.hdr.type, SPACED_GUEST_OUT_STARTED);
		}
		spaced_guest_msg_clear(&m);
	}
	cr_assert(done_out && read_ok);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_IN_CANCEL, 0, W, NULL, 0), 0);
	for (;;) {
		cr_assert_eq(spaced_guest_recv(c, &m), 0);
		int end = m.hdr.type == SPACED_GUEST_OUT_RESULT;
		if (end)
			cr_assert_eq(m.hdr.id, W);
		spaced_guest_msg_clear(&m);
		if (end)
			break;
	}
	spaced_buf_free(&b);
	spaced_guest_client_free(c);
}

/* A peer that asks for a large file and never reads does not hold up the
 * guest: other connections are served while its answer is held back. */
Test(guest, stalled_reader_does_not_block_others)
{
	char p[256];
	snprintf(p, sizeof p, "%s/big", root);
	FILE *f = fopen(p, "w");
	cr_assert_not_null(f);
	static char chunk[65536];
	memset(chunk, 'x', sizeof chunk);
	for (int i = 0; i < 128; i++)
		fwrite(chunk, 1, sizeof chunk, f);
	fclose(f);
	struct spaced_guest_client *stalled = connect_guest();
	struct spaced_buf b;
	spaced_buf_init(&b, 4096);
	spaced_field_put_str(&b, "big");
	spaced_field_put_u64(&b, 0);
	spaced_field_put_u64(&b, UINT64_MAX);
	cr_assert_eq(spaced_guest_send(stalled, SPACED_GUEST_FS_READ, 0, 1, b.data, b.len), 0);
	struct spaced_guest_client *c = connect_guest();
	struct spaced_identity id;
	for (int i = 0; i < 50; i++)
		cr_assert_eq(spaced_guest_hello(c, &id), 0);
	struct spaced_buf out;
	spaced_buf_init(&out, 1 << 20);
	const char *a[] = {"echo", "alive", NULL};
	struct spaced_guest_exit x = run(c, a, NULL, NULL, 0, NULL, &out, NULL);
	cr_assert_eq(x.code, 0);
	cr_assert_str_eq((char *)out.data, "alive\n");
	spaced_buf_free(&out);
	spaced_buf_free(&b);
	spaced_guest_client_free(c);
	spaced_guest_client_free(stalled);
}

/* A write that is cancelled (or whose connection drops) leaves the old
 * content and no temp file. */
Test(guest, cancelled_write_leaves_old_content)
{
	char p[256];
	snprintf(p, sizeof p, "%s/keep.txt", root);
	put_file(p, "old");
	struct spaced_guest_client *c = connect_guest();
	struct spaced_buf b;
	spaced_buf_init(&b, 4096);
	spaced_field_put_str(&b, "keep.txt");
	spaced_field_put_u64(&b, 0644);
	spaced_field_put_u64(&b, 0);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_FS_WRITE, 0, 9, b.data, b.len), 0);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_IN_DATA, 0, 9, "new content", 11), 0);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_IN_CANCEL, 0, 9, NULL, 0), 0);
	struct spaced_guest_msg m = {0};
	struct spaced_field_reader r;
	cr_assert_eq(spaced_guest_recv(c, &m), 0);
	cr_assert_eq(m.hdr.id, 9);
	cr_assert_eq(spaced_guest_result_head(c, &m, &r), SPACED_ECLOSED);
	spaced_guest_msg_clear(&m);
	cr_assert_str_eq(slurp(p), "old");
	struct spaced_buf l;
	spaced_buf_init(&l, 4096);
	cr_assert_eq(spaced_guest_fs_list(c, "", 1, count_entries, &l), 0);
	cr_assert(strstr((char *)l.data, ".spaced-tmp") == NULL, "temp file left: %s", l.data);
	spaced_buf_free(&l);
	spaced_buf_free(&b);
	spaced_guest_client_free(c);
}

/* ---- large uploads: the direct-write path (spaced-guest/fs.c) ----
 * An upload's first 8 MiB go through the page cache, the rest through two
 * aligned 2 MiB staging buffers with O_DIRECT (a writer thread), the tail
 * through the cache again. These tests run in a mount namespace of their own
 * (the file systems they mount vanish with it). */

static void start_guest_private(void)
{
	cr_assert_eq(unshare(CLONE_NEWNS), 0, "unshare: %s", strerror(errno));
	cr_assert_eq(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), 0);
	start_guest();
}

TestSuite(guest_upload, .init = start_guest_private, .fini = stop_guest, .timeout = 120);

/* Sends an upload of data[0..n) to path in frames of frame bytes, cancelled
 * after cancel_after bytes when that is below n; returns the result's status. */
static int upload(struct spaced_guest_client *c, uint32_t id, const char *path, const uint8_t *data, size_t n,
                  size_t frame, size_t cancel_after)
{
	struct spaced_buf b;
	spaced_buf_init(&b, 4096);
	spaced_field_put_str(&b, path);
	spaced_field_put_u64(&b, 0644);
	spaced_field_put_u64(&b, 0);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_FS_WRITE, 0, id, b.data, b.len), 0);
	spaced_buf_free(&b);
	size_t off = 0;
	do {
		size_t k = n - off < frame ? n - off : frame;
		if (off + k > cancel_after)
			k = cancel_after - off;
		bool last = off + k == n;
		cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_IN_DATA, last ? SPACED_FRAME_F_END : 0, id, data + off, k), 0);
		off += k;
	} while (off < n && off < cancel_after);
	if (off < n)
		cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_IN_CANCEL, 0, id, NULL, 0), 0);
	struct spaced_guest_msg m = {0};
	struct spaced_field_reader r;
	cr_assert_eq(spaced_guest_recv(c, &m), 0);
	cr_assert_eq(m.hdr.id, id);
	int st = spaced_guest_result_head(c, &m, &r);
	spaced_guest_msg_clear(&m);
	return st;
}

static void assert_file_is(const char *path, const uint8_t *data, size_t n)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
	uint8_t *got = malloc(n + 1);
	cr_assert_not_null(got);
	size_t have = 0;
	ssize_t k;
	while ((k = read(fd, got + have, n + 1 - have)) > 0)
		have += (size_t)k;
	close(fd);
	cr_assert_eq(have, n, "%s: %zu bytes, not %zu", path, have, n);
	cr_assert(memcmp(got, data, n) == 0, "%s: content differs", path);
	free(got);
}

static void assert_no_temp(const char *d)
{
	DIR *dd = opendir(d);
	cr_assert_not_null(dd, "%s", d);
	struct dirent *de;
	while ((de = readdir(dd)) != NULL)
		cr_assert(strncmp(de->d_name, ".spaced-tmp", 11) != 0, "temp file left in %s: %s", d, de->d_name);
	closedir(dd);
}

static uint8_t *random_bytes(size_t n)
{
	uint8_t *d = malloc(n);
	cr_assert_not_null(d);
	randombytes_buf(d, n);
	return d;
}

/* Mounts a file system of type at ROOT/name (in the test's own mount
 * namespace); false when this machine cannot. */
static bool mount_in_root(const char *name, const char *type, const char *opts, char *mnt, size_t mntsz)
{
	snprintf(mnt, mntsz, "%s/%s", root, name);
	mkdir_p(mnt);
	return mount(type, mnt, type, 0, opts) == 0;
}

/* Every size around the switch (8 MiB) and the staging chunk (2 MiB, 4 KiB
 * alignment), in frames that are not multiples of the alignment and in the
 * largest frames: each file byte-exact, no temp file left. */
Test(guest_upload, sizes_around_the_direct_switch_are_exact)
{
	const size_t M = 1u << 20, sizes[] = {8 * M - 1, 8 * M, 8 * M + 1, 10 * M, 10 * M + 4095, 12 * M + 4096,
	                                       16 * M + 4097, 23 * M + 5};
	const size_t frames[] = {100003, SPACED_FRAME_MAX};
	uint8_t *data = random_bytes(23 * M + 5);
	struct spaced_guest_client *c = connect_guest();
	char p[256];
	uint32_t id = 100;
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
		for (size_t f = 0; f < 2; f++) {
			data[0] = (uint8_t)(i * 2 + f); /* each upload differs from the last */
			cr_assert_eq(upload(c, id++, "up.bin", data, sizes[i], frames[f], SIZE_MAX), 0, "%zu bytes", sizes[i]);
			snprintf(p, sizeof p, "%s/up.bin", root);
			assert_file_is(p, data, sizes[i]);
		}
	assert_no_temp(root);
	free(data);
	spaced_guest_client_free(c);
}

/* A file system that refuses O_DIRECT (ramfs) keeps the upload buffered,
 * byte-exact. */
Test(guest_upload, a_file_system_without_o_direct_is_written_through_the_cache)
{
	char mnt[256], p[300];
	if (!mount_in_root("ram", "ramfs", NULL, mnt, sizeof mnt))
		cr_skip_test("cannot mount ramfs here: %s", strerror(errno));
	int probe = open(mnt, O_RDONLY | O_DIRECTORY);
	cr_assert_geq(probe, 0);
	int t = openat(probe, "probe", O_WRONLY | O_CREAT | O_DIRECT, 0600);
	cr_assert(t < 0 && errno == EINVAL, "ramfs took O_DIRECT: the test does not test the refusal");
	close(probe);
	const size_t n = (13u << 20) + 77;
	uint8_t *data = random_bytes(n);
	struct spaced_guest_client *c = connect_guest();
	cr_assert_eq(upload(c, 7, "ram/up.bin", data, n, 100003, SIZE_MAX), 0);
	snprintf(p, sizeof p, "%s/up.bin", mnt);
	assert_file_is(p, data, n);
	assert_no_temp(mnt);
	free(data);
	spaced_guest_client_free(c);
}

/* An upload that fills its file system while its direct writes are in
 * flight fails with a clear error; the file it replaces keeps its content,
 * no temp file is left, and the guest goes on serving. */
Test(guest_upload, an_upload_that_fills_the_disk_fails_and_loses_nothing)
{
	char mnt[256], p[300];
	cr_assert(mount_in_root("small", "tmpfs", "size=12m", mnt, sizeof mnt), "%s", strerror(errno));
	snprintf(p, sizeof p, "%s/keep.bin", mnt);
	put_file(p, "old");
	const size_t n = 20u << 20;
	uint8_t *data = random_bytes(n);
	struct spaced_guest_client *c = connect_guest();
	int st = upload(c, 8, "small/keep.bin", data, n, SPACED_FRAME_CHUNK, SIZE_MAX);
	cr_assert_eq(st, SPACED_EIO, "status %d", st);
	cr_assert_str_eq(slurp(p), "old");
	assert_no_temp(mnt);
	/* and the guest serves: the same upload fits on the root */
	cr_assert_eq(upload(c, 9, "fits.bin", data, n, SPACED_FRAME_CHUNK, SIZE_MAX), 0);
	snprintf(p, sizeof p, "%s/fits.bin", root);
	assert_file_is(p, data, n);
	free(data);
	spaced_guest_client_free(c);
}

/* Cancelled while its direct writes are in flight, or its connection cut:
 * the old content stays, no temp file is left, the guest serves. */
Test(guest_upload, an_upload_cut_in_its_direct_phase_leaves_the_old_content)
{
	char p[256];
	snprintf(p, sizeof p, "%s/keep.bin", root);
	put_file(p, "old");
	const size_t n = 24u << 20;
	uint8_t *data = random_bytes(n);
	struct spaced_guest_client *c = connect_guest();
	cr_assert_eq(upload(c, 10, "keep.bin", data, n, 100003, (14u << 20) + 3), SPACED_ECLOSED);
	cr_assert_str_eq(slurp(p), "old");
	assert_no_temp(root);
	/* the connection closed half-way through another one */
	struct spaced_guest_client *c2 = connect_guest();
	struct spaced_buf b;
	spaced_buf_init(&b, 4096);
	spaced_field_put_str(&b, "keep.bin");
	spaced_field_put_u64(&b, 0644);
	spaced_field_put_u64(&b, 0);
	cr_assert_eq(spaced_guest_send(c2, SPACED_GUEST_FS_WRITE, 0, 11, b.data, b.len), 0);
	spaced_buf_free(&b);
	for (size_t off = 0; off < (14u << 20); off += SPACED_FRAME_CHUNK)
		cr_assert_eq(spaced_guest_send(c2, SPACED_GUEST_IN_DATA, 0, 11, data + off, SPACED_FRAME_CHUNK), 0);
	spaced_guest_client_free(c2);
	/* the guest notices the close when it has read what came before it */
	struct spaced_identity id;
	bool clean = false;
	for (int i = 0; i < 100 && !clean; i++) {
		cr_assert_eq(spaced_guest_hello(c, &id), 0, "the guest serves");
		DIR *dd = opendir(root);
		struct dirent *de;
		clean = true;
		while (dd && (de = readdir(dd)) != NULL)
			clean = clean && strncmp(de->d_name, ".spaced-tmp", 11) != 0;
		if (dd)
			closedir(dd);
		if (!clean)
			usleep(50 * 1000);
	}
	cr_assert(clean, "the cut upload's temp file stayed");
	cr_assert_str_eq(slurp(p), "old");
	free(data);
	spaced_guest_client_free(c);
}

/* Many requests in one write (more than the guest handles per wakeup, and
 * frames split across its input buffer): every one is answered, in order. */
Test(guest, pipelined_requests)
{
	struct spaced_guest_client *c = connect_guest();
	struct spaced_buf b, body;
	spaced_buf_init(&b, 1 << 20);
	spaced_buf_init(&body, 4096);
	for (uint32_t i = 1; i <= 300; i++) {
		if (i % 3 == 0) {
			body.len = 0;
			spaced_field_put_str(&body, "nope/x");
			cr_assert_eq(spaced_frame_append(&b, SPACED_GUEST_FS_STAT, 0, i, body.data, body.len), 0);
		} else {
			cr_assert_eq(spaced_frame_append(&b, SPACED_GUEST_HELLO, 0, i, NULL, 0), 0);
		}
	}
	cr_assert_eq(write(spaced_guest_client_fd(c), b.data, b.len), (ssize_t)b.len);
	for (uint32_t i = 1; i <= 300; i++) {
		struct spaced_guest_msg m = {0};
		struct spaced_field_reader r;
		cr_assert_eq(spaced_guest_recv(c, &m), 0);
		cr_assert_eq(m.hdr.id, i);
		int st = spaced_guest_result_head(c, &m, &r);
		cr_assert_eq(st, i % 3 == 0 ? SPACED_ENOENT : 0, "id %u", i);
		assert_ident(c);
		spaced_guest_msg_clear(&m);
	}
	spaced_buf_free(&body);
	spaced_buf_free(&b);
	spaced_guest_client_free(c);
}

/* A peer that half-closes after its requests still gets every answer:
 * running requests finish, streams that wait for input end, then the guest
 * closes. */
Test(guest, half_close_gets_answers)
{
	struct spaced_guest_client *c = connect_guest();
	const char *a[] = {"sh", "-c", "read x; echo \"late-$x\"", NULL};
	struct spaced_guest_exec_req req = {a, NULL, NULL, 0, SPACED_GUEST_EXEC_STDIN};
	struct spaced_buf b;
	spaced_buf_init(&b, 4096);
	cr_assert_eq(spaced_guest_encode_exec(&b, &req), 0);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_EXEC, 0, 1, b.data, b.len), 0);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_IN_STDIN, 0, 1, "v\n", 2), 0);
	b.len = 0;
	spaced_field_put_str(&b, "half.txt");
	spaced_field_put_u64(&b, 0);
	spaced_field_put_u64(&b, 0);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_FS_WRITE, 0, 2, b.data, b.len), 0);
	cr_assert_eq(spaced_guest_send(c, SPACED_GUEST_IN_DATA, 0, 2, "partial", 7), 0);
	cr_assert_eq(shutdown(spaced_guest_client_fd(c), SHUT_WR), 0);
	int got_exec = 0, got_write = 0, out_ok = 0;
	for (;;) {
		struct spaced_guest_msg m = {0};
		int e = spaced_guest_recv(c, &m);
		if (e == SPACED_ECLOSED)
			break;
		cr_assert_eq(e, 0);
		if (m.hdr.type == SPACED_GUEST_OUT_STDOUT)
			out_ok = m.hdr.len == 7 && memcmp(m.payload, "late-v\n", 7) == 0;
		if (m.hdr.type == SPACED_GUEST_OUT_RESULT) {
			struct spaced_field_reader r;
			int st = spaced_guest_result_head(c, &m, &r);
			if (m.hdr.id == 1) {
				struct spaced_guest_exit x;
				cr_assert_eq(st, 0);
				cr_assert_eq(spaced_guest_exit_parse(&r, &x), 0);
				cr_assert_eq(x.code, 0);
				got_exec = 1;
			} else {
				cr_assert_eq(m.hdr.id, 2);
				cr_assert_eq(st, SPACED_ECLOSED, "an unfinished write is not committed");
				got_write = 1;
			}
		}
		spaced_guest_msg_clear(&m);
	}
	cr_assert(got_exec && got_write && out_ok);
	char p[256];
	snprintf(p, sizeof p, "%s/half.txt", root);
	cr_assert_eq(access(p, F_OK), -1);
	spaced_buf_free(&b);
	spaced_guest_client_free(c);
}

/* A raw socket for malformed input. */
static int raw_conn(void)
{
	struct spaced_guest_client *c = connect_guest();
	int fd = dup(spaced_guest_client_fd(c));
	spaced_guest_client_free(c);
	return fd;
}

/* The guest closes the connection: read sees EOF (no answer at all). */
static void assert_dropped(int fd)
{
	char buf[256];
	ssize_t n;
	while ((n = read(fd, buf, sizeof buf)) > 0)
		;
	cr_assert_eq(n, 0, "connection not closed");
	close(fd);
}

static void raw_header(int fd, uint32_t len, uint16_t type, uint16_t flags, uint32_t id)
{
	uint8_t h[SPACED_FRAME_HDR_LEN];
	struct spaced_frame_hdr hd = {len, type, flags, id};
	spaced_frame_hdr_encode(h, &hd);
	cr_assert_eq(write(fd, h, sizeof h), (ssize_t)sizeof h);
}

Test(guest, malformed_frames_drop_only_that_connection)
{
	struct spaced_guest_client *good = connect_guest();

	int fd = raw_conn(); /* oversized length: dropped before any allocation */
	raw_header(fd, SPACED_FRAME_MAX + 1, SPACED_GUEST_HELLO, 0, 1);
	assert_dropped(fd);

	fd = raw_conn(); /* unknown type */
	raw_header(fd, 0, 0x7777, 0, 1);
	assert_dropped(fd);

	fd = raw_conn(); /* unknown flag bit */
	raw_header(fd, 0, SPACED_GUEST_HELLO, 0x8000, 1);
	assert_dropped(fd);

	fd = raw_conn(); /* truncated payload, then end of stream */
	raw_header(fd, 100, SPACED_GUEST_FS_STAT, 0, 1);
	cr_assert_eq(write(fd, "s\x05\0\0\0ab", 7), 7);
	shutdown(fd, SHUT_WR);
	assert_dropped(fd);

	fd = raw_conn(); /* trailing bytes after the fields of a request */
	struct spaced_buf b;
	spaced_buf_init(&b, 1024);
	spaced_field_put_str(&b, "x");
	spaced_field_put_u64(&b, 5);
	raw_header(fd, (uint32_t)b.len, SPACED_GUEST_FS_STAT, 0, 1);
	cr_assert_eq(write(fd, b.data, b.len), (ssize_t)b.len);
	assert_dropped(fd);

	fd = raw_conn(); /* a field of the wrong kind */
	b.len = 0;
	spaced_field_put_u64(&b, 5);
	raw_header(fd, (uint32_t)b.len, SPACED_GUEST_FS_STAT, 0, 1);
	cr_assert_eq(write(fd, b.data, b.len), (ssize_t)b.len);
	assert_dropped(fd);

	fd = raw_conn(); /* a string length pointing past the payload */
	raw_header(fd, 6, SPACED_GUEST_FS_STAT, 0, 1);
	cr_assert_eq(write(fd, "s\xff\xff\0\0a", 6), 6);
	assert_dropped(fd);

	fd = raw_conn(); /* an id that is still open */
	b.len = 0;
	spaced_field_put_str(&b, "");
	raw_header(fd, (uint32_t)b.len, SPACED_GUEST_WATCH, 0, 5);
	cr_assert_eq(write(fd, b.data, b.len), (ssize_t)b.len);
	raw_header(fd, 0, SPACED_GUEST_HELLO, 0, 5);
	assert_dropped(fd);

	fd = raw_conn(); /* HELLO with a payload */
	raw_header(fd, 1, SPACED_GUEST_HELLO, 0, 1);
	cr_assert_eq(write(fd, "x", 1), 1);
	assert_dropped(fd);

	fd = raw_conn(); /* id 0 */
	raw_header(fd, 0, SPACED_GUEST_HELLO, 0, 0);
	assert_dropped(fd);

	/* the guest and the other connection are unaffected */
	struct spaced_identity id;
	cr_assert_eq(spaced_guest_hello(good, &id), 0);
	assert_ident(good);
	struct spaced_guest_client *fresh = connect_guest();
	cr_assert_eq(spaced_guest_hello(fresh, &id), 0);
	cr_assert_eq(waitpid(guest_pid, NULL, WNOHANG), 0, "guest died");
	spaced_buf_free(&b);
	spaced_guest_client_free(fresh);
	spaced_guest_client_free(good);
}

/* ---- control-fd mode (the launcher's interface) ---- */

struct child_args {
	int fd;
	const char *identity;
};

static int control_child(void *arg)
{
	struct child_args *ca = arg;
	int fd = ca->fd;
	const char *identity = ca->identity;
	{
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(fd, 3);
		if (identity)
			execl(SPACED_GUEST_BIN, "spaced-guest", "--root", root, "--control-fd", "3",
			      "--identity", identity, (char *)NULL);
		else
			execl(SPACED_GUEST_BIN, "spaced-guest", "--root", root, "--control-fd", "3",
			      (char *)NULL);
		_exit(127);
	}
}

static bool ctl_service_ports;

/* Starts the guest as PID 1 of a new PID namespace (clone, so the test
 * process itself stays in its own namespace). */
static pid_t start_control_pid1(int *ctl, const char *identity)
{
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	static char stack[256 * 1024] __attribute__((aligned(16)));
	struct child_args ca = {sv[1], identity};
	pid_t pid = clone(control_child, stack + sizeof stack, CLONE_NEWPID | SIGCHLD, &ca);
	if (pid < 0)
		return -1;
	close(sv[1]);
	*ctl = sv[0];
	return pid;
}

static pid_t start_control(int *ctl, const char *identity)
{
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(sv[1], 3);
		if (identity && ctl_service_ports)
			execl(SPACED_GUEST_BIN, "spaced-guest", "--root", root, "--control-fd", "3",
			      "--identity", identity, "--service-ports", (char *)NULL);
		if (identity)
			execl(SPACED_GUEST_BIN, "spaced-guest", "--root", root, "--control-fd", "3",
			      "--identity", identity, (char *)NULL);
		else
			execl(SPACED_GUEST_BIN, "spaced-guest", "--root", root, "--control-fd", "3",
			      (char *)NULL);
		_exit(127);
	}
	close(sv[1]);
	*ctl = sv[0];
	return pid;
}

static void ctl_send(int ctl, const char *msg, int fd)
{
	struct iovec iov = {(void *)(uintptr_t)msg, strlen(msg)};
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr a;
	} cm;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (fd >= 0) {
		mh.msg_control = cm.b;
		mh.msg_controllen = sizeof cm.b;
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof fd);
	}
	cr_assert_eq(sendmsg(ctl, &mh, 0), (ssize_t)strlen(msg));
}

/* Hands the guest a new connection for port; returns our end. */
static int ctl_conn_port(int ctl, unsigned port)
{
	int sv[2];
	char msg[32];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	snprintf(msg, sizeof msg, "CONN %u", port);
	ctl_send(ctl, msg, sv[1]);
	close(sv[1]);
	return sv[0];
}

static struct spaced_guest_client *ctl_conn(int ctl)
{
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	ctl_send(ctl, "CONN 1024", sv[1]);
	close(sv[1]);
	struct spaced_guest_client *c = NULL;
	cr_assert_eq(spaced_guest_client_adopt(sv[0], &c), 0);
	return c;
}

static void ctl_expect(int ctl, const char *want)
{
	char buf[64];
	ssize_t n = recv(ctl, buf, sizeof buf - 1, 0);
	cr_assert_gt(n, 0);
	buf[n] = 0;
	cr_assert_str_eq(buf, want);
}

Test(guest, control_fd_identity_then_conn)
{
	int ctl;
	pid_t pid = start_control(&ctl, NULL);
	ctl_expect(ctl, "WAITING"); /* up, without identity: a warm pool's execution */
	/* a connection handed over before the identity is refused (not served) */
	struct spaced_guest_client *early = ctl_conn(ctl);
	struct spaced_identity id;
	cr_assert_eq(spaced_guest_hello(early, &id), SPACED_EIDENTITY);
	cr_assert_str_eq(spaced_guest_client_identity(early), "");

	ctl_send(ctl, "IDENTITY " IDENT2, -1);
	ctl_expect(ctl, "READY");
	struct spaced_guest_client *c = ctl_conn(ctl);
	cr_assert_eq(spaced_guest_hello(c, &id), 0);
	cr_assert_str_eq(id.sandbox, "sbx-2");
	cr_assert_eq(id.generation, 3);
	cr_assert_eq(spaced_guest_hello(early, &id), 0, "served once the identity is known");
	cr_assert_eq(spaced_guest_fs_write(c, "via-ctl", "ok", 2, 0, 0), 0);
	cr_assert_str_eq(spaced_guest_client_identity(c), IDENT2);

	/* closing the control socket ends the guest */
	close(ctl);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %x", st);
	spaced_guest_client_free(c);
	spaced_guest_client_free(early);
}

Test(guest, control_fd_second_identity_is_fatal)
{
	int ctl;
	pid_t pid = start_control(&ctl, NULL);
	ctl_expect(ctl, "WAITING");
	ctl_send(ctl, "IDENTITY " IDENT, -1);
	ctl_expect(ctl, "READY");
	ctl_send(ctl, "IDENTITY " IDENT2, -1);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "status %x", st);
	close(ctl);
}

/* S4: the same execution under another activation (its worker activated it
 * again): taken, and every answer carries it from then on. Anything else that
 * differs (the sandbox, the generation, the worker) stays fatal. */
Test(guest, control_fd_activation_change)
{
	int ctl;
	pid_t pid = start_control(&ctl, NULL);
	ctl_expect(ctl, "WAITING");
	ctl_send(ctl, "IDENTITY " IDENT, -1);
	ctl_expect(ctl, "READY");
	ctl_send(ctl, "IDENTITY sandbox=sbx-1;generation=8;worker=w1;substrate=process;activation=act-2;pod_uid=", -1);
	ctl_expect(ctl, "READY");
	struct spaced_guest_client *c = ctl_conn(ctl);
	struct spaced_identity id;
	cr_assert_eq(spaced_guest_hello(c, &id), 0);
	cr_assert_str_eq(id.activation, "act-2");
	cr_assert_eq(id.generation, 8);
	ctl_send(ctl, "IDENTITY sandbox=sbx-1;generation=8;worker=w9;substrate=process;activation=act-3;pod_uid=", -1);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "another worker's identity was taken: %x", st);
	spaced_guest_client_free(c);
	close(ctl);
}

Test(guest, control_fd_identity_flag_means_ready_and_no_identity_message)
{
	int ctl;
	pid_t pid = start_control(&ctl, IDENT);
	ctl_expect(ctl, "READY");
	struct spaced_guest_client *c = ctl_conn(ctl);
	struct spaced_identity id;
	cr_assert_eq(spaced_guest_hello(c, &id), 0);
	assert_ident(c);
	ctl_send(ctl, "IDENTITY " IDENT2, -1); /* already has one: fatal */
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0);
	spaced_guest_client_free(c);
	close(ctl);
}

/* With --service-ports, a connection for another port than the API port is
 * joined to 127.0.0.1:<port> (R5's last hop); port 1024 stays the guest API,
 * and without a service behind the port the connection is closed. */
Test(guest, control_fd_service_port_forwarding)
{
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t sl = sizeof sa;
	cr_assert_eq(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
	cr_assert_eq(listen(lfd, 4), 0);
	cr_assert_eq(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
	unsigned port = ntohs(sa.sin_port);

	int ctl;
	ctl_service_ports = true;
	pid_t pid = start_control(&ctl, IDENT);
	ctl_expect(ctl, "READY");
	int fd = ctl_conn_port(ctl, port);
	int app = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	cr_assert_geq(app, 0);
	cr_assert_eq(write(fd, "ping", 4), 4);
	shutdown(fd, SHUT_WR);
	char buf[16];
	size_t got = 0;
	ssize_t k;
	while ((k = read(app, buf + got, sizeof buf - got)) > 0)
		got += (size_t)k;
	cr_assert(got == 4 && memcmp(buf, "ping", 4) == 0, "the service got the bytes");
	cr_assert_eq(write(app, "pong", 4), 4);
	close(app);
	got = 0;
	while ((k = read(fd, buf + got, sizeof buf - got)) > 0)
		got += (size_t)k;
	cr_assert(got == 4 && memcmp(buf, "pong", 4) == 0, "the caller got the answer and EOF");
	close(fd);

	struct spaced_guest_client *c = ctl_conn(ctl); /* port 1024: the API */
	struct spaced_identity id;
	cr_assert_eq(spaced_guest_hello(c, &id), 0);
	close(lfd);
	fd = ctl_conn_port(ctl, port); /* nobody listens any more */
	cr_assert_eq(read(fd, buf, sizeof buf), 0, "closed");
	close(fd);
	cr_assert_eq(spaced_guest_hello(c, &id), 0, "the guest serves on");
	spaced_guest_client_free(c);
	close(ctl);
	waitpid(pid, NULL, 0);
}

/* Children of host pid `parent` that are zombies, read from /proc. */
static int zombies_of(pid_t parent)
{
	int n = 0;
	DIR *d = opendir("/proc");
	struct dirent *de;
	while (d != NULL && (de = readdir(d)) != NULL) {
		char p[300], buf[512];
		snprintf(p, sizeof p, "/proc/%s/stat", de->d_name);
		FILE *f = fopen(p, "r");
		if (f == NULL)
			continue;
		size_t k = fread(buf, 1, sizeof buf - 1, f);
		fclose(f);
		buf[k] = 0;
		char *rp = strrchr(buf, ')');
		char state;
		int ppid;
		if (rp != NULL && sscanf(rp + 1, " %c %d", &state, &ppid) == 2 && ppid == parent &&
		    state == 'Z')
			n++;
	}
	if (d)
		closedir(d);
	return n;
}

/* As PID 1 of a new PID namespace the guest ignores SIGTERM and reaps
 * orphans that get re-parented to it. */
Test(guest, pid1_reaps_and_survives_sigterm)
{
	int ctl;
	pid_t pid = start_control_pid1(&ctl, IDENT);
	if (pid < 0)
		cr_skip_test("no pid namespace: %s", strerror(errno));
	ctl_expect(ctl, "READY");
	struct spaced_guest_client *c = ctl_conn(ctl);
	struct spaced_buf out;
	spaced_buf_init(&out, 4096);
	const char *b[] = {"sh", "-c", "echo $PPID", NULL};
	struct spaced_guest_exit x = run(c, b, NULL, NULL, 0, NULL, &out, NULL);
	cr_assert_str_eq((char *)out.data, "1\n", "guest is PID 1");

	/* an orphan: cat outlives its shell, is re-parented to PID 1, and exits
	 * when the test closes the FIFO it reads */
	char fifo[256];
	snprintf(fifo, sizeof fifo, "%s/fifo", root);
	cr_assert_eq(mkfifo(fifo, 0600), 0);
	const char *a[] = {"sh", "-c", "cat fifo >/dev/null & echo started", NULL};
	out.len = 0;
	x = run(c, a, NULL, NULL, 0, NULL, &out, NULL);
	cr_assert_eq(x.code, 0);
	int wfd = open(fifo, O_WRONLY); /* returns once cat has opened it */
	cr_assert_geq(wfd, 0);
	close(wfd);

	cr_assert_eq(kill(pid, SIGTERM), 0);
	struct spaced_identity id;
	cr_assert_eq(spaced_guest_hello(c, &id), 0, "survived SIGTERM");
	/* the orphan's exit is reaped: no zombie child of the guest remains */
	int z = -1;
	for (int i = 0; i < 200 && z != 0; i++) {
		z = zombies_of(pid);
		if (z != 0)
			usleep(50 * 1000);
	}
	cr_assert_eq(z, 0, "zombies left under PID 1");
	cr_assert_eq(waitpid(pid, NULL, WNOHANG), 0);
	spaced_buf_free(&out);
	spaced_guest_client_free(c);
	close(ctl);
	waitpid(pid, NULL, 0);
}
