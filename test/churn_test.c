/* Churn: 10,000 threads created and exited while allocating, 8 at a time,
 * and a stream created and released (with memory still allocated from it)
 * for every batch. Threads exit with blocks in their caches, with open
 * cross-stream batches, and with live blocks that other threads free later
 * on other streams. At the end every byte comes back: no live bytes, as
 * many frees as allocations, and after a trim no physical memory held
 * (allocator statistics and the simulator's own counters).
 *
 * The plain and AddressSanitizer builds run 10,000 threads; the
 * ThreadSanitizer build, where a thread costs far more, runs 4,000
 * (STREAMARENA_CHURN_THREADS overrides both).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "fixture.h"
#include "test/util.h"

#define BATCH 8       /* threads alive at once */
#define PER_THREAD 12 /* allocations per thread */
#define CARRY 2       /* blocks a thread leaves live for others to free */

#if defined(__SANITIZE_THREAD__)
#define DEFAULT_THREADS 4000
#else
#define DEFAULT_THREADS 10000
#endif

typedef struct carried_s {
  void *p;
  size_t size;
  uint32_t pattern;
} carried;

typedef struct job_s {
  pthread_t thread;
  unsigned long index;
  sa_arena *arena;
  sa_stream streams[3]; /* the batch's own stream and two long-lived ones */
  carried carry[CARRY]; /* out: blocks left live */
  unsigned long allocs, frees, failures;
} job;

static _Atomic unsigned messages; /* the first few failures are enough to read */

static void fail_job(job *j, const char *what, sa_status st) {
  if (atomic_fetch_add(&messages, 1) < 20)
    fprintf(stderr, "churn: thread %lu: %s: %s\n", j->index, what, sa_status_string(st));
  j->failures++;
}

static size_t job_size(unsigned long i, int k) {
  unsigned long r = (i * 2654435761u + (unsigned long)k * 40503u) % 100;
  if (r < 80) return 64 + (r * 977) % (8 * KiB);
  if (r < 97) return 64 * KiB + (r * 7919) % (512 * KiB);
  return 2 * MiB + (r % 3) * MiB; /* a large span now and then */
}

static void *churn_thread(void *arg) {
  job *j = arg;
  void *p[PER_THREAD];
  size_t size[PER_THREAD];
  int on[PER_THREAD];
  int n = 0;
  for (int k = 0; k < PER_THREAD; k++) {
    on[k] = (int)((j->index + (unsigned long)k) % 3);
    size[k] = job_size(j->index, k);
    sa_status st = sa_alloc(j->arena, &p[k], size[k], j->streams[on[k]]);
    if (st != SA_OK) {
      fail_job(j, "sa_alloc", st);
      continue;
    }
    j->allocs++;
    /* Write a word at each end directly (the streams are AUTO: no queued
     * work can be touching it) and free a third of them at once. */
    uint32_t tag = (uint32_t)(j->index << 8 | (unsigned)k);
    memcpy(p[k], &tag, 4);
    memcpy((char *)p[k] + (size[k] & ~(size_t)3) - 4, &tag, 4);
    n = k + 1;
    if (k % 3 == 0) {
      st = sa_free(p[k], j->streams[on[k]]);
      if (st != SA_OK) fail_job(j, "sa_free", st);
      j->frees += st == SA_OK;
      p[k] = NULL;
    }
  }
  /* Leave CARRY blocks live for the main thread; free the rest, some on
   * another stream (an open cross-stream batch at exit), and exit with the
   * same-stream ones still in this thread's cache. */
  int carried_n = 0;
  for (int k = n - 1; k >= 0; k--) {
    if (p[k] == NULL) continue;
    uint32_t tag = (uint32_t)(j->index << 8 | (unsigned)k), first, last;
    memcpy(&first, p[k], 4);
    memcpy(&last, (char *)p[k] + (size[k] & ~(size_t)3) - 4, 4);
    if (first != tag || last != tag) fail_job(j, "contents", SA_ERR_INTERNAL);
    if (carried_n < CARRY) {
      j->carry[carried_n++] = (carried){p[k], size[k], tag};
      continue;
    }
    int t = k % 2 ? on[k] : (on[k] + 1) % 3;
    sa_status st = sa_free(p[k], j->streams[t]);
    if (st != SA_OK) fail_job(j, "sa_free", st);
    j->frees += st == SA_OK;
  }
  return NULL;
}

static unsigned long env_count(const char *name, unsigned long fallback) {
  const char *v = getenv(name);
  if (v == NULL || *v == '\0') return fallback;
  char *end;
  unsigned long x = strtoul(v, &end, 10);
  return *end == '\0' && x > 0 ? x : fallback;
}

static void churn(void **state) {
  (void)state;
  unsigned long nthreads = env_count("STREAMARENA_CHURN_THREADS", DEFAULT_THREADS);
  sa_fixture f;
  sa_assert_ok(sa_fixture_setup(&f, NULL, 2, SA_HOST_AUTO));
  sa_stats st;
  unsigned long created = 0, streams_made = 0, allocs = 0, frees = 0, failures = 0;
  size_t reserved_peak = 0;
  carried *pending = NULL; /* the previous batch's carried blocks */
  size_t npending = 0;
  job jobs[BATCH];
  while (created < nthreads) {
    /* A stream for this batch, released below with its blocks still live. */
    sa_stream bs;
    sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &bs));
    streams_made++;
    int batch = nthreads - created < BATCH ? (int)(nthreads - created) : BATCH;
    for (int i = 0; i < batch; i++) {
      memset(&jobs[i], 0, sizeof jobs[i]);
      jobs[i] = (job){.index = created + (unsigned long)i,
                      .arena = f.arena,
                      .streams = {bs, f.streams[0], f.streams[1]}};
      assert_int_equal(pthread_create(&jobs[i].thread, NULL, churn_thread, &jobs[i]), 0);
    }
    /* The previous batch's blocks are freed while this batch runs, on a
     * stream other than the (released, destroyed) one they came from. */
    for (size_t i = 0; i < npending; i++) {
      uint32_t first;
      memcpy(&first, pending[i].p, 4);
      if (first != pending[i].pattern) {
        fprintf(stderr, "churn: carried block %p lost its contents\n", pending[i].p);
        failures++;
      }
      sa_status s = sa_free(pending[i].p, f.streams[i % 2]);
      if (s != SA_OK) {
        fprintf(stderr, "churn: free of a carried block: %s\n", sa_status_string(s));
        failures++;
      }
      frees += s == SA_OK;
    }
    free(pending);
    pending = calloc(BATCH * CARRY, sizeof *pending);
    assert_non_null(pending);
    npending = 0;
    for (int i = 0; i < batch; i++) {
      assert_int_equal(pthread_join(jobs[i].thread, NULL), 0);
      allocs += jobs[i].allocs;
      frees += jobs[i].frees;
      failures += jobs[i].failures;
      for (int k = 0; k < CARRY; k++)
        if (jobs[i].carry[k].p != NULL) pending[npending++] = jobs[i].carry[k];
    }
    created += (unsigned long)batch;
    sa_assert_ok(sa_stream_release(f.arena, bs));
    sa_assert_ok(sa_host_stream_destroy(bs));
    sa_assert_ok(sa_get_stats(f.arena, &st));
    if (st.reserved_bytes > reserved_peak) reserved_peak = st.reserved_bytes;
  }
  for (size_t i = 0; i < npending; i++) {
    sa_status s = sa_free(pending[i].p, f.streams[0]);
    if (s != SA_OK) failures++;
    frees += s == SA_OK;
  }
  free(pending);

  /* Everything comes back. */
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_get_stats(f.arena, &st));
  if (st.live_bytes != 0 || st.alloc_count != allocs || st.free_count != frees ||
      allocs != frees || st.streams != 2 || st.large_spans != 0) {
    fprintf(stderr,
            "churn: stats: live %zu bytes, %llu allocs (made %lu), %llu frees (made %lu), "
            "%zu streams, %zu large spans\n",
            st.live_bytes, (unsigned long long)st.alloc_count, allocs,
            (unsigned long long)st.free_count, frees, st.streams, st.large_spans);
    failures++;
  }
  sa_assert_ok(sa_trim(f.arena, 0));
  sa_assert_ok(sa_get_stats(f.arena, &st));
  sa_host_counters c;
  sa_host_get_counters(&c);
  if (st.reserved_bytes != 0 || st.chunks_total != 0 || c.chunks != f.before.chunks ||
      c.mappings != f.before.mappings || st.deferred_frees != 0) {
    fprintf(stderr,
            "churn: after trim: %zu bytes reserved in %zu chunks, %zu deferred; simulator: "
            "%zu chunks, %zu mappings\n",
            st.reserved_bytes, st.chunks_total, st.deferred_frees, c.chunks, c.mappings);
    (void)sa_snapshot_write(f.arena, stderr); /* where the memory is held */
    failures++;
  }
  sa_status torn = sa_fixture_teardown(&f);
  if (torn != SA_OK) failures++;
  printf("churn: threads %lu (%d at a time), streams created and released %lu, operations %lu "
         "(allocs %lu, frees %lu), peak reserved %zu bytes, failures %lu\n",
         created, BATCH, streams_made, allocs + frees, allocs, frees, reserved_peak, failures);
  sa_assert_ok(torn);
  assert_int_equal(failures, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(churn)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
