/* The host backend of the driver interface (src/driver/driver.h): every op takes the
 * simulator lock, counts the call and applies injected faults
 * (sim/fault.c), then runs the simulator (sim/vmm.c, sim/stream.c,
 * sim/checker.c). A driver is one simulated device: its chunks, events and
 * streams are that device's, and its set_access grants the device itself
 * and the peers set_peer_access named. Several drivers may be open at once,
 * on one device or several. Called through sa_driver_open (driver.c).
 *
 * NULL is the default stream of the driver's device in every op, as cuda.c
 * makes its device's context current for a call on NULL; legacy_stream_check
 * and stream_validate refuse it where the calling thread has another device
 * current, whose default stream NULL names there, as cuda.c refuses it where
 * another context is current.
 *
 * Stream capture: as cuda.c, it makes no call on a capturing stream
 * (refused_while_capturing) and runs its host waits and queries in the
 * relaxed capture mode (relaxed_begin/end), so the simulator's capture
 * rules (sim/capture.c) hold the library to what CUDA would. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"
#include "../sim/sim.h"

typedef struct host_driver_s {
  sa_driver base;        /* first: the sa_driver * is a host_driver * */
  sa_sim_devices access; /* what set_access grants: the device and its peers */
} host_driver;

static host_driver *as_host(sa_driver *drv) { return (host_driver *)drv; }

/* Counted, fault-injectable entry: st is `call`'s status, run only if no
 * fault fires. */
#define HOST_CALL(st, fn, call)       \
  do {                                \
    sa_sim_lock();                    \
    (st) = sa_sim_fault_enter(fn);    \
    if ((st) == SA_OK) (st) = (call); \
    sa_sim_unlock();                  \
  } while (0)

#define HOST_OP(fn, call)       \
  do {                          \
    sa_status st_;              \
    HOST_CALL(st_, fn, call);   \
    return st_;                 \
  } while (0)

/* A host wait or query: in the relaxed capture mode, as cuda.c makes it. */
#define HOST_WAIT_OP(fn, call)                     \
  do {                                             \
    sa_host_capture_mode saved_ = relaxed_begin(); \
    sa_status st_;                                 \
    HOST_CALL(st_, fn, call);                      \
    relaxed_end(saved_);                           \
    return st_;                                    \
  } while (0)

static void host_close(sa_driver *drv) { free(drv); }

/* SA_ERR_STREAM_CAPTURING, changing nothing, when stream is being captured
 * (lock held): the library never enqueues into a user's graph. */
static sa_status refused_while_capturing(sa_driver *drv, sa_stream stream) {
  const sa_sim_stream *s = sa_sim_stream_lookup(stream, drv->device);
  if (s == NULL || s->capture == SA_HOST_CAPTURE_NONE) return SA_OK;
  return sa_sim_fail(SA_ERR_STREAM_CAPTURING, EBUSY,
                     "host: the stream is being captured into a graph");
}

static sa_host_capture_mode relaxed_begin(void) {
  sa_host_capture_mode m = SA_HOST_CAPTURE_RELAXED;
  (void)sa_host_exchange_capture_mode(&m);
  return m;
}

static void relaxed_end(sa_host_capture_mode m) { (void)sa_host_exchange_capture_mode(&m); }

static sa_status host_total_memory(sa_driver *drv, size_t *bytes) {
  (void)drv;
  if (bytes == NULL) return SA_ERR_INVALID_ARGUMENT;
  sa_sim_lock();
  *bytes = sa_sim_device_bytes();
  sa_sim_unlock();
  return SA_OK;
}

static sa_status host_granularity(sa_driver *drv, size_t *bytes) {
  (void)drv;
  if (bytes == NULL) return SA_ERR_INVALID_ARGUMENT;
  *bytes = SA_SIM_GRANULARITY;
  return SA_OK;
}

static sa_status host_va_reserve(sa_driver *drv, size_t size, size_t alignment, uintptr_t *out) {
  (void)drv;
  HOST_OP(SA_HOST_FN_VA_RESERVE, sa_sim_va_reserve(size, alignment, out));
}

static sa_status host_va_release(sa_driver *drv, uintptr_t va, size_t size) {
  (void)drv;
  HOST_OP(SA_HOST_FN_VA_RELEASE, sa_sim_va_release(va, size));
}

static sa_status host_chunk_create(sa_driver *drv, size_t size, sa_chunk_handle *out) {
  HOST_OP(SA_HOST_FN_CHUNK_CREATE, sa_sim_chunk_create(drv->device, size, out));
}

static sa_status host_chunk_release(sa_driver *drv, sa_chunk_handle chunk) {
  (void)drv;
  HOST_OP(SA_HOST_FN_CHUNK_RELEASE, sa_sim_chunk_release(chunk));
}

static sa_status host_map(sa_driver *drv, uintptr_t va, size_t size, sa_chunk_handle chunk) {
  (void)drv;
  HOST_OP(SA_HOST_FN_MAP, sa_sim_map(va, size, chunk));
}

static sa_status host_unmap(sa_driver *drv, uintptr_t va, size_t size) {
  (void)drv;
  HOST_OP(SA_HOST_FN_UNMAP, sa_sim_unmap(va, size));
}

static sa_status host_set_access(sa_driver *drv, uintptr_t va, size_t size) {
  HOST_OP(SA_HOST_FN_SET_ACCESS, sa_sim_set_access(va, size, as_host(drv)->access));
}

static sa_status host_event_create(sa_driver *drv, sa_event *out) {
  HOST_OP(SA_HOST_FN_EVENT_CREATE, sa_sim_event_create(drv->device, out));
}

static sa_status host_event_destroy(sa_driver *drv, sa_event event) {
  (void)drv;
  HOST_OP(SA_HOST_FN_EVENT_DESTROY, sa_sim_event_destroy(event));
}

static sa_status host_event_record(sa_driver *drv, sa_event event, sa_stream stream) {
  HOST_OP(SA_HOST_FN_EVENT_RECORD, refused_while_capturing(drv, stream) != SA_OK
                                       ? SA_ERR_STREAM_CAPTURING
                                       : sa_sim_event_record(event, stream, drv->device));
}

static sa_status host_event_query(sa_driver *drv, sa_event event) {
  (void)drv;
  HOST_WAIT_OP(SA_HOST_FN_EVENT_QUERY, sa_sim_event_query(event));
}

static sa_status host_event_synchronize(sa_driver *drv, sa_event event) {
  (void)drv;
  HOST_WAIT_OP(SA_HOST_FN_EVENT_SYNCHRONIZE, sa_sim_event_synchronize(event));
}

static sa_status host_stream_wait_event(sa_driver *drv, sa_stream stream, sa_event event) {
  HOST_OP(SA_HOST_FN_STREAM_WAIT_EVENT, refused_while_capturing(drv, stream) != SA_OK
                                            ? SA_ERR_STREAM_CAPTURING
                                            : sa_sim_stream_wait_event(stream, drv->device, event));
}

static sa_status host_stream_synchronize(sa_driver *drv, sa_stream stream) {
  HOST_WAIT_OP(SA_HOST_FN_STREAM_SYNCHRONIZE, refused_while_capturing(drv, stream) != SA_OK
                                                  ? SA_ERR_STREAM_CAPTURING
                                                  : sa_sim_stream_synchronize(stream, drv->device));
}

static sa_status host_stream_query(sa_driver *drv, sa_stream stream) {
  HOST_WAIT_OP(SA_HOST_FN_STREAM_QUERY, refused_while_capturing(drv, stream) != SA_OK
                                            ? SA_ERR_STREAM_CAPTURING
                                            : sa_sim_stream_query(stream, drv->device));
}

static sa_status host_stream_capture_check(sa_driver *drv, sa_stream stream) {
  sa_sim_lock();
  sa_status st = refused_while_capturing(drv, stream);
  sa_sim_unlock();
  return st;
}

/* The thread's current device is its own (no lock): a thread that never
 * set one, like a CUDA thread with no context, takes NULL as drv's. */
static sa_status host_legacy_stream_check(sa_driver *drv, sa_stream stream) {
  int current = sa_sim_current_device();
  if (stream != NULL || current < 0 || current == drv->device) return SA_OK;
  sa_driver_set_errorf(EXDEV,
                       "host: NULL stream of another device: it names the default stream of "
                       "device %d, current on this thread, not device %d's; pass a stream of "
                       "device %d or make device %d current",
                       current, drv->device, drv->device, drv->device);
  return SA_ERR_UNKNOWN_STREAM;
}

static sa_status host_stream_validate(sa_driver *drv, sa_stream stream) {
  sa_sim_lock();
  sa_status st = sa_sim_fault_enter(SA_HOST_FN_STREAM_VALIDATE);
  if (st == SA_OK) st = host_legacy_stream_check(drv, stream);
  if (st != SA_OK) {
    sa_sim_unlock();
    return st;
  }
  const sa_sim_stream *s = sa_sim_stream_for_call(stream, drv->device, "stream_validate");
  if (s == NULL) {
    st = SA_ERR_UNKNOWN_STREAM;
  } else if (!sa_sim_stream_on_device(s, drv->device)) {
    /* As on CUDA, where it is a stream of another context. */
    st = sa_sim_fail(SA_ERR_UNKNOWN_STREAM, EXDEV, "host: stream of another device");
  } else {
    st = refused_while_capturing(drv, stream);
  }
  sa_sim_unlock();
  return st;
}

static sa_status host_stream_id(sa_driver *drv, sa_stream stream, uint64_t *id) {
  HOST_OP(SA_HOST_FN_STREAM_ID, refused_while_capturing(drv, stream) != SA_OK
                                    ? SA_ERR_STREAM_CAPTURING
                                    : sa_sim_stream_id(stream, drv->device, id));
}

static sa_status host_device_synchronize(sa_driver *drv) {
  HOST_OP(SA_HOST_FN_DEVICE_SYNCHRONIZE,
          sa_sim_capture_device_wide() != SA_OK
              ? SA_ERR_STREAM_CAPTURING
              : (sa_sim_device_synchronize(drv->device), SA_OK));
}

static sa_status host_call_relaxed(sa_driver *drv, sa_status (*fn)(void *arg), void *arg) {
  (void)drv;
  sa_host_capture_mode saved = relaxed_begin();
  sa_status st = fn(arg);
  relaxed_end(saved);
  return st;
}

/* The thread-local current device stands for the current context. */
static sa_status host_call_on_stream(sa_driver *drv, sa_stream stream, sa_status (*fn)(void *arg),
                                     void *arg) {
  if (host_stream_capture_check(drv, stream) == SA_ERR_STREAM_CAPTURING)
    return SA_ERR_STREAM_CAPTURING;
  if (!sa_driver_stream_is_legacy(stream)) return fn(arg);
  int saved = sa_sim_current_device();
  sa_sim_set_current_device(drv->device);
  sa_status st = fn(arg);
  sa_sim_set_current_device(saved);
  return st;
}

/* Peers must exist and be able to access this device's memory, as
 * cuDeviceCanAccessPeer says on CUDA. */
static sa_status host_set_peer_access(sa_driver *drv, uint64_t peers) {
  host_driver *h = as_host(drv);
  sa_sim_lock();
  int n = sa_sim_device_count();
  if (peers == SA_PEER_ACCESS_ALL) peers = n < 64 ? ((uint64_t)1 << n) - 1 : UINT64_MAX;
  peers &= ~((uint64_t)1 << drv->device);
  sa_status st = SA_OK;
  for (int peer = 0; peer < 64 && st == SA_OK; peer++) {
    if (!(peers >> peer & 1)) continue;
    if (peer >= n) {
      sa_driver_set_errorf(
          ENODEV, "host: peer_access names device %d, which does not exist (%d simulated)",
          peer, n);
      st = SA_ERR_NO_DEVICE;
    } else if (!sa_sim_can_access_peer(peer, drv->device)) {
      sa_driver_set_errorf(EPERM, "host: device %d cannot access the memory of device %d", peer,
                           drv->device);
      st = SA_ERR_NOT_SUPPORTED;
    }
  }
  if (st == SA_OK) h->access = peers | (sa_sim_devices)1 << drv->device;
  sa_sim_unlock();
  return st;
}

static sa_status host_check_handout(sa_driver *drv, uintptr_t p, size_t size, sa_stream stream) {
  sa_sim_lock();
  sa_status st = sa_sim_check_handout(p, size, stream, drv->device);
  sa_sim_unlock();
  return st;
}

static sa_status host_stream_create(sa_driver *drv, sa_stream *out) {
  sa_sim_lock();
  sa_status st = sa_sim_stream_create(drv->device, SA_HOST_AUTO, out);
  sa_sim_unlock();
  return st;
}

static sa_status host_stream_destroy(sa_driver *drv, sa_stream stream) {
  (void)drv;
  return sa_host_stream_destroy(stream);
}

static sa_status host_memset32_async(sa_driver *drv, uintptr_t dst, uint32_t value, size_t count,
                                     sa_stream stream) {
  if (count > SIZE_MAX / 4) return SA_ERR_INVALID_ARGUMENT;
  size_t size = count * 4;
  sa_sim_lock();
  sa_status st;
  /* Like a kernel launch, it must name device memory the device may touch. */
  if (dst % 4 != 0 || !sa_sim_vmm_is_device(dst, size) ||
      !sa_sim_vmm_accessible(dst, size, drv->device)) {
    st = sa_sim_fail(
        SA_ERR_DRIVER, EFAULT,
        "host: memset32_async of memory that is not mapped device memory this device may access");
  } else {
    st = sa_sim_enqueue_kernel(stream, drv->device, SA_SIM_OP_FILL, dst, size, value, NULL);
  }
  sa_sim_unlock();
  return st;
}

static sa_status host_copy_to_host(sa_driver *drv, void *dst, uintptr_t src, size_t size) {
  if (dst == NULL && size != 0) return SA_ERR_INVALID_ARGUMENT;
  sa_sim_lock();
  sa_status st = SA_OK;
  if (!sa_sim_vmm_is_device(src, size) || !sa_sim_vmm_accessible(src, size, drv->device)) {
    st = sa_sim_fail(
        SA_ERR_DRIVER, EFAULT,
        "host: copy_to_host from memory that is not mapped device memory this device may access");
  } else if (size != 0) {
    memcpy(dst, (const void *)src, size);
  }
  sa_sim_unlock();
  return st;
}

static sa_status host_stream_begin_capture(sa_driver *drv, sa_stream stream, int mode) {
  (void)drv;
  return sa_host_stream_begin_capture(stream, (sa_host_capture_mode)mode);
}

static sa_status host_stream_end_capture(sa_driver *drv, sa_stream stream) {
  (void)drv;
  return sa_host_stream_end_capture(stream);
}

static const sa_driver_ops host_ops = {
    .name = "host",
    .close = host_close,
    .total_memory = host_total_memory,
    .granularity = host_granularity,
    .va_reserve = host_va_reserve,
    .va_release = host_va_release,
    .chunk_create = host_chunk_create,
    .chunk_release = host_chunk_release,
    .map = host_map,
    .unmap = host_unmap,
    .set_access = host_set_access,
    .event_create = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = host_event_record,
    .event_query = host_event_query,
    .event_synchronize = host_event_synchronize,
    .stream_wait_event = host_stream_wait_event,
    .stream_synchronize = host_stream_synchronize,
    .stream_query = host_stream_query,
    .stream_capture_check = host_stream_capture_check,
    .stream_validate = host_stream_validate,
    .legacy_stream_check = host_legacy_stream_check,
    .stream_id = host_stream_id,
    .device_synchronize = host_device_synchronize,
    .call_on_stream = host_call_on_stream,
    .call_relaxed = host_call_relaxed,
    .set_peer_access = host_set_peer_access,
    .check_handout = host_check_handout,
    .stream_create = host_stream_create,
    .stream_destroy = host_stream_destroy,
    .memset32_async = host_memset32_async,
    .copy_to_host = host_copy_to_host,
    .stream_begin_capture = host_stream_begin_capture,
    .stream_end_capture = host_stream_end_capture,
};

sa_status sa_driver_host_open(int device, sa_driver **out) {
  if (out == NULL) return SA_ERR_INVALID_ARGUMENT;
  *out = NULL;
  sa_sim_lock();
  int n = sa_sim_device_count();
  sa_sim_unlock();
  if (device < 0 || device >= n) {
    sa_driver_set_error(ENODEV, "host: no such simulated device (STREAMARENA_HOST_DEVICES)");
    return SA_ERR_NO_DEVICE;
  }
  host_driver *h = calloc(1, sizeof *h);
  if (h == NULL) return SA_ERR_OUT_OF_MEMORY;
  h->base.ops = &host_ops;
  h->base.backend = SA_BACKEND_HOST;
  h->base.device = device;
  h->access = (sa_sim_devices)1 << device;
  *out = &h->base;
  return SA_OK;
}
