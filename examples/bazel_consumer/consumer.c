/* A program that depends on streamarena through Bazel: create an arena,
 * allocate on a stream, use the memory, free it, destroy the arena.
 *
 * Usage: consumer [SPEC]   (default "backend=host"; sa_config_parse syntax)
 * On the host backend the memory is ordinary CPU memory, so it is written
 * and read back here; on CUDA it is only allocated and freed. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

static int fail(const char *what, sa_status s) {
  fprintf(stderr, "consumer: %s: %s\n", what, sa_status_string(s));
  return 1;
}

int main(int argc, char **argv) {
  const char *spec = argc > 1 ? argv[1] : "backend=host";
  sa_config cfg;
  sa_config_init(&cfg);
  char err[256];
  sa_status s = sa_config_parse(&cfg, spec, err, sizeof err);
  if (s != SA_OK) {
    fprintf(stderr, "consumer: %s\n", err);
    return 2;
  }
  sa_arena *arena = NULL;
  s = sa_arena_create(&cfg, &arena);
  if (s != SA_OK) return fail("sa_arena_create", s);
  sa_backend backend = sa_arena_backend(arena);
  int host = backend == SA_BACKEND_HOST;

  /* Host backend: a simulated stream; CUDA: the legacy default stream. */
  sa_stream stream = NULL;
  if (host && (s = sa_host_stream_create(SA_HOST_AUTO, &stream)) != SA_OK) {
    sa_arena_destroy(arena);
    return fail("sa_host_stream_create", s);
  }

  const size_t size = (size_t)1 << 20;
  void *p = NULL;
  int bad = 0;
  s = sa_alloc(arena, &p, size, stream);
  if (s == SA_OK && host) {
    /* The memory is ready for work on `stream`; the CPU joins that order
     * once the stream has drained. */
    s = sa_host_stream_drain(stream);
    if (s == SA_OK) {
      memset(p, 0x5a, size);
      for (size_t i = 0; i < size; i++) bad += ((unsigned char *)p)[i] != 0x5a;
    }
  }
  int ok = s == SA_OK && bad == 0 && (uintptr_t)p % SA_ALIGNMENT == 0;
  if (s != SA_OK) fail("sa_alloc", s);
  if (p != NULL && (s = sa_free(p, stream)) != SA_OK) ok = !fail("sa_free", s);
  if (host) {
    if ((s = sa_stream_release(arena, stream)) != SA_OK) ok = !fail("sa_stream_release", s);
    if ((s = sa_host_stream_destroy(stream)) != SA_OK) ok = !fail("sa_host_stream_destroy", s);
  }
  if ((s = sa_arena_destroy(arena)) != SA_OK) ok = !fail("sa_arena_destroy", s);
  printf("consumer: %s backend: allocated, %s and freed %zu bytes: %s\n",
         sa_backend_name(backend), host ? "wrote, read back" : "used", size,
         ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
