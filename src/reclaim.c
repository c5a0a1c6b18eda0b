/* Getting memory back: the out-of-memory path, sa_trim, sa_defragment, and
 * reshaping free memory before a span grows the footprint.
 *
 * Memory that is free but held in some shape (empty superblocks of a
 * stream, free spans, superblocks on the global stack) is
 * unmapped once no pending work can touch it, and its chunks go to the
 * chunk cache, where stitching (physical.c) turns them into whatever shape
 * is asked for next. Nothing is unmapped before its events completed: the
 * driver's unmap does not wait for queued work.
 */
#include <stdlib.h>

#include "internal.h"

/* Superblocks on the global stack whose event completed (or, with wait,
 * once it has) are unmapped; the others go back on the stack. */
static void unmap_free_superblocks(sa_arena *a, bool wait) {
  sa_superblock *keep = NULL, *sb;
  while ((sb = sa__superblock_pop_global(a)) != NULL) {
    sa_status st = SA_OK;
    if (sb->event != NULL) {
      st = sa__event_retire(a, sb->event, wait);
      if (st == SA_OK) sb->event = NULL;
    }
    pthread_mutex_lock(&a->lock);
    if (st == SA_OK) st = sa__superblock_unmap(a, sb);
    pthread_mutex_unlock(&a->lock);
    if (st != SA_OK) {
      sb->next = keep;
      keep = sb;
    }
  }
  while (keep != NULL) {
    sb = keep;
    keep = sb->next;
    sa__superblock_to_global(a, sb, sb->event, sb->event_owner);
  }
}

/* Everything free goes back to the chunk cache once its events completed
 * (with wait: after waiting for them). */
static void reclaim_free(sa_arena *a, bool wait) {
  pthread_mutex_lock(&a->lock);
  sa_stream_arena *head = a->streams; /* prepend-only list: safe to walk */
  pthread_mutex_unlock(&a->lock);
  for (sa_stream_arena *sa = head; sa != NULL; sa = sa->next) sa__stream_arena_shed(sa);
  unmap_free_superblocks(a, wait);
  pthread_mutex_lock(&a->lock);
  sa__span_unmap_free(a, wait);
  pthread_mutex_unlock(&a->lock);
}

void sa__reclaim(sa_arena *a, bool wait) {
  atomic_fetch_add_explicit(&a->xdefrags, 1, memory_order_relaxed);
  reclaim_free(a, wait);
}

void sa__reshape(sa_arena *a) {
  /* Blocks in this thread's caches pin their superblocks: give them back
   * first, so that superblocks they empty can go too. Streams' kept empty
   * superblocks go to the global stack behind an event on their stream. */
  sa__tentry_flush_own(a);
  reclaim_free(a, false);
}

/* The calling thread's cached blocks back, everything free unmapped, then
 * cached chunks released down to keep_bytes. */
static sa_status trim_to(sa_arena *a, size_t keep_bytes, bool wait) {
  if (a == NULL) return SA_ERR_INVALID_ARGUMENT;
  sa__tentry_flush_own(a);
  sa__reclaim(a, wait);
  pthread_mutex_lock(&a->lock);
  sa__physical_release_cached(a, keep_bytes);
  pthread_mutex_unlock(&a->lock);
  return SA_OK;
}

sa_status sa_trim(sa_arena *a, size_t keep_bytes) { return trim_to(a, keep_bytes, true); }

sa_status sa_defragment(sa_arena *a) {
  return a == NULL ? SA_ERR_INVALID_ARGUMENT : trim_to(a, a->cfg.release_threshold_bytes, false);
}
