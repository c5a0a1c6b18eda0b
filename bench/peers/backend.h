/* The peer benchmark's allocator interface (bench/peers/peer_bench.cc).
 *
 * Every allocator the benchmark compares is a peer_backend: streamarena and
 * cudaMallocAsync are built into the program; RMM's and PyTorch's allocators
 * are plug-ins, shared libraries built against those libraries
 * (bench/peers/build.sh) and loaded with dlopen, so the program itself
 * builds and runs without them. A plug-in exports
 *
 *   const peer_backend *peer_backends(unsigned abi, size_t *count);
 *
 * returning an array of *count backends, or NULL if it was built for
 * another PEER_ABI. The interface is C so the program and a plug-in may come
 * from different compilers and flags.
 *
 * Calls: create, then any number of alloc/free from any threads at once
 * (every backend must be thread-safe), stream_done before the program
 * destroys a stream it used, stats, destroy. Streams are CUstreams
 * (cudaStream_t) on a GPU, simulator streams on the host simulator.
 */
#ifndef SA_BENCH_PEERS_BACKEND_H
#define SA_BENCH_PEERS_BACKEND_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PEER_ABI 1

/* Results of alloc and free. */
#define PEER_OK 0
#define PEER_OOM 1    /* alloc only: the allocator is out of memory */
#define PEER_ERROR -1 /* anything else; error() says what */

typedef struct peer_env_s {
  int device;       /* CUDA device ordinal */
  int gpu;          /* 1: a GPU; 0: the host simulator (only streamarena runs) */
  const char *conf; /* the backend's own settings (--conf); NULL: its defaults */
} peer_env;

typedef struct peer_stats_s {
  size_t reserved_peak; /* the most device memory it held since create */
  size_t reserved_now;
} peer_stats;

typedef struct peer_backend_s {
  const char *name;     /* "rmm-pool": the name on the command line and in results */
  const char *about;    /* one line: what runs, with which settings */
  const char *reserved; /* where stats' figures come from */
  /* A fresh allocator: nothing cached, peaks from zero. */
  int (*create)(const peer_env *env, void **self, char *err, size_t err_size);
  int (*alloc)(void *self, void **p, size_t size, void *stream);
  /* p (of size bytes, allocated on alloc_stream) is no longer used once the
   * work enqueued on stream before this call is done. */
  int (*free)(void *self, void *p, size_t size, void *stream, void *alloc_stream);
  /* The program will destroy stream after this call (NULL: nothing to do). */
  int (*stream_done)(void *self, void *stream);
  int (*stats)(void *self, peer_stats *out);
  /* Everything allocated has been freed. */
  int (*destroy)(void *self, char *err, size_t err_size);
  /* The message of the calling thread's last PEER_ERROR or PEER_OOM. */
  const char *(*error)(void *self);
} peer_backend;

typedef const peer_backend *(*peer_backends_fn)(unsigned abi, size_t *count);
#define PEER_BACKENDS_SYMBOL "peer_backends"

#ifdef __cplusplus
}
#endif

#endif /* SA_BENCH_PEERS_BACKEND_H */
