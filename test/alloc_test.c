/* The allocator core through the public API, on whichever backend the
 * environment selects (STREAMARENA_BACKEND: host here and in CI, cuda on the
 * GPU machine): sizes, streams, threads, producer/consumer, alignment,
 * record_stream, thread exit, stream release, tuning, statistics, stitching,
 * out of memory, bad pointers, the drop-in calls.
 *
 * Device memory is written and read through the driver (memset32_async and
 * copy_to_host), never dereferenced, so the same binary checks contents on
 * the GPU. The adversarial stream-order tests need hand-stepped streams and
 * live in stream_order_test.c (host only); the GPU has its own torture test.
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
#include <string.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "driver/driver.h"
#include "test/util.h"

static sa_driver *drv; /* the tests' own handle on the backend's device */
static bool on_host;

static int open_backend(void **state) {
  (void)state;
  if (sa_driver_open(SA_BACKEND_AUTO, 0, &drv) != SA_OK) return -1;
  on_host = drv->backend == SA_BACKEND_HOST;
  printf("alloc_test: backend %s\n", drv->ops->name);
  return 0;
}

static int close_backend(void **state) {
  (void)state;
  sa_driver_close(drv);
  return 0;
}

static sa_arena *make_arena(const char *spec) {
  sa_config cfg;
  sa_config_init(&cfg);
  char err[128];
  cfg.backend = drv->backend;
  if (on_host)
    assert_int_equal(sa_config_parse(&cfg, "check_stream_order=1", err, sizeof err), SA_OK);
  if (spec != NULL) assert_int_equal(sa_config_parse(&cfg, spec, err, sizeof err), SA_OK);
  sa_arena *a = NULL;
  assert_int_equal(sa_arena_create(&cfg, &a), SA_OK);
  assert_non_null(a);
  assert_int_equal(sa_arena_backend(a), drv->backend);
  return a;
}

static sa_stream make_stream(void) {
  sa_stream s = NULL;
  assert_int_equal(drv->ops->stream_create(drv, &s), SA_OK);
  return s;
}

static void drop_stream(sa_arena *a, sa_stream s) {
  assert_int_equal(drv->ops->stream_synchronize(drv, s), SA_OK);
  assert_int_equal(sa_stream_release(a, s), SA_OK);
  assert_int_equal(drv->ops->stream_destroy(drv, s), SA_OK);
}

static void destroy_clean(sa_arena *a) {
  assert_int_equal(sa_arena_destroy(a), SA_OK);
  if (!on_host) return;
  sa_host_counters c;
  sa_host_get_counters(&c);
  assert_int_equal(c.chunks, 0);
  assert_int_equal(c.mappings, 0);
  assert_int_equal(c.va_ranges, 0);
  assert_int_equal(c.order_violations, 0);
}

/* Device-side writes and host-side reads of 32-bit words. */
static sa_status write_words(void *p, size_t words, uint32_t v, sa_stream s) {
  return drv->ops->memset32_async(drv, (uintptr_t)p, v, words, s);
}

static uint32_t read_word(const void *p, sa_stream s) {
  uint32_t v = 0;
  assert_int_equal(drv->ops->stream_synchronize(drv, s), SA_OK);
  assert_int_equal(drv->ops->copy_to_host(drv, &v, (uintptr_t)p, sizeof v), SA_OK);
  return v;
}

/* Write the head and tail of [p, p + size) (all of it when small) on s and
 * read back its first and last word: both ends are mapped and writable. */
static void fill_and_verify(void *p, size_t size, uint32_t v, sa_stream s) {
  size_t words = size / 4, edge = 16384; /* 64 KiB at each end */
  if (words <= 2 * edge) {
    assert_int_equal(write_words(p, words, v, s), SA_OK);
  } else {
    assert_int_equal(write_words(p, edge, v, s), SA_OK);
    assert_int_equal(write_words((uint32_t *)p + words - edge, edge, v, s), SA_OK);
  }
  assert_int_equal(read_word(p, s), v);
  assert_int_equal(read_word((uint32_t *)p + words - 1, s), v);
}

/* ---------------------------------------------------------------------- */

static void sizes_zero_to_one_gib(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  void *p = (void *)1;
  assert_int_equal(sa_alloc(a, &p, 0, NULL), SA_OK);
  assert_null(p);
  const size_t sizes[] = {4, 1024, MiB, GiB};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    assert_int_equal(sa_alloc(a, &p, sizes[i], NULL), SA_OK);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % SA_ALIGNMENT, 0);
    fill_and_verify(p, sizes[i], 0xC0FFEE00u + (uint32_t)i, NULL);
    assert_int_equal(sa_free(p, NULL), SA_OK);
  }
  destroy_clean(a);
}

static void impossible_size_is_out_of_memory(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  void *p = (void *)1;
  assert_int_equal(sa_alloc(a, &p, SIZE_MAX, NULL), SA_ERR_OUT_OF_MEMORY);
  assert_null(p);
  assert_int_equal(sa_alloc(a, &p, SIZE_MAX - 100, NULL), SA_ERR_OUT_OF_MEMORY);
  assert_int_equal(sa_alloc(a, &p, (size_t)1 << 50, NULL), SA_ERR_OUT_OF_MEMORY);
  sa_stats st;
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_true(st.oom_events >= 3);
  /* The arena still works. */
  assert_int_equal(sa_alloc(a, &p, 4096, NULL), SA_OK);
  assert_int_equal(sa_free(p, NULL), SA_OK);
  destroy_clean(a);
}

/* Live blocks never overlap, and each keeps the pattern written into it. */
static void check_disjoint(void **ptrs, const size_t *sizes, size_t n, sa_stream s) {
  for (size_t i = 0; i < n; i++) {
    uintptr_t a0 = (uintptr_t)ptrs[i], a1 = a0 + sizes[i];
    for (size_t j = i + 1; j < n; j++) {
      uintptr_t b0 = (uintptr_t)ptrs[j], b1 = b0 + sizes[j];
      assert_true(a1 <= b0 || b1 <= a0);
    }
    assert_int_equal(read_word(ptrs[i], s), (uint32_t)i);
    assert_int_equal(read_word((uint32_t *)ptrs[i] + sizes[i] / 4 - 1, s), (uint32_t)i);
  }
}

static void random_allocations_on(sa_stream s) {
  sa_arena *a = make_arena(NULL);
  enum { N = 100 };
  void *ptrs[N] = {0};
  size_t sizes[N];
  unsigned seed = 12345;
  for (size_t i = 0; i < N; i++) {
    sizes[i] = (4 + (size_t)rand_r(&seed) % (5 * MiB)) & ~(size_t)3;
    assert_int_equal(sa_alloc(a, &ptrs[i], sizes[i], s), SA_OK);
    assert_int_equal((uintptr_t)ptrs[i] % SA_ALIGNMENT, 0);
    assert_int_equal(write_words(ptrs[i], 1, (uint32_t)i, s), SA_OK);
    assert_int_equal(write_words((uint32_t *)ptrs[i] + sizes[i] / 4 - 1, 1, (uint32_t)i, s),
                     SA_OK);
  }
  check_disjoint(ptrs, sizes, N, s);
  for (size_t i = 0; i < N; i++) assert_int_equal(sa_free(ptrs[i], s), SA_OK);
  if (s != NULL) assert_int_equal(sa_stream_release(a, s), SA_OK);
  destroy_clean(a);
}

static void random_allocations_default_stream(void **state) {
  (void)state;
  random_allocations_on(NULL);
}

static void random_allocations_created_stream(void **state) {
  (void)state;
  sa_stream s = make_stream();
  random_allocations_on(s);
  assert_int_equal(drv->ops->stream_destroy(drv, s), SA_OK);
}

typedef struct {
  sa_arena *a;
  sa_stream s;
  unsigned seed;
  int ops;
  sa_status failure;
  int line;
} mix_arg;

#define MIX_FAIL(m, st)          \
  do {                           \
    (m)->failure = (st);         \
    (m)->line = __LINE__;        \
  } while (0)

static bool mix_word_is(mix_arg *m, const void *p, uint32_t want) {
  uint32_t v = 0;
  if (drv->ops->stream_synchronize(drv, m->s) != SA_OK) return false;
  if (drv->ops->copy_to_host(drv, &v, (uintptr_t)p, sizeof v) != SA_OK) return false;
  return v == want;
}

/* Random alloc/free mix; every block's first and last word carry its slot
 * number, checked at every eighth free (a device round trip each). */
static void *mixed_worker(void *arg) {
  mix_arg *m = arg;
  enum { SLOTS = 64 };
  void *ptrs[SLOTS] = {0};
  size_t sizes[SLOTS] = {0};
  for (int op = 0; op < m->ops && m->failure == SA_OK; op++) {
    size_t i = (size_t)rand_r(&m->seed) % SLOTS;
    if (ptrs[i] != NULL) {
      if (op % 8 == 0 && (!mix_word_is(m, ptrs[i], (uint32_t)i) ||
                          !mix_word_is(m, (uint32_t *)ptrs[i] + sizes[i] / 4 - 1, (uint32_t)i)))
        MIX_FAIL(m, SA_ERR_INTERNAL);
      sa_status st = sa_free(ptrs[i], m->s);
      if (st != SA_OK) MIX_FAIL(m, st);
      ptrs[i] = NULL;
    } else {
      unsigned r = (unsigned)rand_r(&m->seed);
      sizes[i] = ((r % 8 == 0) ? 4 + (r % (3 * MiB)) : 4 + r % 8192) & ~(size_t)3;
      sa_status st = sa_alloc(m->a, &ptrs[i], sizes[i], m->s);
      if (st == SA_OK) st = write_words(ptrs[i], 1, (uint32_t)i, m->s);
      if (st == SA_OK)
        st = write_words((uint32_t *)ptrs[i] + sizes[i] / 4 - 1, 1, (uint32_t)i, m->s);
      if (st != SA_OK) MIX_FAIL(m, st);
    }
  }
  for (size_t i = 0; i < SLOTS; i++)
    if (ptrs[i] != NULL && sa_free(ptrs[i], m->s) != SA_OK) MIX_FAIL(m, SA_ERR_INTERNAL);
  return NULL;
}

static void mixed_random_single_thread(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  mix_arg m = {a, NULL, 7, 20000, SA_OK, 0};
  mixed_worker(&m);
  assert_int_equal(m.failure, SA_OK);
  sa_stats st;
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.alloc_count, st.free_count);
  assert_int_equal(st.live_bytes, 0);
  assert_true(st.fast_path_ratio > 0.5); /* most ops never leave the thread cache */
  destroy_clean(a);
}

/* large_allocs counts the allocations that took a span, and only those:
 * with it, fast_path_ratio says how the small ones fared. */
static void large_allocs_counts_spans(void **state) {
  (void)state;
  sa_arena *a = make_arena("superblock_size=2MiB,max_physical=64MiB");
  void *small[3], *large[2], *none = NULL;
  for (int i = 0; i < 3; i++) assert_int_equal(sa_alloc(a, &small[i], 4096, NULL), SA_OK);
  for (int i = 0; i < 2; i++) assert_int_equal(sa_alloc(a, &large[i], 8 * MiB, NULL), SA_OK);
  assert_int_equal(sa_alloc(a, &none, 128 * MiB, NULL), SA_ERR_OUT_OF_MEMORY); /* not counted */
  sa_stats st;
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.large_allocs, 2);
  assert_int_equal(st.alloc_count, 5);
  for (int i = 0; i < 3; i++) assert_int_equal(sa_free(small[i], NULL), SA_OK);
  for (int i = 0; i < 2; i++) assert_int_equal(sa_free(large[i], NULL), SA_OK);
  destroy_clean(a);
}

static void run_threads(sa_arena *a, int nthreads, bool own_streams, bool shared_stream) {
  pthread_t t[8];
  mix_arg m[8];
  sa_stream shared = make_stream();
  for (int i = 0; i < nthreads; i++) {
    m[i] = (mix_arg){a, shared_stream ? shared : NULL, (unsigned)(100 + i), 5000, SA_OK, 0};
    if (own_streams) m[i].s = make_stream();
    assert_int_equal(pthread_create(&t[i], NULL, mixed_worker, &m[i]), 0);
  }
  for (int i = 0; i < nthreads; i++) {
    assert_int_equal(pthread_join(t[i], NULL), 0);
    if (m[i].failure != SA_OK) fail_msg("thread %d: %s at line %d", i,
                                        sa_status_string(m[i].failure), m[i].line);
    if (own_streams) drop_stream(a, m[i].s);
  }
  drop_stream(a, shared);
}

static void four_threads_own_streams(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  run_threads(a, 4, true, false);
  sa_stats st;
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.alloc_count, st.free_count);
  destroy_clean(a);
}

static void four_threads_default_stream(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  run_threads(a, 4, false, false);
  destroy_clean(a);
}

static void four_threads_one_created_stream(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  run_threads(a, 4, false, true);
  destroy_clean(a);
}

/* Producer allocates on its stream, consumer frees on either stream. */
typedef struct {
  sa_arena *a;
  sa_stream s;
  void *_Atomic slots[256];
  _Atomic int produced;
  _Atomic int failed;
} pc_arg;

static void *producer(void *arg) {
  pc_arg *pc = arg;
  for (int i = 0; i < 256; i++) {
    void *p;
    if (sa_alloc(pc->a, &p, 256 + (size_t)i * 512, pc->s) != SA_OK ||
        write_words(p, 1, (uint32_t)i, pc->s) != SA_OK ||
        drv->ops->stream_synchronize(drv, pc->s) != SA_OK) {
      atomic_store(&pc->failed, 1);
      break;
    }
    atomic_store(&pc->slots[i], p);
    atomic_store(&pc->produced, i + 1);
  }
  return NULL;
}

static void producer_consumer_across_threads_and_streams(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  sa_stream ps = make_stream(), cs = make_stream();
  static pc_arg pc;
  memset(&pc, 0, sizeof pc);
  pc.a = a;
  pc.s = ps;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, producer, &pc), 0);
  for (int i = 0; i < 256; i++) {
    while (atomic_load(&pc.produced) <= i && !atomic_load(&pc.failed)) sched_yield();
    assert_false(atomic_load(&pc.failed));
    void *p = atomic_load(&pc.slots[i]);
    uint32_t v = 0;
    assert_int_equal(drv->ops->copy_to_host(drv, &v, (uintptr_t)p, sizeof v), SA_OK);
    assert_int_equal(v, (uint32_t)i);
    /* Alternate: free on the consumer's stream, or on the producer's. */
    assert_int_equal(sa_free(p, (i & 1) ? cs : ps), SA_OK);
  }
  assert_int_equal(pthread_join(t, NULL), 0);
  void *q;
  assert_int_equal(sa_alloc(a, &q, 1024, ps), SA_OK);
  assert_int_equal(sa_free(q, ps), SA_OK);
  drop_stream(a, ps);
  drop_stream(a, cs);
  destroy_clean(a);
}

static void alignment_of_every_size(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  void *p[64];
  for (size_t sz = 1; sz <= 3 * MiB; sz = sz * 3 + 1) {
    for (int i = 0; i < 64; i++) {
      assert_int_equal(sa_alloc(a, &p[i], sz, NULL), SA_OK);
      assert_int_equal((uintptr_t)p[i] % SA_ALIGNMENT, 0);
    }
    for (int i = 0; i < 64; i++) assert_int_equal(sa_free(p[i], NULL), SA_OK);
  }
  destroy_clean(a);
}

/* record_stream then free: the memory comes back once both streams are
 * done, and the block cannot be recorded after its free. */
static void record_stream_then_free(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  sa_stream A = make_stream(), C = make_stream();
  void *p, *big;
  assert_int_equal(sa_alloc(a, &p, 4096, A), SA_OK);
  assert_int_equal(sa_alloc(a, &big, 3 * MiB, A), SA_OK);
  assert_int_equal(sa_record_stream(p, C), SA_OK);
  assert_int_equal(sa_record_stream(p, C), SA_OK); /* idempotent */
  assert_int_equal(sa_record_stream(big, C), SA_OK);
  assert_int_equal(sa_record_stream(p, A), SA_OK); /* its own stream: nothing to do */
  assert_int_equal(write_words(p, 1024, 5, C), SA_OK);
  assert_int_equal(write_words(big, 1024, 5, C), SA_OK);
  assert_int_equal(sa_free(p, A), SA_OK);
  assert_int_equal(sa_free(big, A), SA_OK);
  assert_int_equal(sa_record_stream(p, C), SA_ERR_DOUBLE_FREE);
  assert_int_equal(sa_free(p, A), SA_ERR_DOUBLE_FREE);
  assert_int_equal(sa_free(big, A), SA_ERR_DOUBLE_FREE);
  assert_int_equal(sa_record_stream((char *)big + 4096, C), SA_ERR_INVALID_POINTER);
  drop_stream(a, A);
  drop_stream(a, C);
  destroy_clean(a);
}

static void *alloc_and_exit(void *arg) {
  sa_arena *a = arg;
  void *p[100];
  for (int i = 0; i < 100; i++)
    if (sa_alloc(a, &p[i], 1000, NULL) != SA_OK) return (void *)1;
  for (int i = 0; i < 100; i++)
    if (sa_free(p[i], NULL) != SA_OK) return (void *)1;
  return NULL; /* its cache still holds blocks */
}

static void thread_exit_returns_cached_blocks(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  pthread_t t;
  void *ret = (void *)2;
  assert_int_equal(pthread_create(&t, NULL, alloc_and_exit, a), 0);
  assert_int_equal(pthread_join(t, &ret), 0);
  assert_null(ret);
  sa_stats st;
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.superblocks_active, 0);
  assert_int_equal(st.alloc_count, 100);
  assert_int_equal(st.free_count, 100);
  destroy_clean(a);
}

/* Another thread's live bytes reach the arena's count with a lag of at most
 * 256 KiB plus one small block (the large threshold, 1 MiB here), also while
 * it runs alloc+free pairs of 1 MiB blocks; a thread that exits publishes
 * all it counted, and the calling thread's own count is exact. */
#define LIVE_SLACK ((int64_t)(256 << 10) + (int64_t)MiB)

static void assert_live_near(sa_arena *a, int64_t expect) {
  sa_stats st;
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  int64_t diff = (int64_t)st.live_bytes - expect;
  if (diff > LIVE_SLACK || diff < -LIVE_SLACK)
    fail_msg("live_bytes %zu, expected %lld within %lld", st.live_bytes, (long long)expect,
             (long long)LIVE_SLACK);
  assert_true((int64_t)st.live_bytes_peak <= 8 * (int64_t)MiB + LIVE_SLACK);
}

typedef struct live_job_s {
  sa_arena *a;
  pthread_barrier_t step; /* the worker and the test take turns */
  void *p[8];
} live_job;

static void *live_worker(void *arg) {
  live_job *j = arg;
  intptr_t bad = 0;
  for (int i = 0; i < 8; i++) bad |= sa_alloc(j->a, &j->p[i], MiB, NULL) != SA_OK;
  pthread_barrier_wait(&j->step); /* 8 MiB live */
  pthread_barrier_wait(&j->step);
  for (int i = 0; i < 1000; i++) {
    void *q;
    bad |= sa_alloc(j->a, &q, MiB, NULL) != SA_OK;
    bad |= sa_free(q, NULL) != SA_OK;
  }
  pthread_barrier_wait(&j->step); /* still 8 MiB */
  pthread_barrier_wait(&j->step);
  for (int i = 0; i < 8; i++) bad |= sa_free(j->p[i], NULL) != SA_OK;
  pthread_barrier_wait(&j->step); /* none */
  pthread_barrier_wait(&j->step);
  for (int i = 0; i < 5; i++) bad |= sa_alloc(j->a, &j->p[i], MiB, NULL) != SA_OK;
  return (void *)bad; /* exits holding 5 MiB */
}

static void live_bytes_within_slack_of_one_block(void **state) {
  (void)state;
  /* No stream-order checking: with it on, every call publishes at once. */
  sa_config cfg;
  sa_config_init(&cfg);
  assert_int_equal(sa_config_parse(&cfg, "backend=host", NULL, 0), SA_OK);
  sa_arena *a = NULL;
  assert_int_equal(sa_arena_create(&cfg, &a), SA_OK);
  live_job job = {.a = a};
  assert_int_equal(pthread_barrier_init(&job.step, NULL, 2), 0);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, live_worker, &job), 0);
  const int64_t expect[3] = {8 * (int64_t)MiB, 8 * (int64_t)MiB, 0};
  for (int phase = 0; phase < 3; phase++) {
    pthread_barrier_wait(&job.step);
    assert_live_near(a, expect[phase]);
    pthread_barrier_wait(&job.step);
  }
  void *ret = (void *)2;
  assert_int_equal(pthread_join(t, &ret), 0);
  assert_null(ret);
  sa_stats st;
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.live_bytes, 5 * MiB);
  for (int i = 0; i < 5; i++) assert_int_equal(sa_free(job.p[i], NULL), SA_OK);
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.live_bytes, 0);
  assert_int_equal(pthread_barrier_destroy(&job.step), 0);
  destroy_clean(a);
}

static void stream_release_returns_memory(void **state) {
  (void)state;
  sa_arena *a = make_arena("max_physical=8MiB");
  sa_stream s = make_stream();
  void *p[4], *live;
  for (int i = 0; i < 4; i++) assert_int_equal(sa_alloc(a, &p[i], MiB / 2, s), SA_OK);
  assert_int_equal(sa_alloc(a, &live, 3 * MiB, s), SA_OK); /* stays allocated */
  for (int i = 0; i < 4; i++) {
    assert_int_equal(write_words(p[i], MiB / 8, 5, s), SA_OK);
    assert_int_equal(sa_free(p[i], s), SA_OK);
  }
  assert_int_equal(sa_stream_release(a, s), SA_OK); /* waits for s's work */
  sa_stats st;
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.streams, 0);
  assert_int_equal(drv->ops->stream_destroy(drv, s), SA_OK);
  /* A new stream (maybe with the same handle value) starts clean and can
   * use what s held; the live block stays valid and frees later. */
  sa_stream t = make_stream();
  void *q;
  assert_int_equal(sa_alloc(a, &q, 4 * MiB, t), SA_OK);
  fill_and_verify(q, 4 * MiB, 6, t);
  assert_int_equal(sa_free(live, t), SA_OK);
  assert_int_equal(sa_free(q, t), SA_OK);
  assert_int_equal(sa_stream_release(a, s), SA_OK); /* unknown by now: fine */
  drop_stream(a, t);
  destroy_clean(a);
}

static void superblock_size_tuning(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  sa_stats st;
  void *p;
  assert_int_equal(sa_set_superblock_size(a, 3 * MiB), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_set_superblock_size(a, 0), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_set_superblock_size(NULL, 2 * MiB), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_alloc(a, &p, 1536 * 1024, NULL), SA_OK); /* > 1 MiB: a span */
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.large_spans, 1);
  assert_int_equal(sa_free(p, NULL), SA_OK);
  assert_int_equal(sa_set_superblock_size(a, 8 * MiB), SA_OK);
  assert_int_equal(sa_alloc(a, &p, 1536 * 1024, NULL), SA_OK); /* now a small block */
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.large_spans, 0);
  assert_int_equal(st.superblocks_total, 1);
  /* + the free span's run: its 2 MiB growth, a new live peak, mapped as
   * much again ahead (a fresh run's bound under the footprint target). */
  assert_int_equal(st.va_used_bytes, 8 * MiB + 4 * MiB);
  fill_and_verify(p, 1536 * 1024, 3, NULL);
  assert_int_equal(sa_free(p, NULL), SA_OK);
  destroy_clean(a);
}

/* The granularity is public and agrees with the device; the configuration
 * rules name the key and the rule on this backend too. */
static void granularity_and_configuration_rules(void **state) {
  (void)state;
  size_t g = 0, want = 0;
  assert_int_equal(drv->ops->granularity(drv, &want), SA_OK);
  assert_int_equal(sa_device_granularity(drv->backend, 0, &g), SA_OK);
  assert_int_equal(g, want);
  sa_arena *a = make_arena(NULL);
  assert_int_equal(sa_arena_granularity(a), g);
  destroy_clean(a);
  sa_config cfg;
  sa_config_init(&cfg);
  cfg.backend = drv->backend;
  cfg.superblock_size = g + g / 2;
  char err[256];
  assert_int_equal(sa_config_check(&cfg, err, sizeof err), SA_ERR_BAD_CONFIG);
  assert_non_null(strstr(err, "superblock_size="));
  assert_non_null(strstr(err, "granularity"));
  cfg.superblock_size = 17 * g; /* 34 MiB on 2 MiB granules */
  cfg.large_threshold = 17 * g; /* a request just under it is a 36 MiB block */
  assert_int_equal(sa_config_check(&cfg, err, sizeof err), SA_ERR_BAD_CONFIG);
  assert_non_null(strstr(err, "large_threshold="));
  assert_int_equal(sa_arena_create(&cfg, &a), SA_ERR_BAD_CONFIG);
}

/* After the superblock size grows, a class too large for the older empty
 * superblocks gets a new one, and everything still trims away. */
static void superblock_growth_loses_nothing(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  sa_stream s = NULL; /* alloc_and_exit's */
  void *p[2];
  pthread_t t; /* leaves an empty superblock of one granule on s */
  assert_int_equal(pthread_create(&t, NULL, alloc_and_exit, a), 0);
  void *ret;
  assert_int_equal(pthread_join(t, &ret), 0);
  assert_null(ret);
  sa_stats st;
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.superblocks_empty, 1);
  assert_int_equal(sa_set_superblock_size(a, 4 * sa_arena_granularity(a)), SA_OK);
  size_t big = 3 * sa_arena_granularity(a) / 2; /* a small block now, larger than a granule */
  assert_int_equal(sa_alloc(a, &p[0], big, s), SA_OK);
  fill_and_verify(p[0], big, 7, s);
  assert_int_equal(sa_alloc(a, &p[1], 4096, s), SA_OK);
  assert_int_equal(sa_free(p[0], s), SA_OK);
  assert_int_equal(sa_free(p[1], s), SA_OK);
  assert_int_equal(sa_trim(a, 0), SA_OK);
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.superblocks_total, 0);
  assert_int_equal(st.reserved_bytes, 0);
  destroy_clean(a);
}

/* Empty superblocks count with their own size, not the size new ones get
 * after sa_set_superblock_size: cached memory never exceeds reserved. */
static void cached_bytes_use_each_superblocks_size(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  pthread_t t;
  void *ret = (void *)2;
  assert_int_equal(pthread_create(&t, NULL, alloc_and_exit, a), 0); /* leaves an empty one */
  assert_int_equal(pthread_join(t, &ret), 0);
  assert_null(ret);
  assert_int_equal(sa_set_superblock_size(a, 64 * MiB), SA_OK);
  sa_stats st;
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.superblocks_empty, 1);
  assert_int_equal(st.reserved_bytes, 2 * MiB);
  assert_int_equal(st.cached_bytes, 2 * MiB);
  destroy_clean(a);
}

static void stats_track_live_and_reserved(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  void *p[10];
  for (int i = 0; i < 10; i++) assert_int_equal(sa_alloc(a, &p[i], 4 * MiB, NULL), SA_OK);
  sa_stats st;
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.live_bytes, 40 * MiB);
  /* + 4 MiB mapped ahead by the climb's last growth (1/512 of what is
   * held, at least 4 granules: 8 MiB, 4 of them used since) */
  assert_int_equal(st.reserved_bytes, 44 * MiB);
  assert_int_equal(st.large_spans, 10);
  for (int i = 0; i < 10; i++) assert_int_equal(sa_free(p[i], NULL), SA_OK);
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.live_bytes, 0);
  assert_int_equal(st.live_bytes_peak, 40 * MiB);
  assert_int_equal(st.cached_bytes, 44 * MiB);
  assert_int_equal(sa_trim(a, 8 * MiB), SA_OK);
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_true(st.reserved_bytes <= 8 * MiB);
  assert_int_equal(st.reserved_bytes_peak, 44 * MiB);
  assert_int_equal(sa_trim(a, 0), SA_OK);
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.reserved_bytes, 0);
  destroy_clean(a);
}

/* Freed small blocks are stitched into a large span under a tight cap. */
static void small_frees_become_one_large_span(void **state) {
  (void)state;
  sa_arena *a = make_arena("max_physical=16MiB");
  void *p[64];
  for (int i = 0; i < 64; i++) assert_int_equal(sa_alloc(a, &p[i], 256 * 1024, NULL), SA_OK);
  for (int i = 0; i < 64; i++) assert_int_equal(sa_free(p[i], NULL), SA_OK);
  void *big;
  assert_int_equal(sa_alloc(a, &big, 16 * MiB, NULL), SA_OK);
  fill_and_verify(big, 16 * MiB, 77, NULL);
  sa_stats st;
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_true(st.reserved_bytes_peak <= 16 * MiB);
  assert_int_equal(sa_free(big, NULL), SA_OK);
  destroy_clean(a);
}

static int oom_calls;
static void *oom_hostage;
static int release_hostage(sa_arena *a, size_t size, sa_stream s, void *ud) {
  (void)a, (void)size, (void)ud;
  oom_calls++;
  if (oom_hostage == NULL) return 0;
  assert_int_equal(sa_free(oom_hostage, s), SA_OK);
  oom_hostage = NULL;
  return 1;
}

static void oom_callback_may_free_and_retry(void **state) {
  (void)state;
  sa_config cfg;
  sa_config_init(&cfg);
  cfg.backend = drv->backend;
  assert_int_equal(sa_config_parse(&cfg, "max_physical=8MiB", NULL, 0), SA_OK);
  cfg.oom_callback = release_hostage;
  sa_arena *a;
  assert_int_equal(sa_arena_create(&cfg, &a), SA_OK);
  assert_int_equal(sa_alloc(a, &oom_hostage, 6 * MiB, NULL), SA_OK);
  void *p;
  oom_calls = 0;
  assert_int_equal(sa_alloc(a, &p, 6 * MiB, NULL), SA_OK);
  assert_int_equal(oom_calls, 1);
  assert_int_equal(sa_alloc(a, &oom_hostage, 6 * MiB, NULL), SA_ERR_OUT_OF_MEMORY);
  assert_int_equal(oom_calls, 2);
  assert_int_equal(sa_free(p, NULL), SA_OK);
  destroy_clean(a);
}

/* release_hostage that always asks for one more attempt, as the header
 * allows (at most 8 times). */
static int release_hostage_and_retry(sa_arena *a, size_t size, sa_stream s, void *ud) {
  (void)release_hostage(a, size, s, ud);
  return 1;
}

/* alloc_generic compared the raw size with max_physical: under a cap of
 * 2.5 granules (5 MiB with 2 MiB granules) a request of the cap, which maps
 * 3 granules, went through every reclaim step, synchronized the device and
 * asked the callback 8 times, though the header says it is not called for a
 * size that no attempt can fit. A size that fits once the callback freed
 * memory still reaches it. */
static void an_unfittable_size_never_reaches_the_oom_callback(void **state) {
  (void)state;
  size_t gran;
  assert_int_equal(sa_device_granularity(drv->backend, 0, &gran), SA_OK);
  size_t cap = 2 * gran + gran / 2;
  char spec[64];
  snprintf(spec, sizeof spec, "max_physical=%zu", cap);
  sa_config cfg;
  sa_config_init(&cfg);
  cfg.backend = drv->backend;
  assert_int_equal(sa_config_parse(&cfg, spec, NULL, 0), SA_OK);
  cfg.oom_callback = release_hostage_and_retry;
  sa_arena *a;
  assert_int_equal(sa_arena_create(&cfg, &a), SA_OK);
  assert_int_equal(sa_alloc(a, &oom_hostage, gran, NULL), SA_OK); /* a span: one granule */
  oom_calls = 0;
  uint64_t syncs = on_host ? sa_host_call_count(SA_HOST_FN_DEVICE_SYNCHRONIZE) : 0;
  const size_t unfittable[] = {cap, 2 * gran + 1, SIZE_MAX / 2};
  for (size_t i = 0; i < sizeof unfittable / sizeof unfittable[0]; i++) {
    void *p = (void *)1;
    assert_int_equal(sa_alloc(a, &p, unfittable[i], NULL), SA_ERR_OUT_OF_MEMORY);
    assert_null(p);
  }
  assert_int_equal(oom_calls, 0);
  assert_non_null(oom_hostage); /* still live: nothing asked for it */
  if (on_host) assert_int_equal(sa_host_call_count(SA_HOST_FN_DEVICE_SYNCHRONIZE), syncs);
  /* Two granules fit, once the hostage's one is free: the callback frees it. */
  void *p;
  assert_int_equal(sa_alloc(a, &p, 2 * gran, NULL), SA_OK);
  assert_int_equal(oom_calls, 1);
  assert_null(oom_hostage);
  assert_int_equal(sa_free(p, NULL), SA_OK);
  destroy_clean(a);
}

static void destroy_reports_live_blocks(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  void *p, *q;
  assert_int_equal(sa_alloc(a, &p, 100, NULL), SA_OK);
  assert_int_equal(sa_alloc(a, &q, 5 * MiB, NULL), SA_OK);
  assert_int_equal(sa_arena_destroy(a), SA_ERR_LIVE_BLOCKS);
  /* Its memory is gone, and so is its address range: */
  assert_int_equal(sa_free(p, NULL), SA_ERR_INVALID_POINTER);
  assert_int_equal(sa_free(q, NULL), SA_ERR_INVALID_POINTER);
  if (on_host) {
    sa_host_counters c;
    sa_host_get_counters(&c);
    assert_int_equal(c.chunks, 0);
    assert_int_equal(c.va_ranges, 0);
  }
}

static void bad_pointers_and_double_free(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  void *p, *big;
  int local;
  assert_int_equal(sa_alloc(a, &p, 1000, NULL), SA_OK);
  assert_int_equal(sa_alloc(a, &big, 5 * MiB, NULL), SA_OK);
  assert_int_equal(sa_free(&local, NULL), SA_ERR_INVALID_POINTER);
  assert_int_equal(sa_free((char *)p + 256, NULL), SA_ERR_INVALID_POINTER);
  assert_int_equal(sa_free((char *)big + 4096, NULL), SA_ERR_INVALID_POINTER);
  if (on_host) /* CUDA cannot vet a garbage stream handle without crashing */
    assert_int_equal(sa_free(p, (sa_stream)&local), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(sa_free(p, NULL), SA_OK);
  assert_int_equal(sa_free(p, NULL), SA_ERR_DOUBLE_FREE);
  assert_int_equal(sa_free(big, NULL), SA_OK);
  assert_int_equal(sa_free(big, NULL), SA_ERR_DOUBLE_FREE);
  if (on_host) {
    assert_int_equal(sa_alloc(a, &p, 64, (sa_stream)&local), SA_ERR_UNKNOWN_STREAM);
    assert_null(p);
  }
  assert_int_equal(sa_alloc(NULL, &p, 64, NULL), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_alloc(a, NULL, 64, NULL), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_free(NULL, NULL), SA_OK);
  destroy_clean(a);
}

static void default_arena_drop_in_calls(void **state) {
  (void)state;
  void *p;
  assert_int_equal(sa_malloc_async(&p, 12345, NULL), SA_OK);
  fill_and_verify(p, 12344, 9, NULL);
  assert_int_equal(sa_free_async(p, NULL), SA_OK);
  sa_arena *a;
  assert_int_equal(sa_default_arena(0, &a), SA_OK);
  assert_int_equal(sa_arena_backend(a), drv->backend);
  sa_default_arenas_shutdown();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sizes_zero_to_one_gib),
      cmocka_unit_test(impossible_size_is_out_of_memory),
      cmocka_unit_test(random_allocations_default_stream),
      cmocka_unit_test(random_allocations_created_stream),
      cmocka_unit_test(mixed_random_single_thread),
      cmocka_unit_test(large_allocs_counts_spans),
      cmocka_unit_test(four_threads_own_streams),
      cmocka_unit_test(four_threads_default_stream),
      cmocka_unit_test(four_threads_one_created_stream),
      cmocka_unit_test(producer_consumer_across_threads_and_streams),
      cmocka_unit_test(alignment_of_every_size),
      cmocka_unit_test(record_stream_then_free),
      cmocka_unit_test(thread_exit_returns_cached_blocks),
      cmocka_unit_test(stream_release_returns_memory),
      cmocka_unit_test(superblock_size_tuning),
      cmocka_unit_test(granularity_and_configuration_rules),
      cmocka_unit_test(superblock_growth_loses_nothing),
      cmocka_unit_test(stats_track_live_and_reserved),
      cmocka_unit_test(cached_bytes_use_each_superblocks_size),
      cmocka_unit_test(live_bytes_within_slack_of_one_block),
      cmocka_unit_test(small_frees_become_one_large_span),
      cmocka_unit_test(oom_callback_may_free_and_retry),
      cmocka_unit_test(an_unfittable_size_never_reaches_the_oom_callback),
      cmocka_unit_test(destroy_reports_live_blocks),
      cmocka_unit_test(bad_pointers_and_double_free),
      cmocka_unit_test(default_arena_drop_in_calls),
  };
  return cmocka_run_group_tests(tests, open_backend, close_backend);
}
