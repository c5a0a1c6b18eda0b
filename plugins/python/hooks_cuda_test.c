/* What the Python hooks (streamarena_python.h) ask of the CUDA driver per
 * alloc+free pair, counted on the fake libcuda (test/fake_libcuda.c, given
 * as argv[1] and loaded before the library loads "libcuda.so.1"), which
 * counts the calling thread's calls of each entry point.
 *
 * A pair's fast path touches no stream: what it asks of the driver is the
 * hooks' rules alone, one capture query per call (a block allocated or
 * freed during a capture must stay the graph's) and, on stream 0 (NULL, the
 * legacy stream, CuPy's default), one read of the current context per call
 * for the switch that makes the hook's device current. Before the driver's
 * call_on_stream did the capture query inside that switch, and the library
 * trusted the switch (sa__alloc_on_device), a stream-0 pair made 8 calls:
 * the capture check and the library each read the current context once
 * more per call. A large pair costs the same (the driver's checked stream,
 * cuda_context.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "driver/cuda_loader.h"
#include "plugins/python/streamarena_python.h"
#include "test/util.h"

#define PAIRS 100
#define RAISED ((void *)(intptr_t)-1)

static unsigned long long (*fake_calls)(const char *name);
static int (*fake_current_device)(void);
static void *(*fake_user_context)(int dev);

static _Thread_local sa_stream current; /* CuPy's current stream */

static intptr_t current_stream(int device) {
  (void)device;
  return (intptr_t)current;
}

static sa_py_env env = {.size = sizeof(sa_py_env), .current_stream = current_stream};

typedef enum path_e { CUPY, CTYPES } path;

static void pair(path p, size_t size, sa_stream s) {
  if (p == CUPY) {
    current = s;
    void *q = sa_cupy_malloc(&env, size, 0);
    assert_true(q != NULL && q != RAISED);
    sa_cupy_free(&env, q, 0);
  } else {
    void *q = NULL;
    assert_int_equal(sa_py_alloc(0, size, s, &q), SA_OK);
    assert_int_equal(sa_py_free(0, q, size, s), SA_OK);
  }
}

/* The calling thread's calls of name (NULL: of every entry point) per pair,
 * after a warm pair made the stream's arena and the thread's cache. */
typedef struct per_pair_s {
  double all, capture, get_current, set_current;
} per_pair;

static per_pair count_pairs(path p, size_t size, sa_stream s) {
  pair(p, size, s);
  unsigned long long all = fake_calls(NULL), capture = fake_calls("cuStreamIsCapturing"),
                     get = fake_calls("cuCtxGetCurrent"), set = fake_calls("cuCtxSetCurrent");
  for (int i = 0; i < PAIRS; i++) pair(p, size, s);
  return (per_pair){
      .all = (double)(fake_calls(NULL) - all) / PAIRS,
      .capture = (double)(fake_calls("cuStreamIsCapturing") - capture) / PAIRS,
      .get_current = (double)(fake_calls("cuCtxGetCurrent") - get) / PAIRS,
      .set_current = (double)(fake_calls("cuCtxSetCurrent") - set) / PAIRS,
  };
}

static CUcontext primary(int dev) {
  CUdevice d;
  CUcontext ctx;
  assert_int_equal(sa_cu.DeviceGet(&d, dev), CUDA_SUCCESS);
  assert_int_equal(sa_cu.DevicePrimaryCtxRetain(&ctx, d), CUDA_SUCCESS);
  return ctx;
}

static sa_stream named_stream(void) {
  CUstream s;
  assert_int_equal(sa_cu.CtxSetCurrent(primary(0)), CUDA_SUCCESS);
  assert_int_equal(sa_cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  return (sa_stream)s;
}

/* A named stream: its handle names its context, so nothing is switched;
 * one capture query per call. */
static void a_pair_on_a_named_stream_asks_only_whether_it_is_captured(void **state) {
  (void)state;
  sa_stream s = named_stream();
  for (path p = CUPY; p <= CTYPES; p++) {
    for (size_t size = 256; size <= 64 * KiB; size *= 16) {
      per_pair n = count_pairs(p, size, s);
      assert_true(n.all == 2 && n.capture == 2);
    }
  }
  assert_int_equal(sa_cupy_live_blocks(), 0);
}

/* Stream 0 with the device's primary context current, as on a CuPy thread:
 * per call one read of the current context for the switch (none needed)
 * and the capture query inside it; nothing made current. */
static void a_pair_on_stream_0_reads_the_context_and_asks_once_per_call(void **state) {
  (void)state;
  assert_int_equal(sa_cu.CtxSetCurrent(primary(0)), CUDA_SUCCESS);
  for (path p = CUPY; p <= CTYPES; p++) {
    for (size_t size = 256; size <= 64 * KiB; size *= 16) {
      per_pair n = count_pairs(p, size, NULL);
      assert_true(n.capture == 2 && n.get_current == 2);
      assert_true(n.all == 4);
    }
  }
  assert_int_equal(fake_current_device(), 0);
}

/* A span's pair (a large size, on the arena's slow path) asks no more: the
 * library's own checks of the stream inside the hook's call (the legacy
 * stream's context, a lazy free mark's capture query) take the answers the
 * hook's call got. Before, such a pair made 8 calls on stream 0 and 3 on a
 * named stream. */
static void a_large_pair_asks_no_more_than_a_small_one(void **state) {
  (void)state;
  sa_stream named = named_stream();
  for (path p = CUPY; p <= CTYPES; p++) {
    for (size_t size = 4 * MiB; size <= 256 * MiB; size *= 4) {
      per_pair n = count_pairs(p, size, NULL);
      assert_true(n.all == 4 && n.capture == 2 && n.get_current == 2);
      n = count_pairs(p, size, named);
      assert_true(n.all == 2 && n.capture == 2);
    }
  }
  assert_int_equal(sa_cupy_live_blocks(), 0);
}

/* Stream 0 of device 0 with another device's context current (CuPy frees
 * an array wherever it dies): device 0's is made current for each call and
 * the caller's put back, the capture query made in device 0's. */
static void stream_0_with_another_device_current_switches_once_per_call(void **state) {
  (void)state;
  assert_int_equal(sa_cu.CtxSetCurrent(primary(1)), CUDA_SUCCESS);
  for (path p = CUPY; p <= CTYPES; p++) {
    per_pair n = count_pairs(p, 4096, NULL);
    assert_true(n.capture == 2 && n.get_current == 2 && n.set_current == 4);
    assert_true(n.all == 8);
    assert_int_equal(fake_current_device(), 1);
  }
  assert_int_equal(sa_cu.CtxSetCurrent(fake_user_context(0)), CUDA_SUCCESS);
  pair(CUPY, 4096, NULL); /* a context of the user's own on device 0: switched too */
  assert_true(fake_current_device() == 0);
  assert_int_equal(sa_cu.CtxSetCurrent(primary(0)), CUDA_SUCCESS);
}

static void *pairs_on_a_fresh_thread(void *arg) {
  per_pair *out = arg;
  out[0] = count_pairs(CUPY, 4096, NULL);
  out[1].all = fake_current_device();
  return NULL;
}

/* A thread with no context current gets none back (else its device would
 * switch for good). */
static void stream_0_on_a_thread_with_no_context_leaves_it_with_none(void **state) {
  (void)state;
  per_pair n[2];
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, pairs_on_a_fresh_thread, n), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_true(n[0].capture == 2 && n[0].set_current == 4);
  assert_true(n[1].all == -1); /* none current after */
}

int main(int argc, char **argv) {
  void *h;
  if (argc < 2 || (h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL)) == NULL) {
    fprintf(stderr, "usage: %s path/to/fake/libcuda.so (%s)\n", argv[0], dlerror());
    return 1;
  }
  *(void **)&fake_calls = dlsym(h, "fake_cuda_calls");
  *(void **)&fake_current_device = dlsym(h, "fake_cuda_current_device");
  *(void **)&fake_user_context = dlsym(h, "fake_cuda_user_context");
  if (fake_calls == NULL || fake_current_device == NULL || fake_user_context == NULL) return 1;
  /* The library's loader takes the fake for libcuda.so.1: sa_cu is its. */
  if (sa_cu_load() != SA_OK) return 1;
  /* The hooks' default arenas. Without kept spans: the large pairs here
   * count the calls of the span path itself; a kept pair makes none
   * (test/kept_span_test.c counts them). */
  setenv("STREAMARENA_CONF", "backend=cuda,keep_spans=0", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_pair_on_a_named_stream_asks_only_whether_it_is_captured),
      cmocka_unit_test(a_pair_on_stream_0_reads_the_context_and_asks_once_per_call),
      cmocka_unit_test(a_large_pair_asks_no_more_than_a_small_one),
      cmocka_unit_test(stream_0_with_another_device_current_switches_once_per_call),
      cmocka_unit_test(stream_0_on_a_thread_with_no_context_leaves_it_with_none),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  sa_default_arenas_shutdown();
  return failed;
}
