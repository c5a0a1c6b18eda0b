/* Threads that switch devices between drop-in calls: each thread makes a
 * stream on each of two devices, then for a number of rounds makes a device
 * current, takes a block with sa_malloc_async on that device's stream, asks
 * whose memory it is, tries the other device's stream (which must be
 * refused with SA_ERR_UNKNOWN_STREAM) and frees the block; at the end it
 * releases its streams to the default arenas and destroys them. The backend
 * comes in as callbacks, so the host simulator (multi_device_test) and two
 * GPUs (gpu_multi_device_test) run the same harness. Public API only. */
#ifndef SA_TEST_DEVICE_SWITCH_H
#define SA_TEST_DEVICE_SWITCH_H

#include <streamarena/streamarena.h>

typedef struct sa_switch_ops_s {
  /* Make device current on the calling thread. */
  sa_status (*set_device)(int device);
  /* A stream of the current device; destroy one. */
  sa_status (*stream_create)(sa_stream *out);
  sa_status (*stream_destroy)(sa_stream stream);
  /* The device whose memory p is, or -1. */
  int (*pointer_device)(const void *p);
} sa_switch_ops;

typedef struct sa_switch_result_s {
  unsigned allocations;   /* blocks handed out */
  unsigned wrong_device;  /* of them, memory of another device than the current one */
  unsigned foreign_taken; /* the other device's stream was accepted */
  unsigned failures;      /* calls that failed */
} sa_switch_result;

/* threads threads, rounds rounds each, sizes cycled from sizes[0..nsizes);
 * *out gets the totals. */
void sa_switch_run(const sa_switch_ops *ops, int threads, int rounds, const size_t *sizes,
                   size_t nsizes, sa_switch_result *out);

#endif /* SA_TEST_DEVICE_SWITCH_H */
