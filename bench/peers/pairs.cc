// Alloc+free pairs: "pairs" is one thread on one stream, each size from
// 256 B to 16 MiB and two mixed tables; "threads" is T threads each on its
// own stream, all started together (4 KiB and mixed). Measured with
// team.h's calibrated repetitions.
#include <cstdio>
#include <thread>

#include "bench/peers/team.h"
#include "bench/peers/workload.h"
#include "test/util.h"

namespace peers {
namespace {

struct Case {
  const char *name;
  size_t size; // one size, or 0: the table of mixed_bits
  unsigned mixed_bits;
};

const Case pair_cases[] = {
    {"256B", 256, 0},         {"1KiB", KiB, 0},        {"4KiB", 4 * KiB, 0},
    {"16KiB", 16 * KiB, 0},   {"64KiB", 64 * KiB, 0},  {"256KiB", 256 * KiB, 0},
    {"1MiB", MiB, 0},         {"4MiB", 4 * MiB, 0},    {"16MiB", 16 * MiB, 0},
    {"mixed", 0, 20},         {"mixed-16MiB", 0, 24},
};
const Case thread_cases[] = {{"4KiB", 4 * KiB, 0}, {"mixed", 0, 20}};

// Thread i's pairs: sizes[k & mask] from k = 97 i (threads do not walk the
// table in step), each freed at once on the stream it came from.
bool pair_loop(Instance &in, void *s, const std::vector<size_t> &sizes, unsigned i,
               uint64_t pairs, std::string *err) {
  const size_t *table = sizes.data();
  const size_t mask = sizes.size() - 1;
  size_t k = 97u * i;
  for (uint64_t n = 0; n < pairs; n++) {
    size_t size = table[k++ & mask];
    void *p;
    if (in.alloc(&p, size, s) != PEER_OK) [[unlikely]] {
      *err = in.failed("alloc", size);
      return false;
    }
    if (in.free(p, size, s, s) != PEER_OK) [[unlikely]] {
      *err = in.failed("free", size);
      return false;
    }
  }
  return true;
}

std::vector<size_t> table_of(const Case &c) {
  return c.size != 0 ? std::vector<size_t>{c.size} : mixed_sizes(c.mixed_bits);
}

// One case on `threads` threads and streams; false on a failure (reported).
bool one_case(Ctx &c, Instance &in, const char *workload, const Case &k, unsigned threads,
              double base_mpairs, double *mpairs) {
  std::string err;
  Streams streams(c.dev, in);
  Sample s;
  bool ok = streams.create(threads, &err);
  std::vector<size_t> sizes = table_of(k);
  if (ok) {
    Team team(c.dev, threads, [&](unsigned i, uint64_t pairs, std::string *e) {
      return pair_loop(in, streams[i], sizes, i, pairs, e);
    });
    ok = measure(team, threads, sizes.size() == 1 ? 4 : sizes.size(), c.opt.reps, c.opt.rep_ms,
                 &s, &err);
  } // the threads end here, before their streams
  std::string finish_err;
  if (!streams.finish(&finish_err) && ok) {
    ok = false;
    err = finish_err;
  }
  if (!ok) {
    c.report.error(c.b->name, workload, std::string(k.name) + " T=" + std::to_string(threads) +
                                            ": " + err);
    return false;
  }
  *mpairs = s.mpairs;
  char row[256];
  double scaling = base_mpairs > 0 ? s.mpairs / base_mpairs : 0;
  if (threads == 1 && std::string(workload) == "pairs")
    std::snprintf(row, sizeof row, "%-20s %-11s %9.1f  [%.1f, %.1f]  %10.3f", c.b->name, k.name,
                  s.ns_med, s.ns_min, s.ns_max, s.mpairs);
  else
    std::snprintf(row, sizeof row, "%-20s %-9s %3u %12.1f %15.3f %8.2fx", c.b->name, k.name,
                  threads, s.ns_med, s.mpairs, threads == 1 ? 1.0 : scaling);
  Json j;
  j.str("backend", c.b->name)
      .str("workload", workload)
      .str("case", k.name)
      .count("size", k.size)
      .count("threads", threads)
      .num("ns_per_pair", s.ns_med)
      .num("ns_min", s.ns_min)
      .num("ns_max", s.ns_max)
      .num("mpairs_per_s", s.mpairs)
      .count("pairs", s.pairs)
      .count("reps", s.reps);
  if (base_mpairs > 0) j.num("scaling", scaling);
  c.report.result(workload, j, row);
  return true;
}

}  // namespace

bool pairs_and_threads_on(const Ctx &c, Instance &in, uint64_t pairs, std::string *err) {
  for (const Case &k : pair_cases) {
    Streams streams(c.dev, in);
    std::vector<size_t> sizes = table_of(k);
    bool ok = streams.create(1, err) && pair_loop(in, streams[0], sizes, 0, pairs, err);
    std::string e;
    if (!streams.finish(&e) && ok) {
      ok = false;
      *err = e;
    }
    if (!ok) return false;
  }
  for (const Case &k : thread_cases) {
    for (unsigned t : c.opt.threads) {
      Streams streams(c.dev, in);
      std::vector<size_t> sizes = table_of(k);
      bool ok = streams.create(t, err);
      if (ok) {
        std::vector<std::string> errs(t);
        std::vector<char> oks(t, 1);
        std::vector<std::thread> team;
        for (unsigned i = 0; i < t; i++)
          team.emplace_back([&, i] { oks[i] = pair_loop(in, streams[i], sizes, i, pairs, &errs[i]); });
        for (std::thread &th : team) th.join();
        for (unsigned i = 0; i < t && ok; i++)
          if (!oks[i]) {
            ok = false;
            *err = errs[i];
          }
      } // the threads end here, before their streams
      std::string e;
      if (!streams.finish(&e) && ok) {
        ok = false;
        *err = e;
      }
      if (!ok) return false;
    }
  }
  return true;
}

bool run_pairs(Ctx &c) {
  Instance in(c);
  std::string err;
  if (!in.create(&err)) {
    c.report.error(c.b->name, "pairs", err);
    return false;
  }
  bool ok = true;
  for (const Case &k : pair_cases) {
    double mpairs;
    ok = one_case(c, in, "pairs", k, 1, 0, &mpairs) && ok;
  }
  if (!in.destroy(&err)) {
    c.report.error(c.b->name, "pairs", err);
    ok = false;
  }
  return ok;
}

bool run_threads(Ctx &c) {
  Instance in(c);
  std::string err;
  if (!in.create(&err)) {
    c.report.error(c.b->name, "threads", err);
    return false;
  }
  bool ok = true;
  for (const Case &k : thread_cases) {
    double base = 0;
    for (unsigned t : c.opt.threads) {
      double mpairs = 0;
      if (!one_case(c, in, "threads", k, t, base, &mpairs)) {
        ok = false;
        break;
      }
      if (t == 1) base = mpairs;
    }
  }
  if (!in.destroy(&err)) {
    c.report.error(c.b->name, "threads", err);
    ok = false;
  }
  return ok;
}

}  // namespace peers
