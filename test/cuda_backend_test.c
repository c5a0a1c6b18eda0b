/* The CUDA backend on a real device (driver/cuda.c): VMM, streams, events,
 * wait edges and context handling. Every test skips where no CUDA device is
 * usable (CI), so this file runs in both suites; on the GPU machine it is the
 * backend's smoke test.
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
#include <time.h>

#include <cuda.h>

#include "driver/cuda_loader.h"
#include "driver/driver.h"
#include "test/util.h"

typedef struct fixture_s {
  sa_driver *d;
  size_t g; /* granularity */
  sa_stream s1, s2;
} fixture;

static int group_setup(void **state) {
  static fixture f;
  *state = &f;
  if (sa_driver_cuda_open(0, &f.d) != SA_OK) {
    f.d = NULL; /* no device here: every test skips */
    return 0;
  }
  if (f.d->ops->granularity(f.d, &f.g) != SA_OK) return -1;
  if (f.d->ops->stream_create(f.d, &f.s1) != SA_OK) return -1;
  if (f.d->ops->stream_create(f.d, &f.s2) != SA_OK) return -1;
  return 0;
}

static int group_teardown(void **state) {
  fixture *f = *state;
  if (f->d == NULL) return 0;
  int bad = f->d->ops->stream_destroy(f->d, f->s1) != SA_OK;
  bad |= f->d->ops->stream_destroy(f->d, f->s2) != SA_OK;
  sa_driver_close(f->d);
  return bad ? -1 : 0;
}

static fixture *need_device(void **state) {
  fixture *f = *state;
  if (f->d == NULL) skip();
  return f;
}

/* A reserved range with one chunk of `size` bytes mapped and accessible. */
typedef struct buffer_s {
  uintptr_t va;
  size_t size;
  sa_chunk_handle chunk;
} buffer;

static void buffer_make(fixture *f, buffer *b, size_t size) {
  const sa_driver_ops *o = f->d->ops;
  b->size = size;
  assert_int_equal(o->va_reserve(f->d, size, f->g, &b->va), SA_OK);
  assert_int_equal(o->chunk_create(f->d, size, &b->chunk), SA_OK);
  assert_int_equal(o->map(f->d, b->va, size, b->chunk), SA_OK);
  assert_int_equal(o->set_access(f->d, b->va, size), SA_OK);
}

static void buffer_free(fixture *f, buffer *b) {
  const sa_driver_ops *o = f->d->ops;
  assert_int_equal(o->unmap(f->d, b->va, b->size), SA_OK);
  assert_int_equal(o->chunk_release(f->d, b->chunk), SA_OK);
  assert_int_equal(o->va_release(f->d, b->va, b->size), SA_OK);
}

/* Copy [va, va + bytes) back and count words that differ from want. */
static size_t mismatches(fixture *f, uintptr_t va, size_t bytes, uint32_t want) {
  uint32_t *h = malloc(bytes);
  assert_non_null(h);
  assert_int_equal(f->d->ops->copy_to_host(f->d, h, va, bytes), SA_OK);
  size_t bad = 0;
  for (size_t i = 0; i < bytes / 4; i++) bad += h[i] != want;
  free(h);
  return bad;
}

static void device_queries_are_sane(void **state) {
  fixture *f = need_device(state);
  size_t total = 0;
  assert_int_equal(f->d->ops->total_memory(f->d, &total), SA_OK);
  assert_true(f->g >= 4096 && (f->g & (f->g - 1)) == 0);
  assert_true(total > 64 * f->g);
  printf("# granularity %zu KiB, total memory %zu MiB\n", f->g >> 10, total / MiB);
  /* The stream creates made the primary context current only for
   * themselves: this thread had none and still has none (left current, it
   * would have switched the thread's device to the arena's). */
  int dev = -1;
  assert_int_equal(sa_driver_cuda_current_device(&dev), SA_ERR_NO_DEVICE);
  assert_int_equal(dev, -1);
}

static void remap_keeps_bytes(void **state) {
  fixture *f = need_device(state);
  const sa_driver_ops *o = f->d->ops;
  size_t g = f->g;
  uintptr_t va = 0;
  sa_chunk_handle a = 0, b = 0;
  assert_int_equal(o->va_reserve(f->d, 4 * g, g, &va), SA_OK);
  assert_true(va % g == 0);
  assert_int_equal(o->chunk_create(f->d, g, &a), SA_OK);
  assert_int_equal(o->chunk_create(f->d, g, &b), SA_OK);
  assert_int_equal(o->map(f->d, va, g, a), SA_OK);
  assert_int_equal(o->map(f->d, va + g, g, b), SA_OK);
  /* One call over two mappings, as the arena does for spans. */
  assert_int_equal(o->set_access(f->d, va, 2 * g), SA_OK);
  assert_int_equal(o->memset32_async(f->d, va, 0xA5A5A5A5u, g / 4, f->s1), SA_OK);
  assert_int_equal(o->memset32_async(f->d, va + g, 0x5A5A5A5Au, g / 4, f->s1), SA_OK);
  assert_int_equal(o->stream_synchronize(f->d, f->s1), SA_OK);
  assert_int_equal(mismatches(f, va, g, 0xA5A5A5A5u), 0);
  assert_int_equal(mismatches(f, va + g, g, 0x5A5A5A5Au), 0);

  assert_int_equal(o->unmap(f->d, va, 2 * g), SA_OK); /* both mappings at once */
  /* Swapped, elsewhere in the range: the physical bytes travel. */
  assert_int_equal(o->map(f->d, va + 2 * g, g, b), SA_OK);
  assert_int_equal(o->map(f->d, va + 3 * g, g, a), SA_OK);
  assert_int_equal(o->set_access(f->d, va + 2 * g, 2 * g), SA_OK);
  assert_int_equal(mismatches(f, va + 2 * g, g, 0x5A5A5A5Au), 0);
  assert_int_equal(mismatches(f, va + 3 * g, g, 0xA5A5A5A5u), 0);

  assert_int_equal(o->unmap(f->d, va + 2 * g, 2 * g), SA_OK);
  assert_int_equal(o->chunk_release(f->d, a), SA_OK);
  assert_int_equal(o->chunk_release(f->d, b), SA_OK);
  assert_int_equal(o->va_release(f->d, va, 4 * g), SA_OK);
}

static void impossible_chunk_is_out_of_memory(void **state) {
  fixture *f = need_device(state);
  size_t total = 0;
  assert_int_equal(f->d->ops->total_memory(f->d, &total), SA_OK);
  size_t size = (2 * total + f->g - 1) / f->g * f->g;
  sa_chunk_handle c = 77;
  assert_int_equal(f->d->ops->chunk_create(f->d, size, &c), SA_ERR_OUT_OF_MEMORY);
  assert_int_equal(c, 0);
  const char *name = NULL;
  assert_int_equal(sa_last_driver_error(&name), CUDA_ERROR_OUT_OF_MEMORY);
  assert_string_equal(name, "CUDA_ERROR_OUT_OF_MEMORY");
}

static void failing_call_records_driver_error(void **state) {
  fixture *f = need_device(state);
  const sa_driver_ops *o = f->d->ops;
  uintptr_t va = 0;
  sa_chunk_handle c = 0;
  assert_int_equal(o->va_reserve(f->d, f->g, f->g, &va), SA_OK);
  assert_int_equal(o->va_release(f->d, va, f->g), SA_OK);
  assert_int_equal(o->chunk_create(f->d, f->g, &c), SA_OK);
  sa_driver_set_error(0, NULL);
  /* The range is no longer reserved. */
  assert_int_equal(o->map(f->d, va, f->g, c), SA_ERR_DRIVER);
  const char *name = NULL;
  assert_int_not_equal(sa_last_driver_error(&name), 0);
  assert_non_null(name);
  assert_memory_equal(name, "CUDA_ERROR_", 11);
  /* Unmapping what is not mapped fails too, and nothing was leaked. */
  assert_int_not_equal(o->unmap(f->d, va, f->g), SA_OK);
  assert_int_equal(o->chunk_release(f->d, c), SA_OK);
}

static void events_complete_and_query(void **state) {
  fixture *f = need_device(state);
  const sa_driver_ops *o = f->d->ops;
  buffer b;
  buffer_make(f, &b, 256 * MiB);
  sa_event e = NULL;
  assert_int_equal(o->event_create(f->d, &e), SA_OK);
  assert_int_equal(o->event_query(f->d, e), SA_OK); /* never recorded: complete */
  for (int i = 0; i < 8; i++) {
    assert_int_equal(o->memset32_async(f->d, b.va, (uint32_t)i, b.size / 4, f->s1), SA_OK);
  }
  assert_int_equal(o->event_record(f->d, e, f->s1), SA_OK);
  sa_status q = o->event_query(f->d, e);
  assert_true(q == SA_OK || q == SA_ERR_NOT_READY);
  printf("# query right after 2 GiB of memsets: %s\n", q == SA_OK ? "complete" : "not ready");
  assert_int_equal(o->event_synchronize(f->d, e), SA_OK);
  assert_int_equal(o->event_query(f->d, e), SA_OK);
  assert_int_equal(mismatches(f, b.va, 4 * MiB, 7u), 0);
  assert_int_equal(o->event_destroy(f->d, e), SA_OK);
  buffer_free(f, &b);
}

static void wait_edge_orders_streams(void **state) {
  fixture *f = need_device(state);
  const sa_driver_ops *o = f->d->ops;
  buffer b;
  buffer_make(f, &b, 512 * MiB);
  sa_event e = NULL;
  assert_int_equal(o->event_create(f->d, &e), SA_OK);
  /* s1 writes the whole buffer (long); s2 overwrites its head after the
   * edge. Without the edge s1 could finish last and leave 1s in the head. */
  for (int i = 0; i < 4; i++) {
    assert_int_equal(o->memset32_async(f->d, b.va, 1u, b.size / 4, f->s1), SA_OK);
  }
  assert_int_equal(o->event_record(f->d, e, f->s1), SA_OK);
  assert_int_equal(o->stream_wait_event(f->d, f->s2, e), SA_OK);
  assert_int_equal(o->memset32_async(f->d, b.va, 2u, MiB / 4, f->s2), SA_OK);
  assert_int_equal(o->stream_synchronize(f->d, f->s2), SA_OK);
  /* s2 is done, so what it waited for is done: no host sync of s1 needed. */
  assert_int_equal(o->event_query(f->d, e), SA_OK);
  assert_int_equal(mismatches(f, b.va, MiB, 2u), 0);
  assert_int_equal(mismatches(f, b.va + MiB, MiB, 1u), 0);
  assert_int_equal(mismatches(f, b.va + b.size - MiB, MiB, 1u), 0);
  assert_int_equal(o->event_destroy(f->d, e), SA_OK);
  buffer_free(f, &b);
}

static void implicit_streams_are_valid(void **state) {
  fixture *f = need_device(state);
  const sa_driver_ops *o = f->d->ops;
  assert_int_equal(o->stream_validate(f->d, NULL), SA_OK);
  /* Another stream on each thread: refused for the allocator's use. */
  assert_int_equal(o->stream_validate(f->d, (sa_stream)CU_STREAM_PER_THREAD),
                   SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(o->stream_validate(f->d, (sa_stream)CU_STREAM_LEGACY), SA_OK);
  assert_int_equal(o->stream_validate(f->d, f->s1), SA_OK);
  /* Work and events on the implicit streams. */
  buffer b;
  buffer_make(f, &b, f->g);
  sa_event e = NULL;
  assert_int_equal(o->event_create(f->d, &e), SA_OK);
  assert_int_equal(o->memset32_async(f->d, b.va, 3u, f->g / 4, (sa_stream)CU_STREAM_PER_THREAD),
                   SA_OK);
  assert_int_equal(o->event_record(f->d, e, (sa_stream)CU_STREAM_PER_THREAD), SA_OK);
  assert_int_equal(o->stream_wait_event(f->d, NULL, e), SA_OK);
  assert_int_equal(o->memset32_async(f->d, b.va, 4u, 64, NULL), SA_OK);
  assert_int_equal(o->stream_synchronize(f->d, NULL), SA_OK);
  assert_int_equal(mismatches(f, b.va, 256, 4u), 0);
  assert_int_equal(mismatches(f, b.va + 256, f->g - 256, 3u), 0);
  assert_int_equal(o->event_destroy(f->d, e), SA_OK);
  buffer_free(f, &b);
}

typedef struct thread_job_s {
  fixture *f;
  sa_status before;   /* current device at thread start */
  sa_status ok;       /* the driver calls */
  int dev_after;      /* current device afterwards */
  sa_status after;    /* and the status of asking */
  size_t bad;         /* mismatching words */
  sa_event e;         /* made by the test thread */
} thread_job;

/* A new thread has no current context: every call must still work. */
static void *calls_from_fresh_thread(void *arg) {
  thread_job *j = arg;
  fixture *f = j->f;
  const sa_driver_ops *o = f->d->ops;
  int dev = -1;
  j->before = sa_driver_cuda_current_device(&dev);
  buffer b = {0};
  sa_event e = NULL;
  sa_status st = o->va_reserve(f->d, f->g, f->g, &b.va);
  if (st == SA_OK) st = o->chunk_create(f->d, f->g, &b.chunk);
  if (st == SA_OK) st = o->map(f->d, b.va, f->g, b.chunk);
  if (st == SA_OK) st = o->set_access(f->d, b.va, f->g);
  if (st == SA_OK) st = o->event_create(f->d, &e);
  if (st == SA_OK) st = o->memset32_async(f->d, b.va, 9u, f->g / 4, NULL);
  if (st == SA_OK) st = o->event_record(f->d, e, NULL);
  if (st == SA_OK) st = o->event_synchronize(f->d, e);
  if (st == SA_OK) st = o->event_query(f->d, e);
  uint32_t h[64];
  if (st == SA_OK) st = o->copy_to_host(f->d, h, b.va, sizeof h);
  for (size_t i = 0; st == SA_OK && i < 64; i++) j->bad += h[i] != 9u;
  if (st == SA_OK) st = o->event_destroy(f->d, e);
  if (st == SA_OK) st = o->unmap(f->d, b.va, f->g);
  if (st == SA_OK) st = o->chunk_release(f->d, b.chunk);
  if (st == SA_OK) st = o->va_release(f->d, b.va, f->g);
  j->ok = st;
  j->dev_after = -1;
  (void)sa_driver_cuda_current_device(&j->dev_after);
  return NULL;
}

static void calls_work_in_thread_without_context(void **state) {
  fixture *f = need_device(state);
  thread_job j = {.f = f};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, calls_from_fresh_thread, &j), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(j.before, SA_ERR_NO_DEVICE);
  assert_int_equal(j.ok, SA_OK);
  assert_int_equal(j.bad, 0);
  assert_int_equal(j.dev_after, -1); /* the primary context was popped again */
}

/* Calls on explicit handles skip the context check: they must work with no
 * context current, and leave none current. */
static void *explicit_handles_from_fresh_thread(void *arg) {
  thread_job *j = arg;
  fixture *f = j->f;
  const sa_driver_ops *o = f->d->ops;
  sa_event e = j->e;
  int dev = -1;
  j->before = sa_driver_cuda_current_device(&dev);
  sa_status st = o->stream_validate(f->d, f->s1);
  if (st == SA_OK) st = o->event_record(f->d, e, f->s1);
  if (st == SA_OK) st = o->stream_wait_event(f->d, f->s2, e);
  if (st == SA_OK) st = o->event_synchronize(f->d, e);
  if (st == SA_OK) st = o->event_query(f->d, e);
  if (st == SA_OK) st = o->stream_synchronize(f->d, f->s2);
  j->ok = st;
  j->dev_after = -1;
  j->after = sa_driver_cuda_current_device(&j->dev_after);
  return NULL;
}

static void explicit_handles_need_no_context(void **state) {
  fixture *f = need_device(state);
  thread_job j = {.f = f};
  assert_int_equal(f->d->ops->event_create(f->d, &j.e), SA_OK);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, explicit_handles_from_fresh_thread, &j), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(j.before, SA_ERR_NO_DEVICE);
  assert_int_equal(j.ok, SA_OK);
  assert_int_equal(j.after, SA_ERR_NO_DEVICE); /* nothing was made current */
  assert_int_equal(f->d->ops->event_destroy(f->d, j.e), SA_OK);
}

/* The user's own context, made with libcuda directly (the library's loader,
 * its extra entry points included), as an application that manages
 * contexts itself would. */
static void user_context_is_restored(void **state) {
  fixture *f = need_device(state);
  const sa_driver_ops *o = f->d->ops;
  if (sa_cu_load_all() != SA_OK) {
    const char *why = NULL;
    (void)sa_last_driver_error(&why);
    printf("# %s: skipped\n", why);
    skip();
  }
  CUcontext saved = NULL, mine = NULL, cur = NULL;
  assert_int_equal(sa_cu.CtxGetCurrent(&saved), CUDA_SUCCESS);
  assert_int_equal(sa_cu.CtxCreate(&mine, NULL, 0, 0, 0), CUDA_SUCCESS); /* now current */
  /* A stream of the user's context is not ours: events could not be recorded on it. */
  CUstream theirs = NULL;
  assert_int_equal(sa_cu.StreamCreate(&theirs, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  assert_int_equal(o->stream_validate(f->d, (sa_stream)theirs), SA_ERR_UNKNOWN_STREAM);
  /* Nor is NULL, which names the legacy stream of their context now: the
   * arena refuses it (the ops below still make ours current). */
  assert_int_equal(o->stream_validate(f->d, NULL), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(o->legacy_stream_check(f->d, NULL), SA_ERR_UNKNOWN_STREAM);
  const char *why = NULL;
  (void)sa_last_driver_error(&why);
  assert_non_null(strstr(why, "NULL stream of another context on this device"));

  buffer b;
  buffer_make(f, &b, f->g);
  assert_int_equal(sa_cu.CtxGetCurrent(&cur), CUDA_SUCCESS);
  assert_ptr_equal(cur, mine);
  sa_event e = NULL;
  assert_int_equal(o->event_create(f->d, &e), SA_OK);
  assert_int_equal(o->memset32_async(f->d, b.va, 5u, f->g / 4, NULL), SA_OK);
  assert_int_equal(o->event_record(f->d, e, NULL), SA_OK);
  assert_int_equal(o->stream_wait_event(f->d, f->s1, e), SA_OK); /* explicit, no switch */
  assert_int_equal(o->event_record(f->d, e, f->s1), SA_OK);
  assert_int_equal(o->stream_synchronize(f->d, f->s1), SA_OK);
  assert_int_equal(o->stream_validate(f->d, f->s1), SA_OK);
  assert_int_equal(o->event_query(f->d, e), SA_OK);
  assert_int_equal(mismatches(f, b.va, f->g, 5u), 0);
  assert_int_equal(sa_cu.CtxGetCurrent(&cur), CUDA_SUCCESS);
  assert_ptr_equal(cur, mine);
  assert_int_equal(o->event_destroy(f->d, e), SA_OK);
  buffer_free(f, &b);
  assert_int_equal(sa_cu.CtxGetCurrent(&cur), CUDA_SUCCESS);
  assert_ptr_equal(cur, mine);

  assert_int_equal(sa_cu.StreamDestroy(theirs), CUDA_SUCCESS);
  assert_int_equal(sa_cu.CtxDestroy(mine), CUDA_SUCCESS);
  assert_int_equal(sa_cu.CtxSetCurrent(saved), CUDA_SUCCESS);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* Informational: what the allocator's slow paths pay per event operation,
 * context check included. Asserts only that the calls succeed. */
static void event_costs(void **state) {
  fixture *f = need_device(state);
  const sa_driver_ops *o = f->d->ops;
  enum { N = 20000 };
  sa_event e = NULL;
  assert_int_equal(o->event_create(f->d, &e), SA_OK);
  sa_stream streams[2] = {f->s1, NULL};
  const char *names[2] = {"own stream", "NULL stream"};
  for (int k = 0; k < 2; k++) {
    double t0 = now_us();
    for (int i = 0; i < N; i++) {
      assert_int_equal(o->event_record(f->d, e, streams[k]), SA_OK);
      sa_status q = o->event_query(f->d, e);
      assert_true(q == SA_OK || q == SA_ERR_NOT_READY);
    }
    double t1 = now_us();
    for (int i = 0; i < N; i++) {
      assert_int_equal(o->stream_wait_event(f->d, streams[k], e), SA_OK);
    }
    double t2 = now_us();
    printf("# %s: record+query %.3f us, stream wait %.3f us\n", names[k], (t1 - t0) / N,
           (t2 - t1) / N);
  }
  double t0 = now_us();
  for (int i = 0; i < 1000; i++) {
    sa_event x = NULL;
    assert_int_equal(o->event_create(f->d, &x), SA_OK);
    assert_int_equal(o->event_destroy(f->d, x), SA_OK);
  }
  printf("# event create+destroy %.3f us\n", (now_us() - t0) / 1000);
  assert_int_equal(o->stream_synchronize(f->d, f->s1), SA_OK);
  assert_int_equal(o->stream_synchronize(f->d, NULL), SA_OK);
  assert_int_equal(o->event_destroy(f->d, e), SA_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(device_queries_are_sane),
      cmocka_unit_test(remap_keeps_bytes),
      cmocka_unit_test(impossible_chunk_is_out_of_memory),
      cmocka_unit_test(failing_call_records_driver_error),
      cmocka_unit_test(events_complete_and_query),
      cmocka_unit_test(wait_edge_orders_streams),
      cmocka_unit_test(implicit_streams_are_valid),
      cmocka_unit_test(calls_work_in_thread_without_context),
      cmocka_unit_test(explicit_handles_need_no_context),
      cmocka_unit_test(user_context_is_restored),
      cmocka_unit_test(event_costs),
  };
  return cmocka_run_group_tests_name("cuda_backend", tests, group_setup, group_teardown);
}
