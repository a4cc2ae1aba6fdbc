/*
 * gate_metrics.c — the worker's metrics in the Prometheus text exposition
 * format (version 0.0.4), built from the gate's counters and, per sandbox,
 * from the executor's measure of every live execution. node-api serves them
 * on its metrics listener (spaced-node --metrics-listen).
 */
#include "gate.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spaced_error.h"
#include "substrate.h"
#include "vcache.h"

/* Upper bounds of the control operations' histogram, in seconds. */
static const double lat_bounds[GATE_LAT_BUCKETS - 1] = {0.001, 0.002, 0.005, 0.01, 0.025, 0.05,
                                                        0.1,   0.25,  0.5,   1.0,  2.5};

void gate_metrics_ctl(struct mgr *m, unsigned kind, uint64_t ns, bool ok)
{
	if (kind == 0 || kind >= GATE_CTL_KINDS)
		return;
	m->ctl_n[kind]++;
	m->ctl_failed[kind] += !ok;
	m->ctl_sum_ns[kind] += ns;
	double s = (double)ns / 1e9;
	unsigned b = 0;
	while (b < GATE_LAT_BUCKETS - 1 && s > lat_bounds[b])
		b++;
	m->ctl_hist[kind][b]++;
}

static void put(struct spaced_buf *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct spaced_buf *o, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	if (n > 0)
		spaced_buf_append(o, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static void family(struct spaced_buf *o, const char *name, const char *type, const char *help)
{
	put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static const char *verdict_name(int v)
{
	return v == SPACED_ALLOW ? "ALLOW" : v == SPACED_REFRESH_ROUTE ? "REFRESH_ROUTE" : "DENY";
}

/* Label values here are names ([A-Za-z0-9._-]) or fixed words: nothing to escape. */
static void usage_metrics(struct spaced_buf *o, json_t *usage)
{
	static const struct {
		const char *key, *name, *type, *help;
	} u[] = {
		{"cpu_usec", "spaced_sandbox_cpu_seconds_total", "counter", "CPU time used by the sandbox's execution."},
		{"memory_bytes", "spaced_sandbox_memory_bytes", "gauge", "Memory the sandbox's execution uses now."},
		{"memory_peak_bytes", "spaced_sandbox_memory_peak_bytes", "gauge", "Highest memory use of the execution."},
		{"oom_kills", "spaced_sandbox_oom_kills_total", "counter", "Processes of the sandbox killed at its memory limit."},
		{"pids", "spaced_sandbox_tasks", "gauge", "Tasks in the sandbox's execution."},
		{"disk_bytes", "spaced_sandbox_disk_bytes", "gauge", "Bytes of the sandbox's writable state in use."},
	};
	for (size_t k = 0; k < sizeof u / sizeof u[0]; k++) {
		family(o, u[k].name, u[k].type, u[k].help);
		const char *sb;
		json_t *v;
		json_object_foreach(usage, sb, v) {
			json_t *x = json_object_get(v, u[k].key);
			if (!json_is_number(x))
				continue;
			double d = json_number_value(x);
			if (strcmp(u[k].key, "cpu_usec") == 0)
				put(o, "%s{sandbox=\"%s\"} %.6f\n", u[k].name, sb, d / 1e6);
			else
				put(o, "%s{sandbox=\"%s\"} %.0f\n", u[k].name, sb, d);
		}
	}
}

char *gate_metrics_text(struct mgr *m, json_t *usage)
{
	struct spaced_buf o;
	spaced_buf_init(&o, 16u << 20);
	struct spaced_vcache_stats vs;
	spaced_vcache_stats(m->vc, &vs);

	family(&o, "spaced_node_requests_total", "counter", "Requests admitted or refused by the gate, by outcome.");
	put(&o, "spaced_node_requests_total{outcome=\"ALLOW\",reason=\"ok\"} %llu\n", (unsigned long long)m->n_allow);
	for (int v = SPACED_REFRESH_ROUTE; v <= SPACED_DENY; v++)
		for (int r = 0; r < SPACED_REASON__COUNT; r++)
			if (m->n_refused_by[v][r])
				put(&o, "spaced_node_requests_total{outcome=\"%s\",reason=\"%s\"} %llu\n", verdict_name(v),
				    spaced_reason_name((enum spaced_reason)r), (unsigned long long)m->n_refused_by[v][r]);
	family(&o, "spaced_node_audit_suppressed_total", "counter",
	       "Refusals whose audit line was held back (a caller past its rate: ratelimit.h).");
	put(&o, "spaced_node_audit_suppressed_total %llu\n", (unsigned long long)gate_audit_suppressed_total());
	family(&o, "spaced_node_streams_cancelled_total", "counter",
	       "Open streams whose lease ended when the record changed (S1), by outcome.");
	for (int v = SPACED_REFRESH_ROUTE; v <= SPACED_DENY; v++)
		for (int r = 0; r < SPACED_REASON__COUNT; r++)
			if (m->n_cancelled_by[v][r])
				put(&o, "spaced_node_streams_cancelled_total{outcome=\"%s\",reason=\"%s\"} %llu\n",
				    verdict_name(v), spaced_reason_name((enum spaced_reason)r),
				    (unsigned long long)m->n_cancelled_by[v][r]);
	family(&o, "spaced_node_streams_cut_total", "counter",
	       "Streams cut because their client or execution did not take their bytes for the stall timeout.");
	put(&o, "spaced_node_streams_cut_total %llu\n", (unsigned long long)m->n_cut);
	family(&o, "spaced_node_usage_requests_total", "counter",
	       "Usage requests by how they were answered: with a measurement of their own, or with one shared (running, or made within the last second).");
	put(&o, "spaced_node_usage_requests_total{answer=\"measured\"} %llu\n", (unsigned long long)m->n_usage_measured);
	put(&o, "spaced_node_usage_requests_total{answer=\"shared\"} %llu\n", (unsigned long long)m->n_usage_shared);
	family(&o, "spaced_node_bridge_connections_total", "counter",
	       "Streams to executions by their connection: kept from an earlier request, or new (checked by the bridge).");
	put(&o, "spaced_node_bridge_connections_total{connection=\"kept\"} %llu\n", (unsigned long long)m->n_conn_kept);
	put(&o, "spaced_node_bridge_connections_total{connection=\"new\"} %llu\n", (unsigned long long)m->n_conn_new);
	family(&o, "spaced_node_streams_open", "gauge", "Streams open to executions now.");
	put(&o, "spaced_node_streams_open %zu\n", m->nstreams);
	family(&o, "spaced_node_verification_cache_hits_total", "counter", "Capabilities found in the verification cache.");
	put(&o, "spaced_node_verification_cache_hits_total %llu\n", (unsigned long long)vs.hits);
	family(&o, "spaced_node_verification_cache_misses_total", "counter",
	       "Capabilities verified in full (not in the cache).");
	put(&o, "spaced_node_verification_cache_misses_total %llu\n", (unsigned long long)vs.misses);
	family(&o, "spaced_node_verify_compare_seconds_total", "counter", "Time spent verifying and comparing (R1).");
	put(&o, "spaced_node_verify_compare_seconds_total %.6f\n", (double)m->vc_ns / 1e9);

	family(&o, "spaced_node_control_seconds", "histogram",
	       "Time from a control message's arrival to its acknowledgement, by kind (install and deactivate: R3/R4).");
	for (unsigned k = 1; k < GATE_CTL_KINDS; k++) {
		if (!m->ctl_n[k])
			continue;
		uint64_t cum = 0;
		for (unsigned b = 0; b < GATE_LAT_BUCKETS - 1; b++) {
			cum += m->ctl_hist[k][b];
			put(&o, "spaced_node_control_seconds_bucket{kind=\"%s\",le=\"%g\"} %llu\n", gate_ctl_kind_name(k), lat_bounds[b],
			    (unsigned long long)cum);
		}
		put(&o, "spaced_node_control_seconds_bucket{kind=\"%s\",le=\"+Inf\"} %llu\n", gate_ctl_kind_name(k),
		    (unsigned long long)m->ctl_n[k]);
		put(&o, "spaced_node_control_seconds_sum{kind=\"%s\"} %.6f\n", gate_ctl_kind_name(k), (double)m->ctl_sum_ns[k] / 1e9);
		put(&o, "spaced_node_control_seconds_count{kind=\"%s\"} %llu\n", gate_ctl_kind_name(k), (unsigned long long)m->ctl_n[k]);
	}
	family(&o, "spaced_node_control_failed_total", "counter", "Control messages refused or failed, by kind.");
	for (unsigned k = 1; k < GATE_CTL_KINDS; k++)
		if (m->ctl_n[k])
			put(&o, "spaced_node_control_failed_total{kind=\"%s\"} %llu\n", gate_ctl_kind_name(k),
			    (unsigned long long)m->ctl_failed[k]);

	family(&o, "spaced_node_executions", "gauge", "Executions in the worker's records, by state.");
	static const char *const states[] = {MGR_ST_RUNNING, MGR_ST_PAUSED, MGR_ST_KEPT, MGR_ST_STOPPED};
	for (size_t s = 0; s < sizeof states / sizeof states[0]; s++) {
		unsigned n = 0;
		for (size_t i = 0; i < m->nrecs; i++)
			n += strcmp(m->recs[i].state, states[s]) == 0;
		put(&o, "spaced_node_executions{state=\"%s\"} %u\n", states[s], n);
	}
	family(&o, "spaced_node_jobs_in_flight", "gauge", "Jobs of the executor not yet completed.");
	put(&o, "spaced_node_jobs_in_flight %zu\n", gate_jobs_in_flight(m));
	family(&o, "spaced_node_control_pending", "gauge", "Control operations queued or running.");
	put(&o, "spaced_node_control_pending %zu\n", gate_ctl_pending(m));
	uint64_t rq_ns, rq_thr, rq_thr_ns;
	if (spaced_sub_request_cpu_stat(&rq_ns, &rq_thr, &rq_thr_ns) == 0) {
		family(&o, "spaced_node_request_cpu_seconds_total", "counter",
		       "CPU time of the request path (gate, node-api, link) in its CPU cgroup.");
		put(&o, "spaced_node_request_cpu_seconds_total %.6f\n", (double)rq_ns / 1e9);
		family(&o, "spaced_node_request_cpu_throttled_total", "counter",
		       "Periods (10 ms) in which the request path reached its ceiling (--request-cpu max).");
		put(&o, "spaced_node_request_cpu_throttled_total %llu\n", (unsigned long long)rq_thr);
		family(&o, "spaced_node_request_cpu_throttled_seconds_total", "counter",
		       "Time the request path was held back at its ceiling.");
		put(&o, "spaced_node_request_cpu_throttled_seconds_total %.6f\n", (double)rq_thr_ns / 1e9);
	}
	if (json_is_object(usage))
		usage_metrics(&o, usage);
	if (spaced_buf_append(&o, "", 1) < 0) {
		spaced_buf_free(&o);
		return NULL;
	}
	return (char *)o.data; /* owned by the caller now */
}

/* ---- a metrics request from node-api ---- */

#define USAGE_BATCH 40          /* records per usage-all job (its message stays small) */
#define METRICS_TEXT_MAX (8u << 20) /* the answer at most (within the link's buffer) */

struct metrics_req {
	uint32_t id;      /* node-api's request id */
	unsigned pending; /* usage jobs not yet completed */
	json_t *usage;    /* sandbox -> usage */
};

static void metrics_answer(struct mgr *m, struct metrics_req *q)
{
	char *text = gate_metrics_text(m, q->usage);
	size_t len = text ? strlen(text) : 0;
	if (len > METRICS_TEXT_MAX)
		len = METRICS_TEXT_MAX;
	size_t off = 0;
	do {
		size_t k = len - off > SPACED_FRAME_CHUNK ? SPACED_FRAME_CHUNK : len - off;
		struct spaced_buf b;
		spaced_buf_init(&b, NODE_MSG_MAX);
		spaced_field_put_bytes(&b, (const uint8_t *)text + off, k);
		off += k;
		gate_api_send(m, NODE_MSG_METRICS_TEXT, off == len ? SPACED_FRAME_F_END : 0, q->id, &b);
		spaced_buf_free(&b);
	} while (off < len);
	free(text);
	json_decref(q->usage);
	free(q);
}

static void on_usage_batch(struct mgr *m, uintptr_t ctx, int status, const char *msg, json_t *result, int fd)
{
	(void)msg;
	struct metrics_req *q = (struct metrics_req *)ctx;
	if (fd >= 0)
		close(fd);
	if (status == 0 && json_is_object(result))
		json_object_update(q->usage, result);
	if (--q->pending == 0)
		metrics_answer(m, q);
}

int gate_metrics_request(struct mgr *m, uint32_t id)
{
	struct metrics_req *q = calloc(1, sizeof *q);
	if (!q || !(q->usage = json_object())) {
		free(q);
		return SPACED_ENOMEM;
	}
	q->id = id;
	/* the executions whose usage can be measured: live ones with a launcher */
	json_t *batch = NULL;
	for (size_t i = 0; m->cfg->launch_bin && i <= m->nrecs; i++) {
		const struct mgr_rec *r = i < m->nrecs ? &m->recs[i] : NULL;
		bool live = r && r->pid > 0 &&
		            (strcmp(r->state, MGR_ST_RUNNING) == 0 || strcmp(r->state, MGR_ST_PAUSED) == 0);
		if (live) {
			if (!batch)
				batch = json_array();
			json_array_append_new(batch, mgr_rec_to_json(r));
		}
		if (batch && (json_array_size(batch) == USAGE_BATCH || !r)) {
			q->pending++;
			if (!gate_job(m, "usage-all", json_pack("{s:o}", "recs", batch), on_usage_batch, (uintptr_t)q))
				q->pending--;
			batch = NULL;
		}
	}
	if (q->pending == 0)
		metrics_answer(m, q);
	return 0;
}
