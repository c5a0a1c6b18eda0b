/* The library loaded with dlopen, as a Python (ctypes) or framework plugin
 * loads it: its initial-exec thread-local (SA_TLS_FAST, src/internal.h)
 * must find room in glibc's static TLS, and alloc/free work from several
 * threads. This test is not linked with the library (test/BUILD.bazel): the
 * path of libstreamarena.so comes as an argument.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include <streamarena/streamarena.h>

static const char *lib_path;

typedef struct api_s {
  void (*config_init)(sa_config *);
  sa_status (*config_parse)(sa_config *, const char *, char *, size_t);
  sa_status (*arena_create)(const sa_config *, sa_arena **);
  sa_status (*arena_destroy)(sa_arena *);
  sa_status (*alloc)(sa_arena *, void **, size_t, sa_stream);
  sa_status (*free)(void *, sa_stream);
} api;

static api fns;
static sa_arena *arena;

static void *pairs(void *arg) {
  (void)arg;
  for (int i = 0; i < 10000; i++) {
    void *p;
    if (fns.alloc(arena, &p, 256 + (size_t)(i % 64) * 1024, NULL) != SA_OK) return (void *)1;
    if (fns.free(p, NULL) != SA_OK) return (void *)1;
  }
  return NULL;
}

static void dlopened_library_allocates_from_threads(void **state) {
  (void)state;
  if (lib_path == NULL) fail_msg("usage: dlopen_test PATH/libstreamarena.so");
  void *h = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) fail_msg("dlopen: %s", dlerror());
  *(void **)&fns.config_init = dlsym(h, "sa_config_init");
  *(void **)&fns.config_parse = dlsym(h, "sa_config_parse");
  *(void **)&fns.arena_create = dlsym(h, "sa_arena_create");
  *(void **)&fns.arena_destroy = dlsym(h, "sa_arena_destroy");
  *(void **)&fns.alloc = dlsym(h, "sa_alloc");
  *(void **)&fns.free = dlsym(h, "sa_free");
  assert_non_null(fns.config_init);
  assert_non_null(fns.config_parse);
  assert_non_null(fns.arena_create);
  assert_non_null(fns.arena_destroy);
  assert_non_null(fns.alloc);
  assert_non_null(fns.free);
  sa_config cfg;
  fns.config_init(&cfg);
  assert_int_equal(fns.config_parse(&cfg, "backend=host", NULL, 0), SA_OK);
  assert_int_equal(fns.arena_create(&cfg, &arena), SA_OK);
  pthread_t t[4];
  for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&t[i], NULL, pairs, NULL), 0);
  assert_null(pairs(NULL));
  for (int i = 0; i < 4; i++) {
    void *ret = (void *)2;
    assert_int_equal(pthread_join(t[i], &ret), 0);
    assert_null(ret);
  }
  assert_int_equal(fns.arena_destroy(arena), SA_OK);
  /* Not dlclosed: exited threads' destructors already ran, but the calling
   * thread's cache lives until it exits, with code in the library. */
}

int main(int argc, char **argv) {
  /* Bazel passes every file of //:streamarena; the shared library is ours. */
  for (int i = 1; i < argc; i++) {
    size_t n = strlen(argv[i]);
    if (n > 3 && strcmp(argv[i] + n - 3, ".so") == 0) lib_path = argv[i];
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(dlopened_library_allocates_from_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
