/* resources.c — sizes, CPU counts and resource lists (resources.h). */
#include "resources.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "spaced_error.h"

static int fail(char *err, size_t errsz, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errsz, const char *fmt, ...)
{
	va_list ap;
	if (err != NULL && errsz > 0) {
		va_start(ap, fmt);
		vsnprintf(err, errsz, fmt, ap);
		va_end(ap);
	}
	return SPACED_EINVAL;
}

int spaced_size_parse(const char *s, uint64_t *out)
{
	uint64_t v = 0, mul = 1;
	const char *p = s;

	if (s == NULL || *p < '0' || *p > '9')
		return SPACED_EINVAL;
	for (; *p >= '0' && *p <= '9'; p++) {
		if (v > (UINT64_MAX - 9) / 10)
			return SPACED_EINVAL;
		v = v * 10 + (uint64_t)(*p - '0');
	}
	switch (*p) {
	case 'k': case 'K': mul = 1ull << 10; p++; break;
	case 'm': case 'M': mul = 1ull << 20; p++; break;
	case 'g': case 'G': mul = 1ull << 30; p++; break;
	case 't': case 'T': mul = 1ull << 40; p++; break;
	default: break;
	}
	if (mul > 1 && (strcasecmp(p, "ib") == 0 || strcasecmp(p, "b") == 0))
		p += strlen(p);
	if (*p != '\0' || (v != 0 && mul > UINT64_MAX / v))
		return SPACED_EINVAL;
	*out = v * mul;
	return 0;
}

int spaced_cpus_parse(const char *s, uint32_t *milli)
{
	uint64_t whole = 0, frac = 0;
	int digits = 0;
	const char *p = s;

	if (s == NULL || *p < '0' || *p > '9')
		return SPACED_EINVAL;
	for (; *p >= '0' && *p <= '9'; p++)
		if ((whole = whole * 10 + (uint64_t)(*p - '0')) > SPACED_RES_CPU_MILLI_MAX / 1000)
			return SPACED_EINVAL;
	if (*p == '.') {
		for (p++; *p >= '0' && *p <= '9'; p++, digits++) {
			if (digits >= 3)
				return SPACED_EINVAL;
			frac = frac * 10 + (uint64_t)(*p - '0');
		}
		if (digits == 0)
			return SPACED_EINVAL;
		for (; digits < 3; digits++)
			frac *= 10;
	}
	uint64_t m = whole * 1000 + frac;
	if (*p != '\0' || m == 0 || m > SPACED_RES_CPU_MILLI_MAX)
		return SPACED_EINVAL;
	*milli = (uint32_t)m;
	return 0;
}

void spaced_cpus_format(uint32_t milli, char out[16])
{
	if (milli % 1000 == 0)
		snprintf(out, 16, "%u", milli / 1000);
	else if (milli % 100 == 0)
		snprintf(out, 16, "%u.%u", milli / 1000, (milli % 1000) / 100);
	else if (milli % 10 == 0)
		snprintf(out, 16, "%u.%02u", milli / 1000, (milli % 1000) / 10);
	else
		snprintf(out, 16, "%u.%03u", milli / 1000, milli % 1000);
}

static int check_bounds(const struct spaced_resources *r, char *err, size_t errsz)
{
	if (r->cpu_milli > SPACED_RES_CPU_MILLI_MAX)
		return fail(err, errsz, "cpus must lie in 0.001..1024");
	if (r->memory_bytes && (r->memory_bytes < SPACED_RES_MEMORY_MIN || r->memory_bytes > SPACED_RES_MEMORY_MAX))
		return fail(err, errsz, "memory must lie in 16M..16T");
	if (r->pids && (r->pids < SPACED_RES_PIDS_MIN || r->pids > SPACED_RES_PIDS_MAX))
		return fail(err, errsz, "pids must lie in 8..4194304");
	if (r->disk_bytes && (r->disk_bytes < SPACED_RES_DISK_MIN || r->disk_bytes > SPACED_RES_DISK_MAX))
		return fail(err, errsz, "disk must lie in 16M..16T");
	return 0;
}

int spaced_resources_parse(const char *text, struct spaced_resources *r, char *err, size_t errsz)
{
	struct spaced_resources t = *r;
	char buf[512];

	if (text == NULL || strlen(text) >= sizeof buf)
		return fail(err, errsz, "resource list missing or too long");
	snprintf(buf, sizeof buf, "%s", text);
	for (char *save = NULL, *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(item, '=');
		int e;

		if (eq == NULL)
			return fail(err, errsz, "'%.40s' is not NAME=VALUE", item);
		*eq = '\0';
		const char *v = eq + 1;
		if (strcmp(item, "cpus") == 0)
			e = spaced_cpus_parse(v, &t.cpu_milli);
		else if (strcmp(item, "memory") == 0)
			e = spaced_size_parse(v, &t.memory_bytes);
		else if (strcmp(item, "pids") == 0)
			e = spaced_size_parse(v, &t.pids);
		else if (strcmp(item, "disk") == 0)
			e = spaced_size_parse(v, &t.disk_bytes);
		else
			return fail(err, errsz, "unknown resource '%.40s' (cpus, memory, pids, disk)", item);
		if (e < 0)
			return fail(err, errsz, "%s: '%.40s' is not a valid value", item, v);
	}
	if (check_bounds(&t, err, errsz) < 0)
		return SPACED_EINVAL;
	*r = t;
	return 0;
}

json_t *spaced_resources_to_json(const struct spaced_resources *r)
{
	json_t *o = json_object();
	if (o == NULL)
		return NULL;
	if (r->cpu_milli) {
		/* a whole number of CPUs as an integer, else a real with three decimals at most */
		if (r->cpu_milli % 1000 == 0)
			json_object_set_new(o, "cpus", json_integer(r->cpu_milli / 1000));
		else
			json_object_set_new(o, "cpus", json_real((double)r->cpu_milli / 1000.0));
	}
	if (r->memory_bytes)
		json_object_set_new(o, "memory_bytes", json_integer((json_int_t)r->memory_bytes));
	if (r->pids)
		json_object_set_new(o, "pids", json_integer((json_int_t)r->pids));
	if (r->disk_bytes)
		json_object_set_new(o, "disk_bytes", json_integer((json_int_t)r->disk_bytes));
	return o;
}

static int get_u64(json_t *o, const char *k, uint64_t *out, char *err, size_t errsz)
{
	json_t *v = json_object_get(o, k);
	if (v == NULL || json_is_null(v))
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return fail(err, errsz, "'%s' must be a non-negative integer", k);
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

int spaced_resources_from_json(json_t *o, struct spaced_resources *r, char *err, size_t errsz)
{
	struct spaced_resources t = {0, 0, 0, 0};
	const char *k;
	json_t *v;

	if (o == NULL || json_is_null(o)) {
		*r = t;
		return 0;
	}
	if (!json_is_object(o))
		return fail(err, errsz, "resources must be an object");
	json_object_foreach(o, k, v) {
		if (strcmp(k, "cpus") && strcmp(k, "memory_bytes") && strcmp(k, "pids") && strcmp(k, "disk_bytes"))
			return fail(err, errsz, "unknown resource '%.40s'", k);
	}
	v = json_object_get(o, "cpus");
	if (v != NULL && !json_is_null(v)) {
		double c = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : -1;
		if (!(c > 0) || c > SPACED_RES_CPU_MILLI_MAX / 1000.0)
			return fail(err, errsz, "'cpus' must be a number in 0.001..1024");
		double m = round(c * 1000.0);
		if (m < 1 || fabs(m - c * 1000.0) > 1e-6 * (m > 1 ? m : 1))
			return fail(err, errsz, "'cpus' takes at most three decimals");
		t.cpu_milli = (uint32_t)m;
	}
	if (get_u64(o, "memory_bytes", &t.memory_bytes, err, errsz) < 0 || get_u64(o, "pids", &t.pids, err, errsz) < 0 ||
	    get_u64(o, "disk_bytes", &t.disk_bytes, err, errsz) < 0 || check_bounds(&t, err, errsz) < 0)
		return SPACED_EINVAL;
	*r = t;
	return 0;
}

void spaced_resources_default(struct spaced_resources *r, const struct spaced_resources *def)
{
	if (r->cpu_milli == 0)
		r->cpu_milli = def->cpu_milli;
	if (r->memory_bytes == 0)
		r->memory_bytes = def->memory_bytes;
	if (r->pids == 0)
		r->pids = def->pids;
	if (r->disk_bytes == 0)
		r->disk_bytes = def->disk_bytes;
}

const char *spaced_resources_exceeds(const struct spaced_resources *r, const struct spaced_resources *max)
{
	if (max->cpu_milli && r->cpu_milli > max->cpu_milli)
		return "cpus";
	if (max->memory_bytes && r->memory_bytes > max->memory_bytes)
		return "memory";
	if (max->pids && r->pids > max->pids)
		return "pids";
	if (max->disk_bytes && r->disk_bytes > max->disk_bytes)
		return "disk";
	return NULL;
}
