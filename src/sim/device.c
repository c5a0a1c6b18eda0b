/* The simulated device as a whole: its lock, its configuration from the
 * environment, the failure helper and the counters of host.h.
 * Called by every module of src/sim/ and by driver/host.c. */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "../driver/driver.h"
#include "sim.h"

static pthread_mutex_t sim_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t sim_once = PTHREAD_ONCE_INIT;
static uint64_t sim_violations; /* lock held */

/* Parse "123", "16GiB", "16G", "512mib", "4096B", ... into bytes (binary
 * multiples, any case, as sa_config_parse takes them). 0 on success. */
static int parse_bytes(const char *text, size_t *out) {
  char *end = NULL;
  errno = 0;
  if (text[0] < '0' || text[0] > '9') return -1;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0) return -1;
  unsigned shift = 0;
  switch (tolower((unsigned char)*end)) {
    case 'k': shift = 10; break;
    case 'm': shift = 20; break;
    case 'g': shift = 30; break;
    case 't': shift = 40; break;
    default: break;
  }
  if (shift != 0) {
    end++;
    if (tolower((unsigned char)*end) == 'i') end++;
  }
  if (tolower((unsigned char)*end) == 'b') end++;
  if (*end != '\0') return -1;
  if (v > (unsigned long long)(SIZE_MAX >> shift)) return -1;
  *out = (size_t)v << shift;
  return 0;
}

static void sim_init(void) {
  const char *env = getenv("STREAMARENA_HOST_DEVICE_BYTES");
  if (env == NULL || env[0] == '\0') return;
  size_t bytes = 0;
  /* A bad value must not take the process down: warn and keep the default. */
  if (parse_bytes(env, &bytes) != 0 || sa_sim_set_device_bytes(bytes) != SA_OK) {
    fprintf(stderr,
            "streamarena host: ignoring STREAMARENA_HOST_DEVICE_BYTES=\"%s\" "
            "(want bytes >= 2MiB, with an optional suffix such as KiB, M or GiB)\n",
            env);
  }
}

void sa_sim_lock(void) {
  (void)pthread_once(&sim_once, sim_init);
  /* Only fails for an error-checking mutex misused; ours is a normal one. */
  (void)pthread_mutex_lock(&sim_mutex);
}

void sa_sim_unlock(void) { (void)pthread_mutex_unlock(&sim_mutex); }

sa_status sa_sim_fail(sa_status status, int code, const char *name) {
  sa_driver_set_error(code, name);
  return status;
}

void sa_sim_note_violation(void) { sim_violations++; }

uint64_t sa_sim_violations(void) { return sim_violations; }

sa_status sa_host_set_device_memory(size_t bytes) {
  sa_sim_lock();
  sa_status st = sa_sim_set_device_bytes(bytes);
  sa_sim_unlock();
  return st;
}

void sa_host_get_counters(sa_host_counters *out) {
  if (out == NULL) return;
  sa_sim_lock();
  sa_sim_vmm_counters(out);
  sa_sim_stream_counters(out);
  out->order_violations = sim_violations;
  sa_sim_unlock();
}

void sa_host_get_totals(sa_host_totals *out) {
  if (out == NULL) return;
  sa_sim_lock();
  sa_sim_fault_calls(out->calls);
  sa_sim_vmm_totals(out);
  sa_sim_unlock();
}
