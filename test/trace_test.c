/* Allocation traces (configuration key "trace"): the file an arena writes
 * is the CSV of docs/TRACE.md, one line per alloc and free, from every
 * thread and stream, fast paths included.
 */
#include <pthread.h>
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

#include "fixture.h"

#define THREADS 2
#define OPS 200 /* allocations per thread */

typedef struct job_s {
  sa_arena *arena;
  sa_stream stream;
  size_t sizes[OPS];
  int failures;
} job;

/* Allocate and free in pairs with a few held back, so that the trace mixes
 * fast-path and slow-path operations and frees out of allocation order. */
static void *run(void *arg) {
  job *j = arg;
  void *held[4] = {0};
  for (int i = 0; i < OPS; i++) {
    void *p;
    if (sa_alloc(j->arena, &p, j->sizes[i], j->stream) != SA_OK) {
      j->failures++;
      continue;
    }
    void **slot = &held[i % 4];
    if (*slot != NULL && sa_free(*slot, j->stream) != SA_OK) j->failures++;
    *slot = p;
  }
  for (int k = 0; k < 4; k++)
    if (held[k] != NULL && sa_free(held[k], j->stream) != SA_OK) j->failures++;
  return NULL;
}

/* A fixture of n streams in mode whose arena traces to a new temporary file,
 * named in path (a mkstemp template, overwritten with the name). */
static void setup_traced(sa_fixture *f, char *path, size_t n, sa_host_mode mode) {
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  char spec[300];
  snprintf(spec, sizeof spec, "trace=%s", path);
  sa_assert_ok(sa_fixture_setup(f, spec, n, mode));
}

typedef struct live_s {
  char id[32];
  char stream[32];
  unsigned long long size;
} live;

static void trace_is_the_documented_csv(void **state) {
  (void)state;
  char path[] = "/tmp/sa_trace_test_XXXXXX";
  sa_fixture f;
  setup_traced(&f, path, THREADS, SA_HOST_AUTO);
  job jobs[THREADS];
  pthread_t t[THREADS];
  size_t expected_bytes = 0;
  for (int k = 0; k < THREADS; k++) {
    jobs[k].arena = f.arena;
    jobs[k].stream = f.streams[k];
    jobs[k].failures = 0;
    for (int i = 0; i < OPS; i++) {
      /* small blocks, and a large span now and then */
      jobs[k].sizes[i] = i % 25 == 0 ? (size_t)3 << 20 : 16 + (size_t)(i * 37 + k) % 5000;
      expected_bytes += jobs[k].sizes[i];
    }
    assert_int_equal(pthread_create(&t[k], NULL, run, &jobs[k]), 0);
  }
  for (int k = 0; k < THREADS; k++) {
    assert_int_equal(pthread_join(t[k], NULL), 0);
    assert_int_equal(jobs[k].failures, 0);
  }
  sa_assert_ok(sa_fixture_teardown(&f)); /* closes the trace */

  FILE *in = fopen(path, "r");
  assert_non_null(in);
  char line[256];
  assert_non_null(fgets(line, sizeof line, in));
  assert_string_equal(line, "thread,stream,op,id,size,time_ns\n");
  live *open = calloc(THREADS * OPS, sizeof *open);
  assert_non_null(open);
  size_t nopen = 0, allocs = 0, frees = 0, bytes = 0;
  while (fgets(line, sizeof line, in) != NULL) {
    unsigned thread;
    char stream[32], op[8], id[32];
    unsigned long long size, ns;
    assert_int_equal(sscanf(line, "%u,%31[^,],%7[^,],%31[^,],%llu,%llu\n", &thread, stream,
                            op, id, &size, &ns),
                     6);
    assert_true(thread > 0);
    if (strcmp(op, "alloc") == 0) {
      assert_true(size > 0);
      for (size_t i = 0; i < nopen; i++) assert_string_not_equal(open[i].id, id);
      snprintf(open[nopen].id, sizeof open[nopen].id, "%s", id);
      snprintf(open[nopen].stream, sizeof open[nopen].stream, "%s", stream);
      open[nopen++].size = size;
      allocs++;
      bytes += size;
    } else {
      assert_string_equal(op, "free");
      assert_int_equal(size, 0);
      size_t i = 0;
      while (i < nopen && strcmp(open[i].id, id) != 0) i++;
      assert_true(i < nopen); /* a free names a live allocation */
      assert_string_equal(open[i].stream, stream);
      open[i] = open[--nopen];
      frees++;
    }
  }
  fclose(in);
  unlink(path);
  free(open);
  assert_int_equal(allocs, THREADS * OPS);
  assert_int_equal(frees, THREADS * OPS);
  assert_int_equal(nopen, 0);
  assert_int_equal(bytes, expected_bytes);
}

static void unwritable_trace_path_is_bad_config(void **state) {
  (void)state;
  sa_config cfg;
  sa_config_init(&cfg);
  sa_assert_ok(sa_config_parse(&cfg, "backend=host,trace=/nonexistent-dir/x.csv", NULL, 0));
  sa_arena *a = (sa_arena *)1;
  sa_assert_status(sa_arena_create(&cfg, &a), SA_ERR_BAD_CONFIG);
  assert_null(a);
}

/* Two arenas with one trace path, as the default arenas of two devices get
 * from STREAMARENA_CONF=trace=PATH: each opened the file with "w" on its own,
 * so one truncated and overwrote the other's lines and the file silently
 * lost operations. Every operation of both must be in the file, under one
 * header. */
static void arenas_sharing_a_trace_path_keep_every_line(void **state) {
  (void)state;
  char path[] = "/tmp/sa_trace_shared_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  sa_arena *a[2];
  for (int k = 0; k < 2; k++)
    sa_assert_ok(sa_fixture_arena_create(&a[k], "backend=host,trace=%s", path));
  for (int i = 0; i < 50; i++) {
    for (int k = 0; k < 2; k++) {
      void *p;
      sa_assert_ok(sa_alloc(a[k], &p, 1000 + (size_t)i, NULL));
      sa_assert_ok(sa_free(p, NULL));
    }
  }
  sa_assert_ok(sa_host_drain_all());
  for (int k = 0; k < 2; k++) sa_assert_ok(sa_arena_destroy(a[k]));
  FILE *in = fopen(path, "r");
  assert_non_null(in);
  char line[256];
  size_t headers = 0, allocs = 0, frees = 0, other = 0;
  while (fgets(line, sizeof line, in) != NULL) {
    if (strcmp(line, "thread,stream,op,id,size,time_ns\n") == 0)
      headers++;
    else if (strstr(line, ",alloc,") != NULL)
      allocs++;
    else if (strstr(line, ",free,") != NULL)
      frees++;
    else
      other++;
  }
  fclose(in);
  unlink(path);
  assert_int_equal(headers, 1);
  assert_int_equal(other, 0);
  assert_int_equal(allocs, 100);
  assert_int_equal(frees, 100);
}

/* A handout the stream-order checker refuses fails the allocation, which is
 * not traced; the block it hands back was traced as a free, of an id no
 * alloc line opened, and a replay of the file met a free of nothing. */
static void a_handout_the_checker_refuses_is_not_traced(void **state) {
  (void)state;
  char path[] = "/tmp/sa_trace_refused_XXXXXX";
  sa_fixture f;
  setup_traced(&f, path, 2, SA_HOST_MANUAL);
  sa_stream a = f.streams[0], b = f.streams[1];
  void *p, *q;
  sa_assert_ok(sa_alloc(f.arena, &p, 4096, a));
  sa_assert_ok(sa_host_fill(b, p, 4096, 0xB0B0B0B0u)); /* used on b, not recorded */
  sa_assert_ok(sa_free(p, a));
  sa_assert_status(sa_alloc(f.arena, &q, 4096, a), SA_ERR_STREAM_ORDER); /* p again */
  assert_null(q);
  f.expected_violations++;
  sa_assert_ok(sa_host_stream_drain(b));
  sa_assert_ok(sa_fixture_teardown(&f));

  FILE *in = fopen(path, "r");
  assert_non_null(in);
  char line[256], id[32] = "";
  size_t allocs = 0, frees = 0;
  assert_non_null(fgets(line, sizeof line, in)); /* the header */
  while (fgets(line, sizeof line, in) != NULL) {
    char op[8], at[32];
    assert_int_equal(sscanf(line, "%*u,%*[^,],%7[^,],%31[^,]", op, at), 2);
    if (strcmp(op, "alloc") == 0) {
      assert_string_equal(id, ""); /* one block live at a time */
      snprintf(id, sizeof id, "%s", at);
      allocs++;
    } else {
      if (strcmp(id, at) != 0) fail_msg("free of %s, which is not live: %s", at, line);
      id[0] = '\0';
      frees++;
    }
  }
  fclose(in);
  unlink(path);
  assert_int_equal(allocs, 1);
  assert_int_equal(frees, 1);
}

/* A trace that cannot be written (a full disk: /dev/full) lost its lines;
 * each arena's destroy said SA_OK over an empty file. Both arenas of a
 * shared file report it: the one that flushes and the one that closes. */
static void a_trace_write_error_fails_the_destroy(void **state) {
  (void)state;
  sa_arena *a[2];
  for (int k = 0; k < 2; k++) {
    sa_assert_ok(sa_fixture_arena_create(&a[k], "backend=host,trace=/dev/full"));
    void *p;
    sa_assert_ok(sa_alloc(a[k], &p, 4096, NULL));
    sa_assert_ok(sa_free(p, NULL));
  }
  sa_assert_ok(sa_host_drain_all());
  for (int k = 0; k < 2; k++) sa_assert_status(sa_arena_destroy(a[k]), SA_ERR_BAD_CONFIG);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(trace_is_the_documented_csv),
      cmocka_unit_test(unwritable_trace_path_is_bad_config),
      cmocka_unit_test(arenas_sharing_a_trace_path_keep_every_line),
      cmocka_unit_test(a_handout_the_checker_refuses_is_not_traced),
      cmocka_unit_test(a_trace_write_error_fails_the_destroy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
