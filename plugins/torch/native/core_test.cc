// The native backend's core on the host simulator: what PyTorch would see
// through its allocator interface (statistics, out-of-memory errors, the
// memory fraction, pools, captures, history, snapshots), without PyTorch.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

// Debian's cmocka.h declares its functions without C linkage for C++.
extern "C" {
#include <cmocka.h>
}

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "plugins/torch/native/core/backend.h"
#include "plugins/torch/native/core/block_size.h"
#include "plugins/torch/native/core/failure.h"
#include "plugins/torch/native/core/json.h"
#include "plugins/torch/native/core/layout.h"
#include "plugins/torch/native/core/messages.h"

using namespace sa_native;

namespace {

constexpr size_t MiB = size_t{1} << 20;

// The simulator as the core's platform: devices are the simulator's, the
// capture state its streams', memory a figure the test sets.
class HostPlatform final : public Platform {
 public:
  sa_status on_device(int device, const std::function<sa_status()> &call) override {
    int prev = sa_host_get_device();
    sa_status st = sa_host_set_device(device);
    if (st != SA_OK) return st;
    switched++;
    sa_status r = call();
    sa_host_set_device(prev);
    return r;
  }
  bool capturing(sa_stream stream) override {
    sa_host_capture_status s = SA_HOST_CAPTURE_NONE;
    return sa_host_stream_capture_status(stream, &s) == SA_OK && s != SA_HOST_CAPTURE_NONE;
  }
  sa_status relaxed(const std::function<sa_status()> &call) override {
    sa_host_capture_mode m = SA_HOST_CAPTURE_RELAXED;
    sa_host_exchange_capture_mode(&m);
    relaxed_calls++;
    sa_status r = call();
    sa_host_exchange_capture_mode(&m);
    return r;
  }
  sa_status synchronize(int) override {
    synchronized++;
    return sa_host_drain_all();
  }
  void memory_info(int, size_t *free_bytes, size_t *total_bytes) override {
    *free_bytes = free;
    *total_bytes = total;
  }
  uint64_t peers_of(int) override { return 0; }
  bool run_free_memory_callbacks() override {
    callbacks++;
    return false;
  }
  int64_t now() override { return ++clock; }

  size_t total = size_t{16} << 30, free = size_t{8} << 30;
  int switched = 0, relaxed_calls = 0, callbacks = 0, synchronized = 0;
  int64_t clock = 0;
};

struct Fixture {
  HostPlatform platform;
  std::unique_ptr<Backend> backend;
  sa_stream stream = nullptr;
};

int setup_with(void **state, const char *conf) {
  auto *f = new Fixture();
  f->backend = std::make_unique<Backend>(f->platform, conf);
  f->backend->init(1);
  if (sa_host_stream_create(SA_HOST_AUTO, &f->stream) != SA_OK) return -1;
  *state = f;
  return 0;
}

int setup(void **state) { return setup_with(state, "backend=host"); }
int setup_small(void **state) { return setup_with(state, "backend=host,max_physical=64MiB"); }

int teardown(void **state) {
  auto *f = static_cast<Fixture *>(*state);
  sa_host_drain_all();
  f->backend.reset();  // destroys the arenas: a leak shows as SA_ERR_LIVE_BLOCKS on stderr
  sa_host_stream_destroy(f->stream);
  delete f;
  return 0;
}

Fixture &fx(void **state) { return *static_cast<Fixture *>(*state); }

template <typename F>
Failure::Kind failure_of(F f, std::string *message = nullptr) {
  try {
    f();
  } catch (const Failure &e) {
    if (message != nullptr) *message = e.what();
    return e.kind();
  }
  fail_msg("no Failure thrown");
  return Failure::Kind::kLibrary;
}

bool contains(const std::string &s, const char *part) { return s.find(part) != std::string::npos; }

// --- JSON and the layout ---------------------------------------------------

void json_reads_what_the_snapshot_writes(void **) {
  Json j = Json::parse(
      "{\"a\": 12, \"p\": \"0x1f\", \"n\": \"(nil)\", \"s\": \"x\\\"y\", \"l\": [1, {\"b\": "
      "true}], \"f\": 0.25, \"z\": null}");
  assert_int_equal(j["a"].u64(), 12);
  assert_int_equal(j["p"].u64(), 0x1f);
  assert_int_equal(j["n"].u64(7), 0);
  assert_string_equal(j["s"].str().c_str(), "x\"y");
  assert_int_equal(j["l"].items().size(), 2);
  assert_true(j["l"].items()[1]["b"].boolean());
  assert_true(j["f"].number() == 0.25);
  assert_true(j["z"].is_null());
  assert_true(j["missing"]["deeper"].is_null());
  assert_int_equal(j["s"].u64(5), 5);  // another type reads as the fallback
  for (const char *bad : {"{", "[1,]", "{\"a\" 1}", "1 2", "\"open", "tru"}) {
    bool threw = false;
    try {
      Json::parse(bad);
    } catch (const std::runtime_error &) {
      threw = true;
    }
    assert_true(threw);
  }
  std::string deep(200, '[');
  bool threw = false;
  try {
    Json::parse(deep);
  } catch (const std::runtime_error &) {
    threw = true;
  }
  assert_true(threw);
}

// Every segment is covered by its blocks exactly, in order (PyTorch's
// memory_viz checks that), and a live block sits where the allocation is.
void layout_blocks_cover_every_segment(void **state) {
  Fixture &f = fx(state);
  Backend &b = *f.backend;
  std::vector<void *> ps;
  for (size_t size : {size_t{300}, size_t{4096}, size_t{3} * MiB, size_t{700} * 1024, size_t{9} * MiB})
    ps.push_back(b.alloc(0, size, f.stream));
  b.free(ps[1]);
  ArenaLayout l = read_layout(b.default_arena(0));
  size_t mapped = 0;
  std::unordered_set<uintptr_t> live;
  for (const LayoutSegment &s : l.segments) {
    uintptr_t at = s.address;
    for (const LayoutBlock &blk : s.blocks) {
      assert_int_equal(blk.address, at);
      at += blk.size;
      if (blk.state == BlockState::kLive) live.insert(blk.address);
    }
    assert_int_equal(at, s.address + s.size);
    mapped += s.size;
  }
  assert_int_equal(mapped + l.unmapped_cached, l.reserved);
  for (size_t i : {0, 2, 3, 4}) assert_true(live.count(reinterpret_cast<uintptr_t>(ps[i])) == 1);
  assert_true(live.count(reinterpret_cast<uintptr_t>(ps[1])) == 0);
  assert_true(l.large_threshold > 0);
  for (size_t i : {0, 2, 3, 4}) b.free(ps[i]);
}

// --- statistics -------------------------------------------------------------

void alloc_and_free_count_pytorch_statistics(void **state) {
  Fixture &f = fx(state);
  Backend &b = *f.backend;
  void *small = b.alloc(0, 300, f.stream);
  void *large = b.alloc(0, 5 * MiB, f.stream);
  assert_non_null(small);
  assert_non_null(large);
  assert_null(b.alloc(0, 0, f.stream));
  Counters c = b.stats(0);
  assert_int_equal(c.allocation[kAggregate].current, 2);
  assert_int_equal(c.allocation[kSmallPool].current, 1);
  assert_int_equal(c.allocation[kLargePool].current, 1);
  assert_int_equal(c.requested_bytes[kAggregate].current, 300 + 5 * MiB);
  assert_int_equal(c.allocated_bytes[kSmallPool].current, 512);  // 300 B's size class
  assert_int_equal(c.allocated_bytes[kLargePool].current, 5 * MiB);
  assert_int_equal(c.active_bytes[kAggregate].current, c.allocated_bytes[kAggregate].current);
  assert_true(c.reserved_bytes[kAggregate].current >= static_cast<int64_t>(5 * MiB));
  assert_true(c.segment[kAggregate].current > 0);
  b.free(large);
  b.free(small);
  c = b.stats(0);
  assert_int_equal(c.allocation[kAggregate].current, 0);
  assert_int_equal(c.requested_bytes[kAggregate].current, 0);
  assert_int_equal(c.requested_bytes[kAggregate].peak, 300 + 5 * MiB);
  assert_int_equal(c.requested_bytes[kAggregate].freed, 300 + 5 * MiB);
  b.reset_peak(0);
  assert_int_equal(b.stats(0).requested_bytes[kAggregate].peak, 0);
  b.reset_accumulated(0);
  c = b.stats(0);
  assert_int_equal(c.requested_bytes[kAggregate].allocated, 0);
  assert_int_equal(c.allocation[kAggregate].freed, 0);
  // empty_cache gives the arena's memory back, counted as a synchronize.
  b.empty_cache(kDefaultPool);
  c = b.stats(0);
  assert_int_equal(c.reserved_bytes[kAggregate].current, 0);
  assert_int_equal(c.num_sync_all_streams, 1);
}

void block_sizes_follow_the_size_classes(void **) {
  assert_int_equal(block_size(1, 1 * MiB), 256);
  assert_int_equal(block_size(300, 1 * MiB), 512);
  assert_int_equal(block_size(3000, 1 * MiB), 3072);
  assert_int_equal(block_size(1 * MiB + 1, 1 * MiB), 1 * MiB + 256);
  assert_false(is_large(1 * MiB, 1 * MiB));
  assert_true(is_large(1 * MiB + 1, 1 * MiB));
}

// --- out of memory -------------------------------------------------------------

void out_of_memory_raises_pytorch_message_after_a_retry(void **state) {
  Fixture &f = fx(state);
  Backend &b = *f.backend;
  std::vector<std::vector<size_t>> seen;
  b.attach_oom_observer([&](int64_t dev, size_t size, size_t total, size_t free_bytes) {
    seen.push_back({static_cast<size_t>(dev), size, total, free_bytes});
  });
  b.history().configure(true, nullptr, 100, When::kNever, true, 0);
  std::string msg;
  assert_true(failure_of([&] { b.alloc(0, 100 * MiB, f.stream); }, &msg) ==
              Failure::Kind::kOutOfMemory);
  assert_true(contains(msg, "CUDA out of memory. Tried to allocate 100.00 MiB. GPU 0 has a "
                            "total capacity of 16.00 GiB of which 8.00 GiB is free."));
  assert_true(contains(msg, "streamarena:"));
  assert_int_equal(seen.size(), 1);
  assert_int_equal(seen[0][1], 100 * MiB);
  assert_int_equal(seen[0][2], f.platform.total);
  Counters c = b.stats(0);
  assert_int_equal(c.num_ooms, 1);
  assert_int_equal(c.num_alloc_retries, 1);
  assert_int_equal(f.platform.callbacks, 1);
  std::vector<TraceRecord> t = b.history().entries(0);
  assert_int_equal(t.size(), 1);
  assert_true(t[0].action == Action::kOom);
  assert_int_equal(t[0].addr, f.platform.free);
  // Afterwards allocations work as before.
  void *p = b.alloc(0, 8 * MiB, f.stream);
  assert_non_null(p);
  b.free(p);
}

void a_request_of_an_exabyte_fails_in_pytorchs_words(void **state) {
  Fixture &f = fx(state);
  std::string msg;
  assert_true(failure_of([&] { f.backend->alloc(0, size_t{1} << 60, f.stream); }, &msg) ==
              Failure::Kind::kOutOfMemory);
  assert_string_equal(msg.c_str(), "CUDA out of memory. Tried to allocate more than 1EB memory.");
  assert_string_equal(format_size(800000000ull << 30).c_str(), "800000000.00 GiB");
  assert_string_equal(format_size(1024).c_str(), "1024 bytes");
  assert_string_equal(format_size(1536).c_str(), "1.50 KiB");
}

// PyTorch caps the bytes it holds at fraction x the device's memory.
void memory_fraction_caps_the_bytes_held(void **state) {
  Fixture &f = fx(state);
  Backend &b = *f.backend;
  f.platform.total = 64 * MiB;
  assert_true(b.memory_fraction(0) == 1.0);
  b.set_memory_fraction(0, 0.5);
  assert_true(b.memory_fraction(0) == 0.5);
  void *p = b.alloc(0, 16 * MiB, f.stream);
  std::string msg;
  assert_true(failure_of([&] { b.alloc(0, 20 * MiB, f.stream); }, &msg) ==
              Failure::Kind::kOutOfMemory);
  assert_true(contains(msg, "32.00 MiB allowed; "));
  b.free(p);
  p = b.alloc(0, 20 * MiB, f.stream);  // fits once the other block went
  assert_true(b.stats(0).reserved_bytes[kAggregate].current <= static_cast<int64_t>(32 * MiB));
  b.free(p);
  assert_true(failure_of([&] { b.set_memory_fraction(0, 1.5); }) == Failure::Kind::kInvalid);
  // A fraction of 0 allows nothing, as PyTorch's does.
  b.set_memory_fraction(0, 0.0);
  assert_true(b.memory_fraction(0) == 0.0);
  assert_true(failure_of([&] { b.alloc(0, 256, f.stream); }, &msg) ==
              Failure::Kind::kOutOfMemory);
  assert_true(contains(msg, "0 bytes allowed; "));
}

// --- frees ----------------------------------------------------------------------

void a_free_of_memory_not_ours_raises(void **state) {
  Fixture &f = fx(state);
  int x = 0;
  assert_true(failure_of([&] { f.backend->free(&x); }) == Failure::Kind::kInvalid);
  void *p = f.backend->alloc(0, 4096, f.stream);
  f.backend->free(p);
  assert_true(failure_of([&] { f.backend->free(p); }) == Failure::Kind::kInvalid);
  f.backend->free(nullptr);
  assert_true(failure_of([&] { f.backend->alloc(3, 16, f.stream); }) == Failure::Kind::kInvalid);
}

// Stream 0 is the legacy stream of the allocation's device, whatever device
// is current when PyTorch frees.
void stream_zero_runs_with_the_blocks_device_current(void **) {
  assert_int_equal(sa_host_set_device_count(2), SA_OK);
  HostPlatform platform;
  {
    Backend b(platform, "backend=host");
    b.init(2);
    assert_int_equal(sa_host_set_device(0), SA_OK);
    void *p = b.alloc(1, 2 * MiB, nullptr);
    void *q = b.alloc(1, 256, nullptr);
    assert_int_equal(sa_host_get_device(), 0);
    b.free(p);
    b.free(q);
    assert_true(platform.switched >= 4);
    assert_int_equal(b.errors(), 0);
    sa_host_drain_all();
  }
  assert_int_equal(sa_host_set_device_count(1), SA_OK);
}

// --- pools --------------------------------------------------------------------

void a_mem_pool_serves_its_thread_and_goes_when_released(void **state) {
  Fixture &f = fx(state);
  Backend &b = *f.backend;
  PoolId id{0, 7};
  b.create_or_incref_pool(0, id, nullptr);
  assert_int_equal(b.pool_use_count(0, id), 1);
  std::thread::id me = std::this_thread::get_id();
  b.begin_allocate_to_pool(0, id, [me](sa_stream) { return std::this_thread::get_id() == me; });
  assert_int_equal(b.pool_use_count(0, id), 2);
  void *in_pool = b.alloc(0, 3 * MiB, f.stream);
  void *elsewhere = nullptr;
  std::thread([&] { elsewhere = b.alloc(0, 3 * MiB, f.stream); }).join();
  b.end_allocate_to_pool(0, id);
  b.release_pool(0, id);
  assert_int_equal(b.pool_use_count(0, id), 1);
  assert_true(b.check_pool_live(0, id, {in_pool}));
  assert_false(b.check_pool_live(0, id, {in_pool, elsewhere}));
  assert_false(b.check_pool_live(0, id, {}));
  // The pool's block is in the pool's segments, the other one is not.
  bool found = false;
  for (const SegmentView &s : b.segments(id)) {
    assert_true(s.pool == id);
    for (size_t i = 0, at = s.address; i < s.blocks.size(); at += s.blocks[i++].size)
      if (at == reinterpret_cast<uintptr_t>(in_pool)) {
        found = true;
        assert_int_equal(s.blocks[i].requested, 3 * MiB);
      }
  }
  assert_true(found);
  assert_true(b.stats(0).reserved_bytes[kAggregate].current >= static_cast<int64_t>(6 * MiB));
  b.free(in_pool);
  b.free(elsewhere);
  b.release_pool(0, id);  // the last reference, and no block: its arena goes
  assert_int_equal(b.pool_use_count(0, id), 0);
  assert_true(b.segments(id).empty());
  assert_true(failure_of([&] { b.release_pool(0, id); }) == Failure::Kind::kInvalid);
  assert_true(failure_of([&] { b.end_allocate_to_pool(0, id); }) == Failure::Kind::kInvalid);
}

void a_pool_that_allows_it_serves_what_the_device_refused(void **state) {
  Fixture &f = fx(state);
  Backend &b = *f.backend;
  PoolId id{0, 9};
  // The pool gets memory first, then the default arena fills the cap.
  b.create_or_incref_pool(0, id, nullptr);
  b.set_use_on_oom(0, id, true);
  b.begin_allocate_to_pool(0, id, [](sa_stream) { return true; });
  void *warm = b.alloc(0, 24 * MiB, f.stream);
  b.end_allocate_to_pool(0, id);
  b.free(warm);  // free in the pool, whose segment the device's arena holds
  void *big = b.alloc(0, 36 * MiB, f.stream);
  // The device's arena cannot grow past 64 MiB: the pool's free memory serves.
  void *p = b.alloc(0, 20 * MiB, f.stream);
  assert_true(b.check_pool_live(0, id, {p}));
  b.free(p);
  b.free(big);
  b.release_pool(0, id);
}

// A capture into a private pool (a graph pool of the library): the
// capturing thread's and another thread's allocations (autograd's backward
// pass) are served with no driver call on the captured stream, so the
// capture stays intact; a block freed during the capture is reused later in
// it (capture order); after the capture, memory the graph baked in is
// handed to nothing outside the pool; the pool's memory goes back to the
// device's arena only when PyTorch lets go of it, after the device's work.
void a_capture_into_a_graph_pool_reuses_in_capture_order(void **state) {
  Fixture &f = fx(state);
  Backend &b = *f.backend;
  PoolId id{3, 0};
  sa_stream s = f.stream;
  b.history().configure(true, nullptr, 1000, When::kNever, true, 0);
  void *before = b.alloc(0, 2 * MiB, s);  // the device's arena exists before
  b.begin_allocate_to_pool(0, id, [&](sa_stream x) { return f.platform.capturing(x); });
  assert_int_equal(sa_host_stream_begin_capture(s, SA_HOST_CAPTURE_GLOBAL), SA_OK);
  void *a = b.alloc(0, 2 * MiB, s);
  void *small = b.alloc(0, 512, s);
  b.free(a);
  void *c = b.alloc(0, 2 * MiB, s);
  assert_ptr_equal(a, c);  // freed in the capture: reused in capture order
  void *other = nullptr;
  std::thread([&] { other = b.alloc(0, 4 * MiB, s); }).join();
  assert_non_null(other);
  b.free(before);  // a default-pool span: kept until the capture's routing ends
  assert_true(b.check_pool_live(0, id, {c, small, other}));
  assert_int_equal(sa_host_stream_end_capture(s), SA_OK);  // intact
  b.end_allocate_to_pool(0, id);
  assert_true(f.platform.relaxed_calls > 0);
  // The kept free was made when the routing ended.
  size_t completed = 0;
  for (const TraceRecord &r : b.history().entries(0))
    if (r.action == Action::kFreeCompleted && r.addr == reinterpret_cast<uintptr_t>(before))
      completed++;
  assert_int_equal(completed, 1);

  // After the capture: the default pool's allocations stay outside every
  // block the graph uses, also once the graph's tensors are freed.
  b.free(c);
  b.free(small);
  b.free(other);
  auto inside = [&](void *p, size_t n) {
    uintptr_t x = reinterpret_cast<uintptr_t>(p);
    for (auto blk : {std::make_pair(c, 2 * MiB), std::make_pair(small, size_t{512}),
                     std::make_pair(other, 4 * MiB)}) {
      uintptr_t lo = reinterpret_cast<uintptr_t>(blk.first);
      if (x < lo + blk.second && lo < x + n) return true;
    }
    return false;
  };
  std::vector<void *> later;
  for (size_t n : {size_t{512}, 2 * MiB, 4 * MiB, 2 * MiB}) {
    later.push_back(b.alloc(0, n, s));
    assert_false(inside(later.back(), n));
  }
  for (void *p : later) b.free(p);
  // PyTorch's last reference: the device's work first, then the release.
  int synced = f.platform.synchronized;
  b.release_pool(0, id);
  assert_int_equal(f.platform.synchronized, synced + 1);
  assert_int_equal(b.pool_use_count(0, id), 0);
  assert_int_equal(b.errors(), 0);
}

// A capture the backend does not route (one PyTorch did not begin): the
// device's arena refuses it with a message, never with a null pointer.
void an_unrouted_capture_is_refused_with_a_message(void **state) {
  Fixture &f = fx(state);
  Backend &b = *f.backend;
  sa_stream s = nullptr;
  assert_int_equal(sa_host_stream_create(SA_HOST_AUTO, &s), SA_OK);
  assert_int_equal(sa_host_stream_begin_capture(s, SA_HOST_CAPTURE_GLOBAL), SA_OK);
  std::string msg;
  assert_true(failure_of([&] { b.alloc(0, 4 * MiB, s); }, &msg) == Failure::Kind::kCapture);
  assert_true(contains(msg, "captured into a CUDA graph"));
  // The refusal may have invalidated the capture, as on CUDA; it ends.
  sa_status end = sa_host_stream_end_capture(s);
  assert_true(end == SA_OK || end == SA_ERR_STREAM_CAPTURING);
  assert_int_equal(sa_host_stream_destroy(s), SA_OK);
}

// --- history and snapshots ----------------------------------------------------

void history_records_allocations_with_their_stacks(void **state) {
  Fixture &f = fx(state);
  Backend &b = *f.backend;
  int stacks = 0;
  std::vector<Action> tracked;
  b.history().attach_tracker([&](const TraceRecord &r) { tracked.push_back(r.action); });
  b.history().configure(
      true,
      [&]() -> Context {
        stacks++;
        return std::make_shared<int>(stacks);
      },
      100, When::kAll, true, 0);
  assert_true(b.history().enabled());
  b.history().set_user_metadata("step 1");
  b.history().push_compile_context("graph");
  void *p = b.alloc(0, 8 * MiB, f.stream);
  b.history().pop_compile_context();
  // A snapshot shows the block with its stack and request.
  bool seen = false;
  for (const SegmentView &s : b.segments(kDefaultPool)) {
    size_t at = s.address;
    for (const BlockView &blk : s.blocks) {
      if (at == reinterpret_cast<uintptr_t>(p)) {
        seen = true;
        assert_true(blk.state == BlockState::kLive);
        assert_int_equal(blk.requested, 8 * MiB);
        assert_non_null(blk.context.get());
      }
      at += blk.size;
    }
  }
  assert_true(seen);
  b.free(p);
  std::vector<TraceRecord> t = b.history().entries(0);
  std::vector<Action> actions;
  for (const TraceRecord &r : t) actions.push_back(r.action);
  // alloc, the growth, then the free's two entries.
  assert_int_equal(actions.size(), 4);
  assert_true(actions[0] == Action::kAlloc);
  assert_true(actions[1] == Action::kSegmentAlloc);
  assert_true(actions[2] == Action::kFreeRequested);
  assert_true(actions[3] == Action::kFreeCompleted);
  assert_string_equal(t[0].compile_context.c_str(), "graph");
  assert_string_equal(t[3].compile_context.c_str(), kNoCompileContext);  // PyTorch's "N/A"
  assert_string_equal(t[0].user_metadata.c_str(), "step 1");
  assert_non_null(t[0].context.get());
  assert_non_null(t[2].context.get());  // a stack of the free (kAll)
  assert_true(t[0].time < t[3].time);
  assert_int_equal(tracked.size(), 3);  // trackers get no segment entry
  // Context "state": the live block keeps its stack, no entry carries one
  // (a free's entry would otherwise carry the block's).
  b.history().configure(
      true, [&]() -> Context { return std::make_shared<int>(++stacks); }, 100, When::kState,
      true, 0);
  void *q = b.alloc(0, 8 * MiB, f.stream);
  bool stacked = false;
  for (const SegmentView &s : b.segments(kDefaultPool)) {
    size_t at = s.address;
    for (const BlockView &blk : s.blocks) {
      if (at == reinterpret_cast<uintptr_t>(q)) stacked = blk.context != nullptr;
      at += blk.size;
    }
  }
  assert_true(stacked);
  b.free(q);
  t = b.history().entries(0);
  assert_true(t.size() >= 3);
  for (const TraceRecord &r : t) assert_null(r.context.get());
  // skip_actions, and a ring of max_entries.
  b.history().configure(true, nullptr, 2, When::kNever, true,
                        1u << static_cast<int>(Action::kFreeRequested));
  for (int i = 0; i < 3; i++) b.free(b.alloc(0, 4096, f.stream));
  t = b.history().entries(0);
  assert_int_equal(t.size(), 2);
  assert_true(t[0].action == Action::kAlloc);
  assert_true(t[1].action == Action::kFreeCompleted);
  b.history().configure(false, nullptr, 1, When::kNever, false, 0);
  assert_true(b.history().entries(0).empty());
}

void cache_info_counts_what_the_arena_holds_free(void **state) {
  Fixture &f = fx(state);
  Backend &b = *f.backend;
  void *p = b.alloc(0, 10 * MiB, f.stream);
  b.free(p);
  assert_true(b.cache_info(0) >= 10 * MiB);
  b.empty_cache(kDefaultPool);
  assert_int_equal(b.cache_info(0), 0);
}

void record_stream_refused_in_a_capture_is_made_at_the_free(void **state) {
  Fixture &f = fx(state);
  Backend &b = *f.backend;
  sa_stream other = nullptr;
  assert_int_equal(sa_host_stream_create(SA_HOST_AUTO, &other), SA_OK);
  void *p = b.alloc(0, 2 * MiB, f.stream);
  PoolId id{5, 0};
  b.begin_allocate_to_pool(0, id, [&](sa_stream x) { return f.platform.capturing(x); });
  assert_int_equal(sa_host_stream_begin_capture(other, SA_HOST_CAPTURE_GLOBAL), SA_OK);
  b.record_stream(p, other, 0);  // refused by the capture: kept with the block
  assert_int_equal(sa_host_stream_end_capture(other), SA_OK);
  b.end_allocate_to_pool(0, id);
  b.free(p);
  assert_int_equal(b.errors(), 0);
  b.release_pool(0, id);
  sa_host_drain_all();
  assert_int_equal(sa_host_stream_destroy(other), SA_OK);
  // Memory that is not ours: nothing to order.
  int x;
  b.record_stream(&x, f.stream, 0);
}


// PyTorch's test_graph_two_successive, without kernels: two captures of
// temporaries, each into a pool of its own, or sharing one (g0.pool(), a
// graph_pool_handle()); sharing saves one segment, and empty_cache gives
// every pool's memory back once PyTorch let go of it, also where the pool's
// last block was freed after its last release (then empty_cache reaps it
// before it trims).
void sharing_a_graph_pool_saves_a_segment_and_empty_cache_returns_it(void **state) {
  Fixture &f = fx(state);
  Backend &b = *f.backend;
  sa_stream s = nullptr;
  assert_int_equal(sa_host_stream_create(SA_HOST_AUTO, &s), SA_OK);
  const size_t n = 4000;  // 1000 floats
  auto reserved = [&] { return b.stats(0).reserved_bytes[kAggregate].current; };
  // func_with_temps: two clones and two sums, the clones freed; the input freed.
  auto temps = [&](void *in, sa_stream on) {
    void *c1 = b.alloc(0, n, on), *x = b.alloc(0, n, on);
    b.free(c1);
    void *c2 = b.alloc(0, n, on), *y = b.alloc(0, n, on);
    b.free(c2);
    void *r = b.alloc(0, n, on);
    b.free(x);
    b.free(y);
    b.free(in);
    return r;
  };
  auto capture = [&](PoolId id, void *in) {
    b.begin_allocate_to_pool(0, id, [&](sa_stream x) { return f.platform.capturing(x); });
    assert_int_equal(sa_host_stream_begin_capture(s, SA_HOST_CAPTURE_GLOBAL), SA_OK);
    void *cur = in != nullptr ? in : b.alloc(0, n, s);
    for (int i = 0; i < 5; i++) cur = temps(cur, s);
    assert_int_equal(sa_host_stream_end_capture(s), SA_OK);
    b.end_allocate_to_pool(0, id);
    return cur;
  };
  int64_t apart = 0;
  for (int shared = 0; shared < 2; shared++) {
    PoolId g0{40 + shared, 0}, g1 = shared ? g0 : PoolId{50, 0};
    void *a = b.alloc(0, n, nullptr);
    void *out = capture(g0, nullptr);
    out = capture(g1, out);
    void *c = b.alloc(0, n, nullptr);
    for (int i = 0; i < 6; i++) c = temps(c, nullptr);
    if (!shared) {
      apart = reserved();
    } else {
      assert_int_equal(apart - reserved(), 2 * MiB);  // one granule less
    }
    b.free(a);
    b.free(c);
    if (shared) {
      // The graphs go before their output: the pool goes at empty_cache.
      b.release_pool(0, g0);
      b.release_pool(0, g1);
      b.free(out);
    } else {
      b.free(out);
      b.release_pool(0, g0);
      b.release_pool(0, g1);
    }
    sa_host_drain_all();
    b.empty_cache(kDefaultPool);
    assert_int_equal(reserved(), 0);
  }
  assert_int_equal(b.errors(), 0);
  assert_int_equal(sa_host_stream_destroy(s), SA_OK);
}

// A snapshot shows a private pool's memory as the pool's own segments,
// free blocks included, and the arena's layout leaves those out: every
// byte once, as PyTorch's snapshot shows a private pool's segments.
void a_snapshot_shows_a_graph_pools_segments_under_the_pool(void **state) {
  Fixture &f = fx(state);
  Backend &b = *f.backend;
  PoolId id{0, 11};
  b.create_or_incref_pool(0, id, nullptr);
  std::thread::id me = std::this_thread::get_id();
  b.begin_allocate_to_pool(0, id, [me](sa_stream) { return std::this_thread::get_id() == me; });
  void *kept = b.alloc(0, 3 * MiB, f.stream);
  void *gone = b.alloc(0, 1 * MiB, f.stream);
  b.end_allocate_to_pool(0, id);
  b.free(gone);
  void *outside = b.alloc(0, 5 * MiB, f.stream);
  size_t pool_bytes = 0, pool_free = 0, seen_kept = 0, seen_outside = 0;
  for (const SegmentView &s : b.segments(kDefaultPool)) {
    size_t at = s.address, sum = 0;
    for (const BlockView &blk : s.blocks) {
      if (at == reinterpret_cast<uintptr_t>(kept)) {
        seen_kept++;
        assert_true(s.pool == id && blk.state == BlockState::kLive);
        assert_int_equal(blk.requested, 3 * MiB);
      }
      if (at == reinterpret_cast<uintptr_t>(outside)) {
        seen_outside++;
        assert_true(s.pool == kDefaultPool && blk.state == BlockState::kLive);
      }
      // No block of the arena's covers a pool's block: the pool's segment
      // is not also shown as a live span of the arena's.
      if (s.pool == kDefaultPool)
        assert_false(at < reinterpret_cast<uintptr_t>(kept) &&
                     reinterpret_cast<uintptr_t>(kept) < at + blk.size);
      if (s.pool == id) {
        pool_bytes += blk.size;
        if (blk.state == BlockState::kFree) pool_free += blk.size;
      }
      sum += blk.size;
      at += blk.size;
    }
    assert_int_equal(sum, s.total);
  }
  assert_int_equal(seen_kept, 1);
  assert_int_equal(seen_outside, 1);
  assert_true(pool_free >= 1 * MiB);
  assert_true(pool_bytes >= 4 * MiB);
  // The pool alone shows the same segments.
  size_t alone = 0;
  for (const SegmentView &s : b.segments(id)) {
    assert_true(s.pool == id);
    alone += s.total;
  }
  assert_int_equal(alone, pool_bytes);
  b.free(kept);
  b.free(outside);
  b.release_pool(0, id);
  assert_int_equal(b.errors(), 0);
}

// A checkpoint's restore: a graph pool's block freed since is allocated
// again at its address and tracked as any allocation; an address in use,
// or a pool that is not a graph pool, is refused saying why.
void alloc_at_restores_a_graph_pools_block(void **state) {
  Fixture &f = fx(state);
  Backend &b = *f.backend;
  PoolId id{0, 12};
  b.create_or_incref_pool(0, id, nullptr);
  std::thread::id me = std::this_thread::get_id();
  b.begin_allocate_to_pool(0, id, [me](sa_stream) { return std::this_thread::get_id() == me; });
  void *x = b.alloc(0, 3 * MiB, f.stream);
  void *y = b.alloc(0, 2 * MiB, f.stream);
  b.end_allocate_to_pool(0, id);
  auto blocks = b.pool_blocks(0, id);
  assert_int_equal(blocks.size(), 2);
  b.free(x);
  assert_int_equal(b.pool_blocks(0, id).size(), 1);
  b.alloc_at(0, id, x, 3 * MiB, f.stream);
  blocks = b.pool_blocks(0, id);
  assert_int_equal(blocks.size(), 2);
  bool back = false;
  for (auto &blk : blocks) back = back || (blk.p == x && blk.size == 3 * MiB && blk.stream == f.stream);
  assert_true(back);
  assert_true(failure_of([&] { b.alloc_at(0, id, y, 2 * MiB, f.stream); }) ==
              Failure::Kind::kInvalid);
  assert_true(failure_of([&] { b.alloc_at(0, kDefaultPool, x, 1 * MiB, f.stream); }) ==
              Failure::Kind::kInvalid);
  b.free(x);
  b.free(y);
  b.release_pool(0, id);
  assert_int_equal(b.errors(), 0);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(json_reads_what_the_snapshot_writes),
      cmocka_unit_test(block_sizes_follow_the_size_classes),
      cmocka_unit_test_setup_teardown(layout_blocks_cover_every_segment, setup, teardown),
      cmocka_unit_test_setup_teardown(alloc_and_free_count_pytorch_statistics, setup, teardown),
      cmocka_unit_test_setup_teardown(out_of_memory_raises_pytorch_message_after_a_retry,
                                      setup_small, teardown),
      cmocka_unit_test_setup_teardown(a_request_of_an_exabyte_fails_in_pytorchs_words, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(memory_fraction_caps_the_bytes_held, setup, teardown),
      cmocka_unit_test_setup_teardown(a_free_of_memory_not_ours_raises, setup, teardown),
      cmocka_unit_test(stream_zero_runs_with_the_blocks_device_current),
      cmocka_unit_test_setup_teardown(a_mem_pool_serves_its_thread_and_goes_when_released,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(a_pool_that_allows_it_serves_what_the_device_refused,
                                      setup_small, teardown),
      cmocka_unit_test_setup_teardown(an_unrouted_capture_is_refused_with_a_message, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_capture_into_a_graph_pool_reuses_in_capture_order, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(history_records_allocations_with_their_stacks, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(cache_info_counts_what_the_arena_holds_free, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          sharing_a_graph_pool_saves_a_segment_and_empty_cache_returns_it, setup, teardown),
      cmocka_unit_test_setup_teardown(record_stream_refused_in_a_capture_is_made_at_the_free,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(a_snapshot_shows_a_graph_pools_segments_under_the_pool,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(alloc_at_restores_a_graph_pools_block, setup, teardown),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
