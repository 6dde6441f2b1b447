#include "bench/replay/trace_reader.h"

#include <cctype>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/strings.h"

namespace strata::replay {
namespace {

class LineParser {
 public:
  explicit LineParser(std::string_view s) : s_(s) {}

  absl::StatusOr<TraceRequest> Parse() {
    TraceRequest req;
    bool have_ids = false;
    SkipSpace();
    if (!Eat('{')) return Error("expected '{'");
    SkipSpace();
    if (!Eat('}')) {
      while (true) {
        SkipSpace();
        std::string key;
        if (!ParseString(&key)) return Error("expected a string key");
        SkipSpace();
        if (!Eat(':')) return Error("expected ':'");
        SkipSpace();
        if (key == "hash_ids") {
          if (have_ids) return Error("duplicate \"hash_ids\"");
          if (!ParseIdArray(&req.hash_ids)) return Error("\"hash_ids\" is not an array of ids");
          have_ids = true;
        } else if (!SkipValue(0)) {
          return Error(absl::StrCat("bad value for \"", key, "\""));
        }
        SkipSpace();
        if (Eat(',')) continue;
        if (Eat('}')) break;
        return Error("expected ',' or '}'");
      }
    }
    SkipSpace();
    if (pos_ != s_.size()) return Error("trailing characters");
    if (!have_ids) return Error("no \"hash_ids\"");
    return req;
  }

 private:
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(AsAbsl(what), " at column ", pos_ + 1));
  }
  bool AtEnd() const { return pos_ >= s_.size(); }
  char Peek() const { return AtEnd() ? '\0' : s_[pos_]; }
  bool Eat(char c) {
    if (Peek() != c || AtEnd()) return false;
    ++pos_;
    return true;
  }
  void SkipSpace() {
    while (!AtEnd() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\r' || s_[pos_] == '\n')) {
      ++pos_;
    }
  }
  bool ParseString(std::string* out) {
    if (!Eat('"')) return false;
    while (!AtEnd()) {
      char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c == '\\') {
        if (AtEnd()) return false;
        char e = s_[pos_++];
        if (e == 'u') {
          for (int i = 0; i < 4; ++i) {
            if (AtEnd() || !std::isxdigit(static_cast<unsigned char>(s_[pos_]))) return false;
            ++pos_;
          }
          if (out) out->push_back('?');  // keys we care about are ASCII
          continue;
        }
        if (std::string_view("\"\\/bfnrt").find(e) == std::string_view::npos) return false;
        if (out) out->push_back(e);
        continue;
      }
      if (out) out->push_back(c);
    }
    return false;
  }
  bool ParseUnsigned(uint64_t* out) {
    if (AtEnd() || !std::isdigit(static_cast<unsigned char>(Peek()))) return false;
    if (Peek() == '0' && pos_ + 1 < s_.size() &&
        std::isdigit(static_cast<unsigned char>(s_[pos_ + 1]))) {
      return false;  // leading zero
    }
    uint64_t v = 0;
    while (!AtEnd() && std::isdigit(static_cast<unsigned char>(Peek()))) {
      const uint64_t d = static_cast<uint64_t>(s_[pos_++] - '0');
      if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
      v = v * 10 + d;
    }
    // An id must be an integer: no fraction or exponent.
    if (Peek() == '.' || Peek() == 'e' || Peek() == 'E') return false;
    *out = v;
    return true;
  }
  bool ParseIdArray(std::vector<uint64_t>* out) {
    if (!Eat('[')) return false;
    SkipSpace();
    if (Eat(']')) return true;
    while (true) {
      SkipSpace();
      uint64_t v;
      if (!ParseUnsigned(&v)) return false;
      out->push_back(v);
      SkipSpace();
      if (Eat(',')) continue;
      return Eat(']');
    }
  }
  bool SkipNumber() {
    const size_t start = pos_;
    Eat('-');
    if (AtEnd() || !std::isdigit(static_cast<unsigned char>(Peek()))) return false;
    while (!AtEnd() && std::isdigit(static_cast<unsigned char>(Peek()))) ++pos_;
    if (Eat('.')) {
      if (AtEnd() || !std::isdigit(static_cast<unsigned char>(Peek()))) return false;
      while (!AtEnd() && std::isdigit(static_cast<unsigned char>(Peek()))) ++pos_;
    }
    if (Peek() == 'e' || Peek() == 'E') {
      ++pos_;
      if (Peek() == '+' || Peek() == '-') ++pos_;
      if (AtEnd() || !std::isdigit(static_cast<unsigned char>(Peek()))) return false;
      while (!AtEnd() && std::isdigit(static_cast<unsigned char>(Peek()))) ++pos_;
    }
    return pos_ > start;
  }
  bool SkipLiteral(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  bool SkipValue(int depth) {
    if (depth > 64) return false;
    SkipSpace();
    const char c = Peek();
    if (c == '"') return ParseString(nullptr);
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++pos_;
      SkipSpace();
      if (Eat(close)) return true;
      while (true) {
        SkipSpace();
        if (c == '{') {
          if (!ParseString(nullptr)) return false;
          SkipSpace();
          if (!Eat(':')) return false;
        }
        if (!SkipValue(depth + 1)) return false;
        SkipSpace();
        if (Eat(',')) continue;
        return Eat(close);
      }
    }
    if (c == 't') return SkipLiteral("true");
    if (c == 'f') return SkipLiteral("false");
    if (c == 'n') return SkipLiteral("null");
    return SkipNumber();
  }

  std::string_view s_;
  size_t pos_ = 0;
};

bool Blank(std::string_view line) {
  for (char c : line) {
    if (c != ' ' && c != '\t' && c != '\r') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<TraceRequest> ParseTraceLine(std::string_view line) {
  return LineParser(line).Parse();
}

absl::StatusOr<std::vector<TraceRequest>> ReadTrace(const std::string& path, size_t max_requests) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open trace ", path));
  std::vector<TraceRequest> out;
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (Blank(line)) continue;
    auto req = ParseTraceLine(line);
    if (!req.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": ", req.status().message()));
    }
    out.push_back(std::move(*req));
    if (max_requests != 0 && out.size() >= max_requests) break;
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("read error in ", path));
  return out;
}

}  // namespace strata::replay
