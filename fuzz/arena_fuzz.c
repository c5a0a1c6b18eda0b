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
 * Built with clang directly from the sources by fuzz/run.sh (Bazel here
 * builds with gcc). The first bytes choose the configuration.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "size_class.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define NSTREAMS 4  /* index 0 is the default stream (NULL, AUTO) */
#define MAX_LIVE 64
#define MAX_FREED 16
#define HEAD_BYTES 1024 /* the tag covers the head and the last word */

typedef struct block_s {
  void *p;
  size_t size;
  size_t accounted; /* what live_bytes counts for it */
  int use;          /* stream of its last fill; -1: no pending work anywhere */
  int alloc_stream; /* -1 once that stream was released */
  uint32_t tag;
} block;

typedef struct input_s {
  const uint8_t *data;
  size_t size, pos;
} input;

static struct {
  sa_arena *arena;
  sa_stream streams[NSTREAMS];
  block live[MAX_LIVE];
  int nlive;
  void *freed[MAX_FREED]; /* recently freed addresses, for double frees */
  int nfreed;
  size_t threshold, superblock, cap;
  bool threshold_explicit;
  uint64_t allocs, frees;
  int64_t live_bytes;
  uint32_t next_tag;
  uint64_t mismatches; /* check kernels add here */
} m;

/* Totals over the whole run, printed at exit. */
static uint64_t t_inputs, t_ops, t_allocs, t_frees, t_bad, t_oom, t_checks;

static void report(void) {
  printf("fuzz: inputs %llu, operations %llu (allocs %llu, frees %llu, bad inputs %llu, out of "
         "memory %llu, content checks %llu), threads 1, streams %d, failures 0\n",
         (unsigned long long)t_inputs, (unsigned long long)t_ops, (unsigned long long)t_allocs,
         (unsigned long long)t_frees, (unsigned long long)t_bad, (unsigned long long)t_oom,
         (unsigned long long)t_checks, NSTREAMS);
  fflush(stdout);
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
  expect(sa_host_fill(m.streams[s], b->p, h, b->tag), SA_OK, "sa_host_fill");
  expect(sa_host_fill(m.streams[s], (char *)b->p + last_word(b), 4, b->tag), SA_OK,
         "sa_host_fill");
  b->use = s;
}

static void check_kernel(block *b) {
  size_t h = head_bytes(b);
  if (h == 0 || b->use < 0) return;
  expect(sa_host_check(m.streams[b->use], b->p, h, b->tag, &m.mismatches), SA_OK,
         "sa_host_check");
  t_checks++;
}

/* Direct read: the block's stream must be drained first. */
static void read_back(const block *b) {
  if (head_bytes(b) == 0) return;
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

static void check_stats(void) {
  sa_stats st;
  expect(sa_get_stats(m.arena, &st), SA_OK, "sa_get_stats");
  if (st.alloc_count != m.allocs || st.free_count != m.frees)
    die("stats count %llu allocs, %llu frees; model %llu, %llu",
        (unsigned long long)st.alloc_count, (unsigned long long)st.free_count,
        (unsigned long long)m.allocs, (unsigned long long)m.frees);
  if ((int64_t)st.live_bytes != m.live_bytes)
    die("stats live_bytes %zu, model %lld", st.live_bytes, (long long)m.live_bytes);
  if (st.reserved_bytes > m.cap || st.reserved_bytes_peak > m.cap)
    die("reserved %zu (peak %zu) above the cap %zu", st.reserved_bytes, st.reserved_bytes_peak,
        m.cap);
  if (st.live_bytes > st.reserved_bytes)
    die("live %zu bytes but only %zu reserved", st.live_bytes, st.reserved_bytes);
  if (st.large_spans > (size_t)m.nlive) die("%zu large spans, %d live blocks", st.large_spans, m.nlive);
}

static int pick_stream(input *in) { return u8(in) % NSTREAMS; }

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

static void op_alloc(input *in) {
  int s = pick_stream(in);
  size_t size = decode_size(in);
  void *p = (void *)1;
  sa_status st = sa_alloc(m.arena, &p, size, m.streams[s]);
  TRACE("alloc %zu on %d -> %s %p\n", size, s, sa_status_string(st), p);
  if (size == 0) {
    expect(st, SA_OK, "sa_alloc(0)");
    if (p != NULL) die("sa_alloc(0) gave %p", p);
    t_bad++;
    return;
  }
  if (st == SA_ERR_OUT_OF_MEMORY) {
    if (p != NULL) die("failed sa_alloc left %p", p);
    t_oom++;
    return;
  }
  if (size > m.cap) die("sa_alloc of %zu bytes above the cap %zu returned %s", size, m.cap,
                        sa_status_string(st));
  expect(st, SA_OK, "sa_alloc");
  if (p == NULL || (uintptr_t)p % SA_ALIGNMENT != 0) die("sa_alloc gave %p", p);
  check_overlap(p, size);
  m.allocs++;
  t_allocs++;
  m.live_bytes += (int64_t)accounted(size);
  for (int i = 0; i < m.nfreed; i++)
    if (m.freed[i] == p) m.freed[i] = m.freed[--m.nfreed]; /* no longer a double free */
  if (m.nlive == MAX_LIVE) { /* the model is full: give it back at once */
    expect(sa_free(p, m.streams[s]), SA_OK, "sa_free");
    m.frees++;
    t_frees++;
    m.live_bytes -= (int64_t)accounted(size);
    return;
  }
  block *b = &m.live[m.nlive++];
  *b = (block){p, size, accounted(size), -1, s, m.next_tag++};
  fill(b, s);
}

/* Free a live block, on its stream or another: the contract wants every
 * stream that used it ordered before the free or recorded. */
static void op_free(input *in) {
  if (m.nlive == 0) return;
  int i = u8(in) % m.nlive;
  int t = pick_stream(in);
  block *b = &m.live[i];
  TRACE("free %p (alloc on %d, used on %d) on %d\n", b->p, b->alloc_stream, b->use, t);
  check_kernel(b);
  if (b->use >= 0 && b->use != t) {
    /* Small blocks ignore a record of their own stream (it orders itself);
     * everything else is kept until the free. */
    expect(sa_record_stream(b->p, m.streams[b->use]), SA_OK, "sa_record_stream");
  }
  expect(sa_free(b->p, m.streams[t]), SA_OK, "sa_free");
  m.frees++;
  t_frees++;
  m.live_bytes -= (int64_t)b->accounted;
  if (m.nfreed < MAX_FREED) m.freed[m.nfreed++] = b->p;
  *b = m.live[--m.nlive];
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
  }
  expect(sa_record_stream(b->p, m.streams[u]), SA_OK, "sa_record_stream");
  b->tag = m.next_tag++;
  fill(b, u);
}

static void op_step(input *in) {
  int s = pick_stream(in);
  expect(sa_host_stream_step(m.streams[s], 1 + u8(in) % 16, NULL), SA_OK,
         "sa_host_stream_step");
}

static void op_verify(void) {
  expect(sa_host_drain_all(), SA_OK, "sa_host_drain_all");
  for (int i = 0; i < m.nlive; i++) read_back(&m.live[i]);
  if (m.mismatches != 0) die("%llu words had the wrong contents", (unsigned long long)m.mismatches);
  check_stats();
}

static void op_tune(input *in) {
  uint8_t k = u8(in);
  TRACE("tune %u\n", k % 3);
  switch (k % 3) {
    case 0: expect(sa_trim(m.arena, (size_t)(k >> 2) * MiB), SA_OK, "sa_trim"); break;
    case 1: expect(sa_defragment(m.arena), SA_OK, "sa_defragment"); break;
    default: {
      size_t bytes = (size_t)(1 + (k >> 2) % 4) * 2 * MiB;
      sa_status st = sa_set_superblock_size(m.arena, bytes);
      if (m.threshold_explicit && m.threshold > bytes) {
        expect(st, SA_ERR_INVALID_ARGUMENT, "sa_set_superblock_size below the threshold");
        t_bad++;
        break;
      }
      expect(st, SA_OK, "sa_set_superblock_size");
      m.superblock = bytes;
      if (!m.threshold_explicit) m.threshold = bytes / 2;
    }
  }
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
        expect(sa_free(b->p, (sa_stream)&other), SA_ERR_UNKNOWN_STREAM, "sa_free(bad stream)");
      }
      {
        void *p = (void *)1;
        expect(sa_alloc(m.arena, &p, 64, (sa_stream)&other), SA_ERR_UNKNOWN_STREAM,
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

/* Release one of the created streams with blocks outstanding, destroy it
 * (its queued work runs) and make a new one in its place. */
static void op_release(input *in) {
  int s = 1 + u8(in) % (NSTREAMS - 1);
  TRACE("release stream %d\n", s);
  for (int i = 0; i < m.nlive; i++) check_kernel(&m.live[i]);
  expect(sa_stream_release(m.arena, m.streams[s]), SA_OK, "sa_stream_release");
  expect(sa_host_stream_destroy(m.streams[s]), SA_OK, "sa_host_stream_destroy");
  expect(sa_host_stream_create(SA_HOST_MANUAL, &m.streams[s]), SA_OK, "sa_host_stream_create");
  for (int i = 0; i < m.nlive; i++) {
    if (m.live[i].use == s) m.live[i].use = -1; /* its work ran at destroy */
    if (m.live[i].alloc_stream == s) m.live[i].alloc_stream = -1;
  }
  /* Blocks whose last use was on another stream still have it pending. */
}

/* ---- one input ------------------------------------------------------------ */

static void setup(input *in) {
  uint8_t c = u8(in);
  static const char *const caps[] = {"8MiB", "16MiB", "32MiB", "64MiB"};
  static const char *const sbs[] = {"2MiB", "4MiB", "2MiB", "8MiB"};
  char spec[192];
  bool explicit_threshold = (c >> 4) & 1;
  snprintf(spec, sizeof spec,
           "backend=host,check_stream_order=1,max_physical=%s,superblock_size=%s%s",
           caps[c & 3], sbs[(c >> 2) & 3], explicit_threshold ? ",large_threshold=512KiB" : "");
  sa_config cfg;
  sa_config_init(&cfg);
  char err[128];
  expect(sa_config_parse(&cfg, spec, err, sizeof err), SA_OK, "sa_config_parse");
  memset(&m, 0, sizeof m);
  m.cap = cfg.max_physical_bytes;
  m.superblock = cfg.superblock_size;
  m.threshold_explicit = explicit_threshold;
  m.threshold = explicit_threshold ? cfg.large_threshold : m.superblock / 2;
  m.next_tag = 0xA0000000u;
  expect(sa_arena_create(&cfg, &m.arena), SA_OK, "sa_arena_create");
  m.streams[0] = NULL;
  for (int s = 1; s < NSTREAMS; s++)
    expect(sa_host_stream_create(SA_HOST_MANUAL, &m.streams[s]), SA_OK, "sa_host_stream_create");
}

static void teardown(const sa_host_counters *before) {
  while (m.nlive > 0) {
    block *b = &m.live[m.nlive - 1];
    check_kernel(b);
    int t = b->use >= 0 ? b->use : 0;
    expect(sa_free(b->p, m.streams[t]), SA_OK, "sa_free");
    m.frees++;
    t_frees++;
    m.live_bytes -= (int64_t)b->accounted;
    m.nlive--;
  }
  expect(sa_host_drain_all(), SA_OK, "sa_host_drain_all");
  if (m.mismatches != 0) die("%llu words had the wrong contents", (unsigned long long)m.mismatches);
  check_stats();
  for (int s = 1; s < NSTREAMS; s++) {
    expect(sa_stream_release(m.arena, m.streams[s]), SA_OK, "sa_stream_release");
    expect(sa_host_stream_destroy(m.streams[s]), SA_OK, "sa_host_stream_destroy");
  }
  expect(sa_arena_destroy(m.arena), SA_OK, "sa_arena_destroy");
  sa_host_counters after;
  sa_host_get_counters(&after);
  if (after.va_ranges != before->va_ranges || after.chunks != before->chunks ||
      after.mappings != before->mappings || after.events != before->events ||
      after.streams != before->streams)
    die("destroy left va %zu->%zu, chunks %zu->%zu, mappings %zu->%zu, events %zu->%zu, "
        "streams %zu->%zu",
        before->va_ranges, after.va_ranges, before->chunks, after.chunks, before->mappings,
        after.mappings, before->events, after.events, before->streams, after.streams);
  if (after.order_violations != before->order_violations)
    die("the stream-order checker found %llu violations",
        (unsigned long long)(after.order_violations - before->order_violations));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static bool registered;
  if (!registered) {
    registered = true;
    atexit(report);
  }
  if (tracing < 0) tracing = getenv("ARENA_FUZZ_TRACE") != NULL;
  input in = {data, size, 0};
  sa_host_counters before;
  sa_host_get_counters(&before);
  setup(&in);
  int ops = 0;
  while (more(&in) && ops < 512) {
    uint8_t op = u8(&in);
    switch (op % 16) {
      case 0: case 1: case 2: case 3: case 4: op_alloc(&in); break;
      case 5: case 6: case 7: op_free(&in); break;
      case 8: op_use(&in); break;
      case 9: case 10: op_step(&in); break;
      case 11: op_verify(); break;
      case 12: op_tune(&in); break;
      case 13: op_bad(&in); break;
      case 14: op_release(&in); break;
      default: check_stats(); break;
    }
    ops++;
  }
  t_ops += (uint64_t)ops;
  t_inputs++;
  teardown(&before);
  return 0;
}
