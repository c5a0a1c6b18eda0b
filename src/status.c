/* Status codes and backend names: the static strings behind
 * sa_status_string and sa_backend_name.
 *
 * Owns nothing; calls nothing; called by users and by any module that
 * reports an error. */
#include <streamarena/streamarena.h>

/* Indexed by sa_status; the static assert below keeps it complete. */
static const char *const status_strings[] = {
    [SA_OK] = "ok",
    [SA_ERR_INVALID_ARGUMENT] = "invalid argument",
    [SA_ERR_OUT_OF_MEMORY] = "out of memory",
    [SA_ERR_INVALID_POINTER] = "invalid pointer",
    [SA_ERR_DOUBLE_FREE] = "double free",
    [SA_ERR_UNKNOWN_STREAM] = "unknown stream",
    [SA_ERR_NO_DEVICE] = "no usable device",
    [SA_ERR_DRIVER] = "driver error",
    [SA_ERR_NOT_READY] = "not ready",
    [SA_ERR_BAD_CONFIG] = "bad configuration",
    [SA_ERR_LIVE_BLOCKS] = "arena destroyed with live blocks",
    [SA_ERR_STREAM_ORDER] = "stream-order violation",
    [SA_ERR_NOT_SUPPORTED] = "not supported by this backend",
    [SA_ERR_INTERNAL] = "internal error",
    [SA_ERR_STREAM_CAPTURING] = "stream is being captured into a CUDA graph",
};

_Static_assert(sizeof status_strings / sizeof status_strings[0] == SA_STATUS_COUNT_,
               "every sa_status needs a string");

const char *sa_status_string(sa_status status) {
  /* A cast-in integer from a caller may be out of range or a hole. */
  if ((unsigned)status >= SA_STATUS_COUNT_ || status_strings[status] == NULL) {
    return "unknown status";
  }
  return status_strings[status];
}

const char *sa_backend_name(sa_backend backend) {
  switch (backend) {
    case SA_BACKEND_AUTO:
      return "auto";
    case SA_BACKEND_CUDA:
      return "cuda";
    case SA_BACKEND_HOST:
      return "host";
  }
  return "unknown";
}
