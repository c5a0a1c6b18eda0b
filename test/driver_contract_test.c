/* The driver contract (src/driver/driver.h), written only against sa_driver_ops so
 * that every backend must pass it. The backend comes from the environment:
 * STREAMARENA_BACKEND=cuda runs it on a GPU, unset (or host) on the host
 * simulator. Device memory is never touched from the CPU here: writes go
 * through memset32_async and reads through copy_to_host.
 *
 * The peer case needs two devices: the simulator is given a second one; on
 * CUDA it skips, saying so, where the machine has fewer than two GPUs, and
 * there it also runs a PTX kernel on device 1 over device 0's memory
 * (cuda_kernels.h). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <streamarena/host.h>

#include "cuda_kernels.h"
#include "driver/driver.h"

static sa_driver *d;
static size_t g; /* the backend's granularity */

static int setup(void **state) {
  (void)state;
  const char *env = getenv("STREAMARENA_BACKEND");
  sa_backend b = env != NULL && env[0] != '\0' ? SA_BACKEND_AUTO : SA_BACKEND_HOST;
  sa_status st = sa_driver_open(b, 0, &d);
  if (st != SA_OK) {
    fprintf(stderr, "driver_contract_test: cannot open backend %s: status %d\n",
            env != NULL ? env : "host", (int)st);
    return -1;
  }
  fprintf(stderr, "driver_contract_test: backend %s\n", d->ops->name);
  return d->ops->granularity(d, &g) == SA_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  sa_driver_close(d);
  return 0;
}

/* Words of [src, src + bytes) that are not value, read back to the host. */
static size_t mismatches(uintptr_t src, size_t bytes, uint32_t value) {
  uint32_t *host = malloc(bytes);
  assert_non_null(host);
  assert_int_equal(d->ops->copy_to_host(d, host, src, bytes), SA_OK);
  size_t bad = 0;
  for (size_t i = 0; i < bytes / 4; i++) bad += host[i] != value;
  free(host);
  return bad;
}

static void fill(uintptr_t dst, size_t bytes, uint32_t value, sa_stream s) {
  assert_int_equal(d->ops->memset32_async(d, dst, value, bytes / 4, s), SA_OK);
}

static void map_rw(uintptr_t va, size_t size, sa_chunk_handle c) {
  assert_int_equal(d->ops->map(d, va, size, c), SA_OK);
  assert_int_equal(d->ops->set_access(d, va, size), SA_OK);
}

static sa_stream new_stream(void) {
  sa_stream s = NULL;
  assert_int_equal(d->ops->stream_create(d, &s), SA_OK);
  assert_int_equal(d->ops->stream_validate(d, s), SA_OK);
  return s;
}

static void granularity_is_a_power_of_two_within_device_memory(void **state) {
  (void)state;
  size_t total = 0;
  assert_true(g >= 4096);
  assert_int_equal(g & (g - 1), 0);
  assert_int_equal(d->ops->total_memory(d, &total), SA_OK);
  assert_true(total >= g);
  assert_non_null(d->ops->name);
}

static void reserve_honours_alignment(void **state) {
  (void)state;
  uintptr_t va = 0;
  assert_int_equal(d->ops->va_reserve(d, 2 * g, 8 * g, &va), SA_OK);
  assert_int_equal(va % (8 * g), 0);
  assert_int_equal(d->ops->va_release(d, va, 2 * g), SA_OK);
}

static void written_memory_reads_back(void **state) {
  (void)state;
  uintptr_t va;
  sa_chunk_handle c;
  sa_stream s = new_stream();
  assert_int_equal(d->ops->va_reserve(d, 2 * g, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, g, &c), SA_OK);
  map_rw(va, g, c);
  fill(va, g, 0xdeadbeefu, s);
  assert_int_equal(d->ops->stream_synchronize(d, s), SA_OK);
  assert_int_equal(mismatches(va, g, 0xdeadbeefu), 0);
  fill(va + 4096, 4096, 7, s);
  assert_int_equal(d->ops->stream_synchronize(d, s), SA_OK);
  assert_int_equal(mismatches(va, 4096, 0xdeadbeefu), 0);
  assert_int_equal(mismatches(va + 4096, 4096, 7), 0);
  assert_int_equal(mismatches(va + 8192, 4096, 0xdeadbeefu), 0);
  assert_int_equal(d->ops->unmap(d, va, g), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c), SA_OK);
  assert_int_equal(d->ops->va_release(d, va, 2 * g), SA_OK);
  assert_int_equal(d->ops->stream_destroy(d, s), SA_OK);
}

/* A stream query answers SA_OK or SA_ERR_NOT_READY while work is queued
 * (never a failure), and SA_OK once the stream was synchronized. */
static void stream_query_says_idle_after_a_synchronize(void **state) {
  (void)state;
  uintptr_t va;
  sa_chunk_handle c;
  sa_stream s = new_stream();
  assert_int_equal(d->ops->stream_query(d, s), SA_OK); /* nothing enqueued */
  assert_int_equal(d->ops->va_reserve(d, g, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, g, &c), SA_OK);
  map_rw(va, g, c);
  fill(va, g, 0x5eed5eedu, s);
  sa_status st = d->ops->stream_query(d, s);
  assert_true(st == SA_OK || st == SA_ERR_NOT_READY);
  assert_int_equal(d->ops->stream_synchronize(d, s), SA_OK);
  assert_int_equal(d->ops->stream_query(d, s), SA_OK);
  assert_int_equal(d->ops->unmap(d, va, g), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c), SA_OK);
  assert_int_equal(d->ops->va_release(d, va, g), SA_OK);
  assert_int_equal(d->ops->stream_destroy(d, s), SA_OK);
}

static void remap_keeps_bytes(void **state) {
  (void)state;
  uintptr_t va, other;
  sa_chunk_handle c;
  sa_stream s = new_stream();
  assert_int_equal(d->ops->va_reserve(d, 2 * g, 0, &va), SA_OK);
  assert_int_equal(d->ops->va_reserve(d, g, 0, &other), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, g, &c), SA_OK);
  map_rw(va, g, c);
  fill(va, g, 0x12345678u, s);
  assert_int_equal(d->ops->stream_synchronize(d, s), SA_OK);
  assert_int_equal(d->ops->unmap(d, va, g), SA_OK);
  map_rw(va + g, g, c); /* elsewhere in the same range */
  assert_int_equal(mismatches(va + g, g, 0x12345678u), 0);
  assert_int_equal(d->ops->unmap(d, va + g, g), SA_OK);
  map_rw(other, g, c); /* in another range */
  assert_int_equal(mismatches(other, g, 0x12345678u), 0);
  assert_int_equal(d->ops->unmap(d, other, g), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c), SA_OK);
  assert_int_equal(d->ops->va_release(d, va, 2 * g), SA_OK);
  assert_int_equal(d->ops->va_release(d, other, g), SA_OK);
  assert_int_equal(d->ops->stream_destroy(d, s), SA_OK);
}

static void one_unmap_covers_several_chunks(void **state) {
  (void)state;
  uintptr_t va;
  sa_chunk_handle c1, c2;
  sa_stream s = new_stream();
  assert_int_equal(d->ops->va_reserve(d, 3 * g, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, g, &c1), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, 2 * g, &c2), SA_OK);
  assert_int_equal(d->ops->map(d, va, g, c1), SA_OK);
  assert_int_equal(d->ops->map(d, va + g, 2 * g, c2), SA_OK);
  assert_int_equal(d->ops->set_access(d, va, 3 * g), SA_OK); /* one call for both */
  fill(va, 3 * g, 0xa5a5a5a5u, s);                            /* across the seam */
  assert_int_equal(d->ops->stream_synchronize(d, s), SA_OK);
  assert_int_equal(mismatches(va, 3 * g, 0xa5a5a5a5u), 0);
  assert_int_equal(d->ops->unmap(d, va, 3 * g), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c1), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c2), SA_OK);
  assert_int_equal(d->ops->va_release(d, va, 3 * g), SA_OK);
  assert_int_equal(d->ops->stream_destroy(d, s), SA_OK);
}

/* The allocator maps every chunk whole (src/vm/physical.c): on an H200 with
 * driver 580 a map at an offset into a chunk failed, so a chunk is also
 * the unit of unmapping. A map of part of a chunk is refused on both
 * backends; the whole chunk maps. */
static void a_chunk_maps_only_whole(void **state) {
  (void)state;
  uintptr_t va;
  sa_chunk_handle c;
  assert_int_equal(d->ops->va_reserve(d, 3 * g, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, 3 * g, &c), SA_OK);
  assert_int_not_equal(d->ops->map(d, va, g, c), SA_OK);
  assert_int_equal(d->ops->map(d, va, 3 * g, c), SA_OK);
  assert_int_equal(d->ops->set_access(d, va, 3 * g), SA_OK);
  assert_int_equal(d->ops->unmap(d, va, 3 * g), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c), SA_OK);
  assert_int_equal(d->ops->va_release(d, va, 3 * g), SA_OK);
}

static void chunks_are_created_and_released(void **state) {
  (void)state;
  sa_chunk_handle c[4];
  for (int i = 0; i < 4; i++) assert_int_equal(d->ops->chunk_create(d, (size_t)(i + 1) * g, &c[i]), SA_OK);
  for (int i = 0; i < 4; i++) assert_int_equal(d->ops->chunk_release(d, c[i]), SA_OK);
}

static void chunk_released_while_mapped_stays_usable_until_unmapped(void **state) {
  (void)state;
  uintptr_t va;
  sa_chunk_handle c;
  sa_stream s = new_stream();
  assert_int_equal(d->ops->va_reserve(d, g, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, g, &c), SA_OK);
  map_rw(va, g, c);
  assert_int_equal(d->ops->chunk_release(d, c), SA_OK);
  fill(va, g, 99, s);
  assert_int_equal(d->ops->stream_synchronize(d, s), SA_OK);
  assert_int_equal(mismatches(va, g, 99), 0);
  assert_int_equal(d->ops->unmap(d, va, g), SA_OK);
  assert_int_equal(d->ops->va_release(d, va, g), SA_OK);
  assert_int_equal(d->ops->stream_destroy(d, s), SA_OK);
}

static void events_record_query_and_synchronize(void **state) {
  (void)state;
  uintptr_t va;
  sa_chunk_handle c;
  sa_event e = NULL;
  sa_stream s = new_stream();
  assert_int_equal(d->ops->event_create(d, &e), SA_OK);
  assert_int_equal(d->ops->event_query(d, e), SA_OK); /* never recorded: complete */
  assert_int_equal(d->ops->event_synchronize(d, e), SA_OK);
  assert_int_equal(d->ops->va_reserve(d, g, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, g, &c), SA_OK);
  map_rw(va, g, c);
  fill(va, g, 5, s);
  assert_int_equal(d->ops->event_record(d, e, s), SA_OK);
  sa_status q = d->ops->event_query(d, e);
  assert_true(q == SA_OK || q == SA_ERR_NOT_READY);
  assert_int_equal(d->ops->event_synchronize(d, e), SA_OK);
  assert_int_equal(d->ops->event_query(d, e), SA_OK);
  assert_int_equal(mismatches(va, g, 5), 0); /* the work before the record is done */
  assert_int_equal(d->ops->event_record(d, e, NULL), SA_OK); /* re-record, default stream */
  assert_int_equal(d->ops->stream_synchronize(d, NULL), SA_OK);
  assert_int_equal(d->ops->event_query(d, e), SA_OK);
  assert_int_equal(d->ops->event_destroy(d, e), SA_OK);
  assert_int_equal(d->ops->unmap(d, va, g), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c), SA_OK);
  assert_int_equal(d->ops->va_release(d, va, g), SA_OK);
  assert_int_equal(d->ops->stream_destroy(d, s), SA_OK);
}

static void stream_wait_event_orders_work_across_streams(void **state) {
  (void)state;
  enum { ROUNDS = 8 };
  uintptr_t va;
  sa_chunk_handle c;
  sa_event e[ROUNDS];
  sa_stream a = new_stream(), b = new_stream();
  size_t size = 4 * g;
  assert_int_equal(d->ops->va_reserve(d, size, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, size, &c), SA_OK);
  map_rw(va, size, c);
  /* a writes, b waits for it and overwrites: only b's values may remain. */
  for (int r = 0; r < ROUNDS; r++) {
    assert_int_equal(d->ops->event_create(d, &e[r]), SA_OK);
    fill(va, size, (uint32_t)(2 * r + 1), a);
    assert_int_equal(d->ops->event_record(d, e[r], a), SA_OK);
    assert_int_equal(d->ops->stream_wait_event(d, b, e[r]), SA_OK);
    fill(va, size, (uint32_t)(2 * r + 2), b);
  }
  assert_int_equal(d->ops->stream_synchronize(d, b), SA_OK); /* b only */
  for (int r = 0; r < ROUNDS; r++) assert_int_equal(d->ops->event_query(d, e[r]), SA_OK);
  assert_int_equal(mismatches(va, size, 2 * ROUNDS), 0);
  for (int r = 0; r < ROUNDS; r++) assert_int_equal(d->ops->event_destroy(d, e[r]), SA_OK);
  assert_int_equal(d->ops->stream_synchronize(d, a), SA_OK);
  assert_int_equal(d->ops->unmap(d, va, size), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c), SA_OK);
  assert_int_equal(d->ops->va_release(d, va, size), SA_OK);
  assert_int_equal(d->ops->stream_destroy(d, a), SA_OK);
  assert_int_equal(d->ops->stream_destroy(d, b), SA_OK);
}

static void destroyed_stream_still_completes_its_work(void **state) {
  (void)state;
  uintptr_t va;
  sa_chunk_handle c;
  sa_event e = NULL;
  sa_stream s = new_stream();
  assert_int_equal(d->ops->event_create(d, &e), SA_OK);
  assert_int_equal(d->ops->va_reserve(d, g, 0, &va), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, g, &c), SA_OK);
  map_rw(va, g, c);
  fill(va, g, 0x77777777u, s);
  assert_int_equal(d->ops->event_record(d, e, s), SA_OK);
  assert_int_equal(d->ops->stream_destroy(d, s), SA_OK);
  assert_int_equal(d->ops->event_synchronize(d, e), SA_OK);
  assert_int_equal(mismatches(va, g, 0x77777777u), 0);
  assert_int_equal(d->ops->event_destroy(d, e), SA_OK);
  assert_int_equal(d->ops->unmap(d, va, g), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, c), SA_OK);
  assert_int_equal(d->ops->va_release(d, va, g), SA_OK);
}

static void streams_are_created_validated_and_destroyed(void **state) {
  (void)state;
  sa_stream s1 = new_stream(), s2 = new_stream();
  assert_ptr_not_equal(s1, s2);
  assert_int_equal(d->ops->stream_validate(d, NULL), SA_OK);
  assert_int_equal(d->ops->stream_synchronize(d, s1), SA_OK);
  assert_int_equal(d->ops->stream_destroy(d, s1), SA_OK);
  assert_int_equal(d->ops->stream_destroy(d, s2), SA_OK);
  if (d->backend == SA_BACKEND_HOST) {
    /* Only the simulator can tell a bogus handle without touching it. */
    static int not_a_stream;
    assert_int_equal(d->ops->stream_validate(d, &not_a_stream), SA_ERR_UNKNOWN_STREAM);
    assert_int_equal(d->ops->stream_validate(d, s1), SA_ERR_UNKNOWN_STREAM);
  }
}

/* Device 1 runs its kernel (PTX mad_words: every word read, times 3 plus
 * 1, written back) over [va, va + bytes) of device 0 on its stream s1, in
 * its primary context; and cuMemGetAccess agrees with the grants: device 1
 * may read and write va, not plain (mapped for device 0 alone). */
static void cuda_peer_kernel(uintptr_t va, size_t bytes, sa_stream s1, uintptr_t plain) {
  if (sa_cu_load_all() != SA_OK)
    fail_msg("the backend runs on CUDA but libcuda.so.1 did not load here");
  CUdevice dev1;
  CUcontext ctx1 = NULL, saved = NULL;
  CUmodule module = NULL;
  CUfunction mad;
  assert_int_equal(sa_cu.DeviceGet(&dev1, 1), CUDA_SUCCESS);
  assert_int_equal(sa_cu.CtxGetCurrent(&saved), CUDA_SUCCESS);
  assert_int_equal(sa_cu.DevicePrimaryCtxRetain(&ctx1, dev1), CUDA_SUCCESS);
  assert_int_equal(sa_cu.CtxSetCurrent(ctx1), CUDA_SUCCESS);
  unsigned long long flags = 0;
  CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1};
  assert_int_equal(sa_cu.MemGetAccess(&flags, &loc, (CUdeviceptr)va), CUDA_SUCCESS);
  assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  assert_int_equal(sa_cu.MemGetAccess(&flags, &loc, (CUdeviceptr)plain), CUDA_SUCCESS);
  assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  loc.id = 0;
  assert_int_equal(sa_cu.MemGetAccess(&flags, &loc, (CUdeviceptr)plain), CUDA_SUCCESS);
  assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CUresult r = sa_cu.ModuleLoadData(&module, sa_cu_mad_words_ptx);
  if (r != CUDA_SUCCESS) fail_msg("loading the PTX kernel on device 1: %s", sa_cu_error_name(r));
  assert_int_equal(sa_cu.ModuleGetFunction(&mad, module, "mad_words"), CUDA_SUCCESS);
  CUdeviceptr p = (CUdeviceptr)va;
  unsigned n = (unsigned)(bytes / 4), mul = 3, add = 1;
  void *args[] = {&p, &n, &mul, &add};
  r = sa_cu.LaunchKernel(mad, 120, 1, 1, 256, 1, 1, 0, (CUstream)s1, args, NULL);
  if (r != CUDA_SUCCESS) fail_msg("launching on device 1: %s", sa_cu_error_name(r));
  r = sa_cu.StreamSynchronize((CUstream)s1);
  if (r != CUDA_SUCCESS) fail_msg("the kernel of device 1 failed: %s", sa_cu_error_name(r));
  assert_int_equal(sa_cu.ModuleUnload(module), CUDA_SUCCESS);
  assert_int_equal(sa_cu.CtxSetCurrent(saved), CUDA_SUCCESS);
  assert_int_equal(sa_cu.DevicePrimaryCtxRelease(dev1), CUDA_SUCCESS);
}

static void peer_reads_and_writes_memory_of_device_0(void **state) {
  (void)state;
  int devices = 0;
  if (d->backend == SA_BACKEND_HOST) {
    assert_int_equal(sa_host_set_device_count(2), SA_OK);
    devices = 2;
  } else if (sa_driver_cuda_device_count(&devices) != SA_OK || devices < 2) {
    printf("driver_contract_test: peer case skipped: this machine has %d CUDA device(s), the "
           "case needs 2\n", devices);
    skip();
  }
  sa_driver *d0 = NULL, *d1 = NULL;
  assert_int_equal(sa_driver_open(d->backend, 0, &d0), SA_OK);
  assert_int_equal(sa_driver_open(d->backend, 1, &d1), SA_OK);
  if (devices < 64) {
    assert_int_equal(d0->ops->set_peer_access(d0, (uint64_t)1 << devices), SA_ERR_NO_DEVICE);
  }
  assert_int_equal(d0->ops->set_peer_access(d0, (uint64_t)1 << 1), SA_OK);
  sa_stream s0 = NULL, s1 = NULL;
  assert_int_equal(d0->ops->stream_create(d0, &s0), SA_OK);
  assert_int_equal(d1->ops->stream_create(d1, &s1), SA_OK);
  assert_int_equal(d0->ops->stream_validate(d0, s1), SA_ERR_UNKNOWN_STREAM);
  const char *why = NULL;
  (void)sa_last_driver_error(&why);
  assert_non_null(strstr(why, "stream of another device"));
  assert_int_equal(d1->ops->stream_validate(d1, s1), SA_OK);

  /* va: device 0's memory granted to device 1; plain: device 0's alone. */
  uintptr_t va, plain;
  sa_chunk_handle c, cp;
  assert_int_equal(d0->ops->va_reserve(d0, 2 * g, 0, &va), SA_OK);
  assert_int_equal(d0->ops->chunk_create(d0, 2 * g, &c), SA_OK);
  assert_int_equal(d0->ops->map(d0, va, 2 * g, c), SA_OK);
  assert_int_equal(d0->ops->set_access(d0, va, 2 * g), SA_OK);
  assert_int_equal(d->ops->va_reserve(d, g, 0, &plain), SA_OK);
  assert_int_equal(d->ops->chunk_create(d, g, &cp), SA_OK);
  map_rw(plain, g, cp);

  /* Device 0 writes it all, device 1 the second half; both read it. */
  assert_int_equal(d0->ops->memset32_async(d0, va, 0x1000u, 2 * g / 4, s0), SA_OK);
  assert_int_equal(d0->ops->stream_synchronize(d0, s0), SA_OK);
  assert_int_equal(d1->ops->memset32_async(d1, va + g, 0x2222u, g / 4, s1), SA_OK);
  assert_int_equal(d1->ops->stream_synchronize(d1, s1), SA_OK);
  uint32_t *host = malloc(2 * g);
  assert_non_null(host);
  assert_int_equal(d1->ops->copy_to_host(d1, host, va, 2 * g), SA_OK);
  size_t bad = 0;
  for (size_t i = 0; i < 2 * g / 4; i++) bad += host[i] != (i < g / 4 ? 0x1000u : 0x2222u);
  assert_int_equal(bad, 0);
  uint32_t m0 = 0x1000u, m1 = 0x2222u;
  if (d->backend == SA_BACKEND_HOST) {
    /* Device 1 may not touch plain: the simulator refuses the work. */
    assert_int_equal(d1->ops->memset32_async(d1, plain, 1, 16, s1), SA_ERR_DRIVER);
  } else {
    cuda_peer_kernel(va, 2 * g, s1, plain);
    m0 = m0 * 3 + 1;
    m1 = m1 * 3 + 1;
  }
  assert_int_equal(d0->ops->copy_to_host(d0, host, va, 2 * g), SA_OK);
  for (size_t i = 0; i < 2 * g / 4; i++) bad += host[i] != (i < g / 4 ? m0 : m1);
  free(host);
  printf("driver_contract_test: peer case on %s: device 1 wrote %zu and read %zu bytes of device "
         "0's memory%s, %zu words wrong\n", d->ops->name, g, 2 * g,
         d->backend == SA_BACKEND_CUDA ? ", its kernel read and rewrote every word" : "", bad);
  assert_int_equal(bad, 0);

  assert_int_equal(d->ops->unmap(d, plain, g), SA_OK);
  assert_int_equal(d->ops->chunk_release(d, cp), SA_OK);
  assert_int_equal(d->ops->va_release(d, plain, g), SA_OK);
  assert_int_equal(d0->ops->unmap(d0, va, 2 * g), SA_OK);
  assert_int_equal(d0->ops->chunk_release(d0, c), SA_OK);
  assert_int_equal(d0->ops->va_release(d0, va, 2 * g), SA_OK);
  assert_int_equal(d0->ops->stream_destroy(d0, s0), SA_OK);
  assert_int_equal(d1->ops->stream_destroy(d1, s1), SA_OK);
  sa_driver_close(d0);
  sa_driver_close(d1);
  if (d->backend == SA_BACKEND_HOST) assert_int_equal(sa_host_set_device_count(1), SA_OK);
}

/* What a thread saw of NULL: with no device current, and then inside
 * d0's call_on_stream on NULL. */
typedef struct legacy_probe_s {
  sa_driver *d0, *d1;
  sa_status none0, none1;     /* stream_validate(NULL), no device current */
  sa_status own, other, check, check_explicit, legacy; /* device 0 current */
  char why[256];              /* the refusal's description */
  sa_status called, after1;   /* call_on_stream's status; d1's NULL after it */
  sa_stream s1;
} legacy_probe;

static sa_status probe_with_device_0_current(void *arg) {
  legacy_probe *p = arg;
  const char *why = NULL;
  p->own = p->d0->ops->stream_validate(p->d0, NULL);
  p->other = p->d1->ops->stream_validate(p->d1, NULL);
  (void)sa_last_driver_error(&why);
  snprintf(p->why, sizeof p->why, "%s", why);
  p->check = p->d1->ops->legacy_stream_check(p->d1, NULL);
  p->check_explicit = p->d1->ops->legacy_stream_check(p->d1, p->s1);
  p->legacy = p->d1->backend == SA_BACKEND_CUDA
                  ? p->d1->ops->stream_validate(p->d1, (sa_stream)(uintptr_t)1)
                  : SA_ERR_UNKNOWN_STREAM; /* CU_STREAM_LEGACY: CUDA's alone */
  return SA_ERR_NOT_READY; /* handed back as it is */
}

static void *probe_thread(void *arg) {
  legacy_probe *p = arg;
  p->none0 = p->d0->ops->stream_validate(p->d0, NULL);
  p->none1 = p->d1->ops->stream_validate(p->d1, NULL);
  p->called = p->d0->ops->call_on_stream(p->d0, NULL, probe_with_device_0_current, p);
  p->after1 = p->d1->ops->stream_validate(p->d1, NULL);
  return NULL;
}

/* NULL names the legacy stream of the calling thread's current context (on
 * the simulator: device): a driver takes it where its own device or none is
 * current, and refuses it where another device is, naming both (an arena
 * would order its frees after a stream the user's work is not on); an
 * explicit stream needs no current context. call_on_stream on NULL makes the
 * driver's device current for one call, hands back its status and then
 * puts back what was current: here, none. */
static void null_names_the_legacy_stream_of_the_current_device(void **state) {
  (void)state;
  int devices = 0;
  if (d->backend == SA_BACKEND_HOST) {
    assert_int_equal(sa_host_set_device_count(2), SA_OK);
  } else if (sa_driver_cuda_device_count(&devices) != SA_OK || devices < 2) {
    printf("driver_contract_test: NULL case skipped: this machine has %d CUDA device(s), the "
           "case needs 2\n", devices);
    skip();
  }
  legacy_probe p = {0};
  assert_int_equal(sa_driver_open(d->backend, 0, &p.d0), SA_OK);
  assert_int_equal(sa_driver_open(d->backend, 1, &p.d1), SA_OK);
  assert_int_equal(p.d1->ops->stream_create(p.d1, &p.s1), SA_OK);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, probe_thread, &p), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(p.none0, SA_OK);
  assert_int_equal(p.none1, SA_OK);
  assert_int_equal(p.called, SA_ERR_NOT_READY);
  assert_int_equal(p.own, SA_OK);
  assert_int_equal(p.other, SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(p.check, SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(p.check_explicit, SA_OK);
  assert_int_equal(p.legacy, SA_ERR_UNKNOWN_STREAM);
  if (strstr(p.why, "NULL stream of another device") == NULL ||
      strstr(p.why, "stream of device 0, current on this thread, not device 1's") == NULL ||
      strstr(p.why, "make device 1 current") == NULL)
    fail_msg("the refusal says '%s'", p.why);
  assert_int_equal(p.after1, SA_OK); /* no device current again */
  assert_int_equal(p.d1->ops->stream_destroy(p.d1, p.s1), SA_OK);
  sa_driver_close(p.d0);
  sa_driver_close(p.d1);
  if (d->backend == SA_BACKEND_HOST) assert_int_equal(sa_host_set_device_count(1), SA_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(granularity_is_a_power_of_two_within_device_memory),
      cmocka_unit_test(reserve_honours_alignment),
      cmocka_unit_test(written_memory_reads_back),
      cmocka_unit_test(stream_query_says_idle_after_a_synchronize),
      cmocka_unit_test(remap_keeps_bytes),
      cmocka_unit_test(one_unmap_covers_several_chunks),
      cmocka_unit_test(a_chunk_maps_only_whole),
      cmocka_unit_test(chunks_are_created_and_released),
      cmocka_unit_test(chunk_released_while_mapped_stays_usable_until_unmapped),
      cmocka_unit_test(events_record_query_and_synchronize),
      cmocka_unit_test(stream_wait_event_orders_work_across_streams),
      cmocka_unit_test(destroyed_stream_still_completes_its_work),
      cmocka_unit_test(streams_are_created_validated_and_destroyed),
      cmocka_unit_test(peer_reads_and_writes_memory_of_device_0),
      cmocka_unit_test(null_names_the_legacy_stream_of_the_current_device),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
