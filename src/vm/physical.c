/* Physical memory: chunks from the driver, how large they are made, the
 * cache of unmapped chunks.
 *
 * A chunk is one driver allocation (cuMemCreate), and it is also the unit
 * of mapping and of unmapping: the driver maps a chunk only whole (on an
 * H200 with driver 580, a cuMemMap at an offset into a chunk is refused),
 * so the size a chunk is created at decides what a reshape can later take
 * back.
 *
 *   - Bringing a chunk up (create, map, set access) costs per chunk, not
 *     per byte, up to hundreds of MiB (See Note [Chunk costs]).
 *   - Unmapping is per chunk too: memory a reshape takes back is rarely a
 *     whole growth (a span that took part of a freed one pins what it
 *     covers).
 *
 * The chunk-size policy (chunk_size) makes a growth one chunk by default,
 * chunks of the user's chunk_size when set, and of a granule under a
 * budget: a chunk that lies wholly in free memory can be unmapped and
 * mapped elsewhere while the rest of the growth stays in use.
 *
 * A descriptor's range (a superblock, a run of spans) is backed by chunks
 * mapped back to back; they need not lie in order ("stitching"). Unmapped
 * chunks wait in the chunk cache, and a growth maps cached chunks that fit
 * before it creates anything. The footprint (physical.bytes) counts every
 * chunk held, mapped or cached; release_cached gives cached ones back.
 *
 * The remapping ledger (created and remapped bytes) is kept here, where
 * both happen; the decision to reshape that reads it is run.c's and
 * alloc.c's.
 *
 * Every function here runs with the arena lock held, but the ledger's
 * reader. Only chunks with no pending device work enter the cache: callers
 * unmap after their events.
 */
#include <stdlib.h>

#include "physical.h"
#include "../arena.h"
#include "../base/base.h"
#include "../driver/driver.h"
#include "va_space.h"

static void cache_push(sa_arena *a, sa_chunk *p) {
  p->next = a->physical.cache;
  a->physical.cache = p;
  a->physical.cache_bytes += p->size;
  p->phys->cached += p->size;
}

static void cache_unlink(sa_arena *a, sa_chunk **pp) {
  sa_chunk *p = *pp;
  SA_ASSERT(a->physical.cache_bytes >= p->size && p->phys->cached == p->size);
  *pp = p->next;
  a->physical.cache_bytes -= p->size;
  p->phys->cached -= p->size;
  p->next = NULL;
}

size_t sa__chunks_bytes(const sa_chunk *chunks) {
  size_t n = 0;
  for (; chunks != NULL; chunks = chunks->next) n += chunks->size;
  return n;
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

static int smaller_first(const void *x, const void *y) { return larger_first(y, x); }

typedef int (*chunk_order)(const void *, const void *);

/* Release cached chunks in the given order until at most keep_bytes stay
 * cached. A chunk the driver refuses stays (a later trim may succeed); the
 * others are still released, so that arena destroy leaks only the refused
 * ones. */
static size_t release_cached_in(sa_arena *a, size_t keep_bytes, chunk_order order_by) {
  if (a->physical.cache_bytes <= keep_bytes) return 0;
  size_t n = 0, released = 0;
  for (sa_phys *ph = a->physical.all; ph != NULL; ph = ph->next) n += ph->cached == ph->size;
  sa_phys **order = malloc(n * sizeof *order); /* NULL: in list order */
  size_t k = 0;
  for (sa_phys *ph = a->physical.all; ph != NULL && order != NULL; ph = ph->next)
    if (ph->cached == ph->size) order[k++] = ph;
  if (order != NULL) qsort(order, n, sizeof *order, order_by);
  sa_phys *next = a->physical.all;
  for (size_t i = 0; a->physical.cache_bytes - released > keep_bytes; i++) {
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
  for (sa_chunk **pp = &a->physical.cache; *pp != NULL;)
    if ((*pp)->phys->released)
      *pp = (*pp)->next;
    else
      pp = &(*pp)->next;
  a->physical.cache_bytes -= released;
  for (sa_phys **pp = &a->physical.all; *pp != NULL;) {
    sa_phys *ph = *pp;
    if (!ph->released) {
      pp = &ph->next;
      continue;
    }
    *pp = ph->next;
    a->physical.bytes -= ph->size;
    a->physical.nchunks--;
    free(ph);
  }
  SA_VALIDATE_PACED(&a->physical.pace, sa__physical_check(a));
  return released;
}

/* Largest first: a trim gives back the most in the fewest calls. */
size_t sa__physical_release_cached(sa_arena *a, size_t keep_bytes) {
  return release_cached_in(a, keep_bytes, larger_first);
}

/* The chunk-size policy: the size of the chunks new memory is created in,
 * the unit a reshape can later unmap. A chunk costs about the same to
 * create, map and give access to at any size up to hundreds of MiB, so by
 * default a growth is one chunk, up to SA_CHUNK_MAX: a climb costs per
 * growth, not per byte. Smaller chunks let a reshape take back memory in
 * smaller pieces, a lower footprint for more driver time, so the user may
 * ask for them (chunk_size); under a budget, where remapping is what was
 * asked for, they are a granule, so that a budget can be met at all. See
 * Note [Chunk costs] and Note [Chunk size]. */
static size_t chunk_size(const sa_arena *a) {
  if (a->cfg.chunk_size != 0) return a->cfg.chunk_size;
  return a->physical.budgeted ? a->gran : SA_CHUNK_MAX;
}

sa_status sa__physical_reserve(sa_arena *a, size_t size, size_t limit, sa_phys **out) {
  if (a->physical.bytes + size > limit) return SA_ERR_OUT_OF_MEMORY;
  sa_phys *ph = calloc(1, sizeof *ph);
  if (ph == NULL) return SA_ERR_OUT_OF_MEMORY;
  ph->size = size;
  ph->record = (sa_chunk){.phys = ph, .size = size};
  a->physical.bytes += size;
  a->physical.growing += size;
  *out = ph;
  return SA_OK;
}

sa_chunk *sa__physical_adopt(sa_arena *a, sa_phys *ph) {
  SA_ASSERT(a->physical.growing >= ph->size);
  a->physical.growing -= ph->size;
  ph->next = a->physical.all;
  a->physical.all = ph;
  a->physical.nchunks++;
  size_t held = sa__physical_made(&a->physical);
  if (held > a->physical.peak) a->physical.peak = held;
  atomic_fetch_add_explicit(&a->physical.xcreated_bytes, ph->size, memory_order_relaxed);
  return &ph->record; /* next is NULL since reserve */
}

void sa__physical_unreserve(sa_arena *a, sa_phys *ph) {
  SA_ASSERT(a->physical.growing >= ph->size && a->physical.bytes >= ph->size);
  a->physical.growing -= ph->size;
  a->physical.bytes -= ph->size;
  free(ph);
}

/* A new chunk of size bytes as one record; within limit physical bytes. */
static sa_status phys_create(sa_arena *a, size_t size, size_t limit, sa_chunk **out) {
  sa_phys *ph;
  sa_status st = sa__physical_reserve(a, size, limit, &ph);
  if (st != SA_OK) return st;
  st = a->drv->ops->chunk_create(a->drv, size, &ph->handle);
  if (st != SA_OK) {
    sa__physical_unreserve(a, ph);
    return st;
  }
  *out = sa__physical_adopt(a, ph);
  return SA_OK;
}

/* The most chunks a growth maps again: SA_STITCH_MAX where a growth is one
 * chunk (the default); no bound where the user asked for small chunks or a
 * budget, where remapping them is the point. */
size_t sa__physical_stitch_limit(const sa_arena *a) {
  return a->cfg.chunk_size == 0 && !a->physical.budgeted ? SA_STITCH_MAX : SIZE_MAX;
}

/* The largest cached chunk of at most hi bytes, NULL if none. */
static sa_chunk **cached_largest_within(sa_arena *a, size_t hi) {
  sa_chunk **best = NULL;
  for (sa_chunk **pp = &a->physical.cache; *pp != NULL; pp = &(*pp)->next)
    if ((*pp)->size <= hi && (best == NULL || (*pp)->size > (*best)->size)) best = pp;
  return best;
}

/* The smallest cached chunk of lo to hi bytes, NULL if none. */
static sa_chunk **cached_between(sa_arena *a, size_t lo, size_t hi) {
  sa_chunk **best = NULL;
  for (sa_chunk **pp = &a->physical.cache; *pp != NULL; pp = &(*pp)->next)
    if ((*pp)->size >= lo && (*pp)->size <= hi && (best == NULL || (*pp)->size < (*best)->size))
      best = pp;
  return best;
}

/* Move the cached chunk at *pp to the list whose end is **tail; its size. */
static size_t take_cached(sa_arena *a, sa_chunk **pp, sa_chunk ***tail) {
  sa_chunk *p = *pp;
  cache_unlink(a, pp);
  **tail = p;
  *tail = &p->next;
  return p->size;
}

sa_status sa__physical_gather(sa_arena *a, size_t need, size_t ahead, size_t most, size_t limit,
                              sa_chunk **out, size_t *got) {
  sa_chunk *head = NULL, **tail = &head;
  size_t have = 0, stitch = sa__physical_stitch_limit(a);
  /* Memory held already is mapped again rather than new memory created
   * beside it: cached chunks that fit what is missing, then the smallest
   * that covers the rest if the place has room for it (the bytes beyond
   * the request stay free there; new memory would cost a chunk and
   * footprint). Where a growth is one chunk, at most SA_STITCH_MAX of
   * them, largest first: each costs about what a new chunk does to map
   * and unmap, so the rest is created as one chunk, small cached chunks
   * giving way below (See Note [Stitching bound]). */
  if (stitch == SIZE_MAX) {
    for (sa_chunk **pp = &a->physical.cache; have < need && *pp != NULL;) {
      if ((*pp)->size > need - have)
        pp = &(*pp)->next;
      else
        have += take_cached(a, pp, &tail);
    }
  } else {
    sa_chunk **pp;
    for (size_t k = 0; have < need && k < stitch; k++) {
      if ((pp = cached_largest_within(a, need - have)) == NULL) break;
      have += take_cached(a, pp, &tail);
    }
  }
  sa_chunk **cover = have < need ? cached_between(a, need - have, most - have) : NULL;
  if (cover != NULL) have += take_cached(a, cover, &tail);
  size_t remapped = have;
  /* The rest is created, all of it within limit or none: cached chunks
   * this growth does not map are given back first if that makes room, the
   * smallest first, no more than it needs (the others stay cached, for a
   * later growth). The bytes ahead too where they fit under limit. */
  sa_status st = SA_OK;
  size_t missing = have < need ? need - have : 0;
  if (missing > 0 && a->physical.bytes + missing > limit) {
    size_t over = a->physical.bytes + missing - limit;
    if (over <= a->physical.cache_bytes)
      (void)release_cached_in(a, a->physical.cache_bytes - over, smaller_first);
    if (a->physical.bytes + missing > limit) st = SA_ERR_OUT_OF_MEMORY;
  }
  if (st == SA_OK && missing > 0 && a->physical.bytes + missing + ahead <= limit)
    missing += ahead;
  size_t unit = chunk_size(a);
  while (st == SA_OK && missing > 0) {
    sa_chunk *p;
    size_t size = missing < unit ? missing : unit;
    st = phys_create(a, size, limit, &p);
    /* The device is full below limit (others hold the rest): cached
     * chunks this growth could not use give way, as for limit above. */
    if (st == SA_ERR_OUT_OF_MEMORY && sa__physical_release_cached(a, 0) > 0)
      st = phys_create(a, size, limit, &p);
    if (st == SA_OK) {
      *tail = p;
      tail = &p->next;
      missing -= size;
      have += size;
    }
  }
  if (st != SA_OK) {
    sa__physical_return(a, head); /* new chunks too: a later growth uses them */
    SA_VALIDATE_PACED(&a->physical.pace, sa__physical_check(a));
    return st;
  }
  atomic_fetch_add_explicit(&a->physical.xremapped_bytes, remapped, memory_order_relaxed);
  *out = head;
  *got = have;
  SA_VALIDATE_PACED(&a->physical.pace, sa__physical_check(a));
  return SA_OK;
}

/* Ranges whose unwind the driver refused, listed by their first chunk (no
 * allocation: a failure path must not need memory). Nothing was handed out
 * there; they wait for the driver to agree, at every reclaim and at
 * destroy. Kept on their descriptors before, they stranded their memory
 * until destroy (regression_test: trim_takes_back_a_range_whose_unwind_was_refused). */
static void stuck_push(sa_arena *a, uintptr_t va, size_t size, sa_chunk *chunks) {
  chunks->phys->stuck_va = va;
  chunks->phys->stuck_size = size;
  chunks->phys->stuck_next = a->physical.stuck;
  a->physical.stuck = chunks;
}

sa_status sa__physical_unmap_stuck(sa_arena *a) {
  sa_status first = SA_OK;
  for (sa_chunk **pp = &a->physical.stuck, *c; (c = *pp) != NULL;) {
    sa_phys *ph = c->phys;
    sa_desc desc = {.base = ph->stuck_va, .size = ph->stuck_size, .chunks = c};
    sa_status st = sa__physical_unmap(a, &desc); /* chunks to the cache */
    if (st != SA_OK) {
      if (first == SA_OK) first = st;
      pp = &ph->stuck_next;
      continue;
    }
    *pp = ph->stuck_next;
    sa__va_free(a, desc.base, desc.size);
  }
  return first;
}

sa_status sa__physical_map_at(sa_arena *a, uintptr_t va, size_t size, sa_chunk *chunks) {
  sa_status st = SA_OK;
  size_t off = 0;
  for (sa_chunk *p = chunks; st == SA_OK && p != NULL; p = p->next) {
    st = a->drv->ops->map(a->drv, va + off, p->size, p->phys->handle);
    if (st == SA_OK) off += p->size;
  }
  /* One access setting for the whole range, not one per chunk. */
  if (st == SA_OK) st = a->drv->ops->set_access(a->drv, va, size);
  if (st == SA_OK) return SA_OK;
  return sa__physical_unwind(a, va, size, chunks, off, st);
}

sa_status sa__physical_unwind(sa_arena *a, uintptr_t va, size_t size, sa_chunk *chunks,
                              size_t mapped, sa_status why) {
  /* Undo what was mapped; if the driver refuses, the chunks mapped stay
   * mapped at [va, va + mapped), a stuck range. Those after them were never
   * mapped: back to the cache (kept with the stuck range they would be lost
   * to every budget, and an unmap of the whole range would cover a hole). */
  size_t kept = 0;
  if (mapped > 0 && a->drv->ops->unmap(a->drv, va, mapped) != SA_OK) {
    sa_chunk **link = &chunks;
    for (size_t at = 0; *link != NULL && at < mapped; link = &(*link)->next) at += (*link)->size;
    sa__physical_return(a, *link);
    *link = NULL;
    stuck_push(a, va, mapped, chunks);
    kept = mapped;
    why = SA_ERR_DRIVER;
  } else {
    sa__physical_return(a, chunks);
  }
  if (size > kept) sa__va_free(a, va + kept, size - kept);
  return why;
}

sa_status sa__physical_map(sa_arena *a, sa_desc *desc, sa_chunk *chunks) {
  sa_status st = sa__physical_map_at(a, desc->base, desc->size, chunks);
  desc->chunks = st == SA_OK ? chunks : NULL;
  return st;
}

sa_status sa__physical_unmap(sa_arena *a, sa_desc *desc) {
  if (desc->chunks == NULL) return SA_OK;
  sa_status st = a->drv->ops->unmap(a->drv, desc->base, desc->size);
  if (st != SA_OK) return st;
  sa__physical_return(a, desc->chunks);
  desc->chunks = NULL;
  return SA_OK;
}

/* bytes times the footprint target's excess (footprint_target - 1). */
static size_t target_excess_of(const sa_arena *a, size_t bytes) {
  size_t x = a->physical.target_excess;
  return bytes / SA_TARGET_UNIT * x + bytes % SA_TARGET_UNIT * x / SA_TARGET_UNIT;
}

/* The floor of the footprint target, in granules. Below the threads'
 * unpublished live bytes, it keeps a small arena from reshaping at every
 * growth; and a climb maps half of it ahead at least (run.c). Where a
 * growth is one chunk, whatever its size, the floor is what spares a
 * climb of requests of a few MiB a chunk each: SA_TARGET_FLOOR. Not where
 * that room comes otherwise, and the larger floor would only hold memory
 * (SA_TARGET_FLOOR_SMALL): with the user's chunk_size, where a growth
 * costs by its chunks, so that room ahead saves nothing; and where the
 * share a climb maps ahead is the target's whole excess (from a
 * footprint_target of 1.125 up), so that a climb maps up to the target;
 * and at a target of 1 (an excess below 1/SA_TARGET_UNIT), which has no
 * excess to map ahead into: the user asked for the least memory held.
 * But from a target of 1.5 (SA_TARGET_WIDE), where the user has traded
 * memory for speed, the excess alone makes a climb of a few GiB grow a
 * dozen times, each a chunk's fixed cost, the first ones for a few MiB:
 * SA_TARGET_FLOOR_WIDE spares the smallest of them (without chunk_size).
 * See Note [Footprint target's floor]. */
size_t sa__physical_target_floor(const sa_arena *a) {
  if (a->cfg.chunk_size != 0) return SA_TARGET_FLOOR_SMALL;
  if (a->physical.target_excess >= SA_TARGET_WIDE) return SA_TARGET_FLOOR_WIDE;
  if (a->physical.target_excess == 0) return SA_TARGET_FLOOR_SMALL;
  bool climb_fills_target =
      sa__physical_ahead_share(a, SA_TARGET_UNIT) >= target_excess_of(a, SA_TARGET_UNIT);
  return climb_fills_target ? SA_TARGET_FLOOR_SMALL : SA_TARGET_FLOOR;
}

/* The soft limit on physical bytes, past which an allocation reshapes
 * free memory before it grows: reserve_limit when the user set one, else
 * the footprint target, the highest live bytes so far times
 * footprint_target (by default 1 + 1/64, the peak's own rounding, a
 * granule here and there) plus the target's floor (sa__physical_target_floor).
 * The arena cannot know a run's peak in advance; the peak so far is what
 * it has proved it needs, and the user's footprint_target says how much
 * more memory a run may hold to make fewer driver calls. See Note
 * [Footprint target]. */
size_t sa__physical_soft_limit(const sa_arena *a) { return sa__physical_soft_limit_with(a, 0); }

size_t sa__physical_soft_limit_with(const sa_arena *a, size_t request) {
  if (a->cfg.reserve_limit_bytes != 0) return a->physical.reserve_limit;
  int64_t peak = atomic_load_explicit(&a->stats.xlive_peak, memory_order_relaxed);
  int64_t live = atomic_load_explicit(&a->stats.xlive_bytes, memory_order_relaxed);
  size_t p = peak > 0 ? (size_t)peak : 0, after = live > 0 ? (size_t)live + request : request;
  if (after > p) p = after; /* a climb: the target rises with it */
  /* What the user mapped up front (initial_physical) counts as live: the
   * arena neither reshapes it away nor grows past it by more than the
   * target's slack. */
  if (p < a->cfg.initial_physical_bytes) p = a->cfg.initial_physical_bytes;
  size_t target = p + target_excess_of(a, p) + a->physical.target_floor_bytes;
  if (target < p) target = SIZE_MAX; /* wrapped */
  return target < a->physical.reserve_limit ? target : a->physical.reserve_limit;
}

/* Memory mapped ahead serves the next requests without a driver call, but
 * what the last growth of a climb maps ahead may stay unused at the peak.
 * At the default target (1/64 over the peak) the share is 1/512 of what
 * is held, which keeps the peak where it is with none mapped ahead; the
 * user who sets a larger footprint_target accepts memory held unused to
 * make fewer growths, so the share grows with the square of the target's
 * excess and from 1.125 up a growth maps up to the target (run.c caps it
 * there): a climb then grows a few times. See Note [Footprint target]. */
size_t sa__physical_ahead_share(const sa_arena *a, size_t n) {
  size_t once = target_excess_of(a, n), twice = target_excess_of(a, once);
  return twice <= SIZE_MAX / 8 ? twice * 8 : SIZE_MAX;
}

/* The remapping ledger. A reshape remaps memory to avoid a growth, and a
 * workload whose shapes keep changing would pay for it again and again.
 * So, as in ski rental, the arena remaps for the footprint target only
 * while what it remapped stays within a share of what it created, plus
 * one granule per SA_REMAP_TRICKLE span allocations (so that a long run
 * whose shapes drift keeps some, at a small cost per allocation). The
 * share follows the costs, a chunk's being about the same to create or to
 * move whatever its size (Note [Chunk costs]):
 *   - chunks of the user's chunk_size: growing and remapping a byte cost
 *     the same, so each byte grown buys the right to remap one (driver
 *     work at most twice growth's);
 *   - one chunk per growth (the default): a growth is one chunk while a
 *     reshape moves many, so 1/SA_REMAP_SHARE of it, which still lets the
 *     shipped traces keep their footprint.
 * Superblocks carved in free spans (superblock.c) count too: they cost no
 * driver call, but memory moved between the shapes without bound thrashes
 * (a large request reclaims the superblocks carved in its free span, the
 * next small ones carve it again). See Note [Remapping ledger].
 * Under a budget the user set, remapping is what was asked for. */
size_t sa__physical_remap_allowance(const sa_arena *a, size_t limit) {
  if (limit >= a->physical.reserve_limit) return SIZE_MAX; /* not the footprint target */
  size_t created = atomic_load_explicit(&a->physical.xcreated_bytes, memory_order_relaxed);
  size_t remapped = atomic_load_explicit(&a->physical.xremapped_bytes, memory_order_relaxed) +
                    atomic_load_explicit(&a->physical.xcarved_bytes, memory_order_relaxed);
  uint64_t spans = atomic_load_explicit(&a->stats.xlarge_allocs, memory_order_relaxed);
  size_t share = a->cfg.chunk_size != 0 ? 1 : SA_REMAP_SHARE;
  size_t credit = created / share + (size_t)(spans / SA_REMAP_TRICKLE) * a->gran;
  return credit > remapped ? credit - remapped : 0;
}

size_t sa__physical_check(const sa_arena *a) {
  static const char LEDGER[] = "physical ledger";
  size_t visited = 0, cached = 0, cached_by_chunk = 0, held = 0, n = 0;
  for (const sa_chunk *c = a->physical.cache; c != NULL; c = c->next, visited++) {
    SA_CHECK(LEDGER, c->phys != NULL && c->size == c->phys->size && !c->phys->released,
             "a cached record is its chunk's, whole and held");
    cached += c->size;
  }
  SA_CHECK(LEDGER, cached == a->physical.cache_bytes,
           "physical.cache_bytes is the sum of cached chunks");
  for (const sa_phys *ph = a->physical.all; ph != NULL; ph = ph->next, visited++) {
    SA_CHECK(LEDGER, ph->size > 0 && ph->size % a->gran == 0, "a chunk is whole granules");
    SA_CHECK(LEDGER, ph->cached == 0 || ph->cached == ph->size, "a chunk is cached whole or not");
    held += ph->size;
    cached_by_chunk += ph->cached;
    n++;
  }
  SA_CHECK(LEDGER, cached_by_chunk == a->physical.cache_bytes,
           "chunks' cached bytes sum to physical.cache_bytes");
  SA_CHECK(LEDGER, a->physical.target_floor_bytes == sa__physical_target_floor(a) * a->gran,
           "physical.target_floor_bytes is the target's floor");
  SA_CHECK(LEDGER, held + a->physical.growing == a->physical.bytes,
           "physical.bytes is the sum of chunk sizes and the bytes reserved for growing");
  SA_CHECK(LEDGER, n == a->physical.nchunks, "physical.nchunks counts the chunks");
  SA_CHECK(LEDGER, a->physical.peak >= held, "peak >= current");
  SA_CHECK(LEDGER, a->physical.cache_bytes <= a->physical.bytes, "cached bytes are held bytes");
  SA_CHECK(
      LEDGER,
      held <= atomic_load_explicit(&a->physical.xcreated_bytes, memory_order_relaxed),
      "every byte held was created");
  for (const sa_chunk *c = a->physical.stuck; c != NULL; c = c->phys->stuck_next, visited++)
    SA_CHECK(LEDGER, sa__chunks_bytes(c) == c->phys->stuck_size,
             "a stuck range's chunks sum to its size");
  return visited;
}

void sa__physical_fini(sa_arena *a) {
  while (a->physical.all != NULL) { /* the driver refused to release these */
    sa_phys *ph = a->physical.all;
    a->physical.all = ph->next;
    free(ph);
  }
  a->physical.cache = NULL;
  a->physical.cache_bytes = 0;
}
