/* Private types and cross-file prototypes of the allocator core.
 *
 * Layers, top to bottom (each calls only the ones below it); the folders
 * are the tiers (the arena, small blocks, large blocks, virtual memory, the
 * services every tier uses, the device):
 *   alloc.c               public sa_alloc / sa_free / sa_record_stream, fast
 *                         paths; the out-of-memory loop, sa_trim, sa_defragment
 *   snapshot.c            sa_snapshot_write
 *   arena.c               arena life cycle, tuning, statistics
 *   report.c              memory summary: out-of-memory report, snapshot summary
 *   reclaim.c             getting memory back: free superblocks and spans unmapped
 *   trace.c               the allocation trace (trace=PATH)
 *   registry.c            which arena an address belongs to (lock-free)
 *   small/thread_cache.c  per-thread caches keyed by (arena, stream)
 *   small/stream_arena.c  per-stream arenas: size-class bins, inbox, deferred frees
 *   small/superblock.c    carving superblocks into blocks; the global free stack
 *   large/span.c          large allocations: best fit in mapped runs, growth
 *   large/span_index.c    free spans by size (best fit), live spans by address
 *   large/timeline.c      per-stream events that free spans wait for
 *   vm/physical.c         physical chunks: cache, creation, map and unmap
 *   vm/va_space.c         the reserved virtual range and the page map
 *   base/event_pool.c     pooled driver events
 *   base/record.c         sa_record_stream's side table
 *   base/device_sync.c    device-wide synchronize: what it makes clean
 *   base/hook.c           test hooks (pause points on slow paths)
 *   base/chain_table.c    chained hash tables (record.c's, the live stream arenas')
 *   driver/driver.h       the device (src/driver/), the simulator behind it (src/sim/)
 *
 * Naming: sa_ is public, sa__ is internal across files, static functions
 * have no prefix. Fields that other threads read without the owner's lock
 * are _Atomic and prefixed x.
 *
 * Invariants: each structure has a validator, sa__<structure>_check, in
 * the file that owns it, declared with that file's functions here. Builds
 * with asserts on (every test build, the sanitizers, the fuzzer) run it
 * where the structure must be whole (SA_VALIDATE, SA_VALIDATE_PACED), and
 * every one at trim, snapshot and arena destroy (report.c's
 * sa__world_check); a broken rule aborts naming the structure and the rule
 * (invariant.c, a leaf). Release builds (NDEBUG) run none.
 */
#ifndef SA_INTERNAL_H
#define SA_INTERNAL_H

#include <ck_stack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <streamarena/streamarena.h>

#include "driver/driver.h"
#include "small/size_class.h"

#define sa_likely(x) __builtin_expect(!!(x), 1)
#define sa_unlikely(x) __builtin_expect(!!(x), 0)
#define SA_NOINLINE __attribute__((noinline))
#define SA_ALWAYS_INLINE inline __attribute__((always_inline))

/* Invariants in code (invariant.c). SA_ASSERT states one rule at the point
 * where it must hold; SA_CHECK is a validator's test of one rule of a named
 * structure. Both are compiled into every build with asserts on (tests,
 * sanitizers, the fuzzer, stress runs: NDEBUG undefined) and out of release
 * builds (-c opt defines NDEBUG). A broken one prints the structure, the
 * rule and the place, and aborts: a damaged allocator must not hand out
 * memory. */
#ifdef NDEBUG
/* Out, but the condition still compiled as an operand of sizeof (never
 * evaluated): it keeps compiling, and what a validator counts or names
 * stays used. */
#define SA_INVARIANTS 0
#define SA_ASSERT(cond) ((void)sizeof(cond))
#define SA_CHECK(structure, cond, rule) ((void)sizeof(cond), (void)(structure), (void)(rule))
#else
#define SA_INVARIANTS 1
#define SA_ASSERT(cond) \
  (sa_likely(cond) ? (void)0 : sa__invariant_broken("assertion", #cond, __FILE__, __LINE__))
#define SA_CHECK(structure, cond, rule) \
  (sa_likely(cond) ? (void)0 : sa__invariant_broken((structure), (rule), __FILE__, __LINE__))
#endif
_Noreturn void sa__invariant_broken(const char *structure, const char *rule, const char *file,
                                    int line);

/* Validators: sa__<structure>_check walks one structure whole and
 * SA_CHECKs each of its rules, with the lock the structure lives under
 * held, at a point where it must be whole. A call site names one with
 * SA_VALIDATE, which release builds compile out (the call stays
 * type-checked). Trim, snapshot and arena destroy run them all
 * (report.c: sa__world_check). */
#define SA_VALIDATE(call) (SA_INVARIANTS ? (void)(call) : (void)0)

/* Where a structure can grow large, a walk after every operation would
 * make a stress test quadratic in its size, so those calls are paced:
 * each earns SA_CHECK_CREDIT element visits, and the walk runs once the
 * credit covers what the last walk visited (a paced validator returns
 * that count). A structure of up to SA_CHECK_CREDIT elements is walked at
 * every call; a larger one costs each operation SA_CHECK_CREDIT visits on
 * average, whatever its size. The pace lives under the same lock as the
 * structure. */
#define SA_CHECK_CREDIT 32
typedef struct sa_check_pace_s {
  size_t credit; /* visits earned since the last walk */
  size_t cost;   /* visits the last walk made */
} sa_check_pace;
#if SA_INVARIANTS
#define SA_VALIDATE_PACED(pace, call) \
  (sa__pace_due(pace) ? sa__pace_done((pace), (call)) : (void)0)
#else
#define SA_VALIDATE_PACED(pace, call) ((void)0)
#endif
static inline bool sa__pace_due(sa_check_pace *p) {
  p->credit += SA_CHECK_CREDIT;
  return p->credit >= p->cost;
}
static inline void sa__pace_done(sa_check_pace *p, size_t visited) {
  p->credit = 0;
  p->cost = visited;
}

#define SA_KEEP_EMPTY_SUPERBLOCKS 2 /* per stream, kept before going global */
#define SA_TARGET_SLACK 64         /* footprint target: peak live x (1 + 1/64) */
#define SA_TARGET_FLOOR 8          /* ... plus 8 granules (physical.c) */
#define SA_AHEAD_SHARE 512         /* a climb maps ahead 1/512 of what is held (span.c) */
#define SA_LIVE_FLUSH_BYTES (256u << 10) /* per-thread live-byte slack, plus a block */
#define SA_BATCH_MAX 64            /* blocks per cross-stream batch */
#define SA_LANE_LOOKUP 64          /* pending lanes a new batch looks at (stream_arena.c) */
#define SA_RECORD_BUCKET_BITS 10 /* the record table's first size; it doubles */
#define SA_SUPERBLOCK_MAX ((size_t)1 << 30) /* block offsets stay below 2^32 */
#define SA_VA_RESERVE_MAX ((size_t)1 << 46) /* 64 TiB */
#define SA_REGISTRY_SLOT_BITS 32     /* arenas own whole 4 GiB slots (registry.c) */
#define SA_REGISTRY_SLOT ((uintptr_t)1 << SA_REGISTRY_SLOT_BITS)
#define SA_REGISTRY_ADDRESS_BITS 57  /* x86-64 with 5-level paging */

typedef struct sa_stream_arena_s sa_stream_arena;
typedef struct sa_tentry_s sa_tentry;

/* Zeroed memory aligned for types declared with CK_CC_CACHELINE members
 * (calloc only guarantees 16 bytes). Free with free(). */
static inline void *sa__zalloc_aligned(size_t size, size_t align) {
  size_t rounded = (size + align - 1) / align * align;
  void *p = aligned_alloc(align, rounded);
  if (p != NULL) memset(p, 0, rounded);
  return p;
}

/* A doubly linked list threaded through type's own next_field and
 * prev_field, its head a pointer to the first node: defines name_push (to
 * the front) and name_unlink (n's own links stay as they were). A macro
 * because C has no generics: nodes keep typed links, and walks over them
 * stay plain loops. Unused: a list may need only one of the two. */
#define SA_DLIST_FUNCTIONS(name, type, next_field, prev_field)                      \
  static inline __attribute__((unused)) void name##_push(type **head, type *n) {    \
    n->prev_field = NULL;                                                           \
    n->next_field = *head;                                                          \
    if (*head != NULL) (*head)->prev_field = n;                                     \
    *head = n;                                                                      \
  }                                                                                 \
  static inline __attribute__((unused)) void name##_unlink(type **head, type *n) {  \
    if (n->prev_field != NULL)                                                      \
      n->prev_field->next_field = n->next_field;                                    \
    else                                                                            \
      *head = n->next_field;                                                        \
    if (n->next_field != NULL) n->next_field->prev_field = n->prev_field;           \
  }

/* ------------------------------------------------------------------------
 * Chained hash tables (chain_table.c): the chains run through the entries,
 * each of which embeds a link. The owner holds the lock and decides when
 * the table doubles.
 * ---------------------------------------------------------------------- */
typedef struct sa_chain_link_s {
  uintptr_t key;                /* set by the owner before the entry is pushed */
  struct sa_chain_link_s *next; /* in its chain */
} sa_chain_link;

typedef struct sa_chain_table_s {
  sa_chain_link **heads; /* 2^bits chains; NULL until sa__chain_create */
  unsigned bits;
  unsigned key_shift;    /* low key bits left out of the hash: they vary little */
  size_t n;              /* entries in the table */
} sa_chain_table;

/* 2^bits empty chains; false (nothing made) when out of memory. */
bool sa__chain_create(sa_chain_table *t, unsigned bits, unsigned key_shift);
/* Twice the chains, entries moved; false (the table as it was) when out of
 * memory: chains get longer, nothing is lost. */
bool sa__chain_double(sa_chain_table *t);
void sa__chain_remove(sa_chain_table *t, sa_chain_link *l); /* l linked or not */
void sa__chain_destroy(sa_chain_table *t); /* the chains; the entries are the owner's */

static inline size_t sa__chain_buckets(const sa_chain_table *t) { return (size_t)1 << t->bits; }
/* Fibonacci hashing: the top bits of the product pick the chain. */
static inline sa_chain_link **sa__chain_bucket(const sa_chain_table *t, uintptr_t key) {
  return &t->heads[(uint64_t)(key >> t->key_shift) * 0x9E3779B97F4A7C15ull >> (64 - t->bits)];
}
/* The link that points at key's entry, or the null link ending its chain. */
static inline sa_chain_link **sa__chain_find(const sa_chain_table *t, uintptr_t key) {
  sa_chain_link **pl = sa__chain_bucket(t, key);
  while (*pl != NULL && (*pl)->key != key) pl = &(*pl)->next;
  return pl;
}
/* Key's entry's link, NULL if none (or no table yet). */
static inline sa_chain_link *sa__chain_get(const sa_chain_table *t, uintptr_t key) {
  return t->heads != NULL ? *sa__chain_find(t, key) : NULL;
}
static inline void sa__chain_push(sa_chain_table *t, sa_chain_link *l) { /* l->key set */
  sa_chain_link **head = sa__chain_bucket(t, l->key);
  l->next = *head;
  *head = l;
  t->n++;
}
static inline void sa__chain_unlink(sa_chain_table *t, sa_chain_link **pl) { /* *pl's entry */
  *pl = (*pl)->next;
  t->n--;
}
/* The entry of the given type whose member l is; NULL for NULL. */
#define sa__chain_entry(l, type, member) ((type *)sa__chain_entry_at((l), offsetof(type, member)))
static inline void *sa__chain_entry_at(sa_chain_link *l, size_t offset) {
  return l != NULL ? (char *)l - offset : NULL;
}

/* ------------------------------------------------------------------------
 * Descriptors: what a page of the reserved range belongs to. They live
 * in host memory and are type-stable until the arena is destroyed (a
 * lock-free pop may still read a descriptor that was just taken).
 * ---------------------------------------------------------------------- */
/* SA_DESC_RUN: a run of mapped memory for large allocations (span.c); the
 * spans in it are found by address through the arena's live map. */
typedef enum sa_desc_kind_e { SA_DESC_SUPERBLOCK = 1, SA_DESC_RUN = 2 } sa_desc_kind;

/* Block states, one byte per block (distinct bytes: no read-modify-write). */
enum {
  SA_BLOCK_FREE = 0,     /* in its superblock's free pool */
  SA_BLOCK_CACHED = 1,   /* in a thread cache */
  SA_BLOCK_LIVE = 2,     /* handed to the user */
  SA_BLOCK_RECORDED = 3, /* handed to the user, sa_record_stream called */
  SA_BLOCK_DEFERRED = 4  /* freed, waiting for an event */
};

/* Physical memory (physical.c): a chunk (sa_phys) is one driver allocation,
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

typedef struct sa_desc_s {
  sa_desc_kind kind;
  uintptr_t base;
  size_t size;       /* virtual bytes, a multiple of the page map's unit */
  sa_chunk *chunks;  /* chunks mapped here, in address order */
} sa_desc;

/* Superblocks mapped together (superblock.c): one chunk for nslots
 * superblocks of slot bytes, unmapped once none of them is carved. */
#define SA_SLAB_MAX 16
/* The page map's unit where the granule is larger: superblocks smaller than
 * a granule (superblock.c) and those carved in free span memory start and
 * end on one, so that each page names one descriptor. */
#define SA_PAGE_MAX ((size_t)256 << 10)
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
  struct sa_span_s *span;           /* or the span of a run it was carved in */
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

/* Large allocations (span.c). A run is a contiguous mapped range of the
 * reserved space, tiled by spans in address order: live ones (a user's
 * allocation) and free ones (mapped, waiting for reuse). A free span's marks
 * say which streams' work may still touch it. Two kinds:
 *   - a free's mark: a (stream arena, ticket) pair on the timeline of the
 *     stream it was freed on (timeline.c). A thread that knew a destroyed
 *     stream's handle takes tickets for the next stream with that handle on
 *     the same timeline; that is safe because the header asks a stream to
 *     be synchronized before it is destroyed with work queued on memory
 *     freed on it, so its own tickets are complete by then.
 *   - a recorded mark (sa_record_stream): an event of its own, recorded at
 *     the free on the recorded stream. No such rule covers that stream (it
 *     may be destroyed with the work queued), so the mark stays tied to that
 *     work whatever stream gets the handle next: a timeline would resolve
 *     its ticket through events recorded later on the new stream.
 * The pieces of a split span share a recorded mark's event, counted. */
typedef struct sa_mark_event_s {
  sa_event event;
  unsigned refs; /* marks that name it (arena lock) */
  bool done;     /* a query or a synchronize saw it complete */
} sa_mark_event;

typedef struct sa_mark_s {
  sa_stream_arena *stream;  /* a free's mark: the timeline; NULL: recorded */
  uint64_t ticket;
  sa_mark_event *recorded;  /* a recorded mark's event; NULL: a free's mark */
} sa_mark;

/* Is m's work known complete, without a driver call? */
bool sa__mark_known_done(const sa_mark *m);

#define SA_SPAN_STARTS 4
typedef struct sa_span_s {
  uintptr_t base;
  size_t size;                      /* a multiple of SA_SPAN_QUANTUM */
  struct sa_run_s *run;
  struct sa_span_s *prev, *next;    /* neighbours in the run, address order */
  struct sa_span_s *left, *right;   /* free: the fit index (span_index.c) */
  uint64_t prio;
  sa_mark *marks;                   /* free: reuse waits for these */
  unsigned nmarks, marks_cap;       /* the array stays with the descriptor */
  uintptr_t starts[SA_SPAN_STARTS]; /* free: starts of spans freed into it, */
  unsigned nstarts;                 /* the latest first (double frees) */
  sa_stream_arena *owner;           /* live: the stream it was allocated on */
  size_t request;                   /* live: bytes the user asked for */
  sa_desc *holder;                  /* live: the superblock carved in it, else NULL */
  _Atomic uint8_t xstate;           /* SA_BLOCK_LIVE/RECORDED, or FREE */
  struct sa_span_s *all_next;       /* every descriptor, spare ones too */
} sa_span;

typedef struct sa_run_s {
  sa_desc hdr;                      /* kind SA_DESC_RUN; chunks in address order */
  sa_span *first, *last;
  struct sa_run_s *next, *prev;     /* the arena's runs, address order */
  struct sa_run_s *all_next;        /* every descriptor (type-stable) */
} sa_run;

/* Spans are split and merged in multiples of this (a span of 1 MiB + 1
 * byte takes 1 MiB + 256 bytes, not two granules). */
#define SA_SPAN_QUANTUM ((size_t)SA_ALIGNMENT)

/* Live spans by base address (span_index.c). */
typedef struct sa_live_map_s {
  sa_span **slots;
  size_t cap, n;
} sa_live_map;

/* A stream's timeline (timeline.c): tickets handed out at its span frees
 * and a ring of events recorded at them. Arena lock. */
#define SA_TIMELINE_EVENTS 8
typedef struct sa_timeline_s {
  sa_event ev[SA_TIMELINE_EVENTS];
  uint64_t ticket[SA_TIMELINE_EVENTS]; /* the ticket its last record marks; 0: none */
  uint64_t next;                       /* the last ticket handed out */
  uint64_t done;                       /* tickets up to this one completed */
} sa_timeline;

/* A block handed to a thread cache: the address and its state byte. */
typedef struct sa_cached_block_s {
  void *p;
  _Atomic uint8_t *state;
} sa_cached_block;

/* Blocks freed on another stream than their owner's, or after
 * sa_record_stream: usable by the owner once every event completed. */
typedef struct sa_deferred_s {
  ck_stack_entry_t link;            /* owner's inbox */
  _Atomic uint64_t xhandoff;        /* see sa__handoff_publish */
  struct sa_deferred_s *next;       /* owner's pending list: the next lane's first */
  struct sa_deferred_s *lane_next;  /* pending: the next batch of its lane */
  struct sa_deferred_s *lane_tail;  /* a lane's first batch: its last */
  sa_stream on;                     /* the stream events[0] was recorded on (its lane) */
  sa_stream_arena *owner;
  sa_stream_arena *freer;           /* freed on this stream arena (while open or parked) */
  uint64_t gen;                     /* the owner's stream (never given an event here:
                                       it orders the block's reuse there itself), and
                                       the freer's while parked, may use the blocks
                                       until a device sync of a later generation
                                       completed (device_sync.c); set when handed on */
  unsigned nevents;
  sa_event *events;                 /* inline_events, or more (sa__deferred_new) */
  sa_event inline_events[4];
  uint32_t n;
  sa_cached_block blocks[SA_BATCH_MAX];
} sa_deferred;

/* The batch an inbox entry is the link of. */
static inline sa_deferred *sa__deferred_of(const ck_stack_entry_t *e) {
  return (sa_deferred *)((const char *)e - offsetof(sa_deferred, link));
}

/* A batch with room for max_events events (a recorded block needs one per
 * stream); NULL when out of memory. Free with sa__deferred_free. */
static inline sa_deferred *sa__deferred_new(unsigned max_events) {
  sa_deferred *d = calloc(1, sizeof *d);
  if (d == NULL) return NULL;
  d->gen = UINT64_MAX;
  d->events = d->inline_events;
  if (max_events > sizeof d->inline_events / sizeof d->inline_events[0]) {
    d->events = malloc(max_events * sizeof *d->events);
    if (d->events == NULL) {
      free(d);
      return NULL;
    }
  }
  return d;
}
static inline void sa__deferred_free(sa_deferred *d) {
  if (d != NULL && d->events != d->inline_events) free(d->events);
  free(d);
}

/* ------------------------------------------------------------------------
 * Stream arena: one per (arena, stream).
 * ---------------------------------------------------------------------- */
struct sa_stream_arena_s {
  sa_arena *arena;
  sa_stream stream;
  uint64_t sid;                      /* the driver's id of the stream (stream_id) */
  uint64_t id;                       /* unique in the arena; compared, never followed */
  pthread_mutex_t lock;
  CK_CC_CACHELINE ck_stack_t inbox; /* sa_deferred pushed by any thread */
  sa_superblock *bins[SA_CLASS_COUNT]; /* superblocks with free blocks */
  uint8_t carved[SA_CLASS_COUNT];     /* fresh superblocks carved for each class (saturates) */
  sa_superblock *empty;              /* empty superblocks kept here */
  unsigned nempty;
  sa_deferred *pending;              /* drained, events not complete: lanes */
  size_t pending_blocks;
  sa_deferred *parked;               /* batches freed here, waiting for an event here */
  size_t nsuperblocks;               /* owned (bins, full, empty) */
  _Atomic size_t xspans;             /* live spans allocated here */
  _Atomic size_t xentries;           /* thread cache entries bound here, and holders */
  sa_tentry *bound;                  /* those entries (thread_cache.c's entries_lock) */
  _Atomic bool xunfenced;            /* something here may wait for an event here */
  _Atomic bool xgone;                /* released, or its stream destroyed: no driver
                                        call on it again, never looked up again */
  bool synced;                       /* gone through sa_stream_release, which waited
                                        for its work (written before xgone) */
  bool doomed;                       /* reap's mark (streams.rw held for writing) */
  sa_timeline timeline;              /* span frees on this stream (arena lock) */
  struct sa_stream_arena_s *next, *prev; /* arena's list (lock; streams.rw to unlink) */
  sa_chain_link live_link;           /* key: stream; in the live index while not gone
                                        (arena lock) */
  struct sa_stream_arena_s *gone_next; /* arena's gone list, once gone (lock;
                                          streams.rw to unlink) */
#if SA_INVARIANTS /* last, and only where asserts are on: release layout unchanged */
  sa_check_pace pace, superblock_pace; /* its validator's, its superblocks' (lock) */
#endif
};

/* ------------------------------------------------------------------------
 * Thread cache entry: one per (thread, arena, stream).
 * ---------------------------------------------------------------------- */
typedef struct sa_tbin_s {
  uint16_t n, cap;
  uint32_t block_size; /* of its class: the fast paths need not compute it */
  sa_cached_block *slots;
} sa_tbin;

struct sa_tentry_s {
  _Atomic(sa_arena *) xarena; /* NULL once the arena is destroyed */
  sa_stream stream;
  sa_stream_arena *sarena;    /* bound (a reference); NULL: bound on next use */
  uint64_t epoch;             /* arena's stream epoch when last checked */
  /* The arena's range, copied: sa_free's fast path reads the arena only
   * for a pointer in it, whose arena no other thread may be destroying. */
  uintptr_t va_base;
  size_t va_size;
  sa_tbin bins[SA_CLASS_COUNT]; /* 16-byte aligned: none straddles a cache line */
  /* Counters: written by the owning thread only (no read-modify-write),
   * read by sa_get_stats. Slow-path counts are kept by the arena. */
  _Atomic uint64_t xfast_allocs, xfast_frees;
  int64_t live_delta;         /* not yet published to the arena */
  sa_deferred *out;           /* open cross-stream batch */
  uint64_t last_use;          /* its thread cache's clock: least recently used goes */
  struct sa_tentry_s *arena_next, *arena_prev; /* arena's entry list */
  struct sa_tentry_s *bound_next, *bound_prev; /* sarena's bound list */
  struct sa_tcache_s *cache;
};

/* ------------------------------------------------------------------------
 * The arena (global arena of one device): the arena's own fields, then one
 * sub-struct per layer, each written by the file named beside it.
 * ---------------------------------------------------------------------- */

/* The reserved range and its page map (va_space.c): what a pointer is
 * looked up in. Set at creation, never moved. */
typedef struct sa_range_s {
  uintptr_t base;               /* starts on a registry slot boundary */
  size_t size;
  _Atomic(sa_desc *) *pagemap;  /* the descriptor of each page */
  unsigned page_shift;          /* the page map's unit: the granule, at most SA_PAGE_MAX */
} sa_range;

/* The reservation around the range, and its free ranges (va_space.c; arena
 * lock). */
typedef struct sa_va_space_s {
  uintptr_t reserved_base;      /* the range lies inside, with a slot of slack */
  size_t reserved_size;
  struct sa_va_free_s *free;    /* sorted free ranges */
  size_t used;
} sa_va_space;

/* Physical memory (physical.c; arena lock): chunks, the chunk cache, the
 * limits, and the remapping ledger. */
typedef struct sa_physical_s {
  size_t cap;                   /* max_physical, or the device's memory */
  size_t reserve_limit;         /* the user's soft budget, else cap */
  bool budgeted;                /* max_physical or reserve_limit configured:
                                   spans near whole granules take whole ones */
  sa_phys *all;                 /* every chunk */
  sa_chunk *cache;              /* unmapped chunks, no pending work */
  size_t cache_bytes;
  sa_chunk *stuck;              /* ranges whose unwind the driver refused */
  size_t bytes, peak, nchunks;  /* of chunks */
  /* The remapping ledger: bytes created, bytes of cached chunks mapped
   * again, superblocks carved in free spans (superblock.c). Written under
   * the lock, read by alloc.c without. */
  _Atomic size_t xcreated_bytes, xremapped_bytes, xcarved_bytes;
#if SA_INVARIANTS /* last, and only where asserts are on */
  sa_check_pace pace;           /* its validator's */
#endif
} sa_physical;

/* Superblocks (superblock.c): descriptors, slabs, the global free stack. */
typedef struct sa_small_s {
  CK_CC_CACHELINE ck_stack_t free_superblocks; /* empty, mapped */
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

/* Large allocations (span.c, span_index.c; arena lock). */
typedef struct sa_spans_s {
  sa_run *runs;                 /* mapped runs of spans, address order */
  sa_run *all_runs, *spare_runs;
  sa_span *all_spans, *spare_spans; /* span descriptors */
  sa_span *fit_root;            /* free spans by size (span_index.c) */
  sa_live_map live_map;         /* live spans by base (span_index.c) */
  size_t free_bytes;            /* in free spans */
  size_t nlive;                 /* live spans */
  uint64_t frees;               /* spans freed so far */
  uint64_t reshape_futile;      /* frees + 1 when the last reshape found too
                                   little (span.c): none again until a free */
#if SA_INVARIANTS
  sa_check_pace pace;           /* its validator's */
#endif
} sa_spans;

/* The stream arenas (stream_arena.c). Their epoch, which the fast paths
 * read, is in the arena's leading cache line. */
typedef struct sa_streams_s {
  sa_stream_arena *list;        /* every stream arena (arena lock) */
  pthread_rwlock_t rw;          /* read: walk the list unlocked; write: unlink */
  uint64_t next_id;             /* (arena lock) */
  _Atomic size_t xgone;         /* stream arenas gone, not yet reaped */
  sa_stream_arena *gone;        /* those, for reap (arena lock) */
  sa_chain_table live_index;    /* live ones by handle (arena lock) */
} sa_streams;

/* Device sync generations (device_sync.c). */
typedef struct sa_sync_s {
  _Atomic uint64_t xstarted, xdone;
} sa_sync;

/* The event pool (event_pool.c). */
typedef struct sa_events_s {
  pthread_mutex_t lock;
  sa_event *pool;
  size_t n, cap;
  _Atomic size_t xin_flight;    /* recorded and not yet consumed */
} sa_events;

/* The thread cache entries of this arena (thread_cache.c's entries_lock). */
typedef struct sa_tcaches_s {
  sa_tentry *entries;
  /* The fast paths' counts of exited threads' entries. */
  _Atomic uint64_t xretired_fast_allocs, xretired_fast_frees;
} sa_tcaches;

/* sa_record_stream's side table (record.c). */
typedef struct sa_records_s {
  pthread_mutex_t lock;
  pthread_rwlock_t rw;          /* read: a free uses the streams of a record it
                                   took; write: sa_stream_release forgets a
                                   stream */
  sa_chain_table table;         /* (lock) */
} sa_records;

/* Statistics kept on slow paths (arena.c reports them). */
typedef struct sa_counters_s {
  _Atomic int64_t xlive_bytes;
  _Atomic int64_t xlive_peak;
  _Atomic uint64_t xslow_allocs, xslow_frees; /* not served by a thread cache */
  _Atomic uint64_t xlarge_allocs;              /* of the slow allocations, spans */
  _Atomic size_t xdeferred_blocks;
  _Atomic uint64_t xoom_events, xdefrags;
} sa_counters;

/* The trace's lines (trace.c); its file is in the leading cache line. */
typedef struct sa_tracing_s {
  pthread_mutex_t lock;
  uint64_t seq;
} sa_tracing;

struct sa_arena_s {
  /* The leading cache line: all that sa_alloc's and sa_free's fast paths
   * read of the arena. */
  sa_range range;                  /* va_space.c */
  _Atomic uint64_t xstream_epoch;  /* bumped when a stream arena goes (stream_arena.c) */
  _Atomic size_t xlarge_threshold; /* larger requests take a span (arena.c) */
  FILE *trace;                     /* the trace's file, NULL without (trace.c) */
  bool hooks;                      /* tracing or checking after each handout */

  /* The arena's own (arena.c). */
  uint64_t id;
  sa_driver *drv;
  sa_config cfg;
  size_t gran;
  unsigned gran_shift;
  bool large_threshold_explicit;
  pthread_mutex_t lock;         /* physical, va, spans, stream map, lists */
  pthread_mutex_t reclaim_lock; /* one reclaim pass at a time (reclaim.c); then the arena lock */

  sa_va_space va;               /* va_space.c */
  sa_physical physical;         /* physical.c */
  sa_small small;               /* superblock.c */
  sa_spans spans;               /* span.c, span_index.c */
  sa_streams streams;        /* stream_arena.c */
  sa_sync sync;                 /* device_sync.c */
  sa_events events;             /* event_pool.c */
  sa_tcaches tcaches;           /* thread_cache.c */
  sa_records records;        /* record.c */
  sa_counters stats;            /* alloc.c, thread_cache.c, ...; arena.c reports them */
  sa_tracing tracing;           /* trace.c */
};
_Static_assert(offsetof(sa_arena, hooks) < 64 && _Alignof(sa_arena) >= 64,
               "what the fast paths read fits the arena's leading cache line");

/* ------------------------------------------------------------------------
 * Cross-file functions, grouped by the file that defines them.
 * ---------------------------------------------------------------------- */

/* default_arena.c */
/* Device's default arena as it is now: NULL if none was made, or since
 * sa_default_arenas_shutdown; creates nothing (the PyTorch plugin's
 * statistics and empty_cache). */
sa_arena *sa__default_arena_now(int device);

/* config.c: the rules a configuration must meet on a device */
typedef struct sa_resolved_s {
  size_t superblock_size, large_threshold, physical_cap, va_size;
  bool large_threshold_explicit;
} sa_resolved;
/* Resolve c's zeros against a device of granularity gran and total bytes
 * and check every rule between the sizes; SA_ERR_BAD_CONFIG with a message
 * naming the key, its value and the rule. */
sa_status sa__config_resolve(const sa_config *c, size_t gran, size_t total, sa_resolved *r,
                             char *err, size_t err_size);
/* The largest large_threshold whose size class fits in a superblock. */
size_t sa__threshold_limit(size_t superblock_size);

/* hook.c: points where a test may pause (test/ sets sa__test_hook). */
typedef enum sa_hook_point_e {
  SA_HOOK_ENTRY_DETACHED, /* arena destroy handed a thread's cache entry back to its owner */
  SA_HOOK_HANDLE_REUSED,  /* a lookup found a live stream arena whose handle names a new
                             stream (arg: that stream arena), before it marks it gone */
  SA_HOOK_RUN_PAGES_NAMED, /* a join or cut named some of a run's pages (arg: the run) */
  SA_HOOK_FAST_COUNTS,     /* sa_get_stats is about to count the fast paths (arg: arena) */
  SA_HOOK_FREE_FAST_ARENA, /* sa_free's fast path is about to read its last entry's arena
                              (arg: that arena) */
  SA_HOOK_RECLAIM_POPPED,  /* reclaim took a superblock off the global stack, before it
                              looks at its event (arg: the superblock) */
  SA_HOOK_LIVE_ADDED,      /* a thread added its live bytes to the arena's count, before
                              it raises the peak (arg: the arena) */
} sa_hook_point;
typedef void (*sa_hook_fn)(sa_hook_point point, void *arg);
extern _Atomic(sa_hook_fn) sa__test_hook;
static inline void sa__hook(sa_hook_point point, void *arg) {
  sa_hook_fn h = atomic_load_explicit(&sa__test_hook, memory_order_acquire);
  if (sa_unlikely(h != NULL)) h(point, arg);
}
/* On a fast path, only where asserts are on (tests): even a load and a
 * branch would cost every call of a release build. */
#ifdef NDEBUG
#define sa__hook_fast(point, arg) ((void)(arg))
#else
#define sa__hook_fast(point, arg) sa__hook(point, arg)
#endif

/* registry.c: address -> arena, lock-free */
sa_arena *sa__arena_of(uintptr_t p); /* live arena holding p, or NULL */
sa_status sa__registry_add(sa_arena *a);   /* once a is complete */
void sa__registry_remove(sa_arena *a);     /* before a is torn down */

/* arena.c */
/* The arena's live-byte peak, raised to now if below. */
static inline void sa__live_peak_raise(sa_arena *a, int64_t now) {
  int64_t peak = atomic_load_explicit(&a->stats.xlive_peak, memory_order_relaxed);
  while (now > peak && !atomic_compare_exchange_weak_explicit(&a->stats.xlive_peak, &peak, now,
                                                              memory_order_relaxed,
                                                              memory_order_relaxed)) {
  }
}
/* The arena's live-byte count and its peak (thread caches publish theirs). */
static inline void sa__live_add(sa_arena *a, int64_t delta) {
  int64_t now = atomic_fetch_add_explicit(&a->stats.xlive_bytes, delta, memory_order_relaxed) + delta;
  sa__hook_fast(SA_HOOK_LIVE_ADDED, a); /* every span alloc and free publishes */
  sa__live_peak_raise(a, now);
}
/* SA_OK, or SA_ERR_UNKNOWN_STREAM where s is NULL (CUDA: or
 * CU_STREAM_LEGACY) and the calling thread's current context is another
 * device's, whose legacy stream s names there (streamarena.h, on
 * sa_stream). A thread may switch contexts between calls while its cache
 * entry for (arena, s) stays, so every call that names s asks before it
 * uses the entry: alloc.c's slow paths and sa_record_stream,
 * sa_stream_release, and (out of line, calling the driver directly) the
 * fast paths' alloc_legacy and free_legacy. Any other handle: one
 * compare. */
static inline sa_status sa__legacy_stream_check(sa_arena *a, sa_stream s) {
  if (sa_likely(!sa_driver_stream_is_legacy(s))) return SA_OK;
  return a->drv->ops->legacy_stream_check(a->drv, s);
}

/* va_space.c: all with the arena lock held */
sa_status sa__va_init(sa_arena *a);
void sa__va_fini(sa_arena *a);
sa_status sa__va_alloc(sa_arena *a, size_t size, uintptr_t *out); /* lowest fit */
/* In the middle of the highest free range that fits, granule-aligned. */
sa_status sa__va_alloc_middle(sa_arena *a, size_t size, uintptr_t *out);
/* Take exactly [va, va + size), which must be free. */
sa_status sa__va_claim(sa_arena *a, uintptr_t va, size_t size);
/* Bytes of free range just below / from va (0: va is not next to one). */
size_t sa__va_free_below(const sa_arena *a, uintptr_t va);
size_t sa__va_free_above(const sa_arena *a, uintptr_t va);
void sa__va_free(sa_arena *a, uintptr_t va, size_t size);
void sa__pagemap_set(sa_arena *a, uintptr_t va, size_t size, sa_desc *d);
/* The descriptor of the page at offset off of a's range (off < range.size). */
static inline sa_desc *sa__pagemap_at(const sa_arena *a, uintptr_t off) {
  return atomic_load_explicit(&a->range.pagemap[off >> a->range.page_shift], memory_order_acquire);
}
static inline sa_desc *sa__pagemap_get(const sa_arena *a, uintptr_t p) {
  uintptr_t off = p - a->range.base;
  return off < a->range.size ? sa__pagemap_at(a, off) : NULL;
}

/* physical.c: all with the arena lock held */
#define SA_CHUNK_MAX ((size_t)2 << 30) /* bytes per chunk created, at most */
/* Chunks for need bytes (a granule multiple), *got bytes in all, at most
 * most: cached ones first, then new ones, within limit physical bytes
 * held; when memory is created, ahead bytes more where they too fit under
 * limit (a growth mapped ahead of the requests that follow it: span.c). */
sa_status sa__physical_gather(sa_arena *a, size_t need, size_t ahead, size_t most, size_t limit,
                              sa_chunk **out, size_t *got);
/* Map chunks back to back at va (claimed in the va space: size bytes, the
 * chunks' sum) with one access setting. On failure the range is the
 * caller's no more: the chunks go back to the cache and the range to the
 * va space, but for what the driver refused to unmap again, which stays
 * mapped, a stuck range, until sa__physical_unmap_stuck succeeds. */
sa_status sa__physical_map_at(sa_arena *a, uintptr_t va, size_t size, sa_chunk *chunks);
/* The same at d->base for d->size bytes; d->chunks are the chunks on
 * success, NULL on failure. */
sa_status sa__physical_map(sa_arena *a, sa_desc *d, sa_chunk *chunks);
/* Unmap the stuck ranges (their chunks to the cache, their range to the va
 * space); the first failure, those refused staying stuck. */
sa_status sa__physical_unmap_stuck(sa_arena *a);
void sa__physical_return(sa_arena *a, sa_chunk *chunks); /* to the cache */
size_t sa__chunks_bytes(const sa_chunk *chunks);          /* their bytes in all */
sa_status sa__physical_unmap(sa_arena *a, sa_desc *d); /* chunks to the cache */
/* The physical bytes past which an allocation reshapes before it grows:
 * reserve_limit when the user set one, else the footprint target. */
size_t sa__physical_soft_limit(const sa_arena *a);
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
#define SA_REMAP_SHARE 8 /* remap at most 1/8 of the bytes created (physical.c) */
#define SA_REMAP_TRICKLE 1024
size_t sa__physical_remap_allowance(const sa_arena *a, size_t limit);

/* event_pool.c */
sa_status sa__event_get(sa_arena *a, sa_event *out);
void sa__event_put(sa_arena *a, sa_event e);
/* Record a pooled event on stream. */
sa_status sa__event_record_new(sa_arena *a, sa_stream stream, sa_event *out);
/* Make stream wait for e unless e already completed; then e goes back to the
 * pool. On error e is still returned to the pool. */
sa_status sa__event_consume(sa_arena *a, sa_event e, sa_stream stream);
/* Retire e into the pool if it completed (with wait: once it has);
 * SA_ERR_NOT_READY leaves e with the caller. */
sa_status sa__event_retire(sa_arena *a, sa_event e, bool wait);
/* Destroy paths: wait for e and pool it; if the wait fails, destroy e
 * rather than lose it. Returns the wait's status. */
sa_status sa__event_settle(sa_arena *a, sa_event e);
/* Back to the pool without waiting: stream order already covers it (a pending
 * event may be re-recorded; waits enqueued earlier keep their target). */
void sa__event_drop(sa_arena *a, sa_event e);
sa_status sa__event_pool_fini(sa_arena *a); /* the first event_destroy failure */

/* superblock.c */
sa_status sa__superblock_acquire(sa_stream_arena *sa, unsigned cls, size_t limit,
                                 sa_superblock **out); /* limit: as sa__stream_arena_take */
sa_status sa__superblock_format(sa_superblock *sb, unsigned cls); /* owner lock */
/* sb (no stream owns it now) to the global stack with the event of its
 * last stream (NULL: none needed), recorded by stream arena event_owner. */
void sa__superblock_to_global(sa_arena *a, sa_superblock *sb, sa_event e, uint64_t event_owner);
sa_superblock *sa__superblock_pop_global(sa_arena *a);
/* sb was popped from the global stack: unmap it (chunks to the cache) once
 * its work completed (with wait: after waiting), else put it on *keep for
 * sa__superblock_push_all, which puts such a list back on the stack. */
void sa__superblock_unmap_or_keep(sa_arena *a, sa_superblock *sb, bool wait,
                                  sa_superblock **keep);
void sa__superblock_push_all(sa_arena *a, sa_superblock *list);
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

/* device_sync.c: what a device-wide synchronize makes clean */
/* The generation of a hand-back made now, after the frees it covers: clean
 * once a device sync that started later completed (sa__clean_since). A
 * read-modify-write, so that the sync's increment reads from it and so
 * happens after those frees (a load could pass the driver's stores). Once
 * per batch of blocks, never per block. */
static inline uint64_t sa__sync_gen(sa_arena *a) {
  return atomic_fetch_add_explicit(&a->sync.xstarted, 0, memory_order_seq_cst);
}
static inline bool sa__clean_since(sa_arena *a, uint64_t gen) {
  return atomic_load_explicit(&a->sync.xdone, memory_order_acquire) > gen;
}
/* Wait for all of the device's work (driver device_synchronize). */
sa_status sa__device_sync(sa_arena *a);

/* stream_arena.c. named: the caller is inside an API call that names the
 * stream arena's stream, the only place a driver call on it may happen. */
/* The live stream arena of s, created if needed; bound for the caller
 * (sa__stream_arena_unbind when done). A stream arena of a destroyed
 * stream whose handle s now names is found out by the stream's id. */
sa_status sa__stream_arena_get(sa_arena *a, sa_stream s, sa_stream_arena **out);
void sa__stream_arena_unbind(sa_stream_arena *sa);
static inline bool sa__stream_arena_gone(sa_stream_arena *sa) {
  return atomic_load_explicit(&sa->xgone, memory_order_acquire);
}
/* Named; limit: the physical bytes a new superblock may take the arena to. */
uint32_t sa__stream_arena_take(sa_stream_arena *sa, unsigned cls, sa_cached_block *out,
                               uint32_t want, size_t limit, sa_status *st);
void sa__stream_arena_give(sa_stream_arena *sa, const sa_cached_block *blocks, uint32_t n,
                           bool named);
void sa__stream_arena_push_deferred(sa_stream_arena *owner, sa_deferred *d);
/* A cross-stream batch freed on d->freer goes to its owner: behind an
 * event recorded now when named (SA_ERR_DRIVER if that fails: d stays with
 * the caller), without one when the freer was released, else parked on the
 * freer until a later named call or a device sync makes it safe. */
sa_status sa__stream_arena_hand_over(sa_deferred *d, bool named);
/* Named: one event for what waits here for one (parked batches, empty
 * superblocks whose blocks came back without a call naming the stream).
 * *renamed: the handle names another stream now (the stream id differs,
 * or the handle is no stream), and sa is gone instead. A failed id query's
 * status (SA_ERR_DRIVER): nothing changed. */
sa_status sa__stream_arena_fence(sa_stream_arena *sa, bool *renamed);
void sa__stream_arena_shed(sa_stream_arena *sa, bool named); /* empties to global */
/* Every stream arena: settle what completed or became clean, shed empties
 * (named for none), and free stream arenas that are gone and hold nothing. */
void sa__stream_arenas_settle(sa_arena *a);
void sa__stream_arenas_reap(sa_arena *a); /* free those gone and holding nothing */
size_t sa__stream_arenas_live(sa_arena *a); /* stream arenas not gone */
/* sa_stream_release's part here: wait for s, then its stream arena is gone
 * (bound for the caller; NULL if there was none). */
sa_status sa__stream_arena_release(sa_arena *a, sa_stream s, sa_stream_arena **out);
void sa__stream_arenas_destroy(sa_arena *a); /* device synchronized already */
/* Validators; each returns the elements it visited (SA_VALIDATE_PACED).
 * One stream arena, its lock held: bins, nempty (the empty list),
 * pending_blocks (the pending lanes), parked batches. Every stream arena
 * and superblock, the world lock held (report.c): each stream arena and
 * its timeline, each superblock, the arena's list, the live index, the
 * gone list, and nsuperblocks against the superblocks' owners. */
size_t sa__stream_arena_check(const sa_stream_arena *sa);
size_t sa__stream_arenas_check(sa_arena *a);

/* span.c: sizes in bytes; limit: the physical bytes growth may reach */
sa_status sa__span_alloc(sa_arena *a, sa_stream_arena *sa, size_t size, size_t limit,
                         void **out);
/* Map size bytes (rounded up to the granularity) as one free span
 * (initial_physical); takes the arena lock. */
sa_status sa__span_prefill(sa_arena *a, size_t size);
/* The live span at p: SA_OK with *sp, or SA_ERR_INVALID_POINTER /
 * SA_ERR_DOUBLE_FREE. No lock held. */
sa_status sa__span_find(sa_arena *a, uintptr_t p, sa_span **sp);
/* Free the live span at p on freer's stream, in one hold of the arena lock;
 * recorded: the streams sa_record_stream named for it (an event is recorded
 * on each: a call that frees a block recorded on a stream names it).
 * With needs_records, a span that has such streams is left as it is and
 * *needs_records set: the caller takes them and calls again without it.
 * *request: what its allocation asked for. On failure nothing changes. */
sa_status sa__span_free(sa_arena *a, uintptr_t p, sa_stream_arena *freer,
                        const sa_stream *recorded, unsigned nrecorded,
                        bool *needs_records, size_t *request);
/* Unmap free span memory whose work is done (with wait: after waiting) until
 * the chunk cache holds need bytes (0: all of it); returns the bytes
 * unmapped. Arena lock held. */
size_t sa__span_unmap_free(sa_arena *a, size_t need, bool wait);
/* The stream arenas reap marked doomed are about to be freed (stream_arena.c):
 * free spans drop the marks whose work is known done and forget a doomed
 * last freer; one that a mark still waits for is doomed no more. Arena
 * lock held. */
void sa__span_forget_doomed(sa_arena *a);
/* Free span bytes whose work is known done (no driver call), for reports. */
size_t sa__span_clean_bytes(const sa_arena *a);
/* A superblock of size bytes (a multiple of the page map's unit) for sa's
 * stream, carved in free span memory at a page boundary, as it is mapped:
 * behind sa's stream's wait for the span's marks, its pages naming holder.
 * *out NULL (SA_OK) if no free span holds it; a failed wait's status. */
sa_status sa__span_take_superblock(sa_arena *a, sa_stream_arena *sa, size_t size,
                                   sa_desc *holder, struct sa_span_s **out);
/* The superblock's span is free again, no work on it pending (its event
 * completed), its pages the run's. */
void sa__span_give_back_superblock(sa_arena *a, struct sa_span_s *sp);
/* Destroy: wait for free spans' work, unmap every run, free descriptors.
 * Before the stream arenas go (marks name them). */
sa_status sa__span_fini(sa_arena *a);
/* Validator: runs tiled by spans in address order, links and run pointers
 * right, a run's chunks summing to its size, free spans in the fit index
 * (sa__fit_check first) and summing to spans.free_bytes, live ones in the
 * live map, marks naming what exists. Returns the spans visited. */
size_t sa__span_check(const sa_arena *a);

/* span_index.c: arena lock held */
void sa__fit_insert(sa_arena *a, sa_span *sp);
void sa__fit_remove(sa_arena *a, sa_span *sp);
/* The first free span at or after (size, base) in (size, base) order. */
sa_span *sa__fit_ceiling(const sa_arena *a, size_t size, uintptr_t base);
sa_status sa__live_reserve(sa_arena *a); /* room for one more insert */
void sa__live_insert(sa_arena *a, sa_span *sp);
sa_span *sa__live_find(const sa_arena *a, uintptr_t base);
void sa__live_remove(sa_arena *a, sa_span *sp);
void sa__live_fini(sa_arena *a);
/* Validator: the fit index is a treap in (size, base) order, heap-ordered
 * on prio, at most 4 log2 n deep. Returns the spans in it. */
size_t sa__fit_check(const sa_arena *a);

/* timeline.c: arena lock held */
/* Record an event on sa's stream for a free; *ticket names the point. */
sa_status sa__timeline_mark(sa_arena *a, sa_stream_arena *sa, uint64_t *ticket);
/* Completed, as far as the host knows without a driver call? */
bool sa__timeline_known_done(const sa_stream_arena *sa, uint64_t ticket);
/* SA_OK once sa's work up to ticket completed (with wait: after waiting),
 * SA_ERR_NOT_READY if not yet, or a driver error. */
sa_status sa__timeline_reached(sa_arena *a, sa_stream_arena *sa, uint64_t ticket, bool wait);
/* Make stream `on` wait on the device for sa's work up to ticket. */
sa_status sa__timeline_wait(sa_arena *a, sa_stream_arena *sa, uint64_t ticket, sa_stream on);
/* sa's work is all done (released, or the arena is going), or nothing
 * waits on it any more (no free span marks it): events back. */
void sa__timeline_release(sa_arena *a, sa_stream_arena *sa);
/* Validator: done <= next, every slot's ticket <= next and in its slot,
 * slots' tickets distinct, each with an event. */
void sa__timeline_check(const sa_stream_arena *sa);

/* record.c */
typedef struct sa_record_s { /* the streams recorded for the block at link.key */
  sa_chain_link link; /* in the record table; key: the block's address or a stream's */
  unsigned n, cap;    /* n: for a stream's entry, the blocks' entries naming it */
  sa_stream *streams;
} sa_record;
sa_status sa__record_add(sa_arena *a, uintptr_t p, sa_stream s);
/* Detach p's record (NULL if none); the caller frees it or, when the free
 * fails, puts it back with sa__record_restore, which allocates nothing.
 * Either before sa__record_use_end: until then it names its streams. */
sa_record *sa__record_take(sa_arena *a, uintptr_t p);
void sa__record_restore(sa_arena *a, sa_record *r);
void sa__record_free(sa_arena *a, sa_record *r);
/* s was released (its work is done): no block needs an event on it. */
void sa__record_forget_stream(sa_arena *a, sa_stream s);
bool sa__record_names_stream(sa_arena *a, sa_stream s);
/* A free that takes a record holds use from before sa__record_take until it
 * made its last driver call on the record's streams; sa_stream_release holds
 * forget from before it looks at the stream until its records are
 * forgotten. So a release that finds no record naming its stream also has
 * no free still about to call the driver on it (the user destroys it next). */
void sa__record_use_begin(sa_arena *a);
void sa__record_use_end(sa_arena *a);
void sa__record_forget_begin(sa_arena *a);
void sa__record_forget_end(sa_arena *a);
void sa__record_fini(sa_arena *a);

/* reclaim.c: no lock held */
/* Free memory back to the chunk cache once its work completed (with wait:
 * after waiting for it): what names which, streams' empty superblocks and
 * the global stack's, then free spans until the cache holds need bytes (0:
 * all of them). Does not touch thread caches: the caller flushes its own
 * first. */
enum { SA_RECLAIM_SPANS = 1, SA_RECLAIM_SUPERBLOCKS = 2, SA_RECLAIM_ALL = 3 };
void sa__reclaim(sa_arena *a, size_t need, bool wait, unsigned what);
/* Release cached chunks down to keep_bytes. */
void sa__reclaim_release(sa_arena *a, size_t keep_bytes);

/* thread_cache.c */
sa_status sa__tentry_get(sa_arena *a, sa_stream s, sa_tentry **out);
/* Initial-exec: in the shared library, the default (global-dynamic) model
 * makes every sa_alloc and sa_free call __tls_get_addr, and so need a stack
 * frame (201 instead of 163 instructions per pair). The cost: the variable
 * takes 8 bytes of glibc's static TLS surplus when the library is loaded
 * with dlopen, which glibc reserves for exactly this (mimalloc and jemalloc
 * do the same). */
#define SA_TLS_FAST __attribute__((tls_model("initial-exec")))
extern _Thread_local struct sa_tcache_s *sa__tl_cache SA_TLS_FAST;
static inline sa_tentry *sa__tentry_last(void);
sa_status sa__tbin_init(sa_tbin *b, unsigned cls);
void sa__tentry_flush_bin(sa_tentry *e, unsigned cls, uint32_t keep); /* named */
/* Send e's open cross-stream batch on (named: behind an event now); the
 * driver's failure to record it is returned, the batch kept. */
sa_status sa__tentry_flush_out(sa_tentry *e, bool named);
void sa__tentry_publish_live(sa_tentry *e);
/* Is an unpublished live-byte delta past the slack plus one block (block:
 * the small block just counted, 0 for a span)? Then it is published. */
static inline bool sa__live_due(int64_t delta, size_t block) {
  int64_t limit = (int64_t)(SA_LIVE_FLUSH_BYTES + block);
  return delta >= limit || delta <= -limit;
}
/* Arena destroy: hand every entry of a back to its owner thread, which
 * frees it; a is never reached through them again. */
void sa__entries_detach(sa_arena *a);
/* The fast paths' allocations and frees: of exited threads and live ones. */
void sa__tentry_fast_counts(sa_arena *a, uint64_t *allocs, uint64_t *frees);
/* The calling thread's entries of a give everything back; the one bound
 * to named (may be NULL) as in a call naming its stream, or with keep_named
 * nothing. */
void sa__tentry_flush_own(sa_arena *a, sa_stream_arena *named, bool keep_named);
void sa__tentry_publish_own(sa_arena *a); /* their live-byte deltas */
/* sa_stream_release: every thread's entries bound to sa (gone) give their
 * blocks and open batches back now and let go of it. */
void sa__tentry_release_stream(sa_stream_arena *sa);

/* Entries per thread before the least recently used is evicted: a thread
 * cycling through several arenas and streams (8 streams x a few arenas)
 * must not evict on every switch. */
#define SA_TCACHE_ENTRIES 64
struct sa_tcache_s {
  sa_tentry *last; /* the one-entry "last stream" hit */
  unsigned n;
  uint64_t clock;  /* stamps last_use */
  sa_tentry *entries[SA_TCACHE_ENTRIES];
};
static inline sa_tentry *sa__tentry_last(void) {
  struct sa_tcache_s *tc = sa__tl_cache;
  return tc != NULL ? tc->last : NULL;
}
/* ck's stacks order memory with inline assembly that C11 (and so
 * ThreadSanitizer) cannot see. An object handed over through a ck stack is
 * therefore also published with a C11 release store before the push and
 * read with an acquire load after the pop: the pop follows the push, so the
 * load sees the store and everything written before it. Costs one plain
 * store and load on x86. */
static inline void sa__handoff_publish(_Atomic uint64_t *x) {
  atomic_store_explicit(x, atomic_load_explicit(x, memory_order_relaxed) + 1,
                        memory_order_release);
}
static inline void sa__handoff_accept(_Atomic uint64_t *x) {
  (void)atomic_load_explicit(x, memory_order_acquire);
}
static inline void sa__count(_Atomic uint64_t *c) { /* owner-only counter */
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
                        memory_order_relaxed);
}

/* report.c: the memory summary (out-of-memory report, snapshot) */
typedef struct sa_summary_s {
  size_t total, reserved, in_use, live_bytes, free, largest_free_span;
  double fragmentation; /* 1 - largest_free_span / free */
} sa_summary;
typedef struct sa_holding_s { /* what one stream arena holds */
  size_t superblocks, superblock_bytes, empty_superblocks;
  size_t live_block_bytes, free_block_bytes;
  size_t live_spans, live_span_bytes, free_span_bytes, deferred_blocks;
} sa_holding;
/* Every stream arena lock, then the arena lock; returns the list head. */
sa_stream_arena *sa__world_lock(sa_arena *a);
void sa__world_unlock(sa_arena *a, sa_stream_arena *head);
void sa__summary_locked(sa_arena *a, sa_summary *s);
void sa__holding_locked(sa_arena *a, const sa_stream_arena *sa, sa_holding *h);
void sa__oom_report(sa_arena *a, size_t size, sa_stream stream, FILE *f); /* no lock held */
/* Every validator, unpaced: with the world lock held, or taking the locks
 * (with many stream arenas, one stream arena's lock at a time). */
void sa__world_check_locked(sa_arena *a);
void sa__world_check(sa_arena *a);

/* trace.c */
sa_status sa__trace_open(sa_arena *a, const char *path);
/* Could path be opened for writing? (sa_config_check; creates nothing) */
sa_status sa__trace_check(const char *path, char *err, size_t err_size);
void sa__trace(sa_arena *a, char op, const void *p, size_t size, sa_stream s);
void sa__trace_locked(sa_arena *a, char op, const void *p, size_t size, sa_stream s);
sa_status sa__trace_close(sa_arena *a);

#endif /* SA_INTERNAL_H */
