/* Pooled driver events.
 *
 * Creating an event costs a few times what recording one does (See Note
 * [Event costs]), so events are recycled through a small pool, and one
 * event covers a whole batch of blocks. events.xin_flight counts events
 * recorded and not yet consumed.
 */
#include <stdlib.h>

#include "event_pool.h"
#include "../arena.h"
#include "../driver/driver.h"

sa_status sa__event_get(sa_arena *a, sa_event *out) {
  pthread_mutex_lock(&a->events.lock);
  if (a->events.n > 0) {
    *out = a->events.pool[--a->events.n];
    pthread_mutex_unlock(&a->events.lock);
    return SA_OK;
  }
  pthread_mutex_unlock(&a->events.lock);
  return a->drv->ops->event_create(a->drv, out);
}

void sa__event_put(sa_arena *a, sa_event e) {
  pthread_mutex_lock(&a->events.lock);
  if (a->events.n == a->events.cap) {
    size_t cap = a->events.cap ? a->events.cap * 2 : 16;
    sa_event *grown = realloc(a->events.pool, cap * sizeof *grown);
    if (grown == NULL) {
      pthread_mutex_unlock(&a->events.lock);
      (void)a->drv->ops->event_destroy(a->drv, e); /* nothing better to do */
      return;
    }
    a->events.pool = grown;
    a->events.cap = cap;
  }
  a->events.pool[a->events.n++] = e;
  pthread_mutex_unlock(&a->events.lock);
}

sa_status sa__event_record_new(sa_arena *a, sa_stream stream, sa_event *out) {
  sa_event e;
  sa_status st = sa__event_get(a, &e);
  if (st != SA_OK) return st;
  st = a->drv->ops->event_record(a->drv, e, stream);
  if (st != SA_OK) {
    sa__event_put(a, e);
    return st;
  }
  atomic_fetch_add_explicit(&a->events.xin_flight, 1, memory_order_relaxed);
  *out = e;
  return SA_OK;
}

sa_status sa__event_consume(sa_arena *a, sa_event e, sa_stream stream) {
  sa_status st = a->drv->ops->event_query(a->drv, e);
  if (st == SA_ERR_NOT_READY) st = a->drv->ops->stream_wait_event(a->drv, stream, e);
  if (st != SA_OK) return st; /* the caller still owns e */
  atomic_fetch_sub_explicit(&a->events.xin_flight, 1, memory_order_relaxed);
  sa__event_put(a, e);
  return SA_OK;
}

sa_status sa__event_pool_fini(sa_arena *a) {
  sa_status first = SA_OK;
  for (size_t i = 0; i < a->events.n; i++) {
    sa_status st = a->drv->ops->event_destroy(a->drv, a->events.pool[i]);
    if (st != SA_OK && first == SA_OK) first = st; /* the event stays with the driver */
  }
  free(a->events.pool);
  a->events.pool = NULL;
  a->events.n = a->events.cap = 0;
  return first;
}

/* Retire e into the pool if it completed (or, SA_WAIT, once it has). */
sa_status sa__event_retire(sa_arena *a, sa_event e, sa_wait wait) {
  sa_status st = wait == SA_WAIT ? a->drv->ops->event_synchronize(a->drv, e)
                      : a->drv->ops->event_query(a->drv, e);
  if (st != SA_OK) return st;
  atomic_fetch_sub_explicit(&a->events.xin_flight, 1, memory_order_relaxed);
  sa__event_put(a, e);
  return SA_OK;
}

sa_status sa__event_settle(sa_arena *a, sa_event e) {
  sa_status st = sa__event_retire(a, e, SA_WAIT);
  if (st != SA_OK) {
    atomic_fetch_sub_explicit(&a->events.xin_flight, 1, memory_order_relaxed);
    (void)a->drv->ops->event_destroy(a->drv, e); /* freed once its work completes */
  }
  return st;
}

void sa__event_drop(sa_arena *a, sa_event e) {
  atomic_fetch_sub_explicit(&a->events.xin_flight, 1, memory_order_relaxed);
  sa__event_put(a, e);
}
