/* sa_free's slow path (free.c), for alloc.c: a block the stream-order
 * checker refused goes back where it came from. */
#ifndef SA_FREE_H
#define SA_FREE_H

#include "base/base.h"

/* Whether a free writes its trace line: not for a block no alloc line
 * opened (a handout the stream-order checker refused). */
typedef enum sa_free_trace_e { SA_FREE_UNTRACED = 0, SA_FREE_TRACED = 1 } sa_free_trace;

/* Free ptr on s as sa_free does, bypassing the fast path. */
sa_status sa__free_slow(void *ptr, sa_stream s, sa_free_trace trace);

#endif /* SA_FREE_H */
