/*
 * http.h — a strict HTTP/1.1 request parser and body decoder (RFC 9112),
 * without I/O: bytes in, a parsed request head or a refusal out. Every spaced
 * server (the control plane, node-api, the ServicePort gateway) parses what
 * clients send with it, through httpsrv.h.
 *
 * Strict means: what is ambiguous is refused, never guessed. A request is
 * refused (with the status to answer, and the connection then closed) when
 *   - a line does not end in CR LF (a bare LF or a bare CR), a header line is
 *     folded, a field name is not a token or has white space before its colon,
 *     any byte is a control character other than HTAB in a value (NUL included);
 *   - the request line is not `METHOD SP /origin-form SP HTTP/1.x` (400; 505
 *     for another HTTP version; 414 for a target over the limit);
 *   - the head is larger than its limit or has too many fields (431);
 *   - Content-Length appears more than once (even with equal values), is not
 *     plain decimal digits or does not fit in 63 bits; Transfer-Encoding comes
 *     with Content-Length, more than once, or is anything but `chunked` (501
 *     for other codings); Host is missing (HTTP/1.1) or repeated (400);
 *   - Expect is anything but `100-continue` (417).
 * Chunked bodies are decoded strictly too: hex sizes without sign, spaces or
 * extensions, CR LF after each chunk, no trailer fields.
 */
#ifndef SPACED_HTTP_H
#define SPACED_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SPACED_HTTP_FIELDS_MAX 128

struct spaced_http_limits {
	size_t head_max;     /* request line + fields + CRLFs; 431 past it */
	size_t target_max;   /* the request target; 414 past it */
	unsigned fields_max; /* number of header fields; 431 past it */
};

enum spaced_http_body_kind { SPACED_HTTP_BODY_NONE = 0, SPACED_HTTP_BODY_LENGTH, SPACED_HTTP_BODY_CHUNKED };

struct spaced_http_field {
	const char *name;  /* lower case, NUL-terminated (points into the request's copy of its head) */
	const char *value; /* without surrounding white space, NUL-terminated */
};

struct spaced_http_req {
	char *head;          /* the request's own copy of its head (owned; spaced_http_req_clear frees it) */
	const char *method;  /* as sent (methods are case-sensitive) */
	const char *target;  /* origin-form: path and query, as sent */
	int minor;           /* HTTP/1.<minor>: 0 or 1 */
	struct spaced_http_field fields[SPACED_HTTP_FIELDS_MAX];
	unsigned nfields;
	enum spaced_http_body_kind body;
	uint64_t content_length; /* SPACED_HTTP_BODY_LENGTH */
	bool keep_alive;     /* the connection may carry another request after this one */
	bool expect_continue;
	bool websocket;      /* a valid WebSocket upgrade (GET, Upgrade: websocket,
	                      * Connection: upgrade, version 13, a 16-byte key) */
	const char *ws_key;
};

/* Parses the head at the start of in[0..n). Returns the head's length (> 0)
 * when it is complete and valid, with *req filled (release it with
 * spaced_http_req_clear); 0 when more bytes are needed (and none of the bytes
 * so far is wrong, nor over a limit); or -status (-400, -414, -417, -431,
 * -501, -505) when the request must be refused. */
int spaced_http_parse_head(const uint8_t *in, size_t n, const struct spaced_http_limits *lim,
                           struct spaced_http_req *req);

/* Frees what a parsed request owns; accepts a cleared one. */
void spaced_http_req_clear(struct spaced_http_req *req);

/* The value of the first field called name (lower case), or NULL. */
const char *spaced_http_field(const struct spaced_http_req *req, const char *name);

/* A body being read. */
struct spaced_http_body {
	enum spaced_http_body_kind kind;
	uint64_t left;   /* bytes left of the body (LENGTH) or of the current chunk */
	uint64_t total;  /* bytes of content so far */
	uint64_t max;    /* more content than this is refused (413) */
	int state;       /* the chunked decoder's */
	unsigned digits;
	bool done;
};

/* Starts reading the body of req; max bounds its content. Returns 0 or
 * -413 when its Content-Length is over max already. */
int spaced_http_body_start(struct spaced_http_body *b, const struct spaced_http_req *req, uint64_t max);

/* Consumes bytes of in[0..n): returns how many (*data / *dlen: the content
 * among them, a slice of in, possibly empty). Call again with the rest while
 * bytes remain and !b->done. Returns -400 (malformed chunking) or -413 (over
 * max). */
long spaced_http_body_feed(struct spaced_http_body *b, const uint8_t *in, size_t n, const uint8_t **data,
                           size_t *dlen);

/* The reason phrase of a status code ("Not Found"); "Unknown" for others. */
const char *spaced_http_reason(int status);

#endif
