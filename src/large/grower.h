/* The grower (grower.c): a thread of the arena's own that maps memory
 * ahead of a climb, so that the allocating thread finds it mapped instead
 * of paying for the growth (SA_FLAG_BACKGROUND_GROWTH).
 *
 * Calls run.c and the driver; called by span.c (after a span allocation,
 * and before a growth), reclaim.c and arena.c, with the arena lock held
 * but for init and fini. */
#ifndef SA_LARGE_GROWER_H
#define SA_LARGE_GROWER_H

#include <pthread.h>

#include "../base/base.h"

/* The grower's state (arena lock). At most one job waits and one is in
 * flight: a climb asks again once the memory mapped ahead runs low. */
typedef struct sa_grower_s {
  pthread_t thread;
  pthread_cond_t wake; /* a job was asked for, or stop */
  pthread_cond_t idle; /* a job in flight ended */
  bool started;        /* the thread runs */
  bool broken;         /* it could not be started: no more jobs */
  bool stop;           /* arena destroy: end the thread */
  bool busy;           /* a claimed range is with the driver, no lock held */
  uintptr_t asked_at;  /* the job waiting: where, and how many bytes (0: none) */
  size_t asked_size;
  bool refused;        /* the driver refused the last job: none is asked for */
  size_t refused_at;   /* ... until physical.xcreated_bytes moves past this */
  _Atomic uint64_t xgrowths; /* published ranges, and their bytes (sa_stats) */
  _Atomic size_t xbytes;
} sa_grower;

struct sa_span_s;

void sa__grower_init(sa_arena *a);
/* Arena destroy, no lock held: ends the thread, after its job in flight
 * (arena_free destroys the condition variables). */
void sa__grower_fini(sa_arena *a);
/* A span sp was just taken for a request of request bytes (and is live,
 * the arena's state whole: with sa__grower_inline the lock is let go): on
 * a climb where the memory mapped ahead above its run runs low, ask the
 * grower for more (sa__run_ahead_wanted), unless exact (a graph pool's
 * segment) or a job is waiting or in flight. Only with
 * SA_FLAG_BACKGROUND_GROWTH. */
void sa__grower_consider(sa_arena *a, const struct sa_span_s *sp, size_t request, bool exact);
/* Set by the fuzzer: each job runs at once on the thread that asks for it,
 * letting go of the arena lock around the driver's calls as the grower's
 * thread does, so that a run is deterministic. */
extern _Atomic bool sa__grower_inline;
/* Before a growth, a reclaim or a trim: the job waiting is dropped (the
 * caller's own growth maps what it needs), and the one in flight waited
 * for (the arena lock is released meanwhile), as its range is claimed
 * and its bytes counted. Returns whether it waited: then what the caller
 * looked at may have changed. */
bool sa__grower_settle(sa_arena *a);
/* Validator: bytes are reserved for growing only while a job is in
 * flight, and jobs wait only for a thread that runs. */
void sa__grower_check(const sa_arena *a);

#endif /* SA_LARGE_GROWER_H */
