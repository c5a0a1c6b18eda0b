/* The memory summary (report.c) for the out-of-memory report and the
 * snapshot, the world lock both take, and every validator at once. Called
 * by alloc.c, snapshot.c and arena.c. */
#ifndef SA_REPORT_H
#define SA_REPORT_H

#include <stdio.h>

#include "base/base.h"

typedef struct sa_stream_arena_s sa_stream_arena; /* small/stream_arena.h */

typedef struct sa_summary_s {
  size_t total, reserved, in_use, live_bytes, free, largest_free_span;
  double fragmentation; /* 1 - largest_free_span / free */
} sa_summary;
typedef struct sa_holding_s { /* what one stream arena holds */
  size_t superblocks, superblock_bytes, empty_superblocks;
  size_t live_block_bytes, free_block_bytes;
  size_t live_spans, live_span_bytes, free_span_bytes, deferred_blocks;
} sa_holding;
/* Every stream arena lock, then the arena lock; returns the list head. */
sa_stream_arena *sa__world_lock(sa_arena *a);
void sa__world_unlock(sa_arena *a, sa_stream_arena *head);
void sa__summary_locked(sa_arena *a, sa_summary *s);
void sa__holding_locked(sa_arena *a, const sa_stream_arena *sarena, sa_holding *h);
void sa__oom_report(sa_arena *a, size_t size, sa_stream stream, FILE *f); /* no lock held */
/* Every validator, unpaced: with the world lock held, or taking the locks
 * (with many stream arenas, one stream arena's lock at a time). */
void sa__world_check_locked(sa_arena *a);
void sa__world_check(sa_arena *a);

#endif /* SA_REPORT_H */
