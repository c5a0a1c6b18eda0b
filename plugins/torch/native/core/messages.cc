// Sizes and the out-of-memory message (messages.h).
#include "plugins/torch/native/core/messages.h"

#include <cstdio>

namespace sa_native {

std::string format_size(uint64_t bytes) {
  char buf[64];
  if (bytes <= 1024)
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  else if (bytes <= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.2f KiB", static_cast<double>(bytes) / 1024.0);
  else if (bytes <= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / 1048576.0);
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / 1073741824.0);
  return buf;
}

std::string oom_message(const OomFacts &f) {
  std::string m = "CUDA out of memory. Tried to allocate " + format_size(f.requested) + ". GPU " +
                  std::to_string(f.device) + " has a total capacity of " +
                  format_size(f.device_total) + " of which " + format_size(f.device_free) +
                  " is free. ";
  if (f.capped) m += format_size(f.allowed) + " allowed; ";
  size_t in_use = f.allocated + f.allocated_pools;
  m += "Of the allocated memory " + format_size(in_use) + " is allocated by PyTorch, ";
  if (f.allocated_pools != 0)
    m += "with " + format_size(f.allocated_pools) +
         " allocated in private pools (e.g., CUDA Graphs), ";
  m += "and " + format_size(f.reserved > in_use ? f.reserved - in_use : 0) +
       " is reserved by PyTorch but unallocated. ";
  char stream[32];
  std::snprintf(stream, sizeof stream, "%p", f.stream);
  m += "streamarena: " + std::string(f.pool) + " refused " + std::to_string(f.requested) +
       " bytes on stream " + stream + " (" + sa_status_string(f.status) + ") after " +
       "giving cached memory back; the device's arenas hold " + format_size(f.reserved) +
       " reserved, of which " + format_size(f.cached) +
       " cached; the largest request the pool's arena could serve now is " +
       format_size(f.largest_request) +
       ". oom_report=1 in STREAMARENA_CONF writes the arena's report to stderr "
       "(docs/TORCH.md).";
  return m;
}

}  // namespace sa_native
