/* Hash tables whose chains run through their entries: each entry holds its
 * key and the next entry of its chain (sa_chain_link), so the table is one
 * array of chain heads. Used by the sa_record_stream side table (record.c)
 * and the live index of stream arenas (stream_arena.c). Those keep their
 * own lock and their own rule for when to double; nothing here locks.
 */
#include <stdlib.h>

#include "chain_table.h"

bool sa__chain_create(sa_chain_table *t, unsigned bits, unsigned key_shift) {
  sa_chain_link **heads = calloc((size_t)1 << bits, sizeof *heads);
  if (heads == NULL) return false;
  t->heads = heads;
  t->bits = bits;
  t->key_shift = key_shift;
  t->n = 0;
  return true;
}

bool sa__chain_double(sa_chain_table *t) {
  size_t n = sa__chain_buckets(t);
  sa_chain_link **grown = calloc(2 * n, sizeof *grown);
  if (grown == NULL) return false;
  sa_chain_link **old = t->heads;
  t->heads = grown;
  t->bits++;
  for (size_t i = 0; i < n; i++) {
    for (sa_chain_link *l = old[i], *next; l != NULL; l = next) {
      next = l->next;
      sa_chain_link **head = sa__chain_bucket(t, l->key);
      l->next = *head;
      *head = l;
    }
  }
  free(old);
  return true;
}

void sa__chain_remove(sa_chain_table *t, sa_chain_link *l) {
  for (sa_chain_link **pl = sa__chain_bucket(t, l->key); *pl != NULL; pl = &(*pl)->next) {
    if (*pl != l) continue;
    sa__chain_unlink(t, pl);
    return;
  }
}

void sa__chain_destroy(sa_chain_table *t) {
  free(t->heads);
  t->heads = NULL;
  t->n = 0;
}
