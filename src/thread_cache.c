/* Thread caches: per thread, one entry per (arena, stream).
 *
 * An entry holds, per size class, a small stack of blocks taken from its
 * stream arena in batches. Same-thread same-stream alloc and free touch only
 * the entry (alloc.c): no lock, no atomic read-modify-write. Blocks freed on
 * a stream other than their owner's collect in one open batch per entry,
 * flushed with one event (flush_out). An entry is bound to a stream arena
 * and the arena's stream epoch; sa_stream_release bumps the epoch, and the
 * next slow path here gives the blocks of a released stream back.
 * A thread that exits gives everything back (tcache_exit).
 *
 * Who frees an entry: its owner thread, always. An arena that is destroyed
 * detaches its entries (sa__entries_detach): it unlinks them and clears
 * each one's arena with a release store, after which it never touches the
 * entry again; the owner, seeing the cleared arena (acquire) on its next
 * slow path, frees it. entries_lock orders detach against an owner that
 * retires an entry (exit, eviction) while its arena lives.
 *
 * Calls stream_arena.c below it; called by alloc.c, arena.c, reclaim.c.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

_Thread_local struct sa_tcache_s *sa__tl_cache SA_TLS_FAST;

/* Every arena's entry list, and entry retirement against arena destroy. */
static pthread_mutex_t entries_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_key_t tcache_key;
static pthread_once_t tcache_once = PTHREAD_ONCE_INIT;

static void tcache_exit(void *arg);
static void make_key(void) { (void)pthread_key_create(&tcache_key, tcache_exit); }

/* Blocks cached per class: about 1 MiB of blocks, between 2 and 64. */
static uint16_t bin_capacity(unsigned cls) {
  size_t cap = ((size_t)1 << 20) / sa_class_size(cls);
  if (cap < 2) cap = 2;
  if (cap > 64) cap = 64;
  return (uint16_t)cap;
}

/* Bins start with no capacity, so the fast paths miss until the slow path
 * gives them their slots. */
sa_status sa__tbin_init(sa_tbin *b, unsigned cls) {
  uint16_t cap = bin_capacity(cls);
  b->slots = malloc(cap * sizeof *b->slots);
  if (b->slots == NULL) return SA_ERR_OUT_OF_MEMORY;
  b->cap = cap;
  b->block_size = (uint32_t)sa_class_size(cls); /* <= SA_CLASS_MAX_SIZE */
  return SA_OK;
}

void sa__tentry_publish_live(sa_tentry *e) {
  sa_arena *a = atomic_load_explicit(&e->xarena, memory_order_relaxed);
  if (e->live_delta != 0 && a != NULL) sa__live_add(a, e->live_delta);
  e->live_delta = 0;
}

/* Give the oldest blocks of a bin back to the stream arena, keeping keep. */
void sa__tentry_flush_bin(sa_tentry *e, unsigned cls, uint32_t keep) {
  sa_tbin *b = &e->bins[cls];
  if (b->n <= keep) return;
  uint32_t give = b->n - keep;
  sa__stream_arena_give(e->sarena, b->slots, give);
  memmove(b->slots, b->slots + give, keep * sizeof *b->slots);
  b->n = (uint16_t)keep;
}

/* Send the open cross-stream batch to its owner behind one event on the
 * stream the blocks were freed on. A stream released since then may be
 * destroyed already: its release waited for its work, so no event is
 * needed (the lock keeps a release from slipping in between). On a driver
 * failure the batch stays. */
void sa__tentry_flush_out(sa_tentry *e) {
  sa_deferred *d = e->out;
  if (d == NULL) return;
  sa_arena *a = atomic_load_explicit(&e->xarena, memory_order_relaxed);
  if (d->nevents == 0) {
    sa_stream_arena *f = d->freer;
    pthread_mutex_lock(&f->lock);
    sa_status st = f->released ? SA_OK : sa__event_record_new(a, f->stream, &d->events[0]);
    if (st == SA_OK && !f->released) d->nevents = 1;
    pthread_mutex_unlock(&f->lock);
    if (st != SA_OK) return;
  }
  e->out = NULL;
  sa__stream_arena_push_deferred(d->owner, d);
}

static void entry_flush_all(sa_tentry *e) {
  for (unsigned c = 0; c < SA_CLASS_COUNT; c++) sa__tentry_flush_bin(e, c, 0);
  sa__tentry_flush_out(e);
  sa__tentry_publish_live(e);
}

static void entry_free(sa_tentry *e) {
  for (unsigned c = 0; c < SA_CLASS_COUNT; c++) free(e->bins[c].slots);
  sa__deferred_free(e->out);
  free(e);
}

/* Flush e and unlink it from its arena, if the arena still lives. */
static void entry_retire(sa_tentry *e) {
  pthread_mutex_lock(&entries_lock);
  sa_arena *a = atomic_load_explicit(&e->xarena, memory_order_relaxed);
  if (a != NULL) {
    entry_flush_all(e);
    atomic_fetch_add_explicit(&a->xretired_fast_allocs,
                              atomic_load_explicit(&e->xfast_allocs, memory_order_relaxed),
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&a->xretired_fast_frees,
                              atomic_load_explicit(&e->xfast_frees, memory_order_relaxed),
                              memory_order_relaxed);
    if (e->arena_prev != NULL)
      e->arena_prev->arena_next = e->arena_next;
    else
      a->entries = e->arena_next;
    if (e->arena_next != NULL) e->arena_next->arena_prev = e->arena_prev;
  }
  pthread_mutex_unlock(&entries_lock);
  entry_free(e);
}

static void tcache_exit(void *arg) {
  struct sa_tcache_s *tc = arg;
  sa__tl_cache = NULL;
  for (unsigned i = 0; i < tc->n; i++) entry_retire(tc->entries[i]);
  free(tc);
}

void sa__entries_detach(sa_arena *a) {
  pthread_mutex_lock(&entries_lock);
  sa_tentry *e = a->entries;
  a->entries = NULL;
  while (e != NULL) {
    sa_tentry *next = e->arena_next;
    /* From this store on the entry is its owner's to free at any moment. */
    atomic_store_explicit(&e->xarena, NULL, memory_order_release);
    sa__hook(SA_HOOK_ENTRY_DETACHED, a);
    e = next;
  }
  pthread_mutex_unlock(&entries_lock);
}

void sa__tentry_fast_counts(sa_arena *a, uint64_t *allocs, uint64_t *frees) {
  pthread_mutex_lock(&entries_lock);
  for (sa_tentry *e = a->entries; e != NULL; e = e->arena_next) {
    *allocs += atomic_load_explicit(&e->xfast_allocs, memory_order_relaxed);
    *frees += atomic_load_explicit(&e->xfast_frees, memory_order_relaxed);
  }
  pthread_mutex_unlock(&entries_lock);
}

static struct sa_tcache_s *tcache_get(void) {
  struct sa_tcache_s *tc = sa__tl_cache;
  if (tc != NULL) return tc;
  (void)pthread_once(&tcache_once, make_key);
  tc = calloc(1, sizeof *tc);
  if (tc == NULL) return NULL;
  if (pthread_setspecific(tcache_key, tc) != 0) {
    free(tc);
    return NULL;
  }
  sa__tl_cache = tc;
  return tc;
}

/* Bring e up to date with the arena's stream epoch: if its stream was
 * released, give the blocks back and bind to the stream's new arena. */
static sa_status entry_revalidate(sa_tentry *e, sa_arena *a) {
  uint64_t epoch = atomic_load_explicit(&a->xstream_epoch, memory_order_acquire);
  pthread_mutex_lock(&e->sarena->lock);
  bool released = e->sarena->released;
  pthread_mutex_unlock(&e->sarena->lock);
  if (released) {
    entry_flush_all(e);
    sa_stream_arena *sa;
    sa_status st = sa__stream_arena_get(a, e->stream, &sa);
    if (st != SA_OK) return st;
    e->sarena = sa;
  }
  e->epoch = epoch;
  return SA_OK;
}

static sa_status entry_create(sa_arena *a, sa_stream s, sa_tentry **out) {
  sa_stream_arena *sa;
  sa_status st = sa__stream_arena_get(a, s, &sa);
  if (st != SA_OK) return st;
  sa_tentry *e = calloc(1, sizeof *e);
  if (e == NULL) return SA_ERR_OUT_OF_MEMORY;
  e->stream = s;
  e->sarena = sa;
  e->epoch = atomic_load_explicit(&a->xstream_epoch, memory_order_acquire);
  atomic_store_explicit(&e->xarena, a, memory_order_relaxed);
  pthread_mutex_lock(&entries_lock);
  e->arena_next = a->entries;
  if (a->entries != NULL) a->entries->arena_prev = e;
  a->entries = e;
  pthread_mutex_unlock(&entries_lock);
  *out = e;
  return SA_OK;
}

sa_status sa__tentry_get(sa_arena *a, sa_stream s, sa_tentry **out) {
  struct sa_tcache_s *tc = tcache_get();
  if (tc == NULL) return SA_ERR_OUT_OF_MEMORY;
  sa_tentry *e = NULL;
  for (unsigned i = 0; i < tc->n;) {
    sa_tentry *x = tc->entries[i];
    /* Acquire: pairs with detach's release, after which detach is done
     * with the entry and it is ours to free. */
    sa_arena *xa = atomic_load_explicit(&x->xarena, memory_order_acquire);
    if (xa == NULL) { /* its arena is gone: drop it */
      entry_free(x);
      tc->entries[i] = tc->entries[--tc->n];
      if (tc->last == x) tc->last = NULL;
      continue;
    }
    if (xa == a && x->stream == s) e = x;
    i++;
  }
  if (e == NULL) {
    if (tc->n == sizeof tc->entries / sizeof tc->entries[0]) {
      /* Evict the oldest entry: its blocks go back to its stream. */
      sa_tentry *victim = tc->entries[0];
      memmove(tc->entries, tc->entries + 1, (tc->n - 1) * sizeof tc->entries[0]);
      tc->n--;
      if (tc->last == victim) tc->last = NULL;
      entry_retire(victim);
    }
    sa_status st = entry_create(a, s, &e);
    if (st != SA_OK) return st;
    tc->entries[tc->n++] = e;
  } else if (e->epoch != atomic_load_explicit(&a->xstream_epoch, memory_order_acquire)) {
    sa_status st = entry_revalidate(e, a);
    if (st != SA_OK) return st;
  }
  tc->last = e;
  *out = e;
  return SA_OK;
}

void sa__tentry_flush_own(sa_arena *a) {
  struct sa_tcache_s *tc = sa__tl_cache;
  if (tc == NULL) return;
  for (unsigned i = 0; i < tc->n; i++) {
    sa_tentry *e = tc->entries[i];
    if (atomic_load_explicit(&e->xarena, memory_order_relaxed) == a) entry_flush_all(e);
  }
}

void sa__tentry_publish_own(sa_arena *a) {
  struct sa_tcache_s *tc = sa__tl_cache;
  if (tc == NULL) return;
  for (unsigned i = 0; i < tc->n; i++)
    if (atomic_load_explicit(&tc->entries[i]->xarena, memory_order_relaxed) == a)
      sa__tentry_publish_live(tc->entries[i]);
}
