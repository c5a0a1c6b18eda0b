/* libcuda.so.1 loaded at run time: the one loader of the library, its tests
 * and its benchmarks.
 *
 * Owns the process-wide libcuda handle and the table of its entry points,
 * sa_cu. libcuda is opened with dlopen (RTLD_LOCAL; never closed once cuInit
 * has run), every entry point is resolved through cuGetProcAddress_v2 at
 * SA_CUDA_ABI_VERSION with CU_GET_PROC_ADDRESS_LEGACY_STREAM, then cuInit(0)
 * runs. Nothing links libcuda: the library loads, and reports
 * SA_ERR_NO_DEVICE, where no driver exists. Only cuda.h's types are used at
 * compile time. Two lists of entry points, one mechanism:
 *   SA_CU_ENTRY_POINTS        the library's; sa_cu_load resolves them all,
 *                             or the CUDA backend is not usable;
 *   SA_CU_EXTRA_ENTRY_POINTS  the ones only the tests and benchmarks call
 *                             (kernels, contexts of their own, the
 *                             cuMemAllocAsync baselines); sa_cu_load_all
 *                             resolves them on demand, so a driver that
 *                             lacks one still runs the library.
 *
 * Calls libdl, pthread and driver.c's error record (sa_driver_set_error).
 * Called by the CUDA backend (cuda.c, cuda_context.c), and through
 * //:internal by the tests (test/cuda_kernels.h) and benchmarks
 * (bench/cuda_device.h).
 * examples/train_loop.c keeps a loader of its own on purpose: it is a
 * program users copy, and it uses only the public API.
 */
#ifndef SA_DRIVER_CUDA_LOADER_H
#define SA_DRIVER_CUDA_LOADER_H

#include <cuda.h>
#include <cudaTypedefs.h>

#include <streamarena/streamarena.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI we are written against: for each name, cuGetProcAddress returns
 * the newest version of the entry point not newer than this (seen on the
 * H200: "cuCtxCreate" at 12000 gives cuCtxCreate_v3). Each PFN_ type below
 * is the newest one in cudaTypedefs.h at or below 12000. */
#define SA_CUDA_ABI_VERSION 12000

/* Every entry point the library calls: X(name without "cu", PFN version
 * suffix). */
#define SA_CU_ENTRY_POINTS(X)                \
  X(GetErrorName, v6000)                     \
  X(Init, v2000)                             \
  X(DeviceGet, v2000)                        \
  X(DeviceGetCount, v2000)                   \
  X(DeviceGetAttribute, v2000)               \
  X(DeviceTotalMem, v3020)                   \
  X(DeviceCanAccessPeer, v4000)              \
  X(DevicePrimaryCtxRetain, v7000)           \
  X(DevicePrimaryCtxRelease, v11000)         \
  X(CtxGetCurrent, v4000)                    \
  X(CtxSetCurrent, v4000)                    \
  X(CtxGetDevice, v2000)                     \
  X(CtxSynchronize, v2000)                   \
  X(CtxPushCurrent, v4000)                   \
  X(CtxPopCurrent, v4000)                    \
  X(MemGetAllocationGranularity, v10020)     \
  X(MemAddressReserve, v10020)               \
  X(MemAddressFree, v10020)                  \
  X(MemCreate, v10020)                       \
  X(MemRelease, v10020)                      \
  X(MemMap, v10020)                          \
  X(MemUnmap, v10020)                        \
  X(MemSetAccess, v10020)                    \
  X(EventCreate, v2000)                      \
  X(EventDestroy, v4000)                     \
  X(EventRecord, v2000)                      \
  X(EventQuery, v2000)                       \
  X(EventSynchronize, v2000)                 \
  X(StreamWaitEvent, v3020)                  \
  X(StreamSynchronize, v2000)                \
  X(StreamQuery, v2000)                      \
  X(StreamGetCtx, v9020)                     \
  X(StreamGetId, v12000)                     \
  X(StreamIsCapturing, v10000)               \
  X(ThreadExchangeStreamCaptureMode, v10010) \
  X(StreamCreate, v2000)                     \
  X(StreamDestroy, v4000)                    \
  X(MemsetD32Async, v3020)                   \
  X(MemcpyDtoH, v3020)                       \
  X(StreamBeginCapture, v10010)              \
  X(StreamEndCapture, v10000)                \
  X(GraphDestroy, v10000)

/* The entry points only the tests and benchmarks call, in the same form. */
#define SA_CU_EXTRA_ENTRY_POINTS(X)   \
  X(DriverGetVersion, v2020)          \
  X(DeviceGetName, v2000)             \
  X(CtxCreate, v11040)                \
  X(CtxDestroy, v4000)                \
  X(ModuleLoadData, v2000)            \
  X(ModuleGetFunction, v2000)         \
  X(ModuleUnload, v2000)              \
  X(LaunchKernel, v4000)              \
  X(StreamWriteValue64, v11070)       \
  X(StreamWaitValue64, v11070)        \
  X(MemAlloc, v3020)                  \
  X(MemFree, v3020)                   \
  X(MemAllocAsync, v11020)            \
  X(MemFreeAsync, v11020)             \
  X(DeviceGetDefaultMemPool, v11020)  \
  X(MemPoolSetAttribute, v11020)      \
  X(MemPoolGetAttribute, v11020)      \
  X(MemPoolCreate, v11020)            \
  X(MemPoolDestroy, v11020)           \
  X(MemAllocFromPoolAsync, v11020)    \
  X(MemGetInfo, v3020)                \
  X(MemGetAccess, v10020)             \
  X(PointerGetAttribute, v4000)       \
  X(MemHostAlloc, v2020)              \
  X(MemHostGetDevicePointer, v3020)   \
  X(MemFreeHost, v2000)               \
  X(MemsetD8Async, v3020)             \
  X(GraphInstantiateWithFlags, v11040) \
  X(GraphLaunch, v10000)              \
  X(GraphExecDestroy, v10000)

#define SA_CU_FIELD(name, ver) PFN_cu##name##_##ver name;

typedef struct sa_cu_api_s {
  SA_CU_ENTRY_POINTS(SA_CU_FIELD)       /* valid after sa_cu_load returned SA_OK */
  SA_CU_EXTRA_ENTRY_POINTS(SA_CU_FIELD) /* valid after sa_cu_load_all did */
} sa_cu_api;

/* Written once, under sa_cu_load's and sa_cu_load_all's pthread_once;
 * read-only afterwards. */
extern sa_cu_api sa_cu;

/* Load libcuda and the library's entry points once per process and run
 * cuInit(0). SA_OK, or SA_ERR_NO_DEVICE with the cause as the calling
 * thread's last driver error (sa_last_driver_error): libcuda.so.1 missing,
 * older than CUDA 12, lacking an entry point (named), or cuInit's error. */
sa_status sa_cu_load(void);

/* sa_cu_load, then the extra entry points once: for tests and benchmarks.
 * SA_OK, or SA_ERR_NO_DEVICE with the cause as sa_cu_load's. */
sa_status sa_cu_load_all(void);

/* cuGetErrorName's name for r ("CUDA_ERROR_OUT_OF_MEMORY"), or
 * "CUDA_ERROR_(unknown code)"; a static string. */
const char *sa_cu_error_name(CUresult r);

/* Record a failed call as the calling thread's last driver error and turn
 * it into a status: SA_ERR_OUT_OF_MEMORY, SA_ERR_STREAM_CAPTURING for a
 * capture's errors, else SA_ERR_DRIVER. */
sa_status sa_cu_fail(CUresult r);

#ifdef __cplusplus
}
#endif

#endif /* SA_DRIVER_CUDA_LOADER_H */
