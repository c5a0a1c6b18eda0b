/* Device-wide synchronize, and what it makes clean without an event.
 *
 * Memory handed back outside a call that names its stream (a thread's exit,
 * a cache eviction, another stream's out-of-memory path) cannot get an
 * event on that stream: the stream may be destroyed already. It is safe
 * for other streams once a device-wide synchronize that started after the
 * hand-back has completed. Generations order the two: a hand-back reads
 * sync.xstarted (sa__sync_gen, a read-modify-write) after the frees it
 * covers; a sync increments sync.xstarted before it waits and publishes
 * its number in sync.xdone after. A hand-back that read g is clean once
 * sync.xdone > g (sa__clean_since): the increment to g + 1 read the
 * hand-back's write (or a later one of the same location), so that sync's
 * wait happens after the work the frees promised was enqueued.
 *
 * Owns the generation counters of sa_arena; calls the driver; called by
 * reclaim.c (sa_trim, the out-of-memory path) and arena destroy.
 */
#include "device_sync.h"
#include "../arena.h"
#include "../driver/driver.h"

sa_status sa__device_sync(sa_arena *a) {
  uint64_t gen = atomic_fetch_add_explicit(&a->sync.xstarted, 1, memory_order_seq_cst) + 1;
  sa_status st = a->drv->ops->device_synchronize(a->drv);
  if (st != SA_OK) return st;
  uint64_t done = atomic_load_explicit(&a->sync.xdone, memory_order_relaxed);
  while (done < gen && !atomic_compare_exchange_weak_explicit(&a->sync.xdone, &done, gen,
                                                              memory_order_release,
                                                              memory_order_relaxed)) {
  }
  return SA_OK;
}
