// One pca head's decoder inputs for the kernel tests (random byte symbols in the decoder's
// layout, basis, mean, steps and RoPE tables), what a kernel writes for it, and the squared
// errors of two decodes of an fp16 block.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "codec/half.h"
#include "codec/internal/pca_amx.h"
#include "codec/internal/pca_avx512.h"

namespace strata::codec::test {

using internal::PcaRows;

// A head's shape for the kernel tests: dim, coordinates, tokens, slots, symbols' maxq.
struct HeadShape {
  size_t dim, n, tokens, nslots;
  int32_t maxq;
};

// Random byte symbols in the decoder's layout (16-token runs per slot, then the last group's
// runs), a random basis, a mean and RoPE tables for one head.
struct Head {
  Head(size_t dim, size_t n, size_t tokens, size_t nslots, int32_t maxq, uint32_t seed)
      : dim(dim), n(n), tokens(tokens), nslots(nslots), maxq(maxq) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    basis.resize(dim * dim);
    for (float& x : basis) x = normal(rng) / std::sqrt(static_cast<float>(dim));
    mean.resize(dim);
    for (float& m : mean) m = normal(rng);
    coords.resize(n);
    slot.resize(n);
    steps.resize(n);
    for (size_t k = 0; k < n; ++k) {
      coords[k] = static_cast<uint32_t>(k);
      // Distinct and out of order: nslots is odd and coprime to 7 in every case below.
      slot[k] = static_cast<uint32_t>((k * 7 + 3) % nslots);
      steps[k] = 0.25f + 0.01f * static_cast<float>(k);
    }
    sym.resize(tokens * nslots);
    std::uniform_int_distribution<int> value(0, 2 * maxq);
    for (uint8_t& v : sym) v = static_cast<uint8_t>(value(rng));
    cos.resize(tokens * dim / 2);
    sin.resize(tokens * dim / 2);
    for (size_t i = 0; i < cos.size(); ++i) {
      cos[i] = std::cos(0.01f * static_cast<float>(i));
      sin[i] = std::sin(0.01f * static_cast<float>(i));
    }
  }
  internal::PcaSymbols Symbols() const { return {sym.data(), false, nslots, tokens, maxq}; }
  // Axes whose every coordinate is int8: a flat spectrum small against the steps.
  internal::PcaVnniAxes Int8Axes() const {
    std::vector<float> flat(n, 1e-3f);
    internal::PcaVnniAxes axes;
    internal::BuildPcaVnniAxes(basis.data(), coords.data(), steps.data(), flat.data(), n, dim,
                               &axes);
    return axes;
  }
  // Int16 axes for every coordinate (no variances).
  internal::PcaVnniAxes Int16Axes() const {
    internal::PcaVnniAxes axes;
    internal::BuildPcaVnniAxes(basis.data(), coords.data(), steps.data(), nullptr, n, dim, &axes);
    return axes;
  }
  // The rows in double: mean + scale * sum over k of (symbol - maxq) * steps[k] * basis row
  // coords[k], rotated as RopeRows rotates (pair c, c + dim / 2) with `rope`; *energy: the
  // squared sums before the mean.
  std::vector<double> Reference(float scale, bool rope, double* energy) const {
    std::vector<double> want(tokens * dim);
    *energy = 0;
    const size_t full = tokens / 16, rest = tokens % 16, half = dim / 2;
    for (size_t t = 0; t < tokens; ++t) {
      std::vector<double> row(dim);
      for (size_t c = 0; c < dim; ++c) {
        double x = 0;
        for (size_t k = 0; k < n; ++k) {
          const size_t at = t / 16 < full ? (t / 16 * nslots + slot[k]) * 16 + t % 16
                                          : full * 16 * nslots + slot[k] * rest + t % 16;
          x += (int32_t{sym[at]} - maxq) * double{steps[k]} * basis[coords[k] * dim + c];
        }
        row[c] = mean[c] + double{scale} * x;
        *energy += double{scale} * x * double{scale} * x;
      }
      for (size_t c = 0; c < dim; ++c) {
        double v = row[c];
        if (rope) {
          const size_t i = c % half;
          const double co = cos[t * half + i], si = sin[t * half + i];
          v = c < half ? row[c] * co - row[c + half] * si : row[c] * co + row[c - half] * si;
        }
        want[t * dim + c] = v;
      }
    }
    return want;
  }
  size_t dim, n, tokens, nslots;
  int32_t maxq;
  std::vector<float> basis, mean, steps, cos, sin;
  std::vector<uint32_t> coords, slot;
  std::vector<uint8_t> sym;
};

// `decode(rows)`'s output for rows of `type` at an address on a cache line (streamed stores)
// or 2 bytes past one (plain stores).
template <typename Decode>
std::vector<uint8_t> Decoded(const Head& h, PcaRows::Type type, size_t offset, Decode decode) {
  const size_t bytes = h.tokens * h.dim * (type == PcaRows::Type::kFloat32 ? 4 : 2);
  std::vector<uint8_t> mem(bytes + 128, 0xA5);
  uint8_t* at = mem.data() + (64 - reinterpret_cast<uintptr_t>(mem.data()) % 64) % 64 + offset;
  decode(PcaRows{at, type, h.dim});
  return {at, at + bytes};
}

// Squared errors over an fp16 block: of `a` and `b` against `x`, and of `a` against `b`.
struct SquaredErrors {
  double a = 0, b = 0, apart = 0;
};
inline SquaredErrors Fp16Errors(std::span<const uint8_t> x, const std::vector<uint8_t>& a,
                         const std::vector<uint8_t>& b) {
  SquaredErrors e;
  auto at = [](const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return double{HalfToFloat(h)};
  };
  for (size_t v = 0; v < x.size() / 2; ++v) {
    const double xv = at(x.data() + 2 * v), av = at(a.data() + 2 * v), bv = at(b.data() + 2 * v);
    e.a += (av - xv) * (av - xv);
    e.b += (bv - xv) * (bv - xv);
    e.apart += (av - bv) * (av - bv);
  }
  return e;
}

}  // namespace strata::codec::test
