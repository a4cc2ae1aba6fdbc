/*
 * cmd_ops.h — spacectl's operations on a sandbox through its worker
 * (exec, fs, watch) and the local development cluster (dev). Each returns the
 * process exit status (cli.h; exec passes the command's own status through).
 */
#ifndef SPACECTL_CMD_OPS_H
#define SPACECTL_CMD_OPS_H

/* exec ID [--env K=V]... [--cwd DIR] [--timeout S] -- CMD [ARG...] */
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

/* Set by `spacectl -v COMMAND …`: every operation prints serving identities. */
extern int ops_verbose;

#endif
