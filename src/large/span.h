/* Large allocations (span.c): the types of the large tier and the contract
 * the tiers above use.
 *
 * A run is a contiguous mapped range of the reserved space, tiled by spans
 * in address order: live ones (a user's allocation) and free ones (mapped,
 * waiting for reuse). A free span's marks say which streams' work may still
 * touch it. Two kinds:
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
 * The pieces of a split span share a recorded mark's event, counted.
 *
 * Calls the vm tier and the services (base/); called by alloc.c, free.c, reclaim.c,
 * report.c, snapshot.c, arena.c and superblock.c (superblocks carved in
 * free span memory). Every function runs with the arena lock held unless
 * its comment says otherwise. */
#ifndef SA_LARGE_SPAN_H
#define SA_LARGE_SPAN_H

#include "../base/base.h"
#include "../base/treap.h"
#include "../driver/driver.h"
#include "../vm/va_space.h"
#include "span_index.h"
#include "timeline.h"

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

/* A free may leave its mark pending (timeline.c, "Pending") only while
 * the free memory it holds up, merged with its free neighbours, is at most
 * this much: for another stream the event's cost is nothing beside going
 * without that memory until the freeing stream's next call. See Note
 * [Lazy free marks]. */
#ifndef SA_LAZY_MARK_MAX
#define SA_LAZY_MARK_MAX ((size_t)512 << 20)
#endif

#define SA_SPAN_STARTS 4
typedef struct sa_span_s {
  uintptr_t base;
  size_t size;                      /* a multiple of SA_SPAN_QUANTUM */
  struct sa_run_s *run;
  struct sa_span_s *prev, *next;    /* neighbours in the run, address order */
  sa_treap_node fit;                /* free: the fit index (span_index.c) */
  sa_mark *marks;                   /* free: reuse waits for these */
  unsigned nmarks, marks_cap;       /* the array stays with the descriptor */
  uintptr_t starts[SA_SPAN_STARTS]; /* free: starts of spans freed into it, */
  unsigned nstarts;                 /* the latest first (double frees) */
  sa_stream_arena *owner;           /* live: the stream it was allocated on */
  size_t request;                   /* live: bytes the user asked for */
  sa_desc *holder;                  /* live: the superblock carved in it, else NULL */
  bool pool_segment;                /* live: a graph pool's segment (pool.c), whose
                                       room above the arena's growth leaves
                                       alone (run.c, plan_growth) */
  _Atomic uint8_t xstate;           /* SA_BLOCK_LIVE/RECORDED, FREE, or CACHED:
                                       kept by the thread that freed it (kept.h) */
  struct sa_span_s *orphan_next;    /* kept, its thread's entry gone: spans.orphans */
  uint64_t orphan_gen;              /* the device-sync generation it was orphaned at */
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

/* The arena's spans (arena lock). */
typedef struct sa_spans_s {
  sa_run *runs;                 /* mapped runs of spans, address order */
  sa_run *all_runs, *spare_runs;
  sa_span *all_spans, *spare_spans; /* span descriptors */
  sa_fit_index fit;             /* free spans by size (span_index.c) */
  sa_live_map live_map;         /* live spans by base (span_index.c) */
  size_t free_bytes;            /* in free spans */
  size_t nlive;                 /* live spans */
  size_t nholders;              /* stream arenas with live spans (xspans > 0) */
  size_t ntakers;               /* stream arenas not gone that ever took a span
                                   (timeline.took_spans): at 1, its frees record
                                   lazily (timeline.c, "Pending") */
  uint64_t frees;               /* spans freed so far */
  uint64_t reshape_futile;      /* frees + 1 when the last reshape found too
                                   little (span.c): none again until a free */
  /* Kept spans (kept.h): live in the map, free to their user. Those an
   * entry keeps are counted by walking the entries (thread_cache.c). */
  sa_span *orphans;             /* kept ones whose entry went, freed later */
  size_t norphans, orphan_bytes;
  bool apart;                   /* free neighbours may be left apart (a
                                   pending mark, or no memory to join their
                                   marks): free_span.c rejoins them */
#if SA_INVARIANTS
  sa_check_pace pace;           /* its validator's */
#endif
} sa_spans;

/* In a call that names sarena's stream: the event another stream or an
 * unmap waits for (its pending span's: timeline.c) is recorded, if one is
 * wanted; on failure it stays wanted. */
void sa__span_record_wanted(sa_arena *a, sa_stream_arena *sarena);
/* May bytes of free memory be held back from every stream but one (a
 * pending mark, a kept span)? Only where no other stream holds spans and
 * no budget is set, or where a growth in its place stays within the soft
 * limit: otherwise another stream would grow past it meanwhile. Arena lock
 * held. */
bool sa__span_may_hold_back(const sa_arena *a, size_t bytes);
/* How a span that no free span holds grows: past the limit, after
 * reshaping free span memory (run.c); or, SA_SPAN_NO_RESHAPE, only where
 * that is not needed (SA_ERR_OUT_OF_MEMORY, nothing changed, where it is). */
typedef enum sa_span_grow_e { SA_SPAN_RESHAPE = 0, SA_SPAN_NO_RESHAPE = 1 } sa_span_grow;
/* Sizes in bytes; limit: the physical bytes growth may reach; exact: a
 * growth maps no more than the request (none ahead on a climb: run.c). */
sa_status sa__span_alloc(sa_arena *a, sa_stream_arena *sarena, size_t size, size_t limit,
                         sa_span_grow grow, bool exact, void **out);
/* Mark the live span at p a graph pool's segment (span.pool_segment):
 * growth leaves the room above it to the pool. Takes the arena lock. */
void sa__span_set_pool_segment(sa_arena *a, uintptr_t p);

/* The live span at p, of size bytes, allocated on sarena's stream, grows
 * in place by at least more bytes (a multiple of the granularity): from
 * the free span right above it that sarena's stream can use, or by mapping
 * right above its run, within limit physical bytes. *added: the bytes it
 * grew by. SA_ERR_OUT_OF_MEMORY, nothing changed, where it cannot grow
 * there (a span above in use, another stream's pending mark, the reserved
 * range above taken, the limit); a failed wait's status. */
sa_status sa__span_extend(sa_arena *a, sa_stream_arena *sarena, uintptr_t p, size_t size,
                          size_t more, size_t limit, size_t *added);
/* Map size bytes (rounded up to the granularity) as one free span
 * (initial_physical); takes the arena lock. */
sa_status sa__span_prefill(sa_arena *a, size_t size);
/* The live span at p: SA_OK with *sp, or SA_ERR_INVALID_POINTER /
 * SA_ERR_DOUBLE_FREE (a span freed, kept ones too). No lock held. */
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
/* How sa__span_free_live frees: with the freeing stream's mark, as every
 * free; or without one, where the span's work is known done (its stream
 * released or destroyed, or a device sync since its free). */
typedef enum sa_span_mark_e { SA_SPAN_MARKED = 0, SA_SPAN_CLEAN = 1 } sa_span_mark;
/* Free sp, live (its records taken by the caller: recorded), on freer's
 * stream: sa__span_free's work after its lookup. On failure (only
 * SA_SPAN_MARKED: a mark's memory, an event's record) nothing changes. */
sa_status sa__span_free_live(sa_arena *a, sa_span *sp, sa_stream_arena *freer,
                             const sa_stream *recorded, unsigned nrecorded, sa_span_mark mark);
/* Unmap free span memory whose work is done (SA_WAIT: after waiting) until
 * the chunk cache holds need bytes (0: all of it); returns the bytes
 * unmapped. Arena lock held. */
size_t sa__span_unmap_free(sa_arena *a, size_t need, sa_wait wait);
/* The stream arenas reap marked doomed are about to be freed (stream_arena.c):
 * free spans drop the marks whose work is known done and forget a doomed
 * last freer; one that a mark still waits for is doomed no more. Arena
 * lock held. */
void sa__span_forget_doomed(sa_arena *a);
/* Free span bytes whose work is known done (no driver call), for reports. */
size_t sa__span_clean_bytes(const sa_arena *a);
/* A superblock of size bytes (a multiple of the page map's unit) for sarena's
 * stream, carved in free span memory at a page boundary, as it is mapped:
 * behind sarena's stream's wait for the span's marks, its pages naming holder.
 * *out NULL (SA_OK) if no free span holds it; a failed wait's status. */
sa_status sa__span_take_superblock(sa_arena *a, sa_stream_arena *sarena, size_t size,
                                   sa_desc *holder, sa_span **out);
/* The superblock's span is free again, no work on it pending (its event
 * completed), its pages the run's. */
void sa__span_give_back_superblock(sa_arena *a, sa_span *sp);
/* The same for n superblocks' spans at once (sps is sorted by base here,
 * through tmp, room for n more): neighbours among them join before the
 * free spans beside them, so that superblocks carved side by side cost one
 * fit index insertion, not one each (the streams and threads of earlier
 * work can leave hundreds). */
void sa__span_give_back_superblocks(sa_arena *a, sa_span **sps, sa_span **tmp, size_t n);
/* Destroy: wait for free spans' work, unmap every run, free descriptors.
 * Before the stream arenas go (marks name them). */
sa_status sa__span_fini(sa_arena *a);
/* Validator: runs tiled by spans in address order, links and run pointers
 * right, a run's chunks summing to its size, free spans in the fit index
 * (sa__fit_check first) and summing to spans.free_bytes, live ones in the
 * live map, marks naming what exists. Returns the spans visited. */
size_t sa__span_check(const sa_arena *a);

#endif /* SA_LARGE_SPAN_H */
