/*
 * gate_watch.c — the end of a running execution, seen when it happens.
 *
 * The gate holds, in its loop, a pidfd of the launcher of every record that
 * says its execution runs (the guest itself without a substrate). A launcher
 * ends with its execution: its guest gone (the OOM killer may take it once a
 * command lowered its own score), or itself killed. When that happens while
 * the record still names that launcher, the execution died under it:
 * gate_ctl_ended makes the record a tombstone in state "ended", ends its
 * bridge and tells the control plane. Nothing is started under the same
 * record: a new incarnation is a new generation, which only the control
 * plane assigns (I2).
 */
#include "gate.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pidref.h"

struct exec_watch {
	struct exec_watch *next;
	struct mgr *m;
	char sandbox[SPACED_NAME_MAX];
	int64_t pid;
	uint64_t start;
	int pidfd;
	uv_poll_t poll;
};

static struct exec_watch *watches;

static bool watched(const struct mgr_rec *r)
{
	return r->pid > 0 && gate_rec_serving(r);
}

static void on_closed(uv_handle_t *h)
{
	struct exec_watch *w = h->data;
	close(w->pidfd);
	free(w);
}

static void drop(struct exec_watch *w)
{
	for (struct exec_watch **pp = &watches; *pp; pp = &(*pp)->next) {
		if (*pp == w) {
			*pp = w->next;
			break;
		}
	}
	uv_poll_stop(&w->poll);
	uv_close((uv_handle_t *)&w->poll, on_closed);
}

static void on_end(uv_poll_t *h, int status, int events)
{
	struct exec_watch *w = h->data;
	struct mgr *m = w->m;
	char sandbox[SPACED_NAME_MAX];
	int64_t pid = w->pid;
	uint64_t start = w->start;
	(void)status;
	(void)events;
	memcpy(sandbox, w->sandbox, sizeof sandbox);
	/* the watch first: the record's change that follows updates the watches */
	drop(w);
	gate_ctl_ended(m, sandbox, pid, start);
}

void gate_watch_update(struct mgr *m, const struct mgr_rec *rec)
{
	struct exec_watch *w = watches;
	while (w && strcmp(w->sandbox, rec->r.id.sandbox) != 0)
		w = w->next;
	if (w && (!watched(rec) || w->pid != rec->pid || w->start != rec->pid_start)) {
		drop(w);
		w = NULL;
	}
	if (w || !watched(rec))
		return;
	struct spaced_pidref ref = SPACED_PIDREF_NULL;
	char why[128];
	w = calloc(1, sizeof *w);
	if (!w)
		return;
	if (spaced_pidref_expected(&ref, (pid_t)rec->pid, rec->pid_start, why, sizeof why) < 0) {
		/* gone already (it died while the record changed): ended now */
		free(w);
		gate_ctl_ended(m, rec->r.id.sandbox, rec->pid, rec->pid_start);
		return;
	}
	w->m = m;
	snprintf(w->sandbox, sizeof w->sandbox, "%s", rec->r.id.sandbox);
	w->pid = rec->pid;
	w->start = rec->pid_start;
	w->pidfd = ref.pidfd; /* the watch's now */
	if (uv_poll_init(m->loop, &w->poll, w->pidfd) < 0) {
		spaced_pidref_done(&ref);
		free(w);
		return;
	}
	w->poll.data = w;
	w->next = watches;
	watches = w;
	uv_poll_start(&w->poll, UV_READABLE, on_end);
}

void gate_watch_stop(struct mgr *m)
{
	(void)m;
	while (watches)
		drop(watches);
}
