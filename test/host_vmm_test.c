/* The host simulator's virtual memory management: reserve, chunks, map,
 * set_access, unmap, release, the device memory limit and the counters. */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <streamarena/host.h>

#include "driver/driver.h"
#include "fixture.h"
#include "test/util.h"

#define G (2 * MiB)

static sa_driver *d; /* opened for the group (fixture.h) */

/* Every test must leave the device as it found it. */
static int check_empty(void **state) {
  (void)state;
  sa_host_counters c;
  sa_host_get_counters(&c);
  return c.va_ranges == 0 && c.chunks == 0 && c.chunk_bytes == 0 && c.mappings == 0 ? 0 : -1;
}

/* 1 if touching p in a child process kills it with SIGSEGV. The child drops
 * any handler a sanitizer installed so the fault is the plain signal. */
static int faults_on_touch(volatile unsigned char *p, int write) {
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    if (write) *p = 1;
    else (void)*p;
    _exit(0);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

static size_t open_fds(void) {
  DIR *dir = opendir("/proc/self/fd");
  if (dir == NULL) return 0;
  size_t n = 0;
  while (readdir(dir) != NULL) n++;
  closedir(dir);
  return n;
}

static void granularity_is_2mib(void **state) {
  (void)state;
  size_t g = 0, total = 0;
  assert_int_equal(d->ops->granularity(d, &g), SA_OK);
  assert_int_equal(g, G);
  assert_int_equal(d->ops->total_memory(d, &total), SA_OK);
  assert_true(total >= G);
  assert_int_equal(d->backend, SA_BACKEND_HOST);
  assert_string_equal(d->ops->name, "host");
}

static void reserve_honours_alignment(void **state) {
  (void)state;
  uintptr_t va = 0;
  assert_int_equal(d->ops->va_reserve(d, 4 * G, GiB, &va), SA_OK);
  assert_int_equal(va % GiB, 0);
  assert_int_equal(d->ops->va_release(d, va, 4 * G), SA_OK);
  assert_int_equal(d->ops->va_reserve(d, G, 0, &va), SA_OK);
  assert_int_equal(va % G, 0);
  assert_int_equal(d->ops->va_release(d, va, G), SA_OK);
}

static void reserve_rejects_bad_sizes(void **state) {
  (void)state;
  uintptr_t va = 0;
  assert_int_equal(d->ops->va_reserve(d, 0, 0, &va), SA_ERR_DRIVER);
  assert_int_equal(d->ops->va_reserve(d, G + 4096, 0, &va), SA_ERR_DRIVER);
  assert_int_equal(d->ops->va_reserve(d, G, 3 * G, &va), SA_ERR_DRIVER);
  assert_int_equal(d->ops->va_reserve(d, SIZE_MAX - G + 1, 0, &va), SA_ERR_OUT_OF_MEMORY);
  assert_int_equal(d->ops->va_reserve(d, G, 0, NULL), SA_ERR_INVALID_ARGUMENT);
}

static void mapped_memory_is_readable_and_writable_after_set_access(void **state) {
  (void)state;
  uintptr_t va;
  sa_chunk_handle c;
  assert_int_equal(d->ops->va_reserve(d, 2 * G, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, 2 * G, &c), SA_OK);
  assert_int_equal(d->ops->map(d, va, 2 * G, c), SA_OK);
  assert_int_equal(faults_on_touch((unsigned char *)va, 0), 1); /* no access yet */
  assert_int_equal(d->ops->set_access(d, va, 2 * G), SA_OK);
  unsigned char *p = (unsigned char *)va;
  assert_int_equal(p[0], 0); /* fresh chunks read as zeros */
  memset(p, 0xab, 2 * G);
  assert_int_equal(p[2 * G - 1], 0xab);
  assert_int_equal(d->ops->unmap(d, va, 2 * G), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c), SA_OK);
  assert_int_equal(d->ops->va_release(d, va, 2 * G), SA_OK);
}

static void remap_keeps_bytes(void **state) {
  (void)state;
  uintptr_t a, b;
  sa_chunk_handle c;
  assert_int_equal(d->ops->va_reserve(d, G, 0, &a), SA_OK);
  assert_int_equal(d->ops->va_reserve(d, 4 * G, 0, &b), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, G, &c), SA_OK);
  assert_int_equal(d->ops->map(d, a, G, c), SA_OK);
  assert_int_equal(d->ops->set_access(d, a, G), SA_OK);
  for (size_t i = 0; i < G; i += 4096) ((unsigned char *)a)[i] = (unsigned char)(i >> 12);
  assert_int_equal(d->ops->unmap(d, a, G), SA_OK);
  assert_int_equal(d->ops->map(d, b + 3 * G, G, c), SA_OK);
  assert_int_equal(d->ops->set_access(d, b + 3 * G, G), SA_OK);
  for (size_t i = 0; i < G; i += 4096) {
    assert_int_equal(((unsigned char *)(b + 3 * G))[i], (unsigned char)(i >> 12));
  }
  assert_int_equal(d->ops->unmap(d, b + 3 * G, G), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c), SA_OK);
  assert_int_equal(d->ops->va_release(d, a, G), SA_OK);
  assert_int_equal(d->ops->va_release(d, b, 4 * G), SA_OK);
}

static void access_after_unmap_faults(void **state) {
  (void)state;
  uintptr_t va;
  sa_chunk_handle c;
  assert_int_equal(d->ops->va_reserve(d, G, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, G, &c), SA_OK);
  assert_int_equal(d->ops->map(d, va, G, c), SA_OK);
  assert_int_equal(d->ops->set_access(d, va, G), SA_OK);
  assert_int_equal(faults_on_touch((unsigned char *)va + 100, 1), 0);
  assert_int_equal(d->ops->unmap(d, va, G), SA_OK);
  assert_int_equal(faults_on_touch((unsigned char *)va + 100, 0), 1);
  assert_int_equal(faults_on_touch((unsigned char *)va + 100, 1), 1);
  assert_int_equal(d->ops->chunk_release(d, c), SA_OK);
  assert_int_equal(d->ops->va_release(d, va, G), SA_OK);
}

static void double_map_is_rejected(void **state) {
  (void)state;
  uintptr_t va;
  sa_chunk_handle c1, c2, big;
  assert_int_equal(d->ops->va_reserve(d, 4 * G, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, G, &c1), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, G, &c2), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, 2 * G, &big), SA_OK);
  assert_int_equal(d->ops->map(d, va + G, G, c1), SA_OK);
  assert_int_equal(d->ops->map(d, va + G, G, c2), SA_ERR_DRIVER);
  assert_int_equal(d->ops->map(d, va, 2 * G, big), SA_ERR_DRIVER);     /* overlaps the tail */
  assert_int_equal(d->ops->map(d, va + G, 2 * G, big), SA_ERR_DRIVER); /* overlaps the head */
  sa_host_counters cnt;
  sa_host_get_counters(&cnt);
  assert_int_equal(cnt.mappings, 1);
  assert_int_equal(d->ops->map(d, va + 2 * G, 2 * G, big), SA_OK); /* right after it */
  assert_int_equal(d->ops->unmap(d, va + G, 3 * G), SA_OK);         /* both at once */
  assert_int_equal(d->ops->chunk_release(d, c1), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c2), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, big), SA_OK);
  assert_int_equal(d->ops->va_release(d, va, 4 * G), SA_OK);
}

static void map_is_validated_like_cuda(void **state) {
  (void)state;
  uintptr_t va;
  sa_chunk_handle c;
  assert_int_equal(d->ops->va_reserve(d, 2 * G, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, G, &c), SA_OK);
  assert_int_equal(d->ops->map(d, va, 2 * G, c), SA_ERR_DRIVER);      /* size != chunk's */
  assert_int_equal(d->ops->map(d, va + 4096, G, c), SA_ERR_DRIVER);   /* unaligned */
  assert_int_equal(d->ops->map(d, va + 2 * G, G, c), SA_ERR_DRIVER);  /* past the range */
  assert_int_equal(d->ops->map(d, va - G, G, c), SA_ERR_DRIVER);      /* before it */
  assert_int_equal(d->ops->map(d, va, G, c + 8), SA_ERR_DRIVER);      /* bogus handle */
  assert_int_equal(d->ops->map(d, va, G, 0), SA_ERR_DRIVER);
  const char *name = NULL;
  assert_int_equal(sa_last_driver_error(&name), 22 /* EINVAL */);
  assert_non_null(name);
  sa_host_counters cnt;
  sa_host_get_counters(&cnt);
  assert_int_equal(cnt.mappings, 0);
  assert_int_equal(d->ops->chunk_release(d, c), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c), SA_ERR_DRIVER); /* twice */
  assert_int_equal(d->ops->va_release(d, va, 2 * G), SA_OK);
}

static void unmap_and_set_access_need_whole_mappings(void **state) {
  (void)state;
  uintptr_t va;
  sa_chunk_handle c1, c2;
  assert_int_equal(d->ops->va_reserve(d, 8 * G, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, 2 * G, &c1), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, 2 * G, &c2), SA_OK);
  assert_int_equal(d->ops->map(d, va, 2 * G, c1), SA_OK);
  assert_int_equal(d->ops->map(d, va + 4 * G, 2 * G, c2), SA_OK); /* a gap between */
  assert_int_equal(d->ops->unmap(d, va, G), SA_ERR_DRIVER);         /* part of one */
  assert_int_equal(d->ops->unmap(d, va + G, 2 * G), SA_ERR_DRIVER);
  assert_int_equal(d->ops->unmap(d, va, 6 * G), SA_ERR_DRIVER);     /* spans the gap */
  assert_int_equal(d->ops->unmap(d, va + 6 * G, 2 * G), SA_ERR_DRIVER); /* nothing there */
  assert_int_equal(d->ops->set_access(d, va, 6 * G), SA_ERR_DRIVER);
  assert_int_equal(d->ops->set_access(d, va + 2 * G, 2 * G), SA_ERR_DRIVER);
  assert_int_equal(d->ops->va_release(d, va, 8 * G), SA_ERR_DRIVER); /* still mapped */
  assert_int_equal(d->ops->va_release(d, va, 4 * G), SA_ERR_DRIVER); /* not the whole range */
  sa_host_counters cnt;
  sa_host_get_counters(&cnt);
  assert_int_equal(cnt.mappings, 2);
  assert_int_equal(cnt.va_ranges, 1);
  assert_int_equal(d->ops->unmap(d, va, 2 * G), SA_OK);
  assert_int_equal(d->ops->unmap(d, va, 2 * G), SA_ERR_DRIVER); /* already unmapped */
  assert_int_equal(d->ops->unmap(d, va + 4 * G, 2 * G), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c1), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c2), SA_OK);
  assert_int_equal(d->ops->va_release(d, va, 8 * G), SA_OK);
}

static void same_chunk_mapped_twice_shares_bytes(void **state) {
  (void)state;
  uintptr_t va;
  sa_chunk_handle c;
  assert_int_equal(d->ops->va_reserve(d, 2 * G, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, G, &c), SA_OK);
  assert_int_equal(d->ops->map(d, va, G, c), SA_OK);
  assert_int_equal(d->ops->map(d, va + G, G, c), SA_OK);
  assert_int_equal(d->ops->set_access(d, va, 2 * G), SA_OK);
  ((unsigned char *)va)[77] = 0x5a;
  assert_int_equal(((unsigned char *)(va + G))[77], 0x5a);
  assert_int_equal(d->ops->unmap(d, va, 2 * G), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c), SA_OK);
  assert_int_equal(d->ops->va_release(d, va, 2 * G), SA_OK);
}

static void chunk_released_while_mapped_lives_until_unmapped(void **state) {
  (void)state;
  uintptr_t va;
  sa_chunk_handle c;
  sa_host_counters cnt;
  assert_int_equal(d->ops->va_reserve(d, 2 * G, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, G, &c), SA_OK);
  assert_int_equal(d->ops->map(d, va, G, c), SA_OK);
  assert_int_equal(d->ops->set_access(d, va, G), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c), SA_OK);
  ((unsigned char *)va)[5] = 9; /* still backed */
  assert_int_equal(((unsigned char *)va)[5], 9);
  assert_int_equal(d->ops->map(d, va + G, G, c), SA_ERR_DRIVER); /* the handle is gone */
  assert_int_equal(d->ops->chunk_release(d, c), SA_ERR_DRIVER);
  sa_host_get_counters(&cnt);
  assert_int_equal(cnt.chunks, 1); /* its memory is not */
  assert_int_equal(cnt.chunk_bytes, G);
  assert_int_equal(d->ops->unmap(d, va, G), SA_OK);
  sa_host_get_counters(&cnt);
  assert_int_equal(cnt.chunks, 0);
  assert_int_equal(cnt.chunk_bytes, 0);
  assert_int_equal(d->ops->va_release(d, va, 2 * G), SA_OK);
}

static void released_chunk_memory_comes_back_zeroed(void **state) {
  (void)state;
  uintptr_t va;
  sa_chunk_handle c;
  assert_int_equal(d->ops->va_reserve(d, G, 0, &va), SA_OK);
  for (int round = 0; round < 3; round++) {
    assert_int_equal(d->ops->chunk_create(d, G, &c), SA_OK);
    assert_int_equal(d->ops->map(d, va, G, c), SA_OK);
    assert_int_equal(d->ops->set_access(d, va, G), SA_OK);
    for (size_t i = 0; i < G; i += 4096) assert_int_equal(((unsigned char *)va)[i], 0);
    memset((void *)va, 0xff, G);
    assert_int_equal(d->ops->unmap(d, va, G), SA_OK);
    assert_int_equal(d->ops->chunk_release(d, c), SA_OK);
  }
  assert_int_equal(d->ops->va_release(d, va, G), SA_OK);
}

static void chunks_beyond_device_memory_fail_with_oom(void **state) {
  (void)state;
  sa_chunk_handle c[4], extra;
  assert_int_equal(sa_host_set_device_memory(4 * G), SA_OK);
  size_t total = 0;
  assert_int_equal(d->ops->total_memory(d, &total), SA_OK);
  assert_int_equal(total, 4 * G);
  for (int i = 0; i < 4; i++) assert_int_equal(d->ops->chunk_create(d, G, &c[i]), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, G, &extra), SA_ERR_OUT_OF_MEMORY);
  assert_int_equal(sa_host_set_device_memory(2 * G), SA_ERR_INVALID_ARGUMENT); /* below use */
  assert_int_equal(d->ops->chunk_release(d, c[1]), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, 2 * G, &extra), SA_ERR_OUT_OF_MEMORY);
  assert_int_equal(d->ops->chunk_create(d, G, &c[1]), SA_OK);
  for (int i = 0; i < 4; i++) assert_int_equal(d->ops->chunk_release(d, c[i]), SA_OK);
  assert_int_equal(sa_host_set_device_memory(0), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_host_set_device_memory((size_t)16 << 30), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, 0, &extra), SA_ERR_DRIVER);
  assert_int_equal(d->ops->chunk_create(d, G / 2, &extra), SA_ERR_DRIVER);
}

static void thousands_of_chunks_share_one_fd(void **state) {
  (void)state;
  enum { N = 3000 };
  static sa_chunk_handle c[N];
  size_t fds = open_fds();
  assert_int_equal(sa_host_set_device_memory((size_t)N * G), SA_OK);
  for (int i = 0; i < N; i++) assert_int_equal(d->ops->chunk_create(d, G, &c[i]), SA_OK);
  assert_true(open_fds() <= fds + 1); /* the device's memfd, if it was not open yet */
  sa_host_counters cnt;
  sa_host_get_counters(&cnt);
  assert_int_equal(cnt.chunks, N);
  assert_int_equal(cnt.chunk_bytes, (size_t)N * G);
  /* Release every other one, then fill the holes with larger chunks. */
  for (int i = 0; i < N; i += 2) assert_int_equal(d->ops->chunk_release(d, c[i]), SA_OK);
  for (int i = 0; i < N / 2; i += 2) assert_int_equal(d->ops->chunk_create(d, 2 * G, &c[i]), SA_OK);
  for (int i = 0; i < N / 2; i += 2) assert_int_equal(d->ops->chunk_release(d, c[i]), SA_OK);
  for (int i = 1; i < N; i += 2) assert_int_equal(d->ops->chunk_release(d, c[i]), SA_OK);
  assert_int_equal(sa_host_set_device_memory((size_t)16 << 30), SA_OK);
}

static void counters_follow_ranges_chunks_and_mappings(void **state) {
  (void)state;
  uintptr_t v1, v2;
  sa_chunk_handle c1, c2;
  sa_host_counters cnt;
  assert_int_equal(d->ops->va_reserve(d, 4 * G, 0, &v1), SA_OK);
  assert_int_equal(d->ops->va_reserve(d, G, 0, &v2), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, G, &c1), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, 3 * G, &c2), SA_OK);
  assert_int_equal(d->ops->map(d, v1, G, c1), SA_OK);
  assert_int_equal(d->ops->map(d, v1 + G, 3 * G, c2), SA_OK);
  sa_host_get_counters(&cnt);
  assert_int_equal(cnt.va_ranges, 2);
  assert_int_equal(cnt.chunks, 2);
  assert_int_equal(cnt.chunk_bytes, 4 * G);
  assert_int_equal(cnt.mappings, 2);
  assert_int_equal(d->ops->unmap(d, v1, 4 * G), SA_OK);
  sa_host_get_counters(&cnt);
  assert_int_equal(cnt.mappings, 0);
  assert_int_equal(d->ops->chunk_release(d, c1), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c2), SA_OK);
  assert_int_equal(d->ops->va_release(d, v1, 4 * G), SA_OK);
  assert_int_equal(d->ops->va_release(d, v2, G), SA_OK);
  sa_host_get_counters(&cnt);
  assert_int_equal(cnt.va_ranges, 0);
  assert_int_equal(cnt.chunks, 0);
  assert_int_equal(cnt.chunk_bytes, 0);
  sa_host_get_counters(NULL); /* tolerated */
}

static void only_device_zero_exists(void **state) {
  (void)state;
  sa_driver *other = NULL;
  assert_int_equal(sa_driver_host_open(1, &other), SA_ERR_NO_DEVICE);
  assert_null(other);
  assert_int_equal(sa_driver_host_open(0, NULL), SA_ERR_INVALID_ARGUMENT);
  /* A second driver shares the one device. */
  assert_int_equal(sa_driver_host_open(0, &other), SA_OK);
  sa_chunk_handle c;
  assert_int_equal(other->ops->chunk_create(other, G, &c), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c), SA_OK);
  sa_driver_close(other);
}

/* The totals count calls, the bytes of successful calls and the chunks
 * that access settings and unmaps covered, so a run's driver work can be
 * bounded without a GPU. */
static void totals_count_calls_and_bytes(void **state) {
  (void)state;
  sa_host_totals t0, t1;
  sa_host_get_totals(&t0);
  uintptr_t va;
  sa_chunk_handle a, b;
  assert_int_equal(d->ops->va_reserve(d, 8 * G, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, G, &a), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, 2 * G, &b), SA_OK);
  assert_int_equal(d->ops->map(d, va, G, a), SA_OK);
  assert_int_equal(d->ops->map(d, va + G, 2 * G, b), SA_OK);
  assert_int_equal(d->ops->map(d, va, G, b), SA_ERR_DRIVER); /* refused: no bytes */
  assert_int_equal(d->ops->set_access(d, va, 3 * G), SA_OK);
  assert_int_equal(d->ops->unmap(d, va, 3 * G), SA_OK); /* both chunks in one call */
  assert_int_equal(d->ops->chunk_release(d, a), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, b), SA_OK);
  assert_int_equal(d->ops->va_release(d, va, 8 * G), SA_OK);
  sa_host_get_totals(&t1);
  assert_int_equal(t1.calls[SA_HOST_FN_CHUNK_CREATE] - t0.calls[SA_HOST_FN_CHUNK_CREATE], 2);
  assert_int_equal(t1.calls[SA_HOST_FN_MAP] - t0.calls[SA_HOST_FN_MAP], 3);
  assert_int_equal(t1.calls[SA_HOST_FN_SET_ACCESS] - t0.calls[SA_HOST_FN_SET_ACCESS], 1);
  assert_int_equal(t1.calls[SA_HOST_FN_UNMAP] - t0.calls[SA_HOST_FN_UNMAP], 1);
  /* A GPU charges access and unmapping per chunk in the range. */
  assert_int_equal(t1.chunks_access - t0.chunks_access, 2);
  assert_int_equal(t1.chunks_unmapped - t0.chunks_unmapped, 2);
  assert_int_equal(t1.calls[SA_HOST_FN_MAP], sa_host_call_count(SA_HOST_FN_MAP));
  assert_int_equal(t1.bytes_created - t0.bytes_created, 3 * G);
  assert_int_equal(t1.bytes_mapped - t0.bytes_mapped, 3 * G);
  assert_int_equal(t1.bytes_access - t0.bytes_access, 3 * G);
  assert_int_equal(t1.bytes_unmapped - t0.bytes_unmapped, 3 * G);
  assert_int_equal(t1.bytes_released - t0.bytes_released, 3 * G);
  sa_host_get_totals(NULL); /* tolerated */
}

#define T(f) cmocka_unit_test_teardown(f, check_empty)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(granularity_is_2mib),
      T(reserve_honours_alignment),
      T(reserve_rejects_bad_sizes),
      T(mapped_memory_is_readable_and_writable_after_set_access),
      T(remap_keeps_bytes),
      T(access_after_unmap_faults),
      T(double_map_is_rejected),
      T(map_is_validated_like_cuda),
      T(unmap_and_set_access_need_whole_mappings),
      T(same_chunk_mapped_twice_shares_bytes),
      T(chunk_released_while_mapped_lives_until_unmapped),
      T(released_chunk_memory_comes_back_zeroed),
      T(chunks_beyond_device_memory_fail_with_oom),
      T(thousands_of_chunks_share_one_fd),
      T(counters_follow_ranges_chunks_and_mappings),
      T(only_device_zero_exists),
      T(totals_count_calls_and_bytes),
  };
  return sa_fixture_run_with_host_driver(tests, &d);
}
