/* sa_alloc's internal entry (alloc.c), for graph pools (pool.c). */
#ifndef SA_ALLOC_H
#define SA_ALLOC_H

#include "base/base.h"

/* Whether the out-of-memory loop may wait for the whole device. */
typedef enum sa_device_sync_e { SA_DEVICE_SYNC_ALLOWED = 0, SA_DEVICE_SYNC_NEVER = 1 } sa_device_sync;

/* sa_alloc on the slow path, its out-of-memory loop without the step that
 * synchronizes the device and without the user's oom_callback (alloc.c's
 * steps 5 and 6): a graph pool grows while any stream may be captured, and
 * CUDA fails a device-wide synchronize during any capture of the process,
 * invalidating it, as a callback's sa_trim would. Nothing else differs. */
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
