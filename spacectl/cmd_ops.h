/*
 * cmd_ops.h — spacectl's operations on a sandbox through its worker: the
 * request/answer ones (fs, top: cmd_ops.c), the streams (exec, term, watch:
 * cmd_stream.c), and the local development cluster (dev). Each returns the
 * process exit status (cli.h; exec and term pass the command's own status
 * through).
 */
#ifndef SPACECTL_CMD_OPS_H
#define SPACECTL_CMD_OPS_H

#include <jansson.h>

#include "client.h"

/* exec ID [--env K=V]... [--cwd DIR] [--timeout S] [--no-stdin] -- CMD [ARG...] */
int cmd_exec(int argc, char **argv);
/* fs read|write|ls|stat|mkdir|mv|rm ID PATH... */
int cmd_fs(int argc, char **argv);
/* watch ID PATH */
int cmd_watch(int argc, char **argv);
/* term ID [--env K=V]... [--cwd DIR] [-- CMD [ARG...]] (default /bin/sh) */
int cmd_term(int argc, char **argv);
/* top ID [--json]: what the sandbox uses now, beside its limits */
int cmd_top(int argc, char **argv);
/* dev up|down|status */
int cmd_dev(int argc, char **argv);
/* cmd_completion.c: spacectl completion bash */
int cmd_completion(int argc, char **argv);

/* Set by `spacectl -v COMMAND …`: every operation prints serving identities. */
extern int ops_verbose;

/* The options every operation takes (ops_parse fills them). */
struct opargs {
	struct client_opts o;
	json_t *env;       /* --env K=V, as an object (owned: json_decref it) */
	const char *cwd;
	const char *user; /* exec --user: a user of the sandbox (name, uid or uid:gid) */
	long timeout_s;
	int depth;
	int mkdirs;
	int recursive;
	int json;
	int no_stdin;      /* exec --no-stdin: end of input at once */
};

/* The usage text of the operations. */
extern const char ops_usage[];

/* Parses the options before the first operand into *a (environment
 * defaults: SPACED_CP_URL, SPACED_API_KEY, -v). Returns the index of the first
 * operand, or -1 on a bad option (a->env is set either way). */
int ops_parse(int argc, char **argv, struct opargs *a);

/* The operands from argv[first] on, into operands (at most max): options may
 * also follow them (`fs read ID PATH --route F`), and everything after `--` is
 * an operand. Returns their number, or -1 on a bad option or too many. */
int ops_parse_rest(int argc, char **argv, struct opargs *a, int first, char **operands, int max);

#endif
