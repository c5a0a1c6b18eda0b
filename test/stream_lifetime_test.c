/* A stream's lifetime (src/small/stream_arena.c, src/small/thread_cache.c): the
 * library makes a driver call on a stream only inside a call that names
 * it, so threads may exit, caches evict, and other calls reclaim after the
 * user destroyed a stream without sa_stream_release. On the simulator a
 * driver call on a destroyed stream is a violation, which fails these
 * tests at teardown (the fixture counts them).
 */
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
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

static sa_stats stats(sa_arena *a) {
  sa_stats st;
  sa_assert_ok(sa_get_stats(a, &st));
  return st;
}

static sa_stream new_stream(sa_host_mode mode) {
  sa_stream s = NULL;
  sa_assert_ok(sa_host_stream_create(mode, &s));
  return s;
}

static void run_thread(void *(*fn)(void *), void *arg) {
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, fn, arg), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
}

/* Failures inside helper threads, checked by the test afterwards. */
static atomic_int thread_failures;
#define T_OK(expr)                                                                      \
  do {                                                                                  \
    sa_status t_st_ = (expr);                                                           \
    if (t_st_ != SA_OK) {                                                               \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, sa_status_string(t_st_)); \
      atomic_fetch_add(&thread_failures, 1);                                            \
    }                                                                                   \
  } while (0)

static int setup(void **state) {
  atomic_store(&thread_failures, 0);
  sa_fixture *f = malloc(sizeof *f);
  if (f == NULL || sa_fixture_setup(f, "max_physical=8MiB", 2, SA_HOST_MANUAL) != SA_OK) {
    free(f);
    return -1;
  }
  *state = f;
  return 0;
}

static int teardown(void **state) {
  int bad = atomic_load(&thread_failures) != 0;
  return sa_fixture_cmocka_teardown(state) != 0 || bad ? -1 : 0;
}

/* ---- a worker's own stream, destroyed without sa_stream_release -------- */

typedef struct worker_arg_s {
  sa_arena *arena;
  sa_stream other; /* a stream that outlives the worker */
  void *foreign[8]; /* blocks of other's, freed on the worker's stream */
} worker_arg;

/* The worker's life as cudaMallocAsync users live it: its own stream,
 * allocations and frees on it (blocks stay in its cache), blocks of another
 * stream freed on it (an open cross-stream batch), a synchronize, the
 * stream destroyed, the thread gone. */
static void *own_stream_worker(void *arg) {
  worker_arg *w = arg;
  sa_stream s;
  T_OK(sa_host_stream_create(SA_HOST_MANUAL, &s));
  void *p[16];
  for (int i = 0; i < 16; i++) {
    T_OK(sa_alloc(w->arena, &p[i], (size_t)(i % 2 + 1) * 4 * KiB, s));
    T_OK(sa_host_fill(s, p[i], 4 * KiB, (uint32_t)i));
  }
  for (int i = 0; i < 16; i++) T_OK(sa_free(p[i], s));
  for (int i = 0; i < 8; i++) T_OK(sa_free(w->foreign[i], s));
  T_OK(sa_host_stream_drain(s));
  T_OK(sa_host_stream_destroy(s));
  return NULL;
}

/* The thread-exit path recorded an event on the destroyed stream (on CUDA:
 * a crash inside libcuda); now it hands everything back untouched, and it
 * all comes back to the arena once a device sync (sa_trim) made it safe. */
static void exit_after_destroying_its_stream_touches_no_stream(void **state) {
  sa_fixture *f = *state;
  worker_arg w = {f->arena, f->streams[0], {0}};
  for (int round = 0; round < 4; round++) {
    for (int i = 0; i < 8; i++) sa_assert_ok(sa_alloc(f->arena, &w.foreign[i], 64 * KiB, w.other));
    run_thread(own_stream_worker, &w);
  }
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_trim(f->arena, 0));
  sa_stats st = stats(f->arena);
  assert_int_equal(st.deferred_frees, 0);
  assert_int_equal(st.reserved_bytes, 0);
  assert_int_equal(st.live_bytes, 0);
}

/* ---- item: an exit whose event record would fail drops nothing --------- */

static void *cross_free_then_exit_with_failing_records(void *arg) {
  worker_arg *w = arg;
  for (int i = 0; i < 8; i++) T_OK(sa_free(w->foreign[i], w->other));
  /* Every event record fails from here on, the thread's exit included. */
  T_OK(sa_host_fault_inject(SA_HOST_FN_EVENT_RECORD, 1, 1));
  return NULL;
}

/* A thread exited with an open cross-stream batch while event records
 * failed: the batch was dropped, its blocks stayed deferred forever and
 * their superblocks never emptied (the whole cap allocated here would then
 * be out of reach). Exit records nothing now. */
static void exit_with_an_open_batch_drops_nothing_when_records_fail(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1];
  worker_arg w = {f->arena, b, {0}};
  /* The whole cap in 1 MiB blocks (small: two to a superblock). */
  for (int i = 0; i < 8; i++) sa_assert_ok(sa_alloc(f->arena, &w.foreign[i], MiB, a));
  run_thread(cross_free_then_exit_with_failing_records, &w);
  sa_host_fault_clear();
  /* The whole cap again: only if the batch came home. */
  void *p[8];
  for (int i = 0; i < 8; i++) sa_assert_ok(sa_alloc(f->arena, &p[i], MiB, a));
  for (int i = 0; i < 8; i++) sa_assert_ok(sa_free(p[i], a));
  assert_int_equal(stats(f->arena).deferred_frees, 0);
}

/* ---- cache eviction ------------------------------------------------------ */

typedef struct cycle_arg_s {
  sa_arena *arena;
  sa_stream home;
  int streams;
  unsigned entries; /* out: the thread's cache entries at the end */
} cycle_arg;

/* One thread, more (arena, stream) pairs than its cache holds, each stream
 * destroyed right after use, without sa_stream_release: the entries that
 * leave hand back their blocks and open batches without a driver call. */
static void *cycle_through_streams(void *arg) {
  cycle_arg *c = arg;
  sa_stream *all = calloc((size_t)c->streams, sizeof *all);
  /* All made first: a destroyed stream's handle would go to the next one. */
  for (int k = 0; all != NULL && k < c->streams; k++)
    T_OK(sa_host_stream_create(SA_HOST_AUTO, &all[k]));
  for (int k = 0; all != NULL && k < c->streams; k++) {
    sa_stream s = all[k];
    void *mine, *theirs;
    T_OK(sa_alloc(c->arena, &mine, 8 * KiB, s));
    T_OK(sa_alloc(c->arena, &theirs, 8 * KiB, c->home));
    T_OK(sa_free(mine, s));   /* stays in the entry's cache */
    T_OK(sa_free(theirs, s)); /* the entry's open batch */
    T_OK(sa_host_stream_drain(s));
    T_OK(sa_host_stream_destroy(s));
  }
  free(all);
  c->entries = sa__tl_cache != NULL ? sa__tl_cache->n : 0;
  return NULL;
}

static void evicted_entries_touch_no_destroyed_stream(void **state) {
  sa_fixture *f = *state;
  cycle_arg c = {f->arena, f->streams[0], SA_TCACHE_ENTRIES + 9, 0};
  run_thread(cycle_through_streams, &c);
  assert_int_equal(c.entries, SA_TCACHE_ENTRIES);
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_trim(f->arena, 0));
  assert_int_equal(stats(f->arena).reserved_bytes, 0);
}

/* A thread cycling through 20 (arena, stream) pairs evicted an entry on
 * every switch (16 entries): each switch then cost a lookup, a fresh
 * entry, and a flush of the evicted one's blocks. */
static void a_thread_on_twenty_streams_keeps_every_entry(void **state) {
  sa_fixture *f = *state;
  cycle_arg c = {f->arena, f->streams[0], 20, 0};
  run_thread(cycle_through_streams, &c);
  assert_int_equal(c.entries, 20 + 1); /* and the home stream's */
}

/* ---- a new stream that gets a destroyed stream's handle ----------------- */

static void *use_then_exit(void *arg) {
  worker_arg *w = arg;
  void *p;
  T_OK(sa_alloc(w->arena, &p, 4 * KiB, w->other));
  T_OK(sa_free(p, w->other)); /* in this thread's cache: back unfenced at exit */
  w->foreign[0] = p;
  return NULL;
}

/* CUDA reuses handles. The old stream's arena holds memory that came back
 * without an event on it (a thread's exit); a new stream with the same
 * handle must not inherit it: its first use compares stream ids and starts
 * a new stream arena. (Same handle, same arena, reused at once, was the
 * old behaviour: the simulator now reuses handles as CUDA does.) */
static void a_recycled_handle_starts_a_new_stream_arena(void **state) {
  sa_fixture *f = *state;
  sa_stream old = new_stream(SA_HOST_MANUAL);
  worker_arg w = {f->arena, old, {0}};
  run_thread(use_then_exit, &w);
  size_t streams = stats(f->arena).streams;
  sa_assert_ok(sa_host_stream_destroy(old));
  sa_stream fresh = new_stream(SA_HOST_MANUAL);
  assert_ptr_equal(fresh, old); /* the simulator hands the handle on */
  void *q;
  sa_assert_ok(sa_alloc(f->arena, &q, 4 * KiB, fresh));
  assert_ptr_not_equal(q, w.foreign[0]);
  assert_int_equal(stats(f->arena).streams, streams); /* the old one is gone */
  sa_assert_ok(sa_free(q, fresh));
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_stream_release(f->arena, fresh));
  sa_assert_ok(sa_host_stream_destroy(fresh));
  sa_assert_ok(sa_trim(f->arena, 0));
  assert_int_equal(stats(f->arena).reserved_bytes, 0);
}

/* CUDA gives a destroyed stream's handle to the next stream created at once,
 * while the old stream's work still runs (H200: 20 of 20), and a thread's
 * cache knows a stream by its handle (checking the driver's id on each call
 * would cost ~18 ns, the fast path's whole cost). So the rule (README,
 * "Threads and streams"): a stream whose queued work still uses memory
 * allocated or freed on it is synchronized or released before it is
 * destroyed. Kept, the next stream with its handle, on this same thread,
 * gets nothing still in use: small blocks and spans, after a release and
 * after a synchronize. */
static void a_recycled_handle_on_the_same_thread_after_the_rule(void **state) {
  sa_fixture *f = *state;
  const size_t sizes[2] = {4 * KiB, 3 * MiB};
  for (int k = 0; k < 4; k++) {
    sa_stream old = new_stream(SA_HOST_MANUAL);
    void *p;
    sa_assert_ok(sa_alloc(f->arena, &p, sizes[k % 2], old));
    sa_assert_ok(sa_host_fill(old, p, 4096, 0x0DDu)); /* still queued */
    sa_assert_ok(sa_free(p, old));
    if (k < 2)
      sa_assert_ok(sa_stream_release(f->arena, old)); /* waits for its work */
    else
      sa_assert_ok(sa_host_stream_drain(old)); /* the user synchronizes it */
    sa_assert_ok(sa_host_stream_destroy(old));
    sa_stream fresh = new_stream(SA_HOST_MANUAL);
    assert_ptr_equal(fresh, old); /* the handle comes back */
    void *q;
    sa_host_counters c0, c1;
    sa_host_get_counters(&c0);
    sa_assert_ok(sa_alloc(f->arena, &q, sizes[k % 2], fresh));
    sa_assert_ok(sa_host_fill(fresh, q, 4096, 0xF00Du));
    sa_assert_ok(sa_host_drain_all());
    sa_host_get_counters(&c1);
    assert_int_equal(c1.order_violations, c0.order_violations);
    sa_assert_ok(sa_free(q, fresh));
    sa_assert_ok(sa_stream_release(f->arena, fresh));
    sa_assert_ok(sa_host_stream_destroy(fresh));
  }
}

/* ---- sa_stream_release takes back what other threads cached ------------ */

typedef struct holder_arg_s {
  sa_arena *arena;
  sa_stream s;
  sem_t cached, released;
} holder_arg;

static void *cache_and_wait(void *arg) {
  holder_arg *h = arg;
  void *p[32];
  for (int i = 0; i < 32; i++) T_OK(sa_alloc(h->arena, &p[i], 64 * KiB, h->s));
  for (int i = 0; i < 32; i++) T_OK(sa_free(p[i], h->s)); /* some stay in the cache */
  sem_post(&h->cached);
  sem_wait(&h->released);
  /* The stream still lives: using it again starts from its new arena, to
   * which the same entry binds again; the next release finds it there. */
  for (int i = 0; i < 32; i++) T_OK(sa_alloc(h->arena, &p[i], 64 * KiB, h->s));
  for (int i = 0; i < 32; i++) T_OK(sa_free(p[i], h->s));
  sem_post(&h->cached);
  sem_wait(&h->released);
  return NULL;
}

/* Blocks another thread cached for a released stream stayed with that
 * thread until it next used the stream, out of reach of sa_trim. */
static void release_takes_back_what_other_threads_cached(void **state) {
  sa_fixture *f = *state;
  holder_arg h = {f->arena, new_stream(SA_HOST_AUTO), {{0}}, {{0}}};
  sem_init(&h.cached, 0, 0);
  sem_init(&h.released, 0, 0);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, cache_and_wait, &h), 0);
  for (int round = 0; round < 2; round++) {
    sem_wait(&h.cached);
    assert_true(stats(f->arena).reserved_bytes > 0);
    sa_assert_ok(sa_stream_release(f->arena, h.s));
    sa_assert_ok(sa_trim(f->arena, 0));
    assert_int_equal(stats(f->arena).reserved_bytes, 0);
    sem_post(&h.released);
  }
  assert_int_equal(pthread_join(t, NULL), 0);
  sa_assert_ok(sa_host_stream_destroy(h.s));
  sem_destroy(&h.cached);
  sem_destroy(&h.released);
}

/* ---- stream arenas of gone streams are freed ---------------------------- */

static size_t stream_arenas(sa_arena *a) {
  size_t n = 0;
  pthread_mutex_lock(&a->lock);
  for (sa_stream_arena *sa = a->streams.list; sa != NULL; sa = sa->next) n++;
  pthread_mutex_unlock(&a->lock);
  return n;
}

/* Every stream ever used kept its stream arena: lookups, reclaim and
 * statistics walked all of them. */
static void stream_arenas_of_gone_streams_are_freed(void **state) {
  sa_fixture *f = *state;
  for (int i = 0; i < 200; i++) {
    sa_stream s = new_stream(SA_HOST_AUTO);
    void *p;
    sa_assert_ok(sa_alloc(f->arena, &p, 16 * KiB, s));
    sa_assert_ok(sa_free(p, i % 2 ? s : f->streams[0]));
    if (i % 3 != 0) sa_assert_ok(sa_stream_release(f->arena, s));
    sa_assert_ok(sa_host_stream_destroy(s)); /* every third without a release */
  }
  assert_true(stream_arenas(f->arena) <= 8);
  sa_assert_ok(sa_trim(f->arena, 0));
  assert_true(stream_arenas(f->arena) <= 4);
  assert_int_equal(stats(f->arena).reserved_bytes, 0);
}

/* ---- out of memory settles every stream's pending frees ----------------- */

static void *cross_free_and_exit(void *arg) {
  worker_arg *w = arg;
  for (int i = 0; i < 8; i++) T_OK(sa_free(w->foreign[i], w->other));
  return NULL;
}

/* Blocks of stream A freed on B, B's work not run: the out-of-memory path
 * of a third stream could not force them (it waited only for events of
 * memory already free), and failed. Now its last attempt synchronizes the
 * device, after which every pending cross-stream free is free. */
static void out_of_memory_settles_other_streams_pending_frees(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1], c = new_stream(SA_HOST_MANUAL);
  worker_arg w = {f->arena, b, {0}};
  for (int i = 0; i < 8; i++) { /* the whole cap, in small blocks */
    sa_assert_ok(sa_alloc(f->arena, &w.foreign[i], MiB, a));
    sa_assert_ok(sa_host_fill(b, w.foreign[i], 4096, 0xB0B0B0B0u)); /* B uses them */
  }
  run_thread(cross_free_and_exit, &w);
  void *mine[8];
  for (int i = 0; i < 8; i++) {
    sa_assert_ok(sa_alloc(f->arena, &mine[i], MiB, c));
    sa_assert_ok(sa_host_fill(c, mine[i], 4096, 0xC0C0C0C0u));
  }
  assert_int_equal(sa_host_stream_pending(b), 0); /* the device sync ran it */
  for (int i = 0; i < 8; i++) sa_assert_ok(sa_free(mine[i], c));
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_stream_release(f->arena, c));
  sa_assert_ok(sa_host_stream_destroy(c));
}

/* ---- review: a span's recorded stream lets go of its stream arena ------- */

/* Freeing a span recorded on t bound t's stream arena (the marks of the
 * free span name it) and never let go: after t was released and destroyed
 * its stream arena could never be freed, one more per recorded stream. */
static void a_spans_recorded_stream_arena_is_freed_after_release(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0];
  void *p;
  sa_assert_ok(sa_alloc(f->arena, &p, 3 * MiB, a)); /* a's stream arena exists */
  sa_assert_ok(sa_free(p, a));
  size_t before = stream_arenas(f->arena);
  for (int i = 0; i < 4; i++) {
    sa_stream t = new_stream(SA_HOST_MANUAL);
    sa_assert_ok(sa_alloc(f->arena, &p, 3 * MiB, a));
    sa_assert_ok(sa_record_stream(p, t));
    sa_assert_ok(sa_free(p, a));
    sa_assert_ok(sa_host_drain_all());
    sa_assert_ok(sa_stream_release(f->arena, t));
    sa_assert_ok(sa_host_stream_destroy(t));
  }
  sa_assert_ok(sa_trim(f->arena, 0));
  sa_assert_ok(sa_trim(f->arena, 0)); /* the first unmaps the spans that name them */
  assert_int_equal(stream_arenas(f->arena), before);
}

/* ---- review: free spans let go of gone streams' arenas ------------------ */

enum { SPAN_STREAMS = 16 };
typedef struct span_streams_s {
  sa_arena *arena;
  sa_stream keep;
  void *apart[SPAN_STREAMS];
} span_streams;

/* Each stream frees a span that live ones of keep hold apart; every other
 * stream is destroyed unreleased. The thread exits: its cache holds none. */
static void *free_spans_on_own_streams(void *arg) {
  span_streams *w = arg;
  sa_stream s[SPAN_STREAMS];
  void *p[SPAN_STREAMS];
  for (int i = 0; i < SPAN_STREAMS; i++) {
    T_OK(sa_host_stream_create(SA_HOST_AUTO, &s[i]));
    T_OK(sa_alloc(w->arena, &p[i], 2 * MiB, s[i]));
    T_OK(sa_alloc(w->arena, &w->apart[i], 2 * MiB, w->keep));
  }
  for (int i = 0; i < SPAN_STREAMS; i++) {
    T_OK(sa_free(p[i], s[i]));
    if (i % 2 == 0) T_OK(sa_stream_release(w->arena, s[i]));
    T_OK(sa_host_stream_destroy(s[i]));
  }
  return NULL;
}

/* A stream that freed a span stays named by the free span's marks until
 * the span is reused or merged, though its work is done: reap kept its
 * stream arena, and walked every span for each one so kept at every later
 * stream's first use and release (1,000 of them: 10.6 ms per new stream,
 * 4,000: 357 ms). */
static void streams_that_freed_spans_are_freed_once_gone(void **state) {
  (void)state;
  span_streams w = {NULL, new_stream(SA_HOST_AUTO), {0}};
  sa_assert_ok(sa_fixture_arena_create(&w.arena, "backend=host"));
  run_thread(free_spans_on_own_streams, &w);
  /* New streams get the destroyed ones' handles: the unreleased ones are
   * found gone, their work done. */
  sa_stream s[SPAN_STREAMS];
  for (int i = 0; i < SPAN_STREAMS; i++) {
    void *p;
    s[i] = new_stream(SA_HOST_AUTO);
    sa_assert_ok(sa_alloc(w.arena, &p, 4 * KiB, s[i]));
    sa_assert_ok(sa_free(p, s[i]));
  }
  for (int i = 0; i < SPAN_STREAMS; i++) {
    sa_assert_ok(sa_stream_release(w.arena, s[i]));
    sa_assert_ok(sa_host_stream_destroy(s[i]));
  }
  assert_int_equal(stream_arenas(w.arena), 1); /* keep's */
  for (int i = 0; i < SPAN_STREAMS; i++) sa_assert_ok(sa_free(w.apart[i], w.keep));
  sa_assert_ok(sa_stream_release(w.arena, w.keep));
  sa_assert_ok(sa_host_stream_destroy(w.keep));
  sa_assert_ok(sa_arena_destroy(w.arena));
}

/* ---- review: release hands back batches parked on the stream ------------ */

/* Blocks of A freed on B by a thread that then exits: its exit may not
 * record an event on B, so the batch is parked on B. sa_stream_release(B)
 * waited for B's work, so the batch is clean: it must go home at once
 * ("sa_stream_release hands them back at once"), not wait, parked on a gone
 * stream arena, for a device-wide synchronize. */
static void release_hands_back_batches_parked_by_an_exited_thread(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = new_stream(SA_HOST_MANUAL);
  worker_arg w = {f->arena, b, {0}};
  for (int i = 0; i < 8; i++) sa_assert_ok(sa_alloc(f->arena, &w.foreign[i], MiB, a)); /* the cap */
  run_thread(cross_free_and_exit, &w); /* parked on B */
  sa_assert_ok(sa_stream_release(f->arena, b));
  sa_assert_ok(sa_host_stream_destroy(b));
  uint64_t syncs = sa_host_call_count(SA_HOST_FN_DEVICE_SYNCHRONIZE);
  void *q[8];
  for (int i = 0; i < 8; i++) sa_assert_ok(sa_alloc(f->arena, &q[i], MiB, a));
  assert_int_equal(sa_host_call_count(SA_HOST_FN_DEVICE_SYNCHRONIZE), syncs);
  for (int i = 0; i < 8; i++) sa_assert_ok(sa_free(q[i], a));
  assert_int_equal(stats(f->arena).deferred_frees, 0);
}

/* ---- review: a batch that reaches a gone stream arena is looked at again */

/* One round of a training loop's hand-off: a block of a short-lived
 * stream t, used on b, is freed on b after t was released and destroyed;
 * b's next slow call sends it home behind an event on b, not complete
 * yet. */
static void hand_off_to_a_gone_stream(sa_arena *arena, sa_stream b, uint32_t round) {
  sa_stream t = new_stream(SA_HOST_AUTO);
  void *p, *q;
  sa_assert_ok(sa_alloc(arena, &p, 64 * KiB, t));
  sa_assert_ok(sa_host_fill(b, p, 4096, round)); /* b uses it */
  sa_assert_ok(sa_stream_release(arena, t));
  sa_assert_ok(sa_host_stream_destroy(t));
  sa_assert_ok(sa_free(p, b));
  sa_assert_ok(sa_alloc(arena, &q, 2 * MiB, b)); /* sends the batch on */
  sa_assert_ok(sa_free(q, b));
  sa_assert_ok(sa_host_stream_drain(b)); /* its event completes */
}

/* The batch reached t's stream arena gone, drained once while b's event
 * was pending, and nothing looked at it again: t's stream arena, its
 * superblock and the event stayed until a reclaim, one more each round
 * (a training loop that makes a stream per step grew to the device's
 * memory, then synchronized it on the out-of-memory path). Now the next
 * new stream's reap looks again. */
static void batches_that_reach_gone_streams_do_not_pile_up(void **state) {
  (void)state;
  sa_arena *arena;
  sa_assert_ok(sa_fixture_arena_create(&arena, "backend=host"));
  sa_stream b = new_stream(SA_HOST_MANUAL);
  /* b's timeline records its span frees in a ring of SA_TIMELINE_EVENTS
   * events (timeline.c): full after as many rounds, then steady. */
  uint32_t round = 0;
  while (round < SA_TIMELINE_EVENTS + 1) hand_off_to_a_gone_stream(arena, b, round++);
  size_t arenas = stream_arenas(arena);
  sa_stats first = stats(arena);
  while (round < SA_TIMELINE_EVENTS + 21) hand_off_to_a_gone_stream(arena, b, round++);
  sa_stats last = stats(arena);
  assert_int_equal(stream_arenas(arena), arenas);
  assert_int_equal(last.deferred_frees, first.deferred_frees);
  assert_int_equal(last.events_in_flight, first.events_in_flight);
  assert_int_equal(last.superblocks_total, first.superblocks_total);
  sa_assert_ok(sa_stream_release(arena, b));
  sa_assert_ok(sa_host_stream_destroy(b));
  sa_assert_ok(sa_arena_destroy(arena));
}

/* ---- review: releasing a recycled handle is not the old stream's -------- */

/* A span recorded on `old`, freed on A: its free span waits for a mark on
 * old. old is destroyed (legal: the span was freed) with its fill still
 * queued, and fresh gets its handle. sa_stream_release(fresh) found old's
 * stream arena by handle, synchronized fresh and marked old's synced: the
 * span went to B without a wait on old's unfinished fill. */
static void releasing_a_recycled_handle_does_not_settle_the_old_stream(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1], old = new_stream(SA_HOST_MANUAL);
  void *p, *q;
  sa_assert_ok(sa_alloc(f->arena, &p, 3 * MiB, a));
  sa_assert_ok(sa_record_stream(p, old));
  sa_assert_ok(sa_host_fill(old, p, 4096, 0x0DDu)); /* still queued */
  sa_assert_ok(sa_free(p, a));
  sa_assert_ok(sa_host_stream_drain(a));
  sa_assert_ok(sa_host_stream_destroy(old));
  sa_stream fresh = new_stream(SA_HOST_MANUAL);
  assert_ptr_equal(fresh, old); /* the handle comes back */
  sa_assert_ok(sa_stream_release(f->arena, fresh)); /* fresh never used */
  sa_host_counters c0, c1;
  sa_host_get_counters(&c0);
  sa_assert_ok(sa_alloc(f->arena, &q, 3 * MiB, b));
  sa_host_get_counters(&c1);
  assert_ptr_equal(q, p);
  assert_int_equal(c1.order_violations, c0.order_violations);
  sa_assert_ok(sa_free(q, b));
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_stream_release(f->arena, fresh));
  sa_assert_ok(sa_host_stream_destroy(fresh));
}

/* The rule covers memory allocated on the stream too. A small block used
 * on its own stream, recorded there and freed on another goes back to its
 * stream's arena: at once after a release of the freeing stream, or behind
 * that stream's event (drained here), and its arena hands it out again in
 * its stream's order. A new stream with the old handle stands in for that
 * stream on this thread: destroyed with the fill still queued, the next
 * stream got the block while the fill ran (the fuzzer's find, against the
 * rule as it read: "memory freed on it"). Synchronized first, nothing. */
static void a_recycled_handle_after_the_rule_for_memory_allocated_on_it(void **state) {
  sa_fixture *f = *state;
  sa_stream b = f->streams[1];
  for (int k = 0; k < 2; k++) {
    sa_stream old = new_stream(SA_HOST_MANUAL);
    void *p, *q, *r;
    sa_assert_ok(sa_alloc(f->arena, &p, 768 * KiB, old)); /* a refill of one block */
    sa_assert_ok(sa_host_fill(old, p, 4096, 0x0DDu));     /* still queued */
    sa_assert_ok(sa_record_stream(p, old));
    sa_assert_ok(sa_free(p, b));
    if (k == 0) {
      sa_assert_ok(sa_stream_release(f->arena, b)); /* p back to old's arena at once */
    } else {
      sa_assert_ok(sa_alloc(f->arena, &r, 256, b)); /* p's batch goes, behind an event */
      sa_assert_ok(sa_free(r, b));
      sa_assert_ok(sa_host_stream_drain(b));
    }
    sa_assert_ok(sa_host_stream_drain(old)); /* the rule: old allocated p */
    sa_assert_ok(sa_host_stream_destroy(old));
    sa_stream fresh = new_stream(SA_HOST_MANUAL);
    assert_ptr_equal(fresh, old); /* the handle comes back */
    sa_host_counters c0, c1;
    sa_host_get_counters(&c0);
    sa_assert_ok(sa_alloc(f->arena, &q, 768 * KiB, fresh));
    sa_assert_ok(sa_host_fill(fresh, q, 4096, 0xF00Du));
    sa_assert_ok(sa_host_drain_all());
    sa_host_get_counters(&c1);
    assert_int_equal(c1.order_violations, c0.order_violations);
    sa_assert_ok(sa_free(q, fresh));
    sa_assert_ok(sa_host_drain_all());
    sa_assert_ok(sa_stream_release(f->arena, fresh));
    sa_assert_ok(sa_host_stream_destroy(fresh));
  }
}

/* ---- review: the live index and the gone list follow every path -------- */

static size_t live_buckets(const sa_arena *a) {
  return a->streams.live_index.heads != NULL ? sa__chain_buckets(&a->streams.live_index) : 0;
}

/* Under the arena lock: the list is doubly linked; each live stream arena
 * is in the live index (live_index.n of them), each gone one on the gone list
 * (streams.xgone of them), and nothing else is on either. */
static void check_stream_lists(sa_arena *a) {
  pthread_mutex_lock(&a->lock);
  size_t live = 0, gone = 0, on_gone_list = 0, indexed = 0;
  for (sa_stream_arena *sa = a->streams.list, *prev = NULL; sa != NULL; prev = sa, sa = sa->next) {
    assert_ptr_equal(sa->prev, prev);
    bool is_gone = atomic_load(&sa->xgone);
    bool found = false;
    for (size_t b = 0; b < live_buckets(a); b++)
      for (sa_chain_link *l = a->streams.live_index.heads[b]; l != NULL; l = l->next)
        found |= l == &sa->live_link;
    bool listed = false;
    for (sa_stream_arena *x = a->streams.gone; x != NULL; x = x->gone_next) listed |= x == sa;
    assert_int_equal(found, !is_gone);
    assert_int_equal(listed, is_gone);
    live += !is_gone;
    gone += is_gone;
  }
  for (size_t b = 0; b < live_buckets(a); b++)
    for (sa_chain_link *l = a->streams.live_index.heads[b]; l != NULL; l = l->next) indexed++;
  for (sa_stream_arena *x = a->streams.gone; x != NULL; x = x->gone_next) on_gone_list++;
  assert_int_equal(indexed, live);
  assert_int_equal(a->streams.live_index.n, live);
  assert_int_equal(on_gone_list, gone);
  assert_int_equal(atomic_load(&a->streams.xgone), gone);
  pthread_mutex_unlock(&a->lock);
}

/* Streams released, destroyed unreleased (their handles reused: found gone
 * by a lookup or by a release), and released while blocks of theirs live. */
static void live_index_and_gone_list_follow_every_way_to_go(void **state) {
  sa_fixture *f = *state;
  sa_stream k = f->streams[0];
  void *held[3] = {NULL, NULL, NULL};
  for (int i = 0; i < 120; i++) {
    sa_stream s = new_stream(SA_HOST_AUTO);
    void *p;
    sa_assert_ok(sa_alloc(f->arena, &p, 16 * KiB, s));
    check_stream_lists(f->arena);
    switch (i % 4) {
    case 0: /* unreleased: the next stream may take its handle */
      sa_assert_ok(sa_free(p, s));
      sa_assert_ok(sa_host_drain_all());
      break;
    case 1:
      sa_assert_ok(sa_free(p, s));
      sa_assert_ok(sa_stream_release(f->arena, s));
      break;
    case 2: /* gone while a block of it lives: not freed yet */
      if (held[i % 3] != NULL) sa_assert_ok(sa_free(held[i % 3], k));
      held[i % 3] = p;
      sa_assert_ok(sa_host_drain_all());
      sa_assert_ok(sa_stream_release(f->arena, s));
      break;
    default: { /* unreleased, then its handle released as a new stream's */
      sa_assert_ok(sa_free(p, s));
      sa_assert_ok(sa_host_drain_all());
      sa_assert_ok(sa_host_stream_destroy(s));
      s = new_stream(SA_HOST_AUTO);
      sa_assert_ok(sa_stream_release(f->arena, s));
      break;
    }
    }
    check_stream_lists(f->arena);
    sa_assert_ok(sa_host_stream_destroy(s));
  }
  for (int i = 0; i < 3; i++)
    if (held[i] != NULL) sa_assert_ok(sa_free(held[i], k));
  sa_assert_ok(sa_host_drain_all());
  sa_assert_ok(sa_trim(f->arena, 0));
  check_stream_lists(f->arena);
  assert_true(stream_arenas(f->arena) <= 4);
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(exit_after_destroying_its_stream_touches_no_stream),
      T(exit_with_an_open_batch_drops_nothing_when_records_fail),
      T(evicted_entries_touch_no_destroyed_stream),
      T(a_thread_on_twenty_streams_keeps_every_entry),
      T(a_recycled_handle_starts_a_new_stream_arena),
      T(a_recycled_handle_on_the_same_thread_after_the_rule),
      T(release_takes_back_what_other_threads_cached),
      T(stream_arenas_of_gone_streams_are_freed),
      T(out_of_memory_settles_other_streams_pending_frees),
      T(a_spans_recorded_stream_arena_is_freed_after_release),
      T(streams_that_freed_spans_are_freed_once_gone),
      T(release_hands_back_batches_parked_by_an_exited_thread),
      T(batches_that_reach_gone_streams_do_not_pile_up),
      T(releasing_a_recycled_handle_does_not_settle_the_old_stream),
      T(a_recycled_handle_after_the_rule_for_memory_allocated_on_it),
      T(live_index_and_gone_list_follow_every_way_to_go),
  };
#undef T
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  printf("stream_lifetime: cases %zu, failures %d\n", sizeof tests / sizeof tests[0], failed);
  return failed;
}
