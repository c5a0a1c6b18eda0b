/* What marking a stream's progress costs the host, per call, on this GPU.
 *
 * A span's free records an event on its stream so that another stream, or
 * an unmap, can tell when the span's work is done (docs/DEFRAG.md, "Where a
 * warm span operation's time goes"): on the H200 that record is about half
 * of a warm span alloc+free pair. This program times the candidates for
 * that mark, each call on its own, on an idle stream and on one with
 * milliseconds of work queued:
 *   record        cuEventRecord (an event without timing, as the library's)
 *   query done    cuEventQuery of a completed event (how the library polls)
 *   query busy    cuEventQuery of an event behind queued work
 *   wait event    cuStreamWaitEvent of a completed event on another stream
 *   write value   cuStreamWriteValue64 of a counter into pinned host memory:
 *                 a mark whose completion the host reads with a plain load
 *   wait value    cuStreamWaitValue64 (>=) on that counter, another stream
 *   stream query  cuStreamQuery
 * and checks that the counter reached its last value (the writes landed).
 *
 *   mark_costs [--device N] [--calls N]
 *
 * Needs a GPU; prints "skipped" and exits 0 without one.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/cuda_device.h"
#include "test/util.h"

#define REPS 7
#define EVENTS 64

static bench_cu cu;

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

#define CHECK(call)                                                                    \
  do {                                                                                 \
    CUresult r_ = (call);                                                              \
    if (r_ != CUDA_SUCCESS && r_ != CUDA_ERROR_NOT_READY) {                            \
      fprintf(stderr, "mark_costs: %s: %s (line %d)\n", #call, sa_cu_error_name(r_),   \
              __LINE__);                                                               \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

enum { M_RECORD, M_QUERY_DONE, M_QUERY_BUSY, M_WAIT_EVENT, M_WRITE, M_WAIT_VALUE, M_SQUERY, NM };
static const char *const mark_name[NM] = {"record",      "query done", "query busy",
                                          "wait event",  "write value", "wait value",
                                          "stream query"};

typedef struct {
  CUstream s, other;
  CUevent ev[EVENTS];
  CUevent done; /* recorded on an idle stream and completed */
  CUdeviceptr counter_dev;
  volatile uint64_t *counter;
  uint64_t next; /* the counter's next value */
  CUdeviceptr busy_buf;
  size_t busy_bytes;
} rig;

/* Milliseconds of work on r->s, so that what follows queues behind it. */
static void make_busy(rig *r) {
  for (int i = 0; i < 8; i++)
    CHECK(sa_cu.MemsetD8Async(r->busy_buf, (unsigned char)i, r->busy_bytes, r->s));
}

/* ns per call of mark m, n calls. */
static double time_mark(rig *r, int m, int n) {
  double t0 = now_ns();
  for (int i = 0; i < n; i++) {
    switch (m) {
      case M_RECORD: CHECK(sa_cu.EventRecord(r->ev[i % EVENTS], r->s)); break;
      case M_QUERY_DONE: CHECK(sa_cu.EventQuery(r->done)); break;
      case M_QUERY_BUSY: CHECK(sa_cu.EventQuery(r->ev[0])); break;
      case M_WAIT_EVENT: CHECK(sa_cu.StreamWaitEvent(r->other, r->done, 0)); break;
      case M_WRITE: CHECK(sa_cu.StreamWriteValue64(r->s, r->counter_dev, ++r->next, 0)); break;
      case M_WAIT_VALUE:
        CHECK(sa_cu.StreamWaitValue64(r->other, r->counter_dev, r->next, CU_STREAM_WAIT_VALUE_GEQ));
        break;
      case M_SQUERY: CHECK(sa_cu.StreamQuery(r->s)); break;
      default: break;
    }
  }
  return (now_ns() - t0) / n;
}

static double median_of(rig *r, int m, int n, int busy) {
  double t[REPS];
  for (int k = 0; k < REPS; k++) {
    CHECK(sa_cu.StreamSynchronize(r->s));
    CHECK(sa_cu.StreamSynchronize(r->other));
    if (busy) make_busy(r);
    if (m == M_QUERY_BUSY) CHECK(sa_cu.EventRecord(r->ev[0], r->s)); /* behind the work */
    t[k] = time_mark(r, m, n);
  }
  return sa_median(t, REPS);
}

int main(int argc, char **argv) {
  int device = 0, calls = 2000;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
      device = atoi(argv[++i]);
    else if (strcmp(argv[i], "--calls") == 0 && i + 1 < argc)
      calls = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: mark_costs [--device N] [--calls N]\n");
      return 2;
    }
  }
  if (calls < 1) calls = 1;
  if (!bench_cu_open_or_skip(&cu, device, "mark_costs")) return 0;
  rig r;
  memset(&r, 0, sizeof r);
  CHECK(sa_cu.StreamCreate(&r.s, CU_STREAM_NON_BLOCKING));
  CHECK(sa_cu.StreamCreate(&r.other, CU_STREAM_NON_BLOCKING));
  for (int i = 0; i < EVENTS; i++) CHECK(sa_cu.EventCreate(&r.ev[i], CU_EVENT_DISABLE_TIMING));
  CHECK(sa_cu.EventCreate(&r.done, CU_EVENT_DISABLE_TIMING));
  CHECK(sa_cu.EventRecord(r.done, r.other));
  void *host;
  CHECK(sa_cu.MemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  r.counter = host;
  *r.counter = 0;
  CHECK(sa_cu.MemHostGetDevicePointer(&r.counter_dev, host, 0));
  r.busy_bytes = (size_t)1 << 30;
  CHECK(sa_cu.MemAlloc(&r.busy_buf, r.busy_bytes));

  double t[NM][2];
  for (int m = 0; m < NM; m++)
    for (int busy = 0; busy < 2; busy++)
      t[m][busy] = m == M_QUERY_BUSY && !busy ? 0 : median_of(&r, m, calls, busy);
  CHECK(sa_cu.StreamSynchronize(r.s));
  CHECK(sa_cu.StreamSynchronize(r.other));
  int landed = *r.counter == r.next;

  printf("device %d: %s, driver %d; %d calls a repetition, median of %d\n\n", device, cu.name,
         cu.driver_version, calls, REPS);
  printf("| mark | ns per call, idle stream | ns per call, work queued |\n| --- | ---: | ---: |\n");
  for (int m = 0; m < NM; m++) {
    if (m == M_QUERY_BUSY)
      printf("| %s | - | %.0f |\n", mark_name[m], t[m][1]);
    else
      printf("| %s | %.0f | %.0f |\n", mark_name[m], t[m][0], t[m][1]);
  }
  printf("\ncounter %s its last value (%llu of %llu)\n", landed ? "reached" : "DID NOT REACH",
         (unsigned long long)*r.counter, (unsigned long long)r.next);

  CHECK(sa_cu.MemFree(r.busy_buf));
  CHECK(sa_cu.MemFreeHost(host));
  for (int i = 0; i < EVENTS; i++) CHECK(sa_cu.EventDestroy(r.ev[i]));
  CHECK(sa_cu.EventDestroy(r.done));
  CHECK(sa_cu.StreamDestroy(r.s));
  CHECK(sa_cu.StreamDestroy(r.other));
  bench_cu_close(&cu);
  return landed ? 0 : 1;
}
