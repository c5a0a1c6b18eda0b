/* The per-thread last driver error (and, once the host backend lands,
 * backend selection).
 *
 * Owns the thread-local record behind sa_last_driver_error, written by the
 * backends through sa_driver_set_error. Called by driver_cuda.c,
 * driver_host.c and the public API.
 */
#include "driver.h"

/* The last failing driver call of this thread. name is always a static
 * string (cuGetErrorName's, or a literal), so storing the pointer is safe. */
static _Thread_local int tl_error_code;
static _Thread_local const char *tl_error_name;

void sa_driver_set_error(int code, const char *name) {
  tl_error_code = code;
  tl_error_name = name;
}

int sa_last_driver_error(const char **name) {
  if (name != NULL) *name = tl_error_name != NULL ? tl_error_name : "no error";
  return tl_error_code;
}
