/* Contract section 1 on the host simulator, with streams the test steps by
 * hand: a block freed on one stream reaches another only behind an event
 * that completed or a wait edge, record_stream delays reuse, and reuse on
 * the same stream is immediate. Each test runs the streams in an
 * adversarial order (the consumer first), so an early handout shows up as a
 * clobbered pattern, and the stream-order checker is on as well.
 */
#include <setjmp.h>
#include <stdbool.h>
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

static sa_arena *make_arena(const char *spec) {
  sa_config cfg;
  sa_config_init(&cfg);
  assert_int_equal(sa_config_parse(&cfg, "backend=host,check_stream_order=1", NULL, 0), SA_OK);
  if (spec != NULL) assert_int_equal(sa_config_parse(&cfg, spec, NULL, 0), SA_OK);
  sa_arena *a = NULL;
  assert_int_equal(sa_arena_create(&cfg, &a), SA_OK);
  return a;
}

static sa_stream make_stream(sa_host_mode mode) {
  sa_stream s = NULL;
  assert_int_equal(sa_host_stream_create(mode, &s), SA_OK);
  return s;
}

static uint64_t violations(void) {
  sa_host_counters c;
  sa_host_get_counters(&c);
  return c.order_violations;
}

static void destroy_clean(sa_arena *a) {
  assert_int_equal(sa_arena_destroy(a), SA_OK);
  sa_host_counters c;
  sa_host_get_counters(&c);
  assert_int_equal(c.chunks, 0);
  assert_int_equal(c.mappings, 0);
  assert_int_equal(c.va_ranges, 0);
}

/* Contract 1.2: a block freed on A with A's work still pending is handed to
 * B only behind a wait edge. A small physical cap forces the reuse. Stream
 * B is run first; A's late fill must not clobber B's pattern. */
static void cross_stream_reuse_waits_for_event(size_t block) {
  char spec[96];
  snprintf(spec, sizeof spec, "max_physical=%zu", (size_t)8 * MiB);
  sa_arena *a = make_arena(spec);
  sa_stream A = make_stream(SA_HOST_MANUAL), B = make_stream(SA_HOST_MANUAL);
  enum { N = 256 }; /* more than the cap holds: A takes all of it */
  void *pa[N], *pb[N];
  size_t n = 0;
  while (n < N && sa_alloc(a, &pa[n], block, A) == SA_OK) {
    assert_int_equal(sa_host_fill(A, pa[n], block, 0xAAAAAAAAu), SA_OK);
    n++;
  }
  assert_true(n >= 2 && n < N);
  for (size_t i = 0; i < n; i++) assert_int_equal(sa_free(pa[i], A), SA_OK);
  /* B takes half of it: there is no other memory. This thread's cache for
   * A keeps at most 1 MiB of a class, which goes back without an event on
   * A, only after a device-wide synchronize (B's work would run then); the
   * rest went back in calls on A, behind an event there. */
  n = (n + 1) / 2;
  uint64_t mism = 0;
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(sa_alloc(a, &pb[i], block, B), SA_OK);
    assert_int_equal(sa_host_fill(B, pb[i], block, 0xBBBBBBBBu), SA_OK);
  }
  for (size_t i = 0; i < n; i++)
    assert_int_equal(sa_host_check(B, pb[i], block, 0xBBBBBBBBu, &mism), SA_OK);
  /* Adversarial order: B as far as it can go, then A, then the rest of B. */
  size_t done = 0;
  assert_int_equal(sa_host_stream_step(B, SIZE_MAX, &done), SA_OK);
  assert_true(sa_host_stream_pending(B) > 0); /* B waits for A's event */
  assert_int_equal(sa_host_stream_drain(A), SA_OK);
  assert_int_equal(sa_host_stream_drain(B), SA_OK);
  assert_int_equal(mism, 0);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(((uint32_t *)pb[i])[0], 0xBBBBBBBBu);
    assert_int_equal(sa_free(pb[i], B), SA_OK);
  }
  (void)pa;
  assert_int_equal(violations(), 0);
  assert_int_equal(sa_stream_release(a, A), SA_OK);
  assert_int_equal(sa_stream_release(a, B), SA_OK);
  destroy_clean(a);
  assert_int_equal(sa_host_stream_destroy(A), SA_OK);
  assert_int_equal(sa_host_stream_destroy(B), SA_OK);
}

static void cross_stream_small_blocks_wait_for_event(void **state) {
  (void)state;
  cross_stream_reuse_waits_for_event(64 * 1024);
}

static void cross_stream_large_spans_wait_for_event(void **state) {
  (void)state;
  cross_stream_reuse_waits_for_event(3 * MiB);
}

/* Blocks allocated on A are used by other stream U, then either freed on U
 * or (record) declared used on U and freed on A. A allocates the whole cap
 * again: it gets its memory back only behind U's work, which runs last. */
static void reuse_waits_for_user_stream(bool record) {
  sa_arena *a = make_arena("max_physical=4MiB");
  sa_stream A = make_stream(SA_HOST_MANUAL), U = make_stream(SA_HOST_MANUAL);
  size_t block = 512 * 1024;
  void *p[8];
  size_t n = 0;
  while (n < 8 && sa_alloc(a, &p[n], block, A) == SA_OK) n++;
  assert_true(n >= 4);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(sa_host_fill(U, p[i], block, 0xB0B0B0B0u), SA_OK); /* U uses them */
    if (record) assert_int_equal(sa_record_stream(p[i], U), SA_OK);
    assert_int_equal(sa_free(p[i], record ? A : U), SA_OK);
  }
  assert_int_equal(sa_record_stream(p[0], U), SA_ERR_DOUBLE_FREE);
  uint64_t mism = 0;
  void *q[8];
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(sa_alloc(a, &q[i], block, A), SA_OK);
    assert_int_equal(sa_host_fill(A, q[i], block, 0xA0A0A0A0u), SA_OK);
    assert_int_equal(sa_host_check(A, q[i], block, 0xA0A0A0A0u, &mism), SA_OK);
  }
  size_t done;
  assert_int_equal(sa_host_stream_step(A, SIZE_MAX, &done), SA_OK);
  assert_int_equal(sa_host_stream_drain(U), SA_OK);
  assert_int_equal(sa_host_stream_drain(A), SA_OK);
  assert_int_equal(mism, 0);
  assert_int_equal(violations(), 0);
  for (size_t i = 0; i < n; i++) assert_int_equal(sa_free(q[i], A), SA_OK);
  assert_int_equal(sa_stream_release(a, A), SA_OK);
  assert_int_equal(sa_stream_release(a, U), SA_OK);
  destroy_clean(a);
  assert_int_equal(sa_host_stream_destroy(A), SA_OK);
  assert_int_equal(sa_host_stream_destroy(U), SA_OK);
}

static void free_on_other_stream_defers_reuse(void **state) {
  (void)state;
  reuse_waits_for_user_stream(false);
}

static void record_stream_delays_reuse(void **state) {
  (void)state;
  reuse_waits_for_user_stream(true);
}

/* Two spans freed on A one after the other, A's work done up to the first
 * free only: B gets the first without waiting (a query saw its event
 * complete), but that says nothing of A's later work, so B gets the second
 * only behind a wait edge. Run adversarially (B first), A's late fill of
 * the second must not clobber B's pattern. */
static void a_completed_free_does_not_vouch_for_a_later_one(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  sa_stream A = make_stream(SA_HOST_MANUAL), B = make_stream(SA_HOST_MANUAL);
  void *x, *y, *sep[2], *b_span;
  /* B takes spans too: A's frees record their events (a stream alone in
   * its arena may leave them pending: timeline.c). */
  assert_int_equal(sa_alloc(a, &b_span, 2 * MiB, B), SA_OK);
  assert_int_equal(sa_alloc(a, &x, 4 * MiB, A), SA_OK);
  assert_int_equal(sa_alloc(a, &sep[0], 2 * MiB, A), SA_OK); /* x and y stay apart */
  assert_int_equal(sa_alloc(a, &y, 8 * MiB, A), SA_OK);
  assert_int_equal(sa_alloc(a, &sep[1], 2 * MiB, A), SA_OK);
  assert_int_equal(sa_host_stream_drain(A), SA_OK);
  assert_int_equal(sa_host_fill(A, x, 4 * MiB, 0xAAAAAAAAu), SA_OK);
  assert_int_equal(sa_free(x, A), SA_OK);
  size_t upto_x = sa_host_stream_pending(A); /* x's fill and its free's event */
  assert_int_equal(sa_host_fill(A, y, 8 * MiB, 0xAAAAAAAAu), SA_OK);
  assert_int_equal(sa_free(y, A), SA_OK);
  size_t done = 0;
  assert_int_equal(sa_host_stream_step(A, upto_x, &done), SA_OK);
  assert_int_equal(done, upto_x);
  assert_true(sa_host_stream_pending(A) > 0); /* y's fill is still queued */
  uint64_t v0 = violations(), mism = 0;
  void *bx, *by;
  assert_int_equal(sa_alloc(a, &bx, 4 * MiB, B), SA_OK);
  assert_ptr_equal(bx, x);
  assert_int_equal(sa_alloc(a, &by, 8 * MiB, B), SA_OK);
  assert_ptr_equal(by, y);
  assert_int_equal(sa_host_fill(B, by, 8 * MiB, 0xBBBBBBBBu), SA_OK);
  assert_int_equal(sa_host_check(B, by, 8 * MiB, 0xBBBBBBBBu, &mism), SA_OK);
  assert_int_equal(sa_host_stream_step(B, SIZE_MAX, &done), SA_OK);
  assert_true(sa_host_stream_pending(B) > 0); /* B waits for A's event */
  assert_int_equal(sa_host_stream_drain(A), SA_OK);
  assert_int_equal(sa_host_stream_drain(B), SA_OK);
  assert_int_equal(mism, 0);
  assert_int_equal(((uint32_t *)by)[0], 0xBBBBBBBBu);
  assert_int_equal(violations(), v0);
  assert_int_equal(sa_free(bx, B), SA_OK);
  assert_int_equal(sa_free(by, B), SA_OK);
  assert_int_equal(sa_free(b_span, B), SA_OK);
  for (int i = 0; i < 2; i++) assert_int_equal(sa_free(sep[i], A), SA_OK);
  assert_int_equal(sa_stream_release(a, A), SA_OK);
  assert_int_equal(sa_stream_release(a, B), SA_OK);
  destroy_clean(a);
  assert_int_equal(sa_host_stream_destroy(A), SA_OK);
  assert_int_equal(sa_host_stream_destroy(B), SA_OK);
}

/* A block of A freed on B joins B's open cross-stream batch, which B's
 * next call that misses the thread cache sends on to A behind an event
 * recorded on B. A takes the block back only after B's work: a 512 KiB
 * class holds two blocks a bin, so A's next allocation refills from its
 * stream arena, which has the batch in its inbox. Run adversarially (A
 * first), B's late fill must not clobber A's pattern. Only a threaded
 * stress test caught a batch sent on without its event. */
static void a_cross_stream_batch_goes_on_behind_an_event(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  sa_stream A = make_stream(SA_HOST_MANUAL), B = make_stream(SA_HOST_MANUAL);
  const size_t size = 512 * 1024;
  void *p, *r;
  assert_int_equal(sa_alloc(a, &p, size, A), SA_OK);
  assert_int_equal(sa_host_stream_drain(A), SA_OK);
  assert_int_equal(sa_host_fill(B, p, 4096, 0xBBBBBBBBu), SA_OK); /* B's use, queued */
  assert_int_equal(sa_free(p, B), SA_OK);                         /* into B's open batch */
  assert_int_equal(sa_alloc(a, &r, 4096, B), SA_OK);              /* sends the batch on */
  void *q = sa_fixture_take_behind(a, size, A, B, 0xAAAAAAAAu);
  assert_int_equal(sa_free(q, A), SA_OK);
  assert_int_equal(sa_free(r, B), SA_OK);
  assert_int_equal(sa_stream_release(a, A), SA_OK);
  assert_int_equal(sa_stream_release(a, B), SA_OK);
  destroy_clean(a);
  assert_int_equal(sa_host_stream_destroy(A), SA_OK);
  assert_int_equal(sa_host_stream_destroy(B), SA_OK);
}

/* Same stream: a freed block may be handed out again at once. */
static void same_stream_reuse_is_immediate(void **state) {
  (void)state;
  sa_arena *a = make_arena(NULL);
  sa_stream A = make_stream(SA_HOST_MANUAL);
  void *p, *q;
  assert_int_equal(sa_alloc(a, &p, 4096, A), SA_OK);
  assert_int_equal(sa_host_fill(A, p, 4096, 1), SA_OK);
  assert_int_equal(sa_free(p, A), SA_OK);
  assert_int_equal(sa_alloc(a, &q, 4096, A), SA_OK);
  assert_ptr_equal(p, q);
  uint64_t mism = 0;
  assert_int_equal(sa_host_fill(A, q, 4096, 2), SA_OK);
  assert_int_equal(sa_host_check(A, q, 4096, 2, &mism), SA_OK);
  assert_int_equal(sa_host_stream_drain(A), SA_OK);
  assert_int_equal(mism, 0);
  assert_int_equal(sa_free(q, A), SA_OK);
  assert_int_equal(sa_stream_release(a, A), SA_OK);
  destroy_clean(a);
  assert_int_equal(sa_host_stream_destroy(A), SA_OK);
}


int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(same_stream_reuse_is_immediate),
      cmocka_unit_test(cross_stream_small_blocks_wait_for_event),
      cmocka_unit_test(cross_stream_large_spans_wait_for_event),
      cmocka_unit_test(free_on_other_stream_defers_reuse),
      cmocka_unit_test(record_stream_delays_reuse),
      cmocka_unit_test(a_completed_free_does_not_vouch_for_a_later_one),
      cmocka_unit_test(a_cross_stream_batch_goes_on_behind_an_event),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
