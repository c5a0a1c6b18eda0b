/* See device_switch.h. */
#include "device_switch.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct switcher_s {
  const sa_switch_ops *ops;
  int id, rounds;
  const size_t *sizes;
  size_t nsizes;
  sa_switch_result r;
} switcher;

static void *switch_devices(void *arg) {
  switcher *w = arg;
  const sa_switch_ops *ops = w->ops;
  sa_stream s[2] = {NULL, NULL};
  for (int dev = 0; dev < 2; dev++) {
    if (ops->set_device(dev) != SA_OK || ops->stream_create(&s[dev]) != SA_OK) {
      w->r.failures++;
      return NULL;
    }
  }
  for (int round = 0; round < w->rounds; round++) {
    int dev = (w->id + round) % 2;
    void *p = NULL, *q = NULL;
    if (ops->set_device(dev) != SA_OK ||
        sa_malloc_async(&p, w->sizes[(size_t)round % w->nsizes], s[dev]) != SA_OK || p == NULL) {
      w->r.failures++;
      continue;
    }
    w->r.allocations++;
    if (ops->pointer_device(p) != dev) w->r.wrong_device++;
    if (sa_malloc_async(&q, 256, s[1 - dev]) != SA_ERR_UNKNOWN_STREAM) {
      w->r.foreign_taken++;
      if (q != NULL) (void)sa_free_async(q, s[1 - dev]);
    }
    if (sa_free_async(p, s[dev]) != SA_OK) w->r.failures++;
  }
  for (int dev = 0; dev < 2; dev++) {
    sa_arena *a = NULL;
    if (sa_default_arena(dev, &a) != SA_OK || sa_stream_release(a, s[dev]) != SA_OK ||
        ops->stream_destroy(s[dev]) != SA_OK)
      w->r.failures++;
  }
  return NULL;
}

void sa_switch_run(const sa_switch_ops *ops, int threads, int rounds, const size_t *sizes,
                   size_t nsizes, sa_switch_result *out) {
  *out = (sa_switch_result){0};
  switcher *w = calloc((size_t)threads, sizeof *w);
  pthread_t *t = calloc((size_t)threads, sizeof *t);
  int started = 0;
  if (w != NULL && t != NULL) {
    for (; started < threads; started++) {
      w[started] = (switcher){ops, started, rounds, sizes, nsizes, {0}};
      if (pthread_create(&t[started], NULL, switch_devices, &w[started]) != 0) break;
    }
  }
  out->failures += (unsigned)(threads - started);
  for (int i = 0; i < started; i++) {
    if (pthread_join(t[i], NULL) != 0) out->failures++;
    out->allocations += w[i].r.allocations;
    out->wrong_device += w[i].r.wrong_device;
    out->foreign_taken += w[i].r.foreign_taken;
    out->failures += w[i].r.failures;
  }
  free(w);
  free(t);
}
