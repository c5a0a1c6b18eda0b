/* Worker streams destroyed without sa_stream_release, as cudaMallocAsync
 * users destroy theirs: each worker thread creates its own stream,
 * allocates and writes blocks on it, frees them there (small ones stay in
 * its thread cache, large ones go back behind events), frees blocks of a
 * shared stream on it (its open cross-stream batch), synchronizes,
 * destroys the stream and exits. The thread's exit used to record an event
 * on the destroyed stream: a segmentation fault inside libcuda on the
 * H200. Then one more stream frees a span it took back, which records no
 * event, and is destroyed. Afterwards all memory comes back (sa_trim) and
 * the arena is destroyed cleanly.
 *
 * Runs on the host simulator, where a driver call on a destroyed stream is
 * a checker violation, and on CUDA where a device is usable (the case
 * skips elsewhere). On a machine with a GPU, after tools/gpu-check.sh:
 *   bash .gpu/run.sh --only=gpu_stream_destroy_test --sanitize=gpu_stream_destroy_test
 */
#include <pthread.h>
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

#include "driver/driver.h"
#include "test/util.h"

#define THREADS 8
#define ROUNDS 4
#define BLOCKS 24  /* per worker, on its own stream */
#define FOREIGN 8  /* per worker, of the shared stream, freed on its own */

typedef struct run_s {
  sa_arena *arena;
  sa_driver *drv; /* the test's own streams, in the arena's context */
  sa_stream shared;
  void *foreign[THREADS][FOREIGN];
  atomic_ulong failures, words_checked, words_wrong, streams_destroyed;
} run;

typedef struct worker_s {
  run *r;
  int id;
} worker;

static void check(run *r, sa_status st, const char *what) {
  if (st == SA_OK) return;
  const char *name;
  int code = sa_last_driver_error(&name);
  fprintf(stderr, "gpu_stream_destroy: %s: %s (driver: %s, %d)\n", what, sa_status_string(st),
          name, code);
  atomic_fetch_add(&r->failures, 1);
}

static size_t block_size(int i) {
  if (i % 8 == 7) return 3 * MiB + (size_t)i * 4 * KiB; /* a large span */
  return 256 * (size_t)(1 + (i * 37) % 200);            /* small blocks, many classes */
}

/* Read back the first and last word of p after the stream's work. */
static void verify(run *r, void *p, size_t size, uint32_t want) {
  uint32_t first = 0, last = 0;
  size_t words = size / 4;
  check(r, r->drv->ops->copy_to_host(r->drv, &first, (uintptr_t)p, 4), "copy_to_host");
  check(r, r->drv->ops->copy_to_host(r->drv, &last, (uintptr_t)p + (words - 1) * 4, 4),
        "copy_to_host");
  atomic_fetch_add(&r->words_checked, 2);
  atomic_fetch_add(&r->words_wrong, (unsigned long)(first != want) + (last != want));
}

static void *worker_life(void *arg) {
  worker *w = arg;
  run *r = w->r;
  sa_driver *d = r->drv;
  sa_stream s = NULL;
  check(r, d->ops->stream_create(d, &s), "stream_create");
  void *p[BLOCKS] = {0};
  for (int i = 0; i < BLOCKS; i++) {
    size_t size = block_size(i);
    check(r, sa_alloc(r->arena, &p[i], size, s), "sa_alloc");
    if (p[i] != NULL)
      check(r, d->ops->memset32_async(d, (uintptr_t)p[i], 0xD0000000u + (uint32_t)i, size / 4, s),
            "memset32_async");
  }
  check(r, d->ops->stream_synchronize(d, s), "stream_synchronize");
  for (int i = 0; i < BLOCKS; i++)
    if (p[i] != NULL) verify(r, p[i], block_size(i), 0xD0000000u + (uint32_t)i);
  /* Half are freed and allocated again on the stream (the cache at work). */
  for (int i = 0; i < BLOCKS; i += 2) check(r, sa_free(p[i], s), "sa_free");
  for (int i = 0; i < BLOCKS; i += 2) check(r, sa_alloc(r->arena, &p[i], block_size(i), s), "sa_alloc");
  for (int i = 0; i < BLOCKS; i++) check(r, sa_free(p[i], s), "sa_free");
  /* The shared stream's blocks, synchronized by the main thread: freed on
   * this stream, they form this thread's open cross-stream batch. */
  for (int k = 0; k < FOREIGN; k++) check(r, sa_free(r->foreign[w->id][k], s), "sa_free (foreign)");
  check(r, d->ops->stream_synchronize(d, s), "stream_synchronize");
  check(r, d->ops->stream_destroy(d, s), "stream_destroy"); /* no sa_stream_release */
  atomic_fetch_add(&r->streams_destroyed, 1);
  return NULL; /* the thread exits with its cache and batch */
}

static sa_status arena_on(sa_backend backend, sa_arena **out) {
  sa_config cfg;
  sa_config_init(&cfg);
  cfg.backend = backend;
  if (backend == SA_BACKEND_HOST) cfg.flags |= SA_FLAG_CHECK_STREAM_ORDER;
  return sa_arena_create(&cfg, out);
}

static void workers_destroy_their_streams_and_exit(sa_backend backend) {
  sa_arena *a = NULL;
  sa_status st = arena_on(backend, &a);
  if (st == SA_ERR_NO_DEVICE) {
    const char *why;
    (void)sa_last_driver_error(&why);
    printf("gpu_stream_destroy: %s: no usable device (%s), skipped\n", sa_backend_name(backend),
           why);
    skip();
  }
  assert_int_equal(st, SA_OK);
  sa_host_counters before;
  sa_host_get_counters(&before);
  run *r = calloc(1, sizeof *r);
  assert_non_null(r);
  r->arena = a;
  assert_int_equal(sa_driver_open(backend, 0, &r->drv), SA_OK);
  sa_driver *d = r->drv;
  assert_int_equal(d->ops->stream_create(d, &r->shared), SA_OK);
  for (int round = 0; round < ROUNDS; round++) {
    for (int t = 0; t < THREADS; t++)
      for (int k = 0; k < FOREIGN; k++) {
        size_t size = 4 * KiB * (size_t)(1 + k);
        check(r, sa_alloc(a, &r->foreign[t][k], size, r->shared), "sa_alloc (shared)");
        check(r, d->ops->memset32_async(d, (uintptr_t)r->foreign[t][k], 0xF0F0F0F0u, size / 4,
                                        r->shared),
              "memset32_async");
      }
    check(r, d->ops->stream_synchronize(d, r->shared), "stream_synchronize");
    pthread_t th[THREADS];
    worker w[THREADS];
    for (int t = 0; t < THREADS; t++) {
      w[t] = (worker){r, t};
      assert_int_equal(pthread_create(&th[t], NULL, worker_life, &w[t]), 0);
    }
    for (int t = 0; t < THREADS; t++) assert_int_equal(pthread_join(th[t], NULL), 0);
  }
  /* A stream destroyed (after the header's rule) with its last span free
   * and no event recorded for it: the span was freed and taken back before,
   * so that free left its mark pending (docs/DEFRAG.md, "Lazy marks"). No
   * call names the stream again: the shared stream's request passes the
   * span by, and nothing calls the driver on the destroyed stream. */
  sa_stream x = NULL;
  assert_int_equal(d->ops->stream_create(d, &x), SA_OK);
  void *l = NULL, *m = NULL;
  for (uint32_t i = 0; i < 3; i++) {
    check(r, sa_alloc(a, &l, 16 * MiB, x), "sa_alloc (pair)");
    if (l == NULL) break;
    check(r, d->ops->memset32_async(d, (uintptr_t)l, 0xE0000000u + i, 4 * MiB, x),
          "memset32_async");
    check(r, sa_free(l, x), "sa_free (pair)");
  }
  check(r, d->ops->stream_synchronize(d, x), "stream_synchronize");
  check(r, d->ops->stream_destroy(d, x), "stream_destroy");
  check(r, sa_alloc(a, &m, 16 * MiB, r->shared), "sa_alloc (after the pair)");
  if (m != NULL) {
    check(r, d->ops->memset32_async(d, (uintptr_t)m, 0xE1E1E1E1u, 4 * MiB, r->shared),
          "memset32_async");
    check(r, d->ops->stream_synchronize(d, r->shared), "stream_synchronize");
    verify(r, m, 16 * MiB, 0xE1E1E1E1u);
    check(r, sa_free(m, r->shared), "sa_free (after the pair)");
  }
  /* Everything the workers and that stream left comes back: their streams
   * are gone, so only after a device-wide synchronize, which sa_trim
   * makes. */
  check(r, sa_trim(a, 0), "sa_trim");
  sa_stats stats;
  assert_int_equal(sa_get_stats(a, &stats), SA_OK);
  printf("gpu_stream_destroy: backend %s, threads %d (%d rounds), streams destroyed without "
         "sa_stream_release %lu, words checked %lu, words wrong %lu, after sa_trim: live %zu, "
         "reserved %zu, deferred %zu, failures %lu\n",
         sa_backend_name(backend), THREADS * ROUNDS, ROUNDS,
         atomic_load(&r->streams_destroyed), atomic_load(&r->words_checked),
         atomic_load(&r->words_wrong), stats.live_bytes, stats.reserved_bytes,
         stats.deferred_frees, atomic_load(&r->failures));
  assert_int_equal(stats.live_bytes, 0);
  assert_int_equal(stats.reserved_bytes, 0);
  assert_int_equal(stats.deferred_frees, 0);
  assert_int_equal(d->ops->stream_destroy(d, r->shared), SA_OK);
  assert_int_equal(sa_arena_destroy(a), SA_OK);
  sa_driver_close(d);
  if (backend == SA_BACKEND_HOST) {
    sa_host_counters after;
    sa_host_get_counters(&after);
    assert_int_equal(after.order_violations, before.order_violations);
  }
  assert_int_equal(atomic_load(&r->words_wrong), 0);
  assert_int_equal(atomic_load(&r->failures), 0);
  free(r);
}

static void on_the_simulator(void **state) {
  (void)state;
  workers_destroy_their_streams_and_exit(SA_BACKEND_HOST);
}

static void on_cuda(void **state) {
  (void)state;
  workers_destroy_their_streams_and_exit(SA_BACKEND_CUDA);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(on_the_simulator),
      cmocka_unit_test(on_cuda),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
