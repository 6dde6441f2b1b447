// codec_speed: quick one-core encode/decode speed of codec modes on the generator's data, with
// memcpy and zstd-3 measured in the same run (interleaved, best of --reps). Prints a hash of the
// blobs (determinism / format-change check), a hash of the decoded blocks (reconstruction check)
// and verifies lossless round trips.
//
//   codec_speed [--modes quant:k4v4,quant:k3v4:ol,...] [--reps 5] [--blocks 4]
//               [--layout LAYERSxHEADSxDIMxTOKENS]   (default 8x8x128x256; SmolLM2-135M:
//               30x3x64x256)
#include <zstd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "codec/codec.h"
#include "codec/synthetic_kv.h"

namespace {
using Clock = std::chrono::steady_clock;
template <typename F>
double Best(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}
uint64_t Fnv(const std::vector<uint8_t>& v, uint64_t h) {
  for (uint8_t b : v) h = (h ^ b) * 1099511628211ull;
  return h;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace strata;
  CLI::App app{"codec_speed"};
  std::string modes_str =
      "quant:k4v4,quant:k3v4:ol,quant:k4v4:had,quant:k8v8,quant:k2v2:ol,lossless";
  int reps = 5;
  uint32_t blocks = 4;
  app.add_option("--modes", modes_str);
  app.add_option("--reps", reps);
  app.add_option("--blocks", blocks);
  std::string layout_str = "8x8x128x256";
  app.add_option("--layout", layout_str, "layers x kv_heads x head_dim x tokens per block");
  bool dec_only = false, enc_only = false;
  app.add_flag("--enc-only", enc_only, "time only encoding (profiling)");
  app.add_flag("--dec-only", dec_only, "time only decoding (profiling)");
  CLI11_PARSE(app, argc, argv);
  KvLayout l;
  {
    std::vector<std::string> f = absl::StrSplit(layout_str, 'x');
    uint32_t v[4];
    if (f.size() != 4 || !absl::SimpleAtoi(f[0], &v[0]) || !absl::SimpleAtoi(f[1], &v[1]) ||
        !absl::SimpleAtoi(f[2], &v[2]) || !absl::SimpleAtoi(f[3], &v[3])) {
      std::fprintf(stderr, "--layout: expected LAYERSxHEADSxDIMxTOKENS, got '%s'\n",
                   layout_str.c_str());
      return 1;
    }
    l.num_layers = v[0];
    l.num_kv_heads = v[1];
    l.head_dim = v[2];
    l.tokens_per_block = v[3];
  }
  l.dtype = DType::kFloat16;
  const std::vector<uint8_t> data = codec::GenerateSyntheticKv(l, blocks);
  const size_t bb = l.BlockBytes();
  std::vector<uint8_t> dst(data.size());
  const double gb = data.size() / 1e9;
  auto memcpy_gbps = [&] {
    return gb / Best(reps, [&] { std::memcpy(dst.data(), data.data(), data.size()); });
  };
  std::vector<uint8_t> zbuf(ZSTD_compressBound(bb));
  ZSTD_CCtx* zc = ZSTD_createCCtx();
  auto zstd_gbps = [&] {
    return gb / Best(reps, [&] {
             for (uint32_t b = 0; b < blocks; ++b)
               ZSTD_compressCCtx(zc, zbuf.data(), zbuf.size(), data.data() + b * bb, bb, 3);
           });
  };
  std::printf("%-22s %8s %7s %7s %7s %7s %18s %18s\n", "mode", "bits/val", "enc", "dec", "memcpy",
              "zstd3e", "blob hash", "output hash");
  for (auto m : absl::StrSplit(modes_str, ',', absl::SkipEmpty())) {
    auto p = codec::ParseCodecSpec(std::string(m));
    if (!p.ok()) {
      std::fprintf(stderr, "%s\n", std::string(p.status().message()).c_str());
      return 1;
    }
    codec::Encoder enc;
    codec::Decoder dec;
    std::vector<std::vector<uint8_t>> blobs(blocks);
    size_t total = 0;
    uint64_t h = 14695981039346656037ull;
    for (uint32_t b = 0; b < blocks; ++b) {
      if (auto s = enc.Encode(l, *p, {data.data() + b * bb, bb}, &blobs[b]); !s.ok()) {
        std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
        return 1;
      }
      total += blobs[b].size();
      h = Fnv(blobs[b], h);
    }
    for (uint32_t b = 0; b < blocks; ++b)
      if (auto s = dec.Decode(blobs[b], {dst.data() + b * bb, bb}); !s.ok()) {
        std::fprintf(stderr, "decode: %s\n", std::string(s.message()).c_str());
        return 1;
      }
    if (p->mode == codec::Mode::kLossless && std::memcmp(dst.data(), data.data(), data.size()))
      std::printf("LOSSLESS MISMATCH\n");
    // Hash of the decoded blocks: equal across coder changes when the reconstruction is.
    const uint64_t out_hash = Fnv(dst, 14695981039346656037ull);
    const double mc = memcpy_gbps();
    const double z = zstd_gbps();
    const double te = dec_only ? 1e30 : Best(reps, [&] {
      for (uint32_t b = 0; b < blocks; ++b)
        (void)enc.Encode(l, *p, {data.data() + b * bb, bb}, &blobs[b]);
    });
    const double td = enc_only ? 1e30 : Best(reps, [&] {
      for (uint32_t b = 0; b < blocks; ++b) (void)dec.Decode(blobs[b], {dst.data() + b * bb, bb});
    });
    std::printf("%-22s %8.3f %7.2f %7.2f %7.2f %7.2f   %016llx   %016llx\n", std::string(m).c_str(),
                8.0 * total / (data.size() / 2), gb / te, gb / td, mc, z,
                static_cast<unsigned long long>(h), static_cast<unsigned long long>(out_hash));
  }
  ZSTD_freeCCtx(zc);
  return 0;
}
