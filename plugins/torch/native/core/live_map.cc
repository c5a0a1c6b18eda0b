// The live blocks (live_map.h).
#include "plugins/torch/native/core/live_map.h"

#include <utility>

namespace sa_native {

void LiveMap::insert(void *p, Allocation a) {
  Shard &s = shard(p);
  std::lock_guard<std::mutex> g(s.lock);
  s.map[p] = std::move(a);
}

bool LiveMap::take(void *p, Allocation *out) {
  Shard &s = shard(p);
  std::lock_guard<std::mutex> g(s.lock);
  auto it = s.map.find(p);
  if (it == s.map.end()) return false;
  *out = std::move(it->second);
  s.map.erase(it);
  return true;
}

}  // namespace sa_native
