/*
 * vmm_mem.c — mapped guest memory with checked translation (see vmm_mem.h).
 */
#include "vmm_mem.h"

#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "spaced_error.h"

void vmm_mem_init(struct vmm_mem *m)
{
	memset(m, 0, sizeof(*m));
}

void vmm_mem_clear(struct vmm_mem *m)
{
	for (unsigned i = 0; i < m->n; i++)
		munmap(m->r[i].map, m->r[i].map_len);
	vmm_mem_init(m);
}

static int ranges_overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
	return a < b + blen && b < a + alen;
}

int vmm_mem_set(struct vmm_mem *m, const struct vmm_mem_region_desc *d, unsigned n, const int *fds)
{
	struct vmm_mem nm;
	int rc = 0;

	if (n == 0 || n > VMM_MEM_MAX_REGIONS)
		return SPACED_EINVAL;
	for (unsigned i = 0; i < n; i++) {
		uint64_t end;

		if (d[i].size == 0 || fds[i] < 0 ||
		    __builtin_add_overflow(d[i].gpa, d[i].size, &end) ||
		    __builtin_add_overflow(d[i].uaddr, d[i].size, &end) ||
		    __builtin_add_overflow(d[i].mmap_offset, d[i].size, &end) || end > SIZE_MAX)
			return SPACED_EINVAL;
		for (unsigned j = 0; j < i; j++)
			if (ranges_overlap(d[i].gpa, d[i].size, d[j].gpa, d[j].size) ||
			    ranges_overlap(d[i].uaddr, d[i].size, d[j].uaddr, d[j].size))
				return SPACED_EINVAL;
	}
	for (unsigned i = 0; i < n; i++) {
		struct stat st;

		/* a mapping past the end of the file faults (SIGBUS) when touched */
		if (fstat(fds[i], &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < 0 ||
		    d[i].mmap_offset + d[i].size > (uint64_t)st.st_size)
			return SPACED_EINVAL;
	}
	vmm_mem_init(&nm);
	for (unsigned i = 0; i < n; i++) {
		/* map from offset 0: mmap_offset need not be page aligned */
		size_t len = (size_t)(d[i].mmap_offset + d[i].size);
		void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fds[i], 0);

		if (p == MAP_FAILED) {
			rc = SPACED_ESYS;
			goto out;
		}
		nm.r[i].d = d[i];
		nm.r[i].map = p;
		nm.r[i].map_len = len;
		nm.r[i].base = (uint8_t *)p + d[i].mmap_offset;
		nm.n = i + 1;
	}
	vmm_mem_clear(m);
	*m = nm;
	return 0;
out:
	vmm_mem_clear(&nm);
	return rc;
}

static void *translate(const struct vmm_mem *m, uint64_t addr, uint64_t len, int by_uva)
{
	if (len == 0)
		return NULL;
	for (unsigned i = 0; i < m->n; i++) {
		const struct vmm_mem_region *r = &m->r[i];
		uint64_t start = by_uva ? r->d.uaddr : r->d.gpa;
		uint64_t off;

		if (addr < start)
			continue;
		off = addr - start;
		if (off >= r->d.size || len > r->d.size - off)
			continue;
		return r->base + off;
	}
	return NULL;
}

void *vmm_mem_gpa(const struct vmm_mem *m, uint64_t gpa, uint64_t len)
{
	return translate(m, gpa, len, 0);
}

void *vmm_mem_uva(const struct vmm_mem *m, uint64_t uva, uint64_t len)
{
	return translate(m, uva, len, 1);
}
