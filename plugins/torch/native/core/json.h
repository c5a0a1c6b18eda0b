// A small JSON reader for what sa_snapshot_write writes: objects, arrays,
// strings, numbers, true, false and null. The snapshot is a diagnostic whose
// fields may change, so a missing key or a value of another type reads as
// a default rather than failing; only text that is not JSON throws.
#ifndef SA_NATIVE_CORE_JSON_H
#define SA_NATIVE_CORE_JSON_H

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sa_native {

class Json {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  // Throws std::runtime_error naming the offset of the first thing that is
  // not JSON (or of text after the value).
  static Json parse(std::string_view text);

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::kNull; }

  // The member named key of an object, or a null value.
  const Json &operator[](std::string_view key) const;
  // The elements of an array (none for anything else).
  const std::vector<Json> &items() const { return items_; }

  // A number as an unsigned integer; also a string "0x..." (an address as
  // the snapshot writes it) or "(nil)" (a NULL pointer printed with %p).
  // fallback for anything else.
  uint64_t u64(uint64_t fallback = 0) const;
  double number(double fallback = 0.0) const;
  const std::string &str() const { return text_; }  // "" unless a string
  bool boolean(bool fallback = false) const;

 private:
  class Parser;
  Kind kind_ = Kind::kNull;
  bool bool_ = false;
  std::string text_;  // a string's value, or a number as written
  std::vector<Json> items_;
  std::vector<std::pair<std::string, Json>> members_;
};

}  // namespace sa_native

#endif  // SA_NATIVE_CORE_JSON_H
