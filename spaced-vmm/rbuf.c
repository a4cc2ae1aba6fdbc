/*
 * rbuf.c — bounded byte ring (see rbuf.h).
 */
#include "rbuf.h"

#include <stdlib.h>
#include <string.h>

#include "spaced_error.h"

void vmm_rbuf_init(struct vmm_rbuf *r, size_t cap)
{
	r->data = NULL;
	r->cap = cap;
	r->head = 0;
	r->len = 0;
}

size_t vmm_rbuf_room(const struct vmm_rbuf *r)
{
	return r->cap - r->len;
}

static int rbuf_alloc(struct vmm_rbuf *r)
{
	if (r->data)
		return 0;
	r->data = malloc(r->cap);
	if (!r->data)
		return SPACED_ENOMEM;
	r->head = 0;
	return 0;
}

int vmm_rbuf_free_iov(struct vmm_rbuf *r, struct iovec iov[2])
{
	size_t tail, first;
	int rc = rbuf_alloc(r);

	if (rc < 0)
		return rc;
	if (r->len == r->cap)
		return 0;
	tail = (r->head + r->len) % r->cap;
	first = tail >= r->head && r->len < r->cap ? r->cap - tail : r->head - tail;
	if (r->len == 0) {
		/* empty: restart at 0 so the space is one piece */
		r->head = 0;
		tail = 0;
		first = r->cap;
	}
	iov[0].iov_base = r->data + tail;
	iov[0].iov_len = first;
	if (first == r->cap - r->len)
		return 1;
	iov[1].iov_base = r->data;
	iov[1].iov_len = r->cap - r->len - first;
	return 2;
}

void vmm_rbuf_commit(struct vmm_rbuf *r, size_t n)
{
	r->len += n;
}

int vmm_rbuf_put(struct vmm_rbuf *r, const void *p, size_t n)
{
	struct iovec iov[2];
	const uint8_t *src = p;
	int cnt;

	if (n > vmm_rbuf_room(r))
		return SPACED_ETOOBIG;
	if (n == 0)
		return 0;
	cnt = vmm_rbuf_free_iov(r, iov);
	if (cnt < 0)
		return cnt;
	for (int i = 0; i < cnt && n > 0; i++) {
		size_t k = n < iov[i].iov_len ? n : iov[i].iov_len;

		memcpy(iov[i].iov_base, src, k);
		src += k;
		n -= k;
		vmm_rbuf_commit(r, k);
	}
	return 0;
}

int vmm_rbuf_data_iov(const struct vmm_rbuf *r, struct iovec iov[2])
{
	size_t first;

	if (r->len == 0)
		return 0;
	first = r->cap - r->head;
	if (first >= r->len) {
		iov[0].iov_base = r->data + r->head;
		iov[0].iov_len = r->len;
		return 1;
	}
	iov[0].iov_base = r->data + r->head;
	iov[0].iov_len = first;
	iov[1].iov_base = r->data;
	iov[1].iov_len = r->len - first;
	return 2;
}

size_t vmm_rbuf_peek(const struct vmm_rbuf *r, void *out, size_t n)
{
	struct iovec iov[2];
	uint8_t *dst = out;
	size_t done = 0;
	int cnt = vmm_rbuf_data_iov(r, iov);

	for (int i = 0; i < cnt && done < n; i++) {
		size_t k = n - done < iov[i].iov_len ? n - done : iov[i].iov_len;

		memcpy(dst + done, iov[i].iov_base, k);
		done += k;
	}
	return done;
}

void vmm_rbuf_consume(struct vmm_rbuf *r, size_t n)
{
	if (n >= r->len) {
		r->head = 0;
		r->len = 0;
		return;
	}
	r->head = (r->head + n) % r->cap;
	r->len -= n;
}

void vmm_rbuf_clear(struct vmm_rbuf *r)
{
	free(r->data);
	r->data = NULL;
	r->head = 0;
	r->len = 0;
}
