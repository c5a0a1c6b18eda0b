/* Graph pools on a GPU, with real graphs (cuStreamBeginCapture,
 * cuGraphInstantiateWithFlags, cuGraphLaunch): pool_test.c's cases where
 * the driver, not the simulator, says what a capture refuses. Skipped
 * where no CUDA device is usable (CI). On a machine with a GPU, after
 * tools/gpu-check.sh:
 *   bash .gpu/run.sh --only=gpu_pool_test
 *
 * A graph here writes a pattern over its pool block (mad_words with mul
 * 0) and checks it (check_words, counting wrong words into host-mapped
 * memory). "A launch still running" is made deterministic with a gate: a
 * cuStreamWaitValue64 on host-mapped memory holds the launch stream until
 * the test opens it, after the calls under test returned (so they never
 * waited on the host for it, or the test would hang).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include <streamarena/streamarena.h>

#include "cuda_kernels.h"
#include "fixture.h"
#include "test/util.h"

typedef struct gpu_s {
  sa_arena *arena;
  CUdevice dev;
  CUcontext ctx;
  CUmodule mad_module, check_module;
  CUfunction mad, check;
  volatile uint64_t *host; /* [0] the gate, [1] wrong words seen */
  CUdeviceptr dev_gate, dev_bad;
} gpu;

static gpu g;

static int setup(void **state) {
  (void)state;
  return 0;
}

/* The arena, the context, the kernels and the host-mapped words; skips
 * where CUDA is not usable. */
static void gpu_open(void) {
  if (sa_cu_load_all() != SA_OK) skip();
  sa_status st = sa_fixture_arena_create(&g.arena, "backend=cuda");
  if (st == SA_ERR_NO_DEVICE) {
    const char *why;
    (void)sa_last_driver_error(&why);
    printf("gpu_pool_test: no usable device (%s), skipped\n", why);
    skip();
  }
  sa_assert_ok(st);
  SA_CU_OK(sa_cu.DeviceGet(&g.dev, 0));
  SA_CU_OK(sa_cu.DevicePrimaryCtxRetain(&g.ctx, g.dev));
  SA_CU_OK(sa_cu.CtxSetCurrent(g.ctx));
  SA_CU_OK(sa_cu.ModuleLoadData(&g.mad_module, sa_cu_mad_words_ptx));
  SA_CU_OK(sa_cu.ModuleGetFunction(&g.mad, g.mad_module, "mad_words"));
  SA_CU_OK(sa_cu.ModuleLoadData(&g.check_module, sa_cu_check_words_ptx));
  SA_CU_OK(sa_cu.ModuleGetFunction(&g.check, g.check_module, "check_words"));
  void *host;
  SA_CU_OK(sa_cu.MemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  g.host = host;
  g.host[0] = g.host[1] = 0;
  CUdeviceptr d;
  SA_CU_OK(sa_cu.MemHostGetDevicePointer(&d, host, 0));
  g.dev_gate = d;
  g.dev_bad = d + sizeof(uint64_t);
}

static int teardown(void **state) {
  (void)state;
  if (g.arena == NULL) return 0;
  (void)sa_cu.CtxSynchronize();
  if (g.host != NULL) (void)sa_cu.MemFreeHost((void *)g.host);
  if (g.mad_module != NULL) (void)sa_cu.ModuleUnload(g.mad_module);
  if (g.check_module != NULL) (void)sa_cu.ModuleUnload(g.check_module);
  sa_status st = sa_arena_destroy(g.arena);
  (void)sa_cu.DevicePrimaryCtxRelease(g.dev);
  g = (gpu){0};
  return st == SA_OK ? 0 : -1;
}

static CUstream new_stream(void) {
  CUstream s;
  SA_CU_OK(sa_cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING));
  return s;
}

/* s released to the arena (which may have seen it) and destroyed. */
static void drop_stream(CUstream s) {
  SA_CU_OK(sa_cu.StreamSynchronize(s));
  sa_assert_ok(sa_stream_release(g.arena, (sa_stream)s));
  SA_CU_OK(sa_cu.StreamDestroy(s));
}

/* Enqueue on s: p's size bytes become value (mad_words, mul 0). */
static void fill(CUstream s, void *p, size_t size, uint32_t value) {
  CUdeviceptr dp = (CUdeviceptr)p;
  unsigned n = (unsigned)(size / 4), mul = 0, add = value;
  void *args[] = {&dp, &n, &mul, &add};
  SA_CU_OK(sa_cu.LaunchKernel(g.mad, 120, 1, 1, 256, 1, 1, 0, s, args, NULL));
}

/* Enqueue on s: count p's words that are not value into g.host[1]. */
static void check(CUstream s, void *p, size_t size, uint32_t value) {
  CUdeviceptr dp = (CUdeviceptr)p, bad = g.dev_bad;
  unsigned n = (unsigned)(size / 4), v = value;
  void *args[] = {&dp, &n, &v, &bad};
  SA_CU_OK(sa_cu.LaunchKernel(g.check, 120, 1, 1, 256, 1, 1, 0, s, args, NULL));
}

static void begin(CUstream s) { SA_CU_OK(sa_cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL)); }

/* Ends s's capture, which must have stayed intact, and instantiates it. */
static CUgraphExec end(CUstream s) {
  CUgraph graph;
  SA_CU_OK(sa_cu.StreamEndCapture(s, &graph));
  CUgraphExec exec;
  SA_CU_OK(sa_cu.GraphInstantiateWithFlags(&exec, graph, 0));
  SA_CU_OK(sa_cu.GraphDestroy(graph));
  return exec;
}

static bool overlap(const void *p, size_t n, const void *q, size_t m) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
  return a < b + m && b < a + n;
}

/* ---- the cases ----------------------------------------------------------- */

/* A capture on a stream the arena never saw allocates from a pool, frees
 * and reuses in capture order, and its graph replays at those addresses;
 * another stream never gets what the capture freed. */
static void a_capture_allocates_from_its_pool_and_replays(void **state) {
  (void)state;
  gpu_open();
  CUstream s = new_stream(), launch = new_stream(), other = new_stream();
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(g.arena, &pool));
  void *x, *tmp, *again, *elsewhere;
  begin(s);
  sa_assert_ok(sa_pool_alloc(pool, &x, 1 * MiB, (sa_stream)s));
  sa_assert_ok(sa_pool_alloc(pool, &tmp, 3 * MiB, (sa_stream)s));
  fill(s, tmp, 3 * MiB, 0x7777u);
  sa_assert_ok(sa_free(tmp, (sa_stream)s));
  sa_assert_ok(sa_pool_alloc(pool, &elsewhere, 3 * MiB, (sa_stream)other));
  assert_false(overlap(elsewhere, 3 * MiB, tmp, 3 * MiB));
  sa_assert_ok(sa_pool_alloc(pool, &again, 3 * MiB, (sa_stream)s));
  assert_ptr_equal(again, tmp);
  fill(s, x, 1 * MiB, 0xA11u);
  fill(s, again, 3 * MiB, 0xB22u);
  check(s, x, 1 * MiB, 0xA11u);
  sa_assert_ok(sa_free(again, (sa_stream)s));
  CUgraphExec exec = end(s);
  for (int i = 0; i < 3; i++) SA_CU_OK(sa_cu.GraphLaunch(exec, launch));
  SA_CU_OK(sa_cu.StreamSynchronize(launch));
  assert_int_equal(g.host[1], 0);
  SA_CU_OK(sa_cu.GraphExecDestroy(exec));
  sa_assert_ok(sa_free(x, (sa_stream)launch));
  sa_assert_ok(sa_free(elsewhere, (sa_stream)other));
  sa_assert_ok(sa_pool_release(pool, (sa_stream)launch));
  drop_stream(s);
  drop_stream(launch);
  drop_stream(other);
}

/* Two captures share one pool: the second reuses what the first freed on
 * the same stream; both graphs replay, each release is one use. */
static void two_captures_share_one_pool(void **state) {
  (void)state;
  gpu_open();
  CUstream s = new_stream(), launch = new_stream();
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(g.arena, &pool));
  sa_assert_ok(sa_pool_retain(pool));
  void *out1, *tmp1, *out2, *tmp2;
  begin(s);
  sa_assert_ok(sa_pool_alloc(pool, &out1, 256 * KiB, (sa_stream)s));
  sa_assert_ok(sa_pool_alloc(pool, &tmp1, 512 * KiB, (sa_stream)s));
  fill(s, tmp1, 512 * KiB, 1);
  fill(s, out1, 256 * KiB, 0x0111u);
  sa_assert_ok(sa_free(tmp1, (sa_stream)s));
  CUgraphExec g1 = end(s);
  begin(s);
  sa_assert_ok(sa_pool_alloc(pool, &tmp2, 512 * KiB, (sa_stream)s));
  assert_ptr_equal(tmp2, tmp1);
  sa_assert_ok(sa_pool_alloc(pool, &out2, 256 * KiB, (sa_stream)s));
  assert_false(overlap(out2, 256 * KiB, out1, 256 * KiB));
  fill(s, tmp2, 512 * KiB, 2);
  fill(s, out2, 256 * KiB, 0x0222u);
  sa_assert_ok(sa_free(tmp2, (sa_stream)s));
  CUgraphExec g2 = end(s);
  for (int i = 0; i < 2; i++) {
    SA_CU_OK(sa_cu.GraphLaunch(g1, launch));
    SA_CU_OK(sa_cu.GraphLaunch(g2, launch));
  }
  check(launch, out1, 256 * KiB, 0x0111u);
  check(launch, out2, 256 * KiB, 0x0222u);
  SA_CU_OK(sa_cu.StreamSynchronize(launch));
  assert_int_equal(g.host[1], 0);
  SA_CU_OK(sa_cu.GraphExecDestroy(g1));
  sa_assert_ok(sa_pool_release(pool, (sa_stream)launch));
  SA_CU_OK(sa_cu.GraphExecDestroy(g2));
  sa_assert_ok(sa_free(out1, (sa_stream)launch));
  sa_assert_ok(sa_free(out2, (sa_stream)launch));
  sa_assert_ok(sa_pool_release(pool, (sa_stream)launch));
  sa_pool_stats ps;
  sa_assert_ok(sa_pool_get_stats(pool, &ps));
  assert_int_equal(ps.reserved_bytes, 0);
  drop_stream(s);
  drop_stream(launch);
}

/* The last release while a launch is held behind the gate: the release
 * returns at once, the arena hands the segment's memory to another
 * stream, whose overwrite must wait for the launch (its check inside the
 * graph sees its own pattern, not the overwrite). */
static void the_last_release_waits_for_the_last_launch(void **state) {
  (void)state;
  gpu_open();
  CUstream s = new_stream(), launch = new_stream(), next = new_stream();
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(g.arena, &pool));
  void *x;
  begin(s);
  sa_assert_ok(sa_pool_alloc(pool, &x, 2 * MiB, (sa_stream)s));
  fill(s, x, 2 * MiB, 0xC0DEu);
  check(s, x, 2 * MiB, 0xC0DEu);
  sa_assert_ok(sa_free(x, (sa_stream)s));
  CUgraphExec exec = end(s);
  sa_pool_stats ps;
  sa_assert_ok(sa_pool_get_stats(pool, &ps));
  size_t seg = ps.reserved_bytes;

  g.host[0] = 0;
  SA_CU_OK(sa_cu.StreamWaitValue64(launch, g.dev_gate, 1, CU_STREAM_WAIT_VALUE_GEQ));
  SA_CU_OK(sa_cu.GraphLaunch(exec, launch));
  sa_assert_ok(sa_pool_release(pool, (sa_stream)launch)); /* must not wait on the host */
  void *q;
  sa_assert_ok(sa_alloc(g.arena, &q, seg, (sa_stream)next));
  bool same = overlap(q, seg, x, 2 * MiB);
  fill(next, q, seg, 0xDEADu); /* must run after the launch, if q is x's memory */
  g.host[0] = 1; /* the gate opens */
  SA_CU_OK(sa_cu.StreamSynchronize(launch));
  SA_CU_OK(sa_cu.StreamSynchronize(next));
  assert_int_equal(g.host[1], 0); /* the graph's check saw its own fill */
  /* next's fill came last: had it run at once, before the gate opened,
   * the launch's fill would have overwritten it. */
  check(next, q, seg, 0xDEADu);
  SA_CU_OK(sa_cu.StreamSynchronize(next));
  assert_int_equal(g.host[1], 0);
  if (!same) printf("gpu_pool_test: the arena handed other memory; the order went untested\n");
  SA_CU_OK(sa_cu.GraphExecDestroy(exec));
  sa_assert_ok(sa_free(q, (sa_stream)next));
  drop_stream(s);
  drop_stream(launch);
  drop_stream(next);
}

/* Bad input on the GPU: a release during a capture of its stream is
 * refused and leaves the capture intact; after the last release every
 * call is refused. */
static void bad_input_is_refused(void **state) {
  (void)state;
  gpu_open();
  CUstream s = new_stream();
  sa_pool *pool;
  void *p;
  sa_assert_ok(sa_pool_create(g.arena, &pool));
  begin(s);
  sa_assert_status(sa_pool_release(pool, (sa_stream)s), SA_ERR_STREAM_CAPTURING);
  sa_assert_ok(sa_pool_alloc(pool, &p, 4096, (sa_stream)s));
  sa_assert_ok(sa_free(p, (sa_stream)s));
  sa_assert_status(sa_free(p, (sa_stream)s), SA_ERR_DOUBLE_FREE);
  CUgraphExec exec = end(s); /* intact */
  SA_CU_OK(sa_cu.GraphExecDestroy(exec));
  sa_assert_ok(sa_pool_release(pool, (sa_stream)s));
  sa_assert_status(sa_pool_alloc(pool, &p, 4096, (sa_stream)s), SA_ERR_INVALID_ARGUMENT);
  sa_assert_status(sa_pool_retain(pool), SA_ERR_INVALID_ARGUMENT);
  sa_assert_status(sa_pool_release(pool, (sa_stream)s), SA_ERR_INVALID_ARGUMENT);
  drop_stream(s);
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(a_capture_allocates_from_its_pool_and_replays),
      T(two_captures_share_one_pool),
      T(the_last_release_waits_for_the_last_launch),
      T(bad_input_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
