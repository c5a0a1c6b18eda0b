/* Backend selection and the CUDA backend's behaviour with and without a
 * driver (driver.c, driver/cuda.c).
 *
 * Correct on both kinds of machine: where libcuda is missing (CI) the CUDA
 * backend must say SA_ERR_NO_DEVICE cleanly and AUTO must fall back to the
 * host simulator; where a GPU is present the same calls must open CUDA. Each
 * test asks the machine first (cuda_present) and asserts the matching side.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/driver.h"
#include "fixture.h"

static int cuda_present(void) {
  int n = 0;
  return sa_driver_cuda_device_count(&n) == SA_OK;
}

static int clear_env(void **state) {
  (void)state;
  unsetenv("STREAMARENA_BACKEND");
  return 0;
}

static void device_count_matches_machine(void **state) {
  (void)state;
  int n = -7;
  sa_status st = sa_driver_cuda_device_count(&n);
  if (st == SA_OK) {
    assert_true(n > 0);
  } else {
    assert_int_equal(st, SA_ERR_NO_DEVICE);
    assert_int_equal(n, 0);
  }
  assert_int_equal(sa_driver_cuda_device_count(NULL), SA_ERR_INVALID_ARGUMENT);
}

static void cuda_open_is_clean_either_way(void **state) {
  (void)state;
  sa_driver *d = (sa_driver *)&d; /* not NULL: open must clear it */
  sa_status st = sa_driver_cuda_open(0, &d);
  if (!cuda_present()) {
    assert_int_equal(st, SA_ERR_NO_DEVICE);
    assert_null(d);
    const char *name = NULL;
    assert_int_not_equal(sa_last_driver_error(&name), 0); /* the cause is kept */
    assert_non_null(name);
    assert_true(strlen(name) > 0);
    return;
  }
  assert_int_equal(st, SA_OK);
  assert_non_null(d);
  assert_int_equal(d->backend, SA_BACKEND_CUDA);
  assert_string_equal(d->ops->name, "cuda");
  assert_int_equal(d->device, 0);
  assert_null(d->ops->check_handout);
  size_t g = 0, total = 0;
  assert_int_equal(d->ops->granularity(d, &g), SA_OK);
  assert_true(g >= 4096 && (g & (g - 1)) == 0);
  assert_int_equal(d->ops->total_memory(d, &total), SA_OK);
  assert_true(total >= g);
  sa_driver_close(d);
}

static void cuda_open_rejects_bad_arguments(void **state) {
  (void)state;
  sa_driver *d = NULL;
  assert_int_equal(sa_driver_cuda_open(0, NULL), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_driver_cuda_open(-1, &d), SA_ERR_INVALID_ARGUMENT);
  assert_null(d);
  /* No machine has a million GPUs: absent either way. */
  assert_int_equal(sa_driver_cuda_open(1 << 20, &d), SA_ERR_NO_DEVICE);
  assert_null(d);
}

static void *current_device_in_fresh_thread(void *arg) {
  int *dev = arg;
  *dev = 42;
  return (void *)(intptr_t)sa_driver_cuda_current_device(dev);
}

static void current_device_needs_a_context(void **state) {
  (void)state;
  assert_int_equal(sa_driver_cuda_current_device(NULL), SA_ERR_INVALID_ARGUMENT);
  /* A new thread has no current context on any machine. */
  pthread_t t;
  int dev = 0;
  void *ret = NULL;
  assert_int_equal(pthread_create(&t, NULL, current_device_in_fresh_thread, &dev), 0);
  assert_int_equal(pthread_join(t, &ret), 0);
  assert_int_equal((sa_status)(intptr_t)ret, SA_ERR_NO_DEVICE);
}

static void auto_picks_cuda_or_falls_back_to_host(void **state) {
  (void)state;
  sa_driver *d = NULL;
  assert_int_equal(sa_driver_open(SA_BACKEND_AUTO, 0, &d), SA_OK);
  assert_non_null(d);
  assert_int_equal(d->backend, cuda_present() ? SA_BACKEND_CUDA : SA_BACKEND_HOST);
  assert_string_equal(d->ops->name, cuda_present() ? "cuda" : "host");
  sa_driver_close(d);
}

static void auto_with_absent_ordinal_on_gpu_machine_is_no_device(void **state) {
  (void)state;
  if (!cuda_present()) skip(); /* the host simulator decides there */
  sa_driver *d = NULL;
  /* A GPU machine never silently hands out host memory. */
  assert_int_equal(sa_driver_open(SA_BACKEND_AUTO, 1 << 20, &d), SA_ERR_NO_DEVICE);
  assert_null(d);
}

static void env_host_forces_host(void **state) {
  (void)state;
  const char *values[] = {"host", "HOST"};
  for (size_t i = 0; i < 2; i++) {
    setenv("STREAMARENA_BACKEND", values[i], 1);
    sa_driver *d = NULL;
    assert_int_equal(sa_driver_open(SA_BACKEND_AUTO, 0, &d), SA_OK);
    assert_int_equal(d->backend, SA_BACKEND_HOST);
    sa_driver_close(d);
  }
}

static void env_cuda_forces_cuda_without_fallback(void **state) {
  (void)state;
  setenv("STREAMARENA_BACKEND", "cuda", 1);
  sa_driver *d = NULL;
  sa_status st = sa_driver_open(SA_BACKEND_AUTO, 0, &d);
  if (cuda_present()) {
    assert_int_equal(st, SA_OK);
    assert_int_equal(d->backend, SA_BACKEND_CUDA);
    sa_driver_close(d);
  } else {
    assert_int_equal(st, SA_ERR_NO_DEVICE);
    assert_null(d);
  }
}

static void env_auto_or_empty_means_auto(void **state) {
  (void)state;
  const char *values[] = {"auto", "", "Auto"};
  for (size_t i = 0; i < 3; i++) {
    setenv("STREAMARENA_BACKEND", values[i], 1);
    sa_driver *d = NULL;
    assert_int_equal(sa_driver_open(SA_BACKEND_AUTO, 0, &d), SA_OK);
    assert_int_equal(d->backend, cuda_present() ? SA_BACKEND_CUDA : SA_BACKEND_HOST);
    sa_driver_close(d);
  }
}

static void env_bad_value_is_rejected_with_one_message(void **state) {
  (void)state;
  const char *values[] = {"gpu", "cuda ", "hostt", "1"};
  sa_fixture_stderr_begin();
  for (size_t i = 0; i < 4; i++) {
    setenv("STREAMARENA_BACKEND", values[i], 1);
    sa_driver *d = (sa_driver *)&d;
    sa_assert_status(sa_driver_open(SA_BACKEND_AUTO, 0, &d), SA_ERR_BAD_CONFIG);
    assert_null(d);
    const char *name = NULL;
    assert_int_not_equal(sa_last_driver_error(&name), 0);
    assert_non_null(strstr(name, "STREAMARENA_BACKEND"));
  }
  char *err = sa_fixture_stderr_end();
  assert_non_null(err);
  /* Names the variable, the value and what it takes; once per process. */
  assert_int_equal(sa_fixture_count(err, "STREAMARENA_BACKEND"), 1);
  assert_non_null(strstr(err, "STREAMARENA_BACKEND=gpu: not a backend; it takes auto, cuda or host"));
  free(err);
}

static void the_driver_says_why_it_was_chosen(void **state) {
  (void)state;
  sa_driver *d = NULL;
  sa_assert_ok(sa_driver_open(SA_BACKEND_HOST, 0, &d));
  assert_string_equal(d->why, "backend set in the configuration");
  sa_driver_close(d);
  setenv("STREAMARENA_BACKEND", "host", 1);
  sa_assert_ok(sa_driver_open(SA_BACKEND_AUTO, 0, &d));
  assert_string_equal(d->why, "STREAMARENA_BACKEND=host");
  sa_driver_close(d);
  unsetenv("STREAMARENA_BACKEND");
  sa_assert_ok(sa_driver_open(SA_BACKEND_AUTO, 0, &d));
  if (cuda_present()) {
    assert_string_equal(d->why, "backend auto, CUDA usable");
  } else { /* the cause CUDA's open left, e.g. "libcuda.so.1 not found" */
    const char *cause = NULL;
    (void)sa_last_driver_error(&cause);
    char want[160];
    snprintf(want, sizeof want, "backend auto, CUDA not usable: %s", cause);
    assert_string_equal(d->why, want);
    assert_true(strlen(cause) > 0 && strcmp(cause, "no error") != 0);
  }
  sa_driver_close(d);
}

static void explicit_backend_ignores_env(void **state) {
  (void)state;
  setenv("STREAMARENA_BACKEND", "bogus", 1);
  sa_driver *d = NULL;
  assert_int_equal(sa_driver_open(SA_BACKEND_HOST, 0, &d), SA_OK);
  assert_int_equal(d->backend, SA_BACKEND_HOST);
  sa_driver_close(d);
  d = NULL;
  sa_status st = sa_driver_open(SA_BACKEND_CUDA, 0, &d);
  assert_int_equal(st, cuda_present() ? SA_OK : SA_ERR_NO_DEVICE);
  sa_driver_close(d); /* NULL is fine */
}

static void open_rejects_bad_arguments(void **state) {
  (void)state;
  sa_driver *d = (sa_driver *)&d;
  assert_int_equal(sa_driver_open(SA_BACKEND_AUTO, 0, NULL), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_driver_open((sa_backend)42, 0, &d), SA_ERR_INVALID_ARGUMENT);
  assert_null(d);
}

static void *read_last_error(void *arg) {
  const char **name = arg;
  return (void *)(intptr_t)sa_last_driver_error(name);
}

static void last_driver_error_is_per_thread(void **state) {
  (void)state;
  sa_driver_set_error(7, "SEVEN");
  pthread_t t;
  const char *other = NULL;
  void *code = NULL;
  assert_int_equal(pthread_create(&t, NULL, read_last_error, &other), 0);
  assert_int_equal(pthread_join(t, &code), 0);
  assert_int_equal((int)(intptr_t)code, 0);
  assert_non_null(other); /* a name even when nothing failed */
  const char *mine = NULL;
  assert_int_equal(sa_last_driver_error(&mine), 7);
  assert_string_equal(mine, "SEVEN");
  assert_int_equal(sa_last_driver_error(NULL), 7);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(device_count_matches_machine, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(cuda_open_is_clean_either_way, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(cuda_open_rejects_bad_arguments, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(current_device_needs_a_context, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(auto_picks_cuda_or_falls_back_to_host, clear_env,
                                      clear_env),
      cmocka_unit_test_setup_teardown(auto_with_absent_ordinal_on_gpu_machine_is_no_device,
                                      clear_env, clear_env),
      cmocka_unit_test_setup_teardown(env_host_forces_host, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(env_cuda_forces_cuda_without_fallback, clear_env,
                                      clear_env),
      cmocka_unit_test_setup_teardown(env_auto_or_empty_means_auto, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(env_bad_value_is_rejected_with_one_message, clear_env,
                                      clear_env),
      cmocka_unit_test_setup_teardown(the_driver_says_why_it_was_chosen, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(explicit_backend_ignores_env, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(open_rejects_bad_arguments, clear_env, clear_env),
      cmocka_unit_test_setup_teardown(last_driver_error_is_per_thread, clear_env, clear_env),
  };
  return cmocka_run_group_tests_name("cuda_nodriver", tests, NULL, NULL);
}
