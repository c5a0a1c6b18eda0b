/* Cross-stream batches pending on their owner (stream_arena.c): they wait
 * in lanes, one per stream their event was recorded on, oldest first, and a
 * drain queries a lane's first batch, not every batch. The lanes' links
 * are checked after every step: each batch in one lane, behind the batches
 * that came in before it, the lane's tail its last, the blocks counted.
 */
#include <pthread.h>
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
#include "internal.h"
#include "test/util.h"

#define MAX_BLOCKS 512

static int setup(void **state) { return sa_fixture_cmocka_setup(state); }
static int teardown(void **state) { return sa_fixture_cmocka_teardown(state); }

static sa_stream new_stream(sa_host_mode mode) {
  sa_stream s = NULL;
  sa_assert_ok(sa_host_stream_create(mode, &s));
  return s;
}

/* A stream whose work stays queued until the test steps it. */
static sa_stream lagging_stream(sa_arena *a, void **busy) {
  sa_stream s = new_stream(SA_HOST_MANUAL);
  sa_assert_ok(sa_alloc(a, busy, 4 * KiB, s));
  sa_assert_ok(sa_host_fill(s, *busy, 4 * KiB, 7));
  return s;
}

static uint64_t queries(void) { return sa_host_call_count(SA_HOST_FN_EVENT_QUERY); }

/* What the lanes of sa hold must be, in the order the batches came in. */
typedef struct expect_s {
  void *blocks[MAX_BLOCKS];
  sa_stream on[MAX_BLOCKS];
  int n;
} expect;

/* A failed check lets go of the lock first: teardown takes it again. */
#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      pthread_mutex_unlock(&sa->lock);                                               \
      fail_msg("lanes: %s", #cond);                                                  \
    }                                                                                \
  } while (0)

/* The lanes' links: every batch in a lane keyed by its first event's
 * stream, the lane's batches in the order expected, its tail the last, at
 * most lanes lanes, and pending_blocks their blocks. Returns the batches. */
static int check_lanes(sa_stream_arena *sa, const expect *want, int lanes) {
  pthread_mutex_lock(&sa->lock);
  int batches = 0, nlanes = 0;
  size_t blocks = 0;
  bool seen[MAX_BLOCKS] = {false};
  for (sa_deferred *lane = sa->pending; lane != NULL; lane = lane->next, nlanes++) {
    CHECK(nlanes < MAX_BLOCKS);
    int after = -1; /* where the lane's last batch was in want */
    sa_deferred *last = NULL;
    for (sa_deferred *d = lane; d != NULL; d = d->lane_next) {
      CHECK(d->nevents > 0);
      CHECK(d->on == lane->on);
      CHECK(d->n == 1u);
      int at = -1;
      for (int i = 0; i < want->n; i++)
        if (want->blocks[i] == d->blocks[0].p) at = i;
      CHECK(at >= 0);
      CHECK(!seen[at]);
      seen[at] = true;
      CHECK(want->on[at] == lane->on);
      CHECK(at > after);
      after = at;
      blocks += d->n;
      batches++;
      last = d;
    }
    CHECK(lane->lane_tail == last);
  }
  CHECK(nlanes <= lanes);
  CHECK(batches == want->n);
  CHECK(sa->pending_blocks == blocks);
  pthread_mutex_unlock(&sa->lock);
  return batches;
}

#undef CHECK

/* Blocks allocated on the owner, recorded on on[i] and freed on the owner:
 * one batch each, with one event on on[i]. */
static void record_and_free(sa_fixture *f, sa_stream owner, expect *want, const sa_stream *on,
                            int n) {
  for (int i = 0; i < n; i++) {
    void *p;
    sa_assert_ok(sa_alloc(f->arena, &p, 4 * KiB, owner));
    sa_assert_ok(sa_record_stream(p, on[i]));
    sa_assert_ok(sa_free(p, owner));
    assert_true(want->n < MAX_BLOCKS);
    want->blocks[want->n] = p;
    want->on[want->n++] = on[i];
  }
}

/* Drop from want the batches of stream s (their events completed). */
static void forget(expect *want, sa_stream s) {
  int k = 0;
  for (int i = 0; i < want->n; i++) {
    if (want->on[i] == s) continue;
    want->blocks[k] = want->blocks[i];
    want->on[k++] = want->on[i];
  }
  want->n = k;
}

/* Forty batches behind two lagging streams, interleaved, and four whose
 * stream completed: a drain queries each lagging lane once and each ready
 * batch once (44 queries when every batch was queried); stepping one
 * stream frees its lane, and a drain that must wait takes in the rest. */
static void a_drain_queries_a_lane_once(void **state) {
  sa_fixture *f = *state;
  sa_stream owner = f->streams[0];
  void *busy_b, *busy_c;
  sa_stream b = lagging_stream(f->arena, &busy_b), c = lagging_stream(f->arena, &busy_c);
  sa_stream d = new_stream(SA_HOST_AUTO);
  expect want = {.n = 0};
  sa_stream on[40];
  for (int i = 0; i < 40; i++) on[i] = i % 2 ? c : b;
  record_and_free(f, owner, &want, on, 40);
  for (int i = 0; i < 4; i++) on[i] = d;
  record_and_free(f, owner, &want, on, 4);

  sa_stream_arena *sa;
  sa_assert_ok(sa__stream_arena_get(f->arena, owner, &sa));
  uint64_t q0 = queries();
  sa__stream_arena_shed(sa, SA_UNNAMED);
  assert_int_equal(queries() - q0, 2 + 4);
  forget(&want, d);
  assert_int_equal(check_lanes(sa, &want, 2), 40);

  q0 = queries(); /* nothing changed: a query per lane */
  sa__stream_arena_shed(sa, SA_UNNAMED);
  assert_int_equal(queries() - q0, 2);
  assert_int_equal(check_lanes(sa, &want, 2), 40);

  sa_assert_ok(sa_host_stream_drain(b));
  q0 = queries();
  sa__stream_arena_shed(sa, SA_UNNAMED);
  assert_int_equal(queries() - q0, 20 + 1);
  forget(&want, b);
  assert_int_equal(check_lanes(sa, &want, 1), 20);

  /* More behind c, then behind b again: c's lane grows at its end. */
  on[0] = c;
  on[1] = b;
  on[2] = c;
  record_and_free(f, owner, &want, on, 3);
  sa__stream_arena_shed(sa, SA_UNNAMED);
  assert_int_equal(check_lanes(sa, &want, 2), 23);

  /* A class with no superblock here: the refill waits (on the device)
   * rather than grow, and takes in every batch. */
  void *p;
  sa_assert_ok(sa_alloc(f->arena, &p, 48 * KiB, owner));
  want.n = 0;
  assert_int_equal(check_lanes(sa, &want, 0), 0);
  sa_assert_ok(sa_free(p, owner));
  sa__stream_arena_unbind(sa);

  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_free(busy_b, b));
  sa_assert_ok(sa_free(busy_c, c));
  sa_stream mine[] = {b, c, d};
  for (int i = 0; i < 3; i++) {
    sa_assert_ok(sa_stream_release(f->arena, mine[i]));
    sa_assert_ok(sa_host_stream_destroy(mine[i]));
  }
}

/* More lagging streams taking turns than a new batch looks at: lanes of
 * one stream may repeat, and every batch is still in one, in order. */
static void streams_past_the_lookup_open_more_lanes(void **state) {
  sa_fixture *f = *state;
  sa_stream owner = f->streams[0];
  enum { STREAMS = SA_LANE_LOOKUP + 3, ROUNDS = 4 };
  sa_stream lag[STREAMS];
  void *busy[STREAMS];
  for (int i = 0; i < STREAMS; i++) lag[i] = lagging_stream(f->arena, &busy[i]);
  /* Superblocks with room, so that no refill below has to wait. */
  enum { WARM = ROUNDS * STREAMS + 64 };
  void *warm[WARM];
  for (int i = 0; i < WARM; i++) sa_assert_ok(sa_alloc(f->arena, &warm[i], 4 * KiB, owner));
  for (int i = 0; i < WARM; i++)
    if (i % 32 != 0) sa_assert_ok(sa_free(warm[i], owner));
  expect want = {.n = 0};
  sa_stream_arena *sa;
  sa_assert_ok(sa__stream_arena_get(f->arena, owner, &sa));
  for (int r = 0; r < ROUNDS; r++) {
    record_and_free(f, owner, &want, lag, STREAMS);
    sa__stream_arena_shed(sa, SA_UNNAMED);
    assert_int_equal(check_lanes(sa, &want, (r + 1) * STREAMS), (r + 1) * STREAMS);
  }
  for (int i = 0; i < STREAMS; i += 2) { /* every other stream catches up */
    sa_assert_ok(sa_host_stream_drain(lag[i]));
    forget(&want, lag[i]);
  }
  sa__stream_arena_shed(sa, SA_UNNAMED);
  assert_int_equal(check_lanes(sa, &want, ROUNDS * STREAMS), want.n);
  sa__stream_arena_unbind(sa);
  sa_assert_ok(sa_host_drain_all());
  for (int i = 0; i < WARM; i += 32) sa_assert_ok(sa_free(warm[i], owner));
  for (int i = 0; i < STREAMS; i++) {
    sa_assert_ok(sa_free(busy[i], lag[i]));
    sa_assert_ok(sa_stream_release(f->arena, lag[i]));
    sa_assert_ok(sa_host_stream_destroy(lag[i]));
  }
}

/* An arena destroyed with lanes of several batches pending settles every
 * event and frees every batch (the leak check and ASan say so). */
static void destroy_with_lanes_pending(void **state) {
  (void)state;
  sa_arena *a;
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host"));
  sa_stream owner = new_stream(SA_HOST_AUTO);
  void *busy_b, *busy_c;
  sa_stream b = lagging_stream(a, &busy_b), c = lagging_stream(a, &busy_c);
  for (int i = 0; i < 12; i++) {
    void *p;
    sa_assert_ok(sa_alloc(a, &p, 4 * KiB, owner));
    sa_assert_ok(sa_record_stream(p, i % 3 ? b : c));
    sa_assert_ok(sa_free(p, owner));
  }
  sa_stream_arena *sa;
  sa_assert_ok(sa__stream_arena_get(a, owner, &sa));
  sa__stream_arena_shed(sa, SA_UNNAMED);
  pthread_mutex_lock(&sa->lock);
  assert_non_null(sa->pending);
  assert_non_null(sa->pending->lane_next);
  pthread_mutex_unlock(&sa->lock);
  sa__stream_arena_unbind(sa);
  sa_assert_ok(sa_free(busy_b, b));
  sa_assert_ok(sa_free(busy_c, c));
  sa_assert_ok(sa_arena_destroy(a));
  sa_assert_ok(sa_host_drain_all());
  sa_host_counters cnt;
  sa_host_get_counters(&cnt);
  assert_int_equal(cnt.events, 0);
  assert_int_equal(cnt.chunks, 0);
  sa_stream mine[] = {owner, b, c};
  for (int i = 0; i < 3; i++) sa_assert_ok(sa_host_stream_destroy(mine[i]));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(a_drain_queries_a_lane_once, setup, teardown),
      cmocka_unit_test_setup_teardown(streams_past_the_lookup_open_more_lanes, setup, teardown),
      cmocka_unit_test(destroy_with_lanes_pending),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
