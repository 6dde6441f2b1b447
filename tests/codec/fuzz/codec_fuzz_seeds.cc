// Writes one valid blob per codec mode (small layouts) into a directory: the fuzzer's seeds.
// Each file starts with the fuzzer's selector byte (1: verify CRC, 0: skip it).
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>

#include "codec/codec.h"
#include "codec/internal/sections.h"
#include "codec/synthetic_kv.h"
#include "tests/codec/fuzz/pca_fuzz_calibration.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: codec_fuzz_seeds DIR\n");
    return 1;
  }
  using namespace strata;
  KvLayout l;
  l.num_layers = 2;
  l.num_kv_heads = 2;
  l.head_dim = 32;
  l.tokens_per_block = 16;
  int n = 0;
  auto write = [&](const std::vector<uint8_t>& blob) {
    for (char sel : {'\0', '\1'}) {
      std::ofstream f(std::string(argv[1]) + "/seed" + std::to_string(n++), std::ios::binary);
      f.write(&sel, 1);
      f.write(reinterpret_cast<const char*>(blob.data()), static_cast<std::streamsize>(blob.size()));
    }
  };
  // pca blobs of the fuzz target's calibration (fp16 and bf16 share it).
  const auto cal = codec::fuzz::PcaFuzzCalibration(l);
  if (!cal) return 1;
  codec::CalibrationSet set;
  codec::CodecParams pca;
  pca.mode = codec::Mode::kPca;
  pca.calibration_id = set.Add(cal);
  pca.first_position = 32;
  codec::Encoder enc;
  enc.set_calibrations(&set);
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    l.dtype = dt;
    std::vector<uint8_t> blob;
    if (!enc.Encode(l, pca, codec::GenerateSyntheticKv(l, 1), &blob).ok()) return 1;
    write(blob);
  }
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    l.dtype = dt;
    auto data = codec::GenerateSyntheticKv(l, 1);
    // The last three with the split coder (section coder 5) at a forced r, so the corpus
    // has its sections whatever the encoder would choose on data this small.
    for (const char* spec :
         {"raw", "lossless", "int4-g64", "int3-g16", "quant:k4v4", "quant:k2v3:g16:had",
          "quant:k3v4:ol", "quant:k8v8:nodelta", "quant:k8v8:ol", "quant:k7v8:had", "quant:k8v8"}) {
      const std::string_view sv(spec);
      codec::internal::SetSplitLowBitsForTesting(sv == "quant:k8v8:ol"    ? 3
                                                 : sv == "quant:k7v8:had" ? 2
                                                 : sv == "quant:k8v8"     ? 5
                                                                          : 0);
      auto p = codec::ParseCodecSpec(spec);
      if (!p.ok()) return 1;
      auto blob = codec::Encode(l, *p, data);
      if (!blob.ok()) {
        std::fprintf(stderr, "%s\n", std::string(blob.status().message()).c_str());
        return 1;
      }
      write(*blob);
    }
  }
  return 0;
}
