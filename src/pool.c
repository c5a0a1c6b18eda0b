/* Graph pools: the public calls (streamarena.h, "Graph pools"), and a
 * pool's growth from its arena.
 *
 * A pool grows by one segment at a time: a large allocation of the arena
 * (sa__alloc_unsynced, never a device-wide synchronize), in the relaxed
 * capture mode, on the pools' own stream, which no capture names, so the growth makes no driver call on
 * the stream the caller allocates on, and works while that stream is
 * captured, on a stream the arena never saw. The new segment's memory may
 * have been ordered after other streams' frees on the device (a wait
 * enqueued on the pools' stream): the growth waits for that stream on the
 * host (a relaxed-mode wait that no capture refuses), so the segment is
 * clean, free for any stream. The blocks are pool_block.c's; the last
 * release gives the segments back through free.c.
 *
 * Calls alloc.c, free.c, pool_block.c, the event pool and the driver;
 * called by users only. Locks: pool_block.h.
 */
#include <stdlib.h>

#include "alloc.h"
#include "arena.h"
#include "base/base.h"
#include "base/chain_table.h"
#include "driver/driver.h"
#include "free.h"
#include "large/span.h"
#include "pool_block.h"

/* The table of blocks by base: keys are multiples of SA_POOL_ALIGN. */
#define BLOCK_KEY_SHIFT 9
#define BLOCK_FIRST_BITS 6
_Static_assert(((size_t)1 << BLOCK_KEY_SHIFT) == SA_POOL_ALIGN, "keys are block bases");

/* How many times an allocation grows the pool before it gives up: another
 * thread may take each new segment first. */
#define GROW_TRIES 4

sa_status sa_pool_create(sa_arena *a, sa_pool **out) {
  if (out == NULL) return SA_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (a == NULL) return SA_ERR_INVALID_ARGUMENT;
  sa_pool *pool = calloc(1, sizeof *pool);
  if (pool == NULL) return SA_ERR_OUT_OF_MEMORY;
  if (!sa__chain_create(&pool->blocks, BLOCK_FIRST_BITS, BLOCK_KEY_SHIFT)) {
    free(pool);
    return SA_ERR_OUT_OF_MEMORY;
  }
  pool->arena = a;
  pool->uses = 1;
  pthread_mutex_init(&pool->lock, NULL);
  sa_status st = sa__pools_add(a, pool);
  if (st != SA_OK) {
    sa__chain_destroy(&pool->blocks);
    pthread_mutex_destroy(&pool->lock);
    free(pool);
    return st;
  }
  *out = pool;
  return SA_OK;
}

sa_status sa_pool_retain(sa_pool *pool) {
  if (pool == NULL) return SA_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&pool->lock);
  sa_status st = pool->uses > 0 ? SA_OK : SA_ERR_INVALID_ARGUMENT;
  if (st == SA_OK) pool->uses++;
  pthread_mutex_unlock(&pool->lock);
  return st;
}

/* A stream the caller names, asked no driver call that its capture would
 * refuse: a captured stream is a valid one. */
static sa_status stream_check(sa_arena *a, sa_stream s) {
  sa_status st = sa__legacy_stream_check(a, s);
  if (st == SA_OK) st = a->drv->ops->stream_capture_check(a->drv, s);
  if (st == SA_OK) return a->drv->ops->stream_validate(a->drv, s);
  return st == SA_ERR_STREAM_CAPTURING ? SA_OK : st;
}

sa_status sa_pool_release(sa_pool *pool, sa_stream s) {
  if (pool == NULL) return SA_ERR_INVALID_ARGUMENT;
  sa_arena *a = pool->arena;
  sa_status st = sa__legacy_stream_check(a, s);
  if (st == SA_OK) st = a->drv->ops->stream_capture_check(a->drv, s);
  if (st == SA_OK) st = a->drv->ops->stream_validate(a->drv, s);
  if (st != SA_OK) return st;
  pthread_mutex_lock(&pool->lock);
  if (pool->uses == 0 || pool->returning) {
    pthread_mutex_unlock(&pool->lock);
    return SA_ERR_INVALID_ARGUMENT;
  }
  /* Not the last use, or the last with blocks still live: an event on s
   * that the segments' return (now or at the last block's free) waits
   * for. */
  if (pool->uses > 1 || pool->nlive > 0) {
    st = sa__pool_end_use(pool, s);
    if (st == SA_OK) pool->uses--;
    pthread_mutex_unlock(&pool->lock);
    return st;
  }
  pool->returning = true; /* no allocation meanwhile: a racing one fails */
  pthread_mutex_unlock(&pool->lock);
  st = sa__pool_give_back(a, pool, s);
  if (st == SA_OK) {
    pthread_mutex_lock(&pool->lock);
    pool->uses = 0;
    pthread_mutex_unlock(&pool->lock);
  }
  return st;
}

/* sa__alloc_unsynced's arguments, for the driver's call_relaxed. */
typedef struct growth_s {
  sa_arena *arena;
  void **out;
  size_t size;
  sa_stream stream;
} growth;

static sa_status alloc_growth(void *arg) {
  growth *g = arg;
  return sa__alloc_unsynced(g->arena, g->out, g->size, g->stream);
}

/* A large allocation of the arena on the pools' stream, in the relaxed
 * capture mode: a capture in the global mode (any thread's) could refuse
 * its chunk creation and mapping as potentially unsafe calls, and
 * invalidate itself. */
static sa_status alloc_relaxed(sa_arena *a, void **out, size_t size) {
  growth g = {a, out, size, sa__pools_stream(&a->pools)};
  return a->drv->ops->call_relaxed(a->drv, alloc_growth, &g);
}

/* A new segment for a request of request bytes (a multiple of
 * SA_POOL_ALIGN): a large allocation of the arena on the pools' stream,
 * clean once that stream's work completed, in the registry and the pool.
 * Pool lock not held. */
static sa_status grow(sa_pool *pool, size_t request) {
  sa_arena *a = pool->arena;
  size_t size = request;
  size_t gran = (size_t)1 << a->gran_shift;
  /* At least a granule, and above the arena's large threshold: a span of
   * its own, never a small block. */
  size_t least = sa__large_threshold(a) + 1;
  if (size < least) size = least;
  if (size > SIZE_MAX - (gran - 1)) return SA_ERR_OUT_OF_MEMORY;
  size = (size + gran - 1) & ~(gran - 1);
  sa_pool_seg *seg = calloc(1, sizeof *seg);
  sa_pblock *b = sa__pblock_new(NULL);
  if (seg == NULL || b == NULL) {
    free(seg);
    free(b);
    return SA_ERR_OUT_OF_MEMORY;
  }
  sa_stream grower = sa__pools_stream(&a->pools);
  void *p;
  sa_status st = alloc_relaxed(a, &p, size);
  if (st == SA_OK && (uintptr_t)p % SA_POOL_ALIGN != 0 && size - SA_POOL_ALIGN < request) {
    /* Carved in a free span at SA_ALIGNMENT: one unit more holds it. The
     * first try counts for nothing (one allocation per segment). */
    if (sa__free_slow(p, grower, SA_FREE_TRACED) == SA_OK) sa__alloc_forget_large_pair(a);
    st = size <= SIZE_MAX - SA_POOL_ALIGN ? alloc_relaxed(a, &p, size + SA_POOL_ALIGN)
                                          : SA_ERR_OUT_OF_MEMORY;
    if (st == SA_OK) size += SA_POOL_ALIGN;
  }
  if (st == SA_OK && (st = a->drv->ops->stream_synchronize(a->drv, grower)) != SA_OK)
    (void)sa__free_slow(p, grower, SA_FREE_TRACED);
  if (st == SA_OK) {
    sa__span_set_pool_segment(a, (uintptr_t)p); /* its room above stays the pool's */
    seg->span = (uintptr_t)p;
    seg->span_size = size;
    seg->base = ((uintptr_t)p + SA_POOL_ALIGN - 1) & ~(SA_POOL_ALIGN - 1);
    seg->size = (size - (seg->base - seg->span)) & ~(SA_POOL_ALIGN - 1);
    seg->pool = pool;
    st = sa__pools_register(a, seg);
    if (st != SA_OK) (void)sa__free_slow(p, grower, SA_FREE_TRACED);
  }
  if (st != SA_OK) {
    free(seg);
    free(b);
    return st;
  }
  pthread_mutex_lock(&pool->lock);
  sa__pool_seg_add(pool, seg, b);
  pthread_mutex_unlock(&pool->lock);
  return SA_OK;
}

/* sa__alloc_extend's arguments, for the driver's call_relaxed. */
typedef struct extension_s {
  sa_arena *arena;
  uintptr_t span;
  size_t size, more, added;
} extension;

static sa_status extend_growth(void *arg) {
  extension *x = arg;
  return sa__alloc_extend(x->arena, (void *)x->span, x->size, x->more,
                          sa__pools_stream(&x->arena->pools), &x->added);
}

/* The segment whose top a growth in place would extend for a request of
 * size bytes on s: its last block free and s's to take, so that what the
 * growth adds merges into it; of those, the one lacking least (*lack).
 * NULL if none. Pool lock held. */
static sa_pool_seg *extendable(sa_pool *pool, size_t size, sa_stream s, size_t *lack) {
  sa_pool_seg *best = NULL;
  for (sa_pool_seg *seg = pool->segs; seg != NULL; seg = seg->next) {
    const sa_pblock *last = sa__pool_seg_last(seg);
    if (last->state != SA_PBLOCK_FREE || !sa__pool_usable(last, s) || last->size >= size)
      continue;
    if (best == NULL || size - last->size < *lack) {
      best = seg;
      *lack = size - last->size;
    }
  }
  return best;
}

/* seg (whose span was span_size bytes when the pool lock was let go)
 * grows in place by at least lack bytes: the arena's span grows into the
 * memory right above it (alloc.h, sa__alloc_extend), made clean as a new
 * segment is. Where the arena cannot, SA_ERR_OUT_OF_MEMORY: a new segment
 * instead. A pool that grows so keeps its free memory in one block where
 * separate segments would leave pieces that no later request fits (a
 * 1.5 GiB block freed, then 1.5 GiB and 1 MiB asked for, holds 3 GiB in
 * two segments). Pool lock not held. */
static sa_status grow_in_place(sa_pool *pool, sa_pool_seg *seg, uintptr_t span,
                               size_t span_size, size_t lack) {
  sa_arena *a = pool->arena;
  size_t gran = (size_t)1 << a->gran_shift;
  if (lack > SIZE_MAX - (gran - 1)) return SA_ERR_OUT_OF_MEMORY;
  sa_pblock *b = sa__pblock_new(NULL);
  if (b == NULL) return SA_ERR_OUT_OF_MEMORY;
  extension x = {a, span, span_size, (lack + gran - 1) & ~(gran - 1), 0};
  sa_status st = a->drv->ops->call_relaxed(a->drv, extend_growth, &x);
  /* Grown, the span holds the memory whatever follows: a failed
   * synchronize or a release that raced leaves it unused in the span,
   * which goes back whole. */
  if (st == SA_OK) st = a->drv->ops->stream_synchronize(a->drv, sa__pools_stream(&a->pools));
  if (st == SA_OK && !sa__pools_extend(a, pool, seg, span_size, span_size + x.added, b))
    st = SA_ERR_OUT_OF_MEMORY;
  if (st != SA_OK) free(b);
  return st;
}

/* The free block a request of size bytes on s takes, in the order that
 * costs least: its own or a clean one, one that became clean, neighbours
 * of those joined, one of another stream behind a wait on the device.
 * NULL: the pool must grow. */
static sa_pblock *find_fit(sa_pool *pool, size_t size, sa_stream s) {
  sa_pblock *b = sa__pool_fit(pool, size, s);
  if (b != NULL) return b;
  sa__pool_settle(pool);
  b = sa__pool_fit(pool, size, s);
  if (b != NULL) return b;
  b = sa__pool_fit_joined(pool, size, s);
  if (b != NULL) return b;
  return sa__pool_fit_waiting(pool, size, s);
}

/* The handout to the stream-order checker, where it runs: a block it
 * refuses goes back (untouched) and the call fails. Pool lock held. */
static sa_status check_handout(sa_pool *pool, sa_pblock *b, sa_stream s) {
  sa_arena *a = pool->arena;
  if (!sa__checks_handouts(a)) return SA_OK;
  sa_status st = a->drv->ops->check_handout(a->drv, b->base, b->size, s);
  if (st != SA_OK) sa__pool_uncarve(pool, b);
  return st;
}

sa_status sa_pool_alloc(sa_pool *pool, void **out, size_t size, sa_stream s) {
  if (out == NULL) return SA_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (pool == NULL) return SA_ERR_INVALID_ARGUMENT;
  if (size == 0) return SA_OK;
  if (size > SIZE_MAX - (SA_POOL_ALIGN - 1)) return SA_ERR_OUT_OF_MEMORY;
  size_t rounded = (size + SA_POOL_ALIGN - 1) & ~(SA_POOL_ALIGN - 1);
  sa_status st = stream_check(pool->arena, s);
  if (st != SA_OK) return st;
  pthread_mutex_lock(&pool->lock);
  for (unsigned grown = 0;; grown++) {
    if (pool->uses == 0 || pool->returning) {
      st = SA_ERR_INVALID_ARGUMENT;
      break;
    }
    sa_pblock *b = find_fit(pool, rounded, s);
    if (b != NULL) {
      sa_pblock *live = sa__pool_carve(pool, b, b->base, rounded, size, s);
      st = live == NULL ? SA_ERR_OUT_OF_MEMORY : check_handout(pool, live, s);
      if (st == SA_OK) *out = (void *)live->base;
      break;
    }
    if (grown == GROW_TRIES) {
      st = SA_ERR_OUT_OF_MEMORY;
      break;
    }
    /* First in place, at a segment's free top, then a segment of its own. */
    size_t lack = 0;
    sa_pool_seg *seg = grown == 0 ? extendable(pool, rounded, s, &lack) : NULL;
    uintptr_t span = seg != NULL ? seg->span : 0;
    size_t span_size = seg != NULL ? seg->span_size : 0;
    pthread_mutex_unlock(&pool->lock); /* the arena's locks are never taken under it */
    st = seg != NULL ? grow_in_place(pool, seg, span, span_size, lack) : SA_ERR_OUT_OF_MEMORY;
    if (st != SA_OK) st = grow(pool, rounded);
    pthread_mutex_lock(&pool->lock);
    if (st != SA_OK) break;
  }
  SA_VALIDATE_PACED(&pool->pace, sa__pool_check(pool));
  pthread_mutex_unlock(&pool->lock);
  return st;
}

sa_status sa_pool_alloc_at(sa_pool *pool, void *p, size_t size, sa_stream s) {
  if (pool == NULL || p == NULL || (uintptr_t)p % SA_POOL_ALIGN != 0 || size == 0 ||
      size > SIZE_MAX - (SA_POOL_ALIGN - 1))
    return SA_ERR_INVALID_ARGUMENT;
  size_t rounded = (size + SA_POOL_ALIGN - 1) & ~(SA_POOL_ALIGN - 1);
  if ((uintptr_t)p > UINTPTR_MAX - rounded) return SA_ERR_INVALID_ARGUMENT;
  sa_status st = stream_check(pool->arena, s);
  if (st != SA_OK) return st;
  pthread_mutex_lock(&pool->lock);
  st = SA_ERR_INVALID_ARGUMENT;
  if (pool->uses > 0 && !pool->returning) {
    sa_pblock *b = sa__pool_free_at(pool, (uintptr_t)p, rounded, s);
    if (b == NULL) { /* its event may have completed: clean now */
      sa__pool_settle(pool);
      b = sa__pool_free_at(pool, (uintptr_t)p, rounded, s);
    }
    if (b != NULL) {
      sa_pblock *live = sa__pool_carve(pool, b, (uintptr_t)p, rounded, size, s);
      st = live == NULL ? SA_ERR_OUT_OF_MEMORY : check_handout(pool, live, s);
    }
  }
  SA_VALIDATE_PACED(&pool->pace, sa__pool_check(pool));
  pthread_mutex_unlock(&pool->lock);
  return st;
}

typedef struct live_copy_s {
  void *p;
  size_t size;
  sa_stream stream;
} live_copy;

sa_status sa_pool_live(sa_pool *pool, sa_pool_block_fn fn, void *user) {
  if (pool == NULL || fn == NULL) return SA_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&pool->lock);
  size_t n = pool->nlive;
  live_copy *copy = n > 0 ? malloc(n * sizeof *copy) : NULL;
  if (n > 0 && copy == NULL) {
    pthread_mutex_unlock(&pool->lock);
    return SA_ERR_OUT_OF_MEMORY;
  }
  size_t got = 0;
  for (sa_pool_seg *seg = pool->segs; seg != NULL; seg = seg->next)
    for (sa_pblock *b = seg->first; b != NULL; b = b->next)
      if (b->state == SA_PBLOCK_LIVE)
        copy[got++] = (live_copy){(void *)b->base, b->request, b->stream};
  SA_ASSERT(got == n);
  pthread_mutex_unlock(&pool->lock);
  for (size_t i = 0; i < got; i++) fn(copy[i].p, copy[i].size, copy[i].stream, user);
  free(copy);
  return SA_OK;
}

/* A segment in sa_pool_segments' copy: its blocks are blocks[first,
 * first + n). */
typedef struct seg_copy_s {
  void *base;
  size_t size, first, n;
} seg_copy;

static sa_pool_block_info block_info(const sa_pblock *b) {
  sa_pool_block_info i = {(void *)b->base, b->size, 0, b->tag != 0 ? b->stream : NULL,
                          SA_POOL_BLOCK_FREE};
  if (b->state == SA_PBLOCK_LIVE) {
    i.state = SA_POOL_BLOCK_LIVE;
    i.request = b->request;
    i.stream = b->stream;
  } else if (b->state == SA_PBLOCK_PENDING) {
    i.state = SA_POOL_BLOCK_PENDING;
  }
  return i;
}

sa_status sa_pool_segments(sa_pool *pool, sa_pool_segment_fn fn, void *user) {
  if (pool == NULL || fn == NULL) return SA_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&pool->lock);
  size_t nblocks = pool->blocks.n, nsegs = pool->nsegs;
  sa_pool_block_info *blocks = nblocks > 0 ? malloc(nblocks * sizeof *blocks) : NULL;
  seg_copy *segs = nsegs > 0 ? malloc(nsegs * sizeof *segs) : NULL;
  if ((nblocks > 0 && blocks == NULL) || (nsegs > 0 && segs == NULL)) {
    pthread_mutex_unlock(&pool->lock);
    free(blocks);
    free(segs);
    return SA_ERR_OUT_OF_MEMORY;
  }
  size_t k = 0, got = 0;
  for (sa_pool_seg *seg = pool->segs; seg != NULL; seg = seg->next, k++) {
    segs[k] = (seg_copy){(void *)seg->base, seg->size, got, 0};
    for (sa_pblock *b = seg->first; b != NULL; b = b->next, segs[k].n++) {
      SA_ASSERT(got < nblocks);
      blocks[got++] = block_info(b);
    }
  }
  SA_ASSERT(k == nsegs && got == nblocks);
  pthread_mutex_unlock(&pool->lock);
  for (size_t i = 0; i < k; i++) fn(segs[i].base, segs[i].size, blocks + segs[i].first, segs[i].n, user);
  free(blocks);
  free(segs);
  return SA_OK;
}

sa_status sa_pool_get_stats(sa_pool *pool, sa_pool_stats *out) {
  if (pool == NULL || out == NULL) return SA_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&pool->lock);
  *out = (sa_pool_stats){
      .reserved_bytes = pool->reserved,
      .segments = pool->nsegs,
      .live_bytes = pool->live_bytes,
      .live_requested = pool->live_requested,
      .live_blocks = pool->nlive,
      .free_bytes = pool->free_bytes,
      .free_blocks = pool->nfree,
      .uses = pool->uses,
  };
  pthread_mutex_unlock(&pool->lock);
  return SA_OK;
}
