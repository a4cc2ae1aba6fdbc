/* identity.c — execution identity: validation, equality, canonical text and JSON. */
#include "identity.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "spaced_error.h"

bool spaced_cgroup_parent_valid(const char *name)
{
	return name != NULL && (strcmp(name, "spaced") == 0 ||
	                        (strncmp(name, "spaced.", 7) == 0 && spaced_name_valid(name + 7, strlen(name + 7))));
}

bool spaced_name_valid(const char *s, size_t n)
{
	if (s == NULL || n == 0 || n >= SPACED_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return false;
	}
	return true;
}

static bool opt_name_valid(const char *s)
{
	return s == NULL || s[0] == 0 || spaced_name_valid(s, strlen(s));
}

int spaced_identity_set(struct spaced_identity *out, const char *sandbox, uint64_t generation,
                        const char *worker, const char *substrate, const char *activation,
                        const char *pod_uid)
{
	if (sandbox == NULL || worker == NULL || substrate == NULL || activation == NULL)
		return SPACED_EINVAL;
	if (!spaced_name_valid(sandbox, strlen(sandbox)) || !spaced_name_valid(worker, strlen(worker)) ||
	    !spaced_name_valid(substrate, strlen(substrate)) ||
	    !spaced_name_valid(activation, strlen(activation)) || !opt_name_valid(pod_uid) ||
	    generation == 0 || generation > SPACED_GENERATION_MAX)
		return SPACED_EINVAL;
	struct spaced_identity id;
	memset(&id, 0, sizeof id);
	strcpy(id.sandbox, sandbox);
	id.generation = generation;
	strcpy(id.worker, worker);
	strcpy(id.substrate, substrate);
	strcpy(id.activation, activation);
	if (pod_uid != NULL)
		strcpy(id.pod_uid, pod_uid);
	*out = id;
	return SPACED_OK;
}

bool spaced_identity_equal(const struct spaced_identity *a, const struct spaced_identity *b)
{
	return a->generation == b->generation && strcmp(a->sandbox, b->sandbox) == 0 &&
	       strcmp(a->worker, b->worker) == 0 && strcmp(a->substrate, b->substrate) == 0 &&
	       strcmp(a->activation, b->activation) == 0 && strcmp(a->pod_uid, b->pod_uid) == 0;
}

bool spaced_identity_activation_change(const struct spaced_identity *cur, const struct spaced_identity *next)
{
	return cur->generation == next->generation && strcmp(cur->sandbox, next->sandbox) == 0 &&
	       strcmp(cur->worker, next->worker) == 0 && strcmp(cur->substrate, next->substrate) == 0 &&
	       strcmp(cur->activation, next->activation) != 0 && strcmp(cur->pod_uid, next->pod_uid) == 0;
}

int spaced_identity_encode(const struct spaced_identity *id, char *out, size_t outsz)
{
	int n = snprintf(out, outsz,
	                 "sandbox=%s;generation=%" PRIu64 ";worker=%s;substrate=%s;activation=%s;pod_uid=%s",
	                 id->sandbox, id->generation, id->worker, id->substrate, id->activation,
	                 id->pod_uid);
	if (n < 0 || (size_t)n >= outsz)
		return SPACED_ETOOBIG;
	return n;
}

/* Reads "key=value" up to the next ';' (or the end when last) from s[*pos]. */
static int take_field(const char *s, size_t n, size_t *pos, const char *key, bool last,
                      char *val, size_t valsz, bool may_be_empty)
{
	size_t kl = strlen(key);
	if (n - *pos < kl + 1 || memcmp(s + *pos, key, kl) != 0 || s[*pos + kl] != '=')
		return SPACED_EFORMAT;
	size_t start = *pos + kl + 1, end = start;
	while (end < n && s[end] != ';')
		end++;
	if (last ? end != n : end == n)
		return SPACED_EFORMAT;
	size_t vl = end - start;
	if (vl == 0 ? !may_be_empty : !spaced_name_valid(s + start, vl))
		return SPACED_EINVAL;
	if (vl >= valsz)
		return SPACED_EINVAL;
	memcpy(val, s + start, vl);
	val[vl] = 0;
	*pos = last ? end : end + 1;
	return SPACED_OK;
}

static int parse_generation(const char *s, size_t n, uint64_t *out)
{
	uint64_t v = 0;
	if (n == 0 || n > 16 || (s[0] == '0'))
		return SPACED_EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return SPACED_EINVAL;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	if (v == 0 || v > SPACED_GENERATION_MAX)
		return SPACED_EINVAL;
	*out = v;
	return SPACED_OK;
}

int spaced_identity_decode(struct spaced_identity *out, const char *s, size_t n)
{
	struct spaced_identity id;
	char gen[SPACED_NAME_MAX];
	size_t pos = 0;
	int r;
	memset(&id, 0, sizeof id);
	if ((r = take_field(s, n, &pos, "sandbox", false, id.sandbox, sizeof id.sandbox, false)) < 0 ||
	    (r = take_field(s, n, &pos, "generation", false, gen, sizeof gen, false)) < 0 ||
	    (r = parse_generation(gen, strlen(gen), &id.generation)) < 0 ||
	    (r = take_field(s, n, &pos, "worker", false, id.worker, sizeof id.worker, false)) < 0 ||
	    (r = take_field(s, n, &pos, "substrate", false, id.substrate, sizeof id.substrate, false)) < 0 ||
	    (r = take_field(s, n, &pos, "activation", false, id.activation, sizeof id.activation, false)) < 0 ||
	    (r = take_field(s, n, &pos, "pod_uid", true, id.pod_uid, sizeof id.pod_uid, true)) < 0)
		return r;
	*out = id;
	return SPACED_OK;
}

json_t *spaced_identity_to_json(const struct spaced_identity *id)
{
	return json_pack("{s:s, s:I, s:s, s:s, s:s, s:s?}", "sandbox", id->sandbox, "generation",
	                 (json_int_t)id->generation, "worker", id->worker, "substrate", id->substrate,
	                 "activation", id->activation, "pod_uid",
	                 id->pod_uid[0] ? id->pod_uid : NULL);
}

static const char *member_string(json_t *obj, const char *key)
{
	return json_string_value(json_object_get(obj, key));
}

int spaced_identity_from_json(struct spaced_identity *out, json_t *obj)
{
	if (!json_is_object(obj))
		return SPACED_EJSON;
	json_t *gen = json_object_get(obj, "generation");
	json_t *pod = json_object_get(obj, "pod_uid");
	size_t expected = 5 + (pod != NULL);
	if (json_object_size(obj) != expected || !json_is_integer(gen) ||
	    (pod != NULL && !json_is_null(pod) && !json_is_string(pod)))
		return SPACED_EJSON;
	const char *sandbox = member_string(obj, "sandbox"), *worker = member_string(obj, "worker");
	const char *substrate = member_string(obj, "substrate");
	const char *activation = member_string(obj, "activation");
	if (sandbox == NULL || worker == NULL || substrate == NULL || activation == NULL)
		return SPACED_EJSON;
	if (json_integer_value(gen) <= 0)
		return SPACED_EINVAL;
	return spaced_identity_set(out, sandbox, (uint64_t)json_integer_value(gen), worker, substrate,
	                           activation, json_string_value(pod));
}
