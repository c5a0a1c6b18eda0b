/* Runs (run.c): the contiguous mapped ranges spans tile. A run grows where
 * a request needs memory that no free span holds (mapping ahead on a climb
 * to a new live peak, reshaping past the limit), joins the runs it
 * touches, and is cut where free memory is unmapped.
 *
 * Calls free_span.c, mark.c, the vm tier and the driver; called by span.c,
 * with the arena lock held. */
#ifndef SA_LARGE_RUN_H
#define SA_LARGE_RUN_H

#include "../base/base.h"
#include "free_span.h"
#include "span.h"
#include "../vm/physical.h"

/* Grow so that a free span for w exists, holding no more than limit
 * physical bytes in all (reshaping as grow says: span.h), which sarena's
 * stream can use (NULL: any; else the call names its stream); returns it
 * out of the index. */
sa_status sa__run_grow(sa_arena *a, sa_want w, size_t limit, sa_span_grow grow,
                       sa_stream_arena *sarena, sa_span **out);
/* Map need bytes (at least) right above run r, within limit physical
 * bytes, where the reserved range is free there: the free span returned
 * (out of the index) starts at r's free last span, if sarena's stream can
 * use it, else at r's old end. SA_ERR_OUT_OF_MEMORY, nothing changed, if
 * the range above is taken or limit would be passed. */
sa_status sa__run_grow_above(sa_arena *a, sa_run *r, size_t need, size_t limit,
                             sa_stream_arena *sarena, sa_span **out);
/* Unmap up to bytes (SIZE_MAX: all) of free span memory whose work is done
 * (SA_WAIT: after waiting), none of a span that overlaps [keep_lo,
 * keep_hi): the whole chunks (each mapped whole: physical.c) inside free
 * spans, the smallest spans first. A small free span is what best fit can use least;
 * a large one is a place where a later request fits without remapping.
 * From a span, its highest chunks: what stays free stays at its low end,
 * where best fit places first. Returns the bytes unmapped. */
size_t sa__run_unmap_free(sa_arena *a, size_t bytes, uintptr_t keep_lo, uintptr_t keep_hi,
                          sa_wait wait);

/* Mapping ahead in the background (grower.c): memory mapped right above a
 * run that a climb extends, by the grower's thread, with the arena lock
 * held only to claim the range and to publish it. */
typedef struct sa_run_ahead_s {
  uintptr_t at;   /* the range: right above a run when claimed */
  size_t size;
  sa_phys *phys;  /* its chunk, reserved (physical.h) until the driver made it */
  sa_run *run;    /* descriptors taken at the claim: publishing cannot fail */
  sa_span *span;
} sa_run_ahead;

/* The bytes to map ahead above the run of sp, just taken for a request of
 * request bytes, and where (*at): nonzero on a climb to a new live peak
 * where the run's free top holds less than a growth there would map
 * ahead (map_ahead's rules: the footprint target, no budget), the room
 * above it free. */
size_t sa__run_ahead_wanted(const sa_arena *a, const sa_span *sp, size_t request,
                            uintptr_t *at);
/* Claim job->size bytes (at most: fewer where less is free) at job->at,
 * which must still be a run's end that may grow: the range in the va
 * space, the chunk's bytes (within the footprint target) and the
 * descriptors. SA_ERR_OUT_OF_MEMORY (nothing changed, *job zeroed) if not. */
sa_status sa__run_ahead_claim(sa_arena *a, sa_run_ahead *job);
/* The claimed range, mapped and given access by the driver meanwhile: a
 * run of one free span, joined with the runs it touches, in the fit index. */
void sa__run_ahead_publish(sa_arena *a, sa_run_ahead *job);
/* The driver refused (why): everything the claim took goes back, the chunk,
 * if created, to the cache, after unmapping its first mapped bytes (a
 * refused unmap leaves a stuck range: physical.h). Returns why, or
 * SA_ERR_DRIVER where the unmap was refused. */
sa_status sa__run_ahead_abandon(sa_arena *a, sa_run_ahead *job, bool created, size_t mapped,
                                sa_status why);

#endif /* SA_LARGE_RUN_H */
