/* Simulated events, and the waits of streams on them.
 *
 * An event records (stream, ticket of its record marker); it is complete
 * once that stream's completed ticket reaches it (stream.c). A
 * never-recorded event is complete; re-recording overwrites, as in CUDA.
 * sa_sim_stream_wait_event enqueues a wait op holding the (stream, ticket)
 * captured at enqueue time, and joins the event's clock into the waiting
 * stream's (checker.c).
 *
 * An event belongs to one device and is recorded only on its device's
 * streams (cuEventRecord wants the stream in the event's context); any
 * stream may wait for any event (cuStreamWaitEvent crosses devices). Under
 * capture (capture.c) an event recorded on a capturing stream is a node of
 * the graph, and what may be asked of it follows CUDA's rules.
 *
 * Calls stream.c (queues and progress), capture.c and checker.c's clocks;
 * called by driver/host.c.
 */
#include <errno.h>
#include <stdlib.h>

#include "sim.h"

typedef struct sim_event_s {
  int device;          /* whose event it is */
  int recorded;
  uint32_t slot;       /* the stream it was last recorded on */
  uint64_t sid;
  uint64_t ticket;     /* its record marker's ticket */
  sa_sim_clock clock;  /* the recorder's clock, with the marker itself */
  uint64_t capture_seq; /* nonzero: last recorded in that capture (capture.c) */
} sim_event;

static struct {
  sa_sim_ptrset live; /* live event handles */
  size_t n;
} events;

void sa_sim_event_counters(sa_host_counters *out) { out->events = events.n; }

static sim_event *event_lookup(void *event) {
  return sa_sim_ptrset_contains(&events.live, event) ? (sim_event *)event : NULL;
}

static sa_status bad_event(void) {
  return sa_sim_fail(SA_ERR_DRIVER, EINVAL, "host: unknown or destroyed event");
}

/* An event last recorded in a capture that has ended: CUDA says
 * CUDA_ERROR_INVALID_VALUE to a query, a synchronize or a wait. */
static sa_status captured_event(void) {
  return sa_sim_fail(SA_ERR_DRIVER, EINVAL,
                     "host: event last recorded in a stream capture that has ended");
}

/* Before a host query or synchronize of e: SA_OK, or why the driver
 * refuses it during a capture. */
static sa_status event_wait_allowed(const sim_event *e) {
  if (e->capture_seq == 0) return sa_sim_capture_unsafe_call();
  if (!sa_sim_capture_invalidate_seq(e->capture_seq)) return captured_event();
  return sa_sim_fail(SA_ERR_STREAM_CAPTURING, EBUSY,
                     "host: query of an event recorded in a capture "
                     "(as CUDA_ERROR_CAPTURED_EVENT)");
}

sa_status sa_sim_stream_wait_event(sa_stream handle, int device, void *event) {
  sa_sim_stream *s = sa_sim_stream_for_call(handle, device, "stream_wait_event");
  if (s == NULL) return SA_ERR_UNKNOWN_STREAM;
  sim_event *e = event_lookup(event);
  if (e == NULL) return bad_event();
  if (s->capture != SA_HOST_CAPTURE_NONE) {
    if (e->capture_seq == s->capture_seq) return SA_OK; /* a dependency inside the graph */
    return sa_sim_capture_refuse_on(s); /* as CAPTURE_ISOLATION */
  }
  if (e->capture_seq != 0) {
    /* CUDA joins s to the capture, which then cannot end cleanly. */
    if (sa_sim_capture_invalidate_seq(e->capture_seq)) return SA_OK;
    return captured_event();
  }
  sa_sim_op op = {.kind = SA_SIM_OP_WAIT};
  sa_sim_clock clock = {NULL, 0};
  if (sa_sim_ops_reserve(s) != SA_OK) return SA_ERR_OUT_OF_MEMORY;
  if (e->recorded) {
    op.wait_slot = e->slot;
    op.wait_sid = e->sid;
    op.wait_ticket = e->ticket;
    const sa_sim_stream *edge = sa_sim_stream_ref(e->slot, e->sid);
    if (edge == s) edge = NULL; /* own stream: ordered anyway */
    if (sa_sim_clock_join(&clock, &s->clock, &e->clock, edge, e->ticket) != SA_OK) {
      return SA_ERR_OUT_OF_MEMORY;
    }
    sa_sim_clock_free(&s->clock);
    s->clock = clock;
  }
  sa_sim_ops_push(s, &op);
  sa_sim_settle();
  return SA_OK;
}

/* ---- events ------------------------------------------------------------- */

sa_status sa_sim_event_create(int device, void **out) {
  if (out == NULL) return SA_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (device < 0 || device >= sa_sim_device_count()) return SA_ERR_NO_DEVICE;
  sim_event *e = calloc(1, sizeof *e);
  if (e == NULL || sa_sim_ptrset_reserve(&events.live, 1) != SA_OK) {
    free(e);
    return sa_sim_fail(SA_ERR_OUT_OF_MEMORY, ENOMEM, "host: out of host memory");
  }
  e->device = device;
  sa_sim_ptrset_insert(&events.live, e);
  events.n++;
  *out = e;
  return SA_OK;
}

sa_status sa_sim_event_destroy(void *event) {
  sim_event *e = event_lookup(event);
  if (e == NULL) return bad_event();
  /* A pending record marker does not point at the event: nothing dangles. */
  (void)sa_sim_ptrset_remove(&events.live, e);
  events.n--;
  sa_sim_clock_free(&e->clock);
  free(e);
  return SA_OK;
}

sa_status sa_sim_event_record(void *event, sa_stream handle, int device) {
  sim_event *e = event_lookup(event);
  if (e == NULL) return bad_event();
  sa_sim_stream *s = sa_sim_stream_for_call(handle, device, "event_record");
  if (s == NULL) return SA_ERR_UNKNOWN_STREAM;
  if (!sa_sim_stream_on_device(s, e->device)) {
    return sa_sim_fail(SA_ERR_DRIVER, EINVAL, "host: event recorded on a stream of another device");
  }
  if (s->capture != SA_HOST_CAPTURE_NONE) { /* a node of the graph, not a marker */
    sa_sim_clock_free(&e->clock);
    *e = (sim_event){.device = e->device, .recorded = 1, .capture_seq = s->capture_seq};
    return SA_OK;
  }
  if (sa_sim_ops_reserve(s) != SA_OK) return SA_ERR_OUT_OF_MEMORY;
  uint64_t ticket = s->enqueued + 1;
  sa_sim_clock clock, none = {NULL, 0};
  if (sa_sim_clock_join(&clock, &s->clock, &none, s, ticket) != SA_OK) {
    return SA_ERR_OUT_OF_MEMORY;
  }
  sa_sim_op op = {.kind = SA_SIM_OP_RECORD};
  sa_sim_ops_push(s, &op);
  sa_sim_clock_free(&e->clock);
  *e = (sim_event){e->device, 1, s->slot, s->sid, ticket, clock, 0};
  sa_sim_settle();
  return SA_OK;
}

/* The stream an event waits for and its ticket; NULL if already complete. */
static sa_sim_stream *event_pending(const sim_event *e) {
  if (!e->recorded) return NULL;
  sa_sim_stream *t = sa_sim_stream_ref(e->slot, e->sid);
  return t != NULL && t->completed < e->ticket ? t : NULL;
}

sa_status sa_sim_event_query(void *event) {
  sim_event *e = event_lookup(event);
  if (e == NULL) return bad_event();
  sa_status st = event_wait_allowed(e);
  if (st != SA_OK) return st;
  return event_pending(e) == NULL ? SA_OK : SA_ERR_NOT_READY;
}

sa_status sa_sim_event_synchronize(void *event) {
  sim_event *e = event_lookup(event);
  if (e == NULL) return bad_event();
  sa_status st = event_wait_allowed(e);
  if (st != SA_OK) return st;
  sa_sim_stream *t = event_pending(e);
  if (t != NULL) {
    sa_sim_drive(t, e->ticket);
    sa_sim_settle();
  }
  return SA_OK;
}
