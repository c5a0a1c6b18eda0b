/* Stream timelines (timeline.c): tickets a stream's span frees take, and
 * a ring of events recorded at them, which free spans' marks wait for;
 * at most one ticket at a time taken without an event (the pending one).
 * Calls event_pool.c, device_sync.h and the driver; called by the span
 * files, by thread_cache.c (a wanted record, in a call naming the stream)
 * and, at a stream's release, reap and the arena's destroy, by
 * stream_arena.c. All with the arena lock held. */
#ifndef SA_LARGE_TIMELINE_H
#define SA_LARGE_TIMELINE_H

#include "../base/base.h"
#include "../driver/driver.h"

typedef struct sa_stream_arena_s sa_stream_arena; /* small/stream_arena.h */

/* A stream's timeline, in its stream arena (arena lock, but xwanted). */
#define SA_TIMELINE_EVENTS 8
/* Pending tickets a stream alone in its arena may leave on spans of their
 * own before a free records ("Pending", timeline.c). */
#define SA_LAZY_MARK_RUN 8
typedef struct sa_timeline_s {
  sa_event ev[SA_TIMELINE_EVENTS];
  uint64_t ticket[SA_TIMELINE_EVENTS]; /* the ticket its last record marks; 0: none */
  uint64_t next;                       /* the last ticket handed out */
  uint64_t done;                       /* tickets up to this one completed */
  /* The pending mark (timeline.c, "Pending"): a free's ticket that no
   * event marks yet, on one free span. */
  uint64_t pending;                    /* 0, or next: taken without a record */
  uint64_t pending_gen;                /* the device-sync generation at that free */
  struct sa_span_s *pending_span;      /* the free span that carries it, or NULL (taken
                                          while earlier ones are pending too) */
  unsigned pending_apart;              /* earlier pending tickets left on spans of
                                          their own since the last record (at most
                                          SA_LAZY_MARK_RUN; "Pending": a stream
                                          alone in taking spans) */
  _Atomic bool xwanted;                /* someone waits for an event at pending: the
                                          stream's next named call records it (read
                                          without the lock by thread_cache.c) */
  bool took_spans;                     /* the stream took a span (counted in
                                          spans.ntakers while not gone) */
  bool record_lost;                    /* a failed record cleared a slot in flight: the
                                          tickets it marked wait for the next record,
                                          or a device sync started after the failure */
  uint64_t lost_next, lost_gen;        /* next and the device-sync generation at the
                                          failure, while record_lost (else 0) */
  bool retaking;                       /* the stream took its latest free's span again,
                                          and nobody wanted a pending one since: its
                                          frees may leave their mark pending */
} sa_timeline;

/* Record an event on sarena's stream for a free; *ticket names the point.
 * It covers the pending ticket too: none is pending after it succeeded. */
sa_status sa__timeline_mark(sa_arena *a, sa_stream_arena *sarena, uint64_t *ticket);
/* A free's ticket with no event recorded, for sp (just freed, before it
 * merges with its neighbours): the pending one from now on. The caller
 * made sure that none is pending, or that sp merges into the pending span,
 * or (more) that the earlier pending tickets may stay on spans of their
 * own until a record covers them all.
 * SA_ERR_STREAM_CAPTURING if the stream is being captured (nothing
 * changed): memory freed in a capture could be handed out again before
 * the graph runs, so the free is refused as one that records is. */
sa_status sa__timeline_mark_lazily(sa_arena *a, sa_stream_arena *sarena, struct sa_span_s *sp,
                                   bool more, uint64_t *ticket);
/* Completed, as far as the host knows without a driver call? */
bool sa__timeline_known_done(const sa_stream_arena *sarena, uint64_t ticket);
/* Does an event mark ticket (or a later point), which a query or a wait
 * can use? Not the pending ticket's. */
bool sa__timeline_has_event(const sa_stream_arena *sarena, uint64_t ticket);
/* Validator's question: will ticket's work become known complete with no
 * later free: done, an event at or after it, the pending ticket (its record
 * or a device sync), or after a failed record (the stream's next one, or a
 * device sync)? */
bool sa__timeline_covers(const sa_stream_arena *sarena, uint64_t ticket);
/* SA_OK once sarena's work up to ticket completed (SA_WAIT: after waiting),
 * SA_ERR_NOT_READY if not yet (the pending ticket: until an event marks it
 * or a device sync, whatever wait asks; the stream is asked to record), or
 * a driver error. */
sa_status sa__timeline_reached(sa_arena *a, sa_stream_arena *sarena, uint64_t ticket, sa_wait wait);
/* SA_OK once all of sarena's work that any event marks completed, as one
 * query of its latest event says; SA_ERR_NOT_READY if not, or a driver
 * error. The pending ticket is not covered. */
sa_status sa__timeline_reached_recorded(sa_arena *a, sa_stream_arena *sarena);
/* Make stream `on` wait on the device for sarena's work up to ticket,
 * which an event marks (never the pending ticket: no wait can name it). */
sa_status sa__timeline_wait(sa_arena *a, sa_stream_arena *sarena, uint64_t ticket, sa_stream on);
/* Someone cannot use the pending span until an event marks its ticket:
 * sarena's stream records one at its next named call, and its frees record
 * theirs at once until it is seen retaking them. */
void sa__timeline_want(sa_stream_arena *sarena);
/* sarena's stream takes a span that carries a mark of ticket on its own
 * timeline: if it is its latest free's, it is seen retaking its frees. */
void sa__timeline_retaken(sa_stream_arena *sarena, uint64_t ticket);
/* In a call that names sarena's stream: record the event for the pending
 * ticket, if any. SA_OK if none was pending or it was recorded; else the
 * driver's status, and nothing changed. */
sa_status sa__timeline_record_pending(sa_arena *a, sa_stream_arena *sarena);
/* In a call that names sarena's stream, before a reshape unmaps free span
 * memory: a stream that has completed all its work (one query) has
 * completed every ticket, the pending ones too; else the pending ticket's
 * event is recorded, as sa__timeline_record_pending. Nothing changes on a
 * driver failure. */
void sa__timeline_bring_up_to_date(sa_arena *a, sa_stream_arena *sarena);
/* In a call that names sarena's stream: if someone wants it, record the
 * event for the pending ticket. SA_OK if none was wanted or it was
 * recorded; else the driver's status, and nothing changed. */
sa_status sa__timeline_record_wanted(sa_arena *a, sa_stream_arena *sarena);
/* What a device sync completed counts as done: the pending mark (a sync
 * after its free), none pending any more; the tickets a failed record left
 * without an event (a sync after the failure). */
void sa__timeline_settle(sa_arena *a, sa_stream_arena *sarena);
/* The pending span's descriptor changed (a merge, a carve): to carries
 * the pending mark now, or NULL: no free span does (taken whole by the
 * stream), and the ticket is forgotten, never to be recorded, unless
 * earlier pending tickets may be on other spans (pending_apart): then a
 * record at it still covers them. */
void sa__timeline_pending_moved(sa_stream_arena *sarena, struct sa_span_s *to);
/* sarena's work is all done (released, or the arena is going), or nothing
 * waits on it any more (no free span marks it): events back. */
void sa__timeline_release(sa_arena *a, sa_stream_arena *sarena);
/* Validator: done <= next, every slot's ticket <= next and in its slot,
 * slots' tickets distinct, each with an event; the pending ticket, if any,
 * is next, has no event and a span (mark.c checks the span). */
void sa__timeline_check(const sa_stream_arena *sarena);

#endif /* SA_LARGE_TIMELINE_H */
