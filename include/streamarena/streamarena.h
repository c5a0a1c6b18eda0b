/* streamarena: a stream-ordered GPU memory allocator with a per-thread
 * lock-free fast path.
 *
 * The contract is the one of cudaMallocAsync/cudaFreeAsync:
 *   - sa_alloc(a, &p, size, s) returns memory that work enqueued on stream s
 *     after the call may use; alignment is at least SA_ALIGNMENT bytes.
 *   - sa_free(p, s) says: once all work enqueued on s before this call has
 *     finished, p is no longer used. The memory may be handed out again at
 *     once to a later allocation on s, and to another stream t only after an
 *     event recorded on s at free time has completed, or after the allocator
 *     made t wait on that event on the device.
 *   - sa_record_stream(p, t): p is also used by work on t; reuse after the
 *     free also waits for t.
 *
 * A stream's lifetime. The library calls the driver on a stream only
 * inside a call that names it: sa_alloc, sa_free, sa_record_stream and
 * sa_stream_release on that stream, and sa_free of a block recorded on it.
 * So a stream may be destroyed at any time after the last such call that
 * it was part of has returned (its work still queued, or not, but see the
 * end of this paragraph for the handle CUDA reuses), with or without
 * sa_stream_release, by any thread, before or after the threads that used
 * it exit. What those threads cached for it, and blocks freed on
 * it, go to other streams only behind an event recorded in a later call on
 * the stream, or once memory is short (the out-of-memory path, sa_trim)
 * after a device-wide synchronize; sa_stream_release hands them back at
 * once. A new stream that gets a destroyed stream's handle gets its own
 * state in a thread that did not use the old stream: the arena compares
 * the driver's stream ids (cuStreamGetId) when a thread first uses a
 * handle, not on every call. CUDA hands the handle out again at once,
 * while the old stream's work still runs (measured on an H200); so a
 * stream whose queued work still uses memory allocated or freed on it must
 * be synchronized, or released with sa_stream_release, before it is
 * destroyed, or a thread that used it may hand that memory to the next
 * stream with its handle. Allocated on it too: a small block goes back to
 * the arena of the stream it was allocated on wherever it is freed (after
 * the events of its free, which that stream may wait for on the device),
 * and that stream's arena hands it out again in that stream's order. Work
 * on memory allocated on other streams (recorded with sa_record_stream)
 * may stay queued.
 *
 * CUDA graphs. Work captured into a graph (cuStreamBeginCapture) runs at
 * the graph's launches, which the allocator cannot follow: memory freed on
 * a stream while it is captured would be handed out again before the graph
 * runs. So allocate a graph's memory from a graph pool ("Graph pools"
 * below), which is made for it, or before its capture (or during it, on
 * a stream the thread used before the capture: a stream's first use on a
 * thread asks the driver for its id, which a capture refuses) and free it
 * after its last launch was enqueued, outside a capture. A call
 * that would record an event on, wait on, synchronize or ask the driver
 * about a stream that is being captured (a stream's first use on a thread,
 * a span's free, a full cross-stream batch, sa_record_stream naming it,
 * sa_stream_release) returns SA_ERR_STREAM_CAPTURING and changes nothing
 * (but for memory a large allocation mapped before the wait it needed was
 * refused: that stays, free for the next request), and the capture stays
 * intact (on CUDA the legacy stream, NULL, counts as
 * captured while a blocking stream of the context is: work on it would
 * join that capture); a call served from the thread cache asks
 * the driver nothing and cannot tell. The allocator's own event queries and
 * synchronizes run in the relaxed capture mode, so they do not invalidate a
 * capture another thread runs in the global mode. A device-wide
 * synchronize cannot avoid that: CUDA fails it during any capture of the
 * process and invalidates the capture. sa_trim and the out-of-memory path
 * (which synchronize the device) then go on without it, keeping what only
 * it would have made safe; an allocation on a capturing stream does not
 * synchronize at all, and keeps the thread's cached blocks of that stream
 * (their return would need an event on it); sa_arena_destroy returns
 * SA_ERR_STREAM_CAPTURING after releasing everything, as for any failed
 * synchronize.
 *
 * Loaded with dlopen (a Python or framework plugin), the library may be
 * closed with dlclose at any time, but it stays mapped until the process
 * ends (it is linked with -z nodelete): every thread that used it runs its
 * code when it exits. A later dlopen gets the same copy back.
 *
 * Every function is thread-safe unless its comment says otherwise. No
 * function aborts on bad input: failures come back as an sa_status.
 *
 * Sections: status codes; streams and backends; configuration; arenas;
 * allocation; graph pools; default arenas (drop-in calls); tuning and statistics;
 * diagnostics.
 */
#ifndef STREAMARENA_STREAMARENA_H
#define STREAMARENA_STREAMARENA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SA_VERSION_MAJOR 0
#define SA_VERSION_MINOR 1
#define SA_VERSION_PATCH 0

/* Every pointer handed out is aligned to at least this many bytes. */
#define SA_ALIGNMENT 256

/* ------------------------------------------------------------------------
 * Status codes
 * ---------------------------------------------------------------------- */
typedef enum sa_status_e {
  SA_OK = 0,
  SA_ERR_INVALID_ARGUMENT,  /* NULL out-pointer, value out of range, ... */
  SA_ERR_OUT_OF_MEMORY,     /* nothing left after reclaiming, or impossible size */
  SA_ERR_INVALID_POINTER,   /* not a block start of any live arena */
  SA_ERR_DOUBLE_FREE,       /* the block is already free */
  SA_ERR_UNKNOWN_STREAM,    /* the backend does not know this stream, or it
                               belongs to another device than the arena's
                               (NULL too: see sa_stream) */
  SA_ERR_NO_DEVICE,         /* no usable device (or driver) for this backend */
  SA_ERR_DRIVER,            /* the driver failed a call; see sa_last_driver_error */
  SA_ERR_NOT_READY,         /* queried work has not completed yet */
  SA_ERR_BAD_CONFIG,        /* unknown configuration key or bad value */
  SA_ERR_LIVE_BLOCKS,       /* arena destroyed with blocks still allocated */
  SA_ERR_STREAM_ORDER,      /* the stream-order checker caught a violation */
  SA_ERR_NOT_SUPPORTED,     /* the backend cannot do this */
  SA_ERR_INTERNAL,          /* a broken internal invariant (a bug: report it) */
  SA_ERR_STREAM_CAPTURING,  /* the stream is being captured into a CUDA graph,
                               which the allocator cannot follow ("CUDA graphs"
                               below); nothing changed */
  SA_STATUS_COUNT_
} sa_status;

/* A short, static, human-readable description ("out of memory"). */
const char *sa_status_string(sa_status status);

/* The last driver error code seen by the calling thread (a CUresult on the
 * CUDA backend, an errno-like code on the host backend) and the driver's
 * name for it. Useful after SA_ERR_DRIVER. */
int sa_last_driver_error(const char **name);

/* ------------------------------------------------------------------------
 * Streams and backends
 * ---------------------------------------------------------------------- */

/* A stream handle: a CUstream / cudaStream_t on the CUDA backend
 * (CU_STREAM_PER_THREAD, another stream on each thread, is
 * SA_ERR_UNKNOWN_STREAM), or a stream made by sa_host_stream_create
 * (include/streamarena/host.h) on the host simulator.
 *
 * NULL (on CUDA also CU_STREAM_LEGACY) names the legacy default stream of
 * the calling thread's current context: CUDA has one per context, the
 * simulator one per device, with the thread's current device
 * (sa_host_set_device) as its current context. An arena accepts NULL where
 * that stream is its device's: the device's primary context is current on
 * the thread (the simulator: the arena's device is), or no context is
 * current at all, and then NULL is the arena's device's legacy stream.
 * Where another context is current (another device's, or on CUDA a context
 * of your own on the arena's device, which has a legacy stream of its
 * own), every call that names NULL (sa_alloc, sa_free, sa_record_stream,
 * sa_stream_release, sa_malloc_async, sa_free_async) returns
 * SA_ERR_UNKNOWN_STREAM and changes nothing, as for an explicit stream of
 * another device; sa_last_driver_error names both devices. So
 * sa_free(p, NULL) of device 1's block from a thread with device 0 current
 * is refused, not ordered after device 1's legacy stream while the
 * thread's own work on stream 0 (device 0's) may still use p: pass a stream
 * of the block's device, or make that device current for the call. Every
 * call checks, as a thread may switch devices between calls. A thread with
 * no context: NULL is the arena's device's legacy stream, but the CUDA
 * runtime's first call on that thread makes device 0 current, and its
 * kernels on stream 0 then go to device 0's. A NULL that sa_record_stream
 * accepted keeps naming the stream it named then, at any later free. */
typedef void *sa_stream;

typedef enum sa_backend_e {
  SA_BACKEND_AUTO = 0, /* CUDA where a device is usable, otherwise host */
  SA_BACKEND_CUDA,     /* libcuda.so.1, loaded at run time */
  SA_BACKEND_HOST      /* the CPU simulator of the CUDA driver */
} sa_backend;

const char *sa_backend_name(sa_backend backend);

/* ------------------------------------------------------------------------
 * Configuration
 * ---------------------------------------------------------------------- */

/* Flags for sa_config.flags. */
#define SA_FLAG_CHECK_STREAM_ORDER 0x1u /* host backend: verify every handout */
#define SA_FLAG_OOM_REPORT 0x2u         /* write a report to stderr on OOM */
#define SA_FLAG_EXACT_GROWTH 0x4u       /* a growth maps only what its request
                                           misses: nothing ahead on a climb to
                                           a new live peak, nor for a small
                                           request below it (docs/DEFRAG.md) */
/* Each thread keeps the last span (large allocation, at most 512 MiB) it
 * freed on a stream, for that stream's next request of the same size,
 * which it then serves without a lock: a loop of one large size on one
 * stream costs about what a small block's pair does. Only a span that a
 * free and a best fit would put back in its place is kept (no free memory
 * below it; above it, none unless no smaller free span fits its size),
 * with other streams holding spans only within the footprint target or
 * budget, and only while the thread stays on the fast paths: its next slow-path call into the arena (a request of another
 * size, a small block's refill, another free), its out-of-memory pass or
 * sa_trim gives it back; until then it serves no other stream or thread; a span kept by a thread that exited waits for its stream's next
 * call, its release, or a device-wide synchronize (sa_trim's). A thread
 * whose last 4 spans kept all went back unused (requests of ever new
 * sizes) keeps one free in 16 until one is reused. Free and double-free
 * rules do not change. On by default (sa_config_init sets it;
 * keep_spans=0 or clearing the flag turns it off). */
#define SA_FLAG_KEEP_SPANS 0x8u
/* A climb to a new live peak finds memory mapped ahead by a thread of the
 * arena's own: where a large request taken from the free top of a range
 * leaves less there than 1/512 of what the arena holds (at least 4
 * granules; within the footprint target; not for requests above half of
 * that, under a budget or with SA_FLAG_EXACT_GROWTH), the thread, started
 * at the first such climb and ended by sa_arena_destroy, creates and maps
 * what is missing above it, holding the arena's lock only to claim the
 * range and to publish it, never across a driver call. A large allocation
 * that would grow while it works waits for it (the range is where its own
 * growth would go); sa_trim and the out-of-memory path too. Off by default
 * (background_growth=1 turns it on; docs/DEFRAG.md). */
#define SA_FLAG_BACKGROUND_GROWTH 0x10u

/* sa_config.footprint_target's named points (sa_config_parse:
 * footprint_target=tight|balanced|fast). */
#define SA_FOOTPRINT_TIGHT 1.015625 /* 1 + 1/64: the default */
#define SA_FOOTPRINT_BALANCED 1.5
#define SA_FOOTPRINT_FAST 2.0 /* the fastest: a larger target acts as it */
#define SA_FOOTPRINT_MAX 8.0

/* sa_config.peer_access: every device of the backend. */
#define SA_PEER_ACCESS_ALL UINT64_MAX

struct sa_arena_s;

/* Called when an allocation cannot be satisfied after the allocator has
 * reclaimed what it can. Return nonzero to ask for one more attempt (after
 * freeing memory, say), at most 8 times for one allocation; zero to let the
 * allocation fail. Not called for a size that no attempt can fit under the
 * physical cap: memory is mapped in whole granules (sa_device_granularity),
 * so a large request takes its size rounded up to a granule, a small one
 * at least a granule (under max_physical=5MiB with 2 MiB granules, nothing
 * above 4 MiB fits). Called without any allocator lock held: it may call
 * sa_free and sa_trim. */
typedef int (*sa_oom_callback)(struct sa_arena_s *arena, size_t size,
                               sa_stream stream, void *user_data);

typedef struct sa_config_s {
  int device;                     /* CUDA device ordinal; default 0 */
  sa_backend backend;             /* default SA_BACKEND_AUTO */
  uint64_t peer_access;           /* devices that may also read and write the
                                     arena's memory: bit i = device i (0-63),
                                     SA_PEER_ACCESS_ALL = all; default 0 */
  size_t superblock_size;         /* default: allocation granularity (2 MiB); a
                                     class's first superblocks on a stream are
                                     smaller (one thread-cache refill, at least
                                     256 KiB, doubling) without a budget or
                                     chunk_size */
  size_t va_reserve_bytes;        /* default: 0 = 4 x device memory */
  size_t max_physical_bytes;      /* default: 0 = the whole device */
  size_t reserve_limit_bytes;     /* soft budget: allocations reuse free
                                     memory by remapping rather than grow the
                                     physical footprint past it, and pass it
                                     only when that is not enough; default
                                     0 = the footprint target, 1/64 above
                                     the highest live bytes so far (plus
                                     64 MiB, or 16 with chunk_size set),
                                     remapping within a ledger */
  double footprint_target;        /* the footprint/speed trade without a
                                     reserve_limit: the physical bytes held
                                     stay within this many times the highest
                                     live bytes so far (plus 64 MiB above
                                     1 and below 1.125, 16 MiB at 1 and
                                     from 1.125, 128 MiB from 1.5; 16 MiB
                                     with chunk_size) before
                                     the arena reshapes, and a climb to a new
                                     live peak maps ahead in proportion, so
                                     a larger target buys fewer growths and
                                     remaps; at 2, superblocks are carved in
                                     free span memory where a span fits
                                     them. From 1 to 8, but a target above 2
                                     acts as 2: the room past it would only
                                     be mapped ahead and left unused, and
                                     memory costs driver time by its bytes
                                     (docs/DEFRAG.md). SA_FOOTPRINT_TIGHT
                                     (1 + 1/64, the default), _BALANCED
                                     (1.5, about RMM's pool's footprint on
                                     a training trace), _FAST (2);
                                     0 = the default. Not with a
                                     reserve_limit; under max_physical the
                                     budget's rules apply (docs/DEFRAG.md) */
  size_t release_threshold_bytes; /* unmapped physical bytes sa_defragment keeps
                                     cached (sa_trim: its keep_bytes); default 0 */
  size_t large_threshold;         /* larger requests get their own span;
                                     default 0 = superblock_size / 2; at
                                     most 64 MiB, the largest size class
                                     (a larger value acts as 64 MiB) */
  size_t chunk_size;              /* physical memory for large requests is
                                     created in chunks of this size (a
                                     multiple of the granularity), the unit
                                     a reshape can take back: smaller chunks
                                     keep the footprint lower where request
                                     sizes keep changing, at ~60-80 us of
                                     driver time per chunk on an H200;
                                     default 0 = one chunk per growth, or a
                                     granule under max_physical or
                                     reserve_limit (docs/DEFRAG.md) */
  size_t initial_physical_bytes;  /* physical memory mapped when the arena is
                                     created, one free range for large
                                     requests (rounded up to the
                                     granularity), as a pool takes its
                                     memory up front: requests that fit in
                                     it make no driver call, and the
                                     footprint target starts from it; a trim
                                     gives it back like any free memory;
                                     default 0 = none */
  unsigned flags;                 /* SA_FLAG_*; default 0 */
  char trace_path[256];           /* non-empty: write an allocation trace */
  sa_oom_callback oom_callback;   /* default NULL */
  void *oom_user_data;
} sa_config;

/* Fill *config with the defaults. */
void sa_config_init(sa_config *config);

/* Apply a comma-separated list of key=value pairs to *config, e.g.
 * "backend=host,superblock_size=4MiB,release_threshold=1GiB".
 * Keys: device, backend (auto|cuda|host), peer_access (all|none|devices
 * joined by '+', e.g. 1+2), superblock_size, va_reserve, max_physical,
 * reserve_limit, footprint_target (a number from 1 to 8 such as 1.5, or
 * tight, balanced, fast), release_threshold, large_threshold, chunk_size,
 * initial_physical, check_stream_order (0|1), oom_report (0|1),
 * exact_growth (0|1), trace (a file path).
 * Sizes take an optional suffix: B, KiB, MiB, GiB, TiB (also K, M, G, T).
 * On SA_ERR_BAD_CONFIG, *config is unchanged and, if err is not NULL, a
 * message naming the offending key or value is written to err (at most
 * err_size bytes, NUL-terminated). */
sa_status sa_config_parse(sa_config *config, const char *spec, char *err,
                          size_t err_size);

/* Check config (NULL: the defaults) against its backend and device as
 * sa_arena_create does, creating nothing. Returns SA_OK or the status
 * sa_arena_create would return for it; if err is not NULL, a message of at
 * most err_size bytes (NUL-terminated) names the key, its value and the rule,
 * e.g. "max_physical=4MiB: below superblock_size=8MiB; a superblock must fit
 * under the physical cap". The rules:
 *   superblock_size   a multiple of the granularity (sa_device_granularity),
 *                     at most 1 GiB;
 *   large_threshold   at least 256; a request up to it rounds up to a size
 *                     class (at most 12.5% more) that must fit in a
 *                     superblock: superblock_size itself when it is a power
 *                     of two, less for some other sizes (the message names
 *                     the largest that fits); above 64 MiB it acts as
 *                     64 MiB, the largest size class;
 *   chunk_size        a multiple of the granularity, at most 2 GiB (0: the
 *                     default);
 *   footprint_target  0 (the default) or a number from 1 to 8, and not
 *                     with reserve_limit (a budget replaces the target);
 *   max_physical      (or the device's memory) at least superblock_size;
 *   initial_physical  in whole granules, at most max_physical and the
 *                     device's memory, and at most reserve_limit when that
 *                     is set;
 *   va_reserve        at least superblock_size and initial_physical, at most
 *                     64 TiB;
 *   trace             a file that can be opened for writing. */
sa_status sa_config_check(const sa_config *config, char *err, size_t err_size);

/* The allocation granularity of backend on device, in bytes: the unit of
 * physical memory and of superblock_size (2 MiB on current GPUs). Errors as
 * sa_arena_create's for that backend and device. */
sa_status sa_device_granularity(sa_backend backend, int device, size_t *bytes);

/* ------------------------------------------------------------------------
 * Arenas
 * ---------------------------------------------------------------------- */
typedef struct sa_arena_s sa_arena;

/* Create an arena on config->device with config->backend (NULL config:
 * defaults). Reserves the virtual range; maps no physical memory yet but
 * initial_physical_bytes.
 * Every mapping it makes (growth, remapping) is readable and writable by its
 * device and by the devices of config->peer_access.
 * Errors: SA_ERR_INVALID_ARGUMENT, SA_ERR_BAD_CONFIG (a value breaks a rule:
 * sa_config_check on the same config says which and why), SA_ERR_NO_DEVICE
 * (also a peer_access device the backend does not have),
 * SA_ERR_NOT_SUPPORTED (a peer_access device cannot access this device's
 * memory; sa_last_driver_error names it), SA_ERR_DRIVER,
 * SA_ERR_OUT_OF_MEMORY. */
sa_status sa_arena_create(const sa_config *config, sa_arena **out);

/* Release everything the arena holds back to the driver, after waiting for
 * the work that may still use it. Blocks still allocated are released too;
 * the return value is then SA_ERR_LIVE_BLOCKS (and the count is written to
 * stderr), otherwise SA_OK. That status reports a leak in the caller, not a
 * failed destroy: nothing could free those blocks later (their arena is
 * gone), so keeping their memory would only leak it for good. A driver call
 * that fails (the wait for the device included: a context that a kernel
 * fault broke) makes the return value its status (SA_ERR_DRIVER, or
 * SA_ERR_OUT_OF_MEMORY where the driver says so, SA_ERR_STREAM_CAPTURING
 * during a capture: "CUDA graphs" above), ahead of the leak; the
 * arena is released all the same, and what the driver refused to unmap or
 * release stays with the driver. SA_ERR_BAD_CONFIG: its trace file could not
 * be written in full (a full disk), so it lacks lines (a line on stderr
 * says why).
 * The arena must not be used concurrently with or after this call. NULL is
 * a no-op returning SA_OK. */
sa_status sa_arena_destroy(sa_arena *arena);

/* The backend an arena runs on (resolved: never SA_BACKEND_AUTO, but for a
 * NULL arena). */
sa_backend sa_arena_backend(const sa_arena *arena);

/* The arena's allocation granularity in bytes (0 for NULL). */
size_t sa_arena_granularity(const sa_arena *arena);

/* Why it runs there, for a program's first log line: "backend set in the
 * configuration", "STREAMARENA_BACKEND=host", "backend auto, CUDA usable",
 * or, where SA_BACKEND_AUTO fell back to the host simulator, the cause
 * ("backend auto, CUDA not usable: libcuda.so.1 not found"). Valid while the
 * arena lives; "" for NULL. */
const char *sa_arena_backend_reason(const sa_arena *arena);

/* ------------------------------------------------------------------------
 * Allocation
 * ---------------------------------------------------------------------- */

/* Allocate size bytes usable by work enqueued on stream after this call.
 * size 0 returns a NULL pointer and SA_OK (as cudaMallocAsync may).
 * Errors: SA_ERR_INVALID_ARGUMENT (NULL arena or out), SA_ERR_OUT_OF_MEMORY
 * (also for sizes no device can hold), SA_ERR_UNKNOWN_STREAM, SA_ERR_DRIVER,
 * SA_ERR_STREAM_ORDER (checker), SA_ERR_STREAM_CAPTURING ("CUDA graphs"
 * above). On error *out is set to NULL. */
sa_status sa_alloc(sa_arena *arena, void **out, size_t size, sa_stream stream);

/* Free p in stream order on stream (see the contract at the top). The arena
 * is found from the address (arenas own disjoint reserved ranges): like
 * free() and cudaFreeAsync, a free needs nothing the code that frees (a
 * deleter, another thread) may not have; only an allocation must say which
 * arena, i.e. which device and configuration, the memory comes from.
 * NULL is a no-op returning SA_OK.
 * Errors: SA_ERR_INVALID_POINTER (not the start of a block of a live arena:
 * foreign, interior, or after its arena was destroyed), SA_ERR_DOUBLE_FREE,
 * SA_ERR_UNKNOWN_STREAM, SA_ERR_DRIVER, SA_ERR_OUT_OF_MEMORY (host
 * bookkeeping), SA_ERR_STREAM_CAPTURING ("CUDA graphs" above). On error
 * nothing changes.
 * A concurrent double free of the same pointer from two threads is a race in
 * the caller; it is detected when the frees are ordered. */
sa_status sa_free(void *p, sa_stream stream);

/* Mark p as also used by work on stream other: at free time the allocator
 * records an event on other too, and reuses the memory only after it (a
 * small block's own stream needs none: the block goes back to it). So
 * other must not be destroyed before p is freed, unless it was released
 * with sa_stream_release first (which waits for it and drops the record);
 * nor after, with that work queued, if p was allocated on other (the rule
 * at the top of this header).
 * Errors: SA_ERR_INVALID_POINTER, SA_ERR_DOUBLE_FREE (p is free),
 * SA_ERR_UNKNOWN_STREAM, SA_ERR_DRIVER (asking the driver about other
 * failed), SA_ERR_OUT_OF_MEMORY (host bookkeeping), SA_ERR_STREAM_CAPTURING
 * (other is being captured). On error nothing changes. */
sa_status sa_record_stream(void *p, sa_stream other);

/* Hand back at once what the arena holds for stream, which will not be
 * used again: this call synchronizes the stream (cuStreamSynchronize; no
 * event is recorded), then every thread's cached blocks and open
 * cross-stream batches for it, and its empty superblocks, are free for
 * every stream, within sa_trim's reach; empty superblocks carved in free
 * span memory (past the footprint target) whose work is known done go back
 * to those free spans, whole again for large requests (no driver call).
 * Blocks still allocated from it stay valid and may be freed later on any
 * other stream. Blocks recorded on it (sa_record_stream) no longer wait for
 * it. No thread may use the stream during the call (a later use starts
 * over, as a stream new to the arena); destroying it afterwards is the
 * caller's.
 * Optional: a stream destroyed without it is safe too (see the top of this
 * header), its memory just comes back later. Releasing a stream the arena
 * has not seen is SA_OK; so is releasing a new stream that got the handle
 * of a destroyed one the arena saw (the driver's stream ids differ): what
 * the old one left waits for its events, not for this synchronize. Errors:
 * SA_ERR_INVALID_ARGUMENT, SA_ERR_UNKNOWN_STREAM (the driver no longer knows
 * a stream the arena saw: destroyed before this call, the caller's error;
 * the host simulator says so, while CUDA may crash on a destroyed handle it
 * has not handed out again, as any call on one did on an H200),
 * SA_ERR_DRIVER (the stream id query or the synchronize failed),
 * SA_ERR_STREAM_CAPTURING (the stream is being captured); on any of them,
 * nothing changed. */
sa_status sa_stream_release(sa_arena *arena, sa_stream stream);

/* ------------------------------------------------------------------------
 * Graph pools: memory for CUDA graphs, allocated while a stream is captured
 * (PyTorch's private pools, MempoolId_t).
 *
 * A pool takes segments from its arena (whole granules, held as live large
 * allocations of the arena) and hands out blocks of them. Where a segment's
 * last block is free and the memory right above the segment is free or
 * unmapped in the arena, a growth extends that segment in place, so that
 * the free top and the growth are one block (an arena that traces takes a
 * new segment instead). What is promised:
 *   - A block's address is the pool's until the pool's last release: no
 *     other pool, no sa_alloc of the arena and no other block of the pool
 *     gets that memory meanwhile, live or freed. So an address that a
 *     capture baked into a graph stays the graph's for every replay.
 *   - sa_pool_alloc works while stream is being captured into a graph, in
 *     any capture mode, on a stream the arena never saw: it asks the driver
 *     only whether stream is being captured (cuStreamIsCapturing), nothing
 *     that a capture refuses (the pool grows on a stream of its own, which
 *     no capture names, and waits for that stream's work on the host; it
 *     never synchronizes the device). It works outside captures too, where
 *     it may make stream wait for an event on the device (below).
 *   - sa_free(p, s) of a pool's block gives it back to its pool, never to
 *     the arena. Freed while s is captured, the block is reused only by
 *     later sa_pool_alloc calls on s (capture order: the graph's own work
 *     on s orders the reuse). Freed outside a capture, it is reused at once
 *     on s, and on another stream once an event recorded on s at the free
 *     completed, or behind a wait on it that the pool enqueues on that
 *     stream (not while that stream is captured: then the pool grows).
 *     sa_record_stream(p, other) works as for any block: the free records
 *     an event on other too, and the block is reused only after it.
 *   - The last release (sa_pool_release) returns the pool's segments to
 *     the arena in stream order on the release's stream: after every
 *     earlier release's stream point, every pool free's event, and the work
 *     enqueued on that stream before the call. The host never waits. The
 *     arena cannot see a graph's launches: launch a pool's graphs on the
 *     release's stream, or on streams it waits for (cuStreamWaitEvent)
 *     before the release, or release each use on the stream its graph was
 *     launched on. Blocks still live at the last release stay valid: the
 *     segments return when the last of them is freed, in the order of that
 *     free's stream (if that stream is being captured then, they stay the
 *     pool's until the arena is destroyed).
 *   - Every function is thread-safe; several threads may allocate from and
 *     free into one pool concurrently (one lock per pool; the arena's fast
 *     paths never take it).
 * The arena's statistics count a pool's segments as live large
 * allocations; sa_pool_get_stats says how they are used.
 * A pool handle stays readable until its arena is destroyed: a call on a
 * pool after its last release is SA_ERR_INVALID_ARGUMENT, changing
 * nothing. sa_arena_destroy releases every pool of the arena (released or
 * not) with the rest of its memory, after waiting for the device; the
 * pool handles are invalid afterwards. Pools left are no leak of the
 * caller's, but their live blocks are: SA_ERR_LIVE_BLOCKS counts them.
 * No call takes both an arena and a pool: a pool is its arena's (a block
 * of it is freed with sa_free like any, the arena found by address).
 * ---------------------------------------------------------------------- */
typedef struct sa_pool_s sa_pool;

/* A new pool of arena, with one use (released by sa_pool_release).
 * Errors: SA_ERR_INVALID_ARGUMENT (NULL arena or out), SA_ERR_OUT_OF_MEMORY
 * (host), SA_ERR_DRIVER (the pools' stream, made with the arena's first
 * pool); on error *out is NULL. */
sa_status sa_pool_create(sa_arena *arena, sa_pool **out);

/* One more use of pool (another capture shares it): the pool lives until
 * every use was released. Errors: SA_ERR_INVALID_ARGUMENT (NULL, or a pool
 * whose last use was released). */
sa_status sa_pool_retain(sa_pool *pool);

/* Release one use of pool on stream. Not the last: an event recorded on
 * stream, which the last release orders after. The last: no allocation
 * from the pool any more; its segments go back to the arena as the section
 * above says. Errors: SA_ERR_INVALID_ARGUMENT (NULL, or released already),
 * SA_ERR_UNKNOWN_STREAM, SA_ERR_STREAM_CAPTURING (stream is being
 * captured: release after the capture ended), SA_ERR_DRIVER,
 * SA_ERR_OUT_OF_MEMORY (host); on error the use stays (segments returned
 * before a failure of the last release stay returned: they held no live
 * block). */
sa_status sa_pool_release(sa_pool *pool, sa_stream stream);

/* Allocate size bytes from pool for work enqueued on stream after this
 * call (during a capture of stream: for the graph's work). size 0 returns a
 * NULL pointer and SA_OK. Alignment: 512 bytes. Errors:
 * SA_ERR_INVALID_ARGUMENT (NULL pool or out, or a released pool),
 * SA_ERR_OUT_OF_MEMORY (also for sizes no device can hold),
 * SA_ERR_UNKNOWN_STREAM, SA_ERR_DRIVER, SA_ERR_STREAM_ORDER (checker). On
 * error *out is NULL and nothing changed (but segments the pool grew by
 * stay the pool's, free). Out of memory, the pool's growth reclaims what
 * the arena can without waiting for the device and never calls the
 * arena's oom_callback: a capture may be underway, which a device-wide
 * wait, or an sa_trim in the callback, would end. */
sa_status sa_pool_alloc(sa_pool *pool, void **out, size_t size, sa_stream stream);

/* Allocate size bytes at p from pool's free memory on stream, as
 * sa_pool_alloc would there: p a multiple of 512 where every byte of
 * [p, p + size rounded up to 512) is free in one of pool's segments and
 * stream may take it without a wait (clean, or freed on stream). For
 * restoring a pool's state as it was (PyTorch's setCheckpointPoolState:
 * CUDA graph trees give tensors back the addresses a recorded graph
 * uses). The pool never grows for it. Errors: SA_ERR_INVALID_ARGUMENT (NULL
 * or misaligned p, size 0, a range not free for stream, or the pool's last
 * use released), SA_ERR_UNKNOWN_STREAM, SA_ERR_OUT_OF_MEMORY (host),
 * SA_ERR_STREAM_ORDER (the checker, where it runs); then no block is
 * allocated. */
sa_status sa_pool_alloc_at(sa_pool *pool, void *p, size_t size, sa_stream stream);

/* Call fn once for each live block of pool (PyTorch's
 * checkPoolLiveAllocations): its address, the size asked for, the stream
 * it was allocated on. fn runs after the pool's lock was let go, on a copy:
 * it may call any function. Errors: SA_ERR_INVALID_ARGUMENT (NULL pool or
 * fn), SA_ERR_OUT_OF_MEMORY (host). */
typedef void (*sa_pool_block_fn)(void *p, size_t size, sa_stream stream, void *user);
sa_status sa_pool_live(sa_pool *pool, sa_pool_block_fn fn, void *user);

/* A block of a pool's segment, as sa_pool_segments reports it. */
typedef enum sa_pool_block_state_e {
  SA_POOL_BLOCK_FREE = 0,    /* free for the pool's next allocations */
  SA_POOL_BLOCK_LIVE = 1,    /* handed out */
  SA_POOL_BLOCK_PENDING = 2  /* freed, waiting for work on streams that
                                sa_record_stream named */
} sa_pool_block_state;

typedef struct sa_pool_block_info_s {
  void *p;
  size_t size;               /* a multiple of 512 */
  size_t request;            /* live: the size asked for, else 0 */
  sa_stream stream;          /* live: allocated on; free or pending: the stream
                                that may take it at once, NULL for any */
  sa_pool_block_state state;
} sa_pool_block_info;

/* Call fn once for each segment of pool, in no particular order: where it
 * starts, its bytes, and its blocks in address order, which tile it (a
 * snapshot, PyTorch's memory_snapshot). fn runs after the pool's lock was
 * let go, on a copy valid during the call: it may call any function.
 * Errors: SA_ERR_INVALID_ARGUMENT (NULL pool or fn), SA_ERR_OUT_OF_MEMORY
 * (host). */
typedef void (*sa_pool_segment_fn)(void *base, size_t size, const sa_pool_block_info *blocks,
                                   size_t nblocks, void *user);
sa_status sa_pool_segments(sa_pool *pool, sa_pool_segment_fn fn, void *user);

typedef struct sa_pool_stats_s {
  size_t reserved_bytes;   /* the segments' bytes */
  size_t segments;
  size_t live_bytes;       /* live blocks' bytes (multiples of 512) */
  size_t live_requested;   /* the sizes their allocations asked for */
  size_t live_blocks;
  size_t free_bytes;       /* free blocks' bytes (pending ones not) */
  size_t free_blocks;
  size_t uses;             /* uses not released yet */
} sa_pool_stats;

/* The pool's counts now (also after its last release, until the arena is
 * destroyed). Errors: SA_ERR_INVALID_ARGUMENT (NULL pool or out). */
sa_status sa_pool_get_stats(sa_pool *pool, sa_pool_stats *out);

/* ------------------------------------------------------------------------
 * Default arenas: drop-in calls mirroring cudaMallocAsync/cudaFreeAsync.
 * One arena per device, created at first use with the configuration in the
 * environment variable STREAMARENA_CONF (sa_config_parse syntax; its device
 * key is ignored). sa_malloc_async uses the calling thread's current device:
 * the one of the current CUDA context (cudaSetDevice, cuCtxSetCurrent), else
 * the host simulator's (sa_host_set_device), else 0. Its stream must belong
 * to that device: a stream of another device is SA_ERR_UNKNOWN_STREAM.
 * ---------------------------------------------------------------------- */
sa_status sa_malloc_async(void **out, size_t size, sa_stream stream);
sa_status sa_free_async(void *p, sa_stream stream);
/* The default arena of device (created if needed): devices 0 to 63, a
 * larger one is SA_ERR_INVALID_ARGUMENT (so is sa_malloc_async there). */
sa_status sa_default_arena(int device, sa_arena **out);
/* Destroy every default arena (at exit, say), as sa_arena_destroy does:
 * no other thread may use them meanwhile (sa_malloc_async, sa_free_async
 * or any call on a default arena's block or on what sa_default_arena
 * returned). A later sa_malloc_async creates a fresh one. */
void sa_default_arenas_shutdown(void);

/* ------------------------------------------------------------------------
 * Tuning and statistics
 * ---------------------------------------------------------------------- */

/* Superblocks carved after this call have the given size (a class's first
 * ones on a stream smaller, as superblock_size says); existing ones
 * keep theirs (a size class that needs more than an existing empty
 * superblock holds gets a new one). The large-allocation threshold follows
 * (half the size, at most 64 MiB) unless it was set explicitly. The rules of
 * sa_config_check's superblock_size hold, against the arena's physical cap,
 * range and explicit threshold. Errors: SA_ERR_INVALID_ARGUMENT. */
sa_status sa_set_superblock_size(sa_arena *arena, size_t bytes);

/* Give cached physical memory back to the driver: free memory is unmapped,
 * then unmapped chunks are released (largest first, whole) until at most
 * keep_bytes of them stay. A chunk of which a part is in use stays mapped,
 * its free part counted in cached_bytes. Memory is released only once the
 * work that may use it has completed: this call waits for all of the
 * device's work (a device-wide synchronize, as PyTorch's empty_cache does),
 * after which also what exited threads and destroyed streams left behind
 * is free. */
sa_status sa_trim(sa_arena *arena, size_t keep_bytes);

/* Return empty superblocks and cached chunks above release_threshold_bytes,
 * and coalesce free virtual ranges, without waiting: memory that came back
 * outside a call on its stream (a thread's exit, say) waits for sa_trim.
 * So do the latest frees of a stream that is alone in taking large
 * allocations, which mark their memory without an event until one of its
 * calls records one: this call asks for it, and a later one, once that
 * work ran, returns the memory. Runs by itself on the out-of-memory path. */
sa_status sa_defragment(sa_arena *arena);

typedef struct sa_stats_s {
  size_t live_bytes, live_bytes_peak; /* bytes of live allocations: a small block
                                         counts its size class (300 B counts 512),
                                         a large one the bytes requested */
  size_t reserved_bytes, reserved_bytes_peak; /* physical bytes held from the driver */
  size_t cached_bytes;        /* physical bytes held and not in use: unmapped
                                 chunks (the chunk cache), empty superblocks, free
                                 slots of slabs (superblocks mapped together) and
                                 free large spans (not free blocks in partly used
                                 superblocks) */
  size_t va_used_bytes;       /* reserved virtual range in use (spans + superblocks) */
  size_t va_reserved_bytes;   /* the whole reserved virtual range */
  uint64_t alloc_count, free_count;
  uint64_t fast_allocs, fast_frees; /* served from the thread cache */
  double fast_path_ratio;     /* (fast_allocs + fast_frees) / (allocs + frees) */
  uint64_t large_allocs;      /* allocations above large_threshold: spans, never
                                 the fast path (so they bound fast_path_ratio) */
  size_t superblocks_total;   /* carved and mapped: active + empty */
  size_t superblocks_active;  /* owned by a stream and not empty: some blocks live,
                                 in a thread's cache or waiting for an event (so
                                 nonzero with nothing live while threads cache
                                 blocks; sa_trim gives back the caller's) */
  size_t superblocks_empty;   /* mapped, every block free: kept by a stream or on
                                 the global stack */
  size_t large_spans;         /* live large allocations */
  size_t chunks_total;        /* physical chunks held */
  size_t deferred_frees;      /* blocks freed on another stream (or recorded) that
                                 reached their stream, waiting for an event */
  size_t events_in_flight;    /* recorded, completion not yet observed */
  size_t streams;             /* stream arenas alive (not released) */
  uint64_t oom_events;        /* allocations that failed for lack of memory */
  uint64_t defragmentations;  /* reclaim passes: sa_defragment and sa_trim calls,
                                 and the allocator's own when an allocation
                                 passes a limit (one per reclaiming step of
                                 docs/DEFRAG.md's loop) */
  uint64_t background_growths; /* ranges mapped ahead by the arena's thread
                                  (SA_FLAG_BACKGROUND_GROWTH), and their bytes */
  size_t background_bytes;
} sa_stats;

/* A consistent-enough snapshot: counters kept by other threads are read
 * without stopping them, so a concurrent run may be off by its in-flight
 * operations (superblocks_active + superblocks_empty is superblocks_total
 * all the same, and live_bytes_peak is never below live_bytes). Each thread
 * publishes its live bytes once they stray more than 256 KiB plus the block
 * just counted from what it published, whatever streams it uses: live_bytes
 * is exact for the calling thread's own allocations and within 256 KiB plus
 * the largest small block (the large-allocation threshold) per other
 * thread, or with keep_spans plus the span it keeps (still counted live
 * until then). live_bytes_peak is the highest count published:
 * it misses a rise undone before it was published, by as much, the calling
 * thread's too: a small block (up to 1 MiB by default) allocated and freed
 * between two calls need not raise it. Small blocks count the size of their
 * class, large allocations the bytes requested. */
sa_status sa_get_stats(sa_arena *arena, sa_stats *out);

/* ------------------------------------------------------------------------
 * Diagnostics
 * ---------------------------------------------------------------------- */

/* Write the arena's state as JSON: spans, superblocks, chunks and blocks with
 * their state, per stream arena and size class. out is flushed before the
 * call returns; SA_ERR_INVALID_ARGUMENT if it could not be written (a full
 * disk, a stream not open for writing) or a pointer is NULL. For a view
 * that adds up, it holds every stream arena's lock at once, as the report
 * of SA_FLAG_OOM_REPORT does: under ThreadSanitizer, which follows at most
 * 64 locks held by one thread and stops the program past them, use them
 * with fewer streams than that. */
sa_status sa_snapshot_write(sa_arena *arena, FILE *out);

#ifdef __cplusplus
}
#endif
#endif /* STREAMARENA_STREAMARENA_H */
