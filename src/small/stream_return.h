/* Blocks coming back to their stream arena (stream_return.c): one by one
 * from the thread caches, and in cross-stream batches, with the empty
 * superblocks they leave. Calls superblock.c and the services; called by
 * stream_arena.c, thread_cache.c and free.c. sa_named: stream_arena.h. */
#ifndef SA_SMALL_STREAM_RETURN_H
#define SA_SMALL_STREAM_RETURN_H

#include <ck_stack.h>

#include "../base/base.h"
#include "../driver/driver.h"
#include "stream_arena.h"
#include "superblock.h"

#define SA_KEEP_EMPTY_SUPERBLOCKS 2 /* per stream, kept before going global */
#define SA_BATCH_MAX 64             /* blocks per cross-stream batch */
#define SA_LANE_LOOKUP 64           /* pending lanes a new batch looks at */

/* What a drain does with batches whose events have not completed: leaves
 * them pending (SA_DRAIN_COMPLETED), or makes the stream wait for them on
 * the device, where that is allowed (SA_DRAIN_ALL, in a named call): a
 * device-side wait beats growing. */
typedef enum sa_drain_e { SA_DRAIN_COMPLETED = 0, SA_DRAIN_ALL = 1 } sa_drain;

/* Which parked batches an unpark hands on: those a release or a device
 * sync made clean (SA_UNPARK_CLEAN), or every one, an event recorded on the
 * stream now for each that needs one (SA_UNPARK_FENCE, in a named call). */
typedef enum sa_unpark_e { SA_UNPARK_CLEAN = 0, SA_UNPARK_FENCE = 1 } sa_unpark;

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
  sa_deferred *batch = calloc(1, sizeof *batch);
  if (batch == NULL) return NULL;
  batch->gen = UINT64_MAX;
  batch->events = batch->inline_events;
  if (max_events > sizeof batch->inline_events / sizeof batch->inline_events[0]) {
    batch->events = malloc(max_events * sizeof *batch->events);
    if (batch->events == NULL) {
      free(batch);
      return NULL;
    }
  }
  return batch;
}
static inline void sa__deferred_free(sa_deferred *batch) {
  if (batch != NULL && batch->events != batch->inline_events) free(batch->events);
  free(batch);
}

/* Give n blocks (cached by a thread) back to their superblocks; takes sarena's
 * lock. */
void sa__stream_arena_give(sa_stream_arena *sarena, const sa_cached_block *blocks, uint32_t n,
                           sa_named named);
/* batch into its owner's inbox (takes the owner's lock; batch may be freed from
 * then on). */
void sa__stream_arena_push_deferred(sa_stream_arena *owner, sa_deferred *batch);
/* A cross-stream batch freed on batch->freer goes to its owner: behind an
 * event recorded now when named (SA_ERR_DRIVER if that fails: batch stays with
 * the caller), without one when the freer was released, else parked on the
 * freer until a later named call or a device sync makes it safe. Takes the
 * freer's lock, then the owner's. */
sa_status sa__stream_arena_hand_over(sa_deferred *batch, sa_named named);

/* The rest with sarena's lock held. */
/* sb joins or leaves its class's bin (partial superblocks). */
void sa__stream_bin_insert(sa_stream_arena *sarena, sa_superblock *sb);
void sa__stream_bin_remove(sa_stream_arena *sarena, sa_superblock *sb);
/* Does an empty sb need an event on this stream before another stream may
 * have it? Not after sa_stream_release (its work is done), nor once a
 * device sync that started after its last block came back completed. */
bool sa__empty_clean(sa_stream_arena *sarena, const sa_superblock *sb);
/* Guard an empty sb with an event recorded now, where that is allowed and
 * needed; false if it stays unguarded and unclean. */
bool sa__empty_fence(sa_stream_arena *sarena, sa_superblock *sb, sa_named named);
/* sb leaves this stream for the global stack. */
void sa__empty_to_global(sa_stream_arena *sarena, sa_superblock *sb);
/* Take in the inbox, and put back the blocks of every batch whose events
 * completed (SA_DRAIN_ALL: after a device-side wait, where named). */
void sa__batches_drain(sa_stream_arena *sarena, sa_drain how, sa_named named);
/* Batches parked on sarena that may go to their owners (which: sa_unpark), as
 * a list to push (sa__batches_push_all) after the lock is let go. */
sa_deferred *sa__batches_unpark(sa_stream_arena *sarena, sa_unpark which);
void sa__batches_push_all(sa_deferred *list); /* each to its owner; no lock held */
/* The arena is going (device synchronized): every batch of sarena freed. */
void sa__batches_fini(sa_stream_arena *sarena);
/* Validator of one stream arena, its lock held: bins, nempty (the empty
 * list), pending_blocks (the pending lanes), parked batches. Returns the
 * elements it visited (SA_VALIDATE_PACED). */
size_t sa__stream_arena_check(const sa_stream_arena *sarena);

#endif /* SA_SMALL_STREAM_RETURN_H */
