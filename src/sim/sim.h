/* The host simulator's internals: the process-wide simulated devices.
 *
 * Modules of src/sim/ (each owns its state, all guarded by the one
 * simulator lock):
 *   device.c       the lock, configuration (devices, device memory), each
 *                  thread's current device (its "current context"), peer
 *                  capability, counters
 *   fault.c        call counting and fault injection per sa_host_fn
 *   ptrset.c       a pointer set: which handles are live
 *   vmm.c          reservations, chunks (ranges of one memfd), mappings
 *   stream.c       streams, queued ops and their progress
 *   event.c        events, and the waits of streams on them
 *   capture.c      stream capture: which calls the driver refuses meanwhile
 *   checker.c      vector clocks and the stream-order checker
 * The driver interface's host backend (src/driver/host.c) is the
 * sa_driver_ops table over all of the above. The simulator calls nothing of
 * the allocator (the files of src/ itself); it reports errors through the
 * driver layer's sa_driver_set_error.
 * Public entry points (driver ops, include/streamarena/host.h) take the lock;
 * every sa_sim_ function below expects it held unless its comment says
 * otherwise. Nothing here is on the allocator's fast path.
 */
#ifndef SA_SIM_SIM_H
#define SA_SIM_SIM_H

#include <stddef.h>
#include <stdint.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

/* Allocation granularity of the simulated device (as on the H200). */
#define SA_SIM_GRANULARITY ((size_t)2 << 20)
/* Simulated memory of each device unless configured otherwise. */
#define SA_SIM_DEFAULT_DEVICE_BYTES ((size_t)16 << 30)
#define SA_SIM_MAX_DEVICES SA_HOST_MAX_DEVICES
/* As a device argument of sa_sim_vmm_accessible: any device at all. */
#define SA_SIM_ANY_DEVICE (-1)
/* A set of devices: bit i is device i. */
typedef uint64_t sa_sim_devices;

/* ---- device.c ----------------------------------------------------------- */
/* Take / drop the simulator lock (the first call also reads the
 * environment). Not recursive. */
void sa_sim_lock(void);
void sa_sim_unlock(void);
/* Record a failure of the driver call: sets the calling thread's last driver
 * error (an errno value and a static description) and returns status. */
sa_status sa_sim_fail(sa_status status, int code, const char *name);
/* The checker (or a kernel touching unmapped memory) found a violation. */
void sa_sim_note_violation(void);
uint64_t sa_sim_violations(void);
int sa_sim_device_count(void);
/* The calling thread's current device (sa_host_set_device), or -1 where it
 * never set one: the simulator's "no context current". No lock needed. */
int sa_sim_current_device(void);
/* Make device (-1: none) current on the calling thread, unchecked: to put
 * back what sa_sim_current_device said. No lock needed. */
void sa_sim_set_current_device(int device);
/* 1 if peer may be granted access to device's memory (always for itself). */
int sa_sim_can_access_peer(int peer, int device);

/* ---- fault.c ------------------------------------------------------------ */
/* Entry of a driver op: counts the call and fails it (SA_ERR_DRIVER, after
 * sa_driver_set_error) when a fault is armed for this call. */
sa_status sa_sim_fault_enter(sa_host_fn fn);
void sa_sim_fault_calls(uint64_t calls[SA_HOST_FN_COUNT]); /* counted so far */
void sa_sim_fault_thread_calls(uint64_t calls[SA_HOST_FN_COUNT]); /* the calling thread's */

/* ---- ptrset.c ----------------------------------------------------------- */
/* Open-addressing set of non-NULL pointers (live handles). */
typedef struct sa_sim_ptrset_s {
  uintptr_t *slots; /* 0 = empty, 1 = deleted, else a member */
  size_t cap;       /* a power of two, or 0 */
  size_t count;     /* members */
  size_t used;      /* members + deleted slots */
} sa_sim_ptrset;

/* Make room so that n more inserts cannot fail. */
sa_status sa_sim_ptrset_reserve(sa_sim_ptrset *set, size_t n);
/* Insert p (not yet a member) into room made by sa_sim_ptrset_reserve. */
void sa_sim_ptrset_insert(sa_sim_ptrset *set, const void *p);
int sa_sim_ptrset_contains(const sa_sim_ptrset *set, const void *p);
/* Returns 1 if p was a member. */
int sa_sim_ptrset_remove(sa_sim_ptrset *set, const void *p);

/* ---- vmm.c -------------------------------------------------------------- */
sa_status sa_sim_va_reserve(size_t size, size_t alignment, uintptr_t *out);
sa_status sa_sim_va_release(uintptr_t va, size_t size);
/* Physical memory of device (an existing one). */
sa_status sa_sim_chunk_create(int device, size_t size, uint64_t *out);
sa_status sa_sim_chunk_release(uint64_t chunk);
sa_status sa_sim_map(uintptr_t va, size_t size, uint64_t chunk);
sa_status sa_sim_unmap(uintptr_t va, size_t size);
/* Grant read-write access to devices (besides what was granted before), as
 * cuMemSetAccess with one descriptor per device; each must be allowed to
 * access the memory's device (sa_sim_can_access_peer). */
sa_status sa_sim_set_access(uintptr_t va, size_t size, sa_sim_devices devices);
/* 1 if [p, p + size) lies inside one reserved range (device memory). */
int sa_sim_vmm_is_device(uintptr_t p, size_t size);
/* 1 if work of device (SA_SIM_ANY_DEVICE: of some device) may touch
 * [p, p + size) now: mapped device memory that device was granted access
 * to, or memory outside every reserved range (plain host memory). */
int sa_sim_vmm_accessible(uintptr_t p, size_t size, int device);
/* The device whose chunk is mapped at p, or -1. */
int sa_sim_vmm_device_of(uintptr_t p);
/* Bytes of the chunks of device (released-but-mapped ones included). */
size_t sa_sim_vmm_device_bytes_used(int device);
size_t sa_sim_device_bytes(void);
sa_status sa_sim_set_device_bytes(size_t bytes);
void sa_sim_vmm_counters(sa_host_counters *out);
void sa_sim_vmm_totals(sa_host_totals *out); /* its bytes_* fields */
void sa_sim_vmm_thread_totals(sa_host_totals *out); /* the calling thread's */

/* ---- checker.c: vector clocks ------------------------------------------- */
typedef struct sa_sim_tick_s {
  uint64_t sid;    /* stream id */
  uint32_t slot;   /* its slot, to see whether it still has that work pending */
  uint64_t ticket; /* ops of that stream up to this ticket are ordered before */
} sa_sim_tick;

/* What a stream (or an event's recording) is ordered after: entries sorted
 * by sid, at most one per stream, only for work not known complete. */
typedef struct sa_sim_clock_s {
  sa_sim_tick *v;
  size_t n;
} sa_sim_clock;

struct sa_sim_stream_s;
uint64_t sa_sim_clock_get(const sa_sim_clock *c, uint64_t sid);
/* *out = max(a, b, {edge: ticket}) (edge NULL: none) in fresh memory, less
 * the entries whose work has completed (they order nothing any more); a and
 * b are untouched, so a failure (SA_ERR_OUT_OF_MEMORY) changes nothing. */
sa_status sa_sim_clock_join(sa_sim_clock *out, const sa_sim_clock *a, const sa_sim_clock *b,
                            const struct sa_sim_stream_s *edge, uint64_t ticket);
void sa_sim_clock_free(sa_sim_clock *c);

/* ---- stream.c, event.c: streams, ops, events --------------------------- */
typedef enum sa_sim_op_kind_e {
  SA_SIM_OP_FILL,   /* write pattern over [p, p + size) at completion */
  SA_SIM_OP_CHECK,  /* compare [p, p + size) with pattern at completion */
  SA_SIM_OP_RECORD, /* an event record marker */
  SA_SIM_OP_WAIT    /* blocks until (wait_slot, wait_sid) reaches wait_ticket */
} sa_sim_op_kind;

typedef struct sa_sim_op_s {
  sa_sim_op_kind kind;
  int device;           /* FILL, CHECK: whose work it is (access rights) */
  uint32_t pattern;
  uintptr_t p;
  size_t size;
  uint64_t *mismatches; /* CHECK: incremented at completion */
  uint32_t wait_slot;   /* WAIT: the stream waited on (slot + id: it may be gone) */
  uint64_t wait_sid;    /* 0: nothing to wait for (never-recorded event) */
  uint64_t wait_ticket;
  int unmapped;         /* FILL, CHECK: already reported as unmapped under it */
} sa_sim_op;

typedef struct sa_sim_stream_s {
  uint64_t sid;       /* unique for the process lifetime (handles are reused) */
  uint32_t slot;      /* index in the stream table */
  int device;         /* the device it belongs to */
  sa_host_mode mode;
  uint64_t enqueued;  /* ticket of the last op enqueued (tickets start at 1) */
  uint64_t completed; /* ticket of the last op completed */
  sa_sim_op *ops;     /* pending ops [head, tail): tickets completed+1 .. enqueued */
  size_t head, tail, cap;
  sa_sim_clock clock; /* what work enqueued from now on is ordered after */
  int destroyed;      /* its handle was destroyed; it lives until its work has run */
  sa_host_capture_status capture; /* capture.c */
  sa_host_capture_mode capture_mode;
  uint64_t capture_thread;    /* the thread that began it (capture.c names threads) */
  uint64_t capture_seq;       /* which capture: events recorded in it carry it */
} sa_sim_stream;

/* Every device has its own default stream, as every CUDA context has its own
 * legacy stream, all known by the handle NULL. So each function below that
 * takes a handle also takes the device whose default stream NULL names: the
 * driver's own device in driver ops (as cuda.c makes its context current
 * for a call on NULL), the calling thread's current device in host.h's
 * functions (sa_host_get_device), -1 where NULL names none. */

/* Streams by slot (NULL: free slot); slot d < SA_SIM_FIRST_USER_SLOT is
 * device d's default stream, made when first named. */
#define SA_SIM_FIRST_USER_SLOT SA_SIM_MAX_DEVICES
size_t sa_sim_stream_slots(void);
sa_sim_stream *sa_sim_stream_at(size_t slot);
/* Device's default stream (made at the first call); NULL for no device. */
sa_sim_stream *sa_sim_default_stream(int device);
/* 1 for a default stream, 0 for a user stream. */
int sa_sim_stream_is_default(const sa_sim_stream *s);
/* The live stream for a handle (NULL: device's default stream), or NULL. */
sa_sim_stream *sa_sim_stream_lookup(sa_stream handle, int device);
/* The same for a driver call of the library named call: a handle of a
 * destroyed stream (not yet recycled) is also reported as a violation. */
sa_sim_stream *sa_sim_stream_for_call(sa_stream handle, int device, const char *call);
/* The stream (slot, sid) names (a wait op's or an event's), or NULL once it
 * has been destroyed and its work has run. */
sa_sim_stream *sa_sim_stream_ref(uint32_t slot, uint64_t sid);
/* The handle a stream is known by (NULL for a default stream). */
sa_stream sa_sim_stream_handle(const sa_sim_stream *s);
void sa_sim_stream_counters(sa_host_counters *out); /* its streams field */

/* User streams alive on device. */
size_t sa_sim_streams_on(int device);
/* 1 if work of device may be enqueued on s: s is one of device's streams
 * (its default stream included). */
int sa_sim_stream_on_device(const sa_sim_stream *s, int device);

/* Driver-level stream and event operations (lock held). Streams and events
 * belong to a device (an existing one); an event is recorded only on a
 * stream of its device, as cuEventRecord requires the same context; any
 * stream may wait for any event. Kernels are work of device: it must be the
 * stream's. */
sa_status sa_sim_stream_create(int device, sa_host_mode mode, sa_stream *out);
sa_status sa_sim_stream_destroy(sa_stream stream);
sa_status sa_sim_stream_synchronize(sa_stream stream, int device);
/* SA_OK once every operation enqueued on stream completed, else
 * SA_ERR_NOT_READY (cuStreamQuery). */
sa_status sa_sim_stream_query(sa_stream stream, int device);
/* The driver's id of a live stream (refused while it is captured). */
sa_status sa_sim_stream_id(sa_stream stream, int device, uint64_t *id);
/* Complete all work of device's streams, its default stream included
 * (device < 0: of every stream), and whatever it waits for. */
void sa_sim_device_synchronize(int device);
sa_status sa_sim_stream_wait_event(sa_stream stream, int device, void *event);
/* [va, va + size) is being unmapped: every kernel still queued on it is a
 * violation now (cuMemUnmap does not wait for queued work), whether or not
 * the range is mapped again before the kernel runs. */
void sa_sim_note_unmap(uintptr_t va, size_t size);
sa_status sa_sim_enqueue_kernel(sa_stream stream, int device, sa_sim_op_kind kind, uintptr_t p,
                                size_t size, uint32_t pattern, uint64_t *mismatches);
sa_status sa_sim_event_create(int device, void **out);
sa_status sa_sim_event_destroy(void *event);
sa_status sa_sim_event_record(void *event, sa_stream stream, int device);
sa_status sa_sim_event_query(void *event);
sa_status sa_sim_event_synchronize(void *event);
void sa_sim_event_counters(sa_host_counters *out); /* its events field */

/* Queues and progress (stream.c), for event.c. Room for one more op at s's
 * tail; then push op there. */
sa_status sa_sim_ops_reserve(sa_sim_stream *s);
void sa_sim_ops_push(sa_sim_stream *s, const sa_sim_op *op);
/* Run auto streams until none can move (one completion may unblock
 * others), then free destroyed streams whose work has all run (their slot
 * and sid then read as complete). */
void sa_sim_settle(void);
/* Complete s up to ticket, first driving whatever its waits need. Recursion
 * depth is bounded by the number of streams: a stream cannot reappear in
 * its own chain (stream.c's top comment). */
void sa_sim_drive(sa_sim_stream *s, uint64_t ticket);

/* ---- capture.c: stream capture ------------------------------------------ *
 * Each check returns SA_OK, or SA_ERR_STREAM_CAPTURING after invalidating
 * the captures the call conflicts with (host.h has the rules). */
/* A call on s that conflicts with capturing s (an id query, a synchronize,
 * a wait for an event recorded outside the capture). */
sa_status sa_sim_capture_refuse_on(sa_sim_stream *s);
/* A host wait or query ("potentially unsafe" during a capture). */
sa_status sa_sim_capture_unsafe_call(void);
/* The device-wide synchronize: refused while any capture is open. */
sa_status sa_sim_capture_device_wide(void);
/* The capture numbered seq, if still open, is invalidated; 1 if it was open. */
int sa_sim_capture_invalidate_seq(uint64_t seq);
/* s is destroyed: its capture, if any, ends with it. */
void sa_sim_capture_forget(sa_sim_stream *s);

/* ---- checker.c: the stream-order checker -------------------------------- */
sa_status sa_sim_check_handout(uintptr_t p, size_t size, sa_stream stream, int device);

#endif /* SA_SIM_SIM_H */
