/* Stream arenas: what one stream owns.
 *
 * A stream arena holds the superblocks its blocks come from (one partial
 * list per size class), a few empty superblocks, and an inbox (ck lock-free
 * stack) where any thread pushes batches of blocks freed on another stream.
 * Such a batch carries the events recorded on the freeing streams; it is
 * reusable here once they completed (observed by a query) or, when the
 * alternative is to grow, once this stream was made to wait for them on the
 * device. Thread caches refill from and flush to it in batches, under its
 * lock; the lock is never held while taking another stream arena's.
 *
 * Stream lifetime. A driver call on this stream (an event record, a wait)
 * happens only inside an API call that names the stream (callers say so
 * with named) or in sa_stream_release: anywhere else (a thread's exit, a
 * cache eviction, sa_trim, another stream's allocation) the user may have
 * destroyed the stream already, and libcuda crashes on a destroyed stream.
 * An empty superblock gets its event when it empties, if that happens in a
 * named call; then it can go to any stream from anywhere. What comes back
 * outside one (an empty superblock whose blocks a thread gave back at exit,
 * a cross-stream batch freed here: "unfenced") stays here until the next
 * named call records one event for it (sa__stream_arena_fence), or until a
 * device-wide synchronize that started later completed (device_sync.c).
 *
 * A stream arena is gone once sa_stream_release released its stream
 * (synced: its work is done, what it holds is clean) or a new stream with
 * its handle was found by the driver's stream id: then it is never looked
 * up or driven again, and it is freed once nothing refers to it (reap).
 * Pointers to it are counted (xentries: thread cache entries and other
 * holders; nsuperblocks; xspans) or held under streams.rw; what only
 * compares stream arenas (a free span's or a global superblock's last
 * stream) keeps the id.
 *
 * Lock order: the record side table's records.rw (record.c), thread_cache.c's
 * entries lock, streams.rw, a stream arena lock, the arena lock.
 */
#include <stdlib.h>
#include <string.h>

#include "stream_arena.h"
#include "../arena.h"
#include "../base/base.h"
#include "../base/chain_table.h"
#include "../base/device_sync.h"
#include "../base/event_pool.h"
#include "../base/hook.h"
#include "../base/record.h"
#include "../driver/driver.h"
#include "../large/span.h"
#include "../large/timeline.h"
#include "../vm/va_space.h"
#include "size_class.h"
#include "superblock.h"

SA_DLIST_FUNCTIONS(bin, sa_superblock, next, prev)

static void bin_insert(sa_stream_arena *sa, sa_superblock *sb) {
  bin_push(&sa->bins[sb->cls], sb);
  sb->in_bin = true;
}

static void bin_remove(sa_stream_arena *sa, sa_superblock *sb) {
  bin_unlink(&sa->bins[sb->cls], sb);
  sb->next = sb->prev = NULL;
  sb->in_bin = false;
}

static void mark_gone(sa_arena *a, sa_stream_arena *sa, bool synced);

static bool gone(const sa_stream_arena *sa) {
  return atomic_load_explicit(&sa->xgone, memory_order_relaxed);
}

/* Does an empty sb need an event on this stream before another stream may
 * have it? Not after sa_stream_release (its work is done), nor once a
 * device sync that started after its last block came back completed. */
static bool sb_clean(sa_stream_arena *sa, const sa_superblock *sb) {
  return sa->synced || sa__clean_since(&sa->arena->sync, sb->dirty_gen);
}

static void keep_empty(sa_stream_arena *sa, sa_superblock *sb) {
  sb->next = sa->empty;
  sa->empty = sb;
  sa->nempty++;
  if (sb->event == NULL && !sb_clean(sa, sb))
    atomic_store_explicit(&sa->xunfenced, true, memory_order_relaxed);
}

/* sb leaves this stream for the global stack. */
static void to_global(sa_stream_arena *sa, sa_superblock *sb) {
  SA_ASSERT(sb->owner == sa && sa->nsuperblocks > 0);
  sa->nsuperblocks--;
  sa__superblock_to_global(sa->arena, sb, sb->event, sa->id);
}

/* Guard an empty sb with an event recorded now, where that is allowed and
 * needed; false if it stays unguarded and unclean. */
static bool fence_empty(sa_stream_arena *sa, sa_superblock *sb, bool named) {
  if (sb->event != NULL || sb_clean(sa, sb)) return true;
  if (!named || gone(sa)) return false;
  return sa__event_record_new(sa->arena, sa->stream, &sb->event) == SA_OK;
}

/* An empty superblock stays here (a few are kept, and unfenced ones must
 * stay) or goes to the global stack with its event, if it needs one. */
static void retire_empty(sa_stream_arena *sa, sa_superblock *sb, bool named) {
  SA_VALIDATE_PACED(&sa->superblock_pace, sa__superblock_check(sb));
  sa__superblock_emptied(sa->arena, sb);
  if (sb->in_bin) bin_remove(sa, sb);
  sb->event = NULL;
  bool fenced = fence_empty(sa, sb, named);
  if (!fenced || (!gone(sa) && sa->nempty < SA_KEEP_EMPTY_SUPERBLOCKS))
    keep_empty(sa, sb);
  else
    to_global(sa, sb);
}

/* Put one block back into its superblock. gen: the device sync generation
 * after which no work on this stream uses the block (device_sync.c). Owner
 * lock held. */
static void block_return(sa_stream_arena *sa, void *p, uint64_t gen, bool named) {
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
    bin_insert(sa, sb);
}

void sa__stream_arena_give(sa_stream_arena *sa, const sa_cached_block *blocks, uint32_t n,
                           bool named) {
  pthread_mutex_lock(&sa->lock);
  uint64_t gen = sa__sync_gen(&sa->arena->sync); /* after the frees: they were before the lock */
  for (uint32_t i = 0; i < n; i++) block_return(sa, blocks[i].p, gen, named);
  SA_VALIDATE_PACED(&sa->pace, sa__stream_arena_check(sa));
  pthread_mutex_unlock(&sa->lock);
}

/* gen: as block_return's. */
static void deferred_release(sa_stream_arena *sa, sa_deferred *d, uint64_t gen, bool named) {
  for (uint32_t i = 0; i < d->n; i++) block_return(sa, d->blocks[i].p, gen, named);
  atomic_fetch_sub_explicit(&sa->arena->stats.xdeferred_blocks, d->n, memory_order_relaxed);
  sa__deferred_free(d);
}

/* Are all of d's events complete? Completed ones go back to the pool. With
 * force (named calls only), this stream waits for the rest on the device;
 * *waited says it did. */
static bool deferred_ready(sa_stream_arena *sa, sa_deferred *d, bool force, bool *waited) {
  sa_arena *a = sa->arena;
  unsigned kept = 0;
  for (unsigned i = 0; i < d->nevents; i++) {
    sa_status st = sa__event_retire(a, d->events[i], false);
    if (st == SA_ERR_NOT_READY && force) {
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
 * (10,000 batches behind one stream cost a refill 10,000 queries). A batch
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
 * completed (with force: after a device-side wait, every batch); without
 * force, the first not ready ends the walk. Returns the next lane's place. */
static sa_deferred **lane_drain(sa_stream_arena *sa, sa_deferred **pl, bool force, bool named) {
  sa_deferred *rest = (*pl)->next, *tail = (*pl)->lane_tail;
  sa_deferred *keep = NULL, *last = NULL, *d = *pl;
  while (d != NULL) {
    sa_deferred *next = d->lane_next;
    bool waited = false;
    if (deferred_ready(sa, d, force, &waited)) {
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
      if (!force) break; /* d and those behind it stay as they are */
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

/* Take in the inbox, and put back the blocks of every batch whose events
 * completed (with force: after a device-side wait). Owner lock held. */
static void drain(sa_stream_arena *sa, bool force, bool named) {
  force = force && named && !gone(sa);
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
  for (sa_deferred **pl = &sa->pending; *pl != NULL;) pl = lane_drain(sa, pl, force, named);
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
  if (gone(owner)) drain(owner, false, false);
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

sa_status sa__stream_arena_hand_over(sa_deferred *d, bool named) {
  sa_stream_arena *f = d->freer;
  pthread_mutex_lock(&f->lock);
  sa_status st = SA_OK;
  bool send = true;
  if (d->nevents == 0 && !f->synced) {
    if (named && !gone(f)) {
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

/* Batches parked on sa that a device sync made clean (all with fence: an
 * event is recorded on sa's stream for each, named). sa's lock held;
 * returns them as a list, to be pushed after the lock is let go. */
static sa_deferred *unpark(sa_stream_arena *sa, bool fence) {
  sa_deferred *out = NULL;
  for (sa_deferred **pd = &sa->parked; *pd != NULL;) {
    sa_deferred *d = *pd;
    /* Released: sa_stream_release waited for the stream's work. */
    bool ready = sa->synced || sa__clean_since(&sa->arena->sync, d->gen);
    if (!ready && fence) {
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

static void push_all(sa_deferred *list) {
  while (list != NULL) {
    sa_deferred *d = list;
    list = d->next;
    sa__stream_arena_push_deferred(d->owner, d);
  }
}

/* Is anything here still unfenced? Lock held. */
static bool any_unfenced(sa_stream_arena *sa) {
  if (sa->parked != NULL) return true;
  for (const sa_superblock *sb = sa->empty; sb != NULL; sb = sb->next)
    if (sb->event == NULL && !sb_clean(sa, sb)) return true;
  return false;
}

sa_status sa__stream_arena_fence(sa_stream_arena *sa, bool *renamed) {
  /* What waits here was freed on this stream arena's stream; a new stream
   * that got its handle must not stand in for it. A query that failed says
   * neither: the call fails, and sa stays as it is. */
  uint64_t sid;
  sa_arena *a = sa->arena;
  sa_status st = a->drv->ops->stream_id(a->drv, sa->stream, &sid);
  *renamed = st == SA_ERR_UNKNOWN_STREAM || (st == SA_OK && sid != sa->sid);
  if (*renamed) {
    mark_gone(a, sa, false);
    return SA_OK;
  }
  if (st != SA_OK) return st;
  pthread_mutex_lock(&sa->lock);
  sa_deferred *out = NULL;
  if (!gone(sa)) {
    atomic_store_explicit(&sa->xunfenced, false, memory_order_relaxed);
    for (sa_superblock *sb = sa->empty; sb != NULL; sb = sb->next) (void)fence_empty(sa, sb, true);
    out = unpark(sa, true);
    if (any_unfenced(sa)) atomic_store_explicit(&sa->xunfenced, true, memory_order_relaxed);
  }
  pthread_mutex_unlock(&sa->lock);
  push_all(out);
  return SA_OK;
}

uint32_t sa__stream_arena_take(sa_stream_arena *sa, unsigned cls, sa_cached_block *out,
                               uint32_t want, size_t limit, sa_status *st) {
  uint32_t got = 0;
  *st = SA_OK;
  pthread_mutex_lock(&sa->lock);
  if (sa->pending != NULL || !CK_STACK_ISEMPTY(&sa->inbox)) drain(sa, false, true);
  while (got < want) {
    sa_superblock *sb = sa->bins[cls];
    if (sb == NULL && sa->pending != NULL) {
      /* Waiting on the device beats growing. */
      drain(sa, true, true);
      sb = sa->bins[cls];
    }
    if (sb == NULL) {
      *st = sa__superblock_acquire(sa, cls, limit, &sb);
      if (*st != SA_OK) break;
      bin_insert(sa, sb);
    }
    _Atomic uint8_t *state = sb->state;
    while (got < want && (sb->nfree > 0 || sb->bump < sb->nblocks)) {
      uint32_t idx = sb->nfree > 0 ? sb->free_idx[--sb->nfree] : sb->bump++;
      SA_ASSERT(atomic_load_explicit(&state[idx], memory_order_relaxed) == SA_BLOCK_FREE);
      atomic_store_explicit(&state[idx], SA_BLOCK_CACHED, memory_order_relaxed);
      sb->used++;
      out[got].p = (void *)(sb->hdr.base + (uintptr_t)idx * sb->block_size);
      out[got].state = &state[idx];
      got++;
    }
    if (sb->nfree == 0 && sb->bump == sb->nblocks) bin_remove(sa, sb);
  }
  SA_VALIDATE_PACED(&sa->pace, sa__stream_arena_check(sa));
  pthread_mutex_unlock(&sa->lock);
  return got;
}

/* Give back what this stream holds without live blocks: empty superblocks
 * that are fenced or clean to the global stack. Lock held. */
static void shed_locked(sa_stream_arena *sa, bool named) {
  drain(sa, false, named);
  for (sa_superblock **psb = &sa->empty; *psb != NULL;) {
    sa_superblock *sb = *psb;
    if (!fence_empty(sa, sb, named)) {
      psb = &sb->next;
      continue;
    }
    *psb = sb->next;
    sa->nempty--;
    to_global(sa, sb);
  }
}

void sa__stream_arena_shed(sa_stream_arena *sa, bool named) {
  pthread_mutex_lock(&sa->lock);
  sa_deferred *clean = unpark(sa, false); /* those a release or a device sync made clean */
  shed_locked(sa, named);
  pthread_mutex_unlock(&sa->lock);
  push_all(clean);
}

/* ---- the arena's list of stream arenas ---------------------------------- */

/* Can sa be freed? Only once it is gone: then nothing new can come to
 * refer to it (lookups skip it, and every path that adds a block, span,
 * batch or entry to it starts from one of these), so all zero stays zero.
 * Its lock held. */
static bool reapable(sa_stream_arena *sa) {
  return gone(sa) && atomic_load_explicit(&sa->xentries, memory_order_acquire) == 0 &&
         atomic_load_explicit(&sa->xspans, memory_order_acquire) == 0 && sa->nsuperblocks == 0 &&
         sa->parked == NULL && sa->pending == NULL && CK_STACK_ISEMPTY(&sa->inbox);
}

static void stream_arena_free(sa_stream_arena *sa) {
  pthread_mutex_destroy(&sa->lock);
  free(sa);
}

/* The arena's list: arena lock, and streams.rw held for writing to unlink. */
SA_DLIST_FUNCTIONS(streams, sa_stream_arena, next, prev)

void sa__stream_arenas_reap(sa_arena *a) {
  /* Only a gone one can go, and only those are walked (on their own list):
   * a new stream among thousands of live ones took a lock of each. One
   * marked gone meanwhile waits for the next reap. */
  if (atomic_load_explicit(&a->streams.xgone, memory_order_acquire) == 0) return;
  pthread_rwlock_wrlock(&a->streams.rw); /* nobody walks the lists but lookups */
  pthread_mutex_lock(&a->lock);
  sa_stream_arena *head = a->streams.gone; /* mark_gone only prepends */
  pthread_mutex_unlock(&a->lock);
  /* A batch that reached one after it went was drained once, its events
   * maybe pending; no call names its stream to drain it again: look now,
   * or it holds its superblocks (and stays) until a reclaim. All are shed
   * before any is judged: a shed hands unparked batches to their owners'
   * inboxes, which may be gone ones of this list. */
  for (sa_stream_arena *sa = head; sa != NULL; sa = sa->gone_next) sa__stream_arena_shed(sa, false);
  size_t n = 0;
  for (sa_stream_arena *sa = head; sa != NULL; sa = sa->gone_next) {
    pthread_mutex_lock(&sa->lock); /* whoever was inside has left */
    sa->doomed = reapable(sa);
    pthread_mutex_unlock(&sa->lock);
    n += sa->doomed;
  }
  sa_stream_arena *dead = NULL;
  if (n > 0) {
    pthread_mutex_lock(&a->lock);
    /* Free spans name those that freed spans: as their last freer
     * (forgotten) and in marks that wait for their work (then they stay).
     * One query of an unreleased one's latest ticket says if all is done. */
    bool named = false;
    for (sa_stream_arena *sa = a->streams.gone; sa != NULL; sa = sa->gone_next) {
      if (!sa->doomed || sa->timeline.next == 0) continue;
      named = true;
      if (!sa->synced) (void)sa__timeline_reached(a, sa, sa->timeline.next, false);
    }
    if (named) sa__span_forget_doomed(a);
    for (sa_stream_arena **p = &a->streams.gone; *p != NULL;) {
      sa_stream_arena *sa = *p;
      if (!sa->doomed) {
        p = &sa->gone_next;
        continue;
      }
      sa__timeline_release(a, sa); /* nothing waits on its events any more */
      atomic_fetch_sub_explicit(&a->streams.xgone, 1, memory_order_relaxed);
      *p = sa->gone_next;
      streams_unlink(&a->streams.list, sa);
      sa->next = dead;
      dead = sa;
    }
    pthread_mutex_unlock(&a->lock);
  }
  pthread_rwlock_unlock(&a->streams.rw);
  while (dead != NULL) {
    sa_stream_arena *next = dead->next;
    stream_arena_free(dead);
    dead = next;
  }
}

/* ---- the live index: handle -> live stream arena (arena lock) ---------- *
 * A stream's first use on a thread and sa_stream_release look the handle
 * up; walking the list cost 31 us per new stream with 1,000 live ones. */

#define LIVE_KEY_SHIFT 4 /* stream handles are pointers: their low bits vary little */
#define LIVE_FIRST_BITS 6

/* The index made at the first stream; doubled past one per bucket, unless
 * host memory is short (longer chains then, nothing lost). */
static sa_status live_insert(sa_arena *a, sa_stream_arena *sa) {
  sa_chain_table *t = &a->streams.live_index;
  if (t->heads == NULL) {
    if (!sa__chain_create(t, LIVE_FIRST_BITS, LIVE_KEY_SHIFT)) return SA_ERR_OUT_OF_MEMORY;
  } else if (t->n >= sa__chain_buckets(t)) {
    (void)sa__chain_double(t);
  }
  sa->live_link.key = (uintptr_t)sa->stream;
  sa__chain_push(t, &sa->live_link);
  return SA_OK;
}

/* sa is gone from now on; with synced, its work is known done. Takes its
 * lock and the arena lock. */
static void mark_gone(sa_arena *a, sa_stream_arena *sa, bool synced) {
  pthread_mutex_lock(&sa->lock);
  pthread_mutex_lock(&a->lock);
  if (!gone(sa)) {
    sa->synced = synced;
    atomic_store_explicit(&sa->xgone, true, memory_order_release);
    sa__chain_remove(&a->streams.live_index, &sa->live_link); /* never looked up again */
    sa->gone_next = a->streams.gone; /* for reap */
    a->streams.gone = sa;
    atomic_fetch_add_explicit(&a->streams.xgone, 1, memory_order_release);
    atomic_fetch_add_explicit(&a->xstream_epoch, 1, memory_order_release);
    if (synced) sa__timeline_release(a, sa); /* its work is done: spans need not wait */
  }
  pthread_mutex_unlock(&a->lock);
  pthread_mutex_unlock(&sa->lock);
}

/* The live stream arena with handle s (arena lock held). */
static sa_stream_arena *find_live(sa_arena *a, sa_stream s) {
  sa_chain_link *l = sa__chain_get(&a->streams.live_index, (uintptr_t)s);
  return sa__chain_entry(l, sa_stream_arena, live_link);
}

void sa__stream_arena_unbind(sa_stream_arena *sa) {
  atomic_fetch_sub_explicit(&sa->xentries, 1, memory_order_release);
}

sa_status sa__stream_arena_get(sa_arena *a, sa_stream s, sa_stream_arena **out) {
  sa_status st = a->drv->ops->stream_validate(a->drv, s);
  uint64_t sid = 0;
  if (st == SA_OK) st = a->drv->ops->stream_id(a->drv, s, &sid);
  if (st != SA_OK) return st;
  sa_stream_arena *fresh = NULL;
  for (;;) {
    pthread_mutex_lock(&a->lock);
    sa_stream_arena *sa = find_live(a, s);
    if (sa != NULL && sa->sid == sid) {
      atomic_fetch_add_explicit(&sa->xentries, 1, memory_order_relaxed);
      pthread_mutex_unlock(&a->lock);
      if (fresh != NULL) stream_arena_free(fresh); /* another thread won the race */
      *out = sa;
      return SA_OK;
    }
    if (sa == NULL && fresh != NULL) {
      if (live_insert(a, fresh) != SA_OK) {
        pthread_mutex_unlock(&a->lock);
        stream_arena_free(fresh);
        return SA_ERR_OUT_OF_MEMORY;
      }
      fresh->id = ++a->streams.next_id;
      streams_push(&a->streams.list, fresh);
      pthread_mutex_unlock(&a->lock);
      *out = fresh;
      return SA_OK;
    }
    /* Held while it is marked gone below: another thread that meets the
     * new stream may mark it gone first and reap it. */
    if (sa != NULL) atomic_fetch_add_explicit(&sa->xentries, 1, memory_order_relaxed);
    pthread_mutex_unlock(&a->lock);
    if (sa != NULL) {
      /* The handle names a new stream: the old one was destroyed without
       * sa_stream_release. Its stream arena keeps what it holds (never
       * inherited by this stream) until a device sync settles it. */
      sa__hook(SA_HOOK_HANDLE_REUSED, sa);
      mark_gone(a, sa, false);
      sa__stream_arena_unbind(sa);
      continue;
    }
    sa__stream_arenas_reap(a); /* a new stream: free gone ones first */
    fresh = sa__zalloc_aligned(sizeof *fresh, _Alignof(sa_stream_arena));
    if (fresh == NULL) return SA_ERR_OUT_OF_MEMORY;
    fresh->arena = a;
    fresh->stream = s;
    fresh->sid = sid;
    atomic_init(&fresh->xentries, 1); /* the caller's binding */
    pthread_mutex_init(&fresh->lock, NULL);
    ck_stack_init(&fresh->inbox);
  }
}

void sa__stream_arenas_settle(sa_arena *a) {
  pthread_rwlock_rdlock(&a->streams.rw);
  pthread_mutex_lock(&a->lock);
  sa_stream_arena *head = a->streams.list; /* only reap unlinks, under streams.rw */
  pthread_mutex_unlock(&a->lock);
  /* Parked batches first: they land in other stream arenas' inboxes. */
  for (sa_stream_arena *sa = head; sa != NULL; sa = sa->next) {
    pthread_mutex_lock(&sa->lock);
    sa_deferred *clean = unpark(sa, false);
    pthread_mutex_unlock(&sa->lock);
    push_all(clean);
  }
  for (sa_stream_arena *sa = head; sa != NULL; sa = sa->next) sa__stream_arena_shed(sa, false);
  pthread_rwlock_unlock(&a->streams.rw);
  sa__stream_arenas_reap(a);
}

size_t sa__stream_arenas_live(sa_arena *a) {
  pthread_mutex_lock(&a->lock);
  size_t n = a->streams.live_index.n; /* the live index holds exactly those not gone */
  pthread_mutex_unlock(&a->lock);
  return n;
}

sa_status sa__stream_arena_release(sa_arena *a, sa_stream s, sa_stream_arena **out) {
  *out = NULL;
  /* A free on another stream that took a record naming s is done with s
   * first (its events on s are recorded, and then synchronized below);
   * a later one finds s forgotten. */
  sa__record_forget_begin(a);
  pthread_mutex_lock(&a->lock);
  sa_stream_arena *sa = find_live(a, s);
  if (sa != NULL) atomic_fetch_add_explicit(&sa->xentries, 1, memory_order_relaxed);
  pthread_mutex_unlock(&a->lock);
  sa_status st = SA_OK;
  if (sa != NULL) {
    /* The handle may name a new stream: syncing it says nothing of the
     * destroyed one's work, so its stream arena goes unsynced. */
    uint64_t sid;
    st = a->drv->ops->stream_id(a->drv, s, &sid);
    if (st != SA_OK) {
      sa__stream_arena_unbind(sa);
      sa__record_forget_end(a);
      return st;
    }
    if (sid != sa->sid) {
      mark_gone(a, sa, false);
      sa__stream_arena_unbind(sa);
      sa = NULL;
    }
  }
  /* Wait for the stream's work: what it freed is clean from now on, and
   * blocks recorded on it need no event on it any more (it may be
   * destroyed before they are freed). */
  if (sa != NULL || sa__record_names_stream(a, s)) st = a->drv->ops->stream_synchronize(a->drv, s);
  if (st == SA_OK) sa__record_forget_stream(a, s);
  sa__record_forget_end(a);
  if (sa == NULL) return st;
  if (st != SA_OK) {
    sa__stream_arena_unbind(sa);
    return st;
  }
  mark_gone(a, sa, true);
  *out = sa;
  return SA_OK;
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

static int by_address(const void *x, const void *y) {
  uintptr_t p = *(const uintptr_t *)x, q = *(const uintptr_t *)y;
  return p < q ? -1 : p > q;
}

/* The superblocks of all_superblocks that sa owns, given their owners
 * sorted (n of them). */
static size_t owned_by(const uintptr_t *owners, size_t n, const sa_stream_arena *sa) {
  size_t lo = 0, hi = n;
  while (lo < hi) { /* the first at or after sa */
    size_t mid = lo + (hi - lo) / 2;
    if (owners[mid] < (uintptr_t)sa)
      lo = mid + 1;
    else
      hi = mid;
  }
  size_t k = 0;
  while (lo + k < n && owners[lo + k] == (uintptr_t)sa) k++;
  return k;
}

size_t sa__stream_arenas_check(sa_arena *a) {
  /* Every superblock, and its owner, to count what each stream arena owns
   * (a full superblock is on no list of its owner). */
  size_t nsb = 0, visited = 0;
  for (const sa_superblock *sb = a->small.all_superblocks; sb != NULL; sb = sb->all_next) nsb++;
  uintptr_t *owners = malloc((nsb + 1) * sizeof *owners); /* NULL: not counted */
  size_t nowned = 0;
  for (const sa_superblock *sb = a->small.all_superblocks; sb != NULL; sb = sb->all_next) {
    visited += sa__superblock_check(sb);
    if (owners != NULL && sb->owner != NULL) owners[nowned++] = (uintptr_t)sb->owner;
  }
  if (owners != NULL) qsort(owners, nowned, sizeof *owners, by_address);
  size_t live = 0, ngone = 0, gone_listed = 0, owned = 0;
  const sa_stream_arena *prev = NULL;
  for (const sa_stream_arena *sa = a->streams.list; sa != NULL; prev = sa, sa = sa->next) {
    SA_CHECK(STREAM_ARENA, sa->prev == prev && sa->arena == a, "the arena's list: links agree");
    visited += sa__stream_arena_check(sa);
    sa__timeline_check(sa);
    if (gone(sa)) {
      ngone++;
    } else {
      live++;
      SA_CHECK(STREAM_ARENA, find_live(a, sa->stream) == sa,
               "a live stream arena is in the live index");
    }
    if (owners != NULL) {
      size_t n = owned_by(owners, nowned, sa);
      SA_CHECK(STREAM_ARENA, n == sa->nsuperblocks,
               "nsuperblocks counts the superblocks owned here");
      owned += n;
    }
  }
  SA_CHECK(STREAM_ARENA, owners == NULL || owned == nowned, "an owner is on the arena's list");
  free(owners);
  SA_CHECK(STREAM_ARENA, live == a->streams.live_index.n, "the live index holds the live stream arenas");
  for (const sa_stream_arena *sa = a->streams.gone; sa != NULL; sa = sa->gone_next) {
    SA_CHECK(STREAM_ARENA, gone(sa), "the gone list holds gone stream arenas");
    gone_listed++;
  }
  SA_CHECK(STREAM_ARENA, gone_listed == ngone, "the gone list holds the gone stream arenas");
  SA_CHECK(STREAM_ARENA,
           gone_listed == atomic_load_explicit(&a->streams.xgone, memory_order_relaxed),
           "streams.xgone is the length of the gone list");
  return visited + nsb;
}

void sa__stream_arenas_destroy(sa_arena *a) {
  for (sa_stream_arena *sa = a->streams.list, *n; sa != NULL; sa = n) {
    n = sa->next;
    pthread_mutex_lock(&a->lock);
    sa__timeline_release(a, sa);
    pthread_mutex_unlock(&a->lock);
    sa->synced = true; /* the device was synchronized: record nothing */
    atomic_store_explicit(&sa->xgone, true, memory_order_relaxed);
    drain(sa, false, false);
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
    for (sa_superblock *sb = sa->empty; sb != NULL; sb = sb->next)
      if (sb->event != NULL) (void)sa__event_settle(a, sb->event);
    stream_arena_free(sa);
  }
  a->streams.list = NULL;
  a->streams.gone = NULL;
  sa__chain_destroy(&a->streams.live_index);
}
