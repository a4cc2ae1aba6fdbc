/*
 * test-cp-parse — the control plane's strict parsers of peer JSON
 * (spaced-cp/reqparse.c): API bodies and control-channel messages. Duplicate
 * keys, unknown members, wrong types, embedded NULs and out-of-range values are
 * refused; defaults are filled; outputs are untouched on failure.
 */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "cap.h"
#include "reqparse.h"

#define S(x) x, strlen(x)

static char err[160];

Test(cp_parse, create_defaults_and_limits)
{
	struct cp_create_req c;
	cr_assert_eq(cp_parse_create(S(""), &c, err, sizeof err), 0);
	cr_assert_str_eq(c.substrate, "process");
	/* nothing asked: every limit is the placed worker's default */
	cr_assert_eq(c.res.memory_bytes, 0);
	cr_assert_eq(c.res.cpu_milli, 0);
	cr_assert_eq(c.idle_timeout, -1);
	cr_assert_eq(cp_parse_create(S("{\"worker\":\"wa\",\"pids\":64,\"template\":null}"), &c, err, sizeof err), 0);
	cr_assert_str_eq(c.worker, "wa");
	cr_assert_eq(c.res.pids, 64);
	cr_assert_eq(c.template_name[0], 0);
	cr_assert_eq(cp_parse_create(S("{\"cpus\":0.5,\"memory_bytes\":134217728,\"disk_bytes\":1073741824}"), &c, err,
	                             sizeof err), 0);
	cr_assert_eq(c.res.cpu_milli, 500);
	cr_assert_eq(c.res.memory_bytes, 134217728u);
	cr_assert_eq(c.res.disk_bytes, 1073741824u);
	cr_assert_eq(cp_parse_create(S("{\"cpus\":2}"), &c, err, sizeof err), 0);
	cr_assert_eq(c.res.cpu_milli, 2000);
	cr_assert_lt(cp_parse_create(S("{\"pids\":7}"), &c, err, sizeof err), 0);
	cr_assert_lt(cp_parse_create(S("{\"memory_bytes\":1}"), &c, err, sizeof err), 0);
	cr_assert_lt(cp_parse_create(S("{\"disk_bytes\":4096}"), &c, err, sizeof err), 0);
	cr_assert_lt(cp_parse_create(S("{\"cpus\":0}"), &c, err, sizeof err), 0);
	cr_assert_lt(cp_parse_create(S("{\"cpus\":-1}"), &c, err, sizeof err), 0);
	cr_assert_lt(cp_parse_create(S("{\"cpus\":0.0001}"), &c, err, sizeof err), 0);
	cr_assert_lt(cp_parse_create(S("{\"cpus\":\"1\"}"), &c, err, sizeof err), 0);
	cr_assert_lt(cp_parse_create(S("{\"cpus\":100000}"), &c, err, sizeof err), 0);
	cr_assert_lt(cp_parse_create(S("{\"worker\":\"a/b\"}"), &c, err, sizeof err), 0);
	cr_assert_lt(cp_parse_create(S("{\"template\":\"a\\u0000b\"}"), &c, err, sizeof err), 0);
}

Test(cp_parse, worker_limits_in_hello_and_registration)
{
	struct cp_chan_msg m;
	struct cp_worker_reg w;
	const char *hello = "{\"hello\":{\"worker\":\"wa\",\"last_seq\":3,\"limits\":{\"default\":{\"cpus\":1,"
	                    "\"memory_bytes\":536870912},\"max\":{\"cpus\":2,\"memory_bytes\":1073741824}}}}";
	cr_assert_eq(cp_parse_chan(S(hello), &m), 0);
	cr_assert(m.limits.has);
	cr_assert_eq(m.limits.def.cpu_milli, 1000);
	cr_assert_eq(m.limits.max.memory_bytes, 1073741824u);
	/* a default above its maximum, an unknown resource: refused */
	cr_assert_lt(cp_parse_chan(S("{\"hello\":{\"worker\":\"wa\",\"last_seq\":3,\"limits\":{\"default\":{\"cpus\":4},"
	                             "\"max\":{\"cpus\":2}}}}"), &m), 0);
	cr_assert_lt(cp_parse_chan(S("{\"hello\":{\"worker\":\"wa\",\"last_seq\":3,\"limits\":{\"max\":{\"gpus\":2}}}}"),
	                           &m), 0);
	cr_assert_eq(cp_parse_worker(S("{\"id\":\"wa\",\"url\":\"http://h:1\",\"substrates\":[\"process\"],"
	                               "\"limits\":{\"max\":{\"disk_bytes\":1073741824}}}"), &w, err, sizeof err), 0);
	cr_assert(w.limits.has);
	cr_assert_eq(w.limits.max.disk_bytes, 1073741824u);
	char *t = cp_limits_text(&w.limits);
	struct cp_worker_limits back;
	cp_limits_from_text(t, &back);
	free(t);
	cr_assert(back.has);
	cr_assert_eq(back.max.disk_bytes, 1073741824u);
	cp_limits_from_text("{\"max\":", &back);
	cr_assert_eq(back.has, 0);
}

/* a worker's allocatable (placement by capacity, DESIGN §5 Resources): kept through the stored
 * text; malformed figures refuse the whole hello, never bound nothing silently */
Test(cp_parse, worker_allocatable_round_trips_and_bad_figures_are_refused)
{
	struct cp_chan_msg m;
	cr_assert_eq(cp_parse_chan(S("{\"hello\":{\"worker\":\"wa\",\"last_seq\":1,\"limits\":{\"max\":{\"pids\":900},"
	                             "\"allocatable\":{\"memory_bytes\":1073741824,\"pids\":1200,\"memory_overcommit\":1.5}}}}"),
	                           &m), 0);
	cr_assert_eq(m.limits.alloc_memory, 1073741824u);
	cr_assert_eq(m.limits.alloc_pids, 1200u);
	cr_assert_float_eq(m.limits.memory_overcommit, 1.5, 1e-9);
	char *t = cp_limits_text(&m.limits);
	struct cp_worker_limits back;
	cp_limits_from_text(t, &back);
	free(t);
	cr_assert(back.has);
	cr_assert_eq(back.alloc_memory, 1073741824u);
	cr_assert_eq(back.alloc_pids, 1200u);
	cr_assert_float_eq(back.memory_overcommit, 1.5, 1e-9);
	static const char *const bad[] = {
		"{\"allocatable\":{\"pids\":-1}}", "{\"allocatable\":{\"memory_bytes\":\"1G\"}}",
		"{\"allocatable\":{\"memory_overcommit\":0.5}}", "{\"allocatable\":{\"cpus\":2}}", "{\"allocatable\":[]}",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char msg[256];
		snprintf(msg, sizeof msg, "{\"hello\":{\"worker\":\"wa\",\"last_seq\":1,\"limits\":%s}}", bad[i]);
		cr_assert_lt(cp_parse_chan(msg, strlen(msg), &m), 0, "%s", bad[i]);
	}
}

/* T1: a hello's tentative installs (docs/control-messages.md "Tentative installs"): read by seq, each
 * a seq and the identity's names; anything malformed refuses the whole hello (the channel closes),
 * never reads part of a list (the control plane confirms what the worker lists) */
Test(cp_parse, hello_tentative_installs)
{
	struct cp_chan_msg m;
	const char *hello = "{\"hello\":{\"worker\":\"wa\",\"last_seq\":9,\"tentative\":["
	                    "{\"seq\":8,\"sandbox\":\"sbx-a\",\"activation\":\"act-1\"},"
	                    "{\"seq\":9,\"sandbox\":\"sbx-b\",\"activation\":\"act-2\"}]}}";
	cr_assert_eq(cp_parse_chan(S(hello), &m), 0);
	cr_assert_eq(m.ntentative, 2);
	cr_assert_eq(m.tentative[0].seq, 8);
	cr_assert_str_eq(m.tentative[1].sandbox, "sbx-b");
	cr_assert_str_eq(m.tentative[1].activation, "act-2");
	free(m.tentative);
	cr_assert_eq(cp_parse_chan(S("{\"hello\":{\"worker\":\"wa\",\"last_seq\":9,\"tentative\":[]}}"), &m), 0);
	cr_assert_eq(m.ntentative, 0);
	cr_assert_null(m.tentative);
	cr_assert(m.has_tentative, "an empty list still says the worker takes tentative installs");
	cr_assert_eq(cp_parse_chan(S("{\"hello\":{\"worker\":\"wa\",\"last_seq\":9}}"), &m), 0);
	cr_assert_not(m.has_tentative, "a worker of before them: its installs go once durable");
	static const char *const bad[] = {
		"{}", "[{\"seq\":1,\"sandbox\":\"a\"}]", "[{\"seq\":0,\"sandbox\":\"a\",\"activation\":\"b\"}]",
		"[{\"seq\":2,\"sandbox\":\"a\",\"activation\":\"b\"},{\"seq\":2,\"sandbox\":\"c\",\"activation\":\"d\"}]",
		"[{\"seq\":1,\"sandbox\":\"a b\",\"activation\":\"b\"}]",
		"[{\"seq\":1,\"sandbox\":\"a\",\"activation\":\"b\",\"x\":1}]", "[1]", "\"sbx\"",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char msg[256];
		snprintf(msg, sizeof msg, "{\"hello\":{\"worker\":\"wa\",\"last_seq\":1,\"tentative\":%s}}", bad[i]);
		cr_assert_lt(cp_parse_chan(msg, strlen(msg), &m), 0, "%s", bad[i]);
	}
	/* CP_TENTATIVE_MAX entries of real names are taken (the message within CP_BODY_MAX), one
	 * more is not */
	for (int count = CP_TENTATIVE_MAX; count <= CP_TENTATIVE_MAX + 1; count++) {
		size_t cap = 64 + (size_t)count * 96, n = 0;
		char *big = malloc(cap);
		cr_assert_not_null(big);
		n += (size_t)snprintf(big + n, cap - n, "{\"hello\":{\"worker\":\"wa\",\"last_seq\":1,\"tentative\":[");
		for (int i = 1; i <= count; i++)
			n += (size_t)snprintf(big + n, cap - n,
			                      "%s{\"seq\":%d,\"sandbox\":\"sbx-%016x\",\"activation\":\"act-%016x\"}",
			                      i > 1 ? "," : "", i, i, i);
		n += (size_t)snprintf(big + n, cap - n, "]}}");
		cr_assert_leq(n, CP_BODY_MAX, "%zu bytes", n);
		if (count == CP_TENTATIVE_MAX) {
			cr_assert_eq(cp_parse_chan(big, n, &m), 0);
			cr_assert_eq(m.ntentative, (size_t)CP_TENTATIVE_MAX);
			cr_assert(m.has_tentative);
			free(m.tentative);
		} else {
			cr_assert_lt(cp_parse_chan(big, n, &m), 0);
		}
		free(big);
	}
}

Test(cp_parse, create_refuses_duplicates_unknown_and_garbage)
{
	struct cp_create_req c;
	memset(&c, 0x5a, sizeof c);
	cr_assert_lt(cp_parse_create(S("{\"pids\":10,\"pids\":11}"), &c, err, sizeof err), 0);
	cr_assert_lt(cp_parse_create(S("{\"evil\":1}"), &c, err, sizeof err), 0);
	cr_assert_lt(cp_parse_create(S("{\"pids\":10} trailing"), &c, err, sizeof err), 0);
	cr_assert_lt(cp_parse_create(S("[]"), &c, err, sizeof err), 0);
	cr_assert_lt(cp_parse_create(S("{\"pids\":\"10\"}"), &c, err, sizeof err), 0);
	cr_assert_eq(((unsigned char *)&c)[0], 0x5a, "output written on failure");
}

Test(cp_parse, route_purposes_and_serviceport_profile)
{
	struct cp_route_req r;
	cr_assert_eq(cp_parse_route(S("{}"), &r, err, sizeof err), 0);
	cr_assert(r.purposes & SPACED_PURPOSE_EXEC);
	cr_assert_eq(r.purposes & SPACED_PURPOSE_SERVICEPORT, 0u);
	cr_assert_eq(cp_parse_route(S("{\"purposes\":[\"serviceport\"],\"port\":443,\"protocol\":\"https\"}"), &r, err,
	                            sizeof err), 0);
	cr_assert(r.serviceport);
	cr_assert_eq(r.port, 443);
	cr_assert_str_eq(r.protocol, "https");
	cr_assert_eq(cp_parse_route(S("{\"purposes\":[\"serviceport\"],\"port\":22}"), &r, err, sizeof err), 0);
	cr_assert_str_eq(r.protocol, "tcp");
	cr_assert_lt(cp_parse_route(S("{\"purposes\":[\"serviceport\"]}"), &r, err, sizeof err), 0);
	cr_assert_lt(cp_parse_route(S("{\"purposes\":[\"serviceport\",\"exec\"],\"port\":1}"), &r, err, sizeof err), 0);
	cr_assert_lt(cp_parse_route(S("{\"purposes\":[\"exec\"],\"port\":1}"), &r, err, sizeof err), 0);
	cr_assert_lt(cp_parse_route(S("{\"purposes\":[\"serviceport\"],\"port\":0}"), &r, err, sizeof err), 0);
	/* the guest's own API port is never exposed (its gateway would refuse it anyway) */
	cr_assert_lt(cp_parse_route(S("{\"purposes\":[\"serviceport\"],\"port\":1024}"), &r, err, sizeof err), 0);
	cr_assert(strstr(err, "1024") != NULL, "%s", err);
	cr_assert_lt(cp_parse_route(S("{\"purposes\":[\"serviceport\"],\"port\":1,\"protocol\":\"ftp\"}"), &r, err,
	                            sizeof err), 0);
	cr_assert_lt(cp_parse_route(S("{\"purposes\":[]}"), &r, err, sizeof err), 0);
	cr_assert_lt(cp_parse_route(S("{\"purposes\":[\"root\"]}"), &r, err, sizeof err), 0);
	cr_assert_lt(cp_parse_route(S("{\"purposes\":[\"exec\\u0000x\"]}"), &r, err, sizeof err), 0);
}

Test(cp_parse, worker_registration)
{
	struct cp_worker_reg w;
	cr_assert_eq(cp_parse_worker(S("{\"id\":\"wa\",\"url\":\"http://10.0.0.1:7000\",\"substrates\":[\"process\",\"qemu\"]}"),
	                             &w, err, sizeof err), 0);
	cr_assert_str_eq(w.substrates, "process,qemu");
	cr_assert(cp_list_has(w.substrates, "qemu"));
	cr_assert_not(cp_list_has(w.substrates, "qem"));
	cr_assert_eq(w.capacity, 16);
	cr_assert_lt(cp_parse_worker(S("{\"id\":\"wa\",\"url\":\"ftp://x\",\"substrates\":[\"process\"]}"), &w, err, sizeof err), 0);
	cr_assert_lt(cp_parse_worker(S("{\"id\":\"wa\",\"url\":\"http://x y\",\"substrates\":[\"process\"]}"), &w, err, sizeof err), 0);
	cr_assert_lt(cp_parse_worker(S("{\"id\":\"wa\",\"url\":\"http://x\",\"substrates\":[]}"), &w, err, sizeof err), 0);
	cr_assert_lt(cp_parse_worker(S("{\"url\":\"http://x\",\"substrates\":[\"process\"]}"), &w, err, sizeof err), 0);
}

Test(cp_parse, channel_hello_and_ack)
{
	struct cp_chan_msg m;
	cr_assert_eq(cp_parse_chan(S("{\"hello\":{\"worker\":\"wa\",\"last_seq\":41,\"substrates\":[\"process\"],\"capacity\":16}}"), &m), 0);
	cr_assert_eq(m.kind, CP_CHAN_HELLO);
	cr_assert_eq(m.last_seq, 41);
	cr_assert(m.has_capacity && m.has_substrates);
	cr_assert_eq(cp_parse_chan(S("{\"ack\":42,\"ok\":true,\"result\":{\"epoch\":3}}"), &m), 0);
	cr_assert_eq(m.kind, CP_CHAN_ACK);
	cr_assert_eq(m.seq, 42);
	cr_assert(m.ok);
	cr_assert_str_eq(m.result, "{\"epoch\":3}");
	free(m.result);
	cr_assert_eq(cp_parse_chan(S("{\"ack\":9,\"ok\":false,\"error\":\"no\",\"code\":\"stale\"}"), &m), 0);
	cr_assert_str_eq(m.code, "stale");
	cr_assert_lt(cp_parse_chan(S("{\"ack\":0,\"ok\":true}"), &m), 0);
	cr_assert_lt(cp_parse_chan(S("{\"ack\":1}"), &m), 0);
	cr_assert_lt(cp_parse_chan(S("{\"ack\":1,\"ok\":true,\"extra\":1}"), &m), 0);
	cr_assert_lt(cp_parse_chan(S("{\"hello\":{\"worker\":\"wa\"}}"), &m), 0);
	cr_assert_lt(cp_parse_chan(S("{\"hello\":{\"worker\":\"wa\",\"last_seq\":-1}}"), &m), 0);
	cr_assert_lt(cp_parse_chan(S("{\"ack\":1,\"ok\":true,\"ack\":2}"), &m), 0);
	cr_assert_lt(cp_parse_chan(S("not json"), &m), 0);
}

/* A worker's report of an execution that ended (I2): the full identity and a
 * reason, nothing else; the reason cannot forge a log line or a quote. */
Test(cp_parse, chan_ended)
{
	struct cp_chan_msg m;
#define ID "{\"sandbox\":\"sbx-1\",\"generation\":8,\"worker\":\"wa\",\"substrate\":\"process\"," \
	   "\"activation\":\"act-2\",\"pod_uid\":null}"
	cr_assert_eq(cp_parse_chan(S("{\"ended\":{\"identity\":" ID ",\"reason\":\"its launcher ended\"}}"), &m), 0);
	cr_assert_eq(m.kind, CP_CHAN_ENDED);
	cr_assert_str_eq(m.ended.sandbox, "sbx-1");
	cr_assert_eq(m.ended.generation, 8);
	cr_assert_str_eq(m.ended.activation, "act-2");
	cr_assert_str_eq(m.reason, "its launcher ended");
	cr_assert_eq(cp_parse_chan(S("{\"ended\":{\"identity\":" ID ",\"reason\":\"a\\nlevel=error \\\"x\\\\\"}}"), &m), 0);
	cr_assert_str_eq(m.reason, "a_level=error _x_");
	cr_assert_lt(cp_parse_chan(S("{\"ended\":{\"identity\":" ID "}}"), &m), 0, "no reason");
	cr_assert_lt(cp_parse_chan(S("{\"ended\":{\"reason\":\"r\"}}"), &m), 0, "no identity");
	cr_assert_lt(cp_parse_chan(S("{\"ended\":{\"identity\":{\"sandbox\":\"sbx-1\"},\"reason\":\"r\"}}"), &m), 0);
	cr_assert_lt(cp_parse_chan(S("{\"ended\":{\"identity\":" ID ",\"reason\":\"r\",\"x\":1}}"), &m), 0);
	cr_assert_lt(cp_parse_chan(S("{\"ended\":{\"identity\":" ID ",\"reason\":\"r\"},\"ack\":1}"), &m), 0);
	cr_assert_lt(cp_parse_chan(S("{\"ended\":{\"identity\":" ID ",\"reason\":7}}"), &m), 0);
	cr_assert_lt(cp_parse_chan(S("{\"ended\":{\"identity\":" ID ",\"reason\":\"a\\u0000b\"}}"), &m), 0, "NUL");
	char big[600];
	int n = snprintf(big, sizeof big, "{\"ended\":{\"identity\":" ID ",\"reason\":\"%0300d\"}}", 0);
	cr_assert_lt(cp_parse_chan(big, (size_t)n, &m), 0, "a reason of 300 bytes");
#undef ID
}

Test(cp_parse, body_size_limit)
{
	struct cp_create_req c;
	size_t n = CP_BODY_MAX + 1;
	char *big = malloc(n);
	cr_assert_not_null(big);
	memset(big, ' ', n);
	big[0] = '{';
	big[n - 1] = '}';
	cr_assert_lt(cp_parse_create(big, n, &c, err, sizeof err), 0);
	free(big);
}
