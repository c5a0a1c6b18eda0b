/* The shared host-backend fixture; see fixture.h. */
#include "fixture.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "driver/driver.h"

static void release_streams(sa_fixture *f, sa_status *first_error) {
  for (size_t i = f->stream_count; i-- > 0;) {
    sa_status s = sa_host_stream_drain(f->streams[i]);
    if (s == SA_OK && f->arena != NULL) s = sa_stream_release(f->arena, f->streams[i]);
    sa_status d = sa_host_stream_destroy(f->streams[i]);
    if (s == SA_OK) s = d;
    if (s != SA_OK && *first_error == SA_OK) *first_error = s;
    f->streams[i] = NULL;
  }
  f->stream_count = 0;
}

sa_status sa_fixture_setup(sa_fixture *f, const char *spec, size_t stream_count,
                           sa_host_mode mode) {
  if (f == NULL || stream_count > SA_FIXTURE_MAX_STREAMS) return SA_ERR_INVALID_ARGUMENT;
  memset(f, 0, sizeof *f);
  sa_host_get_counters(&f->before);

  sa_config cfg;
  sa_config_init(&cfg);
  char err[256];
  /* Every fixture arena checks stream order: a handout the contract forbids
   * fails the allocation and the test. */
  sa_status s = sa_config_parse(&cfg, "backend=host,check_stream_order=1", err, sizeof err);
  if (s == SA_OK) s = sa_config_parse(&cfg, spec, err, sizeof err);
  if (s != SA_OK) {
    fprintf(stderr, "fixture: bad spec '%s': %s\n", spec, err);
    return s;
  }
  s = sa_arena_create(&cfg, &f->arena);
  if (s != SA_OK) {
    f->arena = NULL;
    return s;
  }
  for (size_t i = 0; i < stream_count; i++) {
    s = sa_host_stream_create(mode, &f->streams[i]);
    if (s != SA_OK) break;
    f->stream_count++;
  }
  if (s != SA_OK) {
    sa_status ignored = SA_OK;
    release_streams(f, &ignored);
    sa_arena_destroy(f->arena);
    f->arena = NULL;
  }
  return s;
}

/* Print each simulator counter that grew since setup; true if none did. */
static int counters_back(const sa_host_counters *before) {
  sa_host_counters now;
  sa_host_get_counters(&now);
  int clean = 1;
#define SA_FIXTURE_CHECK(field)                                                       \
  if (now.field > before->field) {                                                    \
    fprintf(stderr, "fixture: leaked %s: %zu before, %zu after teardown\n", #field,  \
            (size_t)before->field, (size_t)now.field);                                \
    clean = 0;                                                                        \
  }
  SA_FIXTURE_CHECK(va_ranges)
  SA_FIXTURE_CHECK(chunks)
  SA_FIXTURE_CHECK(chunk_bytes)
  SA_FIXTURE_CHECK(mappings)
  SA_FIXTURE_CHECK(events)
  SA_FIXTURE_CHECK(streams)
#undef SA_FIXTURE_CHECK
  return clean;
}

sa_status sa_fixture_teardown(sa_fixture *f) {
  if (f == NULL) return SA_ERR_INVALID_ARGUMENT;
  sa_status first = SA_OK;
  release_streams(f, &first);
  sa_status d = sa_arena_destroy(f->arena);
  f->arena = NULL;
  if (d != SA_OK) return d;
  if (first != SA_OK) return first;
  if (!counters_back(&f->before)) return SA_ERR_INTERNAL;
  sa_host_counters now;
  sa_host_get_counters(&now);
  uint64_t found = now.order_violations - f->before.order_violations;
  if (found != f->expected_violations) {
    fprintf(stderr, "fixture: the stream-order checker found %llu violations, %llu expected\n",
            (unsigned long long)found, (unsigned long long)f->expected_violations);
    return SA_ERR_STREAM_ORDER;
  }
  return SA_OK;
}

int sa_fixture_cmocka_setup(void **state) {
  return sa_fixture_cmocka_setup_with(state, NULL, 2);
}

int sa_fixture_cmocka_setup_with(void **state, const char *spec, size_t stream_count) {
  sa_fixture *f = malloc(sizeof *f);
  if (f == NULL) return -1;
  sa_status s = sa_fixture_setup(f, spec, stream_count, SA_HOST_MANUAL);
  if (s != SA_OK) {
    fprintf(stderr, "fixture: setup failed: %s\n", sa_status_string(s));
    free(f);
    return -1;
  }
  *state = f;
  return 0;
}

int sa_fixture_cmocka_teardown(void **state) {
  sa_fixture *f = *state;
  sa_status s = sa_fixture_teardown(f);
  free(f);
  *state = NULL;
  if (s != SA_OK) {
    fprintf(stderr, "fixture: teardown failed: %s\n", sa_status_string(s));
    return -1;
  }
  return 0;
}

void sa_fixture_assert_status_(sa_status got, sa_status want, const char *expr,
                               const char *file, int line) {
  if (got == want) return;
  const char *name = NULL;
  int code = sa_last_driver_error(&name);
  bool from_driver = got == SA_ERR_DRIVER || got == SA_ERR_NO_DEVICE || got == SA_ERR_NOT_SUPPORTED;
  print_error("%s returned %s (%d), expected %s (%d)", expr, sa_status_string(got), (int)got,
              sa_status_string(want), (int)want);
  if (from_driver) print_error("; driver: %s (%d)", name, code);
  print_error("\n");
  _fail(file, line);
}

static FILE *captured;
static int saved_stderr = -1;

void sa_fixture_stderr_begin(void) {
  fflush(stderr);
  captured = tmpfile();
  saved_stderr = captured != NULL ? dup(STDERR_FILENO) : -1;
  if (saved_stderr >= 0) dup2(fileno(captured), STDERR_FILENO);
}

char *sa_fixture_stderr_end(void) {
  if (saved_stderr < 0) return NULL;
  fflush(stderr);
  dup2(saved_stderr, STDERR_FILENO);
  close(saved_stderr);
  saved_stderr = -1;
  off_t n = lseek(fileno(captured), 0, SEEK_END);
  char *text = n >= 0 ? calloc((size_t)n + 1, 1) : NULL;
  if (text != NULL && pread(fileno(captured), text, (size_t)n, 0) != n) {
    free(text);
    text = NULL;
  }
  fclose(captured);
  captured = NULL;
  if (text != NULL) fputs(text, stderr); /* still visible in the test log */
  return text;
}

size_t sa_fixture_count(const char *haystack, const char *needle) {
  size_t n = 0, len = strlen(needle);
  for (const char *p = haystack; len > 0 && (p = strstr(p, needle)) != NULL; p += len) n++;
  return n;
}

sa_status sa_fixture_arena_create(sa_arena **out, const char *fmt, ...) {
  char spec[512], err[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(spec, sizeof spec, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof spec) fail_msg("fixture: arena spec too long");
  sa_config cfg;
  sa_config_init(&cfg);
  if (sa_config_parse(&cfg, spec, err, sizeof err) != SA_OK) fail_msg("fixture: '%s': %s", spec, err);
  return sa_arena_create(&cfg, out);
}

void sa_fixture_assert_driver_error(const char *needle) {
  const char *name = NULL;
  (void)sa_last_driver_error(&name);
  if (name == NULL || strstr(name, needle) == NULL)
    fail_msg("the last driver error '%s' lacks '%s'", name != NULL ? name : "(none)", needle);
}

typedef struct churn_s {
  sa_arena *arena;
  size_t size;
  int count;
  sa_stream stream;
  sa_status status;
} churn;

static void *alloc_free_exit(void *arg) {
  churn *c = arg;
  void *p[64];
  int n = 0;
  while (n < c->count && n < 64 && c->status == SA_OK)
    if ((c->status = sa_alloc(c->arena, &p[n], c->size, c->stream)) == SA_OK) n++;
  for (int i = 0; i < n; i++) {
    sa_status st = sa_free(p[i], c->stream);
    if (c->status == SA_OK) c->status = st;
  }
  return NULL;
}

sa_status sa_fixture_alloc_free_on_thread(sa_arena *arena, size_t size, int count,
                                          sa_stream stream) {
  churn c = {arena, size, count, stream, SA_OK};
  pthread_t t;
  if (pthread_create(&t, NULL, alloc_free_exit, &c) != 0) return SA_ERR_INTERNAL;
  if (pthread_join(t, NULL) != 0) return SA_ERR_INTERNAL;
  return c.status;
}

void sa_fixture_thread_failure(uint64_t *failures, const char *test, unsigned id,
                               const char *what, sa_status st) {
  fprintf(stderr, "%s: thread %u: %s: %s\n", test, id, what, sa_status_string(st));
  (*failures)++;
}

static sa_driver **group_driver; /* the running group's, for its setup and teardown */

static int open_group_driver(void **state) {
  (void)state;
  return sa_driver_host_open(0, group_driver) == SA_OK ? 0 : -1;
}

static int close_group_driver(void **state) {
  (void)state;
  sa_driver_close(*group_driver);
  *group_driver = NULL;
  return 0;
}

int sa_fixture_run_with_host_driver_(const char *name, const struct CMUnitTest *tests,
                                     size_t count, sa_driver **d) {
  group_driver = d;
  return _cmocka_run_group_tests(name, tests, count, open_group_driver, close_group_driver);
}

void sa_fixture_stream_takes_a_span(sa_arena *arena, sa_stream s) {
  void *p;
  sa_assert_ok(sa_alloc(arena, &p, 8 * MiB, s));
  sa_assert_ok(sa_free(p, s));
}

void *sa_fixture_take_behind(sa_arena *arena, size_t size, sa_stream s, sa_stream blocker,
                             uint32_t pattern) {
  sa_host_counters before, after;
  sa_host_get_counters(&before);
  uint64_t mism = 0;
  void *q;
  sa_assert_ok(sa_alloc(arena, &q, size, s));
  sa_assert_ok(sa_host_fill(s, q, 4096, pattern));
  sa_assert_ok(sa_host_check(s, q, 4096, pattern, &mism));
  size_t done = 0;
  sa_assert_ok(sa_host_stream_step(s, SIZE_MAX, &done));
  sa_assert_ok(sa_host_stream_drain(blocker));
  sa_assert_ok(sa_host_stream_drain(s));
  assert_int_equal(mism, 0);
  assert_int_equal(((uint32_t *)q)[0], pattern);
  sa_host_get_counters(&after);
  assert_int_equal(after.order_violations, before.order_violations);
  return q;
}
