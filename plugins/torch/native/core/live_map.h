// Every block the backend handed to PyTorch and PyTorch has not freed, by
// address: what a free needs (the allocation's stream and device, its pool
// and sizes for the statistics), what a snapshot shows per block (the
// requested size, the stack that allocated it) and what PyTorch asks of a
// pointer (getBaseAllocation, recordStream of memory that is not ours).
// PyTorch's own allocator keeps the same map under its device lock; this
// one is split in shards by address, each with its own lock, so threads
// freeing different blocks rarely meet.
#ifndef SA_NATIVE_CORE_LIVE_MAP_H
#define SA_NATIVE_CORE_LIVE_MAP_H

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <streamarena/streamarena.h>

namespace sa_native {

struct PoolEntry;
using Context = std::shared_ptr<void>;  // PyTorch's GatheredContext, opaque here

struct Allocation {
  size_t requested = 0;
  size_t block = 0;  // block_size.h
  int device = 0;
  sa_stream stream = nullptr;  // the allocation's: its free goes there
  bool large = false;
  PoolEntry *pool = nullptr;  // the pool it came from (the default pool's entry too)
  Context context;            // the stack that allocated it, when recorded
  // record_stream calls refused while the stream was captured: made at the
  // free, once no capture is underway.
  std::vector<std::pair<sa_stream, int>> pending_records;
};

class LiveMap {
 public:
  void insert(void *p, Allocation a);
  // Removes p's entry into *out; false when p is not live.
  bool take(void *p, Allocation *out);
  // Runs f on p's entry under its shard's lock; false when p is not live.
  template <typename F>
  bool with(void *p, F f) {
    Shard &s = shard(p);
    std::lock_guard<std::mutex> g(s.lock);
    auto it = s.map.find(p);
    if (it == s.map.end()) return false;
    f(it->second);
    return true;
  }
  // Runs f(address, entry) on every entry, one shard locked at a time.
  template <typename F>
  void each(F f) {
    for (size_t i = 0; i < kShards; i++) {
      Shard &s = shards_[i];
      std::lock_guard<std::mutex> g(s.lock);
      for (auto &kv : s.map) f(kv.first, kv.second);
    }
  }

 private:
  static constexpr size_t kShards = 64;
  struct alignas(64) Shard {
    std::mutex lock;
    std::unordered_map<void *, Allocation> map;
  };
  Shard &shard(void *p) {
    // Blocks are 256-byte aligned: the bits above mixed by a multiply.
    uint64_t h = (reinterpret_cast<uintptr_t>(p) >> 8) * 0x9E3779B97F4A7C15ull;
    return shards_[h >> 58];
  }
  // On the heap, where new honours the shards' alignment: an owner on a
  // stack need not be over-aligned.
  std::unique_ptr<Shard[]> shards_{new Shard[kShards]};
};

}  // namespace sa_native

#endif  // SA_NATIVE_CORE_LIVE_MAP_H
