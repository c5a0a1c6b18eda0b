/* The allocator's private headers, all of them, for the project's tests,
 * benchmarks, tools and plugins (#include "internal.h"). The allocator's own
 * files include instead the headers of their layer and those below, and
 * arena.h; tools/layers.py checks that. This header states what they share:
 * the words, the layers and the conventions.
 *
 * Glossary. The project's own words, as the code uses them.
 *   ahead       memory a growth maps beyond its request on a climb to a new
 *               live peak, for the next requests of the climb (run.c).
 *   arena       everything one device's allocator holds (struct sa_arena_s,
 *               arena.h); the global arena, as against a stream arena.
 *   batch       blocks freed on a stream other than their owner's, sent to
 *               the owner together behind one set of events (sa_deferred).
 *   bin         a size class's list: in a stream arena, its superblocks with
 *               free blocks; in a thread cache entry (tbin), cached blocks.
 *   bound       a thread cache entry bound to a stream arena holds a counted
 *               reference to it (xentries); binding happens on first use.
 *   carve       to cut a superblock's blocks, or a request, or a superblock
 *               (carve_in_spans), out of what is free.
 *   chunk       one driver allocation of physical memory (cuMemCreate),
 *               mapped only whole (sa_phys; its record in lists: sa_chunk).
 *   class       a size class: the block size a small request rounds up to.
 *   clean       no pending work can touch it: its events completed, its
 *               stream was released, or a device sync that started after it
 *               came back completed (dirty: not known clean yet).
 *   climb       a run of growths to new live peaks (a training step's
 *               first forward pass).
 *   cut         unmapping whole chunks out of a free span, which splits its
 *               run around the hole (run.c).
 *   descriptor  host memory that says what a page of the range belongs to
 *               (sa_desc): a superblock's or a run's; type-stable.
 *   detached    a thread cache entry of a destroyed arena: its arena is
 *               sa__detached_arena, which fails every fast-path test, and
 *               its thread frees it on its next slow path.
 *   doomed      marked by reap as about to be freed (a stream arena).
 *   empty       a superblock none of whose blocks is used.
 *   entry       a thread cache entry (tentry): one per (thread, arena,
 *               stream), what the fast paths read and write.
 *   epoch       the arena's count of stream arenas gone; an entry that saw
 *               an older one checks its binding before use.
 *   fence       one event recorded on a stream, inside a call that names it,
 *               for everything there that waits for one (unfenced: waiting).
 *   footprint   physical bytes held.
 *   footprint target  footprint_target times the peak (by default 1/64
 *               above it), past which the arena reshapes before it grows
 *               (physical.c's soft limit).
 *   gone        a stream arena whose stream was released or found destroyed:
 *               never looked up or driven again, freed once unreferenced.
 *   granule     the driver's allocation granularity (2 MiB on an H200).
 *   growth      mapping new or cached chunks where a request needs them.
 *   holder      the superblock a span was carved for: the live span names
 *               its descriptor, whose pages it took over (span.h).
 *   inbox       a stream arena's lock-free stack of incoming batches.
 *   lane        pending batches of one stream, oldest first: a drain asks
 *               only a lane's first whether its events completed.
 *   ledger      the remapping ledger: bytes created against bytes remapped,
 *               which bounds remapping for the footprint target.
 *   live        handed to the user (a block, a span); live bytes: their sum.
 *   mark        what a free span waits for before another stream reuses it:
 *               a free's (stream arena, ticket), or a recorded event.
 *   named       inside an API call that names the stream: the only place a
 *               driver call on it may happen.
 *   park        keep a batch on the stream that freed it until a named call
 *               gives it an event there (or a device sync makes it clean).
 *   peak        the highest live bytes so far.
 *   pool        a graph pool (pool_block.h): segments of the arena that it
 *               hands out as blocks, for graphs' captures.
 *   reap        free the stream arenas that are gone and hold nothing.
 *   record      sa_record_stream: a block is used by another stream too;
 *               recorded: its state byte and the side table say so.
 *   released    gone through sa_stream_release, which waited for the stream
 *               (synced): what it holds is clean.
 *   reshape     unmap free memory elsewhere whose work completed and map its
 *               chunks where a growth needs them, instead of new memory.
 *   run         a contiguous mapped range of the reserved space, tiled by
 *               spans in address order.
 *   segment     a graph pool's piece of the arena: one live span.
 *   settle      make something safe for a stream: wait for what it waits for
 *               (a free span's marks), or take in what completed.
 *   shed        hand a stream arena's empty superblocks to the global stack.
 *   slab        one chunk mapped for several superblocks of one size.
 *   span        one large allocation, or a free piece of a run.
 *   start       where a span freed into a free span began (double frees).
 *   stitch      map chunks back to back that need not lie together.
 *   stream arena  what one (arena, stream) owns: superblocks, its inbox,
 *               pending and parked batches, its timeline (stream_arena.h).
 *   stuck       a range whose unwind the driver refused: mapped, handed to
 *               no one, retried at every reclaim.
 *   superblock  a range carved into blocks of one size class.
 *   tbin        a thread cache entry's bin of one class.
 *   tentry      a thread cache entry.
 *   ticket      a point on a stream's timeline: its n-th span free.
 *   timeline    a stream's tickets and the ring of events recorded at them.
 *
 * Layers, top to bottom (each calls only the ones below it); the folders
 * are the tiers (the arena, small blocks, large blocks, virtual memory, the
 * services every tier uses, the device):
 *   pool.c                graph pools: the public calls, growth from the arena
 *   alloc.c               sa_alloc, its fast path; the out-of-memory loop,
 *                         sa_trim, sa_defragment
 *   free.c                sa_free, its fast path; sa_record_stream
 *   snapshot.c            sa_snapshot_write
 *   arena.c               arena life cycle, tuning, statistics
 *   report.c              memory summary: out-of-memory report, snapshot summary
 *   pool_block.c          graph pools' blocks, frees routed to them, the
 *                         registry of their segments
 *   reclaim.c             getting memory back: free superblocks and spans unmapped
 *   trace.c               the allocation trace (trace=PATH)
 *   registry.c            which arena an address belongs to (lock-free)
 *   small/thread_cache.c  per-thread caches keyed by (arena, stream)
 *   small/stream_arena.c  per-stream arenas: life cycle, refills, sheds, fences
 *   small/stream_return.c blocks back to their stream arena: from thread caches,
 *                         cross-stream batches (inbox, lanes, parking), empties
 *   small/superblock.c    carving superblocks into blocks; the global free stack
 *   large/kept.c          spans kept by the thread that freed them for its
 *                         stream's next request of their size; orphans
 *   large/span.c          large allocations: alloc, free, superblocks carved in
 *                         free spans, unmapping free memory
 *   large/grower.c        the thread that maps ahead of a climb (background growth)
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
 *   base/treap.c          treaps (the free-span and pool-block fit indexes)
 *   driver/driver.h       the device (src/driver/), the simulator behind it (src/sim/)
 *
 * Naming: sa_ is public, sa__ is internal across files, static functions
 * have no prefix. Fields that other threads read without the owner's lock
 * are _Atomic and prefixed x. Short names keep one meaning: the arena is
 * a, a stream arena sarena, a thread cache entry e, a superblock sb, a
 * span sp, a run r, a cross-stream batch batch, a descriptor desc, a
 * driver drv. A mode a call site passes is an enum (SA_NAMED, SA_WAIT),
 * not true or false.
 *
 * Comments say why, in whole sentences. What a driver does is a fine
 * reason ("refused on driver 580"); a measured figure (a timing, a cost per
 * operation, a trace's ratio) goes stale, so it lives in docs/NOTES.md,
 * dated, with the command that measured it, and the code cites it by name:
 * "See Note [Slabs]".
 *
 * Headers: one per file that other files call (foo.c's contract is foo.h,
 * beside it), each opening with what it owns, what it calls and who calls
 * it; a layer's state is a sub-struct of the arena, defined in its header
 * and gathered in arena.h. base/base.h has what every file uses.
 *
 * Invariants: each structure has a validator, sa__<structure>_check, in
 * the file that owns it, declared with that file's functions in its
 * header. Builds with asserts on (every test build, the sanitizers, the
 * fuzzer) run it where the structure must be whole (SA_VALIDATE,
 * SA_VALIDATE_PACED), and every one at trim, snapshot and arena destroy
 * (report.c's sa__world_check); a broken rule aborts naming the structure
 * and the rule (invariant.c, a leaf). Release builds (NDEBUG) run none.
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
#include "base/treap.h"
#include "config.h"
#include "default_arena.h"
#include "driver/driver.h"
#include "free.h"
#include "pool_block.h"
#include "large/free_span.h"
#include "large/grower.h"
#include "large/kept.h"
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
