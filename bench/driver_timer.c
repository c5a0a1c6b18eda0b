/* driver_timer: a libcuda.so.1 in front of the real driver that times the
 * calls whose cost the large path's policy weighs (chunk create, map,
 * access, unmap, release, reserve; event create, destroy, record, query
 * and synchronize; stream waits; stream and context synchronizes) and
 * counts the ones a fast path may make per operation (capture status,
 * current context, a stream's context and id), and prints per call:
 * count, total and mean us, bytes. Any program that
 * reaches the driver through cuGetProcAddress_v2 (streamarena, peer_bench's
 * built-in backends) can be timed without a profiler:
 *
 *   bazel build -c opt //bench:libdriver_timer.so
 *   cp bazel-bin/bench/libdriver_timer.so DIR/libcuda.so.1   (on the GPU machine:)
 *   REAL_LIBCUDA=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}') \
 *       LD_LIBRARY_PATH=DIR:... peer_bench --backends=streamarena ...
 *
 * The table goes to stderr when the program exits (docs/BENCHMARKS.md, run
 * K).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
  F_CREATE, F_MAP, F_ACCESS, F_UNMAP, F_RELEASE, F_RESERVE, F_RECORD, F_QUERY, F_WAIT,
  F_EVENT_SYNC, F_CAPTURING, F_CTX_GET, F_CTX_SET, F_STREAM_CTX, F_STREAM_ID, F_EVENT_CREATE,
  F_EVENT_DESTROY, F_STREAM_SYNC, F_CTX_SYNC, F_N
};
static const char *const names[F_N] = {
    "cuMemCreate",        "cuMemMap",        "cuMemSetAccess", "cuMemUnmap",
    "cuMemRelease",       "cuMemAddressReserve", "cuEventRecord", "cuEventQuery",
    "cuStreamWaitEvent",  "cuEventSynchronize",  "cuStreamIsCapturing", "cuCtxGetCurrent",
    "cuCtxSetCurrent",    "cuStreamGetCtx",  "cuStreamGetId", "cuEventCreate", "cuEventDestroy",
    "cuStreamSynchronize", "cuCtxSynchronize"};
static void *real_fn[F_N];
static double total_us[F_N], bytes[F_N];
static unsigned long calls[F_N];
static void *real;
static CUresult (*real_get)(const char *, void **, int, cuuint64_t,
                            CUdriverProcAddressQueryResult *);

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* Time one forwarded call (single-threaded counts: a timing aid, not a
 * profiler for concurrent callers). */
#define TIMED(i, nbytes, type, ...)                     \
  do {                                                  \
    double t0_ = now_us();                              \
    CUresult r_ = ((type)real_fn[i])(__VA_ARGS__);      \
    total_us[i] += now_us() - t0_;                      \
    calls[i]++;                                         \
    bytes[i] += (double)(nbytes);                       \
    return r_;                                          \
  } while (0)

typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                              unsigned long long);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                           unsigned long long);
typedef CUresult (*access_fn)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*record_fn)(CUevent, CUstream);
typedef CUresult (*query_fn)(CUevent);
typedef CUresult (*wait_fn)(CUstream, CUevent, unsigned);
typedef CUresult (*capturing_fn)(CUstream, CUstreamCaptureStatus *);
typedef CUresult (*ctx_get_fn)(CUcontext *);
typedef CUresult (*ctx_set_fn)(CUcontext);
typedef CUresult (*stream_ctx_fn)(CUstream, CUcontext *);
typedef CUresult (*stream_id_fn)(CUstream, unsigned long long *);
typedef CUresult (*event_create_fn)(CUevent *, unsigned);
typedef CUresult (*stream_sync_fn)(CUstream);
typedef CUresult (*ctx_sync_fn)(void);

static CUresult w_create(CUmemGenericAllocationHandle *h, size_t s, const CUmemAllocationProp *p,
                         unsigned long long f) {
  TIMED(F_CREATE, s, create_fn, h, s, p, f);
}
static CUresult w_map(CUdeviceptr va, size_t s, size_t off, CUmemGenericAllocationHandle h,
                      unsigned long long f) {
  TIMED(F_MAP, s, map_fn, va, s, off, h, f);
}
static CUresult w_access(CUdeviceptr va, size_t s, const CUmemAccessDesc *d, size_t n) {
  TIMED(F_ACCESS, s, access_fn, va, s, d, n);
}
static CUresult w_unmap(CUdeviceptr va, size_t s) { TIMED(F_UNMAP, s, unmap_fn, va, s); }
static CUresult w_release(CUmemGenericAllocationHandle h) { TIMED(F_RELEASE, 0, release_fn, h); }
static CUresult w_reserve(CUdeviceptr *va, size_t s, size_t al, CUdeviceptr at,
                          unsigned long long f) {
  TIMED(F_RESERVE, s, reserve_fn, va, s, al, at, f);
}
static CUresult w_record(CUevent e, CUstream s) { TIMED(F_RECORD, 0, record_fn, e, s); }
static CUresult w_query(CUevent e) { TIMED(F_QUERY, 0, query_fn, e); }
static CUresult w_wait(CUstream s, CUevent e, unsigned f) { TIMED(F_WAIT, 0, wait_fn, s, e, f); }

/* The calls the fast path may make per operation: counted to see which of
 * them a workload reaches (their time includes the clock's own cost). */
static CUresult w_event_sync(CUevent e) { TIMED(F_EVENT_SYNC, 0, query_fn, e); }
static CUresult w_capturing(CUstream s, CUstreamCaptureStatus *st) {
  TIMED(F_CAPTURING, 0, capturing_fn, s, st);
}
static CUresult w_ctx_get(CUcontext *c) { TIMED(F_CTX_GET, 0, ctx_get_fn, c); }
static CUresult w_ctx_set(CUcontext c) { TIMED(F_CTX_SET, 0, ctx_set_fn, c); }
static CUresult w_stream_ctx(CUstream s, CUcontext *c) {
  TIMED(F_STREAM_CTX, 0, stream_ctx_fn, s, c);
}
static CUresult w_stream_id(CUstream s, unsigned long long *id) {
  TIMED(F_STREAM_ID, 0, stream_id_fn, s, id);
}

static CUresult w_event_create(CUevent *e, unsigned f) {
  TIMED(F_EVENT_CREATE, 0, event_create_fn, e, f);
}
static CUresult w_event_destroy(CUevent e) { TIMED(F_EVENT_DESTROY, 0, query_fn, e); }
static CUresult w_stream_sync(CUstream s) { TIMED(F_STREAM_SYNC, 0, stream_sync_fn, s); }
static CUresult w_ctx_sync(void) { TIMED(F_CTX_SYNC, 0, ctx_sync_fn); }

static void *const wrappers[F_N] = {
    (void *)w_create,     (void *)w_map,       (void *)w_access,  (void *)w_unmap,
    (void *)w_release,    (void *)w_reserve,   (void *)w_record,  (void *)w_query,
    (void *)w_wait,       (void *)w_event_sync, (void *)w_capturing, (void *)w_ctx_get,
    (void *)w_ctx_set,    (void *)w_stream_ctx, (void *)w_stream_id, (void *)w_event_create,
    (void *)w_event_destroy, (void *)w_stream_sync, (void *)w_ctx_sync};

__attribute__((constructor)) static void timer_open(void) {
  const char *path = getenv("REAL_LIBCUDA");
  /* By path: a name would find this file again. */
  real = dlopen(path != NULL ? path : "/usr/lib/x86_64-linux-gnu/libcuda.so.1", RTLD_NOW);
  if (real == NULL) {
    fprintf(stderr, "driver_timer: %s (set REAL_LIBCUDA)\n", dlerror());
    return;
  }
  *(void **)&real_get = dlsym(real, "cuGetProcAddress_v2");
}

static void report(const char *phase) {
  for (int i = 0; i < F_N; i++)
    if (calls[i] != 0)
      fprintf(stderr,
              "driver_timer %-20s calls %7lu  total %10.1f us  mean %8.2f us  %8.2f GB  (%s)\n",
              names[i], calls[i], total_us[i], total_us[i] / (double)calls[i], bytes[i] / 1e9,
              phase);
}

/* The calls since the last phase ended, labelled, then counted afresh: a
 * program finds it with dlopen("libcuda.so.1", RTLD_NOLOAD) where the
 * timer is the driver it loaded (peer_bench's after workload does). */
__attribute__((visibility("default"))) void driver_timer_phase(const char *ended) {
  report(ended);
  memset(total_us, 0, sizeof total_us);
  memset(bytes, 0, sizeof bytes);
  memset(calls, 0, sizeof calls);
}

__attribute__((destructor)) static void timer_report(void) { report("to the exit"); }

/* Every entry point is resolved here; the timed ones get a wrapper. */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
  if (real_get == NULL) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real_get(symbol, pfn, version, flags, status);
  if (r != CUDA_SUCCESS || *pfn == NULL) return r;
  for (int i = 0; i < F_N; i++)
    if (strcmp(symbol, names[i]) == 0) {
      real_fn[i] = *pfn;
      *pfn = wrappers[i];
    }
  return r;
}
