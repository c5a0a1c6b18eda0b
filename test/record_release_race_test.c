/* sa_record_stream's stream released and destroyed while another thread
 * frees the recorded block on another stream.
 *
 * README, "Threads and streams": a stream named in sa_record_stream stays
 * alive until the block is freed, or is released before it is destroyed.
 * Here it is released before it is destroyed, by one thread, while another
 * thread frees the block on its own stream: the free has already taken the
 * block's record (sa__record_take) when sa_stream_release forgets the
 * records that name the stream, so the release finds nothing to forget and
 * returns, the stream is destroyed, and the free then calls the driver on
 * the destroyed stream (stream_validate and stream_id for a span's recorded
 * stream, event_record for a small block), which crashes inside libcuda on
 * a GPU and which the simulator counts as a violation.
 *
 * The interleaving is forced: the arena's driver operations are replaced by
 * a copy whose first call on the recorded stream from the freeing thread
 * pauses until the other thread's release (and then destroy) finished, or
 * 300 ms passed (a release that waits for the free: the fix).
 */
#include <errno.h>
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
#include <time.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "fixture.h"
#include "internal.h"
#include "test/util.h"

static struct {
  const sa_driver_ops *real;
  sa_driver_ops ops;
  sa_stream watched;   /* the recorded stream */
  pthread_t freer;     /* the thread whose call on it pauses */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool paused, go;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* The freeing thread's first driver call on the watched stream waits. */
static void maybe_pause(sa_stream s) {
  if (s != g.watched) return;
  pthread_mutex_lock(&g.mu); /* held while g.freer is written */
  if (!g.paused && pthread_equal(pthread_self(), g.freer)) {
    g.paused = true;
    pthread_cond_broadcast(&g.cv);
    while (!g.go) pthread_cond_wait(&g.cv, &g.mu);
  }
  pthread_mutex_unlock(&g.mu);
}

static sa_status hook_stream_validate(sa_driver *d, sa_stream s) {
  maybe_pause(s);
  return g.real->stream_validate(d, s);
}

static sa_status hook_event_record(sa_driver *d, sa_event e, sa_stream s) {
  maybe_pause(s);
  return g.real->event_record(d, e, s);
}

typedef struct freeing_s {
  void *p;
  sa_stream s;
  sa_status st;
} freeing;

static void *free_it(void *arg) {
  freeing *f = arg;
  f->st = sa_free(f->p, f->s);
  return NULL;
}

typedef struct releasing_s {
  sa_arena *arena;
  sa_stream s;
  sa_status st;
  _Atomic bool done;
} releasing;

static void *release_it(void *arg) {
  releasing *r = arg;
  r->st = sa_host_stream_drain(r->s);
  if (r->st == SA_OK) r->st = sa_stream_release(r->arena, r->s);
  if (r->st == SA_OK) r->st = sa_host_stream_destroy(r->s);
  atomic_store(&r->done, true);
  return NULL;
}

static void race(size_t size) {
  sa_fixture f;
  sa_assert_ok(sa_fixture_setup(&f, NULL, 1, SA_HOST_AUTO));
  sa_stream a = f.streams[0], k;
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &k));
  void *p;
  sa_assert_ok(sa_alloc(f.arena, &p, size, a));
  sa_assert_ok(sa_host_fill(a, p, 256, 0x1234));
  sa_assert_ok(sa_record_stream(p, k)); /* p is used on k too */
  sa_assert_ok(sa_host_fill(k, p, 256, 0x5678));

  g.real = f.arena->drv->ops;
  g.ops = *g.real;
  g.ops.stream_validate = hook_stream_validate;
  g.ops.event_record = hook_event_record;
  g.watched = k;
  g.paused = g.go = false;
  f.arena->drv->ops = &g.ops;

  freeing fr = {p, a, SA_ERR_INTERNAL};
  pthread_mutex_lock(&g.mu); /* g.freer is set before the thread's first call */
  assert_int_equal(pthread_create(&g.freer, NULL, free_it, &fr), 0);
  pthread_mutex_unlock(&g.mu);
  pthread_mutex_lock(&g.mu);
  while (!g.paused) pthread_cond_wait(&g.cv, &g.mu);
  pthread_mutex_unlock(&g.mu);

  /* The free took p's record and is about to use k: k's owner releases and
   * destroys it now. */
  releasing rel = {f.arena, k, SA_ERR_INTERNAL, false};
  pthread_t rt;
  assert_int_equal(pthread_create(&rt, NULL, release_it, &rel), 0);
  for (int i = 0; i < 300 && !atomic_load(&rel.done); i++) nanosleep(&(struct timespec){0, 1000000}, NULL);
  pthread_mutex_lock(&g.mu);
  g.go = true;
  pthread_cond_broadcast(&g.cv);
  pthread_mutex_unlock(&g.mu);
  assert_int_equal(pthread_join(g.freer, NULL), 0);
  assert_int_equal(pthread_join(rt, NULL), 0);
  f.arena->drv->ops = g.real;

  sa_host_counters now;
  sa_host_get_counters(&now);
  uint64_t violations = now.order_violations - f.before.order_violations;
  printf("record_release_race (%zu bytes): free %s, release %s, checker violations %llu\n", size,
         sa_status_string(fr.st), sa_status_string(rel.st), (unsigned long long)violations);
  sa_assert_ok(rel.st);
  sa_assert_ok(fr.st);
  assert_int_equal(violations, 0);
  sa_assert_ok(sa_fixture_teardown(&f));
}

static void span_freed_while_its_recorded_stream_is_released(void **state) {
  (void)state;
  race(4 * MiB);
}

static void small_block_freed_while_its_recorded_stream_is_released(void **state) {
  (void)state;
  race(4096);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(span_freed_while_its_recorded_stream_is_released),
      cmocka_unit_test(small_block_freed_while_its_recorded_stream_is_released),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
