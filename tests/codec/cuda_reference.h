// Test helpers shared by the CUDA kernel tests (the host walk in cuda_math_test.cc and the GPU
// tests in cuda/): a block encoded by the CPU codec, cut into its sections, with each quant
// section's payload fields (codec/quant.cc) and symbols, so the kernels' outputs can be
// compared with the CPU's byte for byte.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "codec/codec.h"
#include "gtest/gtest.h"
#include "strata/kv_layout.h"
#include "tests/codec/test_layout.h"

namespace strata::codec::cuda_test {

// One section of a CPU blob and where its tensor lies in the block.
struct CpuSection {
  uint32_t layer = 0;
  bool is_key = true;
  uint8_t bits = 0;
  std::vector<uint8_t> payload;
  size_t block_offset = 0;  // bytes into the block (input) and the decoded block (output)
  size_t bytes = 0;         // the tensor's bytes
  // quant sections: the payload's fields and the section's symbols
  uint16_t group = 0;  // as stored (0 on key sections)
  std::vector<uint16_t> mu16, steps16, syms;
  std::vector<uint8_t> a16;
  // keys with outlier channels (`:ol`): the channels, ascending, and their kept elements
  // [T * channels] of the block's dtype
  std::vector<uint16_t> outlier_idx;
  std::vector<uint8_t> outlier_vals;
};

struct CpuBlock {
  std::vector<uint8_t> blob;
  std::vector<uint8_t> decoded;  // CPU Decoder output
  std::vector<CpuSection> sections;
};

// Encodes `block` with the CPU codec, decodes it back, and cuts the blob into sections.
inline CpuBlock EncodeOnCpu(const KvLayout& l, const CodecParams& p,
                            const std::vector<uint8_t>& block) {
  CpuBlock out;
  std::vector<uint16_t> syms;
  EncodeStats stats;
  stats.symbol_sink = &syms;
  Encoder enc;
  absl::Status s = enc.Encode(l, p, block, &out.blob, &stats);
  EXPECT_TRUE(s.ok()) << s;
  if (!s.ok()) return out;
  out.decoded.resize(block.size());
  Decoder dec;
  s = dec.Decode(out.blob, out.decoded);
  EXPECT_TRUE(s.ok()) << s;
  auto info = InspectBlob(out.blob);
  EXPECT_TRUE(info.ok()) << info.status();
  if (!info.ok()) return out;
  const size_t C = size_t{l.num_kv_heads} * l.head_dim, T = l.tokens_per_block;
  const size_t tensor_bytes = T * C * DTypeBytes(l.dtype);
  size_t sym_at = 0;
  for (const SectionEntry& e : info->sections) {
    if (e.type == SectionType::kStream) continue;  // the quant sections' shared rANS stream
    CpuSection cs;
    cs.layer = e.layer;
    cs.is_key = e.tensor == 0;
    cs.bits = e.bits;
    cs.payload.assign(out.blob.begin() + e.offset, out.blob.begin() + e.offset + e.size);
    cs.block_offset = (size_t{e.layer} * l.TensorsPerLayer() + e.tensor) * tensor_bytes;
    cs.bytes = tensor_bytes;
    if (p.mode == Mode::kQuant) {
      // u8 bits, u8 axis, u8 flags, u8 contexts, u16 group, fp16 mu[C], u8 a[C] (token delta),
      // fp16 steps (C for keys, T * ceil(C / G) for values), rANS stream.
      const uint8_t* q = cs.payload.data();
      const uint8_t flags = q[2];
      EXPECT_EQ(flags & kFlagKeyOutliers ? 1 : 0, p.key_outliers && cs.is_key ? 1 : 0);
      std::memcpy(&cs.group, q + 4, 2);
      size_t at = 6;
      if (flags & kFlagKeyOutliers) {  // u16 nout, u16 channels[nout], elements[T * nout]
        uint16_t nout;
        std::memcpy(&nout, q + at, 2);
        at += 2;
        cs.outlier_idx.resize(nout);
        std::memcpy(cs.outlier_idx.data(), q + at, nout * 2);
        at += nout * 2;
        const size_t vals = T * nout * DTypeBytes(l.dtype);
        cs.outlier_vals.assign(q + at, q + at + vals);
        at += vals;
      }
      cs.mu16.resize(C);
      std::memcpy(cs.mu16.data(), q + at, C * 2);
      at += C * 2;
      if (flags & kFlagTokenDelta) {
        cs.a16.assign(q + at, q + at + C);
        at += C;
      }
      const size_t G = cs.is_key ? C : cs.group;
      const size_t nsteps = cs.is_key ? C : T * ((C + G - 1) / G);
      cs.steps16.resize(nsteps);
      std::memcpy(cs.steps16.data(), q + at, nsteps * 2);
      cs.syms.assign(syms.begin() + sym_at, syms.begin() + sym_at + T * C);
      sym_at += T * C;
    }
    out.sections.push_back(std::move(cs));
  }
  return out;
}

}  // namespace strata::codec::cuda_test
