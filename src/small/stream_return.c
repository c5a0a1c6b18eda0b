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

void sa__stream_bin_insert(sa_stream_arena *sa, sa_superblock *sb) {
  bin_push(&sa->bins[sb->cls], sb);
  sb->in_bin = true;
}

void sa__stream_bin_remove(sa_stream_arena *sa, sa_superblock *sb) {
  bin_unlink(&sa->bins[sb->cls], sb);
  sb->next = sb->prev = NULL;
  sb->in_bin = false;
}

bool sa__empty_clean(sa_stream_arena *sa, const sa_superblock *sb) {
  return sa->synced || sa__clean_since(&sa->arena->sync, sb->dirty_gen);
}

static void keep_empty(sa_stream_arena *sa, sa_superblock *sb) {
  sb->next = sa->empty;
  sa->empty = sb;
  sa->nempty++;
  if (sb->event == NULL && !sa__empty_clean(sa, sb))
    atomic_store_explicit(&sa->xunfenced, true, memory_order_relaxed);
}

void sa__empty_to_global(sa_stream_arena *sa, sa_superblock *sb) {
  SA_ASSERT(sb->owner == sa && sa->nsuperblocks > 0);
  sa->nsuperblocks--;
  sa__superblock_to_global(sa->arena, sb, sb->event, sa->id);
}

bool sa__empty_fence(sa_stream_arena *sa, sa_superblock *sb, sa_named named) {
  if (sb->event != NULL || sa__empty_clean(sa, sb)) return true;
  if (named == SA_UNNAMED || sa__stream_arena_gone_locked(sa)) return false;
  return sa__event_record_new(sa->arena, sa->stream, &sb->event) == SA_OK;
}

/* An empty superblock stays here (a few are kept, and unfenced ones must
 * stay) or goes to the global stack with its event, if it needs one. */
static void retire_empty(sa_stream_arena *sa, sa_superblock *sb, sa_named named) {
  SA_VALIDATE_PACED(&sa->superblock_pace, sa__superblock_check(sb));
  sa__superblock_emptied(sa->arena, sb);
  if (sb->in_bin) sa__stream_bin_remove(sa, sb);
  sb->event = NULL;
  bool fenced = sa__empty_fence(sa, sb, named);
  if (!fenced || (!sa__stream_arena_gone_locked(sa) && sa->nempty < SA_KEEP_EMPTY_SUPERBLOCKS))
    keep_empty(sa, sb);
  else
    sa__empty_to_global(sa, sb);
}

/* Put one block back into its superblock. gen: the device sync generation
 * after which no work on this stream uses the block (device_sync.c). Owner
 * lock held. */
static void block_return(sa_stream_arena *sa, void *p, uint64_t gen, sa_named named) {
  sa_superblock *sb = (sa_superblock *)sa__pagemap_get(&sa->arena->range, (uintptr_t)p);
  uint32_t idx = sa__block_index(sb, (uintptr_t)p - sb->hdr.base);
  SA_ASSERT(sb->owner == sa && sb->used > 0 && idx < sb->bump);
  SA_ASSERT(atomic_load_explicit(&sb->state[idx], memory_order_relaxed) != SA_BLOCK_FREE);
  atomic_store_explicit(&sb->state[idx], SA_BLOCK_FREE, memory_order_relaxed);
  sb->free_idx[sb->nfree++] = idx;
  if (gen > sb->dirty_gen) sb->dirty_gen = gen;
  sb->used--;
  if (sb->used == 0)
    retire_empty(sa, sb, named);
  else if (!sb->in_bin)
    sa__stream_bin_insert(sa, sb);
}

void sa__stream_arena_give(sa_stream_arena *sa, const sa_cached_block *blocks, uint32_t n,
                           sa_named named) {
  pthread_mutex_lock(&sa->lock);
  uint64_t gen = sa__sync_gen(&sa->arena->sync); /* after the frees: they were before the lock */
  for (uint32_t i = 0; i < n; i++) block_return(sa, blocks[i].p, gen, named);
  SA_VALIDATE_PACED(&sa->pace, sa__stream_arena_check(sa));
  pthread_mutex_unlock(&sa->lock);
}

/* ---- cross-stream batches: the inbox, pending lanes, parking ------------ */

/* gen: as block_return's. */
static void deferred_release(sa_stream_arena *sa, sa_deferred *d, uint64_t gen,
                             sa_named named) {
  for (uint32_t i = 0; i < d->n; i++) block_return(sa, d->blocks[i].p, gen, named);
  atomic_fetch_sub_explicit(&sa->arena->stats.xdeferred_blocks, d->n, memory_order_relaxed);
  sa__deferred_free(d);
}

/* Are all of d's events complete? Completed ones go back to the pool. With
 * SA_DRAIN_ALL, this stream waits for the rest on the device; *waited says
 * it did. */
static bool deferred_ready(sa_stream_arena *sa, sa_deferred *d, sa_drain how, bool *waited) {
  sa_arena *a = sa->arena;
  unsigned kept = 0;
  for (unsigned i = 0; i < d->nevents; i++) {
    sa_status st = sa__event_retire(a, d->events[i], SA_QUERY);
    if (st == SA_ERR_NOT_READY && how == SA_DRAIN_ALL) {
      st = sa__event_consume(a, d->events[i], sa->stream);
      *waited |= st == SA_OK;
    }
    if (st != SA_OK) d->events[kept++] = d->events[i];
  }
  d->nevents = kept;
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
static void lane_add(sa_stream_arena *sa, sa_deferred *d) {
  d->lane_next = NULL;
  sa_deferred **pl = &sa->pending;
  for (int i = 0; *pl != NULL && i < SA_LANE_LOOKUP; i++, pl = &(*pl)->next) {
    sa_deferred *lane = *pl;
    if (lane->on != d->on) continue;
    lane->lane_tail->lane_next = d;
    lane->lane_tail = d;
    *pl = lane->next;
    lane->next = sa->pending;
    sa->pending = lane;
    return;
  }
  d->lane_tail = d;
  d->next = sa->pending;
  sa->pending = d;
}

/* Put back the blocks of the batches of the lane at *pl whose events
 * completed (SA_DRAIN_ALL: after a device-side wait, every batch); with
 * SA_DRAIN_COMPLETED the first not ready ends the walk. Returns the next
 * lane's place. */
static sa_deferred **lane_drain(sa_stream_arena *sa, sa_deferred **pl, sa_drain how,
                                sa_named named) {
  sa_deferred *rest = (*pl)->next, *tail = (*pl)->lane_tail;
  sa_deferred *keep = NULL, *last = NULL, *d = *pl;
  while (d != NULL) {
    sa_deferred *next = d->lane_next;
    bool waited = false;
    if (deferred_ready(sa, d, how, &waited)) {
      SA_ASSERT(sa->pending_blocks >= d->n);
      sa->pending_blocks -= d->n;
      /* Behind a wait on this stream, the blocks are this stream's work. */
      deferred_release(sa, d, waited ? sa__sync_gen(&sa->arena->sync) : d->gen, named);
    } else {
      if (last != NULL)
        last->lane_next = d;
      else
        keep = d;
      last = d;
      if (how == SA_DRAIN_COMPLETED) break; /* d and those behind it stay as they are */
    }
    d = next;
  }
  if (keep == NULL) {
    *pl = rest;
    return pl;
  }
  if (d == NULL) { /* walked to the end */
    last->lane_next = NULL;
    tail = last;
  }
  keep->next = rest;
  keep->lane_tail = tail;
  *pl = keep;
  return &keep->next;
}

void sa__batches_drain(sa_stream_arena *sa, sa_drain how, sa_named named) {
  /* A wait on the stream is a driver call on it: only where named. */
  if (named == SA_UNNAMED || sa__stream_arena_gone_locked(sa)) how = SA_DRAIN_COMPLETED;
  ck_stack_entry_t *e = ck_stack_batch_pop_mpmc(&sa->inbox);
  sa_deferred *in = NULL; /* the stack gives the newest first */
  while (e != NULL) {
    ck_stack_entry_t *next = e->next;
    sa_deferred *d = sa__deferred_of(e);
    sa__handoff_accept(&d->xhandoff);
    d->next = in;
    in = d;
    e = next;
  }
  while (in != NULL) {
    sa_deferred *d = in;
    in = d->next;
    if (d->nevents == 0) { /* nothing to wait for: not behind a lane */
      deferred_release(sa, d, d->gen, named);
      continue;
    }
    sa->pending_blocks += d->n;
    lane_add(sa, d);
  }
  for (sa_deferred **pl = &sa->pending; *pl != NULL;) pl = lane_drain(sa, pl, how, named);
  SA_VALIDATE_PACED(&sa->pace, sa__stream_arena_check(sa));
}

void sa__stream_arena_push_deferred(sa_stream_arena *owner, sa_deferred *d) {
  /* The owner's stream may use the blocks without an event of its own
   * (its work is ordered before its reuse there): until its superblock
   * empties in a call on it, they are its work from before now. */
  if (d->gen == UINT64_MAX) d->gen = sa__sync_gen(&owner->arena->sync);
  atomic_fetch_add_explicit(&owner->arena->stats.xdeferred_blocks, d->n, memory_order_relaxed);
  d->freer = NULL; /* it may be freed from now on */
  sa__handoff_publish(&d->xhandoff);
  /* Under the owner's lock: the blocks keep a gone owner alive (see reap)
   * until the lock is let go. Nobody allocates from a gone stream any
   * more: settle now, once per batch. */
  pthread_mutex_lock(&owner->lock);
  ck_stack_push_mpmc(&owner->inbox, &d->link);
  if (sa__stream_arena_gone_locked(owner)) sa__batches_drain(owner, SA_DRAIN_COMPLETED, SA_UNNAMED);
  pthread_mutex_unlock(&owner->lock);
}

/* Park d on its freer until an event on the freer's stream (or a device
 * sync) makes it safe. The freer's lock held. */
static void park(sa_stream_arena *f, sa_deferred *d) {
  d->gen = sa__sync_gen(&f->arena->sync);
  d->next = f->parked;
  f->parked = d;
  atomic_store_explicit(&f->xunfenced, true, memory_order_relaxed);
}

sa_status sa__stream_arena_hand_over(sa_deferred *d, sa_named named) {
  sa_stream_arena *f = d->freer;
  pthread_mutex_lock(&f->lock);
  sa_status st = SA_OK;
  bool send = true;
  if (d->nevents == 0 && !f->synced) {
    if (named == SA_NAMED && !sa__stream_arena_gone_locked(f)) {
      st = sa__event_record_new(f->arena, f->stream, &d->events[0]);
      if (st == SA_OK) d->nevents = 1;
      d->on = f->stream; /* its pending lane */
    } else {
      park(f, d);
      send = false;
    }
  }
  pthread_mutex_unlock(&f->lock);
  if (st == SA_OK && send) sa__stream_arena_push_deferred(d->owner, d);
  return st;
}

sa_deferred *sa__batches_unpark(sa_stream_arena *sa, sa_unpark which) {
  sa_deferred *out = NULL;
  for (sa_deferred **pd = &sa->parked; *pd != NULL;) {
    sa_deferred *d = *pd;
    /* Released: sa_stream_release waited for the stream's work. */
    bool ready = sa->synced || sa__clean_since(&sa->arena->sync, d->gen);
    if (!ready && which == SA_UNPARK_FENCE) {
      ready = sa__event_record_new(sa->arena, sa->stream, &d->events[0]) == SA_OK;
      if (ready) d->nevents = 1;
      d->on = sa->stream;
    }
    if (!ready) {
      pd = &d->next;
      continue;
    }
    *pd = d->next;
    d->next = out;
    out = d;
  }
  return out;
}

void sa__batches_push_all(sa_deferred *list) {
  while (list != NULL) {
    sa_deferred *d = list;
    list = d->next;
    sa__stream_arena_push_deferred(d->owner, d);
  }
}

void sa__batches_fini(sa_stream_arena *sa) {
  sa_arena *a = sa->arena;
  sa__batches_drain(sa, SA_DRAIN_COMPLETED, SA_UNNAMED);
  while (sa->pending != NULL) { /* the arena is going: wait for the rest */
    sa_deferred *d = sa->pending;
    sa->pending = d->lane_next != NULL ? d->lane_next : d->next;
    if (d->lane_next != NULL) {
      d->lane_next->next = d->next;
      d->lane_next->lane_tail = d->lane_tail;
    }
    for (unsigned i = 0; i < d->nevents; i++) (void)sa__event_settle(a, d->events[i]);
    atomic_fetch_sub_explicit(&a->stats.xdeferred_blocks, d->n, memory_order_relaxed);
    sa__deferred_free(d);
  }
  while (sa->parked != NULL) {
    sa_deferred *d = sa->parked;
    sa->parked = d->next;
    sa__deferred_free(d);
  }
}

/* ---- invariants ---------------------------------------------------------- */

static const char STREAM_ARENA[] = "stream arena";

size_t sa__stream_arena_check(const sa_stream_arena *sa) {
  size_t visited = SA_CLASS_COUNT, listed = 0;
  for (unsigned c = 0; c < SA_CLASS_COUNT; c++) {
    const sa_superblock *prev = NULL;
    for (const sa_superblock *sb = sa->bins[c]; sb != NULL; prev = sb, sb = sb->next, listed++) {
      SA_CHECK(STREAM_ARENA, sb->owner == sa && sb->in_bin && sb->cls == c,
               "a bin holds superblocks of its class owned here");
      SA_CHECK(STREAM_ARENA, sb->prev == prev, "a bin's prev and next links agree");
      SA_CHECK(STREAM_ARENA, sb->used > 0 && (sb->nfree > 0 || sb->bump < sb->nblocks),
               "a bin's superblock has used blocks and free ones");
    }
  }
  unsigned nempty = 0;
  for (const sa_superblock *sb = sa->empty; sb != NULL; sb = sb->next, nempty++)
    SA_CHECK(STREAM_ARENA, sb->owner == sa && sb->used == 0 && !sb->in_bin,
             "an empty superblock is owned here, unused, in no bin");
  SA_CHECK(STREAM_ARENA, nempty == sa->nempty, "nempty is the length of the empty list");
  listed += nempty;
  SA_CHECK(STREAM_ARENA, listed <= sa->nsuperblocks, "bins and empties hold at most nsuperblocks");
  size_t blocks = 0;
  for (const sa_deferred *lane = sa->pending; lane != NULL; lane = lane->next) {
    const sa_deferred *last = NULL;
    for (const sa_deferred *d = lane; d != NULL; last = d, d = d->lane_next, visited++) {
      SA_CHECK(STREAM_ARENA, d->owner == sa && d->nevents > 0 && d->on == lane->on,
               "a pending lane holds batches of one stream, owned here, waiting");
      blocks += d->n;
    }
    SA_CHECK(STREAM_ARENA, lane->lane_tail == last, "a lane's tail is its last batch");
  }
  SA_CHECK(STREAM_ARENA, blocks == sa->pending_blocks,
           "pending_blocks counts the blocks in pending lanes");
  for (const sa_deferred *d = sa->parked; d != NULL; d = d->next, visited++)
    SA_CHECK(STREAM_ARENA, d->freer == sa && d->nevents == 0,
             "a parked batch was freed here, no event");
  return visited + listed;
}
