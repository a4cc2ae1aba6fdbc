/* mgr_rec.c — a runtime record as JSON, for the jobs the gate hands to the executor. */
#include "mgr.h"

#include <string.h>

#include "spaced_error.h"
#include "treehash.h"

json_t *mgr_rec_to_json(const struct mgr_rec *r)
{
	return json_pack("{s:o,s:I,s:b,s:s,s:I,s:I,s:I,s:I,s:I,s:o,s:s,s:s,s:s,s:s,s:s}", "identity",
	                 spaced_identity_to_json(&r->r.id), "epoch", (json_int_t)r->r.epoch, "active", r->r.active,
	                 "state", r->state, "pid", (json_int_t)r->pid, "pid_start", (json_int_t)r->pid_start, "host_pid",
	                 (json_int_t)r->host_pid, "host_start", (json_int_t)r->host_start, "uid_base",
	                 (json_int_t)r->uid_base, "resources", spaced_resources_to_json(&r->res), "template", r->tmpl,
	                 "template_url", r->tmpl_url, "exec_name", r->exec_name, "config", r->config, "tenant",
	                 r->tenant);
}

static int get_u64(json_t *o, const char *k, uint64_t *out)
{
	json_t *v = json_object_get(o, k);
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return SPACED_EINVAL;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

int mgr_rec_from_json(json_t *o, struct mgr_rec *out)
{
	struct mgr_rec r;
	uint64_t epoch, pid, pid_start, host_pid, host_start, uid;
	json_t *st = json_object_get(o, "state"), *act = json_object_get(o, "active");
	memset(&r, 0, sizeof r);
	if (!json_is_object(o) || spaced_identity_from_json(&r.r.id, json_object_get(o, "identity")) < 0 ||
	    get_u64(o, "epoch", &epoch) < 0 || get_u64(o, "pid", &pid) < 0 || get_u64(o, "pid_start", &pid_start) < 0 ||
	    get_u64(o, "host_pid", &host_pid) < 0 || get_u64(o, "host_start", &host_start) < 0 ||
	    get_u64(o, "uid_base", &uid) < 0 || uid > UINT32_MAX || !json_is_boolean(act) || !json_is_string(st) ||
	    json_string_length(st) >= sizeof r.state ||
	    spaced_resources_from_json(json_object_get(o, "resources"), &r.res, NULL, 0) < 0)
		return SPACED_EINVAL;
	r.r.epoch = epoch;
	r.r.active = json_is_true(act);
	memcpy(r.state, json_string_value(st), json_string_length(st) + 1);
	r.pid = (int64_t)pid;
	r.pid_start = pid_start;
	r.host_pid = (int64_t)host_pid;
	r.host_start = host_start;
	r.uid_base = (uint32_t)uid;
	json_t *t = json_object_get(o, "template"), *tu = json_object_get(o, "template_url");
	if (t && (!json_is_string(t) || (json_string_length(t) != 0 && !spaced_treehash_hex_valid(json_string_value(t)))))
		return SPACED_EINVAL;
	if (tu && (!json_is_string(tu) || json_string_length(tu) >= sizeof r.tmpl_url))
		return SPACED_EINVAL;
	snprintf(r.tmpl, sizeof r.tmpl, "%s", t ? json_string_value(t) : "");
	snprintf(r.tmpl_url, sizeof r.tmpl_url, "%s", tu ? json_string_value(tu) : "");
	json_t *xn = json_object_get(o, "exec_name");
	if (xn && (!json_is_string(xn) || json_string_length(xn) >= sizeof r.exec_name ||
	           (json_string_length(xn) > 0 && (strncmp(json_string_value(xn), "pool/", 5) != 0 ||
	                                           !spaced_name_valid(json_string_value(xn) + 5,
	                                                              json_string_length(xn) - 5)))))
		return SPACED_EINVAL;
	snprintf(r.exec_name, sizeof r.exec_name, "%s", xn ? json_string_value(xn) : "");
	json_t *cf = json_object_get(o, "config");
	if (cf && (!json_is_string(cf) || json_string_length(cf) >= sizeof r.config))
		return SPACED_EINVAL;
	snprintf(r.config, sizeof r.config, "%s", cf ? json_string_value(cf) : "");
	json_t *tn = json_object_get(o, "tenant");
	if (tn && (!json_is_string(tn) || json_string_length(tn) >= sizeof r.tenant))
		return SPACED_EINVAL;
	snprintf(r.tenant, sizeof r.tenant, "%s", tn ? json_string_value(tn) : "");
	*out = r;
	return 0;
}
