// Threads that run the repetitions of a workload together, and the
// calibrated measurement every timed workload uses (alloc_bench's method:
// warm up, grow the pair count until a repetition lasts about rep_ms, then
// repeat and take the median).
#ifndef SA_BENCH_PEERS_TEAM_H
#define SA_BENCH_PEERS_TEAM_H

#include <barrier>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "bench/peers/device.h"

namespace peers {

class Team {
 public:
  // Thread i's part of one repetition of `pairs` pairs; false with err set
  // on a failure.
  using Body = std::function<bool(unsigned i, uint64_t pairs, std::string *err)>;

  Team(const Device &dev, unsigned threads, Body body);
  ~Team();  // stops the threads
  Team(const Team &) = delete;
  Team &operator=(const Team &) = delete;

  unsigned size() const { return n_; }
  // One repetition by every thread; its wall time in ns from the first
  // thread's start to the last one's end; 0 with err set on a failure.
  uint64_t rep(uint64_t pairs, std::string *err);

 private:
  struct Worker {
    uint64_t t0 = 0, t1 = 0;
    bool failed = false;
    std::string err;
  };
  void main(unsigned i);

  const Device &dev_;
  unsigned n_;
  Body body_;
  uint64_t pairs_ = 0;
  bool quit_ = false;
  std::barrier<> start_, done_;
  std::vector<Worker> workers_;
  std::vector<std::thread> threads_;
};

struct Sample {
  double ns_med = 0, ns_min = 0, ns_max = 0; // per pair, per thread
  double mpairs = 0;                         // all threads, median repetition
  uint64_t pairs = 0;                        // per thread per repetition
  unsigned reps = 0;
};

// parallel: how many threads do independent pairs (Mpairs/s counts
// parallel x pairs per repetition); warm: the pairs of the warm-up.
bool measure(Team &team, unsigned parallel, uint64_t warm, unsigned reps, unsigned rep_ms,
             Sample *out, std::string *err);

uint64_t now_ns();

}  // namespace peers

#endif  // SA_BENCH_PEERS_TEAM_H
