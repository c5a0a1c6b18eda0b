/* Thread caches: per thread, one entry per (arena, stream).
 *
 * An entry holds, per size class, a small stack of blocks taken from its
 * stream arena in batches. Same-thread same-stream alloc and free touch only
 * the entry (alloc.c, free.c): no lock, no atomic read-modify-write. Blocks freed on
 * a stream other than their owner's collect in one open batch per entry,
 * sent on behind one event (flush_out). An entry is bound to a stream arena
 * (a counted reference) and checked against the arena's stream epoch, which
 * moves when a stream arena goes: then the thread's entries bound to one
 * that went give everything back and bind anew on their next use.
 * sa_stream_release takes back what every thread cached for its stream at
 * once (sa__tentry_release_stream). A thread that exits, and an entry
 * evicted (the least recently used of SA_TCACHE_ENTRIES), give everything
 * back without a driver call on the stream, which may be destroyed
 * (stream_arena.c says how that memory is made safe).
 *
 * Who frees an entry: its owner thread, always. An arena that is destroyed
 * detaches its entries (sa__entries_detach): it unlinks them and points
 * each one's arena at sa__detached_arena with a release store, after which
 * it never touches the entry again; the owner, seeing that arena (acquire)
 * on its next slow path, frees it. entries_lock orders detach against an owner that
 * retires an entry (exit, eviction) while its arena lives.
 *
 * Calls stream_arena.c below it; called by alloc.c, free.c and arena.c.
 */
#include <link.h>
#include <stdlib.h>
#include <string.h>

#include "thread_cache.h"
#include "../arena.h"
#include "../base/base.h"
#include "../base/hook.h"
#include "../large/kept.h"
#include "size_class.h"
#include "stream_arena.h"
#include "stream_return.h"

_Thread_local struct sa_tcache_s *sa__tl_cache SA_TLS_FAST;

struct sa_arena_s sa__detached_arena = {
    .xstream_epoch = UINT64_MAX, /* an entry's epoch is a count of gone streams */
    .xlarge_threshold = 0,       /* no size passes size - 1 < 0 */
    .range = {.size = 0},        /* no pointer is in it */
};

/* Every arena's entry list, and entry retirement against arena destroy. */
static pthread_mutex_t entries_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_key_t tcache_key;
static pthread_once_t tcache_once = PTHREAD_ONCE_INIT;

/* Else tcache_key is 0, maybe another owner's key. Atomic for unload_key,
 * which may run on a thread that never made a cache. */
static _Atomic bool xkey_made;

/* The lists entries_lock guards: an arena's entries, a stream arena's bound ones. */
SA_DLIST_FUNCTIONS(arena_entries, sa_tentry, arena_next, arena_prev)
SA_DLIST_FUNCTIONS(bound_entries, sa_tentry, bound_next, bound_prev)

/* The key's destructor, tcache_exit, is code of the shared object this file
 * is linked into (libstreamarena.so, the PyTorch plugin, a user's own), and
 * glibc calls it at the exit of every thread that holds a cache, whenever
 * that is. A dlclose that unmapped the object left it pointing at nothing:
 * such a thread crashed at its exit, though every arena had been destroyed,
 * and each load made a key that no unload deleted.
 *
 * So the library is linked with -z nodelete (BUILD.bazel's linkopts, which
 * every object that links it in gets): a dlclose leaves it mapped, with its
 * key and every thread's cache, threads retire their caches at exit as
 * ever, and a later dlopen gets the same copy back, its initial-exec
 * thread-local and its key included (one key per process, however often it
 * is loaded). A pin at run time (dlopen with RTLD_NOLOAD | RTLD_NODELETE
 * when the key is made) would do the same, but has the loader allocate at
 * a thread's first allocation, memory that LeakSanitizer reports where the
 * program interposes malloc (test/record_test.c does).
 *
 * An object built without the flag is unloaded for real, and
 * unload_key then deletes the key, so that no thread calls tcache_exit
 * after. That alone is a fallback, not a fix: the caches of live threads
 * are theirs to free (each may be retiring one, and its thread-local still
 * points at it), so they leak, and glibc does not stop a destructor that
 * an exiting thread already runs. An object with the flag runs unload_key
 * only as the process ends, when other destructors may still allocate:
 * there it keeps the key. */
static void tcache_exit(void *arg);
static void make_key(void) {
  bool made = pthread_key_create(&tcache_key, tcache_exit) == 0;
  atomic_store_explicit(&xkey_made, made, memory_order_release);
}

/* The dynamic section of the object this file is linked into (the linker
 * defines it); none in a static executable. */
extern ElfW(Dyn) _DYNAMIC[] __attribute__((weak));

/* Was the object linked with -z nodelete? */
static bool linked_nodelete(void) {
  for (const ElfW(Dyn) *dyn = _DYNAMIC; dyn != NULL && dyn->d_tag != DT_NULL; dyn++)
    if (dyn->d_tag == DT_FLAGS_1) return (dyn->d_un.d_val & DF_1_NODELETE) != 0;
  return false;
}

__attribute__((destructor)) static void unload_key(void) {
  if (atomic_load_explicit(&xkey_made, memory_order_acquire) && !linked_nodelete())
    (void)pthread_key_delete(tcache_key);
}

/* Bins start with no capacity, so the fast paths miss until the slow path
 * gives them their slots. */
sa_status sa__tbin_init(sa_tbin *b, unsigned cls) {
  uint16_t cap = (uint16_t)sa_class_bin_capacity(cls);
  b->slots = malloc(cap * sizeof *b->slots);
  if (b->slots == NULL) return SA_ERR_OUT_OF_MEMORY;
  b->cap = cap;
  b->block_size = (uint32_t)sa_class_size(cls); /* <= SA_CLASS_MAX_SIZE */
  return SA_OK;
}

void sa__tentry_publish_live(sa_tentry *e) {
  sa_arena *a = atomic_load_explicit(&e->xarena, memory_order_relaxed);
  if (e->live_delta != 0 && a != &sa__detached_arena) sa__live_add(a, e->live_delta);
  e->live_delta = 0;
}

static void flush_bin(sa_tentry *e, unsigned cls, uint32_t keep, sa_named named) {
  sa_tbin *b = &e->bins[cls];
  if (b->n <= keep) return;
  uint32_t give = b->n - keep;
  sa__stream_arena_give(e->sarena, b->slots, give, named);
  memmove(b->slots, b->slots + give, keep * sizeof *b->slots);
  b->n = (uint16_t)keep;
}

/* Give the oldest blocks of a bin back to the stream arena, keeping keep. */
void sa__tentry_flush_bin(sa_tentry *e, unsigned cls, uint32_t keep) {
  flush_bin(e, cls, keep, SA_NAMED);
}

/* The open batch goes on (stream_return.c: behind an event when named, else
 * without one or parked); on a driver failure it stays, and the failure is
 * returned. */
sa_status sa__tentry_flush_out(sa_tentry *e, sa_named named) {
  if (e->out == NULL) return SA_OK;
  sa_status st = sa__stream_arena_hand_over(e->out, named);
  if (st == SA_OK) e->out = NULL;
  return st;
}

void sa__tentry_give_back_kept(sa_tentry *e, sa_named named) {
  sa_span *sp = sa__tentry_take_kept(e);
  if (sp == NULL) return;
  sa_arena *a = atomic_load_explicit(&e->xarena, memory_order_relaxed);
  if (named == SA_UNNAMED || sa__span_kept_free(a, sp) != SA_OK) sa__span_kept_orphan(a, sp);
}

void sa__tentries_orphan_kept(sa_arena *a) {
  pthread_mutex_lock(&entries_lock); /* entries stay while listed */
  for (sa_tentry *e = a->tcaches.entries; e != NULL; e = e->arena_next)
    sa__tentry_give_back_kept(e, SA_UNNAMED);
  pthread_mutex_unlock(&entries_lock);
}

/* Everything e holds back to its stream arena. */
static void entry_flush_all(sa_tentry *e, sa_named named) {
  if (e->sarena != NULL)
    for (unsigned c = 0; c < SA_CLASS_COUNT; c++) flush_bin(e, c, 0, named);
  (void)sa__tentry_flush_out(e, named); /* a batch that could not go stays */
  sa__tentry_give_back_kept(e, named);
}

/* e binds to sarena (a reference the caller took) and joins its bound list,
 * which sa__tentry_release_stream walks. entries_lock held. */
static void entry_bind_to(sa_tentry *e, sa_stream_arena *sarena) {
  e->sarena = sarena;
  bound_entries_push(&sarena->bound, e);
}

/* entries_lock held. */
static void entry_unbind(sa_tentry *e) {
  sa_stream_arena *sarena = e->sarena;
  if (sarena == NULL) return;
  bound_entries_unlink(&sarena->bound, e);
  e->sarena = NULL;
  sa__stream_arena_unbind(sarena);
}

static void entry_free(sa_tentry *e) {
  for (unsigned c = 0; c < SA_CLASS_COUNT; c++) free(e->bins[c].slots);
  sa__deferred_free(e->out);
  free(e);
}

/* Exit or eviction: everything back without touching the stream (it may be
 * destroyed), unlinked from its arena if the arena still lives; freed. */
static void entry_retire(sa_tentry *e) {
  pthread_mutex_lock(&entries_lock);
  sa_arena *a = atomic_load_explicit(&e->xarena, memory_order_relaxed);
  if (a != &sa__detached_arena) {
    entry_flush_all(e, SA_UNNAMED);
    sa__tentry_publish_live(e);
    entry_unbind(e);
    atomic_fetch_add_explicit(&a->tcaches.xretired_fast_allocs,
                              atomic_load_explicit(&e->xfast_allocs, memory_order_relaxed),
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&a->tcaches.xretired_fast_frees,
                              atomic_load_explicit(&e->xfast_frees, memory_order_relaxed),
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&a->tcaches.xretired_kept_reuses,
                              atomic_load_explicit(&e->xkept_reuses, memory_order_relaxed),
                              memory_order_relaxed);
    arena_entries_unlink(&a->tcaches.entries, e);
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
  sa_tentry *e = a->tcaches.entries;
  a->tcaches.entries = NULL;
  while (e != NULL) {
    sa_tentry *next = e->arena_next;
    /* From this store on the entry is its owner's to free at any moment. */
    atomic_store_explicit(&e->xarena, &sa__detached_arena, memory_order_release);
    sa__hook(SA_HOOK_ENTRY_DETACHED, a);
    e = next;
  }
  pthread_mutex_unlock(&entries_lock);
}

void sa__tentry_counts(sa_arena *a, sa_tentry_counts *out) {
  *out = (sa_tentry_counts){0};
  sa__hook(SA_HOOK_FAST_COUNTS, a);
  pthread_mutex_lock(&entries_lock);
  /* The exited threads' sums under the lock a retirement holds while it
   * adds to them and unlinks its entry: each entry counts once, live or
   * retired. Read before the lock, an entry retired in between counted
   * in neither. */
  out->fast_allocs = atomic_load_explicit(&a->tcaches.xretired_fast_allocs, memory_order_relaxed);
  out->fast_frees = atomic_load_explicit(&a->tcaches.xretired_fast_frees, memory_order_relaxed);
  out->kept_reuses = atomic_load_explicit(&a->tcaches.xretired_kept_reuses, memory_order_relaxed);
  /* The arena lock too: a kept span's size changes only in its free,
   * which its owner makes under it once the entry let go. */
  pthread_mutex_lock(&a->lock);
  for (sa_tentry *e = a->tcaches.entries; e != NULL; e = e->arena_next) {
    out->fast_allocs += atomic_load_explicit(&e->xfast_allocs, memory_order_relaxed);
    out->fast_frees += atomic_load_explicit(&e->xfast_frees, memory_order_relaxed);
    out->kept_reuses += atomic_load_explicit(&e->xkept_reuses, memory_order_relaxed);
    sa_span *sp = atomic_load_explicit(&e->xkept, memory_order_relaxed);
    if (sp == NULL) continue;
    out->kept_spans++;
    out->kept_bytes += sp->size;
  }
  pthread_mutex_unlock(&a->lock);
  pthread_mutex_unlock(&entries_lock);
}

/* sa_stream_release names only its stream, and no thread may use the
 * stream during the call: its entries hold still while their blocks and
 * open batches go back (clean: the release waited for the stream's work).
 * Their owners see the bumped epoch and bind anew on their next use. */
void sa__tentry_release_stream(sa_stream_arena *sarena) {
  pthread_mutex_lock(&entries_lock);
  while (sarena->bound != NULL) { /* only sarena's entries, not every thread's */
    sa_tentry *e = sarena->bound;
    entry_flush_all(e, SA_UNNAMED);
    entry_unbind(e);
  }
  pthread_mutex_unlock(&entries_lock);
}

static struct sa_tcache_s *tcache_get(void) {
  struct sa_tcache_s *tc = sa__tl_cache;
  if (tc != NULL) return tc;
  (void)pthread_once(&tcache_once, make_key);
  if (!atomic_load_explicit(&xkey_made, memory_order_relaxed))
    return NULL; /* no key left: no cache, rather than one nobody retires */
  tc = calloc(1, sizeof *tc);
  if (tc == NULL) return NULL;
  if (pthread_setspecific(tcache_key, tc) != 0) {
    free(tc);
    return NULL;
  }
  sa__tl_cache = tc;
  return tc;
}

/* A stream arena of a went (released, or its stream found destroyed):
 * this thread's entries bound to one that is gone give everything back
 * (not a call on that stream) and bind anew when next used. */
static void revalidate(struct sa_tcache_s *tc, sa_arena *a, uint64_t epoch) {
  pthread_mutex_lock(&entries_lock); /* against sa__tentry_release_stream */
  for (unsigned i = 0; i < tc->n; i++) {
    sa_tentry *x = tc->entries[i];
    if (atomic_load_explicit(&x->xarena, memory_order_relaxed) != a) continue;
    if (x->sarena != NULL && sa__stream_arena_gone(x->sarena)) {
      entry_flush_all(x, SA_UNNAMED);
      entry_unbind(x);
    }
    x->epoch = epoch;
  }
  pthread_mutex_unlock(&entries_lock);
}

static sa_status entry_create(sa_arena *a, sa_stream s, sa_stream_arena *sarena, sa_tentry **out) {
  sa_tentry *e = calloc(1, sizeof *e);
  if (e == NULL) return SA_ERR_OUT_OF_MEMORY;
  e->stream = s;
  e->epoch = atomic_load_explicit(&a->xstream_epoch, memory_order_acquire);
  e->va_base = a->range.base;
  e->va_size = a->range.size;
  atomic_store_explicit(&e->xarena, a, memory_order_relaxed);
  pthread_mutex_lock(&entries_lock);
  entry_bind_to(e, sarena);
  arena_entries_push(&a->tcaches.entries, e);
  pthread_mutex_unlock(&entries_lock);
  *out = e;
  return SA_OK;
}

/* The least recently used entry leaves: everything back, without a call on
 * its stream. */
static void evict(struct sa_tcache_s *tc) {
  unsigned v = 0;
  for (unsigned i = 1; i < tc->n; i++)
    if (tc->entries[i]->last_use < tc->entries[v]->last_use) v = i;
  sa_tentry *victim = tc->entries[v];
  tc->entries[v] = tc->entries[--tc->n];
  if (tc->last == victim) tc->last = NULL;
  entry_retire(victim);
}

/* Bind *e (NULL: a new entry for (a, s)) to s's stream arena if unbound. */
static sa_status entry_bind(struct sa_tcache_s *tc, sa_arena *a, sa_stream s, sa_tentry **pe) {
  sa_tentry *e = *pe;
  if (e == NULL || e->sarena == NULL) {
    /* The first use of the handle by this thread (or since its stream
     * arena went): the stream is validated and its id compared. */
    sa_stream_arena *sarena;
    sa_status st = sa__stream_arena_get(a, s, &sarena);
    if (st != SA_OK) return st;
    if (e != NULL) {
      pthread_mutex_lock(&entries_lock); /* sa__tentry_release_stream reads it */
      entry_bind_to(e, sarena);
      pthread_mutex_unlock(&entries_lock);
    } else {
      if (tc->n == SA_TCACHE_ENTRIES) evict(tc);
      st = entry_create(a, s, sarena, &e);
      if (st != SA_OK) {
        sa__stream_arena_unbind(sarena);
        return st;
      }
      tc->entries[tc->n++] = e;
    }
  }
  *pe = e;
  return SA_OK;
}

/* A thread keeps one unpublished live-byte delta per arena, on the entry
 * it used last there (sa_get_stats bounds it per thread): the deltas of a's
 * other entries move to e, which the fast paths use next. */
static void fold_live(struct sa_tcache_s *tc, sa_arena *a, sa_tentry *e) {
  for (unsigned i = 0; i < tc->n; i++) {
    sa_tentry *x = tc->entries[i];
    if (x == e || atomic_load_explicit(&x->xarena, memory_order_relaxed) != a) continue;
    e->live_delta += x->live_delta;
    x->live_delta = 0;
  }
  if (sa__live_due(e->live_delta, 0)) sa__tentry_publish_live(e);
}

/* tc's entry for (a, s), or NULL; entries of destroyed arenas are freed on
 * the way. */
static sa_tentry *entry_find(struct sa_tcache_s *tc, sa_arena *a, sa_stream s) {
  sa_tentry *e = NULL;
  for (unsigned i = 0; i < tc->n;) {
    sa_tentry *x = tc->entries[i];
    /* Acquire: pairs with detach's release, after which detach is done
     * with the entry and it is ours to free. */
    sa_arena *xa = atomic_load_explicit(&x->xarena, memory_order_acquire);
    if (xa == &sa__detached_arena) { /* its arena is gone: drop it */
      entry_free(x);
      tc->entries[i] = tc->entries[--tc->n];
      if (tc->last == x) tc->last = NULL;
      continue;
    }
    if (xa == a && x->stream == s) e = x;
    i++;
  }
  return e;
}

sa_status sa__tentry_get(sa_arena *a, sa_stream s, sa_tentry **out) {
  struct sa_tcache_s *tc = tcache_get();
  if (tc == NULL) return SA_ERR_OUT_OF_MEMORY;
  /* The last entry first: a thread that uses many streams would otherwise
   * scan them all on every slow path (See Note [Last entry first]).
   * Acquire as in entry_find; a destroyed arena's entry has the detached
   * arena, so it never matches a live one. */
  sa_tentry *e = tc->last;
  if (e == NULL || atomic_load_explicit(&e->xarena, memory_order_acquire) != a ||
      e->stream != s)
    e = entry_find(tc, a, s);
  uint64_t epoch = atomic_load_explicit(&a->xstream_epoch, memory_order_acquire);
  if (e != NULL && e->epoch != epoch) revalidate(tc, a, epoch);
  sa_status st = SA_OK;
  if (sa_unlikely(e == NULL || e->sarena == NULL)) st = entry_bind(tc, a, s, &e);
  if (st != SA_OK) return st;
  bool renamed = false;
  if (sa_unlikely(atomic_load_explicit(&e->sarena->xunfenced, memory_order_relaxed)))
    st = sa__stream_arena_fence(e->sarena, &renamed); /* this call names its stream */
  if (st != SA_OK) return st;
  if (renamed) {
    /* s is a new stream with an old handle: start from a new stream arena. */
    revalidate(tc, a, atomic_load_explicit(&a->xstream_epoch, memory_order_acquire));
    st = entry_bind(tc, a, s, &e);
    if (st != SA_OK) return st;
  }
  /* Another stream or an unmap waits for an event here that a span free
   * left unrecorded: this call names the stream. */
  if (sa_unlikely(atomic_load_explicit(&e->sarena->timeline.xwanted, memory_order_relaxed)))
    sa__stream_arena_record_wanted(e->sarena);
  /* Spans kept by entries of the stream that went (large/kept.h): freed
   * in this call, which names it. One that cannot take its mark (the
   * stream is captured) waits for the next. */
  if (sa_unlikely(atomic_load_explicit(&e->sarena->xorphans, memory_order_relaxed) != 0))
    sa__span_orphans_free(a, e->sarena);
  /* A span kept by the last entry goes back at any slow path (large/kept.h):
   * kept across the slow paths of a trace of many sizes, it held memory
   * that best fit and coalescing would have reused (docs/BENCHMARKS.md, run
   * Z). Named where this call names its stream, else an orphan. Only this
   * arena's: another's entry may be detached. */
  sa_tentry *last = tc->last;
  if (last != NULL && atomic_load_explicit(&last->xkept, memory_order_relaxed) != NULL &&
      atomic_load_explicit(&last->xarena, memory_order_acquire) == a)
    sa__tentry_give_back_kept(last, last == e ? SA_NAMED : SA_UNNAMED);
  /* e itself may keep one from before the thread's calls went to another
   * arena, whose entry was last since: this call names e's stream. */
  if (e != last && atomic_load_explicit(&e->xkept, memory_order_relaxed) != NULL)
    sa__tentry_give_back_kept(e, SA_NAMED);
  if (tc->last != e) fold_live(tc, a, e); /* the last one holds them already */
  e->last_use = ++tc->clock;
  tc->last = e;
  *out = e;
  return SA_OK;
}

void sa__tentry_flush_own(sa_arena *a, sa_stream_arena *named_sarena, sa_flush_own which) {
  struct sa_tcache_s *tc = sa__tl_cache;
  if (tc == NULL) return;
  pthread_mutex_lock(&entries_lock); /* against sa__tentry_release_stream */
  for (unsigned i = 0; i < tc->n; i++) {
    sa_tentry *e = tc->entries[i];
    if (atomic_load_explicit(&e->xarena, memory_order_relaxed) != a) continue;
    sa_named named = named_sarena != NULL && e->sarena == named_sarena ? SA_NAMED : SA_UNNAMED;
    if (named == SA_UNNAMED || which == SA_FLUSH_ALL) entry_flush_all(e, named);
    sa__tentry_publish_live(e);
  }
  pthread_mutex_unlock(&entries_lock);
}

void sa__tentry_publish_own(sa_arena *a) {
  struct sa_tcache_s *tc = sa__tl_cache;
  if (tc == NULL) return;
  for (unsigned i = 0; i < tc->n; i++)
    if (atomic_load_explicit(&tc->entries[i]->xarena, memory_order_relaxed) == a)
      sa__tentry_publish_live(tc->entries[i]);
}
