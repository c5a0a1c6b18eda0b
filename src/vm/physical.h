/* Physical memory (physical.c): chunks from the driver, the cache of
 * unmapped ones, the limits on what the arena holds, and the remapping
 * ledger. Calls va_space.c and the driver; called by the tiers above, all
 * with the arena lock held but for the ledger's reader. */
#ifndef SA_VM_PHYSICAL_H
#define SA_VM_PHYSICAL_H

#include "../base/base.h"
#include "../driver/driver.h"
#include "va_space.h"

/* A chunk (sa_phys) is one driver allocation,
 * mapped whole; its record (sa_chunk, inside it) sits in the chunk cache or
 * in the list of what backs a descriptor. */
typedef struct sa_chunk_s {
  struct sa_phys_s *phys;  /* the chunk this record is part of */
  size_t size;             /* phys's, a multiple of the granularity */
  struct sa_chunk_s *next; /* in the chunk cache or a descriptor's list */
} sa_chunk;

typedef struct sa_phys_s {
  sa_chunk_handle handle;
  size_t size;
  size_t cached;          /* bytes of it in the chunk cache */
  sa_chunk record;        /* its record */
  struct sa_phys_s *next; /* every chunk of the arena */
  bool released;          /* handed back (release_cached, briefly) */
  /* As the first chunk of a stuck range (physical.c): the range, and the
   * first chunk of the next stuck range. */
  uintptr_t stuck_va;
  size_t stuck_size;
  sa_chunk *stuck_next;
} sa_phys;

/* The arena's physical memory (arena lock): chunks, the chunk cache, the
 * limits, and the remapping ledger. */
typedef struct sa_physical_s {
  size_t cap;                   /* max_physical, or the device's memory */
  size_t reserve_limit;         /* the user's soft budget, else cap */
  bool budgeted;                /* max_physical or reserve_limit configured:
                                   spans near whole granules take whole ones */
  size_t target_excess;         /* the footprint target over the peak, in
                                   1/SA_TARGET_UNIT (footprint_target - 1) */
  size_t target_floor_bytes;    /* sa__physical_target_floor's granules in
                                   bytes: set once at creation, as its inputs
                                   are (read at every soft-limit call) */
  sa_phys *all;                 /* every chunk */
  sa_chunk *cache;              /* unmapped chunks, no pending work */
  size_t cache_bytes;
  sa_chunk *stuck;              /* ranges whose unwind the driver refused */
  size_t bytes, peak, nchunks;  /* of chunks; bytes also counts growing */
  size_t growing;               /* reserved for chunks the driver is making
                                   without the arena lock (grower.c) */
  /* The remapping ledger: bytes created, bytes of cached chunks mapped
   * again, superblocks carved in free spans (superblock.c). Written under
   * the lock, read by alloc.c without. */
  _Atomic size_t xcreated_bytes, xremapped_bytes, xcarved_bytes;
#if SA_INVARIANTS /* last, and only where asserts are on */
  sa_check_pace pace;           /* its validator's */
#endif
} sa_physical;

#define SA_TARGET_UNIT 4096 /* footprint target: the peak times (1 + excess/4096) */
#define SA_TARGET_FLOOR 32   /* ... plus 32 granules (one chunk per growth) */
#define SA_TARGET_FLOOR_SMALL 8 /* ... or 8 (chunk_size, a target of 1, or from 1.125 below 1.5) */
#define SA_TARGET_FLOOR_WIDE 64 /* ... or 64 (a target from SA_TARGET_WIDE) */
#define SA_TARGET_WIDE (SA_TARGET_UNIT / 2) /* an excess of 1/2: footprint_target 1.5 */
#define SA_TARGET_EXCESS_MAX SA_TARGET_UNIT /* an excess of 1: a larger target acts as 2 */
#define SA_TARGET_CARVE SA_TARGET_UNIT /* from an excess of 1 (2): superblock.c */
_Static_assert(SA_TARGET_FLOOR % 2 == 0 && SA_TARGET_FLOOR_SMALL % 2 == 0 &&
                   SA_TARGET_FLOOR_WIDE % 2 == 0,
               "a climb maps half the floor, whole granules (run.c)");
#define SA_CHUNK_MAX ((size_t)2 << 30) /* bytes per chunk created, at most */
#define SA_REMAP_SHARE 8   /* remap at most 1/8 of the bytes created */
#define SA_REMAP_TRICKLE 1024 /* ... plus a granule per 1024 span allocations */
#define SA_STITCH_MAX 10 /* cached chunks a growth maps again, at most (by default) */

/* The bytes of chunks the driver made: held, but for what is reserved for
 * a chunk in the making (growing). What sa_stats reports as reserved. */
static inline size_t sa__physical_made(const sa_physical *p) { return p->bytes - p->growing; }

/* All with the arena lock held, but sa__physical_remap_allowance. */
/* Chunks for need bytes (a granule multiple), *got bytes in all, at most
 * most: cached ones first, then new ones, within limit physical bytes
 * held; when memory is created, ahead bytes more where they too fit under
 * limit (a growth mapped ahead of the requests that follow it: run.c). */
sa_status sa__physical_gather(sa_arena *a, size_t need, size_t ahead, size_t most, size_t limit,
                              sa_chunk **out, size_t *got);
/* Background growth (large/grower.c) creates a chunk without the arena
 * lock. reserve counts size bytes as held first (within limit), so that no
 * limit is passed meanwhile, and gives the chunk's record, whose handle
 * the caller then has the driver make; adopt makes it one of the arena's
 * chunks (the caller maps it); unreserve forgets it, the driver having
 * refused. phys_create is the three on the calling thread. */
sa_status sa__physical_reserve(sa_arena *a, size_t size, size_t limit, sa_phys **out);
sa_chunk *sa__physical_adopt(sa_arena *a, sa_phys *ph); /* its record, a list of one */
void sa__physical_unreserve(sa_arena *a, sa_phys *ph);
/* Map chunks back to back at va (claimed in the va space: size bytes, the
 * chunks' sum) with one access setting. On failure the range is the
 * caller's no more: the chunks go back to the cache and the range to the
 * va space, but for what the driver refused to unmap again, which stays
 * mapped, a stuck range, until sa__physical_unmap_stuck succeeds. */
sa_status sa__physical_map_at(sa_arena *a, uintptr_t va, size_t size, sa_chunk *chunks);
/* The failure path of a mapping at va (size bytes, the chunks' sum, the
 * first mapped bytes of it mapped): as sa__physical_map_at's. Returns why,
 * or SA_ERR_DRIVER where the driver refused the unmap. */
sa_status sa__physical_unwind(sa_arena *a, uintptr_t va, size_t size, sa_chunk *chunks,
                              size_t mapped, sa_status why);
/* The same at desc->base for desc->size bytes; desc->chunks are the chunks on
 * success, NULL on failure. */
sa_status sa__physical_map(sa_arena *a, sa_desc *desc, sa_chunk *chunks);
/* Unmap the stuck ranges (their chunks to the cache, their range to the va
 * space); the first failure, those refused staying stuck. */
sa_status sa__physical_unmap_stuck(sa_arena *a);
void sa__physical_return(sa_arena *a, sa_chunk *chunks); /* to the cache */
size_t sa__chunks_bytes(const sa_chunk *chunks);          /* their bytes in all */
sa_status sa__physical_unmap(sa_arena *a, sa_desc *desc); /* chunks to the cache */
/* The physical bytes past which an allocation reshapes before it grows:
 * reserve_limit when the user set one, else the footprint target. */
size_t sa__physical_soft_limit(const sa_arena *a);
/* The same once request bytes more are live: a climb past the highest
 * live bytes so far raises the target with it. */
size_t sa__physical_soft_limit_with(const sa_arena *a, size_t request);
/* n times the share of what is held that a growth on a climb maps ahead
 * (run.c), and of the superblocks mapped that a slab holds (superblock.c),
 * for the footprint target: 8 x (footprint_target - 1)^2, which is 1/512
 * at the default and the whole excess from 1.125 up. */
size_t sa__physical_ahead_share(const sa_arena *a, size_t n);
/* The granules the footprint target allows over any peak: see
 * sa__physical_soft_limit_with. Computed once, at creation, into
 * physical.target_floor_bytes. */
size_t sa__physical_target_floor(const sa_arena *a);
/* The most chunks a growth maps again (cached ones, or free span memory
 * a reshape unmaps for it): SA_STITCH_MAX where a growth is one chunk,
 * SIZE_MAX where the user asked for small chunks or a budget. */
size_t sa__physical_stitch_limit(const sa_arena *a);
/* Release cached chunks until at most keep_bytes stay cached. */
size_t sa__physical_release_cached(sa_arena *a, size_t keep_bytes);
/* Destroy: forget every chunk left (the driver refused to release it). */
void sa__physical_fini(sa_arena *a);
/* Validator: cache_bytes, bytes and nchunks are what the
 * chunk cache and the chunks add up to, peak >= current, every byte held
 * was created, stuck ranges whole. Returns the records visited. */
size_t sa__physical_check(const sa_arena *a);
/* Bytes the arena may remap to keep within limit: SIZE_MAX for a budget the
 * user set (reserve_limit, max_physical), the ledger's credit for the
 * footprint target below them. No lock needed. */
size_t sa__physical_remap_allowance(const sa_arena *a, size_t limit);

#endif /* SA_VM_PHYSICAL_H */
