/*
 * test_spawn.c — children started without copying the caller's memory
 * (spawn.h): the child shares the caller's memory and the caller waits for
 * its exec or exit; a handler of the caller's never runs in the child; the
 * child has the caller's signal mask and the caller's mask is unchanged
 * after; spaced_spawn_quiet closes every other descriptor and puts stdout
 * on /dev/null; an exec that fails ends the child with 127.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helper_spawn.h"

static int wait_status(pid_t pid)
{
	int st;
	cr_assert(pid > 0, "spawn failed: %s", strerror(errno));
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	return st;
}

static int set_to_42(void *arg)
{
	*(int *)arg = 42;
	return 3;
}

Test(spawn, shares_memory_until_its_end)
{
	int v = 0;
	pid_t pid = spaced_spawn(set_to_42, &v);
	__asm__ volatile("" ::: "memory"); /* v is read again, not assumed 0 */
	/* the caller resumed only once the child ended: its write is seen */
	cr_assert_eq(v, 42);
	int st = wait_status(pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 3);
}

static volatile sig_atomic_t handled;
static void on_usr1(int sig)
{
	(void)sig;
	handled = 1;
}

static int raise_usr1(void *arg)
{
	(void)arg;
	raise(SIGUSR1);
	return 0;
}

Test(spawn, callers_handler_never_runs_in_the_child)
{
	struct sigaction sa = {.sa_handler = on_usr1};
	sigemptyset(&sa.sa_mask);
	cr_assert_eq(sigaction(SIGUSR1, &sa, NULL), 0);
	handled = 0;
	int st = wait_status(spaced_spawn(raise_usr1, NULL));
	cr_assert_eq(handled, 0, "the caller's handler ran in the child");
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGUSR1, "status 0x%x", (unsigned)st);
	/* the caller's own handler is still there */
	raise(SIGUSR1);
	cr_assert_eq(handled, 1);
}

static int usr2_blocked(void *arg)
{
	(void)arg;
	sigset_t cur;
	sigprocmask(SIG_SETMASK, NULL, &cur);
	return (sigismember(&cur, SIGUSR2) ? 1 : 0) | (sigismember(&cur, SIGTERM) ? 2 : 0);
}

Test(spawn, child_has_the_callers_mask)
{
	sigset_t usr2, cur;
	sigemptyset(&usr2);
	sigaddset(&usr2, SIGUSR2);
	sigprocmask(SIG_BLOCK, &usr2, NULL);
	int st = wait_status(spaced_spawn(usr2_blocked, NULL));
	cr_assert(WIFEXITED(st));
	cr_assert_eq(WEXITSTATUS(st), 1, "the child's mask was not the caller's (%d)", WEXITSTATUS(st));
	sigprocmask(SIG_SETMASK, NULL, &cur);
	cr_assert(sigismember(&cur, SIGUSR2) && !sigismember(&cur, SIGTERM), "the caller's mask changed");
	sigprocmask(SIG_UNBLOCK, &usr2, NULL);
}

Test(spawn, quiet_closes_descriptors_and_silences_stdout)
{
	int fd = open("/dev/null", O_RDONLY); /* not close-on-exec */
	cr_assert(fd >= 3);
	char script[160];
	snprintf(script, sizeof script,
	         "test ! -e /proc/$$/fd/%d && test \"$(readlink /proc/$$/fd/1)\" = /dev/null", fd);
	const char *argv[] = {"sh", "-c", script, NULL};
	int st = wait_status(spaced_spawn_quiet(argv));
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", (unsigned)st);
	close(fd);
}

Test(spawn, failed_exec_is_127)
{
	const char *argv[] = {"/nonexistent/spaced-no-such-program", NULL};
	int st = wait_status(spaced_spawn_quiet(argv));
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 127);
}
