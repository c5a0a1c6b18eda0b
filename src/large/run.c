/* Runs: growth, joining, cutting (run.h).
 *
 * A run is a contiguous mapped range tiled by spans; the page map names it
 * over its pages, but for those of superblocks carved in its free spans.
 * When no free span fits a request, the arena grows (plan_growth): it maps
 * only what is missing at an end of a run, next to the free span there, or
 * fills the gap between two runs, or starts a run in the middle of free
 * reserved space, and joins the runs the new mapping touches. Past the
 * caller's limit it first reshapes (reshape_bytes): free span memory whose
 * work completed is unmapped elsewhere (sa__run_unmap_free, which cuts
 * runs around the holes) and the growth maps those granules where the
 * request needs them.
 */
#include <stdlib.h>

#include "run.h"
#include "../arena.h"
#include "../base/base.h"
#include "../base/hook.h"
#include "../driver/driver.h"
#include "../vm/physical.h"
#include "../vm/va_space.h"
#include "free_span.h"
#include "mark.h"
#include "span.h"
#include "span_index.h"
#include "timeline.h"

/* ------------------------------------------------------------------------
 * Run descriptors
 * ---------------------------------------------------------------------- */

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
 * request only whole granules (runs start and end at granule boundaries).
 * None of a span that sarena's stream cannot use (another stream's
 * pending mark: map_run keeps the growth apart from it). */
static size_t edge_use(const sa_arena *a, const sa_span *sp, sa_want w,
                       const sa_stream_arena *sarena) {
  if (sp == NULL || !sa__span_is_free(sp)) return 0;
  if (sarena != NULL && !sa__marks_waitable_for(sp, sarena)) return 0;
  return w.align != 0 ? sp->size & ~(w.align - 1) : sp->size;
}

/* The granules to map so that have free bytes become need; SIZE_MAX when
 * have is enough already (best fit's job, not growth's). */
static size_t missing(size_t need, size_t have, size_t gran) {
  return have < need ? sa__round_up(need - have, gran) : SIZE_MAX;
}

/* Is mapping m bytes in direction dir better than best? Fewer bytes win;
 * on a tie, next to a run beats a fresh run, and upwards beats downwards
 * (spans are placed at the lowest address, so a run's free rest lies at
 * its top, where the next growth up extends it). */
static bool better(const growth *best, size_t m, grow_dir dir) {
  if (m != best->size) return m < best->size;
  return best->dir == GROW_FRESH || (dir == GROW_UP && best->dir == GROW_DOWN);
}

/* Does r end with a graph pool's segment, free memory at most above it?
 * Then the room above r is the pool's: its segment grows in place there
 * (sa__span_extend), where memory the arena mapped right above would make
 * it take a segment of its own, the free top of the first one left over
 * (a compiled model's optimizer state above its CUDA graph pool's segment:
 * docs/TORCH.md). */
static bool pools_room_above(const sa_run *r) {
  const sa_span *top = r->last;
  if (top != NULL && sa__span_is_free(top)) top = top->prev;
  return top != NULL && top->pool_segment;
}

/* Where to map so that a free span for w results, mapping as little as
 * possible: above or below a run, next to its free end span; the whole gap
 * between two runs when their free ends and the gap together are enough;
 * or a fresh run. Ties go to the lowest run (the first that wins). Never
 * into the room above a run that ends with a pool's segment
 * (pools_room_above): elsewhere it maps at most that run's free top more,
 * which stays free for the pool's growth. */
static growth plan_growth(const sa_arena *a, sa_want w, const sa_stream_arena *sarena) {
  size_t g = a->gran, need = w.need;
  growth best = {GROW_FRESH, 0, sa__round_up(need, g), SIZE_MAX};
  for (const sa_run *r = a->spans.runs; r != NULL; r = r->next) {
    uintptr_t lo = r->hdr.base, hi = lo + r->hdr.size;
    /* Up: what its free last span lacks, mapped above it. */
    size_t above = sa__va_free_above(a, hi), m = missing(need, edge_use(a, r->last, w, sarena), g);
    if (m <= above && !pools_room_above(r) && better(&best, m, GROW_UP))
      best = (growth){GROW_UP, hi, m, above};
    /* Down: what its free first span lacks, mapped below it; else the
     * whole gap down to the run below, if that joins enough free memory.
     * Either closing the gap to a run below whose room is a pool's: no. */
    size_t below = sa__va_free_below(a, lo);
    bool touches_prev = below > 0 && r->prev != NULL &&
                        r->prev->hdr.base + r->prev->hdr.size == lo - below;
    bool prev_pools = touches_prev && pools_room_above(r->prev);
    m = missing(need, edge_use(a, r->first, w, sarena), g);
    bool gap_joins = touches_prev && !prev_pools &&
                     edge_use(a, r->prev->last, w, sarena) + below +
                             edge_use(a, r->first, w, sarena) >= need;
    if (m <= below && !(prev_pools && m == below) && better(&best, m, GROW_DOWN))
      best = (growth){GROW_DOWN, lo, m, below};
    else if (gap_joins && better(&best, below, GROW_DOWN))
      best = (growth){GROW_DOWN, lo, below, below}; /* the gap, exactly */
  }
  return best;
}

/* The reshape decision: the bytes to unmap elsewhere so that mapping size
 * more, for a request of request bytes, stays within limit physical bytes
 * (cached chunks count as held). 0 when it fits, or when the last look for
 * free memory found too little and no span was freed since (decided
 * without a scan). Under the footprint target, also 0 for a request that
 * takes live bytes past their highest so far: that growth is demand, and
 * the target rises with it (the free memory a reshape would take is what
 * the climb to the new peak reuses next: See Note [Reshape on a climb]);
 * otherwise only where the remapping ledger (physical.c), which bounds the
 * churn of a workload whose shapes keep changing, allows all of it: a
 * reshape cut short still grows past the limit, after paying for the
 * unmaps as well (See Note [No partial reshape]). */
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
    if (u > allowed) return 0; /* See Note [No partial reshape] */
  }
  size_t free_whole = a->spans.free_bytes & ~(a->gran - 1); /* at most */
  return u < free_whole ? u : free_whole;
}

/* Make the mapped [at, at + size) a run r of one free span sp (descriptors
 * the caller took) and join it with the runs it touches; returns the free
 * span that now holds it (out of the index), merged with the free spans
 * beside it that sarena's stream can use (NULL: any). */
static sa_span *link_run(sa_arena *a, sa_run *r, sa_span *sp, uintptr_t at, size_t size,
                         sa_chunk *chunks, const sa_stream_arena *sarena) {
  r->hdr.base = at;
  r->hdr.size = size;
  r->hdr.chunks = chunks;
  sp->base = at;
  sp->size = size;
  sa__span_link_after(r, NULL, sp);
  sa__pagemap_set(a, at, size, &r->hdr);
  run_link(a, r);
  if (r->next != NULL && r->next->hdr.base == at + size) r = run_join(a, r, r->next);
  if (r->prev != NULL && r->prev->hdr.base + r->prev->hdr.size == r->hdr.base)
    (void)run_join(a, r->prev, r);
  return sa__free_coalesce(a, sp, sarena);
}

/* Map [at, at + size) as a run of one free span and join it with the runs
 * it touches; returns the free span that now holds it (out of the index),
 * merged with the free spans beside it that sarena's stream can use. On
 * failure the chunks and the range are given back (physical.c keeps what
 * a refused unwind left mapped). */
static sa_status map_run(sa_arena *a, uintptr_t at, size_t size, sa_chunk *chunks,
                         const sa_stream_arena *sarena, sa_span **out) {
  sa_run *r = run_new(a);
  sa_span *sp = r != NULL ? sa__span_new(a) : NULL;
  if (sp == NULL) {
    if (r != NULL) run_put(a, r);
    sa__physical_return(a, chunks);
    sa__va_free(a, at, size);
    return SA_ERR_OUT_OF_MEMORY;
  }
  sa_status st = sa__physical_map_at(a, at, size, chunks);
  if (st != SA_OK) {
    sa__span_put(a, sp);
    run_put(a, r);
    return st;
  }
  *out = link_run(a, r, sp, at, size, chunks, sarena);
  return SA_OK;
}

/* The bytes to map beyond what a growth for a request needs (missing):
 * on a climb to a new live peak, a little, within the footprint target. A
 * climb (a training step's first forward pass) is a run of growths, and
 * each costs a chunk whatever its size (physical.c), so memory mapped
 * ahead serves the next requests of the climb without a driver call. What
 * the last growth of a climb maps ahead may stay unused at the peak, so it
 * is at most a share of what is held (sa__physical_ahead_share: 1/512 at
 * the default footprint target, more for a larger one) and within the
 * target, which keeps the default's peak where it is with none mapped
 * ahead (See Note [Mapping ahead]). It is at least half the target's
 * floor (climb_most), which the target allows over any peak: at 1/512
 * alone a climb below a few GiB grows a granule or two at a time, a
 * chunk's fixed cost each. Not under a budget or a reserve_limit, which
 * are limits the user set, not targets to fill, nor with
 * SA_FLAG_EXACT_GROWTH. */
#define SA_AHEAD_SHARE_SHIFT 9 /* 1/512: the default target's share (physical.c) */

/* share, the most a climb maps ahead, raised to half the target's floor. */
static size_t climb_most(const sa_arena *a, size_t share) {
  size_t least = a->physical.target_floor_bytes / 2; /* the floor is whole granules, even */
  return share > least ? share : least;
}

static bool ahead_allowed(const sa_arena *a) {
  return !a->physical.budgeted && a->cfg.reserve_limit_bytes == 0 &&
         !(a->cfg.flags & SA_FLAG_EXACT_GROWTH);
}

static bool climbs(const sa_arena *a, size_t request) {
  int64_t live = atomic_load_explicit(&a->stats.xlive_bytes, memory_order_relaxed);
  return live + (int64_t)request >
         atomic_load_explicit(&a->stats.xlive_peak, memory_order_relaxed);
}

/* The bytes a climb maps ahead by the rules above, where mapping ahead is allowed. */
static size_t climb_ahead(const sa_arena *a, size_t missing) {
  size_t held = a->physical.bytes + missing, target = sa__physical_soft_limit(a);
  if (held >= target) return 0;
  size_t most = climb_most(a, sa__physical_ahead_share(a, held));
  size_t ahead = target - held < most ? target - held : most;
  return ahead & ~(a->gran - 1);
}

static size_t map_ahead(const sa_arena *a, size_t request, size_t missing) {
  return ahead_allowed(a) && climbs(a, request) ? climb_ahead(a, missing) : 0;
}

/* The bytes a growth maps beyond its request: a climb's (map_ahead), or
 * SA_AHEAD_BELOW granules for a growth below the live peak of a request
 * of at most SA_AHEAD_SMALL granules, within the limit the growth is
 * given (the footprint target, or more where the arena grows past it after
 * a reshape fell short: sa__physical_gather adds them only below it). Such a
 * growth means that no free span fitted though the memory was held once:
 * the free memory lies in pieces (a reshape past the target stitches some
 * of it here), and the next requests miss the same way; for small ones a
 * growth's fixed cost (a chunk, a map, an access setting) is most of what
 * it costs, and what is mapped ahead serves them or shortens their growth.
 * Unused, it is free memory like any other, which the next reshape may
 * unmap. Larger requests map nothing ahead: a few granules would not serve
 * the next one. See Note [Mapping ahead below the peak] for the figures. */
#define SA_AHEAD_BELOW 4
#define SA_AHEAD_SMALL (2 * SA_AHEAD_BELOW)

static size_t growth_ahead(const sa_arena *a, size_t request, size_t missing) {
  if (!ahead_allowed(a)) return 0;
  if (climbs(a, request)) return climb_ahead(a, missing);
  return request <= SA_AHEAD_SMALL * a->gran ? SA_AHEAD_BELOW * a->gran : 0;
}

/* The range a reshape for g leaves mapped: the free span the growth
 * extends and the room beside it (unmapping it would only map it again),
 * one byte wider each way so that a span ending at the edge overlaps it.
 * Nothing for a fresh run. */
static void growth_keeps(const growth *g, uintptr_t *lo, uintptr_t *hi) {
  switch (g->dir) {
    case GROW_UP:
      *lo = g->edge - 1;
      *hi = g->edge + g->room + 1;
      return;
    case GROW_DOWN:
      *lo = g->edge - g->room - 1;
      *hi = g->edge + 1;
      return;
    case GROW_FRESH:
      break;
  }
  *lo = *hi = 0;
}

typedef enum { UNMAP_DO, UNMAP_DRY } unmap_mode;
static size_t walk_free_chunks(sa_arena *a, size_t bytes, size_t chunks, uintptr_t keep_lo,
                               uintptr_t keep_hi, sa_wait wait, unmap_mode mode);
static size_t unmap_free_chunks(sa_arena *a, size_t bytes, size_t chunks, uintptr_t keep_lo,
                                uintptr_t keep_hi, sa_wait wait);

/* Map g (ahead bytes more where the device has them) within limit; returns
 * the free span that holds the new memory, merged with what sarena's
 * stream can use beside it, out of the index. */
static sa_status map_growth(sa_arena *a, const growth *g, size_t ahead, size_t limit,
                            const sa_stream_arena *sarena, sa_span **out) {
  size_t room = g->dir == GROW_FRESH ? SIZE_MAX : g->room;
  size_t total;
  sa_chunk *chunks;
  sa_status st = sa__physical_gather(a, g->size, ahead, room, limit, &chunks, &total);
  if (st == SA_ERR_OUT_OF_MEMORY && ahead > 0) /* the device had less: what is missing */
    st = sa__physical_gather(a, g->size, 0, room, limit, &chunks, &total);
  if (st != SA_OK) return st;
  uintptr_t at = g->dir == GROW_DOWN ? g->edge - total : g->edge;
  if (g->dir == GROW_FRESH)
    st = sa__va_alloc_middle(a, total, &at);
  else
    st = sa__va_claim(a, at, total);
  if (st != SA_OK) {
    sa__physical_return(a, chunks);
    return st;
  }
  return map_run(a, at, total, chunks, sarena, out);
}

sa_status sa__run_grow_above(sa_arena *a, sa_run *r, size_t need, size_t limit,
                             sa_stream_arena *sarena, sa_span **out) {
  uintptr_t hi = r->hdr.base + r->hdr.size;
  sa_want w = {need, 0, true};
  size_t m = missing(need, edge_use(a, r->last, w, sarena), a->gran);
  size_t above = sa__va_free_above(a, hi);
  if (m == SIZE_MAX || m > above) return SA_ERR_OUT_OF_MEMORY;
  growth g = {GROW_UP, hi, m, above};
  return map_growth(a, &g, 0, limit, sarena, out);
}

sa_status sa__run_grow(sa_arena *a, sa_want w, size_t limit, sa_span_grow grow,
                       sa_stream_arena *sarena, sa_span **out) {
  growth g = plan_growth(a, w, sarena);
  size_t u = reshape_bytes(a, g.size, w.need, limit);
  if (u > 0 && grow == SA_SPAN_NO_RESHAPE) return SA_ERR_OUT_OF_MEMORY;
  if (u > 0) {
    /* Past the limit: free memory elsewhere whose work completed is
     * unmapped and stitched here instead. The grower's own pending spans
     * may be some of it: its stream found idle (the call names it)
     * completed them all, else an event recorded now lets a query see
     * their work done later. */
    if (sarena != NULL) sa__timeline_bring_up_to_date(a, sarena);
    uintptr_t keep_lo, keep_hi;
    growth_keeps(&g, &keep_lo, &keep_hi);
    /* A reshape the free spans cannot cover within the stitching bound
     * would leave the growth past the limit all the same, after paying
     * for its unmaps: it is not begun (See Note [No partial reshape]). */
    size_t most = sa__physical_stitch_limit(a); /* See Note [Stitching bound] */
    if (walk_free_chunks(a, u, most, keep_lo, keep_hi, SA_QUERY, UNMAP_DRY) < u ||
        unmap_free_chunks(a, u, most, keep_lo, keep_hi, SA_QUERY) < u)
      a->spans.reshape_futile = a->spans.frees + 1; /* none again until a span is freed */
  }
  size_t ahead = w.exact ? 0 : growth_ahead(a, w.need, g.size);
  /* A fresh run maps ahead at most its request again: it lies apart from
   * the run the climb was extending, and what it maps ahead may never be
   * used (See Note [Mapping ahead]). */
  size_t ahead_room = g.dir == GROW_FRESH ? g.size : g.room - g.size;
  if (ahead > ahead_room) ahead = ahead_room & ~(a->gran - 1);
  sa_span *sp;
  sa_status st = map_growth(a, &g, ahead, limit, sarena, &sp);
  if (st != SA_OK) return st;
  if (sa__free_place(a, sp, w) == 0) { /* the join lacked memory for the marks */
    sa__free_insert(a, sp);
    return SA_ERR_OUT_OF_MEMORY;
  }
  *out = sp;
  return SA_OK;
}

/* ------------------------------------------------------------------------
 * Mapping ahead in the background (grower.c)
 * ---------------------------------------------------------------------- */

/* The free bytes at the top of r, which a climb extending r takes next. */
static size_t top_room(const sa_run *r) {
  return r->last != NULL && sa__span_is_free(r->last) ? r->last->size : 0;
}

size_t sa__run_ahead_wanted(const sa_arena *a, const sa_span *sp, size_t request,
                            uintptr_t *at) {
  /* At most the default target's share of what is held: the grower keeps
   * that much mapped ahead all along a climb, where a growth leaves its
   * ahead bytes to be used up, so more would stay unused at every peak. */
  size_t ahead = map_ahead(a, request, 0), room = top_room(sp->run);
  size_t most = climb_most(a, a->physical.bytes >> SA_AHEAD_SHARE_SHIFT);
  if (ahead > most) ahead = most;
  const sa_run *r = sp->run;
  /* Only where sp came from the run's top: a climb extends that run, and
   * memory mapped ahead above a run whose holes a request filled would
   * wait there unused, taking the target's room from the growths that
   * need it. */
  bool at_top = sp->next == NULL || (sp->next == r->last && sa__span_is_free(r->last));
  /* Nor for a climb of requests above half of it: the next one would not
   * fit in what the grower maps, and would wait for it before growing. */
  if (!at_top || request > ahead / 2 || room >= ahead || pools_room_above(r)) return 0;
  /* Up to what a growth would leave mapped ahead, not that much more:
   * topped up at every request, the room would fill the target. */
  size_t more = sa__round_up(ahead - room, a->gran);
  /* One chunk, at most the user's chunk_size: the unit a reshape takes back. */
  if (a->cfg.chunk_size != 0 && more > a->cfg.chunk_size) more = a->cfg.chunk_size;
  uintptr_t hi = r->hdr.base + r->hdr.size;
  size_t above = sa__va_free_above(a, hi) & ~(a->gran - 1);
  *at = hi;
  return more < above ? more : above;
}

sa_status sa__run_ahead_claim(sa_arena *a, sa_run_ahead *job) {
  /* Still right above a run that may grow there, with the room free? */
  const sa_run *below = a->spans.runs;
  while (below != NULL && below->hdr.base + below->hdr.size != job->at) below = below->next;
  if (below == NULL || pools_room_above(below)) return SA_ERR_OUT_OF_MEMORY;
  size_t above = sa__va_free_above(a, job->at) & ~(a->gran - 1);
  if (job->size > above) job->size = above;
  if (job->size == 0) return SA_ERR_OUT_OF_MEMORY;
  job->run = run_new(a);
  job->span = job->run != NULL ? sa__span_new(a) : NULL;
  sa_status st = job->span != NULL ? SA_OK : SA_ERR_OUT_OF_MEMORY;
  if (st == SA_OK) st = sa__physical_reserve(a, job->size, sa__physical_soft_limit(a), &job->phys);
  if (st == SA_OK) st = sa__va_claim(a, job->at, job->size);
  if (st == SA_OK) return SA_OK;
  if (job->phys != NULL) sa__physical_unreserve(a, job->phys);
  if (job->span != NULL) sa__span_put(a, job->span);
  if (job->run != NULL) run_put(a, job->run);
  *job = (sa_run_ahead){0};
  return st;
}

void sa__run_ahead_publish(sa_arena *a, sa_run_ahead *job) {
  sa_chunk *chunks = sa__physical_adopt(a, job->phys);
  sa__free_insert(a, link_run(a, job->run, job->span, job->at, job->size, chunks, NULL));
  a->spans.reshape_futile = 0; /* free span memory, as a span freed */
}

sa_status sa__run_ahead_abandon(sa_arena *a, sa_run_ahead *job, bool created, size_t mapped,
                                sa_status why) {
  sa__span_put(a, job->span);
  run_put(a, job->run);
  if (!created) {
    sa__physical_unreserve(a, job->phys);
    sa__va_free(a, job->at, job->size);
    return why;
  }
  sa_chunk *chunks = sa__physical_adopt(a, job->phys);
  return sa__physical_unwind(a, job->at, job->size, chunks, mapped, why);
}

/* ------------------------------------------------------------------------
 * Unmapping free memory (under a budget, trims): cuts
 * ---------------------------------------------------------------------- */

/* What a cut leaves above its hole: the rest of the free span f, where f
 * goes on past the hole, and the rest of the run, where the run does. Their
 * descriptors are taken before the driver is asked to unmap: after the
 * unmap nothing may fail. */
typedef struct cut_parts_s {
  sa_span *f_hi; /* the free span above the hole (room for f's marks), or NULL */
  sa_run *up;    /* the run above the hole, or NULL */
} cut_parts;

static void cut_abandon(sa_arena *a, const cut_parts *parts) {
  if (parts->f_hi != NULL) sa__span_put(a, parts->f_hi);
  if (parts->up != NULL) run_put(a, parts->up);
}

/* The descriptors a cut of [lo, hi) out of f in r needs; false, and none
 * kept, without memory for them. */
static bool cut_prepare(sa_arena *a, const sa_run *r, const sa_span *f, uintptr_t hi,
                        cut_parts *parts) {
  bool span_above = f->base + f->size > hi;
  bool run_above = hi < r->hdr.base + r->hdr.size;
  parts->f_hi = span_above ? sa__span_new(a) : NULL;
  parts->up = run_above ? run_new(a) : NULL;
  bool span_ready =
      !span_above || (parts->f_hi != NULL && sa__marks_reserve(parts->f_hi, f->nmarks));
  bool run_ready = !run_above || parts->up != NULL;
  if (span_ready && run_ready) return true;
  cut_abandon(a, parts);
  return false;
}

/* r's chunks: those below lo stay on its list, those in [lo, hi) go to the
 * chunk cache, and those above hi are returned, off the list. */
static sa_chunk *cut_chunks(sa_arena *a, sa_run *r, uintptr_t lo, uintptr_t hi) {
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
  return above_chunks;
}

/* Unmap [lo, hi) of run r: whole chunks inside the free span f (in the
 * index, its marks complete). The run splits around the hole; f keeps what
 * lies below it, a new span what lies above; the page map and the reserved
 * space follow. False, and nothing changed, if there was no memory for the
 * descriptors or the driver refused the unmap. */
static bool cut(sa_arena *a, sa_run *r, sa_span *f, uintptr_t lo, uintptr_t hi) {
  cut_parts parts;
  if (!cut_prepare(a, r, f, hi, &parts)) return false;
  if (a->drv->ops->unmap(a->drv, lo, hi - lo) != SA_OK) {
    cut_abandon(a, &parts);
    return false;
  }
  uintptr_t end = r->hdr.base + r->hdr.size, f_end = f->base + f->size;
  sa_span *f_hi = parts.f_hi;
  sa_run *up = parts.up;
  sa__free_remove(a, f);
  sa_chunk *above_chunks = cut_chunks(a, r, lo, hi); /* for the run above */
  /* Spans: [first .. f] below, [f_hi, f->next .. last] above. */
  sa_span *below = f->prev, *above = f->next, *old_last = r->last;
  sa_span *low_tail = below, *high_head = above;
  if (f_hi != NULL) {
    sa__marks_copy(f_hi, f);
    f_hi->owner = f->owner;
    f_hi->base = hi;
    f_hi->size = f_end - hi;
    sa__starts_within(f_hi, f);
    f_hi->next = above;
    if (above != NULL) above->prev = f_hi;
    high_head = f_hi;
  }
  if (f->base < lo) {
    f->size = lo - f->base;
    sa__starts_within(f, f);
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
    sa__free_insert(a, f);
  else
    sa__span_put(a, f);
  if (f_hi != NULL) sa__free_insert(a, f_hi);
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
  return true;
}

/* The chunks (each mapped whole: physical.c) wholly inside the free span
 * sp: the highest of them that hold at least bytes, or all, and no more
 * than most of them; how many (0: none). */
static size_t whole_chunks(const sa_span *sp, size_t bytes, size_t most, uintptr_t *lo,
                           uintptr_t *hi) {
  uintptr_t end = sp->base + sp->size, at = sp->run->hdr.base;
  const sa_chunk *c = sp->run->hdr.chunks;
  for (; c != NULL && at < sp->base; c = c->next) at += c->size; /* not wholly inside */
  const sa_chunk *first = c;
  size_t n = 0;
  *lo = at;
  for (; c != NULL && at + c->size <= end; c = c->next, n++) at += c->size;
  *hi = at;
  /* From the top: drop chunks at the bottom while the rest holds bytes,
   * and while they are more than most. */
  for (c = first; n > 1 && (*hi - (*lo + c->size) >= bytes || n > most); c = c->next, n--)
    *lo += c->size;
  return n;
}

/* sa__run_unmap_free, unmapping at most chunks chunks; with UNMAP_DRY,
 * the bytes it could unmap, changing nothing (a span whose work is still
 * running counts, its marks not asked). */
static size_t walk_free_chunks(sa_arena *a, size_t bytes, size_t chunks, uintptr_t keep_lo,
                               uintptr_t keep_hi, sa_wait wait, unmap_mode mode) {
  sa__free_rejoin(a);
  size_t unmapped = 0;
  sa_span *next;
  for (sa_span *sp = sa__fit_ceiling(a, a->gran, 0); sp != NULL && unmapped < bytes && chunks > 0;
       sp = next) {
    next = sa__fit_ceiling(a, sp->size, sp->base + 1); /* before sp changes */
    if (sp->base < keep_hi && keep_lo < sp->base + sp->size) continue;
    uintptr_t lo, hi;
    size_t n = whole_chunks(sp, bytes - unmapped, chunks, &lo, &hi);
    if (n == 0) continue;
    if (mode == UNMAP_DRY || (sa__marks_reached(a, sp, wait) && cut(a, sp->run, sp, lo, hi))) {
      unmapped += hi - lo;
      chunks -= n;
    }
  }
  return unmapped;
}

static size_t unmap_free_chunks(sa_arena *a, size_t bytes, size_t chunks, uintptr_t keep_lo,
                                uintptr_t keep_hi, sa_wait wait) {
  return walk_free_chunks(a, bytes, chunks, keep_lo, keep_hi, wait, UNMAP_DO);
}

size_t sa__run_unmap_free(sa_arena *a, size_t bytes, uintptr_t keep_lo, uintptr_t keep_hi,
                          sa_wait wait) {
  return unmap_free_chunks(a, bytes, SIZE_MAX, keep_lo, keep_hi, wait);
}
