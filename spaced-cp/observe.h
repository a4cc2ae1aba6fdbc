/*
 * observe.h — what an operator sees of a control plane replica: its metrics
 * (Prometheus text, on --metrics-listen) and its audit log (STATE/audit.log:
 * every lifecycle change, every key or quota change, every refused key, one
 * JSON object per line, appended).
 */
#ifndef SPACED_CP_OBSERVE_H
#define SPACED_CP_OBSERVE_H

#include <stdbool.h>
#include <stdint.h>

struct cp;
struct cp_req;
struct cp_store;

/* Opens STATE/audit.log for appending (0600). Returns 0 or -1. */
int cp_audit_open(const char *state_dir);

/* After a request thread answered rq in ns: counts it and its time by
 * endpoint and status class, and audits it when it changed something or its
 * key was refused. Any thread. */
void cp_observe_request(const struct cp_req *rq, const char *tenant, uint64_t ns);

/* Writes the summaries of refusals held back past their caller's rate
 * (ratelimit.h) that are due, or every one when all. The reaper's tick, and
 * at exit. */
void cp_observe_flush(bool all);

/* A create or policy update refused for its tenant's rate (--create-rate):
 * counted for spaced_cp_rate_limited_total. Any thread. */
void cp_observe_rate_limited(void);

/* An `spaced-cp admin` command in the audit log: what it did, to whom, its
 * outcome (secrets are never written). */
void cp_audit_admin(const char *command, const char *subject, int ok);

/* The metrics text (free() it): the counters, and what the store holds now
 * (sandboxes by state, workers connected, unacknowledged messages per worker). */
char *cp_metrics_text(struct cp *cp, struct cp_store *st);

#endif
