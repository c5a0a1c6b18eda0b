/* The two indexes over spans (span_index.c): free spans by size, for best
 * fit, and live spans by address, for sa_free. Calls nothing; called by the
 * span files with the arena lock held. */
#ifndef SA_LARGE_SPAN_INDEX_H
#define SA_LARGE_SPAN_INDEX_H

#include "../base/base.h"

typedef struct sa_span_s sa_span; /* span.h */

/* Live spans by base address: an open-addressing table. */
typedef struct sa_live_map_s {
  sa_span **slots;
  size_t cap, n;
} sa_live_map;

void sa__fit_insert(sa_arena *a, sa_span *sp);
void sa__fit_remove(sa_arena *a, sa_span *sp);
/* The first free span at or after (size, base) in (size, base) order. */
sa_span *sa__fit_ceiling(const sa_arena *a, size_t size, uintptr_t base);
sa_status sa__live_reserve(sa_arena *a); /* room for one more insert */
void sa__live_insert(sa_arena *a, sa_span *sp);
sa_span *sa__live_find(const sa_arena *a, uintptr_t base);
void sa__live_remove(sa_arena *a, sa_span *sp);
void sa__live_fini(sa_arena *a);
/* Validator: the fit index is a treap in (size, base) order, heap-ordered
 * on prio, at most 4 log2 n deep. Returns the spans in it. */
size_t sa__fit_check(const sa_arena *a);

#endif /* SA_LARGE_SPAN_INDEX_H */
