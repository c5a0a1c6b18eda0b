/* Kept spans: a thread's last span freed on its stream, kept for the
 * stream's next request of its size (kept.h says what is promised).
 *
 * Why a thread cache keeps one. A span's free and its allocation each take
 * the arena lock, a best fit, the live map and a coalesce; a loop of one
 * large size on one stream (a framework's scratch buffer, CuPy's and
 * Numba's arrays on the legacy stream) pays them at every pair, several
 * times a small block's pair. Kept, the free takes the lock only to look
 * the span up, and the allocation takes none. Only one span per entry, and
 * only until a request of another size: the free span layer sees it again
 * before any best fit that could have used it.
 *
 * Orphans. A span given back outside a call naming its stream cannot take
 * the free's mark, which may record an event on the stream: it waits in
 * spans.orphans (arena lock), counted on its stream arena, until its
 * stream's next named call (sa__tentry_get looks at the count), or until
 * its work is known done without one.
 */
#include "kept.h"

#include "../arena.h"
#include "../base/base.h"
#include "../base/device_sync.h"
#include "free_span.h"
#include "span_index.h"

/* Is sarena gone (released, or its stream found destroyed)? Read under the
 * arena lock, not its own: a release racing with this call is the user's
 * contract broken (no call may name a stream during its release). */
static bool gone(const sa_stream_arena *sarena) {
  return atomic_load_explicit(&sarena->xgone, memory_order_acquire);
}

/* Is all work sarena's stream did on what it keeps known done? Only once
 * it went through sa_stream_release, which synchronized it (synced). Found
 * destroyed is not enough: a thread that used the old stream goes on with
 * its state on a new stream that got the handle (the header's handle rule),
 * so work the new stream queued may still use a span that state kept. */
static bool work_done(const sa_stream_arena *sarena) {
  return gone(sarena) && sarena->synced;
}

/* Would a free and a request of sp's size put it back where it is? Only
 * then is it kept: kept elsewhere, it would stand between free spans that a
 * coalesce joins and a best fit places from, and over a trace of many sizes
 * the arena's free memory ends up broken (a third more reserved on
 * dataframe, docs/BENCHMARKS.md, run Z). Freed, sp joins its free
 * neighbours; address-ordered best fit carves a request at the lowest
 * address of the smallest free span it fits. So it is put back in place
 * where the span below is not free and, if the span above is, no other
 * free span smaller than the two joined would take the request. Arena lock
 * held. */
static bool best_fit_puts_it_back(const sa_arena *a, const sa_span *sp) {
  if (sp->prev != NULL && sa__span_is_free(sp->prev)) return false;
  const sa_span *next = sp->next;
  if (next == NULL || !sa__span_is_free(next)) return true;
  size_t joined = sp->size + next->size;
  const sa_span *x = sa__fit_ceiling(a, sa__free_placement(a, sp->request).need, 0);
  if (x == next) x = sa__fit_ceiling(a, next->size, next->base + 1);
  return x == NULL || x->size > joined || (x->size == joined && x->base > sp->base);
}

bool sa__span_keep(sa_arena *a, sa_stream_arena *sarena, uintptr_t p, sa_span **out,
                   size_t *request) {
  pthread_mutex_lock(&a->lock);
  sa_span *sp = sa__live_find(a, p);
  bool kept = sp != NULL && sp->owner == sarena && sp->holder == NULL &&
              sp->size <= SA_KEPT_MAX && best_fit_puts_it_back(a, sp) &&
              sa__span_may_hold_back(a, sp->size) &&
              atomic_load_explicit(&sp->xstate, memory_order_relaxed) == SA_BLOCK_LIVE;
  if (kept) {
    atomic_store_explicit(&sp->xstate, SA_BLOCK_CACHED, memory_order_relaxed);
    *out = sp;
    *request = sp->request;
  }
  pthread_mutex_unlock(&a->lock);
  return kept;
}

void sa__span_kept_reuse(sa_span *sp) {
  atomic_store_explicit(&sp->xstate, SA_BLOCK_LIVE, memory_order_relaxed);
}

/* Free the kept span sp (not an orphan any more), marked or clean. Arena
 * lock held. On failure it stays kept. */
static sa_status free_kept(sa_arena *a, sa_span *sp, sa_span_mark mark) {
  atomic_store_explicit(&sp->xstate, SA_BLOCK_LIVE, memory_order_relaxed);
  sa_status st = sa__span_free_live(a, sp, sp->owner, NULL, 0, mark);
  if (st != SA_OK) atomic_store_explicit(&sp->xstate, SA_BLOCK_CACHED, memory_order_relaxed);
  return st;
}

/* sp waits in the orphans for a call naming its stream. Arena lock held. */
static void orphan(sa_arena *a, sa_span *sp) {
  sp->orphan_gen = sa__sync_gen(&a->sync);
  sp->orphan_next = a->spans.orphans;
  a->spans.orphans = sp;
  a->spans.norphans++;
  a->spans.orphan_bytes += sp->size;
  atomic_fetch_add_explicit(&sp->owner->xorphans, 1, memory_order_relaxed);
}

sa_status sa__span_kept_free(sa_arena *a, sa_span *sp) {
  pthread_mutex_lock(&a->lock);
  SA_ASSERT(atomic_load_explicit(&sp->xstate, memory_order_relaxed) == SA_BLOCK_CACHED);
  sa_status st = SA_OK;
  if (work_done(sp->owner))
    st = free_kept(a, sp, SA_SPAN_CLEAN);
  else if (gone(sp->owner)) /* no driver call on it: a device sync frees it */
    orphan(a, sp);
  else
    st = free_kept(a, sp, SA_SPAN_MARKED);
  SA_VALIDATE_PACED(&a->spans.pace, sa__span_check(a));
  pthread_mutex_unlock(&a->lock);
  return st;
}

void sa__span_kept_orphan(sa_arena *a, sa_span *sp) {
  pthread_mutex_lock(&a->lock);
  SA_ASSERT(atomic_load_explicit(&sp->xstate, memory_order_relaxed) == SA_BLOCK_CACHED);
  /* A released stream arena's stream did all its work (kept.h): no mark. */
  if (!work_done(sp->owner) || free_kept(a, sp, SA_SPAN_CLEAN) != SA_OK) orphan(a, sp);
  SA_VALIDATE_PACED(&a->spans.pace, sa__span_check(a));
  pthread_mutex_unlock(&a->lock);
}

/* Free the orphans that mark says: MARKED, those of mine (in a call naming
 * its stream); CLEAN, those whose work is known done. Out of the list
 * first, as the free may merge a descriptor into a neighbour's; back in
 * where it failed. Arena lock held. */
static void free_orphans(sa_arena *a, const sa_stream_arena *mine, sa_span_mark mark) {
  sa_span *stay = NULL, *sp = a->spans.orphans;
  a->spans.orphans = NULL;
  while (sp != NULL) {
    sa_span *next = sp->orphan_next;
    sa_stream_arena *owner = sp->owner; /* the free renames the span's */
    size_t size = sp->size;             /* and may merge it into a neighbour */
    bool wanted = mark == SA_SPAN_MARKED
                      ? owner == mine
                      : work_done(owner) || sa__clean_since(&a->sync, sp->orphan_gen);
    sp->orphan_next = NULL;
    if (wanted && free_kept(a, sp, mark) == SA_OK) {
      atomic_fetch_sub_explicit(&owner->xorphans, 1, memory_order_relaxed);
      a->spans.norphans--;
      a->spans.orphan_bytes -= size;
    } else {
      sp->orphan_next = stay;
      stay = sp;
    }
    sp = next;
  }
  a->spans.orphans = stay;
}

void sa__span_orphans_free(sa_arena *a, sa_stream_arena *sarena) {
  pthread_mutex_lock(&a->lock);
  free_orphans(a, sarena, SA_SPAN_MARKED);
  SA_VALIDATE_PACED(&a->spans.pace, sa__span_check(a));
  pthread_mutex_unlock(&a->lock);
}

void sa__span_orphans_settle(sa_arena *a) {
  if (a->spans.orphans != NULL) free_orphans(a, NULL, SA_SPAN_CLEAN);
}

static const char KEPT[] = "kept span";

size_t sa__span_orphans_check(const sa_arena *a) {
  size_t n = 0, bytes = 0;
  for (const sa_span *sp = a->spans.orphans; sp != NULL; sp = sp->orphan_next, n++) {
    bytes += sp->size;
    SA_CHECK(KEPT, atomic_load_explicit(&sp->xstate, memory_order_relaxed) == SA_BLOCK_CACHED,
             "an orphan is kept (SA_BLOCK_CACHED)");
    SA_CHECK(KEPT, sp->owner != NULL && sa__live_find(a, sp->base) == sp,
             "an orphan has an owner and is in the live map");
  }
  SA_CHECK(KEPT, n == a->spans.norphans && bytes == a->spans.orphan_bytes,
           "spans.norphans and spans.orphan_bytes count the orphans");
  return n;
}
