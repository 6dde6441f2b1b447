#include "bench/codec/safetensors.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace strata::codec_bench {
namespace {

// The value text that follows `"key":` inside `obj` (a JSON object's text), up to the matching
// close of a [..] / {..} / "..", or the next , or }.
std::string FieldText(const std::string& obj, const std::string& key) {
  const std::string pat = absl::StrCat("\"", key, "\"");
  size_t k = obj.find(pat);
  if (k == std::string::npos) return {};
  k = obj.find(':', k + pat.size());
  if (k == std::string::npos) return {};
  ++k;
  while (k < obj.size() && obj[k] == ' ') ++k;
  if (k >= obj.size()) return {};
  char open = obj[k], close = open == '[' ? ']' : open == '{' ? '}' : open == '"' ? '"' : 0;
  if (close) {
    size_t e = obj.find(close, k + 1);
    return e == std::string::npos ? std::string() : obj.substr(k, e - k + 1);
  }
  size_t e = obj.find_first_of(",}", k);
  return obj.substr(k, e - k);
}

std::vector<uint64_t> Numbers(const std::string& list) {
  std::vector<uint64_t> out;
  uint64_t v = 0;
  bool in = false;
  for (char c : list) {
    if (c >= '0' && c <= '9') {
      v = v * 10 + static_cast<uint64_t>(c - '0');
      in = true;
    } else if (in) {
      out.push_back(v);
      v = 0;
      in = false;
    }
  }
  if (in) out.push_back(v);
  return out;
}

// The object text of tensor `name` in the header (its "{...}"), by brace matching.
std::string TensorObject(const std::string& header, const std::string& name, std::string* found) {
  size_t pos = 1;  // past the outer '{'
  while (true) {
    size_t q = header.find('"', pos);
    if (q == std::string::npos) return {};
    size_t qe = header.find('"', q + 1);
    if (qe == std::string::npos) return {};
    std::string key = header.substr(q + 1, qe - q - 1);
    size_t b = header.find('{', qe);
    if (b == std::string::npos) return {};
    int depth = 0;
    size_t e = b;
    for (; e < header.size(); ++e) {
      if (header[e] == '{') ++depth;
      if (header[e] == '}' && --depth == 0) break;
    }
    if (e >= header.size()) return {};
    if (key != "__metadata__" && (name.empty() || key == name)) {
      *found = key;
      return header.substr(b, e - b + 1);
    }
    pos = e + 1;
  }
}

}  // namespace

absl::StatusOr<NpyArray> ReadSafetensors(const std::string& path, const std::string& name) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  uint8_t len_bytes[8];
  if (!in.read(reinterpret_cast<char*>(len_bytes), 8))
    return absl::DataLossError(absl::StrCat(path, ": shorter than a safetensors header"));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > (uint64_t{100} << 20))
    return absl::DataLossError(absl::StrCat(path, ": header of ", header_len, " bytes"));
  std::string header(header_len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_len)))
    return absl::DataLossError(absl::StrCat(path, ": truncated header"));
  std::string key;
  std::string obj = TensorObject(header, name, &key);
  if (obj.empty())
    return absl::NotFoundError(
        absl::StrCat(path, ": no tensor ", name.empty() ? "at all" : "named '" + name + "'"));
  std::string dtype = FieldText(obj, "dtype");
  NpyArray a;
  a.shape = Numbers(FieldText(obj, "shape"));
  std::vector<uint64_t> range = Numbers(FieldText(obj, "data_offsets"));
  if (range.size() != 2 || range[1] < range[0])
    return absl::DataLossError(absl::StrCat(path, ": tensor '", key, "' has no data_offsets"));
  uint64_t elems = 1;
  for (uint64_t d : a.shape) elems *= d;
  const size_t eb = dtype == "\"F32\"" ? 4 : (dtype == "\"F16\"" || dtype == "\"BF16\"") ? 2 : 0;
  if (eb == 0)
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensor '", key, "' is ", dtype, "; F16, BF16 or F32 needed"));
  if (range[1] - range[0] != elems * eb)
    return absl::DataLossError(absl::StrCat(path, ": tensor '", key, "' byte range ",
                                            range[1] - range[0], " does not match its shape"));
  std::vector<uint8_t> raw(range[1] - range[0]);
  in.seekg(static_cast<std::streamoff>(8 + header_len + range[0]));
  if (!in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size())))
    return absl::DataLossError(absl::StrCat(path, ": tensor '", key, "' is truncated"));
  if (dtype == "\"BF16\"") {  // bf16 is the high half of a float32
    a.descr = "<f4";
    a.data.resize(elems * 4);
    for (uint64_t i = 0; i < elems; ++i) {
      a.data[4 * i + 0] = 0;
      a.data[4 * i + 1] = 0;
      a.data[4 * i + 2] = raw[2 * i];
      a.data[4 * i + 3] = raw[2 * i + 1];
    }
  } else {
    a.descr = eb == 2 ? "<f2" : "<f4";
    a.data = std::move(raw);
  }
  return a;
}

absl::Status WriteSafetensors(const std::string& path, const std::string& name, const NpyArray& a) {
  std::string shape;
  for (size_t i = 0; i < a.shape.size(); ++i) shape += absl::StrCat(i ? "," : "", a.shape[i]);
  std::string header =
      absl::StrCat("{\"__metadata__\":{\"producer\":\"codec_eval\"},\"", name, "\":{\"dtype\":\"",
                   a.descr == "<f2" ? "F16" : "F32", "\",\"shape\":[", shape,
                   "],\"data_offsets\":[0,", a.data.size(), "]}}");
  while (header.size() % 8 != 0) header.push_back(' ');  // the format pads the header to 8
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{header.size()} >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(a.data.data()),
            static_cast<std::streamsize>(a.data.size()));
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace strata::codec_bench
