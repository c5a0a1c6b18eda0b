/* Thread caches (src/thread_cache.c): one entry per (thread, arena,
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(destroy_never_touches_an_entry_it_handed_back),
      cmocka_unit_test(threads_on_other_arenas_while_one_is_destroyed_again_and_again),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  printf("thread_cache: threads %d, arenas destroyed under them %d, failures %d\n",
         RACE_THREADS, RACE_ROUNDS + 1, failed);
  return failed;
}
