/* Stream timelines (timeline.c): tickets a stream's span frees take, and
 * a ring of events recorded at them, which free spans' marks wait for.
 * Calls event_pool.c and the driver; called by the span files and, at a
 * stream's release and the arena's destroy, by stream_arena.c. All with the
 * arena lock held. */
#ifndef SA_LARGE_TIMELINE_H
#define SA_LARGE_TIMELINE_H

#include "../base/base.h"
#include "../driver/driver.h"

typedef struct sa_stream_arena_s sa_stream_arena; /* small/stream_arena.h */

/* A stream's timeline, in its stream arena (arena lock). */
#define SA_TIMELINE_EVENTS 8
typedef struct sa_timeline_s {
  sa_event ev[SA_TIMELINE_EVENTS];
  uint64_t ticket[SA_TIMELINE_EVENTS]; /* the ticket its last record marks; 0: none */
  uint64_t next;                       /* the last ticket handed out */
  uint64_t done;                       /* tickets up to this one completed */
} sa_timeline;

/* Record an event on sarena's stream for a free; *ticket names the point. */
sa_status sa__timeline_mark(sa_arena *a, sa_stream_arena *sarena, uint64_t *ticket);
/* Completed, as far as the host knows without a driver call? */
bool sa__timeline_known_done(const sa_stream_arena *sarena, uint64_t ticket);
/* SA_OK once sarena's work up to ticket completed (SA_WAIT: after waiting),
 * SA_ERR_NOT_READY if not yet, or a driver error. */
sa_status sa__timeline_reached(sa_arena *a, sa_stream_arena *sarena, uint64_t ticket, sa_wait wait);
/* Make stream `on` wait on the device for sarena's work up to ticket. */
sa_status sa__timeline_wait(sa_arena *a, sa_stream_arena *sarena, uint64_t ticket, sa_stream on);
/* sarena's work is all done (released, or the arena is going), or nothing
 * waits on it any more (no free span marks it): events back. */
void sa__timeline_release(sa_arena *a, sa_stream_arena *sarena);
/* Validator: done <= next, every slot's ticket <= next and in its slot,
 * slots' tickets distinct, each with an event. */
void sa__timeline_check(const sa_stream_arena *sarena);

#endif /* SA_LARGE_TIMELINE_H */
