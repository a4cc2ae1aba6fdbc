/*
 * pool.h — the warm pool of a worker (pool.c, docs/node-api.md "Warm pool").
 *
 * The gate keeps pre-started executions (mgr_pool_exec_start: a launcher
 * without identity, its guest up and waiting, its bridge listening) per
 * key — a template and a set of limits — so that a create needs only the
 * claim: the identity sent to the execution and to its bridge. A pooled
 * execution runs under the limits of its key and in a uid range of its own,
 * exactly as one started for its sandbox would, and serves one sandbox at
 * most: the gate takes it out of the pool before its claim (one loop: two
 * creates cannot take the same), and the guest takes an identity once.
 *
 * Size: per key, the largest number of creates seen in any 5 s of the last
 * minute (at least --pool for the worker's default key), within --pool-max
 * per key and a memory budget for all (--pool-memory, counted with what the
 * pooled executions' processes measure: proportional set size). Refilled in
 * the background, a few starts at a time, once creates pause for 250 ms (at
 * once when creates have kept coming for a second without such a pause and
 * a key has less than a quarter of its target ready): a burst's claims do
 * not share the CPU with refills, and the starts run in a CPU cgroup weighed
 * at 1/32 (spaced_sub_background_cpu_join; a started execution's launcher,
 * bridge and gateway then wait, idle and niced, in the executor's, so that a
 * claim moves no process between cgroups); what demand no longer asks for
 * is stopped after a minute.
 */
#ifndef SPACED_NODE_POOL_H
#define SPACED_NODE_POOL_H

#include <stdbool.h>

#include <jansson.h>

struct mgr;
struct mgr_rec;

/* Starts the pool (a no-op without the process substrate): reaps what an
 * earlier gate left in STATE/pool, then fills. */
void pool_start(struct mgr *m);
void pool_stop(struct mgr *m);

/* A create of rec's key (rec->tmpl, rec->res): counted as demand; when a
 * pooled execution of that key is ready it leaves the pool and rec receives
 * its processes, uid range and exec_name, *gateway its ServicePort gateway's
 * port, 0 for none (true). The caller claims it (the executor's "claim" job)
 * or, when the claim fails, starts one cold. */
bool pool_take(struct mgr *m, struct mgr_rec *rec, int *gateway);

/* Stops every ready pooled execution on the template hash (its cached tree
 * changed: they were made on what it was). */
void pool_drain_template(struct mgr *m, const char *hash);

/* {"keys":[…], "hits", "misses", "ready", "starting", "pss_kib"} for status. */
json_t *pool_status(struct mgr *m);

/* The uid ranges pooled executions hold (appended to arr). */
void pool_used_ranges(struct mgr *m, json_t *arr);

#endif
