/* What streamarena's framework hooks share: PyTorch's plugin
 * (plugins/torch) and the hooks of the Python array libraries
 * (plugins/python: CuPy, Numba, RMM's Python resource).
 *
 * A framework calls a hook that cannot return a status (a malloc that can
 * only return NULL, a free that returns nothing), so each framework keeps
 * one sa_hook, a static of its plugin, holding per device:
 *   - the bytes the framework asked for, now, at peak and in total, and
 *     counts of its calls, each thread counting its own (sa_hook_thread)
 *     and the statistics adding them up, so that a call writes no line
 *     other threads write;
 *   - failed calls, counted, the first few written to stderr in full.
 * The hooks serve the default arenas as a framework may use them: CUDA
 * memory, never the host simulator standing in for a missing driver
 * (backend auto's fallback), whose CPU addresses the framework's kernels
 * would fault on. They refuse a stream being captured into a CUDA graph,
 * which no hook can follow, and run a call on stream 0 (NULL) with the
 * hook's device current (docs/TORCH.md, docs/ECOSYSTEM.md).
 *
 * An sa_hook keeps no arena: a hook asks for the device's default arena
 * (sa_hook_arena) or for a block's (sa_hook_arena_of) at every call, and
 * the trim and the statistics read the default arena as it is now, which
 * creates none. A plugin exports the whole API, so
 * sa_default_arenas_shutdown may destroy those arenas (an atexit handler)
 * while the framework still frees at interpreter teardown: a kept pointer
 * would then name freed memory. The registry forgets a destroyed arena, so
 * the free of one of its blocks is refused (SA_ERR_INVALID_POINTER,
 * reported), and the next allocation creates a fresh default arena.
 *
 * Calls the public API, the default arenas, the registry (a block's arena),
 * the fast paths for a caller inside the driver's call_on_stream
 * (sa__alloc_on_device, sa__free_on_device) and the driver interface of an
 * arena; called by the plugins only.
 */
#ifndef SA_PLUGINS_COMMON_HOOK_H
#define SA_PLUGINS_COMMON_HOOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <streamarena/streamarena.h>

#define sa_likely(x) __builtin_expect(!!(x), 1)
#define sa_unlikely(x) __builtin_expect(!!(x), 0)

/* Devices a hook serves: ordinals 0 .. SA_HOOK_MAX_DEVICES - 1, the default
 * arenas' range. */
#define SA_HOOK_MAX_DEVICES 64

/* Full messages for a framework's first failures; later ones are counted. */
#define SA_HOOK_REPORT_LIMIT 8

/* The figures of one device that threads share. Counts and byte totals
 * live in each thread's sa_hook_thread instead: a hook's call writes only
 * its own thread's (no atomic read-modify-write on a line every thread
 * writes), and the statistics add them up. */
typedef struct sa_hook_device_s {
  /* Requested bytes as threads published them: never less than what is
   * held, which is this minus the frees threads have not published yet
   * (sa_hook_thread.unpublished). The peak is the most it reached. */
  _Alignas(64) _Atomic int64_t xpublished, xrequested_peak;
  _Atomic uint64_t xrecords, xerrors;
  /* The counts of threads that exited, or that had no sa_hook_thread
   * (hook.c's lock). */
  uint64_t gone_allocs, gone_frees, gone_requested_total, gone_freed_total;
} sa_hook_device;

/* One thread's counts on one device: written by that thread alone, read by
 * the statistics under hook.c's lock. */
typedef struct sa_hook_counts_s {
  _Atomic uint64_t xallocs, xfrees;
  _Atomic uint64_t xrequested_total, xfreed_total; /* bytes, ever */
  int64_t unpublished; /* bytes freed, not yet taken off xpublished (<= 0) */
} sa_hook_counts;

/* A thread's counts of one hook, all devices: made at its first counted
 * call, folded into the hook's at its exit. */
typedef struct sa_hook_thread_s {
  struct sa_hook_s *hook;
  struct sa_hook_thread_s *next, *prev; /* the hook's threads (hook.c's lock) */
  struct sa_hook_thread_s *next_own;    /* the thread's other hooks' */
  sa_hook_counts counts[SA_HOOK_MAX_DEVICES];
} sa_hook_thread;

typedef struct sa_hook_s {
  const char *name;         /* in messages: "streamarena <name>: ..." */
  const char *capture_hint; /* what to do instead of capturing, in the message */
  sa_hook_device devices[SA_HOOK_MAX_DEVICES];
  sa_hook_thread *threads; /* hook.c's lock */
  _Atomic bool xstarted;   /* an allocation got an arena */
  _Atomic uint64_t xreported;
} sa_hook;

/* A hook's figures of one device (zero before its first use). */
typedef struct sa_hook_stats_s {
  /* Kept by the hook: what the framework holds, in bytes it asked for. */
  uint64_t requested_bytes, requested_bytes_peak;
  uint64_t requested_bytes_total, freed_bytes_total;
  uint64_t alloc_count, free_count, record_count;
  uint64_t errors;
  /* From sa_get_stats of the device's arena. */
  uint64_t reserved_bytes, reserved_bytes_peak;
  uint64_t live_bytes, live_bytes_peak;
  uint64_t cached_bytes;
  uint64_t oom_events;
  double fast_path_ratio;
} sa_hook_stats;

static inline bool sa_hook_valid_device(int dev) { return dev >= 0 && dev < SA_HOOK_MAX_DEVICES; }

/* The default arena of dev as sa_default_arena gives it (created at the
 * first call, and again after sa_default_arenas_shutdown); never kept.
 * SA_ERR_NO_DEVICE (with the driver error set to say why) where it would be
 * the simulator standing in for CUDA. SA_ERR_INVALID_ARGUMENT for a device
 * out of range. */
sa_status sa_hook_arena(sa_hook *h, int dev, sa_arena **out);

/* The live arena holding p, or NULL (a destroyed arena's block, or memory
 * not ours): a free's arena, which creates none. */
sa_arena *sa_hook_arena_of(const void *p);

/* Whether any allocation through h got an arena yet. */
bool sa_hook_started(sa_hook *h);

/* SA_ERR_STREAM_CAPTURING when stream is being captured into a CUDA graph:
 * memory allocated or freed during a capture must stay reserved for the
 * graph's launches, which a hook cannot follow. SA_OK otherwise (also when
 * the driver cannot tell). */
sa_status sa_hook_refuse_capturing(sa_arena *a, sa_stream stream);

/* The device whose arena holds p, or -1 when p is no block of a live arena. */
int sa_hook_device_of(const void *p);

/* sa_alloc(a, out, size, stream) and sa_free(ptr, stream) of a hook told its
 * device, refused with SA_ERR_STREAM_CAPTURING (nothing done) where stream
 * is being captured (sa_hook_refuse_capturing's rule). A framework's stream
 * 0 of device dev is dev's legacy stream, but its hooks may run with
 * another device current (a deleter runs where the array dies), and the
 * library takes NULL as the legacy stream of the current device, refusing
 * another device's (streamarena.h, on sa_stream). So on NULL (or
 * CU_STREAM_LEGACY) the call runs with a's device made current, and the
 * caller's device is put back: the driver's call_on_stream does that and
 * the capture check in one. Where only putting it back failed, the call
 * did its work: that is reported under what on dev, and the call's own
 * status returned. The free's a is the block's arena (sa_hook_arena_of);
 * with NULL it is a plain sa_free, which refuses the pointer. */
sa_status sa_hook_alloc(sa_hook *h, int dev, const char *what, sa_arena *a, void **out,
                        size_t size, sa_stream stream);
sa_status sa_hook_free(sa_hook *h, int dev, const char *what, sa_arena *a, void *ptr,
                       size_t size, sa_stream stream);

/* Count an allocation, a free or a record of size bytes on dev. An
 * allocation and a free touch only the calling thread's counts, except
 * where the allocation may make a new peak: where the thread's unpublished
 * frees do not cover it. A free is published where the thread's
 * unpublished frees would pass SA_HOOK_UNPUBLISHED_BYTES plus its own
 * size: so a loop of one size, however large, publishes nothing after its
 * first allocation. The peak is exact for one thread, and with several may
 * overstate the true one by that much per other thread (its last free's
 * size on top), never understate it. (A thread whose counts could not be made, for lack of
 * memory, counts under hook.c's lock instead.) */
void sa_hook_allocated(sa_hook *h, int dev, size_t size);
void sa_hook_freed(sa_hook *h, int dev, size_t size);
void sa_hook_recorded(sa_hook *h, int dev);

/* A thread's frees not yet taken off the published requested bytes, at
 * most, beside its last free's size (See sa_hook_allocated). */
#define SA_HOOK_UNPUBLISHED_BYTES ((int64_t)1 << 20)
/* The lowest unpublished balance a count of delta bytes (a free: delta < 0)
 * may leave. */
static inline int64_t sa_hook_unpublished_floor(int64_t delta) {
  return -SA_HOOK_UNPUBLISHED_BYTES + (delta < 0 ? delta : 0);
}

/* Count a failed call on dev (on 0 when dev is out of range) and, for the
 * first SA_HOOK_REPORT_LIMIT, write "streamarena <name>: what(ptr, size
 * bytes, device dev): <status>" with the driver's error and a hint. */
void sa_hook_report(sa_hook *h, int dev, const char *what, const void *ptr, size_t size,
                    sa_status st);

/* sa_trim(arena, 0) of every device's default arena as it is now (none is
 * created); failures are reported. */
void sa_hook_trim(sa_hook *h);

/* The statistics of dev into *out, the arena's from its default arena as it
 * is now (zero where there is none; none is created).
 * SA_ERR_INVALID_ARGUMENT for a device out of range or NULL; sa_get_stats's
 * error. */
sa_status sa_hook_get_stats(sa_hook *h, int dev, sa_hook_stats *out);

/* The requested-bytes peak starts again from what is held now (with
 * other threads' unpublished frees: See sa_hook_allocated). */
sa_status sa_hook_reset_peak(sa_hook *h, int dev);

/* Failed calls so far, all devices together. */
uint64_t sa_hook_error_count(sa_hook *h);

#endif /* SA_PLUGINS_COMMON_HOOK_H */
