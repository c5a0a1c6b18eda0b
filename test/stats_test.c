/* sa_get_stats: the numbers mean what streamarena.h says they mean, and a
 * snapshot taken while other threads move superblocks adds up
 * (superblocks_active + superblocks_empty == superblocks_total).
 */
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "fixture.h"
#include "internal.h"

#define MiB ((size_t)1 << 20)

static int setup(void **state) { return sa_fixture_cmocka_setup(state); }
static int teardown(void **state) { return sa_fixture_cmocka_teardown(state); }

static sa_stats stats_of(sa_arena *a) {
  sa_stats st;
  sa_assert_ok(sa_get_stats(a, &st));
  assert_int_equal(st.superblocks_active + st.superblocks_empty, st.superblocks_total);
  return st;
}

/* live_bytes: small blocks count their size class, large allocations the
 * bytes asked for. superblocks_active counts superblocks whose blocks a
 * thread cache holds, though nothing is live; a trim gives them back. */
static void live_bytes_and_superblocks_mean_what_the_header_says(void **state) {
  sa_fixture *f = *state;
  sa_stream s = f->streams[0];
  void *small, *large;
  sa_assert_ok(sa_alloc(f->arena, &small, 300, s));
  assert_int_equal(stats_of(f->arena).live_bytes, 512); /* the 512-byte class */
  sa_assert_ok(sa_alloc(f->arena, &large, 3 * MiB + 1, s));
  sa_stats st = stats_of(f->arena);
  assert_int_equal(st.live_bytes, 512 + 3 * MiB + 1);
  assert_int_equal(st.large_spans, 1);
  assert_int_equal(st.superblocks_active, 1);
  sa_assert_ok(sa_free(small, s));
  sa_assert_ok(sa_free(large, s));
  st = stats_of(f->arena);
  assert_int_equal(st.live_bytes, 0);
  assert_int_equal(st.live_bytes_peak, 512 + 3 * MiB + 1);
  assert_int_equal(st.large_spans, 0);
  assert_int_equal(st.superblocks_active, 1); /* its blocks are in this thread's cache */
  sa_assert_ok(sa_trim(f->arena, 0));
  st = stats_of(f->arena);
  assert_int_equal(st.superblocks_total, 0);
  assert_int_equal(st.superblocks_active, 0);
  assert_int_equal(st.reserved_bytes, 0);
  assert_int_equal(st.cached_bytes, 0);
}

typedef struct {
  sa_arena *arena;
  sa_stats stats;
  int done;
} reader_arg;

static void *get_stats(void *arg) {
  reader_arg *r = arg;
  sa_assert_ok(sa_get_stats(r->arena, &r->stats));
  __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* Until the reader is done or blocked on m. glibc: the word of a locked
 * normal mutex turns 2 once a thread blocks on it. Deterministic, where a
 * sleep would only make it likely. Returns whether it blocked. */
static int wait_until_done_or_blocked_on(reader_arg *r, pthread_mutex_t *m) {
  for (;;) {
    if (__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) return 0;
    if (__atomic_load_n(&m->__data.__lock, __ATOMIC_ACQUIRE) == 2) return 1;
    sched_yield();
  }
}

/* Stats counted each stream's empty superblocks under its lock, then the
 * global stack's: a superblock that moved from a stream already counted
 * to the global stack in between was counted twice, and
 * superblocks_active (total - empty) wrapped around to SIZE_MAX - 0. Here
 * the reader is held on the second stream while the first one's empty
 * superblock goes global. */
static void stats_never_count_a_superblock_twice(void **state) {
  sa_fixture *f = *state;
  sa_stream s1 = f->streams[0], s2 = f->streams[1];
  /* An empty superblock on each; s1's stream arena first: stats reads s2
   * first. */
  sa_assert_ok(sa_fixture_alloc_free_on_thread(f->arena, 4096, 1, s1));
  sa_assert_ok(sa_fixture_alloc_free_on_thread(f->arena, 4096, 1, s2));
  sa_stream_arena *sa1, *sa2;
  sa_assert_ok(sa__stream_arena_get(f->arena, s1, &sa1));
  sa_assert_ok(sa__stream_arena_get(f->arena, s2, &sa2));
  assert_ptr_equal(f->arena->streams, sa2);

  reader_arg r = {f->arena, {0}, 0};
  pthread_t reader;
  pthread_mutex_lock(&sa1->lock);
  assert_int_equal(pthread_create(&reader, NULL, get_stats, &r), 0);
  /* A reader that takes the streams' locks one by one is past s2 when it
   * blocks on s1: move s2's empty superblock to the global stack then. */
  if (wait_until_done_or_blocked_on(&r, &sa1->lock) &&
      pthread_mutex_trylock(&sa2->lock) == 0) {
    pthread_mutex_unlock(&sa2->lock);
    sa__stream_arena_shed(sa2, true);
  }
  pthread_mutex_unlock(&sa1->lock);
  assert_int_equal(pthread_join(reader, NULL), 0);
  sa_stats st = r.stats;
  assert_int_equal(st.superblocks_total, 2);
  assert_int_equal(st.superblocks_empty, 2);
  assert_int_equal(st.superblocks_active, 0);
  assert_int_equal(st.cached_bytes, st.reserved_bytes); /* nothing live */
  assert_true(st.reserved_bytes > 0);
  sa__stream_arena_unbind(sa1);
  sa__stream_arena_unbind(sa2);
}

/* A thread whose entry retires (it exits) while sa_get_stats counts. */
#define EXITING_PAIRS 100
static struct {
  sa_arena *arena;
  sa_stream stream;
  sem_t ready, go;
  pthread_t thread;
  atomic_int fired, failures;
} ex;

static void *exiting_thread(void *arg) {
  (void)arg;
  for (int i = 0; i < EXITING_PAIRS; i++) {
    void *p;
    if (sa_alloc(ex.arena, &p, 256, ex.stream) != SA_OK || sa_free(p, ex.stream) != SA_OK)
      atomic_fetch_add(&ex.failures, 1);
  }
  sem_post(&ex.ready);
  sem_wait(&ex.go);
  return NULL; /* its exit retires its entry */
}

static void let_the_thread_exit(sa_hook_point point, void *arg) {
  (void)arg;
  if (point != SA_HOOK_FAST_COUNTS || atomic_exchange(&ex.fired, 1)) return;
  sem_post(&ex.go);
  pthread_join(ex.thread, NULL);
}

/* Stats read the exited threads' fast-path counts, then walked the live
 * entries under the lock a retirement takes: an entry retired in between
 * was counted in neither, and 99 of the thread's 100 allocations went
 * missing from alloc_count. */
static void a_thread_exiting_during_stats_is_counted(void **state) {
  sa_fixture *f = *state;
  sa_stats before = stats_of(f->arena);
  ex.arena = f->arena;
  ex.stream = f->streams[0];
  atomic_store(&ex.fired, 0);
  atomic_store(&ex.failures, 0);
  sem_init(&ex.ready, 0, 0);
  sem_init(&ex.go, 0, 0);
  assert_int_equal(pthread_create(&ex.thread, NULL, exiting_thread, NULL), 0);
  sem_wait(&ex.ready);
  atomic_store(&sa__test_hook, let_the_thread_exit);
  sa_stats st;
  sa_status got = sa_get_stats(f->arena, &st);
  atomic_store(&sa__test_hook, NULL);
  if (!atomic_load(&ex.fired)) { /* the hook never ran: do not leave the thread */
    sem_post(&ex.go);
    pthread_join(ex.thread, NULL);
  }
  sem_destroy(&ex.ready);
  sem_destroy(&ex.go);
  sa_assert_ok(got);
  assert_int_equal(atomic_load(&ex.fired), 1);
  assert_int_equal(atomic_load(&ex.failures), 0);
  assert_int_equal(st.alloc_count - before.alloc_count, EXITING_PAIRS);
  assert_int_equal(st.free_count - before.free_count, EXITING_PAIRS);
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(live_bytes_and_superblocks_mean_what_the_header_says),
      T(stats_never_count_a_superblock_twice),
      T(a_thread_exiting_during_stats_is_counted),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
