// A device's statistics in the shape of PyTorch's DeviceStats
// (c10/core/CachingDeviceAllocator.h): each figure current, peak, allocated
// (ever added) and freed (ever taken away), for all blocks and for the
// small and large pool, so that torch.cuda.memory_stats, memory_summary and
// max_memory_allocated read them without a Python patch (the torch layer
// copies them field by field).
//
// Blocks are counted at the backend's alloc and free: allocation and active
// in blocks, allocated_bytes and active_bytes in the block's size as the
// arena holds it (block_size.h), requested_bytes in bytes asked for. A
// request up to the arena's large threshold is in the small pool (a
// superblock's block), a larger one in the large pool (a span). Reserved
// bytes and segments (physical chunks) are the arenas' figures, observed
// when statistics are read and when the backend gives memory back: their
// peak and totals are those observations (the backend raises the peak to
// an arena's own peak when that rose since the last reset). One lock per
// device: a handful of additions under it, as PyTorch's allocator counts
// under its own lock.
#ifndef SA_NATIVE_CORE_COUNTERS_H
#define SA_NATIVE_CORE_COUNTERS_H

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace sa_native {

struct Stat {
  int64_t current = 0, peak = 0, allocated = 0, freed = 0;
  void increase(uint64_t n);
  void decrease(uint64_t n);
  void set(uint64_t now);  // an observed level: the change counts as allocated or freed
  void reset_peak() { peak = current; }
  void reset_accumulated() { allocated = freed = 0; }
};

enum StatType { kAggregate = 0, kSmallPool = 1, kLargePool = 2, kStatTypes = 3 };
using StatArray = std::array<Stat, kStatTypes>;

struct Counters {
  StatArray allocation, segment, active, inactive_split;
  StatArray allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes;
  int64_t num_alloc_retries = 0, num_ooms = 0, num_sync_all_streams = 0;
  int64_t num_device_alloc = 0, num_device_free = 0;
  Stat oversize_allocations, oversize_segments;
  int64_t max_split_size = -1;  // PyTorch's "no limit" (SIZE_MAX as int64)
};

class DeviceCounters {
 public:
  void allocated(bool large, size_t block, size_t requested);
  void freed(bool large, size_t block, size_t requested);
  void retried();
  void out_of_memory();
  void synchronized();
  // The device's arenas now: physical bytes held and chunks.
  void observe(size_t reserved, size_t chunks);
  // A reserved peak the observations missed (an arena's own, risen since
  // the last reset).
  void raise_reserved_peak(size_t peak);
  Counters read();
  void reset_peak();
  void reset_accumulated();

 private:
  std::mutex lock_;
  Counters c_;
};

}  // namespace sa_native

#endif  // SA_NATIVE_CORE_COUNTERS_H
