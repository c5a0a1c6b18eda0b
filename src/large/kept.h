/* Kept spans (kept.c): a span freed on the stream it was allocated on,
 * kept by the freeing thread's cache entry for that stream and handed out
 * again, without a lock, for the stream's next request of the same size.
 * A pair of one large size on one stream then costs what a small block's
 * does (See Note [Kept spans]).
 *
 * A kept span is free to its user and live to the span tier: in the live
 * map, counted in spans.nlive, its state SA_BLOCK_CACHED (a second free is
 * a double free), no mark. It lives only while its thread stays on the
 * fast paths: its entry gives it back as a free on its stream at the
 * thread's next slow-path call into the arena (sa__tentry_get: a request
 * of another size, a small block's refill, any other free), when the
 * thread's cached blocks go back (an out-of-memory pass, sa_trim), and when
 * the entry goes (the thread's exit, an eviction, the stream's release).
 * Where that is not a call naming the stream, no driver call may touch it
 * (it may be destroyed): the span becomes an orphan, freed at the stream's
 * next named call (sa__tentry_get), once the stream was released
 * (sa_stream_release synchronized it), or once a device sync that started
 * later completed. A stream arena found gone because a new stream got its
 * handle does not free it: a thread that used the old stream goes on with
 * its state on the new one until it looks the handle up again, so the new
 * stream's work may use the span.
 *
 * Calls span.c; called by alloc.c, free.c, reclaim.c, thread_cache.c and
 * stream_arena.c. */
#ifndef SA_LARGE_KEPT_H
#define SA_LARGE_KEPT_H

#include "../base/base.h"
#include "span.h"

/* The largest span kept: what a pending free mark may hold up for other
 * streams (span.h) holds here for other streams and threads. */
#ifndef SA_KEPT_MAX
#define SA_KEPT_MAX SA_LAZY_MARK_MAX
#endif

/* A thread whose spans kept go back unused (requests of ever new sizes)
 * pays for each keep, a lock hold and a driver call, for nothing: after
 * SA_KEPT_UNUSED_MAX kept in a row and none reused, it keeps one free in
 * SA_KEPT_PROBE, until one is reused again (free.c's keep_span). See
 * Note [Kept spans]. */
#ifndef SA_KEPT_UNUSED_MAX
#define SA_KEPT_UNUSED_MAX 4u
#endif
#ifndef SA_KEPT_PROBE
#define SA_KEPT_PROBE 16u
#endif

/* Keep the live span at p, freed by the caller in a call naming sarena's
 * stream, which is not being captured (a free in a capture is refused: its
 * memory would be handed out again before the graph runs). true, with *out
 * and *request (what its allocation asked for), where the span is
 * sarena's, holds no superblock, is not recorded (sa_record_stream) and is
 * at most SA_KEPT_MAX bytes; false, nothing changed, otherwise: the caller
 * frees it as any. Takes the arena lock. */
bool sa__span_keep(sa_arena *a, sa_stream_arena *sarena, uintptr_t p, sa_span **out,
                   size_t *request);

/* The kept span sp handed out again by the entry that keeps it, for a
 * request of its size on its stream. No lock: nothing else reaches a kept
 * span but through its entry. */
void sa__span_kept_reuse(sa_span *sp);

/* sp, kept by an entry for its owner's stream, freed on that stream in a
 * call naming it, with the free's mark; without one where the stream was
 * released; an orphan where the stream arena was found gone unreleased (no
 * driver call may name it). On failure (the mark's memory, an event's
 * record, the stream being captured) it stays kept. Takes the arena lock. */
sa_status sa__span_kept_free(sa_arena *a, sa_span *sp);

/* The same outside a call naming the stream, or after that failed: freed
 * without a mark where the stream was released, else an orphan (above).
 * Takes the arena lock. */
void sa__span_kept_orphan(sa_arena *a, sa_span *sp);

/* sarena's orphans freed with the free's mark, in a call naming its
 * stream; one whose mark cannot be taken waits for the next. Takes the
 * arena lock. */
void sa__span_orphans_free(sa_arena *a, sa_stream_arena *sarena);

/* Orphans whose work is known done freed without a mark: their stream
 * was released, or a device sync that started after they were orphaned
 * completed. Arena lock held. */
void sa__span_orphans_settle(sa_arena *a);

/* Validator: each orphan kept (SA_BLOCK_CACHED), in the live map, with an
 * owner; spans.norphans and orphan_bytes count them. Arena lock held. Returns
 * the orphans visited. */
size_t sa__span_orphans_check(const sa_arena *a);

#endif /* SA_LARGE_KEPT_H */
