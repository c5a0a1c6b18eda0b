/* Chained hash tables (chain_table.c): the chains run through the entries,
 * each of which embeds a link. The owner holds the lock and decides when
 * the table doubles. Used by the record side table (record.c) and the live
 * index of stream arenas (small/stream_arena.c). */
#ifndef SA_BASE_CHAIN_TABLE_H
#define SA_BASE_CHAIN_TABLE_H

#include "base.h"

typedef struct sa_chain_link_s {
  uintptr_t key;                /* set by the owner before the entry is pushed */
  struct sa_chain_link_s *next; /* in its chain */
} sa_chain_link;

typedef struct sa_chain_table_s {
  sa_chain_link **heads; /* 2^bits chains; NULL until sa__chain_create */
  unsigned bits;
  unsigned key_shift;    /* low key bits left out of the hash: they vary little */
  size_t n;              /* entries in the table */
} sa_chain_table;

/* 2^bits empty chains; false (nothing made) when out of memory. */
bool sa__chain_create(sa_chain_table *t, unsigned bits, unsigned key_shift);
/* Twice the chains, entries moved; false (the table as it was) when out of
 * memory: chains get longer, nothing is lost. */
bool sa__chain_double(sa_chain_table *t);
void sa__chain_remove(sa_chain_table *t, sa_chain_link *l); /* l linked or not */
void sa__chain_destroy(sa_chain_table *t); /* the chains; the entries are the owner's */

static inline size_t sa__chain_buckets(const sa_chain_table *t) { return (size_t)1 << t->bits; }
/* Fibonacci hashing: the top bits of the product pick the chain. */
static inline sa_chain_link **sa__chain_bucket(const sa_chain_table *t, uintptr_t key) {
  return &t->heads[(uint64_t)(key >> t->key_shift) * 0x9E3779B97F4A7C15ull >> (64 - t->bits)];
}
/* The link that points at key's entry, or the null link ending its chain. */
static inline sa_chain_link **sa__chain_find(const sa_chain_table *t, uintptr_t key) {
  sa_chain_link **pl = sa__chain_bucket(t, key);
  while (*pl != NULL && (*pl)->key != key) pl = &(*pl)->next;
  return pl;
}
/* Key's entry's link, NULL if none (or no table yet). */
static inline sa_chain_link *sa__chain_get(const sa_chain_table *t, uintptr_t key) {
  return t->heads != NULL ? *sa__chain_find(t, key) : NULL;
}
static inline void sa__chain_push(sa_chain_table *t, sa_chain_link *l) { /* l->key set */
  sa_chain_link **head = sa__chain_bucket(t, l->key);
  l->next = *head;
  *head = l;
  t->n++;
}
static inline void sa__chain_unlink(sa_chain_table *t, sa_chain_link **pl) { /* *pl's entry */
  *pl = (*pl)->next;
  t->n--;
}
/* The entry of the given type whose member l is; NULL for NULL. */
#define sa__chain_entry(l, type, member) ((type *)sa__chain_entry_at((l), offsetof(type, member)))
static inline void *sa__chain_entry_at(sa_chain_link *l, size_t offset) {
  return l != NULL ? (char *)l - offset : NULL;
}

#endif /* SA_BASE_CHAIN_TABLE_H */
