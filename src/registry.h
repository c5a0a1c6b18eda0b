/* The arena registry (registry.c): which live arena an address belongs
 * to, without a lock. Called by arena.c (add, remove) and free.c. */
#ifndef SA_REGISTRY_H
#define SA_REGISTRY_H

#include "base/base.h"

#define SA_REGISTRY_SLOT_BITS 32     /* arenas own whole 4 GiB slots */
#define SA_REGISTRY_SLOT ((uintptr_t)1 << SA_REGISTRY_SLOT_BITS)
#define SA_REGISTRY_ADDRESS_BITS 57  /* x86-64 with 5-level paging */

sa_arena *sa__arena_of(uintptr_t p); /* live arena holding p, or NULL */
sa_status sa__registry_add(sa_arena *a);   /* once a is complete */
void sa__registry_remove(sa_arena *a);     /* before a is torn down */

#endif /* SA_REGISTRY_H */
