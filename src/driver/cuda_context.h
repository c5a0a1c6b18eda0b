/* The CUDA backend's driver object and the rules every one of its ops
 * follows before it calls libcuda: which context the call runs in, which
 * stream handles a driver accepts, and stream capture (cuda_context.c).
 *
 * Private to the backend: included by cuda.c (the ops) and cuda_context.c.
 * Calls only the loader's table (cuda_loader.h).
 */
#ifndef SA_DRIVER_CUDA_CONTEXT_H
#define SA_DRIVER_CUDA_CONTEXT_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda.h>

#include "cuda_loader.h"
#include "driver.h"

typedef struct cuda_driver_s {
  sa_driver base; /* first: the arena sees only this */
  CUdevice dev;
  CUcontext ctx;           /* the retained primary context of dev */
  size_t granularity;      /* minimum chunk/map unit, queried at open */
  CUmemAllocationProp prop; /* pinned device memory on dev */
  CUmemAccessDesc access[64]; /* read-write for dev, then its peers */
  size_t naccess;
} cuda_driver;

static inline cuda_driver *as_cuda(sa_driver *d) { return (cuda_driver *)d; }

/* NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD name a stream of whatever
 * context is current: calls on them need ours current. */
static inline bool stream_is_implicit(sa_stream s) {
  return s == NULL || (CUstream)s == CU_STREAM_LEGACY || (CUstream)s == CU_STREAM_PER_THREAD;
}

/* What sa_cuda_ctx_enter replaced, for sa_cuda_ctx_leave. */
typedef struct sa_cuda_ctx_saved_s {
  int restore;   /* 0: ours was current already */
  CUcontext ctx; /* the caller's context, NULL when the thread had none */
} sa_cuda_ctx_saved;

/* Make the primary context current for one call; *saved says what to put
 * back. */
sa_status sa_cuda_ctx_enter(cuda_driver *cd, sa_cuda_ctx_saved *saved);
/* Restore what sa_cuda_ctx_enter replaced; returns st, or the restore's
 * failure when the call itself succeeded. */
sa_status sa_cuda_ctx_leave(sa_cuda_ctx_saved saved, sa_status st);

/* SA_ERR_STREAM_CAPTURING (nothing done) when stream is being captured,
 * SA_ERR_UNKNOWN_STREAM when the driver takes it for no live stream. */
sa_status sa_cuda_refused_while_capturing(cuda_driver *cd, sa_stream stream);
/* Put the calling thread in the relaxed capture mode for a host wait or
 * query; sa_cuda_relaxed_end gets the returned mode back. */
CUstreamCaptureMode sa_cuda_relaxed_begin(void);
void sa_cuda_relaxed_end(CUstreamCaptureMode m);

/* The ops legacy_stream_check, stream_validate and call_on_stream
 * (driver.h). */
sa_status sa_cuda_legacy_stream_check(sa_driver *d, sa_stream stream);
sa_status sa_cuda_stream_validate(sa_driver *d, sa_stream stream);
sa_status sa_cuda_call_on_stream(sa_driver *d, sa_stream stream, sa_status (*fn)(void *arg),
                                 void *arg);

/* Return the failure of a CUDA call as a status (sa_cu_fail). */
#define CU_CHECK(call)                                                 \
  do {                                                                 \
    CUresult cu_check_r_ = (call);                                     \
    if (cu_check_r_ != CUDA_SUCCESS) return sa_cu_fail(cu_check_r_); \
  } while (0)

/* Run one CUDA call with the primary context current, and return. */
#define CU_IN_CTX(cd, call)                                                   \
  do {                                                                        \
    sa_cuda_ctx_saved in_ctx_saved_;                                          \
    sa_status in_ctx_st_ = sa_cuda_ctx_enter((cd), &in_ctx_saved_);           \
    if (in_ctx_st_ != SA_OK) return in_ctx_st_;                               \
    CUresult in_ctx_r_ = (call);                                              \
    in_ctx_st_ = in_ctx_r_ == CUDA_SUCCESS ? SA_OK : sa_cu_fail(in_ctx_r_); \
    return sa_cuda_ctx_leave(in_ctx_saved_, in_ctx_st_);                      \
  } while (0)

/* As CU_IN_CTX, but only when stream needs the current context. */
#define CU_ON_STREAM(cd, stream, call) \
  do {                                 \
    if (stream_is_implicit(stream)) {  \
      CU_IN_CTX((cd), (call));         \
    }                                  \
    CU_CHECK(call);                    \
    return SA_OK;                      \
  } while (0)

#endif /* SA_DRIVER_CUDA_CONTEXT_H */
