/* Physical memory: chunks from the driver, the chunk cache, mapping.
 *
 * A descriptor's virtual range (a superblock, a run of spans) is backed by
 * whole chunks mapped back to back. Chunks need not be physically
 * contiguous, so any free chunk can back any range ("stitching"): memory
 * freed as superblocks can become part of a run and the other way round.
 *
 * Chunk sizes (chunk_size): exactly what is missing, up to SA_CHUNK_MAX per
 * chunk. Creating a handle costs about the same for 2 MiB and for 1 GiB
 * (H200: 1 GiB as 512 x 2 MiB handles ~53 ms, as one handle ~0.6 ms), and
 * a run grows by what a request lacks (span.c), so a growth is one create,
 * one map and one access setting in the common case. The chunk is the unit
 * of unmapping: larger ones cost fewer calls but come back only when wholly
 * free; SA_CHUNK_MAX bounds that. Cached chunks (unmapped under a budget,
 * or by a trim) are used first: those no larger than what is still missing,
 * largest first, then one a little larger (within slack) rather than a new
 * one. Before a chunk is created, cached chunks that could not serve are
 * released down to release_threshold_bytes, and further when the limit is
 * in the way: the footprint grows only when no cached memory could serve.
 * Chunks are never split or merged (the driver maps no part of a handle).
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

/* The size of the next chunk to create when missing bytes are missing. */
/* The chunk-size policy: the size of the next chunk to create when missing
 * bytes are missing. Without a budget, what is missing in one chunk (up to
 * SA_CHUNK_MAX): a growth is one create. With one (max_physical or
 * reserve_limit set), one granule: a budget takes memory back by unmapping
 * whole free chunks, and a chunk partly used by a span that took part of a
 * freed one could never be taken back (the fragmentation trace then runs
 * out of memory at 1.1 x its peak live bytes). */
static size_t chunk_size(const sa_arena *a, size_t missing) {
  if (a->budgeted) return a->gran;
  return missing < SA_CHUNK_MAX ? missing : SA_CHUNK_MAX;
}

static sa_status chunk_create(sa_arena *a, size_t size, size_t limit, sa_chunk **out) {
  /* The caller already took every cached chunk that fits, so the rest
   * cannot serve this request: give them back rather than grow beside them,
   * down to release_threshold_bytes, and further when the limit is in the
   * way. A refused release is not fatal here; the limit check decides. */
  (void)sa__physical_release_cached(a, a->cfg.release_threshold_bytes);
  while (a->physical_bytes + size > limit && a->chunk_cache != NULL) {
    sa_chunk *c = cache_take_fitting(a, SIZE_MAX);
    if (chunk_release(a, c) != SA_OK) {
      cache_push(a, c);
      return SA_ERR_DRIVER;
    }
  }
  if (a->physical_bytes + size > limit) return SA_ERR_OUT_OF_MEMORY;
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

sa_status sa__physical_gather(sa_arena *a, size_t need, size_t slack, size_t limit,
                              sa_chunk **out, size_t *total) {
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
    size_t size = chunk_size(a, missing);
    st = chunk_create(a, size, limit, &c);
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

sa_status sa__physical_map_at(sa_arena *a, uintptr_t va, size_t size, sa_chunk *chunks,
                              sa_chunk **stuck) {
  *stuck = NULL;
  sa_status st = SA_OK;
  size_t off = 0;
  for (sa_chunk *c = chunks; st == SA_OK && c != NULL; c = c->next) {
    st = a->drv->ops->map(a->drv, va + off, c->size, c->handle, 0);
    if (st == SA_OK) off += c->size;
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
