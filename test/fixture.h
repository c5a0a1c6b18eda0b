/* Shared test fixture: an arena on the host simulator with its own streams,
 * torn down with a leak check.
 *
 *   static int setup(void **state) { return sa_fixture_cmocka_setup(state); }
 *   ...
 *   cmocka_unit_test_setup_teardown(my_test, sa_fixture_cmocka_setup,
 *                                   sa_fixture_cmocka_teardown)
 *   ...
 *   static void my_test(void **state) {
 *     sa_fixture *f = *state;
 *     void *p;
 *     sa_assert_ok(sa_alloc(f->arena, &p, 4096, f->streams[0]));
 *     ...
 *   }
 *
 * Owns the arena and the streams it made; calls the public API and host.h
 * only, so it tests the library the way users see it. */
#ifndef SA_TEST_FIXTURE_H
#define SA_TEST_FIXTURE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "test/util.h"

#define SA_FIXTURE_MAX_STREAMS 8

typedef struct sa_fixture_s {
  sa_arena *arena;
  sa_stream streams[SA_FIXTURE_MAX_STREAMS];
  size_t stream_count;
  sa_host_counters before; /* the simulator's state before setup */
  /* Stream-order violations the test provokes on purpose; teardown fails if
   * the checker found any other. */
  uint64_t expected_violations;
} sa_fixture;

/* Create an arena with "backend=host,check_stream_order=1" plus spec
 * (sa_config_parse syntax; NULL or "" for none; "check_stream_order=0"
 * turns the checker off) and stream_count streams of the given mode. On
 * error everything made so far is released. */
sa_status sa_fixture_setup(sa_fixture *f, const char *spec, size_t stream_count,
                           sa_host_mode mode);

/* Drain every stream, release the streams to the arena and destroy them,
 * destroy the arena, and compare the simulator's counters with those taken
 * at setup. Returns the arena's destroy status (SA_ERR_LIVE_BLOCKS when
 * blocks were left), SA_ERR_STREAM_ORDER when the checker found more
 * violations than expected_violations, or SA_ERR_INTERNAL after printing
 * what leaked. */
sa_status sa_fixture_teardown(sa_fixture *f);

/* cmocka setup/teardown: a fixture with 2 SA_HOST_MANUAL streams and the
 * default configuration in *state; teardown fails the test on any leak. */
int sa_fixture_cmocka_setup(void **state);
/* The same with spec and stream_count SA_HOST_MANUAL streams. */
int sa_fixture_cmocka_setup_with(void **state, const char *spec, size_t stream_count);
int sa_fixture_cmocka_teardown(void **state);

/* An arena from the defaults and spec (a printf format; sa_config_parse
 * syntax), without streams or leak check: for tests that need several
 * arenas, or one on another backend or device. A spec that does not parse
 * fails the current cmocka test; otherwise sa_arena_create's status. */
sa_status sa_fixture_arena_create(sa_arena **out, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* On a new thread: allocate count (at most 64) blocks of size on stream,
 * free them on it and exit, so that the thread's cache gives them back at
 * once (superblocks they emptied stay with the stream). The first failing
 * status, else SA_OK. */
sa_status sa_fixture_alloc_free_on_thread(sa_arena *arena, size_t size, int count,
                                          sa_stream stream);

/* The simulator's own tests (host_*_test.c) call its driver directly: run
 * tests as one cmocka group whose setup opens device 0's host driver in *d
 * and whose teardown closes it (and sets *d to NULL). cmocka's result. The
 * one fixture call that reaches past the public API and host.h. */
typedef struct sa_driver_s sa_driver;
struct CMUnitTest;
#define sa_fixture_run_with_host_driver(tests, d) \
  sa_fixture_run_with_host_driver_(#tests, (tests), sizeof(tests) / sizeof((tests)[0]), (d))
int sa_fixture_run_with_host_driver_(const char *name, const struct CMUnitTest *tests,
                                     size_t count, sa_driver **d);

/* Fail the current cmocka test unless the calling thread's last driver error
 * (sa_last_driver_error) contains needle. */
void sa_fixture_assert_driver_error(const char *needle);

/* Fail the current cmocka test unless expr returns want, naming both
 * statuses (cmocka's assert_int_equal would print bare numbers), and the
 * driver's error where the status comes from the driver. */
#define sa_assert_status(expr, want) \
  sa_fixture_assert_status_((expr), (want), #expr, __FILE__, __LINE__)
#define sa_assert_ok(expr) sa_assert_status((expr), SA_OK)

void sa_fixture_assert_status_(sa_status got, sa_status want, const char *expr,
                               const char *file, int line);

/* Stream s allocates an 8 MiB span and frees it, so that the arena counts
 * it among the streams that take spans: while one stream alone does, its
 * frees may record no event (timeline.c, "Pending"), and a test of what
 * other streams see of them wants them recorded. */
void sa_fixture_stream_takes_a_span(sa_arena *arena, sa_stream s);
/* size bytes allocated on stream s of arena while blocker's work on them
 * may still be queued (both hand-stepped): s fills and checks them, runs,
 * then blocker and s drain. Fails the test unless the check saw the fill,
 * the fill is what stays, and the stream-order checker stayed silent: s's
 * use came after blocker's. Returns the allocation. */
void *sa_fixture_take_behind(sa_arena *arena, size_t size, sa_stream s, sa_stream blocker,
                             uint32_t pattern);

/* Messages the library writes to stderr: between begin and end, fd 2 goes
 * to a temporary file; end restores it and returns what was written (NUL-
 * terminated; the caller frees it), or NULL if the redirection failed. */
void sa_fixture_stderr_begin(void);
char *sa_fixture_stderr_end(void);
/* Non-overlapping occurrences of needle in haystack. */
size_t sa_fixture_count(const char *haystack, const char *needle);

/* A number below n from a per-thread xorshift64* generator (*rng nonzero,
 * test/util.h): the stress tests' one source of reproducible randomness. */
static inline unsigned sa_fixture_pick(uint64_t *rng, unsigned n) {
  return (unsigned)(sa_xorshift64s(rng) % n);
}

/* Threads of a stress test hand blocks to each other through an array of
 * n slots, lock-free: give puts item in a slot drawn from *rng if it is
 * empty (false: it was taken, the caller keeps item); take empties a slot
 * drawn from *rng and returns what it held (NULL: nothing). */
static inline bool sa_fixture_give(_Atomic(void *) *slots, unsigned n, uint64_t *rng,
                                   void *item) {
  void *expected = NULL;
  return atomic_compare_exchange_strong(&slots[sa_fixture_pick(rng, n)], &expected, item);
}
static inline void *sa_fixture_take(_Atomic(void *) *slots, unsigned n, uint64_t *rng) {
  return atomic_exchange(&slots[sa_fixture_pick(rng, n)], NULL);
}

/* The blocks a stress-test thread holds, local[0..*n): take one out, drawn
 * from *rng (the last moves into its place), and return it; NULL: none. */
static inline void *sa_fixture_take_local(void **local, int *n, uint64_t *rng) {
  if (*n == 0) return NULL;
  unsigned i = sa_fixture_pick(rng, (unsigned)*n);
  void *item = local[i];
  local[i] = local[--*n];
  return item;
}

/* A stress-test thread's failed call: print "test: thread id: what: status"
 * on stderr and count it in *failures. */
void sa_fixture_thread_failure(uint64_t *failures, const char *test, unsigned id,
                               const char *what, sa_status st);

#endif /* SA_TEST_FIXTURE_H */
