/*
 * fetch.c — what a worker fetches from the control plane's store and sends
 * to it (docs/templates.md, "The store"), with libcurl, in the executor's
 * job children: resumable downloads (a cut transfer goes on with Range from
 * where the partial file ends), uploads from a file. Every request carries
 * the worker key (STATE/worker.key); what is fetched is checked by its
 * caller against the hash it was given, never trusted for its source.
 */
#include "fetch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>
#include <sodium.h>

#include "spaced_error.h"
#include "frame.h"
#include "pace.h"
#include "node.h"
#include "util.h"

#define KEY_MAX 256
#define ATTEMPTS 4

/* "Authorization: Bearer <worker key>" (or without a key file, none). */
static int auth_header(const char *state_dir, char *out, size_t outsz)
{
	char path[4200], key[KEY_MAX];
	snprintf(path, sizeof path, "%s/worker.key", state_dir);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return SPACED_ENOENT;
	ssize_t n = read(fd, key, sizeof key - 1);
	close(fd);
	if (n <= 0)
		return SPACED_EIO;
	key[n] = 0;
	key[strcspn(key, "\r\n")] = 0;
	snprintf(out, outsz, "Authorization: Bearer %s", key);
	sodium_memzero(key, sizeof key);
	return 0;
}

struct sink {
	int fd;
	uint64_t written, max;
	bool restart; /* the server ignored the range: start over */
	bool over;
	struct spaced_pace pace; /* written behind: a blob of gigabytes never sits
	                          * dirty for the sandboxes' disks to wait behind */
};

static size_t on_data(char *p, size_t sz, size_t n, void *arg)
{
	struct sink *s = arg;
	size_t len = sz * n;
	if (s->written + len > s->max) {
		s->over = true;
		return 0;
	}
	if (spaced_io_write_full(s->fd, p, len) < 0)
		return 0;
	spaced_pace_wrote(&s->pace, s->fd, (off_t)s->written, len);
	s->written += len;
	return len;
}

static CURL *easy(const struct mgr_config *cfg, const char *url, struct curl_slist *hd)
{
	CURL *h = curl_easy_init();
	if (!h)
		return NULL;
	/* https: the chain and the name are verified (curl's defaults, never
	 * turned off); the worker's certificate for mutual TLS */
	if (cfg->tls_ca)
		curl_easy_setopt(h, CURLOPT_CAINFO, cfg->tls_ca);
	if (cfg->tls_client_cert && cfg->tls_client_key) {
		curl_easy_setopt(h, CURLOPT_SSLCERT, cfg->tls_client_cert);
		curl_easy_setopt(h, CURLOPT_SSLKEY, cfg->tls_client_key);
	}
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
	/* a stalled transfer is cut and resumed, however large the blob */
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 30L);
	return h;
}

int fetch_blob(const struct mgr_config *cfg, const char *url, const char *dst, uint64_t max, char *why,
               size_t whysz)
{
	char auth[KEY_MAX + 32];
	int r = auth_header(cfg->state_dir, auth, sizeof auth);
	if (r < 0) {
		spaced_why(why, whysz, "no worker key to fetch %s with", url);
		return r;
	}
	if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0) {
		spaced_why(why, whysz, "not an http(s) URL: %.200s", url);
		return SPACED_EINVAL;
	}
	struct curl_slist *hd = curl_slist_append(NULL, auth);
	int fd = open(dst, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	r = SPACED_EIO;
	if (fd < 0 || !hd) {
		spaced_why(why, whysz, "%s: %s", dst, strerror(errno));
		goto out;
	}
	for (int attempt = 0; attempt < ATTEMPTS; attempt++) {
		struct stat sb;
		if (fstat(fd, &sb) < 0)
			break;
		uint64_t have = (uint64_t)sb.st_size;
		if (lseek(fd, 0, SEEK_END) < 0)
			break;
		struct sink s = {.fd = fd, .written = have, .max = max};
		spaced_pace_init(&s.pace, 0, false);
		CURL *h = easy(cfg, url, hd);
		if (!h)
			break;
		curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
		curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
		if (have > 0)
			curl_easy_setopt(h, CURLOPT_RESUME_FROM_LARGE, (curl_off_t)have);
		CURLcode cc = curl_easy_perform(h);
		spaced_pace_end(&s.pace);
		long status = 0;
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
		curl_easy_cleanup(h);
		if (s.over) {
			spaced_why(why, whysz, "%.200s is larger than %llu bytes", url, (unsigned long long)max);
			r = SPACED_ETOOBIG;
			goto out;
		}
		if (cc == CURLE_OK && (status == 200 || status == 206)) {
			if (have > 0 && status == 200) {
				/* the store answered the whole blob: keep only that */
				if (ftruncate(fd, 0) < 0)
					break;
				continue;
			}
			if (fsync(fd) < 0)
				break;
			r = 0;
			goto out;
		}
		if (cc == CURLE_OK && status == 416 && have > 0) {
			/* the partial file is already whole (or longer: start over) */
			if (ftruncate(fd, 0) < 0)
				break;
			continue;
		}
		if (cc == CURLE_OK && (status == 404 || status == 401 || status == 403)) {
			spaced_why(why, whysz, "%.200s: HTTP %ld", url, status);
			r = status == 404 ? SPACED_ENOENT : SPACED_EPERM;
			goto out;
		}
		spaced_why(why, whysz, "%.200s: %s (HTTP %ld)", url, curl_easy_strerror(cc), status);
		/* cut: try again from where it ended */
	}
out:
	if (fd >= 0)
		close(fd);
	curl_slist_free_all(hd);
	return r;
}

static size_t discard(char *p, size_t sz, size_t n, void *arg)
{
	struct spaced_buf *b = arg;
	(void)spaced_buf_append(b, p, sz * n);
	return sz * n;
}

/* The upload's body: what the producer writes into the pipe, then its verdict. */
struct source {
	int fd;
	int (*ended)(void *arg, char *why, size_t whysz);
	void *arg;
	int status;
	char *why;
	size_t whysz;
};

static size_t on_read(char *buf, size_t sz, size_t n, void *arg)
{
	struct source *s = arg;
	for (;;) {
		ssize_t got = read(s->fd, buf, sz * n);
		if (got > 0)
			return (size_t)got;
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			s->status = SPACED_EIO;
			spaced_why(s->why, s->whysz, "reading the archive: %s", strerror(errno));
			return CURL_READFUNC_ABORT;
		}
		/* its end: a producer that failed makes the transfer fail, so the
		 * store never takes a cut archive as a whole one */
		s->status = s->ended(s->arg, s->why, s->whysz);
		return s->status < 0 ? CURL_READFUNC_ABORT : 0;
	}
}

int fetch_upload_stream(const struct mgr_config *cfg, const char *url, int fd,
                        int (*ended)(void *arg, char *why, size_t whysz), void *arg, char *why, size_t whysz)
{
	char auth[KEY_MAX + 32];
	int r = auth_header(cfg->state_dir, auth, sizeof auth);
	if (r < 0) {
		spaced_why(why, whysz, "no worker key to upload with");
		return r;
	}
	if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0) {
		spaced_why(why, whysz, "not an http(s) URL: %.200s", url);
		return SPACED_EINVAL;
	}
	struct source src = {.fd = fd, .ended = ended, .arg = arg, .why = why, .whysz = whysz};
	struct curl_slist *hd = curl_slist_append(NULL, auth);
	hd = curl_slist_append(hd, "Content-Type: application/octet-stream");
	hd = curl_slist_append(hd, "Transfer-Encoding: chunked");
	hd = curl_slist_append(hd, "Expect:");
	struct spaced_buf ans;
	spaced_buf_init(&ans, 64 * 1024);
	CURL *h = easy(cfg, url, hd);
	r = SPACED_EIO;
	if (h) {
		curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
		curl_easy_setopt(h, CURLOPT_READDATA, &src);
		curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
		curl_easy_setopt(h, CURLOPT_WRITEDATA, &ans);
		CURLcode cc = curl_easy_perform(h);
		long status = 0;
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
		if (src.status < 0)
			r = src.status; /* why: the producer's */
		else if (cc == CURLE_OK && status == 201)
			r = 0;
		else
			spaced_why(why, whysz, "upload to %.200s: %s (HTTP %ld)", url, curl_easy_strerror(cc), status);
		curl_easy_cleanup(h);
	}
	spaced_buf_free(&ans);
	curl_slist_free_all(hd);
	return r;
}
