/* frame.c — length-prefixed frames and typed fields (see frame.h). */
#include "frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "spaced_error.h"

static void put_le16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

void spaced_frame_hdr_encode(uint8_t out[SPACED_FRAME_HDR_LEN], const struct spaced_frame_hdr *h)
{
	put_le32(out, h->len);
	put_le16(out + 4, h->type);
	put_le16(out + 6, h->flags);
	put_le32(out + 8, h->id);
}

int spaced_frame_hdr_decode(struct spaced_frame_hdr *out, const uint8_t in[SPACED_FRAME_HDR_LEN],
                            uint32_t max)
{
	struct spaced_frame_hdr h;
	h.len = get_le32(in);
	h.type = get_le16(in + 4);
	h.flags = get_le16(in + 6);
	h.id = get_le32(in + 8);
	if (h.len > max || h.len > SPACED_FRAME_MAX)
		return SPACED_ETOOBIG;
	if (h.flags & ~SPACED_FRAME_F_KNOWN)
		return SPACED_EPROTO;
	*out = h;
	return SPACED_OK;
}

int spaced_frame_append(struct spaced_buf *out, uint16_t type, uint16_t flags, uint32_t id,
                        const void *payload, size_t len)
{
	return spaced_frame_append2(out, type, flags, id, payload, len, NULL, 0);
}

int spaced_frame_append2(struct spaced_buf *out, uint16_t type, uint16_t flags, uint32_t id, const void *head,
                         size_t hlen, const void *tail, size_t tlen)
{
	if (hlen > SPACED_FRAME_MAX || tlen > SPACED_FRAME_MAX - hlen)
		return SPACED_ETOOBIG;
	size_t len = hlen + tlen;
	struct spaced_frame_hdr h = {.len = (uint32_t)len, .type = type, .flags = flags, .id = id};
	uint8_t hb[SPACED_FRAME_HDR_LEN];
	spaced_frame_hdr_encode(hb, &h);
	int r = spaced_buf_reserve(out, sizeof hb + len);
	if (r < 0)
		return r;
	(void)spaced_buf_append(out, hb, sizeof hb);
	(void)spaced_buf_append(out, head, hlen);
	return spaced_buf_append(out, tail, tlen);
}

int spaced_frame_parse(const uint8_t *in, size_t n, uint32_t max, struct spaced_frame_hdr *hdr,
                       const uint8_t **payload, size_t *consumed)
{
	if (n < SPACED_FRAME_HDR_LEN) {
		*consumed = 0;
		return SPACED_OK;
	}
	struct spaced_frame_hdr h;
	int r = spaced_frame_hdr_decode(&h, in, max);
	if (r < 0)
		return r;
	if (n - SPACED_FRAME_HDR_LEN < h.len) {
		*consumed = 0;
		return SPACED_OK;
	}
	*hdr = h;
	*payload = in + SPACED_FRAME_HDR_LEN;
	*consumed = SPACED_FRAME_HDR_LEN + (size_t)h.len;
	return SPACED_OK;
}

int spaced_io_read_full(int fd, void *p, size_t n)
{
	uint8_t *b = p;
	size_t got = 0;
	while (got < n) {
		ssize_t k = read(fd, b + got, n - got);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return SPACED_EIO;
		}
		if (k == 0)
			return got == 0 ? SPACED_ECLOSED : SPACED_EPROTO;
		got += (size_t)k;
	}
	return SPACED_OK;
}

int spaced_io_write_full(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;
	size_t done = 0;
	while (done < n) {
		ssize_t k = send(fd, b + done, n - done, MSG_NOSIGNAL);
		if (k < 0 && errno == ENOTSOCK)
			k = write(fd, b + done, n - done);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return SPACED_EIO;
		}
		done += (size_t)k;
	}
	return SPACED_OK;
}

int spaced_io_pwrite_full(int fd, const void *p, size_t n, uint64_t off)
{
	const uint8_t *b = p;
	while (n > 0) {
		ssize_t k = pwrite(fd, b, n, (off_t)off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			if (k == 0)
				errno = EIO;
			return SPACED_EIO;
		}
		b += k;
		n -= (size_t)k;
		off += (uint64_t)k;
	}
	return SPACED_OK;
}

int spaced_frame_send(int fd, uint16_t type, uint16_t flags, uint32_t id, const void *payload,
                      size_t len)
{
	if (len > SPACED_FRAME_MAX)
		return SPACED_ETOOBIG;
	struct spaced_frame_hdr h = {.len = (uint32_t)len, .type = type, .flags = flags, .id = id};
	uint8_t hb[SPACED_FRAME_HDR_LEN];
	spaced_frame_hdr_encode(hb, &h);
	struct iovec iov[2] = {
		{.iov_base = hb, .iov_len = sizeof hb},
		{.iov_base = (void *)(uintptr_t)payload, .iov_len = len},
	};
	struct iovec *v = iov;
	int cnt = len ? 2 : 1;
	while (cnt > 0) {
		struct msghdr mh = {.msg_iov = v, .msg_iovlen = (size_t)cnt};
		ssize_t k = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (k < 0 && errno == ENOTSOCK)
			k = writev(fd, v, cnt);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return SPACED_EIO;
		}
		size_t adv = (size_t)k;
		while (cnt > 0 && adv >= v->iov_len) {
			adv -= v->iov_len;
			v++;
			cnt--;
		}
		if (cnt > 0) {
			v->iov_base = (uint8_t *)v->iov_base + adv;
			v->iov_len -= adv;
		}
	}
	return SPACED_OK;
}

int spaced_frame_recv(int fd, uint32_t max, struct spaced_frame_hdr *hdr, uint8_t **payload)
{
	uint8_t hb[SPACED_FRAME_HDR_LEN];
	struct spaced_frame_hdr h;
	uint8_t *p = NULL;
	int r = spaced_io_read_full(fd, hb, sizeof hb);
	if (r < 0)
		return r;
	r = spaced_frame_hdr_decode(&h, hb, max);
	if (r < 0)
		return r;
	if (h.len > 0) {
		p = malloc(h.len);
		if (p == NULL)
			return SPACED_ENOMEM;
		r = spaced_io_read_full(fd, p, h.len);
		if (r < 0) {
			free(p);
			return r == SPACED_ECLOSED ? SPACED_EPROTO : r;
		}
	}
	*hdr = h;
	*payload = p;
	return SPACED_OK;
}

int spaced_frame_dispatch(const struct spaced_frame_handler *table, size_t n, void *ctx,
                          const struct spaced_frame_hdr *hdr, const uint8_t *payload, size_t len)
{
	for (size_t i = 0; i < n; i++)
		if (table[i].type == hdr->type)
			return table[i].fn(ctx, hdr, payload, len);
	return SPACED_EPROTO;
}

/* ---- fields ---- */

int spaced_field_put_u64(struct spaced_buf *b, uint64_t v)
{
	uint8_t t = SPACED_FIELD_U64;
	int r = spaced_buf_reserve(b, 9);
	if (r < 0)
		return r;
	(void)spaced_buf_append(b, &t, 1);
	return spaced_buf_put_le64(b, v);
}

int spaced_field_put_i64(struct spaced_buf *b, int64_t v)
{
	uint8_t t = SPACED_FIELD_I64;
	int r = spaced_buf_reserve(b, 9);
	if (r < 0)
		return r;
	(void)spaced_buf_append(b, &t, 1);
	return spaced_buf_put_le64(b, (uint64_t)v);
}

static int put_lv(struct spaced_buf *b, uint8_t kind, const void *p, size_t n)
{
	if (n > UINT32_MAX)
		return SPACED_ETOOBIG;
	uint8_t h[5];
	h[0] = kind;
	put_le32(h + 1, (uint32_t)n);
	int r = spaced_buf_reserve(b, sizeof h + n);
	if (r < 0)
		return r;
	(void)spaced_buf_append(b, h, sizeof h);
	return spaced_buf_append(b, p, n);
}

int spaced_field_put_strn(struct spaced_buf *b, const char *s, size_t n)
{
	if (n > SPACED_FIELD_STR_MAX)
		return SPACED_ETOOBIG;
	if (n > 0 && memchr(s, 0, n) != NULL)
		return SPACED_EINVAL;
	return put_lv(b, SPACED_FIELD_STR, s, n);
}

int spaced_field_put_str(struct spaced_buf *b, const char *s)
{
	return spaced_field_put_strn(b, s, strlen(s));
}

int spaced_field_put_bytes(struct spaced_buf *b, const void *p, size_t n)
{
	return put_lv(b, SPACED_FIELD_BYTES, p, n);
}

int spaced_field_put_bytes_head(struct spaced_buf *b, size_t n)
{
	if (n > UINT32_MAX)
		return SPACED_ETOOBIG;
	uint8_t h[5];
	h[0] = SPACED_FIELD_BYTES;
	put_le32(h + 1, (uint32_t)n);
	return spaced_buf_append(b, h, sizeof h);
}

void spaced_field_reader_init(struct spaced_field_reader *r, const void *p, size_t len)
{
	r->p = p;
	r->len = len;
	r->off = 0;
	r->err = 0;
}

static int fail(struct spaced_field_reader *r, int err)
{
	if (r->err == 0)
		r->err = err;
	return r->err;
}

static int get_fixed(struct spaced_field_reader *r, uint8_t kind, uint64_t *out)
{
	if (r->err)
		return r->err;
	if (r->len - r->off < 9 || r->p[r->off] != kind)
		return fail(r, SPACED_EPROTO);
	*out = get_le64(r->p + r->off + 1);
	r->off += 9;
	return SPACED_OK;
}

int spaced_field_get_u64(struct spaced_field_reader *r, uint64_t *out)
{
	uint64_t v;
	int e = get_fixed(r, SPACED_FIELD_U64, &v);
	if (e == 0)
		*out = v;
	return e;
}

int spaced_field_get_i64(struct spaced_field_reader *r, int64_t *out)
{
	uint64_t v;
	int e = get_fixed(r, SPACED_FIELD_I64, &v);
	if (e == 0)
		*out = (int64_t)v;
	return e;
}

static int get_lv(struct spaced_field_reader *r, uint8_t kind, const uint8_t **p, size_t *n)
{
	if (r->err)
		return r->err;
	if (r->len - r->off < 5 || r->p[r->off] != kind)
		return fail(r, SPACED_EPROTO);
	uint32_t l = get_le32(r->p + r->off + 1);
	if (l > r->len - r->off - 5)
		return fail(r, SPACED_EPROTO);
	const uint8_t *v = r->p + r->off + 5;
	if (kind == SPACED_FIELD_STR && (l > SPACED_FIELD_STR_MAX || memchr(v, 0, l) != NULL))
		return fail(r, SPACED_EPROTO);
	r->off += 5 + (size_t)l;
	*p = v;
	*n = l;
	return SPACED_OK;
}

int spaced_field_get_str(struct spaced_field_reader *r, const char **s, size_t *n)
{
	const uint8_t *p;
	size_t l;
	int e = get_lv(r, SPACED_FIELD_STR, &p, &l);
	if (e == 0) {
		*s = (const char *)p;
		*n = l;
	}
	return e;
}

int spaced_field_get_strdup(struct spaced_field_reader *r, size_t max, char **out)
{
	const char *s;
	size_t n;
	int e = spaced_field_get_str(r, &s, &n);
	if (e < 0)
		return e;
	if (n > max)
		return fail(r, SPACED_ETOOBIG);
	char *c = malloc(n + 1);
	if (c == NULL)
		return fail(r, SPACED_ENOMEM);
	memcpy(c, s, n);
	c[n] = 0;
	*out = c;
	return SPACED_OK;
}

int spaced_field_get_strbuf(struct spaced_field_reader *r, char *out, size_t outsz)
{
	const char *s;
	size_t n;
	int e = spaced_field_get_str(r, &s, &n);
	if (e < 0)
		return e;
	if (n >= outsz)
		return fail(r, SPACED_ETOOBIG);
	memcpy(out, s, n);
	out[n] = 0;
	return SPACED_OK;
}

int spaced_field_get_bytes(struct spaced_field_reader *r, const uint8_t **p, size_t *n)
{
	return get_lv(r, SPACED_FIELD_BYTES, p, n);
}

bool spaced_field_more(const struct spaced_field_reader *r)
{
	return r->err == 0 && r->off < r->len;
}

int spaced_field_end(const struct spaced_field_reader *r)
{
	if (r->err)
		return r->err;
	return r->off == r->len ? SPACED_OK : SPACED_EPROTO;
}

int spaced_field_validate(const void *p, size_t len)
{
	struct spaced_field_reader r;
	spaced_field_reader_init(&r, p, len);
	int count = 0;
	while (spaced_field_more(&r)) {
		uint64_t u;
		const uint8_t *b;
		size_t n;
		switch (r.p[r.off]) {
		case SPACED_FIELD_U64:
			(void)spaced_field_get_u64(&r, &u);
			break;
		case SPACED_FIELD_I64:
			(void)get_fixed(&r, SPACED_FIELD_I64, &u);
			break;
		case SPACED_FIELD_STR:
		case SPACED_FIELD_BYTES:
			(void)get_lv(&r, r.p[r.off], &b, &n);
			break;
		default:
			return SPACED_EPROTO;
		}
		if (r.err)
			return r.err;
		if (count == INT32_MAX)
			return SPACED_ETOOBIG;
		count++;
	}
	return count;
}
