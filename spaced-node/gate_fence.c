/*
 * gate_fence.c — a worker cut off from its control plane fences itself.
 *
 * The control plane starts a sandbox on another worker only once every
 * worker that may still run an earlier execution of it has confirmed — or
 * has surely fenced itself (docs/control-plane.md, "At most one
 * execution"). The link renews a lease here while it hears from the control
 * plane ({"type":"lease","age_ms":A}: its last ping answered was sent A ms
 * ago); the lease ends --fence-after seconds after that ping. When it ends,
 * the gate fences: it freezes every execution its records say runs, cancels
 * every open stream and answers every request it would allow REFRESH_ROUTE
 * `fenced`, and tells the executions' ServicePort gateways (gate_gw.c), which
 * do the same. The fence holds until the link is back on a channel whose replay
 * is over ({"type":"unfence","through":N}) and every message up to N is
 * applied: a deactivate or destroy of what started elsewhere meanwhile comes
 * first; then the executions whose records still say running are thawed.
 *
 * The lease's end is also kept in STATE/lease (wall-clock seconds), so a
 * gate started again while cut off does not count a new lease from its
 * start: it fences when the old one ends (at once when it has).
 */
#include "gate.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

static bool fence_on(const struct mgr *m)
{
	return m->cfg->fence_after_s > 0;
}

static void lease_path(const struct mgr *m, char *p, size_t n)
{
	snprintf(p, n, "%s/lease", m->cfg->state_dir);
}

/* The lease's end in wall-clock seconds, kept for a gate started again
 * (written when it moves by a second or more; not synced: after a crash of
 * the host nothing of the executions runs either). */
static void lease_write(struct mgr *m, int64_t until)
{
	char p[4096], text[32];
	if (until == m->fence.written)
		return;
	lease_path(m, p, sizeof p);
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return;
	int n = snprintf(text, sizeof text, "%lld\n", (long long)until);
	if (write(fd, text, (size_t)n) == n)
		m->fence.written = until;
	close(fd);
}

void gate_fence_init(struct mgr *m)
{
	m->fence.unfence_through = -1;
	if (!fence_on(m))
		return;
	char p[4096];
	long long until = 0;
	lease_path(m, p, sizeof p);
	FILE *f = fopen(p, "re");
	uint64_t now = spaced_mono_ns();
	if (f != NULL && fscanf(f, "%lld", &until) == 1) {
		/* the lease a gate before this one held */
		int64_t left = (int64_t)until - spaced_now();
		m->fence.deadline_ns = left > 0 ? now + (uint64_t)left * 1000000000ull : 1;
		gate_log("level=info event=lease-kept seconds_left=%lld", (long long)(left > 0 ? left : 0));
	} else {
		m->fence.deadline_ns = now + (uint64_t)m->cfg->fence_after_s * 1000000000ull;
	}
	if (f != NULL)
		fclose(f);
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

void gate_fence_tick(struct mgr *m)
{
	if (!fence_on(m))
		return;
	uint64_t now = spaced_mono_ns();
	if (!m->fence.fenced && m->fence.deadline_ns != 0 && now >= m->fence.deadline_ns) {
		m->fence.fenced = true;
		m->fence.since_ns = now;
		m->fence.unfence_through = -1;
		gate_log("level=warn event=fenced reason=\"no word from the control plane for %d s: every execution is "
		         "frozen and every request refused until it is back\"",
		         m->cfg->fence_after_s);
		gate_streams_cancel_all(m, SPACED_REASON_FENCED);
		publish_all(m);
	}
	if (!m->fence.fenced)
		return;
	freeze_running(m); /* and any that started since (an install applied before the fence) */
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
	publish_all(m);
}

json_t *gate_fence_admin(struct mgr *m, json_t *msg, const char **err)
{
	const char *type = json_string_value(json_object_get(msg, "type"));
	if (!fence_on(m)) {
		*err = "this worker has no fence (no --cp, or --fence-after 0)";
		return NULL;
	}
	if (strcmp(type, "lease") == 0) {
		json_t *a = json_object_get(msg, "age_ms");
		if (!json_is_integer(a) || json_integer_value(a) < 0) {
			*err = "lease wants age_ms, a count of milliseconds";
			return NULL;
		}
		uint64_t now = spaced_mono_ns(), age = (uint64_t)json_integer_value(a) * 1000000u,
		         span = (uint64_t)m->cfg->fence_after_s * 1000000000ull;
		if (age < span && now - age + span > m->fence.deadline_ns) {
			m->fence.deadline_ns = now - age + span;
			lease_write(m, spaced_now() + (int64_t)((m->fence.deadline_ns - now) / 1000000000ull));
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
	                 (json_int_t)(m->fence.deadline_ns > spaced_mono_ns()
	                                      ? (m->fence.deadline_ns - spaced_mono_ns()) / 1000000u
	                                      : 0));
}

void gate_fence_stop(struct mgr *m)
{
	frozen_clear(m);
}
