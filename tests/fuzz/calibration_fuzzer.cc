// libFuzzer target for calibrated coding (codec modes pca and xl): the calibration parser (either
// artefact) and the sections of a blob decoded with that calibration. Input: u8 flags, u32 n, n
// bytes of serialized calibration, then a blob. Flag 1 rewrites the calibration's CRC32C trailer
// (so mutations reach the parser's checks behind it), flag 2 checks the blob's CRC (unset,
// mutations reach the section parsers and the rANS decoder). The blob is made to name the
// calibration's id (a mutated calibration has another), so it reaches the calibration's decoder.
// Every input must end in a Status or a decode; a calibration that parses must serialize back to
// the same bytes.
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "codec/blob.h"
#include "codec/calibration.h"
#include "codec/codec.h"
#include "common/crc32c.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::codec;
  if (size < 5) return 0;
  const uint8_t flags = data[0];
  uint32_t n;
  std::memcpy(&n, data + 1, 4);
  if (n > size - 5) return 0;
  std::vector<uint8_t> cal(data + 5, data + 5 + n);
  std::span<const uint8_t> blob(data + 5 + n, size - 5 - n);
  if ((flags & 1) && cal.size() >= 4) {
    const uint32_t crc = strata::Crc32c(cal.data(), cal.size() - 4);
    std::memcpy(cal.data() + cal.size() - 4, &crc, 4);
  }
  auto parsed = Calibration::Parse(cal);
  if (!parsed.ok()) return 0;
  if (parsed->Serialize() != cal) __builtin_trap();
  CalibrationSet set;
  const uint64_t id = set.Add(std::make_shared<const Calibration>(*std::move(parsed)));
  std::vector<uint8_t> named(blob.begin(), blob.end());
  if (named.size() >= kHeaderBytes + kTrailerBytes) {
    std::memcpy(named.data() + 56, &id, 8);
    const uint32_t crc = strata::Crc32c(named.data(), named.size() - kTrailerBytes);
    std::memcpy(named.data() + named.size() - kTrailerBytes, &crc, 4);
    blob = named;
  }
  ParseOptions po;
  po.verify_crc = flags & 2;
  auto view = ParseBlob(blob, po);
  if (!view.ok()) return 0;
  const uint64_t bytes = view->header.layout.BlockBytes();
  if (bytes > (uint64_t{16} << 20)) return 0;  // the fuzzer's memory limit, not a codec limit
  static Decoder decoder;
  decoder.set_calibrations(&set);
  std::vector<uint8_t> out(bytes);
  DecodeOptions opts;
  opts.verify_crc = flags & 2;
  (void)decoder.Decode(blob, out, opts);
  decoder.set_calibrations(nullptr);
  return 0;
}
