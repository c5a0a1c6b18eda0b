/* Stream-ordering torture on a real GPU (the CUDA backend). Skips where no
 * CUDA device is usable, as in CI.
 *
 * A slow writer keeps using a block on one stream after the block's free
 * was enqueued: a spin kernel (PTX text loaded with cuModuleLoadData) that
 * burns ~0.1 s of clock cycles before writing pattern X, or a long chain of
 * cuMemsetD32Async over a scratch buffer ending with X. Meanwhile the
 * allocator hands the same memory to another stream (or back to the owner
 * after a cross-stream free or sa_record_stream), which writes pattern Y at
 * once. If the handout was ordered behind the slow writer (an event that
 * completed, or a cuStreamWaitEvent edge), the final contents are all Y; a
 * handout that came too early leaves X. A control run without any ordering
 * must end as X, proving the writer really was late; and every scenario
 * checks that the writer was still running when the memory was handed out.
 *
 * The allocator runs through the public API with backend=cuda; the extra
 * driver calls the test needs (modules, launches, its own streams, copies)
 * go through libcuda.so.1 (driver/cuda_loader.h), in the same primary context of
 * the device under test: STREAMARENA_TEST_DEVICE (an ordinal, default 0).
 * A device the machine does not have skips every case, saying so.
 *
 * On the GPU machine (after tools/gpu-check.sh staged .gpu/):
 *   bash .gpu/run.sh --only=gpu_torture_test --sanitize=gpu_torture_test
 *   STREAMARENA_TEST_DEVICE=1 bash .gpu/run.sh --only=gpu_torture_test
 * Under compute-sanitizer the streams may not overlap; the test then says
 * so ("ordering observable no") and checks contents and accesses only.
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
#include "test/util.h"

#define PATTERN_X 0x58585858u /* the slow writer's */
#define PATTERN_Y 0x59595959u /* the new owner's */
#define SPIN_CYCLES 200000000ull /* ~0.1 s at 2 GHz */
#define CHAIN_LENGTH 1024        /* memsets of the scratch buffer */
#define SCRATCH_BYTES (64 * MiB)

/* spin_fill(p, n, value, cycles), PTX for sm_75 and newer: every thread spins until `cycles` clock
 * cycles have passed on its SM, then the grid writes value to p[0..n). */
static const char spin_ptx[] =
    ".version 7.0\n"
    ".target sm_75\n" /* Turing and newer: CUDA 13 dropped older targets */
    ".address_size 64\n"
    ".visible .entry spin_fill(.param .u64 p, .param .u32 n, .param .u32 value,\n"
    "                          .param .u64 cycles)\n"
    "{\n"
    "  .reg .pred %q<3>;\n"
    "  .reg .b32 %r<9>;\n"
    "  .reg .b64 %rd<9>;\n"
    "  ld.param.u64 %rd1, [p];\n"
    "  ld.param.u32 %r1, [n];\n"
    "  ld.param.u32 %r2, [value];\n"
    "  ld.param.u64 %rd2, [cycles];\n"
    "  cvta.to.global.u64 %rd3, %rd1;\n"
    "  mov.u64 %rd4, %clock64;\n"
    "SPIN:\n"
    "  mov.u64 %rd5, %clock64;\n"
    "  sub.s64 %rd6, %rd5, %rd4;\n"
    "  setp.lt.u64 %q1, %rd6, %rd2;\n"
    "  @%q1 bra SPIN;\n"
    "  mov.u32 %r3, %ctaid.x;\n"
    "  mov.u32 %r4, %ntid.x;\n"
    "  mov.u32 %r5, %tid.x;\n"
    "  mad.lo.s32 %r6, %r3, %r4, %r5;\n"
    "  mov.u32 %r7, %nctaid.x;\n"
    "  mul.lo.s32 %r8, %r7, %r4;\n"
    "LOOP:\n"
    "  setp.ge.u32 %q2, %r6, %r1;\n"
    "  @%q2 bra DONE;\n"
    "  mul.wide.u32 %rd7, %r6, 4;\n"
    "  add.s64 %rd8, %rd3, %rd7;\n"
    "  st.global.u32 [%rd8], %r2;\n"
    "  add.s32 %r6, %r6, %r8;\n"
    "  bra LOOP;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

typedef enum slow_kind_e { SLOW_SPIN, SLOW_CHAIN } slow_kind;

static struct {
  const char *skip_reason; /* non-NULL: no usable device, every test skips */
  int ordinal;             /* STREAMARENA_TEST_DEVICE */
  CUdevice dev;
  CUcontext ctx;
  CUmodule module;   /* NULL if the PTX did not load: memset chains only */
  CUfunction spin;
  CUstream s[3];     /* A, B, C */
  /* Figures for the summary line. */
  unsigned scenarios, reused, busy, controls_late;
  bool serialized; /* the device did not overlap the streams (sanitizer) */
  unsigned long long words_checked, words_wrong;
} g;

/* Every driver call is checked (SA_CU_OK): a failure names the call and fails the test. */
#define SA(call)                                                                    \
  do {                                                                              \
    sa_status s_ = (call);                                                          \
    if (s_ != SA_OK) {                                                              \
      const char *dn;                                                               \
      int dc = sa_last_driver_error(&dn);                                           \
      print_error("%s failed: %s (driver: %s, %d)\n", #call, sa_status_string(s_), dn, dc); \
      fail();                                                                       \
    }                                                                               \
  } while (0)

static sa_status make_arena(sa_arena **out) {
  sa_config cfg;
  sa_config_init(&cfg);
  char err[128];
  /* 2 MiB blocks fill a superblock each (large_threshold = superblock):
   * every small handout is a whole superblock, so reuse is predictable.
   * No kept spans: a span freed on A goes back to the arena, for B to
   * take behind A's work (a kept one would serve only A's next request). */
  sa_status st = sa_config_parse(
      &cfg, "backend=cuda,superblock_size=2MiB,large_threshold=2MiB,va_reserve=64GiB,keep_spans=0",
      err, sizeof err);
  if (st != SA_OK) return st;
  cfg.device = g.ordinal;
  return sa_arena_create(&cfg, out);
}

/* STREAMARENA_TEST_DEVICE: the ordinal under test (0 when unset). */
static int test_device(void) {
  const char *v = getenv("STREAMARENA_TEST_DEVICE");
  if (v == NULL || v[0] == '\0') return 0;
  char *end = NULL;
  long n = strtol(v, &end, 10);
  if (end == v || *end != '\0' || n < 0 || n > 1023) {
    fprintf(stderr, "gpu_torture: STREAMARENA_TEST_DEVICE=\"%s\" is not a device ordinal\n", v);
    return -1;
  }
  return (int)n;
}

static int group_setup(void **state) {
  (void)state;
  g.ordinal = test_device();
  if (g.ordinal < 0) return -1;
  sa_arena *probe = NULL;
  sa_status st = make_arena(&probe);
  if (st == SA_ERR_NO_DEVICE) {
    static char why[192];
    const char *name;
    (void)sa_last_driver_error(&name);
    snprintf(why, sizeof why, "device %d: %s", g.ordinal, name != NULL ? name : "no CUDA device");
    g.skip_reason = why;
    return 0;
  }
  if (st != SA_OK) {
    fprintf(stderr, "gpu_torture: arena on the CUDA backend: %s\n", sa_status_string(st));
    return -1;
  }
  if (sa_arena_destroy(probe) != SA_OK) return -1;
  if (sa_cu_load_all() != SA_OK) {
    fprintf(stderr, "gpu_torture: the backend opened but libcuda.so.1 did not load here\n");
    return -1;
  }
  if (sa_cu.DeviceGet(&g.dev, g.ordinal) != CUDA_SUCCESS ||
      sa_cu.DevicePrimaryCtxRetain(&g.ctx, g.dev) != CUDA_SUCCESS ||
      sa_cu.CtxSetCurrent(g.ctx) != CUDA_SUCCESS)
    return -1;
  CUresult r = sa_cu.ModuleLoadData(&g.module, spin_ptx);
  if (r == CUDA_SUCCESS) r = sa_cu.ModuleGetFunction(&g.spin, g.module, "spin_fill");
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "gpu_torture: spin kernel unavailable (%s): memset chains only\n",
            sa_cu_error_name(r));
    if (g.module != NULL) (void)sa_cu.ModuleUnload(g.module);
    g.module = NULL;
  }
  for (int i = 0; i < 3; i++)
    if (sa_cu.StreamCreate(&g.s[i], CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return -1;
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  if (g.skip_reason != NULL) return 0;
  int bad = 0;
  for (int i = 0; i < 3; i++) bad |= sa_cu.StreamDestroy(g.s[i]) != CUDA_SUCCESS;
  if (g.module != NULL) bad |= sa_cu.ModuleUnload(g.module) != CUDA_SUCCESS;
  bad |= sa_cu.DevicePrimaryCtxRelease(g.dev) != CUDA_SUCCESS;
  return bad ? -1 : 0;
}

/* Under compute-sanitizer the device may run the streams one after the
 * other (launches serialized or blocking): the writer can then not be late
 * and the scenarios cannot fail on ordering; they still check the contents
 * and, through the tool, every device access. Plain runs must show the
 * race. The tool is seen by its injection library in our address space. */
static bool under_sanitizer(void) {
  static int known = -1;
  if (known >= 0) return known;
  known = getenv("STREAMARENA_UNDER_SANITIZER") != NULL;
  FILE *maps = fopen("/proc/self/maps", "r");
  char line[512];
  while (!known && maps != NULL && fgets(line, sizeof line, maps) != NULL)
    known = strstr(line, "sanitizer") != NULL && strstr(line, "libasan") == NULL;
  if (maps != NULL) fclose(maps);
  return known;
}

static void need_device(void) {
  if (g.skip_reason != NULL) skip();
  if (sa_cu.CtxSetCurrent(g.ctx) != CUDA_SUCCESS) fail();
}

/* Enqueue the slow writer: X lands on [p, p + bytes) long after this call
 * returns. scratch is only used by the memset chain. */
static void slow_write(slow_kind kind, CUstream s, void *p, size_t bytes, void *scratch) {
  unsigned n = (unsigned)(bytes / 4);
  if (kind == SLOW_SPIN) {
    CUdeviceptr dp = (CUdeviceptr)(uintptr_t)p;
    unsigned long long cycles = SPIN_CYCLES;
    unsigned value = PATTERN_X;
    void *args[] = {&dp, &n, &value, &cycles};
    /* One block on one SM: a grid that filled the GPU would keep the other
     * stream's work from running beside it, so the control could not show
     * the race (seen on the H200: most of a 1024-block writer landed first). */
    SA_CU_OK(sa_cu.LaunchKernel(g.spin, 1, 1, 1, 256, 1, 1, 0, s, args, NULL));
    return;
  }
  for (unsigned i = 0; i < CHAIN_LENGTH; i++)
    SA_CU_OK(sa_cu.MemsetD32Async((CUdeviceptr)(uintptr_t)scratch, i, SCRATCH_BYTES / 4, s));
  SA_CU_OK(sa_cu.MemsetD32Async((CUdeviceptr)(uintptr_t)p, PATTERN_X, n, s));
}

/* The new owner writes Y at once; the slow writer must still be running
 * (else this scenario proved nothing). */
static void fast_write(CUstream writer, CUstream slow, void *q, size_t bytes) {
  SA_CU_OK(sa_cu.MemsetD32Async((CUdeviceptr)(uintptr_t)q, PATTERN_Y, bytes / 4, writer));
  CUresult r = sa_cu.StreamQuery(slow);
  if (r == CUDA_ERROR_NOT_READY) {
    g.busy++;
  } else {
    SA_CU_OK(r);
    if (under_sanitizer()) {
      g.serialized = true; /* see under_sanitizer */
      return;
    }
    print_error("the slow writer had finished before the handout: not a torture, retry "
                "with a longer SPIN_CYCLES / CHAIN_LENGTH\n");
    fail();
  }
}

/* Wait for everything and count the words of [q, q + bytes) that are not
 * want. */
static unsigned long long wrong_words(void *q, size_t bytes, uint32_t want) {
  for (int i = 0; i < 3; i++) SA_CU_OK(sa_cu.StreamSynchronize(g.s[i]));
  uint32_t *host = malloc(bytes);
  assert_non_null(host);
  SA_CU_OK(sa_cu.MemcpyDtoH(host, (CUdeviceptr)(uintptr_t)q, bytes));
  unsigned long long bad = 0;
  for (size_t i = 0; i < bytes / 4; i++) bad += host[i] != want;
  free(host);
  g.words_checked += bytes / 4;
  return bad;
}

typedef enum how_e {
  HAND_OVER_SUPERBLOCK, /* small block freed on A, its superblock to B */
  HAND_OVER_SPAN,       /* large span freed on A, adopted by B while retiring */
  CROSS_STREAM_FREE,    /* used and freed on B, reused by its owner A */
  RECORD_STREAM         /* used on B and recorded, freed on A, reused on A */
} how;

static const char *how_name(how h) {
  switch (h) {
    case HAND_OVER_SUPERBLOCK: return "superblock hand-over A->B";
    case HAND_OVER_SPAN: return "large span hand-over A->B";
    case CROSS_STREAM_FREE: return "cross-stream free B, reuse on A";
    default: return "record_stream B, free and reuse on A";
  }
}

static void scenario(how h, slow_kind kind) {
  need_device();
  if (kind == SLOW_SPIN && g.module == NULL) skip();
  sa_arena *a;
  SA(make_arena(&a));
  CUstream A = g.s[0], B = g.s[1];
  bool hand_over = h == HAND_OVER_SUPERBLOCK || h == HAND_OVER_SPAN;
  CUstream slow = hand_over ? A : B, writer = hand_over ? B : A;
  size_t bytes = h == HAND_OVER_SPAN ? 8 * MiB : 2 * MiB;
  void *scratch = NULL; /* the memset chain's, used on the slow stream only */
  if (kind == SLOW_CHAIN) SA(sa_alloc(a, &scratch, SCRATCH_BYTES, (sa_stream)slow));
  void *p, *q;
  SA(sa_alloc(a, &p, bytes, (sa_stream)A));
  switch (h) {
    case HAND_OVER_SUPERBLOCK: {
      /* An event on A is recorded only in a call on A: p must leave this
       * thread's cache (two blocks of its class) in one. Freed first, it is
       * pushed out by the next two frees, and its superblock empties
       * behind an event on A recorded after the slow writer. */
      void *more[2];
      for (int i = 0; i < 2; i++) SA(sa_alloc(a, &more[i], bytes, (sa_stream)A));
      slow_write(kind, A, p, bytes, scratch);
      SA(sa_free(p, (sa_stream)A));
      for (int i = 0; i < 2; i++) SA(sa_free(more[i], (sa_stream)A));
      SA(sa_defragment(a)); /* A's empty superblock goes global with its event */
      SA(sa_alloc(a, &q, bytes, (sa_stream)B));
      break;
    }
    case HAND_OVER_SPAN: {
      /* B takes spans too, so that A's free records its event (a stream
       * alone in the arena may leave it pending, which B could not use). */
      void *b_span;
      SA(sa_alloc(a, &b_span, bytes, (sa_stream)B));
      slow_write(kind, A, p, bytes, scratch);
      SA(sa_free(p, (sa_stream)A));
      SA(sa_defragment(a)); /* A's free memory goes global behind an event */
      SA(sa_alloc(a, &q, bytes, (sa_stream)B));
      SA(sa_free(b_span, (sa_stream)B));
      break;
    }
    case CROSS_STREAM_FREE:
      slow_write(kind, B, p, bytes, scratch);
      SA(sa_free(p, (sa_stream)B)); /* B's work is the last use */
      /* The next call on B sends this thread's cross-stream batch home
       * behind an event on B. */
      SA(sa_alloc(a, &q, 256, (sa_stream)B));
      SA(sa_free(q, (sa_stream)B));
      SA(sa_alloc(a, &q, bytes, (sa_stream)A));
      break;
    default:
      slow_write(kind, B, p, bytes, scratch);
      SA(sa_record_stream(p, (sa_stream)B));
      SA(sa_free(p, (sa_stream)A));
      SA(sa_alloc(a, &q, bytes, (sa_stream)A));
      break;
  }
  g.scenarios++;
  bool same = q == p;
  g.reused += same;
  fast_write(writer, slow, q, bytes);
  unsigned long long bad = wrong_words(q, bytes, PATTERN_Y);
  g.words_wrong += bad;
  printf("gpu_torture: %s, slow writer %s: %s, %llu of %zu words clobbered\n", how_name(h),
         kind == SLOW_SPIN ? "spin kernel" : "memset chain",
         same ? "same block handed out" : "a different block", bad, bytes / 4);
  SA(sa_free(q, (sa_stream)writer));
  if (scratch != NULL) SA(sa_free(scratch, (sa_stream)slow));
  SA(sa_arena_destroy(a));
  if (!same) {
    print_error("the allocator handed out another block: the scenario did not exercise reuse\n");
    fail();
  }
  assert_int_equal(bad, 0);
}

/* Control: the same slow writer, and B writing the block with no ordering
 * at all (a deliberate misuse). The slow writer must land last, or the
 * scenarios above could not have caught an early handout. */
static void control(slow_kind kind) {
  need_device();
  if (kind == SLOW_SPIN && g.module == NULL) skip();
  sa_arena *a;
  SA(make_arena(&a));
  void *p, *scratch = NULL;
  if (kind == SLOW_CHAIN) SA(sa_alloc(a, &scratch, SCRATCH_BYTES, (sa_stream)g.s[0]));
  SA(sa_alloc(a, &p, 2 * MiB, (sa_stream)g.s[0]));
  slow_write(kind, g.s[0], p, 2 * MiB, scratch);
  fast_write(g.s[1], g.s[0], p, 2 * MiB);
  unsigned long long x_words = (2 * MiB / 4) - wrong_words(p, 2 * MiB, PATTERN_X);
  printf("gpu_torture: control without ordering, slow writer %s: %llu of %zu words end as X\n",
         kind == SLOW_SPIN ? "spin kernel" : "memset chain", x_words, 2 * MiB / 4);
  g.words_checked -= 2 * MiB / 4; /* not a check of the allocator */
  SA(sa_free(p, (sa_stream)g.s[0]));
  if (scratch != NULL) SA(sa_free(scratch, (sa_stream)g.s[0]));
  SA(sa_arena_destroy(a));
  if (x_words != 2 * MiB / 4 && under_sanitizer()) {
    printf("gpu_torture: the streams ran one after the other under the sanitizer: ordering "
           "cannot be observed in this run, contents and device accesses are still checked\n");
    g.serialized = true;
    return;
  }
  assert_int_equal(x_words, 2 * MiB / 4);
  g.controls_late++;
}

static void control_spin(void **s) { (void)s; control(SLOW_SPIN); }
static void control_chain(void **s) { (void)s; control(SLOW_CHAIN); }
static void superblock_spin(void **s) { (void)s; scenario(HAND_OVER_SUPERBLOCK, SLOW_SPIN); }
static void superblock_chain(void **s) { (void)s; scenario(HAND_OVER_SUPERBLOCK, SLOW_CHAIN); }
static void span_spin(void **s) { (void)s; scenario(HAND_OVER_SPAN, SLOW_SPIN); }
static void span_chain(void **s) { (void)s; scenario(HAND_OVER_SPAN, SLOW_CHAIN); }
static void cross_free_spin(void **s) { (void)s; scenario(CROSS_STREAM_FREE, SLOW_SPIN); }
static void cross_free_chain(void **s) { (void)s; scenario(CROSS_STREAM_FREE, SLOW_CHAIN); }
static void record_spin(void **s) { (void)s; scenario(RECORD_STREAM, SLOW_SPIN); }
static void record_chain(void **s) { (void)s; scenario(RECORD_STREAM, SLOW_CHAIN); }

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(control_spin),     cmocka_unit_test(control_chain),
      cmocka_unit_test(superblock_spin),  cmocka_unit_test(superblock_chain),
      cmocka_unit_test(span_spin),        cmocka_unit_test(span_chain),
      cmocka_unit_test(cross_free_spin),  cmocka_unit_test(cross_free_chain),
      cmocka_unit_test(record_spin),      cmocka_unit_test(record_chain),
  };
  int failed = cmocka_run_group_tests(tests, group_setup, group_teardown);
  if (g.skip_reason != NULL) {
    printf("gpu_torture: skipped (no usable CUDA device: %s), scenarios 0, threads 1, streams 0, "
           "failures %d\n",
           g.skip_reason, failed);
  } else {
    printf("gpu_torture: device %d, scenarios %u (same block reused %u, slow writer still busy "
           "at handout %u), controls late %u, ordering observable %s, words checked %llu, words "
           "clobbered %llu, threads 1, streams 3, failures %d\n",
           g.ordinal, g.scenarios, g.reused, g.busy, g.controls_late,
           g.serialized ? "no (serialized under the sanitizer)" : "yes", g.words_checked,
           g.words_wrong, failed);
  }
  return failed;
}
