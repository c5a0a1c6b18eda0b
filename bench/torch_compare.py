#!/usr/bin/env python3
"""PyTorch's CUDA caching allocator, measured the way bench/alloc_bench.c
measures streamarena: alloc+free pairs, one thread and T threads each on its
own stream, median of repetitions, the same table format.

Two ways to drive it:
  torch-cpp  c10::cuda::CUDACachingAllocator::raw_alloc_with_stream and
             raw_delete in a C++ loop on std::threads (no GIL). The loop is a
             small shared library compiled here with g++ against torch's own
             headers and libc10_cuda.so, and loaded with ctypes: it talks to
             the same allocator instance as the torch module (no ninja or
             pybind11 build needed). Skipped, with the reason, where it cannot
             be built (no g++, no CUDA headers).
  torch-py   torch.cuda.caching_allocator_alloc / caching_allocator_delete in
             a Python loop: what a Python caller pays, interpreter included.
             Python threads hold the GIL while they run bytecode, so its
             T-thread rows measure the GIL more than the allocator.

Workloads: 256B 4KiB 64KiB 1MiB mixed (the same log-uniform table as
alloc_bench, same seed), 4KiB and mixed also on T threads.

  python3 bench/torch_compare.py [--reps 7] [--rep-ms 100]
                                 [--threads 1,2,4,8,16] [--no-cpp] [--no-py]
"""
import argparse
import ctypes
import datetime
import glob
import os
import platform
import shlex
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time

MASK64 = (1 << 64) - 1
MIXED_N = 1024

WORKLOADS = [("256B", 256), ("4KiB", 4096), ("64KiB", 65536), ("1MiB", 1 << 20), ("mixed", 0)]
THREADED = ("4KiB", "mixed")


def make_mixed():
    """alloc_bench.c's make_mixed, bit for bit."""
    x = 0x9E3779B97F4A7C15
    sizes = []
    for _ in range(MIXED_N):
        x ^= (x << 13) & MASK64
        x ^= x >> 7
        x ^= (x << 17) & MASK64
        bits = 8 + x % 12
        lo = 1 << bits
        sizes.append(lo + (x >> 16) % lo + 1)
    return sizes


CPP_SOURCE = r"""
// The pair loop of torch_compare.py: raw_alloc_with_stream + raw_delete.
#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;
long long ns_of(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
}  // namespace

extern "C" {
// threads threads, thread i doing pairs alloc+free pairs on streams[i], sizes
// sizes[k & mask] from k = 97 * i. All start together (a spin barrier).
// Returns the wall time in ns, first start to last end; -1 with err set.
long long torch_pairs(int threads, const unsigned long long *streams, const size_t *sizes,
                      unsigned mask, long long pairs, char *err, size_t err_size) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<long long> t0(threads), t1(threads);
  std::vector<std::string> errors(threads);
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; i++) {
    pool.emplace_back([&, i] {
      cudaStream_t s = reinterpret_cast<cudaStream_t>(streams[i]);
      unsigned k = 97u * (unsigned)i;
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      t0[i] = ns_of(Clock::now());
      try {
        for (long long n = 0; n < pairs; n++) {
          void *p = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(sizes[k++ & mask], s);
          c10::cuda::CUDACachingAllocator::raw_delete(p);
        }
      } catch (const std::exception &e) {
        errors[i] = e.what();
      }
      t1[i] = ns_of(Clock::now());
    });
  }
  while (ready.load() < threads) {
  }
  go.store(true, std::memory_order_release);
  for (auto &t : pool) t.join();
  long long first = t0[0], last = t1[0];
  for (int i = 0; i < threads; i++) {
    if (!errors[i].empty()) {
      std::snprintf(err, err_size, "thread %d: %s", i, errors[i].c_str());
      return -1;
    }
    if (t0[i] < first) first = t0[i];
    if (t1[i] > last) last = t1[i];
  }
  return last > first ? last - first : 1;
}
}
"""


def build_cpp(torch, workdir):
    """Compile CPP_SOURCE into a shared library; (ctypes function, None) or
    (None, why not)."""
    from torch.utils import cpp_extension

    cxx = os.environ.get("CXX", "g++")
    try:
        try:
            incs = cpp_extension.include_paths(device_type="cuda")
        except TypeError:  # older torch: include_paths(cuda=True)
            incs = cpp_extension.include_paths(cuda=True)
    except Exception as e:  # no CUDA_HOME: torch's own headers, CUDA's found below
        print(f"# torch-cpp: torch did not name CUDA headers ({e}); searching", flush=True)
        incs = cpp_extension.include_paths()
    # cuda_runtime_api.h: the toolkit, or the nvidia-* wheels torch depends on.
    site = sysconfig.get_paths()["purelib"]
    extra = ["/usr/local/cuda/include"] + sorted(glob.glob(os.path.join(site, "nvidia", "*", "include")))
    incs = list(incs) + [d for d in extra if os.path.isfile(os.path.join(d, "cuda_runtime_api.h"))]
    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    src = os.path.join(workdir, "torch_pairs.cpp")
    lib = os.path.join(workdir, "torch_pairs.so")
    with open(src, "w") as f:
        f.write(CPP_SOURCE)
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    last = ""
    for std in ("c++20", "c++17"):
        cmd = ([cxx, "-O2", "-shared", "-fPIC", f"-std={std}", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", src, "-o", lib]
               + [f"-I{d}" for d in incs]
               + [f"-L{libdir}", "-lc10_cuda", "-lc10", f"-Wl,-rpath,{libdir}", "-pthread"])
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"{cxx} did not run: {e}"
        if r.returncode == 0:
            break
        last = (r.stderr or r.stdout).strip().splitlines()
        last = " | ".join(last[-3:]) if last else f"exit {r.returncode}"
    else:
        return None, f"compile failed: {last}"
    try:
        fn = ctypes.CDLL(lib).torch_pairs
    except OSError as e:
        return None, f"cannot load {lib}: {e}"
    fn.restype = ctypes.c_longlong
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_ulonglong), ctypes.POINTER(ctypes.c_size_t),
                   ctypes.c_uint, ctypes.c_longlong, ctypes.c_char_p, ctypes.c_size_t]
    return fn, None


class CppRunner:
    def __init__(self, fn, streams):
        self.fn = fn
        self.streams = (ctypes.c_ulonglong * len(streams))(*[s.cuda_stream for s in streams])

    def rep(self, threads, table, pairs):
        arr = (ctypes.c_size_t * len(table))(*table)
        err = ctypes.create_string_buffer(512)
        ns = self.fn(threads, self.streams, arr, len(table) - 1, pairs, err, len(err))
        if ns < 0:
            raise RuntimeError(err.value.decode(errors="replace"))
        return ns


class PyRunner:
    """Python threads; each its own stream. The barrier keeps starts aligned;
    the GIL still lets one thread run bytecode at a time."""

    def __init__(self, torch, streams):
        self.torch = torch
        self.streams = streams

    def rep(self, threads, table, pairs):
        torch = self.torch
        dev = torch.cuda.current_device()
        alloc, delete = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
        mask = len(table) - 1
        barrier = threading.Barrier(threads)
        t0, t1, errors = [0] * threads, [0] * threads, []

        def work(i):
            s = self.streams[i]
            k = 97 * i
            try:
                barrier.wait()
                t0[i] = time.perf_counter_ns()
                for _ in range(pairs):
                    delete(alloc(table[k & mask], dev, s))
                    k += 1
                t1[i] = time.perf_counter_ns()
            except Exception as e:  # reported below, after every thread ended
                errors.append(f"thread {i}: {e!r}")

        if threads == 1:
            work(0)
        else:
            ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        if errors:
            raise RuntimeError(errors[0])
        return max(max(t1) - min(t0), 1)


def measure(runner, threads, table, reps, rep_ms):
    """Warm up, calibrate to ~rep_ms a repetition, repeat; as alloc_bench."""
    target = rep_ms * 1_000_000
    runner.rep(threads, table, len(table) if len(table) > 1 else 4)
    pairs = 1
    while True:
        wall = runner.rep(threads, table, pairs)
        if wall >= target // 2 or pairs >= 1 << 36:
            break
        pairs = int(pairs * min(16.0, max(2.0, 1.2 * target / wall)))
    pairs = max(1, int(pairs * target / wall))
    walls = sorted(runner.rep(threads, table, pairs) for _ in range(reps))
    ns = [w / pairs for w in walls]
    med = walls[reps // 2]
    return {"ns_med": ns[reps // 2], "ns_min": ns[0], "ns_max": ns[-1],
            "mpairs": threads * pairs / med * 1e3, "pairs": pairs}


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--no-cpp", action="store_true", help="skip the C++ loop")
    ap.add_argument("--no-py", action="store_true", help="skip the Python loop")
    ap.add_argument("--workdir", default=None, help="where the C++ loop is built (default: a temp dir)")
    args = ap.parse_args()
    if not 1 <= args.reps <= 63 or args.rep_ms < 1:
        ap.error("--reps must be 1..63 and --rep-ms positive")
    thread_counts = [int(t) for t in args.threads.split(",") if t]

    try:
        import torch
    except ImportError as e:
        print(f"torch_compare: PyTorch is not importable here ({e}); it measures PyTorch's CUDA "
              "caching allocator, so run it where torch with CUDA is installed (a machine with a GPU)",
              file=sys.stderr)
        return 2

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    print("# torch_compare: PyTorch's CUDA caching allocator, alloc+free pairs")
    print(f"# date:    {date}")
    print(f"# command: {' '.join(shlex.quote(a) for a in [sys.executable] + sys.argv)}")
    print(f"# machine: {socket.gethostname()}, {cpu_model()}, {os.cpu_count()} CPUs online")
    if not torch.cuda.is_available():
        print("# gpu:     none: torch.cuda.is_available() is False", flush=True)
        return 1
    print(f"# gpu:     {torch.cuda.get_device_name(0)}; torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"# PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '(unset)')}")
    print(f"# method: median of {args.reps} repetitions of ~{args.rep_ms} ms each, after calibration",
          flush=True)

    torch.cuda.init()
    streams = [torch.cuda.Stream() for _ in range(max(thread_counts + [1]))]
    runners = []
    if not args.no_cpp:
        workdir = args.workdir or tempfile.mkdtemp(prefix="torch_compare.")
        os.makedirs(workdir, exist_ok=True)
        t = time.time()
        fn, why = build_cpp(torch, workdir)
        if fn is None:
            print(f"# torch-cpp: skipped: {why}", flush=True)
        else:
            print(f"# torch-cpp: built in {time.time() - t:.0f} s in {workdir}", flush=True)
            runners.append(("torch-cpp", CppRunner(fn, streams)))
    if not args.no_py:
        runners.append(("torch-py", PyRunner(torch, streams)))

    mixed = make_mixed()
    results = []
    failed = False
    for name, runner in runners:
        for case, size in WORKLOADS:
            table = mixed if size == 0 else [size]
            counts = [1] + ([t for t in thread_counts if t > 1] if case in THREADED else [])
            for threads in counts:
                try:
                    r = measure(runner, threads, table, args.reps, args.rep_ms)
                except Exception as e:  # one backend failing must not hide the others
                    print(f"{name:<16} {case:<10} T={threads:<3} FAILED: {e}", flush=True)
                    failed = True
                    continue
                torch.cuda.synchronize()
                r.update(backend=name, case=case, threads=threads)
                results.append(r)
                print(f"{name:<16} {case:<10} T={threads:<3} {r['ns_med']:10.1f} ns/pair "
                      f"(min {r['ns_min']:.1f}, max {r['ns_max']:.1f})  {r['mpairs']:9.3f} Mpairs/s"
                      f"  [{r['pairs']} pairs/thread x {args.reps} reps]", flush=True)

    print(f"\n{'backend':<16} {'case':<10} {'threads':>7} {'ns/pair(med)':>12} {'ns/pair [min, max]':>21} "
          f"{'Mpairs/s':>10} {'scaling':>8}")
    for r in results:
        base = next((q["mpairs"] for q in results
                     if q["backend"] == r["backend"] and q["case"] == r["case"] and q["threads"] == 1), 0)
        scaling = f"{r['mpairs'] / base:.2f}x" if base else "-"
        rng = f"[{r['ns_min']:.1f}, {r['ns_max']:.1f}]"
        print(f"{r['backend']:<16} {r['case']:<10} {r['threads']:>7} {r['ns_med']:>12.1f} {rng:>21} "
              f"{r['mpairs']:>10.3f} {scaling:>8}")
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
