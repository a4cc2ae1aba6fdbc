/* fuzz-client-answer: spacectl's parser of a worker's HTTP answer (status line,
 * X-Spaced-Identity, Content-Length / chunked body, DENY / REFRESH_ROUTE bodies). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "client.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct client_answer a;
	memset(&a, 0, sizeof a);
	if (client_parse_answer(data, size, &a) == 0) {
		/* what the callers rely on */
		if (a.body == NULL || a.body[a.body_len] != 0 || a.status < 100 || a.status > 599)
			__builtin_trap();
		if (strlen(a.identity) >= sizeof a.identity || strlen(a.reason) >= sizeof a.reason)
			__builtin_trap();
	}
	client_answer_clear(&a);
	return 0;
}
