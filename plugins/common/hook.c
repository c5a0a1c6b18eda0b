/* The framework hooks' shared bookkeeping (hook.h says what and why). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "plugins/common/hook.h"

sa_status sa_hook_arena(sa_hook *h, int dev, sa_arena **out) {
  if (!sa_hook_valid_device(dev)) return SA_ERR_INVALID_ARGUMENT;
  sa_arena *a;
  sa_status st = sa_default_arena(dev, &a); /* one acquire load once it exists */
  if (st != SA_OK) return st;
  /* A framework's memory must be the GPU's: the simulator only when asked
   * for (backend=host, STREAMARENA_BACKEND=host), never as backend auto's
   * fallback where CUDA does not open (a driver older than the library
   * needs). */
  if (sa_unlikely(a->drv->stand_in)) {
    sa_driver_set_errorf(100 /* CUDA_ERROR_NO_DEVICE */,
                         "%s; %s needs CUDA memory (backend=host for the simulator)",
                         sa_arena_backend_reason(a), h->name);
    return SA_ERR_NO_DEVICE;
  }
  if (sa_unlikely(!atomic_load_explicit(&h->xstarted, memory_order_relaxed)))
    atomic_store_explicit(&h->xstarted, true, memory_order_relaxed);
  *out = a;
  return SA_OK;
}

sa_arena *sa_hook_arena_of(const void *p) { return sa__arena_of((uintptr_t)p); }

bool sa_hook_started(sa_hook *h) {
  return atomic_load_explicit(&h->xstarted, memory_order_relaxed);
}

/* cuStreamIsCapturing on CUDA, the simulator's capture state on the host. */
sa_status sa_hook_refuse_capturing(sa_arena *a, sa_stream stream) {
  return a->drv->ops->stream_capture_check(a->drv, stream) == SA_ERR_STREAM_CAPTURING
             ? SA_ERR_STREAM_CAPTURING
             : SA_OK;
}

int sa_hook_device_of(const void *p) {
  sa_arena *a = sa__arena_of((uintptr_t)p);
  return a != NULL ? a->drv->device : -1;
}

/* One library call of a hook, for on_device. */
typedef struct hook_call_s {
  sa_arena *a; /* the hook's device's */
  void *p;     /* the block: sa_alloc's result, sa_free's argument */
  size_t size;
  sa_stream stream;
  bool ran;
  sa_status st; /* the call's own status, once it ran */
} hook_call;

/* Inside call_on_stream, which made the arena's device current for a
 * legacy handle: the library need not read that back (arena.h). */
static sa_status alloc_call(void *arg) {
  hook_call *c = arg;
  c->ran = true;
  return c->st = sa__alloc_on_device(c->a, &c->p, c->size, c->stream);
}

static sa_status free_call(void *arg) {
  hook_call *c = arg;
  c->ran = true;
  return c->st = sa__free_on_device(c->p, c->stream);
}

/* The call, refused on a capturing stream, on NULL with the arena's device
 * made current (hook.h, on sa_hook_alloc): one driver op does both. */
static sa_status on_device(sa_hook *h, int dev, const char *what, hook_call *c,
                           sa_status (*call)(void *)) {
  sa_status st = c->a->drv->ops->call_on_stream(c->a->drv, c->stream, call, c);
  if (!c->ran) return st;
  if (st != c->st) sa_hook_report(h, dev, what, c->p, c->size, st);
  return c->st;
}

sa_status sa_hook_alloc(sa_hook *h, int dev, const char *what, sa_arena *a, void **out,
                        size_t size, sa_stream stream) {
  hook_call c = {.a = a, .size = size, .stream = stream};
  sa_status st = on_device(h, dev, what, &c, alloc_call);
  *out = c.p;
  return st;
}

sa_status sa_hook_free(sa_hook *h, int dev, const char *what, sa_arena *a, void *ptr,
                       size_t size, sa_stream stream) {
  if (a == NULL) return sa_free(ptr, stream);
  hook_call c = {.a = a, .p = ptr, .size = size, .stream = stream};
  return on_device(h, dev, what, &c, free_call);
}

static sa_hook_device *device_at(sa_hook *h, int dev) {
  return &h->devices[sa_hook_valid_device(dev) ? dev : 0];
}

/* ------------------------------------------------------------------------
 * Each thread's counts
 * ---------------------------------------------------------------------- */

/* Guards every hook's thread list and its devices' gone_ counts. Taken at
 * a thread's first counted call and at its exit, and by the statistics. */
static pthread_mutex_t threads_lock = PTHREAD_MUTEX_INITIALIZER;

/* The calling thread's counts, one sa_hook_thread per hook it used (a
 * plugin has one hook: the first is the one). Initial-exec, as the
 * library's own thread-local (See Note [Initial-exec thread-local]): a
 * plugin is loaded with dlopen, and the general model would call
 * __tls_get_addr at every count. */
static _Thread_local sa_hook_thread *tl_threads SA_TLS_FAST;

/* Its destructor folds an exiting thread's counts into the hooks'. A
 * plugin links the library, and so its -z nodelete: the destructor's code
 * stays mapped (src/small/thread_cache.c says why that matters). */
static pthread_key_t threads_key;
static pthread_once_t threads_once = PTHREAD_ONCE_INIT;
static _Atomic bool xkey_made;

SA_DLIST_FUNCTIONS(hook_threads, sa_hook_thread, next, prev)

static void publish(sa_hook_device *d, int64_t delta) {
  int64_t now = atomic_fetch_add_explicit(&d->xpublished, delta, memory_order_relaxed) + delta;
  int64_t peak = atomic_load_explicit(&d->xrequested_peak, memory_order_relaxed);
  while (now > peak && !atomic_compare_exchange_weak_explicit(&d->xrequested_peak, &peak, now,
                                                              memory_order_relaxed,
                                                              memory_order_relaxed)) {
  }
}

/* Owner-only counters: a plain add, atomic only for the readers. */
static void add(_Atomic uint64_t *c, uint64_t n) {
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
                        memory_order_relaxed);
}

/* A thread's counts go to its hooks' gone_ counts, its unpublished frees
 * to the published bytes. threads_lock held. */
static void retire(sa_hook_thread *t) {
  sa_hook *h = t->hook;
  for (int i = 0; i < SA_HOOK_MAX_DEVICES; i++) {
    sa_hook_counts *c = &t->counts[i];
    sa_hook_device *d = &h->devices[i];
    d->gone_allocs += atomic_load_explicit(&c->xallocs, memory_order_relaxed);
    d->gone_frees += atomic_load_explicit(&c->xfrees, memory_order_relaxed);
    d->gone_requested_total += atomic_load_explicit(&c->xrequested_total, memory_order_relaxed);
    d->gone_freed_total += atomic_load_explicit(&c->xfreed_total, memory_order_relaxed);
    if (c->unpublished != 0) publish(d, c->unpublished);
  }
  hook_threads_unlink(&h->threads, t);
}

static void threads_exit(void *arg) {
  sa_hook_thread *t = arg;
  tl_threads = NULL;
  pthread_mutex_lock(&threads_lock);
  while (t != NULL) {
    sa_hook_thread *next = t->next_own;
    retire(t);
    free(t);
    t = next;
  }
  pthread_mutex_unlock(&threads_lock);
}

static void make_key(void) {
  atomic_store_explicit(&xkey_made, pthread_key_create(&threads_key, threads_exit) == 0,
                        memory_order_release);
}

/* The calling thread's counts of h, made at its first call; NULL where
 * they could not be (no memory, no key). */
SA_NOINLINE static sa_hook_thread *thread_make(sa_hook *h) {
  (void)pthread_once(&threads_once, make_key);
  if (!atomic_load_explicit(&xkey_made, memory_order_acquire)) return NULL;
  sa_hook_thread *t = calloc(1, sizeof *t);
  if (t == NULL) return NULL;
  t->hook = h;
  t->next_own = tl_threads;
  if (pthread_setspecific(threads_key, t) != 0) {
    free(t);
    return NULL;
  }
  pthread_mutex_lock(&threads_lock);
  hook_threads_push(&h->threads, t);
  pthread_mutex_unlock(&threads_lock);
  tl_threads = t;
  return t;
}

/* An allocation (delta > 0) or a free (delta < 0) of |delta| bytes on the
 * calling thread's c, whose unpublished frees are pending after it. */
static inline void tally(sa_hook_counts *c, int64_t delta, int64_t pending) {
  SA_ASSERT(pending <= 0 && (delta > 0 || pending >= sa_hook_unpublished_floor(delta)));
  add(delta > 0 ? &c->xallocs : &c->xfrees, 1);
  add(delta > 0 ? &c->xrequested_total : &c->xfreed_total,
      (uint64_t)(delta > 0 ? delta : -delta));
  c->unpublished = pending;
}

/* Count an allocation (delta > 0) or a free (delta < 0) of |delta| bytes
 * where the fast paths below do not: the thread's first call, another
 * hook's thread, a device out of range (counted on 0), a publication. */
SA_NOINLINE static void count(sa_hook *h, int dev, int64_t delta) {
  sa_hook_device *d = device_at(h, dev);
  sa_hook_thread *t = tl_threads;
  while (t != NULL && t->hook != h) t = t->next_own;
  if (t == NULL) t = thread_make(h);
  uint64_t bytes = (uint64_t)(delta > 0 ? delta : -delta);
  if (sa_unlikely(t == NULL)) {
    pthread_mutex_lock(&threads_lock);
    *(delta > 0 ? &d->gone_allocs : &d->gone_frees) += 1;
    *(delta > 0 ? &d->gone_requested_total : &d->gone_freed_total) += bytes;
    pthread_mutex_unlock(&threads_lock);
    publish(d, delta);
    return;
  }
  sa_hook_counts *c = &t->counts[sa_hook_valid_device(dev) ? dev : 0];
  /* What the thread holds now never exceeds what it published: a new peak
   * needs an allocation its unpublished frees do not cover. */
  int64_t pending = c->unpublished + delta;
  if (pending > 0 || pending < sa_hook_unpublished_floor(delta)) {
    publish(d, pending);
    pending = 0;
  }
  tally(c, delta, pending);
}

/* The calling thread's counts of dev where they need no more than plain
 * adds: its first hook's, a device in range. */
static inline sa_hook_counts *own_counts(sa_hook *h, int dev) {
  sa_hook_thread *t = tl_threads;
  return sa_likely(t != NULL && t->hook == h && sa_hook_valid_device(dev)) ? &t->counts[dev]
                                                                            : NULL;
}

void sa_hook_allocated(sa_hook *h, int dev, size_t size) {
  sa_hook_counts *c = own_counts(h, dev);
  if (sa_likely(c != NULL)) {
    int64_t pending = c->unpublished + (int64_t)size;
    if (sa_likely(pending <= 0)) { /* covered by its frees: no new peak */
      tally(c, (int64_t)size, pending);
      return;
    }
  }
  count(h, dev, (int64_t)size);
}

void sa_hook_freed(sa_hook *h, int dev, size_t size) {
  sa_hook_counts *c = own_counts(h, dev);
  if (sa_likely(c != NULL)) {
    int64_t pending = c->unpublished - (int64_t)size;
    if (sa_likely(pending >= sa_hook_unpublished_floor(-(int64_t)size))) {
      tally(c, -(int64_t)size, pending);
      return;
    }
  }
  count(h, dev, -(int64_t)size);
}

void sa_hook_recorded(sa_hook *h, int dev) {
  atomic_fetch_add_explicit(&device_at(h, dev)->xrecords, 1, memory_order_relaxed);
}

void sa_hook_report(sa_hook *h, int dev, const char *what, const void *ptr, size_t size,
                    sa_status st) {
  atomic_fetch_add_explicit(&device_at(h, dev)->xerrors, 1, memory_order_relaxed);
  if (atomic_fetch_add_explicit(&h->xreported, 1, memory_order_relaxed) >= SA_HOOK_REPORT_LIMIT)
    return;
  const char *drv_name;
  int drv = sa_last_driver_error(&drv_name);
  fprintf(stderr, "streamarena %s: %s(%p, %zu bytes, device %d): %s", h->name, what, ptr, size,
          dev, sa_status_string(st));
  if (st == SA_ERR_DRIVER || st == SA_ERR_NO_DEVICE)
    fprintf(stderr, " (driver error %d, %s)", drv, drv_name);
  if (st == SA_ERR_OUT_OF_MEMORY)
    fprintf(stderr, "; oom_report=1 in STREAMARENA_CONF describes the arena");
  else if (st == SA_ERR_STREAM_CAPTURING)
    fprintf(stderr, "; %s", h->capture_hint);
  fputc('\n', stderr);
}

void sa_hook_trim(sa_hook *h) {
  for (int i = 0; i < SA_HOOK_MAX_DEVICES; i++) {
    sa_arena *a = sa__default_arena_now(i);
    if (a == NULL) continue;
    sa_status st = sa_trim(a, 0);
    if (st != SA_OK) sa_hook_report(h, i, "trim", NULL, 0, st);
  }
}

sa_status sa_hook_get_stats(sa_hook *h, int dev, sa_hook_stats *out) {
  if (!sa_hook_valid_device(dev) || out == NULL) return SA_ERR_INVALID_ARGUMENT;
  memset(out, 0, sizeof *out);
  sa_hook_device *d = &h->devices[dev];
  pthread_mutex_lock(&threads_lock);
  out->alloc_count = d->gone_allocs;
  out->free_count = d->gone_frees;
  out->requested_bytes_total = d->gone_requested_total;
  out->freed_bytes_total = d->gone_freed_total;
  for (sa_hook_thread *t = h->threads; t != NULL; t = t->next) {
    sa_hook_counts *c = &t->counts[dev];
    out->alloc_count += atomic_load_explicit(&c->xallocs, memory_order_relaxed);
    out->free_count += atomic_load_explicit(&c->xfrees, memory_order_relaxed);
    out->requested_bytes_total += atomic_load_explicit(&c->xrequested_total, memory_order_relaxed);
    out->freed_bytes_total += atomic_load_explicit(&c->xfreed_total, memory_order_relaxed);
  }
  pthread_mutex_unlock(&threads_lock);
  /* Another thread's free may be counted before its allocation was read. */
  if (out->requested_bytes_total > out->freed_bytes_total)
    out->requested_bytes = out->requested_bytes_total - out->freed_bytes_total;
  out->requested_bytes_peak =
      (uint64_t)atomic_load_explicit(&d->xrequested_peak, memory_order_relaxed);
  out->record_count = atomic_load_explicit(&d->xrecords, memory_order_relaxed);
  out->errors = atomic_load_explicit(&d->xerrors, memory_order_relaxed);
  sa_arena *a = sa__default_arena_now(dev);
  if (a == NULL) return SA_OK;
  sa_stats s;
  sa_status st = sa_get_stats(a, &s);
  if (st != SA_OK) return st;
  out->reserved_bytes = s.reserved_bytes;
  out->reserved_bytes_peak = s.reserved_bytes_peak;
  out->live_bytes = s.live_bytes;
  out->live_bytes_peak = s.live_bytes_peak;
  out->cached_bytes = s.cached_bytes;
  out->oom_events = s.oom_events;
  out->fast_path_ratio = s.fast_path_ratio;
  return SA_OK;
}

/* The caller's own frees are published first, so that for one thread the
 * peak is what it holds. */
sa_status sa_hook_reset_peak(sa_hook *h, int dev) {
  if (!sa_hook_valid_device(dev)) return SA_ERR_INVALID_ARGUMENT;
  sa_hook_device *d = &h->devices[dev];
  for (sa_hook_thread *t = tl_threads; t != NULL; t = t->next_own) {
    if (t->hook != h || t->counts[dev].unpublished == 0) continue;
    atomic_fetch_add_explicit(&d->xpublished, t->counts[dev].unpublished, memory_order_relaxed);
    t->counts[dev].unpublished = 0;
  }
  atomic_store_explicit(&d->xrequested_peak,
                        atomic_load_explicit(&d->xpublished, memory_order_relaxed),
                        memory_order_relaxed);
  return SA_OK;
}

uint64_t sa_hook_error_count(sa_hook *h) {
  uint64_t n = 0;
  for (int i = 0; i < SA_HOOK_MAX_DEVICES; i++)
    n += atomic_load_explicit(&h->devices[i].xerrors, memory_order_relaxed);
  return n;
}
