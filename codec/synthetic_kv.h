// Synthetic KV data with the structure real KV caches show, for tests and codec_eval.
//
// Keys (per layer, per kv head, per channel c of head_dim D; HF "rotate_half" RoPE pairing,
// channel j pairs with j + D/2 at frequency theta_j = rope_base^(-2j/D)):
//   pre-RoPE key  k~[t][c] = scale_l * (m[c] + s[c] * z[t][c]),  z an AR(1) process over tokens
//                 with correlation key_token_corr and unit variance;
//   a few "outlier" pairs (outlier_pairs per head, drawn from the low-frequency half) get
//                 s and m multiplied by outlier_scale: large-magnitude channels that stay fixed
//                 across tokens (KIVI, Liu et al. 2024, Fig. 2; KVQuant, Hooper et al. 2024,
//                 observe such per-channel outliers in keys and none in values);
//   post-RoPE     k[t] = RoPE(k~[t], position t) (RoFormer, Su et al. 2021): high-frequency pairs
//                 rotate quickly from token to token, low-frequency pairs (and their outliers)
//                 barely move.
// Values: v[t][c] = scale_l * sigma_t * (mv[c] + w[t][c]), w AR(1) over tokens with correlation
//   value_token_corr, sigma_t a per-token log-normal magnitude (value_token_scale_sigma): values
//   look Gaussian per token, with no fixed outlier channels (KIVI).
// Token correlation: CacheGen (Liu et al., SIGCOMM 2024, Sec. 5.1) reports that KV values of
//   nearby tokens are close, so deltas between neighbours have much lower variance than the
//   values. The AR(1) correlations model that; the defaults (0.9 keys pre-RoPE, 0.8 values) are
//   our choice, not fitted to a particular model: set them to 0 to remove the structure.
// Layer scale scale_l varies log-uniformly in [0.5, 2] across layers.
//
// Deterministic for a given seed (own PRNG, no std::*_distribution).
#pragma once

#include <cstdint>
#include <vector>

#include "strata/kv_layout.h"

namespace strata::codec {

struct SyntheticKvParams {
  uint64_t seed = 1;
  float rope_base = 10000.0f;
  uint32_t outlier_pairs = 2;  // per head (so 4 outlier channels of head_dim)
  float outlier_scale = 12.0f;
  float key_token_corr = 0.9f;           // AR(1) coefficient of pre-RoPE key content
  float value_token_corr = 0.8f;         // AR(1) coefficient of values
  float value_token_scale_sigma = 0.3f;  // log-normal sigma of per-token value magnitude
};

// Generates `num_blocks` consecutive blocks (positions continue from block to block) in the
// codec's block layout, `layout.dtype` fp16, bf16 or fp32. Returns num_blocks * BlockBytes().
std::vector<uint8_t> GenerateSyntheticKv(const KvLayout& layout, uint32_t num_blocks,
                                         const SyntheticKvParams& params = {});

}  // namespace strata::codec
