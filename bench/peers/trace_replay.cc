// Trace replay: every trace (bench/trace_read.h reads streamarena's, RMM's
// and PyTorch's CSV, gzipped or not) on a fresh instance, since a reserved
// peak is a lifetime peak. One thread in file order; each stream of the
// trace becomes a stream of the device; a free goes to the stream the
// trace frees on (with the allocation's stream given too, for allocators
// that free on that one and record the other). Timed: the operations only;
// the instance's construction is timed apart (create_seconds), as in
// random.cc: an allocator that takes its memory up front (RMM's arena: half
// the device) pays there what the others pay inside the replay.
// With --trace-gap-us, each operation comes after that much spinning (the
// application's work between two calls: kernel launches, its own code),
// and only the calls are timed: what reaches the allocating thread where
// an allocator can work meanwhile (streamarena's background_growth).
// Reported: us per operation made (the frees of allocations that ran out of
// memory are not made, nor counted), peak live (the trace's highest sum of
// requested sizes) and the allocator's own peak reserved, their ratio, and
// allocations that ran out of memory (skipped, with their frees).
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench/peers/team.h"
#include "bench/peers/workload.h"
#include "bench/trace_read.h"

namespace peers {
namespace {

const char *base_name(const std::string &path) {
  const char *s = std::strrchr(path.c_str(), '/');
  return s != nullptr ? s + 1 : path.c_str();
}

struct Replay {
  double seconds = 0;
  double create_seconds = 0; // the instance's construction, not in seconds
  uint64_t ooms = 0;
  uint64_t calls = 0; // ops the allocator got: not the frees of failed allocations
  peer_stats stats{};
};

// t on in, on streams of its own, ended after.
bool replay_on(const Ctx &c, Instance &in, const trace &t, Replay *r, std::string *err) {
  Streams streams(c.dev, in);
  if (!streams.create(static_cast<unsigned>(t.nstreams), err)) return false;
  std::vector<void *> ptrs(t.nslots, nullptr);
  std::vector<uint16_t> alloc_stream(t.nslots, 0);
  std::vector<size_t> size_of(t.nslots, 0); // RMM's frees need the size
  bool ok = true;
  const uint64_t gap_ns = static_cast<uint64_t>(c.opt.trace_gap_us) * 1000;
  uint64_t in_calls = 0, call0 = 0;
  // With a gap: spin before a call, then time the call alone.
  auto call_start = [&] {
    if (gap_ns == 0) return;
    const uint64_t until = now_ns() + gap_ns;
    while (now_ns() < until) {
    }
    call0 = now_ns();
  };
  auto call_end = [&] {
    if (gap_ns != 0) in_calls += now_ns() - call0;
  };
  const uint64_t t0 = now_ns();
  for (size_t i = 0; i < t.nops; i++) {
    const trace_op &op = t.ops[i];
    void *s = streams[op.stream];
    if (op.is_free) {
      void *&p = ptrs[op.slot];
      if (p == nullptr) continue; // its allocation ran out of memory
      r->calls++;
      call_start();
      const int frc = in.free(p, op.size, s, streams[alloc_stream[op.slot]]);
      call_end();
      if (frc != PEER_OK) {
        *err = in.failed("free", op.size);
        ok = false;
        break;
      }
      p = nullptr;
      continue;
    }
    r->calls++;
    call_start();
    int rc = in.alloc(&ptrs[op.slot], op.size, s);
    call_end();
    if (rc == PEER_OOM) {
      ptrs[op.slot] = nullptr;
      r->ooms++;
    } else if (rc != PEER_OK) {
      *err = in.failed("alloc", op.size);
      ok = false;
      break;
    }
    alloc_stream[op.slot] = op.stream;
    size_of[op.slot] = op.size;
  }
  r->seconds = static_cast<double>(gap_ns != 0 ? in_calls : now_ns() - t0) * 1e-9;
  for (size_t slot = 0; slot < t.nslots; slot++) { // what the trace never freed
    void *s = streams[alloc_stream[slot]];
    if (ptrs[slot] != nullptr && in.free(ptrs[slot], size_of[slot], s, s) != PEER_OK && ok) {
      *err = in.failed("free", size_of[slot]);
      ok = false;
    }
  }
  // The figures before the streams end: a user's program ends them last.
  if (ok) ok = in.stats(&r->stats, err);
  std::string e;
  if (!streams.finish(&e) && ok) {
    ok = false;
    *err = e;
  }
  return ok;
}

// t on a fresh instance, destroyed after.
bool replay(const Ctx &c, const trace &t, Replay *r, std::string *err) {
  Instance in(c);
  const uint64_t c0 = now_ns();
  if (!in.create(err)) return false;
  r->create_seconds = static_cast<double>(now_ns() - c0) * 1e-9;
  bool ok = replay_on(c, in, t, r, err);
  std::string e;
  if (!in.destroy(&e) && ok) {
    ok = false;
    *err = e;
  }
  return ok;
}

}  // namespace

bool replay_traces_on(const Ctx &c, Instance &in, std::string *err) {
  for (const std::string &path : c.opt.traces) {
    trace t;
    char why[1024];
    if (trace_load(path.c_str(), &t, why, sizeof why) != SA_OK) {
      *err = why;
      return false;
    }
    Replay r;
    bool ok = replay_on(c, in, t, &r, err);
    trace_free(&t);
    if (!ok) return false;
  }
  return true;
}

bool run_trace(Ctx &c) {
  bool all_ok = true;
  for (const std::string &path : c.opt.traces) {
    trace t;
    char why[1024];
    if (trace_load(path.c_str(), &t, why, sizeof why) != SA_OK) {
      c.report.error(c.b->name, "trace", why);
      all_ok = false;
      continue;
    }
    const char *name = base_name(path);
    Replay r;
    std::string err;
    if (t.nops == 0) {
      c.report.error(c.b->name, "trace", std::string(name) + ": no operations");
      all_ok = false;
    } else if (!replay(c, t, &r, &err)) {
      c.report.error(c.b->name, "trace", std::string(name) + ": " + err);
      all_ok = false;
    } else {
      // Per call made: a backend that ran out of memory skipped those frees.
      double us = r.seconds * 1e6 / static_cast<double>(r.calls ? r.calls : 1);
      double ratio = static_cast<double>(r.stats.reserved_peak) / static_cast<double>(t.peak_live);
      char row[256];
      std::snprintf(row, sizeof row, "%-20s %-22s %8zu %9.3f %9s %13s %6.3f %5llu", c.b->name,
                    name, t.nops, us, mib(t.peak_live).c_str(),
                    mib(r.stats.reserved_peak).c_str(), ratio,
                    static_cast<unsigned long long>(r.ooms));
      Json j;
      j.str("backend", c.b->name)
          .str("workload", "trace")
          .str("case", name)
          .str("format", t.format)
          .count("ops", t.nops)
          .count("streams", t.nstreams)
          .num("seconds", r.seconds)
          .num("create_seconds", r.create_seconds)
          .num("us_per_op", us)
          .count("peak_live", t.peak_live)
          .count("reserved_peak", r.stats.reserved_peak)
          .num("ratio", ratio)
          .count("ooms", r.ooms);
      if (c.opt.trace_round != 0) j.count("round", c.opt.trace_round);
      if (c.opt.trace_gap_us != 0) j.count("gap_us", c.opt.trace_gap_us);
      c.report.result("trace", j, row);
    }
    trace_free(&t);
  }
  return all_ok;
}

}  // namespace peers
