/* Pooled driver events (event_pool.c): every event the allocator records
 * comes from the pool and goes back to it, and the pool counts those in
 * flight. Calls the driver; called by every layer that records or waits. */
#ifndef SA_BASE_EVENT_POOL_H
#define SA_BASE_EVENT_POOL_H

#include <pthread.h>

#include "../driver/driver.h"
#include "base.h"

typedef struct sa_events_s {
  pthread_mutex_t lock;
  sa_event *pool;
  size_t n, cap;
  _Atomic size_t xin_flight;    /* recorded and not yet consumed */
} sa_events;

sa_status sa__event_get(sa_arena *a, sa_event *out);
void sa__event_put(sa_arena *a, sa_event e);
/* Record a pooled event on stream. */
sa_status sa__event_record_new(sa_arena *a, sa_stream stream, sa_event *out);
/* Make stream wait for e unless e already completed; then e goes back to the
 * pool. On error e is still returned to the pool. */
sa_status sa__event_consume(sa_arena *a, sa_event e, sa_stream stream);
/* Retire e into the pool if it completed (SA_WAIT: once it has);
 * SA_ERR_NOT_READY leaves e with the caller. */
sa_status sa__event_retire(sa_arena *a, sa_event e, sa_wait wait);
/* Destroy paths: wait for e and pool it; if the wait fails, destroy e
 * rather than lose it. Returns the wait's status. */
sa_status sa__event_settle(sa_arena *a, sa_event e);
/* Back to the pool without waiting: stream order already covers it (a pending
 * event may be re-recorded; waits enqueued earlier keep their target). */
void sa__event_drop(sa_arena *a, sa_event e);
sa_status sa__event_pool_fini(sa_arena *a); /* the first event_destroy failure */

#endif /* SA_BASE_EVENT_POOL_H */
