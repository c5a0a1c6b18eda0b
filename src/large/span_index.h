/* The two indexes over spans (span_index.c): free spans by size, for best
 * fit, and live spans by address, for sa_free. Calls nothing; called by the
 * span files with the arena lock held. */
#ifndef SA_LARGE_SPAN_INDEX_H
#define SA_LARGE_SPAN_INDEX_H

#include "../base/base.h"
#include "../base/treap.h"

typedef struct sa_span_s sa_span; /* span.h */

/* Free spans by size: sizes fall in bins, eight to each power of two (the
 * smallest exact), each bin a treap in (size, base) order, and a bit per
 * bin says whether it holds any. A search looks in the key's own bin and
 * then takes the least span of the next bin that holds one, so a handful
 * of free spans spread over sizes costs a node or two per operation, not
 * a descent through all of them. */
#define SA_FIT_SUB_BITS 3 /* 2^3 bins to a power of two */
/* Exact bins below 2^(bits + 1) quanta, then 2^bits to each power of two up
 * to 2^55 quanta (a 64-bit size over 256-byte quanta). */
#define SA_FIT_BINS ((2u << SA_FIT_SUB_BITS) + ((55u - SA_FIT_SUB_BITS) << SA_FIT_SUB_BITS))
#define SA_FIT_WORDS ((SA_FIT_BINS + 63) / 64)
typedef struct sa_fit_index_s {
  sa_treap_node *bins[SA_FIT_BINS];
  uint64_t nonempty[SA_FIT_WORDS];
} sa_fit_index;

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
/* Whether the fit index holds no span. */
bool sa__fit_empty(const sa_arena *a);
/* Validator: each bin of the fit index is a treap in (size, base) order,
 * heap-ordered on prio, at most 4 log2 n deep, of spans whose sizes fall in
 * that bin, and a bin's bit is set exactly when it holds any. Returns the
 * spans in it. */
size_t sa__fit_check(const sa_arena *a);

#endif /* SA_LARGE_SPAN_INDEX_H */
