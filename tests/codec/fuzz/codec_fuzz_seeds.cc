// Writes one valid blob per codec mode (small layouts) into a directory: the fuzzer's seeds.
// Each file starts with the fuzzer's selector byte (1: verify CRC, 0: skip it).
// With a second directory, also the seeds of tests/fuzz/calibration_fuzzer (a calibration with
// and one without RoPE undone, each with pca blobs coded with it; an xl one with xl blobs).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>
#include <string>
#include <string_view>

#include "codec/calibration.h"
#include "codec/codec.h"
#include "codec/internal/sections.h"
#include "codec/synthetic_kv.h"
#include "tests/codec/fuzz/pca_fuzz_calibration.h"

namespace {

using namespace strata;

// calibration_fuzzer's inputs for one calibration (`bytes`, in `set`, named by `p`): blocks 0
// and 5 coded with it, each with and without the blob's CRC checked.
int WriteCalibrationSeed(const std::string& dir, const KvLayout& l,
                         const std::vector<uint8_t>& bytes, const codec::CalibrationSet& set,
                         codec::CodecParams p, const std::vector<std::span<const uint8_t>>& samples,
                         int* n) {
  codec::Encoder enc;
  enc.set_calibrations(&set);
  for (uint32_t b : {0u, 5u}) {
    p.first_position = b * l.tokens_per_block;
    std::vector<uint8_t> blob;
    if (auto s = enc.Encode(l, p, samples[b], &blob); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 1;
    }
    for (char flags : {'\0', '\2'}) {
      std::ofstream f(dir + "/seed" + std::to_string((*n)++), std::ios::binary);
      const uint32_t len = static_cast<uint32_t>(bytes.size());
      char len_bytes[4];
      std::memcpy(len_bytes, &len, 4);
      f.write(&flags, 1);
      f.write(len_bytes, 4);
      f.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      f.write(reinterpret_cast<const char*>(blob.data()),
              static_cast<std::streamsize>(blob.size()));
    }
  }
  return 0;
}

// calibration_fuzzer's input: flags, u32 length, the calibration, the blob.
int WriteCalibrationSeeds(const std::string& dir) {
  KvLayout l;
  l.num_layers = 2;
  l.num_kv_heads = 2;
  l.head_dim = 16;
  l.tokens_per_block = 16;
  l.dtype = DType::kFloat16;
  const uint32_t kBlocks = 8;
  auto data = codec::GenerateSyntheticKv(l, kBlocks);
  std::vector<std::span<const uint8_t>> samples;
  for (uint32_t i = 0; i < kBlocks; ++i)
    samples.push_back(std::span<const uint8_t>(data).subspan(i * l.BlockBytes(), l.BlockBytes()));
  int n = 0;
  for (double theta : {0.0, 10000.0}) {
    codec::CalibrateOptions o;
    o.bits_per_value = 2;
    o.rope_theta = theta;
    auto cal = codec::Calibrate(l, samples, o);
    if (!cal.ok()) {
      std::fprintf(stderr, "%s\n", std::string(cal.status().message()).c_str());
      return 1;
    }
    const std::vector<uint8_t> bytes = cal->Serialize();
    codec::CalibrationSet set;
    codec::CodecParams p;
    p.mode = codec::Mode::kPca;
    p.calibration_id = set.Add(std::make_shared<const codec::Calibration>(*std::move(cal)));
    if (WriteCalibrationSeed(dir, l, bytes, set, p, samples, &n) != 0) return 1;
  }
  codec::CrossLayerOptions o;  // an xl calibration and its blobs, one with a step code
  o.step = 0.5;
  o.rope_theta = 10000;
  auto xl = codec::CalibrateCrossLayer(l, samples, o);
  if (!xl.ok()) {
    std::fprintf(stderr, "%s\n", std::string(xl.status().message()).c_str());
    return 1;
  }
  const std::vector<uint8_t> bytes = xl->Serialize();
  codec::CalibrationSet set;
  codec::CodecParams p;
  p.mode = codec::Mode::kCrossLayer;
  p.calibration_id = set.Add(
      std::make_shared<const codec::Calibration>(codec::Calibration::OfCrossLayer(
          std::make_shared<const codec::CrossLayerCalibration>(*std::move(xl)))));
  if (WriteCalibrationSeed(dir, l, bytes, set, p, samples, &n) != 0) return 1;
  p.rate_bits = 1.5;
  return WriteCalibrationSeed(dir, l, bytes, set, p, samples, &n);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: codec_fuzz_seeds DIR [CALIBRATION_DIR]\n");
    return 1;
  }
  if (argc == 3 && WriteCalibrationSeeds(argv[2]) != 0) return 1;
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
  // pca and xl blobs of the fuzz target's calibrations (fp16 and bf16 share them); an xl blob
  // with a step code too.
  const auto cal = codec::fuzz::PcaFuzzCalibration(l);
  const auto xl = codec::fuzz::XlFuzzCalibration(l);
  if (!cal || !xl) return 1;
  codec::CalibrationSet set;
  codec::CodecParams pca, xl_plain, xl_capped;
  pca.mode = codec::Mode::kPca;
  pca.calibration_id = set.Add(cal);
  xl_plain.mode = codec::Mode::kCrossLayer;
  xl_plain.calibration_id = set.Add(xl);
  xl_capped = xl_plain;
  xl_capped.rate_bits = 2;
  codec::Encoder enc;
  enc.set_calibrations(&set);
  for (codec::CodecParams* p : {&pca, &xl_plain, &xl_capped}) {
    p->first_position = 32;
    for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
      l.dtype = dt;
      std::vector<uint8_t> blob;
      if (!enc.Encode(l, *p, codec::GenerateSyntheticKv(l, 1), &blob).ok()) return 1;
      write(blob);
    }
  }
  // xl blocks of 32 tokens: the products run on the bf16 kernels (AMX, AVX512-BF16 or FMAs).
  l.tokens_per_block = 32;
  for (codec::CodecParams* p : {&xl_plain, &xl_capped}) {
    std::vector<uint8_t> blob;
    if (!enc.Encode(l, *p, codec::GenerateSyntheticKv(l, 1), &blob).ok()) return 1;
    write(blob);
  }
  l.tokens_per_block = 16;
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
