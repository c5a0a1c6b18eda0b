/* The thread cache's pthread key (src/small/thread_cache.c) when the process has
 * none left: its own test binary, since the key is made once per process,
 * at the first thread cache. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include <streamarena/streamarena.h>

#include "fixture.h"

#define MAX_KEYS 4096

static pthread_key_t keys[MAX_KEYS];
static int nkeys;
static int mine; /* the value this test sets on each of its keys */
static atomic_int foreign; /* destructor calls with a value that is not the test's */

static void check_value(void *v) {
  if (v != &mine) atomic_fetch_add(&foreign, 1);
}

static sa_arena *arena;
static sa_status got;
static atomic_int clobbered;

static void *use_the_library(void *arg) {
  (void)arg;
  for (int i = 0; i < nkeys; i++) pthread_setspecific(keys[i], &mine);
  void *p = NULL;
  got = sa_alloc(arena, &p, 256, NULL);
  if (got == SA_OK) (void)sa_free(p, NULL);
  for (int i = 0; i < nkeys; i++)
    if (pthread_getspecific(keys[i]) != &mine) atomic_fetch_add(&clobbered, 1);
  return NULL; /* the keys' destructors run now */
}

/* With every key taken, the thread cache's key was never made and the cache
 * went into key 0 (the key variable's zero), another owner's slot: that
 * owner's value was lost and its destructor got the cache. */
static void a_full_key_table_fails_the_call_and_touches_no_other_key(void **state) {
  (void)state;
  sa_assert_ok(sa_fixture_arena_create(&arena, "backend=host"));
  while (nkeys < MAX_KEYS && pthread_key_create(&keys[nkeys], check_value) == 0) nkeys++;
  assert_true(nkeys < MAX_KEYS); /* the table is full */
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, use_the_library, NULL), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  for (int i = 0; i < nkeys; i++) pthread_key_delete(keys[i]);
  assert_int_equal(atomic_load(&clobbered), 0);
  assert_int_equal(atomic_load(&foreign), 0);
  assert_int_equal(got, SA_ERR_OUT_OF_MEMORY); /* no cache: said, not hidden */
  sa_assert_ok(sa_arena_destroy(arena));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_full_key_table_fails_the_call_and_touches_no_other_key),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
