/* The CUDA backend of the driver interface (driver.h), on libcuda.so.1.
 *
 * Owns, per driver, a reference on its device's primary context and the
 * memory properties and access descriptors of its chunks; the ops table
 * (cuda_ops) and the backend's entry points below (sa_driver_cuda_open and
 * the device queries). Calls libcuda through the loader's table
 * (cuda_loader.h: libcuda loaded at run time, so the library has no
 * link-time dependency on it and reports SA_ERR_NO_DEVICE where no driver
 * exists) and, for the context, stream and capture rules every op follows,
 * cuda_context.c. Called by driver.c (sa_driver_open) and, through
 * sa_driver_ops, by the arena.
 *
 * Several devices. A driver is one device; its memory is mapped read-write
 * for that device and for the peers set_peer_access named (checked with
 * cuDeviceCanAccessPeer), one access descriptor each, at every
 * cuMemSetAccess. No cuCtxEnablePeerAccess is needed for VMM memory: the
 * descriptors are the grant.
 */
#include <stdlib.h>

#include <cuda.h>

#include "cuda_context.h"
#include "cuda_loader.h"
#include "driver.h"

/* ------------------------------------------------------------------------
 * Operations
 * ---------------------------------------------------------------------- */

static void cuda_close(sa_driver *d) {
  cuda_driver *cd = as_cuda(d);
  CUresult r = sa_cu.DevicePrimaryCtxRelease(cd->dev);
  if (r != CUDA_SUCCESS) (void)sa_cu_fail(r); /* nowhere to return it: record it */
  free(cd);
}

static sa_status cuda_total_memory(sa_driver *d, size_t *bytes) {
  if (bytes == NULL) return SA_ERR_INVALID_ARGUMENT;
  CU_CHECK(sa_cu.DeviceTotalMem(bytes, as_cuda(d)->dev));
  return SA_OK;
}

static sa_status cuda_granularity(sa_driver *d, size_t *bytes) {
  if (bytes == NULL) return SA_ERR_INVALID_ARGUMENT;
  *bytes = as_cuda(d)->granularity;
  return SA_OK;
}

static sa_status cuda_va_reserve(sa_driver *d, size_t size, size_t alignment, uintptr_t *out) {
  if (out == NULL) return SA_ERR_INVALID_ARGUMENT;
  CUdeviceptr p = 0;
  *out = 0;
  sa_cuda_ctx_saved saved;
  sa_status st = sa_cuda_ctx_enter(as_cuda(d), &saved);
  if (st != SA_OK) return st;
  CUresult r = sa_cu.MemAddressReserve(&p, size, alignment, 0, 0);
  st = sa_cuda_ctx_leave(saved, r == CUDA_SUCCESS ? SA_OK : sa_cu_fail(r));
  if (st == SA_OK) {
    *out = (uintptr_t)p;
  } else if (r == CUDA_SUCCESS) {
    (void)sa_cu.MemAddressFree(p, size); /* restore failed: give it back */
  }
  return st;
}

static sa_status cuda_va_release(sa_driver *d, uintptr_t va, size_t size) {
  CU_IN_CTX(as_cuda(d), sa_cu.MemAddressFree((CUdeviceptr)va, size));
}

static sa_status cuda_chunk_create(sa_driver *d, size_t size, sa_chunk_handle *out) {
  if (out == NULL) return SA_ERR_INVALID_ARGUMENT;
  cuda_driver *cd = as_cuda(d);
  CUmemGenericAllocationHandle h = 0;
  *out = 0;
  sa_cuda_ctx_saved saved;
  sa_status st = sa_cuda_ctx_enter(cd, &saved);
  if (st != SA_OK) return st;
  CUresult r = sa_cu.MemCreate(&h, size, &cd->prop, 0);
  st = sa_cuda_ctx_leave(saved, r == CUDA_SUCCESS ? SA_OK : sa_cu_fail(r));
  if (st == SA_OK) {
    *out = (sa_chunk_handle)h;
  } else if (r == CUDA_SUCCESS) {
    (void)sa_cu.MemRelease(h);
  }
  return st;
}

static sa_status cuda_chunk_release(sa_driver *d, sa_chunk_handle chunk) {
  CU_IN_CTX(as_cuda(d), sa_cu.MemRelease((CUmemGenericAllocationHandle)chunk));
}

static sa_status cuda_map(sa_driver *d, uintptr_t va, size_t size, sa_chunk_handle chunk) {
  CU_IN_CTX(as_cuda(d),
            sa_cu.MemMap((CUdeviceptr)va, size, 0, (CUmemGenericAllocationHandle)chunk, 0));
}

static sa_status cuda_unmap(sa_driver *d, uintptr_t va, size_t size) {
  CU_IN_CTX(as_cuda(d), sa_cu.MemUnmap((CUdeviceptr)va, size));
}

static sa_status cuda_set_access(sa_driver *d, uintptr_t va, size_t size) {
  cuda_driver *cd = as_cuda(d);
  CU_IN_CTX(cd, sa_cu.MemSetAccess((CUdeviceptr)va, size, cd->access, cd->naccess));
}

static sa_status cuda_set_peer_access(sa_driver *d, uint64_t peers) {
  cuda_driver *cd = as_cuda(d);
  int count = 0;
  CU_CHECK(sa_cu.DeviceGetCount(&count));
  if (count > 64) count = 64;
  if (peers == SA_PEER_ACCESS_ALL) peers = count < 64 ? ((uint64_t)1 << count) - 1 : UINT64_MAX;
  peers &= ~((uint64_t)1 << d->device);
  size_t n = 1;
  for (int ordinal = 0; ordinal < 64; ordinal++) {
    if (!(peers >> ordinal & 1)) continue;
    if (ordinal >= count) {
      sa_driver_set_errorf(CUDA_ERROR_INVALID_DEVICE,
                           "peer_access names device %d; this machine has %d", ordinal, count);
      return SA_ERR_NO_DEVICE;
    }
    CUdevice peer;
    int can = 0;
    CU_CHECK(sa_cu.DeviceGet(&peer, ordinal));
    CU_CHECK(sa_cu.DeviceCanAccessPeer(&can, peer, cd->dev));
    if (!can) {
      sa_driver_set_errorf(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
                           "device %d cannot access the memory of device %d (cuDeviceCanAccessPeer)",
                           ordinal, d->device);
      return SA_ERR_NOT_SUPPORTED;
    }
    cd->access[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    cd->access[n].location.id = peer;
    cd->access[n].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    n++;
  }
  cd->naccess = n;
  return SA_OK;
}

static sa_status cuda_event_create(sa_driver *d, sa_event *out) {
  if (out == NULL) return SA_ERR_INVALID_ARGUMENT;
  CUevent e = NULL;
  *out = NULL;
  sa_cuda_ctx_saved saved;
  sa_status st = sa_cuda_ctx_enter(as_cuda(d), &saved);
  if (st != SA_OK) return st;
  /* No timing: recording and querying are cheaper, and we never time. */
  CUresult r = sa_cu.EventCreate(&e, CU_EVENT_DISABLE_TIMING);
  st = sa_cuda_ctx_leave(saved, r == CUDA_SUCCESS ? SA_OK : sa_cu_fail(r));
  if (st == SA_OK) {
    *out = (sa_event)e;
  } else if (r == CUDA_SUCCESS) {
    (void)sa_cu.EventDestroy(e);
  }
  return st;
}

static sa_status cuda_event_destroy(sa_driver *d, sa_event event) {
  (void)d;
  CU_CHECK(sa_cu.EventDestroy((CUevent)event));
  return SA_OK;
}

static sa_status cuda_event_record(sa_driver *d, sa_event event, sa_stream stream) {
  sa_status st = sa_cuda_refused_while_capturing(as_cuda(d), stream);
  if (st != SA_OK) return st;
  CU_ON_STREAM(as_cuda(d), stream, sa_cu.EventRecord((CUevent)event, (CUstream)stream));
}

/* A query's result: the work completed, or not yet (an answer, not a
 * failure), or the driver's failure. */
static sa_status query_answer(CUresult r) {
  if (r == CUDA_SUCCESS) return SA_OK;
  if (r == CUDA_ERROR_NOT_READY) return SA_ERR_NOT_READY;
  return sa_cu_fail(r);
}

static sa_status cuda_event_query(sa_driver *d, sa_event event) {
  (void)d;
  CUstreamCaptureMode saved = sa_cuda_relaxed_begin();
  CUresult r = sa_cu.EventQuery((CUevent)event);
  sa_cuda_relaxed_end(saved);
  return query_answer(r);
}

static sa_status cuda_event_synchronize(sa_driver *d, sa_event event) {
  (void)d;
  CUstreamCaptureMode saved = sa_cuda_relaxed_begin();
  CUresult r = sa_cu.EventSynchronize((CUevent)event);
  sa_cuda_relaxed_end(saved);
  return r == CUDA_SUCCESS ? SA_OK : sa_cu_fail(r);
}

static sa_status cuda_stream_wait_event(sa_driver *d, sa_stream stream, sa_event event) {
  sa_status st = sa_cuda_refused_while_capturing(as_cuda(d), stream);
  if (st != SA_OK) return st;
  CU_ON_STREAM(as_cuda(d), stream, sa_cu.StreamWaitEvent((CUstream)stream, (CUevent)event, 0));
}

static sa_status cuda_stream_capture_check(sa_driver *d, sa_stream stream) {
  return sa_cuda_refused_while_capturing(as_cuda(d), stream);
}

static sa_status stream_synchronize_on(sa_driver *d, sa_stream stream) {
  CU_ON_STREAM(as_cuda(d), stream, sa_cu.StreamSynchronize((CUstream)stream));
}

static sa_status cuda_stream_synchronize(sa_driver *d, sa_stream stream) {
  sa_status st = sa_cuda_refused_while_capturing(as_cuda(d), stream);
  if (st != SA_OK) return st;
  CUstreamCaptureMode saved = sa_cuda_relaxed_begin();
  st = stream_synchronize_on(d, stream);
  sa_cuda_relaxed_end(saved);
  return st;
}

static sa_status cuda_stream_query(sa_driver *d, sa_stream stream) {
  cuda_driver *cd = as_cuda(d);
  sa_status st = sa_cuda_refused_while_capturing(cd, stream);
  if (st != SA_OK) return st;
  bool implicit = stream_is_implicit(stream);
  sa_cuda_ctx_saved saved;
  if (implicit && (st = sa_cuda_ctx_enter(cd, &saved)) != SA_OK) return st;
  CUstreamCaptureMode mode = sa_cuda_relaxed_begin();
  CUresult r = sa_cu.StreamQuery((CUstream)stream);
  sa_cuda_relaxed_end(mode);
  st = query_answer(r);
  return implicit ? sa_cuda_ctx_leave(saved, st) : st;
}

static sa_status cuda_stream_id(sa_driver *d, sa_stream stream, uint64_t *id) {
  /* The implicit streams are never destroyed, so their handles are their
   * identity; their ids sit where cuStreamGetId's counter never reaches. */
  if (stream_is_implicit(stream)) {
    *id = UINT64_MAX - (uint64_t)(uintptr_t)stream;
    return SA_OK;
  }
  sa_status st = sa_cuda_refused_while_capturing(as_cuda(d), stream);
  if (st != SA_OK) return st;
  unsigned long long v = 0;
  CUresult r = sa_cu.StreamGetId((CUstream)stream, &v);
  if (r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_INVALID_VALUE) {
    (void)sa_cu_fail(r);
    return SA_ERR_UNKNOWN_STREAM;
  }
  if (r != CUDA_SUCCESS) return sa_cu_fail(r);
  *id = (uint64_t)v;
  return SA_OK;
}

/* cuCtxSynchronize waits for the primary context's work on every stream,
 * including streams the user destroyed with work still queued. */
static sa_status cuda_device_synchronize(sa_driver *d) {
  CU_IN_CTX(as_cuda(d), sa_cu.CtxSynchronize());
}

static sa_status cuda_call_relaxed(sa_driver *d, sa_status (*fn)(void *arg), void *arg) {
  (void)d;
  CUstreamCaptureMode saved = sa_cuda_relaxed_begin();
  sa_status st = fn(arg);
  sa_cuda_relaxed_end(saved);
  return st;
}

static sa_status cuda_stream_create(sa_driver *d, sa_stream *out) {
  if (out == NULL) return SA_ERR_INVALID_ARGUMENT;
  CUstream s = NULL;
  *out = NULL;
  sa_cuda_ctx_saved saved;
  sa_status st = sa_cuda_ctx_enter(as_cuda(d), &saved);
  if (st != SA_OK) return st;
  /* Non-blocking: no implicit ordering with the NULL stream, so tests see
   * only the ordering the allocator creates. */
  CUresult r = sa_cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING);
  st = sa_cuda_ctx_leave(saved, r == CUDA_SUCCESS ? SA_OK : sa_cu_fail(r));
  if (st == SA_OK) {
    *out = (sa_stream)s;
  } else if (r == CUDA_SUCCESS) {
    (void)sa_cu.StreamDestroy(s);
  }
  return st;
}

static sa_status cuda_stream_destroy(sa_driver *d, sa_stream stream) {
  (void)d;
  if (stream_is_implicit(stream)) return SA_ERR_INVALID_ARGUMENT; /* not ours to destroy */
  CU_CHECK(sa_cu.StreamDestroy((CUstream)stream));
  return SA_OK;
}

static sa_status cuda_memset32_async(sa_driver *d, uintptr_t dst, uint32_t value, size_t count,
                                     sa_stream stream) {
  CU_IN_CTX(as_cuda(d),
            sa_cu.MemsetD32Async((CUdeviceptr)dst, value, count, (CUstream)stream));
}

static sa_status cuda_copy_to_host(sa_driver *d, void *dst, uintptr_t src, size_t size) {
  if (dst == NULL && size > 0) return SA_ERR_INVALID_ARGUMENT;
  CU_IN_CTX(as_cuda(d), sa_cu.MemcpyDtoH(dst, (CUdeviceptr)src, size));
}

static sa_status cuda_stream_begin_capture(sa_driver *d, sa_stream stream, int mode) {
  (void)d;
  CU_CHECK(sa_cu.StreamBeginCapture((CUstream)stream, (CUstreamCaptureMode)mode));
  return SA_OK;
}

static sa_status cuda_stream_end_capture(sa_driver *d, sa_stream stream) {
  (void)d;
  CUgraph graph = NULL;
  CUresult r = sa_cu.StreamEndCapture((CUstream)stream, &graph);
  if (graph != NULL) (void)sa_cu.GraphDestroy(graph);
  return r == CUDA_SUCCESS ? SA_OK : sa_cu_fail(r);
}

static const sa_driver_ops cuda_ops = {
    .name = "cuda",
    .close = cuda_close,
    .total_memory = cuda_total_memory,
    .granularity = cuda_granularity,
    .va_reserve = cuda_va_reserve,
    .va_release = cuda_va_release,
    .chunk_create = cuda_chunk_create,
    .chunk_release = cuda_chunk_release,
    .map = cuda_map,
    .unmap = cuda_unmap,
    .set_access = cuda_set_access,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
    .stream_wait_event = cuda_stream_wait_event,
    .stream_synchronize = cuda_stream_synchronize,
    .stream_query = cuda_stream_query,
    .stream_capture_check = cuda_stream_capture_check,
    .stream_validate = sa_cuda_stream_validate,
    .legacy_stream_check = sa_cuda_legacy_stream_check,
    .stream_id = cuda_stream_id,
    .device_synchronize = cuda_device_synchronize,
    .call_on_stream = sa_cuda_call_on_stream,
    .call_relaxed = cuda_call_relaxed,
    .set_peer_access = cuda_set_peer_access,
    .check_handout = NULL, /* no shadow state of device work on a real GPU */
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .memset32_async = cuda_memset32_async,
    .copy_to_host = cuda_copy_to_host,
    .stream_begin_capture = cuda_stream_begin_capture,
    .stream_end_capture = cuda_stream_end_capture,
};

/* ------------------------------------------------------------------------
 * Opening, and device queries
 * ---------------------------------------------------------------------- */

/* The device for ordinal, or SA_ERR_NO_DEVICE where there is none. */
static sa_status device_get(int ordinal, CUdevice *dev) {
  int count = 0;
  CU_CHECK(sa_cu.DeviceGetCount(&count));
  if (ordinal >= count) {
    sa_driver_set_error(CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE");
    return SA_ERR_NO_DEVICE;
  }
  CU_CHECK(sa_cu.DeviceGet(dev, ordinal));
  return SA_OK;
}

/* Fill the chunk and access descriptors and query the granularity. */
static sa_status describe_device(cuda_driver *cd) {
  int vmm = 0;
  CU_CHECK(sa_cu.DeviceGetAttribute(
      &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cd->dev));
  if (!vmm) {
    sa_driver_set_error(CUDA_ERROR_NOT_SUPPORTED, "device lacks virtual memory management");
    return SA_ERR_NO_DEVICE;
  }
  cd->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  cd->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  cd->prop.location.id = cd->dev;
  cd->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  cd->access[0].location = cd->prop.location;
  cd->access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  cd->naccess = 1;
  /* MINIMUM, not RECOMMENDED: the interface promises the smallest legal
   * unit; the arena picks larger chunks itself (both are 2 MiB on H200). */
  CU_CHECK(sa_cu.MemGetAllocationGranularity(&cd->granularity, &cd->prop,
                                             CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  if (cd->granularity == 0) {
    sa_driver_set_error(CUDA_ERROR_UNKNOWN, "granularity 0");
    return SA_ERR_DRIVER;
  }
  return SA_OK;
}

sa_status sa_driver_cuda_open(int device, sa_driver **out) {
  if (out == NULL) return SA_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (device < 0) return SA_ERR_INVALID_ARGUMENT;
  sa_status st = sa_cu_load();
  if (st != SA_OK) return st;

  cuda_driver *cd = calloc(1, sizeof *cd);
  if (cd == NULL) return SA_ERR_OUT_OF_MEMORY;
  st = device_get(device, &cd->dev);
  if (st == SA_OK) st = describe_device(cd);
  if (st == SA_OK) {
    CUresult r = sa_cu.DevicePrimaryCtxRetain(&cd->ctx, cd->dev);
    if (r != CUDA_SUCCESS) st = sa_cu_fail(r);
  }
  if (st != SA_OK) {
    free(cd);
    return st;
  }
  cd->base.ops = &cuda_ops;
  cd->base.backend = SA_BACKEND_CUDA;
  cd->base.device = device;
  *out = &cd->base;
  return SA_OK;
}

sa_status sa_driver_cuda_device_count(int *count) {
  if (count == NULL) return SA_ERR_INVALID_ARGUMENT;
  *count = 0;
  sa_status st = sa_cu_load();
  if (st != SA_OK) return st;
  int n = 0;
  CU_CHECK(sa_cu.DeviceGetCount(&n));
  if (n <= 0) {
    sa_driver_set_error(CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE");
    return SA_ERR_NO_DEVICE;
  }
  *count = n;
  return SA_OK;
}

sa_status sa_driver_cuda_current_device(int *device) {
  if (device == NULL) return SA_ERR_INVALID_ARGUMENT;
  *device = -1;
  sa_status st = sa_cu_load();
  if (st != SA_OK) return st;
  CUcontext cur = NULL;
  CU_CHECK(sa_cu.CtxGetCurrent(&cur));
  if (cur == NULL) return SA_ERR_NO_DEVICE;
  CUdevice dev = 0;
  CU_CHECK(sa_cu.CtxGetDevice(&dev));
  *device = (int)dev;
  return SA_OK;
}
