// The device the peer benchmark runs on: a GPU through the driver API, or,
// where there is none, the host simulator (only streamarena runs there).
// Owns the streams the workloads use; calls only down, into cuda_device and
// streamarena's simulator.
#ifndef SA_BENCH_PEERS_DEVICE_H
#define SA_BENCH_PEERS_DEVICE_H

#include <string>

#include "bench/cuda_device.h"

namespace peers {

class Device {
 public:
  // Device ordinal's primary context. Without a usable GPU: the simulator,
  // or false with the reason if require_gpu.
  bool open(int ordinal, bool require_gpu, std::string *err);
  void close();

  bool gpu() const { return gpu_; }
  int ordinal() const { return ordinal_; }
  // "NVIDIA H200, driver 13.0" or "host simulator (no GPU: why)".
  const std::string &describe() const { return describe_; }
  const bench_cu *cu() const { return gpu_ ? &cu_ : nullptr; }

  // Every thread that may make driver calls through cu() first.
  bool bind_thread(std::string *err) const;
  // A stream as a user makes one: CU_STREAM_NON_BLOCKING on a GPU.
  bool stream_create(void **out, std::string *err) const;
  bool stream_destroy(void *s, std::string *err) const;
  // Host waits for the stream's work.
  bool sync(void *s, std::string *err) const;

 private:
  bool gpu_ = false;
  int ordinal_ = 0;
  bench_cu cu_{};
  std::string describe_;
};

}  // namespace peers

#endif  // SA_BENCH_PEERS_DEVICE_H
