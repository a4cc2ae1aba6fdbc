/* fuzz-ws-client: what a server sends spacectl, as spacectl reads it: the
 * WebSocket frames of a stream (spacectl/ws_client.c: fragments, pings,
 * close frames, limits) given whole and then in two pieces, and the head of
 * an HTTP answer (spacectl/http_client.c: length, status, fields). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "http_client.h"
#include "ws.h"
#include "ws_client.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Takes every message out of data fed in two pieces at cut. */
static void messages(const uint8_t *data, size_t size, size_t cut)
{
	struct ws_client *w;
	if (ws_client_adopt(-1, &w) < 0)
		return;
	struct ws_client_msg m;
	int k = 0;
	if (ws_client_feed(w, data, cut) == 0) {
		while ((k = ws_client_next(w, &m)) == 1)
			if (m.len > WS_CLIENT_MSG_MAX || (m.opcode == SPACED_WS_TEXT && !spaced_utf8_valid(m.data, m.len)) ||
			    strlen(m.close_reason) >= sizeof m.close_reason)
				__builtin_trap();
	}
	if (k >= 0 && ws_client_feed(w, data + cut, size - cut) == 0) {
		while ((k = ws_client_next(w, &m)) == 1)
			if (m.len > WS_CLIENT_MSG_MAX || (m.opcode == SPACED_WS_TEXT && !spaced_utf8_valid(m.data, m.len)))
				__builtin_trap();
	}
	ws_client_free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	messages(data, size, size);
	messages(data, size, size / 2);
	long hl = http_head_length(data, size);
	if (hl > (long)size)
		__builtin_trap();
	if (hl > 0) {
		char v[512];
		int st = http_head_status(data, (size_t)hl);
		if (st != -1 && (st < 100 || st > 599))
			__builtin_trap();
		int n = http_head_field(data, (size_t)hl, "X-Spaced-Identity", v, sizeof v);
		if (n >= 0 && ((size_t)n >= sizeof v || strlen(v) != (size_t)n))
			__builtin_trap();
	}
	return 0;
}
