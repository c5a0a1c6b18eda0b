/* train_loop: a training-loop-shaped workload on streamarena's public API.
 *
 * Each worker thread owns one stream and runs --steps steps. A step is a
 * forward pass that allocates a transformer-like layer's activations in
 * order (the sequence length varies from step to step, so sizes range from
 * a few KiB to tens of MiB), a backward pass that allocates short-lived
 * gradients and frees the activations in reverse order, and a gradient
 * bucket handed to the next thread:
 *   - even steps: the receiver uses it on its stream and frees it there
 *     (a cross-stream free);
 *   - odd steps: the receiver uses it on its stream, calls
 *     sa_record_stream, and sends it back; the owner frees it on its own
 *     stream, and reuse must then wait for the receiver's stream too.
 * Every buffer gets canaries (its first and last 4 KiB) written on its
 * stream when it is allocated. On the host backend they are verified on the
 * stream just before the free, so memory handed out again too early shows up
 * as mismatching words; on CUDA they are written with cuMemsetD32Async.
 *
 * Usage: train_loop [--threads N] [--steps N] [--layers N]
 *                   [--min-seq N] [--max-seq N] [--progress N] [--conf SPEC]
 * (train_loop --help: what each option does, its range and default, and the
 * configuration keys). SPEC is sa_config_parse syntax, e.g.
 * "backend=host,check_stream_order=1". The first line names the backend and
 * why it was chosen. Exits 0 when every call succeeded, no canary mismatched
 * and the arena was destroyed with no block left; after a failure every
 * thread stops, frees what it holds, and the summary still shows the
 * arena's figures.
 *
 * Under `bazel run` a relative path in --conf (trace=run.csv) is taken from
 * the folder the command was typed in (BUILD_WORKING_DIRECTORY).
 *
 * Streams: on the host backend they come from sa_host_stream_create; on
 * CUDA from cuStreamCreate, loaded from libcuda.so.1 like the library does
 * (so this program, too, builds and runs without the CUDA driver). */
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#define MIB (1024.0 * 1024.0)
#define CANARY_BYTES 4096u

/* ------------------------------------------------------------------------
 * Options
 * ---------------------------------------------------------------------- */
typedef struct options_s {
  int threads;
  int steps;
  int layers;
  int min_seq, max_seq; /* tokens per sequence, varied per step */
  int progress;         /* steps between progress lines (0: none) */
  const char *conf;
} options;

static const options defaults = {.threads = 4, .steps = 200, .layers = 8, .min_seq = 128,
                                 .max_seq = 1024, .progress = 50, .conf = ""};

/* The numeric options: name, field, range, and what it does (for --help). */
static const struct int_option_s {
  const char *name;
  size_t offset;
  int min, max;
  const char *help;
} int_options[] = {
    {"--threads", offsetof(options, threads), 1, 256, "worker threads, each on its own stream"},
    {"--steps", offsetof(options, steps), 1, INT_MAX, "training steps per thread"},
    {"--layers", offsetof(options, layers), 1, 1024, "layers per step, 5 activations each"},
    {"--min-seq", offsetof(options, min_seq), 1, 1 << 16, "shortest sequence, in tokens"},
    {"--max-seq", offsetof(options, max_seq), 1, 1 << 16,
     "longest sequence; each step draws one in between"},
    {"--progress", offsetof(options, progress), 0, INT_MAX,
     "steps between progress lines, 0 for none"},
};
enum { INT_OPTIONS = sizeof int_options / sizeof int_options[0] };

static void usage(FILE *f) {
  fprintf(f,
          "usage: train_loop [--threads N] [--steps N] [--layers N] [--min-seq N]\n"
          "                  [--max-seq N] [--progress N] [--conf SPEC]\n");
}

static void help(void) {
  usage(stdout);
  printf("\nA training-loop workload on streamarena. Each thread owns a stream; a step\n"
         "allocates a transformer's activations in forward order (KiBs to tens of MiB,\n"
         "with the sequence length), frees them in backward order around short-lived\n"
         "gradients, and hands a gradient bucket to the next thread, which frees it on\n"
         "its stream or records its stream (sa_record_stream) and sends it back. Prints\n"
         "the backend and why, progress lines, and a summary; exits non-zero on any\n"
         "failed call, overwritten canary, or block left at the end.\n\n"
         "Options (range, default):\n");
  for (int i = 0; i < INT_OPTIONS; i++) {
    const struct int_option_s *io = &int_options[i];
    char range[32];
    if (io->max == INT_MAX)
      snprintf(range, sizeof range, "%d or more", io->min);
    else
      snprintf(range, sizeof range, "%d..%d", io->min, io->max);
    printf("  %-12s %s (%s, default %d)\n", io->name, io->help, range,
           *(const int *)((const char *)&defaults + io->offset));
  }
  printf("  %-12s arena configuration, key=value,... (default: none)\n"
         "  %-12s this text\n\n",
         "--conf SPEC", "-h, --help");
  printf("Configuration keys for --conf (README.md, \"Configuration keys\"):\n"
         "  device=N                 CUDA device ordinal (0)\n"
         "  backend=auto|cuda|host   auto: CUDA where usable, else the host simulator;\n"
         "                           STREAMARENA_BACKEND=cuda|host forces one under auto\n"
         "  peer_access=all|none|1+2 devices that may also use the memory (none)\n"
         "  superblock_size=SIZE     small-block superblocks (the granularity, 2 MiB)\n"
         "  va_reserve=SIZE          virtual range reserved (4 x device memory)\n"
         "  max_physical=SIZE        physical memory cap (the whole device)\n"
         "  reserve_limit=SIZE       soft budget: remap free memory before growing past it\n"
         "                           (the footprint target, 1/64 above the live peak)\n"
         "  footprint_target=F       the footprint target: F x the live peak, 1 to 8,\n"
         "                           or tight|balanced|fast (tight: 1 + 1/64)\n"
         "  release_threshold=SIZE   physical bytes sa_defragment keeps cached (0)\n"
         "  large_threshold=SIZE     larger requests get their own span (superblock/2,\n"
         "                           at most 64 MiB)\n"
         "  chunk_size=SIZE          physical chunks of spans, the unit a reshape takes\n"
         "                           back (one per growth; a granule under a budget)\n"
         "  initial_physical=SIZE    mapped at creation, a pool for large requests (0)\n"
         "  exact_growth=0|1         map only what a request misses, nothing ahead (0)\n"
         "  background_growth=0|1    a thread of the arena's maps ahead of a climb (0)\n"
         "  check_stream_order=0|1   host backend: verify every handout (0)\n"
         "  oom_report=0|1           report on stderr at out of memory (0)\n"
         "  trace=PATH               write an allocation trace (none)\n"
         "  keep_spans=0|1           a thread keeps its last span freed on a stream for\n"
         "                           that stream's next request of its size (0)\n"
         "SIZE takes B, KiB, MiB, GiB, TiB (or K, M, G, T), e.g. 4MiB.\n");
}

/* Parse v into the int option io; a message on a bad value. */
static bool parse_int_option(const struct int_option_s *io, const char *v, options *o) {
  char *end = NULL;
  errno = 0;
  long n = strtol(v, &end, 10);
  if (end == v || *end != '\0') {
    fprintf(stderr, "train_loop: %s: '%s' is not a whole number\n", io->name, v);
    return false;
  }
  if (errno != 0 || n < io->min || n > io->max) {
    if (io->max == INT_MAX)
      fprintf(stderr, "train_loop: %s: %s is out of range (%d or more)\n", io->name, v, io->min);
    else
      fprintf(stderr, "train_loop: %s: %s is out of range (%d..%d)\n", io->name, v, io->min,
              io->max);
    return false;
  }
  *(int *)((char *)o + io->offset) = (int)n;
  return true;
}

/* Returns 0 to go on, 1 for --help, -1 on a bad argument (after a message). */
static int parse_options(int argc, char **argv, options *o) {
  *o = defaults;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return 1;
    const struct int_option_s *io = NULL;
    for (int k = 0; k < INT_OPTIONS; k++)
      if (strcmp(a, int_options[k].name) == 0) io = &int_options[k];
    if (io == NULL && strcmp(a, "--conf") != 0) {
      if (a[0] == '-')
        fprintf(stderr, "train_loop: unknown option %s\n", a);
      else
        fprintf(stderr, "train_loop: unexpected argument '%s' (options start with --)\n", a);
      return -1;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "train_loop: %s needs a value\n", a);
      return -1;
    }
    const char *v = argv[++i];
    if (io == NULL) {
      o->conf = v;
    } else if (!parse_int_option(io, v, o)) {
      return -1;
    }
  }
  if (o->min_seq > o->max_seq) {
    fprintf(stderr, "train_loop: --min-seq %d is larger than --max-seq %d\n", o->min_seq,
            o->max_seq);
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------------------
 * Streams, canaries and cross-stream ordering, per backend.
 *
 * Host: streams from host.h (SA_HOST_AUTO: work completes once what it
 * waits for has), canaries written and checked by simulated kernels; a
 * handoff drains the sender's stream, as host.h has no events.
 * CUDA: streams, memsets and events through libcuda.so.1; a handoff records
 * an event on the sender's stream that the receiver's stream waits for.
 * ---------------------------------------------------------------------- */

/* This program's own small libcuda loader, on purpose: it is the example a
 * user copies, so it uses only the public API and plain dlsym (the project's
 * tests and benchmarks share the library's loader, src/driver/cuda_loader.h,
 * which is internal). */
#define CU_STR_(x) #x
#define CU_STR(x) CU_STR_(x) /* expands cuda.h's _v2 renames first */

typedef struct cuda_api_s {
  void *lib;
  CUcontext ctx;
  CUdevice dev;
  __typeof__(&cuInit) init;
  __typeof__(&cuDeviceGet) device_get;
  __typeof__(&cuDevicePrimaryCtxRetain) ctx_retain;
  __typeof__(&cuDevicePrimaryCtxRelease) ctx_release;
  __typeof__(&cuCtxSetCurrent) ctx_set_current;
  __typeof__(&cuStreamCreate) stream_create;
  __typeof__(&cuStreamDestroy) stream_destroy;
  __typeof__(&cuStreamSynchronize) stream_synchronize;
  __typeof__(&cuStreamWaitEvent) stream_wait_event;
  __typeof__(&cuEventCreate) event_create;
  __typeof__(&cuEventRecord) event_record;
  __typeof__(&cuEventDestroy) event_destroy;
  __typeof__(&cuMemsetD32Async) memset32_async;
} cuda_api;

static cuda_api cu;

static bool cuda_load(int device) {
  cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (cu.lib == NULL) {
    fprintf(stderr, "train_loop: cannot load libcuda.so.1: %s\n", dlerror());
    return false;
  }
#define LOAD(field, fn)                                                            \
  do {                                                                             \
    *(void **)&cu.field = dlsym(cu.lib, CU_STR(fn));                               \
    if (cu.field == NULL) {                                                        \
      fprintf(stderr, "train_loop: libcuda.so.1 lacks %s\n", CU_STR(fn));          \
      return false;                                                                \
    }                                                                              \
  } while (0)
  LOAD(init, cuInit);
  LOAD(device_get, cuDeviceGet);
  LOAD(ctx_retain, cuDevicePrimaryCtxRetain);
  LOAD(ctx_release, cuDevicePrimaryCtxRelease);
  LOAD(ctx_set_current, cuCtxSetCurrent);
  LOAD(stream_create, cuStreamCreate);
  LOAD(stream_destroy, cuStreamDestroy);
  LOAD(stream_synchronize, cuStreamSynchronize);
  LOAD(stream_wait_event, cuStreamWaitEvent);
  LOAD(event_create, cuEventCreate);
  LOAD(event_record, cuEventRecord);
  LOAD(event_destroy, cuEventDestroy);
  LOAD(memset32_async, cuMemsetD32Async);
#undef LOAD
  CUresult r = cu.init(0);
  if (r == CUDA_SUCCESS) r = cu.device_get(&cu.dev, device);
  if (r == CUDA_SUCCESS) r = cu.ctx_retain(&cu.ctx, cu.dev);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "train_loop: CUDA setup failed (CUresult %d)\n", (int)r);
    return false;
  }
  return true;
}

static void cuda_unload(void) {
  if (cu.ctx != NULL) cu.ctx_release(cu.dev);
  if (cu.lib != NULL) dlclose(cu.lib);
  memset(&cu, 0, sizeof cu);
}

/* The first failure of the run, for the summary. */
static pthread_mutex_t first_failure_lock = PTHREAD_MUTEX_INITIALIZER;
static char first_failure[192];

/* Print a failing call and return false: the worker then stops. Where the
 * driver said why (no device, a driver error), its reason is added. */
static bool sa_check(sa_status s, const char *what) {
  if (s == SA_OK) return true;
  char line[192];
  const char *cause = NULL;
  if (s == SA_ERR_NO_DEVICE || s == SA_ERR_DRIVER) (void)sa_last_driver_error(&cause);
  snprintf(line, sizeof line, "%s: %s%s%s%s", what, sa_status_string(s), cause ? " (" : "",
           cause ? cause : "", cause ? ")" : "");
  fprintf(stderr, "train_loop: %s\n", line);
  pthread_mutex_lock(&first_failure_lock);
  if (first_failure[0] == '\0') snprintf(first_failure, sizeof first_failure, "%s", line);
  pthread_mutex_unlock(&first_failure_lock);
  return false;
}

static bool cu_check(CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return true;
  fprintf(stderr, "train_loop: %s: CUresult %d\n", what, (int)r);
  return false;
}

static sa_backend backend; /* resolved, set once before the workers start */

static bool stream_create(sa_stream *out) {
  if (backend == SA_BACKEND_HOST) {
    return sa_check(sa_host_stream_create(SA_HOST_AUTO, out), "sa_host_stream_create");
  }
  CUstream s = NULL;
  if (!cu_check(cu.ctx_set_current(cu.ctx), "cuCtxSetCurrent") ||
      !cu_check(cu.stream_create(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate")) {
    return false;
  }
  *out = s;
  return true;
}

static bool stream_synchronize(sa_stream s) {
  if (backend == SA_BACKEND_HOST) return sa_check(sa_host_stream_drain(s), "sa_host_stream_drain");
  return cu_check(cu.stream_synchronize((CUstream)s), "cuStreamSynchronize");
}

static bool stream_destroy(sa_stream s) {
  if (backend == SA_BACKEND_HOST) {
    return sa_check(sa_host_stream_destroy(s), "sa_host_stream_destroy");
  }
  return cu_check(cu.stream_destroy((CUstream)s), "cuStreamDestroy");
}

/* The pattern a buffer's canaries hold: who allocated it and when. */
static uint32_t pattern_of(int thread, int step, int index) {
  return 0x5a000000u ^ ((uint32_t)thread << 20) ^ ((uint32_t)step << 8) ^ (uint32_t)index;
}

/* Write the canaries of [p, p + size) on stream s. */
static bool canary_write(sa_stream s, void *p, size_t size, uint32_t pattern) {
  size_t head = size < CANARY_BYTES ? size : CANARY_BYTES;
  char *tail = (char *)p + size - head;
  if (backend == SA_BACKEND_HOST) {
    return sa_check(sa_host_fill(s, p, head, pattern), "sa_host_fill") &&
           sa_check(sa_host_fill(s, tail, head, pattern), "sa_host_fill");
  }
  return cu_check(cu.memset32_async((CUdeviceptr)(uintptr_t)p, pattern, head / 4, (CUstream)s),
                  "cuMemsetD32Async") &&
         cu_check(cu.memset32_async((CUdeviceptr)(uintptr_t)tail, pattern, head / 4,
                                    (CUstream)s),
                  "cuMemsetD32Async");
}

/* Host: enqueue a check of the canaries; mismatches land in *bad when it
 * completes. CUDA: nothing to check from the host. */
static bool canary_check(sa_stream s, const void *p, size_t size, uint32_t pattern,
                         uint64_t *bad) {
  if (backend != SA_BACKEND_HOST) return true;
  size_t head = size < CANARY_BYTES ? size : CANARY_BYTES;
  const char *tail = (const char *)p + size - head;
  return sa_check(sa_host_check(s, p, head, pattern, bad), "sa_host_check") &&
         sa_check(sa_host_check(s, tail, head, pattern, bad), "sa_host_check");
}

/* Sender side of a handoff: an event the receiver's stream will wait on.
 * host.h has no events, so on the host backend the sender's stream is
 * drained instead (*out stays NULL). */
static bool handoff_mark(sa_stream from, CUevent *out) {
  *out = NULL;
  if (backend == SA_BACKEND_HOST) return stream_synchronize(from);
  CUevent e = NULL;
  if (!cu_check(cu.event_create(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate")) return false;
  if (!cu_check(cu.event_record(e, (CUstream)from), "cuEventRecord")) {
    cu.event_destroy(e);
    return false;
  }
  *out = e;
  return true;
}

/* Receiver side: order stream `to` after the sender's work. */
static bool handoff_wait(sa_stream to, CUevent e) {
  if (e == NULL) return true;
  bool ok = cu_check(cu.stream_wait_event((CUstream)to, e, 0), "cuStreamWaitEvent");
  /* Destroying an event that a stream still waits on is allowed: CUDA
   * releases it once the wait is resolved. */
  return cu_check(cu.event_destroy(e), "cuEventDestroy") && ok;
}

/* ------------------------------------------------------------------------
 * Mailboxes: how buffers travel between worker threads.
 * ---------------------------------------------------------------------- */
typedef enum msg_kind_e {
  MSG_FREE_THERE, /* receiver uses it, then frees it on its own stream */
  MSG_USE_RECORD, /* receiver uses it, records its stream, sends it back */
  MSG_RETURNED    /* back at the owner: free on the owner's stream */
} msg_kind;

typedef struct msg_s {
  msg_kind kind;
  void *p;
  size_t size;
  uint32_t pattern;
  int owner;
  CUevent ready; /* CUDA: the sender's work on p is done after this */
} msg;

typedef struct mailbox_s {
  pthread_mutex_t lock;
  msg *items;
  size_t count, capacity;
} mailbox;

static bool mailbox_push(mailbox *m, msg item) {
  bool ok = true;
  pthread_mutex_lock(&m->lock);
  if (m->count == m->capacity) {
    size_t cap = m->capacity ? m->capacity * 2 : 16;
    msg *grown = realloc(m->items, cap * sizeof *grown);
    if (grown == NULL) {
      ok = false;
    } else {
      m->items = grown;
      m->capacity = cap;
    }
  }
  if (ok) m->items[m->count++] = item;
  pthread_mutex_unlock(&m->lock);
  if (!ok) fprintf(stderr, "train_loop: out of host memory for a mailbox\n");
  return ok;
}

/* Take everything queued; the caller frees *out. */
static size_t mailbox_take(mailbox *m, msg **out) {
  pthread_mutex_lock(&m->lock);
  size_t n = m->count;
  *out = m->items;
  m->items = NULL;
  m->count = m->capacity = 0;
  pthread_mutex_unlock(&m->lock);
  return n;
}

/* ------------------------------------------------------------------------
 * The workers
 * ---------------------------------------------------------------------- */
typedef struct shared_s {
  const options *opt;
  sa_arena *arena;
  mailbox *boxes; /* one per thread */
  pthread_barrier_t barrier;
  atomic_int failed; /* set by any worker that hit an error */
} shared;

typedef struct worker_s {
  shared *sh;
  int id;
  sa_stream stream;
  bool has_stream;
  uint64_t rng;
  int steps_done;
  uint64_t allocs, frees, handoffs, records;
  uint64_t mismatches; /* written by host check kernels; read after drain */
  bool ok;
} worker;

/* xorshift64*, as test/util.h's sa_xorshift64s; written out here so that
 * the example stands alone. */
static uint64_t next_random(worker *w) {
  w->rng ^= w->rng >> 12;
  w->rng ^= w->rng << 25;
  w->rng ^= w->rng >> 27;
  return w->rng * 2685821657736338717ull;
}

typedef struct buffer_s {
  void *p;
  size_t size;
  uint32_t pattern;
} buffer;

static bool alloc_buffer(worker *w, buffer *b, size_t size, int step, int index) {
  b->size = (size + 255) & ~(size_t)255; /* canaries need whole words */
  b->pattern = pattern_of(w->id, step, index);
  sa_status st = sa_alloc(w->sh->arena, &b->p, b->size, w->stream);
  if (st != SA_OK) {
    char what[96];
    snprintf(what, sizeof what, "sa_alloc of %.1f MiB (thread %d, step %d)",
             (double)b->size / MIB, w->id, step);
    return sa_check(st, what);
  }
  w->allocs++;
  return canary_write(w->stream, b->p, b->size, b->pattern);
}

/* Check on the stream that frees, then free: the check runs before any work
 * that a reuse of the memory on this stream could enqueue. */
static bool free_buffer(worker *w, buffer *b) {
  if (!canary_check(w->stream, b->p, b->size, b->pattern, &w->mismatches)) return false;
  if (!sa_check(sa_free(b->p, w->stream), "sa_free")) return false;
  b->p = NULL; /* what a failed step still holds is what is not NULL */
  w->frees++;
  return true;
}

/* Handle everything in this worker's mailbox (after a failure too: the
 * buckets are freed, so the arena's destroy reports no leak that the
 * failure did not cause). */
static bool serve_mailbox(worker *w) {
  shared *sh = w->sh;
  msg *items = NULL;
  size_t n = mailbox_take(&sh->boxes[w->id], &items);
  bool ok = true;
  for (size_t i = 0; i < n && ok; i++) {
    msg m = items[i];
    buffer b = {m.p, m.size, m.pattern};
    switch (m.kind) {
      case MSG_FREE_THERE:
        ok = handoff_wait(w->stream, m.ready) && free_buffer(w, &b);
        break;
      case MSG_USE_RECORD:
        ok = handoff_wait(w->stream, m.ready) &&
             canary_check(w->stream, m.p, m.size, m.pattern, &w->mismatches) &&
             sa_check(sa_record_stream(m.p, w->stream), "sa_record_stream");
        if (ok) {
          w->records++;
          m.kind = MSG_RETURNED;
          m.ready = NULL; /* the owner's free needs no ordering: record_stream did it */
          ok = mailbox_push(&sh->boxes[m.owner], m);
        }
        break;
      case MSG_RETURNED:
        ok = free_buffer(w, &b);
        break;
    }
  }
  /* Items not reached after an error are dropped; the arena reports them as
   * live blocks at destroy. */
  free(items);
  return ok;
}

/* Activation sizes of one transformer layer for seq tokens (batch 4, hidden
 * 1024, 2-byte elements, one attention head's scores). */
enum { PER_LAYER = 5 };
static void layer_sizes(size_t seq, size_t out[PER_LAYER]) {
  const size_t batch = 4, hidden = 1024, elem = 2;
  out[0] = batch * seq * 4 * elem;          /* layernorm statistics */
  out[1] = batch * seq * 3 * hidden * elem; /* q, k, v */
  out[2] = batch * seq * seq * elem;        /* attention scores */
  out[3] = batch * seq * 4 * hidden * elem; /* MLP up-projection */
  out[4] = batch * seq * hidden * elem;     /* layer output */
}

/* After a failure: free the activations a step still holds. */
static void free_held(worker *w, buffer *acts) {
  for (int i = 0; i < w->sh->opt->layers * PER_LAYER; i++)
    if (acts[i].p != NULL) (void)free_buffer(w, &acts[i]);
}

static bool run_step(worker *w, int step, buffer *acts) {
  const options *o = w->sh->opt;
  int span = o->max_seq - o->min_seq + 1;
  size_t seq = (size_t)o->min_seq + (size_t)(next_random(w) % (uint64_t)span);
  size_t sizes[PER_LAYER];
  layer_sizes(seq, sizes);

  /* Forward: activations in layer order. */
  for (int l = 0; l < o->layers; l++) {
    for (int k = 0; k < PER_LAYER; k++) {
      if (!alloc_buffer(w, &acts[l * PER_LAYER + k], sizes[k], step, l * PER_LAYER + k)) {
        return false;
      }
    }
  }
  /* Backward: per layer, a short-lived gradient, then the layer's
   * activations in reverse order. */
  for (int l = o->layers - 1; l >= 0; l--) {
    buffer grad;
    if (!alloc_buffer(w, &grad, sizes[3], step, 0xff) || !free_buffer(w, &grad)) return false;
    for (int k = PER_LAYER - 1; k >= 0; k--) {
      if (!free_buffer(w, &acts[l * PER_LAYER + k])) return false;
    }
  }
  /* A gradient bucket (1..25 MiB, as data-parallel buckets are) for the
   * next thread. */
  buffer bucket;
  size_t bucket_size = ((size_t)1 << 20) + (size_t)(next_random(w) % (24u << 20));
  if (!alloc_buffer(w, &bucket, bucket_size, step, 0xfe)) return false;
  msg m = {.kind = (step % 2 == 0) ? MSG_FREE_THERE : MSG_USE_RECORD,
           .p = bucket.p,
           .size = bucket.size,
           .pattern = bucket.pattern,
           .owner = w->id};
  if (!handoff_mark(w->stream, &m.ready)) return false;
  int to = (w->id + 1) % o->threads;
  if (!mailbox_push(&w->sh->boxes[to], m)) return false;
  w->handoffs++;

  /* Buckets from the previous thread, and ours coming back. */
  if (!serve_mailbox(w)) return false;
  /* The host waits for its stream once per step, as a loss.item() does. */
  return stream_synchronize(w->stream);
}

static void print_progress(worker *w, int step) {
  sa_stats st;
  if (sa_get_stats(w->sh->arena, &st) != SA_OK) return;
  printf("step %6d/%d  live %9.1f MiB  reserved %9.1f MiB  cached %9.1f MiB\n", step,
         w->sh->opt->steps, (double)st.live_bytes / MIB, (double)st.reserved_bytes / MIB,
         (double)st.cached_bytes / MIB);
  fflush(stdout);
}

/* Wait for every worker; a failed worker still arrives, so none blocks. */
static void sync_all(shared *sh) { pthread_barrier_wait(&sh->barrier); }

static void *worker_main(void *arg) {
  worker *w = arg;
  shared *sh = w->sh;
  const options *o = sh->opt;
  buffer *acts = calloc((size_t)o->layers * PER_LAYER, sizeof *acts);
  w->ok = acts != NULL && stream_create(&w->stream);
  w->has_stream = w->ok;
  sync_all(sh);
  for (int step = 1; step <= o->steps && w->ok && !sh->failed; step++) {
    w->ok = run_step(w, step, acts);
    if (w->ok) w->steps_done = step;
    if (w->id == 0 && o->progress > 0 && step % o->progress == 0) print_progress(w, step);
  }
  if (!w->ok) {
    sh->failed = 1;
    if (w->has_stream) free_held(w, acts);
  }
  /* Drain in phases: every bucket sent is received (phase 1), every bucket
   * sent back is freed (phase 2); after a failure too, so that what is left
   * at destroy is only what the failure itself stranded. */
  sync_all(sh);
  if (w->has_stream && !serve_mailbox(w)) w->ok = false;
  sync_all(sh);
  if (w->has_stream && !serve_mailbox(w)) w->ok = false;
  sync_all(sh);
  if (w->has_stream && !stream_synchronize(w->stream)) w->ok = false;
  /* The stream must go back to the arena before it is destroyed; everyone
   * is done with it only after the last barrier. */
  sync_all(sh);
  if (w->has_stream) {
    if (!sa_check(sa_stream_release(sh->arena, w->stream), "sa_stream_release")) w->ok = false;
    if (!stream_destroy(w->stream)) w->ok = false;
  }
  if (!w->ok) sh->failed = 1;
  free(acts);
  return NULL;
}

/* ------------------------------------------------------------------------
 * main
 * ---------------------------------------------------------------------- */
static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void print_summary(const options *o, const worker *ws, double seconds, const sa_stats *st,
                          uint64_t mismatches) {
  uint64_t allocs = 0, frees = 0, handoffs = 0, records = 0;
  int fewest = o->steps, most = 0;
  for (int i = 0; i < o->threads; i++) {
    allocs += ws[i].allocs;
    frees += ws[i].frees;
    handoffs += ws[i].handoffs;
    records += ws[i].records;
    if (ws[i].steps_done < fewest) fewest = ws[i].steps_done;
    if (ws[i].steps_done > most) most = ws[i].steps_done;
  }
  double live = (double)st->live_bytes_peak / MIB;
  double reserved = (double)st->reserved_bytes_peak / MIB;
  uint64_t small = st->alloc_count - st->large_allocs;
  printf("\n");
  printf("%-28s %s\n", "backend", sa_backend_name(backend));
  printf("%-28s %d\n", "threads", o->threads);
  printf("%-28s %d\n", "streams", o->threads);
  if (fewest == o->steps)
    printf("%-28s %d per thread\n", "steps", o->steps);
  else
    printf("%-28s %d..%d of %d per thread (stopped: %s)\n", "steps completed", fewest, most,
           o->steps, first_failure[0] ? first_failure : "a thread failed");
  printf("%-28s %d (seq %d..%d)\n", "layers", o->layers, o->min_seq, o->max_seq);
  printf("%-28s %" PRIu64 "\n", "allocations", allocs);
  printf("%-28s %" PRIu64 "\n", "frees", frees);
  printf("%-28s %" PRIu64 " (%" PRIu64 " with record_stream)\n", "cross-thread handoffs",
         handoffs, records);
  printf("%-28s %.3f s\n", "time", seconds);
  printf("%-28s %.0f\n", "allocations/s", seconds > 0 ? (double)allocs / seconds : 0.0);
  printf("%-28s %.1f MiB\n", "peak live", live);
  printf("%-28s %.1f MiB\n", "peak reserved", reserved);
  printf("%-28s %.3f\n", "reserved/live (peak)", live > 0 ? reserved / live : 0.0);
  /* The fast path serves small blocks only: say how many were large. */
  printf("%-28s %" PRIu64 " (%.1f%%: spans, never the fast path)\n", "large allocations",
         st->large_allocs,
         st->alloc_count ? 100.0 * (double)st->large_allocs / (double)st->alloc_count : 0.0);
  printf("%-28s %.1f%% (from the thread cache)\n", "small allocations, fast",
         small ? 100.0 * (double)st->fast_allocs / (double)small : 0.0);
  printf("%-28s %.3f (allocations and frees)\n", "fast-path ratio", st->fast_path_ratio);
  printf("%-28s %" PRIu64 "\n", "out-of-memory events", st->oom_events);
  if (backend == SA_BACKEND_HOST) {
    printf("%-28s %" PRIu64 "\n", "canary mismatches", mismatches);
  }
}

int main(int argc, char **argv) {
  options o;
  int r = parse_options(argc, argv, &o);
  if (r > 0) {
    help();
    return 0;
  }
  if (r < 0) {
    usage(stderr);
    fprintf(stderr, "train_loop --help lists the options, their ranges and defaults\n");
    return 2;
  }
  /* Under `bazel run` the program starts in its runfiles folder: a relative
   * trace=PATH is taken from the folder the command was typed in, as
   * //bench:replay takes its paths, not written deep in bazel-bin. */
  const char *wd = getenv("BUILD_WORKING_DIRECTORY");
  if (wd != NULL && wd[0] != '\0' && chdir(wd) != 0) {
    fprintf(stderr, "train_loop: cannot enter %s (BUILD_WORKING_DIRECTORY): %s\n", wd,
            strerror(errno));
    return 2;
  }
  sa_config cfg;
  sa_config_init(&cfg);
  char err[256];
  if (sa_config_parse(&cfg, o.conf, err, sizeof err) != SA_OK) {
    fprintf(stderr, "train_loop: --conf: %s\n", err);
    return 2;
  }
  /* A rule broken by --conf, or STREAMARENA_BACKEND (the message names it). */
  if (sa_config_check(&cfg, err, sizeof err) == SA_ERR_BAD_CONFIG) {
    fprintf(stderr, "train_loop: %s%s\n", o.conf[0] != '\0' ? "--conf: " : "", err);
    return 2;
  }
  sa_arena *arena = NULL;
  if (!sa_check(sa_arena_create(&cfg, &arena), "sa_arena_create")) return 1;
  backend = sa_arena_backend(arena);
  /* First, before anything can fail on it: where this runs, and why. */
  printf("train_loop: backend %s (%s); %d threads, %d steps, %d layers\n",
         sa_backend_name(backend), sa_arena_backend_reason(arena), o.threads, o.steps, o.layers);
  fflush(stdout);
  if (backend == SA_BACKEND_CUDA && !cuda_load(cfg.device)) {
    sa_arena_destroy(arena);
    cuda_unload();
    return 1;
  }

  shared sh = {.opt = &o, .arena = arena};
  sh.boxes = calloc((size_t)o.threads, sizeof *sh.boxes);
  worker *ws = calloc((size_t)o.threads, sizeof *ws);
  pthread_t *tids = calloc((size_t)o.threads, sizeof *tids);
  bool ok = sh.boxes != NULL && ws != NULL && tids != NULL &&
            pthread_barrier_init(&sh.barrier, NULL, (unsigned)o.threads) == 0;
  if (!ok) {
    fprintf(stderr, "train_loop: out of host memory\n");
    free(sh.boxes);
    free(ws);
    free(tids);
    sa_arena_destroy(arena);
    cuda_unload();
    return 1;
  }
  for (int i = 0; i < o.threads; i++) pthread_mutex_init(&sh.boxes[i].lock, NULL);

  double t0 = now_seconds();
  int started = 0;
  for (int i = 0; i < o.threads; i++) {
    ws[i] = (worker){.sh = &sh, .id = i, .rng = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1)};
    if (pthread_create(&tids[i], NULL, worker_main, &ws[i]) != 0) break;
    started++;
  }
  if (started < o.threads) {
    /* The barrier counts every thread: without all of them nobody can go
     * on, so this is fatal. */
    fprintf(stderr, "train_loop: could not start %d threads\n", o.threads);
    return 1;
  }
  for (int i = 0; i < o.threads; i++) pthread_join(tids[i], NULL);
  double seconds = now_seconds() - t0;

  /* The figures after a failure too: they say how far it got. */
  sa_stats st;
  memset(&st, 0, sizeof st);
  ok = sa_check(sa_get_stats(arena, &st), "sa_get_stats") && !sh.failed;
  if (backend == SA_BACKEND_HOST) ok = sa_check(sa_host_drain_all(), "sa_host_drain_all") && ok;
  uint64_t mismatches = 0;
  for (int i = 0; i < o.threads; i++) mismatches += ws[i].mismatches;
  print_summary(&o, ws, seconds, &st, mismatches);
  if (mismatches != 0) {
    fprintf(stderr, "train_loop: %" PRIu64 " canary words were overwritten: memory was reused "
                    "before the work using it finished\n", mismatches);
    ok = false;
  }
  sa_status ds = sa_arena_destroy(arena);
  ok = sa_check(ds, "sa_arena_destroy") && ok;

  for (int i = 0; i < o.threads; i++) {
    pthread_mutex_destroy(&sh.boxes[i].lock);
    free(sh.boxes[i].items);
  }
  pthread_barrier_destroy(&sh.barrier);
  free(sh.boxes);
  free(ws);
  free(tids);
  cuda_unload();
  if (ok)
    printf("train_loop: ok\n");
  else
    printf("train_loop: FAILED%s%s\n", first_failure[0] ? ": " : "", first_failure);
  return ok ? 0 : 1;
}
