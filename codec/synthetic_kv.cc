#include "codec/synthetic_kv.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "codec/half.h"

namespace strata::codec {
namespace {

// SplitMix64 + Box-Muller: small, deterministic, platform independent.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return (static_cast<double>(Next() >> 11) + 0.5) * 0x1.0p-53; }
  double Gaussian() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u = Uniform(), v = Uniform();
    const double r = std::sqrt(-2.0 * std::log(u));
    spare_ = r * std::sin(2 * std::numbers::pi * v);
    has_spare_ = true;
    return r * std::cos(2 * std::numbers::pi * v);
  }

 private:
  uint64_t s_;
  double spare_ = 0;
  bool has_spare_ = false;
};

void Store(float v, DType dt, uint8_t* p) {
  switch (dt) {
    case DType::kFloat16: {
      uint16_t h = FloatToHalf(v);
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kBFloat16: {
      uint16_t h = FloatToBF16(v);
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kFloat32: std::memcpy(p, &v, 4); break;
    default: break;
  }
}

}  // namespace

std::vector<uint8_t> GenerateSyntheticKv(const KvLayout& layout, uint32_t num_blocks,
                                         const SyntheticKvParams& P) {
  const uint32_t L = layout.num_layers, H = layout.num_kv_heads, D = layout.head_dim;
  const uint32_t TB = layout.tokens_per_block, T = TB * num_blocks;
  const size_t eb = DTypeBytes(layout.dtype);
  const uint32_t tensors = layout.TensorsPerLayer();
  const size_t tensor_bytes = size_t{TB} * H * D * eb;
  const size_t block_bytes = layout.BlockBytes();
  std::vector<uint8_t> out(block_bytes * num_blocks, 0);
  Rng rng(P.seed);
  const uint32_t half = D / 2;
  std::vector<float> m(D), s(D), z(D), mv(D), w(D), pre(D);
  for (uint32_t l = 0; l < L; ++l) {
    const float layer_scale =
        static_cast<float>(std::exp(std::log(0.5) + rng.Uniform() * std::log(4.0)));
    for (uint32_t h = 0; h < H; ++h) {
      // Channel statistics of this head.
      for (uint32_t c = 0; c < D; ++c) {
        s[c] = static_cast<float>(0.5 + rng.Uniform());
        m[c] = static_cast<float>(0.5 * rng.Gaussian());
        mv[c] = static_cast<float>(0.2 * rng.Gaussian());
      }
      if (half > 0) {
        std::vector<uint32_t> picked;
        for (uint32_t o = 0; o < P.outlier_pairs && o < half - half / 2; ++o) {
          // Distinct pairs from the low-frequency half: j in [half/2, half).
          uint32_t j;
          do {
            j = half / 2 + static_cast<uint32_t>(rng.Next() % (half - half / 2));
          } while (std::find(picked.begin(), picked.end(), j) != picked.end());
          picked.push_back(j);
          for (uint32_t c : {j, j + half}) {
            s[c] *= P.outlier_scale;
            m[c] = static_cast<float>(P.outlier_scale * (1.0 + rng.Uniform()) *
                                      (rng.Next() & 1 ? 1.0 : -1.0));
          }
        }
      }
      for (uint32_t c = 0; c < D; ++c) {
        z[c] = static_cast<float>(rng.Gaussian());
        w[c] = static_cast<float>(rng.Gaussian());
      }
      const float kc = P.key_token_corr, vc = P.value_token_corr;
      const float kn = std::sqrt(1 - kc * kc), vn = std::sqrt(1 - vc * vc);
      for (uint32_t t = 0; t < T; ++t) {
        if (t > 0) {
          for (uint32_t c = 0; c < D; ++c) {
            z[c] = kc * z[c] + kn * static_cast<float>(rng.Gaussian());
            w[c] = vc * w[c] + vn * static_cast<float>(rng.Gaussian());
          }
        }
        const float sigma_t =
            static_cast<float>(std::exp(P.value_token_scale_sigma * rng.Gaussian()));
        const uint32_t blk = t / TB, tb = t % TB;
        uint8_t* kdst = out.data() + size_t{blk} * block_bytes +
                        size_t{l} * tensors * tensor_bytes + (size_t{tb} * H + h) * D * eb;
        for (uint32_t c = 0; c < D; ++c) pre[c] = layer_scale * (m[c] + s[c] * z[c]);
        for (uint32_t c = 0; c < D; ++c) {
          float k = pre[c];
          if (half > 0 && c < 2 * half) {
            const uint32_t j = c % half;
            const double theta =
                std::pow(static_cast<double>(P.rope_base), -2.0 * j / static_cast<double>(D));
            const double ang = static_cast<double>(t) * theta;
            const float cs = static_cast<float>(std::cos(ang)),
                        sn = static_cast<float>(std::sin(ang));
            k = c < half ? pre[c] * cs - pre[c + half] * sn : pre[c] * cs + pre[c - half] * sn;
          }
          Store(k, layout.dtype, kdst + c * eb);
        }
        if (tensors == 2) {
          uint8_t* vdst = kdst + tensor_bytes;
          for (uint32_t c = 0; c < D; ++c)
            Store(layer_scale * sigma_t * (mv[c] + w[c]), layout.dtype, vdst + c * eb);
        }
      }
    }
  }
  return out;
}

}  // namespace strata::codec
