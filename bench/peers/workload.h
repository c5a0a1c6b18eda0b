// What every workload of the peer benchmark shares: the options, the context
// of one backend's run, a fresh allocator instance, the streams a user
// makes and ends, the size tables. The workloads themselves: pairs.cc
// (pairs and threads), random.cc, prodcons.cc, trace_replay.cc.
#ifndef SA_BENCH_PEERS_WORKLOAD_H
#define SA_BENCH_PEERS_WORKLOAD_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/peers/backend.h"
#include "bench/peers/device.h"
#include "bench/peers/report.h"

namespace peers {

struct Options {
  unsigned reps = 5;     // repetitions of a timed case (median reported)
  unsigned rep_ms = 50;  // a repetition's length
  std::vector<unsigned> threads{1, 4, 16};
  size_t random_n[2] = {100000, 1000}; // RMM's two random-allocation cases
  unsigned random_runs = 2;            // on one instance: cold, then warm
  double random_max_s = 40;            // a run stops (marked truncated) after this
  unsigned random_slowest = 0;         // print a run's slowest operations (0: none)
  unsigned trace_round = 0;            // tags trace results (run.sh interleaves rounds)
  unsigned trace_gap_us = 0;           // the application's work between two trace
                                       // operations (0: none, back to back)
  std::vector<std::string> traces;
};

// One backend's run.
struct Ctx {
  const Device &dev;
  const Options &opt;
  Report &report;
  const peer_backend *b;
  peer_env env;
};

// A fresh allocator; destroyed by destroy() or, failing that, at the end of
// its scope.
class Instance {
 public:
  explicit Instance(const Ctx &c) : b_(c.b), env_(c.env) {}
  ~Instance();
  Instance(const Instance &) = delete;
  Instance &operator=(const Instance &) = delete;

  bool create(std::string *err);
  bool destroy(std::string *err);
  bool stats(peer_stats *out, std::string *err);

  // The calls of the measured loops, as thin as the interface allows.
  int alloc(void **p, size_t size, void *s) { return b_->alloc(self_, p, size, s); }
  int free(void *p, size_t size, void *s, void *alloc_s) {
    return b_->free(self_, p, size, s, alloc_s);
  }
  // "what: the backend's message", after a failed call.
  std::string failed(const char *what, size_t size);
  const peer_backend *backend() const { return b_; }
  void *self() const { return self_; }

 private:
  const peer_backend *b_;
  peer_env env_;
  void *self_ = nullptr;
};

// Streams as a user makes them and, at the end, lets go of them: wait for
// their work, tell the allocator (stream_done), destroy them.
class Streams {
 public:
  Streams(const Device &dev, Instance &in) : dev_(dev), in_(in) {}
  ~Streams();
  Streams(const Streams &) = delete;
  Streams &operator=(const Streams &) = delete;

  bool create(unsigned n, std::string *err);
  bool finish(std::string *err);
  void *operator[](size_t i) const { return s_[i]; }
  size_t size() const { return s_.size(); }

 private:
  const Device &dev_;
  Instance &in_;
  std::vector<void *> s_;
};

// The end of a workload's allocator: its streams ended, then the instance
// destroyed. ok is what the workload got so far; false if it or either step
// failed, with the first failure's message in err.
bool wind_up(Streams &streams, Instance &in, bool ok, std::string *err);

// Log-uniform sizes in (256 B, 2^max_bits], unaligned, fixed seed: a
// framework's tensors. max_bits 20 gives alloc_bench's "mixed" table, bit
// for bit.
constexpr unsigned MIXED_N = 1024; // a power of two
std::vector<size_t> mixed_sizes(unsigned max_bits);

std::string mib(size_t bytes); // "123.4"

bool run_pairs(Ctx &c);    // pairs.cc
bool run_threads(Ctx &c);  // pairs.cc
bool run_random(Ctx &c);   // random.cc
bool run_prodcons(Ctx &c); // prodcons.cc
bool run_trace(Ctx &c);    // trace_replay.cc
bool run_after(Ctx &c);    // after.cc

// The pieces run_after puts together on one instance, false with a message
// in err on a failure:
// every trace of c.opt.traces replayed on in, untimed (trace_replay.cc);
bool replay_traces_on(const Ctx &c, Instance &in, std::string *err);
// the pairs' cases on one thread and the threads' cases on each count of
// c.opt.threads, pairs pairs each, untimed (pairs.cc);
bool pairs_and_threads_on(const Ctx &c, Instance &in, uint64_t pairs, std::string *err);
// the random case k (0: up to 1 MiB, 1: up to 4 GiB) run c.opt.random_runs
// times on in and stream s, each run reported as case name (random.cc).
bool random_runs(const Ctx &c, Instance &in, void *s, int k, const char *name, double create_s,
                 std::string *err);

}  // namespace peers

#endif  // SA_BENCH_PEERS_WORKLOAD_H
