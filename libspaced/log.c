/* log.c — daemons' log lines in text or JSON form (see log.h). */
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

/* -1 until set or first used: then from SPACED_LOG_FORMAT */
static int format = -1;

int spaced_log_format_parse(const char *s, enum spaced_log_format *out)
{
	if (strcmp(s, "text") == 0)
		*out = SPACED_LOG_TEXT;
	else if (strcmp(s, "json") == 0)
		*out = SPACED_LOG_JSON;
	else
		return -1;
	return 0;
}

void spaced_log_set_format(enum spaced_log_format f)
{
	format = (int)f;
	setenv("SPACED_LOG_FORMAT", f == SPACED_LOG_JSON ? "json" : "text", 1);
}

enum spaced_log_format spaced_log_format_from_env(void)
{
	const char *e = getenv("SPACED_LOG_FORMAT");
	enum spaced_log_format f = SPACED_LOG_TEXT;
	if (e)
		spaced_log_format_parse(e, &f);
	return f;
}

enum spaced_log_format spaced_log_get_format(void)
{
	if (format < 0)
		format = spaced_log_format_from_env();
	return (enum spaced_log_format)format;
}

static bool key_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
	       c == '.';
}

/* Parses logfmt pairs of line into o; false when line is not logfmt. */
static bool logfmt_pairs(const char *line, json_t *o)
{
	const char *p = line;
	bool any = false;
	while (*p) {
		while (*p == ' ')
			p++;
		if (!*p)
			break;
		const char *k = p;
		while (key_char(*p))
			p++;
		if (p == k || *p != '=')
			return false;
		size_t kl = (size_t)(p - k);
		p++;
		char *val;
		size_t vl = 0;
		if (*p == '"') {
			p++;
			val = malloc(strlen(p) + 1);
			if (!val)
				return false;
			while (*p && *p != '"') {
				if (*p == '\\' && p[1])
					p++;
				val[vl++] = *p++;
			}
			if (*p != '"') {
				free(val);
				return false;
			}
			p++;
		} else {
			const char *v = p;
			while (*p && *p != ' ')
				p++;
			vl = (size_t)(p - v);
			val = malloc(vl + 1);
			if (!val)
				return false;
			memcpy(val, v, vl);
		}
		val[vl] = '\0';
		char key[64];
		if (kl >= sizeof key)
			kl = sizeof key - 1;
		memcpy(key, k, kl);
		key[kl] = '\0';
		if (json_object_get(o, key)) { /* a key twice: a value that forged a pair; the line stays whole */
			free(val);
			return false;
		}
		json_object_set_new(o, key, json_stringn(val, vl));
		free(val);
		any = true;
	}
	return any;
}

char *spaced_logfmt_to_json(const char *component, const char *line, long long unix_ms)
{
	char ts[40];
	time_t t = (time_t)(unix_ms / 1000);
	struct tm tm;
	gmtime_r(&t, &tm);
	size_t n = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(ts + n, sizeof ts - n, ".%03lldZ", unix_ms % 1000);
	json_t *o = json_pack("{s:s,s:s}", "time", ts, "component", component);
	if (!o)
		return NULL;
	json_t *pairs = json_object();
	if (pairs && logfmt_pairs(line, pairs))
		json_object_update(o, pairs);
	else
		json_object_set_new(o, "msg", json_string(line));
	json_decref(pairs);
	char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(o);
	return s;
}

void spaced_log_escape_controls(char *s, size_t cap)
{
	size_t i = 0;
	while (i < cap && s[i] && (unsigned char)s[i] >= 0x20 && s[i] != 0x7f)
		i++;
	if (i >= cap || !s[i])
		return; /* the usual case: nothing to rewrite */
	char out[8192];
	size_t o = 0, lim = cap < sizeof out ? cap : sizeof out;
	for (size_t k = 0; k < cap && s[k] && o + 1 < lim; k++) {
		unsigned char c = (unsigned char)s[k];
		char e[5];
		if (c >= 0x20 && c != 0x7f) {
			out[o++] = (char)c;
			continue;
		}
		if (c == '\n' || c == '\r' || c == '\t')
			snprintf(e, sizeof e, "\\%c", c == '\n' ? 'n' : c == '\r' ? 'r' : 't');
		else
			snprintf(e, sizeof e, "\\x%02x", c);
		size_t el = strlen(e);
		if (o + el + 1 > lim)
			break;
		memcpy(out + o, e, el);
		o += el;
	}
	out[o] = 0;
	memcpy(s, out, o + 1);
}

void spaced_vlog(const char *component, const char *fmt, va_list ap)
{
	char line[4096];
	vsnprintf(line, sizeof line, fmt, ap);
	spaced_log_escape_controls(line, sizeof line);
	if (spaced_log_get_format() == SPACED_LOG_JSON) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		char *j = spaced_logfmt_to_json(component, line, (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
		if (j) {
			fprintf(stderr, "%s\n", j);
			free(j);
			return;
		}
	}
	fprintf(stderr, "%s: %s\n", component, line);
}

void spaced_log(const char *component, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	spaced_vlog(component, fmt, ap);
	va_end(ap);
}
