/* sa_free's slow path (free.c), for alloc.c: a block the stream-order
 * checker refused goes back where it came from; for pool.c, a graph pool's
 * segments back to the arena. */
#ifndef SA_FREE_H
#define SA_FREE_H

#include "base/base.h"

/* Whether a free writes its trace line: not for a block no alloc line
 * opened (a handout the stream-order checker refused). */
typedef enum sa_free_trace_e { SA_FREE_UNTRACED = 0, SA_FREE_TRACED = 1 } sa_free_trace;

/* Free ptr on s as sa_free does, bypassing the fast path. */
sa_status sa__free_slow(void *ptr, sa_stream s, sa_free_trace trace);

/* A graph pool's segments back to its arena, freed on s after what they
 * wait for (pool_block.h's sa__pools_withdraw); then the pool is a
 * tombstone. Its caller set pool->returning, and allocates nothing from
 * it. On failure (that status) the segments not freed yet stay the pool's
 * and in the registry, returning is cleared. No lock held. */
sa_status sa__pool_give_back(sa_arena *a, sa_pool *pool, sa_stream s);

#endif /* SA_FREE_H */
