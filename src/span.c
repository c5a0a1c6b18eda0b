/* Large allocations: each is a span of its own, a contiguous virtual range
 * backed by whole physical chunks (stitched from wherever free chunks are).
 *
 * A freed span stays mapped on the arena's list of free spans, with an
 * event recorded on the stream it was freed on (and on every stream
 * recorded with sa_record_stream) and the stream arena it was freed on.
 * Any stream may take it: the stream it was freed on at once (stream order
 * covers it), any other once the events completed or behind wait edges on
 * the device ("waiting on the device beats growing"). One list for all
 * streams keeps reserved memory near the peak of the sum of the streams'
 * needs, not the sum of their peaks.
 *
 * Free spans change shape without the driver, at chunk boundaries: a freed
 * span merges with free neighbours in the reserved range (their events
 * combine), and a request may take the first or last chunks of a larger
 * free span, the rest staying free with the events. A reuse must fit
 * within 1/4 of the request. Only when nothing fits are free spans whose
 * work is done unmapped and their chunks stitched into the new span, then
 * free superblocks whose work is done (sa__reshape); only then does the
 * arena grow. Nothing is unmapped before its events completed: the
 * driver's unmap does not wait for queued work.
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

/* Best fit of at least need bytes wasting at most need / 4; among equal
 * sizes, one freed on sa's own stream (no wait needed). */
static sa_span *best_fit(sa_span *head, size_t need, const sa_stream_arena *sa) {
  sa_span *best = NULL;
  for (sa_span *sp = head; sp != NULL; sp = sp->next) {
    size_t sz = sp->hdr.size;
    if (sz < need || sz - need > need / 4) continue;
    if (best == NULL || sz < best->hdr.size ||
        (sz == best->hdr.size && sp->free_owner == sa && best->free_owner != sa))
      best = sp;
  }
  return best;
}

/* Drop the events of sp that completed; true when none is left. With wait,
 * the host waits for them. Arena lock held. */
static bool events_done(sa_arena *a, sa_span *sp, bool wait) {
  unsigned kept = 0;
  for (unsigned i = 0; i < sp->nevents; i++)
    if (sa__event_retire(a, sp->events[i], wait) != SA_OK) sp->events[kept++] = sp->events[i];
  sp->nevents = kept;
  return kept == 0;
}

/* Make sp safe for sa's stream: nothing to do on its own stream, else
 * wait edges for the events not yet complete. Arena lock held. */
static sa_status settle_for(sa_arena *a, sa_span *sp, sa_stream_arena *sa) {
  unsigned kept = 0;
  bool own = sp->free_owner == sa;
  for (unsigned i = 0; i < sp->nevents; i++) {
    sa_status st = SA_OK;
    if (own)
      sa__event_drop(a, sp->events[i]);
    else
      st = sa__event_consume(a, sp->events[i], sa->stream);
    if (st != SA_OK) sp->events[kept++] = sp->events[i];
  }
  sp->nevents = kept;
  return kept == 0 ? SA_OK : SA_ERR_DRIVER;
}

static void hand_out(sa_arena *a, sa_stream_arena *sa, sa_span *sp, size_t size, void **out) {
  sp->owner = sa;
  sp->free_owner = NULL;
  sp->request = size;
  atomic_store_explicit(&sp->xstate, SA_BLOCK_LIVE, memory_order_release);
  a->live_spans++;
  *out = (void *)sp->hdr.base;
}

/* Unmap one free span with no pending work: chunks to the cache, range to
 * the free list, descriptor to the spares. Arena lock held. */
static sa_status unmap_span(sa_arena *a, sa_span *sp) {
  sa_status st = sa__physical_unmap(a, &sp->hdr);
  if (st != SA_OK) return st;
  list_remove(&a->free_spans, sp);
  a->free_span_bytes -= sp->hdr.size;
  free(sp->events);
  sp->events = NULL;
  sa__pagemap_set(a, sp->hdr.base, sp->hdr.size, NULL);
  sa__va_free(a, sp->hdr.base, sp->hdr.size);
  sp->in_use = false;
  sp->pinned = false; /* a spare descriptor starts unmarked */
  sp->next = a->spare_spans;
  a->spare_spans = sp;
  return SA_OK;
}

/* Unmap free spans whose work is done (with wait: all of them, after
 * waiting), largest first, until the chunk cache covers need bytes
 * (need 0: until none is left). Returns whether it covers. */
static bool unmap_until(sa_arena *a, size_t need, bool wait) {
  for (;;) {
    /* Stop when covered, but through the unpinning below: a span left
     * pinned would be skipped by every later pass, trims included. */
    if (need > 0 && sa__physical_cache_covers(a, need, need / 4)) break;
    sa_span *big = NULL;
    for (sa_span *sp = a->free_spans; sp != NULL; sp = sp->next)
      if (!sp->pinned && (big == NULL || sp->hdr.size > big->hdr.size)) big = sp;
    if (big == NULL) break;
    big->pinned = true; /* tried once in this pass */
    if (events_done(a, big, wait)) (void)unmap_span(a, big);
  }
  for (sa_span *sp = a->free_spans; sp != NULL; sp = sp->next) sp->pinned = false;
  return need == 0 || sa__physical_cache_covers(a, need, need / 4);
}

size_t sa__span_unmap_free(sa_arena *a, bool wait) {
  size_t before = a->free_span_bytes;
  (void)unmap_until(a, 0, wait);
  return before - a->free_span_bytes;
}

/* A span descriptor, spare or new. Arena lock held. */
static sa_span *span_desc(sa_arena *a) {
  sa_span *sp = a->spare_spans;
  if (sp != NULL) {
    a->spare_spans = sp->next;
    return sp;
  }
  sp = calloc(1, sizeof *sp);
  if (sp == NULL) return NULL;
  sp->hdr.kind = SA_DESC_SPAN;
  sp->all_next = a->all_spans;
  a->all_spans = sp;
  return sp;
}

/* Map a fresh span of at least need bytes. Arena lock held. */
static sa_status map_new(sa_arena *a, size_t need, sa_span **out) {
  sa_span *sp = span_desc(a);
  if (sp == NULL) return SA_ERR_OUT_OF_MEMORY;
  sa_chunk *chunks = NULL;
  size_t total = 0;
  sa_status st = sa__physical_gather(a, need, need / 4, &chunks, &total);
  if (st == SA_OK) {
    sp->hdr.size = total;
    st = sa__va_alloc(a, total, &sp->hdr.base);
    if (st != SA_OK) sa__physical_return(a, chunks);
  }
  if (st == SA_OK) {
    st = sa__physical_map(a, &sp->hdr, chunks);
    if (st != SA_OK && sp->hdr.chunks == NULL) sa__va_free(a, sp->hdr.base, total);
  }
  if (st != SA_OK) {
    if (sp->hdr.chunks == NULL) { /* else a refused unwind: keep it aside */
      sp->next = a->spare_spans;
      a->spare_spans = sp;
    }
    return st;
  }
  sa__pagemap_set(a, sp->hdr.base, sp->hdr.size, &sp->hdr);
  sp->in_use = true;
  sp->next = sp->prev = NULL;
  *out = sp;
  return SA_OK;
}

/* The end of sp to carve for need bytes: its first (*prefix) or last
 * chunks, as few as reach need, wasting at most need / 4. Returns the bytes
 * taken (0: no end fits). */
static size_t end_fit(const sa_span *sp, size_t need, bool *prefix) {
  size_t head = 0, best = 0;
  for (const sa_chunk *c = sp->hdr.chunks; c != NULL && head < need; c = c->next) head += c->size;
  if (head >= need && head - need <= need / 4 && head < sp->hdr.size) {
    best = head;
    *prefix = true;
  }
  /* The shortest suffix reaching need: the total minus the longest prefix
   * that leaves at least need. */
  size_t keep = 0;
  for (const sa_chunk *c = sp->hdr.chunks; c != NULL; c = c->next) {
    if (sp->hdr.size - keep - c->size < need) break;
    keep += c->size;
  }
  size_t tail = sp->hdr.size - keep;
  if (keep > 0 && tail - need <= need / 4 && (best == 0 || tail < best)) {
    best = tail;
    *prefix = false;
  }
  return best;
}

/* Make the free span sp usable by sa's stream without giving up its events
 * (they stay with the part left free): nothing on its own stream, else a
 * device-side wait for each event not yet complete. Arena lock held. */
static sa_status wait_without_consuming(sa_arena *a, const sa_span *sp, sa_stream_arena *sa) {
  if (sp->free_owner == sa) return SA_OK;
  for (unsigned i = 0; i < sp->nevents; i++) {
    sa_status st = a->drv->ops->event_query(a->drv, sp->events[i]);
    if (st == SA_ERR_NOT_READY)
      st = a->drv->ops->stream_wait_event(a->drv, sa->stream, sp->events[i]);
    if (st != SA_OK) return st;
  }
  return SA_OK;
}

/* Carve taken bytes off one end of the free span sp into a span of its own
 * for sa (not on the free list). NULL if no descriptor could be had or the
 * driver refused a wait. Arena lock held. */
static sa_span *carve_end(sa_arena *a, sa_span *sp, size_t taken, bool prefix,
                          sa_stream_arena *sa) {
  if (wait_without_consuming(a, sp, sa) != SA_OK) return NULL;
  sa_span *t = span_desc(a);
  if (t == NULL) return NULL;
  /* Split the chunk list where the carved part ends or starts. */
  size_t at = prefix ? taken : sp->hdr.size - taken, off = 0;
  sa_chunk **link = &sp->hdr.chunks;
  while (off < at) {
    off += (*link)->size;
    link = &(*link)->next;
  }
  sa_chunk *second = *link;
  *link = NULL;
  if (prefix) {
    t->hdr.base = sp->hdr.base;
    t->hdr.chunks = sp->hdr.chunks;
    sp->hdr.base += taken;
    sp->hdr.chunks = second;
  } else {
    t->hdr.base = sp->hdr.base + at;
    t->hdr.chunks = second;
  }
  t->hdr.size = taken;
  sp->hdr.size -= taken;
  a->free_span_bytes -= taken;
  t->events = NULL;
  t->nevents = 0;
  t->in_use = true;
  t->pinned = false;
  t->next = t->prev = NULL;
  sa__pagemap_set(a, t->hdr.base, t->hdr.size, &t->hdr);
  return t;
}

/* Take need bytes from an end of a larger free span, own stream first. */
static sa_span *take_from_end(sa_arena *a, size_t need, sa_stream_arena *sa) {
  sa_span *best = NULL;
  size_t best_bytes = 0;
  bool best_prefix = false;
  for (sa_span *sp = a->free_spans; sp != NULL; sp = sp->next) {
    if (sp->hdr.size <= need) continue;
    bool prefix = false;
    size_t bytes = end_fit(sp, need, &prefix);
    if (bytes == 0) continue;
    if (best == NULL || bytes < best_bytes ||
        (bytes == best_bytes && sp->free_owner == sa && best->free_owner != sa)) {
      best = sp;
      best_bytes = bytes;
      best_prefix = prefix;
    }
  }
  return best != NULL ? carve_end(a, best, best_bytes, best_prefix, sa) : NULL;
}

/* right, free and just above left in the range, joins left. Arena lock
 * held. */
static void absorb(sa_arena *a, sa_span *left, sa_span *right) {
  unsigned total = left->nevents + right->nevents;
  sa_event *ev = NULL;
  if (total > 0) {
    ev = realloc(left->events, total * sizeof *ev);
    if (ev == NULL) return; /* no memory to combine the events: stay apart */
  } else {
    free(left->events);
  }
  for (unsigned i = 0; i < right->nevents; i++) ev[left->nevents + i] = right->events[i];
  left->events = ev;
  left->nevents += right->nevents;
  free(right->events);
  right->events = NULL;
  right->nevents = 0;
  if (left->free_owner != right->free_owner) left->free_owner = NULL;
  sa_chunk **tail = &left->hdr.chunks;
  while (*tail != NULL) tail = &(*tail)->next;
  *tail = right->hdr.chunks;
  right->hdr.chunks = NULL;
  left->hdr.size += right->hdr.size;
  sa__pagemap_set(a, right->hdr.base, right->hdr.size, &left->hdr);
  list_remove(&a->free_spans, right);
  right->in_use = false;
  right->next = a->spare_spans;
  a->spare_spans = right;
}

static sa_span *free_span_at(sa_arena *a, uintptr_t p) {
  if (p < a->va_base || p - a->va_base >= a->va_size) return NULL;
  sa_desc *d = sa__pagemap_get(a, p);
  if (d == NULL || d->kind != SA_DESC_SPAN) return NULL;
  sa_span *sp = (sa_span *)d;
  bool is_free =
      sp->in_use && atomic_load_explicit(&sp->xstate, memory_order_relaxed) == SA_BLOCK_FREE;
  return is_free ? sp : NULL;
}

/* A span just freed merges with its free neighbours. Arena lock held. */
static void coalesce(sa_arena *a, sa_span *sp) {
  sa_span *right = free_span_at(a, sp->hdr.base + sp->hdr.size);
  sa_span *left = free_span_at(a, sp->hdr.base - a->gran);
  if (right == NULL && left == NULL) return; /* the common case: no query */
  if (right != NULL) absorb(a, sp, right);
  if (left != NULL) {
    absorb(a, left, sp);
    sp = left;
  }
  (void)events_done(a, sp, false); /* merged lists: drop what completed */
}

sa_status sa__span_alloc(sa_arena *a, sa_stream_arena *sa, size_t size, void **out) {
  if (size > a->va_size) return SA_ERR_OUT_OF_MEMORY;
  size_t need = (size + a->gran - 1) & ~(a->gran - 1);
  pthread_mutex_lock(&a->lock);
  sa_span *sp = best_fit(a->free_spans, need, sa);
  if (sp != NULL && settle_for(a, sp, sa) == SA_OK) {
    list_remove(&a->free_spans, sp);
    a->free_span_bytes -= sp->hdr.size;
    free(sp->events);
    sp->events = NULL;
    hand_out(a, sa, sp, size, out);
    pthread_mutex_unlock(&a->lock);
    return SA_OK;
  }
  if ((sp = take_from_end(a, need, sa)) != NULL) {
    hand_out(a, sa, sp, size, out);
    pthread_mutex_unlock(&a->lock);
    return SA_OK;
  }
  /* Stitch from what is done, not grow: free spans first, then (without
   * the lock) this thread's cached blocks and every stream's empty
   * superblocks whose work completed (sa__reshape). */
  if (!unmap_until(a, need, false)) {
    pthread_mutex_unlock(&a->lock);
    sa__reshape(a);
    pthread_mutex_lock(&a->lock);
    (void)unmap_until(a, need, false);
  }
  sa_status st = map_new(a, need, &sp);
  if (st == SA_OK) hand_out(a, sa, sp, size, out);
  pthread_mutex_unlock(&a->lock);
  return st;
}

sa_status sa__span_free(sa_arena *a, sa_span *sp, sa_stream_arena *freer) {
  sa_record *r = NULL;
  if (atomic_load_explicit(&sp->xstate, memory_order_relaxed) == SA_BLOCK_RECORDED)
    r = sa__record_take(a, sp->hdr.base);
  unsigned nrec = r != NULL ? r->n : 0;
  /* Events on the freeing stream and on every recorded one. */
  sa_event *ev = malloc((nrec + 1) * sizeof *ev);
  sa_status st = ev == NULL ? SA_ERR_OUT_OF_MEMORY : SA_OK;
  unsigned n = 0;
  for (unsigned i = 0; st == SA_OK && i <= nrec; i++) {
    st = sa__event_record_new(a, i == 0 ? freer->stream : r->streams[i - 1], &ev[n]);
    if (st == SA_OK) n++;
  }
  if (st != SA_OK) { /* nothing changes: the span stays allocated, its record too */
    for (unsigned i = 0; i < n; i++) sa__event_drop(a, ev[i]);
    free(ev);
    sa__record_restore(a, r);
    return st;
  }
  sa__record_free(r);
  pthread_mutex_lock(&a->lock);
  atomic_store_explicit(&sp->xstate, SA_BLOCK_FREE, memory_order_relaxed);
  sp->events = ev;
  sp->nevents = n;
  sp->free_owner = nrec == 0 ? freer : NULL; /* recorded: nobody skips the waits */
  list_push(&a->free_spans, sp);
  a->free_span_bytes += sp->hdr.size;
  a->live_spans--;
  coalesce(a, sp);
  pthread_mutex_unlock(&a->lock);
  return SA_OK;
}

void sa__span_fini(sa_arena *a) {
  for (sa_span *sp = a->free_spans; sp != NULL; sp = sp->next) {
    (void)events_done(a, sp, true);
    for (unsigned i = 0; i < sp->nevents; i++)
      (void)a->drv->ops->event_destroy(a->drv, sp->events[i]);
    free(sp->events);
    sp->events = NULL;
  }
}
