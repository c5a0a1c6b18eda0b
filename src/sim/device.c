/* The simulated devices as a whole: the lock, the configuration from the
 * environment (device count, device memory), each thread's current device,
 * which device may access which peer's memory, the failure helper and the
 * counters of host.h. Called by every module of src/sim/ and by
 * driver/host.c. */
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
static int sim_devices = 1;     /* lock held */
/* Bit peer of no_peer[device]: peer cannot be granted access to device's
 * memory (sa_host_set_can_access_peer). Lock held. */
static uint64_t no_peer[SA_SIM_MAX_DEVICES];
/* The calling thread's device (sa_host_set_device), -1 until it sets one:
 * no lock, its own. */
static _Thread_local int tl_device = -1;

/* Parse "123", "16GiB", "16G", "512mib", "4096B", ... into bytes (binary
 * multiples, any case, the suffixes sa_config_parse takes: "16GB" is
 * refused there, as decimal or binary would be a guess). 0 on success. */
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
    if (tolower((unsigned char)end[0]) == 'i' && tolower((unsigned char)end[1]) == 'b') end += 2;
  } else if (tolower((unsigned char)*end) == 'b') {
    end++;
  }
  if (*end != '\0') return -1;
  if (v > (unsigned long long)(SIZE_MAX >> shift)) return -1;
  *out = (size_t)v << shift;
  return 0;
}

/* A bad value in the environment must not take the process down: the
 * simulator warns and keeps its default. */
static void sim_init(void) {
  const char *env = getenv("STREAMARENA_HOST_DEVICE_BYTES");
  size_t bytes = 0;
  if (env != NULL && env[0] != '\0' &&
      (parse_bytes(env, &bytes) != 0 || sa_sim_set_device_bytes(bytes) != SA_OK)) {
    fprintf(stderr,
            "streamarena host: ignoring STREAMARENA_HOST_DEVICE_BYTES=\"%s\" "
            "(want bytes >= 2MiB, with an optional suffix such as KiB, M or GiB)\n",
            env);
  }
  env = getenv("STREAMARENA_HOST_DEVICES");
  if (env != NULL && env[0] != '\0') {
    char *end = NULL;
    long n = strtol(env, &end, 10);
    if (end == env || *end != '\0' || n < 1 || n > SA_SIM_MAX_DEVICES) {
      fprintf(stderr,
              "streamarena host: ignoring STREAMARENA_HOST_DEVICES=\"%s\" (want 1 to %d)\n",
              env, SA_SIM_MAX_DEVICES);
    } else {
      sim_devices = (int)n;
    }
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

int sa_sim_device_count(void) { return sim_devices; }

int sa_sim_can_access_peer(int peer, int device) {
  return peer == device || !(no_peer[device] >> peer & 1);
}

sa_status sa_host_set_device_count(int count) {
  if (count < 1 || count > SA_SIM_MAX_DEVICES) return SA_ERR_INVALID_ARGUMENT;
  sa_sim_lock();
  sa_status st = SA_OK;
  for (int dev = count; dev < sim_devices && st == SA_OK; dev++)
    if (sa_sim_vmm_device_bytes_used(dev) != 0 || sa_sim_streams_on(dev) != 0)
      st = SA_ERR_INVALID_ARGUMENT; /* it still holds something */
  if (st == SA_OK) sim_devices = count;
  sa_sim_unlock();
  return st;
}

int sa_host_device_count(void) {
  sa_sim_lock();
  int n = sim_devices;
  sa_sim_unlock();
  return n;
}

sa_status sa_host_set_device(int device) {
  if (device < 0 || device >= sa_host_device_count()) return SA_ERR_NO_DEVICE;
  tl_device = device;
  return SA_OK;
}

int sa_host_get_device(void) { return tl_device >= 0 ? tl_device : 0; }

int sa_sim_current_device(void) { return tl_device; }

void sa_sim_set_current_device(int device) { tl_device = device; }

sa_status sa_host_set_can_access_peer(int peer, int device, int can) {
  if (peer < 0 || peer >= SA_SIM_MAX_DEVICES || device < 0 || device >= SA_SIM_MAX_DEVICES)
    return SA_ERR_INVALID_ARGUMENT;
  sa_sim_lock();
  if (can) no_peer[device] &= ~((uint64_t)1 << peer);
  else no_peer[device] |= (uint64_t)1 << peer;
  sa_sim_unlock();
  return SA_OK;
}

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
  sa_sim_event_counters(out);
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

void sa_host_get_thread_totals(sa_host_totals *out) {
  if (out == NULL) return;
  sa_sim_fault_thread_calls(out->calls);
  sa_sim_vmm_thread_totals(out);
}
