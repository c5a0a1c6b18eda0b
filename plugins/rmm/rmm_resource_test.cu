// streamarena::rmm_resource through the checks RMM applies to its own
// resources (its cpp/tests/mr tests: allocations on the default stream and
// on streams, zero bytes, alignment, out of memory as rmm::out_of_memory,
// random and mixed allocation, the per-device resource, threads), plus the
// stream order a deallocation keeps. Needs a GPU, RMM 26.x (librmm.so and
// its headers) and streamarena (libstreamarena_python.so): built by
// tools/gpu-ecosystem.sh's staging here, or on the GPU machine by its
// runner. Prints one line per check and "N passed, M failed" last.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <rmm/aligned.hpp>
#include <rmm/cuda_stream.hpp>
#include <rmm/device_buffer.hpp>
#include <rmm/error.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/per_device_resource.hpp>
#include <rmm/mr/statistics_resource_adaptor.hpp>
#include <rmm/resource_ref.hpp>

#include <streamarena/rmm_resource.hpp>

namespace {

constexpr std::size_t KiB = 1024, MiB = KiB * KiB, GiB = MiB * KiB, PiB = GiB * MiB;
constexpr std::size_t ALIGN = rmm::CUDA_ALLOCATION_ALIGNMENT;

int passed = 0, failed = 0;
std::string failure; // the first failed expectation of the running check

#define EXPECT(cond)                                                                  \
  do {                                                                                \
    if (!(cond) && failure.empty())                                                   \
      failure = std::string(__FILE__ ":") + std::to_string(__LINE__) + ": " #cond; \
  } while (0)

void check(const char *name, const std::function<void()> &body) {
  failure.clear();
  try {
    body();
  } catch (const std::exception &e) {
    if (failure.empty()) failure = std::string("unexpected exception: ") + e.what();
  }
  if (failure.empty()) {
    passed++;
    std::printf("[ ok ] %s\n", name);
  } else {
    failed++;
    std::printf("[FAIL] %s: %s\n", name, failure.c_str());
  }
  std::fflush(stdout);
}

// The stream of an rmm::cuda_stream, as RMM's resources take it.
cuda::stream_ref sr(const rmm::cuda_stream &s) { return cuda::stream_ref{s.value()}; }

// The legacy default stream.
const cuda::stream_ref legacy{cudaStream_t{nullptr}};

bool aligned(void *p, std::size_t a = ALIGN) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

bool device_memory(void *p) {
  cudaPointerAttributes attr{};
  return cudaPointerGetAttributes(&attr, p) == cudaSuccess && attr.type == cudaMemoryTypeDevice;
}

// RMM's test_various_allocations and its async form, on one stream.
void various(rmm::device_async_resource_ref ref, cuda::stream_ref s, bool sync) {
  auto alloc = [&](std::size_t n) {
    return sync ? ref.allocate_sync(n, ALIGN) : ref.allocate(s, n, ALIGN);
  };
  auto dealloc = [&](void *p, std::size_t n) {
    if (sync)
      ref.deallocate_sync(p, n, ALIGN);
    else
      ref.deallocate(s, p, n, ALIGN);
  };
  void *zero = alloc(0);
  EXPECT(zero == nullptr);
  dealloc(zero, 0);
  for (std::size_t n : {std::size_t{4}, KiB, MiB, GiB}) {
    void *p = alloc(n);
    if (!sync) EXPECT(cudaStreamSynchronize(s.get()) == cudaSuccess);
    EXPECT(p != nullptr);
    EXPECT(aligned(p));
    EXPECT(device_memory(p));
    dealloc(p, n);
  }
  void *p = nullptr;
  bool oom = false;
  try {
    p = alloc(PiB);
  } catch (const rmm::out_of_memory &e) {
    oom = std::string(e.what()).find("out_of_memory") != std::string::npos;
  }
  EXPECT(oom);
  EXPECT(p == nullptr);
}

// RMM's test_random_allocations (and async): 100 up to 5 MiB, all held,
// then freed.
void random_allocations(rmm::device_async_resource_ref ref, cuda::stream_ref s, bool sync) {
  std::default_random_engine gen;
  std::uniform_int_distribution<std::size_t> size(1, 5 * MiB);
  std::vector<std::pair<void *, std::size_t>> held;
  for (int i = 0; i < 100; i++) {
    std::size_t n = size(gen);
    void *p = sync ? ref.allocate_sync(n, ALIGN) : ref.allocate(s, n, ALIGN);
    EXPECT(p != nullptr && aligned(p));
    held.emplace_back(p, n);
  }
  for (auto [p, n] : held) {
    if (sync)
      ref.deallocate_sync(p, n, ALIGN);
    else
      ref.deallocate(s, p, n, ALIGN);
  }
}

// RMM's test_mixed_random_allocation_free: 53 % allocations, 200 steps.
void mixed(rmm::device_async_resource_ref ref, cuda::stream_ref s) {
  std::default_random_engine gen;
  std::uniform_int_distribution<std::size_t> size(1, 5 * MiB);
  std::uniform_int_distribution<int> op(0, 99);
  std::vector<std::pair<void *, std::size_t>> held;
  std::size_t made = 0;
  for (int i = 0; i < 200; i++) {
    bool alloc = held.empty() || (op(gen) < 53 && made < 100);
    if (alloc) {
      std::size_t n = size(gen);
      void *p = ref.allocate(s, n, ALIGN);
      EXPECT(p != nullptr && aligned(p));
      held.emplace_back(p, n);
      made++;
    } else {
      std::size_t k = static_cast<std::size_t>(op(gen)) % held.size();
      ref.deallocate(s, held[k].first, held[k].second, ALIGN);
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  for (auto [p, n] : held) ref.deallocate(s, p, n, ALIGN);
}

__global__ void spin(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

__global__ void count_not(const std::uint32_t *p, std::size_t n, std::uint32_t want,
                          unsigned long long *bad) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (p[i] != want) atomicAdd(bad, 1ull);
}

}  // namespace

int main() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    std::printf("no usable CUDA device\nrmm_resource_test: 0 passed, 1 failed\n");
    return 1;
  }
  streamarena::rmm_resource mr;
  rmm::device_async_resource_ref ref{mr};
  rmm::cuda_stream stream;

  check("concept: the resource is a CCCL device resource, async and sync", [&] {
    static_assert(cuda::mr::resource_with<streamarena::rmm_resource, cuda::mr::device_accessible>);
    static_assert(
        cuda::mr::synchronous_resource_with<streamarena::rmm_resource, cuda::mr::device_accessible>);
  });
  check("SelfEquality; copies share the arena, another arena differs", [&] {
    streamarena::rmm_resource copy = mr;
    EXPECT(ref == ref);
    EXPECT(copy == mr);
    auto own = streamarena::rmm_resource::with_config("max_physical=64MiB");
    EXPECT(own != mr);
  });
  check("SetCurrentDeviceResourceRef: allocations through the current resource", [&] {
    rmm::mr::set_current_device_resource(rmm::mr::cuda_memory_resource{});
    rmm::mr::set_current_device_resource(mr);
    auto current = rmm::mr::get_current_device_resource_ref();
    void *p = current.allocate_sync(MiB, ALIGN);
    EXPECT(p != nullptr && aligned(p) && device_memory(p));
    current.deallocate_sync(p, MiB, ALIGN);
    rmm::device_buffer b(3 * MiB, sr(stream)); // the per-device resource, as cuDF allocates
    EXPECT(b.data() != nullptr && b.size() == 3 * MiB && device_memory(b.data()));
    EXPECT(cudaMemsetAsync(b.data(), 7, b.size(), stream.value()) == cudaSuccess);
    EXPECT(cudaStreamSynchronize(stream.value()) == cudaSuccess);
    rmm::mr::reset_current_device_resource();
  });
  check("AllocationsAreDifferent (sync)", [&] {
    void *a = ref.allocate_sync(8, ALIGN), *b = ref.allocate_sync(8, ALIGN);
    EXPECT(a != b);
    ref.deallocate_sync(a, 8, ALIGN);
    ref.deallocate_sync(b, 8, ALIGN);
  });
  for (auto [name, s] : {std::pair{"default stream", legacy},
                         std::pair{"a stream", sr(stream)}}) {
    check((std::string("AsyncAllocationsAreDifferent, ") + name).c_str(), [&] {
      void *a = ref.allocate(s, 8, ALIGN), *b = ref.allocate(s, 8, ALIGN);
      EXPECT(a != b);
      ref.deallocate(s, a, 8, ALIGN);
      ref.deallocate(s, b, 8, ALIGN);
    });
  }
  check("AllocateZero/Various (sync): 0 B is nullptr, 1 PiB is rmm::out_of_memory", [&] {
    various(ref, legacy, true);
  });
  check("AllocateZero/Various (async, a stream)", [&] { various(ref, sr(stream), false); });
  check("alignment: powers of two up to 256 are served, aligned", [&] {
    for (std::size_t a = 1; a <= 256; a *= 2) {
      void *p = ref.allocate(sr(stream), 1000, a);
      EXPECT(aligned(p, a));
      ref.deallocate(sr(stream), p, 1000, a);
    }
  });
  check("alignment: 512 and 3 are rmm::bad_alloc, not out_of_memory", [&] {
    for (std::size_t a : {std::size_t{512}, std::size_t{3}}) {
      bool bad = false, oom = false;
      try {
        (void)ref.allocate(sr(stream), 1000, a);
      } catch (const rmm::out_of_memory &) {
        oom = true;
      } catch (const rmm::bad_alloc &) {
        bad = true;
      }
      EXPECT(bad && !oom);
    }
  });
  check("RandomAllocations (sync)", [&] { random_allocations(ref, legacy, true); });
  check("RandomAllocations (async, a stream)", [&] {
    random_allocations(ref, sr(stream), false);
  });
  check("MixedRandomAllocationFree (async, a stream)", [&] { mixed(ref, sr(stream)); });
  check("an rmm adaptor over it: statistics_resource_adaptor counts", [&] {
    rmm::mr::statistics_resource_adaptor stats{mr};
    void *p = stats.allocate(sr(stream), 5 * MiB, ALIGN);
    EXPECT(stats.get_bytes_counter().value == static_cast<std::int64_t>(5 * MiB));
    stats.deallocate(sr(stream), p, 5 * MiB, ALIGN);
    EXPECT(stats.get_bytes_counter().value == 0);
  });
  check("out of memory under a cap: rmm::out_of_memory, then it serves again", [&] {
    auto small = streamarena::rmm_resource::with_config("max_physical=64MiB");
    bool oom = false;
    try {
      (void)small.allocate(sr(stream), 128 * MiB, ALIGN);
    } catch (const rmm::out_of_memory &) {
      oom = true;
    }
    EXPECT(oom);
    void *p = small.allocate(sr(stream), 16 * MiB, ALIGN);
    EXPECT(p != nullptr);
    small.deallocate(sr(stream), p, 16 * MiB, ALIGN);
    EXPECT(cudaStreamSynchronize(stream.value()) == cudaSuccess);
  });
  check("per-thread default stream: rmm::bad_alloc that says so", [&] {
    bool said = false;
    try {
      (void)ref.allocate(cuda::stream_ref{cudaStreamPerThread}, 4096, ALIGN);
    } catch (const rmm::bad_alloc &e) {
      said = std::string(e.what()).find("per-thread") != std::string::npos;
    }
    EXPECT(said);
  });
  check("deallocate keeps stream order: another stream reuses after queued work", [&] {
    // The first stream stays busy, then writes 0x11 over p, which is freed
    // on it while that is queued; the other stream's block q, written 0x22,
    // must not take p's memory before then, or the late 0x11 lands on it.
    rmm::cuda_stream other;
    const std::size_t n = 4 * MiB, words = n / 4;
    std::vector<void *> kept;
    unsigned long long *bad = nullptr, found = 1;
    EXPECT(cudaMalloc(&bad, sizeof *bad) == cudaSuccess);
    EXPECT(cudaMemset(bad, 0, sizeof *bad) == cudaSuccess);
    for (int round = 0; round < 8; round++) {
      void *p = ref.allocate(sr(stream), n, ALIGN);
      spin<<<1, 1, 0, stream.value()>>>(20'000'000);
      EXPECT(cudaMemsetAsync(p, 0x11, n, stream.value()) == cudaSuccess);
      ref.deallocate(sr(stream), p, n, ALIGN); // its writes are still queued
      void *q = ref.allocate(sr(other), n, ALIGN);
      EXPECT(cudaMemsetAsync(q, 0x22, n, other.value()) == cudaSuccess);
      kept.push_back(q);
    }
    EXPECT(cudaDeviceSynchronize() == cudaSuccess);
    for (void *q : kept) {
      count_not<<<128, 256>>>(static_cast<std::uint32_t *>(q), words, 0x22222222u, bad);
      ref.deallocate(legacy, q, n, ALIGN);
    }
    EXPECT(cudaDeviceSynchronize() == cudaSuccess);
    EXPECT(cudaMemcpy(&found, bad, sizeof found, cudaMemcpyDeviceToHost) == cudaSuccess);
    EXPECT(found == 0);
    EXPECT(cudaFree(bad) == cudaSuccess);
  });
  check("threads: 4 threads, each on its own stream, mixed allocations", [&] {
    std::vector<std::thread> threads;
    std::vector<int> ok(4, 0);
    for (int t = 0; t < 4; t++)
      threads.emplace_back([&, t] {
        cudaSetDevice(dev);
        rmm::cuda_stream s;
        std::default_random_engine gen(t);
        std::uniform_int_distribution<std::size_t> size(1, MiB);
        int done = 0;
        for (int i = 0; i < 2000; i++) {
          std::size_t k = size(gen);
          void *p = ref.allocate(sr(s), k, ALIGN);
          if (p != nullptr && aligned(p)) done++;
          ref.deallocate(sr(s), p, k, ALIGN);
        }
        EXPECT(cudaStreamSynchronize(s.value()) == cudaSuccess);
        ok[t] = done == 2000;
      });
    for (auto &th : threads) th.join();
    for (int v : ok) EXPECT(v);
  });
  std::printf("rmm_resource_test: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
