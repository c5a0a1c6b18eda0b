/* Soak: 16 threads x 8 streams, for minutes on a GPU. Every block is
 * written with its own pattern by a kernel on the stream it was allocated
 * on, and checked by a kernel on every stream that used it before it is
 * freed: its own, and each stream that read it behind an event and was
 * declared with sa_record_stream. Blocks are freed on their own stream or
 * another, by their thread or another (a shared exchange), and the streams
 * are destroyed and created again along the way, some without
 * sa_stream_release (a stream that still has recorded blocks is released
 * first, as the header asks; half the streams are only ever read behind
 * events joined back into the block's stream, never recorded). The summary line counts the operations, the
 * words checked and the words corrupted: a block handed out while another
 * stream still used it shows up as corrupted words.
 *
 * The backend: CUDA where a device is usable (PTX check kernel through the
 * driver API, cuMemsetD32Async writes), the host simulator otherwise (its
 * fill and check kernels, with the stream-order checker); with
 * STREAMARENA_BACKEND=cuda a missing device is a failure, not a fallback.
 * Length: STREAMARENA_SOAK_SECONDS (wall clock), else a short fixed number
 * of operations per thread. On a machine with a GPU, after
 * tools/gpu-check.sh:
 *   STREAMARENA_SOAK_SECONDS=300 bash .gpu/run.sh --only=gpu_soak_test --timeout=600
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
#include <string.h>
#include <strings.h>
#include <time.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "cuda_kernels.h"
#include "driver/driver.h"
#include "fixture.h"
#include "test/util.h"

#define THREADS 16
#define STREAMS 8
#define MAX_LOCAL 32
#define EXCHANGE 256
#define HOST_CHECK_WORDS 1024 /* the simulator checks on the CPU: the first words */

typedef struct block_s {
  void *p;
  size_t size;
  uint32_t pattern;
  int slot;       /* allocated (and written) on this slot's stream */
  unsigned users; /* other slots whose streams read it (recorded) */
} block;

/* A slot's stream is replaced under the write lock; every operation that
 * enqueues on it holds the read lock (slots taken in ascending order). */
typedef struct slot_s {
  pthread_rwlock_t lock;
  sa_stream s;
  atomic_int recorded; /* live blocks recorded on it */
} slot;

typedef struct counts_s {
  uint64_t ops, allocs, frees, cross_thread, cross_stream, uses, replaced, unreleased, words,
      failures;
} counts;

static struct {
  sa_backend backend;
  sa_arena *arena;
  sa_driver *drv; /* streams, events and writes of the test, on the arena's device */
  slot slots[STREAMS];
  _Atomic(void *) exchange[EXCHANGE]; /* blocks handed between threads */
  atomic_uint next_pattern;
  double seconds;      /* > 0: run this long */
  long ops_per_thread; /* otherwise this many */
  struct timespec start;
  /* CUDA: the check kernel and the corrupted-word counters in device memory. */
  CUcontext ctx;
  CUmodule module;
  CUfunction check_fn;
  uint64_t *dev_bad; /* THREADS counters, from the arena */
  uint64_t host_bad[THREADS]; /* the simulator's check kernels add here */
} g;

typedef struct worker_s {
  pthread_t thread;
  int id;
  uint64_t rng;
  sa_event ev;
  void *local[MAX_LOCAL]; /* blocks */
  int n;
  counts c;
} worker;

static unsigned pick(worker *w, unsigned n) { return sa_fixture_pick(&w->rng, n); }

static void ok(worker *w, sa_status st, const char *what) {
  if (st == SA_OK) return;
  const char *name;
  int code = sa_last_driver_error(&name);
  fprintf(stderr, "gpu_soak: thread %d: %s: %s (driver: %s, %d)\n", w->id, what,
          sa_status_string(st), name, code);
  w->c.failures++;
}

static void cu_ok(worker *w, CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return;
  fprintf(stderr, "gpu_soak: thread %d: %s: %s\n", w->id, what, sa_cu_error_name(r));
  w->c.failures++;
}

static bool cuda(void) { return g.backend == SA_BACKEND_CUDA; }

static double elapsed(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)(now.tv_sec - g.start.tv_sec) + (double)(now.tv_nsec - g.start.tv_nsec) * 1e-9;
}

static size_t words_of(const block *b) { return b->size / 4; }

/* Write b's pattern over all of it, on its own stream. */
static void write_block(worker *w, block *b, sa_stream s) {
  ok(w, g.drv->ops->memset32_async(g.drv, (uintptr_t)b->p, b->pattern, words_of(b), s), "write");
}

/* A kernel on s compares b with its pattern and counts the words that
 * differ. */
static void check_block(worker *w, block *b, sa_stream s) {
  size_t words = words_of(b);
  if (words == 0) return;
  if (cuda()) {
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)b->p, bad = (CUdeviceptr)(uintptr_t)&g.dev_bad[w->id];
    unsigned n = (unsigned)words, value = b->pattern;
    void *args[] = {&p, &n, &value, &bad};
    unsigned grid = (unsigned)((words + 255) / 256);
    if (grid > 1024) grid = 1024;
    cu_ok(w, sa_cu.LaunchKernel(g.check_fn, grid, 1, 1, 256, 1, 1, 0, (CUstream)s, args, NULL),
          "check kernel");
  } else {
    if (words > HOST_CHECK_WORDS) words = HOST_CHECK_WORDS;
    ok(w, sa_host_check(s, b->p, words * 4, b->pattern, &g.host_bad[w->id]), "check kernel");
  }
  w->c.words += words;
}

static void lock_slots(unsigned set) {
  for (int i = 0; i < STREAMS; i++)
    if (set & (1u << i)) pthread_rwlock_rdlock(&g.slots[i].lock);
}

static void unlock_slots(unsigned set) {
  for (int i = STREAMS - 1; i >= 0; i--)
    if (set & (1u << i)) pthread_rwlock_unlock(&g.slots[i].lock);
}

static size_t random_size(worker *w) {
  unsigned r = pick(w, 100);
  if (r < 75) return 256 + pick(w, 16 * KiB);
  if (r < 96) return 16 * KiB + pick(w, 1008 * KiB);
  return MiB + pick(w, 5 * MiB);
}

static void op_alloc(worker *w) {
  if (w->n == MAX_LOCAL) return;
  block *b = calloc(1, sizeof *b);
  if (b == NULL) return;
  b->size = random_size(w) & ~(size_t)3;
  b->slot = (int)pick(w, STREAMS);
  b->pattern = atomic_fetch_add(&g.next_pattern, 1);
  slot *sl = &g.slots[b->slot];
  pthread_rwlock_rdlock(&sl->lock);
  sa_status st = sa_alloc(g.arena, &b->p, b->size, sl->s);
  if (st == SA_OK) write_block(w, b, sl->s);
  pthread_rwlock_unlock(&sl->lock);
  if (st != SA_OK) {
    ok(w, st, "sa_alloc");
    free(b);
    return;
  }
  w->c.allocs++;
  w->local[w->n++] = b;
}

/* Slots whose streams are recorded on blocks (sa_record_stream); the
 * others join their reads back into the block's own stream with an event,
 * so that nothing waits for them at the free and they can be destroyed
 * without sa_stream_release at any time. */
#define RECORDED_SLOTS 4

/* Another stream reads b: it waits for an event recorded after b's write
 * and checks it; then it is recorded with sa_record_stream, or b's own
 * stream waits for it. */
static void op_use(worker *w) {
  if (w->n == 0) return;
  block *b = w->local[pick(w, (unsigned)w->n)];
  int j = (int)pick(w, STREAMS);
  if (j == b->slot) return;
  unsigned set = (1u << b->slot) | (1u << j);
  lock_slots(set);
  sa_stream own = g.slots[b->slot].s, other = g.slots[j].s;
  ok(w, g.drv->ops->event_record(g.drv, w->ev, own), "event_record");
  ok(w, g.drv->ops->stream_wait_event(g.drv, other, w->ev), "stream_wait_event");
  check_block(w, b, other);
  if (j < RECORDED_SLOTS) {
    ok(w, sa_record_stream(b->p, other), "sa_record_stream");
    if (!(b->users & (1u << j))) {
      b->users |= 1u << j;
      atomic_fetch_add(&g.slots[j].recorded, 1);
    }
  } else {
    ok(w, g.drv->ops->event_record(g.drv, w->ev, other), "event_record");
    ok(w, g.drv->ops->stream_wait_event(g.drv, own, w->ev), "stream_wait_event");
  }
  unlock_slots(set);
  w->c.uses++;
}

/* Checked on every stream that used it, then freed on one of them or on
 * another stream; every user is recorded (again, if its stream was
 * replaced since), so the reuse waits for all of them. */
static void free_block(worker *w, block *b) {
  int k = (int)pick(w, 3) == 0 ? (int)pick(w, STREAMS) : b->slot;
  unsigned readers = b->users | (1u << b->slot);
  unsigned set = readers | (1u << k);
  lock_slots(set);
  for (int u = 0; u < STREAMS; u++) {
    if (!(readers & (1u << u))) continue;
    check_block(w, b, g.slots[u].s);
    if (u != k) ok(w, sa_record_stream(b->p, g.slots[u].s), "sa_record_stream");
  }
  ok(w, sa_free(b->p, g.slots[k].s), "sa_free");
  unlock_slots(set);
  for (int u = 0; u < STREAMS; u++)
    if (b->users & (1u << u)) atomic_fetch_sub(&g.slots[u].recorded, 1);
  w->c.frees++;
  w->c.cross_stream += k != b->slot;
  free(b);
}

static void op_free(worker *w) {
  block *b = sa_fixture_take_local(w->local, &w->n, &w->rng);
  if (b != NULL) free_block(w, b);
}

static void op_give(worker *w) {
  if (w->n == 0) return;
  if (sa_fixture_give(g.exchange, EXCHANGE, &w->rng, w->local[w->n - 1])) w->n--;
}

static void op_take(worker *w) {
  if (w->n == MAX_LOCAL) return;
  block *b = sa_fixture_take(g.exchange, EXCHANGE, &w->rng);
  if (b == NULL) return;
  w->local[w->n++] = b;
  w->c.cross_thread++;
}

/* A stream's end: synchronized, destroyed (without sa_stream_release
 * unless blocks are recorded on it), and a new one in its slot. */
static void op_replace(worker *w) {
  slot *sl = &g.slots[pick(w, STREAMS)];
  pthread_rwlock_wrlock(&sl->lock);
  ok(w, g.drv->ops->stream_synchronize(g.drv, sl->s), "stream_synchronize");
  if (atomic_load(&sl->recorded) > 0 || pick(w, 2))
    ok(w, sa_stream_release(g.arena, sl->s), "sa_stream_release");
  else
    w->c.unreleased++;
  ok(w, g.drv->ops->stream_destroy(g.drv, sl->s), "stream_destroy");
  ok(w, g.drv->ops->stream_create(g.drv, &sl->s), "stream_create");
  pthread_rwlock_unlock(&sl->lock);
  w->c.replaced++;
}

/* The host enqueues checks far faster than the GPU runs them (a check
 * reads its whole block): unpaced, the queues grew until a 20 s soak took
 * 34 s to drain on the H200, and a 300 s one did not end within 400 s.
 * Every PACE_OPS operations a thread waits for one stream, in turn, so the
 * work in flight stays a few thousand operations deep, enough for handouts
 * that race pending work, and the run ends on time. */
#define PACE_OPS 256

static void pace(worker *w, long i) {
  slot *sl = &g.slots[(unsigned long)(i / PACE_OPS + w->id) % STREAMS];
  pthread_rwlock_rdlock(&sl->lock);
  ok(w, g.drv->ops->stream_synchronize(g.drv, sl->s), "stream_synchronize (pace)");
  pthread_rwlock_unlock(&sl->lock);
}

static bool more(worker *w, long i) {
  if (g.seconds > 0) return (i & 63) != 0 || elapsed() < g.seconds;
  return i < g.ops_per_thread && w->c.failures == 0;
}

static void *run_worker(void *arg) {
  worker *w = arg;
  if (cuda()) cu_ok(w, sa_cu.CtxSetCurrent(g.ctx), "cuCtxSetCurrent");
  ok(w, g.drv->ops->event_create(g.drv, &w->ev), "event_create");
  for (long i = 0; more(w, i); i++) {
    unsigned r = pick(w, 1000);
    if (r < 330) op_alloc(w);
    else if (r < 480) op_use(w);
    else if (r < 770) op_free(w);
    else if (r < 870) op_give(w);
    else if (r < 990) op_take(w);
    else op_replace(w);
    w->c.ops++;
    if (i % PACE_OPS == PACE_OPS - 1) pace(w, i);
  }
  while (w->n > 0) free_block(w, w->local[--w->n]);
  ok(w, g.drv->ops->event_destroy(g.drv, w->ev), "event_destroy"); /* waits keep their target */
  return NULL;
}

/* The arena's backend: CUDA when usable (required with
 * STREAMARENA_BACKEND=cuda), else the simulator with its checker; more
 * configuration keys from STREAMARENA_SOAK_CONF (keep_spans=1, say). */
static sa_status open_arena(void) {
  const char *want = getenv("STREAMARENA_BACKEND");
  bool need_cuda = want != NULL && strcasecmp(want, "cuda") == 0;
  sa_config cfg;
  sa_config_init(&cfg);
  cfg.backend = SA_BACKEND_CUDA;
  const char *conf = getenv("STREAMARENA_SOAK_CONF");
  if (conf != NULL) {
    char err[256];
    sa_status bad = sa_config_parse(&cfg, conf, err, sizeof err);
    if (bad != SA_OK) {
      printf("gpu_soak: STREAMARENA_SOAK_CONF: %s\n", err);
      return bad;
    }
    printf("gpu_soak: configuration %s\n", conf);
  }
  sa_status st = want != NULL && strcasecmp(want, "host") == 0 ? SA_ERR_NO_DEVICE
                                                              : sa_arena_create(&cfg, &g.arena);
  if (st == SA_ERR_NO_DEVICE && !need_cuda) {
    const char *why;
    (void)sa_last_driver_error(&why);
    printf("gpu_soak: no usable CUDA device (%s): on the host simulator\n", why);
    cfg.backend = SA_BACKEND_HOST;
    cfg.flags |= SA_FLAG_CHECK_STREAM_ORDER;
    st = sa_arena_create(&cfg, &g.arena);
  }
  if (st != SA_OK) return st;
  g.backend = sa_arena_backend(g.arena);
  return sa_driver_open(g.backend, 0, &g.drv);
}

static int setup_cuda(void) {
  if (sa_cu_load_all() != SA_OK) return -1;
  CUdevice dev;
  if (sa_cu.DeviceGet(&dev, 0) != CUDA_SUCCESS ||
      sa_cu.DevicePrimaryCtxRetain(&g.ctx, dev) != CUDA_SUCCESS ||
      sa_cu.CtxSetCurrent(g.ctx) != CUDA_SUCCESS)
    return -1;
  CUresult r = sa_cu.ModuleLoadData(&g.module, sa_cu_check_words_ptx);
  if (r == CUDA_SUCCESS) r = sa_cu.ModuleGetFunction(&g.check_fn, g.module, "check_words");
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "gpu_soak: check kernel: %s\n", sa_cu_error_name(r));
    return -1;
  }
  /* The counters: device memory from the arena itself, zeroed. */
  if (sa_alloc(g.arena, (void **)&g.dev_bad, THREADS * sizeof(uint64_t), NULL) != SA_OK ||
      g.drv->ops->memset32_async(g.drv, (uintptr_t)g.dev_bad, 0, THREADS * 2, NULL) != SA_OK ||
      g.drv->ops->device_synchronize(g.drv) != SA_OK) /* our streams do not wait for NULL */
    return -1;
  return 0;
}

static uint64_t words_corrupted(void) {
  uint64_t sum = 0;
  if (cuda()) {
    uint64_t bad[THREADS];
    if (g.drv->ops->copy_to_host(g.drv, bad, (uintptr_t)g.dev_bad, sizeof bad) != SA_OK)
      return UINT64_MAX;
    for (int i = 0; i < THREADS; i++) sum += bad[i];
  } else {
    for (int i = 0; i < THREADS; i++) sum += g.host_bad[i];
  }
  return sum;
}

static void soak(void **state) {
  (void)state;
  const char *sec = getenv("STREAMARENA_SOAK_SECONDS");
  g.seconds = sec != NULL ? strtod(sec, NULL) : 0;
  assert_int_equal(open_arena(), SA_OK);
  g.ops_per_thread = cuda() ? 3000 : 400;
  if (cuda()) assert_int_equal(setup_cuda(), 0);
  uint64_t violations0 = 0;
  if (!cuda()) {
    sa_host_counters c;
    sa_host_get_counters(&c);
    violations0 = c.order_violations;
  }
  for (int i = 0; i < STREAMS; i++) {
    pthread_rwlock_init(&g.slots[i].lock, NULL);
    assert_int_equal(g.drv->ops->stream_create(g.drv, &g.slots[i].s), SA_OK);
  }
  clock_gettime(CLOCK_MONOTONIC, &g.start);
  worker *w = calloc(THREADS, sizeof *w);
  assert_non_null(w);
  for (int t = 0; t < THREADS; t++) {
    w[t].id = t;
    w[t].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(t + 1);
    assert_int_equal(pthread_create(&w[t].thread, NULL, run_worker, &w[t]), 0);
  }
  counts total = {0};
  for (int t = 0; t < THREADS; t++) {
    assert_int_equal(pthread_join(w[t].thread, NULL), 0);
    for (size_t k = 0; k < sizeof total / sizeof(uint64_t); k++)
      ((uint64_t *)&total)[k] += ((uint64_t *)&w[t].c)[k];
  }
  double worked = elapsed(); /* the rest is draining and checking */
  /* Blocks left in the exchange: checked and freed here (as thread 0). */
  worker *me = &w[0];
  me->c = (counts){0};
  if (cuda()) assert_int_equal(sa_cu.CtxSetCurrent(g.ctx), CUDA_SUCCESS);
  for (int i = 0; i < EXCHANGE; i++) {
    block *b = atomic_exchange(&g.exchange[i], NULL);
    if (b != NULL) free_block(me, b);
  }
  for (size_t k = 0; k < sizeof total / sizeof(uint64_t); k++)
    ((uint64_t *)&total)[k] += ((uint64_t *)&me->c)[k];
  assert_int_equal(g.drv->ops->device_synchronize(g.drv), SA_OK);
  uint64_t corrupted = words_corrupted();
  uint64_t violations = 0;
  if (!cuda()) {
    sa_host_counters c;
    sa_host_get_counters(&c);
    violations = c.order_violations - violations0;
  }
  if (cuda()) assert_int_equal(sa_free(g.dev_bad, NULL), SA_OK);
  for (int i = 0; i < STREAMS; i++) {
    assert_int_equal(sa_stream_release(g.arena, g.slots[i].s), SA_OK);
    assert_int_equal(g.drv->ops->stream_destroy(g.drv, g.slots[i].s), SA_OK);
    pthread_rwlock_destroy(&g.slots[i].lock);
  }
  assert_int_equal(sa_trim(g.arena, 0), SA_OK);
  sa_stats st;
  assert_int_equal(sa_get_stats(g.arena, &st), SA_OK);
  printf("gpu_soak: backend %s, %.0f s (workers stopped at %.0f s), threads %d, streams %d, "
         "operations %llu (allocs %llu, "
         "frees %llu, cross-thread %llu, cross-stream frees %llu, record_stream uses %llu, "
         "streams destroyed %llu, %llu without sa_stream_release), words checked %llu, words "
         "corrupted %llu, checker violations %llu, live after %zu, reserved after trim %zu, "
         "background growths %llu, failures %llu\n",
         sa_backend_name(g.backend), elapsed(), worked, THREADS, STREAMS,
         (unsigned long long)total.ops, (unsigned long long)total.allocs,
         (unsigned long long)total.frees, (unsigned long long)total.cross_thread,
         (unsigned long long)total.cross_stream, (unsigned long long)total.uses,
         (unsigned long long)total.replaced, (unsigned long long)total.unreleased,
         (unsigned long long)total.words, (unsigned long long)corrupted,
         (unsigned long long)violations, st.live_bytes, st.reserved_bytes,
         (unsigned long long)st.background_growths, (unsigned long long)total.failures);
  free(w);
  if (g.module != NULL) (void)sa_cu.ModuleUnload(g.module);
  assert_int_equal(sa_arena_destroy(g.arena), SA_OK);
  sa_driver_close(g.drv);
  assert_int_equal(total.failures, 0);
  assert_int_equal(corrupted, 0);
  assert_int_equal(violations, 0);
  assert_int_equal(st.live_bytes, 0);
  assert_int_equal(st.reserved_bytes, 0);
  assert_true(total.words > 0 && total.unreleased > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(soak)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
