/* The CUDA driver API for the benchmarks, loaded at run time.
 *
 * The benchmarks compare streamarena with cuMemAllocAsync/cuMemFreeAsync and
 * cuMemAlloc/cuMemFree, and create the CUstreams they run on. They load
 * libcuda.so.1 themselves (dlopen + cuGetProcAddress), like the library does,
 * so one binary runs on the GPU machine and, without the baselines, on a box
 * with no driver. This is the benchmarks' own small loader: the library's
 * (src/driver/cuda.c) is private to it and resolves a different set.
 */
#ifndef SA_BENCH_CUDA_DL_H
#define SA_BENCH_CUDA_DL_H

#include <stddef.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "driver/cuda_vmm.h" /* the VMM entry points, as the library loads them */

#ifdef __cplusplus
extern "C" {
#endif

/* X(name without "cu", PFN version suffix), the newest at or below ABI 12000. */
#define BENCH_CU_ENTRY_POINTS(X)         \
  X(GetErrorName, v6000)                 \
  X(Init, v2000)                         \
  X(DriverGetVersion, v2020)             \
  X(DeviceGet, v2000)                    \
  X(DeviceGetName, v2000)                \
  X(DevicePrimaryCtxRetain, v7000)       \
  X(DevicePrimaryCtxRelease, v11000)     \
  X(CtxSetCurrent, v4000)                \
  X(StreamCreate, v2000)                 \
  X(StreamDestroy, v4000)                \
  X(StreamSynchronize, v2000)            \
  X(MemAlloc, v3020)                     \
  X(MemFree, v3020)                      \
  X(MemAllocAsync, v11020)               \
  X(MemFreeAsync, v11020)                \
  X(DeviceGetDefaultMemPool, v11020)     \
  X(MemPoolSetAttribute, v11020)         \
  X(MemPoolGetAttribute, v11020)         \
  X(MemPoolCreate, v11020)               \
  X(MemPoolDestroy, v11020)              \
  X(MemAllocFromPoolAsync, v11020)       \
  X(MemGetInfo, v3020)                   \
  X(EventCreate, v2000)                  \
  X(EventDestroy, v4000)                 \
  X(EventRecord, v2000)                  \
  X(EventQuery, v2000)                   \
  X(StreamWaitEvent, v3020)              \
  X(StreamQuery, v2000)                  \
  X(StreamWriteValue64, v11070)          \
  X(StreamWaitValue64, v11070)           \
  X(MemHostAlloc, v2020)                 \
  X(MemHostGetDevicePointer, v3020)      \
  X(MemFreeHost, v2000)                  \
  X(MemsetD8Async, v3020)                \
  SA_CU_VMM_ENTRY_POINTS(X)

#define BENCH_CU_FIELD(name, ver) PFN_cu##name##_##ver name;

typedef struct bench_cu_s {
  BENCH_CU_ENTRY_POINTS(BENCH_CU_FIELD)
  CUdevice dev;
  CUcontext ctx;     /* the device's primary context, retained */
  CUmemoryPool pool; /* the device's default pool, caching (release threshold max) */
  char name[128];    /* the device's name */
  int driver_version;
} bench_cu;

/* Load libcuda.so.1, retain device's primary context, make it current on the
 * calling thread and set the default pool's release threshold to UINT64_MAX
 * (it keeps what it has, as PyTorch users configure it). Returns 0, or -1
 * with the reason in why (no driver, no device, a failed call). */
int bench_cu_open(bench_cu *cu, int device, char *why, size_t why_size);

/* Release the primary context. */
void bench_cu_close(bench_cu *cu);

/* The driver's name for r ("CUDA_ERROR_OUT_OF_MEMORY"). */
const char *bench_cu_error(const bench_cu *cu, CUresult r);

#ifdef __cplusplus
}
#endif

#endif /* SA_BENCH_CUDA_DL_H */
