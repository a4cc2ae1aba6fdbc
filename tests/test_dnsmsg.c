/*
 * test_dnsmsg.c — the resolver's reading of queries (dnsmsg.h): a name is
 * read as its dotted lower-case text; a label holding a NUL or a dot (whose
 * text would read as another name: x.allowed.test\0.evil.test, a label
 * "x.allowed" under "test") or any byte but letters, digits, '-' and '_' is
 * refused; compression in the question is refused.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "dnsmsg.h"
#include "spaced_error.h"

/* A query for the labels given (each a length and its bytes), type A, class IN. */
static size_t query(uint8_t *m, const char *const *labels, const size_t *lens, size_t n)
{
	static const uint8_t head[12] = {0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0};
	size_t w = 0;
	memcpy(m, head, sizeof head);
	w = sizeof head;
	for (size_t i = 0; i < n; i++) {
		m[w++] = (uint8_t)lens[i];
		memcpy(m + w, labels[i], lens[i]);
		w += lens[i];
	}
	m[w++] = 0;
	static const uint8_t tail[4] = {0, 1, 0, 1};
	memcpy(m + w, tail, sizeof tail);
	return w + sizeof tail;
}

static int read_query(const char *const *labels, const size_t *lens, size_t n, char name[SPACED_DNS_NAME_MAX])
{
	uint8_t m[512];
	uint16_t qt, qc;
	size_t qend;
	size_t len = query(m, labels, lens, n);
	return spaced_dns_query(m, len, name, &qt, &qc, &qend);
}

Test(dnsmsg, name_as_lower_case_text)
{
	const char *l[] = {"WWW", "Allowed-1", "_tcp", "test"};
	const size_t n[] = {3, 9, 4, 4};
	char name[SPACED_DNS_NAME_MAX];
	cr_assert_eq(read_query(l, n, 4, name), 0);
	cr_assert_str_eq(name, "www.allowed-1._tcp.test");
}

Test(dnsmsg, nul_in_a_label_refused)
{
	/* [x][allowed][test\0][evil][test]: the evil.test zone's, read as x.allowed.test */
	const char *l[] = {"x", "allowed", "test\0", "evil", "test"};
	const size_t n[] = {1, 7, 5, 4, 4};
	char name[SPACED_DNS_NAME_MAX];
	cr_assert_eq(read_query(l, n, 5, name), SPACED_EFORMAT);
}

Test(dnsmsg, dot_in_a_label_refused)
{
	const char *l1[] = {"x.allowed", "test"};
	const size_t n1[] = {9, 4};
	const char *l2[] = {"other", "allowed.test"};
	const size_t n2[] = {5, 12};
	char name[SPACED_DNS_NAME_MAX];
	cr_assert_eq(read_query(l1, n1, 2, name), SPACED_EFORMAT);
	cr_assert_eq(read_query(l2, n2, 2, name), SPACED_EFORMAT);
}

Test(dnsmsg, other_bytes_refused)
{
	static const char bad[] = {' ', '*', '/', '\\', '\x7f', '\x80', '\xff', '\n'};
	for (size_t i = 0; i < sizeof bad; i++) {
		char label[3] = {'a', bad[i], 'b'};
		const char *l[] = {label, "test"};
		const size_t n[] = {3, 4};
		char name[SPACED_DNS_NAME_MAX];
		cr_assert_eq(read_query(l, n, 2, name), SPACED_EFORMAT, "byte 0x%02x", (unsigned)(uint8_t)bad[i]);
	}
}

Test(dnsmsg, compression_in_the_question_refused)
{
	uint8_t m[64] = {0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0xc0, 0x0c, 0, 1, 0, 1};
	char name[SPACED_DNS_NAME_MAX];
	uint16_t qt, qc;
	size_t qend;
	cr_assert_eq(spaced_dns_query(m, 18, name, &qt, &qc, &qend), SPACED_EFORMAT);
}
