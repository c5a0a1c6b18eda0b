/* The default arenas behind sa_malloc_async (default_arena.c): configured by
 * STREAMARENA_CONF, whose errors are reported once, not on every call. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "fixture.h"

static int clear_env(void **state) {
  (void)state;
  unsetenv("STREAMARENA_CONF");
  unsetenv("STREAMARENA_BACKEND");
  sa_default_arenas_shutdown();
  return 0;
}

static void bad_conf_fails_every_call_with_one_message(void **state) {
  (void)state;
  setenv("STREAMARENA_CONF", "backend=host,superblock_sise=4MiB", 1);
  sa_fixture_stderr_begin();
  for (int i = 0; i < 5; i++) {
    void *p = (void *)&p;
    sa_assert_status(sa_malloc_async(&p, 4096, NULL), SA_ERR_BAD_CONFIG);
    assert_null(p);
  }
  char *err = sa_fixture_stderr_end();
  assert_non_null(err);
  assert_int_equal(sa_fixture_count(err, "STREAMARENA_CONF"), 1);
  assert_non_null(strstr(err, "streamarena: STREAMARENA_CONF: unknown key 'superblock_sise'"));
  free(err);
  /* Fixed, it is read again: the failure is not remembered. */
  setenv("STREAMARENA_CONF", "backend=host,superblock_size=4MiB", 1);
  void *p = NULL;
  sa_assert_ok(sa_malloc_async(&p, 4096, NULL));
  assert_non_null(p);
  sa_assert_ok(sa_free_async(p, NULL));
}

/* A value that parses but that sa_arena_create refuses: also once. */
static void conf_refused_at_create_has_one_message(void **state) {
  (void)state;
  setenv("STREAMARENA_CONF", "backend=host,superblock_size=3MiB", 1);
  sa_fixture_stderr_begin();
  for (int i = 0; i < 5; i++) {
    void *p = NULL;
    sa_assert_status(sa_malloc_async(&p, 4096, NULL), SA_ERR_BAD_CONFIG);
  }
  char *err = sa_fixture_stderr_end();
  assert_non_null(err);
  assert_int_equal(sa_fixture_count(err, "STREAMARENA_CONF"), 1);
  assert_non_null(strstr(err, "superblock_size"));
  free(err);
}

/* A bad STREAMARENA_BACKEND is the driver's to report (once, naming it):
 * it was reported as "STREAMARENA_CONF: backend=auto,device=0: bad
 * configuration", blaming a variable that was not even set. */
static void bad_backend_variable_is_not_blamed_on_conf(void **state) {
  (void)state;
  setenv("STREAMARENA_BACKEND", "gpu", 1);
  sa_fixture_stderr_begin();
  for (int i = 0; i < 3; i++) {
    void *p = NULL;
    sa_assert_status(sa_malloc_async(&p, 4096, NULL), SA_ERR_BAD_CONFIG);
  }
  char *err = sa_fixture_stderr_end();
  assert_non_null(err);
  if (strstr(err, "STREAMARENA_CONF") != NULL) fail_msg("blames STREAMARENA_CONF: %s", err);
  free(err);
  unsetenv("STREAMARENA_BACKEND");
  setenv("STREAMARENA_CONF", "backend=host", 1);
  void *p = NULL;
  sa_assert_ok(sa_malloc_async(&p, 4096, NULL));
  sa_assert_ok(sa_free_async(p, NULL));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(bad_conf_fails_every_call_with_one_message, clear_env,
                                      clear_env),
      cmocka_unit_test_setup_teardown(conf_refused_at_create_has_one_message, clear_env,
                                      clear_env),
      cmocka_unit_test_setup_teardown(bad_backend_variable_is_not_blamed_on_conf, clear_env,
                                      clear_env),
  };
  return cmocka_run_group_tests_name("default_arena", tests, NULL, NULL);
}
