/* sa_alloc, sa_free, sa_record_stream: the fast paths and their slow paths;
 * and the loop that gets memory back when an allocation would pass the
 * footprint target or a budget (sa__physical_soft_limit, alloc_reclaiming; sa_trim,
 * sa_defragment).
 *
 * Fast path (same thread, same stream as the last call, block in the thread
 * cache): a class computation, a stack pop or push, one state byte, two
 * owner-only counters. Everything else goes through the _generic paths,
 * which also do tracing and stream-order checking when those are on.
 *
 * The lower layers never reach back up: a span or a superblock that would
 * grow past its limit (after the span layer's own reshape) fails with
 * SA_ERR_OUT_OF_MEMORY, and alloc_reclaiming has reclaim.c unmap what is
 * free (this thread's cached blocks first, where they pin superblocks),
 * and tries again.
 */
#include <stdlib.h>

#include "arena.h"
#include "base/base.h"
#include "base/event_pool.h"
#include "base/hook.h"
#include "base/record.h"
#include "driver/driver.h"
#include "large/span.h"
#include "reclaim.h"
#include "registry.h"
#include "report.h"
#include "small/size_class.h"
#include "small/stream_arena.h"
#include "small/stream_return.h"
#include "small/superblock.h"
#include "small/thread_cache.h"
#include "trace.h"
#include "vm/physical.h"
#include "vm/va_space.h"

static inline size_t large_threshold(const sa_arena *a) {
  return atomic_load_explicit(&a->xlarge_threshold, memory_order_relaxed);
}

/* Publish the thread's live-byte delta once it strays beyond the slack plus
 * one block (block: the size of the small block counted, 0 for a span).
 * Alloc+free pairs of one small block, however large, then never touch the
 * arena's shared counters (an atomic read-modify-write on a line every
 * thread writes); the arena's count stays within SA_LIVE_FLUSH_BYTES plus
 * the largest small block per thread. */
static inline bool live_add(sa_tentry *e, int64_t delta, size_t block) {
  int64_t live = e->live_delta + delta;
  e->live_delta = live;
  return sa_unlikely(sa__live_due(live, block)); /* time to publish */
}

static inline void live_account(sa_tentry *e, int64_t delta, size_t block) {
  if (live_add(e, delta, block)) sa__tentry_publish_live(e);
}

static inline bool entry_current(const sa_tentry *e, const sa_arena *a, sa_stream s) {
  return atomic_load_explicit(&e->xarena, memory_order_relaxed) == a && e->stream == s &&
         e->epoch == atomic_load_explicit(&a->xstream_epoch, memory_order_relaxed);
}

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
  live_account(e, (int64_t)b->block_size, b->block_size);
  (void)a;
  *out = blk.p;
  return SA_OK;
}

/* limit: the physical bytes a span or a superblock may take the arena to. */
static sa_status try_alloc(sa_arena *a, sa_tentry *e, size_t size, size_t limit, void **out) {
  if (size > large_threshold(a)) {
    sa_status st = sa__span_alloc(a, e->sarena, size, limit, out);
    if (st == SA_OK) {
      live_account(e, (int64_t)size, 0);
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
  sa__tentry_flush_own(a, e->sarena, capturing(a, s));
}

/* Allocate; past a limit, get memory back and try again:
 *   1. within the soft limit (sa__physical_soft_limit); a span that would grow past it
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
 * step 2 did the same; step 5 while s is being captured into a graph. */
static sa_status alloc_reclaiming(sa_arena *a, sa_tentry *e, size_t size, sa_stream s,
                                  void **out) {
  bool large = size > large_threshold(a);
  size_t soft = sa__physical_soft_limit(a), hard = a->physical.cap;
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
        sa__reclaim(a, need, false, SA_RECLAIM_ALL);
        all_reclaimed = true;
      } else if (!large && allowance >= need) {
        sa__reclaim(a, need, false, SA_RECLAIM_SPANS);
      } else if (large && allowance >= a->gran) {
        give_back_cached(a, e, s);
        sa__reclaim(a, need, false, SA_RECLAIM_SUPERBLOCKS);
      }
      limit = soft;
    } else if (step == 3) {
      if (soft >= hard) continue; /* nothing to give way */
    } else if (step == 4) {
      if (all_reclaimed && soft >= hard) continue; /* step 2 did this */
      give_back_cached(a, e, s);
      sa__reclaim(a, need, false, SA_RECLAIM_ALL);
    } else if (step == 5) {
      /* This step waits for the whole device: what threads gave back
       * without an event on its stream becomes usable too. Not while s is
       * captured: CUDA fails the wait then and invalidates the capture. */
      if (capturing(a, s)) continue;
      sa__tentry_flush_own(a, e->sarena, false);
      sa__reclaim(a, need, true, SA_RECLAIM_ALL);
    } else if (a->cfg.oom_callback != NULL && callbacks++ < 8 &&
               a->cfg.oom_callback(a, size, s, a->cfg.oom_user_data)) {
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

/* The calling thread's cached blocks back, everything free unmapped (with
 * wait: after the work pending on it), then cached chunks released down to
 * keep_bytes. */
static sa_status trim_to(sa_arena *a, size_t keep_bytes, bool wait) {
  if (a == NULL) return SA_ERR_INVALID_ARGUMENT;
  sa__tentry_flush_own(a, NULL, false);
  sa__reclaim(a, 0, wait, SA_RECLAIM_ALL);
  sa__reclaim_release(a, keep_bytes);
  SA_VALIDATE(sa__world_check(a));
  return SA_OK;
}

sa_status sa_trim(sa_arena *a, size_t keep_bytes) { return trim_to(a, keep_bytes, true); }

sa_status sa_defragment(sa_arena *a) {
  return a == NULL ? SA_ERR_INVALID_ARGUMENT : trim_to(a, a->cfg.release_threshold_bytes, false);
}

static sa_status free_slow(void *ptr, sa_stream s, bool trace);

/* Tracing and stream-order checking, for both paths. */
SA_NOINLINE static sa_status after_alloc(sa_arena *a, void *p, size_t size, sa_stream s,
                                         void **out) {
  if ((a->cfg.flags & SA_FLAG_CHECK_STREAM_ORDER) && a->drv->ops->check_handout != NULL) {
    sa_status st = a->drv->ops->check_handout(a->drv, (uintptr_t)p, size, s);
    if (st != SA_OK) {
      *out = NULL;
      /* Back where it came from; the caller gets nothing. Untraced: the
       * allocation failed, so no alloc line opened it. */
      (void)free_slow(p, s, false);
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
  size_t bytes = size > large_threshold(a) ? size : sa_class_size(sa_size_class(size));
  size_t granules = (bytes >> a->gran_shift) + ((bytes & (a->gran - 1)) != 0);
  return granules <= SIZE_MAX >> a->gran_shift ? granules << a->gran_shift : SIZE_MAX;
}

SA_NOINLINE static sa_status alloc_generic(sa_arena *a, void **out, size_t size, sa_stream s) {
  *out = NULL;
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
  if (e->out != NULL) (void)sa__tentry_flush_out(e, true); /* stays on failure */
  void *p;
  st = alloc_reclaiming(a, e, size, s, &p);
  if (st != SA_OK) return st;
  atomic_fetch_add_explicit(&a->stats.xslow_allocs, 1, memory_order_relaxed);
  if (sa_unlikely(a->hooks)) return after_alloc(a, p, size, s, out);
  *out = p;
  return SA_OK;
}

/* The fast path, else alloc_generic: inline in sa_alloc and alloc_legacy,
 * which would otherwise make one more jump. */
static SA_ALWAYS_INLINE sa_status alloc_fast(sa_arena *a, void **out, size_t size, sa_stream s) {
  sa_tentry *e = sa__tentry_last();
  if (sa_likely(e != NULL && size - 1 < large_threshold(a) && entry_current(e, a, s))) {
    unsigned cls = sa_size_class(size);
    sa_tbin *b = &e->bins[cls];
    uint16_t n = b->n;
    if (sa_likely(n > 0)) {
      sa_cached_block blk = b->slots[n - 1];
      size_t bs = b->block_size;
      b->n = (uint16_t)(n - 1);
      atomic_store_explicit(blk.state, SA_BLOCK_LIVE, memory_order_relaxed);
      sa__count(&e->xfast_allocs);
      bool publish = live_add(e, (int64_t)bs, bs);
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
  if (size - 1 >= large_threshold(a)) return alloc_generic(a, out, size, s);
  sa_status st = a->drv->ops->legacy_stream_check(a->drv, s);
  if (st != SA_OK) {
    *out = NULL;
    return st;
  }
  return alloc_fast(a, out, size, s);
}

sa_status sa_alloc(sa_arena *a, void **out, size_t size, sa_stream s) {
  if (sa_unlikely(a == NULL || out == NULL)) {
    if (out != NULL) *out = NULL;
    return SA_ERR_INVALID_ARGUMENT;
  }
  if (sa_unlikely(sa_driver_stream_is_legacy(s))) return alloc_legacy(a, out, size, s);
  return alloc_fast(a, out, size, s);
}

/* ------------------------------------------------------------------------
 * Free
 * ---------------------------------------------------------------------- */

/* A live block: a span, or a small block of a superblock. */
typedef struct block_ref_s {
  bool in_run;           /* p is in span memory ... */
  sa_span *span;         /* ... the live span there when looked up, or NULL */
  sa_superblock *sb;     /* else its superblock ... */
  uint32_t idx;          /* ... and index there */
  _Atomic uint8_t *state;
} block_ref;

/* Locate p's block: SA_OK with *ref, or why not. Spans are looked up (under
 * the arena lock) only with look_up_spans: sa_free looks up and frees at
 * once (sa__span_free). */
static sa_status find_block(sa_arena *a, uintptr_t p, bool look_up_spans, block_ref *ref) {
  sa_desc *d = sa__pagemap_get(&a->range, p);
  *ref = (block_ref){0};
  if (d == NULL) return SA_ERR_INVALID_POINTER;
  if (d->kind == SA_DESC_RUN) {
    ref->in_run = true;
    if (!look_up_spans) return SA_OK;
    sa_status st = sa__span_find(a, p, &ref->span);
    if (st == SA_OK) ref->state = &ref->span->xstate;
    return st;
  }
  sa_superblock *sb = (sa_superblock *)d;
  uintptr_t off = p - sb->hdr.base;
  uint32_t idx = sa__block_index(sb, off);
  /* A superblock on the global stack keeps its last geometry: a pointer
   * inside one of its blocks is no block start there either. */
  if ((uintptr_t)idx * sb->block_size != off || idx >= sb->nblocks)
    return SA_ERR_INVALID_POINTER;
  if (sb->owner == NULL) return SA_ERR_DOUBLE_FREE; /* whole superblock is free */
  ref->sb = sb;
  ref->idx = idx;
  ref->state = &sb->state[idx];
  return SA_OK;
}

/* The arena and the live block at p, or why p is not one: the common front
 * of sa_free's slow path and sa_record_stream (a span not looked up: see
 * find_block). */
static sa_status locate_live(void *ptr, bool look_up_spans, sa_arena **a, block_ref *ref) {
  uintptr_t p = (uintptr_t)ptr;
  if (ptr == NULL || (*a = sa__arena_of(p)) == NULL) return SA_ERR_INVALID_POINTER;
  sa_status st = find_block(*a, p, look_up_spans, ref);
  if (st != SA_OK || ref->state == NULL) return st;
  uint8_t now = atomic_load_explicit(ref->state, memory_order_relaxed);
  return now == SA_BLOCK_LIVE || now == SA_BLOCK_RECORDED ? SA_OK : SA_ERR_DOUBLE_FREE;
}

/* Free the span at p on e's stream, with an event on every stream
 * sa_record_stream named for it. On failure nothing changes. */
static sa_status free_recorded_span(sa_arena *a, sa_tentry *e, void *p) {
  /* From the take to the last event: a release of a recorded stream waits
   * (its user destroys the stream next). */
  sa__record_use_begin(a);
  sa_record *r = sa__record_take(a, (uintptr_t)p);
  unsigned n = r != NULL ? r->n : 0;
  /* A stream being captured, or no stream any more, refuses before any
   * event is recorded: then nothing changed. */
  sa_status st = SA_OK;
  for (unsigned i = 0; st == SA_OK && i <= n; i++)
    st = a->drv->ops->stream_capture_check(a->drv, i < n ? r->streams[i] : e->stream);
  /* A recorded NULL passed the current context's check when it was
   * recorded: it names the arena's device's legacy stream since, whatever
   * context is current at the free. */
  for (unsigned i = 0; st == SA_OK && i < n; i++)
    if (!sa_driver_stream_is_legacy(r->streams[i]))
      st = a->drv->ops->stream_validate(a->drv, r->streams[i]);
  size_t request = 0;
  if (st == SA_OK)
    st = sa__span_free(a, (uintptr_t)p, e->sarena, n > 0 ? r->streams : NULL, n, NULL, &request);
  if (st != SA_OK) {
    sa__record_restore(a, r); /* the span stays live, its record too */
    sa__record_use_end(a);
    return st;
  }
  sa__record_free(a, r);
  sa__record_use_end(a);
  live_account(e, -(int64_t)request, 0);
  return SA_OK;
}

/* The span at p freed on e's stream: one hold of the arena lock, unless
 * sa_record_stream named streams for it. */
static sa_status free_span(sa_arena *a, sa_tentry *e, void *p) {
  bool needs_records = false;
  size_t request = 0;
  sa_status st = sa__span_free(a, (uintptr_t)p, e->sarena, NULL, 0, &needs_records, &request);
  if (st != SA_OK) return st;
  if (needs_records) return free_recorded_span(a, e, p);
  live_account(e, -(int64_t)request, 0);
  return SA_OK;
}

/* A block freed on a stream other than its owner's, or a recorded one. */
static sa_status free_deferred(sa_arena *a, sa_tentry *e, sa_superblock *sb, uint32_t idx,
                               void *p, sa_stream s) {
  _Atomic uint8_t *state = &sb->state[idx];
  bool recorded = atomic_load_explicit(state, memory_order_relaxed) == SA_BLOCK_RECORDED;
  if (!recorded) {
    sa_deferred *d = e->out;
    if (d != NULL && (d->owner != sb->owner || d->freer != e->sarena || d->n == SA_BATCH_MAX)) {
      sa_status st = sa__tentry_flush_out(e, true);
      if (st != SA_OK) return st; /* could not record its event: the batch stays */
      d = NULL;
    }
    if (d == NULL) {
      d = sa__deferred_new(1);
      if (d == NULL) return SA_ERR_OUT_OF_MEMORY;
      d->owner = sb->owner;
      d->freer = e->sarena;
      e->out = d;
    }
    atomic_store_explicit(state, SA_BLOCK_DEFERRED, memory_order_relaxed);
    d->blocks[d->n].p = p;
    d->blocks[d->n].state = state;
    d->n++;
    return SA_OK;
  }
  /* Recorded: one batch of its own, with an event on every stream that
   * does not order the reuse by itself; the host waits for none of them.
   * On failure the block and its record stay as they were. */
  sa_stream_arena *owner = sb->owner;
  sa__record_use_begin(a); /* until its events are recorded, as free_span */
  sa_record *r = sa__record_take(a, (uintptr_t)p);
  unsigned n = r != NULL ? r->n : 0;
  bool own = owner == e->sarena;
  bool owner_orders = !sa__stream_arena_gone(owner); /* it gets the block back */
  sa_deferred *d = sa__deferred_new(n + 1);
  sa_status st = d == NULL ? SA_ERR_OUT_OF_MEMORY : SA_OK;
  for (unsigned i = 0; st == SA_OK && i <= n; i++) {
    sa_stream t = i < n ? r->streams[i] : s;
    if (i == n && own) break; /* the owner's own stream orders itself */
    if (t == owner->stream && owner_orders) continue;
    st = sa__event_record_new(a, t, &d->events[d->nevents]);
    if (st == SA_OK && d->nevents++ == 0) d->on = t; /* its pending lane */
  }
  if (st != SA_OK) {
    for (unsigned i = 0; d != NULL && i < d->nevents; i++) sa__event_drop(a, d->events[i]);
    sa__deferred_free(d);
    sa__record_restore(a, r);
    sa__record_use_end(a);
    return st;
  }
  sa__record_free(a, r);
  sa__record_use_end(a);
  d->owner = sb->owner;
  d->freer = e->sarena;
  atomic_store_explicit(state, SA_BLOCK_DEFERRED, memory_order_relaxed);
  d->blocks[0].p = p;
  d->blocks[0].state = state;
  d->n = 1;
  sa__stream_arena_push_deferred(sb->owner, d);
  return SA_OK;
}

/* Give the live block at ptr back on e's stream: into e's cache, a
 * cross-stream batch, or (a span) the free spans. */
static sa_status release(sa_arena *a, sa_tentry *e, const block_ref *ref, uint8_t state,
                         void *ptr) {
  if (ref->in_run) return free_span(a, e, ptr);
  sa_superblock *sb = ref->sb;
  size_t bs = sb->block_size;
  sa_status st = SA_OK;
  if (state == SA_BLOCK_LIVE && sb->owner == e->sarena) {
    sa_tbin *b = &e->bins[sb->cls];
    if (b->cap == 0 && sa__tbin_init(b, sb->cls) != SA_OK) return SA_ERR_OUT_OF_MEMORY;
    if (b->n == b->cap) sa__tentry_flush_bin(e, sb->cls, b->cap / 2);
    atomic_store_explicit(ref->state, SA_BLOCK_CACHED, memory_order_relaxed);
    b->slots[b->n].p = ptr;
    b->slots[b->n].state = ref->state;
    b->n++;
  } else {
    st = free_deferred(a, e, sb, ref->idx, ptr, e->stream);
  }
  if (st == SA_OK) live_account(e, -(int64_t)bs, bs);
  return st;
}

/* trace: write the free's line (false for a block no alloc line opened). */
static sa_status free_slow(void *ptr, sa_stream s, bool trace) {
  sa_arena *a;
  block_ref ref;
  sa_status st = locate_live(ptr, false, &a, &ref);
  if (st != SA_OK) return st;
  uint8_t state = ref.state != NULL ? atomic_load_explicit(ref.state, memory_order_relaxed) : 0;
  /* A span is looked up with its free only where s's entry is at hand:
   * else a bad pointer would bind s first (a stream arena, an eviction, a
   * driver call on s), which a bad small block never does. */
  sa_tentry *last = sa__tentry_last();
  bool at_hand = last != NULL && entry_current(last, a, s) && last->sarena != NULL &&
                 !atomic_load_explicit(&last->sarena->xunfenced, memory_order_relaxed);
  sa_span *sp;
  if (ref.in_run && !at_hand && (st = sa__span_find(a, (uintptr_t)ptr, &sp)) != SA_OK) return st;
  sa_tentry *e;
  st = sa__legacy_stream_check(a, s);
  if (st == SA_OK) st = sa__tentry_get(a, s, &e); /* validates the stream */
  if (st != SA_OK) {
    /* A bad pointer is named before a bad stream: a span not looked up
     * above (its entry needed a fence meanwhile, which failed) is now. */
    sa_status why = ref.in_run && at_hand ? sa__span_find(a, (uintptr_t)ptr, &sp) : SA_OK;
    return why != SA_OK ? why : st;
  }
  if (sa_likely(a->trace == NULL || !trace)) {
    st = release(a, e, &ref, state, ptr);
  } else {
    /* The free's line must precede the alloc line of any thread that gets
     * the memory next (a span or a recorded block is another stream's at
     * once): write it before the lock lets that thread trace. */
    pthread_mutex_lock(&a->tracing.lock);
    st = release(a, e, &ref, state, ptr);
    if (st == SA_OK) sa__trace_locked(a, 'f', ptr, 0, s);
    pthread_mutex_unlock(&a->tracing.lock);
  }
  if (st != SA_OK) return st;
  atomic_fetch_add_explicit(&a->stats.xslow_frees, 1, memory_order_relaxed);
  return SA_OK;
}

SA_NOINLINE static sa_status free_generic(void *ptr, sa_stream s) {
  return free_slow(ptr, s, true);
}

/* As alloc_fast_rare, for sa_free. */
SA_NOINLINE static sa_status free_fast_rare(sa_arena *a, sa_tentry *e, void *ptr, sa_stream s) {
  sa__tentry_publish_live(e);
  if (a->trace != NULL) sa__trace(a, 'f', ptr, 0, s);
  return SA_OK;
}

/* The fast path, else free_generic: inline in sa_free and free_legacy. */
static SA_ALWAYS_INLINE sa_status free_fast(void *ptr, sa_stream s) {
  sa_tentry *e = sa__tentry_last();
  /* The entry's arena may be another one, which another thread may be
   * destroying: read it only for a pointer in its range. A new arena in
   * that range was created after the destroy cleared e's arena. */
  uintptr_t at = e != NULL ? (uintptr_t)ptr - e->va_base : 0; /* its offset there */
  if (sa_likely(e != NULL && e->stream == s && at < e->va_size)) {
    sa_arena *a = atomic_load_explicit(&e->xarena, memory_order_relaxed);
    sa__hook_fast(SA_HOOK_FREE_FAST_ARENA, a);
    if (sa_likely(a != NULL &&
                  e->epoch == atomic_load_explicit(&a->xstream_epoch, memory_order_relaxed))) {
      sa_desc *d = sa__pagemap_at(&a->range, at);
      if (sa_likely(d != NULL && d->kind == SA_DESC_SUPERBLOCK)) {
        sa_superblock *sb = (sa_superblock *)d;
        uintptr_t off = (uintptr_t)ptr - sb->hdr.base;
        uintptr_t idx = sa__block_index(sb, off);
        size_t bs = sb->block_size;
        sa_tbin *b = &e->bins[sb->cls];
        uint16_t n = b->n;
        if (sa_likely(sb->owner == e->sarena && idx * bs == off && idx < sb->nblocks &&
                      n < b->cap &&
                      atomic_load_explicit(&sb->state[idx], memory_order_relaxed) ==
                          SA_BLOCK_LIVE)) {
          _Atomic uint8_t *state = &sb->state[idx];
          atomic_store_explicit(state, SA_BLOCK_CACHED, memory_order_relaxed);
          sa_cached_block *slot = &b->slots[n];
          slot->p = ptr;
          slot->state = state;
          b->n = (uint16_t)(n + 1);
          sa__count(&e->xfast_frees);
          bool publish = live_add(e, -(int64_t)bs, bs);
          if (sa_unlikely(publish || a->trace != NULL)) return free_fast_rare(a, e, ptr, s);
          return SA_OK;
        }
      }
    }
  }
  return free_generic(ptr, s);
}

/* As alloc_legacy, for the fast path's arena: the last entry's, read as
 * free_fast reads it. Without one, or where the check fails, free_slow
 * checks and says why, a bad pointer before a bad stream. */
SA_NOINLINE static sa_status free_legacy(void *ptr, sa_stream s) {
  sa_tentry *e = sa__tentry_last();
  uintptr_t at = e != NULL ? (uintptr_t)ptr - e->va_base : 0;
  sa_arena *a = e != NULL && e->stream == s && at < e->va_size
                    ? atomic_load_explicit(&e->xarena, memory_order_relaxed)
                    : NULL;
  if (a == NULL || a->drv->ops->legacy_stream_check(a->drv, s) != SA_OK)
    return free_generic(ptr, s);
  return free_fast(ptr, s);
}

sa_status sa_free(void *ptr, sa_stream s) {
  if (ptr == NULL) return SA_OK;
  if (sa_unlikely(sa_driver_stream_is_legacy(s))) return free_legacy(ptr, s);
  return free_fast(ptr, s);
}

/* ------------------------------------------------------------------------
 * sa_record_stream
 * ---------------------------------------------------------------------- */
sa_status sa_record_stream(void *ptr, sa_stream other) {
  sa_arena *a;
  block_ref ref;
  sa_status st = locate_live(ptr, true, &a, &ref);
  if (st == SA_OK) st = sa__legacy_stream_check(a, other); /* before "ordered already" */
  if (st != SA_OK) return st;
  /* A small block always comes back through its own stream, which orders
   * its reuse after that stream's work. A span freed on another stream may
   * go to any stream: its own stream must be recorded like any other. */
  if (ref.sb != NULL && ref.sb->owner->stream == other && !sa__stream_arena_gone(ref.sb->owner))
    return SA_OK; /* ordered already */
  st = a->drv->ops->stream_validate(a->drv, other);
  if (st != SA_OK) return st;
  st = sa__record_add(a, (uintptr_t)ptr, other);
  if (st != SA_OK) return st;
  atomic_store_explicit(ref.state, SA_BLOCK_RECORDED, memory_order_relaxed);
  return SA_OK;
}
