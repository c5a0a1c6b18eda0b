/* Fault injection sweep: every driver function, failed at every call it
 * gets in a scripted workload (arena creation, small and large allocations
 * on two streams, cross-stream frees, sa_record_stream, a thread that
 * exits with cached blocks and an open cross-stream batch, cache eviction
 * over streams destroyed without sa_stream_release, trim, defragment,
 * stream release, destroy), once as a one-shot fault and once as a fault
 * that sticks from that call on.
 *
 * Each time: every call returns a status the contract allows (never a
 * crash, never SA_ERR_INTERNAL, never a stream-order violation), a failed
 * allocation returns NULL, contents written by simulated kernels stay
 * intact, the arena serves again once the fault is cleared, and after
 * destroy the simulator holds no chunk, mapping, reserved range or event
 * more than before.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "internal.h" /* SA_TCACHE_ENTRIES */
#include "test/util.h"

#define MAX_BLOCKS 128

static const char *const arena_spec = "backend=host,check_stream_order=1,max_physical=40MiB";

typedef struct block_s {
  void *p;
  size_t size;
  sa_stream on; /* allocated on */
  uint32_t pattern;
} block;

typedef struct run_s {
  sa_arena *a;
  sa_stream s[2];
  block b[MAX_BLOCKS];
  size_t n;
  uint32_t next_pattern;
  uint64_t mismatches; /* simulated check kernels add here */
  unsigned bad;        /* calls that returned a status the contract forbids */
  const char *label;   /* the fault being swept, for messages */
} run;

static unsigned long runs, faults_fired, failures, calls_total;

static void complain(run *r, const char *what, sa_status st) {
  fprintf(stderr, "fault sweep [%s]: %s returned %s\n", r->label, what, sa_status_string(st));
  r->bad++;
}

/* What a call may return while the driver fails under it. */
static void allowed(run *r, sa_status st, const char *what) {
  if (st == SA_OK || st == SA_ERR_DRIVER || st == SA_ERR_OUT_OF_MEMORY) return;
  complain(r, what, st);
}

static void must(run *r, sa_status st, const char *what) {
  if (st != SA_OK) complain(r, what, st);
}

static block *alloc(run *r, size_t size, int stream) {
  if (r->a == NULL || r->n == MAX_BLOCKS) return NULL;
  void *p = (void *)1;
  sa_status st = sa_alloc(r->a, &p, size, r->s[stream]);
  allowed(r, st, "sa_alloc");
  if (st != SA_OK) {
    if (p != NULL) complain(r, "sa_alloc left *out non-NULL on failure", st);
    return NULL;
  }
  if (p == NULL || (uintptr_t)p % SA_ALIGNMENT != 0) {
    complain(r, "sa_alloc gave a NULL or misaligned pointer", st);
    return NULL;
  }
  block *b = &r->b[r->n++];
  *b = (block){p, size, r->s[stream], r->next_pattern++};
  /* Write the block on its stream, and check it there later. */
  size_t words = size < 65536 ? size : 65536;
  must(r, sa_host_fill(b->on, p, words & ~(size_t)3, b->pattern), "sa_host_fill");
  return b;
}

/* Check b's pattern on the stream that wrote it, then free it on stream.
 * Freed on another stream, the block's own stream is declared with
 * sa_record_stream first (the contract: every use is ordered before the
 * free or recorded). A failed free leaves the block live: it is retried
 * once the fault is cleared. */
static void release(run *r, block *b, int stream) {
  if (b == NULL || b->p == NULL) return;
  size_t words = b->size < 65536 ? b->size : 65536;
  must(r, sa_host_check(b->on, b->p, words & ~(size_t)3, b->pattern, &r->mismatches),
       "sa_host_check");
  if (r->s[stream] != b->on) {
    sa_status st = sa_record_stream(b->p, b->on);
    allowed(r, st, "sa_record_stream");
    if (st != SA_OK) return;
  }
  sa_status st = sa_free(b->p, r->s[stream]);
  allowed(r, st, "sa_free");
  if (st == SA_OK) b->p = NULL;
}

/* b is used on stream too: declared, then read there after its own
 * stream's work (drained: a host-side order the checker also sees). */
static void record(run *r, block *b, int stream) {
  if (b == NULL || b->p == NULL) return;
  sa_status st = sa_record_stream(b->p, r->s[stream]);
  allowed(r, st, "sa_record_stream");
  if (st != SA_OK) return;
  must(r, sa_host_stream_drain(b->on), "sa_host_stream_drain");
  must(r, sa_host_check(r->s[stream], b->p, 256, b->pattern, &r->mismatches), "sa_host_check");
}

/* A thread that caches blocks, opens a cross-stream batch and exits: what
 * it held goes back without a driver call (its streams may be gone). */
static void *exiting_thread(void *arg) {
  run *r = arg;
  block *x = alloc(r, 3000, 0), *y = alloc(r, 3000, 1), *z = alloc(r, 200000, 0);
  release(r, x, 1); /* cross-stream: the thread's open batch */
  release(r, y, 1); /* cached */
  release(r, z, 0); /* cached */
  return NULL;
}

static void thread_exits(run *r) {
  pthread_t t;
  if (pthread_create(&t, NULL, exiting_thread, r) != 0 || pthread_join(t, NULL) != 0)
    complain(r, "pthread_create/join", SA_ERR_INTERNAL);
}

/* Blocks of stream 0 freed on more streams than a thread's cache has
 * entries, each stream destroyed right after (no sa_stream_release): the
 * entries evicted hand their open batches back without a driver call. A
 * failed free leaves its block live (freed on stream 0 once the fault is
 * cleared). */
static void evictions(run *r) {
  enum { N = SA_TCACHE_ENTRIES + 2 };
  sa_stream s[N];
  for (int k = 0; k < N; k++) /* all first: a destroyed handle goes to the next */
    must(r, sa_host_stream_create(SA_HOST_AUTO, &s[k]), "sa_host_stream_create");
  for (int k = 0; k < N; k++) {
    if (r->n < MAX_BLOCKS) {
      block *b = &r->b[r->n];
      *b = (block){NULL, 256, r->s[0], r->next_pattern++};
      sa_status st = sa_alloc(r->a, &b->p, 256, r->s[0]);
      allowed(r, st, "sa_alloc");
      if (st == SA_OK) {
        r->n++;
        st = sa_free(b->p, s[k]);
        allowed(r, st, "sa_free");
        if (st == SA_OK) b->p = NULL;
      }
    }
    must(r, sa_host_stream_destroy(s[k]), "sa_host_stream_destroy");
  }
}

static void step(run *r, int stream, size_t n) {
  must(r, sa_host_stream_step(r->s[stream], n, NULL), "sa_host_stream_step");
}

/* The scripted workload, with whatever fault is armed. */
static void workload(run *r) {
  sa_config cfg;
  sa_config_init(&cfg);
  must(r, sa_config_parse(&cfg, arena_spec, NULL, 0), "sa_config_parse");
  r->a = NULL;
  sa_status st = sa_arena_create(&cfg, &r->a);
  allowed(r, st, "sa_arena_create");
  if (st != SA_OK) {
    if (r->a != NULL) complain(r, "sa_arena_create left *out non-NULL on failure", st);
    r->a = NULL;
    return;
  }
  block *sa[6], *sb[6];
  for (int i = 0; i < 6; i++) {
    sa[i] = alloc(r, 1000, 0);
    sb[i] = alloc(r, 3000, 1);
  }
  block *la = alloc(r, 5 * MiB, 0), *lb = alloc(r, 9 * MiB, 1);
  thread_exits(r);
  evictions(r);
  record(r, sa[0], 1);
  record(r, la, 1);
  release(r, sa[0], 0);  /* recorded: deferred behind events */
  release(r, sa[1], 1);  /* cross-stream */
  release(r, sb[0], 0);  /* cross-stream */
  release(r, lb, 0);     /* large, cross-stream: retiring */
  release(r, sa[2], 0);  /* same stream: thread cache */
  release(r, la, 0);     /* large, recorded: retiring */
  step(r, 0, 3);
  step(r, 1, 1);
  block *again[3] = {alloc(r, 1000, 1), alloc(r, 9 * MiB, 0), alloc(r, 12 * MiB, 1)};
  for (int i = 0; i < 3; i++) release(r, again[i], i % 2);
  allowed(r, sa_trim(r->a, 0), "sa_trim");
  /* Holes on stream 0, then a request larger than either under the
   * budget: a reshape, which first asks whether the stream is idle. */
  block *holes[4];
  for (int i = 0; i < 4; i++) holes[i] = alloc(r, 9 * MiB, 0);
  release(r, holes[0], 0);
  release(r, holes[2], 0);
  block *stitched = alloc(r, 14 * MiB, 0);
  release(r, stitched, 0);
  release(r, holes[1], 0);
  release(r, holes[3], 0);
  block *after_trim = alloc(r, 2 * MiB, 0);
  release(r, sb[1], 1);
  allowed(r, sa_defragment(r->a), "sa_defragment");
  /* Release stream 1 with its blocks still allocated; free them on 0. */
  allowed(r, sa_stream_release(r->a, r->s[1]), "sa_stream_release");
  for (int i = 2; i < 6; i++) release(r, sb[i], 0);
  for (int i = 3; i < 6; i++) release(r, sa[i], i % 2);
  release(r, after_trim, 0);
}

/* Allocate, write, check and free on both streams: the arena still works. */
static void serve(run *r) {
  size_t first = r->n;
  for (int s = 0; s < 2; s++) {
    block *small = alloc(r, 4096, s), *large = alloc(r, 6 * MiB, s);
    if (small == NULL || large == NULL) complain(r, "allocation after the fault", SA_OK);
    release(r, small, s);
    release(r, large, 1 - s);
  }
  must(r, sa_host_drain_all(), "sa_host_drain_all");
  r->n = first; /* their slots are free again */
}

static sa_arena *fresh_arena(run *r) {
  sa_config cfg;
  sa_config_init(&cfg);
  must(r, sa_config_parse(&cfg, arena_spec, NULL, 0), "sa_config_parse");
  sa_arena *a = NULL;
  must(r, sa_arena_create(&cfg, &a), "sa_arena_create after the fault");
  return a;
}

/* Free what a failed free left live (the fault is cleared by now). */
static void free_leftovers(run *r) {
  for (size_t i = 0; i < r->n; i++) {
    if (r->b[i].p == NULL) continue;
    must(r, sa_free(r->b[i].p, r->s[0]), "sa_free after the fault");
    r->b[i].p = NULL;
  }
}

/* What a run may leave with the driver: nothing, unless the fault hit
 * arena destroy itself. Then the arena is gone and what the driver refused
 * to release stays with it, but only that: a refused event, chunk or range;
 * a refused unmap also keeps its chunks mapped and its range reserved. */
typedef struct allowance_s {
  size_t va_ranges, chunks, mappings, events;
} allowance;

static allowance allowed_leak(sa_host_fn fn, int sticky, bool in_destroy) {
  allowance a = {0, 0, 0, 0};
  if (!in_destroy) return a;
  size_t any = sticky ? SIZE_MAX : 1;
  switch (fn) {
    case SA_HOST_FN_VA_RELEASE: a.va_ranges = any; break;
    case SA_HOST_FN_CHUNK_RELEASE: a.chunks = any; break;
    case SA_HOST_FN_EVENT_DESTROY: a.events = any; break;
    case SA_HOST_FN_UNMAP:
      a.va_ranges = 1; /* the arena has one range */
      a.mappings = a.chunks = sticky ? SIZE_MAX : 16; /* one descriptor's pieces (a stitched run) */
      break;
    default: break;
  }
  return a;
}

static bool within(size_t before, size_t after, size_t allowed) {
  return after <= before || after - before <= allowed;
}

/* Compare the simulator with its state before the run. */
static void leak_check(run *r, const sa_host_counters *before, allowance ok) {
  sa_host_counters after;
  sa_host_get_counters(&after);
  if (!within(before->va_ranges, after.va_ranges, ok.va_ranges) ||
      !within(before->chunks, after.chunks, ok.chunks) ||
      !within(before->mappings, after.mappings, ok.mappings) ||
      !within(before->events, after.events, ok.events) ||
      (ok.mappings == 0 && after.mappings != before->mappings)) {
    fprintf(stderr,
            "fault sweep [%s]: leaked: va ranges %zu -> %zu, chunks %zu -> %zu, mappings "
            "%zu -> %zu, events %zu -> %zu\n",
            r->label, before->va_ranges, after.va_ranges, before->chunks, after.chunks,
            before->mappings, after.mappings, before->events, after.events);
    r->bad++;
  }
  if (after.order_violations != before->order_violations) {
    fprintf(stderr, "fault sweep [%s]: %llu stream-order violations\n", r->label,
            (unsigned long long)(after.order_violations - before->order_violations));
    r->bad++;
  }
  if (r->mismatches != 0) {
    fprintf(stderr, "fault sweep [%s]: %llu words with the wrong contents\n", r->label,
            (unsigned long long)r->mismatches);
    r->bad++;
  }
}

/* One run of the workload with fn failing at its nth call from now (n = 0:
 * no fault); calls gets the driver calls per function the workload and
 * destroy made. A fault that fires before destroy is cleared there and the
 * same arena must serve again; one that fires in destroy (or in creation)
 * is followed by a fresh arena that must serve. */
static void one_run(sa_host_fn fn, uint64_t nth, int sticky, uint64_t calls[SA_HOST_FN_COUNT]) {
  char label[96];
  snprintf(label, sizeof label, "%s #%llu%s", nth ? sa_host_fn_name(fn) : "no fault",
           (unsigned long long)nth, sticky ? " sticky" : "");
  run *r = calloc(1, sizeof *r);
  assert_non_null(r);
  r->label = label;
  r->next_pattern = 0x10000000u;
  sa_host_counters before;
  sa_host_get_counters(&before);
  for (int i = 0; i < 2; i++)
    assert_int_equal(sa_host_stream_create(SA_HOST_MANUAL, &r->s[i]), SA_OK);
  uint64_t start[SA_HOST_FN_COUNT];
  for (int f = 0; f < SA_HOST_FN_COUNT; f++) start[f] = sa_host_call_count((sa_host_fn)f);
  uint64_t injected = sa_host_faults_injected();
  if (nth != 0) assert_int_equal(sa_host_fault_inject(fn, nth, sticky), SA_OK);

  workload(r);
  bool fired_early = sa_host_faults_injected() != injected;
  uint64_t serve_calls[SA_HOST_FN_COUNT] = {0};
  bool served = false;
  if (fired_early && r->a != NULL) {
    served = true;
    sa_host_fault_clear();
    for (int f = 0; f < SA_HOST_FN_COUNT; f++) serve_calls[f] = sa_host_call_count((sa_host_fn)f);
    free_leftovers(r);
    serve(r);
    for (int f = 0; f < SA_HOST_FN_COUNT; f++)
      serve_calls[f] = sa_host_call_count((sa_host_fn)f) - serve_calls[f];
  }
  uint64_t fired_before_destroy = sa_host_faults_injected() - injected;
  sa_status destroyed = SA_OK;
  if (r->a != NULL) {
    must(r, sa_host_drain_all(), "sa_host_drain_all");
    destroyed = sa_arena_destroy(r->a);
    allowed(r, destroyed, "sa_arena_destroy");
    r->a = NULL;
  }
  for (int f = 0; f < SA_HOST_FN_COUNT; f++)
    calls[f] = sa_host_call_count((sa_host_fn)f) - start[f] - serve_calls[f];
  uint64_t fired = sa_host_faults_injected() - injected;
  bool in_destroy = fired > fired_before_destroy;
  sa_host_counters left;
  sa_host_get_counters(&left);
  if (destroyed == SA_OK && (left.va_ranges > before.va_ranges || left.chunks > before.chunks ||
                             left.mappings > before.mappings || left.events > before.events)) {
    /* Whatever destroy could not release, it must report. */
    fprintf(stderr, "fault sweep [%s]: destroy returned ok but left driver objects behind\n",
            label);
    r->bad++;
  }
  sa_host_fault_clear();
  if (!served) { /* the arena is gone (or never was): a new one must work */
    r->a = fresh_arena(r);
    if (r->a != NULL) {
      serve(r);
      must(r, sa_arena_destroy(r->a), "sa_arena_destroy");
      r->a = NULL;
    }
  }
  leak_check(r, &before, allowed_leak(fn, sticky, in_destroy && !served));
  if (nth != 0 && fired == 0) {
    fprintf(stderr, "fault sweep [%s]: the fault never fired\n", label);
    r->bad++;
  }
  for (int i = 0; i < 2; i++) assert_int_equal(sa_host_stream_destroy(r->s[i]), SA_OK);
  runs++;
  faults_fired += fired;
  if (r->bad != 0) failures++;
  free(r);
}

static void sweep(int sticky) {
  uint64_t calls[SA_HOST_FN_COUNT], ignored[SA_HOST_FN_COUNT];
  one_run(SA_HOST_FN_COUNT, 0, 0, calls); /* the baseline: no fault */
  unsigned long before = failures;
  for (int f = 0; f < SA_HOST_FN_COUNT; f++) {
    if (!sticky) calls_total += calls[f];
    for (uint64_t k = 1; k <= calls[f]; k++) one_run((sa_host_fn)f, k, sticky, ignored);
  }
  assert_int_equal(failures, before);
}

static void every_call_fails_once(void **state) {
  (void)state;
  sweep(0);
}

static void every_call_fails_from_then_on(void **state) {
  (void)state;
  sweep(1);
}

/* The workload must reach every driver function the allocator uses, or the
 * sweep would prove nothing about it. */
static void workload_reaches_every_driver_function(void **state) {
  (void)state;
  uint64_t calls[SA_HOST_FN_COUNT];
  unsigned long before = failures;
  one_run(SA_HOST_FN_COUNT, 0, 0, calls);
  assert_int_equal(failures, before);
  for (int f = 0; f < SA_HOST_FN_COUNT; f++) {
    if (calls[f] == 0) fprintf(stderr, "workload never calls %s\n", sa_host_fn_name((sa_host_fn)f));
  }
  for (int f = 0; f < SA_HOST_FN_COUNT; f++) assert_true(calls[f] > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(workload_reaches_every_driver_function),
      cmocka_unit_test(every_call_fails_once),
      cmocka_unit_test(every_call_fails_from_then_on),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  printf("fault_sweep: driver functions %d, call sites swept %lu, runs %lu, faults injected "
         "%lu, threads 2 (one exits), streams 2 (and %d destroyed without release), failures "
         "%lu\n",
         (int)SA_HOST_FN_COUNT, calls_total, runs, faults_fired, SA_TCACHE_ENTRIES + 2,
         failures + (unsigned long)failed);
  return failed;
}
