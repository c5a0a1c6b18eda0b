/* Stream arenas (stream_arena.c): what one stream owns of an arena, the
 * batches of blocks freed on another stream, and the arena's list and
 * index of its stream arenas. Calls superblock.c, timeline.c and the
 * services; called by thread_cache.c, alloc.c, arena.c, reclaim.c and the
 * reports. */
#ifndef SA_SMALL_STREAM_ARENA_H
#define SA_SMALL_STREAM_ARENA_H

#include <ck_stack.h>
#include <pthread.h>

#include "../base/base.h"
#include "../base/chain_table.h"
#include "../driver/driver.h"
#include "../large/timeline.h"
#include "size_class.h"
#include "superblock.h"

typedef struct sa_tentry_s sa_tentry; /* thread_cache.h */

#define SA_KEEP_EMPTY_SUPERBLOCKS 2 /* per stream, kept before going global */
#define SA_BATCH_MAX 64             /* blocks per cross-stream batch */
#define SA_LANE_LOOKUP 64           /* pending lanes a new batch looks at */

/* A block handed to a thread cache: the address and its state byte. */
typedef struct sa_cached_block_s {
  void *p;
  _Atomic uint8_t *state;
} sa_cached_block;

/* Blocks freed on another stream than their owner's, or after
 * sa_record_stream: usable by the owner once every event completed. */
typedef struct sa_deferred_s {
  ck_stack_entry_t link;            /* owner's inbox */
  _Atomic uint64_t xhandoff;        /* see sa__handoff_publish */
  struct sa_deferred_s *next;       /* owner's pending list: the next lane's first */
  struct sa_deferred_s *lane_next;  /* pending: the next batch of its lane */
  struct sa_deferred_s *lane_tail;  /* a lane's first batch: its last */
  sa_stream on;                     /* the stream events[0] was recorded on (its lane) */
  sa_stream_arena *owner;
  sa_stream_arena *freer;           /* freed on this stream arena (while open or parked) */
  uint64_t gen;                     /* the owner's stream (never given an event here:
                                       it orders the block's reuse there itself), and
                                       the freer's while parked, may use the blocks
                                       until a device sync of a later generation
                                       completed (device_sync.c); set when handed on */
  unsigned nevents;
  sa_event *events;                 /* inline_events, or more (sa__deferred_new) */
  sa_event inline_events[4];
  uint32_t n;
  sa_cached_block blocks[SA_BATCH_MAX];
} sa_deferred;

/* The batch an inbox entry is the link of. */
static inline sa_deferred *sa__deferred_of(const ck_stack_entry_t *e) {
  return (sa_deferred *)((const char *)e - offsetof(sa_deferred, link));
}

/* A batch with room for max_events events (a recorded block needs one per
 * stream); NULL when out of memory. Free with sa__deferred_free. */
static inline sa_deferred *sa__deferred_new(unsigned max_events) {
  sa_deferred *d = calloc(1, sizeof *d);
  if (d == NULL) return NULL;
  d->gen = UINT64_MAX;
  d->events = d->inline_events;
  if (max_events > sizeof d->inline_events / sizeof d->inline_events[0]) {
    d->events = malloc(max_events * sizeof *d->events);
    if (d->events == NULL) {
      free(d);
      return NULL;
    }
  }
  return d;
}
static inline void sa__deferred_free(sa_deferred *d) {
  if (d != NULL && d->events != d->inline_events) free(d->events);
  free(d);
}

/* A stream arena: one per (arena, stream). */
struct sa_stream_arena_s {
  sa_arena *arena;
  sa_stream stream;
  uint64_t sid;                      /* the driver's id of the stream (stream_id) */
  uint64_t id;                       /* unique in the arena; compared, never followed */
  pthread_mutex_t lock;
  CK_CC_CACHELINE ck_stack_t inbox; /* sa_deferred pushed by any thread */
  sa_superblock *bins[SA_CLASS_COUNT]; /* superblocks with free blocks */
  uint8_t carved[SA_CLASS_COUNT];     /* fresh superblocks carved for each class (saturates) */
  sa_superblock *empty;              /* empty superblocks kept here */
  unsigned nempty;
  sa_deferred *pending;              /* drained, events not complete: lanes */
  size_t pending_blocks;
  sa_deferred *parked;               /* batches freed here, waiting for an event here */
  size_t nsuperblocks;               /* owned (bins, full, empty) */
  _Atomic size_t xspans;             /* live spans allocated here */
  _Atomic size_t xentries;           /* thread cache entries bound here, and holders */
  sa_tentry *bound;                  /* those entries (thread_cache.c's entries_lock) */
  _Atomic bool xunfenced;            /* something here may wait for an event here */
  _Atomic bool xgone;                /* released, or its stream destroyed: no driver
                                        call on it again, never looked up again */
  bool synced;                       /* gone through sa_stream_release, which waited
                                        for its work (written before xgone) */
  bool doomed;                       /* reap's mark (streams.rw held for writing) */
  sa_timeline timeline;              /* span frees on this stream (arena lock) */
  struct sa_stream_arena_s *next, *prev; /* arena's list (lock; streams.rw to unlink) */
  sa_chain_link live_link;           /* key: stream; in the live index while not gone
                                        (arena lock) */
  struct sa_stream_arena_s *gone_next; /* arena's gone list, once gone (lock;
                                          streams.rw to unlink) */
#if SA_INVARIANTS /* last, and only where asserts are on: release layout unchanged */
  sa_check_pace pace, superblock_pace; /* its validator's, its superblocks' (lock) */
#endif
};

/* The arena's stream arenas. Their epoch, which the fast paths read, is in
 * the arena's leading cache line. */
typedef struct sa_streams_s {
  sa_stream_arena *list;        /* every stream arena (arena lock) */
  pthread_rwlock_t rw;          /* read: walk the list unlocked; write: unlink */
  uint64_t next_id;             /* (arena lock) */
  _Atomic size_t xgone;         /* stream arenas gone, not yet reaped */
  sa_stream_arena *gone;        /* those, for reap (arena lock) */
  sa_chain_table live_index;    /* live ones by handle (arena lock) */
} sa_streams;

/* named: the caller is inside an API call that names the stream arena's
 * stream, the only place a driver call on it may happen. */
/* The live stream arena of s, created if needed; bound for the caller
 * (sa__stream_arena_unbind when done). A stream arena of a destroyed
 * stream whose handle s now names is found out by the stream's id. */
sa_status sa__stream_arena_get(sa_arena *a, sa_stream s, sa_stream_arena **out);
void sa__stream_arena_unbind(sa_stream_arena *sa);
static inline bool sa__stream_arena_gone(sa_stream_arena *sa) {
  return atomic_load_explicit(&sa->xgone, memory_order_acquire);
}
/* Named; limit: the physical bytes a new superblock may take the arena to. */
uint32_t sa__stream_arena_take(sa_stream_arena *sa, unsigned cls, sa_cached_block *out,
                               uint32_t want, size_t limit, sa_status *st);
void sa__stream_arena_give(sa_stream_arena *sa, const sa_cached_block *blocks, uint32_t n,
                           bool named);
void sa__stream_arena_push_deferred(sa_stream_arena *owner, sa_deferred *d);
/* A cross-stream batch freed on d->freer goes to its owner: behind an
 * event recorded now when named (SA_ERR_DRIVER if that fails: d stays with
 * the caller), without one when the freer was released, else parked on the
 * freer until a later named call or a device sync makes it safe. */
sa_status sa__stream_arena_hand_over(sa_deferred *d, bool named);
/* Named: one event for what waits here for one (parked batches, empty
 * superblocks whose blocks came back without a call naming the stream).
 * *renamed: the handle names another stream now (the stream id differs,
 * or the handle is no stream), and sa is gone instead. A failed id query's
 * status (SA_ERR_DRIVER): nothing changed. */
sa_status sa__stream_arena_fence(sa_stream_arena *sa, bool *renamed);
void sa__stream_arena_shed(sa_stream_arena *sa, bool named); /* empties to global */
/* Every stream arena: settle what completed or became clean, shed empties
 * (named for none), and free stream arenas that are gone and hold nothing. */
void sa__stream_arenas_settle(sa_arena *a);
void sa__stream_arenas_reap(sa_arena *a); /* free those gone and holding nothing */
size_t sa__stream_arenas_live(sa_arena *a); /* stream arenas not gone */
/* sa_stream_release's part here: wait for s, then its stream arena is gone
 * (bound for the caller; NULL if there was none). */
sa_status sa__stream_arena_release(sa_arena *a, sa_stream s, sa_stream_arena **out);
void sa__stream_arenas_destroy(sa_arena *a); /* device synchronized already */
/* Validators; each returns the elements it visited (SA_VALIDATE_PACED).
 * One stream arena, its lock held: bins, nempty (the empty list),
 * pending_blocks (the pending lanes), parked batches. Every stream arena
 * and superblock, the world lock held (report.c): each stream arena and
 * its timeline, each superblock, the arena's list, the live index, the
 * gone list, and nsuperblocks against the superblocks' owners. */
size_t sa__stream_arena_check(const sa_stream_arena *sa);
size_t sa__stream_arenas_check(sa_arena *a);

#endif /* SA_SMALL_STREAM_ARENA_H */
