/* hello: streamarena's smallest complete program, on either backend.
 *   hello [SPEC]     SPEC: sa_config_parse syntax, e.g. backend=host
 * Creates an arena, gets a stream, allocates on it, uses the memory in
 * stream order, frees it, and tears down. */
#include <stdio.h>
#include <string.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

int main(int argc, char **argv) {
  sa_config cfg;
  sa_config_init(&cfg); /* backend auto: CUDA where usable, else the host simulator */
  char err[256];
  if (argc > 1 && sa_config_parse(&cfg, argv[1], err, sizeof err) != SA_OK) {
    fprintf(stderr, "hello: %s\n", err);
    return 2;
  }
  sa_arena *arena = NULL;
  sa_status s = sa_arena_create(&cfg, &arena);
  if (s != SA_OK) {
    /* A configuration that breaks a rule: the rule, not the driver's last
     * word (which may be older than this call). */
    const char *cause = err;
    if (s != SA_ERR_BAD_CONFIG || sa_config_check(&cfg, err, sizeof err) == SA_OK)
      sa_last_driver_error(&cause);
    fprintf(stderr, "hello: sa_arena_create: %s (%s)\n", sa_status_string(s), cause);
    return 1;
  }
  int host = sa_arena_backend(arena) == SA_BACKEND_HOST;
  printf("hello: backend %s (%s)\n", sa_backend_name(sa_arena_backend(arena)),
         sa_arena_backend_reason(arena));

  /* A stream. CUDA: any CUstream or cudaStream_t of the device's primary
   * context (cudaStreamCreate's), or NULL, the legacy default stream, used
   * here so that this program needs no CUDA library to build. Host: a
   * stream of the simulator. */
  sa_stream stream = NULL;
  if (host) s = sa_host_stream_create(SA_HOST_AUTO, &stream);

  const size_t size = (size_t)1 << 20;
  void *p = NULL;
  if (s == SA_OK) s = sa_alloc(arena, &p, size, stream);
  /* p is ready for work enqueued on `stream` from now on (launch kernels
   * there). On the host backend the memory is CPU memory, but the CPU is
   * not ordered on the stream: drain it before touching p. */
  if (s == SA_OK && host) {
    s = sa_host_stream_drain(stream);
    if (s == SA_OK) memset(p, 0x5a, size);
  }
  /* Free in stream order: reusable once the work enqueued on `stream`
   * before this call is done. */
  if (s == SA_OK) s = sa_free(p, stream);
  if (s != SA_OK) fprintf(stderr, "hello: %s\n", sa_status_string(s));
  /* Optional before a stream is destroyed: hands back at once what the
   * arena holds for it (without it, that memory comes back later). */
  if (host && stream != NULL) {
    sa_status r = sa_stream_release(arena, stream);
    if (r == SA_OK) r = sa_host_stream_destroy(stream);
    if (s == SA_OK) s = r;
  }
  sa_status d = sa_arena_destroy(arena);
  if (s == SA_OK) s = d;
  printf("hello: allocated%s and freed %zu bytes: %s\n", host ? ", wrote" : "", size,
         s == SA_OK ? "ok" : sa_status_string(s));
  return s == SA_OK ? 0 : 1;
}
