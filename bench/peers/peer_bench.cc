// peer_bench: streamarena and its peers on the same workloads, side by side.
//
//   peer_bench [options] [TRACE...]
//
// Backends: streamarena and cudaMallocAsync are built in; RMM's pool, arena
// and cuda_async resources and PyTorch's caching allocator come as plug-ins
// (--plugin=PATH; bench/peers/build.sh builds them, bench/peers/run.sh runs
// everything on a machine with a GPU, one process per backend). Without a
// GPU the program says so and runs streamarena on the host simulator.
//
// Workloads (--workloads, default all; trace needs TRACE files):
//   pairs     alloc+free pairs on one thread, 256 B .. 16 MiB and mixed
//   threads   pairs on T threads (--threads), each on its own stream
//   random    RMM's random allocations: N=100000 up to 1 MiB, N=1000 up to
//             4 GiB, live capped at 16000 MiB
//   prodcons  allocated on one thread and stream, freed on another
//   trace     each trace replayed on a fresh instance: us per op, peak
//             reserved over peak live; with --trace-turns, after the other
//             workloads, in rounds in which the backends take turns
//   after     one instance replays the traces, runs the pairs' and threads'
//             cases untimed, then RMM's random allocations up to 4 GiB
//             (case random-4GiB-after): what earlier work leaves behind
//
// Output: a line per result as it comes, JSON lines with --json=FILE (what
// bench/peers/plot.py reads), a table of everything last. Exit status 1 if
// anything failed. Relative paths (traces, --plugin, --json) are from where
// `bazel run` was typed.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "bench/peers/builtin.h"
#include "bench/peers/device.h"
#include "bench/peers/registry.h"
#include "bench/peers/report.h"
#include "bench/peers/workload.h"
#include "bench/user_path.h"

namespace peers {
namespace {

const char usage_text[] =
    "usage: peer_bench [options] [TRACE...]\n"
    "  --backends=a,b      backends to run (default: all; --list names them)\n"
    "  --plugin=PATH       load a plug-in's backends (repeatable)\n"
    "  --workloads=a,b     pairs,threads,random,prodcons,trace,after (default: all)\n"
    "  --threads=1,4,16    thread counts of the threads workload\n"
    "  --reps=N            repetitions of a timed case (default 5)\n"
    "  --rep-ms=MS         length of a repetition (default 50)\n"
    "  --random-n=N1,N2    allocations of the two random cases (default 100000,1000;\n"
    "                      0 leaves a case out)\n"
    "  --random-runs=N     runs of each random case on one instance (default 2)\n"
    "  --random-max-s=S    a random run stops after S seconds (default 40)\n"
    "  --random-slowest=N  after each random run, its N slowest operations and the\n"
    "                      share of the run's time they took (default 0: none)\n"
    "  --trace-round=N     tag the trace results as round N (run.sh replays every\n"
    "                      trace in rounds, the backends interleaved; plot.py takes\n"
    "                      the median)\n"
    "  --trace-turns=N     replay the traces N times, the backends taking turns in\n"
    "                      each round (after the other workloads): the machine's\n"
    "                      spells, which last longer than a replay, fall on all\n"
    "                      backends alike; results tagged with their round\n"
    "  --trace-gap-us=US   the application's work between two trace operations, a\n"
    "                      spin of US microseconds, untimed: only the allocator's\n"
    "                      calls are (default 0: back to back, the loop timed)\n"
    "  --sa-conf=SPEC      streamarena's configuration (sa_config_parse keys)\n"
    "  --json=FILE         append results as JSON lines\n"
    "  --require-gpu       fail instead of using the host simulator\n"
    "  --quick             small counts: a smoke run, not figures to report\n"
    "  --list              list the backends and exit\n"
    "  -h, --help          this text\n"
    "TRACE: streamarena, RMM or PyTorch CSV, plain or gzipped (docs/TRACE.md).\n";

struct Args {
  Options opt;
  std::vector<std::string> backends, workloads, plugins;
  std::string sa_conf, json;
  unsigned trace_turns = 0; // 0: each backend replays the traces once, in turn
  bool sa_conf_set = false, require_gpu = false, list = false;
};

std::vector<std::string> split(const std::string &s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find(',', b);
    if (e == std::string::npos) e = s.size();
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

// A path the user typed, from where `bazel run` was typed (user_path.h).
std::string users(const std::string &path) {
  std::vector<char> buf(path.size() + 4096);
  return user_path(path.c_str(), buf.data(), buf.size()) ? std::string(buf.data()) : path;
}

bool to_u64(const std::string &s, uint64_t lo, uint64_t hi, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || s[0] == '-' || errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// Options take their value after '=' or as the next argument. 0: go on;
// 1: done (help printed); 2: bad usage.
int parse(int argc, char **argv, Args *a) {
  static const char *const with_value[] = {
      "--backends", "--plugin",      "--workloads",    "--threads", "--reps", "--rep-ms",
      "--random-n", "--random-runs", "--random-max-s", "--random-slowest", "--trace-round",
      "--trace-turns", "--trace-gap-us", "--sa-conf", "--json"};
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i], name = arg, v;
    if (arg == "-h" || arg == "--help") {
      std::fputs(usage_text, stdout);
      return 1;
    }
    if (arg.rfind("--", 0) != 0) {
      a->opt.traces.push_back(arg);
      continue;
    }
    size_t eq = arg.find('=');
    bool needs = false;
    for (const char *w : with_value) needs = needs || arg.substr(0, eq) == w;
    if (needs) {
      name = arg.substr(0, eq);
      if (eq != std::string::npos) {
        v = arg.substr(eq + 1);
      } else if (i + 1 < argc) {
        v = argv[++i];
      } else {
        std::fprintf(stderr, "peer_bench: %s needs a value\n", arg.c_str());
        return 2;
      }
    }
    uint64_t n = 0;
    bool ok = true;
    if (name == "--backends") {
      a->backends = split(v);
    } else if (name == "--plugin") {
      a->plugins.push_back(users(v));
    } else if (name == "--workloads") {
      a->workloads = split(v);
    } else if (name == "--threads") {
      a->opt.threads.clear();
      for (const std::string &t : split(v)) {
        ok = ok && to_u64(t, 1, 256, &n);
        a->opt.threads.push_back(static_cast<unsigned>(n));
      }
      ok = ok && !a->opt.threads.empty();
    } else if (name == "--reps") {
      ok = to_u64(v, 1, 99, &n);
      a->opt.reps = static_cast<unsigned>(n);
    } else if (name == "--rep-ms") {
      ok = to_u64(v, 1, 60000, &n);
      a->opt.rep_ms = static_cast<unsigned>(n);
    } else if (name == "--random-n") {
      std::vector<std::string> ns = split(v);
      ok = ns.size() == 2;
      for (size_t k = 0; ok && k < 2; k++) {
        ok = to_u64(ns[k], 0, 100000000, &n);
        a->opt.random_n[k] = n;
      }
    } else if (name == "--random-runs") {
      ok = to_u64(v, 1, 100, &n);
      a->opt.random_runs = static_cast<unsigned>(n);
    } else if (name == "--random-max-s") {
      ok = to_u64(v, 1, 3600, &n);
      a->opt.random_max_s = static_cast<double>(n);
    } else if (name == "--random-slowest") {
      ok = to_u64(v, 0, 1000, &n);
      a->opt.random_slowest = static_cast<unsigned>(n);
    } else if (name == "--trace-round") {
      ok = to_u64(v, 1, 99, &n);
      a->opt.trace_round = static_cast<unsigned>(n);
    } else if (name == "--trace-turns") {
      ok = to_u64(v, 1, 99, &n);
      a->trace_turns = static_cast<unsigned>(n);
    } else if (name == "--trace-gap-us") {
      ok = to_u64(v, 0, 100000, &n);
      a->opt.trace_gap_us = static_cast<unsigned>(n);
    } else if (name == "--sa-conf") {
      a->sa_conf = v;
      a->sa_conf_set = true;
    } else if (name == "--json") {
      a->json = users(v);
    } else if (name == "--require-gpu") {
      a->require_gpu = true;
    } else if (name == "--quick") {
      a->opt.reps = 3;
      a->opt.rep_ms = 10;
      a->opt.random_n[0] = 10000;
      a->opt.random_n[1] = 100;
      a->opt.random_runs = 1;
    } else if (name == "--list") {
      a->list = true;
    } else {
      std::fprintf(stderr, "peer_bench: unknown option %s\n", arg.c_str());
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "peer_bench: bad value for %s: %s\n", name.c_str(), v.c_str());
      return 2;
    }
  }
  return 0;
}

std::string cpu_model() {
  std::FILE *f = std::fopen("/proc/cpuinfo", "r");
  std::string model = "?";
  if (f == nullptr) return model;
  char line[512];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "model name", 10) != 0) continue;
    const char *c = std::strchr(line, ':');
    if (c != nullptr) model = c + 2;
    model.erase(model.find_last_not_of("\n") + 1);
    break;
  }
  std::fclose(f);
  return model;
}

void header(const Device &dev, const Args &a, Report &report, int argc, char **argv) {
  char host[256] = "?", date[64] = "?";
  if (gethostname(host, sizeof host) != 0) std::snprintf(host, sizeof host, "?");
  host[sizeof host - 1] = '\0';
  std::time_t t = std::time(nullptr);
  std::tm tm;
  if (gmtime_r(&t, &tm) != nullptr) std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::string command;
  for (int i = 0; i < argc; i++) command += std::string(i ? " " : "") + argv[i];
  std::string cpu = cpu_model();
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  std::printf("# peer_bench\n# date:    %s\n# command: %s\n# machine: %s, %s, %ld CPUs online\n"
              "# device:  %s\n# method:  median of %u repetitions of ~%u ms each, after "
              "calibration\n",
              date, command.c_str(), host, cpu.c_str(), cpus, dev.describe().c_str(), a.opt.reps,
              a.opt.rep_ms);
  report.line(Json()
                  .str("type", "meta")
                  .str("date", date)
                  .str("command", command)
                  .str("host", host)
                  .str("cpu", cpu)
                  .count("cpus", static_cast<uint64_t>(cpus))
                  .str("device", dev.describe())
                  .flag("gpu", dev.gpu())
                  .count("reps", a.opt.reps)
                  .count("rep_ms", a.opt.rep_ms));
}

bool wanted(const std::vector<std::string> &list, const std::string &name) {
  if (list.empty()) return true;
  for (const std::string &s : list)
    if (s == name) return true;
  return false;
}

}  // namespace
}  // namespace peers

int main(int argc, char **argv) {
  using namespace peers;
  Args a;
  int p = parse(argc, argv, &a);
  if (p != 0) {
    if (p == 2) std::fputs(usage_text, stderr);
    return p == 1 ? 0 : 2;
  }
  static const char *const all_workloads[] = {"pairs", "threads", "random",
                                              "prodcons", "trace", "after"};
  for (const std::string &w : a.workloads) {
    bool known = false;
    for (const char *k : all_workloads) known = known || w == k;
    if (!known) {
      std::fprintf(stderr, "peer_bench: unknown workload %s\n%s", w.c_str(), usage_text);
      return 2;
    }
  }

  Device dev;
  std::string err;
  if (!dev.open(0, a.require_gpu, &err)) {
    std::fprintf(stderr, "peer_bench: %s\n", err.c_str());
    return 1;
  }
  if (!dev.gpu())
    std::fprintf(stderr, "peer_bench: %s: streamarena runs on the host simulator; backends "
                 "that need a GPU are skipped\n", dev.describe().c_str());
  Report report;
  if (!report.open(a.json, &err)) {
    std::fprintf(stderr, "peer_bench: --json: %s\n", err.c_str());
    return 1;
  }
  Registry reg;
  reg.add(streamarena_backend(), "built in");
  reg.add(streamarena_torch_backend(), "built in");
  reg.add(streamarena_prefill_backend(), "built in");
  reg.add(streamarena_keep_backend(), "built in");
  for (size_t i = 0; streamarena_curve_backend(i) != nullptr; i++)
    reg.add(streamarena_curve_backend(i), "built in");
  reg.add(cuda_async_backend(dev.cu()), "built in");
  for (const std::string &path : a.plugins)
    if (!reg.load(path, &err)) report.error(path, "plugin", err);
  if (a.list) {
    for (const Registry::Entry &e : reg.all())
      std::printf("%-20s %s [%s]\n", e.backend->name, e.backend->about, e.origin.c_str());
    return report.errors() ? 1 : 0;
  }
  for (const std::string &name : a.backends)
    if (reg.find(name) == nullptr) report.error(name, "backends", "no such backend (--list)");
  header(dev, a, report, argc, argv);

  if (a.trace_turns != 0 && a.opt.trace_round != 0) {
    std::fprintf(stderr, "peer_bench: --trace-turns numbers the rounds itself: no --trace-round\n");
    return 2;
  }
  // With --trace-turns, the backends that replay the traces, for the rounds at the end.
  struct Replayer {
    const peer_backend *b;
    peer_env env;
  };
  std::vector<Replayer> replayers;

  typedef bool (*workload_fn)(Ctx &);
  static const workload_fn fns[] = {run_pairs,    run_threads, run_random,
                                     run_prodcons, run_trace,   run_after};
  for (const Registry::Entry &e : reg.all()) {
    const peer_backend *b = e.backend;
    if (!wanted(a.backends, b->name)) continue;
    peer_env env = {0, dev.gpu() ? 1 : 0, nullptr};
    if (a.sa_conf_set && std::strncmp(b->name, "streamarena", 11) == 0) env.conf = a.sa_conf.c_str();
    report.line(Json()
                    .str("type", "backend")
                    .str("backend", b->name)
                    .str("about", b->about)
                    .str("reserved", b->reserved)
                    .str("origin", e.origin));
    std::printf("# backend: %s: %s\n", b->name, b->about);
    { // A backend that cannot start here is skipped (on the simulator) or failed.
      Ctx probe_ctx{dev, a.opt, report, b, env};
      Instance probe(probe_ctx);
      if (!probe.create(&err)) {
        if (dev.gpu()) report.error(b->name, "create", err);
        else report.skip(b->name, "all", err);
        continue;
      }
      if (!probe.destroy(&err)) {
        report.error(b->name, "destroy", err);
        continue;
      }
    }
    for (size_t w = 0; w < sizeof fns / sizeof fns[0]; w++) {
      if (!wanted(a.workloads, all_workloads[w])) continue;
      if (fns[w] == run_trace && a.opt.traces.empty()) {
        if (!a.workloads.empty()) report.skip(b->name, "trace", "no trace files given");
        continue;
      }
      if (fns[w] == run_trace && a.trace_turns != 0) {
        replayers.push_back({b, env});
        continue;
      }
      Ctx c{dev, a.opt, report, b, env};
      (void)fns[w](c); // failures are in the report
    }
  }
  for (unsigned round = 1; round <= a.trace_turns; round++) {
    Options o = a.opt;
    o.trace_round = round;
    for (const Replayer &r : replayers) {
      Ctx c{dev, o, report, r.b, r.env};
      (void)run_trace(c);
    }
  }
  report.print_table();
  dev.close();
  if (report.errors() != 0) {
    std::fprintf(stderr, "peer_bench: %u failures (above)\n", report.errors());
    return 1;
  }
  return 0;
}
