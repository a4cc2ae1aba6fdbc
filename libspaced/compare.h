/*
 * compare.h — the identity comparator (R1, R2, R3, R6, C4, C5, S4).
 *
 * Given a verified capability, the operation asked for and the runtime record
 * installed on this receiver, it answers exactly one of ALLOW, REFRESH_ROUTE
 * (same sandbox, another incarnation or placement: the caller should resolve
 * the route again) or DENY (another sandbox, or anything invalid), with a
 * precise reason. Verification failures map to DENY (C5): they are never
 * refreshed.
 */
#ifndef SPACED_COMPARE_H
#define SPACED_COMPARE_H

#include <stdbool.h>
#include <stdint.h>

#include "cap.h"
#include "identity.h"

enum spaced_verdict {
	SPACED_ALLOW = 0,
	SPACED_REFRESH_ROUTE = 1,
	SPACED_DENY = 2,
};

#define SPACED_REASONS(X)                                  \
	X(SPACED_REASON_OK, "ok")                          \
	X(SPACED_REASON_EXPIRED, "expired")                \
	X(SPACED_REASON_NOT_YET_VALID, "not-yet-valid")    \
	X(SPACED_REASON_BAD_SIGNATURE, "bad-signature")    \
	X(SPACED_REASON_UNKNOWN_KEY, "unknown-key")        \
	X(SPACED_REASON_MALFORMED, "malformed")            \
	X(SPACED_REASON_WRONG_PURPOSE, "wrong-purpose")    \
	X(SPACED_REASON_WRONG_PORT, "wrong-port")          \
	X(SPACED_REASON_WRONG_PROTOCOL, "wrong-protocol")  \
	X(SPACED_REASON_UNKNOWN_SANDBOX, "unknown-sandbox")\
	X(SPACED_REASON_OTHER_SANDBOX, "other-sandbox")    \
	X(SPACED_REASON_OLDER_GENERATION, "older-generation") \
	X(SPACED_REASON_NEWER_GENERATION, "newer-generation") \
	X(SPACED_REASON_OTHER_WORKER, "other-worker")      \
	X(SPACED_REASON_OTHER_SUBSTRATE, "other-substrate")\
	X(SPACED_REASON_OTHER_ACTIVATION, "other-activation") \
	X(SPACED_REASON_OTHER_POD, "other-pod")            \
	X(SPACED_REASON_DEACTIVATED, "deactivated")        \
	X(SPACED_REASON_PAUSED, "paused")                  \
	X(SPACED_REASON_FENCED, "fenced")

/* A request to an execution paused on purpose for longer than this is
 * refused at once with SPACED_REASON_PAUSED (the gate and the ServicePort
 * gateway decide it after the comparator); one sent earlier in the pause
 * waits for the resume, as the frozen guest makes it. */
#define SPACED_PAUSE_HOLD_MS 3000
/* SPACED_REASON_FENCED: the worker lost its control plane for longer than
 * its --fence-after and froze its executions (the gate decides it after the
 * comparator, as paused): the sandbox may run elsewhere by now. */

enum spaced_reason {
#define SPACED_REASON_ENUM(name, str) name,
	SPACED_REASONS(SPACED_REASON_ENUM)
#undef SPACED_REASON_ENUM
	SPACED_REASON__COUNT
};

struct spaced_decision {
	enum spaced_verdict verdict;
	enum spaced_reason reason;
};

/* What this receiver has installed for one sandbox: the serving execution, or a
 * tombstone of the execution that left (active == false). epoch increases with
 * every install and is what stream leases are bound to (S1). */
struct spaced_record {
	struct spaced_identity id;
	uint64_t epoch;
	bool active;
};

/* The operation asked for: one purpose bit; for ServicePort also the port and
 * protocol (protocol may be NULL otherwise). */
struct spaced_request {
	uint32_t purpose;
	uint16_t port;
	const char *protocol;
};

enum spaced_compare_mode {
	/* Every field must match: new requests and every stream open (S2). */
	SPACED_COMPARE_STRICT = 0,
	/* For streams already established through the gateway only (S4): a change
	 * of the activation alone keeps them. */
	SPACED_COMPARE_ESTABLISHED_STREAM = 1,
};

/* Compares. rec may be NULL when this receiver has never seen the sandbox
 * (DENY unknown-sandbox). Order: purpose, port and protocol (DENY); sandbox
 * (DENY other-sandbox); generation (REFRESH_ROUTE older/newer-generation);
 * tombstone of the same generation (REFRESH_ROUTE deactivated); worker,
 * substrate, pod, activation (REFRESH_ROUTE). */
struct spaced_decision spaced_compare(const struct spaced_cap *cap, const struct spaced_request *req,
                                      const struct spaced_record *rec, enum spaced_compare_mode mode);

/* The DENY decision for a verification error from spaced_cap_verify(). */
struct spaced_decision spaced_decision_from_error(int err);

/* "ALLOW", "REFRESH_ROUTE", "DENY". */
const char *spaced_verdict_name(enum spaced_verdict v);

/* The reason's wire name ("older-generation", …). */
const char *spaced_reason_name(enum spaced_reason r);

#endif
