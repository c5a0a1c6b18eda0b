/* REFERENCE MODEL, not streamarena: see first_fit.h. */
#include "first_fit.h"

#include <stdlib.h>
#include <string.h>

#define FF_ALIGN ((size_t)256)

static size_t round_up(size_t x) { return (x + FF_ALIGN - 1) & ~(FF_ALIGN - 1); }

bool ff_init(ff_model *m, size_t capacity) {
  memset(m, 0, sizeof *m);
  m->capacity = capacity & ~(FF_ALIGN - 1);
  m->cap = 64;
  m->free = malloc(m->cap * sizeof *m->free);
  if (m->free == NULL) return false;
  m->free[0] = (ff_range){0, m->capacity};
  m->nfree = m->capacity > 0 ? 1 : 0;
  return true;
}

void ff_fini(ff_model *m) {
  free(m->free);
  memset(m, 0, sizeof *m);
}

bool ff_alloc(ff_model *m, size_t size, size_t *off) {
  size_t need = round_up(size);
  for (size_t i = 0; i < m->nfree; i++) {
    ff_range *r = &m->free[i];
    if (r->size < need) continue;
    *off = r->off;
    r->off += need;
    r->size -= need;
    if (r->size == 0) {
      memmove(r, r + 1, (m->nfree - i - 1) * sizeof *r);
      m->nfree--;
    }
    if (*off + need > m->peak_extent) m->peak_extent = *off + need;
    return true;
  }
  return false;
}

bool ff_free(ff_model *m, size_t off, size_t size) {
  size_t len = round_up(size);
  /* First free range above the block (binary search). */
  size_t lo = 0, hi = m->nfree;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (m->free[mid].off < off)
      lo = mid + 1;
    else
      hi = mid;
  }
  bool below = lo > 0 && m->free[lo - 1].off + m->free[lo - 1].size == off;
  bool above = lo < m->nfree && off + len == m->free[lo].off;
  if (below && above) {
    m->free[lo - 1].size += len + m->free[lo].size;
    memmove(&m->free[lo], &m->free[lo + 1], (m->nfree - lo - 1) * sizeof *m->free);
    m->nfree--;
  } else if (below) {
    m->free[lo - 1].size += len;
  } else if (above) {
    m->free[lo].off = off;
    m->free[lo].size += len;
  } else {
    if (m->nfree == m->cap) {
      ff_range *n = realloc(m->free, 2 * m->cap * sizeof *n);
      if (n == NULL) return false;
      m->free = n;
      m->cap *= 2;
    }
    memmove(&m->free[lo + 1], &m->free[lo], (m->nfree - lo) * sizeof *m->free);
    m->free[lo] = (ff_range){off, len};
    m->nfree++;
  }
  return true;
}

size_t ff_largest_free(const ff_model *m) {
  size_t best = 0;
  for (size_t i = 0; i < m->nfree; i++)
    if (m->free[i].size > best) best = m->free[i].size;
  return best;
}
