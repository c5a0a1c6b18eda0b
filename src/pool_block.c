/* Graph pools' blocks: the fit index, carving and merging, what a free
 * block waits for, frees and records routed from sa_free and
 * sa_record_stream, and the arena's registry of pool segments.
 *
 * A pool's free blocks sit in one treap (base/treap.h) keyed by (tag,
 * size, base): a stream's best fit is a ceiling search among its own
 * blocks and one among the clean ones, O(log n), with no driver call.
 * Blocks of other streams are looked at only when neither fits: their
 * events are queried (a block whose event completed turns clean) and,
 * failing that, the best of them is taken behind a wait of the allocating
 * stream on the device, which the driver refuses for a stream being
 * captured. The treap's priorities come from a hash of a block's base, so
 * its shape depends on the addresses only, never on a random state.
 *
 * Every function runs with the pool's lock held unless pool_block.h says
 * otherwise. Called by pool.c, free.c (sa_free's and sa_record_stream's
 * way in), arena.c (the pools' state at create and destroy); calls the
 * event pool and the driver.
 */
#include <stdlib.h>
#include <string.h>

#include "pool_block.h"
#include "arena.h"
#include "base/base.h"
#include "base/chain_table.h"
#include "base/event_pool.h"
#include "driver/driver.h"

/* ------------------------------------------------------------------------
 * The fit index
 * ---------------------------------------------------------------------- */

/* b's key against (tag, size, base): negative, zero or positive. */
static int key_cmp(const sa_pblock *b, uint64_t tag, size_t size, uintptr_t base) {
  if (b->tag != tag) return b->tag < tag ? -1 : 1;
  if (b->size != size) return b->size < size ? -1 : 1;
  if (b->base != base) return b->base < base ? -1 : 1;
  return 0;
}

static sa_pblock *block_of(const sa_treap_node *n) { return SA_TREAP_OWNER(n, sa_pblock, fit); }

static bool block_before(const sa_treap_node *x, const sa_treap_node *y) {
  const sa_pblock *by = block_of(y);
  return key_cmp(block_of(x), by->tag, by->size, by->base) < 0;
}

/* The smallest free block of tag holding at least size bytes. */
static sa_pblock *treap_ceiling(const sa_treap_node *t, uint64_t tag, size_t size) {
  sa_pblock *best = NULL;
  while (t != NULL) {
    if (key_cmp(block_of(t), tag, size, 0) >= 0) {
      best = block_of(t);
      t = t->left;
    } else {
      t = t->right;
    }
  }
  return best != NULL && best->tag == tag ? best : NULL;
}

/* Whether another stream may take the free block b once its event
 * completed. */
static bool evented_block(const sa_pblock *b) { return b->event != NULL && !b->stream_only; }

/* A free block into the index, and its counts; its key must not change
 * until fit_del. */
static void fit_add(sa_pool *pool, sa_pblock *b) {
  b->state = SA_PBLOCK_FREE;
  sa__treap_insert(&pool->fit_root, &b->fit, block_before);
  pool->nfree++;
  pool->free_bytes += b->size;
  if (evented_block(b)) pool->nevented++;
}

static void fit_del(sa_pool *pool, sa_pblock *b) {
  SA_ASSERT(b->state == SA_PBLOCK_FREE);
  sa__treap_remove(&pool->fit_root, &b->fit, block_before);
  pool->nfree--;
  pool->free_bytes -= b->size;
  if (evented_block(b)) pool->nevented--;
}

/* The free blocks in key order into out (at most cap of them, those with
 * an event only where evented); returns how many there are. */
static size_t treap_collect(const sa_treap_node *t, bool evented, sa_pblock **out, size_t cap,
                            size_t n) {
  if (t == NULL) return n;
  n = treap_collect(t->left, evented, out, cap, n);
  if (!evented || evented_block(block_of(t))) {
    if (n < cap) out[n] = block_of(t);
    n++;
  }
  return treap_collect(t->right, evented, out, cap, n);
}

/* ------------------------------------------------------------------------
 * Descriptors
 * ---------------------------------------------------------------------- */

sa_pblock *sa__pblock_new(sa_pool *pool) {
  sa_pblock *b = pool != NULL ? pool->spare : NULL;
  if (b != NULL) {
    pool->spare = b->next;
    memset(b, 0, sizeof *b);
    return b;
  }
  return calloc(1, sizeof(sa_pblock));
}

/* b's memory belongs to another block now, or to no one: its descriptor
 * goes to the spares. */
static void pblock_put(sa_pool *pool, sa_pblock *b) {
  sa__chain_remove(&pool->blocks, &b->by_base);
  free(b->recorded);
  free(b->waits);
  memset(b, 0, sizeof *b);
  b->state = 0xff; /* a spare: no state of a block's */
  b->next = pool->spare;
  pool->spare = b;
}

/* b (base set) into the table of blocks by base. */
static void table_add(sa_pool *pool, sa_pblock *b) {
  b->by_base.key = b->base;
  b->fit.prio = sa__treap_priority(b->base);
  sa__chain_push(&pool->blocks, &b->by_base);
  if (pool->blocks.n > 2 * sa__chain_buckets(&pool->blocks))
    (void)sa__chain_double(&pool->blocks); /* else chains get longer */
}

/* n after b in b's segment. */
static void link_after(sa_pblock *b, sa_pblock *n) {
  n->seg = b->seg;
  n->prev = b;
  n->next = b->next;
  if (b->next != NULL) b->next->prev = n;
  b->next = n;
}

static void unlink_block(sa_pblock *b) {
  if (b->prev != NULL)
    b->prev->next = b->next;
  else
    b->seg->first = b->next;
  if (b->next != NULL) b->next->prev = b->prev;
}

void sa__pool_seg_add(sa_pool *pool, sa_pool_seg *seg, sa_pblock *b) {
  seg->pool = pool;
  seg->first = b;
  seg->next = pool->segs;
  pool->segs = seg;
  pool->nsegs++;
  pool->reserved += seg->size;
  *b = (sa_pblock){.base = seg->base, .size = seg->size, .seg = seg};
  table_add(pool, b);
  fit_add(pool, b); /* clean: the growth synchronized its stream */
}

sa_pblock *sa__pool_seg_last(const sa_pool_seg *seg) {
  sa_pblock *b = seg->first;
  while (b->next != NULL) b = b->next;
  return b;
}

/* ------------------------------------------------------------------------
 * What a free block waits for
 * ---------------------------------------------------------------------- */

static void drop_event(sa_arena *a, sa_event *e) {
  if (*e == NULL) return;
  sa__event_drop(a, *e);
  *e = NULL;
}

bool sa__pool_usable(const sa_pblock *b, sa_stream stream) {
  return b->tag == 0 || b->tag == sa__pool_tag(stream);
}

/* Whether the free blocks x, then y next to it, may be one block: the
 * same streams may take both, now and later. A clean block never merges
 * with a tagged one, which would make clean memory wait for an event, or
 * (stream_only) be one stream's for good. */
static bool mergeable(const sa_pblock *x, const sa_pblock *y) {
  return x->state == SA_PBLOCK_FREE && y->state == SA_PBLOCK_FREE && x->tag == y->tag &&
         x->stream_only == y->stream_only;
}

/* y's guard joins x's (mergeable: the same tag), which then covers both:
 * the later free's event (recorded later on the same stream, it completes
 * after the earlier one, and the last release waits for it). */
static void join_guard(sa_arena *a, sa_pblock *x, sa_pblock *y) {
  SA_ASSERT(x->tag == y->tag && x->stream_only == y->stream_only);
  if (y->tag == 0) return;
  if (y->event == NULL) {
    /* x's stays: none later was recorded on the stream. */
  } else if (x->event == NULL || y->seq > x->seq) {
    drop_event(a, &x->event);
    x->event = y->event;
    y->event = NULL;
  } else {
    drop_event(a, &y->event);
  }
  if (y->seq > x->seq) x->seq = y->seq;
}

/* b, free and out of the index, merged with its free neighbours where
 * they may merge; returns the block that holds b's memory now (out of the
 * index too). */
static sa_pblock *coalesce(sa_pool *pool, sa_pblock *b) {
  sa_arena *a = pool->arena;
  b->state = SA_PBLOCK_FREE;
  sa_pblock *n = b->next;
  if (n != NULL && mergeable(b, n)) {
    fit_del(pool, n);
    join_guard(a, b, n);
    b->size += n->size;
    unlink_block(n);
    pblock_put(pool, n);
  }
  sa_pblock *p = b->prev;
  if (p != NULL && mergeable(p, b)) {
    fit_del(pool, p);
    join_guard(a, p, b);
    p->size += b->size;
    unlink_block(b);
    pblock_put(pool, b);
    b = p;
  }
  return b;
}

/* b, no longer live or pending, into the free blocks. */
static void make_free(sa_pool *pool, sa_pblock *b) { fit_add(pool, coalesce(pool, b)); }

sa_pblock *sa__pool_fit(sa_pool *pool, size_t size, sa_stream stream) {
  sa_pblock *own = treap_ceiling(pool->fit_root, sa__pool_tag(stream), size);
  sa_pblock *clean = treap_ceiling(pool->fit_root, 0, size);
  if (own == NULL) return clean;
  if (clean == NULL) return own;
  /* The smaller; on a tie the stream's own, which leaves the clean block
   * to any stream. */
  return clean->size < own->size ? clean : own;
}

/* Pending blocks whose recorded streams' events all completed become free. */
static void settle_pending(sa_pool *pool) {
  sa_arena *a = pool->arena;
  for (sa_pblock **pb = &pool->pending; *pb != NULL;) {
    sa_pblock *b = *pb;
    unsigned kept = 0;
    for (unsigned i = 0; i < b->nwaits; i++)
      if (sa__event_retire(a, b->waits[i], SA_QUERY) != SA_OK) b->waits[kept++] = b->waits[i];
    b->nwaits = kept;
    if (kept > 0) {
      pb = &b->pending_next;
      continue;
    }
    *pb = b->pending_next;
    b->pending_next = NULL;
    free(b->waits);
    b->waits = NULL;
    make_free(pool, b);
  }
}

/* Merge every pair of neighbouring free blocks that may merge (after
 * blocks turned clean in place). */
static void sweep(sa_pool *pool) {
  for (sa_pool_seg *seg = pool->segs; seg != NULL; seg = seg->next)
    for (sa_pblock *b = seg->first; b != NULL; b = b->next) {
      if (b->state != SA_PBLOCK_FREE) continue;
      while (b->next != NULL && mergeable(b, b->next)) {
        sa_pblock *n = b->next;
        fit_del(pool, b);
        fit_del(pool, n);
        join_guard(pool->arena, b, n);
        b->size += n->size;
        unlink_block(n);
        pblock_put(pool, n);
        fit_add(pool, b);
      }
    }
}

void sa__pool_settle(sa_pool *pool) {
  sa_arena *a = pool->arena;
  if (pool->pending != NULL) settle_pending(pool);
  if (pool->nevented == 0) return;
  size_t n = pool->nevented;
  sa_pblock **evented = malloc(n * sizeof *evented);
  if (evented == NULL) return; /* they stay as they are: fine, only fewer fit */
  size_t got = treap_collect(pool->fit_root, true, evented, n, 0);
  if (got < n) n = got;
  bool cleaned = false;
  for (size_t i = 0; i < n; i++) {
    sa_pblock *b = evented[i];
    SA_ASSERT(!b->stream_only);
    /* A query in the relaxed capture mode: it disturbs no capture. */
    if (sa__event_retire(a, b->event, SA_QUERY) != SA_OK) continue;
    fit_del(pool, b);
    b->event = NULL; /* retired: back in the pool of events */
    b->tag = 0;
    b->stream = NULL;
    fit_add(pool, b);
    cleaned = true;
  }
  free(evented);
  if (cleaned) sweep(pool);
}

sa_pblock *sa__pool_fit_waiting(sa_pool *pool, size_t size, sa_stream stream) {
  size_t n = pool->nevented;
  if (n == 0) return NULL;
  sa_pblock **evented = malloc(n * sizeof *evented);
  if (evented == NULL) return NULL;
  size_t got = treap_collect(pool->fit_root, true, evented, n, 0);
  if (got < n) n = got;
  sa_pblock *best = NULL;
  uint64_t own = sa__pool_tag(stream);
  for (size_t i = 0; i < n; i++) {
    sa_pblock *b = evented[i];
    if (b->tag == own || b->size < size) continue;
    if (best == NULL || b->size < best->size || (b->size == best->size && b->base < best->base))
      best = b;
  }
  free(evented);
  if (best == NULL) return NULL;
  /* Refused, with nothing enqueued, while stream is being captured (a wait
   * for an event recorded outside the capture). */
  sa_arena *a = pool->arena;
  if (a->drv->ops->stream_wait_event(a->drv, stream, best->event) != SA_OK) return NULL;
  return best;
}

/* y (free, out of the index, right after x) into x (free, out of the
 * index), both usable by the same stream: a tagged part's tag and guard go
 * to the whole (the later event of its stream), and the whole is that
 * stream's only where either part was. */
static void join_usable(sa_pool *pool, sa_pblock *x, sa_pblock *y) {
  if (y->tag != 0 && x->tag == 0) {
    x->tag = y->tag;
    x->stream = y->stream;
    x->stream_only = y->stream_only;
    x->event = y->event;
    x->seq = y->seq;
    y->event = NULL;
  } else if (y->tag != 0) {
    SA_ASSERT(x->tag == y->tag);
    bool only = x->stream_only || y->stream_only;
    x->stream_only = y->stream_only = false; /* join_guard's rule: equal flags */
    join_guard(pool->arena, x, y);
    x->stream_only = only;
  }
  x->size += y->size;
  unlink_block(y);
  pblock_put(pool, y);
}

/* Is b free for stream to take with no driver call? */
static bool takes(const sa_pblock *b, sa_stream stream) {
  return b->state == SA_PBLOCK_FREE && sa__pool_usable(b, stream);
}

/* b (free, in the fit index) joined with the free blocks after it that
 * stream may take, until it reaches end (UINTPTR_MAX: all of them). */
static void join_following(sa_pool *pool, sa_pblock *b, uintptr_t end, sa_stream stream) {
  if (b->base + b->size >= end || b->next == NULL || !takes(b->next, stream)) return;
  fit_del(pool, b);
  while (b->base + b->size < end && b->next != NULL && takes(b->next, stream)) {
    sa_pblock *n = b->next;
    fit_del(pool, n);
    join_usable(pool, b, n);
  }
  fit_add(pool, b);
}

sa_pblock *sa__pool_fit_joined(sa_pool *pool, size_t size, sa_stream stream) {
  sa_pblock *best = NULL;
  size_t best_bytes = 0;
  for (sa_pool_seg *seg = pool->segs; seg != NULL; seg = seg->next) {
    sa_pblock *first = NULL;
    size_t bytes = 0;
    for (sa_pblock *b = seg->first;; b = b->next) {
      if (b != NULL && takes(b, stream)) {
        if (first == NULL) first = b, bytes = 0;
        bytes += b->size;
        continue;
      }
      /* A run of two or more ends here: the smallest that holds size. */
      if (first != NULL && first->next != b && bytes >= size &&
          (best == NULL || bytes < best_bytes))
        best = first, best_bytes = bytes;
      first = NULL;
      if (b == NULL) break;
    }
  }
  if (best == NULL) return NULL;
  join_following(pool, best, UINTPTR_MAX, stream);
  SA_ASSERT(best->size == best_bytes);
  return best;
}

sa_pblock *sa__pool_free_at(sa_pool *pool, uintptr_t at, size_t size, sa_stream stream) {
  sa_pblock *b = sa__pool_block_at(pool, at);
  if (b == NULL || !takes(b, stream)) return NULL;
  /* Enough of the neighbours that stream may take to cover the range. */
  uintptr_t end = at + size;
  for (sa_pblock *n = b; n->base + n->size < end;) {
    n = n->next;
    if (n == NULL || !takes(n, stream)) return NULL;
  }
  join_following(pool, b, end, stream);
  return b;
}

/* ------------------------------------------------------------------------
 * Carving
 * ---------------------------------------------------------------------- */

sa_pblock *sa__pool_carve(sa_pool *pool, sa_pblock *b, uintptr_t at, size_t size,
                          size_t request, sa_stream stream) {
  SA_ASSERT(b->state == SA_PBLOCK_FREE && at >= b->base && size <= b->base + b->size - at);
  uintptr_t end = b->base + b->size;
  bool front = at > b->base, back = at + size < end;
  sa_pblock *mid = b, *rest = NULL;
  if (front && (mid = sa__pblock_new(pool)) == NULL) return NULL;
  if (back && (rest = sa__pblock_new(pool)) == NULL) {
    if (front) pblock_put(pool, mid);
    return NULL;
  }
  fit_del(pool, b);
  if (front) {
    mid->base = at;
    link_after(b, mid);
    b->size = at - b->base;
    table_add(pool, mid);
  }
  mid->size = size;
  if (back) {
    rest->base = at + size;
    rest->size = end - rest->base;
    rest->tag = b->tag;
    rest->stream = b->stream;
    rest->stream_only = b->stream_only;
    rest->seq = b->seq;
    /* One block keeps the event: the front one if there is one (the back
     * one then waits for its stream, the stricter guard), else the back. */
    if (!front) {
      rest->event = b->event;
      b->event = NULL;
    }
    link_after(mid, rest);
    table_add(pool, rest);
    fit_add(pool, rest);
  }
  if (front) {
    fit_add(pool, b);
  } else {
    /* The handout is ordered after it already: its stream's own, a query
     * that saw it complete, or a wait enqueued on the device. */
    drop_event(pool->arena, &b->event);
  }
  mid->state = SA_PBLOCK_LIVE;
  mid->tag = 0;
  mid->stream_only = false;
  mid->seq = 0;
  mid->event = NULL;
  mid->stream = stream;
  mid->request = request;
  pool->nlive++;
  pool->live_bytes += size;
  pool->live_requested += request;
  return mid;
}

/* b leaves the live blocks' counts. */
static void unlive(sa_pool *pool, sa_pblock *b) {
  pool->nlive--;
  pool->live_bytes -= b->size;
  pool->live_requested -= b->request;
  b->request = 0;
  free(b->recorded);
  b->recorded = NULL;
  b->nrecorded = b->recorded_cap = 0;
}

void sa__pool_uncarve(sa_pool *pool, sa_pblock *b) {
  unlive(pool, b);
  /* Its stream's only: what else used it is not known here. */
  b->tag = sa__pool_tag(b->stream);
  b->stream_only = true;
  b->seq = ++pool->frees;
  make_free(pool, b);
}

sa_pblock *sa__pool_block_at(sa_pool *pool, uintptr_t p) {
  sa_pblock *b = sa__chain_entry(sa__chain_get(&pool->blocks, p), sa_pblock, by_base);
  if (b != NULL) return b;
  for (sa_pool_seg *seg = pool->segs; seg != NULL; seg = seg->next) {
    if (p - seg->base >= seg->size) continue;
    for (b = seg->first; b != NULL; b = b->next)
      if (p - b->base < b->size) return b;
  }
  return NULL;
}

sa_pblock *sa__pool_clean(sa_pool *pool, sa_pblock *b) {
  fit_del(pool, b);
  b->event = NULL;
  b->tag = 0;
  b->stream_only = false;
  b->stream = NULL;
  b = coalesce(pool, b);
  fit_add(pool, b);
  return b;
}

/* ------------------------------------------------------------------------
 * Frees and records
 * ---------------------------------------------------------------------- */

/* Why p, in one of pool's segments, is no live block's start. */
static sa_status not_live(sa_pool *pool, uintptr_t p) {
  sa_pblock *b = sa__pool_block_at(pool, p);
  /* A block freed before may have merged into a larger free one. */
  return b != NULL && b->state != SA_PBLOCK_LIVE ? SA_ERR_DOUBLE_FREE : SA_ERR_INVALID_POINTER;
}

/* The live block at p freed on s (streamarena.h, "Graph pools"). On
 * failure nothing changes. */
static sa_status pool_free(sa_pool *pool, uintptr_t p, sa_stream s) {
  sa_arena *a = pool->arena;
  sa_pblock *b = sa__chain_entry(sa__chain_get(&pool->blocks, p), sa_pblock, by_base);
  if (b == NULL || b->state != SA_PBLOCK_LIVE) return not_live(pool, p);
  sa_status st = sa__legacy_stream_check(a, s);
  if (st != SA_OK) return st;
  /* An event on every recorded stream but s, then one on s: a capture of
   * any recorded stream refuses the free (its event would join the
   * graph); a capture of s only leaves the block without an event of s. */
  sa_event *waits = NULL;
  unsigned nwaits = 0;
  if (b->nrecorded > 0 && (waits = malloc(b->nrecorded * sizeof *waits)) == NULL)
    return SA_ERR_OUT_OF_MEMORY;
  for (unsigned i = 0; st == SA_OK && i < b->nrecorded; i++) {
    if (b->recorded[i] == s) continue;
    st = sa__event_record_new(a, b->recorded[i], &waits[nwaits]);
    if (st == SA_OK) nwaits++;
  }
  sa_event own = NULL;
  bool captured = false;
  if (st == SA_OK) {
    st = sa__event_record_new(a, s, &own);
    if (st == SA_ERR_STREAM_CAPTURING) { /* refused before any driver call on s */
      own = NULL;
      captured = true;
      st = SA_OK;
    }
  }
  if (st != SA_OK) {
    for (unsigned i = 0; i < nwaits; i++) sa__event_drop(a, waits[i]);
    free(waits);
    return st;
  }
  unlive(pool, b);
  b->tag = sa__pool_tag(s);
  b->stream = s;
  b->event = own;
  b->stream_only = captured;
  b->seq = ++pool->frees;
  if (nwaits == 0) {
    free(waits);
    make_free(pool, b);
    return SA_OK;
  }
  b->state = SA_PBLOCK_PENDING;
  b->waits = waits;
  b->nwaits = nwaits;
  b->pending_next = pool->pending;
  pool->pending = b;
  return SA_OK;
}

/* The live block at p is also used by work on other. On failure nothing
 * changes. */
static sa_status pool_record(sa_pool *pool, uintptr_t p, sa_stream other) {
  sa_arena *a = pool->arena;
  sa_pblock *b = sa__chain_entry(sa__chain_get(&pool->blocks, p), sa_pblock, by_base);
  if (b == NULL || b->state != SA_PBLOCK_LIVE) return not_live(pool, p);
  sa_status st = sa__legacy_stream_check(a, other);
  if (st != SA_OK) return st;
  for (unsigned i = 0; i < b->nrecorded; i++)
    if (b->recorded[i] == other) return SA_OK;
  st = a->drv->ops->stream_validate(a->drv, other); /* refused while other is captured */
  if (st != SA_OK) return st;
  if (b->nrecorded == b->recorded_cap) {
    unsigned cap = b->recorded_cap != 0 ? 2 * b->recorded_cap : 2;
    sa_stream *grown = realloc(b->recorded, cap * sizeof *grown);
    if (grown == NULL) return SA_ERR_OUT_OF_MEMORY;
    b->recorded = grown;
    b->recorded_cap = cap;
  }
  b->recorded[b->nrecorded++] = other;
  return SA_OK;
}

bool sa__pool_route_free(sa_arena *a, uintptr_t p, sa_stream s, sa_status *st,
                         sa_pool **drained) {
  *drained = NULL;
  if (atomic_load_explicit(&a->pools.xnsegs, memory_order_acquire) == 0) return false;
  sa_pool_seg *seg;
  sa_pool *pool = sa__pools_lock_owner(a, p, &seg);
  if (pool == NULL) return false;
  *st = pool_free(pool, p, s);
  SA_VALIDATE_PACED(&pool->pace, sa__pool_check(pool));
  /* Its last use was released while this block lived: the segments go
   * back now, once (returning), in the order of this free's stream. */
  if (*st == SA_OK && pool->uses == 0 && pool->nlive == 0 && !pool->returning) {
    pool->returning = true;
    *drained = pool;
  }
  pthread_mutex_unlock(&pool->lock);
  return true;
}

bool sa__pool_route_record(sa_arena *a, uintptr_t p, sa_stream other, sa_status *st) {
  if (atomic_load_explicit(&a->pools.xnsegs, memory_order_acquire) == 0) return false;
  sa_pool_seg *seg;
  sa_pool *pool = sa__pools_lock_owner(a, p, &seg);
  if (pool == NULL) return false;
  *st = pool_record(pool, p, other);
  pthread_mutex_unlock(&pool->lock);
  return true;
}

/* ------------------------------------------------------------------------
 * A pool's end
 * ---------------------------------------------------------------------- */

sa_status sa__pool_order_release(sa_pool *pool, sa_stream s) {
  sa_arena *a = pool->arena;
  sa_status st = a->drv->ops->stream_capture_check(a->drv, s);
  uint64_t own = sa__pool_tag(s);
  /* Earlier releases' events, then every free's on another stream. */
  for (unsigned i = 0; st == SA_OK && i < pool->nends; i++)
    if (a->drv->ops->event_query(a->drv, pool->ends[i]) != SA_OK)
      st = a->drv->ops->stream_wait_event(a->drv, s, pool->ends[i]);
  for (sa_pool_seg *seg = pool->segs; st == SA_OK && seg != NULL; seg = seg->next)
    for (sa_pblock *b = seg->first; st == SA_OK && b != NULL; b = b->next) {
      if (b->state == SA_PBLOCK_PENDING)
        for (unsigned i = 0; st == SA_OK && i < b->nwaits; i++)
          if (a->drv->ops->event_query(a->drv, b->waits[i]) != SA_OK)
            st = a->drv->ops->stream_wait_event(a->drv, s, b->waits[i]);
      if (st == SA_OK && b->event != NULL && b->tag != own &&
          a->drv->ops->event_query(a->drv, b->event) != SA_OK)
        st = a->drv->ops->stream_wait_event(a->drv, s, b->event);
    }
  return st;
}

sa_status sa__pool_end_use(sa_pool *pool, sa_stream s) {
  if (pool->nends == pool->ends_cap) {
    unsigned cap = pool->ends_cap != 0 ? 2 * pool->ends_cap : 4;
    sa_event *grown = realloc(pool->ends, cap * sizeof *grown);
    if (grown == NULL) return SA_ERR_OUT_OF_MEMORY;
    pool->ends = grown;
    pool->ends_cap = cap;
  }
  sa_event e;
  sa_status st = sa__event_record_new(pool->arena, s, &e);
  if (st != SA_OK) return st;
  pool->ends[pool->nends++] = e;
  return SA_OK;
}

/* seg's blocks go (their memory leaves the pool). */
static void seg_clear(sa_pool *pool, sa_pool_seg *seg) {
  sa_arena *a = pool->arena;
  for (sa_pblock *b = seg->first; b != NULL;) {
    sa_pblock *n = b->next;
    if (b->state == SA_PBLOCK_FREE) fit_del(pool, b);
    if (b->state == SA_PBLOCK_LIVE) unlive(pool, b);
    for (unsigned i = 0; i < b->nwaits; i++) sa__event_drop(a, b->waits[i]);
    drop_event(a, &b->event);
    sa__chain_remove(&pool->blocks, &b->by_base);
    free(b->recorded);
    free(b->waits);
    free(b);
    b = n;
  }
  seg->first = NULL;
}

void sa__pool_seg_remove(sa_pool *pool, sa_pool_seg *seg) {
  for (sa_pblock **pb = &pool->pending; *pb != NULL;)
    if ((*pb)->seg == seg)
      *pb = (*pb)->pending_next;
    else
      pb = &(*pb)->pending_next;
  seg_clear(pool, seg);
  for (sa_pool_seg **ps = &pool->segs; *ps != NULL; ps = &(*ps)->next)
    if (*ps == seg) {
      *ps = seg->next;
      break;
    }
  pool->nsegs--;
  pool->reserved -= seg->size;
  free(seg);
}

void sa__pool_clear(sa_pool *pool) {
  sa_arena *a = pool->arena;
  while (pool->segs != NULL) sa__pool_seg_remove(pool, pool->segs);
  for (unsigned i = 0; i < pool->nends; i++) sa__event_drop(a, pool->ends[i]);
  free(pool->ends);
  pool->ends = NULL;
  pool->nends = pool->ends_cap = 0;
  while (pool->spare != NULL) {
    sa_pblock *b = pool->spare;
    pool->spare = b->next;
    free(b);
  }
  sa__chain_destroy(&pool->blocks);
  pool->fit_root = NULL;
  pool->pending = NULL;
}

/* ------------------------------------------------------------------------
 * The arena's registry
 * ---------------------------------------------------------------------- */

void sa__pools_init(sa_arena *a) { pthread_mutex_init(&a->pools.lock, NULL); }

/* The index of the first registered segment above p. */
static size_t seg_upper(const sa_pools *ps, uintptr_t p) {
  size_t lo = 0, hi = ps->nsegs;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (ps->segs[mid]->base <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* seg into the registry, its lock held and room for it made. */
static void register_locked(sa_pools *ps, sa_pool_seg *seg) {
  size_t at = seg_upper(ps, seg->base);
  memmove(&ps->segs[at + 1], &ps->segs[at], (ps->nsegs - at) * sizeof *ps->segs);
  ps->segs[at] = seg;
  ps->nsegs++;
  atomic_store_explicit(&ps->xnsegs, ps->nsegs, memory_order_release);
}

sa_status sa__pools_register(sa_arena *a, sa_pool_seg *seg) {
  sa_pools *ps = &a->pools;
  pthread_mutex_lock(&ps->lock);
  if (ps->nsegs == ps->segs_cap) {
    size_t cap = ps->segs_cap != 0 ? 2 * ps->segs_cap : 16;
    sa_pool_seg **grown = realloc(ps->segs, cap * sizeof *grown);
    if (grown == NULL) {
      pthread_mutex_unlock(&ps->lock);
      return SA_ERR_OUT_OF_MEMORY;
    }
    ps->segs = grown;
    ps->segs_cap = cap;
  }
  register_locked(ps, seg);
  pthread_mutex_unlock(&ps->lock);
  return SA_OK;
}

/* seg out of the registry, its lock held. */
static void unregister_locked(sa_pools *ps, const sa_pool_seg *seg) {
  size_t at = seg_upper(ps, seg->base);
  if (at == 0 || ps->segs[at - 1] != seg) return;
  memmove(&ps->segs[at - 1], &ps->segs[at], (ps->nsegs - at) * sizeof *ps->segs);
  ps->nsegs--;
  atomic_store_explicit(&ps->xnsegs, ps->nsegs, memory_order_release);
}

void sa__pools_unregister(sa_arena *a, sa_pool_seg *seg) {
  pthread_mutex_lock(&a->pools.lock);
  unregister_locked(&a->pools, seg);
  pthread_mutex_unlock(&a->pools.lock);
}

sa_pool *sa__pools_lock_owner(sa_arena *a, uintptr_t p, sa_pool_seg **out) {
  sa_pools *ps = &a->pools;
  pthread_mutex_lock(&ps->lock);
  size_t at = seg_upper(ps, p);
  sa_pool_seg *seg = at > 0 ? ps->segs[at - 1] : NULL;
  sa_pool *pool = NULL;
  if (seg != NULL && p - seg->base < seg->size) {
    /* Locked before the registry lets go: a segment leaves the registry
     * only with both held (sa__pools_withdraw), so it stays whole for this
     * caller. */
    pool = seg->pool;
    pthread_mutex_lock(&pool->lock);
    *out = seg;
  }
  pthread_mutex_unlock(&ps->lock);
  return pool;
}

sa_status sa__pools_add(sa_arena *a, sa_pool *pool) {
  sa_pools *ps = &a->pools;
  pthread_mutex_lock(&ps->lock);
  sa_status st = SA_OK;
  if (sa__pools_stream(ps) == NULL) {
    sa_stream s = NULL;
    st = a->drv->ops->stream_create(a->drv, &s);
    if (st == SA_OK) atomic_store_explicit(&ps->xstream, s, memory_order_release);
  }
  if (st == SA_OK) {
    pool->next = ps->live;
    ps->live = pool;
  }
  pthread_mutex_unlock(&ps->lock);
  return st;
}

void sa__pools_count(sa_arena *a, uint64_t *segments, uint64_t *live_blocks) {
  sa_pools *ps = &a->pools;
  *segments = *live_blocks = 0;
  pthread_mutex_lock(&ps->lock);
  for (int i = 0; i < 2; i++)
    for (sa_pool *pool = i == 0 ? ps->live : ps->released; pool != NULL; pool = pool->next) {
      pthread_mutex_lock(&pool->lock);
      *segments += pool->nsegs;
      *live_blocks += pool->nlive;
      pthread_mutex_unlock(&pool->lock);
    }
  pthread_mutex_unlock(&ps->lock);
}

/* pool out of the list it is on. */
static void list_remove(sa_pool **head, sa_pool *pool) {
  for (sa_pool **pp = head; *pp != NULL; pp = &(*pp)->next)
    if (*pp == pool) {
      *pp = pool->next;
      return;
    }
}

sa_status sa__pools_withdraw(sa_arena *a, sa_pool *pool, sa_stream s) {
  sa_pools *ps = &a->pools;
  pthread_mutex_lock(&ps->lock);
  pthread_mutex_lock(&pool->lock);
  sa_status st = sa__pool_order_release(pool, s);
  if (st == SA_OK)
    for (sa_pool_seg *seg = pool->segs; seg != NULL; seg = seg->next) unregister_locked(ps, seg);
  pthread_mutex_unlock(&pool->lock);
  pthread_mutex_unlock(&ps->lock);
  return st;
}

void sa__pools_restore(sa_arena *a, sa_pool *pool) {
  sa_pools *ps = &a->pools;
  pthread_mutex_lock(&ps->lock);
  pthread_mutex_lock(&pool->lock);
  for (sa_pool_seg *seg = pool->segs; seg != NULL; seg = seg->next) {
    SA_ASSERT(ps->nsegs < ps->segs_cap); /* it held them before */
    register_locked(ps, seg);
  }
  pthread_mutex_unlock(&pool->lock);
  pthread_mutex_unlock(&ps->lock);
}

/* The memory a growth in place added to seg's span into its blocks: a
 * block at its top that takes the last block's tag where that one is free,
 * so that the two merge (the added memory needs no guard of its own: the
 * growth synchronized the pools' stream), else a clean one. */
static void seg_extend(sa_pool *pool, sa_pool_seg *seg, size_t span_size, sa_pblock *b) {
  size_t size = (span_size - (seg->base - seg->span)) & ~(SA_POOL_ALIGN - 1);
  SA_ASSERT(size > seg->size);
  sa_pblock *last = sa__pool_seg_last(seg);
  *b = (sa_pblock){.base = seg->base + seg->size, .size = size - seg->size};
  if (last->state == SA_PBLOCK_FREE) {
    b->tag = last->tag;
    b->stream = last->stream;
    b->stream_only = last->stream_only;
    b->seq = last->seq;
  }
  link_after(last, b);
  table_add(pool, b);
  pool->reserved += size - seg->size;
  seg->size = size;
  seg->span_size = span_size;
  make_free(pool, b);
}

bool sa__pools_extend(sa_arena *a, sa_pool *pool, sa_pool_seg *seg, size_t old_size,
                      size_t span_size, sa_pblock *b) {
  sa_pools *ps = &a->pools;
  /* Both locks: sa_free's lookup reads a segment's size under the
   * registry's. */
  pthread_mutex_lock(&ps->lock);
  pthread_mutex_lock(&pool->lock);
  sa_pool_seg *s = pool->returning ? NULL : pool->segs;
  while (s != NULL && s != seg) s = s->next;
  bool ours = s != NULL && s->span_size == old_size;
  if (ours) seg_extend(pool, seg, span_size, b);
  SA_VALIDATE_PACED(&pool->pace, sa__pool_check(pool));
  pthread_mutex_unlock(&pool->lock);
  pthread_mutex_unlock(&ps->lock);
  return ours;
}

void sa__pools_retire(sa_arena *a, sa_pool *pool) {
  sa_pools *ps = &a->pools;
  pthread_mutex_lock(&ps->lock);
  list_remove(&ps->live, pool);
  pool->next = ps->released;
  ps->released = pool;
  pthread_mutex_unlock(&ps->lock);
}

static void pool_free_all(sa_pool *pool) {
  sa__pool_clear(pool);
  pthread_mutex_destroy(&pool->lock);
  free(pool);
}

sa_status sa__pools_fini(sa_arena *a) {
  sa_pools *ps = &a->pools;
  for (sa_pool **head = &ps->live; head != NULL; head = head == &ps->live ? &ps->released : NULL)
    while (*head != NULL) {
      sa_pool *pool = *head;
      *head = pool->next;
      pool_free_all(pool);
    }
  free(ps->segs);
  ps->segs = NULL;
  ps->nsegs = ps->segs_cap = 0;
  atomic_store(&ps->xnsegs, 0);
  sa_status st = SA_OK;
  sa_stream s = atomic_exchange(&ps->xstream, NULL);
  if (s != NULL) st = a->drv->ops->stream_destroy(a->drv, s);
  return st;
}

/* ------------------------------------------------------------------------
 * Invariants
 * ---------------------------------------------------------------------- */

static const char POOL[] = "pool";

/* The fit index's own rule of a node (treap.c checks the order, the heap
 * and the depth). */
static void fit_check_block(const sa_treap_node *n) {
  SA_CHECK(POOL, block_of(n)->state == SA_PBLOCK_FREE, "the fit index holds free blocks only");
  SA_CHECK(POOL, n->prio == sa__treap_priority(block_of(n)->base),
           "a block's priority is its base's hash");
}

size_t sa__pool_check(const sa_pool *pool) {
  size_t indexed = sa__treap_check(POOL, pool->fit_root, block_before, fit_check_block);
  size_t visited = indexed;
  size_t nsegs = 0, reserved = 0, nlive = 0, live_bytes = 0, requested = 0;
  size_t nfree = 0, free_bytes = 0, nevented = 0, npending = 0;
  for (const sa_pool_seg *seg = pool->segs; seg != NULL; seg = seg->next) {
    nsegs++;
    reserved += seg->size;
    SA_CHECK(POOL, seg->pool == pool, "a segment names its pool");
    SA_CHECK(POOL, seg->base % SA_POOL_ALIGN == 0 && seg->base - seg->span < SA_POOL_ALIGN,
             "a segment starts at its span's first SA_POOL_ALIGN boundary");
    SA_CHECK(POOL,
             seg->size == ((seg->span_size - (seg->base - seg->span)) & ~(SA_POOL_ALIGN - 1)),
             "a segment's blocks tile its span's whole SA_POOL_ALIGN units");
    uintptr_t at = seg->base;
    const sa_pblock *before = NULL;
    for (const sa_pblock *b = seg->first; b != NULL; before = b, b = b->next, visited++) {
      SA_CHECK(POOL, b->base == at && b->size > 0 && b->size <= seg->base + seg->size - at,
               "blocks tile their segment: no gap, no overlap");
      SA_CHECK(POOL, b->size % SA_POOL_ALIGN == 0 && b->base % SA_POOL_ALIGN == 0,
               "blocks are in SA_POOL_ALIGN units");
      SA_CHECK(POOL, b->seg == seg && b->prev == before, "block links agree");
      SA_CHECK(POOL, sa__chain_get(&pool->blocks, b->base) == &b->by_base,
               "every block is in the table by base");
      at += b->size;
      if (b->state == SA_PBLOCK_LIVE) {
        SA_CHECK(POOL, b->tag == 0 && b->event == NULL, "a live block carries no guard");
        nlive++;
        live_bytes += b->size;
        requested += b->request;
        continue;
      }
      SA_CHECK(POOL, b->tag != 0 || b->event == NULL, "a clean block has no event");
      SA_CHECK(POOL, b->tag == 0 || b->tag == sa__pool_tag(b->stream), "a tag names its stream");
      if (b->state == SA_PBLOCK_PENDING) {
        SA_CHECK(POOL, b->nwaits > 0, "a pending block waits for events");
        npending++;
        continue;
      }
      SA_CHECK(POOL, b->state == SA_PBLOCK_FREE, "a block is free, live or pending");
      SA_CHECK(POOL, sa__treap_has(pool->fit_root, &b->fit, block_before),
               "a free block is in the fit index");
      SA_CHECK(POOL, b->next == NULL || !mergeable(b, b->next),
               "no two neighbouring free blocks could merge");
      nfree++;
      free_bytes += b->size;
      if (evented_block(b)) nevented++; /* the count's own rule: not stream_only */
    }
    SA_CHECK(POOL, at == seg->base + seg->size, "blocks tile their segment: no gap, no overlap");
  }
  size_t listed = 0;
  for (const sa_pblock *b = pool->pending; b != NULL; b = b->pending_next) listed++;
  SA_CHECK(POOL, listed == npending, "the pending list holds the pending blocks");
  SA_CHECK(POOL, nsegs == pool->nsegs && reserved == pool->reserved,
           "the segment counts are the segments'");
  SA_CHECK(POOL, nlive == pool->nlive && live_bytes == pool->live_bytes &&
                     requested == pool->live_requested,
           "the live counts are the live blocks'");
  SA_CHECK(POOL, nfree == pool->nfree && nfree == indexed && free_bytes == pool->free_bytes &&
                     nevented == pool->nevented,
           "the free counts are the free blocks'");
  SA_CHECK(POOL, pool->blocks.n == nlive + nfree + npending,
           "the table holds every block and only them");
  return visited;
}

void sa__pools_check(sa_arena *a) {
  sa_pools *ps = &a->pools;
  pthread_mutex_lock(&ps->lock);
  for (size_t i = 0; i < ps->nsegs; i++) {
    SA_CHECK(POOL, i == 0 || ps->segs[i - 1]->base + ps->segs[i - 1]->size <= ps->segs[i]->base,
             "the registry's segments are in address order, apart");
    SA_CHECK(POOL, ps->segs[i]->pool != NULL, "a registered segment has a pool");
  }
  SA_CHECK(POOL, atomic_load(&ps->xnsegs) == ps->nsegs, "xnsegs counts the registry");
  for (sa_pool *pool = ps->live; pool != NULL; pool = pool->next) {
    pthread_mutex_lock(&pool->lock);
    (void)sa__pool_check(pool);
    pthread_mutex_unlock(&pool->lock);
  }
  pthread_mutex_unlock(&ps->lock);
}
