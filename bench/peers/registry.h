// The backends one run of the peer benchmark can use: the built-in ones and
// those of the plug-ins it was given (backend.h says what a plug-in is).
#ifndef SA_BENCH_PEERS_REGISTRY_H
#define SA_BENCH_PEERS_REGISTRY_H

#include <string>
#include <vector>

#include "bench/peers/backend.h"

namespace peers {

class Registry {
 public:
  struct Entry {
    const peer_backend *backend;
    std::string origin; // "built in" or the plug-in's path
  };

  void add(const peer_backend *b, const std::string &origin);
  // Loads a plug-in (never unloaded: the CUDA libraries it pulls in must
  // stay). False with the reason if it cannot be loaded or has another ABI.
  bool load(const std::string &path, std::string *err);
  const Entry *find(const std::string &name) const;
  const std::vector<Entry> &all() const { return entries_; }

 private:
  std::vector<Entry> entries_;
};

}  // namespace peers

#endif  // SA_BENCH_PEERS_REGISTRY_H
