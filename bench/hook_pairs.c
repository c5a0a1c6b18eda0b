/* hook_pairs: what the Python hooks (plugins/python) add to an alloc+free
 * pair of the library, per pair, on the CUDA backend.
 *
 * Paths, each on a named stream (non-blocking, the primary context's) and
 * on stream 0 (NULL: the legacy stream, CuPy's default):
 *   library  sa_alloc + sa_free on the default arena of device 0
 *   cupy     sa_cupy_malloc + sa_cupy_free, as CuPy's CFunctionAllocator
 *            calls them (the stream from the env's current_stream)
 *   ctypes   sa_py_alloc + sa_py_free, Numba's and RMM's Python path
 * for a 256 B and a 4 KiB block and a 16 and a 256 MiB span, freed at once. The thread has device 0's
 * primary context current, as a CuPy thread has. Also the driver calls the
 * hook path makes per call (cuCtxGetCurrent, cuStreamIsCapturing) timed
 * alone, to weigh them.
 *
 * ns/pair: the median and the least of --reps repetitions of --pairs
 * pairs (the least where other work shares the machine). With
 * --fake-libcuda=PATH (test/fake_libcuda.c, built by
 * `bazel build //test:libcuda_fake.so`) it runs without a GPU on a fake
 * driver whose calls cost almost nothing, and adds the driver calls per
 * pair that the fake counted.
 *
 *   hook_pairs [--pairs=200000] [--reps=7] [--fake-libcuda=PATH] [--only=PATH]
 *
 * --only=cupy (library, ctypes) runs that path alone, for a profiler.
 *
 * Prints "skipped" and exits 0 where CUDA does not open.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h>

#include "driver/cuda_loader.h"
#include "plugins/python/streamarena_python.h"
#include "test/util.h"

#define MAX_REPS 31

static unsigned long long (*fake_calls)(const char *name); /* NULL on a real driver */

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* CuPy's current stream, as the env's current_stream gives it. */
static sa_stream cupy_stream;

static intptr_t current_stream(int device) {
  (void)device;
  return (intptr_t)cupy_stream;
}

static sa_py_env env = {.size = sizeof(sa_py_env), .current_stream = current_stream};

typedef enum path_e { LIBRARY, CUPY, CTYPES, PATHS } path;
static const char *const path_names[PATHS] = {"library", "cupy", "ctypes"};

static sa_arena *arena;

/* n pairs of one size on one stream through path; exits on a failure. */
static void pairs(path p, size_t size, sa_stream s, long n) {
  cupy_stream = s;
  for (long i = 0; i < n; i++) {
    void *q = NULL;
    sa_status st = SA_OK;
    switch (p) {
      case LIBRARY:
        st = sa_alloc(arena, &q, size, s);
        if (st == SA_OK) st = sa_free(q, s);
        break;
      case CUPY:
        q = sa_cupy_malloc(&env, size, 0);
        if (q == NULL || q == (void *)(intptr_t)-1) st = SA_ERR_OUT_OF_MEMORY;
        else sa_cupy_free(&env, q, 0);
        break;
      case CTYPES:
        st = sa_py_alloc(0, size, s, &q);
        if (st == SA_OK) st = sa_py_free(0, q, size, s);
        break;
      default:
        break;
    }
    if (st != SA_OK) {
      fprintf(stderr, "hook_pairs: %s pair of %zu bytes: %s\n", path_names[p], size,
              sa_status_string(st));
      exit(1);
    }
  }
}

typedef struct timing_s {
  double median, min; /* ns per pair over the repetitions */
} timing;

static timing time_pairs(path p, size_t size, sa_stream s, long n, int reps) {
  double t[MAX_REPS];
  pairs(p, size, s, 1000); /* warm: the stream's arena, the thread's cache */
  for (int r = 0; r < reps; r++) {
    double t0 = now_ns();
    pairs(p, size, s, n);
    t[r] = (now_ns() - t0) / (double)n;
  }
  double median = sa_median(t, reps); /* sorted: t[0] is the least */
  return (timing){median, t[0]};
}

/* Driver calls per pair, where the fake counts them; -1 elsewhere. */
static double calls_per_pair(path p, size_t size, sa_stream s, const char *name) {
  if (fake_calls == NULL) return -1;
  enum { N = 1000 };
  unsigned long long before = fake_calls(name);
  pairs(p, size, s, N);
  return (double)(fake_calls(name) - before) / N;
}

static double time_calls(int which, sa_stream s, long n, int reps) {
  double t[MAX_REPS];
  for (int r = 0; r < reps; r++) {
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
      CUresult res;
      if (which == 0) {
        CUcontext c;
        res = sa_cu.CtxGetCurrent(&c);
      } else {
        CUstreamCaptureStatus cs;
        res = sa_cu.StreamIsCapturing((CUstream)s, &cs);
      }
      if (res != CUDA_SUCCESS) exit(1);
    }
    t[r] = (now_ns() - t0) / (double)n;
  }
  return sa_median(t, reps);
}

int main(int argc, char **argv) {
  long n = 200000;
  int reps = 7;
  const char *fake = NULL, *only = NULL;
  for (int i = 1; i < argc; i++) {
    if (strncmp(argv[i], "--pairs=", 8) == 0) {
      n = atol(argv[i] + 8);
    } else if (strncmp(argv[i], "--reps=", 7) == 0) {
      reps = atoi(argv[i] + 7);
    } else if (strncmp(argv[i], "--fake-libcuda=", 15) == 0) {
      fake = argv[i] + 15;
    } else if (strncmp(argv[i], "--only=", 7) == 0) {
      only = argv[i] + 7;
    } else {
      fprintf(stderr, "usage: hook_pairs [--pairs=N] [--reps=R] [--fake-libcuda=PATH] "
                      "[--only=PATH]\n");
      return 2;
    }
  }
  if (n < 1 || reps < 1 || reps > MAX_REPS) {
    fprintf(stderr, "hook_pairs: --pairs >= 1, --reps 1..%d\n", MAX_REPS);
    return 2;
  }
  if (fake != NULL) {
    /* Loaded first, the library's dlopen("libcuda.so.1") finds it by soname. */
    void *h = dlopen(fake, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
      fprintf(stderr, "hook_pairs: %s\n", dlerror());
      return 1;
    }
    *(void **)&fake_calls = dlsym(h, "fake_cuda_calls");
  }
  setenv("STREAMARENA_CONF", "backend=cuda", 0);
  CUdevice dev;
  CUcontext ctx;
  if (sa_cu_load() != SA_OK || sa_cu.DeviceGet(&dev, 0) != CUDA_SUCCESS ||
      sa_cu.DevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS) {
    const char *why = "";
    (void)sa_last_driver_error(&why);
    printf("hook_pairs: skipped (no CUDA: %s)\n", why);
    return 0;
  }
  CUstream named;
  if (sa_cu.CtxSetCurrent(ctx) != CUDA_SUCCESS ||
      sa_cu.StreamCreate(&named, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    fprintf(stderr, "hook_pairs: context or stream setup failed\n");
    return 1;
  }
  sa_status st = sa_default_arena(0, &arena);
  if (st != SA_OK) {
    fprintf(stderr, "hook_pairs: default arena: %s\n", sa_status_string(st));
    return 1;
  }
  printf("hook_pairs: %s, %ld pairs x %d reps; ns per pair, median and least of the reps; "
         "hook: least minus the library's least\n",
         fake != NULL ? "fake libcuda" : "CUDA", n, reps);
  printf("%-8s %-7s %-6s %8s %8s %8s %10s %12s\n", "path", "stream", "size", "median", "least",
         "hook", "drv calls", "IsCapturing");
  static const size_t sizes[] = {256, 4 * KiB, 16 * MiB, 256 * MiB};
  for (unsigned k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    for (int legacy = 0; legacy < 2; legacy++) {
      sa_stream s = legacy ? NULL : (sa_stream)named;
      double base = 0;
      for (path p = LIBRARY; p < PATHS; p++) {
        if (only != NULL && strcmp(only, path_names[p]) != 0) continue;
        timing t = time_pairs(p, sizes[k], s, n, reps);
        if (p == LIBRARY) base = t.min;
        printf("%-8s %-7s %-6zu %8.1f %8.1f %8.1f %10.2f %12.2f\n", path_names[p],
               legacy ? "0" : "named", sizes[k], t.median, t.min, t.min - base,
               calls_per_pair(p, sizes[k], s, NULL),
               calls_per_pair(p, sizes[k], s, "cuStreamIsCapturing"));
      }
    }
  }
  printf("driver calls alone, ns per call: cuCtxGetCurrent %.1f, cuStreamIsCapturing named "
         "%.1f, on NULL %.1f\n",
         time_calls(0, NULL, n, reps), time_calls(1, (sa_stream)named, n, reps),
         time_calls(1, NULL, n, reps));
  sa_default_arenas_shutdown();
  return 0;
}
