/*
 * fuzz-dns — the worker resolver's readers of DNS messages (libspaced/dnsmsg.h):
 * queries from sandboxes and answers from upstream. Every input must be taken
 * or refused cleanly; a name read is NUL-terminated within its bound and an
 * accepted query's question ends inside the message.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dnsmsg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char name[SPACED_DNS_NAME_MAX];
	uint16_t qt, qc;
	size_t qend, na;
	uint32_t a[8], t[8];
	if (spaced_dns_query(data, size, name, &qt, &qc, &qend) == 0) {
		if (qend > size || strlen(name) >= SPACED_DNS_NAME_MAX)
			abort();
		if (spaced_dns_answer_a(data, size, name, &qend, a, t, 8, &na) == 0 && qend > size)
			abort();
	}
	if (spaced_dns_answer_a(data, size, "example.test", &qend, a, t, 8, &na) == 0 && qend > size)
		abort();
	return 0;
}
