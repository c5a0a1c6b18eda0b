/* Stream capture in the simulator: which driver calls a capture makes the
 * driver refuse, and which captures such a call invalidates (the rules are
 * in include/streamarena/host.h, measured on an H200 with CUDA 13).
 *
 * A capture is state of its stream (sa_sim_stream.capture*); what
 * stream.c and event.c enqueue on a capturing stream goes into the graph,
 * which the simulator does not keep. Owns the count of open captures and
 * each thread's capture mode; called by stream.c, event.c, driver/host.c
 * and users of host.h. Lock held in every sa_sim_ function.
 */
#include <errno.h>

#include "sim.h"

static size_t open_captures; /* streams whose capture began and has not ended */
static uint64_t next_seq = 1;
static _Thread_local sa_host_capture_mode thread_mode = SA_HOST_CAPTURE_GLOBAL;
static uint64_t threads_seen;             /* names threads: 1, 2, ... */
static _Thread_local uint64_t thread_name; /* 0 until the thread begins a capture */

/* The calling thread's name, unique for the process (lock held). */
static uint64_t this_thread(void) {
  if (thread_name == 0) thread_name = ++threads_seen;
  return thread_name;
}

static int mode_valid(sa_host_capture_mode m) {
  return m == SA_HOST_CAPTURE_GLOBAL || m == SA_HOST_CAPTURE_THREAD_LOCAL ||
         m == SA_HOST_CAPTURE_RELAXED;
}

static sa_status refuse(const char *why) {
  return sa_sim_fail(SA_ERR_STREAM_CAPTURING, EBUSY, why);
}

static void invalidate(sa_sim_stream *s) {
  if (s->capture == SA_HOST_CAPTURE_ACTIVE) s->capture = SA_HOST_CAPTURE_INVALIDATED;
}

sa_status sa_sim_capture_refuse_on(sa_sim_stream *s) {
  if (s->capture == SA_HOST_CAPTURE_NONE) return SA_OK;
  invalidate(s);
  return refuse("host: call not permitted on a capturing stream "
                "(as CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)");
}

/* Does the capture of s forbid this thread's potentially unsafe calls? Its
 * own capture does unless begun relaxed; another thread's global one does
 * unless this thread's mode is thread-local (or relaxed: not asked). */
static int forbids(const sa_sim_stream *s) {
  if (s->capture == SA_HOST_CAPTURE_NONE || s->capture_mode == SA_HOST_CAPTURE_RELAXED) return 0;
  if (s->capture_thread == thread_name) return 1; /* 0, never began one, names none */
  return s->capture_mode == SA_HOST_CAPTURE_GLOBAL && thread_mode == SA_HOST_CAPTURE_GLOBAL;
}

sa_status sa_sim_capture_unsafe_call(void) {
  if (open_captures == 0 || thread_mode == SA_HOST_CAPTURE_RELAXED) return SA_OK;
  int refused = 0;
  for (size_t slot = SA_SIM_FIRST_USER_SLOT; slot < sa_sim_stream_slots(); slot++) {
    sa_sim_stream *s = sa_sim_stream_at(slot);
    if (s == NULL || !forbids(s)) continue;
    invalidate(s);
    refused = 1;
  }
  return refused ? refuse("host: potentially unsafe call during a stream capture "
                          "(as CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)")
                 : SA_OK;
}

sa_status sa_sim_capture_device_wide(void) {
  if (open_captures == 0) return SA_OK;
  for (size_t slot = SA_SIM_FIRST_USER_SLOT; slot < sa_sim_stream_slots(); slot++) {
    sa_sim_stream *s = sa_sim_stream_at(slot);
    if (s != NULL) invalidate(s);
  }
  return refuse("host: device-wide synchronize during a stream capture "
                "(as CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)");
}

int sa_sim_capture_invalidate_seq(uint64_t seq) {
  if (open_captures == 0) return 0;
  for (size_t slot = SA_SIM_FIRST_USER_SLOT; slot < sa_sim_stream_slots(); slot++) {
    sa_sim_stream *s = sa_sim_stream_at(slot);
    if (s == NULL || s->capture == SA_HOST_CAPTURE_NONE || s->capture_seq != seq) continue;
    invalidate(s);
    return 1;
  }
  return 0;
}

void sa_sim_capture_forget(sa_sim_stream *s) {
  if (s->capture == SA_HOST_CAPTURE_NONE) return;
  s->capture = SA_HOST_CAPTURE_NONE;
  open_captures--;
}

/* ---- include/streamarena/host.h ---------------------------------------- */

sa_status sa_host_stream_begin_capture(sa_stream stream, sa_host_capture_mode mode) {
  if (stream == NULL) return SA_ERR_INVALID_ARGUMENT; /* as CUDA's legacy stream */
  if (!mode_valid(mode)) return SA_ERR_INVALID_ARGUMENT;
  sa_sim_lock();
  sa_sim_stream *s = sa_sim_stream_lookup(stream, sa_host_get_device());
  sa_status st = SA_OK;
  if (s == NULL) {
    st = SA_ERR_UNKNOWN_STREAM;
  } else if (s->capture != SA_HOST_CAPTURE_NONE) {
    st = SA_ERR_INVALID_ARGUMENT;
  } else {
    s->capture = SA_HOST_CAPTURE_ACTIVE;
    s->capture_mode = mode;
    s->capture_thread = this_thread();
    s->capture_seq = next_seq++;
    open_captures++;
  }
  sa_sim_unlock();
  return st;
}

sa_status sa_host_stream_end_capture(sa_stream stream) {
  sa_sim_lock();
  sa_sim_stream *s = sa_sim_stream_lookup(stream, sa_host_get_device());
  sa_status st = SA_OK;
  if (s == NULL) {
    st = SA_ERR_UNKNOWN_STREAM;
  } else if (s->capture == SA_HOST_CAPTURE_NONE) {
    st = SA_ERR_INVALID_ARGUMENT;
  } else {
    if (s->capture == SA_HOST_CAPTURE_INVALIDATED) st = SA_ERR_STREAM_CAPTURING;
    sa_sim_capture_forget(s);
  }
  sa_sim_unlock();
  return st;
}

sa_status sa_host_stream_capture_status(sa_stream stream, sa_host_capture_status *out) {
  if (out == NULL) return SA_ERR_INVALID_ARGUMENT;
  sa_sim_lock();
  sa_sim_stream *s = sa_sim_stream_lookup(stream, sa_host_get_device());
  if (s != NULL) *out = s->capture;
  sa_sim_unlock();
  return s != NULL ? SA_OK : SA_ERR_UNKNOWN_STREAM;
}

sa_status sa_host_exchange_capture_mode(sa_host_capture_mode *mode) {
  if (mode == NULL || !mode_valid(*mode)) return SA_ERR_INVALID_ARGUMENT;
  sa_host_capture_mode old = thread_mode;
  thread_mode = *mode;
  *mode = old;
  return SA_OK;
}
