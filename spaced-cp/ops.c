/*
 * ops.c — the control plane's domain operations on the store: API keys and
 * tenants, the outbox and acks, the key bundle and rotation, and the sandbox
 * lifecycle (create, pause, resume, snapshot, move, delete, route, timeouts).
 *
 * Lifecycle calls on one sandbox are serialized by a lease on its row
 * (op, op_until), taken with one conditional UPDATE: a second call while one is
 * running gets 409 "busy", on one replica or several. Every generation bump and
 * placement change is one transaction that also queues the install message.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <sodium.h>

#include "log.h"
#include "cap.h"
#include "channel.h"
#include "cp.h"
#include "spaced_error.h"
#include "netpolicy.h"
#include "identity.h"
#include "util.h"

json_t *cp_error(const char *code, const char *msg)
{
	return json_pack("{s:s,s:s}", "error", code, "message", msg);
}

void cp_random_name(char out[SPACED_NAME_MAX], const char *prefix)
{
	uint8_t rnd[8];
	randombytes_buf(rnd, sizeof rnd);
	int n = snprintf(out, SPACED_NAME_MAX, "%s", prefix);
	for (size_t i = 0; i < sizeof rnd && n + 2 < SPACED_NAME_MAX; i++)
		n += snprintf(out + n, (size_t)(SPACED_NAME_MAX - n), "%02x", rnd[i]);
}

/* ---- API keys and tenants ---- */

static const char *role_name(enum cp_role role)
{
	return role == CP_ROLE_ADMIN ? "admin" : role == CP_ROLE_JOIN ? "join" : role == CP_ROLE_WORKER ? "worker" : "tenant";
}

static void key_hash(const char *key, char hex[65])
{
	uint8_t h[32];
	crypto_generichash(h, sizeof h, (const uint8_t *)key, strlen(key), NULL, 0);
	sodium_bin2hex(hex, 65, h, sizeof h);
}

int cp_key_create(struct cp_store *st, enum cp_role role, const char *owner, int64_t expires, char **key)
{
	uint8_t secret[32], idb[8];
	char id[17], sec[44], hash[65], now[24], exp[24];
	randombytes_buf(idb, sizeof idb);
	randombytes_buf(secret, sizeof secret);
	sodium_bin2hex(id, sizeof id, idb, sizeof idb);
	spaced_b64url_encode(sec, secret, sizeof secret);
	size_t n = 4 + 16 + 1 + 43 + 1;
	char *k = malloc(n);
	if (k == NULL)
		return SPACED_ENOMEM;
	snprintf(k, n, "spk_%s_%s", id, sec);
	key_hash(k, hash);
	sodium_memzero(secret, sizeof secret);
	sodium_memzero(sec, sizeof sec);
	int r = CP_Q(st, NULL, NULL,
	             "INSERT INTO api_keys (key_id, hash, role, tenant, created, expires) VALUES ($1, $2, $3, $4, $5, $6)",
	             id, hash, role_name(role), owner, cp_i64(now, spaced_now()), cp_i64(exp, expires));
	if (r < 0) {
		sodium_memzero(k, n);
		free(k);
		return r;
	}
	*key = k;
	return 0;
}

int cp_key_check(struct cp_store *st, const char *key, enum cp_role role, char owner[SPACED_NAME_MAX],
                 char key_id[SPACED_NAME_MAX])
{
	char id[17], hash[65];
	struct cp_rows *rows = NULL;
	int r = SPACED_EPERM;
	if (key == NULL || strlen(key) != 4 + 16 + 1 + 43 || strncmp(key, "spk_", 4) != 0 || key[20] != '_')
		return SPACED_EPERM;
	memcpy(id, key + 4, 16);
	id[16] = 0;
	for (int i = 0; i < 16; i++)
		if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f')))
			return SPACED_EPERM;
	if ((r = CP_Q(st, &rows, NULL, "SELECT hash, role, tenant, expires, used FROM api_keys WHERE key_id = $1",
	              id)) < 0)
		return r;
	r = SPACED_EPERM;
	key_hash(key, hash);
	const char *h = cp_rows_get(rows, 0, 0), *ro = cp_rows_get(rows, 0, 1), *t = cp_rows_get(rows, 0, 2);
	int64_t expires = cp_rows_i64(rows, 0, 3, 0), used = cp_rows_i64(rows, 0, 4, 0);
	if (h == NULL || ro == NULL || strlen(h) != 64 || !spaced_ct_eq(h, hash, 64) ||
	    strcmp(ro, role_name(role)) != 0 || (expires != 0 && expires <= spaced_now()) || used != 0)
		goto out;
	if (owner != NULL) {
		if (t == NULL || strlen(t) >= SPACED_NAME_MAX)
			goto out;
		strcpy(owner, t);
	}
	if (key_id != NULL)
		strcpy(key_id, id);
	r = 0;
out:
	cp_rows_free(rows);
	return r;
}

int cp_worker_auth(struct cp_store *st, const char *key, const char *worker)
{
	char owner[SPACED_NAME_MAX];
	int r = cp_key_check(st, key, CP_ROLE_WORKER, owner, NULL);
	if (r < 0)
		return r;
	return strcmp(owner, worker) == 0 ? 0 : SPACED_EPERM;
}

int cp_tenant_create(struct cp_store *st, const char *name, char id[SPACED_NAME_MAX])
{
	char tid[SPACED_NAME_MAX], now[24];
	cp_random_name(tid, "ten-");
	int r = CP_Q(st, NULL, NULL, "INSERT INTO tenants (id, name, created) VALUES ($1, $2, $3)", tid, name,
	             cp_i64(now, spaced_now()));
	if (r == 0)
		strcpy(id, tid);
	return r;
}

/* ---- outbox and acks ---- */

int cp_install_failed(int r, json_t **body)
{
	if (r == SPACED_ETOOBIG) {
		char m[256];
		snprintf(m, sizeof m,
		         "the sandbox's install would be larger than a worker takes (%u KiB): its environment, metadata, "
		         "template configuration or egress policy is too large",
		         CP_CHAN_MSG_MAX / 1024u);
		*body = cp_error("too-large", m);
		return 413;
	}
	*body = cp_error("internal", spaced_strerror(r));
	return r == SPACED_EBUSY ? 503 : 500;
}

int cp_outbox_push(struct cp_store *st, const char *worker, json_t *msg, int64_t *seq)
{
	struct cp_rows *rows = NULL;
	char sb[24], now[24];
	char *text = NULL;
	int r = CP_Q(st, &rows, NULL, "UPDATE workers SET next_seq = next_seq + 1 WHERE id = $1 RETURNING next_seq",
	             worker);
	if (r < 0)
		goto out;
	int64_t s = cp_rows_i64(rows, 0, 0, -1);
	if (s < 1) {
		r = SPACED_ENOENT;
		goto out;
	}
	/* {"seq": N, "type": …, …}: seq first, as docs/control-messages.md shows it */
	json_t *full = json_pack("{s:I}", "seq", (json_int_t)s);
	if (full == NULL || json_object_update(full, msg) < 0 ||
	    (text = json_dumps(full, JSON_COMPACT | JSON_PRESERVE_ORDER)) == NULL) {
		json_decref(full);
		r = SPACED_ENOMEM;
		goto out;
	}
	json_decref(full);
	if (strlen(text) > CP_CHAN_MSG_MAX) {
		r = SPACED_ETOOBIG;
		goto out;
	}
	/* the sandbox it is about: {"sandbox": …} or its identity's */
	const char *about = json_string_value(json_object_get(msg, "sandbox"));
	if (about == NULL)
		about = json_string_value(json_object_get(json_object_get(msg, "identity"), "sandbox"));
	r = CP_Q(st, NULL, NULL,
	         "INSERT INTO outbox (worker, seq, type, body, created, sandbox) VALUES ($1, $2, $3, $4, $5, $6)", worker,
	         cp_i64(sb, s), json_string_value(json_object_get(msg, "type")), text, cp_i64(now, spaced_now()), about);
	if (r == 0)
		*seq = s;
out:
	free(text);
	cp_rows_free(rows);
	return r;
}

/* Whether lease (a sandbox's op column) is one of op's: cp_op_simple names
 * its leases "<op>.<random>@<replica>". */
static bool lease_is(const char *lease, const char *op)
{
	size_t n = strlen(op);
	return lease != NULL && strncmp(lease, op, n) == 0 && lease[n] == '.';
}

/* The lease held by this request thread, renewed while it waits for acks so a
 * long operation never outlives its lease. */
static _Thread_local struct {
	char id[SPACED_NAME_MAX];
	char op[SPACED_NAME_MAX];
	uint64_t renewed;
} held;

static void lease_renew(struct cp *cp, struct cp_store *st)
{
	char until[24];
	if (held.id[0] == 0 || spaced_mono_ns() - held.renewed < 1000000000u)
		return;
	held.renewed = spaced_mono_ns();
	CP_Q(st, NULL, NULL, "UPDATE sandboxes SET op_until = $3 WHERE id = $1 AND op = $2", held.id, held.op,
	     cp_i64(until, spaced_now() + cp->op_lease));
}

static void lease_hold(const char *id, const char *op)
{
	snprintf(held.id, sizeof held.id, "%s", id ? id : "");
	snprintf(held.op, sizeof held.op, "%s", op ? op : "");
	held.renewed = spaced_mono_ns();
}

int cp_wait_ack(struct cp *cp, struct cp_store *st, const char *worker, int64_t seq, int timeout_ms,
                int *ok, char **result)
{
	char sb[24];
	uint64_t deadline = spaced_mono_ns() + (uint64_t)timeout_ms * 1000000u;
	cp_i64(sb, seq);
	for (;;) {
		struct cp_rows *rows = NULL;
		/* an ack handed over between the look below and the wait is not
		 * missed: cp_acks_wait looks again under its lock */
		if (cp_acks_get(cp, worker, seq, ok, result))
			return 0; /* handed over in memory on this replica */
		int r = CP_Q(st, &rows, NULL, "SELECT acked, ok, result FROM outbox WHERE worker = $1 AND seq = $2",
		             worker, sb);
		if (r < 0)
			return r;
		if (cp_rows_i64(rows, 0, 0, 0) > 0) {
			const char *res = cp_rows_get(rows, 0, 2);
			char *copy = res ? strdup(res) : NULL;
			*ok = cp_rows_i64(rows, 0, 1, 0) == 1;
			*result = copy;
			cp_rows_free(rows);
			return 0;
		}
		cp_rows_free(rows);
		lease_renew(cp, st);
		uint64_t now = spaced_mono_ns();
		if (now >= deadline || cp->stopping)
			return SPACED_ETIMEDOUT;
		/* the store again at least every 50 ms: another replica's channel
		 * may have recorded it */
		uint64_t wait = deadline - now;
		if (wait > 50000000u)
			wait = 50000000u;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += (long)wait;
		while (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		cp_acks_wait(cp, worker, seq, &ts);
	}
}

int cp_record_ack(struct cp *cp, struct cp_store *st, const char *worker, const struct cp_chan_msg *m)
{
	char *res = NULL;
	const char *store_res = m->result;
	(void)st; /* written by acks.c's own thread: the channels never wait for the store */
	if (!m->ok) {
		json_t *e = json_pack("{s:s,s:s}", "code", m->code[0] ? m->code : "failed", "error", m->error);
		res = e ? json_dumps(e, JSON_COMPACT) : NULL;
		json_decref(e);
		store_res = res;
	}
	cp_acks_put(cp, worker, m->seq, m->ok, store_res);
	free(res);
	return 0;
}

/* ---- keys ---- */

static int bundle_bump(struct cp_store *st, int64_t *version)
{
	struct cp_rows *rows = NULL;
	int r = CP_Q0(st, NULL, NULL, "INSERT INTO meta (k, v) VALUES ('bundle_version', '0') ON CONFLICT (k) DO NOTHING");
	if (r == 0)
		r = CP_Q0(st, &rows, NULL,
		          "UPDATE meta SET v = CAST(CAST(v AS BIGINT) + 1 AS TEXT) WHERE k = 'bundle_version' RETURNING v");
	if (r == 0 && version != NULL)
		*version = cp_rows_i64(rows, 0, 0, 0);
	cp_rows_free(rows);
	return r;
}

json_t *cp_bundle(struct cp_store *st)
{
	struct cp_rows *rows = NULL, *ver = NULL;
	char now[24];
	json_t *keys = json_array(), *b = NULL;
	if (keys == NULL)
		return NULL;
	if (CP_Q(st, &rows, NULL,
	         "SELECT pub, kid, not_before, not_after FROM signing_keys WHERE not_after >= $1 ORDER BY created, kid",
	         cp_i64(now, spaced_now())) < 0 ||
	    CP_Q0(st, &ver, NULL, "SELECT v FROM meta WHERE k = 'bundle_version'") < 0)
		goto out;
	for (int i = 0; i < rows->nrows; i++) {
		char nb[21], na[21];
		if (spaced_time_format(cp_rows_i64(rows, i, 2, 0), nb) < 0 ||
		    spaced_time_format(cp_rows_i64(rows, i, 3, 0), na) < 0)
			goto out;
		json_array_append_new(keys, json_pack("{s:s,s:s,s:s,s:s}", "key", cp_rows_get(rows, i, 0), "kid",
		                                      cp_rows_get(rows, i, 1), "not_before", nb, "not_after", na));
	}
	b = json_pack("{s:I,s:O}", "version", (json_int_t)cp_rows_i64(ver, 0, 0, 0), "keys", keys);
out:
	json_decref(keys);
	cp_rows_free(rows);
	cp_rows_free(ver);
	return b;
}

int cp_push_bundle(struct cp_store *st, const char *worker)
{
	int64_t seq;
	json_t *b = cp_bundle(st);
	json_t *msg = b ? json_pack("{s:s,s:o}", "type", "keys", "bundle", b) : NULL;
	int r = msg ? cp_outbox_push(st, worker, msg, &seq) : SPACED_ENOMEM;
	json_decref(msg);
	return r;
}

/* Queues the bundle to every worker; the seq of each push goes to seqs (may be NULL). */
static int push_bundle_all(struct cp_store *st, json_t *seqs)
{
	struct cp_rows *w = NULL;
	int r = CP_Q0(st, &w, NULL, "SELECT id FROM workers ORDER BY id");
	for (int i = 0; r == 0 && i < w->nrows; i++) {
		int64_t seq;
		json_t *b = cp_bundle(st);
		json_t *msg = b ? json_pack("{s:s,s:o}", "type", "keys", "bundle", b) : NULL;
		r = msg ? cp_outbox_push(st, cp_rows_get(w, i, 0), msg, &seq) : SPACED_ENOMEM;
		json_decref(msg);
		if (r == 0 && seqs != NULL)
			json_object_set_new(seqs, cp_rows_get(w, i, 0), json_integer(seq));
	}
	cp_rows_free(w);
	return r;
}

static int signer_keys(struct cp *cp, json_t **keys)
{
	char *ans = NULL;
	json_error_t jerr;
	int r = cp_signer_ask(cp, 'K', NULL, &ans);
	if (r < 0)
		return r;
	json_t *o = json_loads(ans, JSON_REJECT_DUPLICATES, &jerr);
	free(ans);
	if (o == NULL || !json_is_array(json_object_get(o, "keys"))) {
		json_decref(o);
		return SPACED_EPROTO;
	}
	*keys = o;
	return 0;
}

/* Inserts the signer's keys missing from the store; *changed counts them. */
static int keys_insert(struct cp_store *st, json_t *keys, int *changed)
{
	json_t *v;
	size_t i;
	char nb[24], na[24], now[24], af[24];
	int64_t t = spaced_now();
	json_array_foreach(json_object_get(keys, "keys"), i, v) {
		long ch = 0;
		const char *state = json_string_value(json_object_get(v, "state"));
		int active = state != NULL && strcmp(state, "active") == 0;
		int r = CP_Q(st, NULL, &ch,
		             "INSERT INTO signing_keys (kid, pub, not_before, not_after, active_from, created) "
		             "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (kid) DO NOTHING",
		             json_string_value(json_object_get(v, "kid")), json_string_value(json_object_get(v, "key")),
		             cp_i64(nb, t - 60), cp_i64(na, t + CP_KEY_FAR), cp_i64(af, active ? t : 0), cp_i64(now, t));
		if (r < 0)
			return r;
		*changed += (int)ch;
	}
	return 0;
}

int cp_keys_sync(struct cp *cp, struct cp_store *st)
{
	json_t *keys = NULL;
	int changed = 0;
	int r = signer_keys(cp, &keys);
	if (r < 0)
		return r;
	if ((r = cp_store_begin(st)) < 0)
		goto out;
	if ((r = keys_insert(st, keys, &changed)) < 0)
		goto out;
	if (changed > 0 && ((r = bundle_bump(st, NULL)) < 0 || (r = push_bundle_all(st, NULL)) < 0))
		goto out;
	r = cp_store_commit(st);
out:
	if (r < 0)
		cp_store_rollback(st);
	json_decref(keys);
	return r;
}

static const char *key_in_state(json_t *keys, const char *state)
{
	json_t *v;
	size_t i;
	json_array_foreach(json_object_get(keys, "keys"), i, v) {
		const char *s = json_string_value(json_object_get(v, "state"));
		if (s != NULL && strcmp(s, state) == 0)
			return json_string_value(json_object_get(v, "kid"));
	}
	return NULL;
}

/* The rotation's two transactions. On PostgreSQL another transaction that
 * takes the same rows in another order (an install's outbox and worker rows)
 * may deadlock with one: the server aborts one of the two (SPACED_EBUSY), and
 * the rotation's is run again, a few times. */
#define ROTATE_TRIES 5

static int rotate_publish(struct cp_store *st, json_t *after, json_t *seqs)
{
	int changed = 0, r;
	if ((r = cp_store_begin(st)) < 0)
		return r;
	if ((r = keys_insert(st, after, &changed)) < 0 || (r = bundle_bump(st, NULL)) < 0 ||
	    (r = push_bundle_all(st, seqs)) < 0 || (r = cp_store_commit(st)) < 0)
		cp_store_rollback(st);
	return r;
}

static int rotate_activate(struct cp_store *st, const char *pending, const char *old, int64_t t, int64_t *version)
{
	char now[24], until[24];
	int r;
	if ((r = cp_store_begin(st)) < 0)
		return r;
	if ((r = CP_Q(st, NULL, NULL, "UPDATE signing_keys SET active_from = $2 WHERE kid = $1", pending,
	              cp_i64(now, t))) < 0 ||
	    (old[0] && (r = CP_Q(st, NULL, NULL, "UPDATE signing_keys SET not_after = $2 WHERE kid = $1", old,
	                         cp_i64(until, t + SPACED_CAP_LIFETIME + SPACED_CAP_SKEW))) < 0) ||
	    (r = bundle_bump(st, version)) < 0 || (r = push_bundle_all(st, NULL)) < 0 || (r = cp_store_commit(st)) < 0)
		cp_store_rollback(st);
	return r;
}

int cp_keys_rotate(struct cp *cp, struct cp_store *st, json_t **answer)
{
	json_t *before = NULL, *after = NULL, *seqs = json_object(), *late = json_array();
	char *ans = NULL, old[SPACED_PASERK_PID_LEN + 1] = "", pending[SPACED_PASERK_PID_LEN + 1];
	int r;
	int64_t version = 0;
	if (seqs == NULL || late == NULL) {
		r = SPACED_ENOMEM;
		goto out;
	}
	if ((r = signer_keys(cp, &before)) < 0)
		goto out;
	if (key_in_state(before, "active") != NULL)
		snprintf(old, sizeof old, "%s", key_in_state(before, "active"));
	if ((r = cp_signer_ask(cp, 'R', NULL, &ans)) < 0 || (r = signer_keys(cp, &after)) < 0)
		goto out;
	if (key_in_state(after, "pending") == NULL) {
		r = SPACED_EPROTO;
		goto out;
	}
	snprintf(pending, sizeof pending, "%s", key_in_state(after, "pending"));
	/* 1. the new key joins the bundle and goes to every worker */
	for (int i = 0; (r = rotate_publish(st, after, seqs)) == SPACED_EBUSY && i < ROTATE_TRIES; i++)
		usleep(10000u << i);
	if (r < 0)
		goto out;
	cp_wake(cp);
	/* 2. every connected worker acknowledges it before the signer may use it */
	struct cp_rows *live = NULL;
	/* the connected ones: a worker without a channel receives the bundle first
	 * thing on reconnection (replay in seq order) and until then refuses the
	 * new key's tokens as unknown (fail closed) */
	if ((r = CP_Q0(st, &live, NULL, "SELECT id, channel_until FROM workers")) < 0)
		goto out;
	int64_t t_live = spaced_now();
	for (int i = 0; i < live->nrows; i++) {
		const char *w = cp_rows_get(live, i, 0);
		if (!cp_worker_live(w, cp_rows_i64(live, i, 1, 0), t_live))
			continue;
		int ok = 0;
		char *res = NULL;
		json_t *s = json_object_get(seqs, w);
		if (s == NULL || cp_wait_ack(cp, st, w, json_integer_value(s), cp->ack_timeout_ms, &ok, &res) < 0 || !ok)
			json_array_append_new(late, json_string(w));
		free(res);
	}
	cp_rows_free(live);
	if (json_array_size(late) > 0) {
		*answer = json_pack("{s:s,s:s,s:s,s:O}", "error", "keys-not-acked", "message",
		                    "the new key did not reach every live worker; it stays unused", "pending", pending,
		                    "workers", late);
		r = SPACED_ETIMEDOUT;
		goto out;
	}
	/* 3. activate; the old key stays in the bundle until its last token expired */
	free(ans);
	ans = NULL;
	if ((r = cp_signer_ask(cp, 'A', pending, &ans)) < 0)
		goto out;
	int64_t t = spaced_now();
	for (int i = 0; (r = rotate_activate(st, pending, old, t, &version)) == SPACED_EBUSY && i < ROTATE_TRIES; i++)
		usleep(10000u << i);
	if (r < 0)
		goto out;
	cp_wake(cp);
	char vu[21];
	spaced_time_format(t + SPACED_CAP_LIFETIME + SPACED_CAP_SKEW, vu);
	*answer = json_pack("{s:s,s:s?,s:s,s:I}", "active", pending, "retired", old[0] ? old : NULL,
	                    "retired_valid_until", vu, "bundle_version", (json_int_t)version);
	r = 0;
out:
	free(ans);
	json_decref(before);
	json_decref(after);
	json_decref(seqs);
	json_decref(late);
	return r;
}

/* ---- sandboxes ---- */

static void sleep_until_ns(uint64_t deadline)
{
	for (uint64_t t = spaced_mono_ns(); t < deadline; t = spaced_mono_ns()) {
		struct timespec ts = {(time_t)((deadline - t) / 1000000000u), (long)((deadline - t) % 1000000000u)};
		nanosleep(&ts, NULL);
	}
}

static unsigned recent_slot(const char *sandbox)
{
	return spaced_fnv1a(sandbox) % CP_RECENT_ROUTES;
}

static void recent_route_note(struct cp *cp, const char *sandbox)
{
	unsigned i = recent_slot(sandbox);
	pthread_mutex_lock(&cp->recent_mu);
	snprintf(cp->recent_routes[i].sandbox, sizeof cp->recent_routes[i].sandbox, "%s", sandbox);
	cp->recent_routes[i].at_ns = spaced_mono_ns();
	pthread_mutex_unlock(&cp->recent_mu);
}

/* When this replica last issued sandbox a route (monotonic ns), or 0. */
static uint64_t recent_route_at(struct cp *cp, const char *sandbox)
{
	unsigned i = recent_slot(sandbox);
	uint64_t at = 0;
	pthread_mutex_lock(&cp->recent_mu);
	if (strcmp(cp->recent_routes[i].sandbox, sandbox) == 0)
		at = cp->recent_routes[i].at_ns;
	pthread_mutex_unlock(&cp->recent_mu);
	return at;
}

#define SBX_COLS                                                                                          \
	"id, tenant, state, generation, worker, substrate, activation, spec, snapshot, op, op_until, last_error, " \
	"created, last_active, idle_timeout, max_lifetime, install_seq, snapshot_hash, snapshot_bytes, "        \
	"cpu_milli, memory_bytes, pids, disk_bytes, restarts, restarts_since"
enum { C_ID, C_TENANT, C_STATE, C_GEN, C_WORKER, C_SUBSTRATE, C_ACT, C_SPEC, C_SNAP, C_OP, C_OPUNTIL,
       C_LASTERR, C_CREATED, C_ACTIVE, C_IDLE, C_MAXLIFE, C_INSTSEQ, C_SNAPHASH, C_SNAPBYTES, C_CPU, C_MEM,
       C_PIDS, C_DISK, C_RESTARTS, C_RESTARTS_SINCE };

struct sbx {
	struct cp_rows *rows;
	int r;
};

static const char *col(const struct sbx *s, int c)
{
	return cp_rows_get(s->rows, s->r, c);
}

/* The limits the sandbox runs under (its columns; 0: the worker's default). */
static void resources_of(const struct sbx *s, struct spaced_resources *r)
{
	r->cpu_milli = (uint32_t)cp_rows_i64(s->rows, s->r, C_CPU, 0);
	r->memory_bytes = (uint64_t)cp_rows_i64(s->rows, s->r, C_MEM, 0);
	r->pids = (uint64_t)cp_rows_i64(s->rows, s->r, C_PIDS, 0);
	r->disk_bytes = (uint64_t)cp_rows_i64(s->rows, s->r, C_DISK, 0);
}

static int identity_of(const struct sbx *s, struct spaced_identity *id)
{
	if (col(s, C_WORKER) == NULL)
		return SPACED_ENOENT;
	return spaced_identity_set(id, col(s, C_ID), (uint64_t)cp_rows_i64(s->rows, s->r, C_GEN, 0),
	                           col(s, C_WORKER), col(s, C_SUBSTRATE), col(s, C_ACT), NULL);
}

static json_t *sbx_json(const struct sbx *s)
{
	struct spaced_identity id;
	json_error_t jerr;
	json_t *route = identity_of(s, &id) == 0 ? spaced_identity_to_json(&id) : json_null();
	json_t *spec = json_loads(col(s, C_SPEC), JSON_REJECT_DUPLICATES, &jerr);
	char created[21] = "", active[21] = "";
	spaced_time_format(cp_rows_i64(s->rows, s->r, C_CREATED, 0), created);
	spaced_time_format(cp_rows_i64(s->rows, s->r, C_ACTIVE, 0), active);
	const char *op = col(s, C_OP);
	char opname[32] = "";
	if (op != NULL && cp_rows_i64(s->rows, s->r, C_OPUNTIL, 0) >= spaced_now())
		snprintf(opname, sizeof opname, "%.*s", (int)strcspn(op, "."), op);
	json_t *j = json_pack("{s:s,s:s,s:I,s:o,s:s?,s:s,s:o,s:s?,s:s?,s:s?,s:s,s:s,s:I,s:I}", "id", col(s, C_ID),
	                 "state", col(s, C_STATE), "generation", (json_int_t)cp_rows_i64(s->rows, s->r, C_GEN, 0),
	                 "route", route ? route : json_null(), "worker", col(s, C_WORKER), "substrate",
	                 col(s, C_SUBSTRATE), "spec", spec ? spec : json_object(), "snapshot", col(s, C_SNAP),
	                 "operation", opname[0] ? opname : NULL, "last_error", col(s, C_LASTERR), "created", created,
	                 "last_active", active, "idle_timeout", (json_int_t)cp_rows_i64(s->rows, s->r, C_IDLE, 0),
	                 "max_lifetime", (json_int_t)cp_rows_i64(s->rows, s->r, C_MAXLIFE, 0));
	if (j != NULL) {
		struct spaced_resources res;
		resources_of(s, &res);
		json_object_set_new(j, "resources", spaced_resources_to_json(&res));
		json_t *sp = json_object_get(j, "spec"), *t = json_object_get(sp, "template"), *md = json_object_get(sp, "metadata");
		json_object_set_new(j, "template", json_is_object(t) ? json_incref(json_object_get(t, "name")) : json_null());
		json_object_set_new(j, "metadata", json_is_object(md) ? json_incref(md) : json_object());
		json_object_set_new(j, "auto_resume", json_boolean(json_is_true(json_object_get(sp, "auto_resume"))));
		json_t *rp = json_object_get(sp, "restart");
		json_object_set_new(j, "restart", json_string(json_is_string(rp) ? json_string_value(rp) : "never"));
		json_object_set_new(j, "restarts", json_integer(cp_rows_i64(s->rows, s->r, C_RESTARTS, 0)));
		json_t *net = json_object_get(json_object_get(j, "spec"), "network");
		json_object_set_new(j, "network", json_is_object(net) ? json_incref(net) : cp_network_or_default(""));
	}
	if (j != NULL && col(s, C_SNAP) != NULL) {
		const char *h = col(s, C_SNAPHASH);
		json_object_set_new(j, "snapshot_hash", h ? json_string(h) : json_null());
		json_object_set_new(j, "snapshot_bytes", json_integer(cp_rows_i64(s->rows, s->r, C_SNAPBYTES, 0)));
	}
	return j;
}

/* Loads one sandbox of tenant; ENOENT for a missing one and for another tenant's alike. */
static int sbx_load(struct cp_store *st, const char *tenant, const char *id, struct sbx *out)
{
	struct cp_rows *rows = NULL;
	int r = CP_Q(st, &rows, NULL,
	             "SELECT " SBX_COLS " FROM sandboxes WHERE id = $1 AND tenant = $2 AND deleted = 0", id, tenant);
	if (r < 0)
		return r;
	if (rows->nrows != 1) {
		cp_rows_free(rows);
		return SPACED_ENOENT;
	}
	out->rows = rows;
	out->r = 0;
	return 0;
}

json_t *cp_sandbox_json(struct cp_store *st, const char *tenant, const char *id)
{
	struct sbx s;
	if (sbx_load(st, tenant, id, &s) < 0)
		return NULL;
	json_t *j = sbx_json(&s);
	cp_rows_free(s.rows);
	return j;
}

json_t *cp_sandbox_list(struct cp_store *st, const char *tenant);
json_t *cp_sandbox_list(struct cp_store *st, const char *tenant)
{
	struct cp_rows *rows = NULL;
	json_t *arr = json_array();
	if (arr == NULL ||
	    CP_Q(st, &rows, NULL, "SELECT " SBX_COLS " FROM sandboxes WHERE tenant = $1 AND deleted = 0 ORDER BY created, id",
	         tenant) < 0) {
		json_decref(arr);
		return NULL;
	}
	for (int i = 0; i < rows->nrows; i++) {
		struct sbx s = {rows, i};
		json_array_append_new(arr, sbx_json(&s));
	}
	cp_rows_free(rows);
	return arr;
}

static int set_state(struct cp_store *st, const char *id, const char *state, const char *err)
{
	char now[24];
	return CP_Q(st, NULL, NULL,
	            "UPDATE sandboxes SET state = $2, last_error = $3, last_active = $4, idle_paused = 0 WHERE id = $1", id,
	            state, err, cp_i64(now, spaced_now()));
}

/* An acknowledged operation moves the sandbox from state from to state to,
 * only from that state: an execution that ended while the acknowledgement was
 * on its way has made the sandbox 'failed' (cp_execution_ended), which stays. */
static int set_state_from(struct cp_store *st, const char *id, const char *from, const char *to)
{
	char now[24];
	return CP_Q(st, NULL, NULL,
	            "UPDATE sandboxes SET state = $3, last_error = NULL, last_active = $4, idle_paused = 0 "
	            "WHERE id = $1 AND state = $2",
	            id, from, to, cp_i64(now, spaced_now()));
}

/* A policy object from canonical JSON text, or the default policy ("" or unreadable). */
json_t *cp_network_or_default(const char *text)
{
	json_error_t jerr;
	json_t *j = text && text[0] ? json_loads(text, JSON_REJECT_DUPLICATES, &jerr) : NULL;
	if (j != NULL)
		return j;
	struct spaced_netpolicy p;
	spaced_netpolicy_default(&p);
	return spaced_netpolicy_to_json(&p);
}

/* Takes the sandbox's operation lease. 0, SPACED_ENOENT or SPACED_EBUSY. */
static int lease_take(struct cp *cp, struct cp_store *st, const char *tenant, const char *id, const char *op)
{
	char until[24], now[24];
	long ch = 0;
	int64_t t = spaced_now();
	int r = CP_Q(st, NULL, &ch,
	             "UPDATE sandboxes SET op = $3, op_until = $4 WHERE id = $1 AND tenant = $2 AND deleted = 0 "
	             "AND (op IS NULL OR op_until < $5)",
	             id, tenant, op, cp_i64(until, t + cp->op_lease), cp_i64(now, t));
	if (r < 0)
		return r;
	if (ch == 1)
		return 0;
	struct sbx s;
	if ((r = sbx_load(st, tenant, id, &s)) < 0)
		return r;
	cp_rows_free(s.rows);
	return SPACED_EBUSY;
}

static void lease_drop(struct cp_store *st, const char *id, const char *op)
{
	CP_Q(st, NULL, NULL, "UPDATE sandboxes SET op = NULL, op_until = 0 WHERE id = $1 AND op = $2", id, op);
}

struct placement {
	char worker[SPACED_NAME_MAX];
	char url[CP_URL_MAX];
	struct spaced_resources res; /* what was asked, the worker's defaults filled in */
};

/* Chooses a live worker with room for substrate whose maxima allow res (its
 * fields of 0 take that worker's defaults; want: a named worker or "";
 * exclude: NULL, or workers not to choose, a comma-separated list).
 * Returns 0, or an HTTP status with *err set. Runs inside the caller's transaction. */
static int place(struct cp_store *st, const char *substrate, const struct spaced_resources *res, const char *want,
                 const char *exclude, struct placement *out, json_t **err)
{
	struct cp_rows *rows = NULL;
	int best = -1, status = 503, over_limit = 0;
	int64_t best_free = 0;
	struct spaced_resources best_res = *res;
	/* what each worker's live sandboxes hold (store.h cp_store_worker_usage) */
	char sql[1024];
	snprintf(sql, sizeof sql,
	         "SELECT w.id, w.url, w.substrates, w.capacity, w.channel_until, COALESCE(u.sandboxes, 0), w.limits, "
	         "COALESCE(u.memory_bytes, 0), COALESCE(u.pids, 0) FROM workers w LEFT JOIN %s u ON u.worker = w.id "
	         "ORDER BY w.id",
	         cp_store_worker_usage(st));
	if (CP_Q0(st, &rows, NULL, sql) < 0) {
		*err = cp_error("store", "store unavailable");
		return 500;
	}
	/* live: the worker's control channel is open on a replica now (cp.h CP_CHAN_UNTIL_S) */
	int64_t now = spaced_now();
	for (int i = 0; i < rows->nrows; i++) {
		const char *id = cp_rows_get(rows, i, 0);
		if (want[0] && strcmp(id, want) != 0)
			continue;
		if (exclude != NULL && cp_list_has(exclude, id))
			continue;
		int64_t room = cp_rows_i64(rows, i, 3, 0) - cp_rows_i64(rows, i, 5, 0);
		/* its channel_until, or this replica's own channel to it (a held-up
		 * loop lets channel_until lapse while the channel is open) */
		if (!cp_worker_live(id, cp_rows_i64(rows, i, 4, 0), now)) {
			if (want[0]) {
				*err = cp_error("worker-unavailable", "the worker's control channel is not open");
				goto out;
			}
			continue;
		}
		if (!cp_list_has(cp_rows_get(rows, i, 2), substrate)) {
			if (want[0]) {
				status = 422;
				*err = cp_error("substrate-unsupported", "the worker does not offer this substrate");
				goto out;
			}
			continue;
		}
		/* the limits as this worker would run them; never above its maxima */
		struct cp_worker_limits lim;
		struct spaced_resources r = *res;
		cp_limits_from_text(cp_rows_get(rows, i, 6), &lim);
		if (lim.has) {
			spaced_resources_default(&r, &lim.def);
			const char *over = spaced_resources_exceeds(&r, &lim.max);
			if (over != NULL) {
				if (want[0]) {
					char m[160];
					snprintf(m, sizeof m, "%s is above the worker's maximum", over);
					status = 422;
					*err = cp_error("limit-exceeded", m);
					goto out;
				}
				over_limit++;
				continue;
			}
			/* what its sandboxes' limits may add up to (the worker refuses
			 * an install past it: placed elsewhere, or no room) */
			uint64_t used_mem = (uint64_t)cp_rows_i64(rows, i, 7, 0), used_pids = (uint64_t)cp_rows_i64(rows, i, 8, 0);
			if ((lim.alloc_pids && used_pids + r.pids > lim.alloc_pids) ||
			    (lim.alloc_memory &&
			     (double)(used_mem + r.memory_bytes) > (double)lim.alloc_memory * lim.memory_overcommit))
				room = 0;
		}
		if (room <= 0) {
			if (want[0]) {
				*err = cp_error("worker-full", "the worker has no room");
				goto out;
			}
			continue;
		}
		if (best < 0 || room > best_free) {
			best = i;
			best_free = room;
			best_res = r;
		}
	}
	if (best < 0) {
		if (want[0]) {
			status = 404;
			*err = cp_error("unknown-worker", "no such worker");
		} else if (over_limit > 0) {
			status = 422;
			*err = cp_error("limit-exceeded", "the resources asked for are above every live worker's maximum");
		} else {
			*err = cp_error("no-worker", "no live worker with room offers this substrate");
		}
		goto out;
	}
	snprintf(out->worker, sizeof out->worker, "%s", cp_rows_get(rows, best, 0));
	snprintf(out->url, sizeof out->url, "%s", cp_rows_get(rows, best, 1));
	out->res = best_res;
	status = 0;
out:
	cp_rows_free(rows);
	return status;
}

static json_t *identity_json_of(const char *sbx, int64_t gen, const char *worker, const char *substrate,
                                const char *act)
{
	struct spaced_identity id;
	if (spaced_identity_set(&id, sbx, (uint64_t)gen, worker, substrate, act, NULL) < 0)
		return NULL;
	return spaced_identity_to_json(&id);
}

/* Sends msg to worker in its own transaction and waits for the ack: at most
 * --ack-timeout, a snapshot --snapshot-timeout (its worker copies, hashes,
 * packs and uploads the sandbox's files: a minute for 200,000 of them; the
 * operation's lease is renewed meanwhile, cp_wait_ack).
 * Returns 0 (ok), SPACED_EPERM (refused; *why set), SPACED_ETIMEDOUT or a store error. */
static int push_wait(struct cp *cp, struct cp_store *st, const char *worker, json_t *msg, char **result,
                     char **why)
{
	const char *type = json_string_value(json_object_get(msg, "type"));
	int timeout_ms = cp->ack_timeout_ms;
	if (type && strcmp(type, "snapshot") == 0 && cp->snapshot_timeout_ms > timeout_ms)
		timeout_ms = cp->snapshot_timeout_ms;
	int64_t seq;
	int ok = 0, r;
	char *res = NULL;
	if ((r = cp_store_begin(st)) < 0)
		return r;
	if ((r = cp_outbox_push(st, worker, msg, &seq)) < 0 || (r = cp_store_commit(st)) < 0) {
		cp_store_rollback(st);
		return r;
	}
	cp_wake(cp);
	if ((r = cp_wait_ack(cp, st, worker, seq, timeout_ms, &ok, &res)) < 0)
		return r;
	if (!ok) {
		*why = res;
		return SPACED_EPERM;
	}
	if (result != NULL)
		*result = res;
	else
		free(res);
	return 0;
}

static int ack_status(int r, const char *what, char *why, json_t **body, char *errtext, size_t errsz)
{
	if (r == SPACED_ETIMEDOUT) {
		snprintf(errtext, errsz, "%s: the worker did not acknowledge in time", what);
		*body = cp_error("worker-timeout", errtext);
		return 504;
	}
	if (r == SPACED_EPERM) {
		/* why is the worker's {"code","error"}: its code is passed on as worker_code */
		json_error_t jerr;
		json_t *w = why ? json_loads(why, JSON_REJECT_DUPLICATES, &jerr) : NULL;
		const char *wc = json_string_value(json_object_get(w, "code"));
		const char *we = json_string_value(json_object_get(w, "error"));
		if (wc != NULL)
			snprintf(errtext, errsz, "%s: the worker refused (%s): %s", what, wc, we ? we : "");
		else
			snprintf(errtext, errsz, "%s: the worker refused: %s", what, why ? why : "");
		*body = cp_error("worker-refused", errtext);
		if (*body != NULL && wc != NULL)
			json_object_set_new(*body, "worker_code", json_string(wc));
		json_decref(w);
		return 502;
	}
	snprintf(errtext, errsz, "%s: %s", what, spaced_strerror(r));
	*body = cp_error("internal", errtext);
	return 500;
}

/* Installs a new generation (or a new activation of the current one when
 * same_gen) of sandbox s on worker p and waits for the ack. release_op: the
 * lease op released with the state once the worker acknowledged (NULL:
 * none). */
struct start_opts {
	const char *release_op;
};

static int finish_start(struct cp *cp, struct cp_store *st, const char *id, const char *worker, int64_t seq,
                        const char *release_op, bool call_off, bool fetch, json_t **body);

static int start_execution_in(struct cp *cp, struct cp_store *st, const struct sbx *s, const struct placement *p,
                              const char *snapshot, const char *snapshot_hash, int same_gen,
                              const struct start_opts *so, json_t **body);

/* ---- at most one execution: an earlier worker confirms first (I2) ----
 * A worker that was sent a message about a sandbox (an install, a pause, a
 * deactivate, a destroy) and has not acknowledged it may still run an
 * earlier execution of it: cut off from the control plane, it keeps serving
 * what it runs and the capabilities it was given. So a new generation
 * starts on another worker, and a deleted sandbox stops counting against
 * its tenant's quotas, only once every such worker has acknowledged what it
 * was sent (refused counts: it answered), has fenced itself (its hello said
 * it freezes everything and refuses every capability after fence_after
 * seconds without the control plane: not connected, and last seen more than
 * fence_after + CP_FENCE_MARGIN_S ago), or an operator declared it lost
 * (spaced-cp admin worker-lost: the machine is gone), which holds until it
 * says hello again. */

/* The workers other than except (NULL: any) with a message about sandbox id
 * they have not acknowledged, each judged:
 *  - one whose last execution of it is known stopped (it acknowledged a
 *    deactivate or destroy after its last install or thaw) and that was sent
 *    nothing since but more of those (a move's source, retired) holds
 *    nothing back;
 *  - one declared lost, or surely fenced — its hello said fence_after S,
 *    it is not connected (on any replica, nor here), and it was last seen
 *    more than S + CP_FENCE_MARGIN_S ago — holds nothing back either, but is
 *    to be told to destroy what it holds (skipped, when not NULL: its name
 *    appended, comma-separated);
 *  - any other holds the start back.
 * Returns 1 with the first holding worker in who (whether it is connected
 * in *live, the seconds until it is surely fenced in *fenced_in, -1: never),
 * 0 when none holds it, or a store error. When the holding worker is
 * connected as the wait begins (it acknowledges in order, in moments; an ack
 * reaches the store a moment after the request that waits for it; its
 * channel may drop and come back meanwhile), looks again every 20 ms for up
 * to wait_ms. */
static int unconfirmed_worker(struct cp *cp, struct cp_store *st, const char *id, const char *except,
                              const char *except2, int wait_ms, char who[SPACED_NAME_MAX], bool *live,
                              int64_t *fenced_in, char *skipped, size_t skipped_sz)
{
	uint64_t deadline = spaced_mono_ns() + (uint64_t)wait_ms * 1000000u;
	bool first = true, was_live = false;
	for (;;) {
		struct cp_rows *rows = NULL;
		int64_t t = spaced_now();
		int r = CP_Q(st, &rows, NULL,
		             "SELECT o.worker, w.channel_until, w.last_seen, w.fence_after, w.lost, "
		             "SUM(CASE WHEN o.type IN ('deactivate', 'destroy') THEN 0 ELSE 1 END), "
		             "(SELECT MAX(d.seq) FROM outbox d WHERE d.sandbox = $1 AND d.worker = o.worker AND d.acked > 0 "
		             "AND d.ok = 1 AND d.type IN ('deactivate', 'destroy')), "
		             "(SELECT MAX(i.seq) FROM outbox i WHERE i.sandbox = $1 AND i.worker = o.worker "
		             "AND i.type IN ('install', 'thaw')) "
		             "FROM outbox o JOIN workers w ON w.id = o.worker "
		             "WHERE o.sandbox = $1 AND o.acked = 0 AND o.worker <> $2 AND o.worker <> $3 "
		             "GROUP BY o.worker, w.channel_until, w.last_seen, w.fence_after, w.lost ORDER BY o.worker",
		             id, except ? except : "", except2 ? except2 : "");
		if (skipped != NULL && skipped_sz > 0)
			skipped[0] = 0;
		int holds = 0;
		for (int i = 0; r == 0 && i < rows->nrows; i++) {
			const char *w = cp_rows_get(rows, i, 0);
			int64_t stopped = cp_rows_i64(rows, i, 6, 0), started = cp_rows_i64(rows, i, 7, 0);
			if (w == NULL || (cp_rows_i64(rows, i, 5, 1) == 0 && stopped > started))
				continue; /* stopped there; only its cleanup is on its way */
			bool connected = cp_worker_live(w, cp_rows_i64(rows, i, 1, 0), t);
			int64_t fa = cp_rows_i64(rows, i, 3, 0), fenced_at = cp_rows_i64(rows, i, 2, 0) + fa + CP_FENCE_MARGIN_S;
			size_t n = skipped ? strlen(skipped) : 0;
			if ((cp_rows_i64(rows, i, 4, 0) > 0 || (fa > 0 && !connected && fenced_at < t)) &&
			    (skipped == NULL || n + strlen(w) + 2 < skipped_sz)) {
				if (skipped != NULL) /* else (no room to name it) it holds the start back */
					snprintf(skipped + n, skipped_sz - n, "%s%s", n ? "," : "", w);
				continue;
			}
			if (!holds) {
				holds = 1;
				snprintf(who, SPACED_NAME_MAX, "%s", w);
				*live = connected;
				*fenced_in = fa > 0 ? (fenced_at + 1 - t > 0 ? fenced_at + 1 - t : 1) : -1;
			}
		}
		cp_rows_free(rows);
		if (r < 0)
			return r;
		/* one connected when the wait began may reconnect meanwhile (its
		 * channel dropped and replayed): waited for up to the end */
		if (first)
			was_live = holds && *live;
		first = false;
		if (!holds || !was_live || spaced_mono_ns() >= deadline || cp->stopping)
			return holds;
		lease_renew(cp, st);
		usleep(20000);
	}
}

/* 0 when no worker but except may still run an earlier execution of id
 * (skipped, when not NULL: the fenced or lost ones to tell to destroy it);
 * else 409 (or 500) with *body naming the worker. */
static int earlier_confirmed(struct cp *cp, struct cp_store *st, const char *id, const char *except,
                             const char *except2, char *skipped, size_t skipped_sz, json_t **body)
{
	char who[SPACED_NAME_MAX], m[480], when[96] = "";
	bool live = false;
	int64_t fenced_in = -1;
	int r = unconfirmed_worker(cp, st, id, except, except2, cp->ack_timeout_ms, who, &live, &fenced_in, skipped,
	                           skipped_sz);
	if (r == 0)
		return 0;
	if (r < 0) {
		*body = cp_error("store", spaced_strerror(r));
		return 500;
	}
	if (!live && fenced_in > 0)
		snprintf(when, sizeof when, ", or in %lld s, when that worker has surely fenced itself", (long long)fenced_in);
	snprintf(m, sizeof m,
	         "worker %s has not confirmed that the sandbox's earlier execution stopped (%s); it starts "
	         "elsewhere once %s acknowledges%s, or once an operator declares that worker lost",
	         who, live ? "it is still applying what it was sent" : "it is not connected", who, when);
	*body = json_pack("{s:s,s:s,s:s}", "error", "earlier-execution-unconfirmed", "message", m, "worker", who);
	if (*body != NULL && !live && fenced_in > 0)
		json_object_set_new(*body, "retry_after", json_integer(fenced_in));
	spaced_log("spaced-cp", "level=warn event=start-held sandbox=%s worker=%s connected=%d", id, who, live);
	return 409;
}

static int start_execution(struct cp *cp, struct cp_store *st, const struct sbx *s, const struct placement *p,
                           const char *snapshot, const char *snapshot_hash, int same_gen, json_t **body)
{
	static const struct start_opts none;
	return start_execution_in(cp, st, s, p, snapshot, snapshot_hash, same_gen, &none, body);
}

/* The spec an install carries: the stored spec_text with the limits
 * placement resolved for p's worker, the tenant, where the worker fetches
 * the template, and the snapshot (named where the store is now; *snapshot
 * then points into snap_url) with its hash. NULL when spec_text does not
 * parse or memory runs out. */
static json_t *install_spec(struct cp *cp, const char *spec_text, const char *tenant, const struct placement *p,
                            const char **snapshot, const char *snapshot_hash, char snap_url[CP_URL_MAX + 256])
{
	json_error_t jerr;
	json_t *spec = spec_text ? json_loads(spec_text, JSON_REJECT_DUPLICATES, &jerr) : NULL;
	if (spec == NULL)
		return NULL;
	/* the limits it runs under, as placement resolved them for this worker */
	json_object_set_new(spec, "resources", spaced_resources_to_json(&p->res));
	/* whose it is: a worker shares its streams between tenants */
	if (tenant)
		json_object_set_new(spec, "tenant", json_string(tenant));
	/* where the worker fetches its template (the store's address of now) */
	cp_template_locate(cp, spec);
	/* a snapshot in the store is named where the store is now */
	const char *in_store = *snapshot ? strstr(*snapshot, "/v1/blobs/snapshots/") : NULL;
	if (in_store && strncmp(*snapshot, "http", 4) == 0) {
		snprintf(snap_url, CP_URL_MAX + 256, "%s%s", cp->store_url, in_store);
		*snapshot = snap_url;
	}
	json_object_set_new(spec, "snapshot", *snapshot ? json_string(*snapshot) : json_null());
	/* the destination checks the snapshot against it and refuses without it */
	json_object_set_new(spec, "snapshot_hash",
	                    *snapshot && snapshot_hash ? json_string(snapshot_hash) : json_null());
	return spec;
}

static int start_execution_in(struct cp *cp, struct cp_store *st, const struct sbx *s, const struct placement *p,
                              const char *snapshot, const char *snapshot_hash, int same_gen,
                              const struct start_opts *so, json_t **body)
{
	char act[SPACED_NAME_MAX], gb[24], now[24], snap_url[CP_URL_MAX + 256];
	const char *id = col(s, C_ID);
	int64_t gen = cp_rows_i64(s->rows, s->r, C_GEN, 0);
	int64_t seq = 0;
	int r;
	cp_random_name(act, "act-");
	char skipped[1024] = "";
	int waits = same_gen ? 0 : earlier_confirmed(cp, st, id, p->worker, NULL, skipped, sizeof skipped, body);
	if (waits != 0)
		return waits;
	json_t *spec = install_spec(cp, col(s, C_SPEC), col(s, C_TENANT), p, &snapshot, snapshot_hash, snap_url),
	       *msg = NULL;
	if (spec == NULL) {
		*body = cp_error("internal", "stored spec unreadable");
		return 500;
	}
	if ((r = cp_store_begin(st)) < 0)
		goto fail;
	if (!same_gen) {
		/* the one transaction that makes a new, strictly greater generation */
		struct cp_rows *g = NULL;
		r = CP_Q(st, &g, NULL, "UPDATE sandboxes SET generation = generation + 1 WHERE id = $1 RETURNING generation", id);
		gen = cp_rows_i64(g, 0, 0, -1);
		cp_rows_free(g);
		if (r < 0)
			goto fail;
		r = CP_Q(st, NULL, NULL,
		         "INSERT INTO generations (sandbox, generation, worker, activation, created) VALUES ($1, $2, $3, $4, $5)",
		         id, cp_i64(gb, gen), p->worker, act, cp_i64(now, spaced_now()));
		if (r < 0)
			goto fail;
		/* a fenced or lost worker that may hold an earlier execution
		 * destroys it when it is back, before it lifts its fence (in the
		 * replay, after what it was sent before) */
		for (char *save = NULL, *w = strtok_r(skipped, ",", &save); w != NULL; w = strtok_r(NULL, ",", &save)) {
			int64_t dseq;
			json_t *d = json_pack("{s:s,s:s}", "type", "destroy", "sandbox", id);
			r = d == NULL ? SPACED_ENOMEM : cp_outbox_push(st, w, d, &dseq);
			json_decref(d);
			if (r < 0)
				goto fail;
			spaced_log("spaced-cp", "level=info event=destroy-queued sandbox=%s worker=%s reason=fenced-or-lost", id, w);
		}
	}
	char cpu[24], mem[24], pids[24], disk[24];
	r = CP_Q(st, NULL, NULL,
	         "UPDATE sandboxes SET worker = $2, activation = $3, state = 'starting', snapshot = $4, last_error = NULL, "
	         "cpu_milli = $5, memory_bytes = $6, pids = $7, disk_bytes = $8 WHERE id = $1",
	         id, p->worker, act, snapshot, cp_i64(cpu, p->res.cpu_milli), cp_i64(mem, (int64_t)p->res.memory_bytes),
	         cp_i64(pids, (int64_t)p->res.pids), cp_i64(disk, (int64_t)p->res.disk_bytes));
	if (r < 0)
		goto fail;
	msg = json_pack("{s:s,s:o,s:b,s:O}", "type", "install", "identity",
	                identity_json_of(id, gen, p->worker, col(s, C_SUBSTRATE), act), "handoff", 0, "spec", spec);
	if (msg == NULL) {
		r = SPACED_ENOMEM;
		goto fail;
	}
	char sq[24];
	if ((r = cp_outbox_push(st, p->worker, msg, &seq)) < 0 ||
	    (r = CP_Q(st, NULL, NULL, "UPDATE sandboxes SET install_seq = $2 WHERE id = $1", id, cp_i64(sq, seq))) < 0)
		goto fail;
	if ((r = cp_store_commit(st)) < 0)
		goto fail;
	cp_wake(cp);
	bool fetch = snapshot != NULL || json_is_object(json_object_get(spec, "template"));
	json_decref(spec);
	json_decref(msg);
	/* a new generation from a snapshot: a resume after a failure would start
	 * it from that snapshot anywhere, so one not acknowledged is called off
	 * (a create, or a start from its template, is started again in place:
	 * the same generation, on the same worker) */
	return finish_start(cp, st, id, p->worker, seq, so->release_op, !same_gen && snapshot != NULL, fetch, body);
fail:
	cp_store_rollback(st);
	json_decref(spec);
	json_decref(msg);
	return cp_install_failed(r, body);
}

/* A new generation from a snapshot (a move's, a resume's) whose install the
 * worker did not acknowledge in time is called off: in one transaction the
 * sandbox becomes 'failed' (a resume starts a new, greater generation, I2)
 * and a `deactivate` of exactly that identity is queued behind the install,
 * so the worker stops that execution whenever the install reaches it.
 * Before, the sandbox became 'error' with its install still queued: a resume
 * from the snapshot elsewhere then ran a second execution of it, which the
 * control plane knew nothing of (neither stopped nor counted) while the
 * first one started late. */
static void start_called_off(struct cp_store *st, const char *id, const char *errtext)
{
	struct cp_rows *rows = NULL;
	char text[700], now[24];
	int r = cp_store_begin(st);
	if (r == 0)
		r = CP_Q(st, &rows, NULL,
		         "SELECT generation, worker, substrate, activation FROM sandboxes WHERE id = $1 AND state = 'starting'",
		         id);
	json_t *ident = r == 0 && rows->nrows == 1
	                    ? identity_json_of(id, cp_rows_i64(rows, 0, 0, 0), cp_rows_get(rows, 0, 1),
	                                       cp_rows_get(rows, 0, 2), cp_rows_get(rows, 0, 3))
	                    : NULL;
	json_t *msg = ident ? json_pack("{s:s,s:o,s:b}", "type", "deactivate", "identity", ident, "keep_paused", 0) : NULL;
	snprintf(text, sizeof text, "%s; its start was called off", errtext);
	int64_t seq = 0;
	if (msg && cp_outbox_push(st, cp_rows_get(rows, 0, 1), msg, &seq) == 0 &&
	    CP_Q(st, NULL, NULL,
	         "UPDATE sandboxes SET state = 'failed', last_error = $2, last_active = $3, idle_paused = 0 WHERE id = $1",
	         id, text, cp_i64(now, spaced_now())) == 0 &&
	    cp_store_commit(st) == 0) {
		spaced_log("spaced-cp", "level=info event=start-called-off sandbox=%s worker=%s seq=%lld", id,
		           cp_rows_get(rows, 0, 1), (long long)seq);
	} else {
		if (r == 0)
			cp_store_rollback(st);
		set_state(st, id, "error", errtext); /* nothing left starting, or the store failed: as before */
	}
	json_decref(msg);
	cp_rows_free(rows);
}

/* Whether the worker is live now (its control channel open on some replica). */
static bool worker_live_now(struct cp_store *st, const char *worker)
{
	struct cp_rows *rows = NULL;
	bool live = CP_Q(st, &rows, NULL, "SELECT channel_until FROM workers WHERE id = $1", worker) == 0 &&
	            rows->nrows == 1 && cp_worker_live(worker, cp_rows_i64(rows, 0, 0, 0), spaced_now());
	cp_rows_free(rows);
	return live;
}

/* The install's ack. One that has the worker fetch a template or a
 * snapshot from the store first (fetch) may take longer than --ack-timeout
 * (a Debian template is hundreds of megabytes to fetch, check and unpack
 * on a busy worker): past it the wait goes on while the worker stays live,
 * up to --snapshot-timeout; a worker that is gone ends it within a second
 * of its channel's end (channel.c: within 5 s of its going). */
static int wait_install_ack(struct cp *cp, struct cp_store *st, const char *worker, int64_t seq, bool fetch, int *ok,
                            char **res)
{
	int r = cp_wait_ack(cp, st, worker, seq, cp->ack_timeout_ms, ok, res);
	if (r != SPACED_ETIMEDOUT || !fetch || cp->snapshot_timeout_ms <= cp->ack_timeout_ms)
		return r;
	uint64_t deadline = spaced_mono_ns() + (uint64_t)(cp->snapshot_timeout_ms - cp->ack_timeout_ms) * 1000000u;
	spaced_log("spaced-cp", "level=info event=install-waits worker=%s seq=%lld reason=\"it fetches a template or "
	           "snapshot\"", worker, (long long)seq);
	while (r == SPACED_ETIMEDOUT && !cp->stopping && spaced_mono_ns() < deadline && worker_live_now(st, worker))
		r = cp_wait_ack(cp, st, worker, seq, 1000, ok, res);
	return r;
}

/* The tail of a start: waits for the install's ack (fetch: the worker
 * fetches a template or snapshot first, wait_install_ack); on it, the state
 * (and, for a create, the lease with it), else the error. */
static int finish_start(struct cp *cp, struct cp_store *st, const char *id, const char *worker, int64_t seq,
                        const char *release_op, bool call_off, bool fetch, json_t **body)
{
	char errtext[512], *res = NULL;
	int ok = 0;
	int r = wait_install_ack(cp, st, worker, seq, fetch, &ok, &res);
	const struct start_opts *so = &(struct start_opts){.release_op = release_op};
	char gwb[24] = "0";
	if (r == 0 && ok) {
		/* the execution's ServicePort gateway, from the ack (docs/network.md) */
		json_error_t jerr;
		json_t *ar = res ? json_loads(res, JSON_REJECT_DUPLICATES, &jerr) : NULL;
		json_t *gw = json_object_get(ar, "gateway");
		cp_i64(gwb, json_is_integer(gw) ? json_integer_value(gw) : 0);
		json_decref(ar);
	}
	if (r == 0 && ok && so->release_op) {
		/* lost in a crash, the operation is finished again by the recovery
		 * (its lease expires; the install's ack is there or comes again) */
		char nowb[24];
		cp_store_relaxed(st, 1);
		CP_Q(st, NULL, NULL,
		     "UPDATE sandboxes SET state = CASE WHEN state = 'starting' THEN 'running' ELSE state END, "
		     "last_error = CASE WHEN state = 'starting' THEN NULL ELSE last_error END, last_active = $3, op = NULL, "
		     "op_until = 0, gateway = $4 WHERE id = $1 AND op = $2",
		     id, so->release_op, cp_i64(nowb, spaced_now()), gwb);
		cp_store_relaxed(st, 0);
		free(res);
		return 0;
	}
	if (r == 0 && ok) {
		set_state_from(st, id, "starting", "running");
		CP_Q(st, NULL, NULL, "UPDATE sandboxes SET gateway = $2 WHERE id = $1", id, gwb);
		free(res);
		return 0;
	}
	int status = ack_status(r == 0 ? SPACED_EPERM : r, "install", res, body, errtext, sizeof errtext);
	if (r != 0 && call_off)
		start_called_off(st, id, errtext); /* no answer: the install may still be applied */
	else
		set_state(st, id, "error", errtext); /* refused: nothing was started */
	free(res);
	return status;
}

/* A tenant's quotas (its own, or this control plane's defaults) and what it
 * holds now: every sandbox not deleted counts, paused and stopped ones too
 * (they can be resumed at any time). With lock, it takes the tenant's row lock
 * (quota_seq), so concurrent creates of one tenant are counted one after the
 * other, on SQLite and on PostgreSQL alike: call it inside the transaction
 * that inserts the sandbox. */
int cp_quota_usage(struct cp *cp, struct cp_store *st, const char *tenant, int lock, struct cp_quota *limit,
                   struct cp_quota *used)
{
	struct cp_rows *q = NULL, *u = NULL;
	int r = lock ? CP_Q(st, &q, NULL,
	                    "UPDATE tenants SET quota_seq = quota_seq + 1 WHERE id = $1 "
	                    "RETURNING max_sandboxes, max_memory, max_disk, max_templates, max_pids",
	                    tenant)
	             : CP_Q(st, &q, NULL,
	                    "SELECT max_sandboxes, max_memory, max_disk, max_templates, max_pids FROM tenants WHERE id = $1",
	                    tenant);
	if (r == 0 && q->nrows != 1)
		r = SPACED_ENOENT;
	char sql[512];
	/* what the tenant's sandboxes hold (store.h cp_store_tenant_usage; no row: nothing) */
	snprintf(sql, sizeof sql, "SELECT sandboxes, memory_bytes, disk_bytes, pids FROM %s u WHERE u.tenant = $1",
	         cp_store_tenant_usage(st));
	if (r == 0)
		r = CP_Q(st, &u, NULL, sql, tenant);
	if (r == 0) {
		int64_t v;
		limit->sandboxes = (v = cp_rows_i64(q, 0, 0, -1)) >= 0 ? v : cp->quota_default.sandboxes;
		limit->memory = (v = cp_rows_i64(q, 0, 1, -1)) >= 0 ? v : cp->quota_default.memory;
		limit->disk = (v = cp_rows_i64(q, 0, 2, -1)) >= 0 ? v : cp->quota_default.disk;
		limit->templates = (v = cp_rows_i64(q, 0, 3, -1)) >= 0 ? v : cp->quota_default.templates;
		limit->pids = (v = cp_rows_i64(q, 0, 4, -1)) >= 0 ? v : cp->quota_default.pids;
		used->templates = 0; /* cp_templates_held: only where templates are made or shown */
		used->sandboxes = cp_rows_i64(u, 0, 0, 0);
		used->memory = cp_rows_i64(u, 0, 1, 0);
		used->disk = cp_rows_i64(u, 0, 2, 0);
		used->pids = cp_rows_i64(u, 0, 3, 0);
	}
	cp_rows_free(q);
	cp_rows_free(u);
	return r;
}

/* 0 when one more sandbox with res fits the tenant's quotas; else 429 (or
 * 500) with *body naming the quota hit. */
static int quota_check(struct cp *cp, struct cp_store *st, const char *tenant, const struct spaced_resources *res,
                       json_t **body)
{
	struct cp_quota limit, used;
	int r = cp_quota_usage(cp, st, tenant, 1, &limit, &used);
	if (r < 0) {
		*body = cp_error("store", spaced_strerror(r));
		return 500;
	}
	const char *hit = NULL;
	int64_t lim = 0, cur = 0, want = 0;
	if (limit.sandboxes > 0 && used.sandboxes + 1 > limit.sandboxes) {
		hit = "sandboxes", lim = limit.sandboxes, cur = used.sandboxes, want = 1;
	} else if (limit.memory > 0 && used.memory + (int64_t)res->memory_bytes > limit.memory) {
		hit = "memory_bytes", lim = limit.memory, cur = used.memory, want = (int64_t)res->memory_bytes;
	} else if (limit.disk > 0 && used.disk + (int64_t)res->disk_bytes > limit.disk) {
		hit = "disk_bytes", lim = limit.disk, cur = used.disk, want = (int64_t)res->disk_bytes;
	} else if (limit.pids > 0 && used.pids + (int64_t)res->pids > limit.pids) {
		/* tasks are what a worker's placement allocates with memory: without
		 * this quota one tenant's few sandboxes of 32768 tasks each took
		 * every worker's, and every other tenant's creates found no room */
		hit = "pids", lim = limit.pids, cur = used.pids, want = (int64_t)res->pids;
	}
	if (hit == NULL)
		return 0;
	char m[200];
	snprintf(m, sizeof m, "the tenant's %s quota is %lld; it holds %lld and this sandbox asks for %lld more", hit,
	         (long long)lim, (long long)cur, (long long)want);
	*body = json_pack("{s:s,s:s,s:s,s:I,s:I,s:I}", "error", "quota-exceeded", "message", m, "quota", hit, "limit",
	                  (json_int_t)lim, "used", (json_int_t)cur, "requested", (json_int_t)want);
	return 429;
}

/* ---- creates, committed in groups ----
 * A create's first transaction (placement, quotas, the sandbox, its first
 * generation, the install queued) waits for the disk once (synchronous=FULL);
 * fifty of them one after the other wait fifty times. So creates that
 * arrive together are written in one transaction: the first to come leads
 * — it runs every waiting create's statements on its own store handle, each
 * under a savepoint of its own (a refused create is rolled back alone),
 * commits once, and wakes them — while the next ones gather for the next
 * commit. Each create then waits for its own ack on its own thread. */
struct create_job {
	struct create_job *next;
	const char *tenant;
	const struct cp_create_req *c;
	const char *spec_text, *id, *op, *tmpl_hash;
	/* results */
	bool done;
	int status;
	json_t *body;
	char worker[SPACED_NAME_MAX];
	int64_t seq;
	/* signalled when it is done, or when it is to lead the next batch:
	 * each waiting create is woken for itself alone */
	pthread_cond_t cv;
};

static pthread_mutex_t batch_mu = PTHREAD_MUTEX_INITIALIZER;
static struct create_job *batch_head, **batch_tail = &batch_head;
static bool batch_leading;

/* One create's statements, inside the batch's transaction. */
static void create_one(struct cp *cp, struct cp_store *st, struct create_job *j)
{
	const struct cp_create_req *c = j->c;
	char now[24], until[24], idle[24], maxl[24], cpu[24], mem[24], pids[24], disk[24];
	struct placement p;
	int64_t t = spaced_now();
	int r;
	if ((r = CP_Q0(st, NULL, NULL, "SAVEPOINT spaced_create")) < 0) {
		j->status = 500;
		j->body = cp_error("internal", spaced_strerror(r));
		return;
	}
	/* a create that names no substrate gets the control plane's default */
	const char *substrate = c->has_substrate || !cp->default_substrate[0] ? c->substrate : cp->default_substrate;
	if (strcmp(substrate, "qemu") == 0 && j->tmpl_hash[0]) {
		/* a VM's root is its worker's VM image (docs/substrate.md) */
		j->status = 422;
		j->body = cp_error("substrate-unsupported", "the qemu substrate does not take templates yet");
		goto undo;
	}
	if ((j->status = place(st, substrate, &c->res, c->worker, NULL, &p, &j->body)) != 0 ||
	    /* the tenant's quotas, in the transaction that places the sandbox */
	    (j->status = quota_check(cp, st, j->tenant, &p.res, &j->body)) != 0)
		goto undo;
	/* the install queued, the sandbox at generation 1 with its activation,
	 * and that generation's row, in the same transaction (I2): what a later
	 * start does in turns (start_execution_in), written once */
	char act[SPACED_NAME_MAX], seqb[24], snap_url[CP_URL_MAX + 256];
	const char *no_snapshot = NULL;
	cp_random_name(act, "act-");
	json_t *spec = install_spec(cp, j->spec_text, j->tenant, &p, &no_snapshot, NULL, snap_url);
	json_t *msg = spec ? json_pack("{s:s,s:o,s:b,s:o}", "type", "install", "identity",
	                               identity_json_of(j->id, 1, p.worker, substrate, act), "handoff", 0, "spec", spec)
	                   : NULL;
	r = msg ? cp_outbox_push(st, p.worker, msg, &j->seq) : SPACED_ENOMEM;
	json_decref(msg);
	if (r == 0)
		r = CP_Q(st, NULL, NULL,
		         "INSERT INTO sandboxes (id, tenant, state, generation, worker, substrate, activation, spec, op, "
		         "op_until, created, last_active, idle_timeout, max_lifetime, cpu_milli, memory_bytes, pids, "
		         "disk_bytes, template_hash, install_seq, idem_key) "
		         "VALUES ($1, $2, 'starting', 1, $3, $4, $5, $6, $7, $8, $9, $9, $10, $11, $12, $13, $14, $15, $16, "
		         "$17, $18)",
		         j->id, j->tenant, p.worker, substrate, act, j->spec_text, j->op, cp_i64(until, t + cp->op_lease),
		         cp_i64(now, t), cp_i64(idle, c->idle_timeout >= 0 ? c->idle_timeout : cp->idle_timeout),
		         cp_i64(maxl, c->max_lifetime >= 0 ? c->max_lifetime : cp->max_lifetime),
		         cp_i64(cpu, p.res.cpu_milli), cp_i64(mem, (int64_t)p.res.memory_bytes),
		         cp_i64(pids, (int64_t)p.res.pids), cp_i64(disk, (int64_t)p.res.disk_bytes),
		         j->tmpl_hash[0] ? j->tmpl_hash : NULL, cp_i64(seqb, j->seq), c->idem_key[0] ? c->idem_key : NULL);
	if (r == 0)
		r = CP_Q(st, NULL, NULL,
		         "INSERT INTO generations (sandbox, generation, worker, activation, created) VALUES ($1, 1, $2, $3, $4)",
		         j->id, p.worker, act, now);
	if (r < 0) {
		j->status = cp_install_failed(r, &j->body);
		goto undo;
	}
	snprintf(j->worker, sizeof j->worker, "%s", p.worker);
	CP_Q0(st, NULL, NULL, "RELEASE SAVEPOINT spaced_create");
	return;
undo:
	CP_Q0(st, NULL, NULL, "ROLLBACK TO SAVEPOINT spaced_create");
	CP_Q0(st, NULL, NULL, "RELEASE SAVEPOINT spaced_create");
}

/* The batch's commit made durable. Its installs may be applied already
 * (sent tentative): a log that cannot reach the disk leaves no way to tell
 * which of them a crash keeps, so the control plane stops, as a database
 * does when its log cannot be synced; at its next start its log is synced
 * before it serves (cp_chan_seq_restart), and the workers' hellos settle
 * what they applied (channel.h). */
static void log_synced(struct cp_store *st)
{
	/* for tests (tests/cp_tentative.t.sh): the process ends after the
	 * installs went out and before the sync, as a crash of the machine
	 * would end it (the test then takes the commit out of the store) */
	static int crash = -1; /* read once (batches run one at a time) */
	if (crash < 0) {
		const char *e = getenv("SPACED_CP_TEST_CRASH_BEFORE_SYNC");
		crash = e != NULL && e[0] == '1';
	}
	if (crash) {
		usleep(300000);
		spaced_log("spaced-cp", "level=warn event=test-crash-before-sync");
		_exit(70);
	}
	int r = cp_store_sync_log(st);
	if (r < 0) {
		spaced_log("spaced-cp", "level=error event=store-sync-failed reason=\"%s\" action=stop",
		           spaced_strerror(r));
		abort();
	}
}

static void create_batch(struct cp *cp, struct cp_store *st, struct create_job *j)
{
	pthread_mutex_lock(&batch_mu);
	*batch_tail = j;
	batch_tail = &j->next;
	while (!j->done && batch_leading)
		pthread_cond_wait(&j->cv, &batch_mu);
	if (j->done) {
		pthread_mutex_unlock(&batch_mu);
		return;
	}
	batch_leading = true;
	while (batch_head) {
		struct create_job *batch = batch_head;
		batch_head = NULL;
		batch_tail = &batch_head;
		pthread_mutex_unlock(&batch_mu);
		/* SQLite: committed without waiting for the disk, then made durable
		 * (cp_store_sync_log) while the installs are on their way, sent
		 * tentative (channel.h) */
		bool sq = strcmp(cp_store_kind(st), "sqlite") == 0;
		if (sq)
			cp_store_relaxed(st, 2);
		int r = cp_store_begin(st), queued = 0;
		for (struct create_job *k = batch; k; k = k->next) {
			if (r < 0) {
				k->status = 503;
				k->body = cp_error("store-busy", spaced_strerror(r));
				continue;
			}
			create_one(cp, st, k);
			queued += k->status == 0;
			if (k->status == 0 && sq && !cp_chan_tentative_begin(k->worker, k->seq, k->id))
				r = SPACED_EBUSY; /* more than a batch can hold (one per request thread): none of it */
		}
		if (r == SPACED_EBUSY) {
			cp_store_rollback(st);
			for (struct create_job *k = batch; k; k = k->next)
				if (k->status == 0) {
					k->status = 503;
					k->body = cp_error("store-busy", "too many creates at once");
				}
			queued = 0;
		}
		if (r == 0 && (r = cp_store_commit(st)) < 0) {
			cp_store_rollback(st);
			for (struct create_job *k = batch; k; k = k->next)
				if (k->status == 0) {
					k->status = 500;
					k->body = cp_error("internal", spaced_strerror(r));
				}
		}
		if (sq)
			cp_store_relaxed(st, 0);
		if (r == 0 && queued && sq) {
			cp_wake(cp); /* the installs, tentative */
			log_synced(st);
		}
		if (sq)
			cp_chan_tentative_end();
		if (r == 0 && queued)
			cp_wake(cp); /* the installs, or that they are durable */
		pthread_mutex_lock(&batch_mu);
		for (struct create_job *k = batch, *next; k; k = next) {
			next = k->next; /* k may be gone once woken and the lock let go */
			k->done = true;
			pthread_cond_signal(&k->cv);
		}
		if (j->done)
			break; /* its own create is done: the next waiting one leads */
	}
	batch_leading = false;
	if (batch_head)
		pthread_cond_signal(&batch_head->cv);
	pthread_mutex_unlock(&batch_mu);
}

static int place_sandbox(struct cp_store *st, const struct sbx *s, const char *want, const char *exclude,
                         struct placement *p, json_t **body);

/* A start its worker refused for want of room (`no-capacity`: what only
 * the worker knows — its disk's free space, installs not yet acknowledged —
 * or a view of it that was behind) is placed on another worker, as a new
 * generation (I2) from the sandbox's last snapshot or its template, up to
 * CP_START_TRIES workers in all; else the answer stays the last refusal
 * (502 worker-refused, its worker_code). For a create, a resume and a
 * restart that named no worker; release_op: as start_opts'. */
#define CP_START_TRIES 3

static int start_elsewhere(struct cp *cp, struct cp_store *st, const char *tenant, const char *id,
                           const char *release_op, const char *first, int status, json_t **body)
{
	char tried[CP_START_TRIES * (SPACED_NAME_MAX + 1)];
	snprintf(tried, sizeof tried, "%s", first);
	for (int k = 1; k < CP_START_TRIES; k++) {
		const char *wc = json_string_value(json_object_get(*body, "worker_code"));
		/* no room there, or fenced there (just back, its fence not yet
		 * lifted: docs/control-messages.md "Fence") */
		if (status != 502 || wc == NULL || (strcmp(wc, "no-capacity") != 0 && strcmp(wc, "fenced") != 0))
			break;
		struct sbx s;
		struct placement p;
		json_t *why = NULL;
		if (sbx_load(st, tenant, id, &s) < 0)
			break;
		if (place_sandbox(st, &s, "", tried, &p, &why) != 0) {
			cp_rows_free(s.rows);
			json_decref(why);
			break;
		}
		spaced_log("spaced-cp", "level=info event=start-elsewhere sandbox=%s refused-by=%s worker=%s", id, tried,
		           p.worker);
		json_decref(*body);
		*body = NULL;
		const char *snap = col(&s, C_SNAP);
		const struct start_opts so = {.release_op = release_op};
		status = start_execution_in(cp, st, &s, &p, snap, snap ? col(&s, C_SNAPHASH) : NULL, 0, &so, body);
		cp_rows_free(s.rows);
		size_t n = strlen(tried);
		snprintf(tried + n, sizeof tried - n, ",%s", p.worker);
	}
	return status;
}

/* A create's Idempotency-Key: the sandbox an earlier create of the tenant
 * with the same key made, answered as it is now (200; 409 when it was
 * deleted since), else 0 (none: this create goes on). The unique index on
 * (tenant, idem_key) makes one of two creates racing with one key fail its
 * insert; that one is answered here too. The body is not compared: the key
 * names the create. */
/* Replays waiting for the create that made their sandbox, per tenant: two
 * at most each (a tenant replaying in a loop would otherwise hold the
 * lifecycle threads, each for up to --ack-timeout); the others are answered
 * at once, the sandbox as it is. */
#define REPLAY_WAITING_TENANTS 64
#define REPLAY_WAITING_EACH 2
static pthread_mutex_t replay_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
	char tenant[SPACED_NAME_MAX];
	int n;
} replay_waiting[REPLAY_WAITING_TENANTS];

static bool replay_wait_take(const char *tenant)
{
	bool ok = false;
	pthread_mutex_lock(&replay_mu);
	int free_slot = -1, i;
	for (i = 0; i < REPLAY_WAITING_TENANTS; i++) {
		if (replay_waiting[i].n > 0 && strcmp(replay_waiting[i].tenant, tenant) == 0)
			break;
		if (replay_waiting[i].n == 0 && free_slot < 0)
			free_slot = i;
	}
	if (i == REPLAY_WAITING_TENANTS && free_slot >= 0) {
		i = free_slot;
		snprintf(replay_waiting[i].tenant, sizeof replay_waiting[i].tenant, "%s", tenant);
	}
	if (i < REPLAY_WAITING_TENANTS && replay_waiting[i].n < REPLAY_WAITING_EACH) {
		replay_waiting[i].n++;
		ok = true;
	}
	pthread_mutex_unlock(&replay_mu);
	return ok;
}

static void replay_wait_release(const char *tenant)
{
	pthread_mutex_lock(&replay_mu);
	for (int i = 0; i < REPLAY_WAITING_TENANTS; i++)
		if (replay_waiting[i].n > 0 && strcmp(replay_waiting[i].tenant, tenant) == 0) {
			replay_waiting[i].n--;
			break;
		}
	pthread_mutex_unlock(&replay_mu);
}

/* Whether the sandbox in rows (id, deleted, state, op, op_until) is still
 * being made: an operation holds it (its lease not past) and it is
 * `starting`, or `error` between a worker's refusal and the next worker's
 * try (start_elsewhere). */
static bool replay_in_flight(const struct cp_rows *rows)
{
	const char *state = cp_rows_get(rows, 0, 2), *op = cp_rows_get(rows, 0, 3);
	return cp_rows_i64(rows, 0, 1, 0) == 0 && op && op[0] && cp_rows_i64(rows, 0, 4, 0) >= spaced_now() && state &&
	       (strcmp(state, "starting") == 0 || strcmp(state, "error") == 0);
}

int cp_create_replayed(struct cp *cp, struct cp_store *st, const char *tenant, const char *key, json_t **body)
{
	struct cp_rows *rows = NULL;
	int status = 0;
	if (!key[0] ||
	    CP_Q(st, &rows, NULL,
	         "SELECT id, deleted, state, op, op_until FROM sandboxes WHERE tenant = $1 AND idem_key = $2", tenant,
	         key) < 0 ||
	    rows->nrows != 1) {
		cp_rows_free(rows);
		return 0;
	}
	const char *id = cp_rows_get(rows, 0, 0);
	/* the create that made it still runs (waits for its worker, or tries
	 * another): the replay waits with it (the store read every 20 ms, then
	 * less often, up to what the create may wait and a second: --ack-timeout,
	 * or --snapshot-timeout for one whose worker fetches its template first,
	 * wait_install_ack), so that it answers what
	 * the create ends with, a sandbox that runs or its failure, and not one
	 * in `starting` that the client would take for made; past that bound, or
	 * past REPLAY_WAITING_EACH of its tenant's, as it is */
	if (replay_in_flight(rows) && replay_wait_take(tenant)) {
		int bound_ms = cp->snapshot_timeout_ms > cp->ack_timeout_ms ? cp->snapshot_timeout_ms : cp->ack_timeout_ms;
		uint64_t until = spaced_mono_ns() + ((uint64_t)bound_ms + 1000) * 1000000;
		useconds_t pause = 20000;
		while (replay_in_flight(rows) && spaced_mono_ns() < until) {
			char keep[SPACED_NAME_MAX];
			snprintf(keep, sizeof keep, "%s", id);
			cp_rows_free(rows);
			rows = NULL;
			usleep(pause);
			pause = pause < 160000 ? pause * 2 : 200000;
			if (CP_Q(st, &rows, NULL, "SELECT id, deleted, state, op, op_until FROM sandboxes WHERE id = $1",
			         keep) < 0 ||
			    rows->nrows != 1) {
				cp_rows_free(rows);
				replay_wait_release(tenant);
				return 0;
			}
			id = cp_rows_get(rows, 0, 0);
		}
		replay_wait_release(tenant);
	}
	/* what it answers is on disk (SQLite: a create's commit may not be
	 * yet while a batch is tentative, docs/control-messages.md
	 * "Tentative installs") */
	if (cp_chan_tentative_any() && cp_store_sync_log(st) < 0) {
		cp_rows_free(rows);
		*body = cp_error("store", "the store's log cannot be synced");
		return 503;
	}
	if (cp_rows_i64(rows, 0, 1, 0) > 0) {
		*body = json_pack("{s:s,s:s,s:s}", "error", "idempotency-key-used", "message",
		                  "the sandbox this Idempotency-Key created has been deleted", "sandbox", id);
		status = 409;
	} else if ((*body = cp_sandbox_json(st, tenant, id)) != NULL) {
		status = 200;
	}
	cp_rows_free(rows);
	return status;
}

int cp_op_create(struct cp *cp, struct cp_store *st, const char *tenant, const struct cp_create_req *c,
                 json_t **body)
{
	char id[SPACED_NAME_MAX], op[SPACED_NAME_MAX];
	int status;
	json_t *tmpl = NULL;
	/* a replay of c->idem_key was answered before (api.c: cp_create_replayed,
	 * ahead of the tenant's rate); one racing this create is answered below */
	char tmpl_hash[SPACED_TREEHASH_HEX] = "";
	/* a template is named by the tenant and pinned by its hash: the sandbox
	 * keeps that tree across pause, resume and move, whatever the name
	 * comes to mean later */
	if (c->template_name[0] && (status = cp_template_resolve(st, tenant, c->template_name, &tmpl, body)) != 0)
		return status;
	if (c->template_hash[0] && (status = cp_template_owned(st, tenant, c->template_hash, &tmpl, body)) != 0)
		return status;
	if (tmpl)
		snprintf(tmpl_hash, sizeof tmpl_hash, "%s", json_string_value(json_object_get(tmpl, "hash")));
	json_t *spec = json_pack("{s:o,s:n}", "template", tmpl ? tmpl : json_null(), "snapshot");
	/* what every command in it starts with, and what it is labelled with */
	json_error_t jerr;
	if (spec && c->env_json[0])
		json_object_set_new(spec, "env", json_loads(c->env_json, JSON_REJECT_DUPLICATES, &jerr));
	if (spec && c->meta_json[0])
		json_object_set_new(spec, "metadata", json_loads(c->meta_json, JSON_REJECT_DUPLICATES, &jerr));
	if (spec && c->auto_resume)
		json_object_set_new(spec, "auto_resume", json_true());
	if (spec && c->restart_on_failure)
		json_object_set_new(spec, "restart", json_string("on-failure"));
	/* the egress policy travels in the spec: every install carries it (docs/network.md) */
	if (spec != NULL)
		json_object_set_new(spec, "network", cp_network_or_default(c->network));
	char *spec_text = spec ? json_dumps(spec, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
	json_decref(spec);
	if (spec_text == NULL) {
		*body = cp_error("internal", "out of memory");
		return 500;
	}
	char rnd[SPACED_NAME_MAX];
	cp_random_name(id, "sbx-");
	cp_random_name(rnd, "");
	snprintf(op, sizeof op, "create.%.16s@%s", rnd, cp->replica_id);
	struct create_job j = {.tenant = tenant, .c = c, .spec_text = spec_text, .id = id, .op = op,
	                       .tmpl_hash = tmpl_hash};
	pthread_cond_init(&j.cv, NULL);
	create_batch(cp, st, &j);
	pthread_cond_destroy(&j.cv);
	status = j.status;
	if (status != 0) {
		*body = j.body;
		json_t *again = NULL;
		int st2 = c->idem_key[0] ? cp_create_replayed(cp, st, tenant, c->idem_key, &again) : 0;
		if (st2 != 0) { /* another create with the key won the race */
			json_decref(*body);
			*body = again;
			status = st2;
		}
		goto out;
	}
	/* the insert and the first generation are committed, the install
	 * queued; the state and the lease go together once the worker
	 * acknowledged */
	lease_hold(id, op);
	status = finish_start(cp, st, id, j.worker, j.seq, op, false, tmpl_hash[0] != 0, body);
	if (!c->worker[0])
		status = start_elsewhere(cp, st, tenant, id, op, j.worker, status, body);
	lease_hold(NULL, NULL);
	if (status != 0)
		lease_drop(st, id, op);
	if (status == 0) {
		*body = cp_sandbox_json(st, tenant, id);
		status = 201;
	} else if (*body != NULL) {
		json_object_set_new(*body, "sandbox", cp_sandbox_json(st, tenant, id));
	}
out:
	free(spec_text);
	return status;
}

/* The hash and size a worker reported in its snapshot ack (result JSON text);
 * hex stays empty when it is missing or malformed: an install from that
 * snapshot is then refused by its destination. */
static void snapshot_result(const char *res, char hex[65], char bytes[24])
{
	json_error_t jerr;
	json_t *j = res ? json_loads(res, JSON_REJECT_DUPLICATES, &jerr) : NULL;
	json_t *h = json_object_get(j, "hash"), *b = json_object_get(j, "bytes");
	hex[0] = 0;
	cp_i64(bytes, json_is_integer(b) && json_integer_value(b) >= 0 ? json_integer_value(b) : 0);
	if (json_is_string(h) && json_string_length(h) == 64 &&
	    strspn(json_string_value(h), "0123456789abcdef") == 64)
		memcpy(hex, json_string_value(h), 65);
	json_decref(j);
}

/* Where a snapshot's archive goes: the store's URL of a new name (the store
 * takes each name once: a snapshot never overwrites an earlier one of the
 * same generation — a `snapshot` and then a `move`). The worker uploads it
 * there and the destination of a move fetches it from there: no
 * filesystem is shared between them. */
/* A snapshot's URL in the store: its name is ID-GENERATION-RANDOM
 * (cp_snapshot_awaited reads it back). */
static const char *snapshot_url(struct cp *cp, char *buf, size_t n, const char *id, int64_t gen)
{
	char rnd[SPACED_NAME_MAX];
	cp_random_name(rnd, "");
	snprintf(buf, n, "%s/v1/blobs/snapshots/%s-%" PRId64 "-%.16s", cp->store_url, id, gen, rnd);
	return buf;
}

/* One given up on (timed out, its lease released) or of a sandbox removed
 * meanwhile is refused, not kept until the grace sweep; a worker cannot
 * fill the store with archives nothing asked for. */
bool cp_snapshot_awaited(struct cp_store *st, const char *name, const char *worker)
{
	char id[SPACED_NAME_MAX], gen[24], now[24];
	const char *r = strrchr(name, '-'), *g = r;
	while (g && g > name && g[-1] >= '0' && g[-1] <= '9')
		g--;
	if (!r || g == r || g - 1 <= name || g[-1] != '-' || (size_t)(g - 1 - name) >= sizeof id ||
	    (size_t)(r - g) >= sizeof gen)
		return false;
	snprintf(id, sizeof id, "%.*s", (int)(g - 1 - name), name);
	snprintf(gen, sizeof gen, "%.*s", (int)(r - g), g);
	struct cp_rows *rows = NULL;
	bool ok = CP_Q(st, &rows, NULL,
	               "SELECT 1 FROM sandboxes WHERE id = $1 AND generation = CAST($2 AS BIGINT) AND worker = $3 "
	               "AND deleted = 0 AND (op LIKE 'snapshot.%' OR op LIKE 'move.%') "
	               "AND op_until >= CAST($4 AS BIGINT)",
	               id, gen, worker, cp_i64(now, spaced_now())) == 0 &&
	          rows->nrows == 1;
	cp_rows_free(rows);
	return ok;
}

/* The same generation activated again on its worker, p (a new activation:
 * the execution kept there after a move that did not finish, or the one that
 * runs there). When the worker says that execution no longer runs there
 * ("not-running", "deactivated"), nothing of it can be had: the sandbox starts
 * afresh as a new generation (I2: a start is never the old generation). */
static int start_again(struct cp *cp, struct cp_store *st, const struct sbx *s, const struct placement *p,
                       json_t **body)
{
	int status = start_execution(cp, st, s, p, NULL, NULL, 1, body);
	const char *wc = status == 502 ? json_string_value(json_object_get(*body, "worker_code")) : NULL;
	if (wc == NULL || (strcmp(wc, "not-running") != 0 && strcmp(wc, "deactivated") != 0))
		return status;
	spaced_log("spaced-cp", "level=info event=start-again-refused sandbox=%s worker=%s code=%s next=new-generation",
	           col(s, C_ID), p->worker, wc);
	json_decref(*body);
	*body = NULL;
	return start_execution(cp, st, s, p, NULL, NULL, 0, body);
}

/* Places sandbox s (its substrate and limits) on want ("" for any) avoiding
 * exclude, in a transaction of its own that is rolled back (the start that
 * follows commits). 0 with *p, or an HTTP status with *body. */
static int place_sandbox(struct cp_store *st, const struct sbx *s, const char *want, const char *exclude,
                         struct placement *p, json_t **body)
{
	struct spaced_resources res;
	int r = cp_store_begin(st);
	if (r < 0) {
		*body = cp_error("internal", spaced_strerror(r));
		return r == SPACED_EBUSY ? 503 : 500;
	}
	resources_of(s, &res);
	int status = place(st, col(s, C_SUBSTRATE), &res, want, exclude, p, body);
	cp_store_rollback(st);
	return status;
}

/* Once a new generation of id runs (on the worker its row names now), every
 * other worker that ran one of its generations is told to destroy what it
 * still holds of it: a move's source kept frozen, a start called off, an
 * execution left by a move that failed. Each worker applies it after
 * whatever it was sent before (best effort: a store error leaves them to the
 * delete). */
static void retire_elsewhere(struct cp *cp, struct cp_store *st, const char *id)
{
	struct cp_rows *ws = NULL, *cur = NULL;
	if (CP_Q(st, &cur, NULL, "SELECT worker FROM sandboxes WHERE id = $1", id) < 0 ||
	    cp_rows_get(cur, 0, 0) == NULL ||
	    CP_Q(st, &ws, NULL, "SELECT DISTINCT worker FROM generations WHERE sandbox = $1", id) < 0 ||
	    cp_store_begin(st) < 0) {
		cp_rows_free(cur);
		cp_rows_free(ws);
		return;
	}
	const char *keep = cp_rows_get(cur, 0, 0);
	int bad = 0;
	const char *w;
	for (int i = 0; !bad && (w = cp_rows_get(ws, i, 0)) != NULL; i++) {
		if (strcmp(w, keep) == 0)
			continue;
		int64_t seq;
		json_t *d = json_pack("{s:s,s:s}", "type", "destroy", "sandbox", id);
		bad = d == NULL || cp_outbox_push(st, w, d, &seq) < 0;
		json_decref(d);
	}
	if (bad || cp_store_commit(st) < 0)
		cp_store_rollback(st);
	else
		cp_wake(cp);
	cp_rows_free(cur);
	cp_rows_free(ws);
}

/* Queues a destroy of id to every worker that ran one of its generations, in
 * one transaction. 0, or 500 when they could not be queued. */
static int destroy_everywhere(struct cp *cp, struct cp_store *st, const char *id)
{
	struct cp_rows *ws = NULL;
	int bad = CP_Q(st, &ws, NULL, "SELECT DISTINCT g.worker FROM generations g JOIN workers w ON w.id = g.worker "
	                              "WHERE g.sandbox = $1",
	               id) < 0 ||
	          cp_store_begin(st) < 0;
	for (int i = 0; !bad && i < ws->nrows; i++) {
		int64_t seq;
		json_t *d = json_pack("{s:s,s:s}", "type", "destroy", "sandbox", id);
		bad = d == NULL || cp_outbox_push(st, cp_rows_get(ws, i, 0), d, &seq) < 0;
		json_decref(d);
	}
	if (bad || cp_store_commit(st) < 0) {
		cp_store_rollback(st);
		cp_rows_free(ws);
		return 500;
	}
	if (ws->nrows > 0)
		cp_wake(cp);
	cp_rows_free(ws);
	return 0;
}

/* A deleted sandbox that every worker which ran it confirmed is `deleted`
 * (200; its archives go); one that some worker has not confirmed stays
 * `deleting` (202), still counted against its tenant's quotas. Waits up to
 * wait_ms for a connected worker's acknowledgement. */
static int deleting_finish(struct cp *cp, struct cp_store *st, const char *id, int wait_ms, json_t **body)
{
	char who[SPACED_NAME_MAX], now[24];
	bool live = false;
	int64_t fenced_in = -1;
	int r = unconfirmed_worker(cp, st, id, NULL, NULL, wait_ms, who, &live, &fenced_in, NULL, 0);
	if (r == 1) {
		r = CP_Q(st, NULL, NULL, "UPDATE sandboxes SET state = 'deleting' WHERE id = $1 AND deleted = 0", id);
		if (r == 0 && body != NULL)
			*body = json_pack("{s:s,s:s,s:b,s:s}", "id", id, "state", "deleting", "pending", 1, "worker", who);
		if (r == 0)
			return 202;
	} else if (r == 0) {
		long changed = 0;
		/* its spec goes with it: the create's variables may be secrets, and
		 * the row is kept --retain-deleted */
		r = CP_Q(st, NULL, &changed,
		         "UPDATE sandboxes SET state = 'deleted', deleted = $2, spec = '{}' WHERE id = $1 AND deleted = 0", id,
		         cp_i64(now, spaced_now()));
		if (r == 0 && changed == 1)
			cp_snapshots_drop_others(cp, id, NULL); /* a deleted sandbox needs none of its archives */
		if (r == 0 && body != NULL)
			*body = json_pack("{s:s,s:s,s:b}", "id", id, "state", "deleted", "pending", 0);
		if (r == 0)
			return 200;
	}
	if (body != NULL)
		*body = cp_error("store", spaced_strerror(r));
	return 500;
}

void cp_deleting_finish(struct cp *cp, struct cp_store *st)
{
	struct cp_rows *rows = NULL;
	if (CP_Q0(st, &rows, NULL, "SELECT id FROM sandboxes WHERE deleted = 0 AND state = 'deleting'") < 0)
		return;
	for (int i = 0; i < rows->nrows && !cp->stopping; i++)
		if (deleting_finish(cp, st, cp_rows_get(rows, i, 0), 0, NULL) == 200)
			spaced_log("spaced-cp", "level=info event=deleted sandbox=%s after=confirmed", cp_rows_get(rows, i, 0));
	cp_rows_free(rows);
}

/* pause | resume | snapshot | move | delete, with the sandbox's lease held. */
static int run_op(struct cp *cp, struct cp_store *st, const char *tenant, const struct sbx *s, const char *op,
                  const char *worker, json_t **body)
{
	struct spaced_identity idn;
	char errtext[512], path[1024], *why = NULL, *res = NULL;
	const char *id = col(s, C_ID), *state = col(s, C_STATE), *cur = col(s, C_WORKER);
	int64_t gen = cp_rows_i64(s->rows, s->r, C_GEN, 0);
	int has_identity = identity_of(s, &idn) == 0;
	int r, status = 0;
	json_t *msg = NULL;

	if (strcmp(op, "delete") == 0) {
		if (strcmp(state, "deleting") != 0 && (status = destroy_everywhere(cp, st, id)) != 0) {
			*body = cp_error("internal", "the destroy messages could not be queued");
			goto out;
		}
		/* counted against its tenant's quotas until every worker that ran
		 * it confirmed (cp_deleting_finish completes it then) */
		status = deleting_finish(cp, st, id, cp->ack_timeout_ms, body);
		goto out;
	}
	if (strcmp(op, "pause") == 0) {
		if (strcmp(state, "paused") == 0)
			goto done; /* already paused: nothing to do */
		if (strcmp(state, "running") != 0 || !has_identity)
			goto wrong_state;
		msg = json_pack("{s:s,s:o}", "type", "pause", "identity", spaced_identity_to_json(&idn));
		if ((r = push_wait(cp, st, cur, msg, NULL, &why)) < 0)
			goto ack_fail;
		set_state_from(st, id, "running", "paused");
		goto done;
	}
	if (strcmp(op, "snapshot") == 0) {
		if (strcmp(state, "paused") != 0 || !has_identity)
			goto wrong_state;
		msg = json_pack("{s:s,s:o,s:s}", "type", "snapshot", "identity", spaced_identity_to_json(&idn), "url",
		                snapshot_url(cp, path, sizeof path, id, gen));
		if ((r = push_wait(cp, st, cur, msg, &res, &why)) < 0)
			goto ack_fail;
		char hex[65], nb[24];
		snapshot_result(res, hex, nb);
		if (CP_Q(st, NULL, NULL, "UPDATE sandboxes SET snapshot = $2, snapshot_hash = $3, snapshot_bytes = $4 WHERE id = $1",
		         id, path, hex[0] ? hex : NULL, nb) == 0)
			cp_snapshots_drop_others(cp, id, path); /* the one it supersedes goes now */
		goto done;
	}
	int is_move = strcmp(op, "move") == 0;
	if (strcmp(op, "resume") == 0 || is_move) {
		struct placement p;
		if (is_move && worker[0] == 0) {
			*body = cp_error("bad-request", "move needs a target worker ('to')");
			status = 400;
			goto out;
		}
		if (strcmp(op, "resume") == 0 && strcmp(state, "starting") == 0 && has_identity &&
		    (worker[0] == 0 || strcmp(worker, cur) == 0)) {
			/* an interrupted start (e.g. the control plane died waiting): its install
			 * is queued or delivered; finish it by waiting for the ack */
			int ok = 0;
			int64_t seq = cp_rows_i64(s->rows, s->r, C_INSTSEQ, 0);
			if (seq < 1)
				goto wrong_state;
			cp_wake(cp);
			if ((r = cp_wait_ack(cp, st, cur, seq, cp->ack_timeout_ms, &ok, &res)) < 0)
				goto ack_fail;
			if (!ok) {
				why = res;
				res = NULL;
				r = SPACED_EPERM;
				goto ack_fail_error;
			}
			set_state_from(st, id, "starting", "running");
			goto done;
		}
		if (strcmp(op, "resume") == 0 && strcmp(state, "moving") == 0 && has_identity &&
		    (worker[0] == 0 || strcmp(worker, cur) == 0)) {
			/* a move interrupted before its new generation: the old worker may hold a
			 * deactivated, frozen execution; activate the same generation again there */
			if ((status = place_sandbox(st, s, cur, NULL, &p, body)) != 0)
				goto out;
			status = start_again(cp, st, s, &p, body);
			if (status != 0)
				goto out;
			goto done;
		}
		if (strcmp(op, "resume") == 0 && strcmp(state, "running") == 0 &&
		    (worker[0] == 0 || (cur && strcmp(worker, cur) == 0)))
			goto done; /* already running there */
		if (strcmp(op, "resume") == 0 && strcmp(state, "paused") == 0 && has_identity &&
		    (worker[0] == 0 || strcmp(worker, cur) == 0)) {
			/* thaw in place: the same execution, so the same generation */
			msg = json_pack("{s:s,s:o}", "type", "thaw", "identity", spaced_identity_to_json(&idn));
			if ((r = push_wait(cp, st, cur, msg, NULL, &why)) < 0)
				goto ack_fail;
			set_state_from(st, id, "paused", "running");
			goto done;
		}
		if ((strcmp(state, "running") == 0 || strcmp(state, "paused") == 0) && has_identity) {
			/* move: deactivate (kept frozen), snapshot, install a new generation elsewhere */
			if (worker[0] == 0 || strcmp(worker, cur) == 0) {
				*body = cp_error("same-worker", "the sandbox already runs on this worker");
				status = 409;
				goto out;
			}
			if ((status = place_sandbox(st, s, worker, cur, &p, body)) != 0)
				goto out;
			/* no worker but its source (which gets the deactivate next, in
			 * order) may still run it: checked again at the start */
			if ((status = earlier_confirmed(cp, st, id, worker, cur, NULL, 0, body)) != 0)
				goto out;
			/* R4/V2: a route handed out just before 'moving' was committed may be
			 * on its way to the old execution as some client's one retry; while
			 * 'moving' no route is issued, so after a drain window none is still
			 * in flight. A route this replica issued is waited for up to
			 * CP_ROUTE_DRAIN_MS after its issuance; one another replica may
			 * have issued, --move-drain after 'moving' (last_active, in seconds,
			 * is touched by every route issued: a sandbox routed in the last
			 * second waits, an idle one moves at once). */
			int64_t active = cp_rows_i64(s->rows, s->r, C_ACTIVE, 0);
			set_state(st, id, "moving", NULL);
			uint64_t until = 0, routed = recent_route_at(cp, id);
			if (cp->move_drain_ms > 0 && active >= spaced_now() - 1)
				until = spaced_mono_ns() + (uint64_t)cp->move_drain_ms * 1000000u;
			if (cp->move_drain_ms > 0 && routed > 0 && routed + CP_ROUTE_DRAIN_MS * 1000000ull > until)
				until = routed + CP_ROUTE_DRAIN_MS * 1000000ull;
			sleep_until_ns(until);
			msg = json_pack("{s:s,s:o,s:b}", "type", "deactivate", "identity", spaced_identity_to_json(&idn),
			                "keep_paused", 1);
			if ((r = push_wait(cp, st, cur, msg, NULL, &why)) < 0)
				goto ack_fail_error;
			json_decref(msg);
			msg = json_pack("{s:s,s:o,s:s}", "type", "snapshot", "identity", spaced_identity_to_json(&idn),
			                "url", snapshot_url(cp, path, sizeof path, id, gen));
			if ((r = push_wait(cp, st, cur, msg, &res, &why)) < 0)
				goto ack_fail_error;
			char hex[65], nb[24];
			snapshot_result(res, hex, nb);
			if (CP_Q(st, NULL, NULL,
			         "UPDATE sandboxes SET snapshot = $2, snapshot_hash = $3, snapshot_bytes = $4, state = 'stopped' "
			         "WHERE id = $1",
			         id, path, hex[0] ? hex : NULL, nb) == 0)
				cp_snapshots_drop_others(cp, id, path);
			status = start_execution(cp, st, s, &p, path, hex[0] ? hex : NULL, 0, body);
			if (status != 0)
				goto out;
			retire_elsewhere(cp, st, id); /* the source, kept frozen until now */
			goto done;
		}
		if (strcmp(state, "failed") == 0) {
			/* its execution died on its worker (cp_execution_ended): a new,
			 * greater generation (I2) — never the dead one again — from the
			 * last snapshot when there is one, else from its template */
			const char *snap = col(s, C_SNAP);
			/* on the worker asked for; else where it ran, when that worker can
			 * take it (its caches are warm), else any */
			status = worker[0] == 0 && cur != NULL ? place_sandbox(st, s, cur, NULL, &p, body) : -1;
			if (status != 0) {
				json_decref(*body);
				*body = NULL;
				if ((status = place_sandbox(st, s, worker, NULL, &p, body)) != 0)
					goto out;
			}
			/* one that its restart policy gave up on starts counting again */
			CP_Q(st, NULL, NULL, "UPDATE sandboxes SET restarts = 0, restarts_since = 0 WHERE id = $1 AND restarts_since < 0",
			     id);
			status = start_execution(cp, st, s, &p, snap, snap ? col(s, C_SNAPHASH) : NULL, 0, body);
			if (!worker[0])
				status = start_elsewhere(cp, st, tenant, id, NULL, p.worker, status, body);
			if (status != 0)
				goto out;
			retire_elsewhere(cp, st, id);
			goto done;
		}
		if (strcmp(state, "stopped") == 0 || strcmp(state, "error") == 0) {
			/* a start from the last snapshot (new generation) or, without one, a
			 * new activation of the same generation on the same worker */
			const char *snap = col(s, C_SNAP);
			int same = snap == NULL;
			if (same && cur == NULL)
				goto wrong_state;
			if ((status = place_sandbox(st, s, worker[0] ? worker : (same ? cur : ""), NULL, &p, body)) != 0)
				goto out;
			if (same && strcmp(p.worker, cur) != 0)
				goto wrong_state;
			status = same ? start_again(cp, st, s, &p, body)
			              : start_execution(cp, st, s, &p, snap, col(s, C_SNAPHASH), 0, body);
			if (!same && !worker[0])
				status = start_elsewhere(cp, st, tenant, id, NULL, p.worker, status, body);
			if (status != 0)
				goto out;
			if (!same)
				retire_elsewhere(cp, st, id);
			goto done;
		}
		goto wrong_state;
	}
	*body = cp_error("not-found", "no such operation");
	status = 404;
	goto out;

done:
	*body = cp_sandbox_json(st, tenant, id);
	status = 200;
	goto out;
wrong_state:
	snprintf(errtext, sizeof errtext, "cannot %s a sandbox in state %s", op, state);
	*body = cp_error("wrong-state", errtext);
	status = 409;
	goto out;
ack_fail_error:
	status = ack_status(r, op, why, body, errtext, sizeof errtext);
	set_state(st, id, "error", errtext);
	goto out;
ack_fail:
	status = ack_status(r, op, why, body, errtext, sizeof errtext);
out:
	free(why);
	free(res);
	json_decref(msg);
	return status;
}

int cp_op_simple(struct cp *cp, struct cp_store *st, const char *tenant, const char *id, const char *op,
                 const char *worker, json_t **body)
{
	char lease[SPACED_NAME_MAX], now[24];
	struct sbx s;
	char rnd[SPACED_NAME_MAX];
	cp_random_name(rnd, "");
	/* "<op>.<random>@<replica>": a restarted replica releases its own dead leases */
	snprintf(lease, sizeof lease, "%.10s.%.16s@%s", op, rnd, cp->replica_id);
	int r = lease_take(cp, st, tenant, id, lease);
	if (r == SPACED_ENOENT) {
		*body = cp_error("not-found", "no such sandbox");
		return 404;
	}
	if (r == SPACED_EBUSY) {
		*body = cp_error("busy", "another lifecycle operation on this sandbox is in progress");
		return 409;
	}
	if (r < 0 || (r = sbx_load(st, tenant, id, &s)) < 0) {
		*body = cp_error("internal", spaced_strerror(r));
		return 500;
	}
	CP_Q(st, NULL, NULL, "UPDATE sandboxes SET last_active = $2 WHERE id = $1", id, cp_i64(now, spaced_now()));
	lease_hold(id, lease);
	int status = run_op(cp, st, tenant, &s, op, worker ? worker : "", body);
	lease_hold(NULL, NULL);
	cp_rows_free(s.rows);
	lease_drop(st, id, lease);
	if (status == 200 && strcmp(op, "delete") != 0) {
		json_decref(*body);
		*body = cp_sandbox_json(st, tenant, id);
	}
	return status;
}

/* Paused by the idle timeout, and created with auto_resume. */
static bool auto_resumable(struct cp_store *st, const char *id)
{
	struct cp_rows *rows = NULL;
	bool yes = false;
	if (CP_Q(st, &rows, NULL, "SELECT spec, idle_paused FROM sandboxes WHERE id = $1", id) == 0 && rows->nrows == 1 &&
	    cp_rows_i64(rows, 0, 1, 0) == 1) {
		json_error_t jerr;
		json_t *spec = json_loads(cp_rows_get(rows, 0, 0), JSON_REJECT_DUPLICATES, &jerr);
		yes = json_is_true(json_object_get(spec, "auto_resume"));
		json_decref(spec);
	}
	cp_rows_free(rows);
	return yes;
}

int cp_op_timeout(struct cp_store *st, const char *tenant, const char *id, int64_t seconds, json_t **body)
{
	struct sbx s;
	char ml[24];
	int r = sbx_load(st, tenant, id, &s);
	if (r == SPACED_ENOENT) {
		*body = cp_error("not-found", "no such sandbox");
		return 404;
	}
	if (r < 0) {
		*body = cp_error("internal", spaced_strerror(r));
		return 500;
	}
	/* reaped `seconds` from now: its absolute lifetime counted from creation */
	int64_t created = cp_rows_i64(s.rows, s.r, C_CREATED, 0);
	int64_t life = seconds == 0 ? 0 : spaced_now() - created + seconds;
	cp_rows_free(s.rows);
	if ((r = CP_Q(st, NULL, NULL, "UPDATE sandboxes SET max_lifetime = $3 WHERE id = $1 AND tenant = $2", id, tenant,
	              cp_i64(ml, life < 1 && seconds ? 1 : life))) < 0) {
		*body = cp_error("store", spaced_strerror(r));
		return 503;
	}
	*body = cp_sandbox_json(st, tenant, id);
	return 200;
}

int cp_op_network(struct cp *cp, struct cp_store *st, const char *tenant, const char *id, const char *network,
                  json_t **body)
{
	char op[SPACED_NAME_MAX], rnd[SPACED_NAME_MAX], errtext[512];
	struct sbx s = {NULL, 0};
	json_error_t jerr;
	json_t *spec = NULL, *msg = NULL;
	char *spec_text = NULL, *why = NULL;
	int status = 500, r;
	cp_random_name(rnd, "");
	snprintf(op, sizeof op, "network.%.16s@%s", rnd, cp->replica_id);
	if ((r = lease_take(cp, st, tenant, id, op)) < 0) {
		*body = r == SPACED_ENOENT ? cp_error("not-found", "no such sandbox")
		                           : cp_error("busy", "another operation is in progress on this sandbox");
		return r == SPACED_ENOENT ? 404 : r == SPACED_EBUSY ? 409 : 500;
	}
	if ((r = sbx_load(st, tenant, id, &s)) < 0 || (spec = json_loads(col(&s, C_SPEC), JSON_REJECT_DUPLICATES, &jerr)) == NULL) {
		*body = cp_error("internal", "stored spec unreadable");
		goto out;
	}
	/* stored first: whatever runs next (a resume, a move) starts under it */
	json_object_set_new(spec, "network", cp_network_or_default(network));
	spec_text = json_dumps(spec, JSON_COMPACT | JSON_PRESERVE_ORDER);
	if (spec_text == NULL || (r = CP_Q(st, NULL, NULL, "UPDATE sandboxes SET spec = $2 WHERE id = $1", id, spec_text)) < 0) {
		*body = cp_error("internal", spaced_strerror(r));
		goto out;
	}
	const char *state = col(&s, C_STATE), *worker = col(&s, C_WORKER);
	bool live = worker != NULL && (strcmp(state, "running") == 0 || strcmp(state, "paused") == 0);
	if (live) {
		/* applied on the worker before the answer: the change is live */
		msg = json_pack("{s:s,s:s,s:o}", "type", "net", "sandbox", id, "network", cp_network_or_default(network));
		lease_hold(id, op);
		r = msg ? push_wait(cp, st, worker, msg, NULL, &why) : SPACED_ENOMEM;
		lease_hold(NULL, NULL);
		if (r < 0) {
			status = ack_status(r, "net", why, body, errtext, sizeof errtext);
			goto out;
		}
	}
	*body = cp_sandbox_json(st, tenant, id);
	status = 200;
out:
	lease_drop(st, id, op);
	free(why);
	free(spec_text);
	json_decref(spec);
	json_decref(msg);
	cp_rows_free(s.rows);
	return status;
}

int cp_op_route(struct cp *cp, struct cp_store *st, const char *tenant, const char *id,
                const struct cp_route_req *rt, json_t **body)
{
	struct sbx s;
	struct spaced_cap cap;
	struct cp_rows *w = NULL;
	char *claims = NULL, *token = NULL, now[24], exp[21];
	size_t clen;
	/* noted before the sandbox is read: a move that commits 'moving' after
	 * this read sees the note and waits for this route (the move drain) */
	recent_route_note(cp, id);
	int status = 500, r = sbx_load(st, tenant, id, &s);
	if (r == SPACED_ENOENT) {
		*body = cp_error("not-found", "no such sandbox");
		return 404;
	}
	if (r < 0) {
		*body = cp_error("internal", spaced_strerror(r));
		return 500;
	}
	if ((lease_is(col(&s, C_OP), "delete") && cp_rows_i64(s.rows, s.r, C_OPUNTIL, 0) >= spaced_now()) ||
	    strcmp(col(&s, C_STATE), "deleting") == 0) {
		/* its delete is on its way: nothing will serve it (a client whose
		 * stream was cut by it learns that, not the state it had) */
		*body = cp_error("not-found", "the sandbox is being deleted");
		status = 404;
		goto out;
	}
	if (strcmp(col(&s, C_STATE), "paused") == 0 && auto_resumable(st, id)) {
		/* paused for idleness, and it asked to come back when used: a resume
		 * (the same execution thawed; a new generation only when it must
		 * move), then the route of what serves it now (V1–V5 unchanged: the
		 * client just resolves a route) */
		json_t *b = NULL;
		int rs = cp_op_simple(cp, st, tenant, id, "resume", NULL, &b);
		json_decref(b);
		cp_rows_free(s.rows);
		if ((r = sbx_load(st, tenant, id, &s)) < 0) {
			*body = cp_error("internal", spaced_strerror(r));
			return 500;
		}
		if (rs >= 300)
			spaced_log("spaced-cp", "level=warn event=auto-resume-failed sandbox=%s status=%d", id, rs);
	}
	if (strcmp(col(&s, C_STATE), "running") != 0 || identity_of(&s, &cap.id) < 0) {
		char m[640];
		const char *why = col(&s, C_LASTERR);
		if (strcmp(col(&s, C_STATE), "failed") == 0 && why != NULL)
			snprintf(m, sizeof m, "the sandbox is failed (%.500s): resume starts a new generation", why);
		else
			snprintf(m, sizeof m, "the sandbox is %s: no execution serves it", col(&s, C_STATE));
		*body = json_pack("{s:s,s:s,s:s}", "error", "not-running", "message", m, "state", col(&s, C_STATE));
		status = 409;
		goto out;
	}
	memset(&cap, 0, sizeof cap);
	identity_of(&s, &cap.id);
	int64_t t = spaced_now();
	cap.purposes = rt->purposes;
	cap.cls = rt->serviceport ? SPACED_CLASS_SERVICEPORT : SPACED_CLASS_CONTROL;
	cap.port = rt->port;
	snprintf(cap.protocol, sizeof cap.protocol, "%s", rt->serviceport ? rt->protocol : "");
	cap.iat = cap.nbf = t;
	cap.exp = t + SPACED_CAP_LIFETIME;
	cp_random_name(cap.jti, "cap-");
	if ((r = spaced_cap_claims_encode(&cap, &claims, &clen)) < 0 || (r = cp_signer_ask(cp, 'S', claims, &token)) < 0) {
		*body = cp_error("signer", spaced_strerror(r));
		goto out;
	}
	if ((r = CP_Q(st, &w, NULL, "SELECT url FROM workers WHERE id = $1", cap.id.worker)) < 0) {
		*body = cp_error("internal", spaced_strerror(r));
		goto out;
	}
	/* activity for the idle timeout; at most one write per second per sandbox */
	CP_Q(st, NULL, NULL, "UPDATE sandboxes SET last_active = $2 WHERE id = $1 AND last_active < $2", id, cp_i64(now, t));
	spaced_time_format(cap.exp, exp);
	*body = json_pack("{s:o,s:s?,s:s,s:s,s:s}", "identity", spaced_identity_to_json(&cap.id), "worker_url",
	                  cp_rows_get(w, 0, 0), "capability", token, "expires_at", exp, "class",
	                  spaced_cap_class_name(cap.cls));
	if (rt->serviceport) {
		json_object_set_new(*body, "port", json_integer(rt->port));
		json_object_set_new(*body, "protocol", json_string(rt->protocol));
		/* the execution's ServicePort gateway on its worker: a URL on that machine */
		struct cp_rows *g = NULL;
		if (CP_Q(st, &g, NULL, "SELECT gateway FROM sandboxes WHERE id = $1", id) == 0 && cp_rows_i64(g, 0, 0, 0) > 0) {
			char url[192];
			/* a worker that speaks TLS has TLS gateways, with its certificate's
			 * *.gw.localhost names */
			const char *wu = cp_rows_get(w, 0, 0);
			bool tls = wu && strncmp(wu, "https://", 8) == 0;
			snprintf(url, sizeof url, "%s://%u-%s.%slocalhost:%lld/", tls ? "https" : "http", (unsigned)rt->port, id,
			         tls ? "gw." : "", (long long)cp_rows_i64(g, 0, 0, 0));
			json_object_set_new(*body, "url", json_string(url));
			json_object_set_new(*body, "gateway_port", json_integer(cp_rows_i64(g, 0, 0, 0)));
		}
		cp_rows_free(g);
	}
	status = 200;
out:
	free(claims);
	free(token);
	cp_rows_free(w);
	cp_rows_free(s.rows);
	return status;
}

void cp_execution_ended(struct cp *cp, struct cp_store *st, const char *worker, const struct spaced_identity *id,
                        const char *reason)
{
	char gen[24], now[24], err[400];
	long changed = 0;
	(void)cp;
	/* a worker speaks only of its own executions; the whole identity must be
	 * the current one: a report of an older generation, of another
	 * activation, or repeated after a resume changes nothing */
	if (strcmp(id->worker, worker) == 0) {
		snprintf(err, sizeof err, "its execution ended on worker %s: %s", worker, reason);
		CP_Q(st, NULL, &changed,
		     "UPDATE sandboxes SET state = 'failed', last_error = $6, last_active = $7, idle_paused = 0 "
		     "WHERE id = $1 AND generation = $2 AND worker = $3 AND substrate = $4 AND activation = $5 "
		     "AND deleted = 0 AND state IN ('running', 'paused', 'starting')",
		     id->sandbox, cp_i64(gen, (int64_t)id->generation), id->worker, id->substrate, id->activation, err,
		     cp_i64(now, spaced_now()));
	}
	spaced_log("spaced-cp", "level=%s event=execution-ended worker=%s sandbox=%s generation=%llu outcome=%s reason=\"%s\"",
	           changed == 1 ? "warn" : "info", worker, id->sandbox, (unsigned long long)id->generation,
	           changed == 1 ? "failed" : strcmp(id->worker, worker) != 0 ? "ignored-other-worker" : "ignored-not-current",
	           reason);
}

/* A failed sandbox whose restart policy is "on-failure" is resumed by the
 * reaper (a new generation, I2) at most CP_RESTART_BURST times within
 * CP_RESTART_WINDOW_S seconds of its first restart; then it is left failed
 * (restarts_since = -1, said in last_error) until someone resumes it. */
#define CP_RESTART_BURST 5
#define CP_RESTART_WINDOW_S 600

static void restart_failed(struct cp *cp, struct cp_store *st, const char *tenant, const char *id, int64_t t)
{
	struct sbx s;
	json_error_t jerr;
	char nb[24], sb[24];
	if (sbx_load(st, tenant, id, &s) < 0)
		return;
	json_t *spec = json_loads(col(&s, C_SPEC), JSON_REJECT_DUPLICATES, &jerr);
	json_t *rp = json_object_get(spec, "restart");
	/* still failed: another replica's reaper may have restarted it since the list was read */
	bool on_failure = json_is_string(rp) && strcmp(json_string_value(rp), "on-failure") == 0 &&
	                  strcmp(col(&s, C_STATE), "failed") == 0;
	int64_t n = cp_rows_i64(s.rows, s.r, C_RESTARTS, 0), since = cp_rows_i64(s.rows, s.r, C_RESTARTS_SINCE, 0);
	json_decref(spec);
	cp_rows_free(s.rows);
	if (!on_failure || since < 0)
		return; /* no policy, or left failed */
	if (since < t - CP_RESTART_WINDOW_S) {
		n = 0;
		since = t;
	}
	if (n >= CP_RESTART_BURST) {
		char tail[128];
		snprintf(tail, sizeof tail, " (restarted %d times within %d s: left failed)", CP_RESTART_BURST,
		         CP_RESTART_WINDOW_S);
		CP_Q(st, NULL, NULL,
		     "UPDATE sandboxes SET restarts_since = -1, last_error = COALESCE(last_error, '') || $2 "
		     "WHERE id = $1 AND state = 'failed'",
		     id, tail);
		spaced_log("spaced-cp", "level=warn event=restart-limit sandbox=%s restarts=%lld", id, (long long)n);
		return;
	}
	/* counted when it started: a restart that found no worker (503) is tried
	 * again a second later without using up the limit */
	json_t *body = NULL;
	int status = cp_op_simple(cp, st, tenant, id, "resume", NULL, &body);
	if (status == 200)
		CP_Q(st, NULL, NULL, "UPDATE sandboxes SET restarts = $2, restarts_since = $3 WHERE id = $1", id,
		     cp_i64(nb, n + 1), cp_i64(sb, since));
	spaced_log("spaced-cp", "level=info event=restart sandbox=%s restart=%lld status=%d generation=%lld", id,
	           (long long)(n + 1), status, (long long)json_integer_value(json_object_get(body, "generation")));
	json_decref(body);
}

void cp_reap(struct cp *cp, struct cp_store *st)
{
	struct cp_rows *rows = NULL;
	char now[24], retry[24], soon[24];
	int64_t t = spaced_now();
	/* absolute timeout: kill; idle timeout: pause; an operation whose holder
	 * died (its lease expired mid-way) or whose recovery failed: finish it with
	 * a resume, tried again every 5 s while its worker is connected */
	if (CP_Q(st, &rows, NULL,
	         /* a sum has no column affinity: in SQLite it would be compared
	          * with the text-bound parameter as a number with a string
	          * (always less), so every sandbox with a lifetime or an idle
	          * timeout would be reaped at the next tick */
	         "SELECT id, tenant, 'delete', NULL, 0 FROM sandboxes WHERE deleted = 0 AND max_lifetime > 0 "
	         "AND created + max_lifetime < CAST($1 AS BIGINT) AND state <> 'deleting' "
	         "UNION ALL SELECT id, tenant, 'pause', NULL, 0 FROM sandboxes WHERE deleted = 0 AND state = 'running' "
	         "AND idle_timeout > 0 AND last_active + idle_timeout < CAST($1 AS BIGINT) "
	         "UNION ALL SELECT s.id, s.tenant, 'resume', CASE WHEN s.state = 'stopped' THEN NULL ELSE s.worker END, "
	         "COALESCE(w.channel_until, 0) FROM sandboxes s LEFT JOIN workers w ON w.id = s.worker "
	         "WHERE s.deleted = 0 AND (s.op IS NULL OR s.op_until < $1) "
	         "AND s.state IN ('starting', 'moving', 'stopped') AND s.last_active < $2 "
	         /* a failed sandbox, a second after its failure (restart_failed decides) */
	         "UNION ALL SELECT id, tenant, 'restart', NULL, 0 FROM sandboxes WHERE deleted = 0 AND state = 'failed' "
	         "AND restarts_since >= 0 AND spec LIKE '%\"restart\":\"on-failure\"%' "
	         "AND (op IS NULL OR op_until < $1) AND last_active < $3",
	         cp_i64(now, t), cp_i64(retry, t - 5), cp_i64(soon, t - 1)) < 0)
		return;
	for (int i = 0; i < rows->nrows && !cp->stopping; i++) {
		json_t *body = NULL;
		/* an interrupted start or move is finished on its worker once that
		 * worker is live (column 3: the worker it waits for, NULL for none) */
		const char *wait_for = cp_rows_get(rows, i, 3);
		if (wait_for != NULL && !cp_worker_live(wait_for, cp_rows_i64(rows, i, 4, 0), t))
			continue;
		if (strcmp(cp_rows_get(rows, i, 2), "restart") == 0) {
			restart_failed(cp, st, cp_rows_get(rows, i, 1), cp_rows_get(rows, i, 0), t);
			continue;
		}
		int status = cp_op_simple(cp, st, cp_rows_get(rows, i, 1), cp_rows_get(rows, i, 0),
		                          cp_rows_get(rows, i, 2), NULL, &body);
		/* paused for idleness: an auto-resume sandbox comes back at its next route */
		if (status == 200 && strcmp(cp_rows_get(rows, i, 2), "pause") == 0)
			CP_Q(st, NULL, NULL, "UPDATE sandboxes SET idle_paused = 1 WHERE id = $1 AND state = 'paused'",
			     cp_rows_get(rows, i, 0));
		spaced_log("spaced-cp", "level=info event=timeout op=%s sandbox=%s status=%d", cp_rows_get(rows, i, 2),
		           cp_rows_get(rows, i, 0), status);
		json_decref(body);
	}
	cp_rows_free(rows);
	/* deletes that waited for a worker's confirmation */
	if (!cp->stopping)
		cp_deleting_finish(cp, st);
}

/* ---- acknowledged messages' bodies (cp.h cp_outbox_compact; the reaper's thread) ---- */

#define COMPACT_BATCH 20000 /* outbox rows compacted per worker and sweep at most */

/* A row per worker: its id, its highest acknowledged seq, how far the sweep
 * named by done_col (a column of workers) got, and its first seq not
 * acknowledged. acked_prefix_next: row i's range to sweep next, (*from,
 * returned], within the prefix it acknowledged (below its first message not
 * acknowledged), at most batch rows. */
static int acked_prefixes(struct cp_store *st, const char *done_col, struct cp_rows **out)
{
	char sql[256];
	snprintf(sql, sizeof sql,
	         "SELECT k.id, k.acked_seq, k.%s, (SELECT MIN(u.seq) FROM outbox u WHERE u.worker = k.id "
	         "AND u.acked = 0) FROM workers k",
	         done_col);
	return CP_Q0(st, out, NULL, sql);
}

static int64_t acked_prefix_next(struct cp_rows *w, int i, int64_t batch, int64_t *from)
{
	int64_t upto = cp_rows_i64(w, i, 1, 0), unacked = cp_rows_i64(w, i, 3, INT64_MAX);
	*from = cp_rows_i64(w, i, 2, 0);
	if (unacked != INT64_MAX && unacked - 1 < upto)
		upto = unacked - 1;
	return upto > *from + batch ? *from + batch : upto;
}

long cp_outbox_compact(struct cp *cp, struct cp_store *st)
{
	struct cp_rows *w = NULL;
	long rows = 0;
	(void)cp;
	if (acked_prefixes(st, "outbox_compacted_to", &w) < 0)
		return 0;
	for (int i = 0; i < w->nrows; i++) {
		const char *wid = cp_rows_get(w, i, 0);
		int64_t from, upto = acked_prefix_next(w, i, COMPACT_BATCH, &from);
		/* (cp.h: a stub sent again changes nothing) */
		if (wid == NULL || upto <= from || cp_store_begin(st) < 0)
			continue;
		long k = 0;
		char fb[24], ub[24];
		if (CP_Q(st, NULL, &k,
		         "UPDATE outbox SET body = '{\"seq\":' || seq || ',\"type\":\"' || type || '\",\"compacted\":true}' "
		         "WHERE worker = $1 AND seq > CAST($2 AS BIGINT) AND seq <= CAST($3 AS BIGINT) AND LENGTH(body) > 200",
		         wid, cp_i64(fb, from), cp_i64(ub, upto)) < 0 ||
		    CP_Q(st, NULL, NULL,
		         "UPDATE workers SET outbox_compacted_to = CAST($2 AS BIGINT) WHERE id = $1 AND "
		         "outbox_compacted_to < CAST($2 AS BIGINT)",
		         wid, ub) < 0 ||
		    cp_store_commit(st) < 0) {
			cp_store_rollback(st);
			continue;
		}
		rows += k;
	}
	cp_rows_free(w);
	if (rows > 0)
		spaced_log("spaced-cp", "level=info event=outbox-compacted rows=%ld", rows);
	return rows;
}

/* ---- deleted sandboxes' rows (cp.h cp_deleted_sweep; the reaper's thread) ---- */

#define OUTBOX_BATCH 20000 /* outbox rows removed per worker and sweep at most */

int cp_deleted_sweep(struct cp *cp, struct cp_store *st)
{
	if (cp->retain_deleted <= 0)
		return 0;
	char cut[24];
	long n = 0;
	cp_i64(cut, spaced_now() - cp->retain_deleted);
	if (cp_store_begin(st) < 0)
		return 0;
	if (CP_Q(st, NULL, NULL,
	         "DELETE FROM generations WHERE sandbox IN "
	         "(SELECT id FROM sandboxes WHERE deleted > 0 AND deleted < CAST($1 AS BIGINT))",
	         cut) < 0 ||
	    CP_Q(st, NULL, &n, "DELETE FROM sandboxes WHERE deleted > 0 AND deleted < CAST($1 AS BIGINT)", cut) < 0 ||
	    cp_store_commit(st) < 0) {
		cp_store_rollback(st);
		return 0;
	}
	/* each worker's acknowledged messages older than that, a prefix of its
	 * outbox: below its first one not acknowledged; at most OUTBOX_BATCH
	 * rows per worker and sweep (a store that kept months catches up) */
	struct cp_rows *w = NULL;
	long rows = 0;
	if (acked_prefixes(st, "outbox_pruned_to", &w) == 0) {
		for (int i = 0; i < w->nrows; i++) {
			const char *wid = cp_rows_get(w, i, 0);
			int64_t from, upto = acked_prefix_next(w, i, OUTBOX_BATCH, &from);
			struct cp_rows *mx = NULL;
			char ub[24], fb[24];
			int64_t to = 0;
			/* the last message of that range made before the cut, every one before it acknowledged */
			if (wid == NULL || upto <= from ||
			    CP_Q(st, &mx, NULL,
			         "SELECT MAX(seq) FROM outbox WHERE worker = $1 AND seq > CAST($2 AS BIGINT) AND "
			         "seq <= CAST($3 AS BIGINT) AND created < CAST($4 AS BIGINT)",
			         wid, cp_i64(fb, from), cp_i64(ub, upto), cut) < 0 ||
			    (to = cp_rows_i64(mx, 0, 0, 0)) <= from) {
				cp_rows_free(mx);
				continue;
			}
			cp_rows_free(mx);
			long k = 0;
			char tb[24];
			cp_i64(tb, to);
			if (cp_store_begin(st) < 0)
				continue;
			if (CP_Q(st, NULL, &k, "DELETE FROM outbox WHERE worker = $1 AND seq <= CAST($2 AS BIGINT)", wid, tb) < 0 ||
			    CP_Q(st, NULL, NULL,
			         "UPDATE workers SET outbox_pruned_to = CAST($2 AS BIGINT) WHERE id = $1 AND "
			         "outbox_pruned_to < CAST($2 AS BIGINT)",
			         wid, tb) < 0 ||
			    cp_store_commit(st) < 0) {
				cp_store_rollback(st);
				continue;
			}
			rows += k;
		}
	}
	cp_rows_free(w);
	if (n > 0 || rows > 0)
		spaced_log("spaced-cp", "level=info event=deleted-swept sandboxes=%ld outbox_rows=%ld", n, rows);
	return (int)n;
}
