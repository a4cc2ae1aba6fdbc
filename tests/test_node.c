/*
 * test_node.c — spaced-node with real daemons: two workers on loopback, their
 * admin sockets, spaced-guest executions, HTTP and WebSocket clients. The
 * capabilities are signed here (the node holds verification keys only).
 */
#include <criterion/criterion.h>
#include <glob.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "compare.h"
#include "test_node_util.h"

static char dir[64];
static struct tn_keys keys;
static struct tn_node A, B;

/* The execution cgroups of the launcher pid (spaced-PID-N, the default
 * parent): thawed, then every task in them killed (a frozen task takes no
 * signal: killed as it was, it stayed, in D state, for good). */
static void thaw_and_kill(json_int_t launcher)
{
	char pat[128], line[32];
	snprintf(pat, sizeof pat, "/sys/fs/cgroup/freezer/spaced/spaced-%lld-*", (long long)launcher);
	glob_t g;
	if (glob(pat, GLOB_ONLYDIR, NULL, &g) != 0)
		return;
	for (size_t i = 0; i < g.gl_pathc; i++) {
		char f[PATH_MAX];
		snprintf(f, sizeof f, "%s/freezer.state", g.gl_pathv[i]);
		FILE *w = fopen(f, "w");
		if (w) {
			fputs("THAWED", w);
			fclose(w);
		}
		snprintf(f, sizeof f, "%s/cgroup.procs", g.gl_pathv[i]);
		FILE *r = fopen(f, "r");
		while (r && fgets(line, sizeof line, r))
			if (atoi(line) > 1)
				kill(atoi(line), SIGKILL);
		if (r)
			fclose(r);
	}
	globfree(&g);
}

static void kill_executions(struct tn_node *n)
{
	if (n->pid <= 0)
		return;
	json_t *st = tn_admin(n, "{\"type\":\"status\"}");
	json_t *recs = st ? json_object_get(json_object_get(st, "result"), "records") : NULL;
	size_t i;
	json_t *r;
	json_array_foreach(recs, i, r) {
		const char *sbx = json_string_value(json_object_get(json_object_get(r, "identity"), "sandbox"));
		json_decref(tn_admin(n, "{\"type\":\"destroy\",\"sandbox\":\"%s\"}", sbx ? sbx : ""));
		json_int_t pids[2] = {json_integer_value(json_object_get(r, "pid")),
		                      json_integer_value(json_object_get(r, "host_pid"))};
		if (pids[0] > 1)
			thaw_and_kill(pids[0]);
		for (int k = 0; k < 2; k++) {
			if (pids[k] > 1) {
				kill(-(pid_t)pids[k], SIGKILL);
				kill((pid_t)pids[k], SIGKILL);
			}
		}
	}
	json_decref(st);
}

static void setup(void)
{
	signal(SIGPIPE, SIG_IGN);
	snprintf(dir, sizeof dir, "/tmp/tn-XXXXXX");
	cr_assert(mkdtemp(dir) != NULL);
	tn_keys_init(&keys, dir);
	memset(&A, 0, sizeof A);
	memset(&B, 0, sizeof B);
}

static void teardown(void)
{
	kill_executions(&A);
	kill_executions(&B);
	tn_node_stop(&A);
	tn_node_stop(&B);
	if (getenv("TN_KEEP")) {
		fprintf(stderr, "kept %s\n", dir);
		return;
	}
	/* the workers' egress namespaces outlive spaced-node by design (its
	 * executions keep their network across restarts): pasta and spaced-netd
	 * stopped and the namespace unmounted here, as `spacectl dev down` does */
	/* ... and what a pool's start still under way when its node stopped
	 * made (a launcher, bridge and gateway naming the state directory: the
	 * next gate would have reaped them) */
	char big[1024];
	snprintf(big, sizeof big,
	         "for f in %s/*/net/pasta.pid %s/*/net/netd.pid; do [ -s \"$f\" ] && kill \"$(cat \"$f\")\"; done "
	         "2>/dev/null; pkill -9 -f '^[^ ]*spaced-(launch|host|netgtw) .*%s/' 2>/dev/null; "
	         "for m in $(awk '$2 ~ \"^%s/\" {print $2}' /proc/mounts); do umount -l \"$m\"; done; "
	         "rm -rf %s",
	         dir, dir, dir, dir, dir);
	if (system(big) != 0)
		fprintf(stderr, "cleanup of %s failed\n", dir);
}

TestSuite(node, .init = setup, .fini = teardown, .timeout = 120);

static json_t *status_of(struct tn_node *n)
{
	json_t *st = tn_admin(n, "{\"type\":\"status\"}");
	cr_assert(tn_ok(st), "status failed");
	json_t *res = json_incref(json_object_get(st, "result"));
	json_decref(st);
	return res;
}

static json_int_t allowed_count(struct tn_node *n)
{
	json_t *st = status_of(n);
	json_int_t v = json_integer_value(json_object_get(st, "allowed"));
	json_decref(st);
	return v;
}

/* The number of n's records once it is want, or after 15 s. */
static size_t wait_records(struct tn_node *n, size_t want)
{
	size_t nrec = 0;
	for (int i = 0; i < 300; i++) {
		json_t *s = status_of(n);
		nrec = json_array_size(json_object_get(s, "records"));
		json_decref(s);
		if (nrec == want)
			break;
		tn_sleep_ms(50);
	}
	return nrec;
}

static void must_install(struct tn_node *n, const char *sbx, uint64_t gen, const char *act, bool handoff)
{
	json_t *a = tn_install(n, sbx, gen, act, handoff);
	cr_assert(tn_ok(a), "install %s/%llu/%s on %s failed: %s", sbx, (unsigned long long)gen, act, n->worker,
	          a ? json_dumps(a, 0) : "no answer");
	json_decref(a);
}

static void expect(int port, const char *method, const char *target, const char *tok, int status,
                   const char *outcome, const char *reason)
{
	struct tn_resp r;
	cr_assert_eq(tn_http(port, method, target, tok, NULL, 0, &r), 0, "no answer for %s", target);
	cr_expect_eq(r.status, status, "%s %s: status %d, wanted %d (%s)", method, target, r.status, status,
	             r.body);
	if (outcome)
		cr_expect_str_eq(tn_outcome(&r), outcome, "%s", r.body);
	if (reason)
		cr_expect_str_eq(tn_reason(&r), reason, "%s", r.body);
	if (status == 401 || status == 403 || status == 409)
		cr_expect_str_empty(r.identity, "a refusal carries no serving identity");
	tn_resp_free(&r);
}

/* The hash a snapshot ack reports (issue 5 item 7): 64 lowercase hex digits. */
static void snap_hash_of(json_t *ack, char out[65])
{
	const char *h = json_string_value(json_object_get(json_object_get(ack, "result"), "hash"));
	cr_assert(h && strlen(h) == 64 && strspn(h, "0123456789abcdef") == 64, "snapshot ack without a hash: %s",
	          json_dumps(ack, 0));
	cr_assert(json_integer_value(json_object_get(json_object_get(ack, "result"), "bytes")) > 0);
	memcpy(out, h, 65);
}

/* An install of S generation 8 from snap with hash (NULL: none) is refused with
 * snapshot-mismatch and leaves n without a record of S. */
static void expect_snapshot_refused(struct tn_node *n, const char *snap, const char *hash)
{
	char hf[96] = "";
	if (hash)
		snprintf(hf, sizeof hf, ",\"snapshot_hash\":\"%s\"", hash);
	json_t *i = tn_admin(n,
	                     "{\"type\":\"install\",\"identity\":{\"sandbox\":\"S\",\"generation\":8,\"worker\":"
	                     "\"%s\",\"substrate\":\"process\",\"activation\":\"act-1\",\"pod_uid\":null},"
	                     "\"spec\":{\"snapshot\":\"%s\"%s}}",
	                     n->worker, snap, hf);
	cr_assert(i != NULL);
	cr_expect(!tn_ok(i), "an install from an unverified snapshot was accepted");
	cr_expect_str_eq(json_string_value(json_object_get(i, "code")), "snapshot-mismatch", "%s", json_dumps(i, 0));
	json_decref(i);
	json_t *st = tn_admin(n, "{\"type\":\"status\"}");
	json_t *recs = json_object_get(json_object_get(st, "result"), "records");
	size_t k;
	json_t *rec;
	json_array_foreach(recs, k, rec)
	{
		cr_expect_str_neq(json_string_value(json_object_get(json_object_get(rec, "identity"), "sandbox")), "S",
		                  "a refused install left a record");
	}
	json_decref(st);
}

#define CAP(...) tn_cap(&keys, (struct tn_capspec){__VA_ARGS__})

/* R6, C5, R1: every comparator outcome over HTTP, and refusals never reach the execution. */
/* A destroyed sandbox's record is a tombstone while a capability issued
 * before the destroy may be valid, then forgotten (--forget-after, here 2 s):
 * a create-and-destroy loop — what any tenant can run — does not grow a
 * worker's records in memory, on disk or in STATE/gw; a live record is never
 * forgotten; a restart does not bring a forgotten one back; its capability is
 * refused before (REFRESH_ROUTE: the tombstone) and after (an unknown sandbox):
 * R4 holds either way. */
Test(node, destroyed_records_are_forgotten)
{
	A.forget_after = 2;
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	must_install(&A, "sbx-live", 1, "act-1", false);
	char name[32], path[512];
	for (int i = 0; i < 20; i++) {
		snprintf(name, sizeof name, "sbx-gone-%d", i);
		must_install(&A, name, 1, "act-1", false);
		json_t *d = tn_admin(&A, "{\"type\":\"destroy\",\"sandbox\":\"%s\"}", name);
		cr_assert(tn_ok(d), "destroy %s", name);
		json_decref(d);
	}
	/* the last one destroyed: the first ones may be forgotten already on a
	 * busy machine (twenty installs can take more than --forget-after) */
	snprintf(path, sizeof path, "%s/gw/sbx-gone-19", A.state);
	struct stat sb;
	cr_assert_eq(stat(path, &sb), 0, "the destroyed sandbox's gateway directory is there at first");
	const char *st = "/v1/sandboxes/sbx-gone-19/stat?path=/";
	expect(A.port, "GET", st, CAP(.sandbox = "sbx-gone-19", .generation = 1, .worker = "worker-a"), 409,
	       "REFRESH_ROUTE", NULL);
	size_t nrec = wait_records(&A, 1);
	cr_assert_eq(nrec, 1, "20 destroyed records forgotten, the live one kept: %zu left", nrec);
	cr_assert(stat(path, &sb) < 0 && errno == ENOENT, "the forgotten sandbox's gateway directory is removed");
	snprintf(path, sizeof path, "%s/gw/sbx-live/record.json", A.state);
	cr_assert_eq(stat(path, &sb), 0, "the live sandbox's gateway record stays");
	expect(A.port, "GET", st, CAP(.sandbox = "sbx-gone-19", .generation = 1, .worker = "worker-a"), 403, "DENY",
	       "unknown-sandbox");
	/* on disk too: a restart brings none back, and the live one serves */
	tn_node_stop(&A);
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	json_t *s = status_of(&A);
	json_t *recs = json_object_get(s, "records");
	cr_assert_eq(json_array_size(recs), 1);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(recs, 0), "identity"), "sandbox")),
	                 "sbx-live");
	json_decref(s);
	expect(A.port, "GET", "/v1/sandboxes/sbx-live/stat?path=/",
	       CAP(.sandbox = "sbx-live", .generation = 1, .worker = "worker-a"), 200, NULL, NULL);
}

/* The same for a sandbox that moved away (stopped and inactive here: the
 * control plane deletes it on its new worker, never here), and the stored
 * acknowledgements: a tenant moving sandboxes around in a loop grew the old
 * worker without bound. A repeat of a seq whose acknowledgement was pruned
 * is refused, never applied again. */
Test(node, moved_away_records_and_old_acks_are_forgotten)
{
	A.forget_after = 2;
	A.acks_kept = 16;
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	must_install(&A, "sbx-live", 1, "act-1", false);
	char name[32], path[512];
	json_t *last = NULL;
	for (int i = 0; i < 10; i++) {
		snprintf(name, sizeof name, "sbx-moved-%d", i);
		must_install(&A, name, 1, "act-1", false);
		json_decref(last);
		last = tn_deactivate(&A, name, 1, "act-1", false);
		cr_assert(tn_ok(last), "deactivate %s", name);
	}
	json_int_t last_seq = json_integer_value(json_object_get(last, "ack"));
	cr_assert_gt(last_seq, 20, "every message was numbered: %lld", (long long)last_seq);
	snprintf(path, sizeof path, "%s/gw/sbx-moved-0", A.state);
	struct stat sb;
	cr_assert_eq(stat(path, &sb), 0, "the moved sandbox's gateway directory is there at first");
	char logp[512];
	snprintf(logp, sizeof logp, "%s/log/sbx-moved-0.log", A.state);
	cr_assert_eq(stat(logp, &sb), 0, "its log is there at first");
	const char *st = "/v1/sandboxes/sbx-moved-0/stat?path=/";
	expect(A.port, "GET", st, CAP(.sandbox = "sbx-moved-0", .generation = 1, .worker = "worker-a"), 409,
	       "REFRESH_ROUTE", NULL);
	size_t nrec = wait_records(&A, 1);
	cr_assert_eq(nrec, 1, "10 moved-away records forgotten, the live one kept: %zu left", nrec);
	cr_assert(stat(path, &sb) < 0 && errno == ENOENT, "the forgotten sandbox's gateway directory is removed");
	cr_assert(stat(logp, &sb) < 0 && errno == ENOENT, "the forgotten sandbox's log is removed");
	expect(A.port, "GET", st, CAP(.sandbox = "sbx-moved-0", .generation = 1, .worker = "worker-a"), 403, "DENY",
	       "unknown-sandbox");
	/* its generation is still never started again here (I2); a new one is */
	json_t *re = tn_install(&A, "sbx-moved-0", 1, "act-2", false);
	cr_assert(re && !tn_ok(re), "a forgotten generation is not started again");
	cr_assert_str_eq(json_string_value(json_object_get(re, "code")), "not-running");
	json_decref(re);
	for (int round = 0; round < 2; round++) {
		/* the latest acknowledgement is answered again unchanged */
		json_t *again = tn_admin(&A, "{\"seq\":%lld,\"type\":\"destroy\",\"sandbox\":\"sbx-live\"}",
		                         (long long)last_seq);
		cr_assert(json_equal(again, last), "seq %lld answered from its stored acknowledgement", (long long)last_seq);
		json_decref(again);
		/* an old one is refused without effect: sbx-live is not destroyed */
		json_t *old = tn_admin(&A, "{\"seq\":1,\"type\":\"destroy\",\"sandbox\":\"sbx-live\"}");
		cr_assert(old && !tn_ok(old), "a pruned seq is not applied again");
		cr_assert_str_eq(json_string_value(json_object_get(old, "code")), "ack-pruned");
		cr_assert_eq(json_integer_value(json_object_get(old, "ack")), 1);
		json_decref(old);
		expect(A.port, "GET", "/v1/sandboxes/sbx-live/stat?path=/",
		       CAP(.sandbox = "sbx-live", .generation = 1, .worker = "worker-a"), 200, NULL, NULL);
		/* and after a restart: nothing comes back, the horizon stays */
		tn_node_stop(&A);
		tn_node_start(&A, dir, "worker-a", keys.bundle_path);
		json_t *s = status_of(&A);
		cr_assert_eq(json_array_size(json_object_get(s, "records")), 1);
		json_decref(s);
	}
	/* the guard outlives a restart; a newer generation starts */
	json_t *re2 = tn_install(&A, "sbx-moved-2", 1, "act-2", false);
	cr_assert(re2 && !tn_ok(re2), "after a restart too, a forgotten generation is not started again");
	json_decref(re2);
	must_install(&A, "sbx-moved-2", 2, "act-1", false);
	json_decref(last);
}

static const char *state_of(struct tn_node *n, const char *sandbox, json_int_t *pid)
{
	static char state[32];
	json_t *st = status_of(n), *rec;
	size_t k;
	state[0] = 0;
	json_array_foreach(json_object_get(st, "records"), k, rec)
	{
		if (strcmp(json_string_value(json_object_get(json_object_get(rec, "identity"), "sandbox")), sandbox) == 0) {
			snprintf(state, sizeof state, "%s", json_string_value(json_object_get(rec, "state")));
			if (pid)
				*pid = json_integer_value(json_object_get(rec, "pid"));
		}
	}
	json_decref(st);
	return state;
}

/* An execution that ended under its record is not forgotten like the other
 * tombstones: its end reaches the control plane only while the link's channel
 * is up (the control plane may never have heard of it), and the control plane
 * may still ask for that generation again (refused as not running, I2): the
 * record stays, past --forget-after, reported to every events subscriber. */
Test(node, ended_records_are_kept, .timeout = 120)
{
	A.substrate = true;
	A.forget_after = 2;
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	must_install(&A, "E", 1, "act-1", false);
	json_int_t pid = 0;
	cr_assert_str_eq(state_of(&A, "E", &pid), "running");
	cr_assert_gt(pid, 0);
	kill((pid_t)pid, SIGKILL);
	int i;
	for (i = 0; i < 400 && strcmp(state_of(&A, "E", NULL), "ended") != 0; i++)
		tn_sleep_ms(50);
	cr_assert_str_eq(state_of(&A, "E", NULL), "ended", "the launcher's death ends the record");
	int ev = tn_admin_connect(&A);
	cr_assert_geq(ev, 0);
	json_t *line = tn_admin_fd(ev, "{\"type\":\"events\"}");
	cr_assert(line != NULL, "the ended execution is reported to a subscriber");
	json_t *who = json_object_get(json_object_get(json_object_get(line, "ended"), "identity"), "sandbox");
	cr_assert_str_eq(json_string_value(who), "E");
	json_decref(line);
	close(ev);
	/* two forget ticks (every 5 s) past --forget-after */
	tn_sleep_ms(12000);
	cr_assert_str_eq(state_of(&A, "E", NULL), "ended", "an ended record stays");
	json_t *again = tn_install(&A, "E", 1, "act-2", false);
	cr_assert(again && !tn_ok(again), "its generation is not started again");
	cr_assert_str_eq(json_string_value(json_object_get(again, "code")), "deactivated");
	json_decref(again);
}

Test(node, every_outcome_over_http)
{
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	must_install(&A, "sbx-1", 7, "act-1", false);
	must_install(&A, "sbx-2", 3, "act-1", false);
	json_t *d = tn_deactivate(&A, "sbx-2", 3, "act-1", false);
	cr_assert(tn_ok(d));
	json_decref(d);
	const char *st = "/v1/sandboxes/sbx-1/stat?path=/";
	int p = A.port;

	/* ALLOW carries the serving identity */
	struct tn_resp r;
	cr_assert_eq(tn_http(p, "GET", st, CAP(.sandbox = "sbx-1", .generation = 7, .worker = "worker-a"), NULL, 0, &r), 0);
	cr_expect_eq(r.status, 200, "%s", r.body);
	cr_expect_str_eq(r.identity, "sandbox=sbx-1;generation=7;worker=worker-a;substrate=process;activation=act-1;pod_uid=");
	tn_resp_free(&r);
	json_int_t allowed = allowed_count(&A);

	/* DENY, 401: verification failures (C5) */
	char *good = strdup(CAP(.sandbox = "sbx-1", .generation = 7, .worker = "worker-a"));
	char *dot = strrchr(good, '.');
	size_t flip = (size_t)(dot - good) - 20;
	good[flip] = good[flip] == 'A' ? 'B' : 'A';
	expect(p, "GET", st, good, 401, "DENY", "bad-signature");
	free(good);
	expect(p, "GET", st, CAP(.sandbox = "sbx-1", .generation = 7, .worker = "worker-a", .other_key = true), 401,
	       "DENY", "unknown-key");
	expect(p, "GET", st, CAP(.sandbox = "sbx-1", .generation = 7, .worker = "worker-a", .iat_off = -140, .exp_off = -30),
	       401, "DENY", "expired");
	expect(p, "GET", st, CAP(.sandbox = "sbx-1", .generation = 7, .worker = "worker-a", .iat_off = 60, .exp_off = 170),
	       401, "DENY", "not-yet-valid");
	expect(p, "GET", st, "v4.public.garbage", 401, "DENY", "malformed");
	expect(p, "GET", st, NULL, 401, "DENY", "malformed");

	/* DENY, 403: wrong purpose or class, other or unknown sandbox */
	expect(p, "POST", "/v1/sandboxes/sbx-1/mkdir?path=/x",
	       CAP(.sandbox = "sbx-1", .generation = 7, .worker = "worker-a", .purposes = SPACED_PURPOSE_FS_READ), 403,
	       "DENY", "wrong-purpose");
	expect(p, "GET", st,
	       CAP(.sandbox = "sbx-1", .generation = 7, .worker = "worker-a", .serviceport = true, .port = 80), 403,
	       "DENY", "wrong-purpose");
	expect(p, "GET", st, CAP(.sandbox = "sbx-2", .generation = 3, .worker = "worker-a"), 403, "DENY",
	       "other-sandbox");
	expect(p, "GET", "/v1/sandboxes/sbx-9/stat?path=/", CAP(.sandbox = "sbx-9", .generation = 1, .worker = "worker-a"),
	       403, "DENY", "unknown-sandbox");

	/* REFRESH_ROUTE, 409: same sandbox, another incarnation or placement */
	expect(p, "GET", st, CAP(.sandbox = "sbx-1", .generation = 6, .worker = "worker-a"), 409, "REFRESH_ROUTE",
	       "older-generation");
	expect(p, "GET", st, CAP(.sandbox = "sbx-1", .generation = 8, .worker = "worker-a"), 409, "REFRESH_ROUTE",
	       "newer-generation");
	expect(p, "GET", st, CAP(.sandbox = "sbx-1", .generation = 7, .worker = "worker-b"), 409, "REFRESH_ROUTE",
	       "other-worker");
	expect(p, "GET", st, CAP(.sandbox = "sbx-1", .generation = 7, .worker = "worker-a", .substrate = "qemu"), 409,
	       "REFRESH_ROUTE", "other-substrate");
	expect(p, "GET", st, CAP(.sandbox = "sbx-1", .generation = 7, .worker = "worker-a", .activation = "act-2"), 409,
	       "REFRESH_ROUTE", "other-activation");
	expect(p, "GET", st, CAP(.sandbox = "sbx-1", .generation = 7, .worker = "worker-a", .pod_uid = "pod-1"), 409,
	       "REFRESH_ROUTE", "other-pod");
	expect(p, "GET", "/v1/sandboxes/sbx-2/stat?path=/", CAP(.sandbox = "sbx-2", .generation = 3, .worker = "worker-a"),
	       409, "REFRESH_ROUTE", "deactivated");

	/* ServicePort port and protocol (WebSocket tunnel): refused at open */
	struct tn_ws w;
	char reason[128];
	cr_assert_eq(tn_ws_open(&w, p, "/v1/sandboxes/sbx-1/ports/9999?protocol=tcp",
	                        CAP(.sandbox = "sbx-1", .generation = 7, .worker = "worker-a", .serviceport = true,
	                            .port = 8080, .protocol = "tcp")), 0);
	cr_expect_eq(tn_ws_wait_close(&w, reason, sizeof reason, 10000), 4403);
	cr_expect_str_eq(reason, "deny:wrong-port");
	tn_ws_close(&w);
	cr_assert_eq(tn_ws_open(&w, p, "/v1/sandboxes/sbx-1/ports/8080?protocol=http",
	                        CAP(.sandbox = "sbx-1", .generation = 7, .worker = "worker-a", .serviceport = true,
	                            .port = 8080, .protocol = "tcp")), 0);
	cr_expect_eq(tn_ws_wait_close(&w, reason, sizeof reason, 10000), 4403);
	cr_expect_str_eq(reason, "deny:wrong-protocol");
	tn_ws_close(&w);

	/* R1: none of the refused requests was forwarded */
	cr_expect_eq(allowed_count(&A), allowed, "a refused request reached the execution");
}

/* R2, R3, R4: sandbox S runs as execution 7 on worker A, then resumes as 8 on worker B. */
Test(node, r2_r3_two_workers)
{
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	tn_node_start(&B, dir, "worker-b", keys.bundle_path);
	must_install(&A, "S", 7, "act-1", false);
	char *cap7 = strdup(CAP(.sandbox = "S", .generation = 7, .worker = "worker-a"));
	char *cap8 = strdup(CAP(.sandbox = "S", .generation = 8, .worker = "worker-b"));
	struct tn_resp r;

	cr_assert_eq(tn_http(A.port, "PUT", "/v1/sandboxes/S/files?path=/state.txt", cap7, "seven", 5, &r), 0);
	cr_assert_eq(r.status, 200, "%s", r.body);
	tn_resp_free(&r);

	/* R4: while A serves 7, a capability for 7 still matches there */
	expect(A.port, "GET", "/v1/sandboxes/S/files?path=/state.txt", cap7, 200, NULL, NULL);
	/* on B, S was never seen */
	expect(B.port, "GET", "/v1/sandboxes/S/files?path=/state.txt", cap7, 403, "DENY", "unknown-sandbox");

	/* R2: a request selected for 8 that reaches A is refused before forwarding */
	json_int_t before = allowed_count(&A);
	expect(A.port, "GET", "/v1/sandboxes/S/files?path=/state.txt", cap8, 409, "REFRESH_ROUTE", "newer-generation");
	cr_expect_eq(allowed_count(&A), before);

	/* A installs the deactivation of 7 (kept paused for a snapshot) */
	json_t *d = tn_deactivate(&A, "S", 7, "act-1", true);
	cr_assert(tn_ok(d));
	json_decref(d);
	/* R3: capabilities for 7 are refused before they expire */
	expect(A.port, "GET", "/v1/sandboxes/S/files?path=/state.txt", cap7, 409, "REFRESH_ROUTE", "deactivated");

	char snap[128];
	snprintf(snap, sizeof snap, "%s/snap-S-7", dir);
	json_t *s = tn_admin(&A,
	                     "{\"type\":\"snapshot\",\"identity\":{\"sandbox\":\"S\",\"generation\":7,\"worker\":"
	                     "\"worker-a\",\"substrate\":\"process\",\"activation\":\"act-1\",\"pod_uid\":null},"
	                     "\"path\":\"%s\"}",
	                     snap);
	cr_assert(tn_ok(s), "snapshot: %s", s ? json_dumps(s, 0) : "none");
	char hash[65];
	snap_hash_of(s, hash);
	json_decref(s);

	/* a snapshot without its hash, or with another, starts nothing (issue 5 item 7) */
	expect_snapshot_refused(&B, snap, NULL);
	expect_snapshot_refused(&B, snap, "0000000000000000000000000000000000000000000000000000000000000000");

	/* B resumes S as execution 8 from the snapshot, checked by its hash */
	json_t *i = tn_admin(&B,
	                     "{\"type\":\"install\",\"identity\":{\"sandbox\":\"S\",\"generation\":8,\"worker\":"
	                     "\"worker-b\",\"substrate\":\"process\",\"activation\":\"act-1\",\"pod_uid\":null},"
	                     "\"handoff\":false,\"spec\":{\"snapshot\":\"%s\",\"snapshot_hash\":\"%s\"}}",
	                     snap, hash);
	cr_assert(tn_ok(i), "install on B: %s", i ? json_dumps(i, 0) : "none");
	json_decref(i);
	cr_assert_eq(tn_http(B.port, "GET", "/v1/sandboxes/S/files?path=/state.txt", cap8, NULL, 0, &r), 0);
	cr_expect_eq(r.status, 200);
	cr_expect(r.body_len == 5 && memcmp(r.body, "seven", 5) == 0, "resumed state: %s", r.body);
	cr_expect_str_eq(r.identity, "sandbox=S;generation=8;worker=worker-b;substrate=process;activation=act-1;pod_uid=");
	tn_resp_free(&r);

	/* R3 on B at any time: 7 is older than what B serves */
	expect(B.port, "GET", "/v1/sandboxes/S/files?path=/state.txt", cap7, 409, "REFRESH_ROUTE", "older-generation");
	/* and A still refuses both */
	expect(A.port, "GET", "/v1/sandboxes/S/files?path=/state.txt", cap8, 409, "REFRESH_ROUTE", NULL);
	/* an install going backwards is refused on B */
	json_t *back = tn_install(&B, "S", 7, "act-1", false);
	cr_expect(!tn_ok(back));
	cr_expect_str_eq(json_string_value(json_object_get(back, "code")), "backwards");
	json_decref(back);
	free(cap7);
	free(cap8);
}

static void ws_expect_allow(struct tn_ws *w)
{
	struct tn_wsmsg *m = malloc(sizeof *m);
	cr_assert_eq(tn_ws_recv(w, m, 10000), 0, "no first message");
	cr_assert_eq(m->opcode, 1, "first message opcode %d (%d %s)", m->opcode, m->close_code, m->close_reason);
	cr_assert(strstr(m->data, "\"outcome\":\"ALLOW\"") != NULL, "%s", m->data);
	free(m);
}

/* Sends text to a terminal and waits until the output contains it. */
static bool term_roundtrip(struct tn_ws *w, const char *text)
{
	char msg[256];
	int n = snprintf(msg, sizeof msg, "i%s\n", text);
	if (tn_ws_send(w, 2, msg, (size_t)n) < 0)
		return false;
	struct tn_wsmsg *m = malloc(sizeof *m);
	struct spaced_buf acc;
	spaced_buf_init(&acc, 1 << 20);
	bool ok = false;
	while (!ok) {
		if (tn_ws_recv(w, m, 10000) < 0 || m->opcode == 8)
			break;
		if (m->opcode == 2 && m->len > 1 && m->data[0] == 'o') {
			spaced_buf_append(&acc, m->data + 1, m->len - 1);
			ok = memmem(acc.data, acc.len, text, strlen(text)) != NULL;
		}
	}
	spaced_buf_free(&acc);
	free(m);
	return ok;
}

/* S1, R3: a new execution cancels the older epoch's terminal and watch streams. */
Test(node, streams_cut_on_replacement)
{
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	must_install(&A, "S", 7, "act-1", false);
	char *cap7 = strdup(CAP(.sandbox = "S", .generation = 7, .worker = "worker-a"));
	struct tn_ws term, watch;
	cr_assert_eq(tn_ws_open(&term, A.port, "/v1/sandboxes/S/term?argv=/bin/cat", cap7), 0);
	ws_expect_allow(&term);
	cr_assert(term_roundtrip(&term, "before-cut"));
	cr_assert_eq(tn_ws_open(&watch, A.port, "/v1/sandboxes/S/watch?path=/", cap7), 0);
	ws_expect_allow(&watch);

	uint64_t t0 = spaced_mono_ns();
	must_install(&A, "S", 8, "act-1", false);
	char reason[128];
	int code = tn_ws_wait_close(&term, reason, sizeof reason, 10000);
	uint64_t t1 = spaced_mono_ns();
	cr_expect_eq(code, 4409, "close code %d", code);
	cr_expect(strncmp(reason, "refresh-route", 13) == 0, "close reason %s", reason);
	fprintf(stderr, "S1: terminal cut %.2f ms after the install was sent (new execution started in between)\n", (double)(t1 - t0) / 1e6);
	code = tn_ws_wait_close(&watch, reason, sizeof reason, 10000);
	cr_expect_eq(code, 4409);
	cr_expect(strncmp(reason, "refresh-route", 13) == 0, "close reason %s", reason);
	tn_ws_close(&term);
	tn_ws_close(&watch);

	/* S2: a new open with the old capability is refused */
	cr_assert_eq(tn_ws_open(&term, A.port, "/v1/sandboxes/S/term?argv=/bin/cat", cap7), 0);
	code = tn_ws_wait_close(&term, reason, sizeof reason, 10000);
	cr_expect_eq(code, 4409);
	cr_expect_str_eq(reason, "refresh-route:older-generation");
	tn_ws_close(&term);

	/* a deactivation cuts the streams of the serving execution too */
	char *cap8 = strdup(CAP(.sandbox = "S", .generation = 8, .worker = "worker-a"));
	cr_assert_eq(tn_ws_open(&term, A.port, "/v1/sandboxes/S/term?argv=/bin/cat", cap8), 0);
	ws_expect_allow(&term);
	cr_assert(term_roundtrip(&term, "gen-8"));
	json_t *d = tn_deactivate(&A, "S", 8, "act-1", false);
	cr_assert(tn_ok(d));
	json_decref(d);
	code = tn_ws_wait_close(&term, reason, sizeof reason, 10000);
	cr_expect_eq(code, 4409);
	cr_expect_str_eq(reason, "refresh-route:deactivated");
	tn_ws_close(&term);
	free(cap7);
	free(cap8);
}

/* Opens terminals (a cat each) on sandbox with cap until one is refused or
 * want are open; returns how many are open (kept in ws[from…]) and the
 * refusal's close reason in why. */
static int open_until_refused(struct tn_ws *ws, int from, int want, const char *sandbox, const char *cap, char *why,
                              size_t whysz)
{
	char target[128];
	snprintf(target, sizeof target, "/v1/sandboxes/%s/term?argv=/bin/cat", sandbox);
	struct tn_wsmsg *m = malloc(sizeof *m);
	int n = 0;
	why[0] = 0;
	for (; n < want; n++) {
		struct tn_ws *w = &ws[from + n];
		cr_assert_eq(tn_ws_open(w, A.port, target, cap), 0, "the upgrade of %s's terminal %d", sandbox, n);
		cr_assert_eq(tn_ws_recv(w, m, 10000), 0, "no first message on %s's terminal %d", sandbox, n);
		if (m->opcode != 1 || !strstr(m->data, "\"outcome\":\"ALLOW\"")) {
			snprintf(why, whysz, "%.100s", m->opcode == 8 ? m->close_reason : m->data);
			tn_ws_close(w);
			break;
		}
	}
	free(m);
	return n;
}

/* A worker's table of open requests and streams (--max-streams) is shared:
 * a sandbox that opens streams without end (terminals that stay open) gets
 * at most half of it, a few such sandboxes at most three quarters, and
 * another sandbox still opens its own (on the old code the first one held
 * every slot and everyone else on the worker got 503). */
Test(node, one_sandbox_cannot_hold_every_stream, .timeout = 180)
{
	A.max_streams = 64;
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	const char *names[] = {"H1", "H2", "H3", "H4", "V"};
	char *caps[5];
	for (int i = 0; i < 5; i++) {
		must_install(&A, names[i], 1, "act-1", false);
		caps[i] = strdup(CAP(.sandbox = names[i], .generation = 1, .worker = "worker-a"));
	}
	struct tn_ws *ws = calloc(80, sizeof *ws);
	cr_assert_not_null(ws);
	char why[128];
	int open = 0, got;
	got = open_until_refused(ws, open, 64, "H1", caps[0], why, sizeof why);
	cr_expect_eq(got, 32, "the first sandbox holds half of the 64 (%d: %s)", got, why);
	cr_expect(strstr(why, "EBUSY") != NULL, "refused as busy: %s", why);
	open += got;
	struct tn_resp r;
	cr_assert_eq(tn_http(A.port, "GET", "/v1/sandboxes/H1/stat?path=/", caps[0], NULL, 0, &r), 0);
	cr_expect_eq(r.status, 503, "its next request too: %d %s", r.status, r.body ? r.body : "");
	cr_expect(r.body && strstr(r.body, "holds too many open requests"), "%s", r.body ? r.body : "");
	tn_resp_free(&r);
	got = open_until_refused(ws, open, 64 - open, "H2", caps[1], why, sizeof why);
	cr_expect_eq(got, 8, "past half, a sandbox holds an eighth (%d: %s)", got, why);
	open += got;
	got = open_until_refused(ws, open, 64 - open, "H3", caps[2], why, sizeof why);
	cr_expect_eq(got, 8, "and another one an eighth (%d: %s)", got, why);
	open += got;
	got = open_until_refused(ws, open, 64 - open, "H4", caps[3], why, sizeof why);
	cr_expect_eq(got, 2, "past three quarters, a sandbox holds a few (%d: %s)", got, why);
	open += got;
	/* the victim: a request and a terminal of its own */
	cr_assert_eq(tn_http(A.port, "GET", "/v1/sandboxes/V/stat?path=/", caps[4], NULL, 0, &r), 0);
	cr_expect_eq(r.status, 200, "the victim's request: %d %s", r.status, r.body ? r.body : "");
	tn_resp_free(&r);
	got = open_until_refused(ws, open, 1, "V", caps[4], why, sizeof why);
	cr_expect_eq(got, 1, "the victim's terminal (%s)", why);
	open += got;
	if (got == 1)
		cr_expect(term_roundtrip(&ws[open - 1], "victim"));
	for (int i = 0; i < open; i++)
		tn_ws_close(&ws[i]);
	free(ws);
	for (int i = 0; i < 5; i++)
		free(caps[i]);
}

/* The share is a tenant's when installs name it (spec.tenant): a tenant's
 * many sandboxes hold half the table together, not half and an eighth each;
 * another tenant's sandbox is served. */
Test(node, one_tenant_cannot_hold_every_stream, .timeout = 180)
{
	A.max_streams = 64;
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	const char *names[] = {"H1", "H2", "H3", "V"};
	char *caps[4];
	for (int i = 0; i < 4; i++) {
		json_t *a = tn_install_tenant(&A, names[i], 1, "act-1", i < 3 ? "ten-hostile" : "ten-victim");
		cr_assert(tn_ok(a), "install %s", names[i]);
		json_decref(a);
		caps[i] = strdup(CAP(.sandbox = names[i], .generation = 1, .worker = "worker-a"));
	}
	struct tn_ws *ws = calloc(48, sizeof *ws);
	cr_assert_not_null(ws);
	char why[128];
	int open = 0, got;
	got = open_until_refused(ws, open, 40, "H1", caps[0], why, sizeof why);
	cr_expect_eq(got, 32, "the tenant's first sandbox: half of the 64 (%d: %s)", got, why);
	open += got;
	got = open_until_refused(ws, open, 4, "H2", caps[1], why, sizeof why);
	cr_expect_eq(got, 0, "its second: nothing more, the tenant holds its share (%d)", got);
	open += got;
	got = open_until_refused(ws, open, 4, "H3", caps[2], why, sizeof why);
	cr_expect_eq(got, 0, "nor its third (%d)", got);
	open += got;
	got = open_until_refused(ws, open, 4, "V", caps[3], why, sizeof why);
	cr_expect_eq(got, 4, "another tenant's sandbox is served (%d: %s)", got, why);
	open += got;
	json_t *st = tn_admin(&A, "{\"type\":\"status\"}");
	json_t *recs = json_object_get(json_object_get(st, "result"), "records");
	size_t i;
	json_t *r;
	int tenants = 0;
	json_array_foreach(recs, i, r)
		tenants += json_is_string(json_object_get(r, "tenant")) &&
		           strncmp(json_string_value(json_object_get(r, "tenant")), "ten-", 4) == 0;
	cr_expect_eq(tenants, 4, "each record keeps its tenant");
	json_decref(st);
	for (int k = 0; k < open; k++)
		tn_ws_close(&ws[k]);
	free(ws);
	for (int k = 0; k < 4; k++)
		free(caps[k]);
}

/* S3: an ownership handoff keeps streams and unexpired capabilities. */
Test(node, streams_kept_on_handoff)
{
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	must_install(&A, "S", 7, "act-1", false);
	char *cap7 = strdup(CAP(.sandbox = "S", .generation = 7, .worker = "worker-a"));
	struct tn_ws term;
	cr_assert_eq(tn_ws_open(&term, A.port, "/v1/sandboxes/S/term?argv=/bin/cat", cap7), 0);
	ws_expect_allow(&term);
	cr_assert(term_roundtrip(&term, "one"));
	json_t *a = tn_install(&A, "S", 7, "act-1", true);
	cr_assert(tn_ok(a));
	json_decref(a);
	cr_expect(term_roundtrip(&term, "two-after-handoff"), "the stream did not survive the handoff");
	expect(A.port, "GET", "/v1/sandboxes/S/stat?path=/", cap7, 200, NULL, NULL);
	/* a handoff never changes the identity */
	a = tn_install(&A, "S", 8, "act-1", true);
	cr_expect(!tn_ok(a));
	json_decref(a);
	cr_expect(term_roundtrip(&term, "three"));
	tn_ws_close(&term);
	free(cap7);
}

static pid_t echo_server(int *port)
{
	int l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa;
	memset(&sa, 0, sizeof sa);
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(bind(l, (struct sockaddr *)&sa, sizeof sa), 0);
	socklen_t sl = sizeof sa;
	getsockname(l, (struct sockaddr *)&sa, &sl);
	*port = ntohs(sa.sin_port);
	listen(l, 8);
	pid_t pid = fork();
	if (pid == 0) {
		for (;;) {
			int c = accept(l, NULL, NULL);
			if (c < 0)
				_exit(0);
			if (fork() == 0) {
				char b[4096];
				ssize_t n;
				while ((n = read(c, b, sizeof b)) > 0)
					if (write(c, b, (size_t)n) != n)
						break;
				_exit(0);
			}
			close(c);
		}
	}
	close(l);
	return pid;
}

static bool port_roundtrip(struct tn_ws *w, const char *text)
{
	if (tn_ws_send(w, 2, text, strlen(text)) < 0)
		return false;
	struct tn_wsmsg *m = malloc(sizeof *m);
	bool ok = tn_ws_recv(w, m, 10000) == 0 && m->opcode == 2 && m->len == strlen(text) &&
	          memcmp(m->data, text, m->len) == 0;
	free(m);
	return ok;
}

/* S4: ServicePort streams survive an activation-only change; new opens need
 * the new identity; a new generation cuts them. Control streams are cut (S1). */
Test(node, serviceport_activation_only_change)
{
	int port;
	pid_t echo = echo_server(&port);
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	must_install(&A, "S", 7, "act-1", false);
	char target[128];
	snprintf(target, sizeof target, "/v1/sandboxes/S/ports/%d?protocol=tcp", port);
	char *sp1 = strdup(CAP(.sandbox = "S", .generation = 7, .worker = "worker-a", .serviceport = true,
	                       .port = (uint16_t)port, .protocol = "tcp"));
	char *cap7 = strdup(CAP(.sandbox = "S", .generation = 7, .worker = "worker-a"));
	struct tn_ws tun, term;
	cr_assert_eq(tn_ws_open(&tun, A.port, target, sp1), 0);
	ws_expect_allow(&tun);
	cr_assert(port_roundtrip(&tun, "ping"));
	cr_assert_eq(tn_ws_open(&term, A.port, "/v1/sandboxes/S/term?argv=/bin/cat", cap7), 0);
	ws_expect_allow(&term);

	must_install(&A, "S", 7, "act-2", false);
	char reason[128];
	cr_expect_eq(tn_ws_wait_close(&term, reason, sizeof reason, 10000), 4409, "control stream kept");
	cr_expect(port_roundtrip(&tun, "pong-after-activation-change"), "ServicePort stream cut");

	struct tn_ws again;
	cr_assert_eq(tn_ws_open(&again, A.port, target, sp1), 0);
	cr_expect_eq(tn_ws_wait_close(&again, reason, sizeof reason, 10000), 4409);
	cr_expect_str_eq(reason, "refresh-route:other-activation");
	tn_ws_close(&again);

	must_install(&A, "S", 8, "act-1", false);
	cr_expect_eq(tn_ws_wait_close(&tun, reason, sizeof reason, 10000), 4409);
	cr_expect(strncmp(reason, "refresh-route", 13) == 0, "%s", reason);
	tn_ws_close(&tun);
	tn_ws_close(&term);
	kill(echo, SIGKILL);
	waitpid(echo, NULL, 0);
	free(sp1);
	free(cap7);
}

/* Crash safety: kill -9 of sbx-manager in the middle of installs and requests;
 * after a restart the records are intact, nothing acknowledged is lost and no
 * identity goes backwards. */
Test(node, manager_kill9_keeps_records)
{
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	must_install(&A, "S", 1, "act-0", false);
	char *cap = strdup(CAP(.sandbox = "S", .generation = 1, .worker = "worker-a", .activation = "act-0"));
	int pfd[2];
	cr_assert_eq(pipe(pfd), 0);
	/* writer: activation changes, each acknowledged seq reported through the pipe */
	pid_t writer = fork();
	if (writer == 0) {
		close(pfd[0]);
		int fd = tn_admin_connect(&A);
		for (int i = 1; fd >= 0 && i < 100000; i++) {
			json_t *a = tn_admin_fd(fd,
			                        "{\"seq\":%d,\"type\":\"install\",\"identity\":{\"sandbox\":\"S\","
			                        "\"generation\":1,\"worker\":\"worker-a\",\"substrate\":\"process\","
			                        "\"activation\":\"act-%d\",\"pod_uid\":null}}",
			                        i + 1, i);
			if (!tn_ok(a))
				_exit(0);
			json_decref(a);
			if (write(pfd[1], &i, sizeof i) != sizeof i)
				_exit(0);
		}
		_exit(0);
	}
	/* requests in flight at the same time */
	pid_t reader = fork();
	if (reader == 0) {
		for (;;) {
			struct tn_resp r;
			if (tn_http(A.port, "GET", "/v1/sandboxes/S/stat?path=/", cap, NULL, 0, &r) < 0)
				_exit(0);
			tn_resp_free(&r);
		}
	}
	close(pfd[1]);
	int last = 0, v;
	while (last < 25 && read(pfd[0], &v, sizeof v) == sizeof v)
		last = v;
	kill(A.pid, SIGKILL);
	waitpid(A.pid, NULL, 0);
	while (read(pfd[0], &v, sizeof v) == sizeof v)
		last = v;
	close(pfd[0]);
	waitpid(writer, NULL, 0);
	kill(reader, SIGKILL);
	waitpid(reader, NULL, 0);
	cr_assert(last >= 25);

	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	json_t *st = status_of(&A);
	json_int_t last_seq = json_integer_value(json_object_get(st, "last_seq"));
	cr_expect(last_seq >= last + 1, "acknowledged seq %d lost (last_seq %lld)", last + 1, (long long)last_seq);
	json_t *rec = json_array_get(json_object_get(st, "records"), 0);
	cr_assert(rec);
	char act[64];
	snprintf(act, sizeof act, "%s", json_string_value(json_object_get(json_object_get(rec, "identity"), "activation")));
	int applied = atoi(act + 4);
	cr_expect(applied >= last, "installed activation act-%d is older than acknowledged act-%d", applied, last);
	cr_expect_eq(applied + 1, last_seq, "record and last seq disagree");
	json_decref(st);

	/* at most once: an applied seq gets the stored acknowledgement again */
	json_t *again = tn_admin(&A,
	                         "{\"seq\":2,\"type\":\"install\",\"identity\":{\"sandbox\":\"S\",\"generation\":1,"
	                         "\"worker\":\"worker-a\",\"substrate\":\"process\",\"activation\":\"act-1\","
	                         "\"pod_uid\":null}}");
	cr_expect(tn_ok(again));
	json_decref(again);
	st = status_of(&A);
	rec = json_array_get(json_object_get(st, "records"), 0);
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(rec, "identity"), "activation")), act,
	                 "a replayed seq changed the record");
	json_decref(st);
	/* no identity goes backwards */
	json_t *back = tn_install(&A, "S", 0 + 1, "act-1", false);
	cr_expect(tn_ok(back)); /* same generation, activation change: allowed */
	json_decref(back);
	must_install(&A, "S", 5, "act-1", false);
	back = tn_install(&A, "S", 4, "act-1", false);
	cr_expect(!tn_ok(back));
	json_decref(back);
	/* the worker serves again */
	expect(A.port, "GET", "/v1/sandboxes/S/stat?path=/", CAP(.sandbox = "S", .generation = 5, .worker = "worker-a"),
	       200, NULL, NULL);
	free(cap);
}

/* Malformed HTTP and WebSocket input and oversized bodies get clean errors and
 * the daemon keeps serving. */
Test(node, malformed_input_keeps_serving)
{
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	must_install(&A, "S", 1, "act-1", false);
	char *cap = strdup(CAP(.sandbox = "S", .generation = 1, .worker = "worker-a"));
	static const char *const raw[] = {
		"GARBAGE\r\n\r\n",
		"GET / HTTP/9.9\r\n\r\n",
		"GET /v1/sandboxes/S/stat?path=/ HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
		"\x01\x02\x03\x04\x05\r\n\r\n",
	};
	for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
		int fd = tn_tcp(A.port);
		cr_assert(fd >= 0);
		cr_assert_eq(write(fd, raw[i], strlen(raw[i])), (ssize_t)strlen(raw[i]));
		char buf[512];
		ssize_t n = read(fd, buf, sizeof buf - 1);
		if (n > 0) {
			buf[n] = '\0';
			/* 4xx, or 505 for an unknown HTTP version (RFC 9110 §15.6.6) */
			bool version = i == 1 && strncmp(buf + 9, "505", 3) == 0;
			cr_expect(strncmp(buf, "HTTP/1.", 7) == 0 && (buf[9] == '4' || version),
			          "answer to garbage %zu: %s", i, buf);
		}
		close(fd);
	}
	/* a header block far over the limit */
	{
		size_t big = 64 * 1024;
		char *tok = malloc(big + 1);
		memset(tok, 'a', big);
		tok[big] = '\0';
		struct tn_resp r;
		if (tn_http(A.port, "GET", "/v1/sandboxes/S/stat?path=/", tok, NULL, 0, &r) == 0) {
			cr_expect(r.status >= 400 && r.status < 500, "status %d", r.status);
			tn_resp_free(&r);
		}
		free(tok);
	}
	/* oversized and broken bodies, unknown endpoints and methods */
	{
		size_t big = 2u << 20;
		char *body = malloc(big);
		memset(body, ' ', big);
		struct tn_resp r;
		cr_assert_eq(tn_http(A.port, "POST", "/v1/sandboxes/S/exec", cap, body, big, &r), 0);
		cr_expect_eq(r.status, 413);
		tn_resp_free(&r);
		free(body);
		cr_assert_eq(tn_http(A.port, "POST", "/v1/sandboxes/S/exec", cap, "{\"argv\":", 8, &r), 0);
		cr_expect_eq(r.status, 400);
		tn_resp_free(&r);
		cr_assert_eq(tn_http(A.port, "POST", "/v1/sandboxes/S/exec", cap, "{\"argv\":[\"true\"],\"x\":1}", 24, &r), 0);
		cr_expect_eq(r.status, 400);
		tn_resp_free(&r);
	}
	expect(A.port, "GET", "/v1/nothing", cap, 404, NULL, NULL);
	expect(A.port, "DELETE", "/v1/sandboxes/S/stat?path=/", cap, 405, NULL, NULL);
	expect(A.port, "GET", "/v1/sandboxes/S/list?path=/&depth=x", cap, 400, NULL, NULL);
	expect(A.port, "GET", "/v1/sandboxes/S/stat", cap, 400, NULL, NULL);

	/* WebSocket: an unknown message, an unmasked frame, a message over the limit */
	struct tn_ws w;
	char reason[128];
	cr_assert_eq(tn_ws_open(&w, A.port, "/v1/sandboxes/S/term?argv=/bin/cat", cap), 0);
	ws_expect_allow(&w);
	cr_assert_eq(tn_ws_send(&w, 2, "xyz", 3), 0);
	cr_expect_eq(tn_ws_wait_close(&w, reason, sizeof reason, 10000), 1003);
	tn_ws_close(&w);
	cr_assert_eq(tn_ws_open(&w, A.port, "/v1/sandboxes/S/term?argv=/bin/cat", cap), 0);
	ws_expect_allow(&w);
	const uint8_t unmasked[] = {0x82, 0x02, 'i', 'x'};
	cr_assert_eq(write(w.fd, unmasked, sizeof unmasked), (ssize_t)sizeof unmasked);
	int code = tn_ws_wait_close(&w, reason, sizeof reason, 10000);
	cr_expect(code == 1002 || code == -1, "unmasked frame: close %d", code);
	tn_ws_close(&w);
	cr_assert_eq(tn_ws_open(&w, A.port, "/v1/sandboxes/S/term?argv=/bin/cat", cap), 0);
	ws_expect_allow(&w);
	{
		size_t big = 200 * 1024;
		char *m = malloc(big);
		memset(m, 'i', big);
		cr_assert_eq(tn_ws_send(&w, 2, m, big), 0);
		free(m);
		code = tn_ws_wait_close(&w, reason, sizeof reason, 10000);
		cr_expect(code == 1009 || code == -1, "oversized message: close %d", code);
	}
	tn_ws_close(&w);
	cr_assert_eq(tn_ws_open(&w, A.port, "/v1/sandboxes/S/nothing", cap), 0);
	cr_expect_eq(tn_ws_wait_close(&w, reason, sizeof reason, 10000), 4404);
	tn_ws_close(&w);

	/* still serving */
	expect(A.port, "GET", "/v1/sandboxes/S/stat?path=/", cap, 200, NULL, NULL);
	json_t *st = status_of(&A);
	cr_expect(json_integer_value(json_object_get(st, "api_pid")) > 0);
	json_decref(st);
	free(cap);
}

/* The guest API through node-api: files streamed both ways, list, stat, mkdir,
 * move, remove, exec with stdin/env/cwd, background processes, watch. */
Test(node, guest_api_over_http)
{
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	must_install(&A, "S", 1, "act-1", false);
	char *cap = strdup(CAP(.sandbox = "S", .generation = 1, .worker = "worker-a"));
	struct tn_resp r;
	size_t big = 3u << 20;
	uint8_t *data = malloc(big);
	for (size_t i = 0; i < big; i++)
		data[i] = (uint8_t)(i * 7 + (i >> 11));
	expect(A.port, "POST", "/v1/sandboxes/S/mkdir?path=/d/e", cap, 200, NULL, NULL);
	cr_assert_eq(tn_http(A.port, "PUT", "/v1/sandboxes/S/files?path=/d/big.bin", cap, data, big, &r), 0);
	cr_assert_eq(r.status, 200, "%s", r.body);
	tn_resp_free(&r);
	cr_assert_eq(tn_http(A.port, "GET", "/v1/sandboxes/S/files?path=/d/big.bin", cap, NULL, 0, &r), 0);
	cr_expect_eq(r.status, 200);
	cr_expect(r.complete);
	cr_expect_eq(r.body_len, big);
	cr_expect(r.body_len == big && memcmp(r.body, data, big) == 0, "read back differs");
	tn_resp_free(&r);
	cr_assert_eq(tn_http(A.port, "GET", "/v1/sandboxes/S/files?path=/d/big.bin&offset=100&length=50", cap, NULL, 0, &r), 0);
	cr_expect(r.body_len == 50 && memcmp(r.body, data + 100, 50) == 0);
	tn_resp_free(&r);
	free(data);

	cr_assert_eq(tn_http(A.port, "GET", "/v1/sandboxes/S/stat?path=/d/big.bin", cap, NULL, 0, &r), 0);
	cr_expect_eq(json_integer_value(json_object_get(r.json, "size")), (json_int_t)big);
	cr_expect_str_eq(json_string_value(json_object_get(r.json, "type")), "file");
	tn_resp_free(&r);
	expect(A.port, "POST", "/v1/sandboxes/S/move?from=/d/big.bin&to=/d/e/moved%20file.bin", cap, 200, NULL, NULL);
	cr_assert_eq(tn_http(A.port, "GET", "/v1/sandboxes/S/list?path=/d&depth=2", cap, NULL, 0, &r), 0);
	cr_expect(r.body && strstr(r.body, "moved file.bin") != NULL, "%s", r.body);
	tn_resp_free(&r);
	expect(A.port, "DELETE", "/v1/sandboxes/S/files?path=/d&recursive=1", cap, 200, NULL, NULL);
	expect(A.port, "GET", "/v1/sandboxes/S/stat?path=/d", cap, 404, NULL, NULL);

	const char *ex = "{\"argv\":[\"sh\",\"-c\",\"cat; echo \\\"$GREETING\\\" >&2; pwd; exit 4\"],"
	                 "\"env\":{\"GREETING\":\"hello\"},\"cwd\":\"/tmp\",\"stdin\":\"from-stdin\\n\"}";
	expect(A.port, "POST", "/v1/sandboxes/S/mkdir?path=/tmp", cap, 200, NULL, NULL);
	cr_assert_eq(tn_http(A.port, "POST", "/v1/sandboxes/S/exec", cap, ex, strlen(ex), &r), 0);
	cr_expect_eq(r.status, 200, "%s", r.body);
	cr_expect_eq(json_integer_value(json_object_get(r.json, "exit_code")), 4, "%s", r.body);
	const char *out = json_string_value(json_object_get(r.json, "stdout"));
	cr_expect(out && strstr(out, "from-stdin") != NULL, "%s", r.body);
	cr_expect_str_eq(json_string_value(json_object_get(r.json, "stderr")), "hello\n");
	cr_expect_neq(r.identity[0], '\0');
	tn_resp_free(&r);

	/* a background process that ends by itself: its output is kept */
	const char *bg = "{\"argv\":[\"sh\",\"-c\",\"echo started\"],\"background\":true}";
	cr_assert_eq(tn_http(A.port, "POST", "/v1/sandboxes/S/exec", cap, bg, strlen(bg), &r), 0);
	cr_expect_eq(r.status, 200, "%s", r.body);
	json_int_t proc = json_integer_value(json_object_get(r.json, "proc"));
	cr_expect(proc > 0, "%s", r.body);
	tn_resp_free(&r);
	char t[128];
	snprintf(t, sizeof t, "/v1/sandboxes/S/procs/%lld/output", (long long)proc);
	cr_assert_eq(tn_http(A.port, "GET", t, cap, NULL, 0, &r), 0);
	cr_expect_eq(r.status, 200, "%s", r.body);
	const char *o = json_string_value(json_object_get(r.json, "stdout"));
	cr_expect(o && strstr(o, "started") != NULL, "%s", r.body);
	cr_expect_eq(json_integer_value(json_object_get(r.json, "exit_code")), 0, "%s", r.body);
	tn_resp_free(&r);
	/* one that runs until signalled */
	const char *bg2 = "{\"argv\":[\"sleep\",\"30\"],\"background\":true}";
	cr_assert_eq(tn_http(A.port, "POST", "/v1/sandboxes/S/exec", cap, bg2, strlen(bg2), &r), 0);
	proc = json_integer_value(json_object_get(r.json, "proc"));
	tn_resp_free(&r);
	cr_assert_eq(tn_http(A.port, "GET", "/v1/sandboxes/S/procs", cap, NULL, 0, &r), 0);
	cr_expect(r.body && strstr(r.body, "\"running\":true") != NULL, "%s", r.body);
	tn_resp_free(&r);
	snprintf(t, sizeof t, "/v1/sandboxes/S/procs/%lld/signal?signal=15", (long long)proc);
	expect(A.port, "POST", t, cap, 200, NULL, NULL);
	snprintf(t, sizeof t, "/v1/sandboxes/S/procs/%lld/output", (long long)proc);
	cr_assert_eq(tn_http(A.port, "GET", t, cap, NULL, 0, &r), 0);
	cr_expect_eq(json_integer_value(json_object_get(r.json, "signal")), 15, "%s", r.body);
	tn_resp_free(&r);

	/* watch */
	struct tn_ws w;
	cr_assert_eq(tn_ws_open(&w, A.port, "/v1/sandboxes/S/watch?path=/", cap), 0);
	ws_expect_allow(&w);
	struct tn_wsmsg *m = malloc(sizeof *m);
	bool seen = false;
	/* the watch is armed asynchronously inside the execution: write until it reports */
	for (int i = 0; i < 100 && !seen; i++) {
		cr_assert_eq(tn_http(A.port, "PUT", "/v1/sandboxes/S/files?path=/watched.txt", cap, "x", 1, &r), 0);
		tn_resp_free(&r);
		while (!seen && tn_ws_recv(&w, m, 100) == 0 && m->opcode == 1)
			seen = strstr(m->data, "watched.txt") != NULL;
	}
	cr_expect(seen, "no watch event for the new file");
	free(m);
	tn_ws_close(&w);
	free(cap);
}

/* Key bundles: a new bundle is installed atomically and flushes the cache; an
 * older one is refused. */
Test(node, key_bundles)
{
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	must_install(&A, "S", 1, "act-1", false);
	char *cap = strdup(CAP(.sandbox = "S", .generation = 1, .worker = "worker-a"));
	expect(A.port, "GET", "/v1/sandboxes/S/stat?path=/", cap, 200, NULL, NULL);
	struct spaced_public_key pk;
	char pub[SPACED_PASERK_PUBLIC_LEN + 1];
	spaced_secret_key_public(keys.other, &pk);
	spaced_paserk_public_encode(&pk, pub);
	json_t *a = tn_admin(&A, "{\"type\":\"keys\",\"bundle\":{\"version\":2,\"keys\":[{\"key\":\"%s\","
	                         "\"not_before\":\"2020-01-01T00:00:00Z\",\"not_after\":\"2099-01-01T00:00:00Z\"}]}}",
	                     pub);
	cr_assert(tn_ok(a), "%s", a ? json_dumps(a, 0) : "none");
	json_decref(a);
	/* the cached verification of the old key's capability is gone with the key */
	expect(A.port, "GET", "/v1/sandboxes/S/stat?path=/", cap, 401, "DENY", "unknown-key");
	expect(A.port, "GET", "/v1/sandboxes/S/stat?path=/",
	       CAP(.sandbox = "S", .generation = 1, .worker = "worker-a", .other_key = true), 200, NULL, NULL);
	a = tn_admin(&A, "{\"type\":\"keys\",\"bundle\":{\"version\":1,\"keys\":[]}}");
	cr_expect(!tn_ok(a));
	cr_expect_str_eq(json_string_value(json_object_get(a, "code")), "stale");
	json_decref(a);
	/* the bundle survives a restart */
	tn_node_stop(&A);
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	json_t *st = status_of(&A);
	cr_expect_eq(json_integer_value(json_object_get(st, "keys_version")), 2);
	json_decref(st);
	free(cap);
}

/* Control messages on the admin socket: at most once per seq, unknown types,
 * another worker's identity, malformed lines — each answered, none applied. */
Test(node, admin_messages)
{
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	json_t *a = tn_admin(&A, "{\"seq\":5,\"type\":\"install\",\"identity\":{\"sandbox\":\"S\",\"generation\":2,"
	                         "\"worker\":\"worker-a\",\"substrate\":\"process\",\"activation\":\"a\",\"pod_uid\":null}}");
	cr_assert(tn_ok(a));
	cr_expect_eq(json_integer_value(json_object_get(a, "ack")), 5);
	json_int_t epoch = json_integer_value(json_object_get(json_object_get(a, "result"), "epoch"));
	json_decref(a);
	/* the same seq with another body: the stored outcome, no effect */
	a = tn_admin(&A, "{\"seq\":5,\"type\":\"install\",\"identity\":{\"sandbox\":\"S\",\"generation\":9,"
	                 "\"worker\":\"worker-a\",\"substrate\":\"process\",\"activation\":\"a\",\"pod_uid\":null}}");
	cr_expect(tn_ok(a));
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(a, "result"), "epoch")), epoch);
	json_decref(a);
	json_t *st = status_of(&A);
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(json_array_get(json_object_get(st, "records"), 0),
	                                                                "identity"), "generation")), 2);
	cr_expect_eq(json_integer_value(json_object_get(st, "last_seq")), 5);
	json_decref(st);

	static const struct {
		const char *line, *code;
	} bad[] = {
		{"{\"seq\":6,\"type\":\"reboot\"}", "unknown-type"},
		{"{\"seq\":6,\"type\":\"install\",\"identity\":{\"sandbox\":\"S\",\"generation\":3,\"worker\":\"worker-b\","
		 "\"substrate\":\"process\",\"activation\":\"a\",\"pod_uid\":null}}", "wrong-worker"},
		{"{\"seq\":7,\"type\":\"install\",\"identity\":{\"sandbox\":\"S\",\"generation\":1,\"worker\":\"worker-a\","
		 "\"substrate\":\"process\",\"activation\":\"a\",\"pod_uid\":null}}", "backwards"},
		{"{\"seq\":8,\"type\":\"install\",\"identity\":{\"sandbox\":\"S\",\"generation\":3,\"worker\":\"worker-a\","
		 "\"substrate\":\"qemu\",\"activation\":\"a\",\"pod_uid\":null}}", "unsupported-substrate"},
		{"{\"seq\":9,\"type\":\"install\",\"identity\":{\"sandbox\":\"S\",\"generation\":3}}", "bad-message"},
		{"{\"seq\":10,\"type\":\"install\",\"seq\":11}", "bad-message"},
		{"not json", "bad-message"},
		{"{\"seq\":11,\"type\":\"pause\",\"identity\":{\"sandbox\":\"S\",\"generation\":1,\"worker\":\"worker-a\","
		 "\"substrate\":\"process\",\"activation\":\"a\",\"pod_uid\":null}}", "identity-mismatch"},
		{"{\"seq\":12,\"type\":\"keys\",\"bundle\":{\"version\":9,\"keys\":[{\"key\":\"k4.public.AAAA\","
		 "\"not_before\":\"2020-01-01T00:00:00Z\",\"not_after\":\"2099-01-01T00:00:00Z\"}]}}", "bad-bundle"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		a = tn_admin(&A, "%s", bad[i].line);
		cr_expect(a && !tn_ok(a), "accepted: %s", bad[i].line);
		cr_expect_str_eq(json_string_value(json_object_get(a, "code")), bad[i].code, "%s", bad[i].line);
		json_decref(a);
	}
	st = status_of(&A);
	json_t *rec = json_array_get(json_object_get(st, "records"), 0);
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(rec, "identity"), "generation")), 2);
	cr_expect_eq(json_integer_value(json_object_get(rec, "epoch")), epoch);
	cr_expect_eq(json_integer_value(json_object_get(st, "keys_version")), 1);
	json_decref(st);
	/* pause and thaw the serving execution: requests wait, then go on */
	a = tn_admin(&A, "{\"type\":\"pause\",\"identity\":{\"sandbox\":\"S\",\"generation\":2,\"worker\":\"worker-a\","
	                 "\"substrate\":\"process\",\"activation\":\"a\",\"pod_uid\":null}}");
	cr_expect(tn_ok(a));
	json_decref(a);
	a = tn_admin(&A, "{\"type\":\"thaw\",\"identity\":{\"sandbox\":\"S\",\"generation\":2,\"worker\":\"worker-a\","
	                 "\"substrate\":\"process\",\"activation\":\"a\",\"pod_uid\":null}}");
	cr_expect(tn_ok(a));
	json_decref(a);
	expect(A.port, "GET", "/v1/sandboxes/S/stat?path=/",
	       CAP(.sandbox = "S", .generation = 2, .worker = "worker-a", .activation = "a"), 200, NULL, NULL);
	/* destroy keeps a tombstone */
	a = tn_admin(&A, "{\"type\":\"destroy\",\"sandbox\":\"S\"}");
	cr_expect(tn_ok(a));
	json_decref(a);
	expect(A.port, "GET", "/v1/sandboxes/S/stat?path=/",
	       CAP(.sandbox = "S", .generation = 2, .worker = "worker-a", .activation = "a"), 409, "REFRESH_ROUTE",
	       "deactivated");
}

/* A paused execution does not stall the worker: other sandboxes are served
 * while an upload to it waits (sent early in the pause, it waits for the
 * thaw). A request sent when it has been paused for longer than
 * SPACED_PAUSE_HOLD_MS is refused at once (REFRESH_ROUTE paused, after the R6
 * comparator allowed: the client resolves its route again, V1, which resumes an
 * auto-resume sandbox); its usage
 * is not refused; thawed, it is served again. */
Test(node, paused_execution_does_not_stall_others)
{
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	must_install(&A, "P", 1, "act-1", false);
	must_install(&A, "Q", 1, "act-1", false);
	char *capp = strdup(CAP(.sandbox = "P", .generation = 1, .worker = "worker-a"));
	char *capq = strdup(CAP(.sandbox = "Q", .generation = 1, .worker = "worker-a"));
	static const char pause[] = "{\"type\":\"pause\",\"identity\":{\"sandbox\":\"P\",\"generation\":1,\"worker\":"
	                            "\"worker-a\",\"substrate\":\"process\",\"activation\":\"act-1\",\"pod_uid\":null}}";
	static const char thaw[] = "{\"type\":\"thaw\",\"identity\":{\"sandbox\":\"P\",\"generation\":1,\"worker\":"
	                           "\"worker-a\",\"substrate\":\"process\",\"activation\":\"act-1\",\"pod_uid\":null}}";
	json_t *a = tn_admin(&A, pause);
	cr_assert(tn_ok(a));
	json_decref(a);
	pid_t up = fork();
	if (up == 0) {
		size_t big = 32u << 20;
		char *body = calloc(1, big);
		struct tn_resp r;
		int e = tn_http(A.port, "PUT", "/v1/sandboxes/P/files?path=/big", capp, body, big, &r);
		fprintf(stderr, "upload: e=%d status=%d body=%.200s\n", e, r.status, e == 0 ? r.body : "");
		_exit(e == 0 && (r.status == 503 || r.status == 200) ? 0 : 1);
	}
	for (int i = 0; i < 20; i++)
		expect(A.port, "GET", "/v1/sandboxes/Q/stat?path=/", capq, 200, NULL, NULL);
	a = tn_admin(&A, thaw);
	cr_assert(tn_ok(a));
	json_decref(a);
	int status;
	waitpid(up, &status, 0);
	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the upload to the paused execution got no clean answer");
	expect(A.port, "GET", "/v1/sandboxes/P/stat?path=/", capp, 200, NULL, NULL);
	/* paused for longer than the hold: refused at once */
	a = tn_admin(&A, pause);
	cr_assert(tn_ok(a));
	json_decref(a);
	usleep((SPACED_PAUSE_HOLD_MS + 300) * 1000);
	expect(A.port, "GET", "/v1/sandboxes/P/stat?path=/", capp, 409, "REFRESH_ROUTE", "paused");
	/* its usage is not refused as paused: it goes to the executor (which
	 * measures none for a development execution: 502) */
	expect(A.port, "GET", "/v1/sandboxes/P/usage",
	       CAP(.sandbox = "P", .generation = 1, .worker = "worker-a", .purposes = SPACED_PURPOSE_LIFECYCLE), 502, NULL,
	       NULL);
	expect(A.port, "GET", "/v1/sandboxes/Q/stat?path=/", capq, 200, NULL, NULL);
	a = tn_admin(&A, thaw);
	cr_assert(tn_ok(a));
	json_decref(a);
	expect(A.port, "GET", "/v1/sandboxes/P/stat?path=/", capp, 200, NULL, NULL);
	free(capp);
	free(capq);
}

/* The same R2/R3 story on the process substrate: each execution runs in its
 * own namespaces under spaced-launch and is reached only through its
 * spaced-host bridge (B1–B3); a restarted manager gets new bridges. */
Test(node, substrate_r2_r3_resume_and_restart)
{
	A.substrate = B.substrate = true;
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	tn_node_start(&B, dir, "worker-b", keys.bundle_path);
	json_t *st0 = status_of(&A);
	cr_assert_str_eq(json_string_value(json_object_get(st0, "mode")), "substrate");
	json_decref(st0);
	must_install(&A, "S", 7, "act-1", false);
	char *cap7 = strdup(CAP(.sandbox = "S", .generation = 7, .worker = "worker-a"));
	char *cap8 = strdup(CAP(.sandbox = "S", .generation = 8, .worker = "worker-b"));
	struct tn_resp r;
	cr_assert_eq(tn_http(A.port, "PUT", "/v1/sandboxes/S/files?path=/tmp/state.txt", cap7, "seven", 5, &r), 0);
	cr_assert_eq(r.status, 200, "%s", r.body);
	tn_resp_free(&r);
	const char *ex = "{\"argv\":[\"hostname\"]}";
	cr_assert_eq(tn_http(A.port, "POST", "/v1/sandboxes/S/exec", cap7, ex, strlen(ex), &r), 0);
	cr_expect_str_eq(json_string_value(json_object_get(r.json, "stdout")), "S\n", "%s", r.body);
	tn_resp_free(&r);

	expect(A.port, "GET", "/v1/sandboxes/S/files?path=/tmp/state.txt", cap8, 409, "REFRESH_ROUTE", "newer-generation");
	json_t *d = tn_deactivate(&A, "S", 7, "act-1", true);
	cr_assert(tn_ok(d), "%s", d ? json_dumps(d, 0) : "none");
	json_decref(d);
	expect(A.port, "GET", "/v1/sandboxes/S/files?path=/tmp/state.txt", cap7, 409, "REFRESH_ROUTE", "deactivated");
	char snap[128];
	snprintf(snap, sizeof snap, "%s/snap-S-7", dir);
	json_t *s = tn_admin(&A,
	                     "{\"type\":\"snapshot\",\"identity\":{\"sandbox\":\"S\",\"generation\":7,\"worker\":"
	                     "\"worker-a\",\"substrate\":\"process\",\"activation\":\"act-1\",\"pod_uid\":null},"
	                     "\"path\":\"%s\"}",
	                     snap);
	cr_assert(tn_ok(s), "snapshot: %s", s ? json_dumps(s, 0) : "none");
	char hash[65];
	snap_hash_of(s, hash);
	json_decref(s);
	expect_snapshot_refused(&B, snap, NULL);
	json_t *i = tn_admin(&B,
	                     "{\"type\":\"install\",\"identity\":{\"sandbox\":\"S\",\"generation\":8,\"worker\":"
	                     "\"worker-b\",\"substrate\":\"process\",\"activation\":\"act-1\",\"pod_uid\":null},"
	                     "\"spec\":{\"snapshot\":\"%s\",\"snapshot_hash\":\"%s\"}}",
	                     snap, hash);
	cr_assert(tn_ok(i), "install on B: %s", i ? json_dumps(i, 0) : "none");
	json_decref(i);
	cr_assert_eq(tn_http(B.port, "GET", "/v1/sandboxes/S/files?path=/tmp/state.txt", cap8, NULL, 0, &r), 0);
	cr_expect_eq(r.status, 200, "%s", r.body);
	cr_expect(r.body_len == 5 && memcmp(r.body, "seven", 5) == 0, "resumed state: %s", r.body);
	cr_expect_str_eq(r.identity, "sandbox=S;generation=8;worker=worker-b;substrate=process;activation=act-1;pod_uid=");
	tn_resp_free(&r);
	expect(B.port, "GET", "/v1/sandboxes/S/files?path=/tmp/state.txt", cap7, 409, "REFRESH_ROUTE", "older-generation");

	/* kill -9 of B's manager: the execution keeps running, a new bridge serves the new manager */
	kill(B.pid, SIGKILL);
	waitpid(B.pid, NULL, 0);
	tn_node_start(&B, dir, "worker-b", keys.bundle_path);
	cr_assert_eq(tn_http(B.port, "GET", "/v1/sandboxes/S/files?path=/tmp/state.txt", cap8, NULL, 0, &r), 0);
	cr_expect_eq(r.status, 200, "after restart: %s", r.body);
	cr_expect(r.body_len == 5 && memcmp(r.body, "seven", 5) == 0);
	tn_resp_free(&r);
	expect(B.port, "GET", "/v1/sandboxes/S/files?path=/tmp/state.txt", cap7, 409, "REFRESH_ROUTE", "older-generation");

	/* an execution's ports are never reached through the worker's loopback (R5) */
	struct tn_ws w;
	char reason[128];
	cr_assert_eq(tn_ws_open(&w, B.port, "/v1/sandboxes/S/ports/8080?protocol=tcp",
	                        CAP(.sandbox = "S", .generation = 8, .worker = "worker-b", .serviceport = true,
	                            .port = 8080, .protocol = "tcp")), 0);
	cr_expect_eq(tn_ws_wait_close(&w, reason, sizeof reason, 10000), 1011);
	cr_expect_str_eq(reason, "error:SPACED_EPERM");
	tn_ws_close(&w);
	free(cap7);
	free(cap8);
}

/* Another activation of the same generation (S4; the control plane's recovery
 * of a move that stopped half-way) is the same execution, never a new start
 * (I2): the guest and its bridge take the new identity, so exec and files
 * answer under it; the old activation's capability is refused (R1 compares
 * every field). An execution deactivated and kept frozen comes back thawed
 * with its files; one that was stopped is never brought back under its
 * generation. */
Test(node, activation_change_same_execution)
{
	A.substrate = true;
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	must_install(&A, "K", 3, "act-1", false);
	char *cap1 = strdup(CAP(.sandbox = "K", .generation = 3, .worker = "worker-a", .activation = "act-1"));
	char *cap2 = strdup(CAP(.sandbox = "K", .generation = 3, .worker = "worker-a", .activation = "act-2"));
	char *cap3 = strdup(CAP(.sandbox = "K", .generation = 3, .worker = "worker-a", .activation = "act-3"));
	const char *ex = "{\"argv\":[\"hostname\"]}";
	struct tn_resp r;
	cr_assert_eq(tn_http(A.port, "PUT", "/v1/sandboxes/K/files?path=/tmp/k.txt", cap1, "kept", 4, &r), 0);
	cr_assert_eq(r.status, 200, "%s", r.body);
	tn_resp_free(&r);
	json_t *st = status_of(&A);
	json_int_t pid0 = 0;
	size_t k;
	json_t *rec;
	json_array_foreach(json_object_get(st, "records"), k, rec)
	{
		if (strcmp(json_string_value(json_object_get(json_object_get(rec, "identity"), "sandbox")), "K") == 0)
			pid0 = json_integer_value(json_object_get(rec, "pid"));
	}
	json_decref(st);
	cr_assert(pid0 > 0);

	/* the running execution under another activation */
	must_install(&A, "K", 3, "act-2", false);
	cr_assert_eq(tn_http(A.port, "POST", "/v1/sandboxes/K/exec", cap2, ex, strlen(ex), &r), 0);
	cr_expect_eq(r.status, 200, "%s", r.body);
	cr_expect_str_eq(json_string_value(json_object_get(r.json, "stdout")), "K\n", "under act-2: %s", r.body);
	cr_expect_str_eq(r.identity, "sandbox=K;generation=3;worker=worker-a;substrate=process;activation=act-2;pod_uid=");
	tn_resp_free(&r);
	expect(A.port, "GET", "/v1/sandboxes/K/files?path=/tmp/k.txt", cap1, 409, "REFRESH_ROUTE", NULL);
	st = status_of(&A);
	json_array_foreach(json_object_get(st, "records"), k, rec)
	{
		if (strcmp(json_string_value(json_object_get(json_object_get(rec, "identity"), "sandbox")), "K") == 0)
			cr_expect_eq(json_integer_value(json_object_get(rec, "pid")), pid0, "the same execution");
	}
	json_decref(st);

	/* deactivated and kept (a move's first step), then activated again */
	json_t *d = tn_deactivate(&A, "K", 3, "act-2", true);
	cr_assert(tn_ok(d), "%s", d ? json_dumps(d, 0) : "none");
	json_decref(d);
	expect(A.port, "GET", "/v1/sandboxes/K/files?path=/tmp/k.txt", cap2, 409, "REFRESH_ROUTE", "deactivated");
	json_t *i = tn_install(&A, "K", 3, "act-3", false);
	cr_assert(tn_ok(i), "the kept execution was not activated again: %s", i ? json_dumps(i, 0) : "none");
	json_decref(i);
	cr_assert_eq(tn_http(A.port, "GET", "/v1/sandboxes/K/files?path=/tmp/k.txt", cap3, NULL, 0, &r), 0);
	cr_expect_eq(r.status, 200, "%s", r.body);
	cr_expect(r.body_len == 4 && memcmp(r.body, "kept", 4) == 0, "the same execution's files: %s", r.body);
	tn_resp_free(&r);
	cr_assert_eq(tn_http(A.port, "POST", "/v1/sandboxes/K/exec", cap3, ex, strlen(ex), &r), 0);
	cr_expect_str_eq(json_string_value(json_object_get(r.json, "stdout")), "K\n", "thawed: %s", r.body);
	tn_resp_free(&r);
	expect(A.port, "GET", "/v1/sandboxes/K/files?path=/tmp/k.txt", cap2, 409, "REFRESH_ROUTE", NULL);

	/* deactivated without keeping it: stopped, and not brought back */
	d = tn_deactivate(&A, "K", 3, "act-3", false);
	cr_assert(tn_ok(d), "%s", d ? json_dumps(d, 0) : "none");
	json_decref(d);
	i = tn_install(&A, "K", 3, "act-4", false);
	cr_expect(!tn_ok(i), "a stopped execution was activated again: %s", i ? json_dumps(i, 0) : "none");
	cr_expect_str_eq(json_string_value(json_object_get(i, "code")), "deactivated", "%s", json_dumps(i, 0));
	json_decref(i);
	free(cap1);
	free(cap2);
	free(cap3);
}

/* node-api runs unprivileged (nobody when started as root), with no new
 * privileges and a seccomp filter; sbx-manager keeps the privileges. */
Test(node, node_api_is_confined)
{
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	json_t *st = status_of(&A);
	json_int_t api = json_integer_value(json_object_get(st, "api_pid"));
	json_decref(st);
	cr_assert(api > 1);
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/%lld/status", (long long)api);
	FILE *f = fopen(path, "r");
	cr_assert(f != NULL);
	unsigned uid = 0, nnp = 0, seccomp = 0;
	bool have_uid = false;
	while (fgets(line, sizeof line, f)) {
		unsigned r, e, s, fs;
		if (sscanf(line, "Uid: %u %u %u %u", &r, &e, &s, &fs) == 4) {
			uid = r | e | s;
			have_uid = true;
			cr_expect(r == e && e == s, "uids differ: %s", line);
		}
		sscanf(line, "NoNewPrivs: %u", &nnp);
		sscanf(line, "Seccomp: %u", &seccomp);
	}
	fclose(f);
	cr_assert(have_uid);
	if (geteuid() == 0)
		cr_expect_neq(uid, 0u, "node-api kept root");
	cr_expect_eq(nnp, 1u);
	cr_expect_eq(seccomp, 2u, "no seccomp filter on node-api");
}

/* R3 does not depend on node-api: with node-api stopped while a terminal
 * floods output, a deactivation is still installed and acknowledged, and the
 * stream ends with refresh-route once node-api runs again. */
Test(node, stalled_node_api_does_not_delay_installs)
{
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	must_install(&A, "S", 1, "act-1", false);
	char *cap = strdup(CAP(.sandbox = "S", .generation = 1, .worker = "worker-a"));
	struct tn_ws w;
	cr_assert_eq(tn_ws_open(&w, A.port, "/v1/sandboxes/S/term?argv=/usr/bin/yes&argv=flood", cap), 0);
	ws_expect_allow(&w);
	json_t *st = status_of(&A);
	pid_t api = (pid_t)json_integer_value(json_object_get(st, "api_pid"));
	json_decref(st);
	cr_assert(api > 1);
	cr_assert_eq(kill(api, SIGSTOP), 0);
	tn_sleep_ms(300); /* let output pile up towards node-api */
	json_t *d = tn_deactivate(&A, "S", 1, "act-1", false);
	cr_expect(tn_ok(d), "deactivation not acknowledged while node-api was stopped");
	json_decref(d);
	cr_assert_eq(kill(api, SIGCONT), 0);
	char reason[128];
	int code = tn_ws_wait_close(&w, reason, sizeof reason, 20000);
	cr_expect_eq(code, 4409, "close %d %s", code, reason);
	tn_ws_close(&w);
	expect(A.port, "GET", "/v1/sandboxes/S/stat?path=/", cap, 409, "REFRESH_ROUTE", "deactivated");
	free(cap);
}

/* Checks body[0..n) as the half-frame guest's FRAMES frames of 64 KiB
 * (byte i of frame f: (i * 7 + f) & 0xff); "" when they are, else why. */
static const char *half_frame_content(const uint8_t *body, size_t n, size_t frames)
{
	if (n != frames * 65536)
		return "length";
	for (size_t f = 0; f < frames; f++)
		for (size_t i = 0; i < 65536; i++)
			if (body[f * 65536 + i] != (uint8_t)((i * 7 + f) & 0xff))
				return "content";
	return "";
}

/* Bulk output (gate_streams.c): once a stream's execution sent a large
 * frame, the gate splices each large frame's payload through a pipe and
 * queues its message on node-api's link only once the payload is whole. An
 * execution that breaks off in the middle of such a frame (the header and
 * 1000 bytes of 64 KiB, then nothing) holds up only its own stream: node-api's
 * link is shared by every stream of the worker, and a message begun on it
 * for that frame would hold every other answer behind it. Meanwhile other
 * sandboxes' and the same sandbox's downloads, every large frame of theirs
 * spliced, come whole and in order; a replacement of the sandbox ends the
 * stalled stream in its half frame (S1); and downloads go on after. */
Test(node, execution_stalled_in_a_frame_holds_only_its_stream, .timeout = 60)
{
	A.guest_bin = HALF_FRAME_GUEST;
	tn_node_start(&A, dir, "worker-a", keys.bundle_path);
	must_install(&A, "P", 1, "act-1", false);
	must_install(&A, "Q", 1, "act-1", false);
	char *capp = strdup(CAP(.sandbox = "P", .generation = 1, .worker = "worker-a"));
	char *capq = strdup(CAP(.sandbox = "Q", .generation = 1, .worker = "worker-a"));
	int fd = tn_tcp(A.port);
	cr_assert(fd >= 0);
	char req[2048];
	int n = snprintf(req, sizeof req,
	                 "GET /v1/sandboxes/P/files?path=/stall HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
	                 "%s\r\n\r\n",
	                 capp);
	cr_assert_eq(write(fd, req, (size_t)n), n);
	/* what the stalled stream's client gets: its first frame, nothing of the second */
	static char got[1 << 20];
	size_t have = 0;
	struct timeval tv = {0, 200 * 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	for (int i = 0; i < 10; i++) {
		ssize_t k = tn_read_some(fd, got + have, sizeof got - have);
		if (k > 0)
			have += (size_t)k;
	}
	char *hend = memmem(got, have, "\r\n\r\n", 4);
	cr_assert_not_null(hend, "no answer's head for the stalled stream");
	size_t body = have - (size_t)(hend + 4 - got);
	cr_expect(body >= 65536 && body < 65536 + 512, "the stalled stream's client got %zu bytes of body", body);
	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < 4; i++) {
			const char *who = i % 2 ? "P" : "Q";
			char target[96];
			snprintf(target, sizeof target, "/v1/sandboxes/%s/files?path=/ok", who);
			struct tn_resp r;
			cr_assert_eq(tn_http(A.port, "GET", target, i % 2 ? capp : capq, NULL, 0, &r), 0,
			             "no answer from %s (round %d)", who, round);
			cr_expect_eq(r.status, 200, "%s: %d %s", who, r.status, r.status == 200 ? "" : r.body);
			const char *bad = half_frame_content((const uint8_t *)r.body, r.body_len, 8);
			cr_expect_str_eq(bad, "", "%s (round %d): %zu bytes, %s differs", who, round, r.body_len, bad);
			tn_resp_free(&r);
		}
		if (round > 0)
			break;
		/* S1: a replacement of P installed while its stalled stream is in
		 * the middle of a spliced frame ends that stream (its half frame
		 * never reaches the client: the connection ends, cut short); then
		 * the rest again, P's downloads through its new execution */
		must_install(&A, "P", 2, "act-1", false);
		ssize_t k = -1;
		for (int i = 0; i < 50 && k != 0; i++) {
			k = tn_read_some(fd, got + have, sizeof got - have);
			if (k > 0)
				have += (size_t)k;
			if (k < 0 && errno == ECONNRESET)
				k = 0;
		}
		cr_expect_eq(k, 0, "the stalled stream's connection did not end after P's replacement");
		body = have - (size_t)(hend + 4 - got);
		cr_expect(body < 65536 + 512, "the half frame reached the client (%zu bytes of body)", body);
		close(fd);
		free(capp);
		capp = strdup(CAP(.sandbox = "P", .generation = 2, .worker = "worker-a"));
	}
	free(capp);
	free(capq);
}
