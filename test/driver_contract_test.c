/* The driver contract (src/driver/driver.h), written only against sa_driver_ops so
 * that every backend must pass it. The backend comes from the environment:
 * STREAMARENA_BACKEND=cuda runs it on a GPU, unset (or host) on the host
 * simulator. Device memory is never touched from the CPU here: writes go
 * through memset32_async and reads through copy_to_host. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(granularity_is_a_power_of_two_within_device_memory),
      cmocka_unit_test(reserve_honours_alignment),
      cmocka_unit_test(written_memory_reads_back),
      cmocka_unit_test(remap_keeps_bytes),
      cmocka_unit_test(one_unmap_covers_several_chunks),
      cmocka_unit_test(chunks_are_created_and_released),
      cmocka_unit_test(chunk_released_while_mapped_stays_usable_until_unmapped),
      cmocka_unit_test(events_record_query_and_synchronize),
      cmocka_unit_test(stream_wait_event_orders_work_across_streams),
      cmocka_unit_test(destroyed_stream_still_completes_its_work),
      cmocka_unit_test(streams_are_created_validated_and_destroyed),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
