/* Allocation traces (configuration key "trace"): one CSV line per alloc and
 * free, in the format that //bench:replay reads (docs/TRACE.md):
 *   thread,stream,op,id,size,time_ns
 * thread is a small per-process thread number, stream the stream handle,
 * op "alloc" or "free", id the address (unique among live allocations),
 * size the requested bytes (0 for frees), time_ns a monotonic clock.
 * Tracing takes a lock per operation. A free that hands memory to other
 * threads at once (alloc.c's slow path) holds the lock across the handover,
 * so its line comes before the next alloc line of that memory.
 */
#include <stdlib.h>
#include <time.h>

#include "internal.h"

static _Atomic unsigned next_thread = 1;
static _Thread_local unsigned thread_number;

sa_status sa__trace_open(sa_arena *a, const char *path) {
  a->trace = fopen(path, "w");
  if (a->trace == NULL) return SA_ERR_BAD_CONFIG;
  fprintf(a->trace, "thread,stream,op,id,size,time_ns\n");
  return SA_OK;
}

void sa__trace_locked(sa_arena *a, char op, const void *p, size_t size, sa_stream s) {
  if (thread_number == 0) thread_number = atomic_fetch_add(&next_thread, 1);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  unsigned long long ns = (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
  fprintf(a->trace, "%u,%p,%s,%p,%zu,%llu\n", thread_number, s, op == 'a' ? "alloc" : "free",
          p, size, ns);
  a->trace_seq++;
}

void sa__trace(sa_arena *a, char op, const void *p, size_t size, sa_stream s) {
  pthread_mutex_lock(&a->trace_lock);
  sa__trace_locked(a, op, p, size, s);
  pthread_mutex_unlock(&a->trace_lock);
}

void sa__trace_close(sa_arena *a) {
  if (a->trace != NULL) fclose(a->trace);
  a->trace = NULL;
}
