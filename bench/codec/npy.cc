#include "bench/codec/npy.h"

#include <cstring>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace strata::codec_bench {
namespace {

// Finds 'key': <value> in the header dict; returns the value text up to the next top-level ','.
absl::StatusOr<std::string> DictValue(const std::string& h, const std::string& key) {
  const std::string k = absl::StrCat("'", key, "'");
  size_t at = h.find(k);
  if (at == std::string::npos) return absl::InvalidArgumentError(absl::StrCat("npy: no ", key));
  at = h.find(':', at);
  if (at == std::string::npos) return absl::InvalidArgumentError("npy: malformed header");
  ++at;
  int depth = 0;
  size_t end = at;
  for (; end < h.size(); ++end) {
    const char c = h[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if ((c == ',' && depth == 0) || c == '}') break;
  }
  return std::string(absl::StripAsciiWhitespace(h.substr(at, end - at)));
}

}  // namespace

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("npy: cannot open ", path));
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a .npy file"));
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    uint16_t h16;
    if (!f.read(reinterpret_cast<char*>(&h16), 2)) return absl::InvalidArgumentError("npy: short");
    hlen = h16;
  } else if (magic[6] == 2 || magic[6] == 3) {
    if (!f.read(reinterpret_cast<char*>(&hlen), 4)) return absl::InvalidArgumentError("npy: short");
  } else {
    return absl::InvalidArgumentError("npy: unknown format version");
  }
  if (hlen > (1u << 20)) return absl::InvalidArgumentError("npy: header too large");
  std::string header(hlen, '\0');
  if (!f.read(header.data(), hlen)) return absl::InvalidArgumentError("npy: short header");
  NpyArray a;
  auto descr = DictValue(header, "descr");
  if (!descr.ok()) return descr.status();
  a.descr = std::string(absl::StripPrefix(absl::StripSuffix(*descr, "'"), "'"));
  if (a.descr != "<f2" && a.descr != "<f4")
    return absl::InvalidArgumentError(
        absl::StrCat("npy: dtype ", a.descr, " (supported: <f2 float16, <f4 float32)"));
  auto fortran = DictValue(header, "fortran_order");
  if (!fortran.ok()) return fortran.status();
  if (*fortran != "False") return absl::InvalidArgumentError("npy: Fortran order unsupported");
  auto shape = DictValue(header, "shape");
  if (!shape.ok()) return shape.status();
  std::string s(absl::StripSuffix(absl::StripPrefix(*shape, "("), ")"));
  uint64_t count = 1;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    uint64_t d;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &d))
      return absl::InvalidArgumentError("npy: bad shape");
    a.shape.push_back(d);
    count *= d;
  }
  const size_t eb = a.descr == "<f2" ? 2 : 4;
  if (count > (uint64_t{1} << 34) / eb) return absl::InvalidArgumentError("npy: array too large");
  a.data.resize(count * eb);
  if (!f.read(reinterpret_cast<char*>(a.data.data()), static_cast<std::streamsize>(a.data.size())))
    return absl::InvalidArgumentError(absl::StrCat(path, ": data shorter than the shape says"));
  return a;
}

absl::Status WriteNpy(const std::string& path, const NpyArray& a) {
  std::string shape = "(";
  for (uint64_t d : a.shape) absl::StrAppend(&shape, d, ",");
  shape += ")";
  std::string header =
      absl::StrCat("{'descr': '", a.descr, "', 'fortran_order': False, 'shape': ", shape, ", }");
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) return absl::UnavailableError(absl::StrCat("npy: cannot write ", path));
  const uint16_t hlen = static_cast<uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(reinterpret_cast<const char*>(&hlen), 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(a.data.data()),
          static_cast<std::streamsize>(a.data.size()));
  if (!f) return absl::UnavailableError(absl::StrCat("npy: write failed: ", path));
  return absl::OkStatus();
}

}  // namespace strata::codec_bench
