// Threads and the calibrated measurement: see team.h.
#include "bench/peers/team.h"

#include <algorithm>
#include <chrono>

namespace peers {

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

Team::Team(const Device &dev, unsigned threads, Body body)
    : dev_(dev),
      n_(threads),
      body_(std::move(body)),
      start_(threads + 1),
      done_(threads + 1),
      workers_(threads) {
  for (unsigned i = 0; i < n_; i++) threads_.emplace_back([this, i] { main(i); });
}

Team::~Team() {
  quit_ = true;
  start_.arrive_and_wait();
  for (std::thread &t : threads_) t.join();
}

void Team::main(unsigned i) {
  Worker &w = workers_[i];
  if (!dev_.bind_thread(&w.err)) w.failed = true;
  for (;;) {
    start_.arrive_and_wait();
    if (quit_) return;
    w.t0 = now_ns();
    if (!w.failed && !body_(i, pairs_, &w.err)) w.failed = true;
    w.t1 = now_ns();
    done_.arrive_and_wait();
  }
}

uint64_t Team::rep(uint64_t pairs, std::string *err) {
  pairs_ = pairs;
  start_.arrive_and_wait();
  done_.arrive_and_wait();
  uint64_t t0 = UINT64_MAX, t1 = 0;
  for (unsigned i = 0; i < n_; i++) {
    const Worker &w = workers_[i];
    if (w.failed) {
      *err = "thread " + std::to_string(i) + ": " + w.err;
      return 0;
    }
    t0 = std::min(t0, w.t0);
    t1 = std::max(t1, w.t1);
  }
  return t1 > t0 ? t1 - t0 : 1;
}

bool measure(Team &team, unsigned parallel, uint64_t warm, unsigned reps, unsigned rep_ms,
             Sample *out, std::string *err) {
  if (team.rep(warm, err) == 0) return false;
  const uint64_t target = static_cast<uint64_t>(rep_ms) * 1000000u;
  uint64_t pairs = 1, wall = 0;
  for (;;) {
    wall = team.rep(pairs, err);
    if (wall == 0) return false;
    if (wall >= target / 2 || pairs >= (uint64_t{1} << 36)) break;
    double grow = 1.2 * static_cast<double>(target) / static_cast<double>(wall);
    pairs = static_cast<uint64_t>(static_cast<double>(pairs) * std::clamp(grow, 2.0, 16.0));
  }
  pairs = std::max<uint64_t>(1, static_cast<uint64_t>(static_cast<double>(pairs) *
                                                       static_cast<double>(target) /
                                                       static_cast<double>(wall)));
  std::vector<double> walls;
  for (unsigned i = 0; i < reps; i++) {
    wall = team.rep(pairs, err);
    if (wall == 0) return false;
    walls.push_back(static_cast<double>(wall));
  }
  std::sort(walls.begin(), walls.end());
  double p = static_cast<double>(pairs);
  // The median: with an even count, the mean of the two middle ones.
  double med = reps % 2 ? walls[reps / 2] : (walls[reps / 2 - 1] + walls[reps / 2]) / 2;
  out->ns_med = med / p;
  out->ns_min = walls.front() / p;
  out->ns_max = walls.back() / p;
  out->mpairs = parallel * p / med * 1e3;
  out->pairs = pairs;
  out->reps = reps;
  return true;
}

}  // namespace peers
