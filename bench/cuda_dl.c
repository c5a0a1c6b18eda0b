/* The benchmarks' CUDA driver loader (cuda_dl.h). */
#include "bench/cuda_dl.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The ABI the PFN_ types above are written against (as src/driver/cuda.c). */
#define BENCH_CU_ABI_VERSION 12000

const char *bench_cu_error(const bench_cu *cu, CUresult r) {
  const char *name = NULL;
  if (cu->GetErrorName == NULL || cu->GetErrorName(r, &name) != CUDA_SUCCESS || name == NULL)
    return "CUDA_ERROR_(unknown)";
  return name;
}

static int fail(char *why, size_t n, const char *what, const char *detail) {
  snprintf(why, n, "%s%s%s", what, detail != NULL ? ": " : "", detail != NULL ? detail : "");
  return -1;
}

#define CU_OPEN_CHECK(call)                                              \
  do {                                                                   \
    CUresult r_ = (call);                                                \
    if (r_ != CUDA_SUCCESS) return fail(why, why_size, #call, bench_cu_error(cu, r_)); \
  } while (0)

int bench_cu_open(bench_cu *cu, int device, char *why, size_t why_size) {
  memset(cu, 0, sizeof *cu);
  /* RTLD_LOCAL: the library loads its own handle to the same libcuda; ours
   * must not put driver symbols in the global namespace. Never dlclosed:
   * after cuInit, unloading is not known to be safe. */
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) return fail(why, why_size, "libcuda.so.1 not found", NULL);
  PFN_cuGetProcAddress_v12000 get;
  *(void **)&get = dlsym(lib, "cuGetProcAddress_v2");
  if (get == NULL) return fail(why, why_size, "libcuda.so.1 has no cuGetProcAddress_v2", NULL);
#define BENCH_CU_RESOLVE(name, ver)                                                        \
  do {                                                                                     \
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;           \
    CUresult r_ = get("cu" #name, (void **)&cu->name, BENCH_CU_ABI_VERSION,                \
                      CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found);                          \
    if (r_ != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS || cu->name == NULL)    \
      return fail(why, why_size, "cuGetProcAddress failed for", "cu" #name);               \
  } while (0);
  BENCH_CU_ENTRY_POINTS(BENCH_CU_RESOLVE)
#undef BENCH_CU_RESOLVE
  CU_OPEN_CHECK(cu->Init(0));
  CU_OPEN_CHECK(cu->DriverGetVersion(&cu->driver_version));
  CU_OPEN_CHECK(cu->DeviceGet(&cu->dev, device));
  CU_OPEN_CHECK(cu->DeviceGetName(cu->name, (int)sizeof cu->name, cu->dev));
  CU_OPEN_CHECK(cu->DevicePrimaryCtxRetain(&cu->ctx, cu->dev));
  CUresult r = cu->CtxSetCurrent(cu->ctx);
  if (r == CUDA_SUCCESS) r = cu->DeviceGetDefaultMemPool(&cu->pool, cu->dev);
  /* The default threshold (0) gives memory back at every synchronisation;
   * callers that care about speed keep it. */
  cuuint64_t keep = UINT64_MAX;
  if (r == CUDA_SUCCESS)
    r = cu->MemPoolSetAttribute(cu->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
  if (r != CUDA_SUCCESS) {
    (void)cu->DevicePrimaryCtxRelease(cu->dev);
    return fail(why, why_size, "context or memory pool setup", bench_cu_error(cu, r));
  }
  return 0;
}

void bench_cu_close(bench_cu *cu) {
  if (cu->ctx == NULL) return;
  CUresult r = cu->DevicePrimaryCtxRelease(cu->dev);
  if (r != CUDA_SUCCESS)
    fprintf(stderr, "alloc_bench: cuDevicePrimaryCtxRelease: %s\n", bench_cu_error(cu, r));
  cu->ctx = NULL;
}
