/* Stream arenas (stream_arena.c): what one stream owns of an arena, its
 * life cycle, and the arena's list and index of its stream arenas. Calls
 * stream_return.c, superblock.c, timeline.c and the services; called by
 * thread_cache.c, alloc.c, free.c, arena.c, reclaim.c and the reports. */
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

typedef struct sa_tentry_s sa_tentry;     /* thread_cache.h */
typedef struct sa_deferred_s sa_deferred; /* stream_return.h */

/* A block handed to a thread cache: the address and its state byte. */
typedef struct sa_cached_block_s {
  void *p;
  _Atomic uint8_t *state;
} sa_cached_block;

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
  _Atomic size_t xorphans;           /* of them, kept spans whose entry went
                                        (large/kept.h): freed at the next call
                                        naming the stream (sa__tentry_get) */
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

/* Is the caller inside an API call that names the stream arena's stream,
 * the only place a driver call on it may happen (stream_arena.c)? */
typedef enum sa_named_e { SA_UNNAMED = 0, SA_NAMED = 1 } sa_named;

/* The live stream arena of s, created if needed; bound for the caller
 * (sa__stream_arena_unbind when done). A stream arena of a destroyed
 * stream whose handle s now names is found out by the stream's id. */
sa_status sa__stream_arena_get(sa_arena *a, sa_stream s, sa_stream_arena **out);
void sa__stream_arena_unbind(sa_stream_arena *sarena);
static inline bool sa__stream_arena_gone(sa_stream_arena *sarena) {
  return atomic_load_explicit(&sarena->xgone, memory_order_acquire);
}
/* The same with its lock held, under which it is written. */
static inline bool sa__stream_arena_gone_locked(const sa_stream_arena *sarena) {
  return atomic_load_explicit(&sarena->xgone, memory_order_relaxed);
}
/* Named: the event another stream or an unmap waits for (a pending span's,
 * timeline.c) is recorded, if one is wanted; takes the arena lock. */
void sa__stream_arena_record_wanted(sa_stream_arena *sarena);
/* Named; limit: the physical bytes a new superblock may take the arena to. */
uint32_t sa__stream_arena_take(sa_stream_arena *sarena, unsigned cls, sa_cached_block *out,
                               uint32_t want, size_t limit, sa_status *st);
/* Named: one event for what waits here for one (parked batches, empty
 * superblocks whose blocks came back without a call naming the stream).
 * *renamed: the handle names another stream now (the stream id differs,
 * or the handle is no stream), and sarena is gone instead. A failed id query's
 * status (SA_ERR_DRIVER): nothing changed. */
sa_status sa__stream_arena_fence(sa_stream_arena *sarena, bool *renamed);
void sa__stream_arena_shed(sa_stream_arena *sarena, sa_named named); /* empties to global */
/* Every stream arena: settle what completed or became clean, shed empties
 * (SA_UNNAMED for each), and free stream arenas that are gone and hold nothing. */
void sa__stream_arenas_settle(sa_arena *a);
void sa__stream_arenas_reap(sa_arena *a); /* free those gone and holding nothing */
size_t sa__stream_arenas_live(sa_arena *a); /* stream arenas not gone */
/* sa_stream_release's part here: wait for s, then its stream arena is gone
 * (bound for the caller; NULL if there was none). */
sa_status sa__stream_arena_release(sa_arena *a, sa_stream s, sa_stream_arena **out);
void sa__stream_arenas_destroy(sa_arena *a); /* device synchronized already */
/* Validator of every stream arena and superblock, the world lock held
 * (report.c): each stream arena (sa__stream_arena_check) and its timeline,
 * each superblock, the arena's list, the live index, the gone list, and
 * nsuperblocks against the superblocks' owners. Returns the elements it
 * visited. */
size_t sa__stream_arenas_check(sa_arena *a);

#endif /* SA_SMALL_STREAM_ARENA_H */
