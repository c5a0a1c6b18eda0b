/* The driver interface: the only way the allocator touches a device.
 *
 * Owns nothing itself; each backend implements sa_driver_ops:
 *   cuda.c  libcuda.so.1: the ops, with cuda_context.c (contexts, stream
 *           handles, capture) and cuda_loader.c (dlopen + cuGetProcAddress)
 *   host.c  the CPU simulator (src/sim/, include/streamarena/host.h)
 * driver.c picks a backend (sa_driver_open) and keeps the per-thread last
 * driver error. Called by the allocator (src/); calls nothing above it.
 *
 * Every operation returns SA_OK or a status; a failing driver call returns
 * SA_ERR_DRIVER after sa_driver_set_error() recorded the backend's code.
 * All operations are thread-safe. Virtual addresses are uintptr_t; sizes and
 * addresses passed to VMM operations are multiples of the granularity.
 */
#ifndef SA_DRIVER_H
#define SA_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <streamarena/streamarena.h>

typedef uint64_t sa_chunk_handle; /* a physical chunk (CUmemGenericAllocationHandle) */
typedef void *sa_event;           /* a CUevent, or a simulator event */

typedef struct sa_driver_s sa_driver;

typedef struct sa_driver_ops_s {
  const char *name; /* "cuda" or "host" */
  void (*close)(sa_driver *drv);

  /* Device queries. */
  sa_status (*total_memory)(sa_driver *drv, size_t *bytes);
  sa_status (*granularity)(sa_driver *drv, size_t *bytes); /* minimum chunk/map unit */

  /* Virtual memory management. */
  sa_status (*va_reserve)(sa_driver *drv, size_t size, size_t alignment, uintptr_t *out);
  sa_status (*va_release)(sa_driver *drv, uintptr_t va, size_t size);
  sa_status (*chunk_create)(sa_driver *drv, size_t size, sa_chunk_handle *out);
  sa_status (*chunk_release)(sa_driver *drv, sa_chunk_handle chunk);
  /* Map the whole chunk (of exactly size bytes) at va, inside a reserved range.
   * Not accessible until set_access. */
  sa_status (*map)(sa_driver *drv, uintptr_t va, size_t size, sa_chunk_handle chunk);
  /* Unmap [va, va + size), which may cover several mapped chunks. Does NOT wait
   * for queued work (as on the real device). */
  sa_status (*unmap)(sa_driver *drv, uintptr_t va, size_t size);
  /* Make [va, va + size) readable and writable by the device and by the
   * peers set_peer_access named (host: also by the CPU). */
  sa_status (*set_access)(sa_driver *drv, uintptr_t va, size_t size);
  /* From now on set_access also grants each device of peers (bit i: device
   * i; SA_PEER_ACCESS_ALL: every device the backend has; the driver's own
   * bit is ignored). Called before anything is mapped. Errors, with the
   * device named in sa_last_driver_error: SA_ERR_NO_DEVICE (no such device),
   * SA_ERR_NOT_SUPPORTED (it cannot access this device's memory). */
  sa_status (*set_peer_access)(sa_driver *drv, uint64_t peers);

  /* Streams and events. An event never recorded counts as complete.
   * Stream capture: no op enqueues on or asks about a stream that is being
   * captured into a graph (the allocator cannot follow a graph's launches,
   * and the driver would invalidate the capture): event_record,
   * stream_wait_event, stream_synchronize, stream_validate and stream_id
   * return SA_ERR_STREAM_CAPTURING for it, with nothing done (cuda.c: also
   * for the legacy stream while a blocking stream is captured, except
   * stream_id, which asks the driver nothing for it). Host waits and
   * queries run in the relaxed capture mode, so they do not invalidate a
   * capture another thread runs; device_synchronize cannot avoid that, and
   * returns SA_ERR_STREAM_CAPTURING. */
  sa_status (*event_create)(sa_driver *drv, sa_event *out);
  sa_status (*event_destroy)(sa_driver *drv, sa_event event);
  sa_status (*event_record)(sa_driver *drv, sa_event event, sa_stream stream);
  sa_status (*event_query)(sa_driver *drv, sa_event event); /* SA_OK or SA_ERR_NOT_READY */
  sa_status (*event_synchronize)(sa_driver *drv, sa_event event);
  sa_status (*stream_wait_event)(sa_driver *drv, sa_stream stream, sa_event event);
  sa_status (*stream_synchronize)(sa_driver *drv, sa_stream stream);
  /* SA_OK when all work enqueued on stream so far completed, else
   * SA_ERR_NOT_READY (an answer, not a failure); SA_ERR_STREAM_CAPTURING
   * while it is captured. Only in a call that names stream. */
  sa_status (*stream_query)(sa_driver *drv, sa_stream stream);
  /* SA_ERR_STREAM_CAPTURING when stream is being captured into a graph
   * (the check the ops above make first), else SA_OK; a capture is not
   * disturbed by asking. */
  sa_status (*stream_capture_check)(sa_driver *drv, sa_stream stream);
  /* SA_OK when stream is usable on this device, else SA_ERR_UNKNOWN_STREAM
   * (a stream of another device is too, named so in sa_last_driver_error;
   * so is a legacy stream legacy_stream_check refuses). */
  sa_status (*stream_validate)(sa_driver *drv, sa_stream stream);
  /* A legacy handle (sa_driver_stream_is_legacy) names the legacy stream of
   * the calling thread's current context: SA_OK when that is this device's
   * (its primary context is current, or no context is, and the ops make
   * this device's current for their calls on it), or for any other handle;
   * else SA_ERR_UNKNOWN_STREAM, with both devices named in
   * sa_last_driver_error. The thread may switch contexts between calls, so
   * the arena asks on every call that names one: it reads only the
   * thread's current context, and the host backend neither counts it nor
   * injects faults. */
  sa_status (*legacy_stream_check)(sa_driver *drv, sa_stream stream);
  /* The driver's id of a valid stream (cuStreamGetId): unique for the
   * process, so a new stream that received a destroyed one's handle has
   * another id. The implicit streams have fixed ids. */
  sa_status (*stream_id)(sa_driver *drv, sa_stream stream, uint64_t *id);
  /* Wait for all work of the device's context, on every stream, destroyed
   * ones included (cuCtxSynchronize): the one wait that names no stream. */
  sa_status (*device_synchronize)(sa_driver *drv);
  /* Run fn(arg), a call of the library that names stream (a framework
   * hook's sa_alloc or sa_free), where it may act on stream: not at all
   * while stream is being captured into a graph (SA_ERR_STREAM_CAPTURING,
   * fn not run: stream_capture_check's answer; any other answer runs fn,
   * which validates the stream itself); and on a legacy handle with this
   * device's primary context current on the calling thread (host: the
   * simulator's current device), what was current (none included) made
   * current again after, for a caller that knows which device a legacy
   * handle means while another may be current. fn's status, or the
   * switch's failure (fn not run), or the restore's (after fn's SA_OK).
   * Where this device's context is current already, the legacy handle
   * costs one read of it beside the capture query. Inside fn, the driver's
   * own checks of stream (capture, and which device a legacy handle means)
   * answer as this call found, without asking again. */
  sa_status (*call_on_stream)(sa_driver *drv, sa_stream stream, sa_status (*fn)(void *arg),
                              void *arg);
  /* Run fn(arg) with the calling thread's capture mode relaxed
   * (cuThreadExchangeStreamCaptureMode), then restore it: for a graph
   * pool's growth during a capture, whose chunk creation and mapping a
   * capture in the global mode could refuse as potentially unsafe calls
   * (PyTorch makes its cudaMalloc so during a capture). fn's status. */
  sa_status (*call_relaxed)(sa_driver *drv, sa_status (*fn)(void *arg), void *arg);

  /* Optional (NULL when the backend cannot check): the stream-order checker.
   * Called when [p, p + size) is handed to work on stream; returns
   * SA_ERR_STREAM_ORDER, after describing the violation on stderr, when
   * unfinished work on another stream touches the range and stream has no
   * wait edge to it. */
  sa_status (*check_handout)(sa_driver *drv, uintptr_t p, size_t size, sa_stream stream);

  /* Test and tool support; the allocator itself calls only stream_create
   * and stream_destroy, for the graph pools' own stream (pool_block.c). */
  sa_status (*stream_create)(sa_driver *drv, sa_stream *out);
  sa_status (*stream_destroy)(sa_driver *drv, sa_stream stream);
  /* Enqueue: write count 32-bit words of value at dst (cuMemsetD32Async). */
  sa_status (*memset32_async)(sa_driver *drv, uintptr_t dst, uint32_t value, size_t count,
                              sa_stream stream);
  /* Synchronous copy of device memory to the host; the caller orders it
   * after the work that wrote src (stream_synchronize). */
  sa_status (*copy_to_host)(sa_driver *drv, void *dst, uintptr_t src, size_t size);
  /* Capture stream into a graph (cuStreamBeginCapture; mode is a
   * CUstreamCaptureMode value, as sa_host_capture_mode), and end it,
   * dropping the graph: SA_OK if the capture stayed intact,
   * SA_ERR_STREAM_CAPTURING if a conflicting call invalidated it. */
  sa_status (*stream_begin_capture)(sa_driver *drv, sa_stream stream, int mode);
  sa_status (*stream_end_capture)(sa_driver *drv, sa_stream stream);
} sa_driver_ops;

/* NULL, and CU_STREAM_LEGACY (1) on CUDA: the legacy stream of the calling
 * thread's current context (legacy_stream_check). No stream handle of
 * either backend is that small otherwise, so the arena tells them apart
 * without a call. */
static inline bool sa_driver_stream_is_legacy(sa_stream s) { return (uintptr_t)s <= 1; }

struct sa_driver_s {
  const sa_driver_ops *ops;
  sa_backend backend; /* resolved: SA_BACKEND_CUDA or SA_BACKEND_HOST */
  int device;
  char why[128]; /* why this backend (sa_arena_backend_reason); set by sa_driver_open */
  bool stand_in; /* the simulator, because backend auto found no CUDA */
};

/* Open a driver for device. SA_BACKEND_AUTO: the environment variable
 * STREAMARENA_BACKEND (auto|cuda|host) decides if set, otherwise CUDA when
 * libcuda loads and the device exists, otherwise host; drv->why says which.
 * Errors: SA_ERR_NO_DEVICE, SA_ERR_BAD_CONFIG (STREAMARENA_BACKEND has
 * another value: a message on stderr, once), SA_ERR_INVALID_ARGUMENT,
 * SA_ERR_DRIVER. */
sa_status sa_driver_open(sa_backend backend, int device, sa_driver **out);
static inline void sa_driver_close(sa_driver *drv) {
  if (drv != NULL) drv->ops->close(drv);
}

/* Backend constructors (cuda.c, host.c). */
sa_status sa_driver_cuda_open(int device, sa_driver **out);
sa_status sa_driver_host_open(int device, sa_driver **out);

/* Number of CUDA devices (0 with SA_ERR_NO_DEVICE where libcuda is missing). */
sa_status sa_driver_cuda_device_count(int *count);
/* The calling thread's current CUDA device; SA_ERR_NO_DEVICE if none. */
sa_status sa_driver_cuda_current_device(int *device);
/* The calling thread's current device: the CUDA one when a CUDA context is
 * current, else the host simulator's (sa_host_set_device; 0 by default). */
int sa_driver_current_device(void);

/* Per-thread last driver error (driver.c). name must be a static string. */
void sa_driver_set_error(int code, const char *name);
/* The same with a formatted description, kept in a per-thread buffer until
 * the thread's next driver error. */
void sa_driver_set_errorf(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* SA_DRIVER_H */
