/* The CUDA backend on a driver that lacks an entry point it needs (the fake
 * libcuda of fake_libcuda.c, given as argv[1], told by FAKE_CUDA_HIDE to
 * hide one): an arena is refused with SA_ERR_NO_DEVICE, and
 * sa_last_driver_error names the missing call, which is what a user with an
 * older driver needs to know. It said "lacks a required entry point". A
 * process of its own: libcuda is loaded once per process.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <streamarena/streamarena.h>

static void a_missing_entry_point_is_named(void **state) {
  (void)state;
  sa_config c;
  sa_config_init(&c);
  c.backend = SA_BACKEND_CUDA;
  sa_arena *a = NULL;
  assert_int_equal(sa_arena_create(&c, &a), SA_ERR_NO_DEVICE);
  assert_null(a);
  const char *why = NULL;
  (void)sa_last_driver_error(&why);
  assert_non_null(why);
  assert_non_null(strstr(why, "cuMemSetAccess"));
}

int main(int argc, char **argv) {
  /* Before the fake is loaded and before the library resolves anything. */
  if (setenv("FAKE_CUDA_HIDE", "cuMemSetAccess", 1) != 0) return 1;
  if (argc < 2 || dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) == NULL) {
    fprintf(stderr, "usage: %s path/to/fake/libcuda.so (%s)\n", argv[0], dlerror());
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_missing_entry_point_is_named),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
