/*
 * gate_commit.c — the gate's writes to its records' store, on a thread of
 * their own (gate.h shows the contract).
 *
 * Every write goes through one queue, in order, to the writer thread, which
 * has its own connection to the store (WAL: the loop's reads of
 * acknowledgements never wait for it). The loop hands over what it queued
 * at the end of each turn, and what was handed over while a transaction
 * waited for the disk goes in the next one together: a burst of installs
 * waits for the disk a few times, not once each, and the loop goes on
 * serving meanwhile. A transaction of several writes that fails is tried
 * again one write at a time, so one write refused (a generation going
 * backwards) fails alone. Each write's completion runs on the loop after
 * its transaction is on disk, in the order the writes were queued.
 */
#include "gate.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "spaced_error.h"

#define COMMIT_BATCH_MAX 256 /* writes in one transaction at most */

struct cwrite {
	struct cwrite *next;
	bool has_rec;
	struct mgr_rec rec;
	uint64_t seq;
	bool tentative; /* seq was sent tentative: noted with tent's identity */
	struct spaced_identity tent;
	char *ack;
	int (*fn)(struct mgr_store *st, void *arg); /* a call instead of a write */
	void *arg;
	gate_written_fn done;
	void *ctx;
	int status;
};

static struct {
	bool started;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;
	struct cwrite *q, **q_tail;       /* queued */
	struct cwrite *done, **done_tail; /* written, completions not yet run */
	struct mgr_store *st;             /* the writer's own connection */
	uv_async_t async;
	/* the loop's side: what it queued in this turn, handed over at its end */
	struct cwrite *turn, **turn_tail;
	uv_check_t turn_end;
	/* tentative installs (gate_commit_tentative): the loop's notes of those
	 * not yet written, and the last seq said durable (read by the writer) */
	struct tent_note {
		struct tent_note *next;
		uint64_t seq;
		struct spaced_identity id;
	} *tent;
	uint64_t durable_through;
} W;

/* Writes n queued writes (no calls) as one transaction; on failure of more
 * than one, each alone. */
static void write_batch(struct cwrite **b, size_t n)
{
	const struct mgr_rec *recs[COMMIT_BATCH_MAX];
	uint64_t seqs[COMMIT_BATCH_MAX];
	const char *acks[COMMIT_BATCH_MAX];
	const struct spaced_identity *tents[COMMIT_BATCH_MAX];
	for (size_t i = 0; i < n; i++) {
		recs[i] = b[i]->has_rec ? &b[i]->rec : NULL;
		seqs[i] = b[i]->seq;
		acks[i] = b[i]->ack;
		tents[i] = b[i]->tentative ? &b[i]->tent : NULL;
	}
	uint64_t durable = __atomic_load_n(&W.durable_through, __ATOMIC_ACQUIRE);
	int e = mgr_store_commit_many(W.st, recs, seqs, acks, tents, n, durable);
	if (e < 0 && n > 1) {
		for (size_t i = 0; i < n; i++)
			b[i]->status = mgr_store_commit_many(W.st, &recs[i], &seqs[i], &acks[i], &tents[i], 1, durable);
		return;
	}
	for (size_t i = 0; i < n; i++)
		b[i]->status = e;
}

static void *writer_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&W.mu);
	for (;;) {
		while (!W.q && !W.stop)
			pthread_cond_wait(&W.cv, &W.mu);
		if (!W.q)
			break; /* stopped, and everything written */
		/* the writes at the head (up to a call, or the batch's bound) */
		struct cwrite *b[COMMIT_BATCH_MAX];
		size_t n = 0;
		struct cwrite *call = NULL;
		if (W.q->fn) {
			call = W.q;
			W.q = call->next;
		} else {
			while (W.q && !W.q->fn && n < COMMIT_BATCH_MAX) {
				b[n++] = W.q;
				W.q = W.q->next;
			}
		}
		if (!W.q)
			W.q_tail = &W.q;
		pthread_mutex_unlock(&W.mu);
		if (call)
			call->status = call->fn(W.st, call->arg);
		else
			write_batch(b, n);
		pthread_mutex_lock(&W.mu);
		if (call)
			b[n++] = call;
		for (size_t i = 0; i < n; i++) {
			b[i]->next = NULL;
			*W.done_tail = b[i];
			W.done_tail = &b[i]->next;
		}
		uv_async_send(&W.async);
	}
	pthread_mutex_unlock(&W.mu);
	return NULL;
}

static void on_written(uv_async_t *h)
{
	struct mgr *m = h->data;
	pthread_mutex_lock(&W.mu);
	struct cwrite *list = W.done;
	W.done = NULL;
	W.done_tail = &W.done;
	pthread_mutex_unlock(&W.mu);
	while (list) {
		struct cwrite *w = list;
		list = w->next;
		if (w->status == 0 && !w->fn) {
			if (w->has_rec)
				mgr_store_use_epoch(m->store, w->rec.r.epoch);
			mgr_store_note_seq(m->store, w->seq);
		}
		if (w->done)
			w->done(m, w->ctx, w->status);
		free(w->ack);
		free(w);
	}
}

/* The turn of the loop is over: what it queued goes to the writer at once,
 * so that writes made together (creates arriving together) are written
 * together. */
static void hand_over(uv_check_t *h)
{
	uv_check_stop(h);
	if (!W.turn)
		return;
	pthread_mutex_lock(&W.mu);
	*W.q_tail = W.turn;
	W.q_tail = W.turn_tail;
	pthread_cond_signal(&W.cv);
	pthread_mutex_unlock(&W.mu);
	W.turn = NULL;
	W.turn_tail = &W.turn;
}

int gate_commit_start(struct mgr *m)
{
	int e = mgr_store_open(m->cfg->state_dir, &W.st);
	if (e < 0)
		return e;
	W.q_tail = &W.q;
	W.done_tail = &W.done;
	W.turn_tail = &W.turn;
	pthread_mutex_init(&W.mu, NULL);
	pthread_cond_init(&W.cv, NULL);
	if (uv_async_init(m->loop, &W.async, on_written) < 0) {
		mgr_store_close(W.st);
		return SPACED_EIO;
	}
	W.async.data = m;
	uv_check_init(m->loop, &W.turn_end);
	if (pthread_create(&W.thread, NULL, writer_main, NULL) != 0) {
		uv_close((uv_handle_t *)&W.async, NULL);
		uv_close((uv_handle_t *)&W.turn_end, NULL);
		mgr_store_close(W.st);
		return SPACED_EIO;
	}
	W.started = true;
	return 0;
}

void gate_commit_stop(struct mgr *m)
{
	(void)m;
	if (!W.started)
		return;
	hand_over(&W.turn_end); /* the last turn's writes too */
	uv_close((uv_handle_t *)&W.turn_end, NULL);
	pthread_mutex_lock(&W.mu);
	W.stop = true;
	pthread_cond_signal(&W.cv);
	pthread_mutex_unlock(&W.mu);
	pthread_join(W.thread, NULL); /* what was queued is written first */
	uv_close((uv_handle_t *)&W.async, NULL);
	for (struct cwrite *w = W.done, *next; w; w = next) {
		next = w->next; /* the loop is over: nobody is left to tell */
		free(w->ack);
		free(w);
	}
	W.done = NULL;
	for (struct tent_note *t = W.tent, *next; t; t = next) {
		next = t->next;
		free(t);
	}
	W.tent = NULL;
	mgr_store_close(W.st);
	W.st = NULL;
	W.started = false;
}

static void enqueue(struct mgr *m, struct cwrite *w)
{
	if (!W.started) {
		/* no writer: nothing can be written */
		if (w->done)
			w->done(m, w->ctx, SPACED_EIO);
		free(w->ack);
		free(w);
		return;
	}
	*W.turn_tail = w;
	W.turn_tail = &w->next;
	uv_check_start(&W.turn_end, hand_over);
}

void gate_commit_write(struct mgr *m, const struct mgr_rec *rec, uint64_t seq, const char *ack_line,
                       gate_written_fn done, void *ctx)
{
	struct cwrite *w = calloc(1, sizeof *w);
	if (!w || (ack_line && !(w->ack = strdup(ack_line)))) {
		free(w);
		if (done)
			done(m, ctx, SPACED_ENOMEM);
		return;
	}
	if (rec) {
		w->has_rec = true;
		w->rec = *rec;
	}
	/* the acknowledgement of a seq sent tentative: noted with it (the
	 * loop's note stays until said durable: a write that fails, and is
	 * made again, is noted again) */
	for (struct tent_note *t = W.tent; seq > 0 && t; t = t->next)
		if (t->seq == seq) {
			w->tentative = true;
			w->tent = t->id;
			break;
		}
	w->seq = seq;
	w->done = done;
	w->ctx = ctx;
	enqueue(m, w);
}

int gate_commit_tentative(struct mgr *m, uint64_t seq, const struct spaced_identity *id)
{
	(void)m;
	if (seq <= W.durable_through)
		return 0;
	for (struct tent_note *t = W.tent; t; t = t->next)
		if (t->seq == seq)
			return 0; /* sent again while in progress */
	struct tent_note *t = calloc(1, sizeof *t);
	if (t == NULL)
		return SPACED_ENOMEM;
	t->seq = seq;
	t->id = *id;
	t->next = W.tent;
	W.tent = t;
	return 0;
}

void gate_commit_durable(struct mgr *m, uint64_t through)
{
	(void)m;
	if (through <= W.durable_through)
		return;
	__atomic_store_n(&W.durable_through, through, __ATOMIC_RELEASE);
	for (struct tent_note **p = &W.tent; *p;) {
		struct tent_note *t = *p;
		if (t->seq <= through) {
			*p = t->next;
			free(t);
		} else {
			p = &t->next;
		}
	}
}

static int by_seq(const void *a, const void *b)
{
	json_int_t x = json_integer_value(json_object_get(*(json_t *const *)a, "seq")),
	           y = json_integer_value(json_object_get(*(json_t *const *)b, "seq"));
	return x < y ? -1 : x > y;
}

json_t *gate_commit_tentative_list(struct mgr *m)
{
	json_t *a = mgr_store_tentative(m->store, W.durable_through, GATE_TENTATIVE_LISTED);
	if (a == NULL)
		return NULL;
	for (struct tent_note *t = W.tent; t; t = t->next) {
		bool there = false;
		for (size_t i = 0; i < json_array_size(a) && !there; i++)
			there = (uint64_t)json_integer_value(json_object_get(json_array_get(a, i), "seq")) == t->seq;
		if (!there)
			json_array_append_new(a, json_pack("{s:I,s:s,s:s}", "seq", (json_int_t)t->seq, "sandbox",
			                                   t->id.sandbox, "activation", t->id.activation));
	}
	size_t n = json_array_size(a);
	json_t **v = n ? malloc(n * sizeof *v) : NULL;
	if (n && v == NULL) {
		json_decref(a);
		return NULL;
	}
	for (size_t i = 0; i < n; i++)
		v[i] = json_incref(json_array_get(a, i));
	qsort(v, n, sizeof *v, by_seq);
	json_array_clear(a);
	for (size_t i = 0; i < n; i++) {
		if (i < GATE_TENTATIVE_LISTED)
			json_array_append(a, v[i]);
		json_decref(v[i]);
	}
	free(v);
	return a;
}

void gate_commit_call(struct mgr *m, int (*fn)(struct mgr_store *st, void *arg), void *arg, gate_written_fn done,
                      void *ctx)
{
	struct cwrite *w = calloc(1, sizeof *w);
	if (!w) {
		if (done)
			done(m, ctx, SPACED_ENOMEM);
		return;
	}
	w->fn = fn;
	w->arg = arg;
	w->done = done;
	w->ctx = ctx;
	enqueue(m, w);
}
