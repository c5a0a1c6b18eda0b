/* The two indexes over spans (span.c): free spans by size, for best fit,
 * and live spans by address, for sa_free.
 *
 * Free spans: a treap keyed by (size, base). The smallest span of at least
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
 * arena lock held. Calls nothing of the allocator.
 */
#include <stdlib.h>

#include "span_index.h"
#include "../arena.h"
#include "../base/base.h"
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

static sa_span *rotate_right(sa_span *t) {
  sa_span *l = t->left;
  t->left = l->right;
  l->right = t;
  return l;
}

static sa_span *rotate_left(sa_span *t) {
  sa_span *r = t->right;
  t->right = r->left;
  r->left = t;
  return r;
}

static sa_span *insert(sa_span *t, sa_span *n) {
  if (t == NULL) return n;
  if (before(n, t->size, t->base)) {
    t->left = insert(t->left, n);
    if (t->left->prio > t->prio) t = rotate_right(t);
  } else {
    t->right = insert(t->right, n);
    if (t->right->prio > t->prio) t = rotate_left(t);
  }
  return t;
}

/* Remove n (a member) from the subtree t. */
static sa_span *remove_node(sa_span *t, sa_span *n) {
  if (t == n) {
    if (t->left == NULL) return t->right;
    if (t->right == NULL) return t->left;
    if (t->left->prio > t->right->prio) {
      t = rotate_right(t);
      t->right = remove_node(t->right, n);
    } else {
      t = rotate_left(t);
      t->left = remove_node(t->left, n);
    }
    return t;
  }
  if (before(n, t->size, t->base))
    t->left = remove_node(t->left, n);
  else
    t->right = remove_node(t->right, n);
  return t;
}

void sa__fit_insert(sa_arena *a, sa_span *sp) {
  sp->left = sp->right = NULL;
  sp->prio = priority(sp->base);
  a->spans.fit_root = insert(a->spans.fit_root, sp);
}

void sa__fit_remove(sa_arena *a, sa_span *sp) {
  a->spans.fit_root = remove_node(a->spans.fit_root, sp);
  sp->left = sp->right = NULL;
}

sa_span *sa__fit_ceiling(const sa_arena *a, size_t size, uintptr_t base) {
  sa_span *best = NULL;
  for (sa_span *t = a->spans.fit_root; t != NULL;) {
    if (before(t, size, base)) {
      t = t->right;
    } else {
      best = t;
      t = t->left;
    }
  }
  return best;
}

/* The fit index's rules, checked by an in-order walk: (size, base) order,
 * every node's priority the hash of its base and at least its children's,
 * and so a depth that stays logarithmic whatever order spans come and go
 * in. With priorities a hash of distinct addresses, a treap of n nodes
 * deeper than 4 log2 n is vanishingly rare, while one whose priorities were
 * ignored is as deep as its insertion order makes it (n, in address
 * order). The walk gives up past SA_FIT_DEPTH_MAX, deeper than any such
 * bound, so a cycle fails instead of recursing without end. */
#define SA_FIT_DEPTH_MAX 256
typedef struct fit_walk_s {
  const sa_span *last; /* in order */
  size_t nodes;
  unsigned depth;      /* the deepest node's, the root's 1 */
} fit_walk;

static const char TREAP[] = "free-span treap";

static void fit_walk_node(const sa_span *t, unsigned depth, fit_walk *w) {
  if (t == NULL) return;
  SA_CHECK(TREAP, depth <= SA_FIT_DEPTH_MAX, "depth at most 4 log2 n");
  if (depth > w->depth) w->depth = depth;
  SA_CHECK(TREAP, atomic_load_explicit(&t->xstate, memory_order_relaxed) == SA_BLOCK_FREE,
           "only free spans");
  SA_CHECK(TREAP, t->prio == priority(t->base), "prio is the hash of base");
  SA_CHECK(TREAP, t->left == NULL || t->left->prio <= t->prio, "heap order on prio");
  SA_CHECK(TREAP, t->right == NULL || t->right->prio <= t->prio, "heap order on prio");
  fit_walk_node(t->left, depth + 1, w);
  SA_CHECK(TREAP, w->last == NULL || before(w->last, t->size, t->base), "(size, base) order");
  w->last = t;
  w->nodes++;
  fit_walk_node(t->right, depth + 1, w);
}

size_t sa__fit_check(const sa_arena *a) {
  fit_walk w = {NULL, 0, 0};
  fit_walk_node(a->spans.fit_root, 1, &w);
  unsigned log2n = 1;
  while (((size_t)1 << log2n) < w.nodes) log2n++;
  SA_CHECK(TREAP, w.depth <= 4 * log2n, "depth at most 4 log2 n");
  return w.nodes;
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
