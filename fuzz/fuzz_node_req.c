/*
 * fuzz_node_req.c — node-api's request parsing (node_req.c): query splitting
 * and decoding, endpoint and parameter parsing for HTTP and WebSocket, the
 * exec JSON body, the Authorization header.
 *
 * Input: byte 0 = method (mod 4), byte 1 = WebSocket flag (low bit), then
 * "path\nquery\nbody" (missing parts are empty).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "node.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	enum node_method method = (enum node_method)(1 + data[0] % 4);
	bool ws = data[1] & 1;
	const char *p = (const char *)data + 2;
	size_t n = size - 2;

	const char *tok;
	size_t toklen;
	(void)node_bearer(p, n, &tok, &toklen);

	const char *nl1 = memchr(p, '\n', n);
	size_t plen = nl1 ? (size_t)(nl1 - p) : n;
	const char *q = nl1 ? nl1 + 1 : p + n;
	size_t qrest = (size_t)((const char *)data + size - q);
	const char *nl2 = memchr(q, '\n', qrest);
	size_t qlen = nl2 ? (size_t)(nl2 - q) : qrest;
	const char *body = nl2 ? nl2 + 1 : q + qlen;
	size_t blen = (size_t)((const char *)data + size - body);

	char *path = malloc(plen + 1);
	char *store = malloc(NODE_QUERY_MAX);
	if (!path || !store)
		goto out;
	memcpy(path, p, plen);
	path[plen] = '\0';
	struct node_query query;
	if (node_query_split(q, qlen, store, NODE_QUERY_MAX, &query) < 0)
		goto out;
	struct node_req req;
	if (node_req_parse(&req, method, path, &query, ws) < 0)
		goto out;
	if (req.body == NODE_BODY_EXEC) {
		void *keep = NULL;
		const char *in;
		size_t inlen;
		if (node_req_exec_body(&req, body, blen, &keep, &in, &inlen) == 0) {
			if (in && inlen)
				(void)in[inlen - 1];
			json_decref(keep);
		}
	}
	(void)spaced_field_validate(req.payload.data, req.payload.len);
	node_req_clear(&req);
out:
	free(path);
	free(store);
	return 0;
}
