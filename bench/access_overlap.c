/* Whether a growth's access setting could leave the allocating thread.
 *
 * A large growth costs mostly its cuMemSetAccess, by the byte (3 GB: about
 * 260 us on the H200, docs/BENCHMARKS.md). Setting access on a thread of the
 * arena's own while the allocating thread returns pays only if (1) the
 * driver lets the allocating thread's next calls through meanwhile, and (2)
 * the work the user enqueues on the allocation's stream can be held back
 * until the access is set: a cuStreamWaitValue64 on a host counter ahead of
 * it, opened by that thread. This program measures both:
 *   overlap  cuMemSetAccess over freshly mapped chunks, timed alone and
 *            while a second thread calls cuEventRecord and
 *            cuStreamIsCapturing on a stream of its own without pause (the
 *            calls of a warm allocation and free); the second thread's
 *            calls during the setting against its calls with nothing else
 *            running (median and longest)
 *   gate     a stream waits on the counter; a memset of the range not yet
 *            accessible is enqueued behind the wait (its return code is
 *            what the driver says at enqueue), then access is set and the
 *            counter written; where the driver took the memset, it must
 *            have waited and its bytes must read back as written (exit 1
 *            otherwise)
 *
 *   access_overlap [--device N] [--gib N] [--rounds N]
 *
 * Needs a GPU; prints "skipped" and exits 0 without one.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/cuda_device.h"

#define CHUNK ((size_t)1 << 30)
#define MAX_SAMPLES (1u << 21)

static bench_cu cu;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#define CHECK(call) BENCH_CU_CHECK("access_overlap", call)

/* The range: n chunks of CHUNK bytes mapped back to back at va. */
typedef struct range_s {
  CUdeviceptr va;
  size_t n;
  CUmemGenericAllocationHandle h[64];
} range;

static CUmemAllocationProp chunk_prop(int device) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  return p;
}

static void range_map(range *r, int device) {
  CUmemAllocationProp p = chunk_prop(device);
  for (size_t i = 0; i < r->n; i++) {
    CHECK(sa_cu.MemCreate(&r->h[i], CHUNK, &p, 0));
    CHECK(sa_cu.MemMap(r->va + i * CHUNK, CHUNK, 0, r->h[i], 0));
  }
}

static double range_set_access(const range *r, int device) {
  CUmemAccessDesc d;
  memset(&d, 0, sizeof d);
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = device;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  uint64_t t0 = now_ns();
  CHECK(sa_cu.MemSetAccess(r->va, r->n * CHUNK, &d, 1));
  return (double)(now_ns() - t0) * 1e-3;
}

static void range_unmap(range *r) {
  CHECK(sa_cu.MemUnmap(r->va, r->n * CHUNK));
  for (size_t i = 0; i < r->n; i++) CHECK(sa_cu.MemRelease(r->h[i]));
}

/* The second thread: event record + capture query on its stream, each pair
 * timed, until told to stop. */
typedef struct caller_s {
  atomic_bool stop;
  uint64_t *start, *dur;
  size_t n;
} caller;

static void *call_loop(void *arg) {
  caller *c = arg;
  CHECK(sa_cu.CtxSetCurrent(cu.ctx));
  CUstream s;
  CUevent ev;
  CHECK(sa_cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(sa_cu.EventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  while (!atomic_load(&c->stop) && c->n < MAX_SAMPLES) {
    CUstreamCaptureStatus cs;
    uint64_t t0 = now_ns();
    CHECK(sa_cu.EventRecord(ev, s));
    CHECK(sa_cu.StreamIsCapturing(s, &cs));
    uint64_t t1 = now_ns();
    c->start[c->n] = t0;
    c->dur[c->n++] = t1 - t0;
  }
  CHECK(sa_cu.StreamSynchronize(s));
  CHECK(sa_cu.EventDestroy(ev));
  CHECK(sa_cu.StreamDestroy(s));
  return NULL;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Median and longest of the calls that started in [from, to) (inside) or
 * outside it. */
static void call_stats(const caller *c, uint64_t from, uint64_t to, int inside, double *median,
                       double *longest, size_t *count) {
  uint64_t *v = malloc(c->n * sizeof *v);
  size_t k = 0;
  if (v == NULL) exit(1);
  for (size_t i = 0; i < c->n; i++) {
    int in = c->start[i] + c->dur[i] > from && c->start[i] < to;
    if (in == inside) v[k++] = c->dur[i];
  }
  qsort(v, k, sizeof *v, cmp_u64);
  *count = k;
  *median = k ? (double)v[k / 2] * 1e-3 : 0;
  *longest = k ? (double)v[k - 1] * 1e-3 : 0;
  free(v);
}

static void spin_us(unsigned us) {
  uint64_t end = now_ns() + (uint64_t)us * 1000u;
  while (now_ns() < end) {
  }
}

/* The gate. Returns 0 when the driver refused the memset at enqueue (what
 * it does on the H200: then no gate can hold such work back, and the range
 * must be accessible before it is handed out) or when the gated memset
 * completed with its bytes; 1 when it was taken and went wrong. */
static int gate_check(range *r, int device) {
  CUstream s;
  CHECK(sa_cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING));
  void *host;
  CHECK(sa_cu.MemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  uint64_t *counter = host; /* the GPU reads it: written with atomic stores */
  __atomic_store_n(counter, 0, __ATOMIC_SEQ_CST);
  CUdeviceptr counter_dev;
  CHECK(sa_cu.MemHostGetDevicePointer(&counter_dev, host, 0));
  range_map(r, device);
  CHECK(sa_cu.StreamWaitValue64(s, counter_dev, 1, CU_STREAM_WAIT_VALUE_GEQ));
  CUresult enq = sa_cu.MemsetD8Async(r->va, 0x5a, 1 << 20, s);
  printf("gate: memset of the range before its access is set, enqueued behind the wait: %s\n",
         sa_cu_error_name(enq));
  spin_us(2000);
  CUresult q = sa_cu.StreamQuery(s);
  printf("gate: the stream 2 ms later, counter 0: %s\n", sa_cu_error_name(q));
  double us = range_set_access(r, device);
  __atomic_store_n(counter, 1, __ATOMIC_SEQ_CST);
  CHECK(sa_cu.StreamSynchronize(s));
  int bad = 0;
  if (enq == CUDA_SUCCESS) {
    unsigned char back[16] = {0};
    CHECK(sa_cu.MemcpyDtoH(back, r->va, sizeof back));
    for (size_t i = 0; i < sizeof back; i++) bad |= back[i] != 0x5a;
    bad |= q != CUDA_ERROR_NOT_READY;
    printf("gate: access set in %.1f us, counter written; the memset %s\n", us,
           bad ? "went WRONG (ran early or lost its bytes)" : "ran after it, bytes as written");
  } else {
    printf("gate: access set in %.1f us; the driver refused the work at enqueue, so a gate "
           "cannot hold it back\n", us);
  }
  range_unmap(r);
  CHECK(sa_cu.MemFreeHost(host));
  CHECK(sa_cu.StreamDestroy(s));
  return bad;
}

int main(int argc, char **argv) {
  int device = 0, rounds = 5;
  size_t gib = 3;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
      device = atoi(argv[++i]);
    else if (strcmp(argv[i], "--gib") == 0 && i + 1 < argc)
      gib = (size_t)atoi(argv[++i]);
    else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
      rounds = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: access_overlap [--device N] [--gib N] [--rounds N]\n");
      return 2;
    }
  }
  if (gib < 1 || gib > 64 || rounds < 1) {
    fprintf(stderr, "access_overlap: --gib takes 1 to 64, --rounds at least 1\n");
    return 2;
  }
  if (!bench_cu_open_or_skip(&cu, device, "access_overlap")) return 0;
  range r;
  memset(&r, 0, sizeof r);
  r.n = gib;
  CHECK(sa_cu.MemAddressReserve(&r.va, r.n * CHUNK, CHUNK, 0, 0));
  caller c;
  memset(&c, 0, sizeof c);
  c.start = malloc(MAX_SAMPLES * sizeof *c.start);
  c.dur = malloc(MAX_SAMPLES * sizeof *c.dur);
  if (c.start == NULL || c.dur == NULL) return 1;

  printf("device %d: %s, driver %d; %zu GiB in 1 GiB chunks, %d rounds\n\n", device, cu.name,
         cu.driver_version, gib, rounds);
  printf("| round | access alone, us | access with the caller, us | caller calls during it | "
         "their median, us | their longest, us | caller's median otherwise, us | longest "
         "otherwise, us |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (int k = 1; k <= rounds; k++) {
    range_map(&r, device);
    double alone = range_set_access(&r, device);
    range_unmap(&r);
    range_map(&r, device);
    atomic_store(&c.stop, false);
    c.n = 0;
    pthread_t t;
    if (pthread_create(&t, NULL, call_loop, &c) != 0) return 1;
    spin_us(3000);
    uint64_t from = now_ns();
    double with = range_set_access(&r, device);
    uint64_t to = now_ns();
    spin_us(3000);
    atomic_store(&c.stop, true);
    pthread_join(t, NULL);
    range_unmap(&r);
    double med_in, max_in, med_out, max_out;
    size_t n_in, n_out;
    call_stats(&c, from, to, 1, &med_in, &max_in, &n_in);
    call_stats(&c, from, to, 0, &med_out, &max_out, &n_out);
    printf("| %d | %.1f | %.1f | %zu | %.2f | %.1f | %.2f | %.1f |\n", k, alone, with, n_in,
           med_in, max_in, med_out, max_out);
  }
  printf("\n");
  int bad = gate_check(&r, device);
  CHECK(sa_cu.MemAddressFree(r.va, r.n * CHUNK));
  free(c.start);
  free(c.dur);
  bench_cu_close(&cu);
  return bad;
}
