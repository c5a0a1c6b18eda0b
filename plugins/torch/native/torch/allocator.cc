// streamarena as PyTorch's CUDA allocator, natively: a subclass of
// c10::cuda::CUDACachingAllocator::CUDAAllocator over the native core
// (core/backend.h), installed with
// torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator by
// sa_torch_native_install (python/streamarena/torch.py calls it through
// ctypes before CUDA starts).
//
// The class's layout is the torch build's own, so this file is compiled
// against the torch that loads it (python -m streamarena.torch build;
// docs/TORCH.md). It adapts: c10's types to the core's, the core's Failure
// to PyTorch's exceptions (torch.OutOfMemoryError for out of memory), the
// CUDA runtime to the core's Platform, and PyTorch's hooks around an
// allocation (the profiler's memory events, the CUDA sanitizer's trace).
// Everything the core cannot hold without PyTorch lives here too: pools
// over another PyTorch allocator (MemPool(allocator=...)), snapshots in
// PyTorch's structures, and the calls streamarena cannot serve, which raise
// saying why.
#include <c10/core/Allocator.h>
#include <c10/core/impl/GPUTrace.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/headeronly/version.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "plugins/torch/native/core/backend.h"
#include "plugins/torch/native/core/failure.h"
#include "plugins/torch/streamarena_torch.h"

#ifndef SA_TORCH_BUILT_FOR
#define SA_TORCH_BUILT_FOR TORCH_VERSION
#endif

namespace sa_native {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::TraceEntry;

// The core's trace actions are PyTorch's, in the same order.
static_assert(static_cast<int>(Action::kAlloc) == TraceEntry::ALLOC &&
                  static_cast<int>(Action::kFreeRequested) == TraceEntry::FREE_REQUESTED &&
                  static_cast<int>(Action::kFreeCompleted) == TraceEntry::FREE_COMPLETED &&
                  static_cast<int>(Action::kSegmentAlloc) == TraceEntry::SEGMENT_ALLOC &&
                  static_cast<int>(Action::kSegmentFree) == TraceEntry::SEGMENT_FREE &&
                  static_cast<int>(Action::kSegmentMap) == TraceEntry::SEGMENT_MAP &&
                  static_cast<int>(Action::kSegmentUnmap) == TraceEntry::SEGMENT_UNMAP &&
                  static_cast<int>(Action::kSnapshot) == TraceEntry::SNAPSHOT &&
                  static_cast<int>(Action::kOom) == TraceEntry::OOM,
              "the core's Action must follow c10's TraceEntry::Action");
static_assert(static_cast<int>(When::kAll) == static_cast<int>(cca::RecordContext::ALL),
              "the core's When must follow c10's RecordContext");

// A core failure as PyTorch's exception of the same meaning.
[[noreturn]] void rethrow(const Failure &f) {
  switch (f.kind()) {
    case Failure::Kind::kOutOfMemory:
      TORCH_CHECK_WITH(OutOfMemoryError, false, f.what());
    case Failure::Kind::kUnsupported:
      TORCH_CHECK_NOT_IMPLEMENTED(false, f.what());
    default:
      TORCH_CHECK(false, f.what());
  }
}

// A CUDA runtime error that must not escape (a deleter), as a status.
sa_status cuda_status(cudaError_t err) {
  if (err == cudaSuccess) return SA_OK;
  (void)cudaGetLastError();  // PyTorch's next kernel-launch check must not see it
  return err == cudaErrorMemoryAllocation ? SA_ERR_OUT_OF_MEMORY : SA_ERR_DRIVER;
}

// --- the core's platform, on the CUDA runtime and c10 ------------------------

class TorchPlatform final : public Platform {
 public:
  sa_status on_device(int device, const std::function<sa_status()> &call) override {
    c10::DeviceIndex current = -1;
    sa_status st = cuda_status(c10::cuda::GetDevice(&current));
    if (st != SA_OK) return st;
    if (current == device) return call();
    st = cuda_status(c10::cuda::SetDevice(static_cast<c10::DeviceIndex>(device)));
    if (st != SA_OK) return st;
    sa_status result = call();
    st = cuda_status(c10::cuda::SetDevice(current));
    if (st != SA_OK)
      std::fprintf(stderr, "streamarena torch: could not make device %d current again\n",
                   static_cast<int>(current));
    return result;
  }

  bool capturing(sa_stream stream) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaError_t err = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      // The legacy stream while another stream captures in the global mode:
      // work on it would join the capture.
      return err == cudaErrorStreamCaptureImplicit;
    }
    return status != cudaStreamCaptureStatusNone;
  }

  sa_status relaxed(const std::function<sa_status()> &call) override {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    sa_status st = cuda_status(cudaThreadExchangeStreamCaptureMode(&mode));
    if (st != SA_OK) return st;
    sa_status result = call();
    st = cuda_status(cudaThreadExchangeStreamCaptureMode(&mode));
    if (st != SA_OK) std::fprintf(stderr, "streamarena torch: could not restore the capture mode\n");
    return result;
  }

  sa_status synchronize(int device) override {
    return on_device(device, [] { return cuda_status(cudaDeviceSynchronize()); });
  }

  void memory_info(int device, size_t *free_bytes, size_t *total_bytes) override {
    *free_bytes = *total_bytes = 0;
    sa_status st = on_device(device, [&] { return cuda_status(cudaMemGetInfo(free_bytes, total_bytes)); });
    if (st != SA_OK) *free_bytes = *total_bytes = 0;
  }

  uint64_t peers_of(int device) override {
    uint64_t mask = 0;
    int n = static_cast<int>(c10::cuda::device_count());
    for (int p = 0; p < n && p < 64; p++) {
      if (p == device) continue;
      int can = 0;
      if (cuda_status(cudaDeviceCanAccessPeer(&can, p, device)) == SA_OK && can)
        mask |= uint64_t{1} << p;
    }
    return mask;
  }

  bool run_free_memory_callbacks() override {
    bool freed = false;
    for (const auto &name : c10::FreeCudaMemoryCallbacksRegistry()->Keys())
      freed |= c10::FreeCudaMemoryCallbacksRegistry()->Create(name)->Execute();
    return freed;
  }

  int64_t now() override { return static_cast<int64_t>(c10::getApproximateTime()); }
};

// --- a pool over another PyTorch allocator -----------------------------------

// MemPool(allocator=X): the pool's blocks are X's (ncclMemAlloc's, say),
// one per allocation as X hands them out. record_stream is kept here: at
// the free, the allocation's stream waits for an event on each recorded
// stream, so that X, which orders reuse after that stream, orders it after
// them too.
class ForeignPool final : public PoolBackend {
 public:
  ForeignPool(std::shared_ptr<cca::CUDAAllocator> allocator, int device)
      : allocator_(std::move(allocator)), device_(device) {}

  sa_status alloc(size_t size, sa_stream stream, void **out) override {
    try {
      c10::cuda::CUDAGuard g(static_cast<c10::DeviceIndex>(device_));
      *out = allocator_->raw_alloc_with_stream(size, static_cast<cudaStream_t>(stream));
    } catch (const c10::OutOfMemoryError &) {
      *out = nullptr;
    } catch (const c10::Error &e) {
      std::fprintf(stderr, "streamarena torch: %s.raw_alloc: %s\n", allocator_->name().c_str(),
                   e.what_without_backtrace());
      return SA_ERR_DRIVER;
    }
    return *out != nullptr ? SA_OK : SA_ERR_OUT_OF_MEMORY;
  }

  sa_status free(void *p, sa_stream stream) override {
    std::vector<std::pair<cudaStream_t, int>> recorded;
    {
      std::lock_guard<std::mutex> g(lock_);
      auto it = recorded_.find(p);
      if (it != recorded_.end()) {
        recorded = std::move(it->second);
        recorded_.erase(it);
      }
    }
    sa_status st = SA_OK;
    for (const auto &r : recorded) {
      c10::cuda::CUDAGuard g(static_cast<c10::DeviceIndex>(r.second));
      cudaEvent_t ev = nullptr;
      sa_status e = cuda_status(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      if (e == SA_OK) e = cuda_status(cudaEventRecord(ev, r.first));
      if (e == SA_OK) e = cuda_status(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), ev, 0));
      if (ev != nullptr && cuda_status(cudaEventDestroy(ev)) != SA_OK && e == SA_OK) e = SA_ERR_DRIVER;
      if (e != SA_OK) st = e;
    }
    try {
      allocator_->raw_delete(p);
    } catch (const c10::Error &) {
      return SA_ERR_INVALID_POINTER;
    }
    return st;
  }

  sa_status record(void *p, sa_stream stream, int stream_device) override {
    std::lock_guard<std::mutex> g(lock_);
    recorded_[p].emplace_back(static_cast<cudaStream_t>(stream), stream_device);
    return SA_OK;
  }

  sa_status trim() override { return SA_OK; }  // nothing is cached here
  sa_arena *arena() const override { return nullptr; }
  size_t block_size(size_t request) const override { return request; }
  bool large(size_t request) const override { return request > (size_t{1} << 20); }

 private:
  std::shared_ptr<cca::CUDAAllocator> allocator_;
  int device_;
  std::mutex lock_;
  std::unordered_map<void *, std::vector<std::pair<cudaStream_t, int>>> recorded_;
};

// What getCheckpointState hands CUDA graph trees: the pool's live blocks.
struct PoolCheckpoint final : cca::AllocatorState {
  int device = 0;
  PoolId pool = kDefaultPool;
  std::vector<Backend::PoolBlock> live;
};

// --- the allocator -------------------------------------------------------------

void delete_block(void *p);
void delete_uncached(void *p);

class StreamArenaAllocator final : public cca::CUDAAllocator {
 public:
  explicit StreamArenaAllocator(std::string conf) : backend_(platform_, std::move(conf)) {}

  Backend &backend() { return backend_; }

  // -- c10::Allocator
  c10::DataPtr allocate(size_t n) override {
    c10::DeviceIndex dev = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&dev));
    c10::Device where(c10::DeviceType::CUDA, dev);
    if (!enabled_.load(std::memory_order_relaxed)) {
      // caching_allocator_enable(False): cudaMalloc and cudaFree each
      // allocation, as PyTorch's allocator does then.
      void *p = nullptr;
      if (n != 0) C10_CUDA_CHECK(cudaMalloc(&p, n));
      return {p, p, &delete_uncached, where};
    }
    void *p = alloc(dev, n, c10::cuda::getCurrentCUDAStream(dev).stream());
    return {p, p, &delete_block, where};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_block; }

  void copy_data(void *dest, const void *src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  // -- c10::DeviceAllocator
  bool initialized() override { return backend_.initialized(); }

  void emptyCache(c10::MempoolId_t id) override {
    try {
      backend_.empty_cache(PoolId{id.first, id.second});
    } catch (const Failure &f) {
      rethrow(f);
    }
  }

  using cca::CUDAAllocator::recordStream;
  void recordStream(const c10::DataPtr &ptr, c10::cuda::CUDAStream stream) override {
    // An empty tensor's storage has no memory, and memory another allocator
    // made (from_blob, DLPack) is not ours to order.
    if (ptr.get() == nullptr || ptr.get_deleter() != &delete_block) return;
    try {
      backend_.record_stream(ptr.get(), stream.stream(), stream.device_index());
    } catch (const Failure &f) {
      rethrow(f);
    }
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    Counters c;
    try {
      c = backend_.stats(device);
    } catch (const Failure &f) {
      rethrow(f);
    }
    DeviceStats s;
    auto one = [](const Stat &from, c10::CachingAllocator::Stat &to) {
      to.current = from.current;
      to.peak = from.peak;
      to.allocated = from.allocated;
      to.freed = from.freed;
    };
    auto array = [&](const StatArray &from, c10::CachingAllocator::StatArray &to) {
      for (size_t i = 0; i < from.size() && i < to.size(); i++) one(from[i], to[i]);
    };
    array(c.allocation, s.allocation);
    array(c.segment, s.segment);
    array(c.active, s.active);
    array(c.inactive_split, s.inactive_split);
    array(c.allocated_bytes, s.allocated_bytes);
    array(c.reserved_bytes, s.reserved_bytes);
    array(c.active_bytes, s.active_bytes);
    array(c.inactive_split_bytes, s.inactive_split_bytes);
    array(c.requested_bytes, s.requested_bytes);
    s.num_alloc_retries = c.num_alloc_retries;
    s.num_ooms = c.num_ooms;
    one(c.oversize_allocations, s.oversize_allocations);
    one(c.oversize_segments, s.oversize_segments);
    s.num_sync_all_streams = c.num_sync_all_streams;
    s.num_device_alloc = c.num_device_alloc;
    s.num_device_free = c.num_device_free;
    s.max_split_size = c.max_split_size;
    return s;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    call([&] { backend_.reset_accumulated(device); });
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    call([&] { backend_.reset_peak(device); });
  }

  // -- CUDAAllocator
  void *raw_alloc(size_t nbytes) override {
    c10::DeviceIndex dev = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&dev));
    return raw(dev, nbytes, c10::cuda::getCurrentCUDAStream(dev).stream());
  }

  void *raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    c10::DeviceIndex dev = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&dev));
    return raw(dev, nbytes, stream);
  }

  // Memory raw_alloc took from cudaMalloc goes back to cudaFree, whatever
  // enable says by now.
  void raw_delete(void *ptr) override {
    if (take_raw_uncached(ptr)) {
      C10_CUDA_CHECK(cudaFree(ptr));
      return;
    }
    free(ptr);
  }

  void init(int device_count) override { backend_.init(device_count); }

  double getMemoryFraction(c10::DeviceIndex device) override {
    double f = 1.0;
    call([&] { f = backend_.memory_fraction(device); });
    return f;
  }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    call([&] { backend_.set_memory_fraction(device, fraction); });
  }

  // PyTorch's expandable segments are per stream; streamarena's mappings
  // are not such segments.
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override {
    return {};
  }

  void enable(bool value) override { enabled_.store(value); }
  bool isEnabled() const override { return enabled_.load(); }

  void cacheInfo(c10::DeviceIndex device, size_t *largest) override {
    // As PyTorch's allocator: a zero asks for a first guess, the device's
    // free memory; then the largest the arenas could serve from what they hold.
    if (*largest == 0) {
      size_t total = 0;
      c10::cuda::CUDAGuard g(device);
      C10_CUDA_CHECK(cudaMemGetInfo(largest, &total));
    }
    size_t held = 0;
    call([&] { held = backend_.cache_info(device); });
    if (held > *largest) *largest = held;
  }

  void *getBaseAllocation(void *ptr, size_t *size) override {
    void *base = nullptr;
    TORCH_CHECK(backend_.base_allocation(ptr, &base, size),
                "streamarena: invalid device pointer: ", ptr,
                " (not the start of a live block of streamarena)");
    return base;
  }

  cca::SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces) override {
    cca::SnapshotInfo out;
    PoolId pool{mempool_id.first, mempool_id.second};
    std::vector<SegmentView> segments;
    call([&] { segments = backend_.segments(pool); });
    for (SegmentView &v : segments) {
      c10::CachingDeviceAllocator::SegmentInfo s;
      s.device = static_cast<c10::DeviceIndex>(v.device);
      s.address = v.address;
      s.total_size = v.total;
      s.requested_size = v.requested;
      s.allocated_size = v.allocated;
      s.active_size = v.active;
      s.stream = reinterpret_cast<void *>(v.stream);
      s.is_large = v.large;
      s.is_expandable = true;  // mapped ranges that grow, as expandable segments are
      s.owner_private_pool_id = {v.pool.first, v.pool.second};
      for (BlockView &b : v.blocks) {
        c10::CachingDeviceAllocator::BlockInfo bi;
        bi.size = b.size;
        bi.requested_size = b.requested;
        bi.allocated = b.state == BlockState::kLive;
        bi.active = b.state != BlockState::kFree;
        bi.context_when_allocated = std::static_pointer_cast<c10::GatheredContext>(b.context);
        s.blocks.push_back(std::move(bi));
      }
      out.segments.push_back(std::move(s));
    }
    if (include_traces) {
      int n = backend_.device_count();
      auto to_ns = clock_.makeConverter();
      for (int d = 0; d < n; d++) {
        std::vector<TraceEntry> entries;
        for (TraceRecord &r : backend_.history().entries(d)) {
          entries.push_back(trace_entry(r));
          entries.back().time_.t_ = to_ns(r.time) / 1000;
        }
        out.device_traces.push_back(std::move(entries));
      }
      for (Annotation &a : backend_.history().annotations()) {
        c10::CachingDeviceAllocator::AnnotationEntry e(static_cast<c10::DeviceIndex>(a.device),
                                                      a.time);
        for (auto &kv : a.metadata) e.recordUserMetadata(kv.first, kv.second);
        e.time_.t_ = to_ns(a.time) / 1000;
        out.external_annotations.push_back(std::move(e));
      }
    }
    // The snapshot's own entry, with the active bytes it saw, after its
    // traces were taken: the next snapshot shows it, as PyTorch's does (a
    // trace's last entry is the last thing the program did).
    if (backend_.history().wants(Action::kSnapshot)) {
      c10::DeviceIndex current = 0;
      C10_CUDA_CHECK(c10::cuda::GetDevice(&current));
      TraceRecord snap;
      snap.action = Action::kSnapshot;
      snap.device = current;
      snap.pool = pool;
      for (const SegmentView &v : segments) snap.size += v.active;
      backend_.history().record(std::move(snap), platform_.now());
    }
    out.config_metadata.garbage_collection_threshold = 0.0;
    out.config_metadata.max_split_size = SIZE_MAX;
    out.config_metadata.pinned_num_register_threads = 0;
    out.config_metadata.expandable_segments = false;
    out.config_metadata.release_lock_on_malloc = false;
    out.config_metadata.pinned_use_host_register = false;
    out.config_metadata.graph_capture_record_stream_reuse = false;
    out.config_metadata.last_allocator_settings = "streamarena: " + backend_.conf();
    return out;
  }

  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override {
    call([&] {
      backend_.begin_allocate_to_pool(
          device, PoolId{mempool_id.first, mempool_id.second},
          [f = std::move(filter)](sa_stream s) { return f(static_cast<cudaStream_t>(s)); });
    });
  }

  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    call([&] { backend_.end_allocate_to_pool(device, PoolId{mempool_id.first, mempool_id.second}); });
  }

  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    call([&] { backend_.release_pool(device, PoolId{mempool_id.first, mempool_id.second}); });
  }

  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    int n = 0;
    call([&] { n = backend_.pool_use_count(device, PoolId{mempool_id.first, mempool_id.second}); });
    return n;
  }

  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override {
    Backend::Factory factory;
    if (allocator) {
      int dev = device;
      factory = [allocator, dev] { return std::make_unique<ForeignPool>(allocator, dev); };
    }
    call([&] {
      backend_.create_or_incref_pool(device, PoolId{mempool_id.first, mempool_id.second},
                                     std::move(factory));
    });
  }

  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id, bool use_on_oom) override {
    call([&] {
      backend_.set_use_on_oom(device, PoolId{mempool_id.first, mempool_id.second}, use_on_oom);
    });
  }

  // Recorded only: PyTorch's no_split keeps each of a pool's allocations in
  // a segment of its own (for NCCL's buffer registration); streamarena
  // hands each its own block already, and its pools over another allocator
  // (MemPool(allocator=...)) take one allocation of it per block.
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    call([&] { backend_.set_no_split(device, PoolId{mempool_id.first, mempool_id.second}); });
  }

  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                const std::unordered_set<void *> &expected) override {
    bool same = false;
    call([&] {
      same = backend_.check_pool_live(device, PoolId{mempool_id.first, mempool_id.second},
                                      expected);
    });
    return same;
  }

  cca::ShareableHandle shareIpcHandle(void *ptr) override {
    TORCH_CHECK(false, "streamarena: cannot share CUDA memory with another process (CUDA IPC, "
                "as torch.multiprocessing does for a CUDA tensor; block ", ptr,
                "): streamarena maps its memory with cuMemCreate without a shareable handle "
                "type (no CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), so no other process can "
                "open it, and cudaIpcGetMemHandle refuses memory that cudaMalloc did not "
                "allocate. Send the data another way (a CPU tensor, torch.distributed), or run "
                "the process that shares CUDA tensors on PyTorch's own allocator.");
  }

  std::shared_ptr<void> getIpcDevPtr(std::string) override {
    TORCH_CHECK(false, "streamarena: cannot open a CUDA tensor another process shared (CUDA "
                "IPC, torch.multiprocessing): the native backend opens no IPC handles, as it "
                "shares none (its memory has no shareable handle type). Receive CUDA tensors "
                "in a process on PyTorch's own allocator, or send CPU tensors.");
  }

  bool isHistoryEnabled() override { return backend_.history().enabled(); }

  void recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, cca::RecordContext when, bool clearHistory,
                     const std::vector<std::string> &skip_actions) override {
    TORCH_CHECK(when == cca::RecordContext::NEVER || context_recorder,
                "streamarena: recordHistory: a context recorder is needed to record stacks");
    uint32_t skip = 0;
    for (const std::string &a : skip_actions)
      skip |= 1u << static_cast<int>(c10::CachingDeviceAllocator::parseTraceEntryAction(a));
    History::Recorder recorder;
    if (context_recorder != nullptr)
      recorder = [context_recorder]() -> Context { return context_recorder(); };
    backend_.history().configure(enabled, std::move(recorder), alloc_trace_max_entries,
                                 static_cast<When>(static_cast<int>(when)), clearHistory, skip);
  }

  void recordAnnotation(const std::vector<std::pair<std::string, std::string>> &md) override {
    if (!backend_.history().enabled()) return;
    c10::DeviceIndex dev = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&dev));
    Annotation a;
    a.device = dev;
    a.time = platform_.now();
    a.metadata = md;
    backend_.history().annotate(std::move(a));
  }

  void pushCompileContext(std::string &md) override { backend_.history().push_compile_context(md); }
  void popCompileContext() override { backend_.history().pop_compile_context(); }
  void setUserMetadata(const std::string &metadata) override {
    backend_.history().set_user_metadata(metadata);
  }
  std::string getUserMetadata() override { return backend_.history().user_metadata(); }

  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    backend_.attach_oom_observer(std::move(observer));
  }

  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override {
    backend_.history().attach_tracker(
        [tracker = std::move(tracker)](const TraceRecord &r) { tracker(trace_entry(r)); });
  }

  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    c10::cuda::CUDAGuard g(dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      C10_CUDA_CHECK(err);
    }
    // cudaMalloc's memory is now readable from dev; streamarena's is where
    // its arenas mapped it for dev (peer_access), which cannot change later.
    if (!backend_.mapped_for(dev_to_access, dev)) {
      TORCH_WARN_ONCE("streamarena: device ", static_cast<int>(dev_to_access),
                      "'s memory is not mapped for device ", static_cast<int>(dev),
                      " (peer_access in STREAMARENA_CONF leaves it out): copies between them "
                      "go through cudaMemcpyPeerAsync, and a kernel on device ",
                      static_cast<int>(dev), " that reads it directly faults. Leave "
                      "peer_access out (every device that can map it) or name the device.");
    }
  }

  cudaError_t memcpyAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    // As PyTorch does for expandable segments: memory mapped with cuMemMap
    // is copied across devices by a plain cudaMemcpyAsync only where it is
    // mapped for both.
    if (srcDevice == dstDevice ||
        (p2p_enabled && backend_.mapped_for(srcDevice, dstDevice) &&
         backend_.mapped_for(dstDevice, srcDevice)))
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }

  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          c10::MempoolId_t id) override {
    auto state = std::make_shared<PoolCheckpoint>();
    state->device = device;
    state->pool = PoolId{id.first, id.second};
    call([&] { state->live = backend_.pool_blocks(device, state->pool); });
    return state;
  }

  cca::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> as) override {
    auto state = std::dynamic_pointer_cast<PoolCheckpoint>(as);
    TORCH_CHECK(state != nullptr && state->device == device,
                "streamarena: setCheckpointPoolState: not a checkpoint of this allocator for "
                "device ", static_cast<int>(device));
    std::vector<Backend::PoolBlock> now;
    call([&] { now = backend_.pool_blocks(device, state->pool); });
    std::unordered_set<void *> then, live;
    for (auto &b : state->live) then.insert(b.p);
    for (auto &b : now) live.insert(b.p);
    // The pool as it was: blocks allocated since go, then the checkpoint's
    // blocks freed since are allocated again at their addresses (CUDA graph
    // trees hand them back to the tensors a recorded graph's outputs were).
    cca::CheckpointDelta delta;
    for (auto &b : now) {
      if (then.count(b.p) != 0) continue;
      free(b.p);
      delta.ptrs_freed.push_back(b.p);
    }
    c10::Device where(c10::DeviceType::CUDA, device);
    for (auto &b : state->live) {
      if (live.count(b.p) != 0) continue;
      call([&] { backend_.alloc_at(device, state->pool, b.p, b.size, b.stream); });
      delta.dataptrs_allocd.emplace_back(b.p, b.p, &delete_block, where);
    }
    return delta;
  }

  std::string name() override { return "streamarena"; }

  // -- shared by the entry points
  void free(void *p) {
    if (p == nullptr) return;
    if (const c10::impl::PyInterpreter *trace = c10::impl::GPUTrace::get_trace())
      (*trace)->trace_gpu_memory_deallocation(c10::kCUDA, reinterpret_cast<uintptr_t>(p));
    int dev = -1;
    size_t block = 0;
    bool profiling = c10::memoryProfilingEnabled();
    if (profiling) {
      void *base = nullptr;
      if (backend_.base_allocation(p, &base, &block)) {
        c10::DeviceIndex d = 0;
        if (c10::cuda::GetDevice(&d) == cudaSuccess) dev = d;
      }
    }
    call([&] { backend_.free(p); });
    if (profiling && dev >= 0) report_usage(p, -static_cast<int64_t>(block), dev);
  }

 private:
  template <typename F>
  void call(F f) {
    try {
      f();
    } catch (const Failure &e) {
      rethrow(e);
    }
  }

  // raw_alloc's memory: with caching_allocator_enable(False), cudaMalloc's,
  // counted in no statistic, as PyTorch's allocator does then (a DataPtr
  // carries delete_uncached instead; a raw pointer is remembered here).
  void *raw(c10::DeviceIndex dev, size_t n, cudaStream_t stream) {
    if (enabled_.load(std::memory_order_relaxed)) return alloc(dev, n, stream);
    if (n == 0) return nullptr;
    void *p = nullptr;
    C10_CUDA_CHECK(cudaMalloc(&p, n));
    std::lock_guard<std::mutex> g(raw_uncached_lock_);
    try {
      raw_uncached_.insert(p);
    } catch (...) {
      (void)cudaFree(p);  // not remembered: raw_delete would hand it to the arena
      throw;
    }
    nraw_uncached_.store(raw_uncached_.size(), std::memory_order_relaxed);
    return p;
  }

  // Whether p is raw_alloc's cudaMalloc memory (forgotten here if so). A
  // set that is empty costs a load.
  bool take_raw_uncached(void *p) {
    if (p == nullptr || nraw_uncached_.load(std::memory_order_relaxed) == 0) return false;
    std::lock_guard<std::mutex> g(raw_uncached_lock_);
    bool found = raw_uncached_.erase(p) != 0;
    nraw_uncached_.store(raw_uncached_.size(), std::memory_order_relaxed);
    return found;
  }

  void *alloc(c10::DeviceIndex dev, size_t n, cudaStream_t stream) {
    void *p = nullptr;
    try {
      p = backend_.alloc(dev, n, stream);
    } catch (const Failure &e) {
      if (e.kind() == Failure::Kind::kOutOfMemory && c10::memoryProfilingEnabled()) {
        Counters c = backend_.stats(dev);
        c10::reportOutOfMemoryToProfiler(
            static_cast<int64_t>(n),
            static_cast<size_t>(c.allocated_bytes[kAggregate].current),
            static_cast<size_t>(c.reserved_bytes[kAggregate].current),
            c10::Device(c10::DeviceType::CUDA, dev));
      }
      rethrow(e);
    }
    if (p == nullptr) return p;
    if (const c10::impl::PyInterpreter *trace = c10::impl::GPUTrace::get_trace())
      (*trace)->trace_gpu_memory_allocation(c10::kCUDA, reinterpret_cast<uintptr_t>(p));
    if (c10::memoryProfilingEnabled()) {
      void *base = nullptr;
      size_t block = n;
      backend_.base_allocation(p, &base, &block);
      report_usage(p, static_cast<int64_t>(block), dev);
    }
    return p;
  }

  void report_usage(void *p, int64_t size, int dev) {
    Counters c = backend_.stats(dev);
    c10::reportMemoryUsageToProfiler(p, size,
                                     static_cast<size_t>(c.allocated_bytes[kAggregate].current),
                                     static_cast<size_t>(c.reserved_bytes[kAggregate].current),
                                     c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(dev)));
  }

  static TraceEntry trace_entry(const TraceRecord &r) {
    return TraceEntry(static_cast<TraceEntry::Action>(static_cast<int>(r.action)),
                      static_cast<c10::DeviceIndex>(r.device), r.addr, r.size,
                      reinterpret_cast<void *>(r.stream), {r.pool.first, r.pool.second},
                      static_cast<c10::approx_time_t>(r.time),
                      std::static_pointer_cast<c10::GatheredContext>(r.context),
                      r.compile_context, r.user_metadata);
  }

  TorchPlatform platform_;
  Backend backend_;
  std::atomic<bool> enabled_{true};
  std::mutex raw_uncached_lock_;
  std::unordered_set<void *> raw_uncached_;
  std::atomic<size_t> nraw_uncached_{0};
  c10::ApproximateClockToUnixTimeConverter clock_;
};

// The installed allocator: PyTorch keeps it (changeCurrentAllocator holds a
// shared_ptr for the process's life); the deleters find it here.
std::atomic<StreamArenaAllocator *> installed{nullptr};
std::mutex install_lock;

void delete_block(void *p) { installed.load(std::memory_order_acquire)->free(p); }

void delete_uncached(void *p) {
  if (p != nullptr) C10_CUDA_CHECK(cudaFree(p));
}

void copy_message(const std::string &m, char *err, size_t err_size) {
  if (err == nullptr || err_size == 0) return;
  std::snprintf(err, err_size, "%s", m.c_str());
}

}  // namespace
}  // namespace sa_native

// --- entry points for python/streamarena/torch.py (ctypes) -------------------

extern "C" {

__attribute__((visibility("default"))) const char *sa_torch_native_built_for(void) {
  return SA_TORCH_BUILT_FOR;
}

// Makes the native backend PyTorch's CUDA allocator, configured by
// $STREAMARENA_CONF. 0 on success (also when installed already); else 1
// with the reason in err.
__attribute__((visibility("default"))) int sa_torch_native_install(char *err, size_t err_size) {
  using sa_native::installed;
  std::lock_guard<std::mutex> g(sa_native::install_lock);
  if (installed.load() != nullptr) return 0;
  try {
    const char *conf = std::getenv("STREAMARENA_CONF");
    auto a = std::make_shared<sa_native::StreamArenaAllocator>(conf != nullptr ? conf : "");
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(a);
    // PyTorch's allocator registry too (c10::GetAllocator and
    // c10::getDeviceAllocator for CUDA, which torch.accelerator's memory
    // calls ask): changeCurrentAllocator sets only the CUDA allocator's own
    // pointer, and the registry would go on naming PyTorch's uninitialized
    // allocator (torch.accelerator.memory_stats() returned nothing).
    // Priority 1: above the 0 PyTorch registers its own with.
    c10::SetAllocator(c10::DeviceType::CUDA, a.get(), 1);
    // A reference never dropped: the allocator outlives every static
    // destructor that may still free a tensor (PyTorch's own reference goes
    // with its static).
    new std::shared_ptr<sa_native::StreamArenaAllocator>(a);
    installed.store(a.get(), std::memory_order_release);
    return 0;
  } catch (const c10::Error &e) {
    sa_native::copy_message(e.what_without_backtrace(), err, err_size);
  } catch (const std::exception &e) {
    sa_native::copy_message(e.what(), err, err_size);
  }
  return 1;
}

__attribute__((visibility("default"))) int sa_torch_native_installed(void) {
  return sa_native::installed.load() != nullptr;
}

// The figures python/streamarena/torch.py reports for the pluggable
// plugin (streamarena_torch.h), from the native backend.
__attribute__((visibility("default"))) int sa_torch_native_get_stats(int device,
                                                                     sa_torch_stats *out,
                                                                     size_t size) {
  auto *a = sa_native::installed.load();
  if (a == nullptr || out == nullptr || size != sizeof *out) return SA_ERR_INVALID_ARGUMENT;
  try {
    sa_native::Counters c = a->backend().stats(device);
    const sa_native::Stat &req = c.requested_bytes[sa_native::kAggregate];
    const sa_native::Stat &count = c.allocation[sa_native::kAggregate];
    std::memset(out, 0, sizeof *out);
    out->requested_bytes = static_cast<uint64_t>(req.current);
    out->requested_bytes_peak = static_cast<uint64_t>(req.peak);
    out->requested_bytes_total = static_cast<uint64_t>(req.allocated);
    out->freed_bytes_total = static_cast<uint64_t>(req.freed);
    out->alloc_count = static_cast<uint64_t>(count.allocated);
    out->free_count = static_cast<uint64_t>(count.freed);
    out->errors = a->backend().errors();
    sa_stats s;
    if (sa_get_stats(a->backend().default_arena(device), &s) == SA_OK) {
      out->reserved_bytes = s.reserved_bytes;
      out->reserved_bytes_peak = s.reserved_bytes_peak;
      out->live_bytes = s.live_bytes;
      out->live_bytes_peak = s.live_bytes_peak;
      out->cached_bytes = s.cached_bytes;
      out->oom_events = s.oom_events;
      out->fast_path_ratio = s.fast_path_ratio;
    }
    return SA_OK;
  } catch (const std::exception &) {
    return SA_ERR_INVALID_ARGUMENT;
  }
}

__attribute__((visibility("default"))) uint64_t sa_torch_native_error_count(void) {
  auto *a = sa_native::installed.load();
  return a != nullptr ? a->backend().errors() : 0;
}

}  // extern "C"
