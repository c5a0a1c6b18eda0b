// What the workloads share: see workload.h.
#include "bench/peers/workload.h"

#include <cstdio>

#include "test/util.h"

namespace peers {

Instance::~Instance() {
  std::string err;
  if (self_ != nullptr && !destroy(&err))
    std::fprintf(stderr, "peer_bench: %s: %s\n", b_->name, err.c_str());
}

bool Instance::create(std::string *err) {
  char why[512] = "";
  if (b_->create(&env_, &self_, why, sizeof why) != PEER_OK) {
    self_ = nullptr;
    *err = std::string("create: ") + why;
    return false;
  }
  return true;
}

bool Instance::destroy(std::string *err) {
  if (self_ == nullptr) return true;
  char why[512] = "";
  int rc = b_->destroy(self_, why, sizeof why);
  self_ = nullptr;
  if (rc != PEER_OK) *err = std::string("destroy: ") + why;
  return rc == PEER_OK;
}

bool Instance::stats(peer_stats *out, std::string *err) {
  *out = peer_stats{};
  if (b_->stats(self_, out) == PEER_OK) return true;
  *err = std::string("stats: ") + b_->error(self_);
  return false;
}

std::string Instance::failed(const char *what, size_t size) {
  return std::string(what) + "(" + std::to_string(size) + " B): " + b_->error(self_);
}

Streams::~Streams() {
  std::string err;
  if (!s_.empty() && !finish(&err)) std::fprintf(stderr, "peer_bench: streams: %s\n", err.c_str());
}

bool Streams::create(unsigned n, std::string *err) {
  for (unsigned i = 0; i < n; i++) {
    void *s = nullptr;
    if (!dev_.stream_create(&s, err)) return false;
    s_.push_back(s);
  }
  return true;
}

bool Streams::finish(std::string *err) {
  bool ok = true;
  for (void *s : s_) {
    std::string e;
    if (!dev_.sync(s, &e)) {
      ok = false;
      *err = e;
    }
    if (in_.self() != nullptr && in_.backend()->stream_done != nullptr &&
        in_.backend()->stream_done(in_.self(), s) != PEER_OK) {
      ok = false;
      *err = std::string("stream_done: ") + in_.backend()->error(in_.self());
    }
    if (!dev_.stream_destroy(s, &e)) {
      ok = false;
      *err = e;
    }
  }
  s_.clear();
  return ok;
}

bool wind_up(Streams &streams, Instance &in, bool ok, std::string *err) {
  std::string e;
  if (!streams.finish(&e) && ok) {
    ok = false;
    *err = e;
  }
  if (!in.destroy(&e) && ok) {
    ok = false;
    *err = e;
  }
  return ok;
}

std::vector<size_t> mixed_sizes(unsigned max_bits) {
  std::vector<size_t> sizes(MIXED_N);
  uint64_t x = 0x9E3779B97F4A7C15u;
  for (size_t &size : sizes) {
    x = sa_xorshift64(x);
    size = sa_log_uniform_size(x, max_bits); // (2^b, 2^(b+1)], b from 8 to max_bits - 1
  }
  return sizes;
}

std::string mib(size_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", static_cast<double>(bytes) / (1 << 20));
  return b;
}

}  // namespace peers
