/* Treaps (treap.c has the validator): binary search trees in an order the
 * owner gives, heap-ordered on a priority each node carries, so that with
 * priorities drawn from a hash the expected depth is logarithmic whatever
 * order nodes come and go in. Intrusive: the node is a field of its owner
 * (the large path's free spans, large/span_index.c; the graph pools' free
 * blocks, pool_block.c), which gets back to itself with SA_TREAP_OWNER.
 * Each owner keeps its own searches (a ceiling by its own key): a search
 * is a plain loop over left and right.
 *
 * The owner passes its order as a function, to functions that are static
 * and always inlined: the argument is a constant at every call site, so
 * the comparison is inlined too and the large allocation path pays no
 * indirect call per level. Insert and remove are loops, not recursion,
 * for the same reason: a recursive function cannot be inlined whole.
 *
 * Nothing here locks or allocates: the owner holds its lock and its nodes.
 */
#ifndef SA_BASE_TREAP_H
#define SA_BASE_TREAP_H

#include "base.h"

typedef struct sa_treap_node_s {
  struct sa_treap_node_s *left, *right;
  uint64_t prio; /* set by the owner before the insert; fixed while in */
} sa_treap_node;

/* A node's priority from its key (an address): splitmix64's finalizer,
 * two rounds of multiply and shift, so that keys in arithmetic progression
 * (equal spans side by side, the common case of a run carved into one size)
 * get priorities with no order among them. One round left such keys'
 * priorities a sequence whose treap grew deeper than 4 log2 n. */
static inline uint64_t sa__treap_priority(uint64_t key) {
  uint64_t z = key + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The owner of type type whose field field is the node n (not NULL). */
#define SA_TREAP_OWNER(n, type, field) ((type *)(void *)((char *)(n) - offsetof(type, field)))

/* Whether x goes before y in the tree's order. No two nodes of a tree may
 * be equal in it: remove finds a node by its key. */
typedef bool (*sa_treap_before)(const sa_treap_node *x, const sa_treap_node *y);

/* Where n goes: below every node of a priority at least its own, on n's
 * search path. The subtree found there is split by n's key into n's two
 * children, so n ends up where rotations after a leaf insert would have
 * put it, in one pass down. */
static SA_ALWAYS_INLINE void sa__treap_insert(sa_treap_node **root, sa_treap_node *n,
                                              sa_treap_before before) {
  sa_treap_node **link = root;
  while (*link != NULL && (*link)->prio >= n->prio)
    link = before(n, *link) ? &(*link)->left : &(*link)->right;
  sa_treap_node *t = *link, **low = &n->left, **high = &n->right;
  while (t != NULL) {
    if (before(n, t)) {
      *high = t;
      high = &t->left;
      t = t->left;
    } else {
      *low = t;
      low = &t->right;
      t = t->right;
    }
  }
  *low = *high = NULL;
  *link = n;
}

/* n (a member) out: its two subtrees, all of the left one before all of
 * the right one, are merged in its place by priority. n's links are
 * cleared, so a node out of the tree never points into it. */
static SA_ALWAYS_INLINE void sa__treap_remove(sa_treap_node **root, sa_treap_node *n,
                                              sa_treap_before before) {
  sa_treap_node **link = root;
  while (*link != n) {
    SA_ASSERT(*link != NULL); /* n was not in the tree */
    link = before(n, *link) ? &(*link)->left : &(*link)->right;
  }
  sa_treap_node *low = n->left, *high = n->right;
  while (low != NULL && high != NULL) {
    if (low->prio > high->prio) {
      *link = low;
      link = &low->right;
      low = low->right;
    } else {
      *link = high;
      link = &high->left;
      high = high->left;
    }
  }
  *link = low != NULL ? low : high;
  n->left = n->right = NULL;
}

/* Validator: the tree is in before's order, strictly, each node's priority
 * at least its children's, and at most 4 log2 n deep (rules named under
 * structure). With priorities a hash of distinct keys, a treap of n nodes
 * deeper than that is vanishingly rare, while one whose priorities were
 * ignored is as deep as its insertion order makes it. check_node, if not
 * NULL, checks the owner's own rules of each node (its state, that its
 * priority is its hash). Returns the nodes. */
size_t sa__treap_check(const char *structure, const sa_treap_node *root, sa_treap_before before,
                       void (*check_node)(const sa_treap_node *n));
/* Whether n is in the tree, found by its key (validators). */
bool sa__treap_has(const sa_treap_node *root, const sa_treap_node *n, sa_treap_before before);

#endif /* SA_BASE_TREAP_H */
