/* Test hooks (hook.c): named points on slow paths where a test pauses one
 * side of an interleaving, so that a race happens in every run instead of
 * once in a while. Any layer may name a point; only tests set the hook. */
#ifndef SA_BASE_HOOK_H
#define SA_BASE_HOOK_H

#include "base.h"

/* Where a test may pause (test/ sets sa__test_hook). */
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
  SA_HOOK_GROWER_CLAIMED,  /* the grower claimed a range and released the arena lock, before
                              the driver makes it (arg: the arena) */
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

#endif /* SA_BASE_HOOK_H */
