/*
 * http_client.h — a minimal blocking HTTP/1.1 client for spacectl's control
 * plane commands: one request per connection (Connection: close), http:// only,
 * JSON bodies, answers up to 16 MiB.
 */
#ifndef SPACECTL_HTTP_CLIENT_H
#define SPACECTL_HTTP_CLIENT_H

#include <stddef.h>

#define HTTP_RESPONSE_MAX (16u << 20)

/* Sends METHOD base_url+path with an optional bearer key and JSON body, and
 * waits for the whole answer. On success *status holds the HTTP status and
 * *body a new NUL-terminated string (free() it; may be empty).
 * Returns 0, or -1 with a reason in err (errsz bytes) for a malformed URL, a
 * connection failure, a timeout or a malformed answer. */
int http_request(const char *base_url, const char *method, const char *path, const char *bearer,
                 const char *json_body, int *status, char **body, char *err, size_t errsz);

#endif
