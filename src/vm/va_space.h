/* The arena's reserved virtual range (va_space.c): its free ranges, and the
 * page map that names the descriptor of each page, so that a pointer finds
 * its superblock or run by address arithmetic alone. Calls nothing of the
 * allocator; called by the tiers above with the arena lock held, but for
 * the page map's lookups, which take no lock. */
#ifndef SA_VM_VA_SPACE_H
#define SA_VM_VA_SPACE_H

#include "../base/base.h"

/* Descriptors: what a page of the reserved range belongs to. They live in
 * host memory and are type-stable until the arena is destroyed (a lock-free
 * pop may still read a descriptor that was just taken). SA_DESC_RUN: a
 * run of mapped memory for large allocations (large/run.c); the spans in
 * it are found by address through the arena's live map. */
typedef enum sa_desc_kind_e { SA_DESC_SUPERBLOCK = 1, SA_DESC_RUN = 2 } sa_desc_kind;

typedef struct sa_chunk_s sa_chunk; /* physical.h */

typedef struct sa_desc_s {
  sa_desc_kind kind;
  uintptr_t base;
  size_t size;       /* virtual bytes, a multiple of the page map's unit */
  sa_chunk *chunks;  /* chunks mapped here, in address order */
} sa_desc;

/* The page map's unit where the granule is larger: superblocks smaller than
 * a granule (superblock.c) and those carved in free span memory start and
 * end on one, so that each page names one descriptor. */
#define SA_PAGE_MAX ((size_t)256 << 10)

/* The reserved range and its page map: what a pointer is looked up in. Set at creation, never
 * moved. */
typedef struct sa_range_s {
  uintptr_t base;               /* starts on a registry slot boundary */
  size_t size;
  _Atomic(sa_desc *) *pagemap;  /* the descriptor of each page */
  unsigned page_shift;          /* the page map's unit: the granule, at most SA_PAGE_MAX */
} sa_range;

/* The reservation around the range, and its free ranges (arena lock). */
typedef struct sa_va_space_s {
  uintptr_t reserved_base;      /* the range lies inside, with a slot of slack */
  size_t reserved_size;
  struct sa_va_free_s *free;    /* sorted free ranges */
  size_t used;
} sa_va_space;

/* All with the arena lock held. */
sa_status sa__va_init(sa_arena *a);
void sa__va_fini(sa_arena *a);
sa_status sa__va_alloc(sa_arena *a, size_t size, uintptr_t *out); /* lowest fit */
/* In the middle of the highest free range that fits, granule-aligned. */
sa_status sa__va_alloc_middle(sa_arena *a, size_t size, uintptr_t *out);
/* Take exactly [va, va + size), which must be free. */
sa_status sa__va_claim(sa_arena *a, uintptr_t va, size_t size);
/* Bytes of free range just below / from va (0: va is not next to one). */
size_t sa__va_free_below(const sa_arena *a, uintptr_t va);
size_t sa__va_free_above(const sa_arena *a, uintptr_t va);
void sa__va_free(sa_arena *a, uintptr_t va, size_t size);
void sa__pagemap_set(sa_arena *a, uintptr_t va, size_t size, sa_desc *desc);

/* No lock: the descriptor of the page at offset off of the range (off <
 * r->size), and of the page at p (NULL outside the range). */
static inline sa_desc *sa__pagemap_at(const sa_range *r, uintptr_t off) {
  return atomic_load_explicit(&r->pagemap[off >> r->page_shift], memory_order_acquire);
}
static inline sa_desc *sa__pagemap_get(const sa_range *r, uintptr_t p) {
  uintptr_t off = p - r->base;
  return off < r->size ? sa__pagemap_at(r, off) : NULL;
}

#endif /* SA_VM_VA_SPACE_H */
