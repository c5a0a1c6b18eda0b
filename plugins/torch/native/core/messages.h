// The texts the native backend raises: sizes written as PyTorch writes them
// (its tests and users' log parsers match "Tried to allocate 2.00 GiB"),
// and the out-of-memory message in PyTorch's words followed by
// streamarena's own figures.
#ifndef SA_NATIVE_CORE_MESSAGES_H
#define SA_NATIVE_CORE_MESSAGES_H

#include <cstddef>
#include <cstdint>
#include <string>

#include <streamarena/streamarena.h>

namespace sa_native {

// "512 bytes", "1.50 KiB", "20.00 MiB", "800000000.00 GiB": PyTorch's
// thresholds (up to and including 1024 bytes, 1 MiB, 1 GiB) and two decimals.
std::string format_size(uint64_t bytes);

// What an out-of-memory message says; every figure is the device's.
struct OomFacts {
  int device = 0;
  size_t requested = 0;      // the request that failed
  size_t device_total = 0;   // cudaMemGetInfo
  size_t device_free = 0;
  bool capped = false;       // the memory fraction's cap refused it
  size_t allowed = 0;        // that cap
  size_t allocated = 0;      // live blocks outside private pools
  size_t allocated_pools = 0;  // live blocks in private pools (MemPool, CUDA graphs)
  size_t reserved = 0;       // physical bytes held, every arena of the device
  size_t cached = 0;         // of which not in use
  size_t largest_request = 0;  // what the pool's arena could still serve
  sa_stream stream = nullptr;
  const char *pool = "the device's arena";  // where it was asked for
  sa_status status = SA_ERR_OUT_OF_MEMORY;   // the library's answer
};

// "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total
// capacity of 139.80 GiB of which 1.25 GiB is free. Of the allocated memory
// ... streamarena: ..." (PyTorch's sentences, then streamarena's).
std::string oom_message(const OomFacts &f);

}  // namespace sa_native

#endif  // SA_NATIVE_CORE_MESSAGES_H
