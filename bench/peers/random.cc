// RMM's random-allocations benchmark, on every backend: 2N steps on one
// stream; a step allocates (probability 73 %, while fewer than N were
// allocated and the live bytes stay under the cap) a size drawn uniformly
// from [1, max], or frees a live block drawn uniformly; a failed allocation
// frees instead, as RMM's loop does. Two cases as RMM runs them: N=100000
// up to 1 MiB and N=1000 up to 4 GiB, live capped at 16000 MiB. Timed: the
// loop, the frees of what is left, a stream synchronisation; reported per
// allocation. Each case gets a fresh instance and runs on it `random_runs`
// times (the first pays for growing the pool). A run that passes
// random_max_s stops and is marked truncated. The instance's construction
// is timed apart (create_seconds): an allocator that takes its memory up
// front (RMM's arena: half the device) pays there what others pay in the
// first run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <utility>

#include "bench/peers/team.h"
#include "bench/peers/workload.h"
#include "test/util.h"

namespace peers {
namespace {

constexpr size_t LIVE_CAP = 16000 * MiB;
constexpr int ALLOC_PERCENT = 73;

struct Run {
  uint64_t allocs = 0, frees = 0, failed = 0;
  size_t peak_live = 0;
  double seconds = 0;
  bool truncated = false;
};

// One operation's time, for --random-slowest.
struct Op {
  uint64_t ns;
  bool alloc;
  size_t size, live_bytes; // live before it
};

// The run's n slowest operations, and their share of its time.
void print_slowest(const char *backend, const char *name, std::vector<Op> *ops, unsigned n,
                   double seconds) {
  n = std::min<unsigned>(n, static_cast<unsigned>(ops->size()));
  std::partial_sort(ops->begin(), ops->begin() + n, ops->end(),
                    [](const Op &x, const Op &y) { return x.ns > y.ns; });
  uint64_t ns = 0;
  for (unsigned k = 0; k < n; k++) ns += (*ops)[k].ns;
  std::printf("slowest %u of %zu operations of %s %s: %.1f us, %.1f%% of the run\n", n,
              ops->size(), backend, name, static_cast<double>(ns) * 1e-3,
              seconds > 0 ? static_cast<double>(ns) * 1e-7 / seconds : 0.0);
  for (unsigned k = 0; k < n; k++) {
    const Op &o = (*ops)[k];
    std::printf("  %10.1f us  %-5s %10.1f MiB  live %.2f GiB\n", static_cast<double>(o.ns) * 1e-3,
                o.alloc ? "alloc" : "free", static_cast<double>(o.size) / MiB,
                static_cast<double>(o.live_bytes) / GiB);
  }
}

bool one_run(const Ctx &c, Instance &in, void *s, size_t n, size_t max_size, Run *r,
             std::vector<Op> *ops, std::string *err) {
  std::mt19937_64 gen(12345); // the same sequence for every backend and run
  std::uniform_int_distribution<size_t> size_d(1, max_size);
  std::uniform_int_distribution<int> op_d(0, 99);
  std::uniform_int_distribution<size_t> index_d(0, n - 1);
  std::vector<std::pair<void *, size_t>> live;
  live.reserve(n);
  size_t live_bytes = 0;
  const uint64_t t0 = now_ns();
  const uint64_t limit = static_cast<uint64_t>(c.opt.random_max_s * 1e9);
  bool ok = true;
  for (size_t i = 0; ok && i < 2 * n; i++) {
    if ((i & 63) == 0 && now_ns() - t0 > limit) {
      r->truncated = true;
      break;
    }
    size_t size = size_d(gen);
    bool do_alloc = true;
    if (!live.empty())
      do_alloc = op_d(gen) < ALLOC_PERCENT && r->allocs < n && live_bytes + size < LIVE_CAP;
    if (do_alloc) {
      void *p;
      const uint64_t a0 = ops != nullptr ? now_ns() : 0;
      int rc = in.alloc(&p, size, s);
      if (ops != nullptr) ops->push_back({now_ns() - a0, true, size, live_bytes});
      if (rc == PEER_OK) {
        live.emplace_back(p, size);
        r->allocs++;
        live_bytes += size;
        r->peak_live = std::max(r->peak_live, live_bytes);
        continue;
      }
      if (rc != PEER_OOM) {
        *err = in.failed("alloc", size);
        ok = false;
        break;
      }
      r->failed++;
    }
    if (live.empty()) continue;
    size_t k = index_d(gen) % live.size();
    std::swap(live[k], live.back());
    auto [p, psize] = live.back();
    live.pop_back();
    live_bytes -= psize;
    r->frees++;
    const uint64_t f0 = ops != nullptr ? now_ns() : 0;
    const int frc = in.free(p, psize, s, s);
    if (ops != nullptr) ops->push_back({now_ns() - f0, false, psize, live_bytes + psize});
    if (frc != PEER_OK) {
      *err = in.failed("free", psize);
      ok = false;
    }
  }
  for (auto [p, psize] : live) {
    if (in.free(p, psize, s, s) != PEER_OK && ok) {
      *err = in.failed("free", psize);
      ok = false;
    }
  }
  if (ok && !c.dev.sync(s, err)) ok = false;
  r->seconds = static_cast<double>(now_ns() - t0) * 1e-9;
  return ok;
}

constexpr size_t MAX_SIZES[2] = {MiB, 4 * GiB};

}  // namespace

bool random_runs(const Ctx &c, Instance &in, void *s, int k, const char *name, double create_s,
                 std::string *err) {
  size_t n = c.opt.random_n[k];
  bool ok = true;
  for (unsigned run = 1; ok && run <= c.opt.random_runs; run++) {
    Run r;
    std::vector<Op> ops;
    if (c.opt.random_slowest > 0) ops.reserve(2 * n);
    ok = one_run(c, in, s, n, MAX_SIZES[k], &r, c.opt.random_slowest > 0 ? &ops : nullptr, err);
    peer_stats st;
    if (ok) ok = in.stats(&st, err);
    if (!ok) break;
    double us = r.seconds * 1e6 / static_cast<double>(r.allocs ? r.allocs : 1);
    char row[256];
    std::snprintf(row, sizeof row, "%-20s %-13s %3u %8llu %7llu %10.2f %7.2f %s", c.b->name,
                  name, run, static_cast<unsigned long long>(r.allocs),
                  static_cast<unsigned long long>(r.failed), us, r.seconds,
                  r.truncated ? "yes" : "no");
    c.report.result("random", Json()
                                  .str("backend", c.b->name)
                                  .str("workload", "random")
                                  .str("case", name)
                                  .count("n", n)
                                  .count("max_size", MAX_SIZES[k])
                                  .count("live_cap", LIVE_CAP)
                                  .count("run", run)
                                  .count("allocs", r.allocs)
                                  .count("frees", r.frees)
                                  .count("failed", r.failed)
                                  .num("seconds", r.seconds)
                                  .num("create_seconds", create_s)
                                  .num("us_per_alloc", us)
                                  .flag("truncated", r.truncated)
                                  .count("peak_live", r.peak_live)
                                  .count("reserved_peak", st.reserved_peak),
                    row);
    if (c.opt.random_slowest > 0)
      print_slowest(c.b->name, name, &ops, c.opt.random_slowest, r.seconds);
  }
  return ok;
}

bool run_random(Ctx &c) {
  static const char *const names[2] = {"random-1MiB", "random-4GiB"};
  bool all_ok = true;
  for (int k = 0; k < 2; k++) {
    if (c.opt.random_n[k] == 0) continue;
    std::string err;
    Instance in(c);
    Streams streams(c.dev, in);
    const uint64_t c0 = now_ns();
    bool ok = in.create(&err);
    const double create_s = static_cast<double>(now_ns() - c0) * 1e-9;
    ok = ok && streams.create(1, &err);
    ok = ok && random_runs(c, in, streams[0], k, names[k], create_s, &err);
    ok = wind_up(streams, in, ok, &err);
    if (!ok) {
      c.report.error(c.b->name, "random", std::string(names[k]) + ": " + err);
      all_ok = false;
    }
  }
  return all_ok;
}

}  // namespace peers
