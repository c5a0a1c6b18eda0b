/* The benchmarks' CUDA device (cuda_device.h). */
#include "bench/cuda_device.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int fail(char *why, size_t n, const char *what, const char *detail) {
  snprintf(why, n, "%s%s%s", what, detail != NULL ? ": " : "", detail != NULL ? detail : "");
  return -1;
}

#define CU_OPEN_CHECK(call)                                                         \
  do {                                                                              \
    CUresult r_ = (call);                                                           \
    if (r_ != CUDA_SUCCESS) return fail(why, why_size, #call, sa_cu_error_name(r_)); \
  } while (0)

int bench_cu_open(bench_cu *cu, int device, char *why, size_t why_size) {
  memset(cu, 0, sizeof *cu);
  if (sa_cu_load_all() != SA_OK) {
    const char *cause = NULL;
    (void)sa_last_driver_error(&cause);
    return fail(why, why_size, cause, NULL);
  }
  CU_OPEN_CHECK(sa_cu.DriverGetVersion(&cu->driver_version));
  CU_OPEN_CHECK(sa_cu.DeviceGet(&cu->dev, device));
  CU_OPEN_CHECK(sa_cu.DeviceGetName(cu->name, (int)sizeof cu->name, cu->dev));
  CU_OPEN_CHECK(sa_cu.DevicePrimaryCtxRetain(&cu->ctx, cu->dev));
  CUresult r = sa_cu.CtxSetCurrent(cu->ctx);
  if (r == CUDA_SUCCESS) r = sa_cu.DeviceGetDefaultMemPool(&cu->pool, cu->dev);
  /* The default threshold (0) gives memory back at every synchronisation;
   * callers that care about speed keep it. */
  cuuint64_t keep = UINT64_MAX;
  if (r == CUDA_SUCCESS)
    r = sa_cu.MemPoolSetAttribute(cu->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
  if (r != CUDA_SUCCESS) {
    (void)sa_cu.DevicePrimaryCtxRelease(cu->dev);
    cu->ctx = NULL;
    return fail(why, why_size, "context or memory pool setup", sa_cu_error_name(r));
  }
  return 0;
}

bool bench_cu_open_or_skip(bench_cu *cu, int device, const char *prog) {
  char why[256];
  if (bench_cu_open(cu, device, why, sizeof why) == 0) return true;
  printf("%s: skipped (%s)\n", prog, why);
  return false;
}

void bench_cu_close(bench_cu *cu) {
  if (cu->ctx == NULL) return;
  CUresult r = sa_cu.DevicePrimaryCtxRelease(cu->dev);
  if (r != CUDA_SUCCESS)
    fprintf(stderr, "bench: cuDevicePrimaryCtxRelease: %s\n", sa_cu_error_name(r));
  cu->ctx = NULL;
}
