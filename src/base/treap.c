/* Treaps: the validator and the membership test validators use (treap.h
 * has the tree itself). Calls nothing of the allocator.
 */
#include "treap.h"

/* Deeper than 4 log2 n for any n that fits in memory: the walk gives up
 * here, so a cycle fails a check instead of recursing without end. */
#define SA_TREAP_DEPTH_MAX 256

typedef struct treap_walk_s {
  const char *structure;
  sa_treap_before before;
  void (*check_node)(const sa_treap_node *n);
  const sa_treap_node *last; /* in order */
  size_t nodes;
  unsigned depth;            /* the deepest node's, the root's 1 */
} treap_walk;

/* A node's own rules and its children's priorities before the walk goes
 * down, so a child above its parent is named as such, not by whatever else
 * its wrong priority breaks in the owner's rules. */
static void walk_node(const sa_treap_node *t, unsigned depth, treap_walk *w) {
  if (t == NULL) return;
  SA_CHECK(w->structure, depth <= SA_TREAP_DEPTH_MAX, "depth at most 4 log2 n");
  if (depth > w->depth) w->depth = depth;
  SA_CHECK(w->structure, t->left == NULL || t->left->prio <= t->prio, "heap order on prio");
  SA_CHECK(w->structure, t->right == NULL || t->right->prio <= t->prio, "heap order on prio");
  if (w->check_node != NULL) w->check_node(t);
  walk_node(t->left, depth + 1, w);
  SA_CHECK(w->structure, w->last == NULL || w->before(w->last, t), "in order, no two equal");
  w->last = t;
  w->nodes++;
  walk_node(t->right, depth + 1, w);
}

size_t sa__treap_check(const char *structure, const sa_treap_node *root, sa_treap_before before,
                       void (*check_node)(const sa_treap_node *n)) {
  treap_walk w = {structure, before, check_node, NULL, 0, 0};
  walk_node(root, 1, &w);
  unsigned log2n = 1;
  while (((size_t)1 << log2n) < w.nodes) log2n++;
  SA_CHECK(structure, w.depth <= 4 * log2n, "depth at most 4 log2 n");
  return w.nodes;
}

bool sa__treap_has(const sa_treap_node *root, const sa_treap_node *n, sa_treap_before before) {
  const sa_treap_node *t = root;
  while (t != NULL && t != n) t = before(n, t) ? t->left : t->right;
  return t != NULL;
}
