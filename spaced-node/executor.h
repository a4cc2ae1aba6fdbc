/*
 * executor.h — the executor: the process of sbx-manager that manages
 * executions, so that the gate's event loop never waits on one.
 *
 * The gate (gate_main.c) verifies, compares and forwards on one event loop;
 * everything that can take time — starting, stopping, pausing and
 * snapshotting executions, staging snapshots, measuring usage, and every
 * connection to an execution's bridge (B1–B3: the bridge waits for the
 * guest's HELLO) — is a job it sends here. Each answer comes back as one
 * completion message; nothing on the gate's side ever blocks on a job.
 *
 * Inside the executor, bridge connections are made on its own event loop
 * (non-blocking connect, the bridge's HANDOFF frame awaited with a deadline):
 * the executor is the process every bridge is started to accept as its caller.
 * The other jobs run in a child process each (the blocking code of
 * mgr_exec.c), so one slow execution never delays another's jobs. The
 * executor adopts the processes those children start (a child subreaper) and
 * reaps them.
 *
 * The link is a SOCK_SEQPACKET socketpair: one message per frame (frame.h
 * header + fields), at most EXE_MSG_MAX bytes. The messages (links.c's table
 * holds their direction, bounds, flags and the job states they are allowed
 * in; both ends check every one against it):
 *
 *   EXE_JOB   gate -> executor  id = a job id not in flight;
 *                               s kind, s args (a JSON object)
 *   EXE_DONE  executor -> gate  id = a job in flight; END;
 *                               i status (0 or SPACED_E*), s message,
 *                               s result (a JSON object, "{}" when none);
 *                               a connect job's connection in SCM_RIGHTS
 *
 * Kinds and their arguments / results (JSON):
 *   connect  {"target": path} | {"port": N}       -> {} + the connection
 *   start    {"rec": R, "snapshot": path|null, "used": [uid bases]} -> {"rec": R}
 *   stop     {"rec": R}                            -> {}
 *   pause    {"rec": R, "pause": bool}             -> {}
 *   snapshot {"rec": R, "path": path}              -> {"bytes": N, "hash": hex}
 *   stage    {"sandbox": S, "src": path, "hash": hex|null} -> {"staged": path}
 *   unstage  {"staged": path}                      -> {}
 *   remove   {"sandbox": S}                        -> {}
 *   rebridge {"rec": R}                            -> {"rec": R}
 *   activate {"rec": R, "thaw": bool}              -> {"rec": R} (R under another activation)
 *   usage    {"rec": R}                            -> the usage object (mgr.h)
 *   reap     {}                                    -> {}
 * R is a runtime record (mgr_rec_to_json).
 */
#ifndef SPACED_EXECUTOR_H
#define SPACED_EXECUTOR_H

#include <stdint.h>

#define EXE_JOB 0x0C01
#define EXE_DONE 0x0C02

/* Largest message either way. */
#define EXE_MSG_MAX (64u * 1024u)
/* How long a bridge may take to hand over a verified connection. */
#define EXE_CONNECT_TIMEOUT_MS 5000

struct mgr_config;

/* Runs the executor on link (its end of the socketpair) until the gate goes
 * away. Returns the exit status. */
int executor_run(const struct mgr_config *cfg, int link);

#endif
