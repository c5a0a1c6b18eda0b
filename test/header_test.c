/* Claims of include/streamarena/streamarena.h that no module's test
 * checks: defaults and their units (va_reserve, large_threshold,
 * initial_physical's rounding), what sa_set_superblock_size does to the
 * threshold, sa_arena_backend_reason, the default arenas' device range and
 * STREAMARENA_CONF's ignored device key, the live-block count that
 * sa_arena_destroy writes, and how often an oom_callback is asked. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "fixture.h"
#include "test/util.h"

static int clear_env(void **state) {
  (void)state;
  unsetenv("STREAMARENA_BACKEND");
  unsetenv("STREAMARENA_CONF");
  sa_default_arenas_shutdown();
  return 0;
}

static sa_stats stats_of(sa_arena *a) {
  sa_stats st;
  sa_assert_ok(sa_get_stats(a, &st));
  return st;
}

/* Whether a request of size is served as a large allocation (a span). */
static bool is_large(sa_arena *a, size_t size) {
  uint64_t before = stats_of(a).large_allocs;
  void *p;
  sa_assert_ok(sa_alloc(a, &p, size, NULL));
  bool large = stats_of(a).large_allocs != before;
  sa_assert_ok(sa_free(p, NULL));
  return large;
}

/* The sa_config comments' defaults, every field. */
static void config_defaults_are_the_documented_ones(void **state) {
  (void)state;
  sa_config c;
  memset(&c, 0x5a, sizeof c);
  sa_config_init(&c);
  assert_int_equal(c.reserve_limit_bytes, 0);
  assert_int_equal(c.chunk_size, 0);
  assert_int_equal(c.initial_physical_bytes, 0);
  assert_true(c.peer_access == 0);
}

/* va_reserve 0 is 4 x device memory; a value is rounded up to granules. */
static void va_reserve_default_and_rounding(void **state) {
  (void)state;
  sa_arena *a;
  sa_assert_ok(sa_host_set_device_memory(4 * GiB));
  sa_status st = sa_fixture_arena_create(&a, "backend=host");
  sa_assert_ok(sa_host_set_device_memory(16 * GiB)); /* the simulator's default */
  sa_assert_ok(st);
  assert_int_equal(stats_of(a).va_reserved_bytes, 16 * GiB);
  assert_int_equal(stats_of(a).reserved_bytes, 0); /* nothing mapped yet */
  sa_assert_ok(sa_arena_destroy(a));
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host,va_reserve=3MiB"));
  assert_int_equal(stats_of(a).va_reserved_bytes, 4 * MiB);
  sa_assert_ok(sa_arena_destroy(a));
}

/* large_threshold 0 is half the superblock, at most 64 MiB; a larger
 * explicit value acts as 64 MiB. */
static void large_threshold_default_and_cap(void **state) {
  (void)state;
  sa_arena *a;
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host,superblock_size=4MiB"));
  assert_false(is_large(a, 2 * MiB));
  assert_true(is_large(a, 2 * MiB + 1));
  sa_assert_ok(sa_trim(a, 0));
  sa_assert_ok(sa_arena_destroy(a));
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host,superblock_size=256MiB"));
  assert_false(is_large(a, 64 * MiB));
  assert_true(is_large(a, 64 * MiB + 1));
  sa_assert_ok(sa_trim(a, 0));
  sa_assert_ok(sa_arena_destroy(a));
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host,superblock_size=1GiB,"
                                           "large_threshold=1GiB"));
  assert_true(is_large(a, 64 * MiB + 1));
  sa_assert_ok(sa_trim(a, 0));
  sa_assert_ok(sa_arena_destroy(a));
}

/* The threshold follows sa_set_superblock_size (half, at most 64 MiB)
 * unless it was set explicitly. */
static void set_superblock_size_moves_only_a_default_threshold(void **state) {
  (void)state;
  sa_arena *a;
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host"));
  assert_true(is_large(a, 1 * MiB + 1));
  sa_assert_ok(sa_set_superblock_size(a, 8 * MiB));
  assert_false(is_large(a, 4 * MiB));
  assert_true(is_large(a, 4 * MiB + 1));
  sa_assert_ok(sa_set_superblock_size(a, 256 * MiB));
  assert_false(is_large(a, 64 * MiB));
  assert_true(is_large(a, 64 * MiB + 1));
  sa_assert_ok(sa_set_superblock_size(a, 2 * MiB)); /* and back down */
  assert_true(is_large(a, 1 * MiB + 1));
  sa_assert_ok(sa_trim(a, 0));
  sa_assert_ok(sa_arena_destroy(a));
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host,large_threshold=512KiB"));
  sa_assert_ok(sa_set_superblock_size(a, 8 * MiB));
  assert_false(is_large(a, 512 * 1024));
  assert_true(is_large(a, 512 * 1024 + 1));
  sa_assert_ok(sa_trim(a, 0));
  sa_assert_ok(sa_arena_destroy(a));
}

/* initial_physical is mapped at creation, rounded up to the granularity,
 * as one free range: a request that fits makes no driver call, and a trim
 * gives it back. */
static void initial_physical_is_rounded_and_trimmed(void **state) {
  (void)state;
  sa_arena *a;
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host,initial_physical=3MiB"));
  sa_stats st = stats_of(a);
  assert_int_equal(st.reserved_bytes, 4 * MiB);
  assert_int_equal(st.cached_bytes, 4 * MiB);
  uint64_t creates = sa_host_call_count(SA_HOST_FN_CHUNK_CREATE);
  uint64_t maps = sa_host_call_count(SA_HOST_FN_MAP);
  void *p;
  sa_assert_ok(sa_alloc(a, &p, 3 * MiB + 512 * 1024, NULL));
  assert_int_equal(sa_host_call_count(SA_HOST_FN_CHUNK_CREATE), creates);
  assert_int_equal(sa_host_call_count(SA_HOST_FN_MAP), maps);
  sa_assert_ok(sa_free(p, NULL));
  sa_assert_ok(sa_trim(a, 0));
  assert_int_equal(stats_of(a).reserved_bytes, 0);
  sa_assert_ok(sa_arena_destroy(a));
}

/* initial_physical is at most max_physical "or the device's memory", and
 * sa_config_check gives the status sa_arena_create gives: with a cap above
 * the device, the check said SA_OK and the creation SA_ERR_OUT_OF_MEMORY. */
static void initial_physical_must_fit_on_the_device(void **state) {
  (void)state;
  sa_config c;
  char err[256];
  sa_config_init(&c);
  sa_assert_ok(sa_config_parse(&c, "backend=host,max_physical=32GiB,initial_physical=20GiB",
                               NULL, 0));
  sa_status check = sa_config_check(&c, err, sizeof err);
  sa_arena *a = NULL;
  sa_status create = sa_arena_create(&c, &a);
  if (a != NULL) (void)sa_arena_destroy(a);
  if (check != create)
    fail_msg("check %s (%s), create %s", sa_status_string(check), err, sa_status_string(create));
  sa_assert_status(check, SA_ERR_BAD_CONFIG);
  if (strstr(err, "initial_physical=20GiB") == NULL || strstr(err, "device's memory") == NULL)
    fail_msg("message '%s'", err);
  /* Up to the device's memory it is mapped. */
  sa_assert_ok(sa_config_parse(&c, "initial_physical=16GiB", NULL, 0));
  sa_assert_ok(sa_config_check(&c, NULL, 0));
  sa_assert_ok(sa_arena_create(&c, &a));
  assert_int_equal(stats_of(a).reserved_bytes, 16 * GiB);
  sa_assert_ok(sa_arena_destroy(a));
}

/* sa_trim releases unmapped chunks largest first, whole, until at most
 * keep_bytes stay: of a 16 MiB and a 4 MiB chunk, keeping 5 MiB keeps the
 * 4 MiB one. */
static void trim_releases_the_largest_chunks_first(void **state) {
  (void)state;
  sa_arena *a;
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host,exact_growth=1"));
  void *big, *small;
  sa_assert_ok(sa_alloc(a, &big, 16 * MiB, NULL));
  sa_assert_ok(sa_alloc(a, &small, 4 * MiB, NULL));
  sa_stats st = stats_of(a);
  assert_int_equal(st.chunks_total, 2);
  assert_int_equal(st.reserved_bytes, 20 * MiB);
  sa_assert_ok(sa_free(big, NULL));
  sa_assert_ok(sa_free(small, NULL));
  sa_assert_ok(sa_trim(a, 5 * MiB));
  st = stats_of(a);
  assert_int_equal(st.chunks_total, 1);
  assert_int_equal(st.reserved_bytes, 4 * MiB);
  assert_int_equal(st.cached_bytes, 4 * MiB);
  sa_assert_ok(sa_trim(a, 0));
  assert_int_equal(stats_of(a).reserved_bytes, 0);
  sa_assert_ok(sa_arena_destroy(a));
}

/* sa_stream_release of a stream the arena saw and the user destroyed
 * first (on CUDA: a handle the driver no longer knows) is
 * SA_ERR_UNKNOWN_STREAM, and nothing changes: the arena keeps serving. */
static void release_of_a_destroyed_stream_is_unknown(void **state) {
  (void)state;
  sa_arena *a;
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host"));
  sa_stream s;
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &s));
  void *p;
  sa_assert_ok(sa_alloc(a, &p, 4096, s));
  sa_assert_ok(sa_free(p, s));
  sa_assert_ok(sa_host_stream_destroy(s));
  sa_host_counters before, after;
  sa_host_get_counters(&before);
  sa_assert_status(sa_stream_release(a, s), SA_ERR_UNKNOWN_STREAM);
  sa_host_get_counters(&after);
  /* The simulator notes the call on a destroyed stream, as a GPU would
   * fault on one: the caller's error, which the header now names. */
  assert_int_equal(after.order_violations, before.order_violations + 1);
  assert_int_equal(stats_of(a).streams, 1);
  sa_assert_ok(sa_alloc(a, &p, 4096, NULL));
  sa_assert_ok(sa_free(p, NULL));
  sa_assert_ok(sa_trim(a, 0));
  sa_assert_ok(sa_arena_destroy(a));
}

/* chunk_size 0 is one chunk per growth, or a granule under max_physical
 * or reserve_limit; a value is the unit. */
static size_t chunks_for_8MiB(const char *spec) {
  sa_arena *a;
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host,exact_growth=1%s", spec));
  void *p;
  sa_assert_ok(sa_alloc(a, &p, 8 * MiB, NULL));
  sa_stats st = stats_of(a);
  assert_int_equal(st.reserved_bytes, 8 * MiB);
  sa_assert_ok(sa_free(p, NULL));
  sa_assert_ok(sa_arena_destroy(a));
  return st.chunks_total;
}

static void chunk_size_default_and_value(void **state) {
  (void)state;
  assert_int_equal(chunks_for_8MiB(""), 1);
  assert_int_equal(chunks_for_8MiB(",max_physical=1GiB"), 4);
  assert_int_equal(chunks_for_8MiB(",reserve_limit=1GiB"), 4);
  assert_int_equal(chunks_for_8MiB(",chunk_size=4MiB"), 2);
}

/* sa_record_stream asks the driver about the other stream: a failure
 * there (cuStreamGetCtx failing for another reason than a bad handle) is
 * SA_ERR_DRIVER, which its Errors did not list; nothing changes. */
static void record_stream_reports_a_driver_failure(void **state) {
  (void)state;
  sa_arena *a;
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host"));
  sa_stream s, t;
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &s));
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &t));
  void *p;
  sa_assert_ok(sa_alloc(a, &p, 4096, s));
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_STREAM_VALIDATE, 1, 0));
  sa_status st = sa_record_stream(p, t);
  sa_host_fault_clear();
  sa_assert_status(st, SA_ERR_DRIVER);
  sa_assert_ok(sa_free(p, s)); /* still live, and not recorded */
  sa_assert_status(sa_free(p, s), SA_ERR_DOUBLE_FREE);
  assert_int_equal(stats_of(a).deferred_frees, 0);
  sa_assert_ok(sa_stream_release(a, s));
  sa_assert_ok(sa_stream_release(a, t));
  sa_assert_ok(sa_host_stream_destroy(s));
  sa_assert_ok(sa_host_stream_destroy(t));
  sa_assert_ok(sa_arena_destroy(a));
}

/* sa_arena_backend_reason's texts, and "" for NULL. */
static void backend_reason_says_why(void **state) {
  (void)state;
  assert_string_equal(sa_arena_backend_reason(NULL), "");
  assert_int_equal(sa_arena_backend(NULL), SA_BACKEND_AUTO); /* the one unresolved answer */
  sa_arena *a;
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host"));
  assert_int_equal(sa_arena_backend(a), SA_BACKEND_HOST);
  assert_string_equal(sa_arena_backend_reason(a), "backend set in the configuration");
  sa_assert_ok(sa_arena_destroy(a));
  setenv("STREAMARENA_BACKEND", "host", 1);
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=auto"));
  assert_int_equal(sa_arena_backend(a), SA_BACKEND_HOST);
  assert_string_equal(sa_arena_backend_reason(a), "STREAMARENA_BACKEND=host");
  sa_assert_ok(sa_arena_destroy(a));
}

/* Devices 0 to 63; STREAMARENA_CONF's device key is ignored (the
 * simulator has one device: device=5 would be SA_ERR_NO_DEVICE). */
static void default_arenas_devices(void **state) {
  (void)state;
  sa_arena *a = NULL;
  sa_assert_status(sa_default_arena(-1, &a), SA_ERR_INVALID_ARGUMENT);
  sa_assert_status(sa_default_arena(64, &a), SA_ERR_INVALID_ARGUMENT);
  assert_null(a);
  setenv("STREAMARENA_CONF", "backend=host,device=5", 1);
  sa_assert_ok(sa_default_arena(0, &a));
  sa_arena *again = NULL;
  sa_assert_ok(sa_default_arena(0, &again));
  assert_ptr_equal(a, again);
  void *p = (void *)&p;
  sa_assert_ok(sa_malloc_async(&p, 0, NULL)); /* size 0: NULL, as sa_alloc */
  assert_null(p);
  sa_assert_ok(sa_malloc_async(&p, 4096, NULL));
  assert_non_null(p);
  sa_assert_ok(sa_free_async(p, NULL));
  sa_default_arenas_shutdown();
  /* A later call creates a fresh one. */
  sa_assert_ok(sa_malloc_async(&p, 4096, NULL));
  sa_assert_ok(sa_free_async(p, NULL));
}

/* The status is SA_ERR_LIVE_BLOCKS and stderr gets the count. */
static void destroy_writes_the_live_count(void **state) {
  (void)state;
  sa_arena *a;
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host"));
  void *p[3];
  sa_assert_ok(sa_alloc(a, &p[0], 100, NULL));
  sa_assert_ok(sa_alloc(a, &p[1], 5 * MiB, NULL));
  sa_assert_ok(sa_alloc(a, &p[2], 3000, NULL));
  sa_assert_ok(sa_free(p[2], NULL));
  sa_fixture_stderr_begin();
  sa_status st = sa_arena_destroy(a);
  char *err = sa_fixture_stderr_end();
  sa_assert_status(st, SA_ERR_LIVE_BLOCKS);
  assert_non_null(err);
  if (strstr(err, "with 2 blocks still allocated") == NULL) fail_msg("stderr: '%s'", err);
  free(err);
}

static int oom_asked;
static int always_again(sa_arena *a, size_t size, sa_stream s, void *ud) {
  (void)a, (void)size, (void)s, (void)ud;
  oom_asked++;
  return 1;
}

/* A callback that always asks again is asked a bounded number of times
 * (the header's number), then the allocation fails. */
static void oom_callback_is_asked_at_most_8_times(void **state) {
  (void)state;
  sa_config c;
  sa_config_init(&c);
  sa_assert_ok(sa_config_parse(&c, "backend=host,max_physical=8MiB", NULL, 0));
  c.oom_callback = always_again;
  sa_arena *a;
  sa_assert_ok(sa_arena_create(&c, &a));
  void *p, *q;
  sa_assert_ok(sa_alloc(a, &p, 6 * MiB, NULL));
  oom_asked = 0;
  sa_assert_status(sa_alloc(a, &q, 6 * MiB, NULL), SA_ERR_OUT_OF_MEMORY);
  assert_int_equal(oom_asked, 8);
  assert_int_equal(stats_of(a).oom_events, 1);
  /* A size no device holds fails at once: no reclaim can help. */
  oom_asked = 0;
  sa_assert_status(sa_alloc(a, &q, SIZE_MAX, NULL), SA_ERR_OUT_OF_MEMORY);
  assert_int_equal(oom_asked, 0);
  assert_int_equal(stats_of(a).oom_events, 2);
  sa_assert_ok(sa_free(p, NULL));
  sa_assert_ok(sa_arena_destroy(a));
}

/* "Every function is thread-safe": the tuning, statistics and diagnostics
 * calls run while other threads allocate and free, sizes on both sides of
 * every threshold the superblock sizes give, and each thread checks that
 * its blocks keep their bytes. Run under ThreadSanitizer too. */
enum { WORKERS = 3, ROUNDS = 20000, HELD = 8, ROUNDS_PER_TUNING = 500 };

typedef struct {
  sa_arena *arena;
  sa_stream stream;
  unsigned id;
  _Atomic int *running;
  _Atomic unsigned *rounds; /* every worker's, together */
  int failures;
} worker_arg;

static const size_t tuning_sizes[] = {256, 3000, 64 << 10, 700 << 10, 1536 << 10,
                                      3 << 20, 5 << 20, 20 << 20};

static void *tuned_worker(void *arg) {
  worker_arg *w = arg;
  void *held[HELD] = {0};
  size_t size[HELD] = {0};
  uint64_t rng = 0x9e3779b97f4a7c15ull * (w->id + 1);
  for (int r = 0; r < ROUNDS; r++) {
    atomic_fetch_add_explicit(w->rounds, 1, memory_order_relaxed);
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    unsigned k = (unsigned)(rng >> 33) % HELD;
    if (held[k] != NULL) {
      unsigned char *b = held[k];
      unsigned char tag = (unsigned char)(w->id * 16 + k);
      if (b[0] != tag || b[size[k] - 1] != tag) w->failures++;
      if (sa_free(held[k], w->stream) != SA_OK) w->failures++;
      held[k] = NULL;
      continue;
    }
    size[k] = tuning_sizes[(rng >> 45) % (sizeof tuning_sizes / sizeof tuning_sizes[0])];
    if (sa_alloc(w->arena, &held[k], size[k], w->stream) != SA_OK) {
      w->failures++;
      held[k] = NULL;
      continue;
    }
    unsigned char *b = held[k];
    b[0] = b[size[k] - 1] = (unsigned char)(w->id * 16 + k);
  }
  for (unsigned k = 0; k < HELD; k++)
    if (held[k] != NULL && sa_free(held[k], w->stream) != SA_OK) w->failures++;
  atomic_fetch_sub(w->running, 1);
  return NULL;
}

static void tuning_runs_while_threads_allocate(void **state) {
  (void)state;
  sa_arena *a;
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host"));
  FILE *sink = fopen("/dev/null", "w");
  assert_non_null(sink);
  _Atomic int running = WORKERS;
  _Atomic unsigned rounds = 0;
  pthread_t t[WORKERS];
  worker_arg w[WORKERS];
  for (unsigned i = 0; i < WORKERS; i++) {
    w[i] = (worker_arg){.arena = a, .id = i, .running = &running, .rounds = &rounds};
    sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &w[i].stream));
    assert_int_equal(pthread_create(&t[i], NULL, tuned_worker, &w[i]), 0);
  }
  static const size_t sb[] = {8 << 20, 64 << 20, 2 << 20, 32 << 20, 4 << 20};
  /* Paced by the workers' progress: a snapshot stops the world, and back
   * to back (on 16 cores) they starved the workers for minutes. */
  for (unsigned i = 0, seen = 0; atomic_load(&running) > 0; i++) {
    while (atomic_load(&running) > 0 && atomic_load(&rounds) - seen < ROUNDS_PER_TUNING)
      sched_yield();
    seen = atomic_load(&rounds);
    sa_assert_ok(sa_set_superblock_size(a, sb[i % 5]));
    sa_stats st = stats_of(a);
    assert_int_equal(st.superblocks_active + st.superblocks_empty, st.superblocks_total);
    assert_true(st.live_bytes <= st.live_bytes_peak);
    assert_true(st.cached_bytes <= st.reserved_bytes);
    if (i % 4 == 0) sa_assert_ok(sa_snapshot_write(a, sink));
    if (i % 4 == 1) sa_assert_ok(sa_defragment(a));
    if (i % 16 == 2) sa_assert_ok(sa_trim(a, 0));
  }
  for (unsigned i = 0; i < WORKERS; i++) {
    assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_int_equal(w[i].failures, 0);
    sa_assert_ok(sa_stream_release(a, w[i].stream));
    sa_assert_ok(sa_host_stream_destroy(w[i].stream));
  }
  fclose(sink);
  sa_stats st = stats_of(a);
  assert_int_equal(st.live_bytes, 0);
  assert_int_equal(st.alloc_count, st.free_count);
  sa_assert_ok(sa_arena_destroy(a));
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, clear_env, clear_env)
  const struct CMUnitTest tests[] = {
      T(config_defaults_are_the_documented_ones),
      T(va_reserve_default_and_rounding),
      T(large_threshold_default_and_cap),
      T(set_superblock_size_moves_only_a_default_threshold),
      T(initial_physical_is_rounded_and_trimmed),
      T(initial_physical_must_fit_on_the_device),
      T(trim_releases_the_largest_chunks_first),
      T(release_of_a_destroyed_stream_is_unknown),
      T(tuning_runs_while_threads_allocate),
      T(chunk_size_default_and_value),
      T(record_stream_reports_a_driver_failure),
      T(backend_reason_says_why),
      T(default_arenas_devices),
      T(destroy_writes_the_live_count),
      T(oom_callback_is_asked_at_most_8_times),
  };
  return cmocka_run_group_tests_name("header", tests, NULL, NULL);
}
