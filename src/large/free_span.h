/* Free spans (free_span.c): span descriptors, the placement policy, best
 * fit, carving a request out of a free span, and coalescing a freed span
 * with its free neighbours.
 *
 * Calls mark.c and span_index.c; called by span.c and run.c, all with the
 * arena lock held. */
#ifndef SA_LARGE_FREE_SPAN_H
#define SA_LARGE_FREE_SPAN_H

#include "../base/base.h"
#include "span.h"

/* What a request takes: need bytes, and whether at a granule boundary. */
typedef struct sa_want_s {
  size_t need;
  size_t align; /* 0 (packed), or a power of two it starts at a multiple of */
  bool exact; /* map no more than need (growth maps ahead on a climb) */
} sa_want;

static inline bool sa__span_is_free(const sa_span *sp) {
  return atomic_load_explicit(&sp->xstate, memory_order_relaxed) == SA_BLOCK_FREE;
}

sa_span *sa__span_new(sa_arena *a);
void sa__span_put(sa_arena *a, sa_span *sp);
/* sp joins its run's span list after `after` (NULL: first). */
void sa__span_link_after(sa_run *r, sa_span *after, sa_span *sp);
void sa__free_insert(sa_arena *a, sa_span *sp);
void sa__free_remove(sa_arena *a, sa_span *sp);
/* sp (free, out of the index) merges with its free neighbours; returns the
 * merged span, out of the index. With usable_for, only with those that
 * usable_for's stream can use (a growth for it must not take on another
 * stream's pending mark: sa__marks_waitable_for); NULL: with all. */
sa_span *sa__free_coalesce(sa_arena *a, sa_span *sp, const sa_stream_arena *usable_for);
/* Merge the free neighbours that a pending mark kept apart and that may
 * join now (its event recorded, or a device sync completed it): before an
 * unmap, which takes only whole chunks of one free span. Walks the runs
 * only while some were kept apart (spans.apart). */
void sa__free_rejoin(sa_arena *a);
/* The placement policy. Packed at SA_SPAN_QUANTUM, except with a budget
 * configured: then a span that loses at most 1/32 of itself to rounding up
 * to whole granules (all of 64 MiB and more, and those just below a
 * multiple of the granularity) takes whole granules at a granule boundary,
 * so that freeing it frees whole granules a budget can unmap and stitch
 * elsewhere. Rounding a 1.1 MiB request to 2 MiB would waste 45%: small
 * spans stay packed. */
sa_want sa__free_placement(const sa_arena *a, size_t size);
/* Where w would start in the free span sp: its lowest address, or lowest
 * granule boundary (address-ordered best fit: the rest stays above, and at
 * a run's top end, where growth extends it). 0 if it does not fit. */
uintptr_t sa__free_place(const sa_arena *a, const sa_span *sp, sa_want w);
/* The best fit for w: the smallest free span it fits in, the lowest
 * address first; among spans of that size, one sarena's stream can use without
 * waiting if one of the first few is. Never one that sarena's stream cannot
 * use even after waiting (another stream's pending mark: that stream is
 * asked to record its event). */
sa_span *sa__free_best_fit(const sa_arena *a, sa_want w, const sa_stream_arena *sarena);
/* taken (out of the index, just above sp in its run: carved for a live
 * span that grows, its marks settled, or a superblock's span given back
 * beside another) becomes the top of sp, which grows by its size; its
 * marks and starts go with its descriptor. */
void sa__span_grow_into(sa_arena *a, sa_span *sp, sa_span *taken);
/* Take w from the free span sp (out of the index, settled for the taker,
 * w fits) as the span returned; what lies before and after it stays free,
 * with sp's marks. Without memory for a descriptor more is taken. */
sa_span *sa__free_carve(sa_arena *a, sa_span *sp, sa_want w);

#endif /* SA_LARGE_FREE_SPAN_H */
