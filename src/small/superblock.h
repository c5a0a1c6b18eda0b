/* Superblocks (superblock.c): ranges of the reserved space carved into
 * blocks of one size class, slabs that map several together, and the
 * global free stack they go to when empty. Calls the span files (a
 * superblock carved in free span memory), the vm tier and the services;
 * called by stream_arena.c, reclaim.c, report.c, snapshot.c and arena.c. */
#ifndef SA_SMALL_SUPERBLOCK_H
#define SA_SMALL_SUPERBLOCK_H

#include <ck_stack.h>

#include "../base/base.h"
#include "../driver/driver.h"
#include "../vm/va_space.h"

typedef struct sa_stream_arena_s sa_stream_arena; /* stream_arena.h */
typedef struct sa_span_s sa_span;                 /* large/span.h */

/* Superblocks mapped together: one chunk for nslots
 * superblocks of slot bytes, unmapped once none of them is carved. */
#define SA_SLAB_MAX 16
#define SA_SMALL_BLOCKS 8 /* blocks a class's first superblock on a stream holds, at least */
#define SA_SLAB_SHARE 128 /* slots: 1/128 of the superblocks mapped, up to SA_SLAB_MAX */
typedef struct sa_slab_s {
  sa_desc hdr;                      /* its range and chunk; not in the page map */
  size_t slot;                      /* bytes of each superblock */
  uint32_t nslots, ncarved, nfree;  /* carved + free = nslots */
  uint32_t free_slots[SA_SLAB_MAX];
  struct sa_slab_s *next, *prev;    /* the arena's slabs with free slots, or
                                       its full ones */
} sa_slab;

typedef struct sa_superblock_s {
  sa_desc hdr;
  ck_stack_entry_t link;            /* global free stack */
  _Atomic uint64_t xhandoff;        /* see sa__handoff_publish */
  struct sa_superblock_s *next, *prev; /* bin or empty list of its owner */
  struct sa_superblock_s *all_next; /* every superblock of the arena */
  /* owner and event: written under a stream arena lock or the arena lock,
   * as the reports read them holding all of those (report.c) */
  sa_stream_arena *owner;           /* NULL while on the global free stack */
  sa_event event;                   /* recorded when it emptied, on its owner's stream */
  uint64_t event_owner;             /* ... that stream arena's id (it may be freed) */
  unsigned cls;                     /* size class, valid while owned */
  size_t block_size;
  uint64_t block_inv;               /* ceil(2^64 / block_size): sa__block_index */
  uint32_t nblocks, used, bump, nfree, capacity; /* capacity: of free_idx */
  uint32_t *free_idx;               /* free block indices (owner lock) */
  _Atomic uint8_t *state;           /* per block SA_BLOCK_*; never moves (a racing
                                       double free may read it): nstate bytes,
                                       one per smallest block of hdr.size */
  uint32_t nstate;
  bool in_bin;                      /* on its bin's partial list */
  sa_slab *slab;                    /* its memory's slab; NULL: its own chunks, */
  sa_span *span;                    /* or the span of a run it was carved in */
  uint32_t slot;                    /* ... and its place there */
  uint64_t dirty_gen;               /* work of its owner's stream may use a block
                                       until a device sync of a later generation
                                       completed (device_sync.c); last: the fast
                                       paths' fields keep their cache lines */
} sa_superblock;

/* The index of the block at offset off of sb, rounded down: off / block_size
 * by one multiplication, since a 64-bit division costs tens of cycles on the
 * free path. Exact for off and block_size below 2^32 (Lemire, Kaser, Kurz,
 * "Faster remainder by direct computation", 2019): superblocks are at most
 * 1 GiB (arena.c), so every offset inside one is. */
static inline uint32_t sa__block_index(const sa_superblock *sb, uintptr_t off) {
  return (uint32_t)(((unsigned __int128)sb->block_inv * off) >> 64);
}
static inline uint64_t sa__block_inverse(size_t block_size) { /* block_size >= 2 */
  return UINT64_MAX / block_size + 1;
}

/* The arena's superblocks: descriptors, slabs, the global free stack. */
typedef struct sa_small_s {
  /* Empty superblocks, mapped: those with memory of their own (chunks, a
   * slab's slot), and apart those carved in free span memory, so that a
   * large request that misses gives the latter back to their runs without
   * going through the former (reclaim.c). */
  CK_CC_CACHELINE ck_stack_t free_superblocks;
  CK_CC_CACHELINE ck_stack_t free_carved;
  _Atomic size_t xsuperblock_size; /* of the next one carved (sa_set_superblock_size) */
  /* Mapped superblocks, each counted in exactly one of these as it moves,
   * so that statistics add up without a snapshot. */
  _Atomic size_t xsuperblocks_active, xsuperblocks_empty, xsuperblock_empty_bytes;
  sa_superblock *all_superblocks;   /* (arena lock) */
  sa_superblock *spare_superblocks; /* descriptors without a mapping (arena lock) */
  sa_slab *slabs;               /* superblocks mapped together (arena lock), */
  sa_slab *full_slabs;          /* ... apart once none of their slots is free */
  size_t slab_free_bytes;       /* their free slots, mapped */
#if SA_INVARIANTS
  sa_check_pace slab_pace;      /* the slabs' validator's (arena lock) */
#endif
} sa_small;

sa_status sa__superblock_acquire(sa_stream_arena *sarena, unsigned cls, size_t limit,
                                 sa_superblock **out); /* limit: as sa__stream_arena_take */
sa_status sa__superblock_format(sa_superblock *sb, unsigned cls); /* owner lock */
/* sb (no stream owns it now) to the global stack with the event of its
 * last stream (NULL: none needed), recorded by stream arena event_owner. */
void sa__superblock_to_global(sa_arena *a, sa_superblock *sb, sa_event e, uint64_t event_owner);
/* An empty superblock from the global stacks: one with memory of its own
 * first (a carved one left empty lets its memory go back to the free spans
 * when a large request needs it), else a carved one; NULL: none. */
sa_superblock *sa__superblock_pop_global(sa_arena *a);
sa_superblock *sa__superblock_pop_carved(sa_arena *a); /* a carved one only */
/* sb was popped from the global stack: unmap it (chunks to the cache) once
 * its work completed (SA_WAIT: after waiting), else put it on *keep for
 * sa__superblock_push_all, which puts such a list back on the stack. */
void sa__superblock_unmap_or_keep(sa_arena *a, sa_superblock *sb, sa_wait wait,
                                  sa_superblock **keep);
void sa__superblock_push_all(sa_arena *a, sa_superblock *list);
/* The n superblocks of list (popped from the global stack, carved in free
 * span memory, their events retired) give their memory back to the free
 * spans of their runs, in one hold of the arena lock and one fit index
 * insertion per group of neighbours (sa__span_give_back_superblocks); their
 * descriptors go to the spares. No driver call: nothing fails. */
void sa__superblock_unmap_carved(sa_arena *a, sa_superblock *list, size_t n);
void sa__superblock_emptied(sa_arena *a, const sa_superblock *sb); /* its last block came back */
/* Validators; each returns the elements it visited (SA_VALIDATE_PACED).
 * One superblock, its owner's lock held (or the world lock): used, nfree,
 * bump and nblocks agree, and so do the free index stack and the state
 * bytes. The arena's slabs, arena lock held: ncarved + nfree == nslots,
 * free slots distinct, slab_free_bytes their sum. */
size_t sa__superblock_check(const sa_superblock *sb);
size_t sa__slabs_check(const sa_arena *a);
/* Destroy: unmap every slab (superblocks of their own went with their
 * descriptors' chunks) and free them. Device synchronized already. */
sa_status sa__superblock_slabs_fini(sa_arena *a);
/* Unmap the slabs none of whose slots is carved (a refused unmap is retried
 * here). Arena lock held. */
void sa__superblock_slabs_unmap_free(sa_arena *a);

#endif /* SA_SMALL_SUPERBLOCK_H */
