/* streamarena's PyTorch plugin (libstreamarena_torch.so): the entry points
 * torch.cuda.memory.CUDAPluggableAllocator loads, over the default arenas
 * (one per device, configured by STREAMARENA_CONF).
 *
 * The Python package (python/streamarena/torch.py) wires them into PyTorch:
 *
 *   sa_torch_malloc        every CUDA allocation; stream is the device's current stream
 *   sa_torch_free          when the last tensor using the memory goes; stream is the
 *                          stream of the allocation (PyTorch keeps it), so the memory
 *                          is reused after that stream's work, as PyTorch's own
 *                          caching allocator does
 *   sa_torch_record_stream tensor.record_stream(stream): reuse also waits for stream
 *                          (not told the device: stream 0 is the legacy stream of the
 *                          device current at the call, which must be the block's)
 *   sa_torch_empty_cache   torch.cuda.empty_cache(): sa_trim of every arena in use
 *   sa_torch_set_memory_fraction
 *                          torch.cuda.set_per_process_memory_fraction: not supported
 *                          (one warning); set max_physical in STREAMARENA_CONF
 *
 * The malloc and free hooks cannot return a status to PyTorch: a failure is
 * written to stderr (the first few in full) and counted in
 * sa_torch_stats.errors; a failed allocation returns NULL.
 *
 * Stream 0 (NULL) in the malloc and free hooks is the legacy stream of the
 * device they are told, whatever device is current at the call.
 *
 * It needs no PyTorch header: a cudaStream_t is a CUstream, an sa_stream.
 */
#ifndef STREAMARENA_TORCH_H
#define STREAMARENA_TORCH_H

#include <stddef.h>
#include <stdint.h>

#include <streamarena/streamarena.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Devices the plugin serves: ordinals 0 .. SA_TORCH_MAX_DEVICES - 1. */
#define SA_TORCH_MAX_DEVICES 64

void *sa_torch_malloc(size_t size, int device, sa_stream stream);
void sa_torch_free(void *ptr, size_t size, int device, sa_stream stream);
void sa_torch_record_stream(void *ptr, sa_stream stream);
void sa_torch_empty_cache(void);
void sa_torch_set_memory_fraction(double fraction, int device);

/* Check mode: every free first fills the memory with pattern (32-bit words;
 * 0x7FC07FC0 is a NaN in fp32, bf16 and fp16) on a stream of the plugin's
 * own that waits for the freeing stream and every stream recorded for the
 * block, and the block is recorded on that stream: memory handed out again
 * before the fill ran (a reuse the allocator should have ordered) is
 * overwritten, and so is memory a stream still reads that nobody recorded
 * (a missing record_stream). Costs events and a fill per free. Only before
 * the first allocation (SA_ERR_NOT_SUPPORTED after). */
sa_status sa_torch_set_check(int enabled, uint32_t pattern);

typedef struct sa_torch_stats_s {
  /* Kept by the plugin: what PyTorch holds, in bytes it asked for. */
  uint64_t requested_bytes, requested_bytes_peak;
  uint64_t requested_bytes_total, freed_bytes_total; /* ever allocated, freed */
  uint64_t alloc_count, free_count, record_count;
  uint64_t check_fills;   /* frees filled in check mode */
  uint64_t errors;        /* failed hooks on this device */
  /* From sa_get_stats of the device's arena (zero before its first use). */
  uint64_t reserved_bytes, reserved_bytes_peak;
  uint64_t live_bytes, live_bytes_peak; /* small blocks count their size class */
  uint64_t cached_bytes;
  uint64_t oom_events;
  double fast_path_ratio;
} sa_torch_stats;

/* Statistics of device into *out; size must be sizeof(sa_torch_stats) (the
 * Python package passes its own idea of it). Errors:
 * SA_ERR_INVALID_ARGUMENT (bad device, NULL, size mismatch). */
sa_status sa_torch_get_stats(int device, sa_torch_stats *out, size_t size);

/* The requested-bytes peak starts again from what is held now (what
 * torch.cuda.reset_peak_memory_stats does); the arena's own peaks stay. */
sa_status sa_torch_reset_peak(int device);

/* Failed hooks so far, all devices together. */
uint64_t sa_torch_error_count(void);

#ifdef __cplusplus
}
#endif
#endif /* STREAMARENA_TORCH_H */
