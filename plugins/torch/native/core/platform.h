// What the core asks of the machine it runs on, so that it needs no CUDA
// runtime and no PyTorch: the torch layer implements it with the CUDA
// runtime and c10 (torch/platform.cc), the tests with the host simulator.
#ifndef SA_NATIVE_CORE_PLATFORM_H
#define SA_NATIVE_CORE_PLATFORM_H

#include <cstddef>
#include <cstdint>
#include <functional>

#include <streamarena/streamarena.h>

namespace sa_native {

class Platform {
 public:
  virtual ~Platform() = default;

  // Runs call with device current on the calling thread and puts the
  // caller's device back: the library takes stream NULL as the legacy
  // stream of the current device and refuses another device's
  // (streamarena.h, on sa_stream), while a PyTorch deleter runs wherever the
  // tensor dies. call's status, or the platform's failure to switch.
  virtual sa_status on_device(int device, const std::function<sa_status()> &call) = 0;

  // Whether stream is being captured into a CUDA graph now.
  virtual bool capturing(sa_stream stream) = 0;

  // Runs call with the calling thread's capture mode relaxed, as PyTorch's
  // allocator does around a cudaMalloc during a capture: mapping memory is
  // an "unsafe" call that the global mode refuses, and a graph's memory
  // may have to grow while it is captured.
  virtual sa_status relaxed(const std::function<sa_status()> &call) = 0;

  // Waits for all work of device (cudaDeviceSynchronize); its status.
  virtual sa_status synchronize(int device) = 0;

  // The device's free and total bytes (cudaMemGetInfo).
  virtual void memory_info(int device, size_t *free_bytes, size_t *total_bytes) = 0;

  // The devices (bit i = device i) that can map device's memory, for an
  // arena's peer_access where the configuration leaves it unset.
  virtual uint64_t peers_of(int device) = 0;

  // PyTorch's FreeCudaMemoryCallbacksRegistry, run before an allocation's
  // retry; whether any freed something.
  virtual bool run_free_memory_callbacks() = 0;

  // A timestamp for the trace, in the platform's clock (PyTorch's
  // approximate clock; converted when a snapshot is taken).
  virtual int64_t now() = 0;
};

}  // namespace sa_native

#endif  // SA_NATIVE_CORE_PLATFORM_H
