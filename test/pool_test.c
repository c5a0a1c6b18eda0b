/* Graph pools (streamarena.h, "Graph pools") on the host simulator, whose
 * capture rules follow the driver's: allocations during a capture on a
 * stream the arena never saw, replays, a pool shared by two captures,
 * reuse in capture order only, the last release ordered after the last
 * launch (hand-stepped streams), bad input, threads, and driver faults
 * during growth.
 *
 * The simulator keeps no graph (include/streamarena/host.h): a test
 * replays one by enqueuing the captured kernels (fill, check) again on a
 * launch stream, which is what a cuGraphLaunch makes the device run. The
 * same cases on a GPU, with real graphs: gpu_pool_test.c.
 */
#include <pthread.h>
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
#include "internal.h"
#include "test/util.h"

static int setup(void **state) {
  sa_fixture *f = calloc(1, sizeof *f);
  /* Spans freed go back to the arena, where the pools' placement rules
   * act on them (kept spans: kept_span_test, with a pool's capture). */
  if (f == NULL || sa_fixture_setup(f, "keep_spans=0", 4, SA_HOST_MANUAL) != SA_OK) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  sa_fixture *f = *state;
  sa_status st = sa_fixture_teardown(f);
  free(f);
  if (st != SA_OK) print_error("teardown: %s\n", sa_status_string(st));
  return st == SA_OK ? 0 : -1;
}

/* A stream the arena never saw, hand-stepped. */
static sa_stream fresh_stream(void) {
  sa_stream s;
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &s));
  return s;
}

/* s drained, released to the arena (if it saw it) and destroyed. */
static void drop_stream(sa_arena *a, sa_stream s) {
  sa_assert_ok(sa_host_stream_drain(s));
  sa_assert_ok(sa_stream_release(a, s));
  sa_assert_ok(sa_host_stream_destroy(s));
}

static sa_pool_stats pool_stats(sa_pool *pool) {
  sa_pool_stats st;
  sa_assert_ok(sa_pool_get_stats(pool, &st));
  return st;
}

static void assert_capture_intact(sa_stream s) {
  sa_host_capture_status cs;
  sa_assert_ok(sa_host_stream_capture_status(s, &cs));
  assert_int_equal(cs, SA_HOST_CAPTURE_ACTIVE);
}

/* Whether [p, p + n) and [q, q + m) share a byte. */
static bool overlap(const void *p, size_t n, const void *q, size_t m) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
  return a < b + m && b < a + n;
}

/* Whether [p, p + n) shares a byte with one of the pool's segments. */
static bool in_pool(sa_pool *pool, const void *p, size_t n) {
  pthread_mutex_lock(&pool->lock);
  bool hit = false;
  for (sa_pool_seg *seg = pool->segs; seg != NULL && !hit; seg = seg->next)
    hit = overlap(p, n, (void *)seg->base, seg->size);
  pthread_mutex_unlock(&pool->lock);
  return hit;
}

/* ---- capture and replay -------------------------------------------------- */

/* Allocations during a global-mode capture on a stream the arena never
 * saw: no driver call on it (a stream id query there would invalidate
 * the capture), the capture stays intact, and the graph's replays find
 * their memory at the captured addresses. */
static void a_capture_on_a_new_stream_allocates_from_its_pool(void **state) {
  sa_fixture *f = *state;
  sa_stream s = fresh_stream(), launch = f->streams[0];
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(f->arena, &pool));
  sa_assert_ok(sa_host_stream_begin_capture(s, SA_HOST_CAPTURE_GLOBAL));
  void *x, *y;
  sa_assert_ok(sa_pool_alloc(pool, &x, 1000, s));
  sa_assert_ok(sa_pool_alloc(pool, &y, 3 * MiB, s));
  assert_non_null(x);
  assert_non_null(y);
  assert_int_equal((uintptr_t)x % 512, 0);
  assert_false(overlap(x, 1000, y, 3 * MiB));
  sa_assert_ok(sa_host_fill(s, x, 1024, 0x11111111u)); /* into the graph */
  assert_capture_intact(s);
  sa_assert_ok(sa_host_stream_end_capture(s));

  /* Three replays: the captured kernels on the launch stream, at the
   * captured addresses, which nothing else took meanwhile. */
  for (uint32_t i = 0; i < 3; i++) {
    uint64_t bad = 0;
    sa_assert_ok(sa_host_fill(launch, x, 1024, 0xA0000000u + i));
    sa_assert_ok(sa_host_fill(launch, y, 3 * MiB, 0xB0000000u + i));
    sa_assert_ok(sa_host_check(launch, x, 1024, 0xA0000000u + i, &bad));
    sa_assert_ok(sa_host_stream_drain(launch));
    assert_int_equal(bad, 0);
  }
  sa_pool_stats ps = pool_stats(pool);
  assert_int_equal(ps.live_blocks, 2);
  assert_int_equal(ps.live_requested, 1000 + 3 * MiB);
  sa_assert_ok(sa_free(x, launch));
  sa_assert_ok(sa_free(y, launch));
  sa_assert_ok(sa_pool_release(pool, launch));
  drop_stream(f->arena, s);
}

/* A block freed during a capture is reused later in the same capture, on
 * that stream, in capture order; another stream never gets it, even once
 * the capture ended (the graph's replays use it). */
static void a_free_in_a_capture_is_reused_by_its_stream_only(void **state) {
  sa_fixture *f = *state;
  sa_stream s = fresh_stream(), other = f->streams[1];
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(f->arena, &pool));
  sa_assert_ok(sa_host_stream_begin_capture(s, SA_HOST_CAPTURE_GLOBAL));
  void *x, *again, *elsewhere;
  sa_assert_ok(sa_pool_alloc(pool, &x, 64 * KiB, s));
  sa_assert_ok(sa_free(x, s)); /* no event: the capture would take it */
  assert_capture_intact(s);
  sa_assert_ok(sa_pool_alloc(pool, &elsewhere, 64 * KiB, other));
  assert_false(overlap(elsewhere, 64 * KiB, x, 64 * KiB));
  sa_assert_ok(sa_pool_alloc(pool, &again, 64 * KiB, s));
  assert_ptr_equal(again, x);
  sa_assert_ok(sa_free(again, s));
  assert_capture_intact(s);
  sa_assert_ok(sa_host_stream_end_capture(s));

  /* After the capture: still s's only, whatever the other stream waits. */
  void *later;
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_pool_alloc(pool, &later, 64 * KiB, other));
  assert_false(overlap(later, 64 * KiB, x, 64 * KiB));
  sa_assert_ok(sa_free(later, other));
  sa_assert_ok(sa_free(elsewhere, other));
  sa_assert_ok(sa_pool_release(pool, other));
  drop_stream(f->arena, s);
}

/* Two captures share one pool (graph_pool_handle()): the second capture
 * on the same stream reuses what the first freed, in capture order; each
 * capture's release is one use, and the pool goes with the last. */
static void two_captures_share_one_pool(void **state) {
  sa_fixture *f = *state;
  sa_stream s = fresh_stream(), launch = f->streams[0];
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(f->arena, &pool));
  sa_assert_ok(sa_pool_retain(pool));
  assert_int_equal(pool_stats(pool).uses, 2);

  void *out1, *tmp1, *out2, *tmp2;
  sa_assert_ok(sa_host_stream_begin_capture(s, SA_HOST_CAPTURE_GLOBAL));
  sa_assert_ok(sa_pool_alloc(pool, &out1, 256 * KiB, s));
  sa_assert_ok(sa_pool_alloc(pool, &tmp1, 512 * KiB, s));
  sa_assert_ok(sa_free(tmp1, s));
  sa_assert_ok(sa_host_stream_end_capture(s));
  size_t reserved = pool_stats(pool).reserved_bytes;

  sa_assert_ok(sa_host_stream_begin_capture(s, SA_HOST_CAPTURE_GLOBAL));
  sa_assert_ok(sa_pool_alloc(pool, &tmp2, 512 * KiB, s));
  assert_ptr_equal(tmp2, tmp1); /* capture order: graph 2 replays after graph 1 */
  sa_assert_ok(sa_pool_alloc(pool, &out2, 256 * KiB, s));
  assert_false(overlap(out2, 256 * KiB, out1, 256 * KiB));
  sa_assert_ok(sa_free(tmp2, s));
  sa_assert_ok(sa_host_stream_end_capture(s));
  assert_int_equal(pool_stats(pool).reserved_bytes, reserved); /* no growth */

  sa_assert_ok(sa_free(out1, launch));
  sa_assert_ok(sa_free(out2, launch));
  sa_assert_ok(sa_pool_release(pool, launch)); /* graph 1 */
  assert_int_equal(pool_stats(pool).uses, 1);
  assert_int_equal(pool_stats(pool).reserved_bytes, reserved);
  sa_assert_ok(sa_pool_release(pool, launch)); /* graph 2: the last */
  sa_pool_stats ps = pool_stats(pool);
  assert_int_equal(ps.uses, 0);
  assert_int_equal(ps.reserved_bytes, 0);
  drop_stream(f->arena, s);
}

/* Nothing else of the arena gets a pool's memory while the pool lives:
 * allocations of every size made after the capture, on its stream and on
 * others, lie outside every segment, free parts included. */
static void ordinary_allocations_never_alias_a_live_pool(void **state) {
  sa_fixture *f = *state;
  sa_stream s = f->streams[0], t = f->streams[1];
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(f->arena, &pool));
  void *x;
  sa_assert_ok(sa_host_stream_begin_capture(s, SA_HOST_CAPTURE_GLOBAL));
  sa_assert_ok(sa_pool_alloc(pool, &x, 5 * MiB, s));
  sa_assert_ok(sa_free(x, s));
  sa_assert_ok(sa_host_stream_end_capture(s));
  static const size_t sizes[] = {256, 4096, 100 * KiB, 1 * MiB, 2 * MiB, 5 * MiB, 9 * MiB};
  void *got[2][sizeof sizes / sizeof sizes[0]];
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    sa_assert_ok(sa_alloc(f->arena, &got[0][i], sizes[i], s));
    sa_assert_ok(sa_alloc(f->arena, &got[1][i], sizes[i], t));
    assert_false(in_pool(pool, got[0][i], sizes[i]));
    assert_false(in_pool(pool, got[1][i], sizes[i]));
  }
  sa_assert_ok(sa_trim(f->arena, 0)); /* trim never touches a pool's segment */
  assert_int_equal(pool_stats(pool).reserved_bytes, pool_stats(pool).free_bytes);
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    sa_assert_ok(sa_free(got[0][i], s));
    sa_assert_ok(sa_free(got[1][i], t));
  }
  sa_assert_ok(sa_pool_release(pool, s));
}

/* ---- stream order -------------------------------------------------------- */

/* Outside a capture a pool is a stream-ordered pool: a block freed on s
 * while s's work on it is queued goes to another stream only behind a
 * wait on s's event (the checker sees any other handout). */
static void a_free_outside_a_capture_is_reused_behind_its_event(void **state) {
  sa_fixture *f = *state;
  sa_stream s = f->streams[0], t = f->streams[1];
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(f->arena, &pool));
  void *x, *y;
  sa_assert_ok(sa_pool_alloc(pool, &x, 2 * MiB, s)); /* the whole segment */
  sa_assert_ok(sa_host_fill(s, x, 2 * MiB, 0x5A5A5A5Au)); /* queued, not run */
  sa_assert_ok(sa_free(x, s));
  sa_assert_ok(sa_pool_alloc(pool, &y, 2 * MiB, t));
  sa_assert_ok(sa_host_fill(t, y, 4096, 0x77777777u));
  uint64_t bad = 0;
  sa_assert_ok(sa_host_check(t, y, 4096, 0x77777777u, &bad));
  size_t done;
  sa_assert_ok(sa_host_stream_step(t, SIZE_MAX, &done)); /* blocked behind s if it waits */
  sa_assert_ok(sa_host_stream_drain(s));
  sa_assert_ok(sa_host_stream_drain(t));
  assert_int_equal(bad, 0);
  assert_int_equal(((uint32_t *)y)[0], 0x77777777u);
  sa_assert_ok(sa_free(y, t));
  sa_assert_ok(sa_pool_release(pool, t));
}

/* The last release while a launch of the pool's graph is still queued:
 * the segments go back to the arena on the release's stream, so the next
 * owner of that memory waits for the launch (the checker and the fill
 * pattern say so), however the streams are stepped. */
static void the_last_release_waits_for_the_last_launch(void **state) {
  sa_fixture *f = *state;
  sa_stream s = fresh_stream(), launch = f->streams[0], next = f->streams[1];
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(f->arena, &pool));
  void *x;
  sa_assert_ok(sa_host_stream_begin_capture(s, SA_HOST_CAPTURE_GLOBAL));
  sa_assert_ok(sa_pool_alloc(pool, &x, 2 * MiB, s));
  sa_assert_ok(sa_free(x, s));
  sa_assert_ok(sa_host_stream_end_capture(s));
  size_t reserved = pool_stats(pool).reserved_bytes;
  assert_int_equal(reserved, 2 * MiB);
  sa_stats before;
  sa_assert_ok(sa_get_stats(f->arena, &before));

  sa_assert_ok(sa_host_fill(launch, x, 2 * MiB, 0x0BADF00Du)); /* the launch, queued */
  sa_assert_ok(sa_pool_release(pool, launch));
  assert_int_equal(pool_stats(pool).reserved_bytes, 0);
  sa_stats after;
  sa_assert_ok(sa_get_stats(f->arena, &after));
  assert_true(after.live_bytes < before.live_bytes); /* the segment went back */
  /* The arena hands the segment's memory to another stream only behind
   * the launch: next's fill runs after it, whatever is stepped first. */
  void *q = sa_fixture_take_behind(f->arena, 2 * MiB, next, launch, 0x600D600Du);
  assert_ptr_equal(q, x); /* the same memory: the case tests what it says */
  sa_assert_ok(sa_free(q, next));
  drop_stream(f->arena, s);
}

/* A pool released with a block still live (a graph's output kept): the
 * block stays valid, the pool takes no allocation, and its memory goes
 * back at that block's free, after the release's stream point. */
static void the_last_release_with_live_blocks_waits_for_their_free(void **state) {
  sa_fixture *f = *state;
  sa_stream s = f->streams[0], t = f->streams[1], next = f->streams[2];
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(f->arena, &pool));
  void *out, *q;
  sa_assert_ok(sa_pool_alloc(pool, &out, 2 * MiB, s));
  sa_assert_ok(sa_host_fill(s, out, 2 * MiB, 0x12345678u)); /* queued on s */
  sa_assert_ok(sa_pool_release(pool, s));
  sa_pool_stats ps = pool_stats(pool);
  assert_int_equal(ps.uses, 0);
  assert_int_equal(ps.live_blocks, 1);
  assert_int_equal(ps.reserved_bytes, 2 * MiB);
  sa_assert_status(sa_pool_alloc(pool, &q, 4096, s), SA_ERR_INVALID_ARGUMENT);
  assert_null(q);
  sa_assert_ok(sa_free(out, t)); /* the last block: the segment goes, on t */
  assert_int_equal(pool_stats(pool).reserved_bytes, 0);
  /* Its next owner waits for s's fill (the release's event) too. */
  q = sa_fixture_take_behind(f->arena, 2 * MiB, next, s, 0x600D600Du);
  assert_ptr_equal(q, out);
  sa_assert_ok(sa_free(q, next));
}

/* A block recorded on another stream (sa_record_stream) is reused only
 * after that stream's work at its free completed: until then it is free
 * for no one, not even its own stream (each block here a whole segment,
 * so that nothing else fits). */
static void a_recorded_block_waits_for_its_recorded_stream(void **state) {
  sa_fixture *f = *state;
  sa_stream s = f->streams[0], t = f->streams[1];
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(f->arena, &pool));
  void *x, *y, *z;
  sa_assert_ok(sa_pool_alloc(pool, &x, 2 * MiB, s));
  sa_assert_ok(sa_host_fill(t, x, 2 * MiB, 0x3C3C3C3Cu)); /* queued on t */
  sa_assert_ok(sa_record_stream(x, t));
  sa_assert_ok(sa_free(x, s));
  sa_assert_ok(sa_pool_alloc(pool, &y, 2 * MiB, s)); /* a segment of its own */
  assert_false(overlap(y, 2 * MiB, x, 2 * MiB));
  sa_assert_ok(sa_host_stream_drain(t));
  sa_assert_ok(sa_host_stream_drain(s));
  sa_assert_ok(sa_pool_alloc(pool, &z, 2 * MiB, s)); /* now it is free */
  assert_ptr_equal(z, x);
  assert_int_equal(pool_stats(pool).segments, 2);
  sa_assert_ok(sa_free(y, s));
  sa_assert_ok(sa_free(z, s));
  sa_assert_ok(sa_pool_release(pool, s));
}

/* The last block of a released pool freed during a capture: the free
 * works and leaves the capture intact; the segments cannot go back then
 * (that needs an event on the captured stream), so they stay the pool's
 * until the arena is destroyed, with no leak (the fixture's teardown). */
static void a_released_pools_last_free_in_a_capture_keeps_its_memory(void **state) {
  sa_fixture *f = *state;
  sa_stream s = f->streams[0], c = fresh_stream();
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(f->arena, &pool));
  void *x;
  sa_assert_ok(sa_pool_alloc(pool, &x, 4096, s));
  sa_assert_ok(sa_pool_release(pool, s));
  sa_assert_ok(sa_host_stream_begin_capture(c, SA_HOST_CAPTURE_GLOBAL));
  sa_assert_ok(sa_free(x, c));
  assert_capture_intact(c);
  sa_assert_ok(sa_host_stream_end_capture(c));
  sa_pool_stats ps = pool_stats(pool);
  assert_int_equal(ps.live_blocks, 0);
  assert_int_equal(ps.reserved_bytes, 2 * MiB);
  drop_stream(f->arena, c);
}

/* ---- bad input ----------------------------------------------------------- */

static void bad_input_is_refused_and_changes_nothing(void **state) {
  sa_fixture *f = *state;
  sa_stream s = f->streams[0];
  sa_pool *pool;
  void *p = (void *)1;
  sa_pool_stats ps;
  sa_assert_status(sa_pool_create(NULL, &pool), SA_ERR_INVALID_ARGUMENT);
  assert_null(pool);
  sa_assert_status(sa_pool_create(f->arena, NULL), SA_ERR_INVALID_ARGUMENT);
  sa_assert_status(sa_pool_retain(NULL), SA_ERR_INVALID_ARGUMENT);
  sa_assert_status(sa_pool_release(NULL, s), SA_ERR_INVALID_ARGUMENT);
  sa_assert_status(sa_pool_alloc(NULL, &p, 64, s), SA_ERR_INVALID_ARGUMENT);
  assert_null(p);
  sa_assert_status(sa_pool_get_stats(NULL, &ps), SA_ERR_INVALID_ARGUMENT);

  sa_assert_ok(sa_pool_create(f->arena, &pool));
  sa_assert_status(sa_pool_alloc(pool, NULL, 64, s), SA_ERR_INVALID_ARGUMENT);
  sa_assert_status(sa_pool_get_stats(pool, NULL), SA_ERR_INVALID_ARGUMENT);
  sa_assert_status(sa_pool_live(pool, NULL, NULL), SA_ERR_INVALID_ARGUMENT);
  p = (void *)1;
  sa_assert_ok(sa_pool_alloc(pool, &p, 0, s)); /* as sa_alloc: NULL, SA_OK */
  assert_null(p);
  sa_assert_status(sa_pool_alloc(pool, &p, SIZE_MAX, s), SA_ERR_OUT_OF_MEMORY);
  sa_assert_status(sa_pool_alloc(pool, &p, SIZE_MAX / 2, s), SA_ERR_OUT_OF_MEMORY);

  /* A handle that is no stream. */
  sa_stream bogus = (sa_stream)(uintptr_t)0xdead0000;
  sa_assert_status(sa_pool_alloc(pool, &p, 64, bogus), SA_ERR_UNKNOWN_STREAM);
  sa_assert_status(sa_pool_release(pool, bogus), SA_ERR_UNKNOWN_STREAM);
  ps = pool_stats(pool);
  assert_int_equal(ps.uses, 1);
  assert_int_equal(ps.live_blocks, 0);

  /* A pool block freed twice, an interior pointer, a release during a
   * capture of its stream (refused, the capture intact, the use kept). */
  void *x;
  sa_assert_ok(sa_pool_alloc(pool, &x, 4096, s));
  sa_assert_status(sa_free((char *)x + 512, s), SA_ERR_INVALID_POINTER);
  sa_assert_status(sa_record_stream((char *)x + 512, s), SA_ERR_INVALID_POINTER);
  sa_assert_ok(sa_free(x, s));
  sa_assert_status(sa_free(x, s), SA_ERR_DOUBLE_FREE);
  sa_assert_status(sa_record_stream(x, s), SA_ERR_DOUBLE_FREE);
  sa_stream c = fresh_stream();
  sa_assert_ok(sa_host_stream_begin_capture(c, SA_HOST_CAPTURE_GLOBAL));
  sa_assert_status(sa_pool_release(pool, c), SA_ERR_STREAM_CAPTURING);
  assert_capture_intact(c);
  sa_assert_ok(sa_host_stream_end_capture(c));
  assert_int_equal(pool_stats(pool).uses, 1);

  /* After the last release: every call on it refused, nothing changed. */
  sa_assert_ok(sa_pool_release(pool, s));
  sa_assert_status(sa_pool_release(pool, s), SA_ERR_INVALID_ARGUMENT);
  sa_assert_status(sa_pool_retain(pool), SA_ERR_INVALID_ARGUMENT);
  sa_assert_status(sa_pool_alloc(pool, &p, 64, s), SA_ERR_INVALID_ARGUMENT);
  assert_null(p);
  ps = pool_stats(pool);
  assert_int_equal(ps.uses, 0);
  assert_int_equal(ps.reserved_bytes, 0);
  /* x began the segment, a span the release freed: the arena names it. */
  sa_assert_status(sa_free(x, s), SA_ERR_DOUBLE_FREE);
  drop_stream(f->arena, c);
}

/* Pools not released at sa_arena_destroy go with the arena, nothing
 * leaks; their segments are no leak of the caller's, their live blocks
 * are (SA_ERR_LIVE_BLOCKS, counting them). */
static void arena_destroy_releases_pools_left(void **state) {
  (void)state;
  sa_host_counters before, after;
  sa_host_get_counters(&before);
  sa_arena *a;
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host"));
  sa_pool *p1, *p2;
  void *x;
  sa_assert_ok(sa_pool_create(a, &p1));
  sa_assert_ok(sa_pool_create(a, &p2));
  sa_assert_ok(sa_pool_alloc(p1, &x, 3 * MiB, NULL));
  sa_assert_ok(sa_pool_alloc(p2, &x, 1000, NULL));
  sa_assert_ok(sa_pool_release(p2, NULL)); /* live block: its memory stays */
  sa_fixture_stderr_begin();
  sa_assert_status(sa_arena_destroy(a), SA_ERR_LIVE_BLOCKS);
  char *said = sa_fixture_stderr_end();
  assert_non_null(strstr(said, "with 2 blocks still allocated"));
  free(said);
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host"));
  sa_assert_ok(sa_pool_create(a, &p1));
  sa_assert_ok(sa_pool_alloc(p1, &x, 3 * MiB, NULL));
  sa_assert_ok(sa_free(x, NULL));
  sa_assert_ok(sa_arena_destroy(a)); /* a pool with no live block: no leak */
  sa_host_get_counters(&after);
  assert_int_equal(after.chunks, before.chunks);
  assert_int_equal(after.events, before.events);
  assert_int_equal(after.streams, before.streams);
  assert_int_equal(after.va_ranges, before.va_ranges);
}

/* ---- live blocks and threads --------------------------------------------- */

typedef struct seen_s {
  size_t n, bytes;
} seen;

static void count_live(void *p, size_t size, sa_stream stream, void *user) {
  (void)p;
  (void)stream;
  seen *s = user;
  s->n++;
  s->bytes += size;
}

typedef struct worker_s {
  sa_pool *pool;
  sa_stream stream;
  sa_status st;
  void *kept[32];
} worker;

/* Allocates and frees on its own stream; keeps 32 blocks. */
static void *work(void *arg) {
  worker *w = arg;
  uint64_t rng = (uintptr_t)w->stream | 1;
  void *held[8] = {0};
  for (int i = 0; i < 2000 && w->st == SA_OK; i++) {
    int k = (int)sa_fixture_pick(&rng, 8);
    if (held[k] != NULL) w->st = sa_free(held[k], w->stream);
    held[k] = NULL;
    if (w->st == SA_OK)
      w->st = sa_pool_alloc(w->pool, &held[k], 512 + sa_fixture_pick(&rng, 300 * 1024), w->stream);
  }
  for (int k = 0; k < 8; k++)
    if (held[k] != NULL && w->st == SA_OK) w->st = sa_free(held[k], w->stream);
  for (int k = 0; k < 32 && w->st == SA_OK; k++)
    w->st = sa_pool_alloc(w->pool, &w->kept[k], 1000 * (size_t)(k + 1), w->stream);
  return NULL;
}

static int by_address(const void *x, const void *y) {
  uintptr_t a = *(const uintptr_t *)x, b = *(const uintptr_t *)y;
  return a < b ? -1 : a > b;
}

static void collect(void *p, size_t size, sa_stream stream, void *user) {
  (void)stream;
  uintptr_t **at = user;
  (*at)[0] = (uintptr_t)p;
  (*at)[1] = size;
  *at += 2;
}

/* Two threads allocate from and free into one pool at once; the live
 * blocks that stay are all there, apart, each where its thread put it. */
static void two_threads_share_one_pool(void **state) {
  sa_fixture *f = *state;
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(f->arena, &pool));
  worker w[2] = {{.pool = pool, .stream = f->streams[0]}, {.pool = pool, .stream = f->streams[1]}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, work, &w[i]), 0);
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
  sa_assert_ok(w[0].st);
  sa_assert_ok(w[1].st);
  seen sn = {0};
  sa_assert_ok(sa_pool_live(pool, count_live, &sn));
  assert_int_equal(sn.n, 64);
  assert_int_equal(sn.bytes, 2 * 1000 * (32 * 33 / 2));
  uintptr_t ranges[128], *at = ranges;
  sa_assert_ok(sa_pool_live(pool, collect, &at));
  qsort(ranges, 64, 2 * sizeof *ranges, by_address);
  for (int i = 1; i < 64; i++) assert_true(ranges[2 * i - 2] + ranges[2 * i - 1] <= ranges[2 * i]);
  SA_VALIDATE(sa__pool_check(pool));
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 32; k++) sa_assert_ok(sa_free(w[i].kept[k], w[i].stream));
  sa_assert_ok(sa_pool_release(pool, f->streams[0]));
}

/* ---- faults -------------------------------------------------------------- */

/* Each driver call a growth makes fails in turn (the first, second, ...
 * of its kind): the allocation fails or succeeds, the pool stays whole,
 * nothing leaks, and the next allocation works. During a capture too: a
 * failed growth never touches the captured stream. */
static void a_driver_fault_during_growth_leaves_the_pool_whole(void **state) {
  sa_fixture *f = *state;
  static const sa_host_fn fns[] = {
      SA_HOST_FN_CHUNK_CREATE,     SA_HOST_FN_MAP,        SA_HOST_FN_SET_ACCESS,
      SA_HOST_FN_STREAM_SYNCHRONIZE, SA_HOST_FN_EVENT_RECORD, SA_HOST_FN_EVENT_CREATE,
      SA_HOST_FN_STREAM_ID,        SA_HOST_FN_STREAM_VALIDATE, SA_HOST_FN_EVENT_QUERY,
  };
  sa_stream s = fresh_stream();
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(f->arena, &pool));
  size_t failures = 0;
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
    for (uint64_t nth = 1; nth <= 3; nth++) {
      sa_assert_ok(sa_host_stream_begin_capture(s, SA_HOST_CAPTURE_GLOBAL));
      sa_pool_stats before = pool_stats(pool);
      void *p;
      sa_assert_ok(sa_host_fault_inject(fns[i], nth, 0));
      sa_status st = sa_pool_alloc(pool, &p, 3 * MiB, s); /* a new segment each time */
      sa_host_fault_clear();
      assert_capture_intact(s);
      SA_VALIDATE(sa__pool_check(pool));
      sa_pool_stats after = pool_stats(pool);
      if (st != SA_OK) {
        failures++;
        assert_null(p);
        assert_int_equal(after.live_blocks, before.live_blocks);
        sa_assert_ok(sa_pool_alloc(pool, &p, 3 * MiB, s));
      }
      sa_assert_ok(sa_free(p, s));
      sa_assert_ok(sa_host_stream_end_capture(s));
      /* Outside the capture the stream's free blocks are s's own: the
       * next round grows again unless the pool had room. */
    }
  assert_true(failures > 0);
  sa_assert_ok(sa_pool_release(pool, f->streams[0]));
  drop_stream(f->arena, s);
}

/* The last release's faults: the use stays, and a retry releases. */
static void a_failed_last_release_keeps_the_use(void **state) {
  sa_fixture *f = *state;
  sa_stream s = f->streams[0], t = f->streams[1];
  static const sa_host_fn fns[] = {SA_HOST_FN_STREAM_VALIDATE, SA_HOST_FN_STREAM_WAIT_EVENT,
                                   SA_HOST_FN_EVENT_RECORD, SA_HOST_FN_STREAM_ID};
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
    sa_pool *pool;
    void *x, *y;
    sa_assert_ok(sa_pool_create(f->arena, &pool));
    sa_assert_ok(sa_pool_alloc(pool, &x, 3 * MiB, t));
    sa_assert_ok(sa_pool_alloc(pool, &y, 3 * MiB, t));
    sa_assert_ok(sa_host_fill(t, x, 4096, 1)); /* t's frees' events stay pending */
    sa_assert_ok(sa_free(x, t));
    sa_assert_ok(sa_free(y, t));
    sa_assert_ok(sa_host_fault_inject(fns[i], 1, 1));
    sa_status st = sa_pool_release(pool, s);
    sa_host_fault_clear();
    if (st != SA_OK) {
      assert_int_equal(pool_stats(pool).uses, 1);
      SA_VALIDATE(sa__pool_check(pool));
      sa_assert_ok(sa_pool_release(pool, s));
    }
    assert_int_equal(pool_stats(pool).uses, 0);
    assert_int_equal(pool_stats(pool).reserved_bytes, 0);
    sa_assert_ok(sa_host_drain_all());
  }
}

/* The oom_callback a program gives its arena may trim, which waits for the
 * device: a pool's growth, which may serve a capture, never calls it (the
 * capture would end), while sa_alloc does. Found by the fuzzer:
 * fuzz/corpus/pool-growth-oom-callback-in-capture. */
static int trimming_callback(sa_arena *a, size_t size, sa_stream s, void *user) {
  (void)size;
  (void)s;
  (*(int *)user)++;
  (void)sa_trim(a, 0);
  return 0;
}

static void a_pools_growth_calls_no_oom_callback(void **state) {
  (void)state;
  sa_config cfg;
  sa_config_init(&cfg);
  sa_assert_ok(sa_config_parse(&cfg, "backend=host,max_physical=8MiB", NULL, 0));
  int calls = 0;
  cfg.oom_callback = trimming_callback;
  cfg.oom_user_data = &calls;
  sa_arena *a;
  sa_assert_ok(sa_arena_create(&cfg, &a));
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(a, &pool));
  sa_stream s = fresh_stream();
  sa_assert_ok(sa_host_stream_begin_capture(s, SA_HOST_CAPTURE_GLOBAL));
  void *p;
  sa_assert_ok(sa_pool_alloc(pool, &p, 6 * MiB, s));
  void *more = (void *)1;
  sa_assert_status(sa_pool_alloc(pool, &more, 6 * MiB, s), SA_ERR_OUT_OF_MEMORY);
  assert_null(more);
  assert_int_equal(calls, 0);
  assert_capture_intact(s);
  sa_assert_ok(sa_host_stream_end_capture(s));
  /* An ordinary allocation out of memory (the pool holds 6 of 8 MiB)
   * calls it. */
  void *big = (void *)1;
  sa_assert_status(sa_alloc(a, &big, 4 * MiB, s), SA_ERR_OUT_OF_MEMORY);
  assert_null(big);
  assert_true(calls > 0);
  sa_assert_ok(sa_free(p, s));
  sa_assert_ok(sa_pool_release(pool, s));
  sa_assert_ok(sa_host_stream_drain(s));
  drop_stream(a, s);
  sa_assert_ok(sa_arena_destroy(a));
}

/* ---- growth in place --------------------------------------------------- */

/* A capture frees a block at its segment's top and then asks for more than
 * that block holds: the segment grows in place over the memory above it,
 * so the free block and the growth are one block at the old block's
 * address, and the pool holds what the larger request needs, not both (a
 * segment of its own would hold 96 + 160 MiB here). The replays write and
 * read all of it, and the arena counts the growth as allocated while the
 * pool lives, and nothing once it went back. */
static void a_growth_extends_a_segments_free_top_in_place(void **state) {
  sa_fixture *f = *state;
  sa_stream s = fresh_stream(), launch = f->streams[0];
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(f->arena, &pool));
  sa_assert_ok(sa_host_stream_begin_capture(s, SA_HOST_CAPTURE_GLOBAL));
  void *x, *y;
  sa_assert_ok(sa_pool_alloc(pool, &x, 96 * MiB, s));
  sa_assert_ok(sa_free(x, s)); /* in the capture: s's only */
  sa_assert_ok(sa_pool_alloc(pool, &y, 160 * MiB, s));
  assert_ptr_equal(y, x);
  sa_pool_stats ps = pool_stats(pool);
  assert_int_equal(ps.segments, 1);
  assert_true(ps.reserved_bytes >= 160 * MiB && ps.reserved_bytes < 162 * MiB);
  assert_capture_intact(s);
  sa_assert_ok(sa_host_stream_end_capture(s));
  for (uint32_t i = 0; i < 2; i++) {
    uint64_t bad = 0;
    sa_assert_ok(sa_host_fill(launch, y, 160 * MiB, 0xC0000000u + i));
    sa_assert_ok(sa_host_check(launch, y, 160 * MiB, 0xC0000000u + i, &bad));
    sa_assert_ok(sa_host_stream_drain(launch));
    assert_int_equal(bad, 0);
  }
  sa_stats as;
  sa_assert_ok(sa_get_stats(f->arena, &as));
  assert_true(as.live_bytes >= ps.reserved_bytes);
  sa_assert_ok(sa_free(y, launch));
  sa_assert_ok(sa_pool_release(pool, launch));
  sa_assert_ok(sa_host_stream_drain(launch));
  sa_assert_ok(sa_get_stats(f->arena, &as));
  assert_int_equal(as.live_bytes, 0);
  drop_stream(f->arena, s);
}

/* A pool's 8 MiB block, then an arena span of 4 MiB, then the block freed
 * and 12 MiB asked of the pool: in place (the arena's span elsewhere, the
 * one segment grown, the block where it was) or past the span right above
 * the segment (a second segment). Either way the span's contents stay. */
static void pool_grows_past_an_arena_span(sa_fixture *f, sa_stream s, bool in_place) {
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(f->arena, &pool));
  void *x, *other, *y;
  sa_assert_ok(sa_pool_alloc(pool, &x, 8 * MiB, s));
  pthread_mutex_lock(&pool->lock);
  uintptr_t top = pool->segs->span + pool->segs->span_size;
  pthread_mutex_unlock(&pool->lock);
  sa_assert_ok(sa_alloc(f->arena, &other, 4 * MiB, s));
  if (in_place)
    assert_false(overlap(other, 4 * MiB, (void *)top, 4 * MiB));
  else
    assert_int_equal((uintptr_t)other, top);
  sa_assert_ok(sa_host_fill(s, other, 4 * MiB, 0x5A5A5A5Au));
  sa_assert_ok(sa_free(x, s));
  sa_assert_ok(sa_pool_alloc(pool, &y, 12 * MiB, s));
  if (in_place) assert_ptr_equal(y, x);
  assert_false(overlap(y, 12 * MiB, other, 4 * MiB));
  assert_int_equal(pool_stats(pool).segments, in_place ? 1 : 2);
  uint64_t bad = 0;
  sa_assert_ok(sa_host_check(s, other, 4 * MiB, 0x5A5A5A5Au, &bad));
  sa_assert_ok(sa_host_stream_drain(s));
  assert_int_equal(bad, 0);
  sa_assert_ok(sa_free(y, s));
  sa_assert_ok(sa_free(other, s));
  sa_assert_ok(sa_pool_release(pool, s));
}

/* The arena's own growth leaves the room above a pool's segment alone: a
 * span the arena maps after the segment lies elsewhere, and the segment
 * grows in place into that room (a compiled model's optimizer state above
 * its CUDA graph pool's segment left the pool two segments on the H200). */
static void a_pools_segment_keeps_its_room_above_from_the_arena(void **state) {
  sa_fixture *f = *state;
  pool_grows_past_an_arena_span(f, f->streams[1], true);
}

/* Memory in use right above a segment's free top (here a span best fit
 * placed in free memory the segment was carved from): the growth cannot
 * be in place, and the pool takes a segment of its own; the block above is
 * untouched and the two segments' blocks stay apart. */
static void a_growth_past_memory_in_use_takes_a_segment_of_its_own(void **state) {
  sa_fixture *f = *state;
  sa_stream s = f->streams[1];
  /* Another stream takes spans too, so that s's free records its event
   * (a stream alone may leave it pending, which the pool's segment could
   * not use: timeline.c). */
  sa_fixture_stream_takes_a_span(f->arena, f->streams[0]);
  /* 12 MiB of free memory: the segment takes its low 8, the arena's span
   * of 4 the rest, right above it. */
  void *room;
  sa_assert_ok(sa_alloc(f->arena, &room, 12 * MiB, s));
  sa_assert_ok(sa_free(room, s));
  sa_assert_ok(sa_host_stream_drain(s));
  pool_grows_past_an_arena_span(f, s, false);
}

/* A clean free block and the stream's own free block beside it (freed in
 * a capture: the stream's only) do not merge, so that clean memory stays
 * any stream's; but where together they hold a request of that stream that
 * no single block does, they are joined instead of the pool growing. */
static void a_streams_own_and_clean_neighbours_join_before_a_growth(void **state) {
  sa_fixture *f = *state;
  sa_stream s = fresh_stream();
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(f->arena, &pool));
  void *c, *a, *b, *y;
  sa_assert_ok(sa_pool_alloc(pool, &c, 8 * MiB, s));
  sa_assert_ok(sa_free(c, s));
  sa_assert_ok(sa_pool_alloc(pool, &a, 4 * MiB, s));
  sa_assert_ok(sa_pool_alloc(pool, &b, 4 * MiB, s));
  assert_ptr_equal(a, c);
  assert_ptr_equal((char *)b, (char *)a + 4 * MiB);
  size_t reserved = pool_stats(pool).reserved_bytes;
  sa_assert_ok(sa_free(a, s));
  sa_assert_ok(sa_host_stream_drain(s)); /* a's event completes: clean at the next look */
  sa_assert_ok(sa_host_stream_begin_capture(s, SA_HOST_CAPTURE_GLOBAL));
  sa_assert_ok(sa_free(b, s)); /* s's only */
  assert_int_equal(pool_stats(pool).free_blocks, 2);
  sa_assert_ok(sa_pool_alloc(pool, &y, 8 * MiB, s));
  assert_ptr_equal(y, a);
  assert_int_equal(pool_stats(pool).reserved_bytes, reserved);
  assert_capture_intact(s);
  sa_assert_ok(sa_free(y, s));
  sa_assert_ok(sa_host_stream_end_capture(s));
  sa_assert_ok(sa_pool_release(pool, s));
  drop_stream(f->arena, s);
}

/* sa_pool_alloc_at: a block again at the address it had (a checkpoint's
 * restore), across free neighbours the stream may take; refused where a
 * byte is in use, another stream's for good, misaligned or outside. */
static void alloc_at_takes_back_a_freed_address(void **state) {
  sa_fixture *f = *state;
  sa_stream s = fresh_stream(), other = f->streams[2];
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(f->arena, &pool));
  void *c, *a, *b, *d;
  sa_assert_ok(sa_pool_alloc(pool, &c, 12 * MiB, s));
  sa_assert_ok(sa_free(c, s));
  sa_assert_ok(sa_pool_alloc(pool, &a, 4 * MiB, s));
  sa_assert_ok(sa_pool_alloc(pool, &b, 4 * MiB, s));
  sa_assert_ok(sa_pool_alloc(pool, &d, 4 * MiB, s));
  assert_ptr_equal((char *)d, (char *)a + 8 * MiB);
  sa_assert_ok(sa_free(a, s));
  sa_assert_ok(sa_host_stream_drain(s)); /* a: clean at the next look */
  sa_assert_ok(sa_host_stream_begin_capture(s, SA_HOST_CAPTURE_GLOBAL));
  sa_assert_ok(sa_free(b, s)); /* s's only */
  /* In use, misaligned, past the free range, another stream's, NULL. */
  assert_int_equal(sa_pool_alloc_at(pool, d, 4 * MiB, s), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_pool_alloc_at(pool, (char *)a + 100, 1000, s), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_pool_alloc_at(pool, a, 8 * MiB + 512, s), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_pool_alloc_at(pool, b, 4 * MiB, other), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_pool_alloc_at(NULL, a, 4 * MiB, s), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_pool_alloc_at(pool, a, 0, s), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(pool_stats(pool).live_blocks, 1);
  /* The two freed blocks, clean and s's own, as one again at a's address. */
  void *again = a;
  sa_assert_ok(sa_pool_alloc_at(pool, again, 8 * MiB, s));
  sa_pool_stats ps = pool_stats(pool);
  assert_int_equal(ps.live_blocks, 2);
  assert_int_equal(ps.live_requested, 12 * MiB);
  assert_capture_intact(s);
  sa_assert_ok(sa_free(again, s));
  sa_assert_ok(sa_free(d, s));
  sa_assert_ok(sa_host_stream_end_capture(s));
  sa_assert_ok(sa_pool_release(pool, s));
  drop_stream(f->arena, s);
}

/* ---- segments ---------------------------------------------------------- */

typedef struct segments_seen_s {
  size_t segments, bytes, live, free, pending, requested;
  bool tiled;
} segments_seen;

static void note_segment(void *base, size_t size, const sa_pool_block_info *blocks, size_t n,
                         void *user) {
  segments_seen *w = user;
  w->segments++;
  w->bytes += size;
  uintptr_t at = (uintptr_t)base;
  for (size_t i = 0; i < n; i++) {
    if ((uintptr_t)blocks[i].p != at || blocks[i].size == 0) w->tiled = false;
    at += blocks[i].size;
    if (blocks[i].state == SA_POOL_BLOCK_LIVE) {
      w->live++;
      w->requested += blocks[i].request;
    } else if (blocks[i].state == SA_POOL_BLOCK_FREE) {
      w->free++;
    } else {
      w->pending++;
    }
  }
  if (at != (uintptr_t)base + size) w->tiled = false;
}

/* sa_pool_segments: the segments' blocks tile them, in the states the
 * pool's counts give, a recorded block pending until its stream's work. */
static void segments_report_every_block_in_its_state(void **state) {
  sa_fixture *f = *state;
  sa_stream s = f->streams[1], other = f->streams[2];
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(f->arena, &pool));
  void *x, *y, *z;
  sa_assert_ok(sa_pool_alloc(pool, &x, 1000, s));
  sa_assert_ok(sa_pool_alloc(pool, &y, 5 * MiB, s));
  sa_assert_ok(sa_pool_alloc(pool, &z, 3000, s));
  sa_assert_ok(sa_record_stream(z, other));
  sa_assert_ok(sa_free(x, s));
  sa_assert_ok(sa_free(z, s)); /* pending: other's work may still use it */
  segments_seen w = {.tiled = true};
  sa_assert_ok(sa_pool_segments(pool, note_segment, &w));
  sa_pool_stats ps = pool_stats(pool);
  assert_true(w.tiled);
  assert_int_equal(w.segments, ps.segments);
  assert_int_equal(w.bytes, ps.reserved_bytes);
  assert_int_equal(w.live, 1);
  assert_int_equal(w.requested, 5 * MiB);
  assert_int_equal(w.pending, 1);
  assert_int_equal(w.free, ps.free_blocks);
  assert_int_equal(sa_pool_segments(NULL, note_segment, &w), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_pool_segments(pool, NULL, &w), SA_ERR_INVALID_ARGUMENT);
  sa_assert_ok(sa_host_stream_drain(other));
  sa_assert_ok(sa_free(y, s));
  sa_assert_ok(sa_pool_release(pool, s));
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(a_capture_on_a_new_stream_allocates_from_its_pool),
      T(a_free_in_a_capture_is_reused_by_its_stream_only),
      T(two_captures_share_one_pool),
      T(ordinary_allocations_never_alias_a_live_pool),
      T(a_free_outside_a_capture_is_reused_behind_its_event),
      T(the_last_release_waits_for_the_last_launch),
      T(the_last_release_with_live_blocks_waits_for_their_free),
      T(a_recorded_block_waits_for_its_recorded_stream),
      T(a_released_pools_last_free_in_a_capture_keeps_its_memory),
      T(bad_input_is_refused_and_changes_nothing),
      cmocka_unit_test(arena_destroy_releases_pools_left),
      T(two_threads_share_one_pool),
      T(a_driver_fault_during_growth_leaves_the_pool_whole),
      T(a_failed_last_release_keeps_the_use),
      cmocka_unit_test(a_pools_growth_calls_no_oom_callback),
      T(a_growth_extends_a_segments_free_top_in_place),
      T(a_pools_segment_keeps_its_room_above_from_the_arena),
      T(a_growth_past_memory_in_use_takes_a_segment_of_its_own),
      T(segments_report_every_block_in_its_state),
      T(a_streams_own_and_clean_neighbours_join_before_a_growth),
      T(alloc_at_takes_back_a_freed_address),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
