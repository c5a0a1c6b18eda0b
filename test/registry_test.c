/* The arena registry (src/registry.c): a pointer finds its arena without a
 * lock, among any number of arenas, while other threads create and destroy
 * other arenas; a pointer of a destroyed arena, or one in an arena's
 * reservation but outside its range, is SA_ERR_INVALID_POINTER.
 */
#include <pthread.h>
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
#include "test/util.h"

static sa_arena *small_arena(void) {
  sa_arena *a = NULL;
  sa_assert_ok(sa_fixture_arena_create(&a, "backend=host,va_reserve=4MiB"));
  return a;
}

/* More arenas than the old fixed table held (256), each finding its own
 * pointers through the slow free path. */
static void every_arena_finds_its_pointers(void **state) {
  (void)state;
  enum { N = 300 };
  sa_arena **arenas = calloc(N, sizeof *arenas);
  void **ptrs = calloc(N, sizeof *ptrs);
  assert_non_null(arenas);
  assert_non_null(ptrs);
  for (int i = 0; i < N; i++) {
    arenas[i] = small_arena();
    sa_assert_ok(sa_alloc(arenas[i], &ptrs[i], 4096, NULL));
  }
  for (int i = 0; i < N; i++) {
    assert_ptr_equal(sa__arena_of((uintptr_t)ptrs[i]), arenas[i]);
    /* Past the range, inside the slot and the reservation: no block. */
    char *past = (char *)arenas[i]->range.base + arenas[i]->range.size;
    assert_null(sa__arena_of((uintptr_t)past));
    sa_assert_status(sa_free(past, NULL), SA_ERR_INVALID_POINTER);
  }
  for (int i = 0; i < N; i++) {
    sa_assert_ok(sa_free(ptrs[i], NULL));
    sa_stats st;
    sa_assert_ok(sa_get_stats(arenas[i], &st));
    assert_int_equal(st.free_count, 1);
  }
  for (int i = 0; i < N; i++) sa_assert_ok(sa_arena_destroy(arenas[i]));
  for (int i = 0; i < N; i++) {
    assert_null(sa__arena_of((uintptr_t)ptrs[i]));
    sa_assert_status(sa_free(ptrs[i], NULL), SA_ERR_INVALID_POINTER);
  }
  free(ptrs);
  free(arenas);
}

typedef struct {
  sa_fixture *f;
  atomic_int churning;
  unsigned long lookups;
} race_arg;

/* Arenas come and go while the other thread looks pointers up. */
static void *churn_arenas(void *arg) {
  race_arg *r = arg;
  for (int i = 0; i < 200; i++) {
    sa_arena *a = small_arena();
    void *q;
    sa_assert_ok(sa_alloc(a, &q, 4096, NULL));
    sa_assert_ok(sa_free(q, NULL));
    sa_assert_ok(sa_arena_destroy(a));
    sa_assert_status(sa_free(q, NULL), SA_ERR_INVALID_POINTER);
  }
  atomic_store(&r->churning, 0);
  return NULL;
}

/* Slow frees and sa_record_stream of one arena's blocks (each a lookup)
 * until the churn ends, and at least 1000 of them. */
static void *look_up(void *arg) {
  race_arg *r = arg;
  sa_fixture *f = r->f;
  sa_stream s1 = f->streams[0], s2 = f->streams[1];
  while (atomic_load(&r->churning) || r->lookups < 1000) {
    void *p;
    sa_assert_ok(sa_alloc(f->arena, &p, 4096, s1));
    sa_assert_ok(sa_record_stream(p, s2));
    sa_assert_ok(sa_free(p, s2)); /* recorded, another stream: the slow path */
    r->lookups += 2;
  }
  return NULL;
}

static void lookups_race_other_arenas_coming_and_going(void **state) {
  sa_fixture *f = *state;
  race_arg r = {f, 1, 0};
  pthread_t churn, look;
  assert_int_equal(pthread_create(&look, NULL, look_up, &r), 0);
  assert_int_equal(pthread_create(&churn, NULL, churn_arenas, &r), 0);
  assert_int_equal(pthread_join(churn, NULL), 0);
  assert_int_equal(pthread_join(look, NULL), 0);
  sa_stats st;
  sa_assert_ok(sa_get_stats(f->arena, &st));
  assert_int_equal(st.alloc_count, st.free_count);
}

static int setup(void **state) {
  sa_fixture *f = malloc(sizeof *f);
  if (f == NULL || sa_fixture_setup(f, NULL, 2, SA_HOST_AUTO) != SA_OK) {
    free(f);
    return -1;
  }
  *state = f;
  return 0;
}

static int teardown(void **state) { return sa_fixture_cmocka_teardown(state); }

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_arena_finds_its_pointers),
      cmocka_unit_test_setup_teardown(lookups_race_other_arenas_coming_and_going, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
