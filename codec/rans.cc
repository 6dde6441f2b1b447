// What the rANS encoder and decoder share: the contexts' histograms and entropy, and the switch
// that keeps both on their scalar loops for tests. The coder itself: rans_encode.cc,
// rans_decode.cc, its tables: rans_tables.cc.
#include "codec/rans.h"

#include <cmath>
#include <vector>

#include "codec/internal/rans_simd.h"

namespace strata::codec::rans {

bool g_force_scalar = false;

void ForceScalarForTesting(bool on) { g_force_scalar = on; }

template <typename Sym>
void Histogram(const Sym* syms, size_t n, uint32_t alphabet, uint32_t num_ctx, uint32_t* counts) {
  const size_t full = n / kCtxRun;
  uint32_t ctx = 0;
  if (alphabet <= 1024) {
    // Four sub-histograms per context (lane & 3), so runs of one symbol do not serialise on
    // one counter's store-to-load latency.
    std::vector<uint32_t> sub(size_t{num_ctx} * 4 * alphabet, 0);
    for (size_t g = 0; g < full; ++g) {
      uint32_t* h = sub.data() + size_t{ctx} * 4 * alphabet;
      const Sym* s = syms + g * kCtxRun;
      for (int l = 0; l < kCtxRun; l += 4) {
        ++h[s[l]];
        ++h[alphabet + s[l + 1]];
        ++h[2 * alphabet + s[l + 2]];
        ++h[3 * alphabet + s[l + 3]];
      }
      if (++ctx == num_ctx) ctx = 0;
    }
    for (uint32_t c = 0; c < num_ctx; ++c) {
      const uint32_t* h = sub.data() + size_t{c} * 4 * alphabet;
      uint32_t* o = counts + size_t{c} * alphabet;
      for (uint32_t a = 0; a < alphabet; ++a)
        o[a] += h[a] + h[alphabet + a] + h[2 * alphabet + a] + h[3 * alphabet + a];
    }
  } else {
    for (size_t g = 0; g < full; ++g) {
      uint32_t* h = counts + size_t{ctx} * alphabet;
      for (int l = 0; l < kCtxRun; ++l) ++h[syms[g * kCtxRun + l]];
      if (++ctx == num_ctx) ctx = 0;
    }
  }
  for (size_t i = full * kCtxRun; i < n; ++i) ++counts[size_t{ctx} * alphabet + syms[i]];
}

template <typename Sym>
double EmpiricalEntropyBits(const Sym* syms, size_t n, uint32_t alphabet, uint32_t num_ctx) {
  std::vector<uint32_t> counts(size_t{alphabet} * num_ctx, 0);
  Histogram(syms, n, alphabet, num_ctx, counts.data());
  double bits = 0;
  for (uint32_t c = 0; c < num_ctx; ++c) {
    const uint32_t* h = counts.data() + size_t{c} * alphabet;
    uint64_t total = 0;
    for (uint32_t s = 0; s < alphabet; ++s) total += h[s];
    for (uint32_t s = 0; s < alphabet; ++s)
      if (h[s]) bits += h[s] * std::log2(static_cast<double>(total) / h[s]);
  }
  return bits;
}

template void Histogram<uint8_t>(const uint8_t*, size_t, uint32_t, uint32_t, uint32_t*);
template void Histogram<uint16_t>(const uint16_t*, size_t, uint32_t, uint32_t, uint32_t*);
template double EmpiricalEntropyBits<uint8_t>(const uint8_t*, size_t, uint32_t, uint32_t);
template double EmpiricalEntropyBits<uint16_t>(const uint16_t*, size_t, uint32_t, uint32_t);

}  // namespace strata::codec::rans
