// The device: see device.h.
#include "bench/peers/device.h"

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

namespace peers {

namespace {
std::string cu_fail(const char *what, CUresult r) {
  return std::string(what) + ": " + sa_cu_error_name(r);
}
}  // namespace

bool Device::open(int ordinal, bool require_gpu, std::string *err) {
  ordinal_ = ordinal;
  char why[256];
  if (bench_cu_open(&cu_, ordinal, why, sizeof why) == 0) {
    gpu_ = true;
    describe_ = std::string(cu_.name) + ", driver API " + std::to_string(cu_.driver_version / 1000) +
                "." + std::to_string(cu_.driver_version % 1000 / 10);
    return true;
  }
  if (require_gpu) {
    *err = std::string("no usable GPU: ") + why;
    return false;
  }
  gpu_ = false;
  describe_ = std::string("host simulator (no GPU: ") + why + ")";
  return true;
}

void Device::close() {
  if (gpu_) bench_cu_close(&cu_);
  gpu_ = false;
}

bool Device::bind_thread(std::string *err) const {
  if (!gpu_) return true;
  CUresult r = sa_cu.CtxSetCurrent(cu_.ctx);
  if (r != CUDA_SUCCESS) *err = cu_fail("cuCtxSetCurrent", r);
  return r == CUDA_SUCCESS;
}

bool Device::stream_create(void **out, std::string *err) const {
  if (gpu_) {
    CUstream s = nullptr;
    CUresult r = sa_cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS) {
      *err = cu_fail("cuStreamCreate", r);
      return false;
    }
    *out = s;
    return true;
  }
  sa_stream s = nullptr;
  sa_status st = sa_host_stream_create(SA_HOST_AUTO, &s);
  if (st != SA_OK) {
    *err = std::string("sa_host_stream_create: ") + sa_status_string(st);
    return false;
  }
  *out = s;
  return true;
}

bool Device::stream_destroy(void *s, std::string *err) const {
  if (gpu_) {
    CUresult r = sa_cu.StreamDestroy(static_cast<CUstream>(s));
    if (r != CUDA_SUCCESS) *err = cu_fail("cuStreamDestroy", r);
    return r == CUDA_SUCCESS;
  }
  sa_status st = sa_host_stream_destroy(s);
  if (st != SA_OK) *err = std::string("sa_host_stream_destroy: ") + sa_status_string(st);
  return st == SA_OK;
}

bool Device::sync(void *s, std::string *err) const {
  if (gpu_) {
    CUresult r = sa_cu.StreamSynchronize(static_cast<CUstream>(s));
    if (r != CUDA_SUCCESS) *err = cu_fail("cuStreamSynchronize", r);
    return r == CUDA_SUCCESS;
  }
  sa_status st = sa_host_stream_drain(s);
  if (st != SA_OK) *err = std::string("sa_host_stream_drain: ") + sa_status_string(st);
  return st == SA_OK;
}

}  // namespace peers
