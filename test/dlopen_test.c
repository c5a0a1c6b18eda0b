/* The library loaded with dlopen, as a Python (ctypes) or framework plugin
 * loads it: its initial-exec thread-local (SA_TLS_FAST, src/small/thread_cache.h)
 * must find room in glibc's static TLS, alloc/free work from several
 * threads, and the library may be closed again while threads that used it
 * live on (the thread cache's key, src/small/thread_cache.c). This test is not
 * linked with the library (test/BUILD.bazel): the path of libstreamarena.so
 * comes as an argument.
 */
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* Every function of fns from h; false if one is missing. */
static bool look_up(void *h) {
  *(void **)&fns.config_init = dlsym(h, "sa_config_init");
  *(void **)&fns.config_parse = dlsym(h, "sa_config_parse");
  *(void **)&fns.arena_create = dlsym(h, "sa_arena_create");
  *(void **)&fns.arena_destroy = dlsym(h, "sa_arena_destroy");
  *(void **)&fns.alloc = dlsym(h, "sa_alloc");
  *(void **)&fns.free = dlsym(h, "sa_free");
  return fns.config_init != NULL && fns.config_parse != NULL && fns.arena_create != NULL &&
         fns.arena_destroy != NULL && fns.alloc != NULL && fns.free != NULL;
}

/* An arena on the host simulator through fns. */
static sa_status host_arena(sa_arena **out) {
  sa_config cfg;
  fns.config_init(&cfg);
  sa_status st = fns.config_parse(&cfg, "backend=host", NULL, 0);
  return st == SA_OK ? fns.arena_create(&cfg, out) : st;
}

static void dlopened_library_allocates_from_threads(void **state) {
  (void)state;
  if (lib_path == NULL) fail_msg("usage: dlopen_test PATH/libstreamarena.so");
  void *h = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) fail_msg("dlopen: %s", dlerror());
  assert_true(look_up(h));
  assert_int_equal(host_arena(&arena), SA_OK);
  pthread_t t[4];
  for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&t[i], NULL, pairs, NULL), 0);
  assert_null(pairs(NULL));
  for (int i = 0; i < 4; i++) {
    void *ret = (void *)2;
    assert_int_equal(pthread_join(t[i], &ret), 0);
    assert_null(ret);
  }
  assert_int_equal(fns.arena_destroy(arena), SA_OK);
  /* Not dlclosed: the cases below close copies of their own. */
}

/* ---- closing the library while threads that used it live on -------------
 *
 * Each case runs in a child process on a copy of the library of its own:
 * the case above leaves the library loaded in this process (dlopen of the
 * same file would only count a reference), and a crash at a thread's exit
 * must fail the case, not end the run. It runs twice: on the library as
 * built, linked with -z nodelete (BUILD.bazel), which dlclose leaves
 * mapped, and on a copy without the flag, as another build would make it,
 * which dlclose unmaps and whose destructor deletes the key
 * (src/small/thread_cache.c). */

/* The child's failure: said, and its exit status. */
#define CHILD_CHECK(cond)                                                          \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      fprintf(stderr, "dlopen_test child: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      _exit(1);                                                                    \
    }                                                                              \
  } while (0)

static char copy_path[4096];

/* Take DF_1_NODELETE out of the ELF file open as fd (as a build without -z
 * nodelete makes it); it must be there. */
static void clear_nodelete(int fd) {
  Elf64_Ehdr eh;
  CHILD_CHECK(pread(fd, &eh, sizeof eh, 0) == (ssize_t)sizeof eh);
  CHILD_CHECK(memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 && eh.e_ident[EI_CLASS] == ELFCLASS64);
  bool cleared = false;
  for (unsigned i = 0; i < eh.e_phnum; i++) {
    Elf64_Phdr ph;
    off_t at = (off_t)(eh.e_phoff + (uint64_t)i * eh.e_phentsize);
    CHILD_CHECK(pread(fd, &ph, sizeof ph, at) == (ssize_t)sizeof ph);
    if (ph.p_type != PT_DYNAMIC) continue;
    for (uint64_t off = ph.p_offset; off + sizeof(Elf64_Dyn) <= ph.p_offset + ph.p_filesz;
         off += sizeof(Elf64_Dyn)) {
      Elf64_Dyn d;
      CHILD_CHECK(pread(fd, &d, sizeof d, (off_t)off) == (ssize_t)sizeof d);
      if (d.d_tag == DT_NULL) break;
      if (d.d_tag != DT_FLAGS_1 || !(d.d_un.d_val & DF_1_NODELETE)) continue;
      d.d_un.d_val &= ~(Elf64_Xword)DF_1_NODELETE;
      CHILD_CHECK(pwrite(fd, &d, sizeof d, (off_t)off) == (ssize_t)sizeof d);
      cleared = true;
    }
  }
  CHILD_CHECK(cleared);
}

/* lib_path copied to a file of the test's own temporary directory, with
 * or without -z nodelete. */
static void copy_library(bool nodelete) {
  const char *dir = getenv("TEST_TMPDIR");
  snprintf(copy_path, sizeof copy_path, "%s/libstreamarena_copyXXXXXX.so",
           dir != NULL ? dir : "/tmp");
  int out = mkstemps(copy_path, 3);
  CHILD_CHECK(out >= 0);
  int in = open(lib_path, O_RDONLY);
  CHILD_CHECK(in >= 0);
  char buf[1 << 16];
  ssize_t n;
  while ((n = read(in, buf, sizeof buf)) > 0) CHILD_CHECK(write(out, buf, (size_t)n) == n);
  CHILD_CHECK(n == 0);
  if (!nodelete) clear_nodelete(out);
  close(in);
  close(out);
}

/* The copy, loaded and looked up. */
static void *load_copy(void) {
  void *h = dlopen(copy_path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) fprintf(stderr, "dlopen_test child: dlopen: %s\n", dlerror());
  CHILD_CHECK(h != NULL);
  CHILD_CHECK(look_up(h));
  return h;
}

/* Allocate and free through fns on arena: the calling thread gets a cache. */
static void use(sa_arena *a) {
  for (int i = 0; i < 100; i++) {
    void *p;
    CHILD_CHECK(fns.alloc(a, &p, 256 + (size_t)(i % 8) * 1024, NULL) == SA_OK);
    CHILD_CHECK(fns.free(p, NULL) == SA_OK);
  }
}

/* Run body in a child process on a copy of the library, as built and
 * without -z nodelete: the case fails unless both exit with 0. */
static void in_child(void (*body)(void)) {
  if (lib_path == NULL) fail_msg("usage: dlopen_test PATH/libstreamarena.so");
  for (int nodelete = 1; nodelete >= 0; nodelete--) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      /* A crash kills the child, to be named by the parent below: cmocka's
       * handlers, inherited, would report it as the parent's. */
      const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};
      for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++) signal(fatal[i], SIG_DFL);
      copy_library(nodelete);
      body();
      unlink(copy_path);
      _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    const char *copy = nodelete ? "as built" : "without -z nodelete";
    if (WIFSIGNALED(status)) fail_msg("the child (%s) died of signal %d", copy, WTERMSIG(status));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fail_msg("the child (%s) failed", copy);
  }
}

/* A worker that uses the library whenever the main thread says so. */
static struct {
  sem_t go, done;
  sa_arena *arena; /* NULL: exit */
} worker;

static void *work(void *arg) {
  (void)arg;
  for (;;) {
    while (sem_wait(&worker.go) != 0) {
    }
    if (worker.arena == NULL) return NULL; /* its thread-specific destructors run now */
    use(worker.arena);
    sem_post(&worker.done);
  }
}

/* The worker uses arena a once. */
static void worker_use(sa_arena *a) {
  worker.arena = a;
  sem_post(&worker.go);
  while (sem_wait(&worker.done) != 0) {
  }
}

static void worker_exit(pthread_t t) {
  worker.arena = NULL;
  sem_post(&worker.go);
  CHILD_CHECK(pthread_join(t, NULL) == 0);
}

static void exit_after_dlclose(void) {
  CHILD_CHECK(sem_init(&worker.go, 0, 0) == 0 && sem_init(&worker.done, 0, 0) == 0);
  pthread_t t;
  CHILD_CHECK(pthread_create(&t, NULL, work, NULL) == 0);
  void *h = load_copy();
  sa_arena *a;
  CHILD_CHECK(host_arena(&a) == SA_OK);
  worker_use(a);
  CHILD_CHECK(fns.arena_destroy(a) == SA_OK);
  CHILD_CHECK(dlclose(h) == 0);
  worker_exit(t);
}

/* The thread cache's pthread key was never deleted and the library not
 * pinned: after dlclose unmapped it, glibc called the key's destructor,
 * tcache_exit, at the exit of every thread that had used the library, in
 * unmapped code (SIGSEGV), although every arena had been destroyed. */
static void thread_exit_after_dlclose_does_not_crash(void **state) {
  (void)state;
  in_child(exit_after_dlclose);
}

static void use_after_reload(void) {
  CHILD_CHECK(sem_init(&worker.go, 0, 0) == 0 && sem_init(&worker.done, 0, 0) == 0);
  pthread_t t;
  CHILD_CHECK(pthread_create(&t, NULL, work, NULL) == 0);
  for (int round = 0; round < 3; round++) {
    void *h = load_copy();
    sa_arena *a;
    CHILD_CHECK(host_arena(&a) == SA_OK);
    worker_use(a);
    use(a);
    CHILD_CHECK(fns.arena_destroy(a) == SA_OK);
    CHILD_CHECK(dlclose(h) == 0);
  }
  worker_exit(t);
}

/* A thread that used the library, which was then closed and opened again,
 * uses it again and exits after the last close. Before the fix each load
 * was a new copy of the library with a new key, and the thread's exit
 * called the destructors of all of them, in unmapped code. */
static void a_thread_uses_the_library_again_after_a_reload(void **state) {
  (void)state;
  in_child(use_after_reload);
}

/* The pthread keys this process could still create. */
static int free_keys(void) {
  static pthread_key_t keys[4096];
  int n = 0;
  while (n < 4096 && pthread_key_create(&keys[n], NULL) == 0) n++;
  for (int i = 0; i < n; i++) pthread_key_delete(keys[i]);
  return n;
}

static void load_unload_cycles(void) {
  int before = free_keys();
  for (int round = 0; round < 16; round++) {
    void *h = load_copy();
    sa_arena *a;
    CHILD_CHECK(host_arena(&a) == SA_OK);
    use(a);
    CHILD_CHECK(fns.arena_destroy(a) == SA_OK);
    CHILD_CHECK(dlclose(h) == 0);
  }
  int after = free_keys();
  if (after < before - 1)
    fprintf(stderr, "dlopen_test child: %d pthread keys free before, %d after\n", before, after);
  CHILD_CHECK(after >= before - 1); /* the library's one key, at most */
}

/* Every load made a pthread key that no unload deleted: a process that
 * loads and unloads the library ran out of keys after about a thousand
 * rounds (PTHREAD_KEYS_MAX). */
static void repeated_load_and_unload_leaks_no_pthread_key(void **state) {
  (void)state;
  in_child(load_unload_cycles);
}

int main(int argc, char **argv) {
  /* Bazel passes every file of //:streamarena; the shared library is ours. */
  for (int i = 1; i < argc; i++) {
    size_t n = strlen(argv[i]);
    if (n > 3 && strcmp(argv[i] + n - 3, ".so") == 0) lib_path = argv[i];
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(dlopened_library_allocates_from_threads),
      cmocka_unit_test(thread_exit_after_dlclose_does_not_crash),
      cmocka_unit_test(a_thread_uses_the_library_again_after_a_reload),
      cmocka_unit_test(repeated_load_and_unload_leaks_no_pthread_key),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
