/*
 * helper_spawn.h — child processes started without copying the caller's memory.
 *
 * fork() copies every mapping and page table of the caller, and the child
 * gives them back at its exec: for a daemon with a few hundred mappings
 * that is most of what starting a short helper (ip, tc, nft, a launcher)
 * costs. spaced_spawn() starts the child with clone(CLONE_VM | CLONE_VFORK),
 * as posix_spawn does, but lets the child run a function of the caller's
 * before it execs — setns(), dup2(), setsid() — which posix_spawn cannot.
 *
 * The child shares the caller's memory until it execs or exits, and the
 * calling thread is suspended until then. Its function therefore obeys the
 * rules of a vfork child: system calls and async-signal-safe functions only
 * (no malloc, no stdio, no locks), no writes to memory other than its own
 * locals and what the caller handed it for that purpose; everything it needs
 * (paths, argument vectors, texts) is prepared by the caller beforehand.
 */
#ifndef SPACED_SPAWN_H
#define SPACED_SPAWN_H

#include <stdbool.h>
#include <sys/types.h>

/* Arguments spaced_spawn_exec passes at most (the rest are dropped). */
#define SPACED_SPAWN_ARGS 63

/* The child's part: runs with the caller's signal mask and every caught
 * signal back at its default (a handler must never run in a child that
 * shares the caller's memory); it ends with execve() or _exit(), and
 * returning n is _exit(n). */
typedef int (*spaced_spawn_fn)(void *arg);

/* Starts fn(arg) in a new child process whose end is reported to the
 * caller by SIGCHLD and waitpid(), as a fork()'s would be. Returns once the
 * child has exec'd or exited: its pid, or -1 with errno set (nothing
 * started). */
pid_t spaced_spawn(spaced_spawn_fn fn, void *arg);

/* For a child's function: executes argv[0] with argv (search: looked up
 * in PATH when it has no '/'); returns 127 when that failed. */
int spaced_spawn_exec(const char *const argv[], bool search);

/* For a child's function: every descriptor above 2 closed, no signal
 * blocked, SIGPIPE at its default, then argv[0] (a path) executed; returns
 * 127 when that failed. */
int spaced_spawn_exec_fresh(const char *const argv[]);

/* The common case: argv[0] executed (looked up in PATH when it has no '/') with argv, stdin and stdout
 * on /dev/null, stderr as the caller's, every other descriptor closed.
 * Returns the pid, or -1 with errno set. */
pid_t spaced_spawn_quiet(const char *const argv[]);

/* spaced_spawn_quiet, with the child's stderr on err_fd. */
pid_t spaced_spawn_quiet_err(const char *const argv[], int err_fd);

#endif
