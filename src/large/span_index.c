/* The two indexes over spans (span.c): free spans by size, for best fit,
 * and live spans by address, for sa_free.
 *
 * Free spans: a treap (base/treap.h) keyed by (size, base). The smallest span of at least
 * a size is found in O(log n) expected, the lowest address first among
 * equal sizes (low addresses first keeps the high ones free for longer).
 * Priorities are a hash of the base address, so the shape does not depend
 * on the order of operations' timing, only on the addresses.
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
 * Free spans by size: a treap
 * ---------------------------------------------------------------------- */

static uint64_t priority(uintptr_t base) {
  uint64_t x = (uint64_t)base >> 8;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

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
  sp->fit.prio = priority(sp->base);
  sa__treap_insert(&a->spans.fit_root, &sp->fit, span_before);
}

void sa__fit_remove(sa_arena *a, sa_span *sp) {
  sa__treap_remove(&a->spans.fit_root, &sp->fit, span_before);
}

sa_span *sa__fit_ceiling(const sa_arena *a, size_t size, uintptr_t base) {
  sa_span *best = NULL;
  for (const sa_treap_node *t = a->spans.fit_root; t != NULL;) {
    if (before(span_of(t), size, base)) {
      t = t->right;
    } else {
      best = span_of(t);
      t = t->left;
    }
  }
  return best;
}

/* The fit index's own rules of a node: only free spans, each priority the
 * hash of its base (treap.c checks the order, the heap and the depth). */
static const char TREAP[] = "free-span treap";

static void fit_check_span(const sa_treap_node *n) {
  const sa_span *sp = span_of(n);
  SA_CHECK(TREAP, atomic_load_explicit(&sp->xstate, memory_order_relaxed) == SA_BLOCK_FREE,
           "only free spans");
  SA_CHECK(TREAP, n->prio == priority(sp->base), "prio is the hash of base");
}

size_t sa__fit_check(const sa_arena *a) {
  return sa__treap_check(TREAP, a->spans.fit_root, span_before, fit_check_span);
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
