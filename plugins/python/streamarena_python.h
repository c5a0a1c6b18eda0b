/* streamarena for the Python array libraries (libstreamarena_python.so),
 * over the default arenas (one per device, configured by
 * STREAMARENA_CONF), with one set of figures per device:
 *
 *   sa_cupy_malloc, sa_cupy_free   CuPy's C allocator hook
 *                                  (cupy.cuda.memory.CFunctionAllocator):
 *                                  no Python runs per allocation
 *   sa_py_alloc, sa_py_free        Numba's EMM plugin and RMM's Python
 *                                  resource without its compiled extension,
 *                                  through ctypes
 *   sa_py_trim, sa_py_get_stats, ...
 *
 * Stream 0 (NULL) in every hook that is told a device is the legacy stream
 * of that device, whatever device is current at the call: the call runs
 * with it made current, and the caller's is put back. The hooks keep no
 * arena: after sa_default_arenas_shutdown (which the library exports) a
 * free of a destroyed arena's block is refused (SA_ERR_INVALID_POINTER;
 * CuPy's free reports and counts it), and the next allocation creates a
 * fresh default arena.
 *
 * The library also exports the public API (sa_*, sa_host_*), which the
 * Python package calls through ctypes, and which RMM's compiled Python
 * resource links against, so that every Python library of a process shares
 * one set of arenas. python/streamarena/ wires it up (docs/ECOSYSTEM.md).
 *
 * It needs no Python or CuPy header: what it needs of them comes as function
 * pointers in an sa_py_env.
 */
#ifndef STREAMARENA_PYTHON_H
#define STREAMARENA_PYTHON_H

#include <stddef.h>
#include <stdint.h>

#include <streamarena/streamarena.h>

#include "plugins/common/hook.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What CuPy's hooks need of the process, handed to them as CuPy's param
 * (CFunctionAllocator passes it to every call). The Python package fills it
 * from CuPy's C API and Python's own (python/streamarena/cupy.py). */
typedef struct sa_py_env_s {
  size_t size; /* sizeof(sa_py_env), as the caller sees it */
  /* CuPy's current stream of a device: cupy_backends.cuda.stream's C
   * function get_stream_ptr. -1 when it failed, with a Python exception
   * set. */
  intptr_t (*current_stream)(int device);
  /* Python's error API, to raise an exception in the calling thread, which
   * holds the GIL whenever CuPy calls a hook: PyObject_CallFunction,
   * PyErr_SetObject, PyErr_SetString, Py_DecRef. NULL call_function: a
   * failure is written to stderr only. */
  void *(*call_function)(void *callable, const char *format, ...);
  void (*set_object)(void *type, void *value);
  void (*set_string)(void *type, const char *message);
  void (*decref)(void *object);
  void *oom_error; /* called as oom_error(size, total): CuPy's OutOfMemoryError */
  void *error;     /* raised with a message: streamarena.StreamarenaError */
} sa_py_env;

/* CuPy's malloc: size bytes on device's arena, for work on CuPy's current
 * stream of that device. On failure (void *)-1 with an exception raised (a
 * lack of memory as env->oom_error, anything else as env->error, or the
 * exception of env->current_stream): CuPy checks for an exception when its
 * malloc returns -1. NULL (and a line on stderr) where env is no sa_py_env
 * or has no error API, so nothing could be raised. env is an sa_py_env. */
void *sa_cupy_malloc(void *env, size_t size, int device);

/* CuPy's free, when the last array using ptr goes: in stream order on the
 * stream ptr was allocated on (CuPy's own pool reuses memory on that stream
 * only, so work CuPy enqueued on it is all that may still use it). A
 * failure is counted and written to stderr (CuPy's free cannot raise). */
void sa_cupy_free(void *env, void *ptr, int device);

/* An allocation on device's arena for work on stream, counted in the
 * figures; a stream being captured into a CUDA graph is
 * SA_ERR_STREAM_CAPTURING. Errors as sa_alloc's, SA_ERR_INVALID_ARGUMENT
 * for a device out of range, SA_ERR_NO_DEVICE where CUDA is not usable. */
sa_status sa_py_alloc(int device, size_t size, sa_stream stream, void **out);

/* The free of an sa_py_alloc block of size bytes on stream. Errors as
 * sa_free's; SA_ERR_STREAM_CAPTURING (the block stays allocated). */
sa_status sa_py_free(int device, void *ptr, size_t size, sa_stream stream);

/* sa_trim(arena, 0) of every arena the hooks used (CuPy's
 * free_all_blocks): cached memory goes back to the driver once the work
 * that may use it completed. */
void sa_py_trim(void);

/* The figures of device into *out; size must be sizeof(sa_hook_stats).
 * SA_ERR_INVALID_ARGUMENT for a bad device, NULL or a size mismatch. */
sa_status sa_py_get_stats(int device, sa_hook_stats *out, size_t size);

/* The requested-bytes peak of device starts again from what is held now. */
sa_status sa_py_reset_peak(int device);

/* Failed calls so far, all devices together. */
uint64_t sa_py_error_count(void);

/* CuPy blocks live now (allocated through sa_cupy_malloc, not freed). */
size_t sa_cupy_live_blocks(void);

#ifdef __cplusplus
}
#endif
#endif /* STREAMARENA_PYTHON_H */
