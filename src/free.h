/* sa_free's slow path (free.c), for alloc.c: a block the stream-order
 * checker refused goes back where it came from. */
#ifndef SA_FREE_H
#define SA_FREE_H

#include "base/base.h"

/* Free ptr on s as sa_free does, bypassing the fast path; trace: write the
 * free's line (false for a block no alloc line opened). */
sa_status sa__free_slow(void *ptr, sa_stream s, bool trace);

#endif /* SA_FREE_H */
