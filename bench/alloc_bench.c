/* alloc_bench: the cost of an alloc+free pair, one thread and many.
 *
 * Backends:
 *   streamarena      the public API (sa_alloc/sa_free) on one arena; its
 *                    backend is auto (CUDA on a GPU, the host simulator
 *                    elsewhere) unless --sa-conf says otherwise
 *   cuMemAllocAsync  cuMemAllocAsync/cuMemFreeAsync on the device's default
 *                    pool, release threshold UINT64_MAX (it caches)
 *   cuMemAlloc       cuMemAlloc/cuMemFree
 * The two baselines need libcuda.so.1 and a device; without them only
 * streamarena runs.
 *
 * Workloads (a "pair" is one alloc and one free):
 *   256B 4KiB 64KiB 1MiB  one size, freed at once on the same stream
 *   mixed       sizes drawn log-uniformly from 256 B to 1 MiB, unaligned
 *   mixed-b16   the same sizes, 16 allocated, then the 16 freed (FIFO)
 *   cross       4 KiB allocated on the thread's stream, freed on a second one
 *   16MiB       16 MiB (a span; the size issue 30 compares with peers)
 *   large       64 MiB (a span of its own in streamarena)
 *   large-recorded  the same, recorded on a second stream before its free
 *               (sa_record_stream; streamarena only: the baselines have no
 *               such call)
 * Each runs on one thread; 4KiB and mixed also on T threads (--threads),
 * each thread on its own stream (CU_STREAM_NON_BLOCKING), all started
 * together.
 *
 * Method: per case, the pair count is calibrated so one repetition lasts
 * about --rep-ms; then --reps repetitions. ns/pair is the repetition's wall
 * time over the pairs one thread did (for T > 1: the time a thread spends
 * per pair while all run); Mpairs/s is all threads' pairs over the wall
 * time; both from the median repetition, with min and max of ns/pair.
 * Scaling is Mpairs/s at T threads over Mpairs/s at 1 thread. Threads are
 * not pinned. The last lines are a table of every case.
 *
 *   alloc_bench [--reps=7] [--rep-ms=100] [--threads=1,2,4,8,16]
 *               [--cases=256B,...] [--threaded=4KiB,mixed]
 *               [--backends=streamarena,cuMemAllocAsync,cuMemAlloc]
 *               [--sa-conf=SPEC] [--quick]
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "bench/cuda_device.h"
#include "test/util.h"

#define MAX_THREADS 64
#define MAX_BATCH 64
#define MIXED_N 1024 /* sizes in the mixed table; a power of two */
#define MAX_RESULTS 256

/* ------------------------------------------------------------------------
 * Backends, workloads, options
 * ---------------------------------------------------------------------- */
typedef enum backend_e { BK_SA = 0, BK_ASYNC, BK_MEMALLOC, BK_COUNT } backend;
static const char *const backend_names[BK_COUNT] = {"streamarena", "cuMemAllocAsync",
                                                    "cuMemAlloc"};

typedef struct workload_s {
  const char *name;
  size_t size;    /* one size, or 0: the mixed table */
  unsigned batch; /* blocks live at once */
  bool cross;     /* free on a second stream */
  bool record;    /* recorded on the second stream, freed on the first */
} workload;

static const workload workloads[] = {
    {"256B", 256, 1, false, false},        {"4KiB", 4 * KiB, 1, false, false},
    {"64KiB", 64 * KiB, 1, false, false},  {"1MiB", MiB, 1, false, false},
    {"mixed", 0, 1, false, false},         {"mixed-b16", 0, 16, false, false},
    {"cross", 4 * KiB, 1, true, false},    {"16MiB", 16 * MiB, 1, false, false},
    {"large", 64 * MiB, 1, false, false},  {"large-recorded", 64 * MiB, 1, false, true},
};
#define NWORKLOADS (sizeof workloads / sizeof workloads[0])

typedef struct options_s {
  unsigned reps;
  unsigned rep_ms;
  unsigned threads[16];
  unsigned nthreads;
  const char *cases;    /* comma list or NULL: all */
  const char *threaded; /* workloads also run on T threads */
  const char *backends; /* comma list or NULL: all available */
  const char *sa_conf;
} options;

typedef struct result_s {
  backend bk;
  const workload *w;
  unsigned threads;
  double ns_med, ns_min, ns_max; /* per pair, per thread */
  double mpairs;                 /* aggregate, median repetition */
  double fast_ratio;             /* streamarena only; < 0: not measured */
} result;

/* Everything a run shares. Streams: sa_streams for streamarena (CUstreams
 * on its CUDA backend, simulator streams on the host), cu_streams for the
 * baselines. Two per thread: the second is the "cross" free stream. */
typedef struct bench_s {
  options opt;
  bench_cu cu;
  bool have_cu;
  char cu_why[200];
  sa_arena *arena;
  sa_backend sa_backend;
  sa_stream sa_streams[2 * MAX_THREADS];
  CUstream cu_streams[2 * MAX_THREADS];
  size_t mixed[MIXED_N];
  result results[MAX_RESULTS];
  unsigned nresults;
} bench;

static bool in_list(const char *name, const char *list) {
  if (list == NULL) return true;
  size_t n = strlen(name);
  for (const char *p = list; *p != '\0';) {
    const char *end = strchr(p, ',');
    size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
    if (len == n && strncmp(p, name, n) == 0) return true;
    p += len + (end != NULL);
  }
  return false;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  /* Cannot fail for CLOCK_MONOTONIC with a valid pointer. */
  (void)clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Log-uniform sizes in [256 B, 1 MiB], not rounded: what a framework's
 * tensors look like. Fixed seed, so every backend sees the same sequence. */
static void make_mixed(size_t *sizes) {
  uint64_t x = 0x9E3779B97F4A7C15u;
  for (unsigned i = 0; i < MIXED_N; i++) {
    x = sa_xorshift64(x);
    sizes[i] = sa_log_uniform_size(x, 20); /* (2^b, 2^(b+1)], b from 8 to 19 */
  }
}

/* ------------------------------------------------------------------------
 * The pair loops, one per backend. Each returns 0 or -1 with w->err set.
 * ---------------------------------------------------------------------- */
typedef struct run_s run;

typedef struct worker_s {
  run *r;
  unsigned index;
  pthread_t tid;
  uint64_t t0, t1; /* this repetition, ns */
  int failed;
  char err[200];
} worker;

struct run_s {
  bench *b;
  backend bk;
  const workload *w;
  unsigned threads;
  uint64_t pairs; /* per thread, next repetition (written before the start barrier) */
  bool quit;
  pthread_barrier_t start, done;
  worker workers[MAX_THREADS];
};

typedef struct loop_args_s {
  const size_t *sizes;
  unsigned mask;  /* sizes index mask: 0 for one size */
  unsigned off;   /* where this thread starts in sizes */
  unsigned batch;
  uint64_t pairs; /* a multiple of batch */
} loop_args;

static int loop_fail(worker *wk, const char *what, const char *why) {
  snprintf(wk->err, sizeof wk->err, "thread %u: %s: %s", wk->index, what, why);
  return -1;
}

/* Pairs whose block is recorded on rs before its free on s. */
static int pairs_streamarena_recorded(worker *wk, const loop_args *la, sa_stream s,
                                      sa_stream rs) {
  sa_arena *a = wk->r->b->arena;
  for (uint64_t i = 0; i < la->pairs; i++) {
    void *p;
    sa_status st = sa_alloc(a, &p, la->sizes[0], s);
    if (st != SA_OK) return loop_fail(wk, "sa_alloc", sa_status_string(st));
    st = sa_record_stream(p, rs);
    if (st != SA_OK) return loop_fail(wk, "sa_record_stream", sa_status_string(st));
    st = sa_free(p, s);
    if (st != SA_OK) return loop_fail(wk, "sa_free", sa_status_string(st));
  }
  return 0;
}

static int pairs_streamarena(worker *wk, const loop_args *la, sa_stream s, sa_stream fs) {
  sa_arena *a = wk->r->b->arena;
  const size_t *sizes = la->sizes;
  unsigned k = la->off, mask = la->mask;
  if (la->batch == 1) { /* the headline loop: nothing in it but the pair */
    for (uint64_t i = 0; i < la->pairs; i++) {
      void *p;
      sa_status st = sa_alloc(a, &p, sizes[k++ & mask], s);
      if (st != SA_OK) return loop_fail(wk, "sa_alloc", sa_status_string(st));
      st = sa_free(p, fs);
      if (st != SA_OK) return loop_fail(wk, "sa_free", sa_status_string(st));
    }
    return 0;
  }
  void *p[MAX_BATCH];
  for (uint64_t i = 0; i < la->pairs; i += la->batch) {
    for (unsigned j = 0; j < la->batch; j++) {
      sa_status st = sa_alloc(a, &p[j], sizes[k++ & mask], s);
      if (st != SA_OK) return loop_fail(wk, "sa_alloc", sa_status_string(st));
    }
    for (unsigned j = 0; j < la->batch; j++) {
      sa_status st = sa_free(p[j], fs);
      if (st != SA_OK) return loop_fail(wk, "sa_free", sa_status_string(st));
    }
  }
  return 0;
}

static int pairs_async(worker *wk, const loop_args *la, CUstream s, CUstream fs) {
  const size_t *sizes = la->sizes;
  unsigned k = la->off, mask = la->mask;
  CUdeviceptr p[MAX_BATCH];
  for (uint64_t i = 0; i < la->pairs; i += la->batch) {
    for (unsigned j = 0; j < la->batch; j++) {
      CUresult r = sa_cu.MemAllocAsync(&p[j], sizes[k++ & mask], s);
      if (r != CUDA_SUCCESS) return loop_fail(wk, "cuMemAllocAsync", sa_cu_error_name(r));
    }
    for (unsigned j = 0; j < la->batch; j++) {
      CUresult r = sa_cu.MemFreeAsync(p[j], fs);
      if (r != CUDA_SUCCESS) return loop_fail(wk, "cuMemFreeAsync", sa_cu_error_name(r));
    }
  }
  return 0;
}

static int pairs_memalloc(worker *wk, const loop_args *la) {
  const size_t *sizes = la->sizes;
  unsigned k = la->off, mask = la->mask;
  CUdeviceptr p[MAX_BATCH];
  for (uint64_t i = 0; i < la->pairs; i += la->batch) {
    for (unsigned j = 0; j < la->batch; j++) {
      CUresult r = sa_cu.MemAlloc(&p[j], sizes[k++ & mask]);
      if (r != CUDA_SUCCESS) return loop_fail(wk, "cuMemAlloc", sa_cu_error_name(r));
    }
    for (unsigned j = 0; j < la->batch; j++) {
      CUresult r = sa_cu.MemFree(p[j]);
      if (r != CUDA_SUCCESS) return loop_fail(wk, "cuMemFree", sa_cu_error_name(r));
    }
  }
  return 0;
}

/* One repetition of one worker. */
static int worker_rep(worker *wk) {
  run *r = wk->r;
  bench *b = r->b;
  const workload *w = r->w;
  loop_args la = {
      .sizes = w->size != 0 ? &w->size : b->mixed,
      .mask = w->size != 0 ? 0 : MIXED_N - 1,
      .off = wk->index * 97u, /* threads do not walk the table in step */
      .batch = w->batch,
      .pairs = r->pairs,
  };
  unsigned si = 2 * wk->index, fi = w->cross ? si + 1 : si;
  switch (r->bk) {
    case BK_SA:
      if (w->record) return pairs_streamarena_recorded(wk, &la, b->sa_streams[si],
                                                       b->sa_streams[si + 1]);
      return pairs_streamarena(wk, &la, b->sa_streams[si], b->sa_streams[fi]);
    case BK_ASYNC: return pairs_async(wk, &la, b->cu_streams[si], b->cu_streams[fi]);
    case BK_MEMALLOC: return pairs_memalloc(wk, &la);
    default: return loop_fail(wk, "backend", "unknown");
  }
}

static int barrier_wait(pthread_barrier_t *bar) {
  int rc = pthread_barrier_wait(bar);
  return rc == 0 || rc == PTHREAD_BARRIER_SERIAL_THREAD ? 0 : -1;
}

static void *worker_main(void *arg) {
  worker *wk = arg;
  run *r = wk->r;
  if (r->bk != BK_SA) { /* the driver API acts on the current context */
    CUresult cr = sa_cu.CtxSetCurrent(r->b->cu.ctx);
    if (cr != CUDA_SUCCESS) {
      loop_fail(wk, "cuCtxSetCurrent", sa_cu_error_name(cr));
      wk->failed = 1;
    }
  }
  for (;;) {
    if (barrier_wait(&r->start) != 0) {
      wk->failed = 1; /* a broken barrier cannot be recovered: stop the program */
      fprintf(stderr, "alloc_bench: pthread_barrier_wait failed\n");
      exit(2);
    }
    if (r->quit) break;
    wk->t0 = now_ns();
    if (!wk->failed && worker_rep(wk) != 0) wk->failed = 1;
    wk->t1 = now_ns();
    if (barrier_wait(&r->done) != 0) {
      fprintf(stderr, "alloc_bench: pthread_barrier_wait failed\n");
      exit(2);
    }
  }
  return NULL;
}

/* ------------------------------------------------------------------------
 * One case: threads started once, calibrated, repeated.
 * ---------------------------------------------------------------------- */

/* One repetition with every worker; the wall time in ns, or 0 on failure. */
static uint64_t run_rep(run *r, uint64_t pairs) {
  r->pairs = pairs;
  if (barrier_wait(&r->start) != 0 || barrier_wait(&r->done) != 0) return 0;
  uint64_t t0 = UINT64_MAX, t1 = 0;
  for (unsigned i = 0; i < r->threads; i++) {
    worker *wk = &r->workers[i];
    if (wk->failed) {
      fprintf(stderr, "alloc_bench: %s %s: %s\n", backend_names[r->bk], r->w->name, wk->err);
      return 0;
    }
    if (wk->t0 < t0) t0 = wk->t0;
    if (wk->t1 > t1) t1 = wk->t1;
  }
  return t1 > t0 ? t1 - t0 : 1;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

/* Streams of the baselines: let queued work finish between cases. */
static int sync_streams(bench *b, unsigned threads) {
  for (unsigned i = 0; i < 2 * threads; i++) {
    CUresult r = sa_cu.StreamSynchronize(b->cu_streams[i]);
    if (r != CUDA_SUCCESS) {
      fprintf(stderr, "alloc_bench: cuStreamSynchronize: %s\n", sa_cu_error_name(r));
      return -1;
    }
  }
  return 0;
}

static int sa_fast_counts(sa_arena *a, uint64_t *fast, uint64_t *all) {
  sa_stats s;
  sa_status st = sa_get_stats(a, &s);
  if (st != SA_OK) {
    fprintf(stderr, "alloc_bench: sa_get_stats: %s\n", sa_status_string(st));
    return -1;
  }
  *fast = s.fast_allocs + s.fast_frees;
  *all = s.alloc_count + s.free_count;
  return 0;
}

static int run_case(bench *b, backend bk, const workload *w, unsigned threads) {
  if (b->nresults == MAX_RESULTS) return -1;
  run *r = calloc(1, sizeof *r);
  if (r == NULL) return -1;
  r->b = b, r->bk = bk, r->w = w, r->threads = threads;
  if (pthread_barrier_init(&r->start, NULL, threads + 1) != 0) {
    free(r);
    return -1;
  }
  if (pthread_barrier_init(&r->done, NULL, threads + 1) != 0) {
    (void)pthread_barrier_destroy(&r->start);
    free(r);
    return -1;
  }
  unsigned started = 0;
  int rc = 0;
  for (; started < threads; started++) {
    worker *wk = &r->workers[started];
    wk->r = r, wk->index = started;
    int e = pthread_create(&wk->tid, NULL, worker_main, wk);
    if (e != 0) {
      fprintf(stderr, "alloc_bench: pthread_create: %s\n", strerror(e));
      rc = -1;
      break;
    }
  }
  if (rc != 0) { /* cannot run with fewer threads than parties: stop */
    exit(2);
  }

  uint64_t fast0 = 0, all0 = 0, fast1 = 0, all1 = 0;
  if (bk == BK_SA && sa_fast_counts(b->arena, &fast0, &all0) != 0) rc = -1;

  /* Warm up (thread caches, pools, superblocks for every size of the
   * table), then calibrate on warm runs: grow the count, at most 16x a
   * step, until a repetition takes half the target; then scale to it. */
  const uint64_t target = (uint64_t)b->opt.rep_ms * 1000000u;
  uint64_t pairs = (uint64_t)w->batch * (w->size != 0 ? 4u : MIXED_N), wall = 0;
  if (rc == 0 && run_rep(r, pairs) == 0) rc = -1;
  pairs = w->batch;
  while (rc == 0) {
    wall = run_rep(r, pairs);
    if (wall == 0) rc = -1;
    else if (wall >= target / 2 || pairs >= ((uint64_t)1 << 36)) break;
    else {
      double grow = 1.2 * (double)target / (double)wall;
      pairs = (uint64_t)((double)pairs * (grow < 2 ? 2 : grow > 16 ? 16 : grow));
    }
  }
  if (rc == 0) {
    pairs = (uint64_t)((double)pairs * (double)target / (double)wall);
    pairs = (pairs + w->batch - 1) / w->batch * w->batch;
    if (pairs < w->batch) pairs = w->batch;
  }

  double ns[64], walls[64];
  unsigned reps = b->opt.reps;
  for (unsigned i = 0; rc == 0 && i < reps; i++) {
    wall = run_rep(r, pairs);
    if (wall == 0) rc = -1;
    ns[i] = (double)wall / (double)pairs;
    walls[i] = (double)wall;
  }

  r->quit = true;
  if (barrier_wait(&r->start) != 0) exit(2);
  for (unsigned i = 0; i < started; i++) {
    int e = pthread_join(r->workers[i].tid, NULL);
    if (e != 0) {
      fprintf(stderr, "alloc_bench: pthread_join: %s\n", strerror(e));
      rc = -1;
    }
  }
  (void)pthread_barrier_destroy(&r->start);
  (void)pthread_barrier_destroy(&r->done);
  free(r);
  if (rc == 0 && bk != BK_SA && sync_streams(b, threads) != 0) rc = -1;
  /* After the join: exited threads have handed their counts back. */
  if (rc == 0 && bk == BK_SA && sa_fast_counts(b->arena, &fast1, &all1) != 0) rc = -1;
  if (rc != 0) return -1;

  qsort(ns, reps, sizeof ns[0], cmp_double);
  qsort(walls, reps, sizeof walls[0], cmp_double);
  result *res = &b->results[b->nresults++];
  res->bk = bk, res->w = w, res->threads = threads;
  res->ns_med = ns[reps / 2], res->ns_min = ns[0], res->ns_max = ns[reps - 1];
  res->mpairs = (double)threads * (double)pairs / walls[reps / 2] * 1e3;
  res->fast_ratio = bk == BK_SA && all1 > all0 ? (double)(fast1 - fast0) / (double)(all1 - all0)
                                               : -1.0;
  printf("%-16s %-10s T=%-3u %10.1f ns/pair (min %.1f, max %.1f)  %9.3f Mpairs/s", 
         backend_names[bk], w->name, threads, res->ns_med, res->ns_min, res->ns_max,
         res->mpairs);
  if (res->fast_ratio >= 0) printf("  fast path %.1f%%", 100.0 * res->fast_ratio);
  printf("  [%llu pairs/thread x %u reps]\n", (unsigned long long)pairs, reps);
  fflush(stdout);
  return 0;
}

/* ------------------------------------------------------------------------
 * Setup: options, device, arena, streams
 * ---------------------------------------------------------------------- */
static void usage(FILE *f) {
  fputs("usage: alloc_bench [--reps=N] [--rep-ms=MS] [--threads=1,2,4,8,16]\n"
        "                   [--cases=256B,4KiB,64KiB,1MiB,mixed,mixed-b16,cross,16MiB,\n"
        "                          large,large-recorded]\n"
        "                   [--threaded=4KiB,mixed] [--backends=streamarena,cuMemAllocAsync,"
        "cuMemAlloc]\n"
        "                   [--sa-conf=SPEC] [--quick]\n",
        f);
}

static int parse_uint(const char *s, unsigned lo, unsigned hi, unsigned *out) {
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return -1;
  *out = (unsigned)v;
  return 0;
}

static int parse_options(int argc, char **argv, options *o) {
  *o = (options){.reps = 7, .rep_ms = 100, .threads = {1, 2, 4, 8, 16}, .nthreads = 5,
                 .threaded = "4KiB,mixed"};
  int bad_i = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bad_i = i;
    const char *v = strchr(a, '=');
    v = v != NULL ? v + 1 : "";
    if (strncmp(a, "--reps=", 7) == 0) {
      if (parse_uint(v, 1, 63, &o->reps) != 0) goto bad;
    } else if (strncmp(a, "--rep-ms=", 9) == 0) {
      if (parse_uint(v, 1, 60000, &o->rep_ms) != 0) goto bad;
    } else if (strncmp(a, "--threads=", 10) == 0) {
      o->nthreads = 0;
      char buf[128];
      snprintf(buf, sizeof buf, "%s", v);
      for (char *save, *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        if (o->nthreads == 16 || parse_uint(t, 1, MAX_THREADS, &o->threads[o->nthreads]) != 0)
          goto bad;
        o->nthreads++;
      }
      if (o->nthreads == 0) goto bad;
    } else if (strncmp(a, "--cases=", 8) == 0) {
      o->cases = v;
    } else if (strncmp(a, "--threaded=", 11) == 0) {
      o->threaded = v;
    } else if (strncmp(a, "--backends=", 11) == 0) {
      o->backends = v;
    } else if (strncmp(a, "--sa-conf=", 10) == 0) {
      o->sa_conf = v;
    } else if (strcmp(a, "--quick") == 0) {
      o->reps = 3, o->rep_ms = 20;
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      exit(0);
    } else {
      goto bad;
    }
  }
  return 0;
bad:
  fprintf(stderr, "alloc_bench: bad argument: %s\n", argv[bad_i]);
  return -1;
}

static unsigned max_threads(const options *o) {
  unsigned m = 1;
  for (unsigned i = 0; i < o->nthreads; i++)
    if (o->threads[i] > m) m = o->threads[i];
  return m;
}

static int streams_create(bench *b, unsigned n) {
  for (unsigned i = 0; i < n; i++) {
    if (b->have_cu) {
      CUresult r = sa_cu.StreamCreate(&b->cu_streams[i], CU_STREAM_NON_BLOCKING);
      if (r != CUDA_SUCCESS) {
        fprintf(stderr, "alloc_bench: cuStreamCreate: %s\n", sa_cu_error_name(r));
        return -1;
      }
    }
    if (b->arena == NULL) continue;
    if (b->sa_backend == SA_BACKEND_CUDA) {
      b->sa_streams[i] = (sa_stream)b->cu_streams[i];
    } else {
      sa_status st = sa_host_stream_create(SA_HOST_AUTO, &b->sa_streams[i]);
      if (st != SA_OK) {
        fprintf(stderr, "alloc_bench: sa_host_stream_create: %s\n", sa_status_string(st));
        return -1;
      }
    }
  }
  return 0;
}

/* Give every stream back: to the arena first (its holdings), then destroy. */
static int streams_destroy(bench *b, unsigned n) {
  int rc = 0;
  for (unsigned i = 0; i < n; i++) {
    if (b->arena != NULL) {
      sa_status st = sa_stream_release(b->arena, b->sa_streams[i]);
      if (st != SA_OK) {
        fprintf(stderr, "alloc_bench: sa_stream_release: %s\n", sa_status_string(st));
        rc = -1;
      }
      if (b->sa_backend == SA_BACKEND_HOST && b->sa_streams[i] != NULL) {
        st = sa_host_stream_destroy(b->sa_streams[i]);
        if (st != SA_OK) {
          fprintf(stderr, "alloc_bench: sa_host_stream_destroy: %s\n", sa_status_string(st));
          rc = -1;
        }
      }
    }
    if (b->have_cu && b->cu_streams[i] != NULL) {
      CUresult r = sa_cu.StreamDestroy(b->cu_streams[i]);
      if (r != CUDA_SUCCESS) {
        fprintf(stderr, "alloc_bench: cuStreamDestroy: %s\n", sa_cu_error_name(r));
        rc = -1;
      }
    }
  }
  return rc;
}

static void print_header(bench *b, int argc, char **argv) {
  char host[256] = "?", cpu[256] = "?", date[64] = "?";
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
  host[sizeof host - 1] = '\0';
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f != NULL) {
    char line[512];
    while (fgets(line, sizeof line, f) != NULL) {
      if (strncmp(line, "model name", 10) != 0) continue;
      const char *c = strchr(line, ':');
      if (c != NULL) snprintf(cpu, sizeof cpu, "%s", c + 2);
      cpu[strcspn(cpu, "\n")] = '\0';
      break;
    }
    fclose(f);
  }
  time_t t = time(NULL);
  struct tm tm;
  if (gmtime_r(&t, &tm) != NULL) strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
  printf("# alloc_bench, streamarena %d.%d.%d\n", SA_VERSION_MAJOR, SA_VERSION_MINOR,
         SA_VERSION_PATCH);
  printf("# date:    %s\n# command:", date);
  for (int i = 0; i < argc; i++) printf(" %s", argv[i]);
  printf("\n# machine: %s, %s, %ld CPUs online\n", host, cpu, sysconf(_SC_NPROCESSORS_ONLN));
  if (b->have_cu)
    printf("# gpu:     %s, driver API %d.%d\n", b->cu.name, b->cu.driver_version / 1000,
           b->cu.driver_version % 1000 / 10);
  else
    printf("# gpu:     none (%s): CUDA baselines skipped\n", b->cu_why);
  if (b->arena != NULL)
    printf("# streamarena backend: %s%s%s\n", sa_backend_name(b->sa_backend),
           b->opt.sa_conf != NULL ? ", conf " : "", b->opt.sa_conf != NULL ? b->opt.sa_conf : "");
  printf("# method: median of %u repetitions of ~%u ms each, after calibration\n",
         b->opt.reps, b->opt.rep_ms);
  fflush(stdout);
}

static void print_table(const bench *b) {
  printf("\n%-16s %-10s %7s %12s %21s %10s %8s\n", "backend", "case", "threads",
         "ns/pair(med)", "ns/pair [min, max]", "Mpairs/s", "scaling");
  for (unsigned i = 0; i < b->nresults; i++) {
    const result *r = &b->results[i];
    double base = 0;
    for (unsigned j = 0; j < b->nresults; j++) {
      const result *q = &b->results[j];
      if (q->bk == r->bk && q->w == r->w && q->threads == 1) base = q->mpairs;
    }
    char range[48], scaling[16];
    snprintf(range, sizeof range, "[%.1f, %.1f]", r->ns_min, r->ns_max);
    if (base > 0) snprintf(scaling, sizeof scaling, "%.2fx", r->mpairs / base);
    else snprintf(scaling, sizeof scaling, "-");
    printf("%-16s %-10s %7u %12.1f %21s %10.3f %8s\n", backend_names[r->bk], r->w->name,
           r->threads, r->ns_med, range, r->mpairs, scaling);
  }
}

int main(int argc, char **argv) {
  static bench b; /* large: stream and result arrays */
  if (parse_options(argc, argv, &b.opt) != 0) {
    usage(stderr);
    return 2;
  }
  make_mixed(b.mixed);

  bool want[BK_COUNT];
  for (unsigned k = 0; k < BK_COUNT; k++) want[k] = in_list(backend_names[k], b.opt.backends);
  if (want[BK_ASYNC] || want[BK_MEMALLOC] || want[BK_SA]) {
    /* Streams are CUstreams whenever a device exists. */
    b.have_cu = bench_cu_open(&b.cu, 0, b.cu_why, sizeof b.cu_why) == 0;
  }
  if (want[BK_SA]) {
    sa_config cfg;
    sa_config_init(&cfg);
    char err[200];
    sa_status st = sa_config_parse(&cfg, b.opt.sa_conf, err, sizeof err);
    if (st == SA_OK) {
      st = sa_arena_create(&cfg, &b.arena);
      if (st == SA_ERR_BAD_CONFIG) (void)sa_config_check(&cfg, err, sizeof err); /* why */
    }
    if (st != SA_OK) {
      fprintf(stderr, "alloc_bench: arena: %s%s%s\n", sa_status_string(st),
              st == SA_ERR_BAD_CONFIG ? ": " : "", st == SA_ERR_BAD_CONFIG ? err : "");
      return 1;
    }
    b.sa_backend = sa_arena_backend(b.arena);
    if (b.sa_backend == SA_BACKEND_CUDA && !b.have_cu) {
      fprintf(stderr, "alloc_bench: arena on CUDA but the benchmark cannot load it: %s\n",
              b.cu_why);
      return 1;
    }
  }
  print_header(&b, argc, argv);

  unsigned nstreams = 2 * max_threads(&b.opt);
  int rc = streams_create(&b, nstreams) == 0 ? 0 : 1;
  for (unsigned k = 0; rc == 0 && k < BK_COUNT; k++) {
    if (!want[k] || (k == BK_SA && b.arena == NULL) || (k != BK_SA && !b.have_cu)) continue;
    for (unsigned i = 0; rc == 0 && i < NWORKLOADS; i++) {
      const workload *w = &workloads[i];
      if (!in_list(w->name, b.opt.cases)) continue;
      if (k == BK_MEMALLOC && w->cross) continue; /* synchronous: no stream to cross */
      if (k != BK_SA && w->record) continue;      /* no sa_record_stream to call */
      if (run_case(&b, (backend)k, w, 1) != 0) rc = 1;
      if (!in_list(w->name, b.opt.threaded)) continue;
      for (unsigned t = 0; rc == 0 && t < b.opt.nthreads; t++)
        if (b.opt.threads[t] > 1 && run_case(&b, (backend)k, w, b.opt.threads[t]) != 0) rc = 1;
    }
  }
  if (streams_destroy(&b, nstreams) != 0) rc = 1;
  if (b.arena != NULL) {
    sa_status st = sa_arena_destroy(b.arena);
    if (st != SA_OK) {
      fprintf(stderr, "alloc_bench: sa_arena_destroy: %s\n", sa_status_string(st));
      rc = 1;
    }
  }
  if (b.have_cu) bench_cu_close(&b.cu);
  if (rc != 0) {
    fprintf(stderr, "alloc_bench: FAILED\n");
    return rc;
  }
  print_table(&b);
  return 0;
}
