/* Regression tests for allocator core bugs found by the reliability suite
 * (stress, fuzzing, fault sweep). One test per bug, named after the
 * behaviour it pins down; each failed before its fix.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "fixture.h"
#include "test/util.h"

/* A fixture with n SA_HOST_MANUAL streams in *state. */
static int setup_streams(void **state, size_t n) {
  sa_fixture *f = malloc(sizeof *f);
  if (f == NULL) return -1;
  if (sa_fixture_setup(f, NULL, n, SA_HOST_MANUAL) != SA_OK) {
    free(f);
    return -1;
  }
  *state = f;
  return 0;
}

static int setup3(void **state) { return setup_streams(state, 3); }
static int setup4(void **state) { return setup_streams(state, 4); }

static int teardown(void **state) { return sa_fixture_cmocka_teardown(state); }

/* A large block allocated and used on B, declared used on B with
 * sa_record_stream, freed on A: reuse on C must wait for B's work too. The
 * record was dropped as "ordered already" because B is the block's own
 * stream, which holds only when the block returns to B. */
static void record_stream_of_a_spans_own_stream_is_kept(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1], c = f->streams[2];
  void *p, *q;
  uint64_t bad = 0;
  sa_assert_ok(sa_alloc(f->arena, &p, 5 * MiB, b));
  sa_assert_ok(sa_host_fill(b, p, 4096, 0xBBBBBBBBu));
  sa_assert_ok(sa_host_check(b, p, 4096, 0xBBBBBBBBu, &bad));
  sa_assert_ok(sa_record_stream(p, b));
  sa_assert_ok(sa_free(p, a));
  sa_assert_ok(sa_host_stream_drain(a)); /* A's event completes; B's work has not run */
  sa_assert_ok(sa_alloc(f->arena, &q, 5 * MiB, c));
  sa_assert_ok(sa_host_fill(c, q, 4096, 0xCCCCCCCCu));
  sa_assert_ok(sa_host_stream_drain(c)); /* C first: if q is p, B must run before */
  sa_assert_ok(sa_host_stream_drain(b));
  assert_int_equal(bad, 0);
  sa_assert_ok(sa_trim(f->arena, 0));
  sa_assert_ok(sa_free(q, c));
}

/* A span freed on A and recorded on B; a request on C makes C wait for A's
 * event, then the wait for B's fails. The span must keep both events: the
 * next stream (D) has to wait for A's work too, still queued. (The events
 * were taken off one by one as C waited, and the span went back with B's
 * alone: D then got it while A's fill was pending, and the checker said
 * so.) */
static void failed_wait_keeps_every_event_of_a_free_span(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1], c = f->streams[2], d = f->streams[3];
  void *p, *q, *r;
  uint64_t bad = 0;
  sa_assert_ok(sa_alloc(f->arena, &p, 8 * MiB, a));
  sa_assert_ok(sa_host_fill(a, p, 8 * MiB, 0xAAAAAAAAu)); /* queued on A */
  sa_assert_ok(sa_record_stream(p, b));
  sa_assert_ok(sa_host_fill(b, p, 4096, 0xBBBBBBBBu)); /* queued on B */
  sa_assert_ok(sa_free(p, a));
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_STREAM_WAIT_EVENT, 2, 0));
  sa_assert_status(sa_alloc(f->arena, &r, 8 * MiB, c), SA_ERR_DRIVER);
  assert_true(sa_host_faults_injected() > 0);
  sa_host_fault_clear();
  sa_assert_ok(sa_alloc(f->arena, &q, 8 * MiB, d)); /* the checker verifies it */
  assert_ptr_equal(q, p);
  sa_assert_ok(sa_host_fill(d, q, 8 * MiB, 0xDDDDDDDDu));
  sa_assert_ok(sa_host_check(d, q, 8 * MiB, 0xDDDDDDDDu, &bad));
  sa_assert_ok(sa_host_stream_drain(d)); /* D first: it must wait for A and B */
  sa_assert_ok(sa_host_drain_all());
  assert_int_equal(bad, 0);
  sa_assert_ok(sa_free(q, d));
}

/* The driver refuses to release one cached chunk while the arena is
 * destroyed: that chunk stays with the driver, but every other one must
 * still be released (it used to stop at the first failure and leak the
 * rest), and destroy must say so. */
static void destroy_releases_every_chunk_the_driver_does_not_refuse(void **state) {
  (void)state;
  sa_host_counters before, after;
  sa_host_get_counters(&before);
  sa_config cfg;
  sa_config_init(&cfg);
  sa_assert_ok(sa_config_parse(&cfg, "backend=host,chunk_size=2MiB", NULL, 0));
  sa_arena *a;
  sa_assert_ok(sa_arena_create(&cfg, &a));
  void *p[4];
  for (int i = 0; i < 4; i++) sa_assert_ok(sa_alloc(a, &p[i], (size_t)(3 + 2 * i) * MiB, NULL));
  for (int i = 0; i < 4; i++) sa_assert_ok(sa_free(p[i], NULL));
  sa_host_counters held;
  sa_host_get_counters(&held);
  assert_true(held.chunks - before.chunks >= 12); /* 24 MiB in 2 MiB chunks */
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_CHUNK_RELEASE, 1, 0));
  sa_assert_status(sa_arena_destroy(a), SA_ERR_DRIVER);
  sa_host_fault_clear();
  sa_host_get_counters(&after);
  assert_int_equal(after.chunks - before.chunks, 1); /* only the refused one */
  assert_int_equal(after.mappings, before.mappings);
  assert_int_equal(after.va_ranges, before.va_ranges);
  assert_int_equal(after.events, before.events);
}

/* Destroy must report an event the driver refused to destroy (it used to
 * return SA_OK and leave the event behind silently). */
static void destroy_reports_an_event_it_could_not_destroy(void **state) {
  (void)state;
  sa_host_counters before, after;
  sa_host_get_counters(&before);
  sa_config cfg;
  sa_config_init(&cfg);
  sa_assert_ok(sa_config_parse(&cfg, "backend=host", NULL, 0));
  sa_arena *a;
  sa_stream s;
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &s));
  sa_assert_ok(sa_arena_create(&cfg, &a));
  void *p, *q;
  sa_assert_ok(sa_alloc(a, &p, 4096, NULL));
  sa_assert_ok(sa_free(p, s)); /* cross-stream: batched */
  sa_assert_ok(sa_alloc(a, &q, 4096, s)); /* a call on s sends the batch behind an event */
  sa_assert_ok(sa_free(q, s));
  sa_assert_ok(sa_trim(a, 0)); /* the event completed: pooled */
  sa_host_counters held;
  sa_host_get_counters(&held);
  assert_true(held.events > before.events);
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_EVENT_DESTROY, 1, 0));
  sa_assert_status(sa_arena_destroy(a), SA_ERR_DRIVER);
  sa_host_fault_clear();
  sa_host_get_counters(&after);
  assert_int_equal(after.events - before.events, 1); /* only the refused one */
  assert_int_equal(after.chunks, before.chunks);
  sa_assert_ok(sa_host_stream_destroy(s));
}

/* A superblock on the global stack carries the event recorded when it left
 * its stream. Destroy waits for it; when that wait fails, the event must
 * still go back to the driver (it was neither pooled nor destroyed). */
static void destroy_returns_an_event_whose_wait_failed(void **state) {
  (void)state;
  sa_host_counters before, after;
  sa_host_get_counters(&before);
  sa_arena *a;
  sa_stream s;
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &s));
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host"));
  /* Four superblocks of two 1 MiB blocks empty on s. Three empty in calls
   * on s, each with an event recorded on s: two stay on s, the third goes
   * to the global stack. The fourth empties as the thread exits, not in a
   * call on s: it has no event and stays on s until a device sync. */
  sa_assert_ok(sa_fixture_alloc_free_on_thread(a, MiB, 8, s));
  sa_stats st;
  sa_assert_ok(sa_get_stats(a, &st));
  assert_int_equal(st.superblocks_empty, 4);
  assert_int_equal(st.events_in_flight, 3);
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_EVENT_SYNCHRONIZE, 1, 1));
  sa_assert_status(sa_arena_destroy(a), SA_ERR_DRIVER);
  sa_host_fault_clear();
  sa_host_get_counters(&after);
  assert_int_equal(after.events, before.events);
  assert_int_equal(after.chunks, before.chunks);
  sa_assert_ok(sa_host_stream_destroy(s));
}

/* Blocks freed on stream B (allocated on A) wait in the thread's open
 * cross-stream batch. B is then released and destroyed, as the API asks.
 * Flushing the batch must not record an event on the dead stream (on CUDA
 * that crashed in cuEventRecord); release already waited for B's work, so
 * the blocks go home without one, and they do come back. */
static void batch_freed_on_a_released_stream_needs_no_event(void **state) {
  (void)state;
  sa_fixture f;
  sa_assert_ok(sa_fixture_setup(&f, "max_physical=4MiB", 1, SA_HOST_AUTO));
  sa_stream a = f.streams[0], b;
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &b));
  void *p[4];
  for (int i = 0; i < 4; i++) sa_assert_ok(sa_alloc(f.arena, &p[i], MiB / 2, a));
  for (int i = 0; i < 4; i++) sa_assert_ok(sa_free(p[i], b)); /* batched, no event yet */
  sa_assert_ok(sa_stream_release(f.arena, b));
  sa_assert_ok(sa_host_stream_destroy(b));
  /* The whole cap again on A: only possible once the batch came home (an
   * event record on the destroyed stream fails, and kept them away). */
  void *q[8];
  for (int i = 0; i < 8; i++) sa_assert_ok(sa_alloc(f.arena, &q[i], MiB / 2, a));
  for (int i = 0; i < 8; i++) sa_assert_ok(sa_free(q[i], a));
  sa_assert_ok(sa_fixture_teardown(&f));
}

/* A block recorded on a stream that is then released (and destroyed, as
 * the API allows after sa_stream_release) must still be freeable: release
 * waited for that stream's work, so the record is satisfied. The free used
 * to record an event on the dead stream and fail with
 * SA_ERR_UNKNOWN_STREAM forever, leaking the block. Found by the fuzzer. */
static void free_after_a_recorded_stream_was_released(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0];
  const size_t sizes[] = {1000, 5 * MiB};
  for (int i = 0; i < 2; i++) {
    sa_stream gone;
    sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &gone));
    void *p;
    sa_assert_ok(sa_alloc(f->arena, &p, sizes[i], a));
    sa_assert_ok(sa_host_fill(gone, p, 256, 7));
    sa_assert_ok(sa_record_stream(p, gone));
    sa_assert_ok(sa_stream_release(f->arena, gone));
    sa_assert_ok(sa_host_stream_destroy(gone));
    sa_assert_ok(sa_free(p, a));
  }
}

/* Free spans are marked ("pinned") while a reclaim pass looks at them; the
 * marks must not outlive the pass. A pass that stopped early (enough
 * memory gathered) left a span whose event was pending marked, and an
 * unmapped span's descriptor went to the spares still marked and came back
 * marked in the next span mapped with it: every later pass, sa_trim
 * included, skipped those spans, so their memory never came back. Found by
 * churn_test. */
static void trim_returns_every_free_span(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], c = f->streams[1];
  void *p, *q, *r, *s;
  sa_assert_ok(sa_alloc(f->arena, &p, 8 * MiB, a));
  sa_assert_ok(sa_free(p, a)); /* its event waits for A, which nobody steps */
  sa_assert_ok(sa_alloc(f->arena, &q, 4 * MiB, NULL));
  sa_assert_ok(sa_alloc(f->arena, &r, 2 * MiB, NULL));
  sa_assert_ok(sa_free(q, NULL)); /* the default stream runs at once */
  sa_assert_ok(sa_free(r, NULL));
  /* 6 MiB fits none of them: the pass unmaps q and r (p is busy), stops
   * once their chunks cover the request, and maps s from them. */
  sa_assert_ok(sa_alloc(f->arena, &s, 5 * MiB + 512 * 1024, c));
  sa_assert_ok(sa_free(s, c));
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_trim(f->arena, 0));
  sa_stats st;
  sa_assert_ok(sa_get_stats(f->arena, &st));
  assert_int_equal(st.reserved_bytes, 0);
  assert_int_equal(st.chunks_total, 0);
}

/* A growth maps its chunks one by one; the second map fails and the
 * driver refuses to unmap the first. The first stays mapped, out of use,
 * until a reclaim unmaps it; the chunks never mapped must go back to the chunk cache
 * (they were kept with the stuck range: their bytes were lost to the budget
 * for the arena's life, and destroy's unmap of the whole range, gaps and
 * all, failed and leaked every one of them). */
static void refused_unwind_keeps_only_the_chunks_it_mapped(void **state) {
  (void)state;
  sa_fixture f;
  sa_assert_ok(sa_fixture_setup(&f, "max_physical=16MiB", 1, SA_HOST_MANUAL));
  sa_stream s = f.streams[0];
  void *p;
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_MAP, 2, 0));
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_UNMAP, 1, 0));
  sa_assert_status(sa_alloc(f.arena, &p, 6 * MiB, s), SA_ERR_DRIVER);
  assert_int_equal(sa_host_faults_injected() >= 2, 1);
  sa_host_fault_clear();
  /* 2 MiB stay mapped where the unwind was refused; 14 of the 16 are left. */
  sa_status st = sa_alloc(f.arena, &p, 12 * MiB, s);
  if (st == SA_OK) sa_assert_ok(sa_free(p, s));
  sa_status torn = sa_fixture_teardown(&f);
  sa_assert_ok(st);
  sa_assert_ok(torn);
}

/* The driver fails set_access while memory is mapped, then refuses the
 * unwind's unmap: the range stays mapped, kept aside (a superblock's for a
 * small block, a run's for a large one). Once the driver works again a
 * trim must take it back. It was kept until destroy: four such failures
 * under max_physical=8MiB left an arena with nothing live that could not
 * allocate one byte, and sa_trim(0) gave nothing back. Found by the fuzzer
 * (fault injection). */
static void trim_takes_back_a_range_whose_unwind_was_refused(void **state) {
  (void)state;
  const size_t sizes[] = {1, 3 * MiB};
  for (int k = 0; k < 2; k++) {
    sa_fixture f;
    sa_assert_ok(sa_fixture_setup(&f, "max_physical=8MiB", 1, SA_HOST_MANUAL));
    sa_stream s = f.streams[0];
    void *p;
    sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_SET_ACCESS, 1, 1));
    sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_UNMAP, 1, 1));
    for (int i = 0; i < 4; i++) {
      sa_status st = sa_alloc(f.arena, &p, sizes[k], s);
      assert_true(st == SA_ERR_DRIVER || st == SA_ERR_OUT_OF_MEMORY);
      assert_null(p);
    }
    sa_host_fault_clear();
    sa_assert_ok(sa_trim(f.arena, 0));
    sa_stats st;
    sa_assert_ok(sa_get_stats(f.arena, &st));
    assert_int_equal(st.reserved_bytes, 0);
    assert_int_equal(st.chunks_total, 0);
    sa_status got = sa_alloc(f.arena, &p, 8 * MiB, s); /* the whole cap serves again */
    if (got == SA_OK) sa_assert_ok(sa_free(p, s));
    sa_status torn = sa_fixture_teardown(&f);
    sa_assert_ok(got);
    sa_assert_ok(torn);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(record_stream_of_a_spans_own_stream_is_kept, setup3,
                                      teardown),
      cmocka_unit_test(destroy_releases_every_chunk_the_driver_does_not_refuse),
      cmocka_unit_test(destroy_reports_an_event_it_could_not_destroy),
      cmocka_unit_test(destroy_returns_an_event_whose_wait_failed),
      cmocka_unit_test(batch_freed_on_a_released_stream_needs_no_event),
      cmocka_unit_test_setup_teardown(free_after_a_recorded_stream_was_released, setup3,
                                      teardown),
      cmocka_unit_test_setup_teardown(trim_returns_every_free_span, setup3, teardown),
      cmocka_unit_test_setup_teardown(failed_wait_keeps_every_event_of_a_free_span, setup4,
                                      teardown),
      cmocka_unit_test(refused_unwind_keeps_only_the_chunks_it_mapped),
      cmocka_unit_test(trim_takes_back_a_range_whose_unwind_was_refused),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  printf("regression: core bugs pinned %zu, threads 1, streams 3, failures %d\n",
         sizeof tests / sizeof tests[0], failed);
  return failed;
}
