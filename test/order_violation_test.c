/* The stream-order checker (check_stream_order=1) catches, loudly, memory
 * handed to a stream while unfinished work on another stream still uses it:
 * through the allocator when the caller breaks the contract, and through
 * the driver interface when a violation is built by hand. Its report must
 * name the block and both streams.
 *
 * Every arena here comes from the shared fixture, which turns the checker on
 * and fails a test whose run found more violations than it provoked.
 */
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
#include <streamarena/streamarena.h>

#include "driver/driver.h"
#include "fixture.h"
#include "test/util.h"

static unsigned long tried, caught;

/* ---- stderr capture: the checker reports there -------------------------- */

typedef struct capture_s {
  int saved;
  FILE *file;
} capture;

static void capture_begin(capture *c) {
  fflush(stderr);
  c->file = tmpfile();
  assert_non_null(c->file);
  c->saved = dup(STDERR_FILENO);
  assert_true(c->saved >= 0);
  assert_true(dup2(fileno(c->file), STDERR_FILENO) >= 0);
}

/* Restore stderr; return what was written meanwhile (malloc'd), after
 * echoing it so the test log shows the report too. */
static char *capture_end(capture *c) {
  fflush(stderr);
  assert_true(dup2(c->saved, STDERR_FILENO) >= 0);
  close(c->saved);
  long len = ftell(c->file);
  assert_true(len >= 0);
  char *text = calloc((size_t)len + 1, 1);
  assert_non_null(text);
  rewind(c->file);
  assert_int_equal(fread(text, 1, (size_t)len, c->file), (size_t)len);
  fclose(c->file);
  fprintf(stderr, "[captured] %s", text);
  return text;
}

static void assert_mentions(const char *text, const void *p, const char *what) {
  char needle[32];
  snprintf(needle, sizeof needle, "%p", p);
  if (strstr(text, needle) == NULL) {
    print_error("the report does not name %s (%s)\n", what, needle);
    fail();
  }
}

/* The report of one violation: names the block and both streams. */
static void assert_report(const char *text, const void *block, sa_stream got, sa_stream user) {
  if (strstr(text, "stream-order violation") == NULL) {
    print_error("no stream-order violation reported\n");
    fail();
  }
  assert_mentions(text, block, "the block");
  assert_mentions(text, got, "the stream it was handed to");
  assert_mentions(text, user, "the stream still using it");
}

static uint64_t violations(void) {
  sa_host_counters c;
  sa_host_get_counters(&c);
  return c.order_violations;
}

static int setup(void **state) {
  sa_fixture *f = malloc(sizeof *f);
  if (f == NULL) return -1;
  if (sa_fixture_setup(f, NULL, 2, SA_HOST_MANUAL) != SA_OK) {
    free(f);
    return -1;
  }
  *state = f;
  return 0;
}

static int teardown(void **state) {
  sa_fixture *f = *state;
  sa_status s = sa_fixture_teardown(f);
  free(f);
  if (s != SA_OK) {
    fprintf(stderr, "teardown: %s\n", sa_status_string(s));
  }
  return s == SA_OK ? 0 : -1;
}

/* ---- misuse through the allocator --------------------------------------- */

/* The caller uses p on B without sa_record_stream and frees it on A: A may
 * reuse p at once, while B's fill is still queued. */
static void use_on_another_stream_without_record_stream_is_caught(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1];
  void *p, *q;
  sa_assert_ok(sa_alloc(f->arena, &p, 4096, a));
  sa_assert_ok(sa_host_fill(b, p, 4096, 0xB0B0B0B0u)); /* the misuse */
  sa_assert_ok(sa_free(p, a));

  uint64_t before = violations();
  capture c;
  capture_begin(&c);
  sa_status st = sa_alloc(f->arena, &q, 4096, a);
  char *text = capture_end(&c);
  tried++;
  sa_assert_status(st, SA_ERR_STREAM_ORDER);
  assert_null(q);
  assert_int_equal(violations(), before + 1);
  f->expected_violations++;
  caught++;
  assert_report(text, p, a, b);
  free(text);

  /* Once B's work is done the same request succeeds (and may get p). */
  sa_assert_ok(sa_host_stream_drain(b));
  sa_assert_ok(sa_alloc(f->arena, &q, 4096, a));
  sa_assert_ok(sa_free(q, a));
}

/* The same use, declared with sa_record_stream: no violation. */
static void record_stream_makes_the_same_use_safe(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1];
  void *p, *q;
  uint64_t bad = 0;
  sa_assert_ok(sa_alloc(f->arena, &p, 4096, a));
  sa_assert_ok(sa_host_fill(b, p, 4096, 0xB0B0B0B0u));
  sa_assert_ok(sa_host_check(b, p, 4096, 0xB0B0B0B0u, &bad));
  sa_assert_ok(sa_record_stream(p, b));
  sa_assert_ok(sa_free(p, a));
  uint64_t before = violations();
  tried++;
  sa_assert_ok(sa_alloc(f->arena, &q, 4096, a));
  sa_assert_ok(sa_host_fill(a, q, 4096, 0xA0A0A0A0u));
  /* Run A first: if q were p without a wait edge, A's fill would land
   * before B's check and B would see the wrong pattern. */
  sa_assert_ok(sa_host_stream_drain(a));
  sa_assert_ok(sa_host_stream_drain(b));
  assert_int_equal(violations(), before);
  assert_int_equal(bad, 0);
  sa_assert_ok(sa_free(q, a));
}

/* Use after free on another stream: p is freed on A, then the caller still
 * enqueues work on B; A's next allocation would hand p out under it. */
static void use_after_free_on_another_stream_is_caught(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1];
  void *p, *q;
  size_t size = 3 * MiB; /* a large span: the span cache path */
  sa_assert_ok(sa_alloc(f->arena, &p, size, a));
  sa_assert_ok(sa_free(p, a));
  sa_assert_ok(sa_host_fill(b, p, 4096, 0xDEADBEEFu)); /* the misuse */

  uint64_t before = violations();
  capture c;
  capture_begin(&c);
  sa_status st = sa_alloc(f->arena, &q, size, a);
  char *text = capture_end(&c);
  tried++;
  sa_assert_status(st, SA_ERR_STREAM_ORDER);
  assert_int_equal(violations(), before + 1);
  f->expected_violations++;
  caught++;
  assert_report(text, p, a, b);
  free(text);
  sa_assert_ok(sa_host_stream_drain(b));
}

/* ---- a violation built through the driver interface ---------------------- */

static void driver_level_violation_names_both_streams_and_the_block(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1];
  sa_driver *d;
  sa_assert_ok(sa_driver_open(SA_BACKEND_HOST, 0, &d));
  assert_non_null(d->ops->check_handout);
  size_t g;
  sa_assert_ok(d->ops->granularity(d, &g));
  uintptr_t va;
  sa_chunk_handle h;
  sa_assert_ok(d->ops->va_reserve(d, g, g, &va));
  sa_assert_ok(d->ops->chunk_create(d, g, &h));
  sa_assert_ok(d->ops->map(d, va, g, h));
  sa_assert_ok(d->ops->set_access(d, va, g));

  /* B writes [va + 4096, va + 8192); nothing orders A after it. */
  sa_assert_ok(d->ops->memset32_async(d, va + 4096, 0x5A5A5A5Au, 1024, b));
  uint64_t before = violations();
  void *block = (void *)(va + 6144); /* overlaps the tail of B's write */
  capture c;
  capture_begin(&c);
  sa_status st = d->ops->check_handout(d, (uintptr_t)block, 4096, a);
  char *text = capture_end(&c);
  tried++;
  sa_assert_status(st, SA_ERR_STREAM_ORDER);
  assert_int_equal(violations(), before + 1);
  f->expected_violations++;
  caught++;
  assert_report(text, block, a, b);
  free(text);

  /* Disjoint memory, and the same stream, are fine. */
  tried += 2;
  sa_assert_ok(d->ops->check_handout(d, va + 8192, 4096, a));
  sa_assert_ok(d->ops->check_handout(d, (uintptr_t)block, 4096, b));

  /* A wait edge on A to an event recorded after B's write makes it safe,
   * before B has run at all. */
  sa_event ev;
  sa_assert_ok(d->ops->event_create(d, &ev));
  sa_assert_ok(d->ops->event_record(d, ev, b));
  sa_assert_ok(d->ops->stream_wait_event(d, a, ev));
  tried++;
  sa_assert_ok(d->ops->check_handout(d, (uintptr_t)block, 4096, a));
  assert_int_equal(violations(), before + 1);

  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(d->ops->event_destroy(d, ev));
  sa_assert_ok(d->ops->unmap(d, va, g));
  sa_assert_ok(d->ops->chunk_release(d, h));
  sa_assert_ok(d->ops->va_release(d, va, g));
  sa_driver_close(d);
}

/* The checker is on in fixture arenas: a config with it off is accepted but
 * the suite's fixture never uses it. Pin the default here. */
static void fixture_arenas_check_stream_order(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1];
  void *p, *q;
  sa_assert_ok(sa_alloc(f->arena, &p, 512, a));
  sa_assert_ok(sa_host_fill(b, p, 512, 1));
  sa_assert_ok(sa_free(p, a));
  capture c;
  capture_begin(&c);
  sa_status st = sa_alloc(f->arena, &q, 512, a);
  char *text = capture_end(&c);
  free(text);
  tried++;
  sa_assert_status(st, SA_ERR_STREAM_ORDER);
  f->expected_violations++;
  caught++;
  sa_assert_ok(sa_host_stream_drain(b));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(use_on_another_stream_without_record_stream_is_caught,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(record_stream_makes_the_same_use_safe, setup, teardown),
      cmocka_unit_test_setup_teardown(use_after_free_on_another_stream_is_caught, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(driver_level_violation_names_both_streams_and_the_block,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(fixture_arenas_check_stream_order, setup, teardown),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  printf("order_violation: handouts checked %lu, violations caught %lu, threads 1, streams 2, "
         "failures %d\n",
         tried, caught, failed);
  return failed;
}
