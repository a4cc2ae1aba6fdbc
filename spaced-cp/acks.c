/*
 * acks.c — worker acknowledgements on their way from the control channel to
 * the lifecycle call that waits for them (cp_record_ack, cp_wait_ack).
 *
 * An ack is handed over in memory, at once, and written to the outbox row
 * by a thread of its own, in batches, without waiting for the disk
 * (cp_store_relaxed): an ack lost in a crash comes again, since the worker
 * answers a replayed seq with the acknowledgement it stored. So the thread
 * that reads the channels never waits for the store's write lock behind
 * the lifecycle transactions it is about to unblock. Another replica waiting
 * for an ack finds it in the store once written (within its poll).
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cp.h"
#include "log.h"
#include "spaced_error.h"
#include "util.h"

#define SLOTS 4096

struct ack {
	struct ack *next; /* in the write queue */
	char worker[SPACED_NAME_MAX];
	int64_t seq;
	int ok;
	char *result;
	int64_t at;
	bool written; /* the writer is done with it (under cp->mu): the slot alone holds it */
};

static struct ack *slot[SLOTS];   /* the latest acks, by worker and seq (under cp->mu) */
/* The lifecycle calls waiting for an ack (under cp->mu): each is woken for
 * its own ack only, not for every ack of a burst (fifty creates at once
 * would each wake fifty times and look in the store every time). */
struct waiter {
	struct waiter *next;
	char worker[SPACED_NAME_MAX];
	int64_t seq;
	pthread_cond_t cv;
	bool woken;
};
static struct waiter *waiters;

/* Wakes the waiters of (worker, seq); all of them when worker is NULL. Under cp->mu. */
static void wake(const char *worker, int64_t seq)
{
	for (struct waiter *w = waiters; w; w = w->next)
		if (!worker || (w->seq == seq && strcmp(w->worker, worker) == 0)) {
			w->woken = true;
			pthread_cond_signal(&w->cv);
		}
}
static struct ack *queue, **queue_tail = &queue;
static pthread_mutex_t qmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qcv = PTHREAD_COND_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct cp *the_cp;

static unsigned slot_of(const char *worker, int64_t seq)
{
	unsigned h = spaced_fnv1a(worker);
	return (h ^ (unsigned)seq ^ (unsigned)(seq >> 32)) % SLOTS;
}

static void ack_free(struct ack *a)
{
	if (a) {
		free(a->result);
		free(a);
	}
}

static void *writer(void *arg)
{
	struct cp *cp = arg;
	struct cp_store *st = NULL;
	for (;;) {
		pthread_mutex_lock(&qmu);
		while (!queue)
			pthread_cond_wait(&qcv, &qmu);
		struct ack *batch = queue;
		queue = NULL;
		queue_tail = &queue;
		pthread_mutex_unlock(&qmu);
		if (!st && cp_store_open(cp->db_url, &st) < 0)
			st = NULL;
		bool in_txn = st && cp_store_relaxed(st, 1) == 0 && cp_store_begin(st) == 0;
		for (struct ack *a = batch; a; a = a->next) {
			char sb[24], now[24];
			if (!in_txn)
				break;
			if (CP_Q(st, NULL, NULL,
			         "UPDATE outbox SET acked = $3, ok = $4, result = $5 WHERE worker = $1 AND seq = $2 AND acked = 0",
			         a->worker, cp_i64(sb, a->seq), cp_i64(now, a->at), a->ok ? "1" : "0", a->result) < 0 ||
			    CP_Q(st, NULL, NULL,
			         "UPDATE workers SET acked_seq = $2, last_seen = CASE WHEN last_seen < CAST($3 AS BIGINT) THEN "
			         "CAST($3 AS BIGINT) ELSE last_seen END WHERE id = $1 AND acked_seq < $2",
			         a->worker, sb, now) < 0) {
				cp_store_rollback(st);
				in_txn = false;
			}
		}
		if (in_txn && cp_store_commit(st) < 0)
			cp_store_rollback(st);
		if (st)
			cp_store_relaxed(st, 0);
		if (!in_txn)
			spaced_log("spaced-cp", "level=warn event=acks-not-written reason=\"they come again on replay\"");
		/* the waiters saw them in memory; the rows were only for others, and
		 * for a waiter whose ack lost its slot to another before it looked:
		 * it is woken again to find the row */
		pthread_mutex_lock(&cp->mu);
		for (struct ack *a = batch, *n; a; a = n) {
			n = a->next;
			unsigned i = slot_of(a->worker, a->seq);
			a->next = NULL;
			a->written = true;
			if (slot[i] != a) {
				wake(a->worker, a->seq);
				ack_free(a); /* no longer the slot's: nobody looks at it */
			}
		}
		pthread_mutex_unlock(&cp->mu);
	}
	return NULL;
}

static void start_writer(void)
{
	pthread_t t;
	if (pthread_create(&t, NULL, writer, the_cp) == 0)
		pthread_detach(t);
}

void cp_acks_put(struct cp *cp, const char *worker, int64_t seq, int ok, const char *result)
{
	struct ack *a = calloc(1, sizeof *a);
	if (!a)
		return;
	snprintf(a->worker, sizeof a->worker, "%s", worker);
	a->seq = seq;
	a->ok = ok;
	a->result = result ? strdup(result) : NULL;
	a->at = spaced_now();
	the_cp = cp;
	pthread_once(&once, start_writer);
	/* the slot first (the waiters), then the queue (the rows) */
	unsigned i = slot_of(worker, seq);
	pthread_mutex_lock(&cp->mu);
	struct ack *old = slot[i];
	slot[i] = a;
	if (old && old->written)
		ack_free(old); /* else the writer frees it when done with it */
	wake(worker, seq);
	pthread_mutex_unlock(&cp->mu);
	pthread_mutex_lock(&qmu);
	*queue_tail = a;
	queue_tail = &a->next;
	pthread_cond_signal(&qcv);
	pthread_mutex_unlock(&qmu);
}

bool cp_acks_wait(struct cp *cp, const char *worker, int64_t seq, const struct timespec *until)
{
	struct waiter w = {.seq = seq};
	snprintf(w.worker, sizeof w.worker, "%s", worker);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&w.cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_lock(&cp->mu);
	struct ack *a = slot[slot_of(worker, seq)];
	/* handed over since the caller looked: no wait */
	w.woken = cp->stopping || (a && a->seq == seq && strcmp(a->worker, worker) == 0);
	if (!w.woken) {
		w.next = waiters;
		waiters = &w;
		while (!w.woken && !cp->stopping)
			if (pthread_cond_timedwait(&w.cv, &cp->mu, until) != 0)
				break;
		for (struct waiter **pp = &waiters; *pp; pp = &(*pp)->next)
			if (*pp == &w) {
				*pp = w.next;
				break;
			}
	}
	bool woken = w.woken;
	pthread_mutex_unlock(&cp->mu);
	pthread_cond_destroy(&w.cv);
	return woken;
}

void cp_acks_wake_all(struct cp *cp)
{
	pthread_mutex_lock(&cp->mu);
	wake(NULL, 0);
	pthread_mutex_unlock(&cp->mu);
}

int cp_acks_get(struct cp *cp, const char *worker, int64_t seq, int *ok, char **result)
{
	int found = 0;
	pthread_mutex_lock(&cp->mu);
	struct ack *a = slot[slot_of(worker, seq)];
	if (a && a->seq == seq && strcmp(a->worker, worker) == 0) {
		*ok = a->ok;
		*result = a->result ? strdup(a->result) : NULL;
		found = 1;
	}
	pthread_mutex_unlock(&cp->mu);
	return found;
}
