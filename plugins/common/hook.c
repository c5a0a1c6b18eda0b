/* The framework hooks' shared bookkeeping (hook.h says what and why). */
#include <stdatomic.h>
#include <stdio.h>
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

static sa_status alloc_call(void *arg) {
  hook_call *c = arg;
  c->ran = true;
  return c->st = sa_alloc(c->a, &c->p, c->size, c->stream);
}

static sa_status free_call(void *arg) {
  hook_call *c = arg;
  c->ran = true;
  return c->st = sa_free(c->p, c->stream);
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

static void requested_add(sa_hook_device *d, int64_t delta) {
  if (delta > 0)
    atomic_fetch_add_explicit(&d->xrequested_total, (uint64_t)delta, memory_order_relaxed);
  else
    atomic_fetch_add_explicit(&d->xfreed_total, (uint64_t)-delta, memory_order_relaxed);
  int64_t now =
      atomic_fetch_add_explicit(&d->xrequested, delta, memory_order_relaxed) + delta;
  int64_t peak = atomic_load_explicit(&d->xrequested_peak, memory_order_relaxed);
  while (now > peak && !atomic_compare_exchange_weak_explicit(&d->xrequested_peak, &peak, now,
                                                              memory_order_relaxed,
                                                              memory_order_relaxed)) {
  }
}

void sa_hook_allocated(sa_hook *h, int dev, size_t size) {
  sa_hook_device *d = device_at(h, dev);
  atomic_fetch_add_explicit(&d->xallocs, 1, memory_order_relaxed);
  requested_add(d, (int64_t)size);
}

void sa_hook_freed(sa_hook *h, int dev, size_t size) {
  sa_hook_device *d = device_at(h, dev);
  atomic_fetch_add_explicit(&d->xfrees, 1, memory_order_relaxed);
  requested_add(d, -(int64_t)size);
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
  int64_t req = atomic_load_explicit(&d->xrequested, memory_order_relaxed);
  out->requested_bytes = req > 0 ? (uint64_t)req : 0;
  out->requested_bytes_peak =
      (uint64_t)atomic_load_explicit(&d->xrequested_peak, memory_order_relaxed);
  out->requested_bytes_total = atomic_load_explicit(&d->xrequested_total, memory_order_relaxed);
  out->freed_bytes_total = atomic_load_explicit(&d->xfreed_total, memory_order_relaxed);
  out->alloc_count = atomic_load_explicit(&d->xallocs, memory_order_relaxed);
  out->free_count = atomic_load_explicit(&d->xfrees, memory_order_relaxed);
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

sa_status sa_hook_reset_peak(sa_hook *h, int dev) {
  if (!sa_hook_valid_device(dev)) return SA_ERR_INVALID_ARGUMENT;
  sa_hook_device *d = &h->devices[dev];
  atomic_store_explicit(&d->xrequested_peak,
                        atomic_load_explicit(&d->xrequested, memory_order_relaxed),
                        memory_order_relaxed);
  return SA_OK;
}

uint64_t sa_hook_error_count(sa_hook *h) {
  uint64_t n = 0;
  for (int i = 0; i < SA_HOOK_MAX_DEVICES; i++)
    n += atomic_load_explicit(&h->devices[i].xerrors, memory_order_relaxed);
  return n;
}
