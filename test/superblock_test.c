/* Superblock geometry: the block index that the free path computes by
 * multiplication (sa__block_index) is the division it replaces, for every
 * size class and every offset a superblock can have; and frees through the
 * public API find their blocks by it. Superblocks of different sizes
 * (sa_set_superblock_size): every one a class gets holds at least one of
 * its blocks, and all of them come back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "fixture.h"

#include "internal.h"
#include "test/util.h"

#define SUPERBLOCK_MAX ((uintptr_t)1 << 30) /* arena.c's limit */

static uint32_t index_of(size_t block_size, uintptr_t off) {
  sa_superblock sb = {.block_size = block_size, .block_inv = sa__block_inverse(block_size)};
  return sa__block_index(&sb, off);
}

static void check(size_t bs, uintptr_t off) {
  uint32_t got = index_of(bs, off);
  if (got != off / bs) fail_msg("block %zu, offset %zu: %u, not %zu", bs, (size_t)off, got,
                                (size_t)(off / bs));
}

/* Block starts, their neighbours and the last byte of each block, across
 * the largest superblock; every block where there are few enough. */
static void index_is_division_for_every_class(void **state) {
  (void)state;
  for (unsigned cls = 0; cls < SA_CLASS_COUNT; cls++) {
    size_t bs = sa_class_size(cls);
    if (bs > SA_CLASS_MAX_SIZE) break;
    uintptr_t blocks = SUPERBLOCK_MAX / bs;
    uintptr_t step = blocks > 4096 ? blocks / 4096 : 1;
    for (uintptr_t k = 0; k <= blocks; k += step) {
      uintptr_t start = k * bs;
      check(bs, start);
      check(bs, start + 1);
      check(bs, start + bs - 1);
      if (start > 0) check(bs, start - 1);
    }
    check(bs, SUPERBLOCK_MAX - 1);
  }
}

/* Any block size a caller could configure, any offset below 2^32: the bound
 * the comment of sa__block_index states. */
static void index_is_division_below_2_pow_32(void **state) {
  (void)state;
  uint64_t x = 0x2545F4914F6CDD1Du;
  for (int i = 0; i < 2000000; i++) {
    x = sa_xorshift64(x);
    size_t bs = 2 + (size_t)(x >> 40) % ((1u << 24) - 2);
    if (i & 1) bs = (bs & ~(size_t)255) + 256; /* class sizes are 256-byte multiples */
    uintptr_t off = (uintptr_t)(x & 0xffffffffu);
    check(bs, off);
    check(bs, off - off % bs);
    check(bs, UINT32_MAX);
  }
}

/* A class whose block size is no power of two: every block of a superblock
 * frees by address, an interior pointer does not. */
static void frees_find_blocks_of_an_odd_class(void **state) {
  (void)state;
  sa_config cfg;
  sa_config_init(&cfg);
  assert_int_equal(sa_config_parse(&cfg, "backend=host,check_stream_order=1", NULL, 0), SA_OK);
  sa_arena *a = NULL;
  assert_int_equal(sa_arena_create(&cfg, &a), SA_OK);
  enum { N = 300 }; /* more than one 2 MiB superblock holds (292) */
  const size_t size = 7168; /* a class size, 7 * 1024 */
  assert_int_equal(sa_class_size(sa_size_class(size)), size);
  void *p[N];
  for (int i = 0; i < N; i++) assert_int_equal(sa_alloc(a, &p[i], size, NULL), SA_OK);
  for (int i = 0; i < N; i++)
    assert_int_equal(sa_free((char *)p[i] + 256, NULL), SA_ERR_INVALID_POINTER);
  for (int i = 0; i < N; i++) assert_int_equal(sa_free(p[i], NULL), SA_OK);
  for (int i = 0; i < N; i++) assert_int_equal(sa_free(p[i], NULL), SA_ERR_DOUBLE_FREE);
  assert_int_equal(sa_arena_destroy(a), SA_OK);
}

/* After growing the superblock size, a class too large for an older empty
 * superblock gets a new one; the old one stays reusable and trims away. It
 * was formatted with 0 blocks and lost: 2 MiB stayed reserved. */
static void smaller_empty_superblocks_are_not_lost(void **state) {
  (void)state;
  sa_fixture f;
  sa_assert_ok(sa_fixture_setup(&f, NULL, 2, SA_HOST_AUTO));
  sa_stream s = f.streams[0], t = f.streams[1];
  /* An empty 2 MiB superblock on s, and one on the global stack (t's,
   * shed when t is released). */
  sa_assert_ok(sa_fixture_alloc_free_on_thread(f.arena, 4096, 1, s));
  sa_assert_ok(sa_fixture_alloc_free_on_thread(f.arena, 4096, 1, t));
  sa_assert_ok(sa_stream_release(f.arena, t));
  sa_stats st;
  sa_assert_ok(sa_get_stats(f.arena, &st));
  assert_int_equal(st.superblocks_total, 2);
  assert_int_equal(st.superblocks_empty, 2);

  sa_assert_ok(sa_set_superblock_size(f.arena, 8 * MiB)); /* threshold 4 MiB */
  void *p, *q;
  sa_assert_ok(sa_alloc(f.arena, &p, 3 * MiB, s)); /* a 3 MiB class: needs 8 MiB */
  sa_assert_ok(sa_alloc(f.arena, &q, 4096, s));   /* fits the old one */
  sa_assert_ok(sa_free(p, s));
  sa_assert_ok(sa_free(q, s));
  sa_assert_ok(sa_trim(f.arena, 0));
  sa_assert_ok(sa_get_stats(f.arena, &st));
  assert_int_equal(st.superblocks_total, 0);
  assert_int_equal(st.reserved_bytes, 0);
  sa_assert_ok(sa_fixture_teardown(&f));
}

/* A thread that read the large threshold before sa_set_superblock_size
 * shrank it may ask for a class larger than the new superblock size: the
 * superblock it carves is made large enough. */
static void a_class_larger_than_the_superblock_size_gets_room(void **state) {
  (void)state;
  sa_fixture f;
  sa_assert_ok(sa_fixture_setup(&f, "superblock_size=8MiB", 1, SA_HOST_AUTO));
  sa_assert_ok(sa_set_superblock_size(f.arena, 2 * MiB));
  sa_stream_arena *sa;
  sa_assert_ok(sa__stream_arena_get(f.arena, f.streams[0], &sa));
  unsigned cls = sa_size_class(3 * MiB);
  sa_superblock *sb;
  pthread_mutex_lock(&sa->lock);
  sa_status st = sa__superblock_acquire(sa, cls, f.arena->physical.cap, &sb);
  if (st == SA_OK) {
    assert_true(sb->nblocks >= 1);
    assert_true(sb->hdr.size >= sa_class_size(cls));
    sb->next = sa->empty; /* give it back empty */
    sa->empty = sb;
    sa->nempty++;
  }
  pthread_mutex_unlock(&sa->lock);
  sa_assert_ok(st);
  sa_assert_ok(sa_fixture_teardown(&f));
}

/* A free of a block that is free already may read the block's state byte
 * while another thread reformats its (empty) superblock for a class with
 * more blocks. The state array grew by realloc there, so that free read
 * freed memory; it must stay where it is for the descriptor's life. */
static void state_bytes_never_move(void **state) {
  (void)state;
  sa_fixture f;
  sa_assert_ok(sa_fixture_setup(&f, NULL, 1, SA_HOST_AUTO));
  sa_stream s = f.streams[0];
  void *p, *q;
  sa_assert_ok(sa_alloc(f.arena, &p, MiB, s)); /* two blocks a superblock */
  sa_superblock *sb = (sa_superblock *)sa__pagemap_get(&f.arena->range, (uintptr_t)p);
  assert_non_null(sb);
  const _Atomic uint8_t *before = sb->state;
  sa_assert_ok(sa_free(p, s));
  sa_assert_ok(sa_trim(f.arena, SIZE_MAX)); /* this thread's cache back: sb empties */
  /* The descriptor again, for a class of 256-byte blocks: a smaller
   * superblock (a class's first on a stream), many more blocks. */
  sa_assert_ok(sa_alloc(f.arena, &q, 256, s));
  assert_ptr_equal(sa__pagemap_get(&f.arena->range, (uintptr_t)q), &sb->hdr);
  assert_int_equal(sb->nblocks, sb->hdr.size / 256);
  assert_true(sb->nblocks > 2);
  assert_ptr_equal(sb->state, before);
  sa_assert_status(sa_free(p, s), SA_ERR_DOUBLE_FREE); /* p is block 0 again: q */
  sa_assert_ok(sa_free(q, s));
  sa_assert_ok(sa_fixture_teardown(&f));
}

/* A class's first superblock on a stream is small (room for 8 blocks, at
 * least 256 KiB), and such superblocks share a granule in a slab: one
 * block of each of eight classes up to 8 KiB takes one granule, not eight
 * superblocks of 2 MiB. A class's next superblock is twice its last. */
static void a_class_starts_with_a_small_superblock(void **state) {
  (void)state;
  sa_fixture f;
  sa_assert_ok(sa_fixture_setup(&f, "check_stream_order=1", 1, SA_HOST_AUTO));
  sa_stream s = f.streams[0];
  void *p[8];
  for (int i = 0; i < 8; i++) { /* 256 B .. 8 KiB, 3000 B, 6000 B: eight classes */
    sa_assert_ok(sa_alloc(f.arena, &p[i], i < 6 ? (size_t)256 << i : i == 6 ? 3000 : 6000, s));
    sa_desc *d = sa__pagemap_get(&f.arena->range, (uintptr_t)p[i]);
    assert_int_equal(d->kind, SA_DESC_SUPERBLOCK);
    assert_int_equal(d->size, 256 * KiB);
  }
  sa_stats st;
  sa_assert_ok(sa_get_stats(f.arena, &st));
  assert_int_equal(st.superblocks_total, 8);
  assert_int_equal(st.reserved_bytes, 2 * MiB);
  enum { N = 200 };
  void *q[N];
  sa_desc *first = NULL, *next = NULL;
  for (int i = 0; i < N; i++) {
    sa_assert_ok(sa_alloc(f.arena, &q[i], 4 * KiB, s));
    sa_desc *d = sa__pagemap_get(&f.arena->range, (uintptr_t)q[i]);
    if (first == NULL) first = d;
    if (next == NULL && d != first && d != sa__pagemap_get(&f.arena->range, (uintptr_t)p[4])) next = d;
  }
  assert_non_null(next);
  assert_int_equal(next->size, 2 * first->size);
  for (int i = 0; i < N; i++) sa_assert_ok(sa_free(q[i], s));
  for (int i = 0; i < 8; i++) sa_assert_ok(sa_free(p[i], s));
  sa_assert_ok(sa_fixture_teardown(&f));
}

/* Once the arena holds many superblocks, new ones are mapped together in
 * slabs (1/128 of those mapped, up to 16, in one chunk): 1200 superblocks
 * take 534 chunks, not 1200 (256 alone, then slabs of 2, 4 and 8).
 * Blocks in a slab hold their contents, a slot given back serves the next
 * superblock without the driver, and a trim unmaps a slab once all of its
 * superblocks are empty. With the user's chunk_size every superblock
 * keeps a chunk of its own. */
#define MANY_SUPERBLOCKS 1200
static void many_superblocks_are_mapped_in_slabs(void **state) {
  (void)state;
  const char *specs[2] = {"check_stream_order=1", "check_stream_order=1,chunk_size=2MiB"};
  const uint64_t chunks[2] = {534, MANY_SUPERBLOCKS};
  void **p = calloc(2 * MANY_SUPERBLOCKS, sizeof *p);
  assert_non_null(p);
  for (int k = 0; k < 2; k++) {
    sa_fixture f;
    sa_assert_ok(sa_fixture_setup(&f, specs[k], 1, SA_HOST_AUTO));
    sa_stream s = f.streams[0];
    uint64_t creates = sa_host_call_count(SA_HOST_FN_CHUNK_CREATE);
    for (int i = 0; i < 2 * MANY_SUPERBLOCKS; i++) sa_assert_ok(sa_alloc(f.arena, &p[i], MiB, s));
    sa_stats st;
    sa_assert_ok(sa_get_stats(f.arena, &st));
    assert_int_equal(st.superblocks_total, MANY_SUPERBLOCKS);
    assert_int_equal(sa_host_call_count(SA_HOST_FN_CHUNK_CREATE) - creates, chunks[k]);
    assert_int_equal(st.reserved_bytes, (size_t)MANY_SUPERBLOCKS * 2 * MiB);
    uint64_t bad = 0;
    void *last = p[2 * MANY_SUPERBLOCKS - 1];
    sa_assert_ok(sa_host_fill(s, last, MiB, 0x5AB5AB5Au));
    sa_assert_ok(sa_host_check(s, last, MiB, 0x5AB5AB5Au, &bad));
    sa_assert_ok(sa_host_stream_drain(s));
    assert_int_equal(bad, 0);
    /* Four superblocks emptied and given back by a trim: their slots stay
     * mapped in slabs whose other superblocks are carved, and serve the
     * next superblocks without the driver. */
    size_t held = st.reserved_bytes;
    for (int i = 2 * MANY_SUPERBLOCKS - 8; i < 2 * MANY_SUPERBLOCKS; i++)
      sa_assert_ok(sa_free(p[i], s));
    sa_assert_ok(sa_trim(f.arena, SIZE_MAX));
    sa_assert_ok(sa_get_stats(f.arena, &st));
    assert_int_equal(st.superblocks_total, MANY_SUPERBLOCKS - 4);
    if (k == 0) assert_int_equal(st.reserved_bytes, held);
    creates = sa_host_call_count(SA_HOST_FN_CHUNK_CREATE);
    for (int i = 2 * MANY_SUPERBLOCKS - 8; i < 2 * MANY_SUPERBLOCKS; i++)
      sa_assert_ok(sa_alloc(f.arena, &p[i], MiB, s));
    if (k == 0) assert_int_equal(sa_host_call_count(SA_HOST_FN_CHUNK_CREATE), creates);
    for (int i = 0; i < 2 * MANY_SUPERBLOCKS; i++) sa_assert_ok(sa_free(p[i], s));
    sa_assert_ok(sa_trim(f.arena, 0));
    sa_assert_ok(sa_get_stats(f.arena, &st));
    assert_int_equal(st.reserved_bytes, 0);
    assert_int_equal(st.cached_bytes, 0);
    sa_assert_ok(sa_fixture_teardown(&f));
  }
  free(p);
}

/* A slab whose unmap the driver refused once stays mapped with every slot
 * free; a later trim must try again. It was never retried (only a new
 * superblock carved from it and given back would): sa_trim(0) with nothing
 * live in it left the slab's chunk reserved for the arena's life. */
#define SLAB_LIVE 256 /* superblocks with chunks of their own, kept live */
#define SLAB_MORE 64  /* then in slabs */
static void a_refused_slab_unmap_is_retried_by_trim(void **state) {
  (void)state;
  enum { N = 2 * (SLAB_LIVE + SLAB_MORE) };
  void **p = calloc(N, sizeof *p);
  assert_non_null(p);
  sa_fixture f;
  sa_assert_ok(sa_fixture_setup(&f, "check_stream_order=1", 1, SA_HOST_AUTO));
  sa_stream s = f.streams[0];
  for (int i = 0; i < N; i++) sa_assert_ok(sa_alloc(f.arena, &p[i], MiB, s));
  assert_true(f.arena->small.slabs != NULL || f.arena->small.full_slabs != NULL); /* some slab */
  /* Every slab superblock back; the first 256 (chunks of their own) stay. */
  for (int i = 2 * SLAB_LIVE; i < N; i++) sa_assert_ok(sa_free(p[i], s));
  sa_assert_ok(sa_host_fault_inject(SA_HOST_FN_UNMAP, 1, 0));
  sa_assert_ok(sa_trim(f.arena, 0));
  sa_host_fault_clear();
  sa_assert_ok(sa_trim(f.arena, 0));
  sa_stats st;
  sa_assert_ok(sa_get_stats(f.arena, &st));
  assert_int_equal(st.superblocks_total, SLAB_LIVE);
  assert_int_equal(st.reserved_bytes, (size_t)SLAB_LIVE * 2 * MiB);
  assert_int_equal(st.cached_bytes, 0);
  for (int i = 0; i < 2 * SLAB_LIVE; i++) sa_assert_ok(sa_free(p[i], s));
  free(p);
  sa_assert_ok(sa_fixture_teardown(&f));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(index_is_division_for_every_class),
      cmocka_unit_test(index_is_division_below_2_pow_32),
      cmocka_unit_test(frees_find_blocks_of_an_odd_class),
      cmocka_unit_test(smaller_empty_superblocks_are_not_lost),
      cmocka_unit_test(a_class_larger_than_the_superblock_size_gets_room),
      cmocka_unit_test(state_bytes_never_move),
      cmocka_unit_test(a_class_starts_with_a_small_superblock),
      cmocka_unit_test(many_superblocks_are_mapped_in_slabs),
      cmocka_unit_test(a_refused_slab_unmap_is_retried_by_trim),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
