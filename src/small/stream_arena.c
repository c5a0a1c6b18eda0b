/* Stream arenas: what one stream owns, and their life cycle.
 *
 * A stream arena holds the superblocks its blocks come from (one partial
 * list per size class), a few empty superblocks, and an inbox (ck lock-free
 * stack) where any thread pushes batches of blocks freed on another stream
 * (stream_return.c takes blocks back). Thread caches refill from it
 * (sa__stream_arena_take) and flush to it in batches, under its lock; the
 * lock is never held while taking another stream arena's.
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
#include "../large/kept.h"
#include "../large/span.h"
#include "../large/timeline.h"
#include "../vm/va_space.h"
#include "size_class.h"
#include "stream_return.h"
#include "superblock.h"

/* What is known of a stream arena's work when it goes: nothing, or that it
 * is done (sa_stream_release synchronized its stream). */
typedef enum gone_work_e { GONE_WORK_UNKNOWN, GONE_WORK_DONE } gone_work;

static void mark_gone(sa_arena *a, sa_stream_arena *sarena, gone_work work);

/* Is anything here still unfenced? Lock held. */
static bool any_unfenced(sa_stream_arena *sarena) {
  if (sarena->parked != NULL) return true;
  for (const sa_superblock *sb = sarena->empty; sb != NULL; sb = sb->next)
    if (sb->event == NULL && !sa__empty_clean(sarena, sb)) return true;
  return false;
}

sa_status sa__stream_arena_fence(sa_stream_arena *sarena, bool *renamed) {
  /* What waits here was freed on this stream arena's stream; a new stream
   * that got its handle must not stand in for it. A query that failed says
   * neither: the call fails, and sarena stays as it is. */
  uint64_t sid;
  sa_arena *a = sarena->arena;
  sa_status st = a->drv->ops->stream_id(a->drv, sarena->stream, &sid);
  *renamed = st == SA_ERR_UNKNOWN_STREAM || (st == SA_OK && sid != sarena->sid);
  if (*renamed) {
    mark_gone(a, sarena, GONE_WORK_UNKNOWN);
    return SA_OK;
  }
  if (st != SA_OK) return st;
  pthread_mutex_lock(&sarena->lock);
  sa_deferred *out = NULL;
  if (!sa__stream_arena_gone_locked(sarena)) {
    atomic_store_explicit(&sarena->xunfenced, false, memory_order_relaxed);
    for (sa_superblock *sb = sarena->empty; sb != NULL; sb = sb->next)
      (void)sa__empty_fence(sarena, sb, true);
    out = sa__batches_unpark(sarena, SA_UNPARK_FENCE);
    if (any_unfenced(sarena)) atomic_store_explicit(&sarena->xunfenced, true, memory_order_relaxed);
  }
  pthread_mutex_unlock(&sarena->lock);
  sa__batches_push_all(out);
  return SA_OK;
}

void sa__stream_arena_record_wanted(sa_stream_arena *sarena) {
  sa_arena *a = sarena->arena;
  pthread_mutex_lock(&a->lock);
  /* Not on a gone one: its handle may name another stream. A failure
   * leaves it wanted, for the next call. */
  if (!sa__stream_arena_gone_locked(sarena)) sa__span_record_wanted(a, sarena);
  pthread_mutex_unlock(&a->lock);
}

uint32_t sa__stream_arena_take(sa_stream_arena *sarena, unsigned cls, sa_cached_block *out,
                               uint32_t want, size_t limit, sa_status *st) {
  uint32_t got = 0;
  *st = SA_OK;
  pthread_mutex_lock(&sarena->lock);
  if (sarena->pending != NULL || !CK_STACK_ISEMPTY(&sarena->inbox))
    sa__batches_drain(sarena, SA_DRAIN_COMPLETED, SA_NAMED);
  while (got < want) {
    sa_superblock *sb = sarena->bins[cls];
    if (sb == NULL && sarena->pending != NULL) {
      /* Waiting on the device beats growing. */
      sa__batches_drain(sarena, SA_DRAIN_ALL, SA_NAMED);
      sb = sarena->bins[cls];
    }
    if (sb == NULL) {
      *st = sa__superblock_acquire(sarena, cls, limit, &sb);
      if (*st != SA_OK) break;
      sa__stream_bin_insert(sarena, sb);
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
    if (sb->nfree == 0 && sb->bump == sb->nblocks) sa__stream_bin_remove(sarena, sb);
  }
  SA_VALIDATE_PACED(&sarena->pace, sa__stream_arena_check(sarena));
  pthread_mutex_unlock(&sarena->lock);
  return got;
}

/* Give back what this stream holds without live blocks: empty superblocks
 * that are fenced or clean to the global stack. Lock held. */
static void shed_locked(sa_stream_arena *sarena, sa_named named) {
  sa__batches_drain(sarena, SA_DRAIN_COMPLETED, named);
  for (sa_superblock **psb = &sarena->empty; *psb != NULL;) {
    sa_superblock *sb = *psb;
    if (!sa__empty_fence(sarena, sb, named)) {
      psb = &sb->next;
      continue;
    }
    *psb = sb->next;
    sarena->nempty--;
    sa__empty_to_global(sarena, sb);
  }
}

void sa__stream_arena_shed(sa_stream_arena *sarena, sa_named named) {
  pthread_mutex_lock(&sarena->lock);
  sa_deferred *clean = sa__batches_unpark(sarena, SA_UNPARK_CLEAN);
  shed_locked(sarena, named);
  pthread_mutex_unlock(&sarena->lock);
  sa__batches_push_all(clean);
}

/* ---- the arena's list of stream arenas ---------------------------------- */

/* Can sarena be freed? Only once it is gone: then nothing new can come to
 * refer to it (lookups skip it, and every path that adds a block, span,
 * batch or entry to it starts from one of these), so all zero stays zero.
 * Its lock held. */
static bool reapable(sa_stream_arena *sarena) {
  return sa__stream_arena_gone_locked(sarena) &&
         atomic_load_explicit(&sarena->xentries, memory_order_acquire) == 0 &&
         atomic_load_explicit(&sarena->xspans, memory_order_acquire) == 0 &&
         sarena->nsuperblocks == 0 && sarena->parked == NULL && sarena->pending == NULL &&
         CK_STACK_ISEMPTY(&sarena->inbox);
}

static void stream_arena_free(sa_stream_arena *sarena) {
  pthread_mutex_destroy(&sarena->lock);
  free(sarena);
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
  sa__span_orphans_settle(a); /* a gone one's kept spans are freed: they hold it */
  pthread_mutex_unlock(&a->lock);
  /* A batch that reached one after it went was drained once, its events
   * maybe pending; no call names its stream to drain it again: look now,
   * or it holds its superblocks (and stays) until a reclaim. All are shed
   * before any is judged: a shed hands unparked batches to their owners'
   * inboxes, which may be gone ones of this list. */
  for (sa_stream_arena *sarena = head; sarena != NULL; sarena = sarena->gone_next)
    sa__stream_arena_shed(sarena, SA_UNNAMED);
  size_t n = 0;
  for (sa_stream_arena *sarena = head; sarena != NULL; sarena = sarena->gone_next) {
    pthread_mutex_lock(&sarena->lock); /* whoever was inside has left */
    sarena->doomed = reapable(sarena);
    pthread_mutex_unlock(&sarena->lock);
    n += sarena->doomed;
  }
  sa_stream_arena *dead = NULL;
  if (n > 0) {
    pthread_mutex_lock(&a->lock);
    /* Free spans name those that freed spans: as their last freer
     * (forgotten) and in marks that wait for their work (then they stay).
     * One query of an unreleased one's latest event says if all it marks
     * is done (a pending ticket waits for a device sync). */
    bool freed_spans = false;
    for (sa_stream_arena *sarena = a->streams.gone; sarena != NULL; sarena = sarena->gone_next) {
      if (!sarena->doomed || sarena->timeline.next == 0) continue;
      freed_spans = true;
      if (!sarena->synced) (void)sa__timeline_reached_recorded(a, sarena);
    }
    if (freed_spans) sa__span_forget_doomed(a);
    for (sa_stream_arena **p = &a->streams.gone; *p != NULL;) {
      sa_stream_arena *sarena = *p;
      if (!sarena->doomed) {
        p = &sarena->gone_next;
        continue;
      }
      sa__timeline_release(a, sarena); /* nothing waits on its events any more */
      atomic_fetch_sub_explicit(&a->streams.xgone, 1, memory_order_relaxed);
      *p = sarena->gone_next;
      streams_unlink(&a->streams.list, sarena);
      sarena->next = dead;
      dead = sarena;
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
 * up, in a hash table: a walk of the list cost every new stream time in
 * proportion to the live ones. See Note [Live index of stream arenas]. */

#define LIVE_KEY_SHIFT 4 /* stream handles are pointers: their low bits vary little */
#define LIVE_FIRST_BITS 6

/* The index made at the first stream; doubled past one per bucket, unless
 * host memory is short (longer chains then, nothing lost). */
static sa_status live_insert(sa_arena *a, sa_stream_arena *sarena) {
  sa_chain_table *t = &a->streams.live_index;
  if (t->heads == NULL) {
    if (!sa__chain_create(t, LIVE_FIRST_BITS, LIVE_KEY_SHIFT)) return SA_ERR_OUT_OF_MEMORY;
  } else if (t->n >= sa__chain_buckets(t)) {
    (void)sa__chain_double(t);
  }
  sarena->live_link.key = (uintptr_t)sarena->stream;
  sa__chain_push(t, &sarena->live_link);
  return SA_OK;
}

/* sarena is gone from now on; with synced, its work is known done. Takes its
 * lock and the arena lock. */
static void mark_gone(sa_arena *a, sa_stream_arena *sarena, gone_work work) {
  pthread_mutex_lock(&sarena->lock);
  pthread_mutex_lock(&a->lock);
  if (!sa__stream_arena_gone_locked(sarena)) {
    sarena->synced = work == GONE_WORK_DONE;
    atomic_store_explicit(&sarena->xgone, true, memory_order_release);
    sa__chain_remove(&a->streams.live_index, &sarena->live_link); /* never looked up again */
    if (sarena->timeline.took_spans) a->spans.ntakers--;
    sarena->gone_next = a->streams.gone; /* for reap */
    a->streams.gone = sarena;
    atomic_fetch_add_explicit(&a->streams.xgone, 1, memory_order_release);
    atomic_fetch_add_explicit(&a->xstream_epoch, 1, memory_order_release);
    if (sarena->synced) sa__timeline_release(a, sarena); /* its work is done: spans need not wait */
  }
  pthread_mutex_unlock(&a->lock);
  pthread_mutex_unlock(&sarena->lock);
}

/* The live stream arena with handle s (arena lock held). */
static sa_stream_arena *find_live(sa_arena *a, sa_stream s) {
  sa_chain_link *l = sa__chain_get(&a->streams.live_index, (uintptr_t)s);
  return sa__chain_entry(l, sa_stream_arena, live_link);
}

void sa__stream_arena_unbind(sa_stream_arena *sarena) {
  atomic_fetch_sub_explicit(&sarena->xentries, 1, memory_order_release);
}

sa_status sa__stream_arena_get(sa_arena *a, sa_stream s, sa_stream_arena **out) {
  sa_status st = a->drv->ops->stream_validate(a->drv, s);
  uint64_t sid = 0;
  if (st == SA_OK) st = a->drv->ops->stream_id(a->drv, s, &sid);
  if (st != SA_OK) return st;
  sa_stream_arena *fresh = NULL;
  for (;;) {
    pthread_mutex_lock(&a->lock);
    sa_stream_arena *sarena = find_live(a, s);
    if (sarena != NULL && sarena->sid == sid) {
      atomic_fetch_add_explicit(&sarena->xentries, 1, memory_order_relaxed);
      pthread_mutex_unlock(&a->lock);
      if (fresh != NULL) stream_arena_free(fresh); /* another thread won the race */
      *out = sarena;
      return SA_OK;
    }
    if (sarena == NULL && fresh != NULL) {
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
    if (sarena != NULL) atomic_fetch_add_explicit(&sarena->xentries, 1, memory_order_relaxed);
    pthread_mutex_unlock(&a->lock);
    if (sarena != NULL) {
      /* The handle names a new stream: the old one was destroyed without
       * sa_stream_release. Its stream arena keeps what it holds (never
       * inherited by this stream) until a device sync settles it. */
      sa__hook(SA_HOOK_HANDLE_REUSED, sarena);
      mark_gone(a, sarena, GONE_WORK_UNKNOWN);
      sa__stream_arena_unbind(sarena);
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
  for (sa_stream_arena *sarena = head; sarena != NULL; sarena = sarena->next) {
    pthread_mutex_lock(&sarena->lock);
    sa_deferred *clean = sa__batches_unpark(sarena, SA_UNPARK_CLEAN);
    pthread_mutex_unlock(&sarena->lock);
    sa__batches_push_all(clean);
  }
  for (sa_stream_arena *sarena = head; sarena != NULL; sarena = sarena->next)
    sa__stream_arena_shed(sarena, SA_UNNAMED);
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
  sa_stream_arena *sarena = find_live(a, s);
  if (sarena != NULL) atomic_fetch_add_explicit(&sarena->xentries, 1, memory_order_relaxed);
  pthread_mutex_unlock(&a->lock);
  sa_status st = SA_OK;
  if (sarena != NULL) {
    /* The handle may name a new stream: syncing it says nothing of the
     * destroyed one's work, so its stream arena goes unsynced. */
    uint64_t sid;
    st = a->drv->ops->stream_id(a->drv, s, &sid);
    if (st != SA_OK) {
      sa__stream_arena_unbind(sarena);
      sa__record_forget_end(a);
      return st;
    }
    if (sid != sarena->sid) {
      mark_gone(a, sarena, GONE_WORK_UNKNOWN);
      sa__stream_arena_unbind(sarena);
      sarena = NULL;
    }
  }
  /* Wait for the stream's work: what it freed is clean from now on, and
   * blocks recorded on it need no event on it any more (it may be
   * destroyed before they are freed). */
  if (sarena != NULL || sa__record_names_stream(a, s))
    st = a->drv->ops->stream_synchronize(a->drv, s);
  if (st == SA_OK) sa__record_forget_stream(a, s);
  sa__record_forget_end(a);
  if (sarena == NULL) return st;
  if (st != SA_OK) {
    sa__stream_arena_unbind(sarena);
    return st;
  }
  mark_gone(a, sarena, GONE_WORK_DONE);
  *out = sarena;
  return SA_OK;
}

/* ---- invariants ---------------------------------------------------------- */

static const char STREAM_ARENA[] = "stream arena";

static int by_address(const void *x, const void *y) {
  uintptr_t p = *(const uintptr_t *)x, q = *(const uintptr_t *)y;
  return p < q ? -1 : p > q;
}

/* The superblocks of all_superblocks that sarena owns, given their owners
 * sorted (n of them). */
static size_t owned_by(const uintptr_t *owners, size_t n, const sa_stream_arena *sarena) {
  size_t lo = 0, hi = n;
  while (lo < hi) { /* the first at or after sarena */
    size_t mid = lo + (hi - lo) / 2;
    if (owners[mid] < (uintptr_t)sarena)
      lo = mid + 1;
    else
      hi = mid;
  }
  size_t k = 0;
  while (lo + k < n && owners[lo + k] == (uintptr_t)sarena) k++;
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
  for (const sa_stream_arena *sarena = a->streams.list; sarena != NULL;
       prev = sarena, sarena = sarena->next) {
    SA_CHECK(STREAM_ARENA, sarena->prev == prev && sarena->arena == a,
             "the arena's list: links agree");
    visited += sa__stream_arena_check(sarena);
    sa__timeline_check(sarena);
    if (sa__stream_arena_gone_locked(sarena)) {
      ngone++;
    } else {
      live++;
      SA_CHECK(STREAM_ARENA, find_live(a, sarena->stream) == sarena,
               "a live stream arena is in the live index");
    }
    if (owners != NULL) {
      size_t n = owned_by(owners, nowned, sarena);
      SA_CHECK(STREAM_ARENA, n == sarena->nsuperblocks,
               "nsuperblocks counts the superblocks owned here");
      owned += n;
    }
  }
  SA_CHECK(STREAM_ARENA, owners == NULL || owned == nowned, "an owner is on the arena's list");
  free(owners);
  SA_CHECK(STREAM_ARENA, live == a->streams.live_index.n,
           "the live index holds the live stream arenas");
  for (const sa_stream_arena *sarena = a->streams.gone; sarena != NULL;
       sarena = sarena->gone_next) {
    SA_CHECK(STREAM_ARENA, sa__stream_arena_gone_locked(sarena),
             "the gone list holds gone stream arenas");
    gone_listed++;
  }
  SA_CHECK(STREAM_ARENA, gone_listed == ngone, "the gone list holds the gone stream arenas");
  SA_CHECK(STREAM_ARENA,
           gone_listed == atomic_load_explicit(&a->streams.xgone, memory_order_relaxed),
           "streams.xgone is the length of the gone list");
  return visited + nsb;
}

void sa__stream_arenas_destroy(sa_arena *a) {
  for (sa_stream_arena *sarena = a->streams.list, *n; sarena != NULL; sarena = n) {
    n = sarena->next;
    pthread_mutex_lock(&a->lock);
    sa__timeline_release(a, sarena);
    pthread_mutex_unlock(&a->lock);
    sarena->synced = true; /* the device was synchronized: record nothing */
    atomic_store_explicit(&sarena->xgone, true, memory_order_relaxed);
    sa__batches_fini(sarena);
    for (sa_superblock *sb = sarena->empty; sb != NULL; sb = sb->next)
      if (sb->event != NULL) (void)sa__event_settle(a, sb->event);
    stream_arena_free(sarena);
  }
  a->streams.list = NULL;
  a->streams.gone = NULL;
  sa__chain_destroy(&a->streams.live_index);
}
