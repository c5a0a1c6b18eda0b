/* The arena registry: which live arena an address belongs to.
 *
 * Every slow free and every sa_record_stream asks, so the lookup takes no
 * lock and costs two dependent loads and a range check, however many
 * arenas exist. The address space is cut into slots of SA_REGISTRY_SLOT
 * bytes; each arena owns whole slots: its range starts on a slot boundary
 * and its reservation covers the slots its range touches (arena.c reserves
 * a slot of slack for that), so no two arenas share one. A two-level table
 * maps a slot to its arena: leaves are allocated on first use and never
 * freed, so a reader never holds freed memory; a slot is set (release)
 * after the arena is complete and cleared before its destruction starts.
 * A pointer of a destroyed arena thus finds nothing, and a concurrent
 * create or destroy of another arena touches other slots only.
 *
 * Called by arena.c (add, remove) and free.c (sa__arena_of); calls libc.
 */
#include <stdlib.h>

#include "registry.h"
#include "arena.h"

#define LEAF_BITS 13 /* 8192 slots of 4 GiB per leaf */
#define TOP_BITS (SA_REGISTRY_ADDRESS_BITS - SA_REGISTRY_SLOT_BITS - LEAF_BITS)

typedef _Atomic(sa_arena *) slot_t;

static _Atomic(slot_t *) top[(size_t)1 << TOP_BITS];

/* Whether slot_of makes a missing leaf (registering) or not (a lookup). */
typedef enum leaf_need_e { LEAF_FIND, LEAF_MAKE } leaf_need;

/* The slot of address p, its leaf made first with LEAF_MAKE; NULL if none. */
static slot_t *slot_of(uintptr_t p, leaf_need need) {
  uintptr_t s = p >> SA_REGISTRY_SLOT_BITS;
  uintptr_t t = s >> LEAF_BITS;
  if (t >= (uintptr_t)1 << TOP_BITS) return NULL;
  slot_t *leaf = atomic_load_explicit(&top[t], memory_order_acquire);
  if (leaf == NULL && need == LEAF_MAKE) {
    slot_t *fresh = calloc((size_t)1 << LEAF_BITS, sizeof *fresh);
    if (fresh == NULL) return NULL;
    if (atomic_compare_exchange_strong_explicit(&top[t], &leaf, fresh, memory_order_acq_rel,
                                                memory_order_acquire))
      leaf = fresh;
    else
      free(fresh); /* another thread's leaf won */
  }
  return leaf != NULL ? &leaf[s & (((uintptr_t)1 << LEAF_BITS) - 1)] : NULL;
}

sa_arena *sa__arena_of(uintptr_t p) {
  slot_t *slot = slot_of(p, LEAF_FIND);
  sa_arena *a = slot != NULL ? atomic_load_explicit(slot, memory_order_acquire) : NULL;
  return a != NULL && p - a->range.base < a->range.size ? a : NULL;
}

/* The slots a's range touches; a->range.base is on a slot boundary. */
static size_t slot_count(const sa_arena *a) {
  return (a->range.size + SA_REGISTRY_SLOT - 1) >> SA_REGISTRY_SLOT_BITS;
}

void sa__registry_remove(sa_arena *a) {
  for (size_t i = 0; i < slot_count(a); i++) {
    slot_t *slot = slot_of(a->range.base + (i << SA_REGISTRY_SLOT_BITS), LEAF_FIND);
    if (slot != NULL && atomic_load_explicit(slot, memory_order_relaxed) == a)
      atomic_store_explicit(slot, NULL, memory_order_release);
  }
}

sa_status sa__registry_add(sa_arena *a) {
  size_t n = slot_count(a);
  if ((a->range.base >> SA_REGISTRY_ADDRESS_BITS) != 0 ||
      ((a->range.base + (n << SA_REGISTRY_SLOT_BITS) - 1) >> SA_REGISTRY_ADDRESS_BITS) != 0)
    return SA_ERR_NOT_SUPPORTED; /* beyond 57-bit addresses */
  for (size_t i = 0; i < n; i++) {
    slot_t *slot = slot_of(a->range.base + (i << SA_REGISTRY_SLOT_BITS), LEAF_MAKE);
    sa_arena *none = NULL;
    /* Reservations do not overlap: only a bug leaves a slot taken. */
    if (slot == NULL ||
        !atomic_compare_exchange_strong_explicit(slot, &none, a, memory_order_release,
                                                 memory_order_relaxed)) {
      sa__registry_remove(a);
      return slot == NULL ? SA_ERR_OUT_OF_MEMORY : SA_ERR_INTERNAL;
    }
  }
  return SA_OK;
}
