/*
 * test_compare.c — the R6 comparator as one table (R1, R2, R3, R6, C4, C5, S2,
 * S4), and the execution identity's canonical text and JSON forms (I2).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "cap.h"
#include "compare.h"
#include "spaced_error.h"
#include "identity.h"

/* ---- the comparator table ---- */

enum field_change {
	CH_NONE = 0,
	CH_SANDBOX = 1 << 0,
	CH_GEN_UP = 1 << 1,   /* installed generation is higher than the capability's */
	CH_GEN_DOWN = 1 << 2, /* installed generation is lower */
	CH_WORKER = 1 << 3,
	CH_SUBSTRATE = 1 << 4,
	CH_ACTIVATION = 1 << 5,
	CH_POD = 1 << 6,
	CH_TOMBSTONE = 1 << 7,
	CH_NO_RECORD = 1 << 8,
};

struct row {
	const char *name;
	enum spaced_cap_class cls;
	uint32_t purpose;   /* asked for */
	uint16_t port;      /* asked for (serviceport) */
	const char *proto;  /* asked for (serviceport) */
	unsigned changes;   /* of the installed record relative to the capability */
	enum spaced_compare_mode mode;
	enum spaced_verdict verdict;
	enum spaced_reason reason;
};

#define CTL SPACED_CLASS_CONTROL
#define SP SPACED_CLASS_SERVICEPORT
#define STRICT SPACED_COMPARE_STRICT
#define STREAM SPACED_COMPARE_ESTABLISHED_STREAM
#define EXEC SPACED_PURPOSE_EXEC
#define SPP SPACED_PURPOSE_SERVICEPORT

static const struct row ROWS[] = {
	/* ALLOW */
	{"allow control", CTL, EXEC, 0, NULL, CH_NONE, STRICT, SPACED_ALLOW, SPACED_REASON_OK},
	{"allow serviceport", SP, SPP, 8080, "http", CH_NONE, STRICT, SPACED_ALLOW, SPACED_REASON_OK},
	{"allow stream", SP, SPP, 8080, "http", CH_NONE, STREAM, SPACED_ALLOW, SPACED_REASON_OK},
	/* REFRESH_ROUTE: same sandbox, another incarnation or placement (R2, R3, C4) */
	{"R3 receiver installed a newer generation", CTL, EXEC, 0, NULL, CH_GEN_UP, STRICT, SPACED_REFRESH_ROUTE,
	 SPACED_REASON_OLDER_GENERATION},
	{"R2 receiver still serves an older generation", CTL, EXEC, 0, NULL, CH_GEN_DOWN, STRICT,
	 SPACED_REFRESH_ROUTE, SPACED_REASON_NEWER_GENERATION},
	{"other worker", CTL, EXEC, 0, NULL, CH_WORKER, STRICT, SPACED_REFRESH_ROUTE, SPACED_REASON_OTHER_WORKER},
	{"other substrate", CTL, EXEC, 0, NULL, CH_SUBSTRATE, STRICT, SPACED_REFRESH_ROUTE,
	 SPACED_REASON_OTHER_SUBSTRATE},
	{"other activation", CTL, EXEC, 0, NULL, CH_ACTIVATION, STRICT, SPACED_REFRESH_ROUTE,
	 SPACED_REASON_OTHER_ACTIVATION},
	{"other pod", CTL, EXEC, 0, NULL, CH_POD, STRICT, SPACED_REFRESH_ROUTE, SPACED_REASON_OTHER_POD},
	{"tombstone of the same generation", CTL, EXEC, 0, NULL, CH_TOMBSTONE, STRICT, SPACED_REFRESH_ROUTE,
	 SPACED_REASON_DEACTIVATED},
	{"tombstone of the same generation, serviceport", SP, SPP, 8080, "http", CH_TOMBSTONE, STRICT,
	 SPACED_REFRESH_ROUTE, SPACED_REASON_DEACTIVATED},
	{"tombstone, capability for a newer generation", CTL, EXEC, 0, NULL, CH_TOMBSTONE | CH_GEN_DOWN, STRICT,
	 SPACED_REFRESH_ROUTE, SPACED_REASON_NEWER_GENERATION},
	{"tombstone of a newer generation", CTL, EXEC, 0, NULL, CH_TOMBSTONE | CH_GEN_UP, STRICT,
	 SPACED_REFRESH_ROUTE, SPACED_REASON_OLDER_GENERATION},
	{"tombstone wins over placement", CTL, EXEC, 0, NULL, CH_TOMBSTONE | CH_WORKER | CH_ACTIVATION, STRICT,
	 SPACED_REFRESH_ROUTE, SPACED_REASON_DEACTIVATED},
	{"generation wins over placement", CTL, EXEC, 0, NULL, CH_GEN_UP | CH_WORKER | CH_POD, STRICT,
	 SPACED_REFRESH_ROUTE, SPACED_REASON_OLDER_GENERATION},
	/* DENY (C5) */
	{"other sandbox", CTL, EXEC, 0, NULL, CH_SANDBOX, STRICT, SPACED_DENY, SPACED_REASON_OTHER_SANDBOX},
	{"other sandbox wins over generation", CTL, EXEC, 0, NULL, CH_SANDBOX | CH_GEN_UP, STRICT, SPACED_DENY,
	 SPACED_REASON_OTHER_SANDBOX},
	{"other sandbox, tombstone", CTL, EXEC, 0, NULL, CH_SANDBOX | CH_TOMBSTONE, STRICT, SPACED_DENY,
	 SPACED_REASON_OTHER_SANDBOX},
	{"unknown sandbox", CTL, EXEC, 0, NULL, CH_NO_RECORD, STRICT, SPACED_DENY, SPACED_REASON_UNKNOWN_SANDBOX},
	{"wrong purpose", CTL, SPACED_PURPOSE_TERM, 0, NULL, CH_NONE, STRICT, SPACED_DENY,
	 SPACED_REASON_WRONG_PURPOSE},
	{"two purposes at once", CTL, EXEC | SPACED_PURPOSE_FS_READ, 0, NULL, CH_NONE, STRICT, SPACED_DENY,
	 SPACED_REASON_WRONG_PURPOSE},
	{"no purpose", CTL, 0, 0, NULL, CH_NONE, STRICT, SPACED_DENY, SPACED_REASON_WRONG_PURPOSE},
	{"serviceport asked of a control capability", CTL, SPP, 8080, "http", CH_NONE, STRICT, SPACED_DENY,
	 SPACED_REASON_WRONG_PURPOSE},
	{"exec asked of a serviceport capability", SP, EXEC, 0, NULL, CH_NONE, STRICT, SPACED_DENY,
	 SPACED_REASON_WRONG_PURPOSE},
	{"wrong port", SP, SPP, 8081, "http", CH_NONE, STRICT, SPACED_DENY, SPACED_REASON_WRONG_PORT},
	{"wrong protocol", SP, SPP, 8080, "tcp", CH_NONE, STRICT, SPACED_DENY, SPACED_REASON_WRONG_PROTOCOL},
	{"no protocol", SP, SPP, 8080, NULL, CH_NONE, STRICT, SPACED_DENY, SPACED_REASON_WRONG_PROTOCOL},
	/* C5: DENY reasons win over identity mismatches */
	{"C5 wrong purpose on an older record", CTL, SPACED_PURPOSE_TERM, 0, NULL, CH_GEN_UP, STRICT, SPACED_DENY,
	 SPACED_REASON_WRONG_PURPOSE},
	{"C5 wrong purpose on a newer record", CTL, SPACED_PURPOSE_TERM, 0, NULL, CH_GEN_DOWN, STRICT,
	 SPACED_DENY, SPACED_REASON_WRONG_PURPOSE},
	{"C5 wrong purpose on a tombstone", CTL, SPACED_PURPOSE_TERM, 0, NULL, CH_TOMBSTONE, STRICT, SPACED_DENY,
	 SPACED_REASON_WRONG_PURPOSE},
	{"C5 wrong purpose, unknown sandbox", CTL, SPACED_PURPOSE_TERM, 0, NULL, CH_NO_RECORD, STRICT, SPACED_DENY,
	 SPACED_REASON_WRONG_PURPOSE},
	{"C5 wrong purpose, other sandbox", CTL, SPACED_PURPOSE_TERM, 0, NULL, CH_SANDBOX, STRICT, SPACED_DENY,
	 SPACED_REASON_WRONG_PURPOSE},
	{"C5 wrong port on another worker", SP, SPP, 9090, "http", CH_WORKER | CH_GEN_UP, STRICT, SPACED_DENY,
	 SPACED_REASON_WRONG_PORT},
	{"C5 wrong protocol on another activation", SP, SPP, 8080, "udp", CH_ACTIVATION, STREAM, SPACED_DENY,
	 SPACED_REASON_WRONG_PROTOCOL},
	{"C5 wrong port, unknown sandbox", SP, SPP, 1, "http", CH_NO_RECORD, STRICT, SPACED_DENY,
	 SPACED_REASON_WRONG_PORT},
	/* S4: established streams survive an activation-only change ... */
	{"S4 activation only", SP, SPP, 8080, "http", CH_ACTIVATION, STREAM, SPACED_ALLOW, SPACED_REASON_OK},
	{"S4 activation only, control", CTL, EXEC, 0, NULL, CH_ACTIVATION, STREAM, SPACED_ALLOW, SPACED_REASON_OK},
	/* ... and nothing else */
	{"S4 generation", SP, SPP, 8080, "http", CH_GEN_UP, STREAM, SPACED_REFRESH_ROUTE,
	 SPACED_REASON_OLDER_GENERATION},
	{"S4 generation and activation", SP, SPP, 8080, "http", CH_GEN_UP | CH_ACTIVATION, STREAM,
	 SPACED_REFRESH_ROUTE, SPACED_REASON_OLDER_GENERATION},
	{"S4 newer generation", SP, SPP, 8080, "http", CH_GEN_DOWN, STREAM, SPACED_REFRESH_ROUTE,
	 SPACED_REASON_NEWER_GENERATION},
	{"S4 worker", SP, SPP, 8080, "http", CH_WORKER | CH_ACTIVATION, STREAM, SPACED_REFRESH_ROUTE,
	 SPACED_REASON_OTHER_WORKER},
	{"S4 substrate", SP, SPP, 8080, "http", CH_SUBSTRATE, STREAM, SPACED_REFRESH_ROUTE,
	 SPACED_REASON_OTHER_SUBSTRATE},
	{"S4 pod", SP, SPP, 8080, "http", CH_POD | CH_ACTIVATION, STREAM, SPACED_REFRESH_ROUTE,
	 SPACED_REASON_OTHER_POD},
	{"S4 tombstone", SP, SPP, 8080, "http", CH_TOMBSTONE | CH_ACTIVATION, STREAM, SPACED_REFRESH_ROUTE,
	 SPACED_REASON_DEACTIVATED},
	{"S4 other sandbox", SP, SPP, 8080, "http", CH_SANDBOX, STREAM, SPACED_DENY, SPACED_REASON_OTHER_SANDBOX},
	{"S4 wrong port", SP, SPP, 8081, "http", CH_ACTIVATION, STREAM, SPACED_DENY, SPACED_REASON_WRONG_PORT},
	{"S4 wrong purpose", CTL, SPACED_PURPOSE_TERM, 0, NULL, CH_ACTIVATION, STREAM, SPACED_DENY,
	 SPACED_REASON_WRONG_PURPOSE},
};

static struct spaced_cap cap_for(enum spaced_cap_class cls)
{
	struct spaced_cap c;
	memset(&c, 0, sizeof c);
	cr_assert_eq(spaced_identity_set(&c.id, "sbx-1", 7, "worker-a", "process", "act-1", "pod-1"), 0);
	c.cls = cls;
	if (cls == SPACED_CLASS_SERVICEPORT) {
		c.purposes = SPACED_PURPOSE_SERVICEPORT;
		c.port = 8080;
		strcpy(c.protocol, "http");
	} else {
		c.purposes = SPACED_PURPOSE_EXEC | SPACED_PURPOSE_FS_READ | SPACED_PURPOSE_WATCH;
	}
	c.iat = c.nbf = 1000;
	c.exp = 1120;
	strcpy(c.jti, "j");
	cr_assert_eq(spaced_cap_validate(&c), 0);
	return c;
}

static struct spaced_record record_from(const struct spaced_cap *c, unsigned ch)
{
	struct spaced_record r = {.id = c->id, .epoch = 3, .active = true};
	if (ch & CH_SANDBOX)
		strcpy(r.id.sandbox, "sbx-2");
	if (ch & CH_GEN_UP)
		r.id.generation = c->id.generation + 1;
	if (ch & CH_GEN_DOWN)
		r.id.generation = c->id.generation - 1;
	if (ch & CH_WORKER)
		strcpy(r.id.worker, "worker-b");
	if (ch & CH_SUBSTRATE)
		strcpy(r.id.substrate, "qemu");
	if (ch & CH_ACTIVATION)
		strcpy(r.id.activation, "act-2");
	if (ch & CH_POD)
		strcpy(r.id.pod_uid, "pod-2");
	if (ch & CH_TOMBSTONE)
		r.active = false;
	return r;
}

Test(compare, r6_table)
{
	for (size_t i = 0; i < sizeof ROWS / sizeof ROWS[0]; i++) {
		const struct row *w = &ROWS[i];
		struct spaced_cap c = cap_for(w->cls);
		struct spaced_record rec = record_from(&c, w->changes);
		struct spaced_request req = {w->purpose, w->port, w->proto};
		struct spaced_decision d =
			spaced_compare(&c, &req, (w->changes & CH_NO_RECORD) ? NULL : &rec, w->mode);
		cr_expect_eq(d.verdict, w->verdict, "%s: %s (%s), expected %s (%s)", w->name,
		             spaced_verdict_name(d.verdict), spaced_reason_name(d.reason),
		             spaced_verdict_name(w->verdict), spaced_reason_name(w->reason));
		cr_expect_eq(d.reason, w->reason, "%s: reason %s, expected %s", w->name, spaced_reason_name(d.reason),
		             spaced_reason_name(w->reason));
	}
}

/* Every verdict and every reason is reached by some row of the table (and
 * every verification failure by spaced_decision_from_error). */
Test(compare, table_covers_every_reason)
{
	bool seen[SPACED_REASON__COUNT] = {false};
	for (size_t i = 0; i < sizeof ROWS / sizeof ROWS[0]; i++)
		seen[ROWS[i].reason] = true;
	const int errs[] = {SPACED_EEXPIRED, SPACED_ENOTYET, SPACED_ESIG, SPACED_EUNKNOWNKEY, SPACED_EFORMAT};
	for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++)
		seen[spaced_decision_from_error(errs[i]).reason] = true;
	/* paused is the gate's, after the comparator allowed (capabilities.md) */
	seen[SPACED_REASON_PAUSED] = true;
	seen[SPACED_REASON_FENCED] = true; /* and fenced, a worker's whole state */
	for (int r = 0; r < SPACED_REASON__COUNT; r++)
		cr_expect(seen[r], "reason %s never reached", spaced_reason_name((enum spaced_reason)r));
}

/* S2: every field matters in strict mode; each single-field change refreshes. */
Test(compare, strict_mode_refreshes_on_every_field)
{
	const unsigned one[] = {CH_GEN_UP, CH_GEN_DOWN, CH_WORKER, CH_SUBSTRATE, CH_ACTIVATION, CH_POD, CH_TOMBSTONE};
	for (size_t k = 0; k < 2; k++) {
		struct spaced_cap c = cap_for(k ? SP : CTL);
		struct spaced_request req = {k ? SPP : EXEC, k ? 8080 : 0, k ? "http" : NULL};
		for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) {
			struct spaced_record rec = record_from(&c, one[i]);
			struct spaced_decision d = spaced_compare(&c, &req, &rec, STRICT);
			cr_assert_eq(d.verdict, SPACED_REFRESH_ROUTE, "change %#x", one[i]);
		}
	}
}

/* A pod UID present on one side only is a difference too (Kubernetes placement). */
Test(compare, pod_uid_present_on_one_side)
{
	struct spaced_cap c = cap_for(CTL);
	struct spaced_request req = {EXEC, 0, NULL};
	struct spaced_record rec = record_from(&c, CH_NONE);
	rec.id.pod_uid[0] = 0;
	struct spaced_decision d = spaced_compare(&c, &req, &rec, STRICT);
	cr_assert_eq(d.verdict, SPACED_REFRESH_ROUTE);
	cr_assert_eq(d.reason, SPACED_REASON_OTHER_POD);
	c.id.pod_uid[0] = 0;
	d = spaced_compare(&c, &req, &rec, STRICT);
	cr_assert_eq(d.verdict, SPACED_ALLOW);
}

Test(compare, every_purpose_granted_or_not)
{
	struct spaced_cap c = cap_for(CTL);
	struct spaced_record rec = record_from(&c, CH_NONE);
	for (unsigned i = 0; i < 7; i++) {
		uint32_t p = 1u << i;
		struct spaced_request req = {p, 0, NULL};
		struct spaced_decision d = spaced_compare(&c, &req, &rec, STRICT);
		if (c.purposes & p)
			cr_assert_eq(d.verdict, SPACED_ALLOW, "%s", spaced_purpose_name(p));
		else
			cr_assert(d.verdict == SPACED_DENY && d.reason == SPACED_REASON_WRONG_PURPOSE, "%s",
			          spaced_purpose_name(p));
	}
}

Test(compare, decision_from_error)
{
	const struct {
		int err;
		enum spaced_reason reason;
	} map[] = {
		{SPACED_EEXPIRED, SPACED_REASON_EXPIRED}, {SPACED_ENOTYET, SPACED_REASON_NOT_YET_VALID},
		{SPACED_ESIG, SPACED_REASON_BAD_SIGNATURE}, {SPACED_EUNKNOWNKEY, SPACED_REASON_UNKNOWN_KEY},
		{SPACED_EPURPOSE, SPACED_REASON_WRONG_PURPOSE}, {SPACED_EFORMAT, SPACED_REASON_MALFORMED},
		{SPACED_EHEADER, SPACED_REASON_MALFORMED}, {SPACED_EBASE64, SPACED_REASON_MALFORMED},
		{SPACED_EJSON, SPACED_REASON_MALFORMED}, {SPACED_ECLAIM, SPACED_REASON_MALFORMED},
		{SPACED_EKEY, SPACED_REASON_MALFORMED}, {SPACED_ETOOBIG, SPACED_REASON_MALFORMED},
		{SPACED_EFOOTER, SPACED_REASON_MALFORMED}, {SPACED_ENOMEM, SPACED_REASON_MALFORMED},
		{-1000, SPACED_REASON_MALFORMED},
	};
	for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
		struct spaced_decision d = spaced_decision_from_error(map[i].err);
		cr_assert_eq(d.verdict, SPACED_DENY, "%s is never refreshed (C5)", spaced_errname(map[i].err));
		cr_assert_eq(d.reason, map[i].reason, "%s", spaced_errname(map[i].err));
	}
	struct spaced_decision ok = spaced_decision_from_error(0);
	cr_assert_eq(ok.verdict, SPACED_ALLOW);
}

Test(compare, names)
{
	cr_assert_str_eq(spaced_verdict_name(SPACED_ALLOW), "ALLOW");
	cr_assert_str_eq(spaced_verdict_name(SPACED_REFRESH_ROUTE), "REFRESH_ROUTE");
	cr_assert_str_eq(spaced_verdict_name(SPACED_DENY), "DENY");
	cr_assert_str_eq(spaced_verdict_name((enum spaced_verdict)42), "DENY");
	static const char *const want[SPACED_REASON__COUNT] = {
		"ok", "expired", "not-yet-valid", "bad-signature", "unknown-key", "malformed", "wrong-purpose",
		"wrong-port", "wrong-protocol", "unknown-sandbox", "other-sandbox", "older-generation",
		"newer-generation", "other-worker", "other-substrate", "other-activation", "other-pod", "deactivated",
		"paused", "fenced",
	};
	for (int r = 0; r < SPACED_REASON__COUNT; r++) {
		cr_assert_not_null(want[r]);
		cr_assert_str_eq(spaced_reason_name((enum spaced_reason)r), want[r]);
		for (int q = 0; q < r; q++)
			cr_assert_str_neq(spaced_reason_name((enum spaced_reason)r),
			                  spaced_reason_name((enum spaced_reason)q));
	}
	cr_assert_str_eq(spaced_reason_name(SPACED_REASON__COUNT), "malformed");
	cr_assert_str_eq(spaced_reason_name((enum spaced_reason)-1), "malformed");
}

/* ---- identity (I2) ---- */

static struct spaced_identity ident(const char *pod)
{
	struct spaced_identity id;
	cr_assert_eq(spaced_identity_set(&id, "sbx-1", 42, "worker-a", "process", "act-1", pod), 0);
	return id;
}

Test(identity, canonical_round_trip)
{
	const char *const pods[] = {NULL, "", "pod-9f8e"};
	for (size_t i = 0; i < 3; i++) {
		struct spaced_identity id = ident(pods[i]), back;
		char text[SPACED_IDENTITY_TEXT_MAX];
		int n = spaced_identity_encode(&id, text, sizeof text);
		cr_assert_gt(n, 0);
		cr_assert_eq((size_t)n, strlen(text));
		cr_assert_eq(spaced_identity_decode(&back, text, (size_t)n), 0, "%s", text);
		cr_assert(spaced_identity_equal(&id, &back));
		char again[SPACED_IDENTITY_TEXT_MAX];
		spaced_identity_encode(&back, again, sizeof again);
		cr_assert_str_eq(again, text);
	}
	struct spaced_identity id = ident(NULL);
	char text[SPACED_IDENTITY_TEXT_MAX];
	spaced_identity_encode(&id, text, sizeof text);
	cr_assert_str_eq(text, "sandbox=sbx-1;generation=42;worker=worker-a;substrate=process;activation=act-1;pod_uid=");
}

Test(identity, longest_names_fit)
{
	char n63[64];
	memset(n63, 'z', 63);
	n63[63] = 0;
	struct spaced_identity id, back;
	cr_assert_eq(spaced_identity_set(&id, n63, SPACED_GENERATION_MAX, n63, n63, n63, n63), 0);
	char text[SPACED_IDENTITY_TEXT_MAX];
	int n = spaced_identity_encode(&id, text, sizeof text);
	cr_assert_gt(n, 0);
	cr_assert_eq(spaced_identity_decode(&back, text, (size_t)n), 0);
	cr_assert(spaced_identity_equal(&id, &back));
	cr_assert_eq(spaced_identity_encode(&id, text, (size_t)n), SPACED_ETOOBIG, "no room for the NUL");
	cr_assert_eq(spaced_identity_encode(&id, text, (size_t)n + 1), n);
}

Test(identity, canonical_strict_refusals)
{
	static const char *const bad[] = {
		"sandbox=sbx-1;generation=042;worker=w;substrate=process;activation=a;pod_uid=",  /* leading zero */
		"sandbox=sbx-1;generation=0;worker=w;substrate=process;activation=a;pod_uid=",    /* generation 0 */
		"sandbox=sbx-1;generation=9007199254740992;worker=w;substrate=process;activation=a;pod_uid=",
		"sandbox=sbx-1;generation=18446744073709551617;worker=w;substrate=process;activation=a;pod_uid=",
		"sandbox=sbx-1;generation=-1;worker=w;substrate=process;activation=a;pod_uid=",
		"sandbox=sbx-1;generation=+1;worker=w;substrate=process;activation=a;pod_uid=",
		"sandbox=sbx-1;generation=1e3;worker=w;substrate=process;activation=a;pod_uid=",
		"sandbox=sbx-1;generation=;worker=w;substrate=process;activation=a;pod_uid=",
		"sandbox=sbx-1;generation=1;worker=w;substrate=process;activation=a",              /* missing pod_uid */
		"sandbox=sbx-1;generation=1;worker=w;substrate=process;pod_uid=",                 /* missing activation */
		"generation=1;sandbox=sbx-1;worker=w;substrate=process;activation=a;pod_uid=",    /* reordered */
		"sandbox=sbx-1;generation=1;substrate=process;worker=w;activation=a;pod_uid=",    /* reordered */
		"sandbox=sbx-1;generation=1;worker=w;substrate=process;activation=a;pod_uid=;x=y", /* extra field */
		"sandbox=sbx-1;generation=1;worker=w;substrate=process;activation=a;pod_uid=p;",
		"sandbox=sbx-1;generation=1;worker=w;substrate=process;activation=a;pod_uid=;",
		"sandbox=sbx 1;generation=1;worker=w;substrate=process;activation=a;pod_uid=",    /* bad chars */
		"sandbox=sbx-1;generation=1;worker=w/x;substrate=process;activation=a;pod_uid=",
		"sandbox=sbx-1;generation=1;worker=w;substrate=pro=cess;activation=a;pod_uid=",
		"sandbox=sbx-1;generation=1;worker=w;substrate=process;activation=ä;pod_uid=",
		"sandbox=sbx-1;generation=1;worker=w;substrate=process;activation=a;pod_uid=p\n",
		"sandbox=;generation=1;worker=w;substrate=process;activation=a;pod_uid=",         /* empty name */
		"sandbox=sbx-1;generation=1;worker=;substrate=process;activation=a;pod_uid=",
		"Sandbox=sbx-1;generation=1;worker=w;substrate=process;activation=a;pod_uid=",
		"sandbox=sbx-1; generation=1;worker=w;substrate=process;activation=a;pod_uid=",
		" sandbox=sbx-1;generation=1;worker=w;substrate=process;activation=a;pod_uid=",
		"sandbox:sbx-1;generation=1;worker=w;substrate=process;activation=a;pod_uid=",
		"",
		"sandbox=sbx-1",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct spaced_identity out;
		memset(&out, 0x5a, sizeof out);
		struct spaced_identity before = out;
		int r = spaced_identity_decode(&out, bad[i], strlen(bad[i]));
		cr_assert(r == SPACED_EFORMAT || r == SPACED_EINVAL, "accepted: %s (%d)", bad[i], r);
		cr_assert_eq(memcmp(&out, &before, sizeof out), 0, "output written on error: %s", bad[i]);
	}
	/* the largest generation is fine */
	struct spaced_identity out;
	const char *max = "sandbox=s;generation=9007199254740991;worker=w;substrate=t;activation=a;pod_uid=";
	cr_assert_eq(spaced_identity_decode(&out, max, strlen(max)), 0);
	cr_assert_eq(out.generation, SPACED_GENERATION_MAX);
}

/* Names are 1-63 characters: 64 are refused everywhere. */
Test(identity, name_of_64_characters)
{
	char n64[65], n63[64], text[400];
	memset(n64, 'a', 64);
	n64[64] = 0;
	memset(n63, 'a', 63);
	n63[63] = 0;
	cr_assert(!spaced_name_valid(n64, 64));
	cr_assert(spaced_name_valid(n63, 63));
	cr_assert(!spaced_name_valid("", 0));
	cr_assert(!spaced_name_valid(NULL, 0));
	struct spaced_identity id;
	cr_assert_eq(spaced_identity_set(&id, n64, 1, "w", "t", "a", NULL), SPACED_EINVAL);
	cr_assert_eq(spaced_identity_set(&id, "s", 1, "w", "t", "a", n64), SPACED_EINVAL);
	cr_assert_eq(spaced_identity_set(&id, "s", 1, n64, "t", "a", NULL), SPACED_EINVAL);
	const char *fields[] = {"sandbox", "worker", "substrate", "activation", "pod_uid"};
	for (size_t f = 0; f < 5; f++) {
		snprintf(text, sizeof text, "sandbox=%s;generation=1;worker=%s;substrate=%s;activation=%s;pod_uid=%s",
		         f == 0 ? n64 : "s", f == 1 ? n64 : "w", f == 2 ? n64 : "t", f == 3 ? n64 : "a",
		         f == 4 ? n64 : "");
		cr_assert_neq(spaced_identity_decode(&id, text, strlen(text)), 0, "64-char %s", fields[f]);
	}
}

Test(identity, set_refusals)
{
	struct spaced_identity id;
	cr_assert_eq(spaced_identity_set(&id, "s", 0, "w", "t", "a", NULL), SPACED_EINVAL);
	cr_assert_eq(spaced_identity_set(&id, "s", SPACED_GENERATION_MAX + 1, "w", "t", "a", NULL), SPACED_EINVAL);
	cr_assert_eq(spaced_identity_set(&id, "s", SPACED_GENERATION_MAX, "w", "t", "a", NULL), 0);
	cr_assert_eq(spaced_identity_set(&id, NULL, 1, "w", "t", "a", NULL), SPACED_EINVAL);
	cr_assert_eq(spaced_identity_set(&id, "s", 1, "w", "", "a", NULL), SPACED_EINVAL);
	cr_assert_eq(spaced_identity_set(&id, "s;x", 1, "w", "t", "a", NULL), SPACED_EINVAL);
	cr_assert_eq(spaced_identity_set(&id, "s", 1, "w", "t", "a=b", NULL), SPACED_EINVAL);
}

Test(identity, equality)
{
	struct spaced_identity a = ident("p"), b = ident("p");
	cr_assert(spaced_identity_equal(&a, &b));
	b.generation++;
	cr_assert(!spaced_identity_equal(&a, &b));
	b = a;
	strcpy(b.pod_uid, "");
	cr_assert(!spaced_identity_equal(&a, &b));
	b = a;
	strcpy(b.activation, "act-2");
	cr_assert(!spaced_identity_equal(&a, &b));
}

Test(identity, json_round_trip)
{
	const char *const pods[] = {NULL, "pod-1"};
	for (size_t i = 0; i < 2; i++) {
		struct spaced_identity id = ident(pods[i]), back;
		json_t *o = spaced_identity_to_json(&id);
		cr_assert_not_null(o);
		cr_assert(json_is_integer(json_object_get(o, "generation")));
		if (pods[i] == NULL)
			cr_assert(json_is_null(json_object_get(o, "pod_uid")), "empty pod_uid is null");
		cr_assert_eq(spaced_identity_from_json(&back, o), 0);
		cr_assert(spaced_identity_equal(&id, &back));
		char *s = json_dumps(o, JSON_COMPACT);
		json_error_t e;
		json_t *o2 = json_loads(s, JSON_REJECT_DUPLICATES, &e);
		cr_assert_eq(spaced_identity_from_json(&back, o2), 0);
		cr_assert(spaced_identity_equal(&id, &back));
		json_decref(o2);
		free(s);
		json_decref(o);
	}
}

Test(identity, json_refusals)
{
	static const char *const bad[] = {
		"{\"sandbox\":\"s\",\"generation\":1,\"worker\":\"w\",\"substrate\":\"t\",\"activation\":\"a\",\"x\":1}",
		"{\"sandbox\":\"s\",\"generation\":1,\"worker\":\"w\",\"substrate\":\"t\"}",
		"{\"sandbox\":\"s\",\"generation\":\"1\",\"worker\":\"w\",\"substrate\":\"t\",\"activation\":\"a\"}",
		"{\"sandbox\":\"s\",\"generation\":1.0,\"worker\":\"w\",\"substrate\":\"t\",\"activation\":\"a\"}",
		"{\"sandbox\":\"s\",\"generation\":0,\"worker\":\"w\",\"substrate\":\"t\",\"activation\":\"a\"}",
		"{\"sandbox\":\"s\",\"generation\":-3,\"worker\":\"w\",\"substrate\":\"t\",\"activation\":\"a\"}",
		"{\"sandbox\":\"s\",\"generation\":9007199254740992,\"worker\":\"w\",\"substrate\":\"t\",\"activation\":\"a\"}",
		"{\"sandbox\":5,\"generation\":1,\"worker\":\"w\",\"substrate\":\"t\",\"activation\":\"a\"}",
		"{\"sandbox\":\"s\",\"generation\":1,\"worker\":\"w\",\"substrate\":\"t\",\"activation\":\"a\",\"pod_uid\":5}",
		"{\"sandbox\":\"s b\",\"generation\":1,\"worker\":\"w\",\"substrate\":\"t\",\"activation\":\"a\"}",
		"{\"sandbox\":\"s\",\"generation\":1,\"worker\":\"w\",\"substrate\":\"t\",\"activation\":null}",
		"[\"s\",1,\"w\",\"t\",\"a\"]",
		"\"sandbox=s;generation=1;worker=w;substrate=t;activation=a;pod_uid=\"",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		json_error_t e;
		json_t *o = json_loads(bad[i], JSON_DECODE_ANY, &e);
		cr_assert_not_null(o, "%s", bad[i]);
		struct spaced_identity id;
		int r = spaced_identity_from_json(&id, o);
		cr_assert(r == SPACED_EJSON || r == SPACED_EINVAL, "accepted: %s", bad[i]);
		json_decref(o);
	}
	cr_assert_neq(spaced_identity_from_json(&(struct spaced_identity){0}, NULL), 0);
}
