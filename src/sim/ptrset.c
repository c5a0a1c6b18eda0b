/* A set of pointers: which stream, event and chunk handles are live, so that
 * a bogus or destroyed handle is rejected without being dereferenced.
 * Open addressing with linear probing; deletions leave tombstones that a
 * rehash (in sa_sim_ptrset_reserve) clears. Used by sim/vmm.c and
 * sim/stream.c and sim/event.c under the simulator lock. */
#include <stdlib.h>

#include "sim.h"

enum { EMPTY = 0, DELETED = 1 };

static size_t hash_ptr(uintptr_t p, size_t mask) {
  /* Handles are heap pointers: drop the alignment bits, then mix. */
  uint64_t h = (uint64_t)(p >> 4) * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 32 ^ h) & mask;
}

static void place(uintptr_t *slots, size_t cap, uintptr_t p) {
  size_t i = hash_ptr(p, cap - 1);
  while (slots[i] != EMPTY && slots[i] != DELETED) i = (i + 1) & (cap - 1);
  slots[i] = p;
}

sa_status sa_sim_ptrset_reserve(sa_sim_ptrset *set, size_t n) {
  if (n > SIZE_MAX / 8 - set->used) return SA_ERR_OUT_OF_MEMORY;
  /* Keep the load (tombstones included) at most one half. */
  if ((set->used + n) * 2 <= set->cap) return SA_OK;
  size_t cap = 16;
  while (cap < (set->count + n) * 4) cap *= 2;
  uintptr_t *slots = calloc(cap, sizeof *slots);
  if (slots == NULL) return SA_ERR_OUT_OF_MEMORY;
  for (size_t i = 0; i < set->cap; i++) {
    if (set->slots[i] != EMPTY && set->slots[i] != DELETED) place(slots, cap, set->slots[i]);
  }
  free(set->slots);
  set->slots = slots;
  set->cap = cap;
  set->used = set->count;
  return SA_OK;
}

void sa_sim_ptrset_insert(sa_sim_ptrset *set, const void *p) {
  size_t i = hash_ptr((uintptr_t)p, set->cap - 1);
  while (set->slots[i] != EMPTY && set->slots[i] != DELETED) i = (i + 1) & (set->cap - 1);
  if (set->slots[i] == EMPTY) set->used++;
  set->slots[i] = (uintptr_t)p;
  set->count++;
}

static size_t find(const sa_sim_ptrset *set, uintptr_t p, int *found) {
  *found = 0;
  if (set->cap == 0 || p == EMPTY || p == DELETED) return 0;
  size_t i = hash_ptr(p, set->cap - 1);
  /* The load bound guarantees an empty slot, so this ends. */
  while (set->slots[i] != EMPTY) {
    if (set->slots[i] == p) {
      *found = 1;
      return i;
    }
    i = (i + 1) & (set->cap - 1);
  }
  return 0;
}

int sa_sim_ptrset_contains(const sa_sim_ptrset *set, const void *p) {
  int found;
  (void)find(set, (uintptr_t)p, &found);
  return found;
}

int sa_sim_ptrset_remove(sa_sim_ptrset *set, const void *p) {
  int found;
  size_t i = find(set, (uintptr_t)p, &found);
  if (!found) return 0;
  set->slots[i] = DELETED;
  set->count--;
  return 1;
}
