/* Allocation traces (configuration key "trace"): one CSV line per alloc and
 * free, in the format that //bench:replay reads (docs/TRACE.md):
 *   thread,stream,op,id,size,time_ns
 * thread is a small per-process thread number, stream the stream handle,
 * op "alloc" or "free", id the address (unique among live allocations),
 * size the requested bytes (0 for frees), time_ns a monotonic clock.
 * Tracing takes a lock per operation. A free that hands memory to other
 * threads at once (free.c's slow path) holds the lock across the handover,
 * so its line comes before the next alloc line of that memory.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "trace.h"
#include "arena.h"

static _Atomic unsigned next_thread = 1;
static _Thread_local unsigned thread_number;

/* Open trace files, shared by every arena that names the same file (the
 * default arenas of several devices all get STREAMARENA_CONF's trace=PATH):
 * one FILE, one header, opened once, closed with its last arena. Each
 * line is one fprintf, which stdio makes atomic on a shared FILE; an
 * arena's tracing.lock still orders its own lines. */
typedef struct trace_file_s {
  struct trace_file_s *next;
  dev_t dev;
  ino_t ino;
  FILE *f;
  unsigned refs;
} trace_file;

static pthread_mutex_t files_lock = PTHREAD_MUTEX_INITIALIZER;
static trace_file *files;

sa_status sa__trace_open(sa_arena *a, const char *path) {
  sa_status st = SA_OK;
  pthread_mutex_lock(&files_lock);
  struct stat s;
  trace_file *t = NULL;
  if (stat(path, &s) == 0)
    for (t = files; t != NULL && (t->dev != s.st_dev || t->ino != s.st_ino);) t = t->next;
  if (t == NULL) {
    FILE *f = fopen(path, "w");
    if (f == NULL || fstat(fileno(f), &s) != 0) {
      st = SA_ERR_BAD_CONFIG;
    } else if ((t = calloc(1, sizeof *t)) == NULL) {
      st = SA_ERR_OUT_OF_MEMORY;
    }
    if (st != SA_OK) {
      if (f != NULL) fclose(f);
      pthread_mutex_unlock(&files_lock);
      return st;
    }
    t->dev = s.st_dev;
    t->ino = s.st_ino;
    t->f = f;
    t->next = files;
    files = t;
    fprintf(f, "thread,stream,op,id,size,time_ns\n");
  }
  t->refs++;
  a->trace = t->f;
  pthread_mutex_unlock(&files_lock);
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
  unsigned long long ns =
      (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
  fprintf(a->trace, "%u,%p,%s,%p,%zu,%llu\n", thread_number, s, op == 'a' ? "alloc" : "free",
          p, size, ns);
  a->tracing.seq++;
}

void sa__trace(sa_arena *a, char op, const void *p, size_t size, sa_stream s) {
  pthread_mutex_lock(&a->tracing.lock);
  sa__trace_locked(a, op, p, size, s);
  pthread_mutex_unlock(&a->tracing.lock);
}

/* SA_ERR_BAD_CONFIG, with a line on stderr, when lines were lost (a full
 * disk): the status is the caller's only sign that the file is incomplete. */
sa_status sa__trace_close(sa_arena *a) {
  if (a->trace == NULL) return SA_OK;
  bool lost = false;
  int e = 0;
  pthread_mutex_lock(&files_lock);
  for (trace_file **pt = &files; *pt != NULL; pt = &(*pt)->next) {
    trace_file *t = *pt;
    if (t->f != a->trace) continue;
    /* fprintf's failures set the sticky error flag; the flush's own is
     * that of the lines still buffered */
    if (--t->refs == 0) {
      *pt = t->next;
      lost = ferror(t->f) != 0;
      if (fclose(t->f) != 0) {
        lost = true;
        e = errno;
      }
      free(t);
    } else {
      if (fflush(t->f) != 0) e = errno; /* this arena's lines are complete on disk */
      lost = e != 0 || ferror(t->f) != 0;
    }
    break;
  }
  pthread_mutex_unlock(&files_lock);
  a->trace = NULL;
  if (!lost) return SA_OK;
  fprintf(stderr, "streamarena: trace=%s: lines were lost: %s\n", a->cfg.trace_path,
          e != 0 ? strerror(e) : "a write failed");
  return SA_ERR_BAD_CONFIG;
}
