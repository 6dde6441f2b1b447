// The rANS decoder: the AVX-512 loops (per-slot entry tables, or packed tables with one byte
// gather per step), the scalar loops that finish after them or stand in for them, and the
// stream shared by the sections of a blob.
#include <algorithm>
#include <bit>
#include <cstring>

#include "codec/internal/rans_simd.h"
#include "codec/internal/rans_tables.h"
#include "codec/rans.h"
#include "common/status_macros.h"

namespace strata::codec::rans {
namespace {

// The decoder reads words in place from the blob, where they may sit at an odd address.
inline uint32_t LoadWord(const uint16_t* p) {
  uint16_t w;
  std::memcpy(&w, p, 2);
  return w;
}

#if STRATA_RANS_AVX512
#define STRATA_AVX512_FN __attribute__((target("avx512f,avx512bw"))) inline

// One rANS decode step of 16 lanes sharing context tables (ent, sym), slot mask and precision
// p (from memory, as DecStepPacked's).
STRATA_AVX512_FN __m512i DecStep(__m512i x, const uint32_t* ent, const uint16_t* sym,
                                 const uint32_t* mask, const uint32_t* p, __m512i* sv) {
  const __m512i low16 = _mm512_set1_epi32(0xFFFF);
  const __m512i slot = _mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(*mask)));
  const __m512i e = _mm512_i32gather_epi32(slot, ent, 4);
  *sv = _mm512_and_si512(_mm512_i32gather_epi32(slot, sym, 2), low16);  // tables padded
  const __m512i xs = _mm512_srlv_epi32(x, _mm512_set1_epi32(static_cast<int>(*p)));
  return _mm512_add_epi32(_mm512_mullo_epi32(_mm512_srli_epi32(e, 16), xs),
                          _mm512_and_si512(e, low16));
}

// Refills the lanes that fell below kL with the next words, in lane order.
STRATA_AVX512_FN __m512i DecRenorm(__m512i x, const uint16_t*& wp) {
  const __mmask16 need = _mm512_cmplt_epu32_mask(x, _mm512_set1_epi32(static_cast<int>(kL)));
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp)));
  wp += std::popcount(static_cast<unsigned>(need));
  return _mm512_mask_or_epi32(x, need, _mm512_slli_epi32(x, 16),
                              _mm512_maskz_expand_epi32(need, w));
}

template <typename Sym>
STRATA_AVX512_FN void DecStore(__m512i sv, Sym* dst) {
  if constexpr (sizeof(Sym) == 1) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(sv));
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(sv));
  }
}

// The symbols of V consecutive runs (V a multiple of 4) to dst. Bytes four runs at a time: two
// dword and one word pack and a dword permute, where a narrowing store per run takes two uops
// of the vector port the whole step is short of.
template <typename Sym, int V>
STRATA_AVX512_FN void DecStoreRuns(const __m512i* sv, Sym* dst) {
  if constexpr (sizeof(Sym) == 1 && V % 4 == 0) {
    // Dword 4 L + j of the packed bytes holds run j's symbols 4 L .. 4 L + 3.
    const __m512i order =
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
#pragma GCC unroll 8
    for (int v = 0; v < V; v += 4) {
      const __m512i lo = _mm512_packus_epi32(sv[v], sv[v + 1]);
      const __m512i hi = _mm512_packus_epi32(sv[v + 2], sv[v + 3]);
      _mm512_storeu_si512(dst + v * kCtxRun,
                          _mm512_permutexvar_epi32(order, _mm512_packus_epi16(lo, hi)));
    }
  } else {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) DecStore(sv[v], dst + v * kCtxRun);
  }
}

// Decodes blocks of V full 16-symbol runs (run g on state vector g % V) while at least 16 * V
// words remain, so every 16-word load is in bounds. The V state vectors are independent, so
// their gathers overlap. Returns the number of runs decoded (a multiple of V).
template <typename Sym, int V>
__attribute__((target("avx512f,avx512bw"))) size_t DecodeRunsAvx512(
    uint32_t* states, const uint16_t*& wp, const uint16_t* wend, size_t runs, uint32_t num_ctx,
    const uint32_t* const* ent, const uint16_t* const* sym, const uint32_t* prob_bits, Sym* out) {
  __m512i xv[V];
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) xv[v] = _mm512_loadu_si512(states + 16 * v);
  uint32_t masks[kMaxContexts];
  for (uint32_t c = 0; c < num_ctx; ++c) masks[c] = (1u << prob_bits[c]) - 1;
  const uint16_t* wq = wp;  // local: the stores to out must not force reloads
  size_t g = 0;
  uint32_t c0 = 0;
  for (; g + V <= runs; g += V) {
    if (wend - wq < 16 * V) break;
    __m512i sv[V];
    uint32_t c = c0;
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      xv[v] = DecStep(xv[v], ent[c], sym[c], &masks[c], &prob_bits[c], &sv[v]);
      c = c + 1 == num_ctx ? 0 : c + 1;
    }
    c0 = c;
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) xv[v] = DecRenorm(xv[v], wq);
    DecStoreRuns<Sym, V>(sv, out + g * kCtxRun);
  }
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) _mm512_storeu_si512(states + 16 * v, xv[v]);
  wp = wq;
  return g;
}

// Decode step with one byte gather: `pack` holds, per slot, the symbol's index in the context's
// symbols lo..lo+kTab-1 (one byte, so a context's table is 2^p bytes and stays in L1), and the
// symbol's freq | start << 16 comes from an in-register table (kTab 16, 32 or 64 entries). The
// context's slot mask and precision come from memory (`mask`, `p`): as broadcast operands they
// cost the loads alone, where a value in a general register takes a vector-port uop to
// broadcast and a shift by a register count another (three per step, on the port the step is
// short of).
template <int kTab>
__attribute__((target("avx512f,avx512bw"), always_inline)) inline __m512i DecStepPacked(
    __m512i x, const uint8_t* pack, const uint32_t* ftab, __m512i lov, const uint32_t* mask,
    const uint32_t* p, __m512i* sv) {
  const __m512i low16 = _mm512_set1_epi32(0xFFFF);
  const __m512i slot = _mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(*mask)));
  const __m512i idx =
      _mm512_and_si512(_mm512_i32gather_epi32(slot, pack, 1), _mm512_set1_epi32(0xFF));
  __m512i f;
  if constexpr (kTab == 16) {
    f = _mm512_permutexvar_epi32(idx, _mm512_loadu_si512(ftab));
  } else if constexpr (kTab == 32) {
    f = _mm512_permutex2var_epi32(_mm512_loadu_si512(ftab), idx, _mm512_loadu_si512(ftab + 16));
  } else if constexpr (kTab == 64) {
    const __m512i f0 =
        _mm512_permutex2var_epi32(_mm512_loadu_si512(ftab), idx, _mm512_loadu_si512(ftab + 16));
    const __m512i f1 = _mm512_permutex2var_epi32(_mm512_loadu_si512(ftab + 32), idx,
                                                 _mm512_loadu_si512(ftab + 48));
    f = _mm512_mask_blend_epi32(_mm512_test_epi32_mask(idx, _mm512_set1_epi32(32)), f0, f1);
  } else {
    static_assert(kTab == 256);  // 1 KiB per context: a second gather, from L1
    f = _mm512_i32gather_epi32(idx, ftab, 4);
  }
  *sv = _mm512_add_epi32(idx, lov);
  const __m512i xs = _mm512_srlv_epi32(x, _mm512_set1_epi32(static_cast<int>(*p)));
  const __m512i bias = _mm512_sub_epi32(slot, _mm512_srli_epi32(f, 16));
  return _mm512_add_epi32(_mm512_mullo_epi32(_mm512_and_si512(f, low16), xs), bias);
}

template <typename Sym, int kTab, int V>
__attribute__((target("avx512f,avx512bw"))) size_t DecodeRunsPackedAvx512(
    uint32_t* states, const uint16_t*& wp, const uint16_t* wend, size_t runs, uint32_t num_ctx,
    const uint8_t* const* pack, const uint32_t* ftabs, uint32_t lo, const uint32_t* prob_bits,
    Sym* out) {
  __m512i xv[V];
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) xv[v] = _mm512_loadu_si512(states + 16 * v);
  const __m512i lov = _mm512_set1_epi32(static_cast<int>(lo));
  uint32_t masks[kMaxContexts];
  for (uint32_t c = 0; c < num_ctx; ++c) masks[c] = (1u << prob_bits[c]) - 1;
  const uint16_t* wq = wp;  // local: the stores to out must not force reloads
  size_t g = 0;
  uint32_t c0 = 0;
  for (; g + V <= runs; g += V) {
    if (wend - wq < 16 * V) break;
    __m512i sv[V];
    uint32_t c = c0;
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      xv[v] =
          DecStepPacked<kTab>(xv[v], pack[c], ftabs + size_t{c} * kTab, lov, &masks[c],
                              &prob_bits[c], &sv[v]);
      c = c + 1 == num_ctx ? 0 : c + 1;
    }
    c0 = c;
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) xv[v] = DecRenorm(xv[v], wq);
    DecStoreRuns<Sym, V>(sv, out + g * kCtxRun);
  }
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) _mm512_storeu_si512(states + 16 * v, xv[v]);
  wp = wq;
  return g;
}

// The AVX2 loop: each 16-symbol run is two 8-lane halves, otherwise the packed loop above. AVX2
// has no expand, so a refill takes the next words through a permute chosen by the lanes' mask
// (kRefill: lane i takes word popcount(mask & ((1 << i) - 1))).
#define STRATA_AVX2_FN __attribute__((target("avx2,bmi,bmi2,popcnt"), always_inline)) inline
#define STRATA_AVX2_LAMBDA __attribute__((target("avx2"), always_inline))

struct RefillTable {
  uint8_t word[256][8];
};
constexpr RefillTable MakeRefillTable() {
  RefillTable t{};
  for (int m = 0; m < 256; ++m) {
    int k = 0;
    for (int i = 0; i < 8; ++i) {
      t.word[m][i] = static_cast<uint8_t>(k);
      k += (m >> i) & 1;
    }
  }
  return t;
}
alignas(64) constexpr RefillTable kRefill = MakeRefillTable();

// One decode step of 8 lanes: the symbol's index by a byte gather from the context's slots,
// its freq | start << 16 from two registers (kTab 16) or a gather from the context's table.
template <int kTab>
STRATA_AVX2_FN __m256i DecStepAvx2(__m256i x, const uint8_t* pack, const uint32_t* ftab,
                                   __m256i lov, __m256i mask, __m128i p, __m256i* sv) {
  const __m256i low16 = _mm256_set1_epi32(0xFFFF);
  const __m256i slot = _mm256_and_si256(x, mask);
  const __m256i idx = _mm256_and_si256(
      _mm256_i32gather_epi32(reinterpret_cast<const int*>(pack), slot, 1), _mm256_set1_epi32(0xFF));
  __m256i f;
  // Entries 8j .. 8j + 7 of the table at idx (mod 8), and a choice between two by an index bit.
  auto part = [&](int j) STRATA_AVX2_LAMBDA {
    return _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ftab + 8 * j)), idx));
  };
  auto pick = [&](__m256 a, __m256 b, int bit) STRATA_AVX2_LAMBDA {
    return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 31 - bit)));
  };
  if constexpr (kTab == 16) {
    f = _mm256_castps_si256(pick(part(0), part(1), 3));
  } else if constexpr (kTab == 32) {
    f = _mm256_castps_si256(pick(pick(part(0), part(1), 3), pick(part(2), part(3), 3), 4));
  } else {
    f = _mm256_i32gather_epi32(reinterpret_cast<const int*>(ftab), idx, 4);
  }
  *sv = _mm256_add_epi32(idx, lov);
  const __m256i xs = _mm256_srl_epi32(x, p);
  const __m256i bias = _mm256_sub_epi32(slot, _mm256_srli_epi32(f, 16));
  return _mm256_add_epi32(_mm256_mullo_epi32(_mm256_and_si256(f, low16), xs), bias);
}

// Refills the lanes that fell below kL with the next words, in lane order.
STRATA_AVX2_FN __m256i DecRenormAvx2(__m256i x, const uint16_t*& wp) {
  const __m256i need = _mm256_cmpeq_epi32(_mm256_srli_epi32(x, 16), _mm256_setzero_si256());
  const unsigned m = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(need)));
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wp)));
  const __m256i at = _mm256_cvtepu8_epi32(
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kRefill.word[m])));
  wp += std::popcount(m);
  const __m256i refill =
      _mm256_or_si256(_mm256_slli_epi32(x, 16), _mm256_permutevar8x32_epi32(w, at));
  return _mm256_blendv_epi8(x, refill, need);
}

// A run's 16 symbols from its two halves' indexes (plus lo).
template <typename Sym>
STRATA_AVX2_FN void DecStoreRunAvx2(__m256i a, __m256i b, Sym* dst) {
  const __m256i words = _mm256_packus_epi32(a, b);  // a0-3 b0-3 | a4-7 b4-7
  if constexpr (sizeof(Sym) == 1) {
    const __m256i bytes = _mm256_packus_epi16(words, words);  // dword 0: a0-3, 1: b0-3, 4: a4-7
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst),
                     _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(bytes, order)));
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_permute4x64_epi64(words, 0xD8));
  }
}

template <typename Sym, int kTab, int V>
__attribute__((target("avx2,bmi,bmi2,popcnt"))) size_t DecodeRunsPackedAvx2(
    uint32_t* states, const uint16_t*& wp, const uint16_t* wend, size_t runs, uint32_t num_ctx,
    const uint8_t* const* pack, const uint32_t* ftabs, uint32_t lo, const uint32_t* prob_bits,
    Sym* out) {
  alignas(32) uint32_t x[16 * V];
  std::memcpy(x, states, sizeof(x));
  const __m256i lov = _mm256_set1_epi32(static_cast<int>(lo));
  const uint16_t* wq = wp;  // local: the stores to out must not force reloads
  size_t g = 0;
  uint32_t c = 0;
  for (; g + V <= runs; g += V) {
    if (wend - wq < 16 * V) break;
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      const __m256i mask = _mm256_set1_epi32(static_cast<int>((1u << prob_bits[c]) - 1));
      const __m128i p = _mm_cvtsi32_si128(static_cast<int>(prob_bits[c]));
      const uint32_t* ftab = ftabs + size_t{c} * kTab;
      __m256i* xv = reinterpret_cast<__m256i*>(x + 16 * v);
      __m256i sa, sb;
      const __m256i a = DecStepAvx2<kTab>(_mm256_load_si256(xv), pack[c], ftab, lov, mask, p, &sa);
      const __m256i b =
          DecStepAvx2<kTab>(_mm256_load_si256(xv + 1), pack[c], ftab, lov, mask, p, &sb);
      _mm256_store_si256(xv, DecRenormAvx2(a, wq));
      _mm256_store_si256(xv + 1, DecRenormAvx2(b, wq));
      DecStoreRunAvx2(sa, sb, out + (g + v) * kCtxRun);
      c = c + 1 == num_ctx ? 0 : c + 1;
    }
  }
  std::memcpy(states, x, sizeof(x));
  wp = wq;
  return g;
}

#endif

// The decode tables of one section, in the form the loops below read.
struct DecodeTables {
  bool packed;   // pack and ftab (else ent and sym)
  uint32_t tab;  // packed: ftab entries per context
  const uint8_t* pack[kMaxContexts];
  const uint32_t* ftab;
  const uint32_t* ent[kMaxContexts];
  const uint16_t* sym[kMaxContexts];
};

// The stream being decoded: the states (the decoder's own, or the shared stream's) and the words
// not read yet, which the decoder reads in place, never past wend.
struct Stream {
  uint32_t* x;
  const uint16_t* wp;
  const uint16_t* wend;
};

// Chooses the tables' form and builds them. The packed form needs the AVX-512 loop to pay off
// (and a symbol index that fits a byte).
void BuildDecodeTables(const TableLayout& layout, uint32_t num_ctx, size_t full_runs, int L,
                       Scratch* scratch, DecodeTables* t) {
  t->packed = false;
  t->tab = 0;
#if STRATA_RANS_AVX512
  const uint32_t span = layout.span();
  t->packed = (UseAvx512() || UseAvx2()) && full_runs >= size_t(L / 16) && span > 0 &&
              span <= 256;
  t->tab = span <= 16 ? 16 : span <= 32 ? 32 : span <= 64 ? 64 : 256;
#endif
  if (t->packed) {
    BuildPackedDecodeTables(layout, num_ctx, t->tab, scratch, t->pack);
    t->ftab = scratch->dec_ftab.data();
  } else {
    BuildEntryDecodeTables(layout, num_ctx, scratch, t->ent, t->sym);
  }
}

// Reads the initial states (or takes the shared stream's) and finds the words.
absl::Status OpenStream(internal::ByteReader& in, int L, SharedDecoder* shared,
                        uint32_t* own_states, Stream* s) {
  if (shared) {
    *s = {shared->x, shared->wp, shared->wend};
    return absl::OkStatus();
  }
  uint32_t stream_bytes = 0;
  STRATA_RETURN_IF_ERROR(in.Varint(&stream_bytes));
  if (stream_bytes < size_t(L) * 4 || (stream_bytes - size_t(L) * 4) % 2 != 0)
    return absl::DataLossError("rans: bad stream length");
  const uint8_t* sp;
  STRATA_RETURN_IF_ERROR(in.Take(stream_bytes, &sp));
  std::memcpy(own_states, sp, size_t(L) * 4);
  for (int l = 0; l < L; ++l)
    if (own_states[l] < kL) return absl::DataLossError("rans: bad initial state");
  // Words are read in place (LoadWord, unaligned vector loads): copying them out of the blob
  // was ~9% of an 8-bit section's decoding.
  const size_t nwords = (stream_bytes - size_t(L) * 4) / 2;
  s->x = own_states;
  s->wp = reinterpret_cast<const uint16_t*>(sp + size_t(L) * 4);
  s->wend = s->wp + nwords;
  return absl::OkStatus();
}

// After the last symbol: a stream of its own must end with its words and its states back at
// their start (a corrupt stream cannot pass); a shared one is checked once, by FinishShared.
absl::Status CloseStream(const Stream& s, int L, SharedDecoder* shared) {
  if (shared) {
    shared->wp = s.wp;  // the states were updated in place
    return absl::OkStatus();
  }
  if (s.wp != s.wend) return absl::DataLossError("rans: stream has trailing words");
  for (int l = 0; l < L; ++l)
    if (s.x[l] != kL) return absl::DataLossError("rans: final state mismatch (corrupt stream)");
  return absl::OkStatus();
}

#if STRATA_RANS_AVX512
// The vector loops over the full runs, while enough words remain for their unchecked loads;
// returns the number of runs decoded (a multiple of L / 16).
template <typename Sym>
size_t DecodeRunsSimd(const DecodeTables& t, const TableLayout& layout, size_t full_runs,
                      uint32_t num_ctx, int L, Stream* s, Sym* out) {
  if (t.packed) {
    // One byte gather per step: slot -> symbol index; freq | start by symbol index from
    // registers (span <= 64) or from a small L1-resident table (span <= 256).
    return WithChains(L / 16, [&](auto v) {
      return WithTableSpan<256>(t.tab, [&](auto span) {
        return DecodeRunsPackedAvx512<Sym, decltype(span)::value, decltype(v)::value>(
            s->x, s->wp, s->wend, full_runs, num_ctx, t.pack, t.ftab, layout.sym_lo,
            layout.prob_bits, out);
      });
    });
  }
  return WithChains(L / 16, [&](auto v) {
    return DecodeRunsAvx512<Sym, decltype(v)::value>(s->x, s->wp, s->wend, full_runs, num_ctx,
                                                     t.ent, t.sym, layout.prob_bits, out);
  });
}

// The AVX2 loop over the full runs, on the packed tables, likewise.
template <typename Sym>
size_t DecodeRunsAvx2(const DecodeTables& t, const TableLayout& layout, size_t full_runs,
                      uint32_t num_ctx, int L, Stream* s, Sym* out) {
  return WithChains(L / 16, [&](auto v) {
    return WithTableSpan<256>(t.tab, [&](auto span) {
      return DecodeRunsPackedAvx2<Sym, decltype(span)::value, decltype(v)::value>(
          s->x, s->wp, s->wend, full_runs, num_ctx, t.pack, t.ftab, layout.sym_lo,
          layout.prob_bits, out);
    });
  });
}
#endif

// Scalar loop on the packed tables, from run g to the end (after the vector loop).
template <typename Sym>
absl::Status DecodeRunsScalarPacked(const DecodeTables& t, const TableLayout& layout, size_t n,
                                    uint32_t num_ctx, int L, size_t g, Stream* s, Sym* out) {
  const size_t runs = (n + kCtxRun - 1) / kCtxRun;
  const uint32_t* prob_bits = layout.prob_bits;
  const uint32_t sym_lo = layout.sym_lo;
  uint32_t* const x = s->x;
  const uint16_t* wp = s->wp;
  const uint16_t* const wend = s->wend;
  uint32_t ctx = static_cast<uint32_t>(g % num_ctx);
  for (; g < runs; ++g) {
    const uint32_t p = prob_bits[ctx];
    const uint32_t mask = (1u << p) - 1;
    const uint8_t* pk = t.pack[ctx];
    const uint32_t* ft = t.ftab + size_t{ctx} * t.tab;
    const size_t base = g * kCtxRun;
    uint32_t* xl = x + (base % L);
    const int cnt = static_cast<int>(std::min<size_t>(kCtxRun, n - base));
    for (int l = 0; l < cnt; ++l) {
      uint32_t xs = xl[l];
      const uint32_t slot = xs & mask;
      const uint32_t k = pk[slot];
      const uint32_t fe = ft[k];
      out[base + l] = static_cast<Sym>(k + sym_lo);
      xs = (fe & 0xFFFF) * (xs >> p) + slot - (fe >> 16);
      if (xs < kL) {
        if (wp == wend) return absl::DataLossError("rans: stream exhausted");
        xs = (xs << 16) | LoadWord(wp++);
      }
      xl[l] = xs;
    }
    if (++ctx == num_ctx) ctx = 0;
  }
  s->wp = wp;
  return absl::OkStatus();
}

// Scalar loop on the per-slot tables, from run g to the end: every run where the CPU has no
// AVX-512, the rest after the vector loop otherwise.
template <typename Sym>
absl::Status DecodeRunsScalar(const DecodeTables& t, const TableLayout& layout, size_t n,
                              uint32_t num_ctx, int L, size_t g, Stream* s, Sym* out) {
  const size_t runs = (n + kCtxRun - 1) / kCtxRun;
  const uint32_t* prob_bits = layout.prob_bits;
  uint32_t* const x = s->x;
  const uint16_t* wp = s->wp;
  const uint16_t* const wend = s->wend;
  uint32_t ctx = static_cast<uint32_t>(g % num_ctx);
  for (; g < runs; ++g) {
    const uint32_t p = prob_bits[ctx];
    const uint32_t mask = (1u << p) - 1;
    const uint32_t* e = t.ent[ctx];
    const uint16_t* sy = t.sym[ctx];
    const size_t base = g * kCtxRun;
    uint32_t* xl = x + (base % L);
    const int cnt = static_cast<int>(std::min<size_t>(kCtxRun, n - base));
    if (cnt == kCtxRun && wend - wp >= kCtxRun) {
      for (int l = 0; l < kCtxRun; ++l) {
        uint32_t xs = xl[l];
        const uint32_t slot = xs & mask;
        const uint32_t en = e[slot];
        out[base + l] = static_cast<Sym>(sy[slot]);
        xs = (en >> 16) * (xs >> p) + (en & 0xFFFF);
        const bool need = xs < kL;
        const uint32_t word = LoadWord(wp);
        xs = need ? (xs << 16) | word : xs;
        wp += need;
        xl[l] = xs;
      }
    } else {
      for (int l = 0; l < cnt; ++l) {
        uint32_t xs = xl[l];
        const uint32_t slot = xs & mask;
        const uint32_t en = e[slot];
        out[base + l] = static_cast<Sym>(sy[slot]);
        xs = (en >> 16) * (xs >> p) + (en & 0xFFFF);
        if (xs < kL) {
          if (wp == wend) return absl::DataLossError("rans: stream exhausted");
          xs = (xs << 16) | LoadWord(wp++);
        }
        xl[l] = xs;
      }
    }
    if (++ctx == num_ctx) ctx = 0;
  }
  s->wp = wp;
  return absl::OkStatus();
}

}  // namespace

bool SimdDecodeAvailable() {
#if STRATA_RANS_AVX512
  return CpuHasAvx512();
#else
  return false;
#endif
}

bool Avx2DecodeAvailable() {
#if STRATA_RANS_AVX512
  return CpuHasAvx2();
#else
  return false;
#endif
}

absl::Status StartShared(std::span<const uint8_t> payload, SharedDecoder* dec) {
  if (payload.size() < sizeof(dec->x) || (payload.size() - sizeof(dec->x)) % 2 != 0)
    return absl::DataLossError("rans: bad shared stream length");
  std::memcpy(dec->x, payload.data(), sizeof(dec->x));
  for (uint32_t v : dec->x)
    if (v < kL) return absl::DataLossError("rans: bad initial state in the shared stream");
  // Words are read in place (LoadWord, unaligned vector loads), never past wend.
  const size_t nwords = (payload.size() - sizeof(dec->x)) / 2;
  dec->wp = reinterpret_cast<const uint16_t*>(payload.data() + sizeof(dec->x));
  dec->wend = dec->wp + nwords;
  return absl::OkStatus();
}

absl::Status FinishShared(const SharedDecoder& dec) {
  if (dec.wp != dec.wend) return absl::DataLossError("rans: shared stream has trailing words");
  for (uint32_t v : dec.x)
    if (v != kL) return absl::DataLossError("rans: shared stream's final states mismatch");
  return absl::OkStatus();
}

template <typename Sym>
absl::Status Decode(internal::ByteReader& in, size_t n, uint32_t alphabet, uint32_t num_ctx,
                    Scratch* scratch, Sym* out, int lanes, SharedDecoder* shared) {
  if (shared) lanes = 128;
  if (lanes != 32 && lanes != 64 && lanes != 128)
    return absl::InternalError("rans: lanes must be 32, 64 or 128");
  const int L = lanes;
  if (alphabet == 0 || alphabet > kMaxAlphabet || num_ctx == 0 || num_ctx > kMaxContexts)
    return absl::DataLossError("rans: bad alphabet or context count");
  if constexpr (sizeof(Sym) == 1) {
    if (alphabet > 256) return absl::InternalError("rans: alphabet too large for 8-bit symbols");
  }
  TableLayout layout;
  STRATA_RETURN_IF_ERROR(ReadTableLayout(in, alphabet, num_ctx, &layout));
  const size_t runs = (n + kCtxRun - 1) / kCtxRun;
  for (uint32_t c = 0; c < num_ctx && c < runs; ++c)
    if (layout.prob_bits[c] == 0) return absl::DataLossError("rans: symbols in an empty context");
  const size_t full_runs = n / kCtxRun;
  DecodeTables tables;
  BuildDecodeTables(layout, num_ctx, full_runs, L, scratch, &tables);
  uint32_t own_states[kMaxLanes];
  Stream stream;
  STRATA_RETURN_IF_ERROR(OpenStream(in, L, shared, own_states, &stream));

  size_t g = 0;
#if STRATA_RANS_AVX512
  if (UseAvx512() && full_runs >= size_t(L / 16))
    g = DecodeRunsSimd(tables, layout, full_runs, num_ctx, L, &stream, out);
  else if (tables.packed && UseAvx2())
    g = DecodeRunsAvx2(tables, layout, full_runs, num_ctx, L, &stream, out);
#endif
  if (tables.packed) {
    STRATA_RETURN_IF_ERROR(DecodeRunsScalarPacked(tables, layout, n, num_ctx, L, g, &stream, out));
  } else {
    STRATA_RETURN_IF_ERROR(DecodeRunsScalar(tables, layout, n, num_ctx, L, g, &stream, out));
  }
  return CloseStream(stream, L, shared);
}

template absl::Status Decode<uint8_t>(internal::ByteReader&, size_t, uint32_t, uint32_t, Scratch*,
                                      uint8_t*, int, SharedDecoder*);
template absl::Status Decode<uint16_t>(internal::ByteReader&, size_t, uint32_t, uint32_t, Scratch*,
                                       uint16_t*, int, SharedDecoder*);

}  // namespace strata::codec::rans
