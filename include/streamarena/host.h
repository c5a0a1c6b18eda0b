/* streamarena host simulator: the CUDA driver's semantics emulated on the CPU.
 *
 * The host backend runs the whole allocator without a GPU. Memory it maps is
 * ordinary CPU memory (memfd-backed, really remapped), so callers may read
 * and write it directly. Streams are simulated queues: work enqueued on a
 * SA_HOST_MANUAL stream completes only when the caller advances that stream;
 * on a SA_HOST_AUTO stream it completes as soon as nothing it waits for is
 * pending. Simulated kernels (fill, check) touch memory when they complete,
 * which lets a test run streams in an adversarial order and see any reuse the
 * stream-ordered contract forbids.
 *
 * The simulator is one process-wide set of devices: one by default, more
 * through sa_host_set_device_count or STREAMARENA_HOST_DEVICES. Each has its
 * own memory and its own default stream; streams belong to a device; the
 * thread's current device (sa_host_set_device) plays the current CUDA
 * context; a mapping is accessible to the
 * devices set_access granted it to, and a kernel on a stream of another
 * device does not run (it counts as a violation, as a GPU would fault).
 * All functions are thread-safe.
 */
#ifndef STREAMARENA_HOST_H
#define STREAMARENA_HOST_H

#include <stddef.h>
#include <stdint.h>

#include <streamarena/streamarena.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sa_host_mode_e {
  SA_HOST_AUTO = 0,   /* work completes as soon as its waits are satisfied */
  SA_HOST_MANUAL = 1  /* work completes only through sa_host_stream_step/drain */
} sa_host_mode;

/* Devices. At most SA_HOST_MAX_DEVICES; 1 unless set here or by the
 * environment variable STREAMARENA_HOST_DEVICES (read at the simulator's
 * first use). Lowering the count below a device that still holds chunks or
 * streams fails with SA_ERR_INVALID_ARGUMENT. */
#define SA_HOST_MAX_DEVICES 64
sa_status sa_host_set_device_count(int count);
int sa_host_device_count(void);
/* The calling thread's current device (cudaSetDevice's counterpart, the
 * simulator's current context): streams it creates belong to that device,
 * NULL in the stream functions below is that device's default stream, and
 * sa_malloc_async on the host backend uses that device's default arena.
 * A thread that never set one has no device current, as a CUDA thread
 * before its first runtime call: sa_host_get_device says 0, and NULL here is
 * device 0's default stream (a runtime call would make device 0 current);
 * the library's own driver calls for an arena of device d take NULL as d's
 * default stream, and the arena accepts NULL only while d or no device is
 * current (streamarena.h, on sa_stream). SA_ERR_NO_DEVICE for a device the
 * simulator does not have. */
sa_status sa_host_set_device(int device);
int sa_host_get_device(void);
/* Whether peer access to device's memory may be granted to peer (the answer
 * of cuDeviceCanAccessPeer(peer, device)); every pair may by default. */
sa_status sa_host_set_can_access_peer(int peer, int device, int can);
/* The device whose physical memory backs p (mapped simulator memory), as
 * CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL says; SA_ERR_INVALID_POINTER if none. */
sa_status sa_host_pointer_device(const void *p, int *device);

/* Streams. Each device has a default stream of its own, as each CUDA
 * context has its own legacy stream: separate queues, so work on device 0's
 * is not ordered with work on device 1's. NULL is the default stream of the
 * calling thread's current device (device 0's where none was set). A stream
 * made here belongs to the calling thread's current device. */
sa_status sa_host_stream_create(sa_host_mode mode, sa_stream *out);
/* The device a stream belongs to (NULL: the calling thread's current
 * device, whose default stream NULL is). */
sa_status sa_host_stream_device(sa_stream stream, int *device);
/* Destroying a stream returns at once, as cuStreamDestroy does: work still
 * queued on it stays queued (events recorded on it stay pending, the checker
 * still sees its kernels) and runs when something drives it: a synchronize
 * that depends on it, sa_host_drain_all, the driver's device_synchronize
 * (at once for an AUTO stream whose waits are met). Its handle goes to the next
 * stream created, which is another stream with another id, as CUDA reuses
 * handles; until then a driver call the allocator makes on the destroyed
 * handle counts as a violation (sa_host_counters.order_violations). */
sa_status sa_host_stream_destroy(sa_stream stream);
/* The mode of the default streams, every device's at once (AUTO until
 * changed): a test steps one device's by hand by naming it with NULL while
 * that device is current. */
sa_status sa_host_set_default_stream_mode(sa_host_mode mode);

/* Complete up to n queued operations of stream, in order. Stops early at an
 * operation that waits on an event not yet complete. *done (may be NULL)
 * gets the number completed. */
sa_status sa_host_stream_step(sa_stream stream, size_t n, size_t *done);
/* Complete everything queued on stream, and whatever it waits on. */
sa_status sa_host_stream_drain(sa_stream stream);
/* Complete everything queued on every stream, every device's default
 * stream included. */
sa_status sa_host_drain_all(void);
/* Number of operations queued and not yet complete on stream. */
size_t sa_host_stream_pending(sa_stream stream);

/* Simulated kernels, work of the stream's device. fill writes the 32-bit pattern over [p, p + size)
 * (size a multiple of 4) when the operation completes. check compares
 * [p, p + size) with the pattern when it completes and adds the number of
 * mismatching words to *mismatches (which must stay valid until then). */
sa_status sa_host_fill(sa_stream stream, void *p, size_t size, uint32_t pattern);
sa_status sa_host_check(sa_stream stream, const void *p, size_t size,
                        uint32_t pattern, uint64_t *mismatches);

/* Stream capture, as cuStreamBeginCapture models it: work enqueued on a
 * capturing stream goes into a graph instead of running (the simulator
 * keeps no graph: kernels are dropped, an event recorded there belongs to
 * the capture). The driver's rules, as measured on an H200 with CUDA 13:
 *   - on the capturing stream, an id query or a synchronize fails (in every
 *     mode), and so does a wait for an event recorded outside the capture;
 *   - a query or synchronize of an event recorded in a capture fails, during
 *     the capture and after it (then SA_ERR_DRIVER, as CUDA_ERROR_INVALID_VALUE:
 *     no capture is left to invalidate);
 *   - a host wait or query of anything else (event query or synchronize,
 *     stream synchronize) is a "potentially unsafe" call: it fails while
 *     the calling thread has a capture of its own not begun RELAXED, or
 *     another thread has a GLOBAL one and the calling thread's mode
 *     (sa_host_exchange_capture_mode) is GLOBAL; a RELAXED thread may make
 *     it always;
 *   - the driver's device-wide synchronize fails while any capture is open.
 * Each such failure during a capture is SA_ERR_STREAM_CAPTURING and
 * invalidates the capture it conflicts with, as on CUDA. The default streams
 * cannot be captured. */
typedef enum sa_host_capture_mode_e { /* CUstreamCaptureMode's values */
  SA_HOST_CAPTURE_GLOBAL = 0,
  SA_HOST_CAPTURE_THREAD_LOCAL = 1,
  SA_HOST_CAPTURE_RELAXED = 2
} sa_host_capture_mode;

typedef enum sa_host_capture_status_e { /* CUstreamCaptureStatus's values */
  SA_HOST_CAPTURE_NONE = 0,
  SA_HOST_CAPTURE_ACTIVE = 1,
  SA_HOST_CAPTURE_INVALIDATED = 2
} sa_host_capture_status;

/* Errors: SA_ERR_UNKNOWN_STREAM, SA_ERR_INVALID_ARGUMENT (the default stream,
 * a bad mode, or the stream captures already). */
sa_status sa_host_stream_begin_capture(sa_stream stream, sa_host_capture_mode mode);
/* Ends the capture: SA_OK if it stayed intact, SA_ERR_STREAM_CAPTURING if a
 * conflicting call invalidated it; SA_ERR_INVALID_ARGUMENT if the stream
 * was not capturing. */
sa_status sa_host_stream_end_capture(sa_stream stream);
sa_status sa_host_stream_capture_status(sa_stream stream, sa_host_capture_status *out);
/* Swap the calling thread's capture mode with *mode
 * (cuThreadExchangeStreamCaptureMode); a thread starts in GLOBAL. */
sa_status sa_host_exchange_capture_mode(sa_host_capture_mode *mode);

/* Simulated memory of each device (default 16 GiB; also the environment
 * variable STREAMARENA_HOST_DEVICE_BYTES). Only chunks actually created use
 * memory, and only their touched pages. Takes effect for chunks created
 * afterwards; fails with SA_ERR_INVALID_ARGUMENT below what a device already
 * uses. */
sa_status sa_host_set_device_memory(size_t bytes);

/* The driver functions, for fault injection and call counting. */
typedef enum sa_host_fn_e {
  SA_HOST_FN_VA_RESERVE = 0,
  SA_HOST_FN_VA_RELEASE,
  SA_HOST_FN_CHUNK_CREATE,
  SA_HOST_FN_CHUNK_RELEASE,
  SA_HOST_FN_MAP,
  SA_HOST_FN_UNMAP,
  SA_HOST_FN_SET_ACCESS,
  SA_HOST_FN_EVENT_CREATE,
  SA_HOST_FN_EVENT_DESTROY,
  SA_HOST_FN_EVENT_RECORD,
  SA_HOST_FN_EVENT_QUERY,
  SA_HOST_FN_EVENT_SYNCHRONIZE,
  SA_HOST_FN_STREAM_WAIT_EVENT,
  SA_HOST_FN_STREAM_SYNCHRONIZE,
  SA_HOST_FN_DEVICE_SYNCHRONIZE,
  SA_HOST_FN_STREAM_VALIDATE, /* cuStreamGetCtx on CUDA */
  SA_HOST_FN_STREAM_ID,       /* cuStreamGetId on CUDA */
  SA_HOST_FN_STREAM_QUERY,
  SA_HOST_FN_COUNT
} sa_host_fn;

const char *sa_host_fn_name(sa_host_fn fn);

/* Fail the nth call (1-based, counted from this call) of fn with a driver
 * error; with sticky nonzero, fail every call from the nth on. n = 0 clears
 * the fault for fn. */
sa_status sa_host_fault_inject(sa_host_fn fn, uint64_t nth, int sticky);
/* Clear every fault. */
void sa_host_fault_clear(void);
/* Calls of fn so far (successful or failed). */
uint64_t sa_host_call_count(sa_host_fn fn);
/* Injected failures so far, all functions together. */
uint64_t sa_host_faults_injected(void);

/* What the simulated device holds right now: leak checks compare these with
 * zero after an arena is destroyed. */
typedef struct sa_host_counters_s {
  size_t va_ranges;        /* reserved virtual ranges */
  size_t chunks;           /* physical chunks created and not released */
  size_t chunk_bytes;      /* their bytes */
  size_t mappings;         /* mapped chunk pieces */
  size_t events;           /* events created and not destroyed */
  size_t streams;          /* user streams alive (the default streams excluded) */
  uint64_t order_violations; /* checker findings so far: stream-order violations,
                                kernels on memory they may not touch, driver
                                calls of the library on destroyed streams */
} sa_host_counters;

void sa_host_get_counters(sa_host_counters *out);

/* What the simulated driver did since the process started (never reset:
 * take differences): a run's driver work, countable without a GPU. Bytes
 * count successful calls only. */
typedef struct sa_host_totals_s {
  uint64_t calls[SA_HOST_FN_COUNT]; /* per function, as sa_host_call_count */
  uint64_t bytes_created;           /* chunk_create */
  uint64_t bytes_released;          /* chunk_release */
  uint64_t bytes_mapped;            /* map */
  uint64_t bytes_unmapped;          /* unmap */
  uint64_t bytes_access;            /* set_access */
  /* Chunk mappings the unmap and set_access calls covered: on a GPU these
   * calls cost per chunk in the range, not per call (bench/driver_costs). */
  uint64_t chunks_unmapped;
  uint64_t chunks_access;
} sa_host_totals;

void sa_host_get_totals(sa_host_totals *out);
/* The same, of the calling thread's calls only: what reached it, where
 * another thread (the arena's grower: SA_FLAG_BACKGROUND_GROWTH) made some
 * of the calls. */
void sa_host_get_thread_totals(sa_host_totals *out);

#ifdef __cplusplus
}
#endif
#endif /* STREAMARENA_HOST_H */
