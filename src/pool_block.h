/* Graph pools: their state, and the contract of pool_block.c (the blocks).
 *
 * A pool (streamarena.h, "Graph pools") takes segments from its arena, as
 * ordinary large allocations on the pools' own stream (pool.c), and hands
 * out blocks of them, host-side: best fit, split and merged at
 * SA_POOL_ALIGN, PyTorch's block unit. Nothing of a segment goes back to
 * the arena before the pool's last release, so an address a capture baked
 * into a graph stays the graph's.
 *
 * A free block carries a tag: the stream that may take it at once, or none
 * (clean: any stream may). A block freed on s is tagged s; outside a
 * capture it also carries an event recorded on s at the free, after which
 * any stream may take it (once the event completed, or behind a wait on
 * the device). Freed during a capture of s, it is s's only (stream_only:
 * a capture refuses an event, and the graph's replays use it in capture
 * order), for good. A block recorded on other streams (sa_record_stream)
 * waits, pending, for events on them before it is free at all.
 * Neighbouring free blocks merge where their tags agree (a clean one takes
 * its neighbour's tag): a merged block keeps the later event of its
 * stream, which the pool's last release waits for, and is s's only if
 * either part was.
 *
 * The two files: pool.c, above alloc.c, holds the public calls and grows a
 * pool from the arena (sa_alloc's internal entry, alloc.h); pool_block.c,
 * below free.c and arena.c, holds the blocks, the registry of segments
 * that sa_free and sa_record_stream ask first (a segment is one live span
 * of the arena: a pool's block inside it is an interior pointer there), and
 * the pools' teardown at arena destroy. pool_block.c calls the event pool
 * and the driver only.
 *
 * Locks, in this order: the arena's registry of pools (pools.lock), then
 * one pool's lock, then the event pool's and the driver's own. Neither is
 * held while the arena allocates or frees (a segment's growth and return
 * happen without them), so the pool locks are independent of the arena's
 * (its lock, the reclaim lock, the stream map). Every function here runs
 * with the pool's lock held unless its comment says otherwise.
 */
#ifndef SA_POOL_BLOCK_H
#define SA_POOL_BLOCK_H

#include <pthread.h>

#include "base/base.h"
#include "base/chain_table.h"
#include "base/treap.h"
#include "driver/driver.h"

/* Blocks start and end at multiples of this (PyTorch's kMinBlockSize). */
#define SA_POOL_ALIGN ((size_t)512)

typedef struct sa_pool_seg_s sa_pool_seg;

/* Block states. */
enum {
  SA_PBLOCK_FREE = 0,    /* in the fit index */
  SA_PBLOCK_LIVE = 1,    /* handed out */
  SA_PBLOCK_PENDING = 2  /* freed, waiting for events on recorded streams */
};

typedef struct sa_pblock_s {
  sa_chain_link by_base;             /* the pool's blocks by base (key: base) */
  uintptr_t base;
  size_t size;                       /* a multiple of SA_POOL_ALIGN */
  sa_pool_seg *seg;
  struct sa_pblock_s *prev, *next;   /* neighbours in the segment, address order */
  sa_treap_node fit;                 /* free: the fit index */
  uint8_t state;                     /* SA_PBLOCK_* */
  /* Live: the stream it was allocated on. Free or pending: the stream of
   * its tag (tag nonzero). */
  sa_stream stream;
  uint64_t tag;                      /* free, pending: 0 clean, else sa__pool_tag(stream) */
  sa_event event;                    /* tagged: recorded on stream at the free, or
                                        NULL (freed in a capture) */
  bool stream_only;                  /* tagged: only stream may take it, whatever
                                        its event says (freed in a capture) */
  uint64_t seq;                      /* tagged: the pool's count of frees at its free */
  size_t request;                    /* live: the bytes asked for */
  sa_stream *recorded;               /* live: sa_record_stream's streams */
  unsigned nrecorded, recorded_cap;
  sa_event *waits;                   /* pending: events on the recorded streams */
  unsigned nwaits;
  struct sa_pblock_s *pending_next;  /* pending: the pool's list */
} sa_pblock;

struct sa_pool_seg_s {
  uintptr_t span;                    /* the arena's allocation, freed at the end */
  size_t span_size;                  /* its bytes (it may grow in place) */
  uintptr_t base;                    /* span rounded up to SA_POOL_ALIGN (a span
                                        carved in a free one is SA_ALIGNMENT's) */
  size_t size;                       /* what of the span the blocks tile */
  sa_pool *pool;
  sa_pblock *first;                  /* its blocks tile it, address order */
  sa_pool_seg *next;                 /* the pool's segments */
};

/* A pool (the public sa_pool). Its fields are the pool lock's. */
struct sa_pool_s {
  sa_arena *arena;
  pthread_mutex_t lock;
  unsigned uses;                     /* sa_pool_create's and sa_pool_retain's not
                                        released yet: 0, no allocation any more */
  bool returning;                    /* its segments are going back (free.c) */
  sa_event *ends;                    /* recorded by the releases of earlier uses */
  unsigned nends, ends_cap;
  sa_pool_seg *segs;
  sa_treap_node *fit_root;           /* free blocks by (tag, size, base) */
  sa_chain_table blocks;             /* every block by base */
  sa_pblock *pending;
  sa_pblock *spare;                  /* descriptors for reuse (linked by next) */
  uint64_t frees;                    /* blocks freed so far (their seq) */
  size_t nsegs, reserved;            /* segments and their bytes */
  size_t nlive, live_bytes, live_requested; /* live blocks, their sizes, requests */
  size_t nfree, free_bytes;          /* free blocks (pending ones not) */
  size_t nevented;                   /* free blocks with an event, not stream_only */
  sa_pool *next;            /* the arena's pools, or its tombstones */
#if SA_INVARIANTS
  sa_check_pace pace;                /* its validator's */
#endif
};

/* The arena's pools (pools.lock): the registry of their segments by
 * address, their list, and the stream they grow on. */
typedef struct sa_pools_s {
  pthread_mutex_t lock;
  sa_pool_seg **segs;                /* by base, for sa_free's lookup */
  size_t nsegs, segs_cap;
  _Atomic size_t xnsegs;             /* read unlocked: 0, no pool block anywhere */
  sa_pool *live, *released; /* the pools, and tombstones of released ones */
  /* The pools' growth stream, made with the first pool: read unlocked by
   * sa_alloc, whose growths on it map nothing ahead (alloc.c). */
  _Atomic(sa_stream) xstream;
} sa_pools;

/* The pools' growth stream, NULL before the first pool. No lock needed. */
static inline sa_stream sa__pools_stream(sa_pools *ps) {
  return atomic_load_explicit(&ps->xstream, memory_order_acquire);
}

/* A stream's tag: never 0, which means clean (NULL is a stream too). */
static inline uint64_t sa__pool_tag(sa_stream s) { return (uint64_t)(uintptr_t)s + 1; }

/* ---- the arena's registry (pools.lock taken inside; no pool lock held) -- */

/* The pools' state at arena creation, and at destroy, after the device's
 * work completed: every pool goes (tombstones too), then the growth
 * stream; the status of its destroy. */
void sa__pools_init(sa_arena *a);
sa_status sa__pools_fini(sa_arena *a);
/* The segments of every pool (released ones included), and the live
 * blocks of those pools: sa_arena_destroy's count of the caller's leaks. */
void sa__pools_count(sa_arena *a, uint64_t *segments, uint64_t *live_blocks);
/* A new pool into the arena's list; the growth stream is made with the
 * first (SA_ERR_DRIVER and the like: the pool is not added). */
sa_status sa__pools_add(sa_arena *a, sa_pool *pool);
/* A segment into the registry, where sa_free finds it; SA_ERR_OUT_OF_MEMORY
 * (host). */
sa_status sa__pools_register(sa_arena *a, sa_pool_seg *seg);
/* seg, still pool's (not returning) and its span still of old_size bytes,
 * grown in place to span_size bytes (pool.c: the arena's span grew): the
 * memory added joins its last block if that is free, else is a clean free
 * block, described by b (sa__pblock_new's). False, nothing changed, where
 * the pool let seg go meanwhile (a release that raced the growth: the
 * memory stays the span's, given back with it). */
bool sa__pools_extend(sa_arena *a, sa_pool *pool, sa_pool_seg *seg, size_t old_size,
                      size_t span_size, sa_pblock *b);
/* A segment out of the registry (it stays the pool's). */
void sa__pools_unregister(sa_arena *a, sa_pool_seg *seg);
/* The pool whose segment holds p, returned with its lock held (and *seg);
 * NULL if no segment does. */
sa_pool *sa__pools_lock_owner(sa_arena *a, uintptr_t p, sa_pool_seg **seg);
/* The pool's segments go back to the arena (free.c): s is ordered after
 * what they wait for (sa__pool_order_release), then they leave the
 * registry, so that sa_free frees them as the arena's spans. On failure
 * (that status) nothing changed. */
sa_status sa__pools_withdraw(sa_arena *a, sa_pool *pool, sa_stream s);
/* Those segments that stayed (their free failed) back into the registry;
 * it never shrinks, so this cannot fail. */
void sa__pools_restore(sa_arena *a, sa_pool *pool);
/* The pool, empty now, to the tombstones. */
void sa__pools_retire(sa_arena *a, sa_pool *pool);

/* ---- sa_free's and sa_record_stream's way in (no lock held) -------------- */

/* Whether p lies in a pool's segment, and then, in *st, the status of its
 * free on s as sa_free states it: its block goes back to its pool. *drained:
 * the pool, when that free was the last live block of a pool whose last
 * use was released (its segments are the caller's to give back), else
 * NULL. */
bool sa__pool_route_free(sa_arena *a, uintptr_t p, sa_stream s, sa_status *st,
                         sa_pool **drained);
/* The same for sa_record_stream(p, other). */
bool sa__pool_route_record(sa_arena *a, uintptr_t p, sa_stream other, sa_status *st);

/* ---- blocks (pool lock held) -------------------------------------------- */

/* A descriptor, zeroed: the pool's spare (pool NULL: none, and no lock
 * needed); NULL when out of memory. */
sa_pblock *sa__pblock_new(sa_pool *pool);
/* seg (base and size set) into the pool, its whole memory one clean free
 * block described by b (sa__pblock_new's). */
void sa__pool_seg_add(sa_pool *pool, sa_pool_seg *seg, sa_pblock *b);
/* seg's last block (any state). */
sa_pblock *sa__pool_seg_last(const sa_pool_seg *seg);
/* seg out of the pool, its blocks and their events gone, seg freed. */
void sa__pool_seg_remove(sa_pool *pool, sa_pool_seg *seg);
/* The best fit for size bytes (a multiple of SA_POOL_ALIGN) that stream
 * may take with no driver call: tagged stream, or clean. NULL if none. */
sa_pblock *sa__pool_fit(sa_pool *pool, size_t size, sa_stream stream);
/* Make more fit: pending blocks whose events completed become free, free
 * blocks whose event completed (not stream_only) become clean (event queries, which the
 * driver makes in the relaxed capture mode: they disturb no capture). */
void sa__pool_settle(sa_pool *pool);
/* Where no free block holds size bytes for stream: neighbouring free
 * blocks that stream may take (clean ones and its own), joined into one
 * that holds it, the smallest such run; NULL if none. The joined block is
 * the stream's where any part was (a clean part waits with it for the
 * stream's event, or is the stream's only): so only on demand, when it
 * saves a growth. No driver call. */
sa_pblock *sa__pool_fit_joined(sa_pool *pool, size_t size, sa_stream stream);
/* The free block that holds [at, at + size) for stream (clean or its
 * own), joining such neighbours where the range crosses into them; NULL if
 * a byte of the range is in use, outside the pool, or another stream's. */
sa_pblock *sa__pool_free_at(sa_pool *pool, uintptr_t at, size_t size, sa_stream stream);
/* The best fit among free blocks of other streams that carry an event
 * (not stream_only),
 * once stream waits for that event on the device: NULL if none fits, or
 * the driver refused the wait (stream is being captured: nothing
 * enqueued). */
sa_pblock *sa__pool_fit_waiting(sa_pool *pool, size_t size, sa_stream stream);
/* Whether stream may take the free block b with no driver call. */
bool sa__pool_usable(const sa_pblock *b, sa_stream stream);
/* The free block b made clean, merged with its neighbours; its event, if
 * any, completed and went back to the arena's (sa__event_retire). Returns
 * the block that holds b's memory now. */
sa_pblock *sa__pool_clean(sa_pool *pool, sa_pblock *b);
/* Hand size bytes of the free block b, from address at, to stream as a
 * live block of request bytes; the rest stays free. The handout must be
 * ordered after b's guard already. Returns the live block; NULL (nothing
 * changed) when out of memory. */
sa_pblock *sa__pool_carve(sa_pool *pool, sa_pblock *b, uintptr_t at, size_t size,
                          size_t request, sa_stream stream);
/* The live block b, untouched since its handout (the stream-order checker
 * refused it), free again for its stream. */
void sa__pool_uncarve(sa_pool *pool, sa_pblock *b);
/* The block that holds p, any state; NULL if none. */
sa_pblock *sa__pool_block_at(sa_pool *pool, uintptr_t p);
/* The last release on s: s waits on the device for the earlier releases'
 * events and for every free's on another stream not yet complete.
 * SA_ERR_STREAM_CAPTURING (s captured: nothing enqueued), a failed wait's
 * status; nothing else changes either way. */
sa_status sa__pool_order_release(sa_pool *pool, sa_stream s);
/* A use's release, not the last: an event on s that the last one orders
 * after (SA_ERR_STREAM_CAPTURING and the like: none recorded). */
sa_status sa__pool_end_use(sa_pool *pool, sa_stream s);
/* Everything the pool holds goes: blocks, segments (their memory given
 * back or given up by the caller), events back to the arena's, the table;
 * the pool keeps its lock and counts (a tombstone). */
void sa__pool_clear(sa_pool *pool);
/* Validator: segments tiled by their blocks, the counts, the fit index
 * holding the free blocks and only them, in order, no two neighbours that
 * could merge. Returns the blocks visited. */
size_t sa__pool_check(const sa_pool *pool);
/* Every live pool's, and the registry's order (takes the locks; the
 * world check's share, report.c). */
void sa__pools_check(sa_arena *a);

#endif /* SA_POOL_BLOCK_H */
