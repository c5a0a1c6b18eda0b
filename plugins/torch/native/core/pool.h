// Memory pools as PyTorch names them (MempoolId_t): the device's default
// pool and private ones, made by torch.cuda.MemPool, torch.cuda.graph and
// torch.compile's CUDA graph trees. PyTorch's calls and their meaning:
//
//   createOrIncrefPool(id)       a reference more (MemPool()); creates it
//   beginAllocateToPool(id, f)   a reference more, and allocations on a stream
//                                for which f(stream) holds go to the pool
//                                (a capture: the capturing stream; use_mem_pool:
//                                the calling thread)
//   endAllocateToPool(id)        stop routing to it (a reference stays)
//   releasePool(id)              a reference less; at none the pool's memory
//                                goes back once its last block is freed
//   getPoolUseCount, checkPoolLiveAllocations, setUseOnOOM, setNoSplit
//
// Each pool allocates through a PoolBackend, the one seam between this
// bookkeeping and where the memory comes from:
//   - ArenaPool (below): an arena of its own, made with the public API
//     (sa_arena_create with the device's configuration); sa_free finds a
//     block's arena by its address. The device's default pool.
//   - GraphPool (below): a graph pool of the library (streamarena.h, "Graph
//     pools") over the device's arena, for every private pool PyTorch
//     makes (torch.cuda.graph, CUDA graph trees, MemPool()). It serves a
//     capture from any thread with no driver call on the captured stream,
//     reuses a block freed during the capture in capture order, and keeps
//     every address it handed out the pool's until the pool goes: a graph
//     replays into memory that nothing else gets, and that no trim, reshape
//     or remapping of the arena touches (its segments are live spans there).
//   - the torch layer's foreign pool: MemPool(allocator=...), a PyTorch
//     allocator's raw_alloc and raw_delete (torch/allocator.cc).
//
// What the default pool (an ArenaPool) cannot do during a capture: a
// span's free records an event on the stream, which a capture refuses (the
// backend keeps such a free until no capture is underway); that is a free
// of memory allocated before the capture, which PyTorch defers the same way.
#ifndef SA_NATIVE_CORE_POOL_H
#define SA_NATIVE_CORE_POOL_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

#include <streamarena/streamarena.h>

#include "plugins/torch/native/core/platform.h"

namespace sa_native {

using PoolId = std::pair<uint64_t, uint64_t>;  // PyTorch's MempoolId_t
constexpr PoolId kDefaultPool{0, 0};

class PoolBackend {
 public:
  virtual ~PoolBackend() = default;
  virtual sa_status alloc(size_t size, sa_stream stream, void **out) = 0;
  // p on the stream it was allocated on.
  virtual sa_status free(void *p, sa_stream stream) = 0;
  // p is also used on stream, a stream of stream_device.
  virtual sa_status record(void *p, sa_stream stream, int stream_device) = 0;
  // Give cached memory back to the driver (after the device's work).
  virtual sa_status trim() = 0;
  // The arena behind it, for statistics and snapshots; null where the
  // memory is not streamarena's.
  virtual sa_arena *arena() const = 0;
  // The bytes it holds for a request, and whether that is PyTorch's large
  // pool (a span) or small pool.
  virtual size_t block_size(size_t request) const = 0;
  virtual bool large(size_t request) const = 0;
  // The library's graph pool behind it, whose segments a snapshot shows
  // (sa_pool_segments); null for the others.
  virtual sa_pool *graph_pool() const { return nullptr; }
  // size bytes at p from its free memory (a graph pool's
  // sa_pool_alloc_at); SA_ERR_NOT_SUPPORTED for the others.
  virtual sa_status alloc_at(void *p, size_t size, sa_stream stream) {
    (void)p;
    (void)size;
    (void)stream;
    return SA_ERR_NOT_SUPPORTED;
  }
};

// A pool with an arena of its own. Throws Failure where the arena cannot
// be made (the configuration's message, or no CUDA for a CUDA program).
class ArenaPool final : public PoolBackend {
 public:
  ArenaPool(Platform &platform, const sa_config &config, bool allow_host);
  ~ArenaPool() override;
  ArenaPool(const ArenaPool &) = delete;
  ArenaPool &operator=(const ArenaPool &) = delete;

  sa_status alloc(size_t size, sa_stream stream, void **out) override;
  sa_status free(void *p, sa_stream stream) override;
  sa_status record(void *p, sa_stream stream, int stream_device) override;
  sa_status trim() override;
  sa_arena *arena() const override { return arena_; }
  size_t block_size(size_t request) const override;
  bool large(size_t request) const override;

 private:
  Platform &platform_;
  int device_;
  sa_arena *arena_ = nullptr;
  size_t large_threshold_ = 0;
};

// A private pool: a graph pool of the library over the device's arena
// (parent, which outlives it). Its memory is counted in parent's statistics
// (its segments are live spans there), so arena() is null: the figures
// would count it twice. Destroyed only when PyTorch holds no reference, no
// block and no kept free, and no capture is routed (PoolTable::take_unused):
// the destructor waits for the device, as PyTorch's cudaFree of a private
// pool's segments does, and returns the segments to parent.
class GraphPool final : public PoolBackend {
 public:
  GraphPool(Platform &platform, sa_arena *parent, int device);
  ~GraphPool() override;
  GraphPool(const GraphPool &) = delete;
  GraphPool &operator=(const GraphPool &) = delete;

  sa_status alloc(size_t size, sa_stream stream, void **out) override;
  sa_status free(void *p, sa_stream stream) override;
  sa_status record(void *p, sa_stream stream, int stream_device) override;
  // A private pool's memory is its graphs' while it lives: as PyTorch's
  // emptyCache, a trim leaves it.
  sa_status trim() override { return SA_OK; }
  sa_arena *arena() const override { return nullptr; }
  size_t block_size(size_t request) const override;
  bool large(size_t request) const override;
  sa_pool *graph_pool() const override { return pool_; }
  sa_status alloc_at(void *p, size_t size, sa_stream stream) override;

 private:
  Platform &platform_;
  int device_;
  sa_pool *pool_ = nullptr;
};

// A pool and PyTorch's references to it.
struct PoolEntry {
  PoolId id = kDefaultPool;
  int device = 0;
  std::unique_ptr<PoolBackend> backend;
  int use_count = 0;            // PoolTable's lock
  bool use_on_oom = false;      // PoolTable's lock
  bool no_split = false;        // recorded; streamarena splits no PyTorch segment
  std::atomic<size_t> live{0};  // blocks allocated and not freed
  std::atomic<size_t> held{0};  // frees kept back until no capture is underway
  std::mutex live_lock;
  std::unordered_set<void *> live_set;  // private pools only: checkPoolLiveAllocations
};

// A device's private pools and where its allocations go.
class PoolTable {
 public:
  using Factory = std::function<std::unique_ptr<PoolBackend>()>;
  using Filter = std::function<bool(sa_stream)>;

  explicit PoolTable(int device) : device_(device) {}

  // The pool allocations on stream go to, or null for the default pool.
  // Calls the filters of the pools being allocated to, in the order their
  // routes began (PyTorch's order), under the table's lock.
  PoolEntry *route(sa_stream stream);
  bool routing() const { return routes_.load(std::memory_order_acquire) != 0; }

  // Throw Failure(kInvalid) for an unknown pool where PyTorch asserts.
  void create_or_incref(PoolId id, const Factory &make);
  PoolEntry *begin_allocate(PoolId id, const Factory &make, Filter filter);
  void end_allocate(PoolId id);
  void release(PoolId id);
  int use_count(PoolId id);
  void set_use_on_oom(PoolId id, bool on);
  void set_no_split(PoolId id);
  bool check_live(PoolId id, const std::unordered_set<void *> &expected);

  // Runs f on every pool (the table locked: f must not call back into it).
  void each(const std::function<void(PoolEntry &)> &f);
  // The pools with use_on_oom set, for an allocation the default pool
  // refused. Each comes with its held count raised, so that it stays while
  // the caller tries it: the caller lowers it again.
  std::vector<PoolEntry *> oom_pools();
  PoolEntry *find(PoolId id);
  // Takes out the pools no one references, holding no block and no kept
  // free, while nothing is routed (their destruction synchronizes, which a
  // capture elsewhere would not survive); the caller destroys them.
  std::vector<std::unique_ptr<PoolEntry>> take_unused();

 private:
  PoolEntry *get_or_create(PoolId id, const Factory &make);  // lock held

  struct Route {
    PoolId id;
    PoolEntry *pool;
    Filter filter;
  };
  int device_;
  std::mutex lock_;
  std::map<PoolId, std::unique_ptr<PoolEntry>> pools_;
  std::vector<Route> routing_;
  std::atomic<int> routes_{0};
};

}  // namespace sa_native

#endif  // SA_NATIVE_CORE_POOL_H
