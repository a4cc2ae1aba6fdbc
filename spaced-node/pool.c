/*
 * pool.c — the warm pool, in the gate's loop (pool.h).
 */
#include "pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spaced_error.h"
#include "gate.h"

#define BUCKET_NS (5ull * 1000000000ull) /* demand is counted per 5 s */
#define BUCKETS 12                        /* over the last minute */
#define IDLE_KEY_NS (300ull * 1000000000ull)
#define SHRINK_AFTER_NS (60ull * 1000000000ull)
#define BACKOFF_NS (5ull * 1000000000ull)
#define KEYS_MAX 32
#define PSS_FLOOR_KIB 2048u /* a pooled execution is counted at least this much */
/* Refills wait until creates pause for this long (their starts would take
 * CPU from the claims of a burst), unless creates have kept coming for
 * SUSTAINED_NS without such a pause and a key has fewer than a quarter of its
 * target ready: a start takes longer than a burst of 50 creates, so one begun
 * within a burst serves none of it and takes its CPU (bench-create, no refill
 * within the burst: p99 119 / 128 ms against 134 / 168, 4.2-4.4 ms of CPU
 * per create against 5.3-6.8); demand that does not pause is refilled
 * while it lasts. */
#define QUIET_NS (250ull * 1000000ull)
#define QUIET_MS 250
#define SUSTAINED_NS (1000ull * 1000000ull)

struct pool_entry {
	struct pool_entry *next;
	char name[24];
	bool ready;
	int gateway; /* its ServicePort gateway's port (0: none) */
	struct mgr_rec rec;
};

struct pool_key {
	struct pool_key *next;
	char tmpl[65], tmpl_url[512];
	struct spaced_resources res;
	bool is_default;
	uint32_t buckets[BUCKETS];
	uint64_t bucket; /* the index (mono / BUCKET_NS) of the newest bucket */
	uint64_t last_demand, over_since, backoff_until;
	int starting;
	struct pool_entry *entries;
	uint64_t hits, misses;
};

struct gate_pool {
	struct mgr *m;
	struct pool_key *keys;
	uv_timer_t timer;
	bool timer_on;
	uint64_t next_id;
	uint64_t pss_kib;  /* running average of one pooled execution */
	uint64_t last_take; /* when the last create asked (mono ns) */
	uint64_t run_since; /* when creates began to come without a QUIET_NS pause */
	uint64_t paused_fill; /* when fill last ran in such a pause (mono ns) */
	int starting;
	uint64_t started, failed, stopped, hits, misses;
};

static struct gate_pool P;

static bool enabled(struct mgr *m)
{
	return m->cfg->launch_bin && m->cfg->host_bin && m->cfg->pool_max > 0;
}

static bool same_res(const struct spaced_resources *a, const struct spaced_resources *b)
{
	return a->cpu_milli == b->cpu_milli && a->memory_bytes == b->memory_bytes && a->pids == b->pids &&
	       a->disk_bytes == b->disk_bytes;
}

/* Moves the demand window to now. */
static void roll(struct pool_key *k, uint64_t now)
{
	uint64_t b = now / BUCKET_NS;
	if (b <= k->bucket)
		return;
	uint64_t steps = b - k->bucket;
	for (uint64_t i = 1; i <= steps && i <= BUCKETS; i++)
		k->buckets[(k->bucket + i) % BUCKETS] = 0;
	k->bucket = b;
}

static struct pool_key *key_find(const char *tmpl, const struct spaced_resources *res, bool create, const char *url)
{
	int n = 0;
	for (struct pool_key *k = P.keys; k; k = k->next, n++)
		if (strcmp(k->tmpl, tmpl) == 0 && same_res(&k->res, res)) {
			if (url && url[0])
				snprintf(k->tmpl_url, sizeof k->tmpl_url, "%s", url);
			return k;
		}
	if (!create || n >= KEYS_MAX)
		return NULL;
	struct pool_key *k = calloc(1, sizeof *k);
	if (!k)
		return NULL;
	snprintf(k->tmpl, sizeof k->tmpl, "%s", tmpl);
	snprintf(k->tmpl_url, sizeof k->tmpl_url, "%s", url ? url : "");
	k->res = *res;
	k->bucket = spaced_mono_ns() / BUCKET_NS;
	k->next = P.keys;
	P.keys = k;
	return k;
}

static int count(const struct pool_key *k, bool ready_only)
{
	int n = 0;
	for (const struct pool_entry *e = k->entries; e; e = e->next)
		n += !ready_only || e->ready;
	return n;
}

static int total(void)
{
	int n = 0;
	for (struct pool_key *k = P.keys; k; k = k->next)
		n += count(k, false);
	return n;
}

/* What the key should hold now. */
static int target(struct mgr *m, struct pool_key *k, uint64_t now)
{
	roll(k, now);
	int want = k->is_default ? m->cfg->pool_min : 0;
	for (int i = 0; i < BUCKETS; i++)
		if ((int)k->buckets[i] > want)
			want = (int)k->buckets[i];
	if (want > m->cfg->pool_max)
		want = m->cfg->pool_max;
	return want;
}

static void on_started(struct mgr *m, uintptr_t ctx, int status, const char *msg, json_t *result, int fd);

static void start_one(struct mgr *m, struct pool_key *k)
{
	struct pool_entry *e = calloc(1, sizeof *e);
	if (!e)
		return;
	snprintf(e->name, sizeof e->name, "p%llu-%llu", (unsigned long long)(spaced_mono_ns() / 1000000u % 1000000u),
	         (unsigned long long)++P.next_id);
	/* a placeholder identity: the execution has none until it is claimed */
	spaced_identity_set(&e->rec.r.id, e->name, 1, m->cfg->worker_id, "process", "pool", NULL);
	e->rec.res = k->res;
	snprintf(e->rec.tmpl, sizeof e->rec.tmpl, "%s", k->tmpl);
	snprintf(e->rec.tmpl_url, sizeof e->rec.tmpl_url, "%s", k->tmpl_url);
	snprintf(e->rec.state, sizeof e->rec.state, "pooled");
	json_t *used = json_array();
	for (size_t i = 0; i < m->nrecs; i++)
		if (m->recs[i].uid_base && (m->recs[i].pid || m->recs[i].host_pid))
			json_array_append_new(used, json_integer(m->recs[i].uid_base));
	pool_used_ranges(m, used);
	json_t *args = json_pack("{s:s,s:o,s:o}", "name", e->name, "rec", mgr_rec_to_json(&e->rec), "used", used);
	e->next = k->entries;
	k->entries = e;
	k->starting++;
	P.starting++;
	if (!gate_job(m, "pool-start", args, on_started, (uintptr_t)e)) {
		k->entries = e->next;
		k->starting--;
		P.starting--;
		free(e);
	}
}

static struct pool_key *key_of_entry(const struct pool_entry *e, struct pool_entry ***link)
{
	for (struct pool_key *k = P.keys; k; k = k->next)
		for (struct pool_entry **pp = &k->entries; *pp; pp = &(*pp)->next)
			if (*pp == e) {
				if (link)
					*link = pp;
				return k;
			}
	return NULL;
}

static void stop_entry(struct mgr *m, struct pool_entry *e)
{
	gate_job(m, "stop", json_pack("{s:o}", "rec", mgr_rec_to_json(&e->rec)), NULL, 0);
	P.stopped++;
	free(e);
}

static void fill(struct mgr *m);

static void on_started(struct mgr *m, uintptr_t ctx, int status, const char *msg, json_t *result, int fd)
{
	struct pool_entry *e = (struct pool_entry *)ctx, **link = NULL;
	if (fd >= 0)
		close(fd);
	struct pool_key *k = key_of_entry(e, &link);
	P.starting--;
	if (!k) { /* the pool stopped meanwhile */
		free(e);
		return;
	}
	k->starting--;
	struct mgr_rec got;
	json_t *jr = json_object_get(result, "rec");
	if (status < 0 || !jr || mgr_rec_from_json(jr, &got) < 0 || !got.exec_name[0]) {
		*link = e->next;
		free(e);
		P.failed++;
		k->backoff_until = spaced_mono_ns() + BACKOFF_NS;
		gate_log("level=warn event=pool-start-failed reason=\"%s\"", msg && *msg ? msg : spaced_strerror(status));
		return;
	}
	e->rec = got;
	json_t *gw = json_object_get(result, "gateway");
	e->gateway = json_is_integer(gw) && json_integer_value(gw) > 0 && json_integer_value(gw) < 65536
	                 ? (int)json_integer_value(gw)
	                 : 0;
	e->ready = true;
	P.started++;
	uint64_t pss = (uint64_t)json_integer_value(json_object_get(result, "pss_kib"));
	if (pss > 0)
		P.pss_kib = P.pss_kib ? (P.pss_kib * 7 + pss) / 8 : pss;
	if (m->quit)
		return;
	fill(m);
}

/* Starts what the keys lack and stops what they no longer need. */
static void fill(struct mgr *m)
{
	if (!enabled(m) || m->quit)
		return;
	uint64_t now = spaced_mono_ns();
	uint64_t cost = P.pss_kib > PSS_FLOOR_KIB ? P.pss_kib : PSS_FLOOR_KIB;
	int budget = (int)(m->cfg->pool_memory / 1024u / cost);
	int held = total();
	for (struct pool_key **kp = &P.keys; *kp;) {
		struct pool_key *k = *kp;
		int want = target(m, k, now), have = count(k, false);
		/* demand gone: stop the surplus after a while, the key after longer */
		if (count(k, true) > want) {
			if (!k->over_since)
				k->over_since = now;
			if (now - k->over_since > SHRINK_AFTER_NS) {
				for (struct pool_entry **pp = &k->entries; *pp; pp = &(*pp)->next)
					if ((*pp)->ready) {
						struct pool_entry *e = *pp;
						*pp = e->next;
						stop_entry(m, e);
						held--;
						break;
					}
				k->over_since = now;
			}
		} else {
			k->over_since = 0;
		}
		if (!k->is_default && !k->entries && !k->starting && now - k->last_demand > IDLE_KEY_NS) {
			*kp = k->next;
			free(k);
			continue;
		}
		int ready = count(k, true);
		bool paused = now - P.last_take >= QUIET_NS;
		if (paused)
			P.paused_fill = now;
		bool quiet = paused || (now - P.run_since >= SUSTAINED_NS && ready < (want + 3) / 4);
		while (quiet && have < want && held < budget && P.starting < m->cfg->pool_starts &&
		       now >= k->backoff_until) {
			start_one(m, k);
			have++;
			held++;
		}
		kp = &k->next;
	}
}

static void on_timer(uv_timer_t *t)
{
	fill(t->data);
}

void pool_start(struct mgr *m)
{
	memset(&P, 0, sizeof P);
	P.m = m;
	if (!enabled(m))
		return;
	/* what an earlier gate left in the pool (claimed ones are records') */
	json_t *keep = json_array();
	for (size_t i = 0; i < m->nrecs; i++)
		if (m->recs[i].exec_name[0])
			json_array_append_new(keep, json_string(m->recs[i].exec_name));
	gate_job(m, "pool-reap", json_pack("{s:o}", "keep", keep), NULL, 0);
	struct pool_key *k = key_find("", &m->cfg->limits_default, true, NULL);
	if (k)
		k->is_default = true;
	uv_timer_init(m->loop, &P.timer);
	P.timer.data = m;
	uv_timer_start(&P.timer, on_timer, 200, 1000);
	P.timer_on = true;
}

void pool_stop(struct mgr *m)
{
	if (P.timer_on) {
		uv_timer_stop(&P.timer);
		uv_close((uv_handle_t *)&P.timer, NULL);
		P.timer_on = false;
	}
	/* A gate that stops (the worker is stopped) takes its waiting pooled
	 * executions with it: they serve nobody, and a worker that does not
	 * come back would keep them running. Claimed ones are records' and stay,
	 * like every execution. One still starting when the executor stops too,
	 * or every one of a gate that crashed, is reaped by the next gate. */
	if (enabled(m)) {
		const char **keep = calloc(m->nrecs + 1, sizeof *keep);
		size_t nk = 0;
		for (size_t i = 0; keep && i < m->nrecs; i++)
			if (m->recs[i].exec_name[0])
				keep[nk++] = m->recs[i].exec_name;
		if (keep)
			mgr_pool_exec_reap(m->cfg, keep, nk);
		free(keep);
	}
	while (P.keys) {
		struct pool_key *k = P.keys;
		P.keys = k->next;
		while (k->entries) {
			struct pool_entry *e = k->entries;
			k->entries = e->next;
			if (e->ready)
				free(e);
			/* one still starting is freed by its completion (found in no key) */
		}
		free(k);
	}
}

bool pool_take(struct mgr *m, struct mgr_rec *rec, int *gateway)
{
	*gateway = 0;
	if (!enabled(m))
		return false;
	uint64_t now = spaced_mono_ns();
	struct pool_key *k = key_find(rec->tmpl, &rec->res, true, rec->tmpl_url);
	if (!k)
		return false;
	roll(k, now);
	k->buckets[k->bucket % BUCKETS]++;
	k->last_demand = now;
	struct pool_entry **pp = &k->entries;
	while (*pp && !(*pp)->ready)
		pp = &(*pp)->next;
	bool hit = *pp != NULL;
	if (hit) {
		/* out of the pool before anything else happens: no other create can
		 * take it, and its claim is the only one it ever gets */
		struct pool_entry *e = *pp;
		*pp = e->next;
		rec->pid = e->rec.pid;
		rec->pid_start = e->rec.pid_start;
		rec->host_pid = e->rec.host_pid;
		rec->host_start = e->rec.host_start;
		rec->uid_base = e->rec.uid_base;
		memcpy(rec->exec_name, e->rec.exec_name, sizeof rec->exec_name);
		*gateway = e->gateway;
		free(e);
		k->hits++;
		P.hits++;
	} else {
		k->misses++;
		P.misses++;
	}
	/* a new run once a pause let the refills run (creates 250-260 ms apart,
	 * each before the quiet timer's fill, are one run: else no refill ever) */
	if (now - P.last_take >= QUIET_NS && P.paused_fill > P.last_take)
		P.run_since = now;
	P.last_take = now;
	fill(m);
	/* and again once creates pause */
	if (P.timer_on)
		uv_timer_start(&P.timer, on_timer, QUIET_MS + 10, 1000);
	return hit;
}

void pool_drain_template(struct mgr *m, const char *hash)
{
	for (struct pool_key *k = P.keys; k; k = k->next) {
		if (strcmp(k->tmpl, hash) != 0)
			continue;
		for (struct pool_entry **pp = &k->entries; *pp;) {
			struct pool_entry *e = *pp;
			if (!e->ready) {
				pp = &e->next;
				continue;
			}
			*pp = e->next;
			stop_entry(m, e);
		}
		/* the next start on it goes through the cache's check (and a fetch) */
		k->backoff_until = spaced_mono_ns() + BACKOFF_NS;
	}
	gate_log("level=warn event=pool-drained template=%s reason=\"its cached tree changed\"", hash);
}

void pool_used_ranges(struct mgr *m, json_t *arr)
{
	(void)m;
	for (struct pool_key *k = P.keys; k; k = k->next)
		for (struct pool_entry *e = k->entries; e; e = e->next)
			if (e->ready && e->rec.uid_base)
				json_array_append_new(arr, json_integer(e->rec.uid_base));
}

json_t *pool_status(struct mgr *m)
{
	json_t *keys = json_array();
	int ready = 0;
	uint64_t now = spaced_mono_ns();
	for (struct pool_key *k = P.keys; k; k = k->next) {
		int r = count(k, true);
		ready += r;
		json_array_append_new(keys, json_pack("{s:s,s:o,s:b,s:i,s:i,s:i,s:I,s:I}", "template", k->tmpl,
		                                      "resources", spaced_resources_to_json(&k->res), "default",
		                                      k->is_default, "ready", r, "starting", k->starting, "target",
		                                      enabled(m) ? target(m, k, now) : 0, "hits", (json_int_t)k->hits,
		                                      "misses", (json_int_t)k->misses));
	}
	return json_pack("{s:b,s:o,s:I,s:I,s:i,s:i,s:I,s:I,s:I,s:I,s:I}", "enabled", enabled(m), "keys", keys, "hits",
	                 (json_int_t)P.hits, "misses", (json_int_t)P.misses, "ready", ready, "starting", P.starting,
	                 "started", (json_int_t)P.started, "failed", (json_int_t)P.failed, "stopped",
	                 (json_int_t)P.stopped, "pss_kib", (json_int_t)P.pss_kib, "memory_budget",
	                 (json_int_t)m->cfg->pool_memory);
}
