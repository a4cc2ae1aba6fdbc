/*
 * vmm_mem.h — the guest's memory as a vhost-user front-end shares it.
 *
 * VHOST_USER_SET_MEM_TABLE hands over up to VMM_MEM_MAX_REGIONS regions, each
 * a file descriptor (a memfd with share=on) with the region's guest-physical
 * address, its address in the front-end's own address space and its offset in
 * the file. They are mapped here; every later access names an address and a
 * length and gets a pointer only when the whole range lies inside one mapped
 * region, so nothing the guest or the front-end says can point outside.
 */
#ifndef SPACED_VMM_MEM_H
#define SPACED_VMM_MEM_H

#include <stddef.h>
#include <stdint.h>

#define VMM_MEM_MAX_REGIONS 8

struct vmm_mem_region_desc {
	uint64_t gpa;         /* guest-physical address */
	uint64_t size;        /* bytes */
	uint64_t uaddr;       /* address in the front-end's address space */
	uint64_t mmap_offset; /* offset of the region in the file */
};

struct vmm_mem_region {
	struct vmm_mem_region_desc d;
	uint8_t *base;  /* d.gpa maps to base */
	void *map;      /* what mmap returned */
	size_t map_len; /* its length */
};

struct vmm_mem {
	struct vmm_mem_region r[VMM_MEM_MAX_REGIONS];
	unsigned n;
};

/* An empty table. */
void vmm_mem_init(struct vmm_mem *m);

/* Replaces the table with n regions (1..VMM_MEM_MAX_REGIONS) mapped from
 * fds[i] (MAP_SHARED, read-write). Takes ownership of none of the descriptors
 * (the caller closes them; the mappings stay valid). Returns 0; SPACED_EINVAL
 * for a bad count, a zero or overflowing size or offset, a descriptor that is
 * not a regular file (a memfd is) or a region that reaches past the file's end
 * (touching it would raise SIGBUS), or regions that overlap in guest-physical
 * or front-end space; SPACED_ESYS when mmap fails. The front-end must not
 * shrink the files afterwards (QEMU never does).
 * On error the previous table is left as it was. */
int vmm_mem_set(struct vmm_mem *m, const struct vmm_mem_region_desc *d, unsigned n, const int *fds);

/* Unmaps everything; the table is empty afterwards. */
void vmm_mem_clear(struct vmm_mem *m);

/* Pointer to len bytes at guest-physical address gpa, or NULL unless all of
 * them lie in one region (len 0 is refused too). */
void *vmm_mem_gpa(const struct vmm_mem *m, uint64_t gpa, uint64_t len);

/* The same for an address in the front-end's address space (vring addresses
 * come that way). */
void *vmm_mem_uva(const struct vmm_mem *m, uint64_t uva, uint64_t len);

#endif
