/*
 * node_req.c — turns an HTTP request line (method, path, query) and an exec
 * body into a guest-protocol request. Pure functions over untrusted bytes: no
 * I/O, every size checked; fuzzed by fuzz/fuzz_node_req.c.
 */
#include "node.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "spaced_error.h"

#define PREFIX "/v1/sandboxes/"

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Decodes src[0..n) (percent escapes, '+' as space) into out (outsz incl. NUL). */
static int pct_decode(const char *src, size_t n, char *out, size_t outsz)
{
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		int c = (unsigned char)src[i];
		if (c == '%') {
			if (n - i < 3)
				return SPACED_EFORMAT;
			int h = hexval((unsigned char)src[i + 1]), l = hexval((unsigned char)src[i + 2]);
			if (h < 0 || l < 0)
				return SPACED_EFORMAT;
			c = h * 16 + l;
			i += 2;
		} else if (c == '+') {
			c = ' ';
		}
		if (c == 0)
			return SPACED_EFORMAT;
		if (o + 1 >= outsz)
			return SPACED_ETOOBIG;
		out[o++] = (char)c;
	}
	if (outsz == 0)
		return SPACED_ETOOBIG;
	out[o] = '\0';
	return (int)o;
}

int node_query_split(const char *raw, size_t len, char *store, size_t storesz, struct node_query *q)
{
	struct node_query t;
	size_t used = 0;
	memset(&t, 0, sizeof t);
	size_t i = 0;
	while (i < len) {
		const char *amp = memchr(raw + i, '&', len - i);
		size_t flen = amp ? (size_t)(amp - (raw + i)) : len - i;
		if (flen > 0) {
			if (t.n == NODE_QUERY_FRAGS)
				return SPACED_ETOOBIG;
			if (used >= storesz)
				return SPACED_ETOOBIG;
			int n = pct_decode(raw + i, flen, store + used, storesz - used);
			if (n < 0)
				return n;
			t.frag[t.n++] = store + used;
			used += (size_t)n + 1;
		}
		i += flen + 1;
	}
	*q = t;
	return 0;
}

/* The idx-th value of name in the query fragments. */
static int query_nth(const struct node_query *query, const char *name, unsigned idx, char *out,
                     size_t outsz)
{
	if (!query)
		return SPACED_ENOENT;
	size_t nl = strlen(name);
	unsigned seen = 0;
	for (size_t i = 0; i < query->n; i++) {
		const char *f = query->frag[i];
		const char *eq = strchr(f, '=');
		size_t klen = eq ? (size_t)(eq - f) : strlen(f);
		if (klen != nl || memcmp(f, name, nl) != 0)
			continue;
		if (seen++ != idx)
			continue;
		const char *v = eq ? eq + 1 : "";
		size_t vl = strlen(v);
		if (vl + 1 > outsz)
			return SPACED_ETOOBIG;
		memcpy(out, v, vl + 1);
		return (int)vl;
	}
	return SPACED_ENOENT;
}

int node_query_get(const struct node_query *query, const char *name, char *out, size_t outsz)
{
	return query_nth(query, name, 0, out, outsz);
}

/* An unsigned decimal parameter; absent → def. */
static int query_u64(const struct node_query *query, const char *name, uint64_t def, uint64_t max, uint64_t *out)
{
	char buf[32];
	int n = node_query_get(query, name, buf, sizeof buf);
	if (n == SPACED_ENOENT) {
		*out = def;
		return 0;
	}
	if (n <= 0)
		return SPACED_EFORMAT;
	uint64_t v = 0;
	for (int i = 0; i < n; i++) {
		if (buf[i] < '0' || buf[i] > '9')
			return SPACED_EFORMAT;
		if (v > (UINT64_MAX - 9) / 10)
			return SPACED_EFORMAT;
		v = v * 10 + (uint64_t)(buf[i] - '0');
	}
	if (v > max)
		return SPACED_EFORMAT;
	*out = v;
	return 0;
}

static int query_bool(const struct node_query *query, const char *name, bool *out)
{
	char buf[8];
	int n = node_query_get(query, name, buf, sizeof buf);
	if (n == SPACED_ENOENT) {
		*out = false;
		return 0;
	}
	if (n < 0)
		return SPACED_EFORMAT;
	if (strcmp(buf, "1") == 0 || strcmp(buf, "true") == 0 || n == 0)
		*out = true;
	else if (strcmp(buf, "0") == 0 || strcmp(buf, "false") == 0)
		*out = false;
	else
		return SPACED_EFORMAT;
	return 0;
}

/* A required path-like parameter, appended as a text field. */
static int put_path_param(struct spaced_buf *b, const struct node_query *query, const char *name)
{
	char *buf = malloc(SPACED_GUEST_PATH_MAX + 1);
	if (!buf)
		return SPACED_ENOMEM;
	int n = node_query_get(query, name, buf, SPACED_GUEST_PATH_MAX + 1);
	int e;
	if (n <= 0)
		e = SPACED_EFORMAT;
	else
		e = spaced_field_put_str(b, buf) < 0 ? SPACED_ENOMEM : 0;
	free(buf);
	return e;
}

int node_bearer(const char *hdr, size_t len, const char **tok, size_t *toklen)
{
	static const char scheme[] = "bearer";
	if (!hdr || len < sizeof scheme)
		return SPACED_EFORMAT;
	for (size_t i = 0; i < sizeof scheme - 1; i++)
		if (tolower((unsigned char)hdr[i]) != scheme[i])
			return SPACED_EFORMAT;
	size_t i = sizeof scheme - 1;
	if (hdr[i] != ' ')
		return SPACED_EFORMAT;
	while (i < len && hdr[i] == ' ')
		i++;
	size_t end = len;
	while (end > i && (hdr[end - 1] == ' ' || hdr[end - 1] == '\t'))
		end--;
	if (end == i || end - i > NODE_TOKEN_MAX)
		return SPACED_EFORMAT;
	for (size_t k = i; k < end; k++) {
		unsigned char c = (unsigned char)hdr[k];
		if (c <= 0x20 || c >= 0x7f)
			return SPACED_EFORMAT;
	}
	*tok = hdr + i;
	*toklen = end - i;
	return 0;
}

int node_refusal_status(enum spaced_verdict v, enum spaced_reason r)
{
	if (v == SPACED_REFRESH_ROUTE)
		return 409;
	switch (r) {
	case SPACED_REASON_EXPIRED:
	case SPACED_REASON_NOT_YET_VALID:
	case SPACED_REASON_BAD_SIGNATURE:
	case SPACED_REASON_UNKNOWN_KEY:
	case SPACED_REASON_MALFORMED:
		return 401;
	default:
		return 403;
	}
}

int node_error_status(int err)
{
	switch (err) {
	case 0:
		return 200;
	case SPACED_ENOENT:
		return 404;
	case SPACED_EEXIST:
		return 422;
	case SPACED_EINVAL:
	case SPACED_EFORMAT:
	case SPACED_EPROTO:
		return 400;
	case SPACED_ETOOBIG:
		return 413;
	case SPACED_EPERM:
		return 422;
	case SPACED_EBUSY:
		return 503;
	case SPACED_ETIMEDOUT:
		return 504;
	default:
		return 500;
	}
}

void node_req_clear(struct node_req *r)
{
	if (r)
		spaced_buf_free(&r->payload);
}

/* Splits "/v1/sandboxes/<id>/<rest>". */
static int split_path(const char *path, char sandbox[SPACED_NAME_MAX], const char **rest)
{
	size_t pl = strlen(PREFIX);
	if (strncmp(path, PREFIX, pl) != 0)
		return SPACED_ENOENT;
	const char *s = path + pl;
	const char *slash = strchr(s, '/');
	if (!slash)
		return SPACED_ENOENT;
	size_t n = (size_t)(slash - s);
	if (!spaced_name_valid(s, n))
		return SPACED_ENOENT;
	memcpy(sandbox, s, n);
	sandbox[n] = '\0';
	*rest = slash + 1;
	return 0;
}

/* "procs/<n>[/<what>]" */
static int parse_proc(const char *rest, uint64_t *proc, const char **what)
{
	const char *p = rest + strlen("procs/");
	uint64_t v = 0;
	const char *q = p;
	while (*q >= '0' && *q <= '9') {
		if (v > (UINT64_MAX - 9) / 10)
			return SPACED_ENOENT;
		v = v * 10 + (uint64_t)(*q - '0');
		q++;
	}
	if (q == p || (*q && *q != '/'))
		return SPACED_ENOENT;
	*proc = v;
	*what = *q ? q + 1 : "";
	return 0;
}

/* argc, argv…, envc, env…, cwd of a command from the query (argv=…&env=K=V&cwd=…);
 * argv defaults to /bin/sh. */
static int command_fields(struct spaced_buf *b, const struct node_query *query);

/* The optional last field of a command: user=U from the query. */
static int user_field(struct spaced_buf *b, const struct node_query *query)
{
	char u[256];
	int n = node_query_get(query, "user", u, sizeof u);
	if (n == SPACED_ENOENT)
		return 0;
	if (n <= 0)
		return SPACED_EFORMAT;
	return spaced_field_put_str(b, u);
}

static int term_payload(struct spaced_buf *b, const struct node_query *query)
{
	int e = command_fields(b, query);
	uint64_t rows = 0, cols = 0;
	if (e == 0)
		e = query_u64(query, "rows", 24, 1000, &rows);
	if (e == 0)
		e = query_u64(query, "cols", 80, 1000, &cols);
	if (e == 0 && (rows == 0 || cols == 0))
		e = SPACED_EFORMAT;
	if (e == 0)
		e = spaced_field_put_u64(b, rows);
	if (e == 0)
		e = spaced_field_put_u64(b, cols);
	if (e == 0)
		e = user_field(b, query);
	return e == SPACED_ETOOBIG ? SPACED_EFORMAT : e;
}

/* A streamed exec: the command, timeout_ms, and stdin always open (its end
 * is the client's 'd'). */
static int exec_ws_payload(struct spaced_buf *b, const struct node_query *query)
{
	uint64_t tmo = 0;
	int e = command_fields(b, query);
	if (e == 0)
		e = query_u64(query, "timeout_ms", 0, UINT32_MAX, &tmo);
	if (e == 0)
		e = spaced_field_put_u64(b, tmo);
	if (e == 0)
		e = spaced_field_put_u64(b, SPACED_GUEST_EXEC_STDIN);
	if (e == 0)
		e = user_field(b, query);
	return e == SPACED_ETOOBIG ? SPACED_EFORMAT : e;
}

static int command_fields(struct spaced_buf *b, const struct node_query *query)
{
	char *arg = malloc(SPACED_GUEST_PATH_MAX + 1);
	if (!arg)
		return SPACED_ENOMEM;
	int e = 0;
	unsigned argc = 0, envc = 0;
	while (argc < SPACED_GUEST_MAX_ARGS &&
	       query_nth(query, "argv", argc, arg, SPACED_GUEST_PATH_MAX + 1) >= 0)
		argc++;
	while (envc < SPACED_GUEST_MAX_ARGS &&
	       query_nth(query, "env", envc, arg, SPACED_GUEST_PATH_MAX + 1) >= 0)
		envc++;
	if (argc == 0) {
		e = spaced_field_put_u64(b, 1);
		if (e == 0)
			e = spaced_field_put_str(b, "/bin/sh");
	} else {
		e = spaced_field_put_u64(b, argc);
		for (unsigned i = 0; e == 0 && i < argc; i++) {
			int n = query_nth(query, "argv", i, arg, SPACED_GUEST_PATH_MAX + 1);
			e = n <= 0 ? SPACED_EFORMAT : spaced_field_put_str(b, arg);
		}
	}
	if (e == 0)
		e = spaced_field_put_u64(b, envc);
	for (unsigned i = 0; e == 0 && i < envc; i++) {
		int n = query_nth(query, "env", i, arg, SPACED_GUEST_PATH_MAX + 1);
		e = (n <= 0 || !strchr(arg, '=')) ? SPACED_EFORMAT : spaced_field_put_str(b, arg);
	}
	if (e == 0) {
		int n = node_query_get(query, "cwd", arg, SPACED_GUEST_PATH_MAX + 1);
		if (n == SPACED_ENOENT)
			e = spaced_field_put_str(b, "");
		else if (n < 0)
			e = SPACED_EFORMAT;
		else
			e = spaced_field_put_str(b, arg);
	}
	free(arg);
	return e;
}

int node_req_parse(struct node_req *out, enum node_method method, const char *path,
                   const struct node_query *query, bool websocket)
{
	struct node_req r;
	const char *rest = NULL;
	int e;

	if (!path)
		return SPACED_ENOENT;
	memset(&r, 0, sizeof r);
	spaced_buf_init(&r.payload, SPACED_FRAME_MAX / 2);
	e = split_path(path, r.sandbox, &rest);
	if (e < 0)
		goto out;
	r.answer = NODE_ANS_JSON;
	r.body = NODE_BODY_NONE;

	if (websocket) {
		if (method != NODE_GET) {
			e = SPACED_EINVAL;
		} else if (strcmp(rest, "term") == 0) {
			r.guest_type = SPACED_GUEST_TERM_OPEN;
			r.answer = NODE_ANS_WS_TERM;
			e = term_payload(&r.payload, query);
		} else if (strcmp(rest, "exec") == 0) {
			r.guest_type = SPACED_GUEST_EXEC;
			r.answer = NODE_ANS_WS_EXEC;
			r.exec_flags = SPACED_GUEST_EXEC_STDIN;
			e = exec_ws_payload(&r.payload, query);
		} else if (strcmp(rest, "watch") == 0) {
			r.guest_type = SPACED_GUEST_WATCH;
			r.answer = NODE_ANS_WS_WATCH;
			e = put_path_param(&r.payload, query, "path");
		} else if (strncmp(rest, "ports/", 6) == 0) {
			uint64_t port = 0;
			const char *p = rest + 6;
			if (!*p || strlen(p) > 5)
				e = SPACED_ENOENT;
			for (; e == 0 && *p; p++) {
				if (*p < '0' || *p > '9')
					e = SPACED_ENOENT;
				else
					port = port * 10 + (uint64_t)(*p - '0');
			}
			if (e == 0 && (port == 0 || port > 65535))
				e = SPACED_EFORMAT;
			if (e == 0) {
				int n = node_query_get(query, "protocol", r.protocol, sizeof r.protocol);
				if (n == SPACED_ENOENT) {
					strcpy(r.protocol, "tcp");
				} else if (n <= 0) {
					e = SPACED_EFORMAT;
				}
			}
			if (e == 0) {
				r.port = (uint16_t)port;
				r.guest_type = NODE_PORT_OPEN;
				r.answer = NODE_ANS_WS_PORT;
				e = spaced_field_put_u64(&r.payload, port);
			}
		} else {
			e = SPACED_ENOENT;
		}
		goto out;
	}

	if (strcmp(rest, "files") == 0) {
		if (method == NODE_GET) {
			uint64_t off, len;
			r.guest_type = SPACED_GUEST_FS_READ;
			r.answer = NODE_ANS_STREAM;
			e = put_path_param(&r.payload, query, "path");
			if (e == 0)
				e = query_u64(query, "offset", 0, INT64_MAX, &off);
			if (e == 0)
				e = query_u64(query, "length", UINT64_MAX, UINT64_MAX, &len);
			if (e == 0)
				e = spaced_field_put_u64(&r.payload, off);
			if (e == 0)
				e = spaced_field_put_u64(&r.payload, len);
		} else if (method == NODE_PUT) {
			uint64_t mode;
			bool mkdirs;
			r.guest_type = SPACED_GUEST_FS_WRITE;
			r.body = NODE_BODY_STREAM;
			e = put_path_param(&r.payload, query, "path");
			if (e == 0)
				e = query_u64(query, "mode", 0644, 07777, &mode);
			if (e == 0)
				e = query_bool(query, "mkdirs", &mkdirs);
			if (e == 0)
				e = spaced_field_put_u64(&r.payload, mode);
			if (e == 0)
				e = spaced_field_put_u64(&r.payload, mkdirs ? SPACED_GUEST_WRITE_MKDIRS : 0);
		} else if (method == NODE_DELETE) {
			bool rec;
			r.guest_type = SPACED_GUEST_FS_REMOVE;
			e = put_path_param(&r.payload, query, "path");
			if (e == 0)
				e = query_bool(query, "recursive", &rec);
			if (e == 0)
				e = spaced_field_put_u64(&r.payload, rec ? 1 : 0);
		} else {
			e = SPACED_EINVAL;
		}
	} else if (strcmp(rest, "list") == 0) {
		uint64_t depth;
		r.guest_type = SPACED_GUEST_FS_LIST;
		e = method == NODE_GET ? 0 : SPACED_EINVAL;
		if (e == 0)
			e = put_path_param(&r.payload, query, "path");
		if (e == 0)
			e = query_u64(query, "depth", 1, 64, &depth);
		if (e == 0 && depth == 0)
			e = SPACED_EFORMAT;
		if (e == 0)
			e = spaced_field_put_u64(&r.payload, depth);
	} else if (strcmp(rest, "stat") == 0) {
		r.guest_type = SPACED_GUEST_FS_STAT;
		e = method == NODE_GET ? 0 : SPACED_EINVAL;
		if (e == 0)
			e = put_path_param(&r.payload, query, "path");
	} else if (strcmp(rest, "mkdir") == 0) {
		uint64_t mode;
		r.guest_type = SPACED_GUEST_FS_MKDIR;
		e = method == NODE_POST ? 0 : SPACED_EINVAL;
		if (e == 0)
			e = put_path_param(&r.payload, query, "path");
		if (e == 0)
			e = query_u64(query, "mode", 0755, 07777, &mode);
		if (e == 0)
			e = spaced_field_put_u64(&r.payload, mode);
	} else if (strcmp(rest, "move") == 0) {
		r.guest_type = SPACED_GUEST_FS_MOVE;
		e = method == NODE_POST ? 0 : SPACED_EINVAL;
		if (e == 0)
			e = put_path_param(&r.payload, query, "from");
		if (e == 0)
			e = put_path_param(&r.payload, query, "to");
	} else if (strcmp(rest, "usage") == 0) {
		r.guest_type = NODE_USAGE;
		e = method == NODE_GET ? 0 : SPACED_EINVAL;
	} else if (strcmp(rest, "exec") == 0) {
		r.guest_type = SPACED_GUEST_EXEC;
		r.body = NODE_BODY_EXEC;
		e = method == NODE_POST ? 0 : SPACED_EINVAL;
	} else if (strcmp(rest, "procs") == 0) {
		r.guest_type = SPACED_GUEST_PROC_LIST;
		e = method == NODE_GET ? 0 : SPACED_EINVAL;
	} else if (strncmp(rest, "procs/", 6) == 0) {
		uint64_t proc;
		const char *what;
		e = parse_proc(rest, &proc, &what);
		if (e == 0 && strcmp(what, "") == 0) {
			r.guest_type = SPACED_GUEST_PROC_KILL;
			e = method == NODE_DELETE ? 0 : SPACED_EINVAL;
			if (e == 0)
				e = spaced_field_put_u64(&r.payload, proc);
		} else if (e == 0 && strcmp(what, "output") == 0) {
			r.guest_type = SPACED_GUEST_PROC_ATTACH;
			e = method == NODE_GET ? 0 : SPACED_EINVAL;
			if (e == 0)
				e = spaced_field_put_u64(&r.payload, proc);
		} else if (e == 0 && strcmp(what, "signal") == 0) {
			uint64_t sig;
			r.guest_type = SPACED_GUEST_PROC_SIGNAL;
			e = method == NODE_POST ? 0 : SPACED_EINVAL;
			if (e == 0)
				e = query_u64(query, "signal", 15, 64, &sig);
			if (e == 0)
				e = spaced_field_put_u64(&r.payload, proc);
			if (e == 0)
				e = spaced_field_put_i64(&r.payload, (int64_t)sig);
		} else if (e == 0) {
			e = SPACED_ENOENT;
		}
	} else {
		e = SPACED_ENOENT;
	}
out:
	if (e == SPACED_ETOOBIG)
		e = SPACED_EFORMAT;
	if (e < 0) {
		spaced_buf_free(&r.payload);
		return e;
	}
	*out = r;
	return 0;
}

static int put_str_item(struct spaced_buf *b, json_t *v)
{
	if (!json_is_string(v))
		return SPACED_EFORMAT;
	size_t n = json_string_length(v);
	if (n > SPACED_GUEST_PATH_MAX)
		return SPACED_EFORMAT;
	return spaced_field_put_strn(b, json_string_value(v), n) < 0 ? SPACED_EFORMAT : 0;
}

int node_req_exec_body(struct node_req *r, const char *body, size_t len, void **keep,
                       const char **stdin_data, size_t *stdin_len)
{
	json_error_t jerr;
	json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
	int e = 0;
	struct spaced_buf b;
	const char *key;
	json_t *v;

	spaced_buf_init(&b, SPACED_FRAME_MAX / 2);
	if (!root || !json_is_object(root)) {
		e = SPACED_EJSON;
		goto out;
	}
	json_object_foreach(root, key, v) {
		if (strcmp(key, "argv") && strcmp(key, "env") && strcmp(key, "cwd") && strcmp(key, "timeout_ms") &&
		    strcmp(key, "background") && strcmp(key, "stdin") && strcmp(key, "user")) {
			e = SPACED_EFORMAT;
			goto out;
		}
	}
	json_t *argv = json_object_get(root, "argv");
	json_t *env = json_object_get(root, "env");
	json_t *cwd = json_object_get(root, "cwd");
	json_t *tmo = json_object_get(root, "timeout_ms");
	json_t *bg = json_object_get(root, "background");
	json_t *in = json_object_get(root, "stdin");
	if (!json_is_array(argv) || json_array_size(argv) == 0 ||
	    json_array_size(argv) > SPACED_GUEST_MAX_ARGS) {
		e = SPACED_EFORMAT;
		goto out;
	}
	size_t i;
	e = spaced_field_put_u64(&b, json_array_size(argv));
	json_array_foreach(argv, i, v) {
		if (e == 0)
			e = put_str_item(&b, v);
	}
	if (e < 0)
		goto out;
	if (!env || json_is_null(env)) {
		e = spaced_field_put_u64(&b, 0);
	} else if (json_is_array(env) && json_array_size(env) <= SPACED_GUEST_MAX_ARGS) {
		e = spaced_field_put_u64(&b, json_array_size(env));
		json_array_foreach(env, i, v) {
			if (e == 0 && (!json_is_string(v) || !strchr(json_string_value(v), '=')))
				e = SPACED_EFORMAT;
			if (e == 0)
				e = put_str_item(&b, v);
		}
	} else if (json_is_object(env) && json_object_size(env) <= SPACED_GUEST_MAX_ARGS) {
		e = spaced_field_put_u64(&b, json_object_size(env));
		json_object_foreach(env, key, v) {
			char kv[1024];
			if (e == 0 && (!json_is_string(v) || strchr(key, '=') || !*key))
				e = SPACED_EFORMAT;
			if (e == 0) {
				int n = snprintf(kv, sizeof kv, "%s=%s", key, json_string_value(v));
				e = (n < 0 || (size_t)n >= sizeof kv) ? SPACED_EFORMAT : spaced_field_put_str(&b, kv);
			}
		}
	} else {
		e = SPACED_EFORMAT;
	}
	if (e < 0)
		goto out;
	if (!cwd || json_is_null(cwd))
		e = spaced_field_put_str(&b, "");
	else
		e = put_str_item(&b, cwd);
	if (e < 0)
		goto out;
	json_int_t t = 0;
	if (tmo && !json_is_null(tmo)) {
		if (!json_is_integer(tmo) || json_integer_value(tmo) < 0) {
			e = SPACED_EFORMAT;
			goto out;
		}
		t = json_integer_value(tmo);
	}
	uint32_t flags = 0;
	if (bg && !json_is_boolean(bg)) {
		e = SPACED_EFORMAT;
		goto out;
	}
	if (bg && json_is_true(bg))
		flags |= SPACED_GUEST_EXEC_BACKGROUND;
	if (in && !json_is_null(in)) {
		if (!json_is_string(in) || (flags & SPACED_GUEST_EXEC_BACKGROUND)) {
			e = SPACED_EFORMAT;
			goto out;
		}
		flags |= SPACED_GUEST_EXEC_STDIN;
	}
	e = spaced_field_put_u64(&b, (uint64_t)t);
	if (e == 0)
		e = spaced_field_put_u64(&b, flags);
	json_t *user = json_object_get(root, "user");
	if (e == 0 && user && !json_is_null(user)) /* who runs it (exec --user); the sandbox's USER else */
		e = (!json_is_string(user) || json_string_length(user) == 0 || json_string_length(user) > 255)
		            ? SPACED_EFORMAT
		            : put_str_item(&b, user);
	if (e < 0)
		goto out;
	spaced_buf_free(&r->payload);
	r->payload = b;
	spaced_buf_init(&b, 0);
	r->exec_flags = flags;
	if (flags & SPACED_GUEST_EXEC_STDIN) {
		*stdin_data = json_string_value(in);
		*stdin_len = json_string_length(in);
	} else {
		*stdin_data = NULL;
		*stdin_len = 0;
	}
	*keep = root;
	root = NULL;
out:
	if (e == SPACED_ETOOBIG || e == SPACED_EINVAL)
		e = SPACED_EFORMAT;
	spaced_buf_free(&b);
	json_decref(root);
	return e;
}
