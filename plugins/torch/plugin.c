/* The PyTorch plugin: PyTorch's pluggable-allocator hooks over the default
 * arenas (streamarena_torch.h lists them and what calls them).
 *
 * Owns per-device bookkeeping PyTorch reports (bytes requested, counts) and
 * the check mode (check.c). Calls the public API, the default arenas and
 * the registry (a block's arena, for its device) and, for check mode, the
 * driver interface; called by PyTorch through function pointers.
 *
 * It keeps no arena of its own: a hook asks for the device's default arena
 * (sa_default_arena, or sa__default_arena_now where it must create none)
 * or for a block's (the registry) at every call. The plugin exports the
 * whole API, so sa_default_arenas_shutdown may destroy those arenas (an
 * atexit handler) while PyTorch still frees tensors at interpreter
 * teardown: a kept pointer would then name freed memory. The registry
 * forgets a destroyed arena, so the free of one of its blocks is refused
 * (SA_ERR_INVALID_POINTER, reported), and the next allocation creates a
 * fresh default arena.
 *
 * PyTorch passes the allocation's stream to the free hook, so a free is
 * always on the block's own stream: its reuse there is ordered by the stream
 * and elsewhere waits for an event, and work on other streams is covered only
 * by record_stream, exactly the rule of PyTorch's caching allocator. The
 * free hook's size is the allocation's, which keeps the byte count exact
 * without a lookup. Stream 0 is the legacy stream of the hook's device,
 * whatever device is current when PyTorch calls (on_device).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "plugins/torch/plugin.h"

/* Full messages for the first failures; later ones are only counted. */
#define REPORT_LIMIT 8

typedef struct device_s {
  _Alignas(64) _Atomic int64_t xrequested, xrequested_peak;
  _Atomic uint64_t xrequested_total, xfreed_total; /* bytes, ever */
  _Atomic uint64_t xallocs, xfrees, xrecords, xerrors;
} device;

static device devices[SA_TORCH_MAX_DEVICES];
static _Atomic bool xstarted; /* an allocation got an arena */
static _Atomic uint64_t xreported;
static _Atomic int xwarned_fraction;

static void report(int dev, const char *what, void *ptr, size_t size, sa_status st) {
  atomic_fetch_add_explicit(&devices[dev].xerrors, 1, memory_order_relaxed);
  if (atomic_fetch_add_explicit(&xreported, 1, memory_order_relaxed) >= REPORT_LIMIT) return;
  const char *drv_name;
  int drv = sa_last_driver_error(&drv_name);
  fprintf(stderr, "streamarena torch: %s(%p, %zu bytes, device %d): %s", what, ptr, size, dev,
          sa_status_string(st));
  if (st == SA_ERR_DRIVER || st == SA_ERR_NO_DEVICE)
    fprintf(stderr, " (driver error %d, %s)", drv, drv_name);
  const char *hint = st == SA_ERR_OUT_OF_MEMORY
                         ? "; oom_report=1 in STREAMARENA_CONF describes the arena"
                     : st == SA_ERR_STREAM_CAPTURING
                         ? "; capture CUDA graphs with PyTorch's own allocator (docs/TORCH.md)"
                         : "";
  fprintf(stderr, "%s\n", hint);
}

static bool valid_device(int dev) { return dev >= 0 && dev < SA_TORCH_MAX_DEVICES; }

sa_status sa__torch_arena(int dev, sa_arena **out) {
  if (!valid_device(dev)) return SA_ERR_INVALID_ARGUMENT;
  sa_arena *a;
  sa_status st = sa_default_arena(dev, &a); /* one acquire load once it exists */
  if (st != SA_OK) return st;
  /* PyTorch's memory must be the GPU's: the simulator only when asked for
   * (backend=host, STREAMARENA_BACKEND=host), never as backend auto's
   * fallback where CUDA does not open (a driver older than the library
   * needs), which would hand PyTorch CPU addresses its kernels fault on. */
  if (sa_unlikely(a->drv->stand_in)) {
    sa_driver_set_errorf(100 /* CUDA_ERROR_NO_DEVICE */,
                         "%s; PyTorch needs CUDA memory (backend=host for the simulator)",
                         sa_arena_backend_reason(a));
    return SA_ERR_NO_DEVICE;
  }
  if (sa_unlikely(!atomic_load_explicit(&xstarted, memory_order_relaxed)))
    atomic_store_explicit(&xstarted, true, memory_order_relaxed);
  *out = a;
  return SA_OK;
}

bool sa__torch_started(void) { return atomic_load_explicit(&xstarted, memory_order_relaxed); }

static void requested_add(device *d, int64_t delta) {
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

/* torch.cuda.graph captures through this allocator too, but memory used by
 * a graph must stay reserved for its replays, which PyTorch's own graph
 * pools do and streamarena cannot: a block allocated or freed during the
 * capture would go to other tensors while the graph still writes it. So
 * both hooks refuse a capturing stream (cuStreamIsCapturing, 15 ns), and
 * the message says to capture with PyTorch's own allocator. */
static sa_status refuse_capturing(sa_arena *a, sa_stream stream) {
  return a->drv->ops->stream_capture_check(a->drv, stream);
}

/* One library call of a hook, for on_device. */
typedef struct hook_call_s {
  sa_arena *a;      /* the hook's device's */
  void *p;          /* the block: sa_alloc's result, sa_free's argument */
  size_t size;
  sa_stream stream;
  bool ran;
  sa_status st;     /* the call's own status, once it ran */
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

/* PyTorch's stream 0 of device dev is dev's legacy stream, but its hooks
 * run with whatever device is current (a tensor's deleter runs where the
 * tensor dies), and the library takes NULL as the legacy stream of the
 * current device, refusing another device's (streamarena.h, on
 * sa_stream). So a call on NULL runs with dev made current, and then the
 * caller's device is put back. Where only putting it back failed, the call
 * did its work: that failure is reported under the hook's name (what), and
 * the call's own status returned. */
static sa_status on_device(int dev, const char *what, hook_call *c, sa_status (*call)(void *)) {
  if (sa_likely(!sa_driver_stream_is_legacy(c->stream))) return call(c);
  sa_status st = c->a->drv->ops->call_in_context(c->a->drv, call, c);
  if (!c->ran) return st;
  if (st != c->st) report(dev, what, c->p, c->size, st);
  return c->st;
}

void *sa_torch_malloc(size_t size, int dev, sa_stream stream) {
  sa_arena *a;
  void *p = NULL;
  sa_status st = sa__torch_arena(dev, &a);
  if (st == SA_OK && sa_unlikely(refuse_capturing(a, stream) == SA_ERR_STREAM_CAPTURING))
    st = SA_ERR_STREAM_CAPTURING;
  if (st == SA_OK) {
    hook_call c = {.a = a, .size = size, .stream = stream};
    st = on_device(dev, "malloc", &c, alloc_call);
    p = c.p;
  }
  if (sa_unlikely(st != SA_OK)) {
    report(valid_device(dev) ? dev : 0, "malloc", NULL, size, st);
    return NULL;
  }
  /* Size 0 is NULL and nothing allocated: PyTorch never frees a NULL data
   * pointer, so counting it would leave the live count off for good. */
  if (p == NULL) return NULL;
  device *d = &devices[dev];
  atomic_fetch_add_explicit(&d->xallocs, 1, memory_order_relaxed);
  requested_add(d, (int64_t)size);
  return p;
}

void sa_torch_free(void *ptr, size_t size, int dev, sa_stream stream) {
  if (ptr == NULL) return;
  int at = valid_device(dev) ? dev : 0;
  /* The block's arena: a free creates none. NULL for a pointer of no live
   * arena (a destroyed one's, or not ours), which sa_free refuses. */
  sa_arena *a = sa__arena_of((uintptr_t)ptr);
  if (a != NULL && sa_unlikely(refuse_capturing(a, stream) == SA_ERR_STREAM_CAPTURING)) {
    report(at, "free", ptr, size, SA_ERR_STREAM_CAPTURING); /* kept: the graph may use it */
    return;
  }
  sa_status fill = sa__torch_check_fill(at, ptr, size, stream);
  /* Freed whether the fill worked or not, on NULL with the block's device
   * (its arena's, the hook's) current. */
  hook_call c = {.a = a, .p = ptr, .size = size, .stream = stream};
  sa_status st = a != NULL ? on_device(at, "free", &c, free_call) : sa_free(ptr, stream);
  if (sa_unlikely(st != SA_OK)) {
    report(at, "free", ptr, size, st); /* one failed hook: the fill's failure was the same */
    return;
  }
  if (sa_unlikely(fill != SA_OK)) report(at, "check fill", ptr, size, fill);
  device *d = &devices[at];
  atomic_fetch_add_explicit(&d->xfrees, 1, memory_order_relaxed);
  requested_add(d, -(int64_t)size);
}

void sa_torch_record_stream(void *ptr, sa_stream stream) {
  /* PyTorch passes the storage's pointer as it is: NULL for an empty tensor,
   * and memory it did not allocate here (DLPack, from_blob) for others. Its
   * own allocator skips both; nothing of ours needs ordering. */
  if (ptr == NULL) return;
  sa_status st = sa_record_stream(ptr, stream);
  if (st == SA_ERR_INVALID_POINTER) return;
  if (st == SA_OK) st = sa__torch_check_record(ptr, stream);
  /* PyTorch does not say the device, and calls this on whichever device is
   * current: count it on the device of the block's arena. */
  sa_arena *a = sa__arena_of((uintptr_t)ptr);
  int dev = a != NULL && valid_device(a->drv->device) ? a->drv->device : 0;
  if (st != SA_OK) {
    report(dev, "record_stream", ptr, 0, st);
    return;
  }
  atomic_fetch_add_explicit(&devices[dev].xrecords, 1, memory_order_relaxed);
}

void sa_torch_empty_cache(void) {
  for (int i = 0; i < SA_TORCH_MAX_DEVICES; i++) {
    sa_arena *a = sa__default_arena_now(i);
    if (a == NULL) continue;
    sa_status st = sa_trim(a, 0);
    if (st != SA_OK) report(i, "empty_cache", NULL, 0, st);
  }
}

void sa_torch_set_memory_fraction(double fraction, int dev) {
  if (atomic_exchange(&xwarned_fraction, 1) == 0)
    fprintf(stderr,
            "streamarena torch: set_per_process_memory_fraction(%g, device %d) is not "
            "supported; cap the arena with max_physical in STREAMARENA_CONF\n",
            fraction, dev);
}

sa_status sa_torch_get_stats(int dev, sa_torch_stats *out, size_t size) {
  if (!valid_device(dev) || out == NULL || size != sizeof *out) return SA_ERR_INVALID_ARGUMENT;
  memset(out, 0, sizeof *out);
  device *d = &devices[dev];
  int64_t req = atomic_load_explicit(&d->xrequested, memory_order_relaxed);
  out->requested_bytes = req > 0 ? (uint64_t)req : 0;
  out->requested_bytes_peak = (uint64_t)atomic_load_explicit(&d->xrequested_peak,
                                                             memory_order_relaxed);
  out->requested_bytes_total = atomic_load_explicit(&d->xrequested_total, memory_order_relaxed);
  out->freed_bytes_total = atomic_load_explicit(&d->xfreed_total, memory_order_relaxed);
  out->alloc_count = atomic_load_explicit(&d->xallocs, memory_order_relaxed);
  out->free_count = atomic_load_explicit(&d->xfrees, memory_order_relaxed);
  out->record_count = atomic_load_explicit(&d->xrecords, memory_order_relaxed);
  out->errors = atomic_load_explicit(&d->xerrors, memory_order_relaxed);
  out->check_fills = sa__torch_check_fills(dev);
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

sa_status sa_torch_reset_peak(int dev) {
  if (!valid_device(dev)) return SA_ERR_INVALID_ARGUMENT;
  device *d = &devices[dev];
  atomic_store_explicit(&d->xrequested_peak,
                        atomic_load_explicit(&d->xrequested, memory_order_relaxed),
                        memory_order_relaxed);
  return SA_OK;
}

uint64_t sa_torch_error_count(void) {
  uint64_t n = 0;
  for (int i = 0; i < SA_TORCH_MAX_DEVICES; i++)
    n += atomic_load_explicit(&devices[i].xerrors, memory_order_relaxed);
  return n;
}
