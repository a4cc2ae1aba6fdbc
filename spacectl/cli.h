/*
 * cli.h — shared pieces of spacectl: subcommand entry points and helpers.
 * Every command returns the process exit status: 0 success, 1 refused or
 * failed (with a reason on stderr), 2 usage error.
 */
#ifndef SPACECTL_CLI_H
#define SPACECTL_CLI_H

#include <stddef.h>
#include <stdio.h>

int cmd_token(int argc, char **argv);
int cmd_cap(int argc, char **argv);
int cmd_node(int argc, char **argv); /* a worker's admin socket: status, install, deactivate, … */
int cmd_cp(int argc, char **argv);
int cmd_net(int argc, char **argv);          /* net: the egress policy (cmd_net.c) */
int cmd_expose(int argc, char **argv);       /* expose: a ServicePort URL and capability (cmd_expose.c) */
int cmd_port_forward(int argc, char **argv); /* port-forward: a local port through the gateway */
/* One control-plane call (SPACED_CP_URL, SPACED_API_KEY): *answer (a JSON
 * value, owned by the caller) on 2xx, else 1 with the reason printed. */
struct json_t;
int net_cp_call(const char *what, const char *method, const char *path, struct json_t *req, struct json_t **answer); /* workers, create, ls, rm, inspect, route, pause, snapshot, resume, move */
/* The same with more request headers ("Name: value\r\n"..., NULL: none). */
int net_cp_call_headers(const char *what, const char *method, const char *path, struct json_t *req,
                        const char *headers, struct json_t **answer);

/* Prints "spacectl: <what>: <message>" on stderr and returns 1. */
int cli_fail(const char *what, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Writes a name a sandbox chose (a file's path, a watch event's) to f on
 * one line's worth: a backslash as two, a control character (below 0x20,
 * 0x7f) as backslash-n, backslash-t or backslash-xHH, everything else as it is. A name then
 * cannot break the one-entry-per-line output apart, forge an entry or an
 * event, nor send escape sequences to the user's terminal. */
int cli_print_name(FILE *f, const char *name);

/* Prints a usage line on stderr and returns 2. */
int cli_usage(const char *usage);

/* Reads all of standard input (at most max bytes) into a new NUL-terminated
 * buffer. Returns NULL on error or when the input is larger. */
char *cli_read_stdin(size_t max, size_t *len);

#endif
