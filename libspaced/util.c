/* util.c — bounded buffers, constant-time helpers, base64url and time. */
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <sodium.h>

#include "spaced_error.h"
#include "frame.h"
#include "pace.h"

void spaced_buf_init(struct spaced_buf *b, size_t max)
{
	b->data = NULL;
	b->len = 0;
	b->cap = 0;
	b->max = max;
}

int spaced_buf_reserve(struct spaced_buf *b, size_t extra)
{
	if (extra > b->max || b->len > b->max - extra)
		return SPACED_ETOOBIG;
	size_t need = b->len + extra + 1;
	if (need <= b->cap)
		return SPACED_OK;
	size_t ncap = b->cap ? b->cap : 64;
	while (ncap < need)
		ncap *= 2;
	if (ncap > b->max + 1)
		ncap = b->max + 1;
	uint8_t *n = malloc(ncap);
	if (n == NULL)
		return SPACED_ENOMEM;
	if (b->data != NULL) {
		memcpy(n, b->data, b->len + 1);
		spaced_wipe(b->data, b->cap);
		free(b->data);
	}
	b->data = n;
	b->cap = ncap;
	return SPACED_OK;
}

int spaced_buf_append(struct spaced_buf *b, const void *p, size_t n)
{
	int r = spaced_buf_reserve(b, n);
	if (r < 0)
		return r;
	if (n > 0)
		memcpy(b->data + b->len, p, n);
	b->len += n;
	b->data[b->len] = 0;
	return SPACED_OK;
}

int spaced_buf_puts(struct spaced_buf *b, const char *s)
{
	return spaced_buf_append(b, s, strlen(s));
}

int spaced_buf_put_le64(struct spaced_buf *b, uint64_t v)
{
	uint8_t le[8];
	for (int i = 0; i < 8; i++)
		le[i] = (uint8_t)(v >> (8 * i));
	return spaced_buf_append(b, le, sizeof le);
}

void spaced_buf_free(struct spaced_buf *b)
{
	if (b->data != NULL) {
		spaced_wipe(b->data, b->cap);
		free(b->data);
	}
	b->data = NULL;
	b->len = b->cap = 0;
}

uint8_t *spaced_buf_take(struct spaced_buf *b, size_t *len)
{
	uint8_t *d = b->data;
	if (d == NULL) {
		d = calloc(1, 1);
		if (d == NULL)
			return NULL;
	}
	if (len != NULL)
		*len = b->len;
	b->data = NULL;
	b->len = b->cap = 0;
	return d;
}

bool spaced_ct_eq(const void *a, const void *b, size_t n)
{
	if (n == 0)
		return true;
	return sodium_memcmp(a, b, n) == 0;
}

bool spaced_ct_eq_len(const void *a, size_t alen, const void *b, size_t blen)
{
	if (alen != blen)
		return false;
	return spaced_ct_eq(a, b, alen);
}

uint32_t spaced_fnv1a(const char *s)
{
	uint32_t h = 2166136261u;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		h = (h ^ *p) * 16777619u;
	return h;
}

int spaced_fair_share(size_t in_use, size_t cap, size_t mine, size_t few)
{
	if (in_use < cap / 2)
		return 0;
	if (mine >= cap / 8)
		return 1;
	if (cap / 128 > few)
		few = cap / 128;
	return in_use >= cap - cap / 4 && mine >= few ? 2 : 0;
}

void spaced_wipe(void *p, size_t n)
{
	if (p != NULL && n > 0)
		sodium_memzero(p, n);
}

size_t spaced_b64url_encoded_len(size_t n)
{
	return (n / 3) * 4 + ((n % 3) ? (n % 3) + 1 : 0);
}

size_t spaced_b64url_decoded_max(size_t n)
{
	return (n / 4) * 3 + 3;
}

void spaced_b64url_encode(char *out, const uint8_t *in, size_t n)
{
	sodium_bin2base64(out, spaced_b64url_encoded_len(n) + 1, in, n,
	                  sodium_base64_VARIANT_URLSAFE_NO_PADDING);
}

/* Decoding table for the base64url alphabet: value + 1, and 0 for any other byte. */
static const uint8_t b64url_value[256] = {
	['A'] = 1, ['B'] = 2, ['C'] = 3, ['D'] = 4, ['E'] = 5, ['F'] = 6, ['G'] = 7, ['H'] = 8,
	['I'] = 9, ['J'] = 10, ['K'] = 11, ['L'] = 12, ['M'] = 13, ['N'] = 14, ['O'] = 15, ['P'] = 16,
	['Q'] = 17, ['R'] = 18, ['S'] = 19, ['T'] = 20, ['U'] = 21, ['V'] = 22, ['W'] = 23,
	['X'] = 24, ['Y'] = 25, ['Z'] = 26, ['a'] = 27, ['b'] = 28, ['c'] = 29, ['d'] = 30,
	['e'] = 31, ['f'] = 32, ['g'] = 33, ['h'] = 34, ['i'] = 35, ['j'] = 36, ['k'] = 37,
	['l'] = 38, ['m'] = 39, ['n'] = 40, ['o'] = 41, ['p'] = 42, ['q'] = 43, ['r'] = 44,
	['s'] = 45, ['t'] = 46, ['u'] = 47, ['v'] = 48, ['w'] = 49, ['x'] = 50, ['y'] = 51,
	['z'] = 52, ['0'] = 53, ['1'] = 54, ['2'] = 55, ['3'] = 56, ['4'] = 57, ['5'] = 58,
	['6'] = 59, ['7'] = 60, ['8'] = 61, ['9'] = 62, ['-'] = 63, ['_'] = 64,
};

int spaced_b64url_decode(uint8_t *out, size_t *outlen, const char *in, size_t n)
{
	/* Table-driven and not constant-time: for public data (tokens). Secrets go
	 * through spaced_b64url_decode_secret. */
	const uint8_t *s = (const uint8_t *)in;
	size_t full = n / 4, rem = n % 4, o = 0;
	if (rem == 1)
		return SPACED_EBASE64;
	for (size_t i = 0; i < full; i++, s += 4) {
		uint32_t a = b64url_value[s[0]], b = b64url_value[s[1]], c = b64url_value[s[2]],
		         d = b64url_value[s[3]];
		if (a == 0 || b == 0 || c == 0 || d == 0)
			return SPACED_EBASE64;
		a--, b--, c--, d--;
		uint32_t v = a << 18 | b << 12 | c << 6 | d;
		out[o++] = (uint8_t)(v >> 16);
		out[o++] = (uint8_t)(v >> 8);
		out[o++] = (uint8_t)v;
	}
	if (rem >= 2) {
		uint32_t a = b64url_value[s[0]], b = b64url_value[s[1]];
		uint32_t c = rem == 3 ? b64url_value[s[2]] : 1;
		if (a == 0 || b == 0 || c == 0)
			return SPACED_EBASE64;
		a--, b--, c--;
		/* The unused low bits of the last character must be zero (canonical). */
		if (rem == 2 ? (b & 0x0f) != 0 : (c & 0x03) != 0)
			return SPACED_EBASE64;
		uint32_t v = a << 18 | b << 12 | c << 6;
		out[o++] = (uint8_t)(v >> 16);
		if (rem == 3)
			out[o++] = (uint8_t)(v >> 8);
	}
	*outlen = o;
	return SPACED_OK;
}

int spaced_b64url_decode_secret(uint8_t *out, size_t *outlen, const char *in, size_t n)
{
	size_t got = 0;
	/* libsodium's decoder runs in constant time. With b64_end == NULL it fails
	 * unless every character is consumed, and it rejects non-zero leftover bits
	 * and impossible lengths. */
	if (sodium_base642bin(out, spaced_b64url_decoded_max(n), in, n, NULL, &got, NULL,
	                      sodium_base64_VARIANT_URLSAFE_NO_PADDING) != 0)
		return SPACED_EBASE64;
	*outlen = got;
	return SPACED_OK;
}

/* Days since 1970-01-01 of a proleptic Gregorian date. */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d)
{
	y -= m <= 2;
	const int64_t era = (y >= 0 ? y : y - 399) / 400;
	const unsigned yoe = (unsigned)(y - era * 400);
	const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
	const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + (int64_t)doe - 719468;
}

static int digits(const char *s, size_t n, size_t at, size_t count, unsigned *out)
{
	unsigned v = 0;
	if (at + count > n)
		return -1;
	for (size_t i = at; i < at + count; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (unsigned)(s[i] - '0');
	}
	*out = v;
	return 0;
}

static unsigned days_in_month(unsigned y, unsigned m)
{
	static const unsigned dm[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
	bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
	return (m == 2 && leap) ? 29 : dm[m - 1];
}

int spaced_time_parse(const char *s, size_t n, int64_t *out)
{
	unsigned Y, M, D, h, mi, sec, oh = 0, om = 0;
	if (digits(s, n, 0, 4, &Y) || n < 20 || s[4] != '-' || digits(s, n, 5, 2, &M) ||
	    s[7] != '-' || digits(s, n, 8, 2, &D) || (s[10] != 'T' && s[10] != 't') ||
	    digits(s, n, 11, 2, &h) || s[13] != ':' || digits(s, n, 14, 2, &mi) ||
	    s[16] != ':' || digits(s, n, 17, 2, &sec))
		return SPACED_EFORMAT;
	if (M < 1 || M > 12 || D < 1 || D > days_in_month(Y, M) || h > 23 || mi > 59 || sec > 60)
		return SPACED_EFORMAT;
	size_t i = 19;
	if (i < n && s[i] == '.') {
		size_t start = ++i;
		while (i < n && s[i] >= '0' && s[i] <= '9' && i - start < 9)
			i++;
		if (i == start)
			return SPACED_EFORMAT;
	}
	int sign = 0;
	if (i < n && (s[i] == 'Z' || s[i] == 'z')) {
		i++;
	} else if (i < n && (s[i] == '+' || s[i] == '-')) {
		sign = s[i] == '+' ? 1 : -1;
		if (digits(s, n, i + 1, 2, &oh) || i + 3 >= n || s[i + 3] != ':' ||
		    digits(s, n, i + 4, 2, &om) || oh > 23 || om > 59)
			return SPACED_EFORMAT;
		i += 6;
	} else {
		return SPACED_EFORMAT;
	}
	if (i != n)
		return SPACED_EFORMAT;
	if (sec == 60)
		sec = 59; /* a leap second is read as the second before it */
	int64_t t = days_from_civil(Y, M, D) * 86400 + (int64_t)h * 3600 + mi * 60 + sec;
	t -= sign * ((int64_t)oh * 3600 + (int64_t)om * 60);
	*out = t;
	return SPACED_OK;
}

int spaced_time_format(int64_t t, char out[21])
{
	struct tm tm;
	time_t tt = (time_t)t;
	if (gmtime_r(&tt, &tm) == NULL || tm.tm_year + 1900 < 0 || tm.tm_year + 1900 > 9999)
		return SPACED_EINVAL;
	/* %04d, not strftime's %Y: years before 1000 keep their four digits.
	 * Every field is in range here, so the text is exactly 20 characters. */
	char buf[64];
	snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900, tm.tm_mon + 1,
	         tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
	memcpy(out, buf, 21);
	return SPACED_OK;
}

void spaced_why(char *why, size_t whysz, const char *fmt, ...)
{
	va_list ap;
	if (why == NULL || whysz == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(why, whysz, fmt, ap);
	va_end(ap);
}

void spaced_str_replace(char *s, size_t cap, const char *from, const char *to)
{
	size_t fl = strlen(from), tl = strlen(to);
	if (s == NULL || cap == 0 || fl == 0)
		return;
	for (char *p = strstr(s, from); p; p = strstr(p, from)) {
		size_t at = (size_t)(p - s), rest = strlen(p + fl);
		size_t keep = at + tl < cap - 1 ? (rest < cap - 1 - at - tl ? rest : cap - 1 - at - tl) : 0;
		size_t put = at + tl < cap - 1 ? tl : cap - 1 - at;
		memmove(p + put, p + fl, keep); /* the rest after it, moved (cut at cap) */
		memcpy(p, to, put);
		p[put + keep] = 0;
		p += put;
		if (at + put >= cap - 1)
			break;
	}
}

void spaced_utf8_clean(char *s)
{
	unsigned char *p = (unsigned char *)s;
	while (p && *p) {
		unsigned char c = *p;
		int n = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 && c >= 0xc2 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 && c <= 0xf4 ? 3 : -1;
		bool ok = n >= 0;
		for (int k = 1; ok && k <= n; k++)
			ok = (p[k] & 0xc0) == 0x80;
		/* no overlong three- or four-byte forms, no surrogates, nothing past U+10FFFF */
		if (ok && n == 2)
			ok = !(c == 0xe0 && p[1] < 0xa0) && !(c == 0xed && p[1] >= 0xa0);
		if (ok && n == 3)
			ok = !(c == 0xf0 && p[1] < 0x90) && !(c == 0xf4 && p[1] >= 0x90);
		if (!ok) {
			*p++ = '?';
			continue;
		}
		p += n + 1;
	}
}

int64_t spaced_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec;
}

uint64_t spaced_mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int dir_name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

void spaced_dir_names_free(char **names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

int spaced_dir_names(DIR *d, char ***names_out, size_t *n_out)
{
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	errno = 0;
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) {
			errno = 0;
			continue;
		}
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 32;
			char **nn = realloc(names, nc * sizeof *nn);
			if (nn == NULL)
				goto nomem;
			names = nn;
			cap = nc;
		}
		if ((names[n] = strdup(de->d_name)) == NULL)
			goto nomem;
		n++;
		errno = 0;
	}
	if (errno != 0) {
		spaced_dir_names_free(names, n);
		return SPACED_EIO;
	}
	if (n > 1)
		qsort(names, n, sizeof *names, dir_name_cmp);
	*names_out = names;
	*n_out = n;
	return 0;
nomem:
	spaced_dir_names_free(names, n);
	return SPACED_ENOMEM;
}

int spaced_file_replace(const char *tmp, const char *path, const void *p, size_t n, unsigned mode, bool durable)
{
	/* no O_TRUNC: on ext4, truncating a file that has data makes its close
	 * write it out at once (auto_da_alloc); a prepared file is empty, and a
	 * longer leftover is cut to size below */
	int fd = open(tmp, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, (mode_t)mode);
	if (fd < 0)
		return SPACED_EIO;
	struct stat st;
	bool ok = spaced_io_pwrite_full(fd, p, n, 0) == 0 && fstat(fd, &st) == 0 &&
	          (st.st_size <= (off_t)n || ftruncate(fd, (off_t)n) == 0) && (!durable || fsync(fd) == 0);
	close(fd);
	/* swapped with the old file rather than renamed over it: on ext4 a
	 * rename that replaces a file writes the new one's data out at once
	 * (auto_da_alloc), in the caller's time; the old file, now at tmp, is
	 * the next write's temporary file. A new path, or a file system
	 * without RENAME_EXCHANGE: a plain rename. */
	if (ok && renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_EXCHANGE) == 0)
		return SPACED_OK;
	if (!ok || (errno != ENOENT && errno != EINVAL && errno != ENOSYS) || rename(tmp, path) < 0) {
		unlink(tmp);
		return SPACED_EIO;
	}
	return SPACED_OK;
}

void spaced_file_prepare(const char *tmp, unsigned mode)
{
	int fd = open(tmp, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, (mode_t)mode);
	if (fd >= 0)
		close(fd);
}

void spaced_session_nice(pid_t pid, int nice)
{
	char path[64], text[16];
	snprintf(path, sizeof path, "/proc/%d/autogroup", (int)pid);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	int n = snprintf(text, sizeof text, "%d", nice);
	(void)!write(fd, text, (size_t)n);
	close(fd);
}

int spaced_copy_range(int in, int out, off_t off, off_t len, struct spaced_pace *pace)
{
	off_t ioff = off, ooff = off;
	bool plain = false; /* copy_file_range refused these two files */
	while (len > 0) {
		ssize_t n = -1;
		off_t at = ooff;
		size_t step = pace && len > (off_t)SPACED_PACE_CHUNK ? SPACED_PACE_CHUNK : (size_t)len;
		if (!plain) {
			n = copy_file_range(in, &ioff, out, &ooff, step, 0);
			if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP))
				plain = true;
		}
		if (plain) {
			char buf[65536];
			n = pread(in, buf, step < sizeof buf ? step : sizeof buf, ioff);
			if (n > 0 && spaced_io_pwrite_full(out, buf, (size_t)n, (uint64_t)ooff) < 0)
				return SPACED_ESYS;
			if (n > 0) {
				ioff += n;
				ooff += n;
			}
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return SPACED_ESYS;
		if (n == 0)
			break; /* in ends here */
		spaced_pace_wrote(pace, out, at, (uint64_t)n);
		len -= n;
	}
	return 0;
}

int spaced_open_beneath(int dirfd, const char *path, int flags)
{
	struct open_how how = {.flags = (uint64_t)(flags | O_NOFOLLOW | O_CLOEXEC),
	                       .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
	return (int)syscall(SYS_openat2, dirfd, path, &how, sizeof how);
}
