// RMM's allocators as peer_bench backends: a plug-in (backend.h) that
// bench/peers/build.sh compiles against RMM's headers and librmm.so (RMM
// 26.x, the librmm-cu13 wheel) with the CUDA toolkit.
//
//   rmm-pool   pool_memory_resource over cuda_memory_resource (cudaMalloc),
//              initial pool 0: it grows as RMM grows it, no maximum
//   rmm-arena  arena_memory_resource over cuda_memory_resource, RMM's
//              default arena (half the free device memory, taken at once)
//   rmm-async  cuda_async_memory_resource (a cudaMallocAsync pool of its own,
//              RMM's defaults: release threshold UINT64_MAX)
//   rmm-streamarena
//              streamarena::rmm_resource (plugins/rmm) over an arena of its
//              own in the default configuration, called through
//              rmm::device_async_resource_ref as RMM's users call a
//              resource: against the built-in streamarena backend, what
//              RMM's interface costs
//
// Peak reserved is RMM's own figure: for the pool and the arena, the peak
// of a statistics_resource_adaptor between them and cudaMalloc (the pool's
// largest pool_size(); the arena's whole); for the async resource, its
// pool's cudaMemPoolAttrReservedMemHigh; for streamarena, its arena's
// reserved_bytes_peak. Each instance builds new resources, so peaks start
// from zero.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include <rmm/error.hpp>
#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/mr/statistics_resource_adaptor.hpp>
#include <rmm/resource_ref.hpp>
#include <rmm/version_config.hpp>

#include <streamarena/rmm_resource.hpp>

#include "bench/peers/backend.h"

namespace {

constexpr size_t ALIGN = 256; // CUDA's own guarantee, as the others give

thread_local char last_error[512];

int failed(const char *what, const std::exception &e, int code) {
  std::snprintf(last_error, sizeof last_error, "%s: %s", what, e.what());
  return code;
}

cuda::stream_ref stream_of(void *s) { return cuda::stream_ref{static_cast<cudaStream_t>(s)}; }

// The resource under test, and how its reserved bytes are counted.
struct Counted {
  rmm::mr::cuda_memory_resource cuda;
  rmm::mr::statistics_resource_adaptor upstream{cuda};
};

struct Pool : Counted {
  rmm::mr::pool_memory_resource mr{upstream, 0};
};

struct Arena : Counted {
  rmm::mr::arena_memory_resource mr{upstream};
};

struct Async {
  rmm::mr::cuda_async_memory_resource mr;
};

struct Streamarena {
  streamarena::rmm_resource resource;
  rmm::device_async_resource_ref mr{resource};
  explicit Streamarena(const peer_env *env)
      : resource(streamarena::rmm_resource::with_config(
            ("backend=cuda,device=" + std::to_string(env->device) +
             (env->conf != nullptr ? std::string(",") + env->conf : std::string()))
                .c_str())) {}
};

void counted_stats(const Counted &c, peer_stats *out) {
  auto bytes = c.upstream.get_bytes_counter();
  out->reserved_peak = static_cast<size_t>(bytes.peak);
  out->reserved_now = static_cast<size_t>(bytes.value);
}

// The pool's size only grows (until the pool is destroyed), so its peak is
// what the pool took from cudaMalloc.
void counted_stats(const Pool &p, peer_stats *out) {
  counted_stats(static_cast<const Counted &>(p), out);
  out->reserved_now = p.mr.pool_size();
}

void counted_stats(const Async &a, peer_stats *out) {
  cudaMemPool_t pool = a.mr.pool_handle();
  cuuint64_t high = 0, now = 0;
  if (cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &now) != cudaSuccess)
    throw std::runtime_error("cudaMemPoolGetAttribute failed");
  out->reserved_peak = high;
  out->reserved_now = now;
}

void counted_stats(const Streamarena &a, peer_stats *out) {
  sa_stats s = a.resource.stats();
  out->reserved_peak = s.reserved_bytes_peak;
  out->reserved_now = s.reserved_bytes;
}

template <class R>
R *make(const peer_env *) {
  return new R;
}

template <>
Streamarena *make(const peer_env *env) {
  return new Streamarena(env);
}

// The same functions for each of the resources.
template <class R>
struct Ops {
  static int create(const peer_env *env, void **self, char *err, size_t err_size) {
    try {
      if (cudaSetDevice(env->device) != cudaSuccess) throw std::runtime_error("cudaSetDevice");
      *self = make<R>(env);
      return PEER_OK;
    } catch (const std::exception &e) {
      std::snprintf(err, err_size, "%s", e.what());
      return PEER_ERROR;
    }
  }
  static int alloc(void *self, void **p, size_t size, void *s) {
    try {
      *p = static_cast<R *>(self)->mr.allocate(stream_of(s), size, ALIGN);
      return PEER_OK;
    } catch (const std::bad_alloc &e) { // rmm::out_of_memory and rmm::bad_alloc too
      return failed("allocate", e, PEER_OOM);
    } catch (const std::exception &e) {
      return failed("allocate", e, PEER_ERROR);
    }
  }
  // RMM frees on the stream the block was last used on (stream-ordered).
  static int free(void *self, void *p, size_t size, void *s, void *) {
    static_cast<R *>(self)->mr.deallocate(stream_of(s), p, size, ALIGN);
    return PEER_OK;
  }
  static int stats(void *self, peer_stats *out) {
    try {
      counted_stats(*static_cast<R *>(self), out);
      return PEER_OK;
    } catch (const std::exception &e) {
      return failed("stats", e, PEER_ERROR);
    }
  }
  static int destroy(void *self, char *err, size_t err_size) {
    try {
      delete static_cast<R *>(self);
      return PEER_OK;
    } catch (const std::exception &e) {
      std::snprintf(err, err_size, "%s", e.what());
      return PEER_ERROR;
    }
  }
};

const char *error(void *) { return last_error; }

// As the built-in streamarena backend: the program destroys the stream next.
int streamarena_stream_done(void *self, void *stream) {
  sa_status st = sa_stream_release(static_cast<Streamarena *>(self)->resource.arena(),
                                   static_cast<sa_stream>(stream));
  if (st == SA_OK) return PEER_OK;
  std::snprintf(last_error, sizeof last_error, "sa_stream_release: %s", sa_status_string(st));
  return PEER_ERROR;
}

#define RMM_ABOUT "RMM " RMM_VERSION ": "

const peer_backend backends[] = {
    {"rmm-pool",
     RMM_ABOUT "pool_memory_resource over cuda_memory_resource, initial pool 0 (grows as RMM "
               "grows it), no maximum",
     "its largest pool_size(): the bytes it took from cudaMalloc (a statistics_resource_adaptor "
     "under it)",
     Ops<Pool>::create, Ops<Pool>::alloc, Ops<Pool>::free, nullptr, Ops<Pool>::stats,
     Ops<Pool>::destroy, error},
    {"rmm-arena",
     RMM_ABOUT "arena_memory_resource over cuda_memory_resource, default arena size (half the "
               "free device memory)",
     "peak bytes the arena took from cudaMalloc (a statistics_resource_adaptor under it)",
     Ops<Arena>::create, Ops<Arena>::alloc, Ops<Arena>::free, nullptr, Ops<Arena>::stats,
     Ops<Arena>::destroy, error},
    {"rmm-async",
     RMM_ABOUT "cuda_async_memory_resource, defaults (a pool of its own, release threshold "
               "UINT64_MAX)",
     "cudaMemPoolAttrReservedMemHigh of its pool", Ops<Async>::create, Ops<Async>::alloc,
     Ops<Async>::free, nullptr, Ops<Async>::stats, Ops<Async>::destroy, error},
    {"rmm-streamarena",
     RMM_ABOUT "streamarena::rmm_resource over an arena of its own (default configuration), "
               "called through rmm::device_async_resource_ref",
     "sa_get_stats reserved_bytes_peak of its arena (physical memory mapped)",
     Ops<Streamarena>::create, Ops<Streamarena>::alloc, Ops<Streamarena>::free,
     streamarena_stream_done, Ops<Streamarena>::stats, Ops<Streamarena>::destroy, error},
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const peer_backend *peer_backends(
    unsigned abi, size_t *count) {
  if (abi != PEER_ABI) return nullptr;
  *count = sizeof backends / sizeof backends[0];
  return backends;
}
