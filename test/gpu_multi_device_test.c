/* Two real GPUs (the CUDA backend): per-device arenas and peer access.
 * Skips, saying why, where CUDA or a second device is missing (as in CI;
 * multi_device_test checks the same bookkeeping on the host simulator).
 *
 *   - sa_malloc_async follows the thread's current context: threads that
 *     switch devices with cuCtxSetCurrent get memory of the device current
 *     at each call (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL), never the other's;
 *     a stream of the other device is SA_ERR_UNKNOWN_STREAM;
 *   - an arena refuses streams of another device, naming the reason;
 *   - NULL is the legacy stream of the thread's current context: device
 *     1's arena orders a reuse after device 1's legacy stream while device
 *     1 is current, and refuses NULL in every call while device 0 is;
 *   - with peer_access=1 an arena of device 0 is read and written by a PTX
 *     kernel on device 1 after growth, stitching under a physical cap, a
 *     trim to nothing and a new superblock size; cuMemGetAccess says
 *     read-write for device 1 on every block.
 *
 * On a machine with two GPUs, after tools/gpu-check.sh staged .gpu/:
 *   bash .gpu/run.sh --only=gpu_multi_device_test
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <streamarena/streamarena.h>

#include "cuda_kernels.h"
#include "device_switch.h"
#include "fixture.h"
#include "test/util.h"

/* Arena specs (sa_fixture_arena_create) start with this. */
#define ON_CUDA "backend=cuda,"

static struct {
  const char *skip_reason;
  CUdevice dev[2];
  CUcontext ctx[2]; /* primary contexts */
  CUmodule module;  /* mad_words, loaded on device 1 */
  CUfunction mad;
  unsigned switches, allocations, peer_kernels;
  unsigned long long peer_words;
} g;

static int group_setup(void **state) {
  (void)state;
  static char why[160];
  int n = 0;
  if (sa_cu_load_all() != SA_OK) {
    g.skip_reason = "libcuda.so.1 is not usable";
    return 0;
  }
  if (sa_cu.DeviceGetCount(&n) != CUDA_SUCCESS || n < 2) {
    snprintf(why, sizeof why, "this machine has %d CUDA device(s), the test needs 2", n);
    g.skip_reason = why;
    return 0;
  }
  for (int i = 0; i < 2; i++) {
    if (sa_cu.DeviceGet(&g.dev[i], i) != CUDA_SUCCESS ||
        sa_cu.DevicePrimaryCtxRetain(&g.ctx[i], g.dev[i]) != CUDA_SUCCESS)
      return -1;
  }
  if (sa_cu.CtxSetCurrent(g.ctx[1]) != CUDA_SUCCESS) return -1;
  CUresult r = sa_cu.ModuleLoadData(&g.module, sa_cu_mad_words_ptx);
  if (r == CUDA_SUCCESS) r = sa_cu.ModuleGetFunction(&g.mad, g.module, "mad_words");
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "gpu_multi_device: the PTX kernel did not load on device 1: %s\n",
            sa_cu_error_name(r));
    return -1;
  }
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  if (g.skip_reason != NULL) return 0;
  int bad = sa_cu.CtxSetCurrent(g.ctx[1]) != CUDA_SUCCESS;
  bad |= sa_cu.ModuleUnload(g.module) != CUDA_SUCCESS;
  for (int i = 0; i < 2; i++) bad |= sa_cu.DevicePrimaryCtxRelease(g.dev[i]) != CUDA_SUCCESS;
  return bad ? -1 : 0;
}

static void need_devices(void) {
  if (g.skip_reason != NULL) skip();
}

static int ordinal_of(const void *p) {
  int ordinal = -1;
  SA_CU_OK(sa_cu.PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                               (CUdeviceptr)(uintptr_t)p));
  return ordinal;
}

/* A non-blocking stream of device dev's primary context. */
static CUstream stream_of(int dev) {
  CUstream s = NULL;
  SA_CU_OK(sa_cu.CtxSetCurrent(g.ctx[dev]));
  SA_CU_OK(sa_cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING));
  return s;
}

/* ---- per-device arenas ------------------------------------------------- */

enum { SWITCH_THREADS = 2, SWITCH_ROUNDS = 200 };

static sa_status cuda_set_device(int dev) {
  return sa_cu.CtxSetCurrent(g.ctx[dev]) == CUDA_SUCCESS ? SA_OK : SA_ERR_DRIVER;
}

static sa_status cuda_stream_create(sa_stream *out) {
  CUstream s = NULL;
  if (sa_cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return SA_ERR_DRIVER;
  *out = (sa_stream)s;
  return SA_OK;
}

static sa_status cuda_stream_destroy(sa_stream s) {
  return sa_cu.StreamDestroy((CUstream)s) == CUDA_SUCCESS ? SA_OK : SA_ERR_DRIVER;
}

static int cuda_pointer_device(const void *p) {
  int ordinal = -1;
  if (sa_cu.PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
    return -1;
  return ordinal;
}

static const sa_switch_ops cuda_switch = {cuda_set_device, cuda_stream_create,
                                          cuda_stream_destroy, cuda_pointer_device};

static void default_arena_follows_the_current_context(void **state) {
  (void)state;
  need_devices();
  static const size_t sizes[] = {256, 4096, 100000, 1536 * 1024, 9 * MiB};
  sa_switch_result r;
  sa_switch_run(&cuda_switch, SWITCH_THREADS, SWITCH_ROUNDS, sizes, 5, &r);
  g.allocations = r.allocations;
  g.switches = SWITCH_THREADS * SWITCH_ROUNDS;
  for (int dev = 0; dev < 2; dev++) {
    sa_arena *a = NULL;
    sa_assert_ok(sa_default_arena(dev, &a));
    assert_int_equal(sa_arena_backend(a), SA_BACKEND_CUDA);
  }
  printf("gpu_multi_device: default arenas, %d threads switching devices, allocations %u, from "
         "the wrong device %u, foreign streams accepted %u, failures %u\n",
         SWITCH_THREADS, g.allocations, r.wrong_device, r.foreign_taken, r.failures);
  sa_default_arenas_shutdown();
  assert_int_equal(r.wrong_device, 0);
  assert_int_equal(r.foreign_taken, 0);
  assert_int_equal(r.failures, 0);
  assert_int_equal(r.allocations, SWITCH_THREADS * SWITCH_ROUNDS);
}

static void arena_refuses_streams_of_another_device(void **state) {
  (void)state;
  need_devices();
  sa_arena *a0 = NULL, *a1 = NULL;
  sa_assert_ok(sa_fixture_arena_create(&a0, ON_CUDA "device=0"));
  sa_assert_ok(sa_fixture_arena_create(&a1, ON_CUDA "device=1"));
  CUstream s0 = stream_of(0), s1 = stream_of(1);
  void *p0 = NULL, *p1 = NULL, *q = &q;
  sa_assert_ok(sa_alloc(a0, &p0, 5 * MiB, (sa_stream)s0));
  sa_assert_ok(sa_alloc(a1, &p1, 4096, (sa_stream)s1));
  assert_int_equal(ordinal_of(p0), 0);
  assert_int_equal(ordinal_of(p1), 1);
  assert_int_equal(sa_alloc(a0, &q, 4096, (sa_stream)s1), SA_ERR_UNKNOWN_STREAM);
  assert_null(q);
  sa_fixture_assert_driver_error("stream of another device");
  assert_int_equal(sa_alloc(a1, &q, 4096, (sa_stream)s0), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(sa_free(p1, (sa_stream)s0), SA_ERR_UNKNOWN_STREAM); /* still live */
  assert_int_equal(sa_record_stream(p0, (sa_stream)s1), SA_ERR_UNKNOWN_STREAM);
  sa_assert_ok(sa_free(p0, (sa_stream)s0));
  sa_assert_ok(sa_free(p1, (sa_stream)s1));
  sa_assert_ok(sa_stream_release(a0, (sa_stream)s0));
  sa_assert_ok(sa_stream_release(a1, (sa_stream)s1));
  sa_assert_ok(sa_arena_destroy(a0));
  sa_assert_ok(sa_arena_destroy(a1));
  SA_CU_OK(sa_cu.StreamDestroy(s0));
  SA_CU_OK(sa_cu.StreamDestroy(s1));
}

/* ---- NULL: the legacy stream of the current context -------------------- */

/* NULL with device 1's primary context current is device 1's legacy
 * stream, where the thread's own kernels on stream 0 go: a span freed on it
 * behind such a kernel (mad_words, launched again and again so that it is
 * still running at the handout) goes to a non-blocking stream of device 1
 * only behind that kernel. The new owner's memset then lands last: every
 * word reads as its pattern, not as the kernel's seed * 3 + 1. */
static void null_is_the_arenas_legacy_stream_while_its_context_is_current(void **state) {
  (void)state;
  need_devices();
  sa_arena *a1 = NULL;
  sa_assert_ok(sa_fixture_arena_create(&a1, ON_CUDA "device=1,peer_access=0,max_physical=64MiB"));
  CUstream s1 = stream_of(1); /* leaves device 1 current */
  const size_t bytes = 48 * MiB; /* one fits under the cap, two do not */
  void *p = NULL, *q = NULL;
  sa_assert_ok(sa_alloc(a1, &p, bytes, NULL));
  SA_CU_OK(sa_cu.MemsetD32Async((CUdeviceptr)(uintptr_t)p, 7, bytes / 4, NULL));
  CUdeviceptr dp = (CUdeviceptr)(uintptr_t)p;
  unsigned n = (unsigned)(bytes / 4), mul = 3, add = 1;
  void *args[] = {&dp, &n, &mul, &add};
  for (int i = 0; i < 64; i++)
    SA_CU_OK(sa_cu.LaunchKernel(g.mad, 264, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
  sa_assert_ok(sa_free(p, NULL));
  sa_assert_ok(sa_alloc(a1, &q, bytes, (sa_stream)s1));
  assert_ptr_equal(q, p);
  SA_CU_OK(sa_cu.MemsetD32Async((CUdeviceptr)(uintptr_t)q, 0x5A5A5A5Au, bytes / 4, s1));
  SA_CU_OK(sa_cu.StreamSynchronize(s1));
  SA_CU_OK(sa_cu.StreamSynchronize(NULL));
  uint32_t *host = malloc(bytes);
  assert_non_null(host);
  SA_CU_OK(sa_cu.MemcpyDtoH(host, (CUdeviceptr)(uintptr_t)q, bytes));
  unsigned long long wrong = 0;
  for (size_t i = 0; i < bytes / 4; i++) wrong += host[i] != 0x5A5A5A5Au;
  free(host);
  printf("gpu_multi_device: NULL with device 1 current: a span freed behind 64 kernels on its "
         "legacy stream went to another stream, %llu words wrong\n", wrong);
  sa_assert_ok(sa_free(q, (sa_stream)s1));
  sa_assert_ok(sa_stream_release(a1, (sa_stream)s1));
  sa_assert_ok(sa_stream_release(a1, NULL));
  sa_assert_ok(sa_arena_destroy(a1));
  SA_CU_OK(sa_cu.StreamDestroy(s1));
  assert_int_equal(wrong, 0);
}

/* NULL passed to device 1's arena while device 0's primary context is
 * current names device 0's legacy stream: refused with
 * SA_ERR_UNKNOWN_STREAM by every call, naming both devices, also where the
 * thread's cache holds an entry for NULL made while device 1 was current;
 * nothing changes, and with device 1 current again the calls work. */
static void null_of_another_devices_context_is_refused(void **state) {
  (void)state;
  need_devices();
  sa_arena *a1 = NULL;
  sa_assert_ok(sa_fixture_arena_create(&a1, ON_CUDA "device=1,peer_access=0"));
  CUstream s1 = stream_of(1);
  void *other = NULL, *span = NULL, *small = NULL, *q = &q;
  sa_assert_ok(sa_alloc(a1, &other, 4096, (sa_stream)s1));
  sa_assert_ok(sa_alloc(a1, &span, 3 * MiB, NULL));
  sa_assert_ok(sa_alloc(a1, &small, 4096, NULL));
  sa_stats was, now;
  sa_assert_ok(sa_get_stats(a1, &was));
  SA_CU_OK(sa_cu.CtxSetCurrent(g.ctx[0]));
  assert_int_equal(sa_alloc(a1, &q, 4096, NULL), SA_ERR_UNKNOWN_STREAM);
  assert_null(q);
  sa_fixture_assert_driver_error("NULL stream of another device: it names the legacy stream of "
                                 "device 0");
  sa_fixture_assert_driver_error("make device 1 current");
  assert_int_equal(sa_alloc(a1, &q, 3 * MiB, NULL), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(sa_alloc(a1, &q, 4096, (sa_stream)CU_STREAM_LEGACY), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(sa_free(small, NULL), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(sa_free(span, NULL), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(sa_record_stream(small, NULL), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(sa_record_stream(other, NULL), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(sa_stream_release(a1, NULL), SA_ERR_UNKNOWN_STREAM);
  sa_assert_ok(sa_get_stats(a1, &now));
  assert_int_equal(now.alloc_count, was.alloc_count);
  assert_int_equal(now.free_count, was.free_count);
  assert_int_equal(now.live_bytes, was.live_bytes);
  SA_CU_OK(sa_cu.CtxSetCurrent(g.ctx[1]));
  sa_assert_ok(sa_free(small, NULL));
  sa_assert_ok(sa_free(span, NULL));
  sa_assert_ok(sa_free(other, (sa_stream)s1));
  sa_assert_ok(sa_stream_release(a1, NULL));
  sa_assert_ok(sa_stream_release(a1, (sa_stream)s1));
  sa_assert_ok(sa_arena_destroy(a1));
  SA_CU_OK(sa_cu.StreamDestroy(s1));
}

/* ---- peer access ------------------------------------------------------- */

typedef struct peer_s {
  sa_arena *a;
  CUstream s0, s1;
  uint32_t *host;
  unsigned long long wrong;
} peer;

/* Device 0 writes seed over the block, then device 1's kernel reads and
 * rewrites every word (seed * 3 + 1); device 0 reads the result back. The
 * streams are ordered by the host here (synchronize), as the user must:
 * events of one device's arena cannot be recorded on another's streams. */
static void peer_touch(peer *t, void *p, size_t bytes, uint32_t seed) {
  unsigned long long flags = 0;
  CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1};
  SA_CU_OK(sa_cu.MemGetAccess(&flags, &loc, (CUdeviceptr)(uintptr_t)p));
  assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  SA_CU_OK(sa_cu.CtxSetCurrent(g.ctx[0]));
  SA_CU_OK(sa_cu.MemsetD32Async((CUdeviceptr)(uintptr_t)p, seed, bytes / 4, t->s0));
  SA_CU_OK(sa_cu.StreamSynchronize(t->s0));
  SA_CU_OK(sa_cu.CtxSetCurrent(g.ctx[1]));
  CUdeviceptr dp = (CUdeviceptr)(uintptr_t)p;
  unsigned n = (unsigned)(bytes / 4), mul = 3, add = 1;
  void *args[] = {&dp, &n, &mul, &add};
  SA_CU_OK(sa_cu.LaunchKernel(g.mad, 264, 1, 1, 256, 1, 1, 0, t->s1, args, NULL));
  SA_CU_OK(sa_cu.StreamSynchronize(t->s1));
  SA_CU_OK(sa_cu.CtxSetCurrent(g.ctx[0]));
  SA_CU_OK(sa_cu.MemcpyDtoH(t->host, dp, bytes));
  for (size_t i = 0; i < bytes / 4; i++) t->wrong += t->host[i] != seed * 3 + 1;
  g.peer_kernels++;
  g.peer_words += bytes / 4;
}

static void peer_kernel_after_growth_stitching_and_trim(void **state) {
  (void)state;
  need_devices();
  peer t = {0};
  sa_assert_ok(sa_fixture_arena_create(
      &t.a, ON_CUDA "device=0,peer_access=1,max_physical=64MiB,superblock_size=2MiB"));
  t.s0 = stream_of(0);
  t.s1 = stream_of(1);
  t.host = malloc(48 * MiB);
  assert_non_null(t.host);
  enum { N = 19 };
  void *p[N];
  size_t size[N];
  /* Growth: 16 small blocks (4 superblocks) and 3 spans of 8 MiB. */
  for (int i = 0; i < N; i++) {
    size[i] = i < 16 ? 512 << 10 : 8 * MiB;
    sa_assert_ok(sa_alloc(t.a, &p[i], size[i], (sa_stream)t.s0));
    peer_touch(&t, p[i], size[i], 0x100u + (unsigned)i);
  }
  for (int i = 0; i < N; i++) sa_assert_ok(sa_free(p[i], (sa_stream)t.s0));
  /* Stitching: 48 MiB under a 64 MiB cap with 32 MiB held comes from the
   * freed memory's chunks, unmapped and mapped again. */
  sa_assert_ok(sa_defragment(t.a));
  void *big = NULL;
  sa_assert_ok(sa_alloc(t.a, &big, 48 * MiB, (sa_stream)t.s0));
  sa_stats st;
  sa_assert_ok(sa_get_stats(t.a, &st));
  assert_true(st.reserved_bytes <= 64 * MiB);
  peer_touch(&t, big, 48 * MiB, 0x200u);
  sa_assert_ok(sa_free(big, (sa_stream)t.s0));
  /* Everything back to the device, then growth again. */
  sa_assert_ok(sa_trim(t.a, 0));
  sa_assert_ok(sa_get_stats(t.a, &st));
  assert_int_equal(st.reserved_bytes, 0);
  sa_assert_ok(sa_alloc(t.a, &big, 6 * MiB, (sa_stream)t.s0));
  peer_touch(&t, big, 6 * MiB, 0x300u);
  sa_assert_ok(sa_free(big, (sa_stream)t.s0));
  /* Superblocks of another size. */
  sa_assert_ok(sa_set_superblock_size(t.a, 4 * MiB));
  for (int i = 0; i < 4; i++) {
    sa_assert_ok(sa_alloc(t.a, &p[i], 1536 << 10, (sa_stream)t.s0));
    peer_touch(&t, p[i], 1536 << 10, 0x400u + (unsigned)i);
  }
  for (int i = 0; i < 4; i++) sa_assert_ok(sa_free(p[i], (sa_stream)t.s0));
  printf("gpu_multi_device: peer_access=1: %u kernels of device 1 read and rewrote %llu words "
         "of device 0's memory, %llu wrong\n",
         g.peer_kernels, g.peer_words, t.wrong);
  sa_assert_ok(sa_stream_release(t.a, (sa_stream)t.s0));
  sa_assert_ok(sa_arena_destroy(t.a));
  SA_CU_OK(sa_cu.StreamDestroy(t.s0));
  SA_CU_OK(sa_cu.StreamDestroy(t.s1));
  free(t.host);
  assert_int_equal(t.wrong, 0);
}

/* A device that does not exist is refused at create, naming it. (A pair
 * that cannot access each other is only refused where the hardware says
 * so: cuDeviceCanAccessPeer; H200s on one host can.) */
static void peer_access_checks_at_create(void **state) {
  (void)state;
  need_devices();
  int n = 0;
  SA_CU_OK(sa_cu.DeviceGetCount(&n));
  sa_arena *a = NULL;
  if (n < 64) {
    sa_assert_status(sa_fixture_arena_create(&a, ON_CUDA "device=0,peer_access=%d", n),
                     SA_ERR_NO_DEVICE);
    assert_null(a);
    sa_fixture_assert_driver_error("peer_access names device");
  }
  sa_status st = sa_fixture_arena_create(&a, ON_CUDA "device=1,peer_access=all");
  if (st == SA_ERR_NOT_SUPPORTED) {
    sa_fixture_assert_driver_error("cannot access");
    printf("gpu_multi_device: peer_access=all refused on this machine (no peer path)\n");
    return;
  }
  sa_assert_ok(st);
  sa_assert_ok(sa_arena_destroy(a));
}

int main(void) {
  /* This test's default arenas are CUDA's whatever the environment says. */
  setenv("STREAMARENA_CONF", "backend=cuda", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(default_arena_follows_the_current_context),
      cmocka_unit_test(arena_refuses_streams_of_another_device),
      cmocka_unit_test(null_is_the_arenas_legacy_stream_while_its_context_is_current),
      cmocka_unit_test(null_of_another_devices_context_is_refused),
      cmocka_unit_test(peer_kernel_after_growth_stitching_and_trim),
      cmocka_unit_test(peer_access_checks_at_create),
  };
  int failed = cmocka_run_group_tests(tests, group_setup, group_teardown);
  if (g.skip_reason != NULL) {
    printf("gpu_multi_device: skipped (%s), devices 0, failures %d\n", g.skip_reason, failed);
  } else {
    printf("gpu_multi_device: devices 2, threads %d, device switches %u, allocations %u, peer "
           "kernels %u, peer words %llu, failures %d\n",
           SWITCH_THREADS, g.switches, g.allocations, g.peer_kernels, g.peer_words, failed);
  }
  return failed;
}
