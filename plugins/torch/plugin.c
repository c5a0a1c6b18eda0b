/* The PyTorch plugin: PyTorch's pluggable-allocator hooks over the default
 * arenas (streamarena_torch.h lists them and what calls them).
 *
 * The per-device bookkeeping PyTorch reports (bytes requested, counts,
 * failures) is the framework hooks' shared one (plugins/common/hook.h);
 * this file adds what is PyTorch's own: record_stream, the memory fraction
 * and the check mode (check.c). Called by PyTorch through function
 * pointers.
 *
 * It keeps no arena of its own (hook.h says why): a hook asks for the
 * device's default arena or for a block's at every call. So after
 * sa_default_arenas_shutdown, which the plugin exports (an atexit handler
 * may call it while PyTorch still frees tensors at interpreter teardown),
 * the free of a destroyed arena's block is refused and reported, and the
 * next allocation creates a fresh default arena.
 *
 * PyTorch passes the allocation's stream to the free hook, so a free is
 * always on the block's own stream: its reuse there is ordered by the stream
 * and elsewhere waits for an event, and work on other streams is covered only
 * by record_stream, exactly the rule of PyTorch's caching allocator. The
 * free hook's size is the allocation's, which keeps the byte count exact
 * without a lookup. Stream 0 is the legacy stream of the hook's device,
 * whatever device is current when PyTorch calls (sa_hook_alloc,
 * sa_hook_free).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "plugins/torch/plugin.h"

sa_hook sa__torch_hook = {
    .name = "torch",
    .capture_hint = "capture CUDA graphs with PyTorch's own allocator (docs/TORCH.md)",
};
static _Atomic int xwarned_fraction;

/* torch.cuda.graph captures through this allocator too, but memory used by
 * a graph must stay reserved for its replays, which PyTorch's own graph
 * pools do and streamarena cannot: a block allocated or freed during the
 * capture would go to other tensors while the graph still writes it. So
 * both hooks refuse a capturing stream (sa_hook_alloc and sa_hook_free
 * ask the driver; See Note [Capture checks] for the cost), and the
 * message says to capture with PyTorch's own allocator. */
void *sa_torch_malloc(size_t size, int dev, sa_stream stream) {
  sa_arena *a;
  void *p = NULL;
  sa_status st = sa_hook_arena(&sa__torch_hook, dev, &a);
  if (st == SA_OK) st = sa_hook_alloc(&sa__torch_hook, dev, "malloc", a, &p, size, stream);
  if (sa_unlikely(st != SA_OK)) {
    sa_hook_report(&sa__torch_hook, dev, "malloc", NULL, size, st);
    return NULL;
  }
  /* Size 0 is NULL and nothing allocated: PyTorch never frees a NULL data
   * pointer, so counting it would leave the live count off for good. */
  if (p == NULL) return NULL;
  sa_hook_allocated(&sa__torch_hook, dev, size);
  return p;
}

void sa_torch_free(void *ptr, size_t size, int dev, sa_stream stream) {
  if (ptr == NULL) return;
  int at = sa_hook_valid_device(dev) ? dev : 0;
  /* The block's arena: a free creates none. NULL for a pointer of no live
   * arena (a destroyed one's, or not ours), which sa_free refuses. */
  sa_arena *a = sa_hook_arena_of(ptr);
  sa_status fill = sa__torch_check_fill(at, ptr, size, stream);
  /* Freed whether the fill worked or not, on NULL with the block's device
   * (its arena's, the hook's) current; a capturing stream's block is kept
   * (the graph may use it), by the fill and the free alike. */
  sa_status st = fill == SA_ERR_STREAM_CAPTURING
                     ? fill
                     : sa_hook_free(&sa__torch_hook, at, "free", a, ptr, size, stream);
  if (sa_unlikely(st != SA_OK)) {
    /* One failed hook: the fill's failure was the same. */
    sa_hook_report(&sa__torch_hook, at, "free", ptr, size, st);
    return;
  }
  if (sa_unlikely(fill != SA_OK))
    sa_hook_report(&sa__torch_hook, at, "check fill", ptr, size, fill);
  sa_hook_freed(&sa__torch_hook, at, size);
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
  int dev = sa_hook_device_of(ptr);
  if (st != SA_OK) {
    sa_hook_report(&sa__torch_hook, dev, "record_stream", ptr, 0, st);
    return;
  }
  sa_hook_recorded(&sa__torch_hook, dev);
}

void sa_torch_empty_cache(void) { sa_hook_trim(&sa__torch_hook); }

void sa_torch_set_memory_fraction(double fraction, int dev) {
  if (atomic_exchange(&xwarned_fraction, 1) == 0)
    fprintf(stderr,
            "streamarena torch: set_per_process_memory_fraction(%g, device %d) is not "
            "supported; cap the arena with max_physical in STREAMARENA_CONF\n",
            fraction, dev);
}

sa_status sa_torch_get_stats(int dev, sa_torch_stats *out, size_t size) {
  if (out == NULL || size != sizeof *out) return SA_ERR_INVALID_ARGUMENT;
  sa_hook_stats s;
  sa_status st = sa_hook_get_stats(&sa__torch_hook, dev, &s);
  if (st == SA_ERR_INVALID_ARGUMENT) return st;
  *out = (sa_torch_stats){
      .requested_bytes = s.requested_bytes,
      .requested_bytes_peak = s.requested_bytes_peak,
      .requested_bytes_total = s.requested_bytes_total,
      .freed_bytes_total = s.freed_bytes_total,
      .alloc_count = s.alloc_count,
      .free_count = s.free_count,
      .record_count = s.record_count,
      .check_fills = sa__torch_check_fills(dev),
      .errors = s.errors,
      .reserved_bytes = s.reserved_bytes,
      .reserved_bytes_peak = s.reserved_bytes_peak,
      .live_bytes = s.live_bytes,
      .live_bytes_peak = s.live_bytes_peak,
      .cached_bytes = s.cached_bytes,
      .oom_events = s.oom_events,
      .fast_path_ratio = s.fast_path_ratio,
  };
  return st;
}

sa_status sa_torch_reset_peak(int dev) { return sa_hook_reset_peak(&sa__torch_hook, dev); }

uint64_t sa_torch_error_count(void) { return sa_hook_error_count(&sa__torch_hook); }
