/* reqparse.c — strict JSON parsers for API bodies and control-channel messages. */
#include "reqparse.h"
#include "netpolicy.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cap.h"
#include "spaced_error.h"
#include "guest_proto.h"

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

/* Parses an object body; an empty body counts as {}. */
static json_t *load_object(const char *body, size_t len, char *err, size_t errsz)
{
	json_error_t jerr;
	if (len > CP_BODY_MAX) {
		fail(err, errsz, "body larger than %d bytes", CP_BODY_MAX);
		return NULL;
	}
	size_t i = 0;
	while (i < len && (body[i] == ' ' || body[i] == '\n' || body[i] == '\r' || body[i] == '\t'))
		i++;
	if (i == len)
		return json_object();
	json_t *v = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
	if (v == NULL) {
		fail(err, errsz, "malformed JSON: %s", jerr.text);
		return NULL;
	}
	if (!json_is_object(v)) {
		json_decref(v);
		fail(err, errsz, "body must be a JSON object");
		return NULL;
	}
	return v;
}

static int only_members(json_t *obj, const char *const *allowed, char *err, size_t errsz)
{
	const char *k;
	json_t *v;
	json_object_foreach(obj, k, v) {
		int ok = 0;
		for (size_t i = 0; allowed[i] != NULL; i++)
			if (strcmp(k, allowed[i]) == 0)
				ok = 1;
		if (!ok)
			return fail(err, errsz, "unknown member '%.40s'", k);
	}
	return 0;
}

static int get_name(json_t *obj, const char *m, char out[SPACED_NAME_MAX], int nullable, char *err,
                    size_t errsz)
{
	json_t *v = json_object_get(obj, m);
	if (v == NULL || (nullable && json_is_null(v)))
		return 0;
	if (!json_is_string(v) || !spaced_name_valid(json_string_value(v), json_string_length(v)))
		return fail(err, errsz, "'%s' must be a name of 1-63 characters [A-Za-z0-9._-]", m);
	memcpy(out, json_string_value(v), json_string_length(v) + 1);
	return 0;
}

static int get_int(json_t *obj, const char *m, int64_t lo, int64_t hi, int64_t *out, char *err,
                   size_t errsz)
{
	json_t *v = json_object_get(obj, m);
	if (v == NULL)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
		return fail(err, errsz, "'%s' must be an integer in %lld..%lld", m, (long long)lo, (long long)hi);
	*out = json_integer_value(v);
	return 0;
}

static bool env_name_ok(const char *k, size_t n)
{
	if (n == 0 || n > 128 || !((k[0] >= 'A' && k[0] <= 'Z') || (k[0] >= 'a' && k[0] <= 'z') || k[0] == '_'))
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((k[i] >= 'A' && k[i] <= 'Z') || (k[i] >= 'a' && k[i] <= 'z') || (k[i] >= '0' && k[i] <= '9') ||
		      k[i] == '_'))
			return false;
	return true;
}

static bool meta_key_ok(const char *k, size_t n)
{
	return n > 0 && n < 64 && spaced_name_valid(k, n);
}

/* A JSON object of strings under the rules of env or metadata, written back
 * compact with sorted keys into out (outsz); "" when absent or null. */
static int get_string_map(json_t *obj, const char *m, bool env, char *out, size_t outsz, char *err, size_t errsz)
{
	json_t *v = json_object_get(obj, m), *x;
	const char *k;
	out[0] = 0;
	if (v == NULL || json_is_null(v))
		return 0;
	if (!json_is_object(v) || json_object_size(v) > (env ? CP_ENV_MAX : CP_META_MAX))
		return fail(err, errsz, "'%s' must be an object of at most %d strings", m, env ? CP_ENV_MAX : CP_META_MAX);
	json_object_foreach(v, k, x) {
		size_t kl = strlen(k), vl;
		if (env ? !env_name_ok(k, kl) : !meta_key_ok(k, kl))
			return fail(err, errsz, "'%s': '%.40s' is not a valid %s", m, k,
			            env ? "variable name" : "key ([A-Za-z0-9._-], up to 63 bytes)");
		if (!json_is_string(x) || (vl = json_string_length(x)) > (env ? 4096u : 256u) ||
		    memchr(json_string_value(x), 0, vl) != NULL)
			return fail(err, errsz, "'%s': the value of '%.40s' must be a string of at most %u bytes without NUL",
			            m, k, env ? 4096u : 256u);
	}
	char *t = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
	if (!t || strlen(t) >= outsz) {
		free(t);
		return fail(err, errsz, "'%s' is too large", m);
	}
	memcpy(out, t, strlen(t) + 1);
	free(t);
	return 0;
}

int cp_parse_meta_pair(const char *s, size_t len, char key[64], char val[257])
{
	const char *eq = memchr(s, '=', len);
	if (!eq || memchr(s, 0, len))
		return SPACED_EINVAL;
	size_t kl = (size_t)(eq - s), vl = len - kl - 1;
	if (!meta_key_ok(s, kl) || vl > 256)
		return SPACED_EINVAL;
	memcpy(key, s, kl);
	key[kl] = 0;
	memcpy(val, eq + 1, vl);
	val[vl] = 0;
	return 0;
}

int cp_parse_timeout(const char *body, size_t len, int64_t *seconds, char *err, size_t errsz)
{
	static const char *const allowed[] = {"seconds", NULL};
	int64_t v = -1;
	json_t *o = load_object(body, len, err, errsz);
	int r = SPACED_EINVAL;
	if (o && only_members(o, allowed, err, errsz) == 0 && get_int(o, "seconds", 0, 365 * 86400, &v, err, errsz) == 0) {
		if (v < 0)
			fail(err, errsz, "'seconds' is required");
		else {
			*seconds = v;
			r = 0;
		}
	}
	json_decref(o);
	return r;
}

/* The canonical JSON of a policy object into out (CP_NETWORK_MAX bytes). */
static int network_canon(json_t *j, char *out, char *err, size_t errsz)
{
	struct spaced_netpolicy *p = malloc(sizeof *p);
	int r = SPACED_EINVAL;
	if (p == NULL)
		return fail(err, errsz, "out of memory");
	if (spaced_netpolicy_from_json(j, p, err, errsz) == 0) {
		json_t *c = spaced_netpolicy_to_json(p);
		char *text = c ? json_dumps(c, JSON_COMPACT) : NULL;
		if (text && strlen(text) < CP_NETWORK_MAX) {
			memcpy(out, text, strlen(text) + 1);
			r = 0;
		} else {
			fail(err, errsz, "the network policy is too large");
		}
		free(text);
		json_decref(c);
	}
	free(p);
	return r;
}

int cp_parse_network(const char *body, size_t len, char *out, char *err, size_t errsz)
{
	json_t *o = load_object(body, len, err, errsz);
	if (o == NULL)
		return SPACED_EINVAL;
	int r = network_canon(o, out, err, errsz);
	json_decref(o);
	return r;
}

int cp_parse_create(const char *body, size_t len, struct cp_create_req *out, char *err, size_t errsz)
{
	static const char *const allowed[] = {"template", "template_hash", "cpus", "memory_bytes", "pids",
	                                      "disk_bytes", "substrate", "worker", "idle_timeout", "max_lifetime",
	                                      "env", "metadata", "auto_resume", "restart", "network", NULL};
	static const char *const res_members[] = {"cpus", "memory_bytes", "pids", "disk_bytes"};
	struct cp_create_req c = {.substrate = "process", .idle_timeout = -1, .max_lifetime = -1};
	int r = SPACED_EINVAL;
	json_t *o = load_object(body, len, err, errsz), *res = json_object();
	if (o == NULL || res == NULL)
		goto out;
	if (only_members(o, allowed, err, errsz) < 0 ||
	    get_name(o, "template", c.template_name, 1, err, errsz) < 0 ||
	    get_name(o, "substrate", c.substrate, 0, err, errsz) < 0 ||
	    get_name(o, "worker", c.worker, 1, err, errsz) < 0 ||
	    get_int(o, "idle_timeout", 0, 30 * 86400, &c.idle_timeout, err, errsz) < 0 ||
	    get_int(o, "max_lifetime", 0, 365 * 86400, &c.max_lifetime, err, errsz) < 0 ||
	    get_string_map(o, "env", true, c.env_json, sizeof c.env_json, err, errsz) < 0 ||
	    get_string_map(o, "metadata", false, c.meta_json, sizeof c.meta_json, err, errsz) < 0)
		goto out;
	json_t *th = json_object_get(o, "template_hash"), *ar = json_object_get(o, "auto_resume");
	if (th && !json_is_null(th)) {
		const char *h = json_string_value(th);
		size_t i = 0;
		for (; h && h[i] && i < 64 && ((h[i] >= '0' && h[i] <= '9') || (h[i] >= 'a' && h[i] <= 'f')); i++)
			;
		if (!h || i != 64 || h[64] != 0) {
			fail(err, errsz, "'template_hash' must be 64 lowercase hex digits");
			goto out;
		}
		if (c.template_name[0]) {
			fail(err, errsz, "'template' and 'template_hash' exclude each other");
			goto out;
		}
		memcpy(c.template_hash, h, 65);
	}
	if (ar && !json_is_boolean(ar)) {
		fail(err, errsz, "'auto_resume' must be a boolean");
		goto out;
	}
	c.auto_resume = ar && json_is_true(ar);
	json_t *rp = json_object_get(o, "restart");
	if (rp && (!json_is_string(rp) || (strcmp(json_string_value(rp), "never") != 0 &&
	                                   strcmp(json_string_value(rp), "on-failure") != 0))) {
		fail(err, errsz, "'restart' must be \"never\" or \"on-failure\"");
		goto out;
	}
	c.restart_on_failure = rp && strcmp(json_string_value(rp), "on-failure") == 0;
	/* the limits travel flat in the body, as one resources object everywhere else */
	for (size_t i = 0; i < sizeof res_members / sizeof res_members[0]; i++) {
		json_t *v = json_object_get(o, res_members[i]);
		if (v != NULL)
			json_object_set(res, res_members[i], v);
	}
	if (spaced_resources_from_json(res, &c.res, err, errsz) < 0)
		goto out;
	c.has_substrate = json_object_get(o, "substrate") != NULL;
	if (json_object_get(o, "network") != NULL && network_canon(json_object_get(o, "network"), c.network, err, errsz) < 0)
		goto out;
	*out = c;
	r = 0;
out:
	json_decref(o);
	json_decref(res);
	return r;
}

int cp_parse_limits(json_t *o, struct cp_worker_limits *out, char *err, size_t errsz)
{
	static const char *const allowed[] = {"default", "max", "allocatable", NULL};
	static const char *const alloc_allowed[] = {"memory_bytes", "pids", "memory_overcommit", NULL};
	struct cp_worker_limits l = {0};
	json_t *a = json_object_get(o, "allocatable");
	if (!json_is_object(o))
		return fail(err, errsz, "'limits' must be an object");
	if (only_members(o, allowed, err, errsz) < 0 ||
	    spaced_resources_from_json(json_object_get(o, "default"), &l.def, err, errsz) < 0 ||
	    spaced_resources_from_json(json_object_get(o, "max"), &l.max, err, errsz) < 0)
		return SPACED_EINVAL;
	if (a != NULL) {
		json_t *am = json_object_get(a, "memory_bytes"), *ap = json_object_get(a, "pids"),
		       *ao = json_object_get(a, "memory_overcommit");
		if (!json_is_object(a) || only_members(a, alloc_allowed, err, errsz) < 0 ||
		    (am && (!json_is_integer(am) || json_integer_value(am) < 0)) ||
		    (ap && (!json_is_integer(ap) || json_integer_value(ap) < 0)) ||
		    (ao && (!json_is_number(ao) || json_number_value(ao) < 1.0 || json_number_value(ao) > 64.0)))
			return fail(err, errsz, "'limits.allocatable' wants memory_bytes, pids and memory_overcommit (1 to 64)");
		l.alloc_memory = am ? (uint64_t)json_integer_value(am) : 0;
		l.alloc_pids = ap ? (uint64_t)json_integer_value(ap) : 0;
		l.memory_overcommit = ao ? json_number_value(ao) : 1.0;
	}
	if (spaced_resources_exceeds(&l.def, &l.max) != NULL)
		return fail(err, errsz, "a default of 'limits' is above its maximum");
	l.has = 1;
	*out = l;
	return 0;
}

json_t *cp_limits_json(const struct cp_worker_limits *l)
{
	json_t *o = json_pack("{s:o,s:o}", "default", spaced_resources_to_json(&l->def), "max",
	                      spaced_resources_to_json(&l->max));
	if (o && (l->alloc_memory || l->alloc_pids))
		json_object_set_new(o, "allocatable",
		                    json_pack("{s:I,s:I,s:f}", "memory_bytes", (json_int_t)l->alloc_memory, "pids",
		                              (json_int_t)l->alloc_pids, "memory_overcommit", l->memory_overcommit));
	return o;
}

char *cp_limits_text(const struct cp_worker_limits *l)
{
	json_t *o = cp_limits_json(l);
	char *s = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	json_decref(o);
	return s;
}

void cp_limits_from_text(const char *text, struct cp_worker_limits *out)
{
	json_error_t jerr;
	json_t *o = text ? json_loads(text, JSON_REJECT_DUPLICATES, &jerr) : NULL;
	memset(out, 0, sizeof *out);
	if (o == NULL || cp_parse_limits(o, out, NULL, 0) < 0)
		memset(out, 0, sizeof *out);
	json_decref(o);
}

int cp_parse_route(const char *body, size_t len, struct cp_route_req *out, char *err, size_t errsz)
{
	static const char *const allowed[] = {"purposes", "port", "protocol", NULL};
	static const char *const protocols[] = {"tcp", "udp", "http", "https", "ws", "grpc", NULL};
	struct cp_route_req rt = {0};
	int r = SPACED_EINVAL;
	int64_t port = 0;
	json_t *o = load_object(body, len, err, errsz), *p, *v;
	size_t i;
	if (o == NULL)
		return SPACED_EINVAL;
	if (only_members(o, allowed, err, errsz) < 0)
		goto out;
	p = json_object_get(o, "purposes");
	if (p == NULL) {
		rt.purposes = SPACED_PURPOSE_FS_READ | SPACED_PURPOSE_FS_WRITE | SPACED_PURPOSE_EXEC |
		              SPACED_PURPOSE_TERM | SPACED_PURPOSE_WATCH | SPACED_PURPOSE_LIFECYCLE;
	} else {
		if (!json_is_array(p) || json_array_size(p) == 0 || json_array_size(p) > 16) {
			fail(err, errsz, "'purposes' must be a non-empty array of purpose names");
			goto out;
		}
		json_array_foreach(p, i, v) {
			uint32_t bit = json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v)
			                   ? spaced_purpose_parse(json_string_value(v))
			                   : 0;
			if (bit == 0) {
				fail(err, errsz, "unknown purpose in 'purposes'");
				goto out;
			}
			rt.purposes |= bit;
		}
	}
	rt.serviceport = (rt.purposes & SPACED_PURPOSE_SERVICEPORT) != 0;
	if (rt.serviceport && rt.purposes != SPACED_PURPOSE_SERVICEPORT) {
		fail(err, errsz, "'serviceport' cannot be combined with other purposes");
		goto out;
	}
	v = json_object_get(o, "protocol");
	if (!rt.serviceport && (json_object_get(o, "port") != NULL || v != NULL)) {
		fail(err, errsz, "'port' and 'protocol' need the serviceport purpose");
		goto out;
	}
	if (rt.serviceport) {
		if (json_object_get(o, "port") == NULL) {
			fail(err, errsz, "a serviceport route needs 'port'");
			goto out;
		}
		if (get_int(o, "port", 1, 65535, &port, err, errsz) < 0)
			goto out;
		if (port == SPACED_GUEST_API_PORT) {
			/* the guest's own API: no gateway forwards to it, so no capability is issued */
			fail(err, errsz, "port %d is the sandbox agent's own: it cannot be exposed", SPACED_GUEST_API_PORT);
			goto out;
		}
		rt.port = (uint16_t)port;
		strcpy(rt.protocol, "tcp");
		if (v != NULL) {
			int known = 0;
			for (i = 0; json_is_string(v) && protocols[i] != NULL; i++)
				if (strcmp(json_string_value(v), protocols[i]) == 0 &&
				    json_string_length(v) == strlen(protocols[i]))
					known = 1;
			if (!known) {
				fail(err, errsz, "'protocol' must be one of tcp udp http https ws grpc");
				goto out;
			}
			strcpy(rt.protocol, json_string_value(v));
		}
	}
	*out = rt;
	r = 0;
out:
	json_decref(o);
	return r;
}

static int get_substrates(json_t *o, char *out, size_t outsz, char *err, size_t errsz)
{
	json_t *a = json_object_get(o, "substrates"), *v;
	size_t i, n = 0;
	if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > CP_SUBSTRATES_MAX)
		return fail(err, errsz, "'substrates' must be an array of 1-%d names", CP_SUBSTRATES_MAX);
	out[0] = 0;
	json_array_foreach(a, i, v) {
		if (!json_is_string(v) || !spaced_name_valid(json_string_value(v), json_string_length(v)))
			return fail(err, errsz, "'substrates' must hold names");
		size_t l = json_string_length(v);
		if (n + l + 2 > outsz)
			return fail(err, errsz, "'substrates' too long");
		if (n > 0)
			out[n++] = ',';
		memcpy(out + n, json_string_value(v), l + 1);
		n += l;
	}
	return 0;
}

int cp_parse_worker(const char *body, size_t len, struct cp_worker_reg *out, char *err, size_t errsz)
{
	static const char *const allowed[] = {"id", "url", "capacity", "substrates", "limits", NULL};
	struct cp_worker_reg w = {.capacity = 16};
	int r = SPACED_EINVAL;
	json_t *o = load_object(body, len, err, errsz), *u;
	if (o == NULL)
		return SPACED_EINVAL;
	if (only_members(o, allowed, err, errsz) < 0 || get_name(o, "id", w.id, 0, err, errsz) < 0 ||
	    get_int(o, "capacity", 1, 100000, &w.capacity, err, errsz) < 0 ||
	    get_substrates(o, w.substrates, sizeof w.substrates, err, errsz) < 0 ||
	    (json_object_get(o, "limits") != NULL &&
	     cp_parse_limits(json_object_get(o, "limits"), &w.limits, err, errsz) < 0))
		goto out;
	if (w.id[0] == 0) {
		fail(err, errsz, "'id' is required");
		goto out;
	}
	u = json_object_get(o, "url");
	if (!json_is_string(u) || json_string_length(u) == 0 || json_string_length(u) >= CP_URL_MAX ||
	    strlen(json_string_value(u)) != json_string_length(u) ||
	    (strncmp(json_string_value(u), "http://", 7) != 0 && strncmp(json_string_value(u), "https://", 8) != 0)) {
		fail(err, errsz, "'url' must be an http:// or https:// URL shorter than %d bytes", CP_URL_MAX);
		goto out;
	}
	for (const char *s = json_string_value(u); *s; s++)
		if ((unsigned char)*s <= ' ' || *s == '"' || *s == '\\' || (unsigned char)*s >= 0x7f) {
			fail(err, errsz, "'url' has a forbidden character");
			goto out;
		}
	memcpy(w.url, json_string_value(u), json_string_length(u) + 1);
	*out = w;
	r = 0;
out:
	json_decref(o);
	return r;
}

int cp_parse_target(const char *body, size_t len, const char *member, char out[SPACED_NAME_MAX],
                    char *err, size_t errsz)
{
	const char *const allowed[] = {member, NULL};
	char w[SPACED_NAME_MAX] = "";
	int r = SPACED_EINVAL;
	json_t *o = load_object(body, len, err, errsz);
	if (o == NULL)
		return SPACED_EINVAL;
	if (only_members(o, allowed, err, errsz) < 0 || get_name(o, member, w, 1, err, errsz) < 0)
		goto out;
	memcpy(out, w, sizeof w);
	r = 0;
out:
	json_decref(o);
	return r;
}

/* A hello's "tentative": [{"seq","sandbox","activation"}, …], at most
 * CP_TENTATIVE_MAX, seqs strictly increasing. 0, or SPACED_EPROTO (m->tentative
 * then freed). */
static int parse_tentative(json_t *v, struct cp_chan_msg *m)
{
	static const char *const tm[] = {"seq", "sandbox", "activation", NULL};
	char err[8];
	size_t n = json_is_array(v) ? json_array_size(v) : 0;
	if (!json_is_array(v) || n > CP_TENTATIVE_MAX)
		return SPACED_EPROTO;
	if (n == 0)
		return 0;
	if ((m->tentative = calloc(n, sizeof *m->tentative)) == NULL)
		return SPACED_EPROTO;
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(v, i), *s = json_object_get(e, "seq");
		struct cp_tentative *t = &m->tentative[i];
		if (!json_is_object(e) || only_members(e, tm, err, sizeof err) < 0 || !json_is_integer(s) ||
		    json_integer_value(s) < 1 || (i > 0 && json_integer_value(s) <= t[-1].seq) ||
		    get_name(e, "sandbox", t->sandbox, 0, err, sizeof err) < 0 || !t->sandbox[0] ||
		    get_name(e, "activation", t->activation, 0, err, sizeof err) < 0 || !t->activation[0]) {
			free(m->tentative);
			m->tentative = NULL;
			return SPACED_EPROTO;
		}
		t->seq = json_integer_value(s);
	}
	m->ntentative = n;
	return 0;
}

int cp_parse_chan(const char *msg, size_t len, struct cp_chan_msg *out)
{
	struct cp_chan_msg m = {0};
	char err[8];
	int r = SPACED_EPROTO;
	json_t *o = load_object(msg, len, err, sizeof err), *h, *v;
	if (o == NULL)
		return SPACED_EPROTO;
	if ((h = json_object_get(o, "hello")) != NULL) {
		static const char *const top[] = {"hello", NULL};
		static const char *const hm[] = {"worker",      "last_seq",  "substrates", "capacity",
		                                 "limits",      "fence_after", "tentative", NULL};
		if (only_members(o, top, err, sizeof err) < 0 || !json_is_object(h) ||
		    only_members(h, hm, err, sizeof err) < 0 || get_name(h, "worker", m.worker, 0, err, sizeof err) < 0 ||
		    m.worker[0] == 0)
			goto out;
		v = json_object_get(h, "last_seq");
		if (!json_is_integer(v) || json_integer_value(v) < 0)
			goto out;
		m.last_seq = json_integer_value(v);
		if (json_object_get(h, "substrates") != NULL) {
			if (get_substrates(h, m.substrates, sizeof m.substrates, err, sizeof err) < 0)
				goto out;
			m.has_substrates = 1;
		}
		if (json_object_get(h, "capacity") != NULL) {
			if (get_int(h, "capacity", 1, 100000, &m.capacity, err, sizeof err) < 0)
				goto out;
			m.has_capacity = 1;
		}
		if (json_object_get(h, "limits") != NULL &&
		    cp_parse_limits(json_object_get(h, "limits"), &m.limits, err, sizeof err) < 0)
			goto out;
		if (json_object_get(h, "fence_after") != NULL &&
		    get_int(h, "fence_after", 0, 86400, &m.fence_after, err, sizeof err) < 0)
			goto out;
		if ((v = json_object_get(h, "tentative")) != NULL && parse_tentative(v, &m) < 0)
			goto out;
		m.has_tentative = v != NULL;
		m.kind = CP_CHAN_HELLO;
	} else if ((h = json_object_get(o, "ended")) != NULL) {
		static const char *const top[] = {"ended", NULL};
		static const char *const em[] = {"identity", "reason", NULL};
		if (only_members(o, top, err, sizeof err) < 0 || !json_is_object(h) ||
		    only_members(h, em, err, sizeof err) < 0 ||
		    spaced_identity_from_json(&m.ended, json_object_get(h, "identity")) < 0)
			goto out;
		v = json_object_get(h, "reason");
		if (!json_is_string(v) || json_string_length(v) >= sizeof m.reason ||
		    strlen(json_string_value(v)) != json_string_length(v))
			goto out;
		strcpy(m.reason, json_string_value(v));
		/* it reaches logs and last_error: no line breaks or quotes of its own */
		for (char *c = m.reason; *c; c++)
			if ((unsigned char)*c < 0x20 || *c == 0x7f || *c == '"' || *c == '\\')
				*c = '_';
		m.kind = CP_CHAN_ENDED;
	} else {
		static const char *const am[] = {"ack", "ok", "result", "error", "code", NULL};
		if (only_members(o, am, err, sizeof err) < 0)
			goto out;
		v = json_object_get(o, "ack");
		if (!json_is_integer(v) || json_integer_value(v) < 1)
			goto out;
		m.seq = json_integer_value(v);
		v = json_object_get(o, "ok");
		if (!json_is_boolean(v))
			goto out;
		m.ok = json_is_true(v);
		if ((v = json_object_get(o, "code")) != NULL) {
			if (!json_is_string(v) || json_string_length(v) >= sizeof m.code ||
			    strlen(json_string_value(v)) != json_string_length(v))
				goto out;
			strcpy(m.code, json_string_value(v));
		}
		if ((v = json_object_get(o, "error")) != NULL) {
			if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
				goto out;
			snprintf(m.error, sizeof m.error, "%s", json_string_value(v));
		}
		if ((v = json_object_get(o, "result")) != NULL && !json_is_null(v)) {
			if (!json_is_object(v) || (m.result = json_dumps(v, JSON_COMPACT)) == NULL)
				goto out;
		}
		m.kind = CP_CHAN_ACK;
	}
	*out = m;
	r = 0;
out:
	json_decref(o);
	return r;
}

int cp_list_has(const char *list, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = list; p != NULL && *p;) {
		const char *c = strchr(p, ',');
		size_t l = c ? (size_t)(c - p) : strlen(p);
		if (l == n && memcmp(p, name, n) == 0)
			return 1;
		p = c ? c + 1 : NULL;
	}
	return 0;
}
