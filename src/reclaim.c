/* Getting memory back, for the loop in alloc.c (an allocation past the
 * footprint target or a budget, sa_trim, sa_defragment).
 *
 * Memory that is free but held in some shape (free spans, empty
 * superblocks of a stream, superblocks on the global stack) is unmapped
 * once no pending work can touch it, and its chunks go to the chunk cache,
 * where the next growth maps them wherever it needs them (stitching,
 * physical.c). Nothing is unmapped before its events completed: the
 * driver's unmap does not wait for queued work.
 *
 * Calls stream_arena.c, superblock.c, span.c, device_sync.c and
 * physical.c, never a thread cache: the caller flushes its own first.
 * Called by alloc.c, and by arena.c after a stream's release.
 */
#include <stdlib.h>

#include "reclaim.h"
#include "arena.h"
#include "base/device_sync.h"
#include "base/hook.h"
#include "large/grower.h"
#include "large/kept.h"
#include "large/span.h"
#include "small/stream_arena.h"
#include "small/superblock.h"
#include "small/thread_cache.h"
#include "vm/physical.h"

/* Is a carved superblock's work done? Its event, if any, queried
 * (SA_QUERY) or waited for (SA_WAIT); or, in a pass after stream arena
 * `released` was released (nonzero), known without a driver call: no
 * event, or one its stream recorded, which the release's synchronize
 * completed. Another stream's event is then not asked about: a release
 * queries nothing. When done, the event is back in the pool. */
static bool carved_done(sa_arena *a, sa_superblock *sb, sa_wait wait, uint64_t released) {
  if (sb->event == NULL) return true;
  if (released == 0) return sa__event_retire(a, sb->event, wait) == SA_OK;
  if (sb->event_owner != released) return false;
  sa__event_drop(a, sb->event);
  return true;
}

/* Superblocks on the global stacks (carved_only: the carved ones' alone)
 * whose work is done (carved_done; SA_WAIT: once it is) are unmapped; the
 * others go back on their stack. A pass after a release (released) stops
 * looking once SA_RELEASE_KEEP_MAX were kept: a release is not a walk of
 * every other stream's leftovers. A pass holds those until its end, out of
 * every other pass's sight: passes take turns, or an allocation's last
 * pass, after its device sync, found the stack empty while a concurrent
 * sa_defragment held what it needed and failed (defrag_test:
 * allocation_waits_for_a_concurrent_reclaim_pass). */
static void unmap_free_superblocks(sa_arena *a, sa_wait wait, bool carved_only,
                                   uint64_t released) {
  sa_superblock *keep = NULL, *carved = NULL, *sb;
  unsigned kept = 0;
  size_t ndone = 0;
  pthread_mutex_lock(&a->reclaim_lock);
  while ((released == 0 || kept < SA_RELEASE_KEEP_MAX) &&
         (sb = carved_only ? sa__superblock_pop_carved(a) : sa__superblock_pop_global(a)) != NULL) {
    sa__hook(SA_HOOK_RECLAIM_POPPED, sb);
    if (!carved_only) {
      sa__superblock_unmap_or_keep(a, sb, wait, &keep);
      continue;
    }
    /* Carved ones whose work is done go back together, below. */
    SA_ASSERT(sb->span != NULL);
    bool done = carved_done(a, sb, wait, released);
    kept += !done;
    ndone += done;
    sa_superblock **to = done ? &carved : &keep;
    sb->next = *to;
    *to = sb;
  }
  if (carved != NULL) sa__superblock_unmap_carved(a, carved, ndone);
  sa__superblock_push_all(a, keep);
  pthread_mutex_unlock(&a->reclaim_lock);
  if (carved_only) return; /* a slab's unmap is a driver call */
  pthread_mutex_lock(&a->lock);
  sa__superblock_slabs_unmap_free(a);
  pthread_mutex_unlock(&a->lock);
}

void sa__reclaim(sa_arena *a, size_t need, sa_wait wait, unsigned what) {
  atomic_fetch_add_explicit(&a->stats.xdefrags, 1, memory_order_relaxed);
  /* To wait is to synchronize the device, no stream named (any may be
   * destroyed): then also what came back without an event on its stream (a
   * thread's exit, a stream destroyed unreleased) and every stream's
   * pending cross-stream frees are free for all. On failure the waits
   * below still wait for each event they hold, but what only the device
   * synchronize would have made safe stays. */
  if (wait == SA_WAIT) {
    sa__tentries_orphan_kept(a); /* every thread's: the synchronize makes them clean */
    (void)sa__device_sync(a);
  }
  pthread_mutex_lock(&a->lock);
  (void)sa__grower_settle(a);        /* its range, claimed, is given back too */
  (void)sa__physical_unmap_stuck(a); /* refused unwinds, if the driver now agrees */
  sa__span_orphans_settle(a);        /* kept spans clean since their stream went, or a sync */
  pthread_mutex_unlock(&a->lock);
  /* Empty superblocks first: nothing reuses them where they are, while a
   * free span may be the one a request grows in place. */
  if (what & SA_RECLAIM_SUPERBLOCKS) {
    sa__stream_arenas_settle(a); /* empties to the global stack, as they may go */
    unmap_free_superblocks(a, wait, false, 0);
  }
  if (what & SA_RECLAIM_SPANS) {
    pthread_mutex_lock(&a->lock);
    (void)sa__span_unmap_free(a, need, wait);
    pthread_mutex_unlock(&a->lock);
  }
}

void sa__reclaim_carved(sa_arena *a) { unmap_free_superblocks(a, SA_QUERY, true, 0); }

void sa__reclaim_released(sa_arena *a, uint64_t released) {
  SA_ASSERT(released != 0);
  if (ck_pr_load_ptr(&a->small.free_carved.head) == NULL) return;
  unmap_free_superblocks(a, SA_QUERY, true, released);
}

void sa__reclaim_release(sa_arena *a, size_t keep_bytes) {
  pthread_mutex_lock(&a->lock);
  (void)sa__physical_release_cached(a, keep_bytes);
  pthread_mutex_unlock(&a->lock);
}
