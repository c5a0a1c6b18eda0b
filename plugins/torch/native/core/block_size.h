// The bytes an arena holds for a request: what PyTorch's statistics call a
// block's size (allocated_bytes), as against the bytes requested.
//
// The one place the native backend reaches past the public API: a small
// request takes a block of its size class (src/small/size_class.h, pure
// arithmetic), a large one a span of the request rounded up to
// SA_ALIGNMENT (to whole granules for some sizes under a budget, which this
// does not follow). The public call this stands in for, sa_block_size(p)
// (docs/TORCH.md lists the additions the backend asks for), would answer
// for the block itself and follow the library wherever it changes.
#ifndef SA_NATIVE_CORE_BLOCK_SIZE_H
#define SA_NATIVE_CORE_BLOCK_SIZE_H

#include <cstddef>

#include <streamarena/streamarena.h>

#include "small/size_class.h"

namespace sa_native {

// large_threshold: the arena's, as its snapshot states it (layout.h).
inline size_t block_size(size_t request, size_t large_threshold) {
  if (request == 0) return 0;
  if (request <= large_threshold && request <= SA_CLASS_MAX_SIZE)
    return sa_class_size(sa_size_class(request));
  return (request + SA_ALIGNMENT - 1) / SA_ALIGNMENT * SA_ALIGNMENT;
}

inline bool is_large(size_t request, size_t large_threshold) { return request > large_threshold; }

}  // namespace sa_native

#endif  // SA_NATIVE_CORE_BLOCK_SIZE_H
