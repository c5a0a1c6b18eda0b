/* A fake libcuda.so.1 for tests of the CUDA backend on machines with no
 * GPU (cuda_fake_test): two devices, one primary context each, a per-thread
 * current context (and a push/pop stack), streams with process-unique ids
 * (NULL and CU_STREAM_LEGACY: the current context's legacy stream;
 * CU_STREAM_PER_THREAD: the calling thread's own stream of the current
 * context, as in CUDA), events whose work never completes until a
 * synchronize, and VMM on mmap. Calls that need a current context fail with
 * CUDA_ERROR_INVALID_CONTEXT without one. Built with the soname libcuda.so.1:
 * a test dlopens it by path before the library's own dlopen("libcuda.so.1"),
 * which then finds it by soname.
 *
 * FAKE_CUDA_HIDE=cuName in the environment: cuGetProcAddress does not find
 * that entry point, as an older driver would not.
 *
 * fake_cuda_waits() counts cuStreamWaitEvent calls; fake_cuda_last_wait_stream()
 * is the id of the stream the last one was enqueued on.
 * fake_cuda_user_context(dev) is a context of device dev that is not its
 * primary one (cuCtxCreate's, which the fake lacks), for cuCtxSetCurrent.
 * fake_cuda_calls(name) counts the calling thread's calls of an entry
 * point (NULL: of all), so a test can pin down what a path costs.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define NDEV 2
#define GRAN ((size_t)2 << 20)

typedef struct fctx_s {
  int dev;
} fctx;

typedef struct fstream_s {
  fctx *ctx;
  unsigned long long id;
} fstream;

typedef struct fevent_s {
  fctx *ctx;
  int recorded;
  unsigned long long seq; /* when it was recorded */
} fevent;

static fctx ctxs[NDEV] = {{0}, {1}};
static fctx user_ctxs[NDEV] = {{0}, {1}};
static fstream legacy[NDEV] = {{&ctxs[0], 1}, {&ctxs[1], 2}};
static _Thread_local fctx *tl_stack[8];
static _Thread_local int tl_depth; /* tl_stack[tl_depth - 1] is current */
static _Thread_local fstream *tl_pt[NDEV];
static _Atomic unsigned long long next_id = 100;
static _Atomic unsigned long long next_seq = 1;
static _Atomic unsigned long long synced_upto = 0;
static _Atomic unsigned long long next_handle = 1;
static _Atomic int waits;
static _Atomic unsigned long long last_wait_stream;

int fake_cuda_waits(void);
unsigned long long fake_cuda_last_wait_stream(void);
unsigned long long fake_cuda_pt_id(int dev);
int fake_cuda_current_device(void);
void *fake_cuda_user_context(int dev);

int fake_cuda_waits(void) { return atomic_load(&waits); }
unsigned long long fake_cuda_last_wait_stream(void) { return atomic_load(&last_wait_stream); }
int fake_cuda_current_device(void) { return tl_depth > 0 && tl_stack[tl_depth - 1] ? tl_stack[tl_depth - 1]->dev : -1; }

void *fake_cuda_user_context(int dev) { return &user_ctxs[dev]; }

static fctx *cur(void) { return tl_depth > 0 ? tl_stack[tl_depth - 1] : NULL; }

/* Every thread's per-thread streams, kept reachable for the process's life
 * (a thread's may be named after it exited, as the real one's id is). */
static fstream all_pt[256];
static _Atomic unsigned npt;

static fstream *pt_of(fctx *c) {
  if (tl_pt[c->dev] == NULL) {
    unsigned k = atomic_fetch_add(&npt, 1);
    if (k >= sizeof all_pt / sizeof all_pt[0]) abort(); /* a test makes a few */
    tl_pt[c->dev] = &all_pt[k];
    tl_pt[c->dev]->ctx = c;
    tl_pt[c->dev]->id = atomic_fetch_add(&next_id, 1);
  }
  return tl_pt[c->dev];
}

unsigned long long fake_cuda_pt_id(int dev) { return pt_of(&ctxs[dev])->id; }

/* The stream a handle names for this thread, or NULL (no current context). */
static fstream *resolve(CUstream s) {
  if (s == NULL || s == CU_STREAM_LEGACY) return cur() ? &legacy[cur()->dev] : NULL;
  if (s == CU_STREAM_PER_THREAD) return cur() ? pt_of(cur()) : NULL;
  return (fstream *)s;
}

/* Every entry point the fake has, for its table and its call counters. */
#define FAKE_ENTRY_POINTS(X)                                                                  \
  X(GetErrorName) X(Init) X(DeviceGet) X(DeviceGetCount) X(DeviceGetAttribute)               \
  X(DeviceTotalMem) X(DeviceCanAccessPeer) X(DevicePrimaryCtxRetain)                         \
  X(DevicePrimaryCtxRelease) X(CtxGetCurrent) X(CtxSetCurrent) X(CtxGetDevice)               \
  X(CtxSynchronize) X(CtxPushCurrent) X(CtxPopCurrent) X(MemGetAllocationGranularity)        \
  X(MemAddressReserve) X(MemAddressFree) X(MemCreate) X(MemRelease) X(MemMap) X(MemUnmap)    \
  X(MemSetAccess) X(EventCreate) X(EventDestroy) X(EventRecord) X(EventQuery)                \
  X(EventSynchronize) X(StreamWaitEvent) X(StreamSynchronize) X(StreamQuery) X(StreamGetCtx)  \
  X(StreamGetId) X(StreamIsCapturing) X(ThreadExchangeStreamCaptureMode) X(StreamCreate)     \
  X(StreamDestroy) X(MemsetD32Async) X(MemcpyDtoH) X(StreamBeginCapture) X(StreamEndCapture) \
  X(GraphDestroy)

#define FN_ENUM(name) FN_##name,
enum { FAKE_ENTRY_POINTS(FN_ENUM) FN_COUNT };
#undef FN_ENUM

/* Calls of each entry point made by the calling thread (thread-local: a
 * test counts its own calls, whatever other threads do, and a benchmark
 * pays no atomic for it). */
static _Thread_local unsigned long long tl_calls[FN_COUNT];
#define CALLED(name) (tl_calls[FN_##name]++)

#define FN_NAME(name) "cu" #name,
static const char *const fn_names[FN_COUNT] = {FAKE_ENTRY_POINTS(FN_NAME)};
#undef FN_NAME

unsigned long long fake_cuda_calls(const char *name);

/* The calling thread's calls of entry point name ("cuCtxGetCurrent"), or
 * of every entry point for NULL; cuGetProcAddress itself is not counted. */
unsigned long long fake_cuda_calls(const char *name) {
  unsigned long long n = 0;
  for (int i = 0; i < FN_COUNT; i++)
    if (name == NULL || strcmp(name, fn_names[i]) == 0) n += tl_calls[i];
  return n;
}

static CUresult f_GetErrorName(CUresult r, const char **name) {
  CALLED(GetErrorName);
  *name = r == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUDA_ERROR_FAKE";
  return CUDA_SUCCESS;
}
static CUresult f_Init(unsigned flags) {
  CALLED(Init);
  (void)flags;
  return CUDA_SUCCESS;
}
static CUresult f_DeviceGet(CUdevice *d, int ordinal) {
  CALLED(DeviceGet);
  if (ordinal < 0 || ordinal >= NDEV) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}
static CUresult f_DeviceGetCount(int *n) {
  CALLED(DeviceGetCount);
  *n = NDEV;
  return CUDA_SUCCESS;
}
static CUresult f_DeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
  CALLED(DeviceGetAttribute);
  (void)a; (void)d;
  *v = 1;
  return CUDA_SUCCESS;
}
static CUresult f_DeviceTotalMem(size_t *b, CUdevice d) {
  CALLED(DeviceTotalMem);
  (void)d;
  *b = (size_t)16 << 30;
  return CUDA_SUCCESS;
}
static CUresult f_DeviceCanAccessPeer(int *can, CUdevice d, CUdevice p) {
  CALLED(DeviceCanAccessPeer);
  (void)d;
  (void)p;
  *can = 1;
  return CUDA_SUCCESS;
}
static CUresult f_DevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  CALLED(DevicePrimaryCtxRetain);
  *c = (CUcontext)&ctxs[d];
  return CUDA_SUCCESS;
}
static CUresult f_DevicePrimaryCtxRelease(CUdevice d) {
  CALLED(DevicePrimaryCtxRelease);
  (void)d;
  return CUDA_SUCCESS;
}
static CUresult f_CtxGetCurrent(CUcontext *c) {
  CALLED(CtxGetCurrent);
  *c = (CUcontext)cur();
  return CUDA_SUCCESS;
}
static CUresult f_CtxSetCurrent(CUcontext c) {
  CALLED(CtxSetCurrent);
  if (c == NULL) {
    if (tl_depth > 0) tl_depth--;
    return CUDA_SUCCESS;
  }
  if (tl_depth == 0) tl_depth = 1;
  tl_stack[tl_depth - 1] = (fctx *)c;
  return CUDA_SUCCESS;
}
static CUresult f_CtxGetDevice(CUdevice *d) {
  CALLED(CtxGetDevice);
  if (!cur()) return CUDA_ERROR_INVALID_CONTEXT;
  *d = cur()->dev;
  return CUDA_SUCCESS;
}
static CUresult f_CtxSynchronize(void) {
  CALLED(CtxSynchronize);
  if (!cur()) return CUDA_ERROR_INVALID_CONTEXT;
  atomic_store(&synced_upto, atomic_load(&next_seq));
  return CUDA_SUCCESS;
}
static CUresult f_CtxPushCurrent(CUcontext c) {
  CALLED(CtxPushCurrent);
  if (tl_depth == 8) return CUDA_ERROR_UNKNOWN;
  tl_stack[tl_depth++] = (fctx *)c;
  return CUDA_SUCCESS;
}
static CUresult f_CtxPopCurrent(CUcontext *c) {
  CALLED(CtxPopCurrent);
  if (tl_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (c) *c = (CUcontext)tl_stack[tl_depth - 1];
  tl_depth--;
  return CUDA_SUCCESS;
}

static CUresult f_MemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p,
                                              CUmemAllocationGranularity_flags f) {
  CALLED(MemGetAllocationGranularity);
  (void)p; (void)f;
  *g = GRAN;
  return CUDA_SUCCESS;
}
static CUresult f_MemAddressReserve(CUdeviceptr *out, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags) {
  CALLED(MemAddressReserve);
  (void)addr; (void)flags;
  if (!cur()) return CUDA_ERROR_INVALID_CONTEXT;
  if (align < GRAN) align = GRAN;
  void *m = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t raw = (uintptr_t)m, base = (raw + align - 1) & ~(uintptr_t)(align - 1);
  if (base > raw) munmap(m, base - raw);
  if (raw + align > base) munmap((void *)(base + size), raw + align - base);
  *out = (CUdeviceptr)base;
  return CUDA_SUCCESS;
}
static CUresult f_MemAddressFree(CUdeviceptr p, size_t size) {
  CALLED(MemAddressFree);
  if (!cur()) return CUDA_ERROR_INVALID_CONTEXT;
  munmap((void *)(uintptr_t)p, size);
  return CUDA_SUCCESS;
}
static CUresult f_MemCreate(CUmemGenericAllocationHandle *h, size_t size,
                            const CUmemAllocationProp *p, unsigned long long flags) {
  CALLED(MemCreate);
  (void)size; (void)p; (void)flags;
  if (!cur()) return CUDA_ERROR_INVALID_CONTEXT;
  *h = atomic_fetch_add(&next_handle, 1);
  return CUDA_SUCCESS;
}
static CUresult f_MemRelease(CUmemGenericAllocationHandle h) {
  CALLED(MemRelease);
  (void)h;
  return CUDA_SUCCESS;
}
static CUresult f_MemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h,
                         unsigned long long flags) {
  CALLED(MemMap);
  (void)off; (void)h; (void)flags;
  if (!cur()) return CUDA_ERROR_INVALID_CONTEXT;
  if (mmap((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED)
    return CUDA_ERROR_OUT_OF_MEMORY;
  return CUDA_SUCCESS;
}
static CUresult f_MemUnmap(CUdeviceptr p, size_t size) {
  CALLED(MemUnmap);
  if (!cur()) return CUDA_ERROR_INVALID_CONTEXT;
  mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
       -1, 0);
  return CUDA_SUCCESS;
}
static CUresult f_MemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *d, size_t n) {
  CALLED(MemSetAccess);
  (void)p; (void)size; (void)d; (void)n;
  if (!cur()) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

static CUresult f_EventCreate(CUevent *e, unsigned flags) {
  CALLED(EventCreate);
  (void)flags;
  if (!cur()) return CUDA_ERROR_INVALID_CONTEXT;
  fevent *ev = calloc(1, sizeof *ev);
  ev->ctx = cur();
  *e = (CUevent)ev;
  return CUDA_SUCCESS;
}
static CUresult f_EventDestroy(CUevent e) {
  CALLED(EventDestroy);
  free(e);
  return CUDA_SUCCESS;
}
static CUresult f_EventRecord(CUevent e, CUstream s) {
  CALLED(EventRecord);
  fstream *st = resolve(s);
  if (st == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  fevent *ev = (fevent *)e;
  if (st->ctx != ev->ctx) return CUDA_ERROR_INVALID_HANDLE;
  ev->recorded = 1;
  ev->seq = atomic_fetch_add(&next_seq, 1);
  return CUDA_SUCCESS;
}
static CUresult f_EventQuery(CUevent e) {
  CALLED(EventQuery);
  fevent *ev = (fevent *)e;
  return !ev->recorded || ev->seq < atomic_load(&synced_upto) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
static CUresult f_EventSynchronize(CUevent e) {
  CALLED(EventSynchronize);
  ((fevent *)e)->recorded = 0;
  return CUDA_SUCCESS;
}
static CUresult f_StreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
  CALLED(StreamWaitEvent);
  (void)e; (void)flags;
  fstream *st = resolve(s);
  if (st == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  atomic_fetch_add(&waits, 1);
  atomic_store(&last_wait_stream, st->id);
  return CUDA_SUCCESS;
}
static CUresult f_StreamSynchronize(CUstream s) {
  CALLED(StreamSynchronize);
  if (resolve(s) == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS; /* events recorded on it stay "not ready": conservative */
}
static CUresult f_StreamQuery(CUstream s) {
  CALLED(StreamQuery);
  if (resolve(s) == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_ERROR_NOT_READY; /* as its events: never known done, conservative */
}
static CUresult f_StreamGetCtx(CUstream s, CUcontext *c) {
  CALLED(StreamGetCtx);
  fstream *st = resolve(s);
  if (st == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  *c = (CUcontext)st->ctx;
  return CUDA_SUCCESS;
}
static CUresult f_StreamGetId(CUstream s, unsigned long long *id) {
  CALLED(StreamGetId);
  fstream *st = resolve(s);
  if (st == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  *id = st->id;
  return CUDA_SUCCESS;
}
static CUresult f_StreamIsCapturing(CUstream s, CUstreamCaptureStatus *status) {
  CALLED(StreamIsCapturing);
  if (resolve(s) == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  *status = CU_STREAM_CAPTURE_STATUS_NONE; /* the fake captures nothing */
  return CUDA_SUCCESS;
}
static _Thread_local CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
static CUresult f_ThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  CALLED(ThreadExchangeStreamCaptureMode);
  CUstreamCaptureMode old = capture_mode;
  capture_mode = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}
static CUresult f_StreamBeginCapture(CUstream s, CUstreamCaptureMode mode) {
  CALLED(StreamBeginCapture);
  (void)s; (void)mode;
  return CUDA_ERROR_NOT_SUPPORTED;
}
static CUresult f_StreamEndCapture(CUstream s, CUgraph *g) {
  CALLED(StreamEndCapture);
  (void)s; *g = NULL;
  return CUDA_ERROR_ILLEGAL_STATE;
}
static CUresult f_GraphDestroy(CUgraph g) {
  CALLED(GraphDestroy);
  (void)g;
  return CUDA_SUCCESS;
}
static CUresult f_StreamCreate(CUstream *s, unsigned flags) {
  CALLED(StreamCreate);
  (void)flags;
  if (!cur()) return CUDA_ERROR_INVALID_CONTEXT;
  fstream *st = calloc(1, sizeof *st);
  st->ctx = cur();
  st->id = atomic_fetch_add(&next_id, 1);
  *s = (CUstream)st;
  return CUDA_SUCCESS;
}
static CUresult f_StreamDestroy(CUstream s) {
  CALLED(StreamDestroy);
  free(s);
  return CUDA_SUCCESS;
}
static CUresult f_MemsetD32Async(CUdeviceptr p, unsigned v, size_t n, CUstream s) {
  CALLED(MemsetD32Async);
  if (resolve(s) == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  for (size_t i = 0; i < n; i++) ((unsigned *)(uintptr_t)p)[i] = v;
  return CUDA_SUCCESS;
}
static CUresult f_MemcpyDtoH(void *dst, CUdeviceptr src, size_t n) {
  CALLED(MemcpyDtoH);
  if (!cur()) return CUDA_ERROR_INVALID_CONTEXT;
  memcpy(dst, (void *)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}

#define E(name) {"cu" #name, (void *)f_##name},
static const struct {
  const char *name;
  void *fn;
} table[] = {FAKE_ENTRY_POINTS(E)};
#undef E

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
  (void)version; (void)flags;
  const char *hidden = getenv("FAKE_CUDA_HIDE"); /* a driver that lacks this one */
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    if (strcmp(table[i].name, symbol) == 0 && (hidden == NULL || strcmp(hidden, symbol) != 0)) {
      *pfn = table[i].fn;
      if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  }
  *pfn = NULL;
  if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}
