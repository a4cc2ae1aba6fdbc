/*
 * resources.h — what an execution may use: CPU, memory, processes and disk.
 *
 * One shape everywhere: the control plane's create request and stored spec,
 * the install message to a worker, a worker's defaults and maxima, spacectl's
 * flags. Text forms: a size is bytes or a number with K, M, G or T (powers of
 * 1024: "512M"); CPUs are a number with up to three decimals ("0.5"); a
 * resource list is "cpus=1,memory=512M,pids=512,disk=2G". JSON form:
 * {"cpus": 1.5, "memory_bytes": N, "pids": N, "disk_bytes": N}.
 * A field of 0 means "not given" (take the default) wherever defaults apply.
 */
#ifndef SPACED_RESOURCES_H
#define SPACED_RESOURCES_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

struct spaced_resources {
	uint32_t cpu_milli;    /* thousandths of a CPU */
	uint64_t memory_bytes;
	uint64_t pids;
	uint64_t disk_bytes;
};

/* Bounds every accepted value must lie within. */
#define SPACED_RES_CPU_MILLI_MAX 1024000u          /* 1024 CPUs */
#define SPACED_RES_MEMORY_MIN (16ull << 20)
#define SPACED_RES_MEMORY_MAX (16ull << 40)
#define SPACED_RES_PIDS_MIN 8ull
#define SPACED_RES_PIDS_MAX 4194304ull
#define SPACED_RES_DISK_MIN (16ull << 20)
#define SPACED_RES_DISK_MAX (16ull << 40)

/* Parses a size ("4096", "64K", "512M", "2G", "1T"; suffix case-insensitive,
 * optional trailing "iB"/"B"). Returns 0 or SPACED_EINVAL (also on overflow). */
int spaced_size_parse(const char *s, uint64_t *out);

/* Parses a CPU count ("2", "0.5", "1.25") into thousandths (1 .. 1024000).
 * Returns 0 or SPACED_EINVAL. */
int spaced_cpus_parse(const char *s, uint32_t *milli);

/* Parses "cpus=1,memory=512M,pids=512,disk=2G" (any subset, any order);
 * fields named replace those in *r, the others stay. Each value must lie in
 * its bounds. Returns 0 or SPACED_EINVAL (*r untouched then); when err is
 * not NULL it receives a short reason. */
int spaced_resources_parse(const char *text, struct spaced_resources *r, char *err, size_t errsz);

/* {"cpus": …, "memory_bytes": …, "pids": …, "disk_bytes": …}, fields of 0 left out. */
json_t *spaced_resources_to_json(const struct spaced_resources *r);

/* Reads the JSON form (absent or null members are 0; unknown members, wrong
 * types and values outside the bounds are refused). Returns 0 or
 * SPACED_EINVAL with a reason in err. */
int spaced_resources_from_json(json_t *o, struct spaced_resources *r, char *err, size_t errsz);

/* Fills the fields of r that are 0 from def. */
void spaced_resources_default(struct spaced_resources *r, const struct spaced_resources *def);

/* The first field of r above the same field of max (max fields of 0 bound
 * nothing): "cpus", "memory", "pids", "disk"; NULL when none is. */
const char *spaced_resources_exceeds(const struct spaced_resources *r, const struct spaced_resources *max);

/* Formats a CPU count in thousandths as "1", "0.5", "1.25" into out (16 bytes). */
void spaced_cpus_format(uint32_t milli, char out[16]);

#endif
