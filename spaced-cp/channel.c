/*
 * channel.c — the worker control channels (channel.h): hello, replay of what
 * a worker missed, one outbox row per text frame in seq order, acks written
 * back, pings, and the liveness every replica reads from workers.channel_until;
 * installs sent tentative and said durable (docs/control-messages.md).
 * Runs on the loop thread (cp->loop_st) but for cp_chan_authorized, the
 * tentative registry and cp_chan_seq_restart.
 */
#include "log.h"
#include "channel.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spaced_error.h"
#include "identity.h"
#include "ws.h"

#define CHAN_PING_NS 1000000000ull /* ping a channel quiet for 1 s, then every second */
#define CHAN_DEAD_NS 4000000000ull /* close a channel that said nothing (not even a pong) for 4 s */
#define CHAN_LAG_NS 1000000000ull  /* the loop itself ran this late: silence is not judged this tick */
#define CHAN_BATCH "32"            /* outbox rows read per query */

struct cp_chan {
	struct cp_chan *next;
	struct spaced_httpconn *c;
	char worker[SPACED_NAME_MAX];
	bool hello;   /* said hello: rows flow */
	bool closing; /* a close is under way: nothing more is sent */
	bool synced;  /* {"synced": N} sent: the replay after the hello is over */
	int64_t hello_t; /* when it said hello (wall seconds): synced waits for a liveness write since */
	bool fences;  /* its hello said it fences itself (fence_after > 0): it wants {"synced"} */
	int64_t sent_seq;
	int64_t replay_to; /* the last seq queued when the hello came */
	int64_t applied;   /* the hello's last_seq, then the last seq sent: what the worker applies up to */
	int64_t tent_hi;   /* the last seq sent tentative (0: none) */
	int64_t durable_told; /* the last {"type":"durable","through":N} sent */
	bool takes_tentative; /* its hello had "tentative": it takes installs sent tentative */
	uint64_t last_rx, last_ping; /* monotonic ns */
};

static struct cp *C;
static struct cp_chan *chans;
/* The wall-clock second of the last liveness renewal written (cp_chan_tick:
 * a replica that cannot write them closes its channels; chan_synced waits
 * for one since the hello). Only a write moves it. */
static int64_t seen_written;
static uint64_t last_tick_ns, ticks;

void cp_chan_init(struct cp *cp)
{
	C = cp;
}

int cp_chan_path(const char *path, char worker[SPACED_NAME_MAX])
{
	static const char pre[] = "/v1/workers/", suf[] = "/channel";
	size_t n = strlen(path), pl = sizeof pre - 1, sl = sizeof suf - 1;
	if (n <= pl + sl || strncmp(path, pre, pl) != 0 || strcmp(path + n - sl, suf) != 0)
		return -1;
	size_t l = n - pl - sl;
	if (l >= SPACED_NAME_MAX || !spaced_name_valid(path + pl, l))
		return -1;
	memcpy(worker, path + pl, l);
	worker[l] = 0;
	return 0;
}

bool cp_chan_authorized(struct cp_store *st, const char *auth, const char *worker)
{
	return strncmp(auth, "Bearer ", 7) == 0 && cp_worker_auth(st, auth + 7, worker) == 0;
}

/* The workers with a channel past its hello on this replica, and how many
 * each (channel.h cp_chan_live_here): read by request threads. */
static struct {
	pthread_mutex_t lock;
	struct live_worker {
		char name[SPACED_NAME_MAX];
		unsigned n;
	} *w;
	size_t nw, cap;
} live = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

static void live_change(const char *worker, int delta)
{
	pthread_mutex_lock(&live.lock);
	size_t i = 0;
	while (i < live.nw && strcmp(live.w[i].name, worker) != 0)
		i++;
	if (i == live.nw && delta > 0) {
		if (live.nw == live.cap) {
			size_t nc = live.cap ? live.cap * 2 : 16;
			struct live_worker *nw = realloc(live.w, nc * sizeof *nw);
			if (nw == NULL)
				goto out; /* the store's channel_until still says it */
			live.w = nw;
			live.cap = nc;
		}
		snprintf(live.w[live.nw].name, sizeof live.w[live.nw].name, "%s", worker);
		live.w[live.nw++].n = 0;
	}
	if (i < live.nw) {
		if (delta > 0)
			live.w[i].n++;
		else if (live.w[i].n > 0 && --live.w[i].n == 0)
			live.w[i] = live.w[--live.nw];
	}
out:
	pthread_mutex_unlock(&live.lock);
}

bool cp_chan_live_here(const char *worker)
{
	bool found = false;
	pthread_mutex_lock(&live.lock);
	for (size_t i = 0; i < live.nw && !found; i++)
		found = strcmp(live.w[i].name, worker) == 0;
	pthread_mutex_unlock(&live.lock);
	return found;
}

bool cp_worker_live(const char *worker, int64_t channel_until, int64_t now)
{
	return channel_until >= now || (worker != NULL && cp_chan_live_here(worker));
}

/* ch is no longer past its hello: nothing flows on it any more. */
static void chan_unhello(struct cp_chan *ch)
{
	if (ch->hello)
		live_change(ch->worker, -1);
	ch->hello = false;
}

/* ---- the channels' writes, on a thread of their own ----
 * What the channels write (a worker's liveness, what its hello reports, an
 * execution that ended, a channel that closed) is handed to one thread, in
 * order, and written there with its own store handle: the loop never waits
 * for the store's write lock, which a batch of creates holds while the disk
 * syncs (tens of ms on a busy disk) — a loop waiting for it held up every
 * request's answer and every channel. Every write waits for the disk, the
 * liveness renewals too: one lost to a crash would make a worker look gone
 * sooner than it was, and the control plane counts a worker's fence from
 * it (docs/control-messages.md, "Fence"). */
enum cw_kind { CW_SEEN, CW_HELLO, CW_ENDED, CW_CLOSED };

struct cw {
	struct cw *next;
	enum cw_kind kind;
	char worker[SPACED_NAME_MAX];
	int64_t t;
	/* CW_HELLO: what the hello reported (NULL / has_capacity false: nothing) */
	bool has_capacity;
	int64_t capacity, fence_after;
	char *substrates, *limits;
	/* CW_ENDED */
	struct spaced_identity id;
	char *reason;
};

#define CW_QUEUE_MAX 4096 /* past it, a renewal waits for the next tick; anything else waits for room */

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv, idle_cv;
	struct cw *head, **tail;
	size_t n;
	bool started, busy, stop, seen_queued;
	pthread_t thread;
} cw = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, &cw.head, 0,
        false, false, false, false, 0};

static void cw_free(struct cw *w)
{
	free(w->substrates);
	free(w->limits);
	free(w->reason);
	free(w);
}

/* One write, with st (inside the batch's transaction when there is one):
 * 0, or a store error. */
static int cw_run(struct cp_store *st, const struct cw *w)
{
	char now[24], until[24], cap[24];
	int r = 0;
	switch (w->kind) {
	case CW_SEEN:
		/* never lowered: an ack written late (acks.c) does the same */
		r = CP_Q(st, NULL, NULL,
		         "UPDATE workers SET last_seen = CASE WHEN last_seen < CAST($2 AS BIGINT) THEN CAST($2 AS BIGINT) "
		         "ELSE last_seen END, channel_until = $3, channel_replica = $4 WHERE id = $1",
		         w->worker, cp_i64(now, w->t), cp_i64(until, w->t + CP_CHAN_UNTIL_S), C->replica_id);
		break;
	case CW_HELLO:
		/* back: an operator's "lost" no longer speaks for it (it is sent what
		 * it missed, destroys of what ran elsewhere meanwhile included) */
		CP_Q(st, NULL, NULL, "UPDATE workers SET lost = 0, fence_after = $2 WHERE id = $1", w->worker,
		     cp_i64(cap, w->fence_after));
		if (w->has_capacity)
			CP_Q(st, NULL, NULL, "UPDATE workers SET capacity = $2 WHERE id = $1", w->worker,
			     cp_i64(cap, w->capacity));
		if (w->substrates)
			CP_Q(st, NULL, NULL, "UPDATE workers SET substrates = $2 WHERE id = $1", w->worker, w->substrates);
		if (w->limits)
			CP_Q(st, NULL, NULL, "UPDATE workers SET limits = $2 WHERE id = $1", w->worker, w->limits);
		break;
	case CW_ENDED:
		cp_execution_ended(C, st, w->worker, &w->id, w->reason);
		break;
	case CW_CLOSED:
		/* not connected from now on, unless another replica holds it by now */
		CP_Q(st, NULL, NULL, "UPDATE workers SET channel_until = 0 WHERE id = $1 AND channel_replica = $2",
		     w->worker, C->replica_id);
		break;
	}
	return r;
}

static void *cw_thread(void *arg)
{
	(void)arg;
	struct cp_store *st = NULL;
	pthread_mutex_lock(&cw.mu);
	for (;;) {
		while (!cw.head && !cw.stop)
			pthread_cond_wait(&cw.cv, &cw.mu);
		if (!cw.head)
			break; /* stopping, and nothing left */
		struct cw *batch = cw.head;
		cw.head = NULL;
		cw.tail = &cw.head;
		cw.n = 0;
		cw.seen_queued = false;
		cw.busy = true;
		pthread_cond_broadcast(&cw.idle_cv); /* room in the queue */
		pthread_mutex_unlock(&cw.mu);
		if (!st && cp_store_open(C->db_url, &st) < 0) {
			st = NULL;
			spaced_log("spaced-cp", "level=error event=channel-writes-lost reason=\"the store does not open\"");
		}
		if (st) {
			/* one transaction for the batch; each write alone when it cannot begin */
			bool txn = batch->next && cp_store_begin(st) == 0, seen_ok = true;
			int64_t seen_t = 0;
			for (struct cw *w = batch; w; w = w->next) {
				bool ok = cw_run(st, w) == 0;
				if (w->kind == CW_SEEN) {
					seen_ok = seen_ok && ok;
					seen_t = w->t > seen_t ? w->t : seen_t;
				}
			}
			if (txn && cp_store_commit(st) < 0) {
				cp_store_rollback(st);
				seen_ok = false;
			}
			if (seen_ok && seen_t > __atomic_load_n(&seen_written, __ATOMIC_ACQUIRE))
				__atomic_store_n(&seen_written, seen_t, __ATOMIC_RELEASE);
		}
		for (struct cw *w = batch, *next; w; w = next) {
			next = w->next;
			cw_free(w);
		}
		pthread_mutex_lock(&cw.mu);
		cw.busy = false;
		pthread_cond_broadcast(&cw.idle_cv);
	}
	pthread_mutex_unlock(&cw.mu);
	if (st)
		cp_store_close(st);
	return NULL;
}

/* Hands w to the writer (owned by it from here); with wait, once the queue
 * has room. False when the thread does not run, or the queue is full and
 * !wait: w is not taken. */
static bool cw_post(struct cw *w, bool wait)
{
	pthread_mutex_lock(&cw.mu);
	if (!cw.started && !cw.stop)
		cw.started = pthread_create(&cw.thread, NULL, cw_thread, NULL) == 0;
	while (wait && cw.started && !cw.stop && cw.n >= CW_QUEUE_MAX)
		pthread_cond_wait(&cw.idle_cv, &cw.mu); /* the store is stuck: the loop waits, as it did before */
	bool ok = cw.started && !cw.stop && cw.n < CW_QUEUE_MAX;
	if (ok) {
		w->next = NULL;
		*cw.tail = w;
		cw.tail = &w->next;
		cw.n++;
		cw.seen_queued = cw.seen_queued || w->kind == CW_SEEN;
		pthread_cond_signal(&cw.cv);
	}
	pthread_mutex_unlock(&cw.mu);
	return ok;
}

/* w to the writer, after what is queued; written here when no thread runs
 * (w freed either way). */
static void cw_write(struct cw *w)
{
	if (!cw_post(w, true)) {
		cw_run(C->loop_st, w);
		cw_free(w);
	}
}

static struct cw *cw_new(enum cw_kind kind, const char *worker)
{
	struct cw *w = calloc(1, sizeof *w);
	if (w) {
		w->kind = kind;
		snprintf(w->worker, sizeof w->worker, "%s", worker);
	}
	return w;
}

void cp_chan_stop(void)
{
	pthread_mutex_lock(&cw.mu);
	cw.stop = true;
	bool joined = cw.started;
	pthread_cond_signal(&cw.cv);
	pthread_mutex_unlock(&cw.mu);
	if (joined)
		pthread_join(cw.thread, NULL); /* it writes what is queued first */
}

/* That ch's worker is connected through this replica now (written by the
 * channels' writer). */
static void chan_seen(const struct cp_chan *ch, int64_t t)
{
	struct cw *w = cw_new(CW_SEEN, ch->worker);
	if (w) {
		w->t = t;
		cw_write(w);
	}
}

/* A message queued before the outbox was bounded (cp_outbox_push) that a
 * worker's link cannot take in one line: sent, it closed the channel at
 * every replay, and nothing after it ever arrived. It is acknowledged here
 * as refused (too-large), never sent; a worker applies the seqs it is sent
 * in their order and asks for none it was not sent. */
static void chan_refuse_large(struct cp_chan *ch, int64_t seq, size_t bytes)
{
	struct cp_chan_msg m = {.kind = CP_CHAN_ACK, .seq = seq, .ok = 0};
	snprintf(m.code, sizeof m.code, "too-large");
	snprintf(m.error, sizeof m.error, "the message is %zu bytes; a worker takes at most %u", bytes, CP_CHAN_MSG_MAX);
	spaced_log("spaced-cp", "level=warn event=message-too-large worker=%s seq=%lld bytes=%zu", ch->worker,
	           (long long)seq, bytes);
	cp_record_ack(C, C->loop_st, ch->worker, &m);
}

/* Once every message queued before the hello has been sent, tells the worker
 * so, once per hello: {"synced": N}, N the last seq sent. A worker that fenced
 * itself lifts its fence once it has applied them (docs/control-messages.md,
 * "Fence"): what it missed (a deactivate, a destroy) comes first. */
static void chan_synced(struct cp_chan *ch)
{
	char text[48];
	/* only once a liveness renewal written since the hello covers what the
	 * worker's pings count from now on: a replica whose store takes no
	 * writes never lets a lease be renewed */
	if (ch->synced || !ch->fences || ch->sent_seq < ch->replay_to ||
	    __atomic_load_n(&seen_written, __ATOMIC_ACQUIRE) < ch->hello_t)
		return;
	/* the last seq it was sent (one acknowledged here as too-large never is) */
	int n = snprintf(text, sizeof text, "{\"synced\":%lld}", (long long)ch->applied);
	if (spaced_httpconn_ws_send(ch->c, SPACED_WS_TEXT, text, (size_t)n) == 0)
		ch->synced = true;
}

/* ---- tentative installs (channel.h) ----
 * One batch is tentative at a time (ops.c's leader commits, syncs, then
 * lets the next batch go): its installs, each by worker, seq and sandbox.
 * A row is tentative only when all three match: should the batch's commit
 * fail, another commit may take its seqs, never its fresh sandboxes. */
static struct {
	pthread_mutex_t mu;
	size_t n;
	struct tent_install {
		char worker[SPACED_NAME_MAX];
		int64_t seq;
		char sandbox[SPACED_NAME_MAX];
	} e[CP_SEQ_JUMP];
} tent = {.mu = PTHREAD_MUTEX_INITIALIZER};

bool cp_chan_tentative_begin(const char *worker, int64_t seq, const char *sandbox)
{
	bool ok = false;
	pthread_mutex_lock(&tent.mu);
	if (tent.n < CP_SEQ_JUMP) {
		struct tent_install *e = &tent.e[tent.n++];
		snprintf(e->worker, sizeof e->worker, "%s", worker);
		snprintf(e->sandbox, sizeof e->sandbox, "%s", sandbox);
		e->seq = seq;
		ok = true;
	}
	pthread_mutex_unlock(&tent.mu);
	return ok;
}

void cp_chan_tentative_end(void)
{
	pthread_mutex_lock(&tent.mu);
	tent.n = 0;
	pthread_mutex_unlock(&tent.mu);
}

static _Atomic uint64_t tent_sent, tent_lost;

void cp_chan_tentative_counts(uint64_t *sent, uint64_t *lost)
{
	*sent = atomic_load(&tent_sent);
	*lost = atomic_load(&tent_lost);
}

bool cp_chan_tentative_any(void)
{
	pthread_mutex_lock(&tent.mu);
	bool any = tent.n > 0;
	pthread_mutex_unlock(&tent.mu);
	return any;
}

/* Whether worker's row seq (about sandbox; NULL: any) is tentative now. */
static bool tentative(const char *worker, int64_t seq, const char *sandbox)
{
	bool yes = false;
	pthread_mutex_lock(&tent.mu);
	for (size_t i = 0; i < tent.n && !yes; i++)
		yes = tent.e[i].seq == seq && strcmp(tent.e[i].worker, worker) == 0 &&
		      (sandbox == NULL || strcmp(tent.e[i].sandbox, sandbox) == 0);
	pthread_mutex_unlock(&tent.mu);
	return yes;
}

/* {"type":"durable","through":N}: every seq the worker was sent up to N is
 * durable or settled. 0 or -1. */
static int send_durable(struct cp_chan *ch, int64_t through)
{
	char text[64];
	int n = snprintf(text, sizeof text, "{\"type\":\"durable\",\"through\":%lld}", (long long)through);
	if (spaced_httpconn_ws_send(ch->c, SPACED_WS_TEXT, text, (size_t)n) < 0)
		return -1;
	if (through > ch->durable_told)
		ch->durable_told = through;
	return 0;
}

/* Tells the worker that what it was sent tentative is durable now, once it
 * is: N the last seq sent tentative. */
static void chan_durable(struct cp_chan *ch)
{
	if (ch->tent_hi > ch->durable_told && !ch->closing && !tentative(ch->worker, ch->tent_hi, NULL))
		send_durable(ch, ch->tent_hi);
}

/* Sends one outbox row's body (about sandbox); marked
 * {"tentative":true,…} while its commit is not yet durable. 0, -1, or 1:
 * not sent now — it is tentative and the worker's hello did not say it
 * takes such installs (a worker of before them): it goes once durable. */
static int chan_send_row(struct cp_chan *ch, int64_t seq, const char *body, const char *sandbox)
{
	size_t n = strlen(body);
	bool tent_now = body[0] == '{' && sandbox != NULL && tentative(ch->worker, seq, sandbox);
	if (tent_now && !ch->takes_tentative)
		return 1;
	if (!tent_now)
		return spaced_httpconn_ws_send(ch->c, SPACED_WS_TEXT, body, n);
	static const char mark[] = "{\"tentative\":true,"; /* in place of the body's '{' */
	int r = spaced_httpconn_ws_send2(ch->c, SPACED_WS_TEXT, mark, sizeof mark - 1, body + 1, n - 1);
	if (r == 0)
		atomic_fetch_add(&tent_sent, 1);
	if (r == 0)
		ch->tent_hi = seq;
	return r;
}

/* Sends outbox rows past sent_seq while the output queue has room; the rest
 * follows from cp_chan_drain. */
static void chan_pump(struct cp_chan *ch)
{
	if (ch->hello)
		chan_durable(ch);
	while (ch->hello && !ch->closing && spaced_httpconn_queued(ch->c) <= CP_CHAN_LOW_WATER) {
		struct cp_rows *rows = NULL;
		char sb[24];
		if (CP_Q(C->loop_st, &rows, NULL,
		         "SELECT seq, body, sandbox FROM outbox WHERE worker = $1 AND seq > $2 ORDER BY seq LIMIT " CHAN_BATCH,
		         ch->worker, cp_i64(sb, ch->sent_seq)) < 0) {
			cp_rows_free(rows);
			return;
		}
		int n = rows->nrows;
		for (int i = 0; i < n; i++) {
			const char *body = cp_rows_get(rows, i, 1);
			if (body != NULL && strlen(body) > CP_CHAN_MSG_MAX) {
				chan_refuse_large(ch, cp_rows_i64(rows, i, 0, ch->sent_seq), strlen(body));
				ch->sent_seq = cp_rows_i64(rows, i, 0, ch->sent_seq);
				continue;
			}
			int sent = body == NULL ? -1 : chan_send_row(ch, cp_rows_i64(rows, i, 0, ch->sent_seq), body,
			                                             cp_rows_get(rows, i, 2));
			if (sent != 0) {
				cp_rows_free(rows); /* a held one: pumped again once the batch is durable (cp_wake) */
				return;
			}
			ch->sent_seq = cp_rows_i64(rows, i, 0, ch->sent_seq);
			if (ch->sent_seq > ch->applied)
				ch->applied = ch->sent_seq;
		}
		cp_rows_free(rows);
		if (n < atoi(CHAN_BATCH)) {
			chan_synced(ch);
			return;
		}
	}
}

/* Closes ch with a WebSocket close (code, reason); it ends when written. */
static void chan_close(struct cp_chan *ch, unsigned code, const char *reason)
{
	ch->closing = true;
	chan_unhello(ch);
	spaced_httpconn_ws_close(ch->c, code, reason);
}

/* The hello's tentative installs (channel.h), each settled once: one the
 * outbox holds (its row about the same sandbox, or a seq at or below
 * outbox_pruned_to: rows are removed only once acknowledged, long after
 * their commit) is durable — unless its batch is still syncing, which the
 * durable message after the sync settles (chan_durable); one the outbox does
 * not hold — its commit was lost with the machine before the log reached the
 * disk, its create never answered — gets a destroy of that sandbox queued for
 * the worker, durably, unless the store knows a sandbox of that name, and
 * workers.seq_settled records it (a hello whose last seq is such a one is
 * not refused) — only a seq among those skipped after the machine started
 * again can have been lost: one outside them is left alone and logged (a
 * forged list: at most CP_SEQ_JUMP destroys per hello, all of the forging
 * worker's own). Then the worker is told {"type":"durable","through":N}, N
 * the last listed seq below any still syncing. Waits for the store's write
 * lock only when one was lost (after a crash of the machine). Returns the
 * destroys queued, or -1: the hello is refused (a store error; a row of
 * another sandbox at a seq the worker applied, which the seqs skipped after
 * a restart of the machine make impossible unless the store was replaced). */
static int chan_hello_tentative(struct cp_chan *ch, const struct cp_chan_msg *m, int64_t pruned_to, int64_t settled,
                                int64_t jumped)
{
	struct cp_store *st = C->loop_st;
	bool began = false;
	int r = 0, destroys = 0;
	int64_t syncing = INT64_MAX, lost_hi = 0;
	for (size_t i = 0; i < m->ntentative && r == 0; i++) {
		const struct cp_tentative *t = &m->tentative[i];
		struct cp_rows *rows = NULL;
		char sb[24];
		if (t->seq <= pruned_to || (t->seq > jumped && t->seq <= settled))
			continue; /* confirmed long ago; settled as lost at an earlier hello */
		if (tentative(ch->worker, t->seq, t->sandbox)) {
			if (t->seq < syncing)
				syncing = t->seq;
			if (t->seq > ch->tent_hi)
				ch->tent_hi = t->seq; /* chan_durable, after the sync */
			continue;
		}
		if ((r = CP_Q(st, &rows, NULL, "SELECT sandbox FROM outbox WHERE worker = $1 AND seq = $2", ch->worker,
		              cp_i64(sb, t->seq))) < 0)
			break;
		const char *about = rows->nrows == 1 ? cp_rows_get(rows, 0, 0) : NULL;
		bool held = rows->nrows == 1, same = about != NULL && strcmp(about, t->sandbox) == 0;
		cp_rows_free(rows);
		rows = NULL;
		if (held && same)
			continue;
		if (held) {
			spaced_log("spaced-cp",
			           "level=warn event=channel-refused worker=%s reason=\"seq %lld it applied tentative (sandbox "
			           "%s) is another message here\"",
			           ch->worker, (long long)t->seq, t->sandbox);
			r = SPACED_ESTALE;
			break;
		}
		/* only the seqs skipped after the machine started again can have
		 * been lost (the store holds every other one it sent): one outside
		 * them is no install of this store's (a forged list), left alone */
		if (jumped <= 0 || t->seq <= jumped || t->seq > jumped + CP_SEQ_JUMP) {
			spaced_log("spaced-cp",
			           "level=warn event=tentative-unknown worker=%s seq=%lld sandbox=%s reason=\"the store never "
			           "sent it and cannot have lost it\"",
			           ch->worker, (long long)t->seq, t->sandbox);
			continue;
		}
		lost_hi = t->seq;
		if ((r = CP_Q(st, &rows, NULL, "SELECT 1 FROM sandboxes WHERE id = $1", t->sandbox)) < 0)
			break;
		bool known = rows->nrows > 0;
		cp_rows_free(rows);
		if (!began && (r = cp_store_begin(st)) < 0)
			break;
		began = true;
		if (known) {
			spaced_log("spaced-cp", "level=warn event=tentative-lost-kept worker=%s seq=%lld sandbox=%s",
			           ch->worker, (long long)t->seq, t->sandbox);
			continue;
		}
		int64_t dseq;
		json_t *d = json_pack("{s:s,s:s}", "type", "destroy", "sandbox", t->sandbox);
		r = d == NULL ? SPACED_ENOMEM : cp_outbox_push(st, ch->worker, d, &dseq);
		json_decref(d);
		if (r == 0) {
			destroys++;
			atomic_fetch_add(&tent_lost, 1);
			spaced_log("spaced-cp",
			           "level=warn event=tentative-lost worker=%s seq=%lld sandbox=%s destroy_seq=%lld "
			           "reason=\"its create's commit did not reach the disk\"",
			           ch->worker, (long long)t->seq, t->sandbox, (long long)dseq);
		}
	}
	if (began && r == 0) {
		char lb[24];
		r = CP_Q(st, NULL, NULL, "UPDATE workers SET seq_settled = $2 WHERE id = $1 AND seq_settled < $2", ch->worker,
		         cp_i64(lb, lost_hi));
	}
	if (began && (r < 0 || (r = cp_store_commit(st)) < 0))
		cp_store_rollback(st);
	if (r < 0)
		return -1;
	int64_t through = 0;
	for (size_t i = 0; i < m->ntentative && m->tentative[i].seq < syncing; i++)
		through = m->tentative[i].seq;
	return through > 0 && send_durable(ch, through) < 0 ? -1 : destroys;
}

/* hello: replay from the first message the worker has not applied, and
 * re-send anything not yet acknowledged at or below it (the worker acks those
 * again without effect). Returns 0, or -1 when the hello must be refused. */
static int chan_hello(struct cp_chan *ch, const struct cp_chan_msg *m)
{
	struct cp_store *st = C->loop_st;
	struct cp_rows *rows = NULL;
	if (strcmp(m->worker, ch->worker) != 0) {
		spaced_log("spaced-cp", "level=warn event=channel-refused worker=%s reason=\"hello names another worker (%s)\"",
		           ch->worker, m->worker);
		return -1;
	}
	int64_t from = m->last_seq;
	/* A worker that has applied more than this store ever sent knows a history
	 * the store lost: it would take new messages for old ones. Fail closed. */
	if (CP_Q(st, &rows, NULL,
	         "SELECT next_seq, outbox_pruned_to, seq_jumped, seq_settled FROM workers WHERE id = $1", ch->worker) < 0 ||
	    m->last_seq > cp_rows_i64(rows, 0, 0, 0)) {
		spaced_log("spaced-cp",
		           "level=warn event=channel-refused worker=%s reason=\"hello last_seq=%lld is ahead of the control "
		           "plane (%lld)\"",
		           ch->worker, (long long)m->last_seq, (long long)cp_rows_i64(rows, 0, 0, 0));
		cp_rows_free(rows);
		return -1;
	}
	/* A worker behind what the store keeps (its outbox rows older than
	 * --retain-deleted are removed once acknowledged) would miss messages:
	 * it lost its records; it joins again under a new worker ID. */
	if (m->last_seq < cp_rows_i64(rows, 0, 1, 0)) {
		spaced_log("spaced-cp",
		           "level=warn event=channel-refused worker=%s reason=\"hello last_seq=%lld is older than the "
		           "messages the control plane keeps (from %lld): the worker lost its records; join it again under a "
		           "new worker ID\"",
		           ch->worker, (long long)m->last_seq, (long long)cp_rows_i64(rows, 0, 1, 0) + 1);
		cp_rows_free(rows);
		return -1;
	}
	/* Past the seqs skipped after the machine started again
	 * (cp_chan_seq_restart), a worker has applied only what was sent
	 * tentative and lost with the machine: its last seq is one of those it
	 * lists, or one settled so at an earlier hello. Else the store lost what
	 * it had made durable. Fail closed. */
	int64_t jumped = cp_rows_i64(rows, 0, 2, 0), pruned_to = cp_rows_i64(rows, 0, 1, 0),
	        settled = cp_rows_i64(rows, 0, 3, 0);
	bool listed = m->last_seq <= settled;
	for (size_t i = 0; i < m->ntentative && !listed; i++)
		listed = m->tentative[i].seq == m->last_seq;
	if (jumped > 0 && m->last_seq > jumped && m->last_seq <= jumped + CP_SEQ_JUMP && !listed) {
		spaced_log("spaced-cp",
		           "level=warn event=channel-refused worker=%s reason=\"hello last_seq=%lld is ahead of what the "
		           "control plane had made durable (%lld) and not a tentative install\"",
		           ch->worker, (long long)m->last_seq, (long long)jumped);
		cp_rows_free(rows);
		return -1;
	}
	cp_rows_free(rows);
	rows = NULL;
	/* A worker that acknowledged a message as applied above the last_seq it
	 * names now lost its records (restored from a backup): what it is sent
	 * again may be compacted (cp_outbox_compact). Fail closed. */
	char lsb[24];
	if (CP_Q(st, &rows, NULL, "SELECT COUNT(*) FROM outbox WHERE worker = $1 AND seq > CAST($2 AS BIGINT) AND ok = 1",
	         ch->worker, cp_i64(lsb, m->last_seq)) == 0 &&
	    cp_rows_i64(rows, 0, 0, 0) > 0) {
		spaced_log("spaced-cp",
		           "level=warn event=channel-refused worker=%s reason=\"hello last_seq=%lld is below messages the worker "
		           "acknowledged as applied: the worker lost its records; join it again under a new worker ID\"",
		           ch->worker, (long long)m->last_seq);
		cp_rows_free(rows);
		return -1;
	}
	cp_rows_free(rows);
	rows = NULL;
	ch->takes_tentative = m->has_tentative;
	/* before the replay's end is fixed: the destroys it queues are part of
	 * it (a fenced worker lifts its fence after them) */
	if (chan_hello_tentative(ch, m, pruned_to, settled, jumped) < 0)
		return -1;
	if (CP_Q(st, &rows, NULL, "SELECT next_seq FROM workers WHERE id = $1", ch->worker) < 0) {
		cp_rows_free(rows);
		return -1;
	}
	ch->replay_to = cp_rows_i64(rows, 0, 0, 0);
	cp_rows_free(rows);
	rows = NULL;
	ch->synced = false;
	ch->hello_t = spaced_now();
	ch->fences = m->fence_after > 0;
	ch->applied = m->last_seq;
	if (CP_Q(st, &rows, NULL, "SELECT MIN(seq) FROM outbox WHERE worker = $1 AND acked = 0", ch->worker) == 0) {
		int64_t unacked = cp_rows_i64(rows, 0, 0, -1);
		if (unacked > 0 && unacked - 1 < from)
			from = unacked - 1;
	}
	cp_rows_free(rows);
	ch->sent_seq = from;
	if (!ch->hello)
		live_change(ch->worker, +1);
	ch->hello = true;
	chan_seen(ch, spaced_now());
	struct cw *w = cw_new(CW_HELLO, ch->worker);
	if (w) {
		w->has_capacity = m->has_capacity;
		w->capacity = m->capacity;
		w->fence_after = m->fence_after;
		w->substrates = m->has_substrates ? strdup(m->substrates) : NULL;
		w->limits = m->limits.has ? cp_limits_text(&m->limits) : NULL;
		cw_write(w);
	}
	spaced_log("spaced-cp", "level=info event=channel-hello worker=%s last_seq=%lld replay_from=%lld", ch->worker,
	           (long long)m->last_seq, (long long)from);
	chan_pump(ch);
	return 0;
}

struct cp_chan *cp_chan_open(struct spaced_httpconn *c, const char *worker)
{
	struct cp_chan *ch = calloc(1, sizeof *ch);
	if (ch == NULL)
		return NULL;
	ch->c = c;
	snprintf(ch->worker, sizeof ch->worker, "%s", worker);
	ch->last_rx = ch->last_ping = spaced_mono_ns();
	ch->next = chans;
	chans = ch;
	/* one channel per worker: a new one replaces the old (closing it may
	 * end it at once, which takes it off the list) */
	for (struct cp_chan *o = ch->next, *next; o; o = next) {
		next = o->next;
		if (strcmp(o->worker, worker) == 0 && !o->closing)
			chan_close(o, 1000, "replaced by a newer channel");
	}
	return ch;
}

void cp_chan_message(struct cp_chan *ch, bool text, const uint8_t *p, size_t n)
{
	struct cp_chan_msg m;
	ch->last_rx = spaced_mono_ns();
	if (ch->closing)
		return;
	if (!text) {
		chan_close(ch, 1003, "text messages only");
		return;
	}
	if (cp_parse_chan((const char *)p, n, &m) < 0) {
		spaced_log("spaced-cp", "level=warn event=channel-malformed worker=%s", ch->worker);
		chan_close(ch, 1007, "malformed message");
		return;
	}
	if (m.kind == CP_CHAN_HELLO) {
		if (chan_hello(ch, &m) < 0)
			chan_close(ch, 1008, "hello refused");
	} else if (!ch->hello) {
		chan_close(ch, 1008, "hello first");
	} else if (m.kind == CP_CHAN_ENDED) {
		struct cw *w = cw_new(CW_ENDED, ch->worker);
		if (w) {
			w->id = m.ended;
			w->reason = strdup(m.reason);
			cw_write(w);
		}
	} else {
		cp_record_ack(C, C->loop_st, ch->worker, &m);
	}
	free(m.result);
	free(m.tentative);
}

void cp_chan_heard(struct cp_chan *ch)
{
	ch->last_rx = spaced_mono_ns();
}

void cp_chan_drain(struct cp_chan *ch)
{
	chan_pump(ch);
}

void cp_chan_closed(struct cp_chan *ch)
{
	int others = 0;
	chan_unhello(ch);
	for (struct cp_chan **p = &chans; *p; p = &(*p)->next)
		if (*p == ch) {
			*p = ch->next;
			break;
		}
	for (struct cp_chan *o = chans; o; o = o->next)
		others += strcmp(o->worker, ch->worker) == 0;
	struct cw *w = others ? NULL : cw_new(CW_CLOSED, ch->worker);
	if (w)
		cw_write(w);
	spaced_log("spaced-cp", "level=info event=channel-closed worker=%s", ch->worker);
	free(ch);
}

void cp_chan_pump_all(void)
{
	for (struct cp_chan *ch = chans; ch; ch = ch->next)
		chan_pump(ch);
}

/* Renews channel_until of every channel that said hello (one batch of the
 * writer); not again while the last renewal still waits for it. */
static void chan_renew(void)
{
	int64_t t = spaced_now();
	pthread_mutex_lock(&cw.mu);
	bool waiting = cw.seen_queued;
	pthread_mutex_unlock(&cw.mu);
	if (waiting)
		return;
	for (struct cp_chan *ch = chans; ch; ch = ch->next)
		if (ch->hello) {
			struct cw *w = cw_new(CW_SEEN, ch->worker);
			if (w) {
				w->t = t;
				if (!cw_post(w, false))
					cw_free(w); /* the next tick renews it */
			}
		}
}

static int chan_by_worker(const void *a, const void *b)
{
	return strcmp((*(struct cp_chan *const *)a)->worker, (*(struct cp_chan *const *)b)->worker);
}

/* Rows another replica (or an admin command) queued: a channel is pumped
 * when its worker's next_seq, the last seq queued to it, is past what it
 * sent. One statement for every channel (a SELECT per channel per tick made
 * a thousand workers' control plane run ten thousand of them a second,
 * idle); the workers' rows are matched to the channels by name. */
static void chan_pump_queued(void)
{
	size_t n = 0, k = 0;
	for (struct cp_chan *ch = chans; ch; ch = ch->next)
		n += ch->hello && !ch->closing;
	if (n == 0)
		return;
	struct cp_chan **v = malloc(n * sizeof *v);
	struct cp_rows *rows = NULL;
	if (v == NULL || CP_Q0(C->loop_st, &rows, NULL, "SELECT id, next_seq FROM workers") < 0) {
		free(v);
		cp_rows_free(rows);
		return; /* the next tick, or the next commit's pump */
	}
	for (struct cp_chan *ch = chans; ch; ch = ch->next)
		if (ch->hello && !ch->closing)
			v[k++] = ch;
	qsort(v, n, sizeof *v, chan_by_worker);
	for (int i = 0; i < rows->nrows; i++) {
		struct cp_chan key, *kp = &key, **hit;
		const char *w = cp_rows_get(rows, i, 0);
		if (w == NULL || strlen(w) >= sizeof key.worker)
			continue;
		memcpy(key.worker, w, strlen(w) + 1);
		if ((hit = bsearch(&kp, v, n, sizeof *v, chan_by_worker)) == NULL)
			continue;
		int64_t next = cp_rows_i64(rows, i, 1, 0);
		while (hit > v && strcmp(hit[-1]->worker, w) == 0)
			hit--;
		for (; hit < v + n && strcmp((*hit)->worker, w) == 0; hit++)
			if (next > (*hit)->sent_seq)
				chan_pump(*hit);
	}
	cp_rows_free(rows);
	free(v);
}

void cp_chan_tick(void)
{
	static const uint8_t ping[4] = {'s', 'p', 'c', 'd'}; /* a payload: some peers ignore empty pings */
	uint64_t now = spaced_mono_ns();
	/* a loop that was held up (a slow store) may have pongs waiting unread:
	 * silence is judged only when the loop ran on time */
	bool judge = last_tick_ns != 0 && now - last_tick_ns < CHAN_LAG_NS;
	last_tick_ns = now;
	ticks++;
	/* a replica that has not recorded its workers' liveness for
	 * CP_SEEN_STALL_S (its store unreachable, its writer stuck) does not hold
	 * their channels: it would answer their pings, and so renew their fence's
	 * lease, while the other replicas see them gone and may count them
	 * fenced (docs/control-messages.md, "Fence") */
	int64_t written = __atomic_load_n(&seen_written, __ATOMIC_ACQUIRE), wall = spaced_now();
	for (struct cp_chan *ch = chans, *next; ch; ch = next) {
		next = ch->next;
		if (ch->closing)
			continue;
		/* since its hello or the last write, whichever is later */
		int64_t since = written > ch->hello_t ? written : ch->hello_t;
		if (judge && ch->hello && wall - since >= CP_SEEN_STALL_S) {
			spaced_log("spaced-cp", "level=error event=channel-dropped worker=%s reason=\"liveness not recorded for %lld s\"",
			           ch->worker, (long long)(wall - since));
			spaced_httpconn_abort(ch->c);
			continue;
		}
		if (ch->hello && !ch->synced)
			chan_synced(ch); /* once the hello's liveness is written */
		uint64_t quiet = now - ch->last_rx;
		if (judge && quiet > CHAN_DEAD_NS) {
			/* at once, without waiting for a close frame to be written to a
			 * peer that reads nothing: the worker is not connected from now on */
			spaced_log("spaced-cp", "level=warn event=channel-silent worker=%s quiet_s=%.1f", ch->worker,
			           (double)quiet / 1e9);
			spaced_httpconn_abort(ch->c);
			continue;
		}
		if (quiet >= CHAN_PING_NS && now - ch->last_ping >= CHAN_PING_NS) {
			ch->last_ping = now;
			spaced_httpconn_ws_send(ch->c, SPACED_WS_PING, ping, sizeof ping);
		}
	}
	chan_pump_queued();
	/* every second, and at once after the loop was held up (channel_until
	 * may have lapsed meanwhile) */
	if (ticks % 10 == 0 || !judge)
		chan_renew();
	last_tick_ns = spaced_mono_ns(); /* the store work above is not lag */
}

#define CHAN_STR_(x) #x
#define CHAN_STR(x) CHAN_STR_(x)

int cp_chan_seq_restart(struct cp_store *st)
{
	if (strcmp(cp_store_kind(st), "sqlite") != 0)
		return 0;
	int r = cp_store_sync_log(st);
	if (r < 0)
		return r;
	/* the kernel's run this store was last opened under: the same one
	 * still holds whatever a crash of the process left unsynced */
	char boot[64] = "";
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
	if (f == NULL || fgets(boot, sizeof boot, f) == NULL)
		boot[0] = 0;
	if (f)
		fclose(f);
	boot[strcspn(boot, "\n")] = 0;
	if (!boot[0])
		snprintf(boot, sizeof boot, "unknown");
	struct cp_rows *rows = NULL;
	if ((r = CP_Q0(st, &rows, NULL, "SELECT v FROM meta WHERE k = 'boot_id'")) < 0)
		return r;
	const char *was = cp_rows_get(rows, 0, 0);
	bool rebooted = was != NULL && (strcmp(was, boot) != 0 || strcmp(boot, "unknown") == 0);
	cp_rows_free(rows);
	if ((r = cp_store_begin(st)) < 0)
		return r;
	if (rebooted)
		r = CP_Q0(st, NULL, NULL,
		          "UPDATE workers SET seq_jumped = next_seq, next_seq = next_seq + " CHAN_STR(CP_SEQ_JUMP));
	if (r == 0)
		r = CP_Q(st, NULL, NULL, "INSERT INTO meta (k, v) VALUES ('boot_id', $1) ON CONFLICT (k) DO UPDATE SET v = $1",
		         boot);
	if (r == 0 && (r = cp_store_commit(st)) == 0 && rebooted)
		spaced_log("spaced-cp", "level=info event=seqs-skipped count=" CHAN_STR(CP_SEQ_JUMP)
		           " reason=\"the machine started again since this store was last opened: a tentative commit "
		           "may be lost\"");
	if (r < 0)
		cp_store_rollback(st);
	return r;
}
