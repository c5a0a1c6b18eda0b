/* Two threads meet a destroyed stream's handle, reused by a new stream, at
 * once.
 *
 * A stream is destroyed without sa_stream_release (the README allows it once
 * the stream is synchronized) and a new stream gets its handle. The first
 * lookup of the handle on each thread finds the old stream arena, sees the
 * driver's stream id changed, unlocks the arena and marks the old stream
 * arena gone. If another thread marks it gone first, reaps it (nothing
 * refers to it any more) and creates the new stream's arena, the first
 * thread's mark_gone then works on freed memory: a heap-use-after-free
 * (ASan), and where malloc hands the same memory to the new stream arena,
 * the new stream's live arena is marked gone (the stream epoch moves twice).
 *
 * SA_HOOK_HANDLE_REUSED pauses the first thread between the lookup and
 * mark_gone while the second goes through.
 */
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "fixture.h"
#include "internal.h"

static struct {
  sem_t paused, go;
  atomic_int once;
} hk;

static void pause_first(sa_hook_point point, void *arg) {
  (void)arg;
  if (point != SA_HOOK_HANDLE_REUSED || atomic_exchange(&hk.once, 1)) return;
  sem_post(&hk.paused);
  sem_wait(&hk.go);
}

typedef struct user_s {
  sa_arena *arena;
  sa_stream s;
  sa_status st;
} user;

static void *alloc_and_free(void *arg) {
  user *u = arg;
  void *p;
  u->st = sa_alloc(u->arena, &p, 4096, u->s);
  if (u->st == SA_OK) u->st = sa_free(p, u->s);
  return NULL;
}

static void two_threads_find_a_reused_handle_at_once(void **state) {
  (void)state;
  sa_fixture f;
  sa_assert_ok(sa_fixture_setup(&f, NULL, 0, SA_HOST_AUTO));
  sa_stream old, s;
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &old));
  /* A stream arena for old, which a thread used and left. */
  sa_assert_ok(sa_fixture_alloc_free_on_thread(f.arena, 4096, 4, old));
  sa_assert_ok(sa_host_stream_drain(old));
  sa_assert_ok(sa_host_stream_destroy(old)); /* synchronized: no release needed */
  sa_assert_ok(sa_trim(f.arena, 0)); /* its empty superblock goes: nothing pins it */
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &s));
  if (s != old) skip(); /* the simulator hands the old handle to the next stream */

  sem_init(&hk.paused, 0, 0);
  sem_init(&hk.go, 0, 0);
  atomic_store(&hk.once, 0);
  uint64_t epoch = atomic_load(&f.arena->xstream_epoch);
  atomic_store(&sa__test_hook, pause_first);
  user first = {f.arena, s, SA_ERR_INTERNAL};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, alloc_and_free, &first), 0);
  sem_wait(&hk.paused); /* the first thread found the old stream arena */
  user second = {f.arena, s, SA_ERR_INTERNAL};
  alloc_and_free(&second); /* marks it gone, reaps it, makes the new one */
  sem_post(&hk.go);
  assert_int_equal(pthread_join(t, NULL), 0);
  atomic_store(&sa__test_hook, NULL);
  uint64_t moved = atomic_load(&f.arena->xstream_epoch) - epoch;
  printf("handle_reuse_race: first %s, second %s, stream arenas gone: %llu (1 expected)\n",
         sa_status_string(first.st), sa_status_string(second.st), (unsigned long long)moved);
  sa_assert_ok(first.st);
  sa_assert_ok(second.st);
  assert_int_equal(moved, 1); /* the old stream arena only */
  sa_assert_ok(sa_host_stream_drain(s));
  sa_assert_ok(sa_stream_release(f.arena, s));
  sa_assert_ok(sa_host_stream_destroy(s));
  sem_destroy(&hk.paused);
  sem_destroy(&hk.go);
  sa_assert_ok(sa_fixture_teardown(&f));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(two_threads_find_a_reused_handle_at_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
