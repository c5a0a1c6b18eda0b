// An arena's memory as PyTorch's snapshot shows a caching allocator's:
// segments (here: contiguous mapped ranges) split into blocks that cover
// them exactly, each live, waiting for an event, or free. Read from the
// library's own diagnostic, sa_snapshot_write's JSON, so that only the
// public API is used; cacheInfo's figure comes from the same reading.
//
// What a segment is here: the chunks the JSON lists as mapped, merged where
// one ends at the next one's address. Superblocks carve small blocks
// ("small" segments, PyTorch's small pool), spans hold large requests
// ("large"); free slots between them, and the tail of a superblock past its
// last whole block, are free blocks, so the blocks of a segment add up to
// its size as PyTorch's tools (torch.cuda._memory_viz) require. Unmapped
// cached chunks have no address and are no segment; they are counted in
// unmapped_cached.
#ifndef SA_NATIVE_CORE_LAYOUT_H
#define SA_NATIVE_CORE_LAYOUT_H

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include <streamarena/streamarena.h>

namespace sa_native {

enum class BlockState {
  kFree,         // free, or cached by a thread: reusable
  kLive,         // allocated (recorded streams included)
  kPendingFree,  // freed, its reuse waits for an event (PyTorch: active, not allocated)
};

struct LayoutBlock {
  uintptr_t address = 0;
  size_t size = 0;
  BlockState state = BlockState::kFree;
  size_t request = 0;  // a live span's requested bytes (0 where the JSON does not say)
};

struct LayoutSegment {
  uintptr_t address = 0;
  size_t size = 0;
  uintptr_t stream = 0;  // the stream of its first block that has an owner
  bool large = false;    // holds spans rather than superblocks only
  std::vector<LayoutBlock> blocks;
};

struct ArenaLayout {
  size_t granularity = 0;
  size_t superblock_size = 0;
  size_t large_threshold = 0;    // requests above it get spans
  size_t reserved = 0;           // physical bytes held (sa_get_stats)
  size_t largest_free_span = 0;  // the largest mapped span not in use
  size_t unmapped_cached = 0;    // cached chunks mapped nowhere
  size_t largest_request = 0;    // the library's own figure: the largest request it
                                 // could serve, growth up to its cap included
  std::vector<LayoutSegment> segments;
};

// Throws std::runtime_error where the text is not JSON.
ArenaLayout parse_layout(std::string_view json);

// sa_snapshot_write into memory, then parse_layout. Throws Failure
// (kLibrary) when the library or the parse fails.
ArenaLayout read_layout(sa_arena *arena);

}  // namespace sa_native

#endif  // SA_NATIVE_CORE_LAYOUT_H
