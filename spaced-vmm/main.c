/*
 * main.c — spaced-vsockd's command line (see vsockd.h and docs/vm-transport.md).
 *
 *   spaced-vsockd --socket VHOST_USER_PATH --uds HYBRID_PATH --cid N
 *                 [--timeout-ms MS] [--max-conns N] [--buf-alloc BYTES] [-v]
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spaced_error.h"
#include "vsockd.h"

static void usage(void)
{
	fprintf(stderr,
		"usage: spaced-vsockd --socket VHOST_USER_PATH --uds HYBRID_PATH --cid N\n"
		"                     [--timeout-ms MS] [--max-conns N] [--buf-alloc BYTES] [-v]\n");
}

/* Parses a decimal number in [min, max]. Returns 0 or SPACED_EINVAL. */
static int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!s || *s < '0' || *s > '9')
		return SPACED_EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v < min || v > max)
		return SPACED_EINVAL;
	*out = v;
	return 0;
}

int main(int argc, char **argv)
{
	struct vsockd_config cfg = {
		.timeout_ms = 5000,
		.max_conns = 1024,
		.buf_alloc = 256 * 1024,
		.confine = 1,
	};
	uint64_t v;
	int rc;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;

		if (strcmp(a, "-v") == 0) {
			cfg.verbose = 1;
			continue;
		}
		if (!val) {
			usage();
			return 2;
		}
		i++;
		if (strcmp(a, "--socket") == 0) {
			cfg.vu_path = val;
		} else if (strcmp(a, "--uds") == 0) {
			cfg.uds_path = val;
		} else if (strcmp(a, "--cid") == 0 && parse_u64(val, 3, UINT32_MAX - 1, &v) == 0) {
			cfg.guest_cid = v;
		} else if (strcmp(a, "--timeout-ms") == 0 && parse_u64(val, 1, 3600000, &v) == 0) {
			cfg.timeout_ms = (unsigned)v;
		} else if (strcmp(a, "--max-conns") == 0 && parse_u64(val, 1, 65536, &v) == 0) {
			cfg.max_conns = (unsigned)v;
		} else if (strcmp(a, "--buf-alloc") == 0 &&
			   parse_u64(val, 4096, 16u * 1024 * 1024, &v) == 0) {
			cfg.buf_alloc = (uint32_t)v;
		} else {
			fprintf(stderr, "spaced-vsockd: bad option or value: %s %s\n", a, val);
			usage();
			return 2;
		}
	}
	if (!cfg.vu_path || !cfg.uds_path || cfg.guest_cid == 0) {
		usage();
		return 2;
	}
	rc = vsockd_run(&cfg);
	if (rc < 0) {
		fprintf(stderr, "spaced-vsockd level=error event=exit code=%s\n", spaced_errname(rc));
		return 1;
	}
	return 0;
}
