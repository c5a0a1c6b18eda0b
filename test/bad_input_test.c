/* Bad input never corrupts state: every wrong argument gets its documented
 * status (README.md, "Bad input"), nothing changes on error, and the arena
 * keeps serving. Each case here is one row of that table; the arena's
 * memory is accounted for at the end of every test (fixture leak check).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "fixture.h"
#include "test/util.h"

static unsigned long tried;

/* One bad input: the call must return want. */
#define BAD(expr, want)            \
  do {                             \
    tried++;                       \
    sa_assert_status(expr, want);  \
  } while (0)

static int setup(void **state) { return sa_fixture_cmocka_setup(state); }
static int teardown(void **state) { return sa_fixture_cmocka_teardown(state); }

static void alloc_free_ok(sa_arena *a, size_t size, sa_stream s) {
  void *p;
  sa_assert_ok(sa_alloc(a, &p, size, s));
  assert_non_null(p);
  assert_int_equal((uintptr_t)p % SA_ALIGNMENT, 0);
  sa_assert_ok(sa_free(p, s));
}

/* Still serving after the bad inputs: small and large, both streams. */
static void still_serving(sa_fixture *f) {
  for (size_t i = 0; i < f->stream_count; i++) {
    alloc_free_ok(f->arena, 1000, f->streams[i]);
    alloc_free_ok(f->arena, 5 * MiB, f->streams[i]);
  }
}

static void null_arguments(void **state) {
  sa_fixture *f = *state;
  void *p = (void *)1;
  BAD(sa_alloc(NULL, &p, 64, NULL), SA_ERR_INVALID_ARGUMENT);
  assert_null(p);
  BAD(sa_alloc(f->arena, NULL, 64, NULL), SA_ERR_INVALID_ARGUMENT);
  BAD(sa_free(NULL, NULL), SA_OK);
  BAD(sa_free(NULL, f->streams[0]), SA_OK);
  BAD(sa_record_stream(NULL, f->streams[0]), SA_ERR_INVALID_POINTER);
  BAD(sa_arena_create(NULL, NULL), SA_ERR_INVALID_ARGUMENT);
  BAD(sa_arena_destroy(NULL), SA_OK);
  BAD(sa_stream_release(NULL, NULL), SA_ERR_INVALID_ARGUMENT);
  BAD(sa_set_superblock_size(NULL, 2 * MiB), SA_ERR_INVALID_ARGUMENT);
  BAD(sa_trim(NULL, 0), SA_ERR_INVALID_ARGUMENT);
  BAD(sa_defragment(NULL), SA_ERR_INVALID_ARGUMENT);
  sa_stats st;
  BAD(sa_get_stats(NULL, &st), SA_ERR_INVALID_ARGUMENT);
  BAD(sa_get_stats(f->arena, NULL), SA_ERR_INVALID_ARGUMENT);
  BAD(sa_snapshot_write(NULL, stderr), SA_ERR_INVALID_ARGUMENT);
  BAD(sa_snapshot_write(f->arena, NULL), SA_ERR_INVALID_ARGUMENT);
  /* A file that cannot take it: the caller's error, not a lost snapshot
   * reported as written (a full disk) nor an internal one (read-only). */
  FILE *full = fopen("/dev/full", "w");
  if (full != NULL) {
    BAD(sa_snapshot_write(f->arena, full), SA_ERR_INVALID_ARGUMENT);
    fclose(full);
  }
  FILE *read_only = fopen("/dev/null", "r");
  assert_non_null(read_only);
  BAD(sa_snapshot_write(f->arena, read_only), SA_ERR_INVALID_ARGUMENT);
  fclose(read_only);
  BAD(sa_config_parse(NULL, "backend=host", NULL, 0), SA_ERR_INVALID_ARGUMENT);
  BAD(sa_malloc_async(NULL, 64, NULL), SA_ERR_INVALID_ARGUMENT);
  BAD(sa_default_arena(0, NULL), SA_ERR_INVALID_ARGUMENT);
  still_serving(f);
}

static void double_free(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0], b = f->streams[1];
  void *p, *big;
  /* Small block: in the thread cache, then in its superblock. */
  sa_assert_ok(sa_alloc(f->arena, &p, 1000, a));
  sa_assert_ok(sa_free(p, a));
  BAD(sa_free(p, a), SA_ERR_DOUBLE_FREE);
  BAD(sa_free(p, b), SA_ERR_DOUBLE_FREE);
  BAD(sa_record_stream(p, b), SA_ERR_DOUBLE_FREE);
  /* Freed on another stream: waiting for its event. */
  sa_assert_ok(sa_alloc(f->arena, &p, 1000, a));
  sa_assert_ok(sa_free(p, b));
  BAD(sa_free(p, b), SA_ERR_DOUBLE_FREE);
  BAD(sa_free(p, a), SA_ERR_DOUBLE_FREE);
  /* Large span: in the stream's span cache, then retiring. */
  sa_assert_ok(sa_alloc(f->arena, &big, 5 * MiB, a));
  sa_assert_ok(sa_free(big, a));
  BAD(sa_free(big, a), SA_ERR_DOUBLE_FREE);
  sa_assert_ok(sa_alloc(f->arena, &big, 7 * MiB, a));
  sa_assert_ok(sa_free(big, b));
  BAD(sa_free(big, a), SA_ERR_DOUBLE_FREE);
  BAD(sa_record_stream(big, b), SA_ERR_DOUBLE_FREE);
  still_serving(f);
}

/* A bad pointer in span memory changes nothing, as in a superblock: the
 * stream it names is not bound first (no stream arena for a stream first
 * named there, no driver call on one released and destroyed, which the
 * checker counts). */
static void bad_span_pointers_bind_no_stream(void **state) {
  sa_fixture *f = *state;
  sa_stream fresh, gone;
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &fresh));
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &gone));
  void *big, *live, *last;
  sa_assert_ok(sa_alloc(f->arena, &last, 7 * MiB, gone));
  sa_assert_ok(sa_free(last, gone));
  sa_assert_ok(sa_stream_release(f->arena, gone));
  sa_assert_ok(sa_host_stream_destroy(gone));
  sa_assert_ok(sa_alloc(f->arena, &big, 5 * MiB, f->streams[0]));
  sa_assert_ok(sa_alloc(f->arena, &live, 6 * MiB, f->streams[0]));
  sa_assert_ok(sa_free(big, f->streams[0]));
  sa_stats before, after;
  sa_assert_ok(sa_get_stats(f->arena, &before));
  BAD(sa_free(big, fresh), SA_ERR_DOUBLE_FREE);
  BAD(sa_free((char *)live + 4096, fresh), SA_ERR_INVALID_POINTER);
  BAD(sa_free(last, gone), SA_ERR_DOUBLE_FREE); /* no call on gone */
  sa_assert_ok(sa_get_stats(f->arena, &after));
  assert_int_equal(after.streams, before.streams);
  sa_assert_ok(sa_free(live, f->streams[0]));
  sa_assert_ok(sa_host_stream_destroy(fresh));
  still_serving(f);
}

/* After sa_trim has given the memory back to the device, the address is no
 * block of the arena any more: a second free cannot be told from a wild
 * pointer. */
static void double_free_after_trim(void **state) {
  sa_fixture *f = *state;
  void *p, *big;
  sa_assert_ok(sa_alloc(f->arena, &p, 1000, NULL));
  sa_assert_ok(sa_alloc(f->arena, &big, 5 * MiB, NULL));
  sa_assert_ok(sa_free(p, NULL));
  sa_assert_ok(sa_free(big, NULL));
  sa_assert_ok(sa_trim(f->arena, 0));
  sa_stats st;
  sa_assert_ok(sa_get_stats(f->arena, &st));
  assert_int_equal(st.reserved_bytes, 0);
  BAD(sa_free(p, NULL), SA_ERR_INVALID_POINTER);
  BAD(sa_free(big, NULL), SA_ERR_INVALID_POINTER);
  still_serving(f);
}

static void pointers_inside_blocks(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0];
  void *p, *big;
  sa_assert_ok(sa_alloc(f->arena, &p, 1000, a)); /* a 1 KiB block */
  sa_assert_ok(sa_alloc(f->arena, &big, 5 * MiB, a));
  char *c = p, *cb = big;
  BAD(sa_free(c + 1, a), SA_ERR_INVALID_POINTER);
  BAD(sa_free(c + 256, a), SA_ERR_INVALID_POINTER);
  BAD(sa_free(c + 999, a), SA_ERR_INVALID_POINTER);
  BAD(sa_free(cb + 256, a), SA_ERR_INVALID_POINTER);
  BAD(sa_free(cb + 2 * MiB, a), SA_ERR_INVALID_POINTER); /* its second granule */
  BAD(sa_free(cb + 5 * MiB - 256, a), SA_ERR_INVALID_POINTER);
  BAD(sa_record_stream(c + 256, f->streams[1]), SA_ERR_INVALID_POINTER);
  BAD(sa_record_stream(cb + 4096, f->streams[1]), SA_ERR_INVALID_POINTER);
  /* Nothing changed: both are still live and free normally. */
  sa_assert_ok(sa_free(p, a));
  sa_assert_ok(sa_free(big, a));
  still_serving(f);
}

/* The same, once the block's superblock emptied and went to the global
 * stack (sa_stream_release sheds it there, mapped): a pointer inside the
 * freed block is still no block start, as while its stream kept it. Both
 * said SA_ERR_DOUBLE_FREE for any address of such a superblock. */
static void pointers_inside_a_free_superblock(void **state) {
  sa_fixture *f = *state;
  sa_stream a = f->streams[0];
  void *p;
  sa_assert_ok(sa_alloc(f->arena, &p, 1000, a)); /* a 1 KiB block */
  sa_assert_ok(sa_free(p, a));
  char *c = p;
  BAD(sa_free(c + 256, a), SA_ERR_INVALID_POINTER); /* its stream holds it */
  sa_assert_ok(sa_stream_release(f->arena, a));
  sa_stats st;
  sa_assert_ok(sa_get_stats(f->arena, &st));
  assert_int_equal(st.superblocks_empty, st.superblocks_total);
  assert_true(st.reserved_bytes > 0); /* still mapped: on the global stack */
  BAD(sa_free(c + 256, a), SA_ERR_INVALID_POINTER);
  BAD(sa_free(c + 1, a), SA_ERR_INVALID_POINTER);
  BAD(sa_record_stream(c + 512, f->streams[1]), SA_ERR_INVALID_POINTER);
  BAD(sa_free(p, a), SA_ERR_DOUBLE_FREE); /* the block start: freed already */
  still_serving(f);
}

static void foreign_pointers(void **state) {
  sa_fixture *f = *state;
  int local;
  void *heap = malloc(4096);
  assert_non_null(heap);
  void *p;
  sa_assert_ok(sa_alloc(f->arena, &p, 300, NULL));
  sa_stats st;
  sa_assert_ok(sa_get_stats(f->arena, &st));
  BAD(sa_free(&local, NULL), SA_ERR_INVALID_POINTER);
  BAD(sa_free(heap, NULL), SA_ERR_INVALID_POINTER);
  BAD(sa_free((void *)(uintptr_t)SA_ALIGNMENT, NULL), SA_ERR_INVALID_POINTER);
  BAD(sa_free((void *)UINTPTR_MAX, NULL), SA_ERR_INVALID_POINTER);
  BAD(sa_free((void *)(UINTPTR_MAX & ~(uintptr_t)255), NULL), SA_ERR_INVALID_POINTER);
  BAD(sa_record_stream(heap, NULL), SA_ERR_INVALID_POINTER);
  /* Inside the arena's reserved range, where nothing is mapped: the end of
   * the range (first fit carves from its start). */
  char *unmapped = (char *)p + (st.va_reserved_bytes / 2 / SA_ALIGNMENT) * SA_ALIGNMENT;
  BAD(sa_free(unmapped, NULL), SA_ERR_INVALID_POINTER);
  BAD(sa_record_stream(unmapped, NULL), SA_ERR_INVALID_POINTER);
  free(heap);
  sa_assert_ok(sa_free(p, NULL));
  still_serving(f);
}

/* A pointer of one arena freed through another's stream is still found by
 * its address: arenas are not confused with each other. */
static void pointer_of_another_arena(void **state) {
  sa_fixture *f = *state;
  sa_fixture g;
  sa_assert_ok(sa_fixture_setup(&g, NULL, 1, SA_HOST_MANUAL));
  void *p;
  sa_assert_ok(sa_alloc(g.arena, &p, 4096, g.streams[0]));
  tried++;
  sa_assert_ok(sa_free(p, f->streams[0])); /* a cross-stream free in g */
  BAD(sa_free(p, g.streams[0]), SA_ERR_DOUBLE_FREE);
  sa_assert_ok(sa_fixture_teardown(&g));
  still_serving(f);
}

static void free_after_arena_destroy(void **state) {
  (void)state;
  sa_fixture g;
  sa_assert_ok(sa_fixture_setup(&g, NULL, 1, SA_HOST_MANUAL));
  sa_stream s = g.streams[0];
  void *p, *q, *big;
  /* q goes through the thread cache's fast path: the cache must not
   * outlive its arena. */
  sa_assert_ok(sa_alloc(g.arena, &p, 512, s));
  sa_assert_ok(sa_alloc(g.arena, &q, 512, s));
  sa_assert_ok(sa_alloc(g.arena, &big, 5 * MiB, s));
  sa_assert_ok(sa_free(q, s));
  sa_assert_ok(sa_alloc(g.arena, &q, 512, s));
  sa_assert_ok(sa_host_stream_drain(s));
  tried++;
  sa_assert_status(sa_arena_destroy(g.arena), SA_ERR_LIVE_BLOCKS);
  g.arena = NULL;
  BAD(sa_free(p, s), SA_ERR_INVALID_POINTER);
  BAD(sa_free(q, s), SA_ERR_INVALID_POINTER);
  BAD(sa_free(big, s), SA_ERR_INVALID_POINTER);
  BAD(sa_free(q, NULL), SA_ERR_INVALID_POINTER);
  BAD(sa_record_stream(p, s), SA_ERR_INVALID_POINTER);
  sa_assert_ok(sa_fixture_teardown(&g)); /* streams and the leak check */
  /* A new arena on the same thread and stream works. */
  sa_fixture h;
  sa_assert_ok(sa_fixture_setup(&h, NULL, 1, SA_HOST_MANUAL));
  still_serving(&h);
  sa_assert_ok(sa_fixture_teardown(&h));
}

static void sizes(void **state) {
  sa_fixture *f = *state;
  sa_stream s = f->streams[0];
  void *p = (void *)1;
  BAD(sa_alloc(f->arena, &p, 0, s), SA_OK);
  assert_null(p);
  sa_stats st;
  sa_assert_ok(sa_get_stats(f->arena, &st));
  assert_int_equal(st.alloc_count, 0); /* size 0 allocates nothing */
  /* Sizes no device holds, and sizes whose rounding up (to a class, to
   * the granularity, to a chunk) would overflow. */
  const size_t huge[] = {
      SIZE_MAX,          SIZE_MAX - 1,       SIZE_MAX - 255,  SIZE_MAX - 256,
      SIZE_MAX - 2 * MiB, SIZE_MAX - 2 * MiB + 2, SIZE_MAX / 2 + 1, (size_t)1 << 62,
      (size_t)1 << 47,   st.va_reserved_bytes, st.va_reserved_bytes + 1,
  };
  for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
    p = (void *)1;
    BAD(sa_alloc(f->arena, &p, huge[i], s), SA_ERR_OUT_OF_MEMORY);
    assert_null(p);
  }
  sa_assert_ok(sa_get_stats(f->arena, &st));
  assert_int_equal(st.reserved_bytes, 0); /* nothing was mapped for them */
  assert_int_equal(st.live_bytes, 0);
  still_serving(f);
}

/* More than the physical cap, though the range would hold it. */
static void size_above_the_physical_cap(void **state) {
  (void)state;
  sa_fixture g;
  sa_assert_ok(sa_fixture_setup(&g, "max_physical=8MiB", 1, SA_HOST_MANUAL));
  void *p, *q;
  BAD(sa_alloc(g.arena, &p, 8 * MiB + 1, g.streams[0]), SA_ERR_OUT_OF_MEMORY);
  sa_assert_ok(sa_alloc(g.arena, &p, 6 * MiB, g.streams[0]));
  BAD(sa_alloc(g.arena, &q, 4 * MiB, g.streams[0]), SA_ERR_OUT_OF_MEMORY);
  sa_assert_ok(sa_free(p, g.streams[0]));
  sa_assert_ok(sa_alloc(g.arena, &q, 8 * MiB, g.streams[0]));
  sa_assert_ok(sa_free(q, g.streams[0]));
  /* Said before the stream is looked up: a size no reclaim can fit is out
   * of memory even on a stream the driver cannot be asked about (it was a
   * driver error; found by the fuzzer). */
  sa_stream fresh;
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &fresh));
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_STREAM_VALIDATE, 1, 1));
  BAD(sa_alloc(g.arena, &p, 8 * MiB + 1, fresh), SA_ERR_OUT_OF_MEMORY);
  BAD(sa_alloc(g.arena, &p, SIZE_MAX, fresh), SA_ERR_OUT_OF_MEMORY);
  sa_host_fault_clear();
  sa_assert_ok(sa_host_stream_destroy(fresh));
  sa_assert_ok(sa_fixture_teardown(&g));
}

static void unknown_streams(void **state) {
  sa_fixture *f = *state;
  int local;
  sa_stream bogus = (sa_stream)&local;
  void *p = (void *)1, *q;
  BAD(sa_alloc(f->arena, &p, 64, bogus), SA_ERR_UNKNOWN_STREAM);
  assert_null(p);
  BAD(sa_alloc(f->arena, &p, 5 * MiB, bogus), SA_ERR_UNKNOWN_STREAM);
  sa_assert_ok(sa_alloc(f->arena, &p, 64, f->streams[0]));
  sa_assert_ok(sa_alloc(f->arena, &q, 5 * MiB, f->streams[0]));
  BAD(sa_free(p, bogus), SA_ERR_UNKNOWN_STREAM);
  BAD(sa_free(q, bogus), SA_ERR_UNKNOWN_STREAM);
  BAD(sa_record_stream(p, bogus), SA_ERR_UNKNOWN_STREAM);
  BAD(sa_record_stream(q, bogus), SA_ERR_UNKNOWN_STREAM);
  /* A bad pointer is named before a bad stream, in span memory too (where
   * sa_free looks the span up with its free when it has the stream's
   * entry). */
  BAD(sa_free((char *)q + 4096, bogus), SA_ERR_INVALID_POINTER);
  BAD(sa_free((char *)p + 16, bogus), SA_ERR_INVALID_POINTER);
  void *freed;
  sa_assert_ok(sa_alloc(f->arena, &freed, 6 * MiB, f->streams[0]));
  sa_assert_ok(sa_free(freed, f->streams[0]));
  BAD(sa_free(freed, bogus), SA_ERR_DOUBLE_FREE);
  BAD(sa_stream_release(f->arena, bogus), SA_OK); /* never seen: nothing to do */

  /* A stream released and destroyed is unknown from then on; blocks
   * allocated on it stay valid and are freed on another stream. Naming the
   * destroyed stream makes the library call the driver on it (on a GPU,
   * undefined): the simulator counts each such call as a violation. */
  sa_stream gone;
  void *r, *none;
  sa_assert_ok(sa_host_stream_create(SA_HOST_MANUAL, &gone));
  sa_assert_ok(sa_alloc(f->arena, &r, 700, gone));
  sa_assert_ok(sa_stream_release(f->arena, gone));
  sa_assert_ok(sa_host_stream_destroy(gone));
  BAD(sa_alloc(f->arena, &none, 64, gone), SA_ERR_UNKNOWN_STREAM);
  assert_null(none);
  BAD(sa_free(r, gone), SA_ERR_UNKNOWN_STREAM);
  f->expected_violations += 2;
  sa_assert_ok(sa_free(r, f->streams[1]));

  /* A stream of another device (the fixture's arena is device 0's). */
  sa_stream other;
  sa_assert_ok(sa_host_set_device_count(2));
  sa_assert_ok(sa_host_set_device(1));
  sa_assert_ok(sa_host_stream_create(SA_HOST_AUTO, &other));
  sa_assert_ok(sa_host_set_device(0));
  BAD(sa_alloc(f->arena, &none, 64, other), SA_ERR_UNKNOWN_STREAM);
  assert_null(none);
  BAD(sa_alloc(f->arena, &none, 5 * MiB, other), SA_ERR_UNKNOWN_STREAM);
  BAD(sa_free(p, other), SA_ERR_UNKNOWN_STREAM);
  BAD(sa_free(q, other), SA_ERR_UNKNOWN_STREAM);
  BAD(sa_record_stream(p, other), SA_ERR_UNKNOWN_STREAM);
  sa_assert_ok(sa_host_stream_destroy(other));
  sa_assert_ok(sa_host_set_device_count(1));

  /* Nothing changed for the blocks the bad calls named. */
  sa_assert_ok(sa_free(p, f->streams[0]));
  sa_assert_ok(sa_free(q, f->streams[0]));
  still_serving(f);
}

static void destroy_with_live_blocks(void **state) {
  (void)state;
  sa_fixture g;
  sa_assert_ok(sa_fixture_setup(&g, NULL, 2, SA_HOST_MANUAL));
  void *p[4];
  sa_assert_ok(sa_alloc(g.arena, &p[0], 100, g.streams[0]));
  sa_assert_ok(sa_alloc(g.arena, &p[1], 5 * MiB, g.streams[1]));
  sa_assert_ok(sa_alloc(g.arena, &p[2], 3000, g.streams[1]));
  sa_assert_ok(sa_record_stream(p[2], g.streams[0]));
  sa_assert_ok(sa_host_fill(g.streams[1], p[1], 4096, 7)); /* queued work */
  sa_assert_ok(sa_alloc(g.arena, &p[3], 100, g.streams[0]));
  sa_assert_ok(sa_free(p[3], g.streams[1]));   /* a deferred free pending */
  tried++;
  /* The fixture's teardown destroys the arena after releasing the streams:
   * it must report the three live blocks and still leak nothing. */
  sa_assert_status(sa_fixture_teardown(&g), SA_ERR_LIVE_BLOCKS);
  sa_host_counters c;
  sa_host_get_counters(&c);
  assert_int_equal(c.chunks, g.before.chunks);
  assert_int_equal(c.mappings, g.before.mappings);
  assert_int_equal(c.va_ranges, g.before.va_ranges);
  assert_int_equal(c.events, g.before.events);
  assert_int_equal(c.order_violations, g.before.order_violations);
}

/* One configuration: arena creation must fail with want and leak nothing. */
static void bad_config(const char *spec, sa_status want) {
  sa_host_counters before, after;
  sa_host_get_counters(&before);
  sa_config cfg;
  sa_config_init(&cfg);
  char err[256];
  sa_assert_ok(sa_config_parse(&cfg, "backend=host", err, sizeof err));
  sa_status st = sa_config_parse(&cfg, spec, err, sizeof err);
  sa_arena *a = (sa_arena *)1;
  if (st == SA_OK) st = sa_arena_create(&cfg, &a);
  tried++;
  if (st != want) {
    print_error("config \"%s\": got %s, expected %s\n", spec, sa_status_string(st),
                sa_status_string(want));
    if (st == SA_OK) (void)sa_arena_destroy(a);
    fail();
  }
  if (want != SA_OK) assert_true(a == NULL || a == (sa_arena *)1);
  if (st == SA_OK) sa_assert_ok(sa_arena_destroy(a));
  sa_host_get_counters(&after);
  assert_int_equal(after.va_ranges, before.va_ranges);
  assert_int_equal(after.chunks, before.chunks);
}

static void configuration_out_of_range(void **state) {
  (void)state;
  bad_config("superblock_size=3MiB", SA_ERR_BAD_CONFIG);   /* not a granule multiple */
  bad_config("superblock_size=1MiB", SA_ERR_BAD_CONFIG);   /* below one granule */
  bad_config("superblock_size=2GiB", SA_ERR_BAD_CONFIG);   /* above 1 GiB */
  bad_config("chunk_size=1MiB", SA_ERR_BAD_CONFIG);        /* not a granule multiple */
  bad_config("chunk_size=4GiB", SA_ERR_BAD_CONFIG);        /* above 2 GiB */
  bad_config("max_physical=64MiB,initial_physical=66MiB", SA_ERR_BAD_CONFIG); /* above the cap */
  bad_config("reserve_limit=64MiB,initial_physical=66MiB", SA_ERR_BAD_CONFIG); /* the budget */
  bad_config("superblock_size=17179869184T", SA_ERR_BAD_CONFIG); /* overflows */
  bad_config("large_threshold=4MiB", SA_ERR_BAD_CONFIG);   /* above the superblock */
  bad_config("large_threshold=255", SA_ERR_BAD_CONFIG);    /* below the alignment */
  bad_config("max_physical=1MiB", SA_ERR_BAD_CONFIG);      /* below one granule */
  bad_config("va_reserve=1MiB", SA_ERR_BAD_CONFIG);        /* below one superblock */
  bad_config("va_reserve=128TiB", SA_ERR_BAD_CONFIG);      /* above 64 TiB */
  bad_config("va_reserve=1000TiB", SA_ERR_BAD_CONFIG);
  /* Classes up to the threshold must fit in a superblock: 33 MiB is a
   * 36 MiB block. */
  bad_config("superblock_size=34MiB,large_threshold=34MiB", SA_ERR_BAD_CONFIG);
  bad_config("superblock_size=8MiB,max_physical=4MiB", SA_ERR_BAD_CONFIG); /* no superblock fits */
  bad_config("device=1", SA_ERR_NO_DEVICE);                /* one simulated device */
  bad_config("peer_access=1", SA_ERR_NO_DEVICE);
  bad_config("peer_access=0+63", SA_ERR_NO_DEVICE);
  bad_config("device=-1", SA_ERR_BAD_CONFIG);
  bad_config("backend=gpu", SA_ERR_BAD_CONFIG);
  bad_config("superblock=2MiB", SA_ERR_BAD_CONFIG);        /* unknown key */
  bad_config("superblock_size=two", SA_ERR_BAD_CONFIG);
  bad_config("check_stream_order=2", SA_ERR_BAD_CONFIG);
  bad_config("trace=/nonexistent-dir/trace.csv", SA_ERR_BAD_CONFIG);
  /* In range, at the edges: accepted. */
  bad_config("superblock_size=2MiB,large_threshold=2MiB", SA_OK);
  bad_config("superblock_size=1GiB", SA_OK);
  bad_config("large_threshold=256", SA_OK);
  bad_config("max_physical=2MiB,va_reserve=2MiB", SA_OK);
  bad_config("superblock_size=34MiB,large_threshold=32MiB", SA_OK);
  bad_config("superblock_size=8MiB,max_physical=8MiB", SA_OK);
  bad_config("peer_access=all", SA_OK); /* one device: no peer to grant */
  bad_config("peer_access=0", SA_OK);   /* the arena's own device */
  /* A device that cannot access the arena's device (cuDeviceCanAccessPeer). */
  sa_assert_ok(sa_host_set_device_count(2));
  sa_assert_ok(sa_host_set_can_access_peer(1, 0, 0));
  bad_config("peer_access=1", SA_ERR_NOT_SUPPORTED);
  bad_config("peer_access=all", SA_ERR_NOT_SUPPORTED);
  sa_assert_ok(sa_host_set_can_access_peer(1, 0, 1));
  bad_config("peer_access=1", SA_OK);
  sa_assert_ok(sa_host_set_device_count(1));

  /* Values set in the struct directly, bypassing the parser. */
  sa_config cfg;
  sa_arena *a;
  sa_config_init(&cfg);
  cfg.backend = (sa_backend)42;
  BAD(sa_arena_create(&cfg, &a), SA_ERR_INVALID_ARGUMENT);
  sa_config_init(&cfg);
  cfg.backend = SA_BACKEND_HOST;
  cfg.superblock_size = SIZE_MAX - (2 * MiB - 1); /* a granule multiple */
  BAD(sa_arena_create(&cfg, &a), SA_ERR_BAD_CONFIG);
  sa_config_init(&cfg);
  cfg.backend = SA_BACKEND_HOST;
  cfg.va_reserve_bytes = SIZE_MAX;
  BAD(sa_arena_create(&cfg, &a), SA_ERR_BAD_CONFIG);
  sa_config_init(&cfg);
  cfg.backend = SA_BACKEND_HOST;
  cfg.large_threshold = SIZE_MAX;
  BAD(sa_arena_create(&cfg, &a), SA_ERR_BAD_CONFIG);
}

static void tuning_out_of_range(void **state) {
  sa_fixture *f = *state;
  BAD(sa_set_superblock_size(f->arena, 0), SA_ERR_INVALID_ARGUMENT);
  BAD(sa_set_superblock_size(f->arena, 3 * MiB), SA_ERR_INVALID_ARGUMENT);
  BAD(sa_set_superblock_size(f->arena, 2 * GiB), SA_ERR_INVALID_ARGUMENT);
  BAD(sa_set_superblock_size(f->arena, SIZE_MAX - (2 * MiB - 1)), SA_ERR_INVALID_ARGUMENT);
  BAD(sa_trim(f->arena, SIZE_MAX), SA_OK); /* keep everything: nothing to do */
  still_serving(f);

  /* An explicit large threshold must stay within the superblock. */
  sa_fixture g;
  sa_assert_ok(sa_fixture_setup(&g, "superblock_size=8MiB,large_threshold=6MiB", 1,
                                SA_HOST_MANUAL));
  BAD(sa_set_superblock_size(g.arena, 4 * MiB), SA_ERR_INVALID_ARGUMENT);
  sa_assert_ok(sa_set_superblock_size(g.arena, 16 * MiB));
  still_serving(&g);
  sa_assert_ok(sa_fixture_teardown(&g));

  /* ... and so must its size class (34 MiB rounds to a 36 MiB block). */
  sa_assert_ok(sa_fixture_setup(&g, "superblock_size=64MiB,large_threshold=34MiB", 1,
                                SA_HOST_MANUAL));
  BAD(sa_set_superblock_size(g.arena, 34 * MiB), SA_ERR_INVALID_ARGUMENT);
  sa_assert_ok(sa_set_superblock_size(g.arena, 36 * MiB));
  still_serving(&g);
  sa_assert_ok(sa_fixture_teardown(&g));

  /* A superblock larger than the physical cap could never be mapped. */
  sa_assert_ok(sa_fixture_setup(&g, "max_physical=8MiB", 1, SA_HOST_MANUAL));
  BAD(sa_set_superblock_size(g.arena, 16 * MiB), SA_ERR_INVALID_ARGUMENT);
  sa_assert_ok(sa_set_superblock_size(g.arena, 8 * MiB));
  sa_assert_ok(sa_set_superblock_size(g.arena, 2 * MiB));
  still_serving(&g);
  sa_assert_ok(sa_fixture_teardown(&g));
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(null_arguments),
      T(double_free),
      T(double_free_after_trim),
      T(bad_span_pointers_bind_no_stream),
      T(pointers_inside_blocks),
      T(pointers_inside_a_free_superblock),
      T(foreign_pointers),
      T(pointer_of_another_arena),
      T(free_after_arena_destroy),
      T(sizes),
      T(size_above_the_physical_cap),
      T(unknown_streams),
      T(destroy_with_live_blocks),
      T(configuration_out_of_range),
      T(tuning_out_of_range),
  };
#undef T
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  printf("bad_input: bad inputs tried %lu, threads 1, streams 2, failures %d\n", tried, failed);
  return failed;
}
