// Sections of the calibrated transform mode (`pca`): each head vector, minus the calibration's
// mean, is projected on the calibration's basis; the coordinates with a step are quantised
// uniformly (round to nearest) and rANS-coded in the blob's shared stream; dropped coordinates
// decode as zero (the head vector as the mean along them).
//
// Payload: u16 maxq (symbols are q + maxq, alphabet 2 maxq + 1), u16 coded coordinates (of all
// heads: a check against the calibration), u16 exact tokens e, e u16 token indexes (increasing),
// e token rows as given (all heads, the block's dtype), then, when any coordinate is coded, the
// rANS tables of kPcaContexts contexts (symbols in the shared stream).
//
// Symbol order and contexts. Coordinates differ in spread (sqrt(variance) / step) by orders of
// magnitude, so one table for all would waste bits, and a table per coordinate costs more than it
// saves. The coded coordinates of a section are ranked by spread and split into C equal classes
// (C = min(16, count); the count padded to a multiple of C with always-zero coordinates, which
// land in the lowest class); slot j of the ranked, interleaved list holds class j % C. Symbols
// go in runs of 16 tokens of one slot, slot after slot, token group after token group, so that
// the coder's context of run r, r % C, is the class of its coordinate.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "codec/calibration.h"
#include "codec/internal/byte_io.h"
#include "codec/internal/kernels.h"
#include "codec/internal/sections.h"
#include "common/status_macros.h"

namespace strata::codec::internal {

namespace {

constexpr uint32_t kPcaContexts = 16;
constexpr int32_t kMaxQ = 2047;  // alphabet <= 4095 < rans::kMaxAlphabet
constexpr size_t kRun = rans::kCtxRun;
// Exact tokens: relative coding error above this multiple of the section's median, at most
// MaxExactTokens (so their cost stays under 16/128 bits per value).
constexpr double kExactTokenFactor = 8.0;
inline size_t MaxExactTokens(size_t T) { return std::max<size_t>(1, T / 128); }

struct Slot {
  uint32_t head;
  uint32_t coord;  // == head_dim: padding
};

// The section's coded coordinates in symbol order (see the top of the file).
void PlanSlots(const Calibration& cal, uint32_t layer, uint32_t tensor, std::vector<Slot>* slots,
               uint32_t* num_ctx, uint32_t* coded) {
  struct Item {
    float spread;
    uint32_t head, coord;
  };
  std::vector<Item> items;
  for (uint32_t h = 0; h < cal.num_kv_heads; ++h) {
    const HeadTransform& ht = cal.At(layer, tensor, h);
    for (uint32_t c = 0; c < cal.head_dim; ++c)
      if (ht.step[c] > 0) items.push_back({std::sqrt(ht.variance[c]) / ht.step[c], h, c});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.spread > b.spread; });
  *coded = static_cast<uint32_t>(items.size());
  slots->clear();
  if (items.empty()) {
    *num_ctx = 0;
    return;
  }
  const uint32_t C = std::min<uint32_t>(kPcaContexts, *coded);
  const uint32_t per_class = (*coded + C - 1) / C;
  slots->assign(size_t{per_class} * C, Slot{0, cal.head_dim});
  for (uint32_t rank = 0; rank < *coded; ++rank)
    (*slots)[size_t{rank % per_class} * C + rank / per_class] = {items[rank].head,
                                                                 items[rank].coord};
  *num_ctx = C;
}

// Symbol index of (token group g, slot j, token t within the group).
inline size_t SymIndex(size_t T, size_t nslots, size_t tok, size_t j) {
  const size_t g = tok / kRun, in = tok % kRun;
  const size_t group_len = std::min(kRun, T - g * kRun);
  return g * kRun * nslots + j * group_len + in;
}

}  // namespace

// The angles' cosines and sines, per (token, pair); every key section of a block shares them.
const RopeTable& RopeTableFor(RopeTable* t, size_t T, size_t D, uint64_t first_position,
                              float theta) {
  if (t->tokens == T && t->dim == D && t->first_position == first_position && t->theta == theta)
    return *t;
  const size_t half = D / 2;
  t->cos.resize(T * half);
  t->sin.resize(T * half);
  std::vector<double> inv(half);
  for (size_t j = 0; j < half; ++j)
    inv[j] = std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(j) / D);
  for (size_t tok = 0; tok < T; ++tok)
    for (size_t j = 0; j < half; ++j) {
      const double ang = static_cast<double>(first_position + tok) * inv[j];
      t->cos[tok * half + j] = static_cast<float>(std::cos(ang));
      t->sin[tok * half + j] = static_cast<float>(std::sin(ang));
    }
  t->tokens = T;
  t->dim = D;
  t->first_position = first_position;
  t->theta = theta;
  return *t;
}

void RotateRope(float* x, size_t T, size_t H, size_t D, uint64_t first_position, float theta,
                bool inverse, RopeTable* table) {
  RopeTable local;
  const RopeTable& t = RopeTableFor(table ? table : &local, T, D, first_position, theta);
  const size_t half = D / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  for (size_t tok = 0; tok < T; ++tok) {
    const float* c = t.cos.data() + tok * half;
    const float* s = t.sin.data() + tok * half;
    for (size_t h = 0; h < H; ++h) {
      float* __restrict v = x + (tok * H + h) * D;
      for (size_t j = 0; j < half; ++j) {
        const float a = v[j], b = v[j + half], sj = sign * s[j];
        v[j] = a * c[j] - b * sj;
        v[j + half] = b * c[j] + a * sj;
      }
    }
  }
}

absl::Status EncodePca(const uint8_t* in, const TensorShape& s, const Calibration& cal,
                       uint32_t layer, uint32_t tensor, uint64_t first_position, SectionScratch* sc,
                       std::vector<uint8_t>* out, rans::CoderStats* stats,
                       rans::SharedEncoder* shared) {
  const size_t T = s.tokens, H = s.heads, D = s.head_dim;
  std::vector<Slot> slots;
  uint32_t num_ctx, coded;
  PlanSlots(cal, layer, tensor, &slots, &num_ctx, &coded);
  sc->f.resize(s.values());
  ToFloat(in, s.dtype, sc->f.data(), s.values());
  for (float x : sc->f)
    if (!std::isfinite(x)) return absl::InvalidArgumentError("pca section: non-finite input");
  const bool rope = tensor == 0 && cal.rope_theta > 0;
  if (rope) RotateRope(sc->f.data(), T, H, D, first_position, cal.rope_theta, true, &sc->rope);
  // y[h][tok][c] for the coded coordinates of each head, c in the head's own order.
  std::vector<std::vector<uint32_t>> head_coords(H);
  for (size_t h = 0; h < H; ++h) {
    const HeadTransform& ht = cal.At(layer, tensor, static_cast<uint32_t>(h));
    for (uint32_t c = 0; c < D; ++c)
      if (ht.step[c] > 0) head_coords[h].push_back(c);
  }
  std::vector<int32_t>& q = sc->pq;
  // q laid out [h][c_local][tok]; qpos maps (h, c) to its base.
  std::vector<size_t> base(H * D, 0);
  size_t total = 0;
  for (size_t h = 0; h < H; ++h)
    for (uint32_t c : head_coords[h]) {
      base[h * D + c] = total;
      total += T;
    }
  q.assign(total, 0);
  std::vector<float>& bt = sc->row;  // basis rows of the coded coordinates, transposed: [d][n]
  std::vector<float>& xc = sc->mn;   // one head's centred vectors, [tok][d]
  std::vector<float>& y = sc->mx;    // and their coordinates, [tok][k]
  // Per token: squared norm and squared coding error (summed over heads; the error is the
  // energy off the coded axes plus the quantisation error on them, the basis being orthonormal).
  std::vector<double> norm2(T, 0.0), err2(T, 0.0);
  for (size_t h = 0; h < H; ++h) {
    const HeadTransform& ht = cal.At(layer, tensor, static_cast<uint32_t>(h));
    const size_t n = head_coords[h].size();
    xc.resize(T * D);
    for (size_t tok = 0; tok < T; ++tok) {
      const float* x = sc->f.data() + (tok * H + h) * D;
      for (size_t d = 0; d < D; ++d) {
        xc[tok * D + d] = x[d] - ht.mean[d];
        norm2[tok] += double{x[d]} * x[d];
        err2[tok] += double{xc[tok * D + d]} * xc[tok * D + d];
      }
    }
    if (n == 0) continue;
    // Columns padded to a multiple of 16 with zero axes: the kernel's vector loop covers them
    // all (its scalar tail is slow), and the padding's coordinates are never read.
    const size_t np = (n + 15) / 16 * 16;
    bt.assign(D * np, 0.0f);
    for (size_t k = 0; k < n; ++k)
      for (size_t d = 0; d < D; ++d) bt[d * np + k] = ht.basis[head_coords[h][k] * D + d];
    y.resize(T * np);
    MatMulRows(xc.data(), D, T, D, bt.data(), np, nullptr, y.data(), np);
    std::vector<float> inv(n), step(n), qf(n), gain(n);
    for (size_t k = 0; k < n; ++k) {
      step[k] = ht.step[head_coords[h][k]];
      inv[k] = 1.0f / step[k];
    }
    for (size_t tok = 0; tok < T; ++tok) {
      RoundToSteps(y.data() + tok * np, inv.data(), step.data(), n, static_cast<float>(kMaxQ),
                   qf.data(), gain.data());
      for (size_t k = 0; k < n; ++k) {
        err2[tok] += gain[k];  // in k order on every target: the same exact-token choice
        q[base[h * D + head_coords[h][k]] + tok] = static_cast<int32_t>(qf[k]);
      }
    }
  }
  // Tokens the calibration fits badly are stored exactly, in place of their coordinates (which
  // become zeros, cheap to code). These are the attention sinks: in SmolLM2 the first token's
  // relative error is 10-70x the block median in most layers, and decoding it exactly alone
  // takes the model's KL at 1.5 bits/value from 0.55 to 0.11 nats.
  std::vector<uint16_t> exact;
  {
    std::vector<double> rel(T);
    for (size_t tok = 0; tok < T; ++tok) rel[tok] = std::max(err2[tok], 0.0) / std::max(norm2[tok], 1e-30);
    std::vector<double> sorted = rel;
    std::nth_element(sorted.begin(), sorted.begin() + T / 2, sorted.end());
    const double limit = kExactTokenFactor * sorted[T / 2];
    std::vector<uint32_t> order(T);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return rel[a] > rel[b]; });
    for (size_t i = 0; i < MaxExactTokens(T) && rel[order[i]] > limit; ++i)
      exact.push_back(static_cast<uint16_t>(order[i]));
    std::sort(exact.begin(), exact.end());
  }
  for (uint16_t tok : exact)
    for (size_t i = tok; i < q.size(); i += T) q[i] = 0;
  int32_t maxq = 0;
  for (int32_t v : q) maxq = std::max(maxq, v < 0 ? -v : v);
  ByteWriter w(out);
  w.U16(static_cast<uint16_t>(maxq));
  w.U16(static_cast<uint16_t>(coded));
  w.U16(static_cast<uint16_t>(exact.size()));
  const size_t row_bytes = H * D * DTypeBytes(s.dtype);
  for (uint16_t tok : exact) w.U16(tok);
  for (uint16_t tok : exact) w.Raw(in + tok * row_bytes, row_bytes);
  if (coded == 0) return absl::OkStatus();
  if (!shared) return absl::InternalError("pca section: no shared stream");
  const size_t nsym = T * slots.size();
  const uint32_t alphabet = 2 * static_cast<uint32_t>(maxq) + 1;
  auto emit = [&](auto* syms) {
    for (size_t j = 0; j < slots.size(); ++j) {
      const Slot& sl = slots[j];
      const int32_t* src = sl.coord == D ? nullptr : q.data() + base[sl.head * D + sl.coord];
      for (size_t tok = 0; tok < T; ++tok)
        syms[SymIndex(T, slots.size(), tok, j)] =
            static_cast<std::remove_pointer_t<decltype(syms)>>((src ? src[tok] : 0) + maxq);
    }
    rans::Encode(syms, nsym, alphabet, num_ctx, &sc->rans, out, stats, rans::kMaxLanes, nullptr,
                 shared);
  };
  if (alphabet <= 256) {
    sc->syms8.resize(nsym);
    emit(sc->syms8.data());
  } else {
    sc->syms.resize(nsym);
    emit(sc->syms.data());
  }
  return absl::OkStatus();
}

absl::Status DecodePca(std::span<const uint8_t> payload, const TensorShape& s,
                       const Calibration& cal, uint32_t layer, uint32_t tensor,
                       uint64_t first_position, SectionScratch* sc, uint8_t* out, rans::SharedDecoder* shared) {
  const size_t T = s.tokens, H = s.heads, D = s.head_dim;
  std::vector<Slot> slots;
  uint32_t num_ctx, coded;
  PlanSlots(cal, layer, tensor, &slots, &num_ctx, &coded);
  ByteReader r(payload, "pca section");
  uint16_t maxq, coded_in;
  STRATA_RETURN_IF_ERROR(r.Read(&maxq));
  STRATA_RETURN_IF_ERROR(r.Read(&coded_in));
  if (coded_in != coded)
    return absl::DataLossError(absl::StrCat("pca section: ", coded_in,
                                            " coded coordinates, the calibration has ", coded));
  if (maxq > kMaxQ) return absl::DataLossError("pca section: symbol range too large");
  uint16_t num_exact;
  STRATA_RETURN_IF_ERROR(r.Read(&num_exact));
  if (num_exact > MaxExactTokens(T)) return absl::DataLossError("pca section: too many exact tokens");
  std::vector<uint16_t> exact(num_exact);
  for (uint16_t& tok : exact) {
    STRATA_RETURN_IF_ERROR(r.Read(&tok));
    if (tok >= T || (&tok != exact.data() && tok <= (&tok)[-1]))
      return absl::DataLossError("pca section: exact tokens out of range or order");
  }
  const size_t row_bytes = H * D * DTypeBytes(s.dtype);
  const uint8_t* exact_rows;
  STRATA_RETURN_IF_ERROR(r.Take(num_exact * row_bytes, &exact_rows));
  sc->f.resize(s.values());
  // Per head: its slots, and (below) its dequantised coordinates [tok][k] and their axes [k][d].
  std::vector<std::vector<uint32_t>> head_slots(H);
  for (size_t j = 0; j < slots.size(); ++j)
    if (slots[j].coord != D) head_slots[slots[j].head].push_back(static_cast<uint32_t>(j));
  std::vector<float>& y = sc->row;
  std::vector<float>& axes = sc->mn;
  auto reconstruct = [&](auto* syms) {
    for (size_t h = 0; h < H; ++h) {
      const HeadTransform& ht = cal.At(layer, tensor, static_cast<uint32_t>(h));
      const std::vector<uint32_t>& js = head_slots[h];
      const size_t n = js.size();
      y.resize(T * n);
      axes.resize(n * D);
      for (size_t k = 0; k < n; ++k) {
        const uint32_t c = slots[js[k]].coord;
        const float st = ht.step[c];
        std::copy(ht.basis.begin() + size_t{c} * D, ht.basis.begin() + size_t{c + 1} * D,
                  axes.begin() + k * D);
        for (size_t tok = 0; tok < T; ++tok)
          y[tok * n + k] =
              static_cast<float>(static_cast<int32_t>(syms[SymIndex(T, slots.size(), tok, js[k])]) -
                                 int32_t{maxq}) *
              st;
      }
      MatMulRows(y.data(), n, T, n, axes.data(), D, ht.mean.data(), sc->f.data() + h * D, H * D);
    }
  };
  if (coded == 0) {
    uint8_t none = 0;
    reconstruct(&none);  // every head decodes as its mean
  } else {
    if (!shared) return absl::DataLossError("pca section: blob has no shared stream");
    const size_t nsym = T * slots.size();
    const uint32_t alphabet = 2 * uint32_t{maxq} + 1;
    auto take = [&](auto* syms) -> absl::Status {
      STRATA_RETURN_IF_ERROR(rans::Decode(r, nsym, alphabet, num_ctx, &sc->rans, syms,
                                          rans::kMaxLanes, shared));
      reconstruct(syms);
      return absl::OkStatus();
    };
    if (alphabet <= 256) {
      sc->syms8.resize(nsym);
      STRATA_RETURN_IF_ERROR(take(sc->syms8.data()));
    } else {
      sc->syms.resize(nsym);
      STRATA_RETURN_IF_ERROR(take(sc->syms.data()));
    }
  }
  if (r.remaining() != 0) return absl::DataLossError("pca section: trailing bytes");
  if (tensor == 0 && cal.rope_theta > 0)
    RotateRope(sc->f.data(), T, H, D, first_position, cal.rope_theta, false, &sc->rope);
  FromFloat(sc->f.data(), s.dtype, out, s.values());
  for (size_t i = 0; i < exact.size(); ++i)
    std::memcpy(out + exact[i] * row_bytes, exact_rows + i * row_bytes, row_bytes);
  return absl::OkStatus();
}

}  // namespace strata::codec::internal
