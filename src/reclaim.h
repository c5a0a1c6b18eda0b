/* Getting memory back (reclaim.c), for alloc.c's out-of-memory loop,
 * sa_trim and sa_defragment. Called with no lock held. */
#ifndef SA_RECLAIM_H
#define SA_RECLAIM_H

#include "base/base.h"

/* Free memory back to the chunk cache once its work completed (SA_WAIT:
 * after waiting for it, a device sync first): what names which, streams' empty superblocks and
 * the global stack's, then free spans until the cache holds need bytes (0:
 * all of them). Does not touch thread caches: the caller flushes its own
 * first. */
enum { SA_RECLAIM_SPANS = 1, SA_RECLAIM_SUPERBLOCKS = 2, SA_RECLAIM_ALL = 3 };
void sa__reclaim(sa_arena *a, size_t need, sa_wait wait, unsigned what);
/* Superblocks on the global stack carved in free span memory (span.h),
 * whose event completed, back to their runs as free span memory: for a
 * large request no free span holds, since such a superblock may be what
 * splits two free spans that would. No driver call but event queries;
 * the others stay on the stack. */
void sa__reclaim_carved(sa_arena *a);
/* The same after the release of stream arena `released` (its id), with no
 * driver call: carved superblocks with no event, or with one its stream
 * recorded (done: the release synchronized it), go back to their runs;
 * those behind another stream's event wait on the stack for
 * sa__reclaim_carved. Left there, a released stream's carved empties would
 * split the free spans around them until a large request that no free
 * span holds gave them back, on that request's time (See Note
 * [Superblocks carved in free spans]). */
void sa__reclaim_released(sa_arena *a, uint64_t released);
/* Superblocks such a pass looks at and leaves before it stops. */
#define SA_RELEASE_KEEP_MAX 256
/* Release cached chunks down to keep_bytes. */
void sa__reclaim_release(sa_arena *a, size_t keep_bytes);

#endif /* SA_RECLAIM_H */
