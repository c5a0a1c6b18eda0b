/* sa_alloc: the fast path and its slow path; and the loop that gets memory
 * back when an allocation would pass the footprint target or a budget
 * (sa__physical_soft_limit, alloc_reclaiming; sa_trim, sa_defragment).
 *
 * Fast path (same thread, same stream as the last call, block in the thread
 * cache): a class computation, a stack pop, one state byte, two owner-only
 * counters. Everything else goes through alloc_generic, which also does
 * tracing and stream-order checking when those are on. sa_free's paths are
 * free.c's.
 *
 * The lower layers never reach back up: a span or a superblock that would
 * grow past its limit (after the span layer's own reshape) fails with
 * SA_ERR_OUT_OF_MEMORY, and alloc_reclaiming has reclaim.c unmap what is
 * free (this thread's cached blocks first, where they pin superblocks),
 * and tries again.
 */
#include <stdlib.h>

#include "alloc.h"
#include "arena.h"
#include "base/base.h"
#include "driver/driver.h"
#include "free.h"
#include "large/kept.h"
#include "large/span.h"
#include "pool_block.h"
#include "reclaim.h"
#include "report.h"
#include "small/size_class.h"
#include "small/stream_arena.h"
#include "small/stream_return.h"
#include "small/thread_cache.h"
#include "trace.h"
#include "vm/physical.h"

/* ------------------------------------------------------------------------
 * Allocation
 * ---------------------------------------------------------------------- */

/* A small block for e's stream, refilling the bin in a batch if needed. */
static sa_status small_alloc(sa_arena *a, sa_tentry *e, size_t size, size_t limit, void **out) {
  unsigned cls = sa_size_class(size);
  sa_tbin *b = &e->bins[cls];
  if (b->n == 0) {
    if (b->cap == 0 && sa__tbin_init(b, cls) != SA_OK) return SA_ERR_OUT_OF_MEMORY;
    sa_status st;
    b->n = (uint16_t)sa__stream_arena_take(e->sarena, cls, b->slots, sa_class_refill(cls), limit,
                                           &st);
    if (b->n == 0) return st != SA_OK ? st : SA_ERR_OUT_OF_MEMORY;
  }
  sa_cached_block blk = b->slots[--b->n];
  atomic_store_explicit(blk.state, SA_BLOCK_LIVE, memory_order_relaxed);
  sa__tentry_live_account(e, (int64_t)b->block_size, b->block_size);
  (void)a;
  *out = blk.p;
  return SA_OK;
}

/* limit: the physical bytes a span or a superblock may take the arena to. */
static sa_status try_alloc(sa_arena *a, sa_tentry *e, size_t size, size_t limit, void **out) {
  if (size > sa__large_threshold(a)) {
    /* No span is kept here for a best fit to miss: sa__tentry_get gave
     * back the one its thread kept (large/kept.h), and only a free on the
     * fast path keeps one. */
    SA_ASSERT(atomic_load_explicit(&e->xkept, memory_order_relaxed) == NULL);
    sa_status st = SA_ERR_OUT_OF_MEMORY;
    /* A graph pool's segment maps nothing ahead: the pool grows it in
     * place (pool.c), into the room that memory mapped ahead would give
     * the arena's next spans. */
    bool exact = e->stream != NULL && e->stream == sa__pools_stream(&a->pools);
    /* Before a reshape, which remaps memory chunk by chunk, empty
     * superblocks carved between free spans go back to them: what earlier
     * work left behind (a thread's exit, a burst of small blocks) would
     * otherwise keep the free memory in pieces. */
    if (ck_pr_load_ptr(&a->small.free_carved.head) != NULL) {
      st = sa__span_alloc(a, e->sarena, size, limit, SA_SPAN_NO_RESHAPE, exact, out);
      if (st == SA_ERR_OUT_OF_MEMORY) sa__reclaim_carved(a);
    }
    if (st == SA_ERR_OUT_OF_MEMORY)
      st = sa__span_alloc(a, e->sarena, size, limit, SA_SPAN_RESHAPE, exact, out);
    if (st == SA_OK) {
      sa__tentry_live_account(e, (int64_t)size, 0);
      atomic_fetch_add_explicit(&a->stats.xlarge_allocs, 1, memory_order_relaxed);
    }
    return st;
  }
  return small_alloc(a, e, size, limit, out);
}

/* Write the out-of-memory report (SA_FLAG_OOM_REPORT): the summary
 * (report.c), then the snapshot for tools/render_snapshot.py. */
static void oom_report(sa_arena *a, size_t size, sa_stream s) {
  sa__oom_report(a, size, s, stderr);
  fprintf(stderr, "streamarena: snapshot follows (JSON; tools/render_snapshot.py draws it)\n");
  (void)sa_snapshot_write(a, stderr);
}

/* Is s being captured into a graph? */
static bool capturing(sa_arena *a, sa_stream s) {
  return a->drv->ops->stream_capture_check(a->drv, s) == SA_ERR_STREAM_CAPTURING;
}

/* This thread's cached blocks back: they pin superblocks. A capturing
 * stream's own stay cached: given back as in a call naming s, they would
 * record an event on s, which a capture refuses, and every later call on s
 * that misses the cache would first fence, asking for s's id, which a
 * capture refuses too. */
static void give_back_cached(sa_arena *a, sa_tentry *e, sa_stream s) {
  sa__tentry_flush_own(a, e->sarena, capturing(a, s) ? SA_FLUSH_BUT_NAMED : SA_FLUSH_ALL);
}

/* Are the empty superblocks worth unmapping for a large request of size
 * bytes past the footprint target? Their chunks are what its growth maps
 * again, at most SA_STITCH_MAX of them (physical.c): so while few, or for
 * a request a few of them cover. Many, unmapped for a request they cannot
 * serve, would be stitched into the next growths or released, a driver
 * call each (See Note [Stitching bound]). */
static bool superblocks_serve(const sa_arena *a, size_t size) {
  size_t most = sa__physical_stitch_limit(a);
  return atomic_load_explicit(&a->small.xsuperblocks_empty, memory_order_relaxed) <= most ||
         size / most <= atomic_load_explicit(&a->small.xsuperblock_size, memory_order_relaxed);
}

/* Allocate; past a limit, get memory back and try again:
 *   1. within the soft limit (sa__physical_soft_limit_with: a request that
 *      takes live bytes past their highest so far counts in the peak, as
 *      the target rises with a climb); a span that would grow past it
 *      first reshapes free span memory (run.c), as much as the remapping
 *      ledger allows under the footprint target (physical.c);
 *   2. after unmapping free memory whose work completed, still within it;
 *      the chunks are stitched where the request needs them. Under the
 *      footprint target: span memory for a superblock, this thread's
 *      cached blocks and empty superblocks for a span, within the ledger;
 *      under a budget the user set: everything;
 *   3. up to max_physical (the soft limit gives way);
 *   4. after unmapping everything free whose work completed;
 *   5. after a device-wide synchronize and unmapping again (what threads
 *      gave back without an event on its stream is free then too);
 *   6. after the user's callback, which may free memory (from step 1).
 * When the soft limit is max_physical, step 3 is skipped, and step 4 when
 * step 2 did the same; step 5 while s is being captured into a graph, and
 * steps 5 and 6 always for SA_DEVICE_SYNC_NEVER (a graph pool's growth,
 * alloc.h: it may serve a capture on another stream, which a synchronize,
 * or a trim in the user's callback, would end). */
static sa_status alloc_reclaiming(sa_arena *a, sa_tentry *e, size_t size, sa_stream s,
                                  sa_device_sync sync, void **out) {
  bool large = size > sa__large_threshold(a);
  size_t soft = sa__physical_soft_limit_with(a, size), hard = a->physical.cap;
  sa_status st = try_alloc(a, e, size, soft, out);
  bool all_reclaimed = false; /* step 2 took everything free already */
  for (int step = 2, callbacks = 0; st == SA_ERR_OUT_OF_MEMORY; step++) {
    size_t limit = hard;
    /* Read at every step: sa_set_superblock_size on another thread sizes
     * the superblock the next try carves. */
    size_t need =
        large ? size : atomic_load_explicit(&a->small.xsuperblock_size, memory_order_relaxed);
    if (step == 2) {
      size_t allowance = sa__physical_remap_allowance(a, soft);
      if (allowance == SIZE_MAX) { /* a budget: everything free goes */
        give_back_cached(a, e, s);
        sa__reclaim(a, need, SA_QUERY, SA_RECLAIM_ALL);
        all_reclaimed = true;
      } else if (!large && allowance >= need) {
        sa__reclaim(a, need, SA_QUERY, SA_RECLAIM_SPANS);
      } else if (large && allowance >= a->gran && superblocks_serve(a, size)) {
        give_back_cached(a, e, s);
        sa__reclaim(a, need, SA_QUERY, SA_RECLAIM_SUPERBLOCKS);
      }
      limit = soft;
    } else if (step == 3) {
      if (soft >= hard) continue; /* nothing to give way */
    } else if (step == 4) {
      if (all_reclaimed && soft >= hard) continue; /* step 2 did this */
      give_back_cached(a, e, s);
      sa__reclaim(a, need, SA_QUERY, SA_RECLAIM_ALL);
    } else if (step == 5) {
      /* This step waits for the whole device: what threads gave back
       * without an event on its stream becomes usable too. Not while s is
       * captured: CUDA fails the wait then and invalidates the capture;
       * nor for a graph pool, whose growth may serve any capture. */
      if (sync == SA_DEVICE_SYNC_NEVER || capturing(a, s)) continue;
      sa__tentry_flush_own(a, e->sarena, SA_FLUSH_ALL);
      sa__reclaim(a, need, SA_WAIT, SA_RECLAIM_ALL);
    } else if (a->cfg.oom_callback != NULL && sync != SA_DEVICE_SYNC_NEVER &&
               callbacks++ < 8 && a->cfg.oom_callback(a, size, s, a->cfg.oom_user_data)) {
      /* Its frees on other streams may have evicted e: look it up again. */
      st = sa__tentry_get(a, s, &e);
      if (st != SA_OK) break;
      step = 1; /* from the start: the next round is step 2 */
      limit = soft;
    } else {
      break;
    }
    st = try_alloc(a, e, size, limit, out);
  }
  if (st == SA_ERR_OUT_OF_MEMORY) {
    atomic_fetch_add_explicit(&a->stats.xoom_events, 1, memory_order_relaxed);
    if (a->cfg.flags & SA_FLAG_OOM_REPORT) oom_report(a, size, s);
  }
  return st;
}

/* The calling thread's cached blocks back, everything free unmapped
 * (SA_WAIT: after the work pending on it), then cached chunks released down to
 * keep_bytes. */
static sa_status trim_to(sa_arena *a, size_t keep_bytes, sa_wait wait) {
  if (a == NULL) return SA_ERR_INVALID_ARGUMENT;
  sa__tentry_flush_own(a, NULL, SA_FLUSH_ALL);
  sa__reclaim(a, 0, wait, SA_RECLAIM_ALL);
  sa__reclaim_release(a, keep_bytes);
  SA_VALIDATE(sa__world_check(a));
  return SA_OK;
}

sa_status sa_trim(sa_arena *a, size_t keep_bytes) { return trim_to(a, keep_bytes, SA_WAIT); }

sa_status sa_defragment(sa_arena *a) {
  return a == NULL ? SA_ERR_INVALID_ARGUMENT : trim_to(a, a->cfg.release_threshold_bytes, SA_QUERY);
}

/* Tracing and stream-order checking, for both paths. */
SA_NOINLINE static sa_status after_alloc(sa_arena *a, void *p, size_t size, sa_stream s,
                                         void **out) {
  if (sa__checks_handouts(a)) {
    sa_status st = a->drv->ops->check_handout(a->drv, (uintptr_t)p, size, s);
    if (st != SA_OK) {
      *out = NULL;
      /* Back where it came from; the caller gets nothing. Untraced: the
       * allocation failed, so no alloc line opened it. */
      (void)sa__free_slow(p, s, SA_FREE_UNTRACED);
      return st;
    }
  }
  if (a->trace != NULL) sa__trace(a, 'a', p, size, s);
  *out = p;
  return SA_OK;
}

/* The fast path's rare endings, out of line: the fast path itself then makes
 * tail calls only and needs no stack frame. Publishing the live delta before
 * it is due is always correct. */
SA_NOINLINE static sa_status alloc_fast_rare(sa_arena *a, sa_tentry *e, void *p, size_t size,
                                             sa_stream s, void **out) {
  sa__tentry_publish_live(e);
  if (a->hooks) return after_alloc(a, p, size, s, out);
  *out = p;
  return SA_OK;
}

/* The least physical memory a request of size bytes can ever take. Memory
 * is mapped in whole granules: a span's own, and the superblock a small
 * block is carved from, which holds at least one block of its class. In
 * bytes; SIZE_MAX where that does not fit in a size_t. */
static size_t least_footprint(const sa_arena *a, size_t size) {
  size_t bytes = size > sa__large_threshold(a) ? size : sa_class_size(sa_size_class(size));
  size_t granules = (bytes >> a->gran_shift) + ((bytes & (a->gran - 1)) != 0);
  return granules <= SIZE_MAX >> a->gran_shift ? granules << a->gran_shift : SIZE_MAX;
}

/* The slow path: sa_alloc's, with sync SA_DEVICE_SYNC_ALLOWED. */
static sa_status alloc_slow(sa_arena *a, void **out, size_t size, sa_stream s,
                            sa_device_sync sync) {
  *out = NULL;
  if (a == NULL) return SA_ERR_INVALID_ARGUMENT; /* the fast path never matched it */
  if (size == 0) return SA_OK;
  /* No reclaim can make it fit, so neither the out-of-memory loop (a device
   * synchronize, the user's callback) nor the stream's lookup, which may
   * call the driver, is worth its cost. */
  if (least_footprint(a, size) > a->physical.cap) {
    atomic_fetch_add_explicit(&a->stats.xoom_events, 1, memory_order_relaxed);
    return SA_ERR_OUT_OF_MEMORY;
  }
  sa_tentry *e;
  sa_status st = sa__legacy_stream_check(a, s);
  if (st == SA_OK) st = sa__tentry_get(a, s, &e);
  if (st != SA_OK) return st;
  if (e->out != NULL) (void)sa__tentry_flush_out(e, SA_NAMED); /* stays on failure */
  void *p;
  st = alloc_reclaiming(a, e, size, s, sync, &p);
  if (st != SA_OK) return st;
  atomic_fetch_add_explicit(&a->stats.xslow_allocs, 1, memory_order_relaxed);
  if (sa_unlikely(a->hooks)) return after_alloc(a, p, size, s, out);
  *out = p;
  return SA_OK;
}

/* The span e keeps, handed out again for a request of its size on e's
 * stream (large/kept.h): no lock. Counted as the fast path's. */
static sa_status alloc_kept(sa_arena *a, sa_tentry *e, sa_span *sp, size_t size, sa_stream s,
                            void **out) {
  sa__span_kept_reuse(sp);
  e->kept_unused = 0; /* keeping pays: free.c's keep_span */
  sa__count(&e->xfast_allocs);
  sa__count(&e->xkept_reuses);
  /* As a small block's: a pair of one size publishes nothing. */
  sa__tentry_live_account(e, (int64_t)size, size);
  if (sa_unlikely(a->hooks)) return after_alloc(a, (void *)sp->base, size, s, out);
  *out = (void *)sp->base;
  return SA_OK;
}

SA_NOINLINE static sa_status alloc_generic(sa_arena *a, void **out, size_t size, sa_stream s) {
  /* A thread's entry for s keeps a span of this request's size: the
   * legacy stream's check first, as every call naming it asks. */
  sa_tentry *e = sa__tentry_last();
  sa_span *sp;
  if (e != NULL && e->kept_request == size && sa__tentry_current(e, a, s) &&
      size > sa__large_threshold(a) &&
      sa__legacy_stream_check(a, s) == SA_OK &&
      (sp = sa__tentry_take_kept(e)) != NULL)
    return alloc_kept(a, e, sp, size, s, out);
  return alloc_slow(a, out, size, s, SA_DEVICE_SYNC_ALLOWED);
}

sa_status sa__alloc_extend(sa_arena *a, void *p, size_t size, size_t more, sa_stream s,
                           size_t *added) {
  *added = 0;
  if (a->trace != NULL) return SA_ERR_NOT_SUPPORTED;
  sa_tentry *e;
  sa_status st = sa__legacy_stream_check(a, s);
  if (st == SA_OK) st = sa__tentry_get(a, s, &e);
  if (st != SA_OK) return st;
  size_t soft = sa__physical_soft_limit_with(a, more);
  st = sa__span_extend(a, e->sarena, (uintptr_t)p, size, more, soft, added);
  if (st != SA_OK) return st;
  sa__tentry_live_account(e, (int64_t)*added, 0);
  /* The added memory is handed to s as an allocation's is (after_alloc). */
  if (sa__checks_handouts(a))
    st = a->drv->ops->check_handout(a->drv, (uintptr_t)p + size, *added, s);
  return st;
}

void sa__alloc_forget_large_pair(sa_arena *a) {
  atomic_fetch_sub_explicit(&a->stats.xslow_allocs, 1, memory_order_relaxed);
  atomic_fetch_sub_explicit(&a->stats.xlarge_allocs, 1, memory_order_relaxed);
  atomic_fetch_sub_explicit(&a->stats.xslow_frees, 1, memory_order_relaxed);
}

sa_status sa__alloc_unsynced(sa_arena *a, void **out, size_t size, sa_stream s) {
  return alloc_slow(a, out, size, s, SA_DEVICE_SYNC_NEVER);
}

/* The fast path, else alloc_generic: inline in sa_alloc and alloc_legacy,
 * which would otherwise make one more jump. a is read only once it is the
 * last entry's arena, which is never NULL (a detached entry's is
 * sa__detached_arena, no arena a caller holds): so a NULL arena needs no
 * test of its own here, and alloc_generic refuses it. */
static SA_ALWAYS_INLINE sa_status alloc_fast(sa_arena *a, void **out, size_t size, sa_stream s) {
  sa_tentry *e = sa__tentry_last();
  if (sa_likely(e != NULL && atomic_load_explicit(&e->xarena, memory_order_relaxed) == a &&
                size - 1 < sa__large_threshold(a) && e->stream == s &&
                e->epoch == atomic_load_explicit(&a->xstream_epoch, memory_order_relaxed))) {
    unsigned cls = sa_size_class(size);
    sa_tbin *b = &e->bins[cls];
    uint16_t n = b->n;
    if (sa_likely(n > 0)) {
      sa_cached_block blk = b->slots[n - 1];
      size_t bs = b->block_size;
      b->n = (uint16_t)(n - 1);
      atomic_store_explicit(blk.state, SA_BLOCK_LIVE, memory_order_relaxed);
      sa__count(&e->xfast_allocs);
      bool publish = sa__tentry_live_add(e, (int64_t)bs, bs);
      if (sa_unlikely(publish || a->hooks)) return alloc_fast_rare(a, e, blk.p, size, s, out);
      *out = blk.p;
      return SA_OK;
    }
  }
  return alloc_generic(a, out, size, s);
}

/* NULL (CUDA: also CU_STREAM_LEGACY) names the legacy stream of the
 * calling thread's current context, which may have changed since the
 * thread's entry for it was made: the driver checks it at every call
 * (sa__legacy_stream_check), here out of line, so that the fast path of
 * other streams makes no call but tail calls. A size the fast path does
 * not serve goes to alloc_generic, which checks after the size rules. */
SA_NOINLINE static sa_status alloc_legacy(sa_arena *a, void **out, size_t size, sa_stream s) {
  if (a == NULL || size - 1 >= sa__large_threshold(a)) return alloc_generic(a, out, size, s);
  sa_status st = a->drv->ops->legacy_stream_check(a->drv, s);
  if (st != SA_OK) {
    *out = NULL;
    return st;
  }
  return alloc_fast(a, out, size, s);
}

sa_status sa__alloc_on_device(sa_arena *a, void **out, size_t size, sa_stream s) {
  if (sa_unlikely(out == NULL)) return SA_ERR_INVALID_ARGUMENT; /* a NULL: alloc_generic */
  return alloc_fast(a, out, size, s);
}

sa_status sa_alloc(sa_arena *a, void **out, size_t size, sa_stream s) {
  if (sa_unlikely(out == NULL)) return SA_ERR_INVALID_ARGUMENT; /* a NULL: alloc_generic */
  if (sa_unlikely(sa_driver_stream_is_legacy(s))) return alloc_legacy(a, out, size, s);
  return alloc_fast(a, out, size, s);
}

