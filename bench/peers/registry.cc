// The backends of a run: see registry.h.
#include "bench/peers/registry.h"

#include <dlfcn.h>

namespace peers {

void Registry::add(const peer_backend *b, const std::string &origin) {
  entries_.push_back(Entry{b, origin});
}

bool Registry::load(const std::string &path, std::string *err) {
  // RTLD_LOCAL: two plug-ins' libraries (RMM's static CUDA runtime, torch's
  // shared one) must not resolve each other's symbols.
  void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char *why = dlerror();
    *err = why != nullptr ? why : path + ": cannot be loaded";
    return false;
  }
  auto fn = reinterpret_cast<peer_backends_fn>(dlsym(h, PEER_BACKENDS_SYMBOL));
  if (fn == nullptr) {
    *err = path + ": no " PEER_BACKENDS_SYMBOL " function";
    return false;
  }
  size_t n = 0;
  const peer_backend *bs = fn(PEER_ABI, &n);
  if (bs == nullptr) {
    *err = path + ": built for another version of bench/peers/backend.h";
    return false;
  }
  for (size_t i = 0; i < n; i++) {
    if (find(bs[i].name) != nullptr) {
      *err = path + ": a second backend named " + bs[i].name;
      return false;
    }
    add(&bs[i], path);
  }
  return true;
}

const Registry::Entry *Registry::find(const std::string &name) const {
  for (const Entry &e : entries_)
    if (name == e.backend->name) return &e;
  return nullptr;
}

}  // namespace peers
