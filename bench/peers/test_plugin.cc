// A plug-in for the peer benchmark's own test (peers_test.sh): host malloc
// behind the plug-in interface, so the loading path and every workload run
// on a machine without a GPU. Not an allocator anyone compares against.
#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "bench/peers/backend.h"

namespace {

struct Counter {
  std::atomic<size_t> now{0}, peak{0};
};

int create(const peer_env *, void **self, char *, size_t) {
  *self = new Counter;
  return PEER_OK;
}

int alloc(void *self, void **p, size_t size, void *) {
  *p = std::malloc(size);
  if (*p == nullptr) return PEER_OOM;
  auto *c = static_cast<Counter *>(self);
  size_t now = c->now.fetch_add(size) + size;
  size_t peak = c->peak.load();
  while (now > peak && !c->peak.compare_exchange_weak(peak, now)) {
  }
  return PEER_OK;
}

int release(void *self, void *p, size_t size, void *, void *) {
  std::free(p);
  static_cast<Counter *>(self)->now.fetch_sub(size);
  return PEER_OK;
}

int stats(void *self, peer_stats *out) {
  auto *c = static_cast<Counter *>(self);
  out->reserved_peak = c->peak.load();
  out->reserved_now = c->now.load();
  return PEER_OK;
}

int destroy(void *self, char *err, size_t err_size) {
  auto *c = static_cast<Counter *>(self);
  size_t left = c->now.load();
  delete c;
  if (left == 0) return PEER_OK;
  std::snprintf(err, err_size, "%zu bytes never freed", left);
  return PEER_ERROR;
}

const char *error(void *) { return "host malloc failed"; }

const peer_backend backends[] = {{
    "test-malloc",
    "host malloc/free (the benchmark's own test)",
    "bytes allocated at most",
    create,
    alloc,
    release,
    nullptr,
    stats,
    destroy,
    error,
}};

}  // namespace

extern "C" const peer_backend *peer_backends(unsigned abi, size_t *count) {
  if (abi != PEER_ABI) return nullptr;
  *count = sizeof backends / sizeof backends[0];
  return backends;
}
