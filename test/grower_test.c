/* Background growth (SA_FLAG_BACKGROUND_GROWTH, large/grower.c) on the host
 * simulator: a climb finds memory mapped ahead by the arena's thread and
 * makes fewer driver calls itself; every driver refusal in the thread
 * loses nothing; and an allocation that would grow, a trim and arena
 * destroy each meet a job in flight, which a test hook holds between its
 * claim and its driver calls so that the interleaving happens every run.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "fixture.h"
#include "internal.h"
#include "test/util.h"

#define STEP (3 * MiB) /* a climb's request: above the large threshold */
#define STEPS 24

static sa_stats stats(sa_arena *a) {
  sa_stats st;
  sa_assert_ok(sa_get_stats(a, &st));
  return st;
}

static uint64_t violations(void) {
  sa_host_counters c;
  sa_host_get_counters(&c);
  return c.order_violations;
}

/* Until the grower has no job waiting and none in flight. */
static void wait_idle(sa_arena *a) {
  for (;;) {
    pthread_mutex_lock(&a->lock);
    bool idle = !a->grower.busy && a->grower.asked_size == 0;
    pthread_mutex_unlock(&a->lock);
    if (idle) return;
    usleep(50);
  }
}

/* Chunks the calling thread created so far. */
static uint64_t own_creates(void) {
  sa_host_totals t;
  sa_host_get_thread_totals(&t);
  return t.calls[SA_HOST_FN_CHUNK_CREATE];
}

/* A climb of STEPS requests on stream s, each filled with its own pattern,
 * the grower let finish after each (a step of work between requests);
 * returns the chunks this thread created for it. */
static uint64_t climb(sa_arena *a, sa_stream s, void **p) {
  uint64_t c0 = own_creates();
  for (int i = 0; i < STEPS; i++) {
    sa_assert_ok(sa_alloc(a, &p[i], STEP, s));
    sa_assert_ok(sa_host_fill(s, p[i], STEP, 0x6e0000u + (uint32_t)i));
    wait_idle(a);
  }
  return own_creates() - c0;
}

/* Every block still holds its pattern; then all are freed. */
static void check_and_free(sa_arena *a, sa_stream s, void **p) {
  for (int i = 0; i < STEPS; i++) {
    uint64_t bad = 0;
    sa_assert_ok(sa_host_check(s, p[i], STEP, 0x6e0000u + (uint32_t)i, &bad));
    sa_assert_ok(sa_host_drain_all());
    assert_int_equal(bad, 0);
  }
  for (int i = 0; i < STEPS; i++) sa_assert_ok(sa_free(p[i], s));
  (void)a;
}

/* The same climb with and without the grower: with it, the allocating
 * thread creates fewer chunks (the grower made the rest), the memory is
 * right, and the footprint stays within the target. */
static void a_climb_finds_memory_mapped_ahead(void **state) {
  (void)state;
  uint64_t created[2];
  for (int bg = 0; bg < 2; bg++) {
    sa_fixture f;
    sa_assert_ok(
        sa_fixture_setup(&f, bg ? "background_growth=1" : "background_growth=0", 1, SA_HOST_MANUAL));
    uint64_t v0 = violations();
    void *p[STEPS];
    created[bg] = climb(f.arena, f.streams[0], p);
    sa_stats st = stats(f.arena);
    if (bg) {
      assert_true(st.background_growths > 0);
      assert_true(st.background_bytes >= st.background_growths * 2 * MiB);
    } else {
      assert_int_equal(st.background_growths, 0);
    }
    pthread_mutex_lock(&f.arena->lock);
    size_t target = sa__physical_soft_limit(f.arena);
    pthread_mutex_unlock(&f.arena->lock);
    assert_true(st.reserved_bytes_peak <= target);
    sa__world_check(f.arena);
    check_and_free(f.arena, f.streams[0], p);
    assert_int_equal(violations(), v0);
    sa_assert_ok(sa_fixture_teardown(&f));
  }
  print_message("chunks the climbing thread created: %llu without the grower, %llu with\n",
                (unsigned long long)created[0], (unsigned long long)created[1]);
  assert_true(created[1] < created[0]);
}

/* ---------------------------------------------------------------------- */

/* Which driver calls the hook makes fail in the grower's thread, after its
 * claim: nothing of the allocating thread's is counted in between. */
static sa_host_fn fail_fn, fail_also;
static atomic_int claims;

static void fail_in_grower(sa_hook_point point, void *arg) {
  (void)arg;
  if (point != SA_HOOK_GROWER_CLAIMED) return;
  atomic_fetch_add(&claims, 1);
  sa_assert_ok(sa_host_fault_inject(fail_fn, 1, 0));
  if (fail_also != SA_HOST_FN_COUNT) sa_assert_ok(sa_host_fault_inject(fail_also, 1, 0));
}

/* The grower's chunk creation, mapping, access setting, or access setting
 * and then the unmap that undoes it fail: no range is published, the
 * ledger and the spans stay whole (the validator), nothing leaks, the
 * climb goes on on the allocating thread with the memory right, and after
 * each refusal the grower is asked again only once a chunk was created
 * (by the climb's own growths). */
static void each_driver_refusal_in_the_grower_loses_nothing(void **state) {
  (void)state;
  static const sa_host_fn cases[][2] = {
      {SA_HOST_FN_CHUNK_CREATE, SA_HOST_FN_COUNT},
      {SA_HOST_FN_MAP, SA_HOST_FN_COUNT},
      {SA_HOST_FN_SET_ACCESS, SA_HOST_FN_COUNT},
      {SA_HOST_FN_SET_ACCESS, SA_HOST_FN_UNMAP},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    fail_fn = cases[k][0];
    fail_also = cases[k][1];
    sa_fixture f;
    sa_assert_ok(sa_fixture_setup(&f, "background_growth=1", 1, SA_HOST_MANUAL));
    uint64_t injected = sa_host_faults_injected();
    atomic_store(&claims, 0);
    atomic_store(&sa__test_hook, fail_in_grower);
    void *p[STEPS];
    uint64_t own = climb(f.arena, f.streams[0], p);
    atomic_store(&sa__test_hook, NULL);
    assert_true(atomic_load(&claims) > 0);
    assert_true((uint64_t)atomic_load(&claims) <= own + 1);
    sa_host_fault_clear();
    assert_true(sa_host_faults_injected() > injected);
    assert_int_equal(stats(f.arena).background_growths, 0);
    sa__world_check(f.arena);
    check_and_free(f.arena, f.streams[0], p);
    /* A refused unmap left a stuck range: a trim unmaps it, then every
     * chunk goes back. */
    sa_assert_ok(sa_trim(f.arena, 0));
    assert_int_equal(stats(f.arena).reserved_bytes, 0);
    sa_assert_ok(sa_fixture_teardown(&f));
  }
}

/* ---------------------------------------------------------------------- */

/* The hook holds the grower after its claim until the test lets it go. */
static atomic_bool claimed, let_go;

static void hold_claimed(sa_hook_point point, void *arg) {
  (void)arg;
  if (point != SA_HOOK_GROWER_CLAIMED) return;
  atomic_store(&claimed, true);
  while (!atomic_load(&let_go)) usleep(50);
}

/* Until the hook holds the grower, or about 100 ms. */
static bool held_soon(void) {
  for (int i = 0; i < 2000 && !atomic_load(&claimed); i++) usleep(50);
  return atomic_load(&claimed);
}

/* A climb's first requests, until one asks the grower, which the hook then
 * holds with its range claimed; returns how many were made (in p). */
static int start_held_job(sa_arena *a, sa_stream s, void **p) {
  atomic_store(&claimed, false);
  atomic_store(&let_go, false);
  atomic_store(&sa__test_hook, hold_claimed);
  int n = 0;
  do {
    assert_true(n < STEPS);
    sa_assert_ok(sa_alloc(a, &p[n++], STEP, s));
  } while (!held_soon());
  return n;
}

static void free_all(sa_fixture *f, void **p, int n) {
  for (int i = 0; i < n; i++) sa_assert_ok(sa_free(p[i], f->streams[0]));
}

typedef struct call_s {
  sa_fixture *f;
  sa_stream s;
  void *p;
  size_t size;
  sa_status st;
  atomic_bool done;
} call;

static void *alloc_call(void *arg) {
  call *c = arg;
  c->st = sa_alloc(c->f->arena, &c->p, c->size, c->s);
  atomic_store(&c->done, true);
  return NULL;
}

static void *trim_call(void *arg) {
  call *c = arg;
  c->st = sa_trim(c->f->arena, 0);
  atomic_store(&c->done, true);
  return NULL;
}

static void *destroy_call(void *arg) {
  call *c = arg;
  c->st = sa_fixture_teardown(c->f);
  atomic_store(&c->done, true);
  return NULL;
}

/* Run fn on a thread while the grower is held: it must still be waiting
 * after a while (it needs the job to end), and finish once let go. */
static void run_behind_held_job(call *c, void *(*fn)(void *)) {
  pthread_t t;
  atomic_store(&c->done, false);
  assert_int_equal(pthread_create(&t, NULL, fn, c), 0);
  usleep(20000);
  assert_false(atomic_load(&c->done));
  atomic_store(&let_go, true);
  assert_int_equal(pthread_join(t, NULL), 0);
  atomic_store(&sa__test_hook, NULL);
  assert_true(atomic_load(&c->done));
}

/* A request no free span holds waits for the job in flight, whose range is
 * where its growth would go, then takes memory: the job's range is
 * published and the request's memory is right. */
static void a_growth_waits_for_the_job_in_flight(void **state) {
  (void)state;
  sa_fixture f;
  sa_assert_ok(sa_fixture_setup(&f, "background_growth=1", 1, SA_HOST_MANUAL));
  void *p[STEPS];
  int n = start_held_job(f.arena, f.streams[0], p);
  call c = {.f = &f, .s = f.streams[0], .size = 64 * MiB};
  run_behind_held_job(&c, alloc_call);
  sa_assert_ok(c.st);
  assert_int_equal(stats(f.arena).background_growths, 1);
  uint64_t bad = 0;
  sa_assert_ok(sa_host_fill(f.streams[0], c.p, c.size, 0xA11C0u));
  sa_assert_ok(sa_host_check(f.streams[0], c.p, c.size, 0xA11C0u, &bad));
  sa_assert_ok(sa_host_drain_all());
  assert_int_equal(bad, 0);
  sa__world_check(f.arena);
  sa_assert_ok(sa_free(c.p, f.streams[0]));
  free_all(&f, p, n);
  sa_assert_ok(sa_fixture_teardown(&f));
}

/* A climb's blocks freed while the grower's job is held in flight, then
 * fn on a thread behind it (run_behind_held_job); fn's status. */
static sa_status freed_then_behind_held_job(sa_fixture *f, void *(*fn)(void *)) {
  sa_assert_ok(sa_fixture_setup(f, "background_growth=1", 1, SA_HOST_MANUAL));
  void *p[STEPS];
  free_all(f, p, start_held_job(f->arena, f->streams[0], p));
  call c = {.f = f};
  run_behind_held_job(&c, fn);
  return c.st;
}

/* sa_trim while a job is in flight waits for it and gives its memory back
 * with the rest: nothing is held after it. */
static void a_trim_takes_back_the_job_in_flight(void **state) {
  (void)state;
  sa_fixture f;
  sa_assert_ok(freed_then_behind_held_job(&f, trim_call));
  sa_stats st = stats(f.arena);
  assert_int_equal(st.background_growths, 1);
  assert_int_equal(st.reserved_bytes, 0);
  sa__world_check(f.arena);
  sa_assert_ok(sa_fixture_teardown(&f));
}

/* Arena destroy while a job is in flight ends the thread after the job:
 * the fixture's leak check finds every chunk, mapping and range given
 * back. */
static void destroy_ends_the_grower_after_its_job(void **state) {
  (void)state;
  sa_fixture f;
  sa_assert_ok(freed_then_behind_held_job(&f, destroy_call));
}

/* With chunk_size, each background growth is one chunk of at most that
 * size, the unit the user asked reshapes to take back. */
static void a_background_growth_keeps_to_chunk_size(void **state) {
  (void)state;
  sa_fixture f;
  sa_assert_ok(sa_fixture_setup(&f, "background_growth=1,chunk_size=2MiB", 1, SA_HOST_MANUAL));
  void *p[STEPS];
  (void)climb(f.arena, f.streams[0], p);
  sa_stats st = stats(f.arena);
  assert_true(st.background_growths > 0);
  assert_int_equal(st.background_bytes, st.background_growths * 2 * MiB);
  check_and_free(f.arena, f.streams[0], p);
  sa_assert_ok(sa_fixture_teardown(&f));
}

/* Under a budget, with exact growth, or without the flag, nothing is
 * mapped in the background. */
static void no_background_growth_where_nothing_maps_ahead(void **state) {
  (void)state;
  static const char *const specs[] = {
      "background_growth=1,reserve_limit=256MiB",
      "background_growth=1,exact_growth=1",
      "",
  };
  for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
    sa_fixture f;
    sa_assert_ok(sa_fixture_setup(&f, specs[k], 1, SA_HOST_MANUAL));
    void *p[STEPS];
    (void)climb(f.arena, f.streams[0], p);
    assert_int_equal(stats(f.arena).background_growths, 0);
    assert_false(f.arena->grower.started);
    check_and_free(f.arena, f.streams[0], p);
    sa_assert_ok(sa_fixture_teardown(&f));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_climb_finds_memory_mapped_ahead),
      cmocka_unit_test(each_driver_refusal_in_the_grower_loses_nothing),
      cmocka_unit_test(a_growth_waits_for_the_job_in_flight),
      cmocka_unit_test(a_trim_takes_back_the_job_in_flight),
      cmocka_unit_test(destroy_ends_the_grower_after_its_job),
      cmocka_unit_test(a_background_growth_keeps_to_chunk_size),
      cmocka_unit_test(no_background_growth_where_nothing_maps_ahead),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
