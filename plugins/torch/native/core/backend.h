// The native backend's core: everything PyTorch's allocator interface asks
// that does not need a PyTorch type, over the public C API. The torch layer
// (torch/allocator.cc) is a thin adapter from c10's types and exceptions to
// these calls; the tests drive the same class on the host simulator.
//
// Per device: a default pool (an arena of STREAMARENA_CONF's configuration,
// made at the device's first allocation), the private pools (pool.h: graph
// pools of the library over the default pool's arena), the
// statistics (counters.h), a memory cap (set_memory_fraction) and the frees
// a capture kept back. Across devices: the live blocks (live_map.h), the
// history (history.h) and the out-of-memory observers.
//
// An allocation goes to the pool its stream is routed to (a capture's,
// use_mem_pool's) or to the default pool. Where the library answers out of
// memory, the backend retries as PyTorch's allocator does: it counts a
// retry, runs PyTorch's free-memory callbacks, gives every arena's cached
// memory of the device back (not during a capture, whose stream a
// device-wide synchronize would break) and tries again, then the pools that
// allow it (MemPool(use_on_oom=True)); if that fails too it counts an
// out-of-memory error, records it in the history, calls the observers and
// throws Failure(kOutOfMemory) with PyTorch's message and streamarena's
// figures. Nothing ever returns a null pointer for a non-zero request.
//
// The memory fraction is a cap on the physical bytes the device's arenas
// hold, as PyTorch's allocator caps the bytes it holds from cudaMalloc: a
// request whose blocks alone would pass the cap fails at once; otherwise an
// allocation that took the arenas past it is given back and retried after
// a trim, then fails. The library cannot be told the cap (docs/TORCH.md,
// the additions asked for), so the arenas may pass it for the length of one
// call.
//
// A free goes to the library on the allocation's stream, stream 0 with the
// allocation's device current. A free the library refuses because a stream
// is being captured (a default-pool span's free records an event) is kept
// back, with
// record_stream calls refused the same way, and made when no pool of the
// device is routed to: in the meantime its memory stays as it is, reused
// by nothing. PyTorch defers the events of such frees the same way.
#ifndef SA_NATIVE_CORE_BACKEND_H
#define SA_NATIVE_CORE_BACKEND_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include <streamarena/streamarena.h>

#include "plugins/torch/native/core/counters.h"
#include "plugins/torch/native/core/history.h"
#include "plugins/torch/native/core/layout.h"
#include "plugins/torch/native/core/live_map.h"
#include "plugins/torch/native/core/platform.h"
#include "plugins/torch/native/core/pool.h"

namespace sa_native {

// A block of a snapshot, and its segment (layout.h), with what PyTorch
// shows per block.
struct BlockView {
  size_t size = 0;
  size_t requested = 0;
  BlockState state = BlockState::kFree;
  Context context;
};

struct SegmentView {
  int device = 0;
  uintptr_t address = 0;
  size_t total = 0;
  size_t allocated = 0, active = 0, requested = 0;
  uintptr_t stream = 0;
  bool large = false;
  PoolId pool = kDefaultPool;
  std::vector<BlockView> blocks;
};

class Backend {
 public:
  using OomObserver = std::function<void(int64_t device, size_t size, size_t total, size_t free)>;

  // conf: sa_config_parse's syntax, every arena's configuration (its device
  // key is the backend's). Arenas run on the simulator only where it says
  // backend=host (the tests), never as backend auto's stand-in for a
  // driver that does not open. peer_access left out: the devices that can
  // map each device's memory (Platform::peers_of), so that PyTorch's
  // peer-to-peer copies and kernels can read it, as they read cudaMalloc's.
  // Throws Failure(kInvalid) for a configuration that does not parse.
  Backend(Platform &platform, std::string conf);
  // Destroys every arena (the tests' teardown). The torch layer never
  // destroys its backend: PyTorch frees tensors until the process ends,
  // static destructors' included.
  ~Backend();
  Backend(const Backend &) = delete;
  Backend &operator=(const Backend &) = delete;

  void init(int device_count);
  bool initialized() const { return ndevices_.load(std::memory_order_acquire) > 0; }
  int device_count() const { return ndevices_.load(std::memory_order_acquire); }
  const std::string &conf() const { return conf_; }

  // size bytes usable by work on stream (of device) after the call; null
  // for 0 bytes. Throws Failure: kOutOfMemory after the retries, kCapture
  // where a capture refused it, kInvalid for a device out of range.
  void *alloc(int device, size_t size, sa_stream stream);
  // Frees p, allocated by alloc. Throws Failure(kInvalid) for a pointer
  // that is not a live block of this backend; a refusal of the library is
  // reported on stderr and counted (errors()), not thrown: PyTorch frees in
  // destructors.
  void free(void *p);
  bool owns(void *p);
  // p is also used on stream (of stream_device). No-op for memory that is
  // not a live block of this backend. Throws Failure(kLibrary) where the
  // library refuses for a reason other than a capture.
  void record_stream(void *p, sa_stream stream, int stream_device);
  // The block p starts, and its size; false when p is not a live block.
  bool base_allocation(void *p, void **base, size_t *size);

  // Gives cached memory back: of every arena of every device for the
  // default pool id, else of that pool's; pools no one uses any more are
  // destroyed. A device whose pools are being allocated to is left alone.
  void empty_cache(PoolId pool);
  // The largest request the device's arenas could serve from memory they
  // hold: the largest free span, or the unmapped cached chunks.
  size_t cache_info(int device);

  void set_memory_fraction(int device, double fraction);
  double memory_fraction(int device);

  Counters stats(int device);
  void reset_peak(int device);
  void reset_accumulated(int device);

  // Pools (pool.h). factory: null for a graph pool over the device's arena.
  using Factory = PoolTable::Factory;
  void create_or_incref_pool(int device, PoolId id, Factory factory);
  void begin_allocate_to_pool(int device, PoolId id, PoolTable::Filter filter);
  void end_allocate_to_pool(int device, PoolId id);
  void release_pool(int device, PoolId id);
  int pool_use_count(int device, PoolId id);
  void set_use_on_oom(int device, PoolId id, bool on);
  void set_no_split(int device, PoolId id);
  bool check_pool_live(int device, PoolId id, const std::unordered_set<void *> &expected);

  void attach_oom_observer(OomObserver o);
  History &history() { return history_; }

  // Every device's segments for the default pool id, else the pool's.
  std::vector<SegmentView> segments(PoolId pool);

  // Whether device's arenas map their memory for peer too (the
  // configuration's peer_access, or Platform::peers_of where it has none).
  bool mapped_for(int device, int peer);

  // The live blocks of a pool (its id and device): where, the size asked
  // for, the stream.
  struct PoolBlock {
    void *p = nullptr;
    size_t size = 0;
    sa_stream stream = nullptr;
  };
  std::vector<PoolBlock> pool_blocks(int device, PoolId id);
  // A block of size bytes at p on stream, from the free memory of a graph
  // pool (sa_pool_alloc_at), tracked as alloc's are: a checkpoint's
  // restore (setCheckpointPoolState). Throws Failure(kInvalid), saying
  // why, where the pool is not a graph pool or p's range is not free.
  void alloc_at(int device, PoolId id, void *p, size_t size, sa_stream stream);

  // Library calls refused outside the reach of an exception (frees).
  uint64_t errors() const { return errors_.load(std::memory_order_relaxed); }

  // The default arena of device, made if needed (statistics of the
  // library's own: sa_get_stats).
  sa_arena *default_arena(int device);

 private:
  struct Device;
  struct Kept;  // a free kept back during a capture
  // p, just allocated from pool for size bytes on stream: PyTorch's
  // figures, the live table and the history (alloc and alloc_at).
  void track(Device &d, PoolEntry &pool, void *p, size_t size, sa_stream stream,
             const Context &ctx, size_t reserved_before);
  struct Figures {
    size_t reserved = 0, reserved_peak = 0, cached = 0, chunks = 0, largest_free_span = 0;
  };

  Device &device(int device);
  PoolEntry &default_pool(Device &d);
  std::unique_ptr<PoolBackend> make_arena_pool(int device);
  // A private pool: a graph pool over the device's arena.
  std::unique_ptr<PoolBackend> make_graph_pool(int device);
  Factory factory_for(int device, Factory given);

  sa_status attempt(Device &d, PoolEntry &pool, size_t size, sa_stream stream, bool capturing,
                    void **out, bool *over_cap);
  [[noreturn]] void refuse(Device &d, PoolEntry &pool, size_t size, sa_stream stream,
                         sa_status st, bool over_cap);
  // Frees k's block in the library (its refused records first), or keeps
  // it while a capture refuses; traced: record free_completed.
  void release(Device &d, Kept k, bool traced);
  void settle(Device &d);
  void trim_device(Device &d, bool count_sync);
  void reap(Device &d);
  Figures figures(Device &d);
  void report(const char *what, const void *p, int device, sa_status st);

  Platform &platform_;
  std::string conf_;
  sa_config config_;
  bool peers_set_ = false;
  std::unique_ptr<std::unique_ptr<Device>[]> devices_;
  std::atomic<int> ndevices_{0};
  std::mutex init_lock_;
  LiveMap live_;
  History history_;
  std::mutex observers_lock_;
  std::vector<OomObserver> observers_;
  std::atomic<uint64_t> errors_{0};
};

}  // namespace sa_native

#endif  // SA_NATIVE_CORE_BACKEND_H
