/* The tests' own device work beside the library: PTX kernels, and SA_CU_OK
 * for their own libcuda calls. libcuda comes from the library's loader
 * (src/driver/cuda_loader.h: dlopen + cuGetProcAddress at the CUDA 12.0
 * ABI), so test binaries build and run where no driver exists (they skip).
 * Used by capture_test, gpu_pool_test, gpu_torture_test, gpu_soak_test,
 * driver_contract_test and gpu_multi_device_test.
 *
 *   if (sa_cu_load_all() != SA_OK) skip();
 *   SA_CU_OK(sa_cu.LaunchKernel(...));
 */
#ifndef SA_TEST_CUDA_KERNELS_H
#define SA_TEST_CUDA_KERNELS_H

#include "driver/cuda_loader.h"

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

#endif /* SA_TEST_CUDA_KERNELS_H */
