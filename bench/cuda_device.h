/* The benchmarks' CUDA device, for the baselines (cuMemAllocAsync,
 * cuMemAlloc) and the CUstreams every backend runs on.
 *
 * libcuda and its entry points come from the library's loader (sa_cu,
 * src/driver/cuda_loader.h, its extra entry points included), so one binary
 * runs on the GPU machine and, without the baselines, on a box with no
 * driver. This file owns what a benchmark adds: the device's primary
 * context, made current on the opening thread, and its default memory pool
 * set to cache. Called by alloc_bench, driver_costs, mark_costs and
 * bench/peers.
 */
#ifndef SA_BENCH_CUDA_DEVICE_H
#define SA_BENCH_CUDA_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda.h>

#include "driver/cuda_loader.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bench_cu_s {
  CUdevice dev;
  CUcontext ctx;     /* the device's primary context, retained */
  CUmemoryPool pool; /* the device's default pool, caching (release threshold max) */
  char name[128];    /* the device's name */
  int driver_version;
} bench_cu;

/* Load libcuda with every entry point (sa_cu_load_all), retain device's
 * primary context, make it current on the calling thread and set the
 * default pool's release threshold to UINT64_MAX (it keeps what it has, as
 * PyTorch users configure it). Returns 0, or -1 with the reason in why (no
 * driver, no device, a failed call). */
int bench_cu_open(bench_cu *cu, int device, char *why, size_t why_size);

/* bench_cu_open for a program that needs a GPU: false, after printing
 * "PROG: skipped (why)", where there is none; the program then exits 0. */
bool bench_cu_open_or_skip(bench_cu *cu, int device, const char *prog);

/* Release the primary context. */
void bench_cu_close(bench_cu *cu);

/* A driver call that must succeed: on failure the program prog exits with
 * status 1, naming the call, its error and the line. */
#define BENCH_CU_CHECK(prog, call)                                                    \
  do {                                                                                \
    CUresult r_ = (call);                                                             \
    if (r_ != CUDA_SUCCESS) {                                                         \
      fprintf(stderr, "%s: %s: %s (line %d)\n", prog, #call, sa_cu_error_name(r_),    \
              __LINE__);                                                              \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

#ifdef __cplusplus
}
#endif

#endif /* SA_BENCH_CUDA_DEVICE_H */
