/* Check mode of the PyTorch plugin (sa_torch_set_check): every free first
 * fills the block with a pattern, so memory reused too early shows up as
 * the pattern (a NaN in every floating-point type PyTorch trains in).
 *
 * The fill runs on a stream of the plugin's own per device that waits for
 * the freeing stream and for every stream recorded for the block (events
 * recorded now), and the block is then recorded on that stream: the
 * allocator must order the block's next use after the fill like after any
 * recorded stream. Waiting on the filling stream rather than on the freeing
 * one keeps the program's own ordering unchanged, so a recorded stream the
 * allocator forgot is not covered up by the freeing stream waiting for it.
 *
 * Owns the filling streams, one event per device and the table of recorded
 * (block, stream) pairs, all under one lock: check mode is a debugging aid,
 * not a fast path. Calls the public API and the driver interface.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "plugins/torch/plugin.h"

typedef struct recorded_s {
  void *p;
  sa_stream stream;
} recorded;

typedef struct filler_s {
  sa_driver *drv;  /* the arena's backend, device */
  sa_stream stream;
  sa_event event;  /* re-recorded for each wait: a wait keeps the record it saw */
  uint64_t fills;
} filler;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int xenabled;
static uint32_t fill_pattern;
static recorded *recs; /* lock */
static size_t nrecs, caprecs;
static filler fillers[SA_TORCH_MAX_DEVICES]; /* lock */

sa_status sa_torch_set_check(int enabled, uint32_t pattern) {
  if (sa_hook_started(&sa__torch_hook)) return SA_ERR_NOT_SUPPORTED;
  pthread_mutex_lock(&lock);
  fill_pattern = pattern;
  atomic_store(&xenabled, enabled != 0);
  pthread_mutex_unlock(&lock);
  return SA_OK;
}

/* The device's filling stream and event, made at its first fill. Lock held. */
static sa_status filler_get(int dev, filler **out) {
  filler *f = &fillers[dev];
  if (f->drv == NULL) {
    sa_arena *a;
    sa_driver *drv;
    sa_status st = sa_hook_arena(&sa__torch_hook, dev, &a);
    if (st == SA_OK) st = sa_driver_open(sa_arena_backend(a), dev, &drv);
    if (st != SA_OK) return st;
    st = drv->ops->stream_create(drv, &f->stream);
    if (st == SA_OK) {
      st = drv->ops->event_create(drv, &f->event);
      if (st != SA_OK) (void)drv->ops->stream_destroy(drv, f->stream);
    }
    if (st != SA_OK) {
      sa_driver_close(drv);
      return st;
    }
    f->drv = drv;
  }
  *out = f;
  return SA_OK;
}

/* The filling stream waits for the work enqueued on s so far. Lock held. */
static sa_status wait_for(filler *f, sa_stream s) {
  sa_status st = f->drv->ops->event_record(f->drv, f->event, s);
  return st == SA_OK ? f->drv->ops->stream_wait_event(f->drv, f->stream, f->event) : st;
}

sa_status sa__torch_check_fill(int dev, void *ptr, size_t size, sa_stream stream) {
  if (!atomic_load_explicit(&xenabled, memory_order_relaxed)) return SA_OK;
  /* A capturing stream keeps its block (the free refuses it): nothing of it
   * is recorded or filled. */
  sa_arena *a = sa_hook_arena_of(ptr);
  if (a != NULL && sa_hook_refuse_capturing(a, stream) != SA_OK) return SA_ERR_STREAM_CAPTURING;
  pthread_mutex_lock(&lock);
  filler *f = NULL;
  sa_status st = filler_get(dev, &f);
  /* Recording first proves ptr is a live block before anything writes it;
   * the allocator records its event on the filling stream at the free,
   * after the fill below. */
  if (st == SA_OK) st = sa_record_stream(ptr, f->stream);
  if (st == SA_OK) st = wait_for(f, stream);
  for (size_t i = 0; i < nrecs;) { /* every record of ptr goes, waited for or not */
    if (recs[i].p != ptr) {
      i++;
      continue;
    }
    if (st == SA_OK && recs[i].stream != stream) st = wait_for(f, recs[i].stream);
    recs[i] = recs[--nrecs];
  }
  if (st == SA_OK && size >= 4)
    st = f->drv->ops->memset32_async(f->drv, (uintptr_t)ptr, fill_pattern, size / 4, f->stream);
  if (st == SA_OK) f->fills++;
  pthread_mutex_unlock(&lock);
  return st;
}

sa_status sa__torch_check_record(void *ptr, sa_stream stream) {
  if (!atomic_load_explicit(&xenabled, memory_order_relaxed)) return SA_OK;
  sa_status st = SA_OK;
  pthread_mutex_lock(&lock);
  /* One record per (block, stream), as the allocator keeps them: a block
   * recorded again every step must not grow the table or the fill's waits. */
  for (size_t i = 0; i < nrecs; i++)
    if (recs[i].p == ptr && recs[i].stream == stream) {
      pthread_mutex_unlock(&lock);
      return SA_OK;
    }
  if (nrecs == caprecs) {
    size_t cap = caprecs ? caprecs * 2 : 64;
    recorded *grown = realloc(recs, cap * sizeof *grown);
    if (grown == NULL) {
      st = SA_ERR_OUT_OF_MEMORY;
    } else {
      recs = grown;
      caprecs = cap;
    }
  }
  if (st == SA_OK) recs[nrecs++] = (recorded){ptr, stream};
  pthread_mutex_unlock(&lock);
  return st;
}

uint64_t sa__torch_check_fills(int dev) {
  pthread_mutex_lock(&lock);
  uint64_t n = fillers[dev].fills;
  pthread_mutex_unlock(&lock);
  return n;
}
