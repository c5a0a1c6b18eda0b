/* Lazy free marks (large/timeline.c, "Pending"): a span freed on a stream
 * that keeps retaking what it frees records no event; its own stream takes
 * it back at once, and nobody else gets it before an event recorded in a
 * later call on that stream, or a device-wide synchronize, orders it.
 *
 * Each case makes one interleaving happen on the simulator with streams the
 * test steps by hand: the freeing stream's work stays queued, the taker runs
 * first, and the checker flags a handout ahead of unfinished work or a
 * driver call on a destroyed stream. Event records are counted, so the
 * steady state's "none" can fail.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "fixture.h"
#include "internal.h" /* SA_LAZY_MARK_RUN */
#include "test/util.h"

#define SPAN (16 * MiB)

/* No memory mapped ahead: a span freed is the one free span of its size.
 * Not kept: it goes back to the arena with a lazy mark (a kept one takes
 * no mark at all: kept_span_test). */
static int setup(void **state) {
  return sa_fixture_cmocka_setup_with(state, "exact_growth=1,keep_spans=0", 3);
}

static int teardown(void **state) { return sa_fixture_cmocka_teardown(state); }

static uint64_t records(void) { return sa_host_call_count(SA_HOST_FN_EVENT_RECORD); }

static uint64_t violations(void) {
  sa_host_counters c;
  sa_host_get_counters(&c);
  return c.order_violations;
}

/* A span of size on s that s has freed and taken back once: s is seen
 * retaking what it frees, so its next free may leave its mark pending. */
static void *retaken(sa_arena *a, size_t size, sa_stream s) {
  void *p, *q;
  sa_assert_ok(sa_alloc(a, &p, size, s));
  sa_assert_ok(sa_free(p, s));
  sa_assert_ok(sa_alloc(a, &q, size, s));
  assert_ptr_equal(q, p);
  return q;
}

/* p is freed on s with s's fill of it still queued, and no event recorded. */
static void free_unrecorded(void *p, sa_stream s, uint32_t pattern) {
  sa_assert_ok(sa_host_fill(s, p, 4096, pattern));
  uint64_t r0 = records();
  sa_assert_ok(sa_free(p, s));
  assert_int_equal(records(), r0);
  assert_true(sa_host_stream_pending(s) > 0);
}

/* taker's fill of q (size bytes) must be what stays, whoever ran first:
 * taker as far as it can go, then everything. */
static void fill_runs_last(void *q, sa_stream taker, uint32_t pattern) {
  uint64_t mism = 0, v0 = violations();
  sa_assert_ok(sa_host_fill(taker, q, 4096, pattern));
  sa_assert_ok(sa_host_check(taker, q, 4096, pattern, &mism));
  sa_assert_ok(sa_host_stream_step(taker, SIZE_MAX, NULL));
  sa_assert_ok(sa_host_drain_all());
  assert_int_equal(violations(), v0);
  assert_int_equal(mism, 0);
  assert_int_equal(((uint32_t *)q)[0], pattern);
}

/* Issue 30's loop: alloc+free pairs of one size on one stream, its work
 * queued. After the first pairs none records an event, and each gets the
 * same span back. Sizes up to the largest issue 28 measures. */
static void a_span_pair_on_one_stream_records_no_event(void **state) {
  sa_fixture *f = *state;
  sa_stream s = f->streams[0];
  static const size_t sizes[] = {SPAN, 256 * MiB};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    void *p = retaken(f->arena, sizes[k], s);
    uint64_t r0 = records();
    for (int i = 0; i < 100; i++) {
      void *q;
      sa_assert_ok(sa_host_fill(s, p, 4096, (uint32_t)i));
      sa_assert_ok(sa_free(p, s));
      sa_assert_ok(sa_alloc(f->arena, &q, sizes[k], s));
      assert_ptr_equal(q, p);
    }
    assert_int_equal(records() - r0, 0);
    sa_assert_ok(sa_free(p, s));
    sa_assert_ok(sa_host_drain_all());
  }
}

/* B cannot take A's unrecorded span p (there is nothing to wait on) and
 * grows instead; B's attempt asks A for the event, which A's next call
 * records (one); then B takes p behind a wait on it. */
static void taken_after_a_call_on_its_stream(sa_fixture *f, void *p, sa_stream A, sa_stream B,
                                             uint32_t pattern) {
  void *q, *r, *small;
  sa_assert_ok(sa_alloc(f->arena, &q, SPAN, B));
  assert_ptr_not_equal(q, p);
  uint64_t r0 = records();
  sa_assert_ok(sa_alloc(f->arena, &small, 4096, A)); /* a call that names A */
  assert_int_equal(records() - r0, 1);
  sa_assert_ok(sa_alloc(f->arena, &r, SPAN, B));
  assert_ptr_equal(r, p);
  fill_runs_last(r, B, pattern);
  sa_assert_ok(sa_free(small, A));
  sa_assert_ok(sa_free(q, B));
  sa_assert_ok(sa_free(r, B));
}

static void an_unrecorded_free_goes_to_another_stream_behind_its_event(void **state) {
  sa_fixture *f = *state;
  sa_stream A = f->streams[0], B = f->streams[1];
  void *p = retaken(f->arena, SPAN, A);
  free_unrecorded(p, A, 0xA1A1A1A1u);
  taken_after_a_call_on_its_stream(f, p, A, B, 0xB1B1B1B1u);
}

/* A stream alone in its arena (no other takes spans) frees spans that lie
 * apart, its fills of them queued: a run of them records one event per
 * SA_LAZY_MARK_RUN + 2 frees (the first pending, SA_LAZY_MARK_RUN more
 * left apart, then one that records, covering all), and the stream takes every one
 * back at once, no growth, no wait, its work in order. */
static void a_stream_alone_records_once_per_run_of_frees(void **state) {
  sa_fixture *f = *state;
  sa_stream A = f->streams[0];
  enum { N = 2 * (SA_LAZY_MARK_RUN + 2) };
  void *p[N], *sep[N], *q[N];
  for (int i = 0; i < N; i++) {
    sa_assert_ok(sa_alloc(f->arena, &p[i], SPAN, A));
    sa_assert_ok(sa_alloc(f->arena, &sep[i], 2 * MiB, A)); /* keeps them apart */
  }
  uint64_t r0 = records(), v0 = violations();
  for (int i = 0; i < N; i++) {
    sa_assert_ok(sa_host_fill(A, p[i], 4096, 0xA0000000u + (uint32_t)i));
    sa_assert_ok(sa_free(p[i], A));
  }
  assert_int_equal(records() - r0, 2);
  assert_true(sa_host_stream_pending(A) > 0);
  size_t reserved = 0;
  sa_stats st;
  sa_assert_ok(sa_get_stats(f->arena, &st));
  reserved = st.reserved_bytes;
  for (int i = 0; i < N; i++) {
    sa_assert_ok(sa_alloc(f->arena, &q[i], SPAN, A));
    bool one_of_them = false;
    for (int k = 0; k < N; k++) one_of_them |= q[i] == p[k];
    assert_true(one_of_them);
    sa_assert_ok(sa_host_fill(A, q[i], 4096, 0xB0000000u + (uint32_t)i));
  }
  sa_assert_ok(sa_get_stats(f->arena, &st));
  assert_int_equal(st.reserved_bytes, reserved);
  assert_int_equal(records() - r0, 2);
  sa_assert_ok(sa_host_drain_all());
  assert_int_equal(violations(), v0);
  for (int i = 0; i < N; i++) {
    assert_int_equal(((uint32_t *)q[i])[0], 0xB0000000u + (uint32_t)i);
    sa_assert_ok(sa_free(q[i], A));
    sa_assert_ok(sa_free(sep[i], A));
  }
}

/* A stream that takes spans after another did so alone finds the first
 * one's frees unrecorded: it grows rather than wait (there is nothing to
 * wait on), its attempt asks for the event, the first stream's next call
 * records one, which covers every pending free, and the newcomer takes
 * them behind a wait, its writes after the first stream's. */
static void a_stream_arriving_waits_for_the_first_streams_next_call(void **state) {
  sa_fixture *f = *state;
  sa_stream A = f->streams[0], B = f->streams[1];
  void *p[3], *sep[3];
  for (int i = 0; i < 3; i++) {
    sa_assert_ok(sa_alloc(f->arena, &p[i], SPAN, A));
    sa_assert_ok(sa_alloc(f->arena, &sep[i], 2 * MiB, A));
  }
  uint64_t r0 = records();
  for (int i = 0; i < 3; i++) free_unrecorded(p[i], A, 0xA5A5A5A5u);
  assert_int_equal(records(), r0);
  taken_after_a_call_on_its_stream(f, p[0], A, B, 0xB5B5B5B5u);
  for (int i = 0; i < 3; i++) sa_assert_ok(sa_free(sep[i], A));
}

/* A second free on A while one is pending records one event, which covers
 * both: B may then take the first span behind it. B takes spans from the
 * start, so A is not alone (a_stream_alone_records_once_per_run_of_frees). */
static void a_second_free_records_the_event_for_both(void **state) {
  sa_fixture *f = *state;
  sa_stream A = f->streams[0], B = f->streams[1];
  void *sep, *p2;
  sa_fixture_stream_takes_a_span(f->arena, B);
  void *p = retaken(f->arena, SPAN, A);
  sa_assert_ok(sa_alloc(f->arena, &sep, 2 * MiB, A)); /* keeps the two apart */
  sa_assert_ok(sa_alloc(f->arena, &p2, 2 * SPAN, A));
  free_unrecorded(p, A, 0xA2A2A2A2u);
  sa_assert_ok(sa_host_fill(A, p2, 4096, 0xA3A3A3A3u));
  uint64_t r0 = records();
  sa_assert_ok(sa_free(p2, A));
  assert_int_equal(records() - r0, 1);
  void *q;
  sa_assert_ok(sa_alloc(f->arena, &q, SPAN, B));
  assert_ptr_equal(q, p);
  fill_runs_last(q, B, 0xB2B2B2B2u);
  sa_assert_ok(sa_free(q, B));
  sa_assert_ok(sa_free(sep, A));
}

/* The device is full: B's allocation finds only A's unrecorded span, and
 * the out-of-memory path's device-wide synchronize (A's fill runs) makes
 * it B's. (Under a budget the user sets, a free records at once where a
 * span in its place would pass it.) */
static void a_device_sync_makes_an_unrecorded_free_reusable(void **state) {
  sa_fixture *f = *state;
  sa_stream A = f->streams[0], B = f->streams[1];
  void *p = retaken(f->arena, SPAN, A);
  free_unrecorded(p, A, 0xA4A4A4A4u);
  void *q;
  sa_assert_ok(sa_alloc(f->arena, &q, SPAN, B));
  assert_ptr_equal(q, p);
  assert_int_equal(sa_host_stream_pending(A), 0); /* the synchronize ran it */
  fill_runs_last(q, B, 0xB4B4B4B4u);
  sa_assert_ok(sa_free(q, B));
}

/* A device of one span's memory, for the case above; the default after. */
static int setup_full_device(void **state) {
  if (sa_host_set_device_memory(SPAN) != SA_OK) return -1;
  return setup(state);
}

static int teardown_full_device(void **state) {
  int r = teardown(state);
  return sa_host_set_device_memory(16 * GiB) == SA_OK ? r : -1;
}

/* sa_trim unmaps free memory after a device-wide synchronize: an
 * unrecorded span too, once the work on it ran. */
static void trim_unmaps_an_unrecorded_free(void **state) {
  sa_fixture *f = *state;
  sa_stream A = f->streams[0];
  void *p = retaken(f->arena, SPAN, A);
  free_unrecorded(p, A, 0xA5A5A5A5u);
  sa_assert_ok(sa_trim(f->arena, 0));
  assert_int_equal(sa_host_stream_pending(A), 0);
  sa_stats st;
  sa_assert_ok(sa_get_stats(f->arena, &st));
  assert_int_equal(st.reserved_bytes, 0);
}

/* A's pending span absorbs a span another stream's marks are on while A
 * alone takes spans (the 4 MiB one, recorded on A and freed on the default
 * stream); then B takes a span too, and A's next free beside its pending
 * span stays apart from it (sa__marks_pending_apart). That free must
 * record: left pending, it took over as A's pending ticket, A took it back
 * whole, and the earlier ticket on the merged span then had nothing to
 * complete it, no event, no pending ticket for a device sync, so sa_trim(0)
 * left 8 MiB mapped with nothing live (the fuzz target's find,
 * fuzz/corpus/trim-after-pending-kept-apart) and no other stream could
 * have reused it. The span validator's "a free's mark is known done,
 * evented, pending or after a lost record" catches it at once. */
static void a_free_kept_apart_from_the_pending_span_records(void **state) {
  (void)state;
  sa_fixture g;
  sa_assert_ok(sa_fixture_setup(&g, NULL, 1, SA_HOST_MANUAL));
  sa_stream A = g.streams[0], B;
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &B));
  void *p, *q;
  /* Freed on the default stream, recorded on A: two marks of others. */
  sa_assert_ok(sa_alloc(g.arena, &p, 4 * MiB - 255, A));
  sa_assert_ok(sa_host_fill(A, p, 4096, 1));
  sa_assert_ok(sa_record_stream(p, A));
  sa_assert_ok(sa_free(p, NULL));
  /* A alone: its free stays pending and merges with that span. */
  sa_assert_ok(sa_alloc(g.arena, &p, MiB + 1, A));
  sa_assert_ok(sa_host_fill(A, p, 4096, 2));
  sa_assert_ok(sa_free(p, A));
  sa_assert_ok(sa_alloc(g.arena, &p, MiB + 2, A)); /* carved from the pending span */
  sa_assert_ok(sa_host_fill(A, p, 4096, 3));
  /* B takes a span: A is alone no more. */
  sa_assert_ok(sa_alloc(g.arena, &q, 9605633, B));
  sa_assert_ok(sa_host_fill(B, q, 4096, 4));
  sa_assert_ok(sa_free(q, B));
  /* Beside the pending span, which carries others' marks: apart, so it records. */
  uint64_t r0 = records();
  sa_assert_ok(sa_free(p, A));
  assert_int_equal(records() - r0, 1);
  sa_assert_ok(sa_alloc(g.arena, &p, MiB + 2, A)); /* the span just freed, taken whole */
  sa_assert_ok(sa_host_fill(A, p, 4096, 5));
  sa_assert_ok(sa_free(p, A));
  sa_assert_ok(sa_trim(g.arena, 0));
  sa_stats st;
  sa_assert_ok(sa_get_stats(g.arena, &st));
  if (st.reserved_bytes != 0 || st.chunks_total != 0)
    fail_msg("%zu bytes in %zu chunks left mapped", st.reserved_bytes, st.chunks_total);
  sa_assert_ok(sa_stream_release(g.arena, B));
  sa_assert_ok(sa_host_stream_destroy(B));
  sa_assert_ok(sa_fixture_teardown(&g));
}

/* The header's rule: A is synchronized before it is destroyed, after an
 * unrecorded free. No call names A again: its span goes to B only after a
 * device-wide synchronize (sa_trim here), and nothing calls the driver on
 * the destroyed stream (the checker counts such calls). */
static void a_stream_destroyed_after_an_unrecorded_free(void **state) {
  sa_fixture *f = *state;
  sa_stream A, B = f->streams[1];
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &A));
  void *p = retaken(f->arena, SPAN, A);
  free_unrecorded(p, A, 0xA6A6A6A6u);
  sa_assert_ok(sa_host_stream_drain(A)); /* the rule */
  sa_assert_ok(sa_host_stream_destroy(A));
  void *q, *r;
  uint64_t v0 = violations();
  sa_assert_ok(sa_alloc(f->arena, &q, SPAN, B));
  assert_ptr_not_equal(q, p); /* nothing orders A's free for B yet */
  sa_assert_ok(sa_free(q, B));
  sa_assert_ok(sa_trim(f->arena, 0));
  sa_assert_ok(sa_alloc(f->arena, &r, SPAN, B));
  fill_runs_last(r, B, 0xB6B6B6B6u);
  sa_assert_ok(sa_free(r, B));
  assert_int_equal(violations(), v0);
}

/* A destroyed after the rule, and the next stream gets its handle: this
 * thread, which knew A, serves the new stream from A's state, the
 * unrecorded span too (A's work is done by the rule); the new stream's own
 * queued work on it still orders a third stream's reuse. */
static void a_recycled_handle_after_an_unrecorded_free(void **state) {
  sa_fixture *f = *state;
  sa_stream A, C = f->streams[2];
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &A));
  void *p = retaken(f->arena, SPAN, A);
  free_unrecorded(p, A, 0xA7A7A7A7u);
  sa_assert_ok(sa_host_stream_drain(A)); /* the rule */
  sa_assert_ok(sa_host_stream_destroy(A));
  sa_stream next;
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &next));
  assert_ptr_equal(next, A);
  void *q;
  sa_assert_ok(sa_alloc(f->arena, &q, SPAN, next));
  assert_ptr_equal(q, p);
  sa_assert_ok(sa_host_fill(next, q, 4096, 0x4e4e4e4eu)); /* queued */
  sa_assert_ok(sa_free(q, next));
  /* C gets the span only behind next's fill: an event recorded in a call
   * on next (C's attempt asks for it), or grows. */
  void *c1, *c2, *small;
  sa_assert_ok(sa_alloc(f->arena, &c1, SPAN, C));
  sa_assert_ok(sa_alloc(f->arena, &small, 4096, next));
  sa_assert_ok(sa_alloc(f->arena, &c2, SPAN, C));
  assert_true(c1 == p || c2 == p);
  fill_runs_last(c1 == p ? c1 : c2, C, 0xC7C7C7C7u);
  sa_assert_ok(sa_free(small, next));
  sa_assert_ok(sa_free(c1, C));
  sa_assert_ok(sa_free(c2, C));
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_stream_release(f->arena, next));
  sa_assert_ok(sa_host_stream_destroy(next));
}

typedef struct pairs_s {
  sa_arena *a;
  sa_stream s;
  void *p;
  uint64_t records; /* right after the free */
} pairs;

/* On a thread that then exits: an unrecorded free of a retaken span. */
static void *free_unrecorded_and_exit(void *arg) {
  pairs *w = arg;
  w->p = retaken(w->a, SPAN, w->s);
  free_unrecorded(w->p, w->s, 0xA8A8A8A8u);
  w->records = records();
  return NULL;
}

/* The freeing thread exits with its free unrecorded: its exit calls no
 * driver function on the stream (the event waits for a call that names
 * it), and B's reuse waits for that call, made on another thread. */
static void a_thread_exits_after_an_unrecorded_free(void **state) {
  sa_fixture *f = *state;
  sa_stream A = f->streams[0], B = f->streams[1];
  pairs w = {f->arena, A, NULL, 0};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, free_unrecorded_and_exit, &w), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(records(), w.records);
  taken_after_a_call_on_its_stream(f, w.p, A, B, 0xB8B8B8B8u);
}

/* A span recorded on K and freed on A records A's event at once, beside
 * K's: a span with another stream's mark is never left pending (it could
 * not merge with a pending neighbour). B's reuse waits for both streams'
 * fills, queued and run after B's. */
static void a_recorded_span_is_freed_with_both_events(void **state) {
  sa_fixture *f = *state;
  sa_stream A = f->streams[0], B = f->streams[1], K = f->streams[2];
  void *p = retaken(f->arena, SPAN, A);
  sa_assert_ok(sa_host_fill(K, p, 4096, 0x6b6b6b6bu));
  sa_assert_ok(sa_record_stream(p, K));
  sa_assert_ok(sa_host_fill(A, p, 4096, 0xA9A9A9A9u));
  uint64_t r0 = records();
  sa_assert_ok(sa_free(p, A));
  assert_int_equal(records() - r0, 2); /* K's event and A's */
  void *r;
  sa_assert_ok(sa_alloc(f->arena, &r, SPAN, B));
  assert_ptr_equal(r, p); /* behind waits for both */
  /* K's fill is the last to run. */
  uint64_t mism = 0, v0 = violations();
  sa_assert_ok(sa_host_fill(B, r, 4096, 0xB9B9B9B9u));
  sa_assert_ok(sa_host_check(B, r, 4096, 0xB9B9B9B9u, &mism));
  sa_assert_ok(sa_host_stream_step(B, SIZE_MAX, NULL));
  sa_assert_ok(sa_host_stream_drain(A));
  sa_assert_ok(sa_host_stream_step(B, SIZE_MAX, NULL));
  assert_true(sa_host_stream_pending(B) > 0); /* still waits for K */
  sa_assert_ok(sa_host_drain_all());
  assert_int_equal(violations(), v0);
  assert_int_equal(mism, 0);
  sa_assert_ok(sa_free(r, B));
}

/* Stream 0 leaves its span pair's free pending and makes no call again; a
 * second stream's pairs beside it neither merge into that pending span
 * (where they would wait for an event nobody records) nor grow at each
 * pair: the second stream retakes its own span. Before the pending span
 * was kept apart, every pair of the second stream grew the arena by the
 * span's size. */
static void a_pending_span_absorbs_no_other_streams_free(void **state) {
  sa_fixture *f = *state;
  sa_stream A = f->streams[0], B = f->streams[1];
  sa_assert_ok(sa_host_drain_all());
  void *p = retaken(f->arena, SPAN, A);
  sa_assert_ok(sa_free(p, A)); /* pending, and A calls no more */
  void *q;
  sa_assert_ok(sa_alloc(f->arena, &q, SPAN, B)); /* B cannot take A's pending span */
  sa_assert_ok(sa_free(q, B));
  sa_stats before, after;
  sa_assert_ok(sa_get_stats(f->arena, &before));
  for (int i = 0; i < 50; i++) {
    sa_assert_ok(sa_alloc(f->arena, &q, SPAN, B));
    sa_assert_ok(sa_free(q, B));
  }
  sa_assert_ok(sa_get_stats(f->arena, &after));
  assert_int_equal(after.reserved_bytes, before.reserved_bytes);
  assert_true(after.reserved_bytes <= 2 * SPAN + 2 * MiB);
  sa_assert_ok(sa_host_drain_all());
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(a_span_pair_on_one_stream_records_no_event, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(an_unrecorded_free_goes_to_another_stream_behind_its_event,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(a_second_free_records_the_event_for_both, setup, teardown),
      cmocka_unit_test_setup_teardown(a_stream_alone_records_once_per_run_of_frees, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_stream_arriving_waits_for_the_first_streams_next_call,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(a_device_sync_makes_an_unrecorded_free_reusable,
                                      setup_full_device, teardown_full_device),
      cmocka_unit_test_setup_teardown(trim_unmaps_an_unrecorded_free, setup, teardown),
      cmocka_unit_test(a_free_kept_apart_from_the_pending_span_records),
      cmocka_unit_test_setup_teardown(a_stream_destroyed_after_an_unrecorded_free, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_recycled_handle_after_an_unrecorded_free, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_thread_exits_after_an_unrecorded_free, setup, teardown),
      cmocka_unit_test_setup_teardown(a_pending_span_absorbs_no_other_streams_free, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_recorded_span_is_freed_with_both_events, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
