/* The arena: the state every layer keeps, in one struct per device.
 *
 * struct sa_arena_s holds the arena's own fields (its driver,
 * configuration and locks) and one sub-struct per layer, each defined in
 * that layer's header with the fields it writes: a reader finds a layer's
 * state and its contract in one header. Its leading cache line holds all
 * that the fast paths read.
 *
 * Where the layers meet: this header includes the headers that define the
 * sub-structs, from every tier, and any file of the allocator may include
 * it to reach its own layer's fields (C needs the whole struct for a
 * member access). It is the one header a file includes from a tier above
 * its own; the calls still go only down (tools/layers.py checks both).
 * Also the arena-wide helpers: live bytes and the legacy-stream check.
 */
#ifndef SA_ARENA_H
#define SA_ARENA_H

#include <pthread.h>
#include <stdio.h>

#include "base/base.h"
#include "base/device_sync.h"
#include "base/event_pool.h"
#include "base/hook.h"
#include "base/record.h"
#include "driver/driver.h"
#include "large/grower.h"
#include "large/span.h"
#include "pool_block.h"
#include "small/stream_arena.h"
#include "small/superblock.h"
#include "small/thread_cache.h"
#include "trace.h"
#include "vm/physical.h"
#include "vm/va_space.h"

/* Statistics kept on slow paths; arena.c reports them. */
typedef struct sa_counters_s {
  _Atomic int64_t xlive_bytes;
  _Atomic int64_t xlive_peak;
  _Atomic uint64_t xslow_allocs, xslow_frees; /* not served by a thread cache */
  _Atomic uint64_t xlarge_allocs;              /* of the slow allocations, spans */
  _Atomic size_t xdeferred_blocks;
  _Atomic uint64_t xoom_events, xdefrags;
} sa_counters;

struct sa_arena_s {
  /* The leading cache line: all that sa_alloc's and sa_free's fast paths
   * read of the arena. */
  sa_range range;                  /* the range and its page map (va_space.c) */
  _Atomic uint64_t xstream_epoch;  /* bumped when a stream arena goes (stream_arena.c) */
  _Atomic size_t xlarge_threshold; /* larger requests take a span (arena.c) */
  FILE *trace;                     /* the trace's file, NULL without (trace.c) */
  bool hooks;                      /* tracing or checking after each handout */

  /* The arena's own (arena.c). */
  uint64_t id;
  sa_driver *drv;
  sa_config cfg;
  size_t gran;
  unsigned gran_shift;
  bool large_threshold_explicit;
  pthread_mutex_t lock;         /* physical, va, spans, stream map, lists */
  pthread_mutex_t reclaim_lock; /* one reclaim pass at a time (reclaim.c); then the arena lock */

  /* One per layer, each defined in its header. */
  sa_va_space va;               /* vm/va_space.h */
  sa_physical physical;         /* vm/physical.h */
  sa_small small;               /* small/superblock.h */
  sa_spans spans;               /* large/span.h */
  sa_grower grower;             /* large/grower.h */
  sa_streams streams;           /* small/stream_arena.h */
  sa_sync sync;                 /* base/device_sync.h */
  sa_events events;             /* base/event_pool.h */
  sa_tcaches tcaches;           /* small/thread_cache.h */
  sa_records records;           /* base/record.h */
  sa_counters stats;            /* above; alloc.c, free.c, thread_cache.c, span.c write them */
  sa_tracing tracing;           /* trace.h */
  sa_pools pools;               /* pool_block.h */
};
_Static_assert(offsetof(sa_arena, hooks) < 64 && _Alignof(sa_arena) >= 64,
               "what the fast paths read fits the arena's leading cache line");

/* The arena's live-byte peak, raised to now if below. */
static inline void sa__live_peak_raise(sa_arena *a, int64_t now) {
  int64_t peak = atomic_load_explicit(&a->stats.xlive_peak, memory_order_relaxed);
  while (now > peak && !atomic_compare_exchange_weak_explicit(&a->stats.xlive_peak, &peak, now,
                                                              memory_order_relaxed,
                                                              memory_order_relaxed)) {
  }
}
/* The arena's live-byte count and its peak (thread caches publish theirs). */
static inline void sa__live_add(sa_arena *a, int64_t delta) {
  int64_t now =
      atomic_fetch_add_explicit(&a->stats.xlive_bytes, delta, memory_order_relaxed) + delta;
  sa__hook_fast(SA_HOOK_LIVE_ADDED, a); /* every span alloc and free publishes */
  sa__live_peak_raise(a, now);
}
/* Requests above it take a span; read on every sa_alloc. */
static inline size_t sa__large_threshold(const sa_arena *a) {
  return atomic_load_explicit(&a->xlarge_threshold, memory_order_relaxed);
}
/* Is e still the thread's entry for (a, s): its arena's, its stream's, no
 * stream arena gone since it was last checked? */
static inline bool sa__tentry_current(const sa_tentry *e, const sa_arena *a, sa_stream s) {
  return atomic_load_explicit(&e->xarena, memory_order_relaxed) == a && e->stream == s &&
         e->epoch == atomic_load_explicit(&a->xstream_epoch, memory_order_relaxed);
}
/* SA_OK, or SA_ERR_UNKNOWN_STREAM where s is NULL (CUDA: or
 * CU_STREAM_LEGACY) and the calling thread's current context is another
 * device's, whose legacy stream s names there (streamarena.h, on
 * sa_stream). A thread may switch contexts between calls while its cache
 * entry for (arena, s) stays, so every call that names s asks before it
 * uses the entry: the slow paths of alloc.c and free.c, sa_record_stream,
 * sa_stream_release, and (out of line, calling the driver directly) the
 * fast paths' alloc_legacy and free_legacy. Any other handle: one
 * compare. */
static inline sa_status sa__legacy_stream_check(sa_arena *a, sa_stream s) {
  if (sa_likely(!sa_driver_stream_is_legacy(s))) return SA_OK;
  return a->drv->ops->legacy_stream_check(a->drv, s);
}

/* Does the stream-order checker see a's handouts (check_stream_order, on
 * a driver that has one)? Then every handout, of the arena or a graph
 * pool, goes through the driver's check_handout. */
static inline bool sa__checks_handouts(const sa_arena *a) {
  return (a->cfg.flags & SA_FLAG_CHECK_STREAM_ORDER) && a->drv->ops->check_handout != NULL;
}

/* sa_alloc and sa_free (alloc.c, free.c) for a caller that runs inside the
 * driver's call_on_stream for a's device (a framework hook): it made that
 * device's context current, so on a legacy handle the fast paths skip the
 * check above, which would only read back what the caller made current.
 * Their slow paths check as ever. */
sa_status sa__alloc_on_device(sa_arena *a, void **out, size_t size, sa_stream s);
sa_status sa__free_on_device(void *ptr, sa_stream s);

#endif /* SA_ARENA_H */
