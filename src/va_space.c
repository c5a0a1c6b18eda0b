/* The arena's reserved virtual range and its page map.
 *
 * One range is reserved at arena creation; superblocks and spans are carved
 * from it first-fit over a sorted list of free ranges (coalesced on free).
 * The page map gives, for each granule, the descriptor that owns it, so a
 * pointer finds its superblock or span by address arithmetic alone.
 * Called by superblock.c and span.c with the arena lock held.
 */
#include <stdlib.h>

#include "internal.h"

typedef struct sa_va_free_s {
  uintptr_t base;
  size_t size;
  struct sa_va_free_s *next;
} sa_va_free;

sa_status sa__va_init(sa_arena *a) {
  size_t n = a->va_size >> a->gran_shift;
  a->pagemap = calloc(n, sizeof *a->pagemap);
  if (a->pagemap == NULL) return SA_ERR_OUT_OF_MEMORY;
  sa_va_free *f = malloc(sizeof *f);
  if (f == NULL) {
    free(a->pagemap);
    a->pagemap = NULL;
    return SA_ERR_OUT_OF_MEMORY;
  }
  f->base = a->va_base;
  f->size = a->va_size;
  f->next = NULL;
  a->va_free = f;
  a->va_used = 0;
  return SA_OK;
}

void sa__va_fini(sa_arena *a) {
  for (sa_va_free *f = a->va_free, *n; f != NULL; f = n) {
    n = f->next;
    free(f);
  }
  a->va_free = NULL;
  free(a->pagemap);
  a->pagemap = NULL;
}

sa_status sa__va_alloc(sa_arena *a, size_t size, uintptr_t *out) {
  for (sa_va_free **pf = &a->va_free; *pf != NULL; pf = &(*pf)->next) {
    sa_va_free *f = *pf;
    if (f->size < size) continue;
    *out = f->base;
    f->base += size;
    f->size -= size;
    if (f->size == 0) {
      *pf = f->next;
      free(f);
    }
    a->va_used += size;
    return SA_OK;
  }
  return SA_ERR_OUT_OF_MEMORY;
}

void sa__va_free(sa_arena *a, uintptr_t va, size_t size) {
  sa_va_free **pf = &a->va_free, *prev = NULL;
  while (*pf != NULL && (*pf)->base < va) {
    prev = *pf;
    pf = &(*pf)->next;
  }
  sa_va_free *next = *pf;
  a->va_used -= size;
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

void sa__pagemap_set(sa_arena *a, uintptr_t va, size_t size, sa_desc *d) {
  size_t first = (va - a->va_base) >> a->gran_shift;
  size_t n = size >> a->gran_shift;
  for (size_t i = 0; i < n; i++)
    atomic_store_explicit(&a->pagemap[first + i], d, memory_order_release);
}
