/* Fault injection in the host simulator: the nth call of any driver function
 * fails (once, or from then on when sticky) with SA_ERR_DRIVER, a failed call
 * changes nothing, and calls and faults are counted. */
#include <errno.h>
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

#define G ((size_t)2 << 20)

static sa_driver *d; /* opened for the group (fixture.h) */
static uint32_t mem[256];

/* Every test ends with no fault armed and nothing left on the device. */
static int check_clean(void **state) {
  (void)state;
  sa_host_fault_clear();
  sa_host_counters c;
  sa_host_get_counters(&c);
  return c.va_ranges == 0 && c.chunks == 0 && c.mappings == 0 && c.events == 0 && c.streams == 0
             ? 0
             : -1;
}

/* One call of a driver function, with what it needs made beforehand and
 * whatever it leaves cleaned up afterwards (by other functions). */
typedef struct trial_s {
  uintptr_t va;
  sa_chunk_handle chunk;
  sa_event ev;
  sa_stream s;
  int has_va, has_chunk, mapped, has_ev;
} trial;

static void prepare(sa_host_fn fn, trial *t) {
  memset(t, 0, sizeof *t);
  switch (fn) {
    case SA_HOST_FN_VA_RELEASE:
      assert_int_equal(d->ops->va_reserve(d, G, 0, &t->va), SA_OK);
      t->has_va = 1;
      break;
    case SA_HOST_FN_CHUNK_RELEASE:
      assert_int_equal(d->ops->chunk_create(d, G, &t->chunk), SA_OK);
      t->has_chunk = 1;
      break;
    case SA_HOST_FN_MAP:
    case SA_HOST_FN_UNMAP:
    case SA_HOST_FN_SET_ACCESS:
      assert_int_equal(d->ops->va_reserve(d, G, 0, &t->va), SA_OK);
      assert_int_equal(d->ops->chunk_create(d, G, &t->chunk), SA_OK);
      t->has_va = t->has_chunk = 1;
      if (fn != SA_HOST_FN_MAP) {
        assert_int_equal(d->ops->map(d, t->va, G, t->chunk), SA_OK);
        t->mapped = 1;
      }
      break;
    case SA_HOST_FN_EVENT_DESTROY:
    case SA_HOST_FN_EVENT_QUERY:
    case SA_HOST_FN_EVENT_SYNCHRONIZE:
    case SA_HOST_FN_EVENT_RECORD:
    case SA_HOST_FN_STREAM_WAIT_EVENT:
      assert_int_equal(d->ops->event_create(d, &t->ev), SA_OK);
      t->has_ev = 1;
      break;
    default:
      break;
  }
  if (fn == SA_HOST_FN_EVENT_RECORD || fn == SA_HOST_FN_STREAM_WAIT_EVENT ||
      fn == SA_HOST_FN_STREAM_SYNCHRONIZE || fn == SA_HOST_FN_DEVICE_SYNCHRONIZE) {
    assert_int_equal(sa_host_stream_create(SA_HOST_MANUAL, &t->s), SA_OK);
    assert_int_equal(sa_host_fill(t->s, mem, sizeof mem, 1), SA_OK);
  }
}

static sa_status call(sa_host_fn fn, trial *t) {
  sa_status st = SA_ERR_INTERNAL;
  switch (fn) {
    case SA_HOST_FN_VA_RESERVE:
      st = d->ops->va_reserve(d, G, 0, &t->va);
      t->has_va = st == SA_OK;
      break;
    case SA_HOST_FN_VA_RELEASE:
      st = d->ops->va_release(d, t->va, G);
      t->has_va = st != SA_OK;
      break;
    case SA_HOST_FN_CHUNK_CREATE:
      st = d->ops->chunk_create(d, G, &t->chunk);
      t->has_chunk = st == SA_OK;
      break;
    case SA_HOST_FN_CHUNK_RELEASE:
      st = d->ops->chunk_release(d, t->chunk);
      t->has_chunk = st != SA_OK;
      break;
    case SA_HOST_FN_MAP:
      st = d->ops->map(d, t->va, G, t->chunk);
      t->mapped = st == SA_OK;
      break;
    case SA_HOST_FN_UNMAP:
      st = d->ops->unmap(d, t->va, G);
      t->mapped = st != SA_OK;
      break;
    case SA_HOST_FN_SET_ACCESS:
      st = d->ops->set_access(d, t->va, G);
      break;
    case SA_HOST_FN_EVENT_CREATE:
      st = d->ops->event_create(d, &t->ev);
      t->has_ev = st == SA_OK;
      break;
    case SA_HOST_FN_EVENT_DESTROY:
      st = d->ops->event_destroy(d, t->ev);
      t->has_ev = st != SA_OK;
      break;
    case SA_HOST_FN_EVENT_RECORD:
      st = d->ops->event_record(d, t->ev, t->s);
      break;
    case SA_HOST_FN_EVENT_QUERY:
      st = d->ops->event_query(d, t->ev);
      break;
    case SA_HOST_FN_EVENT_SYNCHRONIZE:
      st = d->ops->event_synchronize(d, t->ev);
      break;
    case SA_HOST_FN_STREAM_WAIT_EVENT:
      st = d->ops->stream_wait_event(d, t->s, t->ev);
      break;
    case SA_HOST_FN_STREAM_SYNCHRONIZE:
      st = d->ops->stream_synchronize(d, t->s);
      break;
    case SA_HOST_FN_DEVICE_SYNCHRONIZE:
      st = d->ops->device_synchronize(d);
      break;
    case SA_HOST_FN_STREAM_VALIDATE:
      st = d->ops->stream_validate(d, t->s);
      break;
    case SA_HOST_FN_STREAM_ID: {
      uint64_t id;
      st = d->ops->stream_id(d, t->s, &id);
      break;
    }
    case SA_HOST_FN_STREAM_QUERY:
      st = d->ops->stream_query(d, t->s);
      break;
    default:
      fail_msg("no trial for fn %d", (int)fn);
  }
  return st;
}

static void cleanup(trial *t) {
  if (t->mapped) assert_int_equal(d->ops->unmap(d, t->va, G), SA_OK);
  if (t->has_chunk) assert_int_equal(d->ops->chunk_release(d, t->chunk), SA_OK);
  if (t->has_va) assert_int_equal(d->ops->va_release(d, t->va, G), SA_OK);
  if (t->has_ev) assert_int_equal(d->ops->event_destroy(d, t->ev), SA_OK);
  if (t->s != NULL) assert_int_equal(sa_host_stream_destroy(t->s), SA_OK);
}

/* Cleanup uses these functions: while one of them is armed, clean up later. */
static int cleanup_uses(sa_host_fn fn) {
  return fn == SA_HOST_FN_UNMAP || fn == SA_HOST_FN_CHUNK_RELEASE || fn == SA_HOST_FN_VA_RELEASE ||
         fn == SA_HOST_FN_EVENT_DESTROY;
}

enum { MAX_TRIALS = 8 };

/* Run n trials of fn (faults as armed by the caller), expecting the given
 * statuses; then disarm and clean up. */
static void run_trials(sa_host_fn fn, int n, const sa_status *expect) {
  trial t[MAX_TRIALS];
  for (int i = 0; i < n; i++) {
    prepare(fn, &t[i]);
    sa_status st = call(fn, &t[i]);
    if (st != expect[i]) {
      fail_msg("%s call %d: got status %d, want %d", sa_host_fn_name(fn), i + 1, (int)st,
               (int)expect[i]);
    }
    if (!cleanup_uses(fn)) cleanup(&t[i]);
  }
  assert_int_equal(sa_host_fault_inject(fn, 0, 0), SA_OK);
  if (cleanup_uses(fn)) {
    for (int i = 0; i < n; i++) cleanup(&t[i]);
  }
}

static void nth_call_fails_once_for_every_fn(void **state) {
  (void)state;
  for (int fn = 0; fn < SA_HOST_FN_COUNT; fn++) {
    uint64_t calls = sa_host_call_count((sa_host_fn)fn);
    uint64_t faults = sa_host_faults_injected();
    assert_int_equal(sa_host_fault_inject((sa_host_fn)fn, 2, 0), SA_OK);
    const sa_status expect[] = {SA_OK, SA_ERR_DRIVER, SA_OK, SA_OK};
    run_trials((sa_host_fn)fn, 4, expect);
    assert_int_equal(sa_host_faults_injected(), faults + 1);
    /* Failed calls count too; cleanup never calls fn while it is counted. */
    if (!cleanup_uses((sa_host_fn)fn)) assert_int_equal(sa_host_call_count((sa_host_fn)fn), calls + 4);
  }
}

static void sticky_fault_fails_every_call_from_the_nth_on_for_every_fn(void **state) {
  (void)state;
  for (int fn = 0; fn < SA_HOST_FN_COUNT; fn++) {
    uint64_t faults = sa_host_faults_injected();
    assert_int_equal(sa_host_fault_inject((sa_host_fn)fn, 3, 1), SA_OK);
    const sa_status expect[] = {SA_OK, SA_OK, SA_ERR_DRIVER, SA_ERR_DRIVER, SA_ERR_DRIVER};
    run_trials((sa_host_fn)fn, 5, expect);
    assert_int_equal(sa_host_faults_injected(), faults + 3);
    const sa_status after[] = {SA_OK}; /* disarmed by run_trials */
    run_trials((sa_host_fn)fn, 1, after);
  }
}

static int same_counters(const sa_host_counters *a, const sa_host_counters *b) {
  return a->va_ranges == b->va_ranges && a->chunks == b->chunks &&
         a->chunk_bytes == b->chunk_bytes && a->mappings == b->mappings &&
         a->events == b->events && a->streams == b->streams &&
         a->order_violations == b->order_violations;
}

static void failed_calls_leave_no_trace(void **state) {
  (void)state;
  for (int fn = 0; fn < SA_HOST_FN_COUNT; fn++) {
    trial t;
    prepare((sa_host_fn)fn, &t);
    sa_host_counters before, after;
    sa_host_get_counters(&before);
    size_t pending = t.s != NULL ? sa_host_stream_pending(t.s) : 0;
    assert_int_equal(sa_host_fault_inject((sa_host_fn)fn, 1, 0), SA_OK);
    sa_driver_set_error(0, NULL);
    assert_int_equal(call((sa_host_fn)fn, &t), SA_ERR_DRIVER);
    sa_host_get_counters(&after);
    if (!same_counters(&before, &after)) fail_msg("%s: a failed call changed the counters", sa_host_fn_name((sa_host_fn)fn));
    if (t.s != NULL) assert_int_equal(sa_host_stream_pending(t.s), pending);
    const char *name = NULL;
    assert_int_equal(sa_last_driver_error(&name), EIO);
    assert_non_null(name);
    assert_non_null(strstr(name, sa_host_fn_name((sa_host_fn)fn)));
    cleanup(&t); /* the one-shot fault is spent */
  }
}

static void failed_record_keeps_the_previous_recording(void **state) {
  (void)state;
  sa_stream a = NULL, b = NULL;
  sa_event e = NULL;
  assert_int_equal(sa_host_stream_create(SA_HOST_MANUAL, &a), SA_OK);
  assert_int_equal(sa_host_stream_create(SA_HOST_MANUAL, &b), SA_OK);
  assert_int_equal(d->ops->event_create(d, &e), SA_OK);
  assert_int_equal(d->ops->event_record(d, e, a), SA_OK);
  assert_int_equal(sa_host_stream_drain(a), SA_OK);
  assert_int_equal(sa_host_fill(b, mem, 64, 1), SA_OK);
  assert_int_equal(sa_host_fault_inject(SA_HOST_FN_EVENT_RECORD, 1, 0), SA_OK);
  assert_int_equal(d->ops->event_record(d, e, b), SA_ERR_DRIVER);
  assert_int_equal(d->ops->event_query(d, e), SA_OK); /* still the completed record on a */
  assert_int_equal(sa_host_stream_pending(b), 1);
  assert_int_equal(d->ops->event_destroy(d, e), SA_OK);
  assert_int_equal(sa_host_drain_all(), SA_OK); /* queued work outlives a destroy */
  assert_int_equal(sa_host_stream_destroy(a), SA_OK);
  assert_int_equal(sa_host_stream_destroy(b), SA_OK);
}

static void failed_wait_adds_no_edge(void **state) {
  (void)state;
  sa_stream a = NULL, b = NULL;
  sa_event e = NULL;
  assert_int_equal(sa_host_stream_create(SA_HOST_MANUAL, &a), SA_OK);
  assert_int_equal(sa_host_stream_create(SA_HOST_MANUAL, &b), SA_OK);
  assert_int_equal(d->ops->event_create(d, &e), SA_OK);
  assert_int_equal(sa_host_fill(a, mem, 64, 1), SA_OK);
  assert_int_equal(d->ops->event_record(d, e, a), SA_OK);
  assert_int_equal(sa_host_fault_inject(SA_HOST_FN_STREAM_WAIT_EVENT, 1, 0), SA_OK);
  assert_int_equal(d->ops->stream_wait_event(d, b, e), SA_ERR_DRIVER);
  assert_int_equal(sa_host_stream_pending(b), 0);
  assert_int_equal(d->ops->check_handout(d, (uintptr_t)mem, 64, b), SA_ERR_STREAM_ORDER);
  assert_int_equal(d->ops->stream_wait_event(d, b, e), SA_OK); /* the fault was one-shot */
  assert_int_equal(d->ops->check_handout(d, (uintptr_t)mem, 64, b), SA_OK);
  assert_int_equal(d->ops->event_destroy(d, e), SA_OK);
  assert_int_equal(sa_host_drain_all(), SA_OK); /* queued work outlives a destroy */
  assert_int_equal(sa_host_stream_destroy(b), SA_OK);
  assert_int_equal(sa_host_stream_destroy(a), SA_OK);
}

static void nth_counts_from_the_inject_call(void **state) {
  (void)state;
  sa_event e[4];
  for (int i = 0; i < 3; i++) assert_int_equal(d->ops->event_create(d, &e[i]), SA_OK);
  assert_int_equal(sa_host_fault_inject(SA_HOST_FN_EVENT_CREATE, 1, 0), SA_OK);
  assert_int_equal(d->ops->event_create(d, &e[3]), SA_ERR_DRIVER);
  assert_int_equal(d->ops->event_create(d, &e[3]), SA_OK);
  for (int i = 0; i < 4; i++) assert_int_equal(d->ops->event_destroy(d, e[i]), SA_OK);
}

static void clear_disarms_every_fault(void **state) {
  (void)state;
  for (int fn = 0; fn < SA_HOST_FN_COUNT; fn++) {
    assert_int_equal(sa_host_fault_inject((sa_host_fn)fn, 1, 1), SA_OK);
  }
  sa_host_fault_clear();
  uint64_t faults = sa_host_faults_injected();
  for (int fn = 0; fn < SA_HOST_FN_COUNT; fn++) {
    const sa_status ok[] = {SA_OK};
    run_trials((sa_host_fn)fn, 1, ok);
  }
  assert_int_equal(sa_host_faults_injected(), faults);
  /* nth = 0 disarms one function. */
  assert_int_equal(sa_host_fault_inject(SA_HOST_FN_EVENT_CREATE, 1, 1), SA_OK);
  assert_int_equal(sa_host_fault_inject(SA_HOST_FN_EVENT_CREATE, 0, 1), SA_OK);
  const sa_status ok[] = {SA_OK};
  run_trials(SA_HOST_FN_EVENT_CREATE, 1, ok);
}

static void functions_have_names_and_bad_ones_are_rejected(void **state) {
  (void)state;
  for (int i = 0; i < SA_HOST_FN_COUNT; i++) {
    assert_string_not_equal(sa_host_fn_name((sa_host_fn)i), "unknown");
    for (int j = 0; j < i; j++) {
      assert_string_not_equal(sa_host_fn_name((sa_host_fn)i), sa_host_fn_name((sa_host_fn)j));
    }
  }
  assert_string_equal(sa_host_fn_name(SA_HOST_FN_COUNT), "unknown");
  assert_string_equal(sa_host_fn_name(SA_HOST_FN_MAP), "map");
  assert_int_equal(sa_host_fault_inject(SA_HOST_FN_COUNT, 1, 0), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_host_fault_inject((sa_host_fn)-1, 1, 0), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_host_call_count(SA_HOST_FN_COUNT), 0);
}

#define T(f) cmocka_unit_test_teardown(f, check_clean)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(nth_call_fails_once_for_every_fn),
      T(sticky_fault_fails_every_call_from_the_nth_on_for_every_fn),
      T(failed_calls_leave_no_trace),
      T(failed_record_keeps_the_previous_recording),
      T(failed_wait_adds_no_edge),
      T(nth_counts_from_the_inject_call),
      T(clear_disarms_every_fault),
      T(functions_have_names_and_bad_ones_are_rejected),
  };
  return sa_fixture_run_with_host_driver(tests, &d);
}
