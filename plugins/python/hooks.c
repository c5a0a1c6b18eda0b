/* The Python array libraries' hooks (streamarena_python.h): CuPy's C
 * allocator functions and the calls Numba's and RMM's Python code make
 * through ctypes, over the framework hooks' shared bookkeeping
 * (plugins/common/hook.h).
 *
 * CuPy gives its malloc hook the size and device, its free hook the pointer
 * and device: the stream is CuPy's current one, asked of CuPy's C API at
 * each allocation, and the table (table.c) keeps it with the size until
 * the free. A failed CuPy allocation must raise in Python, or CuPy would
 * wrap the NULL pointer in an array: the hook raises through Python's error
 * API, which the Python package hands over with CuPy's stream function in
 * the hooks' env.
 *
 * Every hook is told its device, and stream 0 (CuPy's null stream, Numba's
 * and RMM's default) of device d is d's legacy stream: a call on NULL runs
 * with d made current (sa_hook_alloc, sa_hook_free), as CuPy frees an
 * array wherever it dies, with whatever device is current. No arena is
 * kept (plugins/common/hook.h): after sa_default_arenas_shutdown a free of
 * a destroyed arena's block is refused, and the next allocation creates a
 * fresh default arena.
 */
#include <stdio.h>
#include <string.h>

#include "plugins/python/streamarena_python.h"
#include "plugins/python/table.h"

/* What CuPy's malloc hook returns when it raised: CuPy's caller looks for an
 * exception only on -1 (Cython's "except? -1" of the intptr_t it returns),
 * and frees nothing it did not get. A NULL with an exception set would go
 * on as a NULL array, or as a SystemError where CuPy does look. */
#define RAISED ((void *)(intptr_t)-1)

static sa_hook py_hook = {
    .name = "python",
    .capture_hint = "allocate a graph's memory before its capture (docs/ECOSYSTEM.md)",
};

/* sa_py_alloc and sa_py_free, what naming the hook in a report of a
 * caller's device that could not be put back. */
static sa_status py_alloc(const char *what, int dev, size_t size, sa_stream stream,
                          void **out) {
  if (out == NULL) return SA_ERR_INVALID_ARGUMENT;
  *out = NULL;
  sa_arena *a;
  sa_status st = sa_hook_arena(&py_hook, dev, &a);
  if (st == SA_OK) st = sa_hook_alloc(&py_hook, dev, what, a, out, size, stream);
  if (st == SA_OK && *out != NULL) sa_hook_allocated(&py_hook, dev, size);
  return st;
}

static sa_status py_free(const char *what, int dev, void *ptr, size_t size, sa_stream stream) {
  if (ptr == NULL) return SA_OK;
  /* The block's arena, asked at each call: a free creates none, and the
   * block of an arena sa_default_arenas_shutdown destroyed (or memory not
   * ours) is refused. */
  sa_arena *a = sa_hook_arena_of(ptr);
  if (a == NULL) return SA_ERR_INVALID_POINTER;
  sa_status st = sa_hook_free(&py_hook, dev, what, a, ptr, size, stream);
  if (st == SA_OK) sa_hook_freed(&py_hook, dev, size);
  return st;
}

sa_status sa_py_alloc(int dev, size_t size, sa_stream stream, void **out) {
  return py_alloc("alloc", dev, size, stream, out);
}

sa_status sa_py_free(int dev, void *ptr, size_t size, sa_stream stream) {
  return py_free("free", dev, ptr, size, stream);
}

/* The env as the Python package laid it out, or NULL where its idea of the
 * struct is another (a package and a library of different versions). */
static const sa_py_env *env_of(const void *param) {
  const sa_py_env *env = param;
  return env != NULL && env->size == sizeof *env ? env : NULL;
}

/* Raise the failure of a CuPy allocation in the calling thread: CuPy's
 * OutOfMemoryError for a lack of memory, as its own pool does, so code
 * that frees and retries on it works unchanged; StreamarenaError with the
 * reason for anything else. Counted, and the first few also go to stderr,
 * as every hook's failures do. RAISED, or NULL where env has no error API
 * (nothing could be raised). */
static void *raise_failure(const sa_py_env *env, int dev, size_t size, sa_status st) {
  sa_hook_report(&py_hook, dev, "cupy malloc", NULL, size, st);
  if (env->call_function == NULL) return NULL;
  sa_hook_stats figures;
  uint64_t total = sa_hook_get_stats(&py_hook, dev, &figures) == SA_OK
                       ? figures.requested_bytes
                       : 0;
  if (st == SA_ERR_OUT_OF_MEMORY) {
    void *e = env->call_function(env->oom_error, "nn", (ptrdiff_t)size, (ptrdiff_t)total);
    if (e == NULL) return RAISED; /* constructing it raised: that exception stands */
    env->set_object(env->oom_error, e);
    env->decref(e);
    return RAISED;
  }
  const char *drv_name;
  int drv = sa_last_driver_error(&drv_name);
  char msg[512];
  int n = snprintf(msg, sizeof msg, "streamarena: allocating %zu bytes on device %d: %s", size,
                   dev, sa_status_string(st));
  if (n > 0 && (size_t)n < sizeof msg) {
    if (st == SA_ERR_DRIVER || st == SA_ERR_NO_DEVICE)
      snprintf(msg + n, sizeof msg - (size_t)n, " (driver error %d, %s)", drv, drv_name);
    else if (st == SA_ERR_UNKNOWN_STREAM)
      snprintf(msg + n, sizeof msg - (size_t)n,
               " (a stream of another device, or CuPy's per-thread default stream, which "
               "streamarena does not serve)");
    else if (st == SA_ERR_STREAM_CAPTURING)
      snprintf(msg + n, sizeof msg - (size_t)n, "; %s", py_hook.capture_hint);
  }
  env->set_string(env->error, msg);
  return RAISED;
}

void *sa_cupy_malloc(void *param, size_t size, int dev) {
  const sa_py_env *env = env_of(param);
  if (sa_unlikely(env == NULL)) {
    /* Nothing to raise with: CuPy would wrap the NULL that follows in an
     * array, so say why loudly. */
    fprintf(stderr, "streamarena python: sa_cupy_malloc called without a valid sa_py_env "
                    "(install streamarena.cupy from the same build as the library)\n");
    sa_hook_report(&py_hook, dev, "cupy malloc", NULL, size, SA_ERR_INVALID_ARGUMENT);
    return NULL;
  }
  if (size == 0) return NULL; /* CuPy asks for none: it makes no call for 0 */
  intptr_t s = env->current_stream(dev);
  if (sa_unlikely(s == -1)) return RAISED; /* CuPy's exception is set */
  sa_stream stream = (sa_stream)s;
  void *p;
  sa_status st = py_alloc("cupy malloc", dev, size, stream, &p);
  if (st == SA_OK) {
    st = sa__py_table_put(p, stream, size);
    if (sa_unlikely(st != SA_OK)) {
      /* The free cannot fail here: it is the block just made, on its stream. */
      (void)py_free("cupy malloc", dev, p, size, stream);
      p = NULL;
    }
  }
  if (sa_unlikely(st != SA_OK)) return raise_failure(env, dev, size, st);
  return p;
}

void sa_cupy_free(void *param, void *ptr, int dev) {
  (void)param;
  if (ptr == NULL) return;
  sa_stream stream;
  size_t size;
  if (sa_unlikely(!sa__py_table_take(ptr, &stream, &size))) {
    sa_hook_report(&py_hook, dev, "cupy free", ptr, 0, SA_ERR_INVALID_POINTER);
    return;
  }
  sa_status st = py_free("cupy free", dev, ptr, size, stream);
  if (sa_likely(st == SA_OK)) return;
  sa_hook_report(&py_hook, dev, "cupy free", ptr, size, st);
  /* Kept for a later free where it stays allocated (a capture that ended,
   * say); a failed put only loses that chance. */
  if (st == SA_ERR_STREAM_CAPTURING) (void)sa__py_table_put(ptr, stream, size);
}

void sa_py_trim(void) { sa_hook_trim(&py_hook); }

sa_status sa_py_get_stats(int dev, sa_hook_stats *out, size_t size) {
  if (size != sizeof *out) return SA_ERR_INVALID_ARGUMENT;
  return sa_hook_get_stats(&py_hook, dev, out);
}

sa_status sa_py_reset_peak(int dev) { return sa_hook_reset_peak(&py_hook, dev); }

uint64_t sa_py_error_count(void) { return sa_hook_error_count(&py_hook); }

size_t sa_cupy_live_blocks(void) { return sa__py_table_count(); }
