/* Free spans: span descriptors, the placement policy, best fit, carving a
 * request out of a free span, and coalescing (free_span.h).
 *
 * Free spans sit in the fit index (span_index.c), by size and then address:
 * a request takes the smallest free span it fits in, at its lowest address
 * (or lowest granule boundary), and the rest stays free beside it. A freed
 * span merges with its free neighbours in its run, their marks and starts
 * joined. Span descriptors are recycled through a spare list; every one
 * lives until the arena is destroyed.
 */
#include <stdlib.h>

#include "free_span.h"
#include "../arena.h"
#include "../base/base.h"
#include "mark.h"
#include "span.h"
#include "span_index.h"

/* ------------------------------------------------------------------------
 * Descriptors (recycled; runs are type-stable: the page map names them)
 * ---------------------------------------------------------------------- */

sa_span *sa__span_new(sa_arena *a) {
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
  sp->prev = sp->next = NULL;
  sp->fit.left = sp->fit.right = NULL;
  sp->nstarts = 0;
  sp->owner = NULL;
  sp->request = 0;
  sp->holder = NULL;
  sp->pool_segment = false;
  atomic_store_explicit(&sp->xstate, SA_BLOCK_FREE, memory_order_relaxed);
  return sp;
}

void sa__span_put(sa_arena *a, sa_span *sp) {
  sa__marks_clear(a, sp);
  sp->nstarts = 0;
  sp->run = NULL;
  sp->next = a->spans.spare_spans;
  a->spans.spare_spans = sp;
}

void sa__span_link_after(sa_run *r, sa_span *after, sa_span *sp) {
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

void sa__span_grow_into(sa_arena *a, sa_span *sp, sa_span *taken) {
  SA_ASSERT(sp->next == taken && sp->base + sp->size == taken->base);
  sp->size += taken->size;
  span_unlink(taken);
  sa__span_put(a, taken);
}

/* ------------------------------------------------------------------------
 * Free spans: the fit index and coalescing
 * ---------------------------------------------------------------------- */

void sa__free_insert(sa_arena *a, sa_span *sp) {
  atomic_store_explicit(&sp->xstate, SA_BLOCK_FREE, memory_order_relaxed);
  sa__fit_insert(a, sp);
  a->spans.free_bytes += sp->size;
}

void sa__free_remove(sa_arena *a, sa_span *sp) {
  SA_ASSERT(sa__span_is_free(sp) && a->spans.free_bytes >= sp->size);
  sa__fit_remove(a, sp);
  a->spans.free_bytes -= sp->size;
}

/* right (free, just above left in the run) joins left (free); both out of
 * the index; newer: which of them was freed last. False without memory to
 * join their marks: they stay apart. */
static bool absorb(sa_arena *a, sa_span *left, sa_span *right, sa_newer newer) {
  sa__marks_prune_known(a, left);
  sa__marks_prune_known(a, right);
  if (!sa__marks_join(a, left, right)) return false;
  sa__starts_join(left, right, newer);
  left->size += right->size;
  span_unlink(right);
  sa__span_put(a, right);
  return true;
}

/* May sp merge with its free neighbour n, for whom? Not across another
 * stream's pending mark (sa__marks_pending_apart), nor where usable_for's
 * stream could not use n (a growth beside another stream's unrecorded
 * free): either way the arena notes that free neighbours are left apart,
 * for sa__free_rejoin, or its validator would take them for a merge
 * forgotten. */
static bool joins(sa_arena *a, const sa_span *sp, const sa_span *n,
                  const sa_stream_arena *usable_for) {
  if (n == NULL || !sa__span_is_free(n)) return false;
  if (sa__marks_pending_apart(a, sp, n) ||
      (usable_for != NULL && !sa__marks_waitable_for(n, usable_for))) {
    a->spans.apart = true;
    return false;
  }
  return true;
}

sa_span *sa__free_coalesce(sa_arena *a, sa_span *sp, const sa_stream_arena *usable_for) {
  sa_span *n = sp->next;
  if (joins(a, sp, n, usable_for)) {
    sa__free_remove(a, n);
    if (!absorb(a, sp, n, SA_DST_NEWER)) {
      sa__free_insert(a, n);
      a->spans.apart = true; /* no memory for their marks: rejoined later */
    }
  }
  sa_span *p = sp->prev;
  if (joins(a, sp, p, usable_for)) {
    sa__free_remove(a, p);
    if (absorb(a, p, sp, SA_SRC_NEWER)) {
      p->owner = sp->owner; /* the last freer */
      sp = p;
    } else {
      sa__free_insert(a, p);
      a->spans.apart = true;
    }
  }
  return sp;
}

void sa__free_rejoin(sa_arena *a) {
  if (!a->spans.apart) return;
  a->spans.apart = false; /* joins sets it again for a pair still apart */
  for (sa_run *r = a->spans.runs; r != NULL; r = r->next) {
    sa_span *sp = r->first;
    while (sp != NULL) {
      sa_span *n = sp->next;
      if (sa__span_is_free(sp) && joins(a, sp, n, NULL)) {
        sa__free_remove(a, sp);
        sa__free_remove(a, n);
        bool merged = absorb(a, sp, n, SA_SRC_NEWER);
        sa__free_insert(a, sp);
        if (!merged) {
          sa__free_insert(a, n);
          a->spans.apart = true; /* no memory for their marks: later */
          sp = n;
        }
        continue; /* sp again, with its new neighbour */
      }
      sp = n;
    }
  }
}

sa_want sa__free_placement(const sa_arena *a, size_t size) {
  size_t packed = sa__round_up(size, SA_SPAN_QUANTUM), whole = sa__round_up(size, a->gran);
  bool little_lost = whole - packed <= packed / 32;
  if (a->physical.budgeted && little_lost) return (sa_want){whole, a->gran, false};
  return (sa_want){packed, 0, false};
}

uintptr_t sa__free_place(const sa_arena *a, const sa_span *sp, sa_want w) {
  uintptr_t end = sp->base + sp->size;
  if (w.align != 0) {
    uintptr_t at = sa__round_up(sp->base, w.align);
    return at <= end && end - at >= w.need ? at : 0;
  }
  return sp->size >= w.need ? sp->base : 0;
}

/* Can sarena's stream use x, if it waits? Not while another stream's
 * pending mark is on it: that stream is asked to record its event. */
static bool waitable(const sa_span *x, const sa_stream_arena *sarena) {
  if (sa__marks_waitable_for(x, sarena)) return true;
  sa__marks_want(x);
  return false;
}

sa_span *sa__free_best_fit(const sa_arena *a, sa_want w, const sa_stream_arena *sarena) {
  sa_span *pick = NULL;
  sa_span *x = sa__fit_ceiling(a, w.need, 0);
  for (int i = 0; x != NULL && i < 16; i++, x = sa__fit_ceiling(a, x->size, x->base + 1)) {
    if (pick != NULL && x->size != pick->size) break;
    if (sa__free_place(a, x, w) == 0) continue;
    if (sa__marks_clean_for(x, sarena)) return x;
    if (pick == NULL && waitable(x, sarena)) pick = x;
  }
  if (pick != NULL || w.align == 0) return pick;
  /* Any span this large fits at a boundary. */
  x = sa__fit_ceiling(a, w.need + w.align - SA_SPAN_QUANTUM, 0);
  for (int i = 0; x != NULL && i < 16; i++, x = sa__fit_ceiling(a, x->size, x->base + 1))
    if (waitable(x, sarena)) return x;
  return NULL;
}

/* A free span for [at, end of sp): sp's marks and starts there, linked
 * after sp and in the index; sp keeps [base, at). NULL, and nothing
 * changed, without memory. */
static sa_span *split(sa_arena *a, sa_span *sp, uintptr_t at) {
  sa_span *r = sa__span_new(a);
  if (r == NULL) return NULL;
  if (!sa__marks_reserve(r, sp->nmarks)) {
    sa__span_put(a, r);
    return NULL;
  }
  sa__marks_copy(r, sp);
  r->owner = sp->owner;
  r->base = at;
  r->size = sp->base + sp->size - at;
  sp->size = at - sp->base;
  sa__starts_within(r, sp);
  sa__span_link_after(sp->run, sp, r);
  sa__free_insert(a, r);
  return r;
}

sa_span *sa__free_carve(sa_arena *a, sa_span *sp, sa_want w) {
  uintptr_t at = sa__free_place(a, sp, w);
  sa_span *taken = sp;
  if (at > sp->base) {
    taken = split(a, sp, at); /* sp keeps the part before, and goes back */
    if (taken == NULL) {
      taken = sp;
    } else {
      sa__starts_within(sp, sp);
      sa__free_remove(a, taken);
      sa__free_insert(a, sp);
    }
  }
  if (taken->size > w.need) (void)split(a, taken, taken->base + w.need);
  sa__marks_clear(a, taken);
  taken->nstarts = 0;
  return taken;
}
