// Pools (pool.h): an arena per pool, and PyTorch's references and routes.
#include "plugins/torch/native/core/pool.h"

#include <algorithm>
#include <string>

#include "plugins/torch/native/core/block_size.h"
#include "plugins/torch/native/core/failure.h"
#include "plugins/torch/native/core/layout.h"

namespace sa_native {
namespace {

std::string pool_name(PoolId id) {
  return "(" + std::to_string(id.first) + ", " + std::to_string(id.second) + ")";
}

// call, with device current where stream is NULL: the library takes NULL
// as the legacy stream of the current device (platform.h, on_device).
sa_status on_stream(Platform &platform, int device, sa_stream stream,
                    const std::function<sa_status()> &call) {
  return stream != nullptr ? call() : platform.on_device(device, call);
}

}  // namespace

ArenaPool::ArenaPool(Platform &platform, const sa_config &config, bool allow_host)
    : platform_(platform), device_(config.device) {
  char err[256] = "";
  sa_status st = sa_config_check(&config, err, sizeof err);
  if (st == SA_OK) st = sa_arena_create(&config, &arena_);
  if (st != SA_OK) {
    const char *drv = "";
    int code = sa_last_driver_error(&drv);
    std::string why = err[0] != '\0' ? err : sa_status_string(st);
    if (st == SA_ERR_DRIVER || st == SA_ERR_NO_DEVICE)
      why += " (driver error " + std::to_string(code) + ", " + (drv ? drv : "?") + ")";
    throw Failure(st == SA_ERR_OUT_OF_MEMORY ? Failure::Kind::kOutOfMemory
                                             : Failure::Kind::kLibrary,
                  "streamarena: cannot create an arena on device " + std::to_string(device_) +
                      ": " + why);
  }
  // PyTorch's memory must be the GPU's: the simulator only where the
  // configuration asks for it, never as backend auto's stand-in for a
  // driver that does not open (the framework's kernels would fault on its
  // CPU addresses).
  if (!allow_host && config.backend == SA_BACKEND_AUTO &&
      sa_arena_backend(arena_) == SA_BACKEND_HOST) {
    std::string why = sa_arena_backend_reason(arena_);
    sa_arena_destroy(arena_);
    arena_ = nullptr;
    throw Failure(Failure::Kind::kLibrary, "streamarena: " + why +
                                               "; PyTorch needs CUDA memory (backend=host "
                                               "in STREAMARENA_CONF for the simulator)");
  }
  try {
    large_threshold_ = read_layout(arena_).large_threshold;
  } catch (...) {
    sa_arena_destroy(arena_);
    arena_ = nullptr;
    throw;
  }
}

ArenaPool::~ArenaPool() {
  if (arena_ == nullptr) return;
  sa_status st = sa_arena_destroy(arena_);
  if (st != SA_OK)
    fprintf(stderr, "streamarena torch: destroying a pool's arena on device %d: %s\n", device_,
            sa_status_string(st));
}

sa_status ArenaPool::alloc(size_t size, sa_stream stream, void **out) {
  return on_stream(platform_, device_, stream, [&] { return sa_alloc(arena_, out, size, stream); });
}

sa_status ArenaPool::free(void *p, sa_stream stream) {
  return on_stream(platform_, device_, stream, [&] { return sa_free(p, stream); });
}

sa_status ArenaPool::record(void *p, sa_stream stream, int stream_device) {
  return on_stream(platform_, stream_device, stream, [&] { return sa_record_stream(p, stream); });
}

sa_status ArenaPool::trim() { return sa_trim(arena_, 0); }

size_t ArenaPool::block_size(size_t request) const {
  return sa_native::block_size(request, large_threshold_);
}

bool ArenaPool::large(size_t request) const { return is_large(request, large_threshold_); }

// --- GraphPool -----------------------------------------------------------

namespace {

// A graph pool's blocks are multiples of this (streamarena.h, sa_pool_alloc).
constexpr size_t kGraphPoolUnit = 512;
// PyTorch's small pool holds requests up to this (kSmallSize): its
// statistics split a private pool's blocks by it too.
constexpr size_t kTorchSmallSize = size_t{1} << 20;

}  // namespace

GraphPool::GraphPool(Platform &platform, sa_arena *parent, int device)
    : platform_(platform), device_(device) {
  sa_status st = sa_pool_create(parent, &pool_);
  if (st != SA_OK) {
    pool_ = nullptr;
    const char *drv = "";
    int code = sa_last_driver_error(&drv);
    std::string why = sa_status_string(st);
    if (st == SA_ERR_DRIVER) why += " (driver error " + std::to_string(code) + ", " + drv + ")";
    throw Failure(st == SA_ERR_OUT_OF_MEMORY ? Failure::Kind::kOutOfMemory
                                             : Failure::Kind::kLibrary,
                  "streamarena: cannot create a graph pool on device " + std::to_string(device) +
                      ": " + why);
  }
}

GraphPool::~GraphPool() {
  if (pool_ == nullptr) return;
  // The pool's graphs may still run on any stream: the device's work first,
  // then the release, whose stream is then any (the device's legacy one).
  sa_status st = platform_.synchronize(device_);
  if (st == SA_OK)
    st = platform_.on_device(device_, [&] { return sa_pool_release(pool_, nullptr); });
  if (st != SA_OK)
    fprintf(stderr,
            "streamarena torch: releasing a graph pool on device %d: %s (its memory stays "
            "reserved until the arena goes)\n",
            device_, sa_status_string(st));
}

sa_status GraphPool::alloc(size_t size, sa_stream stream, void **out) {
  return on_stream(platform_, device_, stream,
                   [&] { return sa_pool_alloc(pool_, out, size, stream); });
}

sa_status GraphPool::alloc_at(void *p, size_t size, sa_stream stream) {
  return on_stream(platform_, device_, stream,
                   [&] { return sa_pool_alloc_at(pool_, p, size, stream); });
}

// A pool's block is freed and recorded as any block: sa_free finds its pool.
sa_status GraphPool::free(void *p, sa_stream stream) {
  return on_stream(platform_, device_, stream, [&] { return sa_free(p, stream); });
}

sa_status GraphPool::record(void *p, sa_stream stream, int stream_device) {
  return on_stream(platform_, stream_device, stream, [&] { return sa_record_stream(p, stream); });
}

size_t GraphPool::block_size(size_t request) const {
  return (request + kGraphPoolUnit - 1) / kGraphPoolUnit * kGraphPoolUnit;
}

bool GraphPool::large(size_t request) const { return request > kTorchSmallSize; }

// --- PoolTable -----------------------------------------------------------

PoolEntry *PoolTable::route(sa_stream stream) {
  std::lock_guard<std::mutex> g(lock_);
  for (const Route &r : routing_)
    if (r.filter(stream)) return r.pool;
  return nullptr;
}

PoolEntry *PoolTable::get_or_create(PoolId id, const Factory &make) {
  auto it = pools_.find(id);
  if (it != pools_.end()) {
    it->second->use_count++;
    return it->second.get();
  }
  auto e = std::make_unique<PoolEntry>();
  e->id = id;
  e->device = device_;
  e->backend = make();
  e->use_count = 1;
  PoolEntry *raw = e.get();
  pools_.emplace(id, std::move(e));
  return raw;
}

void PoolTable::create_or_incref(PoolId id, const Factory &make) {
  std::lock_guard<std::mutex> g(lock_);
  get_or_create(id, make);
}

PoolEntry *PoolTable::begin_allocate(PoolId id, const Factory &make, Filter filter) {
  std::lock_guard<std::mutex> g(lock_);
  for (const Route &r : routing_)
    if (r.id == id)
      throw Failure(Failure::Kind::kInvalid,
                    "beginAllocateToPool: already recording to mempool_id " + pool_name(id));
  PoolEntry *e = get_or_create(id, make);
  routing_.push_back(Route{id, e, std::move(filter)});
  routes_.store(static_cast<int>(routing_.size()), std::memory_order_release);
  return e;
}

void PoolTable::end_allocate(PoolId id) {
  std::lock_guard<std::mutex> g(lock_);
  auto it = std::find_if(routing_.begin(), routing_.end(),
                         [&](const Route &r) { return r.id == id; });
  if (it == routing_.end())
    throw Failure(Failure::Kind::kInvalid,
                  "endAllocateToPool: not currently recording to mempool_id " + pool_name(id));
  routing_.erase(it);
  routes_.store(static_cast<int>(routing_.size()), std::memory_order_release);
}

void PoolTable::release(PoolId id) {
  std::lock_guard<std::mutex> g(lock_);
  auto it = pools_.find(id);
  if (it == pools_.end() || it->second->use_count <= 0)
    throw Failure(Failure::Kind::kInvalid,
                  "releasePool: no reference to mempool_id " + pool_name(id) + " is held");
  it->second->use_count--;
}

int PoolTable::use_count(PoolId id) {
  std::lock_guard<std::mutex> g(lock_);
  auto it = pools_.find(id);
  return it == pools_.end() ? 0 : it->second->use_count;
}

void PoolTable::set_use_on_oom(PoolId id, bool on) {
  std::lock_guard<std::mutex> g(lock_);
  auto it = pools_.find(id);
  if (it == pools_.end())
    throw Failure(Failure::Kind::kInvalid, "setUseOnOOM: no mempool_id " + pool_name(id));
  it->second->use_on_oom = on;
}

void PoolTable::set_no_split(PoolId id) {
  std::lock_guard<std::mutex> g(lock_);
  auto it = pools_.find(id);
  if (it == pools_.end())
    throw Failure(Failure::Kind::kInvalid, "setNoSplit: no mempool_id " + pool_name(id));
  it->second->no_split = true;
}

bool PoolTable::check_live(PoolId id, const std::unordered_set<void *> &expected) {
  std::lock_guard<std::mutex> g(lock_);
  auto it = pools_.find(id);
  if (it == pools_.end())
    throw Failure(Failure::Kind::kInvalid,
                  "checkPoolLiveAllocations: no mempool_id " + pool_name(id));
  PoolEntry &e = *it->second;
  std::lock_guard<std::mutex> lg(e.live_lock);
  if (e.live_set.size() != expected.size()) return false;
  for (void *p : e.live_set)
    if (expected.count(p) == 0) return false;
  return true;
}

void PoolTable::each(const std::function<void(PoolEntry &)> &f) {
  std::lock_guard<std::mutex> g(lock_);
  for (auto &kv : pools_) f(*kv.second);
}

std::vector<PoolEntry *> PoolTable::oom_pools() {
  std::lock_guard<std::mutex> g(lock_);
  std::vector<PoolEntry *> out;
  for (auto &kv : pools_)
    if (kv.second->use_on_oom && kv.second->use_count > 0) {
      kv.second->held++;
      out.push_back(kv.second.get());
    }
  return out;
}

PoolEntry *PoolTable::find(PoolId id) {
  std::lock_guard<std::mutex> g(lock_);
  auto it = pools_.find(id);
  return it == pools_.end() ? nullptr : it->second.get();
}

std::vector<std::unique_ptr<PoolEntry>> PoolTable::take_unused() {
  std::lock_guard<std::mutex> g(lock_);
  std::vector<std::unique_ptr<PoolEntry>> out;
  if (!routing_.empty()) return out;
  for (auto it = pools_.begin(); it != pools_.end();) {
    PoolEntry &e = *it->second;
    if (e.use_count == 0 && e.live.load() == 0 && e.held.load() == 0) {
      out.push_back(std::move(it->second));
      it = pools_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

}  // namespace sa_native
