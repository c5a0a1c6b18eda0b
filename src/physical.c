/* Physical memory: chunks from the driver, how large they are made, the
 * cache of unmapped chunks.
 *
 * A chunk is one driver allocation (cuMemCreate), and it is also the unit
 * of mapping and of unmapping: the driver maps a chunk only whole (on an
 * H200 with driver 580, a cuMemMap at an offset into a chunk is refused),
 * so the size a chunk is created at decides what a reshape can later take
 * back.
 *
 *   - Creation costs per call: a 2 MiB chunk about 13 us on the H200,
 *     1 GiB as one chunk about 0.6 ms (as 512 chunks of 2 MiB: ~53 ms).
 *   - Unmapping is per chunk: memory a reshape takes back is rarely a whole
 *     growth (a span that took part of a freed one pins what it covers).
 *
 * The chunk-size policy (chunk_size) makes a growth of a range in chunks of
 * a granule up to 16 granules, then of about 1/16 of it, and of a granule
 * under a budget: a growth is at most ~16 creates and maps and one access
 * setting, and any chunk that lies wholly in free memory can be unmapped
 * and mapped elsewhere while the rest of the growth stays in use.
 *
 * A descriptor's range (a superblock, a run of spans) is backed by chunks
 * mapped back to back; they need not lie in order ("stitching"). Unmapped
 * chunks wait in the chunk cache, and a growth maps cached chunks that fit
 * before it creates anything. The footprint (physical_bytes) counts every
 * chunk held, mapped or cached; release_cached gives cached ones back.
 *
 * The remapping ledger (created and remapped bytes) is kept here, where
 * both happen; the decision to reshape that reads it is span.c's and
 * alloc.c's.
 *
 * Every function here runs with the arena lock held, but the ledger's
 * reader. Only chunks with no pending device work enter the cache: callers
 * unmap after their events.
 */
#include <stdlib.h>

#include "internal.h"

static void cache_push(sa_arena *a, sa_chunk *p) {
  p->next = a->chunk_cache;
  a->chunk_cache = p;
  a->chunk_cache_bytes += p->size;
  p->phys->cached += p->size;
}

static void cache_unlink(sa_arena *a, sa_chunk **pp) {
  sa_chunk *p = *pp;
  *pp = p->next;
  a->chunk_cache_bytes -= p->size;
  p->phys->cached -= p->size;
  p->next = NULL;
}

void sa__physical_return(sa_arena *a, sa_chunk *chunks) {
  for (sa_chunk *p = chunks, *n; p != NULL; p = n) {
    n = p->next;
    cache_push(a, p);
  }
}

static int larger_first(const void *x, const void *y) {
  size_t a = (*(sa_phys *const *)x)->size, b = (*(sa_phys *const *)y)->size;
  return a < b ? 1 : a > b ? -1 : 0;
}

/* Release cached chunks, largest first, until at most
 * keep_bytes stay cached. A chunk the driver refuses stays (a later trim may
 * succeed); the others are still released, so that arena destroy leaks only
 * the refused ones. */
size_t sa__physical_release_cached(sa_arena *a, size_t keep_bytes) {
  if (a->chunk_cache_bytes <= keep_bytes) return 0;
  size_t n = 0, released = 0;
  for (sa_phys *ph = a->phys; ph != NULL; ph = ph->next) n += ph->cached == ph->size;
  sa_phys **order = malloc(n * sizeof *order); /* NULL: in list order */
  size_t k = 0;
  for (sa_phys *ph = a->phys; ph != NULL && order != NULL; ph = ph->next)
    if (ph->cached == ph->size) order[k++] = ph;
  if (order != NULL) qsort(order, n, sizeof *order, larger_first);
  sa_phys *next = a->phys;
  for (size_t i = 0; a->chunk_cache_bytes - released > keep_bytes; i++) {
    sa_phys *ph;
    if (order != NULL) {
      if (i == n) break;
      ph = order[i];
    } else {
      while (next != NULL && next->cached != next->size) next = next->next;
      if (next == NULL) break;
      ph = next;
      next = next->next;
    }
    if (a->drv->ops->chunk_release(a->drv, ph->handle) != SA_OK) continue;
    ph->released = true;
    released += ph->size;
  }
  free(order);
  /* Released chunks leave the cache and the arena. */
  for (sa_chunk **pp = &a->chunk_cache; *pp != NULL;)
    if ((*pp)->phys->released)
      *pp = (*pp)->next;
    else
      pp = &(*pp)->next;
  a->chunk_cache_bytes -= released;
  for (sa_phys **pp = &a->phys; *pp != NULL;) {
    sa_phys *ph = *pp;
    if (!ph->released) {
      pp = &ph->next;
      continue;
    }
    *pp = ph->next;
    a->physical_bytes -= ph->size;
    a->nchunks--;
    free(ph);
  }
  return released;
}

/* The chunk-size policy: the size of the chunks a growth of size bytes is
 * created in, the unit a reshape can later unmap. Without a budget a
 * granule up to 16 granules, then 1/16 of the range (a power of two, at
 * most SA_CHUNK_MAX): a growth is at most ~16 creates and maps (a 4 GiB
 * growth made granule by granule took 2048 of each), and a span that takes
 * part of a freed one pins at most a sixteenth of it beyond what it covers.
 * Under a budget, where remapping is what was asked for, one granule: with
 * 1/16 chunks dataframe ran out of memory under 1.03 x. */
static size_t chunk_size(const sa_arena *a, size_t size) {
  size_t unit = a->gran;
  if (a->budgeted) return unit;
  while (unit * 2 <= size / SA_MAP_PIECES && unit * 2 <= SA_CHUNK_MAX) unit *= 2;
  return unit;
}

/* A new chunk of size bytes as one record; within limit physical bytes. */
static sa_status phys_create(sa_arena *a, size_t size, size_t limit, sa_chunk **out) {
  if (a->physical_bytes + size > limit) return SA_ERR_OUT_OF_MEMORY;
  sa_phys *ph = calloc(1, sizeof *ph);
  if (ph == NULL) return SA_ERR_OUT_OF_MEMORY;
  sa_status st = a->drv->ops->chunk_create(a->drv, size, &ph->handle);
  if (st != SA_OK) {
    free(ph);
    return st;
  }
  sa_chunk *p = &ph->record;
  *p = (sa_chunk){.phys = ph, .size = size};
  ph->size = size;
  ph->next = a->phys;
  a->phys = ph;
  a->physical_bytes += size;
  a->nchunks++;
  if (a->physical_bytes > a->physical_peak) a->physical_peak = a->physical_bytes;
  atomic_fetch_add_explicit(&a->xcreated_bytes, size, memory_order_relaxed);
  *out = p;
  return SA_OK;
}

sa_status sa__physical_gather(sa_arena *a, size_t need, size_t limit, sa_chunk **out) {
  sa_chunk *head = NULL, **tail = &head;
  size_t missing = need, remapped = 0;
  /* Cached chunks first, each that fits what is missing: memory held
   * already is mapped again rather than new memory created beside it. */
  for (sa_chunk **pp = &a->chunk_cache; missing > 0 && *pp != NULL;) {
    sa_chunk *p = *pp;
    if (p->size > missing) {
      pp = &p->next;
      continue;
    }
    cache_unlink(a, pp);
    *tail = p;
    tail = &p->next;
    missing -= p->size;
    remapped += p->size;
  }
  /* The rest is created, all of it within limit or none: cached chunks
   * too large for what is missing are given back first if that makes room
   * (they stay cached otherwise, for a later growth). */
  sa_status st = SA_OK;
  if (missing > 0 && a->physical_bytes + missing > limit) {
    if (a->physical_bytes - a->chunk_cache_bytes + missing <= limit)
      (void)sa__physical_release_cached(a, 0);
    if (a->physical_bytes + missing > limit) st = SA_ERR_OUT_OF_MEMORY;
  }
  size_t unit = chunk_size(a, need);
  while (st == SA_OK && missing > 0) {
    sa_chunk *p;
    size_t size = missing < unit ? missing : unit;
    st = phys_create(a, size, limit, &p);
    if (st == SA_OK) {
      *tail = p;
      tail = &p->next;
      missing -= size;
    }
  }
  if (st != SA_OK) {
    sa__physical_return(a, head); /* new chunks too: a later growth uses them */
    return st;
  }
  atomic_fetch_add_explicit(&a->xremapped_bytes, remapped, memory_order_relaxed);
  *out = head;
  return SA_OK;
}

sa_status sa__physical_map_at(sa_arena *a, uintptr_t va, size_t size, sa_chunk *chunks,
                              sa_chunk **stuck) {
  *stuck = NULL;
  sa_status st = SA_OK;
  size_t off = 0;
  for (sa_chunk *p = chunks; st == SA_OK && p != NULL; p = p->next) {
    st = a->drv->ops->map(a->drv, va + off, p->size, p->phys->handle);
    if (st == SA_OK) off += p->size;
  }
  /* One access setting for the whole range, not one per chunk. */
  if (st == SA_OK) st = a->drv->ops->set_access(a->drv, va, size);
  if (st == SA_OK) return SA_OK;
  /* Undo what was mapped; if the driver refuses, the chunks stay mapped
   * and the caller keeps the range out of circulation. */
  if (off > 0 && a->drv->ops->unmap(a->drv, va, off) != SA_OK) {
    *stuck = chunks;
    return SA_ERR_DRIVER;
  }
  sa__physical_return(a, chunks);
  return st;
}

sa_status sa__physical_map(sa_arena *a, sa_desc *d, sa_chunk *chunks) {
  sa_chunk *stuck;
  sa_status st = sa__physical_map_at(a, d->base, d->size, chunks, &stuck);
  d->chunks = st == SA_OK ? chunks : stuck;
  return st;
}

sa_status sa__physical_unmap(sa_arena *a, sa_desc *d) {
  if (d->chunks == NULL) return SA_OK;
  sa_status st = a->drv->ops->unmap(a->drv, d->base, d->size);
  if (st != SA_OK) return st;
  sa__physical_return(a, d->chunks);
  d->chunks = NULL;
  return SA_OK;
}

/* The remapping ledger. A reshape remaps memory to avoid a growth; both
 * cost about the same per granule (H200: unmap + map + access against
 * create + map + access), but growth is paid once while a workload whose
 * shapes keep changing would pay for remapping again and again. So, as in
 * ski rental, the arena remaps for the footprint target only while what it
 * remapped stays within what it created (each byte grown buys the right to
 * remap one), plus one granule per SA_REMAP_TRICKLE span allocations (so
 * that a long run whose shapes drift keeps some; at the H200's costs at
 * most ~0.05 us per allocation). Driver work for memory is then at most
 * twice that of growth alone, and a training loop that settles pays it
 * once. Under a budget the user set, remapping is what was asked for. */
size_t sa__physical_remap_allowance(const sa_arena *a, size_t limit) {
  if (limit >= a->reserve_limit) return SIZE_MAX; /* not the footprint target */
  size_t created = atomic_load_explicit(&a->xcreated_bytes, memory_order_relaxed);
  size_t remapped = atomic_load_explicit(&a->xremapped_bytes, memory_order_relaxed);
  uint64_t spans = atomic_load_explicit(&a->xlarge_allocs, memory_order_relaxed);
  size_t credit = created + (size_t)(spans / SA_REMAP_TRICKLE) * a->gran;
  return credit > remapped ? credit - remapped : 0;
}

void sa__physical_fini(sa_arena *a) {
  while (a->phys != NULL) { /* the driver refused to release these */
    sa_phys *ph = a->phys;
    a->phys = ph->next;
    free(ph);
  }
  a->chunk_cache = NULL;
  a->chunk_cache_bytes = 0;
}
