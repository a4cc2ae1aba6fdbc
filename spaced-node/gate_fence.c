/*
 * gate_fence.c — a worker cut off from its control plane fences itself.
 *
 * The control plane starts a sandbox on another worker only once every
 * worker that may still run an earlier execution of it has confirmed — or
 * has surely fenced itself (docs/control-plane.md, "At most one
 * execution"). The link renews a lease here while it hears from the control
 * plane ({"type":"lease","since_ns":T}: its last ping answered was sent at T,
 * CLOCK_BOOTTIME); the lease ends --fence-after seconds after that send. While
 * fenced, installs and thaws are refused (gate_ctl.c). When it ends,
 * the gate fences: it freezes every execution its records say runs, cancels
 * every open stream and answers every request it would allow REFRESH_ROUTE
 * `fenced`, and tells the executions' ServicePort gateways (gate_gw.c), which
 * do the same. The fence holds until the link is back on a channel whose replay
 * is over ({"type":"unfence","through":N}) and every message up to N is
 * applied: a deactivate or destroy of what started elsewhere meanwhile comes
 * first; then the executions whose records still say running are thawed.
 *
 * The lease's end is also kept in STATE/lease (wall-clock seconds) and the
 * fence in STATE/fenced, so a gate started again while cut off does not count
 * a new lease from its start: it fences when the old one ends (at once when
 * it has, or when it was fenced). While the gate is not running, each process
 * execution's launcher, each microVM's spaced-vm and each ServicePort gateway
 * read STATE/lease and keep the fence on their own (--lease-file of
 * spaced-launch, spaced-vm and spaced-netgtw; libspaced/lease.h).
 */
#include "gate.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static bool fence_on(const struct mgr *m)
{
	return m->cfg->fence_after_s > 0;
}

/* The fence counts in CLOCK_BOOTTIME, as the link does: a host suspended or
 * a VM paused under the worker does not stop the lease from ending. */
uint64_t gate_fence_clock_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_BOOTTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void state_path(const struct mgr *m, const char *name, char *p, size_t n)
{
	snprintf(p, n, "%s/%s", m->cfg->state_dir, name);
}

/* The lease's end in wall-clock seconds, kept for a gate started again
 * (written by rename; not synced: after a crash of the host nothing of the
 * executions runs either). Written when it moves by a tenth of the fence's
 * time (6 s by default) or more, or earlier at all: the file then says the
 * lease ends up to that much before it does, so whoever keeps the fence from
 * it fences that much early, never late — and every execution's ServicePort
 * gateway, which watches STATE/ for the keys, and every launcher, whose
 * timer is set to the end the file says (lease.h spaced_lease_watch_due),
 * wakes at each renewal written, not every second. */
static void lease_write(struct mgr *m, int64_t until)
{
	char p[4096], tmp[4100], text[32];
	int64_t step = m->cfg->fence_after_s >= 20 ? m->cfg->fence_after_s / 10 : 1;
	if (until == m->fence.written ||
	    (m->fence.written != 0 && until > m->fence.written && until - m->fence.written < step))
		return;
	state_path(m, "lease", p, sizeof p);
	/* written beside, in STATE/run: a gateway watching STATE/ for the keys
	 * wakes for the rename only, not for the file's writing too */
	state_path(m, "run", tmp, sizeof tmp);
	(void)mkdir(tmp, 0700); /* made with the first execution; here too, for a worker with none yet */
	state_path(m, "run/lease.tmp", tmp, sizeof tmp);
	int n = snprintf(text, sizeof text, "%lld\n", (long long)until);
	if (spaced_file_replace(tmp, p, text, (size_t)n, 0600, false) == 0) {
		m->fence.written = until;
		return;
	}
	/* a lease the launchers and gateways cannot read would let them run on
	 * without the gate: this one ends now */
	gate_log("level=error event=lease-unwritable path=%s", p);
	m->fence.deadline_ns = 1;
}

/* STATE/fenced exists while the fence holds: a gate started again keeps it
 * (its executions stay frozen, and it thaws them when the fence lifts). */
static void fenced_mark(struct mgr *m, bool on)
{
	char p[4096];
	state_path(m, "fenced", p, sizeof p);
	if (!on) {
		unlink(p);
		return;
	}
	int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd >= 0)
		close(fd);
}

static void fence_now(struct mgr *m, const char *why);

static bool freeze(struct mgr *m, const struct mgr_rec *rec, bool on);

void gate_fence_init(struct mgr *m)
{
	m->fence.unfence_through = -1;
	char p[4096];
	if (!fence_on(m)) {
		/* no fence (any more): what one left is lifted — its files go, and
		 * the executions a fence froze (their records say running) thaw */
		state_path(m, "fenced", p, sizeof p);
		bool was = access(p, F_OK) == 0;
		unlink(p);
		state_path(m, "lease", p, sizeof p);
		unlink(p);
		for (size_t i = 0; was && i < m->nrecs; i++)
			if (m->recs[i].r.active && strcmp(m->recs[i].state, MGR_ST_RUNNING) == 0 && mgr_exec_alive(&m->recs[i]))
				freeze(m, &m->recs[i], false);
		return;
	}
	long long until = 0;
	char tail = 0;
	uint64_t now = gate_fence_clock_ns();
	state_path(m, "fenced", p, sizeof p);
	bool was_fenced = access(p, F_OK) == 0;
	state_path(m, "lease", p, sizeof p);
	FILE *f = fopen(p, "re");
	int got = f ? fscanf(f, "%lld%c", &until, &tail) : -1;
	if (f != NULL)
		fclose(f);
	if (f == NULL && errno == ENOENT) {
		/* the worker's first start with a fence: a lease from now, kept
		 * (a gate started again before its first renewal gets no more) */
		m->fence.deadline_ns = now + (uint64_t)m->cfg->fence_after_s * 1000000000ull;
		lease_write(m, spaced_now() + m->cfg->fence_after_s);
	} else {
		/* the lease a gate before this one held; unreadable: ended */
		int64_t left = got == 2 && tail == '\n' ? (int64_t)until - spaced_now() : 0;
		m->fence.deadline_ns = left > 0 ? now + (uint64_t)left * 1000000000ull : 1;
		gate_log("level=info event=lease-kept seconds_left=%lld", (long long)(left > 0 ? left : 0));
	}
	/* fenced before the loop runs: nothing is admitted, recovered awake or
	 * unfenced early (an unfence for a fence not yet on would be lost) */
	if (was_fenced || m->fence.deadline_ns <= now)
		fence_now(m, was_fenced ? "it was fenced when the gate stopped" : "its lease ended while the gate was stopped");
}

bool gate_fenced(const struct mgr *m)
{
	return m->fence.fenced;
}

static bool frozen_has(const struct mgr *m, const char *sandbox)
{
	for (size_t i = 0; i < m->fence.nfrozen; i++)
		if (strcmp(m->fence.frozen[i], sandbox) == 0)
			return true;
	return false;
}

static void frozen_clear(struct mgr *m)
{
	for (size_t i = 0; i < m->fence.nfrozen; i++)
		free(m->fence.frozen[i]);
	free(m->fence.frozen);
	m->fence.frozen = NULL;
	m->fence.nfrozen = 0;
}

static void freeze_done(struct mgr *m, uintptr_t ctx, int status, const char *msg, json_t *result, int fd)
{
	(void)m;
	(void)ctx;
	(void)result;
	if (fd >= 0)
		close(fd);
	if (status < 0)
		gate_log("level=warn event=fence-freeze-failed reason=\"%s\"", msg ? msg : "");
}

/* Freezes (or thaws) rec's execution without touching its record. */
static bool freeze(struct mgr *m, const struct mgr_rec *rec, bool on)
{
	json_t *args = json_pack("{s:o,s:b}", "rec", mgr_rec_to_json(rec), "pause", on);
	return args != NULL && gate_job(m, "pause", args, freeze_done, 0) != 0;
}

/* Every execution a record says runs, not yet frozen by the fence, is. */
static void freeze_running(struct mgr *m)
{
	for (size_t i = 0; i < m->nrecs; i++) {
		const struct mgr_rec *r = &m->recs[i];
		if (!r->r.active || strcmp(r->state, MGR_ST_RUNNING) != 0 || !mgr_exec_alive(r) ||
		    frozen_has(m, r->r.id.sandbox))
			continue;
		char **nf = realloc(m->fence.frozen, (m->fence.nfrozen + 1) * sizeof *nf);
		if (nf == NULL)
			return;
		m->fence.frozen = nf;
		if ((nf[m->fence.nfrozen] = strdup(r->r.id.sandbox)) == NULL)
			return;
		m->fence.nfrozen++;
		freeze(m, r, true);
	}
}

/* Every record again to its ServicePort gateway, with the fence's state:
 * a gateway refuses new opens and ends its streams while fenced. */
static void publish_all(struct mgr *m)
{
	for (size_t i = 0; i < m->nrecs; i++)
		if (m->recs[i].r.active)
			gate_gw_publish(m, &m->recs[i]);
}

static void fence_now(struct mgr *m, const char *why)
{
	m->fence.fenced = true;
	m->fence.since_ns = gate_fence_clock_ns();
	m->fence.unfence_through = -1;
	fenced_mark(m, true);
	gate_log("level=warn event=fenced reason=\"%s: every execution is frozen and every request refused until the "
	         "control plane is back\"",
	         why);
	gate_streams_cancel_all(m, SPACED_REASON_FENCED);
	publish_all(m);
	freeze_running(m);
}

/* Fences when the lease has ended and the gate has not fenced yet. */
static void fence_if_ended(struct mgr *m, uint64_t now)
{
	if (!m->fence.fenced && m->fence.deadline_ns != 0 && now >= m->fence.deadline_ns) {
		char why[96];
		snprintf(why, sizeof why, "no word from the control plane for %d s", m->cfg->fence_after_s);
		fence_now(m, why);
	}
}

void gate_fence_tick(struct mgr *m)
{
	if (!fence_on(m))
		return;
	uint64_t now = gate_fence_clock_ns();
	fence_if_ended(m, now);
	if (!m->fence.fenced)
		return;
	freeze_running(m); /* and any a gate started before it fenced finished starting since */
	/* lifted once the link's channel is back and its replay applied, and a
	 * lease renewed since (else it would fence again at once) */
	int64_t through = m->fence.unfence_through;
	uint64_t low = gate_ctl_lowest_pending_seq(m);
	if (through < 0 || mgr_store_last_seq(m->store) < (uint64_t)through || (low != 0 && low <= (uint64_t)through) ||
	    m->fence.deadline_ns <= now)
		return;
	/* back, and what it missed is applied: thaw what still runs */
	size_t thawed = 0;
	for (size_t i = 0; i < m->nrecs; i++) {
		const struct mgr_rec *r = &m->recs[i];
		if (r->r.active && strcmp(r->state, MGR_ST_RUNNING) == 0 && mgr_exec_alive(r) && freeze(m, r, false))
			thawed++;
	}
	gate_log("level=info event=unfenced fenced_s=%.1f thawed=%zu", (double)(now - m->fence.since_ns) / 1e9, thawed);
	frozen_clear(m);
	m->fence.fenced = false;
	m->fence.unfence_through = -1;
	fenced_mark(m, false);
	publish_all(m);
}

json_t *gate_fence_admin(struct mgr *m, json_t *msg, const char **err)
{
	const char *type = json_string_value(json_object_get(msg, "type"));
	if (!fence_on(m)) {
		*err = "this worker has no fence (no --cp, or --fence-after 0)";
		return NULL;
	}
	uint64_t now = gate_fence_clock_ns();
	if (strcmp(type, "lease") == 0) {
		/* since_ns: when the ping the control plane answered was sent, in
		 * this host's CLOCK_BOOTTIME (the link's): the lease ends
		 * fence_after from then, however late this line arrives */
		json_t *a = json_object_get(msg, "since_ns");
		if (!json_is_integer(a) || json_integer_value(a) <= 0 || (uint64_t)json_integer_value(a) > now) {
			*err = "lease wants since_ns, a CLOCK_BOOTTIME time not in the future";
			return NULL;
		}
		uint64_t until = (uint64_t)json_integer_value(a) + (uint64_t)m->cfg->fence_after_s * 1000000000ull;
		/* a renewal that comes once the lease has ended, before the gate's
		 * tick saw it end (the gate was stopped, its loop held up), does
		 * not undo the end: the control plane may have counted this worker
		 * fenced and started its sandboxes elsewhere. The gate fences
		 * first, and lifts the fence as after any, once the replay is
		 * applied (before, such a renewal kept the gate unfenced, and a
		 * launcher that had frozen its execution on its own thawed it at
		 * once, before the stops queued meanwhile had arrived). */
		fence_if_ended(m, now);
		if (until > now && until > m->fence.deadline_ns) {
			m->fence.deadline_ns = until;
			lease_write(m, spaced_now() + (int64_t)((until - now) / 1000000000ull));
		}
	} else { /* unfence */
		json_t *t = json_object_get(msg, "through");
		if (!json_is_integer(t) || json_integer_value(t) < 0) {
			*err = "unfence wants through, the last seq of the replay";
			return NULL;
		}
		if (m->fence.fenced)
			m->fence.unfence_through = json_integer_value(t);
	}
	return json_pack("{s:b,s:I}", "fenced", m->fence.fenced, "lease_left_ms",
	                 (json_int_t)(m->fence.deadline_ns > now ? (m->fence.deadline_ns - now) / 1000000u : 0));
}

void gate_fence_stop(struct mgr *m)
{
	frozen_clear(m);
}
