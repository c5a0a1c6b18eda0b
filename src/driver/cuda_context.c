/* The CUDA backend's contexts, stream handles and stream capture: the rules
 * every op of cuda.c follows before it calls libcuda.
 *
 * Owns no state: the driver object (cuda_context.h) belongs to cuda.c.
 * Calls the loader's table (cuda_loader.h) and driver.c's error record;
 * called by cuda.c's ops, three of which (legacy_stream_check,
 * stream_validate, call_on_stream) are defined here.
 *
 * Contexts. A driver works in its device's primary context, the one the CUDA
 * runtime uses, so memory, events and the NULL stream are shared with
 * runtime code. Calls that act on "the current context" (creating chunks and
 * events, VMM calls, copies, and anything on the NULL, legacy or per-thread
 * stream) first read the calling thread's current context: cuCtxGetCurrent
 * is a thread-local read inside the driver, and unlike a cache of our own it
 * cannot go stale when the user calls cuCtxSetCurrent or cudaSetDevice.
 *   - our primary context is current: nothing to do (the common case);
 *   - no context is current: ours is made current for the call and popped
 *     again (left current, it would switch the thread's device to ours:
 *     the runtime's first call on a thread makes the thread's own device
 *     current, device 0 unless it chose another);
 *   - the user has another context current (another device, or a context of
 *     their own): ours is made current for the call and theirs restored.
 * Calls on an explicit stream or event handle need no current context
 * (the handle names it) and skip the check.
 * The legacy stream (NULL, CU_STREAM_LEGACY) is the exception to the last
 * case: it names the current context's legacy stream, where the user's work
 * on "stream 0" goes, and with another context current that is not ours.
 * Used in ours, it would order a free after the wrong stream. So
 * stream_validate and legacy_stream_check accept it only while our primary
 * context, or none, is current, and the arena asks at every call that
 * names it (streamarena.h, on sa_stream). With none current, it is our
 * device's legacy stream for the call; the runtime's first call on that
 * thread would make device 0 current, and then it is device 0's.
 */
#include "cuda_context.h"

#include <cuda.h>

#include "cuda_loader.h"
#include "driver.h"

/* ------------------------------------------------------------------------
 * Contexts
 * ---------------------------------------------------------------------- */

/* Make the primary context current for one call; *saved says what to put
 * back. A thread that had no context gets none back: leaving ours current
 * would switch its device (what cudaMalloc, kernel launches and
 * sa_malloc_async use) to this arena's for good. */
sa_status sa_cuda_ctx_enter(cuda_driver *cd, sa_cuda_ctx_saved *saved) {
  CUcontext cur = NULL;
  saved->restore = 0;
  saved->ctx = NULL;
  CU_CHECK(sa_cu.CtxGetCurrent(&cur));
  if (cur == cd->ctx) return SA_OK;
  CU_CHECK(sa_cu.CtxSetCurrent(cd->ctx));
  saved->restore = 1;
  saved->ctx = cur; /* NULL: cuCtxSetCurrent(NULL) pops ours again */
  return SA_OK;
}

/* Restore what sa_cuda_ctx_enter replaced; returns st, or the restore's failure
 * when the call itself succeeded. */
sa_status sa_cuda_ctx_leave(sa_cuda_ctx_saved saved, sa_status st) {
  if (!saved.restore) return st;
  CUresult r = sa_cu.CtxSetCurrent(saved.ctx);
  if (r != CUDA_SUCCESS && st == SA_OK) return sa_cu_fail(r);
  return st;
}

/* ------------------------------------------------------------------------
 * Stream capture
 * ---------------------------------------------------------------------- */

/* The answers of a call on a stream handle the driver does not take as a
 * stream of a live context: SA_ERR_UNKNOWN_STREAM to the caller. (A handle
 * of a stream destroyed and not handed out again is freed driver state:
 * cuStreamGetCtx, cuStreamIsCapturing, cuStreamGetId and cuEventRecord on
 * one each crashed on the H200, driver 580.) */
static bool names_no_stream(CUresult r) {
  return r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_INVALID_VALUE ||
         r == CUDA_ERROR_INVALID_CONTEXT || r == CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

/* The capture answer of stream in the context current now (nothing made
 * current): sa_cuda_refused_while_capturing's, without its switch. */
static sa_status capture_answer(sa_stream stream) {
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = sa_cu.StreamIsCapturing((CUstream)stream, &cs);
  if (names_no_stream(r)) {
    (void)sa_cu_fail(r);
    return SA_ERR_UNKNOWN_STREAM;
  }
  if (r != CUDA_SUCCESS) return sa_cu_fail(r); /* _IMPLICIT: SA_ERR_STREAM_CAPTURING */
  if (cs == CU_STREAM_CAPTURE_STATUS_NONE) return SA_OK;
  sa_driver_set_error(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                      "the stream is being captured into a graph");
  return SA_ERR_STREAM_CAPTURING;
}

/* The stream that call_on_stream found usable, for the rest of its fn: not
 * being captured, and, if legacy, meaning this driver's device (its context
 * made current for fn). The library's own checks of that stream inside fn
 * (the slow paths' legacy_stream_check, a lazy mark's capture check) would
 * only ask the driver again what it answered a moment ago, on the same
 * thread: a large pair through a hook made 8 driver calls instead of 4.
 * Nothing fn calls can change the answers that matter: the hook chose the
 * device that a legacy handle means, whatever a callback makes current, and
 * a capture that began meanwhile on another thread would have raced the
 * hook's own check all the same. */
typedef struct checked_s {
  const cuda_driver *cd;
  sa_stream stream;
} checked_stream;

/* Initial-exec, as the thread caches' (small/thread_cache.h): read at each
 * check inside a hook's call, which in a shared library would otherwise
 * call __tls_get_addr each time (See Note [Initial-exec thread-local]).
 * 16 bytes of glibc's static TLS surplus where the library is dlopened. */
static _Thread_local checked_stream tl_checked __attribute__((tls_model("initial-exec")));

static bool checked_already(const cuda_driver *cd, sa_stream stream) {
  return tl_checked.cd == cd && tl_checked.stream == stream;
}

/* fn(arg) with stream known usable (tl_checked); nests. */
static sa_status call_checked(const cuda_driver *cd, sa_stream stream,
                              sa_status (*fn)(void *arg), void *arg) {
  checked_stream outer = tl_checked;
  tl_checked = (checked_stream){cd, stream};
  sa_status st = fn(arg);
  tl_checked = outer;
  return st;
}

/* Stream capture. Work enqueued on a capturing stream goes into the user's
 * graph and runs at its launches, which the allocator cannot follow; and
 * the driver refuses an id query, a synchronize, or a wait for an outside
 * event on it, invalidating the user's capture. So no op enqueues on or
 * asks about a capturing stream: SA_ERR_STREAM_CAPTURING, nothing changed,
 * the capture intact (cuStreamIsCapturing is cheap: See Note [Capture
 * checks]). The legacy
 * stream is never captured, but work on it while a blocking stream is
 * captured would join it: cuStreamIsCapturing says
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT then, without harm to the capture
 * (measured), and it is refused the same way. */
sa_status sa_cuda_refused_while_capturing(cuda_driver *cd, sa_stream stream) {
  if ((CUstream)stream == CU_STREAM_PER_THREAD) return SA_OK; /* refused as unknown */
  if (checked_already(cd, stream)) return SA_OK;
  if (!stream_is_implicit(stream)) return capture_answer(stream);
  sa_cuda_ctx_saved saved;
  sa_status st = sa_cuda_ctx_enter(cd, &saved);
  if (st != SA_OK) return st;
  sa_status answer = capture_answer(stream);
  st = sa_cuda_ctx_leave(saved, SA_OK);
  return st != SA_OK ? st : answer;
}

/* The op call_on_stream (driver.h): on a legacy handle the capture query
 * runs inside the switch fn needs anyway, so where ours is current the
 * whole call costs one cuCtxGetCurrent and one cuStreamIsCapturing beside
 * fn's own. */
sa_status sa_cuda_call_on_stream(sa_driver *d, sa_stream stream, sa_status (*fn)(void *arg),
                                 void *arg) {
  cuda_driver *cd = as_cuda(d);
  sa_status answer;
  if (!sa_driver_stream_is_legacy(stream)) {
    answer = sa_cuda_refused_while_capturing(cd, stream);
    if (answer == SA_ERR_STREAM_CAPTURING) return answer;
    return answer == SA_OK ? call_checked(cd, stream, fn, arg) : fn(arg);
  }
  sa_cuda_ctx_saved saved;
  sa_status st = sa_cuda_ctx_enter(cd, &saved);
  if (st != SA_OK) return st;
  answer = capture_answer(stream);
  if (answer == SA_ERR_STREAM_CAPTURING)
    st = answer;
  else
    st = answer == SA_OK ? call_checked(cd, stream, fn, arg) : fn(arg);
  return sa_cuda_ctx_leave(saved, st);
}

/* Host waits and queries are "potentially unsafe" during a capture in the
 * global mode on any thread, or in another mode on this one: made in the
 * relaxed mode, they neither fail nor invalidate the user's capture (the
 * mode exchange is cheap: See Note [Capture checks]). */
CUstreamCaptureMode sa_cuda_relaxed_begin(void) {
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (sa_cu.ThreadExchangeStreamCaptureMode(&m) != CUDA_SUCCESS)
    return CU_STREAM_CAPTURE_MODE_RELAXED; /* unchanged: nothing to restore */
  return m;
}

void sa_cuda_relaxed_end(CUstreamCaptureMode m) {
  if (m != CU_STREAM_CAPTURE_MODE_RELAXED) (void)sa_cu.ThreadExchangeStreamCaptureMode(&m);
}

/* ------------------------------------------------------------------------
 * Which streams a driver takes
 * ---------------------------------------------------------------------- */

/* Why a stream of context ctx is not ours, for sa_last_driver_error: it
 * belongs to another device, or to another context of ours. An error path
 * only: it pushes ctx to ask for its device. */
static const char *stream_owner(CUcontext ctx, CUdevice ours) {
  CUdevice dev = ours;
  CUcontext popped = NULL;
  if (sa_cu.CtxPushCurrent(ctx) != CUDA_SUCCESS) return "stream of another context";
  CUresult r = sa_cu.CtxGetDevice(&dev);
  if (sa_cu.CtxPopCurrent(&popped) != CUDA_SUCCESS || r != CUDA_SUCCESS)
    return "stream of another context";
  return dev != ours ? "stream of another device" : "stream of another context on this device";
}

/* NULL and CU_STREAM_LEGACY with another context current: that context's
 * legacy stream, not ours (the top of this file); a thread-local read when
 * ours is current. */
sa_status sa_cuda_legacy_stream_check(sa_driver *d, sa_stream stream) {
  if (stream != NULL && (CUstream)stream != CU_STREAM_LEGACY) return SA_OK;
  cuda_driver *cd = as_cuda(d);
  if (checked_already(cd, stream)) return SA_OK;
  CUcontext cur = NULL;
  CU_CHECK(sa_cu.CtxGetCurrent(&cur));
  if (cur == NULL || cur == cd->ctx) return SA_OK;
  CUdevice dev = cd->dev;
  CU_CHECK(sa_cu.CtxGetDevice(&dev)); /* the current context's */
  if (dev != cd->dev) {
    sa_driver_set_errorf(CUDA_ERROR_INVALID_CONTEXT,
                         "NULL stream of another device: it names the legacy stream of device "
                         "%d, current on this thread, not device %d's; pass a stream of device "
                         "%d or make device %d current",
                         (int)dev, d->device, d->device, d->device);
  } else {
    sa_driver_set_errorf(CUDA_ERROR_INVALID_CONTEXT,
                         "NULL stream of another context on this device: it names the legacy "
                         "stream of a context of device %d that is not its primary one; pass a "
                         "stream of the primary context or make that current",
                         d->device);
  }
  return SA_ERR_UNKNOWN_STREAM;
}

sa_status sa_cuda_stream_validate(sa_driver *d, sa_stream stream) {
  /* One handle, a different stream on each thread: the allocator keys a
   * stream by handle and id, and would hand what one thread freed on its
   * per-thread stream to another thread's per-thread stream at once, with
   * no wait (and record and query its events on whichever thread calls). */
  if ((CUstream)stream == CU_STREAM_PER_THREAD) {
    sa_driver_set_error(CUDA_ERROR_INVALID_HANDLE,
                        "CU_STREAM_PER_THREAD is another stream on each thread: not supported");
    return SA_ERR_UNKNOWN_STREAM;
  }
  sa_status st = sa_cuda_legacy_stream_check(d, stream);
  if (st == SA_OK) st = sa_cuda_refused_while_capturing(as_cuda(d), stream);
  if (st != SA_OK) return st;
  if (stream_is_implicit(stream)) return SA_OK; /* resolved in our context */
  CUcontext ctx = NULL;
  CUresult r = sa_cu.StreamGetCtx((CUstream)stream, &ctx);
  if (names_no_stream(r)) {
    (void)sa_cu_fail(r);
    return SA_ERR_UNKNOWN_STREAM;
  }
  if (r != CUDA_SUCCESS) return sa_cu_fail(r);
  /* Events we record on it live in our context: cuEventRecord needs the
   * stream in the same one. */
  if (ctx != as_cuda(d)->ctx) {
    sa_driver_set_error(CUDA_ERROR_INVALID_CONTEXT, stream_owner(ctx, as_cuda(d)->dev));
    return SA_ERR_UNKNOWN_STREAM;
  }
  return SA_OK;
}
