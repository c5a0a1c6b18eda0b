/* The Python array libraries' hooks (streamarena_python.h) called directly,
 * as CuPy's CFunctionAllocator and the Python package's ctypes calls make
 * them, on the host simulator's default arena with the stream-order checker
 * on. Python's error API is a stand-in that records what would be raised.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "test/fixture.h"
#include "plugins/python/streamarena_python.h"
#include "plugins/python/table.h"
#include "test/util.h"

#define PATTERN_A 0x11223344u
#define PATTERN_B 0x55667788u
#define RAISED ((void *)(intptr_t)-1) /* what a raising malloc returns to CuPy */

/* ------------------------------------------------------------------------
 * Stand-ins for CuPy's current stream and Python's error API
 * ---------------------------------------------------------------------- */

static _Thread_local sa_stream current; /* CuPy's current stream, per thread as in CuPy */
static _Thread_local int stream_fails;  /* CuPy's stream function raises */

static intptr_t fake_current_stream(int device) {
  (void)device;
  return stream_fails ? -1 : (intptr_t)current;
}

static char OOM_TYPE, ERROR_TYPE, EXCEPTION; /* stand-ins for Python objects */

typedef struct raised_s {
  int count;
  void *type;
  ptrdiff_t size, total; /* the arguments the OOM exception was made with */
  char message[512];
  int decrefs;
} raised;

static raised last;

static void *fake_call(void *callable, const char *format, ...) {
  assert_ptr_equal(callable, &OOM_TYPE);
  assert_string_equal(format, "nn");
  va_list ap;
  va_start(ap, format);
  last.size = va_arg(ap, ptrdiff_t);
  last.total = va_arg(ap, ptrdiff_t);
  va_end(ap);
  return &EXCEPTION;
}

static void fake_set_object(void *type, void *value) {
  assert_ptr_equal(value, &EXCEPTION);
  last.count++;
  last.type = type;
}

static void fake_set_string(void *type, const char *message) {
  last.count++;
  last.type = type;
  snprintf(last.message, sizeof last.message, "%s", message);
}

static void fake_decref(void *object) {
  assert_ptr_equal(object, &EXCEPTION);
  last.decrefs++;
}

static sa_py_env env = {
    .size = sizeof(sa_py_env),
    .current_stream = fake_current_stream,
    .call_function = fake_call,
    .set_object = fake_set_object,
    .set_string = fake_set_string,
    .decref = fake_decref,
    .oom_error = &OOM_TYPE,
    .error = &ERROR_TYPE,
};

static sa_hook_stats figures_of(int dev) {
  sa_hook_stats s;
  sa_assert_ok(sa_py_get_stats(dev, &s, sizeof s));
  return s;
}

static sa_hook_stats figures(void) { return figures_of(0); }

static uint64_t violations(void) {
  sa_host_counters c;
  sa_host_get_counters(&c);
  return c.order_violations;
}

static int reset(void **state) {
  (void)state;
  memset(&last, 0, sizeof last);
  current = NULL;
  stream_fails = 0;
  return 0;
}

/* ------------------------------------------------------------------------
 * Cases
 * ---------------------------------------------------------------------- */

/* CuPy frees without saying the stream: the hook frees on the stream the
 * block was allocated on, so another stream gets it only after the work
 * CuPy queued there (the checker and the pattern would catch a reuse
 * before it). */
static void a_free_is_ordered_after_the_allocation_streams_work(void **state) {
  (void)state;
  sa_stream a, b;
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &a));
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &b));
  current = a;
  void *p = sa_cupy_malloc(&env, 4096, 0);
  assert_non_null(p);
  sa_assert_ok(sa_host_fill(a, p, 4096, PATTERN_A)); /* queued, not run */
  current = b;                                       /* CuPy moved on to b */
  sa_cupy_free(&env, p, 0);
  sa_arena *arena;
  sa_assert_ok(sa_default_arena(0, &arena));
  void *q = sa_fixture_take_behind(arena, 4096, b, a, PATTERN_B);
  sa_assert_ok(sa_free(q, b));
  sa_assert_ok(sa_stream_release(arena, a));
  sa_assert_ok(sa_stream_release(arena, b));
  sa_assert_ok(sa_host_stream_destroy(a));
  sa_assert_ok(sa_host_stream_destroy(b));
  assert_int_equal(last.count, 0);
  assert_int_equal(violations(), 0);
}

/* On its own stream a freed block is CuPy's again at once, in stream order,
 * as CuPy's own pool reuses it. */
static void a_freed_block_is_reused_at_once_on_its_stream(void **state) {
  (void)state;
  sa_stream a;
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &a));
  current = a;
  sa_hook_stats before = figures();
  void *p = sa_cupy_malloc(&env, 3000, 0);
  assert_non_null(p);
  assert_int_equal((uintptr_t)p % SA_ALIGNMENT, 0);
  assert_int_equal(sa_cupy_live_blocks(), 1);
  assert_int_equal(figures().requested_bytes, before.requested_bytes + 3000);
  sa_cupy_free(&env, p, 0);
  assert_int_equal(sa_cupy_live_blocks(), 0);
  void *q = sa_cupy_malloc(&env, 3000, 0);
  assert_ptr_equal(q, p);
  sa_cupy_free(&env, q, 0);
  sa_hook_stats after = figures();
  assert_int_equal(after.requested_bytes, before.requested_bytes);
  assert_int_equal(after.alloc_count, before.alloc_count + 2);
  assert_int_equal(after.free_count, before.free_count + 2);
  assert_int_equal(after.requested_bytes_total, before.requested_bytes_total + 6000);
  assert_true(after.requested_bytes_peak >= before.requested_bytes + 3000);
  sa_arena *arena;
  sa_assert_ok(sa_default_arena(0, &arena));
  sa_assert_ok(sa_stream_release(arena, a));
  sa_assert_ok(sa_host_stream_destroy(a));
  assert_int_equal(last.count, 0);
}

/* Out of memory raises CuPy's OutOfMemoryError(size, total), as its own
 * pool does, so code that catches it, frees and retries works unchanged. */
static void out_of_memory_raises_cupys_out_of_memory_error(void **state) {
  (void)state;
  sa_hook_stats before = figures();
  size_t huge = (size_t)1 << 40;
  sa_fixture_stderr_begin();
  void *p = sa_cupy_malloc(&env, huge, 0);
  free(sa_fixture_stderr_end());
  assert_ptr_equal(p, RAISED);
  assert_int_equal(last.count, 1);
  assert_ptr_equal(last.type, &OOM_TYPE);
  assert_int_equal(last.size, (ptrdiff_t)huge);
  assert_int_equal(last.total, (ptrdiff_t)before.requested_bytes);
  assert_int_equal(last.decrefs, 1);
  sa_hook_stats after = figures();
  assert_int_equal(after.errors, before.errors + 1);
  assert_int_equal(after.alloc_count, before.alloc_count);
  assert_int_equal(sa_cupy_live_blocks(), 0);
}

/* Anything else raises StreamarenaError with the reason: here a stream the
 * driver does not know, as CuPy's per-thread default stream would be. */
static void another_failure_raises_streamarena_error_with_the_reason(void **state) {
  (void)state;
  current = (sa_stream)(uintptr_t)0x2; /* cudaStreamPerThread's handle */
  sa_fixture_stderr_begin();
  void *p = sa_cupy_malloc(&env, 4096, 0);
  char *err = sa_fixture_stderr_end();
  assert_ptr_equal(p, RAISED);
  assert_int_equal(last.count, 1);
  assert_ptr_equal(last.type, &ERROR_TYPE);
  assert_non_null(strstr(last.message, sa_status_string(SA_ERR_UNKNOWN_STREAM)));
  assert_non_null(strstr(last.message, "per-thread default stream"));
  assert_non_null(err);
  assert_non_null(strstr(err, "streamarena python: cupy malloc"));
  free(err);
  assert_int_equal(sa_cupy_live_blocks(), 0);
}

/* When CuPy's own stream function raises, its exception stands: nothing is
 * allocated and nothing else is raised. */
static void a_failing_stream_lookup_keeps_cupys_exception(void **state) {
  (void)state;
  stream_fails = 1;
  sa_hook_stats before = figures();
  assert_ptr_equal(sa_cupy_malloc(&env, 4096, 0), RAISED);
  assert_int_equal(last.count, 0);
  assert_int_equal(figures().alloc_count, before.alloc_count);
}

/* A Python package and a library of different builds disagree on the env:
 * refused loudly, not read; with no error API nothing can be raised, and
 * CuPy gets NULL. */
static void an_env_of_another_size_is_refused(void **state) {
  (void)state;
  sa_py_env other = env;
  other.size = sizeof other + 8;
  sa_fixture_stderr_begin();
  void *p = sa_cupy_malloc(&other, 4096, 0);
  char *err = sa_fixture_stderr_end();
  assert_null(p);
  assert_non_null(err);
  assert_non_null(strstr(err, "sa_py_env"));
  free(err);
  assert_null(sa_cupy_malloc(NULL, 4096, 0));
  other = env;
  other.call_function = NULL;
  sa_fixture_stderr_begin();
  p = sa_cupy_malloc(&other, (size_t)1 << 40, 0);
  free(sa_fixture_stderr_end());
  assert_null(p);
  assert_int_equal(last.count, 0);
}

/* A pointer the hooks never handed out: counted and written, nothing freed. */
static void freeing_a_foreign_pointer_is_reported(void **state) {
  (void)state;
  sa_hook_stats before = figures();
  int local;
  sa_fixture_stderr_begin();
  sa_cupy_free(&env, &local, 0);
  sa_cupy_free(&env, NULL, 0); /* nothing, as free(NULL) */
  char *err = sa_fixture_stderr_end();
  assert_non_null(err);
  assert_int_equal(sa_fixture_count(err, "cupy free"), 1);
  free(err);
  assert_int_equal(figures().errors, before.errors + 1);
  assert_int_equal(figures().free_count, before.free_count);
}

/* A stream being captured into a CUDA graph: an allocation is refused with
 * the rule, and a free keeps the block (the graph may use it) until a free
 * after the capture. */
static void a_capturing_stream_is_refused_and_keeps_its_blocks(void **state) {
  (void)state;
  sa_stream c;
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &c));
  current = c;
  void *p = sa_cupy_malloc(&env, 4096, 0);
  assert_non_null(p);
  sa_assert_ok(sa_host_stream_begin_capture(c, SA_HOST_CAPTURE_GLOBAL));
  sa_fixture_stderr_begin();
  void *q = sa_cupy_malloc(&env, 4096, 0);
  sa_cupy_free(&env, p, 0);
  free(sa_fixture_stderr_end());
  assert_ptr_equal(q, RAISED);
  assert_ptr_equal(last.type, &ERROR_TYPE);
  assert_non_null(strstr(last.message, "before its capture"));
  assert_int_equal(sa_cupy_live_blocks(), 1);
  sa_assert_ok(sa_host_stream_end_capture(c));
  sa_cupy_free(&env, p, 0);
  assert_int_equal(sa_cupy_live_blocks(), 0);
  sa_arena *arena;
  sa_assert_ok(sa_default_arena(0, &arena));
  sa_assert_ok(sa_stream_release(arena, c));
  sa_assert_ok(sa_host_stream_destroy(c));
}

/* Numba's and RMM's path: an explicit stream and size, counted with
 * CuPy's; a device out of range is refused. */
static void py_alloc_and_free_count_and_check_the_device(void **state) {
  (void)state;
  sa_hook_stats before = figures();
  void *p;
  sa_assert_ok(sa_py_alloc(0, 5 * MiB, NULL, &p));
  assert_non_null(p);
  assert_int_equal(figures().requested_bytes, before.requested_bytes + 5 * MiB);
  sa_assert_ok(sa_py_free(0, p, 5 * MiB, NULL));
  assert_int_equal(figures().requested_bytes, before.requested_bytes);
  sa_assert_ok(sa_py_alloc(0, 0, NULL, &p)); /* size 0: NULL, nothing counted */
  assert_null(p);
  assert_int_equal(figures().alloc_count, before.alloc_count + 1);
  sa_assert_status(sa_py_alloc(64, 4096, NULL, &p), SA_ERR_INVALID_ARGUMENT);
  sa_assert_status(sa_py_alloc(-1, 4096, NULL, &p), SA_ERR_INVALID_ARGUMENT);
  sa_assert_status(sa_py_alloc(0, 4096, NULL, NULL), SA_ERR_INVALID_ARGUMENT);
  sa_assert_status(sa_py_free(5, &p, 4096, NULL), SA_ERR_INVALID_POINTER);
  sa_hook_stats s;
  sa_assert_status(sa_py_get_stats(0, &s, sizeof s - 1), SA_ERR_INVALID_ARGUMENT);
  sa_assert_status(sa_py_get_stats(64, &s, sizeof s), SA_ERR_INVALID_ARGUMENT);
  sa_assert_ok(sa_py_reset_peak(0));
  assert_int_equal(figures().requested_bytes_peak, figures().requested_bytes);
}

/* CuPy's free_all_blocks: cached memory goes back to the driver. */
static void trim_gives_cached_memory_back(void **state) {
  (void)state;
  void *p;
  sa_assert_ok(sa_py_alloc(0, 16 * MiB, NULL, &p));
  sa_assert_ok(sa_py_free(0, p, 16 * MiB, NULL));
  sa_hook_stats before = figures();
  assert_true(before.cached_bytes >= 16 * MiB);
  sa_py_trim();
  sa_hook_stats after = figures();
  assert_true(after.reserved_bytes + 16 * MiB <= before.reserved_bytes);
  assert_int_equal(after.errors, before.errors);
}

/* The table against a plain list: keys crowded onto few home slots, so
 * runs wrap around and removals shift entries back; the table grows. */
static void the_table_keeps_every_entry_through_collisions_and_growth(void **state) {
  (void)state;
  enum { KEYS = 4000, STEPS = 60000 };
  static sa_stream stream_of[KEYS];
  static size_t size_of[KEYS];
  static char present[KEYS];
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  size_t count = sa__py_table_count();
  for (int i = 0; i < STEPS; i++) {
    unsigned k = sa_fixture_pick(&rng, KEYS);
    void *p = (void *)(uintptr_t)(((uintptr_t)k + 1) << 8);
    if (!present[k]) {
      stream_of[k] = (sa_stream)(uintptr_t)(sa_fixture_pick(&rng, 7) << 4);
      size_of[k] = sa_fixture_pick(&rng, 1u << 20);
      sa_assert_ok(sa__py_table_put(p, stream_of[k], size_of[k]));
      present[k] = 1;
      count++;
    } else {
      sa_stream s;
      size_t n;
      assert_true(sa__py_table_take(p, &s, &n));
      assert_ptr_equal(s, stream_of[k]);
      assert_int_equal(n, size_of[k]);
      present[k] = 0;
      count--;
      assert_false(sa__py_table_take(p, &s, &n));
    }
    if (i % 997 == 0) assert_int_equal(sa__py_table_count(), count);
  }
  for (unsigned k = 0; k < KEYS; k++) {
    sa_stream s;
    size_t n;
    void *p = (void *)(uintptr_t)(((uintptr_t)k + 1) << 8);
    assert_int_equal(sa__py_table_take(p, &s, &n), present[k] != 0);
  }
  assert_int_equal(sa__py_table_count(), 0);
}

typedef struct worker_s {
  sa_stream stream;
  uint64_t failures;
} worker;

/* CuPy on several threads, each on its own stream, with frees made on
 * another thread than the allocation (Python's garbage collector does). */
static void *churn(void *arg) {
  worker *w = arg;
  current = w->stream;
  void *held[32] = {0};
  uint64_t rng = (uintptr_t)w | 1;
  for (int i = 0; i < 4000; i++) {
    unsigned k = sa_fixture_pick(&rng, 32);
    if (held[k] != NULL) {
      sa_cupy_free(&env, held[k], 0);
      held[k] = NULL;
    } else {
      void *p = sa_cupy_malloc(&env, 256 + sa_fixture_pick(&rng, 64 * 1024), 0);
      if (p == NULL || p == RAISED)
        w->failures++;
      else
        held[k] = p;
    }
  }
  for (int k = 0; k < 32; k++) sa_cupy_free(&env, held[k], 0);
  return NULL;
}

static void threads_on_their_own_streams_leave_nothing_behind(void **state) {
  (void)state;
  enum { THREADS = 4 };
  worker w[THREADS];
  pthread_t t[THREADS];
  sa_hook_stats before = figures();
  for (int i = 0; i < THREADS; i++) {
    w[i].failures = 0;
    sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &w[i].stream));
    assert_int_equal(pthread_create(&t[i], NULL, churn, &w[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  sa_arena *arena;
  sa_assert_ok(sa_default_arena(0, &arena));
  for (int i = 0; i < THREADS; i++) {
    assert_int_equal(w[i].failures, 0);
    sa_assert_ok(sa_stream_release(arena, w[i].stream));
    sa_assert_ok(sa_host_stream_destroy(w[i].stream));
  }
  sa_hook_stats after = figures();
  assert_int_equal(sa_cupy_live_blocks(), 0);
  assert_int_equal(after.requested_bytes, before.requested_bytes);
  assert_int_equal(after.errors, before.errors);
  assert_int_equal(violations(), 0);
}

typedef struct counted_s {
  int pairs;
  size_t size;
} counted;

static void *counted_pairs(void *arg) {
  counted *c = arg;
  for (int i = 0; i < c->pairs; i++) {
    void *p;
    sa_assert_ok(sa_py_alloc(0, c->size, NULL, &p));
    sa_assert_ok(sa_py_free(0, p, c->size, NULL));
  }
  return NULL;
}

/* counted_pairs, then a pause until go: its counts stay unpublished. */
typedef struct paused_s {
  counted c;
  pthread_barrier_t made, go;
} paused;

static void *paused_pairs(void *arg) {
  paused *p = arg;
  counted_pairs(&p->c);
  pthread_barrier_wait(&p->made);
  pthread_barrier_wait(&p->go);
  return NULL;
}

/* Each thread counts its own calls (no shared read-modify-write per call);
 * the figures add up every thread's, those of threads that exited
 * included. The peak is exact for one thread: an allocation its own
 * unpublished frees do not cover is published; frees are published late,
 * which may overstate it with several threads, never understate it. */
static void figures_add_up_every_threads_and_the_peak_is_exact_for_one(void **state) {
  (void)state;
  sa_assert_ok(sa_py_reset_peak(0));
  sa_hook_stats before = figures();
  assert_int_equal(before.requested_bytes_peak, before.requested_bytes);
  counted one = {.pairs = 50, .size = 1000};
  counted_pairs(&one); /* pairs of one size: none published but the first */
  assert_int_equal(figures().requested_bytes_peak, before.requested_bytes + 1000);
  void *big, *small;
  sa_assert_ok(sa_py_alloc(0, 3000, NULL, &big)); /* covered in part by the frees */
  assert_int_equal(figures().requested_bytes_peak, before.requested_bytes + 3000);
  sa_assert_ok(sa_py_alloc(0, 500, NULL, &small));
  assert_int_equal(figures().requested_bytes_peak, before.requested_bytes + 3500);
  sa_assert_ok(sa_py_free(0, big, 3000, NULL));
  sa_assert_ok(sa_py_free(0, small, 500, NULL));
  /* Pairs of one large size publish nothing after the first either: while
   * the thread that made them pauses, its last free is not taken off the
   * published figure yet (its size beside the unpublished allowance), so an
   * allocation here that publishes raises the peak by that much more than
   * is held: the overstatement sa_hook_allocated allows. */
  sa_assert_ok(sa_py_reset_peak(0));
  paused large = {.c = {.pairs = 20, .size = 3 * MiB}};
  assert_int_equal(pthread_barrier_init(&large.made, NULL, 2), 0);
  assert_int_equal(pthread_barrier_init(&large.go, NULL, 2), 0);
  pthread_t lt;
  assert_int_equal(pthread_create(&lt, NULL, paused_pairs, &large), 0);
  pthread_barrier_wait(&large.made);
  assert_int_equal(figures().requested_bytes, before.requested_bytes); /* exact */
  assert_int_equal(figures().requested_bytes_peak, before.requested_bytes + 3 * MiB);
  void *mine;
  sa_assert_ok(sa_py_alloc(0, 4 * MiB, NULL, &mine)); /* past this thread's frees: published */
  assert_int_equal(figures().requested_bytes_peak, before.requested_bytes + 7 * MiB);
  sa_assert_ok(sa_py_free(0, mine, 4 * MiB, NULL));
  pthread_barrier_wait(&large.go);
  assert_int_equal(pthread_join(lt, NULL), 0); /* its exit publishes */
  assert_int_equal(figures().requested_bytes, before.requested_bytes);
  assert_int_equal(pthread_barrier_destroy(&large.made), 0);
  assert_int_equal(pthread_barrier_destroy(&large.go), 0);
  sa_hook_stats mid = figures();
  assert_int_equal(mid.requested_bytes, before.requested_bytes);
  assert_int_equal(mid.requested_bytes_peak, before.requested_bytes + 7 * MiB);
  enum { THREADS = 4 };
  pthread_t t[THREADS];
  counted each[THREADS];
  for (int i = 0; i < THREADS; i++) {
    each[i] = (counted){.pairs = 1000, .size = 256 << i};
    assert_int_equal(pthread_create(&t[i], NULL, counted_pairs, &each[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  sa_hook_stats after = figures(); /* the threads exited: their counts are the hook's */
  uint64_t bytes = 0;
  for (int i = 0; i < THREADS; i++) bytes += (uint64_t)each[i].pairs * each[i].size;
  assert_int_equal(after.alloc_count, mid.alloc_count + THREADS * 1000);
  assert_int_equal(after.free_count, mid.free_count + THREADS * 1000);
  assert_int_equal(after.requested_bytes_total, mid.requested_bytes_total + bytes);
  assert_int_equal(after.freed_bytes_total, mid.freed_bytes_total + bytes);
  assert_int_equal(after.requested_bytes, before.requested_bytes);
  assert_true(after.requested_bytes_peak >= before.requested_bytes + (256 << (THREADS - 1)));
  assert_true(after.requested_bytes_peak <= before.requested_bytes + 7 * MiB + 256 * 15);
  sa_assert_ok(sa_py_reset_peak(0)); /* what is held now, all threads' frees published */
  assert_int_equal(figures().requested_bytes_peak, before.requested_bytes);
}

/* CuPy's stream 0 of device 1 is device 1's legacy stream, and CuPy frees
 * an array wherever it dies, with whatever device is current. The library
 * alone refuses NULL from a thread with another device current (it names
 * that device's legacy stream there); the hooks make their device current
 * for the call. So a block of device 1 freed on stream 0 with device 0
 * current is freed, and its memory goes to another stream of device 1 only
 * behind the work CuPy queued on device 1's legacy stream; device 0 is
 * current again afterwards. */
static void stream_0_is_the_legacy_stream_of_the_hooks_device(void **state) {
  (void)state;
  sa_assert_ok(sa_host_set_device_count(2));
  sa_assert_ok(sa_host_set_default_stream_mode(SA_HOST_MANUAL));
  size_t n = 6 * MiB; /* one fits under device 1's cap, two do not */
  sa_assert_ok(sa_host_set_device(1));
  sa_stream s1;
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &s1));
  current = NULL; /* CuPy's null stream */
  /* Device 1's arena reads the configuration at its first allocation. */
  char *conf = strdup(getenv("STREAMARENA_CONF"));
  assert_non_null(conf);
  setenv("STREAMARENA_CONF", "backend=host,check_stream_order=1,max_physical=8MiB", 1);
  void *p = sa_cupy_malloc(&env, n, 1);
  setenv("STREAMARENA_CONF", conf, 1);
  free(conf);
  assert_non_null(p);
  assert_ptr_not_equal(p, RAISED);
  sa_assert_ok(sa_host_fill(NULL, p, n, PATTERN_A)); /* CuPy's kernel on device 1's stream 0 */
  sa_assert_ok(sa_host_set_device(0));
  sa_hook_stats before = figures_of(1);
  void *small = sa_cupy_malloc(&env, 4096, 1); /* device 0 current: the hook makes 1 current */
  assert_non_null(small);
  assert_ptr_not_equal(small, RAISED);
  assert_int_equal(last.count, 0);
  sa_cupy_free(&env, small, 1);
  sa_cupy_free(&env, p, 1); /* the array dies with device 0 current */
  void *numba;
  sa_assert_ok(sa_py_alloc(1, 4096, NULL, &numba)); /* Numba's and RMM's path too */
  sa_assert_ok(sa_py_free(1, numba, 4096, NULL));
  assert_int_equal(figures_of(1).errors, before.errors);
  assert_int_equal(sa_host_get_device(), 0); /* the caller's device is current again */
  void *q;
  sa_assert_ok(sa_py_alloc(1, n, s1, &q));
  assert_ptr_equal(q, p); /* the cap leaves no other memory */
  uint64_t seen = 0;
  sa_assert_ok(sa_host_fill(s1, q, n, PATTERN_B));
  sa_assert_ok(sa_host_check(s1, q, n, PATTERN_B, &seen));
  sa_assert_ok(sa_host_stream_step(s1, SIZE_MAX, NULL)); /* as far as it goes */
  assert_true(sa_host_stream_pending(s1) > 0); /* it waits for device 1's stream 0 */
  sa_assert_ok(sa_host_drain_all());
  assert_int_equal(seen, 0); /* nothing of the new owner overwritten */
  sa_assert_ok(sa_py_free(1, q, n, s1));
  sa_assert_ok(sa_host_set_default_stream_mode(SA_HOST_AUTO));
  sa_hook_stats after = figures_of(1);
  assert_int_equal(after.alloc_count, before.alloc_count + 3);
  assert_int_equal(after.free_count, before.free_count + 4);
  assert_int_equal(after.errors, before.errors);
  assert_int_equal(sa_cupy_live_blocks(), 0);
  sa_arena *arena;
  sa_assert_ok(sa_default_arena(1, &arena));
  sa_assert_ok(sa_stream_release(arena, s1));
  sa_assert_ok(sa_host_stream_destroy(s1));
  assert_int_equal(violations(), 0);
}

/* The library exports the whole API, so an atexit handler may call
 * sa_default_arenas_shutdown while CuPy still frees arrays at interpreter
 * teardown. The hooks keep no arena: a free of the destroyed arena's block
 * is refused and counted (its memory went with the arena), the statistics
 * and the trim read no arena and create none, and the next allocation gets
 * a fresh default arena. */
static void hooks_after_default_arenas_shutdown_touch_no_freed_arena(void **state) {
  (void)state;
  sa_stream s;
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &s));
  current = s;
  void *small = sa_cupy_malloc(&env, 4096, 0), *big = sa_cupy_malloc(&env, 4 * MiB, 0);
  assert_true(small != NULL && small != RAISED && big != NULL && big != RAISED);
  void *numba;
  sa_assert_ok(sa_py_alloc(0, 65536, s, &numba));
  sa_hook_stats before = figures();
  sa_fixture_stderr_begin();
  sa_default_arenas_shutdown();
  char *err = sa_fixture_stderr_end();
  assert_non_null(err);
  assert_non_null(strstr(err, "3 blocks still allocated"));
  free(err);
  sa_host_counters c;
  sa_host_get_counters(&c);
  assert_int_equal(c.chunks, 0); /* the shutdown released the arenas' memory */
  assert_int_equal(c.va_ranges, 0);
  /* Not between stderr_begin and _end: a sanitizer's report of these calls
   * must reach the test's output. */
  sa_cupy_free(&env, small, 0);
  sa_cupy_free(&env, big, 0);
  sa_assert_status(sa_py_free(0, numba, 65536, s), SA_ERR_INVALID_POINTER);
  assert_int_equal(sa_cupy_live_blocks(), 0);
  sa_hook_stats st = figures();
  assert_int_equal(st.errors, before.errors + 2); /* the CuPy frees, reported */
  assert_int_equal(st.free_count, before.free_count);
  assert_int_equal(st.reserved_bytes, 0); /* no arena to read */
  assert_int_equal(st.live_bytes, 0);
  sa_py_trim(); /* no arena: nothing to trim */
  sa_host_get_counters(&c);
  assert_int_equal(c.va_ranges, 0); /* neither created one */
  size_t sizes[2] = {4096, 4 * MiB};
  void *ptrs[2];
  for (int i = 0; i < 2; i++) {
    ptrs[i] = sa_cupy_malloc(&env, sizes[i], 0);
    assert_true(ptrs[i] != NULL && ptrs[i] != RAISED);
    for (size_t w = 0; w < sizes[i] / 4; w++) ((uint32_t *)ptrs[i])[w] = PATTERN_A;
  }
  for (int i = 0; i < 2; i++)
    for (size_t w = 0; w < sizes[i] / 4; w++)
      assert_int_equal(((uint32_t *)ptrs[i])[w], PATTERN_A); /* contents kept */
  st = figures();
  assert_true(st.reserved_bytes >= sizes[0] + sizes[1]); /* the fresh arena holds them */
  assert_true(st.live_bytes >= sizes[0] + sizes[1]);
  for (int i = 0; i < 2; i++) sa_cupy_free(&env, ptrs[i], 0);
  assert_int_equal(figures().errors, before.errors + 2);
  sa_py_trim();
  assert_int_equal(figures().reserved_bytes, 0); /* the trim reaches the fresh arena */
  sa_arena *arena;
  sa_assert_ok(sa_default_arena(0, &arena));
  sa_assert_ok(sa_stream_release(arena, s));
  sa_assert_ok(sa_host_stream_destroy(s));
  assert_int_equal(violations(), 0);
}

int main(void) {
  /* The hooks use the default arenas, which read this at their first use. */
  setenv("STREAMARENA_CONF", "backend=host,check_stream_order=1,max_physical=1GiB", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(a_free_is_ordered_after_the_allocation_streams_work, reset),
      cmocka_unit_test_setup(a_freed_block_is_reused_at_once_on_its_stream, reset),
      cmocka_unit_test_setup(out_of_memory_raises_cupys_out_of_memory_error, reset),
      cmocka_unit_test_setup(another_failure_raises_streamarena_error_with_the_reason, reset),
      cmocka_unit_test_setup(a_failing_stream_lookup_keeps_cupys_exception, reset),
      cmocka_unit_test_setup(an_env_of_another_size_is_refused, reset),
      cmocka_unit_test_setup(freeing_a_foreign_pointer_is_reported, reset),
      cmocka_unit_test_setup(a_capturing_stream_is_refused_and_keeps_its_blocks, reset),
      cmocka_unit_test_setup(py_alloc_and_free_count_and_check_the_device, reset),
      cmocka_unit_test_setup(trim_gives_cached_memory_back, reset),
      cmocka_unit_test_setup(the_table_keeps_every_entry_through_collisions_and_growth, reset),
      cmocka_unit_test_setup(threads_on_their_own_streams_leave_nothing_behind, reset),
      cmocka_unit_test_setup(figures_add_up_every_threads_and_the_peak_is_exact_for_one, reset),
      cmocka_unit_test_setup(stream_0_is_the_legacy_stream_of_the_hooks_device, reset),
      cmocka_unit_test_setup(hooks_after_default_arenas_shutdown_touch_no_freed_arena, reset),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  sa_default_arenas_shutdown();
  return failed;
}
