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
 * Lock order: stream arena lock, then the arena lock.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static void bin_insert(sa_stream_arena *sa, sa_superblock *sb) {
  sb->prev = NULL;
  sb->next = sa->bins[sb->cls];
  if (sb->next != NULL) sb->next->prev = sb;
  sa->bins[sb->cls] = sb;
  sb->in_bin = true;
}

static void bin_remove(sa_stream_arena *sa, sa_superblock *sb) {
  if (sb->prev != NULL)
    sb->prev->next = sb->next;
  else
    sa->bins[sb->cls] = sb->next;
  if (sb->next != NULL) sb->next->prev = sb->prev;
  sb->next = sb->prev = NULL;
  sb->in_bin = false;
}

/* An empty superblock stays here or goes to the global stack with an event
 * on this stream. A released stream's memory has no pending work (release
 * waited for it), so its superblocks go without an event. */
static void retire_empty(sa_stream_arena *sa, sa_superblock *sb) {
  sa_arena *a = sa->arena;
  sa__superblock_emptied(a, sb);
  if (sb->in_bin) bin_remove(sa, sb);
  if (!sa->released && sa->nempty < SA_KEEP_EMPTY_SUPERBLOCKS) {
    sb->next = sa->empty;
    sa->empty = sb;
    sa->nempty++;
    return;
  }
  sa_event e = NULL;
  if (!sa->released && sa__event_record_new(a, sa->stream, &e) != SA_OK) {
    sb->next = sa->empty; /* cannot guard it: keep it on this stream */
    sa->empty = sb;
    sa->nempty++;
    return;
  }
  sa__superblock_to_global(a, sb, e, sa);
}

/* Put one block back into its superblock. Owner lock held. */
static void block_return(sa_stream_arena *sa, void *p) {
  sa_superblock *sb = (sa_superblock *)sa__pagemap_get(sa->arena, (uintptr_t)p);
  uint32_t idx = sa__block_index(sb, (uintptr_t)p - sb->hdr.base);
  atomic_store_explicit(&sb->state[idx], SA_BLOCK_FREE, memory_order_relaxed);
  sb->free_idx[sb->nfree++] = idx;
  sb->used--;
  if (sb->used == 0)
    retire_empty(sa, sb);
  else if (!sb->in_bin)
    bin_insert(sa, sb);
}

void sa__stream_arena_give(sa_stream_arena *sa, const sa_cached_block *blocks, uint32_t n) {
  pthread_mutex_lock(&sa->lock);
  for (uint32_t i = 0; i < n; i++) block_return(sa, blocks[i].p);
  pthread_mutex_unlock(&sa->lock);
}

static void deferred_release(sa_stream_arena *sa, sa_deferred *d) {
  for (uint32_t i = 0; i < d->n; i++) block_return(sa, d->blocks[i].p);
  atomic_fetch_sub_explicit(&sa->arena->xdeferred_blocks, d->n, memory_order_relaxed);
  sa__deferred_free(d);
}

/* Are all of d's events complete? Completed ones go back to the pool. With
 * force, this stream waits for the rest on the device (a released stream
 * cannot be waited on: the host waits instead). */
static bool deferred_ready(sa_stream_arena *sa, sa_deferred *d, bool force) {
  sa_arena *a = sa->arena;
  unsigned kept = 0;
  for (unsigned i = 0; i < d->nevents; i++) {
    sa_status st = sa__event_retire(a, d->events[i], false);
    if (st == SA_ERR_NOT_READY && force)
      st = sa->released ? sa__event_retire(a, d->events[i], true)
                        : sa__event_consume(a, d->events[i], sa->stream);
    if (st != SA_OK) d->events[kept++] = d->events[i];
  }
  d->nevents = kept;
  return kept == 0;
}

void sa__stream_arena_drain(sa_stream_arena *sa, bool force) {
  ck_stack_entry_t *e = ck_stack_batch_pop_mpmc(&sa->inbox);
  while (e != NULL) {
    ck_stack_entry_t *next = e->next;
    sa_deferred *d = (sa_deferred *)((char *)e - offsetof(sa_deferred, link));
    sa__handoff_accept(&d->xhandoff);
    d->next = sa->pending;
    sa->pending = d;
    sa->pending_blocks += d->n;
    e = next;
  }
  for (sa_deferred **pd = &sa->pending; *pd != NULL;) {
    sa_deferred *d = *pd;
    if (deferred_ready(sa, d, force)) {
      *pd = d->next;
      sa->pending_blocks -= d->n;
      deferred_release(sa, d);
    } else {
      pd = &d->next;
    }
  }
}

void sa__stream_arena_push_deferred(sa_stream_arena *owner, sa_deferred *d) {
  atomic_fetch_add_explicit(&owner->arena->xdeferred_blocks, d->n, memory_order_relaxed);
  sa__handoff_publish(&d->xhandoff);
  ck_stack_push_mpmc(&owner->inbox, &d->link);
  /* Nobody allocates from a released stream any more: settle now. The lock
   * is taken once per batch, not per block. */
  pthread_mutex_lock(&owner->lock);
  if (owner->released) sa__stream_arena_drain(owner, false);
  pthread_mutex_unlock(&owner->lock);
}

uint32_t sa__stream_arena_take(sa_stream_arena *sa, unsigned cls, sa_cached_block *out,
                               uint32_t want, sa_status *st) {
  uint32_t got = 0;
  *st = SA_OK;
  pthread_mutex_lock(&sa->lock);
  if (sa->pending != NULL || !CK_STACK_ISEMPTY(&sa->inbox)) sa__stream_arena_drain(sa, false);
  while (got < want) {
    sa_superblock *sb = sa->bins[cls];
    if (sb == NULL && sa->pending != NULL) {
      /* Waiting on the device beats growing. */
      sa__stream_arena_drain(sa, true);
      sb = sa->bins[cls];
    }
    if (sb == NULL) {
      *st = sa__superblock_acquire(sa, cls, &sb);
      if (*st != SA_OK) break;
      bin_insert(sa, sb);
    }
    _Atomic uint8_t *state = sb->state;
    while (got < want && (sb->nfree > 0 || sb->bump < sb->nblocks)) {
      uint32_t idx = sb->nfree > 0 ? sb->free_idx[--sb->nfree] : sb->bump++;
      atomic_store_explicit(&state[idx], SA_BLOCK_CACHED, memory_order_relaxed);
      sb->used++;
      out[got].p = (void *)(sb->hdr.base + (uintptr_t)idx * sb->block_size);
      out[got].state = &state[idx];
      got++;
    }
    if (sb->nfree == 0 && sb->bump == sb->nblocks) bin_remove(sa, sb);
  }
  pthread_mutex_unlock(&sa->lock);
  return got;
}

/* Give back what this stream holds without live blocks: empty superblocks
 * to the global stack. */
void sa__stream_arena_shed(sa_stream_arena *sa) {
  pthread_mutex_lock(&sa->lock);
  sa__stream_arena_drain(sa, false);
  while (sa->empty != NULL) {
    sa_superblock *sb = sa->empty;
    sa->empty = sb->next;
    sa->nempty--;
    sa_event e = NULL;
    if (!sa->released && sa__event_record_new(sa->arena, sa->stream, &e) != SA_OK) {
      sb->next = sa->empty;
      sa->empty = sb;
      sa->nempty++;
      break;
    }
    sa__superblock_to_global(sa->arena, sb, e, sa);
  }
  pthread_mutex_unlock(&sa->lock);
}

sa_status sa__stream_arena_get(sa_arena *a, sa_stream s, sa_stream_arena **out) {
  pthread_mutex_lock(&a->lock);
  for (sa_stream_arena *sa = a->streams; sa != NULL; sa = sa->next) {
    if (sa->stream == s && !sa->released) {
      pthread_mutex_unlock(&a->lock);
      *out = sa;
      return SA_OK;
    }
  }
  pthread_mutex_unlock(&a->lock);
  sa_status st = a->drv->ops->stream_validate(a->drv, s);
  if (st != SA_OK) return st;
  sa_stream_arena *sa = sa__zalloc_aligned(sizeof *sa, _Alignof(sa_stream_arena));
  if (sa == NULL) return SA_ERR_OUT_OF_MEMORY;
  sa->arena = a;
  sa->stream = s;
  pthread_mutex_init(&sa->lock, NULL);
  ck_stack_init(&sa->inbox);
  pthread_mutex_lock(&a->lock);
  for (sa_stream_arena *o = a->streams; o != NULL; o = o->next) {
    if (o->stream == s && !o->released) { /* another thread won the race */
      pthread_mutex_unlock(&a->lock);
      pthread_mutex_destroy(&sa->lock);
      free(sa);
      *out = o;
      return SA_OK;
    }
  }
  sa->next = a->streams;
  a->streams = sa;
  pthread_mutex_unlock(&a->lock);
  *out = sa;
  return SA_OK;
}

sa_status sa__release_stream(sa_arena *a, sa_stream s) {
  pthread_mutex_lock(&a->lock);
  sa_stream_arena *sa = a->streams;
  while (sa != NULL && !(sa->stream == s && !sa->released)) sa = sa->next;
  pthread_mutex_unlock(&a->lock);
  if (sa == NULL) {
    /* Never allocated on, but blocks may be recorded on it: they must not
     * wait for it once it is gone. */
    if (!sa__record_names_stream(a, s)) return SA_OK;
    sa_status st = a->drv->ops->stream_synchronize(a->drv, s);
    if (st == SA_OK) sa__record_forget_stream(a, s);
    return st;
  }
  /* Wait for the stream's work first: from now on nothing can be recorded
   * on it, and what it holds must be clean for other streams. */
  sa_status st = a->drv->ops->stream_synchronize(a->drv, s);
  if (st != SA_OK) return st;
  /* Blocks recorded on s need no event on it any more, and s may be
   * destroyed before they are freed. */
  sa__record_forget_stream(a, s);
  pthread_mutex_lock(&sa->lock);
  pthread_mutex_lock(&a->lock);
  sa->released = true;
  sa__timeline_release(a, sa); /* its work is done: spans need not wait for it */
  atomic_fetch_add_explicit(&a->xstream_epoch, 1, memory_order_release);
  pthread_mutex_unlock(&a->lock);
  pthread_mutex_unlock(&sa->lock);
  sa__stream_arena_shed(sa);
  return SA_OK;
}

/* Written under the stream arena's lock by sa_stream_release; read under it
 * by the free paths, which do not otherwise hold it. */
bool sa__stream_arena_released(sa_stream_arena *sa) {
  pthread_mutex_lock(&sa->lock);
  bool released = sa->released;
  pthread_mutex_unlock(&sa->lock);
  return released;
}

void sa__stream_arena_destroy(sa_stream_arena *sa) {
  pthread_mutex_lock(&sa->lock);
  sa__stream_arena_drain(sa, false);
  while (sa->pending != NULL) { /* the arena is going: wait for the rest */
    sa_deferred *d = sa->pending;
    sa->pending = d->next;
    for (unsigned i = 0; i < d->nevents; i++) (void)sa__event_settle(sa->arena, d->events[i]);
    atomic_fetch_sub_explicit(&sa->arena->xdeferred_blocks, d->n, memory_order_relaxed);
    sa__deferred_free(d);
  }
  pthread_mutex_unlock(&sa->lock);
  pthread_mutex_destroy(&sa->lock);
  free(sa);
}
