/* libFuzzer target: bytes become a sequence of operations on a small arena
 * (a few MiB of physical memory, three hand-stepped streams plus the
 * default stream), checked against a reference model after every step:
 *   - a handout is non-NULL, 256-byte aligned, and overlaps no live block;
 *   - every block keeps its contents: a tag written by a simulated fill on
 *     the stream that uses it, verified by check kernels and direct reads;
 *   - statistics agree with the model: allocations minus frees, live bytes
 *     (class size for small blocks, requested bytes for large ones), and
 *     physical memory within the cap;
 *   - bad calls (double free, interior pointers, unknown streams, sizes 0
 *     and near SIZE_MAX) get their documented status and change nothing;
 *   - the stream-order checker finds nothing, and destroy leaves nothing
 *     behind in the simulator.
 * Any disagreement aborts, which libFuzzer reports with the input.
 *
 * Extended operations (an op byte with the top bit set) and configurations
 * (a configuration byte with the top bit set, then two more bytes):
 *   - configurations: reserve_limit, chunk_size, initial_physical,
 *     release_threshold, exact_growth, footprint_target (1, 1.2, 1.5, fast),
 *     background_growth (its jobs run at once on the asking thread,
 *     sa__grower_inline, so that a run stays deterministic), more large
 *     thresholds;
 *   - two SA_HOST_AUTO streams beside the three hand-stepped ones;
 *   - streams synchronized and destroyed without sa_stream_release (not
 *     while a live block is recorded on them: the contract's rules), and
 *     replaced by a new stream with the same handle;
 *   - a thread that allocates, frees on its own and other streams and exits
 *     with cached blocks and an open cross-stream batch, handing the rest
 *     of its blocks to the model;
 *   - driver faults (sa_host_fault_inject) armed at random points, one-shot
 *     or sticky, cleared later: while armed, calls may fail with
 *     SA_ERR_DRIVER or SA_ERR_OUT_OF_MEMORY and then change nothing;
 *   - after every step: no checker finding; sa_get_stats consistent with
 *     the simulator (reserved bytes and chunks are what the simulator holds
 *     for the arena, active + empty = total superblocks, cached and live
 *     within reserved); with nothing live (and no fault armed) an allocation
 *     up to the cap succeeds, and sa_trim(0) leaves the arena holding no
 *     physical memory at all.
 *
 * Further operations (an op byte 0xc0-0xff) and configuration bits:
 *   - configurations without a budget (no max_physical: the device's memory
 *     is the cap, set with sa_host_set_device_memory), where first
 *     superblocks are small, slabs map superblocks together and superblocks
 *     are carved in free span memory; an oom_callback that frees, trims and
 *     asks again; a trace written to /dev/null;
 *   - two persistent worker threads that run the next operations in turn
 *     (one at a time, so a run stays deterministic): frees of another
 *     thread's blocks, caches left in a thread while streams go, workers
 *     that exit later; live_bytes then agrees within the header's bound
 *     per other thread;
 *   - a stream destroyed without a drain (no live block used or recorded on
 *     it, and its queued work uses no memory allocated or freed on it: the
 *     header's rule) and left destroyed until an operation names it again,
 *     when a new stream takes a handle;
 *   - a sweep over more streams than a thread cache has entries (eviction);
 *   - bursts of every size class, sa_snapshot_write, sa_set_superblock_size
 *     with sizes it must refuse;
 *   - an arena destroyed as it is: blocks live (SA_ERR_LIVE_BLOCKS), streams
 *     not released, work queued, workers still holding caches; afterwards
 *     its pointers are SA_ERR_INVALID_POINTER and nothing is left behind;
 *   - a driver fault armed right before a thread's end or a stream's (a
 *     worker's exit, op_thread's thread, a stream destroyed drained or
 *     undrained) and left armed for what follows: the op value 0xf9;
 *   - a capture episode: one created stream is captured into a graph (mode
 *     from the input) while a few allocations, frees and uses run on any
 *     streams; each call works or is refused with SA_ERR_STREAM_CAPTURING
 *     and changes nothing (the model counts no refused call), and the
 *     capture ends intact. Work on the capturing stream goes into the graph
 *     and never runs: a block written there has no contents to check. No
 *     trim, destroy or allocation that could reach the out-of-memory path
 *     runs inside (their device-wide synchronize would invalidate it);
 *   - a graph pool's episode (op value 0xef): allocations from a pool
 *     during a capture and after it, frees (some taken back at their
 *     address, sa_pool_alloc_at), records and uses across streams, no pool
 *     block overlapping another or the model's blocks, its segments as
 *     sa_pool_segments reports them tiled and counted, then the pool
 *     released: its segments count as large allocations.
 *
 * Built with clang directly from the sources by fuzz/run.sh (Bazel here
 * builds with gcc). The first bytes choose the configuration.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "small/size_class.h"
#include "test/util.h"

#define NSTREAMS 6  /* 0: the default stream (NULL, AUTO); 1-3 MANUAL; 4-5 AUTO */
#define FIRST_AUTO 4
#define NEXTRA 64   /* AUTO streams of op_sweep: with the six, more than a cache's entries */
#define MAX_LIVE 64
#define MAX_FREED 16
#define HEAD_BYTES 1024 /* the tag covers the head and the last word */
#define NWORKERS 2
#define NTHREADS (NWORKERS + 2) /* 0: main, 1-2: the workers, 3: op_thread's thread */
#define LIVE_SLACK ((size_t)256 << 10) /* live bytes a thread may keep unpublished */

typedef struct block_s {
  void *p;
  size_t size;
  size_t accounted; /* what live_bytes counts for it */
  int use;          /* stream of its last fill; -1: no pending work anywhere */
  int alloc_stream; /* -1 once that stream was released */
  uint32_t tag;
  uint64_t recorded; /* streams named in sa_record_stream while it lives */
  bool large;        /* a span: above the threshold when allocated */
  bool blank;        /* last written on a capturing stream: that never ran */
} block;

typedef struct input_s {
  const uint8_t *data;
  size_t size, pos;
} input;

static struct {
  sa_arena *arena;
  sa_stream streams[NSTREAMS + NEXTRA];
  bool dead[NSTREAMS];  /* destroyed; a new stream takes a handle when next named */
  bool dirty[NSTREAMS]; /* since its last drain, work on memory allocated or freed on
                           it may be queued: no destroy without a drain (the rule) */
  int nextra;           /* extra streams made so far */
  bool cached[NTHREADS]; /* the thread may cache blocks, or keep live bytes unpublished */
  int exec;              /* the thread that runs the next operations */
  bool abandoned;        /* the arena was destroyed as it was: the input ends */
  input *in;             /* for the oom callback */
  size_t max_small;      /* the largest small block allocated */
  size_t max_large;      /* the largest large allocation's request */
  bool keep_spans;       /* the arena keeps spans (keep_spans=1) */
  int sweeps, snapshots; /* per input: each costs as much as a hundred operations */
  uint64_t large_allocs;
  block live[MAX_LIVE];
  int nlive;
  void *freed[MAX_FREED]; /* recently freed addresses, for double frees */
  int nfreed;
  size_t threshold, superblock, cap, chunk;
  int capturing; /* the stream of the open capture episode; 0 (never captured): none */
  bool threshold_explicit;
  uint64_t allocs, frees;
  int64_t live_bytes;
  uint32_t next_tag;
  uint64_t mismatches; /* check kernels add here */
  bool faulting;       /* a driver fault is armed: calls may fail */
  bool in_thread;      /* op_thread's thread runs: the main thread's cache may pin memory */
  size_t release_threshold;
  sa_host_counters base; /* the simulator before the arena */
} m;

/* Totals over the whole run, printed at exit. */
static uint64_t t_inputs, t_ops, t_allocs, t_frees, t_bad, t_oom, t_checks, t_faults, t_failed,
    t_destroys, t_threads, t_empty_trims, t_unbudgeted, t_worker_ops, t_undrained, t_sweeps,
    t_callbacks, t_snapshots, t_abandoned, t_captures, t_refused, t_faults_at_ends, t_pools,
    t_background;

static void report(void) {
  printf("fuzz: inputs %llu, operations %llu (allocs %llu, frees %llu, bad inputs %llu, out of "
         "memory %llu, content checks %llu, faults armed %llu, calls failed %llu, streams "
         "destroyed %llu, exiting threads %llu, empty trims %llu, inputs without a budget %llu, "
         "operations on workers %llu, destroyed undrained %llu, sweeps %llu, oom callbacks "
         "%llu, snapshots %llu, arenas abandoned %llu, captures %llu, calls refused while "
         "capturing %llu, faults at thread or stream ends %llu, pool episodes %llu, background "
         "growths %llu), threads %d, "
         "streams %d, "
         "failures 0\n",
         (unsigned long long)t_inputs, (unsigned long long)t_ops, (unsigned long long)t_allocs,
         (unsigned long long)t_frees, (unsigned long long)t_bad, (unsigned long long)t_oom,
         (unsigned long long)t_checks, (unsigned long long)t_faults, (unsigned long long)t_failed,
         (unsigned long long)t_destroys, (unsigned long long)t_threads,
         (unsigned long long)t_empty_trims, (unsigned long long)t_unbudgeted,
         (unsigned long long)t_worker_ops, (unsigned long long)t_undrained,
         (unsigned long long)t_sweeps, (unsigned long long)t_callbacks,
         (unsigned long long)t_snapshots, (unsigned long long)t_abandoned,
         (unsigned long long)t_captures, (unsigned long long)t_refused,
         (unsigned long long)t_faults_at_ends, (unsigned long long)t_pools,
         (unsigned long long)t_background, NTHREADS,
         NSTREAMS + NEXTRA);
  fflush(stdout);
}

/* The thread running this code: 0 main, 1..NWORKERS a worker, NWORKERS + 1
 * op_thread's. */
static _Thread_local int self;

/* Another thread may cache blocks (pinning memory this thread's reclaim
 * cannot reach) or keep live bytes unpublished. */
static int others_cached(void) {
  int n = 0;
  for (int k = 0; k < NTHREADS; k++) n += k != self && m.cached[k];
  return n;
}

__attribute__((noreturn, format(printf, 1, 2))) static void die(const char *fmt, ...);

#include <stdarg.h>
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "arena_fuzz: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  abort();
}

static void expect(sa_status got, sa_status want, const char *what) {
  if (got != want)
    die("%s returned %s, expected %s", what, sa_status_string(got), sa_status_string(want));
}

/* ARENA_FUZZ_TRACE=1: print each operation (to replay a crash by hand). */
static int tracing = -1;
#define TRACE(...)                                                       \
  do {                                                                   \
    if (tracing) fprintf(stderr, "arena_fuzz: " __VA_ARGS__);            \
  } while (0)

static uint8_t u8(input *in) { return in->pos < in->size ? in->data[in->pos++] : 0; }
static uint16_t u16(input *in) { return (uint16_t)(u8(in) | (uint16_t)u8(in) << 8); }
static bool more(const input *in) { return in->pos < in->size; }

/* ---- model helpers ------------------------------------------------------ */

static size_t accounted(size_t size) {
  return size > m.threshold ? size : sa_class_size(sa_size_class(size));
}

static size_t head_bytes(const block *b) {
  size_t h = b->size < HEAD_BYTES ? b->size : HEAD_BYTES;
  return h & ~(size_t)3;
}

static size_t last_word(const block *b) { return (b->size & ~(size_t)3) - 4; }

/* Write b's tag on stream s: head and last word. */
static void fill(block *b, int s) {
  size_t h = head_bytes(b);
  if (h == 0) return;
  if (m.capturing != 0 && s == m.capturing) {
    /* Into the graph, never run; but work queued on s before the capture
     * (on a block that had this memory) still orders other streams' use. */
    b->blank = true;
    b->use = s;
    return;
  }
  b->blank = false;
  expect(sa_host_fill(m.streams[s], b->p, h, b->tag), SA_OK, "sa_host_fill");
  expect(sa_host_fill(m.streams[s], (char *)b->p + last_word(b), 4, b->tag), SA_OK,
         "sa_host_fill");
  b->use = s;
  if (s < NSTREAMS && b->alloc_stream == s) m.dirty[s] = true;
}

static void check_kernel(block *b) {
  size_t h = head_bytes(b);
  if (h == 0 || b->use < 0 || b->blank) return;
  expect(sa_host_check(m.streams[b->use], b->p, h, b->tag, &m.mismatches), SA_OK,
         "sa_host_check");
  if (b->use < NSTREAMS && b->alloc_stream == b->use) m.dirty[b->use] = true;
  t_checks++;
}

/* Direct read: the block's stream must be drained first. */
static void read_back(const block *b) {
  if (head_bytes(b) == 0 || b->blank) return;
  uint32_t first, last;
  memcpy(&first, b->p, 4);
  memcpy(&last, (const char *)b->p + last_word(b), 4);
  if (first != b->tag || last != b->tag)
    die("block %p (%zu bytes) reads %08x..%08x, its tag is %08x", b->p, b->size, first, last,
        b->tag);
  t_checks++;
}

static void check_overlap(void *p, size_t size) {
  uintptr_t a = (uintptr_t)p, e = a + size;
  for (int i = 0; i < m.nlive; i++) {
    uintptr_t b = (uintptr_t)m.live[i].p, f = b + m.live[i].size;
    if (a < f && b < e)
      die("new block [%p, +%zu) overlaps live block [%p, +%zu)", p, size, m.live[i].p,
          m.live[i].size);
  }
}

/* A library call that may fail only while a driver fault is armed, and then
 * only with a driver error or out of memory (and changes nothing). */
static bool ok_or_fault(sa_status st, const char *what) {
  if (st == SA_OK) return true;
  if (st == SA_ERR_STREAM_CAPTURING && m.capturing != 0) { /* a capture episode's refusal */
    TRACE("%s refused: stream %d is capturing\n", what, m.capturing);
    t_refused++;
    return false;
  }
  if (m.faulting && (st == SA_ERR_DRIVER || st == SA_ERR_OUT_OF_MEMORY)) {
    t_failed++;
    return false;
  }
  die("%s returned %s%s", what, sa_status_string(st), m.faulting ? " (a fault armed)" : "");
}

static void check_stats(void) {
  sa_stats st;
  expect(sa_get_stats(m.arena, &st), SA_OK, "sa_get_stats");
  if (st.alloc_count != m.allocs || st.free_count != m.frees)
    die("stats count %llu allocs, %llu frees; model %llu, %llu",
        (unsigned long long)st.alloc_count, (unsigned long long)st.free_count,
        (unsigned long long)m.allocs, (unsigned long long)m.frees);
  /* Exact for this thread; within the slack plus a block per other thread
   * that may hold some unpublished (the header's bound). */
  size_t unpublished = m.keep_spans && m.max_large > m.max_small ? m.max_large : m.max_small;
  int64_t slack = (int64_t)((LIVE_SLACK + unpublished) * (size_t)others_cached());
  int64_t off = (int64_t)st.live_bytes - m.live_bytes;
  if (off > slack || -off > slack)
    die("stats live_bytes %zu, model %lld (slack %lld)", st.live_bytes, (long long)m.live_bytes,
        (long long)slack);
  if (m.live_bytes + (int64_t)st.cached_bytes > (int64_t)st.reserved_bytes)
    die("%lld bytes live and %zu cached but only %zu reserved", (long long)m.live_bytes,
        st.cached_bytes, st.reserved_bytes);
  if (st.va_used_bytes > st.va_reserved_bytes)
    die("va used %zu of %zu", st.va_used_bytes, st.va_reserved_bytes);
  if (st.large_allocs != m.large_allocs || st.fast_allocs > st.alloc_count ||
      st.fast_frees > st.free_count)
    die("stats count %llu large allocs (model %llu), fast %llu/%llu of %llu/%llu",
        (unsigned long long)st.large_allocs, (unsigned long long)m.large_allocs,
        (unsigned long long)st.fast_allocs, (unsigned long long)st.fast_frees,
        (unsigned long long)st.alloc_count, (unsigned long long)st.free_count);
  if (st.reserved_bytes > m.cap || st.reserved_bytes_peak > m.cap)
    die("reserved %zu (peak %zu) above the cap %zu", st.reserved_bytes, st.reserved_bytes_peak,
        m.cap);
  if (st.live_bytes > st.reserved_bytes)
    die("live %zu bytes but only %zu reserved", st.live_bytes, st.reserved_bytes);
  size_t large = 0;
  for (int i = 0; i < m.nlive; i++) large += m.live[i].large;
  if (st.large_spans != large) die("%zu large spans, %zu live in the model", st.large_spans, large);
  if (st.reserved_bytes_peak < st.reserved_bytes || st.live_bytes_peak < st.live_bytes)
    die("peaks below the current values: reserved %zu/%zu, live %zu/%zu", st.reserved_bytes,
        st.reserved_bytes_peak, st.live_bytes, st.live_bytes_peak);
  if (st.cached_bytes > st.reserved_bytes)
    die("cached %zu bytes but only %zu reserved", st.cached_bytes, st.reserved_bytes);
  if (st.superblocks_active + st.superblocks_empty != st.superblocks_total)
    die("superblocks: %zu active + %zu empty != %zu", st.superblocks_active,
        st.superblocks_empty, st.superblocks_total);
  sa_host_counters c;
  sa_host_get_counters(&c);
  if (c.order_violations != m.base.order_violations)
    die("the stream-order checker found %llu violations",
        (unsigned long long)(c.order_violations - m.base.order_violations));
  size_t chunks = c.chunks - m.base.chunks, bytes = c.chunk_bytes - m.base.chunk_bytes;
  if (st.reserved_bytes != bytes || st.chunks_total != chunks)
    die("stats: %zu bytes reserved in %zu chunks; the simulator holds %zu bytes in %zu chunks "
        "for the arena",
        st.reserved_bytes, st.chunks_total, bytes, chunks);
}

static sa_host_mode mode_of(int s) { return s >= FIRST_AUTO ? SA_HOST_AUTO : SA_HOST_MANUAL; }

/* A stream destroyed without a drain stays so until named: then a new one
 * takes its place (and a handle the simulator hands out again). */
static int alive(int s) {
  if (s < NSTREAMS && m.dead[s]) {
    expect(sa_host_stream_create(mode_of(s), &m.streams[s]), SA_OK, "sa_host_stream_create");
    m.dead[s] = false;
  }
  return s;
}

static int pick_stream(input *in) { return alive(u8(in) % NSTREAMS); }
static int pick_created(input *in) { return alive(1 + u8(in) % (NSTREAMS - 1)); }

static void drained(int s) {
  if (s < NSTREAMS) m.dirty[s] = false;
}

static void drain_all(void) {
  expect(sa_host_drain_all(), SA_OK, "sa_host_drain_all");
  memset(m.dirty, 0, sizeof m.dirty);
}

/* ---- operations ---------------------------------------------------------- */

static size_t decode_size(input *in) {
  uint8_t kind = u8(in);
  uint16_t v = u16(in);
  switch (kind % 8) {
    case 0: return 1 + v % 2048;
    case 1: return 1 + (size_t)v * 4;                     /* up to 256 KiB */
    case 2: return 1 + ((size_t)v << 8) % (12 * MiB);      /* up to 12 MiB */
    case 3: return m.threshold + (size_t)(v % 5) - 2;     /* around the threshold */
    case 4: return sa_class_size(v % 48) + (size_t)(v >> 8) % 3 - 1; /* class edges */
    case 5: return m.cap + (size_t)(v % 3) - 1;           /* around the cap */
    case 6: return v % 2 ? 0 : SIZE_MAX - (size_t)(v >> 1); /* zero, near SIZE_MAX */
    default: return 256 * (size_t)(1 + v % 64);
  }
}

static int find_live(void *p) {
  for (int i = 0; i < m.nlive; i++)
    if (m.live[i].p == p) return i;
  return -1;
}

static void op_clear(void);

/* Allocate size bytes on stream s; the new block (written on s) or NULL. */
static block *alloc_on(int s, size_t size) {
  bool empty = m.nlive == 0 && !m.faulting && !m.in_thread && others_cached() == 0;
  void *p = (void *)1;
  sa_status st = sa_alloc(m.arena, &p, size, m.streams[s]);
  m.cached[self] = true;
  TRACE("alloc %zu on %d -> %s %p\n", size, s, sa_status_string(st), p);
  if (size == 0) {
    expect(st, SA_OK, "sa_alloc(0)");
    if (p != NULL) die("sa_alloc(0) gave %p", p);
    t_bad++;
    return NULL;
  }
  if (st != SA_OK && p != NULL) die("failed sa_alloc (%s) left %p", sa_status_string(st), p);
  if (st == SA_ERR_OUT_OF_MEMORY) {
    if (m.capturing != 0 && size <= m.cap)
      die("sa_alloc of %zu bytes on %d ran out of memory in a capture episode", size, s);
    /* With nothing live, everything can be reclaimed: a request the cap
     * holds must succeed. */
    if (empty && size <= m.cap)
      die("sa_alloc of %zu bytes on %d with nothing live: out of memory (cap %zu)", size, s,
          m.cap);
    t_oom++;
    return NULL;
  }
  if (size > m.cap) die("sa_alloc of %zu bytes above the cap %zu returned %s", size, m.cap,
                        sa_status_string(st));
  if (!ok_or_fault(st, "sa_alloc")) return NULL;
  if (p == NULL || (uintptr_t)p % SA_ALIGNMENT != 0) die("sa_alloc gave %p", p);
  check_overlap(p, size);
  m.allocs++;
  t_allocs++;
  bool large = size > m.threshold;
  if (large) m.large_allocs++;
  if (!large && accounted(size) > m.max_small) m.max_small = accounted(size);
  if (large && accounted(size) > m.max_large) m.max_large = accounted(size);
  m.live_bytes += (int64_t)accounted(size);
  for (int i = 0; i < m.nfreed; i++)
    if (m.freed[i] == p) m.freed[i] = m.freed[--m.nfreed]; /* no longer a double free */
  if (m.nlive == MAX_LIVE) { /* the model is full: give it back at once */
    if (!ok_or_fault(sa_free(p, m.streams[s]), "sa_free")) {
      op_clear(); /* it must go: the same free without the fault */
      expect(sa_free(p, m.streams[s]), SA_OK, "sa_free");
    }
    if (s < NSTREAMS) m.dirty[s] = true;
    m.frees++;
    t_frees++;
    m.live_bytes -= (int64_t)accounted(size);
    return NULL;
  }
  block *b = &m.live[m.nlive++];
  *b = (block){p, size, accounted(size), -1, s, m.next_tag++, 0, large, false};
  fill(b, s);
  return b;
}

static void op_alloc(input *in) {
  int s = pick_stream(in);
  size_t size = decode_size(in);
  (void)alloc_on(s, size);
}

/* Free live block i on stream t: the contract wants every stream that used
 * it ordered before the free or recorded. Whether it was freed. */
static bool free_block(int i, int t) {
  block *b = &m.live[i];
  TRACE("free %p (alloc on %d, used on %d) on %d\n", b->p, b->alloc_stream, b->use, t);
  check_kernel(b);
  if (b->use >= 0 && b->use != t) {
    /* Small blocks ignore a record of their own stream (it orders itself);
     * everything else is kept until the free. */
    if (!ok_or_fault(sa_record_stream(b->p, m.streams[b->use]), "sa_record_stream")) return false;
    if (b->use < 64) b->recorded |= (uint64_t)1 << b->use;
  }
  if (!ok_or_fault(sa_free(b->p, m.streams[t]), "sa_free")) return false;
  m.cached[self] = true;
  if (t < NSTREAMS) m.dirty[t] = true;
  m.frees++;
  t_frees++;
  m.live_bytes -= (int64_t)b->accounted;
  if (m.nfreed < MAX_FREED) m.freed[m.nfreed++] = b->p;
  *b = m.live[--m.nlive];
  return true;
}

static void op_free(input *in) {
  if (m.nlive == 0) return;
  int i = u8(in) % m.nlive;
  int t = pick_stream(in);
  (void)free_block(i, t);
}

/* Use a block on another stream: that stream is ordered after the block's
 * last use (here by draining it), declared with sa_record_stream, and
 * writes a new tag. */
static void op_use(input *in) {
  if (m.nlive == 0) return;
  block *b = &m.live[u8(in) % m.nlive];
  int u = pick_stream(in);
  TRACE("use %p (used on %d) on %d\n", b->p, b->use, u);
  if (b->use >= 0) {
    check_kernel(b);
    expect(sa_host_stream_drain(m.streams[b->use]), SA_OK, "sa_host_stream_drain");
    drained(b->use);
  }
  if (!ok_or_fault(sa_record_stream(b->p, m.streams[u]), "sa_record_stream")) return;
  b->recorded |= (uint64_t)1 << u;
  b->tag = m.next_tag++;
  fill(b, u);
}

static void op_step(input *in) {
  int s = pick_stream(in);
  expect(sa_host_stream_step(m.streams[s], 1 + u8(in) % 16, NULL), SA_OK,
         "sa_host_stream_step");
}

static void op_verify(void) {
  drain_all();
  for (int i = 0; i < m.nlive; i++) read_back(&m.live[i]);
  if (m.mismatches != 0) die("%llu words had the wrong contents", (unsigned long long)m.mismatches);
  check_stats();
}

/* sa_trim(0): with nothing live (and no fault armed) the arena holds no
 * physical memory afterwards. */
static void empty_trim(void) {
  TRACE("trim 0 (%d live)\n", m.nlive);
  if (!ok_or_fault(sa_trim(m.arena, 0), "sa_trim")) return;
  if (!m.faulting) m.cached[self] = false; /* a trim flushes the caller's cache */
  check_stats();
  if (m.nlive != 0 || m.faulting || others_cached() != 0) return;
  t_empty_trims++;
  sa_stats st;
  expect(sa_get_stats(m.arena, &st), SA_OK, "sa_get_stats");
  sa_host_counters c;
  sa_host_get_counters(&c);
  if (st.reserved_bytes != 0 || st.chunks_total != 0 || st.superblocks_total != 0 ||
      st.cached_bytes != 0 || st.large_spans != 0 || st.deferred_frees != 0 ||
      c.chunks != m.base.chunks || c.mappings != m.base.mappings)
    die("sa_trim(0) with nothing live left %zu bytes reserved, %zu chunks, %zu superblocks "
        "(%zu active), %zu cached, %zu spans, %zu deferred frees; simulator chunks %zu -> %zu, "
        "mappings %zu -> %zu",
        st.reserved_bytes, st.chunks_total, st.superblocks_total, st.superblocks_active,
        st.cached_bytes, st.large_spans, st.deferred_frees, m.base.chunks, c.chunks,
        m.base.mappings, c.mappings);
}

static void op_tune(input *in) {
  uint8_t k = u8(in);
  TRACE("tune %u (%u)\n", k % 3, k);
  switch (k % 3) {
    case 0:
      if (ok_or_fault(sa_trim(m.arena, (size_t)(k >> 2) * MiB), "sa_trim") && !m.faulting)
        m.cached[self] = false;
      break;
    case 1:
      if (ok_or_fault(sa_defragment(m.arena), "sa_defragment") && !m.faulting)
        m.cached[self] = false;
      break;
    default: {
      size_t bytes = (size_t)(1 + (k >> 2) % 4) * 2 * MiB;
      sa_status st = sa_set_superblock_size(m.arena, bytes);
      if (st == SA_ERR_INVALID_ARGUMENT && m.threshold_explicit &&
          sa_class_size(sa_size_class(m.threshold)) > bytes / 2) {
        t_bad++; /* the explicit threshold's class may not fit */
        break;
      }
      expect(st, SA_OK, "sa_set_superblock_size");
      m.superblock = bytes;
      if (!m.threshold_explicit) m.threshold = bytes / 2;
    }
  }
}

/* A bad call's status: want, or a driver error while a fault is armed on
 * the call that would tell (stream_validate cannot say a stream is unknown
 * when the driver fails it). */
static void expect_bad(sa_status st, sa_status want, const char *what) {
  if (st == SA_ERR_DRIVER && m.faulting) return;
  expect(st, want, what);
}

/* Bad calls: each has its status and changes nothing. */
static void op_bad(input *in) {
  uint8_t k = u8(in);
  int other;
  t_bad++;
  TRACE("bad input %u\n", k % 5);
  switch (k % 5) {
    case 0: /* a double free, unless trim gave the memory back already */
      if (m.nfreed > 0) {
        sa_status st = sa_free(m.freed[k % m.nfreed], m.streams[pick_stream(in)]);
        if (st != SA_ERR_DOUBLE_FREE && st != SA_ERR_INVALID_POINTER)
          die("double free returned %s", sa_status_string(st));
      }
      break;
    case 1: /* inside a live block, never a block start (not 256-aligned) */
      if (m.nlive > 0) {
        block *b = &m.live[k % m.nlive];
        char *inside = (char *)b->p + 8 + (b->size > 512 ? 256 : 0);
        expect(sa_free(inside, m.streams[0]), SA_ERR_INVALID_POINTER, "sa_free(interior)");
        expect(sa_record_stream(inside, m.streams[0]), SA_ERR_INVALID_POINTER,
               "sa_record_stream(interior)");
      }
      break;
    case 2: /* an unknown stream */
      if (m.nlive > 0) {
        block *b = &m.live[k % m.nlive];
        expect_bad(sa_free(b->p, (sa_stream)&other), SA_ERR_UNKNOWN_STREAM,
                   "sa_free(bad stream)");
      }
      {
        void *p = (void *)1;
        expect_bad(sa_alloc(m.arena, &p, 64, (sa_stream)&other), SA_ERR_UNKNOWN_STREAM,
                   "sa_alloc(bad stream)");
        if (p != NULL) die("failed sa_alloc left %p", p);
      }
      break;
    case 3: /* a foreign pointer */
      expect(sa_free(&other, m.streams[0]), SA_ERR_INVALID_POINTER, "sa_free(foreign)");
      break;
    default: { /* an impossible size */
      void *p = (void *)1;
      expect(sa_alloc(m.arena, &p, SIZE_MAX - k, m.streams[pick_stream(in)]),
             SA_ERR_OUT_OF_MEMORY, "sa_alloc(near SIZE_MAX)");
      if (p != NULL) die("failed sa_alloc left %p", p);
    }
  }
}

static bool recorded_on(int s) {
  for (int i = 0; i < m.nlive; i++)
    if (m.live[i].recorded & ((uint64_t)1 << s)) return true;
  return false;
}

static bool used_on(int s) {
  for (int i = 0; i < m.nlive; i++)
    if (m.live[i].use == s) return true;
  return false;
}

/* Stream s is synchronized and destroyed (the contract's rule: CUDA gives
 * its handle to the next stream at once, and a thread's cache knows a
 * stream by its handle); a new one takes its place and its handle. */
static void replace_stream(int s) {
  expect(sa_host_stream_drain(m.streams[s]), SA_OK, "sa_host_stream_drain");
  drained(s);
  expect(sa_host_stream_destroy(m.streams[s]), SA_OK, "sa_host_stream_destroy");
  expect(sa_host_stream_create(mode_of(s), &m.streams[s]), SA_OK, "sa_host_stream_create");
  t_destroys++;
  for (int i = 0; i < m.nlive; i++) {
    if (m.live[i].use == s) m.live[i].use = -1; /* its work ran before destroy */
    if (m.live[i].alloc_stream == s) m.live[i].alloc_stream = -1;
    m.live[i].recorded &= ~((uint64_t)1 << s);
  }
}

/* Release one of the created streams with blocks outstanding, destroy it
 * and make a new one in its place. */
static void op_release(input *in) {
  int s = pick_created(in);
  TRACE("release stream %d\n", s);
  for (int i = 0; i < m.nlive; i++) check_kernel(&m.live[i]);
  if (!ok_or_fault(sa_stream_release(m.arena, m.streams[s]), "sa_stream_release")) {
    /* Not released: it may be destroyed only if no live block names it. */
    if (recorded_on(s)) return;
  } else {
    for (int i = 0; i < m.nlive; i++) m.live[i].recorded &= ~((uint64_t)1 << s);
  }
  replace_stream(s);
  /* Blocks whose last use was on another stream still have it pending. */
}

/* Destroy a stream without sa_stream_release, unless a live block was
 * recorded on it (the contract's one rule): what the arena and this
 * thread's cache hold for it comes back later. */
static void op_destroy(input *in) {
  int s = pick_created(in);
  TRACE("destroy stream %d%s\n", s, recorded_on(s) ? " (recorded: skipped)" : "");
  if (recorded_on(s)) return;
  for (int i = 0; i < m.nlive; i++)
    if (m.live[i].use == s) check_kernel(&m.live[i]);
  replace_stream(s);
}

/* A thread that allocates on one stream, frees some blocks there (its
 * cache keeps them), some on another stream (its open batch), and exits:
 * what it held goes back without a driver call. The blocks it keeps stay
 * live in the model. The main thread waits for it: no race on the model. */
typedef struct thread_job_s {
  int s, t, n;
  size_t sizes[8];
  uint8_t what[8]; /* 0: keep, 1: free on s, 2: free on t */
} thread_job;

static void *thread_main(void *arg) {
  thread_job *j = arg;
  void *got[8];
  self = NWORKERS + 1;
  for (int k = 0; k < j->n; k++) {
    block *b = alloc_on(j->s, j->sizes[k]);
    got[k] = b != NULL ? b->p : NULL;
  }
  for (int k = 0; k < j->n; k++) {
    if (got[k] == NULL || j->what[k] == 0) continue;
    int i = find_live(got[k]);
    if (i >= 0) (void)free_block(i, j->what[k] == 1 ? j->s : j->t);
  }
  return NULL;
}

static void op_thread(input *in) {
  thread_job j;
  j.s = pick_stream(in);
  j.t = pick_stream(in);
  j.n = 1 + u8(in) % 8;
  for (int k = 0; k < j.n; k++) {
    j.sizes[k] = decode_size(in);
    j.what[k] = u8(in) % 3;
  }
  TRACE("thread: %d blocks on %d, some freed on %d\n", j.n, j.s, j.t);
  pthread_t th;
  m.in_thread = true;
  if (pthread_create(&th, NULL, thread_main, &j) != 0) die("pthread_create failed");
  if (pthread_join(th, NULL) != 0) die("pthread_join failed");
  m.in_thread = false;
  m.cached[NWORKERS + 1] = false; /* its exit gave everything back */
  t_threads++;
}

static void op_fault(input *in) {
  sa_host_fn fn = (sa_host_fn)(u8(in) % SA_HOST_FN_COUNT);
  uint64_t nth = 1 + u8(in) % 16;
  int sticky = u8(in) & 1;
  TRACE("fault %s #%llu%s\n", sa_host_fn_name(fn), (unsigned long long)nth,
        sticky ? " sticky" : "");
  expect(sa_host_fault_inject(fn, nth, sticky), SA_OK, "sa_host_fault_inject");
  m.faulting = true;
  t_faults++;
}

static void op_clear(void) {
  TRACE("fault clear\n");
  sa_host_fault_clear();
  m.faulting = false;
}

/* ---- further operations -------------------------------------------------- */

/* Destroy a stream without a drain: allowed when no live block was last
 * used or is recorded on it and its queued work uses no memory allocated
 * or freed on it (the header's rule), so that work (recorded blocks of
 * other streams, events, waits) touches nothing the arena may hand out by
 * its handle. It stays destroyed until an operation names it. */
static void op_undrained(input *in) {
  int s = pick_created(in);
  bool allowed = !m.dirty[s] && !recorded_on(s) && !used_on(s);
  TRACE("destroy stream %d undrained%s\n", s, allowed ? "" : " (skipped)");
  if (!allowed) return;
  expect(sa_host_stream_destroy(m.streams[s]), SA_OK, "sa_host_stream_destroy");
  m.dead[s] = true;
  t_undrained++;
  for (int i = 0; i < m.nlive; i++)
    if (m.live[i].alloc_stream == s) m.live[i].alloc_stream = -1;
}

/* Allocate and free on more streams than a thread cache has entries: the
 * least recently used ones are evicted with blocks cached. */
static void op_sweep(input *in) {
  int n = NEXTRA - 8 + u8(in) % 9;
  size_t size = decode_size(in);
  TRACE("sweep %zu bytes over %d streams%s\n", size, n, m.sweeps > 0 ? " (skipped)" : "");
  if (m.sweeps++ > 0) return;
  t_sweeps++;
  for (; m.nextra < n; m.nextra++)
    expect(sa_host_stream_create(SA_HOST_AUTO, &m.streams[NSTREAMS + m.nextra]), SA_OK,
           "sa_host_stream_create");
  for (int k = 0; k < n; k++) {
    block *b = alloc_on(NSTREAMS + k, size);
    if (b != NULL) (void)free_block((int)(b - m.live), NSTREAMS + k);
  }
}

/* Consecutive size classes on one stream (a superblock each, small first
 * ones in slabs without a budget), freed or kept. */
static void op_burst(input *in) {
  int s = pick_stream(in);
  unsigned c0 = u8(in);
  int n = 1 + u8(in) % 64;
  uint8_t how = u8(in);
  TRACE("burst of %d classes from %u on %d (%u)\n", n, c0 % 80, s, how);
  void *got[64];
  int ng = 0;
  for (int k = 0; k < n; k++) {
    block *b = alloc_on(s, sa_class_size((c0 + (unsigned)k) % 80)); /* up to 1 MiB */
    if (b != NULL) got[ng++] = b->p;
  }
  if (!(how & 1)) return;
  for (int k = 0; k < ng; k++) {
    int i = find_live(got[k]);
    if (i >= 0) (void)free_block(i, how & 2 ? s : pick_stream(in));
  }
}

/* The snapshot is written in full, and its summary counts the model's live
 * bytes (it walks the blocks, so it lags no thread). */
static void op_snapshot(void) {
  if (m.snapshots++ >= 2) return;
#if defined(__SANITIZE_THREAD__)
  /* It holds every stream arena's lock at once (report.c's world lock),
   * and ThreadSanitizer stops a thread that holds more than 64: after a
   * sweep there are more stream arenas than that (the header's limit;
   * fuzz/run.sh's build has no ThreadSanitizer, CI's corpus replay does). */
  if (m.sweeps > 0) return;
#endif
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (f == NULL) die("open_memstream failed");
  sa_status st = sa_snapshot_write(m.arena, f);
  fclose(f);
  expect(st, SA_OK, "sa_snapshot_write");
  t_snapshots++;
  const char *live = strstr(buf, "\"summary\": {");
  live = live != NULL ? strstr(live, "\"live\": ") : NULL;
  if (len < 4 || buf[0] != '{' || strcmp(buf + len - 2, "}\n") != 0 || live == NULL)
    die("snapshot of %zu bytes is not whole: %.80s", len, buf);
  unsigned long long n = strtoull(live + 8, NULL, 10);
  if ((int64_t)n != m.live_bytes)
    die("snapshot summary: %llu bytes live, model %lld", n, (long long)m.live_bytes);
  free(buf);
}

/* Superblock sizes sa_set_superblock_size must refuse, changing nothing. */
static void op_bad_tune(input *in) {
  uint8_t k = u8(in);
  size_t g = 2 * MiB; /* the simulator's granularity */
  const size_t bad[] = {0, MiB, 3 * MiB, (m.cap / g + 1) * g, (size_t)1 << 31,
                        SIZE_MAX & ~(g - 1)};
  size_t bytes = bad[k % (sizeof bad / sizeof bad[0])];
  TRACE("bad superblock size %zu\n", bytes);
  expect(sa_set_superblock_size(m.arena, bytes), SA_ERR_INVALID_ARGUMENT,
         "sa_set_superblock_size(bad)");
  t_bad++;
}

/* The oom_callback: it may free a live block on a stream the input names
 * (one new to this thread, say), trim or defragment, and ask again. */
static int on_oom(sa_arena *a, size_t size, sa_stream s, void *user) {
  (void)s;
  (void)user;
  if (a != m.arena) die("oom callback for arena %p, not %p", (void *)a, (void *)m.arena);
  uint8_t k = u8(m.in);
  TRACE("oom callback for %zu bytes (%u)\n", size, k);
  t_callbacks++;
  if ((k & 1) && m.nlive > 0) (void)free_block(u8(m.in) % m.nlive, pick_stream(m.in));
  if (k & 2) {
    if (ok_or_fault(sa_trim(a, 0), "sa_trim") && !m.faulting) m.cached[self] = false;
  } else if (k & 4) {
    if (ok_or_fault(sa_defragment(a), "sa_defragment") && !m.faulting) m.cached[self] = false;
  }
  return (k >> 3) & 1;
}

/* Destroy the arena as it is: blocks live, streams unreleased, work queued,
 * workers holding caches (they exit after it). Its pointers are then
 * foreign; teardown checks that nothing was left behind. */
static void op_abandon(input *in) {
  uint8_t k = u8(in);
  TRACE("abandon the arena (%d live, %s)\n", m.nlive, k & 1 ? "freed first" : "kept");
  op_clear();
  while ((k & 1) && m.nlive > 0) {
    const block *b = &m.live[m.nlive - 1];
    if (!free_block(m.nlive - 1, b->use >= 0 ? b->use : 0)) die("sa_free failed");
  }
  expect(sa_arena_destroy(m.arena), m.nlive > 0 ? SA_ERR_LIVE_BLOCKS : SA_OK,
         "sa_arena_destroy(abandoned)");
  m.arena = NULL;
  for (int i = 0; i < m.nlive; i++) {
    expect(sa_free(m.live[i].p, m.streams[0]), SA_ERR_INVALID_POINTER,
           "sa_free after its arena's destroy");
    expect(sa_record_stream(m.live[i].p, m.streams[0]), SA_ERR_INVALID_POINTER,
           "sa_record_stream after its arena's destroy");
  }
  m.abandoned = true;
  t_abandoned++;
}

/* ---- capture episodes ------------------------------------------------------ */

/* Whether sa_alloc(size) inside an episode cannot reach the out-of-memory
 * path, whose device-wide synchronize CUDA fails during any capture (and
 * invalidates it): a size of 0, one above the cap (refused before any
 * reclaim), or a small one with room to spare, physical and virtual, for
 * a superblock, a slab or a span's growth. Not with a fault armed: a
 * failed chunk looks like a device out of memory. */
static bool safe_in_capture(size_t size) {
  if (size == 0 || size > m.cap) return true;
  if (m.faulting || m.nlive == MAX_LIVE || size > 64 * KiB) return false;
  size_t unit = m.superblock > m.chunk ? m.superblock : m.chunk;
  size_t room = 4 * (unit > 2 * MiB ? unit : 2 * MiB);
  sa_stats st;
  expect(sa_get_stats(m.arena, &st), SA_OK, "sa_get_stats");
  return st.reserved_bytes + room <= m.cap && st.va_used_bytes + 2 * room <= st.va_reserved_bytes;
}

/* Stream c captured into a graph (the mode from the input) while a few
 * allocations, frees and uses run on any streams: each call works or is
 * refused (ok_or_fault), a refusal changes nothing the model sees, and the
 * capture ends intact. */
static void op_capture(input *in) {
  int c = pick_created(in);
  sa_host_capture_mode mode = (sa_host_capture_mode)(u8(in) % 3);
  int n = 1 + u8(in) % 8;
  TRACE("capture %d (mode %d): %d operations\n", c, (int)mode, n);
  expect(sa_host_stream_begin_capture(m.streams[c], mode), SA_OK,
         "sa_host_stream_begin_capture");
  m.capturing = c;
  t_captures++;
  for (int k = 0; k < n; k++) {
    uint8_t what = u8(in);
    sa_stats before, after;
    expect(sa_get_stats(m.arena, &before), SA_OK, "sa_get_stats");
    uint64_t refused = t_refused;
    switch (what % 3) {
      case 0: {
        int s = pick_stream(in);
        size_t size = decode_size(in);
        if (safe_in_capture(size)) (void)alloc_on(s, size);
        break;
      }
      case 1: op_free(in); break;
      default: op_use(in); break;
    }
    check_stats();
    expect(sa_get_stats(m.arena, &after), SA_OK, "sa_get_stats");
    /* Refused, it took a stream arena for the stream it names at most (a
     * free binds its stream before it finds the block recorded). */
    if (t_refused != refused && after.streams > before.streams + 1)
      die("a call refused in a capture took stream arenas: %zu -> %zu", before.streams,
          after.streams);
  }
  m.capturing = 0;
  expect(sa_host_stream_end_capture(m.streams[c]), SA_OK, "sa_host_stream_end_capture");
}

/* A graph pool's episode, whole within one operation: a pool, a capture
 * of stream c (the mode from the input) that allocates from it, frees
 * (reused later in the capture, by c only) and allocates from the arena,
 * then use of the pool outside the capture on any streams (fill and
 * check, frees across streams), every live pool block apart from the
 * others and from the model's blocks, then every block freed and the
 * pool released on a stream: its segments back in the arena, counted as
 * large allocations and frees in the model. Not with a fault armed (a
 * refused growth in a capture is pool_test's). */
#define POOL_BLOCKS 16

/* sa_pool_segments' view: blocks tile each segment, and the totals are
 * sa_pool_get_stats'. */
typedef struct pool_seen_s {
  size_t segments, bytes, live, free_bytes;
} pool_seen;

static void note_pool_segment(void *base, size_t size, const sa_pool_block_info *blocks,
                              size_t n, void *user) {
  pool_seen *w = user;
  w->segments++;
  w->bytes += size;
  uintptr_t at = (uintptr_t)base;
  for (size_t i = 0; i < n; i++) {
    if ((uintptr_t)blocks[i].p != at || blocks[i].size == 0 || blocks[i].size % 512 != 0)
      die("pool segment %p: block %zu at %p+%zu, expected at %p", base, i, blocks[i].p,
          blocks[i].size, (void *)at);
    at += blocks[i].size;
    if (blocks[i].state == SA_POOL_BLOCK_LIVE) w->live++;
    if (blocks[i].state == SA_POOL_BLOCK_FREE) w->free_bytes += blocks[i].size;
  }
  if (at != (uintptr_t)base + size) die("pool segment %p+%zu: blocks end at %p", base, size, (void *)at);
}

static void pool_segments_check(sa_pool *pool) {
  pool_seen w = {0};
  sa_pool_stats ps;
  expect(sa_pool_segments(pool, note_pool_segment, &w), SA_OK, "sa_pool_segments");
  expect(sa_pool_get_stats(pool, &ps), SA_OK, "sa_pool_get_stats");
  if (w.segments != ps.segments || w.bytes != ps.reserved_bytes || w.live != ps.live_blocks ||
      w.free_bytes != ps.free_bytes)
    die("sa_pool_segments: %zu segments, %zu bytes, %zu live, %zu free; the stats say %zu, %zu, "
        "%zu, %zu",
        w.segments, w.bytes, w.live, w.free_bytes, ps.segments, ps.reserved_bytes,
        ps.live_blocks, ps.free_bytes);
}

static void op_pool(input *in) {
  if (m.faulting) return;
  int c = pick_created(in);
  sa_host_capture_mode mode = (sa_host_capture_mode)(u8(in) % 3);
  int n = 1 + u8(in) % 12;
  TRACE("pool episode: capture %d (mode %d), %d operations\n", c, (int)mode, n);
  t_pools++;
  sa_pool *pool;
  expect(sa_pool_create(m.arena, &pool), SA_OK, "sa_pool_create");
  struct {
    void *p;
    size_t size;
    int stream;
  } b[POOL_BLOCKS];
  int nb = 0;
  expect(sa_host_stream_begin_capture(m.streams[c], mode), SA_OK, "sa_host_stream_begin_capture");
  for (int k = 0; k < 2 * n; k++) {
    bool capturing = k < n;
    if (k == n)
      expect(sa_host_stream_end_capture(m.streams[c]), SA_OK, "sa_host_stream_end_capture");
    int s = capturing ? c : pick_stream(in);
    uint8_t what = u8(in);
    if (what % 3 != 0 && nb < POOL_BLOCKS) {
      size_t size = 1 + (size_t)u16(in) * (what % 2 ? 1 : 32); /* up to 2 MiB */
      void *p;
      sa_status st = sa_pool_alloc(pool, &p, size, m.streams[s]);
      TRACE("pool alloc %zu on %d -> %s %p\n", size, s, sa_status_string(st), p);
      if (st == SA_ERR_OUT_OF_MEMORY) continue; /* the cap */
      expect(st, SA_OK, "sa_pool_alloc");
      if (((uintptr_t)p & 511) != 0) die("pool block %p not 512-aligned", p);
      for (int i = 0; i < nb; i++)
        if ((uintptr_t)p < (uintptr_t)b[i].p + b[i].size && (uintptr_t)b[i].p < (uintptr_t)p + size)
          die("pool block %p+%zu overlaps %p+%zu", p, size, b[i].p, b[i].size);
      for (int i = 0; i < m.nlive; i++)
        if ((uintptr_t)p < (uintptr_t)m.live[i].p + m.live[i].size &&
            (uintptr_t)m.live[i].p < (uintptr_t)p + size)
          die("pool block %p+%zu overlaps the arena's block %p+%zu", p, size, m.live[i].p,
              m.live[i].size);
      if (!capturing) { /* a graph's kernels never run here: only outside */
        uint32_t tag = ++m.next_tag;
        size_t h = size & ~(size_t)3;
        if (h > 0) {
          expect(sa_host_fill(m.streams[s], p, h, tag), SA_OK, "sa_host_fill");
          expect(sa_host_check(m.streams[s], p, h, tag, &m.mismatches), SA_OK, "sa_host_check");
          if (s < NSTREAMS) m.dirty[s] = true;
        }
      }
      b[nb].p = p;
      b[nb].size = size;
      b[nb].stream = s;
      nb++;
    } else if (nb > 0) {
      int i = u8(in) % nb;
      int t = capturing ? c : pick_stream(in);
      if (t != b[i].stream) /* its user's work on that stream is ordered before reuse */
        expect(sa_record_stream(b[i].p, m.streams[b[i].stream]), SA_OK, "sa_record_stream");
      expect(sa_free(b[i].p, m.streams[t]), SA_OK, "sa_free of a pool block");
      if (t < NSTREAMS) m.dirty[t] = true;
      if (what % 3 == 0 && what >= 0x80) {
        /* Taken back at its address (a checkpoint's restore), where it is
         * free for t: freed on t itself, unrecorded, or clean by now. */
        sa_status st = sa_pool_alloc_at(pool, b[i].p, b[i].size, m.streams[t]);
        TRACE("pool alloc_at %p+%zu on %d -> %s\n", b[i].p, b[i].size, t, sa_status_string(st));
        if (st == SA_OK) {
          b[i].stream = t;
          continue;
        }
        expect(st, SA_ERR_INVALID_ARGUMENT, "sa_pool_alloc_at");
      }
      b[i] = b[--nb];
    }
  }
  pool_segments_check(pool);
  while (nb > 0) {
    int t = pick_stream(in);
    if (t != b[nb - 1].stream)
      expect(sa_record_stream(b[nb - 1].p, m.streams[b[nb - 1].stream]), SA_OK,
             "sa_record_stream");
    expect(sa_free(b[nb - 1].p, m.streams[t]), SA_OK, "sa_free of a pool block");
    if (t < NSTREAMS) m.dirty[t] = true;
    nb--;
  }
  sa_pool_stats ps;
  expect(sa_pool_get_stats(pool, &ps), SA_OK, "sa_pool_get_stats");
  if (ps.live_blocks != 0 || ps.live_bytes != 0 || ps.free_bytes > ps.reserved_bytes)
    die("pool: %zu live blocks, %zu of %zu bytes free", ps.live_blocks, ps.free_bytes,
        ps.reserved_bytes);
  int r = pick_stream(in);
  expect(sa_pool_release(pool, m.streams[r]), SA_OK, "sa_pool_release");
  if (r < NSTREAMS) m.dirty[r] = true;
  m.allocs += ps.segments; /* each a large allocation, freed by the release */
  m.frees += ps.segments;
  m.large_allocs += ps.segments;
  expect(sa_pool_get_stats(pool, &ps), SA_OK, "sa_pool_get_stats");
  if (ps.reserved_bytes != 0 || ps.uses != 0) die("pool released with %zu bytes", ps.reserved_bytes);
}

/* ---- worker threads --------------------------------------------------------
 * Operations run on the thread m.exec names; a worker runs one while the
 * main thread waits, so the model needs no lock and a run is reproducible. */

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t th[NWORKERS];
  bool alive[NWORKERS];
  int turn; /* the worker (1..NWORKERS) to run w.op, 0: none */
  bool quit;
  uint8_t op;
  input *in;
} w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void run_op(uint8_t op, input *in);

static void *worker_main(void *arg) {
  self = (int)(intptr_t)arg;
  pthread_mutex_lock(&w.mu);
  for (;;) {
    while (w.turn != self) pthread_cond_wait(&w.cv, &w.mu);
    if (w.quit) break;
    pthread_mutex_unlock(&w.mu);
    run_op(w.op, w.in);
    pthread_mutex_lock(&w.mu);
    w.turn = 0;
    pthread_cond_broadcast(&w.cv);
  }
  w.quit = false;
  w.turn = 0;
  pthread_cond_broadcast(&w.cv);
  pthread_mutex_unlock(&w.mu);
  return NULL; /* its cache retires now, without a driver call */
}

/* Worker k runs op (or exits) while this thread waits. */
static void hand_to(int k, uint8_t op, input *in, bool quit) {
  pthread_mutex_lock(&w.mu);
  w.op = op;
  w.in = in;
  w.quit = quit;
  w.turn = k;
  pthread_cond_broadcast(&w.cv);
  while (w.turn != 0) pthread_cond_wait(&w.cv, &w.mu);
  pthread_mutex_unlock(&w.mu);
}

static void worker_exit(int k) {
  if (!w.alive[k - 1]) return;
  TRACE("worker %d exits\n", k);
  hand_to(k, 0, NULL, true);
  if (pthread_join(w.th[k - 1], NULL) != 0) die("pthread_join failed");
  w.alive[k - 1] = false;
  m.cached[k] = false;
  if (m.exec == k) m.exec = 0;
}

/* A driver fault armed just before a thread's end or a stream's, the paths
 * a review found last: a worker exits, op_thread's thread lives and exits,
 * or a stream is destroyed (drained or not), and the fault stays armed for
 * what follows (the next call that meets the stream's handle again, a reap)
 * until an operation clears it. */
static void op_fault_at_an_end(input *in) {
  op_fault(in);
  uint8_t what = u8(in);
  TRACE("fault at an end: %d\n", what % 4);
  t_faults_at_ends++;
  switch (what % 4) {
    case 0: worker_exit(1 + (what >> 2) % NWORKERS); break;
    case 1: op_thread(in); break;
    case 2: op_destroy(in); break;
    default: op_undrained(in); break;
  }
}

/* Operations that choose threads or end the arena: the main thread's. One
 * op value of the range left to op_bad_tune, 0xf9, arms a fault at an end. */
static bool control(uint8_t op, input *in) {
  if ((op & 0xc0) != 0xc0) return false;
  if ((op & 0x3f) == 57) {
    op_fault_at_an_end(in);
    return true;
  }
  switch ((op & 0x3f) % 10) {
    case 0: {
      int k = u8(in) % (NWORKERS + 1);
      TRACE("operations run on thread %d\n", k);
      if (k > 0 && !w.alive[k - 1]) {
        if (pthread_create(&w.th[k - 1], NULL, worker_main, (void *)(intptr_t)k) != 0)
          die("pthread_create failed");
        w.alive[k - 1] = true;
      }
      m.exec = k;
      return true;
    }
    case 1: worker_exit(1 + u8(in) % NWORKERS); return true;
    case 2: op_abandon(in); return true;
    default: return false;
  }
}

/* ---- one input ------------------------------------------------------------ */

/* What the simulator holds now is what it held before the arena. */
static void expect_nothing_left(const char *after) {
  sa_host_counters c;
  sa_host_get_counters(&c);
  const sa_host_counters *b = &m.base;
  if (c.va_ranges != b->va_ranges || c.chunks != b->chunks || c.mappings != b->mappings ||
      c.events != b->events || c.streams != b->streams)
    die("%s left va %zu->%zu, chunks %zu->%zu, mappings %zu->%zu, events %zu->%zu, "
        "streams %zu->%zu",
        after, b->va_ranges, c.va_ranges, b->chunks, c.chunks, b->mappings, c.mappings,
        b->events, c.events, b->streams, c.streams);
  if (c.order_violations != b->order_violations)
    die("the stream-order checker found %llu violations",
        (unsigned long long)(c.order_violations - b->order_violations));
}

/* sa_arena_create with a driver call failing (initial_physical maps
 * memory too): an error that leaves nothing behind, or an arena. */
static void create_under_fault(const sa_config *cfg, sa_host_fn fn, uint64_t nth) {
  TRACE("create with fault %s #%llu\n", sa_host_fn_name(fn), (unsigned long long)nth);
  expect(sa_host_fault_inject(fn, nth, 0), SA_OK, "sa_host_fault_inject");
  sa_arena *a = NULL;
  sa_status st = sa_arena_create(cfg, &a);
  sa_host_fault_clear();
  t_faults++;
  if (st == SA_OK) {
    expect(sa_arena_destroy(a), SA_OK, "sa_arena_destroy");
  } else {
    if (a != NULL) die("failed sa_arena_create left %p", (void *)a);
    if (st != SA_ERR_DRIVER && st != SA_ERR_OUT_OF_MEMORY)
      die("sa_arena_create under a fault returned %s", sa_status_string(st));
    t_failed++;
  }
  expect_nothing_left(st == SA_OK ? "create and destroy" : "a failed sa_arena_create");
}

static void setup(input *in) {
  uint8_t c = u8(in);
  uint8_t e1 = 0, e2 = 0;
  bool extended = c & 0x80;
  if (extended) {
    e1 = u8(in);
    e2 = u8(in);
  }
  static const char *const caps[] = {"8MiB", "16MiB", "32MiB", "64MiB"};
  static const size_t cap_bytes[] = {8 * MiB, 16 * MiB, 32 * MiB, 64 * MiB};
  /* Without a budget the device's memory is the cap: room for slabs. */
  static const size_t device_bytes[] = {16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB};
  static const char *const sbs[] = {"2MiB", "4MiB", "2MiB", "8MiB"};
  static const char *const thresholds[] = {"512KiB", "256", "1000", "1MiB"};
  bool budgeted = !(c & 0x20);
  size_t cap = budgeted ? cap_bytes[c & 3] : device_bytes[c & 3];
  expect(sa_host_set_device_memory(budgeted ? (size_t)16 << 30 : cap), SA_OK,
         "sa_host_set_device_memory");
  char spec[384];
  bool explicit_threshold = (c >> 4) & 1;
  int n = snprintf(spec, sizeof spec, "backend=host,check_stream_order=1,superblock_size=%s",
                   sbs[(c >> 2) & 3]);
  if (budgeted) n += snprintf(spec + n, sizeof spec - (size_t)n, ",max_physical=%s", caps[c & 3]);
  if (explicit_threshold)
    n += snprintf(spec + n, sizeof spec - (size_t)n, ",large_threshold=%s",
                  thresholds[extended ? e2 & 3 : 0]);
  int base_len = n;
  size_t chunk = 0;
  if (extended) {
    static const size_t chunks[] = {0, 2 * MiB, 4 * MiB, 8 * MiB};
    chunk = chunks[(e1 >> 2) & 3];
    size_t reserve[] = {0, cap / 2, cap, (size_t)64 << 30};
    size_t initial[] = {0, 2 * MiB, 3 * MiB, cap};
    size_t va[] = {0, 0, 2 * cap, cap + 8 * MiB};
    n += snprintf(spec + n, sizeof spec - (size_t)n,
                  ",reserve_limit=%zu,chunk_size=%zu,initial_physical=%zu,exact_growth=%d,"
                  "release_threshold=%zu,va_reserve=%zu",
                  reserve[e1 & 3], chunks[(e1 >> 2) & 3], initial[(e1 >> 4) & 3], (e1 >> 6) & 1,
                  (e1 >> 7) ? 4 * MiB : 0, va[(e2 >> 3) & 3]);
  }
  if (extended && (e2 & 0x20)) n += snprintf(spec + n, sizeof spec - (size_t)n, ",trace=/dev/null");
  /* keep_spans=1 is the default; the bit also maps ahead in the background
   * (each job at once on the asking thread: sa__grower_inline). */
  if (extended && (e2 & 0x04))
    n += snprintf(spec + n, sizeof spec - (size_t)n, ",keep_spans=1,background_growth=1");
  /* A larger footprint target: more mapped ahead, larger slabs (refused
   * beside a reserve_limit: then the base spec, as for any refused one);
   * fast (2) carves every superblock in free spans. */
  static const char *const targets[] = {"", ",footprint_target=1.5", ",footprint_target=fast",
                                        ",footprint_target=1.2"};
  if (extended) n += snprintf(spec + n, sizeof spec - (size_t)n, "%s", targets[e2 >> 6]);
  /* The tightest target, 1: the least floor, so that growths pass the
   * target and superblocks are carved in free spans past it. Where no
   * threshold is named, e2's low bits choose nothing else. */
  if (extended && !explicit_threshold && (e2 & 3) == 3 && (e2 >> 6) == 0)
    n += snprintf(spec + n, sizeof spec - (size_t)n, ",footprint_target=1");
  sa_config cfg;
  sa_config_init(&cfg);
  char err[256];
  expect(sa_config_parse(&cfg, spec, err, sizeof err), SA_OK, "sa_config_parse");
  sa_status checked = sa_config_check(&cfg, err, sizeof err);
  memset(&m, 0, sizeof m);
  sa_host_get_counters(&m.base);
  if (checked != SA_OK) {
    /* sa_arena_create agrees with sa_config_check; then the base spec */
    sa_arena *a = NULL;
    sa_status st = sa_arena_create(&cfg, &a);
    if (st != checked) die("sa_config_check said %s (%s), sa_arena_create %s for %s",
                           sa_status_string(checked), err, sa_status_string(st), spec);
    if (a != NULL) die("failed sa_arena_create left %p", (void *)a);
    spec[base_len] = '\0';
    chunk = 0;
    sa_config_init(&cfg);
    expect(sa_config_parse(&cfg, spec, err, sizeof err), SA_OK, "sa_config_parse");
  }
  TRACE("config %s%s%s\n", spec, budgeted ? "" : " (device memory: the cap)",
        c & 0x40 ? " with an oom callback" : "");
  if (c & 0x40) cfg.oom_callback = on_oom;
  t_unbudgeted += !budgeted;
  m.keep_spans = (cfg.flags & SA_FLAG_KEEP_SPANS) != 0;
  m.cap = cap;
  m.chunk = chunk;
  m.superblock = cfg.superblock_size;
  m.threshold_explicit = explicit_threshold;
  m.threshold = explicit_threshold ? cfg.large_threshold : m.superblock / 2;
  m.release_threshold = cfg.release_threshold_bytes;
  m.next_tag = 0xA0000000u;
  if (extended && (e2 & 0x40))
    create_under_fault(&cfg, (sa_host_fn)((e1 ^ e2) % SA_HOST_FN_COUNT), 1 + (e2 >> 7));
  expect(sa_arena_create(&cfg, &m.arena), SA_OK, "sa_arena_create");
  if (extended && (e2 >> 2) & 1) sa_host_set_default_stream_mode(SA_HOST_MANUAL);
  m.streams[0] = NULL;
  for (int s = 1; s < NSTREAMS; s++)
    expect(sa_host_stream_create(mode_of(s), &m.streams[s]), SA_OK, "sa_host_stream_create");
}

/* The streams that live, destroyed: released first while the arena lives
 * (all but every other extra stream, which goes without a release). */
static void streams_destroy(void) {
  for (int s = 1; s < NSTREAMS + m.nextra; s++) {
    if (s < NSTREAMS && m.dead[s]) continue;
    if (m.arena != NULL && (s < NSTREAMS || s % 2 == 0))
      expect(sa_stream_release(m.arena, m.streams[s]), SA_OK, "sa_stream_release");
    expect(sa_host_stream_destroy(m.streams[s]), SA_OK, "sa_host_stream_destroy");
  }
  sa_host_set_default_stream_mode(SA_HOST_AUTO);
}

static void teardown(void) {
  for (int k = 1; k <= NWORKERS; k++) worker_exit(k); /* their caches go back */
  sa_host_fault_clear();
  m.faulting = false;
  while (m.nlive > 0 && !m.abandoned) {
    block *b = &m.live[m.nlive - 1];
    int t = b->use >= 0 ? b->use : 0;
    if (!free_block(m.nlive - 1, t)) die("sa_free failed at teardown");
  }
  drain_all();
  if (m.mismatches != 0) die("%llu words had the wrong contents", (unsigned long long)m.mismatches);
  if (!m.abandoned) {
    check_stats();
    empty_trim();
  }
  streams_destroy();
  if (!m.abandoned) {
    sa_stats st;
    expect(sa_get_stats(m.arena, &st), SA_OK, "sa_get_stats");
    t_background += st.background_growths;
    expect(sa_arena_destroy(m.arena), SA_OK, "sa_arena_destroy");
  }
  expect_nothing_left("destroy");
}

/* The library's switch (src/large/grower.h): background growth's jobs run
 * at once on the asking thread, so that an input replays the same way. */
extern _Atomic bool sa__grower_inline;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static bool registered;
  if (!registered) {
    registered = true;
    atexit(report);
    atomic_store(&sa__grower_inline, true);
  }
  if (tracing < 0) tracing = getenv("ARENA_FUZZ_TRACE") != NULL;
  input in = {data, size, 0};
  setup(&in);
  m.in = &in;
  int ops = 0;
  while (more(&in) && ops < 512 && !m.abandoned) {
    uint8_t op = u8(&in);
    if (control(op, &in)) {
    } else if (m.exec != 0) {
      hand_to(m.exec, op, &in, false);
      t_worker_ops++;
    } else {
      run_op(op, &in);
    }
    ops++;
  }
  t_ops += (uint64_t)ops;
  t_inputs++;
  teardown();
  return 0;
}

/* One operation and the checks after it, on the thread m.exec names. */
static void run_op(uint8_t op, input *in) {
  if ((op & 0xc0) == 0xc0) { /* control() took 0-2 */
    switch ((op & 0x3f) % 10) {
      case 3: op_undrained(in); break;
      case 9: op_capture(in); break;
      case 4: op_sweep(in); break;
      case 5: case 8: op_burst(in); break;
      case 6: op_snapshot(); break;
      case 7: /* 47 only (0xef), so that the corpus's 7 to 37 keep their meaning */
        if ((op & 0x3f) == 47) {
          op_pool(in);
          break;
        }
        op_bad_tune(in);
        break;
      default: op_bad_tune(in); break;
    }
  } else if (op & 0x80) { /* the extended operations */
    switch ((op & 0x7f) % 8) {
      case 0: op_destroy(in); break;
      case 1: op_thread(in); break;
      case 2: op_fault(in); break;
      case 3: op_clear(); break;
      case 4: empty_trim(); break;
      case 5: op_release(in); break;
      case 6: op_alloc(in); break;
      default: op_free(in); break;
    }
  } else {
    switch (op % 16) {
      case 0: case 1: case 2: case 3: case 4: op_alloc(in); break;
      case 5: case 6: case 7: op_free(in); break;
      case 8: op_use(in); break;
      case 9: case 10: op_step(in); break;
      case 11: op_verify(); break;
      case 12: op_tune(in); break;
      case 13: op_bad(in); break;
      case 14: op_release(in); break;
      default: check_stats(); break;
    }
  }
  check_stats();
}
