/* http_client.c — minimal blocking HTTP/1.1 client (see http_client.h). */
#include "http_client.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static int parse_url(const char *url, char *host, size_t hostsz, char *port, size_t portsz, char *prefix,
                     size_t prefixsz)
{
	if (strncmp(url, "http://", 7) != 0)
		return -1;
	const char *h = url + 7, *slash = strchr(h, '/'), *end = slash ? slash : h + strlen(h);
	const char *colon = memchr(h, ':', (size_t)(end - h));
	const char *hend = colon ? colon : end;
	if (hend == h || (size_t)(hend - h) >= hostsz)
		return -1;
	memcpy(host, h, (size_t)(hend - h));
	host[hend - h] = 0;
	if (colon) {
		size_t pl = (size_t)(end - colon - 1);
		if (pl == 0 || pl >= portsz)
			return -1;
		memcpy(port, colon + 1, pl);
		port[pl] = 0;
	} else {
		snprintf(port, portsz, "80");
	}
	snprintf(prefix, prefixsz, "%s", slash ? slash : "");
	size_t n = strlen(prefix);
	if (n > 0 && prefix[n - 1] == '/')
		prefix[n - 1] = 0;
	return 0;
}

static int send_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int http_request(const char *base_url, const char *method, const char *path, const char *bearer,
                 const char *json_body, int *status, char **body, char *err, size_t errsz)
{
	char host[256], port[16], prefix[512];
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
	int fd = -1, r = -1;
	char *req = NULL, *buf = NULL;
	size_t len = 0, cap = 0;
	if (parse_url(base_url, host, sizeof host, port, sizeof port, prefix, sizeof prefix) < 0) {
		snprintf(err, errsz, "SPACED_CP_URL must look like http://HOST:PORT");
		return -1;
	}
	if (getaddrinfo(host, port, &hints, &ai) != 0) {
		snprintf(err, errsz, "cannot resolve %s", host);
		return -1;
	}
	for (struct addrinfo *a = ai; a != NULL; a = a->ai_next) {
		fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
		if (fd < 0)
			continue;
		struct timeval tv = {.tv_sec = 120};
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
		if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
			break;
		close(fd);
		fd = -1;
	}
	if (fd < 0) {
		snprintf(err, errsz, "cannot connect to %s: %s", base_url, strerror(errno));
		goto out;
	}
	size_t blen = json_body ? strlen(json_body) : 0;
	size_t need = strlen(method) + strlen(prefix) + strlen(path) + strlen(host) + (bearer ? strlen(bearer) : 0) + 256;
	req = malloc(need);
	if (req == NULL)
		goto out;
	int n = snprintf(req, need,
	                 "%s %s%s HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\nAccept: application/json\r\n"
	                 "%s%s%sContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
	                 method, prefix, path, host, port, bearer ? "Authorization: Bearer " : "", bearer ? bearer : "",
	                 bearer ? "\r\n" : "", blen);
	if (n < 0 || (size_t)n >= need || send_all(fd, req, (size_t)n) < 0 || (blen && send_all(fd, json_body, blen) < 0)) {
		snprintf(err, errsz, "cannot send the request: %s", strerror(errno));
		goto out;
	}
	for (;;) {
		if (len + 4096 + 1 > cap) {
			if (cap >= HTTP_RESPONSE_MAX) {
				snprintf(err, errsz, "answer larger than %u bytes", HTTP_RESPONSE_MAX);
				goto out;
			}
			size_t ncap = cap ? cap * 2 : 16384;
			char *nb = realloc(buf, ncap);
			if (nb == NULL)
				goto out;
			buf = nb;
			cap = ncap;
		}
		ssize_t got = recv(fd, buf + len, cap - len - 1, 0);
		if (got < 0) {
			if (errno == EINTR)
				continue;
			snprintf(err, errsz, "no answer: %s", strerror(errno));
			goto out;
		}
		if (got == 0)
			break;
		len += (size_t)got;
	}
	if (buf == NULL) {
		snprintf(err, errsz, "empty answer");
		goto out;
	}
	buf[len] = 0;
	int st = 0;
	char *hend = strstr(buf, "\r\n\r\n");
	if (hend == NULL || sscanf(buf, "HTTP/1.%*d %d", &st) != 1 || st < 100 || st > 599) {
		snprintf(err, errsz, "malformed HTTP answer");
		goto out;
	}
	char *content = hend + 4;
	size_t clen = len - (size_t)(content - buf);
	/* honour Content-Length when present */
	for (char *h = strstr(buf, "\r\n"); h != NULL && h < hend; h = strstr(h + 2, "\r\n")) {
		if (strncasecmp(h + 2, "content-length:", 15) == 0) {
			unsigned long cl = strtoul(h + 17, NULL, 10);
			if (cl < clen)
				clen = cl;
		}
	}
	char *out = malloc(clen + 1);
	if (out == NULL)
		goto out;
	memcpy(out, content, clen);
	out[clen] = 0;
	*status = st;
	*body = out;
	r = 0;
out:
	if (fd >= 0)
		close(fd);
	freeaddrinfo(ai);
	free(req);
	free(buf);
	return r;
}
