/* Allocation traces (trace.c, configuration key "trace"): one CSV line per
 * alloc and free. Called by alloc.c, free.c and arena.c. */
#ifndef SA_TRACE_H
#define SA_TRACE_H

#include <pthread.h>

#include "base/base.h"

/* The arena's trace lines; its file is in the arena's leading cache line. */
typedef struct sa_tracing_s {
  pthread_mutex_t lock;
  uint64_t seq;
} sa_tracing;

sa_status sa__trace_open(sa_arena *a, const char *path);
/* Could path be opened for writing? (sa_config_check; creates nothing) */
sa_status sa__trace_check(const char *path, char *err, size_t err_size);
void sa__trace(sa_arena *a, char op, const void *p, size_t size, sa_stream s);
void sa__trace_locked(sa_arena *a, char op, const void *p, size_t size, sa_stream s);
sa_status sa__trace_close(sa_arena *a);

#endif /* SA_TRACE_H */
