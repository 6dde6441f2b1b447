#include "placement/internal/json.h"

#include <cctype>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace strata::placement::internal {

class JsonParser {
 public:
  explicit JsonParser(std::string_view s) : s_(s) {}

  absl::StatusOr<Json> Document() {
    Json v;
    if (!Value(&v, 0)) return Error();
    Space();
    if (pos_ != s_.size()) {
      why_ = "trailing characters";
      return Error();
    }
    return v;
  }

 private:
  absl::Status Error() const {
    return absl::InvalidArgumentError(
        absl::StrCat("bad JSON at offset ", pos_, ": ", why_.empty() ? "syntax" : why_));
  }
  void Space() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  bool Literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  static void AppendUtf8(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  bool Hex4(uint32_t* v) {
    if (pos_ + 4 > s_.size()) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      *v <<= 4;
      if (c >= '0' && c <= '9')
        *v |= c - '0';
      else if (c >= 'a' && c <= 'f')
        *v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        *v |= c - 'A' + 10;
      else
        return false;
    }
    return true;
  }
  bool String(std::string* out) {
    if (pos_ >= s_.size() || s_[pos_] != '"') return false;
    ++pos_;
    while (pos_ < s_.size()) {
      char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) {
        why_ = "control character in string";
        return false;
      }
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) return false;
      char e = s_[pos_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp;
          if (!Hex4(&cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(pos_, 2) == "\\u") {
            pos_ += 2;
            uint32_t lo;
            if (!Hex4(&lo) || lo < 0xDC00 || lo >= 0xE000) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          AppendUtf8(out, cp);
          break;
        }
        default: why_ = "bad escape"; return false;
      }
    }
    why_ = "unterminated string";
    return false;
  }
  bool Value(Json* v, int depth) {
    if (depth > 64) {
      why_ = "nested too deep";
      return false;
    }
    Space();
    if (pos_ >= s_.size()) {
      why_ = "unexpected end";
      return false;
    }
    char c = s_[pos_];
    if (c == '{') {
      ++pos_;
      v->type_ = Json::Type::kObject;
      Space();
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return true;
      }
      for (;;) {
        Space();
        std::string key;
        if (!String(&key)) return false;
        Space();
        if (pos_ >= s_.size() || s_[pos_] != ':') return false;
        ++pos_;
        Json member;
        if (!Value(&member, depth + 1)) return false;
        v->members_.emplace_back(std::move(key), std::move(member));
        Space();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == '}') {
          ++pos_;
          return true;
        }
        return false;
      }
    }
    if (c == '[') {
      ++pos_;
      v->type_ = Json::Type::kArray;
      Space();
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return true;
      }
      for (;;) {
        Json item;
        if (!Value(&item, depth + 1)) return false;
        v->items_.push_back(std::move(item));
        Space();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == ']') {
          ++pos_;
          return true;
        }
        return false;
      }
    }
    if (c == '"') {
      v->type_ = Json::Type::kString;
      return String(&v->text_);
    }
    if (Literal("true")) {
      v->type_ = Json::Type::kBool;
      v->text_ = "true";
      return true;
    }
    if (Literal("false")) {
      v->type_ = Json::Type::kBool;
      v->text_ = "false";
      return true;
    }
    if (Literal("null")) {
      v->type_ = Json::Type::kNull;
      return true;
    }
    size_t start = pos_;
    while (pos_ < s_.size() &&
           (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '-' ||
            s_[pos_] == '+' || s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E'))
      ++pos_;
    if (pos_ == start) {
      why_ = "unexpected character";
      return false;
    }
    v->type_ = Json::Type::kNumber;
    v->text_ = std::string(s_.substr(start, pos_ - start));
    return true;
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::string why_;
};

absl::StatusOr<Json> Json::Parse(std::string_view text) { return JsonParser(text).Document(); }

const Json* Json::Get(std::string_view key) const {
  for (const auto& [k, v] : members_)
    if (k == key) return &v;
  return nullptr;
}

std::optional<int64_t> Json::AsInt() const {
  int64_t v;
  if ((type_ == Type::kNumber || type_ == Type::kString) && absl::SimpleAtoi(text_, &v)) return v;
  return std::nullopt;
}

std::optional<uint64_t> Json::AsUint() const {
  uint64_t v;
  if ((type_ == Type::kNumber || type_ == Type::kString) && absl::SimpleAtoi(text_, &v)) return v;
  return std::nullopt;
}

std::string Json::StringOr(std::string_view key, std::string def) const {
  const Json* v = Get(key);
  return v && v->type_ == Type::kString ? v->text_ : def;
}

int64_t Json::IntOr(std::string_view key, int64_t def) const {
  const Json* v = Get(key);
  if (!v) return def;
  return v->AsInt().value_or(def);
}

std::string JsonQuote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          static constexpr char kHex[] = "0123456789abcdef";
          out += "\\u00";
          out.push_back(kHex[(c >> 4) & 0xF]);
          out.push_back(kHex[c & 0xF]);
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace strata::placement::internal
