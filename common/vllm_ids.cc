#include "strata/vllm_ids.h"

#include <variant>

namespace strata {
namespace {

// The values vLLM hashes: bytes, str, non-negative ints, None and tuples of them.
struct Value;
using Tuple = std::vector<Value>;
struct Str {
  std::string_view text;
};
struct Value {
  std::variant<std::monostate, std::string_view /*bytes*/, Str, uint64_t, Tuple> v;
};

// Canonical CBOR (RFC 8949 §4.2.1: every head in its shortest form), as cbor2's canonical=True
// writes these types: a tuple is an array, None is the simple value 22.
class CborWriter {
 public:
  void Write(const Value& value) {
    if (std::holds_alternative<std::monostate>(value.v)) {
      out_.push_back(static_cast<char>(0xf6));
    } else if (auto* b = std::get_if<std::string_view>(&value.v)) {
      Head(2, b->size());
      out_.append(*b);
    } else if (auto* s = std::get_if<Str>(&value.v)) {
      Head(3, s->text.size());
      out_.append(s->text);
    } else if (auto* n = std::get_if<uint64_t>(&value.v)) {
      Head(0, *n);
    } else {
      const Tuple& t = std::get<Tuple>(value.v);
      Head(4, t.size());
      for (const Value& e : t) Write(e);
    }
  }
  const std::string& bytes() const { return out_; }

 private:
  void Head(uint8_t major, uint64_t arg) {
    const uint8_t m = static_cast<uint8_t>(major << 5);
    if (arg < 24) {
      out_.push_back(static_cast<char>(m | arg));
      return;
    }
    const int n = arg <= 0xff ? 1 : arg <= 0xffff ? 2 : arg <= 0xffffffff ? 4 : 8;
    out_.push_back(static_cast<char>(m | (n == 1 ? 24 : n == 2 ? 25 : n == 4 ? 26 : 27)));
    for (int i = n - 1; i >= 0; --i) out_.push_back(static_cast<char>((arg >> (8 * i)) & 0xff));
  }
  std::string out_;
};

// Pickle protocol 5 as CPython's C pickler writes these types: one frame (vLLM's inputs stay far
// below the 64 KiB frame target), MEMOIZE after every bytes, str and non-empty tuple (none
// repeats, so no memo lookups are written), the smallest integer opcode.
class PickleWriter {
 public:
  std::string Dump(const Value& value) {
    body_.clear();
    Write(value);
    body_.push_back('.');  // STOP
    std::string out("\x80\x05", 2);
    if (body_.size() >= 4) {  // FRAME with its little-endian u64 length
      out.push_back(static_cast<char>(0x95));
      Le(out, body_.size(), 8);
    }
    return out + body_;
  }

 private:
  static void Le(std::string& out, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void Memoize() { body_.push_back(static_cast<char>(0x94)); }
  void Write(const Value& value) {
    if (std::holds_alternative<std::monostate>(value.v)) {
      body_.push_back('N');
    } else if (auto* b = std::get_if<std::string_view>(&value.v)) {
      if (b->size() < 256) {
        body_.push_back('C');  // SHORT_BINBYTES
        Le(body_, b->size(), 1);
      } else {
        body_.push_back('B');  // BINBYTES
        Le(body_, b->size(), 4);
      }
      body_.append(*b);
      Memoize();
    } else if (auto* s = std::get_if<Str>(&value.v)) {
      if (s->text.size() < 256) {
        body_.push_back(static_cast<char>(0x8c));  // SHORT_BINUNICODE
        Le(body_, s->text.size(), 1);
      } else {
        body_.push_back('X');  // BINUNICODE
        Le(body_, s->text.size(), 4);
      }
      body_.append(s->text);
      Memoize();
    } else if (auto* n = std::get_if<uint64_t>(&value.v)) {
      Int(*n);
    } else {
      const Tuple& t = std::get<Tuple>(value.v);
      if (t.empty()) {
        body_.push_back(')');  // EMPTY_TUPLE, never memoized
        return;
      }
      if (t.size() > 3) body_.push_back('(');  // MARK
      for (const Value& e : t) Write(e);
      static constexpr char kTupleN[] = {0, '\x85', '\x86', '\x87'};
      body_.push_back(t.size() > 3 ? 't' : kTupleN[t.size()]);
      Memoize();
    }
  }
  void Int(uint64_t n) {
    if (n <= 0xff) {
      body_.push_back('K');  // BININT1
      Le(body_, n, 1);
    } else if (n <= 0xffff) {
      body_.push_back('M');  // BININT2
      Le(body_, n, 2);
    } else if (n <= 0x7fffffff) {
      body_.push_back('J');  // BININT (signed 32-bit)
      Le(body_, n, 4);
    } else {
      // LONG1: little-endian two's complement in the fewest bytes that keep the sign bit clear.
      int bytes = 1;
      while (bytes < 8 && (n >> (8 * bytes - 1)) != 0) ++bytes;
      if (bytes == 8 && (n >> 63) != 0) bytes = 9;
      body_.push_back(static_cast<char>(0x8a));
      Le(body_, static_cast<uint64_t>(bytes), 1);
      Le(body_, n, bytes > 8 ? 8 : bytes);
      if (bytes > 8) body_.push_back('\0');
    }
  }
  std::string body_;
};

Digest HashValue(IdScheme scheme, const Value& value) {
  std::string bytes;
  if (scheme == IdScheme::kVllmCbor) {
    CborWriter w;
    w.Write(value);
    bytes = w.bytes();
  } else {
    bytes = PickleWriter().Dump(value);
  }
  Sha256 h;
  h.Bytes(bytes.data(), bytes.size());
  return h.Finish();
}

}  // namespace

Digest VllmNoneHash(IdScheme scheme, std::string_view hash_seed) {
  return HashValue(scheme, Value{Str{hash_seed}});
}

std::vector<Digest> ComputeVllmBlockIds(uint32_t tokens_per_block,
                                        std::span<const uint32_t> tokens,
                                        const VllmHashInputs& in) {
  std::vector<Digest> ids;
  if (tokens_per_block == 0) return ids;
  const size_t full = tokens.size() / tokens_per_block;
  ids.reserve(full);
  Digest parent = VllmNoneHash(in.scheme, in.hash_seed);
  for (size_t i = 0; i < full; ++i) {
    Tuple block_tokens;
    block_tokens.reserve(tokens_per_block);
    for (uint32_t t : tokens.subspan(i * tokens_per_block, tokens_per_block))
      block_tokens.push_back(Value{uint64_t{t}});
    Tuple extra;
    if (!in.lora_name.empty())
      extra.push_back(Value{Tuple{Value{Str{"lora"}}, Value{Str{in.lora_name}},
                                  Value{Str{in.lora_path}}}});
    if (i == 0 && !in.cache_salt.empty())
      extra.push_back(Value{Tuple{Value{Str{"cache_salt"}}, Value{Str{in.cache_salt}}}});
    Value keys = extra.empty() ? Value{} : Value{std::move(extra)};
    Value hashed{Tuple{Value{parent.AsBytes()}, Value{std::move(block_tokens)}, std::move(keys)}};
    parent = HashValue(in.scheme, hashed);
    ids.push_back(parent);
  }
  return ids;
}

}  // namespace strata
