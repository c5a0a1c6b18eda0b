/* Stream timelines: where a stream was when a span was freed on it, and
 * whether its work got that far.
 *
 * A free on stream S takes a ticket on S's timeline (1, 2, 3, ...) and
 * records an event there, or leaves the ticket pending (below). A free
 * range remembers (S, ticket) pairs, its marks (span.c): pairs are plain
 * values, so a range that is split keeps them on both pieces and ranges
 * that merge keep, per stream, the later ticket (a stream completes its
 * work in order). The events live here, in a ring of SA_TIMELINE_EVENTS
 * per stream, re-recorded in turn: a ticket older than the ring maps to
 * the oldest event still recorded, which marks a later point of the same
 * stream, so waiting on it or seeing it complete is conservative, never
 * early. No event is created per free and none is shared between ranges.
 *
 * Pending. A span's own stream reuses it at once (stream order), and in a
 * loop of pairs, or a training step that frees a temporary and allocates
 * the next one of its size, that is the next thing that happens: the
 * event, recorded for another stream or an unmap that never looks, is
 * about half of such a pair (See Note [Lazy free marks]). So a free on a
 * stream with no ticket pending records nothing, where span.c's
 * free_lazily finds its stream likely to take the span back next and
 * others to lose little meanwhile: its ticket is pending, carried by one
 * free span (the pending span, which merges and carves follow: mark.c,
 * span.c). The stream's next free records one event,
 * which covers both tickets, unless the span it frees merges into the
 * pending span (then that one span carries the later ticket): so at most
 * one span per stream waits for an event, and a burst of frees records
 * about one event per two. Its own stream may take the pending span at any
 * time; taken whole, its ticket is forgotten, never recorded. Nobody else
 * can use it: no event exists to query or wait on. Best fit and unmapping
 * pass it by and set xwanted, and the stream's next call that names it
 * records the event (thread_cache.c's entry lookup, a span's alloc or
 * free). A device sync that started after the free also completes it
 * (its generation: device_sync.c), which the out-of-memory path, sa_trim
 * and arena destroy do; sa_stream_release synchronizes the stream.
 *
 * A stream alone in taking spans (spans.ntakers is 1: no other stream
 * arena not gone ever took one) has no one to hand its free memory to:
 * every free of its own spans may leave its ticket pending, whatever its
 * size, and up to SA_LAZY_MARK_RUN earlier pending tickets stay on spans of
 * their own (pending_apart) before a free records the one
 * event that covers them all; a device sync also completes them, and the
 * stream may take them back at any time. A reshape, which must know their
 * work done before it unmaps, asks the stream whether it is idle in the
 * call that names it (sa__timeline_bring_up_to_date). RMM's random
 * allocations then record one event per run of frees, where each free
 * recorded one (docs/DEFRAG.md, "A stream alone"). A stream that starts
 * taking spans later finds such spans unmarked and wants them: the first
 * stream's next call records.
 *
 * Only a free's own stream takes tickets: a stream that sa_record_stream
 * named gets an event of its own per free (span.c, "Marks"), since the
 * ring's shortcut (an older ticket judged by a later event) holds only for
 * work of one stream, and a thread that knew a destroyed stream's handle
 * takes the next stream's tickets here.
 *
 * A released stream (sa_stream_release synchronized it) has completed
 * every ticket. Events are recorded only inside calls that name the stream
 * (its frees, its span allocations, a wanted record at its entry lookup);
 * queries and waits are safe on any stream's events, also after the
 * stream was destroyed.
 *
 * Every function runs with the arena lock held. Calls event_pool.c,
 * device_sync.h and the driver; called by the span files, stream_arena.c
 * (a wanted record, release, reap, destroy).
 */
#include "timeline.h"
#include "../arena.h"
#include "../base/base.h"
#include "../base/device_sync.h"
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
    SA_CHECK(TIMELINE, t != tl->pending, "no event marks the pending ticket");
  }
  SA_CHECK(TIMELINE, tl->pending_apart <= SA_LAZY_MARK_RUN,
           "at most SA_LAZY_MARK_RUN pending tickets left apart before a record");
  if (tl->pending != 0) {
    SA_CHECK(TIMELINE, tl->pending == tl->next, "the pending ticket is the last handed out");
    SA_CHECK(TIMELINE, tl->pending_span != NULL || tl->pending_apart > 0,
             "the pending ticket has its span, or earlier ones are pending too");
  } else {
    SA_CHECK(TIMELINE,
             tl->pending_span == NULL && tl->pending_gen == 0 && tl->pending_apart == 0,
             "without a pending ticket, no pending span");
    SA_CHECK(TIMELINE, !atomic_load_explicit(&tl->xwanted, memory_order_relaxed),
             "only a pending ticket is wanted");
  }
  if (tl->record_lost)
    SA_CHECK(TIMELINE, tl->lost_next <= tl->next, "a lost record's tickets were handed out");
  else
    SA_CHECK(TIMELINE, tl->lost_next == 0 && tl->lost_gen == 0,
             "without a lost record, no lost tickets");
}

/* No ticket waits for a record because one failed: a record since covers
 * them, or a device sync completed them. */
static void records_found(sa_timeline *tl) {
  tl->record_lost = false;
  tl->lost_next = 0;
  tl->lost_gen = 0;
}

/* Forget the pending mark: recorded, known done, or carried by no span. */
static void forget_pending(sa_timeline *tl) {
  tl->pending = 0;
  tl->pending_gen = 0;
  tl->pending_span = NULL;
  tl->pending_apart = 0;
  atomic_store_explicit(&tl->xwanted, false, memory_order_relaxed);
}

/* Record slot t's event for ticket t: the next ticket (a free's), or the
 * pending one (a wanted record). An event recorded now covers the pending
 * ticket, which is next or earlier: none is pending after it succeeded. On
 * failure nothing that waits on the timeline changed. */
static sa_status record_at(sa_arena *a, sa_stream_arena *sarena, uint64_t t) {
  sa_timeline *tl = &sarena->timeline;
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
     * (older tickets map to a later slot, or wait for the next record). */
    if (in_flight) atomic_fetch_sub_explicit(&a->events.xin_flight, 1, memory_order_relaxed);
    tl->ticket[k] = 0;
    if (in_flight) {
      /* Every ticket it could strand was handed out by now: a device sync
       * that starts later completes them (device_sync.h). */
      tl->record_lost = true;
      tl->lost_next = tl->next;
      tl->lost_gen = sa__sync_gen(&a->sync);
    }
    return st;
  }
  if (!in_flight) atomic_fetch_add_explicit(&a->events.xin_flight, 1, memory_order_relaxed);
  tl->ticket[k] = t;
  SA_ASSERT(t >= tl->next); /* a new ticket or the pending one, the latest */
  records_found(tl); /* its event covers every earlier ticket */
  if (t > tl->next) tl->next = t;
  forget_pending(tl);
  return SA_OK;
}

sa_status sa__timeline_mark(sa_arena *a, sa_stream_arena *sarena, uint64_t *ticket) {
  uint64_t t = sarena->timeline.next + 1;
  sa_status st = record_at(a, sarena, t);
  if (st == SA_OK) *ticket = t;
  SA_VALIDATE(sa__timeline_check(sarena));
  return st;
}

sa_status sa__timeline_mark_lazily(sa_arena *a, sa_stream_arena *sarena, struct sa_span_s *sp,
                                   bool more, uint64_t *ticket) {
  sa_status st = a->drv->ops->stream_capture_check(a->drv, sarena->stream);
  if (st != SA_OK) return st;
  sa_timeline *tl = &sarena->timeline;
  SA_ASSERT(tl->pending == 0 || more || tl->pending_span == sp->prev ||
            tl->pending_span == sp->next);
  if (more && tl->pending != 0) tl->pending_apart++;
  tl->pending = ++tl->next;
  /* Read after the free's work was enqueued (the caller's): a device sync
   * that starts later completes it (device_sync.c). */
  tl->pending_gen = sa__sync_gen(&a->sync);
  tl->pending_span = sp;
  *ticket = tl->next;
  return SA_OK;
}

bool sa__timeline_known_done(const sa_stream_arena *sarena, uint64_t t) {
  const sa_timeline *tl = &sarena->timeline;
  sa_sync *sync = &sarena->arena->sync;
  if (sarena->synced || t <= tl->done) return true;
  /* Every ticket is at most the pending one, whose free came before a
   * device sync that started after its generation. */
  if (tl->pending != 0 && sa__clean_since(sync, tl->pending_gen)) return true;
  /* One a failed record left without an event was handed out before it. */
  return tl->record_lost && t <= tl->lost_next && sa__clean_since(sync, tl->lost_gen);
}

bool sa__timeline_has_event(const sa_stream_arena *sarena, uint64_t t) {
  /* Any slot at or past t will do: slot_for's search for the nearest is
   * not needed to know that one exists. */
  for (unsigned k = 0; k < SA_TIMELINE_EVENTS; k++)
    if (sarena->timeline.ticket[k] >= t) return true;
  return false;
}

bool sa__timeline_covers(const sa_stream_arena *sarena, uint64_t t) {
  const sa_timeline *tl = &sarena->timeline;
  return sa__timeline_known_done(sarena, t) || sa__timeline_has_event(sarena, t) ||
         (tl->pending != 0 && t <= tl->pending) || tl->record_lost;
}

void sa__timeline_settle(sa_arena *a, sa_stream_arena *sarena) {
  sa_timeline *tl = &sarena->timeline;
  if (tl->record_lost && sa__timeline_known_done(sarena, tl->lost_next)) {
    advance(a, tl, tl->lost_next);
    records_found(tl);
  }
  if (tl->pending == 0 || !sa__timeline_known_done(sarena, tl->pending)) return;
  advance(a, tl, tl->pending);
  forget_pending(tl);
}

void sa__timeline_pending_moved(sa_stream_arena *sarena, struct sa_span_s *to) {
  sa_timeline *tl = &sarena->timeline;
  SA_ASSERT(tl->pending != 0);
  if (to != NULL)
    tl->pending_span = to;
  else if (tl->pending_apart > 0)
    tl->pending_span = NULL; /* a record at its ticket covers the earlier ones */
  else
    forget_pending(tl); /* its ticket is never recorded: no mark names it */
}

void sa__timeline_want(sa_stream_arena *sarena) {
  sa_timeline *tl = &sarena->timeline;
  tl->retaking = false;
  if (tl->pending != 0) atomic_store_explicit(&tl->xwanted, true, memory_order_relaxed);
}

void sa__timeline_retaken(sa_stream_arena *sarena, uint64_t t) {
  if (t == sarena->timeline.next) sarena->timeline.retaking = true;
}

sa_status sa__timeline_record_pending(sa_arena *a, sa_stream_arena *sarena) {
  sa_timeline *tl = &sarena->timeline;
  sa_status st = tl->pending != 0 ? record_at(a, sarena, tl->pending) : SA_OK;
  SA_VALIDATE(sa__timeline_check(sarena));
  return st;
}

void sa__timeline_bring_up_to_date(sa_arena *a, sa_stream_arena *sarena) {
  sa_timeline *tl = &sarena->timeline;
  if (sarena->synced || tl->done == tl->next) return; /* every ticket completed */
  if (a->drv->ops->stream_query(a->drv, sarena->stream) == SA_OK) {
    advance(a, tl, tl->next);
    forget_pending(tl);
  } else {
    (void)sa__timeline_record_pending(a, sarena);
  }
  SA_VALIDATE(sa__timeline_check(sarena));
}

sa_status sa__timeline_record_wanted(sa_arena *a, sa_stream_arena *sarena) {
  if (!atomic_load_explicit(&sarena->timeline.xwanted, memory_order_relaxed)) return SA_OK;
  sa__timeline_settle(a, sarena); /* a device sync may have made it needless */
  return sa__timeline_record_pending(a, sarena);
}

sa_status sa__timeline_reached(sa_arena *a, sa_stream_arena *sarena, uint64_t t, sa_wait wait) {
  sa__timeline_settle(a, sarena);
  if (sa__timeline_known_done(sarena, t)) return SA_OK;
  sa_timeline *tl = &sarena->timeline;
  unsigned k = slot_for(tl, t);
  if (k == SA_TIMELINE_EVENTS) {
    if (t > tl->next) return SA_ERR_INTERNAL; /* a ticket never handed out */
    /* No event to query or wait on yet (the pending ticket, or one whose
     * slot a failed record cleared): the stream's next record covers it,
     * or a device sync that starts now (sa__timeline_settle). */
    sa__timeline_want(sarena);
    return SA_ERR_NOT_READY;
  }
  sa_status st = wait == SA_WAIT ? a->drv->ops->event_synchronize(a->drv, tl->ev[k])
                      : a->drv->ops->event_query(a->drv, tl->ev[k]);
  if (st == SA_OK) advance(a, tl, tl->ticket[k]);
  SA_VALIDATE(sa__timeline_check(sarena));
  return st;
}

sa_status sa__timeline_reached_recorded(sa_arena *a, sa_stream_arena *sarena) {
  const sa_timeline *tl = &sarena->timeline;
  uint64_t latest = 0;
  for (unsigned k = 0; k < SA_TIMELINE_EVENTS; k++)
    if (tl->ticket[k] > latest) latest = tl->ticket[k];
  return latest != 0 ? sa__timeline_reached(a, sarena, latest, SA_QUERY) : SA_OK;
}

sa_status sa__timeline_wait(sa_arena *a, sa_stream_arena *sarena, uint64_t t, sa_stream on) {
  sa_status st = sa__timeline_reached(a, sarena, t, SA_QUERY);
  if (st != SA_ERR_NOT_READY) return st;
  unsigned k = slot_for(&sarena->timeline, t);
  if (k == SA_TIMELINE_EVENTS) return SA_ERR_INTERNAL; /* best fit passes such a span by */
  return a->drv->ops->stream_wait_event(a->drv, on, sarena->timeline.ev[k]);
}

void sa__timeline_release(sa_arena *a, sa_stream_arena *sarena) {
  sa_timeline *tl = &sarena->timeline;
  advance(a, tl, tl->next);
  records_found(tl);
  for (unsigned k = 0; k < SA_TIMELINE_EVENTS; k++) {
    if (tl->ev[k] != NULL) sa__event_put(a, tl->ev[k]);
    tl->ev[k] = NULL;
    tl->ticket[k] = 0;
  }
  forget_pending(tl);
  SA_VALIDATE(sa__timeline_check(sarena));
}
