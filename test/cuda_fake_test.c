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
#include <string.h>

#include "driver/cuda_loader.h"
#include "driver/driver.h"
#include "test/util.h"

static int (*fake_waits)(void);
static unsigned long long (*fake_last_wait_stream)(void);
static unsigned long long (*fake_pt_id)(int dev);
static int (*fake_current_device)(void);
static void *(*fake_user_context)(int dev);

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
  j->st = sa_alloc(j->a, &j->p, 8 * MiB, j->s);
  if (j->st == SA_OK) j->st = sa_free(j->p, j->s);
  return NULL;
}

static void *alloc_only(void *arg) {
  job *j = arg;
  j->st = sa_alloc(j->a, &j->p, 8 * MiB, j->s);
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
  j->st = sa_alloc(j->a, &j->p, 8 * MiB, NULL);
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

/* Calls of a thread on NULL with device 1's arena, and what they said. */
typedef struct null_calls_s {
  sa_arena *a1;
  sa_driver *d1;
  void *small, *span, *q;
  sa_status alloc_small, alloc_span, free_small, free_span, record, release, legacy, validate;
  char why[256];
} null_calls;

/* With device 1's primary context current: the thread's entry for NULL,
 * and a block in its cache. */
static sa_status allocate_on_null(void *arg) {
  null_calls *c = arg;
  sa_status st = sa_alloc(c->a1, &c->span, 8 * MiB, NULL);
  if (st == SA_OK) st = sa_alloc(c->a1, &c->small, 4096, NULL);
  return st;
}

/* With device 0's primary context current. */
static sa_status call_on_null(void *arg) {
  null_calls *c = arg;
  const char *why = NULL;
  c->alloc_small = sa_alloc(c->a1, &c->q, 4096, NULL);
  (void)sa_last_driver_error(&why);
  snprintf(c->why, sizeof c->why, "%s", why);
  c->alloc_span = sa_alloc(c->a1, &c->q, 8 * MiB, NULL);
  c->free_small = sa_free(c->small, NULL);
  c->free_span = sa_free(c->span, NULL);
  c->record = sa_record_stream(c->small, NULL);
  c->release = sa_stream_release(c->a1, NULL);
  c->legacy = sa_alloc(c->a1, &c->q, 4096, CU_STREAM_LEGACY);
  c->validate = c->d1->ops->stream_validate(c->d1, NULL); /* the driver's own answer */
  return SA_OK;
}

/* cuda.c's rule for the legacy stream: device 1's arena takes NULL while
 * device 1's primary context is current, or none is, and refuses NULL and
 * CU_STREAM_LEGACY in every call while device 0's is current, where they
 * name device 0's legacy stream (the thread's kernels on stream 0 go
 * there); the message names both devices, and nothing changes. */
static void null_with_another_devices_context_current_is_refused(void **state) {
  (void)state;
  sa_arena *a1 = arena_on(1);
  sa_driver *d0 = NULL, *d1 = NULL;
  assert_int_equal(sa_driver_open(SA_BACKEND_CUDA, 0, &d0), SA_OK);
  assert_int_equal(sa_driver_open(SA_BACKEND_CUDA, 1, &d1), SA_OK);
  null_calls c = {.a1 = a1, .d1 = d1};
  assert_int_equal(d1->ops->call_on_stream(d1, NULL, allocate_on_null, &c), SA_OK);
  assert_int_equal(d0->ops->call_on_stream(d0, NULL, call_on_null, &c), SA_OK);
  assert_int_equal(fake_current_device(), -1); /* put back: none */
  assert_int_equal(c.alloc_small, SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(c.alloc_span, SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(c.free_small, SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(c.free_span, SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(c.record, SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(c.release, SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(c.legacy, SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(c.validate, SA_ERR_UNKNOWN_STREAM);
  assert_null(c.q);
  if (strstr(c.why, "NULL stream of another device: it names the legacy stream of device 0") ==
          NULL ||
      strstr(c.why, "make device 1 current") == NULL)
    fail_msg("the refusal says '%s'", c.why);
  /* No context current: NULL is device 1's again; the blocks stayed live. */
  assert_int_equal(sa_free(c.small, NULL), SA_OK);
  assert_int_equal(sa_free(c.span, NULL), SA_OK);
  assert_int_equal(sa_stream_release(a1, NULL), SA_OK);
  assert_int_equal(sa_arena_destroy(a1), SA_OK);
  sa_driver_close(d0);
  sa_driver_close(d1);
}

/* A context of the user's own on the arena's device has a legacy stream
 * of its own, not the primary context's the arena works in: NULL is
 * refused there too, and the message says which. */
static void null_with_a_users_own_context_current_is_refused(void **state) {
  (void)state;
  sa_arena *a1 = arena_on(1);
  void *p = &p;
  const char *why = NULL;
  char said[256];
  assert_int_equal(sa_cu.CtxSetCurrent((CUcontext)fake_user_context(1)), CUDA_SUCCESS);
  sa_status st = sa_alloc(a1, &p, 4096, NULL);
  (void)sa_last_driver_error(&why);
  snprintf(said, sizeof said, "%s", why);
  sa_status legacy = sa_alloc(a1, &p, 4096, CU_STREAM_LEGACY);
  assert_int_equal(sa_cu.CtxSetCurrent(NULL), CUDA_SUCCESS);
  assert_int_equal(st, SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(legacy, SA_ERR_UNKNOWN_STREAM);
  assert_null(p);
  if (strstr(said, "NULL stream of another context on this device") == NULL)
    fail_msg("the refusal says '%s'", said);
  assert_int_equal(sa_arena_destroy(a1), SA_OK);
}

/* The tests' and benchmarks' entry points load apart from the library's:
 * the fake has none of them, so sa_cu_load_all fails and names the first,
 * and the library's own load, and its arenas, are untouched. */
static void a_driver_without_the_extra_entry_points_still_runs_the_library(void **state) {
  (void)state;
  assert_int_equal(sa_cu_load_all(), SA_ERR_NO_DEVICE);
  const char *why = NULL;
  (void)sa_last_driver_error(&why);
  assert_string_equal(why, "libcuda.so.1 lacks the entry point cuDriverGetVersion");
  assert_int_equal(sa_cu_load_all(), SA_ERR_NO_DEVICE); /* once: the same answer */
  assert_int_equal(sa_cu_load(), SA_OK);
  sa_arena *a = arena_on(0);
  void *p = NULL;
  assert_int_equal(sa_alloc(a, &p, 8 * MiB, NULL), SA_OK);
  assert_int_equal(sa_free(p, NULL), SA_OK);
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
  *(void **)&fake_user_context = dlsym(h, "fake_cuda_user_context");
  /* The library's loader takes the fake for libcuda.so.1: sa_cu is its. */
  if (sa_cu_load() != SA_OK) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(explicit_streams_reuse_behind_a_wait),
      cmocka_unit_test(per_thread_streams_of_two_threads_are_two_streams),
      cmocka_unit_test(call_on_fresh_thread_leaves_its_device_alone),
      cmocka_unit_test(null_with_another_devices_context_current_is_refused),
      cmocka_unit_test(null_with_a_users_own_context_current_is_refused),
      cmocka_unit_test(a_driver_without_the_extra_entry_points_still_runs_the_library),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
