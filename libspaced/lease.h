/*
 * lease.h — the worker's lease as read by the processes that keep its fence
 * while its gate cannot (stopped, restarting, crashed): an execution's
 * launcher (spaced-launch), a microVM's supervisor (spaced-vm) and a
 * ServicePort gateway (spaced-netgtw).
 *
 * The gate (spaced-node gate_fence.c) keeps STATE/lease renewed while the
 * control plane answers: one decimal number, the wall-clock second the lease
 * ends, replaced by rename when it moves by a tenth of the fence's time (or
 * earlier at all): it may say up to that much before the gate's own end. While the gate is fenced, STATE/fenced is beside
 * it. No lease file: the worker runs with no fence (--fence-after 0).
 */
#ifndef SPACED_LEASE_H
#define SPACED_LEASE_H

#include <stdbool.h>
#include <stdint.h>

enum spaced_lease_state {
	SPACED_LEASE_VALID,      /* it has not ended */
	SPACED_LEASE_ENDED,      /* it has */
	SPACED_LEASE_GONE,       /* no lease file */
	SPACED_LEASE_UNREADABLE, /* says nothing (being replaced, or damaged) */
};

/* Reads the lease file at path; *ended_s (may be NULL): how many seconds ago
 * it ended, when ENDED. */
enum spaced_lease_state spaced_lease_read(const char *path, long long *ended_s);

/* The same from the lease file open for reading (read from its start; not
 * closed): for a process that may no longer open it itself. */
enum spaced_lease_state spaced_lease_read_fd(int fd, long long *ended_s);

/* Whether the gate says it is fenced: STATE/fenced beside the lease file. */
bool spaced_lease_gate_fenced(const char *lease_path);

/* An execution's supervisor keeping the fence on its own (zero it, set path). */
struct spaced_lease_watch {
	const char *path; /* the lease file; NULL: no fence, nothing to do */
	bool frozen;      /* the supervisor froze its execution itself, and has not thawed it */
	uint64_t checked_ns;
	long long valid_until; /* the lease's end as the last step read it valid, the gate not
	                        * fenced and nothing frozen here (wall-clock second); else 0 */
};

enum spaced_lease_action { SPACED_LEASE_NOTHING, SPACED_LEASE_FREEZE, SPACED_LEASE_THAW };

/* What the supervisor does now, its execution paused or not (at most once a
 * second; NOTHING between): FREEZE once the lease ended and the execution
 * runs (the caller sets w->frozen when it froze it); THAW when it froze it
 * itself, it is still paused, the lease is valid again or gone (the fence
 * turned off) and the gate is not fenced (a renewal can come in the second
 * between this freeze and the gate's own fence, and the gate, never fenced,
 * would never thaw it). Otherwise the gate thaws it when its fence lifts,
 * once what the control plane sent meanwhile is applied. Once the gate is
 * not fenced and the lease valid, w->frozen is cleared. *ended_s as
 * spaced_lease_read's. A PAUSE or THAW from the gate clears w->frozen: the
 * gate decides again, and the supervisor thaws nothing it did not freeze last. */
enum spaced_lease_action spaced_lease_watch_step(struct spaced_lease_watch *w, bool paused, long long *ended_s);

/* When the next step has something to find (a wall-clock second, for an
 * absolute CLOCK_REALTIME timer: a host that slept, or whose clock was set,
 * still fires it when the lease file says it ended): the second after the
 * lease's end as last read while it was valid, the gate not fenced and
 * nothing frozen here — until then a step finds nothing to do, as the gate
 * renews the file only later; 0: step every second (no lease read valid
 * yet, that second come, ended, unreadable, gone, or an execution frozen
 * here to thaw). */
long long spaced_lease_watch_due(const struct spaced_lease_watch *w);

#endif
