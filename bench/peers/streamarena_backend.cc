// streamarena as a peer backend (builtin.h): sa_alloc/sa_free on an arena of
// its own per instance; sa_stream_release before the program destroys a
// stream, as a user of the library does. The entries: the default
// configuration; the one docs/TORCH.md gives PyTorch (examples/torch), as
// torch-expandable is PyTorch's allocator with its VMM setting; a pool
// mapped up front (initial_physical, which run.sh sets with --sa-conf to
// half the free device memory, the size RMM's arena takes); and the points
// of the footprint/speed curve, streamarena-ft<target> (footprint_target),
// which plot.py joins with the default's into a curve beside each peer's
// point.
#include <cstdio>
#include <initializer_list>

#include <streamarena/host.h>
#include <streamarena/streamarena.h>

#include "bench/peers/builtin.h"

#define PEERS_STR_(x) #x
#define PEERS_STR(x) PEERS_STR_(x)
#define SA_VERSION_TEXT \
  PEERS_STR(SA_VERSION_MAJOR) "." PEERS_STR(SA_VERSION_MINOR) "." PEERS_STR(SA_VERSION_PATCH)

namespace peers {
namespace {

thread_local char last_error[256];

int fail(const char *what, sa_status st, int code) {
  std::snprintf(last_error, sizeof last_error, "%s: %s", what, sa_status_string(st));
  return code;
}

// streamarena.torch.install()'s TORCH_DEFAULTS (python/streamarena/torch.py).
constexpr const char *TORCH_CONF = "large_threshold=1KiB,exact_growth=1";

// conf: the entry's own configuration, applied before --sa-conf's.
int create_with(const char *conf, const peer_env *env, void **self, char *err,
                size_t err_size) {
  sa_config cfg;
  sa_config_init(&cfg);
  cfg.device = env->device;
  cfg.backend = env->gpu ? SA_BACKEND_CUDA : SA_BACKEND_HOST;
  char why[256] = "";
  for (const char *c : {conf, env->conf}) {
    if (c != nullptr && sa_config_parse(&cfg, c, why, sizeof why) != SA_OK) {
      std::snprintf(err, err_size, "configuration '%s': %s", c, why);
      return PEER_ERROR;
    }
  }
  if (cfg.backend == SA_BACKEND_HOST) {
    // A simulated device the size of an H200, so traces recorded on one fit
    // (only chunks actually created take host memory, and none is touched).
    sa_status st = sa_host_set_device_memory(static_cast<size_t>(141) << 30);
    if (st != SA_OK) {
      std::snprintf(err, err_size, "sa_host_set_device_memory: %s", sa_status_string(st));
      return PEER_ERROR;
    }
  }
  sa_arena *a = nullptr;
  sa_status st = sa_arena_create(&cfg, &a);
  if (st != SA_OK) {
    std::snprintf(err, err_size, "sa_arena_create: %s", sa_status_string(st));
    return PEER_ERROR;
  }
  *self = a;
  return PEER_OK;
}

int sa_alloc_op(void *self, void **p, size_t size, void *stream) {
  sa_status st = sa_alloc(static_cast<sa_arena *>(self), p, size, stream);
  if (st == SA_OK) [[likely]]
    return PEER_OK;
  return fail("sa_alloc", st, st == SA_ERR_OUT_OF_MEMORY ? PEER_OOM : PEER_ERROR);
}

int sa_free_op(void *, void *p, size_t, void *stream, void *) {
  sa_status st = sa_free(p, stream);
  if (st == SA_OK) [[likely]]
    return PEER_OK;
  return fail("sa_free", st, PEER_ERROR);
}

int sa_stream_done(void *self, void *stream) {
  sa_status st = sa_stream_release(static_cast<sa_arena *>(self), stream);
  return st == SA_OK ? PEER_OK : fail("sa_stream_release", st, PEER_ERROR);
}

int sa_stats_op(void *self, peer_stats *out) {
  sa_stats s;
  sa_status st = sa_get_stats(static_cast<sa_arena *>(self), &s);
  if (st != SA_OK) return fail("sa_get_stats", st, PEER_ERROR);
  out->reserved_peak = s.reserved_bytes_peak;
  out->reserved_now = s.reserved_bytes;
  return PEER_OK;
}

int sa_destroy(void *self, char *err, size_t err_size) {
  sa_status st = sa_arena_destroy(static_cast<sa_arena *>(self));
  if (st == SA_OK) return PEER_OK;
  std::snprintf(err, err_size, "sa_arena_destroy: %s", sa_status_string(st));
  return PEER_ERROR;
}

const char *sa_error(void *) { return last_error; }

int sa_create(const peer_env *env, void **self, char *err, size_t err_size) {
  return create_with(nullptr, env, self, err, err_size);
}

int sa_create_torch(const peer_env *env, void **self, char *err, size_t err_size) {
  return create_with(TORCH_CONF, env, self, err, err_size);
}

// A curve point's create: the default configuration with conf.
template <const char *conf>
int sa_create_point(const peer_env *env, void **self, char *err, size_t err_size) {
  return create_with(conf, env, self, err, err_size);
}

// The entries differ in name, text and configuration only.
constexpr peer_backend entry(const char *name, const char *about,
                             int (*create)(const peer_env *, void **, char *, size_t)) {
  return peer_backend{name,           about,
                      "sa_get_stats reserved_bytes_peak (physical memory mapped)",
                      create,         sa_alloc_op, sa_free_op,
                      sa_stream_done, sa_stats_op, sa_destroy,
                      sa_error};
}

const peer_backend backend = entry("streamarena",
                                   "streamarena " SA_VERSION_TEXT
                                   ": sa_alloc/sa_free, one arena per instance, "
                                   "default configuration",
                                   sa_create);

const peer_backend prefill_backend =
    entry("streamarena-prefill",
          "streamarena " SA_VERSION_TEXT ": as streamarena, with a pool mapped up front "
          "(initial_physical: run.sh gives half the free device memory, as RMM's arena takes)",
          sa_create);

const peer_backend torch_backend =
    entry("streamarena-torch",
          "streamarena " SA_VERSION_TEXT ": as streamarena, with the configuration docs/TORCH.md "
          "gives PyTorch (large_threshold=1KiB: PyTorch's small requests get spans too; "
          "exact_growth=1: nothing mapped ahead, as expandable segments)",
          sa_create_torch);

constexpr char KEEP[] = "keep_spans=1";
const peer_backend keep_backend =
    entry("streamarena-keep",
          "streamarena " SA_VERSION_TEXT ": as streamarena, with keep_spans=1 (a thread keeps "
          "its last span freed on a stream for that stream's next request of its size)",
          sa_create_point<KEEP>);

// The curve: footprint targets from the default's 1 + 1/64 up to 2, the
// fastest (a larger target acts as 2).
constexpr char FT_1_2[] = "footprint_target=1.2", FT_1_5[] = "footprint_target=1.5",
               FT_2[] = "footprint_target=2";
#define SA_POINT_ABOUT(conf) \
  "streamarena " SA_VERSION_TEXT ": as streamarena, with " conf " (a point of its curve)"
const peer_backend curve_backends[] = {
    entry("streamarena-ft1.2", SA_POINT_ABOUT("footprint_target=1.2"), sa_create_point<FT_1_2>),
    entry("streamarena-ft1.5", SA_POINT_ABOUT("footprint_target=1.5"), sa_create_point<FT_1_5>),
    entry("streamarena-ft2", SA_POINT_ABOUT("footprint_target=2"), sa_create_point<FT_2>),
};
#undef SA_POINT_ABOUT

}  // namespace

const peer_backend *streamarena_curve_backend(size_t i) {
  return i < sizeof curve_backends / sizeof curve_backends[0] ? &curve_backends[i] : nullptr;
}

const peer_backend *streamarena_backend() { return &backend; }

const peer_backend *streamarena_torch_backend() { return &torch_backend; }

const peer_backend *streamarena_prefill_backend() { return &prefill_backend; }

const peer_backend *streamarena_keep_backend() { return &keep_backend; }

}  // namespace peers
