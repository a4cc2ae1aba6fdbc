/*
 * links.h — every message on spaced-node's internal links, declared once.
 *
 * node-api ⇄ gate: frame.h frames over a stream socketpair (the id is
 * node-api's request id); gate ⇄ executor: one frame per SOCK_SEQPACKET
 * message (the id is a job id). node.h and executor.h describe the payloads;
 * the table in links.c says, for each type, who sends it to whom, the bounds
 * of its payload, its flags, and the states of its id at the receiver in
 * which it is handled, dropped as stale (a race with an end the sender had
 * not yet seen) or a protocol error. Every receiver asks link_check() before
 * it looks at a payload; a protocol error ends that link (and with it the
 * worker's process group, which the supervisor starts again).
 */
#ifndef SPACED_NODE_LINKS_H
#define SPACED_NODE_LINKS_H

#include <stddef.h>
#include <stdint.h>

#include "frame.h"

enum link_role { LINK_API = 1, LINK_GATE, LINK_EXECUTOR };

/* The state of a message's id at its receiver (one bit each). */
enum link_id_state {
	LINK_ID_FREE = 1u << 0,    /* no stream or job has this id */
	LINK_ID_OPENING = 1u << 1, /* a stream asked for, not yet accepted or refused */
	LINK_ID_OPEN = 1u << 2,    /* a stream accepted: bytes flow */
	LINK_ID_ENDED = 1u << 3,   /* the receiver ended it; the sender may not know yet */
	LINK_ID_INFLIGHT = 1u << 4, /* a job sent and not yet completed */
};

enum link_verdict {
	LINK_HANDLE = 0, /* well-formed and expected: handle it */
	LINK_STALE = 1,  /* for an id that ended: drop it */
	LINK_BAD = -1,   /* unknown type, wrong direction, bounds, flags or state */
};

struct link_msg {
	uint16_t type;
	const char *name;
	enum link_role from, to;
	uint32_t max_len;       /* payload bound */
	uint16_t flags_required; /* flags that must be set */
	uint16_t flags_allowed;  /* flags that may be set (a superset of required) */
	unsigned handled;        /* id states in which it is handled */
	unsigned stale;          /* id states in which it is dropped */
};

/* The entry for type sent to role `to`, or NULL. */
const struct link_msg *link_msg_find(enum link_role to, uint16_t type);

/* Checks a received header (its payload length h->len included) against the
 * table for receiver `to`, with its id in `state` (one LINK_ID_* bit).
 * Returns LINK_HANDLE, LINK_STALE or LINK_BAD. */
enum link_verdict link_check(enum link_role to, const struct spaced_frame_hdr *h, unsigned state);

/* The message's name for logs ("REQ", "EXE_DONE"…), "?" when unknown. */
const char *link_msg_name(uint16_t type);

#endif
