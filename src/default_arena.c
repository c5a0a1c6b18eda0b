/* Default arenas: one per device, created at first use, configured by the
 * environment variable STREAMARENA_CONF. They back the drop-in calls
 * sa_malloc_async / sa_free_async; sa_malloc_async picks the arena of the
 * calling thread's current device (sa_driver_current_device), read at every
 * call, so a thread that switches devices switches arenas.
 */
#include <stdlib.h>

#include "default_arena.h"
#include "arena.h"
#include "driver/driver.h"

#define SA_MAX_DEVICES 64

static pthread_mutex_t defaults_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(sa_arena *) defaults[SA_MAX_DEVICES];

/* A bad STREAMARENA_CONF fails every sa_malloc_async the same way until it
 * is fixed: say each reason once, not on every call. Under defaults_lock. */
static void report_conf(const char *err) {
  static char said[256];
  if (strcmp(said, err) == 0) return;
  fprintf(stderr, "streamarena: STREAMARENA_CONF: %s\n", err);
  snprintf(said, sizeof said, "%s", err);
}

sa_status sa_default_arena(int device, sa_arena **out) {
  if (out == NULL || device < 0 || device >= SA_MAX_DEVICES) return SA_ERR_INVALID_ARGUMENT;
  sa_arena *a = atomic_load_explicit(&defaults[device], memory_order_acquire);
  if (a != NULL) {
    *out = a;
    return SA_OK;
  }
  sa_status st = SA_OK;
  pthread_mutex_lock(&defaults_lock);
  a = atomic_load_explicit(&defaults[device], memory_order_acquire);
  if (a == NULL) {
    sa_config cfg;
    sa_config_init(&cfg);
    const char *env = getenv("STREAMARENA_CONF");
    char err[256];
    if (env != NULL) st = sa_config_parse(&cfg, env, err, sizeof err);
    if (st != SA_OK) {
      report_conf(err);
    } else {
      cfg.device = device;
      st = sa_arena_create(&cfg, &a);
      if (st == SA_OK) atomic_store_explicit(&defaults[device], a, memory_order_release);
      bool peers_refused =
          cfg.peer_access != 0 && (st == SA_ERR_NO_DEVICE || st == SA_ERR_NOT_SUPPORTED);
      /* A bad STREAMARENA_BACKEND fails the open itself: the driver named
       * it, and STREAMARENA_CONF (maybe unset) is not to blame. */
      size_t gran;
      bool env_refused = st == SA_ERR_BAD_CONFIG &&
                         sa_device_granularity(cfg.backend, device, &gran) == SA_ERR_BAD_CONFIG;
      if (((st == SA_ERR_BAD_CONFIG && !env_refused) || peers_refused) &&
          sa_config_check(&cfg, err, sizeof err) != SA_OK)
        report_conf(err);
    }
  }
  pthread_mutex_unlock(&defaults_lock);
  if (st == SA_OK) *out = a;
  return st;
}

sa_arena *sa__default_arena_now(int device) {
  if (device < 0 || device >= SA_MAX_DEVICES) return NULL;
  return atomic_load_explicit(&defaults[device], memory_order_acquire);
}

sa_status sa_malloc_async(void **out, size_t size, sa_stream stream) {
  if (out == NULL) return SA_ERR_INVALID_ARGUMENT;
  sa_arena *a;
  sa_status st = sa_default_arena(sa_driver_current_device(), &a);
  if (st != SA_OK) {
    *out = NULL;
    return st;
  }
  return sa_alloc(a, out, size, stream);
}

sa_status sa_free_async(void *p, sa_stream stream) { return sa_free(p, stream); }

void sa_default_arenas_shutdown(void) {
  pthread_mutex_lock(&defaults_lock);
  for (int i = 0; i < SA_MAX_DEVICES; i++) {
    sa_arena *a = atomic_exchange(&defaults[i], NULL);
    if (a != NULL) (void)sa_arena_destroy(a);
  }
  pthread_mutex_unlock(&defaults_lock);
}
