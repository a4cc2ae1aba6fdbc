/*
 * channel.h — the worker control channels of spaced-cp
 * (docs/control-messages.md): a WebSocket per worker on the loop thread,
 * over libspaced's httpsrv. On hello the channel replays what the worker has
 * not acknowledged, then sends every outbox row in seq order, one message per
 * text frame; acks are written back to the outbox. A channel quiet for 1 s
 * gets a ping, one that says nothing (no message, no pong) for 4 s is
 * closed; an open channel keeps workers.channel_until a few seconds ahead
 * (liveness, cp.h CP_CHAN_UNTIL_S), a closed one sets it to 0 at once.
 *
 * Everything here runs on the loop thread with cp->loop_st (reads only),
 * except cp_chan_authorized (a request thread with its own store), the
 * tentative installs' registry (any thread, below) and cp_chan_seq_restart
 * (at start); what the channels write goes to a thread of their own, in
 * order (channel.c), so the loop never waits for the store's write lock —
 * but for a hello that names installs a crash of the machine lost (their
 * destroys are queued before the replay: rare, and after such a crash only).
 */
#ifndef SPACED_CP_CHANNEL_H
#define SPACED_CP_CHANNEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cp.h"
#include "httpsrv.h"

struct cp_chan;

/* Output queued on a channel beyond this waits for the queue to drain
 * (the server's low_water must be the same). */
#define CP_CHAN_LOW_WATER 65536

/* Binds the channels to the control plane (before the first is opened). */
void cp_chan_init(struct cp *cp);

/* Reads "/v1/workers/ID/channel" (no query): 0 with the worker ID copied
 * into worker, or -1 when path is not a channel path or ID not a valid name. */
int cp_chan_path(const char *path, char worker[SPACED_NAME_MAX]);

/* True when auth ("Bearer KEY") is worker's own worker key. Runs on a
 * request thread, with that thread's store. */
bool cp_chan_authorized(struct cp_store *st, const char *auth, const char *worker);

/* Takes an accepted WebSocket as worker's channel; an older channel of the
 * same worker on this replica is closed. Returns the channel (owned by
 * channel.c until cp_chan_closed) or NULL (out of memory). */
struct cp_chan *cp_chan_open(struct spaced_httpconn *c, const char *worker);

/* One whole message from the worker: hello, an ack, or an execution that
 * ended (cp_execution_ended). Anything else, or a hello the control plane
 * must refuse, closes the channel. */
void cp_chan_message(struct cp_chan *ch, bool text, const uint8_t *p, size_t n);

/* The worker sent a ping or a pong: it is alive. */
void cp_chan_heard(struct cp_chan *ch);

/* The output queue ran low: send more of the outbox. */
void cp_chan_drain(struct cp_chan *ch);

/* Whether worker's channel is open and past its hello on this replica now.
 * Any thread. The store's workers.channel_until says the same for every
 * replica, but it lapses when this replica's loop or the channels' writer
 * is held up longer than CP_CHAN_UNTIL_S (a store that does not take writes
 * for that long): placement and listing ask both. */
bool cp_chan_live_here(const char *worker);

/* Whether worker is live (connected) now: its workers.channel_until (read
 * from the store by the caller) is not past now, or its channel is open on
 * this replica. Every use of liveness asks this. Any thread. */
bool cp_worker_live(const char *worker, int64_t channel_until, int64_t now);

/* The connection is gone: forget ch (freed here) and, when it was this
 * replica's last channel of its worker, mark the worker not connected. */
void cp_chan_closed(struct cp_chan *ch);

/* Sends every channel what the outbox holds past what it sent. */
void cp_chan_pump_all(void);

/* Every 100 ms: pings to quiet channels, closes silent ones, polls the
 * outbox (rows queued by another replica), and once a second renews
 * channel_until of the open ones. */
void cp_chan_tick(void);

/* ---- tentative installs (docs/control-messages.md "Tentative installs") ----
 * A batch of creates (ops.c) commits without waiting for the disk and makes
 * its commit durable (cp_store_sync_log) while its installs are on their way:
 * until then they are sent marked {"tentative":true,…}, and the worker keeps
 * a note of each it applied until the channel tells it
 * {"type":"durable","through":N}. After a crash of the machine that lost such
 * a commit, the worker's hello names what it applied of it; the control
 * plane has its worker destroy those sandboxes (it never knew them, nor
 * answered their creates). */
/* Seqs a start of the control plane skips after its machine started again
 * (SQLite, cp_chan_seq_restart): no more than one batch of creates can have
 * been sent to a worker and lost with the machine (one batch is tentative at
 * a time; it has at most one create per request thread, --threads <= 64),
 * so no seq a worker applied is ever sent again as another message. */
#define CP_SEQ_JUMP 64
/* Worker's install at seq, about sandbox, is tentative until
 * cp_chan_tentative_end (the batch's leader, inside its transaction, for
 * each install it queued). False when no more fit (CP_SEQ_JUMP, one per
 * request thread): the batch is then rolled back. A worker whose hello did
 * not say it takes tentative installs is sent them once durable. Any thread. */
bool cp_chan_tentative_begin(const char *worker, int64_t seq, const char *sandbox);
/* The batch is durable (or rolled back): nothing is tentative now; the
 * loop then tells the workers (cp_wake). Any thread. */
void cp_chan_tentative_end(void);
/* Installs sent tentative so far, and those a hello reported that the store
 * had lost (their destroy queued). Any thread. */
void cp_chan_tentative_counts(uint64_t *sent, uint64_t *lost);
/* Whether a batch is tentative now (a commit seen now may not be durable). */
bool cp_chan_tentative_any(void);
/* Once at start, before serving (SQLite: nothing else on PostgreSQL, where
 * no commit is tentative): the log made durable (a commit a crash of the
 * process left unsynced is a commit like any other from now on: the
 * kernel kept it), and, when the machine started again since the store was
 * last opened (the kernel's boot_id, kept in meta), every worker's next_seq
 * moved on by CP_SEQ_JUMP (the old value kept in workers.seq_jumped): what
 * a lost commit sent is never sent again as another message. 0, or a store
 * error. */
int cp_chan_seq_restart(struct cp_store *st);
/* Once the loop has stopped: writes what the channels handed to their
 * writer thread (a closed channel's worker marked not connected) and ends
 * it. */
void cp_chan_stop(void);

#endif
