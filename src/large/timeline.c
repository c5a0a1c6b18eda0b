/* Stream timelines: where a stream was when a span was freed on it, and
 * whether its work got that far.
 *
 * A free on stream S takes a ticket on S's timeline (1, 2, 3, ...) and
 * records an event there. A free range remembers (S, ticket) pairs, its
 * marks (span.c): pairs are plain values, so a range that is split keeps
 * them on both pieces and ranges that merge keep, per stream, the later
 * ticket (a stream completes its work in order). The events live here, in
 * a ring of SA_TIMELINE_EVENTS per stream, re-recorded in turn: a ticket
 * older than the ring maps to the oldest event still recorded, which marks
 * a later point of the same stream, so waiting on it or seeing it complete
 * is conservative, never early. No event is created per free and none is
 * shared between ranges.
 *
 * Only a free's own stream takes tickets: a stream that sa_record_stream
 * named gets an event of its own per free (span.c, "Marks"), since the
 * ring's shortcut (an older ticket judged by a later event) holds only for
 * work of one stream, and a thread that knew a destroyed stream's handle
 * takes the next stream's tickets here.
 *
 * A released stream (sa_stream_release synchronized it) has completed
 * every ticket. Events are recorded only inside calls that name the stream
 * (its frees); queries and waits are safe on any stream's events, also
 * after the stream was destroyed.
 *
 * Every function runs with the arena lock held. Calls event_pool.c and the
 * driver; called by span.c (and stream_arena.c at release and destroy).
 */
#include "timeline.h"
#include "../arena.h"
#include "../base/base.h"
#include "../base/event_pool.h"
#include "../driver/driver.h"

/* Count the slots whose ticket is now complete out of events in flight. */
static void advance(sa_arena *a, sa_timeline *tl, uint64_t done) {
  if (done <= tl->done) return;
  for (unsigned k = 0; k < SA_TIMELINE_EVENTS; k++)
    if (tl->ticket[k] > tl->done && tl->ticket[k] <= done)
      atomic_fetch_sub_explicit(&a->events.xin_flight, 1, memory_order_relaxed);
  tl->done = done;
}

/* The slot whose event covers ticket t: the earliest record at or after
 * it. SA_TIMELINE_EVENTS if none (t never handed out). */
static unsigned slot_for(const sa_timeline *tl, uint64_t t) {
  unsigned best = SA_TIMELINE_EVENTS;
  for (unsigned k = 0; k < SA_TIMELINE_EVENTS; k++)
    if (tl->ticket[k] >= t && (best == SA_TIMELINE_EVENTS || tl->ticket[k] < tl->ticket[best]))
      best = k;
  return best;
}

void sa__timeline_check(const sa_stream_arena *sarena) {
  static const char TIMELINE[] = "timeline";
  const sa_timeline *tl = &sarena->timeline;
  SA_CHECK(TIMELINE, tl->done <= tl->next, "done <= next");
  for (unsigned k = 0; k < SA_TIMELINE_EVENTS; k++) {
    uint64_t t = tl->ticket[k];
    if (t == 0) continue; /* no record marks a ticket there */
    SA_CHECK(TIMELINE, t <= tl->next, "every slot's ticket <= next");
    for (unsigned j = 0; j < k; j++)
      SA_CHECK(TIMELINE, tl->ticket[j] != t, "slots hold distinct tickets");
    SA_CHECK(TIMELINE, t % SA_TIMELINE_EVENTS == k, "ticket t is in slot t % SA_TIMELINE_EVENTS");
    SA_CHECK(TIMELINE, tl->ev[k] != NULL, "a slot with a ticket has an event");
  }
}

/* sa__timeline_mark's work: the next ticket, and its slot's event
 * recorded for it. */
static sa_status mark(sa_arena *a, sa_stream_arena *sarena, uint64_t *ticket) {
  sa_timeline *tl = &sarena->timeline;
  uint64_t t = tl->next + 1;
  unsigned k = (unsigned)(t % SA_TIMELINE_EVENTS);
  bool fresh = tl->ev[k] == NULL;
  if (fresh) {
    sa_status st = sa__event_get(a, &tl->ev[k]);
    if (st != SA_OK) return st;
  }
  bool in_flight = tl->ticket[k] > tl->done;
  sa_status st = a->drv->ops->event_record(a->drv, tl->ev[k], sarena->stream);
  if (st == SA_ERR_STREAM_CAPTURING) {
    /* Refused before the driver saw it: the slot still marks its ticket. */
    if (fresh) {
      sa__event_put(a, tl->ev[k]);
      tl->ev[k] = NULL;
    }
    return st;
  }
  if (st != SA_OK) {
    /* What the event marks now is unknown: nothing maps to it any more
     * (older tickets map to a later slot). */
    if (in_flight) atomic_fetch_sub_explicit(&a->events.xin_flight, 1, memory_order_relaxed);
    tl->ticket[k] = 0;
    return st;
  }
  if (!in_flight) atomic_fetch_add_explicit(&a->events.xin_flight, 1, memory_order_relaxed);
  tl->ticket[k] = t;
  tl->next = t;
  *ticket = t;
  return SA_OK;
}

sa_status sa__timeline_mark(sa_arena *a, sa_stream_arena *sarena, uint64_t *ticket) {
  sa_status st = mark(a, sarena, ticket);
  SA_VALIDATE(sa__timeline_check(sarena));
  return st;
}

bool sa__timeline_known_done(const sa_stream_arena *sarena, uint64_t t) {
  return sarena->synced || t <= sarena->timeline.done;
}

sa_status sa__timeline_reached(sa_arena *a, sa_stream_arena *sarena, uint64_t t, sa_wait wait) {
  if (sa__timeline_known_done(sarena, t)) return SA_OK;
  sa_timeline *tl = &sarena->timeline;
  unsigned k = slot_for(tl, t);
  if (k == SA_TIMELINE_EVENTS) return SA_ERR_INTERNAL; /* a ticket never handed out */
  sa_status st = wait == SA_WAIT ? a->drv->ops->event_synchronize(a->drv, tl->ev[k])
                      : a->drv->ops->event_query(a->drv, tl->ev[k]);
  if (st == SA_OK) advance(a, tl, tl->ticket[k]);
  SA_VALIDATE(sa__timeline_check(sarena));
  return st;
}

sa_status sa__timeline_wait(sa_arena *a, sa_stream_arena *sarena, uint64_t t, sa_stream on) {
  sa_status st = sa__timeline_reached(a, sarena, t, SA_QUERY);
  if (st != SA_ERR_NOT_READY) return st;
  unsigned k = slot_for(&sarena->timeline, t);
  return a->drv->ops->stream_wait_event(a->drv, on, sarena->timeline.ev[k]);
}

void sa__timeline_release(sa_arena *a, sa_stream_arena *sarena) {
  sa_timeline *tl = &sarena->timeline;
  advance(a, tl, tl->next);
  for (unsigned k = 0; k < SA_TIMELINE_EVENTS; k++) {
    if (tl->ev[k] != NULL) sa__event_put(a, tl->ev[k]);
    tl->ev[k] = NULL;
    tl->ticket[k] = 0;
  }
  SA_VALIDATE(sa__timeline_check(sarena));
}
