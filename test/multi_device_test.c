/* Several devices on the host simulator: per-device memory, streams,
 * default streams and arenas, the default arena of the thread's current
 * device, streams of one device refused by another's arena, NULL as the
 * legacy stream of the thread's current device (streamarena.h, on
 * sa_stream), and peer access (a kernel of device 1 on device 0's memory
 * runs only where the arena granted it, through growth, stitching, trims
 * and new superblock sizes). Every case runs on two (or three) simulated
 * devices and leaves the simulator as it found it.
 *
 * The same bookkeeping on two real GPUs: driver_contract_test (peer and
 * NULL cases), gpu_multi_device_test and gpu_torture_test with
 * STREAMARENA_TEST_DEVICE=1; cuda_fake_test runs cuda.c's NULL rule on a
 * fake libcuda. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "driver/driver.h"
#include "device_switch.h"
#include "fixture.h"
#include "test/util.h"

/* Arena specs (sa_fixture_arena_create) start with this. */
#define ON_HOST "backend=host,check_stream_order=1,"

static sa_host_counters before;
/* Figures for the summary line. */
static unsigned long long total_allocs, peer_fills, refused_fills;

static int two_devices(void **state) {
  (void)state;
  sa_host_get_counters(&before);
  return sa_host_set_device_count(2) == SA_OK ? 0 : -1;
}

/* Back to one device: fails if a second one still holds a chunk or a
 * stream; and nothing may be left over at all. */
static int back_to_one_device(void **state) {
  (void)state;
  sa_host_counters now;
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++) (void)sa_host_set_can_access_peer(i, j, 1);
  if (sa_host_set_device(0) != SA_OK || sa_host_set_device_count(1) != SA_OK) {
    fprintf(stderr, "multi_device_test: a device still holds chunks or streams\n");
    return -1;
  }
  sa_host_get_counters(&now);
  if (now.va_ranges != before.va_ranges || now.chunks != before.chunks ||
      now.mappings != before.mappings || now.events != before.events ||
      now.streams != before.streams) {
    fprintf(stderr, "multi_device_test: leaked ranges %zu chunks %zu mappings %zu events %zu "
            "streams %zu\n", now.va_ranges - before.va_ranges, now.chunks - before.chunks,
            now.mappings - before.mappings, now.events - before.events,
            now.streams - before.streams);
    return -1;
  }
  return 0;
}

static sa_stream stream_on(int device, sa_host_mode mode) {
  int was = sa_host_get_device();
  sa_stream s = NULL;
  sa_assert_ok(sa_host_set_device(device));
  sa_assert_ok(sa_host_stream_create(mode, &s));
  sa_assert_ok(sa_host_set_device(was));
  return s;
}

static int device_of(const void *p) {
  int dev = -1;
  sa_assert_ok(sa_host_pointer_device(p, &dev));
  return dev;
}

static uint64_t violations(void) {
  sa_host_counters c;
  sa_host_get_counters(&c);
  return c.order_violations;
}

/* ---- the simulator ----------------------------------------------------- */

static void device_count_is_configurable_and_guarded(void **state) {
  (void)state;
  assert_int_equal(sa_host_device_count(), 2);
  sa_assert_status(sa_host_set_device_count(0), SA_ERR_INVALID_ARGUMENT);
  sa_assert_status(sa_host_set_device_count(SA_HOST_MAX_DEVICES + 1), SA_ERR_INVALID_ARGUMENT);
  sa_assert_status(sa_host_set_device(2), SA_ERR_NO_DEVICE);
  sa_assert_status(sa_host_set_device(-1), SA_ERR_NO_DEVICE);
  assert_int_equal(sa_host_get_device(), 0);
  sa_driver *d = NULL;
  sa_assert_status(sa_driver_host_open(2, &d), SA_ERR_NO_DEVICE);
  /* A device holding a stream cannot go away. */
  sa_stream s = stream_on(1, SA_HOST_AUTO);
  int dev = -1;
  sa_assert_ok(sa_host_stream_device(s, &dev));
  assert_int_equal(dev, 1);
  /* NULL is the default stream of the thread's current device. */
  sa_assert_ok(sa_host_set_device(1));
  sa_assert_ok(sa_host_stream_device(NULL, &dev));
  assert_int_equal(dev, 1);
  sa_assert_ok(sa_host_set_device(0));
  sa_assert_ok(sa_host_stream_device(NULL, &dev));
  assert_int_equal(dev, 0);
  sa_assert_status(sa_host_set_device_count(1), SA_ERR_INVALID_ARGUMENT);
  sa_assert_ok(sa_host_stream_destroy(s));
  /* Nor one holding a chunk. */
  sa_assert_ok(sa_driver_host_open(1, &d));
  sa_chunk_handle c;
  sa_assert_ok(d->ops->chunk_create(d, 2 * MiB, &c));
  sa_assert_status(sa_host_set_device_count(1), SA_ERR_INVALID_ARGUMENT);
  sa_assert_ok(d->ops->chunk_release(d, c));
  sa_driver_close(d);
  sa_assert_ok(sa_host_set_device_count(1));
  sa_assert_ok(sa_host_set_device_count(2));
}

static void each_device_has_its_own_memory(void **state) {
  (void)state;
  sa_driver *d0 = NULL, *d1 = NULL;
  size_t was = 0, total = 0;
  sa_assert_ok(sa_driver_host_open(0, &d0));
  sa_assert_ok(sa_driver_host_open(1, &d1));
  sa_assert_ok(d0->ops->total_memory(d0, &was));
  sa_assert_ok(sa_host_set_device_memory(8 * MiB));
  sa_assert_ok(d1->ops->total_memory(d1, &total));
  assert_int_equal(total, 8 * MiB);
  sa_chunk_handle c0[5], c1[4];
  for (int i = 0; i < 4; i++) sa_assert_ok(d0->ops->chunk_create(d0, 2 * MiB, &c0[i]));
  sa_assert_status(d0->ops->chunk_create(d0, 2 * MiB, &c0[4]), SA_ERR_OUT_OF_MEMORY);
  /* Device 0 is full; device 1 is not. */
  for (int i = 0; i < 4; i++) sa_assert_ok(d1->ops->chunk_create(d1, 2 * MiB, &c1[i]));
  /* Memory is mapped anywhere, and says whose it is. */
  uintptr_t va = 0;
  sa_assert_ok(d0->ops->va_reserve(d0, 4 * MiB, 0, &va));
  sa_assert_ok(d0->ops->map(d0, va, 2 * MiB, c1[0]));
  sa_assert_ok(d0->ops->map(d0, va + 2 * MiB, 2 * MiB, c0[0]));
  assert_int_equal(device_of((void *)va), 1);
  assert_int_equal(device_of((void *)(va + 2 * MiB)), 0);
  int dev = 0;
  sa_assert_status(sa_host_pointer_device(&dev, &dev), SA_ERR_INVALID_POINTER);
  sa_assert_ok(d0->ops->unmap(d0, va, 4 * MiB));
  sa_assert_ok(d0->ops->va_release(d0, va, 4 * MiB));
  for (int i = 0; i < 4; i++) sa_assert_ok(d0->ops->chunk_release(d0, c0[i]));
  for (int i = 0; i < 4; i++) sa_assert_ok(d1->ops->chunk_release(d1, c1[i]));
  sa_driver_close(d0);
  sa_driver_close(d1);
  sa_assert_ok(sa_host_set_device_memory(was));
}

/* Streams and events belong to a device: a driver of device 0 refuses a
 * stream of device 1, an event is recorded only on its device's streams,
 * and any stream waits for any event (as cuStreamWaitEvent across GPUs). */
static void streams_and_events_belong_to_a_device(void **state) {
  (void)state;
  sa_driver *d0 = NULL, *d1 = NULL;
  sa_assert_ok(sa_driver_host_open(0, &d0));
  sa_assert_ok(sa_driver_host_open(1, &d1));
  sa_stream s0 = stream_on(0, SA_HOST_MANUAL), s1 = stream_on(1, SA_HOST_AUTO), made = NULL;
  sa_assert_ok(d0->ops->stream_validate(d0, s0));
  /* NULL is the default stream of the thread's current device: a driver
   * takes its own device's only (as cuda.c takes its own context's). */
  sa_assert_ok(sa_host_set_device(0));
  sa_assert_ok(d0->ops->stream_validate(d0, NULL));
  sa_assert_status(d1->ops->stream_validate(d1, NULL), SA_ERR_UNKNOWN_STREAM);
  sa_fixture_assert_driver_error("NULL stream of another device");
  sa_assert_ok(sa_host_set_device(1));
  sa_assert_ok(d1->ops->stream_validate(d1, NULL));
  sa_assert_status(d0->ops->stream_validate(d0, NULL), SA_ERR_UNKNOWN_STREAM);
  sa_assert_ok(sa_host_set_device(0));
  sa_assert_status(d0->ops->stream_validate(d0, s1), SA_ERR_UNKNOWN_STREAM);
  sa_fixture_assert_driver_error("stream of another device");
  sa_assert_ok(d1->ops->stream_validate(d1, s1));
  sa_assert_ok(d1->ops->stream_create(d1, &made)); /* the driver's device, not the thread's */
  sa_assert_ok(d1->ops->stream_validate(d1, made));
  sa_assert_status(d0->ops->stream_validate(d0, made), SA_ERR_UNKNOWN_STREAM);

  sa_event e0 = NULL;
  sa_assert_ok(d0->ops->event_create(d0, &e0));
  sa_assert_status(d0->ops->event_record(d0, e0, s1), SA_ERR_DRIVER);
  sa_assert_ok(d0->ops->event_record(d0, e0, s0)); /* pending: s0 is manual */
  sa_assert_ok(d1->ops->stream_wait_event(d1, s1, e0));
  assert_int_equal(sa_host_stream_pending(s1), 1); /* s1 waits for device 0 */
  sa_assert_ok(sa_host_stream_drain(s0));
  assert_int_equal(sa_host_stream_pending(s1), 0);
  sa_assert_ok(d0->ops->event_destroy(d0, e0));
  sa_assert_ok(d1->ops->stream_destroy(d1, made));
  sa_assert_ok(sa_host_stream_destroy(s0));
  sa_assert_ok(sa_host_stream_destroy(s1));
  sa_driver_close(d0);
  sa_driver_close(d1);
}

/* Each device has a default stream of its own, as each CUDA context has its
 * own legacy stream: work queued on device 0's does not order device 1's,
 * so the checker flags a handout on device 1's default stream of memory
 * that device 0's still uses, and stepping one does not run the other's.
 * NULL names the current device's in host.h's calls and the driver's own
 * device's in driver ops. (With one default stream for all devices, as the
 * simulator had, such code was ordered here and not on GPUs.) */
static void each_device_has_a_default_stream_of_its_own(void **state) {
  (void)state;
  static uint32_t buf[1024]; /* host memory: work of any device may touch it */
  sa_driver *d0 = NULL, *d1 = NULL;
  sa_assert_ok(sa_driver_host_open(0, &d0));
  sa_assert_ok(sa_driver_host_open(1, &d1));
  uint64_t id0 = 0, id1 = 0;
  sa_assert_ok(d0->ops->stream_id(d0, NULL, &id0));
  sa_assert_ok(d1->ops->stream_id(d1, NULL, &id1));
  assert_true(id0 != id1);
  sa_assert_ok(sa_host_set_default_stream_mode(SA_HOST_MANUAL));
  sa_assert_ok(sa_host_set_device(0));
  sa_assert_ok(sa_host_fill(NULL, buf, sizeof buf, 5));
  assert_int_equal(sa_host_stream_pending(NULL), 1);
  sa_assert_ok(sa_host_set_device(1));
  assert_int_equal(sa_host_stream_pending(NULL), 0);

  uint64_t v = violations();
  sa_assert_ok(d0->ops->check_handout(d0, (uintptr_t)buf, sizeof buf, NULL)); /* in order */
  sa_fixture_stderr_begin();
  sa_status st = d1->ops->check_handout(d1, (uintptr_t)buf, sizeof buf, NULL);
  char *said = sa_fixture_stderr_end();
  bool named = said != NULL && strstr(said, "handed to the default stream of device 1") != NULL &&
               strstr(said, "but the default stream of device 0 has an unfinished fill") != NULL;
  free(said);
  sa_assert_status(st, SA_ERR_STREAM_ORDER);
  assert_int_equal(violations(), v + 1);
  if (!named) fail_msg("the checker's finding does not name both default streams");

  /* An event of device 0 on its default stream orders device 1's after it. */
  sa_event e = NULL;
  sa_assert_ok(d0->ops->event_create(d0, &e));
  sa_assert_ok(d0->ops->event_record(d0, e, NULL));
  sa_assert_ok(d1->ops->stream_wait_event(d1, NULL, e));
  sa_assert_ok(d1->ops->check_handout(d1, (uintptr_t)buf, sizeof buf, NULL));
  size_t done = 0;
  sa_assert_ok(sa_host_stream_step(NULL, 1, &done)); /* device 1's: it waits */
  assert_int_equal(done, 0);
  sa_assert_ok(sa_host_drain_all());
  assert_int_equal(sa_host_stream_pending(NULL), 0);
  assert_int_equal(buf[0], 5);
  assert_int_equal(violations(), v + 1);
  sa_assert_ok(sa_host_set_default_stream_mode(SA_HOST_AUTO));
  sa_assert_ok(d0->ops->event_destroy(d0, e));
  sa_driver_close(d0);
  sa_driver_close(d1);
}

/* Access is per device: device 1's work on device 0's memory needs a grant
 * for device 1 (cuMemSetAccess), which the driver gives to the peers that
 * set_peer_access named; a kernel without it is a violation and writes
 * nothing, as a GPU would fault. */
static void kernel_of_a_peer_runs_only_with_access(void **state) {
  (void)state;
  sa_driver *d0 = NULL, *d0p = NULL, *d1 = NULL;
  sa_assert_ok(sa_driver_host_open(0, &d0));
  sa_assert_ok(sa_driver_host_open(0, &d0p));
  sa_assert_ok(sa_driver_host_open(1, &d1));
  sa_assert_ok(d0p->ops->set_peer_access(d0p, (uint64_t)1 << 1));
  sa_stream s0 = stream_on(0, SA_HOST_AUTO), s1 = stream_on(1, SA_HOST_AUTO);
  uintptr_t va = 0;
  sa_chunk_handle c, cp;
  sa_assert_ok(d0->ops->va_reserve(d0, 4 * MiB, 0, &va));
  sa_assert_ok(d0->ops->chunk_create(d0, 2 * MiB, &c));
  sa_assert_ok(d0p->ops->chunk_create(d0p, 2 * MiB, &cp));
  sa_assert_ok(d0->ops->map(d0, va, 2 * MiB, c));
  sa_assert_ok(d0->ops->set_access(d0, va, 2 * MiB)); /* device 0 only */
  sa_assert_ok(d0p->ops->map(d0p, va + 2 * MiB, 2 * MiB, cp));
  sa_assert_ok(d0p->ops->set_access(d0p, va + 2 * MiB, 2 * MiB)); /* devices 0 and 1 */
  uint64_t bad = 0, v = violations();
  void *own = (void *)va, *shared = (void *)(va + 2 * MiB);

  sa_assert_ok(sa_host_fill(s0, own, 2 * MiB, 7));
  sa_assert_ok(sa_host_fill(s1, own, 4096, 8)); /* no access: does not run */
  assert_int_equal(violations(), v + 1);
  sa_assert_ok(sa_host_check(s0, own, 2 * MiB, 7, &bad));
  assert_int_equal(bad, 0);
  /* The driver refuses to enqueue it at all. */
  sa_assert_status(d1->ops->memset32_async(d1, va, 9, 1024, s1), SA_ERR_DRIVER);
  char host[16];
  sa_assert_status(d1->ops->copy_to_host(d1, host, va, sizeof host), SA_ERR_DRIVER);
  /* A kernel of device 0 on a stream of device 1 is refused too. */
  sa_assert_status(d0->ops->memset32_async(d0, va, 9, 1024, s1), SA_ERR_UNKNOWN_STREAM);

  sa_assert_ok(sa_host_fill(s1, shared, 2 * MiB, 0x51));
  sa_assert_ok(d1->ops->memset32_async(d1, va + 2 * MiB, 0x52, 1024, s1));
  sa_assert_ok(sa_host_check(s1, shared, 4096, 0x52, &bad));
  sa_assert_ok(sa_host_check(s0, (char *)shared + 4096, 2 * MiB - 4096, 0x51, &bad));
  assert_int_equal(bad, 0);
  uint32_t word = 0;
  sa_assert_ok(d1->ops->copy_to_host(d1, &word, va + 2 * MiB, 4));
  assert_int_equal(word, 0x52);
  assert_int_equal(violations(), v + 1);

  /* The grant goes with the mapping: mapped again by device 0's own
   * driver, the chunk is device 0's alone. */
  sa_assert_ok(d0->ops->unmap(d0, va + 2 * MiB, 2 * MiB));
  sa_assert_ok(d0->ops->map(d0, va + 2 * MiB, 2 * MiB, cp));
  sa_assert_ok(d0->ops->set_access(d0, va + 2 * MiB, 2 * MiB));
  sa_assert_ok(sa_host_fill(s1, shared, 4096, 3));
  assert_int_equal(violations(), v + 2);

  sa_assert_ok(d0->ops->unmap(d0, va, 4 * MiB));
  sa_assert_ok(d0->ops->chunk_release(d0, c));
  sa_assert_ok(d0->ops->chunk_release(d0, cp));
  sa_assert_ok(d0->ops->va_release(d0, va, 4 * MiB));
  sa_assert_ok(sa_host_stream_destroy(s0));
  sa_assert_ok(sa_host_stream_destroy(s1));
  sa_driver_close(d0);
  sa_driver_close(d0p);
  sa_driver_close(d1);
}

/* ---- arenas ------------------------------------------------------------ */

/* An arena hands out its own device's memory and only takes that device's
 * streams (and NULL while that device is current): another device's stream
 * is SA_ERR_UNKNOWN_STREAM in every call that names one, and nothing
 * changes. */
static void arena_takes_only_its_device(void **state) {
  (void)state;
  sa_arena *a0 = NULL, *a1 = NULL;
  sa_assert_ok(sa_fixture_arena_create(&a0, ON_HOST "device=0"));
  sa_assert_ok(sa_fixture_arena_create(&a1, ON_HOST "device=1"));
  sa_stream s0 = stream_on(0, SA_HOST_AUTO), s1 = stream_on(1, SA_HOST_AUTO);
  static const size_t sizes[] = {256, 4096, 300000, 3 * MiB, 40 * MiB};
  void *p0[5], *p1[5], *q = &q;
  for (int i = 0; i < 5; i++) {
    sa_assert_ok(sa_alloc(a0, &p0[i], sizes[i], s0));
    sa_assert_ok(sa_alloc(a1, &p1[i], sizes[i], s1));
    assert_int_equal(device_of(p0[i]), 0);
    assert_int_equal(device_of(p1[i]), 1);
    assert_int_equal(device_of((char *)p1[i] + sizes[i] - 1), 1);
  }
  sa_assert_status(sa_alloc(a0, &q, 4096, s1), SA_ERR_UNKNOWN_STREAM);
  assert_null(q);
  sa_fixture_assert_driver_error("stream of another device");
  sa_assert_status(sa_alloc(a1, &q, 4096, s0), SA_ERR_UNKNOWN_STREAM);
  sa_assert_status(sa_free(p0[1], s1), SA_ERR_UNKNOWN_STREAM); /* still live */
  sa_assert_status(sa_free(p1[4], s0), SA_ERR_UNKNOWN_STREAM);
  sa_assert_status(sa_record_stream(p0[0], s1), SA_ERR_UNKNOWN_STREAM);
  /* NULL is the default stream of the thread's current device: device 0's
   * here, which device 1's arena cannot order. (It was accepted while the
   * simulator had one default stream for every device.) With device 1
   * current it is device 1's. */
  sa_assert_ok(sa_host_set_device(0));
  sa_assert_status(sa_alloc(a1, &q, 4096, NULL), SA_ERR_UNKNOWN_STREAM);
  assert_null(q);
  sa_fixture_assert_driver_error("NULL stream of another device");
  sa_assert_ok(sa_host_set_device(1));
  sa_assert_ok(sa_alloc(a1, &q, 4096, NULL));
  assert_int_equal(device_of(q), 1);
  sa_assert_ok(sa_free(q, NULL));
  sa_assert_ok(sa_host_set_device(0));
  for (int i = 0; i < 5; i++) {
    sa_assert_ok(sa_free(p0[i], s0));
    sa_assert_ok(sa_free(p1[i], s1));
  }
  sa_assert_ok(sa_stream_release(a0, s0));
  sa_assert_ok(sa_stream_release(a1, s1));
  sa_assert_ok(sa_arena_destroy(a0));
  sa_assert_ok(sa_arena_destroy(a1));
  sa_assert_ok(sa_host_stream_destroy(s0));
  sa_assert_ok(sa_host_stream_destroy(s1));
}

/* ---- NULL: the legacy stream of the thread's current device ------------ *
 * The rule of streamarena.h (on sa_stream): an arena takes NULL while the
 * calling thread has the arena's device current, or none; with another
 * device current, NULL names that device's default stream, and the arena
 * refuses it. Two devices, each granted access to the other's memory, as a
 * program that moves tensors between GPUs has. */

#define SPAN (6 * MiB) /* one fits under the cap below, two do not */
#define TWO_PEERS ON_HOST "peer_access=all,max_physical=8MiB,device="

/* NULL from a thread whose current device is the arena's is that device's
 * default stream, in the arena's calls as in the thread's own work: a span
 * freed on it while the thread's fill there is still queued goes to
 * another stream of the device only behind that fill (the stream waits),
 * and the checker stays silent. */
static void null_is_the_arenas_default_stream_while_its_device_is_current(void **state) {
  (void)state;
  sa_arena *a1 = NULL;
  sa_assert_ok(sa_fixture_arena_create(&a1, TWO_PEERS "1"));
  sa_stream s1 = stream_on(1, SA_HOST_MANUAL);
  sa_assert_ok(sa_host_set_default_stream_mode(SA_HOST_MANUAL));
  sa_assert_ok(sa_host_set_device(1));
  uint64_t v = violations(), bad = 0;
  void *p = NULL, *q = NULL;
  sa_assert_ok(sa_alloc(a1, &p, SPAN, NULL));
  sa_assert_ok(sa_host_fill(NULL, p, SPAN, 0xA1));
  sa_assert_ok(sa_free(p, NULL));
  sa_assert_ok(sa_alloc(a1, &q, SPAN, s1)); /* nothing else fits under the cap */
  assert_ptr_equal(q, p);
  sa_assert_ok(sa_host_fill(s1, q, SPAN, 0xB1));
  sa_assert_ok(sa_host_check(s1, q, SPAN, 0xB1, &bad));
  /* s1 first, as far as it goes: it waits for the default stream's fill. */
  sa_assert_ok(sa_host_stream_step(s1, SIZE_MAX, NULL));
  assert_true(sa_host_stream_pending(s1) > 0);
  sa_assert_ok(sa_host_stream_drain(NULL));
  sa_assert_ok(sa_host_stream_drain(s1));
  assert_int_equal(bad, 0);
  assert_int_equal(violations(), v);
  sa_assert_ok(sa_free(q, s1));
  sa_assert_ok(sa_host_set_default_stream_mode(SA_HOST_AUTO));
  sa_assert_ok(sa_stream_release(a1, s1));
  sa_assert_ok(sa_stream_release(a1, NULL));
  sa_assert_ok(sa_host_set_device(0));
  sa_assert_ok(sa_arena_destroy(a1));
  sa_assert_ok(sa_host_stream_destroy(s1));
}

/* NULL passed to device 1's arena by a thread with device 0 current names
 * device 0's default stream, where that thread's own work on "stream 0"
 * goes; device 1's arena can neither record its events there nor order a
 * reuse after it, and ordering after device 1's instead would hand the
 * memory out while device 0 still uses it. Every call that names it is
 * refused with SA_ERR_UNKNOWN_STREAM, naming both devices, and changes
 * nothing: also where the thread used NULL with the arena before, while
 * device 1 was current, so that its cache answers sa_alloc and sa_free of
 * small blocks without asking the driver anything else. */
static void null_of_another_current_device_is_refused_by_every_call(void **state) {
  (void)state;
  sa_arena *a1 = NULL;
  sa_assert_ok(sa_fixture_arena_create(&a1, TWO_PEERS "1"));
  sa_stream s1 = stream_on(1, SA_HOST_AUTO);
  void *small = NULL, *span = NULL, *other = NULL, *q = &q;
  sa_assert_ok(sa_host_set_device(1));
  sa_assert_ok(sa_alloc(a1, &other, 4096, s1));
  sa_assert_ok(sa_alloc(a1, &span, 3 * MiB, NULL));
  sa_assert_ok(sa_alloc(a1, &small, 4096, NULL)); /* last: the fast paths' entry */
  sa_stats was, now;
  sa_assert_ok(sa_get_stats(a1, &was));

  sa_assert_ok(sa_host_set_device(0));
  sa_assert_status(sa_alloc(a1, &q, 4096, NULL), SA_ERR_UNKNOWN_STREAM); /* cached class */
  assert_null(q);
  sa_fixture_assert_driver_error("NULL stream of another device: it names the default stream "
                                 "of device 0");
  sa_fixture_assert_driver_error("make device 1 current");
  q = &q;
  sa_assert_status(sa_alloc(a1, &q, 3 * MiB, NULL), SA_ERR_UNKNOWN_STREAM);
  assert_null(q);
  sa_assert_status(sa_free(small, NULL), SA_ERR_UNKNOWN_STREAM); /* the fast path's */
  sa_assert_status(sa_free(span, NULL), SA_ERR_UNKNOWN_STREAM);
  sa_assert_status(sa_free(other, NULL), SA_ERR_UNKNOWN_STREAM);
  sa_assert_status(sa_record_stream(small, NULL), SA_ERR_UNKNOWN_STREAM); /* its own stream */
  sa_assert_status(sa_record_stream(other, NULL), SA_ERR_UNKNOWN_STREAM);
  sa_assert_status(sa_record_stream(span, NULL), SA_ERR_UNKNOWN_STREAM);
  sa_assert_status(sa_stream_release(a1, NULL), SA_ERR_UNKNOWN_STREAM);
  sa_fixture_assert_driver_error("NULL stream of another device");
  sa_assert_ok(sa_get_stats(a1, &now));
  assert_int_equal(now.alloc_count, was.alloc_count);
  assert_int_equal(now.free_count, was.free_count);
  assert_int_equal(now.live_bytes, was.live_bytes);
  assert_int_equal(now.streams, was.streams);

  /* With device 1 current again the same calls work: nothing was freed.
   * A record of NULL made then names device 1's default stream for good:
   * a free on s1 from a thread with device 0 current takes it so. */
  sa_assert_ok(sa_host_set_device(1));
  sa_assert_ok(sa_record_stream(other, NULL));
  sa_assert_ok(sa_record_stream(span, NULL));
  sa_assert_ok(sa_free(small, NULL));
  sa_assert_ok(sa_host_set_device(0));
  sa_assert_ok(sa_free(span, s1));
  sa_assert_ok(sa_free(other, s1));
  sa_assert_ok(sa_host_set_device(1));
  sa_assert_ok(sa_stream_release(a1, NULL));
  sa_assert_ok(sa_stream_release(a1, s1));
  sa_assert_ok(sa_host_set_device(0));
  sa_assert_ok(sa_arena_destroy(a1)); /* SA_ERR_LIVE_BLOCKS if a block stayed */
  sa_assert_ok(sa_host_stream_destroy(s1));
}

/* What a thread with no device current did: the first failing line, its
 * status, and what it saw. */
typedef struct no_device_job_s {
  sa_arena *a0, *a1;
  sa_driver *d1;
  sa_stream s1;
  int failed_at;
  sa_status st;
  int device_before;         /* sa_host_get_device() on arrival */
  int dev0, dev1;            /* whose memory the NULL blocks are */
  void *p1, *q1;
  size_t own_pending;        /* its own default stream's work after the fill */
  size_t s1_pending;         /* s1's after stepping it as far as it goes */
  uint64_t bad;
} no_device_job;

#define JOB_OK(j, expr)                                        \
  do {                                                         \
    sa_status job_st_ = (expr);                                \
    if (job_st_ != SA_OK && (j)->failed_at == 0) {             \
      (j)->failed_at = __LINE__;                               \
      (j)->st = job_st_;                                       \
    }                                                          \
  } while (0)

static void *no_device_thread(void *arg) {
  no_device_job *j = arg;
  void *p0 = NULL;
  j->device_before = sa_host_get_device();
  JOB_OK(j, sa_alloc(j->a0, &p0, SPAN, NULL));
  JOB_OK(j, sa_alloc(j->a1, &j->p1, SPAN, NULL));
  if (j->failed_at != 0) return NULL;
  j->dev0 = device_of(p0);
  j->dev1 = device_of(j->p1);
  /* Work of device 1 on its default stream, then the free there. */
  JOB_OK(j, j->d1->ops->memset32_async(j->d1, (uintptr_t)j->p1, 0xC1, SPAN / 4, NULL));
  JOB_OK(j, sa_free(j->p1, NULL));
  j->own_pending = sa_host_stream_pending(NULL); /* device 0's, as host.h says */
  JOB_OK(j, sa_alloc(j->a1, &j->q1, SPAN, j->s1));
  if (j->failed_at != 0) return NULL;
  JOB_OK(j, sa_host_fill(j->s1, j->q1, SPAN, 0xD1));
  JOB_OK(j, sa_host_check(j->s1, j->q1, SPAN, 0xD1, &j->bad));
  JOB_OK(j, sa_host_stream_step(j->s1, SIZE_MAX, NULL));
  j->s1_pending = sa_host_stream_pending(j->s1);
  JOB_OK(j, sa_host_drain_all());
  JOB_OK(j, sa_free(p0, NULL));
  JOB_OK(j, sa_free(j->q1, j->s1));
  JOB_OK(j, sa_stream_release(j->a0, NULL));
  JOB_OK(j, sa_stream_release(j->a1, NULL));
  JOB_OK(j, sa_stream_release(j->a1, j->s1));
  return NULL;
}

/* A thread that never made a device current (on CUDA: no context) passes
 * NULL to the arenas of both devices: each takes it as its own device's
 * default stream, so its blocks are that device's, and a span freed there
 * goes to another stream of device 1 only behind device 1's work on its
 * default stream. The caveat, pinned: the thread's own host.h calls on NULL
 * meanwhile name device 0's default stream, as on CUDA the runtime's first
 * call would make device 0 current (and then device 1's arena would refuse
 * NULL). */
static void null_from_a_thread_with_no_device_is_each_arenas_own(void **state) {
  (void)state;
  no_device_job j = {0};
  sa_assert_ok(sa_fixture_arena_create(&j.a0, TWO_PEERS "0"));
  sa_assert_ok(sa_fixture_arena_create(&j.a1, TWO_PEERS "1"));
  sa_assert_ok(sa_driver_host_open(1, &j.d1));
  j.s1 = stream_on(1, SA_HOST_MANUAL);
  sa_assert_ok(sa_host_set_default_stream_mode(SA_HOST_MANUAL));
  uint64_t v = violations();
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, no_device_thread, &j), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  sa_assert_ok(sa_host_set_default_stream_mode(SA_HOST_AUTO));
  if (j.failed_at != 0)
    fail_msg("line %d: %s", j.failed_at, sa_status_string(j.st));
  assert_int_equal(j.device_before, 0);
  assert_int_equal(j.dev0, 0);
  assert_int_equal(j.dev1, 1);
  assert_ptr_equal(j.q1, j.p1);      /* the cap left no other memory */
  assert_int_equal(j.own_pending, 0); /* the fill is on device 1's */
  assert_true(j.s1_pending > 0);     /* s1 waited for it */
  assert_int_equal(j.bad, 0);
  assert_int_equal(violations(), v);
  sa_driver_close(j.d1);
  sa_assert_ok(sa_arena_destroy(j.a0));
  sa_assert_ok(sa_arena_destroy(j.a1));
  sa_assert_ok(sa_host_stream_destroy(j.s1));
}

/* sa_malloc_async follows the thread's current device at every call: T
 * threads switch devices between calls and each allocation comes from the
 * default arena of the device current at that moment (device_switch.h). */
enum { SWITCH_THREADS = 4, SWITCH_ROUNDS = 300 };

static sa_status host_stream_create(sa_stream *out) {
  return sa_host_stream_create(SA_HOST_AUTO, out);
}

static int host_pointer_device(const void *p) {
  int dev = -1;
  return sa_host_pointer_device(p, &dev) == SA_OK ? dev : -1;
}

static const sa_switch_ops host_switch = {sa_host_set_device, host_stream_create,
                                          sa_host_stream_destroy, host_pointer_device};

static void default_arena_follows_the_current_device(void **state) {
  (void)state;
  sa_stream s1 = stream_on(1, SA_HOST_AUTO);
  void *p = NULL;
  sa_assert_ok(sa_host_set_device(1));
  sa_assert_ok(sa_malloc_async(&p, 12345, s1));
  assert_int_equal(device_of(p), 1);
  sa_arena *a0 = NULL, *a1 = NULL;
  sa_assert_ok(sa_default_arena(0, &a0));
  sa_assert_ok(sa_default_arena(1, &a1));
  assert_ptr_not_equal(a0, a1);
  sa_stats st;
  sa_assert_ok(sa_get_stats(a1, &st));
  assert_int_equal(st.alloc_count, 1);
  sa_assert_ok(sa_get_stats(a0, &st));
  assert_int_equal(st.alloc_count, 0);
  sa_assert_ok(sa_host_set_device(0));
  sa_assert_ok(sa_free_async(p, s1)); /* the arena is found from the address */
  sa_assert_ok(sa_stream_release(a1, s1));
  sa_assert_ok(sa_host_stream_destroy(s1));

  static const size_t sizes[] = {256, 2048, 65536, 700000, 5 * MiB};
  sa_switch_result r;
  sa_switch_run(&host_switch, SWITCH_THREADS, SWITCH_ROUNDS, sizes, 5, &r);
  uint64_t allocs[2];
  for (int dev = 0; dev < 2; dev++) {
    sa_arena *a = NULL;
    sa_assert_ok(sa_default_arena(dev, &a));
    sa_assert_ok(sa_get_stats(a, &st));
    allocs[dev] = st.alloc_count;
    assert_int_equal(st.alloc_count, st.free_count);
  }
  printf("multi_device: default arenas, threads %d switching devices, allocations on device 0 "
         "%llu, on device 1 %llu, from the wrong device %u, foreign streams accepted %u, "
         "failures %u\n",
         SWITCH_THREADS, (unsigned long long)allocs[0], (unsigned long long)allocs[1],
         r.wrong_device, r.foreign_taken, r.failures);
  assert_int_equal(r.wrong_device, 0);
  assert_int_equal(r.foreign_taken, 0);
  assert_int_equal(r.failures, 0);
  assert_int_equal(r.allocations, SWITCH_THREADS * SWITCH_ROUNDS);
  total_allocs += allocs[0] + allocs[1];
  assert_int_equal(allocs[0], SWITCH_THREADS * SWITCH_ROUNDS / 2);
  assert_int_equal(allocs[1], SWITCH_THREADS * SWITCH_ROUNDS / 2 + 1);
  sa_default_arenas_shutdown();
}

/* Device 1 fills and checks every block of an arena of device 0 after each
 * way its memory gets mapped: growth of small and large allocations, a span
 * stitched from the chunks of freed superblocks under a physical cap, regrowth
 * after sa_trim gave everything back, and superblocks of a new size.
 * Returns the violations device 1's kernels caused. */
typedef struct peer_result_s {
  unsigned kernels;         /* fills of device 1 */
  uint64_t violations;      /* those the simulator refused to run */
  uint64_t words, mismatches; /* checked by device 0 afterwards */
} peer_result;

static peer_result peer_scenario(const char *peers) {
  peer_result r = {0};
  char extra[128];
  snprintf(extra, sizeof extra, "%s,max_physical=32MiB,superblock_size=2MiB", peers);
  sa_arena *a = NULL;
  sa_assert_ok(sa_fixture_arena_create(&a, ON_HOST "device=0,%s", extra));
  sa_stream s0 = stream_on(0, SA_HOST_AUTO), s1 = stream_on(1, SA_HOST_AUTO);
  uint64_t v = violations();
  enum { N = 19 };
  void *p[N];
  size_t size[N];
  /* Writes of device 1, then a check of device 0 (which always has access):
   * with a grant the words are device 1's, without one they are not. */
#define PEER_TOUCH(ptr, bytes, pattern)                                     \
  do {                                                                      \
    sa_assert_ok(sa_host_fill(s0, (ptr), (bytes), 0));                      \
    sa_assert_ok(sa_host_fill(s1, (ptr), (bytes), (pattern)));              \
    sa_assert_ok(sa_host_check(s0, (ptr), (bytes), (pattern), &r.mismatches)); \
    r.kernels++;                                                            \
    r.words += (bytes) / 4;                                                 \
  } while (0)

  /* Growth: 16 small blocks (4 superblocks) and 3 spans of 4 MiB. */
  for (int i = 0; i < N; i++) {
    size[i] = i < 16 ? 512 << 10 : 4 * MiB;
    sa_assert_ok(sa_alloc(a, &p[i], size[i], s0));
    PEER_TOUCH(p[i], size[i], 0x100u + (unsigned)i);
  }
  for (int i = 0; i < N; i++) sa_assert_ok(sa_free(p[i], s0));
  /* Stitching: 24 MiB under a 32 MiB cap, 20 MiB already held, comes from
   * the chunks of the freed memory, unmapped and mapped again. */
  sa_assert_ok(sa_defragment(a));
  void *big = NULL;
  sa_assert_ok(sa_alloc(a, &big, 24 * MiB, s0));
  sa_stats st;
  sa_assert_ok(sa_get_stats(a, &st));
  assert_true(st.reserved_bytes <= 32 * MiB);
  PEER_TOUCH(big, 24 * MiB, 0x200u);
  sa_assert_ok(sa_free(big, s0));
  /* Trim to nothing, then grow again. */
  sa_assert_ok(sa_trim(a, 0));
  sa_assert_ok(sa_get_stats(a, &st));
  assert_int_equal(st.reserved_bytes, 0);
  sa_assert_ok(sa_alloc(a, &big, 6 * MiB, s0));
  PEER_TOUCH(big, 6 * MiB, 0x300u);
  sa_assert_ok(sa_free(big, s0));
  /* Superblocks of another size. */
  sa_assert_ok(sa_set_superblock_size(a, 4 * MiB));
  for (int i = 0; i < 4; i++) {
    sa_assert_ok(sa_alloc(a, &p[i], 1536 << 10, s0));
    PEER_TOUCH(p[i], 1536 << 10, 0x400u + (unsigned)i);
  }
  for (int i = 0; i < 4; i++) sa_assert_ok(sa_free(p[i], s0));
#undef PEER_TOUCH
  r.violations = violations() - v;
  sa_assert_ok(sa_stream_release(a, s0));
  sa_assert_ok(sa_arena_destroy(a));
  sa_assert_ok(sa_host_stream_destroy(s0));
  sa_assert_ok(sa_host_stream_destroy(s1));
  return r;
}

static void peer_access_covers_growth_stitching_and_trim(void **state) {
  (void)state;
  peer_result with = peer_scenario("peer_access=1");
  printf("multi_device: peer_access=1: %u fills of device 1 on device 0's memory, %llu "
         "refused, %llu of %llu words not device 1's\n",
         with.kernels, (unsigned long long)with.violations,
         (unsigned long long)with.mismatches, (unsigned long long)with.words);
  assert_int_equal(with.kernels, 19 + 1 + 1 + 4);
  assert_int_equal(with.violations, 0);
  assert_int_equal(with.mismatches, 0);
  /* The control: the same scenario without the grant faults every time
   * and device 1 writes nothing. */
  peer_result without = peer_scenario("peer_access=none");
  printf("multi_device: peer_access=none: %u fills, %llu refused, %llu of %llu words not "
         "device 1's\n",
         without.kernels, (unsigned long long)without.violations,
         (unsigned long long)without.mismatches, (unsigned long long)without.words);
  assert_int_equal(without.violations, without.kernels);
  peer_fills += with.kernels + without.kernels;
  refused_fills += without.violations;
  assert_int_equal(without.mismatches, without.words);
}

/* peer_access=all grants every device of the simulator but the arena's. */
static void peer_access_all_grants_every_device(void **state) {
  (void)state;
  sa_assert_ok(sa_host_set_device_count(3));
  sa_arena *a = NULL;
  sa_assert_ok(sa_fixture_arena_create(&a, ON_HOST "device=1,peer_access=all"));
  sa_stream s[3];
  for (int dev = 0; dev < 3; dev++) s[dev] = stream_on(dev, SA_HOST_AUTO);
  void *p = NULL;
  uint64_t v = violations(), bad = 0;
  sa_assert_ok(sa_alloc(a, &p, 3 * MiB, s[1]));
  assert_int_equal(device_of(p), 1);
  sa_assert_ok(sa_host_fill(s[0], p, MiB, 10));
  sa_assert_ok(sa_host_fill(s[2], (char *)p + MiB, 2 * MiB, 12));
  sa_assert_ok(sa_host_check(s[1], p, MiB, 10, &bad));
  sa_assert_ok(sa_host_check(s[1], (char *)p + MiB, 2 * MiB, 12, &bad));
  assert_int_equal(bad, 0);
  assert_int_equal(violations(), v);
  sa_assert_ok(sa_free(p, s[1]));
  sa_assert_ok(sa_stream_release(a, s[1]));
  sa_assert_ok(sa_arena_destroy(a));
  for (int dev = 0; dev < 3; dev++) sa_assert_ok(sa_host_stream_destroy(s[dev]));
}

/* A device that does not exist or cannot access the arena's device fails
 * the arena's creation with a status and a description naming it, and
 * leaves nothing behind. */
static void refused_peers_fail_at_create(void **state) {
  (void)state;
  sa_arena *a = NULL;
  sa_assert_status(sa_fixture_arena_create(&a, ON_HOST "device=0,peer_access=2"),
                   SA_ERR_NO_DEVICE);
  assert_null(a);
  sa_fixture_assert_driver_error("device 2");
  sa_assert_ok(sa_host_set_can_access_peer(1, 0, 0));
  sa_assert_status(sa_fixture_arena_create(&a, ON_HOST "device=0,peer_access=1"),
                   SA_ERR_NOT_SUPPORTED);
  sa_fixture_assert_driver_error("device 1 cannot access the memory of device 0");
  sa_assert_status(sa_fixture_arena_create(&a, ON_HOST "device=0,peer_access=all"),
                   SA_ERR_NOT_SUPPORTED);
  assert_null(a);
  /* sa_config_check says the same, and why. */
  sa_config cfg;
  char err[256];
  sa_config_init(&cfg);
  sa_assert_ok(sa_config_parse(&cfg, "backend=host,peer_access=1", err, sizeof err));
  sa_assert_status(sa_config_check(&cfg, err, sizeof err), SA_ERR_NOT_SUPPORTED);
  if (strstr(err, "device 1 cannot access the memory of device 0") == NULL)
    fail_msg("sa_config_check: '%s'", err);
  /* One way only: device 0 may still access device 1's memory; naming the
   * arena's own device is no request at all. */
  sa_assert_ok(sa_fixture_arena_create(&a, ON_HOST "device=1,peer_access=0+1"));
  sa_assert_ok(sa_arena_destroy(a));
  sa_assert_ok(sa_fixture_arena_create(&a, ON_HOST "device=0,peer_access=0"));
  sa_assert_ok(sa_arena_destroy(a));
  /* The simulator's set_access refuses such a grant too (cuMemSetAccess
   * would): a driver that obtained it before the pair was refused. */
  sa_driver *d = NULL;
  uintptr_t va = 0;
  sa_chunk_handle c;
  sa_assert_ok(sa_host_set_can_access_peer(1, 0, 1));
  sa_assert_ok(sa_driver_host_open(0, &d));
  sa_assert_ok(d->ops->set_peer_access(d, (uint64_t)1 << 1));
  sa_assert_ok(sa_host_set_can_access_peer(1, 0, 0));
  sa_assert_status(d->ops->set_peer_access(d, (uint64_t)1 << 1), SA_ERR_NOT_SUPPORTED);
  sa_assert_ok(d->ops->va_reserve(d, 2 * MiB, 0, &va));
  sa_assert_ok(d->ops->chunk_create(d, 2 * MiB, &c));
  sa_assert_ok(d->ops->map(d, va, 2 * MiB, c));
  sa_assert_status(d->ops->set_access(d, va, 2 * MiB), SA_ERR_DRIVER);
  sa_fixture_assert_driver_error("cannot access");
  sa_assert_ok(d->ops->unmap(d, va, 2 * MiB));
  sa_assert_ok(d->ops->chunk_release(d, c));
  sa_assert_ok(d->ops->va_release(d, va, 2 * MiB));
  sa_driver_close(d);
}

/* With an arena per device (the default arenas, say) an out-of-memory
 * report or a snapshot must say whose memory ran out. */
static void oom_report_and_snapshot_name_the_device(void **state) {
  (void)state;
  sa_arena *a = NULL;
  sa_assert_ok(sa_fixture_arena_create(&a, ON_HOST "device=1,max_physical=4MiB,oom_report=1"));
  sa_stream s1 = stream_on(1, SA_HOST_AUTO);
  void *held = NULL, *p = &p;
  sa_assert_ok(sa_alloc(a, &held, 3 * MiB, s1));
  sa_fixture_stderr_begin();
  sa_status st = sa_alloc(a, &p, 3 * MiB, s1); /* under the cap, but not beside held */
  char *report = sa_fixture_stderr_end();
  bool summary = report != NULL && strstr(report, "host backend, device 1,") != NULL;
  bool snapshot = report != NULL && strstr(report, "\"device\": 1,") != NULL;
  free(report);
  sa_assert_ok(sa_free(held, s1));
  sa_assert_ok(sa_stream_release(a, s1));
  sa_assert_ok(sa_arena_destroy(a));
  sa_assert_ok(sa_host_stream_destroy(s1));
  sa_assert_status(st, SA_ERR_OUT_OF_MEMORY);
  if (!summary) fail_msg("the out-of-memory summary does not name device 1");
  if (!snapshot) fail_msg("the snapshot does not name device 1");
}

int main(void) {
  /* The default arenas of this test are the simulator's, whatever machine
   * runs it (the GPU runner sets STREAMARENA_BACKEND=cuda). */
  setenv("STREAMARENA_BACKEND", "host", 1);
  setenv("STREAMARENA_CONF", "backend=host,check_stream_order=1", 1);
#define T(f) cmocka_unit_test_setup_teardown(f, two_devices, back_to_one_device)
  const struct CMUnitTest tests[] = {
      T(device_count_is_configurable_and_guarded),
      T(each_device_has_its_own_memory),
      T(streams_and_events_belong_to_a_device),
      T(each_device_has_a_default_stream_of_its_own),
      T(kernel_of_a_peer_runs_only_with_access),
      T(arena_takes_only_its_device),
      T(null_is_the_arenas_default_stream_while_its_device_is_current),
      T(null_of_another_current_device_is_refused_by_every_call),
      T(null_from_a_thread_with_no_device_is_each_arenas_own),
      T(default_arena_follows_the_current_device),
      T(peer_access_covers_growth_stitching_and_trim),
      T(peer_access_all_grants_every_device),
      T(refused_peers_fail_at_create),
      T(oom_report_and_snapshot_name_the_device),
  };
#undef T
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  printf("multi_device: devices 2-3, threads %d, default-arena allocations %llu, peer fills %llu "
         "(refused without access %llu), failures %d\n",
         SWITCH_THREADS, total_allocs, peer_fills, refused_fills, failed);
  return failed;
}
