/* Thread caches (src/small/thread_cache.c): one entry per (thread, arena,
 * stream), and who may free an entry when its arena is destroyed while
 * its owner thread runs on another arena. */
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "fixture.h"
#include "internal.h"

static sa_arena *host_arena(void) {
  sa_config cfg;
  sa_config_init(&cfg);
  sa_assert_ok(sa_config_parse(&cfg, "backend=host", NULL, 0));
  sa_arena *a = NULL;
  sa_assert_ok(sa_arena_create(&cfg, &a));
  return a;
}

/* ---- destroy hands an entry back to its owner, and lets go of it -------- */

static struct {
  sem_t ready, go, done;
  atomic_int paused;  /* the hook paused destroy once */
  atomic_int failures;
} hk;

typedef struct owner_args_s {
  sa_arena *doomed, *other;
} owner_args;

/* Destroy has just handed the owner's entry back: let the owner free it
 * (its next slow path on any arena does) before destroy goes on. */
static void let_the_owner_free_its_entry(sa_hook_point point, void *arg) {
  (void)arg;
  if (point != SA_HOOK_ENTRY_DETACHED || atomic_exchange(&hk.paused, 1)) return;
  sem_post(&hk.go);
  sem_wait(&hk.done);
}

static void *entry_owner(void *arg) {
  owner_args *o = arg;
  void *p;
  /* An entry in each arena; the doomed one's is used last. */
  for (int i = 0; i < 2; i++) {
    sa_arena *a = i == 0 ? o->other : o->doomed;
    if (sa_alloc(a, &p, 4096, NULL) != SA_OK || sa_free(p, NULL) != SA_OK)
      atomic_fetch_add(&hk.failures, 1);
  }
  sem_post(&hk.ready);
  sem_wait(&hk.go);
  /* A slow path on another arena: finds its entry of the destroyed arena
   * detached and frees it. */
  if (sa_alloc(o->other, &p, 8192, NULL) != SA_OK || sa_free(p, NULL) != SA_OK)
    atomic_fetch_add(&hk.failures, 1);
  sem_post(&hk.done);
  return NULL;
}

/* Arena destroy used to clear an entry's arena and then read the entry's
 * list link; the owner, seeing the cleared arena, may free the entry in
 * between: a heap-use-after-free in sa__entries_detach (ASAN). The hook
 * pauses destroy at exactly that point until the owner freed the entry. */
static void destroy_never_touches_an_entry_it_handed_back(void **state) {
  (void)state;
  sem_init(&hk.ready, 0, 0);
  sem_init(&hk.go, 0, 0);
  sem_init(&hk.done, 0, 0);
  atomic_store(&hk.paused, 0);
  atomic_store(&hk.failures, 0);
  owner_args o = {host_arena(), host_arena()};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, entry_owner, &o), 0);
  sem_wait(&hk.ready);
  atomic_store(&sa__test_hook, let_the_owner_free_its_entry);
  sa_assert_ok(sa_arena_destroy(o.doomed));
  atomic_store(&sa__test_hook, NULL);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(atomic_load(&hk.paused), 1);
  assert_int_equal(atomic_load(&hk.failures), 0);
  sa_assert_ok(sa_arena_destroy(o.other));
  sem_destroy(&hk.ready);
  sem_destroy(&hk.go);
  sem_destroy(&hk.done);
}

/* ---- a free of another arena's block while the last one is destroyed --- */

static struct {
  sem_t window, destroyed;
  sa_arena *doomed;
  atomic_int paused; /* the free waited for the destroy once */
  atomic_int failures;
} fw;

/* sa_free's fast path holds the arena of the thread's last entry: the
 * doomed one's destroy runs to its end right there. */
static void destroy_the_arena_the_free_holds(sa_hook_point point, void *arg) {
  if (point != SA_HOOK_FREE_FAST_ARENA || arg != fw.doomed || atomic_exchange(&fw.paused, 1))
    return;
  sem_post(&fw.window);
  sem_wait(&fw.destroyed);
}

static void *free_other_arenas_block(void *arg) {
  sa_arena *kept = arg;
  void *kept_p, *p;
  if (sa_alloc(kept, &kept_p, 4096, NULL) != SA_OK) atomic_fetch_add(&fw.failures, 1);
  /* The last entry: the doomed arena's, on the same stream. */
  if (sa_alloc(fw.doomed, &p, 4096, NULL) != SA_OK || sa_free(p, NULL) != SA_OK)
    atomic_fetch_add(&fw.failures, 1);
  atomic_store(&sa__test_hook, destroy_the_arena_the_free_holds);
  if (sa_free(kept_p, NULL) != SA_OK) atomic_fetch_add(&fw.failures, 1);
  /* A free that never held the doomed arena lets the destroy go now. */
  if (!atomic_exchange(&fw.paused, 1)) {
    sem_post(&fw.window);
    sem_wait(&fw.destroyed);
  }
  return NULL;
}

/* The header lets another thread destroy an arena at any moment between
 * calls. sa_free's fast path read the arena of the thread's last entry and
 * its stream epoch and range before it knew the pointer was that arena's:
 * a free of another arena's block read a destroyed arena (ASAN
 * heap-use-after-free, TSAN). */
static void a_free_never_reads_an_arena_destroyed_by_another_thread(void **state) {
  (void)state;
  sem_init(&fw.window, 0, 0);
  sem_init(&fw.destroyed, 0, 0);
  atomic_store(&fw.paused, 0);
  atomic_store(&fw.failures, 0);
  fw.doomed = host_arena();
  sa_arena *kept = host_arena();
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, free_other_arenas_block, kept), 0);
  sem_wait(&fw.window);
  sa_assert_ok(sa_arena_destroy(fw.doomed));
  sem_post(&fw.destroyed);
  assert_int_equal(pthread_join(t, NULL), 0);
  atomic_store(&sa__test_hook, NULL);
  assert_int_equal(atomic_load(&fw.failures), 0);
  sa_assert_ok(sa_arena_destroy(kept)); /* its block was freed: none live */
  sem_destroy(&fw.window);
  sem_destroy(&fw.destroyed);
}

/* ---- the same race, undirected: many threads, several arenas ---------- */

#define RACE_THREADS 6
#define RACE_ROUNDS 40
#define RACE_OPS 200

static struct {
  pthread_barrier_t phase;
  sa_arena *keep[2];
  sa_arena *_Atomic doomed;
  atomic_int failures;
} race;

static void *racer(void *arg) {
  uintptr_t id = (uintptr_t)arg;
  for (int round = 0; round < RACE_ROUNDS; round++) {
    void *p;
    sa_arena *d = atomic_load(&race.doomed);
    if (sa_alloc(d, &p, 256 * (1 + id), NULL) != SA_OK || sa_free(p, NULL) != SA_OK)
      atomic_fetch_add(&race.failures, 1);
    pthread_barrier_wait(&race.phase); /* the doomed arena is destroyed now */
    for (int i = 0; i < RACE_OPS; i++) {
      /* Alternate arenas: every call is a slow path that walks the entries. */
      sa_arena *a = race.keep[i & 1];
      if (sa_alloc(a, &p, 512, NULL) != SA_OK || sa_free(p, NULL) != SA_OK)
        atomic_fetch_add(&race.failures, 1);
    }
    pthread_barrier_wait(&race.phase); /* a new doomed arena */
    pthread_barrier_wait(&race.phase);
  }
  return NULL;
}

static void threads_on_other_arenas_while_one_is_destroyed_again_and_again(void **state) {
  (void)state;
  race.keep[0] = host_arena();
  race.keep[1] = host_arena();
  atomic_store(&race.doomed, host_arena());
  atomic_store(&race.failures, 0);
  pthread_barrier_init(&race.phase, NULL, RACE_THREADS + 1);
  pthread_t t[RACE_THREADS];
  for (uintptr_t i = 0; i < RACE_THREADS; i++)
    assert_int_equal(pthread_create(&t[i], NULL, racer, (void *)i), 0);
  for (int round = 0; round < RACE_ROUNDS; round++) {
    pthread_barrier_wait(&race.phase);
    sa_assert_ok(sa_arena_destroy(atomic_load(&race.doomed)));
    pthread_barrier_wait(&race.phase);
    atomic_store(&race.doomed, host_arena());
    pthread_barrier_wait(&race.phase);
  }
  for (int i = 0; i < RACE_THREADS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  pthread_barrier_destroy(&race.phase);
  assert_int_equal(atomic_load(&race.failures), 0);
  sa_assert_ok(sa_arena_destroy(atomic_load(&race.doomed)));
  sa_assert_ok(sa_arena_destroy(race.keep[0]));
  sa_assert_ok(sa_arena_destroy(race.keep[1]));
}

/* ---- an out-of-memory callback that evicts the allocation's own entry -- */

#define CB_STREAMS SA_TCACHE_ENTRIES /* enough new entries to evict every old one */

static struct {
  sa_stream streams[CB_STREAMS];
  void *small[CB_STREAMS];
  void *hostage;
  int calls;
  atomic_int failures;
} cb;

/* Frees what the allocation waits for, each small block on a stream this
 * thread has not used: 64 new cache entries, the last evicting the entry of
 * the sa_alloc that called back. */
static int free_on_new_streams(sa_arena *a, size_t size, sa_stream s, void *ud) {
  (void)a, (void)size, (void)ud;
  if (cb.calls++ > 0) return 0;
  for (int i = 0; i < CB_STREAMS; i++)
    if (sa_free(cb.small[i], cb.streams[i]) != SA_OK) atomic_fetch_add(&cb.failures, 1);
  if (sa_free(cb.hostage, s) != SA_OK) atomic_fetch_add(&cb.failures, 1);
  return 1; /* try again */
}

static void *allocate_past_the_cap(void *arg) {
  sa_arena *a = arg; /* a fresh thread: its cache holds only what it does here */
  void *p = NULL;
  if (sa_alloc(a, &cb.hostage, 6u << 20, NULL) != SA_OK) atomic_fetch_add(&cb.failures, 1);
  for (int i = 0; i < CB_STREAMS; i++)
    if (sa_alloc(a, &cb.small[i], 256, NULL) != SA_OK) atomic_fetch_add(&cb.failures, 1);
  /* 6 MiB more under an 8 MiB cap: the callback runs, then the retry. */
  if (sa_alloc(a, &p, 6u << 20, NULL) != SA_OK) {
    atomic_fetch_add(&cb.failures, 1);
    return NULL;
  }
  /* On the stream it named: glibc gave the freed entry's memory to the
   * last new stream's entry, so the retry allocated on that stream. */
  sa_span *sp;
  if (sa__span_find(a, (uintptr_t)p, &sp) != SA_OK || sp->owner->stream != NULL)
    atomic_fetch_add(&cb.failures, 1);
  if (sa_free(p, NULL) != SA_OK) atomic_fetch_add(&cb.failures, 1);
  return NULL;
}

/* The header lets the out-of-memory callback call sa_free. sa_alloc held
 * its thread's cache entry across the callback, whose frees on new streams
 * evicted and freed that entry: the retry allocated through freed memory
 * (ASAN heap-use-after-free in alloc_reclaiming's try_alloc). */
static void an_oom_callback_may_evict_the_allocations_entry(void **state) {
  (void)state;
  sa_config cfg;
  sa_config_init(&cfg);
  sa_assert_ok(sa_config_parse(&cfg, "backend=host,max_physical=8MiB", NULL, 0));
  cfg.oom_callback = free_on_new_streams;
  sa_arena *a = NULL;
  sa_assert_ok(sa_arena_create(&cfg, &a));
  for (int i = 0; i < CB_STREAMS; i++)
    sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &cb.streams[i]));
  cb.calls = 0;
  atomic_store(&cb.failures, 0);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, allocate_past_the_cap, a), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(cb.calls, 1);
  assert_int_equal(atomic_load(&cb.failures), 0);
  sa_assert_ok(sa_arena_destroy(a)); /* nothing live */
  for (int i = 0; i < CB_STREAMS; i++) sa_assert_ok(sa_host_stream_destroy(cb.streams[i]));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(destroy_never_touches_an_entry_it_handed_back),
      cmocka_unit_test(a_free_never_reads_an_arena_destroyed_by_another_thread),
      cmocka_unit_test(threads_on_other_arenas_while_one_is_destroyed_again_and_again),
      cmocka_unit_test(an_oom_callback_may_evict_the_allocations_entry),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  printf("thread_cache: threads %d, arenas destroyed under them %d, failures %d\n",
         RACE_THREADS, RACE_ROUNDS + 1, failed);
  return failed;
}
