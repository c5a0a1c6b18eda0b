/* REFERENCE MODEL, not streamarena: a first-fit allocator over one
 * contiguous range, as a pool allocator without virtual memory remapping
 * (RMM's pool, a caching allocator's single segment) would hold it.
 *
 * The range is `capacity` bytes; every block is rounded up to 256 bytes and
 * placed at the lowest free offset where it fits; frees coalesce with their
 * neighbours. It ignores streams (every free is reusable at once), which
 * only flatters it. //bench:replay runs it beside streamarena at the same
 * capacity, so the table shows what remapping physical chunks buys.
 */
#ifndef SA_BENCH_FIRST_FIT_H
#define SA_BENCH_FIRST_FIT_H

#include <stdbool.h>
#include <stddef.h>

typedef struct ff_range_s {
  size_t off, size;
} ff_range;

typedef struct ff_model_s {
  size_t capacity;
  ff_range *free; /* sorted by offset, never adjacent */
  size_t nfree, cap;
  size_t peak_extent; /* highest end offset ever handed out */
} ff_model;

/* false when host memory for the free list ran out. */
bool ff_init(ff_model *m, size_t capacity);
void ff_fini(ff_model *m);
/* Place size bytes: true with *off, false when no free range fits. */
bool ff_alloc(ff_model *m, size_t size, size_t *off);
/* Give back a block ff_alloc placed (same size). false: out of host memory. */
bool ff_free(ff_model *m, size_t off, size_t size);
/* The largest free range (what the next request can get at most). */
size_t ff_largest_free(const ff_model *m);

#endif /* SA_BENCH_FIRST_FIT_H */
