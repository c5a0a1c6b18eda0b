/* Arenas: creation and destruction, tuning and statistics.
 *
 * An arena joins the registry (registry.c), which maps an address to its
 * arena without a lock, once it is complete, and leaves it before anything
 * is torn down, so a later free of one of its pointers is
 * SA_ERR_INVALID_POINTER, never a crash.
 */
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "base/base.h"
#include "base/device_sync.h"
#include "base/event_pool.h"
#include "base/record.h"
#include "config.h"
#include "driver/driver.h"
#include "large/span.h"
#include "pool_block.h"
#include "reclaim.h"
#include "registry.h"
#include "report.h"
#include "small/stream_arena.h"
#include "small/superblock.h"
#include "small/thread_cache.h"
#include "trace.h"
#include "vm/physical.h"
#include "vm/va_space.h"

static _Atomic uint64_t next_arena_id = 1;

/* Open config's backend and device, grant its peers, and read what the
 * configuration rules need: the granularity (a power of two) and the
 * device's memory. The access list lives in the driver from here on: every
 * set_access of every mapping (growth, stitching, remapping) grants it,
 * whoever maps. */
static sa_status open_device(const sa_config *c, sa_driver **drv, size_t *gran, size_t *total) {
  sa_status st = sa_driver_open(c->backend, c->device, drv);
  if (st != SA_OK) return st;
  if (c->peer_access != 0) st = (*drv)->ops->set_peer_access(*drv, c->peer_access);
  if (st == SA_OK) st = (*drv)->ops->granularity(*drv, gran);
  if (st == SA_OK) st = (*drv)->ops->total_memory(*drv, total);
  if (st == SA_OK && (*gran == 0 || (*gran & (*gran - 1)) != 0)) st = SA_ERR_INTERNAL;
  if (st != SA_OK) {
    sa_driver_close(*drv);
    *drv = NULL;
  }
  return st;
}

sa_status sa_config_check(const sa_config *config, char *err, size_t err_size) {
  if (err != NULL && err_size > 0) err[0] = '\0';
  sa_config c;
  if (config != NULL)
    c = *config;
  else
    sa_config_init(&c);
  sa_driver *drv;
  size_t gran = 0, total = 0;
  sa_status st = open_device(&c, &drv, &gran, &total);
  if (st != SA_OK) {
    const char *name;
    (void)sa_last_driver_error(&name);
    /* A refused peer_access names the device in the driver error, a bad
     * STREAMARENA_BACKEND (the open's only SA_ERR_BAD_CONFIG) the variable. */
    bool why = st == SA_ERR_DRIVER || st == SA_ERR_BAD_CONFIG ||
               (c.peer_access != 0 && (st == SA_ERR_NO_DEVICE || st == SA_ERR_NOT_SUPPORTED));
    if (err != NULL)
      snprintf(err, err_size, "backend=%s,device=%d: %s%s%s", sa_backend_name(c.backend),
               c.device, sa_status_string(st), why ? ": " : "", why ? name : "");
    return st;
  }
  sa_driver_close(drv);
  sa_resolved r;
  st = sa__config_resolve(&c, gran, total, &r, err, err_size);
  if (st == SA_OK && c.trace_path[0] != '\0') st = sa__trace_check(c.trace_path, err, err_size);
  return st;
}

sa_status sa_device_granularity(sa_backend backend, int device, size_t *bytes) {
  if (bytes == NULL) return SA_ERR_INVALID_ARGUMENT;
  *bytes = 0;
  sa_config c;
  sa_config_init(&c);
  c.backend = backend;
  c.device = device;
  sa_driver *drv;
  size_t total;
  sa_status st = open_device(&c, &drv, bytes, &total);
  if (st == SA_OK) sa_driver_close(drv);
  return st;
}

size_t sa_arena_granularity(const sa_arena *a) { return a != NULL ? a->gran : 0; }

static void arena_free(sa_arena *a) {
  pthread_rwlock_destroy(&a->streams.rw);
  pthread_mutex_destroy(&a->lock);
  pthread_mutex_destroy(&a->reclaim_lock);
  pthread_mutex_destroy(&a->events.lock);
  pthread_mutex_destroy(&a->records.lock);
  pthread_rwlock_destroy(&a->records.rw);
  pthread_mutex_destroy(&a->tracing.lock);
  pthread_mutex_destroy(&a->pools.lock);
  pthread_cond_destroy(&a->grower.wake);
  pthread_cond_destroy(&a->grower.idle);
  free(a);
}

sa_status sa_arena_create(const sa_config *config, sa_arena **out) {
  if (out == NULL) return SA_ERR_INVALID_ARGUMENT;
  *out = NULL;
  sa_arena *a = sa__zalloc_aligned(sizeof *a, _Alignof(sa_arena));
  if (a == NULL) return SA_ERR_OUT_OF_MEMORY;
  if (config != NULL)
    a->cfg = *config;
  else
    sa_config_init(&a->cfg);
  pthread_mutex_init(&a->lock, NULL);
  pthread_mutex_init(&a->reclaim_lock, NULL);
  pthread_rwlock_init(&a->streams.rw, NULL);
  pthread_mutex_init(&a->events.lock, NULL);
  pthread_mutex_init(&a->records.lock, NULL);
  pthread_rwlock_init(&a->records.rw, NULL);
  pthread_mutex_init(&a->tracing.lock, NULL);
  sa__pools_init(a);
  sa__grower_init(a);
  ck_stack_init(&a->small.free_superblocks);
  ck_stack_init(&a->small.free_carved);
  a->id = atomic_fetch_add(&next_arena_id, 1);

  size_t total = 0;
  sa_status st = open_device(&a->cfg, &a->drv, &a->gran, &total);
  if (st != SA_OK) {
    arena_free(a);
    return st;
  }
  a->gran_shift = (unsigned)__builtin_ctzll(a->gran);
  a->range.page_shift =
      a->gran > SA_PAGE_MAX ? (unsigned)__builtin_ctzll(SA_PAGE_MAX) : a->gran_shift;
  sa_resolved r;
  st = sa__config_resolve(&a->cfg, a->gran, total, &r, NULL, 0);
  if (st == SA_OK) {
    a->cfg.superblock_size = r.superblock_size;
    a->cfg.large_threshold = r.large_threshold;
    a->large_threshold_explicit = r.large_threshold_explicit;
    a->physical.cap = r.physical_cap;
    a->physical.target_excess = r.target_excess;
    a->physical.target_floor_bytes = sa__physical_target_floor(a) * a->gran;
    a->range.size = r.va_size;
    size_t soft = a->cfg.reserve_limit_bytes;
    a->physical.reserve_limit = soft != 0 && soft < a->physical.cap ? soft : a->physical.cap;
    a->physical.budgeted =
        a->cfg.max_physical_bytes != 0 || a->physical.reserve_limit < a->physical.cap;
  }
  if (st == SA_OK) {
    /* A slot of slack, so that the range can start on a slot boundary and
     * own every slot it touches (registry.c). */
    size_t slots = (a->range.size + SA_REGISTRY_SLOT - 1) & ~(SA_REGISTRY_SLOT - 1);
    a->va.reserved_size = slots + SA_REGISTRY_SLOT - a->gran;
    st = a->drv->ops->va_reserve(a->drv, a->va.reserved_size, a->gran, &a->va.reserved_base);
    a->range.base = (a->va.reserved_base + SA_REGISTRY_SLOT - 1) & ~(SA_REGISTRY_SLOT - 1);
  }
  if (st != SA_OK) {
    sa_driver_close(a->drv);
    arena_free(a);
    return st;
  }
  atomic_store(&a->small.xsuperblock_size, a->cfg.superblock_size);
  atomic_store(&a->xlarge_threshold, a->cfg.large_threshold);
  st = sa__va_init(a);
  if (st == SA_OK && a->cfg.trace_path[0] != '\0') st = sa__trace_open(a, a->cfg.trace_path);
  a->hooks = a->trace != NULL || sa__checks_handouts(a);
  if (st == SA_OK) st = sa__registry_add(a); /* last: a is complete */
  if (st != SA_OK) {
    (void)sa__trace_close(a);
    sa__va_fini(a);
    (void)a->drv->ops->va_release(a->drv, a->va.reserved_base, a->va.reserved_size);
    sa_driver_close(a->drv);
    arena_free(a);
    return st;
  }
  /* What the user asked to map up front: on failure the whole arena goes,
   * through the path that returns everything it mapped. */
  if (a->cfg.initial_physical_bytes != 0) {
    st = sa__span_prefill(a, a->cfg.initial_physical_bytes);
    if (st != SA_OK) {
      (void)sa_arena_destroy(a);
      return st;
    }
  }
  *out = a;
  return SA_OK;
}

sa_backend sa_arena_backend(const sa_arena *a) {
  return a != NULL ? a->drv->backend : SA_BACKEND_AUTO;
}

const char *sa_arena_backend_reason(const sa_arena *a) { return a != NULL ? a->drv->why : ""; }

/* Keep the first failure. */
static void note(sa_status *first, sa_status st) {
  if (*first == SA_OK) *first = st;
}

sa_status sa_arena_destroy(sa_arena *a) {
  if (a == NULL) return SA_OK;
  sa_status first = SA_OK;
  sa__grower_fini(a); /* its job in flight published: every range is a run */
  sa_stats stats;
  (void)sa_get_stats(a, &stats); /* before the entries and their counts go */
  uint64_t live = stats.alloc_count - stats.free_count;
  /* A pool's segments are its own spans, not the caller's; its live
   * blocks are. */
  uint64_t segments, pool_blocks;
  sa__pools_count(a, &segments, &pool_blocks);
  live = live - segments + pool_blocks;
  sa__registry_remove(a);
  sa__entries_detach(a);
  SA_VALIDATE(sa__world_check(a)); /* whole, before it is torn down */

  /* Wait for all work: one wait for the device, not one per stream (the
   * user may have destroyed any of them). Spans go first: their marks name
   * stream arenas. */
  note(&first, sa__device_sync(a));
  note(&first, sa__span_fini(a));
  sa__stream_arenas_destroy(a);
  /* Pools not released: their segments are unmapped below with every
   * span; their blocks, tombstones and growth stream go. */
  note(&first, sa__pools_fini(a));

  /* Everything mapped goes, live or not; then the chunks and the range. */
  sa_superblock *sb;
  while ((sb = sa__superblock_pop_global(a)) != NULL)
    if (sb->event != NULL) note(&first, sa__event_settle(a, sb->event));
  for (sb = a->small.all_superblocks; sb != NULL; sb = sb->all_next)
    if (sb->hdr.chunks != NULL) note(&first, sa__physical_unmap(a, &sb->hdr));
  note(&first, sa__superblock_slabs_fini(a));
  note(&first, sa__physical_unmap_stuck(a));
  sa__physical_release_cached(a, 0);
  if (a->physical.all != NULL) note(&first, SA_ERR_DRIVER);
  sa__physical_fini(a); /* refused: they stay with the driver */
  note(&first, a->drv->ops->va_release(a->drv, a->va.reserved_base, a->va.reserved_size));
  note(&first, sa__event_pool_fini(a));
  sa__record_fini(a);
  note(&first, sa__trace_close(a));
  for (sb = a->small.all_superblocks; sb != NULL;) {
    sa_superblock *n = sb->all_next;
    free(sb->free_idx);
    free((void *)sb->state);
    free(sb);
    sb = n;
  }
  sa__va_fini(a);
  sa_driver_close(a->drv);
  arena_free(a);
  if (first != SA_OK) return first;
  if (live != 0) {
    fprintf(stderr, "streamarena: arena destroyed with %llu blocks still allocated\n",
            (unsigned long long)live);
    return SA_ERR_LIVE_BLOCKS;
  }
  return SA_OK;
}

sa_status sa_set_superblock_size(sa_arena *a, size_t bytes) {
  if (a == NULL || bytes == 0) return SA_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  /* The creation rules, against what the arena resolved then. */
  sa_config c = a->cfg;
  c.superblock_size = bytes;
  c.large_threshold = a->large_threshold_explicit ? a->cfg.large_threshold : 0;
  c.max_physical_bytes = a->physical.cap;
  c.va_reserve_bytes = a->range.size;
  sa_resolved r;
  if (sa__config_resolve(&c, a->gran, a->physical.cap, &r, NULL, 0) != SA_OK) {
    pthread_mutex_unlock(&a->lock);
    return SA_ERR_INVALID_ARGUMENT;
  }
  size_t threshold = r.large_threshold;
  /* Grow the threshold last and shrink it first, so no thread ever carves a
   * class larger than the superblock it gets. */
  if (threshold < atomic_load(&a->xlarge_threshold)) atomic_store(&a->xlarge_threshold, threshold);
  atomic_store(&a->small.xsuperblock_size, bytes);
  atomic_store(&a->xlarge_threshold, threshold);
  a->cfg.superblock_size = bytes;
  a->cfg.large_threshold = threshold;
  pthread_mutex_unlock(&a->lock);
  return SA_OK;
}

sa_status sa_stream_release(sa_arena *a, sa_stream s) {
  if (a == NULL) return SA_ERR_INVALID_ARGUMENT;
  sa_stream_arena *sarena;
  sa_status st = sa__legacy_stream_check(a, s);
  if (st != SA_OK) return st;
  st = sa__stream_arena_release(a, s, &sarena);
  if (sarena == NULL) return st;
  /* Its work is done: what every thread cached for it comes back now, and
   * its empty superblocks go to the global stack without an event; those
   * carved in free span memory go back to those spans (reclaim.h). */
  uint64_t id = sarena->id; /* the reap may free sarena */
  sa__tentry_release_stream(sarena);
  sa__stream_arena_shed(sarena, SA_UNNAMED);
  sa__stream_arena_unbind(sarena);
  sa__stream_arenas_reap(a);
  sa__reclaim_released(a, id);
  return SA_OK;
}

sa_status sa_get_stats(sa_arena *a, sa_stats *out) {
  if (a == NULL || out == NULL) return SA_ERR_INVALID_ARGUMENT;
  memset(out, 0, sizeof *out);
  sa__tentry_publish_own(a); /* exact for the calling thread */
  sa_tentry_counts tc;
  sa__tentry_counts(a, &tc);
  uint64_t fast_allocs = tc.fast_allocs, fast_frees = tc.fast_frees;
  size_t streams = sa__stream_arenas_live(a);
  pthread_mutex_lock(&a->lock);
  /* Counted as superblocks move (superblock.c): each is in exactly one
   * count, so active + empty is the total. Counting each stream's empties
   * and then the global stack's counted one that moved in between twice. */
  out->superblocks_active = atomic_load(&a->small.xsuperblocks_active);
  out->superblocks_empty = atomic_load(&a->small.xsuperblocks_empty);
  out->superblocks_total = out->superblocks_active + out->superblocks_empty;
  out->reserved_bytes = sa__physical_made(&a->physical);
  out->reserved_bytes_peak = a->physical.peak;
  out->cached_bytes = a->physical.cache_bytes + atomic_load(&a->small.xsuperblock_empty_bytes) +
                      a->spans.free_bytes + a->small.slab_free_bytes + tc.kept_bytes +
                      a->spans.orphan_bytes;
  out->va_used_bytes = a->va.used;
  out->va_reserved_bytes = a->range.size;
  /* Kept ones are freed. Counted under another hold of the lock: one its
   * owner freed since may be in both counts (a concurrent run's margin). */
  size_t kept = tc.kept_spans + a->spans.norphans;
  out->large_spans = a->spans.nlive > kept ? a->spans.nlive - kept : 0;
  out->chunks_total = a->physical.nchunks;
  pthread_mutex_unlock(&a->lock);
  out->streams = streams;
  int64_t live = atomic_load(&a->stats.xlive_bytes);
  out->live_bytes = live > 0 ? (size_t)live : 0;
  /* A publisher adds to the count before it raises the peak (sa__live_add):
   * raised here too, no read shows the peak below the count, or falling. */
  sa__live_peak_raise(a, live);
  out->live_bytes_peak = (size_t)atomic_load(&a->stats.xlive_peak);
  out->alloc_count = fast_allocs + atomic_load(&a->stats.xslow_allocs);
  out->free_count = fast_frees + atomic_load(&a->stats.xslow_frees);
  out->fast_allocs = fast_allocs;
  out->fast_frees = fast_frees;
  out->large_allocs = atomic_load(&a->stats.xlarge_allocs) + tc.kept_reuses;
  out->background_growths = atomic_load(&a->grower.xgrowths);
  out->background_bytes = atomic_load(&a->grower.xbytes);
  uint64_t ops = out->alloc_count + out->free_count;
  out->fast_path_ratio = ops ? (double)(fast_allocs + fast_frees) / (double)ops : 0.0;
  out->deferred_frees = atomic_load(&a->stats.xdeferred_blocks);
  out->events_in_flight = atomic_load(&a->events.xin_flight);
  out->oom_events = atomic_load(&a->stats.xoom_events);
  out->defragmentations = atomic_load(&a->stats.xdefrags);
  return SA_OK;
}
