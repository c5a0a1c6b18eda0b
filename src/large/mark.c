/* Marks and starts: what a free span waits for before another stream may
 * reuse it, and where the spans freed into it began (mark.h).
 *
 * A free's mark is a (stream arena, ticket) pair on a timeline
 * (timeline.c): plain values, copied when a span splits, the later ticket
 * kept per stream when spans merge. A pending mark (no event yet) is on
 * one span only, its stream's pending span: a merge moves the timeline's
 * pointer to the span that stays (sa__marks_join); a carve, where only the
 * stream itself takes such a span, hands it to the piece left (span.c). A
 * recorded mark holds an event of its own, recorded on a stream
 * sa_record_stream named, shared by the pieces of a split span and
 * counted. A mark is dropped once its work is known done
 * (a query or a synchronize saw it), or from the piece handed to a stream
 * after that stream was made to wait for it.
 */
#include <stdlib.h>

#include "mark.h"
#include "../arena.h"
#include "../base/base.h"
#include "../base/event_pool.h"
#include "../driver/driver.h"
#include "free_span.h"
#include "span.h"
#include "span_index.h"
#include "timeline.h"

/* ------------------------------------------------------------------------
 * Marks: the streams whose work may still touch a free span
 * ---------------------------------------------------------------------- */

sa_status sa__mark_event_record(sa_arena *a, sa_stream s, sa_mark_event **out) {
  sa_mark_event *me = malloc(sizeof *me);
  if (me == NULL) return SA_ERR_OUT_OF_MEMORY;
  sa_status st = sa__event_record_new(a, s, &me->event);
  if (st != SA_OK) {
    free(me);
    return st;
  }
  me->refs = 1;
  me->done = false;
  *out = me;
  return SA_OK;
}

/* The last mark naming it went: the event goes back to the pool, complete or
 * not (waits enqueued on it keep their target). */
static void mark_event_unref(sa_arena *a, sa_mark_event *me) {
  SA_ASSERT(me->refs > 0);
  if (--me->refs > 0) return;
  sa__event_drop(a, me->event);
  free(me);
}

static void mark_drop(sa_arena *a, sa_mark m) {
  if (m.recorded != NULL) mark_event_unref(a, m.recorded);
}

bool sa__mark_known_done(const sa_mark *m) {
  return m->recorded != NULL ? m->recorded->done
                             : sa__timeline_known_done(m->stream, m->ticket);
}

/* Has m's work completed (SA_WAIT: after waiting for it)? SA_OK, or
 * SA_ERR_NOT_READY, or a driver error. */
static sa_status mark_reached(sa_arena *a, const sa_mark *m, sa_wait wait) {
  if (m->recorded == NULL) return sa__timeline_reached(a, m->stream, m->ticket, wait);
  if (m->recorded->done) return SA_OK;
  sa_status st = wait == SA_WAIT ? a->drv->ops->event_synchronize(a->drv, m->recorded->event)
                      : a->drv->ops->event_query(a->drv, m->recorded->event);
  if (st == SA_OK) m->recorded->done = true;
  return st;
}

/* Make stream `on` wait on the device for m's work, unless it completed. */
static sa_status mark_wait(sa_arena *a, const sa_mark *m, sa_stream on) {
  if (m->recorded == NULL) return sa__timeline_wait(a, m->stream, m->ticket, on);
  sa_status st = mark_reached(a, m, SA_QUERY);
  if (st != SA_ERR_NOT_READY) return st;
  return a->drv->ops->stream_wait_event(a->drv, on, m->recorded->event);
}

bool sa__marks_reserve(sa_span *sp, unsigned n) {
  if (n <= sp->marks_cap) return true;
  unsigned cap = sp->marks_cap ? sp->marks_cap : 2;
  while (cap < n) cap *= 2;
  sa_mark *m = realloc(sp->marks, cap * sizeof *m);
  if (m == NULL) return false;
  sp->marks = m;
  sp->marks_cap = cap;
  return true;
}

void sa__marks_add(sa_arena *a, sa_span *sp, sa_mark m) {
  for (unsigned i = 0; i < sp->nmarks; i++) {
    sa_mark *x = &sp->marks[i];
    if (m.recorded != NULL && x->recorded == m.recorded) {
      mark_event_unref(a, m.recorded);
      return;
    }
    if (m.recorded == NULL && x->recorded == NULL && x->stream == m.stream) {
      if (m.ticket > x->ticket) x->ticket = m.ticket;
      return;
    }
  }
  sp->marks[sp->nmarks++] = m;
}

void sa__marks_copy(sa_span *dst, const sa_span *src) {
  for (unsigned i = 0; i < src->nmarks; i++) {
    dst->marks[i] = src->marks[i];
    if (src->marks[i].recorded != NULL) src->marks[i].recorded->refs++;
  }
  dst->nmarks = src->nmarks;
}

void sa__marks_clear(sa_arena *a, sa_span *sp) {
  for (unsigned i = 0; i < sp->nmarks; i++) mark_drop(a, sp->marks[i]);
  sp->nmarks = 0;
}

void sa__marks_prune_known(sa_arena *a, sa_span *sp) {
  unsigned kept = 0;
  for (unsigned i = 0; i < sp->nmarks; i++) {
    sa_mark m = sp->marks[i];
    if (!sa__mark_known_done(&m)) {
      sp->marks[kept++] = m;
      continue;
    }
    /* A pending mark known done (a device sync) is no one's pending any
     * more: its span need not be followed. */
    if (m.stream != NULL) sa__timeline_settle(a, m.stream);
    mark_drop(a, m);
  }
  sp->nmarks = kept;
}

bool sa__marks_join(sa_arena *a, sa_span *dst, sa_span *src) {
  if (!sa__marks_reserve(dst, dst->nmarks + src->nmarks)) return false;
  for (unsigned i = 0; i < src->nmarks; i++) {
    sa_stream_arena *s = src->marks[i].stream;
    /* The pending span merges into dst: dst carries the pending mark now. */
    if (s != NULL && s->timeline.pending_span == src) sa__timeline_pending_moved(s, dst);
    sa__marks_add(a, dst, src->marks[i]);
  }
  src->nmarks = 0;
  return true;
}

bool sa__marks_carry_pending(const sa_span *sp, const sa_stream_arena *sarena) {
  uint64_t t = sarena->timeline.pending;
  for (unsigned i = 0; t != 0 && i < sp->nmarks; i++)
    if (sp->marks[i].stream == sarena && sp->marks[i].ticket == t) return true;
  return false;
}

/* Does no event mark m's work yet (a pending mark), and none completed it? */
static bool unmarked(const sa_mark *m) {
  return m->recorded == NULL && !sa__mark_known_done(m) &&
         !sa__timeline_has_event(m->stream, m->ticket);
}

/* The stream whose pending mark sp carries (its latest ticket or, with
 * pending_apart, an earlier one no event marks yet), or NULL. */
static const sa_stream_arena *pending_stream(const sa_span *sp) {
  for (unsigned i = 0; i < sp->nmarks; i++) {
    const sa_mark *m = &sp->marks[i];
    if (m->stream != NULL && m->ticket != 0 && unmarked(m))
      return m->stream;
  }
  return NULL;
}

/* Does sp carry a mark of a stream other than s (a recorded one counts)? */
static bool marked_by_other(const sa_span *sp, const sa_stream_arena *s) {
  for (unsigned i = 0; i < sp->nmarks; i++)
    if (sp->marks[i].recorded != NULL || sp->marks[i].stream != s) return true;
  return false;
}

/* The rule itself: a pending mark on one span, the other marked by another
 * stream. */
static bool pending_apart_by_marks(const sa_span *x, const sa_span *y) {
  const sa_stream_arena *px = pending_stream(x), *py = pending_stream(y);
  return (px != NULL && marked_by_other(y, px)) || (py != NULL && marked_by_other(x, py));
}

bool sa__marks_pending_apart(const sa_arena *a, const sa_span *x, const sa_span *y) {
  /* With one stream taking spans, no other waits for the memory merged. */
  if (a->spans.ntakers <= 1) return false;
  /* Nor where one of them has no mark, or both only one stream's free
   * marks (a recorded first mark names no stream, which marked_by_other
   * counts as another): a pending mark there is that stream's, and the
   * other span is not marked by another. The common case, without a look
   * at the timeline. */
  if (x->nmarks == 0 || y->nmarks == 0 ||
      (!marked_by_other(x, x->marks[0].stream) && !marked_by_other(y, x->marks[0].stream))) {
    SA_ASSERT(!pending_apart_by_marks(x, y));
    return false;
  }
  return pending_apart_by_marks(x, y);
}

bool sa__marks_join_pending(const sa_arena *a, const sa_span *pending,
                            const sa_stream_arena *freer) {
  /* The freed span would carry only freer's pending mark: the rule above
   * keeps it apart exactly where pending is marked by another. */
  return a->spans.ntakers <= 1 || !marked_by_other(pending, freer);
}

bool sa__marks_reached(sa_arena *a, sa_span *sp, sa_wait wait) {
  unsigned kept = 0;
  for (unsigned i = 0; i < sp->nmarks; i++) {
    sa_mark m = sp->marks[i];
    if (mark_reached(a, &m, wait) == SA_OK)
      mark_drop(a, m);
    else
      sp->marks[kept++] = m;
  }
  sp->nmarks = kept;
  return kept == 0;
}

/* Does sarena's stream order m's work by itself? Only a free's mark on sarena's own
 * timeline: a recorded mark's stream may have been destroyed and its
 * handle taken by sarena's stream (a thread that knew the handle binds it to
 * the old stream arena). */
static bool ordered_by(const sa_mark *m, const sa_stream_arena *sarena) {
  return m->recorded == NULL && m->stream == sarena;
}

void sa__marks_taken_by(const sa_span *sp, sa_stream_arena *sarena) {
  for (unsigned i = 0; i < sp->nmarks; i++)
    if (ordered_by(&sp->marks[i], sarena)) sa__timeline_retaken(sarena, sp->marks[i].ticket);
}

bool sa__marks_clean_for(const sa_span *sp, const sa_stream_arena *sarena) {
  for (unsigned i = 0; i < sp->nmarks; i++)
    if (!ordered_by(&sp->marks[i], sarena) && !sa__mark_known_done(&sp->marks[i])) return false;
  return true;
}

bool sa__marks_waitable_for(const sa_span *sp, const sa_stream_arena *sarena) {
  for (unsigned i = 0; i < sp->nmarks; i++)
    if (!ordered_by(&sp->marks[i], sarena) && unmarked(&sp->marks[i])) return false;
  return true;
}

void sa__marks_want(const sa_span *sp) {
  for (unsigned i = 0; i < sp->nmarks; i++)
    if (unmarked(&sp->marks[i])) sa__timeline_want(sp->marks[i].stream);
}

sa_status sa__marks_settle(sa_arena *a, sa_span *sp, sa_stream_arena *sarena) {
  for (unsigned i = 0; i < sp->nmarks; i++) {
    if (ordered_by(&sp->marks[i], sarena)) continue;
    sa_status st = mark_wait(a, &sp->marks[i], sarena->stream);
    if (st != SA_OK) return st;
  }
  return SA_OK;
}

/* ------------------------------------------------------------------------
 * Starts (mark.h says what they are for)
 * ---------------------------------------------------------------------- */

void sa__starts_add(sa_span *sp, uintptr_t p) {
  unsigned n = sp->nstarts < SA_SPAN_STARTS ? sp->nstarts + 1 : SA_SPAN_STARTS;
  for (unsigned i = n - 1; i > 0; i--) sp->starts[i] = sp->starts[i - 1];
  sp->starts[0] = p;
  sp->nstarts = n;
}

void sa__starts_join(sa_span *dst, const sa_span *src, sa_newer newer) {
  uintptr_t all[2 * SA_SPAN_STARTS];
  bool src_first = newer == SA_SRC_NEWER;
  const sa_span *first = src_first ? src : dst, *second = src_first ? dst : src;
  unsigned n = 0;
  for (unsigned i = 0; i < first->nstarts; i++) all[n++] = first->starts[i];
  for (unsigned i = 0; i < second->nstarts; i++) all[n++] = second->starts[i];
  dst->nstarts = n < SA_SPAN_STARTS ? n : SA_SPAN_STARTS;
  for (unsigned i = 0; i < dst->nstarts; i++) dst->starts[i] = all[i];
}

void sa__starts_within(sa_span *dst, const sa_span *src) {
  unsigned n = 0;
  for (unsigned i = 0; i < src->nstarts; i++)
    if (src->starts[i] - dst->base < dst->size) dst->starts[n++] = src->starts[i];
  dst->nstarts = n;
}

bool sa__starts_has(const sa_span *sp, uintptr_t p) {
  for (unsigned i = 0; i < sp->nstarts; i++)
    if (sp->starts[i] == p) return true;
  return false;
}


/* ------------------------------------------------------------------------
 * Invariants
 * ---------------------------------------------------------------------- */

static const char SPAN[] = "span";

void sa__marks_check(const sa_span *sp) {
  SA_CHECK(SPAN, sp->nmarks <= sp->marks_cap, "nmarks <= marks_cap");
  for (unsigned i = 0; i < sp->nmarks; i++) {
    const sa_mark *m = &sp->marks[i];
    if (m->recorded != NULL) {
      SA_CHECK(SPAN, m->recorded->refs > 0, "a recorded mark has refs > 0");
    } else {
      SA_CHECK(SPAN, m->stream != NULL && m->ticket > 0 && m->ticket <= m->stream->timeline.next,
               "a free's mark names a ticket its timeline handed out");
      const sa_timeline *tl = &m->stream->timeline;
      SA_CHECK(SPAN,
               m->ticket != tl->pending || tl->pending_span == sp || sa__mark_known_done(m),
               "a pending mark is on its stream's pending span only");
      /* Else nothing would ever let another stream, or an unmap, past it. */
      SA_CHECK(SPAN, sa__timeline_covers(m->stream, m->ticket),
               "a free's mark is known done, evented, pending or after a lost record");
    }
  }
}

void sa__marks_pending_check(const sa_arena *a, const sa_stream_arena *sarena) {
  const sa_span *sp = sarena->timeline.pending_span;
  if (sp == NULL) return;
  SA_CHECK(SPAN, sa__span_is_free(sp) && sa__fit_ceiling(a, sp->size, sp->base) == sp,
           "a pending span is a free span in the fit index");
  SA_CHECK(SPAN, sa__marks_carry_pending(sp, sarena), "a pending span carries the pending mark");
}
