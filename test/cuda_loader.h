/* libcuda for tests that run their own device work beside the library (PTX
 * kernels, their own streams, copies, pointer queries): opened with dlopen
 * and resolved through cuGetProcAddress at the CUDA 12.0 ABI, as
 * src/driver/cuda.c does, so test binaries build and run where no driver
 * exists (they skip). Used by gpu_torture_test, gpu_soak_test, driver_contract_test and
 * gpu_multi_device_test.
 *
 *   if (sa_cu_load() != 0) skip();
 *   CUresult r = sa_cu.LaunchKernel(...);
 */
#ifndef SA_TEST_CUDA_LOADER_H
#define SA_TEST_CUDA_LOADER_H

#include <cuda.h>
#include <cudaTypedefs.h>

/* Every entry point a test calls: X(name without "cu", PFN version). */
#define SA_CU_TEST_ENTRY_POINTS(X)    \
  X(GetErrorName, v6000)              \
  X(Init, v2000)                      \
  X(DeviceGet, v2000)                 \
  X(DeviceGetCount, v2000)            \
  X(DevicePrimaryCtxRetain, v7000)    \
  X(DevicePrimaryCtxRelease, v11000)  \
  X(CtxSetCurrent, v4000)             \
  X(CtxGetCurrent, v4000)             \
  X(ModuleLoadData, v2000)            \
  X(ModuleGetFunction, v2000)         \
  X(ModuleUnload, v2000)              \
  X(LaunchKernel, v4000)              \
  X(StreamCreate, v2000)              \
  X(StreamDestroy, v4000)             \
  X(StreamSynchronize, v2000)         \
  X(StreamQuery, v2000)               \
  X(StreamWaitEvent, v3020)           \
  X(EventCreate, v2000)               \
  X(EventRecord, v2000)               \
  X(EventDestroy, v4000)              \
  X(MemsetD32Async, v3020)            \
  X(MemcpyDtoH, v3020)                \
  X(MemGetAccess, v10020)             \
  X(PointerGetAttribute, v4000)

#define SA_CU_TEST_FIELD(name, ver) PFN_cu##name##_##ver name;

typedef struct sa_cu_s {
  SA_CU_TEST_ENTRY_POINTS(SA_CU_TEST_FIELD)
} sa_cu_t;

/* The entry points, valid after sa_cu_load returned 0. */
extern sa_cu_t sa_cu;

/* Open libcuda.so.1 (once), resolve every entry point and run cuInit(0).
 * 0 on success; -1 with the reason on stderr. */
int sa_cu_load(void);

/* cuGetErrorName's name for r, or a fixed text. */
const char *sa_cu_error_name(CUresult r);

/* In a cmocka test (cmocka.h included first): fail it, naming the call and
 * its CUresult, unless call succeeds. */
#define SA_CU_OK(call)                                                              \
  do {                                                                              \
    CUresult sa_cu_ok_r_ = (call);                                                  \
    if (sa_cu_ok_r_ != CUDA_SUCCESS) {                                              \
      print_error("%s failed: %s (%d)\n", #call, sa_cu_error_name(sa_cu_ok_r_),    \
                  (int)sa_cu_ok_r_);                                                \
      fail();                                                                       \
    }                                                                               \
  } while (0)

/* mad_words(p, n, mul, add): p[i] = p[i] * mul + add for i < n, a
 * grid-stride loop that reads and writes every word (PTX for sm_75 and
 * newer, loaded with cuModuleLoadData). */
extern const char sa_cu_mad_words_ptx[];

/* check_words(p, n, value, bad): atomically adds to the 64-bit counter at
 * bad the number of words of p[0..n) that differ from value. */
extern const char sa_cu_check_words_ptx[];

#endif /* SA_TEST_CUDA_LOADER_H */
