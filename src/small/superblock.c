/* Superblocks: runs of the reserved range carved into blocks of one class.
 *
 * A superblock is owned by one stream arena at a time. When it empties, it
 * stays with its stream (a few are kept) or goes to the global free stack
 * (a ck lock-free stack) together with the event recorded on its last
 * stream when it emptied (or none, where a device sync made it clean:
 * stream_arena.c); the next owner makes its own stream wait for that event
 * on the device, or skips the wait if the event already completed. New
 * superblocks are carved from the range and backed by physical chunks.
 * Block bookkeeping lives here in host memory: a state byte per block and a
 * stack of free block indices.
 */
#include <stdlib.h>
#include <string.h>

#include "superblock.h"
#include "../arena.h"
#include "../base/base.h"
#include "../base/device_sync.h"
#include "../base/event_pool.h"
#include "../driver/driver.h"
#include "../large/span.h"
#include "../vm/physical.h"
#include "../vm/va_space.h"
#include "size_class.h"

/* Grow the free index stack to n entries (read under the owner lock only,
 * so it may move). */
static sa_status ensure_capacity(sa_superblock *sb, uint32_t n) {
  if (n <= sb->capacity) return SA_OK;
  uint32_t *idx = realloc(sb->free_idx, (size_t)n * sizeof *idx);
  if (idx == NULL) return SA_ERR_OUT_OF_MEMORY;
  sb->free_idx = idx;
  sb->capacity = n;
  return SA_OK;
}

/* Every block of an empty superblock is FREE already, so formatting only
 * sets the geometry. */
sa_status sa__superblock_format(sa_superblock *sb, unsigned cls) {
  size_t bs = sa_class_size(cls);
  uint32_t n = (uint32_t)(sb->hdr.size / bs);
  if (n == 0 || n > sb->nstate) return SA_ERR_INTERNAL; /* acquire and carve see to it */
  sa_status st = ensure_capacity(sb, n);
  if (st != SA_OK) return st;
  sb->cls = cls;
  sb->block_size = bs;
  sb->block_inv = sa__block_inverse(bs);
  sb->nblocks = n;
  sb->used = sb->bump = sb->nfree = 0;
  return SA_OK;
}

static const char SUPERBLOCK[] = "superblock";

size_t sa__superblock_check(const sa_superblock *sb) {
  SA_CHECK(SUPERBLOCK, sb->nblocks <= sb->nstate, "nblocks <= nstate");
  SA_CHECK(SUPERBLOCK, sb->bump <= sb->nblocks, "bump <= nblocks");
  SA_CHECK(SUPERBLOCK, sb->nfree <= sb->capacity, "nfree <= capacity");
  SA_CHECK(SUPERBLOCK, (uint64_t)sb->used + sb->nfree == sb->bump, "used + nfree == bump");
  /* One on the global stack or spare keeps its last geometry; it holds
   * nothing (its blocks are looked at again when a stream takes it). */
  SA_CHECK(SUPERBLOCK, sb->owner != NULL || sb->used == 0, "an unowned superblock is unused");
  if (sb->owner == NULL) return 1;
  /* Blocks below bump are used or on the free index stack, once; the
   * stack's and those from bump on are SA_BLOCK_FREE. */
  uint8_t *seen = calloc((size_t)sb->bump / 8 + 1, 1); /* NULL: duplicates not looked for */
  for (uint32_t i = 0; i < sb->nfree; i++) {
    uint32_t idx = sb->free_idx[i];
    SA_CHECK(SUPERBLOCK, idx < sb->bump, "the free index stack holds blocks below bump");
    SA_CHECK(SUPERBLOCK, seen == NULL || !(seen[idx / 8] & (1u << idx % 8)),
             "the free index stack holds a block once");
    if (seen != NULL) seen[idx / 8] |= (uint8_t)(1u << idx % 8);
    SA_CHECK(SUPERBLOCK,
             atomic_load_explicit(&sb->state[idx], memory_order_relaxed) == SA_BLOCK_FREE,
             "each block on the free index stack is SA_BLOCK_FREE");
  }
  free(seen);
  /* One comparison per block below bump and none above it: the walk is
   * what this validator costs (and, in the fuzzer, every comparison is
   * traced). */
  uint32_t used = 0;
  unsigned below = 0, above = 0; /* the state bytes or'ed */
  for (uint32_t i = 0; i < sb->bump; i++) {
    uint8_t st = atomic_load_explicit(&sb->state[i], memory_order_relaxed);
    used += st != SA_BLOCK_FREE;
    below |= st;
  }
  for (uint32_t i = sb->bump; i < sb->nblocks; i++)
    above |= atomic_load_explicit(&sb->state[i], memory_order_relaxed);
  SA_CHECK(SUPERBLOCK, (below & ~7u) == 0, "state bytes use only the SA_BLOCK_ states' bits");
  SA_CHECK(SUPERBLOCK, above == SA_BLOCK_FREE, "blocks from bump on are SA_BLOCK_FREE");
  SA_CHECK(SUPERBLOCK, used == sb->used, "used counts the blocks not SA_BLOCK_FREE");
  return (size_t)sb->nblocks + sb->nfree;
}

/* The statistics' counts: sb leaves (-1) or joins (+1) the empty ones, and
 * the other way for the active ones (active 0: it appears or goes). */
static void count(sa_arena *a, const sa_superblock *sb, int empty, int active) {
  if (empty > 0) {
    atomic_fetch_add_explicit(&a->small.xsuperblocks_empty, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&a->small.xsuperblock_empty_bytes, sb->hdr.size,
                              memory_order_relaxed);
  }
  if (active > 0) atomic_fetch_add_explicit(&a->small.xsuperblocks_active, 1, memory_order_relaxed);
  if (empty < 0) {
    atomic_fetch_sub_explicit(&a->small.xsuperblocks_empty, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&a->small.xsuperblock_empty_bytes, sb->hdr.size,
                              memory_order_relaxed);
  }
  if (active < 0) atomic_fetch_sub_explicit(&a->small.xsuperblocks_active, 1, memory_order_relaxed);
}

void sa__superblock_emptied(sa_arena *a, const sa_superblock *sb) { count(a, sb, +1, -1); }

/* sb onto its global stack as it is: sb->span says which (set at carving,
 * it stays until the unmap, which only one who popped sb does). */
static void push_global(sa_arena *a, sa_superblock *sb) {
  /* Read before the hand-off: once it is published, the popper owns sb. */
  ck_stack_t *stack = sb->span != NULL ? &a->small.free_carved : &a->small.free_superblocks;
  sa__handoff_publish(&sb->xhandoff);
  ck_stack_push_mpmc(stack, &sb->link);
}

static sa_superblock *pop_from(ck_stack_t *stack) {
  ck_stack_entry_t *e = ck_stack_pop_mpmc(stack);
  if (e == NULL) return NULL;
  sa_superblock *sb = (sa_superblock *)((char *)e - offsetof(sa_superblock, link));
  sa__handoff_accept(&sb->xhandoff);
  return sb;
}

void sa__superblock_to_global(sa_arena *a, sa_superblock *sb, sa_event e, uint64_t event_owner) {
  SA_ASSERT(sb->used == 0); /* only an empty one goes */
  sb->owner = NULL;
  sb->event = e;
  sb->event_owner = event_owner;
  push_global(a, sb);
}

sa_superblock *sa__superblock_pop_global(sa_arena *a) {
  sa_superblock *sb = pop_from(&a->small.free_superblocks);
  return sb != NULL ? sb : pop_from(&a->small.free_carved);
}

sa_superblock *sa__superblock_pop_carved(sa_arena *a) { return pop_from(&a->small.free_carved); }

/* ------------------------------------------------------------------------
 * Slabs: superblocks mapped together
 *
 * Every chunk costs about the same driver time to bring up whatever its
 * size, so a climb of small blocks that maps a chunk per superblock pays
 * that per superblock. Once the arena holds many superblocks, a new one is
 * carved from a slab: one chunk for up to SA_SLAB_MAX of them,
 * 1/SA_SLAB_SHARE of those already mapped, so that what a slab may hold
 * unused stays a small share of the superblocks' (larger shares pinned
 * free memory that reshapes needed). See Note [Slabs]. A slab is unmapped
 * once none of its superblocks is carved (a trim then gives it back); its
 * free slots serve the next superblocks of their size without a driver
 * call. Not under a budget or with the user's chunk_size, where memory
 * comes back in the units the user asked for. Arena lock held throughout.
 * ---------------------------------------------------------------------- */

/* Map bytes of memory (cached chunks, else new) at a range of its own for
 * desc, within limit physical bytes. On failure nothing stays with desc (what a
 * refused unwind left mapped, physical.c keeps as a stuck range). */
static sa_status map_fresh(sa_arena *a, sa_desc *desc, size_t bytes, size_t limit) {
  sa_chunk *chunks;
  size_t got;
  sa_status st = sa__physical_gather(a, bytes, 0, bytes, limit, &chunks, &got);
  if (st == SA_OK) {
    st = sa__va_alloc(a, bytes, &desc->base);
    if (st != SA_OK) sa__physical_return(a, chunks);
  }
  if (st == SA_OK) {
    desc->size = bytes;
    st = sa__physical_map(a, desc, chunks);
  }
  return st;
}

/* Superblocks of size bytes the next slab maps together (1: none). */
static uint32_t slab_slots(const sa_arena *a, size_t size) {
  if (a->physical.budgeted || a->cfg.chunk_size != 0) return 1;
  uint32_t least = size < a->gran ? (uint32_t)(a->gran / size) : 1; /* a granule */
  size_t mapped = atomic_load_explicit(&a->small.xsuperblocks_active, memory_order_relaxed) +
                  atomic_load_explicit(&a->small.xsuperblocks_empty, memory_order_relaxed);
  uint32_t k = 1;
  /* A larger footprint_target takes more: See Note [Footprint target]. */
  size_t share = mapped / SA_SLAB_SHARE, ahead = sa__physical_ahead_share(a, mapped);
  if (ahead > share) share = ahead;
  while (k * 2 <= SA_SLAB_MAX && k * 2 <= share &&
         (size_t)k * 2 * size <= SA_CHUNK_MAX)
    k *= 2;
  return k > least ? k : least;
}

/* Slabs with a free slot are on a->small.slabs, full ones apart on
 * a->small.full_slabs, so that slab_take walks only the first: with
 * millions of live blocks, walking every slab was a large share of
 * allocation time (See Note [Slab lists]). */
SA_DLIST_FUNCTIONS(slab, sa_slab, next, prev)

/* The first slab with a free slot of size bytes, NULL if none. */
static sa_slab *slab_with_slot(const sa_arena *a, size_t size) {
  for (sa_slab *sl = a->small.slabs; sl != NULL; sl = sl->next)
    if (sl->slot == size) return sl;
  return NULL;
}

/* A free slot of slab sl (one of slab_with_slot's): its address. */
static uintptr_t slab_take(sa_arena *a, sa_slab *sl, sa_slab **slab, uint32_t *slot) {
  SA_ASSERT(sl->nfree > 0);
  *slab = sl;
  *slot = sl->free_slots[--sl->nfree];
  sl->ncarved++;
  a->small.slab_free_bytes -= sl->slot;
  if (sl->nfree == 0) {
    slab_unlink(&a->small.slabs, sl);
    slab_push(&a->small.full_slabs, sl);
  }
  return sl->hdr.base + (uintptr_t)*slot * sl->slot;
}

/* Map a new slab of k slots of size bytes within limit physical bytes; its
 * slots all free. */
static sa_status slab_new(sa_arena *a, size_t size, uint32_t k, size_t limit) {
  sa_slab *sl = calloc(1, sizeof *sl);
  if (sl == NULL) return SA_ERR_OUT_OF_MEMORY;
  size_t bytes = (size_t)k * size;
  sa_status st = map_fresh(a, &sl->hdr, bytes, limit);
  if (st != SA_OK) {
    free(sl);
    return st;
  }
  sl->slot = size;
  sl->nslots = k;
  for (uint32_t i = 0; i < k; i++) sl->free_slots[sl->nfree++] = k - 1 - i;
  a->small.slab_free_bytes += bytes;
  slab_push(&a->small.slabs, sl);
  return SA_OK;
}

size_t sa__slabs_check(const sa_arena *a) {
  static const char SLAB[] = "slab";
  size_t visited = 0, free_bytes = 0;
  const sa_slab *const lists[2] = {a->small.slabs, a->small.full_slabs};
  for (int full = 0; full < 2; full++) {
    const sa_slab *prev = NULL;
    for (const sa_slab *sl = lists[full]; sl != NULL; prev = sl, sl = sl->next, visited++) {
      SA_CHECK(SLAB, sl->prev == prev, "prev and next links agree");
      SA_CHECK(SLAB, sl->nslots > 0 && sl->nslots <= SA_SLAB_MAX, "0 < nslots <= SA_SLAB_MAX");
      SA_CHECK(SLAB, sl->ncarved + sl->nfree == sl->nslots, "ncarved + nfree == nslots");
      SA_CHECK(SLAB, (sl->nfree == 0) == full, "slabs with a free slot apart from full ones");
      SA_CHECK(SLAB,
               sl->hdr.size == (size_t)sl->nslots * sl->slot &&
                   sa__chunks_bytes(sl->hdr.chunks) == sl->hdr.size,
               "a slab maps its slots");
      uint32_t seen = 0;
      for (uint32_t i = 0; i < sl->nfree; i++) {
        uint32_t slot = sl->free_slots[i];
        SA_CHECK(SLAB, slot < sl->nslots && !(seen & (1u << slot)),
                 "free slots distinct, in range");
        seen |= 1u << slot;
      }
      free_bytes += (size_t)sl->nfree * sl->slot;
    }
  }
  SA_CHECK(SLAB, free_bytes == a->small.slab_free_bytes,
           "slab_free_bytes is the sum of free slots");
  return visited;
}

/* Unmap sl, none of whose slots is carved, and forget it; false (sl stays,
 * every slot free, for sa__superblock_slabs_unmap_free) if the driver
 * refuses. */
static bool slab_unmap(sa_arena *a, sa_slab *sl) {
  if (sa__physical_unmap(a, &sl->hdr) != SA_OK) return false;
  sa__va_free(a, sl->hdr.base, sl->hdr.size);
  a->small.slab_free_bytes -= (size_t)sl->nfree * sl->slot;
  slab_unlink(&a->small.slabs, sl); /* none carved: every slot free */
  free(sl);
  return true;
}

/* Slot of sl is free again; the slab is unmapped once none is carved. */
static void slab_put(sa_arena *a, sa_slab *sl, uint32_t slot) {
  SA_ASSERT(sl->ncarved > 0 && sl->nfree < sl->nslots && slot < sl->nslots);
  if (sl->nfree == 0) { /* a slot free again */
    slab_unlink(&a->small.full_slabs, sl);
    slab_push(&a->small.slabs, sl);
  }
  sl->free_slots[sl->nfree++] = slot;
  sl->ncarved--;
  a->small.slab_free_bytes += sl->slot;
  if (sl->ncarved == 0) (void)slab_unmap(a, sl);
}

void sa__superblock_slabs_unmap_free(sa_arena *a) {
  /* Slabs whose unmap the driver refused when their last slot came back.
   * Kept until destroy, those stranded their memory: the arena's cap shrank
   * with every such failure, even after the driver recovered. */
  for (sa_slab *sl = a->small.slabs, *next; sl != NULL; sl = next) {
    next = sl->next;
    if (sl->ncarved == 0 && sl->nfree == sl->nslots) (void)slab_unmap(a, sl);
  }
}

/* Unmap and forget every slab of list; the first failure in *first. */
static void slabs_fini(sa_arena *a, sa_slab **list, sa_status *first) {
  while (*list != NULL) {
    sa_slab *sl = *list;
    *list = sl->next;
    sa_status st = sa__physical_unmap(a, &sl->hdr);
    if (st != SA_OK && *first == SA_OK) *first = st;
    free(sl);
  }
}

sa_status sa__superblock_slabs_fini(sa_arena *a) {
  sa_status first = SA_OK;
  slabs_fini(a, &a->small.slabs, &first);
  slabs_fini(a, &a->small.full_slabs, &first);
  a->small.slab_free_bytes = 0;
  return first;
}

/* A superblock's descriptor, its memory given back, to the spares. Arena
 * lock held. */
static void to_spares(sa_arena *a, sa_superblock *sb) {
  sb->hdr.base = 0;
  sb->next = a->small.spare_superblocks;
  a->small.spare_superblocks = sb;
}

/* A superblock carved in a run, no longer counted, its descriptor to the
 * spares; returns its span, for the caller to give back to the run (alone
 * or with others: sa__span_give_back_superblock(s)). Arena lock held. */
static sa_span *carved_to_spares(sa_arena *a, sa_superblock *sb) {
  count(a, sb, -1, 0);
  sa_span *sp = sb->span;
  sb->span = NULL;
  to_spares(a, sb);
  return sp;
}

/* Unmap a superblock that no stream owns and whose work completed: its
 * chunks go to the cache and its range to the free list (or its slot to its
 * slab, or its memory back to the free spans of the run it was carved in),
 * its descriptor to the spares. Arena lock held. */
static sa_status unmap(sa_arena *a, sa_superblock *sb) {
  if (sb->span != NULL) { /* carved in a run: free span memory again, mapped */
    sa__span_give_back_superblock(a, carved_to_spares(a, sb)); /* its pages name the run */
    return SA_OK;
  }
  if (sb->slab == NULL) { /* chunks of its own: first, they may refuse */
    sa_status st = sa__physical_unmap(a, &sb->hdr);
    if (st != SA_OK) return st;
  }
  count(a, sb, -1, 0);
  sa__pagemap_set(a, sb->hdr.base, sb->hdr.size, NULL);
  if (sb->slab != NULL) {
    slab_put(a, sb->slab, sb->slot); /* the slab goes with its last slot */
    sb->slab = NULL;
  } else {
    sa__va_free(a, sb->hdr.base, sb->hdr.size);
  }
  to_spares(a, sb);
  return SA_OK;
}

void sa__superblock_unmap_or_keep(sa_arena *a, sa_superblock *sb, sa_wait wait,
                                  sa_superblock **keep) {
  sa_status st = sb->event != NULL ? sa__event_retire(a, sb->event, wait) : SA_OK;
  if (st == SA_OK) {
    pthread_mutex_lock(&a->lock);
    sb->event = NULL; /* under the lock: the reports read it (report.c) */
    st = unmap(a, sb);
    SA_VALIDATE_PACED(&a->small.slab_pace, sa__slabs_check(a));
    pthread_mutex_unlock(&a->lock);
  }
  if (st != SA_OK) {
    sb->next = *keep;
    *keep = sb;
  }
}

void sa__superblock_unmap_carved(sa_arena *a, sa_superblock *list, size_t n) {
  sa_span **spans = malloc(2 * n * sizeof *spans); /* and the sort's; NULL: one at a time */
  pthread_mutex_lock(&a->lock);
  size_t k = 0;
  while (list != NULL) {
    sa_superblock *sb = list;
    list = sb->next;
    SA_ASSERT(sb->span != NULL && sb->slab == NULL);
    sb->event = NULL; /* under the lock: the reports read it (report.c) */
    sa_span *sp = carved_to_spares(a, sb);
    if (spans != NULL)
      spans[k++] = sp;
    else
      sa__span_give_back_superblock(a, sp);
  }
  SA_ASSERT(k == n || spans == NULL);
  if (spans != NULL) sa__span_give_back_superblocks(a, spans, spans + n, k);
  SA_VALIDATE_PACED(&a->small.slab_pace, sa__slabs_check(a));
  pthread_mutex_unlock(&a->lock);
  free(spans);
}

void sa__superblock_push_all(sa_arena *a, sa_superblock *list) {
  /* Popped, so owner, event and event_owner are as they were on the stack:
   * left unwritten, as reclaim holds no lock the reports take (report.c). */
  while (list != NULL) {
    sa_superblock *sb = list;
    list = sb->next;
    push_global(a, sb);
  }
}

/* With a footprint target of 2 (SA_TARGET_CARVE; a larger one acts as 2)
 * a superblock is carved in free span memory wherever a span fits it, not
 * only past the target: a slab's new chunk costs what a growth does (Note
 * [Chunk costs]), and at 2 the room the target leaves the large requests'
 * growths absorbs what the superblocks take: about half the growths, the
 * footprint within the target as before. Even where a slab has a free
 * slot, so that slabs empty and their chunks, unmapped, serve later
 * growths. Below 2 a superblock in a hole too often made one of the next
 * large requests grow. It asks the remapping ledger for nothing (it
 * replaces no reshape), though its bytes count there as every carve's do.
 * See Note [Superblocks carved at a target of 2]. */
static bool carve_in_spans_always(const sa_arena *a) {
  return a->physical.target_excess >= SA_TARGET_CARVE;
}

/* Past the footprint target, where a new superblock would otherwise
 * remap free span memory (within the ledger, physical.c) or grow past the
 * target, it is carved in free span memory as it lies, with no driver
 * call. Past it counts what placing it elsewhere would map: for a
 * superblock smaller than a granule, which only a slab holds, a new slab
 * (a granule at least) where none has a free slot of its size. Below the
 * target new memory is mapped for it, as a climb's next large requests
 * need the free spans whole (but at 2: carve_in_spans_always). Within the
 * remapping ledger (physical.c), as the reshape it replaces was. Not where
 * the user asked for remapping (a budget, a reserve_limit, a chunk_size),
 * whose reshapes stitch unmapped pieces, for a lower footprint at more
 * driver time. See Note [Superblocks carved in free spans]. */
static bool carve_in_spans(const sa_arena *a, size_t size, const sa_slab *free_slot) {
  if (a->physical.budgeted || a->cfg.reserve_limit_bytes != 0 || a->cfg.chunk_size != 0)
    return false;
  if (carve_in_spans_always(a)) return true;
  size_t soft = sa__physical_soft_limit(a);
  bool past = a->physical.bytes + size > soft;
  if (!past && size < a->gran)
    past = a->physical.bytes + (size_t)slab_slots(a, size) * size > soft && free_slot == NULL;
  return past && sa__physical_remap_allowance(a, soft) >= size;
}

/* Memory for sb (hdr.size bytes), its pages named: free span memory
 * where carve_in_spans says so, else a free slot of a slab, a new slab
 * when the arena holds many superblocks already (always for one smaller
 * than a granule), else a chunk of its own. Arena lock held. */
static sa_status place(sa_arena *a, sa_stream_arena *sarena, sa_superblock *sb, size_t limit) {
  size_t size = sb->hdr.size;
  /* Carving in spans leaves the slabs as they are; where it is always
   * tried first, their walk waits until it finds no span. */
  bool always = carve_in_spans_always(a);
  sa_slab *sl = always ? NULL : slab_with_slot(a, size);
  if (carve_in_spans(a, size, sl)) {
    sa_status st = sa__span_take_superblock(a, sarena, size, &sb->hdr, &sb->span);
    if (st != SA_OK) return st;
    if (sb->span != NULL) {
      sb->hdr.base = sb->span->base;
      atomic_fetch_add_explicit(&a->physical.xcarved_bytes, size, memory_order_relaxed);
      return SA_OK;
    }
  }
  if (always) sl = slab_with_slot(a, size);
  uintptr_t at = sl != NULL ? slab_take(a, sl, &sb->slab, &sb->slot) : 0;
  uint32_t k = slab_slots(a, size);
  if (at == 0 && k > 1) {
    sa_status st = slab_new(a, size, k, limit);
    if (st != SA_OK && size < a->gran) return st; /* only a slab holds it */
    if (st == SA_OK) { /* slab_new pushed it first */
      SA_ASSERT(a->small.slabs->slot == size && a->small.slabs->nfree == k);
      at = slab_take(a, a->small.slabs, &sb->slab, &sb->slot);
    }
  }
  if (at != 0) {
    sb->hdr.base = at;
    sa__pagemap_set(a, at, size, &sb->hdr);
    return SA_OK;
  }
  sa_status st = map_fresh(a, &sb->hdr, size, limit);
  if (st == SA_OK) sa__pagemap_set(a, sb->hdr.base, size, &sb->hdr);
  return st;
}

/* Carve a fresh superblock of size bytes for sarena, or larger when a block of
 * need bytes would not fit (a thread that read the large threshold before
 * sa_set_superblock_size shrank it): in free span memory, a slab's slot or
 * a chunk of its own, holding no more than limit physical bytes in all. */
static sa_status carve(sa_arena *a, sa_stream_arena *sarena, size_t size, size_t need, size_t limit,
                       sa_superblock **out) {
  if (size < need) size = (need + a->gran - 1) & ~(a->gran - 1);
  uint32_t nstate = (uint32_t)(size / SA_ALIGNMENT);
  pthread_mutex_lock(&a->lock);
  /* A spare descriptor whose state bytes cover this size, else a new one:
   * state arrays never move or shrink (see sa_superblock.state). */
  sa_superblock **psb = &a->small.spare_superblocks, *sb;
  while (*psb != NULL && (*psb)->nstate < nstate) psb = &(*psb)->next;
  if ((sb = *psb) != NULL) {
    *psb = sb->next;
  } else {
    sb = calloc(1, sizeof *sb);
    _Atomic uint8_t *state = calloc(nstate, 1); /* SA_BLOCK_FREE */
    if (sb == NULL || state == NULL) {
      free(sb);
      free((void *)state);
      pthread_mutex_unlock(&a->lock);
      return SA_ERR_OUT_OF_MEMORY;
    }
    sb->hdr.kind = SA_DESC_SUPERBLOCK;
    sb->state = state;
    sb->nstate = nstate;
    sb->all_next = a->small.all_superblocks;
    a->small.all_superblocks = sb;
  }
  sb->hdr.size = size;
  sb->slab = NULL;
  sb->span = NULL;
  sa_status st = place(a, sarena, sb, limit);
  if (st != SA_OK) { /* nothing mapped on it (physical.c keeps a refused unwind) */
    sb->hdr.base = 0;
    sb->next = a->small.spare_superblocks;
    a->small.spare_superblocks = sb;
  }
  SA_VALIDATE_PACED(&a->small.slab_pace, sa__slabs_check(a));
  pthread_mutex_unlock(&a->lock);
  if (st == SA_OK) *out = sb;
  return st;
}

/* The first of sarena's empty superblocks with room for a block of need bytes
 * (one carved before sa_set_superblock_size grew the size may have none). */
static sa_superblock *take_local(sa_stream_arena *sarena, size_t need) {
  for (sa_superblock **psb = &sarena->empty; *psb != NULL; psb = &(*psb)->next) {
    sa_superblock *sb = *psb;
    if (sb->hdr.size < need) continue;
    *psb = sb->next;
    sarena->nempty--;
    if (sb->event != NULL) sa__event_drop(sarena->arena, sb->event); /* own stream orders it */
    sb->event = NULL;
    return sb;
  }
  return NULL;
}

/* The size of a fresh superblock for class cls (blocks of need bytes) on
 * sarena: the arena's superblock size, but a class's first superblocks on a
 * stream are smaller, room for a thread cache's refill or SA_SMALL_BLOCKS
 * blocks (at least a page), each twice the last: a class a stream uses for
 * a few blocks pinned a whole superblock (See Note [First superblocks of a
 * class]). Those smaller than a granule share one in a slab, so not where
 * no slab is made (a budget, the user's chunk_size). Owner lock held. */
static size_t fresh_size(const sa_stream_arena *sarena, size_t need, unsigned cls) {
  const sa_arena *a = sarena->arena;
  size_t full = atomic_load_explicit(&a->small.xsuperblock_size, memory_order_relaxed);
  size_t page = (size_t)1 << a->range.page_shift;
  if (a->physical.budgeted || a->cfg.chunk_size != 0 || page == a->gran) return full;
  size_t size = page;
  while (size * SA_SLAB_MAX < a->gran) size *= 2; /* a slab's slots hold the granule */
  size_t refill = sa_class_refill(cls);
  size_t blocks = refill > SA_SMALL_BLOCKS ? refill : SA_SMALL_BLOCKS;
  while (size < need * blocks && size < full) size *= 2;
  for (unsigned i = 0; i < sarena->carved[cls] && size < full; i++) size *= 2;
  return size < full ? size : full;
}

/* Superblocks popped from the global stack and looked at before carving. */
#define SCAN_GLOBAL 8

/* A superblock from the global stack with room for a block of need bytes,
 * made safe for sarena's stream. Smaller ones whose work completed are unmapped
 * on the way, so that carving can stitch their chunks; the others go back.
 * NULL with *st SA_OK: none. */
static sa_superblock *take_global(sa_stream_arena *sarena, size_t need, sa_status *st) {
  sa_arena *a = sarena->arena;
  sa_superblock *found = NULL, *aside = NULL, *sb;
  *st = SA_OK;
  for (int i = 0; i < SCAN_GLOBAL && (sb = sa__superblock_pop_global(a)) != NULL; i++) {
    if (sb->hdr.size >= need) {
      found = sb;
      break;
    }
    sa__superblock_unmap_or_keep(a, sb, SA_QUERY, &aside);
  }
  sa__superblock_push_all(a, aside);
  if (found != NULL && found->event != NULL) {
    /* The same stream arena (not merely the same handle value, which a new
     * stream may reuse) is ordered by its stream alone. */
    if (found->event_owner == sarena->id)
      sa__event_drop(a, found->event);
    else
      *st = sa__event_consume(a, found->event, sarena->stream);
    if (*st != SA_OK) {
      sa__superblock_to_global(a, found, found->event, found->event_owner);
      return NULL;
    }
    found->event = NULL;
  }
  return found;
}

/* Owner lock held. Local empties first (no event: same stream), then the
 * global stack (a device-side wait at most), then fresh memory. Every one
 * holds at least one block of cls: a superblock formatted with none would
 * never empty again, and so never return. */
sa_status sa__superblock_acquire(sa_stream_arena *sarena, unsigned cls, size_t limit,
                                 sa_superblock **out) {
  sa_arena *a = sarena->arena;
  size_t need = sa_class_size(cls);
  sa_status st = SA_OK;
  sa_superblock *sb = take_local(sarena, need);
  if (sb == NULL) sb = take_global(sarena, need, &st);
  if (st != SA_OK) return st;
  if (sb == NULL) {
    st = carve(a, sarena, fresh_size(sarena, need, cls), need, limit, &sb);
    if (st != SA_OK) return st;
    if (sarena->carved[cls] < UINT8_MAX) sarena->carved[cls]++;
    count(a, sb, +1, 0); /* a new empty one */
  }
  if (sb->owner != sarena) sarena->nsuperblocks++;
  sb->owner = sarena;
  /* Reused by this stream, possibly behind a wait enqueued on it just now:
   * until an event here, it is this stream's work. */
  sb->dirty_gen = sa__sync_gen(&a->sync);
  st = sa__superblock_format(sb, cls);
  if (st != SA_OK) {
    sb->next = sarena->empty;
    sarena->empty = sb;
    sarena->nempty++;
    return st;
  }
  count(a, sb, -1, +1);
  sb->next = sb->prev = NULL;
  sb->in_bin = false;
  SA_VALIDATE_PACED(&sarena->superblock_pace, sa__superblock_check(sb));
  *out = sb;
  return SA_OK;
}
