/* Validators (the sa__*_check functions, SA_VALIDATE in base/base.h) can
 * fail: each case builds a real structure through the API on the host
 * simulator, breaks one rule of it on purpose in a forked child, and runs
 * the validator there; the child must die of SIGABRT, its stderr naming the
 * structure and the rule. The parent's copy stays whole and is torn down
 * as usual. The last cases break a structure and then make an ordinary
 * call (a free, sa_trim, sa_snapshot_write, sa_arena_destroy): the call
 * sites run their validators.
 *
 * No case starts a thread, so the child is a copy of a single-threaded
 * process under every sanitizer (ThreadSanitizer refuses little after a
 * fork, but a child of a multi-threaded process may not start threads). */
#include <setjmp.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "fixture.h"

#include "internal.h"
#include "test/util.h"

/* ---- the death test --------------------------------------------------------- */

typedef void (*breaker)(sa_fixture *f, void *arg);

/* Run brk(f, arg) in a forked child with its stderr into a pipe: the child
 * must die of SIGABRT, and say "invariant broken: <structure>: <rule>". */
static void expect_broken(sa_fixture *f, breaker brk, void *arg, const char *structure,
                          const char *rule) {
  if (!SA_INVARIANTS) skip(); /* a release build (NDEBUG) has no validators */
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], STDERR_FILENO);
    close(fds[1]);
    brk(f, arg);
    _exit(0); /* the validator let it pass: no abort, no teardown */
  }
  close(fds[1]);
  char out[4096];
  size_t n = 0;
  ssize_t got;
  while ((got = read(fds[0], out + n, sizeof out - 1 - n)) > 0) n += (size_t)got;
  out[n] = '\0';
  close(fds[0]);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  char want[512];
  snprintf(want, sizeof want, "streamarena: invariant broken: %s: %s (", structure, rule);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT || strstr(out, want) == NULL)
    fail_msg("wanted SIGABRT and \"%s\"; the child %s %d, its stderr:\n%s", want,
             WIFSIGNALED(status) ? "died of signal" : "exited with",
             WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), out);
}

/* ---- structures built through the API ------------------------------------------ */

static void setup(sa_fixture *f) {
  /* Spans freed through the arena, not kept by the thread: the states
   * below are of its free spans and their marks. */
  sa_assert_ok(sa_fixture_setup(f, "keep_spans=0", 2, SA_HOST_MANUAL));
}

static void teardown(sa_fixture *f) { sa_assert_ok(sa_fixture_teardown(f)); }

static sa_stream_arena *stream_arena_of(sa_arena *a, sa_stream s) {
  for (sa_stream_arena *sa = a->streams.list; sa != NULL; sa = sa->next)
    if (sa->stream == s && !sa__stream_arena_gone(sa)) return sa;
  return NULL;
}

/* The free span that holds p. */
static sa_span *free_span_at(sa_arena *a, void *p) {
  for (sa_run *r = a->spans.runs; r != NULL; r = r->next)
    for (sa_span *sp = r->first; sp != NULL; sp = sp->next)
      if ((uintptr_t)p - sp->base < sp->size) return sp;
  return NULL;
}

/* Eight small blocks on s, four of them freed and given back to their
 * superblock (sa_trim flushes the calling thread's cache): a superblock
 * whose free index stack holds blocks, carved in a slab. */
enum { BLOCKS = 8 };
static sa_superblock *small_blocks(sa_fixture *f, void **p) {
  sa_stream s = f->streams[0];
  for (int i = 0; i < BLOCKS; i++) sa_assert_ok(sa_alloc(f->arena, &p[i], 4096, s));
  for (int i = 0; i < BLOCKS / 2; i++) sa_assert_ok(sa_free(p[i], s));
  sa_assert_ok(sa_trim(f->arena, SIZE_MAX));
  sa_superblock *sb = (sa_superblock *)sa__pagemap_get(&f->arena->range, (uintptr_t)p[BLOCKS - 1]);
  assert_non_null(sb);
  assert_int_equal(sb->hdr.kind, SA_DESC_SUPERBLOCK);
  assert_true(sb->nfree > 0);
  return sb;
}

static void free_small_blocks(sa_fixture *f, void **p) {
  for (int i = BLOCKS / 2; i < BLOCKS; i++) sa_assert_ok(sa_free(p[i], f->streams[0]));
}

/* ---- superblocks ------------------------------------------------------------------ */

static void break_free_index_state(sa_fixture *f, void *arg) {
  sa_superblock *sb = arg;
  pthread_mutex_lock(&sb->owner->lock);
  atomic_store(&sb->state[sb->free_idx[0]], SA_BLOCK_LIVE);
  (void)sa__superblock_check(sb);
}

static void superblock_check_names_a_free_index_whose_block_is_in_use(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p[BLOCKS];
  sa_superblock *sb = small_blocks(&f, p);
  expect_broken(&f, break_free_index_state, sb, "superblock",
                "each block on the free index stack is SA_BLOCK_FREE");
  free_small_blocks(&f, p);
  teardown(&f);
}

static void break_used(sa_fixture *f, void *arg) {
  sa_superblock *sb = arg;
  pthread_mutex_lock(&sb->owner->lock);
  sb->used++;
  (void)sa__superblock_check(sb);
}

static void superblock_check_names_a_used_count_that_disagrees(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p[BLOCKS];
  sa_superblock *sb = small_blocks(&f, p);
  expect_broken(&f, break_used, sb, "superblock", "used + nfree == bump");
  free_small_blocks(&f, p);
  teardown(&f);
}

static void break_free_index_twice(sa_fixture *f, void *arg) {
  sa_superblock *sb = arg;
  pthread_mutex_lock(&sb->owner->lock);
  /* The same block twice, one fewer used: the counts still agree. */
  sb->free_idx[sb->nfree] = sb->free_idx[0];
  sb->nfree++;
  sb->used--;
  (void)sa__superblock_check(sb);
}

static void superblock_check_names_a_block_on_the_free_index_twice(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p[BLOCKS];
  sa_superblock *sb = small_blocks(&f, p);
  assert_true(sb->nfree < sb->capacity && sb->used > 0);
  expect_broken(&f, break_free_index_twice, sb, "superblock",
                "the free index stack holds a block once");
  free_small_blocks(&f, p);
  teardown(&f);
}

static void break_slab(sa_fixture *f, void *arg) {
  sa_slab *sl = arg;
  pthread_mutex_lock(&f->arena->lock);
  sl->ncarved++;
  (void)sa__slabs_check(f->arena);
}

static void slab_check_names_slot_counts_that_disagree(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p[BLOCKS];
  sa_superblock *sb = small_blocks(&f, p);
  assert_non_null(sb->slab); /* a stream's first superblock is smaller than a granule */
  expect_broken(&f, break_slab, sb->slab, "slab", "ncarved + nfree == nslots");
  free_small_blocks(&f, p);
  teardown(&f);
}

/* ---- spans --------------------------------------------------------------------- */

static void break_tiling(sa_fixture *f, void *arg) {
  pthread_mutex_lock(&f->arena->lock);
  sa__live_find(f->arena, (uintptr_t)arg)->size -= SA_SPAN_QUANTUM;
  (void)sa__span_check(f->arena);
}

static void span_check_names_a_gap_between_spans(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p, *q;
  sa_assert_ok(sa_alloc(f.arena, &p, 4 * MiB, f.streams[0]));
  sa_assert_ok(sa_alloc(f.arena, &q, 4 * MiB, f.streams[0]));
  expect_broken(&f, break_tiling, p, "span", "spans tile each run: no gap, no overlap");
  sa_assert_ok(sa_free(p, f.streams[0]));
  sa_assert_ok(sa_free(q, f.streams[0]));
  teardown(&f);
}

static void break_recorded_refs(sa_fixture *f, void *arg) {
  pthread_mutex_lock(&f->arena->lock);
  sa_span *sp = free_span_at(f->arena, arg);
  for (unsigned i = 0; i < sp->nmarks; i++)
    if (sp->marks[i].recorded != NULL) sp->marks[i].recorded->refs = 0;
  (void)sa__span_check(f->arena);
}

static void span_check_names_a_recorded_mark_without_refs(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p;
  sa_assert_ok(sa_alloc(f.arena, &p, 4 * MiB, f.streams[0]));
  sa_assert_ok(sa_record_stream(p, f.streams[1]));
  sa_assert_ok(sa_free(p, f.streams[0])); /* its event on streams[1] stays pending */
  sa_span *sp = free_span_at(f.arena, p);
  assert_non_null(sp);
  bool recorded = false;
  for (unsigned i = 0; i < sp->nmarks; i++) recorded |= sp->marks[i].recorded != NULL;
  assert_true(recorded);
  expect_broken(&f, break_recorded_refs, p, "span", "a recorded mark has refs > 0");
  teardown(&f);
}

/* ---- the free-span index ------------------------------------------------------------ */

/* The root of the first bin of the fit index that holds a span. */
static sa_treap_node **first_bin(sa_arena *a) {
  for (unsigned b = 0; b < SA_FIT_BINS; b++)
    if (a->spans.fit.bins[b] != NULL) return &a->spans.fit.bins[b];
  return NULL;
}

static void break_heap_order(sa_fixture *f, void *arg) {
  (void)arg;
  pthread_mutex_lock(&f->arena->lock);
  sa_treap_node *root = *first_bin(f->arena);
  sa_treap_node *child = root->left != NULL ? root->left : root->right;
  child->prio = UINT64_MAX; /* above its parent's (a hash, never all ones here) */
  (void)sa__fit_check(f->arena);
}

static void free_span_treap_check_names_a_child_above_its_parent(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p[5];
  for (int i = 0; i < 5; i++) sa_assert_ok(sa_alloc(f.arena, &p[i], 4 * MiB, f.streams[0]));
  for (int i = 0; i < 5; i += 2) sa_assert_ok(sa_free(p[i], f.streams[0])); /* apart */
  sa_treap_node **bin = first_bin(f.arena); /* three spans of one size: one bin */
  assert_non_null(bin);
  assert_true((*bin)->left != NULL || (*bin)->right != NULL);
  assert_true((*bin)->prio != UINT64_MAX);
  expect_broken(&f, break_heap_order, NULL, "free-span index", "heap order on prio");
  for (int i = 1; i < 5; i += 2) sa_assert_ok(sa_free(p[i], f.streams[0]));
  teardown(&f);
}

static void break_bin_bit(sa_fixture *f, void *arg) {
  (void)arg;
  pthread_mutex_lock(&f->arena->lock);
  unsigned b = (unsigned)(first_bin(f->arena) - f->arena->spans.fit.bins);
  f->arena->spans.fit.nonempty[b / 64] &= ~((uint64_t)1 << (b % 64)); /* searches skip it */
  (void)sa__fit_check(f->arena);
}

static void break_bin(sa_fixture *f, void *arg) {
  sa_span *sp = arg;
  pthread_mutex_lock(&f->arena->lock);
  sp->size *= 2; /* in the bin of its old size, where no search for its new one looks */
  (void)sa__fit_check(f->arena);
}

/* The bins' own rules: a bin's bit says whether it holds any span, and a
 * span is in the bin of its size. */
static void free_span_index_check_names_a_bin_out_of_step(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p[3];
  for (int i = 0; i < 3; i++) sa_assert_ok(sa_alloc(f.arena, &p[i], 4 * MiB, f.streams[0]));
  sa_assert_ok(sa_free(p[0], f.streams[0])); /* apart from the run's free top */
  assert_non_null(first_bin(f.arena));
  expect_broken(&f, break_bin_bit, NULL, "free-span index",
                "a bin's bit is set when it holds a span");
  sa_span *sp = free_span_at(f.arena, p[0]);
  assert_non_null(sp);
  expect_broken(&f, break_bin, sp, "free-span index", "a span is in the bin of its size");
  for (int i = 1; i < 3; i++) sa_assert_ok(sa_free(p[i], f.streams[0]));
  teardown(&f);
}

static void check_fit_index(sa_fixture *f, void *arg) {
  (void)f;
  (void)sa__fit_check(arg);
}

/* A treap whose keys follow its priorities is a path: the treap a bin of
 * the fit index would be if it ignored priorities and spans came in key
 * order (their sizes all in one bin). No field is wrong here, only the
 * depth. */
static void free_span_treap_check_names_a_treap_too_deep(void **state) {
  (void)state;
  enum { N = 64 };
  sa_arena *a = sa__zalloc_aligned(sizeof *a, _Alignof(sa_arena)); /* as arena.c makes one */
  sa_span *sp = calloc(N, sizeof *sp);
  sa_span **by_prio = calloc(N, sizeof *by_prio);
  assert_non_null(a);
  assert_non_null(sp);
  assert_non_null(by_prio);
  for (size_t i = 0; i < N; i++) {
    sp[i].base = ((uintptr_t)1 << 40) + i * MiB;
    sp[i].size = MiB;
    sa__fit_insert(a, &sp[i]); /* sets its priority */
    sa__fit_remove(a, &sp[i]);
    size_t k = i; /* insertion sort, highest priority first */
    while (k > 0 && by_prio[k - 1]->fit.prio < sp[i].fit.prio) {
      by_prio[k] = by_prio[k - 1];
      k--;
    }
    by_prio[k] = &sp[i];
  }
  for (size_t k = 0; k < N; k++) by_prio[k]->size = 64 * MiB + k * SA_SPAN_QUANTUM;
  for (size_t i = 0; i < N; i++) sa__fit_insert(a, &sp[i]);
  expect_broken(NULL, check_fit_index, a, "free-span index", "depth at most 4 log2 n");
  free(by_prio);
  free(sp);
  free(a);
}

/* ---- timelines ------------------------------------------------------------------- */

static void break_timeline(sa_fixture *f, void *arg) {
  sa_stream_arena *sa = arg;
  pthread_mutex_lock(&f->arena->lock);
  sa->timeline.ticket[2] = sa->timeline.ticket[1];
  sa__timeline_check(sa);
}

static void timeline_check_names_two_slots_with_one_ticket(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p;
  sa_fixture_stream_takes_a_span(f.arena, f.streams[1]); /* streams[0] is not alone */
  sa_assert_ok(sa_alloc(f.arena, &p, 4 * MiB, f.streams[0]));
  sa_assert_ok(sa_free(p, f.streams[0])); /* ticket 1 of streams[0]'s timeline */
  sa_stream_arena *sa = stream_arena_of(f.arena, f.streams[0]);
  assert_non_null(sa);
  assert_int_equal(sa->timeline.ticket[1], 1);
  expect_broken(&f, break_timeline, sa, "timeline", "slots hold distinct tickets");
  teardown(&f);
}

/* A span pair on streams[0], then a free that records no event: the
 * pending ticket, on *pending; *other: another free span, kept apart by
 * two live ones, which the caller frees. The stream's first frees record
 * (it has not retaken one yet, and is not alone: streams[1] takes spans). */
static sa_stream_arena *pending_free(sa_fixture *f, void **pending, void **other, void **live) {
  sa_stream s = f->streams[0];
  void *p;
  sa_fixture_stream_takes_a_span(f->arena, f->streams[1]);
  sa_assert_ok(sa_alloc(f->arena, &live[0], 4 * MiB, s));
  sa_assert_ok(sa_alloc(f->arena, other, 4 * MiB, s));
  sa_assert_ok(sa_alloc(f->arena, &live[1], 4 * MiB, s));
  sa_assert_ok(sa_free(*other, s));
  sa_assert_ok(sa_alloc(f->arena, &p, 8 * MiB, s));
  sa_assert_ok(sa_free(p, s));
  sa_assert_ok(sa_alloc(f->arena, pending, 8 * MiB, s)); /* retaken */
  assert_ptr_equal(*pending, p);
  sa_assert_ok(sa_free(*pending, s)); /* no event */
  sa_stream_arena *sa = stream_arena_of(f->arena, s);
  assert_non_null(sa);
  assert_int_not_equal(sa->timeline.pending, 0);
  assert_ptr_equal(sa->timeline.pending_span, free_span_at(f->arena, *pending));
  assert_ptr_not_equal(free_span_at(f->arena, *other), free_span_at(f->arena, *pending));
  return sa;
}

static void break_pending_span(sa_fixture *f, void *arg) {
  sa_stream_arena *sa = arg;
  pthread_mutex_lock(&f->arena->lock);
  sa->timeline.pending_span = NULL;
  sa__timeline_check(sa);
}

static void timeline_check_names_a_pending_ticket_without_its_span(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p, *q, *live[2];
  sa_stream_arena *sa = pending_free(&f, &p, &q, live);
  expect_broken(&f, break_pending_span, sa, "timeline",
                "the pending ticket has its span, or earlier ones are pending too");
  for (int i = 0; i < 2; i++) sa_assert_ok(sa_free(live[i], f.streams[0]));
  teardown(&f);
}

typedef struct moved_s {
  sa_stream_arena *sarena;
  void *to;
} moved;

static void break_pending_moved(sa_fixture *f, void *arg) {
  moved *m = arg;
  pthread_mutex_lock(&f->arena->lock);
  m->sarena->timeline.pending_span = free_span_at(f->arena, m->to);
  (void)sa__span_check(f->arena);
}

static void span_check_names_a_pending_mark_off_its_pending_span(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p, *q, *live[2];
  moved m = {pending_free(&f, &p, &q, live), NULL};
  m.to = q;
  expect_broken(&f, break_pending_moved, &m, "span",
                "a pending mark is on its stream's pending span only");
  for (int i = 0; i < 2; i++) sa_assert_ok(sa_free(live[i], f.streams[0]));
  teardown(&f);
}

static void break_nholders(sa_fixture *f, void *arg) {
  (void)arg;
  pthread_mutex_lock(&f->arena->lock);
  f->arena->spans.nholders++;
  (void)sa__span_check(f->arena);
}

static void break_ntakers(sa_fixture *f, void *arg) {
  (void)arg;
  pthread_mutex_lock(&f->arena->lock);
  f->arena->spans.ntakers--; /* as if a stream that takes spans were alone */
  (void)sa__span_check(f->arena);
}

static void span_check_names_a_taker_count_that_disagrees(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  sa_fixture_stream_takes_a_span(f.arena, f.streams[0]);
  sa_fixture_stream_takes_a_span(f.arena, f.streams[1]);
  assert_int_equal(f.arena->spans.ntakers, 2);
  expect_broken(&f, break_ntakers, NULL, "span",
                "spans.ntakers counts the stream arenas not gone that took a span");
  sa_assert_ok(sa_host_drain_all());
  teardown(&f);
}

/* A stream alone left more pending tickets apart than a record covers at
 * most: one of its frees did not record when it had to. */
static void break_pending_apart(sa_fixture *f, void *arg) {
  sa_stream_arena *sa = arg;
  pthread_mutex_lock(&f->arena->lock);
  sa->timeline.pending_apart = SA_LAZY_MARK_RUN + 1;
  sa__timeline_check(sa);
}

static void timeline_check_names_too_many_pending_tickets_apart(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  sa_stream s = f.streams[0];
  void *p[3];
  for (int i = 0; i < 3; i++) sa_assert_ok(sa_alloc(f.arena, &p[i], 4 * MiB, s));
  sa_assert_ok(sa_free(p[0], s)); /* alone: pending */
  sa_assert_ok(sa_free(p[2], s)); /* apart from it, pending too */
  sa_stream_arena *sa = stream_arena_of(f.arena, s);
  assert_non_null(sa);
  assert_int_equal(sa->timeline.pending_apart, 1);
  expect_broken(&f, break_pending_apart, sa, "timeline",
                "at most SA_LAZY_MARK_RUN pending tickets left apart before a record");
  sa_assert_ok(sa_free(p[1], s));
  sa_assert_ok(sa_host_drain_all());
  teardown(&f);
}

/* An orphan (large/kept.h) that is live again, as if its entry had handed
 * it out after it went: the memory would be the user's and the orphans'. */
static void break_orphan_state(sa_fixture *f, void *arg) {
  (void)arg;
  pthread_mutex_lock(&f->arena->lock);
  atomic_store(&f->arena->spans.orphans->xstate, SA_BLOCK_LIVE);
  (void)sa__span_orphans_check(f->arena);
}

static void orphans_check_names_an_orphan_handed_out(void **state) {
  (void)state;
  sa_fixture f;
  sa_assert_ok(sa_fixture_setup(&f, "keep_spans=1,exact_growth=1", 2, SA_HOST_MANUAL));
  void *p;
  sa_assert_ok(sa_alloc(f.arena, &p, 4 * MiB, f.streams[0]));
  sa_assert_ok(sa_free(p, f.streams[0])); /* kept: exact growth leaves nothing free beside it */
  sa_assert_ok(sa_defragment(f.arena));   /* names no stream: an orphan */
  assert_non_null(f.arena->spans.orphans);
  expect_broken(&f, break_orphan_state, NULL, "kept span", "an orphan is kept (SA_BLOCK_CACHED)");
  teardown(&f);
}

static void span_check_names_a_holder_count_that_disagrees(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p;
  sa_assert_ok(sa_alloc(f.arena, &p, 4 * MiB, f.streams[0]));
  assert_int_equal(f.arena->spans.nholders, 1);
  expect_broken(&f, break_nholders, NULL, "span",
                "spans.nholders counts the stream arenas with live spans");
  sa_assert_ok(sa_free(p, f.streams[0]));
  teardown(&f);
}

/* ---- the physical ledger ---------------------------------------------------------- */

static void break_cache_bytes(sa_fixture *f, void *arg) {
  (void)arg;
  pthread_mutex_lock(&f->arena->lock);
  f->arena->physical.cache_bytes -= f->arena->gran;
  (void)sa__physical_check(f->arena);
}

static void physical_check_names_a_chunk_cache_count_that_disagrees(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p;
  sa_assert_ok(sa_alloc(f.arena, &p, 4 * MiB, f.streams[0]));
  sa_assert_ok(sa_free(p, f.streams[0]));
  sa_assert_ok(sa_trim(f.arena, SIZE_MAX)); /* unmapped, kept in the chunk cache */
  assert_true(f.arena->physical.cache_bytes >= f.arena->gran);
  expect_broken(&f, break_cache_bytes, NULL, "physical ledger",
                "physical.cache_bytes is the sum of cached chunks");
  teardown(&f);
}

/* ---- stream arenas ----------------------------------------------------------------- */

static void break_nempty(sa_fixture *f, void *arg) {
  sa_stream_arena *sa = arg;
  pthread_mutex_lock(&sa->lock);
  sa->nempty++;
  (void)sa__stream_arena_check(sa);
}

static void stream_arena_check_names_an_empty_count_that_disagrees(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p;
  sa_assert_ok(sa_alloc(f.arena, &p, 4096, f.streams[0]));
  sa_assert_ok(sa_free(p, f.streams[0]));
  sa_stream_arena *sa = stream_arena_of(f.arena, f.streams[0]);
  assert_non_null(sa);
  expect_broken(&f, break_nempty, sa, "stream arena", "nempty is the length of the empty list");
  teardown(&f);
}

static void break_pending_blocks(sa_fixture *f, void *arg) {
  sa_stream_arena *sa = arg;
  pthread_mutex_lock(&sa->lock);
  sa->pending_blocks++;
  (void)sa__stream_arena_check(sa);
}

static void stream_arena_check_names_pending_blocks_that_disagree(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p;
  sa_assert_ok(sa_alloc(f.arena, &p, 4096, f.streams[0]));
  sa_assert_ok(sa_free(p, f.streams[0]));
  sa_stream_arena *sa = stream_arena_of(f.arena, f.streams[0]);
  assert_non_null(sa);
  expect_broken(&f, break_pending_blocks, sa, "stream arena",
                "pending_blocks counts the blocks in pending lanes");
  teardown(&f);
}

static void break_nsuperblocks(sa_fixture *f, void *arg) {
  sa_stream_arena *sa = arg;
  (void)sa__world_lock(f->arena);
  sa->nsuperblocks++; /* still at least what its lists hold */
  (void)sa__stream_arenas_check(f->arena);
}

static void stream_arenas_check_names_an_owned_count_that_disagrees(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p;
  sa_assert_ok(sa_alloc(f.arena, &p, 4096, f.streams[0]));
  sa_stream_arena *sa = stream_arena_of(f.arena, f.streams[0]);
  assert_non_null(sa);
  assert_int_equal(sa->nsuperblocks, 1);
  expect_broken(&f, break_nsuperblocks, sa, "stream arena",
                "nsuperblocks counts the superblocks owned here");
  sa_assert_ok(sa_free(p, f.streams[0]));
  teardown(&f);
}

/* ---- call sites: ordinary calls run the validators --------------------------------- */

typedef enum call_e { CALL_FREE, CALL_TRIM, CALL_SNAPSHOT, CALL_DESTROY } call;
typedef struct broken_call_s {
  call what;
  void *p; /* CALL_FREE: the span freed */
} broken_call;

/* spans.free_bytes off by a quantum, then the call. */
static void break_then_call(sa_fixture *f, void *arg) {
  broken_call *c = arg;
  pthread_mutex_lock(&f->arena->lock);
  f->arena->spans.free_bytes += SA_SPAN_QUANTUM;
  pthread_mutex_unlock(&f->arena->lock);
  FILE *null = fopen("/dev/null", "w");
  switch (c->what) {
    case CALL_FREE: (void)sa_free(c->p, f->streams[0]); break;
    case CALL_TRIM: (void)sa_trim(f->arena, SIZE_MAX); break;
    case CALL_SNAPSHOT: (void)sa_snapshot_write(f->arena, null); break;
    case CALL_DESTROY: (void)sa_arena_destroy(f->arena); break;
  }
}

static void ordinary_calls_run_the_span_validator(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p, *q;
  sa_assert_ok(sa_alloc(f.arena, &p, 4 * MiB, f.streams[0]));
  sa_assert_ok(sa_alloc(f.arena, &q, 4 * MiB, f.streams[0]));
  sa_assert_ok(sa_free(q, f.streams[0])); /* a free span */
  const call calls[] = {CALL_FREE, CALL_TRIM, CALL_SNAPSHOT, CALL_DESTROY};
  for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
    broken_call c = {calls[i], p};
    expect_broken(&f, break_then_call, &c, "span", "spans.free_bytes is the sum of free spans");
  }
  sa_assert_ok(sa_free(p, f.streams[0]));
  teardown(&f);
}

/* ---- graph pools -------------------------------------------------------------- */

/* A pool with a live block and a free rest of its segment. */
static sa_pool *pool_with_a_block(sa_fixture *f, void **p) {
  sa_pool *pool;
  sa_assert_ok(sa_pool_create(f->arena, &pool));
  sa_assert_ok(sa_pool_alloc(pool, p, 4096, f->streams[0]));
  return pool;
}

static void pool_done(sa_fixture *f, sa_pool *pool, void *p) {
  sa_assert_ok(sa_free(p, f->streams[0]));
  sa_assert_ok(sa_pool_release(pool, f->streams[0]));
}

static void break_pool_live_bytes(sa_fixture *f, void *arg) {
  (void)f;
  sa_pool *pool = arg;
  pthread_mutex_lock(&pool->lock);
  pool->live_bytes += SA_POOL_ALIGN;
  (void)sa__pool_check(pool);
}

static void pool_check_names_live_counts_that_disagree(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p;
  sa_pool *pool = pool_with_a_block(&f, &p);
  expect_broken(&f, break_pool_live_bytes, pool, "pool", "the live counts are the live blocks'");
  pool_done(&f, pool, p);
  teardown(&f);
}

/* Two free neighbours that could be one: sa_trim's world check finds it. */
static void break_pool_split_free_block(sa_fixture *f, void *arg) {
  sa_pool *pool = arg;
  pthread_mutex_lock(&pool->lock);
  sa_pblock *rest = pool->segs->first->next; /* the free rest after the block */
  sa_pblock *cut = sa__pool_carve(pool, rest, rest->base + SA_POOL_ALIGN, SA_POOL_ALIGN, 1,
                                  f->streams[0]);
  cut->state = SA_PBLOCK_FREE; /* freed without a merge: */
  pool->nlive--;
  pool->live_bytes -= cut->size;
  pool->live_requested -= 1;
  pthread_mutex_unlock(&pool->lock);
  (void)sa_trim(f->arena, 0);
}

static void ordinary_calls_run_the_pool_validator(void **state) {
  (void)state;
  sa_fixture f;
  setup(&f);
  void *p;
  sa_pool *pool = pool_with_a_block(&f, &p);
  expect_broken(&f, break_pool_split_free_block, pool, "pool",
                "no two neighbouring free blocks could merge");
  pool_done(&f, pool, p);
  teardown(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(superblock_check_names_a_free_index_whose_block_is_in_use),
      cmocka_unit_test(superblock_check_names_a_used_count_that_disagrees),
      cmocka_unit_test(superblock_check_names_a_block_on_the_free_index_twice),
      cmocka_unit_test(slab_check_names_slot_counts_that_disagree),
      cmocka_unit_test(span_check_names_a_gap_between_spans),
      cmocka_unit_test(span_check_names_a_recorded_mark_without_refs),
      cmocka_unit_test(free_span_treap_check_names_a_child_above_its_parent),
      cmocka_unit_test(free_span_index_check_names_a_bin_out_of_step),
      cmocka_unit_test(free_span_treap_check_names_a_treap_too_deep),
      cmocka_unit_test(timeline_check_names_two_slots_with_one_ticket),
      cmocka_unit_test(timeline_check_names_a_pending_ticket_without_its_span),
      cmocka_unit_test(span_check_names_a_pending_mark_off_its_pending_span),
      cmocka_unit_test(span_check_names_a_holder_count_that_disagrees),
      cmocka_unit_test(span_check_names_a_taker_count_that_disagrees),
      cmocka_unit_test(timeline_check_names_too_many_pending_tickets_apart),
      cmocka_unit_test(orphans_check_names_an_orphan_handed_out),
      cmocka_unit_test(physical_check_names_a_chunk_cache_count_that_disagrees),
      cmocka_unit_test(stream_arena_check_names_an_empty_count_that_disagrees),
      cmocka_unit_test(stream_arena_check_names_pending_blocks_that_disagree),
      cmocka_unit_test(stream_arenas_check_names_an_owned_count_that_disagrees),
      cmocka_unit_test(ordinary_calls_run_the_span_validator),
      cmocka_unit_test(pool_check_names_live_counts_that_disagree),
      cmocka_unit_test(ordinary_calls_run_the_pool_validator),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
