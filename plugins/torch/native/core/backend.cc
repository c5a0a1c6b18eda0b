// The native backend's core (backend.h).
#include "plugins/torch/native/core/backend.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

#include "plugins/torch/native/core/failure.h"
#include "plugins/torch/native/core/messages.h"

namespace sa_native {
namespace {

// PyTorch's own bound: larger requests fail before any allocator sees them,
// with its own words (its tests match them).
constexpr size_t kOneExaByte = 1152921504606846976ull;

// Full messages for the first failures the backend cannot throw; later
// ones are counted.
constexpr uint64_t kReportLimit = 8;

std::string pointer(const void *p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

std::string status_text(sa_status st) {
  std::string s = sa_status_string(st);
  if (st == SA_ERR_DRIVER || st == SA_ERR_NO_DEVICE || st == SA_ERR_UNKNOWN_STREAM) {
    const char *name = "";
    int code = sa_last_driver_error(&name);
    s += " (driver error " + std::to_string(code) + ", " + (name ? name : "?") + ")";
  }
  return s;
}

}  // namespace

struct Backend::Kept {
  void *p = nullptr;
  size_t size = 0;
  sa_stream stream = nullptr;
  PoolEntry *pool = nullptr;
  std::vector<std::pair<sa_stream, int>> records;
  Context context;
  int device = 0;
};

struct Backend::Device {
  explicit Device(int i) : index(i), pools(i) {}
  int index;
  std::mutex create_lock;
  std::atomic<PoolEntry *> default_pool{nullptr};
  std::unique_ptr<PoolEntry> default_owned;
  PoolTable pools;
  DeviceCounters counters;
  std::atomic<size_t> live_default{0}, live_private{0};  // block bytes
  std::mutex cap_lock;
  double fraction = 1.0;  // cap_lock
  std::atomic<size_t> cap{SIZE_MAX};  // SIZE_MAX: none (a fraction of 0 allows nothing)
  std::mutex kept_lock;
  std::vector<Kept> kept;  // kept_lock
  std::atomic<size_t> nkept{0};
  std::mutex peak_lock;
  size_t default_peak_at_reset = 0;  // peak_lock
};

Backend::Backend(Platform &platform, std::string conf)
    : platform_(platform), conf_(std::move(conf)) {
  sa_config_init(&config_);
  char err[256] = "";
  if (sa_config_parse(&config_, conf_.c_str(), err, sizeof err) != SA_OK)
    throw Failure(Failure::Kind::kInvalid, "streamarena: STREAMARENA_CONF=\"" + conf_ + "\": " +
                                               (err[0] ? err : "does not parse"));
  peers_set_ = conf_.find("peer_access") != std::string::npos;
}

Backend::~Backend() = default;

void Backend::init(int device_count) {
  std::lock_guard<std::mutex> g(init_lock_);
  // PyTorch initializes once per process; a later call keeps what exists.
  if (ndevices_.load() > 0 || device_count <= 0) return;
  devices_.reset(new std::unique_ptr<Device>[static_cast<size_t>(device_count)]);
  for (int i = 0; i < device_count; i++) devices_[static_cast<size_t>(i)].reset(new Device(i));
  ndevices_.store(device_count, std::memory_order_release);
}

Backend::Device &Backend::device(int index) {
  int n = ndevices_.load(std::memory_order_acquire);
  if (index < 0 || index >= n)
    throw Failure(Failure::Kind::kInvalid,
                  "streamarena: device " + std::to_string(index) + " out of range (" +
                      std::to_string(n) + " devices" + (n == 0 ? ", not initialized" : "") + ")");
  return *devices_[static_cast<size_t>(index)];
}

std::unique_ptr<PoolBackend> Backend::make_arena_pool(int dev) {
  sa_config c = config_;
  c.device = dev;
  if (!peers_set_) c.peer_access = platform_.peers_of(dev);
  return std::make_unique<ArenaPool>(platform_, c, false);
}

std::unique_ptr<PoolBackend> Backend::make_graph_pool(int dev) {
  return std::make_unique<GraphPool>(platform_, default_arena(dev), dev);
}

Backend::Factory Backend::factory_for(int dev, Factory given) {
  if (given) return given;
  return [this, dev] { return make_graph_pool(dev); };
}

PoolEntry &Backend::default_pool(Device &d) {
  PoolEntry *e = d.default_pool.load(std::memory_order_acquire);
  if (e != nullptr) return *e;
  std::lock_guard<std::mutex> g(d.create_lock);
  e = d.default_pool.load(std::memory_order_relaxed);
  if (e != nullptr) return *e;
  auto owned = std::make_unique<PoolEntry>();
  owned->id = kDefaultPool;
  owned->device = d.index;
  owned->use_count = 1;  // never released
  owned->backend = make_arena_pool(d.index);
  d.default_owned = std::move(owned);
  d.default_pool.store(d.default_owned.get(), std::memory_order_release);
  return *d.default_owned;
}

sa_arena *Backend::default_arena(int dev) { return default_pool(device(dev)).backend->arena(); }

Backend::Figures Backend::figures(Device &d) {
  Figures f;
  auto add = [&](PoolEntry &e, bool is_default) {
    sa_arena *a = e.backend->arena();
    sa_stats s;
    if (a == nullptr || sa_get_stats(a, &s) != SA_OK) return;
    f.reserved += s.reserved_bytes;
    f.cached += s.cached_bytes;
    f.chunks += s.chunks_total;
    if (is_default) f.reserved_peak = s.reserved_bytes_peak;
  };
  if (PoolEntry *e = d.default_pool.load(std::memory_order_acquire)) add(*e, true);
  d.pools.each([&](PoolEntry &e) { add(e, false); });
  return f;
}

void Backend::report(const char *what, const void *p, int dev, sa_status st) {
  if (errors_.fetch_add(1, std::memory_order_relaxed) >= kReportLimit) return;
  std::fprintf(stderr, "streamarena torch: %s(%p, device %d): %s\n", what, p, dev,
               status_text(st).c_str());
}

// --- allocation ------------------------------------------------------------

sa_status Backend::attempt(Device &d, PoolEntry &pool, size_t size, sa_stream stream,
                           bool capturing, void **out, bool *over_cap) {
  *out = nullptr;
  size_t cap = d.cap.load(std::memory_order_relaxed);
  if (cap != SIZE_MAX && d.live_default.load() + d.live_private.load() +
                                 pool.backend->block_size(size) >
                             cap) {
    *over_cap = true;  // the blocks alone would pass it
    return SA_ERR_OUT_OF_MEMORY;
  }
  auto call = [&] { return pool.backend->alloc(size, stream, out); };
  sa_status st = capturing ? platform_.relaxed(call) : call();
  if (st != SA_OK || cap == SIZE_MAX || figures(d).reserved <= cap) return st;
  // This allocation took the arenas past the cap: it goes back.
  Kept k;
  k.p = *out;
  k.size = size;
  k.stream = stream;
  k.pool = &pool;
  k.device = d.index;
  pool.held++;
  *out = nullptr;
  *over_cap = true;
  release(d, std::move(k), false);
  return SA_ERR_OUT_OF_MEMORY;
}

void *Backend::alloc(int dev, size_t size, sa_stream stream) {
  if (size == 0) return nullptr;
  if (size >= kOneExaByte)
    throw Failure(Failure::Kind::kOutOfMemory,
                  "CUDA out of memory. Tried to allocate more than 1EB memory.");
  Device &d = device(dev);
  if (d.nkept.load(std::memory_order_relaxed) != 0) settle(d);
  bool routing = d.pools.routing();
  PoolEntry *routed = routing ? d.pools.route(stream) : nullptr;
  PoolEntry &pool = routed != nullptr ? *routed : default_pool(d);
  // PyTorch routes every capture it makes to a pool: with none routed, no
  // capture of PyTorch's is underway on this device.
  bool capturing = routing && platform_.capturing(stream);
  Context ctx = history_.gather(When::kState);
  bool segments = history_.wants(Action::kSegmentAlloc);
  size_t before = segments ? figures(d).reserved : 0;

  void *p = nullptr;
  bool over_cap = false;
  PoolEntry *used = &pool;
  sa_status st = attempt(d, pool, size, stream, capturing, &p, &over_cap);
  if (st == SA_ERR_OUT_OF_MEMORY) {
    d.counters.retried();
    platform_.run_free_memory_callbacks();
    size_t free_bytes = 0, total = 0;
    platform_.memory_info(dev, &free_bytes, &total);
    // A trim waits for the whole device, which a capture does not survive;
    // nor is it of use for a request larger than the device.
    if (!routing && size <= total) trim_device(d, true);
    over_cap = false;
    st = attempt(d, pool, size, stream, capturing, &p, &over_cap);
    std::vector<PoolEntry *> spare = routed == nullptr ? d.pools.oom_pools()
                                                       : std::vector<PoolEntry *>();
    for (PoolEntry *e : spare) {
      if (st == SA_ERR_OUT_OF_MEMORY) {
        bool ignored = false;
        st = attempt(d, *e, size, stream, capturing, &p, &ignored);
        if (st == SA_OK) used = e;
      }
      e->held--;
    }
  }
  if (st != SA_OK) refuse(d, *used, size, stream, st, over_cap);
  track(d, *used, p, size, stream, ctx, before);
  return p;
}

void Backend::track(Device &d, PoolEntry &pool, void *p, size_t size, sa_stream stream,
                    const Context &ctx, size_t reserved_before) {
  Allocation a;
  a.requested = size;
  a.block = pool.backend->block_size(size);
  a.device = d.index;
  a.stream = stream;
  a.large = pool.backend->large(size);
  a.pool = &pool;
  a.context = ctx;
  pool.live++;
  if (pool.id != kDefaultPool) {
    std::lock_guard<std::mutex> g(pool.live_lock);
    pool.live_set.insert(p);
    d.live_private += a.block;
  } else {
    d.live_default += a.block;
  }
  d.counters.allocated(a.large, a.block, size);
  live_.insert(p, std::move(a));

  if (history_.wants(Action::kAlloc)) {
    TraceRecord r;
    r.action = Action::kAlloc;
    r.device = d.index;
    r.addr = reinterpret_cast<uintptr_t>(p);
    r.size = size;
    r.stream = reinterpret_cast<uintptr_t>(stream);
    r.pool = pool.id;
    r.context = ctx;  // kept from When::kAlloc on (History::record)
    history_.record(std::move(r), platform_.now());
  }
  if (history_.wants(Action::kSegmentAlloc)) {
    size_t after = figures(d).reserved;
    if (after > reserved_before) {
      TraceRecord r;
      r.action = Action::kSegmentAlloc;
      r.device = d.index;
      r.addr = reinterpret_cast<uintptr_t>(p);
      r.size = after - reserved_before;
      r.stream = reinterpret_cast<uintptr_t>(stream);
      r.pool = pool.id;
      history_.record(std::move(r), platform_.now());
    }
  }
}

void Backend::alloc_at(int dev, PoolId id, void *p, size_t size, sa_stream stream) {
  Device &d = device(dev);
  PoolEntry *e = d.pools.find(id);
  if (e == nullptr || e->backend->graph_pool() == nullptr)
    throw Failure(Failure::Kind::kInvalid,
                  "streamarena: no graph pool (" + std::to_string(id.first) + ", " +
                      std::to_string(id.second) + ") on device " + std::to_string(dev) +
                      " to allocate at " + pointer(p) + " from");
  Context ctx = history_.gather(When::kState);
  bool segments = history_.wants(Action::kSegmentAlloc);
  size_t before = segments ? figures(d).reserved : 0;
  sa_status st = e->backend->alloc_at(p, size, stream);
  if (st != SA_OK)
    throw Failure(Failure::Kind::kInvalid,
                  "streamarena: cannot allocate " + std::to_string(size) + " bytes at " +
                      pointer(p) + " in pool (" + std::to_string(id.first) + ", " +
                      std::to_string(id.second) + "): " + status_text(st) +
                      " (that memory is not free in the pool for stream " + pointer(stream) +
                      ")");
  track(d, *e, p, size, stream, ctx, before);
}

void Backend::refuse(Device &d, PoolEntry &pool, size_t size, sa_stream stream, sa_status st,
                   bool over_cap) {
  std::string where = "device " + std::to_string(d.index) + ", stream " + pointer(stream);
  if (st == SA_ERR_STREAM_CAPTURING)
    throw Failure(
        Failure::Kind::kCapture,
        "streamarena: cannot allocate " + std::to_string(size) + " bytes on " + where +
            " while it is captured into a CUDA graph outside PyTorch's graph pools: the "
            "device's arena would have to ask the driver about the stream, which a capture "
            "refuses. Capture with torch.cuda.graph (or torch.compile's CUDA graphs), whose "
            "allocations go to a graph pool; docs/TORCH.md, \"CUDA graphs\"");
  if (st != SA_ERR_OUT_OF_MEMORY)
    throw Failure(Failure::Kind::kLibrary, "streamarena: allocating " + std::to_string(size) +
                                               " bytes on " + where + ": " + status_text(st));
  d.counters.out_of_memory();
  OomFacts f;
  f.device = d.index;
  f.requested = size;
  platform_.memory_info(d.index, &f.device_free, &f.device_total);
  if (over_cap) {
    f.capped = true;
    f.allowed = d.cap.load();
  }
  f.allocated = d.live_default.load();
  f.allocated_pools = d.live_private.load();
  Figures fig = figures(d);
  f.reserved = fig.reserved;
  f.cached = fig.cached;
  f.stream = stream;
  f.pool = pool.id == kDefaultPool ? "the device's arena" : "the private pool's arena";
  f.status = st;
  auto largest = [&](PoolEntry &e) {
    if (sa_arena *a = e.backend->arena()) {
      try {
        f.largest_request = read_layout(a).largest_request;
      } catch (const Failure &) {
        // The figure is left out of the message: the error it explains matters more.
      }
    }
  };
  largest(pool);

  TraceRecord r;
  r.action = Action::kOom;
  r.device = d.index;
  r.addr = f.device_free;
  r.size = size;
  r.stream = reinterpret_cast<uintptr_t>(stream);
  r.pool = pool.id;
  history_.record(std::move(r), platform_.now());

  std::vector<OomObserver> observers;
  {
    std::lock_guard<std::mutex> g(observers_lock_);
    observers = observers_;
  }
  for (const OomObserver &o : observers)
    o(d.index, size, f.capped ? f.allowed : f.device_total, f.device_free);
  throw Failure(Failure::Kind::kOutOfMemory, oom_message(f));
}

// --- free ------------------------------------------------------------------

bool Backend::owns(void *p) {
  return live_.with(p, [](Allocation &) {});
}

void Backend::free(void *p) {
  if (p == nullptr) return;
  Allocation a;
  if (!live_.take(p, &a))
    throw Failure(Failure::Kind::kInvalid,
                  "streamarena: free of " + pointer(p) +
                      ", which is no live block of this allocator (freed already, or "
                      "allocated elsewhere)");
  Device &d = device(a.device);
  PoolEntry &pool = *a.pool;
  if (pool.id != kDefaultPool) {
    std::lock_guard<std::mutex> g(pool.live_lock);
    pool.live_set.erase(p);
    d.live_private -= a.block;
  } else {
    d.live_default -= a.block;
  }
  d.counters.freed(a.large, a.block, a.requested);
  Context fctx = history_.gather(When::kAll);
  Kept k;
  k.p = p;
  k.size = a.requested;
  k.stream = a.stream;
  k.pool = &pool;
  k.records = std::move(a.pending_records);
  k.context = fctx ? fctx : a.context;
  k.device = a.device;
  if (history_.wants(Action::kFreeRequested)) {
    TraceRecord r;
    r.action = Action::kFreeRequested;
    r.device = a.device;
    r.addr = reinterpret_cast<uintptr_t>(p);
    r.size = a.requested;
    r.stream = reinterpret_cast<uintptr_t>(a.stream);
    r.pool = pool.id;
    r.context = k.context;
    history_.record(std::move(r), platform_.now());
  }
  // Held before it stops being live: the pool cannot be reaped in between.
  pool.held++;
  pool.live--;
  release(d, std::move(k), true);
}

void Backend::release(Device &d, Kept k, bool traced) {
  sa_status st = SA_OK;
  while (!k.records.empty()) {
    st = k.pool->backend->record(k.p, k.records.back().first, k.records.back().second);
    if (st == SA_ERR_STREAM_CAPTURING) break;
    if (st != SA_OK) report("record_stream", k.p, d.index, st);
    st = SA_OK;
    k.records.pop_back();
  }
  if (st == SA_OK) st = k.pool->backend->free(k.p, k.stream);
  if (st == SA_ERR_STREAM_CAPTURING) {
    // Kept until no capture is underway: its memory stays as it is.
    std::lock_guard<std::mutex> g(d.kept_lock);
    d.kept.push_back(std::move(k));
    d.nkept.store(d.kept.size(), std::memory_order_relaxed);
    return;
  }
  k.pool->held--;
  if (st != SA_OK) {
    report("free", k.p, d.index, st);
    return;
  }
  if (traced && history_.wants(Action::kFreeCompleted)) {
    TraceRecord r;
    r.action = Action::kFreeCompleted;
    r.device = d.index;
    r.addr = reinterpret_cast<uintptr_t>(k.p);
    r.size = k.size;
    r.stream = reinterpret_cast<uintptr_t>(k.stream);
    r.pool = k.pool->id;
    r.context = k.context;
    history_.record(std::move(r), platform_.now());
  }
}

void Backend::settle(Device &d) {
  if (d.pools.routing()) return;
  std::vector<Kept> todo;
  {
    std::lock_guard<std::mutex> g(d.kept_lock);
    todo.swap(d.kept);
    d.nkept.store(0, std::memory_order_relaxed);
  }
  // A free refused again (a capture PyTorch does not route, still
  // underway) is kept again.
  for (Kept &k : todo) release(d, std::move(k), true);
}

void Backend::record_stream(void *p, sa_stream stream, int stream_device) {
  PoolEntry *pool = nullptr;
  int dev = 0;
  if (!live_.with(p, [&](Allocation &a) {
        pool = a.pool;
        dev = a.device;
      }))
    return;
  sa_status st = pool->backend->record(p, stream, stream_device);
  if (st == SA_ERR_STREAM_CAPTURING) {
    live_.with(p, [&](Allocation &a) { a.pending_records.emplace_back(stream, stream_device); });
    return;
  }
  if (st != SA_OK)
    throw Failure(Failure::Kind::kLibrary, "streamarena: record_stream(" + pointer(p) +
                                               ", stream " + pointer(stream) + ", device " +
                                               std::to_string(dev) + "): " + status_text(st));
}

bool Backend::base_allocation(void *p, void **base, size_t *size) {
  return live_.with(p, [&](Allocation &a) {
    *base = p;
    *size = a.block;
  });
}

// --- caches, statistics ----------------------------------------------------

void Backend::trim_device(Device &d, bool count_sync) {
  bool segments = history_.wants(Action::kSegmentFree);
  size_t before = segments ? figures(d).reserved : 0;
  auto trim = [&](PoolEntry &e) {
    sa_status st = e.backend->trim();
    if (st != SA_OK) report("empty_cache", nullptr, d.index, st);
  };
  if (PoolEntry *e = d.default_pool.load(std::memory_order_acquire)) trim(*e);
  d.pools.each(trim);
  if (count_sync) d.counters.synchronized();
  Figures f = figures(d);
  d.counters.observe(f.reserved, f.chunks);
  if (segments && before > f.reserved) {
    TraceRecord r;
    r.action = Action::kSegmentFree;
    r.device = d.index;
    r.size = before - f.reserved;
    history_.record(std::move(r), platform_.now());
  }
}

void Backend::reap(Device &d) {
  // Destroyed here, outside the table's lock: a destroy waits for the
  // device's work.
  std::vector<std::unique_ptr<PoolEntry>> dead = d.pools.take_unused();
  dead.clear();
}

void Backend::empty_cache(PoolId id) {
  int n = device_count();
  for (int i = 0; i < n; i++) {
    Device &d = device(i);
    if (d.pools.routing()) continue;  // a capture or use_mem_pool is underway there
    settle(d);
    // Pools PyTorch let go of first: their segments go back to the device's
    // arena, which the trim then gives back to the driver.
    reap(d);
    if (id == kDefaultPool) {
      trim_device(d, true);
    } else if (PoolEntry *e = d.pools.find(id)) {
      sa_status st = e->backend->trim();
      if (st != SA_OK) report("empty_cache", nullptr, i, st);
    }
  }
}

size_t Backend::cache_info(int dev) {
  Device &d = device(dev);
  size_t best = 0;
  auto look = [&](PoolEntry &e) {
    if (sa_arena *a = e.backend->arena()) {
      ArenaLayout l = read_layout(a);
      best = std::max({best, l.largest_free_span, l.unmapped_cached});
    }
  };
  if (PoolEntry *e = d.default_pool.load(std::memory_order_acquire)) look(*e);
  d.pools.each(look);
  return best;
}

void Backend::set_memory_fraction(int dev, double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0))
    throw Failure(Failure::Kind::kInvalid, "streamarena: memory fraction " +
                                               std::to_string(fraction) +
                                               " is outside 0..1");
  Device &d = device(dev);
  size_t free_bytes = 0, total = 0;
  platform_.memory_info(dev, &free_bytes, &total);
  std::lock_guard<std::mutex> g(d.cap_lock);
  d.fraction = fraction;
  d.cap.store(static_cast<size_t>(fraction * static_cast<double>(total)));
}

double Backend::memory_fraction(int dev) {
  Device &d = device(dev);
  std::lock_guard<std::mutex> g(d.cap_lock);
  return d.fraction;
}

Counters Backend::stats(int dev) {
  Device &d = device(dev);
  Figures f = figures(d);
  d.counters.observe(f.reserved, f.chunks);
  {
    // The default arena's own peak, where it rose since the reset: a level
    // the observations may have missed between two reads.
    std::lock_guard<std::mutex> g(d.peak_lock);
    if (f.reserved_peak > d.default_peak_at_reset) d.counters.raise_reserved_peak(f.reserved_peak);
  }
  return d.counters.read();
}

void Backend::reset_peak(int dev) {
  Device &d = device(dev);
  Figures f = figures(d);
  d.counters.observe(f.reserved, f.chunks);
  d.counters.reset_peak();
  std::lock_guard<std::mutex> g(d.peak_lock);
  d.default_peak_at_reset = f.reserved_peak;
}

void Backend::reset_accumulated(int dev) { device(dev).counters.reset_accumulated(); }

// --- pools ------------------------------------------------------------------

void Backend::create_or_incref_pool(int dev, PoolId id, Factory factory) {
  device(dev).pools.create_or_incref(id, factory_for(dev, std::move(factory)));
}

void Backend::begin_allocate_to_pool(int dev, PoolId id, PoolTable::Filter filter) {
  device(dev).pools.begin_allocate(id, factory_for(dev, nullptr), std::move(filter));
}

void Backend::end_allocate_to_pool(int dev, PoolId id) {
  Device &d = device(dev);
  d.pools.end_allocate(id);
  if (d.nkept.load(std::memory_order_relaxed) != 0) settle(d);
}

void Backend::release_pool(int dev, PoolId id) {
  Device &d = device(dev);
  d.pools.release(id);
  reap(d);
}

int Backend::pool_use_count(int dev, PoolId id) { return device(dev).pools.use_count(id); }

void Backend::set_use_on_oom(int dev, PoolId id, bool on) {
  device(dev).pools.set_use_on_oom(id, on);
}

void Backend::set_no_split(int dev, PoolId id) { device(dev).pools.set_no_split(id); }

bool Backend::check_pool_live(int dev, PoolId id, const std::unordered_set<void *> &expected) {
  return device(dev).pools.check_live(id, expected);
}

bool Backend::mapped_for(int dev, int peer) {
  if (dev == peer) return true;
  if (peer < 0 || peer >= 64) return false;
  uint64_t mask = peers_set_ ? config_.peer_access : platform_.peers_of(dev);
  return mask == SA_PEER_ACCESS_ALL || ((mask >> peer) & 1u) != 0;
}

std::vector<Backend::PoolBlock> Backend::pool_blocks(int dev, PoolId id) {
  Device &d = device(dev);
  PoolEntry *e = d.pools.find(id);
  std::vector<PoolBlock> out;
  if (e == nullptr) return out;
  std::vector<void *> ptrs;
  {
    std::lock_guard<std::mutex> g(e->live_lock);
    ptrs.assign(e->live_set.begin(), e->live_set.end());
  }
  for (void *p : ptrs)
    live_.with(p, [&](Allocation &a) { out.push_back(PoolBlock{p, a.requested, a.stream}); });
  return out;
}

void Backend::attach_oom_observer(OomObserver o) {
  std::lock_guard<std::mutex> g(observers_lock_);
  observers_.push_back(std::move(o));
}

// --- snapshot ---------------------------------------------------------------

namespace {

// A graph pool's segments as sa_pool_segments reports them.
struct PoolSegment {
  uintptr_t address = 0;
  size_t size = 0;
  std::vector<sa_pool_block_info> blocks;
};

void note_pool_segment(void *base, size_t size, const sa_pool_block_info *blocks, size_t n,
                       void *user) {
  auto *out = static_cast<std::vector<PoolSegment> *>(user);
  out->push_back(PoolSegment{reinterpret_cast<uintptr_t>(base), size,
                             std::vector<sa_pool_block_info>(blocks, blocks + n)});
}

BlockState pool_block_state(sa_pool_block_state s) {
  switch (s) {
    case SA_POOL_BLOCK_LIVE:
      return BlockState::kLive;
    case SA_POOL_BLOCK_PENDING:
      return BlockState::kPendingFree;
    case SA_POOL_BLOCK_FREE:
      break;
  }
  return BlockState::kFree;
}

// Does [address, address + size) hold one of the segment starts (sorted)?
// The arena holds each segment as a live span of its own, which starts at
// most 511 bytes below it.
bool holds_a_segment(const std::vector<uintptr_t> &starts, uintptr_t address, size_t size) {
  auto it = std::lower_bound(starts.begin(), starts.end(), address);
  return it != starts.end() && *it - address < size;
}

}  // namespace

std::vector<SegmentView> Backend::segments(PoolId id) {
  std::vector<SegmentView> out;
  int n = device_count();
  for (int i = 0; i < n; i++) {
    Device &d = device(i);
    // The device's graph pools' segments, by address: shown under their
    // pools, and left out of the arena's layout, where they are live spans.
    std::map<const PoolEntry *, std::vector<PoolSegment>> by_pool;
    std::vector<uintptr_t> pool_starts;
    d.pools.each([&](PoolEntry &e) {
      sa_pool *gp = e.backend->graph_pool();
      if (gp == nullptr) return;
      std::vector<PoolSegment> &mine = by_pool[&e];
      sa_status st = sa_pool_segments(gp, note_pool_segment, &mine);
      if (st != SA_OK) report("snapshot", nullptr, i, st);
      for (const PoolSegment &ps : mine) pool_starts.push_back(ps.address);
    });
    std::sort(pool_starts.begin(), pool_starts.end());
    // A live block of PyTorch's: its request and stack into bv, counted in
    // v. A block live in the library but freed by PyTorch is a free kept
    // back during a capture, whose reuse waits (CUDA graph trees check that
    // a pool's allocated blocks are their live tensors).
    auto add_live = [&](SegmentView &v, BlockView &bv, uintptr_t address, size_t size) {
      bool ours = live_.with(reinterpret_cast<void *>(address), [&](Allocation &x) {
        bv.requested = x.requested;
        bv.context = x.context;
      });
      if (!ours) {
        bv.state = BlockState::kPendingFree;
        bv.requested = 0;
        return;
      }
      if (bv.requested == 0) bv.requested = size;
      v.allocated += size;
      v.requested += bv.requested;
    };
    auto add_block = [&](SegmentView &v, BlockView bv, uintptr_t address, size_t size) {
      if (bv.state == BlockState::kLive) add_live(v, bv, address, size);
      if (bv.state != BlockState::kFree) v.active += size;
      v.total += size;
      v.blocks.push_back(std::move(bv));
    };
    auto add = [&](PoolEntry &e) {
      if (e.backend->graph_pool() != nullptr) {
        for (const PoolSegment &ps : by_pool[&e]) {
          SegmentView v;
          v.device = i;
          v.address = ps.address;
          v.large = true;
          v.pool = e.id;
          for (const sa_pool_block_info &b : ps.blocks) {
            if (b.state == SA_POOL_BLOCK_LIVE && v.stream == 0)
              v.stream = reinterpret_cast<uintptr_t>(b.stream);
            add_block(v, BlockView{b.size, b.request, pool_block_state(b.state), nullptr},
                      reinterpret_cast<uintptr_t>(b.p), b.size);
          }
          out.push_back(std::move(v));
        }
        return;
      }
      sa_arena *a = e.backend->arena();
      if (a == nullptr) {
        // Memory of another allocator (MemPool(allocator=...)): each live
        // block is its own segment, as that allocator handed it out.
        live_.each([&](void *p, Allocation &x) {
          if (x.pool != &e) return;
          SegmentView v;
          v.device = i;
          v.address = reinterpret_cast<uintptr_t>(p);
          v.total = v.allocated = v.active = x.block;
          v.requested = x.requested;
          v.stream = reinterpret_cast<uintptr_t>(x.stream);
          v.large = x.large;
          v.pool = e.id;
          v.blocks.push_back(BlockView{x.block, x.requested, BlockState::kLive, x.context});
          out.push_back(std::move(v));
        });
        return;
      }
      // The arena's layout, cut where a graph pool's segment lies: those
      // show under their pools.
      ArenaLayout layout = read_layout(a);
      for (const LayoutSegment &s : layout.segments) {
        SegmentView v;
        auto start = [&](uintptr_t address) {
          v = SegmentView{};
          v.device = i;
          v.address = address;
          v.stream = s.stream;
          v.large = s.large;
          v.pool = e.id;
        };
        start(s.address);
        for (const LayoutBlock &b : s.blocks) {
          if (b.state == BlockState::kLive && holds_a_segment(pool_starts, b.address, b.size)) {
            if (!v.blocks.empty()) out.push_back(std::move(v));
            start(b.address + b.size);
            continue;
          }
          add_block(v, BlockView{b.size, b.request, b.state, nullptr}, b.address, b.size);
        }
        if (!v.blocks.empty()) out.push_back(std::move(v));
      }
    };
    if (id == kDefaultPool) {
      if (PoolEntry *e = d.default_pool.load(std::memory_order_acquire)) add(*e);
      d.pools.each(add);
    } else {
      d.pools.each([&](PoolEntry &e) {
        if (e.id == id) add(e);
      });
    }
  }
  return out;
}

}  // namespace sa_native
