/* cpu_scaling: what the machine itself gives when threads are added, for
 * reading alloc_bench's and peer_bench's thread scaling. T threads (1, 2,
 * 4, 8, 12, 16) each run the same loop in a 32 KiB buffer of its own
 * (L1-resident, no allocator, no sharing), in two shapes: "chain", one
 * xorshift generator adding into the buffer (a chain of dependent steps,
 * which leaves most of a core idle), and "wide", four independent ones (a
 * core's loads, stores and ALUs busy, as an allocator's fast path keeps
 * them). Two threads that share a core's units (SMT siblings, or vCPUs the
 * host gives one core) slow "wide" down and hardly "chain". Printed: all
 * threads' iterations per second and the ratio to one thread, per shape.
 *
 *   bazel run -c opt //bench:cpu_scaling [-- ITERATIONS]   (default 2e8 per thread)
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "test/util.h"

#define MAX_THREADS 16

static atomic_int start;
static long iterations = 200000000;

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int wide; /* the shape of the loop: 0 chain, 1 wide */

static void *loop(void *arg) {
  uint64_t x = (uintptr_t)arg * 2654435761u + 1, y = x + 1, z = x + 2, w = x + 3;
  uint64_t *buf = calloc(4096, sizeof *buf);
  if (buf == NULL) return NULL;
  while (!atomic_load_explicit(&start, memory_order_acquire)) {
  }
  if (!wide) {
    for (long i = 0; i < iterations; i++) {
      x = sa_xorshift64(x);
      buf[x & 4095] += x;
    }
  } else {
    for (long i = 0; i < iterations; i++) {
      x = sa_xorshift64(x), y = sa_xorshift64(y), z = sa_xorshift64(z), w = sa_xorshift64(w);
      buf[x & 4095] += x;
      buf[y & 4095] += y;
      buf[z & 4095] += z;
      buf[w & 4095] += w;
    }
  }
  uint64_t keep = x + y + z + w + buf[0]; /* the loop's result is used */
  free(buf);
  return (void *)(uintptr_t)keep;
}

int main(int argc, char **argv) {
  if (argc > 1) iterations = atol(argv[1]);
  if (iterations <= 0) {
    fprintf(stderr, "usage: cpu_scaling [ITERATIONS per thread, > 0]\n");
    return 2;
  }
  static const int counts[] = {1, 2, 4, 8, 12, 16};
  for (wide = 0; wide <= 1; wide++) {
    double one = 0;
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
      int t = counts[k];
      pthread_t th[MAX_THREADS];
      atomic_store(&start, 0);
      for (int i = 0; i < t; i++) {
        if (pthread_create(&th[i], NULL, loop, (void *)(uintptr_t)(i + 1)) != 0) {
          fprintf(stderr, "cpu_scaling: pthread_create failed\n");
          return 1;
        }
      }
      double t0 = seconds();
      atomic_store_explicit(&start, 1, memory_order_release);
      for (int i = 0; i < t; i++) pthread_join(th[i], NULL);
      double rate = (double)t * (double)iterations / (seconds() - t0) / 1e6;
      if (k == 0) one = rate;
      printf("%-5s threads %2d  %9.1f Miterations/s  %5.2f x\n", wide ? "wide" : "chain", t,
             rate, rate / one);
    }
  }
  return 0;
}
