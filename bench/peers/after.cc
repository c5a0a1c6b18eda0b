// Random allocations after other work: one instance replays every trace
// given, then the pairs' and threads' cases (untimed, a fixed count of pairs
// each), then RMM's random allocations up to 4 GiB run on it as the random
// workload runs them on a fresh one: what earlier work leaves behind (its
// chunks, its empty blocks, a high-water mark) is what these runs pay for.
// Reported as random results of case random-4GiB-after (run 1: the first
// run after the work), beside random-4GiB's fresh instance.
#include <dlfcn.h>

#include <string>

#include "bench/peers/workload.h"

namespace peers {

constexpr uint64_t AFTER_PAIRS = 20000; // per case and thread: the work before

// Where the driver is bench/driver_timer.c, its calls so far are printed
// as the phase that ended: the random runs' own calls apart from the work's.
static void driver_phase(const char *ended) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return;
  auto *fn = reinterpret_cast<void (*)(const char *)>(dlsym(h, "driver_timer_phase"));
  if (fn != nullptr) fn(ended);
  dlclose(h);
}

bool run_after(Ctx &c) {
  if (c.opt.random_n[1] == 0) return true; // the case is left out
  std::string err;
  Instance in(c);
  Streams streams(c.dev, in);
  bool ok = in.create(&err) && replay_traces_on(c, in, &err) &&
            pairs_and_threads_on(c, in, AFTER_PAIRS, &err) && streams.create(1, &err);
  driver_phase("the work before");
  ok = ok && random_runs(c, in, streams[0], 1, "random-4GiB-after", 0, &err);
  driver_phase("random-4GiB-after");
  ok = wind_up(streams, in, ok, &err);
  if (!ok) c.report.error(c.b->name, "after", err);
  return ok;
}

}  // namespace peers
