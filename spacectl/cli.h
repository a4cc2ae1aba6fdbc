/*
 * cli.h — shared pieces of spacectl: subcommand entry points and helpers.
 * Every command returns the process exit status: 0 success, 1 refused or
 * failed (with a reason on stderr), 2 usage error.
 */
#ifndef SPACECTL_CLI_H
#define SPACECTL_CLI_H

#include <stddef.h>

int cmd_token(int argc, char **argv);
int cmd_cap(int argc, char **argv);
int cmd_node(int argc, char **argv); /* a worker's admin socket: status, install, deactivate, … */
int cmd_cp(int argc, char **argv);
int cmd_net(int argc, char **argv); /* net (egress policy), expose, port-forward: cmd_net.c, cmd_expose.c */ /* workers, create, ls, rm, inspect, route, pause, snapshot, resume, move */

/* Prints "spacectl: <what>: <message>" on stderr and returns 1. */
int cli_fail(const char *what, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints a usage line on stderr and returns 2. */
int cli_usage(const char *usage);

/* Reads all of standard input (at most max bytes) into a new NUL-terminated
 * buffer. Returns NULL on error or when the input is larger. */
char *cli_read_stdin(size_t max, size_t *len);

#endif
