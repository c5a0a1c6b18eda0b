/* The two indexes over spans (span.c): free spans by size, for best fit,
 * and live spans by address, for sa_free.
 *
 * Free spans: bins of sizes, each a treap (base/treap.h) keyed by (size,
 * base), and a bitmap of the bins that hold any. The smallest span of at
 * least a size is found in O(log n) expected, the lowest address first
 * among equal sizes (low addresses first keeps the high ones free for
 * longer): in the size's own bin, else as the least span of the next bin
 * the bitmap names. The bins keep each treap to the few spans of nearly
 * one size; one treap of every free span cost a descent of several
 * mispredicted branches per insert, remove and search. Priorities are a
 * hash of the base address, so the shape does not depend on the order of
 * operations' timing, only on the addresses.
 *
 * Live spans: an open-addressing hash table (linear probing, backward-shift
 * deletion) keyed by base address. A span is looked up by its exact start;
 * where spans share a granule the page map cannot tell them apart.
 *
 * Owns no memory but the table's slot array; every function runs with the
 * arena lock held. Calls nothing of the allocator but the treap's
 * validator.
 */
#include <stdlib.h>

#include "span_index.h"
#include "../arena.h"
#include "../base/base.h"
#include "../base/treap.h"
#include "span.h"

/* ------------------------------------------------------------------------
 * Free spans by size: treaps in bins
 * ---------------------------------------------------------------------- */

/* The bin of a size: below 16 quanta one per quantum, then eight to each
 * power of two, by the three bits below the top one. Never decreases as
 * the size grows, so every span of a later bin is larger than any of an
 * earlier one. */
static unsigned bin_of(size_t size) {
  const unsigned sub = SA_FIT_SUB_BITS;
  uint64_t q = (uint64_t)size / SA_SPAN_QUANTUM;
  if (q < (2u << sub)) return (unsigned)q;
  unsigned top = 63u - (unsigned)__builtin_clzll(q); /* sub + 1 or more */
  unsigned below_top = (unsigned)(q >> (top - sub)) & ((1u << sub) - 1u);
  return (2u << sub) + ((top - sub - 1u) << sub) + below_top;
}

_Static_assert(SA_SPAN_QUANTUM == 256, "a size has at most 56 bits of quanta (SA_FIT_BINS)");

/* Is (size, base) of x before that of y? */
static bool before(const sa_span *x, size_t size, uintptr_t base) {
  return x->size < size || (x->size == size && x->base < base);
}

static sa_span *span_of(const sa_treap_node *n) { return SA_TREAP_OWNER(n, sa_span, fit); }

static bool span_before(const sa_treap_node *x, const sa_treap_node *y) {
  const sa_span *sy = span_of(y);
  return before(span_of(x), sy->size, sy->base);
}

void sa__fit_insert(sa_arena *a, sa_span *sp) {
  sa_fit_index *f = &a->spans.fit;
  unsigned b = bin_of(sp->size);
  sp->fit.prio = sa__treap_priority(sp->base);
  sa__treap_insert(&f->bins[b], &sp->fit, span_before);
  f->nonempty[b / 64] |= (uint64_t)1 << (b % 64);
}

void sa__fit_remove(sa_arena *a, sa_span *sp) {
  sa_fit_index *f = &a->spans.fit;
  unsigned b = bin_of(sp->size);
  sa__treap_remove(&f->bins[b], &sp->fit, span_before);
  if (f->bins[b] == NULL) f->nonempty[b / 64] &= ~((uint64_t)1 << (b % 64));
}

/* The least (left) or greatest span of a treap that is not empty. */
static sa_span *extreme(const sa_treap_node *t, bool least) {
  for (const sa_treap_node *c; (c = least ? t->left : t->right) != NULL;) t = c;
  return span_of(t);
}

/* The first bin after b that holds a span; SA_FIT_BINS if none does. */
static unsigned next_bin(const sa_fit_index *f, unsigned b) {
  unsigned from = b + 1, i = from / 64;
  if (i >= SA_FIT_WORDS) return SA_FIT_BINS;
  uint64_t word = f->nonempty[i] & (~(uint64_t)0 << (from % 64)); /* bins from `from` on */
  while (word == 0) {
    if (++i == SA_FIT_WORDS) return SA_FIT_BINS;
    word = f->nonempty[i];
  }
  return i * 64 + (unsigned)__builtin_ctzll(word);
}

sa_span *sa__fit_ceiling(const sa_arena *a, size_t size, uintptr_t base) {
  const sa_fit_index *f = &a->spans.fit;
  unsigned b = bin_of(size);
  sa_span *best = NULL;
  for (const sa_treap_node *t = f->bins[b]; t != NULL;) {
    if (before(span_of(t), size, base)) {
      t = t->right;
    } else {
      best = span_of(t);
      t = t->left;
    }
  }
  if (best != NULL) return best;
  b = next_bin(f, b);
  return b == SA_FIT_BINS ? NULL : extreme(f->bins[b], true);
}

bool sa__fit_empty(const sa_arena *a) {
  for (unsigned i = 0; i < SA_FIT_WORDS; i++)
    if (a->spans.fit.nonempty[i] != 0) return false;
  return true;
}

/* The fit index's own rules of a node: only free spans, each priority the
 * hash of its base (treap.c checks the order, the heap and the depth). */
static const char FIT[] = "free-span index";

static void fit_check_span(const sa_treap_node *n) {
  const sa_span *sp = span_of(n);
  SA_CHECK(FIT, atomic_load_explicit(&sp->xstate, memory_order_relaxed) == SA_BLOCK_FREE,
           "only free spans");
  SA_CHECK(FIT, n->prio == sa__treap_priority(sp->base), "prio is the hash of base");
}

size_t sa__fit_check(const sa_arena *a) {
  const sa_fit_index *f = &a->spans.fit;
  SA_CHECK(FIT, bin_of(SIZE_MAX) == SA_FIT_BINS - 1, "the largest size has the last bin");
  size_t n = 0;
  for (unsigned b = 0; b < SA_FIT_BINS; b++) {
    bool bit = (f->nonempty[b / 64] >> (b % 64)) & 1;
    SA_CHECK(FIT, bit == (f->bins[b] != NULL), "a bin's bit is set when it holds a span");
    if (f->bins[b] == NULL) continue;
    n += sa__treap_check(FIT, f->bins[b], span_before, fit_check_span);
    /* In order by size, and bin_of never decreases: if its least and its
     * greatest span are of bin b, all of them are. */
    SA_CHECK(FIT, bin_of(extreme(f->bins[b], true)->size) == b &&
                      bin_of(extreme(f->bins[b], false)->size) == b,
             "a span is in the bin of its size");
  }
  for (unsigned b = SA_FIT_BINS; b < SA_FIT_WORDS * 64; b++)
    SA_CHECK(FIT, !((f->nonempty[b / 64] >> (b % 64)) & 1), "no bit past the last bin");
  return n;
}

/* ------------------------------------------------------------------------
 * Live spans by address: a hash table
 * ---------------------------------------------------------------------- */

static size_t slot_of(uintptr_t base, size_t mask) {
  return (size_t)(((uint64_t)base >> 8) * 0x9E3779B97F4A7C15ull >> 20) & mask;
}

sa_status sa__live_reserve(sa_arena *a) {
  sa_live_map *m = &a->spans.live_map;
  if ((m->n + 1) * 2 <= m->cap) return SA_OK;
  size_t cap = m->cap ? m->cap * 2 : 64;
  sa_span **slots = calloc(cap, sizeof *slots);
  if (slots == NULL) return SA_ERR_OUT_OF_MEMORY;
  for (size_t i = 0; i < m->cap; i++) {
    sa_span *sp = m->slots[i];
    if (sp == NULL) continue;
    size_t j = slot_of(sp->base, cap - 1);
    while (slots[j] != NULL) j = (j + 1) & (cap - 1);
    slots[j] = sp;
  }
  free(m->slots);
  m->slots = slots;
  m->cap = cap;
  return SA_OK;
}

void sa__live_insert(sa_arena *a, sa_span *sp) {
  sa_live_map *m = &a->spans.live_map; /* room made by sa__live_reserve */
  size_t j = slot_of(sp->base, m->cap - 1);
  while (m->slots[j] != NULL) j = (j + 1) & (m->cap - 1);
  m->slots[j] = sp;
  m->n++;
}

static size_t live_slot(const sa_live_map *m, uintptr_t base) {
  if (m->cap == 0) return SIZE_MAX;
  for (size_t j = slot_of(base, m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
    if (m->slots[j] == NULL) return SIZE_MAX;
    if (m->slots[j]->base == base) return j;
  }
}

sa_span *sa__live_find(const sa_arena *a, uintptr_t base) {
  size_t j = live_slot(&a->spans.live_map, base);
  return j == SIZE_MAX ? NULL : a->spans.live_map.slots[j];
}

void sa__live_remove(sa_arena *a, sa_span *sp) {
  sa_live_map *m = &a->spans.live_map;
  size_t hole = live_slot(m, sp->base), mask = m->cap - 1;
  if (hole == SIZE_MAX) return;
  m->slots[hole] = NULL;
  m->n--;
  /* Backward shift: move later members of the probe run into the hole
   * when their home slot does not lie (cyclically) after it. */
  for (size_t j = (hole + 1) & mask; m->slots[j] != NULL; j = (j + 1) & mask) {
    size_t home = slot_of(m->slots[j]->base, mask);
    bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (stays) continue;
    m->slots[hole] = m->slots[j];
    m->slots[j] = NULL;
    hole = j;
  }
}

void sa__live_fini(sa_arena *a) {
  free(a->spans.live_map.slots);
  a->spans.live_map = (sa_live_map){0};
}
