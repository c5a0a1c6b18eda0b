// cudaMallocAsync as a peer backend (builtin.h): a memory pool of its own per
// instance (cuMemPoolCreate; release threshold UINT64_MAX, so it keeps what
// it has, as PyTorch and RMM configure it), cuMemAllocFromPoolAsync and
// cuMemFreeAsync. The driver calls behind cudaMallocFromPoolAsync and
// cudaFreeAsync; a pool per instance makes its reserved peak
// (CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, cudaMemPoolAttrReservedMemHigh) that
// instance's alone.
#include <cstdint>
#include <cstdio>

#include "bench/peers/builtin.h"

namespace peers {
namespace {

const bench_cu *driver;
thread_local char last_error[256];

struct pool_s {
  CUmemoryPool pool;
};

int cu_fail(const char *what, CUresult r) {
  std::snprintf(last_error, sizeof last_error, "%s: %s", what, sa_cu_error_name(r));
  return r == CUDA_ERROR_OUT_OF_MEMORY ? PEER_OOM : PEER_ERROR;
}

int pool_create(const peer_env *, void **self, char *err, size_t err_size) {
  if (driver == nullptr) {
    std::snprintf(err, err_size, "needs a GPU");
    return PEER_ERROR;
  }
  CUmemPoolProps props = {};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = driver->dev;
  CUmemoryPool pool = nullptr;
  CUresult r = sa_cu.MemPoolCreate(&pool, &props);
  cuuint64_t keep = UINT64_MAX;
  if (r == CUDA_SUCCESS) {
    r = sa_cu.MemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
    if (r != CUDA_SUCCESS) (void)sa_cu.MemPoolDestroy(pool);
  }
  if (r != CUDA_SUCCESS) {
    std::snprintf(err, err_size, "memory pool: %s", sa_cu_error_name(r));
    return PEER_ERROR;
  }
  *self = new pool_s{pool};
  return PEER_OK;
}

int pool_alloc(void *self, void **p, size_t size, void *stream) {
  CUdeviceptr d;
  CUresult r = sa_cu.MemAllocFromPoolAsync(&d, size, static_cast<pool_s *>(self)->pool,
                                             static_cast<CUstream>(stream));
  if (r != CUDA_SUCCESS) [[unlikely]]
    return cu_fail("cuMemAllocFromPoolAsync", r);
  *p = reinterpret_cast<void *>(d);
  return PEER_OK;
}

int pool_free(void *, void *p, size_t, void *stream, void *) {
  CUresult r = sa_cu.MemFreeAsync(reinterpret_cast<CUdeviceptr>(p), static_cast<CUstream>(stream));
  if (r != CUDA_SUCCESS) [[unlikely]] {
    (void)cu_fail("cuMemFreeAsync", r);
    return PEER_ERROR;
  }
  return PEER_OK;
}

int pool_stats(void *self, peer_stats *out) {
  CUmemoryPool pool = static_cast<pool_s *>(self)->pool;
  cuuint64_t high = 0, now = 0;
  CUresult r = sa_cu.MemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &high);
  if (r == CUDA_SUCCESS)
    r = sa_cu.MemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &now);
  if (r != CUDA_SUCCESS) {
    (void)cu_fail("cuMemPoolGetAttribute", r);
    return PEER_ERROR;
  }
  out->reserved_peak = high;
  out->reserved_now = now;
  return PEER_OK;
}

int pool_destroy(void *self, char *err, size_t err_size) {
  pool_s *s = static_cast<pool_s *>(self);
  // Frees still queued on streams finish first; the driver releases the
  // pool's memory then.
  CUresult r = sa_cu.MemPoolDestroy(s->pool);
  delete s;
  if (r == CUDA_SUCCESS) return PEER_OK;
  std::snprintf(err, err_size, "cuMemPoolDestroy: %s", sa_cu_error_name(r));
  return PEER_ERROR;
}

const char *pool_error(void *) { return last_error; }

const peer_backend backend = {
    "cudaMallocAsync",
    "cuMemAllocFromPoolAsync/cuMemFreeAsync (cudaMallocAsync's calls), a pool of its own per "
    "instance, release threshold UINT64_MAX",
    "CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH of its pool (cudaMemPoolAttrReservedMemHigh)",
    pool_create,
    pool_alloc,
    pool_free,
    nullptr,
    pool_stats,
    pool_destroy,
    pool_error,
};

}  // namespace

const peer_backend *cuda_async_backend(const bench_cu *cu) {
  driver = cu;
  return &backend;
}

}  // namespace peers
