/* Kept spans (keep_spans=1, large/kept.h): a span freed on its own stream
 * stays with the freeing thread's entry for that stream, and the stream's
 * next request of its size takes it back without a lock.
 *
 * Each case makes one lifetime happen on the simulator, with the
 * stream-order checker on: the entry keeps the span, and then the stream
 * asks for another size, the thread exits, the stream is released or
 * destroyed, another thread runs out of memory, a capture begins. Each
 * time the span must come back once, behind its stream's work, and never
 * to two owners: the checker flags a handout ahead of unfinished work, the
 * fixture's teardown a leak or a block counted twice.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "fixture.h"
#include "internal.h" /* SA_KEPT_UNUSED_MAX, SA_KEPT_PROBE */
#include "test/util.h"

#define SPAN (16 * MiB)

/* No memory mapped ahead: a span freed is the one free span of its size. */
static int setup(void **state) {
  return sa_fixture_cmocka_setup_with(state, "keep_spans=1,exact_growth=1", 3);
}

static int teardown(void **state) { return sa_fixture_cmocka_teardown(state); }

static sa_stats stats(sa_arena *a) {
  sa_stats st;
  sa_assert_ok(sa_get_stats(a, &st));
  return st;
}

static uint64_t calls(sa_host_fn fn) { return sa_host_call_count(fn); }

static uint64_t violations(void) {
  sa_host_counters c;
  sa_host_get_counters(&c);
  return c.order_violations;
}

/* The pair loop: after the first free, every pair of the size on the
 * stream gets the same span back from the entry, counted as the fast
 * path's, with no driver call on the stream, while the statistics say
 * what the user sees: nothing live, the span cached. */
static void a_pair_of_one_size_takes_the_kept_span_back(void **state) {
  sa_fixture *f = *state;
  sa_stream s = f->streams[0];
  void *p, *q;
  sa_assert_ok(sa_alloc(f->arena, &p, SPAN, s));
  sa_assert_ok(sa_free(p, s));
  sa_stats st = stats(f->arena);
  assert_int_equal(st.live_bytes, 0);
  assert_int_equal(st.large_spans, 0);
  assert_true(st.cached_bytes >= SPAN);
  uint64_t slow = st.alloc_count - st.fast_allocs, fast = st.fast_allocs;
  uint64_t records = calls(SA_HOST_FN_EVENT_RECORD), queries = calls(SA_HOST_FN_EVENT_QUERY);
  for (int i = 0; i < 100; i++) {
    sa_assert_ok(sa_alloc(f->arena, &q, SPAN, s));
    assert_ptr_equal(q, p);
    sa_assert_ok(sa_host_fill(s, q, 4096, (uint32_t)i)); /* queued: s orders its reuse */
    sa_assert_ok(sa_free(q, s));
  }
  st = stats(f->arena);
  assert_int_equal(st.alloc_count - st.fast_allocs, slow);
  assert_int_equal(st.fast_allocs - fast, 100);
  assert_int_equal(calls(SA_HOST_FN_EVENT_RECORD), records);
  assert_int_equal(calls(SA_HOST_FN_EVENT_QUERY), queries);
  assert_int_equal(st.live_bytes, 0);
  assert_int_equal(st.live_bytes_peak, SPAN);
  sa_assert_ok(sa_host_drain_all());
}

/* A kept span is freed already: a second free (on its stream or another)
 * and sa_record_stream are double frees, and change nothing. */
static void a_kept_span_is_freed_already(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1];
  void *p, *q;
  sa_assert_ok(sa_alloc(f->arena, &p, SPAN, a));
  sa_assert_ok(sa_free(p, a));
  sa_stats before = stats(f->arena);
  sa_assert_status(sa_free(p, a), SA_ERR_DOUBLE_FREE);
  sa_assert_status(sa_free(p, b), SA_ERR_DOUBLE_FREE);
  sa_assert_status(sa_record_stream(p, b), SA_ERR_DOUBLE_FREE);
  sa_stats after = stats(f->arena);
  assert_int_equal(after.free_count, before.free_count);
  assert_int_equal(after.cached_bytes, before.cached_bytes);
  sa_assert_ok(sa_alloc(f->arena, &q, SPAN, a));
  assert_ptr_equal(q, p);
  sa_assert_ok(sa_free(q, a));
}

/* A request of another size on the stream gives the kept span back first:
 * a best fit takes its memory, nothing grows. A free span that another
 * stream can take only behind the freeing stream's work. */
static void another_size_gives_the_kept_span_back_first(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1];
  void *p, *q, *r;
  sa_assert_ok(sa_alloc(f->arena, &p, SPAN, a));
  sa_assert_ok(sa_host_fill(a, p, 4096, 0xA0A0A0A0u));
  sa_assert_ok(sa_free(p, a));
  size_t reserved = stats(f->arena).reserved_bytes;
  sa_assert_ok(sa_alloc(f->arena, &q, SPAN / 2, a));
  assert_ptr_equal(q, p);
  assert_int_equal(stats(f->arena).reserved_bytes, reserved);
  sa_assert_ok(sa_free(q, a)); /* kept: best fit would put it back */
  sa_assert_ok(sa_alloc(f->arena, &r, SPAN, b)); /* B: not on A's orphan */
  assert_true((char *)r >= (char *)p + SPAN / 2 || (char *)r + SPAN <= (char *)p);
  uint64_t v0 = violations();
  sa_assert_ok(sa_host_fill(b, r, SPAN, 0xB0B0B0B0u));
  sa_assert_ok(sa_host_drain_all());
  assert_int_equal(violations(), v0);
  sa_assert_ok(sa_free(r, b));
}

/* Was the span just freed on s kept? Then the next request of its size on
 * s takes it on the fast path, at the same address. The request is made
 * (*out) and left to the caller. */
static bool kept(sa_arena *a, sa_stream s, void *freed, size_t size, void **out) {
  uint64_t fast = stats(a).fast_allocs;
  sa_assert_ok(sa_alloc(a, out, size, s));
  bool was_kept = stats(a).fast_allocs == fast + 1;
  if (was_kept) assert_ptr_equal(*out, freed);
  return was_kept;
}

/* Where a free and a request of the span's size would put it back in its
 * place, it is kept even with free memory above it: here the top half of
 * the span it was carved from, and no other free span (large/kept.c,
 * best_fit_puts_it_back). The next request of its size takes it without
 * the slow path. */
static void a_span_that_best_fit_would_retake_is_kept(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0];
  void *p, *q, *r;
  sa_assert_ok(sa_alloc(f->arena, &p, SPAN, a));
  sa_assert_ok(sa_free(p, a)); /* the run's one span: kept */
  sa_assert_ok(sa_alloc(f->arena, &q, SPAN / 2, a));
  assert_ptr_equal(q, p); /* carved from the span given back: its top half free */
  sa_assert_ok(sa_free(q, a));
  assert_true(kept(f->arena, a, q, SPAN / 2, &r));
  sa_assert_ok(sa_free(r, a));
}

/* Free p (of size bytes) on s: was it kept? A keep counts as a fast free. */
static bool free_kept(sa_arena *a, void *p, sa_stream s) {
  uint64_t fast = stats(a).fast_frees;
  sa_assert_ok(sa_free(p, s));
  return stats(a).fast_frees == fast + 1;
}

/* Requests of ever new sizes (RMM's random loop) give every kept span back
 * unused: after SA_KEPT_UNUSED_MAX of them the thread keeps one free in
 * SA_KEPT_PROBE (free.c, keeping_pays), and once a span is reused (a pair
 * of one size again) it keeps every one again. Each free here is one a
 * keep would take: the span carved at the base of the run's one free span. */
static void kept_spans_that_go_unused_stop_the_keeping(void **state) {
  sa_fixture *f = *state;
  sa_stream s = f->streams[0];
  void *p;
  unsigned frees = SA_KEPT_UNUSED_MAX + 2 * SA_KEPT_PROBE, nkept = 0;
  for (unsigned i = 0; i < frees; i++) {
    sa_assert_ok(sa_alloc(f->arena, &p, SPAN - i * 64 * KiB, s));
    bool k = free_kept(f->arena, p, s);
    if (i < SA_KEPT_UNUSED_MAX) assert_true(k); /* each kept until the streak */
    nkept += k;
  }
  assert_int_equal(nkept, SA_KEPT_UNUSED_MAX + 2); /* then one in SA_KEPT_PROBE */
  /* One size again: a probe keeps a span, the next request reuses it, and
   * from then on every free is kept. */
  uint64_t reuses = 0;
  for (unsigned i = 0; i < SA_KEPT_PROBE + 8; i++) {
    uint64_t fast = stats(f->arena).fast_allocs;
    sa_assert_ok(sa_alloc(f->arena, &p, SPAN, s));
    reuses += stats(f->arena).fast_allocs == fast + 1;
    bool k = free_kept(f->arena, p, s);
    if (reuses > 0) assert_true(k);
  }
  assert_true(reuses >= 8);
}

/* A call on s: the thread's entry for s becomes its last one, which a free
 * on s may keep a span in (free.c, free_generic). */
static void call_on(sa_arena *a, sa_stream s) {
  void *p;
  sa_assert_ok(sa_alloc(a, &p, 256, s));
  sa_assert_ok(sa_free(p, s));
}

/* Spans of `size` bytes allocated on s one after another: they follow each
 * other in one run (exact growth, nothing mapped ahead). */
static void alloc_in_a_row(sa_arena *a, sa_stream s, size_t size, void **p, int n) {
  for (int i = 0; i < n; i++) {
    sa_assert_ok(sa_alloc(a, &p[i], size, s));
    if (i > 0) assert_ptr_equal(p[i], (char *)p[i - 1] + size);
  }
}

/* With free memory below it, a freed span would join it and best fit
 * would carve the next request at the free memory's start: not kept. */
static void a_span_above_free_memory_is_not_kept(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1];
  void *p[3], *q;
  alloc_in_a_row(f->arena, a, SPAN / 2, p, 3);
  sa_assert_ok(sa_free(p[0], b)); /* another stream's free: never kept */
  call_on(f->arena, a);
  sa_assert_ok(sa_free(p[1], a));
  assert_false(kept(f->arena, a, p[1], SPAN / 2, &q));
  sa_assert_ok(sa_free(q, a));
  sa_assert_ok(sa_free(p[2], a));
}

/* With free memory above it, but a smaller free span elsewhere that a
 * request of its size fits: best fit would put the request there, so the
 * span is not kept where it would stand between the free memory above it
 * and its own. */
static void a_span_that_best_fit_would_place_elsewhere_is_not_kept(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1];
  void *p[5], *q;
  alloc_in_a_row(f->arena, a, SPAN / 2, p, 5);
  sa_assert_ok(sa_free(p[1], b)); /* free above p[0] */
  sa_assert_ok(sa_free(p[3], b)); /* a hole of p[0]'s size between live spans */
  call_on(f->arena, a);
  sa_assert_ok(sa_free(p[0], a));
  assert_false(kept(f->arena, a, p[0], SPAN / 2, &q));
  sa_assert_ok(sa_free(q, a));
  sa_assert_ok(sa_free(p[2], a));
  sa_assert_ok(sa_free(p[4], a));
}

/* A kept span is memory held back from every other stream: with another
 * stream holding spans, it is kept only while a growth in its place stays
 * within the soft limit, here the budget (span.c, sa__span_may_hold_back).
 * Otherwise the other stream would grow past it meanwhile. */
static int setup_budget(void **state) {
  return sa_fixture_cmocka_setup_with(state, "keep_spans=1,exact_growth=1,reserve_limit=40MiB",
                                      2);
}

static void a_span_past_the_soft_limit_is_not_kept_while_others_hold_spans(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1];
  void *p, *q, *r;
  sa_assert_ok(sa_alloc(f->arena, &p, SPAN, a));
  sa_assert_ok(sa_free(p, a));
  assert_true(kept(f->arena, a, p, SPAN, &r)); /* 16 MiB held: 16 more fit in 40 */
  sa_assert_ok(sa_alloc(f->arena, &q, SPAN, b)); /* b holds a span: 32 MiB held */
  call_on(f->arena, a);
  sa_assert_ok(sa_free(r, a));
  assert_false(kept(f->arena, a, r, SPAN, &p)); /* 32 MiB held: 16 more would pass 40 */
  sa_assert_ok(sa_free(p, a));
  sa_assert_ok(sa_free(q, b));
}

/* A kept span lives only while its thread stays on the fast paths: the
 * thread's next slow-path call gives it back (sa__tentry_get), here a small
 * block's refill on the same stream, so the next request of the span's size
 * is a slow one, served from the tier's free memory. */
static void a_slow_path_call_gives_the_kept_span_back(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0];
  void *p, *x, *q;
  sa_assert_ok(sa_alloc(f->arena, &p, SPAN, a));
  sa_assert_ok(sa_host_fill(a, p, 4096, 0xC0C0C0C0u));
  sa_assert_ok(sa_free(p, a)); /* kept */
  sa_assert_ok(sa_alloc(f->arena, &x, 4096, a)); /* the bin is empty: a refill */
  uint64_t fast = stats(f->arena).fast_allocs;
  sa_assert_ok(sa_alloc(f->arena, &q, SPAN, a));
  assert_int_equal(stats(f->arena).fast_allocs, fast);
  sa_assert_ok(sa_free(q, a));
  sa_assert_ok(sa_free(x, a));
}

/* A thread that keeps a span in one arena, then calls into another, and
 * comes back with a request of another size: the span goes back at that
 * call, as at any slow path (its entry was not the thread's last one, the
 * other arena's was), before best fit looks for memory. */
static void a_call_back_from_another_arena_gives_the_kept_span_back(void **state) {
  sa_fixture *f = *state;
  sa_stream s = f->streams[0];
  sa_arena *other = NULL;
  sa_assert_ok(sa_fixture_arena_create(&other, "backend=host,keep_spans=1"));
  void *p, *x, *q;
  sa_assert_ok(sa_alloc(f->arena, &p, SPAN, s));
  sa_assert_ok(sa_free(p, s)); /* kept */
  sa_assert_ok(sa_alloc(other, &x, 4096, s));
  sa_assert_ok(sa_alloc(f->arena, &q, SPAN / 2, s));
  assert_ptr_equal(q, p); /* best fit found the span given back */
  sa_assert_ok(sa_free(q, s));
  sa_assert_ok(sa_free(x, s));
  sa_assert_ok(sa_stream_release(other, s));
  sa_assert_ok(sa_arena_destroy(other));
}

/* The same from a call naming another stream: the span becomes an orphan
 * (no driver call may name its stream here), freed with its mark at its
 * stream's next slow call of any size, and another stream gets its memory
 * only behind the work queued on it before the free (the checker counts a
 * violation). */
static void a_slow_path_on_another_stream_orphans_the_kept_span(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1];
  void *p, *x, *y, *q, *r;
  sa_assert_ok(sa_alloc(f->arena, &p, SPAN, a));
  sa_assert_ok(sa_host_fill(a, p, SPAN, 0xD0D0D0D0u));
  sa_assert_ok(sa_free(p, a)); /* kept */
  sa_assert_ok(sa_alloc(f->arena, &x, 4096, b)); /* b's slow path: an orphan now */
  sa_assert_ok(sa_alloc(f->arena, &y, 4096, a));  /* a's next call frees it, marked */
  uint64_t fast = stats(f->arena).fast_allocs;
  sa_assert_ok(sa_alloc(f->arena, &q, SPAN, a)); /* so no entry keeps it */
  assert_int_equal(stats(f->arena).fast_allocs, fast);
  assert_ptr_equal(q, p); /* best fit hands the place back on a */
  sa_assert_ok(sa_alloc(f->arena, &r, SPAN / 2, b));
  uint64_t v0 = violations();
  sa_assert_ok(sa_host_fill(b, r, SPAN / 2, 0xE0E0E0E0u));
  sa_assert_ok(sa_host_drain_all());
  assert_int_equal(violations(), v0);
  sa_assert_ok(sa_free(r, b));
  sa_assert_ok(sa_free(q, a));
  sa_assert_ok(sa_free(y, a));
  sa_assert_ok(sa_free(x, b));
}

/* sa_trim gives everything back, the calling thread's kept spans on every
 * stream too: nothing stays reserved. */
static void trim_gives_kept_spans_back(void **state) {
  sa_fixture *f = *state;
  void *p[3];
  for (size_t i = 0; i < 3; i++) {
    sa_assert_ok(sa_alloc(f->arena, &p[i], SPAN, f->streams[i]));
    sa_assert_ok(sa_host_fill(f->streams[i], p[i], 4096, (uint32_t)i));
  }
  for (size_t i = 0; i < 3; i++) sa_assert_ok(sa_free(p[i], f->streams[i]));
  assert_true(stats(f->arena).cached_bytes >= 3 * SPAN);
  sa_assert_ok(sa_trim(f->arena, 0));
  sa_stats st = stats(f->arena);
  assert_int_equal(st.reserved_bytes, 0);
  assert_int_equal(st.cached_bytes, 0);
  for (size_t i = 0; i < 3; i++) assert_int_equal(sa_host_stream_pending(f->streams[i]), 0);
}

/* ---- other threads ---------------------------------------------------------- */

typedef struct {
  sa_arena *arena;
  sa_stream s, then; /* then: the stream of its allocation after go */
  size_t size;
  void *p;
  pthread_barrier_t *kept, *go; /* NULL: the thread exits at once */
  sa_status after;              /* its allocation after go */
} keeper;

/* Allocate, queue a fill, free on s (kept), then wait or exit. */
static void *keep_one(void *arg) {
  keeper *k = arg;
  if (sa_alloc(k->arena, &k->p, k->size, k->s) != SA_OK) return (void *)1;
  if (sa_host_fill(k->s, k->p, 4096, 0x4B4B4B4Bu) != SA_OK) return (void *)1;
  if (sa_free(k->p, k->s) != SA_OK) return (void *)1;
  if (k->kept == NULL) return NULL;
  pthread_barrier_wait(k->kept);
  pthread_barrier_wait(k->go);
  void *q;
  k->after = sa_alloc(k->arena, &q, k->size, k->then);
  if (k->after == SA_OK && sa_free(q, k->then) != SA_OK) return (void *)1;
  return NULL;
}

static void run_to_exit(keeper *k) {
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, keep_one, k), 0);
  void *ret = (void *)2;
  assert_int_equal(pthread_join(t, &ret), 0);
  assert_null(ret);
}

/* Another thread's kept span still counts in live_bytes, as its pairs
 * publish nothing (streamarena.h, sa_get_stats): within the documented
 * lag, and exact again once the thread published (its exit). */
static void another_threads_kept_span_counts_live_until_it_publishes(void **state) {
  sa_fixture *f = *state;
  pthread_barrier_t kept, go;
  assert_int_equal(pthread_barrier_init(&kept, NULL, 2), 0);
  assert_int_equal(pthread_barrier_init(&go, NULL, 2), 0);
  keeper k = {.arena = f->arena,
              .s = f->streams[0],
              .then = f->streams[0],
              .size = SPAN,
              .kept = &kept,
              .go = &go};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, keep_one, &k), 0);
  pthread_barrier_wait(&kept);
  sa_stats st = stats(f->arena);
  assert_int_equal(st.live_bytes, SPAN);
  assert_int_equal(st.large_spans, 0); /* freed, all the same */
  pthread_barrier_wait(&go);
  void *ret = (void *)2;
  assert_int_equal(pthread_join(t, &ret), 0);
  assert_null(ret);
  sa_assert_ok(k.after);
  assert_int_equal(stats(f->arena).live_bytes, 0);
  assert_int_equal(pthread_barrier_destroy(&kept), 0);
  assert_int_equal(pthread_barrier_destroy(&go), 0);
}

/* A thread exits with a span kept on A: nobody may record on A for it (A
 * may be destroyed), so it waits for A's next call. Until then B cannot
 * have it; after, B gets it behind A's fill. */
static void a_thread_that_exits_leaves_its_span_to_the_streams_next_call(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1];
  keeper k = {.arena = f->arena, .s = a, .size = SPAN};
  uint64_t records = calls(SA_HOST_FN_EVENT_RECORD);
  run_to_exit(&k);
  assert_int_equal(calls(SA_HOST_FN_EVENT_RECORD), records); /* not at the exit */
  assert_true(sa_host_stream_pending(a) > 0);
  assert_int_equal(stats(f->arena).large_spans, 0);
  void *q, *small, *r;
  sa_assert_ok(sa_alloc(f->arena, &q, SPAN, b));
  assert_ptr_not_equal(q, k.p);
  sa_assert_ok(sa_alloc(f->arena, &small, 64, a)); /* names A: the span is freed, marked */
  assert_int_equal(calls(SA_HOST_FN_EVENT_RECORD), records + 1);
  sa_assert_ok(sa_alloc(f->arena, &r, SPAN, b));
  assert_ptr_equal(r, k.p); /* behind a wait for A's fill */
  uint64_t v0 = violations(), mism = 0;
  sa_assert_ok(sa_host_fill(b, r, 4096, 0xB1B1B1B1u));
  sa_assert_ok(sa_host_check(b, r, 4096, 0xB1B1B1B1u, &mism));
  sa_assert_ok(sa_host_drain_all());
  assert_int_equal(violations(), v0);
  assert_int_equal(mism, 0);
  sa_assert_ok(sa_free(small, a));
  sa_assert_ok(sa_free(q, b));
  sa_assert_ok(sa_free(r, b));
}

/* sa_stream_release of A while another thread keeps a span on A: released,
 * A's work is done, and the span is free for every stream at once. */
static void a_released_stream_takes_back_what_threads_kept(void **state) {
  sa_fixture *f = *state;
  sa_stream a, b = f->streams[1];
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &a));
  pthread_barrier_t kept, go;
  assert_int_equal(pthread_barrier_init(&kept, NULL, 2), 0);
  assert_int_equal(pthread_barrier_init(&go, NULL, 2), 0);
  keeper k = {.arena = f->arena, .s = a, .then = b, .size = SPAN, .kept = &kept, .go = &go};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, keep_one, &k), 0);
  pthread_barrier_wait(&kept);
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_stream_release(f->arena, a));
  sa_assert_ok(sa_host_stream_destroy(a));
  void *q;
  sa_assert_ok(sa_alloc(f->arena, &q, SPAN, b));
  assert_ptr_equal(q, k.p);
  /* The keeper goes on, on B, while q is live: another span. */
  pthread_barrier_wait(&go);
  void *ret = (void *)2;
  assert_int_equal(pthread_join(t, &ret), 0);
  assert_null(ret);
  sa_assert_ok(k.after);
  sa_assert_ok(sa_free(q, b));
  assert_int_equal(pthread_barrier_destroy(&kept), 0);
  assert_int_equal(pthread_barrier_destroy(&go), 0);
}

/* A thread exits keeping a span on A; A is drained and destroyed without a
 * release, as the header allows after a synchronize. The span comes back
 * by a device-wide synchronize (sa_trim's): nothing stays reserved. */
static void a_destroyed_stream_leaves_its_span_to_a_synchronize(void **state) {
  sa_fixture *f = *state;
  sa_stream a;
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &a));
  keeper k = {.arena = f->arena, .s = a, .size = SPAN};
  run_to_exit(&k);
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_host_stream_destroy(a));
  uint64_t v0 = violations();
  sa_assert_ok(sa_trim(f->arena, 0));
  assert_int_equal(violations(), v0); /* no driver call on the destroyed stream */
  sa_stats st = stats(f->arena);
  assert_int_equal(st.reserved_bytes, 0);
  assert_int_equal(st.large_spans, 0);
}

/* First use of a handle in another thread (the arena compares stream ids). */
static void *use_once(void *arg) {
  keeper *k = arg;
  void *p;
  if (sa_alloc(k->arena, &p, 64, k->s) != SA_OK || sa_free(p, k->s) != SA_OK) return (void *)1;
  return NULL;
}

/* A is drained and destroyed unreleased; A2 gets its handle. This thread
 * used A, so it goes on with A's state on A2 (the header's handle rule):
 * its kept span comes back on A2 and A2's fill is queued on it. Another
 * thread then finds A's stream arena gone, and it is, but not done: the
 * span must wait for A2's work (a device-wide synchronize), not go free
 * unmarked to B. */
static void a_reused_handle_keeps_the_new_streams_work_on_a_kept_span(void **state) {
  sa_fixture *f = *state;
  sa_stream a, a2, b = f->streams[1];
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &a));
  void *p, *q, *r, *x;
  sa_assert_ok(sa_alloc(f->arena, &p, SPAN, a));
  sa_assert_ok(sa_free(p, a)); /* kept */
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_host_stream_destroy(a));
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &a2));
  assert_ptr_equal(a2, a); /* the simulator hands the handle out again, as CUDA does */
  sa_assert_ok(sa_alloc(f->arena, &q, SPAN, a2)); /* the kept span, on A2 now */
  assert_ptr_equal(q, p);
  sa_assert_ok(sa_host_fill(a2, q, SPAN, 0xA2A2A2A2u)); /* queued: A2 is manual */
  sa_assert_ok(sa_free(q, a2)); /* kept again, by A's state */
  keeper k = {.arena = f->arena, .s = a2};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, use_once, &k), 0);
  void *ret = (void *)2;
  assert_int_equal(pthread_join(t, &ret), 0);
  assert_null(ret);
  uint64_t v0 = violations();
  sa_assert_ok(sa_alloc(f->arena, &x, 64, b)); /* gives the kept span back, unnamed */
  sa_assert_ok(sa_alloc(f->arena, &r, SPAN, b));
  assert_int_equal(violations(), v0);
  assert_true(sa_host_stream_pending(a2) > 0);
  sa_assert_ok(sa_host_drain_all());
  assert_int_equal(violations(), v0);
  sa_assert_ok(sa_free(r, b));
  sa_assert_ok(sa_free(x, b));
  sa_assert_ok(sa_stream_release(f->arena, a2));
  sa_assert_ok(sa_host_stream_destroy(a2));
}

/* Another thread keeps a span that this thread needs to fit under the
 * arena's cap: the out-of-memory pass takes it back after its device-wide
 * synchronize, and the keeper, asking again, finds its entry empty. */
static void out_of_memory_takes_back_other_threads_kept_spans(void **state) {
  (void)state;
  sa_fixture f;
  sa_assert_ok(sa_fixture_setup(&f, "keep_spans=1,exact_growth=1,max_physical=48MiB", 2,
                                SA_HOST_AUTO));
  pthread_barrier_t kept, go;
  assert_int_equal(pthread_barrier_init(&kept, NULL, 2), 0);
  assert_int_equal(pthread_barrier_init(&go, NULL, 2), 0);
  keeper k = {.arena = f.arena,
              .s = f.streams[0],
              .then = f.streams[0],
              .size = 40 * MiB,
              .kept = &kept,
              .go = &go};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, keep_one, &k), 0);
  pthread_barrier_wait(&kept);
  void *q;
  sa_assert_ok(sa_alloc(f.arena, &q, 40 * MiB, f.streams[1]));
  assert_ptr_equal(q, k.p);
  pthread_barrier_wait(&go); /* the keeper asks again while q is live */
  void *ret = (void *)2;
  assert_int_equal(pthread_join(t, &ret), 0);
  assert_null(ret);
  assert_int_equal(k.after, SA_ERR_OUT_OF_MEMORY);
  sa_assert_ok(sa_free(q, f.streams[1]));
  assert_int_equal(pthread_barrier_destroy(&kept), 0);
  assert_int_equal(pthread_barrier_destroy(&go), 0);
  sa_assert_ok(sa_fixture_teardown(&f));
}

/* ---- captures ---------------------------------------------------------------- */

/* A span's free during a capture of its stream is refused, as without
 * keep_spans (its memory would be handed out again before the graph ran),
 * and the capture stays intact; the span stays live, freed after. */
static void a_free_during_a_capture_is_refused(void **state) {
  sa_fixture *f = *state;
  sa_stream s = f->streams[0];
  void *p;
  sa_assert_ok(sa_alloc(f->arena, &p, SPAN, s));
  sa_assert_ok(sa_host_stream_begin_capture(s, SA_HOST_CAPTURE_GLOBAL));
  sa_assert_status(sa_free(p, s), SA_ERR_STREAM_CAPTURING);
  sa_assert_ok(sa_host_stream_end_capture(s));
  assert_int_equal(stats(f->arena).large_spans, 1);
  sa_assert_ok(sa_free(p, s));
  assert_int_equal(stats(f->arena).large_spans, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(a_pair_of_one_size_takes_the_kept_span_back, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_kept_span_is_freed_already, setup, teardown),
      cmocka_unit_test_setup_teardown(another_size_gives_the_kept_span_back_first, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(kept_spans_that_go_unused_stop_the_keeping, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_span_that_best_fit_would_retake_is_kept, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_span_above_free_memory_is_not_kept, setup, teardown),
      cmocka_unit_test_setup_teardown(a_span_that_best_fit_would_place_elsewhere_is_not_kept,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(
          a_span_past_the_soft_limit_is_not_kept_while_others_hold_spans, setup_budget,
          teardown),
      cmocka_unit_test_setup_teardown(a_slow_path_call_gives_the_kept_span_back, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_call_back_from_another_arena_gives_the_kept_span_back,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(a_slow_path_on_another_stream_orphans_the_kept_span,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(trim_gives_kept_spans_back, setup, teardown),
      cmocka_unit_test_setup_teardown(
          a_thread_that_exits_leaves_its_span_to_the_streams_next_call, setup, teardown),
      cmocka_unit_test_setup_teardown(another_threads_kept_span_counts_live_until_it_publishes,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(a_released_stream_takes_back_what_threads_kept, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_reused_handle_keeps_the_new_streams_work_on_a_kept_span,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(a_destroyed_stream_leaves_its_span_to_a_synchronize,
                                      setup, teardown),
      cmocka_unit_test(out_of_memory_takes_back_other_threads_kept_spans),
      cmocka_unit_test_setup_teardown(a_free_during_a_capture_is_refused, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
