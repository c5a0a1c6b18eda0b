/* Call counting and fault injection for the simulated driver functions.
 * Every driver op of driver/host.c enters through sa_sim_fault_enter, before
 * it validates or changes anything, so an injected failure has no effect. */
#include <errno.h>

#include "sim.h"

typedef struct fault_s {
  uint64_t calls;    /* calls so far, failed ones included */
  uint64_t fail_at;  /* the call number that fails; 0: none armed */
  int sticky;        /* fail every call from fail_at on */
} fault;

static fault faults[SA_HOST_FN_COUNT]; /* lock held */
static uint64_t faults_injected;        /* lock held */
static _Thread_local uint64_t thread_calls[SA_HOST_FN_COUNT]; /* the calling thread's calls */

static const char *const fn_names[SA_HOST_FN_COUNT] = {
    "va_reserve",   "va_release",    "chunk_create",      "chunk_release",
    "map",          "unmap",         "set_access",        "event_create",
    "event_destroy", "event_record", "event_query",       "event_synchronize",
    "stream_wait_event", "stream_synchronize", "device_synchronize",
    "stream_validate", "stream_id", "stream_query",
};

/* Static descriptions for sa_last_driver_error (the name must outlive us). */
static const char *const fault_names[SA_HOST_FN_COUNT] = {
    "host: injected fault in va_reserve",
    "host: injected fault in va_release",
    "host: injected fault in chunk_create",
    "host: injected fault in chunk_release",
    "host: injected fault in map",
    "host: injected fault in unmap",
    "host: injected fault in set_access",
    "host: injected fault in event_create",
    "host: injected fault in event_destroy",
    "host: injected fault in event_record",
    "host: injected fault in event_query",
    "host: injected fault in event_synchronize",
    "host: injected fault in stream_wait_event",
    "host: injected fault in stream_synchronize",
    "host: injected fault in device_synchronize",
    "host: injected fault in stream_validate",
    "host: injected fault in stream_id",
    "host: injected fault in stream_query",
};

const char *sa_host_fn_name(sa_host_fn fn) {
  if ((unsigned)fn >= SA_HOST_FN_COUNT) return "unknown";
  return fn_names[fn];
}

sa_status sa_sim_fault_enter(sa_host_fn fn) {
  fault *f = &faults[fn];
  f->calls++;
  thread_calls[fn]++;
  if (f->fail_at == 0 || f->calls < f->fail_at) return SA_OK;
  if (f->calls > f->fail_at && !f->sticky) return SA_OK;
  if (!f->sticky) f->fail_at = 0; /* one-shot: disarm */
  faults_injected++;
  return sa_sim_fail(SA_ERR_DRIVER, EIO, fault_names[fn]);
}

sa_status sa_host_fault_inject(sa_host_fn fn, uint64_t nth, int sticky) {
  if ((unsigned)fn >= SA_HOST_FN_COUNT) return SA_ERR_INVALID_ARGUMENT;
  sa_sim_lock();
  fault *f = &faults[fn];
  if (nth == 0) {
    f->fail_at = 0;
    f->sticky = 0;
  } else if (nth > UINT64_MAX - f->calls) {
    sa_sim_unlock();
    return SA_ERR_INVALID_ARGUMENT;
  } else {
    f->fail_at = f->calls + nth;
    f->sticky = sticky != 0;
  }
  sa_sim_unlock();
  return SA_OK;
}

void sa_host_fault_clear(void) {
  sa_sim_lock();
  for (int i = 0; i < SA_HOST_FN_COUNT; i++) {
    faults[i].fail_at = 0;
    faults[i].sticky = 0;
  }
  sa_sim_unlock();
}

uint64_t sa_host_call_count(sa_host_fn fn) {
  if ((unsigned)fn >= SA_HOST_FN_COUNT) return 0;
  sa_sim_lock();
  uint64_t n = faults[fn].calls;
  sa_sim_unlock();
  return n;
}

void sa_sim_fault_calls(uint64_t calls[SA_HOST_FN_COUNT]) {
  for (int i = 0; i < SA_HOST_FN_COUNT; i++) calls[i] = faults[i].calls;
}

void sa_sim_fault_thread_calls(uint64_t calls[SA_HOST_FN_COUNT]) {
  for (int i = 0; i < SA_HOST_FN_COUNT; i++) calls[i] = thread_calls[i];
}

uint64_t sa_host_faults_injected(void) {
  sa_sim_lock();
  uint64_t n = faults_injected;
  sa_sim_unlock();
  return n;
}
