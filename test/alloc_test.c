/* The allocator core on the host simulator: sizes, streams, threads,
 * stream-ordered reuse, record_stream, thread exit, stream release, tuning,
 * statistics, out of memory.
 *
 * Streams created here are SA_HOST_MANUAL unless a test says otherwise:
 * their work completes only when the test steps them, so the order in which
 * simulated kernels touch memory is the test's choice, and any reuse the
 * contract forbids shows up as a wrong pattern (and as a stream-order
 * checker finding: every arena here checks stream order).
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

static sa_arena *make_arena(const char *spec) {
  sa_config cfg;
  sa_config_init(&cfg);
  char err[128];
  assert_int_equal(sa_config_parse(&cfg, "backend=host,check_stream_order=1", err, sizeof err),
                   SA_OK);
  if (spec != NULL) assert_int_equal(sa_config_parse(&cfg, spec, err, sizeof err), SA_OK);
  sa_arena *a = NULL;
  assert_int_equal(sa_arena_create(&cfg, &a), SA_OK);
  assert_non_null(a);
  assert_int_equal(sa_arena_backend(a), SA_BACKEND_HOST);
  return a;
}

static sa_stream make_stream(sa_host_mode mode) {
  sa_stream s = NULL;
  assert_int_equal(sa_host_stream_create(mode, &s), SA_OK);
  return s;
}

static uint64_t violations(void) {
  sa_host_counters c;
  sa_host_get_counters(&c);
  return c.order_violations;
}

static void destroy_clean(sa_arena *a) {
  assert_int_equal(sa_arena_destroy(a), SA_OK);
  sa_host_counters c;
  sa_host_get_counters(&c);
  assert_int_equal(c.chunks, 0);
  assert_int_equal(c.mappings, 0);
  assert_int_equal(c.va_ranges, 0);
}

/* Write and read back the first and last word of [p, p + size). */
static void touch(void *p, size_t size, uint32_t v) {
  uint32_t *w = p;
  w[0] = v;
  w[size / 4 - 1] = v;
  assert_int_equal(w[0], v);
  assert_int_equal(w[size / 4 - 1], v);
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
    if (sizes[i] >= 4) touch(p, sizes[i] & ~(size_t)3, 0xC0FFEE00u + (uint32_t)i);
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
static void check_disjoint(void **ptrs, const size_t *sizes, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (ptrs[i] == NULL) continue;
    uintptr_t a0 = (uintptr_t)ptrs[i], a1 = a0 + sizes[i];
    for (size_t j = i + 1; j < n; j++) {
      if (ptrs[j] == NULL) continue;
      uintptr_t b0 = (uintptr_t)ptrs[j], b1 = b0 + sizes[j];
      assert_true(a1 <= b0 || b1 <= a0);
    }
    uint32_t *w = ptrs[i];
    assert_int_equal(w[0], (uint32_t)i);
    assert_int_equal(w[sizes[i] / 4 - 1], (uint32_t)i);
  }
}

static void random_allocations_on(sa_stream s) {
  sa_arena *a = make_arena(NULL);
  enum { N = 100 };
  void *ptrs[N] = {0};
  size_t sizes[N];
  unsigned seed = 12345;
  for (size_t i = 0; i < N; i++) {
    sizes[i] = 4 + (size_t)rand_r(&seed) % (5 * MiB);
    sizes[i] &= ~(size_t)3;
    assert_int_equal(sa_alloc(a, &ptrs[i], sizes[i], s), SA_OK);
    assert_int_equal((uintptr_t)ptrs[i] % SA_ALIGNMENT, 0);
    touch(ptrs[i], sizes[i], (uint32_t)i);
  }
  check_disjoint(ptrs, sizes, N);
  for (size_t i = 0; i < N; i++) assert_int_equal(sa_free(ptrs[i], s), SA_OK);
  destroy_clean(a);
}

static void random_allocations_default_stream(void **state) {
  (void)state;
  random_allocations_on(NULL);
}

static void random_allocations_created_stream(void **state) {
  (void)state;
  sa_stream s = make_stream(SA_HOST_AUTO);
  random_allocations_on(s);
  assert_int_equal(sa_host_stream_destroy(s), SA_OK);
}

typedef struct {
  sa_arena *a;
  sa_stream s;
  unsigned seed;
  int ops;
  sa_status failure;
} mix_arg;

/* Random alloc/free mix with overlap and content checks. */
static void *mixed_worker(void *arg) {
  mix_arg *m = arg;
  enum { SLOTS = 64 };
  void *ptrs[SLOTS] = {0};
  size_t sizes[SLOTS] = {0};
  for (int op = 0; op < m->ops && m->failure == SA_OK; op++) {
    size_t i = (size_t)rand_r(&m->seed) % SLOTS;
    if (ptrs[i] != NULL) {
      uint32_t *w = ptrs[i];
      if (w[0] != (uint32_t)i || w[sizes[i] / 4 - 1] != (uint32_t)i) m->failure = SA_ERR_INTERNAL;
      m->failure = m->failure != SA_OK ? m->failure : sa_free(ptrs[i], m->s);
      ptrs[i] = NULL;
    } else {
      unsigned r = (unsigned)rand_r(&m->seed);
      sizes[i] = (r % 8 == 0) ? 4 + (r % (3 * MiB)) : 4 + r % 8192;
      sizes[i] &= ~(size_t)3;
      sa_status st = sa_alloc(m->a, &ptrs[i], sizes[i], m->s);
      if (st != SA_OK) {
        m->failure = st;
        break;
      }
      uint32_t *w = ptrs[i];
      w[0] = (uint32_t)i;
      w[sizes[i] / 4 - 1] = (uint32_t)i;
    }
  }
  for (size_t i = 0; i < SLOTS; i++)
    if (ptrs[i] != NULL && sa_free(ptrs[i], m->s) != SA_OK) m->failure = SA_ERR_INTERNAL;
  return NULL;
}

static void mixed_random_single_thread(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  mix_arg m = {a, NULL, 7, 20000, SA_OK};
  mixed_worker(&m);
  assert_int_equal(m.failure, SA_OK);
  sa_stats st;
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.alloc_count, st.free_count);
  assert_true(st.fast_path_ratio > 0.5);
  destroy_clean(a);
}

static void run_threads(sa_arena *a, int nthreads, bool own_streams, bool shared_stream) {
  pthread_t t[8];
  mix_arg m[8];
  sa_stream shared = make_stream(SA_HOST_AUTO);
  for (int i = 0; i < nthreads; i++) {
    m[i] = (mix_arg){a, shared_stream ? shared : NULL, (unsigned)(100 + i), 5000, SA_OK};
    if (own_streams) m[i].s = make_stream(SA_HOST_AUTO);
    assert_int_equal(pthread_create(&t[i], NULL, mixed_worker, &m[i]), 0);
  }
  for (int i = 0; i < nthreads; i++) {
    assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_int_equal(m[i].failure, SA_OK);
    if (own_streams) {
      assert_int_equal(sa_stream_release(a, m[i].s), SA_OK);
      assert_int_equal(sa_host_stream_destroy(m[i].s), SA_OK);
    }
  }
  assert_int_equal(sa_stream_release(a, shared), SA_OK);
  assert_int_equal(sa_host_stream_destroy(shared), SA_OK);
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

/* Producer allocates on its stream, consumer frees on its own. */
typedef struct {
  sa_arena *a;
  sa_stream s;
  void *volatile slots[256];
  _Atomic int produced, consumed;
  sa_status failure;
} pc_arg;

static void *producer(void *arg) {
  pc_arg *pc = arg;
  for (int i = 0; i < 256; i++) {
    void *p;
    if (sa_alloc(pc->a, &p, 256 + (size_t)i * 512, pc->s) != SA_OK) {
      pc->failure = SA_ERR_INTERNAL;
      break;
    }
    *(uint32_t *)p = (uint32_t)i;
    pc->slots[i] = p;
    atomic_store(&pc->produced, i + 1);
  }
  return NULL;
}

static void producer_consumer_across_threads_and_streams(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  sa_stream ps = make_stream(SA_HOST_AUTO), cs = make_stream(SA_HOST_AUTO);
  static pc_arg pc;
  memset(&pc, 0, sizeof pc);
  pc.a = a;
  pc.s = ps;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, producer, &pc), 0);
  for (int i = 0; i < 256; i++) {
    while (atomic_load(&pc.produced) <= i && pc.failure == SA_OK) sched_yield();
    void *p = pc.slots[i];
    assert_int_equal(*(uint32_t *)p, (uint32_t)i);
    /* Alternate: free on the consumer's stream, or on the producer's. */
    assert_int_equal(sa_free(p, (i & 1) ? cs : ps), SA_OK);
  }
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(pc.failure, SA_OK);
  /* Cross-stream frees come back once their events complete. */
  assert_int_equal(sa_host_drain_all(), SA_OK);
  void *q;
  assert_int_equal(sa_alloc(a, &q, 1024, ps), SA_OK);
  assert_int_equal(sa_free(q, ps), SA_OK);
  assert_int_equal(violations(), 0);
  assert_int_equal(sa_stream_release(a, ps), SA_OK);
  assert_int_equal(sa_stream_release(a, cs), SA_OK);
  destroy_clean(a);
  assert_int_equal(sa_host_stream_destroy(ps), SA_OK);
  assert_int_equal(sa_host_stream_destroy(cs), SA_OK);
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

/* Contract 1.2: a block freed on A with A's work still pending is handed to
 * B only behind a wait edge. A small physical cap forces the reuse. Stream
 * B is run first; A's late fill must not clobber B's pattern. */
static void cross_stream_reuse_waits_for_event(size_t block) {
  char spec[96];
  snprintf(spec, sizeof spec, "max_physical=%zu", (size_t)8 * MiB);
  sa_arena *a = make_arena(spec);
  sa_stream A = make_stream(SA_HOST_MANUAL), B = make_stream(SA_HOST_MANUAL);
  enum { N = 256 }; /* more than the cap holds: A takes all of it */
  void *pa[N], *pb[N];
  size_t n = 0;
  while (n < N && sa_alloc(a, &pa[n], block, A) == SA_OK) {
    assert_int_equal(sa_host_fill(A, pa[n], block, 0xAAAAAAAAu), SA_OK);
    n++;
  }
  assert_true(n >= 2 && n < N);
  for (size_t i = 0; i < n; i++) assert_int_equal(sa_free(pa[i], A), SA_OK);
  /* B takes the same amount: it can only get A's memory. */
  uint64_t mism = 0;
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(sa_alloc(a, &pb[i], block, B), SA_OK);
    assert_int_equal(sa_host_fill(B, pb[i], block, 0xBBBBBBBBu), SA_OK);
  }
  for (size_t i = 0; i < n; i++)
    assert_int_equal(sa_host_check(B, pb[i], block, 0xBBBBBBBBu, &mism), SA_OK);
  /* Adversarial order: B as far as it can go, then A, then the rest of B. */
  size_t done = 0;
  assert_int_equal(sa_host_stream_step(B, SIZE_MAX, &done), SA_OK);
  assert_true(sa_host_stream_pending(B) > 0); /* B waits for A's event */
  assert_int_equal(sa_host_stream_drain(A), SA_OK);
  assert_int_equal(sa_host_stream_drain(B), SA_OK);
  assert_int_equal(mism, 0);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(((uint32_t *)pb[i])[0], 0xBBBBBBBBu);
    assert_int_equal(sa_free(pb[i], B), SA_OK);
  }
  assert_int_equal(violations(), 0);
  assert_int_equal(sa_stream_release(a, A), SA_OK);
  assert_int_equal(sa_stream_release(a, B), SA_OK);
  destroy_clean(a);
  assert_int_equal(sa_host_stream_destroy(A), SA_OK);
  assert_int_equal(sa_host_stream_destroy(B), SA_OK);
}

static void cross_stream_small_blocks_wait_for_event(void **state) {
  (void)state;
  cross_stream_reuse_waits_for_event(64 * 1024);
}

static void cross_stream_large_spans_wait_for_event(void **state) {
  (void)state;
  cross_stream_reuse_waits_for_event(3 * MiB);
}

/* Freed on another stream than the allocating one: the owner reuses the
 * block only after the freeing stream's work (here run last). */
static void free_on_other_stream_defers_reuse(void **state) {
  (void)state;
  sa_arena *a = make_arena("max_physical=4MiB");
  sa_stream A = make_stream(SA_HOST_MANUAL), B = make_stream(SA_HOST_MANUAL);
  size_t block = 512 * 1024;
  void *p[8];
  size_t n = 0;
  while (n < 8 && sa_alloc(a, &p[n], block, A) == SA_OK) n++;
  assert_true(n >= 4);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(sa_host_fill(B, p[i], block, 0xB0B0B0B0u), SA_OK); /* B uses them */
    assert_int_equal(sa_free(p[i], B), SA_OK);
  }
  sa_stats st;
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  /* A gets its memory back only behind B's event. */
  uint64_t mism = 0;
  void *q[8];
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(sa_alloc(a, &q[i], block, A), SA_OK);
    assert_int_equal(sa_host_fill(A, q[i], block, 0xA0A0A0A0u), SA_OK);
    assert_int_equal(sa_host_check(A, q[i], block, 0xA0A0A0A0u, &mism), SA_OK);
  }
  size_t done;
  assert_int_equal(sa_host_stream_step(A, SIZE_MAX, &done), SA_OK);
  assert_int_equal(sa_host_stream_drain(B), SA_OK);
  assert_int_equal(sa_host_stream_drain(A), SA_OK);
  assert_int_equal(mism, 0);
  assert_int_equal(violations(), 0);
  for (size_t i = 0; i < n; i++) assert_int_equal(sa_free(q[i], A), SA_OK);
  assert_int_equal(sa_stream_release(a, A), SA_OK);
  assert_int_equal(sa_stream_release(a, B), SA_OK);
  destroy_clean(a);
  assert_int_equal(sa_host_stream_destroy(A), SA_OK);
  assert_int_equal(sa_host_stream_destroy(B), SA_OK);
}

static void record_stream_delays_reuse(void **state) {
  (void)state;
  sa_arena *a = make_arena("max_physical=4MiB");
  sa_stream A = make_stream(SA_HOST_MANUAL), C = make_stream(SA_HOST_MANUAL);
  size_t block = 512 * 1024;
  void *p[8];
  size_t n = 0;
  while (n < 8 && sa_alloc(a, &p[n], block, A) == SA_OK) n++;
  assert_true(n >= 4);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(sa_host_fill(C, p[i], block, 0xC0C0C0C0u), SA_OK);
    assert_int_equal(sa_record_stream(p[i], C), SA_OK);
    assert_int_equal(sa_free(p[i], A), SA_OK);
  }
  assert_int_equal(sa_record_stream(p[0], C), SA_ERR_DOUBLE_FREE);
  uint64_t mism = 0;
  void *q[8];
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(sa_alloc(a, &q[i], block, A), SA_OK);
    assert_int_equal(sa_host_fill(A, q[i], block, 0xA1A1A1A1u), SA_OK);
    assert_int_equal(sa_host_check(A, q[i], block, 0xA1A1A1A1u, &mism), SA_OK);
  }
  size_t done;
  assert_int_equal(sa_host_stream_step(A, SIZE_MAX, &done), SA_OK);
  assert_int_equal(sa_host_stream_drain(C), SA_OK);
  assert_int_equal(sa_host_stream_drain(A), SA_OK);
  assert_int_equal(mism, 0);
  assert_int_equal(violations(), 0);
  for (size_t i = 0; i < n; i++) assert_int_equal(sa_free(q[i], A), SA_OK);
  assert_int_equal(sa_stream_release(a, A), SA_OK);
  assert_int_equal(sa_stream_release(a, C), SA_OK);
  destroy_clean(a);
  assert_int_equal(sa_host_stream_destroy(A), SA_OK);
  assert_int_equal(sa_host_stream_destroy(C), SA_OK);
}

/* Same stream: a freed block may be handed out again at once. */
static void same_stream_reuse_is_immediate(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  sa_stream A = make_stream(SA_HOST_MANUAL);
  void *p, *q;
  assert_int_equal(sa_alloc(a, &p, 4096, A), SA_OK);
  assert_int_equal(sa_host_fill(A, p, 4096, 1), SA_OK);
  assert_int_equal(sa_free(p, A), SA_OK);
  assert_int_equal(sa_alloc(a, &q, 4096, A), SA_OK);
  assert_ptr_equal(p, q);
  uint64_t mism = 0;
  assert_int_equal(sa_host_fill(A, q, 4096, 2), SA_OK);
  assert_int_equal(sa_host_check(A, q, 4096, 2, &mism), SA_OK);
  assert_int_equal(sa_host_stream_drain(A), SA_OK);
  assert_int_equal(mism, 0);
  assert_int_equal(sa_free(q, A), SA_OK);
  assert_int_equal(sa_stream_release(a, A), SA_OK);
  destroy_clean(a);
  assert_int_equal(sa_host_stream_destroy(A), SA_OK);
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

static void stream_release_returns_memory(void **state) {
  (void)state;
  sa_arena *a = make_arena("max_physical=8MiB");
  sa_stream s = make_stream(SA_HOST_MANUAL);
  void *p[4], *live;
  for (int i = 0; i < 4; i++) assert_int_equal(sa_alloc(a, &p[i], MiB / 2, s), SA_OK);
  assert_int_equal(sa_alloc(a, &live, 3 * MiB, s), SA_OK); /* stays allocated */
  for (int i = 0; i < 4; i++) {
    assert_int_equal(sa_host_fill(s, p[i], MiB / 2, 5), SA_OK);
    assert_int_equal(sa_free(p[i], s), SA_OK);
  }
  assert_int_equal(sa_stream_release(a, s), SA_OK); /* waits for s's work */
  assert_int_equal(sa_host_stream_pending(s), 0);
  sa_stats st;
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.streams, 0);
  assert_int_equal(sa_host_stream_destroy(s), SA_OK);
  /* A new stream (maybe with the same handle value) starts clean and can
   * use what s held; the live block stays valid and frees later. */
  sa_stream t = make_stream(SA_HOST_MANUAL);
  void *q;
  assert_int_equal(sa_alloc(a, &q, 4 * MiB, t), SA_OK);
  assert_int_equal(sa_host_fill(t, q, 4 * MiB, 6), SA_OK);
  assert_int_equal(sa_free(live, t), SA_OK);
  assert_int_equal(sa_free(q, t), SA_OK);
  assert_int_equal(sa_host_stream_drain(t), SA_OK);
  assert_int_equal(violations(), 0);
  assert_int_equal(sa_stream_release(a, t), SA_OK);
  destroy_clean(a);
  assert_int_equal(sa_host_stream_destroy(t), SA_OK);
}

static void superblock_size_tuning(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  sa_stats st;
  void *p;
  assert_int_equal(sa_set_superblock_size(a, 3 * MiB), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_set_superblock_size(a, 0), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_alloc(a, &p, 1536 * 1024, NULL), SA_OK); /* > 1 MiB: a span */
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.large_spans, 1);
  assert_int_equal(sa_free(p, NULL), SA_OK);
  assert_int_equal(sa_set_superblock_size(a, 8 * MiB), SA_OK);
  assert_int_equal(sa_alloc(a, &p, 1536 * 1024, NULL), SA_OK); /* now a small block */
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.large_spans, 0);
  assert_int_equal(st.superblocks_total, 1);
  assert_int_equal(st.va_used_bytes, 8 * MiB + 2 * MiB); /* + the cached span */
  assert_int_equal(sa_free(p, NULL), SA_OK);
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
  assert_int_equal(st.reserved_bytes, 40 * MiB);
  assert_int_equal(st.large_spans, 10);
  for (int i = 0; i < 10; i++) assert_int_equal(sa_free(p[i], NULL), SA_OK);
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_int_equal(st.live_bytes, 0);
  assert_int_equal(st.live_bytes_peak, 40 * MiB);
  assert_int_equal(st.cached_bytes, 40 * MiB);
  assert_int_equal(sa_trim(a, 8 * MiB), SA_OK);
  assert_int_equal(sa_get_stats(a, &st), SA_OK);
  assert_true(st.reserved_bytes <= 8 * MiB);
  assert_int_equal(st.reserved_bytes_peak, 40 * MiB);
  destroy_clean(a);
  sa_host_counters c;
  sa_host_get_counters(&c);
  assert_int_equal(c.chunks, 0);
  assert_int_equal(c.mappings, 0);
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
  touch(big, 16 * MiB, 77);
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
  assert_int_equal(sa_config_parse(&cfg, "backend=host,max_physical=8MiB", NULL, 0), SA_OK);
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

static void destroy_reports_live_blocks(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  void *p, *q;
  assert_int_equal(sa_alloc(a, &p, 100, NULL), SA_OK);
  assert_int_equal(sa_alloc(a, &q, 5 * MiB, NULL), SA_OK);
  assert_int_equal(sa_arena_destroy(a), SA_ERR_LIVE_BLOCKS);
  /* Its memory is gone, and so is its address range: */
  assert_int_equal(sa_free(p, NULL), SA_ERR_INVALID_POINTER);
  sa_host_counters c;
  sa_host_get_counters(&c);
  assert_int_equal(c.chunks, 0);
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
  assert_int_equal(sa_free(p, (sa_stream)&local), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(sa_free(p, NULL), SA_OK);
  assert_int_equal(sa_free(p, NULL), SA_ERR_DOUBLE_FREE);
  assert_int_equal(sa_free(big, NULL), SA_OK);
  assert_int_equal(sa_free(big, NULL), SA_ERR_DOUBLE_FREE);
  assert_int_equal(sa_alloc(a, &p, 64, (sa_stream)&local), SA_ERR_UNKNOWN_STREAM);
  assert_null(p);
  assert_int_equal(sa_alloc(NULL, &p, 64, NULL), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_alloc(a, NULL, 64, NULL), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_free(NULL, NULL), SA_OK);
  destroy_clean(a);
}

static void default_arena_drop_in_calls(void **state) {
  (void)state;
  setenv("STREAMARENA_CONF", "backend=host", 1);
  void *p;
  assert_int_equal(sa_malloc_async(&p, 12345, NULL), SA_OK);
  touch(p, 12344, 9);
  assert_int_equal(sa_free_async(p, NULL), SA_OK);
  sa_arena *a;
  assert_int_equal(sa_default_arena(0, &a), SA_OK);
  assert_int_equal(sa_arena_backend(a), SA_BACKEND_HOST);
  sa_default_arenas_shutdown();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sizes_zero_to_one_gib),
      cmocka_unit_test(impossible_size_is_out_of_memory),
      cmocka_unit_test(random_allocations_default_stream),
      cmocka_unit_test(random_allocations_created_stream),
      cmocka_unit_test(mixed_random_single_thread),
      cmocka_unit_test(four_threads_own_streams),
      cmocka_unit_test(four_threads_default_stream),
      cmocka_unit_test(four_threads_one_created_stream),
      cmocka_unit_test(producer_consumer_across_threads_and_streams),
      cmocka_unit_test(alignment_of_every_size),
      cmocka_unit_test(same_stream_reuse_is_immediate),
      cmocka_unit_test(cross_stream_small_blocks_wait_for_event),
      cmocka_unit_test(cross_stream_large_spans_wait_for_event),
      cmocka_unit_test(free_on_other_stream_defers_reuse),
      cmocka_unit_test(record_stream_delays_reuse),
      cmocka_unit_test(thread_exit_returns_cached_blocks),
      cmocka_unit_test(stream_release_returns_memory),
      cmocka_unit_test(superblock_size_tuning),
      cmocka_unit_test(stats_track_live_and_reserved),
      cmocka_unit_test(small_frees_become_one_large_span),
      cmocka_unit_test(oom_callback_may_free_and_retry),
      cmocka_unit_test(destroy_reports_live_blocks),
      cmocka_unit_test(bad_pointers_and_double_free),
      cmocka_unit_test(default_arena_drop_in_calls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
