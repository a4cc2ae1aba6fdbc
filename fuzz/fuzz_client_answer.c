/* fuzz-client-answer: spacectl's parser of a worker's HTTP answer (status line,
 * X-Spaced-Identity, Content-Length / chunked body, DENY / REFRESH_ROUTE bodies) and
 * the framing that ends an answer on a kept-alive connection. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct client_answer a;
	memset(&a, 0, sizeof a);
	/* the framing of a kept-alive connection's answer (NUL-terminated, as the reader keeps it) */
	unsigned char *z = malloc(size + 1);
	if (z == NULL)
		return 0;
	memcpy(z, data, size);
	z[size] = 0;
	int keep = 0;
	long whole = http_answer_length(z, size, &keep);
	if (whole > (long)size || (whole <= 0 && keep))
		__builtin_trap();
	free(z);
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
