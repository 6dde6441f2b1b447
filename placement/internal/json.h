// A small JSON reader and string quoting, enough for etcd's gRPC-gateway answers and the node
// record. Numbers keep their text, because the gateway sends 64-bit integers as strings and
// capacities do not fit a double exactly.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::placement::internal {

class Json {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

  static absl::StatusOr<Json> Parse(std::string_view text);

  Type type() const { return type_; }
  bool is_object() const { return type_ == Type::kObject; }
  // Member of an object, or nullptr (also when this is not an object).
  const Json* Get(std::string_view key) const;
  const std::vector<Json>& items() const { return items_; }  // array elements
  const std::vector<std::pair<std::string, Json>>& members() const { return members_; }
  // A string's text, or a number's text; empty otherwise.
  const std::string& text() const { return text_; }
  bool boolean() const { return type_ == Type::kBool && text_ == "true"; }
  // An integer given as a number or as a decimal string (the gateway's int64 encoding).
  std::optional<int64_t> AsInt() const;
  std::optional<uint64_t> AsUint() const;

  // Convenience: member `key` as a string / integer, with a default.
  std::string StringOr(std::string_view key, std::string def = "") const;
  int64_t IntOr(std::string_view key, int64_t def = 0) const;

 private:
  friend class JsonParser;
  Type type_ = Type::kNull;
  std::string text_;
  std::vector<Json> items_;
  std::vector<std::pair<std::string, Json>> members_;
};

// `s` as a JSON string literal, quotes included.
std::string JsonQuote(std::string_view s);

}  // namespace strata::placement::internal
