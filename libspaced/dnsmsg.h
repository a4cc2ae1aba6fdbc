/*
 * dnsmsg.h — the few DNS messages (RFC 1035) the worker's resolver reads:
 * a client's query and an upstream's answer to it, read strictly, without
 * I/O. Everything here parses bytes a sandbox or the network sent: lengths
 * are checked before each read, compression pointers are followed at most 16
 * times, names are at most 255 bytes. Fuzzed by fuzz/fuzz_dns.c.
 */
#ifndef SPACED_DNSMSG_H
#define SPACED_DNSMSG_H

#include <stddef.h>
#include <stdint.h>

#define SPACED_DNS_NAME_MAX 256

/* Reads the name at off (following compression pointers) as dotted lower-case
 * text into out (outsz ≥ SPACED_DNS_NAME_MAX); *next is the offset after it in
 * its record. Labels hold letters, digits, '-' and '_' only (the text is
 * then the name, one to one: the policy's domains are matched on it).
 * Returns 0 or SPACED_EFORMAT. */
int spaced_dns_name(const uint8_t *m, size_t n, size_t off, char *out, size_t outsz, size_t *next);

/* A query: QR 0, opcode 0, exactly one question (no compression in its name),
 * no answer or authority records. *qend is the offset after the question.
 * Returns 0 or SPACED_EFORMAT. */
int spaced_dns_query(const uint8_t *m, size_t n, char name[SPACED_DNS_NAME_MAX], uint16_t *qtype, uint16_t *qclass,
                     size_t *qend);

/* An answer whose one question names name: its IN A records (at most max of
 * them, the others counted in *na but not stored). Returns 0 with *qend the
 * offset after the question, or SPACED_EFORMAT (malformed, another question). */
int spaced_dns_answer_a(const uint8_t *m, size_t n, const char *name, size_t *qend, uint32_t *addrs,
                        uint32_t *ttls, size_t max, size_t *na);

#endif
