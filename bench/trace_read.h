/* Reading allocation traces for //bench:replay and the peer benchmark.
 *
 * Three CSV dialects, told apart by their header line (docs/TRACE.md):
 *   streamarena's own:  thread,stream,op,id,size,time_ns
 *                       op is alloc or free; '#' starts a comment line
 *   RMM's logging_resource_adaptor:  Thread,Time,Action,Pointer,Size,Stream
 *                       Action is allocate, free or "allocate failure"
 *   PyTorch's memory history (its snapshot's device_traces as CSV):
 *                       stream,action,addr,size
 *                       action is alloc, free_requested (the program freed
 *                       the block: the replay frees it here) or
 *                       free_completed (the allocator could reuse it: the
 *                       address may come back only after this); oom counts
 *                       as a failed allocation; segment_alloc, segment_free,
 *                       segment_map, segment_unmap, snapshot, user_defined
 *                       (the recording allocator's own doings) are skipped
 * Columns are found by name (case-insensitive), so their order may vary.
 * Allocation ids (addresses) are matched to frees while reading and turned
 * into dense slot numbers; streams into dense stream numbers. A free of an
 * unknown id and a failed allocation are counted and dropped.
 *
 * A file may be gzipped (read through zlib, which passes plain files
 * through), and a relative path is the user's (user_path.h).
 */
#ifndef SA_BENCH_TRACE_READ_H
#define SA_BENCH_TRACE_READ_H

#include <stddef.h>
#include <stdint.h>

#include <streamarena/streamarena.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct trace_op_s {
  uint32_t slot;   /* allocation number, 0..nslots-1 */
  uint16_t stream; /* 0..nstreams-1 */
  uint8_t is_free;
  size_t size;     /* requested bytes (the allocation's, for a free too) */
} trace_op;

typedef struct trace_s {
  trace_op *ops;
  size_t nops;
  size_t nslots;       /* allocations */
  size_t nstreams;
  size_t nthreads;
  size_t peak_live;    /* sum of requested sizes, at its highest */
  size_t peak_op;      /* index of the op after which live bytes peak */
  size_t unmatched_frees, failed_allocs, never_freed;
  size_t skipped;      /* PyTorch events that are not the program's own */
  size_t early_reuse;  /* PyTorch: an address allocated again before its
                          free_completed (a faithful trace has none) */
  const char *format;  /* "streamarena", "rmm" or "pytorch" */
} trace;

/* Read path into *t. On failure a message goes to err (err_size bytes). */
sa_status trace_load(const char *path, trace *t, char *err, size_t err_size);
void trace_free(trace *t);

#ifdef __cplusplus
}
#endif

#endif /* SA_BENCH_TRACE_READ_H */
