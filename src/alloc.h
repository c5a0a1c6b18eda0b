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

/* A large allocation and its free, both made inside the library and undone
 * at once (a graph pool's growth that landed misaligned and asked again),
 * taken back out of the arena's counts: its statistics count one
 * allocation per segment a pool holds. */
void sa__alloc_forget_large_pair(sa_arena *a);

#endif /* SA_ALLOC_H */
