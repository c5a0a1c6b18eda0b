/* The CUDA backend (driver/cuda.c) and the allocator above it on a fake
 * libcuda (fake_libcuda.c, given as argv[1] and loaded before the library
 * loads "libcuda.so.1"), so that CI, which has no GPU, runs the CUDA
 * backend's stream and context handling. The fake's work never completes
 * until a synchronize: reuse across streams needs a cuStreamWaitEvent.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "driver/driver.h"

#define MIB ((size_t)1 << 20)

static int (*fake_waits)(void);
static unsigned long long (*fake_last_wait_stream)(void);
static unsigned long long (*fake_pt_id)(int dev);
static int (*fake_current_device)(void);

static sa_arena *arena_on(int device) {
  sa_config c;
  sa_config_init(&c);
  c.backend = SA_BACKEND_CUDA;
  c.device = device;
  sa_arena *a = NULL;
  assert_int_equal(sa_arena_create(&c, &a), SA_OK);
  return a;
}

typedef struct job_s {
  sa_arena *a;
  sa_stream s;
  void *p;
  sa_status st;
  unsigned long long pt_id; /* the calling thread's per-thread stream */
  int dev_before, dev_after;
} job;

static void *alloc_free(void *arg) {
  job *j = arg;
  j->st = sa_alloc(j->a, &j->p, 8 * MIB, j->s);
  if (j->st == SA_OK) j->st = sa_free(j->p, j->s);
  return NULL;
}

static void *alloc_only(void *arg) {
  job *j = arg;
  j->st = sa_alloc(j->a, &j->p, 8 * MIB, j->s);
  j->pt_id = fake_pt_id(0); /* this thread's per-thread stream of device 0 */
  return NULL;
}

static void run(void *(*fn)(void *), job *j) {
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, fn, j), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
}

/* Sanity of the fake: two explicit streams; the second gets the first's
 * freed span only behind a wait, or other memory. */
static void explicit_streams_reuse_behind_a_wait(void **state) {
  (void)state;
  sa_arena *a = arena_on(0);
  sa_driver *d = NULL;
  assert_int_equal(sa_driver_open(SA_BACKEND_CUDA, 0, &d), SA_OK);
  sa_stream s1, s2;
  assert_int_equal(d->ops->stream_create(d, &s1), SA_OK);
  assert_int_equal(d->ops->stream_create(d, &s2), SA_OK);
  job ja = {.a = a, .s = s1};
  run(alloc_free, &ja);
  assert_int_equal(ja.st, SA_OK);
  int w0 = fake_waits();
  job jb = {.a = a, .s = s2};
  run(alloc_only, &jb);
  assert_int_equal(jb.st, SA_OK);
  if (jb.p == ja.p) assert_true(fake_waits() > w0);
  assert_int_equal(sa_free(jb.p, s2), SA_OK);
  assert_int_equal(sa_arena_destroy(a), SA_OK);
  assert_int_equal(d->ops->stream_destroy(d, s1), SA_OK);
  assert_int_equal(d->ops->stream_destroy(d, s2), SA_OK);
  sa_driver_close(d);
}

/* CU_STREAM_PER_THREAD (which the public header says works) names another
 * stream on each thread: thread B's per-thread stream may get what thread
 * A freed on its own per-thread stream only behind a wait on A's work. */
static void per_thread_streams_of_two_threads_are_two_streams(void **state) {
  (void)state;
  sa_arena *a = arena_on(0);
  job ja = {.a = a, .s = CU_STREAM_PER_THREAD};
  run(alloc_free, &ja);
  int w0 = fake_waits();
  job jb = {.a = a, .s = CU_STREAM_PER_THREAD};
  run(alloc_only, &jb);
  if (ja.st == SA_OK && jb.st == SA_OK) {
    /* Accepted: then a handout of A's block to B needs a wait on B's stream. */
    if (jb.p == ja.p) {
      assert_true(fake_waits() > w0);
      assert_true(fake_last_wait_stream() == jb.pt_id);
    }
    assert_int_equal(sa_free(jb.p, CU_STREAM_PER_THREAD), SA_OK);
  } else {
    /* Or refused as a stream the allocator cannot tell apart per thread. */
    assert_int_equal(ja.st, SA_ERR_UNKNOWN_STREAM);
  }
  (void)sa_arena_destroy(a);
}

static void *alloc_on_device_1(void *arg) {
  job *j = arg;
  j->dev_before = fake_current_device();
  j->st = sa_alloc(j->a, &j->p, 8 * MIB, NULL);
  j->dev_after = fake_current_device();
  /* What sa_malloc_async would pick on this thread now. */
  j->pt_id = (unsigned long long)sa_driver_current_device();
  return NULL;
}

/* A thread that never set a device allocates from an arena of device 1:
 * afterwards its current device (what cudaMalloc, kernel launches and
 * sa_malloc_async use) is what it was before, not device 1. */
static void call_on_fresh_thread_leaves_its_device_alone(void **state) {
  (void)state;
  sa_arena *a = arena_on(1);
  job j = {.a = a};
  run(alloc_on_device_1, &j);
  assert_int_equal(j.st, SA_OK);
  assert_int_equal(j.dev_before, -1);
  assert_int_equal(j.dev_after, -1);
  assert_int_equal((int)j.pt_id, 0);
  assert_int_equal(sa_free(j.p, NULL), SA_OK);
  assert_int_equal(sa_arena_destroy(a), SA_OK);
}

int main(int argc, char **argv) {
  if (argc < 2 || dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) == NULL) {
    fprintf(stderr, "usage: %s path/to/fake/libcuda.so (%s)\n", argv[0], dlerror());
    return 1;
  }
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  *(void **)&fake_waits = dlsym(h, "fake_cuda_waits");
  *(void **)&fake_last_wait_stream = dlsym(h, "fake_cuda_last_wait_stream");
  *(void **)&fake_pt_id = dlsym(h, "fake_cuda_pt_id");
  *(void **)&fake_current_device = dlsym(h, "fake_cuda_current_device");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(explicit_streams_reuse_behind_a_wait),
      cmocka_unit_test(per_thread_streams_of_two_threads_are_two_streams),
      cmocka_unit_test(call_on_fresh_thread_leaves_its_device_alone),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
