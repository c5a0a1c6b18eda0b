/* Simulated streams, and the progress of the work queued on them (events:
 * event.c).
 *
 * A stream is a queue of ops; op number k on a stream has ticket k (tickets
 * start at 1), so "everything up to ticket t has completed" is one integer
 * per stream. A wait op holds the (stream, ticket) an event marked when
 * the wait was enqueued (event.c).
 *
 * Progress: SA_HOST_MANUAL streams move only through sa_host_stream_step or
 * drain, or when a synchronize needs them; SA_HOST_AUTO streams run every op
 * whose waits are satisfied, re-checked whenever anything completes
 * (sa_sim_settle). Synchronize calls drive exactly what the target depends on,
 * transitively (sa_sim_drive). Waits only name tickets already enqueued when the
 * wait itself was enqueued, so the dependencies form no cycle and driving
 * always finishes.
 *
 * Devices: a stream belongs to one device, and so does an event; an event
 * is recorded only on its device's streams (cuEventRecord wants the stream
 * in the event's context), any stream may wait for any event
 * (cuStreamWaitEvent crosses devices). Kernels carry their device, which
 * must have access to what they touch when they run. Each device has its
 * own default stream, a queue of its own, as each CUDA context has its own
 * legacy stream; the handle NULL names the one of the device the caller
 * says (sim.h).
 *
 * Streams live in a slot table (slots below SA_SIM_FIRST_USER_SLOT: the
 * default streams, slot d device d's, handle NULL); a wait op or event
 * names its stream by (slot, sid). Destroying a stream
 * returns at once, as cuStreamDestroy does: work still queued keeps the slot
 * and sid (on a copy no handle reaches) and runs when something drives it
 * (a synchronize depending on it, device_synchronize, drain_all; at once if
 * the stream was AUTO and nothing blocks it); once it has run, the slot is
 * freed and (slot, sid) simply reads as complete.
 *
 * Handles are recycled as CUDA's are: a destroyed stream's handle goes to
 * the next stream created (last destroyed first), which has a new sid. Until
 * then the handle is known as destroyed, and a driver call of the library
 * on it (sa_sim_stream_for_call) is a violation: on a GPU it would be a
 * call on freed driver state.
 *
 * Capture (capture.c): what is enqueued on a capturing stream goes into a
 * graph the simulator does not keep: kernels are dropped, an event
 * recorded there belongs to the capture, a wait there for such an event
 * is a dependency inside the graph (for any other, refused).
 *
 * Called by driver/host.c, sim/event.c (queues and progress),
 * sim/checker.c (the stream table), sim/capture.c and users of
 * include/streamarena/host.h.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

/* The default streams: device d's has slot d and sid d + 1, from its first
 * use on (bit d of defaults_made), so that scans of the slot table skip the
 * devices that never used theirs without touching them. */
static sa_sim_stream default_streams[SA_SIM_MAX_DEVICES];
static uint64_t defaults_made;
static sa_host_mode default_mode = SA_HOST_AUTO; /* of every default stream */

static struct {
  sa_sim_stream **slots; /* from SA_SIM_FIRST_USER_SLOT on; below, default_streams */
  size_t nslots, cap;
  sa_sim_ptrset handles; /* live user stream handles */
  sa_sim_stream **dead;  /* destroyed, kept for their handles (a stack) */
  size_t ndead, dead_cap;
  sa_sim_ptrset dead_handles; /* the same, as a set */
  size_t user_streams;
  uint64_t next_sid;
} tab = {.nslots = SA_SIM_FIRST_USER_SLOT, .next_sid = SA_SIM_MAX_DEVICES + 1};

/* ---- the stream table --------------------------------------------------- */

size_t sa_sim_stream_slots(void) { return tab.nslots; }

sa_sim_stream *sa_sim_stream_at(size_t slot) {
  if (slot < SA_SIM_FIRST_USER_SLOT) {
    return defaults_made >> slot & 1 ? &default_streams[slot] : NULL;
  }
  return slot < tab.nslots ? tab.slots[slot] : NULL;
}

sa_sim_stream *sa_sim_default_stream(int device) {
  if (device < 0 || device >= SA_SIM_MAX_DEVICES) return NULL;
  sa_sim_stream *s = &default_streams[device];
  if (!(defaults_made >> device & 1)) {
    *s = (sa_sim_stream){.sid = (uint64_t)device + 1, .slot = (uint32_t)device,
                         .device = device, .mode = default_mode};
    defaults_made |= (uint64_t)1 << device;
  }
  return s;
}

int sa_sim_stream_is_default(const sa_sim_stream *s) {
  return s->slot < SA_SIM_FIRST_USER_SLOT;
}

sa_sim_stream *sa_sim_stream_lookup(sa_stream handle, int device) {
  if (handle == NULL) return sa_sim_default_stream(device);
  return sa_sim_ptrset_contains(&tab.handles, handle) ? (sa_sim_stream *)handle : NULL;
}

sa_stream sa_sim_stream_handle(const sa_sim_stream *s) {
  return sa_sim_stream_is_default(s) ? NULL : (sa_stream)s;
}

sa_sim_stream *sa_sim_stream_for_call(sa_stream handle, int device, const char *call) {
  sa_sim_stream *s = sa_sim_stream_lookup(handle, device);
  if (s == NULL && sa_sim_ptrset_contains(&tab.dead_handles, handle)) {
    fprintf(stderr,
            "streamarena host checker: %s on stream %p, which was destroyed (on a GPU: a "
            "driver call on freed stream state)\n",
            call, handle);
    sa_sim_note_violation();
  }
  return s;
}

sa_sim_stream *sa_sim_stream_ref(uint32_t slot, uint64_t sid) {
  sa_sim_stream *s = sa_sim_stream_at(slot);
  return s != NULL && s->sid == sid ? s : NULL;
}

size_t sa_sim_streams_on(int device) {
  size_t n = 0;
  for (size_t slot = SA_SIM_FIRST_USER_SLOT; slot < tab.nslots; slot++)
    n += tab.slots[slot] != NULL && tab.slots[slot]->device == device;
  return n;
}

int sa_sim_stream_on_device(const sa_sim_stream *s, int device) { return s->device == device; }

void sa_sim_stream_counters(sa_host_counters *out) { out->streams = tab.user_streams; }

static void stream_describe(const sa_sim_stream *s, char *buf, size_t len) {
  if (sa_sim_stream_is_default(s)) snprintf(buf, len, "the default stream of device %d", s->device);
  else snprintf(buf, len, "stream %p (#%" PRIu64 ", device %d)", (void *)s, s->sid, s->device);
}

/* ---- op queues ---------------------------------------------------------- */

sa_status sa_sim_ops_reserve(sa_sim_stream *s) {
  if (s->tail < s->cap) return SA_OK;
  if (s->head > 0) {
    memmove(s->ops, s->ops + s->head, (s->tail - s->head) * sizeof *s->ops);
    s->tail -= s->head;
    s->head = 0;
    return SA_OK;
  }
  size_t cap = s->cap < 16 ? 16 : s->cap * 2;
  sa_sim_op *ops = realloc(s->ops, cap * sizeof *ops);
  if (ops == NULL) return SA_ERR_OUT_OF_MEMORY;
  s->ops = ops;
  s->cap = cap;
  return SA_OK;
}

void sa_sim_ops_push(sa_sim_stream *s, const sa_sim_op *op) {
  s->ops[s->tail++] = *op;
  s->enqueued++;
}

static int op_ready(const sa_sim_op *op) {
  if (op->kind != SA_SIM_OP_WAIT || op->wait_sid == 0) return 1;
  const sa_sim_stream *t = sa_sim_stream_ref(op->wait_slot, op->wait_sid);
  return t == NULL || t->completed >= op->wait_ticket;
}

/* A kernel touches memory when it completes. Memory unmapped while the work
 * was queued is a contract violation (allocator bug): report, don't crash. */
static void run_kernel(const sa_sim_stream *s, const sa_sim_op *op) {
  if (!sa_sim_vmm_accessible(op->p, op->size, op->device)) {
    if (op->unmapped) return; /* reported at the unmap */
    char name[96];
    stream_describe(s, name, sizeof name);
    const char *kind = op->kind == SA_SIM_OP_FILL ? "fill" : "check";
    if (sa_sim_vmm_accessible(op->p, op->size, SA_SIM_ANY_DEVICE)) {
      /* Mapped for other devices only: a GPU faults on peer memory it was
       * not granted (cuMemSetAccess). */
      fprintf(stderr,
              "streamarena host: %s of device %d on %s reached [%p, %p), which device %d "
              "has no access to (memory of device %d, peer access not granted)\n",
              kind, op->device, name, (void *)op->p, (void *)(op->p + op->size), op->device,
              sa_sim_vmm_device_of(op->p));
    } else {
      fprintf(stderr,
              "streamarena host: %s on %s reached [%p, %p), which is no longer mapped and "
              "accessible: memory was unmapped or released while work using it was queued\n",
              kind, name, (void *)op->p, (void *)(op->p + op->size));
    }
    sa_sim_note_violation();
    return;
  }
  unsigned char *p = (unsigned char *)op->p;
  size_t size = op->size;
  if (size == 0) return;
  /* Whole-range memcpy/memcmp, not word loops: fast, also under sanitizers. */
  if (op->kind == SA_SIM_OP_FILL) {
    memcpy(p, &op->pattern, 4);
    for (size_t done = 4; done < size;) {
      size_t n = done < size - done ? done : size - done;
      memcpy(p + done, p, n); /* doubling: source and target never overlap */
      done += n;
    }
    return;
  }
  uint32_t block[1024];
  for (size_t i = 0; i < 1024; i++) block[i] = op->pattern;
  uint64_t bad = 0;
  for (size_t off = 0; off < size; off += sizeof block) {
    size_t n = size - off < sizeof block ? size - off : sizeof block;
    if (memcmp(p + off, block, n) == 0) continue;
    for (size_t i = 0; i < n; i += 4) {
      uint32_t w;
      memcpy(&w, p + off + i, 4);
      bad += w != op->pattern;
    }
  }
  *op->mismatches += bad;
}

static void complete_head(sa_sim_stream *s) {
  const sa_sim_op *op = &s->ops[s->head];
  if (op->kind == SA_SIM_OP_FILL || op->kind == SA_SIM_OP_CHECK) run_kernel(s, op);
  s->head++;
  s->completed++;
  if (s->head == s->tail) s->head = s->tail = 0;
}

/* Complete up to max ready ops at the head of s; returns how many. */
static size_t run(sa_sim_stream *s, size_t max) {
  size_t n = 0;
  while (n < max && s->head < s->tail && op_ready(&s->ops[s->head])) {
    complete_head(s);
    n++;
  }
  return n;
}

void sa_sim_settle(void) {
  int moved;
  do {
    moved = 0;
    for (size_t slot = 0; slot < tab.nslots; slot++) {
      sa_sim_stream *s = sa_sim_stream_at(slot);
      if (s != NULL && s->mode == SA_HOST_AUTO && s->head < s->tail && run(s, SIZE_MAX) > 0)
        moved = 1;
    }
  } while (moved);
  for (size_t slot = SA_SIM_FIRST_USER_SLOT; slot < tab.nslots; slot++) {
    sa_sim_stream *s = tab.slots[slot];
    if (s == NULL || !s->destroyed || s->head < s->tail) continue;
    free(s->ops);
    free(s);
    tab.slots[slot] = NULL;
  }
  while (tab.nslots > SA_SIM_FIRST_USER_SLOT && tab.slots[tab.nslots - 1] == NULL) tab.nslots--;
}

void sa_sim_drive(sa_sim_stream *s, uint64_t ticket) {
  while (s->completed < ticket) {
    const sa_sim_op *op = &s->ops[s->head];
    if (op->kind == SA_SIM_OP_WAIT && op->wait_sid != 0) {
      sa_sim_stream *t = sa_sim_stream_ref(op->wait_slot, op->wait_sid);
      if (t != NULL && t->completed < op->wait_ticket) sa_sim_drive(t, op->wait_ticket);
    }
    complete_head(s);
  }
}

/* ---- streams ------------------------------------------------------------ */

sa_status sa_sim_stream_create(int device, sa_host_mode mode, sa_stream *out) {
  if (out == NULL) return SA_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (mode != SA_HOST_AUTO && mode != SA_HOST_MANUAL) return SA_ERR_INVALID_ARGUMENT;
  if (device < 0 || device >= sa_sim_device_count()) return SA_ERR_NO_DEVICE;
  size_t slot = SA_SIM_FIRST_USER_SLOT;
  while (slot < tab.nslots && tab.slots[slot] != NULL) slot++;
  if (slot == tab.nslots && slot >= tab.cap) {
    size_t cap = tab.cap < SA_SIM_FIRST_USER_SLOT + 16 ? SA_SIM_FIRST_USER_SLOT + 16 : tab.cap * 2;
    if (cap > UINT32_MAX) return SA_ERR_OUT_OF_MEMORY;
    sa_sim_stream **slots = realloc(tab.slots, cap * sizeof *slots);
    if (slots == NULL) return SA_ERR_OUT_OF_MEMORY;
    tab.slots = slots;
    tab.cap = cap;
  }
  if (sa_sim_ptrset_reserve(&tab.handles, 1) != SA_OK) return SA_ERR_OUT_OF_MEMORY;
  sa_sim_stream *s;
  if (tab.ndead > 0) { /* the handle destroyed last, as CUDA tends to */
    s = tab.dead[--tab.ndead];
    (void)sa_sim_ptrset_remove(&tab.dead_handles, s);
    memset(s, 0, sizeof *s);
  } else if ((s = calloc(1, sizeof *s)) == NULL) {
    return SA_ERR_OUT_OF_MEMORY;
  }
  s->sid = tab.next_sid++;
  s->slot = (uint32_t)slot;
  s->device = device;
  s->mode = mode;
  tab.slots[slot] = s;
  if (slot == tab.nslots) tab.nslots++;
  sa_sim_ptrset_insert(&tab.handles, s);
  tab.user_streams++;
  *out = s;
  return SA_OK;
}

/* Keep a destroyed stream's memory for its handle's next stream (freed
 * memory could come back as anything); without room, just free it. */
static void keep_dead(sa_sim_stream *s) {
  if (tab.ndead == tab.dead_cap) {
    size_t cap = tab.dead_cap < 16 ? 16 : tab.dead_cap * 2;
    sa_sim_stream **dead = realloc(tab.dead, cap * sizeof *dead);
    if (dead == NULL) {
      free(s);
      return;
    }
    tab.dead = dead;
    tab.dead_cap = cap;
  }
  if (sa_sim_ptrset_reserve(&tab.dead_handles, 1) != SA_OK) {
    free(s);
    return;
  }
  sa_sim_ptrset_insert(&tab.dead_handles, s);
  tab.dead[tab.ndead++] = s;
}

sa_status sa_sim_stream_destroy(sa_stream handle) {
  if (handle == NULL) return SA_ERR_INVALID_ARGUMENT; /* a default stream stays */
  sa_sim_stream *s = sa_sim_stream_lookup(handle, -1);
  if (s == NULL) return SA_ERR_UNKNOWN_STREAM;
  /* cuStreamDestroy returns at once: queued work still runs, later. It moves
   * to a stream of its own that keeps the slot and sid (what events and
   * waits name), reachable by no handle; settle frees it once it ran. */
  sa_sim_stream *rest = NULL;
  if (s->head < s->tail) {
    rest = malloc(sizeof *rest);
    if (rest == NULL) {
      sa_sim_drive(s, s->enqueued); /* no host memory: run it now instead */
    } else {
      *rest = *s;
      rest->clock = (sa_sim_clock){NULL, 0}; /* nothing is enqueued on it any more */
      rest->destroyed = 1;
      s->ops = NULL;
    }
  }
  (void)sa_sim_ptrset_remove(&tab.handles, s);
  sa_sim_capture_forget(s);
  if (rest != NULL) rest->capture = SA_HOST_CAPTURE_NONE;
  tab.slots[s->slot] = rest;
  while (tab.nslots > SA_SIM_FIRST_USER_SLOT && tab.slots[tab.nslots - 1] == NULL) tab.nslots--;
  tab.user_streams--;
  free(s->ops);
  s->ops = NULL;
  sa_sim_clock_free(&s->clock);
  keep_dead(s);
  sa_sim_settle();
  return SA_OK;
}

void sa_sim_device_synchronize(int device) {
  for (size_t slot = 0; slot < tab.nslots; slot++) {
    sa_sim_stream *s = sa_sim_stream_at(slot);
    if (s != NULL && (device < 0 || sa_sim_stream_on_device(s, device)))
      sa_sim_drive(s, s->enqueued);
  }
  sa_sim_settle();
}

/* The stream a host wait or query names (call: its name in reports), if
 * CUDA would allow one now: not on a stream being captured, nor while an
 * unsafe call would end any capture; NULL and *st otherwise. */
static sa_sim_stream *stream_to_wait_on(sa_stream handle, int device, const char *call,
                                        sa_status *st) {
  sa_sim_stream *s = sa_sim_stream_for_call(handle, device, call);
  if (s == NULL) {
    *st = SA_ERR_UNKNOWN_STREAM;
    return NULL;
  }
  *st = sa_sim_capture_refuse_on(s);
  if (*st == SA_OK) *st = sa_sim_capture_unsafe_call();
  return *st == SA_OK ? s : NULL;
}

sa_status sa_sim_stream_synchronize(sa_stream handle, int device) {
  sa_status st;
  sa_sim_stream *s = stream_to_wait_on(handle, device, "stream_synchronize", &st);
  if (s == NULL) return st;
  sa_sim_drive(s, s->enqueued);
  sa_sim_settle();
  return SA_OK;
}

sa_status sa_sim_stream_query(sa_stream handle, int device) {
  sa_status st;
  sa_sim_stream *s = stream_to_wait_on(handle, device, "stream_query", &st);
  if (s == NULL) return st;
  return s->completed == s->enqueued ? SA_OK : SA_ERR_NOT_READY;
}

sa_status sa_sim_stream_id(sa_stream handle, int device, uint64_t *id) {
  sa_sim_stream *s = sa_sim_stream_for_call(handle, device, "stream_id");
  if (s == NULL) return SA_ERR_UNKNOWN_STREAM;
  sa_status st = sa_sim_capture_refuse_on(s);
  if (st == SA_OK) *id = s->sid;
  return st;
}

void sa_sim_note_unmap(uintptr_t va, size_t size) {
  uintptr_t end = va > UINTPTR_MAX - size ? UINTPTR_MAX : va + size;
  for (size_t slot = 0; slot < tab.nslots; slot++) {
    sa_sim_stream *s = sa_sim_stream_at(slot);
    if (s == NULL) continue;
    for (size_t i = s->head; i < s->tail; i++) {
      sa_sim_op *op = &s->ops[i];
      if (op->kind != SA_SIM_OP_FILL && op->kind != SA_SIM_OP_CHECK) continue;
      if (op->unmapped || op->size == 0 || op->p >= end || va >= op->p + op->size) continue;
      char name[96];
      stream_describe(s, name, sizeof name);
      fprintf(stderr,
              "streamarena host: [%p, %p) unmapped while a %s of [%p, %p) on %s (op ticket "
              "%" PRIu64 ") is still queued: cuMemUnmap does not wait for queued work\n",
              (void *)va, (void *)end, op->kind == SA_SIM_OP_FILL ? "fill" : "check",
              (void *)op->p, (void *)(op->p + op->size), name,
              s->completed + 1 + (uint64_t)(i - s->head));
      op->unmapped = 1;
      sa_sim_note_violation();
    }
  }
}

sa_status sa_sim_enqueue_kernel(sa_stream handle, int device, sa_sim_op_kind kind, uintptr_t p,
                                size_t size, uint32_t pattern, uint64_t *mismatches) {
  sa_sim_stream *s = sa_sim_stream_lookup(handle, device);
  if (s == NULL) return SA_ERR_UNKNOWN_STREAM;
  if (!sa_sim_stream_on_device(s, device)) {
    return sa_sim_fail(SA_ERR_UNKNOWN_STREAM, EINVAL,
                       "host: kernel of one device on a stream of another");
  }
  if (s->capture != SA_HOST_CAPTURE_NONE) return SA_OK; /* into the graph, not run now */
  if (sa_sim_ops_reserve(s) != SA_OK) return SA_ERR_OUT_OF_MEMORY;
  sa_sim_op op = {.kind = kind, .device = device, .pattern = pattern, .p = p, .size = size,
                  .mismatches = mismatches};
  sa_sim_ops_push(s, &op);
  sa_sim_settle();
  return SA_OK;
}

/* ---- include/streamarena/host.h ---------------------------------------- */

sa_status sa_host_stream_create(sa_host_mode mode, sa_stream *out) {
  sa_sim_lock();
  sa_status st = sa_sim_stream_create(sa_host_get_device(), mode, out);
  sa_sim_unlock();
  return st;
}

sa_status sa_host_stream_device(sa_stream stream, int *device) {
  if (device == NULL) return SA_ERR_INVALID_ARGUMENT;
  sa_sim_lock();
  sa_sim_stream *s = sa_sim_stream_lookup(stream, sa_host_get_device());
  if (s != NULL) *device = s->device;
  sa_sim_unlock();
  return s == NULL ? SA_ERR_UNKNOWN_STREAM : SA_OK;
}

sa_status sa_host_stream_destroy(sa_stream stream) {
  sa_sim_lock();
  sa_status st = sa_sim_stream_destroy(stream);
  sa_sim_unlock();
  return st;
}

sa_status sa_host_set_default_stream_mode(sa_host_mode mode) {
  if (mode != SA_HOST_AUTO && mode != SA_HOST_MANUAL) return SA_ERR_INVALID_ARGUMENT;
  sa_sim_lock();
  default_mode = mode;
  for (int dev = 0; dev < SA_SIM_MAX_DEVICES; dev++)
    if (defaults_made >> dev & 1) default_streams[dev].mode = mode;
  sa_sim_settle();
  sa_sim_unlock();
  return SA_OK;
}

sa_status sa_host_stream_step(sa_stream stream, size_t n, size_t *done) {
  if (done != NULL) *done = 0;
  sa_sim_lock();
  sa_sim_stream *s = sa_sim_stream_lookup(stream, sa_host_get_device());
  if (s == NULL) {
    sa_sim_unlock();
    return SA_ERR_UNKNOWN_STREAM;
  }
  size_t total = 0;
  while (total < n) {
    size_t k = run(s, n - total);
    if (k == 0) break;
    total += k;
    sa_sim_settle(); /* may unblock a wait of s on an auto stream */
  }
  sa_sim_unlock();
  if (done != NULL) *done = total;
  return SA_OK;
}

sa_status sa_host_stream_drain(sa_stream stream) {
  sa_sim_lock();
  sa_sim_stream *s = sa_sim_stream_lookup(stream, sa_host_get_device());
  if (s != NULL) {
    sa_sim_drive(s, s->enqueued);
    sa_sim_settle();
  }
  sa_sim_unlock();
  return s == NULL ? SA_ERR_UNKNOWN_STREAM : SA_OK;
}

sa_status sa_host_drain_all(void) {
  sa_sim_lock();
  sa_sim_device_synchronize(-1);
  sa_sim_unlock();
  return SA_OK;
}

size_t sa_host_stream_pending(sa_stream stream) {
  sa_sim_lock();
  sa_sim_stream *s = sa_sim_stream_lookup(stream, sa_host_get_device());
  size_t n = s == NULL ? 0 : (size_t)(s->enqueued - s->completed);
  sa_sim_unlock();
  return n;
}

/* A kernel of the public API is work of its stream's device: NULL is the
 * default stream of the calling thread's current device (lock held). */
static int kernel_device(sa_stream stream) {
  sa_sim_stream *s = sa_sim_stream_lookup(stream, sa_host_get_device());
  return s != NULL ? s->device : sa_host_get_device();
}

static sa_status kernel_args(const void *p, size_t size) {
  if (size % 4 != 0 || (p == NULL && size != 0)) return SA_ERR_INVALID_ARGUMENT;
  if ((uintptr_t)p > UINTPTR_MAX - size) return SA_ERR_INVALID_ARGUMENT;
  return SA_OK;
}

sa_status sa_host_fill(sa_stream stream, void *p, size_t size, uint32_t pattern) {
  sa_status st = kernel_args(p, size);
  if (st != SA_OK) return st;
  sa_sim_lock();
  st = sa_sim_enqueue_kernel(stream, kernel_device(stream), SA_SIM_OP_FILL, (uintptr_t)p, size,
                             pattern, NULL);
  sa_sim_unlock();
  return st;
}

sa_status sa_host_check(sa_stream stream, const void *p, size_t size, uint32_t pattern,
                        uint64_t *mismatches) {
  sa_status st = kernel_args(p, size);
  if (st != SA_OK) return st;
  if (mismatches == NULL) return SA_ERR_INVALID_ARGUMENT;
  sa_sim_lock();
  st = sa_sim_enqueue_kernel(stream, kernel_device(stream), SA_SIM_OP_CHECK, (uintptr_t)p, size,
                             pattern, mismatches);
  sa_sim_unlock();
  return st;
}
