/* sa_record_stream and the free of a recorded block: the recorded streams
 * survive a free that fails (host memory short included), a free never
 * makes the host wait however many streams were recorded, and reading
 * whether the owner stream was released does not race sa_stream_release.
 *
 * Host allocation failures are injected by this binary's own malloc,
 * calloc and realloc, which forward to the next definition (libc's or a
 * sanitizer's) unless a test has turned failing on. ThreadSanitizer's
 * runtime allocates before it can take such calls: under it, those tests
 * skip (the others run).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* RTLD_NEXT */
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "fixture.h"
#include "internal.h"
#include "test/util.h"

/* ---- allocation failure injection ------------------------------------ */

static atomic_int fail_allocs;
static atomic_int fail_reallocs; /* realloc only: a step after a calloc */
#ifdef __SANITIZE_THREAD__
enum { CAN_FAIL_ALLOCS = 0 };
#else
enum { CAN_FAIL_ALLOCS = 1 };
static void *(*next_malloc)(size_t);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static void (*next_free)(void *);
/* What dlsym itself allocates while the next definitions are looked up. */
static _Alignas(16) char boot[1 << 14];
static size_t boot_used;
static int resolving;

static void *boot_alloc(size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (boot_used + n > sizeof boot) return NULL;
  void *p = boot + boot_used;
  boot_used += n;
  return p; /* zeroed: static storage, never reused */
}

static int in_boot(const void *p) {
  return (const char *)p >= boot && (const char *)p < boot + sizeof boot;
}

/* The first allocation of the process runs this, before any thread. */
static void resolve(void) {
  if (next_free != NULL) return;
  resolving = 1;
  *(void **)&next_malloc = dlsym(RTLD_NEXT, "malloc");
  *(void **)&next_calloc = dlsym(RTLD_NEXT, "calloc");
  *(void **)&next_realloc = dlsym(RTLD_NEXT, "realloc");
  *(void **)&next_free = dlsym(RTLD_NEXT, "free");
  resolving = 0;
}

void *malloc(size_t n) {
  if (resolving) return boot_alloc(n);
  resolve();
  return atomic_load_explicit(&fail_allocs, memory_order_relaxed) ? NULL : next_malloc(n);
}

void *calloc(size_t n, size_t size) {
  if (resolving) return n != 0 && size > SIZE_MAX / n ? NULL : boot_alloc(n * size);
  resolve();
  return atomic_load_explicit(&fail_allocs, memory_order_relaxed) ? NULL : next_calloc(n, size);
}

void *realloc(void *p, size_t n) {
  if (resolving) return boot_alloc(n);
  resolve();
  if (atomic_load_explicit(&fail_allocs, memory_order_relaxed) ||
      atomic_load_explicit(&fail_reallocs, memory_order_relaxed))
    return NULL;
  if (!in_boot(p)) return next_realloc(p, n);
  void *q = next_malloc(n); /* boot blocks do not know their size: copy what fits */
  size_t room = (size_t)(boot + sizeof boot - (char *)p);
  if (q != NULL) memcpy(q, p, n < room ? n : room);
  return q;
}

void free(void *p) {
  if (p == NULL || in_boot(p)) return;
  resolve();
  next_free(p);
}
#endif

/* ---- tests ------------------------------------------------------------- */

static int setup(void **state) {
  sa_fixture *f = calloc(1, sizeof *f);
  if (f == NULL || sa_fixture_setup(f, NULL, 7, SA_HOST_MANUAL) != SA_OK) {
    free(f);
    return -1;
  }
  *state = f;
  return 0;
}

static int teardown(void **state) { return sa_fixture_cmocka_teardown(state); }

static uint64_t violations(void) {
  sa_host_counters c;
  sa_host_get_counters(&c);
  return c.order_violations;
}

/* Free p on s with every host allocation failing: the status says so. */
static sa_status free_without_host_memory(void *p, sa_stream s) {
  atomic_store(&fail_allocs, 1);
  sa_status st = sa_free(p, s);
  atomic_store(&fail_allocs, 0);
  return st;
}

/* A block used on B (its work still queued) and recorded there, freed on
 * its own stream A while the host has no memory: the free fails and the
 * record stays. It was taken out of the table and put back by a re-add
 * that needed memory too, so it was lost: the retried free then handed the
 * block back to A at once, while B's work was still queued (the checker
 * reported it on the next allocation on A). */
static void record_survives_a_free_without_host_memory(void **state) {
  sa_fixture *f = *state;
  if (!CAN_FAIL_ALLOCS) skip();
  sa_stream a = f->streams[0], b = f->streams[1];
  void *p;
  sa_assert_ok(sa_alloc(f->arena, &p, 4096, a));
  sa_assert_ok(sa_host_fill(b, p, 4096, 0xb0b0b0b0u));
  sa_assert_ok(sa_record_stream(p, b));

  sa_assert_status(free_without_host_memory(p, a), SA_ERR_OUT_OF_MEMORY);
  assert_true(sa__record_names_stream(f->arena, b));
  sa_assert_ok(sa_free(p, a));
  void *q;
  sa_assert_ok(sa_alloc(f->arena, &q, 4096, a)); /* p only behind B's event */
  sa_assert_ok(sa_free(q, a));
  sa_assert_ok(sa_host_drain_all());
}

/* The same for a large allocation (span.c's free). */
static void span_record_survives_a_free_without_host_memory(void **state) {
  sa_fixture *f = *state;
  if (!CAN_FAIL_ALLOCS) skip();
  sa_stream a = f->streams[0], b = f->streams[1];
  void *p;
  sa_assert_ok(sa_alloc(f->arena, &p, 8 * MiB, a));
  sa_assert_ok(sa_host_fill(b, p, 4096, 0xb0b0b0b0u));
  sa_assert_ok(sa_record_stream(p, b));
  sa_assert_status(free_without_host_memory(p, a), SA_ERR_OUT_OF_MEMORY);
  assert_true(sa__record_names_stream(f->arena, b));
  sa_assert_ok(sa_free(p, a));
  assert_false(sa__record_names_stream(f->arena, b));
  sa_assert_ok(sa_host_drain_all());
}

/* The first sa_record_stream of a block, its table entry made but the
 * entry's stream list short of host memory: the call fails and leaves no
 * entry. An empty one stayed in the table, held until the arena's end. */
static void failed_first_record_leaves_no_entry(void **state) {
  sa_fixture *f = *state;
  if (!CAN_FAIL_ALLOCS) skip();
  sa_stream a = f->streams[0], b = f->streams[1];
  void *p;
  sa_assert_ok(sa_alloc(f->arena, &p, 8 * MiB, a));
  atomic_store(&fail_reallocs, 1);
  sa_status st = sa_record_stream(p, b);
  atomic_store(&fail_reallocs, 0);
  sa_assert_status(st, SA_ERR_OUT_OF_MEMORY);
  sa_record *left = sa__record_take(f->arena, (uintptr_t)p);
  sa__record_free(f->arena, left);
  assert_null(left);
  sa_assert_ok(sa_free(p, a));
  sa_assert_ok(sa_host_drain_all());
}

/* A block recorded on five streams with work queued on each, freed on its
 * own: no stream is synchronized, and the memory is reused only behind the
 * five events. A batch held four events; the fifth stream was waited for
 * on the host (event synchronize ran its queued work). */
static void free_of_a_block_recorded_on_many_streams_does_not_wait(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0];
  void *p;
  sa_assert_ok(sa_alloc(f->arena, &p, 4096, a));
  for (int i = 1; i <= 5; i++) {
    sa_assert_ok(sa_host_fill(f->streams[i], p, 4096, 0x01010101u * (unsigned)i));
    sa_assert_ok(sa_record_stream(p, f->streams[i]));
  }
  uint64_t syncs = sa_host_call_count(SA_HOST_FN_EVENT_SYNCHRONIZE) +
                   sa_host_call_count(SA_HOST_FN_STREAM_SYNCHRONIZE);
  sa_assert_ok(sa_free(p, a));
  assert_int_equal(sa_host_call_count(SA_HOST_FN_EVENT_SYNCHRONIZE) +
                       sa_host_call_count(SA_HOST_FN_STREAM_SYNCHRONIZE),
                   syncs);
  for (int i = 1; i <= 5; i++) assert_int_equal(sa_host_stream_pending(f->streams[i]), 2);
  /* Reuse on A and on another stream: the checker verifies the waits. */
  void *q, *r;
  sa_assert_ok(sa_alloc(f->arena, &q, 4096, a));
  sa_assert_ok(sa_alloc(f->arena, &r, 4096, f->streams[6]));
  sa_assert_ok(sa_free(q, a));
  sa_assert_ok(sa_free(r, f->streams[6]));
  sa_assert_ok(sa_host_drain_all());
}

/* sa_stream_release of a block's stream, then sa_record_stream of that
 * block on the same stream from another thread that never synchronized
 * with the first (a relaxed flag orders them in time only): the record
 * path reads whether the stream was released under its lock.
 * ThreadSanitizer reported the unlocked read as a data race. */
typedef struct {
  sa_fixture *f;
  void *p;
  atomic_int released;
} race_arg;

static void *release_stream(void *arg) {
  race_arg *r = arg;
  sa_assert_ok(sa_stream_release(r->f->arena, r->f->streams[0]));
  atomic_store_explicit(&r->released, 1, memory_order_relaxed);
  return NULL;
}

static void *record_after_release(void *arg) {
  race_arg *r = arg;
  while (!atomic_load_explicit(&r->released, memory_order_relaxed)) {
  }
  sa_assert_ok(sa_record_stream(r->p, r->f->streams[0]));
  return NULL;
}

static void released_flag_is_read_under_its_lock(void **state) {
  sa_fixture *f = *state;
  race_arg r = {f, NULL, 0};
  sa_assert_ok(sa_alloc(f->arena, &r.p, 4096, f->streams[0]));
  pthread_t t1, t2;
  assert_int_equal(pthread_create(&t2, NULL, record_after_release, &r), 0);
  assert_int_equal(pthread_create(&t1, NULL, release_stream, &r), 0);
  assert_int_equal(pthread_join(t1, NULL), 0);
  assert_int_equal(pthread_join(t2, NULL), 0);
  sa_assert_ok(sa_free(r.p, f->streams[1]));
  sa_assert_ok(sa_host_drain_all());
}

/* A span recorded on K (K's fill still queued), freed on its own stream A;
 * then K is destroyed, as the header allows once p is freed, and the next
 * stream gets K's handle. This thread used K, so its cache knows the new
 * stream by the handle as K's stream arena: the span's mark on K was
 * skipped as the taker's own and p went to the new stream with no wait
 * for K's fill (the checker refused the handout). */
static void span_recorded_on_a_destroyed_stream_waits_on_its_next_handle(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], k, next;
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &k));
  void *q, *p;
  sa_assert_ok(sa_alloc(f->arena, &q, 4096, k)); /* this thread knows k */
  sa_assert_ok(sa_free(q, k));
  sa_assert_ok(sa_alloc(f->arena, &p, 8 * MiB, a));
  sa_assert_ok(sa_host_fill(k, p, 4096, 0x6b6b6b6bu));
  sa_assert_ok(sa_record_stream(p, k));
  sa_assert_ok(sa_free(p, a));
  sa_assert_ok(sa_host_stream_destroy(k));
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &next));
  assert_ptr_equal(next, k); /* the handle is reused */
  sa_assert_ok(sa_alloc(f->arena, &q, 8 * MiB, next));
  sa_assert_ok(sa_free(q, next));
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_stream_release(f->arena, next));
  sa_assert_ok(sa_host_stream_destroy(next));
}

/* The fuzzer's input fuzz/corpus/stream-order-after-destroyed-recorded-stream,
 * made deterministic. A span recorded on K (K's fill queued) is freed on A;
 * K is destroyed undrained, as the header allows for memory allocated
 * elsewhere, and the next stream gets K's handle. This thread knows the
 * handle as K's stream arena, so its span frees on the new stream took
 * tickets on K's old timeline; eight of them wrapped its ring of events, and
 * the recorded mark's ticket then resolved to an event on the new stream
 * (and a completed query of a later ticket counted it done): a third
 * stream got the span with no wait for K's fill. */
static void a_recorded_mark_survives_its_streams_handle_reused(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], c = f->streams[2], k, next;
  enum { FREES = 12 };
  void *r[FREES], *q, *p, *sep[2];
  /* Spans of another size, freed later on the new stream: none of them is
   * p's memory (live spans keep them apart), and a third stream's request
   * fits p best (smaller than what the climb mapped ahead, 8 MiB). */
  for (int i = 0; i < FREES; i++) sa_assert_ok(sa_alloc(f->arena, &r[i], 2 * MiB, a));
  sa_assert_ok(sa_alloc(f->arena, &sep[0], 2 * MiB, a));
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &k));
  sa_assert_ok(sa_alloc(f->arena, &q, 4096, k)); /* this thread knows k */
  sa_assert_ok(sa_free(q, k));
  sa_assert_ok(sa_alloc(f->arena, &p, 6 * MiB, a));
  sa_assert_ok(sa_alloc(f->arena, &sep[1], 2 * MiB, a));
  sa_assert_ok(sa_host_fill(k, p, 4096, 0x6b6b6b6bu));
  sa_assert_ok(sa_record_stream(p, k));
  sa_assert_ok(sa_free(p, a));
  sa_assert_ok(sa_host_stream_drain(a)); /* A's own mark completes */
  sa_assert_ok(sa_host_stream_destroy(k)); /* its fill stays queued */
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &next));
  assert_ptr_equal(next, k); /* the handle is reused */
  for (int i = 0; i < FREES; i++) sa_assert_ok(sa_free(r[i], next));
  sa_assert_ok(sa_host_stream_drain(next)); /* its events complete, not k's fill */
  uint64_t v0 = violations(), mism = 0;
  sa_assert_ok(sa_alloc(f->arena, &q, 6 * MiB, c));
  assert_ptr_equal(q, p);
  sa_assert_ok(sa_host_fill(c, q, 4096, 0xC3C3C3C3u));
  sa_assert_ok(sa_host_check(c, q, 4096, 0xC3C3C3C3u, &mism));
  sa_assert_ok(sa_host_drain_all()); /* k's fill runs too: before c's, or c was early */
  assert_int_equal(violations(), v0);
  assert_int_equal(mism, 0);
  assert_int_equal(((uint32_t *)q)[0], 0xC3C3C3C3u);
  sa_assert_ok(sa_free(q, c));
  for (int i = 0; i < 2; i++) sa_assert_ok(sa_free(sep[i], a));
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_stream_release(f->arena, next));
  sa_assert_ok(sa_host_stream_destroy(next));
}

/* ---- review: mutation tests of the small-block path -------------------- */

/* A block of A recorded on U and freed on a third stream B, B's use of it
 * still queued: its reuse waits for B's work as well as U's (B is the
 * freeing stream), not only for the recorded streams'. A 512 KiB class
 * holds two blocks a bin, so A's next allocation refills from the stream
 * arena, which has the block back as soon as the batch's events completed.
 * A runs first; B's late fill must not clobber A's pattern. */
static void a_recorded_block_freed_on_a_third_stream_waits_for_it(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], u = f->streams[1], b = f->streams[2];
  const size_t size = 512 * 1024;
  void *p, *q;
  sa_assert_ok(sa_alloc(f->arena, &p, size, a));
  sa_assert_ok(sa_host_stream_drain(a));
  sa_assert_ok(sa_record_stream(p, u));
  sa_assert_ok(sa_host_fill(b, p, 4096, 0xB0B0B0B0u)); /* B's use, queued */
  sa_assert_ok(sa_free(p, b));
  sa_assert_ok(sa_host_stream_drain(u)); /* U's event completes; B's does not */
  q = sa_fixture_take_behind(f->arena, size, a, b, 0xA0A0A0A0u);
  sa_assert_ok(sa_free(q, a));
  sa_assert_ok(sa_host_drain_all());
}

/* A stream that only sa_record_stream named (nothing was allocated on it,
 * so the arena has no stream arena for it) is synchronized by its release:
 * the header lets the user destroy it then, and the records that name it
 * are forgotten, so the block's reuse no longer waits for it. Released
 * without waiting, the block went back to A at once while U's work was
 * still queued. */
static void releasing_a_stream_only_recorded_waits_for_its_work(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], u;
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &u));
  const size_t size = 512 * 1024; /* two blocks a bin: A refills for q */
  void *p, *q;
  sa_assert_ok(sa_alloc(f->arena, &p, size, a));
  sa_assert_ok(sa_host_fill(u, p, 4096, 0x0B0B0B0Bu)); /* U's use, queued */
  sa_assert_ok(sa_record_stream(p, u));
  sa_assert_ok(sa_stream_release(f->arena, u));
  assert_int_equal(sa_host_stream_pending(u), 0); /* the release waited for it */
  assert_false(sa__record_names_stream(f->arena, u));
  sa_assert_ok(sa_host_stream_destroy(u));
  uint64_t v0 = violations(), mism = 0;
  sa_assert_ok(sa_free(p, a)); /* no record left: A has it back at once */
  sa_assert_ok(sa_alloc(f->arena, &q, size, a));
  assert_ptr_equal(q, p);
  sa_assert_ok(sa_host_fill(a, q, 4096, 0xA0A0A0A0u));
  sa_assert_ok(sa_host_check(a, q, 4096, 0xA0A0A0A0u, &mism));
  sa_assert_ok(sa_host_drain_all());
  assert_int_equal(mism, 0);
  assert_int_equal(violations(), v0);
  sa_assert_ok(sa_free(q, a));
  sa_assert_ok(sa_host_drain_all());
}

/* A block allocated on `old`, which is released and destroyed; the next
 * stream gets old's handle and uses the block, recorded there. The block's
 * stream arena is gone (released: its work is done, what comes back to it
 * is clean), so the new stream's use is not ordered by it: the record must
 * be kept, or the block's superblock empties clean into the global stack
 * and another stream takes it while the new stream's fill is queued. */
static void a_record_on_a_recycled_handle_of_the_blocks_stream_is_kept(void **state) {
  sa_fixture *f = *state;
  sa_stream b = f->streams[1], c = f->streams[2], old, fresh;
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &old));
  const size_t size = 512 * 1024;
  void *p, *r, *q;
  sa_assert_ok(sa_alloc(f->arena, &p, size, old));
  sa_assert_ok(sa_stream_release(f->arena, old));
  sa_assert_ok(sa_host_stream_destroy(old));
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &fresh));
  assert_ptr_equal(fresh, old); /* the handle comes back */
  sa_assert_ok(sa_host_fill(fresh, p, 4096, 0xF0F0F0F0u)); /* queued */
  sa_assert_ok(sa_record_stream(p, fresh));
  sa_assert_ok(sa_free(p, b));
  sa_assert_ok(sa_alloc(f->arena, &r, 4096, b)); /* a call on B sends B's batch on */
  sa_assert_ok(sa_host_stream_drain(b));         /* B's event completes; fresh's not */
  q = sa_fixture_take_behind(f->arena, size, c, fresh, 0xC0C0C0C0u);
  sa_assert_ok(sa_free(q, c));
  sa_assert_ok(sa_free(r, b));
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_stream_release(f->arena, fresh));
  sa_assert_ok(sa_host_stream_destroy(fresh));
}

/* ---- review: the table grows with the blocks recorded ------------------ */

/* The longest chain of the record table (record.c). */
static size_t longest_record_chain(sa_arena *a) {
  size_t longest = 0;
  pthread_mutex_lock(&a->records.lock);
  const sa_chain_table *t = &a->records.table;
  for (size_t i = 0; t->heads != NULL && i < sa__chain_buckets(t); i++) {
    size_t n = 0;
    for (const sa_chain_link *l = t->heads[i]; l != NULL; l = l->next) n++;
    if (n > longest) longest = n;
  }
  pthread_mutex_unlock(&a->records.lock);
  return longest;
}

/* The table had 1,024 buckets for good: a record and the free of a
 * recorded block walked a chain of a thousandth of the blocks recorded
 * (a million: 43 us per pair, against 0.24 with a hundred). */
static void record_chains_stay_short_however_many_blocks_are_recorded(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1];
  enum { N = 16384 };
  void **p = calloc(N, sizeof *p);
  assert_non_null(p);
  for (int i = 0; i < N; i++) {
    sa_assert_ok(sa_alloc(f->arena, &p[i], 256, a));
    sa_assert_ok(sa_record_stream(p[i], b));
  }
  size_t longest = longest_record_chain(f->arena);
  for (int i = 0; i < N; i++) sa_assert_ok(sa_free(p[i], a));
  free(p);
  sa_assert_ok(sa_host_drain_all());
  assert_in_range(longest, 1, 8);
  assert_false(sa__record_names_stream(f->arena, b)); /* every entry gone */
}

/* Each stream's entry counts the blocks that name it: releasing one
 * forgets its blocks alone, and a stream no block names any more is named
 * by none, however the blocks went. */
static void record_stream_counts_follow_frees_and_releases(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1], c = f->streams[2], d = f->streams[3];
  void *p[6];
  for (int i = 0; i < 6; i++) {
    sa_assert_ok(sa_alloc(f->arena, &p[i], i < 3 ? 4096 : 3 * MiB, a));
    sa_assert_ok(sa_record_stream(p[i], i % 2 ? b : c));
    sa_assert_ok(sa_record_stream(p[i], d));
  }
  sa_assert_ok(sa_free(p[0], a)); /* c, d */
  sa_assert_ok(sa_free(p[3], a)); /* b, d */
  assert_true(sa__record_names_stream(f->arena, b));
  assert_true(sa__record_names_stream(f->arena, c));
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_stream_release(f->arena, d));
  assert_false(sa__record_names_stream(f->arena, d));
  sa_assert_ok(sa_free(p[1], a)); /* b */
  sa_assert_ok(sa_free(p[5], a)); /* b */
  assert_false(sa__record_names_stream(f->arena, b));
  assert_true(sa__record_names_stream(f->arena, c));
  sa_assert_ok(sa_stream_release(f->arena, c));
  assert_false(sa__record_names_stream(f->arena, c));
  assert_int_equal(f->arena->records.table.n, 0); /* p[2] and p[4] named c alone */
  sa_assert_ok(sa_free(p[2], a));
  sa_assert_ok(sa_free(p[4], a));
  sa_assert_ok(sa_host_drain_all());
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(record_survives_a_free_without_host_memory),
      T(span_record_survives_a_free_without_host_memory),
      T(failed_first_record_leaves_no_entry),
      T(free_of_a_block_recorded_on_many_streams_does_not_wait),
      T(released_flag_is_read_under_its_lock),
      T(span_recorded_on_a_destroyed_stream_waits_on_its_next_handle),
      T(a_recorded_mark_survives_its_streams_handle_reused),
      T(record_chains_stay_short_however_many_blocks_are_recorded),
      T(record_stream_counts_follow_frees_and_releases),
      T(a_recorded_block_freed_on_a_third_stream_waits_for_it),
      T(releasing_a_stream_only_recorded_waits_for_its_work),
      T(a_record_on_a_recycled_handle_of_the_blocks_stream_is_kept),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
