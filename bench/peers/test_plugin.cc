// A plug-in for the peer benchmark's own test (peers_test.sh): the loading
// path and every workload on a machine without a GPU. It hands out distinct
// made-up addresses (the benchmark never touches the memory: a real malloc of
// the random workload's 4 GiB blocks took seconds each under ASan) and counts
// the live bytes, so its peak is exactly the peak live of what ran. Not an
// allocator anyone compares against.
#include <atomic>
#include <cstdint>
#include <cstdio>

#include "bench/peers/backend.h"

namespace {

struct Counter {
  std::atomic<size_t> now{0}, peak{0};
  std::atomic<uintptr_t> next{uintptr_t{1} << 40}; // never reused: addresses stay distinct
};

int create(const peer_env *, void **self, char *, size_t) {
  *self = new Counter;
  return PEER_OK;
}

int alloc(void *self, void **p, size_t size, void *) {
  auto *c = static_cast<Counter *>(self);
  *p = reinterpret_cast<void *>(c->next.fetch_add((size + 255) / 256 * 256));
  size_t now = c->now.fetch_add(size) + size;
  size_t peak = c->peak.load();
  while (now > peak && !c->peak.compare_exchange_weak(peak, now)) {
  }
  return PEER_OK;
}

int release(void *self, void *, size_t size, void *, void *) {
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

const char *error(void *) { return "no error"; }

const peer_backend backends[] = {{
    "test-count",
    "made-up addresses, live bytes counted (the benchmark's own test)",
    "live bytes at most",
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
