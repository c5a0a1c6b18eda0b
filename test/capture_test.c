/* Stream capture (CUDA graphs): the allocator never enqueues into a user's
 * graph and never invalidates a user's capture with its own calls.
 *
 * Work captured into a graph runs when the graph is launched, which the
 * allocator cannot follow. Before this contract, a free on a capturing
 * stream recorded the allocator's event into the graph: the capture was
 * invalidated by the allocator's next query of it, and that event failed
 * every query afterwards (CUDA_ERROR_INVALID_VALUE on the H200), so every
 * later large allocation of the arena failed. A stream's first use during
 * a capture asked for its id, which invalidated the capture; and the
 * allocator's event queries, made while another thread captured in the
 * global mode, invalidated that capture too.
 *
 * Each case runs on the host simulator (which applies the driver's capture
 * rules, include/streamarena/host.h) and on CUDA where a device is usable
 * (skipped elsewhere). On a machine with a GPU, after tools/gpu-check.sh:
 *   bash .gpu/run.sh --only=capture_test
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "cuda_kernels.h"
#include "driver/driver.h"
#include "fixture.h"
#include "internal.h"
#include "sim/sim.h"
#include "test/util.h"

#define SPAN (64 * MiB)
#define GLOBAL 0 /* CU_STREAM_CAPTURE_MODE_GLOBAL, SA_HOST_CAPTURE_GLOBAL */

typedef struct bench_s {
  sa_backend backend;
  sa_arena *arena;
  sa_driver *drv; /* the test's own streams and captures */
  sa_stream s1, s2, s3;
  sa_host_counters before;
} bench;

static bench *open_bench; /* for the teardown of a case that failed */

/* An arena of at most cap bytes (0: the device) and three streams on
 * backend; skips where it has no device. */
static void bench_open_with(bench *b, sa_backend backend, size_t cap, sa_oom_callback cb,
                            void *cb_data) {
  *b = (bench){.backend = backend};
  sa_host_get_counters(&b->before);
  sa_config cfg;
  sa_config_init(&cfg);
  cfg.backend = backend;
  cfg.max_physical_bytes = cap;
  cfg.oom_callback = cb;
  cfg.oom_user_data = cb_data;
  if (backend == SA_BACKEND_HOST) cfg.flags |= SA_FLAG_CHECK_STREAM_ORDER;
  sa_status st = sa_arena_create(&cfg, &b->arena);
  if (st == SA_ERR_NO_DEVICE) {
    const char *why;
    (void)sa_last_driver_error(&why);
    printf("capture_test: %s: no usable device (%s), skipped\n", sa_backend_name(backend), why);
    skip();
  }
  sa_assert_ok(st);
  sa_assert_ok(sa_driver_open(backend, 0, &b->drv));
  open_bench = b;
  sa_assert_ok(b->drv->ops->stream_create(b->drv, &b->s1));
  sa_assert_ok(b->drv->ops->stream_create(b->drv, &b->s2));
  sa_assert_ok(b->drv->ops->stream_create(b->drv, &b->s3));
}

static void bench_open_capped(bench *b, sa_backend backend, size_t cap) {
  bench_open_with(b, backend, cap, NULL, NULL);
}

static void bench_open(bench *b, sa_backend backend) { bench_open_capped(b, backend, 0); }

/* A case that failed may leave a capture open: ended here, so that the
 * next case does not fail for it. */
static int end_open_captures(void **state) {
  (void)state;
  bench *b = open_bench;
  if (b != NULL && b->drv != NULL) {
    sa_stream s[] = {b->s1, b->s2, b->s3};
    for (int i = 0; i < 3; i++)
      if (s[i] != NULL) (void)b->drv->ops->stream_end_capture(b->drv, s[i]);
  }
  open_bench = NULL;
  return 0;
}

/* Everything back, nothing leaked, no stream-order violation. */
static void bench_close(bench *b) {
  sa_driver *d = b->drv;
  sa_stream s[] = {b->s1, b->s2, b->s3};
  for (int i = 0; i < 3; i++) sa_assert_ok(d->ops->stream_synchronize(d, s[i]));
  for (int i = 0; i < 3; i++) sa_assert_ok(sa_stream_release(b->arena, s[i]));
  sa_assert_ok(sa_trim(b->arena, 0));
  sa_stats stats;
  sa_assert_ok(sa_get_stats(b->arena, &stats));
  assert_int_equal(stats.live_bytes, 0);
  assert_int_equal(stats.reserved_bytes, 0);
  sa_assert_ok(sa_arena_destroy(b->arena));
  for (int i = 0; i < 3; i++) sa_assert_ok(d->ops->stream_destroy(d, s[i]));
  sa_driver_close(d);
  open_bench = NULL;
  if (b->backend == SA_BACKEND_HOST) {
    sa_host_counters after;
    sa_host_get_counters(&after);
    assert_int_equal(after.order_violations, b->before.order_violations);
    assert_int_equal(after.events, b->before.events);
    assert_int_equal(after.chunks, b->before.chunks);
  }
}

static void begin(bench *b, sa_stream s) {
  sa_assert_ok(b->drv->ops->stream_begin_capture(b->drv, s, GLOBAL));
}

/* The capture ended intact: nothing of the allocator invalidated it. */
static void end_intact(bench *b, sa_stream s) {
  sa_assert_ok(b->drv->ops->stream_end_capture(b->drv, s));
}

/* A large allocation and free on s, which must work (an arena whose
 * events were recorded into a graph failed here for good). */
static void span_round_trip(bench *b, sa_stream s) {
  void *p = NULL;
  sa_assert_ok(sa_alloc(b->arena, &p, SPAN, s));
  assert_non_null(p);
  sa_assert_ok(sa_free(p, s));
}

/* ---- the cases, each on one backend ------------------------------------ */

static void first_use_during_a_capture(sa_backend backend) {
  static bench b; /* outlives a failed case: the teardown reads it */
  bench_open(&b, backend);
  begin(&b, b.s1);
  void *p = (void *)1, *q = (void *)1;
  sa_assert_status(sa_alloc(b.arena, &p, 4 * KiB, b.s1), SA_ERR_STREAM_CAPTURING);
  assert_null(p);
  sa_assert_status(sa_alloc(b.arena, &q, SPAN, b.s1), SA_ERR_STREAM_CAPTURING);
  assert_null(q);
  end_intact(&b, b.s1);
  sa_stats stats;
  sa_assert_ok(sa_get_stats(b.arena, &stats));
  assert_int_equal(stats.live_bytes, 0);
  assert_int_equal(stats.alloc_count, 0);
  sa_assert_ok(sa_alloc(b.arena, &p, 4 * KiB, b.s1));
  sa_assert_ok(sa_free(p, b.s1));
  span_round_trip(&b, b.s1);
  bench_close(&b);
}

/* A span free on s1 refused during a capture changes nothing the stats
 * show. After more than SA_TIMELINE_EVENTS earlier frees on s1, the ring
 * of s1's timeline events has wrapped: the free would re-record a slot
 * that still marks an older free (refused, it keeps that mark). */
static void refused_span_free(bench *b, int earlier) {
  for (int i = 0; i < earlier; i++) span_round_trip(b, b->s1);
  void *p = NULL;
  sa_assert_ok(sa_alloc(b->arena, &p, SPAN, b->s1));
  sa_stats before, after;
  sa_assert_ok(sa_get_stats(b->arena, &before));
  begin(b, b->s1);
  sa_assert_status(sa_free(p, b->s1), SA_ERR_STREAM_CAPTURING);
  sa_assert_ok(sa_get_stats(b->arena, &after));
  end_intact(b, b->s1);
  assert_int_equal(after.large_spans, before.large_spans);
  assert_int_equal(after.live_bytes, before.live_bytes);
  assert_int_equal(after.events_in_flight, before.events_in_flight);
  sa_assert_ok(sa_free(p, b->s1)); /* still live: freed now, outside the capture */
}

static void a_span_free_during_a_capture_is_refused(sa_backend backend) {
  static bench b; /* outlives a failed case: the teardown reads it */
  bench_open(&b, backend);
  refused_span_free(&b, 0);
  for (int i = 0; i < 3; i++) {
    span_round_trip(&b, b.s2);
    span_round_trip(&b, b.s1);
  }
  bench_close(&b);
}

static void a_refused_span_free_keeps_the_timeline(sa_backend backend) {
  static bench b; /* outlives a failed case: the teardown reads it */
  bench_open(&b, backend);
  refused_span_free(&b, SA_TIMELINE_EVENTS + 1);
  span_round_trip(&b, b.s2); /* behind the frees on s1 */
  bench_close(&b);
}

/* A span recorded on other streams: its free takes a stream arena for
 * each of them. Refused (a recorded stream or the freer captures), it
 * takes none: nothing changed. */
static void a_refused_recorded_span_free_takes_no_stream_arena(sa_backend backend) {
  static bench b; /* outlives a failed case: the teardown reads it */
  bench_open(&b, backend);
  void *p = NULL, *q = NULL;
  sa_assert_ok(sa_alloc(b.arena, &p, SPAN, b.s2)); /* s2 known, s1 and s3 not */
  sa_assert_ok(sa_record_stream(p, b.s3));
  sa_assert_ok(sa_record_stream(p, b.s1));
  sa_stats before, after;
  sa_assert_ok(sa_get_stats(b.arena, &before));
  begin(&b, b.s1);
  sa_assert_status(sa_free(p, b.s2), SA_ERR_STREAM_CAPTURING); /* recorded on s1 */
  sa_assert_ok(sa_get_stats(b.arena, &after));
  end_intact(&b, b.s1);
  assert_int_equal(after.streams, before.streams);
  sa_assert_ok(sa_free(p, b.s2));
  /* The freer captures: its thread's entry is at hand, no driver call
   * before the free's own. s4 is new to the arena. */
  sa_stream s4;
  sa_assert_ok(b.drv->ops->stream_create(b.drv, &s4));
  sa_assert_ok(sa_alloc(b.arena, &q, SPAN, b.s1));
  sa_assert_ok(sa_record_stream(q, s4));
  sa_assert_ok(sa_get_stats(b.arena, &before));
  begin(&b, b.s1);
  sa_assert_status(sa_free(q, b.s1), SA_ERR_STREAM_CAPTURING);
  sa_assert_ok(sa_get_stats(b.arena, &after));
  end_intact(&b, b.s1);
  assert_int_equal(after.streams, before.streams);
  sa_assert_ok(sa_free(q, b.s1));
  sa_assert_ok(b.drv->ops->stream_synchronize(b.drv, s4));
  sa_assert_ok(sa_stream_release(b.arena, s4));
  sa_assert_ok(b.drv->ops->stream_destroy(b.drv, s4));
  bench_close(&b);
}

/* Blocks of s2 freed on a capturing s1 go into a cross-stream batch; the
 * batch's event is recorded on s1 when it is handed on. Every free either
 * works or is refused with the block still live, and the capture stays
 * intact. */
static void cross_stream_frees_during_a_capture(sa_backend backend) {
  enum { N = 3 * 64 + 5 }; /* past a few batches of SA_BATCH_MAX */
  static bench b; /* outlives a failed case: the teardown reads it */
  bench_open(&b, backend);
  void **blocks = calloc(N, sizeof *blocks);
  assert_non_null(blocks);
  void *warm = NULL; /* s1 known to this thread before the capture */
  sa_assert_ok(sa_alloc(b.arena, &warm, 4 * KiB, b.s1));
  sa_assert_ok(sa_free(warm, b.s1));
  for (int i = 0; i < N; i++) sa_assert_ok(sa_alloc(b.arena, &blocks[i], 4 * KiB, b.s2));
  begin(&b, b.s1);
  int refused = 0;
  for (int i = 0; i < N; i++) {
    sa_status st = sa_free(blocks[i], b.s1);
    if (st == SA_OK) {
      blocks[i] = NULL;
      continue;
    }
    sa_assert_status(st, SA_ERR_STREAM_CAPTURING);
    refused++;
  }
  end_intact(&b, b.s1);
  printf("capture_test: %s: %d of %d cross-stream frees refused during the capture\n",
         sa_backend_name(backend), refused, N);
  for (int i = 0; i < N; i++)
    if (blocks[i] != NULL) sa_assert_ok(sa_free(blocks[i], b.s1));
  free(blocks);
  span_round_trip(&b, b.s2);
  bench_close(&b);
}

static void release_and_record_during_a_capture(sa_backend backend) {
  static bench b; /* outlives a failed case: the teardown reads it */
  bench_open(&b, backend);
  void *p = NULL, *q = NULL;
  sa_assert_ok(sa_alloc(b.arena, &p, 4 * KiB, b.s1)); /* s1 known, p live on it */
  sa_assert_ok(sa_alloc(b.arena, &q, 4 * KiB, b.s2));
  begin(&b, b.s1);
  sa_assert_status(sa_record_stream(q, b.s1), SA_ERR_STREAM_CAPTURING);
  sa_assert_status(sa_stream_release(b.arena, b.s1), SA_ERR_STREAM_CAPTURING);
  end_intact(&b, b.s1);
  sa_assert_ok(sa_record_stream(q, b.s1));
  sa_assert_ok(sa_free(q, b.s2));
  sa_assert_ok(sa_free(p, b.s1));
  sa_assert_ok(sa_stream_release(b.arena, b.s1));
  bench_close(&b);
}

typedef struct worker_s {
  bench *b;
  sa_status st;
} worker;

/* Large allocations that reuse spans freed on another stream: the arena
 * queries (or waits for) the free's event, and synchronizes a stream at
 * its release. */
static void *allocate_across_streams(void *arg) {
  worker *w = arg;
  bench *b = w->b;
  for (int i = 0; i < 4 && w->st == SA_OK; i++) {
    void *p = NULL;
    w->st = sa_alloc(b->arena, &p, SPAN, b->s2);
    if (w->st == SA_OK) w->st = sa_free(p, b->s2);
    if (w->st == SA_OK) w->st = sa_alloc(b->arena, &p, SPAN, b->s1);
    if (w->st == SA_OK) w->st = sa_free(p, b->s1);
  }
  if (w->st == SA_OK) w->st = sa_stream_release(b->arena, b->s2);
  return NULL;
}

static void another_threads_global_capture_stays_intact(sa_backend backend) {
  static bench b; /* outlives a failed case: the teardown reads it */
  bench_open(&b, backend);
  span_round_trip(&b, b.s1); /* the memory the worker's allocations reuse */
  uint64_t queries = sa_host_call_count(SA_HOST_FN_EVENT_QUERY) +
                     sa_host_call_count(SA_HOST_FN_STREAM_SYNCHRONIZE);
  begin(&b, b.s3);
  worker w = {&b, SA_OK};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, allocate_across_streams, &w), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  sa_assert_ok(w.st);
  /* The capturing thread's own calls too (its mode is global as well). */
  w.st = SA_OK;
  (void)allocate_across_streams(&w);
  sa_assert_ok(w.st);
  end_intact(&b, b.s3);
  if (backend == SA_BACKEND_HOST) {
    /* The case asked the driver to wait or query at all. */
    assert_true(sa_host_call_count(SA_HOST_FN_EVENT_QUERY) +
                    sa_host_call_count(SA_HOST_FN_STREAM_SYNCHRONIZE) > queries);
  }
  bench_close(&b);
}

/* What call_on_stream runs, counting its runs. */
static sa_status counted_call(void *arg) {
  ++*(int *)arg;
  return SA_ERR_NOT_READY; /* handed back as it is */
}

/* The driver's call_on_stream (a framework hook's whole path to the
 * library) runs nothing on a capturing stream, without harm to the
 * capture, and runs the call on any other stream, NULL included. */
static void call_on_stream_runs_nothing_on_a_capturing_stream(sa_backend backend) {
  static bench b; /* outlives a failed case: the teardown reads it */
  bench_open(&b, backend);
  sa_driver *d = b.drv;
  int runs = 0;
  begin(&b, b.s1);
  sa_assert_status(d->ops->call_on_stream(d, b.s1, counted_call, &runs),
                   SA_ERR_STREAM_CAPTURING);
  assert_int_equal(runs, 0);
  sa_assert_status(d->ops->call_on_stream(d, b.s2, counted_call, &runs), SA_ERR_NOT_READY);
  sa_assert_status(d->ops->call_on_stream(d, NULL, counted_call, &runs), SA_ERR_NOT_READY);
  assert_int_equal(runs, 2);
  end_intact(&b, b.s1);
  sa_assert_status(d->ops->call_on_stream(d, b.s1, counted_call, &runs), SA_ERR_NOT_READY);
  assert_int_equal(runs, 3);
  bench_close(&b);
}

/* CUDA only (the simulator has no blocking streams): work on the legacy
 * stream while a blocking stream is captured would join the capture and
 * invalidate it (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT at the record). */
static void the_legacy_stream_during_a_blocking_streams_capture(void **state) {
  (void)state;
  static bench b; /* outlives a failed case: the teardown reads it */
  bench_open(&b, SA_BACKEND_CUDA);
  if (sa_cu_load_all() != SA_OK) skip();
  CUdevice dev;
  CUcontext ctx;
  SA_CU_OK(sa_cu.DeviceGet(&dev, 0));
  SA_CU_OK(sa_cu.DevicePrimaryCtxRetain(&ctx, dev));
  SA_CU_OK(sa_cu.CtxSetCurrent(ctx));
  CUstream blocking;
  SA_CU_OK(sa_cu.StreamCreate(&blocking, CU_STREAM_DEFAULT));
  void *p = NULL;
  sa_assert_ok(sa_alloc(b.arena, &p, SPAN, NULL));
  sa_assert_ok(b.drv->ops->stream_begin_capture(b.drv, (sa_stream)blocking, GLOBAL));
  sa_assert_status(sa_free(p, NULL), SA_ERR_STREAM_CAPTURING);
  int runs = 0; /* a hook's path refuses NULL too, running nothing */
  sa_assert_status(b.drv->ops->call_on_stream(b.drv, NULL, counted_call, &runs),
                   SA_ERR_STREAM_CAPTURING);
  assert_int_equal(runs, 0);
  sa_assert_ok(b.drv->ops->stream_end_capture(b.drv, (sa_stream)blocking));
  sa_assert_ok(sa_free(p, NULL));
  SA_CU_OK(sa_cu.StreamDestroy(blocking));
  SA_CU_OK(sa_cu.DevicePrimaryCtxRelease(dev));
  bench_close(&b);
}

/* An allocation on a capturing stream runs out of memory: the step that
 * synchronizes the device (which CUDA fails during any capture, and
 * invalidates it) is left out; the allocation fails, the capture stays. */
static void out_of_memory_during_a_capture(sa_backend backend) {
  static bench b; /* outlives a failed case: the teardown reads it */
  bench_open_capped(&b, backend, 2 * SPAN);
  void *warm = NULL, *p = NULL, *q = (void *)1;
  sa_assert_ok(sa_alloc(b.arena, &warm, 4 * KiB, b.s1)); /* s1 known before */
  sa_assert_ok(sa_free(warm, b.s1));
  sa_assert_ok(sa_alloc(b.arena, &p, SPAN + SPAN / 2, b.s2));
  begin(&b, b.s1);
  sa_assert_status(sa_alloc(b.arena, &q, SPAN, b.s1), SA_ERR_OUT_OF_MEMORY);
  assert_null(q);
  end_intact(&b, b.s1);
  sa_assert_ok(sa_free(p, b.s2));
  span_round_trip(&b, b.s1);
  bench_close(&b);
}

/* The callback of the case below: frees the span that holds the memory,
 * on the stream that used it, once. */
static void *oom_hostage;
static int oom_asked;
static int free_the_hostage(sa_arena *a, size_t size, sa_stream s, void *data) {
  (void)a, (void)size, (void)s;
  bench *b = data;
  oom_asked++;
  if (oom_hostage == NULL) return 0;
  sa_status st = sa_free(oom_hostage, b->s2);
  oom_hostage = NULL;
  return st == SA_OK;
}

/* The same with an oom_callback: only the device-wide synchronize is left
 * out during a capture, not the callback, which frees memory on another
 * stream; the allocation then succeeds and the capture stays intact. */
static void out_of_memory_during_a_capture_asks_the_callback(sa_backend backend) {
  static bench b; /* outlives a failed case: the teardown reads it */
  bench_open_with(&b, backend, 2 * SPAN, free_the_hostage, &b);
  void *q = NULL;
  /* s1 known before, through a span, so that nothing is cached for s1. A
   * small block cached for s1 comes back in the out-of-memory steps
   * unfenced (no event can be recorded on s1 during the capture), and any
   * later call on s1 that misses the cache then asks for s1's id, which
   * the capture refuses: that case is not what this one checks. */
  span_round_trip(&b, b.s1);
  sa_assert_ok(sa_alloc(b.arena, &oom_hostage, SPAN + SPAN / 2, b.s2));
  sa_assert_ok(b.drv->ops->stream_synchronize(b.drv, b.s2));
  oom_asked = 0;
  begin(&b, b.s1);
  sa_assert_ok(sa_alloc(b.arena, &q, SPAN, b.s1));
  assert_non_null(q);
  assert_int_equal(oom_asked, 1);
  assert_null(oom_hostage);
  end_intact(&b, b.s1);
  sa_assert_ok(sa_free(q, b.s1));
  bench_close(&b);
}

/* An allocation that runs out of memory on a capturing stream leaves the
 * stream's own cached blocks where they are: given back as in a call naming
 * it, they would need an event on it, which the capture refuses, and every
 * later call on it that missed the cache would fence first, asking for its
 * id, refused too. So a stream used before the capture still serves small
 * requests in it afterwards (README, "CUDA graphs"). */
static void small_alloc_after_an_oom_during_a_capture(sa_backend backend) {
  static bench b;
  bench_open_capped(&b, backend, 2 * SPAN);
  void *warm = NULL, *p = NULL, *q = (void *)1, *r = NULL, *r0 = NULL;
  sa_assert_ok(sa_alloc(b.arena, &warm, 4 * KiB, b.s1)); /* s1 known before */
  sa_assert_ok(sa_free(warm, b.s1));
  sa_assert_ok(sa_alloc(b.arena, &p, SPAN + SPAN / 2, b.s2));
  begin(&b, b.s1);
  sa_assert_ok(sa_alloc(b.arena, &r0, 8 * KiB, b.s1)); /* before the OOM: works */
  sa_assert_status(sa_alloc(b.arena, &q, SPAN, b.s1), SA_ERR_OUT_OF_MEMORY);
  sa_status st = sa_alloc(b.arena, &r, 16 * KiB, b.s1); /* after it too */
  end_intact(&b, b.s1);
  sa_assert_ok(st);
  sa_assert_ok(sa_free(r, b.s1));
  sa_assert_ok(sa_free(r0, b.s1));
  sa_assert_ok(sa_free(p, b.s2));
  bench_close(&b);
}

/* Threads that allocate, free across streams and release their streams
 * while the main thread captures, in the global mode, again and again:
 * nothing the allocator does for them, or for the main thread's own calls
 * on other streams, may invalidate a capture. No cap: no out-of-memory path
 * (its device-wide synchronize would). */
typedef struct churner_s {
  bench *b;
  sa_stream own;
  atomic_bool *stop;
  sa_status st;         /* the thread's; read after the join */
  atomic_bool failed;   /* st is not SA_OK: read while it runs */
  atomic_ulong ops;
  uint64_t rng;
} churner;

static unsigned long churned(churner *c, int n) {
  unsigned long ops = 0;
  for (int t = 0; t < n; t++) ops += atomic_load(&c[t].ops);
  return ops;
}

static void *churn(void *arg) {
  churner *c = arg;
  void *live[16] = {0};
  sa_stream freed_on[2] = {c->own, c->b->s2};
  while (!atomic_load(c->stop) && c->st == SA_OK) {
    unsigned i = sa_fixture_pick(&c->rng, 16);
    if (live[i] != NULL) {
      c->st = sa_free(live[i], freed_on[sa_fixture_pick(&c->rng, 2)]);
      live[i] = NULL;
    } else {
      size_t size = sa_fixture_pick(&c->rng, 4) == 0 ? 4 * MiB : 256 * (1 + (size_t)i * 7);
      c->st = sa_alloc(c->b->arena, &live[i], size, c->own);
    }
    atomic_fetch_add(&c->ops, 1);
  }
  if (c->st != SA_OK) atomic_store(&c->failed, true);
  for (int i = 0; i < 16; i++)
    if (live[i] != NULL && c->st == SA_OK) c->st = sa_free(live[i], c->own);
  if (c->st == SA_OK) c->st = sa_stream_release(c->b->arena, c->own);
  return NULL;
}

static void captures_while_threads_allocate(sa_backend backend) {
  enum { THREADS = 3, ROUNDS = 200 };
  static bench b; /* outlives a failed case: the teardown reads it */
  bench_open(&b, backend);
  void *warm = NULL; /* s1 known to this thread before its captures */
  sa_assert_ok(sa_alloc(b.arena, &warm, 4 * KiB, b.s1));
  atomic_bool stop = false;
  churner c[THREADS];
  pthread_t th[THREADS];
  for (int t = 0; t < THREADS; t++) {
    c[t] = (churner){.b = &b, .stop = &stop, .rng = 0x9E3779B97F4A7C15ull * (uint64_t)(t + 1)};
    atomic_init(&c[t].ops, 0);
    atomic_init(&c[t].failed, false);
    sa_assert_ok(b.drv->ops->stream_create(b.drv, &c[t].own));
    assert_int_equal(pthread_create(&th[t], NULL, churn, &c[t]), 0);
  }
  for (int round = 0; round < ROUNDS; round++) {
    unsigned long before = churned(c, THREADS);
    begin(&b, b.s1);
    void *p = NULL, *q = NULL;
    sa_assert_ok(sa_alloc(b.arena, &p, 4 * KiB, b.s1)); /* from the thread cache */
    sa_assert_ok(sa_alloc(b.arena, &q, 4 * MiB, b.s3)); /* another stream: may query */
    sa_assert_ok(sa_free(q, b.s3));
    /* The threads' calls happen during the capture (unless one failed). */
    while (churned(c, THREADS) < before + 32 && !atomic_load(&c[0].failed) &&
           !atomic_load(&c[1].failed) && !atomic_load(&c[2].failed))
      sched_yield();
    end_intact(&b, b.s1);
    sa_assert_ok(sa_free(p, b.s1)); /* after the capture: the graph is dropped */
  }
  atomic_store(&stop, true);
  unsigned long ops = churned(c, THREADS);
  for (int t = 0; t < THREADS; t++) {
    assert_int_equal(pthread_join(th[t], NULL), 0);
    sa_assert_ok(c[t].st);
    sa_assert_ok(b.drv->ops->stream_synchronize(b.drv, c[t].own));
    sa_assert_ok(b.drv->ops->stream_destroy(b.drv, c[t].own));
  }
  printf("capture_test: %s: %d captures intact beside %lu operations of %d threads\n",
         sa_backend_name(backend), ROUNDS, ops, THREADS);
  sa_assert_ok(sa_free(warm, b.s1));
  bench_close(&b);
}

#define ON_BOTH(name)                                                  \
  static void name##_on_the_simulator(void **state) {                 \
    (void)state;                                                       \
    name(SA_BACKEND_HOST);                                             \
  }                                                                    \
  static void name##_on_cuda(void **state) {                          \
    (void)state;                                                       \
    name(SA_BACKEND_CUDA);                                             \
  }

ON_BOTH(first_use_during_a_capture)
ON_BOTH(a_span_free_during_a_capture_is_refused)
ON_BOTH(a_refused_span_free_keeps_the_timeline)
ON_BOTH(a_refused_recorded_span_free_takes_no_stream_arena)
ON_BOTH(cross_stream_frees_during_a_capture)
ON_BOTH(release_and_record_during_a_capture)
ON_BOTH(another_threads_global_capture_stays_intact)
ON_BOTH(out_of_memory_during_a_capture)
ON_BOTH(out_of_memory_during_a_capture_asks_the_callback)
ON_BOTH(small_alloc_after_an_oom_during_a_capture)
ON_BOTH(captures_while_threads_allocate)
ON_BOTH(call_on_stream_runs_nothing_on_a_capturing_stream)

/* The simulator's own rules, which the cases above rely on to fail where
 * the allocator broke a capture: called below the backend (driver/host.c),
 * which would refuse or relax these calls itself. */
static sa_status sim_query(void *e) {
  sa_sim_lock();
  sa_status st = sa_sim_event_query(e);
  sa_sim_unlock();
  return st;
}

static sa_status sim_record(void *e, sa_stream s) {
  sa_sim_lock();
  sa_status st = sa_sim_event_record(e, s, 0); /* events of device 0 */
  sa_sim_unlock();
  return st;
}

static sa_host_capture_status status_of(sa_stream s) {
  sa_host_capture_status cs = SA_HOST_CAPTURE_NONE;
  sa_assert_ok(sa_host_stream_capture_status(s, &cs));
  return cs;
}

typedef struct relay_s {
  sa_stream s;
  sa_host_capture_mode mode;
} relay;

/* Begins a capture of r->s on a thread of its own, which then exits. */
static void *capture_on_a_thread(void *arg) {
  relay *r = arg;
  sa_assert_ok(sa_host_stream_begin_capture(r->s, r->mode));
  return NULL;
}

/* s is captured in the global mode (by this thread or another): a query of
 * the outside event f in mode works and leaves the capture intact; back in
 * the global mode it is refused and invalidates the capture. */
static void query_in_mode_then_in_global(void *f, sa_stream s, sa_host_capture_mode mode) {
  sa_host_capture_mode m = mode;
  sa_assert_ok(sa_host_exchange_capture_mode(&m));
  assert_int_equal(m, SA_HOST_CAPTURE_GLOBAL);
  sa_assert_ok(sim_query(f));
  assert_int_equal(status_of(s), SA_HOST_CAPTURE_ACTIVE);
  sa_assert_ok(sa_host_exchange_capture_mode(&m));
  sa_assert_status(sim_query(f), SA_ERR_STREAM_CAPTURING);
  assert_int_equal(status_of(s), SA_HOST_CAPTURE_INVALIDATED);
  sa_assert_status(sa_host_stream_end_capture(s), SA_ERR_STREAM_CAPTURING);
}

static void the_simulator_applies_the_drivers_rules(void **state) {
  (void)state;
  sa_stream s1, s2;
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &s1));
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &s2));
  void *e, *f;
  sa_sim_lock();
  sa_assert_ok(sa_sim_event_create(0, &e));
  sa_assert_ok(sa_sim_event_create(0, &f));
  sa_sim_unlock();
  /* An event recorded in a capture: a query fails and invalidates the
   * capture; after the capture it still fails, until recorded again. */
  sa_assert_ok(sa_host_stream_begin_capture(s1, SA_HOST_CAPTURE_RELAXED));
  sa_assert_ok(sim_record(e, s1));
  sa_assert_status(sim_query(e), SA_ERR_STREAM_CAPTURING);
  assert_int_equal(status_of(s1), SA_HOST_CAPTURE_INVALIDATED);
  sa_assert_status(sa_host_stream_end_capture(s1), SA_ERR_STREAM_CAPTURING);
  sa_assert_status(sim_query(e), SA_ERR_DRIVER);
  sa_assert_ok(sim_record(e, s2));
  sa_assert_ok(sa_host_stream_drain(s2));
  sa_assert_ok(sim_query(e));
  /* A query of an outside event during a global capture fails and
   * invalidates it; in the relaxed thread mode it does neither. */
  sa_assert_ok(sim_record(f, s2));
  sa_assert_ok(sa_host_stream_begin_capture(s1, SA_HOST_CAPTURE_GLOBAL));
  query_in_mode_then_in_global(f, s1, SA_HOST_CAPTURE_RELAXED);
  /* Another thread's global capture: a thread in the thread-local mode may
   * make the call, one in the global mode may not. */
  sa_assert_ok(sim_record(f, s2));
  relay r = {s1, SA_HOST_CAPTURE_GLOBAL};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, capture_on_a_thread, &r), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  query_in_mode_then_in_global(f, s1, SA_HOST_CAPTURE_THREAD_LOCAL);
  /* The default stream cannot be captured; a stream captures once. */
  sa_assert_status(sa_host_stream_begin_capture(NULL, SA_HOST_CAPTURE_GLOBAL),
                   SA_ERR_INVALID_ARGUMENT);
  sa_assert_ok(sa_host_stream_begin_capture(s1, SA_HOST_CAPTURE_THREAD_LOCAL));
  sa_assert_status(sa_host_stream_begin_capture(s1, SA_HOST_CAPTURE_THREAD_LOCAL),
                   SA_ERR_INVALID_ARGUMENT);
  sa_assert_ok(sa_host_stream_end_capture(s1));
  sa_assert_status(sa_host_stream_end_capture(s1), SA_ERR_INVALID_ARGUMENT);
  sa_sim_lock();
  sa_assert_ok(sa_sim_event_destroy(e));
  sa_assert_ok(sa_sim_event_destroy(f));
  sa_sim_unlock();
  sa_assert_ok(sa_host_stream_destroy(s1));
  sa_assert_ok(sa_host_stream_destroy(s2));
}

/* A case on each backend, each with the teardown that ends open captures. */
#define BOTH_CASES(name)                                                 \
  cmocka_unit_test_teardown(name##_on_the_simulator, end_open_captures), \
      cmocka_unit_test_teardown(name##_on_cuda, end_open_captures)

int main(void) {
  const struct CMUnitTest tests[] = {
      BOTH_CASES(first_use_during_a_capture),
      BOTH_CASES(a_span_free_during_a_capture_is_refused),
      BOTH_CASES(a_refused_span_free_keeps_the_timeline),
      BOTH_CASES(a_refused_recorded_span_free_takes_no_stream_arena),
      BOTH_CASES(cross_stream_frees_during_a_capture),
      BOTH_CASES(release_and_record_during_a_capture),
      BOTH_CASES(another_threads_global_capture_stays_intact),
      BOTH_CASES(out_of_memory_during_a_capture),
      BOTH_CASES(out_of_memory_during_a_capture_asks_the_callback),
      BOTH_CASES(small_alloc_after_an_oom_during_a_capture),
      BOTH_CASES(captures_while_threads_allocate),
      BOTH_CASES(call_on_stream_runs_nothing_on_a_capturing_stream),
      cmocka_unit_test_teardown(the_legacy_stream_during_a_blocking_streams_capture,
                                end_open_captures),
      cmocka_unit_test(the_simulator_applies_the_drivers_rules),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
