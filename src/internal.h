/* The allocator's private headers, all of them: for the project's tests,
 * benchmarks, tools and plugins, which write #include "internal.h". Files
 * of the allocator include instead the headers of their own layer and the
 * ones below, and arena.h (tools/layers.py checks it).
 *
 * Layers, top to bottom (each calls only the ones below it); the folders
 * are the tiers (the arena, small blocks, large blocks, virtual memory, the
 * services every tier uses, the device):
 *   alloc.c               sa_alloc, its fast path; the out-of-memory loop,
 *                         sa_trim, sa_defragment
 *   free.c                sa_free, its fast path; sa_record_stream
 *   snapshot.c            sa_snapshot_write
 *   arena.c               arena life cycle, tuning, statistics
 *   report.c              memory summary: out-of-memory report, snapshot summary
 *   reclaim.c             getting memory back: free superblocks and spans unmapped
 *   trace.c               the allocation trace (trace=PATH)
 *   registry.c            which arena an address belongs to (lock-free)
 *   small/thread_cache.c  per-thread caches keyed by (arena, stream)
 *   small/stream_arena.c  per-stream arenas: life cycle, refills, sheds, fences
 *   small/stream_return.c blocks back to their stream arena: from thread caches,
 *                         cross-stream batches (inbox, lanes, parking), empties
 *   small/superblock.c    carving superblocks into blocks; the global free stack
 *   large/span.c          large allocations: alloc, free, superblocks carved in
 *                         free spans, unmapping free memory
 *   large/run.c           runs: growth (mapping ahead, reshaping), joins, cuts
 *   large/free_span.c     span descriptors, placement, best fit, carving, coalescing
 *   large/mark.c          marks (what a free span waits for) and starts
 *   large/span_index.c    free spans by size (best fit), live spans by address
 *   large/timeline.c      per-stream events that free spans wait for
 *   vm/physical.c         physical chunks: cache, creation, map and unmap
 *   vm/va_space.c         the reserved virtual range and the page map
 *   base/event_pool.c     pooled driver events
 *   base/record.c         sa_record_stream's side table
 *   base/device_sync.c    device-wide synchronize: what it makes clean
 *   base/hook.c           test hooks (pause points on slow paths)
 *   base/chain_table.c    chained hash tables (record.c's, the live stream arenas')
 *   driver/driver.h       the device (src/driver/), the simulator behind it (src/sim/)
 *
 * Naming: sa_ is public, sa__ is internal across files, static functions
 * have no prefix. Fields that other threads read without the owner's lock
 * are _Atomic and prefixed x.
 *
 * Headers: one per file that other files call (foo.c's contract is foo.h,
 * beside it), each opening with what it owns, what it calls and who calls
 * it; a layer's state is a sub-struct of the arena, defined in its header
 * and gathered in arena.h. base/base.h has what every file uses.
 *
 * Invariants: each structure has a validator, sa__<structure>_check, in
 * the file that owns it, declared with that file's functions in its header. Builds
 * with asserts on (every test build, the sanitizers, the fuzzer) run it
 * where the structure must be whole (SA_VALIDATE, SA_VALIDATE_PACED), and
 * every one at trim, snapshot and arena destroy (report.c's
 * sa__world_check); a broken rule aborts naming the structure and the rule
 * (invariant.c, a leaf). Release builds (NDEBUG) run none.
 */
#ifndef SA_INTERNAL_H
#define SA_INTERNAL_H

#include "arena.h"
#include "base/base.h"
#include "base/chain_table.h"
#include "base/device_sync.h"
#include "base/event_pool.h"
#include "base/hook.h"
#include "base/record.h"
#include "config.h"
#include "default_arena.h"
#include "free.h"
#include "driver/driver.h"
#include "large/free_span.h"
#include "large/mark.h"
#include "large/run.h"
#include "large/span.h"
#include "large/span_index.h"
#include "large/timeline.h"
#include "reclaim.h"
#include "registry.h"
#include "report.h"
#include "small/size_class.h"
#include "small/stream_arena.h"
#include "small/stream_return.h"
#include "small/superblock.h"
#include "small/thread_cache.h"
#include "trace.h"
#include "vm/physical.h"
#include "vm/va_space.h"

#endif /* SA_INTERNAL_H */
