// The peer benchmark's output: see report.h.
#include "bench/peers/report.h"

#include <cerrno>
#include <cmath>
#include <cstring>

namespace peers {

namespace {

std::string quoted(const std::string &s) {
  std::string q = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      q += '\\';
      q += static_cast<char>(c);
    } else if (c < 0x20) {
      char u[8];
      std::snprintf(u, sizeof u, "\\u%04x", c);
      q += u;
    } else {
      q += static_cast<char>(c);
    }
  }
  return q + "\"";
}

// The final table: one header per workload, in this order.
struct Header {
  const char *workload, *text;
};
const Header headers[] = {
    {"pairs", "alloc+free pairs, one thread, one stream\n"
              "backend              case         ns/pair  [min, max]            Mpairs/s"},
    {"threads", "alloc+free pairs, T threads each on its own stream\n"
                "backend              case       T   ns/pair(thread)      Mpairs/s  scaling"},
    {"random", "RMM's random allocations (live capped), one stream\n"
               "backend              case          run   allocs  failed   us/alloc  s       "
               "truncated"},
    {"prodcons", "producer/consumer: allocated on one thread and stream, freed on another\n"
                 "backend              case         ns/pair     Mpairs/s"},
    {"trace", "trace replay, a fresh allocator per trace\n"
              "backend              trace                      ops     us/op  live MiB  "
              "reserved MiB  ratio  OOMs"},
};

}  // namespace

void Json::key(const char *k) {
  if (!body_.empty()) body_ += ",";
  body_ += quoted(k) + ":";
}

Json &Json::str(const char *k, const std::string &v) {
  key(k);
  body_ += quoted(v);
  return *this;
}

Json &Json::num(const char *k, double v) {
  key(k);
  if (!std::isfinite(v)) {
    body_ += "null";
    return *this;
  }
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  body_ += b;
  return *this;
}

Json &Json::count(const char *k, uint64_t v) {
  key(k);
  body_ += std::to_string(v);
  return *this;
}

Json &Json::flag(const char *k, bool v) {
  key(k);
  body_ += v ? "true" : "false";
  return *this;
}

Report::~Report() {
  if (file_ != nullptr) std::fclose(file_);
}

bool Report::open(const std::string &path, std::string *err) {
  if (path.empty()) return true;
  file_ = std::fopen(path.c_str(), "a");
  if (file_ == nullptr) *err = path + ": " + std::strerror(errno);
  return file_ != nullptr;
}

void Report::line(const Json &j) {
  if (file_ == nullptr) return;
  std::fprintf(file_, "%s\n", j.text().c_str());
  std::fflush(file_);
}

void Report::result(const std::string &workload, const Json &j, const std::string &row) {
  line(Json(j).str("type", "result"));
  rows_.push_back(Row{workload, row});
  std::printf("%-9s %s\n", workload.c_str(), row.c_str());
  std::fflush(stdout);
}

void Report::skip(const std::string &backend, const std::string &workload,
                  const std::string &why) {
  line(Json().str("type", "skip").str("backend", backend).str("workload", workload).str("why", why));
  std::printf("%-9s %-20s skipped: %s\n", workload.c_str(), backend.c_str(), why.c_str());
  std::fflush(stdout);
}

void Report::error(const std::string &backend, const std::string &workload,
                   const std::string &what) {
  errors_++;
  line(Json().str("type", "error").str("backend", backend).str("workload", workload).str("error",
                                                                                        what));
  std::fprintf(stderr, "peer_bench: %s %s: FAILED: %s\n", backend.c_str(), workload.c_str(),
               what.c_str());
  rows_.push_back(Row{workload, backend + " FAILED: " + what});
}

void Report::print_table() const {
  for (const Header &h : headers) {
    bool any = false;
    for (const Row &r : rows_) {
      if (r.workload != h.workload) continue;
      if (!any) std::printf("\n%s\n", h.text);
      any = true;
      std::printf("%s\n", r.text.c_str());
    }
  }
  std::fflush(stdout);
}

}  // namespace peers
