/* Large allocations: each is a span of its own, a contiguous virtual range
 * backed by whole physical chunks (stitched from wherever free chunks are).
 *
 * A span freed on the stream it was allocated on goes to that stream's
 * span cache and is reused there at once (stream order makes that safe).
 * Freed on another stream, or after sa_record_stream, it retires: events
 * are recorded on the freeing and recorded streams, and once they complete
 * the span is "clean": mapped, free, usable by any stream. Clean spans are
 * unmapped (their chunks go to the chunk cache) only when memory is needed
 * in another shape. A reuse must fit within 1/8 of the request.
 */
#include <stdlib.h>

#include "internal.h"

static void list_push(sa_span **head, sa_span *sp) {
  sp->prev = NULL;
  sp->next = *head;
  if (sp->next != NULL) sp->next->prev = sp;
  *head = sp;
}

static void list_remove(sa_span **head, sa_span *sp) {
  if (sp->prev != NULL)
    sp->prev->next = sp->next;
  else
    *head = sp->next;
  if (sp->next != NULL) sp->next->prev = sp->prev;
  sp->next = sp->prev = NULL;
}

/* Best fit of at least need bytes wasting at most need / 8. */
static sa_span *best_fit(sa_span *head, size_t need) {
  sa_span *best = NULL;
  for (sa_span *sp = head; sp != NULL; sp = sp->next) {
    size_t sz = sp->hdr.size;
    if (sz >= need && sz - need <= need / 8 && (best == NULL || sz < best->hdr.size)) best = sp;
  }
  return best;
}

static void hand_out(sa_arena *a, sa_stream_arena *sa, sa_span *sp, size_t size, void **out) {
  sp->owner = sa;
  sp->request = size;
  atomic_store_explicit(&sp->xstate, SA_BLOCK_LIVE, memory_order_release);
  a->live_spans++;
  *out = (void *)sp->hdr.base;
}

/* Unmap one clean span: chunks to the cache, range to the free list. */
static sa_status unmap_span(sa_arena *a, sa_span *sp) {
  sa_status st = sa__physical_unmap(a, &sp->hdr);
  if (st != SA_OK) return st;
  sa__pagemap_set(a, sp->hdr.base, sp->hdr.size, NULL);
  sa__va_free(a, sp->hdr.base, sp->hdr.size);
  sp->in_use = false;
  sp->next = a->spare_spans;
  a->spare_spans = sp;
  return SA_OK;
}

void sa__span_unmap_clean(sa_arena *a) {
  while (a->clean_spans != NULL) {
    sa_span *sp = a->clean_spans;
    list_remove(&a->clean_spans, sp);
    if (unmap_span(a, sp) != SA_OK) {
      list_push(&a->clean_spans, sp);
      return;
    }
  }
}

/* Map a fresh span of need bytes. Arena lock held. */
static sa_status map_new(sa_arena *a, size_t need, sa_span **out) {
  sa_span *sp = a->spare_spans;
  if (sp != NULL) {
    a->spare_spans = sp->next;
  } else {
    sp = calloc(1, sizeof *sp);
    if (sp == NULL) return SA_ERR_OUT_OF_MEMORY;
    sp->hdr.kind = SA_DESC_SPAN;
    sp->all_next = a->all_spans;
    a->all_spans = sp;
  }
  sp->hdr.size = need;
  sa_status st = sa__va_alloc(a, need, &sp->hdr.base);
  if (st == SA_OK) {
    st = sa__physical_map(a, &sp->hdr);
    if (st == SA_ERR_OUT_OF_MEMORY && a->clean_spans != NULL && sp->hdr.chunks == NULL) {
      sa__span_unmap_clean(a); /* their chunks can be stitched into this one */
      st = sa__physical_map(a, &sp->hdr);
    }
    if (st != SA_OK && sp->hdr.chunks == NULL) sa__va_free(a, sp->hdr.base, need);
  }
  if (st != SA_OK) {
    if (sp->hdr.chunks == NULL) { /* else a refused unwind: keep it aside */
      sp->next = a->spare_spans;
      a->spare_spans = sp;
    }
    return st;
  }
  sa__pagemap_set(a, sp->hdr.base, need, &sp->hdr);
  sp->in_use = true;
  sp->next = sp->prev = NULL;
  *out = sp;
  return SA_OK;
}

/* Waiting on the device beats growing: take a retiring span of the right
 * size behind wait edges on this stream. Arena lock held. */
static sa_span *adopt_retiring(sa_arena *a, sa_stream_arena *sa, size_t need) {
  sa_span *sp = best_fit(a->retiring, need);
  if (sp == NULL) return NULL;
  unsigned kept = 0;
  for (unsigned i = 0; i < sp->nevents; i++)
    if (sa__event_consume(a, sp->events[i], sa->stream) != SA_OK)
      sp->events[kept++] = sp->events[i];
  sp->nevents = kept;
  if (kept > 0) return NULL; /* the driver refused a wait: leave it retiring */
  free(sp->events);
  sp->events = NULL;
  list_remove(&a->retiring, sp);
  return sp;
}

sa_status sa__span_alloc(sa_arena *a, sa_stream_arena *sa, size_t size, void **out) {
  if (size > a->va_size) return SA_ERR_OUT_OF_MEMORY;
  size_t need = (size + a->gran - 1) & ~(a->gran - 1);
  pthread_mutex_lock(&sa->lock);
  sa_span *sp = best_fit(sa->span_cache, need);
  if (sp != NULL) {
    list_remove(&sa->span_cache, sp);
    sa->span_cache_bytes -= sp->hdr.size;
  }
  pthread_mutex_unlock(&sa->lock);
  pthread_mutex_lock(&a->lock);
  sa_status st = SA_OK;
  if (sp == NULL) {
    if (a->retiring != NULL) sa__span_reap(a, false);
    sp = best_fit(a->clean_spans, need);
    if (sp != NULL)
      list_remove(&a->clean_spans, sp);
    else if ((sp = adopt_retiring(a, sa, need)) == NULL)
      st = map_new(a, need, &sp);
  }
  if (st == SA_OK) hand_out(a, sa, sp, size, out);
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* Arena lock held. Retiring spans whose events all completed become clean. */
size_t sa__span_reap(sa_arena *a, bool wait) {
  size_t bytes = 0;
  for (sa_span *sp = a->retiring, *next; sp != NULL; sp = next) {
    next = sp->next;
    unsigned kept = 0;
    for (unsigned i = 0; i < sp->nevents; i++)
      if (sa__event_retire(a, sp->events[i], wait) != SA_OK) sp->events[kept++] = sp->events[i];
    sp->nevents = kept;
    if (kept > 0) continue;
    free(sp->events);
    sp->events = NULL;
    list_remove(&a->retiring, sp);
    list_push(&a->clean_spans, sp);
    atomic_store_explicit(&sp->xstate, SA_BLOCK_FREE, memory_order_relaxed);
    bytes += sp->hdr.size;
  }
  return bytes;
}

/* Owner lock held: this stream's cached spans retire behind one event. A
 * released stream's spans have no pending work and are clean at once. */
void sa__span_retire_cached(sa_arena *a, sa_stream_arena *sa) {
  while (sa->span_cache != NULL) {
    sa_span *sp = sa->span_cache;
    sa_event *ev = NULL;
    if (!sa->released) {
      ev = malloc(sizeof *ev);
      if (ev == NULL) return;
      if (sa__event_record_new(a, sa->stream, ev) != SA_OK) {
        free(ev);
        return;
      }
    }
    list_remove(&sa->span_cache, sp);
    sa->span_cache_bytes -= sp->hdr.size;
    pthread_mutex_lock(&a->lock);
    sp->events = ev;
    sp->nevents = ev != NULL ? 1 : 0;
    list_push(ev != NULL ? &a->retiring : &a->clean_spans, sp);
    pthread_mutex_unlock(&a->lock);
  }
}

sa_status sa__span_free(sa_arena *a, sa_span *sp, sa_stream s) {
  sa_stream_arena *owner = sp->owner;
  sa_stream *recorded = NULL;
  unsigned nrec = 0;
  if (atomic_load_explicit(&sp->xstate, memory_order_relaxed) == SA_BLOCK_RECORDED)
    sa__record_take(a, sp->hdr.base, &recorded, &nrec);
  pthread_mutex_lock(&owner->lock);
  bool home = nrec == 0 && owner->stream == s && !owner->released;
  if (home) {
    atomic_store_explicit(&sp->xstate, SA_BLOCK_FREE, memory_order_relaxed);
    list_push(&owner->span_cache, sp);
    owner->span_cache_bytes += sp->hdr.size;
    pthread_mutex_unlock(&owner->lock);
    pthread_mutex_lock(&a->lock);
    a->live_spans--;
    pthread_mutex_unlock(&a->lock);
    return SA_OK;
  }
  pthread_mutex_unlock(&owner->lock);
  /* Retire behind events on the freeing stream and every recorded one. */
  sa_event *ev = malloc((nrec + 1) * sizeof *ev);
  sa_status st = ev == NULL ? SA_ERR_OUT_OF_MEMORY : SA_OK;
  unsigned n = 0;
  for (unsigned i = 0; st == SA_OK && i <= nrec; i++) {
    st = sa__event_record_new(a, i == 0 ? s : recorded[i - 1], &ev[n]);
    if (st == SA_OK) n++;
  }
  if (st != SA_OK) { /* nothing changes: the span stays allocated */
    for (unsigned i = 0; i < n; i++) sa__event_drop(a, ev[i]);
    free(ev);
    for (unsigned i = 0; i < nrec; i++) (void)sa__record_add(a, sp->hdr.base, recorded[i]);
    free(recorded);
    return st;
  }
  free(recorded);
  pthread_mutex_lock(&a->lock);
  atomic_store_explicit(&sp->xstate, SA_BLOCK_DEFERRED, memory_order_relaxed);
  sp->events = ev;
  sp->nevents = n;
  list_push(&a->retiring, sp);
  a->live_spans--;
  pthread_mutex_unlock(&a->lock);
  return SA_OK;
}
