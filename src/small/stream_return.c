/* Blocks coming back to their stream arena: one by one from the thread
 * caches (sa__stream_arena_give), and in batches freed on other streams,
 * which wait in the owner's inbox and pending lanes until their events
 * complete, or are parked on the freeing stream until a call naming it
 * gives them one (stream_return.h). The empty superblocks they leave stay
 * on their stream, a few of them, or go to the global stack behind an
 * event recorded as they empty (a fence).
 *
 * A batch (sa_deferred) carries the events recorded on the streams that
 * freed its blocks; it is reusable here once they completed (observed by a
 * query) or, when the alternative is to grow, once this stream was made to
 * wait for them on the device. Events are recorded only inside calls that
 * name their stream (named), as stream_arena.c says; what comes back
 * outside one (a thread's exit, an eviction) is unfenced until the next.
 *
 * Every function here but sa__stream_arena_hand_over and
 * sa__stream_arena_push_deferred runs with the owner's lock held.
 */
#include <stdlib.h>
#include <string.h>

#include "stream_return.h"
#include "../arena.h"
#include "../base/base.h"
#include "../base/device_sync.h"
#include "../base/event_pool.h"
#include "../driver/driver.h"
#include "../vm/va_space.h"
#include "stream_arena.h"
#include "superblock.h"

/* ---- a stream arena's superblocks: bins and empties --------------------- */

SA_DLIST_FUNCTIONS(bin, sa_superblock, next, prev)

void sa__stream_bin_insert(sa_stream_arena *sarena, sa_superblock *sb) {
  bin_push(&sarena->bins[sb->cls], sb);
  sb->in_bin = true;
}

void sa__stream_bin_remove(sa_stream_arena *sarena, sa_superblock *sb) {
  bin_unlink(&sarena->bins[sb->cls], sb);
  sb->next = sb->prev = NULL;
  sb->in_bin = false;
}

bool sa__empty_clean(sa_stream_arena *sarena, const sa_superblock *sb) {
  return sarena->synced || sa__clean_since(&sarena->arena->sync, sb->dirty_gen);
}

static void keep_empty(sa_stream_arena *sarena, sa_superblock *sb) {
  sb->next = sarena->empty;
  sarena->empty = sb;
  sarena->nempty++;
  if (sb->event == NULL && !sa__empty_clean(sarena, sb))
    atomic_store_explicit(&sarena->xunfenced, true, memory_order_relaxed);
}

void sa__empty_to_global(sa_stream_arena *sarena, sa_superblock *sb) {
  SA_ASSERT(sb->owner == sarena && sarena->nsuperblocks > 0);
  sarena->nsuperblocks--;
  sa__superblock_to_global(sarena->arena, sb, sb->event, sarena->id);
}

bool sa__empty_fence(sa_stream_arena *sarena, sa_superblock *sb, sa_named named) {
  if (sb->event != NULL || sa__empty_clean(sarena, sb)) return true;
  if (named == SA_UNNAMED || sa__stream_arena_gone_locked(sarena)) return false;
  return sa__event_record_new(sarena->arena, sarena->stream, &sb->event) == SA_OK;
}

/* An empty superblock stays here (a few are kept, and unfenced ones must
 * stay) or goes to the global stack with its event, if it needs one. */
static void retire_empty(sa_stream_arena *sarena, sa_superblock *sb, sa_named named) {
  SA_VALIDATE_PACED(&sarena->superblock_pace, sa__superblock_check(sb));
  sa__superblock_emptied(sarena->arena, sb);
  if (sb->in_bin) sa__stream_bin_remove(sarena, sb);
  sb->event = NULL;
  bool fenced = sa__empty_fence(sarena, sb, named);
  if (!fenced ||
      (!sa__stream_arena_gone_locked(sarena) && sarena->nempty < SA_KEEP_EMPTY_SUPERBLOCKS))
    keep_empty(sarena, sb);
  else
    sa__empty_to_global(sarena, sb);
}

/* Put one block back into its superblock. gen: the device sync generation
 * after which no work on this stream uses the block (device_sync.c). Owner
 * lock held. */
static void block_return(sa_stream_arena *sarena, void *p, uint64_t gen, sa_named named) {
  sa_superblock *sb = (sa_superblock *)sa__pagemap_get(&sarena->arena->range, (uintptr_t)p);
  uint32_t idx = sa__block_index(sb, (uintptr_t)p - sb->hdr.base);
  SA_ASSERT(sb->owner == sarena && sb->used > 0 && idx < sb->bump);
  SA_ASSERT(atomic_load_explicit(&sb->state[idx], memory_order_relaxed) != SA_BLOCK_FREE);
  atomic_store_explicit(&sb->state[idx], SA_BLOCK_FREE, memory_order_relaxed);
  sb->free_idx[sb->nfree++] = idx;
  if (gen > sb->dirty_gen) sb->dirty_gen = gen;
  sb->used--;
  if (sb->used == 0)
    retire_empty(sarena, sb, named);
  else if (!sb->in_bin)
    sa__stream_bin_insert(sarena, sb);
}

void sa__stream_arena_give(sa_stream_arena *sarena, const sa_cached_block *blocks, uint32_t n,
                           sa_named named) {
  pthread_mutex_lock(&sarena->lock);
  uint64_t gen =
      sa__sync_gen(&sarena->arena->sync); /* after the frees: they were before the lock */
  for (uint32_t i = 0; i < n; i++) block_return(sarena, blocks[i].p, gen, named);
  SA_VALIDATE_PACED(&sarena->pace, sa__stream_arena_check(sarena));
  pthread_mutex_unlock(&sarena->lock);
}

/* ---- cross-stream batches: the inbox, pending lanes, parking ------------ */

/* gen: as block_return's. */
static void deferred_release(sa_stream_arena *sarena, sa_deferred *batch, uint64_t gen,
                             sa_named named) {
  for (uint32_t i = 0; i < batch->n; i++) block_return(sarena, batch->blocks[i].p, gen, named);
  atomic_fetch_sub_explicit(&sarena->arena->stats.xdeferred_blocks, batch->n, memory_order_relaxed);
  sa__deferred_free(batch);
}

/* Are all of batch's events complete? Completed ones go back to the pool. With
 * SA_DRAIN_ALL, this stream waits for the rest on the device; *waited says
 * it did. */
static bool deferred_ready(sa_stream_arena *sarena, sa_deferred *batch, sa_drain how,
                           bool *waited) {
  sa_arena *a = sarena->arena;
  unsigned kept = 0;
  for (unsigned i = 0; i < batch->nevents; i++) {
    sa_status st = sa__event_retire(a, batch->events[i], SA_QUERY);
    if (st == SA_ERR_NOT_READY && how == SA_DRAIN_ALL) {
      st = sa__event_consume(a, batch->events[i], sarena->stream);
      *waited |= st == SA_OK;
    }
    if (st != SA_OK) batch->events[kept++] = batch->events[i];
  }
  batch->nevents = kept;
  return kept == 0;
}

/* Pending batches wait in lanes, one per stream their first event was
 * recorded on, oldest first. A stream completes its work in order, so a
 * lane whose oldest batch is not ready holds none that is, as far as a
 * query can tell: a drain queries a lane's first batch, not every batch
 * (See Note [Pending lanes]). A batch
 * recorded earlier but taken in later (two threads freeing on one stream),
 * or one behind a batch that also waits for another stream, waits a little
 * longer: later reuse, never earlier. A new batch looks for its lane among
 * the first SA_LANE_LOOKUP (found: moved to the front); past them it opens
 * another lane for the same stream, which costs a query more. */
static void lane_add(sa_stream_arena *sarena, sa_deferred *batch) {
  batch->lane_next = NULL;
  sa_deferred **pl = &sarena->pending;
  for (int i = 0; *pl != NULL && i < SA_LANE_LOOKUP; i++, pl = &(*pl)->next) {
    sa_deferred *lane = *pl;
    if (lane->on != batch->on) continue;
    lane->lane_tail->lane_next = batch;
    lane->lane_tail = batch;
    *pl = lane->next;
    lane->next = sarena->pending;
    sarena->pending = lane;
    return;
  }
  batch->lane_tail = batch;
  batch->next = sarena->pending;
  sarena->pending = batch;
}

/* Put back the blocks of the batches of the lane at *pl whose events
 * completed (SA_DRAIN_ALL: after a device-side wait, every batch); with
 * SA_DRAIN_COMPLETED the first not ready ends the walk. Returns the next
 * lane's place. */
static sa_deferred **lane_drain(sa_stream_arena *sarena, sa_deferred **pl, sa_drain how,
                                sa_named named) {
  sa_deferred *rest = (*pl)->next, *tail = (*pl)->lane_tail;
  sa_deferred *keep = NULL, *last = NULL, *batch = *pl;
  while (batch != NULL) {
    sa_deferred *next = batch->lane_next;
    bool waited = false;
    if (deferred_ready(sarena, batch, how, &waited)) {
      SA_ASSERT(sarena->pending_blocks >= batch->n);
      sarena->pending_blocks -= batch->n;
      /* Behind a wait on this stream, the blocks are this stream's work. */
      deferred_release(sarena, batch, waited ? sa__sync_gen(&sarena->arena->sync) : batch->gen,
                       named);
    } else {
      if (last != NULL)
        last->lane_next = batch;
      else
        keep = batch;
      last = batch;
      if (how == SA_DRAIN_COMPLETED) break; /* batch and those behind it stay as they are */
    }
    batch = next;
  }
  if (keep == NULL) {
    *pl = rest;
    return pl;
  }
  if (batch == NULL) { /* walked to the end */
    last->lane_next = NULL;
    tail = last;
  }
  keep->next = rest;
  keep->lane_tail = tail;
  *pl = keep;
  return &keep->next;
}

void sa__batches_drain(sa_stream_arena *sarena, sa_drain how, sa_named named) {
  /* A wait on the stream is a driver call on it: only where named. */
  if (named == SA_UNNAMED || sa__stream_arena_gone_locked(sarena)) how = SA_DRAIN_COMPLETED;
  ck_stack_entry_t *e = ck_stack_batch_pop_mpmc(&sarena->inbox);
  sa_deferred *in = NULL; /* the stack gives the newest first */
  while (e != NULL) {
    ck_stack_entry_t *next = e->next;
    sa_deferred *batch = sa__deferred_of(e);
    sa__handoff_accept(&batch->xhandoff);
    batch->next = in;
    in = batch;
    e = next;
  }
  while (in != NULL) {
    sa_deferred *batch = in;
    in = batch->next;
    if (batch->nevents == 0) { /* nothing to wait for: not behind a lane */
      deferred_release(sarena, batch, batch->gen, named);
      continue;
    }
    sarena->pending_blocks += batch->n;
    lane_add(sarena, batch);
  }
  for (sa_deferred **pl = &sarena->pending; *pl != NULL;) pl = lane_drain(sarena, pl, how, named);
  SA_VALIDATE_PACED(&sarena->pace, sa__stream_arena_check(sarena));
}

void sa__stream_arena_push_deferred(sa_stream_arena *owner, sa_deferred *batch) {
  /* The owner's stream may use the blocks without an event of its own
   * (its work is ordered before its reuse there): until its superblock
   * empties in a call on it, they are its work from before now. */
  if (batch->gen == UINT64_MAX) batch->gen = sa__sync_gen(&owner->arena->sync);
  atomic_fetch_add_explicit(&owner->arena->stats.xdeferred_blocks, batch->n, memory_order_relaxed);
  batch->freer = NULL; /* it may be freed from now on */
  sa__handoff_publish(&batch->xhandoff);
  /* Under the owner's lock: the blocks keep a gone owner alive (see reap)
   * until the lock is let go. Nobody allocates from a gone stream any
   * more: settle now, once per batch. */
  pthread_mutex_lock(&owner->lock);
  ck_stack_push_mpmc(&owner->inbox, &batch->link);
  if (sa__stream_arena_gone_locked(owner)) sa__batches_drain(owner, SA_DRAIN_COMPLETED, SA_UNNAMED);
  pthread_mutex_unlock(&owner->lock);
}

/* Park batch on its freer until an event on the freer's stream (or a device
 * sync) makes it safe. The freer's lock held. */
static void park(sa_stream_arena *f, sa_deferred *batch) {
  batch->gen = sa__sync_gen(&f->arena->sync);
  batch->next = f->parked;
  f->parked = batch;
  atomic_store_explicit(&f->xunfenced, true, memory_order_relaxed);
}

sa_status sa__stream_arena_hand_over(sa_deferred *batch, sa_named named) {
  sa_stream_arena *f = batch->freer;
  pthread_mutex_lock(&f->lock);
  sa_status st = SA_OK;
  bool send = true;
  if (batch->nevents == 0 && !f->synced) {
    if (named == SA_NAMED && !sa__stream_arena_gone_locked(f)) {
      st = sa__event_record_new(f->arena, f->stream, &batch->events[0]);
      if (st == SA_OK) batch->nevents = 1;
      batch->on = f->stream; /* its pending lane */
    } else {
      park(f, batch);
      send = false;
    }
  }
  pthread_mutex_unlock(&f->lock);
  if (st == SA_OK && send) sa__stream_arena_push_deferred(batch->owner, batch);
  return st;
}

sa_deferred *sa__batches_unpark(sa_stream_arena *sarena, sa_unpark which) {
  sa_deferred *out = NULL;
  for (sa_deferred **pd = &sarena->parked; *pd != NULL;) {
    sa_deferred *batch = *pd;
    /* Released: sa_stream_release waited for the stream's work. */
    bool ready = sarena->synced || sa__clean_since(&sarena->arena->sync, batch->gen);
    if (!ready && which == SA_UNPARK_FENCE) {
      ready = sa__event_record_new(sarena->arena, sarena->stream, &batch->events[0]) == SA_OK;
      if (ready) batch->nevents = 1;
      batch->on = sarena->stream;
    }
    if (!ready) {
      pd = &batch->next;
      continue;
    }
    *pd = batch->next;
    batch->next = out;
    out = batch;
  }
  return out;
}

void sa__batches_push_all(sa_deferred *list) {
  while (list != NULL) {
    sa_deferred *batch = list;
    list = batch->next;
    sa__stream_arena_push_deferred(batch->owner, batch);
  }
}

void sa__batches_fini(sa_stream_arena *sarena) {
  sa_arena *a = sarena->arena;
  sa__batches_drain(sarena, SA_DRAIN_COMPLETED, SA_UNNAMED);
  while (sarena->pending != NULL) { /* the arena is going: wait for the rest */
    sa_deferred *batch = sarena->pending;
    sarena->pending = batch->lane_next != NULL ? batch->lane_next : batch->next;
    if (batch->lane_next != NULL) {
      batch->lane_next->next = batch->next;
      batch->lane_next->lane_tail = batch->lane_tail;
    }
    for (unsigned i = 0; i < batch->nevents; i++) (void)sa__event_settle(a, batch->events[i]);
    atomic_fetch_sub_explicit(&a->stats.xdeferred_blocks, batch->n, memory_order_relaxed);
    sa__deferred_free(batch);
  }
  while (sarena->parked != NULL) {
    sa_deferred *batch = sarena->parked;
    sarena->parked = batch->next;
    sa__deferred_free(batch);
  }
}

/* ---- invariants ---------------------------------------------------------- */

static const char STREAM_ARENA[] = "stream arena";

size_t sa__stream_arena_check(const sa_stream_arena *sarena) {
  size_t visited = SA_CLASS_COUNT, listed = 0;
  for (unsigned c = 0; c < SA_CLASS_COUNT; c++) {
    const sa_superblock *prev = NULL;
    for (const sa_superblock *sb = sarena->bins[c]; sb != NULL;
         prev = sb, sb = sb->next, listed++) {
      SA_CHECK(STREAM_ARENA, sb->owner == sarena && sb->in_bin && sb->cls == c,
               "a bin holds superblocks of its class owned here");
      SA_CHECK(STREAM_ARENA, sb->prev == prev, "a bin's prev and next links agree");
      SA_CHECK(STREAM_ARENA, sb->used > 0 && (sb->nfree > 0 || sb->bump < sb->nblocks),
               "a bin's superblock has used blocks and free ones");
    }
  }
  unsigned nempty = 0;
  for (const sa_superblock *sb = sarena->empty; sb != NULL; sb = sb->next, nempty++)
    SA_CHECK(STREAM_ARENA, sb->owner == sarena && sb->used == 0 && !sb->in_bin,
             "an empty superblock is owned here, unused, in no bin");
  SA_CHECK(STREAM_ARENA, nempty == sarena->nempty, "nempty is the length of the empty list");
  listed += nempty;
  SA_CHECK(STREAM_ARENA, listed <= sarena->nsuperblocks,
           "bins and empties hold at most nsuperblocks");
  size_t blocks = 0;
  for (const sa_deferred *lane = sarena->pending; lane != NULL; lane = lane->next) {
    const sa_deferred *last = NULL;
    for (const sa_deferred *batch = lane; batch != NULL;
         last = batch, batch = batch->lane_next, visited++) {
      SA_CHECK(STREAM_ARENA, batch->owner == sarena && batch->nevents > 0 && batch->on == lane->on,
               "a pending lane holds batches of one stream, owned here, waiting");
      blocks += batch->n;
    }
    SA_CHECK(STREAM_ARENA, lane->lane_tail == last, "a lane's tail is its last batch");
  }
  SA_CHECK(STREAM_ARENA, blocks == sarena->pending_blocks,
           "pending_blocks counts the blocks in pending lanes");
  for (const sa_deferred *batch = sarena->parked; batch != NULL; batch = batch->next, visited++)
    SA_CHECK(STREAM_ARENA, batch->freer == sarena && batch->nevents == 0,
             "a parked batch was freed here, no event");
  return visited + listed;
}
