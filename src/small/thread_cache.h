/* Thread caches (thread_cache.c): one entry per (thread, arena, stream),
 * which the fast paths (alloc.c, free.c) pop and push without a lock.
 * Calls stream_arena.c; called by alloc.c, free.c and arena.c. */
#ifndef SA_SMALL_THREAD_CACHE_H
#define SA_SMALL_THREAD_CACHE_H

#include "../base/base.h"
#include "size_class.h"
#include "stream_arena.h"

#define SA_LIVE_FLUSH_BYTES (256u << 10) /* per-thread live-byte slack, plus a block */

/* A thread cache entry: one per (thread, arena, stream). */
typedef struct sa_tbin_s {
  uint16_t n, cap;
  uint32_t block_size; /* of its class: the fast paths need not compute it */
  sa_cached_block *slots;
} sa_tbin;

struct sa_tentry_s {
  _Atomic(sa_arena *) xarena; /* &sa__detached_arena once it is destroyed */
  sa_stream stream;
  sa_stream_arena *sarena;    /* bound (a reference); NULL: bound on next use */
  uint64_t epoch;             /* arena's stream epoch when last checked */
  /* The arena's range, copied: sa_free's fast path reads the arena only
   * for a pointer in it, whose arena no other thread may be destroying. */
  uintptr_t va_base;
  size_t va_size;
  sa_tbin bins[SA_CLASS_COUNT]; /* 16-byte aligned: none straddles a cache line */
  /* Counters: written by the owning thread only (no read-modify-write),
   * read by sa_get_stats. Slow-path counts are kept by the arena. */
  _Atomic uint64_t xfast_allocs, xfast_frees;
  int64_t live_delta;         /* not yet published to the arena */
  sa_deferred *out;           /* open cross-stream batch */
  /* A span freed on this stream, kept for its next request of kept_request
   * bytes (large/kept.h). Only the owner puts one; the owner and, under
   * entries_lock, a device-wide reclaim (sa__tentries_orphan_kept) take it,
   * by exchange. kept_request is the owner's. */
  _Atomic(struct sa_span_s *) xkept;
  size_t kept_request;
  _Atomic uint64_t xkept_reuses; /* large allocations it served (the owner's) */
  /* The owner's: spans kept since one was reused, and frees not kept
   * meanwhile (free.c's keep_span stops keeping where none is reused). */
  uint32_t kept_unused, kept_passed;
  uint64_t last_use;          /* its thread cache's clock: least recently used goes */
  struct sa_tentry_s *arena_next, *arena_prev; /* arena's entry list */
  struct sa_tentry_s *bound_next, *bound_prev; /* sarena's bound list */
  struct sa_tcache_s *cache;
};

/* The arena's thread cache entries (thread_cache.c's entries_lock). */
typedef struct sa_tcaches_s {
  sa_tentry *entries;
  /* The fast paths' counts of exited threads' entries. */
  _Atomic uint64_t xretired_fast_allocs, xretired_fast_frees, xretired_kept_reuses;
} sa_tcaches;

/* Entries per thread before the least recently used is evicted: a thread
 * cycling through several arenas and streams (8 streams in each of a few arenas)
 * must not evict on every switch. */
#define SA_TCACHE_ENTRIES 64
struct sa_tcache_s {
  sa_tentry *last; /* the one-entry "last stream" hit */
  unsigned n;
  uint64_t clock;  /* stamps last_use */
  sa_tentry *entries[SA_TCACHE_ENTRIES];
};

/* Initial-exec: in the shared library, the default (global-dynamic) model
 * makes every sa_alloc and sa_free call __tls_get_addr, and so need a stack
 * frame (See Note [Initial-exec thread-local]). The cost: the variable
 * takes 8 bytes of glibc's static TLS surplus when the library is loaded
 * with dlopen, which glibc reserves for exactly this (mimalloc and jemalloc
 * do the same). */
#define SA_TLS_FAST __attribute__((tls_model("initial-exec")))
extern _Thread_local struct sa_tcache_s *sa__tl_cache SA_TLS_FAST;
static inline sa_tentry *sa__tentry_last(void) {
  struct sa_tcache_s *tc = sa__tl_cache;
  return tc != NULL ? tc->last : NULL;
}

sa_status sa__tentry_get(sa_arena *a, sa_stream s, sa_tentry **out);
sa_status sa__tbin_init(sa_tbin *b, unsigned cls);
void sa__tentry_flush_bin(sa_tentry *e, unsigned cls, uint32_t keep); /* SA_NAMED */
/* Send e's open cross-stream batch on (SA_NAMED: behind an event now); the
 * driver's failure to record it is returned, the batch kept. */
sa_status sa__tentry_flush_out(sa_tentry *e, sa_named named);
void sa__tentry_publish_live(sa_tentry *e); /* its live-byte delta to the arena */
/* e's kept span, if any, back as a free on e's stream (large/kept.h):
 * SA_NAMED in a call naming it; else, or where that fails, an orphan. */
void sa__tentry_give_back_kept(sa_tentry *e, sa_named named);
/* e's kept span taken (NULL: none, or another thread took it). */
static inline struct sa_span_s *sa__tentry_take_kept(sa_tentry *e) {
  if (atomic_load_explicit(&e->xkept, memory_order_relaxed) == NULL) return NULL;
  return atomic_exchange_explicit(&e->xkept, NULL, memory_order_acquire);
}
/* Before a device-wide synchronize that no call names a stream for: every
 * thread's kept spans of a become orphans, which that synchronize makes
 * clean (large/kept.h). */
void sa__tentries_orphan_kept(sa_arena *a);
/* Is an unpublished live-byte delta past the slack plus one block (block:
 * the small block just counted, 0 for a span)? Then it is published. */
static inline bool sa__live_due(int64_t delta, size_t block) {
  int64_t limit = (int64_t)(SA_LIVE_FLUSH_BYTES + block);
  return delta >= limit || delta <= -limit;
}
/* Count delta live bytes on e; true when the delta is due for publishing
 * (sa__live_due). Alloc+free pairs of one small block, however large, then
 * never touch the arena's shared counters (an atomic read-modify-write on
 * a line every thread writes); the arena's count stays within
 * SA_LIVE_FLUSH_BYTES plus the largest small block per thread. */
static inline bool sa__tentry_live_add(sa_tentry *e, int64_t delta, size_t block) {
  int64_t live = e->live_delta + delta;
  e->live_delta = live;
  return sa_unlikely(sa__live_due(live, block));
}
/* The same, publishing when due. */
static inline void sa__tentry_live_account(sa_tentry *e, int64_t delta, size_t block) {
  if (sa__tentry_live_add(e, delta, block)) sa__tentry_publish_live(e);
}
/* Arena destroy: hand every entry of a back to its owner thread, which
 * frees it; a is never reached through them again. */
void sa__entries_detach(sa_arena *a);
/* What a detached entry's arena is: never NULL, so that the fast paths
 * compare and read it without a test of their own. No arena a caller
 * holds, it fails every fast-path test: no entry has its stream epoch
 * (UINT64_MAX), its range is empty and its large threshold 0. Nothing else
 * of it is read. */
extern struct sa_arena_s sa__detached_arena;
/* What the entries of a count, in one walk: the fast paths' allocations
 * and frees and the large allocations kept spans served (of exited
 * threads and live ones), and the spans live entries keep (large/kept.h)
 * with their bytes. */
typedef struct sa_tentry_counts_s {
  uint64_t fast_allocs, fast_frees, kept_reuses;
  size_t kept_spans, kept_bytes;
} sa_tentry_counts;
void sa__tentry_counts(sa_arena *a, sa_tentry_counts *out);
/* Which of the calling thread's entries sa__tentry_flush_own flushes:
 * every one, or all but the one bound to the stream the call names (a
 * capturing stream's: giving back would record an event on it). */
typedef enum sa_flush_own_e { SA_FLUSH_ALL = 0, SA_FLUSH_BUT_NAMED = 1 } sa_flush_own;
/* The calling thread's entries of a give everything back, the one bound
 * to named_sarena (may be NULL) as in a call naming its stream. */
void sa__tentry_flush_own(sa_arena *a, sa_stream_arena *named_sarena, sa_flush_own which);
void sa__tentry_publish_own(sa_arena *a); /* their live-byte deltas */
/* sa_stream_release: every thread's entries bound to sarena (gone) give their
 * blocks and open batches back now and let go of it. */
void sa__tentry_release_stream(sa_stream_arena *sarena);

#endif /* SA_SMALL_THREAD_CACHE_H */
