/* The default arenas (default_arena.c), one per device, behind the drop-in
 * calls sa_malloc_async and sa_free_async. */
#ifndef SA_DEFAULT_ARENA_H
#define SA_DEFAULT_ARENA_H

#include <streamarena/streamarena.h>

/* Device's default arena as it is now: NULL if none was made, or since
 * sa_default_arenas_shutdown; creates nothing (the PyTorch plugin's
 * statistics and empty_cache). */
sa_arena *sa__default_arena_now(int device);

#endif /* SA_DEFAULT_ARENA_H */
