/* Stress, in the spirit of mimalloc's test-stress: T threads x S streams
 * doing a random mix of allocations, frees on the block's stream and on
 * other streams, sa_record_stream, hand-overs of blocks between threads
 * through a shared exchange array, uses of a block on another stream behind
 * an event, trims and defragmentations; every stream is stepped by hand, a
 * few operations at a time, by whichever thread happens to, so work
 * completes in an adversarial interleaving.
 *
 * Every block gets its own pattern, written by a simulated fill kernel on
 * the stream that uses it and verified by check kernels (at free) and by
 * direct reads (after draining); the stream-order checker is on. Any reuse
 * the contract forbids shows up as a checker finding or a wrong word.
 *
 * Scale: CI runs a size that fits under ThreadSanitizer; STREAMARENA_LONG=1
 * runs a large one. STREAMARENA_STRESS_THREADS, _STREAMS, _OPS override.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "driver/driver.h"
#include "fixture.h"
#include "test/util.h"

#define MAX_STREAMS SA_FIXTURE_MAX_STREAMS
#define MAX_LOCAL 48      /* blocks a thread holds at most */
#define EXCHANGE_SLOTS 64 /* shared hand-over array */
#define EDGE 4096         /* bytes written at each end of a block */

typedef struct block_s {
  void *p;
  size_t size;
  int alloc_stream; /* index into the fixture's streams */
  int last_stream;  /* where its last fill was enqueued */
  uint32_t pattern; /* what that fill writes */
} block;

typedef struct counts_s {
  uint64_t ops, allocs, frees, cross_frees, records, transfers_out, transfers_in, uses,
      checks, reads, steps, trims, oom, failures;
} counts;

static struct {
  sa_fixture f;
  int threads, streams;
  long ops;
  _Atomic(block *) exchange[EXCHANGE_SLOTS];
  _Atomic uint32_t next_pattern;
  uint64_t mismatches; /* written by check kernels, under the simulator lock */
} g;

typedef struct worker_s {
  pthread_t thread;
  unsigned id;
  uint64_t rng;
  sa_driver *drv;   /* this thread's events (the simulator is shared) */
  sa_event ev;
  void *local[MAX_LOCAL]; /* blocks */
  int n;
  counts c;
} worker;

static unsigned pick(worker *w, unsigned n) { return sa_fixture_pick(&w->rng, n); }

static void failure(worker *w, const char *what, sa_status st) {
  sa_fixture_thread_failure(&w->c.failures, "stress", w->id, what, st);
}

static void ok(worker *w, sa_status st, const char *what) {
  if (st != SA_OK) failure(w, what, st);
}

static sa_stream stream_at(int i) { return g.f.streams[i]; }

/* Sizes: mostly small, some medium, a few large spans. */
static size_t random_size(worker *w) {
  unsigned r = pick(w, 100);
  if (r < 70) return 1 + pick(w, 16 * KiB);
  if (r < 95) return 16 * KiB + pick(w, 1008 * KiB);
  return MiB + pick(w, 7 * MiB);
}

/* Fill (or check) both ends of b on stream s with b's pattern. */
static void kernels(worker *w, block *b, int s, bool check) {
  size_t head = b->size < 2 * EDGE ? b->size : EDGE;
  head &= ~(size_t)3;
  size_t tail_off = b->size <= 2 * EDGE ? head : (b->size - EDGE) & ~(size_t)3;
  size_t tail = b->size <= 2 * EDGE ? ((b->size - head) & ~(size_t)3) : EDGE;
  char *p = b->p;
  for (int part = 0; part < 2; part++) {
    size_t off = part == 0 ? 0 : tail_off, len = part == 0 ? head : tail;
    if (len == 0) continue;
    sa_status st = check ? sa_host_check(stream_at(s), p + off, len, b->pattern, &g.mismatches)
                         : sa_host_fill(stream_at(s), p + off, len, b->pattern);
    ok(w, st, check ? "sa_host_check" : "sa_host_fill");
  }
  if (check) w->c.checks++;
}

static void op_alloc(worker *w) {
  if (w->n == MAX_LOCAL) return;
  block *b = malloc(sizeof *b);
  if (b == NULL) return failure(w, "malloc", SA_ERR_OUT_OF_MEMORY);
  b->size = random_size(w);
  b->alloc_stream = b->last_stream = (int)pick(w, (unsigned)g.streams);
  b->pattern = atomic_fetch_add_explicit(&g.next_pattern, 1, memory_order_relaxed);
  sa_status st = sa_alloc(g.f.arena, &b->p, b->size, stream_at(b->alloc_stream));
  if (st == SA_ERR_OUT_OF_MEMORY) {
    w->c.oom++;
    free(b);
    return;
  }
  if (st != SA_OK || b->p == NULL || (uintptr_t)b->p % SA_ALIGNMENT != 0) {
    failure(w, "sa_alloc", st);
    free(b);
    return;
  }
  w->c.allocs++;
  kernels(w, b, b->alloc_stream, false);
  w->local[w->n++] = b;
}

/* Check b's contents on the stream of its last fill, then free it on its
 * last stream or, half the time, on another one. Every other stream that
 * used b was recorded when it did (op_use); b's own allocation stream is
 * recorded here when the free is elsewhere. */
static void free_block(worker *w, block *b) {
  kernels(w, b, b->last_stream, true);
  int t = pick(w, 2) ? b->last_stream : (int)pick(w, (unsigned)g.streams);
  if (t != b->alloc_stream) {
    sa_status st = sa_record_stream(b->p, stream_at(b->alloc_stream));
    ok(w, st, "sa_record_stream (own stream)");
    w->c.records += st == SA_OK;
  }
  if (t != b->last_stream) {
    /* b's last use is on last_stream: recorded already unless it is the
     * allocation stream, recorded just above. */
    w->c.cross_frees++;
  }
  ok(w, sa_free(b->p, stream_at(t)), "sa_free");
  w->c.frees++;
  free(b);
}

static void op_free(worker *w) {
  block *b = sa_fixture_take_local(w->local, &w->n, &w->rng);
  if (b != NULL) free_block(w, b);
}

/* Use b on another stream u: u waits for an event recorded after b's last
 * fill, the use is declared with sa_record_stream, and u writes a new
 * pattern. */
static void op_use(worker *w) {
  if (w->n == 0 || g.streams < 2) return;
  block *b = w->local[pick(w, (unsigned)w->n)];
  int u = (int)pick(w, (unsigned)g.streams);
  if (u == b->last_stream) return;
  kernels(w, b, b->last_stream, true); /* the old pattern, before the event */
  ok(w, w->drv->ops->event_record(w->drv, w->ev, stream_at(b->last_stream)), "event_record");
  ok(w, w->drv->ops->stream_wait_event(w->drv, stream_at(u), w->ev), "stream_wait_event");
  if (u != b->alloc_stream) {
    sa_status st = sa_record_stream(b->p, stream_at(u));
    ok(w, st, "sa_record_stream");
    w->c.records += st == SA_OK;
  }
  b->last_stream = u;
  b->pattern = atomic_fetch_add_explicit(&g.next_pattern, 1, memory_order_relaxed);
  kernels(w, b, u, false);
  w->c.uses++;
}

/* Direct reads: drain the block's last stream (everything it waits on runs
 * too), then read its first and last words on the CPU. */
static void op_read(worker *w) {
  if (w->n == 0) return;
  block *b = w->local[pick(w, (unsigned)w->n)];
  ok(w, sa_host_stream_drain(stream_at(b->last_stream)), "sa_host_stream_drain");
  uint32_t first, last;
  size_t end = b->size < 2 * EDGE ? (b->size & ~(size_t)3) : b->size & ~(size_t)3;
  if (end < 4) return;
  memcpy(&first, b->p, 4);
  memcpy(&last, (char *)b->p + end - 4, 4);
  if (first != b->pattern || last != b->pattern) {
    fprintf(stderr, "stress: thread %u: block %p (%zu bytes) reads %08x..%08x, wrote %08x\n",
            w->id, b->p, b->size, first, last, b->pattern);
    w->c.failures++;
  }
  w->c.reads++;
}

/* Hand a block to whichever thread takes it next. */
static void op_give(worker *w) {
  if (w->n == 0) return;
  unsigned slot = pick(w, EXCHANGE_SLOTS);
  block *expected = NULL;
  block *b = w->local[w->n - 1];
  if (atomic_compare_exchange_strong_explicit(&g.exchange[slot], &expected, b,
                                              memory_order_release, memory_order_relaxed)) {
    w->n--;
    w->c.transfers_out++;
  }
}

static void op_take(worker *w) {
  if (w->n == MAX_LOCAL) return;
  block *b = atomic_exchange_explicit(&g.exchange[pick(w, EXCHANGE_SLOTS)], NULL,
                                      memory_order_acquire);
  if (b == NULL) return;
  w->local[w->n++] = b;
  w->c.transfers_in++;
}

static void op_step(worker *w) {
  size_t done = 0;
  ok(w, sa_host_stream_step(stream_at((int)pick(w, (unsigned)g.streams)), 1 + pick(w, 8), &done),
     "sa_host_stream_step");
  w->c.steps++;
}

static void op_tune(worker *w) {
  sa_status st = pick(w, 2) ? sa_trim(g.f.arena, pick(w, 2) ? 0 : 64 * MiB)
                            : sa_defragment(g.f.arena);
  ok(w, st, "sa_trim/sa_defragment");
  sa_stats s;
  ok(w, sa_get_stats(g.f.arena, &s), "sa_get_stats");
  w->c.trims++;
}

static void *run_worker(void *arg) {
  worker *w = arg;
  sa_status st = sa_driver_open(SA_BACKEND_HOST, 0, &w->drv);
  if (st == SA_OK) st = w->drv->ops->event_create(w->drv, &w->ev);
  if (st != SA_OK) {
    failure(w, "driver events", st);
    return NULL;
  }
  for (long i = 0; i < g.ops; i++) {
    unsigned r = pick(w, 1000);
    if (r < 300) op_alloc(w);
    else if (r < 520) op_free(w);
    else if (r < 620) op_use(w);
    else if (r < 700) op_give(w);
    else if (r < 780) op_take(w);
    else if (r < 830) op_read(w);
    else if (r < 998) op_step(w);
    else op_tune(w);
    w->c.ops++;
  }
  while (w->n > 0) free_block(w, w->local[--w->n]);
  ok(w, sa_host_drain_all(), "sa_host_drain_all"); /* the event may still be pending */
  ok(w, w->drv->ops->event_destroy(w->drv, w->ev), "event_destroy");
  sa_driver_close(w->drv);
  return NULL;
}

static long env_long(const char *name, long fallback) {
  const char *v = getenv(name);
  if (v == NULL || *v == '\0') return fallback;
  char *end;
  long x = strtol(v, &end, 10);
  return *end == '\0' && x > 0 ? x : fallback;
}

static void stress(void **state) {
  (void)state;
  bool long_run = env_long("STREAMARENA_LONG", 0) > 0;
  g.threads = (int)env_long("STREAMARENA_STRESS_THREADS", long_run ? 16 : 8);
  g.streams = (int)env_long("STREAMARENA_STRESS_STREAMS", long_run ? 8 : 4);
  g.ops = env_long("STREAMARENA_STRESS_OPS", long_run ? 200000 : 8000);
  if (g.streams > MAX_STREAMS) g.streams = MAX_STREAMS;
  sa_assert_ok(sa_fixture_setup(&g.f, "max_physical=4GiB", (size_t)g.streams, SA_HOST_MANUAL));
  worker *w = calloc((size_t)g.threads, sizeof *w);
  assert_non_null(w);
  for (int i = 0; i < g.threads; i++) {
    w[i].id = (unsigned)i;
    w[i].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    assert_int_equal(pthread_create(&w[i].thread, NULL, run_worker, &w[i]), 0);
  }
  counts total = {0};
  for (int i = 0; i < g.threads; i++) {
    assert_int_equal(pthread_join(w[i].thread, NULL), 0);
    const uint64_t *src = (const uint64_t *)&w[i].c;
    uint64_t *dst = (uint64_t *)&total;
    for (size_t k = 0; k < sizeof total / sizeof(uint64_t); k++) dst[k] += src[k];
  }
  /* Blocks left in the exchange array are freed here, on another thread. */
  worker main_w = {.id = (unsigned)g.threads, .rng = 42};
  for (int i = 0; i < EXCHANGE_SLOTS; i++) {
    block *b = atomic_exchange(&g.exchange[i], NULL);
    if (b != NULL) free_block(&main_w, b);
  }
  total.frees += main_w.c.frees;
  total.cross_frees += main_w.c.cross_frees;
  total.failures += main_w.c.failures;
  sa_assert_ok(sa_host_drain_all());

  sa_stats s;
  sa_assert_ok(sa_get_stats(g.f.arena, &s));
  if (s.alloc_count != s.free_count || s.alloc_count != total.allocs || s.live_bytes != 0) {
    fprintf(stderr, "stress: stats: %llu allocs, %llu frees (counted %llu), live %zu bytes\n",
            (unsigned long long)s.alloc_count, (unsigned long long)s.free_count,
            (unsigned long long)total.allocs, s.live_bytes);
    total.failures++;
  }
  if (total.frees != total.allocs) {
    fprintf(stderr, "stress: %llu allocations, %llu frees\n", (unsigned long long)total.allocs,
            (unsigned long long)total.frees);
    total.failures++;
  }
  if (g.mismatches != 0) {
    fprintf(stderr, "stress: %llu words had the wrong contents\n",
            (unsigned long long)g.mismatches);
    total.failures++;
  }
  sa_status torn = sa_fixture_teardown(&g.f); /* leak and checker verdicts */
  if (torn != SA_OK) total.failures++;
  printf("stress: operations %llu (allocs %llu, frees %llu, cross-stream frees %llu, "
         "record_stream %llu, hand-overs %llu, uses on other streams %llu, kernel checks %llu, "
         "direct reads %llu, steps %llu, trims %llu, out of memory %llu), threads %d, "
         "streams %d, peak live %zu bytes, failures %llu\n",
         (unsigned long long)total.ops, (unsigned long long)total.allocs,
         (unsigned long long)total.frees, (unsigned long long)total.cross_frees,
         (unsigned long long)total.records, (unsigned long long)total.transfers_in,
         (unsigned long long)total.uses, (unsigned long long)total.checks,
         (unsigned long long)total.reads, (unsigned long long)total.steps,
         (unsigned long long)total.trims, (unsigned long long)total.oom, g.threads, g.streams,
         s.live_bytes_peak, (unsigned long long)total.failures);
  free(w);
  sa_assert_ok(torn);
  assert_int_equal(total.failures, 0);
  assert_int_equal(total.oom, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(stress)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
