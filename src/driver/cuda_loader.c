/* libcuda.so.1 loaded at run time (cuda_loader.h).
 *
 * Owns the libcuda handle, the table sa_cu and the state of the two loads
 * (the library's entry points, then the tests' and benchmarks' extras).
 * Calls libdl, pthread and sa_driver_set_error (driver.c). Called by the
 * CUDA backend (cuda.c, cuda_context.c), the tests and the benchmarks.
 */
#include "cuda_loader.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "driver.h"

sa_cu_api sa_cu;

/* One load: its outcome, written once under its pthread_once. */
typedef struct cu_load_s {
  sa_status status; /* SA_OK, or SA_ERR_NO_DEVICE with the cause below */
  int code;         /* the CUresult (or CUDA_ERROR_NOT_FOUND) that made it so */
  const char *why;  /* static text, or missing, for sa_last_driver_error */
  char missing[96]; /* why, for an entry point the driver lacks (it names it) */
} cu_load_state;

static struct {
  void *lib; /* kept for the life of the process once cuInit ran */
  PFN_cuGetProcAddress_v12000 get;
  cu_load_state library, extra;
} g_cu;

static pthread_once_t g_library_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_extra_once = PTHREAD_ONCE_INIT;

static void load_fail(cu_load_state *st, int code, const char *why) {
  st->status = SA_ERR_NO_DEVICE;
  st->code = code;
  st->why = why;
}

/* Resolve one entry point; *ok becomes 0 on any failure, and the first
 * missing one is named in st->missing (a user with an old driver learns
 * which call it lacks). */
static void resolve(cu_load_state *st, const char *symbol, void **slot, int *ok) {
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  /* LEGACY_STREAM: NULL means the legacy default stream, as our public
   * header promises, whatever the user compiled their own code with. */
  CUresult r = g_cu.get(symbol, slot, SA_CUDA_ABI_VERSION, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                        &found);
  if (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS || *slot == NULL) {
    *slot = NULL;
    if (*ok)
      snprintf(st->missing, sizeof st->missing, "libcuda.so.1 lacks the entry point %s", symbol);
    *ok = 0;
  }
}

#define SA_CU_RESOLVE(name, ver) resolve(st, "cu" #name, (void **)&sa_cu.name, &ok);

static void load_library(void) {
  cu_load_state *st = &g_cu.library;
  st->status = SA_OK;
  /* RTLD_LOCAL: libcuda's symbols must not leak into the global namespace,
   * where they could satisfy another library's lookups by accident. */
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    load_fail(st, CUDA_ERROR_NOT_FOUND, "libcuda.so.1 not found");
    return;
  }
  /* cuGetProcAddress_v2 (with the query-result argument) exists from the
   * CUDA 12.0 driver on; older drivers are not supported. */
  *(void **)&g_cu.get = dlsym(lib, "cuGetProcAddress_v2");
  if (g_cu.get == NULL) {
    /* Nothing of libcuda has run beyond its constructors: safe to unload. */
    dlclose(lib);
    load_fail(st, CUDA_ERROR_NOT_FOUND,
              "libcuda.so.1 has no cuGetProcAddress_v2 (driver older than CUDA 12)");
    return;
  }
  int ok = 1;
  SA_CU_ENTRY_POINTS(SA_CU_RESOLVE)
  if (!ok) {
    /* Nothing of it may be called: the handle goes. */
    memset(&sa_cu, 0, sizeof sa_cu);
    g_cu.get = NULL;
    dlclose(lib);
    load_fail(st, CUDA_ERROR_NOT_FOUND, st->missing);
    return;
  }
  g_cu.lib = lib;
  CUresult r = sa_cu.Init(0);
  /* On failure the handle stays open: after cuInit ran, unloading libcuda
   * is not known to be safe (it may have registered exit handlers). */
  if (r != CUDA_SUCCESS) {
    const char *name = NULL;
    if (sa_cu.GetErrorName(r, &name) != CUDA_SUCCESS || name == NULL) name = "cuInit failed";
    load_fail(st, (int)r, name);
  }
}

/* Runs after the library's load succeeded (sa_cu_load_all). */
static void load_extra(void) {
  cu_load_state *st = &g_cu.extra;
  st->status = SA_OK;
  int ok = 1;
  SA_CU_EXTRA_ENTRY_POINTS(SA_CU_RESOLVE)
  if (!ok) load_fail(st, CUDA_ERROR_NOT_FOUND, st->missing);
}

#undef SA_CU_RESOLVE

/* Run load once; its outcome, recorded as the calling thread's last driver
 * error where it failed. */
static sa_status load_once(pthread_once_t *once, void (*load)(void), const cu_load_state *st) {
  if (pthread_once(once, load) != 0) {
    sa_driver_set_error(CUDA_ERROR_UNKNOWN, "pthread_once failed");
    return SA_ERR_NO_DEVICE;
  }
  if (st->status != SA_OK) sa_driver_set_error(st->code, st->why);
  return st->status;
}

sa_status sa_cu_load(void) { return load_once(&g_library_once, load_library, &g_cu.library); }

sa_status sa_cu_load_all(void) {
  sa_status st = sa_cu_load();
  if (st != SA_OK) return st;
  return load_once(&g_extra_once, load_extra, &g_cu.extra);
}

const char *sa_cu_error_name(CUresult r) {
  const char *name = NULL;
  if (sa_cu.GetErrorName == NULL || sa_cu.GetErrorName(r, &name) != CUDA_SUCCESS || name == NULL)
    return "CUDA_ERROR_(unknown code)";
  return name;
}

sa_status sa_cu_fail(CUresult r) {
  sa_driver_set_error((int)r, sa_cu_error_name(r));
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return SA_ERR_OUT_OF_MEMORY;
  /* Every CUDA_ERROR_STREAM_CAPTURE_* and CUDA_ERROR_CAPTURED_EVENT: a
   * capture, ours to report as such (the device-wide synchronize meets one
   * that another thread runs). */
  if (r >= CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED && r <= CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)
    return SA_ERR_STREAM_CAPTURING;
  return SA_ERR_DRIVER;
}
