/*
 * helper_spawn.c — child processes started without copying the caller's memory
 * (helper_spawn.h).
 */
#include "helper_spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

/* The child's own stack: what its function and an exec need. */
#define SPAWN_STACK (64u * 1024u)

struct spawn_ctx {
	spaced_spawn_fn fn;
	void *arg;
	sigset_t mask; /* the caller's, restored in the child */
};

static int spawn_child(void *p)
{
	const struct spawn_ctx *c = p;
	for (int sig = 1; sig < _NSIG; sig++) {
		struct sigaction sa;
		if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &sa) < 0)
			continue;
		if (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN)
			continue;
		sa.sa_handler = SIG_DFL;
		sa.sa_flags = 0;
		sigemptyset(&sa.sa_mask);
		sigaction(sig, &sa, NULL);
	}
	sigprocmask(SIG_SETMASK, &c->mask, NULL);
	/* exit_group(2) itself: _exit is marked noreturn, and a sanitizer's
	 * bookkeeping for that does not know this stack */
	syscall(SYS_exit_group, c->fn(c->arg));
	return 127;
}

pid_t spaced_spawn(spaced_spawn_fn fn, void *arg)
{
	char *stack = mmap(NULL, SPAWN_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
	if (stack == MAP_FAILED)
		return -1;
	struct spawn_ctx c = {.fn = fn, .arg = arg};
	sigset_t all;
	sigfillset(&all);
	/* nothing is delivered to the child before it set its handlers back */
	pthread_sigmask(SIG_SETMASK, &all, &c.mask);
	pid_t pid = clone(spawn_child, stack + SPAWN_STACK, CLONE_VM | CLONE_VFORK | SIGCHLD, &c);
	int saved = errno; /* the child's calls set this thread's errno too */
	pthread_sigmask(SIG_SETMASK, &c.mask, NULL);
#if defined(__SANITIZE_ADDRESS__)
	/* the child's frames never returned: their red zones stay marked */
	__asan_unpoison_memory_region(stack, SPAWN_STACK);
#endif
	munmap(stack, SPAWN_STACK);
	errno = saved;
	return pid;
}

int spaced_spawn_exec(const char *const argv[], bool search)
{
	char *args[SPACED_SPAWN_ARGS + 1];
	size_t n = 0;
	while (argv[n] && n < SPACED_SPAWN_ARGS)
		n++;
	memcpy(args, argv, n * sizeof *args);
	args[n] = NULL;
	if (search)
		execvp(args[0], args);
	else
		execv(args[0], args);
	return 127;
}

int spaced_spawn_exec_fresh(const char *const argv[])
{
	syscall(SYS_close_range, 3, ~0u, 0);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	signal(SIGPIPE, SIG_DFL);
	return spaced_spawn_exec(argv, false);
}

struct quiet_ctx {
	const char *const *argv;
	int err_fd; /* the child's stderr when >= 0 */
};

static int quiet_child(void *arg)
{
	const struct quiet_ctx *q = arg;
	int nul = open("/dev/null", O_RDWR);
	if (nul >= 0) {
		dup2(nul, 0);
		dup2(nul, 1);
	}
	if (q->err_fd >= 0)
		dup2(q->err_fd, 2);
	syscall(SYS_close_range, 3, ~0u, 0);
	return spaced_spawn_exec(q->argv, true);
}

pid_t spaced_spawn_quiet(const char *const argv[])
{
	struct quiet_ctx q = {.argv = argv, .err_fd = -1};
	return spaced_spawn(quiet_child, &q);
}

pid_t spaced_spawn_quiet_err(const char *const argv[], int err_fd)
{
	struct quiet_ctx q = {.argv = argv, .err_fd = err_fd};
	return spaced_spawn(quiet_child, &q);
}
