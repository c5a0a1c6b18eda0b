/* Memory summary: what the arena holds and how usable it is, for the
 * out-of-memory report (SA_FLAG_OOM_REPORT) and the snapshot's "summary".
 *
 * The terms, in the spirit of RMM's arena dump:
 *   total         the physical cap (max_physical_bytes or the device)
 *   in use        bytes handed to users: live blocks (their class size)
 *                 and live spans (whole granules)
 *   free          total - in use: unreserved memory, cached chunks, free
 *                 superblocks and spans, free blocks inside superblocks
 *                 (thread caches included), memory awaiting an event
 *   largest free  the largest span obtainable now without waiting:
 *     span        unreserved memory + cached chunks + free superblocks and
 *                 clean spans whose work completed. Chunks need not be
 *                 contiguous (stitching), so these simply add up.
 *   fragmentation 1 - largest free span / free: the share of free memory a
 *                 large request cannot use (stuck in partly used
 *                 superblocks, in other streams' caches, or behind events)
 *
 * Reads descriptors with every stream arena lock and the arena lock held
 * (sa__world_lock, the order snapshot.c documents); called by alloc.c and
 * snapshot.c. Under the same locks, sa__world_check runs every validator
 * (trim, snapshot, arena destroy).
 */
#include "report.h"
#include "arena.h"
#include "base/base.h"
#include "large/kept.h"
#include "large/span.h"
#include "large/timeline.h"
#include "pool_block.h"
#include "small/stream_arena.h"
#include "small/stream_return.h"
#include "small/superblock.h"
#include "vm/physical.h"

static const double MiBf = 1048576.0;

sa_stream_arena *sa__world_lock(sa_arena *a) {
  pthread_rwlock_rdlock(&a->streams.rw); /* none is freed meanwhile */
  for (;;) {
    pthread_mutex_lock(&a->lock);
    sa_stream_arena *head = a->streams.list; /* prepend-only list: safe to walk */
    pthread_mutex_unlock(&a->lock);
    for (sa_stream_arena *sarena = head; sarena != NULL; sarena = sarena->next)
      pthread_mutex_lock(&sarena->lock);
    pthread_mutex_lock(&a->lock);
    if (a->streams.list == head) return head;
    /* One came in meanwhile, unlocked: its thread moves superblocks. Again
     * from the new head, always in list order (two snapshots at once). */
    pthread_mutex_unlock(&a->lock);
    for (sa_stream_arena *sarena = head; sarena != NULL; sarena = sarena->next)
      pthread_mutex_unlock(&sarena->lock);
  }
}

void sa__world_unlock(sa_arena *a, sa_stream_arena *head) {
  pthread_mutex_unlock(&a->lock);
  for (sa_stream_arena *sarena = head; sarena != NULL; sarena = sarena->next)
    pthread_mutex_unlock(&sarena->lock);
  pthread_rwlock_unlock(&a->streams.rw);
}

void sa__world_check_locked(sa_arena *a) {
  (void)sa__stream_arenas_check(a);
  (void)sa__slabs_check(a);
  (void)sa__span_check(a);
  (void)sa__span_orphans_check(a);
  (void)sa__physical_check(a);
  sa__grower_check(a);
}

/* The world lock holds one lock per stream arena, and ThreadSanitizer
 * follows at most 64 locks held by one thread. Past this many stream
 * arenas, each is checked under its own lock instead: what each owns is
 * then not counted, which needs every owner's lock at once. */
#define WORLD_CHECK_STREAMS 32

void sa__world_check(sa_arena *a) {
  sa__pools_check(a); /* their locks are not the arena's (pool_block.h) */
  pthread_rwlock_rdlock(&a->streams.rw); /* none is freed meanwhile */
  pthread_mutex_lock(&a->lock);
  sa_stream_arena *head = a->streams.list; /* prepend-only list: safe to walk */
  size_t n =
      a->streams.live_index.n + atomic_load_explicit(&a->streams.xgone, memory_order_relaxed);
  pthread_mutex_unlock(&a->lock);
  if (n <= WORLD_CHECK_STREAMS) {
    pthread_rwlock_unlock(&a->streams.rw);
    head = sa__world_lock(a);
    sa__world_check_locked(a);
    sa__world_unlock(a, head);
    return;
  }
  for (sa_stream_arena *sarena = head; sarena != NULL; sarena = sarena->next) {
    pthread_mutex_lock(&sarena->lock);
    pthread_mutex_lock(&a->lock);
    (void)sa__stream_arena_check(sarena);
    sa__timeline_check(sarena);
    pthread_mutex_unlock(&a->lock);
    pthread_mutex_unlock(&sarena->lock);
  }
  pthread_rwlock_unlock(&a->streams.rw);
  pthread_mutex_lock(&a->lock);
  (void)sa__slabs_check(a);
  (void)sa__span_check(a);
  (void)sa__span_orphans_check(a);
  (void)sa__physical_check(a);
  sa__grower_check(a);
  pthread_mutex_unlock(&a->lock);
}

/* Bytes of live blocks (user-held) in sb. */
static size_t live_block_bytes(const sa_superblock *sb) {
  size_t n = 0;
  for (uint32_t i = 0; i < sb->nblocks; i++) {
    uint8_t s = atomic_load_explicit(&sb->state[i], memory_order_relaxed);
    n += s == SA_BLOCK_LIVE || s == SA_BLOCK_RECORDED;
  }
  return n * sb->block_size;
}

void sa__holding_locked(sa_arena *a, const sa_stream_arena *sarena, sa_holding *h) {
  *h = (sa_holding){0};
  for (const sa_superblock *sb = a->small.all_superblocks; sb != NULL; sb = sb->all_next) {
    if (sb->hdr.base == 0 || sb->owner != sarena) continue;
    h->superblocks++;
    h->superblock_bytes += sb->hdr.size;
    if (sb->used == 0) {
      h->empty_superblocks++;
      continue;
    }
    size_t live = live_block_bytes(sb);
    h->live_block_bytes += live;
    h->free_block_bytes += sb->hdr.size - live;
  }
  for (const sa_run *r = a->spans.runs; r != NULL; r = r->next)
    for (const sa_span *sp = r->first; sp != NULL; sp = sp->next) {
      if (sp->owner != sarena) continue; /* free spans: the stream that freed them last */
      uint8_t s = atomic_load_explicit(&sp->xstate, memory_order_relaxed);
      if (s == SA_BLOCK_LIVE || s == SA_BLOCK_RECORDED) {
        h->live_spans++;
        h->live_span_bytes += sp->size;
      } else {
        h->free_span_bytes += sp->size;
      }
    }
  /* The inbox too: pushed under sarena's lock, so it stands still here. */
  h->deferred_blocks = sarena->pending_blocks;
  for (const ck_stack_entry_t *e = CK_STACK_FIRST(&sarena->inbox); e != NULL; e = e->next)
    h->deferred_blocks += sa__deferred_of(e)->n;
}

void sa__summary_locked(sa_arena *a, sa_summary *s) {
  *s = (sa_summary){0};
  s->total = a->physical.cap;
  s->reserved = sa__physical_made(&a->physical);
  size_t stitchable = a->physical.cache_bytes;
  for (const sa_superblock *sb = a->small.all_superblocks; sb != NULL; sb = sb->all_next) {
    if (sb->hdr.base == 0) continue;
    if (sb->owner == NULL) {
      /* else: awaiting its event; in a slab, unmapped only with the slab */
      if (sb->event == NULL && sb->slab == NULL) stitchable += sb->hdr.size;
    } else if (sb->used > 0) {
      size_t live = live_block_bytes(sb);
      s->in_use += live;
      s->live_bytes += live;
    }
  }
  for (const sa_run *r = a->spans.runs; r != NULL; r = r->next)
    for (const sa_span *sp = r->first; sp != NULL; sp = sp->next) {
      uint8_t st = atomic_load_explicit(&sp->xstate, memory_order_relaxed);
      if ((st == SA_BLOCK_LIVE || st == SA_BLOCK_RECORDED) && sp->holder == NULL) {
        s->in_use += sp->size; /* a carved superblock's blocks counted above */
        s->live_bytes += sp->request;
      }
    }
  stitchable += sa__span_clean_bytes(a); /* free, its work known to be complete */
  size_t unreserved = s->total > s->reserved ? s->total - s->reserved : 0;
  s->free = s->total > s->in_use ? s->total - s->in_use : 0;
  s->largest_free_span = unreserved + stitchable;
  if (s->largest_free_span > s->free) s->largest_free_span = s->free;
  s->fragmentation =
      s->free > 0 ? 1.0 - (double)s->largest_free_span / (double)s->free : 0.0;
}

void sa__oom_report(sa_arena *a, size_t size, sa_stream stream, FILE *f) {
  sa_stream_arena *head = sa__world_lock(a);
  sa_summary s;
  sa__summary_locked(a, &s);
  fprintf(f,
          "streamarena: out of memory: %zu bytes (%.1f MiB) requested on stream %p\n"
          "streamarena: arena summary (%s backend, device %d, granularity %.1f MiB):\n"
          "  total              %10.1f MiB  (physical cap)\n"
          "  reserved           %10.1f MiB  (physical chunks held)\n"
          "  in use             %10.1f MiB  (live blocks and spans, rounded up to their "
          "class or to 256 bytes; %.1f MiB before spans are rounded)\n"
          "  free               %10.1f MiB  (total - in use)\n"
          "  largest free span  %10.1f MiB  (unreserved + cached chunks + free memory "
          "whose work completed)\n"
          "  fragmentation      %10.1f %%    (1 - largest free span / free)\n"
          "  per stream:\n",
          size, (double)size / MiBf, stream, sa_backend_name(a->drv->backend), a->drv->device,
          (double)a->gran / MiBf, (double)s.total / MiBf, (double)s.reserved / MiBf,
          (double)s.in_use / MiBf, (double)s.live_bytes / MiBf, (double)s.free / MiBf,
          (double)s.largest_free_span / MiBf, 100.0 * s.fragmentation);
  for (sa_stream_arena *sarena = head; sarena != NULL; sarena = sarena->next) {
    sa_holding h;
    sa__holding_locked(a, sarena, &h);
    fprintf(f,
            "    stream %p%s: %zu superblocks (%.1f MiB: %.1f MiB live blocks, %.1f MiB "
            "free blocks, %zu empty), %zu live spans (%.1f MiB), %.1f MiB free spans "
            "freed here, %zu deferred blocks\n",
            sarena->stream, sa__stream_arena_gone(sarena) ? " (gone)" : "", h.superblocks,
            (double)h.superblock_bytes / MiBf, (double)h.live_block_bytes / MiBf,
            (double)h.free_block_bytes / MiBf, h.empty_superblocks, h.live_spans,
            (double)h.live_span_bytes / MiBf, (double)h.free_span_bytes / MiBf,
            h.deferred_blocks);
  }
  sa__world_unlock(a, head);
}
