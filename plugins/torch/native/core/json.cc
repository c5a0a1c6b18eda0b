// The JSON reader (json.h): recursive descent over the text, no copies of
// it beyond the values kept.
#include "plugins/torch/native/core/json.h"

#include <cerrno>
#include <cstdlib>
#include <stdexcept>

namespace sa_native {

class Json::Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  Json document() {
    Json v = value(0);
    space();
    if (at_ != s_.size()) fail("text after the value");
    return v;
  }

 private:
  // Deep enough for any snapshot, shallow enough that hostile input cannot
  // exhaust the stack.
  static constexpr int kMaxDepth = 64;

  [[noreturn]] void fail(const char *what) const {
    throw std::runtime_error("not JSON at offset " + std::to_string(at_) + ": " + what);
  }

  void space() {
    while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\n' || s_[at_] == '\t' ||
                               s_[at_] == '\r'))
      at_++;
  }

  bool take(char c) {
    space();
    if (at_ < s_.size() && s_[at_] == c) {
      at_++;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!take(c)) fail(std::string("expected '").append(1, c).append("'").c_str());
  }

  bool word(std::string_view w) {
    if (s_.substr(at_, w.size()) != w) return false;
    at_ += w.size();
    return true;
  }

  Json value(int depth) {
    if (depth > kMaxDepth) fail("nested too deeply");
    space();
    if (at_ >= s_.size()) fail("unexpected end");
    Json v;
    char c = s_[at_];
    if (c == '{') {
      at_++;
      v.kind_ = Kind::kObject;
      if (take('}')) return v;
      do {
        space();
        std::string key = string();
        expect(':');
        v.members_.emplace_back(std::move(key), value(depth + 1));
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      at_++;
      v.kind_ = Kind::kArray;
      if (take(']')) return v;
      do {
        v.items_.push_back(value(depth + 1));
      } while (take(','));
      expect(']');
    } else if (c == '"') {
      v.kind_ = Kind::kString;
      v.text_ = string();
    } else if (word("true")) {
      v.kind_ = Kind::kBool;
      v.bool_ = true;
    } else if (word("false")) {
      v.kind_ = Kind::kBool;
    } else if (word("null")) {
      v.kind_ = Kind::kNull;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      size_t start = at_;
      while (at_ < s_.size() && (std::string_view("+-.eE0123456789").find(s_[at_]) !=
                                 std::string_view::npos))
        at_++;
      v.kind_ = Kind::kNumber;
      v.text_ = std::string(s_.substr(start, at_ - start));
    } else {
      fail("unexpected character");
    }
    return v;
  }

  // A string at the cursor, escapes decoded; \u escapes outside ASCII
  // become '?' (the snapshot writes none).
  std::string string() {
    if (at_ >= s_.size() || s_[at_] != '"') fail("expected a string");
    at_++;
    std::string out;
    while (at_ < s_.size() && s_[at_] != '"') {
      char c = s_[at_++];
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (at_ >= s_.size()) break;
      char e = s_[at_++];
      switch (e) {
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'u': {
          if (at_ + 4 > s_.size()) fail("short \\u escape");
          unsigned long code = std::strtoul(std::string(s_.substr(at_, 4)).c_str(), nullptr, 16);
          at_ += 4;
          out.push_back(code < 0x80 ? static_cast<char>(code) : '?');
          break;
        }
        default: out.push_back(e); break;
      }
    }
    if (at_ >= s_.size()) fail("unterminated string");
    at_++;
    return out;
  }

  std::string_view s_;
  size_t at_ = 0;
};

Json Json::parse(std::string_view text) { return Parser(text).document(); }

const Json &Json::operator[](std::string_view key) const {
  static const Json null_value;
  for (const auto &m : members_)
    if (m.first == key) return m.second;
  return null_value;
}

uint64_t Json::u64(uint64_t fallback) const {
  if (kind_ == Kind::kString) {
    if (text_ == "(nil)") return 0;
    if (text_.size() > 2 && text_[0] == '0' && (text_[1] == 'x' || text_[1] == 'X')) {
      errno = 0;
      char *end = nullptr;
      unsigned long long v = std::strtoull(text_.c_str() + 2, &end, 16);
      if (errno == 0 && end != nullptr && *end == '\0') return v;
    }
    return fallback;
  }
  if (kind_ != Kind::kNumber || text_.empty() || text_[0] == '-') return fallback;
  errno = 0;
  char *end = nullptr;
  unsigned long long v = std::strtoull(text_.c_str(), &end, 10);
  if (errno != 0 || end == nullptr || *end != '\0') return fallback;
  return v;
}

double Json::number(double fallback) const {
  if (kind_ != Kind::kNumber) return fallback;
  char *end = nullptr;
  double v = std::strtod(text_.c_str(), &end);
  return end != nullptr && *end == '\0' ? v : fallback;
}

bool Json::boolean(bool fallback) const { return kind_ == Kind::kBool ? bool_ : fallback; }

}  // namespace sa_native
