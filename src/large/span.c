/* Large allocations: spans in runs of mapped memory.
 *
 * A run is a contiguous mapped range of the reserved space, tiled by spans
 * in address order. A span is live (one allocation above large_threshold)
 * or free. Freed spans stay mapped, so the common case makes no driver call
 * but one event record per free. Like a pool:
 *
 *   - A request takes the best fit among free spans (span_index.c: the
 *     smallest at least as large, O(log n)), at its lowest address; the
 *     rest stays free. A freed span merges with its free neighbours.
 *   - Spans are split at SA_SPAN_QUANTUM (256 bytes), not at granules: a
 *     request just above the 1 MiB threshold would lose up to half of a
 *     2 MiB granule, and traces' requests are rarely multiples of 2 MiB
 *     (See Note [Packed placement]).
 *     The mapped chunk is only the unit of unmapping (physical.c: by
 *     default a whole growth). The page map keeps one entry per granule,
 *     naming the run; a span is found by its exact start in the live map.
 *   - When no free span fits, the arena grows (plan_growth): it maps only
 *     what is missing at an end of a run, next to the free span there (as
 *     PyTorch's expandable segments do), or fills the gap between two runs,
 *     or starts a run in the middle of free reserved space. Upward on a tie:
 *     best fit places at the lowest address, so the free rest of a run
 *     that grew up stays at its top, where the next growth extends it
 *     (See Note [Growing upward]). One chunk and one access setting per
 *     growth, and on a climb to a new live peak a little memory mapped
 *     ahead (run.c's map_ahead).
 *   - Growth stops at the limit the caller passes (alloc.c: the footprint
 *     target, reserve_limit, max_physical, or what the driver could
 *     create). Past it, the reshape (run.c's reshape_bytes): free span
 *     memory whose work completed is unmapped elsewhere, the smallest free
 *     spans first, never the span the growth extends, and the growth maps
 *     those granules where the request needs them. Under the footprint
 *     target only within the remapping ledger (physical.c) and not for a
 *     request that sets a new live peak. Remapping happens only then,
 *     never on the common path, and is decided without a scan.
 *   - With a budget configured, spans that lose at most 1/32 to rounding
 *     take whole granules at granule boundaries (free_span.c's placement):
 *     freed, they free whole granules. Without this a freed span shares
 *     its end granules with live neighbours, and a tight budget runs out
 *     of memory. Without a budget packed placement keeps the footprint
 *     lower (See Note [Packed placement]).
 *
 * Stream order. A free span's marks (timeline.c) name the streams whose
 * work may still touch it. Its own stream reuses it at once; any other
 * stream only after each mark completed (a query) or behind a device-side
 * wait enqueued before the handout. The marks stay until the handout
 * succeeds: a wait that fails leaves all of them in place. Splitting copies
 * them to both pieces, merging joins them (per stream, the later ticket).
 * Nothing is unmapped before its marks completed: the driver's unmap does
 * not wait for queued work.
 *
 * The large tier's files, top to bottom: span.c (this file: allocation,
 * free, the superblocks carved in free spans, unmapping, destroy, the
 * validator), run.c (growth, joining, cutting), free_span.c (descriptors,
 * placement, best fit, carving, coalescing), mark.c (marks and starts),
 * span_index.c (the fit index and the live map), timeline.c.
 *
 * Every function runs with the arena lock held unless span.h says
 * otherwise. Called by alloc.c, free.c, reclaim.c, report.c, snapshot.c,
 * arena.c and superblock.c.
 */
#include <stdlib.h>
#include <string.h>

#include "span.h"
#include "../arena.h"
#include "../base/base.h"
#include "../base/event_pool.h"
#include "../driver/driver.h"
#include "../vm/physical.h"
#include "../vm/va_space.h"
#include "free_span.h"
#include "grower.h"
#include "mark.h"
#include "run.h"
#include "span_index.h"
#include "timeline.h"

sa_status sa__span_prefill(sa_arena *a, size_t size) {
  sa_want w = {sa__round_up(size, a->gran), 0, true};
  pthread_mutex_lock(&a->lock);
  sa_span *sp;
  sa_status st = sa__run_grow(a, w, a->physical.cap, SA_SPAN_RESHAPE, NULL, &sp);
  if (st == SA_OK) sa__free_insert(a, sp); /* free, no marks: nothing used it */
  SA_VALIDATE(sa__span_check(a));
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* ------------------------------------------------------------------------
 * Allocation and free
 * ---------------------------------------------------------------------- */

/* Would carving w out of sp leave free pieces on both sides of it? */
static bool carve_leaves_two(const sa_arena *a, const sa_span *sp, sa_want w) {
  uintptr_t at = sa__free_place(a, sp, w);
  return at > sp->base && at + w.need < sp->base + sp->size;
}

/* The pending span of sarena's stream was carved into taken: the free
 * piece beside it that kept the pending mark is the pending span now; with
 * none (taken whole), no span is. */
static void pending_follow_carve(sa_stream_arena *sarena, const sa_span *taken) {
  sa_span *rest = NULL;
  if (taken->prev != NULL && sa__span_is_free(taken->prev) &&
      sa__marks_carry_pending(taken->prev, sarena))
    rest = taken->prev;
  if (taken->next != NULL && sa__span_is_free(taken->next) &&
      sa__marks_carry_pending(taken->next, sarena)) {
    SA_ASSERT(rest == NULL); /* carve_leaves_two: recorded first */
    rest = taken->next;
  }
  sa__timeline_pending_moved(sarena, rest);
}

/* Make the free span *sp (out of the index) safe for sarena's stream and carve
 * w from it into *sp. Its marks of sarena's stream need nothing (stream
 * order), another stream's pending one cannot be waited on (best fit and
 * growth never offer such a span). If it is sarena's pending span, the
 * piece left free stays pending; two pieces would be two pending spans, so
 * then the event is recorded first (this call names sarena's stream). If a
 * wait or that record fails, *sp goes back to the index with every mark
 * still on it. */
static sa_status take_settled(sa_arena *a, sa_span **sp, sa_stream_arena *sarena, sa_want w) {
  sa__marks_taken_by(*sp, sarena);
  sa__marks_prune_known(a, *sp); /* a pending mark a device sync completed goes */
  sa_status st = SA_OK;
  if (!sa__marks_waitable_for(*sp, sarena)) {
    SA_ASSERT(!"a span with another stream's pending mark offered for taking");
    st = SA_ERR_INTERNAL;
  }
  bool pending = sarena->timeline.pending_span == *sp;
  if (st == SA_OK) st = sa__marks_settle(a, *sp, sarena);
  if (st == SA_OK && pending && carve_leaves_two(a, *sp, w)) {
    st = sa__timeline_record_pending(a, sarena);
    pending = false;
  }
  if (st != SA_OK) {
    sa__free_insert(a, *sp);
    return st;
  }
  *sp = sa__free_carve(a, *sp, w);
  if (pending) pending_follow_carve(sarena, *sp);
  return SA_OK;
}

sa_status sa__span_alloc(sa_arena *a, sa_stream_arena *sarena, size_t size, size_t limit,
                         sa_span_grow grow, bool exact, void **out) {
  if (size > a->range.size) return SA_ERR_OUT_OF_MEMORY;
  sa_want w = sa__free_placement(a, size);
  w.exact = exact;
  pthread_mutex_lock(&a->lock);
  sa__span_record_wanted(a, sarena);
  sa_status st = sa__live_reserve(a);
  sa_span *sp = NULL;
  if (st == SA_OK) {
    sp = sa__free_best_fit(a, w, sarena);
    /* A range mapped ahead in the background may be what fits: its job in
     * flight ends first (the lock is let go meanwhile). */
    if (sp == NULL && sa__grower_settle(a)) {
      st = sa__live_reserve(a);
      if (st == SA_OK) sp = sa__free_best_fit(a, w, sarena);
    }
  }
  if (st == SA_OK) {
    if (sp != NULL)
      sa__free_remove(a, sp);
    else
      st = sa__run_grow(a, w, limit, grow, sarena, &sp);
  }
  if (st == SA_OK) st = take_settled(a, &sp, sarena, w);
  if (st == SA_OK) {
    sp->owner = sarena;
    /* keeps sarena alive */
    if (atomic_fetch_add_explicit(&sarena->xspans, 1, memory_order_relaxed) == 0)
      a->spans.nholders++;
    if (!sarena->timeline.took_spans) {
      sarena->timeline.took_spans = true;
      /* One gone (its stream destroyed while a thread still named it) is
       * not counted: mark_gone, which stops the count, came first. */
      if (!sa__stream_arena_gone_locked(sarena)) a->spans.ntakers++;
    }
    sp->request = size;
    sp->pool_segment = false;
    atomic_store_explicit(&sp->xstate, SA_BLOCK_LIVE, memory_order_release);
    sa__live_insert(a, sp);
    a->spans.nlive++;
    *out = (void *)sp->base;
    sa__grower_consider(a, sp, size, exact); /* last: sa__grower_inline lets go of the lock */
  }
  SA_VALIDATE_PACED(&a->spans.pace, sa__span_check(a));
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* The free span just above live that sarena's stream may use, or NULL. */
static sa_span *free_above(sa_span *live, const sa_stream_arena *sarena) {
  sa_span *n = live->next;
  return n != NULL && sa__span_is_free(n) && sa__marks_waitable_for(n, sarena) ? n : NULL;
}

sa_status sa__span_extend(sa_arena *a, sa_stream_arena *sarena, uintptr_t p, size_t size,
                          size_t more, size_t limit, size_t *added) {
  *added = 0;
  sa_want w = {more, 0, true};
  pthread_mutex_lock(&a->lock);
  sa_span *sp = sa__live_find(a, p);
  sa_status st = SA_ERR_OUT_OF_MEMORY; /* not here: the caller grows elsewhere */
  if (sp == NULL || sp->size != size || sp->owner != sarena || sp->holder != NULL ||
      atomic_load_explicit(&sp->xstate, memory_order_relaxed) != SA_BLOCK_LIVE) {
    pthread_mutex_unlock(&a->lock);
    return st;
  }
  sa_span *got = free_above(sp, sarena);
  if (got != NULL && got->size >= more) {
    sa__free_remove(a, got);
    st = SA_OK;
  } else if (got == sp->run->last || sp->next == NULL) {
    /* Room above the run: a growth there joins the free span above. */
    st = sa__run_grow_above(a, sp->run, more, limit, sarena, &got);
    if (st == SA_OK && got->base != sp->base + sp->size) { /* its marks kept it apart */
      sa__free_insert(a, got);
      st = SA_ERR_OUT_OF_MEMORY;
    }
  }
  if (st == SA_OK) st = take_settled(a, &got, sarena, w);
  if (st == SA_OK) {
    SA_ASSERT(got->base == sp->base + sp->size);
    *added = got->size;
    sp->request += got->size;
    sa__span_grow_into(a, sp, got);
  }
  SA_VALIDATE_PACED(&a->spans.pace, sa__span_check(a));
  pthread_mutex_unlock(&a->lock);
  return st;
}

void sa__span_set_pool_segment(sa_arena *a, uintptr_t p) {
  pthread_mutex_lock(&a->lock);
  sa_span *sp = sa__live_find(a, p);
  SA_ASSERT(sp != NULL && sp->holder == NULL);
  if (sp != NULL) sp->pool_segment = true;
  pthread_mutex_unlock(&a->lock);
}

/* Descriptors, with room for nmarks marks, for carve's two splits. Without
 * one carve takes more than asked, from the free span's start: fine for a
 * span, but a superblock must start and end on a page (its pages name it,
 * and only its). */
static bool spares_for_carve(sa_arena *a, unsigned nmarks) {
  sa_span *got[2] = {NULL, NULL};
  bool ok = true;
  for (int i = 0; i < 2 && ok; i++)
    ok = (got[i] = sa__span_new(a)) != NULL && sa__marks_reserve(got[i], nmarks);
  for (int i = 1; i >= 0; i--)
    if (got[i] != NULL) sa__span_put(a, got[i]);
  return ok;
}

sa_status sa__span_take_superblock(sa_arena *a, sa_stream_arena *sarena, size_t size,
                                   sa_desc *holder, sa_span **out) {
  sa_want w = {size, (size_t)1 << a->range.page_shift, true};
  *out = NULL;
  sa_span *sp = sa__free_best_fit(a, w, sarena);
  if (sp == NULL || !spares_for_carve(a, sp->nmarks)) return SA_OK;
  sa__free_remove(a, sp);
  sa_status st = take_settled(a, &sp, sarena, w);
  if (st != SA_OK) return st;
  sp->owner = NULL; /* a name only, and no stream's: sa__span_forget_doomed */
  sp->request = 0;
  sp->holder = holder;
  atomic_store_explicit(&sp->xstate, SA_BLOCK_LIVE, memory_order_relaxed);
  sa__pagemap_set(a, sp->base, sp->size, holder);
  *out = sp;
  return SA_OK;
}

/* A superblock's span, given back: free, its pages the run's, out of the
 * fit index. */
static void superblock_span_freed(sa_arena *a, sa_span *sp) {
  sa__pagemap_set(a, sp->base, sp->size, &sp->run->hdr);
  sp->holder = NULL;
  sa__marks_clear(a, sp);
  sp->nstarts = 0;
  atomic_store_explicit(&sp->xstate, SA_BLOCK_FREE, memory_order_relaxed);
}

/* sps sorted by base, through tmp (room for n): a bottom-up merge sort
 * whose comparisons are inline. qsort's calls through a pointer were two
 * thirds of giving back a thousand superblocks, on a large request's path
 * (See Note [Superblocks carved in free spans]). */
static void sort_by_base(sa_span **sps, sa_span **tmp, size_t n) {
  SA_ASSERT(n < 2 || tmp != NULL);
  sa_span **src = sps, **dst = tmp;
  for (size_t w = 1; w < n; w *= 2) {
    for (size_t lo = 0; lo < n; lo += 2 * w) {
      size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
      size_t i = lo, j = mid, k = lo;
      while (i < mid && j < hi) dst[k++] = src[j]->base < src[i]->base ? src[j++] : src[i++];
      while (i < mid) dst[k++] = src[i++];
      while (j < hi) dst[k++] = src[j++];
    }
    sa_span **t = src;
    src = dst;
    dst = t;
  }
  if (src != sps) memcpy(sps, src, n * sizeof *sps);
#if SA_INVARIANTS
  for (size_t i = 1; i < n; i++) SA_ASSERT(sps[i - 1]->base < sps[i]->base);
#endif
}

void sa__span_give_back_superblocks(sa_arena *a, sa_span **sps, sa_span **tmp, size_t n) {
  sort_by_base(sps, tmp, n);
  for (size_t i = 0; i < n;) {
    sa_span *head = sps[i++];
    superblock_span_freed(a, head);
    /* Its neighbours given back with it join it first: no marks, no starts. */
    for (; i < n && sps[i] == head->next; i++) {
      superblock_span_freed(a, sps[i]);
      sa__span_grow_into(a, head, sps[i]);
    }
    sa__free_insert(a, sa__free_coalesce(a, head, NULL));
  }
  if (n > 0) a->spans.reshape_futile = 0; /* free span memory, as a span freed: worth a look */
}

void sa__span_give_back_superblock(sa_arena *a, sa_span *sp) {
  sa__span_give_back_superblocks(a, &sp, NULL, 1);
}

void sa__span_record_wanted(sa_arena *a, sa_stream_arena *sarena) {
  if (!atomic_load_explicit(&sarena->timeline.xwanted, memory_order_relaxed)) return;
  /* Recorded, its span may be reshaped once its work completed: a reshape
   * that found too little before is worth another look, as after a free. */
  if (sa__timeline_record_wanted(a, sarena) == SA_OK) a->spans.reshape_futile = 0;
}

/* Why p, in the reserved range, is not a live span's start: a span freed
 * before (it may have merged into a larger free span), or not a start. */
static sa_status not_live(const sa_arena *a, uintptr_t p) {
  sa_desc *desc = sa__pagemap_get(&a->range, p);
  if (desc == NULL || desc->kind != SA_DESC_RUN) return SA_ERR_INVALID_POINTER;
  for (const sa_span *sp = ((const sa_run *)desc)->first; sp != NULL; sp = sp->next) {
    if (p - sp->base >= sp->size) continue;
    return sa__span_is_free(sp) && sa__starts_has(sp, p) ? SA_ERR_DOUBLE_FREE
                                                         : SA_ERR_INVALID_POINTER;
  }
  return SA_ERR_INVALID_POINTER;
}

/* The live span at p: SA_OK with *out, or why not (*out NULL). A span kept
 * by the thread that freed it (kept.h) is in the live map but freed
 * already. Arena lock held. */
static sa_status live_at(sa_arena *a, uintptr_t p, sa_span **out) {
  sa_span *sp = sa__live_find(a, p);
  *out = NULL;
  if (sp == NULL) return not_live(a, p);
  if (atomic_load_explicit(&sp->xstate, memory_order_relaxed) == SA_BLOCK_CACHED)
    return SA_ERR_DOUBLE_FREE;
  *out = sp;
  return SA_OK;
}

sa_status sa__span_find(sa_arena *a, uintptr_t p, sa_span **out) {
  pthread_mutex_lock(&a->lock);
  sa_status st = live_at(a, p, out);
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* Room for the marks of sp's free neighbours, nmarks of its own: then
 * sa__free_coalesce merges it with both, whatever they hold. */
static bool merges_reserved(sa_span *sp, unsigned nmarks) {
  sa_span *n = sp->next, *p = sp->prev;
  unsigned k = nmarks + (n != NULL && sa__span_is_free(n) ? n->nmarks : 0);
  if (!sa__marks_reserve(sp, k)) return false;
  return p == NULL || !sa__span_is_free(p) || sa__marks_reserve(p, p->nmarks + k);
}

/* The free bytes that sp, just freed, holds once merged with its free
 * neighbours (sa__free_coalesce merges with all). */
static size_t merged_size(const sa_span *sp) {
  size_t n = sp->size;
  if (sp->prev != NULL && sa__span_is_free(sp->prev)) n += sp->prev->size;
  if (sp->next != NULL && sa__span_is_free(sp->next)) n += sp->next->size;
  return n;
}

/* Another stream that uses spans may grow in place of memory held back,
 * and a reshape under a budget cannot take it: only within the footprint
 * target (or the budget), where a growth in its place does not pass it. */
bool sa__span_may_hold_back(const sa_arena *a, size_t bytes) {
  return !(a->spans.nholders > 1 || a->physical.budgeted) ||
         a->physical.bytes + bytes <= sa__physical_soft_limit(a);
}

/* May the free of sp (nmarks marks) on freer's stream leave its mark
 * pending, no event recorded? Only where its own stream is likely to be
 * the next to want it, and others lose little meanwhile: sp was allocated
 * on freer's stream (a span handed from stream to stream records at once),
 * the stream is seen retaking what it frees (a loop of pairs, a step that
 * frees a temporary and allocates the next) and no one waits for its
 * pending span, no other stream was recorded on sp, and the merged span
 * holds at most SA_LAZY_MARK_MAX. Then yes if nothing is pending there, or
 * if sp merges into the pending span (one span still carries the later
 * ticket; sa__marks_join_pending). A stream alone in taking spans
 * (spans.ntakers is 1) needs neither the retaking nor the bound on the
 * merged span, and up to SA_LAZY_MARK_RUN earlier pending tickets may stay
 * on their spans (*more; timeline.c, "Pending").
 * See Note [Lazy free marks]. */
static bool free_lazily(sa_arena *a, sa_span *sp, sa_stream_arena *freer, unsigned nmarks,
                        bool *more) {
  sa_timeline *tl = &freer->timeline;
  size_t merged = merged_size(sp);
  /* No other stream arena not gone has taken a span: none waits for these. */
  bool alone = a->spans.ntakers == 1;
  *more = false;
  /* Not with other streams' marks (sa_record_stream's): they keep a
   * pending span apart from its neighbours (sa__marks_pending_apart), so
   * a second free beside it could not merge into it. */
  if (nmarks != 1 || sp->owner != freer ||
      atomic_load_explicit(&tl->xwanted, memory_order_relaxed))
    return false;
  if (!alone && (!tl->retaking || merged > SA_LAZY_MARK_MAX)) return false;
  if (!sa__span_may_hold_back(a, merged)) return false;
  sa__timeline_settle(a, freer); /* a device sync may have completed it */
  if (tl->pending == 0) return true;
  /* The merge must happen: a pending span that took another stream's
   * marks while its stream was alone stays apart from the new one once
   * a second stream takes spans, and its earlier ticket, no longer the
   * pending one, would then wait for a record nobody asks for. */
  if ((tl->pending_span == sp->prev || tl->pending_span == sp->next) &&
      tl->pending_span != NULL && sa__marks_join_pending(a, tl->pending_span, freer) &&
      merges_reserved(sp, nmarks))
    return true;
  /* Alone, one record per SA_LAZY_MARK_RUN frees: a reshape, which needs
   * their work known done to unmap their memory, sees all but the latest
   * few (the GPU is likely still at those anyway). */
  *more = alone && tl->pending_apart < SA_LAZY_MARK_RUN;
  return *more;
}

sa_status sa__span_free_live(sa_arena *a, sa_span *sp, sa_stream_arena *freer,
                             const sa_stream *recorded, unsigned nrecorded, sa_span_mark mark) {
  sa_status st = SA_OK;
  if (mark == SA_SPAN_MARKED) {
    if (!sa__marks_reserve(sp, 1 + nrecorded)) return SA_ERR_OUT_OF_MEMORY;
    /* An event on every recorded stream, then a mark on the freeing
     * stream's timeline: pending where it may be (timeline.c, "Pending"),
     * else recorded. A failure leaves the span live: the events go back, a
     * recorded ticket marks nothing, and a pending one is taken last. */
    for (unsigned i = 0; st == SA_OK && i < nrecorded; i++) {
      sa_mark m = {NULL, 0, NULL};
      st = sa__mark_event_record(a, recorded[i], &m.recorded);
      if (st == SA_OK) sa__marks_add(a, sp, m);
    }
    if (st == SA_OK) {
      sa_mark m = {freer, 0, NULL};
      bool more;
      st = free_lazily(a, sp, freer, 1 + nrecorded, &more)
               ? sa__timeline_mark_lazily(a, freer, sp, more, &m.ticket)
               : sa__timeline_mark(a, freer, &m.ticket);
      if (st == SA_OK) sa__marks_add(a, sp, m);
    }
    if (st != SA_OK) {
      sa__marks_clear(a, sp);
      return st;
    }
  }
  SA_ASSERT(sp->holder == NULL && a->spans.nlive > 0);
  sa__live_remove(a, sp);
  a->spans.nlive--;
  a->spans.frees++;
  if (atomic_fetch_sub_explicit(&sp->owner->xspans, 1, memory_order_release) == 1)
    a->spans.nholders--;
  /* From now on only a name (sa__span_forget_doomed), and only of a stream
   * that marked it: a clean free (kept.c, its stream arena gone) names
   * none, or the name would outlive the stream arena, which reap frees
   * without looking for names when its timeline took no ticket. */
  sp->owner = mark == SA_SPAN_MARKED ? freer : NULL;
  sp->pool_segment = false;
  sp->nstarts = 0;
  sa__starts_add(sp, sp->base);
  atomic_store_explicit(&sp->xstate, SA_BLOCK_FREE, memory_order_relaxed);
  /* A pending mark follows the span it merges into (sa__marks_join). */
  sa__free_insert(a, sa__free_coalesce(a, sp, NULL));
  return SA_OK;
}

sa_status sa__span_free(sa_arena *a, uintptr_t p, sa_stream_arena *freer,
                        const sa_stream *recorded, unsigned nrecorded,
                        bool *needs_records, size_t *request) {
  pthread_mutex_lock(&a->lock);
  sa_span *sp;
  sa_status st = live_at(a, p, &sp);
  if (st == SA_OK && needs_records != NULL &&
      atomic_load_explicit(&sp->xstate, memory_order_relaxed) == SA_BLOCK_RECORDED) {
    *needs_records = true; /* the caller takes them (record.c) and comes back */
    pthread_mutex_unlock(&a->lock);
    return SA_OK;
  }
  if (st == SA_OK) {
    *request = sp->request;
    st = sa__span_free_live(a, sp, freer, recorded, nrecorded, SA_SPAN_MARKED);
  }
  SA_VALIDATE_PACED(&a->spans.pace, sa__span_check(a));
  pthread_mutex_unlock(&a->lock);
  return st;
}

size_t sa__span_unmap_free(sa_arena *a, size_t need, sa_wait wait) {
  size_t cached = a->physical.cache_bytes;
  if (need > 0 && cached >= need) return 0;
  return sa__run_unmap_free(a, need > 0 ? need - cached : SIZE_MAX, 0, 0, wait);
}

void sa__span_forget_doomed(sa_arena *a) {
  /* Marks whose work is known done go (as a merge drops them): a doomed
   * stream arena that only those named is free to go. One walk for all. */
  for (sa_run *r = a->spans.runs; r != NULL; r = r->next)
    for (sa_span *sp = r->first; sp != NULL; sp = sp->next) {
      if (!sa__span_is_free(sp)) continue;
      sa__marks_prune_known(a, sp);
      for (unsigned i = 0; i < sp->nmarks; i++)
        if (sp->marks[i].stream != NULL) sp->marks[i].stream->doomed = false;
    }
  for (sa_run *r = a->spans.runs; r != NULL; r = r->next)
    for (sa_span *sp = r->first; sp != NULL; sp = sp->next)
      if (sa__span_is_free(sp) && sp->owner != NULL && sp->owner->doomed) sp->owner = NULL;
}

size_t sa__span_clean_bytes(const sa_arena *a) {
  size_t n = 0;
  for (const sa_run *r = a->spans.runs; r != NULL; r = r->next)
    for (const sa_span *sp = r->first; sp != NULL; sp = sp->next) {
      bool clean = sa__span_is_free(sp);
      for (unsigned i = 0; clean && i < sp->nmarks; i++) clean = sa__mark_known_done(&sp->marks[i]);
      if (clean) n += sp->size;
    }
  return n;
}

/* ------------------------------------------------------------------------
 * Invariants
 * ---------------------------------------------------------------------- */

static const char SPAN[] = "span";

/* One span of run r, whose previous span is prev; counts what it is. */
static void span_check_one(const sa_arena *a, const sa_run *r, const sa_span *sp,
                           const sa_span *prev, size_t *free_bytes, size_t *nfree,
                           size_t *nlive) {
  SA_CHECK(SPAN, sp->run == r, "a span's run pointer is its run");
  SA_CHECK(SPAN, sp->prev == prev, "prev and next links agree");
  SA_CHECK(SPAN, sp->size > 0 && sp->size % SA_SPAN_QUANTUM == 0,
           "a span's size is a positive multiple of SA_SPAN_QUANTUM");
  SA_CHECK(SPAN, !sp->pool_segment || (!sa__span_is_free(sp) && sp->holder == NULL),
           "a pool's segment is a live span holding no superblock");
  if (sa__span_is_free(sp)) {
    SA_CHECK(SPAN, sp->holder == NULL, "a free span holds no superblock");
    SA_CHECK(SPAN, a->spans.apart || prev == NULL || !sa__span_is_free(prev),
             "free neighbours are merged, but where spans.apart says some are kept apart");
    SA_CHECK(SPAN, sa__fit_ceiling(a, sp->size, sp->base) == sp,
             "a free span is in the fit index");
    SA_CHECK(SPAN, sa__pagemap_get(&a->range, sp->base) == &r->hdr,
             "a free span's page names its run");
    sa__marks_check(sp);
    *free_bytes += sp->size;
    (*nfree)++;
    return;
  }
  SA_CHECK(SPAN, sp->nmarks == 0, "a live span has no marks");
  if (sp->holder != NULL) { /* a superblock carved in free span memory */
    SA_CHECK(SPAN, sa__pagemap_get(&a->range, sp->base) == sp->holder,
             "a carved superblock's page names it");
    return;
  }
  SA_CHECK(SPAN, sp->owner != NULL, "a live span has an owner");
  SA_CHECK(SPAN, sa__live_find(a, sp->base) == sp, "a live span is in the live map");
  SA_CHECK(SPAN, sa__pagemap_get(&a->range, sp->base) == &r->hdr,
           "a live span's page names its run");
  (*nlive)++;
}

size_t sa__span_check(const sa_arena *a) {
  /* The fit index first: a damaged index is named as such, not as a span
   * it fails to find. */
  size_t indexed = sa__fit_check(a), visited = indexed;
  size_t free_bytes = 0, nfree = 0, nlive = 0;
  const sa_run *prev_run = NULL;
  for (const sa_run *r = a->spans.runs; r != NULL; prev_run = r, r = r->next) {
    uintptr_t end = r->hdr.base + r->hdr.size;
    SA_CHECK(SPAN, r->hdr.kind == SA_DESC_RUN && r->hdr.size > 0, "a run is mapped");
    SA_CHECK(SPAN, r->prev == prev_run, "runs' prev and next links agree");
    SA_CHECK(SPAN, prev_run == NULL || prev_run->hdr.base + prev_run->hdr.size <= r->hdr.base,
             "runs in address order, apart");
    size_t mapped = 0;
    for (const sa_chunk *c = r->hdr.chunks; c != NULL; c = c->next, visited++) mapped += c->size;
    SA_CHECK(SPAN, mapped == r->hdr.size, "a run's chunk sizes sum to its size");
    SA_CHECK(SPAN, r->first != NULL && r->first->base == r->hdr.base,
             "spans tile each run: no gap, no overlap");
    uintptr_t at = r->hdr.base;
    const sa_span *prev = NULL;
    for (const sa_span *sp = r->first; sp != NULL; prev = sp, sp = sp->next) {
      SA_CHECK(SPAN, sp->base == at && sp->size <= end - at,
               "spans tile each run: no gap, no overlap");
      span_check_one(a, r, sp, prev, &free_bytes, &nfree, &nlive);
      at += sp->size;
      visited++;
    }
    SA_CHECK(SPAN, at == end, "spans tile each run: no gap, no overlap");
    SA_CHECK(SPAN, r->last == prev, "a run's last span ends its list");
  }
  SA_CHECK(SPAN, free_bytes == a->spans.free_bytes, "spans.free_bytes is the sum of free spans");
  SA_CHECK(SPAN, nfree == indexed, "the fit index holds the free spans and only them");
  SA_CHECK(SPAN, nlive == a->spans.nlive && nlive == a->spans.live_map.n,
           "spans.nlive and the live map count the live spans");
  size_t holders = 0, takers = 0;
  for (const sa_stream_arena *sarena = a->streams.list; sarena != NULL; sarena = sarena->next) {
    sa__marks_pending_check(a, sarena);
    holders += atomic_load_explicit(&sarena->xspans, memory_order_relaxed) > 0;
    takers += sarena->timeline.took_spans && !sa__stream_arena_gone_locked(sarena);
    visited++;
  }
  SA_CHECK(SPAN, holders == a->spans.nholders,
           "spans.nholders counts the stream arenas with live spans");
  SA_CHECK(SPAN, takers == a->spans.ntakers,
           "spans.ntakers counts the stream arenas not gone that took a span");
  return visited;
}

sa_status sa__span_fini(sa_arena *a) {
  sa_status first = SA_OK;
  for (sa_run *r = a->spans.all_runs; r != NULL; r = r->all_next) {
    for (sa_span *sp = r->first; sp != NULL; sp = sp->next) {
      if (!sa__span_is_free(sp)) continue;
      (void)sa__marks_reached(a, sp, SA_WAIT);
      sa__marks_clear(a, sp); /* a failed wait: the driver's error says so */
    }
    sa_status st = sa__physical_unmap(a, &r->hdr);
    if (st != SA_OK && first == SA_OK) first = st;
  }
  while (a->spans.all_runs != NULL) {
    sa_run *r = a->spans.all_runs;
    a->spans.all_runs = r->all_next;
    free(r); /* chunks of a refused unmap stay with phys (physical.c) */
  }
  while (a->spans.all_spans != NULL) {
    sa_span *sp = a->spans.all_spans;
    a->spans.all_spans = sp->all_next;
    free(sp->marks);
    free(sp);
  }
  a->spans.runs = a->spans.spare_runs = NULL;
  a->spans.spare_spans = NULL;
  a->spans.fit = (sa_fit_index){0};
  sa__live_fini(a);
  return first;
}
