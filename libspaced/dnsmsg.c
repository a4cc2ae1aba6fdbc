/* dnsmsg.c — strict reading of DNS queries and A answers (dnsmsg.h). */
#include "dnsmsg.h"

#include <stdbool.h>
#include <string.h>

#include "spaced_error.h"

static uint16_t rd16(const uint8_t *p)
{
	return (uint16_t)((p[0] << 8) | p[1]);
}

int spaced_dns_name(const uint8_t *m, size_t n, size_t off, char *out, size_t outsz, size_t *next)
{
	size_t o = off, w = 0, after = 0;
	int jumps = 0;
	bool jumped = false;
	if (outsz < 1)
		return SPACED_EFORMAT;
	for (;;) {
		if (o >= n)
			return SPACED_EFORMAT;
		uint8_t l = m[o];
		if ((l & 0xc0) == 0xc0) {
			if (o + 1 >= n || ++jumps > 16)
				return SPACED_EFORMAT;
			if (!jumped)
				after = o + 2;
			jumped = true;
			o = ((size_t)(l & 0x3f) << 8) | m[o + 1];
			continue;
		}
		if (l & 0xc0)
			return SPACED_EFORMAT;
		if (l == 0) {
			if (!jumped)
				after = o + 1;
			break;
		}
		if (o + 1 + l > n || w + l + 2 > outsz || w + l + 2 > SPACED_DNS_NAME_MAX)
			return SPACED_EFORMAT;
		if (w)
			out[w++] = '.';
		for (size_t i = 0; i < l; i++) {
			char c = (char)m[o + 1 + i];
			/* letters, digits, '-' and '_' only: a NUL would end the
			 * text inside a label and a '.' would split one, so that a
			 * name of another zone (x.allowed.test\0.evil.test,
			 * [x.allowed][test]) would read as under an allowed domain */
			if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
			      c == '_'))
				return SPACED_EFORMAT;
			out[w++] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
		}
		o += 1 + (size_t)l;
	}
	out[w] = '\0';
	*next = after;
	return 0;
}

int spaced_dns_query(const uint8_t *m, size_t n, char name[SPACED_DNS_NAME_MAX], uint16_t *qtype, uint16_t *qclass,
                     size_t *qend)
{
	size_t qn;
	if (n < 13 || (m[2] & 0x80) || (m[2] & 0x78) || rd16(m + 4) != 1 || rd16(m + 6) != 0 || rd16(m + 8) != 0)
		return SPACED_EFORMAT;
	if ((m[12] & 0xc0) || spaced_dns_name(m, n, 12, name, SPACED_DNS_NAME_MAX, &qn) < 0 || qn + 4 > n)
		return SPACED_EFORMAT;
	/* no pointer anywhere in the question's name */
	for (size_t o = 12; o < qn - 1;) {
		if (m[o] & 0xc0)
			return SPACED_EFORMAT;
		o += 1 + (size_t)m[o];
	}
	*qtype = rd16(m + qn);
	*qclass = rd16(m + qn + 2);
	*qend = qn + 4;
	return 0;
}

int spaced_dns_answer_a(const uint8_t *m, size_t n, const char *name, size_t *qend, uint32_t *addrs,
                        uint32_t *ttls, size_t max, size_t *na)
{
	char qn[SPACED_DNS_NAME_MAX], rn[SPACED_DNS_NAME_MAX];
	size_t o;
	if (n < 12 || !(m[2] & 0x80) || rd16(m + 4) != 1)
		return SPACED_EFORMAT;
	if (spaced_dns_name(m, n, 12, qn, sizeof qn, &o) < 0 || o + 4 > n || strcmp(qn, name) != 0)
		return SPACED_EFORMAT;
	*qend = o + 4;
	o += 4;
	size_t k = 0;
	unsigned an = rd16(m + 6);
	for (unsigned i = 0; i < an; i++) {
		if (spaced_dns_name(m, n, o, rn, sizeof rn, &o) < 0 || o + 10 > n)
			return SPACED_EFORMAT;
		uint16_t type = rd16(m + o), cls = rd16(m + o + 2), rdl = rd16(m + o + 8);
		uint32_t ttl = ((uint32_t)m[o + 4] << 24) | ((uint32_t)m[o + 5] << 16) | ((uint32_t)m[o + 6] << 8) | m[o + 7];
		o += 10;
		if (o + rdl > n)
			return SPACED_EFORMAT;
		if (type == 1 && cls == 1) {
			if (rdl != 4)
				return SPACED_EFORMAT;
			if (k < max) {
				addrs[k] = ((uint32_t)m[o] << 24) | ((uint32_t)m[o + 1] << 16) | ((uint32_t)m[o + 2] << 8) | m[o + 3];
				ttls[k] = ttl;
			}
			k++;
		}
		o += rdl;
	}
	*na = k;
	return 0;
}
