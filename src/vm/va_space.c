/* The arena's reserved virtual range and its page map.
 *
 * One range is reserved at arena creation. Superblocks are carved from it
 * lowest-fit, over a sorted list of free ranges (coalesced on free); runs of
 * spans start in the middle of the highest free range and grow from their
 * ends (large/run.c), so that they have room both ways and meet superblocks only
 * when the range is full. The page map gives, for each page (a granule, or
 * SA_PAGE_MAX where granules are larger), the descriptor that owns it (a
 * superblock or a run), so a pointer finds it by address arithmetic alone.
 * A superblock may be smaller than a granule, or carved in a run's free
 * span memory: its pages name it, the run's others the run.
 * Called by superblock.c and the span files with the arena lock held.
 */
#include <stdlib.h>
#include <sys/mman.h>

#include "va_space.h"
#include "../arena.h"

typedef struct sa_va_free_s {
  uintptr_t base;
  size_t size;
  struct sa_va_free_s *next;
} sa_va_free;

static size_t pagemap_bytes(const sa_arena *a) {
  return (a->range.size >> a->range.page_shift) * sizeof *a->range.pagemap;
}

sa_status sa__va_init(sa_arena *a) {
  /* Mapped, not calloc'ed: zero pages come when first touched (a page map
   * for a device of many GiB is megabytes, of which a run touches what it
   * names), where calloc may take it from the heap and clear it all
   * (glibc's mmap threshold rises after large frees). See Note [Page map
   * by mmap]. */
  void *pm = mmap(NULL, pagemap_bytes(a), PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (pm == MAP_FAILED) return SA_ERR_OUT_OF_MEMORY;
  a->range.pagemap = pm;
  sa_va_free *f = malloc(sizeof *f);
  if (f == NULL) {
    (void)munmap(pm, pagemap_bytes(a));
    a->range.pagemap = NULL;
    return SA_ERR_OUT_OF_MEMORY;
  }
  f->base = a->range.base;
  f->size = a->range.size;
  f->next = NULL;
  a->va.free = f;
  a->va.used = 0;
  return SA_OK;
}

void sa__va_fini(sa_arena *a) {
  for (sa_va_free *f = a->va.free, *n; f != NULL; f = n) {
    n = f->next;
    free(f);
  }
  a->va.free = NULL;
  if (a->range.pagemap != NULL) (void)munmap((void *)a->range.pagemap, pagemap_bytes(a));
  a->range.pagemap = NULL;
}

sa_status sa__va_alloc(sa_arena *a, size_t size, uintptr_t *out) {
  for (sa_va_free **pf = &a->va.free; *pf != NULL; pf = &(*pf)->next) {
    sa_va_free *f = *pf;
    if (f->size < size) continue;
    *out = f->base;
    f->base += size;
    f->size -= size;
    if (f->size == 0) {
      *pf = f->next;
      free(f);
    }
    a->va.used += size;
    return SA_OK;
  }
  return SA_ERR_OUT_OF_MEMORY;
}

sa_status sa__va_alloc_middle(sa_arena *a, size_t size, uintptr_t *out) {
  sa_va_free *found = NULL;
  for (sa_va_free *f = a->va.free; f != NULL; f = f->next)
    if (f->size >= size) found = f;
  if (found == NULL) return SA_ERR_OUT_OF_MEMORY;
  uintptr_t at = (found->base + (found->size - size) / 2) & ~(a->gran - 1);
  sa_status st = sa__va_claim(a, at, size);
  if (st == SA_OK) *out = at;
  return st;
}

sa_status sa__va_claim(sa_arena *a, uintptr_t va, size_t size) {
  sa_va_free **pf = &a->va.free;
  while (*pf != NULL && (*pf)->base + (*pf)->size <= va) pf = &(*pf)->next;
  sa_va_free *f = *pf;
  if (f == NULL || f->base > va || va + size > f->base + f->size) return SA_ERR_INTERNAL;
  uintptr_t end = f->base + f->size;
  if (f->base == va) { /* the low end, possibly all of it */
    f->base += size;
    f->size -= size;
    if (f->size == 0) {
      *pf = f->next;
      free(f);
    }
  } else if (va + size == end) { /* the high end */
    f->size -= size;
  } else { /* the middle: the rest above becomes a range of its own */
    sa_va_free *above = malloc(sizeof *above);
    if (above == NULL) return SA_ERR_OUT_OF_MEMORY;
    above->base = va + size;
    above->size = end - above->base;
    above->next = f->next;
    f->size = va - f->base;
    f->next = above;
  }
  a->va.used += size;
  return SA_OK;
}

size_t sa__va_free_below(const sa_arena *a, uintptr_t va) {
  for (const sa_va_free *f = a->va.free; f != NULL && f->base < va; f = f->next)
    if (f->base + f->size == va) return f->size;
  return 0;
}

size_t sa__va_free_above(const sa_arena *a, uintptr_t va) {
  for (const sa_va_free *f = a->va.free; f != NULL && f->base <= va; f = f->next)
    if (f->base == va) return f->size;
  return 0;
}

void sa__va_free(sa_arena *a, uintptr_t va, size_t size) {
  sa_va_free **pf = &a->va.free, *prev = NULL;
  while (*pf != NULL && (*pf)->base < va) {
    prev = *pf;
    pf = &(*pf)->next;
  }
  sa_va_free *next = *pf;
  a->va.used -= size;
  if (prev != NULL && prev->base + prev->size == va) {
    prev->size += size; /* merge with the range below */
    if (next != NULL && prev->base + prev->size == next->base) {
      prev->size += next->size;
      prev->next = next->next;
      free(next);
    }
    return;
  }
  if (next != NULL && va + size == next->base) {
    next->base = va;
    next->size += size;
    return;
  }
  sa_va_free *f = malloc(sizeof *f);
  if (f == NULL) return; /* the range is lost to reuse, never corrupted */
  f->base = va;
  f->size = size;
  f->next = next;
  *pf = f;
}

void sa__pagemap_set(sa_arena *a, uintptr_t va, size_t size, sa_desc *desc) {
  size_t first = (va - a->range.base) >> a->range.page_shift;
  size_t n = size >> a->range.page_shift;
  for (size_t i = 0; i < n; i++)
    atomic_store_explicit(&a->range.pagemap[first + i], desc, memory_order_release);
}
