/* compare.c — the R6 identity comparator. */
#include "compare.h"

#include <string.h>

#include "spaced_error.h"

static struct spaced_decision decide(enum spaced_verdict v, enum spaced_reason r)
{
	struct spaced_decision d = {v, r};
	return d;
}

struct spaced_decision spaced_compare(const struct spaced_cap *cap, const struct spaced_request *req,
                                      const struct spaced_record *rec, enum spaced_compare_mode mode)
{
	/* C5: what the capability allows is checked before anything else and is
	 * never a reason to refresh. */
	if (req->purpose == 0 || (req->purpose & (req->purpose - 1)) != 0 ||
	    (cap->purposes & req->purpose) == 0)
		return decide(SPACED_DENY, SPACED_REASON_WRONG_PURPOSE);
	if (cap->cls == SPACED_CLASS_SERVICEPORT) {
		if (req->port != cap->port)
			return decide(SPACED_DENY, SPACED_REASON_WRONG_PORT);
		if (req->protocol == NULL || strcmp(req->protocol, cap->protocol) != 0)
			return decide(SPACED_DENY, SPACED_REASON_WRONG_PROTOCOL);
	}
	if (rec == NULL)
		return decide(SPACED_DENY, SPACED_REASON_UNKNOWN_SANDBOX);
	const struct spaced_identity *want = &cap->id, *have = &rec->id;
	if (strcmp(want->sandbox, have->sandbox) != 0)
		return decide(SPACED_DENY, SPACED_REASON_OTHER_SANDBOX);
	/* Same sandbox from here on: any mismatch means the route is stale (R2, R3). */
	if (want->generation < have->generation)
		return decide(SPACED_REFRESH_ROUTE, SPACED_REASON_OLDER_GENERATION);
	if (want->generation > have->generation)
		return decide(SPACED_REFRESH_ROUTE, SPACED_REASON_NEWER_GENERATION);
	if (!rec->active)
		return decide(SPACED_REFRESH_ROUTE, SPACED_REASON_DEACTIVATED);
	if (strcmp(want->worker, have->worker) != 0)
		return decide(SPACED_REFRESH_ROUTE, SPACED_REASON_OTHER_WORKER);
	if (strcmp(want->substrate, have->substrate) != 0)
		return decide(SPACED_REFRESH_ROUTE, SPACED_REASON_OTHER_SUBSTRATE);
	if (strcmp(want->pod_uid, have->pod_uid) != 0)
		return decide(SPACED_REFRESH_ROUTE, SPACED_REASON_OTHER_POD);
	if (strcmp(want->activation, have->activation) != 0 && mode != SPACED_COMPARE_ESTABLISHED_STREAM)
		return decide(SPACED_REFRESH_ROUTE, SPACED_REASON_OTHER_ACTIVATION);
	return decide(SPACED_ALLOW, SPACED_REASON_OK);
}

struct spaced_decision spaced_decision_from_error(int err)
{
	switch (err) {
	case SPACED_OK:
		return decide(SPACED_ALLOW, SPACED_REASON_OK);
	case SPACED_EEXPIRED:
		return decide(SPACED_DENY, SPACED_REASON_EXPIRED);
	case SPACED_ENOTYET:
		return decide(SPACED_DENY, SPACED_REASON_NOT_YET_VALID);
	case SPACED_ESIG:
		return decide(SPACED_DENY, SPACED_REASON_BAD_SIGNATURE);
	case SPACED_EUNKNOWNKEY:
		return decide(SPACED_DENY, SPACED_REASON_UNKNOWN_KEY);
	case SPACED_EPURPOSE:
		return decide(SPACED_DENY, SPACED_REASON_WRONG_PURPOSE);
	default:
		return decide(SPACED_DENY, SPACED_REASON_MALFORMED);
	}
}

const char *spaced_verdict_name(enum spaced_verdict v)
{
	switch (v) {
	case SPACED_ALLOW:
		return "ALLOW";
	case SPACED_REFRESH_ROUTE:
		return "REFRESH_ROUTE";
	case SPACED_DENY:
		return "DENY";
	}
	return "DENY";
}

const char *spaced_reason_name(enum spaced_reason r)
{
	static const char *const names[] = {
#define SPACED_REASON_STR(name, str) str,
		SPACED_REASONS(SPACED_REASON_STR)
#undef SPACED_REASON_STR
	};
	return (unsigned)r < SPACED_REASON__COUNT ? names[r] : "malformed";
}
