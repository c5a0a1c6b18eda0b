/* A failed call changes nothing: a call that a driver fault makes fail
 * leaves the arena as it was (statistics, the block live and freeable, its
 * sa_record_stream record, the stream's state), and the same call succeeds
 * once the fault is gone. test/fault_sweep_test.c fails every driver call of
 * a workload but checks only statuses, contents and leaks; these tests put
 * one call into a state the sweep does not reach and compare what
 * sa_get_stats says before and after it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "fixture.h"
#include "test/util.h"

static sa_stats stats(sa_arena *a) {
  sa_stats s;
  sa_assert_ok(sa_get_stats(a, &s));
  return s;
}

/* What a failed call must leave as it was: counts of blocks, bytes and
 * stream arenas. */
static void assert_unchanged(const sa_stats *before, const sa_stats *after) {
#define SAME(field)                                                                   \
  do {                                                                                \
    if (before->field != after->field)                                                \
      fail_msg("%s: %llu before the failed call, %llu after", #field,                 \
               (unsigned long long)before->field, (unsigned long long)after->field); \
  } while (0)
  SAME(alloc_count);
  SAME(free_count);
  SAME(live_bytes);
  SAME(large_spans);
  SAME(deferred_frees);
  SAME(streams);
  SAME(superblocks_total);
#undef SAME
}

/* Each stream of f used once, so that the arena knows them all: a call's
 * first use of a stream makes its stream arena, whatever comes of it. */
static void use_streams(sa_fixture *f) {
  for (size_t i = 0; i < f->stream_count; i++) {
    void *p;
    sa_assert_ok(sa_alloc(f->arena, &p, 256, f->streams[i]));
    sa_assert_ok(sa_free(p, f->streams[i]));
  }
}

static int setup(void **state, const char *spec, size_t n) {
  sa_fixture *f = malloc(sizeof *f);
  if (f == NULL) return -1;
  if (sa_fixture_setup(f, spec, n, SA_HOST_MANUAL) != SA_OK) {
    free(f);
    return -1;
  }
  *state = f;
  return 0;
}

static int setup3(void **state) { return setup(state, NULL, 3); }
/* Spans freed go back to the arena with their events (a kept span has
 * none to wait for or fail). */
static int setup3_unkept(void **state) { return setup(state, "keep_spans=0", 3); }
/* Spans in chunks of their own: a trim unmaps each free one whole. */
static int setup2_exact(void **state) {
  return setup(state, "keep_spans=0,exact_growth=1,chunk_size=2MiB", 2);
}

static int teardown(void **state) {
  sa_host_fault_clear();
  return sa_fixture_cmocka_teardown(state);
}

/* A thread exited with blocks of stream S cached: their superblock emptied
 * outside a call naming S, and waits for the next one to record an event
 * (the fence), which first asks the driver for S's id. That query failing
 * is no answer: S was treated as a new stream with the old handle, its
 * stream arena gone, and what it held (the empty superblock) left to a
 * device sync, while the call failed. */
static void a_failed_stream_id_query_keeps_the_stream(void **state) {
  sa_fixture *f = *state;
  sa_stream s = f->streams[0];
  void *p, *q;
  sa_assert_ok(sa_alloc(f->arena, &p, 1000, s));
  sa_assert_ok(sa_fixture_alloc_free_on_thread(f->arena, 3000, 4, s));
  sa_stats before = stats(f->arena);
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_STREAM_ID, 1, 1));
  sa_assert_status(sa_alloc(f->arena, &q, 3000, s), SA_ERR_DRIVER);
  assert_null(q);
  sa_host_fault_clear();
  sa_stats after = stats(f->arena);
  assert_unchanged(&before, &after);
  sa_assert_ok(sa_alloc(f->arena, &q, 3000, s)); /* in the superblock S kept */
  after = stats(f->arena);
  assert_int_equal(after.superblocks_total, before.superblocks_total);
  assert_int_equal(after.reserved_bytes, before.reserved_bytes);
  sa_assert_ok(sa_free(q, s));
  sa_assert_ok(sa_free(p, s));
}

/* A block of A freed on B while the thread's open batch holds a block of
 * another owner: that batch goes on first, behind an event on B, and the
 * record fails. The free fails, its block stays live; the retry frees it. */
static void a_cross_stream_free_whose_batch_cannot_go_on(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1], c = f->streams[2];
  void *x, *y;
  use_streams(f);
  sa_assert_ok(sa_alloc(f->arena, &x, 1000, c));
  sa_assert_ok(sa_alloc(f->arena, &y, 1000, a));
  sa_assert_ok(sa_free(x, b)); /* the open batch: C's block freed on B */
  sa_stats before = stats(f->arena);
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_EVENT_RECORD, 1, 1));
  sa_assert_status(sa_free(y, b), SA_ERR_DRIVER);
  sa_host_fault_clear();
  sa_stats after = stats(f->arena);
  assert_unchanged(&before, &after);
  assert_int_equal(after.events_in_flight, before.events_in_flight);
  sa_assert_status(sa_record_stream(y, b), SA_OK); /* live, not free */
  sa_assert_ok(sa_free(y, b));
  sa_assert_status(sa_free(y, b), SA_ERR_DOUBLE_FREE);
}

/* A small block recorded on B and C, freed on its own stream A: the event
 * on C fails. The record must stay whole: after the retry, A reuses the
 * block only behind B's and C's work (the checker sees any other reuse). */
static void a_recorded_free_keeps_every_recorded_stream(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1], c = f->streams[2];
  void *p;
  uint64_t bad = 0;
  use_streams(f);
  sa_assert_ok(sa_alloc(f->arena, &p, 1000, a));
  sa_assert_ok(sa_host_fill(a, p, 1024, 0xAAAAAAAAu));
  sa_assert_ok(sa_host_stream_drain(a));
  sa_assert_ok(sa_host_check(b, p, 1024, 0xAAAAAAAAu, &bad)); /* queued on B */
  sa_assert_ok(sa_host_check(c, p, 1024, 0xAAAAAAAAu, &bad)); /* and on C */
  sa_assert_ok(sa_record_stream(p, b));
  sa_assert_ok(sa_record_stream(p, c));
  sa_stats before = stats(f->arena);
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_EVENT_RECORD, 2, 0)); /* C's */
  sa_assert_status(sa_free(p, a), SA_ERR_DRIVER);
  sa_host_fault_clear();
  sa_stats after = stats(f->arena);
  assert_unchanged(&before, &after);
  assert_int_equal(after.events_in_flight, before.events_in_flight);
  sa_assert_ok(sa_free(p, a));
  void *q[64];
  for (int i = 0; i < 64; i++) { /* p again on A, if at all, behind B and C */
    sa_assert_ok(sa_alloc(f->arena, &q[i], 1000, a));
    sa_assert_ok(sa_host_fill(a, q[i], 1024, 0x11111111u));
  }
  sa_assert_ok(sa_host_stream_drain(a));
  sa_assert_ok(sa_host_drain_all());
  assert_int_equal(bad, 0);
  for (int i = 0; i < 64; i++) sa_assert_ok(sa_free(q[i], a));
}

/* A span recorded on B, freed on A: the mark on B fails after A's was
 * taken. The span stays live and recorded; after the retry a third stream
 * reuses it only behind B's work. */
static void a_recorded_span_free_keeps_the_record(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1], c = f->streams[2];
  void *p, *q;
  uint64_t bad = 0;
  use_streams(f);
  sa_assert_ok(sa_alloc(f->arena, &p, 5 * MiB, a));
  sa_assert_ok(sa_host_fill(a, p, 4096, 0xAAAAAAAAu));
  sa_assert_ok(sa_host_stream_drain(a));
  sa_assert_ok(sa_host_check(b, p, 4096, 0xAAAAAAAAu, &bad)); /* queued on B */
  sa_assert_ok(sa_record_stream(p, b));
  sa_stats before = stats(f->arena);
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_EVENT_RECORD, 2, 0)); /* B's mark */
  sa_assert_status(sa_free(p, a), SA_ERR_DRIVER);
  sa_host_fault_clear();
  sa_stats after = stats(f->arena);
  assert_unchanged(&before, &after);
  assert_int_equal(after.reserved_bytes, before.reserved_bytes);
  sa_assert_ok(sa_free(p, a));
  sa_assert_ok(sa_host_stream_drain(a));
  sa_assert_ok(sa_alloc(f->arena, &q, 5 * MiB, c));
  sa_assert_ok(sa_host_fill(c, q, 4096, 0xCCCCCCCCu));
  sa_assert_ok(sa_host_stream_drain(c)); /* C first: if q is p, B must run before */
  sa_assert_ok(sa_host_stream_drain(b));
  assert_int_equal(bad, 0);
  sa_assert_ok(sa_free(q, c));
}

/* The only free span was freed on A with A's work pending: C takes it
 * behind a device-side wait, which fails. Nothing is grown, the span stays
 * free with its mark, and the retry takes it. */
static void a_span_alloc_whose_wait_fails(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], c = f->streams[2];
  void *p, *q;
  use_streams(f);
  sa_fixture_stream_takes_a_span(f->arena, c); /* A is not alone: its free records */
  sa_assert_ok(sa_alloc(f->arena, &p, 5 * MiB, a));
  sa_assert_ok(sa_host_fill(a, p, 4096, 0xAAAAAAAAu)); /* still queued */
  sa_assert_ok(sa_free(p, a));
  sa_stats before = stats(f->arena);
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_STREAM_WAIT_EVENT, 1, 1));
  sa_assert_status(sa_alloc(f->arena, &q, 5 * MiB, c), SA_ERR_DRIVER);
  assert_null(q);
  sa_host_fault_clear();
  sa_stats after = stats(f->arena);
  assert_unchanged(&before, &after);
  assert_int_equal(after.reserved_bytes, before.reserved_bytes);
  assert_int_equal(after.cached_bytes, before.cached_bytes);
  sa_assert_ok(sa_alloc(f->arena, &q, 5 * MiB, c));
  assert_ptr_equal(q, p);
  assert_int_equal(stats(f->arena).reserved_bytes, before.reserved_bytes);
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_free(q, c));
}

/* sa_stream_release of B whose synchronize fails, with B's blocks live,
 * cached by this thread and in its open batch: nothing goes, B stays a
 * stream of the arena, and the retry releases it. */
static void a_stream_release_whose_synchronize_fails(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1];
  void *live, *cached, *other;
  sa_assert_ok(sa_alloc(f->arena, &live, 1000, b));
  sa_assert_ok(sa_alloc(f->arena, &cached, 1000, b));
  sa_assert_ok(sa_free(cached, b));
  sa_assert_ok(sa_alloc(f->arena, &other, 1000, a));
  sa_assert_ok(sa_free(other, b)); /* A's block in B's open batch */
  sa_stats before = stats(f->arena);
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_STREAM_SYNCHRONIZE, 1, 1));
  sa_assert_status(sa_stream_release(f->arena, b), SA_ERR_DRIVER);
  sa_host_fault_clear();
  sa_stats after = stats(f->arena);
  assert_unchanged(&before, &after);
  sa_assert_ok(sa_stream_release(f->arena, b));
  assert_int_equal(stats(f->arena).streams, before.streams - 1);
  sa_assert_ok(sa_free(live, a)); /* still valid, freed on another stream */
}

/* sa_trim whose device-wide synchronize fails (as CUDA fails it during any
 * capture) goes on without it, keeping only what it alone would have made
 * safe: a free span freed on A with A's work still queued has an event of
 * its own (another stream takes spans: A is not alone), which the trim
 * waits for, and then gives the span back. */
static void a_trim_whose_device_synchronize_fails(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0];
  void *p, *other;
  sa_assert_ok(sa_alloc(f->arena, &other, 5 * MiB, f->streams[1]));
  sa_assert_ok(sa_alloc(f->arena, &p, 5 * MiB, a));
  sa_assert_ok(sa_host_fill(a, p, 5 * MiB, 0xAAAAAAAAu)); /* still queued */
  sa_assert_ok(sa_free(p, a));
  sa_assert_ok(sa_free(other, f->streams[1]));
  sa_assert_ok(sa_host_stream_drain(f->streams[1]));
  assert_true(sa_host_stream_pending(a) > 0);
  assert_true(stats(f->arena).reserved_bytes > 0);
  uint64_t faults = sa_host_faults_injected();
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_DEVICE_SYNCHRONIZE, 1, 1));
  sa_assert_ok(sa_trim(f->arena, 0));
  assert_true(sa_host_faults_injected() > faults); /* the synchronize failed */
  sa_host_fault_clear();
  assert_int_equal(sa_host_stream_pending(a), 0); /* waited for */
  sa_stats after = stats(f->arena);
  assert_int_equal(after.reserved_bytes, 0);
  assert_int_equal(after.cached_bytes, 0);
}

/* A record that fails in a slot whose event was the only one at or after
 * an earlier free's ticket leaves that free's span with no event to query
 * (the timeline's record_lost): X's ticket 1 is in slot 1, tickets 2-8
 * were left pending by Z's frees and forgotten when Z took its span back
 * whole, and Y's free at ticket 9 fails to record in slot 1. Nothing
 * records on A afterwards. A trim's device synchronize, which started after
 * the failure, completes every ticket handed out before it: X's memory is
 * unmapped, and the arena holds only the live spans. */
static void a_trim_after_a_lost_record_unmaps_what_it_stranded(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1];
  void *z, *g1, *x, *g2, *y;
  sa_assert_ok(sa_alloc(f->arena, &z, 4 * MiB, a));
  sa_assert_ok(sa_alloc(f->arena, &g1, 2 * MiB, a)); /* guards: no span merges */
  sa_assert_ok(sa_alloc(f->arena, &x, 8 * MiB, a));
  sa_assert_ok(sa_alloc(f->arena, &g2, 2 * MiB, a));
  sa_assert_ok(sa_alloc(f->arena, &y, 2 * MiB, a));
  sa_assert_ok(sa_host_fill(a, x, 4096, 0xAAAAAAAAu)); /* queued on A */
  sa_assert_ok(sa_record_stream(x, b));
  sa_assert_ok(sa_free(x, a)); /* two marks: records ticket 1 */
  for (int i = 2; i <= 8; i++) { /* tickets 2-8: pending, then forgotten */
    void *again;
    sa_assert_ok(sa_free(z, a));
    sa_assert_ok(sa_alloc(f->arena, &again, 4 * MiB, a));
    assert_ptr_equal(again, z);
  }
  sa_assert_ok(sa_record_stream(y, b));
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_EVENT_RECORD, 2, 0)); /* A's, after B's */
  sa_assert_status(sa_free(y, a), SA_ERR_DRIVER);
  sa_host_fault_clear();
  assert_true(sa_host_stream_pending(a) > 0);
  sa_assert_ok(sa_trim(f->arena, 0));
  assert_int_equal(sa_host_stream_pending(a), 0);
  sa_stats after = stats(f->arena);
  assert_int_equal(after.large_spans, 4); /* z, the guards, y */
  if (after.reserved_bytes != 10 * MiB)
    fail_msg("%zu MiB held after the trim, 10 live", (size_t)(after.reserved_bytes / MiB));
  sa_assert_ok(sa_free(y, a));
  sa_assert_ok(sa_free(z, a));
  sa_assert_ok(sa_free(g1, a));
  sa_assert_ok(sa_free(g2, a));
}

/* The first sa_malloc_async creates the default arena; its range cannot be
 * reserved. It fails with no arena made, and the next call makes one. */
static void a_default_arena_whose_creation_fails(void **state) {
  (void)state;
  /* The simulator's default arena, also where a GPU runner forces CUDA. */
  unsetenv("STREAMARENA_BACKEND");
  setenv("STREAMARENA_CONF", "backend=host", 1);
  sa_default_arenas_shutdown();
  sa_host_counters before;
  sa_host_get_counters(&before);
  void *p = (void *)1;
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_VA_RESERVE, 1, 1));
  sa_assert_status(sa_malloc_async(&p, 4096, NULL), SA_ERR_DRIVER);
  assert_null(p);
  sa_arena *a;
  sa_assert_status(sa_default_arena(0, &a), SA_ERR_DRIVER);
  sa_host_fault_clear();
  sa_host_counters now;
  sa_host_get_counters(&now);
  assert_int_equal(now.va_ranges, before.va_ranges);
  sa_assert_ok(sa_malloc_async(&p, 4096, NULL));
  sa_assert_ok(sa_free_async(p, NULL));
  sa_default_arenas_shutdown();
  sa_host_get_counters(&now);
  assert_int_equal(now.va_ranges, before.va_ranges);
  assert_int_equal(now.chunks, before.chunks);
  unsetenv("STREAMARENA_CONF");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(a_failed_stream_id_query_keeps_the_stream, setup3,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_cross_stream_free_whose_batch_cannot_go_on, setup3,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_recorded_free_keeps_every_recorded_stream, setup3,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_recorded_span_free_keeps_the_record, setup3, teardown),
      cmocka_unit_test_setup_teardown(a_span_alloc_whose_wait_fails, setup3_unkept, teardown),
      cmocka_unit_test_setup_teardown(a_stream_release_whose_synchronize_fails, setup3,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_trim_whose_device_synchronize_fails, setup3_unkept,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_trim_after_a_lost_record_unmaps_what_it_stranded,
                                      setup2_exact, teardown),
      cmocka_unit_test(a_default_arena_whose_creation_fails),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
