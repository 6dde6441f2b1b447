#include "codec/internal/rans_tables.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/status_macros.h"

namespace strata::codec::rans {
namespace {

int ChooseProbBits(uint32_t used) {
  int b = 0;
  while ((1u << b) < used) ++b;
  return std::clamp(b + 6, kMinProbBits, kMaxProbBits);
}

// Scales counts (summing to total) to frequencies summing to 2^prob_bits, every used symbol
// keeping at least 1. Deterministic.
void Normalize(const uint32_t* c, uint32_t count, uint64_t total, int prob_bits, uint32_t* f) {
  const uint64_t m = uint64_t{1} << prob_bits;
  int64_t sum = 0;
  uint32_t best = 0;
  for (uint32_t s = 0; s < count; ++s) {
    if (c[s] == 0) {
      f[s] = 0;
      continue;
    }
    uint64_t v = (uint64_t{c[s]} * m * 2 + total) / (2 * total);  // round to nearest
    f[s] = static_cast<uint32_t>(std::max<uint64_t>(1, v));
    sum += f[s];
    if (c[s] > c[best]) best = s;
  }
  int64_t diff = static_cast<int64_t>(m) - sum;
  if (diff > 0 || static_cast<int64_t>(f[best]) + diff >= 1) {
    f[best] = static_cast<uint32_t>(f[best] + diff);
    return;
  }
  // Many symbols were forced up to 1: take the excess from the largest frequencies.
  int64_t excess = -diff;
  while (excess > 0) {
    for (uint32_t s = 0; s < count && excess > 0; ++s) {
      if (f[s] > 1) {
        int64_t take = std::min<int64_t>({excess, f[s] - 1, std::max<int64_t>(1, f[s] / 16)});
        f[s] -= static_cast<uint32_t>(take);
        excess -= take;
      }
    }
  }
}

}  // namespace

void BuildEncodeTables(const uint32_t* counts, uint32_t alphabet, uint32_t num_ctx,
                       Scratch* scratch, internal::ByteWriter& w, EncodeTables* t,
                       bool with_entropy) {
  scratch->enc_syms.resize(size_t{alphabet} * num_ctx * sizeof(EncSym));
  EncSym* enc = reinterpret_cast<EncSym*>(scratch->enc_syms.data());
  for (size_t i = 0; i < size_t{alphabet} * num_ctx; ++i) enc[i].freq = 0;
  t->syms = enc;
  std::vector<uint32_t> freqs(alphabet);
  double entropy = 0;
  for (uint32_t c = 0; c < num_ctx; ++c) {
    const uint32_t* h = counts + size_t{c} * alphabet;
    uint32_t lo = alphabet, hi = 0, used = 0;
    uint64_t total = 0;
    for (uint32_t s = 0; s < alphabet; ++s) {
      if (!h[s]) continue;
      lo = std::min(lo, s);
      hi = s;
      ++used;
      total += h[s];
    }
    t->lo[c] = lo;
    t->hi[c] = hi;
    t->prob_bits[c] = 0;
    if (total == 0) {
      w.U8(0);
      continue;
    }
    for (uint32_t s = lo; s <= hi && with_entropy; ++s)
      if (h[s]) entropy += h[s] * std::log2(static_cast<double>(total) / h[s]);
    const int p = ChooseProbBits(used);
    t->prob_bits[c] = static_cast<uint32_t>(p);
    const uint32_t count = hi - lo + 1;
    Normalize(h + lo, count, total, p, freqs.data());
    w.U8(static_cast<uint8_t>(p));
    w.Varint(lo);
    w.Varint(count);
    uint32_t start = 0;
    EncSym* e = enc + size_t{c} * alphabet;
    for (uint32_t i = 0; i < count; ++i) {
      const uint32_t f = freqs[i];
      w.Varint(f);
      EncSym& es = e[lo + i];
      es.freq = f;
      es.start = start;
      es.shift = static_cast<uint32_t>(p);
      if (f) {
        es.rcp = ~uint64_t{0} / f;
        es.x_max = static_cast<uint32_t>(std::min<uint64_t>(uint64_t{f} << (32 - p), 0xFFFFFFFFu));
      }
      start += f;
    }
  }
  t->entropy_bits = entropy;
}

// float(x) and the product each round by at most 2^-24 of themselves and the reciprocal by
// 2^-23: together never past the 2^-22 margin (so never above the quotient), and with it short
// by at most 2^-21 of x / freq < 2^21, i.e. by less than 1. The vector encoder then corrects in
// one direction only.
float QuotientReciprocal(uint32_t freq) {
  const double want = (1.0 / freq) * (1.0 - 0x1p-22);
  const float r = static_cast<float>(want);
  // Rounded up: the float below (r is positive and normal, so one less in its bits).
  return static_cast<double>(r) > want ? std::bit_cast<float>(std::bit_cast<uint32_t>(r) - 1) : r;
}

size_t BuildSimdEncodeTables(const EncodeTables& t, uint32_t alphabet, uint32_t num_ctx,
                             Scratch* scratch, uint32_t* lo_out) {
  uint32_t lo = alphabet, hi = 0;
  for (uint32_t c = 0; c < num_ctx; ++c) {
    lo = std::min(lo, t.lo[c]);
    hi = std::max(hi, t.hi[c]);
  }
  const uint32_t span = hi - lo + 1;
  const size_t stride = span <= 16 ? 16 : span <= 32 ? 32 : span <= 64 ? 64 : alphabet;
  if (stride == alphabet) lo = 0;
  scratch->enc_ent.assign(stride * num_ctx, 0);
  scratch->enc_rcp.assign(stride * num_ctx, 0.0f);
  for (uint32_t c = 0; c < num_ctx; ++c)
    for (uint32_t sy = t.lo[c]; sy <= t.hi[c] && sy < alphabet; ++sy) {
      const EncSym& es = t.syms[size_t{c} * alphabet + sy];
      if (es.freq) {
        scratch->enc_ent[c * stride + (sy - lo)] = es.freq | es.start << 16;
        scratch->enc_rcp[c * stride + (sy - lo)] = QuotientReciprocal(es.freq);
      }
    }
  *lo_out = lo;
  return stride;
}

absl::Status ReadTableLayout(internal::ByteReader& in, uint32_t alphabet, uint32_t num_ctx,
                             TableLayout* layout) {
  layout->begin = in.pos();
  layout->total_entries = 0;
  layout->sym_lo = alphabet;
  layout->sym_hi = 0;
  for (uint32_t c = 0; c < num_ctx; ++c) {
    uint8_t p = 0;
    STRATA_RETURN_IF_ERROR(in.Read(&p));
    layout->prob_bits[c] = p;
    layout->offsets[c] = layout->total_entries;
    if (p == 0) continue;
    if (p > kMaxProbBits) return absl::DataLossError("rans: probability precision out of range");
    uint32_t lo = 0, count = 0;
    STRATA_RETURN_IF_ERROR(in.Varint(&lo));
    STRATA_RETURN_IF_ERROR(in.Varint(&count));
    if (count == 0 || lo >= alphabet || count > alphabet - lo)
      return absl::DataLossError("rans: table symbol range outside the alphabet");
    uint64_t sum = 0;
    for (uint32_t i = 0; i < count; ++i) {
      uint32_t f = 0;
      STRATA_RETURN_IF_ERROR(in.Varint(&f));
      sum += f;
      if (sum > (uint64_t{1} << p)) return absl::DataLossError("rans: frequencies overflow");
    }
    if (sum != (uint64_t{1} << p)) return absl::DataLossError("rans: frequencies do not sum up");
    layout->total_entries += size_t{1} << p;
    layout->sym_lo = std::min(layout->sym_lo, lo);
    layout->sym_hi = std::max(layout->sym_hi, lo + count - 1);
  }
  layout->len = static_cast<size_t>(in.pos() - layout->begin);
  return absl::OkStatus();
}

// The tables were checked by ReadTableLayout: the reads below cannot fail.
void BuildPackedDecodeTables(const TableLayout& layout, uint32_t num_ctx, uint32_t tab,
                             Scratch* scratch, const uint8_t** pack) {
  internal::ByteReader t(layout.begin, layout.len, "rans");
  scratch->dec_pack8.resize(layout.total_entries + 4);  // +4: the gather reads 4 bytes per slot
  scratch->dec_ftab.assign(size_t{tab} * num_ctx, 0);
  for (uint32_t c = 0; c < num_ctx; ++c) {
    uint8_t p = 0;
    (void)t.Read(&p);
    pack[c] = scratch->dec_pack8.data() + layout.offsets[c];
    if (p == 0) continue;
    uint32_t lo = 0, count = 0;
    (void)t.Varint(&lo);
    (void)t.Varint(&count);
    uint8_t* pk = scratch->dec_pack8.data() + layout.offsets[c];
    uint32_t* ft = scratch->dec_ftab.data() + size_t{c} * tab;
    uint32_t start = 0;
    for (uint32_t i = 0; i < count; ++i) {
      uint32_t f = 0;
      (void)t.Varint(&f);
      if (f == 0) continue;
      const uint32_t k = lo + i - layout.sym_lo;
      // A memset per symbol: no per-slot entry table on this path.
      std::memset(pk + start, static_cast<int>(k), f);
      ft[k] = f | start << 16;
      start += f;
    }
  }
}

void BuildEntryDecodeTables(const TableLayout& layout, uint32_t num_ctx, Scratch* scratch,
                            const uint32_t** ent, const uint16_t** sym) {
  internal::ByteReader t(layout.begin, layout.len, "rans");
  scratch->dec_entry.resize(layout.total_entries);
  scratch->dec_sym.resize(layout.total_entries + 2);  // +2: the SIMD gather reads 4 bytes
  for (uint32_t c = 0; c < num_ctx; ++c) {
    uint8_t p = 0;
    (void)t.Read(&p);
    ent[c] = scratch->dec_entry.data() + layout.offsets[c];
    sym[c] = scratch->dec_sym.data() + layout.offsets[c];
    if (p == 0) continue;
    uint32_t lo = 0, count = 0;
    (void)t.Varint(&lo);
    (void)t.Varint(&count);
    uint32_t* e = scratch->dec_entry.data() + layout.offsets[c];
    uint16_t* sy = scratch->dec_sym.data() + layout.offsets[c];
    uint32_t start = 0;
    for (uint32_t i = 0; i < count; ++i) {
      uint32_t f = 0;
      (void)t.Varint(&f);
      for (uint32_t j = 0; j < f; ++j) {
        e[start + j] = (f << 16) | j;
        sy[start + j] = static_cast<uint16_t>(lo + i);
      }
      start += f;
    }
  }
}

}  // namespace strata::codec::rans
