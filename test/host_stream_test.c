/* The host simulator's streams and events: manual and auto progress, event
 * record/query/synchronize, wait edges, synchronize driving dependencies,
 * kernels that act at completion, destroy, and handle validation. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <streamarena/host.h>

#include "driver/driver.h"
#include "fixture.h"

static sa_driver *d; /* opened for the group (fixture.h) */
static uint32_t buf[1024]; /* plain host memory: kernels may touch it too */

static int reset(void **state) {
  (void)state;
  memset(buf, 0, sizeof buf);
  return sa_host_set_default_stream_mode(SA_HOST_AUTO) == SA_OK ? 0 : -1;
}

/* Every test leaves no stream, event or pending work behind. */
static int check_clean(void **state) {
  (void)state;
  sa_host_counters c;
  sa_host_get_counters(&c);
  if (c.streams != 0 || c.events != 0 || sa_host_stream_pending(NULL) != 0) return -1;
  return sa_host_set_default_stream_mode(SA_HOST_AUTO) == SA_OK ? 0 : -1;
}

static uint64_t violations(void);

static sa_stream manual(void) {
  sa_stream s = NULL;
  assert_int_equal(sa_host_stream_create(SA_HOST_MANUAL, &s), SA_OK);
  assert_non_null(s);
  return s;
}

static sa_event event(void) {
  sa_event e = NULL;
  assert_int_equal(d->ops->event_create(d, &e), SA_OK);
  return e;
}

/* s fills buf[0] with 1, records e, then fills it with 2: e is complete
 * when buf[0] is 1. */
static void record_between_fills(sa_stream s, sa_event e) {
  assert_int_equal(sa_host_fill(s, buf, 4, 1), SA_OK);
  assert_int_equal(d->ops->event_record(d, e, s), SA_OK);
  assert_int_equal(sa_host_fill(s, buf, 4, 2), SA_OK);
}

/* a fills buf[0] with x and records e; b waits for e, then fills *q with y:
 * b's fill is ordered after a's. */
static void fill_after(sa_stream a, uint32_t x, sa_event e, sa_stream b, uint32_t *q, uint32_t y) {
  assert_int_equal(sa_host_fill(a, buf, 4, x), SA_OK);
  assert_int_equal(d->ops->event_record(d, e, a), SA_OK);
  assert_int_equal(d->ops->stream_wait_event(d, b, e), SA_OK);
  assert_int_equal(sa_host_fill(b, q, 4, y), SA_OK);
}

/* Destroy a, then b unless it is NULL, then e: what a test made. */
static void destroy_all(sa_stream a, sa_stream b, sa_event e) {
  assert_int_equal(sa_host_stream_destroy(a), SA_OK);
  if (b != NULL) assert_int_equal(sa_host_stream_destroy(b), SA_OK);
  assert_int_equal(d->ops->event_destroy(d, e), SA_OK);
}

static void manual_stream_runs_nothing_until_stepped(void **state) {
  (void)state;
  sa_stream s = manual();
  assert_int_equal(sa_host_fill(s, buf, 64, 7), SA_OK);
  assert_int_equal(buf[0], 0);
  assert_int_equal(sa_host_stream_pending(s), 1);
  size_t done = 99;
  assert_int_equal(sa_host_stream_step(s, 1, &done), SA_OK);
  assert_int_equal(done, 1);
  assert_int_equal(buf[0], 7);
  assert_int_equal(buf[15], 7);
  assert_int_equal(buf[16], 0);
  assert_int_equal(sa_host_stream_step(s, 5, &done), SA_OK); /* nothing left */
  assert_int_equal(done, 0);
  assert_int_equal(sa_host_stream_destroy(s), SA_OK);
}

static void auto_stream_runs_work_at_once(void **state) {
  (void)state;
  sa_stream s = NULL;
  assert_int_equal(sa_host_stream_create(SA_HOST_AUTO, &s), SA_OK);
  assert_int_equal(sa_host_fill(s, buf, 16, 3), SA_OK);
  assert_int_equal(buf[3], 3);
  assert_int_equal(sa_host_stream_pending(s), 0);
  assert_int_equal(sa_host_fill(NULL, buf, 16, 4), SA_OK); /* the default stream is auto */
  assert_int_equal(buf[3], 4);
  assert_int_equal(sa_host_stream_destroy(s), SA_OK);
}

static void step_runs_at_most_n_ops_in_order(void **state) {
  (void)state;
  sa_stream s = manual();
  assert_int_equal(sa_host_fill(s, buf, 16, 1), SA_OK);
  assert_int_equal(sa_host_fill(s, buf, 16, 2), SA_OK);
  assert_int_equal(sa_host_fill(s, buf, 16, 3), SA_OK);
  assert_int_equal(sa_host_stream_step(s, 1, NULL), SA_OK);
  assert_int_equal(buf[0], 1);
  assert_int_equal(sa_host_stream_step(s, 1, NULL), SA_OK);
  assert_int_equal(buf[0], 2);
  assert_int_equal(sa_host_stream_pending(s), 1);
  assert_int_equal(sa_host_stream_step(s, 0, NULL), SA_OK);
  assert_int_equal(buf[0], 2);
  assert_int_equal(sa_host_stream_drain(s), SA_OK);
  assert_int_equal(buf[0], 3);
  assert_int_equal(sa_host_stream_destroy(s), SA_OK);
}

static void fill_and_check_act_when_they_complete(void **state) {
  (void)state;
  sa_stream s = manual();
  uint64_t bad = 0;
  assert_int_equal(sa_host_check(s, buf, 64, 9, &bad), SA_OK); /* all 16 words differ */
  assert_int_equal(sa_host_fill(s, buf, 32, 9), SA_OK);
  assert_int_equal(sa_host_check(s, buf, 64, 9, &bad), SA_OK); /* the last 8 differ */
  assert_int_equal(bad, 0);
  assert_int_equal(sa_host_stream_step(s, 1, NULL), SA_OK);
  assert_int_equal(bad, 16);
  assert_int_equal(buf[0], 0);
  assert_int_equal(sa_host_stream_drain(s), SA_OK);
  assert_int_equal(bad, 24);
  assert_int_equal(buf[7], 9);
  assert_int_equal(sa_host_stream_destroy(s), SA_OK);
}

static void large_fill_and_check_count_every_word(void **state) {
  (void)state;
  enum { WORDS = 5001 }; /* not a multiple of the checker's block */
  static uint32_t big[WORDS + 1];
  big[WORDS] = 0xfeedu;
  uint64_t bad = 0;
  assert_int_equal(sa_host_fill(NULL, big, 4 * WORDS, 0x01020304u), SA_OK);
  assert_int_equal(big[0], 0x01020304u);
  assert_int_equal(big[WORDS - 1], 0x01020304u);
  assert_int_equal(big[WORDS], 0xfeedu); /* not one word past the end */
  big[0] = big[1500] = big[4096] = big[WORDS - 1] = 0;
  assert_int_equal(sa_host_check(NULL, big, 4 * WORDS, 0x01020304u, &bad), SA_OK);
  assert_int_equal(bad, 4);
  assert_int_equal(sa_host_check(NULL, big + 1, 4 * (WORDS - 2), 0x01020304u, &bad), SA_OK);
  assert_int_equal(bad, 6);
  /* Unaligned memory works too. */
  unsigned char *odd = (unsigned char *)buf + 1;
  assert_int_equal(sa_host_fill(NULL, odd, 8, 0xaabbccddu), SA_OK);
  assert_int_equal(sa_host_check(NULL, odd, 8, 0xaabbccddu, &bad), SA_OK);
  assert_int_equal(bad, 6);
}

static void kernels_reject_bad_arguments(void **state) {
  (void)state;
  uint64_t bad = 0;
  assert_int_equal(sa_host_fill(NULL, buf, 6, 1), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_host_fill(NULL, NULL, 16, 1), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_host_check(NULL, buf, 16, 1, NULL), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_host_fill(NULL, (void *)(UINTPTR_MAX - 3), 8, 1), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_host_fill((sa_stream)buf, buf, 16, 1), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(sa_host_check((sa_stream)buf, buf, 16, 1, &bad), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(sa_host_fill(NULL, NULL, 0, 1), SA_OK); /* an empty kernel */
  assert_int_equal(buf[0], 0);
}

static void never_recorded_event_is_complete(void **state) {
  (void)state;
  sa_event e = event();
  assert_int_equal(d->ops->event_query(d, e), SA_OK);
  assert_int_equal(d->ops->event_synchronize(d, e), SA_OK);
  sa_stream s = manual();
  /* Waiting on it blocks nothing. */
  assert_int_equal(d->ops->stream_wait_event(d, s, e), SA_OK);
  assert_int_equal(sa_host_fill(s, buf, 4, 5), SA_OK);
  assert_int_equal(sa_host_stream_step(s, 2, NULL), SA_OK);
  assert_int_equal(buf[0], 5);
  destroy_all(s, NULL, e);
}

static void event_completes_when_its_stream_passes_the_record(void **state) {
  (void)state;
  sa_stream s = manual();
  sa_event e = event();
  record_between_fills(s, e);
  assert_int_equal(d->ops->event_query(d, e), SA_ERR_NOT_READY);
  assert_int_equal(sa_host_stream_step(s, 1, NULL), SA_OK);
  assert_int_equal(d->ops->event_query(d, e), SA_ERR_NOT_READY); /* marker not reached */
  assert_int_equal(sa_host_stream_step(s, 1, NULL), SA_OK);
  assert_int_equal(d->ops->event_query(d, e), SA_OK);
  assert_int_equal(buf[0], 1);
  assert_int_equal(sa_host_stream_drain(s), SA_OK);
  assert_int_equal(buf[0], 2);
  destroy_all(s, NULL, e);
}

static void rerecord_overwrites_the_event(void **state) {
  (void)state;
  sa_stream a = manual(), b = manual();
  sa_event e = event();
  assert_int_equal(d->ops->event_record(d, e, a), SA_OK);
  assert_int_equal(sa_host_stream_drain(a), SA_OK);
  assert_int_equal(d->ops->event_query(d, e), SA_OK);
  assert_int_equal(d->ops->event_record(d, e, b), SA_OK); /* now on b, not complete */
  assert_int_equal(d->ops->event_query(d, e), SA_ERR_NOT_READY);
  assert_int_equal(d->ops->event_record(d, e, a), SA_OK); /* back on a */
  assert_int_equal(sa_host_stream_drain(a), SA_OK);
  assert_int_equal(d->ops->event_query(d, e), SA_OK);
  assert_int_equal(sa_host_stream_pending(b), 1);
  destroy_all(a, b, e);
}

static void event_synchronize_drives_the_recording_stream(void **state) {
  (void)state;
  sa_stream s = manual();
  sa_event e = event();
  record_between_fills(s, e);
  assert_int_equal(d->ops->event_synchronize(d, e), SA_OK);
  assert_int_equal(d->ops->event_query(d, e), SA_OK);
  assert_int_equal(buf[0], 1); /* only up to the record */
  assert_int_equal(sa_host_stream_pending(s), 1);
  destroy_all(s, NULL, e);
}

static void wait_edge_blocks_until_the_other_stream_advances(void **state) {
  (void)state;
  sa_stream a = manual(), b = manual();
  sa_event e = event();
  fill_after(a, 1, e, b, buf, 2);
  size_t done = 9;
  assert_int_equal(sa_host_stream_step(b, 10, &done), SA_OK);
  assert_int_equal(done, 0); /* blocked on a */
  assert_int_equal(sa_host_stream_pending(b), 2);
  assert_int_equal(sa_host_stream_step(a, 1, NULL), SA_OK); /* the fill, not the record */
  assert_int_equal(sa_host_stream_step(b, 10, &done), SA_OK);
  assert_int_equal(done, 0);
  assert_int_equal(sa_host_stream_step(a, 1, NULL), SA_OK);
  assert_int_equal(sa_host_stream_step(b, 10, &done), SA_OK);
  assert_int_equal(done, 2);
  assert_int_equal(buf[0], 2);
  destroy_all(a, b, e);
}

static void wait_captures_the_record_at_enqueue_time(void **state) {
  (void)state;
  sa_stream a = manual(), b = manual();
  sa_event e = event();
  assert_int_equal(d->ops->event_record(d, e, a), SA_OK);
  assert_int_equal(d->ops->stream_wait_event(d, b, e), SA_OK);
  assert_int_equal(sa_host_fill(a, buf, 4, 1), SA_OK);
  assert_int_equal(d->ops->event_record(d, e, a), SA_OK); /* later record: b ignores it */
  assert_int_equal(d->ops->event_destroy(d, e), SA_OK);    /* and may outlive the event */
  assert_int_equal(sa_host_fill(b, buf + 1, 4, 2), SA_OK);
  assert_int_equal(sa_host_stream_step(a, 1, NULL), SA_OK);
  size_t done = 0;
  assert_int_equal(sa_host_stream_step(b, 10, &done), SA_OK);
  assert_int_equal(done, 2);
  assert_int_equal(buf[0], 0); /* a's fill has not run */
  assert_int_equal(buf[1], 2);
  assert_int_equal(sa_host_stream_destroy(a), SA_OK);
  assert_int_equal(sa_host_stream_destroy(b), SA_OK);
}

static void auto_stream_waiting_on_a_manual_one_runs_when_it_advances(void **state) {
  (void)state;
  sa_stream m = manual(), s = NULL;
  sa_event e = event();
  assert_int_equal(sa_host_stream_create(SA_HOST_AUTO, &s), SA_OK);
  fill_after(m, 1, e, s, buf, 2);
  assert_int_equal(buf[0], 0);
  assert_int_equal(sa_host_stream_pending(s), 2);
  assert_int_equal(sa_host_stream_step(m, 2, NULL), SA_OK);
  assert_int_equal(sa_host_stream_pending(s), 0); /* ran by itself */
  assert_int_equal(buf[0], 2);
  destroy_all(m, s, e);
}

static void synchronize_drives_dependencies_transitively(void **state) {
  (void)state;
  sa_stream a = manual(), b = manual(), c = manual(), bystander = manual();
  sa_event ea = event(), eb = event();
  assert_int_equal(sa_host_fill(a, buf, 4, 1), SA_OK);
  assert_int_equal(d->ops->event_record(d, ea, a), SA_OK);
  assert_int_equal(sa_host_fill(a, buf + 3, 4, 1), SA_OK); /* after the record */
  assert_int_equal(d->ops->stream_wait_event(d, b, ea), SA_OK);
  assert_int_equal(sa_host_fill(b, buf + 1, 4, 2), SA_OK);
  assert_int_equal(d->ops->event_record(d, eb, b), SA_OK);
  assert_int_equal(d->ops->stream_wait_event(d, c, eb), SA_OK);
  assert_int_equal(sa_host_fill(c, buf + 2, 4, 3), SA_OK);
  assert_int_equal(sa_host_fill(bystander, buf + 4, 4, 4), SA_OK);
  assert_int_equal(d->ops->stream_synchronize(d, c), SA_OK);
  assert_int_equal(buf[0], 1);
  assert_int_equal(buf[1], 2);
  assert_int_equal(buf[2], 3);
  assert_int_equal(buf[3], 0); /* not needed: not run */
  assert_int_equal(buf[4], 0);
  assert_int_equal(sa_host_stream_pending(a), 1);
  assert_int_equal(sa_host_stream_pending(c), 0);
  assert_int_equal(sa_host_drain_all(), SA_OK);
  assert_int_equal(buf[3], 1);
  assert_int_equal(buf[4], 4);
  sa_stream all[] = {a, b, c, bystander};
  for (int i = 0; i < 4; i++) assert_int_equal(sa_host_stream_destroy(all[i]), SA_OK);
  assert_int_equal(d->ops->event_destroy(d, ea), SA_OK);
  assert_int_equal(d->ops->event_destroy(d, eb), SA_OK);
}

static void drain_runs_the_stream_and_what_it_waits_on(void **state) {
  (void)state;
  sa_stream a = manual(), b = manual();
  sa_event e = event();
  fill_after(a, 1, e, b, buf + 1, 2);
  assert_int_equal(sa_host_stream_drain(b), SA_OK);
  assert_int_equal(buf[0], 1);
  assert_int_equal(buf[1], 2);
  destroy_all(a, b, e);
}

/* cuStreamDestroy returns at once; work still queued on the stream runs
 * later, and its resources go once it has (CUDA driver API). So an event
 * recorded on it stays pending, and the checker still sees its kernels: a
 * destroyed stream's queued work is no reason to hand its memory on. The
 * work runs when something drives it (a synchronize that depends on it,
 * device_synchronize, drain_all). */
static void destroy_returns_at_once_and_its_work_stays_queued(void **state) {
  (void)state;
  sa_stream a = manual(), b = manual();
  sa_event e = event(), f = event();
  fill_after(a, 1, e, b, buf + 1, 2);
  assert_int_equal(d->ops->event_record(d, f, b), SA_OK);
  assert_int_equal(sa_host_stream_destroy(b), SA_OK);
  assert_int_equal(buf[0], 0);
  assert_int_equal(buf[1], 0);
  assert_int_equal(d->ops->event_query(d, f), SA_ERR_NOT_READY);
  /* Handing buf + 1 to a, which is not ordered after b's fill. */
  uint64_t v0 = violations();
  assert_int_equal(d->ops->check_handout(d, (uintptr_t)(buf + 1), 4, a), SA_ERR_STREAM_ORDER);
  assert_int_equal(violations(), v0 + 1);
  /* Driving the event runs b's work and what it waits for. */
  assert_int_equal(d->ops->event_synchronize(d, f), SA_OK);
  assert_int_equal(buf[0], 1);
  assert_int_equal(buf[1], 2);
  assert_int_equal(d->ops->event_query(d, f), SA_OK);
  /* device_synchronize (cuCtxSynchronize) covers destroyed streams too. */
  assert_int_equal(sa_host_fill(a, buf + 2, 4, 3), SA_OK);
  assert_int_equal(d->ops->event_record(d, e, a), SA_OK);
  assert_int_equal(d->ops->stream_destroy(d, a), SA_OK);
  assert_int_equal(d->ops->event_query(d, e), SA_ERR_NOT_READY);
  assert_int_equal(d->ops->device_synchronize(d), SA_OK);
  assert_int_equal(buf[2], 3);
  assert_int_equal(d->ops->event_query(d, e), SA_OK);
  assert_int_equal(d->ops->event_destroy(d, e), SA_OK);
  assert_int_equal(d->ops->event_destroy(d, f), SA_OK);
}

static void default_stream_can_be_manual(void **state) {
  (void)state;
  assert_int_equal(sa_host_set_default_stream_mode(SA_HOST_MANUAL), SA_OK);
  assert_int_equal(sa_host_fill(NULL, buf, 4, 8), SA_OK);
  assert_int_equal(buf[0], 0);
  assert_int_equal(sa_host_stream_pending(NULL), 1);
  assert_int_equal(sa_host_set_default_stream_mode(SA_HOST_AUTO), SA_OK); /* runs it */
  assert_int_equal(buf[0], 8);
  assert_int_equal(sa_host_set_default_stream_mode((sa_host_mode)7), SA_ERR_INVALID_ARGUMENT);
}

static void invalid_streams_are_rejected(void **state) {
  (void)state;
  sa_stream s = NULL;
  sa_event e = event();
  assert_int_equal(d->ops->stream_validate(d, NULL), SA_OK);
  assert_int_equal(d->ops->stream_validate(d, (sa_stream)buf), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(d->ops->stream_create(d, &s), SA_OK);
  assert_int_equal(d->ops->stream_validate(d, s), SA_OK);
  assert_int_equal(d->ops->stream_destroy(d, s), SA_OK);
  assert_int_equal(d->ops->stream_validate(d, s), SA_ERR_UNKNOWN_STREAM); /* destroyed */
  assert_int_equal(d->ops->stream_destroy(d, s), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(d->ops->stream_synchronize(d, s), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(d->ops->event_record(d, e, s), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(d->ops->stream_wait_event(d, s, e), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(sa_host_stream_step(s, 1, NULL), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(sa_host_stream_drain(s), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(sa_host_stream_pending(s), 0);
  assert_int_equal(sa_host_stream_destroy(NULL), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_host_stream_create((sa_host_mode)5, &s), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_host_stream_create(SA_HOST_AUTO, NULL), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(d->ops->event_destroy(d, e), SA_OK);
}

static uint64_t violations(void) {
  sa_host_counters c;
  sa_host_get_counters(&c);
  return c.order_violations;
}

/* CUDA gives a destroyed stream's handle to a later stream; so does the
 * simulator (the last destroyed first). The new stream has a new id. */
static void a_destroyed_handle_goes_to_the_next_stream_with_a_new_id(void **state) {
  (void)state;
  sa_stream s = manual(), t = manual();
  uint64_t sid, tid, again;
  assert_int_equal(d->ops->stream_id(d, s, &sid), SA_OK);
  assert_int_equal(d->ops->stream_id(d, t, &tid), SA_OK);
  assert_true(sid != tid);
  assert_int_equal(sa_host_stream_destroy(s), SA_OK);
  sa_stream s2 = manual();
  assert_ptr_equal(s2, s);
  assert_int_equal(d->ops->stream_id(d, s2, &again), SA_OK);
  assert_true(again != sid && again != tid);
  uint64_t none;
  assert_int_equal(d->ops->stream_id(d, NULL, &none), SA_OK); /* the default stream */
  assert_int_equal(d->ops->stream_id(d, (sa_stream)buf, &none), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(sa_host_stream_destroy(s2), SA_OK);
  assert_int_equal(sa_host_stream_destroy(t), SA_OK);
}

/* A driver call on a destroyed stream whose handle no stream has taken
 * since is what crashes libcuda: the simulator counts each as a violation.
 * A handle that never was a stream is only unknown; the test API's own
 * calls (drain, step, pending) are not the library's. */
static void a_driver_call_on_a_destroyed_stream_is_a_violation(void **state) {
  (void)state;
  sa_event e = event();
  sa_stream s = manual();
  assert_int_equal(sa_host_stream_destroy(s), SA_OK);
  uint64_t v0 = violations(), id;
  assert_int_equal(d->ops->event_record(d, e, s), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(d->ops->stream_wait_event(d, s, e), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(d->ops->stream_synchronize(d, s), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(d->ops->stream_validate(d, s), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(d->ops->stream_id(d, s, &id), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(violations(), v0 + 5);
  assert_int_equal(sa_host_stream_drain(s), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(d->ops->event_record(d, e, (sa_stream)buf), SA_ERR_UNKNOWN_STREAM);
  assert_int_equal(violations(), v0 + 5);
  sa_stream again = manual(); /* takes the handle: a stream again */
  assert_ptr_equal(again, s);
  assert_int_equal(d->ops->event_record(d, e, again), SA_OK);
  assert_int_equal(violations(), v0 + 5);
  assert_int_equal(sa_host_stream_destroy(again), SA_OK);
  assert_int_equal(d->ops->event_destroy(d, e), SA_OK);
}

/* device_synchronize completes the work of every stream, manual ones and
 * what they wait for included, as cuCtxSynchronize does. */
static void device_synchronize_completes_every_stream(void **state) {
  (void)state;
  sa_stream a = manual(), b = manual();
  sa_event e = event();
  fill_after(a, 5, e, b, buf + 1, 6);
  assert_int_equal(sa_host_fill(NULL, buf + 2, 4, 7), SA_OK);
  assert_int_equal(d->ops->device_synchronize(d), SA_OK);
  assert_int_equal(sa_host_stream_pending(a) + sa_host_stream_pending(b), 0);
  assert_int_equal(buf[0] + buf[1] + buf[2], 5 + 6 + 7);
  destroy_all(a, b, e);
}

static void invalid_events_are_rejected(void **state) {
  (void)state;
  sa_event e = event();
  assert_int_equal(d->ops->event_destroy(d, e), SA_OK);
  assert_int_equal(d->ops->event_destroy(d, e), SA_ERR_DRIVER);
  assert_int_equal(d->ops->event_query(d, e), SA_ERR_DRIVER);
  assert_int_equal(d->ops->event_record(d, e, NULL), SA_ERR_DRIVER);
  assert_int_equal(d->ops->event_synchronize(d, (sa_event)buf), SA_ERR_DRIVER);
  assert_int_equal(d->ops->stream_wait_event(d, NULL, NULL), SA_ERR_DRIVER);
  assert_int_equal(d->ops->event_create(d, NULL), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_host_stream_pending(NULL), 0); /* nothing was enqueued */
}

static void counters_follow_streams_and_events(void **state) {
  (void)state;
  sa_host_counters c;
  sa_stream s1 = manual(), s2 = manual();
  sa_event e = event();
  sa_host_get_counters(&c);
  assert_int_equal(c.streams, 2);
  assert_int_equal(c.events, 1);
  assert_int_equal(sa_host_stream_destroy(s1), SA_OK);
  assert_int_equal(d->ops->event_destroy(d, e), SA_OK);
  sa_host_get_counters(&c);
  assert_int_equal(c.streams, 1);
  assert_int_equal(c.events, 0);
  assert_int_equal(sa_host_stream_destroy(s2), SA_OK);
}

static void long_queues_keep_their_order(void **state) {
  (void)state;
  sa_stream s = manual();
  for (uint32_t i = 1; i <= 5000; i++) {
    assert_int_equal(sa_host_fill(s, buf + i % 7, 4, i), SA_OK);
    if (i % 3 == 0) assert_int_equal(sa_host_stream_step(s, 1, NULL), SA_OK);
  }
  assert_int_equal(sa_host_stream_pending(s), 5000 - 5000 / 3);
  assert_int_equal(sa_host_stream_drain(s), SA_OK);
  for (uint32_t k = 0; k < 7; k++) {
    uint32_t last = 5000 - (5000 - k) % 7; /* the last i with i % 7 == k */
    assert_int_equal(buf[k], last);
  }
  assert_int_equal(sa_host_stream_destroy(s), SA_OK);
}

enum { THREADS = 4, ROUNDS = 300 };

static void *worker(void *arg) {
  uint32_t *mine = arg;
  sa_stream s = NULL;
  sa_event e = NULL;
  int ok = sa_host_stream_create(SA_HOST_MANUAL, &s) == SA_OK && d->ops->event_create(d, &e) == SA_OK;
  for (uint32_t r = 1; ok && r <= ROUNDS; r++) {
    uint64_t bad = 0;
    ok = sa_host_fill(s, mine, 64, r) == SA_OK && d->ops->event_record(d, e, s) == SA_OK &&
         sa_host_check(s, mine, 64, r, &bad) == SA_OK && d->ops->stream_wait_event(d, NULL, e) == SA_OK &&
         d->ops->event_synchronize(d, e) == SA_OK && d->ops->event_query(d, e) == SA_OK &&
         mine[15] == r && d->ops->stream_synchronize(d, s) == SA_OK && bad == 0;
  }
  if (e != NULL && d->ops->event_destroy(d, e) != SA_OK) ok = 0;
  if (s != NULL && sa_host_stream_destroy(s) != SA_OK) ok = 0;
  return ok ? arg : NULL;
}

static void streams_work_from_many_threads(void **state) {
  (void)state;
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++) {
    assert_int_equal(pthread_create(&t[i], NULL, worker, buf + 64 * i), 0);
  }
  for (int i = 0; i < THREADS; i++) {
    void *ret = NULL;
    assert_int_equal(pthread_join(t[i], &ret), 0);
    assert_ptr_equal(ret, buf + 64 * i);
  }
}

#define T(f) cmocka_unit_test_setup_teardown(f, reset, check_clean)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(manual_stream_runs_nothing_until_stepped),
      T(auto_stream_runs_work_at_once),
      T(step_runs_at_most_n_ops_in_order),
      T(fill_and_check_act_when_they_complete),
      T(large_fill_and_check_count_every_word),
      T(kernels_reject_bad_arguments),
      T(never_recorded_event_is_complete),
      T(event_completes_when_its_stream_passes_the_record),
      T(rerecord_overwrites_the_event),
      T(event_synchronize_drives_the_recording_stream),
      T(wait_edge_blocks_until_the_other_stream_advances),
      T(wait_captures_the_record_at_enqueue_time),
      T(auto_stream_waiting_on_a_manual_one_runs_when_it_advances),
      T(synchronize_drives_dependencies_transitively),
      T(drain_runs_the_stream_and_what_it_waits_on),
      T(destroy_returns_at_once_and_its_work_stays_queued),
      T(default_stream_can_be_manual),
      T(invalid_streams_are_rejected),
      T(invalid_events_are_rejected),
      T(a_destroyed_handle_goes_to_the_next_stream_with_a_new_id),
      T(a_driver_call_on_a_destroyed_stream_is_a_violation),
      T(device_synchronize_completes_every_stream),
      T(counters_follow_streams_and_events),
      T(long_queues_keep_their_order),
      T(streams_work_from_many_threads),
  };
  return sa_fixture_run_with_host_driver(tests, &d);
}
