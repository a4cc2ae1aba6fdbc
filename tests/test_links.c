/*
 * test_links.c — the table of spaced-node's internal messages (links.c):
 * direction, payload bounds, flags and the states of the id at the receiver.
 * A message outside the table ends its link; one for an id its receiver has
 * already ended is dropped, never handled.
 */
#include <criterion/criterion.h>

#include "executor.h"
#include "links.h"
#include "node.h"

static struct spaced_frame_hdr hdr(uint16_t type, uint16_t flags, uint32_t len)
{
	return (struct spaced_frame_hdr){.type = type, .flags = flags, .len = len, .id = 7};
}

Test(links, every_message_has_one_receiver)
{
	static const uint16_t api_in[] = {NODE_MSG_ACCEPT, NODE_MSG_REFUSE, NODE_MSG_OUT,
	                                  NODE_MSG_CANCEL, NODE_MSG_FAIL,   NODE_MSG_GCREDIT};
	static const uint16_t gate_in[] = {NODE_MSG_REQ, NODE_MSG_IN, NODE_MSG_CLOSE, NODE_MSG_CREDIT, EXE_DONE};
	for (size_t i = 0; i < sizeof api_in / sizeof api_in[0]; i++) {
		cr_expect_not_null(link_msg_find(LINK_API, api_in[i]));
		cr_expect_null(link_msg_find(LINK_GATE, api_in[i]), "%s reaches the gate", link_msg_name(api_in[i]));
	}
	for (size_t i = 0; i < sizeof gate_in / sizeof gate_in[0]; i++) {
		cr_expect_not_null(link_msg_find(LINK_GATE, gate_in[i]));
		cr_expect_null(link_msg_find(LINK_API, gate_in[i]), "%s reaches node-api", link_msg_name(gate_in[i]));
	}
	cr_expect_not_null(link_msg_find(LINK_EXECUTOR, EXE_JOB));
	cr_expect_null(link_msg_find(LINK_EXECUTOR, EXE_DONE));
	cr_expect_null(link_msg_find(LINK_GATE, 0x7777));
	cr_expect_str_eq(link_msg_name(0x7777), "?");
}

Test(links, states_decide_handle_drop_or_end)
{
	struct spaced_frame_hdr h = hdr(NODE_MSG_OUT, 0, 10);
	cr_expect_eq(link_check(LINK_API, &h, LINK_ID_OPEN), LINK_HANDLE);
	cr_expect_eq(link_check(LINK_API, &h, LINK_ID_ENDED), LINK_STALE);
	cr_expect_eq(link_check(LINK_API, &h, LINK_ID_FREE), LINK_STALE);
	cr_expect_eq(link_check(LINK_API, &h, LINK_ID_OPENING), LINK_BAD, "output before the stream was accepted");
	h = hdr(NODE_MSG_ACCEPT, 0, 40);
	cr_expect_eq(link_check(LINK_API, &h, LINK_ID_OPENING), LINK_HANDLE);
	cr_expect_eq(link_check(LINK_API, &h, LINK_ID_OPEN), LINK_BAD, "a second ACCEPT");
	h = hdr(NODE_MSG_REQ, 0, 100);
	cr_expect_eq(link_check(LINK_GATE, &h, LINK_ID_FREE), LINK_HANDLE);
	cr_expect_eq(link_check(LINK_GATE, &h, LINK_ID_OPEN), LINK_BAD, "a REQ reusing a live stream's id");
	h = hdr(NODE_MSG_IN, SPACED_FRAME_F_END, 100);
	cr_expect_eq(link_check(LINK_GATE, &h, LINK_ID_FREE), LINK_STALE, "input for a stream the gate ended");
	h = hdr(EXE_DONE, SPACED_FRAME_F_END, 100);
	cr_expect_eq(link_check(LINK_GATE, &h, LINK_ID_INFLIGHT), LINK_HANDLE);
	cr_expect_eq(link_check(LINK_GATE, &h, LINK_ID_FREE), LINK_BAD, "a completion for no job");
	h = hdr(EXE_JOB, 0, 100);
	cr_expect_eq(link_check(LINK_EXECUTOR, &h, LINK_ID_INFLIGHT), LINK_BAD, "a job id already in flight");
	cr_expect_eq(link_check(LINK_EXECUTOR, &h, 0), LINK_BAD);
}

Test(links, bounds_flags_and_ids)
{
	struct spaced_frame_hdr h = hdr(NODE_MSG_CREDIT, 0, 17);
	cr_expect_eq(link_check(LINK_GATE, &h, LINK_ID_OPEN), LINK_BAD, "CREDIT over its bound");
	h = hdr(NODE_MSG_CLOSE, 0, 1);
	cr_expect_eq(link_check(LINK_GATE, &h, LINK_ID_OPEN), LINK_BAD, "CLOSE carries nothing");
	h = hdr(NODE_MSG_REQ, SPACED_FRAME_F_END, 10);
	cr_expect_eq(link_check(LINK_GATE, &h, LINK_ID_FREE), LINK_BAD, "REQ takes no flags");
	h = hdr(NODE_MSG_REFUSE, 0, 10);
	cr_expect_eq(link_check(LINK_API, &h, LINK_ID_OPENING), LINK_BAD, "REFUSE must end the stream");
	h = hdr(NODE_MSG_OUT, 0x80, 10);
	cr_expect_eq(link_check(LINK_API, &h, LINK_ID_OPEN), LINK_BAD, "an unknown flag");
	h = hdr(EXE_DONE, 0, 10);
	cr_expect_eq(link_check(LINK_GATE, &h, LINK_ID_INFLIGHT), LINK_BAD, "EXE_DONE without END");
	h = hdr(NODE_MSG_OUT, 0, NODE_MSG_MAX + 1);
	cr_expect_eq(link_check(LINK_API, &h, LINK_ID_OPEN), LINK_BAD);
	h = hdr(NODE_MSG_OUT, 0, 10);
	h.id = 0;
	cr_expect_eq(link_check(LINK_API, &h, LINK_ID_OPEN), LINK_BAD, "id 0 is never a stream");
}
