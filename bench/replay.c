/* //bench:replay: replay allocation traces on the host simulator with a
 * capped device size, and compare with a contiguous first-fit reference.
 * (On a GPU, through the CUDA backend and beside other allocators:
 * //bench/peers:peer_bench --workloads=trace.)
 *
 *   replay [options] TRACE.csv...     (replay --help prints the options)
 *     --capacity=SIZE   device size for every trace (sa_config_parse sizes)
 *     --headroom=F      device size = F x the trace's peak live bytes,
 *                       rounded up to 2 MiB (default 1.10)
 *     --conf=SPEC       more arena configuration, e.g. superblock_size=4MiB;
 *                       its max_physical, if any, is the device size
 *   One of --capacity, --headroom, --conf=max_physical sets the device size;
 *   two are an error. Every option also takes its value as the next argument.
 *     --no-budget       the device size is the simulated device's memory, not
 *                       the arena's max_physical: no budget is configured, as
 *                       with the defaults on a GPU of that size
 *     --reserve=F       reserve_limit (the soft budget) = F x the trace's
 *                       peak live bytes
 *     --check-ratio=R   exit 1 if on any trace streamarena runs out of
 *                       memory or its peak reserved exceeds R x peak live
 *     --check-vmm-calls=N
 *                       exit 1 if on any trace streamarena makes more than
 *                       N virtual-memory driver calls (chunk create and
 *                       release, map, unmap, set access) per 1000 operations
 *     --check-chunks=N  exit 1 if on any trace streamarena creates more than
 *                       N physical chunks (each a growth's fixed driver cost)
 *     --check-driver-us=U
 *                       exit 1 if on any trace streamarena's driver calls
 *                       would take more than U microseconds per operation
 *                       at the H200's measured cost per call (a model)
 *     --expect-first-fit-oom
 *                       exit 1 unless on some trace the first-fit reference
 *                       runs out of memory where streamarena does not
 *     --snapshot=DIR    write DIR/<trace stem>.json: the arena's snapshot right
 *                       after the operation at which live bytes peak
 *                       (tools/render_snapshot.py draws it); DIR is made if
 *                       it does not exist (its parent must)
 *
 * Traces are CSV (docs/TRACE.md): streamarena's own format, RMM's
 * logging_resource_adaptor log or PyTorch's memory history, plain or
 * gzipped; relative paths (traces, --snapshot) are from where `bazel run`
 * was typed. The replay is single-threaded, in file order; each distinct
 * stream id becomes its own SA_HOST_AUTO stream, so events complete as soon
 * as they are queried (nothing is enqueued) and a cross-stream free is
 * reusable after the allocator's own event checks.
 * Memory is not touched, so a replay of tens of GiB needs little RAM.
 *
 * Peak live is the highest sum of requested sizes; peak reserved is the
 * arena's highest physical footprint (sa_stats.reserved_bytes_peak). The
 * driver work is what the simulator counted during the operations
 * (sa_host_get_totals): deterministic, so a bound on it is a CI check that
 * needs no GPU. "Remapped" is bytes mapped less bytes created: memory
 * mapped again after an unmap. The first-fit column is a REFERENCE MODEL
 * (first_fit.h), not streamarena.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "driver_model.h"
#include "first_fit.h"
#include "trace_read.h"
#include "user_path.h"
#include "test/util.h"

#define GRANULE ((size_t)2 << 20)
#define MAX_CAPACITY ((size_t)1 << 62) /* device sizes below it round up safely */

typedef struct options_s {
  size_t capacity; /* 0: from headroom */
  double headroom;
  const char *conf;
  double check_ratio; /* 0: no check */
  double check_vmm;   /* 0: no check */
  double check_chunks; /* 0: no check */
  double check_us;    /* 0: no check */
  bool no_budget;
  double reserve;     /* 0: no reserve_limit */
  bool expect_ff_oom;
  const char *snapshot_dir;
} options;

typedef struct result_s {
  const char *name;
  const trace *t;
  size_t capacity;
  /* streamarena */
  size_t reserved_peak;
  size_t oom_count;
  size_t first_oom_op;
  double seconds;
  sa_host_totals work; /* the simulator's totals over the operations */
  sa_host_totals own;  /* of them, the replaying thread's (the rest: the grower's) */
  /* first-fit reference */
  size_t ff_extent;
  size_t ff_oom_count;
  size_t ff_first_oom_op;
  size_t ff_largest_free_at_oom;
} result;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s != NULL ? s + 1 : path;
}

static sa_status report(const char *what, sa_status st) {
  if (st != SA_OK) fprintf(stderr, "replay: %s: %s\n", what, sa_status_string(st));
  return st;
}

/* Replay t on a fresh arena of the given capacity. */
/* The arena's snapshot into dir/<name>.json. */
static sa_status write_snapshot(sa_arena *a, const char *dir, const char *name) {
  char path[4096], full[4096];
  size_t stem = strlen(name);
  if (stem > 3 && strncmp(name + stem - 3, ".gz", 3) == 0) stem -= 3;
  if (stem > 4 && strncmp(name + stem - 4, ".csv", 4) == 0) stem -= 4;
  if (!user_path(dir, full, sizeof full) ||
      snprintf(path, sizeof path, "%s/%.*s.json", full, (int)stem, name) >= (int)sizeof path)
    return SA_ERR_INVALID_ARGUMENT;
  FILE *f = fopen(path, "w");
  if (f == NULL) {
    perror(path);
    return SA_ERR_INVALID_ARGUMENT;
  }
  sa_status st = sa_snapshot_write(a, f);
  if (fclose(f) != 0 && st == SA_OK) st = SA_ERR_INTERNAL;
  return report("sa_snapshot_write", st);
}

static sa_status run_streamarena(const trace *t, size_t capacity, const options *o,
                                 result *r) {
  const char *conf = o->conf;
  sa_config cfg;
  sa_config_init(&cfg);
  char err[256];
  sa_status st = sa_config_parse(&cfg, "backend=host", err, sizeof err);
  if (st == SA_OK && conf != NULL) st = sa_config_parse(&cfg, conf, err, sizeof err);
  if (st != SA_OK) {
    fprintf(stderr, "replay: --conf: %s\n", err);
    return st;
  }
  if (!o->no_budget) cfg.max_physical_bytes = capacity;
  if (o->reserve > 0) cfg.reserve_limit_bytes = (size_t)((double)t->peak_live * o->reserve);
  if (capacity > ((size_t)16 << 30) || o->no_budget) {
    st = sa_host_set_device_memory(capacity);
    if (report("sa_host_set_device_memory", st) != SA_OK) return st;
  }
  sa_arena *a;
  st = sa_arena_create(&cfg, &a);
  if (st == SA_ERR_BAD_CONFIG && sa_config_check(&cfg, err, sizeof err) != SA_OK) {
    fprintf(stderr, "replay: configuration: %s\n", err);
    return st;
  }
  if (report("sa_arena_create", st) != SA_OK) return st;
  sa_stream *streams = calloc(t->nstreams, sizeof *streams);
  void **ptrs = calloc(t->nslots, sizeof *ptrs);
  size_t made = 0;
  if (streams == NULL || ptrs == NULL) st = SA_ERR_OUT_OF_MEMORY;
  for (; st == SA_OK && made < t->nstreams; made++)
    st = report("sa_host_stream_create", sa_host_stream_create(SA_HOST_AUTO, &streams[made]));
  if (st != SA_OK && made > 0) made--; /* the failed one was not made */

  sa_host_totals w0, w1, own0, own1;
  sa_host_get_totals(&w0);
  sa_host_get_thread_totals(&own0);
  double t0 = now_s();
  for (size_t i = 0; st == SA_OK && i < t->nops; i++) {
    const trace_op *op = &t->ops[i];
    if (op->is_free) {
      if (ptrs[op->slot] == NULL) continue; /* its allocation failed */
      st = report("sa_free", sa_free(ptrs[op->slot], streams[op->stream]));
      ptrs[op->slot] = NULL;
      continue;
    }
    sa_status s = sa_alloc(a, &ptrs[op->slot], op->size, streams[op->stream]);
    if (s == SA_ERR_OUT_OF_MEMORY) {
      if (r->oom_count++ == 0) r->first_oom_op = i;
    } else {
      st = report("sa_alloc", s);
    }
    if (st == SA_OK && i == t->peak_op && o->snapshot_dir != NULL)
      st = write_snapshot(a, o->snapshot_dir, r->name);
  }
  r->seconds = now_s() - t0;
  sa_host_get_totals(&w1);
  sa_host_get_thread_totals(&own1);
  driver_work_between(&w0, &w1, &r->work);
  driver_work_between(&own0, &own1, &r->own);

  sa_stats stats;
  sa_status s = report("sa_get_stats", sa_get_stats(a, &stats));
  if (st == SA_OK) st = s;
  r->reserved_peak = stats.reserved_bytes_peak;
  for (size_t i = 0; ptrs != NULL && i < t->nslots; i++) /* what the trace never freed */
    if (ptrs[i] != NULL) (void)report("sa_free", sa_free(ptrs[i], NULL));
  for (size_t i = 0; i < made; i++) {
    s = report("sa_stream_release", sa_stream_release(a, streams[i]));
    if (st == SA_OK) st = s;
    s = report("sa_host_stream_destroy", sa_host_stream_destroy(streams[i]));
    if (st == SA_OK) st = s;
  }
  s = report("sa_arena_destroy", sa_arena_destroy(a));
  if (st == SA_OK) st = s;
  free(ptrs);
  free(streams);
  return st;
}

/* The same trace on the first-fit reference model. */
static sa_status run_first_fit(const trace *t, size_t capacity, result *r) {
  ff_model m;
  size_t *off = malloc(t->nslots * sizeof *off);
  bool *placed = calloc(t->nslots, sizeof *placed);
  if (off == NULL || placed == NULL || !ff_init(&m, capacity)) {
    free(off);
    free(placed);
    return SA_ERR_OUT_OF_MEMORY;
  }
  sa_status st = SA_OK;
  for (size_t i = 0; st == SA_OK && i < t->nops; i++) {
    const trace_op *op = &t->ops[i];
    if (op->is_free) {
      if (placed[op->slot] && !ff_free(&m, off[op->slot], op->size)) st = SA_ERR_OUT_OF_MEMORY;
      placed[op->slot] = false;
    } else if (ff_alloc(&m, op->size, &off[op->slot])) {
      placed[op->slot] = true;
    } else if (r->ff_oom_count++ == 0) {
      r->ff_first_oom_op = i;
      r->ff_largest_free_at_oom = ff_largest_free(&m);
    }
  }
  r->ff_extent = m.peak_extent;
  ff_fini(&m);
  free(off);
  free(placed);
  return st;
}

/* Driver calls of r per 1000 operations: virtual-memory ones, or all. */
static uint64_t vmm_calls(const result *r) { return driver_vmm_calls(&r->work); }

/* The driver's time on an H200 per operation (driver_model.h). */
static double h200_us_per_op(const result *r) {
  return driver_model_us(&r->work) / (double)(r->t->nops ? r->t->nops : 1);
}

/* The same, of the replaying thread's calls only. */
static double h200_own_us_per_op(const result *r) {
  return driver_model_us(&r->own) / (double)(r->t->nops ? r->t->nops : 1);
}

static double per_kop(const result *r, uint64_t calls) {
  return (double)calls * 1000.0 / (double)(r->t->nops ? r->t->nops : 1);
}

static uint64_t all_calls(const result *r) { return driver_all_calls(&r->work); }

static double remapped_mib(const result *r) {
  uint64_t mapped = r->work.bytes_mapped, created = r->work.bytes_created;
  return mapped > created ? (double)(mapped - created) / MiB : 0.0;
}

static void print_summary(const result *r) {
  const trace *t = r->t;
  double live = (double)t->peak_live;
  const uint64_t *c = r->work.calls;
  printf("%s: %s format, %zu ops, %zu streams, peak live %.1f MiB, capacity %.1f MiB | "
         "streamarena: peak reserved %.1f MiB (%.3fx), %s, %.1f ms (%.2f us/op), "
         "driver: %" PRIu64 " chunks created, %" PRIu64 " maps, %" PRIu64 " unmaps (%" PRIu64
         " chunks), %" PRIu64 " set_access (%" PRIu64 " chunks), %.1f MiB remapped, "
         "%.1f vmm calls, %.1f calls and %.1f event records per 1000 ops, "
         "%.2f us/op of driver time at H200 costs (model), %.2f on the replaying thread | "
         "first-fit reference: extent %.1f MiB (%.3fx), ",
         r->name, t->format, t->nops, t->nstreams, live / MiB, (double)r->capacity / MiB,
         (double)r->reserved_peak / MiB, (double)r->reserved_peak / live,
         r->oom_count ? "OUT OF MEMORY" : "no OOM", r->seconds * 1e3,
         r->seconds * 1e6 / (double)(t->nops ? t->nops : 1), c[SA_HOST_FN_CHUNK_CREATE],
         c[SA_HOST_FN_MAP], c[SA_HOST_FN_UNMAP], r->work.chunks_unmapped,
         c[SA_HOST_FN_SET_ACCESS], r->work.chunks_access, remapped_mib(r),
         per_kop(r, vmm_calls(r)), per_kop(r, all_calls(r)),
         per_kop(r, c[SA_HOST_FN_EVENT_RECORD]), h200_us_per_op(r), h200_own_us_per_op(r),
         (double)r->ff_extent / MiB, (double)r->ff_extent / live);
  if (r->ff_oom_count)
    printf("OUT OF MEMORY (%zu failed, first at op %zu with %.1f MiB largest free)\n",
           r->ff_oom_count, r->ff_first_oom_op, (double)r->ff_largest_free_at_oom / MiB);
  else
    printf("no OOM\n");
  if (r->oom_count)
    printf("%s: streamarena failed %zu allocations, first at op %zu\n", r->name, r->oom_count,
           r->first_oom_op);
  if (t->unmatched_frees || t->failed_allocs || t->never_freed)
    printf("%s: trace had %zu frees of unknown ids, %zu failed allocations, %zu never "
           "freed\n", r->name, t->unmatched_frees, t->failed_allocs, t->never_freed);
  if (t->skipped || t->early_reuse)
    printf("%s: %zu events of the recording allocator skipped, %zu addresses allocated "
           "again before their free completed\n", r->name, t->skipped, t->early_reuse);
}

static void print_table(const result *rs, size_t n) {
  printf("\n| trace | ops | streams | peak live MiB | capacity MiB | streamarena peak "
         "reserved MiB | ratio | OOM | us/op | chunks created | maps | unmaps | set_access | "
         "remapped MiB | vmm calls/1k ops | driver calls/1k ops | event records/1k ops | "
         "driver us/op (H200 model) | "
         "first-fit extent MiB | first-fit OOM | driver us/op on the replaying thread |\n");
  printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | "
         "---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n");
  for (size_t i = 0; i < n; i++) {
    const result *r = &rs[i];
    const uint64_t *c = r->work.calls;
    double live = (double)r->t->peak_live;
    printf("| %s | %zu | %zu | %.1f | %.1f | %.1f | %.3f | %s | %.2f | %" PRIu64 " | %" PRIu64
           " | %" PRIu64 " | %" PRIu64 " | %.1f | %.1f | %.1f | %.1f | %.2f | %.1f | %s | %.2f |\n",
           r->name, r->t->nops, r->t->nstreams, live / MiB, (double)r->capacity / MiB,
           (double)r->reserved_peak / MiB, (double)r->reserved_peak / live,
           r->oom_count ? "yes" : "no",
           r->seconds * 1e6 / (double)(r->t->nops ? r->t->nops : 1),
           c[SA_HOST_FN_CHUNK_CREATE], c[SA_HOST_FN_MAP], c[SA_HOST_FN_UNMAP],
           c[SA_HOST_FN_SET_ACCESS], remapped_mib(r), per_kop(r, vmm_calls(r)),
           per_kop(r, all_calls(r)), per_kop(r, c[SA_HOST_FN_EVENT_RECORD]),
           h200_us_per_op(r), (double)r->ff_extent / MiB, r->ff_oom_count ? "yes" : "no",
           h200_own_us_per_op(r));
  }
}

static const char help_text[] =
    "usage: replay [options] TRACE.csv...\n"
    "Replays allocation traces (streamarena's CSV, an RMM log or PyTorch's memory\n"
    "history, plain or gzipped) on the host simulator with a capped device size,\n"
    "beside a first-fit reference model.\n"
    "\n"
    "The device size comes from one of --capacity, --headroom or --conf=max_physical:\n"
    "  --capacity SIZE        device size for every trace, e.g. 80GiB\n"
    "  --headroom F           device size = F x each trace's peak live bytes,\n"
    "                         rounded up to 2 MiB; F >= 1 (default 1.10)\n"
    "  --conf SPEC            more arena configuration (sa_config_parse syntax),\n"
    "                         e.g. superblock_size=4MiB,chunk_size=8MiB (once)\n"
    "  --check-ratio R        exit 1 if on any trace streamarena runs out of memory\n"
    "                         or its peak reserved exceeds R x peak live; R > 0\n"
    "  --no-budget            configure no max_physical: the device size is the\n"
    "                         simulated device's memory (the defaults on a GPU)\n"
    "  --reserve F            reserve_limit = F x each trace's peak live bytes\n"
    "  --check-vmm-calls N    exit 1 if on any trace streamarena makes more than N\n"
    "                         virtual-memory driver calls per 1000 operations\n"
    "  --check-chunks N       exit 1 if on any trace streamarena creates more than N\n"
    "                         physical chunks (each a growth's fixed driver cost)\n"
    "  --check-driver-us U    exit 1 if on any trace streamarena's driver calls\n"
    "                         would take more than U us per operation at the\n"
    "                         H200's cost per call (a model)\n"
    "  --expect-first-fit-oom exit 1 unless on some trace the first-fit reference\n"
    "                         runs out of memory where streamarena does not\n"
    "  --snapshot DIR         write DIR/<trace stem>.json, the arena at peak live\n"
    "                         (DIR is made if missing)\n"
    "  -h, --help             this text\n"
    "Options take their value after '=' or as the next argument.\n";

static int usage(void) {
  fprintf(stderr, "usage: replay [--capacity=SIZE | --headroom=F] [--conf=SPEC] "
          "[--no-budget] [--reserve=F] [--check-ratio=R] [--check-vmm-calls=N] "
          "[--check-chunks=N] [--check-driver-us=U] "
          "[--expect-first-fit-oom] "
          "[--snapshot=DIR] TRACE.csv...\n"
          "       replay --help    for what each option does\n");
  return 2;
}

static bool parse_size(const char *s, size_t *out) {
  sa_config c;
  sa_config_init(&c);
  char spec[128];
  if (strchr(s, ',') != NULL) return false; /* one size, not more configuration items */
  if (snprintf(spec, sizeof spec, "max_physical=%s", s) >= (int)sizeof spec) return false;
  if (sa_config_parse(&c, spec, NULL, 0) != SA_OK) return false;
  *out = c.max_physical_bytes;
  return *out > 0;
}

static bool parse_double(const char *s, double *out) {
  char *end;
  *out = strtod(s, &end);
  return end != s && *end == '\0';
}

/* The value of option `name` at argv[*i]: after '=' in the same argument, or
 * the next argument. NULL if argv[*i] is not that option; *missing is set
 * when it is but has no value. */
static const char *option_value(int argc, char **argv, int *i, const char *name, bool *missing) {
  size_t len = strlen(name);
  const char *a = argv[*i];
  if (strncmp(a, name, len) != 0) return NULL;
  if (a[len] == '=') return a + len + 1;
  if (a[len] != '\0') return NULL;
  if (*i + 1 >= argc) {
    *missing = true;
    return NULL;
  }
  return argv[++*i];
}

/* Reads the options into *o and the index of the first trace into *first.
 * Returns 0 to go on, 1 after --help, 2 (the exit status) on bad usage. */
static int parse_options(int argc, char **argv, options *o, int *first) {
  *o = (options){.headroom = 1.10};
  bool headroom_set = false;
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    const char *a = argv[i], *v;
    bool missing = false;
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      fputs(help_text, stdout);
      return 1;
    }
    if ((v = option_value(argc, argv, &i, "--capacity", &missing)) != NULL) {
      if (!parse_size(v, &o->capacity)) {
        fprintf(stderr, "replay: --capacity: '%s' is not a size (e.g. 80GiB, 512MiB)\n", v);
        return 2;
      }
    } else if ((v = option_value(argc, argv, &i, "--headroom", &missing)) != NULL) {
      if (!parse_double(v, &o->headroom) || !(o->headroom >= 1.0)) {
        fprintf(stderr, "replay: --headroom: '%s' is not a number >= 1\n", v);
        return 2;
      }
      headroom_set = true;
    } else if ((v = option_value(argc, argv, &i, "--conf", &missing)) != NULL) {
      if (o->conf != NULL) { /* the second replaced the first, silently */
        fprintf(stderr, "replay: --conf given twice: give one, its keys separated by commas\n");
        return 2;
      }
      o->conf = v;
    } else if ((v = option_value(argc, argv, &i, "--check-ratio", &missing)) != NULL) {
      if (!parse_double(v, &o->check_ratio) || !(o->check_ratio > 0)) {
        fprintf(stderr, "replay: --check-ratio: '%s' is not a number > 0\n", v);
        return 2;
      }
    } else if (strcmp(a, "--no-budget") == 0) {
      o->no_budget = true;
    } else if ((v = option_value(argc, argv, &i, "--reserve", &missing)) != NULL) {
      if (!parse_double(v, &o->reserve) || !(o->reserve > 0)) {
        fprintf(stderr, "replay: --reserve: '%s' is not a number > 0\n", v);
        return 2;
      }
    } else if ((v = option_value(argc, argv, &i, "--check-vmm-calls", &missing)) != NULL) {
      if (!parse_double(v, &o->check_vmm) || !(o->check_vmm > 0)) {
        fprintf(stderr, "replay: --check-vmm-calls: '%s' is not a number > 0\n", v);
        return 2;
      }
    } else if ((v = option_value(argc, argv, &i, "--check-chunks", &missing)) != NULL) {
      if (!parse_double(v, &o->check_chunks) || !(o->check_chunks > 0)) {
        fprintf(stderr, "replay: --check-chunks: '%s' is not a number > 0\n", v);
        return 2;
      }
    } else if ((v = option_value(argc, argv, &i, "--check-driver-us", &missing)) != NULL) {
      if (!parse_double(v, &o->check_us) || !(o->check_us > 0)) {
        fprintf(stderr, "replay: --check-driver-us: '%s' is not a number > 0\n", v);
        return 2;
      }
    } else if ((v = option_value(argc, argv, &i, "--snapshot", &missing)) != NULL) {
      o->snapshot_dir = v;
    } else if (strcmp(a, "--expect-first-fit-oom") == 0) {
      o->expect_ff_oom = true;
    } else if (missing) {
      fprintf(stderr, "replay: %s needs a value\n", a);
      return 2;
    } else {
      fprintf(stderr, "replay: unknown option %s\n", a);
      return usage();
    }
  }
  *first = i;
  if (i == argc) {
    fprintf(stderr, "replay: no trace given\n");
    return usage();
  }
  /* An option after the traces would be read as a trace, after the ones
   * before it had been replayed without it. After "--" every argument is a
   * trace. */
  if (i == 1 || strcmp(argv[i - 1], "--") != 0) {
    for (int j = i; j < argc; j++) {
      if (argv[j][0] == '-' && argv[j][1] != '\0') {
        fprintf(stderr, "replay: option %s after a trace: options go before TRACE.csv...\n",
                argv[j]);
        return usage();
      }
    }
  }
  /* --conf is checked here, once, and may name the device size itself. */
  sa_config cfg;
  sa_config_init(&cfg);
  char err[256];
  if (o->conf != NULL && sa_config_parse(&cfg, o->conf, err, sizeof err) != SA_OK) {
    fprintf(stderr, "replay: --conf: %s\n", err);
    return 2;
  }
  int sizes = (o->capacity != 0) + headroom_set + (cfg.max_physical_bytes != 0);
  if (sizes > 1) {
    fprintf(stderr, "replay: --capacity, --headroom and --conf=max_physical each set the "
                    "device size: give one\n");
    return 2;
  }
  if (cfg.max_physical_bytes != 0) o->capacity = cfg.max_physical_bytes;
  if (o->capacity >= MAX_CAPACITY) { /* rounding it up to 2 MiB would wrap to 0 */
    fprintf(stderr, "replay: a device size of %zu bytes is beyond any device\n", o->capacity);
    return 2;
  }
  /* Made now, not found missing after the replay ran to its peak. */
  if (o->snapshot_dir != NULL) {
    char dir[4096];
    errno = ENAMETOOLONG;
    if (!user_path(o->snapshot_dir, dir, sizeof dir) ||
        (mkdir(dir, 0777) != 0 && errno != EEXIST)) {
      fprintf(stderr, "replay: --snapshot: cannot make the folder %s: %s\n", o->snapshot_dir,
              strerror(errno));
      return 2;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  options o;
  int first = 0;
  int usage_status = parse_options(argc, argv, &o, &first);
  if (usage_status != 0) return usage_status == 1 ? 0 : usage_status;
  size_t n = (size_t)(argc - first);
  trace *traces = calloc(n, sizeof *traces);
  result *rs = calloc(n, sizeof *rs);
  bool broken = traces == NULL || rs == NULL; /* a trace could not be replayed */
  int failed = 0;                             /* a check failed */
  bool ff_only_oom = false;
  for (size_t i = 0; i < n && !broken; i++) {
    const char *path = argv[first + (int)i];
    char err[512];
    if (trace_load(path, &traces[i], err, sizeof err) != SA_OK) {
      fprintf(stderr, "replay: %s\n", err);
      broken = true;
      break;
    }
    if (traces[i].peak_live == 0) { /* nothing to size the device or a ratio by */
      fprintf(stderr, "replay: %s: the trace allocates nothing (%zu operations read)\n", path,
              traces[i].nops);
      broken = true;
      break;
    }
    result *r = &rs[i];
    r->name = base_name(path);
    r->t = &traces[i];
    size_t cap = o.capacity;
    if (cap == 0) {
      double want = (double)traces[i].peak_live * o.headroom;
      if (!(want < (double)MAX_CAPACITY)) { /* no size_t holds it */
        fprintf(stderr, "replay: %s: %g x peak live is beyond any device\n", path, o.headroom);
        broken = true;
        break;
      }
      cap = (size_t)want;
    }
    r->capacity = (cap + GRANULE - 1) / GRANULE * GRANULE;
    if (run_streamarena(r->t, r->capacity, &o, r) != SA_OK ||
        run_first_fit(r->t, r->capacity, r) != SA_OK) {
      fprintf(stderr, "replay: %s: replay failed\n", r->name);
      broken = true;
      break;
    }
    print_summary(r);
    fflush(stdout);
    double ratio = (double)r->reserved_peak / (double)traces[i].peak_live;
    if (o.check_ratio > 0 && (r->oom_count > 0 || ratio > o.check_ratio)) {
      printf("CHECK FAILED: %s: streamarena %s, ratio %.3f > %.3f\n", r->name,
             r->oom_count ? "ran out of memory" : "fits", ratio, o.check_ratio);
      failed = 1;
    }
    double vmm = per_kop(r, vmm_calls(r));
    if (o.check_vmm > 0 && vmm > o.check_vmm) {
      printf("CHECK FAILED: %s: %.1f virtual-memory driver calls per 1000 operations > %.1f\n",
             r->name, vmm, o.check_vmm);
      failed = 1;
    }
    double chunks = (double)r->work.calls[SA_HOST_FN_CHUNK_CREATE];
    if (o.check_chunks > 0 && chunks > o.check_chunks) {
      printf("CHECK FAILED: %s: %.0f chunks created > %.0f\n", r->name, chunks, o.check_chunks);
      failed = 1;
    }
    double us = h200_us_per_op(r);
    if (o.check_us > 0 && us > o.check_us) {
      printf("CHECK FAILED: %s: %.2f us of driver time per operation (H200 model) > %.2f\n",
             r->name, us, o.check_us);
      failed = 1;
    }
    if (r->ff_oom_count > 0 && r->oom_count == 0) ff_only_oom = true;
  }
  if (!broken) print_table(rs, n);
  if (!broken && o.expect_ff_oom && !ff_only_oom) {
    printf("CHECK FAILED: no trace where first-fit runs out of memory and streamarena "
           "does not\n");
    failed = 1;
  }
  for (size_t i = 0; traces != NULL && i < n; i++) trace_free(&traces[i]);
  free(traces);
  free(rs);
  return broken ? 1 : failed;
}
