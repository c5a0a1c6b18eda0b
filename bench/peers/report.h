// The peer benchmark's output: one JSON object per line (a "meta" line per
// run, a "result", "skip" or "error" line per measurement) into a file that
// bench/peers/plot.py reads, a human line per result as it comes, and a
// short table of everything at the end.
#ifndef SA_BENCH_PEERS_REPORT_H
#define SA_BENCH_PEERS_REPORT_H

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace peers {

// One JSON object, built a field at a time.
class Json {
 public:
  Json &str(const char *key, const std::string &v);
  Json &num(const char *key, double v);
  Json &count(const char *key, uint64_t v);
  Json &flag(const char *key, bool v);
  std::string text() const { return "{" + body_ + "}"; }

 private:
  void key(const char *k);
  std::string body_;
};

class Report {
 public:
  ~Report();
  // path "": no file.
  bool open(const std::string &path, std::string *err);
  // A JSON line as it is.
  void line(const Json &j);
  // A result: its JSON line, row (a line of the final table, under
  // workload's header) printed now too.
  void result(const std::string &workload, const Json &j, const std::string &row);
  // A measurement that did not run (why) or failed (error).
  void skip(const std::string &backend, const std::string &workload, const std::string &why);
  void error(const std::string &backend, const std::string &workload, const std::string &what);
  unsigned errors() const { return errors_; }
  void print_table() const;

 private:
  std::FILE *file_ = nullptr;
  unsigned errors_ = 0;
  struct Row {
    std::string workload, text;
  };
  std::vector<Row> rows_;
};

}  // namespace peers

#endif  // SA_BENCH_PEERS_REPORT_H
