/* Backend selection, the calling thread's device and the per-thread last
 * driver error.
 *
 * Owns the choice of backend for sa_driver_open (explicit, or AUTO through
 * the environment variable STREAMARENA_BACKEND and then what the machine
 * offers) and the thread-local record behind sa_last_driver_error. Calls the
 * backend constructors (cuda.c, host.c); called by the arena.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <streamarena/host.h>

#include "driver.h"

/* The last failing driver call of this thread. name is a static string
 * (cuGetErrorName's, or a literal) or this thread's sa_driver_set_errorf
 * buffer, so storing the pointer is safe. */
static _Thread_local int tl_error_code;
static _Thread_local const char *tl_error_name;

void sa_driver_set_error(int code, const char *name) {
  tl_error_code = code;
  tl_error_name = name;
}

void sa_driver_set_errorf(int code, const char *fmt, ...) {
  static _Thread_local char text[256];
  va_list ap;
  va_start(ap, fmt);
  if (vsnprintf(text, sizeof text, fmt, ap) < 0) text[0] = '\0';
  va_end(ap);
  sa_driver_set_error(code, text);
}

int sa_driver_current_device(void) {
  int dev = 0;
  if (sa_driver_cuda_current_device(&dev) == SA_OK) return dev;
  return sa_host_get_device();
}

int sa_last_driver_error(const char **name) {
  if (name != NULL) *name = tl_error_name != NULL ? tl_error_name : "no error";
  return tl_error_code;
}

/* STREAMARENA_BACKEND: unset, empty or "auto" leave AUTO; "cuda" and "host"
 * force that backend; anything else is rejected rather than guessed at,
 * with a message (once per process: a program that retries should not fill
 * its log) and the reason as the thread's last driver error. */
static sa_status backend_from_env(sa_backend *backend) {
  static atomic_flag reported = ATOMIC_FLAG_INIT;
  const char *v = getenv("STREAMARENA_BACKEND");
  if (v == NULL || v[0] == '\0' || strcasecmp(v, "auto") == 0) {
    *backend = SA_BACKEND_AUTO;
  } else if (strcasecmp(v, "cuda") == 0) {
    *backend = SA_BACKEND_CUDA;
  } else if (strcasecmp(v, "host") == 0) {
    *backend = SA_BACKEND_HOST;
  } else {
    if (!atomic_flag_test_and_set(&reported))
      fprintf(stderr, "streamarena: STREAMARENA_BACKEND=%s: not a backend; it takes auto, cuda "
                      "or host\n", v);
    sa_driver_set_error(EINVAL, "STREAMARENA_BACKEND is not auto, cuda or host");
    return SA_ERR_BAD_CONFIG;
  }
  return SA_OK;
}

/* AUTO: CUDA when it opens. The simulator stands in only where CUDA is
 * absent altogether (no libcuda, cuInit fails, no device at all): on a
 * machine with GPUs, a bad ordinal or a driver failure is reported instead
 * of silently handing out host memory. */
static sa_status open_auto(int device, sa_driver **out) {
  sa_status st = sa_driver_cuda_open(device, out);
  if (st != SA_ERR_NO_DEVICE) return st;
  int count = 0;
  if (sa_driver_cuda_device_count(&count) != SA_ERR_NO_DEVICE) return st;
  const char *cause;
  (void)sa_last_driver_error(&cause); /* left by the failed open: why no CUDA */
  st = sa_driver_host_open(device, out);
  if (st == SA_OK) {
    snprintf((*out)->why, sizeof (*out)->why, "backend auto, CUDA not usable: %s", cause);
    (*out)->stand_in = true;
  }
  return st;
}

static sa_status open_backend(sa_backend backend, int device, sa_driver **out) {
  switch (backend) {
    case SA_BACKEND_AUTO:
      return open_auto(device, out);
    case SA_BACKEND_CUDA:
      return sa_driver_cuda_open(device, out);
    case SA_BACKEND_HOST:
      return sa_driver_host_open(device, out);
    default:
      return SA_ERR_INVALID_ARGUMENT;
  }
}

sa_status sa_driver_open(sa_backend backend, int device, sa_driver **out) {
  if (out == NULL) return SA_ERR_INVALID_ARGUMENT;
  *out = NULL;
  const char *why = "backend set in the configuration";
  if (backend == SA_BACKEND_AUTO) {
    sa_status st = backend_from_env(&backend);
    if (st != SA_OK) return st;
    if (backend == SA_BACKEND_CUDA) why = "STREAMARENA_BACKEND=cuda";
    if (backend == SA_BACKEND_HOST) why = "STREAMARENA_BACKEND=host";
    if (backend == SA_BACKEND_AUTO) why = "backend auto, CUDA usable";
  }
  sa_status st = open_backend(backend, device, out);
  if (st == SA_OK && (*out)->why[0] == '\0') snprintf((*out)->why, sizeof (*out)->why, "%s", why);
  return st;
}
