/* //bench:after_work: RMM's random allocations up to 4 GiB on an arena
 * that served other work first, against a fresh one, on the host
 * simulator: the driver calls each allocation makes, and their modelled
 * H200 time (driver_model.h).
 *
 *   after_work [--check-ratio=R] [--check-vmm=N] [--slowest=N] [--conf=SPEC] TRACE.csv...
 *
 * The "after" arena first replays the traces given, then the peer
 * benchmark's pairs (each size from 256 B to 16 MiB and two mixed tables,
 * a stream each) and threads (1, 4 and 16 threads on streams of their
 * own, one after another), in that order; then both arenas run RMM's random loop twice
 * (N=1000, sizes 1 B to 4 GiB, live capped at 16000 MiB, 73% allocations;
 * the sizes and frees that bench/peers/random.cc draws on the GPU). Prints, per arena and run, per allocation:
 * chunks created and released, maps, unmaps (chunks covered), set_access (chunks
 * covered), device and stream syncs, events recorded and queried, and the
 * model's us; and the arena's peak reserved bytes so far.
 *   --check-ratio=R  exit 1 if the after arena's first run models more
 *                  than R times the fresh arena's first run's driver time
 *                  per allocation
 *   --check-vmm=N  exit 1 if a run of the after arena makes more than N
 *                  virtual-memory driver calls per allocation
 *   --slowest=N    after the table, each run's N allocations (0 to 16)
 *                  with the most modelled driver time, and their calls
 *   --conf=SPEC    both arenas' configuration (sa_config_parse syntax)
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "driver_model.h"
#include "test/util.h"
#include "trace_read.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)
#define RANDOM_N 1000
#define RANDOM_MAX (4 * GIB)
#define LIVE_CAP (16000 * MIB)
#define ALLOC_PERCENT 73
#define PAIRS_PER_SIZE 2000
#define THREAD_PAIRS 5000

static int check(const char *what, sa_status st) {
  if (st != SA_OK) fprintf(stderr, "after_work: %s: %s\n", what, sa_status_string(st));
  return st != SA_OK;
}

/* std::mt19937_64 and libstdc++'s uniform_int_distribution over it (a
 * 128-bit multiply, redrawn below the threshold): the random loop of
 * bench/peers/random.cc draws the same sizes and frees here as on the GPU. */
typedef struct mt64_s {
  uint64_t x[312];
  unsigned i;
} mt64;

static void mt64_seed(mt64 *m, uint64_t seed) {
  m->x[0] = seed;
  for (unsigned k = 1; k < 312; k++)
    m->x[k] = 6364136223846793005ull * (m->x[k - 1] ^ (m->x[k - 1] >> 62)) + k;
  m->i = 312;
}

static uint64_t mt64_next(mt64 *m) {
  if (m->i == 312) {
    for (unsigned k = 0; k < 312; k++) {
      uint64_t y = (m->x[k] & 0xffffffff80000000ull) | (m->x[(k + 1) % 312] & 0x7fffffffull);
      m->x[k] = m->x[(k + 156) % 312] ^ (y >> 1) ^ ((y & 1) ? 0xb5026f5aa96619e9ull : 0);
    }
    m->i = 0;
  }
  uint64_t z = m->x[m->i++];
  z ^= (z >> 29) & 0x5555555555555555ull;
  z ^= (z << 17) & 0x71d67fffeda60000ull;
  z ^= (z << 37) & 0xfff7eee000000000ull;
  return z ^ (z >> 43);
}

/* A value drawn uniformly from [lo, hi]. */
static uint64_t mt64_uniform(mt64 *m, uint64_t lo, uint64_t hi) {
  uint64_t range = hi - lo + 1;
  unsigned __int128 product = (unsigned __int128)mt64_next(m) * range;
  if ((uint64_t)product < range) {
    uint64_t threshold = -range % range;
    while ((uint64_t)product < threshold) product = (unsigned __int128)mt64_next(m) * range;
  }
  return lo + (uint64_t)(product >> 64);
}

/* One replay of t on a, its streams made and released here. */
static int replay(sa_arena *a, const trace *t) {
  sa_stream *streams = calloc(t->nstreams, sizeof *streams);
  void **ptrs = calloc(t->nslots, sizeof *ptrs);
  int bad = streams == NULL || ptrs == NULL;
  for (size_t i = 0; !bad && i < t->nstreams; i++)
    bad = check("sa_host_stream_create", sa_host_stream_create(SA_HOST_AUTO, &streams[i]));
  for (size_t i = 0; !bad && i < t->nops; i++) {
    const trace_op *op = &t->ops[i];
    if (op->is_free) {
      if (ptrs[op->slot] != NULL) bad = check("sa_free", sa_free(ptrs[op->slot], streams[op->stream]));
      ptrs[op->slot] = NULL;
    } else {
      sa_status st = sa_alloc(a, &ptrs[op->slot], op->size, streams[op->stream]);
      if (st != SA_ERR_OUT_OF_MEMORY) bad = check("sa_alloc", st);
    }
  }
  for (size_t i = 0; ptrs != NULL && i < t->nslots; i++)
    if (ptrs[i] != NULL) bad |= check("sa_free", sa_free(ptrs[i], NULL));
  for (size_t i = 0; streams != NULL && i < t->nstreams; i++) {
    if (streams[i] == NULL) continue;
    bad |= check("sa_stream_release", sa_stream_release(a, streams[i]));
    bad |= check("sa_host_stream_destroy", sa_host_stream_destroy(streams[i]));
  }
  free(ptrs);
  free(streams);
  return bad;
}

/* n alloc+free pairs on a new stream, released and destroyed after:
 * size, or log-uniform sizes up to 2^mixed_bits (mixed_bits != 0) drawn
 * from seed. */
static int pair_loop(sa_arena *a, size_t size, unsigned mixed_bits, uint64_t seed, int n) {
  sa_stream s;
  int bad = check("sa_host_stream_create", sa_host_stream_create(SA_HOST_AUTO, &s));
  uint64_t x = seed | 1;
  for (int i = 0; !bad && i < n; i++) {
    void *p;
    size_t bytes = size;
    if (mixed_bits != 0) {
      x = sa_xorshift64(x);
      bytes = sa_log_uniform_size(x, mixed_bits);
    }
    bad = check("sa_alloc", sa_alloc(a, &p, bytes, s)) || check("sa_free", sa_free(p, s));
  }
  if (!bad) bad = check("sa_stream_release", sa_stream_release(a, s));
  if (!bad) bad = check("sa_host_stream_destroy", sa_host_stream_destroy(s));
  return bad;
}

/* The peer benchmark's pairs: each size from 256 B to 16 MiB, then two
 * mixed tables (up to 1 MiB, up to 16 MiB), each case on a stream of its
 * own. */
static int pairs(sa_arena *a) {
  int bad = 0;
  for (size_t size = 256; !bad && size <= 16 * MIB; size *= 4)
    bad = pair_loop(a, size, 0, 0, PAIRS_PER_SIZE);
  for (unsigned bits = 20; !bad && bits <= 24; bits += 4)
    bad = pair_loop(a, 0, bits, 0x9E3779B97F4A7C15ull, PAIRS_PER_SIZE);
  return bad;
}

typedef struct worker_s {
  sa_arena *a;
  unsigned i, mixed_bits;
  int bad;
} worker;

static void *thread_pairs(void *arg) {
  worker *w = arg;
  w->bad = pair_loop(w->a, 4 * KIB, w->mixed_bits, 97u * w->i + 1, THREAD_PAIRS);
  return NULL;
}

/* The peer benchmark's threads: 1, 4 and 16 threads, each on a stream of
 * its own, 4 KiB and mixed (up to 1 MiB). One after another, not together:
 * what they leave behind (their streams' superblocks, their caches flushed
 * at exit) is then the same at every run, so the counts are exact. */
static int threads(sa_arena *a) {
  int bad = 0;
  for (unsigned mixed = 0; mixed <= 20 && !bad; mixed += 20) {
    for (unsigned n = 1; n <= 16 && !bad; n *= 4) {
      for (unsigned i = 0; i < n && !bad; i++) {
        pthread_t tid;
        worker w = {a, i, mixed, 0};
        if (pthread_create(&tid, NULL, thread_pairs, &w) != 0) return 1;
        pthread_join(tid, NULL);
        bad = w.bad;
      }
    }
  }
  return bad;
}

/* An allocation's driver work, for --slowest. */
typedef struct costly_s {
  double us;
  size_t size, live_bytes; /* live before it */
  sa_host_totals work;
} costly;

#define SLOWEST_MAX 16

typedef struct run_s {
  uint64_t allocs, failed;
  sa_host_totals work;
  size_t reserved_peak;
  unsigned nslowest;              /* how many to keep, at most SLOWEST_MAX */
  costly slowest[SLOWEST_MAX];    /* the costliest allocations, costliest first */
} run;

/* Keeps c (some driver time: c->us > 0) among r's nslowest costliest
 * allocations; an empty slot's us is 0. */
static void keep_costly(run *r, const costly *c) {
  unsigned k = r->nslowest;
  while (k > 0 && r->slowest[k - 1].us < c->us) k--;
  if (k >= r->nslowest) return;
  memmove(&r->slowest[k + 1], &r->slowest[k], (r->nslowest - 1 - k) * sizeof *c);
  r->slowest[k] = *c;
}

/* RMM's random loop (bench/peers/random.cc) on stream s. */
static int random_run(sa_arena *a, sa_stream s, run *r) {
  static void *live_p[RANDOM_N];
  static size_t live_size[RANDOM_N];
  size_t nlive = 0, live_bytes = 0;
  mt64 gen;
  mt64_seed(&gen, 12345);
  int bad = 0;
  sa_host_totals w0, w1;
  sa_host_get_totals(&w0);
  for (size_t i = 0; !bad && i < 2 * RANDOM_N; i++) {
    size_t size = mt64_uniform(&gen, 1, RANDOM_MAX);
    bool do_alloc = true;
    if (nlive != 0)
      do_alloc = mt64_uniform(&gen, 0, 99) < ALLOC_PERCENT && r->allocs < RANDOM_N &&
                 live_bytes + size < LIVE_CAP;
    if (do_alloc) {
      void *p;
      sa_host_totals t0, t1;
      if (r->nslowest > 0) sa_host_get_totals(&t0);
      sa_status st = sa_alloc(a, &p, size, s);
      if (r->nslowest > 0) {
        costly c = {.size = size, .live_bytes = live_bytes};
        sa_host_get_totals(&t1);
        driver_work_between(&t0, &t1, &c.work);
        c.us = driver_model_us(&c.work);
        if (c.us > 0) keep_costly(r, &c);
      }
      if (st == SA_OK) {
        live_p[nlive] = p;
        live_size[nlive++] = size;
        live_bytes += size;
        r->allocs++;
        continue;
      }
      if (st != SA_ERR_OUT_OF_MEMORY) return check("sa_alloc", st);
      r->failed++;
    }
    if (nlive == 0) continue;
    size_t k = mt64_uniform(&gen, 0, RANDOM_N - 1) % nlive;
    live_bytes -= live_size[k];
    bad = check("sa_free", sa_free(live_p[k], s));
    live_p[k] = live_p[--nlive];
    live_size[k] = live_size[nlive];
  }
  while (nlive > 0 && !bad) bad = check("sa_free", sa_free(live_p[--nlive], s));
  sa_host_get_totals(&w1);
  driver_work_between(&w0, &w1, &r->work);
  sa_stats st;
  if (!bad) bad = check("sa_get_stats", sa_get_stats(a, &st));
  if (!bad) r->reserved_peak = st.reserved_bytes_peak;
  return bad;
}

/* r's costliest allocations, after the table. */
static void print_slowest(const char *arena, int k, const run *r) {
  for (unsigned i = 0; i < r->nslowest && r->slowest[i].us > 0; i++) {
    const costly *c = &r->slowest[i];
    const uint64_t *n = c->work.calls;
    printf("%s run %d: %8.1f us  %8.1f MiB at %.2f GiB live: %" PRIu64 " creates (%.0f MiB), %" PRIu64
           " maps, %" PRIu64 " unmaps (%" PRIu64 " chunks), %" PRIu64 " set_access (%" PRIu64
           " chunks, %.0f MiB)\n",
           arena, k, c->us, (double)c->size / (double)MIB, (double)c->live_bytes / (double)GIB,
           n[SA_HOST_FN_CHUNK_CREATE], (double)c->work.bytes_created / (double)MIB,
           n[SA_HOST_FN_MAP], n[SA_HOST_FN_UNMAP], c->work.chunks_unmapped,
           n[SA_HOST_FN_SET_ACCESS], c->work.chunks_access,
           (double)c->work.bytes_access / (double)MIB);
  }
}

static void print_run(const char *arena, int k, const run *r) {
  const uint64_t *c = r->work.calls;
  double n = (double)(r->allocs ? r->allocs : 1);
  printf("| %s | %d | %" PRIu64 " | %.2f | %.2f | %.2f | %.2f (%.2f) | %.2f (%.2f) | %.3f | %.3f | "
         "%.2f | %.2f | %.2f | %.2f | %.1f |\n",
         arena, k, r->allocs, (double)c[SA_HOST_FN_CHUNK_CREATE] / n,
         (double)c[SA_HOST_FN_CHUNK_RELEASE] / n, (double)c[SA_HOST_FN_MAP] / n,
         (double)c[SA_HOST_FN_UNMAP] / n, (double)r->work.chunks_unmapped / n,
         (double)c[SA_HOST_FN_SET_ACCESS] / n, (double)r->work.chunks_access / n,
         (double)c[SA_HOST_FN_DEVICE_SYNCHRONIZE] / n, (double)c[SA_HOST_FN_STREAM_SYNCHRONIZE] / n,
         (double)c[SA_HOST_FN_EVENT_RECORD] / n, (double)c[SA_HOST_FN_EVENT_QUERY] / n,
         (double)driver_vmm_calls(&r->work) / n,
         driver_model_us(&r->work) / n, (double)r->reserved_peak / (double)GIB);
}

int main(int argc, char **argv) {
  double check_ratio = 0, check_vmm = 0;
  unsigned slowest = 0;
  const char *conf = NULL;
  int first = 1;
  for (; first < argc && strncmp(argv[first], "--", 2) == 0; first++) {
    if (strncmp(argv[first], "--check-ratio=", 14) == 0)
      check_ratio = atof(argv[first] + 14);
    else if (strncmp(argv[first], "--check-vmm=", 12) == 0)
      check_vmm = atof(argv[first] + 12);
    else if (strncmp(argv[first], "--slowest=", 10) == 0) {
      char *end;
      unsigned long n = strtoul(argv[first] + 10, &end, 10);
      if (end == argv[first] + 10 || *end != '\0' || n > SLOWEST_MAX) {
        fprintf(stderr, "after_work: --slowest takes 0 to %d\n", SLOWEST_MAX);
        return 2;
      }
      slowest = (unsigned)n;
    }
    else if (strncmp(argv[first], "--conf=", 7) == 0)
      conf = argv[first] + 7;
    else {
      fprintf(stderr, "after_work: unknown option %s\n", argv[first]);
      return 2;
    }
  }
  if (check("sa_host_set_device_memory", sa_host_set_device_memory((size_t)141 << 30))) return 1;
  sa_config cfg;
  sa_config_init(&cfg);
  char err[256];
  if (sa_config_parse(&cfg, "backend=host", err, sizeof err) != SA_OK ||
      sa_config_parse(&cfg, conf, err, sizeof err) != SA_OK) {
    fprintf(stderr, "after_work: --conf: %s\n", err);
    return 2;
  }
  sa_arena *arenas[2] = {NULL, NULL};
  static const char *const names[2] = {"fresh", "after"};
  int bad = 0;
  for (int k = 0; k < 2 && !bad; k++) bad = check("sa_arena_create", sa_arena_create(&cfg, &arenas[k]));
  for (int i = first; i < argc && !bad; i++) {
    trace t;
    if (trace_load(argv[i], &t, err, sizeof err) != SA_OK) {
      fprintf(stderr, "after_work: %s\n", err);
      bad = 1;
      break;
    }
    bad = replay(arenas[1], &t);
    trace_free(&t);
  }
  if (!bad) bad = pairs(arenas[1]) || threads(arenas[1]);
  printf("| arena | run | allocs | creates | releases | maps | unmaps (chunks) | set_access "
         "(chunks) | device syncs | stream syncs | event records | event queries | vmm calls | "
         "driver us (H200 model) | peak reserved GiB |\n| --- | ---: | ---: | ---: | ---: | ---: | "
         "---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  int failed = 0;
  static run runs[2][2]; /* for --slowest, printed after the table */
  double first_us[2] = {0, 0}; /* each arena's first run, per allocation */
  for (int k = 0; k < 2 && !bad; k++) {
    sa_stream s;
    bad = check("sa_host_stream_create", sa_host_stream_create(SA_HOST_AUTO, &s));
    for (int n = 1; n <= 2 && !bad; n++) {
      run r = {0};
      r.nslowest = slowest;
      bad = random_run(arenas[k], s, &r);
      if (bad) break;
      print_run(names[k], n, &r);
      runs[k][n - 1] = r;
      double per = (double)(r.allocs ? r.allocs : 1);
      if (n == 1) first_us[k] = driver_model_us(&r.work) / per;
      if (k == 1 && n == 1 && check_ratio > 0 && first_us[1] > check_ratio * first_us[0]) {
        printf("CHECK FAILED: after, run 1: %.2f us of driver time per allocation > %.2f x "
               "fresh's %.2f\n", first_us[1], check_ratio, first_us[0]);
        failed = 1;
      }
      if (k == 1 && check_vmm > 0 && (double)driver_vmm_calls(&r.work) / per > check_vmm) {
        printf("CHECK FAILED: after, run %d: %.2f virtual-memory calls per allocation > %.2f\n",
               n, (double)driver_vmm_calls(&r.work) / per, check_vmm);
        failed = 1;
      }
    }
    if (!bad) bad = check("sa_stream_release", sa_stream_release(arenas[k], s));
    if (!bad) bad = check("sa_host_stream_destroy", sa_host_stream_destroy(s));
  }
  for (int k = 0; k < 2 && !bad; k++)
    for (int n = 1; n <= 2; n++) print_slowest(names[k], n, &runs[k][n - 1]);
  for (int k = 0; k < 2; k++)
    if (arenas[k] != NULL) bad |= check("sa_arena_destroy", sa_arena_destroy(arenas[k]));
  return bad ? 1 : failed;
}
