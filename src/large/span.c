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
 *     2 MiB granule, and traces' requests are rarely multiples of 2 MiB (the
 *     transformer trace loses 7% of its large bytes to granule rounding).
 *     The mapped chunk is only the unit of unmapping (physical.c: by
 *     default a whole growth). The page map keeps one entry per granule,
 *     naming the run; a span is found by its exact start in the live map.
 *   - When no free span fits, the arena grows (plan_growth): it maps only
 *     what is missing at an end of a run, next to the free span there (as
 *     PyTorch's expandable segments do), or fills the gap between two runs,
 *     or starts a run in the middle of free reserved space. Upward on a tie:
 *     best fit places at the lowest address, so the free rest of a run
 *     that grew up stays at its top, where the next growth extends it (the
 *     PyTorch trace's 4 GiB logits grew down once, and every later step
 *     needed a new 4 GiB). One chunk and one access setting per growth,
 *     and on a climb to a new live peak a little memory mapped ahead
 *     (map_ahead).
 *   - Growth stops at the limit the caller passes (alloc.c: the footprint
 *     target, reserve_limit, max_physical, or what the driver could
 *     create). Past it, the reshape (reshape_bytes): free span memory whose
 *     work completed is unmapped elsewhere, the smallest free spans first,
 *     never the span the growth extends (unmap_free), and the growth maps
 *     those granules where the request needs them. Under the footprint
 *     target only within the remapping ledger (physical.c) and not for a
 *     request that sets a new live peak. Remapping happens only then,
 *     never on the common path, and is decided without a scan.
 *   - With a budget configured, spans that lose at most 1/32 to rounding
 *     take whole granules at granule boundaries (placement): freed, they
 *     free whole granules. Without this a freed span shares its end
 *     granules with live neighbours, and under a budget of 1.1 x peak live
 *     the fragmentation trace runs out of memory. Without a budget packed
 *     placement keeps the footprint lower (dataframe 1.246 against 1.262,
 *     torch_transformer 1.016 against 1.031: docs/DEFRAG.md).
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
 * Every function runs with the arena lock held unless span.h says
 * otherwise. Calls span_index.c, timeline.c, physical.c and va_space.c;
 * called by alloc.c, reclaim.c, report.c, snapshot.c and arena.c.
 */
#include <stdlib.h>

#include "span.h"
#include "../arena.h"
#include "../base/base.h"
#include "../base/event_pool.h"
#include "../base/hook.h"
#include "../driver/driver.h"
#include "../vm/physical.h"
#include "../vm/va_space.h"
#include "span_index.h"
#include "timeline.h"

static size_t round_up(size_t x, size_t to) { return (x + to - 1) & ~(to - 1); }

static bool is_free(const sa_span *sp) {
  return atomic_load_explicit(&sp->xstate, memory_order_relaxed) == SA_BLOCK_FREE;
}

/* ------------------------------------------------------------------------
 * Descriptors (recycled; runs are type-stable: the page map names them)
 * ---------------------------------------------------------------------- */

static void marks_clear(sa_arena *a, sa_span *sp);

static sa_span *span_new(sa_arena *a) {
  sa_span *sp = a->spans.spare_spans;
  if (sp != NULL) {
    a->spans.spare_spans = sp->next;
  } else {
    sp = calloc(1, sizeof *sp);
    if (sp == NULL) return NULL;
    sp->all_next = a->spans.all_spans;
    a->spans.all_spans = sp;
  }
  SA_ASSERT(sp->nmarks == 0); /* span_put dropped them */
  sp->prev = sp->next = sp->left = sp->right = NULL;
  sp->nstarts = 0;
  sp->owner = NULL;
  sp->request = 0;
  sp->holder = NULL;
  atomic_store_explicit(&sp->xstate, SA_BLOCK_FREE, memory_order_relaxed);
  return sp;
}

static void span_put(sa_arena *a, sa_span *sp) {
  marks_clear(a, sp);
  sp->nstarts = 0;
  sp->run = NULL;
  sp->next = a->spans.spare_spans;
  a->spans.spare_spans = sp;
}

static sa_run *run_new(sa_arena *a) {
  sa_run *r = a->spans.spare_runs;
  if (r != NULL) {
    a->spans.spare_runs = r->next;
  } else {
    r = calloc(1, sizeof *r);
    if (r == NULL) return NULL;
    r->hdr.kind = SA_DESC_RUN;
    r->all_next = a->spans.all_runs;
    a->spans.all_runs = r;
  }
  r->hdr.base = 0;
  r->hdr.size = 0;
  r->hdr.chunks = NULL;
  r->first = r->last = NULL;
  r->next = r->prev = NULL;
  return r;
}

static void run_put(sa_arena *a, sa_run *r) {
  r->hdr.size = 0;
  r->first = r->last = NULL;
  r->next = a->spans.spare_runs;
  a->spans.spare_runs = r;
}

/* Into the arena's runs, which are in address order. */
static void run_link(sa_arena *a, sa_run *r) {
  sa_run *prev = NULL, *next = a->spans.runs;
  while (next != NULL && next->hdr.base < r->hdr.base) {
    prev = next;
    next = next->next;
  }
  r->prev = prev;
  r->next = next;
  if (prev != NULL)
    prev->next = r;
  else
    a->spans.runs = r;
  if (next != NULL) next->prev = r;
}

SA_DLIST_FUNCTIONS(runs, sa_run, next, prev)

static void run_unlink(sa_arena *a, sa_run *r) {
  runs_unlink(&a->spans.runs, r);
  r->next = r->prev = NULL;
}

/* sp joins its run's span list after `after` (NULL: first). */
static void span_link_after(sa_run *r, sa_span *after, sa_span *sp) {
  sp->run = r;
  sp->prev = after;
  sp->next = after != NULL ? after->next : r->first;
  if (sp->next != NULL)
    sp->next->prev = sp;
  else
    r->last = sp;
  if (after != NULL)
    after->next = sp;
  else
    r->first = sp;
}

static void span_unlink(sa_span *sp) {
  sa_run *r = sp->run;
  if (sp->prev != NULL)
    sp->prev->next = sp->next;
  else
    r->first = sp->next;
  if (sp->next != NULL)
    sp->next->prev = sp->prev;
  else
    r->last = sp->prev;
  sp->prev = sp->next = NULL;
}

/* ------------------------------------------------------------------------
 * Marks: the streams whose work may still touch a free span
 * ---------------------------------------------------------------------- */

/* A recorded mark's event, shared by the marks that name it. */
static sa_status mark_event_record(sa_arena *a, sa_stream s, sa_mark_event **out) {
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

/* Has m's work completed (with wait: after waiting for it)? SA_OK, or
 * SA_ERR_NOT_READY, or a driver error. */
static sa_status mark_reached(sa_arena *a, const sa_mark *m, bool wait) {
  if (m->recorded == NULL) return sa__timeline_reached(a, m->stream, m->ticket, wait);
  if (m->recorded->done) return SA_OK;
  sa_status st = wait ? a->drv->ops->event_synchronize(a->drv, m->recorded->event)
                      : a->drv->ops->event_query(a->drv, m->recorded->event);
  if (st == SA_OK) m->recorded->done = true;
  return st;
}

/* Make stream `on` wait on the device for m's work, unless it completed. */
static sa_status mark_wait(sa_arena *a, const sa_mark *m, sa_stream on) {
  if (m->recorded == NULL) return sa__timeline_wait(a, m->stream, m->ticket, on);
  sa_status st = mark_reached(a, m, false);
  if (st != SA_ERR_NOT_READY) return st;
  return a->drv->ops->stream_wait_event(a->drv, on, m->recorded->event);
}

static bool marks_reserve(sa_span *sp, unsigned n) {
  if (n <= sp->marks_cap) return true;
  unsigned cap = sp->marks_cap ? sp->marks_cap : 2;
  while (cap < n) cap *= 2;
  sa_mark *m = realloc(sp->marks, cap * sizeof *m);
  if (m == NULL) return false;
  sp->marks = m;
  sp->marks_cap = cap;
  return true;
}

/* sp waits for m too, which it takes over (room reserved). A free's mark:
 * one per stream arena, the later ticket covering the earlier. A recorded
 * mark: one per event (two of one stream arena may be of two streams that
 * shared a handle). */
static void marks_add(sa_arena *a, sa_span *sp, sa_mark m) {
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

/* dst gets copies of src's marks (room reserved), as a split does. */
static void marks_copy(sa_span *dst, const sa_span *src) {
  for (unsigned i = 0; i < src->nmarks; i++) {
    dst->marks[i] = src->marks[i];
    if (src->marks[i].recorded != NULL) src->marks[i].recorded->refs++;
  }
  dst->nmarks = src->nmarks;
}

/* sp waits for nothing any more (its marks are dropped). */
static void marks_clear(sa_arena *a, sa_span *sp) {
  for (unsigned i = 0; i < sp->nmarks; i++) mark_drop(a, sp->marks[i]);
  sp->nmarks = 0;
}

/* Drop the marks the host knows completed; no driver call. */
static void marks_prune_known(sa_arena *a, sa_span *sp) {
  unsigned kept = 0;
  for (unsigned i = 0; i < sp->nmarks; i++) {
    if (sa__mark_known_done(&sp->marks[i]))
      mark_drop(a, sp->marks[i]);
    else
      sp->marks[kept++] = sp->marks[i];
  }
  sp->nmarks = kept;
}

/* dst also waits for what src waited for: src's marks move to dst. False
 * (both unchanged) without memory for them. */
static bool marks_join(sa_arena *a, sa_span *dst, sa_span *src) {
  if (!marks_reserve(dst, dst->nmarks + src->nmarks)) return false;
  for (unsigned i = 0; i < src->nmarks; i++) marks_add(a, dst, src->marks[i]);
  src->nmarks = 0;
  return true;
}

/* Drop the marks whose work completed (with wait: after waiting); true
 * when none is left. */
static bool marks_reached(sa_arena *a, sa_span *sp, bool wait) {
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

/* Does sa's stream order m's work by itself? Only a free's mark on sa's own
 * timeline: a recorded mark's stream may have been destroyed and its
 * handle taken by sa's stream (a thread that knew the handle binds it to
 * the old stream arena). */
static bool ordered_by(const sa_mark *m, const sa_stream_arena *sa) {
  return m->recorded == NULL && m->stream == sa;
}

/* Can sa's stream use sp without waiting, as far as the host knows? */
static bool clean_for(const sa_span *sp, const sa_stream_arena *sa) {
  for (unsigned i = 0; i < sp->nmarks; i++)
    if (!ordered_by(&sp->marks[i], sa) && !sa__mark_known_done(&sp->marks[i])) return false;
  return true;
}

/* Make sp safe for sa's stream: completion seen by a query or a device-side
 * wait for every mark sa's stream does not order by itself. The marks stay
 * on sp (the caller drops them from the piece it hands out once this
 * succeeded): after a failed wait, every one of them still guards sp. */
static sa_status settle(sa_arena *a, sa_span *sp, sa_stream_arena *sa) {
  for (unsigned i = 0; i < sp->nmarks; i++) {
    if (ordered_by(&sp->marks[i], sa)) continue;
    sa_status st = mark_wait(a, &sp->marks[i], sa->stream);
    if (st != SA_OK) return st;
  }
  return SA_OK;
}

/* ------------------------------------------------------------------------
 * Starts: where spans that were freed into a free span began, so that
 * freeing one again is told apart from freeing an interior address. The
 * latest few are kept: a double free that late is reported as an invalid
 * pointer (nothing changes either way).
 * ---------------------------------------------------------------------- */

static void starts_add(sa_span *sp, uintptr_t p) {
  unsigned n = sp->nstarts < SA_SPAN_STARTS ? sp->nstarts + 1 : SA_SPAN_STARTS;
  for (unsigned i = n - 1; i > 0; i--) sp->starts[i] = sp->starts[i - 1];
  sp->starts[0] = p;
  sp->nstarts = n;
}

/* dst also holds src's starts, newer ones (newer: src's) first. */
static void starts_join(sa_span *dst, const sa_span *src, bool src_newer) {
  uintptr_t all[2 * SA_SPAN_STARTS];
  const sa_span *first = src_newer ? src : dst, *second = src_newer ? dst : src;
  unsigned n = 0;
  for (unsigned i = 0; i < first->nstarts; i++) all[n++] = first->starts[i];
  for (unsigned i = 0; i < second->nstarts; i++) all[n++] = second->starts[i];
  dst->nstarts = n < SA_SPAN_STARTS ? n : SA_SPAN_STARTS;
  for (unsigned i = 0; i < dst->nstarts; i++) dst->starts[i] = all[i];
}

/* Keep only the starts inside dst; copied from src (src == dst: filter). */
static void starts_within(sa_span *dst, const sa_span *src) {
  unsigned n = 0;
  for (unsigned i = 0; i < src->nstarts; i++)
    if (src->starts[i] - dst->base < dst->size) dst->starts[n++] = src->starts[i];
  dst->nstarts = n;
}

static bool starts_has(const sa_span *sp, uintptr_t p) {
  for (unsigned i = 0; i < sp->nstarts; i++)
    if (sp->starts[i] == p) return true;
  return false;
}

/* ------------------------------------------------------------------------
 * Free spans: the fit index and coalescing
 * ---------------------------------------------------------------------- */

static void free_insert(sa_arena *a, sa_span *sp) {
  atomic_store_explicit(&sp->xstate, SA_BLOCK_FREE, memory_order_relaxed);
  sa__fit_insert(a, sp);
  a->spans.free_bytes += sp->size;
}

static void free_remove(sa_arena *a, sa_span *sp) {
  SA_ASSERT(is_free(sp) && a->spans.free_bytes >= sp->size);
  sa__fit_remove(a, sp);
  a->spans.free_bytes -= sp->size;
}

/* right (free, just above left in the run) joins left (free); both out of
 * the index; right_newer: right was freed last. False without memory to
 * join their marks: they stay apart. */
static bool absorb(sa_arena *a, sa_span *left, sa_span *right, bool right_newer) {
  marks_prune_known(a, left);
  marks_prune_known(a, right);
  if (!marks_join(a, left, right)) return false;
  starts_join(left, right, right_newer);
  left->size += right->size;
  span_unlink(right);
  span_put(a, right);
  return true;
}

/* sp (free, out of the index) merges with its free neighbours; returns the
 * merged span, out of the index. */
static sa_span *coalesce(sa_arena *a, sa_span *sp) {
  sa_span *n = sp->next;
  if (n != NULL && is_free(n)) {
    free_remove(a, n);
    if (!absorb(a, sp, n, false)) free_insert(a, n);
  }
  sa_span *p = sp->prev;
  if (p != NULL && is_free(p)) {
    free_remove(a, p);
    if (absorb(a, p, sp, true)) {
      p->owner = sp->owner; /* the last freer */
      sp = p;
    } else {
      free_insert(a, p);
    }
  }
  return sp;
}

/* What a request takes: need bytes, and whether at a granule boundary. */
typedef struct want_s {
  size_t need;
  size_t align; /* 0 (packed), or a power of two it starts at a multiple of */
  bool exact; /* map no more than need (growth maps ahead on a climb) */
} want;

/* The placement policy. Packed at SA_SPAN_QUANTUM, except with a budget
 * configured: then a span that loses at most 1/32 of itself to rounding up
 * to whole granules (all of 64 MiB and more, and those just below a
 * multiple of the granularity) takes whole granules at a granule boundary,
 * so that freeing it frees whole granules a budget can unmap and stitch
 * elsewhere. Rounding a 1.1 MiB request to 2 MiB would waste 45%: small
 * spans stay packed. */
static want placement(const sa_arena *a, size_t size) {
  size_t q = round_up(size, SA_SPAN_QUANTUM), g = round_up(size, a->gran);
  return a->physical.budgeted && g - q <= q / 32 ? (want){g, a->gran, false} : (want){q, 0, false};
}

/* Where w would start in the free span sp: its lowest address, or lowest
 * granule boundary (address-ordered best fit: the rest stays above, and at
 * a run's top end, where growth extends it). 0 if it does not fit. */
static uintptr_t place(const sa_arena *a, const sa_span *sp, want w) {
  uintptr_t end = sp->base + sp->size;
  if (w.align != 0) {
    uintptr_t at = round_up(sp->base, w.align);
    return at <= end && end - at >= w.need ? at : 0;
  }
  return sp->size >= w.need ? sp->base : 0;
}

/* The best fit for w: the smallest free span it fits in, the lowest
 * address first; among spans of that size, one sa's stream can use without
 * waiting if one of the first few is. */
static sa_span *best_fit(const sa_arena *a, want w, const sa_stream_arena *sa) {
  sa_span *pick = NULL;
  sa_span *x = sa__fit_ceiling(a, w.need, 0);
  for (int i = 0; x != NULL && i < 16; i++, x = sa__fit_ceiling(a, x->size, x->base + 1)) {
    if (pick != NULL && x->size != pick->size) break;
    if (place(a, x, w) == 0) continue;
    if (clean_for(x, sa)) return x;
    if (pick == NULL) pick = x;
  }
  if (pick == NULL && w.align != 0) /* any span this large fits at a boundary */
    pick = sa__fit_ceiling(a, w.need + w.align - SA_SPAN_QUANTUM, 0);
  return pick;
}

/* A free span for [at, end of sp): sp's marks and starts there, linked
 * after sp and in the index; sp keeps [base, at). NULL, and nothing
 * changed, without memory. */
static sa_span *split(sa_arena *a, sa_span *sp, uintptr_t at) {
  sa_span *r = span_new(a);
  if (r == NULL) return NULL;
  if (!marks_reserve(r, sp->nmarks)) {
    span_put(a, r);
    return NULL;
  }
  marks_copy(r, sp);
  r->owner = sp->owner;
  r->base = at;
  r->size = sp->base + sp->size - at;
  sp->size = at - sp->base;
  starts_within(r, sp);
  span_link_after(sp->run, sp, r);
  free_insert(a, r);
  return r;
}

/* Take w from the free span sp (out of the index, settled for the taker,
 * w fits) as the span returned; what lies before and after it stays free,
 * with sp's marks. Without memory for a descriptor more is taken. */
static sa_span *carve(sa_arena *a, sa_span *sp, want w) {
  uintptr_t at = place(a, sp, w);
  sa_span *taken = sp;
  if (at > sp->base) {
    taken = split(a, sp, at); /* sp keeps the part before, and goes back */
    if (taken == NULL) {
      taken = sp;
    } else {
      starts_within(sp, sp);
      free_remove(a, taken);
      free_insert(a, sp);
    }
  }
  if (taken->size > w.need) (void)split(a, taken, taken->base + w.need);
  marks_clear(a, taken);
  taken->nstarts = 0;
  return taken;
}

/* ------------------------------------------------------------------------
 * Runs: growth, joining, cutting
 * ---------------------------------------------------------------------- */

static void name_pages(sa_arena *a, sa_run *r, uintptr_t from, uintptr_t to) {
  if (to <= from) return;
  sa__pagemap_set(a, from, to - from, &r->hdr);
  sa__hook(SA_HOOK_RUN_PAGES_NAMED, r);
}

/* The page map names r over [lo, hi) of it, whose spans start at first,
 * but for the pages of superblocks carved in them: those keep naming
 * their superblock, not even for a moment the run, since a free of one of
 * their blocks reads its page without a lock (it would take a block for a
 * span, and fail). */
static void pagemap_name_run(sa_arena *a, sa_run *r, uintptr_t lo, uintptr_t hi,
                             const sa_span *first) {
  uintptr_t from = lo;
  for (const sa_span *sp = first; sp != NULL && sp->base < hi; sp = sp->next) {
    if (sp->holder == NULL) continue;
    name_pages(a, r, from, sp->base);
    from = sp->base + sp->size;
  }
  name_pages(a, r, from, hi);
}

/* lo and hi (mapped just above lo) become one run: the smaller one's
 * spans and page map entries move, so a small growth next to a large run
 * costs what it maps. Returns the run that stays. */
static sa_run *run_join(sa_arena *a, sa_run *lo, sa_run *hi) {
  bool keep_lo = lo->hdr.size >= hi->hdr.size;
  sa_run *keep = keep_lo ? lo : hi, *gone = keep_lo ? hi : lo;
  for (sa_span *sp = gone->first; sp != NULL; sp = sp->next) sp->run = keep;
  uintptr_t gone_lo = gone->hdr.base, gone_hi = gone->hdr.base + gone->hdr.size;
  const sa_span *gone_first = gone->first;
  sa_chunk **tail = &lo->hdr.chunks;
  while (*tail != NULL) tail = &(*tail)->next;
  *tail = hi->hdr.chunks;
  sa_chunk *chunks = lo->hdr.chunks;
  if (lo->last != NULL && hi->first != NULL) {
    lo->last->next = hi->first;
    hi->first->prev = lo->last;
  }
  sa_span *first = lo->first != NULL ? lo->first : hi->first;
  sa_span *last = hi->last != NULL ? hi->last : lo->last;
  keep->hdr.base = lo->hdr.base;
  keep->hdr.size = lo->hdr.size + hi->hdr.size;
  keep->hdr.chunks = chunks;
  keep->first = first;
  keep->last = last;
  run_unlink(a, gone);
  gone->hdr.chunks = NULL;
  run_put(a, gone);
  pagemap_name_run(a, keep, gone_lo, gone_hi, gone_first);
  return keep;
}

/* A place to grow: `size` bytes below `edge` (down), above it, or a
 * fresh run placed high; up to `room` bytes fit there. */
typedef enum grow_dir_e { GROW_DOWN, GROW_UP, GROW_FRESH } grow_dir;
typedef struct growth_s {
  grow_dir dir;
  uintptr_t edge; /* down: where the mapping ends; up: where it starts */
  size_t size;    /* bytes the request needs mapped */
  size_t room;    /* free reserved bytes there (fresh: any) */
} growth;

/* The bytes of a run's end span that w can use if it is free: an aligned
 * request only whole granules (runs start and end at granule boundaries). */
static size_t edge_use(const sa_arena *a, const sa_span *sp, want w) {
  if (sp == NULL || !is_free(sp)) return 0;
  return w.align != 0 ? sp->size & ~(w.align - 1) : sp->size;
}

/* Where to map so that a free span for w results, mapping as little as
 * possible: above or below a run, next to its free end span; the whole gap
 * between two runs when their free ends and the gap together are enough;
 * or a fresh run. Ties go to the lowest run, and upwards (spans are placed
 * at the lowest address, so a run's free rest lies at its top). */
/* The granules to map so that have free bytes become need; SIZE_MAX when
 * have is enough already (best_fit's job, not growth's). */
static size_t missing(size_t need, size_t have, size_t gran) {
  return have < need ? round_up(need - have, gran) : SIZE_MAX;
}

static growth plan_growth(const sa_arena *a, want w) {
  size_t g = a->gran, need = w.need;
  growth best = {GROW_FRESH, 0, round_up(need, g), SIZE_MAX};
#define BETTER(m) ((m) < best.size || ((m) == best.size && best.dir == GROW_FRESH))
#define BETTER_UP(m) (BETTER(m) || ((m) == best.size && best.dir == GROW_DOWN))
  for (const sa_run *r = a->spans.runs; r != NULL; r = r->next) {
    uintptr_t lo = r->hdr.base, hi = lo + r->hdr.size;
    size_t above = sa__va_free_above(a, hi), m = missing(need, edge_use(a, r->last, w), g);
    if (m <= above && BETTER_UP(m)) best = (growth){GROW_UP, hi, m, above};
    size_t below = sa__va_free_below(a, lo);
    m = missing(need, edge_use(a, r->first, w), g);
    if (m <= below && BETTER(m)) {
      best = (growth){GROW_DOWN, lo, m, below};
    } else if (below > 0 && BETTER(below) && r->prev != NULL &&
               r->prev->hdr.base + r->prev->hdr.size == lo - below &&
               edge_use(a, r->prev->last, w) + below + edge_use(a, r->first, w) >= need) {
      best = (growth){GROW_DOWN, lo, below, below}; /* the gap, exactly */
    }
  }
#undef BETTER
#undef BETTER_UP
  return best;
}

static size_t unmap_free(sa_arena *a, size_t bytes, uintptr_t keep_lo, uintptr_t keep_hi,
                         bool wait);

/* The reshape decision: the bytes to unmap elsewhere so that mapping size
 * more, for a request of request bytes, stays within limit physical bytes
 * (cached chunks count as held). 0 when it fits, or when the last look for
 * free memory found too little and no span was freed since (decided
 * without a scan). Under the footprint target, also 0 for a request that
 * takes live bytes past their highest so far: that growth is demand, and
 * the target rises with it (the free memory a reshape would take is what
 * the climb to the new peak reuses next; on the PyTorch trace reshaping
 * there remapped GiBs to gain 0.1%); otherwise no more than the remapping
 * ledger allows (physical.c), which bounds the churn of a workload whose
 * shapes keep changing (RMM's random allocations up to 4 GiB). */
static size_t reshape_bytes(const sa_arena *a, size_t size, size_t request, size_t limit) {
  size_t cached = a->physical.cache_bytes, held = a->physical.bytes;
  if (cached >= size || held + (size - cached) <= limit) return 0;
  if (a->spans.reshape_futile == a->spans.frees + 1) return 0;
  size_t u = held + (size - cached) - (limit > held ? limit : held);
  if (u > size - cached) u = size - cached;
  size_t allowed = sa__physical_remap_allowance(a, limit);
  if (allowed != SIZE_MAX) {
    int64_t live = atomic_load_explicit(&a->stats.xlive_bytes, memory_order_relaxed);
    if (live + (int64_t)request > atomic_load_explicit(&a->stats.xlive_peak, memory_order_relaxed))
      return 0;
    allowed &= ~(a->gran - 1);
    if (u > allowed) u = allowed;
  }
  size_t free_whole = a->spans.free_bytes & ~(a->gran - 1); /* at most */
  return u < free_whole ? u : free_whole;
}

/* Map [at, at + size) as a run of one free span and join it with the runs
 * it touches; returns the free span that now holds it (out of the index).
 * On failure the chunks and the range are given back (physical.c keeps
 * what a refused unwind left mapped). */
static sa_status map_run(sa_arena *a, uintptr_t at, size_t size, sa_chunk *chunks,
                         sa_span **out) {
  sa_run *r = run_new(a);
  sa_span *sp = r != NULL ? span_new(a) : NULL;
  if (sp == NULL) {
    if (r != NULL) run_put(a, r);
    sa__physical_return(a, chunks);
    sa__va_free(a, at, size);
    return SA_ERR_OUT_OF_MEMORY;
  }
  sa_status st = sa__physical_map_at(a, at, size, chunks);
  if (st != SA_OK) {
    span_put(a, sp);
    run_put(a, r);
    return st;
  }
  r->hdr.base = at;
  r->hdr.size = size;
  r->hdr.chunks = chunks;
  sp->base = at;
  sp->size = size;
  span_link_after(r, NULL, sp);
  sa__pagemap_set(a, at, size, &r->hdr);
  run_link(a, r);
  if (r->next != NULL && r->next->hdr.base == at + size) r = run_join(a, r, r->next);
  if (r->prev != NULL && r->prev->hdr.base + r->prev->hdr.size == r->hdr.base)
    (void)run_join(a, r->prev, r);
  *out = coalesce(a, sp);
  return SA_OK;
}

/* The bytes to map beyond what a growth for a request needs (missing):
 * on a climb to a new live peak, a little, within the footprint target. A climb (a
 * training step's first forward pass) is a run of growths, and each costs
 * a chunk whatever its size (physical.c), so memory mapped ahead serves
 * the next requests of the climb without a driver call. What the last
 * growth of a climb maps ahead may stay unused at the peak, so it is at
 * most 1/SA_AHEAD_SHARE of what is held (at least a granule) and within
 * the target: PyTorch's trace of examples/torch/train.py then peaks at
 * 23,668 MiB as with no mapping ahead (up to the target: 23,758, above
 * expandable segments' 23,677), and the transformer trace grows 340 times
 * instead of 410. Not under a budget or a
 * reserve_limit, which are limits the user set, not targets to fill, nor
 * with SA_FLAG_EXACT_GROWTH. */
static size_t map_ahead(const sa_arena *a, size_t request, size_t missing) {
  if (a->physical.budgeted || a->cfg.reserve_limit_bytes != 0 || (a->cfg.flags & SA_FLAG_EXACT_GROWTH))
    return 0;
  int64_t live = atomic_load_explicit(&a->stats.xlive_bytes, memory_order_relaxed);
  if (live + (int64_t)request <= atomic_load_explicit(&a->stats.xlive_peak, memory_order_relaxed))
    return 0;
  size_t held = a->physical.bytes + missing, target = sa__physical_soft_limit(a);
  if (held >= target) return 0;
  size_t most = held / SA_AHEAD_SHARE > a->gran ? held / SA_AHEAD_SHARE : a->gran;
  size_t ahead = target - held < most ? target - held : most;
  return ahead & ~(a->gran - 1);
}

/* Grow so that a free span for w exists, holding no more than limit
 * physical bytes in all; returns it out of the index. */
static sa_status grow(sa_arena *a, want w, size_t limit, sa_span **out) {
  growth g = plan_growth(a, w);
  size_t u = reshape_bytes(a, g.size, w.need, limit);
  if (u > 0) {
    /* Past the limit: free memory elsewhere whose work completed is
     * unmapped and stitched here instead. The free span the growth extends
     * stays (unmapping it would only map it again). */
    uintptr_t lo = g.dir == GROW_UP ? g.edge - 1 : g.dir == GROW_DOWN ? g.edge - g.room - 1 : 0;
    uintptr_t hi = g.dir == GROW_UP ? g.edge + g.room + 1 : g.dir == GROW_DOWN ? g.edge + 1 : 0;
    if (unmap_free(a, u, lo, hi, false) < u) a->spans.reshape_futile = a->spans.frees + 1;
  }
  size_t ahead = w.exact ? 0 : map_ahead(a, w.need, g.size);
  /* A fresh run maps ahead at most its request again: it lies apart from
   * the run the climb was extending (dataframe: 1.155 x peak live against
   * 1.469 with no such bound). */
  size_t room = g.dir == GROW_FRESH ? SIZE_MAX : g.room;
  size_t ahead_room = g.dir == GROW_FRESH ? g.size : room - g.size;
  if (ahead > ahead_room) ahead = ahead_room & ~(a->gran - 1);
  size_t total;
  sa_chunk *chunks;
  sa_status st = sa__physical_gather(a, g.size, ahead, room, limit, &chunks, &total);
  if (st == SA_ERR_OUT_OF_MEMORY && ahead > 0) /* the device had less: what is missing */
    st = sa__physical_gather(a, g.size, 0, room, limit, &chunks, &total);
  if (st != SA_OK) return st;
  uintptr_t at = g.dir == GROW_DOWN ? g.edge - total : g.edge;
  if (g.dir == GROW_FRESH)
    st = sa__va_alloc_middle(a, total, &at);
  else
    st = sa__va_claim(a, at, total);
  if (st != SA_OK) {
    sa__physical_return(a, chunks);
    return st;
  }
  sa_span *sp;
  st = map_run(a, at, total, chunks, &sp);
  if (st != SA_OK) return st;
  if (place(a, sp, w) == 0) { /* the join lacked memory for the marks */
    free_insert(a, sp);
    return SA_ERR_OUT_OF_MEMORY;
  }
  *out = sp;
  return SA_OK;
}

sa_status sa__span_prefill(sa_arena *a, size_t size) {
  want w = {round_up(size, a->gran), 0, true};
  pthread_mutex_lock(&a->lock);
  sa_span *sp;
  sa_status st = grow(a, w, a->physical.cap, &sp);
  if (st == SA_OK) free_insert(a, sp); /* free, no marks: nothing used it */
  SA_VALIDATE(sa__span_check(a));
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* ------------------------------------------------------------------------
 * Allocation and free
 * ---------------------------------------------------------------------- */

/* Make the free span *sp (out of the index) safe for sa's stream and carve
 * w from it into *sp. If a wait fails, *sp goes back to the index with
 * every mark still on it. */
static sa_status take_settled(sa_arena *a, sa_span **sp, sa_stream_arena *sa, want w) {
  sa_status st = settle(a, *sp, sa);
  if (st != SA_OK) {
    free_insert(a, *sp);
    return st;
  }
  *sp = carve(a, *sp, w);
  return SA_OK;
}

sa_status sa__span_alloc(sa_arena *a, sa_stream_arena *sa, size_t size, size_t limit,
                         void **out) {
  if (size > a->range.size) return SA_ERR_OUT_OF_MEMORY;
  want w = placement(a, size);
  pthread_mutex_lock(&a->lock);
  sa_status st = sa__live_reserve(a);
  sa_span *sp = NULL;
  if (st == SA_OK) {
    sp = best_fit(a, w, sa);
    if (sp != NULL)
      free_remove(a, sp);
    else
      st = grow(a, w, limit, &sp);
  }
  if (st == SA_OK) st = take_settled(a, &sp, sa, w);
  if (st == SA_OK) {
    sp->owner = sa;
    atomic_fetch_add_explicit(&sa->xspans, 1, memory_order_relaxed); /* keeps sa alive */
    sp->request = size;
    atomic_store_explicit(&sp->xstate, SA_BLOCK_LIVE, memory_order_release);
    sa__live_insert(a, sp);
    a->spans.nlive++;
    *out = (void *)sp->base;
  }
  SA_VALIDATE_PACED(&a->spans.pace, sa__span_check(a));
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* Descriptors, with room for nmarks marks, for carve's two splits. Without
 * one carve takes more than asked, from the free span's start: fine for a
 * span, but a superblock must start and end on a page (its pages name it,
 * and only its). */
static bool spares_for_carve(sa_arena *a, unsigned nmarks) {
  sa_span *got[2] = {NULL, NULL};
  bool ok = true;
  for (int i = 0; i < 2 && ok; i++)
    ok = (got[i] = span_new(a)) != NULL && marks_reserve(got[i], nmarks);
  for (int i = 1; i >= 0; i--)
    if (got[i] != NULL) span_put(a, got[i]);
  return ok;
}

sa_status sa__span_take_superblock(sa_arena *a, sa_stream_arena *sa, size_t size,
                                   sa_desc *holder, sa_span **out) {
  want w = {size, (size_t)1 << a->range.page_shift, true};
  *out = NULL;
  sa_span *sp = best_fit(a, w, sa);
  if (sp == NULL || !spares_for_carve(a, sp->nmarks)) return SA_OK;
  free_remove(a, sp);
  sa_status st = take_settled(a, &sp, sa, w);
  if (st != SA_OK) return st;
  sp->owner = NULL; /* a name only, and no stream's: sa__span_forget_doomed */
  sp->request = 0;
  sp->holder = holder;
  atomic_store_explicit(&sp->xstate, SA_BLOCK_LIVE, memory_order_relaxed);
  sa__pagemap_set(a, sp->base, sp->size, holder);
  *out = sp;
  return SA_OK;
}

void sa__span_give_back_superblock(sa_arena *a, sa_span *sp) {
  sa__pagemap_set(a, sp->base, sp->size, &sp->run->hdr);
  sp->holder = NULL;
  marks_clear(a, sp);
  sp->nstarts = 0;
  atomic_store_explicit(&sp->xstate, SA_BLOCK_FREE, memory_order_relaxed);
  free_insert(a, coalesce(a, sp));
  a->spans.reshape_futile = 0; /* free span memory, as a span freed: worth another look */
}

/* Why p, in the reserved range, is not a live span's start: a span freed
 * before (it may have merged into a larger free span), or not a start. */
static sa_status not_live(const sa_arena *a, uintptr_t p) {
  sa_desc *d = sa__pagemap_get(&a->range, p);
  if (d == NULL || d->kind != SA_DESC_RUN) return SA_ERR_INVALID_POINTER;
  for (const sa_span *sp = ((const sa_run *)d)->first; sp != NULL; sp = sp->next) {
    if (p - sp->base >= sp->size) continue;
    return is_free(sp) && starts_has(sp, p) ? SA_ERR_DOUBLE_FREE : SA_ERR_INVALID_POINTER;
  }
  return SA_ERR_INVALID_POINTER;
}

sa_status sa__span_find(sa_arena *a, uintptr_t p, sa_span **out) {
  pthread_mutex_lock(&a->lock);
  *out = sa__live_find(a, p);
  sa_status st = *out != NULL ? SA_OK : not_live(a, p);
  pthread_mutex_unlock(&a->lock);
  return st;
}

sa_status sa__span_free(sa_arena *a, uintptr_t p, sa_stream_arena *freer,
                        const sa_stream *recorded, unsigned nrecorded,
                        bool *needs_records, size_t *request) {
  pthread_mutex_lock(&a->lock);
  sa_span *sp = sa__live_find(a, p);
  sa_status st = sp != NULL ? SA_OK : not_live(a, p);
  if (st == SA_OK && needs_records != NULL &&
      atomic_load_explicit(&sp->xstate, memory_order_relaxed) == SA_BLOCK_RECORDED) {
    *needs_records = true; /* the caller takes them (record.c) and comes back */
    pthread_mutex_unlock(&a->lock);
    return SA_OK;
  }
  if (st == SA_OK) *request = sp->request;
  if (st == SA_OK && !marks_reserve(sp, 1 + nrecorded)) st = SA_ERR_OUT_OF_MEMORY;
  /* A mark on the freeing stream's timeline, and an event on every
   * recorded stream. A failure leaves the span live: the tickets taken
   * mark nothing, the events go back. */
  if (st == SA_OK) {
    sa_mark m = {freer, 0, NULL};
    st = sa__timeline_mark(a, freer, &m.ticket);
    if (st == SA_OK) marks_add(a, sp, m);
  }
  for (unsigned i = 0; st == SA_OK && i < nrecorded; i++) {
    sa_mark m = {NULL, 0, NULL};
    st = mark_event_record(a, recorded[i], &m.recorded);
    if (st == SA_OK) marks_add(a, sp, m);
  }
  if (st != SA_OK) {
    if (sp != NULL) marks_clear(a, sp);
    SA_VALIDATE_PACED(&a->spans.pace, sa__span_check(a));
    pthread_mutex_unlock(&a->lock);
    return st;
  }
  SA_ASSERT(sp->holder == NULL && a->spans.nlive > 0);
  sa__live_remove(a, sp);
  a->spans.nlive--;
  a->spans.frees++;
  atomic_fetch_sub_explicit(&sp->owner->xspans, 1, memory_order_release);
  sp->owner = freer; /* from now on only a name (sa__span_forget_doomed) */
  sp->nstarts = 0;
  starts_add(sp, sp->base);
  atomic_store_explicit(&sp->xstate, SA_BLOCK_FREE, memory_order_relaxed);
  free_insert(a, coalesce(a, sp));
  SA_VALIDATE_PACED(&a->spans.pace, sa__span_check(a));
  pthread_mutex_unlock(&a->lock);
  return SA_OK;
}

/* ------------------------------------------------------------------------
 * Unmapping free memory (under a budget, trims) and destroy
 * ---------------------------------------------------------------------- */

/* Unmap [lo, hi) of run r: whole chunks inside the free span f (in the
 * index, its marks complete). The run splits around the hole; f keeps what
 * lies below it, a new span what lies above; the page map and the reserved
 * space follow. *done is false, and nothing changed, if there was no memory
 * for the descriptors or the driver refused. Returns the run above the
 * hole, if any. */
static sa_run *cut(sa_arena *a, sa_run *r, sa_span *f, uintptr_t lo, uintptr_t hi,
                   bool *done) {
  uintptr_t end = r->hdr.base + r->hdr.size, f_end = f->base + f->size;
  sa_span *f_hi = f_end > hi ? span_new(a) : NULL;
  sa_run *up = hi < end ? run_new(a) : NULL;
  *done = !(f_end > hi && (f_hi == NULL || !marks_reserve(f_hi, f->nmarks))) &&
          !(hi < end && up == NULL) && a->drv->ops->unmap(a->drv, lo, hi - lo) == SA_OK;
  if (!*done) {
    if (f_hi != NULL) span_put(a, f_hi);
    if (up != NULL) run_put(a, up);
    return NULL;
  }
  free_remove(a, f);
  /* Chunks below the hole stay, those in it go to the cache, those above
   * move to the new run. */
  sa_chunk **link = &r->hdr.chunks, *hole = NULL, **hole_tail = &hole;
  uintptr_t at = r->hdr.base;
  for (; *link != NULL && at < lo; link = &(*link)->next) at += (*link)->size;
  while (*link != NULL && at < hi) {
    sa_chunk *c = *link;
    *link = c->next;
    at += c->size;
    c->next = NULL;
    *hole_tail = c;
    hole_tail = &c->next;
  }
  sa__physical_return(a, hole);
  sa_chunk *above_chunks = *link;
  *link = NULL;
  /* Spans: [first .. f] below, [f_hi, f->next .. last] above. */
  sa_span *below = f->prev, *above = f->next, *old_last = r->last;
  sa_span *low_tail = below, *high_head = above;
  if (f_hi != NULL) {
    marks_copy(f_hi, f);
    f_hi->owner = f->owner;
    f_hi->base = hi;
    f_hi->size = f_end - hi;
    starts_within(f_hi, f);
    f_hi->next = above;
    if (above != NULL) above->prev = f_hi;
    high_head = f_hi;
  }
  if (f->base < lo) {
    f->size = lo - f->base;
    starts_within(f, f);
    low_tail = f;
  }
  if (low_tail != NULL) low_tail->next = NULL;
  r->last = low_tail;
  if (low_tail == NULL) r->first = NULL;
  if (up != NULL) {
    high_head->prev = NULL;
    up->hdr.base = hi;
    up->hdr.size = end - hi;
    up->hdr.chunks = above_chunks;
    up->first = high_head;
    up->last = old_last == f ? f_hi : old_last;
    for (sa_span *sp = high_head; sp != NULL; sp = sp->next) sp->run = up;
    pagemap_name_run(a, up, hi, end, high_head);
  }
  if (low_tail == f)
    free_insert(a, f);
  else
    span_put(a, f);
  if (f_hi != NULL) free_insert(a, f_hi);
  sa__pagemap_set(a, lo, hi - lo, NULL);
  sa__va_free(a, lo, hi - lo);
  r->hdr.size = lo - r->hdr.base;
  if (up != NULL) {
    up->prev = r;
    up->next = r->next;
    if (r->next != NULL) r->next->prev = up;
    r->next = up;
  }
  if (r->hdr.size == 0) {
    run_unlink(a, r);
    run_put(a, r);
  }
  return up;
}

/* The chunks (chunks, each mapped whole: physical.c) wholly inside the free span sp: the
 * highest of them that hold at least bytes, or all; false if none. */
static bool whole_chunks(const sa_span *sp, size_t bytes, uintptr_t *lo, uintptr_t *hi) {
  uintptr_t end = sp->base + sp->size, at = sp->run->hdr.base;
  const sa_chunk *c = sp->run->hdr.chunks;
  for (; c != NULL && at < sp->base; c = c->next) at += c->size; /* not wholly inside */
  const sa_chunk *first = c;
  *lo = at;
  for (; c != NULL && at + c->size <= end; c = c->next) at += c->size;
  *hi = at;
  if (*hi == *lo) return false;
  /* From the top: drop chunks at the bottom while the rest holds bytes. */
  for (c = first; *lo + c->size < *hi && *hi - (*lo + c->size) >= bytes; c = c->next)
    *lo += c->size;
  return true;
}

/* Unmap up to bytes (SIZE_MAX: all) of free span memory whose work is done
 * (with wait: after waiting), none of a span that overlaps [keep_lo,
 * keep_hi): the whole chunks (chunks, each mapped whole: physical.c) inside free spans, the
 * smallest spans first. A small free span is what best fit can use least;
 * a large one is a place where a later request fits without remapping.
 * From a span, its highest chunks: what stays free stays at its low end,
 * where best fit places first. Returns the bytes unmapped. */
static size_t unmap_free(sa_arena *a, size_t bytes, uintptr_t keep_lo, uintptr_t keep_hi,
                         bool wait) {
  size_t unmapped = 0;
  sa_span *next;
  for (sa_span *sp = sa__fit_ceiling(a, a->gran, 0); sp != NULL && unmapped < bytes; sp = next) {
    next = sa__fit_ceiling(a, sp->size, sp->base + 1); /* before sp changes */
    if (sp->base < keep_hi && keep_lo < sp->base + sp->size) continue;
    uintptr_t lo, hi;
    if (!whole_chunks(sp, bytes - unmapped, &lo, &hi) || !marks_reached(a, sp, wait)) continue;
    bool done;
    (void)cut(a, sp->run, sp, lo, hi, &done);
    if (done) unmapped += hi - lo;
  }
  return unmapped;
}

size_t sa__span_unmap_free(sa_arena *a, size_t need, bool wait) {
  size_t cached = a->physical.cache_bytes;
  if (need > 0 && cached >= need) return 0;
  return unmap_free(a, need > 0 ? need - cached : SIZE_MAX, 0, 0, wait);
}

void sa__span_forget_doomed(sa_arena *a) {
  /* Marks whose work is known done go (as a merge drops them): a doomed
   * stream arena that only those named is free to go. One walk for all. */
  for (sa_run *r = a->spans.runs; r != NULL; r = r->next)
    for (sa_span *sp = r->first; sp != NULL; sp = sp->next) {
      if (!is_free(sp)) continue;
      marks_prune_known(a, sp);
      for (unsigned i = 0; i < sp->nmarks; i++)
        if (sp->marks[i].stream != NULL) sp->marks[i].stream->doomed = false;
    }
  for (sa_run *r = a->spans.runs; r != NULL; r = r->next)
    for (sa_span *sp = r->first; sp != NULL; sp = sp->next)
      if (is_free(sp) && sp->owner != NULL && sp->owner->doomed) sp->owner = NULL;
}

size_t sa__span_clean_bytes(const sa_arena *a) {
  size_t n = 0;
  for (const sa_run *r = a->spans.runs; r != NULL; r = r->next)
    for (const sa_span *sp = r->first; sp != NULL; sp = sp->next) {
      bool clean = is_free(sp);
      for (unsigned i = 0; clean && i < sp->nmarks; i++) clean = sa__mark_known_done(&sp->marks[i]);
      if (clean) n += sp->size;
    }
  return n;
}

/* ------------------------------------------------------------------------
 * Invariants
 * ---------------------------------------------------------------------- */

static const char SPAN[] = "span";

/* A free span's marks: a free's names a ticket its timeline handed out, a
 * recorded one an event some mark still counts. */
static void marks_check(const sa_span *sp) {
  SA_CHECK(SPAN, sp->nmarks <= sp->marks_cap, "nmarks <= marks_cap");
  for (unsigned i = 0; i < sp->nmarks; i++) {
    const sa_mark *m = &sp->marks[i];
    if (m->recorded != NULL) {
      SA_CHECK(SPAN, m->recorded->refs > 0, "a recorded mark has refs > 0");
    } else {
      SA_CHECK(SPAN, m->stream != NULL && m->ticket > 0 && m->ticket <= m->stream->timeline.next,
               "a free's mark names a ticket its timeline handed out");
    }
  }
}

/* One span of run r, whose previous span is prev; counts what it is. */
static void span_check_one(const sa_arena *a, const sa_run *r, const sa_span *sp,
                           const sa_span *prev, size_t *free_bytes, size_t *nfree,
                           size_t *nlive) {
  SA_CHECK(SPAN, sp->run == r, "a span's run pointer is its run");
  SA_CHECK(SPAN, sp->prev == prev, "prev and next links agree");
  SA_CHECK(SPAN, sp->size > 0 && sp->size % SA_SPAN_QUANTUM == 0,
           "a span's size is a positive multiple of SA_SPAN_QUANTUM");
  if (is_free(sp)) {
    SA_CHECK(SPAN, sp->holder == NULL, "a free span holds no superblock");
    SA_CHECK(SPAN, sa__fit_ceiling(a, sp->size, sp->base) == sp,
             "a free span is in the fit index");
    SA_CHECK(SPAN, sa__pagemap_get(&a->range, sp->base) == &r->hdr, "a free span's page names its run");
    marks_check(sp);
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
  SA_CHECK(SPAN, sa__pagemap_get(&a->range, sp->base) == &r->hdr, "a live span's page names its run");
  (*nlive)++;
}

size_t sa__span_check(const sa_arena *a) {
  /* The fit index first: a damaged treap is named as such, not as a span
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
  return visited;
}

sa_status sa__span_fini(sa_arena *a) {
  sa_status first = SA_OK;
  for (sa_run *r = a->spans.all_runs; r != NULL; r = r->all_next) {
    for (sa_span *sp = r->first; sp != NULL; sp = sp->next) {
      if (!is_free(sp)) continue;
      (void)marks_reached(a, sp, true);
      marks_clear(a, sp); /* a failed wait: the driver's error says so */
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
  a->spans.spare_spans = a->spans.fit_root = NULL;
  sa__live_fini(a);
  return first;
}
