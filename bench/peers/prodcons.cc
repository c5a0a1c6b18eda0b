// Producer/consumer: thread 0 allocates on stream A and hands each block
// through a ring of 256 to thread 1, which frees it on stream B (the block
// was last used there): the pattern of a data-loader thread feeding a
// compute thread. Sizes from the mixed table (256 B .. 1 MiB). Measured
// with team.h's calibrated repetitions; a pair is one block through.
#include <atomic>
#include <cstdio>
#include <memory>
#include <thread>

#include "bench/peers/team.h"
#include "bench/peers/workload.h"

namespace peers {
namespace {

class Ring {
 public:
  struct Item {
    void *p;
    size_t size;
  };
  // Waits while full; false if the other side failed meanwhile.
  bool push(Item it) {
    uint64_t t = tail_.load(std::memory_order_relaxed);
    for (unsigned spins = 0; t - head_.load(std::memory_order_acquire) == N; spins++)
      if (!wait(spins)) return false;
    items_[t % N] = it;
    tail_.store(t + 1, std::memory_order_release);
    return true;
  }
  bool pop(Item *it) {
    uint64_t h = head_.load(std::memory_order_relaxed);
    for (unsigned spins = 0; h == tail_.load(std::memory_order_acquire); spins++)
      if (!wait(spins)) return false;
    *it = items_[h % N];
    head_.store(h + 1, std::memory_order_release);
    return true;
  }
  void fail() { failed_.store(true, std::memory_order_release); }

 private:
  static constexpr uint64_t N = 256;
  bool wait(unsigned spins) {
    if (failed_.load(std::memory_order_acquire)) return false;
    if (spins % 64 == 63) std::this_thread::yield(); // small machines: let the other run
    return true;
  }
  Item items_[N];
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) std::atomic<uint64_t> tail_{0};
  alignas(64) std::atomic<bool> failed_{false};
};

}  // namespace

bool run_prodcons(Ctx &c) {
  std::string err;
  Instance in(c);
  Streams streams(c.dev, in);
  bool ok = in.create(&err) && streams.create(2, &err);
  Sample s;
  if (ok) {
    const std::vector<size_t> sizes = mixed_sizes(20);
    auto ring_owner = std::make_unique<Ring>(); // over-aligned: not on the stack
    Ring &ring = *ring_owner;
    void *a = streams[0], *b = streams[1];
    Team team(c.dev, 2, [&](unsigned i, uint64_t pairs, std::string *e) {
      if (i == 0) { // producer
        size_t k = 0;
        for (uint64_t n = 0; n < pairs; n++) {
          size_t size = sizes[k++ & (MIXED_N - 1)];
          void *p;
          if (in.alloc(&p, size, a) != PEER_OK) {
            *e = in.failed("alloc", size);
            ring.fail();
            return false;
          }
          if (!ring.push({p, size})) {
            *e = "the consumer failed";
            return false;
          }
        }
        return true;
      }
      for (uint64_t n = 0; n < pairs; n++) { // consumer
        Ring::Item it;
        if (!ring.pop(&it)) {
          *e = "the producer failed";
          return false;
        }
        if (in.free(it.p, it.size, b, a) != PEER_OK) {
          *e = in.failed("free", it.size);
          ring.fail();
          return false;
        }
      }
      return true;
    });
    ok = measure(team, 1, MIXED_N, c.opt.reps, c.opt.rep_ms, &s, &err);
  }
  ok = wind_up(streams, in, ok, &err);
  if (!ok) {
    c.report.error(c.b->name, "prodcons", err);
    return false;
  }
  char row[256];
  std::snprintf(row, sizeof row, "%-20s %-11s %9.1f %12.3f", c.b->name, "mixed", s.ns_med,
                s.mpairs);
  c.report.result("prodcons", Json()
                                  .str("backend", c.b->name)
                                  .str("workload", "prodcons")
                                  .str("case", "mixed")
                                  .count("threads", 2)
                                  .num("ns_per_pair", s.ns_med)
                                  .num("ns_min", s.ns_min)
                                  .num("ns_max", s.ns_max)
                                  .num("mpairs_per_s", s.mpairs)
                                  .count("pairs", s.pairs)
                                  .count("reps", s.reps),
                  row);
  return true;
}

}  // namespace peers
