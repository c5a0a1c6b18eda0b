/* The stream-order checker: a handout of memory that unfinished work on
 * another stream still touches is a violation unless the receiving stream
 * is ordered after that work (directly or transitively through events). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <streamarena/host.h>

#include "driver/driver.h"
#include "fixture.h"

static sa_driver *d; /* opened for the group (fixture.h) */
static uint32_t mem[4096];
#define P ((uintptr_t)mem)

static int check_clean(void **state) {
  (void)state;
  sa_host_counters c;
  sa_host_get_counters(&c);
  return c.streams == 0 && c.events == 0 ? 0 : -1;
}

static uint64_t violations(void) {
  sa_host_counters c;
  sa_host_get_counters(&c);
  return c.order_violations;
}

static sa_stream manual(void) {
  sa_stream s = NULL;
  assert_int_equal(sa_host_stream_create(SA_HOST_MANUAL, &s), SA_OK);
  return s;
}

static sa_event event(void) {
  sa_event e = NULL;
  assert_int_equal(d->ops->event_create(d, &e), SA_OK);
  return e;
}

/* Make s wait for everything enqueued on u so far. */
static void edge(sa_stream u, sa_stream s) {
  sa_event e = event();
  assert_int_equal(d->ops->event_record(d, e, u), SA_OK);
  assert_int_equal(d->ops->stream_wait_event(d, s, e), SA_OK);
  assert_int_equal(d->ops->event_destroy(d, e), SA_OK);
}

/* Queued work outlives a destroyed stream (as cuStreamDestroy): run it first,
 * so that no test leaves work behind for the next. */
static void destroy(sa_stream s) {
  if (sa_host_stream_pending(s) != 0) assert_int_equal(sa_host_stream_drain(s), SA_OK);
  assert_int_equal(sa_host_stream_destroy(s), SA_OK);
}

static void handout_without_wait_edge_is_a_violation(void **state) {
  (void)state;
  sa_stream a = manual(), b = manual();
  uint64_t before = violations();
  assert_int_equal(sa_host_fill(a, mem, 1024, 1), SA_OK);
  assert_int_equal(d->ops->check_handout(d, P + 512, 1024, b), SA_ERR_STREAM_ORDER);
  assert_int_equal(violations(), before + 1);
  assert_int_equal(d->ops->check_handout(d, P + 512, 1024, NULL), SA_ERR_STREAM_ORDER);
  assert_int_equal(violations(), before + 2);
  destroy(a);
  destroy(b);
}

static void unfinished_check_kernel_counts_as_a_use(void **state) {
  (void)state;
  sa_stream a = manual(), b = manual();
  uint64_t bad = 0;
  assert_int_equal(sa_host_check(a, mem, 64, 0, &bad), SA_OK);
  assert_int_equal(d->ops->check_handout(d, P, 64, b), SA_ERR_STREAM_ORDER);
  destroy(a);
  destroy(b);
}

static void handout_on_the_same_stream_is_fine(void **state) {
  (void)state;
  sa_stream a = manual();
  uint64_t before = violations();
  assert_int_equal(sa_host_fill(a, mem, 1024, 1), SA_OK);
  assert_int_equal(d->ops->check_handout(d, P, 1024, a), SA_OK);
  assert_int_equal(violations(), before);
  destroy(a);
}

static void disjoint_ranges_are_fine(void **state) {
  (void)state;
  sa_stream a = manual(), b = manual();
  assert_int_equal(sa_host_fill(a, mem, 1024, 1), SA_OK);
  assert_int_equal(d->ops->check_handout(d, P + 1024, 1024, b), SA_OK); /* right after */
  assert_int_equal(d->ops->check_handout(d, P - 256, 256, b), SA_OK);   /* right before */
  assert_int_equal(d->ops->check_handout(d, P + 1020, 4, b), SA_ERR_STREAM_ORDER); /* last word */
  assert_int_equal(d->ops->check_handout(d, P, 0, b), SA_OK);           /* empty */
  destroy(a);
  destroy(b);
}

static void wait_edge_makes_the_handout_safe(void **state) {
  (void)state;
  sa_stream a = manual(), b = manual();
  uint64_t before = violations();
  assert_int_equal(sa_host_fill(a, mem, 1024, 1), SA_OK);
  edge(a, b);
  assert_int_equal(d->ops->check_handout(d, P, 1024, b), SA_OK);
  assert_int_equal(violations(), before);
  destroy(a);
  destroy(b);
}

static void handout_after_completion_is_fine(void **state) {
  (void)state;
  sa_stream a = manual(), b = manual();
  sa_event e = event();
  assert_int_equal(sa_host_fill(a, mem, 1024, 1), SA_OK);
  assert_int_equal(d->ops->event_record(d, e, a), SA_OK);
  assert_int_equal(d->ops->check_handout(d, P, 1024, b), SA_ERR_STREAM_ORDER);
  /* The allocator observes the event complete (host side): no edge needed. */
  assert_int_equal(d->ops->event_synchronize(d, e), SA_OK);
  assert_int_equal(d->ops->check_handout(d, P, 1024, b), SA_OK);
  assert_int_equal(d->ops->event_destroy(d, e), SA_OK);
  destroy(a);
  destroy(b);
}

static void edge_recorded_before_the_work_does_not_cover_it(void **state) {
  (void)state;
  sa_stream a = manual(), b = manual();
  edge(a, b); /* recorded while a had nothing */
  assert_int_equal(sa_host_fill(a, mem, 1024, 1), SA_OK);
  assert_int_equal(d->ops->check_handout(d, P, 1024, b), SA_ERR_STREAM_ORDER);
  edge(a, b); /* a fresh edge does */
  assert_int_equal(d->ops->check_handout(d, P, 1024, b), SA_OK);
  destroy(a);
  destroy(b);
}

static void edges_are_transitive_through_events(void **state) {
  (void)state;
  sa_stream a = manual(), b = manual(), c = manual();
  assert_int_equal(sa_host_fill(a, mem, 1024, 1), SA_OK);
  edge(a, b);
  edge(b, c);
  assert_int_equal(d->ops->check_handout(d, P, 1024, c), SA_OK);
  /* Work added to a after the edges is not covered. */
  assert_int_equal(sa_host_fill(a, mem, 1024, 2), SA_OK);
  assert_int_equal(d->ops->check_handout(d, P, 1024, c), SA_ERR_STREAM_ORDER);
  destroy(a);
  destroy(b);
  destroy(c);
}

static void an_edge_from_the_wrong_stream_does_not_help(void **state) {
  (void)state;
  sa_stream a = manual(), b = manual(), c = manual();
  assert_int_equal(sa_host_fill(a, mem, 1024, 1), SA_OK);
  assert_int_equal(sa_host_fill(b, mem + 1024, 1024, 1), SA_OK);
  edge(b, c);
  assert_int_equal(d->ops->check_handout(d, P, 1024, c), SA_ERR_STREAM_ORDER);
  assert_int_equal(d->ops->check_handout(d, P + 4096, 1024, c), SA_OK);
  destroy(a);
  destroy(b);
  destroy(c);
}

static void message_names_both_streams_the_block_and_the_op(void **state) {
  (void)state;
  sa_stream a = manual(), b = manual();
  assert_int_equal(sa_host_fill(a, mem, 1024, 1), SA_OK);
  FILE *log = tmpfile();
  assert_non_null(log);
  fflush(stderr);
  int saved = dup(STDERR_FILENO);
  assert_true(saved >= 0);
  assert_true(dup2(fileno(log), STDERR_FILENO) >= 0);
  sa_status st = d->ops->check_handout(d, P, 1024, b);
  fflush(stderr);
  assert_true(dup2(saved, STDERR_FILENO) >= 0);
  close(saved);
  assert_int_equal(st, SA_ERR_STREAM_ORDER);
  char text[1024] = {0}, want[64];
  rewind(log);
  size_t n = fread(text, 1, sizeof text - 1, log);
  fclose(log);
  assert_true(n > 0);
  snprintf(want, sizeof want, "%p", (void *)a);
  assert_non_null(strstr(text, want));
  snprintf(want, sizeof want, "%p", (void *)b);
  assert_non_null(strstr(text, want));
  snprintf(want, sizeof want, "%p (1024 bytes)", (void *)mem);
  assert_non_null(strstr(text, want));
  assert_non_null(strstr(text, "fill"));
  destroy(a);
  destroy(b);
}

static void kernel_reaching_unmapped_memory_is_reported_not_run(void **state) {
  (void)state;
  const size_t g = (size_t)2 << 20;
  uintptr_t va;
  sa_chunk_handle c;
  sa_stream a = manual();
  uint64_t bad = 0, before = violations();
  assert_int_equal(d->ops->va_reserve(d, g, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, g, &c), SA_OK);
  assert_int_equal(d->ops->map(d, va, g, c), SA_OK);
  assert_int_equal(d->ops->set_access(d, va, g), SA_OK);
  assert_int_equal(sa_host_fill(a, (void *)va, g, 1), SA_OK);
  assert_int_equal(sa_host_check(a, (void *)va, 64, 1, &bad), SA_OK);
  /* Unmapped (and released) while the work is queued: contract rule 4. */
  assert_int_equal(d->ops->unmap(d, va, g), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c), SA_OK);
  assert_int_equal(sa_host_stream_drain(a), SA_OK); /* must not crash */
  assert_int_equal(violations(), before + 2);
  assert_int_equal(bad, 0);
  /* Work on never-accessible memory is reported the same way. */
  assert_int_equal(sa_host_fill(a, (void *)va, 64, 1), SA_OK);
  assert_int_equal(sa_host_stream_drain(a), SA_OK);
  assert_int_equal(violations(), before + 3);
  assert_int_equal(d->ops->va_release(d, va, g), SA_OK);
  destroy(a);
}

/* cuMemUnmap does not wait for queued work (contract rule 4): unmapping
 * memory a queued kernel will touch is a violation at the unmap, even when
 * the range is mapped again (to another chunk) before the kernel runs. On a
 * GPU that kernel faults, or writes into the new chunk's memory. */
static void unmap_under_queued_work_is_a_violation_even_if_remapped(void **state) {
  (void)state;
  const size_t g = (size_t)2 << 20;
  uintptr_t va;
  sa_chunk_handle c1, c2;
  sa_stream a = manual();
  uint64_t before = violations();
  assert_int_equal(d->ops->va_reserve(d, g, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, g, &c1), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, g, &c2), SA_OK);
  assert_int_equal(d->ops->map(d, va, g, c1), SA_OK);
  assert_int_equal(d->ops->set_access(d, va, g), SA_OK);
  assert_int_equal(sa_host_fill(a, (void *)va, 4096, 7), SA_OK);
  assert_int_equal(d->ops->unmap(d, va, g), SA_OK); /* the fill is still queued */
  assert_int_equal(d->ops->map(d, va, g, c2), SA_OK);
  assert_int_equal(d->ops->set_access(d, va, g), SA_OK);
  assert_int_equal(sa_host_stream_drain(a), SA_OK);
  assert_int_equal(violations(), before + 1);
  assert_int_equal(d->ops->unmap(d, va, g), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c1), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c2), SA_OK);
  assert_int_equal(d->ops->va_release(d, va, g), SA_OK);
  destroy(a);
}

static void unknown_stream_is_rejected(void **state) {
  (void)state;
  sa_stream a = manual();
  destroy(a);
  assert_int_equal(d->ops->check_handout(d, P, 64, a), SA_ERR_UNKNOWN_STREAM);
}

#define T(f) cmocka_unit_test_teardown(f, check_clean)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(handout_without_wait_edge_is_a_violation),
      T(unfinished_check_kernel_counts_as_a_use),
      T(handout_on_the_same_stream_is_fine),
      T(disjoint_ranges_are_fine),
      T(wait_edge_makes_the_handout_safe),
      T(handout_after_completion_is_fine),
      T(edge_recorded_before_the_work_does_not_cover_it),
      T(edges_are_transitive_through_events),
      T(an_edge_from_the_wrong_stream_does_not_help),
      T(message_names_both_streams_the_block_and_the_op),
      T(kernel_reaching_unmapped_memory_is_reported_not_run),
      T(unmap_under_queued_work_is_a_violation_even_if_remapped),
      T(unknown_stream_is_rejected),
  };
  return sa_fixture_run_with_host_driver(tests, &d);
}
