/* Physical memory: chunks from the driver, the chunk cache, and stitching.
 *
 * A descriptor's virtual range is backed by one or more whole chunks mapped
 * back to back. Chunks need not be physically contiguous, so any free chunk
 * can serve any range ("stitching"): memory freed as many small superblocks
 * becomes one large span without growing the footprint.
 *
 * Policy: take cached chunks largest-first among those no larger than what
 * is still missing (a chunk is mapped whole: the driver maps no partial
 * handles), then create the remainder as power-of-two multiples of the
 * granularity, largest first (30 MiB = 16 + 8 + 4 + 2). Chunk sizes thus
 * grow with requests (one 1 GiB handle maps ~100x faster than 512 small
 * ones) while staying few and interchangeable: any later request is a sum
 * of such sizes, so cached chunks keep fitting. Before a chunk is created,
 * cached chunks that could not serve are released down to
 * release_threshold_bytes (further when the physical cap is in the way):
 * the footprint grows only when no cached memory could serve. Chunks are
 * never split or merged.
 *
 * Every function here runs with the arena lock held. Only chunks with no
 * pending device work enter the cache: callers unmap after their events.
 */
#include <stdlib.h>

#include "internal.h"

static void cache_push(sa_arena *a, sa_chunk *c) {
  c->next = a->chunk_cache;
  a->chunk_cache = c;
  a->chunk_cache_bytes += c->size;
}

/* Remove and return the largest cached chunk of at most limit bytes. */
static sa_chunk *cache_take_fitting(sa_arena *a, size_t limit) {
  sa_chunk **best = NULL;
  for (sa_chunk **pc = &a->chunk_cache; *pc != NULL; pc = &(*pc)->next)
    if ((*pc)->size <= limit && (best == NULL || (*pc)->size > (*best)->size)) best = pc;
  if (best == NULL) return NULL;
  sa_chunk *c = *best;
  *best = c->next;
  a->chunk_cache_bytes -= c->size;
  c->next = NULL;
  return c;
}

static sa_status chunk_release(sa_arena *a, sa_chunk *c) {
  sa_status st = a->drv->ops->chunk_release(a->drv, c->handle);
  if (st != SA_OK) return st;
  a->physical_bytes -= c->size;
  a->nchunks--;
  free(c);
  return SA_OK;
}

/* Release cached chunks, largest first, until at most keep_bytes stay. A
 * chunk the driver refuses stays cached (a later trim may succeed); the
 * others are still released, so that arena destroy leaks only the refused
 * ones. */
size_t sa__physical_release_cached(sa_arena *a, size_t keep_bytes) {
  size_t released = 0;
  sa_chunk *refused = NULL;
  while (a->chunk_cache_bytes > keep_bytes) {
    sa_chunk *c = cache_take_fitting(a, SIZE_MAX);
    size_t size = c->size;
    if (chunk_release(a, c) != SA_OK) {
      keep_bytes = keep_bytes > size ? keep_bytes - size : 0; /* it stays counted */
      c->next = refused;
      refused = c;
      continue;
    }
    released += size;
  }
  while (refused != NULL) {
    sa_chunk *c = refused;
    refused = c->next;
    cache_push(a, c);
  }
  return released;
}

static sa_status chunk_create(sa_arena *a, size_t size, sa_chunk **out) {
  /* The caller already took every cached chunk that fits, so the rest
   * cannot serve this request: give them back rather than grow beside them,
   * down to release_threshold_bytes, and further when the cap is in the
   * way. A refused release is not fatal here; the cap check decides. */
  (void)sa__physical_release_cached(a, a->cfg.release_threshold_bytes);
  while (a->physical_bytes + size > a->physical_cap && a->chunk_cache != NULL) {
    sa_chunk *c = cache_take_fitting(a, SIZE_MAX);
    if (chunk_release(a, c) != SA_OK) {
      cache_push(a, c);
      return SA_ERR_DRIVER;
    }
  }
  if (a->physical_bytes + size > a->physical_cap) return SA_ERR_OUT_OF_MEMORY;
  sa_chunk *c = malloc(sizeof *c);
  if (c == NULL) return SA_ERR_OUT_OF_MEMORY;
  sa_status st = a->drv->ops->chunk_create(a->drv, size, &c->handle);
  if (st != SA_OK) {
    free(c);
    return st;
  }
  c->size = size;
  c->next = NULL;
  a->physical_bytes += size;
  a->nchunks++;
  if (a->physical_bytes > a->physical_peak) a->physical_peak = a->physical_bytes;
  *out = c;
  return SA_OK;
}

/* Undo a partial mapping: unmap [d->base, d->base + mapped) and cache the
 * chunks. If the driver refuses to unmap, the chunks stay attached to d and
 * the caller keeps d out of circulation. */
static sa_status unwind(sa_arena *a, sa_desc *d, sa_chunk *pieces, size_t mapped) {
  if (mapped > 0) {
    sa_status st = a->drv->ops->unmap(a->drv, d->base, mapped);
    if (st != SA_OK) {
      d->chunks = pieces;
      return st;
    }
  }
  for (sa_chunk *c = pieces, *n; c != NULL; c = n) {
    n = c->next;
    cache_push(a, c);
  }
  d->chunks = NULL;
  return SA_OK;
}

/* Would the cache alone cover need bytes (within slack)? Mirrors the
 * choice sa__physical_gather makes, without taking anything. */
bool sa__physical_cache_covers(const sa_arena *a, size_t need, size_t slack) {
  size_t missing = need;
  uint64_t taken = 0; /* bit i: i-th cache entry taken (first 64 only) */
  for (;;) {
    const sa_chunk *best = NULL;
    unsigned best_i = 0, i = 0;
    for (const sa_chunk *c = a->chunk_cache; c != NULL && i < 64; c = c->next, i++)
      if (!(taken >> i & 1) && c->size <= missing && (best == NULL || c->size > best->size)) {
        best = c;
        best_i = i;
      }
    if (best == NULL) break;
    taken |= (uint64_t)1 << best_i;
    missing -= best->size;
    if (missing == 0) return true;
  }
  unsigned i = 0;
  for (const sa_chunk *c = a->chunk_cache; c != NULL && i < 64; c = c->next, i++)
    if (!(taken >> i & 1) && c->size >= missing && c->size - missing <= slack) return true;
  return false;
}

/* Remove and return the smallest cached chunk of at least min bytes and at
 * most max bytes. */
static sa_chunk *cache_take_covering(sa_arena *a, size_t min, size_t max) {
  sa_chunk **best = NULL;
  for (sa_chunk **pc = &a->chunk_cache; *pc != NULL; pc = &(*pc)->next)
    if ((*pc)->size >= min && (*pc)->size <= max && (best == NULL || (*pc)->size < (*best)->size))
      best = pc;
  if (best == NULL) return NULL;
  sa_chunk *c = *best;
  *best = c->next;
  a->chunk_cache_bytes -= c->size;
  c->next = NULL;
  return c;
}

void sa__physical_return(sa_arena *a, sa_chunk *chunks) {
  for (sa_chunk *c = chunks, *n; c != NULL; c = n) {
    n = c->next;
    cache_push(a, c);
  }
}

sa_status sa__physical_gather(sa_arena *a, size_t need, size_t slack, sa_chunk **out,
                              size_t *total) {
  sa_chunk *head = NULL, **tail = &head;
  size_t missing = need, sum = 0;
  sa_chunk *c;
  while (missing > 0 && (c = cache_take_fitting(a, missing)) != NULL) {
    *tail = c;
    tail = &c->next;
    missing -= c->size;
    sum += c->size;
  }
  /* One cached chunk a little larger than the rest beats a new one. */
  if (missing > 0 && (c = cache_take_covering(a, missing, missing + slack)) != NULL) {
    *tail = c;
    tail = &c->next;
    sum += c->size;
    missing = 0;
  }
  sa_status st = SA_OK;
  while (st == SA_OK && missing > 0) {
    size_t size = a->gran << (63 - __builtin_clzll((unsigned long long)(missing / a->gran)));
    st = chunk_create(a, size, &c);
    if (st == SA_OK) {
      *tail = c;
      tail = &c->next;
      missing -= size;
      sum += size;
    }
  }
  if (st != SA_OK) {
    sa__physical_return(a, head);
    return st;
  }
  *out = head;
  *total = sum;
  return SA_OK;
}

sa_status sa__physical_map(sa_arena *a, sa_desc *d, sa_chunk *chunks) {
  sa_status st = SA_OK;
  size_t off = 0;
  for (sa_chunk *c = chunks; st == SA_OK && c != NULL; c = c->next) {
    st = a->drv->ops->map(a->drv, d->base + off, c->size, c->handle);
    if (st == SA_OK) off += c->size;
  }
  if (st == SA_OK) st = a->drv->ops->set_access(a->drv, d->base, d->size);
  if (st != SA_OK) {
    if (unwind(a, d, chunks, off) != SA_OK) return SA_ERR_DRIVER;
    return st;
  }
  d->chunks = chunks;
  return SA_OK;
}

sa_status sa__physical_unmap(sa_arena *a, sa_desc *d) {
  if (d->chunks == NULL) return SA_OK;
  sa_status st = a->drv->ops->unmap(a->drv, d->base, d->size);
  if (st != SA_OK) return st;
  for (sa_chunk *c = d->chunks, *n; c != NULL; c = n) {
    n = c->next;
    cache_push(a, c);
  }
  d->chunks = NULL;
  return SA_OK;
}
