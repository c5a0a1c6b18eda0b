/* streamarena as an RMM memory resource (RMM 26.x), header-only.
 *
 *   #include <streamarena/rmm_resource.hpp>
 *
 *   streamarena::rmm_resource mr;                 // the current device's default arena
 *   rmm::mr::set_current_device_resource(mr);     // RMM copies it: copies share the arena
 *   rmm::device_buffer b(1 << 20, stream);        // sa_alloc on stream
 *
 * RMM 26 has no device_memory_resource base class any more: a resource is
 * any type of CCCL's resource concept (cuda::mr::resource_with
 * <device_accessible>), which this one is: allocate and deallocate on a
 * stream with an alignment, their _sync forms, equality, and the
 * device_accessible property. The rules are those of RMM's own base
 * resources (cuda_memory_resource, cuda_async_view_memory_resource):
 *   - zero bytes allocate nothing and return nullptr, whose deallocation
 *     does nothing;
 *   - an alignment must be a power of two of at most 256 bytes (what every
 *     block has), else rmm::bad_alloc; rmm::mr::aligned_resource_adaptor
 *     serves larger ones;
 *   - a lack of memory throws rmm::out_of_memory (an rmm::bad_alloc, a
 *     std::bad_alloc), any other failure rmm::bad_alloc with the reason;
 *   - deallocate cannot throw: a failure (a pointer that is no block) is
 *     written to stderr, and the memory stays as it was.
 * A deallocation is in stream order on its stream, as with every
 * stream-ordered RMM resource: the memory is reused there at once, and on
 * another stream only after the work enqueued before it
 * (docs/ECOSYSTEM.md). CUDA's per-thread default stream
 * (cudaStreamPerThread) is not served: rmm::bad_alloc says so.
 *
 * Needs the CUDA runtime (the _sync forms synchronize the legacy default
 * stream, as RMM's do) and librmm.so, which defines RMM's exception
 * classes; and streamarena, linked or as libstreamarena_python.so.
 */
#ifndef STREAMARENA_RMM_RESOURCE_HPP
#define STREAMARENA_RMM_RESOURCE_HPP

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include <cuda/memory_resource>
#include <cuda/stream_ref>
#include <rmm/aligned.hpp>
#include <rmm/error.hpp>
#include <rmm/process_is_exiting.hpp>

#include <streamarena/streamarena.h>

namespace streamarena {

class rmm_resource {
 public:
  /* The default arena of the current CUDA device (cudaGetDevice), created
   * at its first use from STREAMARENA_CONF. */
  rmm_resource() : rmm_resource(current_device()) {}

  /* The default arena of device. */
  explicit rmm_resource(int device) {
    sa_arena *a = nullptr;
    check(sa_default_arena(device, &a), "sa_default_arena");
    /* RMM's memory must be the GPU's: never the simulator that backend
     * auto falls back to where CUDA is not usable (its reason says so). */
    const std::string why = sa_arena_backend_reason(a);
    if (sa_arena_backend(a) == SA_BACKEND_HOST && why.find("not usable") != std::string::npos)
      throw rmm::logic_error("streamarena::rmm_resource: " + why +
                             "; RMM needs CUDA memory (backend=host for the simulator)");
    arena_ = a;
  }

  /* An arena the caller made; it must outlive every copy of the resource. */
  explicit rmm_resource(sa_arena *arena) : arena_(arena) {
    if (arena == nullptr) throw rmm::logic_error("streamarena::rmm_resource: a NULL arena");
  }

  /* An arena of its own, from a configuration (sa_config_parse's syntax,
   * e.g. "device=0,max_physical=8GiB"), destroyed with the resource's last
   * copy. */
  static rmm_resource with_config(const char *conf) {
    sa_config c;
    sa_config_init(&c);
    char why[256] = "";
    if (conf != nullptr && sa_config_parse(&c, conf, why, sizeof why) != SA_OK)
      throw rmm::logic_error(std::string("streamarena::rmm_resource: configuration '") + conf +
                             "': " + why);
    sa_arena *a = nullptr;
    check(sa_arena_create(&c, &a), "sa_arena_create");
    rmm_resource r(a);
    r.owner_ = std::shared_ptr<sa_arena>(a, [](sa_arena *x) {
      /* RMM's per-device map keeps a resource until the process exits,
       * when CUDA may be gone: the driver takes the memory back then. */
      if (!rmm::process_is_exiting()) (void)sa_arena_destroy(x);
    });
    return r;
  }

  void *allocate(cuda::stream_ref stream, std::size_t bytes,
                 std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) {
    if (bytes == 0) return nullptr;
    if (!supported_alignment(alignment))
      throw rmm::bad_alloc("streamarena::rmm_resource: alignment " + std::to_string(alignment) +
                           " is not a power of two of at most 256 bytes (wrap the resource in "
                           "rmm::mr::aligned_resource_adaptor for more)");
    void *p = nullptr;
    sa_status st = sa_alloc(arena_, &p, bytes, stream.get());
    if (st == SA_OK) return p;
    std::string why = "streamarena::rmm_resource: allocating " + std::to_string(bytes) +
                      " bytes: " + describe(st);
    if (st == SA_ERR_OUT_OF_MEMORY) throw rmm::out_of_memory(why);
    if (st == SA_ERR_UNKNOWN_STREAM)
      why += " (a stream of another device, or CUDA's per-thread default stream, which "
             "streamarena does not serve)";
    throw rmm::bad_alloc(why);
  }

  void deallocate(cuda::stream_ref stream, void *ptr, std::size_t bytes,
                  std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept {
    (void)alignment;
    if (ptr == nullptr) return;
    sa_status st = sa_free(ptr, stream.get());
    if (st != SA_OK)
      std::fprintf(stderr, "streamarena::rmm_resource: deallocate(%p, %zu bytes): %s\n", ptr,
                   bytes, describe(st).c_str());
  }

  void *allocate_sync(std::size_t bytes,
                      std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) {
    void *p = allocate(cuda::stream_ref{cudaStream_t{nullptr}}, bytes, alignment);
    cudaError_t e = cudaStreamSynchronize(nullptr);
    if (e != cudaSuccess) {
      deallocate(cuda::stream_ref{cudaStream_t{nullptr}}, p, bytes, alignment);
      throw rmm::cuda_error(std::string("streamarena::rmm_resource: cudaStreamSynchronize: ") +
                            cudaGetErrorName(e));
    }
    return p;
  }

  void deallocate_sync(void *ptr, std::size_t bytes,
                       std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept {
    deallocate(cuda::stream_ref{cudaStream_t{nullptr}}, ptr, bytes, alignment);
  }

  /* Two resources are interchangeable when they allocate from one arena. */
  bool operator==(rmm_resource const &other) const noexcept { return arena_ == other.arena_; }
  bool operator!=(rmm_resource const &other) const noexcept { return arena_ != other.arena_; }

  friend void get_property(rmm_resource const &, cuda::mr::device_accessible) noexcept {}

  sa_arena *arena() const noexcept { return arena_; }

  /* The arena's statistics (sa_get_stats). */
  sa_stats stats() const {
    sa_stats s;
    check(sa_get_stats(arena_, &s), "sa_get_stats");
    return s;
  }

 private:
  sa_arena *arena_ = nullptr;
  std::shared_ptr<sa_arena> owner_; /* set when with_config made the arena */

  static bool supported_alignment(std::size_t a) noexcept {
    return a != 0 && (a & (a - 1)) == 0 && a <= SA_ALIGNMENT;
  }

  static std::string describe(sa_status st) {
    std::string s = sa_status_string(st);
    const char *name = nullptr;
    int code = sa_last_driver_error(&name);
    if ((st == SA_ERR_DRIVER || st == SA_ERR_NO_DEVICE) && name != nullptr)
      s += " (driver error " + std::to_string(code) + ", " + name + ")";
    return s;
  }

  static void check(sa_status st, const char *what) {
    if (st != SA_OK)
      throw rmm::logic_error(std::string("streamarena::rmm_resource: ") + what + ": " +
                             describe(st));
  }

  static int current_device() {
    int d = 0;
    cudaError_t e = cudaGetDevice(&d);
    if (e != cudaSuccess)
      throw rmm::cuda_error(std::string("streamarena::rmm_resource: cudaGetDevice: ") +
                            cudaGetErrorName(e));
    return d;
  }
};

static_assert(cuda::mr::resource_with<rmm_resource, cuda::mr::device_accessible>);
static_assert(cuda::mr::synchronous_resource_with<rmm_resource, cuda::mr::device_accessible>);

}  // namespace streamarena

#endif /* STREAMARENA_RMM_RESOURCE_HPP */
