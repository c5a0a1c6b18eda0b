/* Device-wide synchronize (device_sync.c), and what it makes clean: the
 * generations a hand-back without an event is judged by. */
#ifndef SA_BASE_DEVICE_SYNC_H
#define SA_BASE_DEVICE_SYNC_H

#include "base.h"

/* The arena's sync generations: started, and completed. */
typedef struct sa_sync_s {
  _Atomic uint64_t xstarted, xdone;
} sa_sync;

/* The generation of a hand-back made now, after the frees it covers: clean
 * once a device sync that started later completed (sa__clean_since). A
 * read-modify-write, so that the sync's increment reads from it and so
 * happens after those frees (a load could pass the driver's stores). Once
 * per batch of blocks, never per block. */
static inline uint64_t sa__sync_gen(sa_sync *sync) {
  return atomic_fetch_add_explicit(&sync->xstarted, 0, memory_order_seq_cst);
}
static inline bool sa__clean_since(sa_sync *sync, uint64_t gen) {
  return atomic_load_explicit(&sync->xdone, memory_order_acquire) > gen;
}
/* Wait for all of the device's work (driver device_synchronize). */
sa_status sa__device_sync(sa_arena *a);

#endif /* SA_BASE_DEVICE_SYNC_H */
