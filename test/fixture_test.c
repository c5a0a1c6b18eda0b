/* The shared fixture itself: a clean run tears down with SA_OK, and a leak
 * of a block makes teardown say so. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

static void alloc_free_tears_down_clean(void **state) {
  sa_fixture *f = *state;
  void *p = NULL;
  sa_assert_ok(sa_alloc(f->arena, &p, 4096, f->streams[0]));
  assert_non_null(p);
  assert_int_equal((uintptr_t)p % SA_ALIGNMENT, 0);
  sa_assert_ok(sa_free(p, f->streams[0]));
  assert_int_equal(f->stream_count, 2);
  assert_int_equal(sa_arena_backend(f->arena), SA_BACKEND_HOST);
}

static void leaked_block_fails_teardown(void **state) {
  (void)state;
  sa_fixture f;
  sa_assert_ok(sa_fixture_setup(&f, "superblock_size=0", 1, SA_HOST_AUTO));
  void *p = NULL;
  sa_assert_ok(sa_alloc(f.arena, &p, 1000, f.streams[0]));
  /* Destroy releases the block too, and reports it. */
  sa_assert_status(sa_fixture_teardown(&f), SA_ERR_LIVE_BLOCKS);
}

static void bad_spec_is_reported(void **state) {
  (void)state;
  sa_fixture f;
  sa_assert_status(sa_fixture_setup(&f, "no_such_key=1", 1, SA_HOST_AUTO), SA_ERR_BAD_CONFIG);
  sa_assert_status(sa_fixture_setup(&f, NULL, SA_FIXTURE_MAX_STREAMS + 1, SA_HOST_AUTO),
                   SA_ERR_INVALID_ARGUMENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(alloc_free_tears_down_clean, sa_fixture_cmocka_setup,
                                      sa_fixture_cmocka_teardown),
      cmocka_unit_test(leaked_block_fails_teardown),
      cmocka_unit_test(bad_spec_is_reported),
  };
  return cmocka_run_group_tests_name("fixture", tests, NULL, NULL);
}
