/* sa_free and sa_record_stream: the free fast path and its slow path (free.h).
 *
 * Fast path (same thread, same stream as the last call, a live block of a
 * superblock its stream owns, room in the bin): the page map, the block's
 * index, one state byte, a stack push, two owner-only counters. Everything
 * else goes through free_generic: a span (span.c frees it under the arena
 * lock), a block of another stream (a cross-stream batch), a recorded
 * block (events on its recorded streams), a graph pool's block (in span
 * memory: its pool takes it, pool_block.c, before any span lookup), and
 * every bad pointer, which is named without a change (README's "Bad
 * input").
 */
#include <stdlib.h>

#include "free.h"
#include "arena.h"
#include "base/base.h"
#include "base/event_pool.h"
#include "base/hook.h"
#include "base/record.h"
#include "driver/driver.h"
#include "large/kept.h"
#include "large/span.h"
#include "pool_block.h"
#include "registry.h"
#include "small/stream_arena.h"
#include "small/stream_return.h"
#include "small/superblock.h"
#include "small/thread_cache.h"
#include "trace.h"
#include "vm/va_space.h"

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

/* Whether find_block looks a span up (under the arena lock): sa_free's
 * slow path does not, as sa__span_free looks up and frees at once. */
typedef enum span_lookup_e { SPAN_NOT_LOOKED_UP, SPAN_LOOKED_UP } span_lookup;

/* Locate p's block: SA_OK with *ref, or why not. */
static sa_status find_block(sa_arena *a, uintptr_t p, span_lookup lookup, block_ref *ref) {
  sa_desc *desc = sa__pagemap_get(&a->range, p);
  *ref = (block_ref){0};
  if (desc == NULL) return SA_ERR_INVALID_POINTER;
  if (desc->kind == SA_DESC_RUN) {
    ref->in_run = true;
    if (lookup == SPAN_NOT_LOOKED_UP) return SA_OK;
    sa_status st = sa__span_find(a, p, &ref->span);
    if (st == SA_OK) ref->state = &ref->span->xstate;
    return st;
  }
  sa_superblock *sb = (sa_superblock *)desc;
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
static sa_status locate_live(void *ptr, span_lookup lookup, sa_arena **a, block_ref *ref) {
  uintptr_t p = (uintptr_t)ptr;
  if (ptr == NULL || (*a = sa__arena_of(p)) == NULL) return SA_ERR_INVALID_POINTER;
  sa_status st = find_block(*a, p, lookup, ref);
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
  sa__tentry_live_account(e, -(int64_t)request, 0);
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
  sa__tentry_live_account(e, -(int64_t)request, 0);
  return SA_OK;
}

/* A block freed on a stream other than its owner's, or a recorded one. */
static sa_status free_deferred(sa_arena *a, sa_tentry *e, sa_superblock *sb, uint32_t idx,
                               void *p, sa_stream s) {
  _Atomic uint8_t *state = &sb->state[idx];
  bool recorded = atomic_load_explicit(state, memory_order_relaxed) == SA_BLOCK_RECORDED;
  if (!recorded) {
    sa_deferred *batch = e->out;
    if (batch != NULL &&
        (batch->owner != sb->owner || batch->freer != e->sarena || batch->n == SA_BATCH_MAX)) {
      sa_status st = sa__tentry_flush_out(e, SA_NAMED);
      if (st != SA_OK) return st; /* could not record its event: the batch stays */
      batch = NULL;
    }
    if (batch == NULL) {
      batch = sa__deferred_new(1);
      if (batch == NULL) return SA_ERR_OUT_OF_MEMORY;
      batch->owner = sb->owner;
      batch->freer = e->sarena;
      e->out = batch;
    }
    atomic_store_explicit(state, SA_BLOCK_DEFERRED, memory_order_relaxed);
    batch->blocks[batch->n].p = p;
    batch->blocks[batch->n].state = state;
    batch->n++;
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
  sa_deferred *batch = sa__deferred_new(n + 1);
  sa_status st = batch == NULL ? SA_ERR_OUT_OF_MEMORY : SA_OK;
  for (unsigned i = 0; st == SA_OK && i <= n; i++) {
    sa_stream t = i < n ? r->streams[i] : s;
    if (i == n && own) break; /* the owner's own stream orders itself */
    if (t == owner->stream && owner_orders) continue;
    st = sa__event_record_new(a, t, &batch->events[batch->nevents]);
    if (st == SA_OK && batch->nevents++ == 0) batch->on = t; /* its pending lane */
  }
  if (st != SA_OK) {
    for (unsigned i = 0; batch != NULL && i < batch->nevents; i++)
      sa__event_drop(a, batch->events[i]);
    sa__deferred_free(batch);
    sa__record_restore(a, r);
    sa__record_use_end(a);
    return st;
  }
  sa__record_free(a, r);
  sa__record_use_end(a);
  batch->owner = sb->owner;
  batch->freer = e->sarena;
  atomic_store_explicit(state, SA_BLOCK_DEFERRED, memory_order_relaxed);
  batch->blocks[0].p = p;
  batch->blocks[0].state = state;
  batch->n = 1;
  sa__stream_arena_push_deferred(sb->owner, batch);
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
  if (st == SA_OK) sa__tentry_live_account(e, -(int64_t)bs, bs);
  return st;
}

sa_status sa__pool_give_back(sa_arena *a, sa_pool *pool, sa_stream s) {
  sa_status st = sa__pools_withdraw(a, pool, s);
  bool withdrawn = st == SA_OK;
  /* Out of the registry, the segments are live spans like any: each is
   * freed on s. Nothing else touches them (returning: no allocation, no
   * live block). */
  while (st == SA_OK && pool->segs != NULL) {
    sa_pool_seg *seg = pool->segs;
    st = sa__free_slow((void *)seg->span, s, SA_FREE_TRACED);
    if (st != SA_OK) break;
    pthread_mutex_lock(&pool->lock);
    sa__pool_seg_remove(pool, seg);
    pthread_mutex_unlock(&pool->lock);
  }
  if (st != SA_OK) {
    if (withdrawn) sa__pools_restore(a, pool);
    pthread_mutex_lock(&pool->lock);
    pool->returning = false;
    pthread_mutex_unlock(&pool->lock);
    return st;
  }
  pthread_mutex_lock(&pool->lock);
  sa__pool_clear(pool);
  pthread_mutex_unlock(&pool->lock);
  sa__pools_retire(a, pool);
  return SA_OK;
}

sa_status sa__free_slow(void *ptr, sa_stream s, sa_free_trace trace) {
  sa_arena *a;
  block_ref ref;
  sa_status st = locate_live(ptr, SPAN_NOT_LOOKED_UP, &a, &ref);
  if (st != SA_OK) return st;
  /* A pool's block lies in a segment, a live span: its pool frees it. */
  sa_pool *drained;
  if (ref.in_run && sa__pool_route_free(a, (uintptr_t)ptr, s, &st, &drained)) {
    /* The last block of a released pool: the free stands whatever becomes
     * of its segments, which stay the pool's (until the arena goes) if
     * they cannot go back on s. */
    if (drained != NULL) (void)sa__pool_give_back(a, drained, s);
    return st;
  }
  uint8_t state = ref.state != NULL ? atomic_load_explicit(ref.state, memory_order_relaxed) : 0;
  /* A span is looked up with its free only where s's entry is at hand:
   * else a bad pointer would bind s first (a stream arena, an eviction, a
   * driver call on s), which a bad small block never does. */
  sa_tentry *last = sa__tentry_last();
  bool at_hand = last != NULL && sa__tentry_current(last, a, s) && last->sarena != NULL &&
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
  if (sa_likely(a->trace == NULL || trace == SA_FREE_UNTRACED)) {
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

/* Is keeping worth a try on e? Not while its kept spans go back unused
 * (SA_KEPT_UNUSED_MAX in a row): then one free in SA_KEPT_PROBE looks
 * whether the thread's requests repeat again. */
static bool keeping_pays(sa_tentry *e) {
  if (e->kept_unused < SA_KEPT_UNUSED_MAX) return true;
  return ++e->kept_passed % SA_KEPT_PROBE == 0;
}

/* Keep the span at ptr, freed on s, in the thread's entry for s (the last
 * one, which keeps none yet) for s's next request of its size
 * (large/kept.h): true where it was kept. Not where a pool's block may lie
 * in span memory (its pool frees it), nor on a stream being captured (the
 * free is refused there, sa__free_slow says so). */
static bool keep_span(sa_tentry *e, void *ptr, sa_stream s) {
  sa_arena *a = atomic_load_explicit(&e->xarena, memory_order_relaxed);
  if (!(a->cfg.flags & SA_FLAG_KEEP_SPANS) ||
      e->epoch != atomic_load_explicit(&a->xstream_epoch, memory_order_relaxed) ||
      e->sarena == NULL || atomic_load_explicit(&a->pools.xnsegs, memory_order_acquire) != 0 ||
      !keeping_pays(e))
    return false;
  sa_desc *desc = sa__pagemap_at(&a->range, (uintptr_t)ptr - e->va_base);
  if (desc == NULL || desc->kind != SA_DESC_RUN) return false;
  if (sa__legacy_stream_check(a, s) != SA_OK) return false;
  if (a->drv->ops->stream_capture_check(a->drv, s) != SA_OK) return false;
  sa_span *sp;
  size_t request;
  if (!sa__span_keep(a, e->sarena, (uintptr_t)ptr, &sp, &request)) return false;
  e->kept_request = request;
  if (e->kept_unused < SA_KEPT_UNUSED_MAX) e->kept_unused++; /* until it is reused */
  atomic_store_explicit(&e->xkept, sp, memory_order_relaxed);
  sa__count(&e->xfast_frees);
  sa__tentry_live_account(e, -(int64_t)request, request); /* as alloc_kept */
  if (a->trace != NULL) sa__trace(a, 'f', ptr, 0, s);
  return true;
}

SA_NOINLINE static sa_status free_generic(void *ptr, sa_stream s) {
  if (ptr == NULL) return SA_OK; /* the fast path never takes it: no range holds 0 */
  /* The entry's arena is read only for a pointer in its range, as in
   * free_fast: a detached entry's range is empty. */
  sa_tentry *e = sa__tentry_last();
  if (e != NULL && atomic_load_explicit(&e->xkept, memory_order_relaxed) == NULL && e->stream == s &&
      (uintptr_t)ptr - e->va_base < e->va_size && keep_span(e, ptr, s))
    return SA_OK;
  return sa__free_slow(ptr, s, SA_FREE_TRACED);
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
   * that range was created after the destroy detached e, which then points
   * at sa__detached_arena, whose stream epoch no entry ever has. NULL is in
   * no range: free_generic takes it. */
  uintptr_t at = e != NULL ? (uintptr_t)ptr - e->va_base : 0; /* its offset there */
  if (sa_likely(e != NULL && e->stream == s && at < e->va_size)) {
    sa_arena *a = atomic_load_explicit(&e->xarena, memory_order_relaxed);
    sa__hook_fast(SA_HOOK_FREE_FAST_ARENA, a);
    if (sa_likely(e->epoch == atomic_load_explicit(&a->xstream_epoch, memory_order_relaxed))) {
      sa_desc *desc = sa__pagemap_at(&a->range, at);
      if (sa_likely(desc != NULL && desc->kind == SA_DESC_SUPERBLOCK)) {
        sa_superblock *sb = (sa_superblock *)desc;
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
          bool publish = sa__tentry_live_add(e, -(int64_t)bs, bs);
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
  if (a == NULL || a == &sa__detached_arena ||
      a->drv->ops->legacy_stream_check(a->drv, s) != SA_OK)
    return free_generic(ptr, s);
  return free_fast(ptr, s);
}

sa_status sa__free_on_device(void *ptr, sa_stream s) { return free_fast(ptr, s); }

sa_status sa_free(void *ptr, sa_stream s) { /* NULL: free_generic */
  if (sa_unlikely(sa_driver_stream_is_legacy(s))) return free_legacy(ptr, s);
  return free_fast(ptr, s);
}

/* ------------------------------------------------------------------------
 * sa_record_stream
 * ---------------------------------------------------------------------- */
sa_status sa_record_stream(void *ptr, sa_stream other) {
  sa_arena *a;
  block_ref ref;
  sa_status st = locate_live(ptr, SPAN_NOT_LOOKED_UP, &a, &ref);
  if (st == SA_OK && ref.in_run) {
    if (sa__pool_route_record(a, (uintptr_t)ptr, other, &st)) return st; /* a pool's block */
    st = locate_live(ptr, SPAN_LOOKED_UP, &a, &ref);
  }
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
