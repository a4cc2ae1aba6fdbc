/* links.c — the table of spaced-node's internal messages (see links.h). */
#include "links.h"

#include "executor.h"
#include "node.h"

#define END SPACED_FRAME_F_END
#define F LINK_ID_FREE
#define OPENING LINK_ID_OPENING
#define OPEN LINK_ID_OPEN
#define ENDED LINK_ID_ENDED
#define INFLIGHT LINK_ID_INFLIGHT

/* type, name, from, to, payload bound, flags required, flags allowed,
 * handled in, dropped in (every other state: protocol error) */
static const struct link_msg table[] = {
	/* node-api -> gate: the gate forgets a stream when it ends, so input,
	 * close and credit for an id it no longer has are stale */
	{NODE_MSG_REQ, "REQ", LINK_API, LINK_GATE, NODE_MSG_MAX, 0, 0, F, 0},
	{NODE_MSG_IN, "IN", LINK_API, LINK_GATE, NODE_MSG_MAX, 0, END, OPENING | OPEN, F},
	{NODE_MSG_CLOSE, "CLOSE", LINK_API, LINK_GATE, 0, 0, 0, OPENING | OPEN, F},
	{NODE_MSG_CREDIT, "CREDIT", LINK_API, LINK_GATE, 16, 0, 0, OPENING | OPEN, F},
	{NODE_MSG_METRICS, "METRICS", LINK_API, LINK_GATE, 0, 0, 0, F, 0},
	/* gate -> node-api: node-api forgets a request whose client left (its
	 * CLOSE may cross these), and ends one on REFUSE, CANCEL, FAIL or END */
	{NODE_MSG_ACCEPT, "ACCEPT", LINK_GATE, LINK_API, SPACED_IDENTITY_TEXT_MAX + SPACED_NAME_MAX + 48, 0, 0, OPENING, F | ENDED},
	{NODE_MSG_REFUSE, "REFUSE", LINK_GATE, LINK_API, 256, END, END, OPENING, F | ENDED},
	{NODE_MSG_OUT, "OUT", LINK_GATE, LINK_API, NODE_MSG_MAX, 0, END, OPEN, F | ENDED},
	{NODE_MSG_CANCEL, "CANCEL", LINK_GATE, LINK_API, 256, END, END, OPENING | OPEN, F | ENDED},
	{NODE_MSG_FAIL, "FAIL", LINK_GATE, LINK_API, 512, END, END, OPENING | OPEN, F | ENDED},
	{NODE_MSG_GCREDIT, "GCREDIT", LINK_GATE, LINK_API, 16, 0, 0, OPENING | OPEN, F | ENDED},
	{NODE_MSG_METRICS_TEXT, "METRICS_TEXT", LINK_GATE, LINK_API, NODE_MSG_MAX, 0, END, OPENING, F | ENDED},
	/* gate <-> executor: one completion per job, never for another */
	{EXE_JOB, "EXE_JOB", LINK_GATE, LINK_EXECUTOR, EXE_MSG_MAX - SPACED_FRAME_HDR_LEN, 0, 0, F, 0},
	{EXE_DONE, "EXE_DONE", LINK_EXECUTOR, LINK_GATE, EXE_MSG_MAX - SPACED_FRAME_HDR_LEN, END, END, INFLIGHT, 0},
};

const struct link_msg *link_msg_find(enum link_role to, uint16_t type)
{
	for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
		if (table[i].type == type && table[i].to == to)
			return &table[i];
	return NULL;
}

enum link_verdict link_check(enum link_role to, const struct spaced_frame_hdr *h, unsigned state)
{
	const struct link_msg *m = link_msg_find(to, h->type);
	if (!m || h->id == 0 || h->len > m->max_len || (h->flags & m->flags_required) != m->flags_required ||
	    (h->flags & ~m->flags_allowed))
		return LINK_BAD;
	if (state & m->handled)
		return LINK_HANDLE;
	if (state & m->stale)
		return LINK_STALE;
	return LINK_BAD;
}

const char *link_msg_name(uint16_t type)
{
	for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
		if (table[i].type == type)
			return table[i].name;
	return "?";
}
