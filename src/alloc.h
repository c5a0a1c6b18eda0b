/* sa_alloc's internal entry (alloc.c), for graph pools (pool.c). */
#ifndef SA_ALLOC_H
#define SA_ALLOC_H

#include "base/base.h"

/* Whose allocation the slow path serves: the user's, or a graph pool's
 * segment (sa__alloc_unsynced), which never synchronizes the device or
 * calls the user's oom_callback (a capture may be underway) and takes a run
 * of its own with room above it, where the segment grows in place. */
typedef enum sa_alloc_for_e { SA_FOR_USER = 0, SA_FOR_POOL = 1 } sa_alloc_for;

/* sa_alloc on the slow path, its out-of-memory loop without the step that
 * synchronizes the device and without the user's oom_callback (alloc.c's
 * steps 5 and 6): a graph pool grows while any stream may be captured, and
 * CUDA fails a device-wide synchronize during any capture of the process,
 * invalidating it, as a callback's sa_trim would. And a large one takes a
 * run of its own (SA_FOR_POOL). */
sa_status sa__alloc_unsynced(sa_arena *a, void **out, size_t size, sa_stream s);

/* The large allocation at p, of size bytes, made on s by
 * sa__alloc_unsynced, grows in place by at least more bytes (a multiple of
 * the granularity) where the memory right above it is free or unmapped
 * (span.c, sa__span_extend), within the arena's soft limit: *added, the
 * bytes it grew by, count as allocated. SA_ERR_OUT_OF_MEMORY, nothing
 * changed, where it cannot; SA_ERR_NOT_SUPPORTED while the arena traces
 * (a trace has no line for a growth in place); SA_ERR_STREAM_ORDER where
 * the stream-order checker refuses the added memory to s (the span keeps
 * it, unused, until it is freed). A
 * graph pool's growth: its blocks stay where a capture put them, and the
 * free memory at a segment's top grows into what a request needs. */
sa_status sa__alloc_extend(sa_arena *a, void *p, size_t size, size_t more, sa_stream s,
                           size_t *added);

/* A large allocation and its free, both made inside the library and undone
 * at once (a graph pool's growth that landed misaligned and asked again),
 * taken back out of the arena's counts: its statistics count one
 * allocation per segment a pool holds. */
void sa__alloc_forget_large_pair(sa_arena *a);

#endif /* SA_ALLOC_H */
