// libFuzzer target for the blob decoder. Every input must end in a Status or a successful decode;
// ASan/UBSan turn any out-of-bounds access or undefined behaviour into a crash.
//
// The first byte picks whether the CRC is checked (checked blobs test the framing; unchecked
// ones let mutations reach the section parsers and the rANS decoder behind the checksum).
#include <cstdint>
#include <span>
#include <vector>

#include "codec/blob.h"
#include "codec/codec.h"
#include "tests/codec/fuzz/pca_fuzz_calibration.h"

namespace {

// The decoder holds a pca and an xl calibration (the seeds' geometry), so blobs of both modes
// reach their sections.
const strata::codec::CalibrationSet* PcaSet() {
  static const strata::codec::CalibrationSet* set = [] {
    auto* s = new strata::codec::CalibrationSet;
    strata::KvLayout l;
    l.num_layers = 2;
    l.num_kv_heads = 2;
    l.head_dim = 32;
    l.tokens_per_block = 16;
    if (auto cal = strata::codec::fuzz::PcaFuzzCalibration(l)) s->Add(cal);
    if (auto cal = strata::codec::fuzz::XlFuzzCalibration(l)) s->Add(cal);
    return s;
  }();
  return set;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool verify = data[0] & 1;
  std::span<const uint8_t> blob(data + 1, size - 1);
  strata::codec::ParseOptions po;
  po.verify_crc = verify;
  auto view = strata::codec::ParseBlob(blob, po);
  if (!view.ok()) return 0;
  const uint64_t bytes = view->header.layout.BlockBytes();
  if (bytes > (uint64_t{64} << 20)) return 0;  // the fuzzer's memory limit, not a codec limit
  static strata::codec::Decoder decoder;
  decoder.set_calibrations(PcaSet());
  std::vector<uint8_t> out(bytes);
  strata::codec::DecodeOptions opts;
  opts.verify_crc = verify;
  (void)decoder.Decode(blob, out, opts);
  (void)strata::codec::InspectBlob(blob);
  return 0;
}
