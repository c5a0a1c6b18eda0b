/* Stress of stream lifetimes on the host simulator: waves of threads
 * allocate on a few streams, free on others, hand blocks to each other and
 * exit with blocks in their caches and open cross-stream batches, while
 * streams are destroyed along the way, half of them without
 * sa_stream_release, as a worker that synchronizes and destroys its stream
 * does (the simulator hands each destroyed handle to the next stream,
 * as CUDA reuses handles). Blocks of a destroyed stream are freed later by
 * other threads on other streams.
 *
 * Every block carries a pattern written by a simulated kernel and checked
 * by one before its free; the stream-order checker is on, and a driver call
 * on a destroyed stream is a checker violation. At the end everything comes
 * back: no live bytes, and after sa_trim no physical memory.
 *
 * Scale: STREAMARENA_LONG=1 runs more waves and operations.
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

#include "fixture.h"
#include "test/util.h"

#define SLOTS 4        /* streams alive at any time */
#define THREADS 6      /* per wave */
#define MAX_LOCAL 24   /* blocks a thread holds */
#define EXCHANGE 128   /* blocks between threads (and waves) */
#define EDGE 1024      /* bytes written and checked at a block's start */

typedef struct block_s {
  void *p;
  size_t size;
  int slot;         /* the stream slot it was written on */
  uint32_t pattern;
} block;

/* A stream slot: the stream in it is replaced under the write lock; every
 * use of it (allocation, kernels, frees, steps) holds the read lock. */
typedef struct slot_s {
  pthread_rwlock_t lock;
  sa_stream s;
} slot;

typedef struct counts_s {
  uint64_t ops, allocs, frees, cross_frees, handed, replaced, unreleased, steps, trims,
      checks, failures;
} counts;

static struct {
  sa_fixture f;
  slot slots[SLOTS];
  _Atomic(void *) exchange[EXCHANGE]; /* blocks handed between threads */
  _Atomic uint32_t next_pattern;
  uint64_t mismatches; /* written by check kernels under the simulator lock */
  long ops;
  int waves;
} g;

typedef struct worker_s {
  pthread_t thread;
  uint64_t rng;
  void *local[MAX_LOCAL]; /* blocks */
  int n;
  counts c;
} worker;

static unsigned pick(worker *w, unsigned n) { return sa_fixture_pick(&w->rng, n); }

static void ok(worker *w, sa_status st, const char *what) {
  if (st == SA_OK) return;
  fprintf(stderr, "lifetime_stress: %s: %s\n", what, sa_status_string(st));
  w->c.failures++;
}

static size_t edge(const block *b) { return (b->size < EDGE ? b->size : EDGE) & ~(size_t)3; }

static void op_alloc(worker *w) {
  if (w->n == MAX_LOCAL) return;
  block *b = malloc(sizeof *b);
  if (b == NULL) return;
  unsigned r = pick(w, 100);
  b->size = r < 80 ? 1 + pick(w, 24 * KiB) : r < 97 ? 64 * KiB + pick(w, 900 * KiB)
                                                   : MiB + pick(w, 3 * MiB);
  b->slot = (int)pick(w, SLOTS);
  b->pattern = atomic_fetch_add(&g.next_pattern, 1);
  slot *sl = &g.slots[b->slot];
  pthread_rwlock_rdlock(&sl->lock);
  sa_status st = sa_alloc(g.f.arena, &b->p, b->size, sl->s);
  if (st == SA_OK && edge(b) > 0) ok(w, sa_host_fill(sl->s, b->p, edge(b), b->pattern), "fill");
  pthread_rwlock_unlock(&sl->lock);
  if (st != SA_OK) {
    ok(w, st, "sa_alloc");
    free(b);
    return;
  }
  w->c.allocs++;
  w->local[w->n++] = b;
}

/* Check b on the stream of its slot (a replaced stream was drained first),
 * then free it there or on another slot's stream, which must then be
 * ordered after the check: sa_record_stream. */
static void free_block(worker *w, block *b) {
  int i = b->slot, j = pick(w, 2) ? i : (int)pick(w, SLOTS);
  int lo = i < j ? i : j, hi = i < j ? j : i;
  pthread_rwlock_rdlock(&g.slots[lo].lock);
  if (hi != lo) pthread_rwlock_rdlock(&g.slots[hi].lock);
  sa_stream si = g.slots[i].s, sj = g.slots[j].s;
  if (edge(b) > 0) {
    ok(w, sa_host_check(si, b->p, edge(b), b->pattern, &g.mismatches), "check");
    w->c.checks++;
  }
  if (j != i) {
    ok(w, sa_record_stream(b->p, si), "sa_record_stream");
    w->c.cross_frees++;
  }
  ok(w, sa_free(b->p, sj), "sa_free");
  if (hi != lo) pthread_rwlock_unlock(&g.slots[hi].lock);
  pthread_rwlock_unlock(&g.slots[lo].lock);
  w->c.frees++;
  free(b);
}

static void op_free(worker *w) {
  block *b = sa_fixture_take_local(w->local, &w->n, &w->rng);
  if (b != NULL) free_block(w, b);
}

static void op_give(worker *w) {
  if (w->n == 0 || !sa_fixture_give(g.exchange, EXCHANGE, &w->rng, w->local[w->n - 1])) return;
  w->n--;
  w->c.handed++;
}

static void op_take(worker *w) {
  if (w->n == MAX_LOCAL) return;
  block *b = sa_fixture_take(g.exchange, EXCHANGE, &w->rng);
  if (b != NULL) w->local[w->n++] = b;
}

/* The user's side of a stream's end: synchronize, destroy (half the time
 * without sa_stream_release), and a new stream in its place, which the
 * simulator gives the same handle. */
static void op_replace(worker *w) {
  slot *sl = &g.slots[pick(w, SLOTS)];
  pthread_rwlock_wrlock(&sl->lock);
  ok(w, sa_host_stream_drain(sl->s), "drain");
  if (pick(w, 2))
    ok(w, sa_stream_release(g.f.arena, sl->s), "sa_stream_release");
  else
    w->c.unreleased++;
  ok(w, sa_host_stream_destroy(sl->s), "sa_host_stream_destroy");
  ok(w, sa_host_stream_create(pick(w, 2) ? SA_HOST_MANUAL : SA_HOST_AUTO, &sl->s), "create");
  pthread_rwlock_unlock(&sl->lock);
  w->c.replaced++;
}

static void op_step(worker *w) {
  slot *sl = &g.slots[pick(w, SLOTS)];
  pthread_rwlock_rdlock(&sl->lock);
  ok(w, sa_host_stream_step(sl->s, 1 + pick(w, 6), NULL), "step");
  pthread_rwlock_unlock(&sl->lock);
  w->c.steps++;
}

static void *run_worker(void *arg) {
  worker *w = arg;
  for (long i = 0; i < g.ops; i++) {
    unsigned r = pick(w, 1000);
    if (r < 330) op_alloc(w);
    else if (r < 620) op_free(w);
    else if (r < 700) op_give(w);
    else if (r < 780) op_take(w);
    else if (r < 795) op_replace(w);
    else if (r < 997) op_step(w);
    else {
      ok(w, pick(w, 2) ? sa_trim(g.f.arena, 0) : sa_defragment(g.f.arena), "trim");
      w->c.trims++;
    }
    w->c.ops++;
  }
  /* Leave: some blocks for the next wave, the rest freed; whatever the
   * thread cached and its open batches go back as it exits. */
  while (w->n > 0) {
    block *b = w->local[--w->n];
    if (!sa_fixture_give(g.exchange, EXCHANGE, &w->rng, b)) free_block(w, b);
  }
  return NULL;
}

static long env_long(const char *name, long fallback) {
  const char *v = getenv(name);
  if (v == NULL || *v == '\0') return fallback;
  long x = strtol(v, NULL, 10);
  return x > 0 ? x : fallback;
}

static void streams_die_under_threads_that_free_into_them_and_exit(void **state) {
  (void)state;
  bool long_run = env_long("STREAMARENA_LONG", 0) > 0;
  g.waves = long_run ? 40 : 6;
  g.ops = long_run ? 20000 : 1500;
  sa_assert_ok(sa_fixture_setup(&g.f, "max_physical=1GiB", 0, SA_HOST_MANUAL));
  for (int i = 0; i < SLOTS; i++) {
    pthread_rwlock_init(&g.slots[i].lock, NULL);
    sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &g.slots[i].s));
  }
  counts total = {0};
  for (int wave = 0; wave < g.waves; wave++) {
    worker w[THREADS];
    memset(w, 0, sizeof w);
    for (int t = 0; t < THREADS; t++) {
      w[t].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(wave * THREADS + t + 1);
      assert_int_equal(pthread_create(&w[t].thread, NULL, run_worker, &w[t]), 0);
    }
    for (int t = 0; t < THREADS; t++) {
      assert_int_equal(pthread_join(w[t].thread, NULL), 0);
      uint64_t *dst = (uint64_t *)&total, *src = (uint64_t *)&w[t].c;
      for (size_t k = 0; k < sizeof total / sizeof *dst; k++) dst[k] += src[k];
    }
  }
  /* What the last wave left: freed here, on the block's own slot. */
  worker me = {.rng = 1};
  for (int i = 0; i < EXCHANGE; i++) {
    block *b = atomic_exchange(&g.exchange[i], NULL);
    if (b != NULL) free_block(&me, b);
  }
  for (size_t k = 0; k < sizeof total / sizeof(uint64_t); k++)
    ((uint64_t *)&total)[k] += ((uint64_t *)&me.c)[k];
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_trim(g.f.arena, 0));
  sa_stats st;
  sa_assert_ok(sa_get_stats(g.f.arena, &st));
  sa_host_counters hc;
  sa_host_get_counters(&hc);
  uint64_t violations = hc.order_violations - g.f.before.order_violations;
  printf("lifetime_stress: operations %llu (allocs %llu, frees %llu, cross-stream frees %llu, "
         "hand-overs %llu, steps %llu, trims %llu), streams destroyed %llu (%llu without "
         "sa_stream_release), threads %d (%d waves of %d, each exiting with cached blocks), "
         "checks %llu, words wrong %llu, checker violations %llu, after trim: live %zu, "
         "reserved %zu, deferred %zu, failures %llu\n",
         (unsigned long long)total.ops, (unsigned long long)total.allocs,
         (unsigned long long)total.frees, (unsigned long long)total.cross_frees,
         (unsigned long long)total.handed, (unsigned long long)total.steps,
         (unsigned long long)total.trims, (unsigned long long)total.replaced,
         (unsigned long long)total.unreleased, g.waves * THREADS, g.waves, THREADS,
         (unsigned long long)total.checks, (unsigned long long)g.mismatches,
         (unsigned long long)violations, st.live_bytes, st.reserved_bytes, st.deferred_frees,
         (unsigned long long)total.failures);
  assert_int_equal(total.failures, 0);
  assert_int_equal(g.mismatches, 0);
  assert_int_equal(st.live_bytes, 0);
  assert_int_equal(st.reserved_bytes, 0);
  assert_int_equal(st.deferred_frees, 0);
  assert_true(total.unreleased > 0);
  for (int i = 0; i < SLOTS; i++) {
    sa_assert_ok(sa_stream_release(g.f.arena, g.slots[i].s));
    sa_assert_ok(sa_host_stream_destroy(g.slots[i].s));
    pthread_rwlock_destroy(&g.slots[i].lock);
  }
  sa_assert_ok(sa_fixture_teardown(&g.f)); /* violations, leaks */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(streams_die_under_threads_that_free_into_them_and_exit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
