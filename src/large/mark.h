/* Marks and starts (mark.c): what a free span waits for before another
 * stream may reuse it, and where the spans freed into it began.
 *
 * A free span's marks name the streams whose work may still touch it (the
 * two kinds: span.h). Splitting a span copies them to both pieces, merging
 * joins them (per stream, the later ticket); none is dropped before its
 * work is known done or the span is handed to a stream that orders it. Its
 * starts tell a double free from a free of an interior address.
 *
 * Calls timeline.c and event_pool.c; called by the other span files, all
 * with the arena lock held. */
#ifndef SA_LARGE_MARK_H
#define SA_LARGE_MARK_H

#include "../base/base.h"
#include "span.h"

/* A recorded mark's event, shared by the marks that name it. */
sa_status sa__mark_event_record(sa_arena *a, sa_stream s, sa_mark_event **out);
/* Is m's work known complete, without a driver call? */
bool sa__mark_known_done(const sa_mark *m);
/* Room for n marks on sp (the array stays with the descriptor); false
 * without memory. */
bool sa__marks_reserve(sa_span *sp, unsigned n);
/* sp waits for m too, which it takes over (room reserved). A free's mark:
 * one per stream arena, the later ticket covering the earlier. A recorded
 * mark: one per event (two of one stream arena may be of two streams that
 * shared a handle). */
void sa__marks_add(sa_arena *a, sa_span *sp, sa_mark m);
/* dst gets copies of src's marks (room reserved), as a split does. */
void sa__marks_copy(sa_span *dst, const sa_span *src);
/* sp waits for nothing any more (its marks are dropped). */
void sa__marks_clear(sa_arena *a, sa_span *sp);
/* Drop the marks the host knows completed (a pending one: its timeline
 * forgets it); no driver call. */
void sa__marks_prune_known(sa_arena *a, sa_span *sp);
/* dst also waits for what src waited for: src's marks move to dst, and
 * so does a pending span (src merges into dst). False (both unchanged)
 * without memory for them. */
bool sa__marks_join(sa_arena *a, sa_span *dst, sa_span *src);
/* Drop the marks whose work completed (SA_WAIT: after waiting); true
 * when none is left. */
bool sa__marks_reached(sa_arena *a, sa_span *sp, sa_wait wait);
/* Can sarena's stream use sp without waiting, as far as the host knows? */
bool sa__marks_clean_for(const sa_span *sp, const sa_stream_arena *sarena);
/* Can sarena's stream use sp after waiting (sa__marks_settle)? Not while
 * another stream's pending mark is on it: no event exists to wait on. */
bool sa__marks_waitable_for(const sa_span *sp, const sa_stream_arena *sarena);
/* Would a span that freer frees now, its mark left pending, join pending,
 * freer's pending span, or stay apart from it (sa__marks_pending_apart:
 * pending carries another stream's mark and another stream takes spans)? */
bool sa__marks_join_pending(const sa_arena *a, const sa_span *pending,
                            const sa_stream_arena *freer);
/* Ask the streams of sp's pending marks to record their events (at their
 * next named call): someone could not use sp. */
void sa__marks_want(const sa_span *sp);
/* sp is being handed to sarena's stream: a mark of its own latest free on
 * it says the stream retakes what it frees (sa__timeline_retaken). */
void sa__marks_taken_by(const sa_span *sp, sa_stream_arena *sarena);
/* Does sp carry sarena's pending mark? */
bool sa__marks_carry_pending(const sa_span *sp, const sa_stream_arena *sarena);
/* Must free neighbours x and y stay apart? Where one carries a stream's
 * pending mark and the other a mark of any other stream: merged, the
 * other stream's memory would wait for an event only the pending stream's
 * next call records (Note [Lazy free marks]). Never while a single stream
 * takes spans: no other waits for that memory. */
bool sa__marks_pending_apart(const sa_arena *a, const sa_span *x, const sa_span *y);
/* Make sp safe for sarena's stream: completion seen by a query or a device-side
 * wait for every mark sarena's stream does not order by itself. The marks stay
 * on sp (the caller drops them from the piece it hands out once this
 * succeeded): after a failed wait, every one of them still guards sp. */
sa_status sa__marks_settle(sa_arena *a, sa_span *sp, sa_stream_arena *sarena);
/* Starts: where spans freed into a free span began, the latest few first,
 * so that freeing one again is told apart from freeing an interior address
 * (a double free older than them is reported as an invalid pointer;
 * nothing changes either way). */
void sa__starts_add(sa_span *sp, uintptr_t p); /* p freed into sp just now */
/* Which of two spans being joined was freed last: its starts come first. */
typedef enum sa_newer_e { SA_DST_NEWER = 0, SA_SRC_NEWER = 1 } sa_newer;
/* dst also holds src's starts, the newer span's first. */
void sa__starts_join(sa_span *dst, const sa_span *src, sa_newer newer);
/* Keep only the starts inside dst; copied from src (src == dst: filter). */
void sa__starts_within(sa_span *dst, const sa_span *src);
bool sa__starts_has(const sa_span *sp, uintptr_t p); /* a span freed into sp began at p? */
/* Validator of a free span's marks (span.c's calls it): a free's names a
 * ticket its timeline handed out, a recorded one an event some mark still
 * counts, and a pending one lies on its stream's pending span only. */
void sa__marks_check(const sa_span *sp);
/* Validator of sarena's pending span, if any: a free span in the fit
 * index that carries the pending mark. */
void sa__marks_pending_check(const sa_arena *a, const sa_stream_arena *sarena);

#endif /* SA_LARGE_MARK_H */
