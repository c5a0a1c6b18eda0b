/* State kept by a stream's handle after the stream is gone.
 *
 * CUDA hands a destroyed stream's handle to the next stream created, while
 * the old stream's work may still run. The library keys some state by
 * handle: a thread's cache entry (bound to the old stream arena until
 * something shows the stream changed), a pending lane of cross-stream
 * batches, the record table, and pooled events that waits were enqueued on.
 * docs/STREAM_LIFETIME.md lists each one, the interleaving that makes it
 * outlive its stream, and why the next stream with the handle gets nothing
 * early; each case here makes one of those interleavings happen on the
 * simulator, whose checker flags a handout ahead of unfinished work and
 * whose kernels write memory only when they run.
 *
 * The recorded span's case (a recorded mark resolved through a timeline
 * slot the new stream re-recorded) is record_test's
 * a_recorded_mark_survives_its_streams_handle_reused.
 */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "fixture.h"
#include "internal.h"
#include "test/util.h"

static int setup(void **state) { return sa_fixture_cmocka_setup_with(state, "exact_growth=1", 3); }

static int teardown(void **state) { return sa_fixture_cmocka_teardown(state); }

static uint64_t violations(void) {
  sa_host_counters c;
  sa_host_get_counters(&c);
  return c.order_violations;
}

static sa_stream new_stream(void) {
  sa_stream s = NULL;
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &s));
  return s;
}

/* The next stream after old is destroyed: it gets old's handle. */
static sa_stream recycle(sa_stream old) {
  sa_assert_ok(sa_host_stream_destroy(old));
  sa_stream fresh = new_stream();
  assert_ptr_equal(fresh, old);
  return fresh;
}

static void release_and_destroy(sa_arena *a, sa_stream s) {
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_stream_release(a, s));
  sa_assert_ok(sa_host_stream_destroy(s));
}

/* size bytes on s, which must come after the work that used them before:
 * s fills them, everything runs, and s's pattern must be what stays. The
 * checker must stay silent. */
static void *take_last(sa_arena *a, size_t size, sa_stream s, uint32_t pattern) {
  uint64_t v0 = violations(), mism = 0;
  void *q;
  sa_assert_ok(sa_alloc(a, &q, size, s));
  sa_assert_ok(sa_host_fill(s, q, 4096, pattern));
  sa_assert_ok(sa_host_check(s, q, 4096, pattern, &mism));
  sa_assert_ok(sa_host_drain_all());
  assert_int_equal(violations(), v0);
  assert_int_equal(mism, 0);
  assert_int_equal(((uint32_t *)q)[0], pattern);
  return q;
}

/* A free's mark on the timeline of a stream destroyed after the rule (it
 * was synchronized), and a thread that knew its handle: the next stream's
 * span frees take tickets on the old timeline and wrap its ring, so the
 * old stream's tickets resolve to the new stream's events. That is
 * conservative: the old tickets' work is done. And the new stream's own
 * work is waited for: a span it freed with its fills still queued goes to
 * a third stream only behind them. */
static void a_free_mark_on_a_recycled_timeline_orders_both_streams(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], c = f->streams[1], k = new_stream();
  enum { FREES = 12 };
  void *p, *r[FREES], *sep[2];
  for (int i = 0; i < FREES; i++) sa_assert_ok(sa_alloc(f->arena, &r[i], 2 * MiB, a));
  sa_assert_ok(sa_alloc(f->arena, &sep[0], 2 * MiB, a));
  sa_assert_ok(sa_alloc(f->arena, &p, 8 * MiB, k)); /* this thread knows k */
  sa_assert_ok(sa_alloc(f->arena, &sep[1], 2 * MiB, a));
  sa_assert_ok(sa_host_fill(k, p, 4096, 0x6b6b6b6bu));
  sa_assert_ok(sa_free(p, k));
  sa_assert_ok(sa_host_drain_all()); /* the rule: k is synchronized */
  sa_stream next = recycle(k);
  for (int i = 0; i < FREES; i++) {
    sa_assert_ok(sa_host_fill(next, r[i], 4096, 0x4e4e4e4eu)); /* queued */
    sa_assert_ok(sa_free(r[i], next));
  }
  assert_true(sa_host_stream_pending(next) >= FREES);
  /* exact_growth: no memory mapped ahead, so next's spans (merged) are
   * the one free span of their size. */
  void *s = take_last(f->arena, FREES * 2 * MiB, c, 0xC2C2C2C2u);
  bool in_next_spans = false;
  for (int i = 0; i < FREES; i++) in_next_spans |= s == r[i];
  assert_true(in_next_spans);
  void *q = take_last(f->arena, 8 * MiB, c, 0xC1C1C1C1u); /* k's span */
  assert_ptr_equal(q, p);
  sa_assert_ok(sa_free(q, c));
  sa_assert_ok(sa_free(s, c));
  for (int i = 0; i < 2; i++) sa_assert_ok(sa_free(sep[i], a));
  release_and_destroy(f->arena, next);
}

/* A thread's open cross-stream batch outlives its stream: blocks of A freed
 * on k (synchronized, then destroyed), then more of A's freed on the next
 * stream with k's handle join the same batch, whose event is recorded on
 * the new stream when it is sent on. A's reuse must wait for the new
 * stream's queued work on the later blocks. */
static void an_open_batch_across_a_recycled_handle_waits_for_the_new_stream(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], k = new_stream();
  enum { N = 8 };
  void *p[2 * N];
  for (int i = 0; i < 2 * N; i++) sa_assert_ok(sa_alloc(f->arena, &p[i], 64 * KiB, a));
  sa_assert_ok(sa_host_drain_all());
  for (int i = 0; i < N; i++) sa_assert_ok(sa_free(p[i], k)); /* A's blocks, on k */
  sa_assert_ok(sa_host_drain_all()); /* the rule */
  sa_stream next = recycle(k);
  for (int i = N; i < 2 * N; i++) {
    sa_assert_ok(sa_host_fill(next, p[i], 4096, 0x4e4e4e4eu)); /* queued */
    sa_assert_ok(sa_free(p[i], next));
  }
  void *x;
  sa_assert_ok(sa_alloc(f->arena, &x, 256, next)); /* a call on next sends the batch on */
  sa_assert_ok(sa_free(x, next));
  /* A takes blocks of that class until it gets one of the batch's. */
  uint64_t v0 = violations();
  void *q[2 * N];
  int got = 0, hit = -1;
  for (; got < 2 * N && hit < 0; got++) {
    sa_assert_ok(sa_alloc(f->arena, &q[got], 64 * KiB, a));
    for (int i = N; i < 2 * N; i++)
      if (q[got] == p[i]) hit = got;
  }
  assert_true(hit >= 0);
  uint64_t mism = 0;
  sa_assert_ok(sa_host_fill(a, q[hit], 4096, 0xA1A1A1A1u));
  sa_assert_ok(sa_host_check(a, q[hit], 4096, 0xA1A1A1A1u, &mism));
  sa_assert_ok(sa_host_drain_all());
  assert_int_equal(violations(), v0);
  assert_int_equal(mism, 0);
  assert_int_equal(((uint32_t *)q[hit])[0], 0xA1A1A1A1u);
  for (int i = 0; i < got; i++) sa_assert_ok(sa_free(q[i], a));
  release_and_destroy(f->arena, next);
}

/* A pending lane is keyed by the handle its first event was recorded on.
 * A block of A recorded on k (k's fill queued) and freed on A waits in a
 * batch behind an event on k; k is destroyed with the fill queued, which
 * the header allows for memory allocated elsewhere and recorded; the next
 * stream with k's handle frees more of A's blocks, whose batch lands in
 * the same lane, and its work completes first. The lane must not hand A
 * the recorded block on the strength of the later batch. */
static void a_lane_shared_by_two_streams_of_one_handle_keeps_the_older_waiting(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], k = new_stream();
  const size_t size = 512 * KiB; /* two blocks a bin: A refills from its arena */
  void *p, *r[4];
  sa_assert_ok(sa_alloc(f->arena, &p, size, a));
  for (int i = 0; i < 4; i++) sa_assert_ok(sa_alloc(f->arena, &r[i], size, a));
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_host_fill(k, p, 4096, 0x6b6b6b6bu)); /* k's use, queued */
  sa_assert_ok(sa_record_stream(p, k));
  sa_assert_ok(sa_free(p, a)); /* behind an event on k */
  sa_stream next = recycle(k);
  for (int i = 0; i < 4; i++) sa_assert_ok(sa_free(r[i], next));
  void *x;
  sa_assert_ok(sa_alloc(f->arena, &x, 256, next)); /* sends next's batch on */
  sa_assert_ok(sa_free(x, next));
  sa_assert_ok(sa_host_stream_drain(next)); /* next's event completes, k's fill waits */
  void *q[6];
  int got = 0, hit = -1;
  uint64_t v0 = violations(), mism = 0;
  for (; got < 6 && hit < 0; got++) {
    sa_assert_ok(sa_alloc(f->arena, &q[got], size, a));
    if (q[got] == p) hit = got;
  }
  if (hit >= 0) {
    sa_assert_ok(sa_host_fill(a, p, 4096, 0xA2A2A2A2u));
    sa_assert_ok(sa_host_check(a, p, 4096, 0xA2A2A2A2u, &mism));
  }
  sa_assert_ok(sa_host_drain_all()); /* k's fill runs: before A's, or A was early */
  assert_int_equal(violations(), v0);
  assert_int_equal(mism, 0);
  if (hit >= 0) assert_int_equal(((uint32_t *)p)[0], 0xA2A2A2A2u);
  for (int i = 0; i < got; i++) sa_assert_ok(sa_free(q[i], a));
  release_and_destroy(f->arena, next);
}

/* A pooled event outlives the wait enqueued on it: a recorded span taken
 * by C behind a device-side wait on its mark's event, which then goes back
 * to the pool while k's fill is still queued; k is destroyed and the next
 * stream's span free records that same event again. C's wait keeps its
 * target, as on CUDA: C's work still runs after k's fill. */
static void a_recycled_event_keeps_the_wait_enqueued_on_it(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], c = f->streams[1], k = new_stream();
  void *p, *sep, *r;
  sa_assert_ok(sa_alloc(f->arena, &p, 8 * MiB, a));
  sa_assert_ok(sa_alloc(f->arena, &sep, 2 * MiB, a));
  sa_assert_ok(sa_alloc(f->arena, &r, 2 * MiB, a));
  sa_assert_ok(sa_host_fill(k, p, 4096, 0x6b6b6b6bu)); /* k's use, queued */
  sa_assert_ok(sa_record_stream(p, k));
  sa_assert_ok(sa_free(p, a));
  sa_assert_ok(sa_host_stream_drain(a));
  uint64_t v0 = violations(), mism = 0;
  size_t pooled = f->arena->events.n;
  void *q;
  sa_assert_ok(sa_alloc(f->arena, &q, 8 * MiB, c)); /* behind a wait on k's event */
  assert_ptr_equal(q, p);
  assert_int_equal(f->arena->events.n, pooled + 1); /* the mark's event is back */
  sa_assert_ok(sa_host_fill(c, q, 4096, 0xC4C4C4C4u));
  sa_assert_ok(sa_host_check(c, q, 4096, 0xC4C4C4C4u, &mism));
  sa_stream next = recycle(k);
  sa_assert_ok(sa_record_stream(r, next));
  sa_assert_ok(sa_free(r, a)); /* a recorded mark's event: the pooled one, on next */
  assert_int_equal(f->arena->events.n, pooled);
  sa_assert_ok(sa_host_stream_drain(next));
  size_t done = 0;
  sa_assert_ok(sa_host_stream_step(c, SIZE_MAX, &done));
  assert_int_equal(done, 0); /* c still waits for k's fill */
  sa_assert_ok(sa_host_drain_all());
  assert_int_equal(violations(), v0);
  assert_int_equal(mism, 0);
  assert_int_equal(((uint32_t *)q)[0], 0xC4C4C4C4u);
  sa_assert_ok(sa_free(q, c));
  sa_assert_ok(sa_free(sep, a));
  release_and_destroy(f->arena, next);
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(a_free_mark_on_a_recycled_timeline_orders_both_streams),
      T(an_open_batch_across_a_recycled_handle_waits_for_the_new_stream),
      T(a_lane_shared_by_two_streams_of_one_handle_keeps_the_older_waiting),
      T(a_recycled_event_keeps_the_wait_enqueued_on_it),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
