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
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static _Atomic unsigned next_thread = 1;
static _Thread_local unsigned thread_number;

sa_status sa__trace_open(sa_arena *a, const char *path) {
  a->trace = fopen(path, "w");
  if (a->trace == NULL) return SA_ERR_BAD_CONFIG;
  fprintf(a->trace, "thread,stream,op,id,size,time_ns\n");
  return SA_OK;
}

sa_status sa__trace_check(const char *path, char *err, size_t err_size) {
  /* Without creating the file: a writable file, or a writable folder for a
   * new one. */
  struct stat st;
  int e = 0;
  if (stat(path, &st) == 0) {
    if (S_ISDIR(st.st_mode))
      e = EISDIR;
    else if (access(path, W_OK) != 0)
      e = errno;
  } else if (errno != ENOENT) {
    e = errno;
  } else {
    const char *slash = strrchr(path, '/');
    char dir[sizeof ((sa_config *)0)->trace_path];
    size_t n = slash == NULL ? 0 : (size_t)(slash - path);
    if (slash == path) n = 1; /* "/x": the root */
    if (n >= sizeof dir) n = sizeof dir - 1;
    memcpy(dir, slash == NULL ? "." : path, slash == NULL ? 1 : n);
    dir[slash == NULL ? 1 : n] = '\0';
    if (access(dir, W_OK | X_OK) != 0) e = errno;
  }
  if (e == 0) return SA_OK;
  if (err != NULL && err_size > 0)
    snprintf(err, err_size, "trace=%s: cannot be opened for writing: %s", path, strerror(e));
  return SA_ERR_BAD_CONFIG;
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
