// PyTorch's CUDA caching allocator as peer_bench backends: a plug-in
// (backend.h) that bench/peers/build.sh compiles against torch's headers and
// links with its libc10_cuda.so and libc10.so (loaded from torch's own lib
// folder at run time). The C++ calls PyTorch itself makes for a tensor,
// without Python.
//
//   torch             the allocator with its default settings
//   torch-expandable  with expandable_segments:True (its virtual-memory
//                     mode), set before the allocator starts
//
// The allocator is one per process and its settings cannot change once it
// has started, so a process runs one of the two (bench/peers/run.sh starts
// one process per backend). An instance is the allocator with its cache
// emptied and its peaks reset, so reserved peaks are that instance's. A free
// on a stream other than the allocation's is recordStream on that stream,
// then the free: how PyTorch code hands a block to another stream. Before
// the program destroys a stream the cache is emptied, as a PyTorch program
// that destroys its own streams must: an expandable segment belongs to a
// stream and is synchronised with it when it is unmapped (emptying it after
// the stream is gone failed with cudaErrorContextIsDestroyed on the H200).
#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>

#include "bench/peers/backend.h"

// libc10_cuda's hook for "does this device have a primary context"; libtorch
// installs it, the allocator asks it when it records events for a block used
// on several streams, and without it the answer is an exception ("Should
// never been called"). Exported by libc10_cuda, declared in no header.
namespace c10::cuda::_internal {
C10_CUDA_API void setHasPrimaryContext(bool (*func)(c10::DeviceIndex));
}  // namespace c10::cuda::_internal

namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;

thread_local char last_error[512];
std::mutex started_mutex;
int started_kind = -1; // 0 default, 1 expandable; -1 not started
c10::DeviceIndex device = 0;

int failed(const char *what, const std::exception &e, int code) {
  // c10 messages carry a C++ backtrace after the first line.
  std::string msg = e.what();
  msg = msg.substr(0, msg.find('\n'));
  std::snprintf(last_error, sizeof last_error, "%s: %s", what, msg.c_str());
  return code;
}

bool expandable_now() {
  return c10::CachingAllocator::AcceleratorAllocatorConfig::use_expandable_segments();
}

// The program retains the device's primary context for its whole run
// (bench/peers/device.cc), so that device has one.
bool has_primary_context(c10::DeviceIndex i) { return i == device; }

int start(int kind, const peer_env *env, char *err, size_t err_size) {
  std::lock_guard<std::mutex> lock(started_mutex);
  if (started_kind >= 0 && started_kind != kind) {
    std::snprintf(err, err_size, "PyTorch's allocator already runs with other settings in this "
                  "process: run torch and torch-expandable in separate processes");
    return PEER_ERROR;
  }
  if (started_kind < 0) {
    device = static_cast<c10::DeviceIndex>(env->device);
    c10::cuda::_internal::setHasPrimaryContext(has_primary_context);
    // Before the allocator's first use: it reads the setting when it makes
    // a segment. PYTORCH_CUDA_ALLOC_CONF in the environment was read already.
    if (kind == 1) alloc::setAllocatorSettings("expandable_segments:True");
    alloc::init(c10::cuda::device_count());
    started_kind = kind;
  }
  if (expandable_now() != (kind == 1)) {
    std::snprintf(err, err_size, "expandable_segments is %s (PYTORCH_CUDA_ALLOC_CONF=%s)",
                  expandable_now() ? "on" : "off",
                  std::getenv("PYTORCH_CUDA_ALLOC_CONF") ? std::getenv("PYTORCH_CUDA_ALLOC_CONF")
                                                         : "(unset)");
    return PEER_ERROR;
  }
  return PEER_OK;
}

template <int Kind>
int create(const peer_env *env, void **self, char *err, size_t err_size) {
  try {
    if (start(Kind, env, err, err_size) != PEER_OK) return PEER_ERROR;
    // A fresh instance: nothing cached, peaks from here.
    alloc::emptyCache();
    alloc::resetPeakStats(device);
    *self = &started_kind;
    return PEER_OK;
  } catch (const std::exception &e) {
    std::snprintf(err, err_size, "%s", e.what());
    return PEER_ERROR;
  }
}

int torch_alloc(void *, void **p, size_t size, void *s) {
  try {
    *p = alloc::raw_alloc_with_stream(size, static_cast<cudaStream_t>(s));
    return PEER_OK;
  } catch (const c10::OutOfMemoryError &e) {
    return failed("raw_alloc_with_stream", e, PEER_OOM);
  } catch (const std::exception &e) {
    return failed("raw_alloc_with_stream", e, PEER_ERROR);
  }
}

int torch_free(void *, void *p, size_t, void *s, void *alloc_s) {
  try {
    if (s != alloc_s) {
      // recordStream takes the allocator's own DataPtr: one made here for
      // the call and let go of (not freed) after it.
      c10::DataPtr dp(p, p, alloc::get()->raw_deleter(), c10::Device(c10::DeviceType::CUDA, device));
      alloc::recordStream(dp, c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(s), device));
      (void)dp.release_context();
    }
    alloc::raw_delete(p);
    return PEER_OK;
  } catch (const std::exception &e) {
    return failed("raw_delete", e, PEER_ERROR);
  }
}

int torch_stream_done(void *, void *) {
  try {
    alloc::emptyCache();
    return PEER_OK;
  } catch (const std::exception &e) {
    return failed("emptyCache", e, PEER_ERROR);
  }
}

int torch_stats(void *, peer_stats *out) {
  try {
    auto st = alloc::getDeviceStats(device);
    const auto &r = st.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    out->reserved_peak = static_cast<size_t>(r.peak);
    out->reserved_now = static_cast<size_t>(r.current);
    return PEER_OK;
  } catch (const std::exception &e) {
    return failed("getDeviceStats", e, PEER_ERROR);
  }
}

int torch_destroy(void *, char *err, size_t err_size) {
  try {
    alloc::emptyCache();
    auto st = alloc::getDeviceStats(device);
    int64_t live =
        st.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
    if (live == 0) return PEER_OK;
    std::snprintf(err, err_size, "%lld bytes still allocated", static_cast<long long>(live));
    return PEER_ERROR;
  } catch (const std::exception &e) {
    std::snprintf(err, err_size, "%s", e.what());
    return PEER_ERROR;
  }
}

const char *torch_error(void *) { return last_error; }

#define TORCH_ABOUT "PyTorch " TORCH_VERSION " CUDACachingAllocator (raw_alloc_with_stream/raw_delete, "

const peer_backend backends[] = {
    {"torch", TORCH_ABOUT "default settings)", "getDeviceStats reserved_bytes peak",
     create<0>, torch_alloc, torch_free, torch_stream_done, torch_stats, torch_destroy,
     torch_error},
    {"torch-expandable", TORCH_ABOUT "expandable_segments:True)",
     "getDeviceStats reserved_bytes peak", create<1>, torch_alloc, torch_free,
     torch_stream_done, torch_stats, torch_destroy, torch_error},
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const peer_backend *peer_backends(
    unsigned abi, size_t *count) {
  if (abi != PEER_ABI) return nullptr;
  *count = sizeof backends / sizeof backends[0];
  return backends;
}
