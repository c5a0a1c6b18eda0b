// The backends built into the peer benchmark (the others are plug-ins).
#ifndef SA_BENCH_PEERS_BUILTIN_H
#define SA_BENCH_PEERS_BUILTIN_H

#include "bench/cuda_device.h"
#include "bench/peers/backend.h"

namespace peers {

// streamarena through its public API, one arena per instance, on the CUDA
// backend on a GPU and on the host simulator elsewhere.
const peer_backend *streamarena_backend();
// The same with the configuration docs/TORCH.md gives PyTorch.
const peer_backend *streamarena_torch_backend();
// The same with a pool mapped up front (its size from --sa-conf).
const peer_backend *streamarena_prefill_backend();
// The same with keep_spans=1.
const peer_backend *streamarena_keep_backend();
// The points of its footprint/speed curve (footprint_target), i = 0, 1, ...
// until NULL.
const peer_backend *streamarena_curve_backend(size_t i);

// cudaMallocAsync's pools through the driver API (cuMemAllocFromPoolAsync /
// cuMemFreeAsync, the calls cudaMallocAsync makes), one pool per instance;
// cu is NULL without a GPU (the backend then says it needs one).
const peer_backend *cuda_async_backend(const bench_cu *cu);

}  // namespace peers

#endif  // SA_BENCH_PEERS_BUILTIN_H
