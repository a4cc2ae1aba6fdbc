/* http.c — strict HTTP/1.1 request heads and bodies (http.h). */
#include "http.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util.h"

/* tchar of RFC 9110 */
static bool is_tchar(unsigned char c)
{
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
		return true;
	return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* field-vchar, SP, HTAB (obs-text allowed: bytes >= 0x80) */
static bool is_value_char(unsigned char c)
{
	return c == '\t' || (c >= 0x20 && c != 0x7f);
}

/* request-target (origin-form): visible ASCII without '#' */
static bool is_target_char(unsigned char c)
{
	return c > 0x20 && c < 0x7f && c != '#';
}

void spaced_http_req_clear(struct spaced_http_req *req)
{
	if (!req)
		return;
	free(req->head);
	memset(req, 0, sizeof *req);
}

const char *spaced_http_field(const struct spaced_http_req *req, const char *name)
{
	for (unsigned i = 0; i < req->nfields; i++)
		if (strcmp(req->fields[i].name, name) == 0)
			return req->fields[i].value;
	return NULL;
}

static unsigned count_field(const struct spaced_http_req *req, const char *name)
{
	unsigned n = 0;
	for (unsigned i = 0; i < req->nfields; i++)
		n += strcmp(req->fields[i].name, name) == 0;
	return n;
}

/* True when the comma-separated list value holds token (case-insensitive). */
static bool list_has(const char *value, const char *token)
{
	size_t tl = strlen(token);
	for (const char *p = value; *p;) {
		while (*p == ' ' || *p == '\t' || *p == ',')
			p++;
		const char *e = p;
		while (*e && *e != ',')
			e++;
		const char *end = e;
		while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
			end--;
		if ((size_t)(end - p) == tl && strncasecmp(p, token, tl) == 0)
			return true;
		p = e;
	}
	return false;
}

/* Content-Length: 1-19 decimal digits, below 2^63. */
static int parse_length(const char *v, uint64_t *out)
{
	uint64_t x = 0;
	size_t n = strlen(v);
	if (n == 0 || n > 19)
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (v[i] < '0' || v[i] > '9')
			return -1;
		x = x * 10 + (uint64_t)(v[i] - '0');
	}
	if (x > (uint64_t)INT64_MAX)
		return -1;
	*out = x;
	return 0;
}

/* Sec-WebSocket-Key: the base64 of 16 bytes (24 characters, "==" at the end). */
static bool ws_key_ok(const char *k)
{
	if (strlen(k) != 24 || k[22] != '=' || k[23] != '=')
		return false;
	for (int i = 0; i < 22; i++) {
		char c = k[i];
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '/'))
			return false;
	}
	/* the last character before the padding carries 2 bits only */
	return strchr("AQgw", k[21]) != NULL;
}

int spaced_http_parse_head(const uint8_t *in, size_t n, const struct spaced_http_limits *lim,
                           struct spaced_http_req *req)
{
	/* find the end of the head, checking every line ending on the way */
	size_t end = 0;
	for (size_t i = 0; i < n; i++) {
		if (in[i] == 0)
			return -400; /* a NUL anywhere in the head */
		if (in[i] == '\r') {
			if (i + 1 < n && in[i + 1] != '\n')
				return -400; /* a bare CR */
			continue;
		}
		if (in[i] == '\n') {
			if (i == 0 || in[i - 1] != '\r')
				return -400; /* a bare LF */
			if (i >= 3 && in[i - 2] == '\n' && in[i - 3] == '\r') {
				end = i + 1;
				break;
			}
			if (i == 1)
				return -400; /* an empty line before the request line */
		}
		if (i + 1 > lim->head_max)
			return -431;
	}
	if (end == 0)
		return n > lim->head_max ? -431 : 0;
	if (end > lim->head_max)
		return -431;

	struct spaced_http_req r;
	memset(&r, 0, sizeof r);
	r.head = malloc(end + 1);
	if (!r.head)
		return -431;
	memcpy(r.head, in, end);
	r.head[end] = '\0';
	char *p = r.head, *line_end;
	int status = -400;

	/* request-line */
	line_end = strstr(p, "\r\n");
	*line_end = '\0';
	char *sp1 = strchr(p, ' ');
	if (!sp1 || sp1 == p || sp1 - p > 15)
		goto bad;
	*sp1 = '\0';
	for (char *c = p; *c; c++)
		if (!is_tchar((unsigned char)*c))
			goto bad;
	r.method = p;
	char *target = sp1 + 1, *sp2 = strchr(target, ' ');
	if (!sp2 || target[0] != '/')
		goto bad;
	*sp2 = '\0';
	if ((size_t)(sp2 - target) > lim->target_max) {
		status = -414;
		goto bad;
	}
	for (char *c = target; *c; c++)
		if (!is_target_char((unsigned char)*c))
			goto bad;
	r.target = target;
	char *ver = sp2 + 1;
	if (strcmp(ver, "HTTP/1.1") == 0) {
		r.minor = 1;
	} else if (strcmp(ver, "HTTP/1.0") == 0) {
		r.minor = 0;
	} else {
		if (strncmp(ver, "HTTP/", 5) == 0 && ver[5] >= '0' && ver[5] <= '9' && ver[6] == '.' && ver[7] >= '0' &&
		    ver[7] <= '9' && ver[8] == '\0')
			status = -505;
		goto bad;
	}
	p = line_end + 2;

	/* fields */
	while (!(p[0] == '\r' && p[1] == '\n')) {
		line_end = strstr(p, "\r\n");
		*line_end = '\0';
		if (*p == ' ' || *p == '\t')
			goto bad; /* obsolete line folding */
		char *colon = strchr(p, ':');
		if (!colon || colon == p)
			goto bad;
		for (char *c = p; c < colon; c++) {
			if (!is_tchar((unsigned char)*c))
				goto bad; /* also white space before the colon */
			if (*c >= 'A' && *c <= 'Z')
				*c = (char)(*c - 'A' + 'a');
		}
		*colon = '\0';
		char *v = colon + 1;
		for (char *c = v; *c; c++)
			if (!is_value_char((unsigned char)*c))
				goto bad;
		while (*v == ' ' || *v == '\t')
			v++;
		char *ve = v + strlen(v);
		while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
			*--ve = '\0';
		if (r.nfields == lim->fields_max || r.nfields == SPACED_HTTP_FIELDS_MAX) {
			status = -431;
			goto bad;
		}
		r.fields[r.nfields].name = p;
		r.fields[r.nfields].value = v;
		r.nfields++;
		p = line_end + 2;
	}

	/* the fields that frame the message, each at most once */
	static const char *const singletons[] = {"host", "content-length", "transfer-encoding", "authorization",
	                                         "upgrade", "sec-websocket-key", "sec-websocket-version", "expect"};
	for (size_t i = 0; i < sizeof singletons / sizeof singletons[0]; i++)
		if (count_field(&r, singletons[i]) > 1)
			goto bad;
	if (r.minor == 1 && !spaced_http_field(&r, "host"))
		goto bad;
	const char *cl = spaced_http_field(&r, "content-length"), *te = spaced_http_field(&r, "transfer-encoding");
	if (cl && te)
		goto bad;
	if (te) {
		if (strcasecmp(te, "chunked") != 0) {
			status = list_has(te, "chunked") || strchr(te, ',') ? -400 : -501;
			goto bad;
		}
		if (r.minor == 0)
			goto bad;
		r.body = SPACED_HTTP_BODY_CHUNKED;
	} else if (cl) {
		if (parse_length(cl, &r.content_length) < 0)
			goto bad;
		r.body = r.content_length ? SPACED_HTTP_BODY_LENGTH : SPACED_HTTP_BODY_NONE;
	}
	const char *conn = spaced_http_field(&r, "connection");
	r.keep_alive = r.minor == 1 ? !(conn && list_has(conn, "close")) : (conn && list_has(conn, "keep-alive"));
	const char *expect = spaced_http_field(&r, "expect");
	if (expect) {
		if (strcasecmp(expect, "100-continue") != 0) {
			status = -417;
			goto bad;
		}
		r.expect_continue = r.minor == 1;
	}
	const char *upg = spaced_http_field(&r, "upgrade");
	if (upg && list_has(upg, "websocket")) {
		const char *key = spaced_http_field(&r, "sec-websocket-key");
		const char *wv = spaced_http_field(&r, "sec-websocket-version");
		if (strcmp(r.method, "GET") != 0 || r.minor != 1 || !conn || !list_has(conn, "upgrade") || !key ||
		    !ws_key_ok(key) || !wv || strcmp(wv, "13") != 0 || r.body != SPACED_HTTP_BODY_NONE)
			goto bad;
		r.websocket = true;
		r.ws_key = key;
	}
	*req = r;
	return (int)end;
bad:
	free(r.head);
	return status;
}

/* ---- bodies ---- */

enum { CH_SIZE, CH_SIZE_LF, CH_DATA, CH_DATA_CR, CH_DATA_LF, CH_LAST_CR, CH_LAST_LF, CH_DONE };

int spaced_http_body_start(struct spaced_http_body *b, const struct spaced_http_req *req, uint64_t max)
{
	memset(b, 0, sizeof *b);
	b->kind = req->body;
	b->max = max;
	if (req->body == SPACED_HTTP_BODY_LENGTH) {
		if (req->content_length > max)
			return -413;
		b->left = req->content_length;
	}
	b->done = req->body == SPACED_HTTP_BODY_NONE;
	b->state = CH_SIZE;
	return 0;
}

static int hexval(uint8_t c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

long spaced_http_body_feed(struct spaced_http_body *b, const uint8_t *in, size_t n, const uint8_t **data,
                           size_t *dlen)
{
	*data = in;
	*dlen = 0;
	if (b->done || n == 0)
		return 0;
	if (b->kind == SPACED_HTTP_BODY_LENGTH) {
		size_t k = n < b->left ? n : (size_t)b->left;
		b->left -= k;
		b->total += k;
		b->done = b->left == 0;
		*dlen = k;
		return (long)k;
	}
	size_t i = 0;
	while (i < n && !b->done) {
		uint8_t c = in[i];
		switch (b->state) {
		case CH_SIZE: {
			int h = hexval(c);
			if (h >= 0) {
				if (b->digits == 15)
					return -400; /* over 60 bits */
				b->left = b->left * 16 + (uint64_t)h;
				b->digits++;
				i++;
				break;
			}
			if (c != '\r' || b->digits == 0)
				return -400; /* no extensions, no white space */
			b->state = CH_SIZE_LF;
			i++;
			break;
		}
		case CH_SIZE_LF:
			if (c != '\n')
				return -400;
			i++;
			b->digits = 0;
			if (b->left == 0) {
				b->state = CH_LAST_CR;
			} else {
				if (b->total + b->left > b->max)
					return -413;
				b->state = CH_DATA;
			}
			break;
		case CH_DATA: {
			/* the data is handed over as soon as it is here: one slice a call */
			size_t k = n - i < b->left ? n - i : (size_t)b->left;
			*data = in + i;
			*dlen = k;
			b->left -= k;
			b->total += k;
			i += k;
			if (b->left == 0)
				b->state = CH_DATA_CR;
			return (long)i;
		}
		case CH_DATA_CR:
			if (c != '\r')
				return -400;
			b->state = CH_DATA_LF;
			i++;
			break;
		case CH_DATA_LF:
			if (c != '\n')
				return -400;
			b->state = CH_SIZE;
			i++;
			break;
		case CH_LAST_CR:
			if (c != '\r')
				return -400; /* trailer fields are not taken */
			b->state = CH_LAST_LF;
			i++;
			break;
		case CH_LAST_LF:
			if (c != '\n')
				return -400;
			b->state = CH_DONE;
			b->done = true;
			i++;
			break;
		default:
			return -400;
		}
	}
	return (long)i;
}

const char *spaced_http_reason(int status)
{
	switch (status) {
	case 100: return "Continue";
	case 101: return "Switching Protocols";
	case 200: return "OK";
	case 201: return "Created";
	case 202: return "Accepted";
	case 204: return "No Content";
	case 301: return "Moved Permanently";
	case 302: return "Found";
	case 303: return "See Other";
	case 304: return "Not Modified";
	case 307: return "Temporary Redirect";
	case 308: return "Permanent Redirect";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 409: return "Conflict";
	case 411: return "Length Required";
	case 413: return "Content Too Large";
	case 414: return "URI Too Long";
	case 417: return "Expectation Failed";
	case 422: return "Unprocessable Content";
	case 426: return "Upgrade Required";
	case 429: return "Too Many Requests";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 501: return "Not Implemented";
	case 502: return "Bad Gateway";
	case 503: return "Service Unavailable";
	case 504: return "Gateway Timeout";
	case 505: return "HTTP Version Not Supported";
	default: return "Unknown";
	}
}
