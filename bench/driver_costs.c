/* What the CUDA driver's virtual-memory calls cost, by size, on this GPU.
 *
 * The large path's policy (src/vm/physical.c: how big a chunk is created, when
 * a reshape pays for remapping) rests on these figures, so they are taken
 * here rather than guessed: for each chunk size, the median time of
 * cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, a second map and
 * access elsewhere (what a reshape pays for memory held already), and
 * cuMemRelease; beside them cuMemAlloc/cuMemFree of the same size (what
 * RMM's pool grows by). A second table sets access once over many chunks
 * mapped back to back, to tell the per-call part of cuMemSetAccess from the
 * per-byte part.
 *
 * With --schedule, it performs a list of growths instead (one size in bytes
 * a line, as `bench/growth_bound.py TRACE --schedule R` prints the fewest
 * growths a trace needs at footprint R) the two cheapest ways the driver
 * offers, and times the whole list: each growth as one chunk created,
 * mapped at the end of one reserved range and given access (the holdings
 * rounded up to granules, so a growth within the last granule is free), and
 * each as one cuMemAlloc. Divided by the trace's operations (--ops), that
 * is what any allocator at that footprint pays per operation on a fresh
 * replay of the trace, measured rather than assumed.
 *
 *   driver_costs [--device N] [--max-size SIZE_MiB]
 *   driver_costs --schedule FILE --ops N [--rounds R] [--device N]
 *
 * Needs a GPU; prints "skipped" and exits 0 without one.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/cuda_device.h"
#include "test/util.h"

#define MAX_REPS 24

static bench_cu cu;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

#define CHECK(call) BENCH_CU_CHECK("driver_costs", call)

/* Time one call into *slot. */
#define TIMED(slot, call)   \
  do {                      \
    double t0_ = now_us();  \
    CHECK(call);            \
    (slot) = now_us() - t0_; \
  } while (0)

static CUmemAllocationProp prop(void) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = (int)cu.dev;
  return p;
}

static CUmemAccessDesc access_rw(void) {
  CUmemAccessDesc d;
  memset(&d, 0, sizeof d);
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = (int)cu.dev;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return d;
}

enum { C_CREATE, C_MAP, C_ACCESS, C_UNMAP, C_REMAP, C_REACCESS, C_RELEASE, C_ALLOC, C_FREE, NCOLS };
static const char *const col_name[NCOLS] = {"create", "map",   "access", "unmap", "map again",
                                            "access again", "release", "cuMemAlloc", "cuMemFree"};

static void one_size(CUdeviceptr va, size_t size, int reps) {
  CUmemAllocationProp p = prop();
  CUmemAccessDesc acc = access_rw();
  double t[NCOLS][MAX_REPS];
  for (int r = 0; r < reps; r++) {
    CUmemGenericAllocationHandle h;
    TIMED(t[C_CREATE][r], sa_cu.MemCreate(&h, size, &p, 0));
    TIMED(t[C_MAP][r], sa_cu.MemMap(va, size, 0, h, 0));
    TIMED(t[C_ACCESS][r], sa_cu.MemSetAccess(va, size, &acc, 1));
    TIMED(t[C_UNMAP][r], sa_cu.MemUnmap(va, size));
    /* Elsewhere in the range, as a reshape maps memory it holds. */
    TIMED(t[C_REMAP][r], sa_cu.MemMap(va + size, size, 0, h, 0));
    TIMED(t[C_REACCESS][r], sa_cu.MemSetAccess(va + size, size, &acc, 1));
    CHECK(sa_cu.MemUnmap(va + size, size));
    TIMED(t[C_RELEASE][r], sa_cu.MemRelease(h));
    CUdeviceptr d;
    TIMED(t[C_ALLOC][r], sa_cu.MemAlloc(&d, size));
    TIMED(t[C_FREE][r], sa_cu.MemFree(d));
  }
  printf("| %zu MiB |", size / MiB);
  for (int c = 0; c < NCOLS; c++) printf(" %.1f |", sa_median(t[c], reps));
  printf("\n");
}

/* k chunks of chunk bytes mapped back to back, access set once over all
 * of them and, after unmapping, once per chunk. */
static void many_chunks(CUdeviceptr va, size_t chunk, int k) {
  CUmemAllocationProp p = prop();
  CUmemAccessDesc acc = access_rw();
  CUmemGenericAllocationHandle *h = calloc((size_t)k, sizeof *h);
  if (h == NULL) exit(1);
  double create = 0, map = 0, once, per_chunk = 0;
  for (int i = 0; i < k; i++) {
    double t;
    TIMED(t, sa_cu.MemCreate(&h[i], chunk, &p, 0));
    create += t;
    TIMED(t, sa_cu.MemMap(va + (size_t)i * chunk, chunk, 0, h[i], 0));
    map += t;
  }
  TIMED(once, sa_cu.MemSetAccess(va, (size_t)k * chunk, &acc, 1));
  CHECK(sa_cu.MemUnmap(va, (size_t)k * chunk));
  for (int i = 0; i < k; i++) CHECK(sa_cu.MemMap(va + (size_t)i * chunk, chunk, 0, h[i], 0));
  for (int i = 0; i < k; i++) {
    double t;
    TIMED(t, sa_cu.MemSetAccess(va + (size_t)i * chunk, chunk, &acc, 1));
    per_chunk += t;
  }
  CHECK(sa_cu.MemUnmap(va, (size_t)k * chunk));
  for (int i = 0; i < k; i++) CHECK(sa_cu.MemRelease(h[i]));
  free(h);
  printf("| %d x %zu MiB | %.1f | %.1f | %.1f | %.1f |\n", k, chunk / MiB, create, map, once,
         per_chunk);
}

/* The growth sizes of a schedule file: one size in bytes a line, # comments. */
static size_t *read_schedule(const char *path, int *n) {
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    perror(path);
    exit(2);
  }
  size_t *v = NULL;
  int cap = 0;
  char line[128];
  *n = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    if (line[0] == '#' || line[0] == '\n') continue;
    char *end;
    unsigned long long x = strtoull(line, &end, 10);
    if (end == line || (*end != '\n' && *end != '\0') || x == 0) {
      fprintf(stderr, "driver_costs: %s: not a size in bytes: %s", path, line);
      exit(2);
    }
    if (*n == cap) {
      cap = cap ? 2 * cap : 256;
      v = realloc(v, (size_t)cap * sizeof *v);
      if (v == NULL) exit(1);
    }
    v[(*n)++] = (size_t)x;
  }
  fclose(f);
  return v;
}

/* One round of the schedule (total bytes) through the virtual-memory
 * calls; returns us. */
static double schedule_vmm(const size_t *grow, int n, size_t total, size_t gran, int *calls) {
  CUmemAllocationProp p = prop();
  CUmemAccessDesc acc = access_rw();
  size_t reserve = (total / gran + 1) * gran;
  CUdeviceptr va;
  CHECK(sa_cu.MemAddressReserve(&va, reserve, 0, 0, 0));
  CUmemGenericAllocationHandle *h = calloc((size_t)n, sizeof *h);
  if (h == NULL) exit(1);
  size_t held = 0, mapped = 0;
  int chunks = 0;
  double t0 = now_us();
  for (int i = 0; i < n; i++) {
    held += grow[i];
    size_t want = (held + gran - 1) / gran * gran;
    if (want == mapped) continue; /* within the last granule mapped */
    size_t s = want - mapped;
    CHECK(sa_cu.MemCreate(&h[chunks], s, &p, 0));
    CHECK(sa_cu.MemMap(va + mapped, s, 0, h[chunks], 0));
    CHECK(sa_cu.MemSetAccess(va + mapped, s, &acc, 1));
    chunks++;
    mapped = want;
  }
  double us = now_us() - t0;
  CHECK(sa_cu.MemUnmap(va, mapped));
  for (int i = 0; i < chunks; i++) CHECK(sa_cu.MemRelease(h[i]));
  CHECK(sa_cu.MemAddressFree(va, reserve));
  free(h);
  *calls = chunks;
  return us;
}

/* One round of the schedule as cuMemAlloc calls; returns us. */
static double schedule_alloc(const size_t *grow, int n) {
  CUdeviceptr *d = calloc((size_t)n, sizeof *d);
  if (d == NULL) exit(1);
  double t0 = now_us();
  for (int i = 0; i < n; i++) CHECK(sa_cu.MemAlloc(&d[i], grow[i]));
  double us = now_us() - t0;
  for (int i = 0; i < n; i++) CHECK(sa_cu.MemFree(d[i]));
  free(d);
  return us;
}

static int run_schedule(const char *path, long ops, int rounds) {
  int n;
  size_t *grow = read_schedule(path, &n);
  if (n == 0) {
    fprintf(stderr, "driver_costs: %s: no growths\n", path);
    return 2;
  }
  CUmemAllocationProp p = prop();
  size_t gran = 0, total = 0;
  CHECK(sa_cu.MemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  for (int i = 0; i < n; i++) total += grow[i];
  double vmm[MAX_REPS], alloc[MAX_REPS];
  int chunks = 0;
  (void)schedule_alloc(grow, n < 8 ? n : 8); /* the context's first allocations, untimed */
  for (int r = 0; r < rounds; r++) { /* the two ways interleaved */
    vmm[r] = schedule_vmm(grow, n, total, gran, &chunks);
    alloc[r] = schedule_alloc(grow, n);
  }
  printf("%s: %d growths, %.2f GiB, over %ld operations; %d rounds\n\n", path, n,
         (double)total / (double)(1u << 30), ops, rounds);
  printf("| way | driver calls | ms, median (min-max) | us per operation |\n"
         "| --- | ---: | ---: | ---: |\n");
  const char *way[2] = {"create, map, access", "cuMemAlloc"};
  double *t[2] = {vmm, alloc};
  int calls[2] = {3 * chunks, n};
  for (int w = 0; w < 2; w++) {
    double lo = t[w][0], hi = t[w][0];
    for (int r = 1; r < rounds; r++) {
      lo = t[w][r] < lo ? t[w][r] : lo;
      hi = t[w][r] > hi ? t[w][r] : hi;
    }
    double med = sa_median(t[w], rounds);
    printf("| %s | %d | %.2f (%.2f-%.2f) | %.3f |\n", way[w], calls[w], med / 1e3, lo / 1e3,
           hi / 1e3, med / (double)ops);
  }
  free(grow);
  return 0;
}

int main(int argc, char **argv) {
  int device = 0, rounds = 3;
  long ops = 0;
  const char *schedule = NULL;
  size_t max_size = 4096 * MiB;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
      device = atoi(argv[++i]);
    else if (strcmp(argv[i], "--max-size") == 0 && i + 1 < argc)
      max_size = (size_t)strtoull(argv[++i], NULL, 10) * MiB;
    else if (strcmp(argv[i], "--schedule") == 0 && i + 1 < argc)
      schedule = argv[++i];
    else if (strcmp(argv[i], "--ops") == 0 && i + 1 < argc)
      ops = atol(argv[++i]);
    else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
      rounds = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: driver_costs [--device N] [--max-size MiB]\n"
                      "       driver_costs --schedule FILE --ops N [--rounds R] [--device N]\n");
      return 2;
    }
  }
  if (schedule != NULL && (ops <= 0 || rounds < 1 || rounds > MAX_REPS)) {
    fprintf(stderr, "driver_costs: --schedule needs --ops N > 0 and --rounds 1..%d\n", MAX_REPS);
    return 2;
  }
  if (!bench_cu_open_or_skip(&cu, device, "driver_costs")) return 0;
  if (schedule != NULL) {
    int rc = run_schedule(schedule, ops, rounds);
    bench_cu_close(&cu);
    return rc;
  }
  CUmemAllocationProp p = prop();
  size_t gran = 0;
  CHECK(sa_cu.MemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUdeviceptr va;
  size_t span = 2 * max_size + 512 * MiB;
  CHECK(sa_cu.MemAddressReserve(&va, span, 0, 0, 0));
  printf("device %d: %s, driver %d, granule %zu KiB\n\n", device, cu.name, cu.driver_version,
         gran >> 10);
  printf("One chunk: median us per call\n\n| size |");
  for (int c = 0; c < NCOLS; c++) printf(" %s |", col_name[c]);
  printf("\n| ---: |");
  for (int c = 0; c < NCOLS; c++) printf(" ---: |");
  printf("\n");
  one_size(va, gran, 3); /* warm-up, printed too */
  for (size_t s = gran; s <= max_size; s *= 2) {
    int reps = s <= 64 * MiB ? MAX_REPS : s <= 512 * MiB ? 8 : 3;
    one_size(va, s, reps);
  }
  printf("\nMany chunks back to back: total us\n\n"
         "| chunks | create | map | access once | access per chunk |\n"
         "| ---: | ---: | ---: | ---: | ---: |\n");
  many_chunks(va, gran, 16);
  many_chunks(va, gran, 128);
  many_chunks(va, 32 * MiB, 32);
  many_chunks(va, 128 * MiB, 8);
  CHECK(sa_cu.MemAddressFree(va, span));
  bench_cu_close(&cu);
  return 0;
}
